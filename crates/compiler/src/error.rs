//! [`CompileError`]: everything that can stop a compilation, by stage.
//!
//! Each stage keeps its own typed error (`FrontendError`, `PassError`,
//! `CodegenError`, `PlanError`); this enum wraps them and adds the driver's
//! own failures (bad options, weights that do not materialize, dump files that
//! cannot be written). Messages name the cause and, where there is one, the fix.

use gerbil_codegen_wgsl::CodegenError;
use gerbil_frontend_hf::FrontendError;
use gerbil_ir::ParseError;
use gerbil_passes::PassError;
use gerbil_plan::PlanError;
use std::path::PathBuf;

/// Why a compilation failed.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// Reading or lowering the checkpoint failed.
    #[error(transparent)]
    Frontend(#[from] FrontendError),
    /// A pass failed or a pass name is unknown.
    #[error(transparent)]
    Pass(#[from] PassError),
    /// Kernel generation or buffer planning failed.
    #[error(transparent)]
    Codegen(#[from] CodegenError),
    /// Writing the plan failed.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Textual IR (`gerbilc opt`) does not parse.
    #[error("{input}: {source}")]
    Parse {
        /// Where the text came from (a path, or `<stdin>`).
        input: String,
        /// Where and why.
        source: ParseError,
    },
    /// A flag or a model size exceeds what gerbil supports
    /// ([`gerbil_plan::limits`]).
    #[error(transparent)]
    Limit(#[from] gerbil_plan::limits::LimitError),
    /// A value of the model's graph is too large for the kernels' indices.
    #[error("`{value}` {reason}")]
    Size {
        /// The value: its node's label and type.
        value: String,
        /// What is too large.
        reason: String,
    },
    /// An option has a value the compiler cannot use.
    #[error("{option} {value}: {reason}")]
    Option {
        /// The option, as the CLI spells it (e.g. `--max-context`).
        option: &'static str,
        /// The value given.
        value: String,
        /// Why it is refused and what to use instead.
        reason: String,
    },
    /// A weight's bytes do not match what the graph says about it.
    #[error("weight `{weight}`: {reason}")]
    Weight {
        /// The weight's source, as the IR prints it.
        weight: String,
        /// What is wrong.
        reason: String,
    },
    /// A checkpoint tensor holds a NaN or an infinity ([`crate::finite`]).
    #[error(
        "tensor `{tensor}` holds a non-finite value ({value}) at element {index}: \
         the checkpoint is corrupt or was saved from a diverged run, and the plan would \
         print garbage; re-download or re-export it, or compile anyway with \
         `gerbilc compile --allow-non-finite`"
    )]
    NonFiniteWeight {
        /// The tensor's name in the checkpoint.
        tensor: String,
        /// Index of the first bad element (row-major).
        index: u64,
        /// `NaN`, `inf` or `-inf`.
        value: String,
    },
    /// A dump or kernel file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The compiler produced a plan that fails its own consistency check: a bug.
    #[error("internal error: the generated plan is inconsistent: {0}")]
    Inconsistent(String),
    /// The CPU interpreter could not compute the self-test's reference.
    #[error(
        "the self-test reference (the CPU interpreter on a short prompt) failed: {0}; compile \
         with --no-selftest to leave it out"
    )]
    SelfTest(String),
}

impl CompileError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CompileError::Io {
            path: path.into(),
            source,
        }
    }
}
