//! The operations of the IR and their type rules.
//!
//! Every op is a variant of [`Op`] with a struct of typed attributes (no string
//! attribute bags). [`Op::infer`] states the op's contract: the input types it
//! accepts and the output types it produces. The verifier and
//! [`crate::Graph::add`] both go through it.

use crate::train::TrainOp;
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
    /// Rows `start..start + count` (along axis 0) of one checkpoint tensor,
    /// e.g. the query rows of Phi-3's fused `qkv_proj`. The weight's type is
    /// the tensor's type with `count` leading rows.
    Rows {
        /// Tensor name in the safetensors files.
        tensor: String,
        /// First row.
        start: u64,
        /// Number of rows (at least 1).
        count: u64,
    },
    /// A LoRA factor that trains (`lora_A` or `lora_B` of a projection), by
    /// its PEFT name (`base_model.model.….lora_A.weight`), read from the
    /// checkpoint's adapter. The `lora` pass adds them; `autodiff` then
    /// trains these and freezes every other weight.
    Adapter {
        /// The factor's name in `adapter_model.safetensors`.
        tensor: String,
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
    /// The token each row should predict, `u32[T]` (a training step's
    /// next-token targets: `cross_entropy` reads them).
    TargetIds,
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
    /// The row whose lookups give the table no gradient (PyTorch's
    /// `padding_idx`, a config's `pad_token_id`), if any. The forward
    /// reads it like any row; only `embedding_grad` skips it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padding: Option<u32>,
}

/// RMSNorm: `x / sqrt(mean(x²) + eps) * (w + weight_offset)`, where the
/// mean runs over each of `groups` equal, contiguous slices of a row.
///
/// With `groups = 1` this is the usual norm over the whole row. Per-head
/// q/k norms (Qwen 3, Gemma 3) use `groups = n_heads`: a row of width
/// `n_heads·head_dim` is normalized head by head, all heads sharing one
/// weight of `[head_dim]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RmsNorm {
    /// Epsilon inside the square root.
    pub eps: f32,
    /// Added to the weight before multiplying (1 for Gemma's `(1 + w)`, else 0).
    pub weight_offset: f32,
    /// Independent groups per row (at least 1); the weight is `[W / groups]`.
    #[serde(default = "one")]
    pub groups: u32,
}

fn one() -> u32 {
    1
}

/// An RMSNorm over each whole row of a matmul's input, applied as the matmul
/// reads it (`fuse-norm-matmul`): `normed(x)[r, k] = x[r, k] ·
/// rsqrt(mean_k(x[r, :]²) + eps) · (g[k] + weight_offset)`, the meaning of
/// [`RmsNorm`] with one group.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct NormPrologue {
    /// Epsilon inside the square root.
    pub eps: f32,
    /// Added to the norm weight (1 for Gemma's `(1 + w)`, else 0).
    pub weight_offset: f32,
}

impl NormPrologue {
    /// The unfused norm this prologue stands for.
    pub fn rms_norm(self) -> RmsNorm {
        RmsNorm {
            eps: self.eps,
            weight_offset: self.weight_offset,
            groups: 1,
        }
    }
}

/// `y[r, n] = Σ_k normed(x)[r, k] · w[n, k] (+ bias[n]) (+ res[r, n])`: a
/// linear layer with the weight in PyTorch's `[out, in]` layout, with an
/// optional RMSNorm prologue on its input ([`NormPrologue`]; without one,
/// `normed(x) = x`) and an optional residual add in its epilogue. With
/// [`MatMul::last_row`], `x` stands for its last row only (`slice_last_row(x)`).
///
/// Inputs, in order: `x, w, [bias], [norm weight], [residual]`, each
/// bracketed one present only when its attribute says so ([`MatMul::ports`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MatMul {
    /// Whether a bias `[N]` follows the weight.
    pub has_bias: bool,
    /// RMSNorm of each input row before the product; its weight `[K]`
    /// follows the bias.
    #[serde(default)]
    pub norm: Option<NormPrologue>,
    /// Whether the matmul reads only the last row of `x` (`[rows, K]`, row
    /// `rows − 1`), so its output is `[1, N]` (`fuse-last-row-matmul`: the LM
    /// head of a prefill reads the last position straight from the stream).
    #[serde(default)]
    pub last_row: bool,
    /// Whether a residual `[rows, N]` is added to the result; it is the last input.
    #[serde(default)]
    pub residual: bool,
    /// An activation of each output after the bias and before the residual
    /// (`fuse-matmul-act`: BERT's `gelu(x·W₁ + b₁)`); `silu`, `gelu` or
    /// `gelu_tanh`.
    #[serde(default)]
    pub act: Option<UnaryOp>,
}

/// Input ports of a matmul's optional operands, from its attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatMulPorts {
    /// The bias, if any.
    pub bias: Option<usize>,
    /// The norm weight, if any.
    pub norm: Option<usize>,
    /// The residual, if any.
    pub residual: Option<usize>,
    /// Number of inputs.
    pub arity: usize,
}

impl MatMulPorts {
    /// Ports of `x, w, [bias], [norm weight], [residual]`.
    pub fn new(bias: bool, norm: bool, residual: bool) -> Self {
        let mut next = 2;
        let mut take = |present: bool| {
            present.then(|| {
                next += 1;
                next - 1
            })
        };
        let (bias, norm, residual) = (take(bias), take(norm), take(residual));
        MatMulPorts {
            bias,
            norm,
            residual,
            arity: next,
        }
    }
}

impl MatMul {
    /// A plain linear layer: no prologue, no epilogue but the optional bias.
    pub fn linear(has_bias: bool) -> Self {
        MatMul {
            has_bias,
            norm: None,
            last_row: false,
            residual: false,
            act: None,
        }
    }

    /// Where each optional operand is bound.
    pub fn ports(&self) -> MatMulPorts {
        MatMulPorts::new(self.has_bias, self.norm.is_some(), self.residual)
    }
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
    /// Whether query `i` sees only keys `j <= i` (decoders); without it
    /// (encoders, `bidirectional` in the text form) every query sees every
    /// key of its own input — the whole step when it holds one input, its
    /// input's rows when the step packs several (the segment table) — and
    /// the window must be `None`.
    #[serde(default = "yes")]
    pub causal: bool,
}

fn yes() -> bool {
    true
}

/// LayerNorm over each row: `(x − mean(x)) / sqrt(var(x) + eps) · w + b`,
/// with the biased variance (PyTorch's `nn.LayerNorm`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerNorm {
    /// Epsilon inside the square root.
    pub eps: f32,
}

/// How an encoder's rows become one vector per input (the
/// sentence-transformers `Pooling` module).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Pooling {
    /// The mean of the rows.
    Mean,
    /// The first row (the `[CLS]` token's).
    Cls,
    /// The largest value of each column.
    Max,
    /// The last row (decoder-based embedders' last token).
    Last,
}

impl Pooling {
    /// The name in the text form and in sentence-transformers' config.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Max => "max",
            Pooling::Last => "last",
        }
    }
}

/// A matmul over a weight `[2·I, K]` whose epilogue applies a gated linear
/// unit: `out[r, n] = act(x'·w[n] (+ b[n])) · (x'·w[I + n] (+ b[I + n]))` for
/// `n < I` (SwiGLU with `Silu`, GeGLU with `GeluTanh`), where `x' =
/// normed(x)` with a [`NormPrologue`], else `x`.
///
/// Inputs, in order: `x, w, [bias], [norm weight]` ([`MatMulGlu::ports`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MatMulGlu {
    /// Activation applied to the gate half.
    pub act: UnaryOp,
    /// Whether a bias `[2·I]` follows the weight.
    pub has_bias: bool,
    /// RMSNorm of each input row before the product; its weight `[K]`
    /// follows the bias.
    #[serde(default)]
    pub norm: Option<NormPrologue>,
}

impl MatMulGlu {
    /// Where each optional operand is bound (never a residual).
    pub fn ports(&self) -> MatMulPorts {
        MatMulPorts::new(self.has_bias, self.norm.is_some(), false)
    }
}

/// Optional per-head RMSNorm of queries and keys inside [`QkvRope`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QkNorm {
    /// Epsilon inside the square root.
    pub eps: f32,
    /// Added to the weights (Gemma: 1).
    pub weight_offset: f32,
}

/// The post-projection work of one attention layer in one op: reads a fused
/// `[rows, (n_heads + 2·n_kv_heads)·head_dim]` q|k|v row, applies the
/// optional per-head q/k norms and RoPE, writes rotated queries to output 0,
/// and writes rotated keys and raw values into the caches at rows `P..P+T`
/// **in place** (outputs 1 and 2 are the caches, inputs 2 and 3).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QkvRope {
    /// Query heads.
    pub n_heads: u32,
    /// Key/value heads.
    pub n_kv_heads: u32,
    /// Width of one head.
    pub head_dim: u32,
    /// Rotated leading dimensions of each head.
    pub rotary_dim: u32,
    /// Per-head q/k norm (weights on input ports 4 and 5), if any.
    pub qk_norm: Option<QkNorm>,
}

/// Elementwise unary functions.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum UnaryOp {
    /// `x · sigmoid(x)`.
    Silu,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
    /// GELU, exact: `x · Φ(x) = x · (1 + erf(x / √2)) / 2` (BERT's `gelu`).
    Gelu,
    /// `tanh(x / cap) · cap`.
    Softcap(f32),
    /// `x · by` (a LoRA update's `alpha / r`).
    Scale(f32),
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
    /// Linear layer `(x, w[, bias][, norm_w][, residual])`, see [`MatMul`].
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
    /// The next token, `u32[1]`, chosen from the last row of logits
    /// `f32[R, V]` by the step's sampling parameters (a uniform the runtime
    /// writes, like the step parameters): the argmax when greedy (lowest
    /// column on ties; NaN never wins), else a seeded draw with temperature,
    /// top-k, top-p and min-p (`gerbil_runtime::sampling` defines it).
    /// Chosen where the logits are, so decoding needs no logits readback.
    SampleToken,
    /// `x[r, n] + b[n]`: a bias `[N]` added to every row of `[rows, N]` (the
    /// frontend's linear layers; `fuse-matmul-bias` folds it into the matmul).
    AddBias,
    /// Columns `start..start + len` of `[rows, W]`, as `[rows, len]`.
    SliceCols {
        /// First column.
        start: u64,
        /// Number of columns (at least 1).
        len: u64,
    },
    /// `(a, b, w) -> (a + b, rms_norm(a + b, w))`: a residual add and the
    /// norm that follows it, with both results as outputs (ports 0 and 1).
    /// `groups` must be 1.
    AddRmsNorm(RmsNorm),
    /// `(x, w, r) -> r + rms_norm(x, w)`: a norm and the residual add that
    /// reads it (Gemma's post-attention and post-MLP norms). `groups` must
    /// be 1.
    RmsNormAdd(RmsNorm),
    /// `(a, b, w) -> (s, rms_norm(s, w))` with `s = a[T-1] + b[T-1]`: the last
    /// row of a residual add and the final norm, both outputs `[1, W]` (what
    /// `slice_last_row` between the two leaves after `fuse-residual-norm`).
    AddRmsNormLastRow(RmsNorm),
    /// `(table, ids, w) -> (x, rms_norm(x, w))` with `x = embedding(table,
    /// ids)`: the lookup and the first norm, both results as outputs.
    EmbeddingRmsNorm(Embedding, RmsNorm),
    /// Gated matmul `(x, w[, bias][, norm_w])`, see [`MatMulGlu`].
    MatMulGlu(MatMulGlu),
    /// Fused q/k/v post-processing `(qkv, table, k_cache, v_cache[, q_norm_w,
    /// k_norm_w]) -> (q, k_cache, v_cache)`, see [`QkvRope`].
    QkvRope(QkvRope),
    /// LayerNorm `(x, w, b)`, see [`LayerNorm`].
    LayerNorm(LayerNorm),
    /// `(x, table) -> x[t] + table[pos(t)]`: learned absolute position
    /// embeddings (BERT), `pos(t)` the row's offset in its input (encoder
    /// steps hold whole inputs from position 0, several packed end to end);
    /// the table `[N, W]` must have a row for every position of an input.
    AddPositions,
    /// `[T, W] -> [1, W]`: an input's rows pooled into one vector, see
    /// [`Pooling`]. Inputs are whole within a step; a step packing several
    /// makes a row per input (as a batch step's one-row values do).
    Pool(Pooling),
    /// `x[r] / max(‖x[r]‖₂, 1e-12)` for each row (`torch.nn.functional.normalize`).
    L2Normalize,
    /// A loss or a backward op of a training step, see [`TrainOp`].
    Train(TrainOp),
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

/// `n_heads` query heads share `n_kv_heads` key/value heads evenly.
fn expect_grouping(n_heads: u32, n_kv_heads: u32) -> Result<(), InferError> {
    if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
        return Err(format!(
            "{n_heads} query heads cannot be grouped over {n_kv_heads} kv heads"
        ));
    }
    Ok(())
}

/// A fused norm normalizes whole rows.
fn expect_one_group(n: &RmsNorm) -> Result<(), InferError> {
    if n.groups == 1 {
        Ok(())
    } else {
        Err(format!("groups must be 1, got {}", n.groups))
    }
}

/// The single output type of an unfused `op` on `ins`; an error names the
/// piece (`what`) of the fused op it came from.
fn piece(op: Op, ins: &[&TensorType], what: &str) -> Result<TensorType, InferError> {
    let mut out = op.infer(ins).map_err(|e| format!("{what}: {e}"))?;
    Ok(out.remove(0))
}

impl Op {
    /// Number of output values.
    pub fn num_outputs(&self) -> usize {
        match self {
            Op::AddRmsNorm(_) | Op::AddRmsNormLastRow(_) | Op::EmbeddingRmsNorm(..) => 2,
            Op::QkvRope(_) => 3,
            Op::Train(t) => t.num_outputs(),
            _ => 1,
        }
    }

    /// The input whose buffer output `port` reuses (the op writes it in
    /// place), if any: the cache of `cache_write`, the caches of `qkv_rope`.
    pub fn aliased_input(&self, port: u32) -> Option<usize> {
        match (self, port) {
            (Op::CacheWrite, 0) => Some(0),
            (Op::QkvRope(_), 1) => Some(2),
            (Op::QkvRope(_), 2) => Some(3),
            _ => None,
        }
    }

    /// Whether the op reads no inputs (weights, inputs, caches).
    pub fn is_source(&self) -> bool {
        matches!(self, Op::Input(_) | Op::Weight(_) | Op::KvCache { .. })
    }

    /// Output types for the given input types, or why the inputs are invalid.
    pub fn infer(&self, ins: &[&TensorType]) -> Result<Vec<TensorType>, InferError> {
        let out = match self {
            Op::Input(_) => {
                expect_arity(ins, 0)?;
                TensorType::new(DType::U32, [Dim::Sym(Sym::T)])
            }
            Op::Train(t) => return t.infer(ins),
            Op::Weight(w) => {
                expect_arity(ins, 0)?;
                if let WeightSource::Rows { count, .. } = &w.source {
                    // One row may also be typed as a vector (BERT's token-type row).
                    let vector = *count == 1 && w.ty.shape.len() == 1;
                    if *count == 0 || (!vector && w.ty.shape.first() != Some(&Dim::Const(*count))) {
                        return Err(format!(
                            "a weight of {count} rows must have a leading dimension of {count} \
                             (at least 1), got {}",
                            w.ty
                        ));
                    }
                }
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
            // The fused ops below are their unfused pieces chained: each
            // piece's own rule checks its inputs, and an error names the piece.
            Op::EmbeddingRmsNorm(e, n) => {
                expect_arity(ins, 3)?;
                expect_one_group(n)?;
                let x = piece(Op::Embedding(e.clone()), &ins[..2], "embedding")?;
                let normed = piece(Op::RmsNorm(n.clone()), &[&x, ins[2]], "rms_norm")?;
                return Ok(vec![x, normed]);
            }
            Op::RmsNorm(n) => {
                expect_arity(ins, 2)?;
                expect_f32(ins[0], "normalized input")?;
                let (_, w) = expect_matrix(ins[0], "normalized input")?;
                let groups = u64::from(n.groups);
                if groups == 0 || !w.is_multiple_of(groups) {
                    return Err(format!(
                        "row width {w} cannot be split into {} equal groups",
                        n.groups
                    ));
                }
                expect_vector(ins[1], w / groups, "norm weight")?;
                ins[0].clone()
            }
            // The prologue and epilogue are their unfused ops around a plain matmul.
            Op::MatMul(m) if m.norm.is_some() || m.residual || m.last_row => {
                let p = m.ports();
                expect_arity(ins, p.arity)?;
                let x = match m.last_row {
                    true => piece(Op::SliceLastRow, &[ins[0]], "last row")?,
                    false => ins[0].clone(),
                };
                let x = match (m.norm, p.norm) {
                    (Some(n), Some(i)) => piece(Op::RmsNorm(n.rms_norm()), &[&x, ins[i]], "norm")?,
                    _ => x,
                };
                let mut linear = vec![&x, ins[1]];
                linear.extend(p.bias.map(|i| ins[i]));
                let y = piece(Op::MatMul(MatMul::linear(m.has_bias)), &linear, "matmul")?;
                match p.residual {
                    Some(i) => piece(Op::Binary(BinaryOp::Add), &[&y, ins[i]], "residual")?,
                    None => y,
                }
            }
            Op::MatMul(m) => {
                expect_arity(ins, m.ports().arity)?;
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
                if let Some(UnaryOp::Softcap(_) | UnaryOp::Scale(_)) = m.act {
                    return Err("a matmul's activation is silu, gelu or gelu_tanh".into());
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
                expect_f32(ins[0], "cache")?;
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
                expect_grouping(a.n_heads, a.n_kv_heads)?;
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
            Op::AddBias => {
                expect_arity(ins, 2)?;
                expect_f32(ins[0], "input")?;
                let (_, n) = expect_matrix(ins[0], "input")?;
                expect_vector(ins[1], n, "bias")?;
                ins[0].clone()
            }
            Op::SampleToken => {
                expect_arity(ins, 1)?;
                expect_f32(ins[0], "input")?;
                expect_matrix(ins[0], "input")?;
                TensorType::new(DType::U32, [Dim::Const(1)])
            }
            Op::SliceLastRow => {
                expect_arity(ins, 1)?;
                let (_, w) = expect_matrix(ins[0], "input")?;
                TensorType::new(ins[0].dtype, [Dim::Const(1), Dim::Const(w)])
            }
            Op::SliceCols { start, len } => {
                expect_arity(ins, 1)?;
                expect_f32(ins[0], "input")?;
                let (rows, w) = expect_matrix(ins[0], "input")?;
                if *len == 0 || start + len > w {
                    return Err(format!(
                        "columns {start}..{} are not a non-empty range of width {w}",
                        start + len
                    ));
                }
                TensorType::new(DType::F32, [rows, Dim::Const(*len)])
            }
            Op::AddRmsNorm(n) => {
                expect_arity(ins, 3)?;
                expect_one_group(n)?;
                let sum = piece(Op::Binary(BinaryOp::Add), &ins[..2], "add")?;
                let normed = piece(Op::RmsNorm(n.clone()), &[&sum, ins[2]], "rms_norm")?;
                return Ok(vec![sum, normed]);
            }
            Op::RmsNormAdd(n) => {
                expect_arity(ins, 3)?;
                expect_one_group(n)?;
                let normed = piece(Op::RmsNorm(n.clone()), &ins[..2], "rms_norm")?;
                piece(Op::Binary(BinaryOp::Add), &[ins[2], &normed], "add")?
            }
            Op::AddRmsNormLastRow(n) => {
                expect_arity(ins, 3)?;
                expect_one_group(n)?;
                let sum = piece(Op::Binary(BinaryOp::Add), &ins[..2], "add")?;
                let last = piece(Op::SliceLastRow, &[&sum], "slice_last_row")?;
                let normed = piece(Op::RmsNorm(n.clone()), &[&last, ins[2]], "rms_norm")?;
                return Ok(vec![last, normed]);
            }
            Op::MatMulGlu(m) => {
                if let UnaryOp::Scale(_) = m.act {
                    return Err(
                        "a gated matmul's activation is silu, gelu, gelu_tanh or softcap".into(),
                    );
                }
                let plain = MatMul {
                    has_bias: m.has_bias,
                    norm: m.norm,
                    last_row: false,
                    residual: false,
                    act: None,
                };
                let both = piece(Op::MatMul(plain), ins, "matmul")?;
                let (_, n) = expect_matrix(&both, "gated matmul")?;
                if n == 0 || !n.is_multiple_of(2) {
                    return Err(format!(
                        "gated matmul weight rows must be a positive even constant, got {}",
                        ins[1]
                    ));
                }
                let half = n / 2;
                let cols = |start, what| piece(Op::SliceCols { start, len: half }, &[&both], what);
                let (gate, up) = (cols(0, "gate half")?, cols(half, "up half")?);
                let act = piece(Op::Unary(m.act), &[&gate], "activation")?;
                piece(Op::Binary(BinaryOp::Mul), &[&act, &up], "mul")?
            }
            Op::LayerNorm(_) => {
                expect_arity(ins, 3)?;
                expect_f32(ins[0], "normalized input")?;
                let (_, w) = expect_matrix(ins[0], "normalized input")?;
                expect_vector(ins[1], w, "norm weight")?;
                expect_vector(ins[2], w, "norm bias")?;
                ins[0].clone()
            }
            Op::AddPositions => {
                expect_arity(ins, 2)?;
                expect_f32(ins[0], "input")?;
                let (_, w) = expect_matrix(ins[0], "input")?;
                let (rows, tw) = expect_matrix(ins[1], "position table")?;
                expect_float(ins[1], "position table")?;
                if rows.as_const().is_none() || tw != w {
                    return Err(format!(
                        "position table must be [positions, {w}] with constant positions, got {}",
                        ins[1]
                    ));
                }
                ins[0].clone()
            }
            Op::Pool(_) => {
                expect_arity(ins, 1)?;
                expect_f32(ins[0], "input")?;
                let (_, w) = expect_matrix(ins[0], "input")?;
                TensorType::new(DType::F32, [Dim::Const(1), Dim::Const(w)])
            }
            Op::L2Normalize => {
                expect_arity(ins, 1)?;
                expect_f32(ins[0], "input")?;
                expect_matrix(ins[0], "input")?;
                ins[0].clone()
            }
            Op::QkvRope(r) => {
                let norm = r.qk_norm.is_some();
                expect_arity(ins, if norm { 6 } else { 4 })?;
                expect_grouping(r.n_heads, r.n_kv_heads)?;
                expect_f32(ins[0], "qkv")?;
                let (_, w) = expect_matrix(ins[0], "qkv")?;
                let hd = u64::from(r.head_dim);
                let (qw, kw) = (u64::from(r.n_heads) * hd, u64::from(r.n_kv_heads) * hd);
                // Checked: head counts and widths come from parsed text too.
                if Some(w) != kw.checked_mul(2).and_then(|k2| k2.checked_add(qw)) {
                    return Err(format!(
                        "qkv width {w} is not ({} + 2·{}) heads × {hd}",
                        r.n_heads, r.n_kv_heads
                    ));
                }
                let cols = |start, len, what| piece(Op::SliceCols { start, len }, &[ins[0]], what);
                let (mut q, mut k) = (cols(0, qw, "q slice")?, cols(qw, kw, "k slice")?);
                let v = cols(qw + kw, kw, "v slice")?;
                if let Some(qk) = r.qk_norm {
                    let norm = |groups| {
                        Op::RmsNorm(RmsNorm {
                            eps: qk.eps,
                            weight_offset: qk.weight_offset,
                            groups,
                        })
                    };
                    q = piece(norm(r.n_heads), &[&q, ins[4]], "q norm")?;
                    k = piece(norm(r.n_kv_heads), &[&k, ins[5]], "k norm")?;
                }
                let rope = |n_heads| {
                    Op::Rope(Rope {
                        n_heads,
                        head_dim: r.head_dim,
                        rotary_dim: r.rotary_dim,
                    })
                };
                let q = piece(rope(r.n_heads), &[&q, ins[1]], "q rope")?;
                let k = piece(rope(r.n_kv_heads), &[&k, ins[1]], "k rope")?;
                let k_cache = piece(Op::CacheWrite, &[ins[2], &k], "k cache_write")?;
                let v_cache = piece(Op::CacheWrite, &[ins[3], &v], "v cache_write")?;
                // What it feeds: attention over the written caches.
                let attention = Op::Attention(Attention {
                    n_heads: r.n_heads,
                    n_kv_heads: r.n_kv_heads,
                    head_dim: r.head_dim,
                    scale: 1.0,
                    window: None,
                    causal: true,
                });
                piece(attention, &[&q, &k_cache, &v_cache], "attention")?;
                return Ok(vec![q, k_cache, v_cache]);
            }
        };
        Ok(vec![out])
    }

    /// Short mnemonic used by the printer and in kernel names.
    pub fn mnemonic(&self) -> &'static str {
        match self {
            Op::Input(Input::TokenIds) => "input.token_ids",
            Op::Input(Input::TargetIds) => "input.target_ids",
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
            Op::Unary(UnaryOp::Gelu) => "gelu",
            Op::Unary(UnaryOp::Softcap(_)) => "softcap",
            Op::Unary(UnaryOp::Scale(_)) => "scale",
            Op::Binary(BinaryOp::Add) => "add",
            Op::AddBias => "add_bias",
            Op::Binary(BinaryOp::Mul) => "mul",
            Op::SliceLastRow => "slice_last_row",
            Op::SampleToken => "sample_token",
            Op::SliceCols { .. } => "slice_cols",
            Op::AddRmsNorm(_) => "add_rms_norm",
            Op::RmsNormAdd(_) => "rms_norm_add",
            Op::AddRmsNormLastRow(_) => "add_rms_norm_last_row",
            Op::EmbeddingRmsNorm(..) => "embedding_rms_norm",
            Op::MatMulGlu(m) => match m.act {
                UnaryOp::Silu => "matmul_swiglu",
                UnaryOp::GeluTanh => "matmul_geglu",
                UnaryOp::Gelu | UnaryOp::Softcap(_) | UnaryOp::Scale(_) => "matmul_glu",
            },
            Op::QkvRope(_) => "qkv_rope",
            Op::LayerNorm(_) => "layer_norm",
            Op::AddPositions => "add_positions",
            Op::Pool(_) => "pool",
            Op::L2Normalize => "l2_normalize",
            Op::Train(t) => t.mnemonic(),
        }
    }
}

impl fmt::Display for WeightSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightSource::Checkpoint { tensor } => write!(f, "{tensor:?}"),
            WeightSource::Concat { tensors } => write!(f, "concat{tensors:?}"),
            WeightSource::Adapter { tensor } => write!(f, "adapter({tensor:?})"),
            WeightSource::Rows {
                tensor,
                start,
                count,
            } => write!(f, "{tensor:?}[{start}..{}]", start + count),
            WeightSource::RopeTable {
                inv_freq,
                attention_scaling,
            } => {
                // Shortest round-trip forms: the table is rebuilt from these.
                f.write_str("rope_table(inv_freq=[")?;
                for (i, x) in inv_freq.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(f, "{sep}{x:e}")?;
                }
                write!(f, "], scaling={attention_scaling})")
            }
        }
    }
}

/// The attributes shared by `matmul` and the gated matmuls, in printed order
/// (after `first`, if any); defaults are omitted.
fn matmul_attrs(
    first: Option<String>,
    bias: bool,
    norm: Option<NormPrologue>,
) -> impl Iterator<Item = String> {
    let norm = norm.map(|n| format!("norm(eps={:e}, offset={})", n.eps, n.weight_offset));
    first
        .into_iter()
        .chain(bias.then(|| "bias".to_string()))
        .chain(norm)
}

/// `{a, b, …}`, or nothing when there are no attributes.
fn write_attrs(f: &mut fmt::Formatter<'_>, attrs: impl Iterator<Item = String>) -> fmt::Result {
    let attrs: Vec<String> = attrs.collect();
    if attrs.is_empty() {
        Ok(())
    } else {
        write!(f, "{{{}}}", attrs.join(", "))
    }
}

impl fmt::Display for Op {
    /// The mnemonic followed by the attributes, e.g. `rms_norm{eps=1e-6}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mnemonic())?;
        match self {
            Op::Weight(w) => write!(f, " {}", w.source),
            Op::KvCache { layer, kind, .. } => write!(f, "{{layer={layer}, kind={kind:?}}}"),
            Op::Embedding(e) => {
                let scale = e.scale.map(|s| format!("scale={s}"));
                let padding = e.padding.map(|p| format!("padding={p}"));
                write_attrs(f, scale.into_iter().chain(padding))
            }
            Op::EmbeddingRmsNorm(e, n) => {
                write!(f, "{{eps={:e}, offset={}", n.eps, n.weight_offset)?;
                if n.groups != 1 {
                    write!(f, ", groups={}", n.groups)?;
                }
                if let Some(s) = e.scale {
                    write!(f, ", scale={s}")?;
                }
                if let Some(p) = e.padding {
                    write!(f, ", padding={p}")?;
                }
                f.write_str("}")
            }
            Op::RmsNorm(n) | Op::AddRmsNorm(n) | Op::RmsNormAdd(n) | Op::AddRmsNormLastRow(n) => {
                write!(f, "{{eps={:e}, offset={}", n.eps, n.weight_offset)?;
                if n.groups != 1 {
                    write!(f, ", groups={}", n.groups)?;
                }
                f.write_str("}")
            }
            Op::MatMul(m) => {
                let last_row = m.last_row.then(|| "last_row".to_string());
                let residual = m.residual.then(|| "residual".to_string());
                let act = m.act.map(|a| format!("act={}", Op::Unary(a).mnemonic()));
                let attrs = matmul_attrs(None, m.has_bias, m.norm);
                write_attrs(f, attrs.chain(act).chain(last_row).chain(residual))
            }
            Op::MatMulGlu(m) => {
                let cap = match m.act {
                    UnaryOp::Softcap(c) => Some(format!("cap={c}")),
                    UnaryOp::Gelu => Some("act=gelu".to_string()),
                    _ => None,
                };
                write_attrs(f, matmul_attrs(cap, m.has_bias, m.norm))
            }
            Op::SliceCols { start, len } => write!(f, "{{cols={start}..{}}}", start + len),
            Op::QkvRope(r) => {
                write!(
                    f,
                    "{{heads={}, kv_heads={}, head_dim={}, rotary_dim={}",
                    r.n_heads, r.n_kv_heads, r.head_dim, r.rotary_dim
                )?;
                if let Some(n) = r.qk_norm {
                    write!(f, ", qk_norm(eps={:e}, offset={})", n.eps, n.weight_offset)?;
                }
                f.write_str("}")
            }
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
                if !a.causal {
                    f.write_str(", bidirectional")?;
                }
                f.write_str("}")
            }
            Op::Unary(UnaryOp::Softcap(c)) => write!(f, "{{cap={c}}}"),
            Op::Unary(UnaryOp::Scale(s)) => write!(f, "{{by={s}}}"),
            Op::LayerNorm(n) => write!(f, "{{eps={:e}}}", n.eps),
            Op::Pool(p) => write!(f, "{{{}}}", p.name()),
            Op::Train(t) => write_train_attrs(f, t),
            _ => Ok(()),
        }
    }
}

/// A training op's attributes: its forward op's (`rms_norm_grad{eps=…}`),
/// and an embedding gradient's table rows.
fn write_train_attrs(f: &mut fmt::Formatter<'_>, t: &TrainOp) -> fmt::Result {
    let Some(forward) = t.forward() else {
        return Ok(());
    };
    let text = forward.to_string();
    let attrs = &text[forward.mnemonic().len()..];
    match t {
        TrainOp::EmbeddingGrad { rows, .. } => match attrs.strip_suffix('}') {
            Some(open) => write!(f, "{open}, rows={rows}}}"),
            None => write!(f, "{{rows={rows}}}"),
        },
        _ => f.write_str(attrs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(groups: u32) -> Op {
        Op::RmsNorm(RmsNorm {
            eps: 1e-6,
            weight_offset: 0.0,
            groups,
        })
    }

    #[test]
    fn grouped_rms_norm_takes_a_weight_per_group() {
        let x = TensorType::rows(128);
        let head = TensorType::fixed(DType::BF16, &[32]);
        let full = TensorType::fixed(DType::F32, &[128]);
        assert_eq!(norm(4).infer(&[&x, &head]).unwrap(), vec![x.clone()]);
        assert_eq!(norm(1).infer(&[&x, &full]).unwrap(), vec![x.clone()]);
        let err = norm(4).infer(&[&x, &full]).unwrap_err();
        assert!(err.contains("[32]"), "{err}");
        let err = norm(3).infer(&[&x, &head]).unwrap_err();
        assert!(err.contains("3 equal groups"), "{err}");
        assert!(norm(0).infer(&[&x, &head]).is_err());
    }

    #[test]
    fn grouped_rms_norm_prints_its_groups() {
        assert_eq!(norm(1).to_string(), "rms_norm{eps=1e-6, offset=0}");
        assert_eq!(
            norm(8).to_string(),
            "rms_norm{eps=1e-6, offset=0, groups=8}"
        );
    }

    #[test]
    fn rms_norm_without_groups_deserializes_as_one_group() {
        let n: RmsNorm = serde_json::from_str(r#"{"eps": 1e-5, "weight_offset": 1.0}"#).unwrap();
        assert_eq!(n.groups, 1);
    }

    #[test]
    fn row_range_weights() {
        let w = |count, rows| {
            Op::Weight(Weight {
                source: WeightSource::Rows {
                    tensor: "qkv".into(),
                    start: 64,
                    count,
                },
                ty: TensorType::fixed(DType::F32, &[rows, 16]),
            })
        };
        assert_eq!(
            w(32, 32).infer(&[]).unwrap(),
            vec![TensorType::fixed(DType::F32, &[32, 16])]
        );
        assert!(w(32, 33).infer(&[]).is_err());
        assert!(w(0, 0).infer(&[]).is_err());
        assert_eq!(w(32, 32).to_string(), r#"weight "qkv"[64..96]"#);
    }

    fn lmax(width: u64) -> TensorType {
        TensorType::new(DType::F32, [Dim::Sym(Sym::Lmax), Dim::Const(width)])
    }

    fn vector(len: u64) -> TensorType {
        TensorType::fixed(DType::BF16, &[len])
    }

    fn qkv_rope(n_heads: u32, n_kv_heads: u32, norm: bool) -> Op {
        Op::QkvRope(QkvRope {
            n_heads,
            n_kv_heads,
            head_dim: 8,
            rotary_dim: 4,
            qk_norm: norm.then_some(QkNorm {
                eps: 1e-6,
                weight_offset: 1.0,
            }),
        })
    }

    fn rms(groups: u32) -> RmsNorm {
        RmsNorm {
            eps: 1e-6,
            weight_offset: 0.0,
            groups,
        }
    }

    /// Runs `op` and returns its error, failing if it accepted the inputs.
    fn rejects(op: &Op, ins: &[&TensorType]) -> String {
        match op.infer(ins) {
            Ok(out) => panic!("{op} accepted {ins:?}, giving {out:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn qkv_rope_is_slices_norms_ropes_cache_writes_and_attention() {
        // 4 query heads over 2 KV heads of 8: width (4 + 2·2)·8 = 64.
        let (qkv, table, cache, w) = (TensorType::rows(64), lmax(4), lmax(16), vector(8));
        let op = qkv_rope(4, 2, true);
        let ins = [&qkv, &table, &cache, &cache, &w, &w];
        assert_eq!(
            op.infer(&ins).unwrap(),
            vec![TensorType::rows(32), cache.clone(), cache.clone()]
        );
        let plain = qkv_rope(4, 2, false);
        assert_eq!(plain.infer(&ins[..4]).unwrap().len(), 3);
        assert!(rejects(&plain, &ins).contains("expects 4 inputs"));

        // The grouping rule of attention: 6 query heads over 4 KV heads, the
        // width (6 + 2·4)·8 = 112 otherwise consistent.
        let (qkv112, cache32) = (TensorType::rows(112), lmax(32));
        let err = rejects(
            &qkv_rope(6, 4, false),
            &[&qkv112, &table, &cache32, &cache32],
        );
        assert!(
            err.contains("6 query heads cannot be grouped over 4 kv heads"),
            "{err}"
        );
        let err = rejects(
            &qkv_rope(4, 0, false),
            &[&TensorType::rows(32), &table, &cache, &cache],
        );
        assert!(err.contains("over 0 kv heads"), "{err}");

        // Each piece's own rule, named by the piece.
        let err = rejects(&op, &[&qkv, &table, &cache, &cache, &w, &vector(16)]);
        assert!(err.starts_with("k norm: norm weight must be [8]"), "{err}");
        let err = rejects(&op, &[&qkv, &lmax(8), &cache, &cache, &w, &w]);
        assert!(
            err.starts_with("q rope: rope table must be f32[Lmax,4]"),
            "{err}"
        );
        let err = rejects(&op, &[&qkv, &table, &cache, &lmax(8), &w, &w]);
        assert!(err.starts_with("v cache_write: cache width 8"), "{err}");
        let odd = Op::QkvRope(QkvRope {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 8,
            rotary_dim: 5,
            qk_norm: None,
        });
        let err = rejects(&odd, &[&qkv, &lmax(5), &cache, &cache]);
        assert!(err.contains("rotary_dim 5 must be even"), "{err}");
        let err = rejects(
            &op,
            &[&TensorType::rows(63), &table, &cache, &cache, &w, &w],
        );
        assert!(err.contains("qkv width 63"), "{err}");
    }

    #[test]
    fn add_rms_norm_is_add_then_rms_norm() {
        let (x, w) = (TensorType::rows(48), vector(48));
        let op = Op::AddRmsNorm(rms(1));
        assert_eq!(op.infer(&[&x, &x, &w]).unwrap(), vec![x.clone(), x.clone()]);
        let err = rejects(&op, &[&x, &TensorType::rows(47), &w]);
        assert!(err.starts_with("add: operands differ"), "{err}");
        let err = rejects(&op, &[&x, &x, &vector(47)]);
        assert!(
            err.starts_with("rms_norm: norm weight must be [48]"),
            "{err}"
        );
        let err = rejects(&Op::AddRmsNorm(rms(2)), &[&x, &x, &vector(24)]);
        assert!(err.contains("groups must be 1"), "{err}");
    }

    #[test]
    fn rms_norm_add_is_rms_norm_then_add() {
        let (x, w) = (TensorType::rows(48), vector(48));
        let op = Op::RmsNormAdd(rms(1));
        assert_eq!(op.infer(&[&x, &w, &x]).unwrap(), vec![x.clone()]);
        let err = rejects(&op, &[&x, &vector(47), &x]);
        assert!(
            err.starts_with("rms_norm: norm weight must be [48]"),
            "{err}"
        );
        let err = rejects(&op, &[&x, &w, &TensorType::rows(47)]);
        assert!(err.starts_with("add: operands differ"), "{err}");
        let err = rejects(&Op::RmsNormAdd(rms(2)), &[&x, &w, &x]);
        assert!(err.contains("groups must be 1"), "{err}");
    }

    #[test]
    fn add_rms_norm_last_row_is_add_slice_last_row_and_rms_norm() {
        let (x, w) = (TensorType::rows(48), vector(48));
        let row = TensorType::fixed(DType::F32, &[1, 48]);
        let op = Op::AddRmsNormLastRow(rms(1));
        assert_eq!(op.infer(&[&x, &x, &w]).unwrap(), vec![row.clone(), row]);
        let err = rejects(&op, &[&x, &TensorType::fixed(DType::F32, &[1, 48]), &w]);
        assert!(err.starts_with("add: operands differ"), "{err}");
        let err = rejects(&op, &[&x, &x, &vector(12)]);
        assert!(err.starts_with("rms_norm:"), "{err}");
    }

    #[test]
    fn matmul_glu_is_matmul_then_halves_activation_and_product() {
        let x = TensorType::rows(32);
        let w = TensorType::fixed(DType::BF16, &[2 * 40, 32]);
        let glu = |has_bias| {
            Op::MatMulGlu(MatMulGlu {
                act: UnaryOp::Silu,
                has_bias,
                norm: None,
            })
        };
        assert_eq!(
            glu(false).infer(&[&x, &w]).unwrap(),
            vec![TensorType::rows(40)]
        );
        assert_eq!(
            glu(true).infer(&[&x, &w, &vector(80)]).unwrap(),
            vec![TensorType::rows(40)]
        );
        let err = rejects(&glu(true), &[&x, &w, &vector(40)]);
        assert!(err.starts_with("matmul: matmul bias must be [80]"), "{err}");
        let err = rejects(&glu(false), &[&TensorType::rows(31), &w]);
        assert!(err.starts_with("matmul: matmul weight"), "{err}");
        let odd = TensorType::fixed(DType::F32, &[81, 32]);
        let err = rejects(&glu(false), &[&x, &odd]);
        assert!(err.contains("positive even constant"), "{err}");
    }

    const PROLOGUE: NormPrologue = NormPrologue {
        eps: 1e-6,
        weight_offset: 1.0,
    };

    #[test]
    fn matmul_ports_follow_the_attributes() {
        let mm = |has_bias, norm: bool, residual| MatMul {
            has_bias,
            norm: norm.then_some(PROLOGUE),
            last_row: false,
            residual,
            act: None,
        };
        let ports = |m: MatMul| {
            let p = m.ports();
            (p.bias, p.norm, p.residual, p.arity)
        };
        assert_eq!(ports(MatMul::linear(false)), (None, None, None, 2));
        assert_eq!(ports(mm(true, true, true)), (Some(2), Some(3), Some(4), 5));
        assert_eq!(ports(mm(false, true, true)), (None, Some(2), Some(3), 4));
        assert_eq!(ports(mm(true, false, true)), (Some(2), None, Some(3), 4));
        let glu = MatMulGlu {
            act: UnaryOp::Silu,
            has_bias: false,
            norm: Some(PROLOGUE),
        };
        assert_eq!(glu.ports().norm, Some(2));
        assert_eq!(glu.ports().arity, 3);
    }

    #[test]
    fn fused_matmul_is_norm_matmul_then_residual_add() {
        let (x, w) = (
            TensorType::rows(32),
            TensorType::fixed(DType::BF16, &[40, 32]),
        );
        let (g, b, r) = (vector(32), vector(40), TensorType::rows(40));
        let op = |has_bias, norm: bool, residual| {
            Op::MatMul(MatMul {
                has_bias,
                norm: norm.then_some(PROLOGUE),
                last_row: false,
                residual,
                act: None,
            })
        };
        let out = vec![TensorType::rows(40)];
        assert_eq!(
            op(true, true, true).infer(&[&x, &w, &b, &g, &r]),
            Ok(out.clone())
        );
        assert_eq!(op(false, true, false).infer(&[&x, &w, &g]), Ok(out.clone()));
        assert_eq!(op(false, false, true).infer(&[&x, &w, &r]), Ok(out));
        let err = rejects(&op(false, true, true), &[&x, &w, &g]);
        assert!(err.contains("expects 4 inputs"), "{err}");
        let err = rejects(&op(false, true, false), &[&x, &w, &vector(40)]);
        assert!(err.starts_with("norm: norm weight must be [32]"), "{err}");
        let err = rejects(&op(false, false, true), &[&x, &w, &TensorType::rows(32)]);
        assert!(err.starts_with("residual: operands differ"), "{err}");
        let err = rejects(&op(true, true, false), &[&x, &w, &vector(32), &g]);
        assert!(err.starts_with("matmul: matmul bias must be [40]"), "{err}");

        let glu = Op::MatMulGlu(MatMulGlu {
            act: UnaryOp::GeluTanh,
            has_bias: false,
            norm: Some(PROLOGUE),
        });
        let w2 = TensorType::fixed(DType::BF16, &[80, 32]);
        assert_eq!(glu.infer(&[&x, &w2, &g]), Ok(vec![r.clone()]));
        let err = rejects(&glu, &[&x, &w2, &vector(31)]);
        assert!(err.starts_with("matmul: norm: norm weight"), "{err}");
    }

    #[test]
    fn last_row_matmul_is_slice_last_row_then_matmul() {
        let (x, w) = (
            TensorType::rows(32),
            TensorType::fixed(DType::BF16, &[40, 32]),
        );
        let row = TensorType::fixed(DType::F32, &[1, 40]);
        let op = |norm: bool, residual| {
            Op::MatMul(MatMul {
                has_bias: false,
                norm: norm.then_some(PROLOGUE),
                last_row: true,
                residual,
                act: None,
            })
        };
        assert_eq!(
            op(true, false).infer(&[&x, &w, &vector(32)]),
            Ok(vec![row.clone()])
        );
        assert_eq!(op(false, false).infer(&[&x, &w]), Ok(vec![row.clone()]));
        assert_eq!(
            op(false, true).infer(&[&x, &w, &row]),
            Ok(vec![row.clone()])
        );
        // The residual is the output's type: one row, not the input's rows.
        let err = rejects(&op(false, true), &[&x, &w, &TensorType::rows(40)]);
        assert!(err.starts_with("residual: operands differ"), "{err}");
        let err = rejects(
            &op(false, false),
            &[&TensorType::fixed(DType::F32, &[32]), &w],
        );
        assert!(
            err.starts_with("last row: input must be [rows, width]"),
            "{err}"
        );
        assert_eq!(
            op(true, true).to_string(),
            "matmul{norm(eps=1e-6, offset=1), last_row, residual}"
        );
    }

    #[test]
    fn fused_matmuls_print_only_what_they_fuse() {
        let m = |has_bias, norm: bool, residual| {
            Op::MatMul(MatMul {
                has_bias,
                norm: norm.then_some(PROLOGUE),
                last_row: false,
                residual,
                act: None,
            })
            .to_string()
        };
        assert_eq!(m(false, false, false), "matmul");
        assert_eq!(m(true, false, false), "matmul{bias}");
        assert_eq!(m(false, false, true), "matmul{residual}");
        assert_eq!(
            m(true, true, true),
            "matmul{bias, norm(eps=1e-6, offset=1), residual}"
        );
        let glu = Op::MatMulGlu(MatMulGlu {
            act: UnaryOp::Softcap(30.0),
            has_bias: true,
            norm: Some(PROLOGUE),
        });
        assert_eq!(
            glu.to_string(),
            "matmul_glu{cap=30, bias, norm(eps=1e-6, offset=1)}"
        );
    }

    #[test]
    fn embedding_rms_norm_is_embedding_then_rms_norm() {
        let table = TensorType::fixed(DType::BF16, &[100, 24]);
        let ids = TensorType::new(DType::U32, [Dim::Sym(Sym::T)]);
        let op = Op::EmbeddingRmsNorm(
            Embedding {
                scale: Some(2.0),
                padding: None,
            },
            rms(1),
        );
        let x = TensorType::rows(24);
        assert_eq!(
            op.infer(&[&table, &ids, &vector(24)]).unwrap(),
            vec![x.clone(), x]
        );
        let err = rejects(&op, &[&table, &TensorType::rows(1), &vector(24)]);
        assert!(
            err.starts_with("embedding: token ids must be u32[T]"),
            "{err}"
        );
        let err = rejects(&op, &[&table, &ids, &vector(12)]);
        assert!(
            err.starts_with("rms_norm: norm weight must be [24]"),
            "{err}"
        );
    }

    #[test]
    fn cache_write_takes_an_f32_cache() {
        let x = TensorType::rows(16);
        assert_eq!(
            Op::CacheWrite.infer(&[&lmax(16), &x]).unwrap(),
            vec![lmax(16)]
        );
        let half = TensorType::new(DType::F16, [Dim::Sym(Sym::Lmax), Dim::Const(16)]);
        assert!(rejects(&Op::CacheWrite, &[&half, &x]).contains("cache must be f32"));
    }
}
