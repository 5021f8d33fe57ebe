//! gerbil's fuzz targets, as plain functions of `&[u8]` that return nothing.
//!
//! Each target feeds its bytes to one of gerbil's readers of untrusted input
//! (see [`TARGETS`]); an error is a fine answer, a panic, an abort, an
//! allocation failure or a hang is a bug. Two harnesses run them:
//!
//! - `fuzz/` (a cargo-fuzz project outside the workspace) wraps each in a
//!   `fuzz_target!` for long runs on nightly: `cargo +nightly fuzz run plan`;
//! - `tests/corpus.rs` replays every file of `fuzz/corpus/<target>/` and then
//!   mutates them for a couple of seconds on stable, so `cargo test` catches a
//!   regression on an input the fuzzer once found.
//!
//! docs/fuzzing.md says how to run, minimize and extend them. The surprising
//! part: the inputs are framed ([`plan`] recomputes checksums, [`compile`]
//! takes its size flags from a fixed-size prefix, [`template`] splits at NUL
//! bytes) so that mutations reach past the first check instead of dying on a
//! checksum or a JSON syntax error.

pub mod compile;
pub mod frame;
pub mod gguf;
pub mod plan;
pub mod request;
pub mod safetensors;
pub mod template;

/// A fuzz target: any bytes in, nothing out; it must return for every input.
pub type Target = fn(&[u8]);

/// Every target by the name of its `fuzz/fuzz_targets/<name>.rs` and corpus
/// directory `fuzz/corpus/<name>/`.
pub const TARGETS: &[(&str, Target)] = &[
    ("plan", plan::plan),
    ("compile", compile::compile),
    ("codegen", compile::codegen),
    ("safetensors", safetensors::safetensors),
    ("shard_index", safetensors::shard_index),
    ("gguf", gguf::gguf),
    ("template", template::template),
    ("request", request::request),
];
