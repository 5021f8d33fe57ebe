//! `fuse-gate-up`: one matmul for an MLP's gate and up projections.
//!
//! Pattern: `mul(act(matmul(x, Wg)), matmul(x, Wu))` with `act` SiLU or GELU,
//! both matmuls reading the same `x` (both with a bias or neither) and read
//! only there. Rewrite: `gu = matmul(x, concat(Wg, Wu))` over `[2I, K]` (a
//! `Concat` of the checkpoint tensors, or one `Rows` range of Phi-3's
//! `gate_up_proj`), and `slice_cols` of its two halves in place of the two
//! matmuls. On its own this trades a dispatch for two slices; `fuse-swiglu`
//! / `fuse-geglu` then fold the slices, the activation and the product into
//! the matmul's epilogue.

use crate::manager::{Pass, PassError};
use crate::rewrite::{merge_matmuls, op_of};
use gerbil_ir::{BinaryOp, Graph, Op, UnaryOp, ValueRef};

/// Merges gate and up projections.
pub struct FuseGateUp;

impl Pass for FuseGateUp {
    fn name(&self) -> &'static str {
        "fuse-gate-up"
    }

    fn description(&self) -> &'static str {
        "merge an MLP's gate and up matmuls into one over the stacked weight"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, PassError> {
        let order = graph.topo_order().unwrap_or_default();
        let mut rewrites = 0;
        for id in order {
            if graph.g.node_weight(id).is_none()
                || !matches!(graph.node(id).op, Op::Binary(BinaryOp::Mul))
            {
                continue;
            }
            let ins = graph.inputs(id);
            let (a, u) = (ins[0], ins[1]);
            if !matches!(
                op_of(graph, a),
                Op::Unary(UnaryOp::Silu | UnaryOp::GeluTanh)
            ) {
                continue;
            }
            let g = graph.inputs(a.node)[0];
            let only_user = |v: ValueRef, user| graph.users(v).iter().all(|(n, _)| *n == user);
            if !matches!(op_of(graph, g), Op::MatMul(_))
                || !matches!(op_of(graph, u), Op::MatMul(_))
                || g.node == u.node
                || !only_user(g, a.node)
                || !only_user(u, id)
                || graph.is_output(g)
                || graph.is_output(u)
            {
                continue;
            }
            rewrites +=
                usize::from(merge_matmuls(graph, self.name(), &[g.node, u.node])?.is_some());
        }
        Ok(rewrites)
    }
}
