//! `gemv`: the decode form of [`matmul`](super::matmul), `y[t, n] = Σ_k
//! x[t, k] · w[n, k] (+ b[n])` with one workgroup row per row of `x` (one in
//! decode), and every option of [`MatMulSpec`]: bias, gated epilogue, weight
//! row shards, RMSNorm prologue, residual epilogue, last-row read (row `T − 1`
//! of `x` for the one output row). [`kernel`] builds it with
//! a [`Reduce`] strategy; the lowering picks it for decode steps.
//!
//! Each row of `x` and `w` is cut into chunks of `E` elements, one wide load
//! each: 8 packed bf16/f16 (`vec4<u32>`) or 4 f32 (`vec4<f32>`) where `K`
//! allows, else 4 or 2 packed values, else 1. A workgroup computes `R`
//! consecutive outputs: its threads stride over the chunks, and each thread
//! loads its chunk of `x` once and the same chunk of all `R` weight rows, so
//! `R` independent loads are in flight per thread and `x` is reused `R`
//! times. `R` is the largest power of two that still leaves enough
//! workgroups to fill a large GPU ([`TARGET_GROUPS`]), so even a 576-wide
//! output spreads over every SM without split-K or a second dispatch. The
//! partial sums are then reduced across the workgroup: by `subgroupAdd` and
//! one workgroup-memory slot per subgroup ([`Reduce::Subgroup`], any subgroup
//! size), or in two levels through workgroup memory ([`Reduce::Workgroup`]:
//! two barriers, where a tree takes one per halving — on a CPU driver such
//! as lavapipe every barrier switches each invocation, and a decode step of
//! SmolLM2 spent most of its time in them).
//!
//! The surprise: a chunk of 8 packed 16-bit values decodes into a
//! `mat2x4<f32>` of its even and its odd elements (one shift or mask per
//! word), so `x` and the norm weight are loaded in that same permuted order;
//! the dot product does not mind.

use super::linear::{
    self, bind_after_weight, bind_weight, chunk_binding, chunk_type, elems_per_load, name_parts,
    row_loader, weight_shards, Operand, Shard, WeightRead,
};
use super::matmul::MatMulSpec;
use super::{input, input_shard, prelude, quant, split_groups, Bindings, KernelSource};
use gerbil_ir::DType;
use std::fmt::Write;

/// How a workgroup reduces its threads' partial sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// `subgroupAdd`, then one slot per subgroup in workgroup memory: needs
    /// the `subgroups` feature; works with any subgroup size.
    Subgroup,
    /// Two levels in workgroup memory (16 partial sums per output, then
    /// their total; two barriers): runs everywhere.
    Workgroup,
}

/// How a quantized weight's units are dotted with `x` (dense weights ignore it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dots {
    /// In f32: each value dequantized in registers (exact against
    /// transformers; the f32 variants).
    Float,
    /// In integers: `x` quantized to int8 per 32 values, four products an
    /// instruction ([`quant::int_dot_decoder`]; the f16 variants).
    Int8,
}

/// Workgroups a dispatch aims for: four per SM of a 132-SM GPU (on the
/// H100, 4 beat 2 by 2–5% on the Llama-3.2-1B shapes). Outputs per workgroup
/// double only while at least this many workgroups remain.
pub const TARGET_GROUPS: u32 = 528;
/// Most weight rows a thread loads per chunk (gate and up rows count twice).
const MAX_ROW_LOADS: u32 = 16;
/// Workgroup memory every adapter offers (WebGPU's default), in f32s.
const WORKGROUP_FLOATS: u32 = 4096;
/// WebGPU's smallest subgroup size: bounds the subgroups of a workgroup.
const MIN_SUBGROUP_SIZE: u32 = 4;

/// `cdot` (dot product of two chunks) and, with a norm, `cmul`
/// (elementwise product) and `cplus` (plus a scalar).
pub(super) fn chunk_ops(e: u32, norm: bool) -> String {
    let c = chunk_type(e);
    let (dot, mul, plus) = match e {
        1 => ("a * b", "a * b", "a + s"),
        8 => (
            "dot(a[0], b[0]) + dot(a[1], b[1])",
            "mat2x4<f32>(a[0] * b[0], a[1] * b[1])",
            "mat2x4<f32>(a[0] + vec4<f32>(s), a[1] + vec4<f32>(s))",
        ),
        _ => ("dot(a, b)", "a * b", "a + s"),
    };
    let mut s = format!("fn cdot(a: {c}, b: {c}) -> f32 {{ return {dot}; }}\n");
    if norm {
        let _ = write!(
            s,
            "fn cmul(a: {c}, b: {c}) -> {c} {{ return {mul}; }}\n\
             fn cplus(a: {c}, s: f32) -> {c} {{ return {plus}; }}\n"
        );
    }
    s
}

/// Outputs per workgroup: the largest power of two that leaves at least
/// [`TARGET_GROUPS`] workgroups, keeps a thread's loads per chunk within
/// [`MAX_ROW_LOADS`] and (workgroup reduction) the reduction slots and partials within
/// [`WORKGROUP_FLOATS`].
fn outputs_per_group(s: &MatMulSpec, threads: u32, reduce: Reduce) -> u32 {
    let rows_per_output = if s.glu.is_some() { 2 } else { 1 };
    let fits = |r: u32| {
        let slots = r * rows_per_output + u32::from(s.norm.is_some());
        r * rows_per_output <= MAX_ROW_LOADS
            && (reduce == Reduce::Subgroup || slots * (threads + 16) <= WORKGROUP_FLOATS)
    };
    let mut r = 1;
    while fits(2 * r) && s.n.div_ceil(2 * r) >= TARGET_GROUPS {
        r *= 2;
    }
    r
}

/// `fn seg_sum(v, sg_size)`: the sum of `v` over a segment of `width`
/// (a power-of-two module constant) threads — the whole subgroup's where a
/// subgroup is no wider, else by `subgroupShuffleXor` over the segment's
/// lanes. Shared by [`gemv_int8`](super::gemv_int8) (its row groups) and
/// [`gemv_batch`](super::gemv_batch) (its groups).
pub(super) fn seg_sum(width: &str) -> String {
    format!(
        "fn seg_sum(v: f32, sg_size: u32) -> f32 {{\n  if (sg_size <= {width}) {{ return subgroupAdd(v); }}\n  \
         var s = v;\n  for (var o = {width} / 2u; o > 0u; o = o >> 1u) {{ s = s + subgroupShuffleXor(s, o); }}\n  \
         return s;\n}}\n"
    )
}

/// Every partial sum a GEMV thread reduces, as (reduction slot,
/// WGSL expression): its `r` sums, with a gated epilogue its `r` up sums,
/// with a norm prologue its `Σx²` (the last slot); shared with
/// [`gemv_int8`](super::gemv_int8).
pub(super) fn partial_sums(r: u32, glu: bool, norm: bool) -> Vec<(u32, String)> {
    let mut parts: Vec<(u32, String)> = (0..r).map(|i| (i, format!("acc[{i}]"))).collect();
    if glu {
        parts.extend((0..r).map(|i| (r + i, format!("up[{i}]"))));
    }
    if norm {
        parts.push((parts.len() as u32, "ssq".to_string()));
    }
    parts
}

/// The declarations of [`partial_sums`]' variables (`R` a module constant).
pub(super) fn accumulators(glu: bool, norm: bool) -> String {
    let mut s = "  var acc: array<f32, R>;\n".to_string();
    if glu {
        s += "  var up: array<f32, R>;\n";
    }
    if norm {
        s += "  var ssq = 0.0f;\n";
    }
    s
}

/// Declares the operands of a matmul read in chunks of `e` elements (also
/// the [`gemm`](super::gemm) template's): `x` with its `x_chunk` loader, the
/// weight ([`bind_weight`]), then what [`bind_after_weight`] binds, the norm
/// weight `gamma` with a `gamma_chunk` loader. Returns the bindings and the
/// weight's shards.
pub(super) fn bind_operands(s: &MatMulSpec, e: u32, w: &mut String) -> (Bindings, Vec<Shard>) {
    let mut b = Bindings::new();
    chunk_binding(&mut b, w, input(0), "x", DType::F32, e, Operand::Activation);
    let shards = bind_weight(s, &mut b, w, WeightRead::Chunks(e));
    bind_after_weight(s, &mut b, w, |b, w, port, gdtype| {
        chunk_binding(b, w, port, "gamma", gdtype, e, Operand::Weight(s.k.into()))
    });
    (b, shards)
}

/// `fn wrow(row: u32, i: u32)`: chunk `i` of weight row `row`, from the
/// shard that holds it (a module constant `KC` is the chunks per row).
pub(super) fn shard_loader(w: &mut String, shards: &[Shard], e: u32) {
    row_loader(w, "wrow", "", chunk_type(e), shards, |shard, local| {
        format!("{}_chunk({local} * KC + i)", shard.name)
    });
}

/// How [`bind_quantized`] reads a quantized weight's 32-value units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum UnitRead {
    /// Dotted with `x` as [`Dots`] says: `fn wdot(row, i, x)` ([`Dots::Float`])
    /// or `fn wload(row, i)` ([`Dots::Int8`]).
    Dot(Dots),
    /// Dequantized whole: `fn wunit(row, i)` (a [`quant::UNIT`]), for
    /// tiles that dot a unit with several rows of `x`.
    Values,
}

/// [`bind_operands`] of a quantized weight, read in 32-value units: `x`
/// and the norm weight as [`quant::UNIT`]s (`x_chunk`, `gamma_chunk`), the
/// weight's shards with their decoders, and `cdot`, `cmul`, `cplus` over
/// units (except for [`Dots::Int8`], whose kernel stages `x` itself); then
/// the reader `read` names (e.g. `fn wdot(row, i, x)`: the dot product of
/// unit `i` of weight row `row` with `x`), from the shard that holds the row.
pub(super) fn bind_quantized(
    s: &MatMulSpec,
    norm: bool,
    read: UnitRead,
    w: &mut String,
) -> (Bindings, Vec<Shard>) {
    let unit = quant::UNIT;
    // `gemv_int8` stages `x` in vec4s itself: no unit helpers.
    let unit_helpers = read != UnitRead::Dot(Dots::Int8);
    let mut b = Bindings::new();
    b.vectors(w, input(0), "x", DType::F32, true, "vec4<f32>");
    if unit_helpers {
        let loads: Vec<String> = (0..8).map(|k| format!("x[8u * i + {k}u]")).collect();
        let _ = writeln!(
            w,
            "fn x_chunk(i: u32) -> {unit} {{ return {unit}({}); }}",
            loads.join(", ")
        );
    }
    let shards = weight_shards(s);
    for (i, shard) in shards.iter().enumerate() {
        let values = u64::from(shard.rows) * u64::from(s.k);
        quant::declare(
            &mut b,
            w,
            input_shard(1, i as u32),
            &shard.name,
            s.wdtype,
            values,
        );
        match read {
            UnitRead::Dot(Dots::Float) => quant::dot_decoder(w, &shard.name, s.wdtype, values),
            UnitRead::Dot(Dots::Int8) => quant::int_dot_decoder(w, &shard.name, s.wdtype, values),
            UnitRead::Values => quant::unit_decoder(w, &shard.name, s.wdtype, values),
        }
    }
    bind_after_weight(s, &mut b, w, |b, w, port, gdtype| {
        chunk_binding(b, w, port, "gamma4", gdtype, 4, Operand::Weight(s.k.into()));
        if unit_helpers {
            let loads: Vec<String> = (0..8)
                .map(|k| format!("gamma4_chunk(8u * i + {k}u)"))
                .collect();
            let _ = writeln!(
                w,
                "fn gamma_chunk(i: u32) -> {unit} {{ return {unit}({}); }}",
                loads.join(", ")
            );
        }
    });
    if unit_helpers {
        let _ = writeln!(
            w,
            "fn cdot(a: {unit}, b: {unit}) -> f32 {{
  return dot(a[0], b[0]) + dot(a[1], b[1]) + dot(a[2], b[2]) + dot(a[3], b[3])
             + dot(a[4], b[4]) + dot(a[5], b[5]) + dot(a[6], b[6]) + dot(a[7], b[7]);
}}"
        );
    }
    if norm && unit_helpers {
        let mul: Vec<String> = (0..8).map(|k| format!("a[{k}] * b[{k}]")).collect();
        let plus: Vec<String> = (0..8).map(|k| format!("a[{k}] + vec4<f32>(s)")).collect();
        let _ = writeln!(
            w,
            "fn cmul(a: {unit}, b: {unit}) -> {unit} {{ return {unit}({}); }}
             fn cplus(a: {unit}, s: f32) -> {unit} {{ return {unit}({}); }}",
            mul.join(", "),
            plus.join(", ")
        );
    }
    match read {
        UnitRead::Dot(Dots::Float) => row_loader(
            w,
            "wdot",
            &format!(", x: {unit}"),
            "f32",
            &shards,
            |shard, local| format!("{}_qdot({local} * KC + i, x)", shard.name),
        ),
        UnitRead::Dot(Dots::Int8) => row_loader(w, "wload", "", "QW", &shards, |shard, local| {
            format!("{}_iload({local} * KC + i)", shard.name)
        }),
        UnitRead::Values => row_loader(w, "wunit", "", unit, &shards, |shard, local| {
            format!("{}_unit({local} * KC + i)", shard.name)
        }),
    }
    (b, shards)
}

/// Builds the kernel (`s.tt` is ignored: one row of `x` per workgroup row).
/// A quantized weight is read a 32-value unit at a time and dotted with
/// `x` block by block as `dots` says ([`quant::dot_decoder`]: one
/// multiply-add per value; [`quant::int_dot_decoder`]: `x` quantized to
/// int8 once per unit, four products an instruction), the scales applied
/// once per block.
pub fn kernel(s: &MatMulSpec, reduce: Reduce, dots: Dots) -> KernelSource {
    let quantized = s.wdtype.is_quantized();
    if quantized && dots == Dots::Int8 {
        return super::gemv_int8::kernel(s);
    }
    let e = if quantized {
        32
    } else {
        elems_per_load(s.wdtype, s.k)
    };
    let kc = s.k / e;
    let threads = match reduce {
        Reduce::Subgroup => (kc.div_ceil(32) * 32).clamp(32, 256),
        Reduce::Workgroup => kc.next_power_of_two().clamp(32, 256),
    };
    let iters = kc.div_ceil(threads);
    let r = outputs_per_group(s, threads, reduce);
    let (gx, gy) = split_groups(s.n.div_ceil(r));
    let glu = s.glu.is_some();
    let norm = s.norm.is_some();
    // Reduction slots: the R sums, the R up sums, Σx².
    let sq_slot = r * if glu { 2 } else { 1 };
    let slots = sq_slot + u32::from(norm);
    let max_subgroups = threads / MIN_SUBGROUP_SIZE;

    let mut w = prelude();
    let _ = writeln!(
        w,
        "const K: u32 = {k}u;\nconst N: u32 = {n}u;\nconst KC: u32 = {kc}u;\n\
         const THREADS: u32 = {threads}u;\nconst ITERS: u32 = {iters}u;\nconst R: u32 = {r}u;\nconst SLOTS: u32 = {slots}u;\n\
         const GX: u32 = {gx}u;",
        k = s.k,
        n = s.n,
    );
    let (b, shards) = if quantized {
        bind_quantized(s, norm, UnitRead::Dot(dots), &mut w)
    } else {
        let bound = bind_operands(s, e, &mut w);
        w += &chunk_ops(e, norm);
        shard_loader(&mut w, &bound.1, e);
        bound
    };
    // Weight row `row`'s chunk `c` times `xv`.
    let term = |row: &str| {
        if quantized {
            format!("wdot({row}, c, xv)")
        } else {
            format!("cdot(wrow({row}, c), xv)")
        }
    };

    // The K loop, unrolled over the R outputs (a last workgroup past N
    // reloads row N - 1 and stores nothing for it).
    // The row of `x` that output row `t` reads.
    let xt = if s.last_row { "(params.t - 1u)" } else { "t" };
    let mut body = String::new();
    if norm {
        body += &format!(
            "    var xv = x_chunk({xt} * KC + c);\n\
                 \x20   ssq = ssq + cdot(xv, xv);\n\
                 \x20   xv = cmul(xv, cplus(gamma_chunk(c), OFFSET));\n"
        );
    } else {
        body += &format!("    let xv = x_chunk({xt} * KC + c);\n");
    }
    for i in 0..r {
        let _ = writeln!(
            body,
            "    let row{i} = min(n0 + {i}u, N - 1u);\n    acc[{i}] = acc[{i}] + {};",
            term(&format!("row{i}"))
        );
        if glu {
            let _ = writeln!(
                body,
                "    up[{i}] = up[{i}] + {};",
                term(&format!("row{i} + N"))
            );
        }
    }
    let parts = partial_sums(r, glu, norm);

    let (red_len, builtins, reduce_code, total) = match reduce {
        Reduce::Subgroup => {
            let mut code = String::new();
            for (slot, v) in &parts {
                let _ = writeln!(code, "  let s{slot} = subgroupAdd({v});");
            }
            code += "  if (sg_lane == 0u && sg_id < MAX_SUBGROUPS) {\n";
            for (slot, _) in &parts {
                let _ = writeln!(code, "    red[sg_id * SLOTS + {slot}u] = s{slot};");
            }
            code += "  }\n  workgroupBarrier();\n";
            // Thread `tid < R` sums its slots over the subgroups.
            let mut total = "    var sum = 0.0f;\n".to_string();
            let mut adds = "      sum = sum + red[j * SLOTS + tid];\n".to_string();
            if glu {
                total += "    var upsum = 0.0f;\n";
                adds += "      upsum = upsum + red[j * SLOTS + R + tid];\n";
            }
            if norm {
                total += "    var sq = 0.0f;\n";
                let _ = writeln!(adds, "      sq = sq + red[j * SLOTS + {sq_slot}u];");
            }
            let _ = write!(
                total,
                "    for (var j = 0u; j < min(sg_count, MAX_SUBGROUPS); j = j + 1u) {{\n{adds}    }}\n"
            );
            (
                slots * max_subgroups,
                ",\n        @builtin(subgroup_invocation_id) sg_lane: u32,\n        \
                 @builtin(subgroup_id) sg_id: u32,\n        @builtin(num_subgroups) sg_count: u32",
                code,
                total,
            )
        }
        Reduce::Workgroup => {
            let mut code = String::new();
            for (slot, v) in &parts {
                let _ = writeln!(code, "  red[{slot}u * THREADS + tid] = {v};");
            }
            // Two levels, two barriers (a tree takes one per halving, and on a CPU
            // driver each barrier switches every invocation): 16 partial sums per
            // slot, each of every 16th value (neighbouring threads read neighbouring
            // words), stored past the slots at `PARTS`; then each output's 16.
            code += "  workgroupBarrier();\n\
                     \x20 for (var w = tid; w < SLOTS * 16u; w = w + THREADS) {\n\
                     \x20   let base = (w / 16u) * THREADS + w % 16u;\n\
                     \x20   var p = 0.0f;\n\
                     \x20   for (var i = 0u; i < THREADS / 16u; i = i + 1u) { p = p + red[base + 16u * i]; }\n\
                     \x20   red[PARTS + w] = p;\n\
                     \x20 }\n  workgroupBarrier();\n";
            let mut total = "    var sum = 0.0f;\n".to_string();
            let mut adds = "      sum = sum + red[PARTS + tid * 16u + q];\n".to_string();
            if glu {
                total += "    var upsum = 0.0f;\n";
                adds += "      upsum = upsum + red[PARTS + (R + tid) * 16u + q];\n";
            }
            if norm {
                total += "    var sq = 0.0f;\n";
                let _ = writeln!(adds, "      sq = sq + red[PARTS + {sq_slot}u * 16u + q];");
            }
            let _ = write!(
                total,
                "    for (var q = 0u; q < 16u; q = q + 1u) {{\n{adds}    }}\n"
            );
            (slots * (threads + 16), "", code, total)
        }
    };
    match reduce {
        Reduce::Subgroup => {
            let _ = writeln!(w, "const MAX_SUBGROUPS: u32 = {max_subgroups}u;");
        }
        Reduce::Workgroup => {
            let _ = writeln!(w, "const PARTS: u32 = {}u;", slots * threads);
        }
    }

    let scale = if norm { " * inv" } else { "" };
    let mut store = String::new();
    if norm {
        store += "    let inv = 1.0f / sqrt(sq / f32(K) + EPS);\n";
    }
    let _ = writeln!(
        store,
        "    {}",
        linear::store(s, "t", &format!("sum{scale}"), &format!("upsum{scale}"))
    );
    // A constant trip count, so the compiler can unroll the loop and issue
    // every load of a thread at once; chunks past KC only where THREADS does
    // not divide KC.
    let k_loop = if kc.is_multiple_of(threads) {
        format!(
            "  for (var i = 0u; i < ITERS; i = i + 1u) {{\n    let c = tid + i * THREADS;\n{body}  }}\n"
        )
    } else {
        let body = body.replace("\n    ", "\n      ");
        format!(
            "  for (var i = 0u; i < ITERS; i = i + 1u) {{\n    let c = tid + i * THREADS;\n    if (c < KC) {{\n  {body}    }}\n  }}\n"
        )
    };
    let accs = accumulators(glu, norm);
    let _ = write!(
        w,
        "var<workgroup> red: array<f32, {red_len}>;\n\
         @compute @workgroup_size({threads}, 1, 1)\n\
         fn main(@builtin(local_invocation_index) tid: u32,\n        \
         @builtin(workgroup_id) wid: vec3<u32>{builtins}) {{\n\
         \x20 let n0 = (wid.x + wid.y * GX) * R;\n\
         \x20 let t = wid.z;\n{accs}\
         {k_loop}\
         {reduce_code}\
         \x20 let n = n0 + tid;\n\
         \x20 if (tid < R && n < N) {{\n{total}{store}  }}\n}}\n"
    );
    let (glu, options) = name_parts(s, shards.len());
    KernelSource {
        name: format!(
            "gemv{glu}_{}_r{}_k{}_n{}{options}_{}",
            s.wdtype,
            s.rows.tag(),
            s.k,
            s.n,
            match reduce {
                Reduce::Subgroup => "sg",
                Reduce::Workgroup => "wg",
            }
        ),
        wgsl: w,
        workgroup_size: [threads, 1, 1],
        bindings: b.finish(),
        workgroups: [
            gerbil_plan::WorkgroupCount::fixed(gx),
            gerbil_plan::WorkgroupCount::fixed(gy),
            s.rows.count(1, 1),
        ],
        workgroup_bytes: red_len * 4,
    }
}
