//! BERT encoders (`BertModel`) and RoBERTa's (`XLMRobertaModel`,
//! `RobertaModel`): sentence-transformers models such as all-MiniLM-L6-v2
//! or multilingual-e5, lowered to a graph whose output is the sentence
//! embedding ([`gerbil_ir::EMBEDDING`]).
//!
//! The embedding sums the word row, the learned position row (`add_positions`)
//! and token type 0's row (an `add_bias`: sentence-transformers passes all-zero
//! `token_type_ids` for one text), then LayerNorm. Each layer is post-norm:
//! bidirectional attention over the step's keys (written to the KV cache
//! like a decoder's, so the attention kernels are shared), `LayerNorm(x +
//! attn)`, then `LayerNorm(x + W₂·gelu(W₁·x))`. The pipeline of
//! `modules.json` follows ([`crate::sentence`]): pooling, and an L2 norm
//! when the model has a `Normalize` module. The surprise: no padding mask —
//! a step packs whole inputs end to end, and the kernels that care
//! (positions, attention, pooling) read each row's input from the step's
//! segment table.
//! RoBERTa differs only in its positions: they start at `pad_token_id + 1`
//! (transformers counts from the padding id), so the graph reads the
//! position table from that row on, and the model has that many fewer.
//! Tensors are read with or without the `bert.` / `roberta.` prefix that
//! `*For*` checkpoints carry; the pooler and the MLM head are not read.

use crate::error::Result;
use crate::families::decoder::linear;
use crate::lower::LowerCtx;
use gerbil_ir::op::KvKind;
use gerbil_ir::{Attention, BinaryOp, Embedding, LayerNorm, Op, UnaryOp, ValueRef};
use serde::Deserialize;

/// BERT's own `config.json` keys.
#[derive(Deserialize, Default)]
#[serde(default)]
struct BertKeys {
    type_vocab_size: Option<u64>,
    position_embedding_type: Option<String>,
    pad_token_id: Option<u64>,
}

/// Where an encoder's positions start in its position table.
#[derive(Clone, Copy)]
enum Positions {
    /// At row 0 (BERT).
    First,
    /// After the padding id's row (RoBERTa).
    AfterPadding,
}

/// The sizes one layer is built with.
struct Shape {
    hidden: u64,
    intermediate: u64,
    heads: u32,
    head_dim: u32,
    eps: f32,
    act: UnaryOp,
}

/// Builds a `BertModel` graph.
pub(crate) fn build(ctx: &mut LowerCtx<'_>) -> Result<()> {
    build_encoder(ctx, Positions::First, "bert.")
}

/// Builds an `XLMRobertaModel` or `RobertaModel` graph.
pub(crate) fn build_roberta(ctx: &mut LowerCtx<'_>) -> Result<()> {
    build_encoder(ctx, Positions::AfterPadding, "roberta.")
}

/// Builds an encoder whose positions start as `positions` says and whose
/// tensors may carry the prefix `prefix`.
fn build_encoder(ctx: &mut LowerCtx<'_>, positions: Positions, prefix: &str) -> Result<()> {
    let c = ctx.ckpt.config.clone();
    let keys: BertKeys = ctx.family_keys()?;
    if let Some(kind) = keys.position_embedding_type.as_deref() {
        if kind != "absolute" {
            return Err(ctx.config_err(
                "position_embedding_type",
                format!("`{kind}` is not supported; gerbil runs BERT's absolute positions"),
            ));
        }
    }
    let act = match c.hidden_act.as_deref().unwrap_or("gelu") {
        "gelu" => UnaryOp::Gelu,
        "gelu_new" | "gelu_pytorch_tanh" => UnaryOp::GeluTanh,
        other => {
            return Err(ctx.config_err(
                "hidden_act",
                format!(
                    "`{other}` is not supported; BERT runs gelu, gelu_new or gelu_pytorch_tanh"
                ),
            ))
        }
    };
    let heads = ctx.u32_of("num_attention_heads", c.num_attention_heads)?;
    let shape = Shape {
        hidden: c.hidden_size,
        intermediate: c.intermediate_size,
        heads,
        head_dim: ctx.u32_of("head_dim", c.hidden_size / c.num_attention_heads)?,
        eps: c.rms_norm_eps as f32,
        act,
    };
    if u64::from(shape.heads) * u64::from(shape.head_dim) != shape.hidden {
        return Err(ctx.config_err(
            "num_attention_heads",
            format!("{heads} heads do not divide hidden_size {}", shape.hidden),
        ));
    }
    let p = if ctx.has_tensor(&format!("{prefix}embeddings.word_embeddings.weight")) {
        prefix
    } else {
        ""
    };
    let h = shape.hidden;
    let ids = ctx.add(Op::Input(gerbil_ir::Input::TokenIds), &[], "input_ids")?;
    let words = ctx.weight(
        &format!("{p}embeddings.word_embeddings.weight"),
        &[c.vocab_size, h],
    )?;
    let mut x = ctx.add(
        Op::Embedding(Embedding {
            scale: None,
            padding: None,
        }),
        &[words, ids],
        "embeddings.word",
    )?;
    let table = format!("{p}embeddings.position_embeddings.weight");
    let dims = [c.max_position_embeddings, h];
    let (table, max_positions) = match positions {
        Positions::First => (ctx.weight(&table, &dims)?, c.max_position_embeddings),
        Positions::AfterPadding => {
            let first = keys.pad_token_id.unwrap_or(1) + 1;
            let rows = c
                .max_position_embeddings
                .checked_sub(first)
                .filter(|&n| n > 0);
            let rows = rows.ok_or_else(|| {
                ctx.config_err(
                    "max_position_embeddings",
                    format!(
                        "leaves no position after the padding id's row {}",
                        first - 1
                    ),
                )
            })?;
            (ctx.weight_rows(&table, &dims, first, rows)?, rows)
        }
    };
    x = ctx.add(Op::AddPositions, &[x, table], "embeddings.position")?;
    let types = keys.type_vocab_size.unwrap_or(2);
    let type_row = ctx.weight_row(
        &format!("{p}embeddings.token_type_embeddings.weight"),
        &[types, h],
        0,
    )?;
    x = ctx.add(Op::AddBias, &[x, type_row], "embeddings.token_type")?;
    x = layer_norm(
        ctx,
        x,
        &format!("{p}embeddings.LayerNorm"),
        "embeddings.norm",
        &shape,
    )?;
    for layer in 0..c.num_hidden_layers {
        let layer = ctx.u32_of("num_hidden_layers", layer)?;
        x = encoder_layer(ctx, x, layer, &format!("{p}encoder.layer.{layer}"), &shape)?;
    }
    super::sentence_head::build(ctx, x, h, max_positions)
}

/// `LayerNorm(x)` with the weight and bias under `prefix`.
fn layer_norm(
    ctx: &mut LowerCtx<'_>,
    x: ValueRef,
    prefix: &str,
    label: &str,
    s: &Shape,
) -> Result<ValueRef> {
    let w = ctx.weight(&format!("{prefix}.weight"), &[s.hidden])?;
    let b = ctx.weight(&format!("{prefix}.bias"), &[s.hidden])?;
    ctx.add(Op::LayerNorm(LayerNorm { eps: s.eps }), &[x, w, b], label)
}

/// `LayerNorm(x + y)` with the norm under `prefix`, labelled `label`.
fn add_norm(
    ctx: &mut LowerCtx<'_>,
    (x, y): (ValueRef, ValueRef),
    prefix: &str,
    label: &str,
    s: &Shape,
) -> Result<ValueRef> {
    let sum = ctx.add(
        Op::Binary(BinaryOp::Add),
        &[y, x],
        format!("{label}.residual"),
    )?;
    layer_norm(ctx, sum, prefix, label, s)
}

/// One post-norm encoder layer under `t` (`encoder.layer.N`).
fn encoder_layer(
    ctx: &mut LowerCtx<'_>,
    x: ValueRef,
    layer: u32,
    t: &str,
    s: &Shape,
) -> Result<ValueRef> {
    let (h, l) = (s.hidden, format!("layers.{layer}"));
    let proj = |ctx: &mut LowerCtx<'_>, x, name: &str, label: &str, out, inp| {
        linear(
            ctx,
            x,
            &format!("{t}.{name}"),
            out,
            inp,
            true,
            format!("{l}.{label}"),
        )
    };
    let q = proj(ctx, x, "attention.self.query", "attn.q_proj", h, h)?;
    let k = proj(ctx, x, "attention.self.key", "attn.k_proj", h, h)?;
    let v = proj(ctx, x, "attention.self.value", "attn.v_proj", h, h)?;
    let cache = |kind| Op::KvCache {
        layer,
        kind,
        width: h,
    };
    let kc = ctx.add(cache(KvKind::K), &[], format!("{l}.k_cache"))?;
    let vc = ctx.add(cache(KvKind::V), &[], format!("{l}.v_cache"))?;
    let kc = ctx.add(Op::CacheWrite, &[kc, k], format!("{l}.attn.k_cache_write"))?;
    let vc = ctx.add(Op::CacheWrite, &[vc, v], format!("{l}.attn.v_cache_write"))?;
    let attention = Op::Attention(Attention {
        n_heads: s.heads,
        n_kv_heads: s.heads,
        head_dim: s.head_dim,
        scale: f64::from(s.head_dim).powf(-0.5) as f32,
        window: None,
        causal: false,
    });
    let a = ctx.add(attention, &[q, kc, vc], format!("{l}.attn.sdpa"))?;
    let o = proj(ctx, a, "attention.output.dense", "attn.o_proj", h, h)?;
    let norm = format!("{t}.attention.output.LayerNorm");
    let x = add_norm(ctx, (x, o), &norm, &format!("{l}.attn_norm"), s)?;
    let up = proj(
        ctx,
        x,
        "intermediate.dense",
        "mlp.up_proj",
        s.intermediate,
        h,
    )?;
    let act = ctx.add(Op::Unary(s.act), &[up], format!("{l}.mlp.act"))?;
    let down = proj(ctx, act, "output.dense", "mlp.down_proj", h, s.intermediate)?;
    let norm = format!("{t}.output.LayerNorm");
    add_norm(ctx, (x, down), &norm, &format!("{l}.mlp_norm"), s)
}
