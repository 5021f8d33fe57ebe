//! The frame of the kernels that run one workgroup of [`WG`] threads per
//! row and reduce across the row in workgroup memory (the encoders' norms,
//! the loss and the norm's backward): the launch, the entry point and the
//! reduction.
//!
//! The surprise: every lane reads the reduced value and then meets another
//! barrier, so one `red` array serves every reduction of a kernel in turn.

use super::{tree_reduce, KernelSource, Rows};
use gerbil_plan::WorkgroupCount;

/// Threads of a row's workgroup.
pub(crate) const WG: u32 = 256;

/// One workgroup per row of `rows`.
pub(crate) fn per_row(
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
pub(crate) fn reduce_into(name: &str) -> String {
    format!(
        "  red[lane] = s;\n  workgroupBarrier();\n{}\
         \x20 let {name} = red[0];\n  workgroupBarrier();\n",
        tree_reduce(WG, "lane", "0u", "+")
    )
}

/// The entry point of a one-workgroup-per-row kernel: `red` for the
/// reductions, `row` (the row's first element), `lane` and a zero `s`,
/// then `body`.
pub(crate) fn row_main(body: &str) -> String {
    format!(
        "var<workgroup> red: array<f32, WG>;\n\
         @compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let row = wid.x * H;\n  let lane = lid.x;\n\
         \x20 var s = 0.0f;\n{body}}}\n"
    )
}
