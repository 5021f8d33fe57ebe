//! `matmul`: `y[r, n] = Σ_k x[r, k] · w[n, k] (+ b[n])`, weights `[N, K]` in
//! f32, f16 or bf16, accumulation in f32.
//!
//! A workgroup is `LANES` × `COLS` = 256 threads (see [`lanes_for`]) and handles `TT` rows of `x`
//! at once, so each weight element is loaded once per `TT` rows (TT = 1 for
//! decode, where this is a GEMV). Lanes stride along `K` (coalesced weight
//! reads) and reduce through workgroup memory. Packed 16-bit weights are read
//! two per `u32` when `K` is even.
//!
//! With [`MatMulSpec::glu`] set, the weight has `2·N` rows and the epilogue is a
//! gated linear unit: each column `n < N` accumulates rows `n` (gate) and
//! `N + n` (up) in the same pass over `x`, and stores `act(gate) · up`. The
//! two sums are reduced one after the other through the same workgroup
//! memory, so the kernel needs no more of it than a plain matmul.
//!
//! With [`MatMulSpec::norm`] set, `x` is RMS-normalized on the fly (the
//! `fuse-norm-matmul` prologue): the K loop multiplies each `x[r, k]` by
//! `g[k] + offset` and, from the same loads, sums `x[r, k]²`; that sum is
//! reduced before the others, and the stores scale each row's sums by its
//! `1 / sqrt(Σx² / K + eps)`. Every workgroup thus recomputes the inverse RMS
//! of its rows, with no pass over `x` of its own: the lanes of any one column
//! read the whole row anyway. With [`MatMulSpec::residual`] set, the store
//! adds `res[r, n]` (the `fuse-matmul-residual` epilogue); `res` is a
//! separate `read_write` activation, never the output's own buffer. With
//! [`MatMulSpec::last_row`], the one output row is computed from row `T − 1`
//! of an `x` of `T` rows (the LM head after `fuse-last-row-matmul`). With
//! [`MatMulSpec::act`], the store applies the activation after the bias (the
//! `fuse-matmul-act` epilogue).

use super::linear::{bind_after_weight, bind_weight, name_parts, row_loader, store, WeightRead};
use super::{input, prelude, split_groups, Bindings, KernelSource, Rows};
use gerbil_ir::{DType, UnaryOp};
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
#[derive(Clone, Copy, Debug, PartialEq)]
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
    /// Weight rows per shard when the weight is split over several bindings
    /// (shard `s` holds rows `s·R .. (s+1)·R`); `None` for one binding.
    /// With `glu`, the shards split the `2·N` rows.
    pub shard_rows: Option<u32>,
    /// Gated epilogue: the weight is `[2·N, K]` and the output
    /// `act(x·w[n] + b[n]) · (x·w[N + n] + b[N + n])`.
    pub glu: Option<UnaryOp>,
    /// RMSNorm prologue `(eps, weight offset, norm weight dtype)`: the norm
    /// weight `[K]` is the input after the bias.
    pub norm: Option<(f32, f32, DType)>,
    /// Residual epilogue: `res[rows, N]`, the last input, is added to the
    /// output.
    pub residual: bool,
    /// `x` has `T` rows (`params.t`) and only its last is read, for the one
    /// output row (`rows` must be `Fixed(1)`): `matmul{last_row}`.
    pub last_row: bool,
    /// Activation epilogue (`matmul{act}`, not with `glu`): each output is
    /// `act(sum + b[n])`, before the residual.
    pub act: Option<UnaryOp>,
}

/// The K loop of one output column: `loads` are the expressions of its
/// weight (the gate, then the up row with a gated epilogue), indexed by `wi`
/// (packed pairs) or `k`. With `norm`, each `x` is scaled by its gain and
/// its square summed into `ssq`. `xrow` is the row of `x` that output row
/// `t0 + tt` reads.
fn k_loop(packed: bool, loads: &[String], norm: bool, xrow: &str) -> String {
    let glu = loads.len() == 2;
    let mut s = String::new();
    if packed {
        s += "    for (var wi = lane; wi < K / 2u; wi = wi + LANES) {\n";
        s += &format!("      let wv = {};\n", loads[0]);
        if glu {
            s += &format!("      let wu = {};\n", loads[1]);
        }
        if norm {
            s += "      let gp = gain2(wi);\n";
        }
        s += &format!(
            "      for (var tt = 0u; tt < count; tt = tt + 1u) {{\n\
              \x20       let xi = {xrow} * K + 2u * wi;\n"
        );
        if norm {
            s += "        let r0 = x[xi];\n        let r1 = x[xi + 1u];\n\
                  \x20       ssq[tt] = ssq[tt] + r0 * r0 + r1 * r1;\n\
                  \x20       let x0 = r0 * gp.x;\n        let x1 = r1 * gp.y;\n";
        } else if glu {
            s += "        let x0 = x[xi];\n        let x1 = x[xi + 1u];\n";
        }
        if norm || glu {
            s += "        acc[tt] = acc[tt] + wv.x * x0 + wv.y * x1;\n";
        } else {
            s += "        acc[tt] = acc[tt] + wv.x * x[xi] + wv.y * x[xi + 1u];\n";
        }
        if glu {
            s += "        acc2[tt] = acc2[tt] + wu.x * x0 + wu.y * x1;\n";
        }
    } else {
        s += "    for (var k = lane; k < K; k = k + LANES) {\n";
        s += &format!("      let wv = {};\n", loads[0]);
        if glu {
            s += &format!("      let wu = {};\n", loads[1]);
        }
        if norm {
            s += "      let gk = gain(k);\n";
        }
        s += "      for (var tt = 0u; tt < count; tt = tt + 1u) {\n";
        if norm {
            s += &format!(
                "        let xr = x[{xrow} * K + k];\n\
                 \x20       ssq[tt] = ssq[tt] + xr * xr;\n\
                 \x20       let xv = xr * gk;\n"
            );
        } else if glu {
            s += &format!("        let xv = x[{xrow} * K + k];\n");
        }
        if norm || glu {
            s += "        acc[tt] = acc[tt] + wv * xv;\n";
        } else {
            s += &format!("        acc[tt] = acc[tt] + wv * x[{xrow} * K + k];\n");
        }
        if glu {
            s += "        acc2[tt] = acc2[tt] + wu * xv;\n";
        }
    }
    s += "      }\n    }\n";
    s
}

/// The weight loads of column `n` from shard `w` at local row `row`.
fn loads(packed: bool, w: &str, row: &str, glu: bool) -> Vec<String> {
    let load = |r: &str| {
        if packed {
            format!("pair_{w}(({r}) * (K / 2u) + wi)")
        } else {
            format!("load_{w}(({r}) * K + k)")
        }
    };
    let mut out = vec![load(row)];
    if glu {
        out.push(load(&format!("{row} + N")));
    }
    out
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
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    let glu = s.glu.is_some();
    let shards = bind_weight(&s, &mut b, &mut w, WeightRead::Elements);
    // `g` is the gate sums' name: the norm weight is `gamma`.
    bind_after_weight(&s, &mut b, &mut w, |b, w, port, gdtype| {
        b.weight(w, port, "gamma", gdtype)
    });
    if let Some((_, _, gdtype)) = s.norm {
        let pair = if gdtype == DType::F32 {
            "vec2<f32>(load_gamma(2u * wi), load_gamma(2u * wi + 1u))"
        } else {
            "pair_gamma(wi)"
        };
        let _ = writeln!(
            w,
            "fn gain(k: u32) -> f32 {{ return load_gamma(k) + OFFSET; }}\n\
             fn gain2(wi: u32) -> vec2<f32> {{ return {pair} + vec2<f32>(OFFSET); }}"
        );
    }
    let norm = s.norm.is_some();
    let xrow = if s.last_row {
        "(params.t - 1u)"
    } else {
        "(t0 + tt)"
    };
    let mut inner = String::new();
    if glu && shards.len() > 1 {
        // Gate row `n` and up row `N + n` may lie in different shards: load
        // through a helper that picks the shard by row.
        row_loader(&mut w, "load_row", "", "f32", &shards, |shard, local| {
            format!("load_{}({local} * K + i)", shard.name)
        });
        let rows = [
            "load_row(n, k)".to_string(),
            "load_row(n + N, k)".to_string(),
        ];
        inner = k_loop(false, &rows, norm, xrow);
    }
    for (i, shard) in shards
        .iter()
        .enumerate()
        .filter(|_| !(glu && shards.len() > 1))
    {
        let (name, start) = (&shard.name, shard.start);
        let row = if start == 0 {
            "n".to_string()
        } else {
            format!("n - {start}u")
        };
        let body = k_loop(packed, &loads(packed, name, &row, glu), norm, xrow);
        match (i, shards.get(i + 1).map(|next| next.start)) {
            (_, None) if shards.len() == 1 => inner = body,
            (0, Some(end)) => inner += &format!("  if (n < {end}u) {{\n{body}  }}"),
            (_, Some(end)) => inner += &format!(" else if (n < {end}u) {{\n{body}  }}"),
            (_, None) => inner += &format!(" else {{\n{body}  }}\n"),
        }
    }
    let scale = if norm { " * inv[r]" } else { "" };
    let reduce = "  workgroupBarrier();\n\
         \x20 for (var s = LANES / 2u; s > 0u; s = s >> 1u) {\n\
         \x20   if (lane < s) {\n\
         \x20     for (var tt = 0u; tt < TT; tt = tt + 1u) {\n\
         \x20       let i = (col * TT + tt) * LANES + lane;\n\
         \x20       red[i] = red[i] + red[i + s];\n\
         \x20     }\n    }\n    workgroupBarrier();\n  }\n";
    // The last reduction leaves each column's sum (gated: the up sums,
    // after the gate sums were kept in `g`) in `red`.
    let sum = format!("red[(col * TT + r) * LANES]{scale}");
    let (acc2, store) = match s.glu {
        None => (String::new(), store(&s, "(t0 + r)", &sum, "")),
        Some(_) => (
            "  var acc2: array<f32, TT>;\n".to_string(),
            store(&s, "(t0 + r)", &format!("g[r]{scale}"), &sum),
        ),
    };
    let store = format!("      {store}\n");
    // With a norm prologue, the sums of squares are reduced first and
    // turned into each row's inverse RMS, `inv`.
    let (ssq, norm_phase) = if norm {
        (
            "  var ssq: array<f32, TT>;\n",
            format!(
                "  for (var tt = 0u; tt < TT; tt = tt + 1u) {{ red[(col * TT + tt) * LANES + lane] = ssq[tt]; }}\n\
                 {reduce}\
                 \x20 var inv: array<f32, TT>;\n\
                 \x20 for (var tt = 0u; tt < TT; tt = tt + 1u) {{ inv[tt] = 1.0f / sqrt(red[(col * TT + tt) * LANES] / f32(K) + EPS); }}\n\
                 \x20 workgroupBarrier();\n"
            ),
        )
    } else {
        ("", String::new())
    };
    // With a gated epilogue, the gate sums are reduced first and kept in `g`.
    let gate_phase = if glu {
        format!(
            "  for (var tt = 0u; tt < TT; tt = tt + 1u) {{ red[(col * TT + tt) * LANES + lane] = acc[tt]; }}\n\
             {reduce}\
             \x20 var g: array<f32, TT>;\n\
             \x20 for (var tt = 0u; tt < TT; tt = tt + 1u) {{ g[tt] = red[(col * TT + tt) * LANES]; }}\n\
             \x20 workgroupBarrier();\n\
             \x20 for (var tt = 0u; tt < TT; tt = tt + 1u) {{ red[(col * TT + tt) * LANES + lane] = acc2[tt]; }}\n"
        )
    } else {
        "  for (var tt = 0u; tt < TT; tt = tt + 1u) { red[(col * TT + tt) * LANES + lane] = acc[tt]; }\n"
            .to_string()
    };
    let _ = write!(
        w,
        "var<workgroup> red: array<f32, {red}>;\n\
         @compute @workgroup_size({lanes}, {cols}, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let lane = lid.x;\n  let col = lid.y;\n\
         \x20 let n = (wid.x + wid.y * GX) * COLS + col;\n\
         \x20 let rows = {rows};\n  let t0 = wid.z * TT;\n\
         \x20 var count = 0u;\n  if (t0 < rows) {{ count = min(TT, rows - t0); }}\n\
         \x20 var acc: array<f32, TT>;\n{acc2}{ssq}\
         \x20 if (n < N) {{\n{inner}  }}\n\
         {norm_phase}{gate_phase}{reduce}\
         \x20 if (n < N) {{\n\
         \x20   for (var r = lane; r < count; r = r + LANES) {{\n{store}\
         \x20   }}\n  }}\n}}\n",
        red = THREADS * s.tt,
        rows = s.rows.wgsl(),
    );
    let z = match s.rows {
        Rows::Tokens => WorkgroupCount::per_token(1, 0, s.tt),
        Rows::Fixed(r) => WorkgroupCount::fixed(r.div_ceil(s.tt)),
    };
    let (glu, options) = name_parts(&s, shards.len());
    KernelSource {
        name: format!(
            "matmul{glu}_{}_r{}_k{}_n{}_tt{}{options}",
            s.wdtype,
            s.rows.tag(),
            s.k,
            s.n,
            s.tt,
        ),
        wgsl: w,
        workgroup_size: [lanes, cols, 1],
        bindings: b.finish(),
        workgroups: [WorkgroupCount::fixed(gx), WorkgroupCount::fixed(gy), z],
        workgroup_bytes: THREADS * s.tt * 4,
    }
}
