//! `gerbil-run PLAN embed`: sentence embeddings from an embedding plan (an
//! encoder such as all-MiniLM-L6-v2), one JSON line per input.
//!
//! Inputs come from `--text` (repeatable), else from `--jsonl FILE` (each
//! line a JSON string, or an object with a `text` field; blank lines are
//! skipped), else from standard input, one text a line (a blank line is an
//! empty text, as `""` is). Each input's vector is printed as soon
//! as it is made, `{"index": i, "tokens": n, "embedding": [...]}`, so a
//! large file streams. The surprise: an input longer than the model takes
//! is an error unless `--truncate` is given, where sentence-transformers
//! would cut it silently.

use crate::console;
use anyhow::{bail, Context, Result};
use gerbil::{Model, ModelOptions};
use gerbil_plan::PlanFile;
use serde::Serialize;
use std::io::BufRead;
use std::path::{Path, PathBuf};

/// Where `embed` reads its texts.
#[derive(Clone, Debug)]
pub enum EmbedInput {
    /// These texts.
    Texts(Vec<String>),
    /// A JSONL file: a string, or an object with `text`, per line.
    Jsonl(PathBuf),
    /// Standard input, one text a line.
    Stdin,
}

/// Settings of `gerbil-run embed`.
#[derive(Clone, Debug)]
pub struct EmbedOptions {
    /// The texts.
    pub input: EmbedInput,
    /// Cut inputs longer than the model takes instead of failing.
    pub truncate: bool,
    /// How the plan is loaded.
    pub model: ModelOptions,
}

/// One output line.
#[derive(Serialize)]
struct Line<'a> {
    index: usize,
    tokens: usize,
    embedding: &'a [f32],
}

/// The texts of `input`, or why they cannot be read.
fn texts(input: &EmbedInput) -> Result<Vec<String>> {
    let texts = match input {
        EmbedInput::Texts(t) => t.clone(),
        EmbedInput::Stdin => std::io::stdin()
            .lock()
            .lines()
            .collect::<std::io::Result<_>>()
            .context("reading texts from standard input")?,
        EmbedInput::Jsonl(path) => {
            let file =
                std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
            let mut texts = Vec::new();
            for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
                let line = line.with_context(|| format!("reading {}", path.display()))?;
                if !line.trim().is_empty() {
                    texts.push(
                        jsonl_text(&line)
                            .with_context(|| format!("{} line {}", path.display(), n + 1))?,
                    );
                }
            }
            texts
        }
    };
    if texts.is_empty() {
        bail!("no texts to embed: give --text TEXT, --jsonl FILE, or lines on standard input");
    }
    Ok(texts)
}

/// The text of one JSONL line: a JSON string or `{"text": ...}`.
fn jsonl_text(line: &str) -> Result<String> {
    match serde_json::from_str(line)? {
        serde_json::Value::String(s) => Ok(s),
        serde_json::Value::Object(mut o) => match o.remove("text") {
            Some(serde_json::Value::String(s)) => Ok(s),
            _ => bail!("an object line needs a string field `text`"),
        },
        other => bail!("expected a JSON string or an object with `text`, got {other}"),
    }
}

/// Embeds the texts of `opts` with the plan at `path`, printing a line each.
pub async fn embed(path: &Path, opts: &EmbedOptions) -> Result<()> {
    let plan = PlanFile::open(path)?;
    let Some(info) = plan.header.model.embedding.clone() else {
        bail!(
            "{} is a language model, not an embedding model: `embed` needs a plan compiled from \
             an encoder (e.g. sentence-transformers/all-MiniLM-L6-v2)",
            path.display()
        );
    };
    let texts = texts(&opts.input)?;
    let mut model = Model::load(&plan, &opts.model).await?;
    let max = info.max_tokens as usize;
    let codec = model.shared_codec().context("the plan has no tokenizer")?;
    let mut ids = Vec::with_capacity(texts.len());
    for (index, text) in texts.iter().enumerate() {
        let tokens = if opts.truncate {
            codec.encode_truncated(text, max)?
        } else {
            codec.encode(text)?
        };
        if tokens.len() > max {
            bail!(
                "input {index} has {} tokens, more than the {max} this model takes: shorten it, \
                 or give --truncate to keep its first {max}",
                tokens.len()
            );
        }
        ids.push(tokens);
    }
    // A step's worth of inputs at a time, printed as each step ends.
    let per_step = (info.max_inputs as usize).max(1);
    for (step, chunk) in ids.chunks(per_step).enumerate() {
        let inputs: Vec<&[u32]> = chunk.iter().map(Vec::as_slice).collect();
        let vectors = model.embed_ids(&inputs).await?;
        let mut out = String::new();
        for (i, (tokens, embedding)) in chunk.iter().zip(&vectors).enumerate() {
            let line = Line {
                index: step * per_step + i,
                tokens: tokens.len(),
                embedding,
            };
            out.push_str(&serde_json::to_string(&line)?);
            out.push('\n');
        }
        console::print(&out)?;
    }
    Ok(())
}

/// Settings of `gerbil-run PLAN bench` on an embedding plan.
#[derive(Clone, Debug)]
pub struct EmbedBenchOptions {
    /// Tokens of each input (special tokens included).
    pub tokens: usize,
    /// Inputs of the throughput run.
    pub batch: usize,
    /// Timed repetitions (median reported).
    pub repeats: usize,
    /// How the plan is loaded.
    pub model: ModelOptions,
}

/// What `bench` measured on an embedding plan (its `--json` object).
#[derive(Clone, Debug, Serialize)]
pub struct EmbedBenchReport {
    /// Tokens of each input.
    pub input_tokens: usize,
    /// One input's vector, wall clock (median), readback included.
    pub latency_ms: f64,
    /// Inputs of the throughput run.
    pub batch: usize,
    /// The batch's vectors, wall clock (median).
    pub batch_ms: f64,
    /// Inputs per second at `batch`.
    pub sentences_per_s: f64,
    /// Tokens per second at `batch`.
    pub tokens_per_s: f64,
}

/// Median of `samples` (not empty).
fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Times an embedding plan: the latency of one input of `opts.tokens`
/// tokens, and the throughput of `opts.batch` of them in one call (packed
/// into as few steps as the plan allows). One untimed call of each first.
pub async fn bench_embeddings(path: &Path, opts: &EmbedBenchOptions) -> Result<EmbedBenchReport> {
    let plan = PlanFile::open(path)?;
    let Some(info) = plan.header.model.embedding.clone() else {
        bail!("{} is not an embedding plan", path.display());
    };
    if opts.tokens == 0 || opts.tokens as u64 > info.max_tokens {
        bail!(
            "--prompt-tokens {} must be 1 to the model's input maximum, {}",
            opts.tokens,
            info.max_tokens
        );
    }
    let mut model = Model::load(&plan, &opts.model).await?;
    let vocab = plan.header.model.vocab_size as u32;
    // Ids spread over the vocabulary, a different input each.
    let inputs: Vec<Vec<u32>> = (0..opts.batch.max(1))
        .map(|b| {
            (0..opts.tokens)
                .map(|t| ((b * 7919 + t * 104_729) as u32) % vocab)
                .collect()
        })
        .collect();
    let all: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
    let mut time = |inputs: &[&[u32]]| -> Result<f64> {
        let start = std::time::Instant::now();
        pollster::block_on(model.embed_ids(inputs))?;
        Ok(start.elapsed().as_secs_f64() * 1e3)
    };
    time(&all[..1])?;
    time(&all)?;
    let latency_ms = median(
        (0..opts.repeats)
            .map(|_| time(&all[..1]))
            .collect::<Result<_>>()?,
    );
    let batch_ms = median(
        (0..opts.repeats)
            .map(|_| time(&all))
            .collect::<Result<_>>()?,
    );
    let sentences_per_s = all.len() as f64 / (batch_ms / 1e3);
    Ok(EmbedBenchReport {
        input_tokens: opts.tokens,
        latency_ms,
        batch: all.len(),
        batch_ms,
        sentences_per_s,
        tokens_per_s: sentences_per_s * opts.tokens as f64,
    })
}
