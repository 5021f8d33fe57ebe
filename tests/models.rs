//! Model families against HF transformers reference outputs: the tiny
//! random-weight models (every recorded logit, greedy continuations) and the
//! real SmolLM2-135M-Instruct (teacher-forced top-10 logits, greedy tokens,
//! tokenizer).

use gerbil_e2e::*;
use gerbil_plan::PlanFile;
use gerbil_runtime::{argmax, Session};

/// Tolerance on tiny-model logits in f32 compute (shared/models/README.md).
const TINY_TOL: f32 = 1e-3;
/// Tolerance on real-model top-10 logits in f32 compute.
const REAL_TOL: f32 = 2e-2;

/// Checks one tiny model against its reference: for each case, the last
/// logits after a prefill, the logits of every position fed one token at a
/// time through the decode path, and 8 greedy tokens.
fn check_tiny(name: &str, max_tokens_per_step: u64) {
    check_tiny_with(name, &format!("chunk {max_tokens_per_step}"), |o| {
        o.max_tokens_per_step = max_tokens_per_step
    });
}

/// [`check_tiny`] with compile options adjusted by `tweak` (`variant` names them).
fn check_tiny_with(
    name: &str,
    variant: &str,
    tweak: impl FnOnce(&mut gerbil_cli::compile::CompileOptions),
) {
    let reference = tiny_ref(name);
    let plan_path = compile_plan(&tiny_model(name), tweak);
    let plan = PlanFile::open(&plan_path).expect("open plan");
    let _gpu = gpu_lock();
    let mut session = Session::new(&plan).expect("session");
    for case in &reference.cases {
        let what = format!("{name}/{} ({variant})", case.name);
        session.reset();
        let last = session.forward(&case.input_ids).expect("prefill");
        let d = max_abs_diff(&last, &case.last_logits);
        assert!(d <= TINY_TOL, "{what}: last logits differ by {d}");

        if let Some(all) = &case.logits {
            session.reset();
            for (pos, (&id, want)) in case.input_ids.iter().zip(all).enumerate() {
                let got = session.forward(&[id]).expect("decode");
                let d = max_abs_diff(&got, want);
                assert!(
                    d <= TINY_TOL,
                    "{what}: position {pos} logits differ by {d} (token-by-token)"
                );
            }
        }

        session.reset();
        let mut logits = session.forward(&case.input_ids).expect("prefill");
        let mut greedy = Vec::new();
        for _ in 0..case.greedy_ids.len() {
            let next = argmax(&logits);
            greedy.push(next);
            logits = session.forward(&[next]).expect("decode");
        }
        assert_eq!(greedy, case.greedy_ids, "{what}: greedy tokens");
    }
}

#[test]
fn tiny_llama_matches_transformers() {
    check_tiny("llama", 256);
}

#[test]
fn tiny_llama_bf16_checkpoint_matches_transformers() {
    check_tiny("llama_bf16", 256);
}

#[test]
fn chunked_prefill_matches_transformers() {
    // 13 prompt tokens in chunks of 4, 4, 4, 1.
    check_tiny("llama", 4);
}

#[test]
fn every_optional_pass_can_be_disabled() {
    for pass in ["dce", "slice-last-row"] {
        check_tiny_with("llama", &format!("without {pass}"), |o| {
            o.disabled_passes = vec![pass.to_string()];
            o.max_tokens_per_step = 8;
        });
    }
}

#[test]
fn weights_larger_than_a_binding_are_sharded() {
    // The tied 512×64 f32 embedding is 128 KiB; 48 KiB bindings hold 192
    // rows, so it becomes 3 shards (192, 192, 128 rows) that both the
    // embedding lookup and the LM head read.
    check_tiny_with("llama", "48 KiB bindings", |o| {
        o.max_storage_binding = Some(48 << 10);
        o.max_tokens_per_step = 16;
        o.max_context = Some(64);
    });
}

/// SmolLM2-135M-Instruct: for every reference prompt, the plan's tokenizer
/// reproduces the prompt ids; teacher-forced over the 32 reference tokens,
/// every step's top-10 reference logits are within 2e-2 and the argmax is the
/// reference token — so free-running greedy decoding reproduces all 32.
#[test]
fn smollm2_matches_transformers() {
    let reference = real_ref("smollm2-135m");
    let plan_path = compile_plan(&fixture("smollm2-135m"), |o| o.max_context = Some(256));
    let plan = PlanFile::open(&plan_path).expect("open plan");
    let codec = gerbil_cli::run::codec(&plan)
        .expect("codec")
        .expect("tokenizer in plan");
    let _gpu = gpu_lock();
    let mut session = Session::new(&plan).expect("session");
    for p in &reference.prompts {
        let ids = match p.kind.as_str() {
            "chat" => {
                let messages: Vec<gerbil_runtime::text::ChatMessage> = p
                    .messages
                    .as_ref()
                    .expect("chat messages")
                    .iter()
                    .map(|m| serde_json::from_value(m.clone()).expect("message"))
                    .collect();
                codec.encode_chat(&messages, true).expect("chat template")
            }
            _ => codec
                .encode_plain(&p.text, p.add_special_tokens)
                .expect("encode"),
        };
        assert_eq!(ids, p.input_ids, "{}: prompt ids", p.id);

        session.reset();
        let mut logits = session.forward(&p.input_ids).expect("prefill");
        let mut worst = 0f32;
        for (step, (&want, top)) in p.greedy_ids.iter().zip(&p.top10).enumerate() {
            for &(id, l) in top {
                let d = (logits[id as usize] - l).abs();
                worst = worst.max(d);
                assert!(
                    d <= REAL_TOL,
                    "{}: step {step} logit of {id} is {} (reference {l})",
                    p.id,
                    logits[id as usize]
                );
            }
            assert_eq!(
                argmax(&logits),
                want,
                "{}: step {step} argmax (margin {})",
                p.id,
                p.greedy_margins[step]
            );
            if step + 1 < p.greedy_ids.len() {
                logits = session.forward(&[want]).expect("decode");
            }
        }
        eprintln!(
            "{}: 32/32 tokens, max |Δlogit| over top-10 = {worst:.2e}",
            p.id
        );
    }
}
