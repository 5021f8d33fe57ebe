//! The sentence-transformers head every embedding model ends with, whatever
//! its transformer: the token rows pooled into one vector, any `Dense`
//! projections, an L2 norm when the pipeline has `Normalize`, and the
//! graph's [`EMBEDDING`] output.
//!
//! BERT-style encoders always end here; a decoder family ends here instead
//! of its LM head when the checkpoint is an embedder ([`is_embedder`]): a
//! bare transformer saved without its head (`Qwen3Model`,
//! `Gemma3TextModel`) or a sentence-transformers directory (`modules.json`)
//! such as Qwen3-Embedding, whose config still says `Qwen3ForCausalLM`.
//! The surprise: the pooled vector has one row per input of a packed step,
//! so the projections after it are small matmuls over the step's inputs,
//! not over its tokens.

use crate::error::Result;
use crate::families::decoder::linear;
use crate::lower::{EmbeddingFacts, LowerCtx};
use crate::sentence::{PoolingMode, SentencePipeline};
use gerbil_ir::{Op, Pooling, ValueRef, EMBEDDING};

/// Whether the checkpoint is an embedding model rather than a language
/// model: a bare transformer (no head to make logits with), or a
/// `modules.json` whose pipeline pools (sentence-transformers saves one
/// beside any model it wraps).
pub(crate) fn is_embedder(ctx: &LowerCtx<'_>) -> bool {
    let bare = ctx
        .ckpt
        .config
        .architecture()
        .is_ok_and(|a| a.ends_with("Model"));
    bare || crate::sentence::pools(&ctx.ckpt.dir)
}

/// Ends the graph with the pipeline's vector of the rows `x` (`[T, width]`):
/// an input may have up to `max_positions` tokens.
pub(crate) fn build(
    ctx: &mut LowerCtx<'_>,
    x: ValueRef,
    width: u64,
    max_positions: u64,
) -> Result<()> {
    let pipeline = SentencePipeline::read(&ctx.ckpt.dir)?;
    let pooling = match pipeline.pooling {
        PoolingMode::Mean => Pooling::Mean,
        PoolingMode::Cls => Pooling::Cls,
        PoolingMode::Max => Pooling::Max,
        PoolingMode::LastToken => Pooling::Last,
    };
    let mut v = ctx.add(Op::Pool(pooling), &[x], "pooling")?;
    let mut dimension = width;
    for (i, d) in pipeline.dense.iter().enumerate() {
        if d.in_features != dimension {
            return Err(ctx.config_err(
                "modules.json",
                format!(
                    "Dense module {} takes {} features, but the vector before it has {dimension}",
                    d.prefix.trim_end_matches('.'),
                    d.in_features
                ),
            ));
        }
        v = linear(
            ctx,
            v,
            &format!("{}linear", d.prefix),
            d.out_features,
            d.in_features,
            d.bias,
            format!("dense.{i}"),
        )?;
        dimension = d.out_features;
    }
    if pipeline.normalize {
        v = ctx.add(Op::L2Normalize, &[v], "normalize")?;
    }
    ctx.graph.outputs.push((EMBEDDING.to_string(), v));
    ctx.embedding = Some(EmbeddingFacts {
        dimension,
        max_positions,
        pipeline,
    });
    Ok(())
}
