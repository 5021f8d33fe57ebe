//! `slice-last-row`: the final norm and LM head run on the last position only.
//!
//! Pattern: a graph output `logits = matmul(rms_norm(x, w), W)` where `x` has
//! `T` rows. Rewrite: `logits = matmul(rms_norm(slice_last_row(x), w), W)`, so
//! a prefill of `T` tokens computes one row of logits instead of `T`.
//! Row-wise ops between the slice and the output (norm, matmul, softcap) are
//! rebuilt on the single row.

use crate::manager::{Pass, PassError};
use gerbil_ir::{Dim, Graph, Op, Sym, ValueRef};

/// Computes the LM head on the last row only.
pub struct SliceLastRow;

/// Whether `op` works row by row on its input 0 alone (so slicing that
/// input before it equals slicing after); a matmul's residual would need a
/// slice of its own, and a `last_row` matmul has sliced already.
fn is_rowwise(op: &Op) -> bool {
    match op {
        Op::MatMul(m) => !m.residual && !m.last_row,
        _ => matches!(op, Op::RmsNorm(_) | Op::Unary(_) | Op::AddBias),
    }
}

impl Pass for SliceLastRow {
    fn name(&self) -> &'static str {
        "slice-last-row"
    }

    fn description(&self) -> &'static str {
        "move the logits' row-wise tail (final norm, lm_head) after a slice of the last row"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, PassError> {
        let Some(&(_, out)) = graph.outputs.iter().find(|(n, _)| n == gerbil_ir::LOGITS) else {
            return Ok(0);
        };
        // Walk back from the output along input 0 through row-wise ops.
        let mut chain = Vec::new();
        let mut cur = out;
        while is_rowwise(&graph.node(cur.node).op)
            && graph.value_type(cur).shape.first() == Some(&Dim::Sym(Sym::T))
        {
            chain.push(cur.node);
            cur = graph.inputs(cur.node)[0];
        }
        if chain.is_empty() {
            return Ok(0);
        }
        let err = |e: gerbil_ir::graph::AddError| PassError::Rewrite {
            pass: "slice-last-row".into(),
            reason: e.to_string(),
        };
        let mut v: ValueRef = graph
            .add(Op::SliceLastRow, &[cur], "last_row")
            .map_err(err)?;
        for &n in chain.iter().rev() {
            let node = graph.node(n).clone();
            let mut ins = graph.inputs(n);
            ins[0] = v;
            v = graph.add(node.op, &ins, node.label).map_err(err)?;
        }
        graph.replace_all_uses(out, v);
        for n in chain {
            if graph.users(ValueRef::of(n)).is_empty() && !graph.is_output(ValueRef::of(n)) {
                graph.remove(n);
            }
        }
        Ok(1)
    }
}
