//! `matmul_cpu`: every matmul of the `cpu` variant ([`kernel`]) — prefill,
//! decode and batch steps alike — scheduled for a CPU adapter (lavapipe,
//! SwiftShader, WARP) rather than a GPU. Same options as
//! [`gemv`](super::gemv) (bias, gated epilogue, weight shards, RMSNorm
//! prologue, residual epilogue, last-row read) and the same chunked loads.
//!
//! Each thread computes a tile of [`ROWS`] outputs for `tt` consecutive rows
//! of `x` by itself: it walks the tile's weight rows from end to end, loads
//! each chunk of a weight row once for all `tt` rows of `x` and each chunk of
//! `x` once for all [`ROWS`] outputs, and stores its sums. No workgroup
//! memory, no barrier, no reduction.
//!
//! The surprise is what a CPU driver charges for. It runs a workgroup's
//! invocations as the lanes of one core's SIMD loop, so a barrier switches
//! every invocation, and a load whose address differs between lanes is one
//! scalar load per lane — even where the lanes read neighbouring words, and
//! even for the chunk of `x` that every lane of a row reads. On lavapipe the
//! cost of a matmul is then its loads per multiply-add, which the output tile
//! divides: SmolLM2's decode step took 1.5 s with the GPU's GEMV (one
//! output per 128-thread workgroup, two barriers) and 0.44 s this way; its
//! 8-token prefill 7.4 s with the GEMM (a barrier per 16 of `K`) and 0.8 s.
//! On a GPU the same schedule is slow (neighbouring threads read rows `K`
//! apart), so only CPU adapters run the variant.

use super::gemv::{bind_operands, bind_quantized, chunk_ops, shard_loader, UnitRead};
use super::linear::{self, elems_per_load, name_parts};
use super::matmul::MatMulSpec;
use super::{prelude, split_groups, KernelSource};
use std::fmt::Write;

/// Threads per workgroup: two SIMD batches of eight lanes, so that even a
/// 576-wide output spreads over five workgroups.
const THREADS: u32 = 16;
/// Outputs per thread: each chunk of `x` is loaded once for all of them
/// (on lavapipe 4 took 1.3× and 1 took 2.1× the time of 8 on SmolLM2's
/// decode step; 16 no less than 8).
pub const ROWS: u32 = 8;
/// Fewest workgroups a dispatch aims for (outputs per thread halve below
/// it), so that every core of the CPU has work.
const MIN_GROUPS: u32 = 4;
/// Most rows of `x` per thread: each weight chunk is loaded once for all of
/// them (a prefill chunk of eight tokens took 0.8 s on lavapipe this way,
/// against 4.7 s one row at a time).
pub const TOKENS: u32 = 8;

/// Rows of `x` per thread for a step of at most `most_rows` rows (decode
/// steps 1, prefill and batch steps up to [`TOKENS`]): a thread's rows
/// past the step's last are loaded for nothing.
pub fn rows_per_thread(most_rows: u32) -> u32 {
    most_rows.clamp(1, TOKENS)
}

/// Builds the kernel (`s.tt` is ignored): `tt` rows of `x` per thread
/// ([`rows_per_thread`]); a quantized weight is read a
/// 32-value unit at a time, dequantized once for all `tt` rows
/// ([`quant::unit_decoder`](super::quant::unit_decoder)) and dotted in f32.
pub fn kernel(s: &MatMulSpec, tt: u32) -> KernelSource {
    let quantized = s.wdtype.is_quantized();
    let e = if quantized {
        32
    } else {
        elems_per_load(s.wdtype, s.k)
    };
    let kc = s.k / e;
    let mut r = ROWS;
    while r > 1 && s.n.div_ceil(r * THREADS) < MIN_GROUPS {
        r /= 2;
    }
    let (gx, gy) = split_groups(s.n.div_ceil(r * THREADS));
    let glu = s.glu.is_some();
    let norm = s.norm.is_some();
    // The rows of `x` this step has.
    let rows = s.rows.wgsl();
    let mut w = prelude();
    let _ = writeln!(
        w,
        "const K: u32 = {k}u;\nconst N: u32 = {n}u;\nconst KC: u32 = {kc}u;\n\
         const THREADS: u32 = {THREADS}u;\nconst R: u32 = {r}u;\nconst TT: u32 = {tt}u;\n\
         const GX: u32 = {gx}u;",
        k = s.k,
        n = s.n,
    );
    let (b, shards) = if quantized {
        bind_quantized(s, norm, UnitRead::Values, &mut w)
    } else {
        let bound = bind_operands(s, e, &mut w);
        w += &chunk_ops(e, norm);
        shard_loader(&mut w, &bound.1, e);
        bound
    };

    // Chunk `c` of each row of `x` (a row past the step's last reloads the
    // last and stores nothing), normed by the gain; then each output row's
    // chunk times each of them.
    let mut body = String::new();
    if norm {
        body += "    let g = cplus(gamma_chunk(c), OFFSET);\n";
    }
    for j in 0..tt {
        let xrow = if s.last_row {
            "(params.t - 1u)".to_string()
        } else {
            format!("min(t0 + {j}u, {rows} - 1u)")
        };
        if norm {
            let _ = writeln!(
                body,
                "    var x{j} = x_chunk({xrow} * KC + c);\n    \
                 ssq[{j}] = ssq[{j}] + cdot(x{j}, x{j});\n    x{j} = cmul(x{j}, g);"
            );
        } else {
            let _ = writeln!(body, "    let x{j} = x_chunk({xrow} * KC + c);");
        }
    }
    for i in 0..r {
        let _ = writeln!(body, "    let row{i} = min(n0 + {i}u, N - 1u);");
        let mut sums = vec![("acc", format!("row{i}"))];
        if glu {
            sums.push(("up", format!("row{i} + N")));
        }
        let load = if quantized { "wunit" } else { "wrow" };
        for (sum, row) in sums {
            let _ = writeln!(body, "    let w{sum}{i} = {load}({row}, c);");
            for j in 0..tt {
                let a = i * tt + j;
                let _ = writeln!(body, "    {sum}[{a}] = {sum}[{a}] + cdot(w{sum}{i}, x{j});");
            }
        }
    }

    let mut store = String::new();
    for j in 0..tt {
        let scale = if norm {
            let _ = writeln!(
                store,
                "  let inv{j} = 1.0f / sqrt(ssq[{j}] / f32(K) + EPS);"
            );
            format!(" * inv{j}")
        } else {
            String::new()
        };
        let _ = writeln!(
            store,
            "  if (t0 + {j}u < {rows}) {{\n    let t = t0 + {j}u;"
        );
        for i in 0..r {
            let a = i * tt + j;
            let up = format!("up[{a}]{scale}");
            let _ = writeln!(
                store,
                "    if (n0 + {i}u < N) {{\n      let n = n0 + {i}u;\n      {}\n    }}",
                linear::store(s, "t", &format!("acc[{a}]{scale}"), &up)
            );
        }
        store += "  }\n";
    }
    let mut accs = "  var acc: array<f32, R * TT>;\n".to_string();
    if glu {
        accs += "  var up: array<f32, R * TT>;\n";
    }
    if norm {
        accs += "  var ssq: array<f32, TT>;\n";
    }
    let _ = write!(
        w,
        "@compute @workgroup_size({THREADS}, 1, 1)\n\
         fn main(@builtin(local_invocation_index) tid: u32,\n        \
         @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let n0 = ((wid.x + wid.y * GX) * THREADS + tid) * R;\n\
         \x20 let t0 = wid.z * TT;\n{accs}\
         \x20 for (var c = 0u; c < KC; c = c + 1u) {{\n{body}  }}\n\
         {store}}}\n"
    );
    let (glu_tag, options) = name_parts(s, shards.len());
    KernelSource {
        name: format!(
            "matmul_cpu{glu_tag}_{}_r{}_k{}_n{}{options}_tt{tt}",
            s.wdtype,
            s.rows.tag(),
            s.k,
            s.n,
        ),
        wgsl: w,
        workgroup_size: [THREADS, 1, 1],
        bindings: b.finish(),
        workgroups: [
            gerbil_plan::WorkgroupCount::fixed(gx),
            gerbil_plan::WorkgroupCount::fixed(gy),
            s.rows.count(1, tt),
        ],
        workgroup_bytes: 0,
    }
}
