//! Llama (`LlamaForCausalLM`): the reference decoder, built entirely from the
//! shared pieces in [`super::decoder`] with transformers' `LlamaConfig`
//! defaults.

use super::decoder::{self, DecoderSpec, FamilyDefaults};
use crate::error::Result;
use crate::lower::LowerCtx;

/// `LlamaConfig` defaults for keys a config may omit.
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

/// Builds a Llama graph: nothing differs from the shared decoder.
pub(crate) fn build(ctx: &mut LowerCtx<'_>) -> Result<()> {
    let spec = DecoderSpec::from_config(ctx, &DEFAULTS)?;
    decoder::build_decoder(ctx, &spec)
}
