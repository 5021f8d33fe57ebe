//! Graphviz rendering of a graph, for `--dump-dot`.

use crate::graph::Graph;
use std::fmt::Write;

/// Renders the graph in DOT; weights are drawn as small grey boxes.
pub fn to_dot(graph: &Graph) -> String {
    let mut out =
        String::from("digraph gerbil {\n  rankdir=TB;\n  node [fontname=\"monospace\"];\n");
    let order = graph
        .topo_order()
        .unwrap_or_else(|| graph.g.node_indices().collect());
    for id in order {
        let node = graph.node(id);
        let ty: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
        let label = format!(
            "{}\\n{}\\n{}",
            node.op.mnemonic(),
            node.label,
            ty.join(", ")
        );
        let style = if node.op.is_source() {
            ", shape=box, style=filled, fillcolor=\"#eeeeee\""
        } else {
            ", shape=box"
        };
        let _ = writeln!(
            out,
            "  n{} [label=\"{}\"{style}];",
            id.index(),
            label.replace('"', "'")
        );
    }
    for e in graph.g.edge_indices() {
        if let Some((a, b)) = graph.g.edge_endpoints(e) {
            let _ = writeln!(out, "  n{} -> n{};", a.index(), b.index());
        }
    }
    for (name, v) in &graph.outputs {
        let _ = writeln!(
            out,
            "  out_{name} [label=\"{name}\", shape=oval];\n  n{} -> out_{name};",
            v.node.index()
        );
    }
    out.push_str("}\n");
    out
}
