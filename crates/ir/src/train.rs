//! The ops of a training step: the loss and the backward of each forward op
//! a decoder trains through, as [`TrainOp`] (wrapped in `Op::Train`).
//!
//! The `autodiff` pass (`gerbil_passes::autodiff`) builds them from a
//! lowered forward graph: every forward op gets the ops that carry the
//! gradient of its output back to its inputs (a vector-Jacobian product
//! each), and the interpreter runs them with the f64 gradients of
//! `gerbil_interp::gradient`. Each op's text form is its mnemonic with the
//! forward op's attributes, so `rms_norm_grad{eps=1e-6, offset=0}` is the
//! backward of `rms_norm{eps=1e-6, offset=0}`.
//!
//! The surprise: gradients are f32 whatever the weight's dtype (a bf16
//! weight's gradient is an f32 tensor of its shape), and the cache ops'
//! gradients keep the cache's `[Lmax, W]` shape: `attention_grad` writes
//! a gradient for every cache row, and `cache_rows` takes this step's rows
//! of it back to the `[T, W]` value the forward wrote.

use crate::op::{Attention, Embedding, InferError, Op, RmsNorm, Rope, UnaryOp};
use crate::types::{DType, Dim, Sym, TensorType};
use serde::{Deserialize, Serialize};

/// An op of the training graph; see the module docs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum TrainOp {
    /// `(logits f32[R, V], targets u32[R]) -> f32[1]`: the mean over rows of
    /// `logsumexp(row) − row[target]`.
    CrossEntropy,
    /// `(logits, targets) -> f32[R, V]`: the gradient of the mean
    /// cross-entropy, `(softmax(row) − onehot(target)) / R`.
    CrossEntropyGrad,
    /// `(dy f32[R, N], w [N, K]) -> f32[R, K]`: `dy · w`, the gradient of a
    /// matmul's input.
    MatMulGradX,
    /// `(dy f32[R, N], x f32[R, K]) -> f32[N, K]`: `dyᵀ · x`, the gradient
    /// of a matmul's weight.
    MatMulGradW,
    /// `f32[R, N] -> f32[N]`: the column sums (a bias's gradient).
    SumRows,
    /// `(x, w, dy) -> (dx, dw)`: the backward of `rms_norm`.
    RmsNormGrad(RmsNorm),
    /// `(dy, table) -> dx`: the backward of `rope` (each pair turned back).
    RopeGrad(Rope),
    /// `f32[Lmax, W] -> f32[T, W]`: rows `P..P+T` of a cache's gradient, the
    /// gradient of the value `cache_write` wrote there.
    CacheRows,
    /// `(q, k_cache) -> f32[R, n_heads]`: the log-sum-exp of each row's and
    /// head's scaled scores over the keys it sees, what attention's backward
    /// needs to rebuild the probabilities without a pass over the keys of
    /// its own.
    AttentionLse(Attention),
    /// `(q, k_cache, v_cache, dy, out, lse) -> (dq, dk_cache, dv_cache)`:
    /// the backward of `attention` given its output `out` and
    /// [`TrainOp::AttentionLse`], the cache gradients `[Lmax, W]` (zero in
    /// rows no query sees).
    AttentionGrad(Attention),
    /// `(x, dy) -> dx`: the backward of an elementwise unary op.
    UnaryGrad(UnaryOp),
    /// `(ids u32[T], dy f32[T, W]) -> f32[rows, W]`: the backward of
    /// `embedding` with respect to its `rows`-row table (every token's row
    /// of `dy`, times the scale, added into its id's row).
    EmbeddingGrad {
        /// The forward lookup.
        embedding: Embedding,
        /// Rows of the table.
        rows: u64,
    },
}

fn arity(ins: &[&TensorType], n: usize) -> Result<(), InferError> {
    if ins.len() == n {
        Ok(())
    } else {
        Err(format!("expects {n} inputs, got {}", ins.len()))
    }
}

/// `[rows, width]` of an f32 (or, with `float`, any float) matrix.
fn matrix(ty: &TensorType, what: &str, float: bool) -> Result<(Dim, u64), InferError> {
    let ok = if float {
        ty.dtype.is_float()
    } else {
        ty.dtype == DType::F32
    };
    match ty.shape.as_slice() {
        [rows, Dim::Const(w)] if ok => Ok((*rows, *w)),
        _ => Err(format!(
            "{what} must be an {} [rows, width] with constant width, got {ty}",
            if float { "float" } else { "f32" }
        )),
    }
}

fn same_rows(a: Dim, b: Dim, what: &str) -> Result<(), InferError> {
    if a == b {
        Ok(())
    } else {
        Err(format!("{what}: rows {a} and {b} differ"))
    }
}

fn ids(ty: &TensorType, rows: Dim, what: &str) -> Result<(), InferError> {
    if ty.dtype == DType::U32 && ty.shape == [rows] {
        Ok(())
    } else {
        Err(format!("{what} must be u32[{rows}], got {ty}"))
    }
}

/// The forward op's output types, with its inputs as given (an error names
/// the forward op).
fn forward(op: Op, ins: &[&TensorType]) -> Result<Vec<TensorType>, InferError> {
    let name = op.mnemonic();
    op.infer(ins).map_err(|e| format!("forward {name}: {e}"))
}

/// `dy` must have the type of the forward op's output.
fn expect_dy(dy: &TensorType, out: &TensorType) -> Result<(), InferError> {
    if dy.dtype == DType::F32 && dy.shape == out.shape {
        Ok(())
    } else {
        Err(format!(
            "the output gradient must be f32 of the output's shape {out}, got {dy}"
        ))
    }
}

/// `ty` as f32 (a gradient of a value of any float type).
fn as_f32(ty: &TensorType) -> TensorType {
    TensorType::new(DType::F32, ty.shape.iter().copied())
}

impl TrainOp {
    /// Number of output values.
    pub fn num_outputs(&self) -> usize {
        match self {
            TrainOp::RmsNormGrad(_) => 2,
            TrainOp::AttentionGrad(_) => 3,
            _ => 1,
        }
    }

    /// The forward op this op is the backward of, if it mirrors one (its
    /// attributes are that op's).
    pub fn forward(&self) -> Option<Op> {
        Some(match self {
            TrainOp::RmsNormGrad(n) => Op::RmsNorm(n.clone()),
            TrainOp::RopeGrad(r) => Op::Rope(r.clone()),
            TrainOp::AttentionGrad(a) | TrainOp::AttentionLse(a) => Op::Attention(a.clone()),
            TrainOp::UnaryGrad(u) => Op::Unary(*u),
            TrainOp::EmbeddingGrad { embedding, .. } => Op::Embedding(embedding.clone()),
            _ => return None,
        })
    }

    /// Output types for the given input types, or why they are invalid.
    pub fn infer(&self, ins: &[&TensorType]) -> Result<Vec<TensorType>, InferError> {
        let out = match self {
            TrainOp::CrossEntropy | TrainOp::CrossEntropyGrad => {
                arity(ins, 2)?;
                let (rows, _) = matrix(ins[0], "logits", false)?;
                ids(ins[1], rows, "targets")?;
                match self {
                    TrainOp::CrossEntropy => TensorType::fixed(DType::F32, &[1]),
                    _ => ins[0].clone(),
                }
            }
            TrainOp::MatMulGradX => {
                arity(ins, 2)?;
                let (rows, n) = matrix(ins[0], "output gradient", false)?;
                let (wn, k) = matrix(ins[1], "matmul weight", true)?;
                if wn != Dim::Const(n) {
                    return Err(format!("weight {} does not have {n} rows", ins[1]));
                }
                TensorType::new(DType::F32, [rows, Dim::Const(k)])
            }
            TrainOp::MatMulGradW => {
                arity(ins, 2)?;
                let (rows, n) = matrix(ins[0], "output gradient", false)?;
                let (xrows, k) = matrix(ins[1], "matmul input", false)?;
                same_rows(rows, xrows, "output gradient and input")?;
                TensorType::fixed(DType::F32, &[n, k])
            }
            TrainOp::SumRows => {
                arity(ins, 1)?;
                let (_, n) = matrix(ins[0], "input", false)?;
                TensorType::fixed(DType::F32, &[n])
            }
            TrainOp::RmsNormGrad(n) => {
                arity(ins, 3)?;
                let out = forward(Op::RmsNorm(n.clone()), &ins[..2])?.remove(0);
                expect_dy(ins[2], &out)?;
                return Ok(vec![out, as_f32(ins[1])]);
            }
            TrainOp::RopeGrad(r) => {
                arity(ins, 2)?;
                forward(Op::Rope(r.clone()), ins)?.remove(0)
            }
            TrainOp::CacheRows => {
                arity(ins, 1)?;
                let (rows, w) = matrix(ins[0], "cache gradient", false)?;
                same_rows(rows, Dim::Sym(Sym::Lmax), "cache gradient")?;
                TensorType::new(DType::F32, [Dim::Sym(Sym::T), Dim::Const(w)])
            }
            TrainOp::AttentionLse(a) => {
                arity(ins, 2)?;
                // The keys stand in for the values, which it does not read.
                let out = forward(Op::Attention(a.clone()), &[ins[0], ins[1], ins[1]])?.remove(0);
                TensorType::new(DType::F32, [out.shape[0], Dim::Const(u64::from(a.n_heads))])
            }
            TrainOp::AttentionGrad(a) => {
                arity(ins, 6)?;
                let out = forward(Op::Attention(a.clone()), &ins[..3])?.remove(0);
                expect_dy(ins[3], &out)?;
                if ins[4] != &out {
                    return Err(format!(
                        "the attention output must be {out}, got {}",
                        ins[4]
                    ));
                }
                let lse = TrainOp::AttentionLse(a.clone()).infer(&ins[..2])?.remove(0);
                if ins[5] != &lse {
                    return Err(format!("the log-sum-exp must be {lse}, got {}", ins[5]));
                }
                return Ok(vec![out, as_f32(ins[1]), as_f32(ins[2])]);
            }
            TrainOp::UnaryGrad(u) => {
                arity(ins, 2)?;
                let out = forward(Op::Unary(*u), &ins[..1])?.remove(0);
                expect_dy(ins[1], &out)?;
                out
            }
            TrainOp::EmbeddingGrad { rows, .. } => {
                arity(ins, 2)?;
                let (t, w) = matrix(ins[1], "output gradient", false)?;
                ids(ins[0], t, "token ids")?;
                TensorType::fixed(DType::F32, &[*rows, w])
            }
        };
        Ok(vec![out])
    }

    /// Short mnemonic used by the printer and the parser.
    pub fn mnemonic(&self) -> &'static str {
        match self {
            TrainOp::CrossEntropy => "cross_entropy",
            TrainOp::CrossEntropyGrad => "cross_entropy_grad",
            TrainOp::MatMulGradX => "matmul_grad_x",
            TrainOp::MatMulGradW => "matmul_grad_w",
            TrainOp::SumRows => "sum_rows",
            TrainOp::RmsNormGrad(_) => "rms_norm_grad",
            TrainOp::RopeGrad(_) => "rope_grad",
            TrainOp::CacheRows => "cache_rows",
            TrainOp::AttentionLse(_) => "attention_lse",
            TrainOp::AttentionGrad(_) => "attention_grad",
            TrainOp::UnaryGrad(UnaryOp::Silu) => "silu_grad",
            TrainOp::UnaryGrad(UnaryOp::GeluTanh) => "gelu_tanh_grad",
            TrainOp::UnaryGrad(UnaryOp::Gelu) => "gelu_grad",
            TrainOp::UnaryGrad(UnaryOp::Softcap(_)) => "softcap_grad",
            TrainOp::UnaryGrad(UnaryOp::Scale(_)) => "scale_grad",
            TrainOp::EmbeddingGrad { .. } => "embedding_grad",
        }
    }

    /// The op of `suffix` (`grad`: the backward, `X_grad` for `X`; `lse`:
    /// attention's log-sum-exp) of forward op `op`, if it has one; `rows`
    /// is an embedding table's row count.
    pub fn of_forward(suffix: &str, op: Op, rows: Option<u64>) -> Option<TrainOp> {
        if suffix == "lse" {
            return match op {
                Op::Attention(a) => Some(TrainOp::AttentionLse(a)),
                _ => None,
            };
        }
        if suffix != "grad" {
            return None;
        }
        Some(match op {
            Op::RmsNorm(n) => TrainOp::RmsNormGrad(n),
            Op::Rope(r) => TrainOp::RopeGrad(r),
            Op::Attention(a) => TrainOp::AttentionGrad(a),
            Op::Unary(u) => TrainOp::UnaryGrad(u),
            Op::Embedding(embedding) => TrainOp::EmbeddingGrad {
                embedding,
                rows: rows?,
            },
            _ => return None,
        })
    }

    /// The ops without attributes, by mnemonic.
    pub fn plain(mnemonic: &str) -> Option<TrainOp> {
        Some(match mnemonic {
            "cross_entropy" => TrainOp::CrossEntropy,
            "cross_entropy_grad" => TrainOp::CrossEntropyGrad,
            "matmul_grad_x" => TrainOp::MatMulGradX,
            "matmul_grad_w" => TrainOp::MatMulGradW,
            "sum_rows" => TrainOp::SumRows,
            "cache_rows" => TrainOp::CacheRows,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gradients_are_f32_of_their_values_shapes() {
        let norm = TrainOp::RmsNormGrad(RmsNorm {
            eps: 1e-6,
            weight_offset: 0.0,
            groups: 1,
        });
        let x = TensorType::rows(8);
        let w = TensorType::fixed(DType::BF16, &[8]);
        let out = norm.infer(&[&x, &w, &x]).unwrap();
        assert_eq!(out, vec![x.clone(), TensorType::fixed(DType::F32, &[8])]);
        let err = norm.infer(&[&x, &w, &TensorType::rows(4)]).unwrap_err();
        assert!(err.contains("output gradient"), "{err}");

        let dw = TrainOp::MatMulGradW
            .infer(&[&TensorType::rows(3), &x])
            .unwrap();
        assert_eq!(dw, vec![TensorType::fixed(DType::F32, &[3, 8])]);
        let wt = TensorType::fixed(DType::BF16, &[3, 8]);
        let dx = TrainOp::MatMulGradX
            .infer(&[&TensorType::rows(3), &wt])
            .unwrap();
        assert_eq!(dx, vec![x.clone()]);
        let err = TrainOp::MatMulGradX.infer(&[&x, &wt]).unwrap_err();
        assert!(err.contains("does not have 8 rows"), "{err}");
    }

    #[test]
    fn the_loss_takes_a_target_per_row() {
        let logits = TensorType::rows(10);
        let targets = TensorType::new(DType::U32, [Dim::Sym(Sym::T)]);
        let loss = TrainOp::CrossEntropy.infer(&[&logits, &targets]).unwrap();
        assert_eq!(loss, vec![TensorType::fixed(DType::F32, &[1])]);
        let one = TensorType::fixed(DType::U32, &[1]);
        let err = TrainOp::CrossEntropy.infer(&[&logits, &one]).unwrap_err();
        assert!(err.contains("targets must be u32[T]"), "{err}");
    }
}
