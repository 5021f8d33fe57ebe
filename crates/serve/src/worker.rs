//! The one thread that owns the [`Model`]: it takes [`Job`]s from a FIFO
//! queue, one at a time (or, for an embedding plan, the embedding requests
//! waiting together: [`crate::embedding_batches`]; for a plan compiled with
//! `--max-batch`, the requests in flight together: `crate::batching`), and
//! sends each job's [`Event`]s back to its HTTP handler.
//!
//! Start it with [`Worker::start`], which loads the plan on the new thread
//! and returns once the model is ready; give it work with [`Queue::submit`]
//! and read the events from the returned receiver. At most `max_waiting`
//! jobs wait for the model (the one it runs not counted); past that,
//! `submit` refuses with [`Submit::Full`]. The first event is
//! [`Event::Started`] or [`Event::Rejected`] (the prompt could not be
//! tokenized, or does not fit the context, or the settings are wrong), then
//! [`Event::Text`] per token and one [`Event::Finished`] (or
//! [`Event::Failed`]).
//!
//! The surprise is why a thread and not a task: the runtime is `async`, but
//! on native targets its futures block in `device.poll` while the GPU works,
//! which would stall a tokio worker thread and every connection on it. So
//! GPU work runs here under `pollster::block_on`, one token at a time, and
//! the handlers only await channels. A job whose receiver is gone (the
//! client disconnected: axum drops the response stream or the handler
//! future) fails its next send, and the worker drops the generation — which
//! cancels it and leaves the KV cache consistent — and takes the next job.
//! A job that loses the GPU fails with a 500 naming the loss, and the worker
//! loads the model again on a fresh device before the next job.

use crate::metrics::Metrics;
use crate::openai::PromptInput;
use crate::structured::ToolStyle;
use anyhow::{Context, Result};
use gerbil::{
    Error as ModelError, FinishReason, GenerationSettings, GenerationStats, Model, ModelOptions,
    TextCodec,
};
use gerbil_grammar::{GrammarConstraint, Grammars};
use gerbil_plan::{GenerationDefaults, PlanFile};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// One request for the model.
pub struct Job {
    /// What to tokenize.
    pub prompt: PromptInput,
    /// How to generate.
    pub settings: GenerationSettings,
    /// The grammar every token must follow.
    pub constraint: Option<GrammarConstraint>,
    /// Where the events go.
    pub(crate) events: UnboundedSender<Event>,
}

/// What the worker tells a handler about its job.
#[derive(Debug)]
pub enum Event {
    /// The prompt is tokenized and fits; generation begins.
    Started,
    /// The job cannot run (a 400): tokenizer, chat template, settings or
    /// context.
    Rejected(ModelError),
    /// One token: its id and its text (possibly empty: half a character,
    /// or text that may begin a stop string, is held back).
    Text(String, u32),
    /// The generation ended.
    Finished {
        reason: FinishReason,
        stats: GenerationStats,
    },
    /// The GPU failed during the generation (a 500).
    Failed(String),
    /// An embedding job's vectors, one per input.
    Vectors(Vec<Vec<f32>>),
}

/// What the handlers need to know of the loaded model.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The model's `generation_config.json` settings.
    pub defaults: GenerationDefaults,
    /// Positions of the KV cache.
    pub context: u64,
    /// Its tokenizer and chat template, for the handlers to tokenize with
    /// (`None`: the plan has none that loads; the model thread then refuses
    /// text with the model's own error).
    pub codec: Option<Arc<TextCodec>>,
    /// The codec's [`TextCodec::longest_token_bytes`]: a prompt of more
    /// than twice the context times this many bytes is refused before it is
    /// tokenized.
    pub longest_token: usize,
    /// The grammar compiler for structured output and tools, or why the
    /// model has none (no tokenizer, a vocabulary llguidance cannot take).
    pub grammars: Result<Arc<Grammars>, String>,
    /// How the model writes tool calls.
    pub tool_style: ToolStyle,
    /// Sequence slots the KV cache keeps (the prefix cache across requests).
    pub slots: usize,
    /// The plan's batch size (0: no batch schedule, one request at a time).
    pub max_batch: u32,
    /// What an embedding plan's vectors are (`None`: a language model).
    pub embedding: Option<gerbil_plan::EmbeddingInfo>,
}

/// The worker thread and its queue.
pub struct Worker {
    jobs: mpsc::Sender<Job>,
    /// Jobs queued and not yet taken by the model thread.
    waiting: Arc<AtomicUsize>,
    max_waiting: usize,
    thread: JoinHandle<()>,
}

impl Worker {
    /// Loads `plan` on a new thread and returns once it is ready (or why it
    /// could not load).
    pub fn start(
        plan: PathBuf,
        opts: ModelOptions,
        max_waiting: usize,
        metrics: Arc<Metrics>,
    ) -> Result<(Worker, ModelInfo)> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let waiting = Arc::new(AtomicUsize::new(0));
        let taken = Arc::clone(&waiting);
        let (ready_tx, ready_rx) = mpsc::channel::<Result<ModelInfo>>();
        let thread = std::thread::Builder::new()
            .name("gerbil-model".into())
            .spawn(move || {
                let loaded = pollster::block_on(load(&plan, &opts));
                let mut model = match loaded {
                    Ok((model, info)) => {
                        let _ = ready_tx.send(Ok(info));
                        model
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                // A job taken from the queue that did not join an embedding
                // batch: it runs next.
                let mut next: Option<Job> = None;
                let embedding_step = model.session().header().model.embedding.as_ref();
                let embedding_step = embedding_step.map(|e| (e.max_inputs as usize).max(1));
                loop {
                    if crate::batching::can_batch(&model) {
                        // A panic is a gerbil bug: the requests in flight fail
                        // (their channels close) and the server goes on.
                        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            crate::batching::serve_batched(&mut model, &queue, &taken, &metrics)
                        }));
                        metrics.running(0);
                        match served {
                            Ok(crate::batching::Exit::Closed) => break,
                            Ok(crate::batching::Exit::Lost(why)) => {
                                model = reload(&plan, &opts, model, &why);
                            }
                            Err(_) => {
                                tracing::error!("a batch panicked; the KV cache is cleared");
                                model.clear_cache();
                            }
                        }
                        continue;
                    }
                    let job = match next.take() {
                        Some(job) => job,
                        None => {
                            let Ok(job) = queue.recv() else { break };
                            taken.fetch_sub(1, Ordering::SeqCst);
                            job
                        }
                    };

                    // A panic is a gerbil bug; it fails its own request (the
                    // job's channel closes) and the server goes on.
                    metrics.running(1);
                    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        match embedding_step {
                            // Embedding requests queued behind this one join it.
                            Some(max) if matches!(job.prompt, PromptInput::Embed(_)) => {
                                let (jobs, rest) =
                                    crate::embedding_batches::gather(job, &queue, &taken, max);
                                next = rest;
                                metrics.running(jobs.len());
                                crate::embedding_batches::run(&mut model, jobs, &metrics)
                            }
                            _ => run_job(&mut model, job, &metrics),
                        }
                    }));
                    if ran.is_err() {
                        tracing::error!("a request panicked; the KV cache is cleared");
                        model.clear_cache();
                    }
                    metrics.running(0);
                    if let Some(why) = model.session().gpu().lost() {
                        model = reload(&plan, &opts, model, &why);
                    }
                }
            })
            .context("starting the model thread")?;
        let info = ready_rx
            .recv()
            .context("the model thread ended while loading")??;
        let worker = Worker {
            jobs,
            waiting,
            max_waiting,
            thread,
        };
        Ok((worker, info))
    }

    /// A handle that queues jobs (cloned into every handler).
    pub fn queue(&self) -> Queue {
        Queue {
            jobs: self.jobs.clone(),
            waiting: Arc::clone(&self.waiting),
            max_waiting: self.max_waiting,
        }
    }

    /// Waits for the jobs queued so far to finish, once every [`Queue`] is
    /// dropped.
    pub fn join(self) {
        drop(self.jobs);
        if self.thread.join().is_err() {
            tracing::error!("the model thread panicked");
        }
    }
}

/// Queues jobs for the worker, in arrival order.
#[derive(Clone)]
pub struct Queue {
    jobs: mpsc::Sender<Job>,
    waiting: Arc<AtomicUsize>,
    max_waiting: usize,
}

/// Why [`Queue::submit`] took no job.
#[derive(Debug, PartialEq, Eq)]
pub enum Submit {
    /// `max_waiting` jobs already wait.
    Full(usize),
    /// The worker has stopped.
    Stopped,
}

impl Queue {
    /// Requests waiting for the model now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Queues a job; its events arrive on the receiver.
    pub fn submit(
        &self,
        prompt: PromptInput,
        settings: GenerationSettings,
        constraint: Option<GrammarConstraint>,
    ) -> Result<UnboundedReceiver<Event>, Submit> {
        // Counted before it is sent, so the worker never takes one it has
        // not seen counted; refused (and uncounted) when the queue is full.
        let max = self.max_waiting;
        if self
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .is_err()
        {
            return Err(Submit::Full(max));
        }
        let (events, rx) = unbounded_channel();
        let job = Job {
            prompt,
            settings,
            constraint,
            events,
        };
        match self.jobs.send(job) {
            Ok(()) => Ok(rx),
            Err(_) => {
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                Err(Submit::Stopped)
            }
        }
    }
}

/// Opens the plan and loads the model.
async fn load(plan: &std::path::Path, opts: &ModelOptions) -> Result<(Model, ModelInfo)> {
    let plan = PlanFile::open(plan)?;
    let model = Model::load(&plan, opts).await?;
    // Every kernel now, so that no client waits for a compile.
    model.session().create_all_pipelines().await?;
    let grammars = Grammars::new(&model)
        .map(Arc::new)
        .map_err(|e| e.to_string());
    if let Err(why) = &grammars {
        tracing::warn!("no structured output or tool calls: {why}");
    }
    let info = ModelInfo {
        defaults: plan.header.text.generation,
        context: model.context(),
        codec: model.shared_codec(),
        longest_token: model.shared_codec().map_or(1, |c| c.longest_token_bytes()),
        grammars,
        tool_style: ToolStyle::of(model.codec()),
        slots: model.session().slots(),
        max_batch: model.session().header().io.max_batch,
        embedding: plan.header.model.embedding.clone(),
    };
    Ok((model, info))
}

/// After the GPU was lost (its request failed with a 500), the model loaded
/// again on a fresh device; `lost` again when that fails: the next request
/// then fails with the device-lost error, and the load is tried again after it.
fn reload(plan: &std::path::Path, opts: &ModelOptions, lost: Model, why: &str) -> Model {
    tracing::error!("the GPU was lost ({why}); loading the model again");
    match pollster::block_on(load(plan, opts)) {
        Ok((model, _)) => {
            tracing::info!("the model is loaded again");
            model
        }
        Err(e) => {
            tracing::error!(
                "could not load the model again: {e:#}; trying again after the next request"
            );
            lost
        }
    }
}

/// The log line of a request that ended: its tokens, speeds and finish reason.
pub(crate) fn log_finished(stats: &GenerationStats, reason: FinishReason) {
    tracing::info!(
        "prompt {} tokens ({} cached, {:.1} tok/s), generated {} tokens ({:.1} tok/s), finish reason {}",
        stats.prompt_tokens,
        stats.cached_tokens,
        stats.prefill_tokens_per_second(),
        stats.generated_tokens,
        stats.decode_tokens_per_second(),
        reason.name()
    );
}

/// Counts a request that ended in `metrics`, with what each slot's cache
/// holds after it.
pub(crate) fn count_finished(model: &Model, stats: &GenerationStats, metrics: &Metrics) {
    let held: Vec<usize> = (0..model.session().slots())
        .map(|s| model.slot_tokens(s).len())
        .collect();
    metrics.finished(stats, &held);
}

/// Runs one job to its end, or until its client is gone; counts it in
/// `metrics` when it generated (a rejected or failed job is not counted).
fn run_job(model: &mut Model, job: Job, metrics: &Metrics) {
    if job.events.is_closed() {
        tracing::info!("skipped a queued request: its client disconnected");
        return;
    }
    let prompt = match &job.prompt {
        PromptInput::Chat(messages) => model.encode_chat(messages),
        PromptInput::Text(text) => model.encode(text),
        PromptInput::Ids(ids) => Ok(ids.clone()),
        PromptInput::Embed(_) => {
            return crate::embedding_batches::run(model, vec![job], metrics);
        }
    };
    let prompt = match prompt {
        Ok(p) => p,
        Err(e) => {
            let _ = job.events.send(Event::Rejected(e));
            return;
        }
    };
    let mut generation = match model.generate(&prompt, &job.settings) {
        Ok(g) => g,
        Err(e) => {
            let _ = job.events.send(Event::Rejected(e));
            return;
        }
    };
    if let Some(c) = job.constraint {
        if let Err(e) = generation.constrain(Box::new(c)) {
            let _ = job.events.send(Event::Failed(e.to_string()));
            return;
        }
    }
    if job.events.send(Event::Started).is_err() {
        let stats = generation.stats();
        drop(generation);
        count_finished(model, &stats, metrics);
        return;
    }
    let mut first = true;
    while let Some(piece) = pollster::block_on(generation.next()) {
        if std::mem::take(&mut first) {
            // The prompt has run: its slot is chosen.
            metrics.active_slots(vec![generation.slot()]);
        }
        let event = match piece {
            Ok(piece) => Event::Text(piece.text, piece.token),
            Err(e) => {
                tracing::error!("generation failed: {e}");
                let _ = job.events.send(Event::Failed(e.to_string()));
                return;
            }
        };
        if job.events.send(event).is_err() {
            generation.cancel();
            let stats = generation.stats();
            drop(generation);
            count_finished(model, &stats, metrics);
            tracing::info!(
                "client disconnected: generation cancelled after {} tokens",
                stats.generated_tokens
            );
            return;
        }
    }
    let stats = generation.stats();
    let reason = generation.finish_reason().unwrap_or(FinishReason::Stop);
    drop(generation);
    log_finished(&stats, reason);
    // Counted before the client hears the end, so a scrape that follows the
    // answer sees it.
    count_finished(model, &stats, metrics);
    metrics.running(0);
    let _ = job.events.send(Event::Finished { reason, stats });
}
