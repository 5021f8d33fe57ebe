//! Batch steps (`gerbilc compile --max-batch`): sequences in different
//! KV-cache slots, at different positions, decoded together in one step give
//! every row the logits that sequence gets decoded alone — for every tiny
//! family (GQA, sliding windows, q/k norms, partial rotary, biases), in any
//! row order, with rows of several steps in a row. Also when a session
//! creates its pipelines, and its prompts on a prefill fallback.

use gerbil_e2e::*;
use gerbil_plan::PlanFile;
use gerbil_runtime::{argmax, PrefillFallback, RuntimeError, Session, SessionOptions};
use pollster::block_on;

/// The largest difference between two logit rows.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// One batch step of `rows`: every row's logits, after checking that the
/// token the GPU chose for each row is its logits' argmax (`what` names
/// the case in a failure).
fn batch_step(session: &mut Session, rows: &[(usize, u32)], what: &str) -> Vec<Vec<f32>> {
    let out = block_on(session.forward_batch_select(rows, |_| true)).expect("batch step");
    let logits: Vec<Vec<f32>> = out.logits.into_iter().map(|l| l.expect("logits")).collect();
    for (i, l) in logits.iter().enumerate() {
        assert_eq!(
            out.tokens[i],
            Some(argmax(l)),
            "{what}: row {i}'s GPU token"
        );
    }
    logits
}

/// The prompt of sequence `i`: lengths 5, 2, 9, … of ids below `vocab`.
fn prompt(i: usize, vocab: u32) -> Vec<u32> {
    let len = [5, 2, 9, 4][i % 4];
    (0..len)
        .map(|k| (7 + 31 * i as u32 + 13 * k as u32) % vocab)
        .collect()
}

#[test]
fn a_batch_step_gives_each_sequence_its_own_logits() {
    let _gpu = gpu_lock();
    let mut failures = Vec::new();
    for family in ["llama", "qwen2", "qwen3", "gemma3", "phi3", "mistral"] {
        let plan_path = compile_plan(&tiny_model(family), |o| o.max_batch = 4);
        let plan = PlanFile::open(&plan_path).expect("plan");
        assert_eq!(plan.header.io.max_batch, 4);
        let opts = SessionOptions {
            slots: 4,
            ..SessionOptions::default()
        };
        let mut batched = block_on(Session::open(&plan, &opts)).expect("session with slots");
        let mut alone = block_on(Session::new(&plan)).expect("session");
        let vocab = batched.vocab_size() as u32;
        let seqs = 3;
        // Each sequence's prompt in its own slot (slot 3 stays empty).
        let mut next = Vec::new();
        let mut history: Vec<Vec<u32>> = Vec::new();
        for i in 0..seqs {
            batched.set_slot(i).expect("slot");
            let p = prompt(i, vocab);
            let logits = block_on(batched.forward(&p)).expect("prefill");
            next.push(argmax(&logits));
            history.push(p);
        }
        // Three batch steps, the rows in a different order each time.
        for order in [[0usize, 1, 2], [2, 0, 1], [1, 2, 0]] {
            let rows: Vec<(usize, u32)> = order.iter().map(|&s| (s, next[s])).collect();
            let got = batch_step(&mut batched, &rows, family);
            assert_eq!(got.len(), rows.len());
            for (&(slot, token), logits) in rows.iter().zip(&got) {
                history[slot].push(token);
                alone.reset();
                let want = block_on(alone.forward(&history[slot])).expect("alone");
                let d = max_diff(logits, &want);
                if d > 2e-3 {
                    failures.push(format!(
                        "{family}: slot {slot} order {order:?}: max diff {d}"
                    ));
                }
                next[slot] = argmax(logits);
                assert_eq!(
                    batched.slot_position(slot),
                    history[slot].len() as u64,
                    "{family}: slot {slot}'s position"
                );
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A prompt of `len` ids below `vocab`, different for each `i`.
fn long_prompt(i: usize, vocab: u32, len: usize) -> Vec<u32> {
    (0..len)
        .map(|k| (3 + 17 * i as u32 + 29 * k as u32) % vocab)
        .collect()
}

/// The desktop target's batch steps (the `gemv_batch` matmuls of the
/// variants with subgroups; the portable ones' tiled GEMM) give each row the
/// logits its sequence gets alone in the same variant (a third of the rows
/// 40 to 115 tokens deep, so their attention runs several splits): a dense
/// plan whose 17 rows need two workgroup rows of 16, and a quantized one (Q4_0 blocks
/// decoded in the batch matmul's loads; the int8 variant's decode dots `x`
/// rounded to int8, so its rows agree only as far as the int8 tolerance).
#[test]
fn every_desktop_variant_batches_rows_like_its_own_decode() {
    let _gpu = gpu_lock();
    let mut failures = Vec::new();
    let mut ran = Vec::new();
    for (family, quantize, rows) in [
        ("llama", None, 17usize),
        ("qwen2", Some(gerbil_compiler::Quantization::Q4_0), 3),
    ] {
        let plan_path = compile_plan(&tiny_model(family), |o| {
            o.target = gerbil_codegen_wgsl::Target::desktop();
            o.max_batch = rows as u32 + 1;
            o.quantize = quantize;
        });
        let plan = PlanFile::open(&plan_path).expect("plan");
        for v in &plan.header.variants {
            if v.features
                .contains(&gerbil_plan::Feature::CooperativeMatrix)
                && !gerbil_e2e::kernel_harness::has_cooperative_matrix()
            {
                continue; // no tensor cores on lavapipe
            }
            let opts = |slots| SessionOptions {
                slots,
                variant: Some(v.name.clone()),
                ..SessionOptions::default()
            };
            let mut batched = block_on(Session::open(&plan, &opts(rows))).expect("session");
            let mut alone = block_on(Session::open(&plan, &opts(1))).expect("session");
            let vocab = batched.vocab_size() as u32;
            let mut step = Vec::new();
            let mut history = Vec::new();
            for i in 0..rows {
                batched.set_slot(i).expect("slot");
                // Some rows deep enough that their keys take several splits.
                let p = match i % 3 {
                    0 => long_prompt(i, vocab, 40 + 5 * i),
                    _ => prompt(i, vocab),
                };
                let logits = block_on(batched.forward(&p)).expect("prefill");
                step.push((i, argmax(&logits)));
                history.push(p);
            }
            let got = batch_step(&mut batched, &step, &v.name);
            let tol = if v.name.ends_with("-i8") { 0.4 } else { 2e-3 };
            for (&(slot, token), logits) in step.iter().zip(&got) {
                history[slot].push(token);
                alone.reset();
                let want = block_on(alone.forward(&history[slot])).expect("alone");
                let d = max_diff(logits, &want);
                if d > tol {
                    failures.push(format!("{family} {}: row {slot}: max diff {d}", v.name));
                }
            }
            ran.push(format!("{family} {}", v.name));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    for want in [
        "llama subgroups",
        "llama subgroups-f16",
        "qwen2 subgroups-f16-i8",
    ] {
        assert!(ran.iter().any(|r| r == want), "{want} did not run: {ran:?}");
    }
}

#[test]
fn batch_steps_refuse_what_they_cannot_run() {
    let _gpu = gpu_lock();
    let plain = compile_plan(&tiny_model("llama"), |_| {});
    let plan = PlanFile::open(&plain).expect("plan");
    let mut s = block_on(Session::new(&plan)).expect("session");
    assert!(matches!(
        block_on(s.forward_batch(&[(0, 1)])),
        Err(RuntimeError::NoBatchSchedule)
    ));
    let batched = compile_plan(&tiny_model("llama"), |o| o.max_batch = 2);
    let plan = PlanFile::open(&batched).expect("plan");
    let opts = SessionOptions {
        slots: 3,
        ..SessionOptions::default()
    };
    let mut s = block_on(Session::open(&plan, &opts)).expect("session");
    for rows in [&[][..], &[(0, 1), (1, 1), (2, 1)]] {
        let e = block_on(s.forward_batch(rows)).unwrap_err();
        assert!(matches!(e, RuntimeError::BatchSize { .. }), "{rows:?}: {e}");
    }
    assert!(matches!(
        block_on(s.forward_batch(&[(3, 1)])),
        Err(RuntimeError::Slot { .. })
    ));
    assert!(matches!(
        block_on(s.forward_batch(&[(0, 1_000_000)])),
        Err(RuntimeError::TokenOutOfRange { .. })
    ));
    // Nothing ran: every slot is still empty.
    assert!((0..3).all(|slot| s.slot_position(slot) == 0));
}

/// A slot named on several rows of a batch step takes its next positions
/// in order: a prompt fed as rows beside another sequence's token gives, on
/// its last row, the logits the prompt gives alone.
#[test]
fn a_prompt_fed_as_rows_of_a_batch_step_matches_its_prefill() {
    let _gpu = gpu_lock();
    let plan_path = compile_plan(&tiny_model("qwen2"), |o| o.max_batch = 8);
    let plan = PlanFile::open(&plan_path).expect("plan");
    let opts = SessionOptions {
        slots: 2,
        ..SessionOptions::default()
    };
    let mut s = block_on(Session::open(&plan, &opts)).expect("session");
    let mut alone = block_on(Session::new(&plan)).expect("session");
    let vocab = s.vocab_size() as u32;
    let first = prompt(0, vocab);
    s.set_slot(0).expect("slot");
    let logits = block_on(s.forward(&first)).expect("prefill");
    let next = argmax(&logits);
    let second = prompt(3, vocab);
    let mut rows = vec![(0, next)];
    rows.extend(second.iter().map(|&t| (1, t)));
    let got = block_on(s.forward_batch(&rows)).expect("mixed step");
    assert_eq!(s.slot_position(0), first.len() as u64 + 1);
    assert_eq!(s.slot_position(1), second.len() as u64);
    let want = block_on(alone.forward(&second)).expect("alone");
    let d = max_diff(got.last().expect("rows"), &want);
    assert!(d < 2e-3, "the prompt's last row: max diff {d}");
    alone.reset();
    let mut a = first.clone();
    a.push(next);
    let want = block_on(alone.forward(&a)).expect("alone");
    let d = max_diff(&got[0], &want);
    assert!(d < 2e-3, "the other sequence's row: max diff {d}");
}

/// `Model::batch`: sequences started at different times, with different
/// settings and lengths, decoded together — their prompts run as rows of
/// the batch steps beside the others' tokens, over several steps where the
/// rows left are fewer, or past 8 steps' rows as one 4-token prefill chunk
/// a step — each give exactly the tokens `Model::generate` gives them alone;
/// one that shares a running sequence's prefix starts from a copy of those
/// rows.
#[test]
fn a_batch_of_generations_gives_each_its_own_answer() {
    use gerbil::{GenerationSettings, Model, ModelOptions, SamplingParams};
    let _gpu = gpu_lock();
    let plan_path = compile_plan(&tiny_model("llama"), |o| {
        o.max_batch = 4;
        o.max_tokens_per_step = Some(4);
    });
    let plan = PlanFile::open(&plan_path).expect("plan");
    let mut opts = ModelOptions::default();
    opts.session.slots = 4;
    let mut batched = block_on(Model::load(&plan, &opts)).expect("model");
    let mut alone = block_on(Model::load(&plan, &ModelOptions::default())).expect("model");
    let vocab = batched.session().vocab_size() as u32;
    let settings = |n: usize, sampling: SamplingParams| GenerationSettings {
        max_new_tokens: n,
        sampling,
        ignore_eos: true,
        ..GenerationSettings::default()
    };
    let greedy = SamplingParams::default();
    let sampled = SamplingParams {
        temperature: 0.8,
        seed: 3,
        repetition_penalty: 1.2,
        ..SamplingParams::default()
    };
    let shared = prompt(2, vocab);
    let mut longer = shared.clone();
    longer.extend([3, 1, 4]);
    // (prompt, settings, the step it starts at): the first longer than 8
    // steps' rows (prefill chunks alone until 32 tokens are left, then rows
    // over eleven steps, the third's prompt waiting for them), the others
    // fed as rows; the last starts once the third's prompt has run.
    let jobs = [
        (long_prompt(0, vocab, 40), settings(20, greedy), 0),
        (prompt(1, vocab), settings(7, sampled), 0),
        (shared, settings(12, greedy), 2),
        (longer, settings(9, sampled), 20),
    ];
    let mut batch = batched.batch().expect("batch");
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); jobs.len()];
    let mut ids = vec![None; jobs.len()];
    let mut cached = vec![0; jobs.len()];
    for step in 0.. {
        for (j, (p, s, at)) in jobs.iter().enumerate() {
            if *at == step {
                let id = batch.start(p, s, None).expect("start");
                cached[j] = batch.stats(id).unwrap().cached_tokens;
                ids[j] = Some(id);
            }
        }
        if batch.running() == 0 && step > 5 {
            break;
        }
        for (id, piece) in block_on(batch.step()).expect("step") {
            let j = ids.iter().position(|&i| i == Some(id)).unwrap();
            got[j].push(piece.token);
        }
    }
    for (j, (p, s, _)) in jobs.iter().enumerate() {
        let id = ids[j].unwrap();
        assert_eq!(batch.tokens(id), Some(&got[j][..]));
        assert_eq!(batch.finish_reason(id), Some(gerbil::FinishReason::Length));
        alone.clear_cache();
        let mut g = alone.generate(p, s).expect("generate");
        let mut want = Vec::new();
        while let Some(piece) = block_on(g.next()) {
            want.push(piece.expect("token").token);
        }
        assert_eq!(got[j], want, "job {j}");
    }
    assert_eq!(
        cached[3],
        jobs[2].0.len(),
        "the shared prompt, copied from a running sequence"
    );
    assert!(batch.remove(ids[0].unwrap()).is_some());
    assert!(batch.remove(ids[0].unwrap()).is_none());
}

/// A batch holds as many running sequences as the plan's batch size and the
/// session's slots allow; one more is refused, naming both.
#[test]
fn a_full_batch_refuses_one_more_sequence() {
    use gerbil::{Error, GenerationSettings, Model, ModelOptions};
    let _gpu = gpu_lock();
    let plan_path = compile_plan(&tiny_model("llama"), |o| o.max_batch = 4);
    let plan = PlanFile::open(&plan_path).expect("plan");
    let mut opts = ModelOptions::default();
    opts.session.slots = 2;
    let mut model = block_on(Model::load(&plan, &opts)).expect("model");
    let mut batch = model.batch().expect("batch");
    assert_eq!(batch.capacity(), 2);
    let settings = GenerationSettings::default();
    batch.start(&[1, 2], &settings, None).expect("first");
    batch.start(&[3, 4], &settings, None).expect("second");
    let e = batch.start(&[5, 6], &settings, None).unwrap_err();
    assert!(matches!(e, Error::BatchFull { running: 2 }), "{e}");
    assert!(e.to_string().contains("--max-batch"), "{e}");
    let mut plain = block_on(Model::load(
        &PlanFile::open(&compile_plan(&tiny_model("llama"), |_| {})).expect("plan"),
        &ModelOptions::default(),
    ))
    .expect("model");
    assert!(plain.batch().is_err());
}

/// A batch row whose logits hold a NaN (a plan compiled from a checkpoint
/// with a NaN norm weight, `allow_non_finite`) gets no GPU token: its row
/// is read back and the step fails naming the step, the position and the
/// token, as a single generation does — never a token chosen from NaN.
#[test]
fn a_batch_row_with_non_finite_logits_stops_with_a_clear_error() {
    use gerbil::{Error, GenerationSettings, Model, ModelOptions};
    let _gpu = gpu_lock();
    let src = tiny_model("llama");
    let dir = temp_dir("poisoned");
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).expect("copy");
    }
    let mut bytes = std::fs::read(src.join("model.safetensors")).expect("weights");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("header length")) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("header");
    let start = 8
        + n
        + header["model.norm.weight"]["data_offsets"][0]
            .as_u64()
            .unwrap() as usize;
    bytes[start + 12..start + 16].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(dir.path().join("model.safetensors"), bytes).expect("write");
    let plan_path = compile_plan(dir.path(), |o| {
        o.max_batch = 2;
        o.allow_non_finite = true;
    });
    let plan = PlanFile::open(&plan_path).expect("plan");
    assert!(plan.header.io.batch_tokens.is_some());
    let mut opts = ModelOptions::default();
    opts.session.slots = 2;
    let mut model = block_on(Model::load(&plan, &opts)).expect("model");
    let mut batch = model.batch().expect("batch");
    let greedy = GenerationSettings {
        max_new_tokens: 4,
        ..GenerationSettings::default()
    };
    batch.start(&[1, 2, 3], &greedy, None).expect("start");
    // Two rows a step: the prompt's last token, and the first choice, come
    // in the second step.
    assert!(block_on(batch.step())
        .expect("the prompt's first rows")
        .is_empty());
    let err = block_on(batch.step()).expect_err("a step over NaN logits");
    assert!(
        matches!(err, Error::Runtime(RuntimeError::NonFiniteLogits { .. })),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("the logits hold a non-finite value (NaN"),
        "{err}"
    );
}

/// A session creates each pipeline when a step first runs it: none at
/// load, the short-prompt kernels (not the long prompts' GEMM tiles) for a
/// short prompt, the decode kernels at the next token, the batch step's only
/// when one runs; and its logits are those of a session that created every
/// pipeline up front. With the background thread, the first step finds the
/// prefill and decode pipelines made (and waits for them), the batch step
/// still creates its own.
#[test]
fn pipelines_are_created_when_a_step_first_needs_them() {
    let _gpu = gpu_lock();
    let plan_path = compile_plan(&tiny_model("llama"), |o| o.max_batch = 2);
    let plan = PlanFile::open(&plan_path).expect("plan");
    // Not the `cpu` variant lavapipe would pick: its prompts of every
    // length run the same kernels.
    let opts = SessionOptions {
        slots: 2,
        variant: Some("subgroups".into()),
        background_pipelines: Some(false),
        ..SessionOptions::default()
    };
    let mut lazy = block_on(Session::open(&plan, &opts)).expect("session");
    let v = lazy.variant().clone();
    fn all(list: &[gerbil_plan::Dispatch]) -> Vec<&gerbil_plan::Dispatch> {
        list.iter().collect()
    }
    let kernels = |lists: &[Vec<&gerbil_plan::Dispatch>]| {
        let mut k: Vec<u32> = lists.iter().flatten().map(|d| d.kernel).collect();
        k.sort_unstable();
        k.dedup();
        k
    };
    let short = kernels(&[v.prefill_at(5)]);
    let long = kernels(&[v.prefill_at(u64::from(gerbil_codegen_wgsl::SHORT_PROMPT) + 1)]);
    assert!(
        long.iter().any(|k| !short.contains(k)),
        "{}: long prompts run kernels short ones do not",
        v.name
    );
    assert_eq!(lazy.pipeline_stats().created, 0, "a load creates none");

    let prompt: Vec<u32> = (1..6).collect();
    let logits = block_on(lazy.forward(&prompt)).expect("prompt");
    assert_eq!(lazy.pipeline_stats().created, short.len());
    let next = block_on(lazy.forward(&[7])).expect("decode");
    let with_decode = kernels(&[v.prefill_at(5), all(&v.decode)]);
    assert_eq!(lazy.pipeline_stats().created, with_decode.len());
    block_on(lazy.forward_batch(&[(0, 8), (1, 9)])).expect("batch step");
    let with_batch = kernels(&[v.prefill_at(5), all(&v.decode), all(&v.batch)]);
    assert_eq!(lazy.pipeline_stats().created, with_batch.len());
    block_on(lazy.create_all_pipelines()).expect("the rest");
    let every = kernels(&[all(&v.prefill), all(&v.decode), all(&v.batch)]);
    assert_eq!(lazy.pipeline_stats().created, every.len());
    assert_eq!(lazy.pipeline_stats().background, 0, "no background thread");

    let mut eager = block_on(Session::open(&plan, &opts)).expect("session");
    block_on(eager.create_all_pipelines()).expect("every pipeline");
    assert_eq!(block_on(eager.forward(&prompt)).expect("prompt"), logits);
    assert_eq!(block_on(eager.forward(&[7])).expect("decode"), next);

    let background = SessionOptions {
        background_pipelines: Some(true),
        ..opts
    };
    let mut early = block_on(Session::open(&plan, &background)).expect("session");
    assert_eq!(block_on(early.forward(&prompt)).expect("prompt"), logits);
    block_on(early.create_step_pipelines()).expect("the background thread's");
    let prefill_and_decode = kernels(&[all(&v.prefill), all(&v.decode)]);
    assert_eq!(early.pipeline_stats().created, prefill_and_decode.len());
    assert_eq!(
        early.pipeline_stats().background,
        prefill_and_decode.len(),
        "the background thread made every prefill and decode pipeline"
    );
    assert_eq!(block_on(early.forward(&[7])).expect("decode"), next);
    block_on(early.forward_batch(&[(0, 8), (1, 9)])).expect("batch step");
    assert_eq!(early.pipeline_stats().created, every.len());
}

/// With [`PrefillFallback::FirstPrompt`] the first prompt runs on the
/// session's prefill fallback (on lavapipe, `subgroups` for the `cpu`
/// variant it picks: the next variant of the same precision, on the same
/// buffers), and decoding goes on with the session's own variant from the KV
/// cache the fallback wrote; the logits of both steps are a plain session's
/// within the f32 tolerance (1e-4 of the largest logit), and the next prompt
/// runs the variant itself, exactly. A variant named in the options has no
/// fallback.
#[test]
fn the_first_prompt_can_run_on_the_prefill_fallback() {
    let _gpu = gpu_lock();
    let plan = PlanFile::open(&compile_plan(&tiny_model("llama"), |_| {})).expect("plan");
    let with = |fallback| SessionOptions {
        prefill_fallback: fallback,
        ..SessionOptions::default()
    };
    let mut plain = block_on(Session::open(&plan, &with(PrefillFallback::Off))).expect("session");
    let mut first =
        block_on(Session::open(&plan, &with(PrefillFallback::FirstPrompt))).expect("session");
    let chosen = first.variant().name.clone();
    assert_eq!(plain.variant().name, chosen);
    let prompt: Vec<u32> = (1..9).collect();
    let close = |got: &[f32], want: &[f32], what: &str| {
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = max_abs_diff(got, want);
        assert!(
            diff <= 1e-4 * scale,
            "{what}: {diff} from the plain session's (max {scale})"
        );
    };
    let want = block_on(plain.forward(&prompt)).expect("prompt");
    let got = block_on(first.forward(&prompt)).expect("prompt on the fallback");
    let fallback = first.prefill_variant().to_string();
    assert_ne!(fallback, chosen, "the first prompt ran on a fallback");
    assert_eq!(plain.prefill_variant(), chosen);
    close(&got, &want, &format!("the prompt on `{fallback}`"));
    assert_ne!(
        got, want,
        "`{fallback}`'s kernels sum in another order than `{chosen}`'s"
    );
    let want_next = block_on(plain.forward(&[11])).expect("decode");
    let got_next = block_on(first.forward(&[11])).expect("decode after the fallback");
    close(
        &got_next,
        &want_next,
        &format!("`{chosen}` decoding after `{fallback}`"),
    );
    assert_eq!(first.prefill_variant(), fallback, "the last prompt's");

    first.reset();
    plain.reset();
    assert_eq!(
        block_on(first.forward(&prompt)).expect("second prompt"),
        block_on(plain.forward(&prompt)).expect("second prompt"),
    );
    assert_eq!(first.prefill_variant(), chosen);

    let named = SessionOptions {
        variant: Some(chosen.clone()),
        ..with(PrefillFallback::FirstPrompt)
    };
    let mut named = block_on(Session::open(&plan, &named)).expect("session");
    assert_eq!(block_on(named.forward(&prompt)).expect("prompt"), want);
    assert_eq!(
        named.prefill_variant(),
        chosen,
        "no fallback for a named variant"
    );
}
