//! `gerbil-train`: fine-tunes a HuggingFace model on a text file, on any
//! WebGPU device (`gerbil_cli::train`).

use anyhow::Result;
use clap::Parser;
use gerbil_cli::numbers::{positive, whole_u64};
use gerbil_cli::train::{train, Ended, TrainOptions};
use gerbil_runtime::device::DeviceOptions;
use gerbil_train::{Hyperparameters, LoraOptions, RunOptions};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "gerbil-train",
    version,
    about = "Fine-tune a HuggingFace model on a text file, on the GPU"
)]
struct Cli {
    /// The model: a checkpoint directory (config.json, safetensors,
    /// tokenizer.json) or a hub id ORG/NAME; with --resume, a checkpoint
    /// directory gerbil-train wrote.
    #[arg(value_name = "MODEL")]
    model: PathBuf,
    /// The training text (UTF-8), tokenized as the model's tokenizer does.
    #[arg(long, value_name = "FILE")]
    data: PathBuf,
    /// Optimizer steps to train (a resumed run counts its checkpoint's).
    #[arg(long, value_parser = at_least_one)]
    steps: u64,
    /// Tokens per sequence (at most the model's context).
    #[arg(long, value_name = "L", value_parser = whole_u32)]
    seq_len: u32,
    /// Sequences per optimizer step.
    #[arg(long, value_name = "B", default_value_t = 1, value_parser = whole_u32)]
    batch: u32,
    /// Sequences per pass on the GPU, packed end to end (a divisor of B);
    /// default: the largest divisor of B within 2,048 tokens whose pass
    /// fits the device's limits. Fewer take less memory; the losses are the
    /// same up to rounding.
    #[arg(long, value_name = "M", value_parser = whole_u32)]
    micro_batch: Option<u32>,
    /// Peak learning rate.
    #[arg(long, default_value_t = Hyperparameters::default().lr)]
    lr: f64,
    /// Steps of linear warmup to the learning rate (first step at lr/W).
    #[arg(long, value_name = "W", default_value_t = 0, value_parser = whole_u64)]
    warmup: u64,
    /// AdamW's decoupled weight decay.
    #[arg(long, value_name = "D", default_value_t = Hyperparameters::default().weight_decay)]
    weight_decay: f64,
    /// Clip the global gradient norm to G, or `none`.
    #[arg(long, value_name = "G", default_value = "1.0", value_parser = clip_norm)]
    max_grad_norm: ClipNorm,
    /// AdamW's β₁,β₂.
    #[arg(long, value_name = "B1,B2", default_value = "0.9,0.999", value_parser = betas)]
    betas: (f64, f64),
    /// AdamW's ε.
    #[arg(long, value_name = "E", default_value_t = Hyperparameters::default().eps)]
    eps: f64,
    /// AdamW's moments: `f32`, or `8bit` (block-quantized, a quarter of the
    /// bytes).
    #[arg(long, value_name = "f32|8bit", default_value = "f32", value_parser = ["f32", "8bit"])]
    optimizer_state: String,
    /// The matmuls' precision: `f32` (every product in f32), or `mixed`
    /// (every matmul, forward and backward, on tensor cores: f16 operands,
    /// the activation or gradient side in two parts, f32 sums; needs a GPU
    /// with cooperative matrices). Weights, optimizer and every other op stay
    /// f32.
    #[arg(long, value_name = "f32|mixed", default_value = "f32", value_parser = ["f32", "mixed"])]
    precision: String,
    /// Take the windows in a shuffled order (a new one each pass, from
    /// --seed) instead of file order.
    #[arg(long)]
    shuffle: bool,
    /// Train a LoRA adapter of rank R (the model's weights stay frozen)
    /// and write it, PEFT's format, to OUT.
    #[arg(long, value_name = "R", value_parser = whole_u32)]
    lora: Option<u32>,
    /// The adapter's alpha: its update is scaled by A/R [default: R].
    #[arg(long, value_name = "A", requires = "lora", value_parser = alpha)]
    lora_alpha: Option<f32>,
    /// The projections the adapter covers, by module name [default: those
    /// of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj the model has].
    #[arg(long, value_name = "LIST", value_delimiter = ',', requires = "lora")]
    lora_targets: Option<Vec<String>>,
    /// The seed of the shuffle and of the adapter's starting values.
    #[arg(long, value_name = "S", default_value_t = 0, value_parser = whole_u64)]
    seed: u64,
    /// Where the trained model goes (HF format, with the optimizer state;
    /// with --lora, the adapter in PEFT's files and the model's config and
    /// tokenizer).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Write one JSON line per step here: step, loss, grad_norm, lr,
    /// applied, tokens, seconds.
    #[arg(long, value_name = "FILE")]
    json_log: Option<PathBuf>,
    /// Save a checkpoint OUT/checkpoint-STEP every K steps.
    #[arg(long, value_name = "K", value_parser = at_least_one)]
    save_every: Option<u64>,
    /// Continue MODEL (a checkpoint gerbil-train wrote) from its optimizer
    /// state and step.
    #[arg(long)]
    resume: bool,
    /// After the first step, time every dispatch of one pass (a micro-batch)
    /// on the GPU and write them to FILE as JSON (the costliest to stderr).
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
    /// Run on adapter N of `gerbil-run devices`.
    #[arg(long, value_name = "N")]
    device: Option<usize>,
    /// No progress bar.
    #[arg(short, long)]
    quiet: bool,
    /// Log to stderr (-v, -vv, -vvv).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

/// `--steps`, `--save-every`: a positive count.
fn at_least_one(s: &str) -> Result<u64, String> {
    positive(s, "must be at least 1").map(|n| n as u64)
}

/// `--lora-alpha`: a finite, positive number.
fn alpha(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(a) if a.is_finite() && a > 0.0 => Ok(a),
        Ok(_) => Err("give a finite number above 0".into()),
        Err(e) => Err(format!("{e}: give a number")),
    }
}

fn whole_u32(s: &str) -> Result<u32, String> {
    gerbil_cli::numbers::whole(s, u64::from(u32::MAX)).map(|v| v as u32)
}

/// `--max-grad-norm`: a norm, or `none` (no clipping).
#[derive(Clone, Copy, Debug)]
struct ClipNorm(Option<f64>);

fn clip_norm(s: &str) -> Result<ClipNorm, String> {
    if s == "none" {
        return Ok(ClipNorm(None));
    }
    s.parse::<f64>()
        .map(|n| ClipNorm(Some(n)))
        .map_err(|e| format!("{e}: give a number or `none`"))
}

fn betas(s: &str) -> Result<(f64, f64), String> {
    let parse = |p: &str| p.trim().parse::<f64>().map_err(|e| format!("`{p}`: {e}"));
    match s.split_once(',') {
        Some((a, b)) => Ok((parse(a)?, parse(b)?)),
        None => Err("give two numbers, B1,B2 (for example 0.9,0.999)".into()),
    }
}

fn main() {
    let cli = Cli::parse();
    gerbil_cli::logging::init(cli.verbose);
    match real_main(cli) {
        // The shell's status for an interrupt.
        Ok(Ended::Interrupted { step, checkpoint }) => {
            gerbil_cli::console::note(&format!(
                "interrupted: {step} steps saved in {dir}; continue with `gerbil-train {dir} \
                 --resume` and the same flags",
                dir = checkpoint.display()
            ));
            std::process::exit(130)
        }
        other => gerbil_cli::console::exit(other.map(|_| ())),
    }
}

fn real_main(cli: Cli) -> Result<Ended> {
    let progress = gerbil_cli::progress::Progress::new(cli.quiet);
    let hub = gerbil_cli::hub_env::hub_options(None, None, progress, false);
    let opts = TrainOptions {
        model: cli.model,
        data: cli.data,
        steps: cli.steps,
        run: RunOptions {
            seq_len: cli.seq_len,
            batch: cli.batch,
            micro_batch: cli.micro_batch,
            hyper: Hyperparameters {
                lr: cli.lr,
                warmup: cli.warmup,
                betas: cli.betas,
                eps: cli.eps,
                weight_decay: cli.weight_decay,
                max_grad_norm: cli.max_grad_norm.0,
            },
            eight_bit: cli.optimizer_state == "8bit",
            mixed: cli.precision == "mixed",
            shuffle: cli.shuffle.then_some(cli.seed),
            device: DeviceOptions {
                adapter: cli.device,
                timestamps: cli.profile.is_some(),
                ..DeviceOptions::default()
            },
            lora: cli.lora.map(|rank| LoraOptions {
                rank,
                alpha: cli.lora_alpha,
                targets: cli.lora_targets,
                seed: cli.seed,
            }),
        },
        out: cli.out,
        json_log: cli.json_log,
        save_every: cli.save_every,
        resume: cli.resume,
        profile: cli.profile,
        quiet: cli.quiet,
    };
    train(&opts, &hub)
}
