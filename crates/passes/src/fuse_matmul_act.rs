//! `fuse-matmul-act`: an activation in the matmul's epilogue.
//!
//! Pattern: `y = silu(m)`, `gelu(m)` or `gelu_tanh(m)` where `m =
//! matmul(x, w (, b))` (any norm prologue, no residual, no activation yet)
//! is read by nothing else and is no graph output. Rewrite: `y =
//! matmul{act}(x, w (, b))`: the kernel applies the activation to each
//! output, after its bias, as it stores it — one dispatch and one pass over
//! `[T, N]` fewer. This is BERT's MLP, `gelu(x·W₁ + b₁)`. Runs after the
//! gated fusions (`fuse-swiglu`, `fuse-geglu`), which would otherwise lose
//! their gate to it, and before `fuse-matmul-residual`, whose residual the
//! epilogue adds after the activation.

use crate::manager::{Pass, PassError};
use crate::rewrite::{join_labels, op_of, replace_node};
use gerbil_ir::{Graph, MatMul, Op, UnaryOp};

/// Folds activations into the matmuls they read.
pub struct FuseMatMulAct;

impl Pass for FuseMatMulAct {
    fn name(&self) -> &'static str {
        "fuse-matmul-act"
    }

    fn description(&self) -> &'static str {
        "fold gelu(matmul(x, w, b)) (or silu, gelu_tanh) into matmul{act}(x, w, b)"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, PassError> {
        let order = graph.topo_order().unwrap_or_default();
        let mut rewrites = 0;
        for id in order {
            if graph.g.node_weight(id).is_none() {
                continue;
            }
            let act = match graph.node(id).op {
                Op::Unary(a @ (UnaryOp::Silu | UnaryOp::Gelu | UnaryOp::GeluTanh)) => a,
                _ => continue,
            };
            let [m] = graph.inputs(id)[..] else {
                continue;
            };
            let mm = match op_of(graph, m) {
                Op::MatMul(mm) if mm.act.is_none() && !mm.residual => mm.clone(),
                _ => continue,
            };
            if graph.users(m).len() != 1 || graph.is_output(m) {
                continue;
            }
            let inputs = graph.inputs(m.node);
            let label = join_labels(&[&graph.node(m.node).label, &graph.node(id).label]);
            let op = Op::MatMul(MatMul {
                act: Some(act),
                ..mm
            });
            replace_node(graph, id, op, &inputs, label, self.name())?;
            rewrites += 1;
        }
        Ok(rewrites)
    }
}
