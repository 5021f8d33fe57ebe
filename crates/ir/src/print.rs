//! The text form of a graph (`.gir`), for `--dump-ir`, `gerbilc opt` and
//! pass file tests; [`crate::parse()`] reads it back.
//!
//! ```text
//! graph tiny-llama
//!   %input_ids = input.token_ids : u32[T]
//!   %model.embed_tokens.weight = weight "model.embed_tokens.weight" : f32[512,64]
//!   %embed = embedding(%model.embed_tokens.weight, %input_ids) : f32[T,64]
//!   output logits = %embed
//! ```
//!
//! Every value is named after its node's label, so a pass that rewrites two
//! nodes changes only the lines of those nodes (and of the nodes that now read
//! them). A label that is empty or already taken by an earlier line gets a
//! suffix `~k` (its occurrence number: `%~0`, `%x~1`); a label with characters
//! other than letters, digits and `_.+-[]` is quoted (`%"a b"`). Output port
//! `k > 0` of a multi-output op is `%name#k`. Neither `~` nor `#` can occur in
//! a bare label, so the forms never clash with dotted labels.
//!
//! The sources (inputs, weights, KV caches) print first, sorted by label;
//! the other nodes follow in a depth-first post-order from the graph outputs
//! (operands in port order), then any node no output reads. The order
//! depends only on the graph's structure and labels, never on node indices,
//! which is what keeps the lines of untouched nodes in place across a pass.

use crate::graph::{Graph, NodeId, ValueRef};
use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// Whether `c` may appear in a label printed without quotes.
pub(crate) fn is_bare_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '+' | '-' | '[' | ']')
}

/// `s` as is when it is non-empty and all bare characters, else quoted with
/// Rust string escapes.
pub(crate) fn word(s: &str) -> String {
    if !s.is_empty() && s.chars().all(is_bare_char) {
        s.to_string()
    } else {
        format!("{s:?}")
    }
}

/// Renders the graph as text, one node per line (see the module docs).
pub fn print(graph: &Graph) -> String {
    let mut out = format!("graph {}\n", word(&graph.name));
    if graph.topo_order().is_none() {
        out.push_str("  <cycle>\n");
        return out;
    }
    let order = print_order(graph);
    let names = value_names(graph, &order);
    let value = |v: ValueRef| {
        let base = names.get(&v.node).map_or("%?", String::as_str);
        if v.port == 0 {
            base.to_string()
        } else {
            format!("{base}#{}", v.port)
        }
    };
    for id in order {
        let node = graph.node(id);
        let _ = write!(out, "  {} = {}", value(ValueRef::of(id)), node.op);
        let ins: Vec<String> = graph.inputs(id).into_iter().map(value).collect();
        if !ins.is_empty() {
            let _ = write!(out, "({})", ins.join(", "));
        }
        let tys: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
        let _ = writeln!(out, " : {}", tys.join(", "));
    }
    for (name, v) in &graph.outputs {
        let _ = writeln!(out, "  output {} = {}", word(name), value(*v));
    }
    out
}

/// The printed name (`%…`, without a port) of every node in `order`.
pub fn value_names(graph: &Graph, order: &[NodeId]) -> HashMap<NodeId, String> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut names = HashMap::with_capacity(order.len());
    for &id in order {
        let label = graph.node(id).label.as_str();
        let k = seen.entry(label).or_insert(0);
        let name = if *k == 0 && !label.is_empty() {
            format!("%{}", word(label))
        } else if label.is_empty() {
            format!("%~{k}")
        } else {
            format!("%{}~{k}", word(label))
        };
        *k += 1;
        names.insert(id, name);
    }
    names
}

/// Every node, in printing order: the sources (inputs, weights, caches)
/// sorted by label, then the other nodes in a depth-first post-order from
/// the graph outputs (operands in port order), then from each node not yet
/// printed, by index. Iterative, so deep graphs cannot overflow the stack.
///
/// Sources come first because a fusion that merges their readers would
/// otherwise move them; sorted by label (numbers by value, so `layers.2`
/// before `layers.10`), adding or removing one moves no other line.
pub fn print_order(graph: &Graph) -> Vec<NodeId> {
    let mut sources: Vec<(NodeId, String)> = graph
        .g
        .node_indices()
        .filter(|&id| graph.node(id).op.is_source())
        .map(|id| {
            let n = graph.node(id);
            let tys: Vec<String> = n.outputs.iter().map(|t| t.to_string()).collect();
            (id, format!("{} : {}", n.op, tys.join(", ")))
        })
        .collect();
    sources.sort_by(|(a, at), (b, bt)| {
        natural_cmp(&graph.node(*a).label, &graph.node(*b).label)
            .then_with(|| at.cmp(bt))
            .then_with(|| a.cmp(b))
    });
    let mut order: Vec<NodeId> = sources.into_iter().map(|(id, _)| id).collect();
    let mut done: HashSet<NodeId> = order.iter().copied().collect();
    let roots = graph
        .outputs
        .iter()
        .map(|(_, v)| v.node)
        .chain(graph.g.node_indices());
    for root in roots {
        if graph.g.node_weight(root).is_none() || !done.insert(root) {
            continue;
        }
        let mut stack = vec![(root, graph.inputs(root), 0)];
        while let Some((id, ins, next)) = stack.last_mut() {
            if let Some(v) = ins.get(*next) {
                *next += 1;
                let n = v.node;
                if done.insert(n) {
                    stack.push((n, graph.inputs(n), 0));
                }
            } else {
                order.push(*id);
                stack.pop();
            }
        }
    }
    order
}

/// Compares labels with runs of digits compared as numbers.
fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a, b);
    loop {
        let (Some(ca), Some(cb)) = (a.chars().next(), b.chars().next()) else {
            return a.len().cmp(&b.len());
        };
        let ord = if ca.is_ascii_digit() && cb.is_ascii_digit() {
            let da = a.len() - a.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            let db = b.len() - b.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            let (na, nb) = (
                a[..da].trim_start_matches('0'),
                b[..db].trim_start_matches('0'),
            );
            let ord = na
                .len()
                .cmp(&nb.len())
                .then_with(|| na.cmp(nb))
                .then(da.cmp(&db));
            (a, b) = (&a[da..], &b[db..]);
            ord
        } else {
            (a, b) = (&a[ca.len_utf8()..], &b[cb.len_utf8()..]);
            ca.cmp(&cb)
        };
        if ord != Ordering::Equal {
            return ord;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::natural_cmp;
    use std::cmp::Ordering::{Equal, Greater, Less};

    #[test]
    fn labels_sort_with_numbers_by_value() {
        assert_eq!(natural_cmp("layers.2.w", "layers.10.w"), Less);
        assert_eq!(natural_cmp("layers.10", "layers.9.x"), Greater);
        assert_eq!(natural_cmp("a", "a.b"), Less);
        assert_eq!(natural_cmp("x007", "x7"), Greater);
        assert_eq!(natural_cmp("rope", "rope"), Equal);
        assert_eq!(natural_cmp("", "a"), Less);
    }
}
