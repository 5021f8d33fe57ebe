//! The operations of the IR and their type rules.
//!
//! Every op is a variant of [`Op`] with a struct of typed attributes (no string
//! attribute bags). [`Op::infer`] states the op's contract: the input types it
//! accepts and the output types it produces. The verifier and
//! [`crate::Graph::add`] both go through it.

use crate::types::{DType, Dim, Sym, TensorType};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Where a weight's bytes come from when the plan is written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum WeightSource {
    /// A tensor of the checkpoint, by name, stored as-is.
    Checkpoint {
        /// Tensor name in the safetensors files.
        tensor: String,
    },
    /// Checkpoint tensors concatenated along axis 0 (all of the same dtype and
    /// trailing shape), e.g. fused QKV projection weights.
    Concat {
        /// Tensor names, in order.
        tensors: Vec<String>,
    },
    /// The rotary-embedding table `[Lmax, rotary_dim]`: row `p` holds
    /// `cos(p·f_i)·s` for `i < rotary_dim/2`, then `sin(p·f_i)·s`.
    RopeTable {
        /// Inverse frequencies `f_i`, `rotary_dim/2` of them, as f32.
        inv_freq: Vec<f32>,
        /// Attention scaling `s` applied to cos and sin (1 for plain RoPE).
        attention_scaling: f32,
    },
}

/// A constant tensor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Weight {
    /// Its source.
    pub source: WeightSource,
    /// Its type (all dims constant except an `Lmax` row count for tables).
    pub ty: TensorType,
}

/// A runtime input of the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Input {
    /// Token ids of this step, `u32[T]`.
    TokenIds,
}

/// Which half of a layer's KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvKind {
    /// Keys.
    K,
    /// Values.
    V,
}

/// Embedding lookup: `out[t] = table[ids[t]] * scale`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Embedding {
    /// Multiplier applied to every looked-up row (Gemma: √hidden), if any.
    pub scale: Option<f32>,
}

/// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) * (w + weight_offset)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RmsNorm {
    /// Epsilon inside the square root.
    pub eps: f32,
    /// Added to the weight before multiplying (1 for Gemma's `(1 + w)`, else 0).
    pub weight_offset: f32,
}

/// `out[r, n] = Σ_k x[r, k] · w[n, k] (+ bias[n])`: a linear layer with the
/// weight in PyTorch's `[out, in]` layout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MatMul {
    /// Whether a bias `[N]` is bound to input port 2.
    pub has_bias: bool,
}

/// Rotary position embedding (rotate-half form) on `[T, n_heads·head_dim]`,
/// positions `P..P+T` where `P` is the number of cached tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rope {
    /// Heads in the input.
    pub n_heads: u32,
    /// Width of one head.
    pub head_dim: u32,
    /// Leading dimensions of each head that rotate (`head_dim` unless partial).
    pub rotary_dim: u32,
}

/// Causal multi-head attention of the step's queries against the KV cache
/// (which already holds this step's keys and values).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attention {
    /// Query heads.
    pub n_heads: u32,
    /// Key/value heads (grouped-query attention when fewer than `n_heads`).
    pub n_kv_heads: u32,
    /// Width of one head.
    pub head_dim: u32,
    /// Multiplier of `q·k` before the softmax.
    pub scale: f32,
    /// Sliding window `W`: query `i` sees keys `j` with `i - W < j <= i`.
    pub window: Option<u32>,
}

/// Elementwise unary functions.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum UnaryOp {
    /// `x · sigmoid(x)`.
    Silu,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
    /// `tanh(x / cap) · cap`.
    Softcap(f32),
}

/// Elementwise binary functions on equal shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a · b`.
    Mul,
}

/// An IR operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// A runtime input.
    Input(Input),
    /// A constant tensor.
    Weight(Weight),
    /// A layer's persistent K or V cache, `f32[Lmax, width]`.
    KvCache {
        /// Layer index.
        layer: u32,
        /// K or V.
        kind: KvKind,
        /// Row width (`n_kv_heads · head_dim`).
        width: u64,
    },
    /// Embedding lookup `(table, ids)`.
    Embedding(Embedding),
    /// RMSNorm `(x, w)`.
    RmsNorm(RmsNorm),
    /// Linear layer `(x, w[, bias])`.
    MatMul(MatMul),
    /// Rotary embedding `(x, table)`.
    Rope(Rope),
    /// Writes `x` into `cache` rows `P..P+T`, in place: `(cache, x) -> cache`.
    CacheWrite,
    /// Attention `(q, k_cache, v_cache)`.
    Attention(Attention),
    /// Elementwise unary `(x)`.
    Unary(UnaryOp),
    /// Elementwise binary `(a, b)`.
    Binary(BinaryOp),
    /// The last row of `[T, W]`, as `[1, W]`.
    SliceLastRow,
}

/// Why an op rejected its inputs.
pub type InferError = String;

fn expect_arity(ins: &[&TensorType], n: usize) -> Result<(), InferError> {
    if ins.len() == n {
        Ok(())
    } else {
        Err(format!("expects {n} inputs, got {}", ins.len()))
    }
}

fn expect_matrix(ty: &TensorType, what: &str) -> Result<(Dim, u64), InferError> {
    match ty.shape.as_slice() {
        [rows, Dim::Const(w)] => Ok((*rows, *w)),
        _ => Err(format!(
            "{what} must be [rows, width] with constant width, got {ty}"
        )),
    }
}

fn expect_f32(ty: &TensorType, what: &str) -> Result<(), InferError> {
    if ty.dtype == DType::F32 {
        Ok(())
    } else {
        Err(format!("{what} must be f32, got {ty}"))
    }
}

fn expect_float(ty: &TensorType, what: &str) -> Result<(), InferError> {
    if ty.dtype.is_float() {
        Ok(())
    } else {
        Err(format!("{what} must be a float tensor, got {ty}"))
    }
}

fn expect_vector(ty: &TensorType, len: u64, what: &str) -> Result<(), InferError> {
    expect_float(ty, what)?;
    if ty.shape == [Dim::Const(len)] {
        Ok(())
    } else {
        Err(format!("{what} must be [{len}], got {ty}"))
    }
}

impl Op {
    /// Number of output values.
    pub fn num_outputs(&self) -> usize {
        1
    }

    /// Whether the op reads no inputs (weights, inputs, caches).
    pub fn is_source(&self) -> bool {
        matches!(self, Op::Input(_) | Op::Weight(_) | Op::KvCache { .. })
    }

    /// Output types for the given input types, or why the inputs are invalid.
    pub fn infer(&self, ins: &[&TensorType]) -> Result<Vec<TensorType>, InferError> {
        let out = match self {
            Op::Input(Input::TokenIds) => {
                expect_arity(ins, 0)?;
                TensorType::new(DType::U32, [Dim::Sym(Sym::T)])
            }
            Op::Weight(w) => {
                expect_arity(ins, 0)?;
                w.ty.clone()
            }
            Op::KvCache { width, .. } => {
                expect_arity(ins, 0)?;
                TensorType::new(DType::F32, [Dim::Sym(Sym::Lmax), Dim::Const(*width)])
            }
            Op::Embedding(_) => {
                expect_arity(ins, 2)?;
                let (_, hidden) = expect_matrix(ins[0], "embedding table")?;
                expect_float(ins[0], "embedding table")?;
                if ins[1].dtype != DType::U32 || ins[1].shape.len() != 1 {
                    return Err(format!("token ids must be u32[T], got {}", ins[1]));
                }
                TensorType::new(DType::F32, [ins[1].shape[0], Dim::Const(hidden)])
            }
            Op::RmsNorm(_) => {
                expect_arity(ins, 2)?;
                expect_f32(ins[0], "normalized input")?;
                let (_, w) = expect_matrix(ins[0], "normalized input")?;
                expect_vector(ins[1], w, "norm weight")?;
                ins[0].clone()
            }
            Op::MatMul(m) => {
                expect_arity(ins, if m.has_bias { 3 } else { 2 })?;
                expect_f32(ins[0], "matmul input")?;
                let (rows, k) = expect_matrix(ins[0], "matmul input")?;
                let (n, wk) = expect_matrix(ins[1], "matmul weight")?;
                expect_float(ins[1], "matmul weight")?;
                let n = n.as_const().ok_or_else(|| {
                    format!("matmul weight rows must be constant, got {}", ins[1])
                })?;
                if wk != k {
                    return Err(format!(
                        "matmul weight {} has in-features {wk}, input has {k}",
                        ins[1]
                    ));
                }
                if m.has_bias {
                    expect_vector(ins[2], n, "matmul bias")?;
                }
                TensorType::new(DType::F32, [rows, Dim::Const(n)])
            }
            Op::Rope(r) => {
                expect_arity(ins, 2)?;
                expect_f32(ins[0], "rope input")?;
                let (_, w) = expect_matrix(ins[0], "rope input")?;
                if w != u64::from(r.n_heads) * u64::from(r.head_dim) {
                    return Err(format!(
                        "rope input width {w} is not {} heads × {}",
                        r.n_heads, r.head_dim
                    ));
                }
                if r.rotary_dim % 2 != 0 || r.rotary_dim > r.head_dim {
                    return Err(format!(
                        "rotary_dim {} must be even and at most head_dim {}",
                        r.rotary_dim, r.head_dim
                    ));
                }
                let (_, tw) = expect_matrix(ins[1], "rope table")?;
                if tw != u64::from(r.rotary_dim) || ins[1].shape[0] != Dim::Sym(Sym::Lmax) {
                    return Err(format!(
                        "rope table must be f32[Lmax,{}], got {}",
                        r.rotary_dim, ins[1]
                    ));
                }
                ins[0].clone()
            }
            Op::CacheWrite => {
                expect_arity(ins, 2)?;
                let (rows, w) = expect_matrix(ins[0], "cache")?;
                if rows != Dim::Sym(Sym::Lmax) {
                    return Err(format!("cache must have Lmax rows, got {}", ins[0]));
                }
                let (_, xw) = expect_matrix(ins[1], "cache write input")?;
                expect_f32(ins[1], "cache write input")?;
                if xw != w {
                    return Err(format!("cache width {w} differs from input width {xw}"));
                }
                ins[0].clone()
            }
            Op::Attention(a) => {
                expect_arity(ins, 3)?;
                expect_f32(ins[0], "queries")?;
                let (_, qw) = expect_matrix(ins[0], "queries")?;
                let hd = u64::from(a.head_dim);
                if qw != u64::from(a.n_heads) * hd {
                    return Err(format!(
                        "queries width {qw} is not {} heads × {hd}",
                        a.n_heads
                    ));
                }
                if a.n_kv_heads == 0 || a.n_heads % a.n_kv_heads != 0 {
                    return Err(format!(
                        "{} query heads cannot be grouped over {} kv heads",
                        a.n_heads, a.n_kv_heads
                    ));
                }
                for (ty, what) in [(ins[1], "key cache"), (ins[2], "value cache")] {
                    let (rows, w) = expect_matrix(ty, what)?;
                    if rows != Dim::Sym(Sym::Lmax) || w != u64::from(a.n_kv_heads) * hd {
                        return Err(format!(
                            "{what} must be f32[Lmax,{}], got {ty}",
                            u64::from(a.n_kv_heads) * hd
                        ));
                    }
                }
                ins[0].clone()
            }
            Op::Unary(_) => {
                expect_arity(ins, 1)?;
                expect_f32(ins[0], "input")?;
                ins[0].clone()
            }
            Op::Binary(_) => {
                expect_arity(ins, 2)?;
                expect_f32(ins[0], "lhs")?;
                if ins[0] != ins[1] {
                    return Err(format!("operands differ: {} vs {}", ins[0], ins[1]));
                }
                ins[0].clone()
            }
            Op::SliceLastRow => {
                expect_arity(ins, 1)?;
                let (_, w) = expect_matrix(ins[0], "input")?;
                TensorType::new(ins[0].dtype, [Dim::Const(1), Dim::Const(w)])
            }
        };
        Ok(vec![out])
    }

    /// Short mnemonic used by the printer and in kernel names.
    pub fn mnemonic(&self) -> &'static str {
        match self {
            Op::Input(Input::TokenIds) => "input.token_ids",
            Op::Weight(_) => "weight",
            Op::KvCache { .. } => "kv_cache",
            Op::Embedding(_) => "embedding",
            Op::RmsNorm(_) => "rms_norm",
            Op::MatMul(_) => "matmul",
            Op::Rope(_) => "rope",
            Op::CacheWrite => "cache_write",
            Op::Attention(_) => "attention",
            Op::Unary(UnaryOp::Silu) => "silu",
            Op::Unary(UnaryOp::GeluTanh) => "gelu_tanh",
            Op::Unary(UnaryOp::Softcap(_)) => "softcap",
            Op::Binary(BinaryOp::Add) => "add",
            Op::Binary(BinaryOp::Mul) => "mul",
            Op::SliceLastRow => "slice_last_row",
        }
    }
}

impl fmt::Display for WeightSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightSource::Checkpoint { tensor } => write!(f, "{tensor:?}"),
            WeightSource::Concat { tensors } => write!(f, "concat{tensors:?}"),
            WeightSource::RopeTable {
                inv_freq,
                attention_scaling,
            } => write!(
                f,
                "rope_table(pairs={}, f0={:e}, scaling={})",
                inv_freq.len(),
                inv_freq.first().copied().unwrap_or(0.0),
                attention_scaling
            ),
        }
    }
}

impl fmt::Display for Op {
    /// The mnemonic followed by the attributes, e.g. `rms_norm{eps=1e-6}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mnemonic())?;
        match self {
            Op::Weight(w) => write!(f, " {}", w.source),
            Op::KvCache { layer, kind, .. } => write!(f, "{{layer={layer}, kind={kind:?}}}"),
            Op::Embedding(e) => match e.scale {
                Some(s) => write!(f, "{{scale={s}}}"),
                None => Ok(()),
            },
            Op::RmsNorm(n) => write!(f, "{{eps={:e}, offset={}}}", n.eps, n.weight_offset),
            Op::MatMul(m) if m.has_bias => f.write_str("{bias}"),
            Op::Rope(r) => write!(
                f,
                "{{heads={}, head_dim={}, rotary_dim={}}}",
                r.n_heads, r.head_dim, r.rotary_dim
            ),
            Op::Attention(a) => {
                write!(
                    f,
                    "{{heads={}, kv_heads={}, head_dim={}, scale={}",
                    a.n_heads, a.n_kv_heads, a.head_dim, a.scale
                )?;
                if let Some(w) = a.window {
                    write!(f, ", window={w}")?;
                }
                f.write_str("}")
            }
            Op::Unary(UnaryOp::Softcap(c)) => write!(f, "{{cap={c}}}"),
            _ => Ok(()),
        }
    }
}
