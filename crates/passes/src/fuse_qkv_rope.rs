//! `fuse-qkv-rope`: an attention layer's post-projection work in one kernel.
//!
//! Pattern, for `attention(q', kc', vc')` with a fused `qkv` value of width
//! `(H + 2·KV)·D` (what `fuse-qkv` leaves):
//!
//! ```text
//! q  = slice_cols[0..H·D](qkv)            k = slice_cols[H·D..(H+KV)·D](qkv)
//! q  = rms_norm{groups=H}(q, wq)          k = rms_norm{groups=KV}(k, wk)    (optional, both or neither)
//! q' = rope(q, table)                     kc' = cache_write(kc, rope(k, table))
//! vc' = cache_write(vc, slice_cols[(H+KV)·D..](qkv))
//! ```
//!
//! Rewrite: `(q', kc', vc') = qkv_rope(qkv, table, kc, vc[, wq, wk])`, one
//! dispatch instead of up to seven. Its outputs 1 and 2 are the caches,
//! written in place like `cache_write`'s. Intermediate values that something
//! else still reads are left computed.

use crate::manager::{Pass, PassError};
use crate::rewrite::{add_err, join_labels, op_of, remove_if_dead};
use gerbil_ir::{Graph, NodeId, Op, QkNorm, QkvRope, RmsNorm, Rope, ValueRef};

/// Fuses q/k/v slicing, q/k norms, RoPE and the cache writes.
pub struct FuseQkvRope;

/// A slice of the fused row: `(qkv, start, len, norm)`, the norm being
/// `rms_norm`'s attributes and weight when one follows the slice.
type Sliced = (ValueRef, u64, u64, Option<(RmsNorm, ValueRef)>);

/// `(qkv, start, len, norm)` for a value `slice_cols(qkv)` or
/// `rms_norm(slice_cols(qkv), w)`.
fn sliced(graph: &Graph, v: ValueRef) -> Option<Sliced> {
    let (s, norm) = match op_of(graph, v) {
        Op::RmsNorm(n) => {
            let ins = graph.inputs(v.node);
            (ins[0], Some((n.clone(), ins[1])))
        }
        _ => (v, None),
    };
    match op_of(graph, s) {
        Op::SliceCols { start, len } => Some((graph.inputs(s.node)[0], *start, *len, norm)),
        _ => None,
    }
}

struct Match {
    op: QkvRope,
    inputs: Vec<ValueRef>,
    /// q', kc', vc'.
    outs: [ValueRef; 3],
}

fn find(graph: &Graph, attn: NodeId) -> Option<Match> {
    let Op::Attention(a) = op_of(graph, ValueRef::of(attn)) else {
        return None;
    };
    let ins = graph.inputs(attn);
    let (qr, kw, vw) = (ins[0], ins[1], ins[2]);
    let Op::Rope(rq) = op_of(graph, qr) else {
        return None;
    };
    if !matches!(op_of(graph, kw), Op::CacheWrite) || !matches!(op_of(graph, vw), Op::CacheWrite) {
        return None;
    }
    let (kc_in, vc_in) = (graph.inputs(kw.node), graph.inputs(vw.node));
    let kr = kc_in[1];
    let Op::Rope(rk) = op_of(graph, kr) else {
        return None;
    };
    let (q_in, k_in) = (graph.inputs(qr.node), graph.inputs(kr.node));
    let table = q_in[1];
    let (qkv, qs, ql, qn) = sliced(graph, q_in[0])?;
    let (kqkv, ks, kl, kn) = sliced(graph, k_in[0])?;
    let (vqkv, vs, vl, vn) = sliced(graph, vc_in[1])?;
    let d = u64::from(a.head_dim);
    let (qw, kvw) = (u64::from(a.n_heads) * d, u64::from(a.n_kv_heads) * d);
    let shapes_fit = kqkv == qkv
        && vqkv == qkv
        && vn.is_none()
        && k_in[1] == table
        && (qs, ql, ks, kl, vs, vl) == (0, qw, qw, kvw, qw + kvw, kvw)
        && graph.value_type(qkv).last_const() == Some(qw + 2 * kvw)
        && *rq
            == Rope {
                n_heads: a.n_heads,
                head_dim: a.head_dim,
                rotary_dim: rq.rotary_dim,
            }
        && *rk
            == Rope {
                n_heads: a.n_kv_heads,
                head_dim: a.head_dim,
                rotary_dim: rq.rotary_dim,
            };
    if !shapes_fit {
        return None;
    }
    let mut inputs = vec![qkv, table, kc_in[0], vc_in[0]];
    let qk_norm = match (qn, kn) {
        (None, None) => None,
        (Some((nq, wq)), Some((nk, wk)))
            if nq.eps == nk.eps
                && nq.weight_offset == nk.weight_offset
                && nq.groups == a.n_heads
                && nk.groups == a.n_kv_heads =>
        {
            inputs.extend([wq, wk]);
            Some(QkNorm {
                eps: nq.eps,
                weight_offset: nq.weight_offset,
            })
        }
        _ => return None,
    };
    Some(Match {
        op: QkvRope {
            n_heads: a.n_heads,
            n_kv_heads: a.n_kv_heads,
            head_dim: a.head_dim,
            rotary_dim: rq.rotary_dim,
            qk_norm,
        },
        inputs,
        outs: [qr, kw, vw],
    })
}

impl Pass for FuseQkvRope {
    fn name(&self) -> &'static str {
        "fuse-qkv-rope"
    }

    fn description(&self) -> &'static str {
        "fuse q/k/v slices, q/k norms, rope and cache writes into qkv_rope"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, PassError> {
        let order = graph.topo_order().unwrap_or_default();
        let mut rewrites = 0;
        for id in order {
            if graph.g.node_weight(id).is_none() {
                continue;
            }
            let Some(m) = find(graph, id) else {
                continue;
            };
            let labels: Vec<String> = m
                .outs
                .iter()
                .map(|v| graph.node(v.node).label.clone())
                .collect();
            let label = join_labels(&[&labels[0], &labels[1], &labels[2]]);
            let fused = graph
                .add(Op::QkvRope(m.op), &m.inputs, label)
                .map_err(add_err(self.name()))?;
            for (port, old) in m.outs.iter().enumerate() {
                graph.replace_all_uses(
                    *old,
                    ValueRef {
                        node: fused.node,
                        port: port as u32,
                    },
                );
            }
            for old in m.outs {
                remove_if_dead(graph, old.node);
            }
            rewrites += 1;
        }
        Ok(rewrites)
    }
}
