//! Phi-3 (`Phi3ForCausalLM`): Llama with fused projections, optional partial
//! rotary embeddings and LongRoPE.
//!
//! - `qkv_proj` `[q + 2·kv, hidden]` and `gate_up_proj` `[2·intermediate,
//!   hidden]` are fused checkpoint tensors; each part becomes its own matmul
//!   over a row range of the tensor (`WeightSource::Rows`), so the rest of
//!   the pipeline sees the same graph as for Llama.
//! - `partial_rotary_factor` rotates only the leading part of each head.
//! - `rope_scaling` of type `longrope` (v4 also `su` and `yarn`, which
//!   `Phi3Config` renames to `longrope`) with `original_max_position_embeddings`
//!   from the top level of the config (4096 when absent). The plan uses the
//!   long factors when it is compiled for a context above that length and the
//!   short ones otherwise (transformers switches per forward call on the
//!   current sequence length).
//! - `sliding_window`, when set, applies to every layer.
//! - Projections never have biases.

use super::decoder::{self, DecoderSpec, FamilyDefaults};
use crate::error::Result;
use crate::lower::LowerCtx;
use serde::Deserialize;

/// `Phi3Config` defaults for keys a config may omit.
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

/// `original_max_position_embeddings` when the config has none.
const ORIGINAL_MAX_POSITION_EMBEDDINGS: u64 = 4096;

#[derive(Deserialize)]
struct Phi3Keys {
    #[serde(default)]
    sliding_window: Option<u64>,
}

/// Builds a Phi-3 graph.
pub(crate) fn build(ctx: &mut LowerCtx<'_>) -> Result<()> {
    let keys: Phi3Keys = ctx.family_keys()?;
    let mut spec = DecoderSpec::without_rope(ctx, &DEFAULTS)?;
    spec.attn.qkv_bias = false;
    spec.attn.o_bias = false;
    spec.attn.fused_qkv = true;
    spec.mlp.bias = false;
    spec.mlp.fused_gate_up = true;
    spec.set_window(decoder::window(ctx, "sliding_window", keys.sliding_window)?);

    let c = &ctx.ckpt.config;
    let mut params = c.rope.uniform(&ctx.ckpt.config_path())?.clone();
    match params.rope_type.as_str() {
        "default" => {}
        "longrope" | "su" | "yarn" => {
            params.rope_type = "longrope".to_string();
            params.original_max_position_embeddings = Some(
                c.original_max_position_embeddings
                    .unwrap_or(ORIGINAL_MAX_POSITION_EMBEDDINGS),
            );
        }
        other => {
            return Err(ctx.config_err(
                "rope_scaling",
                format!(
                    "Phi-3 supports RoPE types default and longrope (or su, yarn), not `{other}`"
                ),
            ))
        }
    }
    let theta = params.theta_or(DEFAULTS.rope_theta);
    spec.ropes = vec![decoder::rope_table(
        ctx,
        "rope_table",
        &params,
        theta,
        spec.attn.head_dim,
    )?];
    decoder::build_decoder(ctx, &spec)
}
