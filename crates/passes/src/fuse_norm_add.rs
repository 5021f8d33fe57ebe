//! `fuse-norm-add`: a norm and the residual add that reads it, in one kernel.
//!
//! Pattern: `s = add(r, n)` (either order) where `n = rms_norm(x, w)` has
//! one group and no other reader. Rewrite: `s' = rms_norm_add(x, w, r)`.
//! Gemma 3's sandwich layers normalize each block's output before adding
//! it to the stream (`post_attention_layernorm`, `post_feedforward_layernorm`):
//! their norms read a matmul and their adds read the norms, so neither
//! `fuse-matmul-residual` nor `fuse-residual-norm` reaches them. It runs
//! after `fuse-residual-norm`, which keeps the adds it fuses with the norm
//! after them (the last layer's, with the final norm).

use crate::manager::{Pass, PassError};
use crate::rewrite::fuse_adds;
use gerbil_ir::{Graph, NodeId, Op, RmsNorm, ValueRef};

/// Fuses post-norms with the residual adds that read them.
pub struct FuseNormAdd;

/// The norm node, its op and the other operand, if `add(a, b)` reads a
/// sole-reader one-group `rms_norm` on one side (the left one if both).
fn post_norm(graph: &Graph, a: ValueRef, b: ValueRef) -> Option<(NodeId, RmsNorm, ValueRef)> {
    [(a, b), (b, a)]
        .into_iter()
        .find_map(|(v, r)| match &graph.node(v.node).op {
            Op::RmsNorm(n) if n.groups == 1 && graph.users(v).len() == 1 && !graph.is_output(v) => {
                Some((v.node, n.clone(), r))
            }
            _ => None,
        })
}

impl Pass for FuseNormAdd {
    fn name(&self) -> &'static str {
        "fuse-norm-add"
    }

    fn description(&self) -> &'static str {
        "fuse rms_norm and the residual add reading it into rms_norm_add"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, PassError> {
        fuse_adds(graph, self.name(), |graph, a, b| {
            let (norm, n, residual) = post_norm(graph, a, b)?;
            let xw = graph.inputs(norm);
            Some((norm, Op::RmsNormAdd(n), vec![xw[0], xw[1], residual]))
        })
    }
}
