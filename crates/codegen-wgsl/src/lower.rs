//! Op → kernel lowering: which template, specialized how, runs one IR node
//! in one schedule.
//!
//! [`Lowering::kernel`] is the one match over [`Op`] in codegen: a new op or
//! a new fused op gets its arm here and its template in [`crate::kernels`].
//! The result is a [`Lowered`] kernel: its source, whose bindings name IR
//! ports (binding buffers to them is [`crate::dispatch`]'s job), and what it
//! computes ([`KernelOp`]: a matmul's shape and template), which the plan
//! records for the tuner and the profiler. The [`Phase`] says which
//! schedule the kernel is for: prefill runs matmuls over `T` rows as tiled
//! GEMMs (a [`GemmTile`](crate::kernels::gemm::GemmTile) chosen per shape and target) and those over a fixed
//! row count with several rows per workgroup; decode runs GEMVs (one row;
//! subgroup reductions in a variant with the `subgroups` feature) and split-K
//! attention.

use crate::dispatch::Lowered;
use crate::kernels::gemm::GemmSplit;
use crate::kernels::gemm_coop::CoopGemm;
use crate::kernels::{
    argmax_rows,
    attention::{self, AttentionSpec},
    attention_cpu, attention_decode, elementwise,
    embedding::{self, EmbeddingSpec},
    encoder, gemm, gemm_coop,
    gemv::{self, Dots, Reduce},
    gemv_batch,
    matmul::{self, MatMulSpec},
    matmul_cpu,
    qkv_rope::{self, QkvRopeSpec},
    rms_norm::{self, RmsNormSpec},
    rope::{self, RopeSpec},
    sample_token, Positions, Rows,
};
use crate::target::Target;
use crate::tuning::{tile_for, GemmShape, GemmTiles};
use crate::variant::VariantSpec;
use crate::CodegenError;
use gerbil_ir::{
    Attention, DType, Dim, Graph, MatMul, MatMulGlu, NodeId, Op, QkvRope, TensorType, ValueRef,
};
use gerbil_plan::{Feature, FlopCount, KernelOp, MatMulTemplate, Precision};
use std::collections::HashMap;

fn rows_of(ty: &TensorType) -> Rows {
    match ty.shape.first() {
        Some(Dim::Const(n)) => Rows::Fixed(*n as u32),
        _ => Rows::Tokens,
    }
}

fn width_of(ty: &TensorType) -> u32 {
    ty.last_const().unwrap_or(0) as u32
}

/// The attention kernels' specialization of `a` with KV caches stored as
/// `kv`, over packed sequences if `packed`.
fn attention_spec(a: &Attention, kv: DType, packed: bool) -> AttentionSpec {
    AttentionSpec {
        heads: a.n_heads,
        kv_heads: a.n_kv_heads,
        head_dim: a.head_dim,
        scale: a.scale,
        window: a.window.unwrap_or(0),
        kv,
        causal: a.causal,
        packed,
    }
}

/// The `qkv_rope` kernels' specialization of `r`, its norms' weights
/// stored as `norm_dtype` (when it has norms) and its caches as `kv`.
fn qkv_rope_spec(r: &QkvRope, norm_dtype: Option<DType>, kv: DType) -> QkvRopeSpec {
    QkvRopeSpec {
        heads: r.n_heads,
        kv_heads: r.n_kv_heads,
        head_dim: r.head_dim,
        rotary_dim: r.rotary_dim,
        norm: r
            .qk_norm
            .zip(norm_dtype)
            .map(|(n, dt)| (n.eps, n.weight_offset, dt)),
        kv,
    }
}

/// Which schedule a kernel is lowered for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A prefill step of `1 ≤ T ≤ max_tokens_per_step` tokens, with this
    /// many matmul rows per workgroup.
    Prefill(u32),
    /// A prefill step of at most [`SHORT_PROMPT`] tokens, for its matmuls
    /// only ([`Lowering::has_short_form`]): they run as a batch step's, one
    /// workgroup row for every row of `x`, not in GEMM tiles.
    ShortPrefill,
    /// A decode step: `T = 1`.
    Decode,
    /// A batch step: `T` rows, each one token of its own sequence at the
    /// row table's position ([`Positions::Table`]); a value of one row
    /// (after `slice-last-row`) holds a row per sequence, so every row's
    /// logits come out.
    Batch,
}

/// The most tokens a prefill step of a variant with subgroups multiplies
/// through the batch step's matmuls ([`Phase::ShortPrefill`]): three
/// `gemv_batch` workgroup rows, each reading the weights once, so its time
/// grows with the prompt, where the GEMM tiles (split-K: [`GemmSplit`])
/// take nearly as long for 24 rows as for 96. H200, a prompt of the
/// Llama-3.2-1B shape, batch form against tiles: 6.1 / 10.5 ms at 24
/// tokens, 9.8 / 10.8 at 48, 11.6 / 10.9 at 56, 12.9 / 11.2 at 64; SmolLM2
/// and Gemma 3 270M cross between 48 and 56 as well. Measured for the SIMT
/// tiles, not for a tensor-core variant's.
pub const SHORT_PROMPT: u32 = 3 * gemv_batch::MAX_ROWS;

/// Lowers nodes of one graph; knows which weights are split into row shards.
pub struct Lowering<'g> {
    /// The graph.
    pub graph: &'g Graph,
    /// Rows per shard of every sharded weight.
    pub shard_rows: &'g HashMap<ValueRef, u32>,
    /// KV-cache capacity (`Lmax`).
    pub max_context: u32,
    /// Largest step (`T`) of a prefill schedule.
    pub max_tokens: u32,
    /// Smallest step of a prefill schedule: 1 in a plan, the sequence
    /// length in a training step (whose steps are all that long).
    pub min_tokens: u32,
    /// Largest step of the batch schedule.
    pub max_batch: u32,
    /// Sequences a training step packs end to end, `max_tokens` rows in
    /// all (1 in a plan, which packs none, or whose encoder steps read
    /// their sequences from the segment table).
    pub sequences: u32,
    /// The target's limits (a variant may allow its kernels more
    /// workgroup memory: [`VariantSpec::limits`]).
    pub target: &'g Target,
    /// Prefill GEMM tiles measured on a device (`gerbilc tune`); shapes it
    /// lacks get [`GemmTile::choose`](crate::kernels::gemm::GemmTile::choose)'s.
    pub gemm_tiles: &'g GemmTiles,
}

impl Lowering<'_> {
    /// The rows of a step's kernels of a thread an element: a constant
    /// where every step has `max_tokens` of them (a training pass), so that
    /// past 65,535 workgroups they split over y (Llama-3.2-1B's 8,192-wide
    /// activations at 2,048 rows need 65,536); else the step's `T`.
    pub(crate) fn elementwise_rows(&self) -> Rows {
        if self.min_tokens == self.max_tokens && self.max_tokens > 1 {
            Rows::Fixed(self.max_tokens)
        } else {
            Rows::Tokens
        }
    }

    /// The arithmetic of compute node `id`: `2·K·N` per output row of a
    /// matmul (`N` the weight's rows, so both halves of a gated one), zero
    /// for every other op (their time is memory, not arithmetic).
    pub fn flops(&self, id: NodeId) -> FlopCount {
        let g = self.graph;
        let node = g.node(id);
        let (Op::MatMul(_) | Op::MatMulGlu(_)) = &node.op else {
            return FlopCount::default();
        };
        let ins = g.inputs(id);
        let k = u64::from(width_of(g.value_type(ins[0])));
        let n = g.value_type(ins[1]).shape[0].as_const().unwrap_or(0);
        let per_row = 2 * k * n;
        match rows_of(&node.outputs[0]) {
            Rows::Tokens => FlopCount {
                per_token: per_row,
                constant: 0,
            },
            Rows::Fixed(r) => FlopCount {
                per_token: 0,
                constant: u64::from(r) * per_row,
            },
        }
    }

    fn shard_rows(&self, v: ValueRef) -> Option<u32> {
        self.shard_rows.get(&v).copied()
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

    /// The one kernel of attention node `attn` and the `qkv_rope` node
    /// `rope` before it, in a decode step of a GPU variant
    /// ([`crate::fusion::RopeAttention`]). Its input ports are `rope`'s,
    /// its output `attn`'s.
    pub fn rope_attention(
        &self,
        rope: NodeId,
        attn: NodeId,
        variant: &VariantSpec,
    ) -> Result<Lowered, CodegenError> {
        let g = self.graph;
        let (Op::QkvRope(r), Op::Attention(a)) = (&g.node(rope).op, &g.node(attn).op) else {
            return Err(CodegenError::Unsupported {
                label: g.node(attn).label.clone(),
                reason: "fused with a node that is not a qkv_rope (a compiler bug)".into(),
            });
        };
        let ins = g.inputs(rope);
        let kv = match variant.precision {
            Precision::F16 => DType::F16,
            Precision::F32 => g.value_type(ins[2]).dtype,
        };
        let spec = attention_spec(a, kv, false);
        let norm_dtype = r.qk_norm.map(|_| g.value_type(ins[4]).dtype);
        let rope_spec = qkv_rope_spec(r, norm_dtype, kv);
        let source = attention_decode::kernel_with_rope(spec, rope_spec, self.max_context);
        Ok(Lowered {
            source,
            op: KernelOp::Other,
        })
    }

    /// Whether prefill steps of at most [`SHORT_PROMPT`] tokens run node
    /// `id` through a kernel of their own ([`Phase::ShortPrefill`]): a
    /// matmul over the step's rows (not one that reads the last row alone)
    /// in a GPU variant with subgroups, in a plan whose steps can be longer
    /// and shorter (not a training step's, all of one length).
    pub fn has_short_form(&self, id: NodeId, variant: &VariantSpec) -> bool {
        let node = self.graph.node(id);
        let last_row = match &node.op {
            Op::MatMul(m) => m.last_row,
            Op::MatMulGlu(_) => false,
            _ => return false,
        };
        !last_row
            && rows_of(&node.outputs[0]) == Rows::Tokens
            && self.max_tokens > SHORT_PROMPT
            && self.min_tokens <= SHORT_PROMPT
            && variant.features.contains(&Feature::Subgroups)
            && !variant.features.contains(&Feature::Cpu)
    }

    /// The kernels for compute node `id` in a schedule of `phase` of
    /// `variant`, in the order they run: [`Lowering::kernel`]'s one, or a
    /// training op's ([`Lowering::train_kernels`]).
    pub fn kernels(
        &self,
        id: NodeId,
        phase: Phase,
        variant: &VariantSpec,
    ) -> Result<Vec<Lowered>, CodegenError> {
        match &self.graph.node(id).op {
            Op::Train(t) => Ok(self
                .train_kernels(id, t, variant)?
                .into_iter()
                .map(|source| Lowered {
                    source,
                    op: KernelOp::Other,
                })
                .collect()),
            _ => Ok(vec![self.kernel(id, phase, variant)?]),
        }
    }

    /// The kernel for compute node `id` in a schedule of `phase` of `variant`.
    pub fn kernel(
        &self,
        id: NodeId,
        phase: Phase,
        variant: &VariantSpec,
    ) -> Result<Lowered, CodegenError> {
        let tt = match phase {
            Phase::Prefill(rows) => rows.max(1),
            Phase::ShortPrefill | Phase::Decode | Phase::Batch => 1,
        };
        let batch = phase == Phase::Batch;
        let g = self.graph;
        let node = g.node(id);
        let ins = g.inputs(id);
        let in_ty = |i: usize| g.value_type(ins[i]);
        let out_ty = &node.outputs[0];
        let encoder = crate::sources::is_encoder(g);
        // In a batch, a value of one row has a row per sequence; in an
        // encoder, a row per input the step packs (a pooled vector, and the
        // projections and norm after it).
        let rows_of = |ty: &TensorType| match rows_of(ty) {
            Rows::Fixed(1) if batch => Rows::Tokens,
            Rows::Fixed(1) if encoder => Rows::Fixed(self.max_batch.max(1)),
            rows => rows,
        };
        // A thread an element: a training pass's rows as a constant.
        let flat_rows = |ty: &TensorType| match rows_of(ty) {
            Rows::Tokens if !batch => self.elementwise_rows(),
            rows => rows,
        };
        // An encoder's (and a training step's) prefill steps pack whole
        // sequences; its one-row (decode) steps are one sequence at
        // position 0 either way.
        let packed = matches!(phase, Phase::Prefill(_)) && crate::sources::is_packed(g);
        let at = if batch {
            Positions::Table
        } else if packed {
            Positions::Packed
        } else {
            Positions::Step
        };

        // A KV cache of type `t` as this variant stores it.
        let kv = |t: &TensorType| match variant.precision {
            Precision::F16 => DType::F16,
            Precision::F32 => t.dtype,
        };
        let unsupported = |reason: &str| CodegenError::Unsupported {
            label: node.label.clone(),
            reason: reason.to_string(),
        };
        let source = match &node.op {
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
            Op::MatMul(MatMul { has_bias, norm, .. })
            | Op::MatMulGlu(MatMulGlu { has_bias, norm, .. }) => {
                let (glu, ports, last_row, act) = match &node.op {
                    Op::MatMulGlu(m) => (Some(m.act), m.ports(), false, None),
                    Op::MatMul(m) => (None, m.ports(), m.last_row && !batch, m.act),
                    _ => return Err(unsupported("not a matmul")),
                };
                let rows = rows_of(out_ty);
                let spec = MatMulSpec {
                    shard_rows: self.shard_rows(ins[1]),
                    rows,
                    k: width_of(in_ty(0)),
                    n: width_of(out_ty),
                    wdtype: in_ty(1).dtype,
                    bias: *has_bias,
                    tt: match rows {
                        Rows::Tokens => tt,
                        Rows::Fixed(r) => r.min(tt).max(1),
                    },
                    glu,
                    norm: norm
                        .zip(ports.norm)
                        .map(|(n, i)| (n.eps, n.weight_offset, in_ty(i).dtype)),
                    residual: ports.residual.is_some(),
                    last_row,
                    act,
                };
                let workgroup_bytes = variant.limits(self.target).max_workgroup_storage;
                let step_rows = match phase {
                    Phase::Batch => self.max_batch,
                    Phase::ShortPrefill => SHORT_PROMPT,
                    _ => self.max_tokens,
                };
                let batch_like = matches!(phase, Phase::Batch | Phase::ShortPrefill);
                // Batch steps take tensor cores for dense weights wide
                // enough to fill the GPU (dequantizing while staging a
                // tile costs more than gemv_batch's registers).
                let batch_coop = (batch_like
                    && rows == Rows::Tokens
                    && !spec.wdtype.is_quantized()
                    && variant.features.contains(&Feature::CooperativeMatrix))
                .then(|| {
                    CoopGemm::choose_batch(
                        spec.n,
                        spec.k,
                        glu.is_some(),
                        step_rows,
                        workgroup_bytes,
                    )
                })
                .flatten();
                let (source, template) = if variant.features.contains(&Feature::Cpu) {
                    // The most rows of `x` a step of this phase has.
                    let most_rows = match (rows, phase) {
                        (Rows::Fixed(n), _) => n,
                        (Rows::Tokens, Phase::Decode) => 1,
                        (Rows::Tokens, _) => step_rows,
                    };
                    let tt = matmul_cpu::rows_per_thread(most_rows);
                    (matmul_cpu::kernel(&spec, tt), MatMulTemplate::Cpu)
                } else if let Some(gemm) = batch_coop {
                    (gemm_coop::kernel(spec, gemm), MatMulTemplate::GemmCoop)
                } else {
                    match phase {
                        Phase::Batch | Phase::ShortPrefill
                            if rows == Rows::Tokens
                                && variant.features.contains(&Feature::Subgroups) =>
                        {
                            let br = gemv_batch::rows_per_group(step_rows);
                            (gemv_batch::kernel(&spec, br), MatMulTemplate::GemvBatch)
                        }
                        Phase::Prefill(_) | Phase::Batch
                            if rows == Rows::Tokens
                                && variant.features.contains(&Feature::CooperativeMatrix) =>
                        {
                            let gemm = CoopGemm::choose(
                                spec.n,
                                spec.k,
                                glu.is_some(),
                                step_rows,
                                workgroup_bytes,
                            );
                            (gemm_coop::kernel(spec, gemm), MatMulTemplate::GemmCoop)
                        }
                        Phase::Prefill(_) | Phase::Batch if rows == Rows::Tokens && !last_row => {
                            let shape = GemmShape {
                                k: spec.k,
                                n: spec.n,
                                glu: glu.is_some(),
                                wdtype: spec.wdtype,
                            };
                            let tile = tile_for(self.gemm_tiles, shape, step_rows, workgroup_bytes);
                            let template = MatMulTemplate::Gemm { tile: tile.tag() };
                            let max_binding = variant.limits(self.target).max_storage_binding;
                            let split = GemmSplit::choose(
                                &tile,
                                spec.n,
                                spec.k,
                                glu.is_some(),
                                step_rows,
                                max_binding,
                            );
                            (gemm::kernel_split(&spec, tile, split), template)
                        }
                        Phase::Prefill(_) | Phase::Batch | Phase::ShortPrefill => {
                            (matmul::kernel(spec), MatMulTemplate::Rows)
                        }
                        Phase::Decode => {
                            let reduce = if variant.features.contains(&Feature::Subgroups) {
                                Reduce::Subgroup
                            } else {
                                Reduce::Workgroup
                            };
                            let dots = if variant.int8_dots {
                                Dots::Int8
                            } else {
                                Dots::Float
                            };
                            (gemv::kernel(&spec, reduce, dots), MatMulTemplate::Gemv)
                        }
                    }
                };
                let op = KernelOp::MatMul {
                    k: spec.k,
                    n: spec.n,
                    glu: glu.is_some(),
                    wdtype: spec.wdtype.to_string(),
                    template,
                };
                return Ok(Lowered { source, op });
            }
            Op::RmsNormAdd(n) => rms_norm::add_after_kernel(RmsNormSpec {
                rows: rows_of(out_ty),
                width: width_of(out_ty),
                groups: 1,
                eps: n.eps,
                offset: n.weight_offset,
                wdtype: in_ty(1).dtype,
            }),
            Op::AddRmsNorm(n) | Op::AddRmsNormLastRow(n) => {
                let spec = RmsNormSpec {
                    rows: rows_of(out_ty),
                    width: width_of(out_ty),
                    groups: 1,
                    eps: n.eps,
                    offset: n.weight_offset,
                    wdtype: in_ty(2).dtype,
                };
                match node.op {
                    Op::AddRmsNorm(_) => rms_norm::add_kernel(spec),
                    // A batch keeps every row: each is a sequence's last.
                    _ if batch => rms_norm::add_kernel(spec),
                    _ => rms_norm::add_kernel_last_row(spec),
                }
            }
            Op::QkvRope(r) => qkv_rope::kernel_at(
                qkv_rope_spec(r, r.qk_norm.map(|_| in_ty(4).dtype), kv(in_ty(2))),
                at,
            ),
            Op::SliceCols { start, len } => elementwise::slice_cols(
                rows_of(out_ty),
                width_of(in_ty(0)),
                *start as u32,
                *len as u32,
            ),

            Op::Rope(r) => rope::kernel_at(
                RopeSpec {
                    heads: r.n_heads,
                    head_dim: r.head_dim,
                    rotary_dim: r.rotary_dim,
                },
                at,
            ),
            Op::CacheWrite => elementwise::cache_write_at(width_of(out_ty), kv(in_ty(0)), at),
            Op::Attention(a) if !a.causal && batch => {
                return Err(unsupported(
                    "bidirectional attention takes no batch schedule: compile without \
                     --max-batch (an encoder's graph, whose output is `embedding`, packs its \
                     inputs instead)",
                ))
            }
            Op::Attention(a) => {
                let spec = attention_spec(a, kv(in_ty(1)), packed);
                match phase {
                    _ if variant.features.contains(&Feature::Cpu) => {
                        attention_cpu::kernel_at(spec, at)
                    }
                    Phase::Prefill(_) | Phase::ShortPrefill => {
                        attention::kernel(spec, variant.limits(self.target).max_workgroup_storage)
                    }
                    Phase::Batch => attention_decode::kernel_at(
                        spec,
                        self.max_context,
                        Positions::Table,
                        self.max_batch,
                    ),
                    Phase::Decode => attention_decode::kernel(spec, self.max_context),
                }
            }
            Op::LayerNorm(n) => {
                encoder::layer_norm(rows_of(out_ty), width_of(out_ty), n.eps, in_ty(1).dtype)
            }
            Op::AddPositions if self.shard_rows(ins[1]).is_some() => {
                return Err(unsupported("a position table split into row shards"))
            }
            Op::AddPositions => encoder::add_positions(width_of(out_ty), in_ty(1).dtype),
            // An encoder step packs up to `max_batch` sequences: a row each.
            Op::Pool(p) => encoder::pool(*p, width_of(out_ty), self.max_batch.max(1)),
            Op::L2Normalize => encoder::l2_normalize(rows_of(out_ty), width_of(out_ty)),
            Op::Unary(u) => elementwise::unary(*u, flat_rows(out_ty), width_of(out_ty)),
            Op::Binary(b) => elementwise::binary(*b, flat_rows(out_ty), width_of(out_ty)),
            Op::AddBias => {
                elementwise::add_bias(flat_rows(out_ty), width_of(out_ty), in_ty(1).dtype)
            }
            // A batch keeps every row: the slice is a copy.
            Op::SliceLastRow if batch => {
                let w = width_of(out_ty);
                elementwise::slice_cols(Rows::Tokens, w, 0, w)
            }
            Op::SliceLastRow => elementwise::slice_last_row(width_of(out_ty)),
            // A batch step's rows each get their greedy token; rows that
            // sample read their logits back.
            Op::SampleToken if batch => {
                argmax_rows::kernel(width_of(in_ty(0)), variant.features.contains(&Feature::Cpu))
            }
            Op::SampleToken if width_of(in_ty(0)) > sample_token::MAX_VOCAB => {
                return Err(unsupported("sample_token takes at most 2^24 columns"))
            }
            Op::SampleToken => sample_token::kernel(
                rows_of(in_ty(0)),
                width_of(in_ty(0)),
                sample_token::Shape::for_adapter(
                    variant.features.contains(&Feature::Cpu),
                    width_of(in_ty(0)),
                ),
            ),
            Op::Input(_) | Op::Weight(_) | Op::KvCache { .. } => {
                return Err(unsupported("source nodes have no kernel"))
            }
            Op::Train(_) => {
                return Err(unsupported(
                    "a training op has a list of kernels (`Lowering::kernels`; a compiler bug)",
                ))
            }
        };
        Ok(Lowered {
            source,
            op: KernelOp::Other,
        })
    }
}
