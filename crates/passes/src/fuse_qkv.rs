//! `fuse-qkv`: one matmul for an attention layer's q, k and v projections.
//!
//! Pattern: an `attention(q, cache_write(kc, k), cache_write(vc, v))` whose
//! `q`, `k` and `v` each lead back (through `rope` and `rms_norm`,
//! along input 0) to a matmul, the three reading the same `x`,
//! all with a bias or none, each read only on that path. Rewrite:
//! `qkv = matmul(x, concat(Wq, Wk, Wv))` producing `[T, q + k + v]`, and a
//! `slice_cols` of it in place of each projection. `fuse-qkv-rope` then
//! folds the slices into the post-projection kernel.

use crate::manager::{Pass, PassError};
use crate::rewrite::{merge_matmuls, op_of};
use gerbil_ir::{Graph, NodeId, Op, ValueRef};

/// Merges q/k/v projections.
pub struct FuseQkv;

/// The matmul that `v` comes from through ops that keep columns apart.
fn projection(graph: &Graph, mut v: ValueRef) -> Option<NodeId> {
    loop {
        match op_of(graph, v) {
            Op::MatMul(_) => {
                let single = graph.users(v).len() == 1 && !graph.is_output(v);
                return single.then_some(v.node);
            }
            Op::Rope(_) | Op::RmsNorm(_) => v = graph.inputs(v.node)[0],
            _ => return None,
        }
    }
}

/// The value a `cache_write` writes, if `v` is one.
fn written(graph: &Graph, v: ValueRef) -> Option<ValueRef> {
    matches!(op_of(graph, v), Op::CacheWrite).then(|| graph.inputs(v.node)[1])
}

impl Pass for FuseQkv {
    fn name(&self) -> &'static str {
        "fuse-qkv"
    }

    fn description(&self) -> &'static str {
        "merge an attention layer's q, k and v matmuls into one over the stacked weight"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, PassError> {
        let order = graph.topo_order().unwrap_or_default();
        let mut rewrites = 0;
        for id in order {
            if graph.g.node_weight(id).is_none() || !matches!(graph.node(id).op, Op::Attention(_)) {
                continue;
            }
            let ins = graph.inputs(id);
            let found = (|| {
                let q = projection(graph, ins[0])?;
                let k = projection(graph, written(graph, ins[1])?)?;
                let v = projection(graph, written(graph, ins[2])?)?;
                (q != k && k != v && q != v).then_some([q, k, v])
            })();
            if let Some(mms) = found {
                rewrites += usize::from(merge_matmuls(graph, self.name(), &mms)?.is_some());
            }
        }
        Ok(rewrites)
    }
}
