//! The pass manager: ordering, enabling, verifying and dumping passes.

use gerbil_ir::{verify, Graph, VerifyError};

/// A graph rewrite with a stable name.
pub trait Pass {
    /// Name used by `--disable-pass` and `--dump-ir after=NAME`.
    fn name(&self) -> &'static str;
    /// One line: the pattern it matches and the rewrite.
    fn description(&self) -> &'static str;
    /// Rewrites the graph; returns whether anything changed.
    fn run(&self, graph: &mut Graph) -> Result<bool, PassError>;
}

/// Why the pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// A pass left the graph invalid (a compiler bug).
    #[error("the graph is invalid after pass `{pass}`: {source}")]
    Verify {
        /// The pass that ran last.
        pass: String,
        /// What the verifier found.
        source: VerifyError,
    },
    /// The input graph was already invalid.
    #[error("the lowered graph is invalid: {0}")]
    Input(VerifyError),
    /// A pass could not rewrite the graph.
    #[error("pass `{pass}` failed: {reason}")]
    Rewrite {
        /// The pass.
        pass: String,
        /// Why.
        reason: String,
    },
    /// `--disable-pass` or `--dump-ir` named a pass that does not exist.
    #[error("unknown pass `{name}`; passes are: {known}")]
    UnknownPass {
        /// The name given.
        name: String,
        /// Valid names, comma-separated.
        known: String,
    },
}

/// What the pipeline did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassReport {
    /// Passes that ran, with whether each changed the graph.
    pub ran: Vec<(String, bool)>,
    /// Passes skipped because they were disabled.
    pub skipped: Vec<String>,
}

/// Runs passes in order.
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    disabled: Vec<String>,
}

/// The standard pipeline, in order. `slice-last-row` runs before the
/// fusions so that the final norm is rebuilt on one row before
/// `fuse-residual-norm` could claim it; each fusion matches what the one
/// before it leaves (`fuse-qkv` → `fuse-qkv-rope`, `fuse-gate-up` →
/// `fuse-swiglu` / `fuse-geglu`) and is correct without it.
pub fn default_pipeline() -> Vec<Box<dyn Pass>> {
    vec![
        Box::new(crate::dce::Dce),
        Box::new(crate::slice_last_row::SliceLastRow),
        Box::new(crate::fuse_matmul_bias::FuseMatMulBias),
        Box::new(crate::fuse_qkv::FuseQkv),
        Box::new(crate::fuse_qkv_rope::FuseQkvRope),
        Box::new(crate::fuse_gate_up::FuseGateUp),
        Box::new(crate::fuse_glu::FuseGlu {
            act: gerbil_ir::UnaryOp::Silu,
        }),
        Box::new(crate::fuse_glu::FuseGlu {
            act: gerbil_ir::UnaryOp::GeluTanh,
        }),
        Box::new(crate::fuse_residual_norm::FuseResidualNorm),
    ]
}

impl PassManager {
    /// A manager over the given passes.
    pub fn new(passes: Vec<Box<dyn Pass>>) -> Self {
        PassManager {
            passes,
            disabled: Vec::new(),
        }
    }

    /// Names of all passes, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Checks that `name` is a pass of this pipeline.
    pub fn check_name(&self, name: &str) -> Result<(), PassError> {
        if self.passes.iter().any(|p| p.name() == name) {
            Ok(())
        } else {
            Err(PassError::UnknownPass {
                name: name.to_string(),
                known: self.names().join(", "),
            })
        }
    }

    /// Disables a pass by name; unknown names are an error listing valid ones.
    pub fn disable(&mut self, name: &str) -> Result<(), PassError> {
        self.check_name(name)?;
        self.disabled.push(name.to_string());
        Ok(())
    }

    /// Runs every enabled pass, verifying after each and calling
    /// `after(pass_name, graph)` once per pass that ran.
    pub fn run(
        &self,
        graph: &mut Graph,
        mut after: impl FnMut(&str, &Graph),
    ) -> Result<PassReport, PassError> {
        verify(graph).map_err(PassError::Input)?;
        let mut report = PassReport::default();
        for pass in &self.passes {
            let name = pass.name();
            if self.disabled.iter().any(|d| d == name) {
                report.skipped.push(name.to_string());
                continue;
            }
            let changed = pass.run(graph)?;
            verify(graph).map_err(|source| PassError::Verify {
                pass: name.to_string(),
                source,
            })?;
            report.ran.push((name.to_string(), changed));
            after(name, graph);
        }
        Ok(report)
    }
}
