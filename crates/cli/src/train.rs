//! `gerbil-train`: fine-tunes a model on a text file, on the GPU.
//!
//! [`train`] opens the model (a checkpoint directory or a hub id), tokenizes
//! the file as transformers' `tokenizer(text)` does (BOS as the tokenizer
//! adds it), and runs `gerbil_train::Run` for the asked steps: a progress
//! bar with the loss and tokens/s, one JSON line per step in `--json-log`
//! (`{"step", "loss", "grad_norm", "lr", …}`), a checkpoint directory every
//! `--save-every` steps (`OUT/checkpoint-STEP`) and the trained model in
//! `OUT` at the end — both in HF format with the optimizer state, so
//! `gerbilc compile` takes them and `--resume` continues from them. With
//! `--lora R` they hold a LoRA adapter (PEFT's files) beside the model's
//! config and tokenizer, and the checkpoint weights stay frozen.
//!
//! The surprise: Ctrl-C does not stop the process mid-step. The first one
//! sets a flag the loop reads between steps; the run then saves a last
//! checkpoint of every step completed (`OUT/checkpoint-STEP`) and says how
//! to resume, so an interrupt loses nothing. A second Ctrl-C while it saves
//! stops at once.

use crate::progress::Progress;
use anyhow::{bail, Context, Result};
use gerbil_frontend_hf::Checkpoint;
use gerbil_hub::HubOptions;
use gerbil_text::TextCodec;
use gerbil_train::{Run, RunOptions, StepLog};
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What `gerbil-train` was asked to do.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// The model: a checkpoint directory or a hub id (with `resume`, a
    /// checkpoint `gerbil-train` wrote).
    pub model: PathBuf,
    /// The training text.
    pub data: PathBuf,
    /// Optimizer steps to reach (a resumed run counts its checkpoint's).
    pub steps: u64,
    /// The run's settings.
    pub run: RunOptions,
    /// Where the trained model goes.
    pub out: PathBuf,
    /// One JSON line per step, here.
    pub json_log: Option<PathBuf>,
    /// Save a checkpoint every this many steps.
    pub save_every: Option<u64>,
    /// Continue from `model`'s optimizer state.
    pub resume: bool,
    /// After the first step, time every dispatch of one pass and write
    /// them here as JSON (the device needs timestamps: set in `run`).
    pub profile: Option<PathBuf>,
    /// No progress bar.
    pub quiet: bool,
}

/// One line of `--json-log`.
#[derive(Serialize)]
struct LogLine {
    step: u64,
    loss: f64,
    grad_norm: f64,
    lr: f64,
    applied: bool,
    tokens: u64,
    seconds: f64,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Every step was taken; the model is in `--out`.
    Finished,
    /// Ctrl-C: the steps taken so far are saved in `checkpoint`.
    Interrupted {
        /// Steps taken.
        step: u64,
        /// Where they are saved.
        checkpoint: PathBuf,
    },
}

/// Runs `gerbil-train` (see the module documentation); `hub` resolves a hub id.
pub fn train(opts: &TrainOptions, hub: &HubOptions) -> Result<Ended> {
    let model = gerbil_hub::resolve(&opts.model, hub)?;
    let ckpt = Checkpoint::open(&model.dir)?;
    let tokens = tokenize(&ckpt, &opts.data)?;
    let stop = interrupt_flag();
    let mut log = match &opts.json_log {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    let mut run = pollster::block_on(Run::start(ckpt, tokens, opts.run.clone(), opts.resume))?;
    let first = run.steps_done();
    if first >= opts.steps {
        bail!(
            "the checkpoint has taken {first} steps already, --steps {} asks for no more; give a \
             larger --steps",
            opts.steps
        );
    }
    let progress = Progress::new(opts.quiet);
    let bar = progress.items("training", Some(opts.steps), "steps");
    bar.set_position(first);
    let started = Instant::now();
    let mut tokens_done = 0u64;
    while run.steps_done() < opts.steps {
        let s = pollster::block_on(run.step())?;
        tokens_done += s.tokens;
        let seconds = started.elapsed().as_secs_f64();
        report(&bar, &s, tokens_done as f64 / seconds.max(1e-9));
        if let Some(log) = log.as_mut() {
            write_line(log, &s, seconds)?;
        }
        if let Some(path) = opts.profile.as_ref().filter(|_| s.step == first + 1) {
            let times = pollster::block_on(run.profile())?;
            crate::progress::suspend(|| write_profile(path, &times))?;
        }
        let checkpoint = opts.out.join(format!("checkpoint-{}", s.step));
        let saved = opts.save_every.is_some_and(|k| s.step % k == 0) && s.step < opts.steps;
        if saved {
            save(&run, &checkpoint)?;
        }
        if stop.load(Ordering::SeqCst) && s.step < opts.steps {
            bar.abandon();
            let dir = checkpoint;
            if !saved {
                crate::console::note(&format!(
                    "interrupted after step {}; saving it to {}",
                    s.step,
                    dir.display()
                ));
                save(&run, &dir)?;
            }
            return Ok(Ended::Interrupted {
                step: s.step,
                checkpoint: dir,
            });
        }
    }
    bar.finish_and_clear();
    save(&run, &opts.out)?;
    let what = if run.trains_adapter() {
        "the adapter"
    } else {
        "the model"
    };
    crate::console::note(&format!(
        "trained {} steps ({} tokens) in {:.1} s: {:.2} M trained values, {:.2} GiB of GPU \
         buffers; {what} is in {}",
        run.steps_done() - first,
        tokens_done,
        started.elapsed().as_secs_f64(),
        run.trained_values() as f64 / 1e6,
        run.gpu_bytes() as f64 / f64::from(1u32 << 30),
        opts.out.display()
    ));
    Ok(Ended::Finished)
}

/// The text of `path` as the model's tokenizer encodes it.
fn tokenize(ckpt: &Checkpoint, path: &Path) -> Result<Vec<u32>> {
    let Some(json) = &ckpt.text.tokenizer_json else {
        bail!(
            "the model has no tokenizer.json, so its text cannot be tokenized; train a model \
             that has one"
        );
    };
    let codec = TextCodec::from_tokenizer_json(json)?;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if text.trim().is_empty() {
        bail!(
            "the training text {} is empty; give a file of text to train on",
            path.display()
        );
    }
    Ok(codec.encode(&text)?)
}

/// The bar's message after step `s`.
fn report(bar: &indicatif::ProgressBar, s: &StepLog, tokens_per_second: f64) {
    bar.set_position(s.step);
    let skipped = if s.applied {
        ""
    } else {
        " (skipped: gradient not finite)"
    };
    bar.set_message(format!(
        "loss {:.4}, {:.0} tokens/s{skipped}",
        s.loss, tokens_per_second
    ));
}

/// Appends step `s`'s line to the JSON log and flushes it (a log read while
/// the run goes on is whole up to its last step).
fn write_line(log: &mut impl Write, s: &StepLog, seconds: f64) -> Result<()> {
    let line = LogLine {
        step: s.step,
        loss: s.loss,
        grad_norm: s.grad_norm,
        lr: s.lr,
        applied: s.applied,
        tokens: s.tokens,
        seconds,
    };
    serde_json::to_writer(&mut *log, &line)?;
    writeln!(log)?;
    log.flush()?;
    Ok(())
}

/// Writes `times` to `path` as JSON and the costliest groups to standard
/// error.
fn write_profile(path: &Path, times: &[gerbil_runtime::DispatchTime]) -> Result<()> {
    #[derive(Serialize)]
    struct Row<'a> {
        label: &'a str,
        group: &'a str,
        kernel: &'a str,
        nanos: f64,
    }
    let rows: Vec<Row> = times
        .iter()
        .map(|t| Row {
            label: &t.label,
            group: &t.group,
            kernel: &t.kernel,
            nanos: t.nanos,
        })
        .collect();
    std::fs::write(path, serde_json::to_string_pretty(&rows)?)
        .with_context(|| format!("writing {}", path.display()))?;
    let mut groups: Vec<(String, f64, usize)> = Vec::new();
    for t in times {
        let key = format!("{} ({})", t.group, t.kernel);
        match groups.iter_mut().find(|(k, _, _)| *k == key) {
            Some(g) => {
                g.1 += t.nanos;
                g.2 += 1;
            }
            None => groups.push((key, t.nanos, 1)),
        }
    }
    groups.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = times.iter().map(|t| t.nanos).sum();
    crate::console::note(&format!(
        "one pass: {:.2} ms in {} dispatches; the costliest:",
        total / 1e6,
        times.len()
    ));
    for (key, nanos, n) in groups.iter().take(15) {
        crate::console::note(&format!(
            "{:>9.3} ms {:>5.1}%  {n:>3}×  {key}",
            nanos / 1e6,
            100.0 * nanos / total.max(1.0)
        ));
    }
    Ok(())
}

fn save(run: &Run, dir: &Path) -> Result<()> {
    pollster::block_on(run.save(dir)).with_context(|| format!("saving {}", dir.display()))
}

/// A flag the first Ctrl-C sets (the second exits at once, status 130).
fn interrupt_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let handler = ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            gerbil_plan::safe_file::remove_unfinished();
            std::process::exit(130);
        }
        crate::console::note("interrupt: saving after this step (Ctrl-C again to stop at once)");
    });
    if let Err(e) = handler {
        tracing::warn!(
            "no Ctrl-C handler ({e}): an interrupt loses the steps since the last checkpoint"
        );
    }
    stop
}
