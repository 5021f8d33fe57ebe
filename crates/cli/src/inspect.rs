//! `gerbilc inspect`: what a plan contains and what the compiler did.
//!
//! The surprise: a weight can appear twice without being stored twice. A
//! default (`universal`) plan's desktop variants bind a large weight whole
//! and its portable ones bind row shards of it, and each shard's section is
//! a range of the whole weight's bytes: `--weights` says so
//! (`range_of`), and the totals count those bytes once.

use gerbil_plan::{BufferKind, Dispatch, PlanHeader, Variant};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// A plan summary; `--json` prints it as is.
#[derive(Clone, Debug, Serialize)]
pub struct Inspection {
    /// Architecture and family.
    pub architecture: String,
    /// Family builder.
    pub family: String,
    /// Model name.
    pub name: String,
    /// The checkpoint's config.json.
    pub config: serde_json::Value,
    /// Transformer layers.
    pub num_layers: u64,
    /// Context capacity.
    pub max_context: u64,
    /// Prefill chunk.
    pub max_tokens_per_step: u64,
    /// Passes run.
    pub passes: Vec<String>,
    /// The target the plan was compiled for.
    pub target: String,
    /// The device its prefill GEMM tiles were measured on (`gerbilc tune`);
    /// `null`: the built-in choice.
    pub tuned_on: Option<String>,
    /// Op counts before the passes.
    pub ops_before: BTreeMap<String, u64>,
    /// Op counts after the passes.
    pub ops_after: BTreeMap<String, u64>,
    /// Dispatches per prefill step of a full chunk.
    pub prefill_dispatches_total: usize,
    /// Prefill dispatches inside one transformer layer.
    pub prefill_dispatches_per_layer: f64,
    /// Dispatches per decode step.
    pub decode_dispatches_total: usize,
    /// Decode dispatches inside one transformer layer.
    pub decode_dispatches_per_layer: f64,
    /// Bytes of all activation arenas.
    pub activation_arena_bytes: u64,
    /// Size of each arena buffer.
    pub arena_sizes: Vec<u64>,
    /// Bytes if every activation had its own buffer.
    pub activation_naive_bytes: u64,
    /// KV-cache bytes of the best variant a GPU runs
    /// ([`PlanHeader::best_gpu_variant`](gerbil_plan::PlanHeader::best_gpu_variant)).
    pub kv_cache_bytes: u64,
    /// Weight bytes by dtype.
    pub weight_bytes_by_dtype: BTreeMap<String, u64>,
    /// Every weight buffer, in buffer order (`--weights` lists them).
    pub weights: Vec<WeightSummary>,
    /// Kernels: name and workgroup size.
    pub kernels: Vec<(String, [u32; 3])>,
    /// The plan's variants, best first; the `*_dispatches*` and
    /// `kv_cache_bytes` fields above are those of the best GPU variant.
    pub variants: Vec<VariantSummary>,
    /// Tokens of each step of the plan's self-test (`gerbil-run PLAN
    /// selftest`); empty when it has none.
    pub selftest_steps: Vec<usize>,
}

/// One weight buffer of a plan.
#[derive(Clone, Debug, Serialize)]
pub struct WeightSummary {
    /// The tensor (or its derivation, or a row shard of it).
    pub name: String,
    /// Its dtype as stored: `bf16`, `q4_k`, …
    pub dtype: String,
    /// Its shape as stored.
    pub shape: Vec<u64>,
    /// Its bytes in the plan.
    pub bytes: u64,
    /// The weight whose bytes these are a range of (a row shard of a weight
    /// the plan also binds whole), stored once; absent for bytes of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range_of: Option<String>,
}

/// One variant of a plan.
#[derive(Clone, Debug, Serialize)]
pub struct VariantSummary {
    /// Name, e.g. `portable`.
    pub name: String,
    /// Device features it needs.
    pub features: Vec<&'static str>,
    /// `f32` or `f16`: what it stores in f16 (`--precision` picks by it).
    pub precision: &'static str,
    /// Bytes of the KV caches it binds.
    pub kv_cache_bytes: u64,
    /// Dispatches per prefill step of a full chunk (a short prompt's step
    /// may run other matmul kernels, as many).
    pub prefill_dispatches: usize,
    /// Dispatches per decode step.
    pub decode_dispatches: usize,
    /// Decode dispatches inside one transformer layer.
    pub decode_dispatches_per_layer: f64,
    /// The largest storage binding it needs, in bytes: an adapter with less
    /// runs a later variant.
    pub max_binding_bytes: u64,
    /// The most workgroup memory one of its kernels uses, in bytes.
    pub workgroup_storage_bytes: u32,
}

/// Dispatches of `list` inside transformer layers, per layer.
fn per_layer<'a>(list: impl IntoIterator<Item = &'a Dispatch>, layers: u64) -> f64 {
    list.into_iter().filter(|d| d.layer.is_some()).count() as f64 / layers.max(1) as f64
}

/// Bytes of the KV-cache buffers `v` binds.
fn kv_bytes(h: &PlanHeader, v: &Variant) -> u64 {
    let caches: BTreeSet<u32> = v
        .bound_buffers()
        .filter(|&b| matches!(h.buffers[b as usize].kind, BufferKind::KvCache { .. }))
        .collect();
    // Saturating: sizes come from the file (each within the limits table).
    caches.iter().fold(0u64, |sum, &b| {
        sum.saturating_add(h.buffers[b as usize].size)
    })
}

fn summarize(h: &PlanHeader, v: &Variant) -> VariantSummary {
    VariantSummary {
        name: v.name.clone(),
        features: v.features.iter().map(|f| f.name()).collect(),
        precision: v.precision.name(),
        kv_cache_bytes: kv_bytes(h, v),
        prefill_dispatches: v.prefill_at(h.model.max_tokens_per_step).len(),
        decode_dispatches: v.decode.len(),
        decode_dispatches_per_layer: per_layer(&v.decode, h.model.num_layers),
        max_binding_bytes: v.requirements.max_storage_buffer_binding_size,
        workgroup_storage_bytes: v.requirements.max_compute_workgroup_storage_size,
    }
}

/// For each weight buffer whose section lies inside another weight buffer's
/// (a row shard of a weight stored whole), that weight's name.
fn ranges_of(h: &PlanHeader) -> BTreeMap<usize, String> {
    let sections: Vec<(usize, u64, u64, &str)> = h
        .buffers
        .iter()
        .enumerate()
        .filter_map(|(i, b)| match &b.kind {
            BufferKind::Weight { section, name, .. } => Some((
                i,
                section.offset,
                section.offset.saturating_add(section.len),
                name.as_str(),
            )),
            _ => None,
        })
        .collect();
    sections
        .iter()
        .filter_map(|&(i, start, end, _)| {
            sections
                .iter()
                .find(|&&(j, s, e, _)| j != i && s <= start && end <= e && (s, e) != (start, end))
                .map(|&(_, _, _, name)| (i, name.to_string()))
        })
        .collect()
}

/// Summarizes a plan header.
pub fn inspect(h: &PlanHeader) -> Inspection {
    let mut weight_bytes_by_dtype = BTreeMap::new();
    let mut weights = Vec::new();
    let mut arena = 0u64;
    let mut arena_sizes = Vec::new();
    let mut ranges = ranges_of(h);
    for (i, b) in h.buffers.iter().enumerate() {
        match &b.kind {
            BufferKind::Weight {
                dtype, name, shape, ..
            } => {
                let range_of = ranges.remove(&i);
                if range_of.is_none() {
                    let sum: &mut u64 = weight_bytes_by_dtype.entry(dtype.clone()).or_default();
                    *sum = sum.saturating_add(b.size);
                }
                weights.push(WeightSummary {
                    name: name.clone(),
                    dtype: dtype.clone(),
                    shape: shape.clone(),
                    bytes: b.size,
                    range_of,
                });
            }
            BufferKind::Arena => {
                arena = arena.saturating_add(b.size);
                arena_sizes.push(b.size);
            }
            _ => {}
        }
    }
    let layers = h.model.num_layers;
    let best = h.best_gpu_variant();
    let full_chunk = best.prefill_at(h.model.max_tokens_per_step);
    Inspection {
        architecture: h.model.architecture.clone(),
        family: h.model.family.clone(),
        name: h.model.name.clone(),
        config: h.model.config.clone(),
        num_layers: h.model.num_layers,
        max_context: h.model.max_context,
        max_tokens_per_step: h.model.max_tokens_per_step,
        passes: h.compile.passes.clone(),
        target: h.compile.target.clone(),
        tuned_on: h.compile.tuned_on.clone(),
        ops_before: h.compile.ops_before.iter().cloned().collect(),
        ops_after: h.compile.ops_after.iter().cloned().collect(),
        prefill_dispatches_total: full_chunk.len(),
        decode_dispatches_total: best.decode.len(),
        decode_dispatches_per_layer: per_layer(&best.decode, layers),
        prefill_dispatches_per_layer: per_layer(full_chunk, layers),
        activation_arena_bytes: arena,
        arena_sizes,
        activation_naive_bytes: h.compile.activation_naive_bytes,
        kv_cache_bytes: kv_bytes(h, best),
        weight_bytes_by_dtype,
        weights,
        kernels: h
            .kernels
            .iter()
            .map(|k| (k.name.clone(), k.workgroup_size))
            .collect(),
        variants: h.variants.iter().map(|v| summarize(h, v)).collect(),
        selftest_steps: h
            .selftest
            .iter()
            .flat_map(|t| t.steps.iter().map(|s| s.input_ids.len()))
            .collect(),
    }
}

/// `--weights`: one line per weight buffer (name, dtype, shape, bytes).
pub fn render_weights(i: &Inspection) -> String {
    let width = i.weights.iter().map(|w| w.name.len()).max().unwrap_or(0);
    let mut s = String::new();
    for w in &i.weights {
        let shape: Vec<String> = w.shape.iter().map(u64::to_string).collect();
        let stored = match &w.range_of {
            Some(whole) => format!(" (a range of {whole}'s)"),
            None => String::new(),
        };
        s += &format!(
            "{:<width$}  {:<5} [{}]  {} bytes{stored}\n",
            w.name,
            w.dtype,
            shape.join(", "),
            w.bytes
        );
    }
    s
}

/// Human-readable rendering of an inspection.
pub fn render(i: &Inspection) -> String {
    let cfg = |k: &str| {
        i.config
            .get(k)
            .map(|v| v.to_string())
            .unwrap_or_else(|| "-".into())
    };
    let mut s = format!(
        "model      {} ({}, family {}), {} layers\n\
         config     hidden {}, intermediate {}, heads {} / kv {}, head_dim {}, vocab {}\n\
         context    {} tokens, prefill chunk {}\npasses     {}\n",
        i.name,
        i.architecture,
        i.family,
        i.num_layers,
        cfg("hidden_size"),
        cfg("intermediate_size"),
        cfg("num_attention_heads"),
        cfg("num_key_value_heads"),
        cfg("head_dim"),
        cfg("vocab_size"),
        i.max_context,
        i.max_tokens_per_step,
        i.passes.join(" → ")
    );
    s += &format!("target     {}\n", i.target);
    if let Some(device) = &i.tuned_on {
        s += &format!("tuned on   {device}\n");
    }
    s += "ops        before → after\n";
    let names: std::collections::BTreeSet<&String> =
        i.ops_before.keys().chain(i.ops_after.keys()).collect();
    for n in names {
        s += &format!(
            "  {n:<16} {:>6} → {}\n",
            i.ops_before.get(n).copied().unwrap_or(0),
            i.ops_after.get(n).copied().unwrap_or(0)
        );
    }
    for v in &i.variants {
        let features = if v.features.is_empty() {
            "no optional features".to_string()
        } else {
            v.features.join(", ")
        };
        s += &format!(
            "variant    {} ({}; {features}; bindings {}, workgroup memory {}): prefill {} / \
             decode {} dispatches, kv cache {} bytes\n",
            v.name,
            v.precision,
            mib(v.max_binding_bytes),
            kib(v.workgroup_storage_bytes),
            v.prefill_dispatches,
            v.decode_dispatches,
            v.kv_cache_bytes
        );
    }
    s += "           (an adapter runs the first variant whose features and limits it has; \
          only a CPU adapter runs `cpu`)\n";
    if i.selftest_steps.is_empty() {
        s += "self-test  none (compiled with --no-selftest, or by a gerbil from before self-tests)\n";
    } else {
        let steps: Vec<String> = i.selftest_steps.iter().map(usize::to_string).collect();
        s += &format!(
            "self-test  {} tokens in steps of {} (`gerbil-run PLAN selftest`)\n",
            i.selftest_steps.iter().sum::<usize>(),
            steps.join(" + ")
        );
    }
    s += &format!(
        "dispatches prefill {} ({:.1} per layer) / decode {} ({:.1} per layer)\n",
        i.prefill_dispatches_total,
        i.prefill_dispatches_per_layer,
        i.decode_dispatches_total,
        i.decode_dispatches_per_layer
    );
    s += &format!(
        "activations arena {} bytes in {} buffer(s) vs {} naive ({:.1}%)\nkv cache   {} bytes (best GPU variant)\n",
        i.activation_arena_bytes,
        i.arena_sizes.len(),
        i.activation_naive_bytes,
        100.0 * i.activation_arena_bytes as f64 / i.activation_naive_bytes.max(1) as f64,
        i.kv_cache_bytes
    );
    for (d, b) in &i.weight_bytes_by_dtype {
        s += &format!("weights    {d}: {b} bytes\n");
    }
    s += &format!("kernels    {}\n", i.kernels.len());
    for (k, wg) in &i.kernels {
        s += &format!(
            "  {k:<48} @workgroup_size({}, {}, {})\n",
            wg[0], wg[1], wg[2]
        );
    }
    s
}

/// `bytes` in MiB, one decimal.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

/// `bytes` in KiB, one decimal.
fn kib(bytes: u32) -> String {
    format!("{:.1} KiB", f64::from(bytes) / 1024.0)
}
