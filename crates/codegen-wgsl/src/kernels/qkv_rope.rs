//! `qkv_rope`: everything between a layer's fused q|k|v projection and its
//! attention, in one dispatch: optional per-head q/k RMSNorm, rotate-half
//! RoPE of queries and keys at positions `P + t`, the rotated queries to an
//! activation, the rotated keys and the raw values into the KV caches.
//!
//! One workgroup per (row, head slot): slots `0..NH` are query heads,
//! `NH..NH+NKV` key heads, the rest value heads. In the fused row the heads
//! lie in that order, so slot `h` reads `x[t·XW + h·HD ..]`. A value slot
//! copies its head into the V cache and returns (the branch is uniform over
//! the workgroup). A query or key slot normalizes its head into workgroup
//! memory, then rotates pairs out of it, so a pair's two elements never
//! race. Nothing assumes power-of-two head sizes.

use super::{
    f32_lit, input, kv_store, kv_tag, output, prelude, tree_reduce, Bindings, KernelSource,
    Positions, Rows,
};
use gerbil_ir::DType;
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

const WG: u32 = 64;

/// Specialization of a qkv-rope kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QkvRopeSpec {
    /// Query heads.
    pub heads: u32,
    /// Key/value heads.
    pub kv_heads: u32,
    /// Head width.
    pub head_dim: u32,
    /// Rotated leading dimensions of each head.
    pub rotary_dim: u32,
    /// Per-head norm: `(eps, weight offset, weight dtype)`.
    pub norm: Option<(f32, f32, DType)>,
    /// How the KV caches are stored (f32, or f16 in an f16 variant).
    pub kv: DType,
}

/// Builds the kernel. Bindings: `x` (fused qkv), `table`, `kc`, `vc`, then
/// with a norm `qn`, `kn`, and last the query output `q`.
pub fn kernel(s: QkvRopeSpec) -> KernelSource {
    kernel_at(s, Positions::Step)
}

/// Builds the kernel for rows at `at`.
pub fn kernel_at(s: QkvRopeSpec, at: Positions) -> KernelSource {
    let mut w = prelude();
    let half = s.rotary_dim / 2;
    let _ = writeln!(
        w,
        "const NH: u32 = {nh}u;\nconst NKV: u32 = {nkv}u;\nconst HD: u32 = {hd}u;\nconst ROT: u32 = {rot}u;\nconst HALF: u32 = {half}u;\n\
         const QW: u32 = {qw}u;\nconst KW: u32 = {kw}u;\nconst XW: u32 = {xw}u;\nconst SLOTS: u32 = {slots}u;\nconst WG: u32 = {WG}u;",
        nh = s.heads,
        nkv = s.kv_heads,
        hd = s.head_dim,
        rot = s.rotary_dim,
        qw = s.heads * s.head_dim,
        kw = s.kv_heads * s.head_dim,
        xw = (s.heads + 2 * s.kv_heads) * s.head_dim,
        slots = s.heads + 2 * s.kv_heads,
    );
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.read_f32(&mut w, input(1), "table");
    b.kv_cache(&mut w, input(2), "kc", s.kv, true);
    b.kv_cache(&mut w, input(3), "vc", s.kv, true);
    if let Some((eps, off, dt)) = s.norm {
        let _ = writeln!(
            w,
            "const EPS: f32 = {};\nconst OFFSET: f32 = {};",
            f32_lit(eps),
            f32_lit(off)
        );
        b.weight(&mut w, input(4), "qn", dt);
        b.weight(&mut w, input(5), "kn", dt);
    }
    b.activation(&mut w, output(0), "q");
    at.declare(&mut b, &mut w);
    let load = match s.norm {
        Some(_) => format!(
            "  var ss = 0.0f;\n\
             \x20 for (var i = lane; i < HD; i = i + WG) {{ let v = x[src + i]; ss = ss + v * v; }}\n\
             \x20 red[lane] = ss;\n  workgroupBarrier();\n{}\
             \x20 let inv = 1.0f / sqrt(red[0] / f32(HD) + EPS);\n\
             \x20 for (var i = lane; i < HD; i = i + WG) {{\n\
             \x20   let wn = select(load_kn(i), load_qn(i), h < NH);\n\
             \x20   hv[i] = (x[src + i] * inv) * (wn + OFFSET);\n  }}\n",
            tree_reduce(WG, "lane", "0u", "+")
        ),
        None => "  for (var i = lane; i < HD; i = i + WG) { hv[i] = x[src + i]; }\n".to_string(),
    };
    let red = if s.norm.is_some() {
        "var<workgroup> red: array<f32, WG>;\n"
    } else {
        ""
    };
    let _ = write!(
        w,
        "var<workgroup> hv: array<f32, HD>;\n{red}\
         @compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let t = wid.y;\n  let h = wid.x;\n  let lane = lid.x;\n\
         \x20 let src = t * XW + h * HD;\n\
         \x20 if (h >= NH + NKV) {{\n\
         \x20   let dst = {crow} * KW + (h - NH - NKV) * HD;\n\
         \x20   for (var i = lane; i < HD; i = i + WG) {{ vc[dst + i] = {v}; }}\n\
         \x20   return;\n  }}\n\
         {load}\
         \x20 workgroupBarrier();\n\
         \x20 let row = {pos} * ROT;\n\
         \x20 for (var j = lane; j < HD; j = j + WG) {{\n\
         \x20   var o = hv[j];\n\
         \x20   if (j < HALF) {{\n\
         \x20     o = hv[j] * table[row + j] - hv[j + HALF] * table[row + HALF + j];\n\
         \x20   }} else if (j < ROT) {{\n\
         \x20     let i = j - HALF;\n\
         \x20     o = hv[j] * table[row + i] + hv[i] * table[row + HALF + i];\n\
         \x20   }}\n\
         \x20   if (h < NH) {{\n\
         \x20     q[t * QW + h * HD + j] = o;\n\
         \x20   }} else {{\n\
         \x20     kc[{crow} * KW + (h - NH) * HD + j] = {k};\n\
         \x20   }}\n  }}\n}}\n",
        v = kv_store(s.kv, "x[src + i]"),
        k = kv_store(s.kv, "o"),
        crow = at.cache_row("t"),
        pos = at.pos("t"),
    );
    KernelSource {
        name: format!(
            "qkv_rope_h{}_kv{}_d{}_r{}{}{}{}",
            s.heads,
            s.kv_heads,
            s.head_dim,
            s.rotary_dim,
            match s.norm {
                Some((_, _, dt)) => format!("_norm_{dt}"),
                None => String::new(),
            },
            kv_tag(s.kv),
            at.tag(),
        ),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        // A workgroup per head slot and row, rows on the second axis: an
        // encoder step of 8192 rows times 32 slots is past the 65535
        // workgroups one axis may have.
        workgroups: [
            WorkgroupCount::fixed(s.heads + 2 * s.kv_heads),
            Rows::Tokens.count(1, 1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: (s.head_dim + if s.norm.is_some() { WG } else { 0 }) * 4,
    }
}
