//! Qwen 3 (`Qwen3ForCausalLM`): Qwen 2 without the forced q/k/v biases
//! (`attention_bias` applies to all four projections) and with a per-head
//! RMSNorm of queries and keys (`q_norm`, `k_norm`, weights `[head_dim]`)
//! before RoPE. `head_dim` is explicit (128 when absent), so the attention
//! width need not equal the hidden size. Qwen3-Embedding is this graph
//! ending in last-token pooling (`families::sentence_head`): its weights are
//! a `Qwen3Model`'s, without the `model.` prefix, under a config that still
//! says `Qwen3ForCausalLM`; its `modules.json` says it embeds.

use super::decoder::{self, DecoderSpec, FamilyDefaults};
use crate::error::Result;
use crate::lower::LowerCtx;

/// `Qwen3Config` defaults for keys a config may omit.
const DEFAULTS: FamilyDefaults = FamilyDefaults {
    rope_theta: 10000.0,
    tie_word_embeddings: false,
    attention_bias: false,
    mlp_bias: false,
    head_dim: Some(128),
    act_key: "hidden_act",
    hidden_act: "silu",
    activations: &["silu", "swish"],
};

/// Builds a Qwen 3 graph.
pub(crate) fn build(ctx: &mut LowerCtx<'_>) -> Result<()> {
    let mut spec = DecoderSpec::from_config(ctx, &DEFAULTS)?;
    spec.attn.qk_norm = true;
    spec.mlp.bias = false;
    super::qwen2::set_sliding_layers(ctx, &mut spec)?;
    decoder::build_decoder(ctx, &spec)
}
