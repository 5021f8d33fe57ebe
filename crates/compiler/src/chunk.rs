//! Choosing the prefill chunk — the most prompt tokens one step runs
//! (`max_tokens_per_step`) — when `--max-tokens-per-step` is not given.
//!
//! The rule: start from what the target prefers, clamped to the context —
//! [`LARGE_MAX_TOKENS_PER_STEP`] (1024) on a target whose desktop variants
//! bind at least 1 GiB (`desktop` and the default `universal`: a larger step
//! keeps the GEMMs' tiles busy, and a 512-token prompt is one step), else
//! [`PORTABLE_MAX_TOKENS_PER_STEP`] (256: WebGPU's default limits, for
//! browsers, integrated GPUs and CPU drivers). Then halve it while the
//! step's activations cost too much memory: while everything a step
//! allocates besides weights and KV caches (the activation arena, token
//! ids, outputs, scratch) exceeds [`activation_budget`] — an eighth of the
//! weights, at least 64 MiB — or while one such buffer exceeds the target's
//! largest binding. An explicit `--max-tokens-per-step` always wins.
//!
//! The surprise: the sizes come from the code generator's buffer table at
//! the candidate chunk ([`gerbil_codegen_wgsl::buffer_table`]: the buffer planner
//! decides the arena, the kernels the scratch), so a model that needs a
//! smaller chunk is laid out once per halving — without weights, and without
//! validating a kernel.

use crate::error::CompileError;
use gerbil_codegen_wgsl::{buffer_table, CodegenOptions, WeightAlias};
use gerbil_ir::Graph;
use gerbil_plan::BufferKind;

/// The prefill chunk on targets with WebGPU's default binding limit.
pub const PORTABLE_MAX_TOKENS_PER_STEP: u64 = 256;
/// The prefill chunk on targets whose largest binding is at least
/// [`LARGE_BINDING`].
pub const LARGE_MAX_TOKENS_PER_STEP: u64 = 1024;
/// The binding size from which a target counts as a desktop GPU.
pub const LARGE_BINDING: u64 = 1 << 30;
/// The smallest activation budget, whatever the weights.
pub const MIN_ACTIVATION_BUDGET: u64 = 64 << 20;
/// The chunk is never halved below this.
const MIN_CHUNK: u64 = 16;

/// Bytes the activations of one step may take next to `weight_bytes` of
/// weights: an eighth of them, at least [`MIN_ACTIVATION_BUDGET`].
pub fn activation_budget(weight_bytes: u64) -> u64 {
    (weight_bytes / 8).max(MIN_ACTIVATION_BUDGET)
}

/// What a program's buffers cost per step: the weights (a shard stored as
/// a range of its whole weight, `aliases`, counted once), every other
/// buffer but the KV caches (total), and the largest of those.
fn sizes(buffers: &[gerbil_plan::BufferDecl], aliases: &[WeightAlias]) -> (u64, u64, u64) {
    let (mut weights, mut activations, mut largest) = (0, 0, 0);
    for (i, b) in buffers.iter().enumerate() {
        if aliases.iter().any(|a| a.buffer as usize == i) {
            continue;
        }
        match b.kind {
            BufferKind::Weight { .. } => weights += b.size,
            BufferKind::KvCache { .. } => {}
            _ => {
                activations += b.size;
                largest = largest.max(b.size);
            }
        }
    }
    (weights, activations, largest)
}

/// The prefill chunk for `graph` compiled with `base` (whose own
/// `max_tokens_per_step` is ignored), by the rule of this module.
pub fn choose(graph: &Graph, base: &CodegenOptions) -> Result<u64, CompileError> {
    choose_within(graph, base, activation_budget)
}

/// [`choose`] with `budget` (weights' bytes → activations' bytes) in place
/// of [`activation_budget`].
fn choose_within(
    graph: &Graph,
    base: &CodegenOptions,
    budget: impl Fn(u64) -> u64,
) -> Result<u64, CompileError> {
    let preferred = if base.target.wide_binding >= LARGE_BINDING {
        LARGE_MAX_TOKENS_PER_STEP
    } else {
        PORTABLE_MAX_TOKENS_PER_STEP
    };
    let mut chunk = preferred.min(base.max_context).max(1);
    loop {
        let opts = CodegenOptions {
            max_tokens_per_step: chunk,
            ..base.clone()
        };
        let (table, aliases) = buffer_table(graph, &opts)?;
        let (weights, activations, largest) = sizes(&table, &aliases);
        let budget = budget(weights);
        let fits = activations <= budget && largest <= base.target.limits.max_storage_binding;
        if fits || chunk / 2 < MIN_CHUNK {
            tracing::debug!(
                chunk,
                activations,
                budget,
                "prefill chunk (tokens per step) chosen by the target and memory"
            );
            return Ok(chunk);
        }
        chunk /= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gerbil_codegen_wgsl::generate;
    use gerbil_frontend_hf::{lower_with, Checkpoint, LowerOptions};
    use gerbil_passes::{default_pipeline, PassManager};

    /// The tiny Llama's graph after the pass pipeline, at `context`.
    fn tiny_graph(context: u64) -> Graph {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/models/tiny/llama");
        let ckpt = Checkpoint::open(&dir).expect("tiny llama");
        let opts = LowerOptions {
            max_context: Some(context),
        };
        let mut graph = lower_with(&ckpt, &opts).expect("lower").graph;
        PassManager::new(default_pipeline())
            .run(&mut graph, |_, _| {})
            .expect("passes");
        graph
    }

    fn options(context: u64, target: gerbil_codegen_wgsl::Target) -> CodegenOptions {
        CodegenOptions {
            max_context: context,
            target,
            ..CodegenOptions::default()
        }
    }

    #[test]
    fn targets_prefer_their_chunk_clamped_to_the_context() {
        use gerbil_codegen_wgsl::Target;
        let graph = tiny_graph(4096);
        let chunk = |ctx, t| choose(&graph, &options(ctx, t)).unwrap();
        assert_eq!(chunk(4096, Target::desktop()), LARGE_MAX_TOKENS_PER_STEP);
        assert_eq!(
            chunk(4096, Target::portable()),
            PORTABLE_MAX_TOKENS_PER_STEP
        );
        assert_eq!(chunk(4096, Target::universal()), LARGE_MAX_TOKENS_PER_STEP);
        assert_eq!(chunk(100, Target::desktop()), 100);
    }

    #[test]
    fn the_chunk_halves_until_the_activations_fit_the_budget() {
        let graph = tiny_graph(4096);
        let base = options(4096, gerbil_codegen_wgsl::Target::desktop());
        let activations = |chunk| {
            let opts = CodegenOptions {
                max_tokens_per_step: chunk,
                ..base.clone()
            };
            let (table, aliases) = buffer_table(&graph, &opts).unwrap();
            // The table without validation is the generated program's.
            assert_eq!(table, generate(&graph, &opts).unwrap().buffers);
            sizes(&table, &aliases).1
        };
        // Activations grow with the chunk, so a budget of what 128 tokens
        // take stops the halving at 128, and one byte less at 64.
        assert!(activations(128) > activations(64));
        let at_128 = activations(128);
        assert_eq!(choose_within(&graph, &base, |_| at_128).unwrap(), 128);
        assert_eq!(choose_within(&graph, &base, |_| at_128 - 1).unwrap(), 64);
        assert_eq!(choose_within(&graph, &base, |_| 0).unwrap(), MIN_CHUNK);
    }

    #[test]
    fn the_budget_is_an_eighth_of_the_weights_but_never_below_the_floor() {
        assert_eq!(activation_budget(0), MIN_ACTIVATION_BUDGET);
        assert_eq!(activation_budget(8 << 30), 1 << 30);
        assert_eq!(activation_budget(100 << 20), MIN_ACTIVATION_BUDGET);
    }
}
