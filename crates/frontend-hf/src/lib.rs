//! gerbil's HuggingFace frontend: reads a local checkpoint directory and
//! lowers it to a [`gerbil_ir::Graph`].
//!
//! ```no_run
//! # fn main() -> Result<(), gerbil_frontend_hf::FrontendError> {
//! let ckpt = gerbil_frontend_hf::Checkpoint::open(std::path::Path::new("SmolLM2-135M"))?;
//! let lowered = gerbil_frontend_hf::lower(&ckpt)?;
//! println!("{}", gerbil_ir::print::print(&lowered.graph));
//! # Ok(()) }
//! ```
//!
//! [`Checkpoint::open`] parses `config.json` ([`HfConfig`], v4 and v5 key
//! spellings alike), opens the safetensors files and checks their headers
//! ([`WeightStore`], which reads a tensor's bytes when it is asked for) and captures the tokenizer and chat template
//! ([`TextAssets`]). [`lower()`] picks the family builder from
//! `architectures[0]` and emits the graph; every weight is checked against
//! the shape the config implies, and keeps the checkpoint's dtype (bf16
//! stays bf16: kernels convert). RoPE tables are described by their inverse
//! frequencies, computed as transformers does ([`rope`]).
//!
//! This crate knows nothing about WGSL or wgpu.

#![warn(missing_docs)]

pub mod adapter;
pub mod checkpoint;
pub mod config;
pub mod error;
pub(crate) mod families;
pub mod generation;
pub mod gguf;
pub mod lower;
pub mod rope;
pub mod sentence;
pub mod text;
pub mod weights;

pub use checkpoint::Checkpoint;
pub use config::{HfConfig, RopeConfig, RopeParameters};
pub use error::FrontendError;
pub use generation::GenerationConfig;
pub use lower::{
    family_of, lower, lower_with, required_weights, supported_architectures, EmbeddingFacts,
    LowerOptions, Lowered, ModelFacts, RequiredWeight,
};
pub use rope::{RopeContext, RopeFrequencies};
pub use sentence::{PoolingMode, SentencePipeline};
pub use text::TextAssets;
pub use weights::{TensorView, WeightStore};
