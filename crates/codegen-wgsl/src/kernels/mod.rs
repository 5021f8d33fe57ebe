//! One WGSL template per op, specialized with constants.
//!
//! Every kernel binds the step parameters (`T`, `P`) as a uniform at binding 0
//! and its tensors as storage buffers from binding 1. A template declares each
//! binding through [`Bindings`], which writes the WGSL declaration and records
//! the IR operand ([`Port`]) it stands for in the same call: the binding
//! number, the declaration and the operand cannot drift apart, and the
//! schedule binds buffers by port, not by position. A kernel may also ask for
//! scratch ([`Bindings::scratch`], [`Bindings::counters`]): memory of its
//! own dispatch, not an IR operand, which the schedule places in the plan's
//! one scratch buffer. Templates never assume power-of-two sizes: every loop
//! and store is bounds-checked against the true dimension.

pub mod adamw;
pub mod argmax_rows;
pub mod attention;
pub mod attention_cpu;
pub mod attention_decode;
pub mod backward;
pub mod elementwise;
pub mod embedding;
pub mod encoder;
pub mod gemm;
pub mod gemm_coop;
pub mod gemv;
pub mod gemv_batch;
pub mod gemv_int8;
pub mod grad_coop;
mod linear;
pub mod matmul;
pub mod matmul_cpu;
pub mod qkv_rope;
pub mod quant;
pub mod rms_norm;
pub mod rope;
mod rowwise;
pub mod sample_token;

use gerbil_ir::DType;
use gerbil_plan::{Access, BindingDecl, Elem, Port, WorkgroupCount};
use std::fmt::Write;

/// Most workgroups a dispatch may have along one axis (WebGPU's default limit).
pub const MAX_WORKGROUPS_PER_DIM: u32 = 65_535;

/// A specialized kernel and how to launch it.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelSource {
    /// Descriptive name; unique per specialization.
    pub name: String,
    /// Full WGSL module.
    pub wgsl: String,
    /// `@workgroup_size`.
    pub workgroup_size: [u32; 3],
    /// Binding declarations, binding 0 first (`bytes` still 0 where the
    /// binding is an IR operand: the schedule fills them from the operands
    /// it binds; a scratch binding carries its own).
    pub bindings: Vec<BindingDecl>,
    /// Workgroup counts along x, y, z.
    pub workgroups: [WorkgroupCount; 3],
    /// Bytes of `var<workgroup>` memory.
    pub workgroup_bytes: u32,
}

/// Where the rows of a step sit in their sequences, for the kernels that
/// care (RoPE, cache writes, attention).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Positions {
    /// One sequence: row `t` is at position `P + t`, in KV-cache row `P + t`.
    Step,
    /// A batch of sequences: row `t`'s KV-cache row and position are
    /// `rows[2t]` and `rows[2t + 1]` (the runtime's row table; a cache row is
    /// the sequence's slot times the rows a slot spans, plus its position).
    Table,
    /// A packed step ([`Segments`]: an encoder's, or a training pass):
    /// whole sequences end to end from cache row 0, so row `t` is in cache row `t`, at position `t`
    /// minus its sequence's first row.
    Packed,
}

impl Positions {
    /// Declares the row table when the kernel reads one.
    pub fn declare(self, b: &mut Bindings, out: &mut String) {
        if self != Positions::Step {
            b.rows(out);
        }
    }

    /// WGSL for the position of row `t`.
    pub fn pos(self, t: &str) -> String {
        match self {
            Positions::Step => format!("(params.p + {t})"),
            Positions::Table => format!("rows[2u * ({t}) + 1u]"),
            Positions::Packed => format!("(({t}) - rows[2u * ({t})])"),
        }
    }

    /// WGSL for the KV-cache row of row `t`.
    pub fn cache_row(self, t: &str) -> String {
        match self {
            Positions::Step => format!("(params.p + {t})"),
            Positions::Table => format!("rows[2u * ({t})]"),
            Positions::Packed => format!("({t})"),
        }
    }

    /// What a kernel's name gets: nothing, or `_rows`.
    pub fn tag(self) -> &'static str {
        match self {
            Positions::Step => "",
            Positions::Table => "_rows",
            Positions::Packed => "_packed",
        }
    }
}

/// The segment table of a packed step (an encoder's, a training pass's):
/// the step's `T` rows are
/// whole sequences laid end to end (at position 0, so cache row = row).
/// Entries `2t` and `2t + 1` give row `t`'s sequence's first row and length;
/// after the `T` rows' pairs, sequence `b`'s first row and length (zero
/// length past the step's sequences, up to the plan's `max_batch`). The
/// runtime writes it into the plan's step-rows buffer before each step (a
/// trainer once: every pass packs the same lengths).
pub struct Segments;

impl Segments {
    /// Declares the table and its readers: `seq_start(t)` and `seq_end(t)`
    /// (one past the last row) of row `t`'s sequence, and `seq_first(b)` and
    /// `seq_len(b)` of sequence `b`.
    pub fn declare(b: &mut Bindings, out: &mut String) {
        b.rows(out);
        out.push_str(
            "fn seq_start(t: u32) -> u32 { return rows[2u * t]; }\n\
             fn seq_end(t: u32) -> u32 { return rows[2u * t] + rows[2u * t + 1u]; }\n\
             fn seq_first(b: u32) -> u32 { return rows[2u * (params.t + b)]; }\n\
             fn seq_len(b: u32) -> u32 { return rows[2u * (params.t + b) + 1u]; }\n",
        );
    }
}

/// Row count of an operand: a constant or the step's `T`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// `T` rows (read from the step parameters).
    Tokens,
    /// A fixed number of rows.
    Fixed(u32),
}

impl Rows {
    /// WGSL expression for the row count.
    pub fn wgsl(self) -> String {
        match self {
            Rows::Tokens => "params.t".to_string(),
            Rows::Fixed(n) => format!("{n}u"),
        }
    }

    /// Workgroup count of `ceil(rows · per_row / divisor)`.
    pub fn count(self, per_row: u32, divisor: u32) -> WorkgroupCount {
        match self {
            Rows::Tokens => WorkgroupCount::per_token(per_row, 0, divisor),
            Rows::Fixed(n) => WorkgroupCount::fixed((n * per_row).div_ceil(divisor)),
        }
    }

    /// Short tag for kernel names.
    pub fn tag(self) -> String {
        match self {
            Rows::Tokens => "T".to_string(),
            Rows::Fixed(n) => n.to_string(),
        }
    }
}

/// A WGSL f32 literal that round-trips exactly.
pub fn f32_lit(v: f32) -> String {
    format!("{v:?}f")
}

/// The common module header: the step-parameter struct and its binding.
pub fn prelude() -> String {
    "struct Params { t: u32, p: u32, pad0: u32, pad1: u32 }\n\
     @group(0) @binding(0) var<uniform> params: Params;\n"
        .to_string()
}

/// Declares a storage binding of f32 elements.
fn f32_binding(out: &mut String, binding: u32, name: &str, writable: bool) {
    let access = if writable { "read_write" } else { "read" };
    let _ = writeln!(
        out,
        "@group(0) @binding({binding}) var<storage, {access}> {name}: array<f32>;"
    );
}

/// Input port `index` of the op (a whole buffer, or shard 0).
pub fn input(index: u32) -> Port {
    Port::Input { index, shard: 0 }
}

/// Row shard `shard` of input port `index`.
pub fn input_shard(index: u32, shard: u32) -> Port {
    Port::Input { index, shard }
}

/// Output port `index` of the op.
pub fn output(index: u32) -> Port {
    Port::Output { index }
}

/// A kernel's bindings in binding order, each declared in WGSL and tied to
/// the IR operand it binds. Binding 0 is the step-parameter uniform of
/// [`prelude`].
pub struct Bindings {
    decls: Vec<BindingDecl>,
}

impl Default for Bindings {
    fn default() -> Self {
        Bindings::new()
    }
}

impl Bindings {
    /// Binding 0, the step parameters, already declared by [`prelude`].
    pub fn new() -> Self {
        Bindings {
            decls: vec![BindingDecl {
                name: "params".into(),
                port: Port::Params,
                access: Access::Uniform,
                elem: Elem::U32,
                bytes: 0,
            }],
        }
    }

    fn push(&mut self, name: &str, port: Port, access: Access, elem: Elem) -> u32 {
        self.decls.push(BindingDecl {
            name: name.to_string(),
            port,
            access,
            elem,
            bytes: 0,
        });
        (self.decls.len() - 1) as u32
    }

    /// An f32 activation, `read_write`: activations share arena buffers, and
    /// WebGPU lets one buffer be bound several times in a dispatch only if
    /// every binding is writable storage. Also a cache written in place.
    pub fn activation(&mut self, out: &mut String, port: Port, name: &str) {
        let n = self.push(name, port, Access::ReadWrite, Elem::F32);
        f32_binding(out, n, name, true);
    }

    /// An f32 tensor only read, in a buffer of its own: a RoPE table, or a
    /// KV cache as attention reads it.
    pub fn read_f32(&mut self, out: &mut String, port: Port, name: &str) {
        let n = self.push(name, port, Access::Read, Elem::F32);
        f32_binding(out, n, name, false);
    }

    /// A KV cache stored as `kv` (f32, or f16 in an f16 variant):
    /// `array<f32>` or `array<f16>`, `read_write` when the kernel writes it.
    /// Read through [`kv_load`], written through [`kv_store`].
    pub fn kv_cache(
        &mut self,
        out: &mut String,
        port: Port,
        name: &str,
        kv: DType,
        writable: bool,
    ) {
        if kv == DType::F16 {
            self.vectors(out, port, name, DType::F16, writable, "f16");
            enable_f16(out);
        } else {
            self.vectors(out, port, name, DType::F32, writable, "f32");
        }
    }

    /// The batch step's row table ([`Port::Rows`]) as `rows: array<u32>`.
    pub fn rows(&mut self, out: &mut String) {
        // Positions and the segment table both read it: bound once.
        if self.decls.iter().any(|d| d.port == Port::Rows) {
            return;
        }
        let n = self.push("rows", Port::Rows, Access::Read, Elem::U32);
        let _ = writeln!(
            out,
            "@group(0) @binding({n}) var<storage, read> rows: array<u32>;"
        );
    }

    /// Token ids, `array<u32>`, read.
    pub fn ids(&mut self, out: &mut String, port: Port, name: &str) {
        let n = self.push(name, port, Access::Read, Elem::U32);
        let _ = writeln!(
            out,
            "@group(0) @binding({n}) var<storage, read> {name}: array<u32>;"
        );
    }

    /// The sampling-parameter uniform ([`Port::Sampling`]) as `NAME` of
    /// struct `Sampling` (seed words, temperature, top-k, top-p, min-p).
    pub fn sampling(&mut self, out: &mut String, name: &str) {
        let n = self.push(name, Port::Sampling, Access::Uniform, Elem::U32);
        let _ = writeln!(
            out,
            "{}\n@group(0) @binding({n}) var<uniform> {name}: Sampling;",
            gerbil_plan::sampling::SamplingUniform::wgsl_struct()
        );
    }

    /// Token ids, `array<u32>`, written (a chosen next token).
    pub fn ids_out(&mut self, out: &mut String, port: Port, name: &str) {
        let n = self.push(name, port, Access::ReadWrite, Elem::U32);
        let _ = writeln!(
            out,
            "@group(0) @binding({n}) var<storage, read_write> {name}: array<u32>;"
        );
    }
    /// Working memory of this dispatch alone, `array<f32>` of `bytes` bytes
    /// in the plan's scratch buffer ([`Port::Scratch`]): undefined on entry,
    /// so a kernel reads only what it wrote in the same dispatch.
    pub fn scratch(&mut self, out: &mut String, name: &str, bytes: u64) {
        let n = self.push(name, Port::Scratch, Access::ReadWrite, Elem::F32);
        self.decls[n as usize].bytes = bytes;
        f32_binding(out, n, name, true);
    }

    /// `count` counters, `array<atomic<u32>>`, in the plan's scratch buffer
    /// ([`Port::Counters`]): zero on entry, and the kernel must leave them zero.
    pub fn counters(&mut self, out: &mut String, name: &str, count: u32) {
        let n = self.push(name, Port::Counters, Access::ReadWrite, Elem::U32);
        self.decls[n as usize].bytes = 4 * u64::from(count);
        let _ = writeln!(
            out,
            "@group(0) @binding({n}) var<storage, read_write> {name}: array<atomic<u32>>;"
        );
    }

    /// A weight of `dtype`, with `load_NAME(i) -> f32` and (packed dtypes) `pair_NAME(word)` loaders.
    /// A matrix that may be quantized is bound through [`Bindings::matrix`],
    /// which knows its size: the lowering gives quantized weights only to
    /// matmuls and embeddings, which do.
    pub fn weight(&mut self, out: &mut String, port: Port, name: &str, dtype: DType) {
        if dtype.is_quantized() {
            return quant::declare(self, out, port, name, dtype, 0);
        }
        let n = self.push(name, port, Access::Read, elem_of(dtype));
        weight_binding(out, n, name, dtype);
    }

    /// [`Bindings::weight`] of a matrix of `values` values, which may be
    /// quantized ([`quant::declare`]: its layout depends on its size).
    pub fn matrix(&mut self, out: &mut String, port: Port, name: &str, dtype: DType, values: u64) {
        if dtype.is_quantized() {
            quant::declare(self, out, port, name, dtype, values);
        } else {
            self.weight(out, port, name, dtype);
        }
    }

    /// A tensor of `dtype` declared as `array<{array_of}>` (e.g. `vec4<u32>`,
    /// eight packed 16-bit values per load) with no loader: the template
    /// decodes it. `writable` makes it a `read_write` activation (see
    /// [`Bindings::activation`]), else a read-only tensor such as a KV cache
    /// as attention reads it (a weight of known size takes
    /// [`Bindings::weight_vectors`]).
    pub fn vectors(
        &mut self,
        out: &mut String,
        port: Port,
        name: &str,
        dtype: DType,
        writable: bool,
        array_of: &str,
    ) {
        let elem = elem_of(dtype);
        let (access, wgsl_access) = if writable {
            (Access::ReadWrite, "read_write")
        } else {
            (Access::Read, "read")
        };
        let n = self.push(name, port, access, elem);
        let _ = writeln!(
            out,
            "@group(0) @binding({n}) var<storage, {wgsl_access}> {name}: array<{array_of}>;"
        );
    }

    /// A weight of `bytes` bytes as `array<{array_of}, N>`, `N` elements of
    /// `elem_bytes` each: fixed-size where the bytes are whole elements,
    /// else runtime-sized (as [`Bindings::vectors`]). A fixed size lets a
    /// browser's WebGPU check each index against a constant: against the
    /// buffer's run-time length, on SwiftShader, the checks cost SmolLM2's
    /// decode a quarter of its speed in a page.
    pub fn weight_vectors(
        &mut self,
        out: &mut String,
        port: Port,
        name: &str,
        dtype: DType,
        (array_of, elem_bytes): (&str, u64),
        bytes: u64,
    ) {
        let n = self.push(name, port, Access::Read, elem_of(dtype));
        let _ = writeln!(
            out,
            "@group(0) @binding({n}) var<storage, read> {name}: {};",
            array_type(array_of, elem_bytes, bytes)
        );
    }

    /// The declarations, binding 0 first.
    pub fn finish(self) -> Vec<BindingDecl> {
        self.decls
    }
}

/// `array<{array_of}, N>` holding `bytes` bytes in elements of `elem_bytes`,
/// or `array<{array_of}>` where the bytes are not whole elements.
pub(crate) fn array_type(array_of: &str, elem_bytes: u64, bytes: u64) -> String {
    if elem_bytes > 0 && bytes > 0 && bytes.is_multiple_of(elem_bytes) {
        format!("array<{array_of}, {}>", bytes / elem_bytes)
    } else {
        format!("array<{array_of}>")
    }
}

/// The element a binding of `dtype` declares.
fn elem_of(dtype: DType) -> Elem {
    match dtype {
        DType::F32 => Elem::F32,
        DType::U32 => Elem::U32,
        DType::BF16 => Elem::Bf16x2,
        DType::F16 => Elem::F16x2,
        _ => Elem::Blocks,
    }
}

/// Exact IEEE binary16 → binary32 conversion with integer operations, so
/// kernels need neither `shader-f16` nor naga's `SHADER_FLOAT16_IN_FLOAT32`
/// (`unpack2x16float`), which some backends lack.
pub(crate) const F16_DECODE: &str = "fn f16_bits_to_f32(h: u32) -> f32 {
  let sign = (h & 0x8000u) << 16u;
  let e = (h >> 10u) & 0x1fu;
  let m = h & 0x3ffu;
  if (e == 0u) {
    let v = f32(m) * 5.9604644775390625e-8f;
    return select(v, -v, sign != 0u);
  }
  if (e == 31u) { return bitcast<f32>(sign | 0x7f800000u | (m << 13u)); }
  return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}
";

/// Declares a read-only weight binding of `dtype` and a loader
/// `fn load_{name}(i: u32) -> f32` returning element `i` widened to f32
/// (bf16 and f16 are packed two per `u32`, low half first).
fn weight_binding(out: &mut String, binding: u32, name: &str, dtype: DType) {
    match dtype {
        DType::BF16 => {
            let _ = writeln!(
                out,
                "@group(0) @binding({binding}) var<storage, read> {name}: array<u32>;\n\
                 fn load_{name}(i: u32) -> f32 {{\n  let w = {name}[i >> 1u];\n  \
                 return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (i & 1u) == 1u));\n}}\n\
                 fn pair_{name}(word: u32) -> vec2<f32> {{\n  let w = {name}[word];\n  \
                 return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u));\n}}"
            );
        }
        DType::F16 => {
            let _ = writeln!(
                out,
                "@group(0) @binding({binding}) var<storage, read> {name}: array<u32>;\n\
                 fn load_{name}(i: u32) -> f32 {{ return f16_bits_to_f32(({name}[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu); }}\n\
                 fn pair_{name}(word: u32) -> vec2<f32> {{\n  let w = {name}[word];\n  \
                 return vec2<f32>(f16_bits_to_f32(w & 0xffffu), f16_bits_to_f32(w >> 16u));\n}}"
            );
            if !out.contains(F16_DECODE) {
                out.push_str(F16_DECODE);
            }
        }
        // F32 and U32 (quantized weights never get here: `Bindings::weight`
        // hands them to `quant::declare`).
        _ => {
            f32_binding(out, binding, name, false);
            let _ = writeln!(out, "fn load_{name}(i: u32) -> f32 {{ return {name}[i]; }}");
        }
    }
}

/// Makes `module` start with `enable f16;` (once).
pub fn enable_f16(module: &mut String) {
    const ENABLE: &str = "enable f16;\n";
    if !module.starts_with(ENABLE) {
        module.insert_str(0, ENABLE);
    }
}

/// WGSL reading element `index` of KV cache `name` stored as `kv`, as f32.
pub fn kv_load(kv: DType, name: &str, index: &str) -> String {
    match kv {
        DType::F16 => format!("f32({name}[{index}])"),
        _ => format!("{name}[{index}]"),
    }
}

/// Kernel-name suffix for a KV cache stored as `kv`: `_kv16` for f16.
pub fn kv_tag(kv: DType) -> &'static str {
    match kv {
        DType::F16 => "_kv16",
        _ => "",
    }
}

/// WGSL converting the f32 `value` to what a KV cache stored as `kv` holds.
pub fn kv_store(kv: DType, value: &str) -> String {
    match kv {
        DType::F16 => format!("f16({value})"),
        _ => value.to_string(),
    }
}

/// Splits `groups` workgroups over x and y so neither exceeds the limit;
/// returns `(gx, gy)`.
pub fn split_groups(groups: u32) -> (u32, u32) {
    let gy = groups.div_ceil(MAX_WORKGROUPS_PER_DIM).max(1);
    (groups.div_ceil(gy).max(1), gy)
}

/// WGSL for a tree reduction of `red[base + 0..width]` into `red[base]` by
/// threads `lane < width` (width a power of two), with `op` `+` or `max`.
pub fn tree_reduce(width: u32, lane: &str, base: &str, op: &str) -> String {
    let combine = if op == "max" {
        format!("red[{base} + {lane}] = max(red[{base} + {lane}], red[{base} + {lane} + s]);")
    } else {
        format!("red[{base} + {lane}] = red[{base} + {lane}] + red[{base} + {lane} + s];")
    };
    format!(
        "  for (var s = {half}u; s > 0u; s = s >> 1u) {{\n    if ({lane} < s) {{ {combine} }}\n    workgroupBarrier();\n  }}\n",
        half = width / 2
    )
}
