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
use gerbil_ir::{BinaryOp, Graph, NodeId, Op, RmsNorm, ValueRef};

/// Fuses residual adds (and the embedding) with the norms after them.
pub struct FuseResidualNorm;

/// A match: the fused op and its inputs, the value its output 0 replaces, and
/// the producer nodes that die with the norm.
struct Fusion {
    op: Op,
    inputs: Vec<ValueRef>,
    stream: ValueRef,
    producers: Vec<NodeId>,
}

/// Which form `norm = rms_norm(x, w)` takes, if any.
fn match_norm(graph: &Graph, norm: &RmsNorm, x: ValueRef, w: ValueRef) -> Option<Fusion> {
    let norm = norm.clone();
    match op_of(graph, x).clone() {
        // rms_norm(slice_last_row(add(a, b))), the add read by nothing else.
        Op::SliceLastRow => {
            let s = graph.inputs(x.node)[0];
            let sole = graph.users(s).len() == 1 && !graph.is_output(s);
            (*op_of(graph, s) == Op::Binary(BinaryOp::Add) && sole).then(|| {
                let ab = graph.inputs(s.node);
                Fusion {
                    op: Op::AddRmsNormLastRow(norm),
                    inputs: vec![ab[0], ab[1], w],
                    stream: x,
                    producers: vec![x.node, s.node],
                }
            })
        }
        // rms_norm(embedding(table, ids)).
        Op::Embedding(e) => {
            let lookup = graph.inputs(x.node);
            Some(Fusion {
                op: Op::EmbeddingRmsNorm(e, norm),
                inputs: vec![lookup[0], lookup[1], w],
                stream: x,
                producers: vec![x.node],
            })
        }
        // rms_norm(add(a, b)).
        Op::Binary(BinaryOp::Add) => {
            let ab = graph.inputs(x.node);
            Some(Fusion {
                op: Op::AddRmsNorm(norm),
                inputs: vec![ab[0], ab[1], w],
                stream: x,
                producers: vec![x.node],
            })
        }
        _ => None,
    }
}

impl Pass for FuseResidualNorm {
    fn name(&self) -> &'static str {
        "fuse-residual-norm"
    }

    fn description(&self) -> &'static str {
        "fuse add(a, b) and the rms_norm reading it into add_rms_norm with both results"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, PassError> {
        let order = graph.topo_order().unwrap_or_default();
        let mut rewrites = 0;
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
            let Some(f) = match_norm(graph, &norm, ins[0], ins[1]) else {
                continue;
            };
            let first = f.producers.last().copied().unwrap_or(id);
            let label = join_labels(&[&graph.node(first).label, &graph.node(id).label]);
            let fused = graph
                .add(f.op, &f.inputs, label)
                .map_err(add_err(self.name()))?;
            graph.replace_all_uses(f.stream, fused);
            graph.replace_all_uses(
                ValueRef::of(id),
                ValueRef {
                    node: fused.node,
                    port: 1,
                },
            );
            remove_if_dead(graph, id);
            for p in f.producers {
                remove_if_dead(graph, p);
            }
            rewrites += 1;
        }
        Ok(rewrites)
    }
}
