//! Batching across `/v1/embeddings` requests: the embedding jobs that
//! queued while the model was busy run together, in one GPU step when their
//! inputs fit one.
//!
//! The model thread calls [`gather`] with the embedding job it took; it
//! takes the embedding jobs already waiting, until their inputs would pass
//! a step's `max_inputs` or another kind of job comes (that one is handed
//! back to run next). [`run`] packs every gathered input into one
//! [`gerbil::Model::embed_ids`] call and sends each request its own vectors.
//! Nothing waits for company: an idle server embeds a lone request at once,
//! and a busy one batches the requests that arrived during the last step, so
//! many clients sending short texts share steps instead of queueing for one
//! each. The surprise: a request's bad input (an id past the vocabulary, an
//! input too long) must not fail the others packed with it, so each job's
//! inputs are checked before they join (`Session::check_embedding_inputs`)
//! and a faulty one gets its 400 alone.

use crate::metrics::Metrics;
use crate::openai::PromptInput;
use crate::worker::{Event, Job};
use gerbil::{Error as ModelError, Model};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;

/// The inputs of an embedding job (none for another kind).
fn inputs(job: &Job) -> &[Vec<u32>] {
    match &job.prompt {
        PromptInput::Embed(inputs) => inputs,
        _ => &[],
    }
}

/// `first` and the embedding jobs queued behind it, while their inputs fit
/// `max_inputs`; and the job taken that does not join them, to run next.
pub(crate) fn gather(
    first: Job,
    queue: &Receiver<Job>,
    waiting: &AtomicUsize,
    max_inputs: usize,
) -> (Vec<Job>, Option<Job>) {
    let mut count = inputs(&first).len();
    let mut jobs = vec![first];
    while count < max_inputs {
        let Ok(job) = queue.try_recv() else { break };
        waiting.fetch_sub(1, Ordering::SeqCst);
        let n = inputs(&job).len();
        if !matches!(job.prompt, PromptInput::Embed(_)) || count + n > max_inputs {
            return (jobs, Some(job));
        }
        count += n;
        jobs.push(job);
    }
    (jobs, None)
}

/// Embeds every input of `jobs` in one call and sends each job its vectors
/// (jobs whose client left are skipped; a job with an input the model
/// cannot take gets its 400 and is left out).
pub(crate) fn run(model: &mut Model, jobs: Vec<Job>, metrics: &Metrics) {
    let mut ready = Vec::with_capacity(jobs.len());
    for job in jobs {
        if job.events.is_closed() {
            continue;
        }
        let mine: Vec<&[u32]> = inputs(&job).iter().map(Vec::as_slice).collect();
        match model.session().check_embedding_inputs(&mine) {
            Ok(()) => ready.push(job),
            Err(e) => {
                let _ = job.events.send(Event::Rejected(ModelError::Runtime(e)));
            }
        }
    }
    if ready.is_empty() {
        return;
    }
    let all: Vec<&[u32]> = ready
        .iter()
        .flat_map(|j| inputs(j).iter().map(Vec::as_slice))
        .collect();
    match pollster::block_on(model.embed_ids(&all)) {
        Ok(vectors) => {
            metrics.embedded(ready.len(), &all);
            let mut vectors = vectors.into_iter();
            for job in ready {
                let mine = vectors.by_ref().take(inputs(&job).len()).collect();
                let _ = job.events.send(Event::Vectors(mine));
            }
        }
        // Checked inputs: the GPU failed (a 500 for each).
        Err(e) => {
            for job in ready {
                let _ = job.events.send(Event::Failed(e.to_string()));
            }
        }
    }
}
