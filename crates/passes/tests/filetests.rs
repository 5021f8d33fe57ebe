//! Pass file tests: every `.gir` file under `tests/filetests/<pass>/` is an
//! input graph, the passes to run on it and the expected output.
//!
//! ```text
//! // passes: fuse-qkv
//! // What the case shows (any comment lines).
//! graph g
//!   …input…
//! // expect:
//! // fuse-qkv: 1 rewrite
//! graph g
//!   …the graph after the passes…
//! ```
//!
//! The harness parses the input (`//` lines are comments to the parser),
//! runs the named passes with the verifier after each, and compares the
//! rewrite counts and the printed graph with everything after `// expect:`.
//! `GERBIL_BLESS=1 cargo test -p gerbil-passes --test filetests` rewrites the
//! expected part instead (review the diff). Every pass of the default
//! pipeline must have a directory holding a case where it fires and one where
//! it must not (0 rewrites), so a new pass comes with its own files and
//! changes nobody else's.

use gerbil_ir::{parse, print::print};
use gerbil_passes::manager::passes_named;
use gerbil_passes::{default_pipeline, PassManager};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const EXPECT: &str = "// expect:";

/// A file test, split into its parts.
struct Case {
    passes: Vec<String>,
    input: String,
    expected: Option<String>,
}

fn split(text: &str) -> Result<Case, String> {
    let header = text.lines().next().unwrap_or_default();
    let Some(list) = header.strip_prefix("// passes:") else {
        return Err("the first line must be `// passes: NAME[, NAME…]`".into());
    };
    let passes: Vec<String> = list.split(',').map(|p| p.trim().to_string()).collect();
    if passes.iter().any(String::is_empty) {
        return Err(format!("empty pass name in `{header}`"));
    }
    let (input, expected) = match text.find(&format!("\n{EXPECT}\n")) {
        Some(i) => (&text[..=i], Some(text[i + EXPECT.len() + 2..].to_string())),
        None => (text, None),
    };
    Ok(Case {
        passes,
        input: input.to_string(),
        expected,
    })
}

/// The rewrite counts and the printed graph after running the case.
fn run(case: &Case) -> Result<(String, Vec<(String, usize)>), String> {
    let mut graph = parse(&case.input).map_err(|e| format!("input: {e}"))?;
    let pm = PassManager::new(passes_named(&case.passes).map_err(|e| e.to_string())?);
    let mut out = String::new();
    let mut counts = Vec::new();
    let report = pm.run(&mut graph, |_, _| {}).map_err(|e| e.to_string())?;
    for r in report.ran {
        let s = if r.rewrites == 1 { "" } else { "s" };
        out.push_str(&format!("// {}: {} rewrite{s}\n", r.name, r.rewrites));
        counts.push((r.name, r.rewrites));
    }
    out.push_str(&print(&graph));
    Ok((out, counts))
}

fn gir_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn pass_file_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests");
    let bless = std::env::var_os("GERBIL_BLESS").is_some_and(|v| v == "1");
    let mut failures = Vec::new();
    // Per directory (pass): whether some case fired it and some did not.
    let mut coverage: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    for path in gir_files(&root) {
        let rel = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .display()
            .to_string();
        if path.extension().and_then(|e| e.to_str()) != Some("gir") {
            failures.push(format!("{rel}: not a .gir file (file tests end in .gir)"));
            continue;
        }
        let dir = path
            .parent()
            .and_then(|d| d.file_name())
            .map(|d| d.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&path).unwrap();
        let result = split(&text).and_then(|case| {
            if !case.passes.contains(&dir) {
                return Err(format!("a file under {dir}/ must run `{dir}`"));
            }
            let (got, counts) = run(&case)?;
            Ok((case, got, counts))
        });
        let (case, got, counts) = match result {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{rel}: {e}"));
                continue;
            }
        };
        for (name, n) in counts.iter().filter(|(name, _)| *name == dir) {
            let c = coverage.entry(name.clone()).or_default();
            c.0 |= *n > 0;
            c.1 |= *n == 0;
        }
        if bless {
            std::fs::write(&path, format!("{}{EXPECT}\n{got}", case.input)).unwrap();
        } else if case.expected.as_deref() != Some(got.as_str()) {
            failures.push(format!(
                "{rel}: output differs (GERBIL_BLESS=1 to accept):\n--- expected\n{}\n--- got\n{got}",
                case.expected.as_deref().unwrap_or("(no `// expect:` section)")
            ));
        }
    }
    for pass in default_pipeline() {
        match coverage.get(pass.name()) {
            Some((true, true)) => {}
            c => failures.push(format!(
                "filetests/{}/ needs a case where the pass fires and one where it must not \
                 (fires: {}, must-not-fire: {})",
                pass.name(),
                c.is_some_and(|c| c.0),
                c.is_some_and(|c| c.1)
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
