//! `matmul`: `y[r, n] = Σ_k x[r, k] · w[n, k] (+ b[n])`, weights `[N, K]` in
//! f32, f16 or bf16, accumulation in f32.
//!
//! A workgroup is `LANES` × `COLS` = 256 threads (see [`lanes_for`]) and handles `TT` rows of `x`
//! at once, so each weight element is loaded once per `TT` rows (TT = 1 for
//! decode, where this is a GEMV). Lanes stride along `K` (coalesced weight
//! reads) and reduce through workgroup memory. Packed 16-bit weights are read
//! two per `u32` when `K` is even.

use super::{
    bindings, f32_binding, prelude, split_groups, weight_binding, Access, KernelSource, Rows,
};
use gerbil_ir::DType;
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// Threads per workgroup.
const THREADS: u32 = 256;

/// Lanes that share one output column: enough that each lane makes about 16
/// passes over its slice of `K` (few lanes on short rows keeps the reduction
/// cheap), a power of two between 8 and 64.
fn lanes_for(k_steps: u32) -> u32 {
    (k_steps / 16).next_power_of_two().clamp(8, 64)
}

/// Specialization of a matmul kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatMulSpec {
    /// Rows of `x`.
    pub rows: Rows,
    /// Inner dimension.
    pub k: u32,
    /// Output columns.
    pub n: u32,
    /// Weight dtype.
    pub wdtype: DType,
    /// Whether a bias binding follows the weight.
    pub bias: bool,
    /// Rows per workgroup.
    pub tt: u32,
}

/// Builds the kernel.
pub fn kernel(s: MatMulSpec) -> KernelSource {
    let packed = s.wdtype != DType::F32 && s.k.is_multiple_of(2);
    let lanes = lanes_for(if packed { s.k / 2 } else { s.k });
    let cols = THREADS / lanes;
    let groups = s.n.div_ceil(cols);
    let (gx, gy) = split_groups(groups);
    let mut w = prelude();
    let _ = writeln!(
        w,
        "const K: u32 = {k}u;\nconst N: u32 = {n}u;\nconst TT: u32 = {tt}u;\nconst LANES: u32 = {lanes}u;\nconst COLS: u32 = {cols}u;\nconst GX: u32 = {gx}u;",
        k = s.k,
        n = s.n,
        tt = s.tt
    );
    f32_binding(&mut w, 1, "x", true);
    weight_binding(&mut w, 2, "w", s.wdtype);
    let out_binding = if s.bias {
        weight_binding(&mut w, 3, "b", DType::F32);
        4
    } else {
        3
    };
    f32_binding(&mut w, out_binding, "y", true);
    let inner = if packed {
        "  for (var wi = lane; wi < K / 2u; wi = wi + LANES) {\n\
         \x20   let wv = pair_w(n * (K / 2u) + wi);\n\
         \x20   for (var tt = 0u; tt < count; tt = tt + 1u) {\n\
         \x20     let xi = (t0 + tt) * K + 2u * wi;\n\
         \x20     acc[tt] = acc[tt] + wv.x * x[xi] + wv.y * x[xi + 1u];\n\
         \x20   }\n  }\n"
    } else {
        "  for (var k = lane; k < K; k = k + LANES) {\n\
         \x20   let wv = load_w(n * K + k);\n\
         \x20   for (var tt = 0u; tt < count; tt = tt + 1u) {\n\
         \x20     acc[tt] = acc[tt] + wv * x[(t0 + tt) * K + k];\n\
         \x20   }\n  }\n"
    };
    let bias = if s.bias { " + load_b(n)" } else { "" };
    let _ = write!(
        w,
        "var<workgroup> red: array<f32, {red}>;\n\
         @compute @workgroup_size({lanes}, {cols}, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let lane = lid.x;\n  let col = lid.y;\n\
         \x20 let n = (wid.x + wid.y * GX) * COLS + col;\n\
         \x20 let rows = {rows};\n  let t0 = wid.z * TT;\n\
         \x20 var count = 0u;\n  if (t0 < rows) {{ count = min(TT, rows - t0); }}\n\
         \x20 var acc: array<f32, TT>;\n\
         \x20 if (n < N) {{\n{inner}  }}\n\
         \x20 for (var tt = 0u; tt < TT; tt = tt + 1u) {{ red[(col * TT + tt) * LANES + lane] = acc[tt]; }}\n\
         \x20 workgroupBarrier();\n\
         \x20 for (var s = LANES / 2u; s > 0u; s = s >> 1u) {{\n\
         \x20   if (lane < s) {{\n\
         \x20     for (var tt = 0u; tt < TT; tt = tt + 1u) {{\n\
         \x20       let i = (col * TT + tt) * LANES + lane;\n\
         \x20       red[i] = red[i] + red[i + s];\n\
         \x20     }}\n    }}\n    workgroupBarrier();\n  }}\n\
         \x20 if (n < N) {{\n\
         \x20   for (var r = lane; r < count; r = r + LANES) {{\n\
         \x20     y[(t0 + r) * N + n] = red[(col * TT + r) * LANES]{bias};\n\
         \x20   }}\n  }}\n}}\n",
        red = THREADS * s.tt,
        rows = s.rows.wgsl(),
    );
    let z = match s.rows {
        Rows::Tokens => WorkgroupCount {
            per_token: 1,
            constant: 0,
            divisor: s.tt,
        },
        Rows::Fixed(r) => WorkgroupCount::fixed(r.div_ceil(s.tt)),
    };
    KernelSource {
        name: format!(
            "matmul_{}_r{}_k{}_n{}_tt{}{}",
            s.wdtype,
            s.rows.tag(),
            s.k,
            s.n,
            s.tt,
            if s.bias { "_bias" } else { "" }
        ),
        wgsl: w,
        workgroup_size: [lanes, cols, 1],
        bindings: if s.bias {
            bindings(&[
                Access::Activation,
                Access::Read,
                Access::Read,
                Access::Activation,
            ])
        } else {
            bindings(&[Access::Activation, Access::Read, Access::Activation])
        },
        workgroups: [WorkgroupCount::fixed(gx), WorkgroupCount::fixed(gy), z],
        workgroup_bytes: THREADS * s.tt * 4,
    }
}
