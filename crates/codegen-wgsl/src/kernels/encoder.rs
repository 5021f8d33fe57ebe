//! Kernels of the ops only encoders use: `layer_norm`, `add_positions`
//! (learned absolute positions), `pool` and `l2_normalize`.
//!
//! [`layer_norm`] and [`l2_normalize`] run one workgroup per row and reduce
//! in workgroup memory; [`add_positions`] is elementwise; [`pool`] runs one
//! thread per column and sequence. An encoder step packs whole sequences
//! ([`Segments`]): a row's position is its offset in its sequence, and
//! `pool` makes one row per sequence from that sequence's rows. The
//! surprising part: `layer_norm` reduces
//! twice — the mean, then the mean of squared deviations — instead of
//! `E[x²] − E[x]²` in one pass, which loses digits when a row's mean is
//! large against its spread (BERT's residual stream), and PyTorch's
//! reference does not.

use super::rowwise::{per_row, reduce_into, row_main, WG};
use super::{f32_lit, input, output, prelude, Bindings, KernelSource, Rows, Segments};
use gerbil_ir::{DType, Pooling};
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// `y = (x − mean) / sqrt(var + eps) · w + b` per row of width `width`,
/// weight and bias stored as `wdtype`.
pub fn layer_norm(rows: Rows, width: u32, eps: f32, wdtype: DType) -> KernelSource {
    let mut w = prelude();
    let _ = writeln!(
        w,
        "const H: u32 = {width}u;\nconst EPS: f32 = {};\nconst WG: u32 = {WG}u;",
        f32_lit(eps)
    );
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.weight(&mut w, input(1), "w", wdtype);
    b.weight(&mut w, input(2), "b", wdtype);
    b.activation(&mut w, output(0), "y");
    w.push_str(&row_main(&format!(
        "  for (var i = lane; i < H; i = i + WG) {{ s = s + x[row + i]; }}\n{sum}\
         \x20 let mean = total / f32(H);\n\
         \x20 s = 0.0f;\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ let d = x[row + i] - mean; s = s + d * d; }}\n{squares}\
         \x20 let inv = 1.0f / sqrt(dev / f32(H) + EPS);\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ y[row + i] = (x[row + i] - mean) * inv * load_w(i) + load_b(i); }}\n",
        sum = reduce_into("total"),
        squares = reduce_into("dev"),
    )));
    per_row(
        format!("layer_norm_{wdtype}_r{}_h{width}", rows.tag()),
        w,
        rows,
        b.finish(),
    )
}

/// `y[r] = x[r] / max(‖x[r]‖₂, 1e-12)` per row of width `width`.
pub fn l2_normalize(rows: Rows, width: u32) -> KernelSource {
    let mut w = prelude();
    let _ = writeln!(w, "const H: u32 = {width}u;\nconst WG: u32 = {WG}u;");
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.activation(&mut w, output(0), "y");
    w.push_str(&row_main(&format!(
        "  for (var i = lane; i < H; i = i + WG) {{ let v = x[row + i]; s = s + v * v; }}\n{squares}\
         \x20 let inv = 1.0f / max(sqrt(total), 1e-12f);\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ y[row + i] = x[row + i] * inv; }}\n",
        squares = reduce_into("total"),
    )));
    per_row(
        format!("l2_normalize_r{}_h{width}", rows.tag()),
        w,
        rows,
        b.finish(),
    )
}

/// `y[t, c] = x[t, c] + table[t − start(t), c]`: each row's position is
/// its offset in its sequence, the table stored as `tdtype`.
pub fn add_positions(width: u32, tdtype: DType) -> KernelSource {
    let mut w = prelude();
    let _ = writeln!(w, "const W: u32 = {width}u;\nconst WG: u32 = {WG}u;");
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.weight(&mut w, input(1), "pt", tdtype);
    b.activation(&mut w, output(0), "y");
    Segments::declare(&mut b, &mut w);
    w.push_str(
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n\
         \x20 let i = gid.x;\n  if (i >= params.t * W) { return; }\n\
         \x20 let t = i / W;\n\
         \x20 y[i] = x[i] + load_pt((t - seq_start(t)) * W + i % W);\n}\n",
    );
    KernelSource {
        name: format!("add_positions_{tdtype}_w{width}"),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            Rows::Tokens.count(width, WG),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: 0,
    }
}

/// `y[b, c]` = the `pooling` of column `c` over sequence `b`'s rows, for
/// each of `seqs` sequence places (a place past the step's sequences, of
/// length zero, gets zeros).
pub fn pool(pooling: Pooling, width: u32, seqs: u32) -> KernelSource {
    let mut w = prelude();
    let _ = writeln!(w, "const W: u32 = {width}u;\nconst WG: u32 = {WG}u;");
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.activation(&mut w, output(0), "y");
    Segments::declare(&mut b, &mut w);
    let body = match pooling {
        Pooling::Mean => {
            "  var s = 0.0f;\n  for (var t = first; t < first + n; t = t + 1u) { s = s + x[t * W + c]; }\n\
             \x20 y[b * W + c] = s / f32(n);\n"
        }
        Pooling::Cls => "  y[b * W + c] = x[first * W + c];\n",
        Pooling::Last => "  y[b * W + c] = x[(first + n - 1u) * W + c];\n",
        Pooling::Max => {
            "  var m = x[first * W + c];\n\
             \x20 for (var t = first + 1u; t < first + n; t = t + 1u) { m = max(m, x[t * W + c]); }\n\
             \x20 y[b * W + c] = m;\n"
        }
    };
    let _ = write!(
        w,
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n\
         \x20 let c = gid.x;\n  let b = gid.y;\n  if (c >= W) {{ return; }}\n\
         \x20 let first = seq_first(b);\n  let n = seq_len(b);\n\
         \x20 if (n == 0u) {{ y[b * W + c] = 0.0f; return; }}\n{body}}}\n"
    );
    KernelSource {
        name: format!("pool_{}_w{width}_b{seqs}", pooling.name()),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(width.div_ceil(WG)),
            WorkgroupCount::fixed(seqs),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: 0,
    }
}
