//! `gerbilc`: compiles HuggingFace checkpoints to gerbil plans.

use anyhow::Result;
use clap::{Parser, Subcommand};
use gerbil_cli::inspect::{inspect, render};
use gerbil_compiler::{
    compile, Checkpoint, CompileOptions, DumpIr, Dumps, Target, DEFAULT_MAX_TOKENS_PER_STEP,
};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "gerbilc",
    version,
    about = "Ahead-of-time compiler: HuggingFace checkpoint → WebGPU plan"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compile a local HF checkpoint directory to a plan.
    Compile {
        /// Directory with config.json, model.safetensors (or an index) and tokenizer files.
        repo: PathBuf,
        /// Plan file to write; without it only the requested dumps are produced.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// KV-cache capacity in tokens (default: max_position_embeddings, at most 4096).
        #[arg(long)]
        max_context: Option<u64>,
        /// Most prompt tokens per prefill step; longer prompts run in chunks.
        #[arg(long, default_value_t = DEFAULT_MAX_TOKENS_PER_STEP)]
        max_tokens_per_step: u64,
        /// Skip a pass by name (repeatable).
        #[arg(long = "disable-pass", value_name = "NAME")]
        disable_pass: Vec<String>,
        /// Print the IR: `lowered` (default), `after=PASS`, or `all`.
        #[arg(long, value_name = "WHEN", num_args = 0..=1, default_missing_value = "lowered")]
        dump_ir: Option<DumpIr>,
        /// Write Graphviz files of the graph before and after each pass.
        #[arg(long, value_name = "DIR")]
        dump_dot: Option<PathBuf>,
        /// Write every kernel's WGSL to this directory.
        #[arg(long, value_name = "DIR")]
        emit_wgsl: Option<PathBuf>,
        /// Device limits to compile for.
        #[arg(long, default_value = "portable", value_parser = parse_target)]
        target: Target,
        /// Override the target's largest storage binding in bytes (weights
        /// larger than this are split into row shards).
        #[arg(long, value_name = "BYTES")]
        max_storage_binding: Option<u64>,
    },
    /// Summarize a plan: ops, dispatches, buffers, kernels.
    Inspect {
        /// The plan.
        plan: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

fn parse_target(s: &str) -> Result<Target, String> {
    s.parse()
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("GERBIL_LOG"))
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = real_main() {
        eprintln!("error: {}", gerbil_cli::error_message(&e));
        std::process::exit(1);
    }
}

fn real_main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Compile {
            repo,
            output,
            max_context,
            max_tokens_per_step,
            disable_pass,
            dump_ir,
            dump_dot,
            emit_wgsl,
            target,
            max_storage_binding,
        } => {
            let ckpt = Checkpoint::open(&repo)?;
            let opts = CompileOptions {
                max_context,
                max_tokens_per_step,
                disabled_passes: disable_pass,
                target,
                max_storage_binding,
            };
            let mut dumps = Dumps::new(dump_ir, dump_dot, std::io::stdout().lock());
            let plan = compile(&ckpt, &opts, &mut dumps)?.plan;
            if let Some(dir) = &emit_wgsl {
                plan.emit_wgsl(dir)?;
            }
            if let Some(out) = output {
                plan.write(&out)?;
                let h = &plan.header;
                eprintln!(
                    "wrote {} ({} kernels, {} prefill / {} decode dispatches, {:.1} MB of weights)",
                    out.display(),
                    h.kernels.len(),
                    h.prefill.len(),
                    h.decode.len(),
                    plan.weight_bytes as f64 / 1e6
                );
            }
        }
        Cmd::Inspect { plan, json } => {
            let plan = gerbil_plan::PlanFile::open(&plan)?;
            let i = inspect(&plan.header);
            if json {
                println!("{}", serde_json::to_string_pretty(&i)?);
            } else {
                print!("{}", render(&i));
            }
        }
    }
    Ok(())
}
