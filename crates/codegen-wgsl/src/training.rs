//! [`generate_training`]: a training graph (the forward graph after
//! `gerbil_passes::training_passes`) becomes a [`TrainingPlan`].
//!
//! The pass schedule is built as a plan's prefill schedule is — sources
//! placed ([`crate::sources`]), activations planned by liveness
//! ([`crate::binder`]), every node lowered ([`crate::lower`]; the training
//! ops in [`crate::lower_train`]) — for one variant, `portable` (f32, no
//! optional feature) or `tensor-mixed`, as a packed step: a micro-batch of
//! `M` sequences end to end, `T` = `max_context` = `M` times the sequence
//! length, each row's position and sequence read from the segment table
//! (so a matmul sees every row of the micro-batch at once). Then
//! the trained weights and their `grad.*` outputs move into the optimizer's
//! buffers: each weight becomes a range of the parameter buffer and its
//! gradient the same range of the gradient buffer, and every dispatch that
//! bound the weight's or the output's own buffer binds that range instead
//! (the own buffers leave the table). Last come the dispatches that add a
//! pass's gradients into the batch's (none when a step is one pass: the
//! optimizer reads the pass's own) and the fused AdamW
//! ([`crate::kernels::adamw`]), two per binding-sized range.
//!
//! The surprise: the trained weights are found by the outputs' names
//! (`grad.LABEL` names the weight labelled `LABEL`), so whatever the
//! autodiff pass decided trains — RoPE tables and quantized weights do not
//! — is what the optimizer steps; every other weight keeps a buffer of its
//! own, which the caller fills ([`TrainingProgram::frozen`]).

use crate::binder::Layout;
use crate::dispatch::{Assembler, Lowered, Operands};
use crate::fusion::RopeAttention;
use crate::kernels::{adamw, input, output, KernelSource};
use crate::lower::{Lowering, Phase};
use crate::schedule::{schedule, CodegenOptions, WeightBuffer};
use crate::sources::{self, Own};
use crate::target::Target;
use crate::tuning::GemmTiles;
use crate::variant::VariantSpec;
use crate::CodegenError;
use gerbil_ir::{DType, Graph, NodeId, Op, ValueRef, WeightSource};
use gerbil_plan::{
    BufferDecl, BufferKind, BufferSlice, Dispatch, FlopCount, KernelOp, Parameter, Port, Precision,
    TrainingBuffer, TrainingIo, TrainingPlan, STEP_PARAMS_BYTES,
};
use std::collections::HashMap;

/// Matmul rows per workgroup of the pass schedule's matmuls that are not
/// GEMM tiles.
const ROWS_PER_WORKGROUP: u32 = 8;

/// Values a parameter's range starts at a multiple of: 256 bytes of f32,
/// WebGPU's binding offset alignment.
const PARAMETER_ALIGN: u64 = 64;

/// Most rows a pass packs when the micro-batch is chosen
/// ([`TrainingOptions::micro_batch`] `None`): SmolLM2's batch of 4 × 512,
/// whose narrow matmuls fill an H200 only at that depth.
pub const PACKED_ROWS: u32 = 2048;

/// How to compile a training step.
#[derive(Clone, Debug)]
pub struct TrainingOptions {
    /// Tokens per sequence (a pass's `T` and caches' rows are the
    /// micro-batch's sequences times this).
    pub seq_len: u32,
    /// Sequences per optimizer step.
    pub batch: u32,
    /// Sequences per pass, packed end to end (a divisor of `batch`); `None`
    /// chooses the largest divisor whose rows are at most [`PACKED_ROWS`]
    /// and whose pass fits the target's limits (its logits one binding, its
    /// dispatches' workgroup counts).
    pub micro_batch: Option<u32>,
    /// AdamW's moments in 8 bits (`kernels::adamw::adamw_update_8bit`).
    pub eight_bit: bool,
    /// Mixed precision: every matmul, forward and backward, on tensor
    /// cores ([`VariantSpec::training_mixed`]); the target must have
    /// cooperative matrices.
    pub mixed: bool,
    /// Features and limits to compile for.
    pub target: Target,
}

/// [`generate_training`]'s result.
#[derive(Clone, Debug)]
pub struct TrainingProgram {
    /// What the runtime runs.
    pub plan: TrainingPlan,
    /// Weights that do not train: a buffer each (indices into the plan's
    /// buffers), for the caller to fill.
    pub frozen: Vec<WeightBuffer>,
    /// Where each of the plan's parameters comes from, in its order (f32,
    /// of the parameter's shape).
    pub trained: Vec<WeightSource>,
}

/// Compiles training graph `graph` (see the module documentation).
pub fn generate_training(
    graph: &Graph,
    opts: &TrainingOptions,
) -> Result<TrainingProgram, CodegenError> {
    let vocab = vocab(graph)?;
    let candidates = micro_batches(opts, vocab)?;
    let (&fewest, more) = candidates
        .split_last()
        .ok_or_else(|| CodegenError::Graph("no micro-batch to try".into()))?;
    for &micro in more {
        match generate_pass(graph, opts, micro, vocab) {
            // A pass past a limit that grows with its rows: fewer
            // sequences a pass.
            Err(e) if grows_with_rows(&e) => continue,
            done => return done,
        }
    }
    generate_pass(graph, opts, fewest, vocab).map_err(|e| match e {
        CodegenError::Limit {
            what,
            needed,
            limit,
            limit_name,
            ..
        } if ROW_LIMITS.contains(&limit_name) => CodegenError::Limit {
            what,
            needed,
            limit,
            limit_name,
            hint: if fewest > 1 {
                "train with a smaller --micro-batch or a shorter --seq-len"
            } else {
                "train with a shorter --seq-len"
            },
        },
        e => e,
    })
}

/// The limits a pass of more rows may pass: a dispatch's workgroups along
/// an axis, a binding's bytes.
const ROW_LIMITS: [&str; 2] = [
    "max_compute_workgroups_per_dimension",
    "max_storage_buffer_binding_size",
];

fn grows_with_rows(e: &CodegenError) -> bool {
    matches!(e, CodegenError::Limit { limit_name, .. } if ROW_LIMITS.contains(limit_name))
}

/// [`generate_training`] with `micro` sequences a pass.
fn generate_pass(
    graph: &Graph,
    opts: &TrainingOptions,
    micro: u32,
    vocab: u32,
) -> Result<TrainingProgram, CodegenError> {
    let order = graph
        .topo_order()
        .ok_or_else(|| CodegenError::Graph("the graph has a cycle".into()))?;
    let rows = micro * opts.seq_len;
    let copts = CodegenOptions {
        max_context: u64::from(rows),
        max_tokens_per_step: u64::from(rows),
        target: opts.target.clone(),
        prefill_rows_per_workgroup: ROWS_PER_WORKGROUP,
        gemm_tiles: GemmTiles::new(),
        // The segment table's sequence places.
        max_batch: micro,
    };
    let spec = if opts.mixed {
        VariantSpec::training_mixed(ROWS_PER_WORKGROUP)
    } else {
        VariantSpec::portable(Precision::F32, ROWS_PER_WORKGROUP)
    };
    if let Some(missing) = spec.features.iter().find(|f| !opts.target.has(**f)) {
        return Err(CodegenError::Unsupported {
            label: "the training step".into(),
            reason: format!(
                "mixed precision needs the `{}` feature, which the target lacks; \
                 train in f32 on this device",
                missing.name()
            ),
        });
    }
    let sources = sources::place(graph, &order, &copts, std::slice::from_ref(&spec))?;
    let target_ids = sources.target_ids.ok_or_else(|| {
        CodegenError::Graph(
            "the graph reads no next-token targets: it is not a training graph (run the \
             autodiff pass)"
                .into(),
        )
    })?;
    let loss = output_buffer(&sources.training, gerbil_ir::LOSS)?;
    let steps: Vec<NodeId> = order
        .iter()
        .copied()
        .filter(|&id| !graph.node(id).op.is_source())
        .collect();
    let no_fusion = RopeAttention::find(graph, &[]);
    let layout = Layout::plan(graph, &steps, sources, &no_fusion)?;
    let lowering = Lowering {
        graph,
        shard_rows: &layout.sources.buffers.shard_rows,
        max_context: rows,
        max_tokens: rows,
        min_tokens: rows,
        max_batch: 0,
        sequences: micro,
        target: &opts.target,
        gemm_tiles: &copts.gemm_tiles,
    };
    let scratch = layout.sources.buffers.decls.len() as u32;
    let mut asm = Assembler::new(scratch);
    let phase = Phase::Prefill(ROWS_PER_WORKGROUP);
    let mut pass = schedule(&steps, &layout, &lowering, &mut asm, &spec, phase, None)?;
    let (mut parameters, trained, moved) = parameters(graph, &layout)?;
    let sources = layout.sources;
    let mut decls = sources.buffers.decls;
    if let Some(decl) = asm.place_scratch(&mut [&mut pass]) {
        decls.push(decl);
    }
    let banks = banks(&mut parameters, opts.target.limits.max_storage_binding / 4);
    // Every bank's buffer of each kind, in bank order.
    let mut bank_buffers = |holds: TrainingBuffer, bytes: &dyn Fn(u64) -> u64| -> Vec<u32> {
        banks
            .iter()
            .map(|&(_, len)| push(&mut decls, holds, bytes(u64::from(len))))
            .collect()
    };
    let io = TrainingIo {
        step_params: sources.step_params,
        step_rows: sources
            .step_rows
            .ok_or_else(|| CodegenError::Graph("a training step has no segment table".into()))?,
        token_ids: sources.token_ids,
        target_ids,
        loss,
        parameters: bank_buffers(TrainingBuffer::Parameters, &|n| 4 * n),
        gradients: bank_buffers(TrainingBuffer::Gradients, &|n| 4 * n),
        accumulated: Vec::new(),
        settings: 0,
        report: 0,
    };
    let state = if opts.eight_bit {
        let block = u64::from(adamw::STATE_BLOCK);
        State::EightBit {
            mq: bank_buffers(TrainingBuffer::FirstMoment, &|n| n.next_multiple_of(4)),
            vq: bank_buffers(TrainingBuffer::SecondMoment, &|n| n.next_multiple_of(4)),
            scales: bank_buffers(TrainingBuffer::Scales, &|n| 8 * n.div_ceil(block)),
        }
    } else {
        State::F32 {
            m: bank_buffers(TrainingBuffer::FirstMoment, &|n| 4 * n),
            v: bank_buffers(TrainingBuffer::SecondMoment, &|n| 4 * n),
        }
    };
    // One pass a step: the optimizer reads the pass's gradients (and
    // zeroes them) with nothing to add first, and the batch's buffers are
    // the same; several: a buffer per bank that each pass adds into.
    let passes = opts.batch / micro;
    let accumulated = if passes > 1 {
        bank_buffers(TrainingBuffer::Accumulated, &|n| 4 * n)
    } else {
        io.gradients.clone()
    };
    let io = TrainingIo {
        accumulated,
        settings: push(&mut decls, TrainingBuffer::Settings, 32),
        report: push(&mut decls, TrainingBuffer::Report, 12),
        ..io
    };
    let partials = push(
        &mut decls,
        TrainingBuffer::Partials,
        4 * u64::from(adamw::PARTIALS) * banks.len() as u64,
    );
    // The trained weights and their gradients move into their banks.
    let home = |b: u32| -> Option<(u32, u64)> {
        let &(param, is_grad) = moved.get(&b)?;
        let p = &parameters[param];
        let bank = banks.iter().rposition(|&(start, _)| start <= p.offset)?;
        let buffers = if is_grad {
            &io.gradients
        } else {
            &io.parameters
        };
        Some((buffers[bank], 4 * (p.offset - banks[bank].0)))
    };
    for slice in pass.iter_mut().flat_map(|d| d.bindings.iter_mut()) {
        if let Some((buffer, offset)) = home(slice.buffer) {
            slice.buffer = buffer;
            slice.offset += offset;
        }
    }
    let mut bind = Binder {
        asm: &mut asm,
        limits: spec.limits(&opts.target),
        params: BufferSlice {
            buffer: io.step_params,
            offset: 0,
            size: STEP_PARAMS_BYTES,
        },
    };
    let whole = |b: u32| BufferSlice {
        buffer: b,
        offset: 0,
        size: decls[b as usize].size,
    };
    let mut accumulate = Vec::new();
    let mut optimizer = Vec::new();
    for (r, &(_, len)) in banks.iter().enumerate() {
        if passes > 1 {
            accumulate.push(bind.dispatch(
                "accumulate",
                adamw::accumulate(len, passes),
                &[
                    (input(0), whole(io.gradients[r])),
                    (output(0), whole(io.accumulated[r])),
                ],
            )?);
        }
        let partial_bytes = 4 * u64::from(adamw::PARTIALS);
        optimizer.push(bind.dispatch(
            "grad_norm",
            adamw::grad_norm_partials(len),
            &[
                (input(0), whole(io.accumulated[r])),
                (
                    output(0),
                    BufferSlice {
                        buffer: partials,
                        offset: r as u64 * partial_bytes,
                        size: partial_bytes,
                    },
                ),
            ],
        )?);
    }
    for (r, &(_, len)) in banks.iter().enumerate() {
        let mut operands = vec![
            (input(0), whole(io.settings)),
            (input(1), whole(partials)),
            (output(0), whole(io.parameters[r])),
            (output(1), whole(io.accumulated[r])),
        ];
        let count = banks.len() as u32;
        let source = match &state {
            State::F32 { m, v } => {
                operands.push((output(2), whole(m[r])));
                operands.push((output(3), whole(v[r])));
                operands.push((output(4), whole(io.report)));
                adamw::adamw_update(len, count, false)
            }
            State::EightBit { mq, vq, scales } => {
                operands.push((output(2), whole(mq[r])));
                operands.push((output(3), whole(vq[r])));
                operands.push((output(4), whole(scales[r])));
                operands.push((output(5), whole(io.report)));
                adamw::adamw_update_8bit(len, count, false)
            }
        };
        optimizer.push(bind.dispatch("adamw", source, &operands)?);
    }
    // The moved buffers leave the table; the rest are renumbered.
    let kept: Vec<u32> = (0..decls.len() as u32)
        .filter(|b| !moved.contains_key(b))
        .collect();
    let renumber: HashMap<u32, u32> = kept
        .iter()
        .enumerate()
        .map(|(new, &old)| (old, new as u32))
        .collect();
    let at = |b: u32| renumber.get(&b).copied().unwrap_or(u32::MAX);
    for slice in [&mut pass, &mut accumulate, &mut optimizer]
        .into_iter()
        .flat_map(|s| s.iter_mut())
        .flat_map(|d| d.bindings.iter_mut())
    {
        slice.buffer = at(slice.buffer);
    }
    let frozen = sources
        .buffers
        .weights
        .into_iter()
        .filter(|w| !moved.contains_key(&w.buffer))
        .map(|w| WeightBuffer {
            buffer: at(w.buffer),
            ..w
        })
        .collect();
    let io = TrainingIo {
        step_params: at(io.step_params),
        step_rows: at(io.step_rows),
        token_ids: at(io.token_ids),
        target_ids: at(io.target_ids),
        loss: at(io.loss),
        parameters: io.parameters.iter().map(|&b| at(b)).collect(),
        gradients: io.gradients.iter().map(|&b| at(b)).collect(),
        accumulated: io.accumulated.iter().map(|&b| at(b)).collect(),
        settings: at(io.settings),
        report: at(io.report),
    };
    let buffers: Vec<BufferDecl> = kept.iter().map(|&b| decls[b as usize].clone()).collect();
    let requirements = asm.requirements(&buffers, &[&pass, &accumulate, &optimizer]);
    Ok(TrainingProgram {
        plan: TrainingPlan {
            buffers,
            kernels: asm.finish()?,
            pass,
            accumulate,
            optimizer,
            io,
            parameters,
            seq_len: opts.seq_len,
            batch: opts.batch,
            micro_batch: micro,
            vocab,
            requirements,
        },
        frozen,
        trained,
    })
}

/// Where AdamW's moments live: a buffer per bank of each.
enum State {
    F32 {
        m: Vec<u32>,
        v: Vec<u32>,
    },
    EightBit {
        mq: Vec<u32>,
        vq: Vec<u32>,
        scales: Vec<u32>,
    },
}

/// Declares a training buffer of `bytes` (at least 4, a multiple of 4).
fn push(decls: &mut Vec<BufferDecl>, holds: TrainingBuffer, bytes: u64) -> u32 {
    decls.push(BufferDecl {
        size: bytes.max(4).next_multiple_of(4),
        kind: BufferKind::Training { holds },
    });
    (decls.len() - 1) as u32
}

/// Packs `params` in order into banks of at most `limit` values (one
/// binding), none straddling two: sets each one's offset (in the banks laid
/// end to end, a multiple of [`PARAMETER_ALIGN`] within its bank) and
/// returns each bank's first value and length. A parameter larger than a
/// bank gets one of its own (codegen has refused it before: a weight past
/// one binding is split into row shards, which training refuses).
fn banks(params: &mut [Parameter], limit: u64) -> Vec<(u64, u32)> {
    // A bank's length is rounded up to the alignment: keep that within one binding.
    let limit = (limit / PARAMETER_ALIGN * PARAMETER_ALIGN).max(PARAMETER_ALIGN);
    let mut banks = Vec::new();
    let (mut start, mut fill) = (0u64, 0u64);
    for p in params.iter_mut() {
        let mut at = fill.next_multiple_of(PARAMETER_ALIGN);
        if fill > 0 && at + p.len() > limit {
            let len = fill.next_multiple_of(PARAMETER_ALIGN);
            banks.push((start, len as u32));
            start += len;
            at = 0;
        }
        p.offset = start + at;
        fill = at + p.len();
    }
    if fill > 0 || banks.is_empty() {
        banks.push((start, fill.next_multiple_of(PARAMETER_ALIGN) as u32));
    }
    banks
}

/// The micro-batches to try, the first that compiles within the target's
/// limits taken: `opts.micro_batch` if it divides the batch, or the
/// divisors of the batch within [`PACKED_ROWS`] rows whose `[rows, vocab]`
/// f32 logits fit one binding, largest first (1 at least).
fn micro_batches(opts: &TrainingOptions, vocab: u32) -> Result<Vec<u32>, CodegenError> {
    let batch = opts.batch.max(1);
    let refuse = |why: String| CodegenError::Unsupported {
        label: "the training step".into(),
        reason: why,
    };
    if let Some(m) = opts.micro_batch {
        if m == 0 {
            return Err(refuse(
                "a micro-batch (--micro-batch) takes at least 1 sequence".into(),
            ));
        }
        if !batch.is_multiple_of(m) {
            return Err(refuse(format!(
                "a micro-batch of {m} sequences (--micro-batch) does not divide the batch of \
                 {batch} (--batch); pick a divisor of the batch"
            )));
        }
        if m.checked_mul(opts.seq_len).is_none() {
            return Err(refuse(format!(
                "a micro-batch of {m} sequences of {} tokens is past 2^32 rows; pick a \
                 smaller --micro-batch",
                opts.seq_len
            )));
        }
        return Ok(vec![m]);
    }
    let binding = opts.target.limits.max_storage_binding;
    let fits = |m: u32| {
        let rows = u64::from(m) * u64::from(opts.seq_len);
        rows <= u64::from(PACKED_ROWS) && 4 * rows * u64::from(vocab) <= binding
    };
    let most = batch.min(PACKED_ROWS / opts.seq_len.max(1));
    let mut fitting: Vec<u32> = (2..=most)
        .rev()
        .filter(|&m| batch.is_multiple_of(m) && fits(m))
        .collect();
    fitting.push(1);
    Ok(fitting)
}

/// The vocabulary: the width of the logits the loss reads.
fn vocab(graph: &Graph) -> Result<u32, CodegenError> {
    graph
        .g
        .node_indices()
        .find(|&id| {
            matches!(
                graph.node(id).op,
                Op::Train(gerbil_ir::TrainOp::CrossEntropy)
            )
        })
        .and_then(|id| graph.value_type(graph.inputs(id)[0]).last_const())
        .map(|v| v as u32)
        .ok_or_else(|| {
            CodegenError::Graph(
                "the graph has no `cross_entropy` loss: it is not a training graph (run the \
                 autodiff pass)"
                    .into(),
            )
        })
}

/// The buffer of training output `name`.
fn output_buffer(outputs: &[(String, u32)], name: &str) -> Result<u32, CodegenError> {
    outputs
        .iter()
        .find(|(n, _)| n == name)
        .map(|&(_, b)| b)
        .ok_or_else(|| {
            CodegenError::Graph(format!(
                "the graph has no `{name}` output: it is not a training graph (run the autodiff \
                 pass)"
            ))
        })
}

/// The trained weights in output order, each at its offset in the
/// parameter buffer; their sources; and the buffers that move there: each
/// weight's and each gradient output's own buffer, with the parameter's
/// index and whether it is the gradient.
fn parameters(graph: &Graph, layout: &Layout<'_, '_>) -> Result<Moved, CodegenError> {
    let b = &layout.sources.buffers;
    let weights: HashMap<&str, ValueRef> = graph
        .g
        .node_indices()
        .filter(|&id| matches!(graph.node(id).op, Op::Weight(_)))
        .map(|id| (graph.node(id).label.as_str(), ValueRef::of(id)))
        .collect();
    let mut params = Vec::new();
    let mut sources = Vec::new();
    let mut moved = HashMap::new();
    for (name, grad) in &layout.sources.training {
        let Some(label) = gerbil_ir::gradient_of(name) else {
            continue;
        };
        let refuse = |reason: String| CodegenError::Unsupported {
            label: label.to_string(),
            reason,
        };
        let &v = weights
            .get(label)
            .ok_or_else(|| refuse(format!("output `{name}` names no weight")))?;
        let Op::Weight(w) = &graph.node(v.node).op else {
            return Err(refuse(format!("output `{name}` names no weight")));
        };
        sources.push(w.source.clone());
        let ty = graph.value_type(v);
        if ty.dtype != DType::F32 {
            return Err(refuse(format!(
                "a trained weight is f32 (the master copy the optimizer steps), this one is \
                 {}; the master-weights pass (training_passes) makes 16-bit weights f32, so \
                 this is a compiler bug",
                ty.dtype
            )));
        }
        let Some(Own::Whole(own)) = b.own.get(&v) else {
            return Err(refuse(
                "it is too large for one binding of this device, and training binds every \
                 weight whole; train on a GPU with larger storage bindings"
                    .into(),
            ));
        };
        let shape: Vec<u64> = ty.shape.iter().filter_map(|d| d.as_const()).collect();
        moved.insert(*own, (params.len(), false));
        moved.insert(*grad, (params.len(), true));
        // Offsets are the banks' ([`banks`]).
        params.push(Parameter {
            label: label.to_string(),
            offset: 0,
            shape,
        });
    }
    Ok((params, sources, moved))
}

/// [`parameters`]' answer.
type Moved = (
    Vec<Parameter>,
    Vec<WeightSource>,
    HashMap<u32, (usize, bool)>,
);

/// Dispatches of kernels made here rather than lowered from a node: their
/// operands are given slices.
struct Binder<'a> {
    asm: &'a mut Assembler,
    limits: crate::target::Limits,
    /// The step parameters, which every kernel declares.
    params: BufferSlice,
}

impl Binder<'_> {
    fn dispatch(
        &mut self,
        label: &str,
        source: KernelSource,
        operands: &[(Port, BufferSlice)],
    ) -> Result<Dispatch, CodegenError> {
        let find = |port: Port| {
            operands
                .iter()
                .chain([&(Port::Params, self.params)])
                .find(|(p, _)| *p == port)
                .map(|&(_, s)| s)
        };
        let ops = Operands {
            label,
            layer: None,
            slice: &find,
            bytes: &|port| find(port).map(|s| s.size),
            flops: FlopCount::default(),
        };
        let lowered = Lowered {
            source,
            op: KernelOp::Other,
        };
        self.asm.dispatch(lowered, &ops, &[], &self.limits, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(lens: &[u64]) -> Vec<Parameter> {
        lens.iter()
            .enumerate()
            .map(|(i, &n)| Parameter {
                label: format!("w{i}"),
                shape: vec![n],
                offset: 0,
            })
            .collect()
    }

    /// The H100's and H200's largest storage binding, in f32s.
    const NVIDIA: u64 = ((2 << 30) - 4) / 4;

    #[test]
    fn no_parameter_straddles_two_banks_and_every_bank_fits_a_binding() {
        let mut p = params(&[100, 30, 1000, 7, 64, 900, 1]);
        let banks = banks(&mut p, 1024);
        assert_eq!(banks, [(0, 192), (192, 1024), (1216, 128), (1344, 1024)]);
        for q in &p {
            let (start, len) = banks[banks.iter().rposition(|b| b.0 <= q.offset).unwrap()];
            assert_eq!((q.offset - start) % PARAMETER_ALIGN, 0, "{q:?}");
            assert!(q.offset + q.len() <= start + u64::from(len), "{q:?}");
        }
    }

    #[test]
    fn smollm2_takes_one_bank_and_the_1b_shape_three() {
        // SmolLM2-135M: 30 layers of 9 tensors, the embedding, the final norm.
        let layer = [
            576 * 576,
            192 * 576,
            192 * 576,
            576 * 576,
            1536 * 576,
            1536 * 576,
            576 * 1536,
            576,
            576,
        ];
        let mut lens = vec![49_152 * 576];
        lens.extend(layer.iter().cycle().take(30 * layer.len()));
        lens.push(576);
        let mut p = params(&lens);
        assert_eq!(banks(&mut p, NVIDIA).len(), 1);
        // Llama-3.2-1B (tied): 1,235,814,400 values, 4.9 GB of f32.
        let layer = [
            2048 * 2048,
            512 * 2048,
            512 * 2048,
            2048 * 2048,
            8192 * 2048,
            8192 * 2048,
            2048 * 8192,
            2048,
            2048,
        ];
        let mut lens = vec![128_256 * 2048];
        lens.extend(layer.iter().cycle().take(16 * layer.len()));
        lens.push(2048);
        let mut p = params(&lens);
        let b = banks(&mut p, NVIDIA);
        assert_eq!(b.len(), 3);
        assert_eq!(p.iter().map(Parameter::len).sum::<u64>(), 1_235_814_400);
    }
}
