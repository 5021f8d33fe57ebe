//! `fuse-last-row-matmul`: the matmuls after `slice_last_row` read the last
//! row themselves.
//!
//! Pattern: `l = slice_last_row(s)` whose readers are all `matmul` nodes
//! reading `l` as their input `x` only (any bias, norm prologue or residual,
//! not already `last_row`), and `l` is no graph output. Rewrite: each reader
//! `matmul(l, w, …)` becomes `matmul{last_row}(s, w, …)`, which reads row
//! `T − 1` of `s` where it would have read row 0 of `l`, and the slice dies:
//! one dispatch and one `[1, W]` buffer fewer.
//!
//! In a pre-norm decoder this is the LM head: `slice-last-row` leaves
//! `lm_head(rms_norm(slice_last_row(stream)))`, `fuse-norm-matmul` moves the
//! final norm into the LM head (its slice reads the last `down_proj`, whose
//! residual add `fuse-matmul-residual` took), and this pass removes the slice,
//! so the last layer is as many dispatches as any other. Gemma 3's last
//! stream value is an `add` of a post-norm: there the final norm stays with
//! the add (`add_rms_norm_last_row`), which adds only the last row, and no
//! matmul reads a slice.

use crate::manager::{Pass, PassError};
use crate::rewrite::{add_err, join_labels, remove_if_dead};
use gerbil_ir::{Graph, MatMul, NodeId, Op, ValueRef};

/// Folds `slice_last_row` into the matmuls that read it.
pub struct FuseLastRowMatMul;

/// The reader `u` of a slice, reading it on `port`, as a `last_row` matmul,
/// if it can be one: a matmul reading the slice as `x` (a reader that also
/// reads it on another port is listed twice, and fails there).
fn as_last_row(graph: &Graph, u: NodeId, port: u32) -> Option<MatMul> {
    match &graph.node(u).op {
        Op::MatMul(m) if !m.last_row && port == 0 => Some(MatMul {
            last_row: true,
            ..m.clone()
        }),
        _ => None,
    }
}

impl Pass for FuseLastRowMatMul {
    fn name(&self) -> &'static str {
        "fuse-last-row-matmul"
    }

    fn description(&self) -> &'static str {
        "fold matmul(slice_last_row(s), w, …) into matmul{last_row}(s, w, …)"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, PassError> {
        let order = graph.topo_order().unwrap_or_default();
        let mut rewrites = 0;
        for id in order {
            if graph.g.node_weight(id).is_none() || graph.node(id).op != Op::SliceLastRow {
                continue;
            }
            let l = ValueRef::of(id);
            let s = graph.inputs(id)[0];
            let users = graph.users(l);
            if users.is_empty() || graph.is_output(l) {
                continue;
            }
            let fused: Option<Vec<(NodeId, MatMul)>> = users
                .iter()
                .map(|&(u, port)| Some((u, as_last_row(graph, u, port)?)))
                .collect();
            let Some(fused) = fused else {
                continue;
            };
            for (u, mm) in fused {
                let mut inputs = graph.inputs(u);
                inputs[0] = s;
                let label = join_labels(&[&graph.node(id).label, &graph.node(u).label]);
                let new = graph
                    .add(Op::MatMul(mm), &inputs, label)
                    .map_err(add_err(self.name()))?;
                graph.replace_all_uses(ValueRef::of(u), new);
                remove_if_dead(graph, u);
            }
            remove_if_dead(graph, id);
            rewrites += 1;
        }
        Ok(rewrites)
    }
}
