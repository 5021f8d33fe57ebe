//! [`generate`]: a verified graph becomes a [`Program`] — buffers, kernels,
//! and per variant a prefill and a decode schedule.
//!
//! The work is split by room: sources (token ids, weights and their row
//! shards, KV caches) and graph outputs get buffers of their own here;
//! [`crate::planner`] places every other value in arenas by liveness;
//! [`crate::lower`] picks and specializes each node's kernel;
//! [`crate::dispatch`] binds operands to kernel ports and stores kernels once.
//! Weights are placed before any variant is built, so every variant binds the
//! same weight buffers.

use crate::dispatch::{Assembler, Operands};
use crate::lower::{Lowering, Phase};
use crate::planner::{self, Home, Step};
use crate::target::Target;
use crate::tuning::GemmTiles;
use crate::variant::{variants_for, VariantSpec};
use crate::CodegenError;
use gerbil_ir::op::KvKind;
use gerbil_ir::DType;
use gerbil_ir::{Dim, Graph, NodeId, Op, Sym, TensorType, ValueRef, WeightSource};
use gerbil_plan::{
    BufferDecl, BufferKind, BufferSlice, Dispatch, IoBindings, KvHalf, OutputKind, Port, Precision,
    SectionRef, Variant, BINDING_OFFSET_ALIGN, SAMPLING_PARAMS_BYTES, STEP_PARAMS_BYTES,
};
use std::collections::HashMap;

/// What the target allows and how large the plan's steps are.
#[derive(Clone, Debug)]
pub struct CodegenOptions {
    /// KV-cache capacity (`Lmax`).
    pub max_context: u64,
    /// Most tokens in one prefill step (`T` ≤ this).
    pub max_tokens_per_step: u64,
    /// Features and limits to compile for.
    pub target: Target,
    /// Rows of `x` per matmul workgroup in prefill.
    pub prefill_rows_per_workgroup: u32,
    /// Prefill GEMM tiles measured on a device (`gerbilc tune`), by shape.
    pub gemm_tiles: GemmTiles,
}

impl Default for CodegenOptions {
    fn default() -> Self {
        CodegenOptions {
            max_context: 4096,
            max_tokens_per_step: 256,
            target: Target::portable(),
            prefill_rows_per_workgroup: 8,
            gemm_tiles: GemmTiles::new(),
        }
    }
}

/// A weight buffer whose bytes the caller materializes from `source`.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightBuffer {
    /// Index into [`Program::buffers`].
    pub buffer: u32,
    /// Where the bytes come from.
    pub source: WeightSource,
    /// Type with `Lmax` resolved (of this shard, if sharded).
    pub ty: TensorType,
    /// For a shard of a weight too large for one binding: the first row of
    /// the source tensor it holds and how many rows.
    pub rows: Option<(u64, u64)>,
}

/// Codegen's result: everything in a plan header but the weight sections.
#[derive(Clone, Debug)]
pub struct Program {
    /// GPU buffers; weight buffers carry a placeholder section.
    pub buffers: Vec<BufferDecl>,
    /// Distinct kernels of every variant.
    pub kernels: Vec<gerbil_plan::Kernel>,
    /// The variants, best first.
    pub variants: Vec<Variant>,
    /// Input and output buffers.
    pub io: IoBindings,
    /// Weight buffers to fill.
    pub weights: Vec<WeightBuffer>,
    /// Sum of all activation sizes at `max_tokens_per_step`.
    pub activation_naive_bytes: u64,
}

/// Where a value with a buffer of its own lives.
#[derive(Clone, Debug)]
enum Own {
    Whole(u32),
    /// A weight split by leading rows over several buffers.
    Shards(Vec<u32>),
}

/// `n` rounded up to a multiple of 4 (saturating: an oversized value stays
/// oversized for the binding checks to refuse).
fn round4(n: u64) -> u64 {
    n.div_ceil(4).saturating_mul(4)
}

/// Rows per shard for a weight of `shape` that exceeds one binding of
/// `max_binding` bytes, or `None` if it fits. Shards hold a multiple of 4
/// rows so every shard starts on a 4-byte boundary whatever the dtype.
fn shard_plan(shape: &[u64], elem_bytes: u64, max_binding: u64) -> Option<u64> {
    // Saturating: a product past u64 is "too large", never a small wrapped size.
    let bytes = |dims: &[u64]| dims.iter().fold(elem_bytes, |n, &d| n.saturating_mul(d));
    let total = bytes(shape);
    if total <= max_binding || shape.len() < 2 {
        return None;
    }
    let row_bytes = bytes(&shape[1..]);
    let rows = (max_binding / row_bytes.max(1)) / 4 * 4;
    (rows > 0).then_some(rows)
}

/// Buffers with a known home, before arenas are placed.
struct Buffers<'o> {
    opts: &'o CodegenOptions,
    decls: Vec<BufferDecl>,
    own: HashMap<ValueRef, Own>,
    shard_rows: HashMap<ValueRef, u32>,
    weights: Vec<WeightBuffer>,
}

impl Buffers<'_> {
    fn push(&mut self, size: u64, kind: BufferKind) -> u32 {
        self.decls.push(BufferDecl {
            size: round4(size.max(4)),
            kind,
        });
        (self.decls.len() - 1) as u32
    }

    fn whole(&self, b: u32) -> BufferSlice {
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

    fn value_bytes(&self, ty: &TensorType) -> u64 {
        round4(ty.size_bytes(self.opts.max_tokens_per_step, self.opts.max_context))
    }

    /// Bytes of an operand of type `ty` as bound: the whole value, or row
    /// shard `shard` of a weight split into shards of `shard_rows` rows.
    fn operand_bytes(&self, ty: &TensorType, shard_rows: Option<&u32>, shard: u32) -> Option<u64> {
        let Some(&per) = shard_rows else {
            return (shard == 0).then(|| self.value_bytes(ty));
        };
        let resolved = self.resolved(ty);
        let rows = resolved.shape.first()?.as_const()?;
        let first = u64::from(shard) * u64::from(per);
        let count = u64::from(per).min(rows.checked_sub(first).filter(|&n| n > 0)?);
        Some(round4(resolved.size_bytes(0, 0) / rows * count))
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
        let limit = self.opts.target.limits.max_storage_binding;
        let Some(rows_per_shard) = shard_plan(&shape, resolved.dtype.size_bytes(), limit) else {
            let bytes = round4(resolved.size_bytes(0, 0));
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
        let mut buffers = Vec::new();
        let mut start = 0;
        while start < shape[0] {
            let count = rows_per_shard.min(shape[0] - start);
            let mut shard_shape = shape.clone();
            shard_shape[0] = count;
            let ty = TensorType::fixed(resolved.dtype, &shard_shape);
            let name = format!("{label}[{start}..{}]", start + count);
            let i = self.push(
                round4(ty.size_bytes(0, 0)),
                weight_kind(name, &ty, shard_shape, false),
            );
            self.weights.push(WeightBuffer {
                buffer: i,
                source: source.clone(),
                ty,
                rows: Some((start, count)),
            });
            buffers.push(i);
            start += count;
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

/// The graph output a named output stands for.
fn output_kind(name: &str) -> Result<OutputKind, CodegenError> {
    match name {
        gerbil_ir::LOGITS => Ok(OutputKind::Logits),
        gerbil_ir::NEXT_TOKEN => Ok(OutputKind::NextToken),
        _ => Err(CodegenError::Graph(format!(
            "graph output `{name}` has no runtime meaning; the runtime reads `{}` and `{}`",
            gerbil_ir::LOGITS,
            gerbil_ir::NEXT_TOKEN
        ))),
    }
}

/// Lowers a verified graph to a [`Program`].
pub fn generate(graph: &Graph, opts: &CodegenOptions) -> Result<Program, CodegenError> {
    let order = graph
        .topo_order()
        .ok_or_else(|| CodegenError::Graph("the graph has a cycle".into()))?;
    let mut b = Buffers {
        opts,
        decls: Vec::new(),
        own: HashMap::new(),
        shard_rows: HashMap::new(),
        weights: Vec::new(),
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
    let specs = variants_for(&opts.target, opts.prefill_rows_per_workgroup);
    let mut token_ids = None;
    let mut caches = Vec::new();
    for &id in &order {
        let node = graph.node(id);
        let v = ValueRef::of(id);
        let ty = &node.outputs[0];
        match &node.op {
            Op::Input(_) => {
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
    for (name, v) in &graph.outputs {
        let output = output_kind(name)?;
        let ty = graph.value_type(*v);
        let bytes = b.value_bytes(ty);
        b.check_binding(
            format!("output `{name}`"),
            bytes,
            "use a smaller --max-tokens-per-step",
        )?;
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
    let (logits, logits_all_rows) =
        logits.ok_or_else(|| CodegenError::Graph("the graph has no `logits` output".into()))?;

    let steps: Vec<NodeId> = order
        .iter()
        .copied()
        .filter(|&id| !graph.node(id).op.is_source())
        .collect();
    let plan_steps: Vec<Step<ValueRef>> = steps
        .iter()
        .map(|&id| {
            let node = graph.node(id);
            let ins = graph.inputs(id);
            Step {
                defines: (0..node.outputs.len() as u32)
                    .map(|port| {
                        let alias = node.op.aliased_input(port).map(|i| ins[i]);
                        (ValueRef { node: id, port }, alias)
                    })
                    .collect(),
                reads: ins,
            }
        })
        .collect();
    let limits = &opts.target.limits;
    let plan = planner::plan(
        &plan_steps,
        |v| b.own.contains_key(&v),
        |v| b.value_bytes(graph.value_type(v)),
        limits.binding_align,
        limits.max_storage_binding,
    )
    .map_err(|e| CodegenError::Limit {
        what: format!("activation `{}`", graph.node(e.value.node).label),
        needed: e.size,
        limit: e.max,
        limit_name: "max_storage_buffer_binding_size",
        hint: "use a smaller --max-tokens-per-step",
    })?;
    let arenas: Vec<u32> = plan
        .arena_sizes
        .iter()
        .map(|&size| b.push(size, BufferKind::Arena))
        .collect();

    // The KV cache a value is (or aliases), in `precision`'s buffer.
    let cache = |v: ValueRef, precision: Precision| -> Option<BufferSlice> {
        let root = match plan.homes.get(&v) {
            Some(&Home::External(root)) => root,
            _ => v,
        };
        match precision {
            Precision::F16 => f16_caches.get(&root).map(|&i| b.whole(i)),
            Precision::F32 => None,
        }
    };
    let slices = |v: ValueRef, precision: Precision| -> Vec<BufferSlice> {
        if let Some(c) = cache(v, precision) {
            return vec![c];
        }
        let own = |r: ValueRef| match b.own.get(&r) {
            Some(Own::Whole(i)) => vec![b.whole(*i)],
            Some(Own::Shards(list)) => list.iter().map(|&i| b.whole(i)).collect(),
            None => Vec::new(),
        };
        match plan.homes.get(&v) {
            Some(&Home::Arena { arena, offset, .. }) => vec![BufferSlice {
                buffer: arenas[arena],
                offset,
                size: b.value_bytes(graph.value_type(v)),
            }],
            Some(&Home::External(root)) => own(root),
            None => own(v),
        }
    };
    let lowering = Lowering {
        graph,
        shard_rows: &b.shard_rows,
        max_context: opts.max_context as u32,
        max_tokens: opts.max_tokens_per_step as u32,
        target: &opts.target,
        gemm_tiles: &opts.gemm_tiles,
    };
    let params = b.whole(step_params);
    let sampling = sampling_params.map(|i| b.whole(i));
    let max_t = opts.max_tokens_per_step as u32;
    // The scratch buffer, if any kernel needs one, comes after the arenas.
    let scratch = b.decls.len() as u32;
    let mut asm = Assembler::new(scratch);
    let mut schedule = |spec: &VariantSpec, phase: Phase| -> Result<Vec<Dispatch>, CodegenError> {
        steps
            .iter()
            .map(|&id| {
                let node = graph.node(id);
                let ins = graph.inputs(id);
                let slice = |port: Port| match port {
                    Port::Params => Some(params),
                    Port::Sampling => sampling,
                    Port::Input { index, shard } => ins
                        .get(index as usize)
                        .and_then(|v| slices(*v, spec.precision).get(shard as usize).copied()),
                    Port::Output { index } => slices(
                        ValueRef {
                            node: id,
                            port: index,
                        },
                        spec.precision,
                    )
                    .first()
                    .copied(),
                    Port::Scratch | Port::Counters => None,
                };
                let bytes = |port: Port| match port {
                    Port::Params => Some(STEP_PARAMS_BYTES),
                    Port::Sampling => Some(SAMPLING_PARAMS_BYTES),
                    Port::Input { index, shard } => {
                        let v = *ins.get(index as usize)?;
                        match cache(v, spec.precision) {
                            Some(c) => Some(c.size),
                            None => {
                                b.operand_bytes(graph.value_type(v), b.shard_rows.get(&v), shard)
                            }
                        }
                    }
                    Port::Output { index } => {
                        let v = ValueRef {
                            node: id,
                            port: index,
                        };
                        match cache(v, spec.precision) {
                            Some(c) => Some(c.size),
                            None => (index < node.outputs.len() as u32)
                                .then(|| b.value_bytes(&node.outputs[index as usize])),
                        }
                    }
                    Port::Scratch | Port::Counters => None,
                };
                let ops = Operands {
                    label: &node.label,
                    layer: node.layer(),
                    slice: &slice,
                    bytes: &bytes,
                    flops: lowering.flops(id),
                };
                asm.dispatch(
                    lowering.kernel(id, phase, spec)?,
                    &ops,
                    &spec.features,
                    &spec.limits(&opts.target),
                    max_t,
                )
            })
            .collect()
    };
    let mut variants = Vec::new();
    for spec in specs {
        let prefill = schedule(&spec, Phase::Prefill(spec.prefill_rows_per_workgroup))?;
        let decode = schedule(&spec, Phase::Decode)?;
        variants.push((spec, prefill, decode));
    }
    let mut schedules: Vec<_> = variants
        .iter_mut()
        .flat_map(|(_, prefill, decode)| [prefill, decode])
        .collect();
    if let Some(decl) = asm.place_scratch(&mut schedules) {
        debug_assert_eq!(b.decls.len() as u32, scratch);
        b.decls.push(decl);
    }
    let variants = variants
        .into_iter()
        .map(|(spec, prefill, decode)| Variant {
            name: spec.name.to_string(),
            requirements: asm.requirements(&b.decls, &[&prefill, &decode]),
            features: spec.features,
            precision: spec.precision,
            prefill,
            decode,
        })
        .collect();
    let logits_size = b.decls[logits as usize].size;
    Ok(Program {
        buffers: b.decls,
        kernels: asm.finish(),
        variants,
        io: IoBindings {
            step_params,
            token_ids,
            logits: BufferSlice {
                buffer: logits,
                offset: 0,
                size: logits_size,
            },
            logits_all_rows,
            next_token,
            sampling_params,
        },
        weights: b.weights,
        activation_naive_bytes: plan.naive_bytes,
    })
}
