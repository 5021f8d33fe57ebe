//! The compiler driver: a checkpoint in, a [`Plan`] out.
//!
//! [`compile`] runs every stage in order — lower the checkpoint with the
//! family builder, retype the matrices `--quantize` asks for, run the pass pipeline (verifying after each pass), generate
//! kernels and schedules, lay out the plan — and returns the plan with
//! the final graph. Nothing here prints or writes files on its own: dumps go
//! through the [`Observer`], and the caller decides whether to
//! [`write`](Plan::write) the plan, which is when the weights are read,
//! scanned for NaN and infinities, quantized and written, one buffer at a
//! time ([`Plan::check_weights`] does all but the writing).
//!
//! The context size is an input of lowering, not only of codegen: LongRoPE
//! picks its short or long factors by it.

use crate::assemble::{build_plan, Plan};
use crate::dump::Observer;
use crate::error::CompileError;
use crate::finite::check_rope_tables_finite;
use crate::materialize::WeightOptions;
use crate::options::{CompileOptions, DEFAULT_MAX_CONTEXT_CAP};
use crate::quantize;
use crate::selftest;
use gerbil_codegen_wgsl::CodegenOptions;
use gerbil_frontend_hf::{lower_with, Checkpoint, EmbeddingFacts, LowerOptions, ModelFacts};
use gerbil_ir::Graph;
use gerbil_passes::{default_pipeline, PassManager, PassReport};
use gerbil_plan::{limits, CompileInfo, EmbeddingInfo, ModelInfo};
use std::collections::BTreeMap;

/// What a compilation produced.
pub struct Compiled<'a> {
    /// The graph after the last pass.
    pub graph: Graph,
    /// What the pass pipeline did.
    pub passes: PassReport,
    /// The plan, which reads its weights from the checkpoint as it is
    /// written.
    pub plan: Plan<'a>,
}

/// Runs `pm` over `graph`, showing `observer` the graph before the first
/// pass, after every pass and at the end. The first observer error stops
/// the compilation (after the pass in flight).
pub(crate) fn run_passes(
    pm: &PassManager,
    graph: &mut Graph,
    observer: &mut dyn Observer,
) -> Result<PassReport, CompileError> {
    observer.check(pm)?;
    observer.lowered(graph)?;
    let mut observed = Ok(());
    let mut index = 0;
    let report = pm.run(graph, |run, g| {
        index += 1;
        if observed.is_ok() {
            observed = observer.after_pass(index, run, g);
        }
    })?;
    observed?;
    observer.finished(graph)?;
    Ok(report)
}

/// Compute ops of a graph by mnemonic, for the plan's compile record.
pub fn op_counts(graph: &Graph) -> Vec<(String, u64)> {
    let mut m: BTreeMap<String, u64> = BTreeMap::new();
    for n in graph.g.node_weights().filter(|n| !n.op.is_source()) {
        *m.entry(n.op.mnemonic().to_string()).or_default() += 1;
    }
    m.into_iter().collect()
}

/// The size options against [`gerbil_plan::limits`] before anything
/// multiplies them: `--max-context` (`max_context`, the flag's value or the
/// model's default), `--max-tokens-per-step` (at least 1, at most the
/// context) and `--max-storage-binding`.
fn check_sizes(
    opts: &CompileOptions,
    max_context: u64,
    step_within_context: bool,
) -> Result<(), CompileError> {
    let refuse = |option, value: u64, reason: String| CompileError::Option {
        option,
        value: value.to_string(),
        reason,
    };
    if max_context == 0 {
        return Err(refuse(
            "--max-context",
            0,
            "the KV cache must hold at least 1 token".into(),
        ));
    }
    limits::CONTEXT.check(max_context, "--max-context")?;
    if let Some(n) = opts.max_tokens_per_step {
        if n == 0 {
            return Err(refuse(
                "--max-tokens-per-step",
                0,
                "a step must take at least 1 token; give 1 or more, or leave the flag out to \
                 let gerbilc choose"
                    .into(),
            ));
        }
        limits::TOKENS_PER_STEP.check(n, "--max-tokens-per-step")?;
        if step_within_context && n > max_context {
            return Err(refuse(
                "--max-tokens-per-step",
                n,
                format!(
                    "a step cannot take more tokens than the KV cache holds ({max_context}, \
                     --max-context); pick at most {max_context}"
                ),
            ));
        }
    }
    if let Some(bytes) = opts.max_storage_binding {
        if bytes < 4 {
            return Err(refuse(
                "--max-storage-binding",
                bytes,
                "a binding must hold at least one 4-byte value; give the device's \
                 maxStorageBufferBindingSize"
                    .into(),
            ));
        }
        limits::BINDING_BYTES.check(bytes, "--max-storage-binding")?;
    }
    Ok(())
}

/// The lowered model's sizes against [`gerbil_plan::limits`].
fn check_model_sizes(facts: &ModelFacts) -> Result<(), CompileError> {
    let fix = "gerbil cannot compile this model";
    limits::VOCABULARY.check_or(facts.vocab_size, "the model's vocab_size", fix)?;
    limits::HIDDEN.check_or(facts.hidden_size, "the model's hidden_size", fix)?;
    limits::LAYERS.check_or(facts.num_layers, "the model's num_hidden_layers", fix)?;
    Ok(())
}

/// Every value of the lowered graph: each constant dimension fits the
/// kernels' `u32` indices, and its size at the largest step and `Lmax`
/// fits a `u64`, so codegen's casts and products cannot wrap.
fn check_value_sizes(graph: &Graph, max_context: u64) -> Result<(), CompileError> {
    let t = limits::TOKENS_PER_STEP.max;
    for node in graph.g.node_weights() {
        for ty in &node.outputs {
            let huge_dim = ty
                .shape
                .iter()
                .filter_map(|d| d.as_const())
                .find(|&d| u32::try_from(d).is_err());
            let reason = match (huge_dim, ty.checked_size_bytes(t, max_context)) {
                (Some(d), _) => {
                    format!("has a dimension of {d}, more than the kernels' u32 indices reach")
                }
                (None, None) => format!("is larger than 2^64 bytes at a step of {t} tokens"),
                (None, Some(_)) => continue,
            };
            return Err(CompileError::Size {
                value: format!("{} ({ty})", node.label),
                reason: format!("{reason}; gerbil cannot compile this model"),
            });
        }
    }
    Ok(())
}

/// Sequences an encoder step packs when `--max-batch` does not say.
const DEFAULT_ENCODER_BATCH: u32 = 64;
/// Tokens of a typical input, for sizing an encoder step.
const ENCODER_TYPICAL_TOKENS: u64 = 128;
/// Most tokens of an encoder step when `--max-tokens-per-step` does not say
/// (unless one input takes more).
const ENCODER_STEP_TOKENS: u64 = 8192;

/// The plan's record of an encoder's vector: an input may take `most`
/// tokens (the context: the model's positions, or `--max-context`) unless
/// its `max_seq_length` says less; one input a step until the caller says.
fn embedding_info(e: &EmbeddingFacts, most: u64) -> EmbeddingInfo {
    EmbeddingInfo {
        dimension: e.dimension,
        pooling: e.pipeline.pooling.name().to_string(),
        normalized: e.pipeline.normalize,
        max_tokens: e.pipeline.max_seq_length.map_or(most, |n| n.min(most)),
        max_inputs: 1,
    }
}

/// Compiles a checkpoint, showing `observer` the graph as lowered and after
/// every pass.
pub fn compile<'a>(
    ckpt: &'a Checkpoint,
    opts: &CompileOptions,
    observer: &mut dyn Observer,
) -> Result<Compiled<'a>, CompileError> {
    let max_context = opts.max_context.unwrap_or_else(|| {
        ckpt.config
            .max_position_embeddings
            .min(DEFAULT_MAX_CONTEXT_CAP)
    });
    // Whether a step must fit the context is known once lowering says
    // whether this is an encoder (whose steps pack inputs).
    check_sizes(opts, max_context, false)?;
    let start = std::time::Instant::now();
    let lowered = lower_with(
        ckpt,
        &LowerOptions {
            max_context: Some(max_context),
        },
    )?;
    let mut graph = lowered.graph;
    let facts = lowered.facts;
    if let Some(e) = &facts.embedding {
        tracing::info!(
            dimension = e.dimension,
            pooling = e.pipeline.pooling.name(),
            "an embedding model (a bare transformer, or a sentence-transformers modules.json): \
             the plan makes one vector per input, not logits"
        );
    }
    // An encoder's context is at most its learned positions.
    let max_context = match (&facts.embedding, opts.max_context) {
        (Some(e), None) => e.max_positions.min(DEFAULT_MAX_CONTEXT_CAP),
        _ => max_context,
    };
    check_sizes(opts, max_context, facts.embedding.is_none())?;
    if let Some(scheme) = opts.quantize {
        let weights = quantize::retype(&mut graph, scheme);
        tracing::info!(
            scheme = scheme.name(),
            weights,
            "chose the weights to quantize"
        );
    }
    if !opts.allow_non_finite {
        // The tensors are scanned as the plan writer reads them.
        check_rope_tables_finite(&graph)?;
    }
    check_model_sizes(&facts)?;
    check_value_sizes(&graph, max_context)?;
    if let Some(e) = facts
        .embedding
        .as_ref()
        .filter(|e| max_context > e.max_positions)
    {
        return Err(CompileError::Option {
            option: "--max-context",
            value: max_context.to_string(),
            reason: format!(
                "an encoder has learned positions for {} tokens only; pick at most that",
                e.max_positions
            ),
        });
    }
    if max_context > facts.max_position_embeddings {
        tracing::warn!(
            "--max-context {max_context} exceeds the model's max_position_embeddings {}",
            facts.max_position_embeddings
        );
    }
    let ops_before = op_counts(&graph);
    tracing::info!(
        family = %facts.family,
        layers = facts.num_layers,
        ops = graph.compute_node_count(),
        max_context,
        ms = start.elapsed().as_millis() as u64,
        "lowered the checkpoint"
    );

    // The self-test's reference runs the graph as lowered, weights retyped.
    let lowered = opts.selftest.then(|| graph.clone());
    let mut pm = PassManager::new(default_pipeline());
    for name in &opts.disabled_passes {
        pm.disable(name)?;
    }
    if let Some(n) = opts.bisect {
        pm.bisect(n);
    }
    let passes_start = std::time::Instant::now();
    let report = run_passes(&pm, &mut graph, observer)?;
    tracing::info!(
        passes = report.ran.len(),
        ops = graph.compute_node_count(),
        ms = passes_start.elapsed().as_millis() as u64,
        "ran the passes"
    );

    let mut passes: Vec<String> = report.ran.iter().map(|r| r.name.clone()).collect();
    passes.push("plan-buffers".into());
    let target = match opts.max_storage_binding {
        Some(max) => opts.target.clone().with_max_binding(max),
        None => opts.target.clone(),
    };
    let mut codegen = CodegenOptions {
        max_context,
        target,
        gemm_tiles: opts.tuning.as_ref().map(|t| t.tiles()).unwrap_or_default(),
        ..CodegenOptions::default()
    };
    let mut embedding = facts
        .embedding
        .as_ref()
        .map(|e| embedding_info(e, max_context));
    // An encoder's `--max-batch` is the inputs one step packs (by default
    // 64, or as many one-token inputs as a smaller given step holds).
    let max_batch = match &mut embedding {
        Some(e) => {
            e.max_inputs = match (opts.max_batch, opts.max_tokens_per_step) {
                (0, Some(n)) => DEFAULT_ENCODER_BATCH.min(u32::try_from(n).unwrap_or(u32::MAX)),
                (0, None) => DEFAULT_ENCODER_BATCH,
                (n, _) => n,
            };
            e.max_inputs
        }
        None => opts.max_batch,
    };
    codegen.max_tokens_per_step = match (opts.max_tokens_per_step, &embedding) {
        (Some(n), Some(e)) if n < e.max_tokens => {
            return Err(CompileError::Option {
                option: "--max-tokens-per-step",
                value: n.to_string(),
                reason: format!(
                    "an encoder step holds whole inputs, of up to {} tokens here; give at least \
                     that (or a smaller --max-context, which caps an input)",
                    e.max_tokens
                ),
            })
        }
        // An encoder step packs whole inputs: room for `max_batch` typical
        // ones (ENCODER_TYPICAL_TOKENS each), or one of the longest.
        (None, Some(e)) => e
            .max_tokens
            .max((u64::from(max_batch) * ENCODER_TYPICAL_TOKENS).min(ENCODER_STEP_TOKENS)),
        (Some(n), _) => n,
        (None, None) => crate::chunk::choose(&graph, &codegen)?,
    };
    let max_tokens_per_step = codegen.max_tokens_per_step;
    if u64::from(max_batch) > max_tokens_per_step {
        return Err(CompileError::Option {
            option: "--max-batch",
            value: max_batch.to_string(),
            reason: format!(
                "a batch step takes at most --max-tokens-per-step ({max_tokens_per_step}) sequences"
            ),
        });
    }
    codegen.max_batch = max_batch;
    // An encoder's KV cache holds one packed step: a row per token.
    let max_context = match &embedding {
        Some(_) => {
            check_value_sizes(&graph, max_tokens_per_step)?;
            max_tokens_per_step
        }
        None => max_context,
    };
    codegen.max_context = max_context;
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
        embedding,
    };
    let compile_info = CompileInfo {
        gerbil_version: env!("CARGO_PKG_VERSION").to_string(),
        target: codegen.target.name.clone(),
        passes,
        ops_before,
        ops_after: op_counts(&graph),
        activation_naive_bytes: 0,
        tuned_on: opts.tuning.as_ref().map(|t| t.measured_on()),
    };
    let codegen_start = std::time::Instant::now();
    let weights = WeightOptions {
        rounding: opts.quantize.map(|q| q.rounding()).unwrap_or_default(),
        allow_non_finite: opts.allow_non_finite,
    };
    let is_embedding = model.embedding.is_some();
    // An embedding input takes at most its model's tokens; a language
    // model's prompt, one step within the context.
    let most = match &model.embedding {
        Some(e) => e.max_tokens.min(model.max_tokens_per_step),
        None => model.max_tokens_per_step.min(max_context),
    };
    let vocab = model.vocab_size;
    let mut plan = build_plan(
        &graph,
        ckpt,
        model,
        &ckpt.text,
        compile_info,
        &codegen,
        weights,
    )?;
    tracing::info!(
        target = %codegen.target.name,
        max_tokens_per_step,
        kernels = plan.header.kernels.len(),
        variants = plan.header.variants.len(),
        weight_bytes = plan.weight_bytes,
        ms = codegen_start.elapsed().as_millis() as u64,
        "generated the kernels and laid out the plan"
    );
    if let Some(lowered) = &lowered {
        let start = std::time::Instant::now();
        let prompt = selftest::prompt(vocab, most);
        let steps = selftest::reference(lowered, ckpt, weights, &prompt, is_embedding)?;
        selftest::attach(&mut plan, steps)?;
        tracing::info!(
            tokens = prompt.len(),
            ms = start.elapsed().as_millis() as u64,
            "computed the self-test's reference on the CPU"
        );
    }
    Ok(Compiled {
        graph,
        passes: report,
        plan,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gerbil_ir::op::{Weight, WeightSource};
    use gerbil_ir::{DType, Dim, Op, Sym, TensorType};

    fn graph_of(label: &str, ty: TensorType) -> Graph {
        let mut g = Graph::new("sizes");
        let source = WeightSource::Checkpoint {
            tensor: label.into(),
        };
        g.add(Op::Weight(Weight { source, ty }), &[], label)
            .expect("a weight node");
        g
    }

    #[test]
    fn values_too_large_for_the_kernels_are_refused_by_name() {
        let fine = graph_of("w", TensorType::fixed(DType::F32, &[1 << 20, 64]));
        assert!(check_value_sizes(&fine, 4096).is_ok());
        let wide = graph_of("wide", TensorType::fixed(DType::F32, &[1 << 33, 2]));
        assert_eq!(
            check_value_sizes(&wide, 4096).unwrap_err().to_string(),
            "`wide (f32[8589934592,2])` has a dimension of 8589934592, more than the kernels' \
             u32 indices reach; gerbil cannot compile this model"
        );
        let table = TensorType::new(
            DType::F32,
            [
                Dim::Sym(Sym::Lmax),
                Dim::Const(1 << 31),
                Dim::Const(1 << 31),
            ],
        );
        let e = check_value_sizes(&graph_of("table", table), 1 << 30).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`table (f32[Lmax,2147483648,2147483648])` is larger than 2^64 bytes at a step of \
             65535 tokens; gerbil cannot compile this model"
        );
    }
}
