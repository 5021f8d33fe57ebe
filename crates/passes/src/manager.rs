//! The pass manager: ordering, enabling, bisecting, verifying and dumping
//! passes.
//!
//! ```
//! use gerbil_passes::{default_pipeline, PassManager};
//! # let mut graph = gerbil_ir::Graph::new("empty");
//! let mut pm = PassManager::new(default_pipeline());
//! pm.disable("fuse-qkv")?;
//! pm.bisect(3); // run only the first 3 passes that are enabled
//! let report = pm.run(&mut graph, |run, _graph| {
//!     println!("{}: {} rewrites", run.name, run.rewrites);
//! })?;
//! assert_eq!(report.stopped_before.as_deref(), Some("fuse-qkv-rope"));
//! # Ok::<(), gerbil_passes::PassError>(())
//! ```
//!
//! Every pass reports how many rewrites it made; zero means it left the graph
//! untouched, which is how `--dump-dot` knows what to skip. Every pass of the
//! default pipeline is optional (the plan is correct without it), so
//! [`PassManager::bisect`] can stop anywhere: like rustc's `-Z mir-opt-bisect-limit`,
//! halve `N` until a miscompile disappears and the report names the culprit.

use gerbil_ir::{verify, Graph, VerifyError};

/// A graph rewrite with a stable name.
pub trait Pass {
    /// Name used by `--disable-pass` and `--dump-ir after=NAME`.
    fn name(&self) -> &'static str;
    /// One line: the pattern it matches and the rewrite.
    fn description(&self) -> &'static str;
    /// Rewrites the graph; returns how many rewrites it made (each a match of
    /// its pattern replaced, or for `dce` each node deleted); 0 means the
    /// graph is unchanged.
    fn run(&self, graph: &mut Graph) -> Result<usize, PassError>;
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
    /// `--disable-pass`, `--dump-ir` or `--passes` named a pass that does not exist.
    #[error("unknown pass `{name}`; passes are: {known}")]
    UnknownPass {
        /// The name given.
        name: String,
        /// Valid names, comma-separated.
        known: String,
    },
}

/// One pass that ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassRun {
    /// Its name.
    pub name: String,
    /// How many rewrites it made.
    pub rewrites: usize,
}

impl PassRun {
    /// Whether the pass changed the graph.
    pub fn changed(&self) -> bool {
        self.rewrites > 0
    }
}

/// What the pipeline did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassReport {
    /// Passes that ran, in order, with their rewrite counts.
    pub ran: Vec<PassRun>,
    /// Passes skipped because they were disabled.
    pub skipped: Vec<String>,
    /// With [`PassManager::bisect`]: the first enabled pass that did not run
    /// because the limit was reached (`None` if every pass ran).
    pub stopped_before: Option<String>,
}

/// Runs passes in order.
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    disabled: Vec<String>,
    limit: Option<usize>,
}

/// The standard pipeline, in order. `slice-last-row` runs before the
/// fusions so that the final norm is rebuilt on one row before
/// `fuse-residual-norm` could claim it; each fusion matches what the one
/// before it leaves (`fuse-qkv` → `fuse-qkv-rope`, `fuse-gate-up` →
/// `fuse-swiglu` / `fuse-geglu`) and is correct without it.
/// `fuse-matmul-act` follows them (a gate's activation is theirs), then
/// `fuse-matmul-residual` and `fuse-norm-matmul` run after the matmuls are
/// merged (they fold into the merged ones) and before `fuse-residual-norm`,
/// which takes the norms they leave: the final one when it reads the last
/// row of an add (Gemma 3), and those that read neither a residual add they
/// could fold nor feed only matmuls. `fuse-last-row-matmul` follows
/// `fuse-norm-matmul`, once the final norm is the LM head's prologue and
/// the slice is what the LM head reads.
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
        Box::new(crate::fuse_matmul_act::FuseMatMulAct),
        Box::new(crate::fuse_matmul_residual::FuseMatMulResidual),
        Box::new(crate::fuse_norm_matmul::FuseNormMatMul),
        Box::new(crate::fuse_last_row_matmul::FuseLastRowMatMul),
        Box::new(crate::fuse_residual_norm::FuseResidualNorm),
        Box::new(crate::fuse_norm_add::FuseNormAdd),
    ]
}

/// What makes a training step's graph of a lowered forward graph: f32
/// master weights (`master-weights`), the loss and the backward ops
/// (`autodiff`), then `dce` of what the loss and the gradients no longer
/// read (the next-token sampling). Not part of the default pipeline; the
/// fusions may run after it.
pub fn training_passes() -> Vec<Box<dyn Pass>> {
    vec![
        Box::new(crate::master_weights::MasterWeights),
        Box::new(crate::autodiff::Autodiff),
        Box::new(crate::dce::Dce),
    ]
}

/// Every pass there is: the default pipeline's, then the training ones.
fn all_passes() -> Vec<Box<dyn Pass>> {
    let mut all = default_pipeline();
    all.push(Box::new(crate::master_weights::MasterWeights));
    all.push(Box::new(crate::autodiff::Autodiff));
    all
}

/// The passes with these names (of the default pipeline, or a training one),
/// in the order given (`gerbilc opt --passes a,b,c`, the pass file tests);
/// an unknown name is an error listing the valid ones.
pub fn passes_named<S: AsRef<str>>(names: &[S]) -> Result<Vec<Box<dyn Pass>>, PassError> {
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let name = name.as_ref();
        let pass = all_passes().into_iter().find(|p| p.name() == name);
        out.push(pass.ok_or_else(|| {
            PassError::UnknownPass {
                name: name.to_string(),
                known: all_passes()
                    .iter()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            }
        })?);
    }
    Ok(out)
}

impl PassManager {
    /// A manager over the given passes.
    pub fn new(passes: Vec<Box<dyn Pass>>) -> Self {
        PassManager {
            passes,
            disabled: Vec::new(),
            limit: None,
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

    /// Runs only the first `n` enabled passes; the report names the pass it
    /// stopped before.
    pub fn bisect(&mut self, n: usize) {
        self.limit = Some(n);
    }

    /// Runs every enabled pass (up to the bisect limit), verifying after each
    /// and calling `after(run, graph)` once per pass that ran.
    pub fn run(
        &self,
        graph: &mut Graph,
        mut after: impl FnMut(&PassRun, &Graph),
    ) -> Result<PassReport, PassError> {
        verify(graph).map_err(PassError::Input)?;
        let mut report = PassReport::default();
        for pass in &self.passes {
            let name = pass.name();
            if self.disabled.iter().any(|d| d == name) {
                report.skipped.push(name.to_string());
                continue;
            }
            if self.limit.is_some_and(|n| report.ran.len() >= n) {
                report
                    .stopped_before
                    .get_or_insert_with(|| name.to_string());
                continue;
            }
            let rewrites = pass.run(graph)?;
            verify(graph).map_err(|source| PassError::Verify {
                pass: name.to_string(),
                source,
            })?;
            let run = PassRun {
                name: name.to_string(),
                rewrites,
            };
            after(&run, graph);
            report.ran.push(run);
        }
        Ok(report)
    }
}
