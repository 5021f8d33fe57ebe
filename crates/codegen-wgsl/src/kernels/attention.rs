//! `attention`: causal (optionally sliding-window) grouped-query attention of
//! the step's queries against the KV cache, with an online softmax.
//!
//! One workgroup of `WG` = 256 threads per (query head, query row). Keys are
//! visited in chunks of `WG`: each thread scores one key of the chunk, the
//! chunk's maximum and sum are reduced in workgroup memory, and the output is
//! accumulated by `DL` = 64 dimension lanes × `KG` = 4 key groups (thread
//! `(lane, g)` owns dims `d ≡ lane (mod DL)` and keys `jj ≡ g (mod KG)` of
//! the chunk), rescaled by `exp(m_old − m_new)` per chunk — the
//! flash-attention recurrence, so no `[T, P]` score matrix is ever stored.
//! The key groups' partial sums are added once at the end. A decode step
//! with up to 256 cached keys runs a single chunk. Masked keys use a finite
//! sentinel instead of −∞ so no NaN can arise.

use super::{
    f32_lit, input, kv_load, kv_tag, output, prelude, tree_reduce, Bindings, KernelSource, Rows,
};
use gerbil_ir::DType;
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// Threads per workgroup, and keys per chunk.
const WG: u32 = 256;
/// Dimension lanes of the value accumulation.
const DL: u32 = 64;
/// Key groups of the value accumulation (`WG / DL`).
const KG: u32 = WG / DL;

/// Specialization of an attention kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    /// Query heads.
    pub heads: u32,
    /// Key/value heads.
    pub kv_heads: u32,
    /// Head width.
    pub head_dim: u32,
    /// Score multiplier.
    pub scale: f32,
    /// Sliding window, 0 for none.
    pub window: u32,
    /// How the KV cache is stored (f32, or f16 in an f16 variant).
    pub kv: DType,
}

/// Builds the kernel.
pub fn kernel(s: AttentionSpec) -> KernelSource {
    let mut w = prelude();
    let per_thread = s.head_dim.div_ceil(DL);
    let _ = writeln!(
        w,
        "const NH: u32 = {}u;\nconst NKV: u32 = {}u;\nconst HD: u32 = {}u;\nconst GROUP: u32 = {}u;\n\
         const SCALE: f32 = {};\nconst WINDOW: u32 = {}u;\nconst WG: u32 = {WG}u;\nconst DL: u32 = {DL}u;\n\
         const KG: u32 = {KG}u;\nconst PT: u32 = {per_thread}u;\nconst NEG: f32 = -3.0e38f;",
        s.heads,
        s.kv_heads,
        s.head_dim,
        s.heads / s.kv_heads,
        f32_lit(s.scale),
        s.window
    );
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "q");
    b.kv_cache(&mut w, input(1), "kc", s.kv, false);
    b.kv_cache(&mut w, input(2), "vc", s.kv, false);
    b.activation(&mut w, output(0), "y");
    let _ = write!(
        w,
        "var<workgroup> qs: array<f32, HD>;\n\
         var<workgroup> ps: array<f32, WG>;\n\
         var<workgroup> red: array<f32, WG>;\n\
         var<workgroup> part: array<f32, {part}>;\n\
         @compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let h = wid.x;\n  let t = wid.y;\n  let lane = lid.x;\n\
         \x20 let dl = lane % DL;\n  let kg = lane / DL;\n\
         \x20 let pos = params.p + t;\n  let kvh = h / GROUP;\n\
         \x20 var lo = 0u;\n  if (WINDOW > 0u && pos + 1u > WINDOW) {{ lo = pos + 1u - WINDOW; }}\n\
         \x20 for (var d = lane; d < HD; d = d + WG) {{ qs[d] = q[(t * NH + h) * HD + d]; }}\n\
         \x20 workgroupBarrier();\n\
         \x20 var m = NEG;\n  var l = 0.0f;\n  var acc: array<f32, PT>;\n\
         \x20 for (var c = lo; c <= pos; c = c + WG) {{\n\
         \x20   let j = c + lane;\n    var sc = NEG;\n\
         \x20   if (j <= pos) {{\n\
         \x20     let kb = (j * NKV + kvh) * HD;\n      var dot = 0.0f;\n\
         \x20     for (var d = 0u; d < HD; d = d + 1u) {{ dot = dot + qs[d] * {kd}; }}\n\
         \x20     sc = dot * SCALE;\n    }}\n\
         \x20   red[lane] = sc;\n    workgroupBarrier();\n{max_reduce}\
         \x20   let m_new = max(m, red[0]);\n    workgroupBarrier();\n\
         \x20   var p = 0.0f;\n    if (j <= pos) {{ p = exp(sc - m_new); }}\n\
         \x20   ps[lane] = p;\n    red[lane] = p;\n    workgroupBarrier();\n{sum_reduce}\
         \x20   let alpha = exp(m - m_new);\n    l = l * alpha + red[0];\n\
         \x20   let n_keys = min(WG, pos + 1u - c);\n\
         \x20   for (var e = 0u; e < PT; e = e + 1u) {{\n\
         \x20     let d = dl + e * DL;\n      if (d < HD) {{\n\
         \x20       var a = acc[e] * alpha;\n\
         \x20       for (var jj = kg; jj < n_keys; jj = jj + KG) {{ a = a + ps[jj] * {vd}; }}\n\
         \x20       acc[e] = a;\n      }}\n    }}\n\
         \x20   m = m_new;\n    workgroupBarrier();\n  }}\n\
         \x20 for (var e = 0u; e < PT; e = e + 1u) {{\n\
         \x20   let d = dl + e * DL;\n    if (d < HD) {{ part[kg * HD + d] = acc[e]; }}\n  }}\n\
         \x20 workgroupBarrier();\n\
         \x20 for (var d = lane; d < HD; d = d + WG) {{\n\
         \x20   var o = 0.0f;\n    for (var g = 0u; g < KG; g = g + 1u) {{ o = o + part[g * HD + d]; }}\n\
         \x20   y[(t * NH + h) * HD + d] = o / l;\n  }}\n}}\n",
        part = KG * s.head_dim,
        max_reduce = tree_reduce(WG, "lane", "0u", "max"),
        sum_reduce = tree_reduce(WG, "lane", "0u", "+"),
        kd = kv_load(s.kv, "kc", "kb + d"),
        vd = kv_load(s.kv, "vc", "((c + jj) * NKV + kvh) * HD + d"),
    );
    KernelSource {
        name: format!(
            "attention_h{}_kv{}_d{}_w{}{}",
            s.heads,
            s.kv_heads,
            s.head_dim,
            s.window,
            kv_tag(s.kv)
        ),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(s.heads),
            Rows::Tokens.count(1, 1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: (s.head_dim + 2 * WG + KG * s.head_dim) * 4,
    }
}
