//! [`generate`]: a verified graph becomes a [`Program`] — buffers, kernels,
//! and per variant a prefill and a decode schedule.
//!
//! The work is split by room, one step each: [`crate::sources`] gives the
//! sources (token ids, weights and their row shards, KV caches) and graph
//! outputs buffers of their own; [`crate::binder`] plans every other value
//! into arenas by liveness and answers which slice each operand binds;
//! here, each phase of each variant lowers every compute node
//! ([`crate::lower`]) and assembles its dispatch ([`crate::dispatch`]);
//! last, every distinct kernel is validated by naga. [`buffer_table`] stops
//! before validation: the buffer table alone, for choosing the prefill chunk.
//! Weights are placed before any variant is built, so every variant binds the
//! same weight buffers.

use crate::binder::Layout;
use crate::dispatch::{Assembler, Operands};
use crate::fusion::RopeAttention;
use crate::lower::{Lowering, Phase, SHORT_PROMPT};
use crate::sources;
use crate::target::Target;
use crate::tuning::GemmTiles;
use crate::variant::{variants_for, VariantSpec};
use crate::CodegenError;
use gerbil_ir::{Graph, NodeId, Op, TensorType, ValueRef, WeightSource};
use gerbil_plan::{
    BufferDecl, BufferSlice, Dispatch, Feature, IoBindings, Port, TokenRange, Variant,
};
use std::collections::HashMap;

/// What the target allows and how large the plan's steps are.
#[derive(Clone, Debug)]
pub struct CodegenOptions {
    /// KV-cache capacity (`Lmax`).
    pub max_context: u64,
    /// Most tokens in one prefill step (`T` ≤ this).
    pub max_tokens_per_step: u64,
    /// Features and limits to compile for.
    pub target: Target,
    /// Rows of `x` per matmul workgroup in prefill.
    pub prefill_rows_per_workgroup: u32,
    /// Prefill GEMM tiles measured on a device (`gerbilc tune`), by shape.
    pub gemm_tiles: GemmTiles,
    /// Most sequences of a batch step (0: no batch schedule; see
    /// `Variant::batch`).
    pub max_batch: u32,
}

impl Default for CodegenOptions {
    fn default() -> Self {
        CodegenOptions {
            max_context: 4096,
            max_tokens_per_step: 256,
            target: Target::portable(),
            prefill_rows_per_workgroup: 8,
            gemm_tiles: GemmTiles::new(),
            max_batch: 0,
        }
    }
}

/// A weight buffer whose bytes the caller materializes from `source`.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightBuffer {
    /// Index into [`Program::buffers`].
    pub buffer: u32,
    /// Where the bytes come from.
    pub source: WeightSource,
    /// Type with `Lmax` resolved (of this shard, if sharded).
    pub ty: TensorType,
    /// For a shard of a weight too large for one binding: the first row of
    /// the source tensor it holds and how many rows.
    pub rows: Option<(u64, u64)>,
}

/// A weight shard whose bytes are a range of another weight buffer's (a
/// whole weight that desktop variants bind, [`crate::VariantSpec::wide`]):
/// the plan gives it a section inside that buffer's instead of bytes of its
/// own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightAlias {
    /// Index into [`Program::buffers`] of the shard.
    pub buffer: u32,
    /// Index of the whole weight's buffer, one of [`Program::weights`].
    pub of: u32,
    /// Where the shard's bytes start in the whole's, a multiple of
    /// `gerbil_plan::SECTION_ALIGN`.
    pub offset: u64,
}

/// Codegen's result: everything in a plan header but the weight sections.
#[derive(Clone, Debug)]
pub struct Program {
    /// GPU buffers; weight buffers carry a placeholder section.
    pub buffers: Vec<BufferDecl>,
    /// Distinct kernels of every variant.
    pub kernels: Vec<gerbil_plan::Kernel>,
    /// The variants, best first.
    pub variants: Vec<Variant>,
    /// Input and output buffers.
    pub io: IoBindings,
    /// Weight buffers to fill.
    pub weights: Vec<WeightBuffer>,
    /// Weight buffers whose bytes are ranges of others'.
    pub aliases: Vec<WeightAlias>,
    /// Sum of all activation sizes at `max_tokens_per_step`.
    pub activation_naive_bytes: u64,
}

/// Lowers a verified graph to a [`Program`].
pub fn generate(graph: &Graph, opts: &CodegenOptions) -> Result<Program, CodegenError> {
    let Assembled {
        buffers,
        asm,
        variants,
        io,
        weights,
        aliases,
        activation_naive_bytes,
    } = assemble(graph, opts)?;
    Ok(Program {
        buffers,
        kernels: asm.finish()?,
        variants,
        io,
        weights,
        aliases,
        activation_naive_bytes,
    })
}

/// The buffer table [`generate`] would produce (weights, KV caches, arenas,
/// outputs, scratch), without validating a kernel: what choosing the prefill
/// chunk needs; and which weight buffers are ranges of others
/// ([`WeightAlias`]: their bytes are not stored or uploaded twice).
pub fn buffer_table(
    graph: &Graph,
    opts: &CodegenOptions,
) -> Result<(Vec<BufferDecl>, Vec<WeightAlias>), CodegenError> {
    let a = assemble(graph, opts)?;
    Ok((a.buffers, a.aliases))
}

/// Everything of a [`Program`] but validated kernels.
struct Assembled {
    buffers: Vec<BufferDecl>,
    asm: Assembler,
    variants: Vec<Variant>,
    io: IoBindings,
    weights: Vec<WeightBuffer>,
    aliases: Vec<WeightAlias>,
    activation_naive_bytes: u64,
}

fn assemble(graph: &Graph, opts: &CodegenOptions) -> Result<Assembled, CodegenError> {
    let order = graph
        .topo_order()
        .ok_or_else(|| CodegenError::Graph("the graph has a cycle".into()))?;
    let quantized = graph.g.node_weights().any(|n| match &n.op {
        Op::Weight(w) => w.ty.dtype.is_quantized(),
        _ => false,
    });
    let specs = variants_for(&opts.target, opts.prefill_rows_per_workgroup, quantized);
    let sources = sources::place(graph, &order, opts, &specs)?;
    if sources.target_ids.is_some() {
        return Err(CodegenError::Graph(
            "the graph reads next-token targets (a training graph, made by the autodiff \
             pass); plans run forward graphs only (training compiles with \
             `generate_training`)"
                .into(),
        ));
    }
    let logits = sources.logits.ok_or_else(|| {
        CodegenError::Graph("the graph has no `logits` (or `embedding`) output".into())
    })?;
    let steps: Vec<NodeId> = order
        .iter()
        .copied()
        .filter(|&id| !graph.node(id).op.is_source())
        .collect();
    let fused = RopeAttention::find(graph, &steps);
    let layout = Layout::plan(graph, &steps, sources, &fused)?;
    let narrow = Lowering {
        graph,
        shard_rows: &layout.sources.buffers.shard_rows,
        max_context: opts.max_context as u32,
        max_tokens: opts.max_tokens_per_step as u32,
        min_tokens: 1,
        max_batch: opts.max_batch,
        sequences: 1,
        target: &opts.target,
        gemm_tiles: &opts.gemm_tiles,
    };
    // Desktop variants see the weights they bind whole as unsharded.
    let wide_shard_rows: HashMap<ValueRef, u32> = narrow
        .shard_rows
        .iter()
        .filter(|(v, _)| !layout.sources.buffers.wide.contains_key(v))
        .map(|(&v, &rows)| (v, rows))
        .collect();
    let wide = Lowering {
        shard_rows: &wide_shard_rows,
        ..narrow
    };
    // The scratch buffer, if any kernel needs one, comes after the arenas.
    let scratch = layout.sources.buffers.decls.len() as u32;
    let mut asm = Assembler::new(scratch);
    let mut variants = Vec::new();
    for spec in specs {
        let lowering = if spec.wide { &wide } else { &narrow };
        let mut phase = |phase| {
            let fused = Some(&fused).filter(|_| RopeAttention::applies(phase, &spec));
            schedule(&steps, &layout, lowering, &mut asm, &spec, phase, fused)
        };
        let prefill = phase(Phase::Prefill(spec.prefill_rows_per_workgroup))?;
        let decode = phase(Phase::Decode)?;
        // An encoder's steps pack sequences themselves: no batch schedule.
        let batch = if opts.max_batch > 0 && !sources::is_encoder(graph) {
            phase(Phase::Batch)?
        } else {
            Vec::new()
        };
        variants.push((spec, prefill, decode, batch));
    }
    let activation_naive_bytes = layout.naive_bytes();
    let sources = layout.sources;
    let mut decls = sources.buffers.decls;
    let mut schedules: Vec<_> = variants
        .iter_mut()
        .flat_map(|(_, prefill, decode, batch)| [prefill, decode, batch])
        .collect();
    if let Some(decl) = asm.place_scratch(&mut schedules) {
        debug_assert_eq!(decls.len() as u32, scratch);
        decls.push(decl);
    }
    let variants = variants
        .into_iter()
        .map(|(spec, prefill, decode, batch)| Variant {
            name: spec.name.to_string(),
            requirements: asm.requirements(&decls, &[&prefill, &decode, &batch]),
            // Every tensor-core GEMM splits `x` (`kernels::gemm_coop`).
            split_x: spec.features.contains(&Feature::CooperativeMatrix),
            features: spec.features,
            precision: spec.precision,
            int8_dots: spec.int8_dots,
            prefill,
            decode,
            batch,
        })
        .collect();
    let whole = |i: u32| BufferSlice {
        buffer: i,
        offset: 0,
        size: decls[i as usize].size,
    };
    let (logits, logits_all_rows) = logits;
    let max_batch = if sources::is_encoder(graph) {
        0
    } else {
        opts.max_batch
    };
    let io = IoBindings {
        step_params: sources.step_params,
        token_ids: sources.token_ids,
        logits: whole(logits),
        logits_all_rows,
        next_token: sources.next_token,
        sampling_params: sources.sampling_params,
        step_rows: sources.step_rows,
        // An encoder's steps pack inputs themselves (`max_batch` of them).
        max_batch,
        // The batch schedule lowers `next_token` to every row's argmax.
        batch_tokens: sources
            .next_token
            .filter(|_| max_batch > 0)
            .map(|n| BufferSlice {
                size: 4 * u64::from(max_batch),
                ..n
            }),
    };
    Ok(Assembled {
        buffers: decls,
        asm,
        variants,
        io,
        weights: sources.buffers.weights,
        aliases: sources.buffers.aliases,
        activation_naive_bytes,
    })
}

/// One phase's schedule of variant `spec`: every compute node in `steps`
/// lowered and bound, each `fused` pair as one dispatch, and in prefill a
/// matmul with a short form as two, each for its own range of `T`.
pub(crate) fn schedule(
    steps: &[NodeId],
    layout: &Layout<'_, '_>,
    lowering: &Lowering<'_>,
    asm: &mut Assembler,
    spec: &VariantSpec,
    phase: Phase,
    fused: Option<&RopeAttention>,
) -> Result<Vec<Dispatch>, CodegenError> {
    let target = lowering.target;
    let precision = spec.precision;
    let mut out = Vec::with_capacity(steps.len());
    for &id in steps {
        if fused.is_some_and(|f| f.is_absorbed(id)) {
            continue;
        }
        let node = lowering.graph.node(id);
        let rope = fused.and_then(|f| f.rope_of(id));
        // A fused dispatch's inputs are its `qkv_rope`'s, its output the attention's.
        let of = |port: Port| match (rope, port) {
            (Some(r), Port::Input { .. }) => r,
            _ => id,
        };
        let ops = Operands {
            label: &node.label,
            layer: node.layer(),
            slice: &|port| layout.slice(of(port), port, precision, spec.wide),
            bytes: &|port| layout.bytes(of(port), port, precision, spec.wide),
            flops: lowering.flops(id),
        };
        // `most`: the largest step the dispatch runs in, for the limit checks.
        let mut dispatch =
            |lowered, most| asm.dispatch(lowered, &ops, &spec.features, &spec.limits(target), most);
        let most = lowering.max_tokens;
        if let Some(r) = rope {
            out.push(dispatch(lowering.rope_attention(r, id, spec)?, most)?);
        } else if matches!(phase, Phase::Prefill(_)) && lowering.has_short_form(id, spec) {
            // Short prompts take the batch step's matmul, the rest the tiles.
            let short_form = lowering.kernel(id, Phase::ShortPrefill, spec)?;
            let mut short = dispatch(short_form, SHORT_PROMPT)?;
            short.tokens = Some(TokenRange {
                min: 1,
                max: SHORT_PROMPT,
            });
            let mut long = dispatch(lowering.kernel(id, phase, spec)?, most)?;
            long.tokens = Some(TokenRange {
                min: SHORT_PROMPT + 1,
                max: lowering.max_tokens,
            });
            out.extend([short, long]);
        } else {
            for lowered in lowering.kernels(id, phase, spec)? {
                out.push(dispatch(lowered, most)?);
            }
        }
    }
    Ok(out)
}
