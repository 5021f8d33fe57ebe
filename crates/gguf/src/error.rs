//! The crate's error type: every variant names the file and the key or
//! tensor involved, and says what the file claims against what it holds.

use std::path::PathBuf;

/// Why a GGUF file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The OS refused a read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not GGUF, or a version this reader does not know.
    #[error("{}: {why}", path.display())]
    NotGguf {
        /// The file.
        path: PathBuf,
        /// What the first bytes say.
        why: String,
    },
    /// The header, a metadata value or a tensor's data claims more bytes
    /// than the file holds.
    #[error(
        "{}: {what} needs {needed} bytes at offset {at}, but the file is {len} bytes \
         (truncated or corrupted? download it again)",
        path.display()
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What was being read (`metadata key "general.name"`, `tensor "blk.0.attn_q.weight"`).
        what: String,
        /// Where it starts.
        at: u64,
        /// How many bytes it claims.
        needed: u64,
        /// The file's length.
        len: u64,
    },
    /// A metadata entry is malformed (unknown value type, text that is not
    /// UTF-8, a repeated key).
    #[error("{}: metadata key \"{key}\": {why}", path.display())]
    Metadata {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// A tensor's directory entry is malformed (unknown type, a shape that is
    /// not whole blocks, data outside the file or overlapping another).
    #[error("{}: tensor \"{tensor}\": {why}", path.display())]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// What is wrong.
        why: String,
    },
}
