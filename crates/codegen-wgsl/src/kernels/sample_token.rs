//! `sample_token`: the next token chosen from the last row of logits on the
//! GPU — the argmax when greedy, else a seeded draw with temperature, top-k,
//! top-p and min-p — so decoding never copies logits to the CPU.
//!
//! The choice is exactly `gerbil_runtime::sampling`'s: greedy is the argmax
//! (a larger value wins, an equal one only with a lower column, NaN never);
//! sampling keeps the tokens at or above a threshold and takes the argmax of
//! `(l − max)/T + g` with Gumbel noise `g` hashed from (seed, position,
//! column). The top-k and top-p thresholds are the largest order-preserving
//! `u32` key whose tokens at or above it still number `k` / hold `top_p` of
//! the kept probability, found by a bitwise search (32 counting or summing
//! passes).
//!
//! One dispatch of [`slices`] workgroups, each reading a slice of `E · WG`
//! columns into registers. Each workgroup writes to the dispatch scratch
//! its slice's best `(value, column)` and, when sampling, its slice's
//! *candidates* — the fewer than [`CANDIDATES`] tokens strictly above the
//! slice's `CANDIDATES`-th largest key (found by a radix select of 4 bits a
//! round in workgroup memory), that key (the slice's *floor*), and the
//! slice's softmax mass relative to its own maximum. The workgroup that
//! finds itself last on the self-resetting counter (as in
//! `attention_decode`) combines: the argmax over the slices' bests; when
//! sampling, the searches run over the candidates, held in workgroup
//! memory, instead of the vocabulary. Every token above the largest floor
//! `F` is a candidate, so a threshold the search finds above `F` is the
//! vocabulary's threshold, and so is the draw over the candidates when the
//! final threshold is above `F`. Otherwise (a large top-k, a nucleus
//! reaching below `F`, or no filter at all) the last workgroup repeats the
//! searches and the draw over the whole row — correct, only slower.
//! The surprises: NaN is recognized by its bits, because WGSL lets
//! compilers assume finite math and fold `v != v` away (lavapipe does); and
//! columns travel through the f32 scratch as exact f32 values (hence
//! [`MAX_VOCAB`]), never as bit casts, which a driver may flush as
//! denormals.

use super::{input, output, prelude, Bindings, KernelSource, Rows};
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// How the kernel spreads a row over threads: [`Shape::GPU`] or
/// [`Shape::CPU`] ([`Shape::for_adapter`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Threads of a workgroup: 16 times a power of two (the reductions add
    /// `WG / 16` values in each of 16 threads, then those 16 sums).
    threads: u32,
    /// Columns a thread reads when the vocabulary allows [`MAX_SLICES`] or
    /// fewer workgroups.
    columns_per_thread: u32,
}

/// Most columns a thread keeps in registers (`array<f32, E>`): 2 KiB, as
/// the GPU shape keeps at the largest vocabulary, a quarter of WGSL's 8 KiB
/// of function memory.
const MAX_COLUMNS: u32 = 512;

impl Shape {
    /// For a GPU: 256 threads reading 4 columns each.
    pub const GPU: Shape = Shape {
        threads: 256,
        columns_per_thread: 4,
    };
    /// For a CPU adapter (the `cpu` variant), where every barrier switches
    /// each invocation of the workgroup: 16 threads reading 64 columns each.
    pub const CPU: Shape = Shape {
        threads: 16,
        columns_per_thread: 64,
    };

    /// The shape for `vocab` columns on a CPU adapter (`cpu`) or a GPU:
    /// the CPU's unless its threads would keep more than [`MAX_COLUMNS`]
    /// columns each (vocabularies past a million).
    pub fn for_adapter(cpu: bool, vocab: u32) -> Shape {
        if cpu && slices(vocab, Shape::CPU).1 <= MAX_COLUMNS {
            Shape::CPU
        } else {
            Shape::GPU
        }
    }
}
/// Most workgroups (slices).
const MAX_SLICES: u32 = 128;
/// Each slice offers the tokens strictly above its `CANDIDATES`-th largest
/// logit (fewer than `CANDIDATES`): a top-k or nucleus set resolves from the
/// candidates unless some slice holds this many of its tokens.
pub const CANDIDATES: u32 = 16;
/// Largest vocabulary: columns are exact in f32 up to 2^24 (gerbil's
/// vocabulary limit, [`gerbil_plan::limits::VOCABULARY`], comes from here).
pub const MAX_VOCAB: u32 = gerbil_plan::limits::VOCABULARY.max as u32;
const _: () = assert!(MAX_VOCAB == 1 << 24);

/// Workgroups of the kernel of `shape` for `vocab` columns and the columns
/// each thread reads.
pub fn slices(vocab: u32, shape: Shape) -> (u32, u32) {
    let wg = shape.threads;
    let nw = vocab
        .div_ceil(wg * shape.columns_per_thread)
        .clamp(1, MAX_SLICES);
    (nw, vocab.div_ceil(nw * wg).max(1))
}

/// Helpers, the per-source searches and the entry point; `{rows}` is the
/// row count expression and `{search_x}`/`{search_c}` the searches over the
/// row and over the candidates.
const BODY: &str = r#"
var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_u: array<u32, WG>;
var<workgroup> red2_f: array<f32, 17>;
var<workgroup> red2_u: array<u32, 17>;
var<workgroup> hist: array<atomic<u32>, 16>;
var<workgroup> cand: array<f32, NC>;
var<workgroup> w_prefix: u32;
var<workgroup> w_need: u32;
var<workgroup> w_few: u32;
var<workgroup> w_last: u32;

fn is_nan(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u; }
// NaN, the searches' "none", from a variable's bits: a constant expression that is NaN is an
// error in WGSL, which browsers' compiler (Tint) enforces and naga does not.
var<private> nan_bits: u32 = 0x7fc00000u;
fn nan() -> f32 { return bitcast<f32>(nan_bits); }
// Whether a maximum is neither NaN nor −∞ (by its bits, like NaN).
fn finite_max(v: f32) -> bool { return !is_nan(v) && bitcast<u32>(v) != 0xff800000u; }
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
{pcg}fn gumbel(pos: u32, id: u32) -> f32 {
  var h = pcg(sp.seed_lo);
  h = pcg(h ^ sp.seed_hi);
  h = pcg(h ^ pos);
  h = pcg(h ^ id);
  let u = (f32(h >> 8u) + 0.5) / 16777216.0;
  return -log(-log(u));
}
// Reductions of one value per thread in two levels (16 threads each add WG16
// values, one thread the 16 sums): three barriers, where a tree over 256
// threads takes nine.
// Every thread gets the result.
fn sum_f(lane: u32, v: f32) -> f32 {
  red_f[lane] = v;
  workgroupBarrier();
  if (lane < 16u) {
    var s = 0.0f;
    for (var i = 0u; i < WG16; i = i + 1u) { s = s + red_f[lane * WG16 + i]; }
    red2_f[lane] = s;
  }
  workgroupBarrier();
  if (lane == 0u) {
    var s = 0.0f;
    for (var i = 0u; i < 16u; i = i + 1u) { s = s + red2_f[i]; }
    red2_f[16] = s;
  }
  return workgroupUniformLoad(&red2_f[16]);
}
fn sum_u(lane: u32, v: u32) -> u32 {
  red_u[lane] = v;
  workgroupBarrier();
  if (lane < 16u) {
    var s = 0u;
    for (var i = 0u; i < WG16; i = i + 1u) { s = s + red_u[lane * WG16 + i]; }
    red2_u[lane] = s;
  }
  workgroupBarrier();
  if (lane == 0u) {
    var s = 0u;
    for (var i = 0u; i < 16u; i = i + 1u) { s = s + red2_u[i]; }
    red2_u[16] = s;
  }
  return workgroupUniformLoad(&red2_u[16]);
}
fn max_u(lane: u32, v: u32) -> u32 {
  red_u[lane] = v;
  workgroupBarrier();
  if (lane < 16u) {
    var m = 0u;
    for (var i = 0u; i < WG16; i = i + 1u) { m = max(m, red_u[lane * WG16 + i]); }
    red2_u[lane] = m;
  }
  workgroupBarrier();
  if (lane == 0u) {
    var m = 0u;
    for (var i = 0u; i < 16u; i = i + 1u) { m = max(m, red2_u[i]); }
    red2_u[16] = m;
  }
  return workgroupUniformLoad(&red2_u[16]);
}
// The winning column of the workgroup's (value, column) pairs; the winning
// value is left in red_f[0].
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
// Offsets in the scratch `part`: per slice its best value and column, its
// candidate count, floor (NaN: every token is a candidate) and mass; then
// its candidates' values and columns, CAND slots each.
const P_MAX: u32 = 0u;
const P_COL: u32 = NW;
const P_COUNT: u32 = 2u * NW;
const P_FLOOR: u32 = 3u * NW;
const P_MASS: u32 = 4u * NW;
const P_VAL: u32 = 5u * NW;
const P_VCOL: u32 = 5u * NW + NC;
{search_x}{search_c}
// The key of this workgroup's CAND-th largest non-NaN value (radix select,
// 4 bits a round), or 0 if it has fewer.
fn slice_floor(lane: u32, xs: ptr<function, array<f32, E>>) -> u32 {
  if (lane == 0u) { w_prefix = 0u; w_need = CAND; w_few = 0u; }
  for (var r = 0u; r < 8u; r = r + 1u) {
    let shift = 28u - 4u * r;
    let high = ~((16u << shift) - 1u);
    let prefix = workgroupUniformLoad(&w_prefix);
    if (lane < 16u) { atomicStore(&hist[lane], 0u); }
    workgroupBarrier();
    for (var j = 0u; j < E; j = j + 1u) {
      let v = (*xs)[j];
      if (!is_nan(v) && ((key(v) ^ prefix) & high) == 0u) {
        atomicAdd(&hist[(key(v) >> shift) & 15u], 1u);
      }
    }
    workgroupBarrier();
    if (lane == 0u) {
      // The highest digit whose tokens, with those above, reach w_need.
      var above = 0u;
      var digit = 16u;
      for (var d = 16u; d > 0u; d = d - 1u) {
        let h = atomicLoad(&hist[d - 1u]);
        if (digit == 16u) {
          if (above + h >= w_need) { digit = d - 1u; } else { above = above + h; }
        }
      }
      if (digit == 16u) {
        w_few = 1u;
      } else {
        w_need = w_need - above;
        w_prefix = prefix | (digit << shift);
      }
    }
  }
  let floor = workgroupUniformLoad(&w_prefix);
  return select(floor, 0u, workgroupUniformLoad(&w_few) != 0u);
}

@compute @workgroup_size(WG, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let lane = lid.x;
  let w = wid.x;
  let base = ({rows} - 1u) * V;
  var xs: array<f32, E>;
  var bv = nan();
  var bi = 0u;
  for (var j = 0u; j < E; j = j + 1u) {
    let c = w * SL + j * WG + lane;
    // Clamped, so that the loads need no branch and issue back to back.
    let v = select(nan(), x[base + min(c, V - 1u)], c < V);
    xs[j] = v;
    if (beats(v, c, bv, bi)) { bv = v; bi = c; }
  }
  let slice_best = best_of(lane, bv, bi);
  let slice_max = workgroupUniformLoad(&red_f[0]);
  if (lane == 0u) {
    part[P_MAX + w] = slice_max;
    part[P_COL + w] = f32(slice_best);
  }
  let inv_t = 1.0 / sp.temperature;
  let has_k = sp.top_k > 0u && sp.top_k < V;
  if (sp.temperature != 0.0) {
    let floor = slice_floor(lane, &xs);
    var n = 0u;
    for (var j = 0u; j < E; j = j + 1u) {
      if (!is_nan(xs[j]) && key(xs[j]) > floor) { n = n + 1u; }
    }
    // Slots in (lane, j) order: an inclusive scan of the counts.
    red_u[lane] = n;
    workgroupBarrier();
    for (var s = 1u; s < WG; s = s << 1u) {
      var add = 0u;
      if (lane >= s) { add = red_u[lane - s]; }
      workgroupBarrier();
      red_u[lane] = red_u[lane] + add;
      workgroupBarrier();
    }
    var slot = w * CAND + red_u[lane] - n;
    let total = workgroupUniformLoad(&red_u[WG - 1u]);
    for (var j = 0u; j < E; j = j + 1u) {
      if (!is_nan(xs[j]) && key(xs[j]) > floor) {
        part[P_VAL + slot] = xs[j];
        part[P_VCOL + slot] = f32(w * SL + j * WG + lane);
        slot = slot + 1u;
      }
    }
    if (lane == 0u) {
      part[P_COUNT + w] = f32(total);
      // The floor's value (its key inverted), or NaN: no floor.
      let fv = bitcast<f32>(select(floor & 0x7fffffffu, ~floor, (floor & 0x80000000u) == 0u));
      part[P_FLOOR + w] = select(fv, nan(), floor == 0u);
    }
    if (sp.top_p < 1.0 && !has_k) {
      var m = 0.0f;
      if (finite_max(slice_max)) {
        for (var j = 0u; j < E; j = j + 1u) {
          if (!is_nan(xs[j])) { m = m + exp((xs[j] - slice_max) * inv_t); }
        }
      }
      let mass = sum_f(lane, m);
      if (lane == 0u) { part[P_MASS + w] = mass; }
    }
  }
  // Hand-off: the last workgroup to finish combines.
  storageBarrier();
  if (lane == 0u) { w_last = select(0u, 1u, atomicAdd(&count[0], 1u) == NW - 1u); }
  if (workgroupUniformLoad(&w_last) == 0u) { return; }
  storageBarrier();
  if (lane == 0u) { atomicStore(&count[0], 0u); }
  var gv = nan();
  var gi = 0u;
  for (var i = lane; i < NW; i = i + WG) {
    let v = part[P_MAX + i];
    let c = u32(part[P_COL + i]);
    if (beats(v, c, gv, gi)) { gv = v; gi = c; }
  }
  let top = best_of(lane, gv, gi);
  let mx = workgroupUniformLoad(&red_f[0]);
  if (sp.temperature == 0.0 || !finite_max(mx)) {
    // All NaN: column 0, as the CPU's argmax.
    if (lane == 0u) { y[0] = select(top, 0u, is_nan(mx)); }
    return;
  }
  let pos = params.p + params.t - 1u;
  var fl = 0u;
  for (var i = lane; i < NW; i = i + WG) {
    let f = part[P_FLOOR + i];
    if (!is_nan(f)) { fl = max(fl, key(f)); }
  }
  for (var i = lane; i < NC; i = i + WG) {
    var v = nan();
    if (i % CAND < u32(part[P_COUNT + i / CAND])) { v = part[P_VAL + i]; }
    cand[i] = v;
  }
  // Every token with a key above `big_floor` is a candidate.
  let big_floor = max_u(lane, fl);
  var fast = true;
  var keep_from = 0u;
  if (has_k) {
    let th = top_k_c(lane, base);
    if (th > big_floor) { keep_from = th; } else { fast = false; }
  }
  if (fast && sp.top_p < 1.0) {
    var total = 0.0f;
    if (has_k) {
      total = mass_c(lane, base, keep_from, mx, inv_t);
    } else {
      var m = 0.0f;
      for (var i = lane; i < NW; i = i + WG) {
        let smax = part[P_MAX + i];
        if (finite_max(smax)) {
          m = m + part[P_MASS + i] * exp((smax - mx) * inv_t);
        }
      }
      total = sum_f(lane, m);
    }
    let th = top_p_c(lane, base, sp.top_p * total, mx, inv_t);
    if (th > big_floor) { keep_from = max(keep_from, th); } else { fast = false; }
  }
  if (sp.min_p > 0.0) {
    keep_from = max(keep_from, key(mx + sp.temperature * log(sp.min_p)));
  }
  var pick = 0u;
  if (fast && keep_from > big_floor) {
    pick = draw_c(lane, base, keep_from, mx, inv_t, pos);
  } else {
    // The whole row: the searches again, then the draw.
    keep_from = 0u;
    if (has_k) { keep_from = top_k_x(lane, base); }
    if (sp.top_p < 1.0) {
      let goal = sp.top_p * mass_x(lane, base, keep_from, mx, inv_t);
      keep_from = max(keep_from, top_p_x(lane, base, goal, mx, inv_t));
    }
    if (sp.min_p > 0.0) {
      keep_from = max(keep_from, key(mx + sp.temperature * log(sp.min_p)));
    }
    pick = draw_x(lane, base, keep_from, mx, inv_t, pos);
  }
  if (lane == 0u) { y[0] = pick; }
}
"#;

/// The searches over one source of tokens (see [`search`]).
const SEARCH: &str = r#"
// Token `c`'s value, NaN past the end (the index clamped: the load is
// always in range, and four of them issue back to back).
fn load_{S}(base: u32, c: u32) -> f32 {
  let i = min(c, {n} - 1u);
  return select(nan(), {value}, c < {n});
}
// Tokens c, c + WG, c + 2 WG, c + 3 WG.
fn load4_{S}(base: u32, c: u32) -> vec4<f32> {
  return vec4<f32>(load_{S}(base, c), load_{S}(base, c + WG), load_{S}(base, c + 2u * WG),
                   load_{S}(base, c + 3u * WG));
}
// Tokens whose key is at least `th` (NaN never counts).
fn count_{S}(lane: u32, base: u32, th: u32) -> u32 {
  var n = 0u;
  for (var c = lane; c < {n}; c = c + 4u * WG) {
    let v4 = load4_{S}(base, c);
    for (var u = 0u; u < 4u; u = u + 1u) {
      if (!is_nan(v4[u]) && key(v4[u]) >= th) { n = n + 1u; }
    }
  }
  return sum_u(lane, n);
}
// Softmax weight (unnormalized) of the tokens whose key is at least `th`.
fn mass_{S}(lane: u32, base: u32, th: u32, mx: f32, inv_t: f32) -> f32 {
  var m = 0.0f;
  for (var c = lane; c < {n}; c = c + 4u * WG) {
    let v4 = load4_{S}(base, c);
    for (var u = 0u; u < 4u; u = u + 1u) {
      let v = v4[u];
      if (!is_nan(v) && key(v) >= th) { m = m + exp((v - mx) * inv_t); }
    }
  }
  return sum_f(lane, m);
}
// The largest key with at least top_k tokens at or above it.
fn top_k_{S}(lane: u32, base: u32) -> u32 {
  var th = 0u;
  for (var bit = 31i; bit >= 0i; bit = bit - 1i) {
    let cand = th | (1u << u32(bit));
    if (count_{S}(lane, base, cand) >= sp.top_k) { th = cand; }
  }
  return th;
}
// The largest key whose tokens at or above it weigh at least `goal`.
fn top_p_{S}(lane: u32, base: u32, goal: f32, mx: f32, inv_t: f32) -> u32 {
  var th = 0u;
  for (var bit = 31i; bit >= 0i; bit = bit - 1i) {
    let cand = th | (1u << u32(bit));
    if (mass_{S}(lane, base, cand, mx, inv_t) >= goal) { th = cand; }
  }
  return th;
}
// The Gumbel-max draw among the tokens whose key is at least `lo`.
fn draw_{S}(lane: u32, base: u32, lo: u32, mx: f32, inv_t: f32, pos: u32) -> u32 {
  // NaN: no kept token yet; it never wins.
  var sv = nan();
  var si = 0u;
  for (var c = lane; c < {n}; c = c + 4u * WG) {
    let v4 = load4_{S}(base, c);
    for (var u = 0u; u < 4u; u = u + 1u) {
      let v = v4[u];
      if (!is_nan(v) && key(v) >= lo) {
        let i = c + u * WG;
        let id = {column};
        let s = (v - mx) * inv_t + gumbel(pos, id);
        if (beats(s, id, sv, si)) { sv = s; si = id; }
      }
    }
  }
  return best_of(lane, sv, si);
}
"#;

/// The searches over one source of tokens, suffixed `_{suffix}`: `n`
/// tokens, token `i`'s value `value` and column `column` (WGSL expressions
/// of `i` and `base`).
fn search(suffix: &str, n: &str, value: &str, column: &str) -> String {
    SEARCH
        .replace("{S}", suffix)
        .replace("{n}", n)
        .replace("{value}", value)
        .replace("{column}", column)
}

/// Builds the kernel of `shape` for rows of `vocab` logits (at most
/// [`MAX_VOCAB`]), `rows` of them.
pub fn kernel(rows: Rows, vocab: u32, shape: Shape) -> KernelSource {
    let (nw, e) = slices(vocab, shape);
    let nc = nw * CANDIDATES;
    let wg = shape.threads;
    let mut w = prelude();
    let _ = writeln!(
        w,
        "const V: u32 = {vocab}u;\nconst WG: u32 = {wg}u;\nconst WG16: u32 = {wg16}u;\n\
         const NW: u32 = {nw}u;\nconst E: u32 = {e}u;\nconst SL: u32 = {sl}u;\n\
         const CAND: u32 = {CANDIDATES}u;\nconst NC: u32 = {nc}u;",
        wg16 = wg / 16,
        sl = e * wg
    );
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.sampling(&mut w, "sp");
    b.ids_out(&mut w, output(0), "y");
    b.scratch(&mut w, "part", u64::from(5 * nw + 2 * nc) * 4);
    b.counters(&mut w, "count", 1);
    w.push_str(
        &BODY
            .replace("{rows}", &rows.wgsl())
            .replace("{pcg}", &gerbil_plan::sampling::pcg_wgsl())
            .replace("{search_x}", &search("x", "V", "x[base + i]", "i"))
            .replace(
                "{search_c}",
                &search("c", "NC", "cand[i]", "u32(part[P_VCOL + i])"),
            ),
    );
    KernelSource {
        name: format!(
            "sample_token_r{}_v{vocab}{}",
            rows.tag(),
            if shape == Shape::GPU {
                String::new()
            } else {
                format!("_wg{wg}")
            }
        ),
        wgsl: w,
        workgroup_size: [wg, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(nw),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: wg * 8 + 2 * 17 * 4 + 16 * 4 + nc * 4 + 16,
    }
}
