//! Mistral (`MistralForCausalLM`): Llama with a sliding window in every
//! layer. `sliding_window` is 4096 when the key is absent; `null` turns it
//! off. Projections never have biases (transformers does not read
//! `attention_bias` or `mlp_bias` for Mistral).

use super::decoder::{self, DecoderSpec, FamilyDefaults};
use crate::error::Result;
use crate::lower::LowerCtx;
use serde::Deserialize;

/// `MistralConfig` defaults for keys a config may omit.
const DEFAULTS: FamilyDefaults = FamilyDefaults {
    rope_theta: 10000.0,
    tie_word_embeddings: false,
    attention_bias: false,
    mlp_bias: false,
    head_dim: None,
    act_key: "hidden_act",
    hidden_act: "silu",
    activations: &["silu", "swish"],
};

#[derive(Deserialize)]
struct MistralKeys {
    #[serde(default = "default_window")]
    sliding_window: Option<u64>,
}

fn default_window() -> Option<u64> {
    Some(4096)
}

/// Builds a Mistral graph.
pub(crate) fn build(ctx: &mut LowerCtx<'_>) -> Result<()> {
    let keys: MistralKeys = ctx.family_keys()?;
    let mut spec = DecoderSpec::from_config(ctx, &DEFAULTS)?;
    spec.attn.qkv_bias = false;
    spec.attn.o_bias = false;
    spec.mlp.bias = false;
    spec.set_window(decoder::window(ctx, "sliding_window", keys.sliding_window)?);
    decoder::build_decoder(ctx, &spec)
}
