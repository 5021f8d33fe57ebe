//! `fuse-norm-matmul`: the RMSNorm as the prologue of the matmuls that read it.
//!
//! Pattern: `n = rms_norm(s, g)` (one group, any weight offset, so Gemma's
//! `(1 + w)` too) whose readers are all `matmul` or `matmul_glu` nodes
//! without a norm, each reading `n` as its input `x` only, and `n` is no
//! graph output. Rewrite: each reader `matmul(n, w (, b) (, r))` becomes
//! `matmul{norm}(s, w (, b), g (, r))` (the same for the gated matmuls), and
//! the norm dies. Each workgroup of the fused kernel recomputes its rows'
//! inverse RMS, which is cheap at these widths, and the norm's dispatch and
//! its `[T, K]` result are gone.
//!
//! In a pre-norm decoder this fuses each layer's input norm into the q/k/v
//! matmul and its post-attention norm into the gate/up matmul.
//! The final norm reads `slice_last_row` of the stream. It moves into the LM
//! head when the stream's last value is a matmul (its residual add fused, the
//! Llama family), and `fuse-last-row-matmul` then folds the slice in too. It
//! is left alone when it reads `slice_last_row(add(a, b))` with the add read
//! by nothing else (Gemma 3's post-norm sum): `fuse-residual-norm` makes that
//! one `add_rms_norm_last_row`, which adds only the last row, while fusing
//! the norm would leave an add of every row. Runs before
//! `fuse-residual-norm`, which would otherwise claim the norms.

use crate::manager::{Pass, PassError};
use crate::rewrite::{add_err, feeds_final_norm, join_labels, op_of, remove_if_dead};
use gerbil_ir::{BinaryOp, Graph, MatMul, MatMulGlu, NodeId, NormPrologue, Op, ValueRef};

/// Folds RMSNorms into the matmuls that read them.
pub struct FuseNormMatMul;

/// The reader `op` with the norm `p` as its prologue, if it can take one.
fn with_norm(op: &Op, p: NormPrologue) -> Option<(Op, usize)> {
    match op {
        Op::MatMul(m) if m.norm.is_none() => {
            let fused = MatMul {
                norm: Some(p),
                ..m.clone()
            };
            let port = fused.ports().norm?;
            Some((Op::MatMul(fused), port))
        }
        Op::MatMulGlu(m) if m.norm.is_none() => {
            let fused = MatMulGlu {
                norm: Some(p),
                ..m.clone()
            };
            let port = fused.ports().norm?;
            Some((Op::MatMulGlu(fused), port))
        }
        _ => None,
    }
}

/// Whether `s` is the last row of an add read by nothing else (the final
/// norm's input, better fused by `fuse-residual-norm`).
fn is_last_row_of_add(graph: &Graph, s: ValueRef) -> bool {
    if *op_of(graph, s) != Op::SliceLastRow {
        return false;
    }
    let sum = graph.inputs(s.node)[0];
    *op_of(graph, sum) == Op::Binary(BinaryOp::Add) && feeds_final_norm(graph, sum)
}

impl Pass for FuseNormMatMul {
    fn name(&self) -> &'static str {
        "fuse-norm-matmul"
    }

    fn description(&self) -> &'static str {
        "fold rms_norm(s, g) into the prologue of every matmul that reads it"
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
            let n = ValueRef::of(id);
            let [s, g] = graph.inputs(id)[..] else {
                continue;
            };
            let users = graph.users(n);
            if norm.groups != 1
                || users.is_empty()
                || graph.is_output(n)
                || is_last_row_of_add(graph, s)
            {
                continue;
            }
            let prologue = NormPrologue {
                eps: norm.eps,
                weight_offset: norm.weight_offset,
            };
            let fused: Option<Vec<(NodeId, Op, usize)>> = users
                .iter()
                .map(|&(u, port)| {
                    let (op, norm_port) = with_norm(&graph.node(u).op, prologue)?;
                    (port == 0).then_some((u, op, norm_port))
                })
                .collect();
            let Some(fused) = fused else {
                continue;
            };
            for (u, op, norm_port) in fused {
                let mut inputs = graph.inputs(u);
                inputs[0] = s;
                inputs.insert(norm_port, g);
                let label = join_labels(&[&graph.node(id).label, &graph.node(u).label]);
                let new = graph
                    .add(op, &inputs, label)
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
