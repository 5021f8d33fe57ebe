//! A GGUF file (llama.cpp's format) opened as a [`Checkpoint`]: the same
//! structures a HuggingFace directory fills, written from the file's
//! metadata, so every family builder and check downstream runs unchanged.
//!
//! ```no_run
//! # fn main() -> Result<(), gerbil_frontend_hf::FrontendError> {
//! let ckpt = gerbil_frontend_hf::Checkpoint::open("SmolLM2-135M-Instruct.Q4_1.gguf".as_ref())?;
//! assert_eq!(ckpt.config.architectures, ["LlamaForCausalLM"]);
//! let q = ckpt.tensor("model.layers.0.self_attn.q_proj.weight")?; // Q4_1 blocks, un-permuted
//! # Ok(()) }
//! ```
//!
//! [`config`] writes `config.json`, [`tokenizer`] writes `tokenizer.json`,
//! [`names`] maps tensor names and the transforms llama.cpp applied. The
//! weights stay in the file until the plan writer asks for them, one tensor
//! at a time, each read, fixed up and handed over, never kept by the store
//! (see [`crate::weights`]). A quantized matrix keeps its ggml blocks (rows of
//! blocks are moved to undo llama.cpp's Q/K permutation), which the kernels
//! decode in registers to the values transformers dequantizes, so a plan is
//! about the file's size; 1-D quantized tensors and Gemma's `1 + w` norms are
//! dequantized to f32 on the CPU, and F32, F16 and BF16 tensors keep their
//! type.

pub mod config;
pub mod names;
pub mod tokenizer;

use crate::checkpoint::Checkpoint;
use crate::config::HfConfig;
use crate::error::{FrontendError, Result};
use crate::generation::GenerationConfig;
use crate::text::TextAssets;
use crate::weights::WeightStore;
use gerbil_gguf::GgufFile;
use std::path::Path;

/// Whether `path` names a GGUF file (by extension, or by its first bytes).
pub fn is_gguf(path: &Path) -> bool {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return true;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok_and(|()| &magic == gerbil_gguf::file::MAGIC)
}

/// Opens the GGUF file at `path` as a checkpoint.
pub fn open(path: &Path) -> Result<Checkpoint> {
    crate::checkpoint::check_regular(path)?;
    checkpoint(GgufFile::open(path)?)
}

/// The checkpoint an opened GGUF file describes (for files in memory:
/// [`GgufFile::from_bytes`]).
pub fn checkpoint(g: GgufFile) -> Result<Checkpoint> {
    let path = g.path().to_path_buf();
    let path = path.as_path();
    let arch = g
        .require("general.architecture", GgufFile::str)?
        .to_string();
    if !config::ARCHITECTURES.iter().any(|a| a.0 == arch) {
        let supported = config::ARCHITECTURES
            .iter()
            .map(|a| a.0.to_string())
            .collect();
        return Err(FrontendError::UnsupportedGgufArchitecture {
            path: path.to_path_buf(),
            found: arch,
            supported,
        });
    }
    let config_json = config::hf_config(&g, &arch)?;
    let text = serde_json::to_string(&config_json).unwrap_or_default();
    let config = HfConfig::from_json_str(&text, path)?;
    let tokenizer_json =
        tokenizer::tokenizer_json(&g, &arch)?.map(|t| serde_json::to_vec(&t).unwrap_or_default());
    let token = |key: &str| -> Result<Option<String>> {
        let id = g.u64(key)?;
        let tokens = g.array("tokenizer.ggml.tokens")?.unwrap_or_default();
        Ok(id
            .and_then(|id| tokens.get(id as usize))
            .and_then(|t| t.as_str())
            .map(str::to_string))
    };
    let mut eos_token_ids = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
        if let Some(id) = g.u64(key)? {
            let id = u32::try_from(id).map_err(|_| g.key_error(key, "not a token id"))?;
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
    }
    let assets = TextAssets {
        tokenizer_json,
        chat_template: g.str("tokenizer.chat_template")?.map(str::to_string),
        bos_token: token("tokenizer.ggml.bos_token_id")?,
        eos_token: token("tokenizer.ggml.eos_token_id")?,
        eos_token_ids,
        generation: GenerationConfig::default(),
    };
    let (heads, kv_heads) = (config.num_attention_heads, config.num_key_value_heads);
    let weights = WeightStore::from_gguf(g, &arch, heads, kv_heads)?;
    Ok(Checkpoint {
        dir: path.to_path_buf(),
        name: path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
        config_json,
        config,
        has_weights: !weights.is_empty(),
        weights,
        text: assets,
        adapter: None,
    })
}
