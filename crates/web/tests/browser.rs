//! The runtime's tiny-model checks in a browser: each family's tiny plan,
//! embedded in the test, runs on the page's WebGPU (headless Chromium's
//! SwiftShader in `scripts/web-test.sh`), and gives the transformers
//! reference's last logits within 1e-3 and its greedy tokens, as the native
//! tests (`tests/e2e/models.rs`) check on Vulkan — through both variants of
//! the plan: `portable` (what a browser on a GPU runs) for every family, and
//! `cpu` (what SwiftShader, a CPU adapter, runs by default) for each family
//! of kernels of its own, so the browser's shader compiler sees every kernel
//! a page can run.
//!
//! Run by `scripts/web-test.sh` through `wasm-bindgen-test-runner`, which
//! compiles the plans first into `GERBIL_WEB_TEST_PLANS`; the file is empty
//! on every other target. The surprise: the plans reach the test by
//! `include_bytes!` — a wasm test has no file system, and the runner's
//! server serves only the test itself — so the test crate is built after
//! the plans, and a plan changed by the compiler needs that rebuild.
#![cfg(target_arch = "wasm32")]

use gerbil_plan::PlanFile;
use gerbil_runtime::{argmax, Session, SessionOptions};
use serde::Deserialize;
use wasm_bindgen_test::{wasm_bindgen_test, wasm_bindgen_test_configure};

wasm_bindgen_test_configure!(run_in_browser);

/// Largest difference from a reference logit, as the native f32 checks.
const TOL: f32 = 1e-3;

/// A family's tiny plan and its transformers reference.
struct Tiny {
    name: &'static str,
    plan: &'static [u8],
    reference: &'static str,
}

macro_rules! tiny {
    ($name:literal) => {
        Tiny {
            name: $name,
            plan: include_bytes!(concat!(env!("GERBIL_WEB_TEST_PLANS"), "/", $name, ".plan")),
            reference: include_str!(concat!("../../../tests/data/refs/tiny/", $name, ".json")),
        }
    };
}

/// Every family's tiny model (the bf16 Llama too).
const TINY: [Tiny; 7] = [
    tiny!("llama"),
    tiny!("llama_bf16"),
    tiny!("mistral"),
    tiny!("qwen2"),
    tiny!("qwen3"),
    tiny!("phi3"),
    tiny!("gemma3"),
];

/// The parts of a reference this test reads.
#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    input_ids: Vec<u32>,
    last_logits: Vec<f32>,
    greedy_ids: Vec<u32>,
}

/// Checks one reference case on `session`: the prompt's last logits, then
/// the greedy tokens one decode step at a time.
async fn check(session: &mut Session, case: &Case) -> Result<(), String> {
    let err = |e: gerbil_runtime::RuntimeError| e.to_string();
    session.reset();
    let logits = session.forward(&case.input_ids).await.map_err(err)?;
    if logits.len() != case.last_logits.len() {
        return Err(format!(
            "{} logits, reference {}",
            logits.len(),
            case.last_logits.len()
        ));
    }
    // The first NaN difference wins the fold (`!(d <= max)`), so a NaN
    // logit fails the check.
    let (at, diff) = logits
        .iter()
        .zip(&case.last_logits)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold((0, 0.0f32), |m, (i, d)| {
            if m.1.is_nan() || d <= m.1 {
                m
            } else {
                (i, d)
            }
        });
    if diff.is_nan() || diff > TOL {
        return Err(format!("last logits differ by {diff} at token {at}"));
    }
    let mut tokens = Vec::new();
    let mut next = argmax(&logits);
    for _ in 0..case.greedy_ids.len() {
        tokens.push(next);
        next = argmax(&session.forward(&[next]).await.map_err(err)?);
    }
    if tokens != case.greedy_ids {
        return Err(format!(
            "greedy {tokens:?}, reference {:?}",
            case.greedy_ids
        ));
    }
    Ok(())
}

#[wasm_bindgen_test]
async fn tiny_models_match_transformers_in_the_browser() {
    let mut failures = Vec::new();
    let mut total = 0;
    for tiny in &TINY {
        let reference: Reference = serde_json::from_str(tiny.reference).expect("reference");
        let plan = PlanFile::from_bytes(format!("{}.plan", tiny.name), tiny.plan.to_vec())
            .expect("the embedded plan opens");
        // `cpu` on the Llama and the families whose kernels differ from its
        // own (bf16 weights, biases, q/k norms, Gemma's windows and
        // softcaps): Phi-3 runs the Llama's graph, and Mistral's only
        // difference, a sliding window, is Gemma 3's too, so their `cpu`
        // sessions compiled the same kernel forms again.
        let variants: &[&str] = if ["mistral", "phi3"].contains(&tiny.name) {
            &["portable"]
        } else {
            &["cpu", "portable"]
        };
        for &variant in variants {
            let opts = SessionOptions {
                variant: Some(variant.to_string()),
                ..SessionOptions::default()
            };
            let mut session = Session::open(&plan, &opts)
                .await
                .unwrap_or_else(|e| panic!("{} ({variant}): {e}", tiny.name));
            for case in &reference.cases {
                total += 1;
                if let Err(e) = check(&mut session, case).await {
                    failures.push(format!("{}/{} ({variant}): {e}", tiny.name, case.name));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {total} cases failed:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

/// A plan's self-tests (the reference `gerbilc` computed on the CPU) in the
/// browser: every variant SwiftShader runs passes (`cpu`, which a browser's
/// fallback adapter runs, and `portable`), none fails. On Gemma 3's plan,
/// the family of the most kernels: the self-test's path through the page is
/// what this checks, [`tiny_models_match_transformers_in_the_browser`] the
/// kernels of every family (self-testing each plan again took a minute of
/// SwiftShader's compiler).
#[wasm_bindgen_test]
async fn tiny_plans_pass_their_self_tests_in_the_browser() {
    let mut failures = Vec::new();
    for tiny in TINY.iter().filter(|t| t.name == "gemma3") {
        let plan = PlanFile::from_bytes(format!("{}.plan", tiny.name), tiny.plan.to_vec())
            .expect("the embedded plan opens");
        let report = gerbil_runtime::selftest::run(&plan, &SessionOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", tiny.name));
        for v in &report.variants {
            use gerbil_runtime::selftest::Status;
            let want_pass = ["cpu", "portable"].contains(&v.name.as_str());
            let bad = v.status == Status::Failed || (want_pass && v.status != Status::Passed);
            if bad {
                failures.push(format!("{} {}: {v:?}", tiny.name, v.name));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
