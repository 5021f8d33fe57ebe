//! Generation controls end to end: the facade's generation loop (the one
//! `gerbil-run`, `chat` and the server run) with penalties on a tiny model
//! against a step-by-step reference built from read-back logits, and a
//! checkpoint's `generation_config.json` settings carried into the plan (or
//! refused, naming the key).

use gerbil::{GenerationSettings, Model, ModelOptions, TokenConstraint};
use gerbil_compiler::Checkpoint;
use gerbil_e2e::*;
use gerbil_plan::{GenerationDefaults, PlanFile};
use gerbil_runtime::{argmax, Sampler, SamplingParams, Session};
use pollster::block_on;
use std::collections::HashMap;

/// Tokens to generate: enough for a random tiny model to repeat itself.
const NEW_TOKENS: usize = 24;

/// The penalties written out independently of the runtime's sampler:
/// transformers' repetition penalty over every id of `context`, then OpenAI's
/// presence and frequency penalties over the ids of `generated`.
fn penalized(logits: &[f32], p: &SamplingParams, context: &[u32], generated: &[u32]) -> Vec<f32> {
    let mut l = logits.to_vec();
    let mut seen: Vec<u32> = context.to_vec();
    seen.sort_unstable();
    seen.dedup();
    for id in seen {
        let v = &mut l[id as usize];
        *v = if *v < 0.0 {
            *v * p.repetition_penalty
        } else {
            *v / p.repetition_penalty
        };
    }
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in generated {
        *counts.entry(t).or_default() += 1;
    }
    for (id, n) in counts {
        l[id as usize] -= p.presence_penalty + p.frequency_penalty * n as f32;
    }
    l
}

/// Decodes `NEW_TOKENS` one `Session::forward` at a time, choosing from the
/// read-back logits after [`penalized`]: argmax when greedy, else the
/// sampler (its noise depends only on the seed and the position).
fn reference(session: &mut Session, prompt: &[u32], p: &SamplingParams) -> Vec<u32> {
    let plain = Sampler::new(SamplingParams {
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        ..*p
    })
    .expect("sampler");
    session.reset();
    let mut context = prompt.to_vec();
    let mut generated = Vec::new();
    let mut logits = block_on(session.forward(prompt)).expect("prefill");
    while generated.len() < NEW_TOKENS {
        let l = penalized(&logits, p, &context, &generated);
        let token = if p.is_greedy() {
            argmax(&l)
        } else {
            plain.sample(&l, session.position() as u32 - 1)
        };
        context.push(token);
        generated.push(token);
        logits = block_on(session.forward(&[token])).expect("decode step");
    }
    generated
}

/// `NEW_TOKENS` tokens of `prompt` through `Model::generate`, from a cleared
/// KV cache.
fn generated(model: &mut Model, prompt: &[u32], sampling: SamplingParams) -> Vec<u32> {
    model.clear_cache();
    let settings = GenerationSettings {
        max_new_tokens: NEW_TOKENS,
        sampling,
        ignore_eos: true,
        ..GenerationSettings::default()
    };
    let mut g = model.generate(prompt, &settings).expect("generate");
    let mut tokens = Vec::new();
    while let Some(piece) = block_on(g.next()) {
        tokens.push(piece.expect("a token").token);
    }
    tokens
}

/// Generation honours penalties although it would otherwise decode on the
/// GPU: it falls back to the CPU loop and chooses exactly what the
/// step-by-step reference chooses, and the penalty changes the text.
#[test]
fn generate_applies_penalties_like_the_reference() {
    let _gpu = gpu_lock();
    let plan_path = compile_plan(&tiny_model("llama"), |_| {});
    let plan = PlanFile::open(&plan_path).expect("plan");
    let mut model = block_on(Model::load(&plan, &ModelOptions::default())).expect("model");
    let prompt = tiny_ref("llama")
        .cases
        .into_iter()
        .find(|c| c.input_ids.len() > 1)
        .expect("a case with a multi-token prompt")
        .input_ids;

    let greedy = SamplingParams::default();
    let repetition = SamplingParams {
        repetition_penalty: 1.3,
        ..greedy
    };
    assert!(model.session().can_sample_on_gpu(&greedy));
    assert!(!model.session().can_sample_on_gpu(&repetition));

    let plain = generated(&mut model, &prompt, greedy);
    assert_eq!(plain, reference(model.session_mut(), &prompt, &greedy));
    let penalized = generated(&mut model, &prompt, repetition);
    assert_eq!(
        penalized,
        reference(model.session_mut(), &prompt, &repetition)
    );
    assert_ne!(penalized, plain, "repetition penalty 1.3 changed nothing");

    // Sampling with every penalty at once, and a penalty below 1.
    for p in [
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            seed: 11,
            repetition_penalty: 1.2,
            presence_penalty: 0.4,
            frequency_penalty: 0.7,
            ..SamplingParams::default()
        },
        SamplingParams {
            repetition_penalty: 0.7,
            frequency_penalty: -0.3,
            ..greedy
        },
    ] {
        assert_eq!(
            generated(&mut model, &prompt, p),
            reference(model.session_mut(), &prompt, &p),
            "{p:?}"
        );
    }
}

/// Allows only ids that are multiples of `step`, and is complete after
/// `len` tokens; records what it was told.
struct EveryNth {
    step: u32,
    len: usize,
    seen: std::sync::Arc<std::sync::Mutex<Vec<u32>>>,
}

impl TokenConstraint for EveryNth {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        for (id, l) in logits.iter_mut().enumerate() {
            if !(id as u32).is_multiple_of(self.step) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }
    fn accept(&mut self, token: u32) -> Result<(), String> {
        if !token.is_multiple_of(self.step) {
            return Err(format!("{token} was not allowed"));
        }
        self.seen.lock().unwrap().push(token);
        Ok(())
    }
    fn is_complete(&self) -> bool {
        self.seen.lock().unwrap().len() >= self.len
    }
}

/// A constrained generation chooses, step by step, what the reference
/// chooses from the masked logits (greedy and sampled), tells the
/// constraint every token, and ends with `stop` when the constraint is
/// complete; a constraint that fails ends it with the constraint's error.
#[test]
fn a_constraint_masks_every_step_and_ends_the_generation() {
    let _gpu = gpu_lock();
    let plan_path = compile_plan(&tiny_model("llama"), |_| {});
    let plan = PlanFile::open(&plan_path).expect("plan");
    let mut model = block_on(Model::load(&plan, &ModelOptions::default())).expect("model");
    let prompt = tiny_ref("llama").cases[0].input_ids.clone();
    for sampling in [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.9,
            seed: 5,
            ..SamplingParams::default()
        },
    ] {
        let len = 10;
        let seen = std::sync::Arc::default();
        model.clear_cache();
        let settings = GenerationSettings {
            max_new_tokens: 50,
            sampling,
            ignore_eos: true,
            ..GenerationSettings::default()
        };
        let mut g = model.generate(&prompt, &settings).expect("generate");
        let c = EveryNth {
            step: 3,
            len,
            seen: std::sync::Arc::clone(&seen),
        };
        g.constrain(Box::new(c)).expect("before the first token");
        let mut tokens = Vec::new();
        while let Some(piece) = block_on(g.next()) {
            tokens.push(piece.expect("a token").token);
        }
        assert_eq!(g.finish_reason(), Some(gerbil::FinishReason::Stop));
        drop(g);
        assert_eq!(tokens.len(), len);
        assert_eq!(*seen.lock().unwrap(), tokens);

        // The reference: masked logits, one step at a time.
        let sampler = Sampler::new(sampling).expect("sampler");
        let session = model.session_mut();
        session.reset();
        let mut logits = block_on(session.forward(&prompt)).expect("prefill");
        let mut want = Vec::new();
        while want.len() < len {
            for (id, l) in logits.iter_mut().enumerate() {
                if !id.is_multiple_of(3) {
                    *l = f32::NEG_INFINITY;
                }
            }
            let token = if sampling.is_greedy() {
                argmax(&logits)
            } else {
                sampler.sample(&logits, session.position() as u32 - 1)
            };
            want.push(token);
            logits = block_on(session.forward(&[token])).expect("decode step");
        }
        assert_eq!(tokens, want, "{sampling:?}");
    }

    // A constraint's error ends the generation with that error.
    struct Refuses;
    impl TokenConstraint for Refuses {
        fn mask(&mut self, _: &mut [f32]) -> Result<(), String> {
            Err("the grammar broke".into())
        }
        fn accept(&mut self, _: u32) -> Result<(), String> {
            Ok(())
        }
        fn is_complete(&self) -> bool {
            false
        }
    }
    model.clear_cache();
    let mut g = model
        .generate(&prompt, &GenerationSettings::default())
        .expect("generate");
    g.constrain(Box::new(Refuses))
        .expect("before the first token");
    let err = block_on(g.next()).expect("an item").unwrap_err();
    assert!(err.to_string().contains("the grammar broke"), "{err}");
    assert!(block_on(g.next()).is_none());
}

/// A copy of the tiny Llama checkpoint whose `generation_config.json` is
/// `gc`.
fn checkpoint_with(gc: &str) -> tempfile::TempDir {
    let dir = temp_dir("gencfg");
    let src = tiny_model("llama");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.path().join(f)).expect("copy the tiny model");
    }
    std::fs::write(dir.path().join("generation_config.json"), gc).expect("write");
    dir
}

#[test]
fn generation_config_settings_reach_the_plan_header() {
    let dir = checkpoint_with(
        r#"{"do_sample": true, "temperature": 0.6, "top_p": 0.9, "eos_token_id": [2, 3]}"#,
    );
    let plan = PlanFile::open(&compile_plan(dir.path(), |_| {})).expect("plan");
    let text = &plan.header.text;
    assert_eq!(text.eos_token_ids, vec![2, 3]);
    assert_eq!(
        text.generation,
        GenerationDefaults {
            do_sample: Some(true),
            temperature: Some(0.6),
            top_p: Some(0.9),
            ..GenerationDefaults::default()
        }
    );
    // The tiny model's own file sets no sampling key: all absent.
    let plan = PlanFile::open(&compile_plan(&tiny_model("llama"), |_| {})).expect("plan");
    assert_eq!(plan.header.text.generation, GenerationDefaults::default());
}

#[test]
fn a_bad_generation_config_value_is_an_error_naming_the_key() {
    for (gc, key) in [
        (r#"{"do_sample": true, "temperature": -1}"#, "temperature"),
        (r#"{"temperature": "NaN"}"#, "temperature"),
        (r#"{"top_p": 1.5}"#, "top_p"),
        (r#"{"repetition_penalty": 0}"#, "repetition_penalty"),
    ] {
        let dir = checkpoint_with(gc);
        let err = match Checkpoint::open(dir.path()) {
            Ok(_) => panic!("{gc} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains(&format!("generation_config.json: `{key}`")),
            "{gc}: {err}"
        );
    }
}

/// `NEW_TOKENS` greedy tokens of `prompt`, and how many prompt tokens the
/// model found cached.
fn greedy_with_cache(model: &mut Model, prompt: &[u32]) -> (Vec<u32>, usize) {
    let settings = GenerationSettings {
        max_new_tokens: NEW_TOKENS,
        ignore_eos: true,
        ..GenerationSettings::default()
    };
    let mut g = model.generate(prompt, &settings).expect("generate");
    let mut tokens = Vec::new();
    while let Some(piece) = block_on(g.next()) {
        tokens.push(piece.expect("a token").token);
    }
    (tokens, g.stats().cached_tokens)
}

/// A model with three sequence slots answers every prompt exactly as a
/// one-slot model does, while keeping each conversation cached: two users
/// taking turns each find their own earlier turn in the cache, a third user
/// sharing only the system prompt gets it copied into a free slot (both
/// conversations stay), and the least recently used slot makes room for a
/// prompt that shares nothing.
#[test]
fn sequence_slots_keep_conversations_and_share_prefixes() {
    let _gpu = gpu_lock();
    let plan_path = compile_plan(&tiny_model("llama"), |_| {});
    let plan = PlanFile::open(&plan_path).expect("plan");
    let mut one = block_on(Model::load(&plan, &ModelOptions::default())).expect("model");
    let mut opts = ModelOptions::default();
    opts.session.slots = 3;
    let mut three = block_on(Model::load(&plan, &opts)).expect("model with slots");
    assert_eq!(three.session().slots(), 3);
    assert_eq!(
        three.session().memory().kv_cache,
        3 * one.session().memory().kv_cache
    );

    let system: Vec<u32> = (1..20).collect();
    let turn = |user: u32, n: u32| -> Vec<u32> {
        let mut p = system.clone();
        p.extend((0..n).map(|i| 100 + user * 10 + i));
        p
    };
    let alone = |one: &mut Model, prompt: &[u32]| {
        one.clear_cache();
        greedy_with_cache(one, prompt).0
    };
    // User A, then user B (sharing the system prompt): B's prompt finds
    // the system prompt, copied from A's slot into another.
    let a1 = turn(1, 3);
    let (out, cached) = greedy_with_cache(&mut three, &a1);
    assert_eq!((out.clone(), cached), (alone(&mut one, &a1), 0));
    let slot_a = three.session().slot();
    let b1 = turn(2, 4);
    let (out_b, cached) = greedy_with_cache(&mut three, &b1);
    assert_eq!(out_b, alone(&mut one, &b1));
    assert_eq!(cached, system.len(), "the system prompt, copied");
    let slot_b = three.session().slot();
    assert_ne!(slot_a, slot_b);
    // A's next turn: A's whole conversation (prompt and answer but its
    // last token) is still cached, in A's slot.
    let mut a2 = a1.clone();
    a2.extend(&out);
    a2.extend([7, 8]);
    let (out2, cached) = greedy_with_cache(&mut three, &a2);
    assert_eq!(out2, alone(&mut one, &a2));
    assert_eq!(cached, a1.len() + out.len() - 1);
    assert_eq!(three.session().slot(), slot_a);
    // Something unrelated goes to the third slot; then another to the
    // least recently used (B's), and B's next turn starts from nothing
    // but the answer is the same.
    let other: Vec<u32> = (200..230).collect();
    let (o, cached) = greedy_with_cache(&mut three, &other);
    assert_eq!((o, cached), (alone(&mut one, &other), 0));
    let third = three.session().slot();
    assert!(third != slot_a && third != slot_b);
    let more: Vec<u32> = (300..310).collect();
    greedy_with_cache(&mut three, &more);
    assert_eq!(
        three.session().slot(),
        slot_b,
        "B's slot was the least recently used"
    );
    let mut b2 = b1.clone();
    b2.extend(&out_b);
    let (out, _) = greedy_with_cache(&mut three, &b2);
    assert_eq!(out, alone(&mut one, &b2));
}
