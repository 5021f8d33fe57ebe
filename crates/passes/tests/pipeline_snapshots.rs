//! The IR after each pass of the default pipeline, for the tiny Llama,
//! Qwen2 (biases) and Gemma 3 (`cargo insta review` to update). Each snapshot shows
//! what one pass matched and rewrote; the verifier runs after every pass.

use gerbil_frontend_hf::{lower, Checkpoint};
use gerbil_passes::{default_pipeline, PassManager};
use std::path::Path;

fn snapshots(model: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/models/tiny")
        .join(model);
    let ckpt = Checkpoint::open(&dir).unwrap();
    let mut graph = lower(&ckpt).unwrap().graph;
    let mut dumps = Vec::new();
    let report = PassManager::new(default_pipeline())
        .run(&mut graph, |name, g| {
            dumps.push((name.to_string(), gerbil_ir::print::print(g)))
        })
        .unwrap();
    // Every pass changes these graphs, except `dce` (the frontend emits no
    // dead nodes), the fusion of the activation a model lacks, and the bias
    // fusion where there are no biases (only Qwen2 has them).
    for (name, changed) in &report.ran {
        let expected = !matches!(
            (model, name.as_str()),
            (_, "dce")
                | ("llama" | "qwen2", "fuse-geglu")
                | ("gemma3", "fuse-swiglu")
                | ("llama" | "gemma3", "fuse-matmul-bias")
        );
        assert_eq!(*changed, expected, "{model}: {name}");
    }
    for (i, (name, text)) in dumps.into_iter().enumerate() {
        insta::assert_snapshot!(format!("{model}_{i:02}_{name}"), text);
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
