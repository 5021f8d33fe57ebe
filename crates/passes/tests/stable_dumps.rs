//! The dump after a pass differs from the dump before it only in the lines of
//! the nodes the pass removed, created or rewired: values are named from
//! labels and printed in an order that depends on the graph's structure, so
//! untouched nodes keep their text and their relative order. A pass that
//! reports no rewrites leaves the dump identical.

mod common;

use gerbil_ir::print::{print, print_order};
use gerbil_ir::{Graph, NodeId};
use gerbil_passes::default_pipeline;
use std::collections::HashSet;

/// Nodes that exist in both graphs with the same op, label, types and inputs.
fn untouched(before: &Graph, after: &Graph) -> HashSet<NodeId> {
    before
        .g
        .node_indices()
        .filter(|&id| {
            after.g.node_weight(id) == before.g.node_weight(id)
                && after.inputs(id) == before.inputs(id)
        })
        .collect()
}

/// The printed line of every node, keyed by node, and the nodes in order.
fn lines(graph: &Graph) -> (Vec<NodeId>, Vec<String>) {
    let text = print(graph);
    let lines: Vec<String> = text.lines().skip(1).map(str::to_string).collect();
    (print_order(graph), lines)
}

/// Lines of `a` and of `b` outside a longest common subsequence.
fn diff(a: &[String], b: &[String]) -> (HashSet<usize>, HashSet<usize>) {
    let (n, m) = (a.len(), b.len());
    let mut l = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            l[i][j] = if a[i] == b[j] {
                l[i + 1][j + 1] + 1
            } else {
                l[i + 1][j].max(l[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let (mut gone, mut new) = (HashSet::new(), HashSet::new());
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if j == m || (i < n && l[i + 1][j] >= l[i][j + 1]) {
            gone.insert(i);
            i += 1;
        } else {
            new.insert(j);
            j += 1;
        }
    }
    (gone, new)
}

/// Runs the pipeline on `graph`, checking each pass's dump diff; returns the
/// number of changed lines per pass.
fn check(model: &str, mut graph: Graph) -> Vec<(String, usize, usize)> {
    let mut sizes = Vec::new();
    for pass in default_pipeline() {
        let before = graph.clone();
        let rewrites = pass.run(&mut graph).unwrap();
        let keep = untouched(&before, &graph);
        let ((order_a, lines_a), (order_b, lines_b)) = (lines(&before), lines(&graph));
        let kept_a: Vec<NodeId> = order_a
            .iter()
            .copied()
            .filter(|n| keep.contains(n))
            .collect();
        let kept_b: Vec<NodeId> = order_b
            .iter()
            .copied()
            .filter(|n| keep.contains(n))
            .collect();
        let what = format!("{model}, {}", pass.name());
        assert_eq!(
            rewrites == 0,
            lines_a == lines_b,
            "{what}: {rewrites} rewrites must change the dump exactly when nonzero"
        );
        assert_eq!(kept_a, kept_b, "{what}: untouched nodes changed order");
        let (gone, new) = diff(&lines_a, &lines_b);
        for (i, id) in order_a.iter().enumerate() {
            assert!(
                !(keep.contains(id) && gone.contains(&i)),
                "{what}: untouched line changed: {}",
                lines_a[i]
            );
        }
        for (j, id) in order_b.iter().enumerate() {
            assert!(
                !(keep.contains(id) && new.contains(&j)),
                "{what}: untouched line changed: {}",
                lines_b[j]
            );
        }
        sizes.push((pass.name().to_string(), gone.len(), new.len()));
    }
    sizes
}

#[test]
fn a_pass_changes_only_the_lines_it_rewrote() {
    for model in common::tiny_models() {
        check(&model, common::tiny(&model));
    }
}

#[test]
fn fuse_qkv_on_tiny_llama_changes_its_projection_lines_only() {
    let sizes = check("llama", common::tiny("llama"));
    let qkv = sizes.iter().find(|(n, _, _)| n == "fuse-qkv").unwrap();
    // Per layer (2): the q/k/v weights and matmuls go (6 lines); the stacked
    // weight, the fused matmul and three slices named like the old matmuls
    // come (5 lines). The ropes and cache writes read the slices by the old
    // names, so their lines stay.
    assert_eq!((qkv.1, qkv.2), (12, 10), "{sizes:?}");
}
