//! The runtime's error type.

use gerbil_plan::PlanError;

/// Why the runtime could not run a plan.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The plan file is unusable.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// No GPU adapter was found.
    #[error("no WebGPU adapter found (Vulkan, Metal or DX12); on a machine without a GPU install Mesa's lavapipe (`apt-get install mesa-vulkan-drivers`)")]
    NoAdapter,
    /// `--device N` named an adapter that is not there.
    #[error("there is no GPU adapter {index}: {count} found (numbered 0 to {last}); `gerbil-run devices` lists them", last = count.saturating_sub(1))]
    NoSuchAdapter {
        /// The index asked for.
        index: usize,
        /// Adapters found.
        count: usize,
    },
    /// Choosing an adapter by index where the platform cannot list them.
    #[error(
        "choosing a GPU adapter by index is not available in a browser; leave the adapter unset"
    )]
    AdapterChoiceUnsupported,
    /// The adapter cannot meet a limit the plan needs.
    #[error("the GPU `{adapter}` does not support this plan: its {limit} is {available}, the plan needs {needed}; recompile the plan for this device (`gerbilc compile` with a smaller --max-context or --max-tokens-per-step, or without `--target`), or run it on another GPU (`gerbil-run devices` lists them, --device N picks one)")]
    Limit {
        /// Adapter name.
        adapter: String,
        /// The limit's WebGPU name.
        limit: &'static str,
        /// What the plan needs.
        needed: u64,
        /// What the adapter offers.
        available: u64,
    },
    /// No variant of the plan runs on this device.
    #[error("the GPU `{adapter}` can run none of the plan's variants: {reasons}; recompile without `--target` (the default plan has a variant for every adapter), or with a smaller --max-context / --max-tokens-per-step (for a limit), or run on another GPU (`gerbil-run devices` lists them, --device N picks one)")]
    NoVariant {
        /// Adapter name.
        adapter: String,
        /// Each variant and what it lacks.
        reasons: String,
    },
    /// The plan carries no self-test reference.
    #[error("the plan has no self-test: it was compiled with `--no-selftest`, or by a gerbil from before self-tests; recompile it without that flag")]
    NoSelfTest,
    /// `--variant` named a variant the plan does not have.
    #[error("the plan has no variant `{name}`; its variants are: {available} (`gerbilc inspect` lists them)")]
    UnknownVariant {
        /// The name asked for.
        name: String,
        /// The plan's variants, best first.
        available: String,
    },
    /// `--precision` asked for numerics the plan has no variant of.
    #[error("the plan has no {precision} variant: it was compiled for target `{target}`, and f16 variants need a target with shader-f16; recompile without `--target` (the default plan has f16 variants), or run with `--precision auto`")]
    NoPrecision {
        /// The precision asked for.
        precision: &'static str,
        /// The plan's target.
        target: String,
    },
    /// Creating the device failed.
    #[error("could not create the GPU device: {0}")]
    Device(String),
    /// The GPU ran out of memory.
    #[error("out of GPU memory on `{adapter}` while {context}{}; the model needs less memory with a smaller --ctx (its KV cache grows with the context), the plan's f16 variant (`--precision f16`, half an f32 plan's weight memory, where the plan has one) or a smaller model; other programs using the GPU hold memory too", asked(*bytes))]
    OutOfMemory {
        /// Adapter name.
        adapter: String,
        /// What the runtime was doing.
        context: String,
        /// Bytes asked for, where one allocation failed.
        bytes: Option<u64>,
    },
    /// wgpu reported a validation error (a gerbil bug or a corrupt plan).
    #[error("GPU validation error while {context}: {message}")]
    Validation {
        /// What the runtime was doing.
        context: String,
        /// wgpu's message.
        message: String,
    },
    /// The device was lost (a driver reset, a crash, a GPU removed or
    /// destroyed), or waiting for it failed.
    #[error("the GPU `{adapter}` was lost while {context}: {reason}; the work in progress is gone. A driver reset or a GPU fault does this: load the model again (a new session opens a fresh device); if it happens again, check the kernel log (`dmesg`) and the GPU driver, or run on another GPU (--device N)")]
    DeviceLost {
        /// Adapter name.
        adapter: String,
        /// What the runtime was doing.
        context: String,
        /// Why, as the driver or wgpu reported it.
        reason: String,
    },
    /// The prompt plus generation does not fit the KV cache.
    #[error("{needed} tokens do not fit the context of {max} tokens; shorten the prompt, or run with a larger --ctx (up to the plan's --max-context, which a recompile can raise)")]
    ContextOverflow {
        /// Tokens needed.
        needed: u64,
        /// The plan's context.
        max: u64,
    },
    /// `--ctx` outside what the plan allows.
    #[error("a context of {asked} tokens is not possible: this plan holds 1 to {max} tokens; give --ctx at most {max}, or recompile with a larger --max-context")]
    ContextSize {
        /// The context asked for.
        asked: u64,
        /// The plan's `max_context`.
        max: u64,
    },
    /// A batch step on a plan compiled without a batch schedule.
    #[error("this plan has no batch schedule: compile it with `gerbilc compile --max-batch N` to run several sequences in one step")]
    NoBatchSchedule,
    /// A batch step of more rows than the plan's batch schedule takes, or of
    /// none.
    #[error("a batch step takes 1 to {max} rows; got {given}")]
    BatchSize {
        /// What the step was given.
        given: String,
        /// The plan's `max_batch`.
        max: u32,
    },
    /// A sequence slot past the session's.
    #[error("sequence slot {slot} does not exist: the session has {slots} (slots 0 to {})", slots - 1)]
    Slot {
        /// The slot asked for.
        slot: usize,
        /// The session's slots.
        slots: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab: u64,
    },
    /// Nothing to run.
    #[error("the input has no tokens")]
    EmptyInput,
    /// Logits asked of an embedding plan, or a vector of a language model.
    #[error("{0}")]
    WrongModelKind(&'static str),
    /// An embedding input longer than the plan takes in one step.
    #[error("the input has {tokens} tokens, more than the {max} this embedding model takes; shorten it, or let it be truncated (`gerbil-run embed --truncate`)")]
    InputTooLong {
        /// Tokens of the input, special tokens included.
        tokens: usize,
        /// The plan's `embedding.max_tokens`.
        max: u64,
    },
    /// GPU decoding on a plan compiled without the `next_token` output.
    #[error("the plan has no `next_token` output (compiled by an older gerbilc): recompile it to decode on the GPU")]
    NoGpuSampler,
    /// Invalid generation settings.
    #[error("invalid sampling settings: {0}")]
    Sampling(String),
    /// A training step's input does not fit its plan.
    #[error("training: {0}")]
    Training(String),
    /// The logits a step produced hold a NaN or an infinity, so no token can be chosen soundly.
    #[error(
        "generation stopped at step {step} (position {position}): the logits hold a non-finite \
         value ({value} for token {token}); the model's activations overflowed in the plan's \
         precision (f16/bf16 weights give f32 math but can still overflow on extreme inputs) or \
         its weights hold NaN/Inf (a plan compiled with `gerbilc compile --allow-non-finite`): \
         check the checkpoint, or try a shorter or different prompt"
    )]
    NonFiniteLogits {
        /// The generation step, 1 for the first token after the prompt.
        step: usize,
        /// The KV-cache position whose logits these are.
        position: u64,
        /// The first token whose logit is not finite.
        token: u32,
        /// `NaN`, `inf` or `-inf`.
        value: String,
    },
}

/// ` (asked for N bytes, X MiB)` for an allocation of `bytes`; empty for none.
fn asked(bytes: Option<u64>) -> String {
    match bytes {
        Some(n) => format!(
            " (asked for {n} bytes, {:.1} MiB)",
            n as f64 / f64::from(1 << 20)
        ),
        None => String::new(),
    }
}
