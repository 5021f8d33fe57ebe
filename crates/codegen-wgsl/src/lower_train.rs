//! Training op → kernel lowering: the [`TrainOp`] arm of
//! [`Lowering::kernel`](crate::lower::Lowering), one template of
//! [`crate::kernels::backward`] (or RoPE's backward) per op.
//!
//! A training step is a packed prefill step: `T` = a micro-batch's
//! sequences end to end at `P` = 0, each sequence's keys and values in
//! cache rows of its own (cache row = row), so RoPE's backward reads each
//! row's position from the segment table and attention's backward takes
//! the sequences as one more dimension of its products. In a variant with cooperative
//! matrices (mixed precision) the matmul gradients run on tensor cores
//! ([`grad_coop`]), as its forward matmuls do. The surprise: a weight
//! split into row shards is refused, not lowered — training binds every
//! weight whole (as a range of the parameter buffer, `crate::training`),
//! which the shards' sizes would contradict.

use crate::kernels::{backward, grad_coop, rope, KernelSource, Positions};
use crate::lower::Lowering;
use crate::variant::VariantSpec;
use crate::CodegenError;
use gerbil_ir::{NodeId, TrainOp};
use gerbil_plan::Feature;

impl Lowering<'_> {
    /// The kernels of training node `id`, whose op is `op`, in the order
    /// they run: one for every op but the norm's backward (three,
    /// [`backward::rms_norm_grad`]), attention's log-sum-exp (two,
    /// [`backward::attention_lse`]) and attention's backward (eight,
    /// [`backward::attention_grad`]), and the matmul gradients on tensor
    /// cores where `variant` has them (the scales and the product, and the
    /// pieces' sum where the depth is cut: [`grad_coop`]).
    pub(crate) fn train_kernels(
        &self,
        id: NodeId,
        op: &TrainOp,
        variant: &VariantSpec,
    ) -> Result<Vec<KernelSource>, CodegenError> {
        let coop = variant.features.contains(&Feature::CooperativeMatrix);
        let g = self.graph;
        let node = g.node(id);
        let ins = g.inputs(id);
        let ty = |i: usize| g.value_type(ins[i]);
        let width = |i: usize| ty(i).last_const().unwrap_or(0) as u32;
        if let Some(sharded) = ins.iter().find(|v| self.shard_rows.contains_key(v)) {
            return Err(CodegenError::Unsupported {
                label: node.label.clone(),
                reason: format!(
                    "its operand `{}` is too large for one binding of this device, and \
                     training binds every weight whole; train on a GPU with larger storage \
                     bindings",
                    g.node(sharded.node).label
                ),
            });
        }
        // The step packs `sequences` sequences of `seq_len` rows end to end.
        let seq_len = self.max_tokens / self.sequences.max(1);
        let one = match op {
            TrainOp::CrossEntropy => backward::cross_entropy(width(0), self.max_tokens),
            TrainOp::CrossEntropyGrad => backward::cross_entropy_grad(width(0)),
            TrainOp::MatMulGradX if coop => {
                return Ok(grad_coop::matmul_grad_x(
                    width(0),
                    width(1),
                    ty(1).dtype,
                    self.max_tokens,
                ))
            }
            TrainOp::MatMulGradW if coop => {
                return Ok(grad_coop::matmul_grad_w(
                    width(0),
                    width(1),
                    self.max_tokens,
                ))
            }
            TrainOp::MatMulGradX => {
                return Ok(backward::matmul_grad_x(
                    width(0),
                    width(1),
                    ty(1).dtype,
                    self.max_tokens,
                ))
            }
            TrainOp::MatMulGradW => {
                return Ok(backward::matmul_grad_w(width(0), width(1), self.max_tokens))
            }
            TrainOp::SumRows => backward::sum_rows(width(0)),
            TrainOp::RmsNormGrad(n) => {
                return Ok(backward::rms_norm_grad(
                    width(0),
                    n,
                    ty(1).dtype,
                    self.max_tokens,
                ))
            }
            TrainOp::RopeGrad(r) => rope::backward(
                rope::RopeSpec {
                    heads: r.n_heads,
                    head_dim: r.head_dim,
                    rotary_dim: r.rotary_dim,
                },
                Positions::Packed,
            ),
            TrainOp::CacheRows => backward::cache_rows(width(0)),
            TrainOp::AttentionLse(a) => {
                return Ok(backward::attention_lse(a, seq_len, seq_len, self.sequences))
            }
            TrainOp::AttentionGrad(a) => {
                return Ok(backward::attention_grad(
                    a,
                    seq_len,
                    seq_len,
                    self.sequences,
                ))
            }
            TrainOp::UnaryGrad(u) => backward::unary_grad(*u, self.elementwise_rows(), width(0)),
            TrainOp::EmbeddingGrad { embedding, rows } => {
                backward::embedding_grad(*rows as u32, width(1), embedding)
            }
        };
        Ok(vec![one])
    }
}
