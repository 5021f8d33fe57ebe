//! The verifier: re-infers every node's types and checks graph structure.

use crate::graph::Graph;
use crate::types::TensorType;
use petgraph::Direction;

/// A broken invariant of the graph.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum VerifyError {
    /// The graph has a cycle.
    #[error("the graph has a cycle")]
    Cycle,
    /// An input port is fed by no edge or by several.
    #[error("node {node} `{label}`: input ports are not exactly 0..{count} once each")]
    Ports {
        /// Node index.
        node: u32,
        /// Node label.
        label: String,
        /// Number of incoming edges.
        count: usize,
    },
    /// An edge reads an output port that does not exist.
    #[error("node {node} `{label}` reads missing output port {port} of node {src}")]
    MissingPort {
        /// Reader.
        node: u32,
        /// Reader label.
        label: String,
        /// Producer.
        src: u32,
        /// Port read.
        port: u32,
    },
    /// The op's type rule rejects the inputs.
    #[error("node {node} `{label}` ({op}): {reason}")]
    Type {
        /// Node index.
        node: u32,
        /// Node label.
        label: String,
        /// Op mnemonic.
        op: String,
        /// What is wrong.
        reason: String,
    },
    /// A named output points at a value that does not exist.
    #[error("graph output `{0}` names a missing value")]
    Output(String),
}

/// Checks that the graph is acyclic, every input port is fed exactly once and
/// every node's stored output types equal what its op infers from its inputs.
pub fn verify(graph: &Graph) -> Result<(), VerifyError> {
    let order = graph.topo_order().ok_or(VerifyError::Cycle)?;
    for id in order {
        let node = graph.node(id);
        let ins = graph.inputs(id);
        let count = graph.g.edges_directed(id, Direction::Incoming).count();
        let mut ports: Vec<u32> = graph
            .g
            .edges_directed(id, Direction::Incoming)
            .map(|e| e.weight().dst_port)
            .collect();
        ports.sort();
        if ports.iter().enumerate().any(|(i, &p)| p != i as u32) {
            return Err(VerifyError::Ports {
                node: id.index() as u32,
                label: node.label.clone(),
                count,
            });
        }
        let mut tys: Vec<&TensorType> = Vec::with_capacity(ins.len());
        for v in &ins {
            let src = graph.node(v.node);
            let ty = src
                .outputs
                .get(v.port as usize)
                .ok_or_else(|| VerifyError::MissingPort {
                    node: id.index() as u32,
                    label: node.label.clone(),
                    src: v.node.index() as u32,
                    port: v.port,
                })?;
            tys.push(ty);
        }
        let type_err = |reason: String| VerifyError::Type {
            node: id.index() as u32,
            label: node.label.clone(),
            op: node.op.mnemonic().to_string(),
            reason,
        };
        let inferred = node.op.infer(&tys).map_err(type_err)?;
        if inferred != node.outputs {
            let show = |ts: &[TensorType]| {
                ts.iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(type_err(format!(
                "stored output types ({}) differ from inferred ({})",
                show(&node.outputs),
                show(&inferred)
            )));
        }
    }
    for (name, v) in &graph.outputs {
        let ok = graph
            .g
            .node_weight(v.node)
            .is_some_and(|n| (v.port as usize) < n.outputs.len());
        if !ok {
            return Err(VerifyError::Output(name.clone()));
        }
    }
    Ok(())
}
