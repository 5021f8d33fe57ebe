//! Lowering a verified graph to buffers, kernels and dispatch schedules.

use crate::kernels::{
    attention::{self, AttentionSpec},
    elementwise,
    embedding::{self, EmbeddingSpec},
    matmul::{self, MatMulSpec},
    qkv_rope::{self, QkvRopeSpec},
    rms_norm::{self, RmsNormSpec},
    rope::{self, RopeSpec},
    KernelSource, Rows, MAX_WORKGROUPS_PER_DIM,
};
use crate::{validate, CodegenError};
use gerbil_ir::{Dim, Graph, NodeId, Op, TensorType, ValueRef, WeightSource};
use gerbil_passes::buffer_plan::{plan_arenas, Interval};
use gerbil_plan::{
    BufferDecl, BufferKind, BufferSlice, Dispatch, IoBindings, Kernel, Requirements, SectionRef,
    STEP_PARAMS_BYTES,
};
use std::collections::HashMap;

/// What the target allows and how large the plan's steps are.
#[derive(Clone, Debug)]
pub struct CodegenOptions {
    /// KV-cache capacity (`Lmax`).
    pub max_context: u64,
    /// Most tokens in one prefill step (`T` ≤ this).
    pub max_tokens_per_step: u64,
    /// Largest storage binding the target allows.
    pub max_storage_binding: u64,
    /// Alignment of binding offsets.
    pub binding_align: u64,
    /// Rows of `x` per matmul workgroup in prefill.
    pub prefill_rows_per_workgroup: u32,
}

impl Default for CodegenOptions {
    fn default() -> Self {
        CodegenOptions {
            max_context: 4096,
            max_tokens_per_step: 256,
            max_storage_binding: 128 << 20,
            binding_align: 256,
            prefill_rows_per_workgroup: 8,
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
    /// Distinct kernels.
    pub kernels: Vec<Kernel>,
    /// Prefill schedule.
    pub prefill: Vec<Dispatch>,
    /// Decode schedule.
    pub decode: Vec<Dispatch>,
    /// Input and output buffers.
    pub io: IoBindings,
    /// Weight buffers to fill.
    pub weights: Vec<WeightBuffer>,
    /// Device limits the plan needs.
    pub requirements: Requirements,
    /// Sum of all activation sizes at `max_tokens_per_step`.
    pub activation_naive_bytes: u64,
}

#[derive(Clone, Debug)]
enum Loc {
    Whole(u32),
    /// A weight split by leading rows over several buffers of `rows` rows each.
    Shards {
        buffers: Vec<u32>,
        rows: u64,
    },
    Arena(usize),
}

fn round4(n: u64) -> u64 {
    n.div_ceil(4) * 4
}

fn rows_of(ty: &TensorType) -> Rows {
    match ty.shape.first() {
        Some(Dim::Const(n)) => Rows::Fixed(*n as u32),
        _ => Rows::Tokens,
    }
}

fn width_of(ty: &TensorType) -> u32 {
    ty.last_const().unwrap_or(0) as u32
}

struct Builder<'g> {
    graph: &'g Graph,
    opts: &'g CodegenOptions,
    buffers: Vec<BufferDecl>,
    /// Where each value lives, by (node, output port).
    locs: HashMap<ValueRef, Loc>,
    arena_slices: Vec<BufferSlice>,
    kernels: Vec<Kernel>,
    kernel_index: HashMap<String, u32>,
    requirements: Requirements,
}

impl Builder<'_> {
    fn push_buffer(&mut self, size: u64, kind: BufferKind) -> u32 {
        self.buffers.push(BufferDecl {
            size: round4(size.max(4)),
            kind,
        });
        (self.buffers.len() - 1) as u32
    }

    fn whole(&self, b: u32) -> BufferSlice {
        BufferSlice {
            buffer: b,
            offset: 0,
            size: self.buffers[b as usize].size,
        }
    }

    /// The bindings of a value: one slice, or one per shard.
    fn slices(&self, v: ValueRef) -> Vec<BufferSlice> {
        match &self.locs[&v] {
            Loc::Whole(b) => vec![self.whole(*b)],
            Loc::Shards { buffers, .. } => buffers.iter().map(|&b| self.whole(b)).collect(),
            Loc::Arena(i) => vec![self.arena_slices[*i]],
        }
    }

    fn slice(&self, v: ValueRef) -> BufferSlice {
        self.slices(v)[0]
    }

    /// Rows per shard of a sharded weight.
    fn shard_rows(&self, v: ValueRef) -> Option<u32> {
        match &self.locs[&v] {
            Loc::Shards { rows, .. } => Some(*rows as u32),
            _ => None,
        }
    }

    fn value_bytes(&self, ty: &TensorType) -> u64 {
        round4(ty.size_bytes(self.opts.max_tokens_per_step, self.opts.max_context))
    }

    fn check_binding(&self, what: &str, size: u64, hint: &'static str) -> Result<(), CodegenError> {
        if size > self.opts.max_storage_binding {
            return Err(CodegenError::Limit {
                what: what.to_string(),
                needed: size,
                limit: self.opts.max_storage_binding,
                limit_name: "max_storage_buffer_binding_size",
                hint,
            });
        }
        Ok(())
    }

    fn add_kernel(&mut self, src: KernelSource) -> Result<u32, CodegenError> {
        if let Some(&i) = self.kernel_index.get(&src.wgsl) {
            return Ok(i);
        }
        validate(&src.name, &src.wgsl)?;
        let r = &mut self.requirements;
        r.max_compute_workgroup_storage_size = r
            .max_compute_workgroup_storage_size
            .max(src.workgroup_bytes);
        r.max_compute_invocations_per_workgroup = r
            .max_compute_invocations_per_workgroup
            .max(src.workgroup_size.iter().product());
        r.max_storage_buffers_per_shader_stage = r
            .max_storage_buffers_per_shader_stage
            .max(src.bindings.len() as u32 - 1);
        let mut name = src.name.clone();
        if self.kernels.iter().any(|k| k.name == name) {
            name = format!("{name}_{}", self.kernels.len());
        }
        self.kernels.push(Kernel {
            name,
            wgsl: src.wgsl.clone(),
            entry: "main".into(),
            workgroup_size: src.workgroup_size,
            bindings: src.bindings,
        });
        let i = (self.kernels.len() - 1) as u32;
        self.kernel_index.insert(src.wgsl, i);
        Ok(i)
    }

    /// The lookup part of an embedding kernel for the table `table` of type `t`.
    fn embedding_spec(
        &self,
        table: ValueRef,
        t: &TensorType,
        scale: Option<f32>,
        label: &str,
    ) -> Result<EmbeddingSpec, CodegenError> {
        let vocab = t.shape[0]
            .as_const()
            .ok_or_else(|| CodegenError::Unsupported {
                label: label.to_string(),
                reason: "symbolic vocabulary".into(),
            })?;
        Ok(EmbeddingSpec {
            shard_rows: self.shard_rows(table),
            vocab: vocab as u32,
            width: width_of(t),
            wdtype: t.dtype,
            scale,
        })
    }

    /// The kernel for one compute node in one phase.
    fn kernel_for(&self, id: NodeId, tt: u32) -> Result<KernelSource, CodegenError> {
        let g = self.graph;
        let node = g.node(id);
        let ins = g.inputs(id);
        let in_ty = |i: usize| g.value_type(ins[i]);
        let out_ty = &node.outputs[0];
        let unsupported = |reason: &str| CodegenError::Unsupported {
            label: node.label.clone(),
            reason: reason.to_string(),
        };
        Ok(match &node.op {
            Op::EmbeddingRmsNorm(e, n) => embedding::kernel_with_norm(
                self.embedding_spec(ins[0], in_ty(0), e.scale, &node.label)?,
                embedding::NormSpec {
                    eps: n.eps,
                    offset: n.weight_offset,
                    wdtype: in_ty(2).dtype,
                },
            ),
            Op::Embedding(e) => {
                embedding::kernel(self.embedding_spec(ins[0], in_ty(0), e.scale, &node.label)?)
            }
            Op::RmsNorm(n) => rms_norm::kernel(RmsNormSpec {
                rows: rows_of(out_ty),
                width: width_of(out_ty) / n.groups.max(1),
                groups: n.groups.max(1),
                eps: n.eps,
                offset: n.weight_offset,
                wdtype: in_ty(1).dtype,
            }),
            Op::MatMul(_) | Op::MatMulGlu(_) => {
                let (bias, glu) = match &node.op {
                    Op::MatMulGlu(m) => (m.has_bias, Some(m.act)),
                    Op::MatMul(m) => (m.has_bias, None),
                    _ => (false, None),
                };
                let rows = rows_of(out_ty);
                matmul::kernel(MatMulSpec {
                    shard_rows: self.shard_rows(ins[1]),
                    rows,
                    k: width_of(in_ty(0)),
                    n: width_of(out_ty),
                    wdtype: in_ty(1).dtype,
                    bias,
                    tt: match rows {
                        Rows::Tokens => tt,
                        Rows::Fixed(r) => r.min(tt).max(1),
                    },
                    glu,
                })
            }
            Op::AddRmsNormLastRow(n) => rms_norm::add_kernel_last_row(RmsNormSpec {
                rows: Rows::Fixed(1),
                width: width_of(out_ty),
                groups: 1,
                eps: n.eps,
                offset: n.weight_offset,
                wdtype: in_ty(2).dtype,
            }),
            Op::AddRmsNorm(n) => rms_norm::add_kernel(RmsNormSpec {
                rows: rows_of(out_ty),
                width: width_of(out_ty),
                groups: 1,
                eps: n.eps,
                offset: n.weight_offset,
                wdtype: in_ty(2).dtype,
            }),
            Op::QkvRope(r) => qkv_rope::kernel(QkvRopeSpec {
                heads: r.n_heads,
                kv_heads: r.n_kv_heads,
                head_dim: r.head_dim,
                rotary_dim: r.rotary_dim,
                norm: r.qk_norm.map(|n| (n.eps, n.weight_offset, in_ty(4).dtype)),
            }),
            Op::SliceCols { start, len } => elementwise::slice_cols(
                rows_of(out_ty),
                width_of(in_ty(0)),
                *start as u32,
                *len as u32,
            ),

            Op::Rope(r) => rope::kernel(RopeSpec {
                heads: r.n_heads,
                head_dim: r.head_dim,
                rotary_dim: r.rotary_dim,
            }),
            Op::CacheWrite => elementwise::cache_write(width_of(out_ty)),
            Op::Attention(a) => attention::kernel(AttentionSpec {
                heads: a.n_heads,
                kv_heads: a.n_kv_heads,
                head_dim: a.head_dim,
                scale: a.scale,
                window: a.window.unwrap_or(0),
            }),
            Op::Unary(u) => elementwise::unary(*u, rows_of(out_ty), width_of(out_ty)),
            Op::Binary(b) => elementwise::binary(*b, rows_of(out_ty), width_of(out_ty)),
            Op::AddBias => elementwise::add_bias(rows_of(out_ty), width_of(out_ty), in_ty(1).dtype),
            Op::SliceLastRow => elementwise::slice_last_row(width_of(out_ty)),
            Op::Input(_) | Op::Weight(_) | Op::KvCache { .. } => {
                return Err(unsupported("source nodes have no kernel"))
            }
        })
    }

    fn dispatches(&mut self, steps: &[NodeId], tt: u32) -> Result<Vec<Dispatch>, CodegenError> {
        let mut out = Vec::with_capacity(steps.len());
        for &id in steps {
            let src = self.kernel_for(id, tt)?;
            let max_t = self.opts.max_tokens_per_step as u32;
            for (axis, wg) in src.workgroups.iter().enumerate() {
                let n = wg.eval(max_t);
                if n > MAX_WORKGROUPS_PER_DIM {
                    return Err(CodegenError::Limit {
                        what: format!("kernel {} (axis {axis}) at T={max_t}", src.name),
                        needed: u64::from(n),
                        limit: u64::from(MAX_WORKGROUPS_PER_DIM),
                        limit_name: "max_compute_workgroups_per_dimension",
                        hint: "use a smaller --max-tokens-per-step",
                    });
                }
            }
            let workgroups = src.workgroups;
            let kernel = self.add_kernel(src)?;
            let node = self.graph.node(id);
            let ins = self.graph.inputs(id);
            let mut bindings = vec![BufferSlice {
                buffer: self.step_params(),
                offset: 0,
                size: STEP_PARAMS_BYTES,
            }];
            bindings.extend(ins.iter().flat_map(|v| self.slices(*v)));
            // Then every output the op does not write in place, in port order.
            for port in 0..node.outputs.len() as u32 {
                if node.op.aliased_input(port).is_none() {
                    bindings.push(self.slice(ValueRef { node: id, port }));
                }
            }
            out.push(Dispatch {
                kernel,
                bindings,
                workgroups,
                label: node.label.clone(),
            });
        }
        Ok(out)
    }

    fn step_params(&self) -> u32 {
        0
    }
}

/// Rows per shard for a weight of `shape` that exceeds one binding of
/// `max_binding` bytes, or `None` if it fits. Shards hold a multiple of 4
/// rows so every shard starts on a 4-byte boundary whatever the dtype.
fn shard_plan(shape: &[u64], elem_bytes: u64, max_binding: u64) -> Option<u64> {
    let total: u64 = shape.iter().product::<u64>() * elem_bytes;
    if total <= max_binding || shape.len() < 2 {
        return None;
    }
    let row_bytes: u64 = shape[1..].iter().product::<u64>() * elem_bytes;
    let rows = (max_binding / row_bytes.max(1)) / 4 * 4;
    (rows > 0).then_some(rows)
}

/// Lowers a verified graph to a [`Program`].
pub fn generate(graph: &Graph, opts: &CodegenOptions) -> Result<Program, CodegenError> {
    let order = graph
        .topo_order()
        .ok_or_else(|| CodegenError::Graph("the graph has a cycle".into()))?;
    let mut b = Builder {
        graph,
        opts,
        buffers: Vec::new(),
        locs: HashMap::new(),
        arena_slices: Vec::new(),
        kernels: Vec::new(),
        kernel_index: HashMap::new(),
        requirements: Requirements::default(),
    };
    b.push_buffer(STEP_PARAMS_BYTES, BufferKind::StepParams);
    let mut weights = Vec::new();
    let mut token_ids = None;
    // Sources get whole buffers.
    for &id in &order {
        let node = graph.node(id);
        let ty = &node.outputs[0];
        let resolved = TensorType::new(
            ty.dtype,
            ty.shape
                .iter()
                .map(|d| Dim::Const(d.resolve(opts.max_tokens_per_step, opts.max_context))),
        );
        let bytes = round4(resolved.size_bytes(0, 0));
        match &node.op {
            Op::Input(_) => {
                let i = b.push_buffer(bytes, BufferKind::TokenIds);
                token_ids = Some(i);
                b.locs.insert(ValueRef::of(id), Loc::Whole(i));
            }
            Op::Weight(w) => {
                let shape: Vec<u64> = resolved.shape.iter().filter_map(|d| d.as_const()).collect();
                let plan = shard_plan(
                    &shape,
                    resolved.dtype.size_bytes(),
                    opts.max_storage_binding,
                );
                let Some(rows_per_shard) = plan else {
                    b.check_binding(
                        &format!("weight `{}`", node.label),
                        bytes,
                        "one row of it is larger than a binding, so it cannot be split into row shards; use a target with a larger binding limit",
                    )?;
                    let i = b.push_buffer(
                        bytes,
                        BufferKind::Weight {
                            section: SectionRef { offset: 0, len: 0 },
                            name: node.label.clone(),
                            dtype: resolved.dtype.to_string(),
                            shape,
                        },
                    );
                    weights.push(WeightBuffer {
                        buffer: i,
                        source: w.source.clone(),
                        ty: resolved,
                        rows: None,
                    });
                    b.locs.insert(ValueRef::of(id), Loc::Whole(i));
                    continue;
                };
                let mut buffers = Vec::new();
                let mut start = 0;
                while start < shape[0] {
                    let count = rows_per_shard.min(shape[0] - start);
                    let mut shard_shape = shape.clone();
                    shard_shape[0] = count;
                    let ty = TensorType::fixed(resolved.dtype, &shard_shape);
                    let i = b.push_buffer(
                        round4(ty.size_bytes(0, 0)),
                        BufferKind::Weight {
                            section: SectionRef { offset: 0, len: 0 },
                            name: format!("{}[{start}..{}]", node.label, start + count),
                            dtype: resolved.dtype.to_string(),
                            shape: shard_shape,
                        },
                    );
                    weights.push(WeightBuffer {
                        buffer: i,
                        source: w.source.clone(),
                        ty,
                        rows: Some((start, count)),
                    });
                    buffers.push(i);
                    start += count;
                }
                b.locs.insert(
                    ValueRef::of(id),
                    Loc::Shards {
                        buffers,
                        rows: rows_per_shard,
                    },
                );
            }
            Op::KvCache { .. } => {
                b.check_binding(
                    &format!("KV cache `{}`", node.label),
                    bytes,
                    "use a smaller --max-context",
                )?;
                let i = b.push_buffer(
                    bytes,
                    BufferKind::State {
                        name: node.label.clone(),
                    },
                );
                b.locs.insert(ValueRef::of(id), Loc::Whole(i));
            }
            _ => {}
        }
    }
    let token_ids =
        token_ids.ok_or_else(|| CodegenError::Graph("the graph reads no token ids".into()))?;
    let steps: Vec<NodeId> = order
        .iter()
        .copied()
        .filter(|&id| !graph.node(id).op.is_source())
        .collect();
    let step_of: HashMap<NodeId, usize> =
        steps.iter().enumerate().map(|(s, &id)| (id, s)).collect();
    // Activations: liveness intervals in schedule order.
    let mut intervals = Vec::new();
    let mut logits = None;
    for (s, &id) in steps.iter().enumerate() {
        let node = graph.node(id);
        for port in 0..node.outputs.len() as u32 {
            let v = ValueRef { node: id, port };
            // An output written in place lives where its input does.
            if let Some(i) = node.op.aliased_input(port) {
                let input = graph.inputs(id)[i];
                let loc = b.locs[&input].clone();
                b.locs.insert(v, loc);
                continue;
            }
            let bytes = b.value_bytes(&node.outputs[port as usize]);
            b.check_binding(
                &format!("activation `{}`", node.label),
                bytes,
                "use a smaller --max-tokens-per-step",
            )?;
            if let Some((name, _)) = graph.outputs.iter().find(|(_, o)| *o == v) {
                let i = b.push_buffer(bytes, BufferKind::State { name: name.clone() });
                b.locs.insert(v, Loc::Whole(i));
                if name == "logits" {
                    logits = Some(i);
                }
                continue;
            }
            let end = graph
                .users(v)
                .iter()
                .filter_map(|(u, _)| step_of.get(u).copied())
                .max()
                .unwrap_or(s);
            b.locs.insert(v, Loc::Arena(intervals.len()));
            intervals.push(Interval {
                start: s,
                end,
                size: bytes,
            });
        }
    }
    let logits =
        logits.ok_or_else(|| CodegenError::Graph("the graph has no `logits` output".into()))?;
    let logits_ty = graph
        .outputs
        .iter()
        .find(|(n, _)| n == "logits")
        .map(|(_, v)| graph.value_type(*v).clone())
        .ok_or_else(|| CodegenError::Graph("no logits".into()))?;
    let logits_all_rows = match logits_ty.shape.first() {
        Some(Dim::Const(1)) => false,
        Some(Dim::Sym(_)) => true,
        _ => {
            return Err(CodegenError::Graph(format!(
                "logits must be [1, vocab] or [T, vocab], got {logits_ty}"
            )))
        }
    };
    let plan =
        plan_arenas(&intervals, opts.binding_align, opts.max_storage_binding).map_err(|e| {
            CodegenError::Limit {
                what: format!("activation {}", e.index),
                needed: e.size,
                limit: e.max,
                limit_name: "max_storage_buffer_binding_size",
                hint: "use a smaller --max-tokens-per-step",
            }
        })?;
    let arena_buffers: Vec<u32> = plan
        .arena_sizes
        .iter()
        .map(|&size| b.push_buffer(size, BufferKind::Arena))
        .collect();
    b.arena_slices = intervals
        .iter()
        .zip(&plan.placements)
        .map(|(iv, p)| BufferSlice {
            buffer: arena_buffers[p.arena],
            offset: p.offset,
            size: iv.size,
        })
        .collect();
    let prefill = b.dispatches(&steps, opts.prefill_rows_per_workgroup.max(1))?;
    let decode = b.dispatches(&steps, 1)?;
    let mut requirements = b.requirements.clone();
    requirements.max_storage_buffer_binding_size = prefill
        .iter()
        .chain(&decode)
        .flat_map(|d| d.bindings.iter().skip(1).map(|s| s.size))
        .max()
        .unwrap_or(0);
    requirements.max_buffer_size = b.buffers.iter().map(|x| x.size).max().unwrap_or(0);
    let logits_size = b.buffers[logits as usize].size;
    Ok(Program {
        buffers: b.buffers,
        kernels: b.kernels,
        prefill,
        decode,
        io: IoBindings {
            step_params: 0,
            token_ids,
            logits: BufferSlice {
                buffer: logits,
                offset: 0,
                size: logits_size,
            },
            logits_all_rows,
        },
        weights,
        requirements,
        activation_naive_bytes: intervals.iter().map(|i| i.size).sum(),
    })
}
