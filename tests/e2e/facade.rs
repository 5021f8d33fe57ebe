//! The library facade (`Model`, `Generation`, `Chat`) against the
//! references: greedy tokens through both token sources (the GPU's sampler
//! and the CPU's), KV-cache reuse between prompts and chat turns,
//! cancellation, and a KV cache smaller than the plan's (`--ctx`).

use gerbil::{
    Chat, ChatMessage, FinishReason, Generation, GenerationDefaults, GenerationSettings, Model,
    ModelOptions, Piece, SessionOptions, SettingsRequest,
};
use gerbil_e2e::*;
use gerbil_plan::PlanFile;
use pollster::block_on;

fn load(plan: &PlanFile, context: Option<u64>) -> Model {
    let opts = ModelOptions {
        session: SessionOptions {
            context,
            ..SessionOptions::default()
        },
        ..ModelOptions::default()
    };
    block_on(Model::load(plan, &opts)).expect("load")
}

/// Every piece of a generation, until it ends.
fn drain(g: &mut Generation<'_>) -> Vec<Piece> {
    let mut out = Vec::new();
    while let Some(p) = block_on(g.next()) {
        out.push(p.expect("generation step"));
    }
    out
}

fn tokens(pieces: &[Piece]) -> Vec<u32> {
    pieces.iter().map(|p| p.token).collect()
}

fn greedy(n: usize) -> GenerationSettings {
    GenerationSettings {
        max_new_tokens: n,
        ignore_eos: true,
        ..GenerationSettings::default()
    }
}

#[test]
fn greedy_tokens_from_both_sources_match_the_reference() {
    let reference = tiny_ref("llama");
    let case = &reference.cases[1];
    let plan_file = compile_plan(&tiny_model("llama"), |_| {});
    let plan = PlanFile::open(&plan_file).expect("plan");
    let _gpu = gpu_lock();
    let mut model = load(&plan, None);
    let n = case.greedy_ids.len();
    let mut g = model.generate(&case.input_ids, &greedy(n)).expect("start");
    let got = drain(&mut g);
    assert_eq!(tokens(&got), case.greedy_ids, "GPU sampler");
    assert_eq!(g.finish_reason(), Some(FinishReason::Length));
    assert_eq!(g.stats().generated_tokens, n);
    drop(g);
    // With the top logits the CPU chooses; the first step's best is the token.
    model.clear_cache();
    let settings = GenerationSettings {
        top_logits: Some(3),
        ..greedy(n)
    };
    let got = drain(&mut model.generate(&case.input_ids, &settings).expect("start"));
    assert_eq!(tokens(&got), case.greedy_ids, "CPU sampler");
    for p in &got {
        let top = p.top.as_ref().expect("top logits");
        assert_eq!(top.len(), 3);
        assert_eq!(top[0].0, p.token);
    }
}

/// Ten seeds through the library draw at least two different continuations, the same seed
/// draws the same one, and the GPU's sampler and the CPU's (with top logits) draw the same
/// tokens for a seed: a sampler that ignored its seed, or two samplers out of step, fail.
#[test]
fn seeds_choose_the_continuation_on_both_samplers() {
    let case = &tiny_ref("llama").cases[1];
    let plan_file = compile_plan(&tiny_model("llama"), |_| {});
    let plan = PlanFile::open(&plan_file).expect("plan");
    let _gpu = gpu_lock();
    let mut model = load(&plan, None);
    let mut sampled = |seed: u64, top_logits: Option<usize>| {
        model.clear_cache();
        let mut settings = SettingsRequest {
            temperature: Some(0.8),
            seed: Some(seed),
            max_new_tokens: Some(12),
            ignore_eos: true,
            ..SettingsRequest::default()
        }
        .resolve(&GenerationDefaults::default(), 12, || unreachable!())
        .settings;
        settings.top_logits = top_logits;
        tokens(&drain(
            &mut model.generate(&case.input_ids, &settings).unwrap(),
        ))
    };
    let gpu: Vec<Vec<u32>> = (0..10).map(|seed| sampled(seed, None)).collect();
    let distinct: std::collections::BTreeSet<&Vec<u32>> = gpu.iter().collect();
    assert!(distinct.len() >= 2, "ten seeds, one continuation: {gpu:?}");
    for seed in [0, 3, 9] {
        assert_eq!(
            sampled(seed, None),
            gpu[seed as usize],
            "seed {seed} again (GPU)"
        );
        assert_eq!(
            sampled(seed, Some(2)),
            gpu[seed as usize],
            "seed {seed} (CPU)"
        );
    }
}

#[test]
fn a_prompt_extending_the_cache_prefills_only_its_new_tokens() {
    let case = &tiny_ref("llama").cases[1];
    let plan_file = compile_plan(&tiny_model("llama"), |_| {});
    let plan = PlanFile::open(&plan_file).expect("plan");
    let _gpu = gpu_lock();
    let mut model = load(&plan, None);
    for top_logits in [None, Some(1)] {
        model.clear_cache();
        let settings = GenerationSettings {
            top_logits,
            ..greedy(4)
        };
        let first = tokens(&drain(
            &mut model.generate(&case.input_ids, &settings).unwrap(),
        ));
        // The cache holds the prompt and every generated token but the last.
        let mut held = case.input_ids.clone();
        held.extend_from_slice(&first[..3]);
        assert_eq!(model.cached_tokens(), held.as_slice());
        // A longer prompt that begins with them runs only its own tokens,
        // and answers as a fresh model does.
        let mut next = case.input_ids.clone();
        next.extend_from_slice(&first);
        next.extend_from_slice(&[7, 8, 9]);
        let mut g = model.generate(&next, &settings).unwrap();
        let reused = tokens(&drain(&mut g));
        assert_eq!(g.stats().cached_tokens, held.len(), "{top_logits:?}");
        assert_eq!(g.stats().prompt_tokens, next.len());
        drop(g);
        let mut fresh = load(&plan, None);
        let want = tokens(&drain(&mut fresh.generate(&next, &settings).unwrap()));
        assert_eq!(reused, want, "{top_logits:?}");
        // The same prompt again runs only its last token.
        let mut g = model.generate(&next, &settings).unwrap();
        assert_eq!(tokens(&drain(&mut g)), want);
        assert_eq!(g.stats().cached_tokens, next.len() - 1);
    }
}

#[test]
fn a_cancelled_generation_leaves_a_usable_cache() {
    let case = &tiny_ref("llama").cases[1];
    let plan_file = compile_plan(&tiny_model("llama"), |_| {});
    let plan = PlanFile::open(&plan_file).expect("plan");
    let _gpu = gpu_lock();
    let mut model = load(&plan, None);
    // Cancel in the middle of the GPU's first batch, by token and by drop.
    let mut g = model.generate(&case.input_ids, &greedy(20)).unwrap();
    let cancel = g.cancel_token();
    let first = block_on(g.next()).unwrap().unwrap();
    let second = block_on(g.next()).unwrap().unwrap();
    cancel.cancel();
    assert!(block_on(g.next()).is_none());
    assert_eq!(g.finish_reason(), Some(FinishReason::Cancelled));
    drop(g);
    assert_eq!(
        [first.token, second.token],
        case.greedy_ids[..2],
        "tokens before the cancel"
    );
    assert_eq!(model.cached_tokens().len(), case.input_ids.len() + 1);
    let mut g = model.generate(&case.input_ids, &greedy(3)).unwrap();
    block_on(g.next()).unwrap().unwrap();
    drop(g);
    let again = tokens(&drain(
        &mut model
            .generate(&case.input_ids, &greedy(case.greedy_ids.len()))
            .unwrap(),
    ));
    assert_eq!(again, case.greedy_ids, "after cancelled generations");
}

#[test]
fn a_smaller_context_holds_fewer_tokens_and_ends_with_length() {
    let case = &tiny_ref("llama").cases[1];
    let plan_file = compile_plan(&tiny_model("llama"), |o| o.max_context = Some(64));
    let plan = PlanFile::open(&plan_file).expect("plan");
    let _gpu = gpu_lock();
    let full = load(&plan, None);
    let ctx = case.input_ids.len() as u64 + 4;
    let mut model = load(&plan, Some(ctx));
    assert_eq!(model.context(), ctx);
    assert!(model.session().memory().kv_cache < full.session().memory().kv_cache);
    assert_eq!(
        model.session().memory().kv_cache * 64,
        full.session().memory().kv_cache * ctx,
        "KV bytes scale with the context"
    );
    drop(full);
    // 5 tokens fit after the prompt (the last is never fed); then `length`.
    let mut g = model.generate(&case.input_ids, &greedy(100)).unwrap();
    let got = tokens(&drain(&mut g));
    assert_eq!(got, case.greedy_ids[..5]);
    assert_eq!(g.finish_reason(), Some(FinishReason::Length));
    drop(g);
    let too_long: Vec<u32> = (0..ctx as u32 + 1).map(|i| i % 100 + 1).collect();
    let e = model
        .generate(&too_long, &greedy(1))
        .err()
        .expect("refused");
    assert!(
        e.to_string()
            .contains("do not fit the context of 17 tokens"),
        "{e}"
    );
    let opts = ModelOptions {
        session: SessionOptions {
            context: Some(65),
            ..SessionOptions::default()
        },
        ..ModelOptions::default()
    };
    let e = block_on(Model::load(&plan, &opts)).err().expect("refused");
    assert!(e.to_string().contains("give --ctx at most 64"), "{e}");
}

/// The real SmolLM2 through `Chat`: the reference chat prompt's greedy
/// answer, then a second turn that prefills only its new tokens.
#[test]
fn chat_answers_like_transformers_and_reuses_earlier_turns() {
    let reference = real_ref("smollm2-135m");
    let prompt = reference
        .prompts
        .iter()
        .find(|p| p.kind == "chat")
        .expect("a chat prompt");
    let messages: Vec<ChatMessage> = prompt
        .messages
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| serde_json::from_value(m.clone()).unwrap())
        .collect();
    assert_eq!(messages.len(), 1, "one user message");
    let plan_file = compile_plan(&fixture("smollm2-135m"), |o| o.max_context = Some(256));
    let plan = PlanFile::open(&plan_file).expect("plan");
    let _gpu = gpu_lock();
    let model = load(&plan, None);
    let eos = plan.header.text.eos_token_ids.clone();
    let mut chat = Chat::new(model);
    let settings = GenerationSettings {
        max_new_tokens: prompt.greedy_ids.len(),
        ..GenerationSettings::default()
    };
    let mut reply = chat.send(&messages[0].content, &settings).unwrap();
    let mut ids = Vec::new();
    while let Some(p) = block_on(reply.next()) {
        ids.push(p.unwrap().token);
    }
    // The reference ran past end-of-sequence; the chat stops at it.
    let end = prompt
        .greedy_ids
        .iter()
        .position(|t| eos.contains(t))
        .map_or(prompt.greedy_ids.len(), |i| i + 1);
    assert_eq!(ids, prompt.greedy_ids[..end]);
    let text = reply.text().to_string();
    let first_stats = reply.stats();
    assert_eq!(first_stats.cached_tokens, 0);
    assert_eq!(first_stats.prompt_tokens, prompt.input_ids.len());
    drop(reply);
    let codec = chat.model().codec().unwrap();
    let want_text = codec.decode(&prompt.greedy_ids[..end], true).unwrap();
    assert_eq!(text, want_text);
    assert_eq!(chat.messages().len(), 2);
    assert_eq!(chat.messages()[1].content, want_text);
    // Turn two: everything before it comes from the cache.
    let turn = "And of Germany?";
    let mut reply = chat.send(turn, &greedy(3)).unwrap();
    while let Some(p) = block_on(reply.next()) {
        p.unwrap();
    }
    let stats = reply.stats();
    drop(reply);
    let codec = chat.model().codec().unwrap();
    let whole = codec.encode_chat(&chat.messages()[..3], true).unwrap();
    let earlier = prompt.input_ids.len() + ids.len() - 1;
    assert_eq!(stats.prompt_tokens, whole.len());
    assert_eq!(
        stats.cached_tokens, earlier,
        "the second turn reuses the first turn's prompt and answer"
    );
    let new_tokens = whole.len() - stats.cached_tokens;
    let own = codec
        .encode_plain(
            &format!("<|im_end|>\n<|im_start|>user\n{turn}<|im_end|>\n<|im_start|>assistant\n"),
            false,
        )
        .unwrap();
    assert_eq!(new_tokens, own.len(), "only the new turn is prefilled");
}
