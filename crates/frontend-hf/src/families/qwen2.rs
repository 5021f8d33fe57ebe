//! Qwen 2 (`Qwen2ForCausalLM`): Llama with biases on the q/k/v projections
//! and optional sliding-window layers.
//!
//! transformers' `Qwen2Attention` always has q/k/v biases and never an o_proj
//! bias (`attention_bias` is not read), and `Qwen2MLP` has no biases. Layers
//! listed as `sliding_attention` in `layer_types` attend over
//! `sliding_window` positions when `use_sliding_window` is true; without
//! `layer_types`, the layers from `max_window_layers` on slide.

use super::decoder::{self, DecoderSpec, FamilyDefaults, LayerType};
use crate::error::Result;
use crate::lower::LowerCtx;
use serde::Deserialize;

/// `Qwen2Config` defaults for keys a config may omit.
const DEFAULTS: FamilyDefaults = FamilyDefaults {
    rope_theta: 10000.0,
    tie_word_embeddings: false,
    attention_bias: true,
    mlp_bias: false,
    head_dim: None,
    act_key: "hidden_act",
    hidden_act: "silu",
    activations: &["silu", "swish"],
};

/// The sliding-window keys of Qwen 2 and Qwen 3 configs.
#[derive(Deserialize)]
pub(crate) struct SlidingKeys {
    #[serde(default)]
    use_sliding_window: bool,
    #[serde(default = "default_window")]
    sliding_window: Option<u64>,
    #[serde(default = "default_max_window_layers")]
    max_window_layers: u64,
    #[serde(default)]
    layer_types: Option<Vec<LayerType>>,
}

fn default_window() -> Option<u64> {
    Some(4096)
}

fn default_max_window_layers() -> u64 {
    28
}

/// Sets each layer's window the way `Qwen2Config` / `Qwen3Config` do.
pub(crate) fn set_sliding_layers(ctx: &LowerCtx<'_>, spec: &mut DecoderSpec) -> Result<()> {
    let keys: SlidingKeys = ctx.family_keys()?;
    let window = if keys.use_sliding_window {
        decoder::window(ctx, "sliding_window", keys.sliding_window)?
    } else {
        None
    };
    let types = decoder::layer_types(ctx, spec.layers.len() as u32, keys.layer_types, |i| {
        if window.is_some() && u64::from(i) >= keys.max_window_layers {
            LayerType::SlidingAttention
        } else {
            LayerType::FullAttention
        }
    })?;
    for (layer, t) in spec.layers.iter_mut().zip(types) {
        layer.window = match t {
            LayerType::SlidingAttention => window,
            LayerType::FullAttention => None,
        };
    }
    Ok(())
}

/// Builds a Qwen 2 graph.
pub(crate) fn build(ctx: &mut LowerCtx<'_>) -> Result<()> {
    let mut spec = DecoderSpec::from_config(ctx, &DEFAULTS)?;
    spec.attn.qkv_bias = true;
    spec.attn.o_bias = false;
    spec.mlp.bias = false;
    set_sliding_layers(ctx, &mut spec)?;
    decoder::build_decoder(ctx, &spec)
}
