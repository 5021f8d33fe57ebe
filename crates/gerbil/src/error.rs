//! The facade's error type: what the GPU runtime and the text half can report, and the two
//! ways a model can lack text.
//!
//! Match on [`Error::Runtime`] for GPU and plan failures (`RuntimeError::DeviceLost`,
//! `RuntimeError::OutOfMemory`, ...) and on [`Error::Text`] for tokenizer and chat-template
//! failures. The surprise: a plan whose tokenizer does not load still loads; its text calls
//! return [`Error::TextUnavailable`] while token ids keep working.

use gerbil_runtime::RuntimeError;
use gerbil_text::TextError;

/// Why loading a model or generating from it failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The GPU runtime or the plan failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Tokenization or chat-template failure.
    #[error(transparent)]
    Text(#[from] TextError),
    /// Text in or out, but the plan has no tokenizer.
    #[error("this plan has no tokenizer (the checkpoint had no tokenizer.json): pass token ids (--input-ids) instead of text")]
    NoTokenizer,
    /// [`crate::Batch::start`] with every place of the batch taken.
    #[error(
        "the batch is full: {running} sequences run, as many as the plan's --max-batch and the \
         session's slots allow; wait for one to end (or remove one), or open the model with more \
         slots and a plan compiled with a larger --max-batch"
    )]
    BatchFull {
        /// Sequences running.
        running: usize,
    },
    /// A [`crate::TokenConstraint`] failed, or left no token to choose.
    #[error("constrained generation failed: {0}")]
    Constraint(String),
    /// Text in or out, but the plan's tokenizer or chat template does not load.
    #[error("{0}; this plan still runs on token ids (--input-ids), or recompile it from a checkpoint with a working tokenizer")]
    TextUnavailable(String),
    /// [`crate::Model::shorten`] to no dimensions, or more than the model makes.
    #[error(
        "{asked} dimensions asked for, but this model's vectors have {model}: give 1 to {model}"
    )]
    BadDimensions {
        /// The dimensions asked for.
        asked: usize,
        /// The model's.
        model: u64,
    },
}

impl From<gerbil_plan::PlanError> for Error {
    fn from(e: gerbil_plan::PlanError) -> Self {
        Error::Runtime(e.into())
    }
}
