//! Helpers shared by the pass tests: the tiny family models, lowered.

#![allow(dead_code)]

use gerbil_frontend_hf::{lower, Checkpoint};
use gerbil_ir::Graph;
use std::path::{Path, PathBuf};

/// Directory of the tiny family checkpoints.
pub fn tiny_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/models/tiny")
}

/// Every tiny family model by directory name, sorted.
pub fn tiny_models() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(tiny_dir())
        .expect("tests/data/models/tiny")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("config.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 7, "tiny models: {names:?}");
    names
}

/// The graph the frontend lowers from a checkpoint directory.
pub fn lower_dir(dir: &Path) -> Graph {
    let ckpt = Checkpoint::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    lower(&ckpt)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .graph
}

/// The lowered graph of the tiny model `name` (e.g. `llama`).
pub fn tiny(name: &str) -> Graph {
    lower_dir(&tiny_dir().join(name))
}

/// SmolLM2-135M's checkpoint directory (`$GERBIL_FIXTURES/smollm2-135m`).
pub fn smollm2_dir() -> PathBuf {
    std::env::var_os("GERBIL_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"))
        .join("smollm2-135m")
}
