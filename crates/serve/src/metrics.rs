//! What `GET /metrics` says, in Prometheus' text format: requests and
//! errors per endpoint, the queue, the request the model is running,
//! prompt, cached and generated tokens with the time spent on them, and
//! the KV cache in use; for an embedding plan, the requests, inputs and
//! tokens embedded and the model calls that did it (fewer calls than
//! requests: requests were batched).
//!
//! [`Metrics`] is shared by the handlers (requests and their errors) and
//! the model thread (tokens and times, once per finished or cancelled job,
//! and the KV cache after it); [`Metrics::render`] writes the exposition.
//! Every number is a relaxed atomic: a scrape may see one job's tokens
//! before its seconds, never a torn value. The surprise: token rates are
//! not exported as gauges — Prometheus derives them from the counters
//! (`rate(gerbil_generated_tokens_total[1m])`), so they stay right between
//! scrapes of any period.

use crate::openai::Endpoint;
use gerbil::GenerationStats;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The server's counters and gauges.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: [AtomicU64; 2],
    errors: [AtomicU64; 2],
    running: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    prefill_micros: AtomicU64,
    decode_micros: AtomicU64,
    /// Tokens each sequence slot's KV cache held after the last request.
    kv_tokens: Mutex<Vec<u64>>,
    /// The slots of the requests the model is answering now.
    active: Mutex<Vec<usize>>,
    embedding_requests: AtomicU64,
    embedding_batches: AtomicU64,
    embedding_inputs: AtomicU64,
    embedding_tokens: AtomicU64,
}

fn slot(endpoint: Endpoint) -> usize {
    match endpoint {
        Endpoint::Chat => 0,
        Endpoint::Completion => 1,
    }
}

impl Metrics {
    /// A request to `endpoint` arrived.
    pub fn request(&self, endpoint: Endpoint) {
        self.requests[slot(endpoint)].fetch_add(1, Ordering::Relaxed);
    }

    /// A request to `endpoint` ended in an error object.
    pub fn error(&self, endpoint: Endpoint) {
        self.errors[slot(endpoint)].fetch_add(1, Ordering::Relaxed);
    }

    /// The model thread is answering `n` requests now.
    pub fn running(&self, n: usize) {
        self.running.store(n as u64, Ordering::Relaxed);
    }

    /// The requests being answered run in these sequence slots.
    pub fn active_slots(&self, slots: Vec<usize>) {
        *self.active.lock().unwrap_or_else(|e| e.into_inner()) = slots;
    }

    /// A job's tokens and times, once it ended; `kv_tokens` what each
    /// slot's cache holds after it.
    pub fn finished(&self, stats: &GenerationStats, kv_tokens: &[usize]) {
        let add = |c: &AtomicU64, v: u64| c.fetch_add(v, Ordering::Relaxed);
        add(&self.prompt_tokens, stats.prompt_tokens as u64);
        add(&self.cached_tokens, stats.cached_tokens as u64);
        add(&self.generated_tokens, stats.generated_tokens as u64);
        add(&self.prefill_micros, stats.prefill.as_micros() as u64);
        add(&self.decode_micros, stats.decode.as_micros() as u64);
        let tokens = kv_tokens.iter().map(|&t| t as u64).collect();
        *self.kv_tokens.lock().unwrap_or_else(|e| e.into_inner()) = tokens;
    }

    /// `requests` embedding requests were answered together, embedding
    /// `inputs` in one call.
    pub fn embedded(&self, requests: usize, inputs: &[&[u32]]) {
        let add = |c: &AtomicU64, v: usize| c.fetch_add(v as u64, Ordering::Relaxed);
        add(&self.embedding_requests, requests);
        add(&self.embedding_batches, 1);
        add(&self.embedding_inputs, inputs.len());
        add(&self.embedding_tokens, inputs.iter().map(|i| i.len()).sum());
    }

    /// Whether a request runs in `slot` now.
    pub fn is_processing(&self, slot: usize) -> bool {
        self.running.load(Ordering::Relaxed) > 0
            && self
                .active
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&slot)
    }

    /// Tokens slot `slot`'s KV cache held after the last request.
    pub fn kv_tokens(&self, slot: usize) -> u64 {
        let tokens = self.kv_tokens.lock().unwrap_or_else(|e| e.into_inner());
        tokens.get(slot).copied().unwrap_or(0)
    }

    /// The exposition, with the queue's `waiting` jobs and the KV cache's
    /// `capacity` in tokens.
    pub fn render(&self, waiting: usize, capacity: u64) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let per_endpoint = |c: &[AtomicU64; 2]| {
            [("chat", 0), ("completion", 1)]
                .map(|(e, i)| (format!("{{endpoint=\"{e}\"}}"), get(&c[i]) as f64))
                .to_vec()
        };
        let one = |v: f64| vec![(String::new(), v)];
        family(
            "gerbil_requests_total",
            "counter",
            "Completion requests received.",
            &per_endpoint(&self.requests),
        );
        family(
            "gerbil_request_errors_total",
            "counter",
            "Completion requests answered with an error object.",
            &per_endpoint(&self.errors),
        );
        family(
            "gerbil_queue_waiting",
            "gauge",
            "Requests waiting for the model.",
            &one(waiting as f64),
        );
        family(
            "gerbil_requests_running",
            "gauge",
            "Requests the model is answering (more than 1 when embedding requests run together).",
            &one(get(&self.running) as f64),
        );
        family(
            "gerbil_prompt_tokens_total",
            "counter",
            "Prompt tokens of finished requests.",
            &one(get(&self.prompt_tokens) as f64),
        );
        family(
            "gerbil_prompt_cached_tokens_total",
            "counter",
            "Of those, tokens the KV cache held already.",
            &one(get(&self.cached_tokens) as f64),
        );
        family(
            "gerbil_generated_tokens_total",
            "counter",
            "Tokens generated.",
            &one(get(&self.generated_tokens) as f64),
        );
        family(
            "gerbil_prefill_seconds_total",
            "counter",
            "Time spent running prompts.",
            &one(get(&self.prefill_micros) as f64 / 1e6),
        );
        family(
            "gerbil_decode_seconds_total",
            "counter",
            "Time spent generating.",
            &one(get(&self.decode_micros) as f64 / 1e6),
        );
        family(
            "gerbil_kv_cache_tokens",
            "gauge",
            "Tokens held in the KV cache (every slot's) after the last request.",
            &one(self
                .kv_tokens
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .sum::<u64>() as f64),
        );
        family(
            "gerbil_kv_cache_capacity_tokens",
            "gauge",
            "Positions the KV cache holds (every slot's).",
            &one(capacity as f64),
        );
        family(
            "gerbil_embedding_requests_total",
            "counter",
            "Embedding requests answered.",
            &one(get(&self.embedding_requests) as f64),
        );
        family(
            "gerbil_embedding_batches_total",
            "counter",
            "Model calls that embedded one or more requests together.",
            &one(get(&self.embedding_batches) as f64),
        );
        family(
            "gerbil_embedding_inputs_total",
            "counter",
            "Inputs embedded.",
            &one(get(&self.embedding_inputs) as f64),
        );
        family(
            "gerbil_embedding_tokens_total",
            "counter",
            "Tokens of the inputs embedded.",
            &one(get(&self.embedding_tokens) as f64),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_exposition_counts_requests_tokens_and_times() {
        let m = Metrics::default();
        m.request(Endpoint::Chat);
        m.request(Endpoint::Chat);
        m.request(Endpoint::Completion);
        m.error(Endpoint::Chat);
        let stats = GenerationStats {
            prompt_tokens: 10,
            cached_tokens: 4,
            prefill: Duration::from_millis(250),
            generated_tokens: 7,
            decode: Duration::from_millis(1500),
        };
        m.finished(&stats, &[12, 5]);
        m.embedded(3, &[&[1, 2], &[3], &[4, 5, 6]]);
        let text = m.render(3, 2048);
        for line in [
            "gerbil_requests_total{endpoint=\"chat\"} 2",
            "gerbil_requests_total{endpoint=\"completion\"} 1",
            "gerbil_request_errors_total{endpoint=\"chat\"} 1",
            "gerbil_queue_waiting 3",
            "gerbil_prompt_cached_tokens_total 4",
            "gerbil_generated_tokens_total 7",
            "gerbil_prefill_seconds_total 0.25",
            "gerbil_decode_seconds_total 1.5",
            "gerbil_kv_cache_tokens 17",
            "gerbil_kv_cache_capacity_tokens 2048",
            "gerbil_embedding_requests_total 3",
            "gerbil_embedding_batches_total 1",
            "gerbil_embedding_inputs_total 3",
            "gerbil_embedding_tokens_total 6",
            "# TYPE gerbil_generated_tokens_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
