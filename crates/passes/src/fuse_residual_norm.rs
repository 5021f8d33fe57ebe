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
//! The final norm reads `slice_last_row(s)` after `slice-last-row`: when the
//! slice is the add's only reader, `n = rms_norm(slice_last_row(add(a, b)), w)`
//! becomes `add_rms_norm_last_row(a, b, w)`, which adds and normalizes the
//! last row only. The stream's first value, the embedding lookup, is fused
//! the same way with the norm that reads it: `rms_norm(embedding(t, ids), w)`
//! becomes `embedding_rms_norm(t, ids, w)` with both results.

use crate::manager::{Pass, PassError};
use crate::rewrite::{add_err, join_labels, op_of, remove_if_dead};
use gerbil_ir::{BinaryOp, Graph, Op, ValueRef};

/// Fuses residual adds with the norms after them.
pub struct FuseResidualNorm;

impl FuseResidualNorm {
    /// The last-row form: `norm = rms_norm(x, w)` with `x = slice_last_row(s)`,
    /// `s = add(a, b)` read by nothing but the slice. Returns `Some(true)` if
    /// it rewrote, `None` if `x` is not such a slice.
    fn last_row(
        &self,
        graph: &mut Graph,
        norm_id: gerbil_ir::NodeId,
        norm: &gerbil_ir::RmsNorm,
        x: ValueRef,
        w: ValueRef,
    ) -> Result<Option<bool>, PassError> {
        if *op_of(graph, x) != Op::SliceLastRow {
            return Ok(None);
        }
        let s = graph.inputs(x.node)[0];
        let sole_reader = graph.users(s).len() == 1 && !graph.is_output(s);
        if *op_of(graph, s) != Op::Binary(BinaryOp::Add) || !sole_reader {
            return Ok(None);
        }
        let ab = graph.inputs(s.node);
        let label = join_labels(&[&graph.node(s.node).label, &graph.node(norm_id).label]);
        let fused = graph
            .add(
                Op::AddRmsNormLastRow(norm.clone()),
                &[ab[0], ab[1], w],
                label,
            )
            .map_err(add_err(self.name()))?;
        graph.replace_all_uses(x, fused);
        graph.replace_all_uses(
            ValueRef::of(norm_id),
            ValueRef {
                node: fused.node,
                port: 1,
            },
        );
        remove_if_dead(graph, norm_id);
        remove_if_dead(graph, x.node);
        remove_if_dead(graph, s.node);
        Ok(Some(true))
    }
}

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
            if norm.groups != 1 {
                continue;
            }
            if let Some(fused) = self.last_row(graph, id, &norm, ins[0], ins[1])? {
                changed |= fused;
                continue;
            }
            if let Op::Embedding(e) = op_of(graph, ins[0]).clone() {
                let x = ins[0];
                let lookup = graph.inputs(x.node);
                let label = join_labels(&[&graph.node(x.node).label, &graph.node(id).label]);
                let fused = graph
                    .add(
                        Op::EmbeddingRmsNorm(e, norm.clone()),
                        &[lookup[0], lookup[1], ins[1]],
                        label,
                    )
                    .map_err(add_err(self.name()))?;
                graph.replace_all_uses(x, fused);
                graph.replace_all_uses(
                    ValueRef::of(id),
                    ValueRef {
                        node: fused.node,
                        port: 1,
                    },
                );
                remove_if_dead(graph, id);
                remove_if_dead(graph, x.node);
                changed = true;
                continue;
            }
            let s = ins[0];
            if *op_of(graph, s) != Op::Binary(BinaryOp::Add) {
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
