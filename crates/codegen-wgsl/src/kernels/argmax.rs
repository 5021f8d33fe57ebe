//! `argmax`: the column of the largest logit in the last row, as the next
//! token id, so greedy decoding never copies the logits to the CPU.
//!
//! One workgroup of `WG` threads: each thread scans a strided slice of the
//! row (coalesced reads) keeping its best `(value, column)`, then the
//! workgroup reduces the pairs in shared memory. The order of comparison is
//! the CPU sampler's: a larger value wins, an equal value wins only with a
//! lower column, and NaN never wins (a NaN candidate is replaced by anything)
//! — so GPU and CPU greedy decoding pick the same token, ties included. NaN
//! is recognized by its bits: WGSL lets compilers assume finite math and fold
//! `v != v` away (lavapipe does).

use super::{input, output, prelude, Bindings, KernelSource, Rows};
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// Threads of the one workgroup.
const WG: u32 = 256;

/// Builds the kernel for rows of `vocab` logits, `rows` of them.
pub fn kernel(rows: Rows, vocab: u32) -> KernelSource {
    let mut w = prelude();
    let _ = writeln!(w, "const V: u32 = {vocab}u;\nconst WG: u32 = {WG}u;");
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.ids_out(&mut w, output(0), "y");
    let _ = write!(
        w,
        "var<workgroup> best_v: array<f32, WG>;\n\
         var<workgroup> best_i: array<u32, WG>;\n\
         // NaN by its bits: shader compilers may fold `v != v` to false.\n\
         fn is_nan(v: f32) -> bool {{ return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u; }}\n\
         // Whether (v, i) beats (bv, bi): larger, or equal with a lower index; NaN never wins.\n\
         fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {{\n\
         \x20 if (is_nan(v)) {{ return false; }}\n\
         \x20 if (is_nan(bv)) {{ return true; }}\n\
         \x20 return v > bv || (v == bv && i < bi);\n}}\n\
         @compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>) {{\n\
         \x20 let lane = lid.x;\n\
         \x20 let base = ({rows} - 1u) * V;\n\
         \x20 var bv = x[base + min(lane, V - 1u)];\n  var bi = min(lane, V - 1u);\n\
         \x20 for (var c = lane + WG; c < V; c = c + WG) {{\n\
         \x20   let v = x[base + c];\n\
         \x20   if (beats(v, c, bv, bi)) {{ bv = v; bi = c; }}\n  }}\n\
         \x20 best_v[lane] = bv;\n  best_i[lane] = bi;\n  workgroupBarrier();\n\
         \x20 for (var s = WG / 2u; s > 0u; s = s >> 1u) {{\n\
         \x20   if (lane < s && beats(best_v[lane + s], best_i[lane + s], best_v[lane], best_i[lane])) {{\n\
         \x20     best_v[lane] = best_v[lane + s];\n      best_i[lane] = best_i[lane + s];\n    }}\n\
         \x20   workgroupBarrier();\n  }}\n\
         \x20 if (lane == 0u) {{ y[0] = best_i[0]; }}\n}}\n",
        rows = rows.wgsl(),
    );
    KernelSource {
        name: format!("argmax_r{}_v{vocab}", rows.tag()),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [WorkgroupCount::fixed(1); 3],
        workgroup_bytes: WG * 8,
    }
}
