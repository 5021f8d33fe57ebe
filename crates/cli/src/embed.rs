//! `gerbil-run PLAN embed`: sentence embeddings from an embedding plan (an
//! encoder such as all-MiniLM-L6-v2), one JSON line per input or one `.npy`
//! array.
//!
//! Inputs come from `--text` (repeatable), else from `--jsonl FILE` (each
//! line a JSON string, or an object with a `text` field; blank lines are
//! skipped), else from standard input, one text a line (a blank line is an
//! empty text, as `""` is). Texts are read a step's worth at a time (the
//! plan's `max_inputs`), embedded, and written before the next are read, so
//! a large file streams through in constant memory with a progress bar on
//! standard error. JSON lines are `{"index": i, "tokens": n, "embedding":
//! [...]}`; `--format npy` writes one float32 array of shape (inputs,
//! dimensions) instead, to `--output FILE` (streamed, its shape written at
//! the end) or to standard output (held until the end). A file is written
//! as `FILE.partial` and renamed when every vector is in it. `--dimensions D`
//! keeps the first D values of each vector, renormalized when the model's
//! are unit length. The surprise: an input longer than the model takes is
//! an error unless `--truncate` is given, where sentence-transformers would
//! cut it silently.

use crate::console;
use crate::progress::Progress;
use anyhow::{bail, Context, Result};
use gerbil::{Model, ModelOptions, TextCodec};
use gerbil_plan::PlanFile;
use npyz::WriterBuilder;
use serde::Serialize;
use std::cell::RefCell;
use std::io::{BufRead, BufWriter, Cursor, IsTerminal, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

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

/// How `embed` writes the vectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EmbedFormat {
    /// One JSON object a line.
    Json,
    /// One NumPy float32 array, a row per input.
    Npy,
}

/// Settings of `gerbil-run embed`.
#[derive(Clone, Debug)]
pub struct EmbedOptions {
    /// The texts.
    pub input: EmbedInput,
    /// Cut inputs longer than the model takes instead of failing.
    pub truncate: bool,
    /// Keep the first this many values of each vector.
    pub dimensions: Option<usize>,
    /// JSON lines or `.npy`.
    pub format: EmbedFormat,
    /// Write here instead of standard output.
    pub output: Option<PathBuf>,
    /// No progress bar.
    pub quiet: bool,
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

/// The texts of `input`, read as they are asked for, and how many there
/// are when that is known without reading them all (not for standard input).
type Texts = (Box<dyn Iterator<Item = Result<String>>>, Option<u64>);

/// Opens the texts of `input`.
fn texts(input: &EmbedInput) -> Result<Texts> {
    Ok(match input {
        EmbedInput::Texts(t) => (
            Box::new(t.clone().into_iter().map(Ok)),
            Some(t.len() as u64),
        ),
        EmbedInput::Stdin => (
            Box::new(
                std::io::stdin()
                    .lock()
                    .lines()
                    .map(|l| l.context("reading texts from standard input")),
            ),
            None,
        ),
        EmbedInput::Jsonl(path) => {
            let open = || {
                std::fs::File::open(path)
                    .map(std::io::BufReader::new)
                    .with_context(|| format!("opening {}", path.display()))
            };
            // Counting a regular file's lines first is cheap beside
            // embedding them, and gives the bar its end; a pipe or FIFO
            // (`--jsonl <(zcat corpus.gz)`) can be read only once.
            let regular = std::fs::metadata(path).is_ok_and(|m| m.is_file());
            let mut count = None;
            if regular {
                let mut n = 0;
                for line in open()?.lines() {
                    let line = line.with_context(|| format!("reading {}", path.display()))?;
                    n += u64::from(!line.trim().is_empty());
                }
                count = Some(n);
            }
            let path = path.clone();
            let lines = open()?.lines().enumerate().filter_map(move |(n, line)| {
                let text = line
                    .with_context(|| format!("reading {}", path.display()))
                    .and_then(|line| {
                        if line.trim().is_empty() {
                            return Ok(None);
                        }
                        jsonl_text(&line)
                            .map(Some)
                            .with_context(|| format!("{} line {}", path.display(), n + 1))
                    });
                text.transpose()
            });
            (Box::new(lines), count)
        }
    })
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

/// Where the vectors go, as they are made.
struct Sink {
    out: Out,
    /// With `-o FILE`: the file being written (`FILE.partial`) and `FILE`,
    /// which it becomes once every vector is in it.
    file: Option<(PathBuf, PathBuf)>,
}

/// The writer of a [`Sink`].
enum Out {
    /// JSON lines.
    Json(Box<dyn Write>),
    /// A `.npy` array of `dimensions` columns, its rows counted as written.
    Npy {
        out: npyz::NpyWriter<f32, Box<dyn WriteSeek>>,
        /// Standard output, when the array is held in memory for it.
        stdout: Option<Memory>,
    },
}

/// A seekable writer (a file, or memory).
trait WriteSeek: Write + Seek {}
impl<T: Write + Seek> WriteSeek for T {}

/// An array held in memory until standard output gets it at the end.
type Memory = Rc<RefCell<Cursor<Vec<u8>>>>;

/// The npy writer's handle on [`Memory`] (it owns its writer, and its
/// `finish` gives nothing back).
struct Shared(Memory);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Seek for Shared {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.0.borrow_mut().seek(pos)
    }
}

impl Sink {
    /// A sink for `format` writing to `output` (standard output when `None`).
    fn open(format: EmbedFormat, output: Option<&Path>, dimensions: usize) -> Result<Sink> {
        // A file is written beside its name and renamed at the end: a run
        // that fails leaves `FILE.partial`, never a short `FILE`.
        let file = output.map(|path| {
            let mut partial = path.as_os_str().to_owned();
            partial.push(".partial");
            (PathBuf::from(partial), path.to_path_buf())
        });
        let create = |path: &Path| {
            std::fs::File::create(path)
                .map(BufWriter::new)
                .with_context(|| format!("creating {}", path.display()))
        };
        let out = match format {
            EmbedFormat::Json => Out::Json(match &file {
                Some((partial, _)) => Box::new(create(partial)?),
                None => Box::new(BufWriter::new(console::StdoutWriter::new())),
            }),
            EmbedFormat::Npy => {
                let (writer, stdout): (Box<dyn WriteSeek>, _) = match &file {
                    Some((partial, _)) => (Box::new(create(partial)?), None),
                    None if std::io::stdout().is_terminal() => bail!(
                        "--format npy writes binary data: give --output FILE, or redirect \
                         standard output to a file"
                    ),
                    None => {
                        let memory = Memory::default();
                        (Box::new(Shared(Rc::clone(&memory))), Some(memory))
                    }
                };
                let out = npyz::WriteOptions::new()
                    .default_dtype()
                    .writer(writer)
                    .begin_2d(dimensions as u64)?;
                Out::Npy { out, stdout }
            }
        };
        Ok(Sink { out, file })
    }

    /// Writes the vectors of inputs `first..` (of `tokens` tokens each).
    fn write(&mut self, first: usize, tokens: &[Vec<u32>], vectors: &[Vec<f32>]) -> Result<()> {
        match &mut self.out {
            Out::Json(out) => {
                for (i, (tokens, embedding)) in tokens.iter().zip(vectors).enumerate() {
                    let line = Line {
                        index: first + i,
                        tokens: tokens.len(),
                        embedding,
                    };
                    // Serialized first: a write error keeps its io cause
                    // (a reader gone from standard output exits quietly).
                    let mut bytes = serde_json::to_vec(&line)?;
                    bytes.push(b'\n');
                    out.write_all(&bytes)?;
                }
                // Each step's lines leave at once: a reader sees them stream.
                out.flush()?;
            }
            Out::Npy { out, .. } => {
                for v in vectors {
                    out.extend(v.iter().copied())?;
                }
            }
        }
        Ok(())
    }

    /// Ends the output: the array's shape, the bytes held for standard
    /// output, the file under its own name.
    fn finish(self) -> Result<()> {
        match self.out {
            Out::Json(mut out) => out.flush()?,
            Out::Npy { out, stdout } => {
                out.finish()?;
                if let Some(memory) = stdout {
                    console::print_bytes(&memory.take().into_inner())?;
                }
            }
        }
        if let Some((partial, path)) = &self.file {
            std::fs::rename(partial, path)
                .with_context(|| format!("renaming {} to {}", partial.display(), path.display()))?;
        }
        Ok(())
    }
}

/// The token ids of `texts`, checked against the model's maximum `max`;
/// `first` is the index of the first (for errors).
fn tokenize(
    codec: &TextCodec,
    texts: &[String],
    first: usize,
    max: usize,
    truncate: bool,
) -> Result<Vec<Vec<u32>>> {
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let tokens = if truncate {
                codec.encode_truncated(text, max)?
            } else {
                codec.encode(text)?
            };
            if tokens.len() > max {
                bail!(
                    "input {} has {} tokens, more than the {max} this model takes: shorten it, \
                     or give --truncate to keep its first {max}",
                    first + i,
                    tokens.len()
                );
            }
            Ok(tokens)
        })
        .collect()
}

/// Embeds the texts of `opts` with the plan at `path`, writing each step's
/// vectors as they are made.
pub async fn embed(path: &Path, opts: &EmbedOptions) -> Result<()> {
    let plan = PlanFile::open(path)?;
    let Some(info) = plan.header.model.embedding.clone() else {
        bail!(
            "{} is a language model, not an embedding model: `embed` needs a plan compiled from \
             an encoder (e.g. sentence-transformers/all-MiniLM-L6-v2)",
            path.display()
        );
    };
    let dimensions = match opts.dimensions {
        Some(d) if d == 0 || d as u64 > info.dimension => bail!(
            "--dimensions {d}: this model's vectors have {} values; give 1 to {}",
            info.dimension,
            info.dimension
        ),
        Some(d) => d,
        None => info.dimension as usize,
    };
    let (mut texts, total) = texts(&opts.input)?;
    // A step's worth of inputs at a time, written as each step ends.
    let per_step = (info.max_inputs as usize).max(1);
    let mut next = || -> Result<Vec<String>> { texts.by_ref().take(per_step).collect() };
    let mut chunk = next()?;
    if chunk.is_empty() {
        bail!("no texts to embed: give --text TEXT, --jsonl FILE, or lines on standard input");
    }
    let mut model = Model::load(&plan, &opts.model).await?;
    let mut sink = Sink::open(opts.format, opts.output.as_deref(), dimensions)?;
    let max = info.max_tokens as usize;
    let codec = model.shared_codec().context("the plan has no tokenizer")?;
    let bar = Progress::new(opts.quiet).items("embedding", total, "inputs");
    let mut done = 0;
    while !chunk.is_empty() {
        let ids = tokenize(&codec, &chunk, done, max, opts.truncate)?;
        let inputs: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
        let mut vectors = model.embed_ids(&inputs).await?;
        model.shorten(&mut vectors, dimensions)?;
        crate::progress::suspend(|| sink.write(done, &ids, &vectors))?;
        done += chunk.len();
        bar.set_position(done as u64);
        chunk = next()?;
    }
    bar.finish_and_clear();
    sink.finish()
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
    /// Also time every dispatch of one step of the batch.
    pub profile: bool,
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
    /// The device's copy bandwidth in GB/s, the profile's roofline (with
    /// `profile`).
    pub copy_gb_s: Option<f64>,
    /// GPU time by dispatch kind of one step of the batch's first inputs
    /// (as many as a step packs; with `profile`).
    pub profile: Option<Vec<crate::run::ProfileRow>>,
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
    let mut load = opts.model.clone();
    load.session.profiling = opts.profile;
    let mut model = Model::load(&plan, &load).await?;
    // Every step on the variant itself, never its prefill fallback.
    model.session().create_step_pipelines().await?;
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
    let (mut copy_gb_s, mut profile) = (None, None);
    if opts.profile {
        let session = model.session_mut();
        let copy = session.copy_bandwidth().await? / 1e9;
        // As many inputs as one step packs.
        let step = session
            .header()
            .model
            .max_tokens_per_step
            .min(session.context()) as usize;
        let fit = (info.max_inputs as usize).max(1).min(step / opts.tokens);
        let times = session
            .profile_embedding(&all[..fit.clamp(1, all.len())])
            .await?;
        copy_gb_s = Some(copy);
        profile = Some(crate::run::summarize(&times, copy));
    }
    Ok(EmbedBenchReport {
        input_tokens: opts.tokens,
        latency_ms,
        batch: all.len(),
        batch_ms,
        sentences_per_s,
        tokens_per_s: sentences_per_s * opts.tokens as f64,
        copy_gb_s,
        profile,
    })
}
