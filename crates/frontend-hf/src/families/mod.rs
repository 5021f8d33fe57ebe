//! Family builders: one module per architecture family, plus the shared
//! decoder pieces they are assembled from.
//!
//! [`decoder`] holds what Llama-like models have in common (embedding, RMSNorm,
//! attention sub-block with RoPE and KV cache, gated MLP, LM head) and a
//! [`decoder::DecoderSpec`] that captures the knobs families turn (biases,
//! q/k norms, fused projections, norm placement, per-layer windows and RoPE
//! tables, embedding scale, logit softcap). A family module reads its config,
//! states what differs from Llama, and calls [`decoder::build_decoder`].

pub(crate) mod bert;
pub(crate) mod decoder;
pub(crate) mod gemma3;
pub(crate) mod llama;
pub(crate) mod mistral;
pub(crate) mod phi3;
pub(crate) mod qwen2;
pub(crate) mod qwen3;
pub(crate) mod sentence_head;
