//! The graph container: nodes, value edges, named outputs.

use crate::op::Op;
use crate::types::TensorType;
use petgraph::stable_graph::{NodeIndex, StableGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Index of a node; stable across removals of other nodes.
pub type NodeId = NodeIndex<u32>;

/// A node: an op, the types of its outputs, and a human-readable label
/// (e.g. `layers.3.attn.q_proj`) used in dumps and kernel names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// The operation.
    pub op: Op,
    /// One type per output port.
    pub outputs: Vec<TensorType>,
    /// Where the node came from.
    pub label: String,
}

impl Node {
    /// The transformer layer the node belongs to, by the label convention
    /// every frontend follows: nodes of layer `N` are labelled `layers.N.…`.
    /// This is the one place that reads the convention; codegen records the
    /// result on every dispatch, so no later stage parses labels.
    pub fn layer(&self) -> Option<u32> {
        let rest = self.label.strip_prefix("layers.")?;
        let (n, _) = rest.split_once('.')?;
        n.parse().ok()
    }
}

/// A label with every `layers.N.` removed, so a fused node of every layer
/// (`layers.6.mlp.residual+layers.7.input_norm`) has one name
/// (`mlp.residual+input_norm`): what a profile groups dispatches by.
pub fn without_layers(label: &str) -> String {
    let mut out = String::with_capacity(label.len());
    let mut rest = label;
    while let Some(i) = rest.find("layers.") {
        let after = &rest[i + "layers.".len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let at_start = i == 0 || !rest.as_bytes()[i - 1].is_ascii_alphanumeric();
        if digits > 0 && at_start && after[digits..].starts_with('.') {
            out.push_str(&rest[..i]);
            rest = &after[digits + 1..];
        } else {
            out.push_str(&rest[..i + "layers.".len()]);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The label prefix of layer `layer`'s nodes, `layers.{layer}`: frontends
/// build labels with it, [`Node::layer`] reads it back and [`without_layers`]
/// removes it.
pub fn layer_prefix(layer: impl std::fmt::Display) -> String {
    format!("layers.{layer}")
}

/// A value flowing from output `src_port` of the edge's source to input
/// `dst_port` of its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edge {
    /// Output port of the producer.
    pub src_port: u32,
    /// Input port of the consumer.
    pub dst_port: u32,
}

/// A reference to one output value of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValueRef {
    /// Producer.
    pub node: NodeId,
    /// Output port of the producer.
    pub port: u32,
}

impl ValueRef {
    /// Output 0 of `node`.
    pub fn of(node: NodeId) -> Self {
        ValueRef { node, port: 0 }
    }
}

/// The name of the output every language-model graph has: next-token logits,
/// `[1, vocab]` or `[T, vocab]`. Frontends name it, `slice-last-row` finds
/// it, and codegen maps it to the plan's `Output(Logits)` buffer — all through
/// this constant.
pub const LOGITS: &str = "logits";

/// Name of the graph output holding greedy decoding's next token, the
/// [`Op::SampleToken`] of the logits; codegen maps it to the
/// plan's `Output(NextToken)` buffer.
pub const NEXT_TOKEN: &str = "next_token";

/// The name of an encoder graph's output instead of [`LOGITS`]: the pooled
/// (and, where the model says so, normalized) sentence embedding `[1, D]`;
/// codegen maps it to the plan's `Output(Embedding)` buffer.
pub const EMBEDDING: &str = "embedding";

/// The name of a training graph's loss output (the `autodiff` pass's):
/// the mean next-token cross-entropy, `f32[1]`.
pub const LOSS: &str = "loss";

/// The name of a training graph's output holding the gradient of the
/// weight labelled `label`: `grad.LABEL`.
pub fn gradient_output(label: &str) -> String {
    format!("grad.{label}")
}

/// The weight label a training graph's output named `name` is the gradient
/// of ([`gradient_output`]'s inverse), if it is one.
pub fn gradient_of(name: &str) -> Option<&str> {
    name.strip_prefix("grad.")
}

/// A dataflow graph with named outputs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Graph {
    /// Model name, printed in the header.
    pub name: String,
    /// The nodes and value edges.
    pub g: StableGraph<Node, Edge, petgraph::Directed, u32>,
    /// Values the runtime reads back, by name (e.g. `logits`).
    pub outputs: Vec<(String, ValueRef)>,
}

/// Error from adding a node whose inputs do not fit its op.
#[derive(Debug, thiserror::Error)]
#[error("cannot add {op} `{label}`: {reason}")]
pub struct AddError {
    /// Mnemonic of the op.
    pub op: String,
    /// Label of the node.
    pub label: String,
    /// What the op's type rule said.
    pub reason: String,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: impl Into<String>) -> Self {
        Graph {
            name: name.into(),
            g: StableGraph::default(),
            outputs: Vec::new(),
        }
    }

    /// Adds a node after checking its inputs against the op's type rule;
    /// returns its first output.
    pub fn add(
        &mut self,
        op: Op,
        inputs: &[ValueRef],
        label: impl Into<String>,
    ) -> Result<ValueRef, AddError> {
        let label = label.into();
        let tys: Vec<&TensorType> = inputs.iter().map(|v| self.value_type(*v)).collect();
        let outputs = op.infer(&tys).map_err(|reason| AddError {
            op: op.mnemonic().to_string(),
            label: label.clone(),
            reason,
        })?;
        let id = self.g.add_node(Node { op, outputs, label });
        for (i, v) in inputs.iter().enumerate() {
            self.g.add_edge(
                v.node,
                id,
                Edge {
                    src_port: v.port,
                    dst_port: i as u32,
                },
            );
        }
        Ok(ValueRef::of(id))
    }

    /// The node with this id.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.g[id]
    }

    /// The type of a value.
    pub fn value_type(&self, v: ValueRef) -> &TensorType {
        &self.g[v.node].outputs[v.port as usize]
    }

    /// The inputs of a node, ordered by input port.
    pub fn inputs(&self, id: NodeId) -> Vec<ValueRef> {
        let mut ins: Vec<(u32, ValueRef)> = self
            .g
            .edges_directed(id, Direction::Incoming)
            .map(|e| {
                (
                    e.weight().dst_port,
                    ValueRef {
                        node: e.source(),
                        port: e.weight().src_port,
                    },
                )
            })
            .collect();
        ins.sort();
        ins.into_iter().map(|(_, v)| v).collect()
    }

    /// The nodes that read `v`, each with the input port it reads `v` on, sorted.
    pub fn users(&self, v: ValueRef) -> Vec<(NodeId, u32)> {
        let mut us: Vec<(NodeId, u32)> = self
            .g
            .edges_directed(v.node, Direction::Outgoing)
            .filter(|e| e.weight().src_port == v.port)
            .map(|e| (e.target(), e.weight().dst_port))
            .collect();
        us.sort();
        us
    }

    /// Whether `v` is one of the graph's named outputs.
    pub fn is_output(&self, v: ValueRef) -> bool {
        self.outputs.iter().any(|(_, o)| *o == v)
    }

    /// Points every reader of `old` (and any graph output naming it) at `new`.
    pub fn replace_all_uses(&mut self, old: ValueRef, new: ValueRef) {
        let edges: Vec<_> = self
            .g
            .edges_directed(old.node, Direction::Outgoing)
            .filter(|e| e.weight().src_port == old.port)
            .map(|e| (e.id(), e.target(), e.weight().dst_port))
            .collect();
        for (eid, target, dst_port) in edges {
            self.g.remove_edge(eid);
            self.g.add_edge(
                new.node,
                target,
                Edge {
                    src_port: new.port,
                    dst_port,
                },
            );
        }
        for (_, o) in self.outputs.iter_mut() {
            if *o == old {
                *o = new;
            }
        }
    }

    /// Removes a node and its edges.
    pub fn remove(&mut self, id: NodeId) {
        self.g.remove_node(id);
    }

    /// Node ids in a deterministic topological order: among ready nodes the
    /// one created first goes first. Returns `None` if the graph has a cycle.
    pub fn topo_order(&self) -> Option<Vec<NodeId>> {
        let mut indeg: std::collections::HashMap<NodeId, usize> = self
            .g
            .node_indices()
            .map(|n| (n, self.g.edges_directed(n, Direction::Incoming).count()))
            .collect();
        let mut ready: BinaryHeap<Reverse<NodeId>> = indeg
            .iter()
            .filter(|(_, &d)| d == 0)
            .map(|(&n, _)| Reverse(n))
            .collect();
        let mut order = Vec::with_capacity(indeg.len());
        while let Some(Reverse(n)) = ready.pop() {
            order.push(n);
            for e in self.g.edges_directed(n, Direction::Outgoing) {
                let d = indeg.get_mut(&e.target())?;
                *d -= 1;
                if *d == 0 {
                    ready.push(Reverse(e.target()));
                }
            }
        }
        (order.len() == self.g.node_count()).then_some(order)
    }

    /// Number of nodes whose op is not a source (weights, inputs, caches).
    pub fn compute_node_count(&self) -> usize {
        self.g.node_weights().filter(|n| !n.op.is_source()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Input, Op, TensorType};

    fn node(label: &str) -> Node {
        Node {
            op: Op::Input(Input::TokenIds),
            outputs: vec![TensorType::fixed(DType::U32, &[1])],
            label: label.into(),
        }
    }

    #[test]
    fn layers_come_from_the_label_prefix() {
        assert_eq!(node(&format!("{}.mlp", layer_prefix(12))).layer(), Some(12));
        assert_eq!(node("layers.3.attn.q_proj").layer(), Some(3));
        assert_eq!(node("model.layers.1.w").layer(), None);
        assert_eq!(node("layers.x.y").layer(), None);
        assert_eq!(node("layers.4").layer(), None);
        assert_eq!(node("lm_head").layer(), None);
    }

    #[test]
    fn profile_groups_drop_every_layer_number() {
        assert_eq!(without_layers("layers.3.attn.sdpa"), "attn.sdpa");
        assert_eq!(
            without_layers("layers.6.mlp.residual+layers.7.input_norm"),
            "mlp.residual+input_norm"
        );
        assert_eq!(
            without_layers("embed+layers.0.input_norm"),
            "embed+input_norm"
        );
        assert_eq!(without_layers("lm_head"), "lm_head");
        assert_eq!(without_layers("model.layers.x.w"), "model.layers.x.w");
        assert_eq!(without_layers("sublayers.2.x"), "sublayers.2.x");
    }
}
