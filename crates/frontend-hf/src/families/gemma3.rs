//! Gemma 3, text only (`Gemma3ForCausalLM`, `model_type: gemma3_text`).
//!
//! What differs from Llama:
//! - the embedding is multiplied by `√hidden_size` (an f32 constant, as
//!   transformers' `torch.tensor(hidden_size ** 0.5)` in f32 compute);
//! - every RMSNorm multiplies by `(1 + w)`;
//! - four norms per layer ([`NormLayout::Sandwich`]): the attention and MLP
//!   outputs are normalized before their residual adds;
//! - per-head `q_norm` / `k_norm` before RoPE;
//! - GeGLU MLP (`hidden_activation`, `gelu_pytorch_tanh`);
//! - attention scale `query_pre_attn_scalar ** -0.5` instead of `head_dim ** -0.5`;
//! - per-layer attention type (`layer_types`, or the v4 `sliding_window_pattern`:
//!   every `pattern`-th layer is full): sliding layers attend over
//!   `sliding_window` positions and use their own RoPE table
//!   (`rope_parameters.sliding_attention`, v4 `rope_local_base_freq`, θ 1e4
//!   by default), full layers use `rope_parameters.full_attention` (v4
//!   `rope_theta` + `rope_scaling`, θ 1e6 by default);
//! - `final_logit_softcapping`, when set, caps the logits: `tanh(l / c) · c`.
//!
//! `attn_logit_softcapping` is read by transformers' config but never applied
//! by its Gemma 3 attention, so it is ignored here too.
//!
//! EmbeddingGemma (`Gemma3TextModel`, `use_bidirectional_attention: true`)
//! is the same graph with bidirectional attention, ending in its
//! sentence-transformers head instead of logits. The surprise: transformers
//! halves such a model's `sliding_window` (`w / 2 + 1`, so 512 becomes 257)
//! and applies it on both sides: a token sees keys less than 257 away.

use super::decoder::{self, DecoderSpec, FamilyDefaults, LayerType, NormLayout};
use crate::config::{kernel_f32, RopeConfig, RopeParameters};
use crate::error::Result;
use crate::lower::LowerCtx;
use serde::Deserialize;
use serde_json::Value;

/// `Gemma3TextConfig` defaults for keys a config may omit.
const DEFAULTS: FamilyDefaults = FamilyDefaults {
    rope_theta: 1_000_000.0,
    tie_word_embeddings: true,
    attention_bias: false,
    mlp_bias: false,
    head_dim: Some(256),
    act_key: "hidden_activation",
    hidden_act: "gelu_pytorch_tanh",
    activations: &["gelu_pytorch_tanh"],
};

/// RoPE base of sliding layers when the config gives none.
const LOCAL_ROPE_THETA: f64 = 10_000.0;

#[derive(Deserialize)]
struct GemmaKeys {
    #[serde(default = "default_query_pre_attn_scalar")]
    query_pre_attn_scalar: f64,
    #[serde(default)]
    final_logit_softcapping: Option<f64>,
    #[serde(default = "default_window")]
    sliding_window: Option<u64>,
    #[serde(default)]
    layer_types: Option<Vec<LayerType>>,
    #[serde(default = "default_pattern")]
    sliding_window_pattern: u64,
    #[serde(default)]
    rope_local_base_freq: Option<f64>,
    #[serde(default)]
    use_bidirectional_attention: Option<bool>,
}

fn default_query_pre_attn_scalar() -> f64 {
    256.0
}

fn default_window() -> Option<u64> {
    Some(4096)
}

fn default_pattern() -> u64 {
    6
}

/// The full-attention and sliding-attention RoPE parameters with their bases.
fn rope_params(ctx: &LowerCtx<'_>, keys: &GemmaKeys) -> Result<[(RopeParameters, f64); 2]> {
    let c = &ctx.ckpt.config;
    let (full, sliding) = match &c.rope {
        RopeConfig::PerLayerType(m) => (
            m.get("full_attention").cloned(),
            m.get("sliding_attention").cloned(),
        ),
        RopeConfig::Uniform(p) => {
            if !matches!(
                ctx.ckpt.config_json.get("rope_parameters"),
                None | Some(Value::Null)
            ) {
                return Err(ctx.config_err(
                    "rope_parameters",
                    "Gemma 3 takes RoPE parameters per layer type \
                     ({\"full_attention\": {...}, \"sliding_attention\": {...}})",
                ));
            }
            // v4: `rope_theta` and `rope_scaling` describe the full layers;
            // sliding layers use plain RoPE with `rope_local_base_freq`.
            (Some(p.clone()), None)
        }
    };
    let full = full.unwrap_or_else(RopeParameters::plain);
    let sliding = sliding.unwrap_or_else(RopeParameters::plain);
    let full_theta = full
        .rope_theta
        .or(c.rope_theta)
        .unwrap_or(DEFAULTS.rope_theta);
    let sliding_theta = sliding
        .rope_theta
        .or(keys.rope_local_base_freq)
        .unwrap_or(LOCAL_ROPE_THETA);
    Ok([(full, full_theta), (sliding, sliding_theta)])
}

/// Builds a Gemma 3 graph.
pub(crate) fn build(ctx: &mut LowerCtx<'_>) -> Result<()> {
    let keys: GemmaKeys = ctx.family_keys()?;
    let bidirectional = keys.use_bidirectional_attention == Some(true);
    if bidirectional && !super::sentence_head::is_embedder(ctx) {
        return Err(ctx.config_err(
            "use_bidirectional_attention",
            "bidirectional attention is for embedding models (EmbeddingGemma: \
             Gemma3TextModel, or a sentence-transformers directory with modules.json); \
             a language model decodes causally",
        ));
    }
    let mut spec = DecoderSpec::without_rope(ctx, &DEFAULTS)?;
    spec.attn.causal = !bidirectional;
    let hidden = spec.hidden;
    spec.embed_scale = Some((hidden as f64).sqrt() as f32);
    spec.norm.weight_offset = 1.0;
    spec.norm_layout = NormLayout::Sandwich;
    spec.attn.qk_norm = true;
    spec.mlp.bias = false;
    if !(keys.query_pre_attn_scalar.is_finite() && keys.query_pre_attn_scalar > 0.0) {
        return Err(ctx.config_err(
            "query_pre_attn_scalar",
            format!("{} is not a positive number", keys.query_pre_attn_scalar),
        ));
    }
    spec.attn.scale = kernel_f32(keys.query_pre_attn_scalar.powf(-0.5))
        .map_err(|why| ctx.config_err("query_pre_attn_scalar", format!("its -1/2 power {why}")))?;
    spec.logit_softcap = match keys.final_logit_softcapping {
        None => None,
        Some(c) if c.is_finite() && c > 0.0 => {
            Some(kernel_f32(c).map_err(|why| ctx.config_err("final_logit_softcapping", why))?)
        }
        Some(c) => {
            return Err(ctx.config_err(
                "final_logit_softcapping",
                format!("{c} is not a positive number"),
            ))
        }
    };

    let pattern = keys.sliding_window_pattern;
    if pattern == 0 && keys.layer_types.is_none() {
        return Err(ctx.config_err("sliding_window_pattern", "must be positive"));
    }
    let types = decoder::layer_types(
        ctx,
        spec.layers.len() as u32,
        keys.layer_types.clone(),
        |i| {
            if (u64::from(i) + 1) % pattern != 0 {
                LayerType::SlidingAttention
            } else {
                LayerType::FullAttention
            }
        },
    )?;
    let mut window = decoder::window(ctx, "sliding_window", keys.sliding_window)?;
    // transformers reads a bidirectional model's window as half of it, plus
    // one, on each side (`Gemma3TextConfig.__post_init__`): EmbeddingGemma's
    // 512 lets a token see keys up to 256 away.
    if bidirectional {
        window = window.map(|w| w / 2 + 1);
    }
    // One table per layer type in use, in transformers' (sorted) order.
    let mut tables: Vec<(LayerType, usize)> = Vec::new();
    for (t, (params, theta)) in [LayerType::FullAttention, LayerType::SlidingAttention]
        .into_iter()
        .zip(rope_params(ctx, &keys)?)
    {
        if types.contains(&t) {
            let label = format!("rope_table.{}", t.name());
            let table = decoder::rope_table(ctx, &label, &params, theta, spec.attn.head_dim)?;
            tables.push((t, spec.ropes.len()));
            spec.ropes.push(table);
        }
    }
    for (layer, t) in spec.layers.iter_mut().zip(&types) {
        layer.rope = tables
            .iter()
            .find(|(tt, _)| tt == t)
            .map(|&(_, i)| i)
            .unwrap_or(0);
        layer.window = match t {
            LayerType::SlidingAttention => window,
            LayerType::FullAttention => None,
        };
    }
    decoder::build_decoder(ctx, &spec)
}
