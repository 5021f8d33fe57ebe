//! The compiler driver: HF checkpoint directory in, plan file out.

use anyhow::{bail, Context, Result};
use gerbil_codegen_wgsl::{generate, CodegenOptions, Program};
use gerbil_frontend_hf::{lower_with, Checkpoint, LowerOptions, TensorView, TextAssets};
use gerbil_ir::{print::print, DType, Graph, WeightSource};
use gerbil_passes::{default_pipeline, PassManager};
use gerbil_plan::{
    write_plan, BufferKind, CompileInfo, DataLayout, ModelInfo, PlanHeader, SectionData, TextInfo,
};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Largest context a plan gets unless `--max-context` says otherwise.
pub const DEFAULT_MAX_CONTEXT_CAP: u64 = 4096;
/// Default prefill chunk (tokens per step).
pub const DEFAULT_MAX_TOKENS_PER_STEP: u64 = 256;

/// Which IR dumps to print.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DumpIr {
    /// The graph as lowered, before any pass.
    Lowered,
    /// After the named pass.
    After(String),
    /// Before the first pass and after every pass.
    All,
}

impl std::str::FromStr for DumpIr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "" | "lowered" | "before" => Ok(DumpIr::Lowered),
            "all" => Ok(DumpIr::All),
            _ => match s.strip_prefix("after=") {
                Some("all") => Ok(DumpIr::All),
                Some(name) if !name.is_empty() => Ok(DumpIr::After(name.to_string())),
                _ => Err(format!(
                    "expected `lowered`, `all` or `after=PASS`, got `{s}`"
                )),
            },
        }
    }
}

/// Device limits to compile for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// WebGPU-portable limits (128 MiB storage bindings), as on lavapipe and browsers.
    Portable,
    /// Desktop GPUs (2 GiB − 4 storage bindings).
    Desktop,
}

impl Target {
    /// Largest storage binding of the target.
    pub fn max_storage_binding(self) -> u64 {
        match self {
            Target::Portable => 128 << 20,
            Target::Desktop => (2u64 << 30) - 4,
        }
    }
}

/// Settings of one compilation.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Checkpoint directory.
    pub repo: PathBuf,
    /// Plan to write (none: only dumps).
    pub output: Option<PathBuf>,
    /// KV-cache capacity; default `min(max_position_embeddings, 4096)`.
    pub max_context: Option<u64>,
    /// Prefill chunk size.
    pub max_tokens_per_step: u64,
    /// Passes to skip.
    pub disabled_passes: Vec<String>,
    /// IR dumps to print on stdout.
    pub dump_ir: Option<DumpIr>,
    /// Directory for Graphviz files.
    pub dump_dot: Option<PathBuf>,
    /// Directory for every kernel's WGSL.
    pub emit_wgsl: Option<PathBuf>,
    /// Target limits.
    pub target: Target,
    /// Overrides the target's largest storage binding (bytes); weights larger
    /// than this are split into row shards.
    pub max_storage_binding: Option<u64>,
}

/// What a compilation produced.
pub struct Compiled {
    /// The final graph.
    pub graph: Graph,
    /// The plan header written (or that would be written).
    pub header: PlanHeader,
    /// Bytes of weight data.
    pub weight_bytes: u64,
}

fn op_counts(graph: &Graph) -> Vec<(String, u64)> {
    let mut m: BTreeMap<String, u64> = BTreeMap::new();
    for n in graph.g.node_weights().filter(|n| !n.op.is_source()) {
        *m.entry(n.op.mnemonic().to_string()).or_default() += 1;
    }
    m.into_iter().collect()
}

fn write_dot(dir: &Path, name: &str, graph: &Graph) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{name}.dot"));
    std::fs::write(&path, gerbil_ir::dot::to_dot(graph))
        .with_context(|| format!("writing {}", path.display()))
}

/// The rotary table `[rows, 2·pairs]`: cos of each frequency, then sin,
/// computed as transformers does (f32 product of position and frequency,
/// cos/sin of that f32, times the attention scaling in f32).
pub fn rope_table(inv_freq: &[f32], scaling: f32, rows: u64) -> Vec<u8> {
    let pairs = inv_freq.len();
    let mut out = Vec::with_capacity(rows as usize * pairs * 2 * 4);
    for p in 0..rows {
        let angles: Vec<f32> = inv_freq.iter().map(|&f| p as f32 * f).collect();
        for &a in &angles {
            out.extend_from_slice(&(((a as f64).cos() as f32) * scaling).to_le_bytes());
        }
        for &a in &angles {
            out.extend_from_slice(&(((a as f64).sin() as f32) * scaling).to_le_bytes());
        }
    }
    out
}

fn pad4(bytes: Cow<'_, [u8]>) -> Cow<'_, [u8]> {
    if bytes.len().is_multiple_of(4) {
        bytes
    } else {
        let mut v = bytes.into_owned();
        v.resize(v.len().div_ceil(4) * 4, 0);
        Cow::Owned(v)
    }
}

/// Where weight bytes come from: a checkpoint, or tensors built in memory (tests).
pub trait TensorSource {
    /// The tensor's dtype, shape and raw little-endian bytes.
    fn tensor(&self, name: &str) -> Result<TensorView<'_>>;
}

impl TensorSource for Checkpoint {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        Ok(Checkpoint::tensor(self, name)?)
    }
}

fn materialize<'a>(
    ckpt: &'a dyn TensorSource,
    source: &WeightSource,
    dtype: DType,
    rows: u64,
) -> Result<SectionData<'a>> {
    Ok(match source {
        WeightSource::Checkpoint { tensor } => {
            let view = ckpt.tensor(tensor)?;
            if view.dtype != dtype {
                bail!(
                    "tensor `{tensor}` is {} but the graph expects {dtype}",
                    view.dtype
                );
            }
            Cow::Borrowed(view.data)
        }
        WeightSource::Concat { tensors } => {
            let mut v = Vec::new();
            for t in tensors {
                v.extend_from_slice(ckpt.tensor(t)?.data);
            }
            Cow::Owned(v)
        }
        WeightSource::Rows {
            tensor,
            start,
            count,
        } => {
            let view = ckpt.tensor(tensor)?;
            if view.dtype != dtype {
                bail!(
                    "tensor `{tensor}` is {} but the graph expects {dtype}",
                    view.dtype
                );
            }
            let total = view.shape.first().copied().unwrap_or(0);
            if total == 0 || start + count > total {
                bail!(
                    "tensor `{tensor}` has {total} rows; rows {start}..{} were asked for",
                    start + count
                );
            }
            let row_bytes = view.data.len() as u64 / total;
            let (a, b) = (start * row_bytes, (start + count) * row_bytes);
            Cow::Borrowed(&view.data[a as usize..b as usize])
        }
        WeightSource::RopeTable {
            inv_freq,
            attention_scaling,
        } => Cow::Owned(rope_table(inv_freq, *attention_scaling, rows)),
    })
}

/// Compiles a checkpoint: lowers it, runs the passes (printing requested
/// dumps to stdout), generates kernels and, if an output path is set,
/// writes the plan.
pub fn compile(opts: &CompileOptions) -> Result<Compiled> {
    let ckpt = Checkpoint::open(&opts.repo)?;
    let max_position_embeddings = ckpt.config.max_position_embeddings;
    let max_context = opts
        .max_context
        .unwrap_or_else(|| max_position_embeddings.min(DEFAULT_MAX_CONTEXT_CAP));
    if max_context == 0 {
        bail!("--max-context must be at least 1");
    }
    // The context matters to lowering: LongRoPE picks its factors by it.
    let lowered = lower_with(
        &ckpt,
        &LowerOptions {
            max_context: Some(max_context),
        },
    )?;
    let mut graph = lowered.graph;
    let facts = lowered.facts;
    if max_context > facts.max_position_embeddings {
        tracing::warn!(
            "--max-context {max_context} exceeds the model's max_position_embeddings {}",
            facts.max_position_embeddings
        );
    }
    let max_tokens_per_step = opts.max_tokens_per_step.clamp(1, max_context);
    let ops_before = op_counts(&graph);

    let mut pm = PassManager::new(default_pipeline());
    for name in &opts.disabled_passes {
        pm.disable(name)?;
    }
    if let Some(DumpIr::After(name)) = &opts.dump_ir {
        pm.check_name(name)?;
    }
    let dump = opts.dump_ir.clone();
    if matches!(dump, Some(DumpIr::Lowered) | Some(DumpIr::All)) {
        println!("// IR as lowered\n{}", print(&graph));
    }
    if let Some(dir) = &opts.dump_dot {
        write_dot(dir, "00-lowered", &graph)?;
    }
    let mut dot_err = None;
    let mut index = 0;
    let report = pm.run(&mut graph, |name, g| {
        index += 1;
        let show = match &dump {
            Some(DumpIr::All) => true,
            Some(DumpIr::After(n)) => n == name,
            _ => false,
        };
        if show {
            println!("// IR after {name}\n{}", print(g));
        }
        if let Some(dir) = &opts.dump_dot {
            if let Err(e) = write_dot(dir, &format!("{index:02}-{name}"), g) {
                dot_err = Some(e);
            }
        }
    })?;
    if let Some(e) = dot_err {
        return Err(e);
    }
    let ops_after = op_counts(&graph);

    let mut passes: Vec<String> = report.ran.iter().map(|(n, _)| n.clone()).collect();
    passes.push("plan-buffers".into());
    let codegen = CodegenOptions {
        max_context,
        max_tokens_per_step,
        max_storage_binding: opts
            .max_storage_binding
            .unwrap_or_else(|| opts.target.max_storage_binding()),
        ..CodegenOptions::default()
    };
    let model = ModelInfo {
        architecture: facts.architecture.clone(),
        family: facts.family.clone(),
        name: facts.name.clone(),
        vocab_size: facts.vocab_size,
        hidden_size: facts.hidden_size,
        num_layers: facts.num_layers,
        max_context,
        max_tokens_per_step,
        config: ckpt.config_json.clone(),
    };
    let compile_info = CompileInfo {
        gerbil_version: env!("CARGO_PKG_VERSION").to_string(),
        passes,
        ops_before,
        ops_after,
        activation_naive_bytes: 0,
    };
    let built = build_plan(&graph, &ckpt, model, &ckpt.text, compile_info, &codegen)?;
    if let Some(dir) = &opts.emit_wgsl {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for k in &built.header.kernels {
            let path = dir.join(format!("{}.wgsl", k.name));
            std::fs::write(&path, &k.wgsl)
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    if let Some(out) = &opts.output {
        write_plan(out, &built.header, &built.data)?;
    }
    Ok(Compiled {
        graph,
        header: built.header,
        weight_bytes: built.weight_bytes,
    })
}

/// A plan ready to write: its header and data sections.
pub struct BuiltPlan<'a> {
    /// The header.
    pub header: PlanHeader,
    /// Weight and tokenizer sections (borrowing from the tensor source).
    pub data: DataLayout<'a>,
    /// Bytes of weight data.
    pub weight_bytes: u64,
}

/// Generates code for a graph whose passes have run, materializes its
/// weights from `tensors` and assembles the plan. `model`'s context fields
/// are taken from `codegen`.
pub fn build_plan<'a>(
    graph: &Graph,
    tensors: &'a dyn TensorSource,
    mut model: ModelInfo,
    text: &'a TextAssets,
    mut compile: CompileInfo,
    codegen: &CodegenOptions,
) -> Result<BuiltPlan<'a>> {
    let program: Program = generate(graph, codegen)?;
    model.max_context = codegen.max_context;
    model.max_tokens_per_step = codegen.max_tokens_per_step;
    compile.activation_naive_bytes = program.activation_naive_bytes;
    let mut data = DataLayout::default();
    let mut buffers = program.buffers.clone();
    let mut weight_bytes = 0;
    for w in &program.weights {
        let rows = w.ty.shape.first().and_then(|d| d.as_const()).unwrap_or(0);
        let mut bytes = materialize(tensors, &w.source, w.ty.dtype, rows)?;
        if let Some((start, count)) = w.rows {
            let row_bytes = (w.ty.size_bytes(0, 0) / count.max(1)) as usize;
            let (a, b) = (
                start as usize * row_bytes,
                (start + count) as usize * row_bytes,
            );
            if b > bytes.len() {
                bail!(
                    "weight `{}`: rows {start}..{} exceed the tensor",
                    w.source,
                    start + count
                );
            }
            bytes = match bytes {
                Cow::Borrowed(all) => Cow::Borrowed(&all[a..b]),
                Cow::Owned(all) => Cow::Owned(all[a..b].to_vec()),
            };
        }
        let bytes = pad4(bytes);
        let decl = &mut buffers[w.buffer as usize];
        if bytes.len() as u64 != decl.size {
            bail!(
                "weight `{}`: {} bytes materialized, {} expected",
                w.source,
                bytes.len(),
                decl.size
            );
        }
        weight_bytes += decl.size;
        let section = data.push(bytes);
        if let BufferKind::Weight { section: s, .. } = &mut decl.kind {
            *s = section;
        }
    }
    let tokenizer = text
        .tokenizer_json
        .as_ref()
        .map(|t| data.push(Cow::Borrowed(t.as_slice())));
    let header = PlanHeader {
        model,
        text: TextInfo {
            tokenizer,
            chat_template: text.chat_template.clone(),
            bos_token: text.bos_token.clone(),
            eos_token: text.eos_token.clone(),
            eos_token_ids: text.eos_token_ids.clone(),
        },
        compile,
        requirements: program.requirements.clone(),
        buffers,
        kernels: program.kernels.clone(),
        prefill: program.prefill.clone(),
        decode: program.decode.clone(),
        io: program.io.clone(),
    };
    header
        .validate(data.len())
        .map_err(|e| anyhow::anyhow!("internal error: generated plan is inconsistent: {e}"))?;
    Ok(BuiltPlan {
        header,
        data,
        weight_bytes,
    })
}
