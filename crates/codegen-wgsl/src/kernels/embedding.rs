//! `embedding`: `y[t, h] = table[ids[t], h] · scale`, one thread per element.
//! Ids outside the vocabulary read row 0 (the runtime rejects them first).
//! A table larger than one binding arrives as row shards; the id picks one.

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
    /// Table rows per shard when split over several bindings; `None` for one.
    pub shard_rows: Option<u32>,
}

/// Builds the kernel.
pub fn kernel(s: EmbeddingSpec) -> KernelSource {
    let starts: Vec<u32> = match s.shard_rows {
        Some(r) if r > 0 && r < s.vocab => (0..s.vocab.div_ceil(r)).map(|i| i * r).collect(),
        _ => vec![0],
    };
    let names: Vec<String> = if starts.len() == 1 {
        vec!["table".into()]
    } else {
        (0..starts.len()).map(|i| format!("table{i}")).collect()
    };
    let mut w = prelude();
    let _ = writeln!(
        w,
        "const V: u32 = {}u;\nconst H: u32 = {}u;",
        s.vocab, s.width
    );
    for (i, name) in names.iter().enumerate() {
        weight_binding(&mut w, 1 + i as u32, name, s.wdtype);
    }
    let ids = 1 + names.len();
    let _ = writeln!(
        w,
        "@group(0) @binding({ids}) var<storage, read> ids: array<u32>;"
    );
    let _ = writeln!(
        w,
        "@group(0) @binding({}) var<storage, read_write> y: array<f32>;",
        ids + 1
    );
    let scale = s
        .scale
        .map(|v| format!(" * {}", f32_lit(v)))
        .unwrap_or_default();
    let mut lookup = String::from("  var v = 0.0f;\n");
    for (i, (name, start)) in names.iter().zip(&starts).enumerate() {
        let read = format!("v = load_{name}((id - {start}u) * H + i % H);");
        match starts.get(i + 1) {
            Some(end) if i == 0 => lookup += &format!("  if (id < {end}u) {{ {read} }}"),
            Some(end) => lookup += &format!(" else if (id < {end}u) {{ {read} }}"),
            None if i == 0 => lookup += &format!("  {read}\n"),
            None => lookup += &format!(" else {{ {read} }}\n"),
        }
    }
    let _ = write!(
        w,
        "@compute @workgroup_size({WG}, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n\
         \x20 let i = gid.x;\n  if (i >= params.t * H) {{ return; }}\n\
         \x20 var id = ids[i / H];\n  if (id >= V) {{ id = 0u; }}\n\
         {lookup}\
         \x20 y[i] = v{scale};\n}}\n"
    );
    let mut decls = vec![BindingDecl::Uniform];
    decls.extend(std::iter::repeat_n(
        BindingDecl::StorageRead,
        names.len() + 1,
    ));
    decls.push(BindingDecl::StorageReadWrite);
    KernelSource {
        name: format!(
            "embedding_{}_v{}_h{}{}{}",
            s.wdtype,
            s.vocab,
            s.width,
            if s.scale.is_some() { "_scaled" } else { "" },
            if names.len() > 1 {
                format!("_shards{}", names.len())
            } else {
                String::new()
            }
        ),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: decls,
        workgroups: [
            Rows::Tokens.count(s.width, WG),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: 0,
    }
}
