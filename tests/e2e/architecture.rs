//! The crate graph against its picture: `docs/architecture.md` lists, between
//! `crate-deps` markers, every workspace crate and the workspace crates it
//! depends on; this test reads `cargo metadata` and fails when a crate gains
//! or loses an arrow the document does not show (so the picture cannot go
//! stale silently), and when an arrow breaks one of the rules the document
//! states: nothing depends on the command-line crate, and the compile half
//! never depends on the GPU runtime.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The workspace root (this crate lives in `tests/`).
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("root")
}

/// Each workspace crate and the workspace crates it depends on (normal
/// dependencies, every target platform) or, with `dev`, on in its tests.
fn metadata(dev: bool) -> Graph {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let packages = json["packages"].as_array().expect("packages");
    let names: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().expect("name").to_string())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].is_null() || (dev && d["kind"] == "dev"))
                .map(|d| d["name"].as_str().expect("name").to_string())
                .filter(|n| names.contains(n))
                .collect();
            (p["name"].as_str().expect("name").to_string(), deps)
        })
        .collect()
}

/// The table between the `crate-deps` markers of docs/architecture.md:
/// `| crate | depends on |`, names in backticks, `—` for none.
fn documented() -> Graph {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).expect("the doc");
    let start = doc.find("<!-- crate-deps:start -->").expect("start marker");
    let end = doc.find("<!-- crate-deps:end -->").expect("end marker");
    let names = |cell: &str| -> BTreeSet<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    doc[start..end]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').collect();
            let krate = names(cells[1]).into_iter().next().expect("a crate");
            (krate, names(cells[2]))
        })
        .collect()
}

#[test]
fn the_crate_graph_is_the_one_docs_architecture_shows() {
    let actual = metadata(false);
    let documented = documented();
    let mut wrong = Vec::new();
    for krate in actual
        .keys()
        .chain(documented.keys())
        .collect::<BTreeSet<_>>()
    {
        let (a, d) = (actual.get(krate), documented.get(krate));
        if a != d {
            wrong.push(format!("{krate}: cargo says {a:?}, the doc says {d:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/architecture.md's crate table is stale; fix the dependency or the table:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn nothing_depends_on_the_command_line_crate() {
    for (krate, deps) in metadata(true) {
        assert!(
            !deps.contains("gerbil-cli"),
            "{krate} depends on gerbil-cli: move what it needs into a library crate"
        );
    }
}

#[test]
fn the_compile_half_never_depends_on_the_gpu_runtime() {
    let graph = metadata(false);
    let gpu = ["gerbil-runtime", "gerbil", "gerbil-serve", "gerbil-tune"];
    let compile_half = [
        "gerbil-ir",
        "gerbil-frontend-hf",
        "gerbil-passes",
        "gerbil-codegen-wgsl",
        "gerbil-plan",
        "gerbil-text",
        "gerbil-compiler",
        "gerbil-hub",
    ];
    for krate in compile_half {
        let mut seen = BTreeSet::new();
        let mut todo = vec![krate.to_string()];
        while let Some(k) = todo.pop() {
            for d in graph.get(&k).into_iter().flatten() {
                assert!(
                    !gpu.contains(&d.as_str()),
                    "{krate} reaches {d} (through {k}): the compiler must build without wgpu"
                );
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
    }
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir)
        .expect("a source directory")
        .flatten()
    {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Library crates take typed options: only the binaries (`crates/cli`) read
/// environment variables and map them onto those options. Unit tests (from
/// a file's first `#[cfg(...test...)]` on, and `tests.rs` files) may read them.
#[test]
fn no_library_crate_reads_the_environment() {
    let mut offenders = Vec::new();
    for krate in std::fs::read_dir(root().join("crates"))
        .expect("crates/")
        .flatten()
    {
        if krate.file_name() == "cli" {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&krate.path().join("src"), &mut files);
        for file in files.iter().filter(|f| !f.ends_with("tests.rs")) {
            let text = std::fs::read_to_string(file).expect("a source file");
            for (n, line) in text.lines().enumerate() {
                let line = line.trim_start();
                if line.starts_with("#[cfg(") && line.contains("test") {
                    break; // the unit tests, to the end of the file
                }
                if line.starts_with("//") {
                    continue;
                }
                if line.contains("std::env") || line.contains("env::var") {
                    let shown = file.strip_prefix(root()).unwrap_or(file).display();
                    offenders.push(format!("{shown}:{}: {line}", n + 1));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "library code reads the environment; take a typed option and let the binary map the \
         variable onto it (crates/cli/src/env.rs):\n{}",
        offenders.join("\n")
    );
}

/// Every workspace source file's text, and the relative paths of all files.
fn sources() -> (String, Vec<String>) {
    let mut files = Vec::new();
    for dir in ["crates", "tests", "scripts", "docs", "fuzz"] {
        walk(&root().join(dir), &mut files);
    }
    let mut code = String::new();
    let mut names = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(root()).unwrap_or(f).display().to_string();
        if rel.ends_with(".rs") {
            code.push_str(&std::fs::read_to_string(f).unwrap_or_default());
        }
        names.push(rel);
    }
    (code, names)
}

/// Every file under `dir` (not `target/` or hidden ones).
fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name == "target" || name == "corpus" {
            continue;
        }
        if path.is_dir() {
            walk(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// The names `code` defines as a function (`fn name`), a module (`mod name`)
/// or a public field (`pub name:`).
fn defined_names(code: &str) -> std::collections::HashSet<&str> {
    let ident_end = |s: &str| {
        s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len())
    };
    let mut names = std::collections::HashSet::new();
    for keyword in ["fn ", "mod ", "pub "] {
        for (at, _) in code.match_indices(keyword) {
            let rest = &code[at + keyword.len()..];
            let name = &rest[..ident_end(rest)];
            let field = rest[name.len()..].starts_with(':');
            if !name.is_empty() && (keyword != "pub " || field) {
                names.insert(name);
            }
        }
    }
    names
}

/// The files and functions `docs/architecture.md` names in backticks exist:
/// a path (`crates/runtime/src/session.rs`, `tests/e2e/models.rs`) as that file
/// or directory, a bare file name (`session.rs`) as some file of that name,
/// and a function (`Session::truncate`, `default_pipeline()`) as an `fn` of
/// that name somewhere in the workspace.
#[test]
fn every_file_and_function_docs_architecture_names_exists() {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).expect("the doc");
    let (code, files) = sources();
    let defined = defined_names(&code);
    let is_ident = |s: &str| {
        !s.is_empty()
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !s.starts_with(|c: char| c.is_ascii_digit())
    };
    // Paths into other crates' APIs are theirs to keep.
    let external = [
        "std",
        "wgpu",
        "pollster",
        "naga",
        "tokio",
        "axum",
        "serde",
        "minijinja",
        "hf_hub",
        "futures",
        "rustix",
        "tokenizers",
        "petgraph",
        "safetensors",
    ];
    let mut missing = Vec::new();
    for (i, token) in doc.split('`').enumerate() {
        if i % 2 == 0 || token.contains(' ') {
            continue;
        }
        let file_like = [".rs", ".md", ".sh", ".py", ".json", ".gir"]
            .iter()
            .any(|e| token.ends_with(e));
        if token.contains('/') && (file_like || token.ends_with('/')) && !token.contains('{') {
            let path = token.trim_end_matches('/');
            let exists = path.is_empty()
                || root().join(path).exists()
                || files.iter().any(|f| f.ends_with(&format!("/{path}")))
                || files.iter().any(|f| f.contains(&format!("/{path}/")));
            if !exists && !path.contains('*') && !path.contains("<") {
                missing.push(format!("file `{token}`"));
            }
        } else if file_like && !token.contains('/') && token.ends_with(".rs") {
            if !files.iter().any(|f| f.ends_with(&format!("/{token}"))) {
                missing.push(format!("file `{token}`"));
            }
        } else {
            let call = token.strip_suffix("()").unwrap_or(token);
            let first = call.split("::").next().unwrap_or(call);
            let last = call.rsplit("::").next().unwrap_or(call);
            let snake = is_ident(last) && !last.contains(|c: char| c.is_ascii_uppercase());
            let named = (call.contains("::") || token.ends_with("()")) && snake;
            // A function, a field (`SessionOptions::progress`) or a module
            // (`runtime::residency`) of that name.
            let found =
                defined.contains(last) || files.iter().any(|f| f.ends_with(&format!("/{last}.rs")));
            if named && !external.contains(&first) && !found {
                missing.push(format!("function `{token}`"));
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names what the code does not have; update the doc:\n{}",
        missing.join("\n")
    );
}
