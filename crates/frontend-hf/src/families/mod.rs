//! Family builders: one module per architecture family, plus the shared
//! decoder pieces they are assembled from.
//!
//! [`decoder`] holds what Llama-like models have in common (embedding, RMSNorm,
//! attention sub-block with RoPE and KV cache, gated MLP, LM head) and a
//! [`decoder::DecoderSpec`] that captures the knobs families turn. A family
//! module reads its config, states what differs from Llama, and calls
//! [`decoder::build_pre_norm_decoder`] or composes the helpers itself.

pub(crate) mod decoder;
pub(crate) mod llama;
