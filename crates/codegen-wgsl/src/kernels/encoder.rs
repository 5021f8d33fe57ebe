//! Kernels of the ops only encoders use: `layer_norm`, `add_positions`
//! (learned absolute positions), `pool` and `l2_normalize`.
//!
//! [`layer_norm`] and [`l2_normalize`] run one workgroup per row and reduce
//! in workgroup memory; [`add_positions`] is elementwise; [`pool`] runs one
//! thread per column over the step's `T` rows, so a pooled vector is only
//! the sequence's when the step holds all of it (embedding plans take a
//! whole input in one step). The surprising part: `layer_norm` reduces
//! twice — the mean, then the mean of squared deviations — instead of
//! `E[x²] − E[x]²` in one pass, which loses digits when a row's mean is
//! large against its spread (BERT's residual stream), and PyTorch's
//! reference does not.

use super::{f32_lit, input, output, prelude, tree_reduce, Bindings, KernelSource, Rows};
use gerbil_ir::{DType, Pooling};
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

const WG: u32 = 256;

/// One workgroup per row of `rows`.
fn per_row(
    name: String,
    wgsl: String,
    rows: Rows,
    bindings: Vec<gerbil_plan::BindingDecl>,
) -> KernelSource {
    KernelSource {
        name,
        wgsl,
        workgroup_size: [WG, 1, 1],
        bindings,
        workgroups: [
            rows.count(1, 1),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: WG * 4,
    }
}

/// The reduction of every lane's `s` into `red[0]`, then `let NAME = red[0]`
/// read by every lane (a barrier after the read, so `red` may be reused).
fn reduce_into(name: &str) -> String {
    format!(
        "  red[lane] = s;\n  workgroupBarrier();\n{}\
         \x20 let {name} = red[0];\n  workgroupBarrier();\n",
        tree_reduce(WG, "lane", "0u", "+")
    )
}

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
    let _ = write!(
        w,
        "var<workgroup> red: array<f32, WG>;\n\
         @compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let row = wid.x * H;\n  let lane = lid.x;\n\
         \x20 var s = 0.0f;\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ s = s + x[row + i]; }}\n{sum}\
         \x20 let mean = total / f32(H);\n\
         \x20 s = 0.0f;\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ let d = x[row + i] - mean; s = s + d * d; }}\n{squares}\
         \x20 let inv = 1.0f / sqrt(dev / f32(H) + EPS);\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ y[row + i] = (x[row + i] - mean) * inv * load_w(i) + load_b(i); }}\n}}\n",
        sum = reduce_into("total"),
        squares = reduce_into("dev"),
    );
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
    let _ = write!(
        w,
        "var<workgroup> red: array<f32, WG>;\n\
         @compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let row = wid.x * H;\n  let lane = lid.x;\n\
         \x20 var s = 0.0f;\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ let v = x[row + i]; s = s + v * v; }}\n{squares}\
         \x20 let inv = 1.0f / max(sqrt(total), 1e-12f);\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ y[row + i] = x[row + i] * inv; }}\n}}\n",
        squares = reduce_into("total"),
    );
    per_row(
        format!("l2_normalize_r{}_h{width}", rows.tag()),
        w,
        rows,
        b.finish(),
    )
}

/// `y[t, c] = x[t, c] + table[P + t, c]`, the table stored as `tdtype`.
pub fn add_positions(width: u32, tdtype: DType) -> KernelSource {
    let mut w = prelude();
    let _ = writeln!(w, "const W: u32 = {width}u;\nconst WG: u32 = {WG}u;");
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.weight(&mut w, input(1), "pt", tdtype);
    b.activation(&mut w, output(0), "y");
    w.push_str(
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n\
         \x20 let i = gid.x;\n  if (i >= params.t * W) { return; }\n\
         \x20 y[i] = x[i] + load_pt(params.p * W + i);\n}\n",
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

/// `y[0, c]` = the `pooling` of column `c` over the step's `T` rows.
pub fn pool(pooling: Pooling, width: u32) -> KernelSource {
    let mut w = prelude();
    let _ = writeln!(w, "const W: u32 = {width}u;\nconst WG: u32 = {WG}u;");
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.activation(&mut w, output(0), "y");
    let body = match pooling {
        Pooling::Mean => {
            "  var s = 0.0f;\n  for (var t = 0u; t < params.t; t = t + 1u) { s = s + x[t * W + c]; }\n\
             \x20 y[c] = s / f32(params.t);\n"
        }
        Pooling::Cls => "  y[c] = x[c];\n",
        Pooling::Max => {
            "  var m = x[c];\n  for (var t = 1u; t < params.t; t = t + 1u) { m = max(m, x[t * W + c]); }\n\
             \x20 y[c] = m;\n"
        }
    };
    let _ = write!(
        w,
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n\
         \x20 let c = gid.x;\n  if (c >= W) {{ return; }}\n{body}}}\n"
    );
    KernelSource {
        name: format!("pool_{}_w{width}", pooling.name()),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            WorkgroupCount::fixed(width.div_ceil(WG)),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: 0,
    }
}
