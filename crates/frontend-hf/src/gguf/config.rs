//! A HuggingFace `config.json` written from GGUF metadata.
//!
//! llama.cpp stores hyper-parameters under `<arch>.<key>` (`llama.block_count`);
//! [`hf_config`] maps them onto the keys the family builders read, as
//! transformers' GGUF loader does, and fills what GGUF leaves out with the
//! value llama.cpp itself assumes (Gemma 3's sliding-window pattern of 6 and
//! local RoPE base of 10,000, its query scale). The result is plain JSON,
//! so a GGUF model runs through the same [`HfConfig`](crate::HfConfig)
//! checks and family builders as a checkpoint directory. The surprise:
//! the vocabulary size comes from the embedding's shape, not from metadata
//! (many files omit `<arch>.vocab_size`).

use gerbil_gguf::{GgufError, GgufFile};
use serde_json::{json, Map, Value};

/// GGUF architectures gerbil lowers, with the HuggingFace class and
/// `model_type` each becomes.
pub const ARCHITECTURES: &[(&str, &str, &str)] = &[
    ("llama", "LlamaForCausalLM", "llama"),
    ("qwen2", "Qwen2ForCausalLM", "qwen2"),
    ("qwen3", "Qwen3ForCausalLM", "qwen3"),
    ("gemma3", "Gemma3ForCausalLM", "gemma3_text"),
    ("phi3", "Phi3ForCausalLM", "phi3"),
];

/// RoPE base when the file has none (each HuggingFace config class's default).
fn default_rope_theta(arch: &str) -> f64 {
    match arch {
        "gemma3" => 1_000_000.0,
        _ => 10_000.0,
    }
}

/// The configuration of `g`, whose architecture is `arch` (one of
/// [`ARCHITECTURES`]).
pub fn hf_config(g: &GgufFile, arch: &str) -> Result<Value, GgufError> {
    let Some(&(_, class, model_type)) = ARCHITECTURES.iter().find(|a| a.0 == arch) else {
        return Err(g.key_error(
            "general.architecture",
            format!("`{arch}` is not a GGUF architecture gerbil reads"),
        ));
    };
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| g.require(&key(k), GgufFile::u64);
    let hidden = need("embedding_length")?;
    let heads = need("attention.head_count")?;
    let kv_heads = g.u64(&key("attention.head_count_kv"))?.unwrap_or(heads);
    let embedding = g.tensor("token_embd.weight").ok_or_else(|| {
        g.key_error(
            "token_embd.weight",
            "the file has no token embedding tensor, so it is not a complete model",
        )
    })?;
    let vocab = embedding.dims.get(1).copied().unwrap_or(1);
    let mut c = Map::new();
    c.insert("architectures".into(), json!([class]));
    c.insert("model_type".into(), json!(model_type));
    c.insert("hidden_size".into(), json!(hidden));
    // Each layer has tensors, so a count past the file's tensors is corrupt
    // (and must not size anything built per layer).
    let layers = need("block_count")?;
    if layers > g.tensors().len() as u64 {
        return Err(g.key_error(
            &key("block_count"),
            format!(
                "{layers} layers, but the file holds {} tensors",
                g.tensors().len()
            ),
        ));
    }
    c.insert("num_hidden_layers".into(), json!(layers));
    c.insert(
        "intermediate_size".into(),
        json!(need("feed_forward_length")?),
    );
    c.insert("num_attention_heads".into(), json!(heads));
    c.insert("num_key_value_heads".into(), json!(kv_heads));
    c.insert(
        "max_position_embeddings".into(),
        json!(need("context_length")?),
    );
    c.insert("vocab_size".into(), json!(vocab));
    let eps = g.require(&key("attention.layer_norm_rms_epsilon"), GgufFile::f64)?;
    c.insert("rms_norm_eps".into(), json!(eps));
    let head_dim = match g.u64(&key("attention.key_length"))? {
        Some(d) => Some(d),
        None if arch == "llama" => g.u64(&key("rope.dimension_count"))?,
        None => None,
    };
    if let Some(d) = head_dim {
        c.insert("head_dim".into(), json!(d));
    }
    if arch == "llama" {
        // Llama's biases are optional (Qwen 2's are not: its class has no key).
        let has = |t: &str| g.tensor(t).is_some();
        c.insert("attention_bias".into(), json!(has("blk.0.attn_q.bias")));
        c.insert("mlp_bias".into(), json!(has("blk.0.ffn_up.bias")));
    }
    let tied = g.tensor("output.weight").is_none();
    c.insert("tie_word_embeddings".into(), json!(tied));
    for (gguf_key, hf_key) in [
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("padding_token_id", "pad_token_id"),
    ] {
        if let Some(id) = g.u64(&format!("tokenizer.ggml.{gguf_key}"))? {
            c.insert(hf_key.into(), json!(id));
        }
    }
    let theta = g
        .f64(&key("rope.freq_base"))?
        .unwrap_or_else(|| default_rope_theta(arch));
    let rope = json!({"rope_type": "default", "rope_theta": theta});
    let rope = scaled_rope(
        g,
        arch,
        rope,
        theta,
        head_dim.unwrap_or(hidden / heads.max(1)),
    )?;
    if arch == "gemma3" {
        gemma3(g, &mut c, rope, head_dim.unwrap_or(hidden / heads.max(1)))?;
    } else {
        c.insert("rope_parameters".into(), rope);
        if let Some(w) = g.u64(&key("attention.sliding_window"))? {
            c.insert("sliding_window".into(), json!(w));
        }
    }
    Ok(Value::Object(c))
}

/// Llama 3's RoPE constants (every Llama 3.1 and 3.2 model): only `factor`
/// differs between them.
const LLAMA3_LOW_FREQ_FACTOR: f64 = 1.0;
const LLAMA3_HIGH_FREQ_FACTOR: f64 = 4.0;
const LLAMA3_ORIGINAL_CONTEXT: u64 = 8192;

/// The `llama3` RoPE parameters whose per-dimension factors are `factors`
/// (what llama.cpp's converter stores as `rope_freqs.weight`: each default
/// frequency divided by its factor), or `None` when no such parameters give
/// them. GGUF keeps the factors, not the parameters, so the parameters are
/// Llama 3's constants with the largest factor, checked against every value.
pub fn llama3_from_factors(factors: &[f32], theta: f64, head_dim: u64) -> Option<Value> {
    let factor = f64::from(factors.iter().copied().fold(f32::NAN, f32::max));
    if factor.is_nan() || factor < 1.0 || factors.len() as u64 * 2 != head_dim {
        return None;
    }
    let plain = crate::rope::default_inv_freq(theta, head_dim as u32);
    let scaled = crate::rope::llama3_inv_freq(
        &plain,
        factor,
        LLAMA3_LOW_FREQ_FACTOR,
        LLAMA3_HIGH_FREQ_FACTOR,
        LLAMA3_ORIGINAL_CONTEXT,
    );
    let agrees = plain.iter().zip(&scaled).zip(factors).all(|((p, s), f)| {
        let implied = p / s;
        (implied - f).abs() <= 1e-4 * f.abs()
    });
    agrees.then(|| {
        json!({
            "rope_type": "llama3",
            "rope_theta": theta,
            "factor": factor,
            "low_freq_factor": LLAMA3_LOW_FREQ_FACTOR,
            "high_freq_factor": LLAMA3_HIGH_FREQ_FACTOR,
            "original_max_position_embeddings": LLAMA3_ORIGINAL_CONTEXT,
        })
    })
}

/// `rope` with the file's scaling applied: linear scaling, or Llama 3's
/// per-dimension factors (`rope_freqs.weight`); other kinds are refused by
/// name rather than silently run at the wrong positions.
fn scaled_rope(
    g: &GgufFile,
    arch: &str,
    mut rope: Value,
    theta: f64,
    head_dim: u64,
) -> Result<Value, GgufError> {
    if let Some(t) = g.tensor("rope_freqs.weight") {
        let factors = g.read_f32(t)?;
        return llama3_from_factors(&factors, theta, head_dim).ok_or_else(|| GgufError::Tensor {
            path: g.path().to_path_buf(),
            tensor: t.name.clone(),
            why: "these per-dimension RoPE factors are not Llama 3's (factor, 1, 4, 8192), \
                  the only ones gerbil reads from GGUF: compile the HuggingFace checkpoint"
                .into(),
        });
    }
    let kind_key = format!("{arch}.rope.scaling.type");
    match g.str(&kind_key)? {
        None | Some("none") => {}
        Some("linear") => {
            let factor = g.require(&format!("{arch}.rope.scaling.factor"), GgufFile::f64)?;
            rope["rope_type"] = json!("linear");
            rope["factor"] = json!(factor);
        }
        Some(other) => {
            return Err(g.key_error(
                &kind_key,
                format!("RoPE scaling `{other}` is not supported from GGUF (none and linear are)"),
            ))
        }
    }
    Ok(rope)
}

/// Gemma 3's keys: per-layer attention types (five sliding layers to one
/// full, llama.cpp's fixed pattern), a local RoPE base of 10,000, the query
/// scale llama.cpp uses (the head width, except the 62-layer 27B model's
/// `hidden / heads`) and the optional final logit soft-cap.
fn gemma3(
    g: &GgufFile,
    c: &mut Map<String, Value>,
    full_rope: Value,
    head_dim: u64,
) -> Result<(), GgufError> {
    let layers = c["num_hidden_layers"].as_u64().unwrap_or(0);
    let types: Vec<&str> = (0..layers)
        .map(|i| {
            if (i + 1) % 6 == 0 {
                "full_attention"
            } else {
                "sliding_attention"
            }
        })
        .collect();
    c.insert("layer_types".into(), json!(types));
    let window = g.require("gemma3.attention.sliding_window", GgufFile::u64)?;
    c.insert("sliding_window".into(), json!(window));
    let hidden = c["hidden_size"].as_u64().unwrap_or(0);
    let heads = c["num_attention_heads"].as_u64().unwrap_or(1).max(1);
    let scalar = if layers == 62 {
        hidden / heads
    } else {
        head_dim
    };
    c.insert("query_pre_attn_scalar".into(), json!(scalar));
    c.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
    c.insert("attention_bias".into(), json!(false));
    let softcap = g.f64("gemma3.final_logit_softcapping")?;
    c.insert("final_logit_softcapping".into(), json!(softcap));
    c.insert(
        "rope_parameters".into(),
        json!({
            "full_attention": full_rope,
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        }),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's `LlamaModel.generate_extra_tensors`: the factor of each
    /// frequency, in f64 as Python computes it.
    fn llama_cpp_factors(theta: f64, dim: u64, factor: f64) -> Vec<f32> {
        let (low, high, old) = (1.0, 4.0, 8192.0);
        (0..dim / 2)
            .map(|i| {
                let freq = 1.0 / theta.powf(2.0 * i as f64 / dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                let f = if wavelen < old / high {
                    1.0
                } else if wavelen > old / low {
                    factor
                } else {
                    let smooth = (old / wavelen - low) / (high - low);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                };
                f as f32
            })
            .collect()
    }

    #[test]
    fn llama3_parameters_are_recovered_from_the_factors() {
        for (factor, dim) in [(32.0, 64), (8.0, 128)] {
            let factors = llama_cpp_factors(500_000.0, dim, factor);
            let rope = llama3_from_factors(&factors, 500_000.0, dim).expect("llama3");
            assert_eq!(rope["rope_type"], "llama3");
            assert_eq!(rope["factor"], factor);
            assert_eq!(rope["original_max_position_embeddings"], 8192);
        }
    }

    #[test]
    fn other_factors_are_not_llama3() {
        let mut factors = llama_cpp_factors(500_000.0, 64, 32.0);
        factors[20] *= 1.01;
        assert_eq!(llama3_from_factors(&factors, 500_000.0, 64), None);
        assert_eq!(llama3_from_factors(&[1.0; 8], 500_000.0, 64), None);
        assert_eq!(llama3_from_factors(&[f32::NAN; 32], 500_000.0, 64), None);
    }
}
