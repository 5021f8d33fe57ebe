//! `embedding`: `y[t, h] = table[ids[t], h] · scale`, one thread per element;
//! and `embedding_rms_norm`, the lookup fused with the RMSNorm after it (one
//! workgroup per row, writing the row and its normalized form).
//! Ids outside the vocabulary read row 0 (the runtime rejects them first).
//! A table larger than one binding arrives as row shards; the id picks one.

use super::{
    f32_lit, input, input_shard, output, prelude, tree_reduce, Bindings, KernelSource, Rows,
};
use gerbil_ir::DType;
use gerbil_plan::WorkgroupCount;
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

/// The RMSNorm fused after the lookup.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NormSpec {
    /// Epsilon.
    pub eps: f32,
    /// Added to the weight (Gemma: 1).
    pub offset: f32,
    /// Norm weight dtype.
    pub wdtype: DType,
}

/// Module header shared by both kernels: constants, table (shard) bindings,
/// the ids binding and `fn lookup(id, h) -> f32` (scaled). Returns the
/// source, the bindings so far and the tag for kernel names.
fn header(s: &EmbeddingSpec) -> (String, Bindings, String) {
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
    let mut b = Bindings::new();
    for (i, (name, start)) in names.iter().zip(&starts).enumerate() {
        let rows = starts.get(i + 1).unwrap_or(&s.vocab) - start;
        let values = u64::from(rows) * u64::from(s.width);
        b.matrix(&mut w, input_shard(0, i as u32), name, s.wdtype, values);
    }
    b.ids(&mut w, input(1), "ids");
    let scale = s
        .scale
        .map(|v| format!(" * {}", f32_lit(v)))
        .unwrap_or_default();
    let mut body = String::new();
    for (i, (name, start)) in names.iter().zip(&starts).enumerate() {
        let read = format!("return load_{name}((id - {start}u) * H + h){scale};");
        match starts.get(i + 1) {
            Some(end) => body += &format!("  if (id < {end}u) {{ {read} }}\n"),
            None => body += &format!("  {read}\n"),
        }
    }
    let _ = writeln!(w, "fn lookup(id: u32, h: u32) -> f32 {{\n{body}}}");
    let tag = format!(
        "{}_v{}_h{}{}{}",
        s.wdtype,
        s.vocab,
        s.width,
        if s.scale.is_some() { "_scaled" } else { "" },
        if names.len() > 1 {
            format!("_shards{}", names.len())
        } else {
            String::new()
        }
    );
    (w, b, tag)
}

/// Builds the lookup kernel.
pub fn kernel(s: EmbeddingSpec) -> KernelSource {
    let (mut w, mut b, tag) = header(&s);
    b.activation(&mut w, output(0), "y");
    let _ = write!(
        w,
        "@compute @workgroup_size({WG}, 1, 1)\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n\
         \x20 let i = gid.x;\n  if (i >= params.t * H) {{ return; }}\n\
         \x20 var id = ids[i / H];\n  if (id >= V) {{ id = 0u; }}\n\
         \x20 y[i] = lookup(id, i % H);\n}}\n"
    );
    KernelSource {
        name: format!("embedding_{tag}"),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            Rows::Tokens.count(s.width, WG),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: 0,
    }
}

/// Builds the lookup fused with an RMSNorm: bindings are the table (shards),
/// ids, norm weight, then `x` (the looked-up rows) and `y` (normalized).
pub fn kernel_with_norm(s: EmbeddingSpec, n: NormSpec) -> KernelSource {
    let (mut w, mut b, tag) = header(&s);
    b.weight(&mut w, input(2), "w", n.wdtype);
    b.activation(&mut w, output(0), "x");
    b.activation(&mut w, output(1), "y");
    let _ = writeln!(
        w,
        "const EPS: f32 = {};\nconst OFFSET: f32 = {};\nconst WG: u32 = {WG}u;",
        f32_lit(n.eps),
        f32_lit(n.offset)
    );
    let _ = write!(
        w,
        "var<workgroup> red: array<f32, WG>;\n\
         @compute @workgroup_size(WG, 1, 1)\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20 let row = wid.x;\n  let lane = lid.x;\n\
         \x20 var id = ids[row];\n  if (id >= V) {{ id = 0u; }}\n\
         \x20 var s = 0.0f;\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ let v = lookup(id, i); x[row * H + i] = v; s = s + v * v; }}\n\
         \x20 red[lane] = s;\n  workgroupBarrier();\n{reduce}\
         \x20 let inv = 1.0f / sqrt(red[0] / f32(H) + EPS);\n\
         \x20 for (var i = lane; i < H; i = i + WG) {{ y[row * H + i] = (lookup(id, i) * inv) * (load_w(i) + OFFSET); }}\n}}\n",
        reduce = tree_reduce(WG, "lane", "0u", "+")
    );
    KernelSource {
        name: format!("embedding_rms_norm_{tag}_w{}", n.wdtype),
        wgsl: w,
        workgroup_size: [WG, 1, 1],
        bindings: b.finish(),
        workgroups: [
            Rows::Tokens.count(1, 1),
            WorkgroupCount::fixed(1),
            WorkgroupCount::fixed(1),
        ],
        workgroup_bytes: WG * 4,
    }
}
