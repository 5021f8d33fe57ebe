//! `fuse-swiglu` and `fuse-geglu`: the gated activation in the matmul's
//! epilogue.
//!
//! Pattern: `mul(act(slice_cols[0..I](gu)), slice_cols[I..2I](gu))` where
//! `gu = matmul(x, W[2I, K] (, b))` is read only by the two slices, and `act`
//! is SiLU (`fuse-swiglu`) or GELU-tanh (`fuse-geglu`). This is what
//! `fuse-gate-up` leaves. Rewrite: `matmul_swiglu(x, W (, b))` /
//! `matmul_geglu(..)`, one dispatch computing `act(x·w[n]) · (x·w[I+n])` for
//! `n < I`, instead of five (matmul, two slices, act, mul).

use crate::manager::{Pass, PassError};
use crate::rewrite::{add_err, op_of, remove_if_dead};
use gerbil_ir::{BinaryOp, Graph, MatMulGlu, Op, UnaryOp, ValueRef};

/// Folds a gated activation into the gate/up matmul.
pub struct FuseGlu {
    /// The activation this instance folds.
    pub act: UnaryOp,
}

impl Pass for FuseGlu {
    fn name(&self) -> &'static str {
        match self.act {
            UnaryOp::GeluTanh => "fuse-geglu",
            _ => "fuse-swiglu",
        }
    }

    fn description(&self) -> &'static str {
        match self.act {
            UnaryOp::GeluTanh => "fold gelu_tanh(gate) * up into the gate/up matmul's epilogue",
            _ => "fold silu(gate) * up into the gate/up matmul's epilogue",
        }
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
            if *op_of(graph, a) != Op::Unary(self.act) {
                continue;
            }
            let g = graph.inputs(a.node)[0];
            let (Op::SliceCols { start: 0, len: i }, Op::SliceCols { start: us, len: ul }) =
                (op_of(graph, g).clone(), op_of(graph, u).clone())
            else {
                continue;
            };
            let m = graph.inputs(g.node)[0];
            // A norm prologue carries over (same inputs); a residual or a
            // last-row read cannot.
            let Op::MatMul(mm) = op_of(graph, m).clone() else {
                continue;
            };
            if mm.residual || mm.last_row {
                continue;
            }
            let only = |v: ValueRef, users: &[gerbil_ir::NodeId]| {
                !graph.is_output(v) && graph.users(v).iter().all(|(n, _)| users.contains(n))
            };
            if us != i
                || ul != i
                || graph.inputs(u.node)[0] != m
                || graph.value_type(m).last_const() != Some(2 * i)
                || !only(m, &[g.node, u.node])
                || !only(g, &[a.node])
                || !only(a, &[id])
                || !only(u, &[id])
            {
                continue;
            }
            let label = graph.node(m.node).label.clone();
            let glu = graph
                .add(
                    Op::MatMulGlu(MatMulGlu {
                        act: self.act,
                        has_bias: mm.has_bias,
                        norm: mm.norm,
                    }),
                    &graph.inputs(m.node),
                    label,
                )
                .map_err(add_err(self.name()))?;
            graph.replace_all_uses(ValueRef::of(id), glu);
            remove_if_dead(graph, id);
            rewrites += 1;
        }
        Ok(rewrites)
    }
}
