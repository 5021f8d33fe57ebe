//! The shared decoder of Llama-like models, with the knobs families turn.
//!
//! ```text
//! x = embed(ids) [· embed_scale]
//! for each layer i:
//!     h = norm(x)
//!     q, k, v = q_proj(h), k_proj(h), v_proj(h)        # or rows of a fused qkv_proj
//!     q, k = q_norm(q), k_norm(k)                        # optional, per head
//!     q, k = rope_i(q), rope_i(k)                        # the layer's RoPE table
//!     a = o_proj(attention(q, k, v, window_i))
//!     x = x + a                                          # sandwich: x + post_norm(a)
//!     m = down_proj(act(gate_proj(norm(x))) * up_proj(..))   # or rows of gate_up_proj
//!     x = x + m                                          # sandwich: x + post_norm(m)
//! logits = lm_head(norm(x)) [→ softcap]     # an embedder: pool(norm(x)) …
//! ```
//!
//! A family reads its config into a [`DecoderSpec`] (usually
//! [`DecoderSpec::from_config`], then a few field changes) and calls
//! [`build_decoder`]. Tensor names follow transformers'
//! `model.layers.{i}.self_attn.q_proj.weight` scheme; node labels are shorter
//! (`layers.{i}.attn.q_proj`). Every helper checks its weights against the
//! checkpoint through [`LowerCtx::weight`].

use crate::config::{HfConfig, RopeParameters};
use crate::error::Result;
use crate::lower::LowerCtx;
use crate::rope::{self, RopeFrequencies};
use gerbil_ir::op::KvKind;
use gerbil_ir::{
    Attention, BinaryOp, Embedding, Input, MatMul, Op, RmsNorm, Rope, UnaryOp, ValueRef,
};
use serde::Deserialize;
use serde_json::Value;

/// RMSNorm attributes shared by all norms of a model.
#[derive(Clone, Debug)]
pub(crate) struct NormSpec {
    /// Epsilon.
    pub eps: f32,
    /// Added to the weight (Gemma: 1).
    pub weight_offset: f32,
}

/// Where a layer's norms sit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NormLayout {
    /// Llama: `x + attn(input_layernorm(x))`, then
    /// `x + mlp(post_attention_layernorm(x))`.
    PreNorm,
    /// Gemma 3: each sub-block's output is normalized too, before the
    /// residual add: `x + post_attention_layernorm(attn(input_layernorm(x)))`,
    /// then `x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))`.
    Sandwich,
}

/// The attention sub-block's shape and options (the same in every layer).
#[derive(Clone, Debug)]
pub(crate) struct AttentionSpec {
    /// Query heads.
    pub n_heads: u32,
    /// Key/value heads.
    pub n_kv_heads: u32,
    /// Width of one head.
    pub head_dim: u32,
    /// Whether q/k/v projections have biases.
    pub qkv_bias: bool,
    /// Whether the output projection has a bias.
    pub o_bias: bool,
    /// Softmax scale.
    pub scale: f32,
    /// Per-head RMSNorm of queries and keys before RoPE (`q_norm`/`k_norm`,
    /// weights `[head_dim]`).
    pub qk_norm: bool,
    /// Queries, keys and values are row ranges of one `qkv_proj` (Phi-3).
    pub fused_qkv: bool,
    /// Whether a token sees only the keys before it (language models);
    /// else every key of its input (EmbeddingGemma).
    pub causal: bool,
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
    /// Gate and up are the two halves of one `gate_up_proj` (Phi-3).
    pub fused_gate_up: bool,
}

/// One RoPE table of the model.
#[derive(Clone, Debug)]
pub(crate) struct RopeTable {
    /// Node label (`rope_table`, or `rope_table.{layer_type}`).
    pub label: String,
    /// Its frequencies; the rotary dimension is twice their number.
    pub freqs: RopeFrequencies,
}

/// How one layer attends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LayerAttention {
    /// Sliding window, if any.
    pub window: Option<u32>,
    /// Index of the layer's table in [`DecoderSpec::ropes`].
    pub rope: usize,
}

/// Everything that shapes a decoder-only model.
#[derive(Clone, Debug)]
pub(crate) struct DecoderSpec {
    /// Residual width.
    pub hidden: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// Norm attributes.
    pub norm: NormSpec,
    /// Where the norms sit.
    pub norm_layout: NormLayout,
    /// Attention attributes.
    pub attn: AttentionSpec,
    /// MLP attributes.
    pub mlp: MlpSpec,
    /// Embedding multiplier, if any.
    pub embed_scale: Option<f32>,
    /// The embedding row that gets no gradient from lookups (the config's
    /// `pad_token_id`, PyTorch's `padding_idx`), if it is a row.
    pub pad_token: Option<u32>,
    /// Whether the LM head reuses the embedding table.
    pub tie_embeddings: bool,
    /// The RoPE tables.
    pub ropes: Vec<RopeTable>,
    /// Per layer: window and RoPE table. Its length is the number of layers.
    pub layers: Vec<LayerAttention>,
    /// `tanh(l / c) · c` on the logits, if set.
    pub logit_softcap: Option<f32>,
}

/// What a family's config class leaves implicit.
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
    /// `head_dim` when absent (`None`: `hidden_size / num_attention_heads`).
    pub head_dim: Option<u64>,
    /// The config key naming the MLP activation (`hidden_act`; Gemma:
    /// `hidden_activation`).
    pub act_key: &'static str,
    /// The activation when that key is absent.
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

/// The IR op for activation `name` (config key `key`), if this family accepts it.
pub(crate) fn checked_activation(
    ctx: &LowerCtx<'_>,
    key: &str,
    name: &str,
    accepted: &[&str],
) -> Result<UnaryOp> {
    activation(name)
        .filter(|_| accepted.contains(&name))
        .ok_or_else(|| {
            ctx.config_err(
                key,
                format!(
                    "activation `{name}` is not supported for {}; expected {}",
                    ctx.ckpt
                        .config
                        .architectures
                        .first()
                        .map(String::as_str)
                        .unwrap_or("this model"),
                    accepted.join(" or ")
                ),
            )
        })
}

/// The kind of attention of one layer, as in transformers' `layer_types`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LayerType {
    /// Causal attention over the whole context.
    FullAttention,
    /// Causal attention over the last `sliding_window` positions.
    SlidingAttention,
}

impl LayerType {
    /// The name transformers uses (also the key of per-layer-type RoPE parameters).
    pub fn name(self) -> &'static str {
        match self {
            LayerType::FullAttention => "full_attention",
            LayerType::SlidingAttention => "sliding_attention",
        }
    }
}

/// `layer_types` of the config when given (checked to have one entry per
/// layer), else `default(i)` for each layer `i`.
pub(crate) fn layer_types(
    ctx: &LowerCtx<'_>,
    layers: u32,
    given: Option<Vec<LayerType>>,
    default: impl Fn(u32) -> LayerType,
) -> Result<Vec<LayerType>> {
    match given {
        Some(types) if types.len() != layers as usize => Err(ctx.config_err(
            "layer_types",
            format!(
                "has {} entries but num_hidden_layers is {layers}",
                types.len()
            ),
        )),
        Some(types) => Ok(types),
        None => Ok((0..layers).map(default).collect()),
    }
}

/// A sliding window from config key `key` (`None` stays `None`).
pub(crate) fn window(ctx: &LowerCtx<'_>, key: &str, w: Option<u64>) -> Result<Option<u32>> {
    match w {
        None => Ok(None),
        Some(0) => Err(ctx.config_err(key, "must be positive (or null for no window)")),
        Some(w) => Ok(Some(ctx.u32_of(key, w)?)),
    }
}

/// A RoPE table labelled `label` for `params` with base `theta`, rotating
/// the part of each head of `head_dim` that `partial_rotary_factor` says.
pub(crate) fn rope_table(
    ctx: &LowerCtx<'_>,
    label: &str,
    params: &RopeParameters,
    theta: f64,
    head_dim: u32,
) -> Result<RopeTable> {
    let path = ctx.ckpt.config_path();
    let rotary_dim = rope::rotary_dim(params, head_dim, &path)?;
    let freqs = rope::rope_frequencies(params, theta, rotary_dim, &ctx.rope_context(), &path)?;
    Ok(RopeTable {
        label: label.to_string(),
        freqs,
    })
}

impl DecoderSpec {
    /// The Llama reading of the shared config keys, with one RoPE table for
    /// every layer and no sliding window; families adjust the result for
    /// what they do differently.
    pub fn from_config(ctx: &LowerCtx<'_>, d: &FamilyDefaults) -> Result<Self> {
        let mut spec = Self::without_rope(ctx, d)?;
        let params = ctx.ckpt.config.rope.uniform(&ctx.ckpt.config_path())?;
        let table = rope_table(
            ctx,
            "rope_table",
            params,
            params.theta_or(d.rope_theta),
            spec.attn.head_dim,
        )?;
        spec.ropes = vec![table];
        Ok(spec)
    }

    /// [`Self::from_config`] without the RoPE tables (`ropes` is empty, every
    /// layer points at table 0), for families whose RoPE differs per layer.
    pub fn without_rope(ctx: &LowerCtx<'_>, d: &FamilyDefaults) -> Result<Self> {
        let c: &HfConfig = &ctx.ckpt.config;
        let act_name = match ctx.ckpt.config_json.get(d.act_key) {
            None | Some(Value::Null) => d.hidden_act,
            Some(Value::String(name)) => name.as_str(),
            Some(other) => {
                return Err(ctx.config_err(d.act_key, format!("expected a string, found {other}")))
            }
        };
        let act = checked_activation(ctx, d.act_key, act_name, d.activations)?;
        let head_dim = match (c.explicit_head_dim, d.head_dim) {
            (None, Some(default)) => default,
            _ => c.head_dim,
        };
        let head_dim = ctx.u32_of("head_dim", head_dim)?;
        let n_heads = ctx.u32_of("num_attention_heads", c.num_attention_heads)?;
        let n_kv_heads = ctx.u32_of("num_key_value_heads", c.num_key_value_heads)?;
        let attention_bias = c.attention_bias.unwrap_or(d.attention_bias);
        let layers = ctx.u32_of("num_hidden_layers", c.num_hidden_layers)?;
        Ok(DecoderSpec {
            hidden: c.hidden_size,
            vocab: c.vocab_size,
            pad_token: c.pad_token_id.filter(|&p| u64::from(p) < c.vocab_size),
            norm: NormSpec {
                eps: c.rms_norm_eps as f32,
                weight_offset: 0.0,
            },
            norm_layout: NormLayout::PreNorm,
            attn: AttentionSpec {
                n_heads,
                n_kv_heads,
                head_dim,
                qkv_bias: attention_bias,
                o_bias: attention_bias,
                scale: f64::from(head_dim).powf(-0.5) as f32,
                qk_norm: false,
                fused_qkv: false,
                causal: true,
            },
            mlp: MlpSpec {
                intermediate: c.intermediate_size,
                act,
                bias: c.mlp_bias.unwrap_or(d.mlp_bias),
                fused_gate_up: false,
            },
            embed_scale: None,
            tie_embeddings: c.tie_word_embeddings.unwrap_or(d.tie_word_embeddings),
            ropes: Vec::new(),
            layers: vec![
                LayerAttention {
                    window: None,
                    rope: 0,
                };
                layers as usize
            ],
            logit_softcap: None,
        })
    }

    /// Gives every layer the sliding window `w`.
    pub fn set_window(&mut self, w: Option<u32>) {
        for l in &mut self.layers {
            l.window = w;
        }
    }
}

/// `RmsNorm(x, W tensor[width])` over `groups` equal slices of each row
/// (`width` is the slice's width).
pub(crate) fn rms_norm(
    ctx: &mut LowerCtx<'_>,
    x: ValueRef,
    tensor: &str,
    width: u64,
    groups: u32,
    norm: &NormSpec,
    label: String,
) -> Result<ValueRef> {
    let w = ctx.weight(tensor, &[width])?;
    let op = Op::RmsNorm(RmsNorm {
        eps: norm.eps,
        weight_offset: norm.weight_offset,
        groups,
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
    let y = ctx.add(Op::MatMul(MatMul::linear(false)), &[x, w], label.clone())?;
    if !bias {
        return Ok(y);
    }
    let b = ctx.weight(&format!("{prefix}.bias"), &[out])?;
    ctx.add(Op::AddBias, &[y, b], format!("{label}.bias"))
}

/// Splits a fused linear layer `{prefix}.weight` `[Σ parts, inp]` (and its
/// bias `[Σ parts]`) into one linear layer per part, in order, each reading
/// its own rows of the fused tensors. `parts` pairs a label with a row count.
pub(crate) fn fused_linear(
    ctx: &mut LowerCtx<'_>,
    x: ValueRef,
    prefix: &str,
    parts: &[(String, u64)],
    inp: u64,
    bias: bool,
) -> Result<Vec<ValueRef>> {
    let total: u64 = parts.iter().map(|(_, n)| n).sum();
    let mut start = 0;
    let mut outs = Vec::with_capacity(parts.len());
    for (label, rows) in parts {
        let w = ctx.weight_rows(&format!("{prefix}.weight"), &[total, inp], start, *rows)?;
        let mut y = ctx.add(Op::MatMul(MatMul::linear(false)), &[x, w], label.clone())?;
        if bias {
            let b = ctx.weight_rows(&format!("{prefix}.bias"), &[total], start, *rows)?;
            y = ctx.add(Op::AddBias, &[y, b], format!("{label}.bias"))?;
        }
        outs.push(y);
        start += rows;
    }
    Ok(outs)
}

/// `ids → embedding table lookup`; returns `(table, x)` so a tied LM head can
/// reuse the table node.
pub(crate) fn embed(
    ctx: &mut LowerCtx<'_>,
    vocab: u64,
    hidden: u64,
    lookup: Embedding,
) -> Result<(ValueRef, ValueRef)> {
    let ids = ctx.add(Op::Input(Input::TokenIds), &[], "input_ids")?;
    let table = ctx.weight("model.embed_tokens.weight", &[vocab, hidden])?;
    let x = ctx.add(Op::Embedding(lookup), &[table, ids], "embed")?;
    Ok((table, x))
}

/// The attention sub-block of layer `layer` on normalized input `h`:
/// projections, optional q/k norms, RoPE with `rope_table` (whose rotary
/// dimension is `rotary_dim`), KV-cache writes, attention with `window`, and
/// the output projection. Returns the output projection (before any post-norm
/// and the residual add).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_block(
    ctx: &mut LowerCtx<'_>,
    h: ValueRef,
    layer: u32,
    hidden: u64,
    spec: &AttentionSpec,
    norm: &NormSpec,
    rope_table: ValueRef,
    rotary_dim: u32,
    window: Option<u32>,
) -> Result<ValueRef> {
    let t = format!("model.layers.{layer}.self_attn");
    let p = gerbil_ir::layer_prefix(layer);
    let hd = u64::from(spec.head_dim);
    let q_width = u64::from(spec.n_heads) * hd;
    let kv_width = u64::from(spec.n_kv_heads) * hd;

    let (q, k, v) = if spec.fused_qkv {
        let parts = [
            (format!("{p}.attn.q_proj"), q_width),
            (format!("{p}.attn.k_proj"), kv_width),
            (format!("{p}.attn.v_proj"), kv_width),
        ];
        let qkv = fused_linear(
            ctx,
            h,
            &format!("{t}.qkv_proj"),
            &parts,
            hidden,
            spec.qkv_bias,
        )?;
        (qkv[0], qkv[1], qkv[2])
    } else {
        let mut proj = |name: &str, out: u64| {
            linear(
                ctx,
                h,
                &format!("{t}.{name}"),
                out,
                hidden,
                spec.qkv_bias,
                format!("{p}.attn.{name}"),
            )
        };
        (
            proj("q_proj", q_width)?,
            proj("k_proj", kv_width)?,
            proj("v_proj", kv_width)?,
        )
    };
    let (q, k) = if spec.qk_norm {
        (
            rms_norm(
                ctx,
                q,
                &format!("{t}.q_norm.weight"),
                hd,
                spec.n_heads,
                norm,
                format!("{p}.attn.q_norm"),
            )?,
            rms_norm(
                ctx,
                k,
                &format!("{t}.k_norm.weight"),
                hd,
                spec.n_kv_heads,
                norm,
                format!("{p}.attn.k_norm"),
            )?,
        )
    } else {
        (q, k)
    };
    let rope = |n_heads| {
        Op::Rope(Rope {
            n_heads,
            head_dim: spec.head_dim,
            rotary_dim,
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
        window,
        causal: spec.causal,
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
    let p = format!("{}.mlp", gerbil_ir::layer_prefix(layer));
    let i = spec.intermediate;
    let (g, u) = if spec.fused_gate_up {
        let parts = [(format!("{p}.gate_proj"), i), (format!("{p}.up_proj"), i)];
        let gu = fused_linear(
            ctx,
            h,
            &format!("{t}.gate_up_proj"),
            &parts,
            hidden,
            spec.bias,
        )?;
        (gu[0], gu[1])
    } else {
        let mut proj = |name: &str| {
            linear(
                ctx,
                h,
                &format!("{t}.{name}"),
                i,
                hidden,
                spec.bias,
                format!("{p}.{name}"),
            )
        };
        (proj("gate_proj")?, proj("up_proj")?)
    };
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
    let w = if tie && !ctx.has_tensor("lm_head.weight") {
        table
    } else {
        ctx.weight("lm_head.weight", &[vocab, hidden])?
    };
    ctx.add(Op::MatMul(MatMul::linear(false)), &[h, w], "lm_head")
}

/// The whole model: embedding, one block per entry of `spec.layers`
/// (attention then gated MLP, each with a residual, norms placed by
/// `spec.norm_layout`), final norm, LM head and optional logit softcap.
/// Sets the graph's `logits` output, or for an embedder
/// ([`super::sentence_head::is_embedder`]) its `embedding`.
pub(crate) fn build_decoder(ctx: &mut LowerCtx<'_>, spec: &DecoderSpec) -> Result<()> {
    let hidden = spec.hidden;
    let lookup = Embedding {
        scale: spec.embed_scale,
        padding: spec.pad_token,
    };
    let (table, mut x) = embed(ctx, spec.vocab, hidden, lookup)?;
    let mut tables = Vec::with_capacity(spec.ropes.len());
    for r in &spec.ropes {
        tables.push(ctx.rope_table(&r.freqs, &r.label)?);
    }
    for (i, layer) in spec.layers.iter().enumerate() {
        let i = i as u32;
        let t = format!("model.layers.{i}");
        let p = gerbil_ir::layer_prefix(i);
        let rope = &spec.ropes[layer.rope];
        let norm = |ctx: &mut LowerCtx<'_>, x, name: &str, label: String| {
            rms_norm(
                ctx,
                x,
                &format!("{t}.{name}.weight"),
                hidden,
                1,
                &spec.norm,
                label,
            )
        };
        let h = norm(ctx, x, "input_layernorm", format!("{p}.input_norm"))?;
        let mut a = attention_block(
            ctx,
            h,
            i,
            hidden,
            &spec.attn,
            &spec.norm,
            tables[layer.rope],
            2 * rope.freqs.inv_freq.len() as u32,
            layer.window,
        )?;
        let h = match spec.norm_layout {
            NormLayout::PreNorm => {
                x = residual(ctx, x, a, format!("{p}.attn.residual"))?;
                norm(
                    ctx,
                    x,
                    "post_attention_layernorm",
                    format!("{p}.post_attention_norm"),
                )?
            }
            NormLayout::Sandwich => {
                a = norm(
                    ctx,
                    a,
                    "post_attention_layernorm",
                    format!("{p}.attn.post_norm"),
                )?;
                x = residual(ctx, x, a, format!("{p}.attn.residual"))?;
                norm(
                    ctx,
                    x,
                    "pre_feedforward_layernorm",
                    format!("{p}.pre_mlp_norm"),
                )?
            }
        };
        let mut d = gated_mlp(ctx, h, i, hidden, &spec.mlp)?;
        if spec.norm_layout == NormLayout::Sandwich {
            d = norm(
                ctx,
                d,
                "post_feedforward_layernorm",
                format!("{p}.mlp.post_norm"),
            )?;
        }
        x = residual(ctx, x, d, format!("{p}.mlp.residual"))?;
    }
    let h = rms_norm(
        ctx,
        x,
        "model.norm.weight",
        hidden,
        1,
        &spec.norm,
        "final_norm".to_string(),
    )?;
    // An embedder ends with its sentence-transformers head instead.
    if super::sentence_head::is_embedder(ctx) {
        let positions = ctx.ckpt.config.max_position_embeddings;
        return super::sentence_head::build(ctx, h, hidden, positions);
    }
    let mut logits = lm_head(ctx, h, table, spec.tie_embeddings, spec.vocab, hidden)?;
    if let Some(cap) = spec.logit_softcap {
        logits = ctx.add(Op::Unary(UnaryOp::Softcap(cap)), &[logits], "logit_softcap")?;
    }
    let next = ctx.add(Op::SampleToken, &[logits], "next_token")?;
    ctx.graph
        .outputs
        .push((gerbil_ir::LOGITS.to_string(), logits));
    ctx.graph
        .outputs
        .push((gerbil_ir::NEXT_TOKEN.to_string(), next));
    Ok(())
}
