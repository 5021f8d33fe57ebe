//! `autodiff`: turns a lowered forward graph into a training step's graph —
//! the mean next-token cross-entropy and the gradient of every weight.
//!
//! Pattern: a graph with a `[T, V]` [`gerbil_ir::LOGITS`] output, as a
//! frontend lowers it (before `slice-last-row` and the fusions). Rewrite:
//! an `input.target_ids`, a `cross_entropy` of the logits against them (the
//! output [`gerbil_ir::LOSS`]), and, walking the forward nodes in reverse
//! topological order, the backward ops of each ([`gerbil_ir::TrainOp`]): a
//! vector-Jacobian product per input that carries a gradient. A value read
//! by several nodes gets the sum of their gradients (`add`), so a tied
//! embedding's one weight gets its lookup's and its LM head's. The graph's
//! outputs become the loss and one `grad.LABEL` per float weight the loss
//! depends on ([`gerbil_ir::gradient_output`]), in label order; what no longer reaches
//! them (the next-token sampling) is left to `dce`, which runs after it in
//! [`crate::training_passes`].
//!
//! The graph is one step over one sequence at positions `0..T`: the KV
//! caches hold exactly this step's keys and values, so attention's cache
//! gradients are the keys' and values' own (`cache_rows`). Weights that do
//! not train: RoPE tables, quantized weights, and — in a graph with LoRA
//! factors ([`WeightSource::Adapter`], the `lora` pass's) — every weight
//! but those.
//!
//! The surprise: it refuses fused ops. Each fused op is its pieces chained,
//! and differentiating the pieces is what the fusion passes can then fuse
//! again; so it runs on the graph as lowered, and a fused op in its input
//! is an error that says so.

use crate::manager::{Pass, PassError};
use crate::rewrite::{add_err, has_adapters};
use gerbil_ir::{
    gradient_output, BinaryOp, DType, Graph, Input, NodeId, Op, TrainOp, UnaryOp, ValueRef,
    WeightSource, LOGITS, LOSS,
};
use std::collections::{HashMap, HashSet};

/// Builds the training step's graph; see the module docs.
pub struct Autodiff;

const NAME: &str = "autodiff";

fn refuse(reason: String) -> PassError {
    PassError::Rewrite {
        pass: NAME.into(),
        reason,
    }
}

/// Why the pass cannot differentiate `op`, if it cannot.
fn refusal(op: &Op) -> Option<&'static str> {
    match op {
        op if op.is_source() => None,
        Op::MatMul(m) if m.norm.is_none() && !m.residual && !m.last_row && m.act.is_none() => None,
        Op::Embedding(_)
        | Op::RmsNorm(_)
        | Op::AddBias
        | Op::Rope(_)
        | Op::CacheWrite
        | Op::Attention(_)
        | Op::Unary(_)
        | Op::Binary(_) => None,
        op if op.num_outputs() > 1 || matches!(op, Op::MatMul(_) | Op::MatMulGlu(_)) => {
            Some("it is a fused op; run autodiff on the graph as lowered, before the fusion passes")
        }
        Op::SliceLastRow => {
            Some("the logits are the last row only; run autodiff before slice-last-row")
        }
        _ => Some("it has no backward op (training covers the decoder families' ops)"),
    }
}

/// The error for a node [`refusal`] refuses.
fn refused(node: &gerbil_ir::Node) -> PassError {
    let why = refusal(&node.op).unwrap_or("it has no backward op");
    refuse(format!(
        "cannot differentiate `{}` ({}): {why}",
        node.label,
        node.op.mnemonic()
    ))
}

/// Which weights train: every float weight but the RoPE tables, or, in a
/// graph with LoRA factors, those alone.
#[derive(Clone, Copy)]
struct Trained {
    adapters_only: bool,
}

impl Trained {
    fn of(graph: &Graph) -> Trained {
        Trained {
            adapters_only: has_adapters(graph),
        }
    }

    /// Whether `v` is a weight that gets a gradient output.
    fn trains(self, graph: &Graph, v: ValueRef) -> bool {
        match &graph.node(v.node).op {
            Op::Weight(w) => match w.source {
                WeightSource::Adapter { .. } => true,
                _ if self.adapters_only => false,
                WeightSource::RopeTable { .. } => false,
                _ => matches!(w.ty.dtype, DType::F32 | DType::F16 | DType::BF16),
            },
            _ => false,
        }
    }

    /// Whether a gradient flowing into `v` can reach a weight: not into token
    /// ids, a cache's old contents, or a frozen weight.
    fn carries(self, graph: &Graph, v: ValueRef) -> bool {
        match &graph.node(v.node).op {
            Op::Input(_) | Op::KvCache { .. } => false,
            Op::Weight(_) => self.trains(graph, v),
            _ => true,
        }
    }
}

/// The gradients built so far, by forward value.
struct Grads<'g> {
    graph: &'g mut Graph,
    of: HashMap<ValueRef, ValueRef>,
    trained: Trained,
}

impl Grads<'_> {
    fn add(&mut self, op: Op, ins: &[ValueRef], label: String) -> Result<ValueRef, PassError> {
        self.graph.add(op, ins, label).map_err(add_err(NAME))
    }

    /// Whether a gradient flowing into `v` can reach a trained weight.
    fn carries(&self, v: ValueRef) -> bool {
        self.trained.carries(self.graph, v)
    }

    /// Adds `g` to the gradient of `v` (a sum when `v` already has one).
    fn accumulate(&mut self, v: ValueRef, g: ValueRef) -> Result<(), PassError> {
        if !self.carries(v) {
            return Ok(());
        }
        let sum = match self.of.get(&v) {
            None => g,
            Some(&old) => {
                let label = format!("{}.grad.sum", self.graph.node(v.node).label);
                self.add(Op::Binary(BinaryOp::Add), &[old, g], label)?
            }
        };
        self.of.insert(v, sum);
        Ok(())
    }

    /// The backward ops of node `id`, whose output has gradient `g`.
    fn backward(&mut self, id: NodeId, g: ValueRef) -> Result<(), PassError> {
        let node = self.graph.node(id).clone();
        let ins = self.graph.inputs(id);
        let label = |what: &str| format!("{}.grad{what}", node.label);
        let train = Op::Train;
        match &node.op {
            Op::Embedding(_) if !self.carries(ins[0]) => {}
            Op::Embedding(e) => {
                let rows = self.graph.value_type(ins[0]).shape[0]
                    .as_const()
                    .ok_or_else(|| refuse(format!("`{}`: a table of constant rows", node.label)))?;
                let op = train(TrainOp::EmbeddingGrad {
                    embedding: e.clone(),
                    rows,
                });
                let dt = self.add(op, &[ins[1], g], label(".table"))?;
                self.accumulate(ins[0], dt)?;
            }
            Op::RmsNorm(n) => {
                let op = train(TrainOp::RmsNormGrad(n.clone()));
                let dx = self.add(op, &[ins[0], ins[1], g], label(""))?;
                self.accumulate(ins[0], dx)?;
                self.accumulate(ins[1], ValueRef { port: 1, ..dx })?;
            }
            Op::MatMul(m) if m.norm.is_none() && !m.residual && !m.last_row && m.act.is_none() => {
                let dx = self.add(train(TrainOp::MatMulGradX), &[g, ins[1]], label(".x"))?;
                self.accumulate(ins[0], dx)?;
                if self.carries(ins[1]) {
                    let dw = self.add(train(TrainOp::MatMulGradW), &[g, ins[0]], label(".w"))?;
                    self.accumulate(ins[1], dw)?;
                }
                if let Some(b) = m.ports().bias {
                    self.bias(ins[b], g, label(".bias"))?;
                }
            }
            Op::AddBias => {
                self.accumulate(ins[0], g)?;
                self.bias(ins[1], g, label(".bias"))?;
            }
            Op::Rope(r) => {
                let dx = self.add(train(TrainOp::RopeGrad(r.clone())), &[g, ins[1]], label(""))?;
                self.accumulate(ins[0], dx)?;
            }
            Op::CacheWrite => {
                let dx = self.add(train(TrainOp::CacheRows), &[g], label(""))?;
                self.accumulate(ins[1], dx)?;
            }
            Op::Attention(a) => {
                let lse = train(TrainOp::AttentionLse(a.clone()));
                let lse = self.add(lse, &ins[..2], format!("{}.lse", node.label))?;
                let op = train(TrainOp::AttentionGrad(a.clone()));
                let saved = [ins[0], ins[1], ins[2], g, ValueRef::of(id), lse];
                let dq = self.add(op, &saved, label(""))?;
                for (port, v) in ins.iter().enumerate() {
                    let port = port as u32;
                    self.accumulate(*v, ValueRef { port, ..dq })?;
                }
            }
            // A constant derivative: `dy` scaled, which keeps no activation
            // alive for the backward (a LoRA update's `[T, out]`).
            Op::Unary(UnaryOp::Scale(by)) => {
                let dx = self.add(Op::Unary(UnaryOp::Scale(*by)), &[g], label(""))?;
                self.accumulate(ins[0], dx)?;
            }
            Op::Unary(u) => {
                let dx = self.add(train(TrainOp::UnaryGrad(*u)), &[ins[0], g], label(""))?;
                self.accumulate(ins[0], dx)?;
            }
            Op::Binary(BinaryOp::Add) => {
                self.accumulate(ins[0], g)?;
                self.accumulate(ins[1], g)?;
            }
            Op::Binary(BinaryOp::Mul) => {
                let mul = Op::Binary(BinaryOp::Mul);
                for (this, other) in [(ins[0], ins[1]), (ins[1], ins[0])] {
                    if self.carries(this) {
                        let side = if this == ins[0] { ".lhs" } else { ".rhs" };
                        let d = self.add(mul.clone(), &[g, other], label(side))?;
                        self.accumulate(this, d)?;
                    }
                }
            }
            _ => return Err(refused(&node)),
        }
        Ok(())
    }

    /// The gradient of a bias added to every row of `g`'s value.
    fn bias(&mut self, b: ValueRef, g: ValueRef, label: String) -> Result<(), PassError> {
        if self.carries(b) {
            let db = self.add(Op::Train(TrainOp::SumRows), &[g], label)?;
            self.accumulate(b, db)?;
        }
        Ok(())
    }
}

impl Pass for Autodiff {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "replace the outputs by the next-token loss and every weight's gradient (backward ops)"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, PassError> {
        let Some(&(_, logits)) = graph.outputs.iter().find(|(n, _)| n == LOGITS) else {
            return Err(refuse(format!("the graph has no `{LOGITS}` output")));
        };
        let ty = graph.value_type(logits);
        if ty.shape.first() != Some(&gerbil_ir::Dim::Sym(gerbil_ir::Sym::T)) {
            return Err(refuse(format!(
                "the logits must have a row per token ([T, vocab]), got {ty}; \
                 run autodiff on the graph as lowered, before slice-last-row"
            )));
        }
        if graph
            .g
            .node_weights()
            .any(|n| n.op == Op::Input(Input::TargetIds))
        {
            return Err(refuse("the graph is a training graph already".into()));
        }
        let order = graph
            .topo_order()
            .ok_or_else(|| refuse("the graph has a cycle".into()))?;
        // Every op the loss depends on must have a backward, checked before
        // the graph changes.
        let mut stack = vec![logits.node];
        let mut seen = HashSet::new();
        while let Some(id) = stack.pop() {
            if seen.insert(id) {
                if refusal(&graph.node(id).op).is_some() {
                    return Err(refused(graph.node(id)));
                }
                stack.extend(graph.inputs(id).iter().map(|v| v.node));
            }
        }
        let targets = graph
            .add(Op::Input(Input::TargetIds), &[], "target_ids")
            .map_err(add_err(NAME))?;
        let loss = graph
            .add(Op::Train(TrainOp::CrossEntropy), &[logits, targets], LOSS)
            .map_err(add_err(NAME))?;
        let dlogits = graph
            .add(
                Op::Train(TrainOp::CrossEntropyGrad),
                &[logits, targets],
                "logits.grad",
            )
            .map_err(add_err(NAME))?;
        let trained = Trained::of(graph);
        let mut grads = Grads {
            graph,
            of: HashMap::from([(logits, dlogits)]),
            trained,
        };
        let mut differentiated = 0;
        for &id in order.iter().rev() {
            let node = grads.graph.node(id);
            if node.op.is_source() {
                continue;
            }
            // A fused op's later ports fall to `backward`'s refusal too.
            let ports = 0..node.op.num_outputs() as u32;
            let grad = ports
                .map(|port| ValueRef { node: id, port })
                .find_map(|v| grads.of.get(&v).copied());
            if let Some(g) = grad {
                grads.backward(id, g)?;
                differentiated += 1;
            }
        }
        let mut weights: Vec<(String, ValueRef)> = order
            .iter()
            .map(|&id| ValueRef::of(id))
            .filter(|v| trained.trains(grads.graph, *v))
            .filter_map(|v| {
                let g = grads.of.get(&v)?;
                Some((gradient_output(&grads.graph.node(v.node).label), *g))
            })
            .collect();
        weights.sort_by(|a, b| a.0.cmp(&b.0));
        let graph = grads.graph;
        graph.outputs = std::iter::once((LOSS.to_string(), loss))
            .chain(weights)
            .collect();
        Ok(differentiated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(body: &str) -> Graph {
        let text = format!(
            "graph g\n  %ids = input.token_ids : u32[T]\n  %e = weight \"e\" : f32[16,8]\n  \
             %n = weight \"n\" : f32[8]\n  %x = embedding(%e, %ids) : f32[T,8]\n{body}"
        );
        gerbil_ir::parse(&text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn refused_by_the_pass(mut g: Graph) -> String {
        match Autodiff.run(&mut g) {
            Err(e) => e.to_string(),
            Ok(n) => panic!("autodiff ran ({n} rewrites)"),
        }
    }

    #[test]
    fn fused_ops_are_refused_with_the_way_out() {
        let g = graph(
            "  %y = matmul{norm(eps=1e-6, offset=0)}(%x, %e, %n) : f32[T,16]\n  \
             output logits = %y\n",
        );
        let before = gerbil_ir::print::print(&g);
        let mut changed = g.clone();
        let err = match Autodiff.run(&mut changed) {
            Err(e) => e.to_string(),
            Ok(n) => panic!("autodiff ran ({n} rewrites)"),
        };
        assert!(err.contains("cannot differentiate `y` (matmul)"), "{err}");
        assert!(err.contains("before the fusion passes"), "{err}");
        assert_eq!(
            gerbil_ir::print::print(&changed),
            before,
            "a refusal changed the graph"
        );
    }

    #[test]
    fn a_graph_needs_all_rows_logits_and_is_differentiated_once() {
        let err = refused_by_the_pass(graph("  output hidden = %x\n"));
        assert!(err.contains("no `logits` output"), "{err}");

        let sliced = graph(
            "  %last = slice_last_row(%x) : f32[1,8]\n  \
             %y = matmul(%last, %e) : f32[1,16]\n  output logits = %y\n",
        );
        let err = refused_by_the_pass(sliced);
        assert!(err.contains("a row per token"), "{err}");

        let mut g = graph("  %y = matmul(%x, %e) : f32[T,16]\n  output logits = %y\n");
        let logits = g.outputs[0].1;
        Autodiff.run(&mut g).unwrap_or_else(|e| panic!("{e}"));
        g.outputs.push((LOGITS.into(), logits));
        let err = refused_by_the_pass(g);
        assert!(err.contains("a training graph already"), "{err}");
    }
}
