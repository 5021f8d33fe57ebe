//! Helpers shared by the fusion passes: error mapping, node replacement, dead-node cleanup,
//! weight concatenation, matmul merging, and the final-norm pattern that
//! the norm fusion leaves to `fuse-residual-norm`.

use crate::manager::PassError;
use gerbil_ir::graph::AddError;
use gerbil_ir::{
    BinaryOp, Dim, Graph, MatMul, NodeId, Op, TensorType, ValueRef, Weight, WeightSource,
};
use petgraph::Direction;

/// Whether `graph` has LoRA factors (the `lora` pass's adapter weights).
pub(crate) fn has_adapters(graph: &Graph) -> bool {
    graph
        .g
        .node_weights()
        .any(|n| matches!(&n.op, Op::Weight(w) if matches!(w.source, WeightSource::Adapter { .. })))
}

/// A [`PassError::Rewrite`] of `pass` from a failed `Graph::add`.
pub(crate) fn add_err(pass: &'static str) -> impl Fn(AddError) -> PassError {
    move |e| PassError::Rewrite {
        pass: pass.to_string(),
        reason: e.to_string(),
    }
}

/// Removes `id` if it still exists, nothing reads it and it is no graph
/// output, then does the same for the nodes it read.
pub(crate) fn remove_if_dead(graph: &mut Graph, id: NodeId) {
    let mut stack = vec![id];
    while let Some(n) = stack.pop() {
        if graph.g.node_weight(n).is_none()
            || graph.g.edges_directed(n, Direction::Outgoing).count() > 0
            || graph.outputs.iter().any(|(_, o)| o.node == n)
        {
            continue;
        }
        stack.extend(graph.inputs(n).iter().map(|v| v.node));
        graph.remove(n);
    }
}

/// Replaces node `id` by a new node of `op` on `inputs` labelled `label`:
/// its readers read the new node, and `id` (with whatever only it read) is
/// removed once dead. A failed add is a [`PassError::Rewrite`] of `pass`.
pub(crate) fn replace_node(
    graph: &mut Graph,
    id: NodeId,
    op: Op,
    inputs: &[ValueRef],
    label: String,
    pass: &'static str,
) -> Result<(), PassError> {
    let fused = graph.add(op, inputs, label).map_err(add_err(pass))?;
    graph.replace_all_uses(ValueRef::of(id), fused);
    remove_if_dead(graph, id);
    Ok(())
}

/// Replaces each `add(a, b)` still in the graph (in topological order) by
/// what `fuse` makes of it (the producer it absorbs, the op, its inputs),
/// labelled by the producer's label and the add's ([`join_labels`]);
/// returns the rewrites. The shared loop of the passes that fold a residual add into
/// the kernel of one of its operands.
pub(crate) fn fuse_adds(
    graph: &mut Graph,
    pass: &'static str,
    mut fuse: impl FnMut(&Graph, ValueRef, ValueRef) -> Option<(NodeId, Op, Vec<ValueRef>)>,
) -> Result<usize, PassError> {
    let order = graph.topo_order().unwrap_or_default();
    let mut rewrites = 0;
    for id in order {
        if graph.g.node_weight(id).is_none() || graph.node(id).op != Op::Binary(BinaryOp::Add) {
            continue;
        }
        let [a, b] = graph.inputs(id)[..] else {
            continue;
        };
        let Some((producer, op, inputs)) = fuse(graph, a, b) else {
            continue;
        };
        let label = join_labels(&[&graph.node(producer).label, &graph.node(id).label]);
        replace_node(graph, id, op, &inputs, label, pass)?;
        rewrites += 1;
    }
    Ok(rewrites)
}

/// Whether `s` is read only by a `slice_last_row` that feeds an `rms_norm`
/// and is no graph output: what `fuse-residual-norm` fuses into
/// `add_rms_norm_last_row` when `s` is an add, which `fuse-norm-matmul`
/// leaves to it.
pub(crate) fn feeds_final_norm(graph: &Graph, s: ValueRef) -> bool {
    let users = graph.users(s);
    let [(slice, _)] = users[..] else {
        return false;
    };
    !graph.is_output(s)
        && graph.node(slice).op == Op::SliceLastRow
        && graph
            .users(ValueRef::of(slice))
            .iter()
            .any(|(n, _)| matches!(graph.node(*n).op, Op::RmsNorm(_)))
}

/// The op of the node producing `v`.
pub(crate) fn op_of(graph: &Graph, v: ValueRef) -> &Op {
    &graph.node(v.node).op
}

/// `"a.b.c+d+e"` from labels `a.b.c`, `a.b.d`, `a.b.e`: the first label, then
/// what follows the common dotted prefix (of two components or more) of each
/// other one, or the whole label.
pub(crate) fn join_labels(labels: &[&str]) -> String {
    let first = labels[0];
    let mut prefix = first.rfind('.').map_or(0, |i| i + 1);
    for l in &labels[1..] {
        while prefix > 0 && !(l.len() >= prefix && l[..prefix] == first[..prefix]) {
            prefix = first[..prefix - 1].rfind('.').map_or(0, |i| i + 1);
        }
    }
    // Strip only a shared `layers.N.`-like prefix, never a lone `layers.`.
    if first[..prefix].matches('.').count() < 2 {
        prefix = 0;
    }
    let mut out = first.to_string();
    for l in &labels[1..] {
        out.push('+');
        out.push_str(&l[prefix..]);
    }
    out
}

/// One weight holding `parts` stacked along axis 0, if they can be stacked
/// at compile time: same dtype and trailing shape, and either all whole
/// checkpoint tensors (or concatenations of them) → `Concat`, or
/// consecutive row ranges of one tensor → one `Rows` range.
pub(crate) fn concat_weights(graph: &Graph, parts: &[ValueRef]) -> Option<Weight> {
    let ws: Vec<&Weight> = parts
        .iter()
        .map(|v| match op_of(graph, *v) {
            Op::Weight(w) => Some(w),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let first = ws[0];
    let trailing = &first.ty.shape[1..];
    let mut rows = 0;
    for w in &ws {
        if w.ty.dtype != first.ty.dtype || &w.ty.shape[1..] != trailing {
            return None;
        }
        rows += w.ty.shape.first()?.as_const()?;
    }
    let mut shape = vec![Dim::Const(rows)];
    shape.extend_from_slice(trailing);
    let ty = TensorType::new(first.ty.dtype, shape);
    let mut tensors = Vec::new();
    let mut all_whole = true;
    for w in &ws {
        match &w.source {
            WeightSource::Checkpoint { tensor } => tensors.push(tensor.clone()),
            WeightSource::Concat { tensors: t } => tensors.extend(t.iter().cloned()),
            _ => all_whole = false,
        }
    }
    if all_whole {
        return Some(Weight {
            source: WeightSource::Concat { tensors },
            ty,
        });
    }
    let WeightSource::Rows { tensor, start, .. } = &first.source else {
        return None;
    };
    let mut next = *start;
    for w in &ws {
        match &w.source {
            WeightSource::Rows {
                tensor: t,
                start: s,
                count,
            } if t == tensor && *s == next => next += count,
            _ => return None,
        }
    }
    Some(Weight {
        source: WeightSource::Rows {
            tensor: tensor.clone(),
            start: *start,
            count: next - start,
        },
        ty,
    })
}

/// Replaces plain matmuls (no norm prologue, no residual) that read the same
/// `x` (all with a bias or none) by one
/// matmul over their stacked weights (and biases), followed by one
/// `slice_cols` per original matmul whose uses move to it. Returns the new
/// matmul, or `None` (graph untouched) if the weights cannot be stacked.
pub(crate) fn merge_matmuls(
    graph: &mut Graph,
    pass: &'static str,
    mms: &[NodeId],
) -> Result<Option<NodeId>, PassError> {
    let ins: Vec<Vec<ValueRef>> = mms.iter().map(|&m| graph.inputs(m)).collect();
    let bias = match op_of(graph, ValueRef::of(mms[0])) {
        Op::MatMul(m) => m.has_bias,
        _ => return Ok(None),
    };
    let plain = Op::MatMul(MatMul::linear(bias));
    let x = ins[0][0];
    for (i, &m) in mms.iter().enumerate() {
        let same = *op_of(graph, ValueRef::of(m)) == plain;
        if !same || ins[i][0] != x || graph.node(m).outputs.len() != 1 {
            return Ok(None);
        }
    }
    let ws: Vec<ValueRef> = ins.iter().map(|i| i[1]).collect();
    let Some(w) = concat_weights(graph, &ws) else {
        return Ok(None);
    };
    let b = if bias {
        let bs: Vec<ValueRef> = ins.iter().map(|i| i[2]).collect();
        match concat_weights(graph, &bs) {
            Some(b) => Some(b),
            None => return Ok(None),
        }
    } else {
        None
    };
    let labels: Vec<String> = mms.iter().map(|&m| graph.node(m).label.clone()).collect();
    let refs: Vec<&str> = labels.iter().map(String::as_str).collect();
    let label = join_labels(&refs);
    let err = add_err(pass);
    let wv = graph
        .add(Op::Weight(w), &[], format!("{label}.weight"))
        .map_err(&err)?;
    let mut inputs = vec![x, wv];
    if let Some(b) = b {
        inputs.push(
            graph
                .add(Op::Weight(b), &[], format!("{label}.bias"))
                .map_err(&err)?,
        );
    }
    let fused = graph.add(plain, &inputs, label).map_err(&err)?;
    let mut start = 0;
    for &m in mms {
        let len = graph.node(m).outputs[0].last_const().unwrap_or(0);
        let slice = graph
            .add(
                Op::SliceCols { start, len },
                &[fused],
                graph.node(m).label.clone(),
            )
            .map_err(&err)?;
        graph.replace_all_uses(ValueRef::of(m), slice);
        remove_if_dead(graph, m);
        start += len;
    }
    Ok(Some(fused.node))
}
