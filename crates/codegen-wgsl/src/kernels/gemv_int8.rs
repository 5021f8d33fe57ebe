//! `gemv_int8`: the decode GEMV of a block-quantized weight with int8 dot
//! products ([`Dots::Int8`](super::gemv::Dots)), every option of
//! [`MatMulSpec`] as in [`gemv`](super::gemv). [`kernel`] builds it;
//! `gemv::kernel` hands int8 specs here.
//!
//! The workgroup first quantizes its row of `x` (norm weight applied, `Σx²`
//! summed) into workgroup memory, each 32-value unit once — eight packed
//! words and its scale — in stages of at most [`STAGE_BYTES`]: eight
//! threads a unit, each loading one `vec4` (neighbouring threads read
//! neighbouring memory) and quantizing it, the unit's largest magnitude met
//! through the unit's quant words before the quants overwrite them (three
//! barriers). On an H200 that made decode 5–10% faster than one thread
//! loading and quantizing each unit (Llama-3.2-1B shape at q4_0: about
//! 1,090 → 1,145 tok/s). In a kernel of one stage whose threads' weight
//! words fit [`PREFETCH_WORDS`] registers, the weights are loaded before the
//! staging, so the loads of `x` and of the weights are in flight together
//! (the same GPU: 1B q4_0 → 1,230 tok/s, SmolLM2 q4_0 +3.5%; Q4_K rows of the
//! 8B shape do not fit and are unchanged). Then it splits into `G` *row
//! groups* of `TPR` threads, each group computing `R` outputs, its threads
//! striding over the units and dotting each with the group's `R` weight rows
//! (`quant::int_dot_decoder`). A unit of `x` is thus quantized once per
//! workgroup and read from workgroup memory `G·R` times, where the plain
//! GEMV's threads quantized their own units for `R` rows each (`down_proj`
//! of Llama-3.2-1B: two).
//!
//! The surprise is the reduction: a row group's threads are told apart by
//! their subgroup, not their index — thread `sg_id · S + sg_lane` (`S` the
//! subgroup size) — so a group of `TPR ≥ S` threads is whole subgroups
//! (`subgroupAdd`, then one slot per subgroup), and a subgroup wider than a
//! group (`S > TPR`: few units a row, or a 64-wide subgroup) reduces each
//! group within itself by `subgroupShuffleXor` over `TPR` lanes. Both leave
//! one partial sum per *segment* of `min(S, TPR)` threads in workgroup
//! memory; the output threads add their group's segments.

use super::gemv::{accumulators, bind_quantized, partial_sums};
use super::linear::{self, name_parts};
use super::matmul::MatMulSpec;
use super::{prelude, quant, split_groups, KernelSource};
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// Workgroup memory for the staged units of `x` (36 bytes a unit): with the
/// reduction slots, within WebGPU's default 16 KiB.
const STAGE_BYTES: u32 = 10 << 10;
/// Bytes of workgroup memory one staged unit takes.
const UNIT_BYTES: u32 = 36;
/// WebGPU's smallest subgroup size: bounds the segments of a workgroup.
const MIN_SUBGROUP_SIZE: u32 = 4;
/// Threads per workgroup.
const THREADS: u32 = 256;
/// Most threads of a row group: one unit each on a 2048-wide row.
const MAX_TPR: u32 = 64;
/// Workgroups a dispatch aims for: two per SM of a 132-SM GPU. Measured on
/// an H200 (Llama-3.2-1B shape, q4_0 decode): 1,091 tok/s at 264, 979 at
/// 528, 955 at 132; outputs per workgroup double while at least this many
/// workgroups remain.
const TARGET_GROUPS: u32 = 264;
/// Most weight rows a thread dots per unit (gate and up rows count twice).
const MAX_ROW_LOADS: u32 = 16;
/// Most 32-bit words of weights a thread loads before the staging of `x`
/// (all its units' words for all its rows, in a kernel of one stage).
const PREFETCH_WORDS: u32 = 64;

/// How the workgroup is laid out: `groups` row groups of `tpr` threads,
/// `rows` outputs each, `units` staged units per stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    tpr: u32,
    groups: u32,
    rows: u32,
    units: u32,
    stages: u32,
}

impl Layout {
    fn choose(s: &MatMulSpec) -> Layout {
        let kc = s.k / 32;
        let stages = kc.div_ceil(STAGE_BYTES / UNIT_BYTES);
        let units = kc.div_ceil(stages);
        let tpr = units.next_power_of_two().min(MAX_TPR);
        let groups = THREADS / tpr;
        let per_row = if s.glu.is_some() { 2 } else { 1 };
        let mut rows = 1;
        while 2 * rows * per_row <= MAX_ROW_LOADS
            && s.n.div_ceil(2 * rows * groups) >= TARGET_GROUPS
        {
            rows *= 2;
        }
        Layout {
            tpr,
            groups,
            rows,
            units,
            stages,
        }
    }
}

/// Builds the kernel (`s.tt` is ignored: one row of `x` per workgroup row).
pub fn kernel(s: &MatMulSpec) -> KernelSource {
    let l = Layout::choose(s);
    let kc = s.k / 32;
    let threads = THREADS;
    let outputs = l.groups * l.rows;
    let (gx, gy) = split_groups(s.n.div_ceil(outputs));
    let glu = s.glu.is_some();
    let norm = s.norm.is_some();
    let r = l.rows;
    let sq_slot = r * if glu { 2 } else { 1 };
    let slots = sq_slot + u32::from(norm);
    // One slot set per segment: at most a subgroup or a row group of threads.
    let red_len = slots * threads / l.tpr.min(MIN_SUBGROUP_SIZE);

    let mut w = prelude();
    let _ = writeln!(
        w,
        "const K: u32 = {k}u;\nconst N: u32 = {n}u;\nconst KC: u32 = {kc}u;\n\
         const THREADS: u32 = {threads}u;\nconst TPR: u32 = {tpr}u;\nconst R: u32 = {r}u;\n\
         const OUTPUTS: u32 = {outputs}u;\nconst SLOTS: u32 = {slots}u;\nconst KT: u32 = {kt}u;\n\
         const GX: u32 = {gx}u;",
        k = s.k,
        n = s.n,
        tpr = l.tpr,
        kt = l.units,
    );
    let (b, shards) = bind_quantized(
        s,
        norm,
        super::gemv::UnitRead::Dot(super::gemv::Dots::Int8),
        &mut w,
    );
    let xt = if s.last_row { "(params.t - 1u)" } else { "t" };

    // Stage: eight threads a unit, thread `v = tid + i·THREADS` of pass `i`
    // loading and quantizing values `4(v % 8) ..+ 4` of unit `v / 8`
    // (neighbouring threads read neighbouring vec4s of `x`); the unit's
    // largest magnitude meets in the unit's quant words, which the quants
    // overwrite after a barrier. The words are scalars: threads writing
    // components of one `vec4` at once would race.
    let in_stage = |j: &str| {
        if kc.is_multiple_of(l.units) {
            format!("{j} < KT")
        } else {
            format!("{j} < KT && base + {j} < KC")
        }
    };
    let passes = (8 * l.units).div_ceil(threads);
    let slot = |i: u32| format!("xs_q[8u * j{i} + p]");
    let mut stage = "    let p = tid % 8u;\n".to_string();
    for i in 0..passes {
        let _ = write!(
            stage,
            "    let j{i} = (tid + {i}u * THREADS) / 8u;\n    \
             var xv{i} = vec4<f32>(0.0f);\n    if ({}) {{\n      \
             xv{i} = x[({xt} * KC + base + j{i}) * 8u + p];\n",
            in_stage(&format!("j{i}"))
        );
        if norm {
            let _ = write!(
                stage,
                "      ssq = ssq + dot(xv{i}, xv{i});\n      \
                 xv{i} = xv{i} * (gamma4_chunk((base + j{i}) * 8u + p) + vec4<f32>(OFFSET));\n"
            );
        }
        let _ = write!(
            stage,
            "      let m{i} = abs(xv{i});\n      \
             {} = bitcast<u32>(max(max(m{i}.x, m{i}.y), max(m{i}.z, m{i}.w)));\n    }}\n",
            slot(i)
        );
    }
    stage += "    workgroupBarrier();\n";
    for i in 0..passes {
        let _ = write!(
            stage,
            "    var q{i} = 0u;\n    if ({}) {{\n      \
             let ma{i} = max(bitcast<vec4<f32>>(x_words(j{i}, 0u)), bitcast<vec4<f32>>(x_words(j{i}, 4u)));\n      \
             let amax{i} = max(max(ma{i}.x, ma{i}.y), max(ma{i}.z, ma{i}.w));\n      \
             let d{i} = amax{i} / 127.0f;\n      \
             q{i} = pack4xI8(vec4<i32>(round(xv{i} * select(0.0f, 1.0f / d{i}, amax{i} > 0.0f))));\n      \
             if (p == 0u) {{ xs_d[j{i}] = d{i}; }}\n    }}\n",
            in_stage(&format!("j{i}"))
        );
    }
    stage += "    workgroupBarrier();\n";
    for i in 0..passes {
        let _ = writeln!(
            stage,
            "    if ({}) {{ {} = q{i}; }}",
            in_stage(&format!("j{i}")),
            slot(i)
        );
    }
    stage += "    workgroupBarrier();\n";
    // Dots: lane `lane` of its row group over this stage's units, with the
    // weights' words loaded before the staging when they fit `PREFETCH_WORDS`.
    let iters = l.units.div_ceil(l.tpr);
    let per_row = if glu { 2 } else { 1 };
    let prefetch =
        l.stages == 1 && iters * r * per_row * quant::qw_words(s.wdtype) <= PREFETCH_WORDS;
    let rows: Vec<(String, String)> = (0..r)
        .flat_map(|i| {
            let mut v = vec![(format!("acc[{i}]"), format!("row{i}"))];
            if glu {
                v.push((format!("up[{i}]"), format!("row{i} + N")));
            }
            v
        })
        .collect();
    if prefetch {
        let mut loads = String::new();
        for it in 0..iters {
            let _ = writeln!(loads, "    let wj{it} = min(lane + {it}u * TPR, KC - 1u);");
            for (k, (_, row)) in rows.iter().enumerate() {
                let _ = writeln!(loads, "    let w{it}_{k} = wload({row}, wj{it});");
            }
        }
        stage = loads + &stage;
        for it in 0..iters {
            let _ = writeln!(
                stage,
                "    {{\n      let j = lane + {it}u * TPR;\n      if ({}) {{\n        let xq = x_staged(j);",
                in_stage("j")
            );
            for (k, (acc, _)) in rows.iter().enumerate() {
                let _ = writeln!(stage, "        {acc} = {acc} + q_idot(w{it}_{k}, xq);");
            }
            stage += "      }\n    }\n";
        }
    } else {
        let _ = write!(
            stage,
            "    for (var i = 0u; i < {iters}u; i = i + 1u) {{\n      let j = lane + i * TPR;\n      \
             if ({}) {{\n        let c = base + j;\n        let xq = x_staged(j);\n",
            in_stage("j"),
        );
        for (acc, row) in &rows {
            let _ = writeln!(
                stage,
                "        {acc} = {acc} + q_idot(wload({row}, c), xq);"
            );
        }
        stage += "      }\n    }\n";
    }
    if l.stages > 1 {
        stage += "    workgroupBarrier();\n";
    }

    let parts = partial_sums(r, glu, norm);
    let mut reduce = "  let seg = min(sg_size, TPR);\n".to_string();
    for (slot, v) in &parts {
        let _ = writeln!(reduce, "  let s{slot} = seg_sum({v}, sg_size);");
    }
    reduce += "  if (lin % seg == 0u) {\n";
    for (slot, _) in &parts {
        let _ = writeln!(reduce, "    red[(lin / seg) * SLOTS + {slot}u] = s{slot};");
    }
    reduce += "  }\n  workgroupBarrier();\n";

    let mut total = "    let g = tid / R;\n    let i = tid % R;\n    let per = TPR / seg;\n    \
                     var sum = 0.0f;\n"
        .to_string();
    let mut adds = "      sum = sum + red[j * SLOTS + i];\n".to_string();
    if glu {
        total += "    var upsum = 0.0f;\n";
        adds += "      upsum = upsum + red[j * SLOTS + R + i];\n";
    }
    let _ = write!(
        total,
        "    for (var j = g * per; j < (g + 1u) * per; j = j + 1u) {{\n{adds}    }}\n"
    );
    if norm {
        let _ = write!(
            total,
            "    var sq = 0.0f;\n    for (var j = 0u; j < THREADS / seg; j = j + 1u) {{\n      \
             sq = sq + red[j * SLOTS + {sq_slot}u];\n    }}\n    \
             let inv = 1.0f / sqrt(sq / f32(K) + EPS);\n"
        );
    }
    let scale = if norm { " * inv" } else { "" };
    let _ = writeln!(
        total,
        "    let n = wbase + tid;\n    if (n < N) {{\n      {}\n    }}",
        linear::store(s, "t", &format!("sum{scale}"), &format!("upsum{scale}"))
    );

    let mut accs = accumulators(glu, norm);
    for i in 0..r {
        let _ = writeln!(accs, "  let row{i} = min(n0 + {i}u, N - 1u);");
    }
    let _ = write!(
        w,
        "var<workgroup> xs_q: array<u32, {q_len}>;\n\
         var<workgroup> xs_d: array<f32, {kt}>;\n\
         var<workgroup> red: array<f32, {red_len}>;\n\
         fn x_words(j: u32, k: u32) -> vec4<u32> {{\n  \
         let i = 8u * j + k;\n  return vec4<u32>(xs_q[i], xs_q[i + 1u], xs_q[i + 2u], xs_q[i + 3u]);\n}}\n\
         fn x_staged(j: u32) -> QX {{\n  let a = x_words(j, 0u);\n  let b = x_words(j, 4u);\n  \
         var r: QX;\n  \
         r.q = array<u32, 8>(a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);\n  r.d = xs_d[j];\n  \
         let ones = 0x01010101u;\n  \
         r.lo = dot4I8Packed(a.x, ones) + dot4I8Packed(a.y, ones) + dot4I8Packed(a.z, ones) + dot4I8Packed(a.w, ones);\n  \
         r.hi = dot4I8Packed(b.x, ones) + dot4I8Packed(b.y, ones) + dot4I8Packed(b.z, ones) + dot4I8Packed(b.w, ones);\n  \
         r.sx = r.d * f32(r.lo + r.hi);\n  return r;\n}}\n\
         {seg_sum}\
         @compute @workgroup_size({threads}, 1, 1)\n\
         fn main(@builtin(local_invocation_index) tid: u32,\n        \
         @builtin(workgroup_id) wid: vec3<u32>,\n        \
         @builtin(subgroup_invocation_id) sg_lane: u32,\n        \
         @builtin(subgroup_id) sg_id: u32,\n        \
         @builtin(subgroup_size) sg_size: u32) {{\n\
         \x20 let wbase = (wid.x + wid.y * GX) * OUTPUTS;\n\
         \x20 let lin = sg_id * sg_size + sg_lane;\n\
         \x20 let lane = lin % TPR;\n\
         \x20 let n0 = wbase + (lin / TPR) * R;\n\
         \x20 let t = wid.z;\n{accs}\
         \x20 for (var stage = 0u; stage < {stages}u; stage = stage + 1u) {{\n\
         \x20   let base = stage * KT;\n{stage}  }}\n\
         {reduce}\
         \x20 if (tid < OUTPUTS) {{\n{total}  }}\n}}\n",
        q_len = 8 * l.units,
        seg_sum = super::gemv::seg_sum("TPR"),
        kt = l.units,
        stages = l.stages,
    );
    let (glu_tag, options) = name_parts(s, shards.len());
    KernelSource {
        name: format!(
            "gemv{glu_tag}_{}_i8_r{}_k{}_n{}{options}_g{}x{}x{}",
            s.wdtype,
            s.rows.tag(),
            s.k,
            s.n,
            l.groups,
            l.tpr,
            l.rows
        ),
        wgsl: w,
        workgroup_size: [threads, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(gx),
            WorkgroupCount::fixed(gy),
            s.rows.count(1, 1),
        ],
        workgroup_bytes: l.units * UNIT_BYTES + red_len * 4,
    }
}
