//! Passes on textual IR: what `gerbilc opt FILE --passes a,b,c` runs.
//!
//! ```
//! use gerbil_compiler::{opt, OptOptions, PassSelection};
//! let text = "graph g\n  %ids = input.token_ids : u32[T]\n  output ids = %ids\n";
//! let opts = OptOptions { passes: "dce".parse()?, bisect: None };
//! let out = opt(text, "<example>", &opts, &mut ())?;
//! assert_eq!(gerbil_ir::print::print(&out.graph), text);
//! assert_eq!(out.passes.ran[0].rewrites, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The workflow of LLVM's `opt` and Cranelift's `clif-util`: parse the text
//! ([`gerbil_ir::parse()`], which type-checks every node and verifies the
//! graph), run the passes with the verifier after each, hand back the graph.
//! `--passes default` is the compiler's own pipeline, so
//! `gerbilc compile M --dump-ir lowered | gerbilc opt - --passes default`
//! prints what `gerbilc compile M --dump-ir final` prints.

use crate::driver::run_passes;
use crate::dump::Observer;
use crate::error::CompileError;
use gerbil_ir::Graph;
use gerbil_passes::manager::passes_named;
use gerbil_passes::{default_pipeline, PassManager, PassReport};
use std::str::FromStr;

/// Which passes to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PassSelection {
    /// The compiler's pipeline (`default`).
    Default,
    /// These passes, in this order (`a,b,c`).
    Named(Vec<String>),
}

impl FromStr for PassSelection {
    type Err = String;

    /// `default`, or pass names separated by commas.
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim() == "default" {
            return Ok(PassSelection::Default);
        }
        let names: Vec<String> = s.split(',').map(|n| n.trim().to_string()).collect();
        if names.iter().any(String::is_empty) {
            return Err(format!(
                "expected `default` or pass names separated by commas, got `{s}`"
            ));
        }
        Ok(PassSelection::Named(names))
    }
}

/// Settings of one `opt` run.
#[derive(Clone, Debug)]
pub struct OptOptions {
    /// The passes.
    pub passes: PassSelection,
    /// Run only the first `N` of them (`--bisect N`).
    pub bisect: Option<usize>,
}

/// What `opt` produced.
pub struct Optimized {
    /// The graph after the passes.
    pub graph: Graph,
    /// What the passes did.
    pub passes: PassReport,
}

/// Parses `text` (named `input` in errors; a pass file test's part before
/// `// expect:`), runs the selected passes on it with the verifier after
/// each, showing `observer` every step.
pub fn opt(
    text: &str,
    input: &str,
    opts: &OptOptions,
    observer: &mut dyn Observer,
) -> Result<Optimized, CompileError> {
    // A pass file test holds its expected output after `// expect:`; read
    // only the input, so `gerbilc opt CASE.gir --passes P` reproduces a test.
    let text = text
        .split_once("\n// expect:\n")
        .map_or(text, |(input, _)| input);
    let mut graph = gerbil_ir::parse(text).map_err(|source| CompileError::Parse {
        input: input.to_string(),
        source,
    })?;
    let passes = match &opts.passes {
        PassSelection::Default => default_pipeline(),
        PassSelection::Named(names) => passes_named(names)?,
    };
    let mut pm = PassManager::new(passes);
    if let Some(n) = opts.bisect {
        pm.bisect(n);
    }
    let report = run_passes(&pm, &mut graph, observer)?;
    Ok(Optimized {
        graph,
        passes: report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_lists_parse() {
        assert_eq!("default".parse(), Ok(PassSelection::Default));
        assert_eq!(
            "dce, fuse-qkv".parse(),
            Ok(PassSelection::Named(vec!["dce".into(), "fuse-qkv".into()]))
        );
        assert!("dce,,x".parse::<PassSelection>().is_err());
    }

    #[test]
    fn unknown_passes_and_bad_text_are_errors() {
        let text = "graph g\n  %ids = input.token_ids : u32[T]\n  output ids = %ids\n";
        let opts = |p: &str| OptOptions {
            passes: p.parse().unwrap(),
            bisect: None,
        };
        let e = opt(text, "x.gir", &opts("fuse-all"), &mut ())
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .starts_with("unknown pass `fuse-all`; passes are: dce,"),
            "{e}"
        );
        let e = opt(
            "graph g\n  %x = nope : u32[T]",
            "x.gir",
            &opts("dce"),
            &mut (),
        )
        .err()
        .unwrap();
        assert!(
            e.to_string()
                .starts_with("x.gir: line 2, column 8: unknown op `nope`"),
            "{e}"
        );
    }
}
