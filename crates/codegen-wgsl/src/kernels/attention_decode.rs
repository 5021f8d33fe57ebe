//! `attention` for a decode step (`T = 1`): split-K over the keys
//! (flash-decoding) in one dispatch, the heads of a GQA group sharing their
//! K/V loads.
//!
//! The keys `lo..=pos` are cut into at most [`splits`] equal splits of at
//! least [`MIN_KEYS`] keys; one workgroup of `WG` = 256 threads runs per (KV
//! head, split) and scores its keys against every query head of the group
//! (one key per thread, each K row read once for the group), takes each
//! head's maximum and sum with tree reductions in workgroup memory, and
//! accumulates the values like the prefill kernel (`DL` = 64 dimension
//! lanes × `KG` = 4 key groups, each V row read once for the group). It
//! writes one partial `(m, l, acc[HD])` per (head, split) to the dispatch
//! scratch and bumps its KV head's counter; the workgroup that finds itself
//! last combines the partials (rescaled by `exp(m_i − M)`), writes `y` and
//! puts the counter back to zero for the next dispatch. The split count is a
//! compile-time constant: enough workgroups to fill a large GPU
//! ([`TARGET_WORKGROUPS`]) yet no split longer than `CAP` keys at the
//! largest context, so one split's scores fit workgroup memory and need no
//! online rescaling. The surprise: the hand-off between workgroups relies on
//! `storageBarrier()`, which naga emits as a device-scope acquire-release
//! barrier, around the counter's `atomicAdd`; and a split past the keys in
//! use returns at once without touching the counter, so "last" means last of
//! the splits this step uses.

use super::attention::AttentionSpec;
use super::{f32_lit, input, output, prelude, Bindings, KernelSource};
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// Threads per workgroup.
const WG: u32 = 256;
/// Dimension lanes of the value accumulation.
const DL: u32 = 64;
/// Key groups of the value accumulation (`WG / DL`).
const KG: u32 = WG / DL;
/// Workgroups the dispatch aims for at long context (an H100 has 132 SMs).
pub const TARGET_WORKGROUPS: u32 = 128;
/// Fewest keys a split takes before another split is used.
pub const MIN_KEYS: u32 = 32;
/// Scores one workgroup keeps (`GROUP × CAP`), so scores and their reduction
/// copy take 8 KiB of workgroup memory.
const SCORE_SLOTS: u32 = 1024;

/// Most keys one split holds: a power of two, at most one per thread.
fn cap(group: u32) -> u32 {
    let slots = (SCORE_SLOTS / group.max(1)).max(1);
    (1 << slots.ilog2()).min(WG)
}

/// The kernel's split count for `s` with a KV cache of `max_context` rows:
/// about [`TARGET_WORKGROUPS`] workgroups, at least enough splits that none
/// holds more than `CAP` keys, and no more than [`MIN_KEYS`]-key splits need.
pub fn splits(s: &AttentionSpec, max_context: u32) -> u32 {
    let keys = match s.window {
        0 => max_context,
        w => w.min(max_context),
    }
    .max(1);
    let cap = cap(s.heads / s.kv_heads);
    TARGET_WORKGROUPS
        .div_ceil(s.kv_heads)
        .clamp(keys.div_ceil(cap), keys.div_ceil(MIN_KEYS.min(cap)))
}

/// Builds the kernel for a KV cache of `max_context` rows.
pub fn kernel(s: AttentionSpec, max_context: u32) -> KernelSource {
    let group = s.heads / s.kv_heads;
    let cap = cap(group);
    let splits = splits(&s, max_context);
    let per_thread = s.head_dim.div_ceil(DL);
    let mut w = prelude();
    let _ = writeln!(
        w,
        "const NKV: u32 = {}u;\nconst HD: u32 = {}u;\nconst G: u32 = {group}u;\n\
         const SCALE: f32 = {};\nconst WINDOW: u32 = {}u;\nconst WG: u32 = {WG}u;\nconst DL: u32 = {DL}u;\n\
         const KG: u32 = {KG}u;\nconst PT: u32 = {per_thread}u;\nconst CAP: u32 = {cap}u;\n\
         const S: u32 = {splits}u;\nconst MINK: u32 = {}u;\nconst STRIDE: u32 = HD + 2u;\n\
         const NEG: f32 = -3.0e38f;",
        s.kv_heads,
        s.head_dim,
        f32_lit(s.scale),
        s.window,
        MIN_KEYS.min(cap),
    );
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "q");
    b.read_f32(&mut w, input(1), "kc");
    b.read_f32(&mut w, input(2), "vc");
    b.activation(&mut w, output(0), "y");
    b.scratch(
        &mut w,
        "part",
        u64::from(s.heads * splits * (s.head_dim + 2)) * 4,
    );
    b.counters(&mut w, "count", s.kv_heads);
    let _ = write!(
        w,
        "var<workgroup> ws: array<f32, {slots}>;\n\
         var<workgroup> red: array<f32, {slots}>;\n\
         var<workgroup> accs: array<f32, {accs}>;\n\
         var<workgroup> last: u32;\n\
         @compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let kvh = wid.x;\n  let split = wid.y;\n  let lane = lid.x;\n\
         \x20 let dl = lane % DL;\n  let kg = lane / DL;\n\
         \x20 let pos = params.p;\n\
         \x20 var lo = 0u;\n  if (WINDOW > 0u && pos + 1u > WINDOW) {{ lo = pos + 1u - WINDOW; }}\n\
         \x20 let n = pos + 1u - lo;\n\
         \x20 let used = min(S, (n + MINK - 1u) / MINK);\n\
         \x20 if (split >= used) {{ return; }}\n\
         \x20 let chunk = (n + used - 1u) / used;\n\
         \x20 let start = split * chunk;\n\
         \x20 var nk = 0u;\n  if (start < n) {{ nk = min(min(chunk, n - start), CAP); }}\n\
         \x20 let k0 = lo + start;\n  let h0 = kvh * G;\n\
         \x20 for (var jj = lane; jj < CAP; jj = jj + WG) {{\n\
         \x20   var sc: array<f32, G>;\n\
         \x20   for (var g = 0u; g < G; g = g + 1u) {{ sc[g] = NEG; }}\n\
         \x20   if (jj < nk) {{\n\
         \x20     let kb = ((k0 + jj) * NKV + kvh) * HD;\n\
         \x20     var dot = array<f32, G>();\n\
         \x20     for (var d = 0u; d < HD; d = d + 1u) {{\n\
         \x20       let k = kc[kb + d];\n\
         \x20       for (var g = 0u; g < G; g = g + 1u) {{ dot[g] = dot[g] + q[(h0 + g) * HD + d] * k; }}\n\
         \x20     }}\n\
         \x20     for (var g = 0u; g < G; g = g + 1u) {{ sc[g] = dot[g] * SCALE; }}\n\
         \x20   }}\n\
         \x20   for (var g = 0u; g < G; g = g + 1u) {{ ws[g * CAP + jj] = sc[g]; red[g * CAP + jj] = sc[g]; }}\n\
         \x20 }}\n\
         \x20 workgroupBarrier();\n{max_reduce}\
         \x20 var m: array<f32, G>;\n\
         \x20 for (var g = 0u; g < G; g = g + 1u) {{ m[g] = red[g * CAP]; }}\n\
         \x20 workgroupBarrier();\n\
         \x20 for (var jj = lane; jj < CAP; jj = jj + WG) {{\n\
         \x20   for (var g = 0u; g < G; g = g + 1u) {{\n\
         \x20     var p = 0.0f;\n      if (jj < nk) {{ p = exp(ws[g * CAP + jj] - m[g]); }}\n\
         \x20     ws[g * CAP + jj] = p;\n      red[g * CAP + jj] = p;\n    }}\n\
         \x20 }}\n\
         \x20 workgroupBarrier();\n{sum_reduce}\
         \x20 var l: array<f32, G>;\n\
         \x20 for (var g = 0u; g < G; g = g + 1u) {{ l[g] = red[g * CAP]; }}\n\
         \x20 var acc = array<f32, {regs}>();\n\
         \x20 for (var e = 0u; e < PT; e = e + 1u) {{\n\
         \x20   let d = dl + e * DL;\n\
         \x20   if (d < HD) {{\n\
         \x20     for (var jj = kg; jj < nk; jj = jj + KG) {{\n\
         \x20       let v = vc[((k0 + jj) * NKV + kvh) * HD + d];\n\
         \x20       for (var g = 0u; g < G; g = g + 1u) {{ acc[g * PT + e] = acc[g * PT + e] + ws[g * CAP + jj] * v; }}\n\
         \x20     }}\n\
         \x20   }}\n\
         \x20 }}\n\
         \x20 for (var g = 0u; g < G; g = g + 1u) {{\n\
         \x20   workgroupBarrier();\n\
         \x20   for (var e = 0u; e < PT; e = e + 1u) {{\n\
         \x20     let d = dl + e * DL;\n      if (d < HD) {{ accs[kg * HD + d] = acc[g * PT + e]; }}\n\
         \x20   }}\n\
         \x20   workgroupBarrier();\n\
         \x20   let base = ((h0 + g) * S + split) * STRIDE;\n\
         \x20   for (var d = lane; d < HD; d = d + WG) {{\n\
         \x20     var o = 0.0f;\n\
         \x20     for (var k = 0u; k < KG; k = k + 1u) {{ o = o + accs[k * HD + d]; }}\n\
         \x20     part[base + 2u + d] = o;\n\
         \x20   }}\n\
         \x20   if (lane == 0u) {{ part[base] = m[g]; part[base + 1u] = l[g]; }}\n\
         \x20 }}\n\
         \x20 storageBarrier();\n\
         \x20 if (lane == 0u) {{ last = select(0u, 1u, atomicAdd(&count[kvh], 1u) == used - 1u); }}\n\
         \x20 if (workgroupUniformLoad(&last) == 0u) {{ return; }}\n\
         \x20 storageBarrier();\n\
         \x20 for (var i = lane; i < G * HD; i = i + WG) {{\n\
         \x20   let hb = (h0 + i / HD) * S * STRIDE;\n    let d = i % HD;\n\
         \x20   var mx = NEG;\n\
         \x20   for (var j = 0u; j < used; j = j + 1u) {{ mx = max(mx, part[hb + j * STRIDE]); }}\n\
         \x20   var sum = 0.0f;\n    var o = 0.0f;\n\
         \x20   for (var j = 0u; j < used; j = j + 1u) {{\n\
         \x20     let pb = hb + j * STRIDE;\n      let f = exp(part[pb] - mx);\n\
         \x20     sum = sum + part[pb + 1u] * f;\n      o = o + part[pb + 2u + d] * f;\n\
         \x20   }}\n\
         \x20   y[h0 * HD + i] = o / sum;\n\
         \x20 }}\n\
         \x20 if (lane == 0u) {{ atomicStore(&count[kvh], 0u); }}\n}}\n",
        slots = group * cap,
        accs = KG * s.head_dim,
        regs = group * per_thread,
        max_reduce = group_reduce("max"),
        sum_reduce = group_reduce("+"),
    );
    KernelSource {
        name: format!(
            "attention_decode_h{}_kv{}_d{}_w{}_s{splits}",
            s.heads, s.kv_heads, s.head_dim, s.window
        ),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(s.kv_heads),
            WorkgroupCount::fixed(splits),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: (2 * group * cap + KG * s.head_dim + 1) * 4,
    }
}

/// WGSL reducing each head's row `red[g·CAP .. g·CAP + nk]` into
/// `red[g·CAP]` (entries past `nk` hold the operation's identity); halvings
/// wider than `nk` are skipped.
fn group_reduce(op: &str) -> String {
    let combine = if op == "max" {
        "red[a] = max(red[a], red[a + s]);"
    } else {
        "red[a] = red[a] + red[a + s];"
    };
    format!(
        "  for (var s = CAP / 2u; s > 0u; s = s >> 1u) {{\n\
         \x20   if (s >= nk) {{ continue; }}\n\
         \x20   for (var i = lane; i < G * s; i = i + WG) {{ let a = (i / s) * CAP + i % s; {combine} }}\n\
         \x20   workgroupBarrier();\n  }}\n"
    )
}
