//! `fuse-matmul-residual`: the residual add in the matmul's epilogue.
//!
//! Pattern: `y = add(m, r)` or `add(r, m)` where `m = matmul(x, w (, b))`
//! (any norm prologue, no residual yet) is read by nothing but that add and
//! is no graph output. Rewrite: `y = matmul{residual}(x, w (, b) (, g), r)`:
//! the kernel adds `r[row, n]` to each output as it stores it, one dispatch
//! instead of two. In a pre-norm decoder these are the adds after `o_proj`
//! and `down_proj`, the last layer's too: its sum is read by the final norm
//! through `slice_last_row`, and `fuse-norm-matmul` then moves that norm into
//! the LM head and `fuse-last-row-matmul` the slice, which leaves the last
//! layer as many dispatches as the others.

use crate::manager::{Pass, PassError};
use crate::rewrite::{fuse_adds, op_of};
use gerbil_ir::{Graph, MatMul, Op, ValueRef};

/// Folds residual adds into the matmuls they add.
pub struct FuseMatMulResidual;

/// The matmul operand of `add(a, b)` that can take the other as its
/// residual, with that other operand.
fn match_add(graph: &Graph, a: ValueRef, b: ValueRef) -> Option<(ValueRef, MatMul, ValueRef)> {
    [(a, b), (b, a)]
        .into_iter()
        .find_map(|(m, r)| match op_of(graph, m) {
            Op::MatMul(mm)
                if !mm.residual && m != r && graph.users(m).len() == 1 && !graph.is_output(m) =>
            {
                Some((m, mm.clone(), r))
            }
            _ => None,
        })
}

impl Pass for FuseMatMulResidual {
    fn name(&self) -> &'static str {
        "fuse-matmul-residual"
    }

    fn description(&self) -> &'static str {
        "fold add(matmul(x, w), r) into matmul{residual}(x, w, r)"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, PassError> {
        fuse_adds(graph, self.name(), |graph, a, b| {
            let (m, mm, r) = match_add(graph, a, b)?;
            let mut inputs = graph.inputs(m.node);
            inputs.push(r);
            let op = Op::MatMul(MatMul {
                residual: true,
                ..mm
            });
            Some((m.node, op, inputs))
        })
    }
}
