//! `fuse-matmul-bias`: the bias add in the matmul's epilogue.
//!
//! Pattern: `y = add_bias(m, b)` where `m = matmul(x, w)` (no bias yet) is
//! read by nothing else. Rewrite: `y = matmul{bias}(x, w, b)`: the kernel
//! adds `b[n]` to each output as it stores it, one dispatch instead of two.
//! Runs before `fuse-qkv` and `fuse-gate-up`, which stack biased matmuls.

use crate::manager::{Pass, PassError};
use crate::rewrite::replace_node;
use gerbil_ir::{Graph, MatMul, Op};

/// Folds bias adds into matmuls.
pub struct FuseMatMulBias;

impl Pass for FuseMatMulBias {
    fn name(&self) -> &'static str {
        "fuse-matmul-bias"
    }

    fn description(&self) -> &'static str {
        "fold add_bias(matmul(x, w), b) into matmul{bias}(x, w, b)"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, PassError> {
        let order = graph.topo_order().unwrap_or_default();
        let mut rewrites = 0;
        for id in order {
            if graph.g.node_weight(id).is_none() || graph.node(id).op != Op::AddBias {
                continue;
            }
            let [m, b] = graph.inputs(id)[..] else {
                continue;
            };
            let plain = graph.node(m.node).op == Op::MatMul(MatMul::linear(false));
            if !plain || graph.users(m).len() != 1 || graph.is_output(m) {
                continue;
            }
            let xw = graph.inputs(m.node);
            let label = graph.node(m.node).label.clone();
            let op = Op::MatMul(MatMul::linear(true));
            replace_node(graph, id, op, &[xw[0], xw[1], b], label, self.name())?;
            rewrites += 1;
        }
        Ok(rewrites)
    }
}
