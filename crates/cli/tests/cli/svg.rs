//! The pictures the tools draw, rendered as a viewer would: `gerbilc inspect
//! --svg` (one layer's fused graph) and `gerbil-run bench --sweep --plot`
//! (speed against context) on the tiny Llama, each SVG parsed by usvg and
//! rasterized to PNG by resvg. resvg is built without text support (the
//! font stack cost a minute of every test build), so the text is checked in
//! the SVG's source and the boxes, lines and markers must paint the image.

use crate::common::*;
use gerbil_cli::graph_svg::layer_graph;
use resvg::{tiny_skia, usvg};
use std::path::Path;

/// Parses `svg`, renders it on white and round-trips the PNG; returns the
/// size and how many pixels are not white.
fn render_png(svg: &str, png: &Path) -> (u32, u32, usize) {
    let opt = usvg::Options::default();
    let tree = usvg::Tree::from_str(svg, &opt).expect("the SVG parses");
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height()).expect("a canvas");
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap.save_png(png).expect("write the PNG");
    let back = tiny_skia::Pixmap::load_png(png).expect("the PNG reads back");
    let inked = back
        .pixels()
        .iter()
        .filter(|p| (p.red(), p.green(), p.blue()) != (255, 255, 255))
        .count();
    (back.width(), back.height(), inked)
}

/// Lines of `gerbilc inspect --schedule` for `layer`'s dispatches of the
/// first variant's decode: `(label without the layer prefix, kernel)`.
fn decode_dispatches(plan: &Path, layer: u32) -> Vec<(String, String)> {
    let o = gerbilc(&["inspect", plan.to_str().unwrap(), "--schedule"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let decode = text.split_once(" decode (").expect("a decode schedule").1;
    let prefix = format!("layers.{layer}.");
    decode
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with(' '))
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.get(1) == Some(&layer.to_string().as_str())).then(|| {
                (
                    cols[2].replace(&prefix, ""),
                    cols.last().unwrap().to_string(),
                )
            })
        })
        .collect()
}

#[test]
fn inspect_svg_draws_the_middle_layer_and_renders() {
    let (dir, plan) = tiny_plan("graph", &[]);
    let svg_path = dir.path().join("graph.svg");
    let o = gerbilc(&[
        "inspect",
        plan.to_str().unwrap(),
        "--svg",
        svg_path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("wrote"), "{}", stderr(&o));
    let svg = std::fs::read_to_string(&svg_path).unwrap();

    // Every decode dispatch of layer 1 (of 2) is a box with its label and kernel.
    let dispatches = decode_dispatches(&plan, 1);
    assert!(dispatches.len() >= 4, "{dispatches:?}");
    for (label, kernel) in &dispatches {
        assert!(svg.contains(label.as_str()), "label `{label}` missing");
        assert!(svg.contains(kernel.as_str()), "kernel `{kernel}` missing");
    }
    assert!(
        !svg.contains("layers.1."),
        "layer numbers stay out of labels"
    );
    assert!(svg.contains("layer 1 of 2, one decode step"), "title");
    // One box per dispatch, one for the previous layer's output and one for
    // its reader after the layer, and the background: no weights, no caches.
    assert_eq!(svg.matches("<rect").count(), dispatches.len() + 3, "{svg}");
    assert!(
        svg.contains("from layer 0: mlp.down_proj+residual"),
        "{svg}"
    );

    let (w, h, inked) = render_png(&svg, &dir.path().join("graph.png"));
    assert!(
        (200..6000).contains(&w) && (200..6000).contains(&h),
        "{w}x{h}"
    );
    assert!(
        inked > (w * h) as usize / 100,
        "only {inked} of {w}x{h} pixels painted"
    );
}

#[test]
fn the_layer_graph_follows_the_data() {
    let (_dir, plan) = tiny_plan("edges", &[]);
    let plan = gerbil_plan::PlanFile::open(&plan).unwrap();
    let g = layer_graph(&plan.header).unwrap();
    let find = |label: &str| {
        g.nodes
            .iter()
            .position(|n| n.label == label)
            .unwrap_or_else(|| panic!("no node `{label}` in {:?}", g.nodes))
    };
    let qkv = find("input_norm+attn.q_proj+k_proj+v_proj");
    let rope = find("attn.q_rope+k_cache_write+v_cache_write");
    let sdpa = find("attn.sdpa");
    let o_proj = find("attn.o_proj+residual");
    let gate_up = find("post_attention_norm+mlp.gate_proj+up_proj");
    let down = find("mlp.down_proj+residual");
    let before = find("from layer 0: mlp.down_proj+residual");
    let after = find("to last_row+final_norm+lm_head");
    for n in [qkv, rope, sdpa, o_proj, gate_up, down] {
        assert!(g.nodes[n].kernel.is_some(), "{:?}", g.nodes[n]);
    }
    let mut expected = vec![
        (before, qkv),
        (qkv, rope),
        (rope, sdpa),
        (sdpa, o_proj),
        (before, o_proj),
        (o_proj, gate_up),
        (o_proj, down),
        (gate_up, down),
        (down, after),
    ];
    expected.sort();
    assert_eq!(g.edges, expected, "nodes: {:?}", g.nodes);
}

#[test]
fn bench_sweep_prints_points_and_plots_them() {
    let (dir, plan) = tiny_plan("sweep", &["--max-context", "64"]);
    let plan = plan.to_str().unwrap();
    let chart = dir.path().join("bench.svg");
    let sweep = [
        plan,
        "bench",
        "--sweep",
        "--new-tokens",
        "8",
        "--repeats",
        "1",
    ];
    let mut args = sweep.to_vec();
    args.extend(["--json", "--plot", chart.to_str().unwrap()]);
    let o = gerbil_run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let points: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let points = points.as_array().expect("a JSON array");
    let contexts: Vec<u64> = points
        .iter()
        .map(|p| p["context"].as_u64().unwrap())
        .collect();
    assert_eq!(contexts, [16, 32, 64]);
    for p in points {
        for key in ["prefill_tok_s", "decode_tok_s"] {
            let v = p[key].as_f64().unwrap();
            assert!(v.is_finite() && v > 0.0, "{key} {v} in {p}");
        }
        let depth = p["decode_depth"].as_u64().unwrap();
        assert!(
            depth + 8 <= 64 && depth <= p["context"].as_u64().unwrap(),
            "{p}"
        );
    }

    let svg = std::fs::read_to_string(&chart).unwrap();
    for text in [
        "context length (tokens, log scale)",
        "tokens per second (log scale)",
        "prefill (a prompt of that length)",
        "decode (8 tokens from that depth)",
        "speed against context",
    ] {
        assert!(svg.contains(text), "`{text}` missing from the chart");
    }
    let (w, h, inked) = render_png(&svg, &dir.path().join("bench.png"));
    assert_eq!((w, h), (900, 560));
    assert!(inked > 2000, "only {inked} pixels painted");

    let o = gerbil_run(&sweep);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 3, "{table}");
    assert!(table.contains("prefill tok/s"), "{table}");
}

#[test]
fn flags_that_do_not_go_together_are_errors() {
    let (dir, plan) = tiny_plan("flags", &["--max-context", "64"]);
    let plan = plan.to_str().unwrap();
    let chart = dir.path().join("x.svg");
    let chart = chart.to_str().unwrap();
    assert_fails_with(&gerbil_run(&[plan, "bench", "--plot", chart]), "--sweep");
    assert_fails_with(
        &gerbil_run(&[plan, "bench", "--sweep", "--depth", "4"]),
        "--depth",
    );
    assert_fails_with(
        &gerbil_run(&[plan, "bench", "--sweep", "--new-tokens", "64"]),
        "--new-tokens 64",
    );
    assert!(!Path::new(chart).exists());
    assert_fails_with(
        &gerbilc(&["inspect", plan, "--svg", chart, "--json"]),
        "--json",
    );
}
