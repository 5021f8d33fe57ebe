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
    /// GPU buffers, by index. Weights are shared by every variant; each
    /// variant's dispatches bind only the buffers it needs.
    pub buffers: Vec<BufferDecl>,
    /// WGSL kernels, by index, of every variant.
    pub kernels: Vec<Kernel>,
    /// Ways to run the model, best first; the runtime takes the first one the
    /// adapter supports.
    pub variants: Vec<Variant>,
    /// Where the runtime finds inputs and outputs.
    pub io: IoBindings,
    /// What `gerbil-run PLAN selftest` checks every variant against (plans
    /// compiled without one, or before it existed, have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selftest: Option<SelfTest>,
}

/// A short prompt and the CPU interpreter's output for it, computed when the
/// plan was compiled: every variant a device runs should give that output
/// within [`SelfTest::tolerance`], so a kernel the driver gets wrong shows
/// as a failed self-test, not as quietly wrong text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SelfTest {
    /// The steps, run in order from position 0 in one session: for a
    /// language model a prefill of several tokens then one decode step (so
    /// both schedules are checked); for an embedding model one input.
    pub steps: Vec<SelfTestStep>,
}

/// One step of a [`SelfTest`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SelfTestStep {
    /// The step's token ids.
    pub input_ids: Vec<u32>,
    /// The output the runtime reads after it, as the interpreter computed it
    /// (in f64, stored as little-endian f32): the last row's logits, or the
    /// embedding.
    pub output: SectionRef,
}

impl SelfTest {
    /// Largest |Δ| a variant's output may have from the reference whose
    /// largest |value| is `max_abs`: for f32 variants 1e-4 per unit of
    /// `max_abs` (at least 1), what transformers' checks hold them to; for
    /// f16 ones 5e-2; for a variant that dots quantized blocks with int8
    /// activations ([`Variant::int8_dots`]) 5e-2 per unit of `max_abs` (SmolLM2
    /// Q4_1 on lavapipe: 0.71 at a largest logit of 30, 2.4%).
    pub fn tolerance(variant: &Variant, max_abs: f32) -> f32 {
        let scale = max_abs.max(1.0);
        match (variant.precision, variant.int8_dots) {
            (_, true) => 5e-2 * scale,
            (Precision::F16, false) => 5e-2,
            (Precision::F32, false) => 1e-4 * scale,
        }
    }
}

/// One way to run the plan: a prefill and a decode schedule whose kernels
/// need the listed device features.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    /// Name shown by `bench` and `inspect`, e.g. `portable`.
    pub name: String,
    /// Device features every kernel of this variant needs.
    pub features: Vec<Feature>,
    /// What the variant keeps in f16 (plans written before precision
    /// variants existed read as `f32`).
    #[serde(default)]
    pub precision: Precision,
    /// Device limits the variant needs.
    pub requirements: Requirements,
    /// Dispatches for a prefill step (`1 ≤ T ≤ max_tokens_per_step`).
    pub prefill: Vec<Dispatch>,
    /// Dispatches for a decode step (`T = 1`).
    pub decode: Vec<Dispatch>,
    /// Dispatches for a batch step: `1 ≤ T ≤ io.max_batch` rows, each one
    /// token of its own sequence at the KV-cache row and position the
    /// `step_rows` table gives, every row's logits kept (empty when the plan
    /// was compiled without `--max-batch`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch: Vec<Dispatch>,
    /// Its decode GEMVs of quantized weights dot the blocks with `x` rounded
    /// to int8 (absent when false, and in plans from before it was recorded).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub int8_dots: bool,
    /// Its tensor-core GEMMs stage `x` as two f16 parts, 21–22 of its bits
    /// (absent when false: in variants without tensor cores, and in plans
    /// from before, whose tensor-core GEMMs rounded `x` to f16 once and were
    /// 6.2e-2 from transformers on the Llama-3.2-1B shape). The runtime runs
    /// a tensor-core variant without it only when it is named.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub split_x: bool,
}

/// The numerics of a variant. Arithmetic, accumulation, softmax and norms
/// are f32 in both; they differ in what is stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// Everything stored in f32: the numerics that match transformers to
    /// ~1e-4.
    #[default]
    F32,
    /// The KV cache stored in f16 (half its memory, and half the bytes
    /// attention reads per decoded token); needs `shader-f16`.
    F16,
}

impl PlanHeader {
    /// The best variant a GPU runs: the first one not made for CPU adapters
    /// (what summaries such as `gerbilc inspect`'s totals report).
    pub fn best_gpu_variant(&self) -> &Variant {
        self.variants
            .iter()
            .find(|v| !v.features.contains(&Feature::Cpu))
            .unwrap_or(&self.variants[0])
    }
}

impl Variant {
    /// The prefill dispatches a step of `t` tokens runs
    /// ([`Dispatch::runs_at`]): a full chunk's (`t` = the plan's
    /// `max_tokens_per_step`) are what a long prompt costs per step.
    pub fn prefill_at(&self, t: u64) -> Vec<&Dispatch> {
        let t = u32::try_from(t).unwrap_or(u32::MAX);
        self.prefill.iter().filter(|d| d.runs_at(t)).collect()
    }

    /// The plan buffers its dispatches bind (with repeats).
    pub fn bound_buffers(&self) -> impl Iterator<Item = u32> + '_ {
        self.prefill
            .iter()
            .chain(&self.decode)
            .chain(&self.batch)
            .flat_map(|d| d.bindings.iter().map(|b| b.buffer))
    }
}

impl Precision {
    /// `f32` or `f16`, as `--precision` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
        }
    }
}

/// An optional WebGPU capability a kernel may use, or (`Cpu`) the kind of
/// adapter a variant's schedules are made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    /// `shader-f16`: f16 arithmetic and storage in WGSL.
    ShaderF16,
    /// Subgroup operations (`subgroupAdd`, …).
    Subgroups,
    /// Cooperative-matrix (tensor-core) operations, wgpu's experimental extension.
    CooperativeMatrix,
    /// A CPU adapter (lavapipe, SwiftShader, WARP): not a capability but
    /// what the `cpu` variant's schedules are made for (one core's SIMD
    /// lanes as a workgroup), so only such an adapter runs them.
    Cpu,
}

impl Feature {
    /// The name used in `inspect` output and logs.
    pub fn name(self) -> &'static str {
        match self {
            Feature::ShaderF16 => "shader_f16",
            Feature::Subgroups => "subgroups",
            Feature::CooperativeMatrix => "cooperative_matrix",
            Feature::Cpu => "cpu",
        }
    }
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
    /// For an embedding model (an encoder: its output is a vector per
    /// input, read from `io.logits`, not next-token logits), what the vector
    /// is; absent for a language model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding: Option<EmbeddingInfo>,
}

/// What an embedding plan's output vector is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbeddingInfo {
    /// Length of the vector.
    pub dimension: u64,
    /// How token rows become the vector: `mean`, `cls`, `max` or `last`.
    pub pooling: String,
    /// Whether the vector is L2-normalized (unit length).
    pub normalized: bool,
    /// Most tokens of one input, special tokens included (the model's
    /// `max_seq_length`, or the context the plan was compiled for): the
    /// whole input runs in one step.
    pub max_tokens: u64,
    /// Most inputs one step packs end to end (their tokens together at most
    /// `max_tokens_per_step`); the vectors fill the output's first rows.
    #[serde(default = "one_input")]
    pub max_inputs: u32,
}

fn one_input() -> u32 {
    1
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
    /// The model's recommended generation settings, from its
    /// `generation_config.json` (plans written before this field read as all
    /// absent).
    #[serde(default)]
    pub generation: GenerationDefaults,
}

/// Generation settings a checkpoint recommends in `generation_config.json`,
/// validated by the compiler. Every field is `None` when the file does not
/// set it: absent is not transformers' default (which would be
/// `temperature` 1, `top_k` 50, `top_p` 1, `repetition_penalty` 1,
/// `max_length` 20), and choosing a default is left to the caller. As in
/// transformers, sampling is on only when `do_sample` is `Some(true)`;
/// otherwise decoding is greedy whatever `temperature` says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationDefaults {
    /// Whether to sample (`true`) or decode greedily (`false` or absent).
    #[serde(default)]
    pub do_sample: Option<bool>,
    /// Softmax temperature, finite and ≥ 0 (0 means greedy).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Keep only the `k` most likely tokens (0 = all).
    #[serde(default)]
    pub top_k: Option<u64>,
    /// Nucleus sampling: keep the most likely tokens holding this much
    /// probability, in (0, 1] (1 = all).
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Keep tokens at least this fraction as likely as the most likely, in
    /// [0, 1] (0 = all).
    #[serde(default)]
    pub min_p: Option<f32>,
    /// transformers' repetition penalty, finite and > 0 (1 = off).
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    /// Most tokens to generate after the prompt.
    #[serde(default)]
    pub max_new_tokens: Option<u64>,
    /// Most tokens of prompt and generation together (transformers uses it
    /// only when `max_new_tokens` is absent).
    #[serde(default)]
    pub max_length: Option<u64>,
}

/// A record of the compilation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CompileInfo {
    /// gerbil version that wrote the plan.
    pub gerbil_version: String,
    /// The target it was compiled for (`portable`, `desktop`).
    #[serde(default)]
    pub target: String,
    /// Passes that ran, in order.
    pub passes: Vec<String>,
    /// Compute ops before the passes ran, by mnemonic.
    pub ops_before: Vec<(String, u64)>,
    /// Compute ops after the passes ran, by mnemonic.
    pub ops_after: Vec<(String, u64)>,
    /// Sum of every activation's size at `max_tokens_per_step`, as if each had
    /// its own buffer.
    pub activation_naive_bytes: u64,
    /// The device the prefill GEMM tiles were measured on (`gerbilc tune`,
    /// then `compile --tuning`); `None`: the built-in tile choice.
    #[serde(default)]
    pub tuned_on: Option<String>,
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
        /// Its rows are token positions, `max_context` of them (the RoPE
        /// table): kernels index it by position, so validation ties the rows
        /// to `max_context` and every binding to the whole buffer (plans
        /// written before it read as `false`, checked less tightly).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        position_rows: bool,
    },
    /// Scratch memory for activations, placed by the buffer planner.
    Arena,
    /// One half of a layer's KV cache, `f32[max_context, kv_heads·head_dim]`
    /// (`f16` in f16 variants), zero-initialised and kept across steps.
    KvCache {
        /// Layer index.
        layer: u32,
        /// Keys or values.
        half: KvHalf,
        /// Bytes of one position's row, `kv_heads·head_dim` values: with it,
        /// validation ties the buffer's size to `max_context` exactly (plans
        /// written before it read as `None`, checked less tightly).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        row_bytes: Option<u64>,
    },
    /// A graph output the runtime reads back.
    Output {
        /// Which output.
        output: OutputKind,
    },
    /// Per-step parameters (`T`, `P`) as a uniform buffer of [`STEP_PARAMS_BYTES`].
    StepParams,
    /// How `sample_token` chooses: a uniform of [`SAMPLING_PARAMS_BYTES`]
    /// the runtime writes before generating (seed, temperature, top-k, top-p,
    /// min-p; all zero is greedy).
    SamplingParams,
    /// Token ids of the step, `u32[max_tokens_per_step]`, written by the runtime.
    TokenIds,
    /// The rows of a batch step, `u32[2 · max_batch]`: for row `r`, its
    /// KV-cache row (the sequence's slot times the rows a slot spans, plus
    /// its position) and its position; written by the runtime.
    StepRows,
    /// Memory a kernel uses only during its own dispatch, shared by every
    /// dispatch that needs some (they run in order on one queue). The first
    /// `counter_bytes` hold `u32` counters: zero-initialised, and every
    /// kernel leaves the counters it uses at zero; the rest holds whatever the
    /// last dispatch left there.
    Scratch {
        /// Bytes of counters at the start (a multiple of 256).
        counter_bytes: u64,
    },
    /// A training program's buffer (`TrainingPlan`); never in a plan file.
    Training {
        /// What it holds.
        holds: crate::TrainingBuffer,
    },
}

impl BufferKind {
    /// A short description for errors and logs, e.g. `layers.3 v cache`.
    pub fn describe(&self) -> String {
        match self {
            BufferKind::Weight { name, .. } => name.clone(),
            BufferKind::Arena => "activation arena".into(),
            BufferKind::KvCache { layer, half, .. } => {
                format!("layers.{layer} {} cache", half.name())
            }
            BufferKind::Output { output } => output.name().into(),
            BufferKind::StepParams => "step parameters".into(),
            BufferKind::SamplingParams => "sampling parameters".into(),
            BufferKind::TokenIds => "token ids".into(),
            BufferKind::StepRows => "step rows".into(),
            BufferKind::Scratch { .. } => "dispatch scratch".into(),
            BufferKind::Training { holds } => format!("training {holds:?}"),
        }
    }
}

/// Which half of a KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvHalf {
    /// Keys.
    K,
    /// Values.
    V,
}

impl KvHalf {
    /// `k` or `v`.
    pub fn name(self) -> &'static str {
        match self {
            KvHalf::K => "k",
            KvHalf::V => "v",
        }
    }
}

/// A graph output the runtime reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputKind {
    /// Next-token logits, `f32[vocab]` per row.
    Logits,
    /// Greedy decoding's next token, `u32[1]`: the argmax of the logits.
    NextToken,
    /// An embedding plan's vector, `f32[dimension]` ([`EmbeddingInfo`]).
    Embedding,
}

impl OutputKind {
    /// The output's name, as the IR prints it.
    pub fn name(self) -> &'static str {
        match self {
            OutputKind::Logits => "logits",
            OutputKind::NextToken => "next_token",
            OutputKind::Embedding => "embedding",
        }
    }
}

/// Size of the step-parameter uniform: `T`, `P`, and two words of padding.
pub const STEP_PARAMS_BYTES: u64 = 16;

/// Size of the sampling-parameter uniform: seed (two words), temperature,
/// top-k, top-p, min-p, two zero words ([`crate::sampling::SamplingUniform`]).
pub const SAMPLING_PARAMS_BYTES: u64 = 32;

/// The token a batch step gives a row whose logits hold a NaN or an
/// infinity ([`IoBindings::batch_tokens`]): no column, so the runtime
/// reads that row back and reports it.
pub const NOT_FINITE_TOKEN: u32 = u32::MAX;

/// A GPU buffer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BufferDecl {
    /// Size in bytes (a multiple of 4).
    pub size: u64,
    /// Contents.
    pub kind: BufferKind,
}

/// A compute kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
    /// What it computes, for the tools that rank and group kernels (absent
    /// in older plans, and for kernels other than matmuls: `Other`).
    #[serde(default, skip_serializing_if = "KernelOp::is_other")]
    pub op: KernelOp,
}

/// What a kernel computes, typed, so `gerbilc tune` and `bench --profile`
/// read it here instead of out of a kernel's name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum KernelOp {
    /// A matmul `y = x · wᵀ` with `x` of `k` columns and `n` outputs (gated:
    /// `2·n` weight rows), weights of `wdtype`, run by `template`.
    MatMul {
        /// Inner dimension.
        k: u32,
        /// Output columns.
        n: u32,
        /// Gated (GLU) epilogue.
        glu: bool,
        /// Weight dtype (`f32`, `f16`, `bf16`).
        wdtype: String,
        /// The template.
        template: MatMulTemplate,
    },
    /// Any other kernel.
    #[default]
    Other,
}

impl KernelOp {
    /// Whether this is [`KernelOp::Other`].
    pub fn is_other(&self) -> bool {
        *self == KernelOp::Other
    }
}

/// Which matmul template a kernel was built from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatMulTemplate {
    /// A fixed number of rows per workgroup (`matmul`).
    Rows,
    /// One row per workgroup row, for decode (`gemv`).
    Gemv,
    /// The register-tiled GEMM over the step's rows, with its tile's tag
    /// (`gemm`).
    Gemm {
        /// The tile (`GemmTile::tag`, e.g. `64x64x16_4x4`).
        tile: String,
    },
    /// The tensor-core GEMM (`gemm_coop`).
    GemmCoop,
    /// The few rows of a batch step, each weight read once for all of them
    /// (`gemv_batch`).
    GemvBatch,
    /// Whole outputs per thread, for CPU adapters (`matmul_cpu`).
    Cpu,
}

/// One binding of a kernel (group 0, binding number = its index): what the
/// WGSL declares and which operand of the IR op it binds. This is the
/// contract between a kernel template, the schedule and the runtime: the
/// schedule binds by `port`, the runtime builds layouts from `access`, and
/// [`PlanHeader::validate`] checks every dispatch's slices against it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BindingDecl {
    /// The WGSL variable.
    pub name: String,
    /// The operand it binds.
    pub port: Port,
    /// How the WGSL declares it.
    pub access: Access,
    /// Element type as WGSL sees it.
    pub elem: Elem,
    /// Bytes the kernel may touch (for `T`-sized operands: at
    /// `max_tokens_per_step`); every dispatch binds exactly this many.
    pub bytes: u64,
}

/// The operand a kernel binding stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "port", rename_all = "snake_case")]
pub enum Port {
    /// The step-parameter uniform.
    Params,
    /// The sampling-parameter uniform (no IR operand).
    Sampling,
    /// Input `index` of the IR op; `shard` is the row shard of a weight split
    /// over several buffers (0 otherwise).
    Input {
        /// Input port.
        index: u32,
        /// Row shard.
        shard: u32,
    },
    /// Output `index` of the IR op (outputs written in place bind their input instead).
    Output {
        /// Output port.
        index: u32,
    },
    /// No IR operand: working memory of the dispatch in the scratch buffer,
    /// past its counters; its contents on entry are undefined.
    Scratch,
    /// No IR operand: `u32` counters in the scratch buffer's counter region,
    /// zero on entry; the kernel must leave them zero.
    Counters,
    /// No IR operand: the batch step's row table (`step_rows`).
    Rows,
}

/// How a binding is declared in WGSL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// `var<uniform>` (the step parameters).
    Uniform,
    /// `var<storage, read>`.
    Read,
    /// `var<storage, read_write>`.
    ReadWrite,
}

impl Access {
    /// The name the plan's JSON uses: `uniform`, `read` or `read_write`.
    pub fn name(self) -> &'static str {
        match self {
            Access::Uniform => "uniform",
            Access::Read => "read",
            Access::ReadWrite => "read_write",
        }
    }
}

/// Element type of a binding's array, as WGSL declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Elem {
    /// `f32`.
    F32,
    /// `u32` (token ids, the step parameters).
    U32,
    /// Two bf16 values packed in a `u32`, low half first.
    Bf16x2,
    /// Two f16 values packed in a `u32`, low half first.
    F16x2,
    /// Words of a block-quantized weight (ggml's bytes in planes, bound as
    /// `vec4<u32>`).
    Blocks,
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
/// `ceil((per_token · T + constant) / divisor)`, and with [`KeySplits`] at
/// most the splits the step's keys fill.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkgroupCount {
    /// Coefficient of `T`.
    pub per_token: u32,
    /// Constant term.
    pub constant: u32,
    /// Divisor (≥ 1), rounding up.
    pub divisor: u32,
    /// A split-K attention's splits: the count is also bounded by the splits
    /// the step's keys fill (absent in older plans, which dispatch every
    /// split: the kernel returns at once from those past its keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_splits: Option<KeySplits>,
}

/// How many splits a split-K attention uses for a row with `keys` keys in
/// its cache: `ceil(min(keys, window) / keys_per_split)`, at least 1 — the
/// kernel's own count, so the workgroups past it, which would return at
/// once, are not launched (on a CPU driver each one costs a workgroup's
/// set-up all the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeySplits {
    /// Fewest keys a split takes before another split is used.
    pub keys_per_split: u32,
    /// Sliding-window length (0: the whole cache).
    pub window: u32,
}

impl KeySplits {
    /// The splits a row with `keys` keys uses.
    pub fn splits(&self, keys: u32) -> u32 {
        let keys = match self.window {
            0 => keys,
            w => keys.min(w),
        };
        keys.max(1).div_ceil(self.keys_per_split.max(1))
    }
}

/// The fields, [`KeySplits`] only where a count has them (what plan dumps
/// and kernel snapshots show).
impl std::fmt::Debug for WorkgroupCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("WorkgroupCount");
        d.field("per_token", &self.per_token)
            .field("constant", &self.constant)
            .field("divisor", &self.divisor);
        if let Some(k) = &self.key_splits {
            d.field("key_splits", k);
        }
        d.finish()
    }
}

impl WorkgroupCount {
    /// A count that does not depend on `T`.
    pub fn fixed(n: u32) -> Self {
        WorkgroupCount {
            per_token: 0,
            constant: n,
            divisor: 1,
            key_splits: None,
        }
    }

    /// `ceil((per_token · t + constant) / divisor)`.
    pub fn per_token(per_token: u32, constant: u32, divisor: u32) -> Self {
        WorkgroupCount {
            per_token,
            constant,
            divisor,
            key_splits: None,
        }
    }

    /// Evaluates the count for `t` tokens (saturating at `u32::MAX`, which
    /// no device dispatches: [`PlanHeader::validate`] bounds the count at
    /// `max_tokens_per_step` by [`crate::limits::WORKGROUPS_PER_DIMENSION`]),
    /// ignoring [`KeySplits`]: the most the step can need.
    pub fn eval(&self, t: u32) -> u32 {
        let num = u64::from(self.per_token) * u64::from(t) + u64::from(self.constant);
        u32::try_from(num.div_ceil(u64::from(self.divisor.max(1)))).unwrap_or(u32::MAX)
    }

    /// The count for `t` tokens when the step's longest row has `keys`
    /// keys in its cache (its position plus one).
    pub fn eval_at(&self, t: u32, keys: u32) -> u32 {
        let most = self.eval(t);
        match self.key_splits {
            Some(k) => most.min(k.splits(keys)),
            None => most,
        }
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
    /// The transformer layer the node belongs to, if any.
    #[serde(default)]
    pub layer: Option<u32>,
    /// The label without its layer numbers (`mlp.down_proj` for
    /// `layers.3.mlp.down_proj`): the same op of every layer shares it, so
    /// profiles group by it. Empty in older plans (tools use the label).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// Its arithmetic, for `bench --profile`'s TFLOP/s (zero where not
    /// counted; absent in older plans).
    #[serde(default)]
    pub flops: FlopCount,
    /// The steps it runs in, by their `T`: absent, every step. A node may
    /// have one dispatch per range (a prefill matmul of a few rows and one
    /// of many take different kernels); each computes the same values from
    /// the same inputs, so a runtime that ran both would only be slower.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenRange>,
}

/// The steps a [`Dispatch`] runs in: those of `min ≤ T ≤ max` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRange {
    /// Fewest tokens (≥ 1).
    pub min: u32,
    /// Most tokens (≥ `min`).
    pub max: u32,
}

impl Dispatch {
    /// Whether it runs in a step of `t` tokens.
    pub fn runs_at(&self, t: u32) -> bool {
        self.tokens.is_none_or(|r| (r.min..=r.max).contains(&t))
    }

    /// [`Dispatch::group`], or the label in a plan written before groups.
    pub fn group_or_label(&self) -> &str {
        if self.group.is_empty() {
            &self.label
        } else {
            &self.group
        }
    }
}

/// Floating-point operations of a dispatch as a function of `T`:
/// `per_token · T + constant`, a multiply and an add counting as two. Codegen
/// counts the matmuls' (`2·K·N` per row); other kernels count zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlopCount {
    /// Operations per token of the step.
    pub per_token: u64,
    /// Operations independent of `T`.
    pub constant: u64,
}

impl FlopCount {
    /// The count for a step of `t` tokens (saturating: the counts come from
    /// the plan file and only feed a TFLOP/s figure).
    pub fn eval(&self, t: u32) -> u64 {
        self.per_token
            .saturating_mul(u64::from(t))
            .saturating_add(self.constant)
    }
}

/// Where the runtime writes inputs and reads outputs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IoBindings {
    /// Buffer holding the step parameters.
    pub step_params: u32,
    /// Buffer holding the token ids.
    pub token_ids: u32,
    /// Logits of the step: `f32[vocab]` of the last position, or `f32[T, vocab]`
    /// of every position when `logits_all_rows` is set. In an embedding plan
    /// ([`ModelInfo::embedding`]), the step's vector, `f32[dimension]`.
    pub logits: BufferSlice,
    /// Whether `logits` holds a row per token of the step (the compiler ran
    /// without `slice-last-row`); the runtime then reads row `T - 1`.
    #[serde(default)]
    pub logits_all_rows: bool,
    /// The argmax of the last logits row, `u32[1]`, written by every step;
    /// the runtime copies it into `token_ids` to decode greedily without
    /// reading logits back. Plans without it decode through the CPU.
    #[serde(default)]
    pub next_token: Option<BufferSlice>,
    /// The `sampling_params` buffer `next_token`'s kernel reads (plans
    /// without it always choose greedily).
    #[serde(default)]
    pub sampling_params: Option<u32>,
    /// The row table of batch steps (plans with a batch schedule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_rows: Option<u32>,
    /// Most rows of a batch step (0: the plan has no batch schedule).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_batch: u32,
    /// Each batch-step row's greedy token, `u32[max_batch]` (the argmax
    /// of its logits row, or [`NOT_FINITE_TOKEN`] where that row holds a
    /// NaN or an infinity), written by every batch step, so greedy rows need not read
    /// their logits back. Plans without it (compiled before it existed)
    /// choose every row on the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_tokens: Option<BufferSlice>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
