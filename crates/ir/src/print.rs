//! Deterministic text form of a graph, for `--dump-ir` and snapshot tests.
//!
//! Values are renumbered `%0, %1, …` in topological order, so the text does
//! not depend on node indices left behind by removed nodes:
//!
//! ```text
//! graph tiny-llama
//!   %0 = input.token_ids : u32[T]
//!   %1 = weight "model.embed_tokens.weight" : f32[512,64]
//!   %2 = embedding(%1, %0) : f32[T,64]   # embed
//!   output logits = %2
//! ```

use crate::graph::{Graph, NodeId, ValueRef};
use std::collections::HashMap;
use std::fmt::Write;

/// Renders the graph as text, one node per line, in topological order.
pub fn print(graph: &Graph) -> String {
    let mut out = format!("graph {}\n", graph.name);
    let Some(order) = graph.topo_order() else {
        out.push_str("  <cycle>\n");
        return out;
    };
    let mut names: HashMap<NodeId, usize> = HashMap::new();
    let value_name = |names: &HashMap<NodeId, usize>, v: ValueRef| match names.get(&v.node) {
        Some(i) if v.port == 0 => format!("%{i}"),
        Some(i) => format!("%{i}.{}", v.port),
        None => "%?".to_string(),
    };
    for (next, id) in order.into_iter().enumerate() {
        let node = graph.node(id);
        names.insert(id, next);
        let ins: Vec<String> = graph
            .inputs(id)
            .into_iter()
            .map(|v| value_name(&names, v))
            .collect();
        let tys: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
        let _ = write!(out, "  %{next} = {}", node.op);
        if !ins.is_empty() {
            let _ = write!(out, "({})", ins.join(", "));
        }
        let _ = write!(out, " : {}", tys.join(", "));
        if !node.label.is_empty() {
            let _ = write!(out, "   # {}", node.label);
        }
        out.push('\n');
    }
    for (name, v) in &graph.outputs {
        let _ = writeln!(out, "  output {name} = {}", value_name(&names, *v));
    }
    out
}
