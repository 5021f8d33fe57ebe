//! `fuse-residual-norm`: a residual add and the RMSNorm that reads it, in one
//! kernel with two outputs.
//!
//! Pattern: `n = rms_norm(s, w)` (one group, any weight offset, so Gemma's
//! `(1 + w)` too) where `s = add(a, b)`. Rewrite: `(s', n') = add_rms_norm(a,
//! b, w)`; readers of `s` (the residual stream) read output 0, readers of
//! `n` output 1. In a pre-norm decoder this fuses each layer's two residual
//! adds with the norms after them (the MLP's add with the next layer's input
//! norm); in Gemma 3's sandwich layout, the adds with the pre-MLP and next
//! input norms (its post-norms read a matmul, not an add, and stay).
//! The final norm reads `slice_last_row(s)` after `slice-last-row`, so the
//! last add stays on its own.

use crate::manager::{Pass, PassError};
use crate::rewrite::{add_err, join_labels, op_of, remove_if_dead};
use gerbil_ir::{BinaryOp, Graph, Op, ValueRef};

/// Fuses residual adds with the norms after them.
pub struct FuseResidualNorm;

impl Pass for FuseResidualNorm {
    fn name(&self) -> &'static str {
        "fuse-residual-norm"
    }

    fn description(&self) -> &'static str {
        "fuse add(a, b) and the rms_norm reading it into add_rms_norm with both results"
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        let order = graph.topo_order().unwrap_or_default();
        let mut changed = false;
        for id in order {
            if graph.g.node_weight(id).is_none() {
                continue;
            }
            let Op::RmsNorm(norm) = graph.node(id).op.clone() else {
                continue;
            };
            let ins = graph.inputs(id);
            let s = ins[0];
            if norm.groups != 1 || *op_of(graph, s) != Op::Binary(BinaryOp::Add) {
                continue;
            }
            let ab = graph.inputs(s.node);
            let label = join_labels(&[&graph.node(s.node).label, &graph.node(id).label]);
            let fused = graph
                .add(Op::AddRmsNorm(norm), &[ab[0], ab[1], ins[1]], label)
                .map_err(add_err(self.name()))?;
            graph.replace_all_uses(s, fused);
            graph.replace_all_uses(
                ValueRef::of(id),
                ValueRef {
                    node: fused.node,
                    port: 1,
                },
            );
            remove_if_dead(graph, id);
            remove_if_dead(graph, s.node);
            changed = true;
        }
        Ok(changed)
    }
}
