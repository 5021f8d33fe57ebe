//! `argmax_rows`: every row's greedy token of a batch step's logits, on the
//! GPU, so a batch step of greedy sequences reads back a word a row instead
//! of a row of logits (16 rows of a 128,256-token vocabulary: 8 MB read back
//! and scanned on the CPU, which took 4 ms of an H200's 13.6 ms step).
//!
//! One workgroup a row (`params.t` of them): each thread keeps the best
//! `(value, column)` of the columns it strides over — a larger value wins,
//! an equal one only with a lower column, exactly as the CPU's argmax —
//! then a tree reduction in workgroup memory. A row holding any NaN or
//! infinity yields [`NOT_FINITE`] instead of a column, so the runtime reads
//! that row back and fails as the CPU's choice does, naming the token.
//! The surprise: non-finite values are recognized by their bits, because
//! WGSL lets compilers assume finite math and fold `v != v` away.

use super::{input, output, prelude, Bindings, KernelSource, Rows};
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

pub use gerbil_plan::NOT_FINITE_TOKEN as NOT_FINITE;

/// Threads of a workgroup on a GPU; on a CPU adapter, where every barrier
/// switches each invocation, [`CPU_THREADS`].
const GPU_THREADS: u32 = 256;
/// Threads of a workgroup on a CPU adapter.
const CPU_THREADS: u32 = 16;

/// Builds the kernel for logits of `vocab` columns, `cpu` for a CPU
/// adapter's variant.
pub fn kernel(vocab: u32, cpu: bool) -> KernelSource {
    let wg = if cpu { CPU_THREADS } else { GPU_THREADS };
    let mut w = prelude();
    let _ = writeln!(
        w,
        "const V: u32 = {vocab}u;\nconst WG: u32 = {wg}u;\nconst NOT_FINITE: u32 = {NOT_FINITE}u;"
    );
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.ids_out(&mut w, output(0), "y");
    w.push_str(
        "var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> bad: array<u32, WG>;

// Whether (v, i) beats (bv, bi): larger, or equal with a lower column.
fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {
  return v > bv || (v == bv && i < bi);
}

@compute @workgroup_size(WG, 1, 1)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  let t = wid.x;
  if (t >= params.t) { return; }
  let base = t * V;
  // The most negative finite f32: any finite value beats it or ties it.
  var bv = -3.4028234663852886e38f;
  var bi = 0xffffffffu;
  var nonfinite = 0u;
  for (var c = tid; c < V; c = c + WG) {
    let v = x[base + c];
    if ((bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u) {
      nonfinite = 1u;
    } else if (beats(v, c, bv, bi)) {
      bv = v;
      bi = c;
    }
  }
  best_v[tid] = bv;
  best_i[tid] = bi;
  bad[tid] = nonfinite;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (tid < s) {
      if (beats(best_v[tid + s], best_i[tid + s], best_v[tid], best_i[tid])) {
        best_v[tid] = best_v[tid + s];
        best_i[tid] = best_i[tid + s];
      }
      bad[tid] = bad[tid] | bad[tid + s];
    }
    workgroupBarrier();
  }
  if (tid == 0u) {
    y[t] = select(best_i[0], NOT_FINITE, bad[0] != 0u);
  }
}
",
    );
    KernelSource {
        name: format!("argmax_rows_v{vocab}{}", if cpu { "_cpu" } else { "" }),
        wgsl: w,
        workgroup_size: [wg, 1, 1],
        bindings: b.finish(),
        workgroups: [
            Rows::Tokens.count(1, 1),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: 12 * wg,
    }
}
