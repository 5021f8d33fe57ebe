//! The shared decoder block of Llama-like models.
//!
//! ```text
//! x = embed(ids)
//! for each layer:
//!     x = x + o_proj(attention(rope(q_proj(norm(x))), rope(k_proj(..)), v_proj(..)))
//!     x = x + down_proj(act(gate_proj(norm(x))) * up_proj(norm(x)))
//! logits = lm_head(norm(x))
//! ```
//!
//! Tensor names follow transformers' `model.layers.{i}.self_attn.q_proj.weight`
//! scheme; node labels are shorter (`layers.{i}.attn.q_proj`). Every helper
//! checks its weights against the checkpoint through [`LowerCtx::weight`].

use crate::config::HfConfig;
use crate::error::Result;
use crate::lower::LowerCtx;
use crate::rope::{self, RopeFrequencies};
use gerbil_ir::op::KvKind;
use gerbil_ir::{
    Attention, BinaryOp, Embedding, Input, MatMul, Op, RmsNorm, Rope, UnaryOp, ValueRef,
};

/// RMSNorm attributes shared by all norms of a model.
#[derive(Clone, Debug)]
pub(crate) struct NormSpec {
    /// Epsilon.
    pub eps: f32,
    /// Added to the weight (Gemma: 1).
    pub weight_offset: f32,
}

/// The attention sub-block's shape and options.
#[derive(Clone, Debug)]
pub(crate) struct AttentionSpec {
    /// Query heads.
    pub n_heads: u32,
    /// Key/value heads.
    pub n_kv_heads: u32,
    /// Width of one head.
    pub head_dim: u32,
    /// Leading dimensions of each head that RoPE rotates.
    pub rotary_dim: u32,
    /// Whether q/k/v projections have biases.
    pub qkv_bias: bool,
    /// Whether the output projection has a bias.
    pub o_bias: bool,
    /// Softmax scale.
    pub scale: f32,
    /// Sliding window, if any.
    pub window: Option<u32>,
}

/// The gated MLP's shape and options.
#[derive(Clone, Debug)]
pub(crate) struct MlpSpec {
    /// Hidden width.
    pub intermediate: u64,
    /// Activation applied to the gate.
    pub act: UnaryOp,
    /// Whether gate/up/down projections have biases.
    pub bias: bool,
}

/// Everything that shapes a pre-norm decoder-only model.
#[derive(Clone, Debug)]
pub(crate) struct DecoderSpec {
    /// Residual width.
    pub hidden: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// Number of layers.
    pub layers: u32,
    /// Norm attributes.
    pub norm: NormSpec,
    /// Attention attributes.
    pub attn: AttentionSpec,
    /// MLP attributes.
    pub mlp: MlpSpec,
    /// Embedding multiplier, if any.
    pub embed_scale: Option<f32>,
    /// Whether the LM head reuses the embedding table.
    pub tie_embeddings: bool,
    /// RoPE frequencies, one table for all layers.
    pub rope: RopeFrequencies,
}

/// What a family's config leaves implicit.
#[derive(Clone, Debug)]
pub(crate) struct FamilyDefaults {
    /// `rope_theta` when the config has none.
    pub rope_theta: f64,
    /// `tie_word_embeddings` when absent.
    pub tie_word_embeddings: bool,
    /// `attention_bias` when absent.
    pub attention_bias: bool,
    /// `mlp_bias` when absent.
    pub mlp_bias: bool,
    /// `hidden_act` when absent.
    pub hidden_act: &'static str,
    /// Activations this family's code accepts.
    pub activations: &'static [&'static str],
}

/// The IR op for a transformers activation name.
pub(crate) fn activation(name: &str) -> Option<UnaryOp> {
    match name {
        "silu" | "swish" => Some(UnaryOp::Silu),
        "gelu_pytorch_tanh" => Some(UnaryOp::GeluTanh),
        _ => None,
    }
}

impl DecoderSpec {
    /// The Llama reading of the shared config keys; families adjust the
    /// result for what they do differently.
    pub fn from_config(ctx: &LowerCtx<'_>, d: &FamilyDefaults) -> Result<Self> {
        let c: &HfConfig = &ctx.ckpt.config;
        let path = ctx.ckpt.config_path();
        let act_name = c.hidden_act.as_deref().unwrap_or(d.hidden_act);
        let act = activation(act_name)
            .filter(|_| d.activations.contains(&act_name))
            .ok_or_else(|| {
                ctx.config_err(
                    "hidden_act",
                    format!(
                        "activation `{act_name}` is not supported for {}; expected {}",
                        c.architectures
                            .first()
                            .map(String::as_str)
                            .unwrap_or("this model"),
                        d.activations.join(" or ")
                    ),
                )
            })?;
        let head_dim = ctx.u32_of("head_dim", c.head_dim)?;
        let n_heads = ctx.u32_of("num_attention_heads", c.num_attention_heads)?;
        let n_kv_heads = ctx.u32_of("num_key_value_heads", c.num_key_value_heads)?;
        let rope_params = c.rope.uniform(&path)?;
        let rotary_dim = rope::rotary_dim(rope_params, head_dim, &path)?;
        let rope = rope::rope_frequencies(
            rope_params,
            rope_params.theta_or(d.rope_theta),
            rotary_dim,
            &path,
        )?;
        let attention_bias = c.attention_bias.unwrap_or(d.attention_bias);
        Ok(DecoderSpec {
            hidden: c.hidden_size,
            vocab: c.vocab_size,
            layers: ctx.u32_of("num_hidden_layers", c.num_hidden_layers)?,
            norm: NormSpec {
                eps: c.rms_norm_eps as f32,
                weight_offset: 0.0,
            },
            attn: AttentionSpec {
                n_heads,
                n_kv_heads,
                head_dim,
                rotary_dim,
                qkv_bias: attention_bias,
                o_bias: attention_bias,
                scale: f64::from(head_dim).powf(-0.5) as f32,
                window: None,
            },
            mlp: MlpSpec {
                intermediate: c.intermediate_size,
                act,
                bias: c.mlp_bias.unwrap_or(d.mlp_bias),
            },
            embed_scale: None,
            tie_embeddings: c.tie_word_embeddings.unwrap_or(d.tie_word_embeddings),
            rope,
        })
    }
}

/// `RmsNorm(x, W tensor[width])`.
pub(crate) fn rms_norm(
    ctx: &mut LowerCtx<'_>,
    x: ValueRef,
    tensor: &str,
    width: u64,
    norm: &NormSpec,
    label: String,
) -> Result<ValueRef> {
    let w = ctx.weight(tensor, &[width])?;
    let op = Op::RmsNorm(RmsNorm {
        eps: norm.eps,
        weight_offset: norm.weight_offset,
    });
    ctx.add(op, &[x, w], label)
}

/// A linear layer over checkpoint tensors `{prefix}.weight` `[out, inp]` and,
/// with `bias`, `{prefix}.bias` `[out]`.
pub(crate) fn linear(
    ctx: &mut LowerCtx<'_>,
    x: ValueRef,
    prefix: &str,
    out: u64,
    inp: u64,
    bias: bool,
    label: String,
) -> Result<ValueRef> {
    let w = ctx.weight(&format!("{prefix}.weight"), &[out, inp])?;
    let mut inputs = vec![x, w];
    if bias {
        inputs.push(ctx.weight(&format!("{prefix}.bias"), &[out])?);
    }
    ctx.add(Op::MatMul(MatMul { has_bias: bias }), &inputs, label)
}

/// `ids → embedding table lookup`; returns `(table, x)` so a tied LM head can
/// reuse the table node.
pub(crate) fn embed(
    ctx: &mut LowerCtx<'_>,
    vocab: u64,
    hidden: u64,
    scale: Option<f32>,
) -> Result<(ValueRef, ValueRef)> {
    let ids = ctx.add(Op::Input(Input::TokenIds), &[], "input_ids")?;
    let table = ctx.weight("model.embed_tokens.weight", &[vocab, hidden])?;
    let x = ctx.add(Op::Embedding(Embedding { scale }), &[table, ids], "embed")?;
    Ok((table, x))
}

/// The attention sub-block of layer `layer` on normalized input `h`:
/// projections, RoPE, KV-cache writes, attention and output projection.
/// Returns the output projection (before the residual add).
pub(crate) fn attention_block(
    ctx: &mut LowerCtx<'_>,
    h: ValueRef,
    layer: u32,
    hidden: u64,
    spec: &AttentionSpec,
    rope_table: ValueRef,
) -> Result<ValueRef> {
    let t = format!("model.layers.{layer}.self_attn");
    let p = format!("layers.{layer}");
    let hd = u64::from(spec.head_dim);
    let q_width = u64::from(spec.n_heads) * hd;
    let kv_width = u64::from(spec.n_kv_heads) * hd;

    let q = linear(
        ctx,
        h,
        &format!("{t}.q_proj"),
        q_width,
        hidden,
        spec.qkv_bias,
        format!("{p}.attn.q_proj"),
    )?;
    let k = linear(
        ctx,
        h,
        &format!("{t}.k_proj"),
        kv_width,
        hidden,
        spec.qkv_bias,
        format!("{p}.attn.k_proj"),
    )?;
    let v = linear(
        ctx,
        h,
        &format!("{t}.v_proj"),
        kv_width,
        hidden,
        spec.qkv_bias,
        format!("{p}.attn.v_proj"),
    )?;
    let rope = |n_heads| {
        Op::Rope(Rope {
            n_heads,
            head_dim: spec.head_dim,
            rotary_dim: spec.rotary_dim,
        })
    };
    let q = ctx.add(
        rope(spec.n_heads),
        &[q, rope_table],
        format!("{p}.attn.q_rope"),
    )?;
    let k = ctx.add(
        rope(spec.n_kv_heads),
        &[k, rope_table],
        format!("{p}.attn.k_rope"),
    )?;
    let cache = |kind| Op::KvCache {
        layer,
        kind,
        width: kv_width,
    };
    let kc = ctx.add(cache(KvKind::K), &[], format!("{p}.k_cache"))?;
    let vc = ctx.add(cache(KvKind::V), &[], format!("{p}.v_cache"))?;
    let kc = ctx.add(Op::CacheWrite, &[kc, k], format!("{p}.attn.k_cache_write"))?;
    let vc = ctx.add(Op::CacheWrite, &[vc, v], format!("{p}.attn.v_cache_write"))?;
    let attn = Op::Attention(Attention {
        n_heads: spec.n_heads,
        n_kv_heads: spec.n_kv_heads,
        head_dim: spec.head_dim,
        scale: spec.scale,
        window: spec.window,
    });
    let a = ctx.add(attn, &[q, kc, vc], format!("{p}.attn.sdpa"))?;
    linear(
        ctx,
        a,
        &format!("{t}.o_proj"),
        hidden,
        q_width,
        spec.o_bias,
        format!("{p}.attn.o_proj"),
    )
}

/// The gated MLP of layer `layer` on normalized input `h`:
/// `down(act(gate(h)) * up(h))`. Returns the down projection.
pub(crate) fn gated_mlp(
    ctx: &mut LowerCtx<'_>,
    h: ValueRef,
    layer: u32,
    hidden: u64,
    spec: &MlpSpec,
) -> Result<ValueRef> {
    let t = format!("model.layers.{layer}.mlp");
    let p = format!("layers.{layer}.mlp");
    let i = spec.intermediate;
    let g = linear(
        ctx,
        h,
        &format!("{t}.gate_proj"),
        i,
        hidden,
        spec.bias,
        format!("{p}.gate_proj"),
    )?;
    let u = linear(
        ctx,
        h,
        &format!("{t}.up_proj"),
        i,
        hidden,
        spec.bias,
        format!("{p}.up_proj"),
    )?;
    let s = ctx.add(Op::Unary(spec.act), &[g], format!("{p}.act"))?;
    let m = ctx.add(Op::Binary(BinaryOp::Mul), &[s, u], format!("{p}.gate_mul"))?;
    linear(
        ctx,
        m,
        &format!("{t}.down_proj"),
        hidden,
        i,
        spec.bias,
        format!("{p}.down_proj"),
    )
}

/// `x + y`, labelled.
pub(crate) fn residual(
    ctx: &mut LowerCtx<'_>,
    x: ValueRef,
    y: ValueRef,
    label: String,
) -> Result<ValueRef> {
    ctx.add(Op::Binary(BinaryOp::Add), &[x, y], label)
}

/// The LM head: the embedding table when tied and the checkpoint has no
/// separate `lm_head.weight`, else `lm_head.weight`.
pub(crate) fn lm_head(
    ctx: &mut LowerCtx<'_>,
    h: ValueRef,
    table: ValueRef,
    tie: bool,
    vocab: u64,
    hidden: u64,
) -> Result<ValueRef> {
    let w = if tie && !ctx.ckpt.contains("lm_head.weight") {
        table
    } else {
        ctx.weight("lm_head.weight", &[vocab, hidden])?
    };
    ctx.add(Op::MatMul(MatMul { has_bias: false }), &[h, w], "lm_head")
}

/// The whole Llama-shaped model: embedding, `layers` pre-norm blocks
/// (attention then gated MLP, each with a residual), final norm and LM head.
/// Sets the graph's `logits` output.
pub(crate) fn build_pre_norm_decoder(ctx: &mut LowerCtx<'_>, spec: &DecoderSpec) -> Result<()> {
    let hidden = spec.hidden;
    let (table, mut x) = embed(ctx, spec.vocab, hidden, spec.embed_scale)?;
    let rope_table = ctx.rope_table(&spec.rope, "rope_table")?;
    for i in 0..spec.layers {
        let t = format!("model.layers.{i}");
        let p = format!("layers.{i}");
        let h = rms_norm(
            ctx,
            x,
            &format!("{t}.input_layernorm.weight"),
            hidden,
            &spec.norm,
            format!("{p}.input_norm"),
        )?;
        let o = attention_block(ctx, h, i, hidden, &spec.attn, rope_table)?;
        x = residual(ctx, x, o, format!("{p}.attn.residual"))?;
        let h = rms_norm(
            ctx,
            x,
            &format!("{t}.post_attention_layernorm.weight"),
            hidden,
            &spec.norm,
            format!("{p}.post_attention_norm"),
        )?;
        let d = gated_mlp(ctx, h, i, hidden, &spec.mlp)?;
        x = residual(ctx, x, d, format!("{p}.mlp.residual"))?;
    }
    let h = rms_norm(
        ctx,
        x,
        "model.norm.weight",
        hidden,
        &spec.norm,
        "final_norm".to_string(),
    )?;
    let logits = lm_head(ctx, h, table, spec.tie_embeddings, spec.vocab, hidden)?;
    ctx.graph.outputs.push(("logits".to_string(), logits));
    Ok(())
}
