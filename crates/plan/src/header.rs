//! The plan header: everything the runtime needs except the bulk bytes.

use serde::{Deserialize, Serialize};

/// A byte range in the plan's data region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SectionRef {
    /// Offset from the start of the data region (a multiple of `SECTION_ALIGN`).
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// The JSON header of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanHeader {
    /// Which model this plan runs.
    pub model: ModelInfo,
    /// Tokenizer, chat template and special tokens.
    pub text: TextInfo,
    /// What the compiler did, for `gerbilc inspect`.
    pub compile: CompileInfo,
    /// Device limits the plan needs.
    pub requirements: Requirements,
    /// GPU buffers, by index.
    pub buffers: Vec<BufferDecl>,
    /// WGSL kernels, by index.
    pub kernels: Vec<Kernel>,
    /// Dispatches for a prefill step (`1 ≤ T ≤ max_tokens_per_step`).
    pub prefill: Vec<Dispatch>,
    /// Dispatches for a decode step (`T = 1`).
    pub decode: Vec<Dispatch>,
    /// Where the runtime finds inputs and outputs.
    pub io: IoBindings,
}

/// Facts about the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// `config.architectures[0]`, e.g. `LlamaForCausalLM`.
    pub architecture: String,
    /// Family builder that lowered it, e.g. `llama`.
    pub family: String,
    /// Display name (the checkpoint directory's name).
    pub name: String,
    /// Vocabulary size (logits per position).
    pub vocab_size: u64,
    /// Hidden size.
    pub hidden_size: u64,
    /// Transformer layers.
    pub num_layers: u64,
    /// Context capacity of the KV cache (`Lmax`).
    pub max_context: u64,
    /// Most tokens one prefill step takes; longer prompts run in chunks.
    pub max_tokens_per_step: u64,
    /// The model's config.json, verbatim, for inspection.
    pub config: serde_json::Value,
}

/// Text processing that travels with the plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TextInfo {
    /// `tokenizer.json`, if the checkpoint has one.
    pub tokenizer: Option<SectionRef>,
    /// Jinja chat template, if the checkpoint has one.
    pub chat_template: Option<String>,
    /// Beginning-of-sequence token text (for chat templates).
    pub bos_token: Option<String>,
    /// End-of-sequence token text (for chat templates).
    pub eos_token: Option<String>,
    /// Token ids that end generation.
    pub eos_token_ids: Vec<u32>,
}

/// A record of the compilation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CompileInfo {
    /// gerbil version that wrote the plan.
    pub gerbil_version: String,
    /// Passes that ran, in order.
    pub passes: Vec<String>,
    /// Compute ops before the passes ran, by mnemonic.
    pub ops_before: Vec<(String, u64)>,
    /// Compute ops after the passes ran, by mnemonic.
    pub ops_after: Vec<(String, u64)>,
    /// Sum of every activation's size at `max_tokens_per_step`, as if each had
    /// its own buffer.
    pub activation_naive_bytes: u64,
}

/// Device capabilities the plan relies on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Requirements {
    /// Largest single storage binding.
    pub max_storage_buffer_binding_size: u64,
    /// Largest buffer.
    pub max_buffer_size: u64,
    /// Most storage buffers one kernel binds.
    pub max_storage_buffers_per_shader_stage: u32,
    /// Most workgroup memory one kernel uses, in bytes.
    pub max_compute_workgroup_storage_size: u32,
    /// Most invocations in one workgroup.
    pub max_compute_invocations_per_workgroup: u32,
}

/// What a buffer holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BufferKind {
    /// Constant bytes uploaded once from a data section.
    Weight {
        /// Source bytes.
        section: SectionRef,
        /// Tensor name (or derivation) for inspection.
        name: String,
        /// Element type as stored.
        dtype: String,
        /// Shape as stored.
        shape: Vec<u64>,
    },
    /// Scratch memory for activations, placed by the buffer planner.
    Arena,
    /// Persistent state (KV cache), zero-initialised, kept across steps.
    State {
        /// What it is, e.g. `layers.0.k_cache`.
        name: String,
    },
    /// Per-step parameters (`T`, `P`) as a uniform buffer of [`STEP_PARAMS_BYTES`].
    StepParams,
    /// Token ids of the step, `u32[max_tokens_per_step]`, written by the runtime.
    TokenIds,
}

/// Size of the step-parameter uniform: `T`, `P`, and two words of padding.
pub const STEP_PARAMS_BYTES: u64 = 16;

/// A GPU buffer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BufferDecl {
    /// Size in bytes (a multiple of 4).
    pub size: u64,
    /// Contents.
    pub kind: BufferKind,
}

/// A compute kernel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    /// Unique name, e.g. `matmul_bf16_k576_n1536`.
    pub name: String,
    /// WGSL source (validated by naga when the plan was compiled).
    pub wgsl: String,
    /// Entry point.
    pub entry: String,
    /// `@workgroup_size`.
    pub workgroup_size: [u32; 3],
    /// Bindings of group 0, by binding number.
    pub bindings: Vec<BindingDecl>,
}

/// How a kernel binding is declared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BindingDecl {
    /// `var<uniform>` (the step parameters).
    Uniform,
    /// `var<storage, read>`.
    StorageRead,
    /// `var<storage, read_write>`.
    StorageReadWrite,
}

/// A slice of a buffer bound to one kernel binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferSlice {
    /// Index into [`PlanHeader::buffers`].
    pub buffer: u32,
    /// Byte offset (a multiple of the binding alignment).
    pub offset: u64,
    /// Byte length.
    pub size: u64,
}

/// A workgroup count along one axis as a function of `T`:
/// `ceil((per_token · T + constant) / divisor)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkgroupCount {
    /// Coefficient of `T`.
    pub per_token: u32,
    /// Constant term.
    pub constant: u32,
    /// Divisor (≥ 1), rounding up.
    pub divisor: u32,
}

impl WorkgroupCount {
    /// A count that does not depend on `T`.
    pub fn fixed(n: u32) -> Self {
        WorkgroupCount {
            per_token: 0,
            constant: n,
            divisor: 1,
        }
    }

    /// Evaluates the count for `t` tokens.
    pub fn eval(&self, t: u32) -> u32 {
        let num = u64::from(self.per_token) * u64::from(t) + u64::from(self.constant);
        num.div_ceil(u64::from(self.divisor.max(1))) as u32
    }
}

/// One kernel launch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dispatch {
    /// Index into [`PlanHeader::kernels`].
    pub kernel: u32,
    /// One slice per kernel binding, in binding order.
    pub bindings: Vec<BufferSlice>,
    /// Workgroups along x, y, z.
    pub workgroups: [WorkgroupCount; 3],
    /// The IR node it came from, for profiling and inspection.
    pub label: String,
}

/// Where the runtime writes inputs and reads outputs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IoBindings {
    /// Buffer holding the step parameters.
    pub step_params: u32,
    /// Buffer holding the token ids.
    pub token_ids: u32,
    /// Logits of the step: `f32[vocab]` of the last position, or `f32[T, vocab]`
    /// of every position when `logits_all_rows` is set.
    pub logits: BufferSlice,
    /// Whether `logits` holds a row per token of the step (the compiler ran
    /// without `slice-last-row`); the runtime then reads row `T - 1`.
    #[serde(default)]
    pub logits_all_rows: bool,
}
