//! A training program: what `gerbil-train` runs on the GPU, as plan data.
//!
//! [`TrainingPlan`] is codegen's answer for a training graph (the forward
//! graph after the `autodiff` pass) and everything the runtime needs to run
//! it: the buffer table, the kernels, and three schedules — one pass's
//! forward and backward over a micro-batch of sequences packed end to end
//! ([`TrainingPlan::pass`]), the dispatches that add its gradients into the
//! batch's ([`TrainingPlan::accumulate`]), and the fused optimizer
//! ([`TrainingPlan::optimizer`]). A step of `B` sequences in micro-batches
//! of `M` runs `pass` and `accumulate` `B / M` times, then `optimizer`
//! once.
//!
//! The surprise: every trained weight is a range of one buffer, a *bank*
//! ([`TrainingIo::parameters`]), and its gradient the same range of another
//! ([`TrainingIo::gradients`]), so the optimizer steps all of them in two
//! dispatches per bank, however many tensors the model has. A bank is at
//! most one binding (2 GiB − 4 on NVIDIA, below its 4 GiB buffers): a model
//! of more f32 weights than that, such as Llama-3.2-1B's 4.9 GB, takes
//! several. Ranges start at multiples of 64 values (256 bytes), which WebGPU
//! asks of a binding's offset; the gaps between them hold zeros that stay
//! zero.
//!
//! Training programs are made and run in one process; they are not written
//! to plan files, and a plan that binds a [`crate::BufferKind::Training`] buffer
//! fails validation.

use crate::{BufferDecl, Dispatch, Kernel, Requirements};
use serde::{Deserialize, Serialize};

/// What a training buffer holds ([`crate::BufferKind::Training`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainingBuffer {
    /// The next-token target of every row of a pass, `u32[T]`.
    TargetIds,
    /// A pass's mean cross-entropy, `f32[1]`.
    Loss,
    /// Every trained weight, f32, each at its [`Parameter::offset`].
    Parameters,
    /// The gradients of one pass, laid out as the parameters.
    Gradients,
    /// The gradients summed over the batch's passes (divided by their
    /// count), which the optimizer reads and zeroes.
    Accumulated,
    /// AdamW's first moment (f32), or its 8-bit codes.
    FirstMoment,
    /// AdamW's second moment (f32), or its 8-bit codes.
    SecondMoment,
    /// The 8-bit state's per-block scales.
    Scales,
    /// The optimizer step's scalars, `f32[8]`, written by the host.
    Settings,
    /// The gradient norm's per-workgroup partial sums.
    Partials,
    /// The optimizer's report, `f32[3]`: norm, clipping factor, applied.
    Report,
}

/// One trained weight: where it lives in the parameter buffer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Parameter {
    /// The weight's IR label (`layers.0.mlp.down_proj.weight`).
    pub label: String,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Its first value's index in the parameter banks laid end to end (each
    /// bank one buffer of at most one binding, none holding part of a
    /// weight), a multiple of 64 within its bank.
    pub offset: u64,
}

impl TrainingPlan {
    /// Passes per optimizer step.
    pub fn passes(&self) -> u32 {
        self.batch / self.micro_batch.max(1)
    }
}

impl Parameter {
    /// How many values it has.
    pub fn len(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Whether it has no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where the runtime finds a training program's inputs and outputs: indices
/// into [`TrainingPlan::buffers`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainingIo {
    /// The step parameters (`T` = a pass's rows, `P` = 0).
    pub step_params: u32,
    /// The segment table of a pass's sequences
    /// (`gerbil_codegen_wgsl::kernels::Segments`), which the runtime writes
    /// once: every pass packs the same lengths.
    pub step_rows: u32,
    /// The token ids of a pass's sequences, end to end.
    pub token_ids: u32,
    /// Their next-token targets.
    pub target_ids: u32,
    /// The pass's loss, the mean over its rows.
    pub loss: u32,
    /// Every trained weight: a buffer per bank (see [`Parameter::offset`]).
    pub parameters: Vec<u32>,
    /// One pass's gradients, a buffer per bank.
    pub gradients: Vec<u32>,
    /// The batch's gradients, a buffer per bank: the pass's own
    /// (`gradients`) when a step is one pass.
    pub accumulated: Vec<u32>,
    /// The optimizer's settings.
    pub settings: u32,
    /// The optimizer's report.
    pub report: u32,
}

/// A compiled training step; see the module documentation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainingPlan {
    /// Every buffer; weights that do not train (RoPE tables, quantized
    /// weights) are [`crate::BufferKind::Weight`]s the caller fills.
    pub buffers: Vec<BufferDecl>,
    /// The distinct kernels.
    pub kernels: Vec<Kernel>,
    /// One pass: the forward pass, loss and backward pass of a micro-batch.
    pub pass: Vec<Dispatch>,
    /// Adds one pass's gradients, divided by the passes a step takes, into
    /// the batch's (nothing when a step is one pass).
    pub accumulate: Vec<Dispatch>,
    /// The optimizer: the gradient norm's partials, then the update, for
    /// each range of the parameters one binding holds.
    pub optimizer: Vec<Dispatch>,
    /// Inputs and outputs.
    pub io: TrainingIo,
    /// The trained weights, in parameter-buffer order.
    pub parameters: Vec<Parameter>,
    /// Tokens per sequence (a pass's `T` is `micro_batch` times this).
    pub seq_len: u32,
    /// Sequences per step.
    pub batch: u32,
    /// Sequences per pass, packed end to end (a divisor of `batch`).
    pub micro_batch: u32,
    /// Token ids and targets are below this.
    pub vocab: u32,
    /// The device limits it needs.
    pub requirements: Requirements,
}
