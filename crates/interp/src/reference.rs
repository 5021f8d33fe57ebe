//! One f64 reference per IR op: what every `gerbil_ir::Op` computes, written
//! as plainly as possible, for the kernel tests and the CPU interpreter.
//!
//! Tensors are row-major `&[f64]` slices (weights already decoded from their
//! dtype), with their widths passed explicitly; the number of rows follows
//! from the length. `p` is the step's position offset (tokens already
//! cached). Each function's contract is the op's in `gerbil_ir::op`: read it
//! there, not here.
//!
//! The fused ops are compositions of the unfused references, never formulas
//! of their own: `qkv_rope` is `slice_cols` + grouped `rms_norm` + `rope` +
//! `cache_write`, `matmul_glu` is `matmul` + `slice_cols` + `unary` + `binary`,
//! and so on. A fused kernel therefore meets the very arithmetic its unfused
//! pieces meet, and a wrong fusion rule cannot hide in a matching wrong
//! reference.
//!
//! The surprise: [`embedding`] reads row 0 for an id past the table, which is
//! what the kernel does (the runtime never passes one; the kernel test does).

use gerbil_ir::rope_table::{cos_index, sin_index};
use gerbil_ir::{
    Attention, BinaryOp, Embedding, NormPrologue, Pooling, QkvRope, RmsNorm, Rope, UnaryOp,
};

/// Rows of `x` at `width` columns (a zero width has no rows).
pub(crate) fn rows(x: &[f64], width: usize) -> usize {
    x.len().checked_div(width).unwrap_or(0)
}

/// `table[ids[t]] · scale`; an id past the table reads row 0.
pub fn embedding(table: &[f64], width: usize, ids: &[u32], e: &Embedding) -> Vec<f64> {
    let vocab = rows(table, width);
    let scale = e.scale.map_or(1.0, f64::from);
    ids.iter()
        .flat_map(|&id| {
            let row = if (id as usize) < vocab {
                id as usize
            } else {
                0
            };
            table[row * width..(row + 1) * width]
                .iter()
                .map(move |&v| v * scale)
        })
        .collect()
}

/// RMSNorm over each `w.len()`-wide group of `x` (a row is `n.groups` such
/// groups): `v / sqrt(mean(v²) + eps) · (w + weight_offset)`.
pub fn rms_norm(x: &[f64], w: &[f64], n: &RmsNorm) -> Vec<f64> {
    let (eps, offset) = (f64::from(n.eps), f64::from(n.weight_offset));
    x.chunks(w.len())
        .flat_map(|group| {
            let ms = group.iter().map(|v| v * v).sum::<f64>() / group.len() as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            group
                .iter()
                .zip(w)
                .map(move |(&v, &wi)| v * inv * (wi + offset))
        })
        .collect()
}

/// `x[r] · w[n] (+ bias[n])` with `w` in `[N, k]` layout. The weight's
/// rows run on rayon's threads (a self-test's reference of a large model
/// spends its time here); each sum is in order, so the result does not
/// depend on the threads.
pub fn matmul(x: &[f64], k: usize, w: &[f64], bias: Option<&[f64]>) -> Vec<f64> {
    use rayon::prelude::*;
    let (n, m) = (rows(w, k), rows(x, k));
    let cols: Vec<Vec<f64>> = (0..n)
        .into_par_iter()
        .map(|j| {
            let wj = &w[j * k..(j + 1) * k];
            (0..m)
                .map(|r| {
                    let dot: f64 = x[r * k..(r + 1) * k]
                        .iter()
                        .zip(wj)
                        .map(|(a, b)| a * b)
                        .sum();
                    dot + bias.map_or(0.0, |b| b[j])
                })
                .collect()
        })
        .collect();
    (0..m)
        .flat_map(|r| cols.iter().map(move |c| c[r]))
        .collect()
}

/// The RMSNorm prologue of a fused matmul: its weight `g` and attributes.
pub type NormOperand<'a> = (&'a [f64], NormPrologue);

/// `x`, or `rms_norm(x, g)` with the prologue's attributes.
fn prologue<'a>(x: &'a [f64], norm: Option<NormOperand>) -> std::borrow::Cow<'a, [f64]> {
    match norm {
        Some((g, n)) => rms_norm(x, g, &n.rms_norm()).into(),
        None => x.into(),
    }
}

/// `matmul` with its fused prologue and epilogue (`gerbil_ir::MatMul`):
/// `rms_norm` of `x` (with `norm`), the matmul, its activation `act`, then
/// `+ residual`.
pub fn fused_matmul(
    x: &[f64],
    k: usize,
    w: &[f64],
    bias: Option<&[f64]>,
    norm: Option<NormOperand>,
    act: Option<UnaryOp>,
    residual: Option<&[f64]>,
) -> Vec<f64> {
    let mut y = matmul(&prologue(x, norm), k, w, bias);
    if let Some(act) = act {
        y = unary(act, &y);
    }
    match residual {
        Some(r) => binary(BinaryOp::Add, &y, r),
        None => y,
    }
}

/// `matmul_glu` with its fused prologue (`gerbil_ir::MatMulGlu`): `rms_norm`
/// of `x` (with `norm`), then the gated matmul.
pub fn fused_matmul_glu(
    x: &[f64],
    k: usize,
    w: &[f64],
    bias: Option<&[f64]>,
    norm: Option<NormOperand>,
    act: UnaryOp,
) -> Vec<f64> {
    matmul_glu(&prologue(x, norm), k, w, bias, act)
}

/// A matmul over `[2·I, k]` with a gated epilogue: `act(gate) · up`, where
/// gate and up are the first and second `I` columns of the matmul.
pub fn matmul_glu(x: &[f64], k: usize, w: &[f64], bias: Option<&[f64]>, act: UnaryOp) -> Vec<f64> {
    let lin = matmul(x, k, w, bias);
    let width = rows(w, k);
    let half = width / 2;
    let gate = unary(act, &slice_cols(&lin, width, 0, half));
    let up = slice_cols(&lin, width, half, half);
    binary(BinaryOp::Mul, &gate, &up)
}

/// Rotate-half RoPE on `[T, n_heads·head_dim]` at positions `p..p+T`: in each
/// head, dimension `j < rotary_dim/2` pairs with `j + rotary_dim/2`; the
/// dimensions past `rotary_dim` pass through. `table` has the layout of
/// `gerbil_ir::rope_table` (`rotary_dim` columns per position).
pub fn rope(x: &[f64], table: &[f64], r: &Rope, p: usize) -> Vec<f64> {
    rotate(x, table, r, p, 1.0)
}

/// [`rope`] by the table's angles times `turn` (1: the op; −1: turning each
/// pair back, its gradient).
pub(crate) fn rotate(x: &[f64], table: &[f64], r: &Rope, p: usize, turn: f64) -> Vec<f64> {
    let (nh, hd, rot) = (
        r.n_heads as usize,
        r.head_dim as usize,
        r.rotary_dim as usize,
    );
    let half = rot / 2;
    let mut out = x.to_vec();
    for t in 0..rows(x, nh * hd) {
        let pos = (p + t) as u64;
        for h in 0..nh {
            let base = (t * nh + h) * hd;
            for j in 0..half {
                let cos = table[cos_index(pos, j as u64, rot as u64) as usize];
                let sin = turn * table[sin_index(pos, j as u64, rot as u64) as usize];
                let (a, b) = (x[base + j], x[base + half + j]);
                out[base + j] = a * cos - b * sin;
                out[base + half + j] = b * cos + a * sin;
            }
        }
    }
    out
}

/// The cache with rows `p..p+T` replaced by `x` (`width` columns each).
pub fn cache_write(cache: &[f64], x: &[f64], width: usize, p: usize) -> Vec<f64> {
    let mut out = cache.to_vec();
    out[p * width..p * width + x.len()].copy_from_slice(x);
    out
}

/// Causal attention of `q` (`[T, n_heads·head_dim]`, positions `p..p+T`)
/// against caches holding rows `0..p+T`: query head `h` reads KV head
/// `h / (n_heads / n_kv_heads)`, keys `j ≤ pos` (and `j > pos − window`),
/// softmax of `scale · q·k`. Bidirectional attention sees every key of the
/// step (within `|pos − j| < window`).
pub fn attention(q: &[f64], k_cache: &[f64], v_cache: &[f64], a: &Attention, p: usize) -> Vec<f64> {
    let Heads { nh, nkv, hd, group } = Heads::of(a);
    let scale = f64::from(a.scale);
    let t_rows = rows(q, nh * hd);
    let mut out = vec![0.0; q.len()];
    for t in 0..t_rows {
        let (lo, pos) = keys_seen(a, p, t, t_rows);
        for h in 0..nh {
            let qrow = &q[(t * nh + h) * hd..][..hd];
            let kvh = h / group;
            let scores: Vec<f64> = (lo..=pos)
                .map(|j| {
                    let krow = &k_cache[(j * nkv + kvh) * hd..][..hd];
                    qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>() * scale
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            let o = &mut out[(t * nh + h) * hd..][..hd];
            for (j, wj) in (lo..=pos).zip(&weights) {
                let vrow = &v_cache[(j * nkv + kvh) * hd..][..hd];
                for (oi, &v) in o.iter_mut().zip(vrow) {
                    *oi += wj / total * v;
                }
            }
        }
    }
    out
}

/// An attention's head counts and width, and its GQA group size.
pub(crate) struct Heads {
    pub nh: usize,
    pub nkv: usize,
    pub hd: usize,
    pub group: usize,
}

impl Heads {
    pub(crate) fn of(a: &Attention) -> Heads {
        let (nh, nkv) = (a.n_heads as usize, a.n_kv_heads as usize);
        Heads {
            nh,
            nkv,
            hd: a.head_dim as usize,
            group: nh / nkv,
        }
    }
}

/// The first and last cache row query row `t` of a `t_rows`-row step at
/// `p` sees: up to itself (causal) or the step's last (bidirectional),
/// within the window.
pub(crate) fn keys_seen(a: &Attention, p: usize, t: usize, t_rows: usize) -> (usize, usize) {
    let me = p + t;
    let last = if a.causal { me } else { p + t_rows - 1 };
    match a.window.map(|w| w as usize) {
        Some(w) => ((me + 1).saturating_sub(w), last.min(me + w - 1)),
        None => (0, last),
    }
}

/// One value of an elementwise unary function.
pub fn unary_scalar(op: UnaryOp, v: f64) -> f64 {
    match op {
        UnaryOp::Silu => v / (1.0 + (-v).exp()),
        UnaryOp::GeluTanh => {
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3));
            0.5 * v * (1.0 + inner.tanh())
        }
        UnaryOp::Gelu => 0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2)),
        UnaryOp::Softcap(cap) => (v / f64::from(cap)).tanh() * f64::from(cap),
        UnaryOp::Scale(s) => v * f64::from(s),
    }
}

/// LayerNorm of each row of `w.len()` values: mean and biased variance,
/// then `· w + b`.
pub fn layer_norm(x: &[f64], w: &[f64], b: &[f64], eps: f32) -> Vec<f64> {
    x.chunks(w.len())
        .flat_map(|row| {
            let n = row.len() as f64;
            let mean = row.iter().sum::<f64>() / n;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
            let inv = 1.0 / (var + f64::from(eps)).sqrt();
            row.iter()
                .zip(w.iter().zip(b))
                .map(move |(&v, (&wi, &bi))| (v - mean) * inv * wi + bi)
        })
        .collect()
}

/// `x[t] + table[p + t]`, rows of `width`.
pub fn add_positions(x: &[f64], table: &[f64], width: usize, p: usize) -> Vec<f64> {
    x.iter()
        .zip(&table[p * width..])
        .map(|(a, b)| a + b)
        .collect()
}

/// The rows of `x` (of `width`) pooled into one row.
pub fn pool(x: &[f64], width: usize, pooling: Pooling) -> Vec<f64> {
    let n = rows(x, width);
    (0..width)
        .map(|c| {
            let column = (0..n).map(|t| x[t * width + c]);
            match pooling {
                Pooling::Mean => column.sum::<f64>() / n as f64,
                Pooling::Cls => x[c],
                Pooling::Max => column.fold(f64::NEG_INFINITY, f64::max),
                Pooling::Last => x[(n - 1) * width + c],
            }
        })
        .collect()
}

/// Each row of `width` divided by `max(‖row‖₂, 1e-12)`.
pub fn l2_normalize(x: &[f64], width: usize) -> Vec<f64> {
    x.chunks(width)
        .flat_map(|row| {
            let norm = row.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
            row.iter().map(move |v| v / norm)
        })
        .collect()
}

/// An elementwise unary function.
pub fn unary(op: UnaryOp, x: &[f64]) -> Vec<f64> {
    x.iter().map(|&v| unary_scalar(op, v)).collect()
}

/// An elementwise binary function of two equally long tensors.
pub fn binary(op: BinaryOp, a: &[f64], b: &[f64]) -> Vec<f64> {
    assert_eq!(a.len(), b.len(), "binary operands differ in length");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| match op {
            BinaryOp::Add => x + y,
            BinaryOp::Mul => x * y,
        })
        .collect()
}

/// `x[r, n] + b[n]`.
pub fn add_bias(x: &[f64], b: &[f64]) -> Vec<f64> {
    x.iter()
        .enumerate()
        .map(|(i, &v)| v + b[i % b.len()])
        .collect()
}

/// The last row of `x`.
pub fn slice_last_row(x: &[f64], width: usize) -> Vec<f64> {
    x[x.len() - width..].to_vec()
}

/// Index of the largest value (lowest index on ties, NaN never wins).
pub fn argmax(x: &[f64]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] || x[best].is_nan() && !v.is_nan() {
            best = i;
        }
    }
    best as u32
}

/// Columns `start..start + len` of every row of `x`.
pub fn slice_cols(x: &[f64], width: usize, start: usize, len: usize) -> Vec<f64> {
    x.chunks(width)
        .flat_map(|row| row[start..start + len].iter().copied())
        .collect()
}

/// `(a + b, rms_norm(a + b, w))`.
pub fn add_rms_norm(a: &[f64], b: &[f64], w: &[f64], n: &RmsNorm) -> (Vec<f64>, Vec<f64>) {
    let sum = binary(BinaryOp::Add, a, b);
    let normed = rms_norm(&sum, w, n);
    (sum, normed)
}

/// `(s, rms_norm(s, w))` with `s` the last row of `a + b`.
pub fn add_rms_norm_last_row(a: &[f64], b: &[f64], w: &[f64], n: &RmsNorm) -> (Vec<f64>, Vec<f64>) {
    let sum = slice_last_row(&binary(BinaryOp::Add, a, b), w.len());
    let normed = rms_norm(&sum, w, n);
    (sum, normed)
}

/// `(x, rms_norm(x, w))` with `x` the embedding lookup.
pub fn embedding_rms_norm(
    table: &[f64],
    ids: &[u32],
    e: &Embedding,
    w: &[f64],
    n: &RmsNorm,
) -> (Vec<f64>, Vec<f64>) {
    let x = embedding(table, w.len(), ids, e);
    let normed = rms_norm(&x, w, n);
    (x, normed)
}

/// The outputs of `qkv_rope`: rotated queries and both caches after the
/// step's writes.
pub struct QkvRopeOut {
    /// Rotated (and normalized) queries, `[T, n_heads·head_dim]`.
    pub q: Vec<f64>,
    /// The key cache with rows `p..p+T` written.
    pub k_cache: Vec<f64>,
    /// The value cache with rows `p..p+T` written.
    pub v_cache: Vec<f64>,
}

/// `qkv_rope` as its unfused pieces: slice q, k and v out of the fused row,
/// norm q and k per head (if `norms` holds the q and k norm weights), rotate
/// them, and write k and v into the caches.
pub fn qkv_rope(
    qkv: &[f64],
    table: &[f64],
    k_cache: &[f64],
    v_cache: &[f64],
    r: &QkvRope,
    norms: Option<(&[f64], &[f64])>,
    p: usize,
) -> QkvRopeOut {
    let hd = r.head_dim as usize;
    let (qw, kw) = (r.n_heads as usize * hd, r.n_kv_heads as usize * hd);
    let width = qw + 2 * kw;
    let part = |start, len, heads: u32, norm_w: Option<&[f64]>| {
        let x = slice_cols(qkv, width, start, len);
        let x = match (norm_w, r.qk_norm) {
            (Some(w), Some(n)) => rms_norm(
                &x,
                w,
                &RmsNorm {
                    eps: n.eps,
                    weight_offset: n.weight_offset,
                    groups: heads,
                },
            ),
            _ => x,
        };
        let spec = Rope {
            n_heads: heads,
            head_dim: r.head_dim,
            rotary_dim: r.rotary_dim,
        };
        rope(&x, table, &spec, p)
    };
    let q = part(0, qw, r.n_heads, norms.map(|n| n.0));
    let k = part(qw, kw, r.n_kv_heads, norms.map(|n| n.1));
    let v = slice_cols(qkv, width, qw + kw, kw);
    QkvRopeOut {
        q,
        k_cache: cache_write(k_cache, &k, kw, p),
        v_cache: cache_write(v_cache, &v, kw, p),
    }
}
