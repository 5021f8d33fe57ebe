//! Codegen: IR in, specialized WGSL kernels and dispatch schedules out.
//!
//! [`generate`] compiles a verified graph for a [`Target`] (the features
//! kernels may use and the limits they respect). It places sources and
//! outputs in buffers of their own and every other value in arenas
//! ([`planner`]), then, for each variant the target allows ([`variants_for`];
//! today `portable`), lowers every compute node to a kernel from the
//! templates in [`kernels`] (dimensions, epsilons and head counts baked in as
//! `const`s; only `T` and `P` come from the step-parameter uniform) and binds
//! its operands by IR port — once for the prefill schedule (several rows per
//! matmul workgroup) and once for decode (one). Every distinct kernel is
//! stored once and validated by naga with its variant's capabilities. The
//! result is a [`Program`].
//!
//! This crate opens no device: it is IR in, WGSL text and plan data out. The
//! caller fills in weight bytes (see [`Program::weights`]).

mod binder;
mod dispatch;
mod fusion;
pub mod kernels;
mod lower;
mod lower_train;
pub mod planner;
mod schedule;
mod sources;
mod target;
mod training;
pub mod tuning;
mod validate;
mod variant;

pub use lower::SHORT_PROMPT;
pub use schedule::{buffer_table, generate, CodegenOptions, Program, WeightAlias, WeightBuffer};
pub use target::{Limits, SubgroupSizes, Target};
pub use training::{generate_training, TrainingOptions, TrainingProgram};
pub use validate::{validate, validate_with};
pub use variant::{variants_for, VariantSpec, TENSOR_WORKGROUP_STORAGE};

/// Why codegen failed.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// naga rejected an emitted kernel (a compiler bug).
    #[error("kernel `{kernel}` failed naga validation:\n{report}")]
    Naga {
        /// Kernel name.
        kernel: String,
        /// naga's report, with the source location.
        report: String,
    },
    /// The graph has something codegen cannot lower.
    #[error("cannot generate code for node `{label}`: {reason}")]
    Unsupported {
        /// Node label.
        label: String,
        /// Why.
        reason: String,
    },
    /// A tensor exceeds a limit of the target.
    #[error("{what} needs {needed} but the target allows {limit} ({limit_name}); {hint}")]
    Limit {
        /// What is too large.
        what: String,
        /// Needed value.
        needed: u64,
        /// Target's value.
        limit: u64,
        /// The WebGPU limit's name.
        limit_name: &'static str,
        /// What to do.
        hint: &'static str,
    },
    /// The graph is cyclic or otherwise malformed.
    #[error("malformed graph: {0}")]
    Graph(String),
}
