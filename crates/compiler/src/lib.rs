//! gerbil's compiler as a library: a HuggingFace checkpoint in, a plan out.
//!
//! ```no_run
//! use gerbil_compiler::{compile, CompileOptions, Checkpoint};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ckpt = Checkpoint::open("fixtures/smollm2-135m".as_ref())?;
//! let compiled = compile(&ckpt, &CompileOptions::default(), &mut ())?;
//! compiled.plan.write("smollm2.plan".as_ref())?;
//! # Ok(()) }
//! ```
//!
//! The stages live in their own crates (`frontend-hf` lowers, `passes`
//! rewrites, `codegen-wgsl` generates kernels and schedules, `plan` is the file
//! format); this crate drives them ([`driver`]), turns weight sources into
//! bytes ([`mod@materialize`]), assembles the plan ([`assemble`]) and carries the
//! dump hooks ([`dump`]); [`opt()`] runs passes on textual IR (`gerbilc
//! opt`); [`check_text_assets`] tries the checkpoint's tokenizer and chat
//! template with the runtime's own text code (`gerbil-text`). Every failure is a [`CompileError`]. The surprising
//! part: compiling reads no weights until the plan is written — the plan
//! borrows the checkpoint (which must outlive it) and, as it writes, reads,
//! checks, quantizes, writes and drops one weight buffer at a time, so a
//! 16 GB checkpoint compiles in a few hundred MB.

pub mod assemble;
pub mod chunk;
pub mod driver;
pub mod dump;
pub mod error;
pub mod finite;
pub mod materialize;
pub mod opt;
pub mod options;
pub mod quantize;
pub mod selftest;
pub mod text_check;
pub mod training;
pub mod tuning;

pub use assemble::{build_plan, Plan};
pub use chunk::{LARGE_MAX_TOKENS_PER_STEP, PORTABLE_MAX_TOKENS_PER_STEP};
pub use driver::{compile, op_counts, Compiled};
pub use dump::{DumpIr, Dumps, Observer};
pub use error::CompileError;
pub use finite::{check_rope_tables_finite, check_weights_finite};
pub use gerbil_frontend_hf::Checkpoint;
pub use gerbil_ir::rope_table::rope_table;
pub use gerbil_passes::manager::PassRun;
pub use gerbil_passes::PassReport;
pub use materialize::{
    materialize, weight_buffer_bytes, Materializer, TensorSource, WeightOptions,
};
pub use opt::{opt, OptOptions, Optimized, PassSelection};
pub use options::{CompileOptions, Target, DEFAULT_MAX_CONTEXT_CAP};
pub use quantize::{Quantization, Rounding};
pub use text_check::{check_text_assets, TextAssetError};
pub use training::{compile_training, TrainingBuild};
pub use tuning::{TunedGemm, Tuning, TUNING_FORMAT};
