//! What one compilation is asked to do: [`CompileOptions`] and the device
//! [`Target`] it compiles for.
//!
//! Options carry no paths: where the checkpoint comes from is the caller's
//! [`Checkpoint`](gerbil_frontend_hf::Checkpoint), where the plan goes is
//! [`Plan::write`](crate::Plan::write), and dumps go to an
//! [`Observer`](crate::Observer). That keeps the compiler usable from tests,
//! a server or a build script, not only from `gerbilc`.

use crate::quantize::Quantization;
use crate::tuning::Tuning;
pub use gerbil_codegen_wgsl::Target;

/// Largest context a plan gets unless `max_context` says otherwise.
pub const DEFAULT_MAX_CONTEXT_CAP: u64 = 4096;

/// Settings of one compilation.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// KV-cache capacity; default `min(max_position_embeddings, 4096)`.
    pub max_context: Option<u64>,
    /// Prefill chunk size, `1..=max_context` (another value is a
    /// [`CompileError::Option`](crate::CompileError::Option)); `None` lets the
    /// target and the activations' memory choose it ([`crate::chunk`]).
    pub max_tokens_per_step: Option<u64>,
    /// Passes to skip, by name.
    pub disabled_passes: Vec<String>,
    /// Run only the first `N` enabled passes (`--bisect N`); the pass report
    /// names the one it stopped before.
    pub bisect: Option<usize>,
    /// Features and limits to compile for (`Target::named` reads `--target`).
    pub target: Target,
    /// Overrides the target's largest storage binding (bytes), for every
    /// variant ([`Target::with_max_binding`]); weights larger than this are
    /// split into row shards.
    pub max_storage_binding: Option<u64>,
    /// Prefill GEMM tiles measured on a device (`gerbilc tune`); `None`:
    /// the built-in choice.
    pub tuning: Option<Tuning>,
    /// Compile weights holding NaN or infinities instead of refusing them
    /// (`--allow-non-finite`, [`crate::finite`]).
    pub allow_non_finite: bool,
    /// Store float matrices in a ggml block type (`--quantize`,
    /// [`crate::quantize`]); `None`: as the checkpoint stores them.
    pub quantize: Option<Quantization>,
    /// Most sequences one batch step decodes together (`--max-batch`; 0, the
    /// default: the plan has no batch schedule).
    pub max_batch: u32,
    /// Compute the self-test's reference ([`crate::selftest`]) and store it
    /// in the plan (the default; `--no-selftest` leaves it out).
    pub selftest: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            max_context: None,
            max_tokens_per_step: None,
            disabled_passes: Vec::new(),
            bisect: None,
            target: Target::universal(),
            max_storage_binding: None,
            tuning: None,
            allow_non_finite: false,
            quantize: None,
            max_batch: 0,
            selftest: true,
        }
    }
}
