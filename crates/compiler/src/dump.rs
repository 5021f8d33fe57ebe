//! Dump hooks: what the compiler shows of its graphs while it works.
//!
//! The driver calls an [`Observer`] with the lowered graph and after every
//! pass. [`Dumps`] is the observer behind `gerbilc compile --dump-ir` and
//! `--dump-dot`: it prints the IR text to a writer (standard output in the
//! CLI) and writes Graphviz files numbered in pipeline order. A caller that
//! wants nothing passes `&mut ()`.
//!
//! Writing a dump can fail (a closed pipe, a full disk); the failure stops
//! the compilation with an error instead of being lost.

use crate::error::CompileError;
use gerbil_ir::{dot::to_dot, print::print, Graph};
use gerbil_passes::PassManager;
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
}

impl std::str::FromStr for DumpIr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "" | "lowered" | "before" => Ok(DumpIr::Lowered),
            "all" => Ok(DumpIr::All),
            _ => match s.strip_prefix("after=") {
                Some("all") => Ok(DumpIr::All),
                Some(name) if !name.is_empty() => Ok(DumpIr::After(name.to_string())),
                _ => Err(format!(
                    "expected `lowered`, `all` or `after=PASS`, got `{s}`"
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
    /// The graph after pass number `index` (from 1) called `pass`.
    fn after_pass(
        &mut self,
        _index: usize,
        _pass: &str,
        _graph: &Graph,
    ) -> Result<(), CompileError> {
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
}

impl<W: Write> Dumps<W> {
    /// Prints the IR dumps `ir` asks for to `out` and, with `dot_dir`, writes
    /// `00-lowered.dot`, `01-<pass>.dot`, … there.
    pub fn new(ir: Option<DumpIr>, dot_dir: Option<PathBuf>, out: W) -> Self {
        Dumps { ir, dot_dir, out }
    }

    fn text(&mut self, heading: &str, graph: &Graph) -> Result<(), CompileError> {
        writeln!(self.out, "// IR {heading}\n{}", print(graph))
            .and_then(|()| self.out.flush())
            .map_err(|e| CompileError::io("standard output", e))
    }

    fn dot(&self, name: &str, graph: &Graph) -> Result<(), CompileError> {
        let Some(dir) = &self.dot_dir else {
            return Ok(());
        };
        write_dot(dir, name, graph)
    }
}

fn write_dot(dir: &Path, name: &str, graph: &Graph) -> Result<(), CompileError> {
    std::fs::create_dir_all(dir).map_err(|e| CompileError::io(dir, e))?;
    let path = dir.join(format!("{name}.dot"));
    std::fs::write(&path, to_dot(graph)).map_err(|e| CompileError::io(&path, e))
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

    fn after_pass(&mut self, index: usize, pass: &str, graph: &Graph) -> Result<(), CompileError> {
        let show = match &self.ir {
            Some(DumpIr::All) => true,
            Some(DumpIr::After(n)) => n == pass,
            _ => false,
        };
        if show {
            self.text(&format!("after {pass}"), graph)?;
        }
        self.dot(&format!("{index:02}-{pass}"), graph)
    }
}
