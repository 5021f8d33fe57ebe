//! Lowering the tiny fixtures: structure, dtypes, equivalence of config
//! spellings and of single-file vs sharded weights.

mod common;

use common::*;
use gerbil_frontend_hf::{lower, Checkpoint, Lowered};
use gerbil_ir::{print::print, DType, Graph, MatMul, Op, WeightSource};
use serde_json::json;
use std::path::Path;

fn lower_dir(dir: &Path) -> Lowered {
    let ckpt = Checkpoint::open(dir).unwrap();
    let lowered = lower(&ckpt).unwrap();
    gerbil_ir::verify(&lowered.graph).unwrap();
    lowered
}

fn count(g: &Graph, pred: impl Fn(&Op) -> bool) -> usize {
    g.g.node_weights().filter(|n| pred(&n.op)).count()
}

/// The node with this label.
fn by_label<'g>(g: &'g Graph, label: &str) -> &'g gerbil_ir::Node {
    g.g.node_weights()
        .find(|n| n.label == label)
        .unwrap_or_else(|| panic!("no node labelled {label}"))
}

fn check_llama(rel: &str, weight_dtype: DType) {
    let l = lower_dir(&model(rel));
    let g = &l.graph;
    let layers = 2;
    assert_eq!(
        count(g, |op| matches!(op, Op::MatMul(_))),
        7 * layers + 1,
        "7 matmuls per layer plus the LM head"
    );
    assert_eq!(count(g, |op| matches!(op, Op::Attention(_))), layers);
    assert_eq!(count(g, |op| matches!(op, Op::KvCache { .. })), 2 * layers);
    assert_eq!(count(g, |op| matches!(op, Op::RmsNorm(_))), 2 * layers + 1);
    // One rope table shared by all layers.
    assert_eq!(
        count(g, |op| matches!(
            op,
            Op::Weight(w) if matches!(w.source, WeightSource::RopeTable { .. })
        )),
        1
    );
    // Checkpoint weights keep the checkpoint's dtype; 9 per layer + embedding
    // + final norm (the LM head is tied).
    let ckpt_weights: Vec<_> =
        g.g.node_weights()
            .filter_map(|n| match &n.op {
                Op::Weight(w) if matches!(w.source, WeightSource::Checkpoint { .. }) => Some(w),
                _ => None,
            })
            .collect();
    assert_eq!(ckpt_weights.len(), 9 * layers + 2);
    assert!(ckpt_weights.iter().all(|w| w.ty.dtype == weight_dtype));

    let (name, logits) = &g.outputs[0];
    assert_eq!((g.outputs.len(), name.as_str()), (2, "logits"));
    // The second output is the next token, chosen from the logits on the GPU.
    let (name, next) = &g.outputs[1];
    assert_eq!(name, gerbil_ir::NEXT_TOKEN);
    assert_eq!(g.node(next.node).op, Op::SampleToken);
    assert_eq!(g.inputs(next.node), vec![*logits]);
    assert_eq!(g.value_type(*logits).to_string(), "f32[T,512]");
    let head = g.node(logits.node);
    assert_eq!(head.label, "lm_head");
    assert_eq!(head.op, Op::MatMul(MatMul::linear(false)));
    // Tied: the LM head reads the embedding table node itself.
    let head_w = g.inputs(logits.node)[1];
    assert_eq!(g.node(head_w.node).label, "model.embed_tokens.weight");
    assert_eq!(g.users(head_w).len(), 2);

    match &by_label(g, "layers.1.attn.sdpa").op {
        Op::Attention(a) => {
            assert_eq!((a.n_heads, a.n_kv_heads, a.head_dim), (4, 2, 16));
            assert_eq!(a.scale, 0.25);
            assert_eq!(a.window, None);
        }
        other => panic!("{other:?}"),
    }
    match &by_label(g, "rope_table").op {
        Op::Weight(w) => match &w.source {
            WeightSource::RopeTable {
                inv_freq,
                attention_scaling,
            } => {
                assert_eq!(inv_freq.len(), 8);
                assert_eq!(inv_freq[2], 0.1);
                assert_eq!(*attention_scaling, 1.0);
                assert_eq!(w.ty.to_string(), "f32[Lmax,16]");
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    assert_eq!(
        g.name,
        Path::new(rel).file_name().unwrap().to_str().unwrap()
    );
    assert_eq!(l.facts.architecture, "LlamaForCausalLM");
    assert_eq!(l.facts.family, "llama");
    assert_eq!(l.facts.name, g.name);
    assert_eq!(
        (
            l.facts.vocab_size,
            l.facts.hidden_size,
            l.facts.num_layers,
            l.facts.max_position_embeddings
        ),
        (512, 64, 2, 128)
    );
}

#[test]
fn tiny_llama_f32() {
    check_llama("tiny/llama", DType::F32);
}

#[test]
fn tiny_llama_bf16() {
    check_llama("tiny/llama_bf16", DType::BF16);
}

#[test]
fn tiny_llama_snapshot() {
    insta::assert_snapshot!(print(&lower_dir(&model("tiny/llama")).graph));
}

#[test]
fn checkpoint_exposes_raw_tensors() {
    let ckpt = Checkpoint::open(&model("tiny/llama_bf16")).unwrap();
    let t = ckpt.tensor("model.norm.weight").unwrap();
    assert_eq!((t.dtype, t.shape.as_slice()), (DType::BF16, &[64u64][..]));
    assert_eq!(t.data.len(), 64 * 2);
    assert!(ckpt.contains("model.layers.1.mlp.down_proj.weight"));
    assert!(!ckpt.contains("lm_head.weight"));
    assert_eq!(ckpt.weights.len(), 9 * 2 + 2);
    assert_eq!(ckpt.config.dtype.as_deref(), Some("bfloat16"));
    assert!(ckpt.text.tokenizer_json.is_none());
    assert_eq!(ckpt.text.eos_token_ids, vec![2]);
}

/// Rewrites a v5 config (`rope_parameters`, `dtype`) in v4 spelling.
fn to_v4(dir: &Path) {
    edit_config(dir, |c| {
        let rope = c.remove("rope_parameters").unwrap();
        let mut rope = rope.as_object().unwrap().clone();
        c.insert("rope_theta".into(), rope.remove("rope_theta").unwrap());
        let rope_type = rope.remove("rope_type").unwrap();
        if rope_type == "default" {
            c.insert("rope_scaling".into(), serde_json::Value::Null);
        } else {
            rope.insert("type".into(), rope_type);
            c.insert("rope_scaling".into(), rope.into());
        }
        let dtype = c.remove("dtype").unwrap();
        c.insert("torch_dtype".into(), dtype);
        c.insert("transformers_version".into(), json!("4.46.0"));
    });
}

fn assert_same_graph(a: &Graph, b: &Graph) {
    assert_eq!(print(a), print(b));
    // The printer abbreviates rope tables; compare the weights in full.
    let weights = |g: &Graph| -> Vec<Op> {
        g.g.node_weights()
            .filter(|n| matches!(n.op, Op::Weight(_)))
            .map(|n| n.op.clone())
            .collect()
    };
    assert_eq!(weights(a), weights(b));
}

#[test]
fn v4_and_v5_configs_lower_identically() {
    let tmp = TempDir::new("v4v5");
    let v5 = copy_model(&tmp, "tiny/llama", "v5/llama");
    let v4 = copy_model(&tmp, "tiny/llama", "v4/llama");
    to_v4(&v4);
    assert!(read_config(&v4).get("rope_parameters").is_none());
    assert_same_graph(&lower_dir(&v5).graph, &lower_dir(&v4).graph);
}

#[test]
fn v4_and_v5_llama3_rope_lower_identically() {
    let tmp = TempDir::new("llama3");
    let v5 = copy_model(&tmp, "tiny/llama", "v5/llama");
    edit_config(&v5, |c| {
        c.insert(
            "rope_parameters".into(),
            json!({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 32}),
        );
    });
    let v4 = copy_model(&tmp, "tiny/llama", "v4/llama");
    std::fs::copy(v5.join("config.json"), v4.join("config.json")).unwrap();
    to_v4(&v4);
    assert!(read_config(&v4)["rope_scaling"]["type"] == "llama3");
    let a = lower_dir(&v5).graph;
    assert_same_graph(&a, &lower_dir(&v4).graph);
    // And llama3 scaling really changed the table.
    let plain = lower_dir(&model("tiny/llama")).graph;
    let table = |g: &Graph| by_label(g, "rope_table").op.clone();
    assert_ne!(table(&a), table(&plain));
}

#[test]
fn sharded_checkpoint_lowers_like_single_file() {
    let tmp = TempDir::new("sharded");
    let dir = tmp.subdir("llama");
    let src = model("tiny/llama");
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let tensors = read_tensors(&src.join("model.safetensors"));
    let (first, second): (Vec<_>, Vec<_>) = tensors
        .into_iter()
        .partition(|(n, _)| n.starts_with("model.layers.0.") || n == "model.norm.weight");
    let names = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    write_tensors(&dir.join(names[0]), &first);
    write_tensors(&dir.join(names[1]), &second);
    let mut map = serde_json::Map::new();
    for (i, part) in [&first, &second].into_iter().enumerate() {
        for (n, _) in part {
            map.insert(n.clone(), json!(names[i]));
        }
    }
    let index = json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();

    let ckpt = Checkpoint::open(&dir).unwrap();
    assert_eq!(ckpt.weights.files().len(), 2);
    assert_same_graph(
        &lower_dir(&dir).graph,
        &lower_dir(&model("tiny/llama")).graph,
    );
}

#[test]
fn biases_and_untied_head_are_honoured() {
    let tmp = TempDir::new("bias");
    let dir = copy_model(&tmp, "tiny/llama", "llama");
    edit_config(&dir, |c| {
        c.insert("attention_bias".into(), json!(true));
        c.insert("mlp_bias".into(), json!(true));
        c.insert("tie_word_embeddings".into(), json!(false));
    });
    let mut tensors = read_tensors(&dir.join("model.safetensors"));
    for i in 0..2 {
        for (proj, n) in [
            ("self_attn.q_proj", 64),
            ("self_attn.k_proj", 32),
            ("self_attn.v_proj", 32),
            ("self_attn.o_proj", 64),
            ("mlp.gate_proj", 176),
            ("mlp.up_proj", 176),
            ("mlp.down_proj", 64),
        ] {
            tensors.push((
                format!("model.layers.{i}.{proj}.bias"),
                f32_tensor(&[n], 0.5),
            ));
        }
    }
    tensors.push(("lm_head.weight".into(), f32_tensor(&[512, 64], 0.25)));
    write_tensors(&dir.join("model.safetensors"), &tensors);

    let g = lower_dir(&dir).graph;
    assert_eq!(count(&g, |op| *op == Op::AddBias), 14);
    let q = by_label(&g, "layers.0.attn.q_proj.bias");
    assert_eq!(q.op, Op::AddBias);
    let (_, logits) = g.outputs[0];
    let head_w = g.inputs(logits.node)[1];
    assert_eq!(g.node(head_w.node).label, "lm_head.weight");
    assert!(print(&g).contains("add_bias("));
}

#[test]
fn tied_config_prefers_a_present_lm_head() {
    let tmp = TempDir::new("tiedhead");
    let dir = copy_model(&tmp, "tiny/llama", "llama");
    let mut tensors = read_tensors(&dir.join("model.safetensors"));
    tensors.push(("lm_head.weight".into(), f32_tensor(&[512, 64], 0.25)));
    write_tensors(&dir.join("model.safetensors"), &tensors);
    let g = lower_dir(&dir).graph;
    let (_, logits) = g.outputs[0];
    let w = g.inputs(logits.node)[1];
    assert_eq!(g.node(w.node).label, "lm_head.weight");
}
