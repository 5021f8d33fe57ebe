//! `gerbilc inspect PLAN --svg FILE`: a picture of one transformer layer's
//! fused graph, as the plan runs it.
//!
//! [`layer_graph`] reads the decode schedule of the plan's first (best)
//! variant and keeps the dispatches of its middle layer: one box each,
//! labelled with the IR label (layer numbers removed, as `bench --profile`
//! groups them) and the kernel it runs. An edge goes from the dispatch that
//! last wrote a byte range to each dispatch that reads it; which bindings a
//! dispatch reads and writes comes from its kernel's binding declarations
//! (an output port is written, an input is read, a KV cache bound
//! `read_write` is written in place, uniforms and scratch carry no data
//! between dispatches). Data that
//! comes from outside the layer (the previous layer's residual stream) and
//! data that leaves it appear as small grey boxes; weights, which nothing in
//! the step writes, are left out. [`render_svg`] lays the graph out top to
//! bottom with `layout-rs` (a pure-Rust layered layout, no Graphviz) and
//! draws it through [`crate::svg_canvas`].
//!
//! The surprising part: the edges come from buffer ranges, not from the IR,
//! so the picture shows what the buffer planner and fusion actually left:
//! two dispatches that share an arena range only by reuse are not connected,
//! because the later write cuts the earlier writer out of the range.

use crate::svg_canvas::Canvas;
use anyhow::{bail, Context, Result};
use gerbil_plan::{Access, BufferKind, Dispatch, PlanHeader, Port};
use layout::core::base::Orientation;
use layout::core::color::Color;
use layout::core::geometry::Position;
use layout::core::style::StyleAttr;
use layout::std_shapes::render::get_shape_size;
use layout::std_shapes::shapes::{Arrow, Element, ShapeKind};
use layout::topo::layout::VisualGraph;
use std::collections::{BTreeMap, BTreeSet};

/// One box of the picture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphNode {
    /// The IR label without layer numbers (`attn.sdpa`), or for a node
    /// outside the layer where its data comes from or goes to.
    pub label: String,
    /// The kernel the dispatch runs; `None` for a node outside the layer.
    pub kernel: Option<String>,
}

/// A layer's dispatches and the data flowing between them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerGraph {
    /// What the picture shows: model, layer, schedule and variant.
    pub title: String,
    /// Boxes: the layer's dispatches in schedule order, then the nodes
    /// outside the layer.
    pub nodes: Vec<GraphNode>,
    /// `(writer, reader)` indices into `nodes`, each pair once.
    pub edges: Vec<(usize, usize)>,
}

/// How one dispatch binding moves data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Use {
    Read,
    Write,
    ReadWrite,
}

/// What each binding of dispatch `d` does, from its kernel's declarations:
/// `(buffer, start, end, use)` for the bindings that carry data. An output
/// port is written. An input is read, and also written where it is a KV
/// cache declared `read_write`: caches are the only values written in place
/// (`cache_write`), and their bindings are writable exactly where a kernel
/// writes them, whereas activations are always declared `read_write` (WebGPU
/// lets one arena buffer be bound several times in a dispatch only so).
fn uses(h: &PlanHeader, d: &Dispatch) -> Result<Vec<(u32, u64, u64, Use)>> {
    let kernel = h
        .kernels
        .get(d.kernel as usize)
        .with_context(|| format!("dispatch `{}` names missing kernel {}", d.label, d.kernel))?;
    if kernel.bindings.len() != d.bindings.len() {
        bail!(
            "dispatch `{}` binds {} slices but kernel `{}` declares {} bindings; the plan is damaged",
            d.label,
            d.bindings.len(),
            kernel.name,
            kernel.bindings.len()
        );
    }
    let mut out = Vec::new();
    for (decl, slice) in kernel.bindings.iter().zip(&d.bindings) {
        let kind = h.buffers.get(slice.buffer as usize).map(|b| &b.kind);
        let role = match (decl.port, decl.access, kind) {
            (Port::Output { .. }, _, _) => Use::Write,
            (Port::Input { .. }, Access::ReadWrite, Some(BufferKind::KvCache { .. })) => {
                Use::ReadWrite
            }
            (Port::Input { .. }, _, _) => Use::Read,
            (Port::Params | Port::Sampling | Port::Scratch | Port::Counters | Port::Rows, _, _) => {
                continue
            }
        };
        out.push((slice.buffer, slice.offset, slice.offset + slice.size, role));
    }
    Ok(out)
}

/// The last writer of every byte range of every buffer, as a schedule runs.
#[derive(Default)]
struct Writers {
    /// Per buffer: disjoint `(start, end, dispatch)` ranges.
    ranges: BTreeMap<u32, Vec<(u64, u64, usize)>>,
}

impl Writers {
    /// Dispatches whose writes the range `start..end` of `buffer` still holds.
    fn of(&self, buffer: u32, start: u64, end: u64) -> BTreeSet<usize> {
        self.ranges.get(&buffer).map_or_else(BTreeSet::new, |v| {
            v.iter()
                .filter(|&&(s, e, _)| s < end && start < e)
                .map(|&(_, _, w)| w)
                .collect()
        })
    }

    /// Records that `writer` wrote `start..end` of `buffer`: earlier writers
    /// keep only the parts outside it.
    fn write(&mut self, buffer: u32, start: u64, end: u64, writer: usize) {
        let v = self.ranges.entry(buffer).or_default();
        let mut kept = Vec::with_capacity(v.len() + 2);
        for &(s, e, w) in v.iter() {
            if e <= start || end <= s {
                kept.push((s, e, w));
                continue;
            }
            if s < start {
                kept.push((s, start, w));
            }
            if end < e {
                kept.push((end, e, w));
            }
        }
        kept.push((start, end, writer));
        *v = kept;
    }
}

/// Where a dispatch outside the layer sits, for its small node's label.
fn outside_label(d: &Dispatch, prefix: &str) -> String {
    match d.layer {
        Some(l) => format!("{prefix} layer {l}: {}", d.group_or_label()),
        None => format!("{prefix} {}", d.group_or_label()),
    }
}

/// The decode dispatches of the middle transformer layer of the plan's first
/// variant and the data flowing between them.
pub fn layer_graph(h: &PlanHeader) -> Result<LayerGraph> {
    let variant = h
        .variants
        .first()
        .context("the plan has no variants; recompile it")?;
    let layers = h.model.num_layers;
    if layers == 0 {
        bail!("the plan's model has no transformer layers to draw");
    }
    let layer = (layers / 2) as u32;
    let schedule = &variant.decode;
    let inside: Vec<usize> = (0..schedule.len())
        .filter(|&i| schedule[i].layer == Some(layer))
        .collect();
    if inside.is_empty() {
        bail!(
            "the decode schedule has no dispatch in layer {layer}; the plan is damaged or \
             from an older gerbilc that did not record layers: recompile it"
        );
    }
    // Data edges between dispatches of the whole step: (writer, reader).
    let mut flow = BTreeSet::new();
    let mut writers = Writers::default();
    for (i, d) in schedule.iter().enumerate() {
        let used = uses(h, d)?;
        for &(buffer, start, end, role) in &used {
            if role != Use::Write {
                for w in writers.of(buffer, start, end) {
                    flow.insert((w, i));
                }
            }
        }
        for &(buffer, start, end, role) in &used {
            if role != Use::Read {
                writers.write(buffer, start, end, i);
            }
        }
    }
    let mut nodes: Vec<GraphNode> = inside
        .iter()
        .map(|&i| {
            let d = &schedule[i];
            GraphNode {
                label: d.group_or_label().to_string(),
                kernel: Some(
                    h.kernels
                        .get(d.kernel as usize)
                        .map_or_else(|| format!("kernel {}", d.kernel), |k| k.name.clone()),
                ),
            }
        })
        .collect();
    let node_of: BTreeMap<usize, usize> = inside.iter().enumerate().map(|(n, &i)| (i, n)).collect();
    let mut outside: BTreeMap<String, usize> = BTreeMap::new();
    let mut edges = BTreeSet::new();
    for &(w, r) in &flow {
        let (from, to) = match (node_of.get(&w), node_of.get(&r)) {
            (Some(&a), Some(&b)) => (a, b),
            (None, Some(&b)) => {
                let label = outside_label(&schedule[w], "from");
                let n = *outside.entry(label.clone()).or_insert_with(|| {
                    nodes.push(GraphNode {
                        label,
                        kernel: None,
                    });
                    nodes.len() - 1
                });
                (n, b)
            }
            (Some(&a), None) => {
                let label = outside_label(&schedule[r], "to");
                let n = *outside.entry(label.clone()).or_insert_with(|| {
                    nodes.push(GraphNode {
                        label,
                        kernel: None,
                    });
                    nodes.len() - 1
                });
                (a, n)
            }
            (None, None) => continue,
        };
        edges.insert((from, to));
    }
    Ok(LayerGraph {
        title: format!(
            "{}: layer {layer} of {layers}, one decode step, variant {} ({} dispatches)",
            h.model.name,
            variant.name,
            inside.len()
        ),
        nodes,
        edges: edges.into_iter().collect(),
    })
}

/// A box element for `node`: dispatches in blue, outside nodes small and grey.
fn element(node: &GraphNode) -> Element {
    let (text, look) = match &node.kernel {
        Some(kernel) => (
            format!("{}\n{kernel}", node.label),
            StyleAttr::new(
                Color::new(0x2b4c7eff),
                2,
                Some(Color::new(0xdce8f7ff)),
                6,
                13,
            ),
        ),
        None => (
            node.label.clone(),
            StyleAttr::new(
                Color::new(0x8a8a8aff),
                1,
                Some(Color::new(0xf2f2f2ff)),
                3,
                10,
            ),
        ),
    };
    let shape = ShapeKind::new_box(&text);
    let size = get_shape_size(Orientation::TopToBottom, &shape, look.font_size, false);
    Element::create(shape, look, Orientation::TopToBottom, size)
}

/// Lays `g` out top to bottom and draws it into `canvas`; returns each
/// node's final position.
fn lay_out(g: &LayerGraph, canvas: &mut Canvas) -> Result<Vec<Position>> {
    let mut vg = VisualGraph::new(Orientation::TopToBottom);
    let handles: Vec<_> = g.nodes.iter().map(|n| vg.add_node(element(n))).collect();
    for &(a, b) in &g.edges {
        match (handles.get(a), handles.get(b)) {
            (Some(&from), Some(&to)) => vg.add_edge(Arrow::simple(""), from, to),
            _ => bail!("edge {a} → {b} names a node the graph does not have"),
        }
    }
    vg.do_it(false, false, false, canvas);
    Ok(handles.iter().map(|&h| vg.pos(h)).collect())
}

/// The graph as SVG text: the title, then the layered layout.
pub fn render_svg(g: &LayerGraph) -> Result<String> {
    let mut canvas = Canvas::default();
    lay_out(g, &mut canvas)?;
    Ok(canvas.finish(&g.title))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node(label: &str, kernel: Option<&str>) -> GraphNode {
        GraphNode {
            label: label.into(),
            kernel: kernel.map(Into::into),
        }
    }

    /// Boxes of the laid-out `g` pairwise disjoint, every one with a size.
    fn check_layout(g: &LayerGraph) {
        let positions = lay_out(g, &mut Canvas::default()).unwrap();
        assert_eq!(positions.len(), g.nodes.len());
        for (i, a) in positions.iter().enumerate() {
            let (lo, hi) = a.bbox(false);
            assert!(hi.x > lo.x && hi.y > lo.y, "node {i} has no area");
            for (j, b) in positions.iter().enumerate().skip(i + 1) {
                let (blo, bhi) = b.bbox(false);
                let apart = hi.x <= blo.x || bhi.x <= lo.x || hi.y <= blo.y || bhi.y <= lo.y;
                assert!(
                    apart,
                    "nodes {i} and {j} overlap: {lo:?}-{hi:?} and {blo:?}-{bhi:?}"
                );
            }
        }
    }

    #[test]
    fn a_layer_shaped_graph_lays_out_without_overlaps_and_with_every_label() {
        let g = LayerGraph {
            title: "tiny: layer 1 of 2".into(),
            nodes: vec![
                node("input_norm+attn.q_proj+k_proj+v_proj", Some("gemv_norm")),
                node("attn.q_rope+k_cache_write+v_cache_write", Some("qkv_rope")),
                node("attn.sdpa", Some("attention_decode")),
                node("attn.o_proj+residual", Some("gemv_residual")),
                node("from layer 0: mlp.down_proj+residual", None),
            ],
            edges: vec![(0, 1), (1, 2), (2, 3), (4, 0), (4, 3)],
        };
        check_layout(&g);
        let svg = render_svg(&g).unwrap();
        for text in [
            "attn.sdpa",
            "gemv_residual",
            "from layer 0: mlp.down_proj+residual",
            "tiny: layer 1 of 2",
        ] {
            assert!(svg.contains(text), "`{text}` missing from the SVG");
        }
        assert_eq!(svg.matches("marker-end").count(), g.edges.len());
    }

    #[test]
    fn an_edge_to_a_missing_node_is_an_error() {
        let g = LayerGraph {
            title: String::new(),
            nodes: vec![node("a", Some("k"))],
            edges: vec![(0, 3)],
        };
        let e = render_svg(&g).unwrap_err().to_string();
        assert!(e.contains("0 → 3"), "{e}");
    }

    #[test]
    fn a_later_write_cuts_the_earlier_writer_out_of_its_range() {
        let mut w = Writers::default();
        w.write(0, 0, 100, 1);
        w.write(0, 40, 60, 2);
        assert_eq!(w.of(0, 0, 40), BTreeSet::from([1]));
        assert_eq!(w.of(0, 45, 50), BTreeSet::from([2]));
        assert_eq!(w.of(0, 50, 100), BTreeSet::from([1, 2]));
        assert_eq!(w.of(0, 100, 200), BTreeSet::new());
        assert_eq!(w.of(1, 0, 100), BTreeSet::new());
    }

    proptest! {
        // 48 cases at proptest's default scale (256; `PROPTEST_CASES` scales it).
        #![proptest_config(ProptestConfig {
            cases: (48 * ProptestConfig::default().cases / 256).max(1),
            ..ProptestConfig::default()
        })]
        /// Random DAGs of a layer's size: edges only forward, as a schedule
        /// orders them; labels of random length.
        #[test]
        fn random_dags_lay_out_without_overlaps(
            sizes in prop::collection::vec((1usize..40, any::<bool>()), 1..15),
            picks in prop::collection::vec((0usize..15, 0usize..15), 0..30),
        ) {
            let nodes: Vec<GraphNode> = sizes
                .iter()
                .enumerate()
                .map(|(i, &(len, dispatch))| GraphNode {
                    label: format!("{i}{}", "x".repeat(len)),
                    kernel: dispatch.then(|| "kernel".repeat(len % 5 + 1)),
                })
                .collect();
            let n = nodes.len();
            let edges: BTreeSet<(usize, usize)> = picks
                .iter()
                .map(|&(a, b)| (a % n, b % n))
                .filter(|&(a, b)| a < b)
                .collect();
            check_layout(&LayerGraph {
                title: "random".into(),
                nodes,
                edges: edges.into_iter().collect(),
            });
        }
    }
}
