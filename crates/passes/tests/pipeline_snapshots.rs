//! The IR after each pass of the default pipeline, for the tiny Llama,
//! Qwen2 (biases) and Gemma 3, as insta snapshots named by model and pass
//! (`pipeline_snapshots__llama_fuse-qkv.snap`), so inserting a pass adds
//! files and renames none. `INSTA_UPDATE=always` (or `cargo insta review`)
//! updates them; a snapshot file that no test writes any more fails
//! [`no_unreferenced_snapshots`]. The verifier runs after every pass. The
//! per-pass cases, including where a pass must not fire, are the `.gir`
//! file tests (`filetests.rs`).

mod common;

use gerbil_passes::{default_pipeline, PassManager};
use std::collections::BTreeSet;
use std::path::Path;

/// The models snapshotted here.
const MODELS: &[&str] = &["llama", "qwen2", "gemma3"];

/// The snapshot file of `model` after `pass`.
fn snapshot_file(model: &str, pass: &str) -> String {
    format!("pipeline_snapshots__{model}_{pass}.snap")
}

fn snapshots(model: &str) {
    let mut graph = common::tiny(model);
    let mut dumps = Vec::new();
    let report = PassManager::new(default_pipeline())
        .run(&mut graph, |run, g| {
            dumps.push((run.name.clone(), gerbil_ir::print::print(g)))
        })
        .unwrap();
    // Every pass changes these graphs, except `dce` (the frontend emits no
    // dead nodes), the fusion of the activation a model lacks, the bias
    // fusion where there are no biases (only Qwen2 has them), the activation
    // fusion (the decoders' activations are all gated), the residual
    // fusion and the last-row fusion in Gemma 3 (its residual adds read
    // post-norms, not matmuls, so its final norm stays with the last add),
    // and the residual-norm fusion in the Llama family (the norms and adds
    // all went into matmuls, the final ones too), which has no post-norms
    // for the norm-add fusion either.
    for run in &report.ran {
        let expected = !matches!(
            (model, run.name.as_str()),
            (_, "dce" | "fuse-matmul-act")
                | ("llama" | "qwen2", "fuse-geglu")
                | ("gemma3", "fuse-swiglu")
                | ("llama" | "gemma3", "fuse-matmul-bias")
                | ("gemma3", "fuse-matmul-residual" | "fuse-last-row-matmul")
                | ("llama" | "qwen2", "fuse-residual-norm" | "fuse-norm-add")
        );
        assert_eq!(run.changed(), expected, "{model}: {}", run.name);
    }
    for (name, text) in dumps {
        insta::assert_snapshot!(format!("{model}_{name}"), text);
    }
}

#[test]
fn tiny_llama_after_each_pass() {
    snapshots("llama");
}

#[test]
fn tiny_qwen2_after_each_pass() {
    snapshots("qwen2");
}

#[test]
fn tiny_gemma3_after_each_pass() {
    snapshots("gemma3");
}

/// insta's own check for orphaned snapshots needs `cargo insta`, which CI
/// lacks; this one needs nothing.
#[test]
fn no_unreferenced_snapshots() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots");
    let expected: BTreeSet<String> = MODELS
        .iter()
        .flat_map(|m| {
            default_pipeline()
                .iter()
                .map(|p| snapshot_file(m, p.name()))
                .collect::<Vec<_>>()
        })
        .collect();
    let stale: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !expected.contains(name))
        .collect();
    assert!(
        stale.is_empty(),
        "{} holds files no test writes; delete them (or add the test that writes them): {stale:?}",
        dir.display()
    );
}
