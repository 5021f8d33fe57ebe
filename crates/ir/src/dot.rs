//! Graphviz rendering of a graph, for `--dump-dot`.
//!
//! ```
//! # let (before, after) = (gerbil_ir::Graph::new("g"), gerbil_ir::Graph::new("g"));
//! use gerbil_ir::dot::{created_nodes, to_dot};
//! let dot = to_dot(&after, &created_nodes(&before, &after));
//! assert!(dot.starts_with("digraph"));
//! ```
//!
//! Nodes are named and labelled as the text form names them (`%layers.0.attn.sdpa`)
//! with their op and types. Nodes whose label starts with `layers.N.` are
//! drawn inside a box per layer (`cluster_layer_N`); sources (weights,
//! inputs, caches) are small grey boxes; nodes a pass created are filled
//! yellow with a bold border. What counts as created is decided by
//! comparing the graphs before and after the pass ([`created_nodes`]): node
//! indices survive a pass, but a new node may reuse a removed node's index,
//! so an index alone does not say "new".

use crate::graph::{Graph, NodeId};
use crate::print::{print_order, value_names};
use std::collections::{BTreeMap, HashSet};
use std::fmt::Write;

/// Nodes of `after` that `before` does not have: a new index, or an index
/// whose op, label or types changed (a removed node's index reused).
pub fn created_nodes(before: &Graph, after: &Graph) -> HashSet<NodeId> {
    after
        .g
        .node_indices()
        .filter(|&id| before.g.node_weight(id) != after.g.node_weight(id))
        .collect()
}

/// The layer of a label `layers.N.…`, if it has one.
/// Escapes text for a double-quoted DOT string.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Renders the graph in DOT, clustered by layer, with the nodes in
/// `created` highlighted.
pub fn to_dot(graph: &Graph, created: &HashSet<NodeId>) -> String {
    let mut out = format!(
        "digraph \"{}\" {{\n  rankdir=TB;\n  node [fontname=\"monospace\", shape=box];\n",
        escape(&graph.name)
    );
    let order = print_order(graph);
    let names = value_names(graph, &order);
    let mut layers: BTreeMap<Option<u32>, Vec<String>> = BTreeMap::new();
    for &id in &order {
        let node = graph.node(id);
        let tys: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
        let name = names.get(&id).map_or("", String::as_str);
        let label = format!("{name}\\n{}\\n{}", node.op.mnemonic(), tys.join(", "));
        let style = match (created.contains(&id), node.op.is_source()) {
            (true, _) => ", style=\"filled,bold\", fillcolor=\"#ffe680\"",
            (false, true) => ", style=filled, fillcolor=\"#eeeeee\", fontsize=10",
            (false, false) => "",
        };
        let line = format!(
            "n{} [label=\"{}\"{style}];",
            id.index(),
            escape_label(&label)
        );
        layers.entry(node.layer()).or_default().push(line);
    }
    for (layer, lines) in &layers {
        let indent = match layer {
            Some(n) => {
                let _ = writeln!(
                    out,
                    "  subgraph cluster_layer_{n} {{\n    label=\"layer {n}\";\n    style=rounded;"
                );
                "    "
            }
            None => "  ",
        };
        for line in lines {
            let _ = writeln!(out, "{indent}{line}");
        }
        if layer.is_some() {
            out.push_str("  }\n");
        }
    }
    for e in graph.g.edge_indices() {
        if let Some((a, b)) = graph.g.edge_endpoints(e) {
            let _ = writeln!(out, "  n{} -> n{};", a.index(), b.index());
        }
    }
    for (i, (name, v)) in graph.outputs.iter().enumerate() {
        let _ = writeln!(
            out,
            "  out{i} [label=\"{}\", shape=oval];\n  n{} -> out{i};",
            escape(name),
            v.node.index()
        );
    }
    out.push_str("}\n");
    out
}

/// Escapes a label that already holds `\n` line breaks: quotes only, so
/// the breaks survive (names are quoted-escaped by the printer already).
fn escape_label(s: &str) -> String {
    s.replace('"', "\\\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{Input, Op};

    #[test]
    fn layers_cluster_and_created_nodes_stand_out() {
        let mut before = Graph::new("g");
        let ids = before
            .add(Op::Input(Input::TokenIds), &[], "input_ids")
            .unwrap();
        before.outputs.push(("ids".into(), ids));
        let mut after = before.clone();
        let new = after
            .add(Op::Input(Input::TokenIds), &[], "layers.3.ids")
            .unwrap();
        after.outputs.push(("new".into(), new));
        let created = created_nodes(&before, &after);
        assert_eq!(created, HashSet::from([new.node]));
        let dot = to_dot(&after, &created);
        assert!(dot.contains("subgraph cluster_layer_3 {"), "{dot}");
        assert!(dot.contains(&format!("    n{} [label=\"%layers.3.ids\\ninput.token_ids\\nu32[T]\", style=\"filled,bold\"", new.node.index())), "{dot}");
        assert!(
            dot.contains(&format!("  n{} [label=\"%input_ids", ids.node.index())),
            "{dot}"
        );
    }
}
