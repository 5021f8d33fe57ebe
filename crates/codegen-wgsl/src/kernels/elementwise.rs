//! Elementwise kernels, one thread per element: unary activations, binary
//! add/mul, the KV-cache write, and the row and column slices.

use super::{
    f32_lit, input, kv_store, kv_tag, output, prelude, split_groups, Bindings, KernelSource,
    Positions, Rows, MAX_WORKGROUPS_PER_DIM,
};
use gerbil_ir::{BinaryOp, DType, UnaryOp};
use gerbil_plan::{BindingDecl, WorkgroupCount};
use std::fmt::Write;

const WG: u32 = 256;

/// The x and y workgroups of a thread per element of `rows` of `width`
/// when x alone cannot hold them (more than 65,535 workgroups, as a
/// gradient of a whole embedding table has); `None` for a step's rows
/// (their count is checked against the limit at compile time) or a count x
/// holds.
fn fixed_split(rows: Rows, width: u32) -> Option<(u32, u32)> {
    let Rows::Fixed(n) = rows else {
        return None;
    };
    let groups = (u64::from(n) * u64::from(width)).div_ceil(u64::from(WG));
    (groups > u64::from(MAX_WORKGROUPS_PER_DIM))
        .then(|| split_groups(u32::try_from(groups).unwrap_or(u32::MAX)))
}

/// A kernel of a thread per element of `rows` rows of `width`, whose entry
/// [`entry`] made (a kernel with an entry of its own takes a step's rows).
pub(crate) fn flat(
    name: String,
    wgsl: String,
    rows: Rows,
    width: u32,
    bindings: Vec<BindingDecl>,
) -> KernelSource {
    let workgroups = match fixed_split(rows, width) {
        Some((gx, gy)) => [
            WorkgroupCount::fixed(gx),
            WorkgroupCount::fixed(gy),
            WorkgroupCount::fixed(1),
        ],
        None => [
            rows.count(width, WG),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
    };
    KernelSource {
        name,
        wgsl,
        workgroup_size: [WG, 1, 1],
        bindings,
        workgroups,
        workgroup_bytes: 0,
    }
}

fn header(width: u32) -> String {
    let mut w = prelude();
    let _ = writeln!(w, "const W: u32 = {width}u;");
    w
}

/// The entry of a thread per element `i` of `rows` of `width` running
/// `body` (`W`, the width, declared by the caller).
pub(crate) fn entry(rows: Rows, width: u32, body: &str) -> String {
    let index = match fixed_split(rows, width) {
        Some((gx, _)) => format!("gid.x + gid.y * {}u", gx * WG),
        None => "gid.x".to_string(),
    };
    format!(
        "@compute @workgroup_size({WG}, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n\
         \x20 let i = {index};\n  if (i >= {rows} * W) {{ return; }}\n{body}}}\n",
        rows = rows.wgsl()
    )
}

/// WGSL expression of a unary function of `v`. `tanh` arguments are clamped
/// to ±15 (where tanh is ±1 in f32) so no backend overflows `exp`. WGSL has
/// no `erf`: exact GELU takes Abramowitz and Stegun's 7.1.26 (absolute error
/// below 1.5e-7, under f32's rounding of the `1 + erf` it feeds).
pub fn unary_expr(op: UnaryOp, v: &str) -> String {
    match op {
        UnaryOp::Gelu => {
            let z = format!("(abs({v}) * 0.7071067811865476f)");
            let t = format!("(1.0f / (1.0f + 0.3275911f * {z}))");
            let poly = format!(
                "(((((1.061405429f * {t} - 1.453152027f) * {t} + 1.421413741f) * {t} - 0.284496736f) * {t} + 0.254829592f) * {t})"
            );
            format!("0.5f * {v} * (1.0f + sign({v}) * (1.0f - {poly} * exp(-{z} * {z})))")
        }
        UnaryOp::Silu => format!("{v} / (1.0f + exp(-{v}))"),
        UnaryOp::GeluTanh => format!(
            "0.5f * {v} * (1.0f + tanh(clamp(0.7978845608028654f * ({v} + 0.044715f * {v} * {v} * {v}), -15.0f, 15.0f)))"
        ),
        UnaryOp::Softcap(c) => format!(
            "tanh(clamp({v} / {c}, -15.0f, 15.0f)) * {c}",
            c = f32_lit(c)
        ),
        UnaryOp::Scale(s) => format!("{v} * {}", f32_lit(s)),
    }
}

fn unary_tag(op: UnaryOp) -> String {
    match op {
        UnaryOp::Silu => "silu".into(),
        UnaryOp::GeluTanh => "gelu_tanh".into(),
        UnaryOp::Gelu => "gelu".into(),
        UnaryOp::Softcap(c) => format!("softcap{}", c.to_bits()),
        UnaryOp::Scale(s) => format!("scale{}", s.to_bits()),
    }
}

/// `y = f(x)`.
pub fn unary(op: UnaryOp, rows: Rows, width: u32) -> KernelSource {
    let mut w = header(width);
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.activation(&mut w, output(0), "y");
    w.push_str(&entry(
        rows,
        width,
        &format!("  let v = x[i];\n  y[i] = {};\n", unary_expr(op, "v")),
    ));
    flat(
        format!("{}_r{}_w{width}", unary_tag(op), rows.tag()),
        w,
        rows,
        width,
        b.finish(),
    )
}

/// `y = a ∘ b`.
pub fn binary(op: BinaryOp, rows: Rows, width: u32) -> KernelSource {
    let mut w = header(width);
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "a");
    b.activation(&mut w, input(1), "b");
    b.activation(&mut w, output(0), "y");
    let (sym, tag) = match op {
        BinaryOp::Add => ("+", "add"),
        BinaryOp::Mul => ("*", "mul"),
    };
    w.push_str(&entry(rows, width, &format!("  y[i] = a[i] {sym} b[i];\n")));
    flat(
        format!("{tag}_r{}_w{width}", rows.tag()),
        w,
        rows,
        width,
        b.finish(),
    )
}

/// `y[r, n] = x[r, n] + b[n]`, the bias of a linear layer.
pub fn add_bias(rows: Rows, width: u32, bdtype: DType) -> KernelSource {
    let mut w = header(width);
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.weight(&mut w, input(1), "b", bdtype);
    b.activation(&mut w, output(0), "y");
    w.push_str(&entry(rows, width, "  y[i] = x[i] + load_b(i % W);\n"));
    flat(
        format!("add_bias_{bdtype}_r{}_w{width}", rows.tag()),
        w,
        rows,
        width,
        b.finish(),
    )
}

/// `cache[P + t] = x[t]` for every row `t` of the step, into a cache stored
/// as `kv`.
pub fn cache_write(width: u32, kv: DType) -> KernelSource {
    cache_write_at(width, kv, Positions::Step)
}

/// [`cache_write`] for rows at `at`: row `t` into its own cache row.
pub fn cache_write_at(width: u32, kv: DType, at: Positions) -> KernelSource {
    let mut w = header(width);
    let mut b = Bindings::new();
    b.kv_cache(&mut w, input(0), "cache", kv, true);
    b.activation(&mut w, input(1), "x");
    at.declare(&mut b, &mut w);
    let body = match at {
        Positions::Step => format!("  cache[params.p * W + i] = {};\n", kv_store(kv, "x[i]")),
        Positions::Table | Positions::Packed => format!(
            "  cache[{} * W + i % W] = {};\n",
            at.cache_row("i / W"),
            kv_store(kv, "x[i]")
        ),
    };
    w.push_str(&entry(Rows::Tokens, width, &body));
    flat(
        format!("cache_write_w{width}{}{}", kv_tag(kv), at.tag()),
        w,
        Rows::Tokens,
        width,
        b.finish(),
    )
}

/// `y[0] = x[T - 1]`.
pub fn slice_last_row(width: u32) -> KernelSource {
    let mut w = header(width);
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.activation(&mut w, output(0), "y");
    w.push_str(&entry(
        Rows::Fixed(1),
        width,
        "  y[i] = x[(params.t - 1u) * W + i];\n",
    ));
    flat(
        format!("slice_last_row_w{width}"),
        w,
        Rows::Fixed(1),
        width,
        b.finish(),
    )
}

/// `y[r, c] = x[r, start + c]` for `c < len`, from rows of `width`.
pub fn slice_cols(rows: Rows, width: u32, start: u32, len: u32) -> KernelSource {
    let mut w = header(len);
    let _ = writeln!(w, "const XW: u32 = {width}u;\nconst START: u32 = {start}u;");
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.activation(&mut w, output(0), "y");
    w.push_str(&entry(
        rows,
        len,
        "  let r = i / W;\n  let c = i % W;\n  y[i] = x[r * XW + START + c];\n",
    ));
    flat(
        format!("slice_cols_r{}_w{width}_c{start}_{len}", rows.tag()),
        w,
        rows,
        len,
        b.finish(),
    )
}
