//! `dce`: removes every node whose value reaches no graph output.
//!
//! Pattern: a node with no path to a named output. Rewrite: delete it.
//! KV-cache writes stay alive because attention reads their result.

use crate::manager::{Pass, PassError};
use gerbil_ir::Graph;
use petgraph::Direction;
use std::collections::HashSet;

/// Dead-code elimination.
pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn description(&self) -> &'static str {
        "delete nodes that no graph output depends on"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, PassError> {
        let mut live = HashSet::new();
        let mut stack: Vec<_> = graph.outputs.iter().map(|(_, v)| v.node).collect();
        while let Some(n) = stack.pop() {
            if live.insert(n) {
                stack.extend(graph.g.neighbors_directed(n, Direction::Incoming));
            }
        }
        let dead: Vec<_> = graph
            .g
            .node_indices()
            .filter(|n| !live.contains(n))
            .collect();
        for n in &dead {
            graph.remove(*n);
        }
        Ok(dead.len())
    }
}
