//! `embedding`: `y[t, h] = table[ids[t], h] · scale`, one thread per element.
//! Ids outside the vocabulary read row 0 (the runtime rejects them first).

use super::{f32_lit, prelude, weight_binding, KernelSource, Rows};
use gerbil_ir::DType;
use gerbil_plan::{BindingDecl, WorkgroupCount};
use std::fmt::Write;

const WG: u32 = 256;

/// Specialization of an embedding kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EmbeddingSpec {
    /// Vocabulary size.
    pub vocab: u32,
    /// Row width.
    pub width: u32,
    /// Table dtype.
    pub wdtype: DType,
    /// Multiplier, if any.
    pub scale: Option<f32>,
}

/// Builds the kernel.
pub fn kernel(s: EmbeddingSpec) -> KernelSource {
    let mut w = prelude();
    let _ = writeln!(
        w,
        "const V: u32 = {}u;\nconst H: u32 = {}u;",
        s.vocab, s.width
    );
    weight_binding(&mut w, 1, "table", s.wdtype);
    let _ = writeln!(
        w,
        "@group(0) @binding(2) var<storage, read> ids: array<u32>;"
    );
    let _ = writeln!(
        w,
        "@group(0) @binding(3) var<storage, read_write> y: array<f32>;"
    );
    let scale = s
        .scale
        .map(|v| format!(" * {}", f32_lit(v)))
        .unwrap_or_default();
    let _ = write!(
        w,
        "@compute @workgroup_size({WG}, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n\
         \x20 let i = gid.x;\n  if (i >= params.t * H) {{ return; }}\n\
         \x20 var id = ids[i / H];\n  if (id >= V) {{ id = 0u; }}\n\
         \x20 y[i] = load_table(id * H + i % H){scale};\n}}\n"
    );
    KernelSource {
        name: format!(
            "embedding_{}_v{}_h{}{}",
            s.wdtype,
            s.vocab,
            s.width,
            if s.scale.is_some() { "_scaled" } else { "" }
        ),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: vec![
            BindingDecl::Uniform,
            BindingDecl::StorageRead,
            BindingDecl::StorageRead,
            BindingDecl::StorageReadWrite,
        ],
        workgroups: [
            Rows::Tokens.count(s.width, WG),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: 0,
    }
}
