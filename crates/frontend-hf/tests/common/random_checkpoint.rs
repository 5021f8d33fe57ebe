//! Random-weight checkpoints for any supported config, and the shape
//! variants of the tiny models that the tests lower and run: head widths
//! that are not multiples of 8, odd MLP widths, one and three KV heads.
//!
//! The tensors written are exactly those lowering reads
//! (`gerbil_frontend_hf::required_weights`), so a variant needs no list of
//! tensor names. Shared by the frontend's lowering tests and the end-to-end
//! tests in `tests/e2e/models.rs`, which include this file by path.

#![allow(dead_code)]

use gerbil_frontend_hf::{required_weights, Checkpoint, LowerOptions};
use serde_json::{json, Value};
use std::path::Path;

/// A shape variant: its name, the tiny model whose config it edits, and the
/// keys it sets (`null` removes a key's effect, as in transformers).
pub struct Variant {
    /// Directory name.
    pub name: &'static str,
    /// The tiny model it starts from.
    pub base: &'static str,
    /// Keys replaced in the base config.
    pub changes: Value,
}

/// Variants whose shapes do not divide evenly, one or more per family.
pub fn odd_shape_variants() -> Vec<Variant> {
    vec![
        Variant {
            // 6 query heads over 1 KV head of width 10; odd MLP width.
            name: "llama_h6_kv1_d10_i131",
            base: "llama",
            changes: json!({"hidden_size": 60, "num_attention_heads": 6,
                            "num_key_value_heads": 1, "head_dim": 10, "intermediate_size": 131}),
        },
        Variant {
            // 5 heads of 12 without grouping; YaRN; sliding window on layer 1 only.
            name: "qwen2_h5_kv5_d12_i161_yarn_window",
            base: "qwen2",
            changes: json!({"hidden_size": 60, "num_attention_heads": 5, "num_key_value_heads": 5,
                            "intermediate_size": 161, "use_sliding_window": true,
                            "sliding_window": 5, "max_window_layers": 1, "layer_types": null,
                            "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6,
                                                "factor": 4.0,
                                                "original_max_position_embeddings": 32}}),
        },
        Variant {
            // 6 query heads over 3 KV heads of width 12 (72 ≠ hidden 64).
            name: "qwen3_h6_kv3_d12_i175",
            base: "qwen3",
            changes: json!({"num_attention_heads": 6, "num_key_value_heads": 3,
                            "head_dim": 12, "intermediate_size": 175}),
        },
        Variant {
            name: "mistral_kv1_d18_i101_w3",
            base: "mistral",
            changes: json!({"num_key_value_heads": 1, "head_dim": 18, "intermediate_size": 101,
                            "sliding_window": 3}),
        },
        Variant {
            // (transformers' Gemma3TextConfig wants hidden_size to be a
            // multiple of the head count, whatever head_dim is.)
            name: "gemma3_h4_kv1_d20_i99",
            base: "gemma3",
            changes: json!({"num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 20,
                            "intermediate_size": 99, "query_pre_attn_scalar": 20,
                            "sliding_window": 3}),
        },
        Variant {
            // Head width 12 of which 6 rotate; LongRoPE with its long factors
            // (128 positions > original 64).
            name: "phi3_h6_kv3_d12_i97_partial_longrope",
            base: "phi3",
            changes: json!({"hidden_size": 72, "num_attention_heads": 6,
                            "num_key_value_heads": 3, "intermediate_size": 97,
                            "original_max_position_embeddings": 64,
                            "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                                "partial_rotary_factor": 0.5,
                                                "short_factor": [1.0, 1.25, 1.5],
                                                "long_factor": [1.0, 2.5, 6.0]}}),
        },
    ]
}

/// A small deterministic generator (SplitMix64), uniform in [-1, 1).
pub struct Rng(u64);

impl Rng {
    /// A generator seeded by `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next value in [-1, 1).
    pub fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Values of one tensor at a useful scale: matrices with unit-variance rows
/// (uniform × √(3 / fan_in)), norm weights near 1 (near 0 when the family
/// adds 1), small biases, embeddings of order 1.
fn values(name: &str, shape: &[u64], norm_offset: bool, rng: &mut Rng) -> Vec<f32> {
    let n: u64 = shape.iter().product();
    let (scale, center) = if name.contains("norm") {
        (0.2, if norm_offset { 0.0 } else { 1.0 })
    } else if shape.len() == 1 {
        (0.2, 0.0)
    } else if name.contains("embed_tokens") {
        (1.0, 0.0)
    } else {
        ((3.0 / shape[1] as f32).sqrt(), 0.0)
    };
    (0..n).map(|_| center + scale * rng.next()).collect()
}

/// Writes `config` as `dir/config.json` and a `model.safetensors` holding
/// random f32 values for every tensor lowering reads. Returns the tensor
/// names and shapes written.
pub fn write_random_checkpoint(dir: &Path, config: &Value, seed: u64) -> Vec<(String, Vec<u64>)> {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(config).unwrap(),
    )
    .unwrap();
    let ckpt = Checkpoint::open(dir).unwrap();
    let needed = required_weights(&ckpt, &LowerOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let norm_offset = config["model_type"]
        .as_str()
        .is_some_and(|t| t.starts_with("gemma"));
    let mut rng = Rng::new(seed);
    let tensors: Vec<(String, Vec<u64>, Vec<u8>)> = needed
        .iter()
        .map(|w| {
            let data = values(&w.name, &w.shape, norm_offset, &mut rng)
                .into_iter()
                .flat_map(f32::to_le_bytes)
                .collect();
            (w.name.clone(), w.shape.clone(), data)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, data)| {
            let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            (
                name.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape, data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    needed.into_iter().map(|w| (w.name, w.shape)).collect()
}

/// Writes variant `v` of the tiny model in `tiny_root/<v.base>` to
/// `dir` with random weights.
pub fn write_variant(tiny_root: &Path, v: &Variant, dir: &Path, seed: u64) {
    let text = std::fs::read_to_string(tiny_root.join(v.base).join("config.json")).unwrap();
    let mut config: Value = serde_json::from_str(&text).unwrap();
    let obj = config.as_object_mut().unwrap();
    for (k, val) in v.changes.as_object().unwrap() {
        obj.insert(k.clone(), val.clone());
    }
    write_random_checkpoint(dir, &config, seed);
}
