//! `gemv_batch`: the batch-step form of [`matmul`](super::matmul), `y[t, n]
//! = Σ_k x[t, k] · w[n, k] (+ b[n])` over the few rows of a batch step (one
//! per sequence decoding together, [`Phase::Batch`](crate::lower::Phase::Batch)),
//! with every option of [`MatMulSpec`] but `last_row`: bias, gated
//! epilogue, weight row shards, RMSNorm prologue, residual epilogue. The
//! lowering picks it for batch-step matmuls of variants with subgroups,
//! except those a variant with tensor cores runs there instead
//! ([`CoopGemm::choose_batch`](super::gemm_coop::CoopGemm::choose_batch):
//! dense weights wide enough to fill the GPU).
//!
//! It is the decode [`gemv`](super::gemv) with `BR` rows of `x` instead of
//! one: a workgroup's threads form up to [`MAX_GROUPS`] *groups*
//! ([`Layout`]), each computing `R` consecutive outputs for `BR` rows, its
//! threads striding over the chunks of `K`; each thread loads a chunk of its
//! `R` weight rows once (dequantized in registers for a quantized weight,
//! through the GEMM's chunk loaders) and dots it with the same chunk of each
//! of the `BR` rows of `x`, so a weight is read from memory once per step
//! whatever the rows, the way a decode step reads it once per token. `R ·
//! BR` accumulators (twice that gated) live in registers, so `R` shrinks
//! as `BR` grows (at most [`ACCUMULATORS`]). The groups of a workgroup load
//! the same chunks of `x` at the same time, so one read of `x` from L2
//! serves `groups · R` outputs: every workgroup reads all `BR` rows of `x`,
//! and with one group of `R = 2` outputs a 16-row step of the Llama-3.2-1B
//! shape moved 8× more bytes of `x` than of weights, at the L2's rate
//! (2.2–2.7 TB/s on an H200); four groups made it 47% faster (q4_0: 30%). Rows past the step's `T`
//! (`params.t`) are skipped, a block of [`ROW_BLOCK`] at a time, by a
//! branch every thread takes alike, so a step of one row costs little more
//! than a decode step. The partial sums are
//! reduced in passes of as many rows as fit [`REDUCE_BYTES`] of workgroup
//! memory (all 16 at SmolLM2's and the 1B's widths): `subgroupAdd` of each
//! (over a group's lanes by `subgroupShuffleXor` where a subgroup is wider
//! than a group), one slot per subgroup (per group where a subgroup holds
//! several), one barrier, then a thread per (row, output) sums its group's
//! slots and stores — with one row per pass, a barrier pair per row, a
//! 16-row step of the 1B shape waited in barriers more than it multiplied.
//!
//! The surprise is why this is not the prefill [`gemm`](super::gemm): its
//! smallest tile is 32 rows by 64 columns, so a 2048-wide output of a
//! 16-row step ran as 32 workgroups, each walking the whole of `K` on one SM
//! of 132 — a 16-row batch step of the Llama-3.2-1B shape took 28.7 ms on
//! an H200, where 16 decode steps take 17.

use super::gemv::chunk_ops;
use super::gemv::{bind_operands, shard_loader};
use super::linear::{self, elems_per_load, name_parts};
use super::matmul::MatMulSpec;
use super::{prelude, split_groups, KernelSource, Rows};
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// Most accumulators a thread keeps (`R · BR`, gated `2 · R · BR`).
pub const ACCUMULATORS: u32 = 64;
/// Most rows of `x` a workgroup takes: a batch step of more rows runs
/// `ceil(T / MAX_ROWS)` workgroup rows, each reading the weights again.
pub const MAX_ROWS: u32 = 16;
/// Rows of `x` whose chunks a thread loads together: the loads of a block
/// are in flight at once (a branch per row made each wait for the last),
/// and a step of fewer rows multiplies at most this many.
const ROW_BLOCK: u32 = 4;
/// Most threads per workgroup. A thread holds its `R · BR` accumulators,
/// its weight chunks and a block of `x` chunks (over 100 registers), and
/// 128-thread workgroups keep more of them resident than 256-thread ones:
/// H200, Llama-3.2-1B shape, 16-row steps 12.8 ms against 17.3 (SmolLM2's
/// 576-wide rows take 96 threads either way).
const MAX_THREADS: u32 = 128;
/// Workgroups a dispatch aims for: about one and a half per SM of a
/// 132-SM GPU, fewer than the decode GEMV's 528 because each workgroup
/// reads every row of `x` once, so more outputs per workgroup read `x`
/// fewer times. H200, 16-row steps (tok/s, Llama-3.2-1B bf16 / q4_0 /
/// SmolLM2 bf16): 528 and one group 2,079 / 1,698 / 5,223; 264 and up to
/// two groups 2,594 / 1,895 / 5,293; 200 and up to four 3,052 / 2,209 /
/// 5,343; 132 and four 3,002 / 2,172 / 5,081; 66 and four 2,627 / 1,933 /
/// 4,609.
const TARGET_GROUPS: u32 = 200;
/// Most groups of threads in a workgroup: eight groups of 16 threads
/// (target 132) measured as four of 32; 256-thread workgroups of four
/// groups were 30% slower (registers).
const MAX_GROUPS: u32 = 4;
/// Workgroup memory for the reduction's slots (WebGPU's default limit is
/// 16 KiB).
const REDUCE_BYTES: u32 = 12 << 10;
/// WebGPU's smallest subgroup size: bounds the subgroups of a workgroup.
const MIN_SUBGROUP_SIZE: u32 = 4;

/// Rows reduced per pass: as many as keep the pass's slots (`slots` per
/// row for each of `max_subgroups` subgroups) within [`REDUCE_BYTES`].
fn pass_rows(slots: u32, max_subgroups: u32) -> u32 {
    (REDUCE_BYTES / (4 * slots * max_subgroups)).max(1)
}

/// Rows of `x` per workgroup for batch steps of at most `max_rows` rows.
pub fn rows_per_group(max_rows: u32) -> u32 {
    max_rows.clamp(1, MAX_ROWS)
}

/// How a workgroup splits its outputs: `groups` groups of `threads /
/// groups` threads, each group computing `r` consecutive outputs for `br`
/// rows of `x`, its threads striding over the chunks of `K`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Rows of `x` per workgroup ([`rows_per_group`]).
    pub br: u32,
    /// Outputs per group (a power of two).
    pub r: u32,
    /// Groups per workgroup (a power of two; the threads of a group are a
    /// power of two when there are several).
    pub groups: u32,
    /// Threads per workgroup.
    pub threads: u32,
}

impl Layout {
    /// For `s` with `br` rows: threads for the chunks of `K` (at most
    /// [`MAX_THREADS`]); then outputs per group doubling while the
    /// accumulators fit [`ACCUMULATORS`] and [`TARGET_GROUPS`] workgroups
    /// remain; then groups doubling, up to [`MAX_GROUPS`], on the same
    /// condition (a workgroup of several groups has [`MAX_THREADS`]).
    pub fn choose(s: &MatMulSpec, br: u32) -> Layout {
        let kc = s.k / elems_per_load(s.wdtype, s.k);
        let per_output = br * if s.glu.is_some() { 2 } else { 1 };
        let mut r = 1;
        while 2 * r * per_output <= ACCUMULATORS && s.n.div_ceil(2 * r) >= TARGET_GROUPS {
            r *= 2;
        }
        let mut groups = 1;
        while 2 * groups <= MAX_GROUPS && s.n.div_ceil(2 * groups * r) >= TARGET_GROUPS {
            groups *= 2;
        }
        let threads = match groups {
            1 => (kc.div_ceil(32) * 32).clamp(32, MAX_THREADS),
            _ => MAX_THREADS,
        };
        Layout {
            br,
            r,
            groups,
            threads,
        }
    }
}

/// Builds the kernel for `s` (rows `T`, not `last_row`) with `br` rows of
/// `x` per workgroup ([`rows_per_group`]), laid out as [`Layout::choose`]
/// says.
pub fn kernel(s: &MatMulSpec, br: u32) -> KernelSource {
    kernel_with(s, Layout::choose(s, br))
}

/// Builds the kernel for `s` laid out as `l`.
pub fn kernel_with(s: &MatMulSpec, l: Layout) -> KernelSource {
    debug_assert!(s.rows == Rows::Tokens && !s.last_row);
    let Layout {
        br,
        r,
        groups,
        threads,
    } = l;
    // The reduction's slot ranges and shuffles need whole groups of a
    // power of two threads when there are several.
    debug_assert!(
        threads.is_multiple_of(groups)
            && (groups == 1 || (groups.is_power_of_two() && (threads / groups).is_power_of_two())),
        "{l:?}"
    );
    let glu = s.glu.is_some();
    let norm = s.norm.is_some();
    let e = elems_per_load(s.wdtype, s.k);
    let kc = s.k / e;
    let tpg = threads / groups;
    let iters = kc.div_ceil(tpg);
    let outs = r * groups;
    let (gx, gy) = split_groups(s.n.div_ceil(outs));
    // Reduction slots of one row: its R sums, R up sums, Σx².
    let sq_slot = r * if glu { 2 } else { 1 };
    let slots = sq_slot + u32::from(norm);
    let max_subgroups = threads / MIN_SUBGROUP_SIZE;

    let mut w = prelude();
    let _ = writeln!(
        w,
        "const K: u32 = {k}u;\nconst N: u32 = {n}u;\nconst KC: u32 = {kc}u;\n\
         const THREADS: u32 = {threads}u;\nconst TPG: u32 = {tpg}u;\nconst ITERS: u32 = {iters}u;\n\
         const R: u32 = {r}u;\nconst OUTS: u32 = {outs}u;\n\
         const BR: u32 = {br}u;\nconst SLOTS: u32 = {slots}u;\nconst PSLOTS: u32 = {pslots}u;\n\
         const MAX_SUBGROUPS: u32 = {max_subgroups}u;\n\
         const GX: u32 = {gx}u;",
        k = s.k,
        n = s.n,
        pslots = pass_rows(slots, max_subgroups).min(br) * slots,
    );
    let (b, shards) = bind_operands(s, e, &mut w);
    w += &chunk_ops(e, norm);
    shard_loader(&mut w, &shards, e);

    // Accumulators: a{row}_{i}, u{row}_{i} (gated), q{row} (Σx²).
    let mut accs = String::new();
    for row in 0..br {
        for i in 0..r {
            let _ = writeln!(accs, "  var a{row}_{i} = 0.0f;");
            if glu {
                let _ = writeln!(accs, "  var u{row}_{i} = 0.0f;");
            }
        }
        if norm {
            let _ = writeln!(accs, "  var q{row} = 0.0f;");
        }
    }
    // One chunk: the R weight rows' chunks once, then each row of x.
    let mut body = String::new();
    for i in 0..r {
        let _ = writeln!(body, "    let w{i} = wrow(min(n0 + {i}u, N - 1u), c);");
        if glu {
            let _ = writeln!(body, "    let v{i} = wrow(min(n0 + {i}u, N - 1u) + N, c);");
        }
    }
    if norm {
        body += "    let g = cplus(gamma_chunk(c), OFFSET);\n";
    }
    // Rows in blocks of ROW_BLOCK: a block's x chunks load together (rows
    // past T read the last row's), then its products.
    let decl = if norm { "var" } else { "let" };
    for b0 in (0..br).step_by(ROW_BLOCK as usize) {
        let block = b0..(b0 + ROW_BLOCK).min(br);
        let _ = writeln!(body, "    if (t0 + {b0}u < rows) {{");
        for row in block.clone() {
            let _ = writeln!(
                body,
                "      {decl} x{row} = x_chunk(min(t0 + {row}u, rows - 1u) * KC + c);"
            );
        }
        for row in block {
            if norm {
                let _ = writeln!(
                    body,
                    "      q{row} = q{row} + cdot(x{row}, x{row});\n      x{row} = cmul(x{row}, g);"
                );
            }
            for i in 0..r {
                let _ = writeln!(body, "      a{row}_{i} = a{row}_{i} + cdot(w{i}, x{row});");
                if glu {
                    let _ = writeln!(body, "      u{row}_{i} = u{row}_{i} + cdot(v{i}, x{row});");
                }
            }
        }
        body += "    }\n";
    }
    // A constant trip count, so the compiler can unroll the loop; chunks
    // past KC only where TPG does not divide KC.
    let k_loop = if kc.is_multiple_of(tpg) {
        format!("  for (var it = 0u; it < ITERS; it = it + 1u) {{\n    let c = lane + it * TPG;\n{body}  }}\n")
    } else {
        let body = body.replace("\n    ", "\n      ");
        format!(
            "  for (var it = 0u; it < ITERS; it = it + 1u) {{\n    let c = lane + it * TPG;\n    if (c < KC) {{\n  {body}    }}\n  }}\n"
        )
    };

    // The reduction, in passes of PR rows: every row's partial sums of the
    // pass through subgroupAdd into workgroup memory, one barrier, then a
    // thread per (row, output) adds the subgroups' slots and stores.
    let pr = pass_rows(slots, max_subgroups).min(br);
    let scale = if norm { " * inv" } else { "" };
    let mut reduce = String::new();
    for p0 in (0..br).step_by(pr as usize) {
        let _ = writeln!(reduce, "  if (t0 + {p0}u < rows) {{");
        for row in p0..(p0 + pr).min(br) {
            let mut parts: Vec<(u32, String)> =
                (0..r).map(|i| (i, format!("a{row}_{i}"))).collect();
            if glu {
                parts.extend((0..r).map(|i| (r + i, format!("u{row}_{i}"))));
            }
            if norm {
                parts.push((sq_slot, format!("q{row}")));
            }
            let at = (row - p0) * slots;
            let _ = writeln!(reduce, "    if (t0 + {row}u < rows) {{");
            for (slot, v) in &parts {
                let _ = writeln!(reduce, "      let s{slot} = seg_sum({v}, sg_size);");
            }
            reduce += "      if (lin % seg == 0u && lin / seg < MAX_SUBGROUPS) {\n";
            for (slot, _) in &parts {
                let _ = writeln!(
                    reduce,
                    "        red[(lin / seg) * PSLOTS + {}u] = s{slot};",
                    at + slot
                );
            }
            reduce += "      }\n    }\n";
        }
        let _ = writeln!(
            reduce,
            "    workgroupBarrier();\n    \
             for (var o = tid; o < {outs}u; o = o + THREADS) {{\n      \
             let lr = o / OUTS;\n      let i = o % R;\n      let g = (o % OUTS) / R;\n      \
             let t = t0 + {p0}u + lr;\n      \
             let n = wbase + o % OUTS;\n      let at = lr * SLOTS;\n      \
             if (t < rows && n < N) {{\n        var sum = 0.0f;",
            outs = (pr.min(br - p0)) * outs,
        );
        let mut adds = "          sum = sum + red[j * PSLOTS + at + i];\n".to_string();
        if glu {
            reduce += "        var upsum = 0.0f;\n";
            adds += "          upsum = upsum + red[j * PSLOTS + at + R + i];\n";
        }
        if norm {
            reduce += "        var sq = 0.0f;\n";
            let _ = writeln!(
                adds,
                "          sq = sq + red[j * PSLOTS + at + {sq_slot}u];"
            );
        }
        let _ = writeln!(
            reduce,
            "        let per = (TPG + seg - 1u) / seg;\n        \
             for (var j = g * per; j < min((g + 1u) * per, MAX_SUBGROUPS); j = j + 1u) {{\n{adds}        }}"
        );
        if norm {
            reduce += "        let inv = 1.0f / sqrt(sq / f32(K) + EPS);\n";
        }
        let _ = writeln!(
            reduce,
            "        {}\n      }}\n    }}\n    workgroupBarrier();\n  }}",
            linear::store(s, "t", &format!("sum{scale}"), &format!("upsum{scale}"))
        );
    }

    // A group's partial sums: the whole subgroup's when the workgroup is
    // one group (any subgroup size) or a subgroup is no wider than a group;
    // else (a subgroup holding several groups) over its group's lanes.
    let seg_sum = if groups == 1 {
        "fn seg_sum(v: f32, sg_size: u32) -> f32 { return subgroupAdd(v); }\n".to_string()
    } else {
        super::gemv::seg_sum("TPG")
    };
    // One group: a segment per subgroup. Several: a segment is a subgroup
    // or a group, whichever is smaller.
    let seg = if groups == 1 {
        "sg_size"
    } else {
        "min(sg_size, TPG)"
    };
    let _ = write!(
        w,
        "var<workgroup> red: array<f32, {red_len}>;\n{seg_sum}\
         @compute @workgroup_size({threads}, 1, 1)\n\
         fn main(@builtin(local_invocation_index) tid: u32,\n        \
         @builtin(workgroup_id) wid: vec3<u32>,\n        \
         @builtin(subgroup_invocation_id) sg_lane: u32,\n        \
         @builtin(subgroup_id) sg_id: u32,\n        \
         @builtin(subgroup_size) sg_size: u32) {{\n\
         \x20 let lin = sg_id * sg_size + sg_lane;\n\
         \x20 let lane = lin % TPG;\n\
         \x20 let seg = {seg};\n\
         \x20 let wbase = (wid.x + wid.y * GX) * OUTS;\n\
         \x20 let n0 = wbase + (lin / TPG) * R;\n\
         \x20 let t0 = wid.z * BR;\n\
         \x20 let rows = params.t;\n{accs}{k_loop}{reduce}}}\n",
        red_len = pr * slots * max_subgroups,
    );
    let (glu_tag, options) = name_parts(s, shards.len());
    KernelSource {
        name: format!(
            "gemv_batch{glu_tag}_{}_k{}_n{}{options}_br{br}{}",
            s.wdtype,
            s.k,
            s.n,
            if groups > 1 {
                format!("_g{groups}x{tpg}")
            } else {
                String::new()
            }
        ),
        wgsl: w,
        workgroup_size: [threads, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(gx),
            WorkgroupCount::fixed(gy),
            s.rows.count(1, br),
        ],
        workgroup_bytes: pr * slots * max_subgroups * 4,
    }
}
