//! Lowering every family's tiny fixture: graph structure and attributes per
//! family, v4 vs v5 config spellings, per-layer windows and RoPE tables,
//! LongRoPE's context switch, and shape variants that do not divide evenly.

mod common;

use common::random_checkpoint::{odd_shape_variants, write_random_checkpoint, write_variant};
use common::*;
use gerbil_frontend_hf::{
    lower, lower_with, required_weights, Checkpoint, FrontendError, LowerOptions, Lowered,
};
use gerbil_ir::{print::print, Attention, Graph, MatMul, Node, Op, RmsNorm, UnaryOp, WeightSource};
use serde_json::{json, Value};
use std::path::Path;

fn lower_dir(dir: &Path) -> Lowered {
    lower_dir_with(dir, &LowerOptions::default())
}

fn lower_dir_with(dir: &Path, options: &LowerOptions) -> Lowered {
    let ckpt = Checkpoint::open(dir).unwrap();
    let lowered = lower_with(&ckpt, options).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    gerbil_ir::verify(&lowered.graph).unwrap();
    lowered
}

fn lower_err(dir: &Path) -> FrontendError {
    match Checkpoint::open(dir).and_then(|c| lower(&c)) {
        Ok(_) => panic!("{} lowered without error", dir.display()),
        Err(e) => e,
    }
}

fn nodes<'g>(g: &'g Graph, pred: impl Fn(&Op) -> bool + 'g) -> impl Iterator<Item = &'g Node> {
    g.g.node_weights().filter(move |n| pred(&n.op))
}

fn count(g: &Graph, pred: impl Fn(&Op) -> bool + 'static) -> usize {
    nodes(g, pred).count()
}

fn by_label<'g>(g: &'g Graph, label: &str) -> &'g Node {
    g.g.node_weights()
        .find(|n| n.label == label)
        .unwrap_or_else(|| panic!("no node labelled {label}"))
}

fn attention(g: &Graph, layer: u32) -> Attention {
    match &by_label(g, &format!("layers.{layer}.attn.sdpa")).op {
        Op::Attention(a) => a.clone(),
        other => panic!("{other:?}"),
    }
}

fn norm(g: &Graph, label: &str) -> RmsNorm {
    match &by_label(g, label).op {
        Op::RmsNorm(n) => n.clone(),
        other => panic!("{other:?}"),
    }
}

/// The label of input `port` of the node labelled `label`.
fn input_label(g: &Graph, label: &str, port: usize) -> String {
    let id =
        g.g.node_indices()
            .find(|&i| g.g[i].label == label)
            .unwrap_or_else(|| panic!("no node labelled {label}"));
    g.node(g.inputs(id)[port].node).label.clone()
}

/// `(inv_freq, attention_scaling)` of the RoPE table labelled `label`.
fn rope_table(g: &Graph, label: &str) -> (Vec<f32>, f32) {
    match &by_label(g, label).op {
        Op::Weight(w) => match &w.source {
            WeightSource::RopeTable {
                inv_freq,
                attention_scaling,
            } => (inv_freq.clone(), *attention_scaling),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

fn rope_tables(g: &Graph) -> usize {
    count(
        g,
        |op| matches!(op, Op::Weight(w) if matches!(w.source, WeightSource::RopeTable { .. })),
    )
}

/// Plain RoPE's first frequencies for base `theta` over `dim` dimensions.
fn plain_freq(theta: f64, dim: u32, i: u32) -> f32 {
    gerbil_frontend_hf::rope::default_inv_freq(theta, dim)[i as usize]
}

/// The head reads `lm_head.weight` (untied) or the embedding table (tied).
fn head_weight(g: &Graph) -> String {
    input_label(g, "lm_head", 1)
}

fn assert_same_graph(a: &Graph, b: &Graph) {
    assert_eq!(print(a), print(b));
    let weights = |g: &Graph| -> Vec<Op> {
        g.g.node_weights()
            .filter(|n| matches!(n.op, Op::Weight(_)))
            .map(|n| n.op.clone())
            .collect()
    };
    assert_eq!(weights(a), weights(b));
}

#[test]
fn every_tiny_family_is_registered() {
    for (dir, family) in [
        ("llama", "llama"),
        ("qwen2", "qwen2"),
        ("qwen3", "qwen3"),
        ("mistral", "mistral"),
        ("gemma3", "gemma3"),
        ("phi3", "phi3"),
    ] {
        let l = lower_dir(&model(&format!("tiny/{dir}")));
        assert_eq!(l.facts.family, family);
        assert_eq!(
            gerbil_frontend_hf::family_of(&l.facts.architecture),
            Some(family)
        );
    }
}

#[test]
fn qwen2_has_qkv_biases_and_an_untied_head() {
    let g = lower_dir(&model("tiny/qwen2")).graph;
    // A biased projection is a plain matmul followed by `add_bias`
    // (`fuse-matmul-bias` folds the two later).
    let with_bias = |label: &str| {
        assert_eq!(by_label(&g, label).op, Op::MatMul(MatMul::linear(false)));
        g.g.node_weights()
            .any(|n| n.label == format!("{label}.bias") && n.op == Op::AddBias)
    };
    for i in 0..2 {
        for proj in ["q_proj", "k_proj", "v_proj"] {
            assert!(with_bias(&format!("layers.{i}.attn.{proj}")), "{proj}");
        }
        assert!(!with_bias(&format!("layers.{i}.attn.o_proj")));
        assert!(!with_bias(&format!("layers.{i}.mlp.up_proj")));
        assert_eq!(attention(&g, i).window, None);
    }
    assert_eq!(count(&g, |op| *op == Op::AddBias), 6);
    assert_eq!(
        input_label(&g, "layers.0.attn.k_proj.bias", 1),
        "model.layers.0.self_attn.k_proj.bias"
    );
    assert_eq!(head_weight(&g), "lm_head.weight");
    let (inv_freq, scaling) = rope_table(&g, "rope_table");
    assert_eq!((inv_freq[1], scaling), (plain_freq(1e6, 16, 1), 1.0));
}

#[test]
fn qwen2_slides_layers_from_max_window_layers() {
    let tmp = TempDir::new("qwen2win");
    let dir = copy_model(&tmp, "tiny/qwen2", "qwen2");
    edit_config(&dir, |c| {
        c.insert("use_sliding_window".into(), json!(true));
        c.insert("sliding_window".into(), json!(4));
        c.insert("max_window_layers".into(), json!(1));
        c.remove("layer_types");
    });
    let g = lower_dir(&dir).graph;
    assert_eq!(
        (attention(&g, 0).window, attention(&g, 1).window),
        (None, Some(4))
    );
    // Explicit layer types win; without use_sliding_window nothing slides.
    edit_config(&dir, |c| {
        c.insert(
            "layer_types".into(),
            json!(["sliding_attention", "full_attention"]),
        );
    });
    let g = lower_dir(&dir).graph;
    assert_eq!(
        (attention(&g, 0).window, attention(&g, 1).window),
        (Some(4), None)
    );
    edit_config(&dir, |c| {
        c.insert("use_sliding_window".into(), json!(false));
    });
    let g = lower_dir(&dir).graph;
    assert_eq!(attention(&g, 0).window, None);
    // A wrong number of layer types is named.
    edit_config(&dir, |c| {
        c.insert("layer_types".into(), json!(["full_attention"]));
    });
    let msg = lower_err(&dir).to_string();
    assert!(
        msg.contains("layer_types") && msg.contains("has 1 entries"),
        "{msg}"
    );
    edit_config(&dir, |c| {
        c.insert(
            "layer_types".into(),
            json!(["full_attention", "chunked_attention"]),
        );
    });
    let msg = lower_err(&dir).to_string();
    assert!(msg.contains("chunked_attention"), "{msg}");
}

#[test]
fn qwen3_norms_queries_and_keys_per_head() {
    let g = lower_dir(&model("tiny/qwen3")).graph;
    // 2 per layer + final + q/k norms.
    assert_eq!(
        count(&g, |op| matches!(op, Op::RmsNorm(_))),
        2 * 2 + 1 + 2 * 2
    );
    let q = norm(&g, "layers.1.attn.q_norm");
    let k = norm(&g, "layers.1.attn.k_norm");
    assert_eq!((q.groups, k.groups), (4, 2));
    assert_eq!((q.weight_offset, q.eps), (0.0, 1e-6));
    assert_eq!(
        input_label(&g, "layers.1.attn.q_norm", 0),
        "layers.1.attn.q_proj"
    );
    assert_eq!(
        input_label(&g, "layers.1.attn.q_norm", 1),
        "model.layers.1.self_attn.q_norm.weight"
    );
    assert_eq!(
        input_label(&g, "layers.1.attn.q_rope", 0),
        "layers.1.attn.q_norm"
    );
    assert_eq!(
        g.value_type(g.outputs[0].1).to_string(),
        "f32[T,512]",
        "logits"
    );
    let a = attention(&g, 0);
    assert_eq!((a.n_heads, a.n_kv_heads, a.head_dim), (4, 2, 32));
    assert_eq!(a.scale, (32f64).powf(-0.5) as f32);
    let q_proj = by_label(&g, "model.layers.0.self_attn.q_proj.weight");
    assert_eq!(q_proj.outputs[0].to_string(), "f32[128,64]");
    assert_eq!(head_weight(&g), "model.embed_tokens.weight");
    assert!(print(&g).contains("rms_norm{eps=1e-6, offset=0, groups=4}"));
}

#[test]
fn qwen3_head_dim_defaults_to_128() {
    let tmp = TempDir::new("qwen3hd");
    let dir = tmp.subdir("qwen3");
    let mut config = read_config(&model("tiny/qwen3"));
    config.as_object_mut().unwrap().remove("head_dim");
    write_random_checkpoint(&dir, &config, 1);
    let a = attention(&lower_dir(&dir).graph, 0);
    assert_eq!(a.head_dim, 128);
}

#[test]
fn mistral_slides_every_layer() {
    let g = lower_dir(&model("tiny/mistral")).graph;
    assert_eq!(
        (attention(&g, 0).window, attention(&g, 1).window),
        (Some(4), Some(4))
    );
    assert!(print(&g).contains("window=4"));
    assert_eq!(head_weight(&g), "lm_head.weight");
    let tmp = TempDir::new("mistralwin");
    let dir = copy_model(&tmp, "tiny/mistral", "mistral");
    // `null` turns the window off; an absent key means MistralConfig's 4096.
    edit_config(&dir, |c| {
        c.insert("sliding_window".into(), Value::Null);
    });
    assert_eq!(attention(&lower_dir(&dir).graph, 1).window, None);
    edit_config(&dir, |c| {
        c.remove("sliding_window");
    });
    assert_eq!(attention(&lower_dir(&dir).graph, 1).window, Some(4096));
    edit_config(&dir, |c| {
        c.insert("sliding_window".into(), json!(0));
    });
    assert!(lower_err(&dir).to_string().contains("sliding_window"));
}

#[test]
fn gemma3_graph() {
    let l = lower_dir(&model("tiny/gemma3"));
    let g = &l.graph;
    assert_eq!(l.facts.family, "gemma3");
    // Embedding × √64.
    assert_eq!(
        by_label(g, "embed").op,
        Op::Embedding(gerbil_ir::Embedding {
            scale: Some(8.0),
            padding: Some(0),
        })
    );
    // 4 per layer + q/k norms + final, all `(1 + w)`.
    let norms: Vec<RmsNorm> = nodes(g, |op| matches!(op, Op::RmsNorm(_)))
        .map(|n| match &n.op {
            Op::RmsNorm(r) => r.clone(),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(norms.len(), 3 * 4 + 3 * 2 + 1);
    assert!(norms.iter().all(|n| n.weight_offset == 1.0));
    assert_eq!(norm(g, "layers.0.attn.q_norm").groups, 4);
    assert_eq!(norm(g, "layers.0.attn.k_norm").groups, 1);
    // Sandwich: the attention output is normalized, then added.
    assert_eq!(
        input_label(g, "layers.0.attn.post_norm", 0),
        "layers.0.attn.o_proj"
    );
    assert_eq!(
        input_label(g, "layers.0.attn.residual", 1),
        "layers.0.attn.post_norm"
    );
    assert_eq!(
        input_label(g, "layers.0.pre_mlp_norm", 1),
        "model.layers.0.pre_feedforward_layernorm.weight"
    );
    assert_eq!(
        input_label(g, "layers.0.mlp.residual", 1),
        "layers.0.mlp.post_norm"
    );
    assert_eq!(
        input_label(g, "layers.0.mlp.post_norm", 1),
        "model.layers.0.post_feedforward_layernorm.weight"
    );
    // GeGLU.
    assert_eq!(count(g, |op| matches!(op, Op::Unary(UnaryOp::GeluTanh))), 3);
    // query_pre_attn_scalar 24, windows by layer type, one KV head of 32.
    let expected_scale = 24f64.powf(-0.5) as f32;
    for (i, window) in [(0, Some(4)), (1, Some(4)), (2, None)] {
        let a = attention(g, i);
        assert_eq!((a.n_heads, a.n_kv_heads, a.head_dim), (4, 1, 32));
        assert_eq!((a.scale, a.window), (expected_scale, window), "layer {i}");
    }
    // Two RoPE tables: θ 1e4 for sliding layers, θ 1e6 for full ones.
    assert_eq!(rope_tables(g), 2);
    let (local, _) = rope_table(g, "rope_table.sliding_attention");
    let (global, _) = rope_table(g, "rope_table.full_attention");
    assert_eq!(local[1], plain_freq(1e4, 32, 1));
    assert_eq!(global[1], plain_freq(1e6, 32, 1));
    for (i, table) in [
        (0, "rope_table.sliding_attention"),
        (1, "rope_table.sliding_attention"),
        (2, "rope_table.full_attention"),
    ] {
        assert_eq!(input_label(g, &format!("layers.{i}.attn.q_rope"), 1), table);
        assert_eq!(input_label(g, &format!("layers.{i}.attn.k_rope"), 1), table);
    }
    // Tied head, then the final softcap.
    let (_, logits) = g.outputs[0];
    assert_eq!(g.node(logits.node).op, Op::Unary(UnaryOp::Softcap(8.0)));
    assert_eq!(input_label(g, "logit_softcap", 0), "lm_head");
    assert_eq!(head_weight(g), "model.embed_tokens.weight");
}

#[test]
fn tiny_gemma3_snapshot() {
    insta::assert_snapshot!(print(&lower_dir(&model("tiny/gemma3")).graph));
}

/// Rewrites the tiny Gemma 3 config in transformers-4 spelling: `rope_theta`,
/// `rope_local_base_freq`, `rope_scaling` (for full layers), the
/// `sliding_window_pattern` instead of `layer_types`, `torch_dtype`.
fn gemma3_to_v4(dir: &Path) {
    edit_config(dir, |c| {
        let rope = c.remove("rope_parameters").unwrap();
        let full = rope["full_attention"].as_object().unwrap().clone();
        let local = &rope["sliding_attention"];
        c.insert("rope_theta".into(), full["rope_theta"].clone());
        c.insert("rope_local_base_freq".into(), local["rope_theta"].clone());
        let mut scaling = full.clone();
        scaling.remove("rope_theta");
        let rope_type = scaling.remove("rope_type").unwrap();
        if rope_type == "default" {
            c.insert("rope_scaling".into(), Value::Null);
        } else {
            scaling.insert("rope_type".into(), rope_type);
            c.insert("rope_scaling".into(), scaling.into());
        }
        c.remove("layer_types");
        c.remove("_sliding_window_pattern");
        c.insert("sliding_window_pattern".into(), json!(3));
        let dtype = c.remove("dtype").unwrap();
        c.insert("torch_dtype".into(), dtype);
        c.insert("transformers_version".into(), json!("4.53.0"));
    });
}

#[test]
fn gemma3_v4_and_v5_configs_lower_identically() {
    let tmp = TempDir::new("gemma3v4");
    let v5 = copy_model(&tmp, "tiny/gemma3", "v5/gemma3");
    let v4 = copy_model(&tmp, "tiny/gemma3", "v4/gemma3");
    gemma3_to_v4(&v4);
    assert!(read_config(&v4).get("layer_types").is_none());
    assert_same_graph(&lower_dir(&v5).graph, &lower_dir(&v4).graph);

    // With linear scaling on the full layers (as Gemma 3 4B+ ships).
    edit_config(&v5, |c| {
        c["rope_parameters"]["full_attention"] =
            json!({"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6});
    });
    std::fs::copy(v5.join("config.json"), v4.join("config.json")).unwrap();
    gemma3_to_v4(&v4);
    assert_eq!(read_config(&v4)["rope_scaling"]["rope_type"], "linear");
    let g = lower_dir(&v5).graph;
    assert_same_graph(&g, &lower_dir(&v4).graph);
    assert_eq!(
        rope_table(&g, "rope_table.full_attention").0[1],
        plain_freq(1e6, 32, 1) / 8.0
    );
    assert_eq!(
        rope_table(&g, "rope_table.sliding_attention").0[1],
        plain_freq(1e4, 32, 1)
    );
}

#[test]
fn gemma3_defaults_and_patterns() {
    let tmp = TempDir::new("gemma3pat");
    let dir = copy_model(&tmp, "tiny/gemma3", "gemma3");
    // v4 with no RoPE keys at all: θ 1e6 full, 1e4 sliding; pattern 2.
    edit_config(&dir, |c| {
        c.remove("rope_parameters");
        c.remove("layer_types");
        c.insert("sliding_window_pattern".into(), json!(2));
    });
    let g = lower_dir(&dir).graph;
    let windows: Vec<_> = (0..3).map(|i| attention(&g, i).window).collect();
    assert_eq!(windows, [Some(4), None, Some(4)]);
    assert_eq!(
        rope_table(&g, "rope_table.full_attention").0[1],
        plain_freq(1e6, 32, 1)
    );
    assert_eq!(
        rope_table(&g, "rope_table.sliding_attention").0[1],
        plain_freq(1e4, 32, 1)
    );
    // Only layer types in use get a table; no softcap without the key.
    edit_config(&dir, |c| {
        c.insert(
            "layer_types".into(),
            json!(["full_attention", "full_attention", "full_attention"]),
        );
        c.insert("final_logit_softcapping".into(), Value::Null);
    });
    let g = lower_dir(&dir).graph;
    assert_eq!(rope_tables(&g), 1);
    let (_, logits) = g.outputs[0];
    assert_eq!(g.node(logits.node).label, "lm_head");
    // The default pattern is 6: five sliding layers, then a full one.
    edit_config(&dir, |c| {
        c.remove("layer_types");
        c.remove("sliding_window_pattern");
    });
    let g = lower_dir(&dir).graph;
    assert_eq!(attention(&g, 2).window, Some(4));
}

#[test]
fn gemma3_rejects_what_it_cannot_run() {
    let tmp = TempDir::new("gemma3bad");
    let dir = copy_model(&tmp, "tiny/gemma3", "gemma3");
    edit_config(&dir, |c| {
        c.insert("use_bidirectional_attention".into(), json!(true));
    });
    assert!(lower_err(&dir)
        .to_string()
        .contains("use_bidirectional_attention"));
    edit_config(&dir, |c| {
        c.insert("use_bidirectional_attention".into(), json!(false));
        c.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": 1e6}),
        );
    });
    let msg = lower_err(&dir).to_string();
    assert!(msg.contains("per layer type"), "{msg}");
    edit_config(&dir, |c| {
        c.remove("rope_parameters");
        c.insert("hidden_activation".into(), json!("gelu"));
    });
    let msg = lower_err(&dir).to_string();
    assert!(
        msg.contains("hidden_activation") && msg.contains("gelu_pytorch_tanh"),
        "{msg}"
    );
}

#[test]
fn phi3_splits_fused_projections_into_row_ranges() {
    let g = lower_dir(&model("tiny/phi3")).graph;
    let rows = |label: &str| match &by_label(&g, &input_label(&g, label, 1)).op {
        Op::Weight(w) => (w.source.clone(), w.ty.to_string()),
        other => panic!("{other:?}"),
    };
    let fused = |tensor: &str, start, count| WeightSource::Rows {
        tensor: tensor.to_string(),
        start,
        count,
    };
    let qkv = "model.layers.1.self_attn.qkv_proj.weight";
    let gate_up = "model.layers.1.mlp.gate_up_proj.weight";
    assert_eq!(
        rows("layers.1.attn.q_proj"),
        (fused(qkv, 0, 64), "f32[64,64]".to_string())
    );
    assert_eq!(
        rows("layers.1.attn.k_proj"),
        (fused(qkv, 64, 32), "f32[32,64]".to_string())
    );
    assert_eq!(
        rows("layers.1.attn.v_proj"),
        (fused(qkv, 96, 32), "f32[32,64]".to_string())
    );
    assert_eq!(
        rows("layers.1.mlp.gate_proj"),
        (fused(gate_up, 0, 176), "f32[176,64]".to_string())
    );
    assert_eq!(
        rows("layers.1.mlp.up_proj"),
        (fused(gate_up, 176, 176), "f32[176,64]".to_string())
    );
    assert_eq!(
        input_label(&g, "layers.1.mlp.act", 0),
        "layers.1.mlp.gate_proj"
    );
    assert_eq!(count(&g, |op| matches!(op, Op::MatMul(_))), 7 * 2 + 1);
    assert!(print(&g).contains(r#"weight "model.layers.0.self_attn.qkv_proj.weight"[64..96]"#));
    assert_eq!(head_weight(&g), "lm_head.weight");
    assert_eq!(attention(&g, 0).window, None);
    // Every tensor read is a checkpoint tensor of the right full shape.
    let ckpt = Checkpoint::open(&model("tiny/phi3")).unwrap();
    let needed = required_weights(&ckpt, &LowerOptions::default()).unwrap();
    assert_eq!(needed.len(), 2 * 6 + 3);
    let qkv_shape = needed.iter().find(|w| w.name == qkv).unwrap();
    assert_eq!(qkv_shape.shape, [128, 64]);
    for w in &needed {
        assert_eq!(ckpt.tensor(&w.name).unwrap().shape, w.shape, "{}", w.name);
    }
}

/// Tiny Phi-3 with partial rotary embeddings and LongRoPE, original context
/// 64 of 128, in transformers-5 spelling.
fn phi3_longrope_v5(dir: &Path) {
    edit_config(dir, |c| {
        c.insert("original_max_position_embeddings".into(), json!(64));
        c.insert(
            "rope_parameters".into(),
            json!({"rope_type": "longrope", "rope_theta": 10000.0,
                   "partial_rotary_factor": 0.5,
                   "original_max_position_embeddings": 64,
                   "short_factor": [1.0, 1.1, 1.3, 1.7],
                   "long_factor": [1.0, 2.0, 4.0, 8.0]}),
        );
    });
}

/// The same in transformers-4 spelling (`rope_scaling` of type `su`).
fn phi3_longrope_v4(dir: &Path) {
    edit_config(dir, |c| {
        c.remove("rope_parameters");
        c.insert("original_max_position_embeddings".into(), json!(64));
        c.insert("rope_theta".into(), json!(10000.0));
        c.insert("partial_rotary_factor".into(), json!(0.5));
        c.insert(
            "rope_scaling".into(),
            json!({"type": "su", "short_factor": [1.0, 1.1, 1.3, 1.7],
                   "long_factor": [1.0, 2.0, 4.0, 8.0]}),
        );
        let dtype = c.remove("dtype").unwrap();
        c.insert("torch_dtype".into(), dtype);
    });
}

#[test]
fn phi3_v4_and_v5_configs_lower_identically() {
    let tmp = TempDir::new("phi3v4");
    let v5 = copy_model(&tmp, "tiny/phi3", "v5/phi3");
    let v4 = copy_model(&tmp, "tiny/phi3", "v4/phi3");
    // Plain RoPE.
    edit_config(&v4, |c| {
        let rope = c.remove("rope_parameters").unwrap();
        c.insert("rope_theta".into(), rope["rope_theta"].clone());
        c.insert("rope_scaling".into(), Value::Null);
    });
    assert_same_graph(&lower_dir(&v5).graph, &lower_dir(&v4).graph);
    // LongRoPE with partial rotation, at both contexts.
    phi3_longrope_v5(&v5);
    phi3_longrope_v4(&v4);
    for context in [64, 128] {
        let options = LowerOptions {
            max_context: Some(context),
        };
        assert_same_graph(
            &lower_dir_with(&v5, &options).graph,
            &lower_dir_with(&v4, &options).graph,
        );
    }
}

#[test]
fn phi3_longrope_switches_factors_with_the_context() {
    let tmp = TempDir::new("phi3long");
    let dir = copy_model(&tmp, "tiny/phi3", "phi3");
    phi3_longrope_v5(&dir);
    let table = |context| {
        let g = lower_dir_with(
            &dir,
            &LowerOptions {
                max_context: Some(context),
            },
        )
        .graph;
        let r = match &by_label(&g, "layers.0.attn.q_rope").op {
            Op::Rope(r) => r.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!((r.head_dim, r.rotary_dim), (16, 8));
        rope_table(&g, "rope_table")
    };
    let plain = gerbil_frontend_hf::rope::default_inv_freq(1e4, 8);
    // factor = 128 / 64 = 2: attention scaling sqrt(1 + ln 2 / ln 64).
    let scaling = (1.0 + 2f64.ln() / 64f64.ln()).sqrt() as f32;
    let (short, s1) = table(64);
    let (long, s2) = table(65);
    assert_eq!((s1, s2), (scaling, scaling));
    assert_eq!(short[3], 1.0 / (1.7f32 * (1.0 / plain[3])));
    assert_eq!(long[3], 1.0 / (8.0f32 * (1.0 / plain[3])));
    // `lower` alone assumes the model's whole context (long factors).
    assert_eq!(rope_table(&lower_dir(&dir).graph, "rope_table").0, long);
    // Other RoPE types are not Phi-3's.
    edit_config(&dir, |c| {
        c["rope_parameters"]["rope_type"] = json!("linear");
        c["rope_parameters"]["factor"] = json!(2.0);
    });
    let msg = lower_err(&dir).to_string();
    assert!(
        msg.contains("longrope") && msg.contains("`linear`"),
        "{msg}"
    );
}

#[test]
fn odd_shapes_lower_and_verify() {
    let tmp = TempDir::new("odd");
    for (seed, v) in odd_shape_variants().iter().enumerate() {
        let dir = tmp.path().join(v.name);
        write_variant(
            Path::new(MODELS).join("tiny").as_path(),
            v,
            &dir,
            seed as u64,
        );
        let config = read_config(&dir);
        let g = lower_dir(&dir).graph;
        let heads = config["num_attention_heads"].as_u64().unwrap() as u32;
        let kv = config["num_key_value_heads"].as_u64().unwrap() as u32;
        let a = attention(&g, 0);
        assert_eq!((a.n_heads, a.n_kv_heads), (heads, kv), "{}", v.name);
        assert_ne!(a.head_dim % 8, 0, "{}: head_dim {}", v.name, a.head_dim);
        let inter = config["intermediate_size"].as_u64().unwrap();
        assert_eq!(inter % 2, 1, "{}", v.name);
        let up = &by_label(&g, "layers.0.mlp.up_proj").outputs[0];
        assert_eq!(up.to_string(), format!("f32[T,{inter}]"), "{}", v.name);
    }
}
