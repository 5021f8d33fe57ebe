//! `gerbilc`: compiles HuggingFace checkpoints to gerbil plans.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use gerbil_cli::graph_svg::{layer_graph, render_svg};
use gerbil_cli::hub_env::hub_options;
use gerbil_cli::inspect::{inspect, render, render_weights};
use gerbil_cli::numbers::{whole_u64, whole_usize};
use gerbil_cli::passes::{bisect_note, pass_stats};
use gerbil_cli::progress::Progress;
use gerbil_cli::schedule::render_schedule;
use gerbil_compiler::{
    check_text_assets, compile, opt, CompileOptions, DumpIr, Dumps, OptOptions, PassReport,
    PassSelection, Quantization, Target, Tuning,
};
use gerbil_hub::{open_checkpoint, HubOptions};
use gerbil_plan::safe_file;
use gerbil_tune::tune;
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(
    name = "gerbilc",
    version,
    about = "Ahead-of-time compiler: HuggingFace checkpoint → WebGPU plan"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Log what gerbil does to stderr: `-v` the compile phases and their
    /// times, `-vv` debug detail, `-vvv` also other crates' logs;
    /// `GERBIL_LOG` (a tracing filter) overrides it.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compile a HuggingFace checkpoint (a local directory, or a hub model
    /// ORG/NAME) to a plan.
    Compile {
        /// Directory with config.json, model.safetensors (or an index) and
        /// tokenizer files, or a Hugging Face hub model id ORG/NAME (downloaded
        /// into the hub cache).
        #[arg(value_name = "DIR|ORG/NAME")]
        repo: PathBuf,
        #[command(flatten)]
        hub: HubArgs,
        /// Plan file to write; without it only the requested dumps are produced.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// KV-cache capacity in tokens (default: max_position_embeddings, at most 4096).
        #[arg(long, allow_negative_numbers = true, value_parser = whole_u64)]
        max_context: Option<u64>,
        /// Most prompt tokens per prefill step; longer prompts run in chunks.
        /// Default: chosen by the target and memory — 1024 on targets with
        /// 1 GiB+ storage bindings (desktop), 256 on portable, halved while
        /// a step's activations exceed max(weights / 8, 64 MiB).
        #[arg(long, allow_negative_numbers = true, value_parser = whole_u64)]
        max_tokens_per_step: Option<u64>,
        /// Add a batch schedule: one step decodes up to N sequences, each in
        /// its own KV-cache slot (`gerbil-run PLAN serve` answers that many
        /// requests together); 0 (default): none.
        #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=256))]
        max_batch: u32,
        /// Leave out the self-test's reference (a short prompt run through
        /// the model on the CPU at compile time, which `gerbil-run PLAN
        /// selftest` checks every variant against): for a large model whose
        /// reference would take long.
        #[arg(long)]
        no_selftest: bool,
        /// Skip a pass by name (repeatable).
        #[arg(long = "disable-pass", value_name = "NAME")]
        disable_pass: Vec<String>,
        /// Print the IR: `lowered` (default), `after=PASS`, `all`, or `final`
        /// (after the last pass, alone: what `gerbilc opt` prints).
        #[arg(long, value_name = "WHEN", num_args = 0..=1, default_missing_value = "lowered")]
        dump_ir: Option<DumpIr>,
        /// Write Graphviz files of the graph as lowered and after each pass
        /// that changed it (clustered by layer, the pass's new nodes highlighted).
        #[arg(long, value_name = "DIR")]
        dump_dot: Option<PathBuf>,
        /// Print how many rewrites each pass made (to standard error).
        #[arg(long)]
        pass_stats: bool,
        /// Run only the first N passes and name the pass it stopped before.
        #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = whole_usize)]
        bisect: Option<usize>,
        /// Write every kernel's WGSL to this directory.
        #[arg(long, value_name = "DIR")]
        emit_wgsl: Option<PathBuf>,
        /// Which adapters the plan runs on: `universal` (every one, each
        /// its best variant), `desktop` (desktop GPUs only: no `cpu` variant,
        /// weights unsharded up to 2 GiB) or `portable` (WebGPU's defaults,
        /// no optional feature).
        #[arg(long, default_value = "universal", value_parser = parse_target)]
        target: Box<Target>,
        /// Override the target's largest storage binding in bytes, for every
        /// variant (weights larger than this are split into row shards).
        #[arg(long, value_name = "BYTES", allow_negative_numbers = true, value_parser = whole_u64)]
        max_storage_binding: Option<u64>,
        /// Use the prefill GEMM tiles `gerbilc tune` measured (a JSON file);
        /// shapes it lacks keep the built-in choice.
        #[arg(long, value_name = "FILE")]
        tuning: Option<PathBuf>,
        /// Compile weights that hold NaN or infinities instead of refusing
        /// them (the plan will likely print garbage: for debugging only).
        #[arg(long)]
        allow_non_finite: bool,
        /// Store the float matrices in ggml blocks as llama-quantize would:
        /// `q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1` or `q4_k_m` (the LM head in
        /// Q6_K but for q8_0); or `q4f16_1`, MLC's symmetric int4 groups with
        /// f16 scales for every matrix, LM head included (in Q4_0 blocks). A
        /// GGUF's quantized tensors keep theirs.
        #[arg(long, value_name = "TYPE", value_parser = parse_quantization)]
        quantize: Option<Quantization>,
    },
    /// Time the prefill GEMM tiles of a checkpoint on this machine's GPU and
    /// write the fastest per shape, for `gerbilc compile --tuning`.
    Tune {
        /// Directory with config.json, model.safetensors (or an index) and
        /// tokenizer files, or a Hugging Face hub model id ORG/NAME.
        #[arg(value_name = "DIR|ORG/NAME")]
        repo: PathBuf,
        #[command(flatten)]
        hub: HubArgs,
        /// The tuning file to write.
        #[arg(short, long)]
        output: PathBuf,
        /// KV-cache capacity in tokens, as `compile` takes it.
        #[arg(long, allow_negative_numbers = true, value_parser = whole_u64)]
        max_context: Option<u64>,
        /// Prefill chunk, as `compile` takes it: the tiles are timed at it.
        #[arg(long, allow_negative_numbers = true, value_parser = whole_u64)]
        max_tokens_per_step: Option<u64>,
        /// Device limits to compile for, as `compile` takes them.
        #[arg(long, default_value = "universal", value_parser = parse_target)]
        target: Box<Target>,
    },
    /// Run passes on textual IR (`.gir`, as `--dump-ir` prints it) and print
    /// the result.
    Opt {
        /// The IR file, or `-` for standard input.
        file: PathBuf,
        /// `default` (the compiler's own pipeline) or pass names separated by commas.
        #[arg(long, default_value = "default", value_parser = parse_passes)]
        passes: PassSelection,
        /// Print how many rewrites each pass made (to standard error).
        #[arg(long)]
        pass_stats: bool,
        /// Run only the first N passes and name the pass it stopped before.
        #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = whole_usize)]
        bisect: Option<usize>,
        /// Write Graphviz files of the graph as read and after each pass that changed it.
        #[arg(long, value_name = "DIR")]
        dump_dot: Option<PathBuf>,
    },
    /// Summarize a plan: ops, dispatches, buffers, kernels.
    Inspect {
        /// The plan.
        plan: PathBuf,
        /// Print one JSON object.
        #[arg(long, conflicts_with = "schedule")]
        json: bool,
        /// List every dispatch of each schedule in order, with its IR label and kernel.
        #[arg(long)]
        schedule: bool,
        /// List every weight buffer: its tensor, dtype (`bf16`, `q4_k`, …), shape and bytes.
        #[arg(long, conflicts_with_all = ["json", "schedule"])]
        weights: bool,
        /// Draw the middle transformer layer's decode dispatches and the data
        /// flowing between them to this SVG file.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["json", "schedule"])]
        svg: Option<PathBuf>,
    },
}

/// Where `compile` and `tune` take a hub model from.
#[derive(clap::Args)]
struct HubArgs {
    /// Branch, tag or commit of a hub model (default: main).
    #[arg(long, value_name = "REV")]
    revision: Option<String>,
    /// Which GGUF file of a repository or directory: its name, or a
    /// quantization such as Q4_K_M (`ORG/NAME:Q4_K_M` says the same).
    #[arg(long, value_name = "FILE|QUANT")]
    gguf: Option<String>,
    /// No progress bars (they are off anyway when standard error is not a terminal).
    #[arg(short, long)]
    quiet: bool,
    /// Read a local checkpoint whose files link outside its directory
    /// (refused by default: a checkpoint someone else prepared could
    /// otherwise point gerbilc at any file).
    #[arg(long)]
    allow_outside_links: bool,
}

impl HubArgs {
    fn options(self) -> HubOptions {
        hub_options(
            self.revision,
            self.gguf,
            Progress::new(self.quiet),
            self.allow_outside_links,
        )
    }
}

fn parse_passes(s: &str) -> Result<PassSelection, String> {
    s.parse()
}

/// Prints `--pass-stats` and the `--bisect` note to standard error.
fn report_passes(report: &PassReport, stats: bool, bisect: Option<usize>) {
    if stats {
        gerbil_cli::console::note(pass_stats(report).trim_end());
    }
    if let Some(n) = bisect {
        gerbil_cli::console::note(&bisect_note(report, n));
    }
}

fn parse_target(s: &str) -> Result<Box<Target>, String> {
    Target::named(s).map(Box::new).ok_or_else(|| {
        format!(
            "unknown target `{s}`; expected one of: {}",
            Target::NAMES.join(", ")
        )
    })
}

fn parse_quantization(s: &str) -> Result<Quantization, String> {
    Quantization::named(s).ok_or_else(|| {
        format!(
            "unknown quantization `{s}`; expected one of: {}",
            Quantization::NAMES.join(", ")
        )
    })
}

fn main() {
    // A child started to render a chat template renders it and exits here.
    gerbil_cli::env::serve_template_child();
    let cli = Cli::parse();
    gerbil_cli::logging::init(cli.verbose);
    // Ctrl-C: delete the file being written (its target stays as it was)
    // and stop with the shell's status for an interrupt.
    let handler = ctrlc::set_handler(|| {
        let removed = gerbil_plan::safe_file::remove_unfinished();
        let note = match removed.first() {
            Some(p) => format!("interrupted; removed the unfinished {}", p.display()),
            None => "interrupted".to_string(),
        };
        gerbil_cli::console::note(&note);
        std::process::exit(130);
    });
    if let Err(e) = handler {
        tracing::warn!("no Ctrl-C handler ({e}): an interrupt may leave a temporary file behind");
    }
    gerbil_cli::console::exit(real_main(cli))
}

/// Every file in `dir` (a checkpoint: config, weights, tokenizer), when it is a directory.
fn files_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Refuses, before any work, an output file that is a directory, a device,
/// a FIFO or one of the command's input files.
fn check_outputs(cmd: &Cmd) -> Result<()> {
    let (out, mut inputs) = match cmd {
        Cmd::Compile {
            repo,
            output: Some(out),
            tuning,
            ..
        } => (
            out,
            [files_in(repo), tuning.iter().cloned().collect()].concat(),
        ),
        Cmd::Tune { repo, output, .. } => (output, files_in(repo)),
        Cmd::Inspect {
            plan,
            svg: Some(out),
            ..
        } => (out, vec![plan.clone()]),
        _ => return Ok(()),
    };
    if let Cmd::Compile { repo, .. } | Cmd::Tune { repo, .. } = cmd {
        inputs.push(repo.clone());
    }
    Ok(safe_file::check_output(out, &inputs)?)
}

fn real_main(cli: Cli) -> Result<()> {
    check_outputs(&cli.cmd)?;
    match cli.cmd {
        Cmd::Compile {
            repo,
            hub,
            output,
            max_context,
            max_tokens_per_step,
            max_batch,
            no_selftest,
            disable_pass,
            dump_ir,
            dump_dot,
            emit_wgsl,
            target,
            max_storage_binding,
            pass_stats,
            bisect,
            tuning,
            allow_non_finite,
            quantize,
        } => {
            let progress = Progress::new(hub.quiet);
            let ckpt = open_checkpoint(&repo, &hub.options())?;
            check_text_assets(&ckpt, gerbil_cli::env::template_sandbox())?;
            let tuning = tuning.map(|path| Tuning::read(&path)).transpose()?;
            if let Some(out) = &output {
                // Again with the files a hub model resolved to.
                let mut inputs = files_in(&ckpt.dir);
                inputs.extend(ckpt.weights.files().into_iter().map(Path::to_path_buf));
                safe_file::check_output(out, &inputs)?;
            }
            if let Some(t) = tuning.as_ref().filter(|t| t.target != target.name) {
                gerbil_cli::console::note(&format!(
                    "note: the tuning was measured for target `{}`, not `{}`; tiles the target cannot run are left out",
                    t.target, target.name
                ));
            }
            let opts = CompileOptions {
                max_context,
                max_tokens_per_step,
                disabled_passes: disable_pass,
                target: *target,
                max_storage_binding,
                bisect,
                tuning,
                allow_non_finite,
                quantize,
                max_batch,
                // Only a plan that is written carries one.
                selftest: !no_selftest && output.is_some(),
            };
            let mut dumps = Dumps::new(dump_ir, dump_dot, gerbil_cli::console::StdoutWriter::new());
            let compiled = compile(&ckpt, &opts, &mut dumps)?;
            report_passes(&compiled.passes, pass_stats, bisect);
            let plan = compiled.plan;
            if let Some(dir) = &emit_wgsl {
                plan.emit_wgsl(dir)?;
            }
            if output.is_none() {
                // Without -o the weights are still read and checked, one at
                // a time, as writing would.
                plan.check_weights()?;
            }
            if let Some(out) = output {
                let mut bar = None;
                // The weights are read, checked and quantized as they are
                // written: a weight's error can stop the write midway.
                let written = plan.write_with_progress(&out, &mut |done, total| {
                    bar.get_or_insert_with(|| progress.bytes("writing plan", total))
                        .set_position(done);
                });
                if let Some(bar) = bar {
                    bar.finish_and_clear();
                }
                written?;
                let h = &plan.header;
                gerbil_cli::console::note(&format!(
                    "wrote {} ({} kernels, {} prefill / {} decode dispatches, {:.1} MB of weights)",
                    out.display(),
                    h.kernels.len(),
                    h.best_gpu_variant()
                        .prefill_at(h.model.max_tokens_per_step)
                        .len(),
                    h.best_gpu_variant().decode.len(),
                    plan.weight_bytes as f64 / 1e6
                ));
            }
        }
        Cmd::Tune {
            repo,
            hub,
            output,
            max_context,
            max_tokens_per_step,
            target,
        } => {
            let ckpt = open_checkpoint(&repo, &hub.options())?;
            let opts = CompileOptions {
                max_context,
                max_tokens_per_step,
                target: *target,
                ..CompileOptions::default()
            };
            let tuning = pollster::block_on(tune(&ckpt, &opts, gerbil_cli::console::note))?;
            tuning.write(&output)?;
            for g in &tuning.gemms {
                gerbil_cli::console::note(&format!(
                    "k{} n{}{} {}: {} {:.0} µs (untuned {:.0} µs)",
                    g.k,
                    g.n,
                    if g.glu { " glu" } else { "" },
                    g.dtype,
                    g.gemm_tile().tag(),
                    g.micros,
                    g.default_micros
                ));
            }
            gerbil_cli::console::note(&format!("wrote {}", output.display()));
        }
        Cmd::Opt {
            file,
            passes,
            pass_stats,
            bisect,
            dump_dot,
        } => {
            let (text, input) = if file.as_os_str() == "-" {
                let mut text = String::new();
                std::io::stdin()
                    .read_to_string(&mut text)
                    .context("reading the IR from standard input")?;
                (text, "<stdin>".to_string())
            } else {
                let text = std::fs::read_to_string(&file)
                    .with_context(|| format!("reading {}", file.display()))?;
                (text, file.display().to_string())
            };
            let opts = OptOptions { passes, bisect };
            // The result prints as `--dump-ir final` prints, by the same code.
            let stdout = gerbil_cli::console::StdoutWriter::new();
            let mut dumps = Dumps::new(Some(DumpIr::Final), dump_dot, stdout);
            let out = opt(&text, &input, &opts, &mut dumps)?;
            report_passes(&out.passes, pass_stats, bisect);
        }
        Cmd::Inspect {
            plan,
            json,
            schedule,
            weights,
            svg,
        } => {
            let plan = gerbil_plan::PlanFile::open(&plan)?;
            if let Some(out) = svg {
                let graph = layer_graph(&plan.header)?;
                safe_file::write_file(&out, render_svg(&graph)?.as_bytes())
                    .with_context(|| format!("writing {}", out.display()))?;
                gerbil_cli::console::note(&format!("wrote {} ({})", out.display(), graph.title));
                return Ok(());
            }
            if schedule {
                gerbil_cli::console::print(&render_schedule(&plan.header))?;
                return Ok(());
            }
            let i = inspect(&plan.header);
            if weights {
                gerbil_cli::console::print(&render_weights(&i))?;
            } else if json {
                gerbil_cli::console::print(&format!("{}\n", serde_json::to_string_pretty(&i)?))?;
            } else {
                gerbil_cli::console::print(&render(&i))?;
            }
        }
    }
    Ok(())
}
