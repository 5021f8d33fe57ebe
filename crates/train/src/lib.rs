//! Training for gerbil: fine-tuning a HuggingFace checkpoint on the GPU.
//!
//! [`run::Run`] is a training run — the training step compiled from the
//! model's IR (`gerbil_passes::training_passes`: f32 master weights, the
//! loss and the backward graph; `gerbil_codegen_wgsl::generate_training`),
//! run by `gerbil_runtime::Trainer` over the batches a token stream is cut
//! into ([`data`]) with the optimizer's hyper-parameters and learning-rate
//! schedule ([`schedule`]); it saves checkpoints in HF format ([`export`])
//! with the optimizer state to resume from ([`state`]). The `gerbil-train`
//! command is its front end; `docs/training.md` tells the whole story.
//!
//! The surprise: batches are a pure function of the step number, so a run
//! restarted from a checkpoint at step `i` sees exactly the batches an
//! uninterrupted run would have.

pub mod data;
pub mod export;
pub mod run;
pub mod schedule;
pub mod state;

pub use data::{DataError, Windows};
pub use run::{LoraOptions, Run, RunOptions, StepLog};
pub use schedule::{HyperError, Hyperparameters};

/// Why a training run cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The training text does not make a batch.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A hyper-parameter is out of range.
    #[error(transparent)]
    Hyper(#[from] HyperError),
    /// Another option is out of range.
    #[error("{0}")]
    Options(String),
    /// The model does not compile to a training step.
    #[error(transparent)]
    Compile(#[from] gerbil_compiler::CompileError),
    /// The checkpoint cannot be read.
    #[error(transparent)]
    Checkpoint(#[from] gerbil_frontend_hf::FrontendError),
    /// The GPU failed or refused the step.
    #[error(transparent)]
    Runtime(#[from] gerbil_runtime::RuntimeError),
    /// Writing a checkpoint failed.
    #[error(transparent)]
    File(#[from] gerbil_plan::safe_file::FileError),
    /// Reading or writing a file failed.
    #[error("{0}")]
    Io(String),
    /// The trained weights cannot be written as a checkpoint.
    #[error("cannot write the checkpoint: {0}")]
    Export(String),
    /// An optimizer state file is unusable.
    #[error("optimizer state {0}")]
    State(String),
}
