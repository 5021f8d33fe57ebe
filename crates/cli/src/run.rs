//! `gerbil-run`: generation, JSON output and benchmarks on a plan.
//!
//! [`run`] and [`bench()`] are `async` like the runtime they drive; the
//! `gerbil-run` binary blocks on them at the top (`pollster::block_on`).

use crate::console::{note, timing_line, Stdout, Timings};
use crate::gen_args::SamplingArgs;
use anyhow::{bail, Result};
use gerbil::{ChatMessage, FinishReason, Model, ModelOptions};
use gerbil_grammar::{Grammar, Grammars};
use gerbil_plan::PlanFile;
use gerbil_runtime::{
    PipelineCacheOptions, PrecisionChoice, PrefillFallback, SamplingParams, Session, SessionOptions,
};
use serde::Serialize;
use std::time::Instant;

/// What to feed the model.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Text, tokenized as `tokenizer(text)` does (or through the chat template).
    Text {
        /// The text.
        text: String,
        /// Apply the chat template to one user message.
        chat: bool,
        /// With `chat`: the system message.
        system: Option<String>,
    },
    /// Token ids as given.
    Ids(Vec<u32>),
}

/// Settings of `gerbil-run` generation.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Input.
    pub prompt: Prompt,
    /// Token choice and limits, before the model's defaults fill them in.
    pub sampling: SamplingArgs,
    /// Record the K largest logits of every step (with `json`).
    pub top_logits: Option<usize>,
    /// Print one JSON object instead of streaming text.
    pub json: bool,
    /// The grammar the answer must follow.
    pub grammar: Option<Grammar>,
    /// How the plan is loaded (precision, variant, device, context, caches, template sandbox).
    pub model: ModelOptions,
    /// No timing line on standard error.
    pub quiet: bool,
}

/// One step in the JSON output.
#[derive(Serialize)]
pub struct StepJson {
    /// The chosen token.
    pub token: u32,
    /// `[id, logit]` pairs, largest first.
    pub top: Vec<(u32, f32)>,
}

/// The JSON object `--json` prints.
#[derive(Serialize)]
pub struct RunJson {
    /// Prompt ids.
    pub input_ids: Vec<u32>,
    /// Generated ids.
    pub output_ids: Vec<u32>,
    /// Generated text (special tokens skipped, cut before a stop string;
    /// empty without a tokenizer).
    pub text: String,
    /// Per-step top logits (with `--top-logits`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<StepJson>>,
    /// Why generation ended: `stop` (end-of-sequence or a stop string) or
    /// `length` (`--max-new-tokens` or the end of the context).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<&'static str>,
    /// The sampling seed (absent when decoding greedily).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Counts and speeds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

fn prompt_ids(prompt: &Prompt, model: &Model) -> Result<Vec<u32>> {
    Ok(match prompt {
        Prompt::Ids(ids) => ids.clone(),
        Prompt::Text { text, chat, system } => {
            if *chat {
                let mut messages: Vec<ChatMessage> = system
                    .iter()
                    .map(|s| ChatMessage::new("system", s.clone()))
                    .collect();
                messages.push(ChatMessage::new("user", text.clone()));
                model.encode_chat(&messages)?
            } else {
                model.encode(text)?
            }
        }
    })
}

/// Checks flags that need a tokenizer or `--json` before anything loads.
fn check_flags(opts: &RunOptions, has_tokenizer: bool) -> Result<()> {
    if opts.top_logits.is_some() && !opts.json {
        bail!("--top-logits only shows in the JSON output: add --json");
    }
    if !opts.sampling.stop.is_empty() && !has_tokenizer {
        bail!("--stop matches text, and this plan has no tokenizer to make text: drop --stop");
    }
    if matches!(&opts.prompt, Prompt::Text { .. }) && !has_tokenizer {
        bail!("this plan has no tokenizer; pass --input-ids instead of --prompt");
    }
    if opts.grammar.is_some() && !has_tokenizer {
        bail!(
            "--json-schema, --json-object and --grammar constrain text, and this plan has no \
             tokenizer to make text: drop them"
        );
    }
    Ok(())
}

/// Runs generation; prints streamed text, or one JSON object with `json`.
pub async fn run(plan_path: &std::path::Path, opts: &RunOptions) -> Result<()> {
    let plan = PlanFile::open(plan_path)?;
    check_flags(opts, plan.header.text.tokenizer.is_some())?;
    let resolved = opts.sampling.resolve(&plan.header.text.generation)?;
    if let Some(seed) = resolved.seed {
        tracing::info!(seed, "sampling");
    }
    let mut settings = resolved.settings;
    settings.top_logits = opts.top_logits;
    let mut model = Model::load(&plan, &opts.model).await?;
    drop(plan);
    let input_ids = prompt_ids(&opts.prompt, &model)?;
    if input_ids.is_empty() {
        bail!("the prompt has no tokens");
    }
    let mut out = Stdout::new();
    if settings.max_new_tokens == 0 {
        let line = if opts.json {
            let json = RunJson {
                input_ids,
                output_ids: vec![],
                text: String::new(),
                steps: opts.top_logits.map(|_| vec![]),
                finish_reason: None,
                seed: None,
                timings: None,
            };
            serde_json::to_string(&json)?
        } else {
            let ids: Vec<String> = input_ids.iter().map(|i| i.to_string()).collect();
            ids.join(",")
        };
        out.write(&format!("{line}\n"))?;
        return Ok(());
    }
    let tokenizer = model.codec().is_some();
    let constraint = match &opts.grammar {
        Some(grammar) => Some(Grammars::new(&model)?.constraint(grammar)?),
        None => None,
    };
    let mut generation = model.generate(&input_ids, &settings)?;
    if let Some(c) = constraint {
        generation.constrain(Box::new(c))?;
    }
    let mut steps = Vec::new();
    let mut text = String::new();
    while let Some(piece) = generation.next().await {
        let piece = piece?;
        if let Some(top) = piece.top {
            steps.push(StepJson {
                token: piece.token,
                top,
            });
        }
        text.push_str(&piece.text);
        if opts.json {
            continue;
        }
        let shown = if tokenizer {
            piece.text
        } else {
            format!("{} ", piece.token)
        };
        if !out.write(&shown)? {
            // The reader is gone: stop generating, quietly.
            return Ok(());
        }
    }
    let stats = generation.stats();
    let finish = generation.finish_reason();
    let output_ids = generation.tokens().to_vec();
    drop(generation);
    if opts.json {
        let json = RunJson {
            input_ids,
            output_ids,
            text,
            steps: opts.top_logits.map(|_| steps),
            finish_reason: finish.map(FinishReason::name),
            seed: resolved.seed,
            timings: Some(Timings::of(&stats)),
        };
        out.write(&format!("{}\n", serde_json::to_string(&json)?))?;
    } else {
        out.write("\n")?;
    }
    if !opts.quiet {
        note(&timing_line(&stats, finish));
    }
    Ok(())
}

/// Settings of `gerbil-run bench`.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Tokens to decode.
    pub new_tokens: usize,
    /// Tokens of context before the timed decode (`None`: the prompt's).
    pub depth: Option<usize>,
    /// How decode chooses tokens (greedy by default).
    pub sampling: SamplingParams,
    /// Timed repetitions (the median is reported).
    pub repeats: usize,
    /// Also time every dispatch of one prefill and one decode step.
    pub profile: bool,
    /// Which precision variant runs.
    pub precision: PrecisionChoice,
    /// Run the plan's variant of this name instead of the best one.
    pub variant: Option<String>,
    /// Where compiled pipelines are kept between runs (`None`: nowhere).
    pub pipeline_cache: Option<PipelineCacheOptions>,
    /// Run on this adapter of `gerbil-run devices` (`None`: the default).
    pub adapter: Option<usize>,
    /// Use the tensor-core variant where the adapter has cooperative
    /// matrices ([`SessionOptions::tensor_cores`]).
    pub tensor_cores: bool,
    /// Whether the first prompt may run on the prefill fallback
    /// ([`SessionOptions::prefill_fallback`]; the timed ones never do).
    pub prefill_fallback: PrefillFallback,
    /// Also time batch steps of this many sequences (`--batch`; a plan
    /// compiled with `--max-batch` at least this).
    pub batch: Option<usize>,
}

/// GPU time of one kind of dispatch in a step.
#[derive(Clone, Debug, Serialize)]
pub struct ProfileRow {
    /// What ran: the IR label without its layer numbers (`attn.sdpa`,
    /// `attn.q_proj+k_proj+v_proj`, `mlp.residual+input_norm`, `lm_head`, …),
    /// so fused nodes keep their own names and group over layers.
    pub what: String,
    /// Dispatches of this kind in the step.
    pub count: usize,
    /// Their summed GPU time in microseconds.
    pub micros: f64,
    /// Bytes they move per second, in GB/s (estimated bytes, see
    /// `gerbil_runtime::profile`).
    pub gb_s: f64,
    /// `gb_s` as a fraction of the device's measured copy bandwidth.
    pub of_copy: f64,
    /// Floating-point operations per second, in TFLOP/s (matmuls; 0 for
    /// kinds whose arithmetic the plan does not count).
    pub tflop_s: f64,
}

/// The rows of a profile: `times` grouped by what ran, longest first.
pub(crate) fn summarize(times: &[gerbil_runtime::DispatchTime], copy_gb_s: f64) -> Vec<ProfileRow> {
    let mut by: std::collections::BTreeMap<String, (usize, f64, u64, u64)> = Default::default();
    for t in times {
        let what = t.group.clone();
        let e = by.entry(what).or_default();
        e.0 += 1;
        e.1 += t.nanos / 1000.0;
        e.2 += t.bytes;
        e.3 += t.flops;
    }
    let mut rows: Vec<ProfileRow> = by
        .into_iter()
        .map(|(what, (count, micros, bytes, flops))| {
            let gb_s = bytes as f64 / (micros * 1e3).max(1e-9);
            ProfileRow {
                what,
                count,
                micros,
                gb_s,
                of_copy: gb_s / copy_gb_s.max(1e-9),
                tflop_s: flops as f64 / (micros * 1e6).max(1e-9),
            }
        })
        .collect();
    rows.sort_by(|a, b| b.micros.total_cmp(&a.micros));
    rows
}

/// Benchmark results.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Adapter name.
    pub device: String,
    /// The plan variant that ran (the best one the device supports at the
    /// precision asked for).
    pub variant: String,
    /// The variant the first prompt ran on: `variant`, or its prefill
    /// fallback while `variant`'s pipelines compiled
    /// ([`gerbil_runtime::PrefillFallback`]).
    pub first_prefill_variant: String,
    /// Its precision: `f32` or `f16` (what `--precision auto` chose).
    pub precision: String,
    /// Prompt tokens per second (median).
    pub prefill_tok_s: f64,
    /// Generated tokens per second (median), greedy, as `generate` runs it.
    pub decode_tok_s: f64,
    /// How decode chose tokens: `gpu-argmax` or `gpu-sample` (no CPU in the
    /// loop, steps encoded ahead) or `cpu` (each step's logits read back:
    /// plans compiled without the `next_token` output).
    pub decode_loop: String,
    /// Milliseconds per decode step (median).
    pub decode_ms_per_token: f64,
    /// Tokens in the KV cache when the timed decode started.
    pub decode_depth: usize,
    /// Milliseconds to open the plan and make its session: device, buffers,
    /// weight upload, pipelines, bind groups.
    pub load_ms: f64,
    /// Milliseconds from the start to the first token of a `--prompt-tokens`
    /// prompt: the load, then the prompt's prefill, the first one with
    /// these pipelines.
    pub first_token_ms: f64,
    /// Of `load_ms`: reading the plan file's header.
    pub load_plan_ms: f64,
    /// Of `load_ms`: opening the GPU device.
    pub load_device_ms: f64,
    /// Of `load_ms`: allocating the buffers and uploading the weights.
    pub load_weights_ms: f64,
    /// Of `load_ms`: creating the kernels' layouts and opening the
    /// pipeline cache (a pipeline is created when a step first runs it:
    /// `first_token_pipelines_ms`, `pipelines_ms`).
    pub load_pipelines_ms: f64,
    /// Of `first_token_ms`: creating the pipelines the prompt's steps run
    /// (through the pipeline cache).
    pub first_token_pipelines_ms: f64,
    /// Pipelines created for the prompt's first token.
    pub first_token_pipelines: usize,
    /// Milliseconds the bench's session spent creating pipelines (every kind
    /// of step it ran; `--batch` runs open sessions of their own).
    pub pipelines_ms: f64,
    /// What the on-disk pipeline cache did: `warm` (a stored cache was
    /// used), `cold` (none yet, unusable, or `--cold`; written for the next
    /// run), `off` (`--no-pipeline-cache`) or `unsupported` (the device
    /// cannot keep one).
    pub pipeline_cache: String,
    /// Pipelines the bench's session created (kernels of the variant that
    /// ran, each when a step first ran it).
    pub pipelines: usize,
    /// Threads that created them.
    pub pipeline_threads: usize,
    /// The plan's prefill chunk: most prompt tokens one step runs.
    pub max_tokens_per_step: u64,
    /// GPU bytes of weights.
    pub weights_bytes: u64,
    /// GPU bytes of KV cache.
    pub kv_cache_bytes: u64,
    /// GPU bytes of activations and I/O buffers.
    pub activation_bytes: u64,
    /// Dispatches per prefill step (of the prompt's first chunk) and per
    /// decode step.
    pub dispatches: (usize, usize),
    /// GPU time by dispatch kind of one prefill step (with `profile`).
    pub prefill_profile: Option<Vec<ProfileRow>>,
    /// The device's copy bandwidth in GB/s (read + write), the roofline of
    /// the profiles' `of_copy` (with `profile`).
    pub copy_gb_s: Option<f64>,
    /// GPU time by dispatch kind of one decode step (with `profile`).
    pub decode_profile: Option<Vec<ProfileRow>>,
    /// Batch steps (with `--batch B`): `B` sequences from the same depth
    /// decoded together, greedy, tokens chosen on the CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchBench>,
}

/// What `bench --batch B` measured.
#[derive(Clone, Debug, Serialize)]
pub struct BatchBench {
    /// Sequences per step.
    pub rows: usize,
    /// Generated tokens per second over all of them (median).
    pub tok_s: f64,
    /// Milliseconds per batch step (median).
    pub ms_per_step: f64,
    /// `tok_s` over the single-sequence `decode_tok_s`.
    pub vs_one: f64,
    /// GPU time by dispatch kind of one batch step (with `profile`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<Vec<ProfileRow>>,
}

/// Seconds for `new` decode steps from `depth` tokens of context (`context`
/// holds at least one token: the first decode step's input at depth 0),
/// choosing with `sampling` as `generate` does: on the GPU when the plan
/// allows (the caller has set the session's sampling).
pub(crate) async fn time_decode(
    session: &mut Session,
    context: &[u32],
    depth: usize,
    new: usize,
    sampling: &SamplingParams,
) -> Result<f64> {
    session.reset();
    let mut t = Instant::now();
    // At depth 0 the first timed step is the one that reads `context[0]`.
    let mut logits = if depth == 0 {
        session.forward(&context[..1]).await?
    } else {
        let l = session.forward(&context[..depth]).await?;
        t = Instant::now();
        l
    };
    let steps = if depth == 0 {
        new.saturating_sub(1)
    } else {
        new
    };
    if session.can_sample_on_gpu(sampling) {
        session
            .decode_on_gpu(
                steps + 1,
                &[],
                (
                    gerbil_runtime::DECODE_BATCH,
                    gerbil_runtime::DECODE_BATCH_MOST,
                ),
                |_| true,
            )
            .await?;
    } else {
        let sampler = gerbil_runtime::Sampler::new(*sampling)?;
        for _ in 0..steps {
            let position = session.position().saturating_sub(1) as u32;
            let next = sampler.sample(&logits, position);
            logits = session.forward(&[next]).await?;
        }
    }
    Ok(t.elapsed().as_secs_f64())
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// `n` token ids below `vocab` that look like text to no model: the same
/// for every run, so timings compare. In u64, since `n` may be a whole
/// context (the product of a u32 would wrap).
pub(crate) fn synthetic_ids(n: usize, vocab: u32) -> Vec<u32> {
    let vocab = u64::from(vocab.max(1));
    (0..n as u64)
        .map(|i| ((i * 7919 + 13) % vocab) as u32)
        .collect()
}

/// `bench`'s sizes against the plan's context `max`: a prompt of 1 to
/// `max` tokens, at least one decode step, and the decode depth plus the
/// new tokens within the context (added without wrapping).
fn check_bench_sizes(prompt: usize, depth: usize, new: usize, max: usize) -> Result<()> {
    if prompt == 0 {
        bail!("--prompt-tokens 0: bench times a prompt of at least 1 token; give 1 or more");
    }
    if prompt > max {
        bail!(
            "--prompt-tokens {prompt} exceeds the plan's context of {max} tokens; pick at most \
             {max}, or recompile with a larger --max-context"
        );
    }
    if new == 0 {
        bail!("--new-tokens 0: bench times at least 1 decode step; give 1 or more");
    }
    if depth.checked_add(new).is_none_or(|end| end > max) {
        bail!(
            "the decode depth {depth} (--depth, else --prompt-tokens) + --new-tokens {new} \
             exceeds the plan's context of {max} tokens; make them add up to at most {max}"
        );
    }
    Ok(())
}

/// Times prefill and decode (greedy unless `opts.sampling` samples) on
/// synthetic token ids.
pub async fn bench(plan_path: &std::path::Path, opts: BenchOptions) -> Result<BenchReport> {
    let start = Instant::now();
    let plan = PlanFile::open(plan_path)?;
    let max = plan.header.model.max_context as usize;
    let depth = opts.depth.unwrap_or(opts.prompt_tokens);
    check_bench_sizes(opts.prompt_tokens, depth, opts.new_tokens, max)?;
    let session_opts = SessionOptions {
        precision: opts.precision,
        variant: opts.variant.clone(),
        profiling: opts.profile,
        pipeline_cache: opts.pipeline_cache.clone(),
        adapter: opts.adapter,
        tensor_cores: opts.tensor_cores,
        prefill_fallback: opts.prefill_fallback,
        ..crate::env::session_defaults()
    };
    let plan_s = start.elapsed().as_secs_f64();
    let mut session = Session::open(&plan, &session_opts).await?;
    let load_s = start.elapsed().as_secs_f64();
    let vocab = session.vocab_size() as u32;
    gerbil_runtime::Sampler::new(opts.sampling)?;
    session.set_sampling(&opts.sampling);
    let synthetic = |n: usize| synthetic_ids(n, vocab);
    let prompt = synthetic(opts.prompt_tokens);
    // Warm-up: pipelines, first-use costs. Its logits give the first token.
    session.reset();
    session.forward(&prompt).await?;
    let first_token_s = start.elapsed().as_secs_f64();
    let first_pipelines = session.pipeline_stats();
    let first_prefill_variant = session.prefill_variant().to_string();
    // Warm-up of a decode step (its pipelines), outside the timed runs; from
    // an empty cache, as the prompt may fill the context. The timed prompts
    // run on the variant itself, never its prefill fallback.
    session.reset();
    session.forward(&prompt[..1]).await?;
    session.create_step_pipelines().await?;
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    for _ in 0..opts.repeats.max(1) {
        session.reset();
        let t0 = Instant::now();
        session.forward(&prompt).await?;
        prefill.push(t0.elapsed().as_secs_f64());
        decode.push(
            time_decode(
                &mut session,
                &synthetic(depth.max(1)),
                depth,
                opts.new_tokens,
                &opts.sampling,
            )
            .await?,
        );
    }
    let batch = match opts.batch {
        Some(rows) => {
            let mut times = Vec::new();
            let mut profile = None;
            let context = synthetic(depth.max(1));
            for _ in 0..opts.repeats.max(1) {
                let (s, p) =
                    time_batch(&plan, &session_opts, rows, &context, opts.new_tokens).await?;
                times.push(s);
                profile = p;
            }
            let step_s = median(times) / opts.new_tokens.max(1) as f64;
            Some((rows, step_s, profile))
        }
        None => None,
    };
    let (mut prefill_profile, mut decode_profile, mut copy_gb_s) = (None, None, None);
    if opts.profile {
        session.reset();
        let chunk = prompt
            .len()
            .min(plan.header.model.max_tokens_per_step as usize);
        let copy = session.copy_bandwidth().await? / 1e9;
        copy_gb_s = Some(copy);
        prefill_profile = Some(summarize(&session.profile(&prompt[..chunk]).await?, copy));
        decode_profile = Some(summarize(&session.profile(&prompt[..1]).await?, copy));
    }
    let prefill_s = median(prefill);
    let decode_s = median(decode);
    let mem = session.memory();
    let loaded = session.load_report();
    let pipelines = session.pipeline_stats();
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    Ok(BenchReport {
        device: format!(
            "{} ({:?})",
            session.gpu().adapter.name,
            session.gpu().adapter.backend
        ),
        prefill_tok_s: opts.prompt_tokens as f64 / prefill_s,
        decode_tok_s: opts.new_tokens as f64 / decode_s,
        decode_ms_per_token: decode_s * 1000.0 / opts.new_tokens.max(1) as f64,
        decode_depth: depth,
        load_ms: load_s * 1000.0,
        first_token_ms: first_token_s * 1000.0,
        load_plan_ms: plan_s * 1000.0,
        load_device_ms: ms(loaded.device),
        load_weights_ms: ms(loaded.buffers + loaded.weights),
        load_pipelines_ms: ms(loaded.pipelines),
        pipeline_cache: loaded.pipeline_cache.name().to_string(),
        first_token_pipelines_ms: ms(first_pipelines.time),
        first_token_pipelines: first_pipelines.created,
        pipelines_ms: ms(pipelines.time),
        pipelines: pipelines.created,
        pipeline_threads: pipelines.threads,
        max_tokens_per_step: plan.header.model.max_tokens_per_step,
        weights_bytes: mem.weights,
        kv_cache_bytes: mem.kv_cache,
        activation_bytes: mem.activations,
        variant: session.variant().name.clone(),
        first_prefill_variant,
        precision: session.variant().precision.name().to_string(),
        decode_loop: match (
            session.can_sample_on_gpu(&opts.sampling),
            opts.sampling.is_greedy(),
        ) {
            (true, true) => "gpu-argmax".into(),
            (true, false) => "gpu-sample".into(),
            (false, _) => "cpu".into(),
        },
        dispatches: (
            session
                .variant()
                .prefill_at((opts.prompt_tokens as u64).min(plan.header.model.max_tokens_per_step))
                .len(),
            session.variant().decode.len(),
        ),
        prefill_profile,
        copy_gb_s,
        decode_profile,
        batch: batch.map(|(rows, step_s, profile)| {
            let tok_s = rows as f64 / step_s;
            BatchBench {
                rows,
                tok_s,
                ms_per_step: step_s * 1000.0,
                vs_one: tok_s / (opts.new_tokens as f64 / decode_s),
                profile: profile.zip(copy_gb_s).map(|(p, copy)| summarize(&p, copy)),
            }
        }),
    })
}

/// One batch step of `rows`, each row's next token its greedy choice: the
/// GPU's where the plan chooses there (as a served batch of greedy
/// requests does), else the CPU's from the row's logits.
async fn greedy_batch_step(session: &mut Session, rows: &mut [(usize, u32)]) -> Result<()> {
    let out = session.forward_batch_select(rows, |_| false).await?;
    for (i, row) in rows.iter_mut().enumerate() {
        row.1 = match (out.tokens[i], &out.logits[i]) {
            (Some(token), _) => token,
            (None, Some(logits)) => gerbil_runtime::argmax(logits),
            (None, None) => bail!("the batch step returned neither a token nor logits"),
        };
    }
    Ok(())
}

/// Seconds for `new` batch steps of `rows` sequences, each in its own slot
/// with `context` run first, greedy ([`greedy_batch_step`]); with `opts.profiling`, the dispatch times of
/// one more step.
async fn time_batch(
    plan: &PlanFile,
    opts: &SessionOptions,
    rows: usize,
    context: &[u32],
    new: usize,
) -> Result<(f64, Option<Vec<gerbil_runtime::DispatchTime>>)> {
    let max = plan.header.io.max_batch as usize;
    if rows == 0 || rows > max {
        bail!(
            "--batch {rows}: this plan's batch steps take 1 to {max} sequences (0: it has no batch \
             schedule); compile it with `gerbilc compile --max-batch N`"
        );
    }
    let opts = SessionOptions {
        slots: rows,
        ..opts.clone()
    };
    let mut session = Session::open(plan, &opts).await?;
    let mut next = Vec::with_capacity(rows);
    for slot in 0..rows {
        session.set_slot(slot)?;
        let logits = session.forward(context).await?;
        next.push((slot, gerbil_runtime::argmax(&logits)));
    }
    // Warm-up: the batch pipelines' first use; and no background compile
    // left to share the GPU's host with the timed steps.
    greedy_batch_step(&mut session, &mut next).await?;
    session.create_step_pipelines().await?;
    let t = Instant::now();
    for _ in 0..new {
        greedy_batch_step(&mut session, &mut next).await?;
    }
    let seconds = t.elapsed().as_secs_f64();
    let profile = match opts.profiling {
        true => Some(session.profile_batch(&next).await?),
        false => None,
    };
    Ok((seconds, profile))
}
