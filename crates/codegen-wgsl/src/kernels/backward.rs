//! Kernels of a training step's loss and backward ops (`gerbil_ir::TrainOp`),
//! in f32: the mean cross-entropy and its gradient, the activations'
//! derivatives, a matmul's input and weight gradients, column sums, the
//! rows a cache write wrote, and the norm's backward. (RoPE's backward is
//! [`super::rope::backward`].) Each is the plainest kernel that is right —
//! a thread per output element, or a workgroup per row where a row is
//! reduced — and checked against `gerbil_interp::gradient` on random
//! inputs; speed comes later, measured.
//!
//! The surprise: [`rms_norm_grad`] is one dispatch with two jobs. Its
//! weight gradient sums over every row, which no row's workgroup can do
//! alone, so a second row of workgroups (`workgroup_id.y == 1`) walks
//! column chunks through all the rows, recomputing each row's `1/rms`
//! (a reduction over a row is cheap next to the matmuls around it).

use super::rowwise::{per_row, reduce_into, row_main, WG};
use super::{
    f32_lit, input, output, prelude, split_groups, tree_reduce, Bindings, KernelSource, Rows,
};
use gerbil_ir::{DType, RmsNorm, UnaryOp};
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

/// The most negative finite f32: the start of a row's maximum.
const LOWEST: &str = "-3.4028235e38f";

/// The `max` reduction of every lane's `s` into `let NAME`, as
/// [`reduce_into`] does the sum.
fn max_into(name: &str) -> String {
    format!(
        "  red[lane] = s;\n  workgroupBarrier();\n{}\
         \x20 let {name} = red[0];\n  workgroupBarrier();\n",
        tree_reduce(WG, "lane", "0u", "max")
    )
}

/// A row's maximum `m` and `total = Σ exp(x − m)` over `H` values of
/// `x[row + i]`.
fn softmax_stats() -> String {
    format!(
        "  s = {LOWEST};\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ s = max(s, x[row + i]); }}\n{max}\
         \x20 s = 0.0f;\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ s = s + exp(x[row + i] - m); }}\n{sum}",
        max = max_into("m"),
        sum = reduce_into("total"),
    )
}

fn header(consts: &str) -> String {
    let mut w = prelude();
    let _ = writeln!(w, "{consts}const WG: u32 = {WG}u;");
    w
}

/// `loss[0]`: the mean over the step's rows of `logsumexp(x[r]) −
/// x[r][target[r]]`, `vocab` columns. One workgroup walks the rows.
pub fn cross_entropy(vocab: u32) -> KernelSource {
    let mut w = header(&format!("const H: u32 = {vocab}u;\n"));
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.ids(&mut w, input(1), "targets");
    b.activation(&mut w, output(0), "loss");
    w.push_str(&row_main(&format!(
        "  var sum = 0.0f;\n\
         \x20 for (var r = 0u; r < params.t; r = r + 1u) {{\n\
         \x20 let row = r * H;\n{stats}\
         \x20 sum = sum + m + log(total) - x[row + min(targets[r], H - 1u)];\n\
         \x20 }}\n\
         \x20 if (lane == 0u) {{ loss[0] = sum / f32(params.t); }}\n",
        stats = softmax_stats(),
    )));
    KernelSource {
        name: format!("cross_entropy_v{vocab}"),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [WorkgroupCount::fixed(1); 3],
        workgroup_bytes: WG * 4,
    }
}

/// `dx[r] = (softmax(x[r]) − onehot(target[r])) / T`, a workgroup per row.
pub fn cross_entropy_grad(vocab: u32) -> KernelSource {
    let mut w = header(&format!("const H: u32 = {vocab}u;\n"));
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.ids(&mut w, input(1), "targets");
    b.activation(&mut w, output(0), "dx");
    w.push_str(&row_main(&format!(
        "{stats}\
         \x20 let hot = min(targets[row / H], H - 1u);\n\
         \x20 let scale = 1.0f / (total * f32(params.t));\n\
         \x20 let inv_rows = 1.0f / f32(params.t);\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{\n\
         \x20   dx[row + i] = exp(x[row + i] - m) * scale - select(0.0f, inv_rows, i == hot);\n  }}\n",
        stats = softmax_stats(),
    )));
    per_row(
        format!("cross_entropy_grad_v{vocab}"),
        w,
        Rows::Tokens,
        b.finish(),
    )
}

/// WGSL for the derivative of `op` at `v`, with the forward's clamps.
fn derivative(op: UnaryOp, v: &str) -> String {
    let tanh = |arg: String| format!("tanh(clamp({arg}, -15.0f, 15.0f))");
    match op {
        UnaryOp::Silu => {
            format!(
                "(1.0f / (1.0f + exp(-{v}))) * (1.0f + {v} * (1.0f - 1.0f / (1.0f + exp(-{v}))))"
            )
        }
        UnaryOp::GeluTanh => {
            let th = tanh(format!(
                "0.7978845608028654f * ({v} + 0.044715f * {v} * {v} * {v})"
            ));
            format!(
                "(0.5f * (1.0f + {th}) + 0.5f * {v} * (1.0f - {th} * {th}) * 0.7978845608028654f \
                 * (1.0f + 0.134145f * {v} * {v}))"
            )
        }
        UnaryOp::Gelu => {
            // Φ(v) by Abramowitz and Stegun 7.1.26, as the forward's erf.
            let z = format!("(abs({v}) * 0.7071067811865476f)");
            let t = format!("(1.0f / (1.0f + 0.3275911f * {z}))");
            let poly = format!(
                "(((((1.061405429f * {t} - 1.453152027f) * {t} + 1.421413741f) * {t} - 0.284496736f) * {t} + 0.254829592f) * {t})"
            );
            format!(
                "(0.5f * (1.0f + sign({v}) * (1.0f - {poly} * exp(-{z} * {z}))) \
                 + {v} * 0.3989422804014327f * exp(-0.5f * {v} * {v}))"
            )
        }
        UnaryOp::Softcap(c) => {
            let th = tanh(format!("{v} / {}", f32_lit(c)));
            format!("(1.0f - {th} * {th})")
        }
    }
}

/// `dx = dy · f′(x)` of a unary op, `width` columns, a thread per element.
pub fn unary_grad(op: UnaryOp, width: u32) -> KernelSource {
    let mut w = header(&format!("const W: u32 = {width}u;\n"));
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.activation(&mut w, input(1), "dy");
    b.activation(&mut w, output(0), "dx");
    let _ = write!(
        w,
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n\
         \x20 let i = gid.x;\n  if (i >= params.t * W) {{ return; }}\n\
         \x20 let v = x[i];\n  dx[i] = dy[i] * {d};\n}}\n",
        d = derivative(op, "v"),
    );
    let tag = match op {
        UnaryOp::Softcap(c) => format!("softcap{}", c.to_bits()),
        other => gerbil_ir::Op::Unary(other).mnemonic().to_string(),
    };
    KernelSource {
        name: format!("{tag}_grad_w{width}"),
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

/// A thread per element of a constant `count` elements: its workgroups,
/// split over x and y under the per-axis limit, and the WGSL of its index.
fn constant_grid(count: u64) -> ([WorkgroupCount; 3], String) {
    let groups = u32::try_from(count.div_ceil(u64::from(WG))).unwrap_or(u32::MAX);
    let (gx, gy) = split_groups(groups);
    (
        [
            WorkgroupCount::fixed(gx),
            WorkgroupCount::fixed(gy),
            WorkgroupCount::fixed(1),
        ],
        format!("gid.x + gid.y * {}u", gx * WG),
    )
}

/// `y[c] = Σ_r x[r, c]` over the step's rows, `width` columns.
pub fn sum_rows(width: u32) -> KernelSource {
    let mut w = header(&format!("const W: u32 = {width}u;\n"));
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.activation(&mut w, output(0), "y");
    let (workgroups, index) = constant_grid(u64::from(width));
    let _ = write!(
        w,
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n\
         \x20 let c = {index};\n  if (c >= W) {{ return; }}\n\
         \x20 var s = 0.0f;\n\
         \x20 for (var r = 0u; r < params.t; r = r + 1u) {{ s = s + x[r * W + c]; }}\n\
         \x20 y[c] = s;\n}}\n",
    );
    KernelSource {
        name: format!("sum_rows_w{width}"),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups,
        workgroup_bytes: 0,
    }
}

/// `y[t] = cache[P + t]` for the step's rows, `width` columns: the gradient
/// of what `cache_write` wrote, taken from the cache's gradient.
pub fn cache_rows(width: u32) -> KernelSource {
    let mut w = header(&format!("const W: u32 = {width}u;\n"));
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "cache");
    b.activation(&mut w, output(0), "y");
    w.push_str(
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n\
         \x20 let i = gid.x;\n  if (i >= params.t * W) { return; }\n\
         \x20 y[i] = cache[params.p * W + i];\n}\n",
    );
    KernelSource {
        name: format!("cache_rows_w{width}"),
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

/// `dx = dy · w` for `dy` `[T, n]` and the weight `[n, k]` stored as
/// `wdtype`: a matmul's input gradient, a thread per element of `dx`.
pub fn matmul_grad_x(n: u32, k: u32, wdtype: DType) -> KernelSource {
    let mut w = header(&format!("const N: u32 = {n}u;\nconst K: u32 = {k}u;\n"));
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "dy");
    b.weight(&mut w, input(1), "w", wdtype);
    b.activation(&mut w, output(0), "dx");
    w.push_str(
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n\
         \x20 let i = gid.x;\n  if (i >= params.t * K) { return; }\n\
         \x20 let r = i / K;\n  let c = i % K;\n  var s = 0.0f;\n\
         \x20 for (var o = 0u; o < N; o = o + 1u) { s = s + dy[r * N + o] * load_w(o * K + c); }\n\
         \x20 dx[i] = s;\n}\n",
    );
    KernelSource {
        name: format!("matmul_grad_x_{wdtype}_n{n}_k{k}"),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            Rows::Tokens.count(k, WG),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: 0,
    }
}

/// `dw = dyᵀ · x` for `dy` `[T, n]` and `x` `[T, k]`: a matmul's weight
/// gradient `[n, k]`, a thread per element.
pub fn matmul_grad_w(n: u32, k: u32) -> KernelSource {
    let mut w = header(&format!("const N: u32 = {n}u;\nconst K: u32 = {k}u;\n"));
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "dy");
    b.activation(&mut w, input(1), "x");
    b.activation(&mut w, output(0), "dw");
    let (workgroups, index) = constant_grid(u64::from(n) * u64::from(k));
    let _ = write!(
        w,
        "@compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n\
         \x20 let i = {index};\n  if (i >= N * K) {{ return; }}\n\
         \x20 let o = i / K;\n  let c = i % K;\n  var s = 0.0f;\n\
         \x20 for (var r = 0u; r < params.t; r = r + 1u) {{ s = s + dy[r * N + o] * x[r * K + c]; }}\n\
         \x20 dw[i] = s;\n}}\n",
    );
    KernelSource {
        name: format!("matmul_grad_w_n{n}_k{k}"),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups,
        workgroup_bytes: 0,
    }
}

/// The backward of `rms_norm` over rows of `width` in `n.groups` slices,
/// the weight stored as `wdtype`: `(x, w, dy) -> (dx, dw)`. Workgroups
/// `(s, 0)` each take slice `s` of the step's `T · groups` for `dx`;
/// workgroups `(c, 1)` take column chunks of `dw` (see the module docs).
pub fn rms_norm_grad(width: u32, n: &RmsNorm, wdtype: DType) -> KernelSource {
    let g = width / n.groups.max(1);
    let mut w = header(&format!(
        "const W: u32 = {width}u;\nconst G: u32 = {g}u;\nconst GROUPS: u32 = {}u;\n\
         const EPS: f32 = {};\nconst OFFSET: f32 = {};\n",
        n.groups,
        f32_lit(n.eps),
        f32_lit(n.weight_offset),
    ));
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.weight(&mut w, input(1), "w", wdtype);
    b.activation(&mut w, input(2), "dy");
    b.activation(&mut w, output(0), "dx");
    b.activation(&mut w, output(1), "dw");
    let _ = write!(
        w,
        "var<workgroup> red: array<f32, WG>;\n\
         @compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, \
         @builtin(num_workgroups) nwg: vec3<u32>) {{\n\
         \x20 let lane = lid.x;\n  var s = 0.0f;\n\
         \x20 if (wid.y == 0u) {{\n\
         \x20   let base = wid.x * G;\n\
         \x20   for (var i = lane; i < G; i = i + WG) {{ let v = x[base + i]; s = s + v * v; }}\n{squares}\
         \x20   let inv = 1.0f / sqrt(sq / f32(G) + EPS);\n\
         \x20   s = 0.0f;\n\
         \x20   for (var i = lane; i < G; i = i + WG) {{ s = s + dy[base + i] * (load_w(i) + OFFSET) * x[base + i]; }}\n{dots}\
         \x20   let k = inv * inv * inv * gx / f32(G);\n\
         \x20   for (var i = lane; i < G; i = i + WG) {{\n\
         \x20     dx[base + i] = inv * dy[base + i] * (load_w(i) + OFFSET) - x[base + i] * k;\n    }}\n\
         \x20   return;\n  }}\n\
         \x20 for (var c0 = wid.x * WG; c0 < G; c0 = c0 + nwg.x * WG) {{\n\
         \x20   var acc = 0.0f;\n\
         \x20   for (var sl = 0u; sl < params.t * GROUPS; sl = sl + 1u) {{\n\
         \x20     let base = sl * G;\n\
         \x20     s = 0.0f;\n\
         \x20     for (var i = lane; i < G; i = i + WG) {{ let v = x[base + i]; s = s + v * v; }}\n{chunk}\
         \x20     let c = c0 + lane;\n\
         \x20     if (c < G) {{ acc = acc + dy[base + c] * x[base + c] / sqrt(sq2 / f32(G) + EPS); }}\n\
         \x20   }}\n\
         \x20   if (c0 + lane < G) {{ dw[c0 + lane] = acc; }}\n  }}\n}}\n",
        squares = reduce_into("sq"),
        dots = reduce_into("gx"),
        chunk = reduce_into("sq2"),
    );
    KernelSource {
        name: format!(
            "rms_norm_grad_{wdtype}_w{width}_g{}_o{}",
            n.groups,
            n.weight_offset.to_bits()
        ),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            Rows::Tokens.count(n.groups, 1),
            WorkgroupCount::fixed(2),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: WG * 4,
    }
}
