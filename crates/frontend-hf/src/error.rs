//! The crate's error type.
//!
//! Every variant names the file, key or tensor involved so that the message
//! alone tells a user what to fix. Nothing a file controls ever panics: bad
//! JSON, missing keys, truncated safetensors and mis-shaped tensors all end up
//! here.

use std::path::PathBuf;

/// Why a checkpoint could not be read or lowered.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    /// A file or directory could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A JSON file is malformed or does not have the expected structure
    /// (serde's message names the missing or mistyped key and the line).
    #[error("{}: {source}", path.display())]
    Json {
        /// The JSON file.
        path: PathBuf,
        /// What serde said.
        source: serde_json::Error,
    },
    /// A configuration value is missing, inconsistent or out of range.
    #[error("{}: `{key}`: {why}", path.display())]
    Config {
        /// The file the value comes from.
        path: PathBuf,
        /// The key (dotted for nested keys, e.g. `rope_parameters.factor`).
        key: String,
        /// What is wrong with it.
        why: String,
    },
    /// A GGUF file could not be read (the message names the key or tensor).
    #[error(transparent)]
    Gguf(#[from] gerbil_gguf::GgufError),
    /// A GGUF file's `general.architecture` is not one gerbil lowers.
    #[error(
        "{}: GGUF architecture `{found}` (`general.architecture`) is not supported; supported: {}",
        path.display(),
        supported.join(", ")
    )]
    UnsupportedGgufArchitecture {
        /// The file.
        path: PathBuf,
        /// The architecture in the file.
        found: String,
        /// Architectures gerbil reads from GGUF.
        supported: Vec<String>,
    },
    /// `architectures[0]` names a model class no family builder handles.
    #[error(
        "unsupported architecture `{found}` (config.json `architectures[0]`); supported: {}",
        supported.join(", ")
    )]
    UnsupportedArchitecture {
        /// The architecture in the config.
        found: String,
        /// Architectures gerbil can lower.
        supported: Vec<String>,
    },
    /// The directory has no weights to lower.
    #[error(
        "no weights in {}: expected model.safetensors or model.safetensors.index.json",
        dir.display()
    )]
    NoWeights {
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// A tensor the architecture needs is not in the checkpoint.
    #[error("tensor `{name}` is missing from the checkpoint's weights")]
    MissingTensor {
        /// Tensor name.
        name: String,
    },
    /// A tensor's shape differs from what the config implies.
    #[error(
        "tensor `{name}` has shape {found:?} but the config implies {expected:?} \
         (does config.json belong to these weights?)"
    )]
    TensorShape {
        /// Tensor name.
        name: String,
        /// Shape implied by config.json.
        expected: Vec<u64>,
        /// Shape in the safetensors file.
        found: Vec<u64>,
    },
    /// A tensor has a dtype gerbil cannot load (only BF16, F16 and F32 are supported).
    #[error("tensor `{name}` has dtype {dtype}; supported dtypes are BF16, F16 and F32")]
    UnsupportedDtype {
        /// Tensor name.
        name: String,
        /// Its safetensors dtype.
        dtype: String,
    },
    /// A safetensors file became shorter while the compiler read it.
    #[error(
        "{}: the checkpoint file changed while it was being read (now {found} bytes, was \
         {expected}); do not rewrite a checkpoint while gerbilc compiles it: rerun the command",
        path.display()
    )]
    Changed {
        /// The file.
        path: PathBuf,
        /// Its length now.
        found: u64,
        /// Its length when opened.
        expected: u64,
    },
    /// A new LoRA adapter's settings do not fit the model.
    #[error("LoRA: {0}")]
    Lora(String),
    /// A LoRA adapter's files do not fit together or its base model.
    #[error("LoRA adapter {}: {why}", path.display())]
    Adapter {
        /// The adapter file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A safetensors file (or its index) is corrupt, truncated or inconsistent.
    #[error("invalid safetensors file {}: {msg}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// The config asks for a RoPE variant gerbil does not implement.
    #[error(
        "{}: unsupported RoPE type `{rope_type}`; supported: {}",
        path.display(),
        supported.join(", ")
    )]
    UnsupportedRope {
        /// The config file.
        path: PathBuf,
        /// The `rope_type` (or v4 `type`) in the config.
        rope_type: String,
        /// RoPE types gerbil implements.
        supported: Vec<String>,
    },
    /// A node's inputs did not fit its op: a bug in a family builder, or a
    /// config whose dimensions are inconsistent.
    #[error("building the graph failed: {0}")]
    Graph(#[from] gerbil_ir::graph::AddError),
}

/// Shorthand for results of this crate.
pub type Result<T, E = FrontendError> = std::result::Result<T, E>;
