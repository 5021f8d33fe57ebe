//! The backward of the references: for an op of [`mod@crate::reference`],
//! given its inputs and `dy` (the gradient of a loss with respect to its
//! output), the gradients with respect to its inputs — the vector-Jacobian
//! products training needs, in f64 and as plainly as the forward ones.
//!
//! They are the oracle of gradients the way the references are the oracle
//! of outputs: each is checked here against finite differences of its
//! forward reference on random inputs, and the training path's kernels are
//! to be checked against them. Layouts, widths and `p` are the forward
//! functions'; a gradient has its input's layout.
//!
//! The surprise: attention's keys and values are cache rows, shared by
//! every query row that sees them and by the heads of a GQA group, so their
//! gradients are sums over those readers; the same holds for an embedding
//! row looked up by several tokens ([`embedding`] adds into it).

use crate::reference::{self as r, rows};
use gerbil_ir::{Attention, Embedding, RmsNorm, Rope, UnaryOp};

/// Gradients of `y = x · wᵀ` (`w` in `[N, k]` layout): `(dx, dw)`.
pub fn matmul(x: &[f64], k: usize, w: &[f64], dy: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let n = rows(w, k);
    (matmul_dx(dy, n, w), matmul_dw(dy, n, x))
}

/// The gradient of a matmul's input: `dy · w`, with `dy` in `[rows, n]`
/// and `w` in `[n, k]`.
pub fn matmul_dx(dy: &[f64], n: usize, w: &[f64]) -> Vec<f64> {
    let k = w.len() / n;
    let mut dx = vec![0.0; rows(dy, n) * k];
    for (g, out) in dy.chunks(n).zip(dx.chunks_mut(k)) {
        for (&g, w) in g.iter().zip(w.chunks(k)) {
            for (d, &w) in out.iter_mut().zip(w) {
                *d += g * w;
            }
        }
    }
    dx
}

/// The gradient of a matmul's weight: `dyᵀ · x`, with `dy` in
/// `[rows, n]` and `x` in `[rows, k]`; `[n, k]` like the weight.
pub fn matmul_dw(dy: &[f64], n: usize, x: &[f64]) -> Vec<f64> {
    let k = x.len() / rows(dy, n).max(1);
    let mut dw = vec![0.0; n * k];
    for (g, x) in dy.chunks(n).zip(x.chunks(k)) {
        for (&g, out) in g.iter().zip(dw.chunks_mut(k)) {
            for (d, &x) in out.iter_mut().zip(x) {
                *d += g * x;
            }
        }
    }
    dw
}

/// Column sums of `[rows, n]`: the gradient of a bias added to every row.
pub fn sum_rows(dy: &[f64], n: usize) -> Vec<f64> {
    let mut out = vec![0.0; n];
    for row in dy.chunks(n) {
        for (o, &g) in out.iter_mut().zip(row) {
            *o += g;
        }
    }
    out
}

/// Gradients of [`r::rms_norm`]: `(dx, dw)`. With `g = dy · (w + offset)`
/// and `inv = 1 / sqrt(mean(x²) + eps)` per group of `h`:
/// `dx = inv · g − x · inv³ · Σ(g · x) / h`, `dw = Σ over groups of dy · x · inv`.
pub fn rms_norm(x: &[f64], w: &[f64], n: &RmsNorm, dy: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (eps, offset) = (f64::from(n.eps), f64::from(n.weight_offset));
    let h = w.len();
    let mut dx = vec![0.0; x.len()];
    let mut dw = vec![0.0; h];
    for (b, group) in x.chunks(h).enumerate() {
        let d = &dy[b * h..(b + 1) * h];
        let ms = group.iter().map(|v| v * v).sum::<f64>() / h as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        let gx: f64 = (0..h).map(|i| d[i] * (w[i] + offset) * group[i]).sum();
        for i in 0..h {
            let g = d[i] * (w[i] + offset);
            dx[b * h + i] = inv * g - group[i] * inv.powi(3) * gx / h as f64;
            dw[i] += d[i] * group[i] * inv;
        }
    }
    (dx, dw)
}

/// Gradient of [`r::rope`]: each rotated pair turned back by its angle.
pub fn rope(dy: &[f64], table: &[f64], r: &Rope, p: usize) -> Vec<f64> {
    r::rotate(dy, table, r, p, -1.0)
}

/// The derivative of [`r::unary_scalar`] at `v`.
pub fn unary_derivative(op: UnaryOp, v: f64) -> f64 {
    match op {
        UnaryOp::Silu => {
            let s = 1.0 / (1.0 + (-v).exp());
            s * (1.0 + v * (1.0 - s))
        }
        UnaryOp::GeluTanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let th = (c * (v + 0.044715 * v.powi(3))).tanh();
            0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * c * (1.0 + 3.0 * 0.044715 * v * v)
        }
        UnaryOp::Gelu => {
            let pdf = (-0.5 * v * v).exp() / (2.0 * std::f64::consts::PI).sqrt();
            0.5 * (1.0 + libm::erf(v / std::f64::consts::SQRT_2)) + v * pdf
        }
        UnaryOp::Softcap(cap) => {
            let th = (v / f64::from(cap)).tanh();
            1.0 - th * th
        }
        UnaryOp::Scale(s) => f64::from(s),
    }
}

/// Gradient of [`r::unary`].
pub fn unary(op: UnaryOp, x: &[f64], dy: &[f64]) -> Vec<f64> {
    x.iter()
        .zip(dy)
        .map(|(&v, &d)| d * unary_derivative(op, v))
        .collect()
}

/// Gradients of the gated unit `act(gate) · up`: `(dgate, dup)`.
pub fn glu(act: UnaryOp, gate: &[f64], up: &[f64], dy: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let dgate = (0..gate.len())
        .map(|i| dy[i] * up[i] * unary_derivative(act, gate[i]))
        .collect();
    let dup = (0..up.len())
        .map(|i| dy[i] * r::unary_scalar(act, gate[i]))
        .collect();
    (dgate, dup)
}

/// Gradient of [`r::embedding`] with respect to its `vocab`-row table:
/// each token's `dy` row (times the scale) added into its id's row; ids
/// past the table add into row 0, which is the row the forward read. The
/// padding row gets nothing (PyTorch's `padding_idx`).
pub fn embedding(ids: &[u32], width: usize, vocab: usize, e: &Embedding, dy: &[f64]) -> Vec<f64> {
    let scale = e.scale.map_or(1.0, f64::from);
    let mut dt = vec![0.0; vocab * width];
    for (t, &id) in ids.iter().enumerate() {
        let row = if (id as usize) < vocab {
            id as usize
        } else {
            0
        };
        if e.padding == Some(row as u32) {
            continue;
        }
        for i in 0..width {
            dt[row * width + i] += dy[t * width + i] * scale;
        }
    }
    dt
}

/// Gradients of [`r::attention`]: `(dq, dk_cache, dv_cache)`, the cache
/// gradients as long as the caches (rows no query sees get zeros). Per
/// query row and head, with `P` the softmax over the keys it sees:
/// `dv_j += P_j · dy`, `ds_j = P_j · (dy·v_j − Σ_i P_i · dy·v_i)`,
/// `dq += scale · Σ_j ds_j · k_j`, `dk_j += scale · ds_j · q`.
pub fn attention(
    q: &[f64],
    k_cache: &[f64],
    v_cache: &[f64],
    a: &Attention,
    p: usize,
    dy: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let r::Heads { nh, nkv, hd, group } = r::Heads::of(a);
    let scale = f64::from(a.scale);
    let t_rows = rows(q, nh * hd);
    let mut dq = vec![0.0; q.len()];
    let mut dk = vec![0.0; k_cache.len()];
    let mut dv = vec![0.0; v_cache.len()];
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for t in 0..t_rows {
        let (lo, pos) = r::keys_seen(a, p, t, t_rows);
        for h in 0..nh {
            let at = (t * nh + h) * hd;
            let (qrow, drow) = (&q[at..at + hd], &dy[at..at + hd]);
            let kvh = h / group;
            let key = |j: usize| (j * nkv + kvh) * hd;
            let scores: Vec<f64> = (lo..=pos)
                .map(|j| dot(qrow, &k_cache[key(j)..key(j) + hd]) * scale)
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = e.iter().sum();
            let probs: Vec<f64> = e.iter().map(|x| x / total).collect();
            let dp: Vec<f64> = (lo..=pos)
                .map(|j| dot(drow, &v_cache[key(j)..key(j) + hd]))
                .collect();
            let mean: f64 = probs.iter().zip(&dp).map(|(p, d)| p * d).sum();
            for (i, j) in (lo..=pos).enumerate() {
                let ds = probs[i] * (dp[i] - mean);
                for d in 0..hd {
                    dv[key(j) + d] += probs[i] * drow[d];
                    dq[at + d] += scale * ds * k_cache[key(j) + d];
                    dk[key(j) + d] += scale * ds * qrow[d];
                }
            }
        }
    }
    (dq, dk, dv)
}

/// The log-sum-exp of each query row's and head's scaled scores over the
/// keys it sees, `[rows, n_heads]`: what [`attention`] normalizes by.
pub fn attention_lse(q: &[f64], k_cache: &[f64], a: &Attention, p: usize) -> Vec<f64> {
    let r::Heads { nh, nkv, hd, group } = r::Heads::of(a);
    let t_rows = rows(q, nh * hd);
    let mut out = Vec::with_capacity(t_rows * nh);
    for t in 0..t_rows {
        let (lo, pos) = r::keys_seen(a, p, t, t_rows);
        for h in 0..nh {
            let qrow = &q[(t * nh + h) * hd..][..hd];
            let key = |j: usize| &k_cache[(j * nkv + h / group) * hd..][..hd];
            let scores: Vec<f64> = (lo..=pos)
                .map(|j| {
                    qrow.iter().zip(key(j)).map(|(x, y)| x * y).sum::<f64>() * f64::from(a.scale)
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            out.push(max + scores.iter().map(|s| (s - max).exp()).sum::<f64>().ln());
        }
    }
    out
}

/// Mean cross-entropy of `vocab`-wide logits rows against `targets` (one
/// per row), and its gradient with respect to the logits:
/// `(softmax(row) − onehot(target)) / rows`.
pub fn cross_entropy(logits: &[f64], vocab: usize, targets: &[u32]) -> (f64, Vec<f64>) {
    let n = rows(logits, vocab);
    let mut loss = 0.0;
    let mut dl = vec![0.0; logits.len()];
    for (t, &target) in targets.iter().enumerate().take(n) {
        let row = &logits[t * vocab..(t + 1) * vocab];
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = row.iter().map(|v| (v - max).exp()).sum();
        loss += max + total.ln() - row[target as usize];
        for (i, v) in row.iter().enumerate() {
            let onehot = if i == target as usize { 1.0 } else { 0.0 };
            dl[t * vocab + i] = ((v - max).exp() / total - onehot) / n as f64;
        }
    }
    (loss / n.max(1) as f64, dl)
}

#[cfg(test)]
mod tests {
    //! Every gradient against central finite differences of the loss
    //! `L = Σ dy · f(inputs)` (or, for the cross-entropy, the loss itself)
    //! on random inputs, in f64: each partial derivative within 1e-6 of
    //! `(L(v + ε) − L(v − ε)) / 2ε`, relative to max(1, |derivative|).

    use super::*;
    use gerbil_ir::rope_table::rope_table;

    /// Uniform values in [-1, 1) from a fixed seed.
    fn random(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 11) as f64 / (1u64 << 52) as f64 - 1.0
            })
            .collect()
    }

    fn loss_of(dy: &[f64], y: &[f64]) -> f64 {
        dy.iter().zip(y).map(|(a, b)| a * b).sum()
    }

    /// Checks `grad` against finite differences of `loss` over `v`.
    fn check(what: &str, v: &[f64], grad: &[f64], loss: impl Fn(&[f64]) -> f64) {
        assert_eq!(v.len(), grad.len(), "{what}: gradient length");
        let eps = 1e-6;
        for i in 0..v.len() {
            let (mut up, mut down) = (v.to_vec(), v.to_vec());
            up[i] += eps;
            down[i] -= eps;
            let numeric = (loss(&up) - loss(&down)) / (2.0 * eps);
            let err = (numeric - grad[i]).abs() / numeric.abs().max(1.0);
            assert!(
                err < 1e-6,
                "{what}[{i}]: analytic {} vs numeric {numeric}",
                grad[i]
            );
        }
    }

    #[test]
    fn matmul_gradients() {
        let (m, k, n) = (3, 5, 4);
        let (x, w, dy) = (random(m * k, 1), random(n * k, 2), random(m * n, 3));
        let (dx, dw) = matmul(&x, k, &w, &dy);
        check("dx", &x, &dx, |x| loss_of(&dy, &r::matmul(x, k, &w, None)));
        check("dw", &w, &dw, |w| loss_of(&dy, &r::matmul(&x, k, w, None)));
    }

    #[test]
    fn rms_norm_gradients() {
        for (groups, offset) in [(1, 0.0), (3, 1.0)] {
            let n = RmsNorm {
                eps: 1e-5,
                weight_offset: offset,
                groups,
            };
            let h = 6;
            let rows = 2 * groups as usize;
            let (x, w, dy) = (random(rows * h, 4), random(h, 5), random(rows * h, 6));
            let (dx, dw) = rms_norm(&x, &w, &n, &dy);
            check("dx", &x, &dx, |x| loss_of(&dy, &r::rms_norm(x, &w, &n)));
            check("dw", &w, &dw, |w| loss_of(&dy, &r::rms_norm(&x, w, &n)));
        }
    }

    #[test]
    fn rope_gradient() {
        // Partial rotation: the dimensions past `rotary_dim` pass through.
        let spec = Rope {
            n_heads: 2,
            head_dim: 8,
            rotary_dim: 6,
        };
        let inv_freq: Vec<f32> = (0..3).map(|i| 10000f32.powf(-(i as f32) / 3.0)).collect();
        let table: Vec<f64> = rope_table(&inv_freq, 1.0, 16)
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect();
        let (x, dy) = (random(3 * 16, 7), random(3 * 16, 8));
        let dx = rope(&dy, &table, &spec, 5);
        check("dx", &x, &dx, |x| {
            loss_of(&dy, &r::rope(x, &table, &spec, 5))
        });
    }

    #[test]
    fn unary_and_glu_gradients() {
        let (x, u, dy) = (random(12, 9), random(12, 10), random(12, 11));
        let x: Vec<f64> = x.iter().map(|v| 3.0 * v).collect();
        for op in [
            UnaryOp::Silu,
            UnaryOp::GeluTanh,
            UnaryOp::Gelu,
            UnaryOp::Softcap(2.0),
        ] {
            let dx = unary(op, &x, &dy);
            check("unary", &x, &dx, |x| loss_of(&dy, &r::unary(op, x)));
            let glu_of = |g: &[f64], up: &[f64]| -> Vec<f64> {
                g.iter()
                    .zip(up)
                    .map(|(&g, &up)| r::unary_scalar(op, g) * up)
                    .collect()
            };
            let (dg, du) = glu(op, &x, &u, &dy);
            check("dgate", &x, &dg, |g| loss_of(&dy, &glu_of(g, &u)));
            check("dup", &u, &du, |up| loss_of(&dy, &glu_of(&x, up)));
        }
    }

    #[test]
    fn embedding_gradient_adds_repeated_ids() {
        let (vocab, width) = (5, 3);
        let e = Embedding {
            scale: Some(2.5),
            padding: None,
        };
        let ids = [3, 1, 3, 0];
        let (table, dy) = (random(vocab * width, 12), random(ids.len() * width, 13));
        let dt = embedding(&ids, width, vocab, &e, &dy);
        check("dtable", &table, &dt, |t| {
            loss_of(&dy, &r::embedding(t, width, &ids, &e))
        });
        assert!(
            dt[2 * width..3 * width].iter().all(|&g| g == 0.0),
            "row 2 unread"
        );
    }

    #[test]
    fn attention_gradients() {
        // GQA groups of 2; causal with and without a window; bidirectional.
        for (causal, window) in [(true, None), (true, Some(2)), (false, None)] {
            let a = Attention {
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 3,
                scale: 0.7,
                window,
                causal,
            };
            let (t, p) = (3, 2);
            let (qw, kw) = (4 * 3, 2 * 3);
            let q = random(t * qw, 14);
            let (kc, vc) = (random((p + t) * kw, 15), random((p + t) * kw, 16));
            let dy = random(t * qw, 17);
            let (dq, dk, dv) = attention(&q, &kc, &vc, &a, p, &dy);
            let f = |q: &[f64], k: &[f64], v: &[f64]| loss_of(&dy, &r::attention(q, k, v, &a, p));
            check("dq", &q, &dq, |q| f(q, &kc, &vc));
            check("dk", &kc, &dk, |k| f(&q, k, &vc));
            check("dv", &vc, &dv, |v| f(&q, &kc, v));
        }
    }

    #[test]
    fn attention_lse_normalizes_the_probabilities() {
        // exp(score − lse) summed over the keys a row sees is 1, and the
        // attention output is those weights times the values.
        let a = Attention {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 3,
            scale: 0.9,
            window: Some(2),
            causal: true,
        };
        let (t, p, kw) = (3, 1, 3);
        let q = random(t * 6, 19);
        let (kc, vc) = (random((p + t) * kw, 20), random((p + t) * kw, 21));
        let lse = attention_lse(&q, &kc, &a, p);
        let out = r::attention(&q, &kc, &vc, &a, p);
        for row in 0..t {
            let (lo, pos) = r::keys_seen(&a, p, row, t);
            for h in 0..2 {
                let qrow = &q[(row * 2 + h) * 3..][..3];
                let weight = |j: usize| {
                    let s: f64 = qrow.iter().zip(&kc[j * 3..][..3]).map(|(x, y)| x * y).sum();
                    (s * f64::from(a.scale) - lse[row * 2 + h]).exp()
                };
                let total: f64 = (lo..=pos).map(weight).sum();
                assert!((total - 1.0).abs() < 1e-12, "{total}");
                let first: f64 = (lo..=pos).map(|j| weight(j) * vc[j * 3]).sum();
                assert!((first - out[(row * 2 + h) * 3]).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn cross_entropy_gradient() {
        let vocab = 7;
        let logits: Vec<f64> = random(3 * vocab, 18).iter().map(|v| 4.0 * v).collect();
        let targets = [2, 6, 0];
        let (loss, dl) = cross_entropy(&logits, vocab, &targets);
        check("dlogits", &logits, &dl, |l| {
            cross_entropy(l, vocab, &targets).0
        });
        // Uniform logits: the loss is ln(vocab).
        let (flat, _) = cross_entropy(&vec![0.5; vocab], vocab, &[4]);
        assert!((flat - (vocab as f64).ln()).abs() < 1e-12, "{flat}");
        assert!(loss > 0.0);
    }
}
