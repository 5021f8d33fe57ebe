//! `gerbil-run`: runs gerbil plans — generate text, print JSON, benchmark.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use gerbil::ModelOptions;
use gerbil_cli::chat::{chat, ChatOptions};
use gerbil_cli::console;
use gerbil_cli::embed::{
    bench_embeddings, embed, EmbedBenchOptions, EmbedFormat, EmbedInput, EmbedOptions,
};
use gerbil_cli::env;
use gerbil_cli::gen_args::SamplingArgs;
use gerbil_cli::numbers::{positive, whole_u64, whole_usize};
use gerbil_cli::perplexity::{perplexity, report_text, PerplexityOptions};
use gerbil_cli::plan_cache;
use gerbil_cli::progress::Progress;
use gerbil_cli::run::{bench, run, BenchOptions, BenchReport, ProfileRow, Prompt, RunOptions};
use gerbil_cli::sweep::{run_sweep, SweepOptions};
use gerbil_grammar::Grammar;
use gerbil_runtime::{
    PipelineCacheOptions, PrecisionChoice, PrefillFallback, SamplingParams, SessionOptions,
};
use gerbil_serve::{serve, ServeOptions};
use std::fmt::Write as _;
use std::io::{IsTerminal, Read};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "gerbil-run",
    version,
    about = "Run a gerbil plan on any WebGPU device"
)]
struct Cli {
    /// The plan compiled by `gerbilc compile` (every command but `devices`
    /// needs one), or a hub model ORG/NAME or ORG/NAME:QUANT, compiled on
    /// first use into the plan cache ($GERBIL_CACHE_DIR/plans, else
    /// ~/.cache/gerbil/plans) and reused afterwards.
    #[arg(value_name = "PLAN|ORG/NAME[:QUANT]")]
    plan: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    gen: GenArgs,
    /// Log what gerbil does to stderr: `-v` the device, variant and load
    /// times, `-vv` debug detail, `-vvv` also wgpu's logs; `GERBIL_LOG` (a
    /// tracing filter) overrides it.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// No progress bars (they are off anyway when stderr is not a terminal).
    #[arg(short, long, global = true)]
    quiet: bool,
    /// Run on adapter N of `gerbil-run devices` instead of the default
    /// (high-performance) one.
    #[arg(long, global = true, value_name = "N", allow_negative_numbers = true, value_parser = whole_usize)]
    device: Option<usize>,
    /// Numerics: `f32` (exact against transformers), `f16` (f16 KV cache;
    /// needs shader-f16 and a plan with f16 variants: any but `--target
    /// portable`), or
    /// `auto`: f16 where the device and the plan allow it, else f32.
    #[arg(long, global = true, default_value = "auto", value_parser = parse_precision)]
    precision: PrecisionChoice,
    /// Run the plan's variant of this name (`gerbilc inspect` lists them)
    /// instead of the best one the device supports: to compare variants.
    #[arg(long, global = true)]
    variant: Option<String>,
    /// Compile every pipeline, neither reading nor writing the on-disk
    /// pipeline cache (kept in `$GERBIL_CACHE_DIR/pipelines`, else the user
    /// cache directory's `gerbil/pipelines`; `GERBIL_PIPELINE_CACHE=0` also
    /// turns it off).
    #[arg(long, global = true)]
    no_pipeline_cache: bool,
    /// Use the tensor-core (cooperative-matrix) variant where the adapter
    /// has it: the default; the flag also overrides `GERBIL_TENSOR_CORES=0`.
    #[arg(long, global = true, overrides_with = "no_tensor_cores")]
    tensor_cores: bool,
    /// Never use tensor cores: run the plan's best SIMT variant (to compare
    /// with it, or to step around a driver's cooperative-matrix bug);
    /// `GERBIL_TENSOR_CORES=0` does the same. Of the two flags the last wins.
    #[arg(long, global = true, overrides_with = "tensor_cores")]
    no_tensor_cores: bool,
    /// Run every prompt on the chosen variant, waiting for its pipelines:
    /// by default, while a tensor-core variant's prefill pipelines still
    /// compile (about a second on a cold start), prompts run on the plan's
    /// SIMT variant of the same precision, so the first token comes sooner
    /// but its logits are that variant's.
    #[arg(long, global = true)]
    no_prefill_fallback: bool,
    /// KV-cache size in tokens, up to the plan's --max-context (the
    /// default): a smaller context takes less GPU memory.
    #[arg(long, global = true, value_name = "N", allow_negative_numbers = true, value_parser = whole_u64)]
    ctx: Option<u64>,
}

impl Cli {
    /// The plan argument (a hub model's cached plan, compiled first if the
    /// cache lacks it), or an error saying it is missing.
    fn plan(&self) -> Result<PathBuf> {
        match &self.plan {
            Some(p) if plan_cache::is_hub_model(p) => {
                plan_cache::plan_for(p, Progress::new(self.quiet))
            }
            Some(p) => Ok(p.clone()),
            None => bail!(
                "no plan given: run `gerbil-run PLAN --prompt TEXT` (or `gerbil-run PLAN bench`), \
                 or `gerbil-run devices` to list the GPUs"
            ),
        }
    }

    /// How to load the plan for generation (chat, serve, a plain run).
    fn model_options(&self) -> ModelOptions {
        ModelOptions {
            session: SessionOptions {
                precision: self.precision,
                variant: self.variant.clone(),
                pipeline_cache: self.pipeline_cache(false),
                context: self.ctx,
                adapter: self.device,
                tensor_cores: self.tensor_cores(),
                prefill_fallback: self.prefill_fallback(),
                progress: Progress::new(self.quiet).runtime_hook(),
                ..env::session_defaults()
            },
            template_sandbox: env::template_sandbox(),
        }
    }

    /// Whether prompts may run on the prefill fallback.
    fn prefill_fallback(&self) -> PrefillFallback {
        match self.no_prefill_fallback {
            true => PrefillFallback::Off,
            false => PrefillFallback::default(),
        }
    }

    /// Whether to use tensor cores ([`env::tensor_cores_with`]).
    fn tensor_cores(&self) -> bool {
        env::tensor_cores_with(self.tensor_cores, self.no_tensor_cores)
    }

    /// The pipeline cache to use; `cold` ignores what is stored.
    fn pipeline_cache(&self, cold: bool) -> Option<PipelineCacheOptions> {
        if self.no_pipeline_cache {
            return None;
        }
        env::pipeline_cache_dir().map(|dir| PipelineCacheOptions { dir, read: !cold })
    }
}

fn parse_precision(s: &str) -> Result<PrecisionChoice, String> {
    s.parse()
}

/// `--shutdown-timeout`: seconds, from 0 to a day.
fn shutdown_seconds(s: &str) -> Result<f64, String> {
    let t: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if !(0.0..=86_400.0).contains(&t) {
        return Err(format!("{t} s: give 0 to 86400 seconds"));
    }
    Ok(t)
}

/// `--header-timeout`, `--body-timeout`: seconds, from 0.1 to an hour.
fn read_seconds(s: &str) -> Result<f64, String> {
    let t: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if !(0.1..=3_600.0).contains(&t) {
        return Err(format!("{t} s: give 0.1 to 3600 seconds"));
    }
    Ok(t)
}

/// The API key in the first line of `file`, or why not.
fn read_api_key(file: &std::path::Path) -> Result<String> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading the API key from {}", file.display()))?;
    let key = text.lines().next().unwrap_or("").trim();
    if key.is_empty() {
        bail!(
            "{} holds no API key: put the key on its first line",
            file.display()
        );
    }
    Ok(key.to_string())
}

/// `bench --temperature`: as generation runs it ([`gerbil::effective_temperature`]).
fn to_effective_temperature(s: &str) -> Result<f32, String> {
    let t: f32 = s.parse().map_err(|e| format!("{e}"))?;
    Ok(gerbil::effective_temperature(t))
}

/// `--repeats`: a positive count.
fn at_least_one(s: &str) -> Result<usize, String> {
    positive(s, "0 repetitions time nothing; give at least 1")
}

/// `--top-logits`: at least one logit per step.
fn logits_to_record(s: &str) -> Result<usize, String> {
    positive(
        s,
        "0 records no logits; give K of 1 or more, or drop --top-logits",
    )
}

/// `--max-body-bytes`: room for at least a small request.
fn body_limit(s: &str) -> Result<usize, String> {
    const SMALLEST: usize = 1024;
    match whole_usize(s)? {
        n if n < SMALLEST => Err(format!(
            "{n} bytes would refuse nearly every request; give at least {SMALLEST}"
        )),
        n => Ok(n),
    }
}

#[derive(Args)]
struct GenArgs {
    /// Prompt text (tokenized like `tokenizer(text)` in transformers); `-`
    /// reads standard input, as does a piped input without --prompt.
    #[arg(long, conflicts_with = "input_ids")]
    prompt: Option<String>,
    /// Apply the model's chat template to the prompt as one user message.
    #[arg(long, conflicts_with = "input_ids")]
    chat: bool,
    /// With --chat: the system message.
    #[arg(long)]
    system: Option<String>,
    /// Comma-separated token ids instead of a prompt.
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    input_ids: Option<Vec<u32>>,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Record the K largest logits of every step (with --json).
    #[arg(long, value_name = "K", value_parser = logits_to_record, allow_negative_numbers = true)]
    top_logits: Option<usize>,
    /// Print exactly one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// The answer is JSON valid against the JSON schema in FILE (a grammar
    /// masks every token; the answer ends when the JSON does).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["json_object", "grammar"])]
    json_schema: Option<PathBuf>,
    /// The answer is a JSON object.
    #[arg(long, conflicts_with = "grammar")]
    json_object: bool,
    /// The answer follows the Lark grammar in FILE (llguidance's dialect).
    #[arg(long, value_name = "FILE")]
    grammar: Option<PathBuf>,
}

impl GenArgs {
    /// Whether any flag of a plain run was given.
    fn any_given(&self) -> bool {
        self.prompt.is_some()
            || self.chat
            || self.system.is_some()
            || self.input_ids.is_some()
            || self.sampling.any_given()
            || self.top_logits.is_some()
            || self.json
            || self.json_schema.is_some()
            || self.json_object
            || self.grammar.is_some()
    }

    /// The grammar the answer must follow, read from its file.
    fn grammar(&self) -> Result<Option<Grammar>> {
        let read = |path: &PathBuf, what: &str| {
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the {what} {}", path.display()))
        };
        if let Some(path) = &self.json_schema {
            let text = read(path, "JSON schema")?;
            let schema = serde_json::from_str(&text)
                .with_context(|| format!("the JSON schema {} is not valid JSON", path.display()))?;
            return Ok(Some(Grammar::JsonSchema(schema)));
        }
        if self.json_object {
            return Ok(Some(Grammar::JsonObject));
        }
        match &self.grammar {
            Some(path) => Ok(Some(Grammar::Lark(read(path, "grammar")?))),
            None => Ok(None),
        }
    }

    /// The prompt: `--prompt`, `--input-ids`, or standard input (`--prompt
    /// -`, or piped without either).
    fn prompt(&self) -> Result<Prompt> {
        if self.system.is_some() && !self.chat {
            bail!(
                "--system is the system message of a chat prompt: add --chat (the prompt becomes \
                 the user message of the model's chat template), or drop --system"
            );
        }
        let text = match (&self.prompt, &self.input_ids) {
            (_, Some(ids)) => return Ok(Prompt::Ids(ids.clone())),
            (Some(t), None) if t != "-" => t.clone(),
            (Some(_), None) => read_stdin()?,
            (None, None) if !std::io::stdin().is_terminal() => read_stdin()?,
            (None, None) => bail!(
                "give --prompt TEXT (or pipe the prompt in), --input-ids 1,2,3, or run `gerbil-run PLAN chat`"
            ),
        };
        Ok(Prompt::Text {
            text,
            chat: self.chat,
            system: self.system.clone(),
        })
    }
}

/// Standard input as the prompt (one trailing newline removed).
fn read_stdin() -> Result<String> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("reading the prompt from standard input")?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(text)
}

#[derive(Subcommand)]
enum Cmd {
    /// List the GPU adapters (index, backend, type, driver, features,
    /// limits); `--device N` picks one. Takes no plan.
    Devices {
        /// Print one JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Chat with the model: each line of standard input is a message; the
    /// conversation's earlier turns stay in the KV cache. Commands: /reset,
    /// /system TEXT, /stats, /exit.
    Chat {
        /// The system message.
        #[arg(long)]
        system: Option<String>,
        #[command(flatten)]
        sampling: SamplingArgs,
    },
    /// Serve the model over HTTP with OpenAI's API: POST
    /// /v1/chat/completions and /v1/completions (`"stream": true` for
    /// server-sent events), or /v1/embeddings for an embedding plan, GET
    /// /v1/models and /health, and a chat page at
    /// / (which can also run the plan in the browser, downloading it from
    /// GET /v1/plan, when given --web-dir). Ctrl-C stops.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Port; 0 picks a free one (printed as `listening on http://…`).
        #[arg(long, default_value_t = 8080, allow_negative_numbers = true)]
        port: u16,
        /// The model's id in responses [default: the plan's file name
        /// without extension].
        #[arg(long)]
        model_name: Option<String>,
        /// Largest request body in bytes (at least 1024); larger ones get
        /// status 413.
        #[arg(long, default_value_t = 1 << 20, value_parser = body_limit, allow_negative_numbers = true)]
        max_body_bytes: usize,
        /// Require `Authorization: Bearer KEY` on every /v1 route (else
        /// 401); also `--api-key-file` or the GERBIL_API_KEY variable, which
        /// keep the key out of the process list.
        #[arg(long, value_name = "KEY", conflicts_with = "api_key_file")]
        api_key: Option<String>,
        /// Read the API key from the first line of FILE.
        #[arg(long, value_name = "FILE")]
        api_key_file: Option<PathBuf>,
        /// Also answer requests whose Host header names NAME (besides IP
        /// addresses and localhost); others get 403 (DNS rebinding).
        #[arg(long, value_name = "NAME")]
        allowed_host: Vec<String>,
        /// Allow cross-origin requests from web pages of ORIGIN (e.g.
        /// `https://app.example`, or `*` for any) with CORS headers; other
        /// origins get 403.
        #[arg(long, value_name = "ORIGIN")]
        cors_origin: Vec<String>,
        /// After Ctrl-C or SIGTERM, wait this long for the requests in
        /// flight, then close their connections (a second signal stops at
        /// once).
        #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = shutdown_seconds, allow_negative_numbers = true)]
        shutdown_timeout: f64,
        /// Close a connection that has not sent a whole request head within
        /// this long (also an idle keep-alive connection).
        #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = read_seconds, allow_negative_numbers = true)]
        header_timeout: f64,
        /// Answer 408 to a request whose body has not arrived within this
        /// long.
        #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = read_seconds, allow_negative_numbers = true)]
        body_timeout: f64,
        /// Connections open at once; one more gets status 503 with
        /// Retry-After and is closed.
        #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
        max_connections: u32,
        /// Requests that may wait while the model answers another; one
        /// more gets status 503 with Retry-After.
        #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65_536))]
        max_queue: u32,
        /// Sequences whose KV caches the server keeps (each prompt runs in
        /// the one that holds the most of it, so users taking turns keep
        /// their conversations cached); each costs a KV cache of --ctx
        /// positions.
        #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
        slots: u32,
        /// Serve no chat page at / and no plan at /v1/plan.
        #[arg(long, conflicts_with = "web_dir")]
        no_web: bool,
        /// Serve the page `scripts/web.sh` built in DIR (e.g. web/dist): the
        /// built-in page plus the browser engine, so the page can run the
        /// plan on the browser's own GPU (WebGPU).
        #[arg(long, value_name = "DIR")]
        web_dir: Option<PathBuf>,
    },
    /// Sentence embeddings from an embedding plan (all-MiniLM-L6-v2,
    /// Qwen3-Embedding, EmbeddingGemma, ...): one JSON line per input, `{"index", "tokens",
    /// "embedding"}`, or with --format npy one float32 array. Texts from
    /// --text, else --jsonl, else standard input (one a line), read and
    /// written a step at a time.
    Embed {
        /// A text to embed (repeatable).
        #[arg(long)]
        text: Vec<String>,
        /// A JSONL file: each line a JSON string or an object with `text`.
        #[arg(long, value_name = "FILE", conflicts_with = "text")]
        jsonl: Option<PathBuf>,
        /// Keep the first tokens of an input longer than the model takes
        /// (sentence-transformers' behaviour) instead of failing.
        #[arg(long)]
        truncate: bool,
        /// Keep the first N values of each vector (a Matryoshka model's
        /// shorter embedding), renormalized when the model's are unit length.
        #[arg(long, value_name = "N")]
        dimensions: Option<usize>,
        /// `json`: a line per input; `npy`: one NumPy float32 array of shape
        /// (inputs, dimensions).
        #[arg(long, value_enum, default_value_t = EmbedFormat::Json)]
        format: EmbedFormat,
        /// Write the vectors to FILE instead of standard output.
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Score a text: perplexity, and with --against another plan of the
    /// same model the KL divergence and top-1 agreement of their next-token
    /// distributions (llama-perplexity's method: windows of --window tokens,
    /// the second half of each scored). A plan compiled with `--disable-pass
    /// slice-last-row` scores many tokens per step, otherwise one.
    Perplexity {
        /// The text file (UTF-8); `data/moby-dick.txt` in gerbil's
        /// repository is a public-domain one.
        file: PathBuf,
        /// Tokens per window; the second half of each is scored.
        #[arg(long, default_value_t = 512, allow_negative_numbers = true, value_parser = whole_usize)]
        window: usize,
        /// Score only the first N windows.
        #[arg(long, value_name = "N", value_parser = at_least_one, allow_negative_numbers = true)]
        max_windows: Option<usize>,
        /// A plan of the same model (e.g. its bf16 or q8_0 compile) to
        /// compare against: KL(base ‖ plan) and top-1 agreement. It runs
        /// its best variant at --precision; --variant picks only the scored
        /// plan's, so `PLAN perplexity F --variant V --against PLAN`
        /// compares two variants of one plan.
        #[arg(long, value_name = "BASE_PLAN")]
        against: Option<PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Check every variant this device runs against the reference output
    /// the plan carries (a short prompt computed on the CPU when it was
    /// compiled): the largest difference per variant, passed or failed
    /// against its tolerance. Exits with status 1 when a variant fails.
    Selftest {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Measure prefill and decode speed and GPU memory.
    Bench {
        /// Prompt length.
        #[arg(long, default_value_t = 128, allow_negative_numbers = true, value_parser = whole_usize)]
        prompt_tokens: usize,
        /// Tokens to decode.
        #[arg(long, default_value_t = 128, allow_negative_numbers = true, value_parser = whole_usize)]
        new_tokens: usize,
        /// Time decode from D tokens of context (llama-bench's `-d`; 0 starts
        /// from an empty cache) instead of right after the prompt.
        #[arg(long, value_name = "D", allow_negative_numbers = true, value_parser = whole_usize)]
        depth: Option<usize>,
        /// Time sampled decoding at this temperature (0, or below 1e-4: greedy).
        #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = to_effective_temperature)]
        temperature: f32,
        /// With --temperature: sample among the K most likely tokens [default: 0, all].
        #[arg(long, allow_negative_numbers = true, value_parser = whole_usize)]
        top_k: Option<usize>,
        /// With --temperature: nucleus sampling threshold [default: 1, off].
        #[arg(long, allow_negative_numbers = true)]
        top_p: Option<f32>,
        /// With --temperature: keep tokens at least this fraction as likely
        /// as the best [default: 0, off].
        #[arg(long, allow_negative_numbers = true)]
        min_p: Option<f32>,
        /// Timed repetitions (median reported).
        #[arg(long, default_value_t = 3, value_parser = at_least_one, allow_negative_numbers = true)]
        repeats: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Also report GPU time per kind of dispatch (needs timestamp queries).
        #[arg(long)]
        profile: bool,
        /// Start with an empty pipeline cache, as on a first run, to time a
        /// cold load (the cache is still written for the next run).
        #[arg(long)]
        cold: bool,
        /// Time prefill and decode at context lengths doubling from 128 up
        /// to the plan's context (--new-tokens decoded from each depth) and
        /// print a table (with --json, an array of points).
        #[arg(long, conflicts_with_all = ["depth", "prompt_tokens", "profile"])]
        sweep: bool,
        /// With --sweep: also draw prefill and decode tok/s against context
        /// length as an SVG line chart.
        #[arg(long, value_name = "FILE", requires = "sweep")]
        plot: Option<PathBuf>,
        /// Also time batch steps of B sequences decoding together from the
        /// same depth (a plan compiled with `--max-batch` B or more):
        /// aggregate tok/s, and its ratio to one sequence's.
        #[arg(long, value_name = "B", conflicts_with = "sweep", value_parser = at_least_one, allow_negative_numbers = true)]
        batch: Option<usize>,
    },
}

fn main() {
    // A child started to render a chat template renders it and exits here.
    gerbil_cli::env::serve_template_child();
    let cli = Cli::parse();
    gerbil_cli::logging::init(cli.verbose);
    console::exit(real_main(cli))
}

fn real_main(mut cli: Cli) -> Result<()> {
    let cmd = cli.cmd.take();
    if cmd.is_some() && cli.gen.any_given() {
        bail!(
            "--prompt, --input-ids, --json and the generation flags belong to a plain run \
             (`gerbil-run PLAN --prompt TEXT`); `chat` takes its own flags after the word `chat`"
        );
    }
    if matches!(cmd, Some(Cmd::Bench { .. })) && cli.ctx.is_some() {
        bail!("bench times the plan's whole context; drop --ctx (or compile with --max-context N)");
    }
    match cmd {
        Some(Cmd::Bench {
            prompt_tokens,
            new_tokens,
            depth,
            temperature,
            top_k,
            top_p,
            min_p,
            repeats,
            json,
            profile,
            cold,
            sweep,
            ref plot,
            batch,
        }) => {
            if temperature <= 0.0 {
                let given = [
                    ("--top-k", top_k.is_some()),
                    ("--top-p", top_p.is_some()),
                    ("--min-p", min_p.is_some()),
                ];
                if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
                    bail!(
                        "{flag} only applies to sampled decoding, and bench times greedy decoding \
                         unless --temperature T (T > 0) is given: add --temperature, or drop {flag}"
                    );
                }
            }
            // Bench and sweep time the same sampling, with a fixed seed.
            let sampling = SamplingParams {
                temperature,
                top_k: top_k.unwrap_or(0),
                top_p: top_p.unwrap_or(1.0),
                min_p: min_p.unwrap_or(0.0),
                seed: 0,
                ..SamplingParams::default()
            };
            let plan = cli.plan()?;
            if gerbil_plan::PlanFile::open(&plan)?
                .header
                .model
                .embedding
                .is_some()
            {
                let decode_only = [
                    ("--sweep", sweep),
                    ("--cold", cold),
                    ("--depth", depth.is_some()),
                    ("--temperature", temperature > 0.0),
                ];
                if let Some((flag, _)) = decode_only.iter().find(|(_, given)| *given) {
                    bail!(
                        "{flag} times decoding, and this is an embedding plan: its bench takes \
                         --prompt-tokens (each input), --batch (inputs), --repeats, --profile and \
                         --json"
                    );
                }
                let opts = EmbedBenchOptions {
                    tokens: prompt_tokens,
                    batch: batch.unwrap_or(64),
                    repeats,
                    profile,
                    model: cli.model_options(),
                };
                let r = pollster::block_on(bench_embeddings(&plan, &opts))?;
                let out = if json {
                    serde_json::to_string(&r)? + "\n"
                } else {
                    let mut out = format!(
                        "embedding: {} tokens an input; one input {:.2} ms; {} inputs {:.1} ms \
                         ({:.0} inputs/s, {:.0} tok/s)\n",
                        r.input_tokens,
                        r.latency_ms,
                        r.batch,
                        r.batch_ms,
                        r.sentences_per_s,
                        r.tokens_per_s
                    );
                    if let (Some(copy), Some(rows)) = (r.copy_gb_s, &r.profile) {
                        writeln!(out, "copy        {copy:.0} GB/s (the profile's roofline)")?;
                        write_profile(&mut out, "embedding", rows)?;
                    }
                    out
                };
                console::print(&out)?;
                return Ok(());
            }
            if sweep {
                let opts = SweepOptions {
                    new_tokens,
                    sampling,
                    repeats,
                    precision: cli.precision,
                    variant: cli.variant.clone(),
                    pipeline_cache: cli.pipeline_cache(cold),
                    adapter: cli.device,
                    tensor_cores: cli.tensor_cores(),
                };
                let plot = plot.as_deref();
                return pollster::block_on(run_sweep(&cli.plan()?, &opts, json, plot));
            }
            let pipeline_cache = cli.pipeline_cache(cold);
            let r = pollster::block_on(bench(
                &cli.plan()?,
                BenchOptions {
                    prompt_tokens,
                    new_tokens,
                    depth,
                    sampling,
                    repeats,
                    profile,
                    precision: cli.precision,
                    variant: cli.variant.clone(),
                    pipeline_cache,
                    adapter: cli.device,
                    tensor_cores: cli.tensor_cores(),
                    prefill_fallback: cli.prefill_fallback(),
                    batch,
                },
            ))?;
            let text = if json {
                format!("{}\n", serde_json::to_string(&r)?)
            } else {
                bench_text(&r, prompt_tokens, new_tokens)?
            };
            console::print(&text)?;
        }
        Some(Cmd::Serve {
            host,
            port,
            model_name,
            max_body_bytes,
            api_key,
            api_key_file,
            allowed_host,
            cors_origin,
            shutdown_timeout,
            header_timeout,
            body_timeout,
            max_connections,
            max_queue,
            slots,
            no_web,
            web_dir,
        }) => {
            let web = match (no_web, web_dir) {
                (true, _) => gerbil_serve::WebPage::Off,
                (false, Some(dir)) => {
                    gerbil_serve::web::check_dir(&dir)?;
                    gerbil_serve::WebPage::Dir(dir)
                }
                (false, None) => gerbil_serve::WebPage::Embedded,
            };
            let api_key = match (api_key, api_key_file) {
                (Some(key), _) => Some(key),
                (None, Some(file)) => Some(read_api_key(&file)?),
                (None, None) => env::api_key(),
            };
            if api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
                bail!("--api-key is empty: give a key, or leave the flag out");
            }
            let opts = ServeOptions {
                host,
                port,
                model_name,
                limits: gerbil_serve::Limits {
                    max_connections: max_connections as usize,
                    header_timeout: std::time::Duration::from_secs_f64(header_timeout),
                    body_timeout: std::time::Duration::from_secs_f64(body_timeout),
                    max_body_bytes,
                },
                model: {
                    let mut model = cli.model_options();
                    model.session.slots = slots as usize;
                    model
                },
                max_queue: max_queue as usize,
                access: gerbil_serve::Access {
                    api_key,
                    allowed_hosts: allowed_host,
                    cors_origins: cors_origin,
                },
                shutdown_timeout: std::time::Duration::from_secs_f64(shutdown_timeout),
                web,
                notes: std::sync::Arc::new(console::note),
            };
            serve(&cli.plan()?, &opts)?;
        }
        Some(Cmd::Selftest { json }) => {
            let plan = gerbil_plan::PlanFile::open(&cli.plan()?)?;
            let opts = cli.model_options().session;
            let report = pollster::block_on(gerbil_runtime::selftest::run(&plan, &opts))?;
            let out = if json {
                format!("{}\n", serde_json::to_string(&report)?)
            } else {
                gerbil_cli::selftest::report_text(&report)
            };
            console::print(&out)?;
            if !report.passed() {
                bail!("{}", gerbil_cli::selftest::failure(&report));
            }
        }
        Some(Cmd::Perplexity {
            file,
            window,
            max_windows,
            against,
            json,
        }) => {
            let text =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let text = String::from_utf8(text).map_err(|e| {
                anyhow::anyhow!(
                    "{} is not UTF-8 text (invalid byte at offset {}): give a UTF-8 text file",
                    file.display(),
                    e.utf8_error().valid_up_to()
                )
            })?;
            let opts = PerplexityOptions {
                window,
                max_windows,
                against,
                model: cli.model_options(),
                quiet: cli.quiet,
            };
            let r = pollster::block_on(perplexity(&cli.plan()?, &text, &opts))?;
            let out = if json {
                format!("{}\n", serde_json::to_string(&r)?)
            } else {
                report_text(&r)
            };
            console::print(&out)?;
        }
        Some(Cmd::Embed {
            text,
            jsonl,
            truncate,
            dimensions,
            format,
            output,
        }) => {
            let input = match (text.is_empty(), jsonl) {
                (false, _) => EmbedInput::Texts(text),
                (true, Some(path)) => EmbedInput::Jsonl(path),
                (true, None) => EmbedInput::Stdin,
            };
            let opts = EmbedOptions {
                input,
                truncate,
                dimensions,
                format,
                output,
                quiet: cli.quiet,
                model: cli.model_options(),
            };
            pollster::block_on(embed(&cli.plan()?, &opts))?;
        }
        Some(Cmd::Devices { json }) => {
            if let Some(plan) = &cli.plan {
                bail!(
                    "`gerbil-run devices` takes no plan (got {}); run `gerbil-run devices`",
                    plan.display()
                );
            }
            if let Some(n) = cli.device {
                bail!(
                    "`gerbil-run devices` lists every adapter; --device {n} picks one for a run \
                     (`gerbil-run PLAN --device {n} …`): drop it here"
                );
            }
            console::print(&pollster::block_on(gerbil_cli::devices::devices(json))?)?;
        }
        Some(Cmd::Chat { system, sampling }) => {
            let opts = ChatOptions {
                system,
                sampling,
                model: cli.model_options(),
                quiet: cli.quiet,
            };
            pollster::block_on(chat(&cli.plan()?, &opts))?;
        }
        None => {
            let opts = RunOptions {
                prompt: cli.gen.prompt()?,
                sampling: cli.gen.sampling.clone(),
                top_logits: cli.gen.top_logits,
                json: cli.gen.json,
                grammar: cli.gen.grammar()?,
                model: cli.model_options(),
                quiet: cli.quiet,
            };
            pollster::block_on(run(&cli.plan()?, &opts))?;
        }
    }
    Ok(())
}

/// `gerbil-run bench`'s report as text.
fn bench_text(
    r: &BenchReport,
    prompt_tokens: usize,
    new_tokens: usize,
) -> Result<String, std::fmt::Error> {
    let mut s = String::new();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    writeln!(s, "device      {}", r.device)?;
    writeln!(s, "variant     {} ({})", r.variant, r.precision)?;
    writeln!(
        s,
        "load        {:.0} ms; first token of the prompt at {:.0} ms ({:.0} ms of it creating its {} \
         pipelines)",
        r.load_ms, r.first_token_ms, r.first_token_pipelines_ms, r.first_token_pipelines
    )?;
    writeln!(
        s,
        "            plan {:.0} ms, device {:.0} ms, weights {:.0} ms, layouts {:.0} ms; pipelines \
         {:.0} ms in all ({} on up to {} threads, pipeline cache {}); prefill chunk {} tokens",
        r.load_plan_ms,
        r.load_device_ms,
        r.load_weights_ms,
        r.load_pipelines_ms,
        r.pipelines_ms,
        r.pipelines,
        r.pipeline_threads,
        r.pipeline_cache,
        r.max_tokens_per_step
    )?;
    writeln!(
        s,
        "prefill     {:.1} tok/s ({prompt_tokens} tokens)",
        r.prefill_tok_s
    )?;
    writeln!(
        s,
        "decode      {:.1} tok/s ({:.2} ms/token, {new_tokens} tokens from depth {}, {})",
        r.decode_tok_s, r.decode_ms_per_token, r.decode_depth, r.decode_loop
    )?;
    if let Some(b) = &r.batch {
        writeln!(
            s,
            "batch       {:.1} tok/s over {} sequences ({:.2} ms/step, {:.1}× one sequence's)",
            b.tok_s, b.rows, b.ms_per_step, b.vs_one
        )?;
    }
    writeln!(
        s,
        "dispatches  {} per prefill step, {} per decode step",
        r.dispatches.0, r.dispatches.1
    )?;
    writeln!(
        s,
        "gpu memory  weights {:.1} MiB, kv cache {:.1} MiB, activations {:.1} MiB",
        mib(r.weights_bytes),
        mib(r.kv_cache_bytes),
        mib(r.activation_bytes)
    )?;
    if let Some(c) = r.copy_gb_s {
        writeln!(
            s,
            "copy        {c:.0} GB/s (read + write; the profile's roofline)"
        )?;
    }
    let batch_profile = r.batch.as_ref().and_then(|b| b.profile.as_ref());
    for (name, rows) in [
        ("prefill", r.prefill_profile.as_ref()),
        ("decode", r.decode_profile.as_ref()),
        ("batch", batch_profile),
    ] {
        if let Some(rows) = rows {
            write_profile(&mut s, name, rows)?;
        }
    }
    Ok(s)
}

/// A profile's table: `name`'s step GPU time, then a line per dispatch kind.
fn write_profile(s: &mut String, name: &str, rows: &[ProfileRow]) -> std::fmt::Result {
    let total: f64 = rows.iter().map(|x| x.micros).sum();
    writeln!(s, "{name} step GPU time {total:.1} µs:")?;
    for x in rows {
        let tflops = if x.tflop_s > 0.0 {
            format!("  {:>6.2} TFLOP/s", x.tflop_s)
        } else {
            String::new()
        };
        writeln!(
            s,
            "  {:<22} {:>4}×  {:>10.1} µs  {:>5.1}%  {:>8.1} GB/s  {:>4.0}% of copy{tflops}",
            x.what,
            x.count,
            x.micros,
            100.0 * x.micros / total.max(1e-9),
            x.gb_s,
            100.0 * x.of_copy
        )?;
    }
    Ok(())
}
