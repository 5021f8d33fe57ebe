//! The training graph (`gerbil_passes::training_passes`: `autodiff`, then
//! `dce`) of every tiny decoder, run on the CPU interpreter: its loss is
//! the cross-entropy of transformers' recorded logits, and every weight's
//! gradient matches central finite differences of that loss, in f64.
//! The training graph also prints and parses back unchanged, which covers
//! the text form of every backward op a decoder needs.
//!
//! No GPU is involved: this is the oracle the training kernels will be
//! checked against.

use gerbil_compiler::Checkpoint;
use gerbil_e2e::interpreter::{Interpreter, Tensor};
use gerbil_e2e::{interpreter_weights, tiny_model, tiny_ref};
use gerbil_frontend_hf::{lower_with, LowerOptions};
use gerbil_ir::{Graph, LOSS};
use gerbil_passes::{training_passes, Pass, PassManager};

/// Every tiny decoder (one per family, plus the bf16 Llama).
const TINY_MODELS: &[&str] = &[
    "llama",
    "llama_bf16",
    "qwen2",
    "qwen3",
    "mistral",
    "gemma3",
    "phi3",
];

/// The training graph of a tiny model, lowered for `context` tokens.
fn training_graph(ckpt: &Checkpoint, context: usize) -> Graph {
    let options = LowerOptions {
        max_context: Some(context as u64),
    };
    let mut graph = lower_with(ckpt, &options)
        .unwrap_or_else(|e| panic!("lowering: {e}"))
        .graph;
    PassManager::new(training_passes())
        .run(&mut graph, |_, _| {})
        .unwrap_or_else(|e| panic!("training passes: {e}"));
    graph
}

/// The same graph with the loss as its only output (what a finite
/// difference evaluates: no backward ops).
fn loss_only(training: &Graph) -> Graph {
    let mut graph = training.clone();
    graph.outputs.retain(|(name, _)| name == LOSS);
    gerbil_passes::dce::Dce
        .run(&mut graph)
        .unwrap_or_else(|e| panic!("dce: {e}"));
    graph
}

/// A 13-token prompt of the model's reference and its next-token split.
fn sequence(name: &str) -> (Vec<u32>, Vec<u32>, Vec<Vec<f32>>) {
    let reference = tiny_ref(name);
    let case = reference
        .cases
        .into_iter()
        .find(|c| c.logits.is_some())
        .expect("a case with every position's logits");
    let ids = case.input_ids;
    let logits = case.logits.expect("logits");
    let n = ids.len() - 1;
    (ids[..n].to_vec(), ids[1..].to_vec(), logits[..n].to_vec())
}

/// The mean cross-entropy of transformers' logits rows against `targets`.
fn reference_loss(logits: &[Vec<f32>], targets: &[u32]) -> f64 {
    let per_row = logits.iter().zip(targets).map(|(row, &t)| {
        let row: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        lse - row[t as usize]
    });
    per_row.sum::<f64>() / targets.len() as f64
}

fn loss_of(out: &[Tensor]) -> f64 {
    out[0].data[0]
}

/// `count` spread, seeded coordinates of `n` values.
fn coordinates(n: usize, count: usize, seed: usize) -> Vec<usize> {
    (0..count)
        .map(|i| (seed * 7919 + i * 104_729 + i * i * 31) % n)
        .collect()
}

#[test]
fn gradients_match_finite_differences_and_the_loss_transformers_logits_give() {
    let mut failures = Vec::new();
    for name in TINY_MODELS {
        let ckpt = Checkpoint::open(&tiny_model(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (tokens, targets, logits) = sequence(name);
        let graph = training_graph(&ckpt, tokens.len());
        let text = gerbil_ir::print::print(&graph);
        let reparsed = gerbil_ir::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            gerbil_ir::print::print(&reparsed),
            text,
            "{name}: the training graph's text does not round-trip"
        );

        let weights = interpreter_weights(&ckpt);
        let mut it = Interpreter::new(&graph, &weights, tokens.len())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let out = it
            .train_step(&tokens, &targets)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let loss = loss_of(&out);
        let want = reference_loss(&logits, &targets);
        if (loss - want).abs() > 1e-4 * want {
            failures.push(format!(
                "{name}: loss {loss}, transformers' logits give {want}"
            ));
        }

        let loss_graph = loss_only(&graph);
        let mut fd = Interpreter::new(&loss_graph, &weights, tokens.len())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut worst = 0.0f64;
        let grads = graph.outputs.iter().zip(&out).skip(1);
        for (seed, ((output, _), grad)) in grads.enumerate() {
            let label = output.strip_prefix("grad.").expect("a gradient output");
            for i in coordinates(grad.data.len(), 3, seed) {
                let eps = 1e-5;
                let mut at = |delta: f64| {
                    let w = fd.weight_mut(label).expect("the gradient's weight");
                    let saved = w[i];
                    w[i] += delta;
                    let out = fd.train_step(&tokens, &targets).expect("loss step");
                    fd.weight_mut(label).expect("weight")[i] = saved;
                    loss_of(&out)
                };
                let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
                let err = (numeric - grad.data[i]).abs() / numeric.abs().max(1e-3);
                worst = worst.max(err);
                if err > 1e-5 {
                    failures.push(format!(
                        "{name}: {output}[{i}] = {}, finite differences {numeric}",
                        grad.data[i]
                    ));
                }
            }
        }
        eprintln!(
            "{name:<11} loss {loss:.6} (transformers' logits {want:.6}); {} gradients, \
             worst relative error against finite differences {worst:.1e}",
            out.len() - 1
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_training_graph_needs_one_target_per_token() {
    let ckpt = Checkpoint::open(&tiny_model("llama")).unwrap_or_else(|e| panic!("{e}"));
    let graph = training_graph(&ckpt, 4);
    let weights = interpreter_weights(&ckpt);
    let mut it = Interpreter::new(&graph, &weights, 4).unwrap_or_else(|e| panic!("{e}"));
    let err = it.step(&[1, 2]).expect_err("no targets").to_string();
    assert!(err.contains("run it with train_step"), "{err}");
    let err = it.train_step(&[1, 2], &[3]).expect_err("short").to_string();
    assert!(err.contains("1 targets for 2 tokens"), "{err}");
    assert!(it.train_step(&[1, 2], &[2, 3]).is_ok());
}

#[test]
fn codegen_refuses_a_training_graph() {
    let ckpt = Checkpoint::open(&tiny_model("llama")).unwrap_or_else(|e| panic!("{e}"));
    let graph = training_graph(&ckpt, 4);
    let opts = gerbil_codegen_wgsl::CodegenOptions::default();
    let err = match gerbil_codegen_wgsl::generate(&graph, &opts) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a training graph was compiled to a plan"),
    };
    assert!(err.contains("next-token targets"), "{err}");
}
