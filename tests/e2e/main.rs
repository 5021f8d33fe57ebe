//! The end-to-end tests, one test binary: a binary per file linked the
//! compiler and the runtime again for each, which cost more than most of them
//! run. Each module is what was its own suite — the crate-dependency picture
//! (`architecture`), passes against the interpreter (`passes`,
//! `interpreter`), model families against transformers (`models` on the tiny models,
//! `real_checkpoints` on the real checkpoints), the
//! kernel templates against CPU references (`kernels`), encoders against
//! transformers and sentence-transformers (`embeddings`), the generation loop
//! and the facade (`generation`, `facade`), and GPU faults (`gpu_faults`).
//! Tests that use the GPU hold `gerbil_e2e::gpu_lock` (lavapipe already uses
//! every core); the rest run beside them.

mod architecture;
mod batch;
mod embeddings;
mod facade;
mod generation;
mod gpu_faults;
mod interpreter;
mod kernels;
mod models;
mod passes;
mod real_checkpoints;
mod training;
