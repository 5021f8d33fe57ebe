//! Dump hooks: what the compiler shows of its graphs while it works.
//!
//! The driver calls an [`Observer`] with the lowered graph, after every pass
//! (with its rewrite count) and with the final graph. [`Dumps`] is the
//! observer behind `gerbilc compile --dump-ir` and `--dump-dot`: it prints
//! the IR text to a writer (standard output in the CLI) and writes Graphviz
//! files numbered in pipeline order — only for passes that changed the
//! graph, with the nodes the pass created highlighted. A caller that wants
//! nothing passes `&mut ()`.
//!
//! Writing a dump can fail (a closed pipe, a full disk); the failure stops
//! the compilation with an error instead of being lost.

use crate::error::CompileError;
use gerbil_ir::dot::{created_nodes, to_dot};
use gerbil_ir::{print::print, Graph};
use gerbil_passes::manager::PassRun;
use gerbil_passes::PassManager;
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Which IR dumps to print.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DumpIr {
    /// The graph as lowered, before any pass.
    Lowered,
    /// After the named pass.
    After(String),
    /// Before the first pass and after every pass.
    All,
    /// After the last pass, alone and without a heading line: the text
    /// `gerbilc opt` prints for the same passes.
    Final,
}

impl std::str::FromStr for DumpIr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "" | "lowered" | "before" => Ok(DumpIr::Lowered),
            "all" => Ok(DumpIr::All),
            "final" => Ok(DumpIr::Final),
            _ => match s.strip_prefix("after=") {
                Some("all") => Ok(DumpIr::All),
                Some(name) if !name.is_empty() => Ok(DumpIr::After(name.to_string())),
                _ => Err(format!(
                    "expected `lowered`, `final`, `all` or `after=PASS`, got `{s}`"
                )),
            },
        }
    }
}

/// Sees the graph at each stage of a compilation.
pub trait Observer {
    /// Called before any pass runs, to reject requests that name unknown passes.
    fn check(&self, _passes: &PassManager) -> Result<(), CompileError> {
        Ok(())
    }
    /// The graph as lowered, before any pass.
    fn lowered(&mut self, _graph: &Graph) -> Result<(), CompileError> {
        Ok(())
    }
    /// The graph after pass number `index` (from 1), which made
    /// `run.rewrites` rewrites.
    fn after_pass(
        &mut self,
        _index: usize,
        _run: &PassRun,
        _graph: &Graph,
    ) -> Result<(), CompileError> {
        Ok(())
    }
    /// The graph after the last pass.
    fn finished(&mut self, _graph: &Graph) -> Result<(), CompileError> {
        Ok(())
    }
}

/// Observes nothing.
impl Observer for () {}

/// IR text and Graphviz dumps.
pub struct Dumps<W: Write> {
    ir: Option<DumpIr>,
    dot_dir: Option<PathBuf>,
    out: W,
    /// The graph before the pass running now (only with `dot_dir`).
    before: Option<Graph>,
}

impl<W: Write> Dumps<W> {
    /// Prints the IR dumps `ir` asks for to `out` and, with `dot_dir`, writes
    /// `00-lowered.dot` and `NN-<pass>.dot` for each pass `NN` that changed
    /// the graph there.
    pub fn new(ir: Option<DumpIr>, dot_dir: Option<PathBuf>, out: W) -> Self {
        Dumps {
            ir,
            dot_dir,
            out,
            before: None,
        }
    }

    fn text(&mut self, heading: &str, graph: &Graph) -> Result<(), CompileError> {
        writeln!(self.out, "// IR {heading}\n{}", print(graph))
            .and_then(|()| self.out.flush())
            .map_err(|e| CompileError::io("standard output", e))
    }

    /// Writes `name.dot`, highlighting what is new since the last call.
    fn dot(&mut self, name: &str, graph: &Graph) -> Result<(), CompileError> {
        let Some(dir) = &self.dot_dir else {
            return Ok(());
        };
        let created = match &self.before {
            Some(before) => created_nodes(before, graph),
            None => HashSet::new(),
        };
        write_dot(dir, name, &to_dot(graph, &created))?;
        self.before = Some(graph.clone());
        Ok(())
    }
}

fn write_dot(dir: &Path, name: &str, dot: &str) -> Result<(), CompileError> {
    std::fs::create_dir_all(dir).map_err(|e| CompileError::io(dir, e))?;
    let path = dir.join(format!("{name}.dot"));
    gerbil_plan::safe_file::write_file(&path, dot.as_bytes())
        .map_err(|e| gerbil_plan::PlanError::from(e).into())
}

impl<W: Write> Observer for Dumps<W> {
    fn check(&self, passes: &PassManager) -> Result<(), CompileError> {
        if let Some(DumpIr::After(name)) = &self.ir {
            passes.check_name(name)?;
        }
        Ok(())
    }

    fn lowered(&mut self, graph: &Graph) -> Result<(), CompileError> {
        if matches!(self.ir, Some(DumpIr::Lowered | DumpIr::All)) {
            self.text("as lowered", graph)?;
        }
        self.dot("00-lowered", graph)
    }

    fn after_pass(
        &mut self,
        index: usize,
        run: &PassRun,
        graph: &Graph,
    ) -> Result<(), CompileError> {
        let pass = &run.name;
        let show = match &self.ir {
            Some(DumpIr::All) => true,
            Some(DumpIr::After(n)) => n == pass,
            _ => false,
        };
        if show {
            self.text(&format!("after {pass}"), graph)?;
        }
        if !run.changed() {
            return Ok(());
        }
        self.dot(&format!("{index:02}-{pass}"), graph)
    }

    fn finished(&mut self, graph: &Graph) -> Result<(), CompileError> {
        if self.ir == Some(DumpIr::Final) {
            write!(self.out, "{}", print(graph))
                .and_then(|()| self.out.flush())
                .map_err(|e| CompileError::io("standard output", e))?;
        }
        Ok(())
    }
}
