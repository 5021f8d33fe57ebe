//! `sample_token`: the next token chosen from the last row of logits on the
//! GPU — the argmax when greedy, else a seeded draw with temperature, top-k,
//! top-p and min-p — so decoding never copies logits to the CPU.
//!
//! One workgroup of `WG` threads, each scanning a strided slice of the row
//! (coalesced reads), reductions through workgroup memory. The choice is
//! exactly `gerbil_runtime::sampling`'s: greedy is the argmax (a larger value
//! wins, an equal one only with a lower column, NaN never); sampling keeps the
//! tokens at or above a threshold and takes the argmax of `(l − max)/T + g`
//! with Gumbel noise `g` hashed from (seed, position, column). The top-k and
//! top-p thresholds are found by a bitwise search over the order-preserving
//! `u32` keys of the logits: 32 counting (or summing) passes over the row,
//! each cheap at vocabulary sizes. The surprise: NaN is recognized by its
//! bits, because WGSL lets compilers assume finite math and fold `v != v`
//! away (lavapipe does).

use super::{input, output, prelude, Bindings, KernelSource, Rows};
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// Threads of the one workgroup.
const WG: u32 = 256;

/// The kernel body after the constants and bindings; `{rows}` is the row
/// count expression.
const BODY: &str = r#"
var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_u: array<u32, WG>;

fn is_nan(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u; }
// A u32 that orders like the float (for non-NaN values).
fn key(v: f32) -> u32 {
  let b = bitcast<u32>(v);
  return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}
// Whether (v, i) beats (bv, bi): larger, or equal with a lower index; NaN never wins.
fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {
  if (is_nan(v)) { return false; }
  if (is_nan(bv)) { return true; }
  return v > bv || (v == bv && i < bi);
}
fn pcg(v: u32) -> u32 {
  let s = v * 747796405u + 2891336453u;
  let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
  return (w >> 22u) ^ w;
}
fn gumbel(pos: u32, id: u32) -> f32 {
  var h = pcg(sp.seed_lo);
  h = pcg(h ^ sp.seed_hi);
  h = pcg(h ^ pos);
  h = pcg(h ^ id);
  let u = (f32(h >> 8u) + 0.5) / 16777216.0;
  return -log(-log(u));
}
// The workgroup's sum of `v` (every thread gets it).
fn sum_f(lane: u32, v: f32) -> f32 {
  red_f[lane] = v;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (lane < s) { red_f[lane] = red_f[lane] + red_f[lane + s]; }
    workgroupBarrier();
  }
  let total = workgroupUniformLoad(&red_f[0]);
  workgroupBarrier();
  return total;
}
// The workgroup's sum of `v` (every thread gets it).
fn sum_u(lane: u32, v: u32) -> u32 {
  red_u[lane] = v;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (lane < s) { red_u[lane] = red_u[lane] + red_u[lane + s]; }
    workgroupBarrier();
  }
  let total = workgroupUniformLoad(&red_u[0]);
  workgroupBarrier();
  return total;
}
// The winning column of the workgroup's (value, column) pairs.
fn best_of(lane: u32, bv: f32, bi: u32) -> u32 {
  red_f[lane] = bv;
  red_u[lane] = bi;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s >> 1u) {
    if (lane < s && beats(red_f[lane + s], red_u[lane + s], red_f[lane], red_u[lane])) {
      red_f[lane] = red_f[lane + s];
      red_u[lane] = red_u[lane + s];
    }
    workgroupBarrier();
  }
  let best = workgroupUniformLoad(&red_u[0]);
  workgroupBarrier();
  return best;
}
// Tokens whose key is at least `th` (NaN never counts).
fn count_from(lane: u32, base: u32, th: u32) -> u32 {
  var n = 0u;
  for (var c = lane; c < V; c = c + WG) {
    let v = x[base + c];
    if (!is_nan(v) && key(v) >= th) { n = n + 1u; }
  }
  return sum_u(lane, n);
}
// Softmax weight (unnormalized) of the tokens whose key is at least `th`.
fn mass_from(lane: u32, base: u32, th: u32, mx: f32, inv_t: f32) -> f32 {
  var m = 0.0f;
  for (var c = lane; c < V; c = c + WG) {
    let v = x[base + c];
    if (!is_nan(v) && key(v) >= th) { m = m + exp((v - mx) * inv_t); }
  }
  return sum_f(lane, m);
}

@compute @workgroup_size(WG, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
  let lane = lid.x;
  let base = ({rows} - 1u) * V;
  var bv = x[base + min(lane, V - 1u)];
  var bi = min(lane, V - 1u);
  for (var c = lane + WG; c < V; c = c + WG) {
    let v = x[base + c];
    if (beats(v, c, bv, bi)) { bv = v; bi = c; }
  }
  let top = best_of(lane, bv, bi);
  // best_of leaves the winning value in red_f[0].
  let mx = workgroupUniformLoad(&red_f[0]);
  if (sp.temperature == 0.0 || is_nan(mx)) {
    if (lane == 0u) { y[0] = top; }
    return;
  }
  let inv_t = 1.0 / sp.temperature;
  var keep_from = 0u;
  if (sp.top_k > 0u && sp.top_k < V) {
    var th = 0u;
    for (var bit = 31i; bit >= 0i; bit = bit - 1i) {
      let cand = th | (1u << u32(bit));
      if (count_from(lane, base, cand) >= sp.top_k) { th = cand; }
    }
    keep_from = th;
  }
  if (sp.top_p < 1.0) {
    let goal = sp.top_p * mass_from(lane, base, keep_from, mx, inv_t);
    var th = 0u;
    for (var bit = 31i; bit >= 0i; bit = bit - 1i) {
      let cand = th | (1u << u32(bit));
      if (mass_from(lane, base, cand, mx, inv_t) >= goal) { th = cand; }
    }
    keep_from = max(keep_from, th);
  }
  if (sp.min_p > 0.0) {
    keep_from = max(keep_from, key(mx + sp.temperature * log(sp.min_p)));
  }
  let pos = params.p + params.t - 1u;
  var sv = 0.0f;
  var si = V;
  for (var c = lane; c < V; c = c + WG) {
    let v = x[base + c];
    if (!is_nan(v) && key(v) >= keep_from) {
      let s = (v - mx) * inv_t + gumbel(pos, c);
      if (si == V || s > sv) { sv = s; si = c; }
    }
  }
  // A thread with no kept token offers NaN, which never wins.
  if (si == V) { sv = bitcast<f32>(0x7fc00000u); si = 0u; }
  let pick = best_of(lane, sv, si);
  if (lane == 0u) { y[0] = pick; }
}
"#;

/// Builds the kernel for rows of `vocab` logits, `rows` of them.
pub fn kernel(rows: Rows, vocab: u32) -> KernelSource {
    let mut w = prelude();
    let _ = writeln!(w, "const V: u32 = {vocab}u;\nconst WG: u32 = {WG}u;");
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.sampling(&mut w, "sp");
    b.ids_out(&mut w, output(0), "y");
    w.push_str(&BODY.replace("{rows}", &rows.wgsl()));
    KernelSource {
        name: format!("sample_token_r{}_v{vocab}", rows.tag()),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [WorkgroupCount::fixed(1); 3],
        workgroup_bytes: WG * 8,
    }
}
