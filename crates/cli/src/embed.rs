//! `gerbil-run PLAN embed`: sentence embeddings from an embedding plan (an
//! encoder such as all-MiniLM-L6-v2), one JSON line per input.
//!
//! Inputs come from `--text` (repeatable), else from `--jsonl FILE` (each
//! line a JSON string, or an object with a `text` field), else from
//! standard input, one text a line. Each input's vector is printed as soon
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
