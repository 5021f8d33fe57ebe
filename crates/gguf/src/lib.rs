//! gerbil's reader for GGUF, llama.cpp's model format: one file holding a
//! model's hyper-parameters, tokenizer and chat template as typed metadata,
//! and its tensors, most of them quantized in blocks.
//!
//! ```no_run
//! # fn main() -> Result<(), gerbil_gguf::GgufError> {
//! let gguf = gerbil_gguf::GgufFile::open("model.Q4_K_M.gguf".as_ref())?;
//! let arch = gguf.require("general.architecture", gerbil_gguf::GgufFile::str)?;
//! let t = gguf.tensor("token_embd.weight").unwrap();
//! let values: Vec<f32> = gguf.read_f32(t)?; // dequantized
//! # Ok(()) }
//! ```
//!
//! [`GgufFile`] ([`mod@file`]) reads the header and directory; [`TensorType`]
//! ([`types`]) knows every ggml type's block geometry and decodes the ones
//! gerbil supports, and [`quantize`] writes the block types as ggml's
//! reference quantizers do; [`Value`] is one metadata value. This crate knows
//! nothing about model families: mapping GGUF names and keys onto a
//! HuggingFace configuration is the frontend's job. Written here rather than
//! taken from crates.io because the readers there lose information (text
//! decoded lossily, tokenizer arrays truncated by default) and do not bound
//! what a corrupt file makes them allocate.

#![warn(missing_docs)]

pub mod error;
pub mod file;
mod kquant;
pub mod quantize;
pub mod types;
pub mod value;

pub use error::GgufError;
pub use file::{GgufFile, TensorInfo};
pub use types::TensorType;
pub use value::Value;
