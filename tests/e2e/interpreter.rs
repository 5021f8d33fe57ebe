//! The CPU interpreter (`gerbil_e2e::interpreter`) is itself right: on every
//! tiny model of `tests/data/models/tiny` it reproduces transformers'
//! recorded logits — every position of a 13-token prefill, the same
//! positions fed one token at a time through the decode path, a chunked
//! prefill — and its greedy tokens, running the graph as lowered (no pass).
//! And the default pipeline's graph interprets to the same logits.
//!
//! No GPU is involved; this is what makes the interpreter a trustworthy
//! oracle for the pass-equivalence tests.

use gerbil_compiler::Checkpoint;
use gerbil_e2e::interpreter::{Interpreter, Tensor};
use gerbil_e2e::{interpreter_weights, tiny_model, tiny_ref, TinyCase, TINY_DECODERS};
use gerbil_frontend_hf::{lower_with, LowerOptions};
use gerbil_ir::Graph;
use gerbil_passes::{default_pipeline, PassManager};

/// KV-cache capacity of the runs (13 prompt tokens and 8 greedy ones fit).
const MAX_CONTEXT: usize = 32;
/// Largest accepted |Δ| against transformers' f32 logits (the GPU tests'
/// tolerance; the f64 interpreter stays far below it).
const TINY_TOL: f64 = 1e-3;

fn lowered(ckpt: &Checkpoint) -> Graph {
    let options = LowerOptions {
        max_context: Some(MAX_CONTEXT as u64),
    };
    lower_with(ckpt, &options)
        .unwrap_or_else(|e| panic!("lowering: {e}"))
        .graph
}

/// The logits output of one step.
fn logits(it: &mut Interpreter<'_>, tokens: &[u32]) -> Tensor {
    it.step(tokens)
        .unwrap_or_else(|e| panic!("interpreter: {e}"))
        .remove(0)
}

fn max_abs_diff(got: &[f64], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "vocabulary sizes differ");
    got.iter()
        .zip(want)
        .map(|(g, &w)| (g - f64::from(w)).abs())
        .fold(0.0, f64::max)
}

fn argmax(v: &[f64]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Checks one reference case; returns the largest |Δ| seen.
fn check_case(it: &mut Interpreter<'_>, case: &TinyCase) -> Result<f64, String> {
    let ids = &case.input_ids;
    let mut worst = 0.0f64;
    let mut compare = |what: String, got: &[f64], want: &[f32]| {
        let d = max_abs_diff(got, want);
        worst = worst.max(d);
        if d > TINY_TOL {
            Err(format!("{what}: logits differ by {d:.3e}"))
        } else {
            Ok(())
        }
    };

    // One prefill: every position's row.
    it.reset();
    let all = logits(it, ids);
    compare(
        "prefill, last position".into(),
        all.last_row(),
        &case.last_logits,
    )?;
    if let Some(rows) = &case.logits {
        for (pos, want) in rows.iter().enumerate() {
            compare(format!("prefill, position {pos}"), all.row(pos), want)?;
        }
        // One token at a time (the decode path, P = 0..T-1).
        it.reset();
        for (pos, (&id, want)) in ids.iter().zip(rows).enumerate() {
            compare(
                format!("decode, position {pos}"),
                logits(it, &[id]).row(0),
                want,
            )?;
        }
        // Chunks of 5, at P = 0, 5, 10.
        it.reset();
        let mut pos = 0;
        for chunk in ids.chunks(5) {
            let got = logits(it, chunk);
            for r in 0..chunk.len() {
                compare(format!("chunked, position {pos}"), got.row(r), &rows[pos])?;
                pos += 1;
            }
        }
    }

    // Greedy continuation.
    it.reset();
    let mut last = logits(it, ids).last_row().to_vec();
    let mut greedy = Vec::new();
    for _ in 0..case.greedy_ids.len() {
        let next = argmax(&last);
        greedy.push(next);
        last = logits(it, &[next]).row(0).to_vec();
    }
    if greedy != case.greedy_ids {
        return Err(format!(
            "greedy tokens {greedy:?}, transformers {:?}",
            case.greedy_ids
        ));
    }
    Ok(worst)
}

#[test]
fn interpreter_matches_transformers() {
    let mut failures = Vec::new();
    for name in TINY_DECODERS {
        let ckpt = Checkpoint::open(&tiny_model(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let graph = lowered(&ckpt);
        let mut it = Interpreter::new(&graph, &interpreter_weights(&ckpt), MAX_CONTEXT)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let reference = tiny_ref(name);
        let mut worst = 0.0f64;
        for case in &reference.cases {
            match check_case(&mut it, case) {
                Ok(d) => worst = worst.max(d),
                Err(e) => failures.push(format!("  {name} {}: {e}", case.name)),
            }
        }
        eprintln!("{name:<11} interpreter vs transformers: max |Δ| {worst:.2e}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn optimized_graphs_interpret_like_lowered_ones() {
    for name in TINY_DECODERS {
        let ckpt = Checkpoint::open(&tiny_model(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let graph = lowered(&ckpt);
        let mut fused = graph.clone();
        PassManager::new(default_pipeline())
            .run(&mut fused, |_, _| {})
            .unwrap_or_else(|e| panic!("{name}: passes: {e}"));
        let reference = tiny_ref(name);
        let longest = reference.cases.iter().map(|c| &c.input_ids);
        let ids = longest.max_by_key(|ids| ids.len()).expect("a case");
        let run = |g: &Graph| {
            let mut it = Interpreter::new(g, &interpreter_weights(&ckpt), MAX_CONTEXT)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut out: Vec<Vec<f64>> = ids
                .chunks(4)
                .map(|c| logits(&mut it, c).last_row().to_vec())
                .collect();
            out.push(logits(&mut it, &[7]).last_row().to_vec());
            out
        };
        let (want, got) = (run(&graph), run(&fused));
        for (step, (a, b)) in got.iter().zip(&want).enumerate() {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-10 * y.abs().max(1.0),
                    "{name}: step {step} logit {i}: optimized {x}, lowered {y}"
                );
            }
        }
    }
}
