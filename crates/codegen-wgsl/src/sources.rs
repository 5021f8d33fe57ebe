//! Sources: the buffers that exist before any activation is planned.
//!
//! [`place`] walks the graph once and gives a buffer of its own to every
//! value the runtime fills or reads by name — the step parameters, token
//! ids, each weight (or its row shards, when it exceeds one binding), each
//! KV cache (and its f16 twin when a variant stores caches in f16), each
//! graph output and the sampling parameters — checking every size against
//! the target's binding limit. What is left, the activations, is the
//! planner's ([`crate::planner`]).
//!
//! The surprise: a weight too large for one binding is split by leading rows
//! into shards of a multiple of 4 rows, so every shard starts on a 4-byte
//! boundary whatever the dtype; templates pick the shard by row. When the
//! plan also has desktop variants that bind it whole
//! ([`VariantSpec::wide`]), the weight gets a whole buffer too, and each
//! shard is a range of its bytes ([`WeightAlias`]) rather than a copy.

use crate::kernels::quant;
use crate::schedule::{CodegenOptions, WeightAlias, WeightBuffer};
use crate::variant::VariantSpec;
use crate::CodegenError;
use gerbil_ir::op::KvKind;
use gerbil_ir::{DType, Dim, Graph, Input, NodeId, Op, Sym, TensorType, ValueRef, WeightSource};
use gerbil_plan::{
    BufferDecl, BufferKind, BufferSlice, KvHalf, OutputKind, Precision, SectionRef, TrainingBuffer,
    BINDING_OFFSET_ALIGN, SAMPLING_PARAMS_BYTES, SECTION_ALIGN, STEP_PARAMS_BYTES,
};
use std::collections::HashMap;

/// Where a value with a buffer of its own lives.
#[derive(Clone, Debug)]
pub(crate) enum Own {
    Whole(u32),
    /// A weight split by leading rows over several buffers.
    Shards(Vec<u32>),
}

/// `n` rounded up to a multiple of 4 (saturating: an oversized value stays
/// oversized for the binding checks to refuse).
fn round4(n: u64) -> u64 {
    n.div_ceil(4).saturating_mul(4)
}

/// Bytes of a buffer holding a value of `ty` at `T = t`, `Lmax = lmax`:
/// its bytes padded to 4, or to 16 for quantized blocks (bound as
/// `vec4<u32>`s, [`quant::stored_bytes`]). Saturates like
/// [`TensorType::size_bytes`].
fn buffer_bytes(ty: &TensorType, t: u64, lmax: u64) -> u64 {
    if ty.dtype.is_quantized() {
        quant::stored_bytes(ty.dtype, ty.numel(t, lmax)).unwrap_or(u64::MAX)
    } else {
        round4(ty.size_bytes(t, lmax))
    }
}

/// Rows per shard for a weight of `shape` that exceeds one binding of
/// `max_binding` bytes, or `None` if it fits. Shards hold a multiple of 4
/// rows so every shard starts on a 4-byte boundary whatever the dtype (a
/// quantized row is whole blocks), and of 64 where one binding holds that
/// many.
fn shard_plan(shape: &[u64], dtype: DType, max_binding: u64) -> Option<u64> {
    // Saturating: a product past u64 is "too large", never a small wrapped size.
    let bytes = |dims: &[u64]| {
        let values = dims.iter().fold(1u64, |n, &d| n.saturating_mul(d));
        dtype.bytes_for(values).unwrap_or(u64::MAX)
    };
    let total = bytes(shape);
    if total <= max_binding || shape.len() < 2 {
        return None;
    }
    let row_bytes = bytes(&shape[1..]);
    let fit = max_binding / row_bytes.max(1);
    // 64 rows of a 4-byte multiple are a multiple of 256 bytes: every shard
    // then starts where a plan section may, as a range of the whole weight.
    let rows = if fit >= 64 {
        fit / 64 * 64
    } else {
        fit / 4 * 4
    };
    (rows > 0).then_some(rows)
}

/// Buffers with a known home, before arenas are placed.
pub(crate) struct Buffers<'o> {
    opts: &'o CodegenOptions,
    /// The buffer table so far.
    pub decls: Vec<BufferDecl>,
    /// Values with a buffer of their own.
    pub own: HashMap<ValueRef, Own>,
    /// Rows per shard of every sharded weight.
    pub shard_rows: HashMap<ValueRef, u32>,
    /// Sharded weights that [`VariantSpec::wide`] variants bind whole: the
    /// whole buffer.
    pub wide: HashMap<ValueRef, u32>,
    /// Whether any variant to build is [`VariantSpec::wide`].
    wide_variants: bool,
    /// Whether a value of one row holds a row per sequence (a batch
    /// step's, an encoder's pooled vectors); not in a training step, whose
    /// `max_batch` only counts the segment table's sequences.
    row_per_sequence: bool,
    /// Weight buffers to fill.
    pub weights: Vec<WeightBuffer>,
    /// Shards whose bytes are a range of a whole weight's.
    pub aliases: Vec<WeightAlias>,
}

impl<'o> Buffers<'o> {
    /// What the target allows and how large the steps are.
    pub(crate) fn opts(&self) -> &'o CodegenOptions {
        self.opts
    }

    pub(crate) fn push(&mut self, size: u64, kind: BufferKind) -> u32 {
        self.decls.push(BufferDecl {
            size: round4(size.max(4)),
            kind,
        });
        (self.decls.len() - 1) as u32
    }

    pub(crate) fn whole(&self, b: u32) -> BufferSlice {
        BufferSlice {
            buffer: b,
            offset: 0,
            size: self.decls[b as usize].size,
        }
    }

    fn check_binding(
        &self,
        what: String,
        size: u64,
        hint: &'static str,
    ) -> Result<(), CodegenError> {
        let limit = self.opts.target.limits.max_storage_binding;
        if size > limit {
            return Err(CodegenError::Limit {
                what,
                needed: size,
                limit,
                limit_name: "max_storage_buffer_binding_size",
                hint,
            });
        }
        Ok(())
    }

    fn resolved(&self, ty: &TensorType) -> TensorType {
        let (t, l) = (self.opts.max_tokens_per_step, self.opts.max_context);
        TensorType::new(
            ty.dtype,
            ty.shape.iter().map(|d| Dim::Const(d.resolve(t, l))),
        )
    }

    /// Bytes of a value of type `ty` at the largest step. A value of one
    /// row (`[1, …]`, after `slice-last-row`) holds a row per sequence of a
    /// batch step when the plan has one.
    pub(crate) fn value_bytes(&self, ty: &TensorType) -> u64 {
        let bytes = buffer_bytes(ty, self.opts.max_tokens_per_step, self.opts.max_context);
        match ty.shape.first() {
            Some(Dim::Const(1)) if self.row_per_sequence && self.opts.max_batch > 1 => {
                bytes.saturating_mul(u64::from(self.opts.max_batch))
            }
            _ => bytes,
        }
    }

    /// Bytes of an operand of type `ty` as bound: the whole value, or row
    /// shard `shard` of a weight split into shards of `shard_rows` rows.
    pub(crate) fn operand_bytes(
        &self,
        ty: &TensorType,
        shard_rows: Option<&u32>,
        shard: u32,
    ) -> Option<u64> {
        let Some(&per) = shard_rows else {
            return (shard == 0).then(|| self.value_bytes(ty));
        };
        let resolved = self.resolved(ty);
        let rows = resolved.shape.first()?.as_const()?;
        let first = u64::from(shard) * u64::from(per);
        let count = u64::from(per).min(rows.checked_sub(first).filter(|&n| n > 0)?);
        let mut shard = resolved.clone();
        shard.shape[0] = Dim::Const(count);
        Some(buffer_bytes(&shard, 0, 0))
    }

    /// A weight: one buffer, or row shards when it exceeds a binding.
    fn weight(
        &mut self,
        v: ValueRef,
        label: &str,
        source: &WeightSource,
        ty: &TensorType,
    ) -> Result<(), CodegenError> {
        let resolved = self.resolved(ty);
        let shape: Vec<u64> = resolved.shape.iter().filter_map(|d| d.as_const()).collect();
        let target = &self.opts.target;
        let limit = target.limits.max_storage_binding;
        let Some(rows_per_shard) = shard_plan(&shape, resolved.dtype, limit) else {
            let bytes = buffer_bytes(&resolved, 0, 0);
            self.check_binding(
                format!("weight `{label}`"),
                bytes,
                "it cannot be split into shards of 4 rows each within one binding; use a target with a larger binding limit (--target desktop)",
            )?;
            // A table of `Lmax` rows is indexed by position (the RoPE table).
            let position_rows = ty.shape.first() == Some(&Dim::Sym(Sym::Lmax));
            let kind = weight_kind(label.to_string(), &resolved, shape, position_rows);
            let i = self.push(bytes, kind);
            self.weights.push(WeightBuffer {
                buffer: i,
                source: source.clone(),
                ty: resolved,
                rows: None,
            });
            self.own.insert(v, Own::Whole(i));
            return Ok(());
        };
        let row_values: u64 = shape[1..].iter().product();
        let shards: Vec<(u64, u64)> = (0..shape[0])
            .step_by(rows_per_shard as usize)
            .map(|start| (start, rows_per_shard.min(shape[0] - start)))
            .collect();
        // Desktop variants bind the weight whole where it fits their
        // binding and its shards can be ranges of its bytes (each starting
        // where a plan section may).
        let offset = |start: u64| {
            start
                .checked_mul(row_values)
                .and_then(|n| resolved.dtype.bytes_for(n))
                .filter(|o| o.is_multiple_of(SECTION_ALIGN))
        };
        let whole = (self.wide_variants
            && quant::rows_are_ranges(resolved.dtype)
            && shard_plan(&shape, resolved.dtype, target.wide_binding).is_none()
            && shards.iter().all(|&(start, _)| offset(start).is_some()))
        .then(|| {
            let kind = weight_kind(label.to_string(), &resolved, shape.clone(), false);
            let i = self.push(buffer_bytes(&resolved, 0, 0), kind);
            self.weights.push(WeightBuffer {
                buffer: i,
                source: source.clone(),
                ty: resolved.clone(),
                rows: None,
            });
            self.wide.insert(v, i);
            i
        });
        let mut buffers = Vec::new();
        for (start, count) in shards {
            let mut shard_shape = shape.clone();
            shard_shape[0] = count;
            let ty = TensorType::fixed(resolved.dtype, &shard_shape);
            let name = format!("{label}[{start}..{}]", start + count);
            let i = self.push(
                buffer_bytes(&ty, 0, 0),
                weight_kind(name, &ty, shard_shape, false),
            );
            match whole.zip(offset(start)) {
                Some((of, offset)) => self.aliases.push(WeightAlias {
                    buffer: i,
                    of,
                    offset,
                }),
                None => self.weights.push(WeightBuffer {
                    buffer: i,
                    source: source.clone(),
                    ty,
                    rows: Some((start, count)),
                }),
            }
            buffers.push(i);
        }
        self.own.insert(v, Own::Shards(buffers));
        self.shard_rows.insert(v, rows_per_shard as u32);
        Ok(())
    }
}

fn weight_kind(name: String, ty: &TensorType, shape: Vec<u64>, position_rows: bool) -> BufferKind {
    BufferKind::Weight {
        section: SectionRef { offset: 0, len: 0 },
        name,
        dtype: ty.dtype.to_string(),
        shape,
        position_rows,
    }
}

/// Whether `graph` is an encoder's: its output is an embedding, and its
/// steps pack whole sequences.
pub(crate) fn is_encoder(graph: &Graph) -> bool {
    graph
        .outputs
        .iter()
        .any(|(name, _)| name == gerbil_ir::EMBEDDING)
}

/// Whether `graph`'s prefill steps pack whole sequences end to end, each
/// row's sequence read from the segment table (`kernels::Segments`): an
/// encoder's, and a training step's, whose micro-batch of sequences runs
/// as one step.
pub(crate) fn is_packed(graph: &Graph) -> bool {
    is_encoder(graph) || is_training(graph)
}

/// Whether `graph` is a training step's: its output is a loss.
fn is_training(graph: &Graph) -> bool {
    graph
        .outputs
        .iter()
        .any(|(name, _)| name == gerbil_ir::LOSS)
}

/// The graph output a named output stands for.
fn output_kind(name: &str) -> Result<OutputKind, CodegenError> {
    match name {
        gerbil_ir::LOGITS => Ok(OutputKind::Logits),
        gerbil_ir::NEXT_TOKEN => Ok(OutputKind::NextToken),
        gerbil_ir::EMBEDDING => Ok(OutputKind::Embedding),
        _ => Err(CodegenError::Graph(format!(
            "graph output `{name}` has no runtime meaning; the runtime reads `{}`, `{}` and `{}`",
            gerbil_ir::LOGITS,
            gerbil_ir::NEXT_TOKEN,
            gerbil_ir::EMBEDDING
        ))),
    }
}

/// The buffers [`place`] gave out, and what each stands for.
pub(crate) struct Sources<'o> {
    /// The buffer table and the values that own buffers.
    pub buffers: Buffers<'o>,
    /// The step-parameter uniform.
    pub step_params: u32,
    /// The token ids.
    pub token_ids: u32,
    /// The f16 buffer of each KV cache, for variants that store caches in f16.
    pub f16_caches: HashMap<ValueRef, u32>,
    /// The logits buffer and whether it holds every row (`[T, vocab]`);
    /// `None` in a training graph.
    pub logits: Option<(u32, bool)>,
    /// The chosen next token, if the graph samples on the GPU.
    pub next_token: Option<BufferSlice>,
    /// The sampling-parameter uniform, with `next_token`.
    pub sampling_params: Option<u32>,
    /// The row table of batch steps (a plan with a batch schedule).
    pub step_rows: Option<u32>,
    /// A training graph's next-token targets.
    pub target_ids: Option<u32>,
    /// A training graph's outputs (the loss and `grad.*`), by name.
    pub training: Vec<(String, u32)>,
}

/// Gives every source and output of `graph` (in topological `order`) its
/// buffer; `specs` are the variants to be built (an f16 one adds f16 caches).
pub(crate) fn place<'o>(
    graph: &Graph,
    order: &[NodeId],
    opts: &'o CodegenOptions,
    specs: &[VariantSpec],
) -> Result<Sources<'o>, CodegenError> {
    let mut b = Buffers {
        opts,
        decls: Vec::new(),
        own: HashMap::new(),
        shard_rows: HashMap::new(),
        wide: HashMap::new(),
        wide_variants: specs.iter().any(|s| s.wide),
        row_per_sequence: !is_training(graph),
        weights: Vec::new(),
        aliases: Vec::new(),
    };
    let align = opts.target.limits.binding_align;
    if align == 0 || !align.is_multiple_of(BINDING_OFFSET_ALIGN) {
        return Err(CodegenError::Limit {
            what: format!("target `{}`'s binding alignment", opts.target.name),
            needed: BINDING_OFFSET_ALIGN,
            limit: align,
            limit_name: "min_storage_buffer_offset_alignment",
            hint: "plans align binding offsets to a multiple of 256, WebGPU's default",
        });
    }
    let step_params = b.push(STEP_PARAMS_BYTES, BufferKind::StepParams);
    // A batch step's row table, or a packed step's segment table (a pair
    // per row, then one per sequence place: `kernels::Segments`).
    let step_rows = if is_packed(graph) {
        let pairs = opts.max_tokens_per_step + u64::from(opts.max_batch.max(1));
        Some(b.push(8 * pairs, BufferKind::StepRows))
    } else {
        (opts.max_batch > 0).then(|| b.push(8 * u64::from(opts.max_batch), BufferKind::StepRows))
    };
    let mut token_ids = None;
    let mut target_ids = None;
    let mut caches = Vec::new();
    for &id in order {
        let node = graph.node(id);
        let v = ValueRef::of(id);
        let ty = &node.outputs[0];
        match &node.op {
            Op::Input(Input::TargetIds) => {
                let holds = TrainingBuffer::TargetIds;
                let i = b.push(b.value_bytes(ty), BufferKind::Training { holds });
                target_ids = Some(i);
                b.own.insert(v, Own::Whole(i));
            }
            Op::Input(Input::TokenIds) => {
                let i = b.push(b.value_bytes(ty), BufferKind::TokenIds);
                token_ids = Some(i);
                b.own.insert(v, Own::Whole(i));
            }
            Op::Weight(w) => b.weight(v, &node.label, &w.source, ty)?,
            Op::KvCache { layer, kind, .. } => {
                let bytes = b.value_bytes(ty);
                b.check_binding(
                    format!("KV cache `{}`", node.label),
                    bytes,
                    "use a smaller --max-context",
                )?;
                let half = match kind {
                    KvKind::K => KvHalf::K,
                    KvKind::V => KvHalf::V,
                };
                let kind = BufferKind::KvCache {
                    layer: *layer,
                    half,
                    row_bytes: Some(ty.size_bytes(1, 1)),
                };
                let i = b.push(bytes, kind.clone());
                b.own.insert(v, Own::Whole(i));
                caches.push((v, ty, kind));
            }
            _ => {}
        }
    }
    let token_ids =
        token_ids.ok_or_else(|| CodegenError::Graph("the graph reads no token ids".into()))?;
    // f16 variants bind KV caches of their own, half the size.
    let mut f16_caches = HashMap::new();
    if specs.iter().any(|s| s.precision == Precision::F16) {
        for (v, ty, kind) in caches {
            let ty = TensorType::new(DType::F16, ty.shape.iter().cloned());
            let kind = match kind {
                BufferKind::KvCache { layer, half, .. } => BufferKind::KvCache {
                    layer,
                    half,
                    row_bytes: Some(ty.size_bytes(1, 1)),
                },
                other => other,
            };
            f16_caches.insert(v, b.push(b.value_bytes(&ty), kind));
        }
    }
    let mut logits = None;
    let mut next_token = None;
    let mut sampling_params = None;
    let mut training = Vec::new();
    for (name, v) in &graph.outputs {
        let ty = graph.value_type(*v);
        let bytes = b.value_bytes(ty);
        b.check_binding(
            format!("output `{name}`"),
            bytes,
            "use a smaller --max-tokens-per-step",
        )?;
        // A training graph's loss and gradients.
        if name == gerbil_ir::LOSS || gerbil_ir::gradient_of(name).is_some() {
            let holds = if name == gerbil_ir::LOSS {
                TrainingBuffer::Loss
            } else {
                TrainingBuffer::Gradients
            };
            let i = b.push(bytes, BufferKind::Training { holds });
            b.own.insert(*v, Own::Whole(i));
            training.push((name.clone(), i));
            continue;
        }
        let output = output_kind(name)?;
        let i = b.push(bytes, BufferKind::Output { output });
        b.own.insert(*v, Own::Whole(i));
        if output == OutputKind::NextToken {
            next_token = Some(BufferSlice {
                buffer: i,
                offset: 0,
                size: bytes,
            });
            sampling_params = Some(b.push(SAMPLING_PARAMS_BYTES, BufferKind::SamplingParams));
            continue;
        }
        let all_rows = match ty.shape.first() {
            Some(Dim::Const(1)) => false,
            Some(Dim::Sym(_)) => true,
            _ => {
                return Err(CodegenError::Graph(format!(
                    "logits must be [1, vocab] or [T, vocab], got {ty}"
                )))
            }
        };
        logits = Some((i, all_rows));
    }
    Ok(Sources {
        buffers: b,
        step_params,
        token_ids,
        f16_caches,
        logits,
        next_token,
        sampling_params,
        step_rows,
        target_ids,
        training,
    })
}
