//! `rope`: rotate-half rotary embedding at positions `P + t`, reading a
//! precomputed `[Lmax, rotary_dim]` table (cos then sin of each frequency).
//! One thread per (row, head, pair); dimensions past `rotary_dim` are copied.

use super::{input, output, prelude, Bindings, KernelSource, Positions, Rows};
use gerbil_plan::WorkgroupCount;
use std::fmt::Write;

const WG: u32 = 64;

/// Specialization of a rope kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeSpec {
    /// Heads per row.
    pub heads: u32,
    /// Head width.
    pub head_dim: u32,
    /// Rotated leading dimensions of each head.
    pub rotary_dim: u32,
}

/// Builds the kernel.
pub fn kernel(s: RopeSpec) -> KernelSource {
    kernel_at(s, Positions::Step)
}

/// Builds the kernel for rows at `at`.
pub fn kernel_at(s: RopeSpec, at: Positions) -> KernelSource {
    rotation(s, at, false)
}

/// The backward of [`kernel`] (`rope_grad`): each pair of the output's
/// gradient turned back by its angle, the pass-through dimensions copied.
pub fn backward(s: RopeSpec, at: Positions) -> KernelSource {
    rotation(s, at, true)
}

/// The rotation by each position's angles, or with `inverse` by their
/// negatives.
fn rotation(s: RopeSpec, at: Positions, inverse: bool) -> KernelSource {
    let mut w = prelude();
    let half = s.rotary_dim / 2;
    // Each thread handles one pair (i, i + half) or one pass-through dim.
    let per_head = half + (s.head_dim - s.rotary_dim);
    let _ = writeln!(
        w,
        "const NH: u32 = {}u;\nconst HD: u32 = {}u;\nconst ROT: u32 = {}u;\nconst HALF: u32 = {half}u;\nconst PER_HEAD: u32 = {per_head}u;",
        s.heads, s.head_dim, s.rotary_dim
    );
    let mut b = Bindings::new();
    b.activation(&mut w, input(0), "x");
    b.read_f32(&mut w, input(1), "table");
    b.activation(&mut w, output(0), "y");
    at.declare(&mut b, &mut w);
    let _ = write!(
        w,
        "@compute @workgroup_size({WG}, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n\
         \x20 let i = gid.x;\n  if (i >= params.t * NH * PER_HEAD) {{ return; }}\n\
         \x20 let t = i / (NH * PER_HEAD);\n  let h = (i / PER_HEAD) % NH;\n  let j = i % PER_HEAD;\n\
         \x20 let base = (t * NH + h) * HD;\n\
         \x20 if (j < HALF) {{\n\
         \x20   let row = {pos} * ROT;\n\
         \x20   let c = table[row + j];\n    let s = {sign}table[row + HALF + j];\n\
         \x20   let a = x[base + j];\n    let b = x[base + j + HALF];\n\
         \x20   y[base + j] = a * c - b * s;\n    y[base + j + HALF] = b * c + a * s;\n\
         \x20 }} else {{\n\
         \x20   let d = ROT + (j - HALF);\n    y[base + d] = x[base + d];\n  }}\n}}\n",
        pos = at.pos("t"),
        sign = if inverse { "-" } else { "" },
    );
    KernelSource {
        name: format!(
            "{}_h{}_d{}_r{}{}",
            if inverse { "rope_grad" } else { "rope" },
            s.heads,
            s.head_dim,
            s.rotary_dim,
            at.tag()
        ),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            Rows::Tokens.count(s.heads * per_head, WG),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: 0,
    }
}
