//! Continuous batching on the model thread: the requests in flight are
//! decoded together, one batch step a token, and a new request joins at the
//! next step instead of waiting for the others to end.
//!
//! [`serve_batched`] runs while the queue is open and the GPU is not lost:
//! it takes new jobs while the batch has room (blocking only when nothing
//! runs), starts each — placed in a free KV-cache slot — then runs one
//! [`gerbil::Batch::step`] (a chunk of a new prompt, then one token of every
//! other request) and sends each request its piece. A request whose client
//! is gone is removed at its next piece; one that ends gets its
//! `Finished` event and frees its slot. It needs a plan compiled with
//! `--max-batch` and a server with more than one slot; otherwise the worker
//! answers requests one at a time. The surprise: a request is `Started`
//! (its prompt checked and placed) before any of its prompt has run; a long
//! prompt then runs one prefill chunk per step, so it delays the others'
//! next token by a chunk at a time, never by its whole length.

use crate::metrics::Metrics;
use crate::openai::PromptInput;
use crate::worker::{Event, Job};
use gerbil::{Batch, FinishReason, GenerationStats, Model};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};

/// Why [`serve_batched`] returned.
pub(crate) enum Exit {
    /// The queue closed: the server is shutting down.
    Closed,
    /// The GPU was lost: load the model again.
    Lost(String),
}

/// Whether `model` can answer requests together.
pub(crate) fn can_batch(model: &Model) -> bool {
    model.session().header().io.max_batch > 0 && model.session().slots() > 1
}

/// A request in the batch.
struct Running {
    events: tokio::sync::mpsc::UnboundedSender<Event>,
    slot: usize,
}

/// Answers jobs from `queue` together until the queue closes or the GPU is
/// lost; `waiting` counts the jobs queued.
pub(crate) fn serve_batched(
    model: &mut Model,
    queue: &Receiver<Job>,
    waiting: &AtomicUsize,
    metrics: &Metrics,
) -> Exit {
    let Ok(mut batch) = model.batch() else {
        return Exit::Closed;
    };
    let mut running: HashMap<usize, Running> = HashMap::new();
    loop {
        // Take new requests while there is room; wait only when idle.
        while running.len() < batch.capacity() {
            let job = if running.is_empty() {
                match queue.recv() {
                    Ok(job) => job,
                    Err(_) => return Exit::Closed,
                }
            } else {
                match queue.try_recv() {
                    Ok(job) => job,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return Exit::Closed,
                }
            };
            waiting.fetch_sub(1, Ordering::SeqCst);
            admit(&mut batch, job, &mut running, metrics);
            if let Some(why) = batch.model().session().gpu().lost() {
                fail_all(&mut running, &why);
                return Exit::Lost(why);
            }
        }
        report(&running, metrics);
        if running.is_empty() {
            continue;
        }
        let pieces = match pollster::block_on(batch.step()) {
            Ok(pieces) => pieces,
            Err(e) => {
                tracing::error!("a batch step failed: {e}");
                let why = e.to_string();
                fail_all(&mut running, &why);
                match batch.model().session().gpu().lost() {
                    Some(lost) => return Exit::Lost(lost),
                    None => continue,
                }
            }
        };
        // A request may get two pieces from one step (its first, then the
        // batch step's): send every piece before ending any request.
        let mut gone = Vec::new();
        let mut seen = Vec::new();
        for (id, piece) in pieces {
            let Some(r) = running.get(&id) else { continue };
            if !seen.contains(&id) {
                seen.push(id);
            }
            if r.events.send(Event::Text(piece.text, piece.token)).is_err() && !gone.contains(&id) {
                gone.push(id);
            }
        }
        for id in seen {
            if gone.contains(&id) {
                let stats = end(&mut batch, id, &mut running, metrics);
                tracing::info!(
                    "client disconnected: generation cancelled after {} tokens",
                    stats.generated_tokens
                );
            } else if let Some(reason) = batch.finish_reason(id) {
                finish(&mut batch, id, reason, &mut running, metrics);
            }
        }
    }
}

/// Starts `job` in the batch (or answers why it cannot run).
fn admit(
    batch: &mut Batch<'_>,
    job: Job,
    running: &mut HashMap<usize, Running>,
    metrics: &Metrics,
) {
    if job.events.is_closed() {
        tracing::info!("skipped a queued request: its client disconnected");
        return;
    }
    let prompt = match &job.prompt {
        PromptInput::Ids(ids) => Ok(ids.clone()),
        PromptInput::Chat(messages) => batch.model().encode_chat(messages),
        PromptInput::Text(text) => batch.model().encode(text),
        // Embedding plans have no batch schedule; a batching server never gets one.
        PromptInput::Embed(_) => {
            let _ = job
                .events
                .send(Event::Failed("an embedding job in a batch".into()));
            return;
        }
    };
    let prompt = match prompt {
        Ok(p) => p,
        Err(e) => {
            let _ = job.events.send(Event::Rejected(e));
            return;
        }
    };
    let constraint = job
        .constraint
        .map(|c| Box::new(c) as Box<dyn gerbil::TokenConstraint>);
    let id = match batch.start(&prompt, &job.settings, constraint) {
        Ok(s) => s,
        // The handler answers 400 for the request's faults, 503 for others.
        Err(e) => {
            let _ = job.events.send(Event::Rejected(e));
            return;
        }
    };
    let slot = batch.model().session().slot();
    running.insert(
        id,
        Running {
            events: job.events,
            slot,
        },
    );
    if running[&id].events.send(Event::Started).is_err() {
        end(batch, id, running, metrics);
    }
}

/// Sends a finished request its last event and frees its slot.
fn finish(
    batch: &mut Batch<'_>,
    id: usize,
    reason: FinishReason,
    running: &mut HashMap<usize, Running>,
    metrics: &Metrics,
) {
    let events = running.get(&id).map(|r| r.events.clone());
    let stats = end(batch, id, running, metrics);
    crate::worker::log_finished(&stats, reason);
    // Counted before the client hears the end, so a scrape that follows the
    // answer sees it.
    report(running, metrics);
    if let Some(events) = events {
        let _ = events.send(Event::Finished { reason, stats });
    }
}

/// Removes request `id` from the batch and counts it; its stats.
fn end(
    batch: &mut Batch<'_>,
    id: usize,
    running: &mut HashMap<usize, Running>,
    metrics: &Metrics,
) -> GenerationStats {
    running.remove(&id);
    let stats = batch.remove(id).map(|(_, stats)| stats).unwrap_or_default();
    crate::worker::count_finished(batch.model(), &stats, metrics);
    stats
}

/// Tells every running request the batch failed with `why`.
fn fail_all(running: &mut HashMap<usize, Running>, why: &str) {
    for (_, r) in running.drain() {
        let _ = r.events.send(Event::Failed(why.to_string()));
    }
}

/// What `/metrics` and `/slots` say is running.
fn report(running: &HashMap<usize, Running>, metrics: &Metrics) {
    metrics.running(running.len());
    metrics.active_slots(running.values().map(|r| r.slot).collect());
}
