//! `rms_norm`: `y = x / sqrt(mean(x²) + eps) · (w + offset)` per row; one
//! workgroup per row, sum of squares reduced in workgroup memory.
//!
//! A grouped norm (per-head q/k norm: `groups` slices of `width` in each
//! activation row) is the same kernel over `rows · groups` rows of `width`:
//! the slices are contiguous, so only the workgroup count changes.
//!
//! [`add_kernel`] is the residual form (`add_rms_norm`): it adds two rows,
//! writes the sum (the new residual stream) and normalizes it in the same
//! dispatch. [`add_after_kernel`] is the other order (`rms_norm_add`, the
//! sandwich layers' post-norms): it normalizes a row and adds it to the
//! residual stream.

use super::{f32_lit, input, output, prelude, tree_reduce, Bindings, KernelSource, Rows};
use gerbil_ir::DType;
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

const WG: u32 = 256;

/// Specialization of an RMSNorm kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNormSpec {
    /// Rows.
    pub rows: Rows,
    /// Width of one normalized group (the whole row when `groups` is 1).
    pub width: u32,
    /// Groups per activation row; the kernel runs `rows · groups` groups.
    pub groups: u32,
    /// Epsilon.
    pub eps: f32,
    /// Added to the weight (Gemma: 1).
    pub offset: f32,
    /// Weight dtype.
    pub wdtype: DType,
}

/// The module prelude with the norm's constants `H`, `EPS`, `OFFSET`, `WG`.
fn header(s: &RmsNormSpec) -> String {
    let mut w = prelude();
    let _ = writeln!(
        w,
        "const H: u32 = {h}u;\nconst EPS: f32 = {eps};\nconst OFFSET: f32 = {off};\nconst WG: u32 = {WG}u;",
        h = s.width,
        eps = f32_lit(s.eps),
        off = f32_lit(s.offset)
    );
    w
}

/// Builds the kernel.
pub fn kernel(s: RmsNormSpec) -> KernelSource {
    build(s, false)
}

/// Builds the norm-then-residual kernel (`rms_norm_add`, `groups` must be
/// 1): bindings `x`, `w`, `r`, then `y = r + rms_norm(x)`.
pub fn add_after_kernel(s: RmsNormSpec) -> KernelSource {
    build(s, true)
}

fn build(s: RmsNormSpec, residual: bool) -> KernelSource {
    let mut w = header(&s);
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.weight(&mut w, input(1), "w", s.wdtype);
    let store = if residual {
        b.activation(&mut w, input(2), "r");
        "y[row * H + i] = r[row * H + i] + (x[row * H + i] * inv) * (load_w(i) + OFFSET);"
    } else {
        "y[row * H + i] = (x[row * H + i] * inv) * (load_w(i) + OFFSET);"
    };
    b.activation(&mut w, output(0), "y");
    let _ = write!(
        w,
        "var<workgroup> red: array<f32, WG>;\n\
         @compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let row = wid.x;\n  let lane = lid.x;\n\
         \x20 var s = 0.0f;\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ let v = x[row * H + i]; s = s + v * v; }}\n\
         \x20 red[lane] = s;\n  workgroupBarrier();\n{reduce}\
         \x20 let inv = 1.0f / sqrt(red[0] / f32(H) + EPS);\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ {store} }}\n}}\n",
        reduce = tree_reduce(WG, "lane", "0u", "+")
    );
    let kind = if residual { "rms_norm_add" } else { "rms_norm" };
    KernelSource {
        name: if s.groups == 1 {
            format!("{kind}_{}_r{}_h{}", s.wdtype, s.rows.tag(), s.width)
        } else {
            format!(
                "rms_norm_{}_r{}_g{}_h{}",
                s.wdtype,
                s.rows.tag(),
                s.groups,
                s.width
            )
        },
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            s.rows.count(s.groups, 1),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: WG * 4,
    }
}

/// Builds the residual-add-then-norm kernel (`groups` must be 1): bindings
/// `a`, `b`, `w`, then the outputs `sum = a + b` and `y = rms_norm(sum)`.
pub fn add_kernel(s: RmsNormSpec) -> KernelSource {
    add_kernel_rows(s, false)
}

/// [`add_kernel`] on the step's last row only: reads row `T - 1` of `a` and
/// `b`, writes one row of each output (`s.rows` must be `Fixed(1)`).
pub fn add_kernel_last_row(s: RmsNormSpec) -> KernelSource {
    add_kernel_rows(s, true)
}

fn add_kernel_rows(s: RmsNormSpec, last_row: bool) -> KernelSource {
    let src_row = if last_row { "(params.t - 1u)" } else { "row" };
    let mut w = header(&s);
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "a");
    b.activation(&mut w, input(1), "b");
    b.weight(&mut w, input(2), "w", s.wdtype);
    b.activation(&mut w, output(0), "sum");
    b.activation(&mut w, output(1), "y");
    let _ = write!(
        w,
        "var<workgroup> red: array<f32, WG>;\n\
         @compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let row = wid.x;\n  let lane = lid.x;\n\
         \x20 var s = 0.0f;\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{\n\
         \x20   let v = a[{src_row} * H + i] + b[{src_row} * H + i];\n    sum[row * H + i] = v;\n    s = s + v * v;\n  }}\n\
         \x20 red[lane] = s;\n  workgroupBarrier();\n{reduce}\
         \x20 let inv = 1.0f / sqrt(red[0] / f32(H) + EPS);\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{\n\
         \x20   let v = a[{src_row} * H + i] + b[{src_row} * H + i];\n\
         \x20   y[row * H + i] = (v * inv) * (load_w(i) + OFFSET);\n  }}\n}}\n",
        reduce = tree_reduce(WG, "lane", "0u", "+")
    );
    KernelSource {
        name: format!(
            "add_rms_norm{}_{}_r{}_h{}",
            if last_row { "_last_row" } else { "" },
            s.wdtype,
            s.rows.tag(),
            s.width
        ),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            s.rows.count(1, 1),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: WG * 4,
    }
}
