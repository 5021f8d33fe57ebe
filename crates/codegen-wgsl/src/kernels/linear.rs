//! The pieces the matmul templates ([`matmul`](super::matmul),
//! [`gemv`](super::gemv), [`gemm`](super::gemm), [`gemm_coop`](super::gemm_coop),
//! [`matmul_cpu`](super::matmul_cpu))
//! are built from, one function each, so a template owns only its schedule
//! (how threads walk `K`, tile and reduce):
//!
//! - the weight read: [`weight_shards`] (the bindings a weight of a
//!   [`MatMulSpec`] takes), [`bind_weight`] (declares them with loaders in
//!   the form the template reads: elements and packed pairs, or chunks of
//!   up to 8 elements through [`chunk_binding`]) and [`row_loader`] (a
//!   function that reads a weight row from whichever shard holds it);
//! - the operands after the weight: [`bind_after_weight`] (bias, the norm
//!   prologue's weight with `EPS` and `OFFSET`, residual, output);
//! - the epilogue: [`store`] (bias, gated unit, residual, into `y`);
//! - the kernel-name options: [`name_parts`].
//!
//! A new weight format is an arm of [`chunk_binding`] and of the element
//! loaders ([`Bindings::weight`]) — the block-quantized ones share a decoder
//! of four values ([`quant`]); a new epilogue is a [`MatMulSpec`] field
//! and this file — not an edit per template. The surprise: every template
//! hands [`store`] its sums already scaled by the norm prologue's inverse
//! RMS, so the epilogue never knows whether a norm ran.

use super::elementwise::unary_expr;
use super::matmul::MatMulSpec;
use super::{f32_lit, input, input_shard, output, quant, Bindings, F16_DECODE};
use gerbil_ir::{DType, MatMulPorts, UnaryOp};
use gerbil_plan::Port;
use std::fmt::Write;

/// One binding of a weight split by rows: its first row and its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Shard {
    /// The first weight row it holds.
    pub start: u32,
    /// How many rows it holds.
    pub rows: u32,
    /// Its binding's name: `w`, or `w0`, `w1`, … when split.
    pub name: String,
}

/// The bindings the weight of `s` takes: one `w`, or shards `w0`, `w1`, …
/// of [`MatMulSpec::shard_rows`] rows (with a gated epilogue they split the
/// `2·N` rows).
pub(super) fn weight_shards(s: &MatMulSpec) -> Vec<Shard> {
    let rows = s.n * if s.glu.is_some() { 2 } else { 1 };
    match s.shard_rows {
        Some(per) if per > 0 && per < rows => (0..rows.div_ceil(per))
            .map(|i| Shard {
                start: i * per,
                rows: per.min(rows - i * per),
                name: format!("w{i}"),
            })
            .collect(),
        _ => vec![Shard {
            start: 0,
            rows,
            name: "w".to_string(),
        }],
    }
}

/// How a template reads its weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WeightRead {
    /// `load_{w}(i) -> f32` per element and, packed 16-bit dtypes,
    /// `pair_{w}(word) -> vec2<f32>` ([`Bindings::weight`]).
    Elements,
    /// `{w}_chunk(i)`: chunk `i` of this many elements widened to f32
    /// ([`chunk_binding`]).
    Chunks(u32),
}

/// Declares the weight of `s` (input port 1, one binding per shard) with
/// loaders of `read`'s form; returns the shards.
pub(super) fn bind_weight(
    s: &MatMulSpec,
    b: &mut Bindings,
    w: &mut String,
    read: WeightRead,
) -> Vec<Shard> {
    let shards = weight_shards(s);
    for (i, shard) in shards.iter().enumerate() {
        let port = input_shard(1, i as u32);
        let values = u64::from(shard.rows) * u64::from(s.k);
        match read {
            WeightRead::Elements => b.matrix(w, port, &shard.name, s.wdtype, values),
            WeightRead::Chunks(e) if s.wdtype.is_quantized() => {
                quant_chunk_binding(b, w, port, &shard.name, s.wdtype, e, values)
            }
            WeightRead::Chunks(e) => chunk_binding(
                b,
                w,
                port,
                &shard.name,
                s.wdtype,
                e,
                Operand::Weight(values),
            ),
        }
    }
    shards
}

/// `fn {name}(row: u32, i: u32{params}) -> {ret}`: item `i` of weight row
/// `row` from whichever of `shards` holds the row, where `load(shard,
/// local)` is the WGSL reading item `i` of local row `local` of one shard
/// (`params`, e.g. `, x: T`, are further parameters it may use).
pub(super) fn row_loader(
    w: &mut String,
    name: &str,
    params: &str,
    ret: &str,
    shards: &[Shard],
    load: impl Fn(&Shard, &str) -> String,
) {
    let _ = writeln!(w, "fn {name}(row: u32, i: u32{params}) -> {ret} {{");
    for (i, shard) in shards.iter().enumerate() {
        let local = if shard.start == 0 {
            "row".to_string()
        } else {
            format!("(row - {}u)", shard.start)
        };
        let read = format!("return {};", load(shard, &local));
        match shards.get(i + 1) {
            Some(next) => {
                let _ = writeln!(w, "  if (row < {}u) {{ {read} }}", next.start);
            }
            None => {
                let _ = writeln!(w, "  {read}\n}}");
            }
        }
    }
}

/// Declares what a matmul template binds after its weight, in binding order:
/// the bias `b` (f32), the norm weight `gamma` (declared by `gamma`, the
/// template's own way, then the constants `EPS` and `OFFSET`), the residual
/// `res` and the output `y`.
pub(super) fn bind_after_weight(
    s: &MatMulSpec,
    b: &mut Bindings,
    w: &mut String,
    gamma: impl FnOnce(&mut Bindings, &mut String, Port, DType),
) {
    let ports = MatMulPorts::new(s.bias, s.norm.is_some(), s.residual);
    if let Some(port) = ports.bias {
        b.weight(w, input(port as u32), "b", DType::F32);
    }
    if let (Some((eps, offset, gdtype)), Some(port)) = (s.norm, ports.norm) {
        gamma(b, w, input(port as u32), gdtype);
        let _ = writeln!(
            w,
            "const EPS: f32 = {};\nconst OFFSET: f32 = {};",
            f32_lit(eps),
            f32_lit(offset)
        );
    }
    if let Some(port) = ports.residual {
        b.activation(w, input(port as u32), "res");
    }
    b.activation(w, output(0), "y");
}

/// The epilogue of output `(row, n)` (`n` is the WGSL column variable), one
/// line of WGSL: `y` gets the sum `sum` plus the bias — gated, `act(sum +
/// b[n]) · (up + b[N + n])`; with an activation epilogue, `act(sum + b[n])`
/// — plus the residual. `sum` and `up` are WGSL
/// expressions already scaled by the norm prologue's inverse RMS where there
/// is one; `up` is unused without a gated epilogue.
pub(super) fn store(s: &MatMulSpec, row: &str, sum: &str, up: &str) -> String {
    let bias = |col: &str| {
        if s.bias {
            format!(" + load_b({col})")
        } else {
            String::new()
        }
    };
    let res = if s.residual {
        format!(" + res[{row} * N + n]")
    } else {
        String::new()
    };
    match (s.glu, s.act) {
        (None, None) => format!("y[{row} * N + n] = {sum}{}{res};", bias("n")),
        (None, Some(act)) => format!(
            "let av = {sum}{}; y[{row} * N + n] = {}{res};",
            bias("n"),
            unary_expr(act, "av"),
        ),
        (Some(act), _) => format!(
            "let gv = {sum}{}; let uv = {up}{}; y[{row} * N + n] = ({}) * uv{res};",
            bias("n"),
            bias("N + n"),
            unary_expr(act, "gv"),
        ),
    }
}

/// The parts of a matmul kernel's name around its schedule: the gated
/// epilogue's tag before the shape, and the options after it (bias, norm,
/// residual, last row, weight shards).
pub(super) fn name_parts(s: &MatMulSpec, shards: usize) -> (String, String) {
    let glu = match s.glu {
        None => String::new(),
        Some(UnaryOp::Silu) => "_swiglu".to_string(),
        Some(UnaryOp::GeluTanh) => "_geglu".to_string(),
        Some(UnaryOp::Gelu) => "_glu_gelu".to_string(),
        Some(UnaryOp::Softcap(c)) => format!("_glu_softcap{}", c.to_bits()),
        Some(UnaryOp::Scale(s)) => format!("_glu_scale{}", s.to_bits()),
    };
    let act = match s.act {
        None => String::new(),
        Some(UnaryOp::Silu) => "_silu".to_string(),
        Some(UnaryOp::GeluTanh) => "_gelu_tanh".to_string(),
        Some(UnaryOp::Gelu) => "_gelu".to_string(),
        Some(UnaryOp::Softcap(c)) => format!("_softcap{}", c.to_bits()),
        Some(UnaryOp::Scale(s)) => format!("_scale{}", s.to_bits()),
    };
    let options = format!(
        "{}{act}{}{}{}{}",
        if s.bias { "_bias" } else { "" },
        match s.norm {
            Some((_, _, gdtype)) => format!("_norm_{gdtype}"),
            None => String::new(),
        },
        if s.residual { "_residual" } else { "" },
        if s.last_row { "_last_row" } else { "" },
        if shards > 1 {
            format!("_shards{shards}")
        } else {
            String::new()
        }
    );
    (glu, options)
}

/// Whether `dtype` packs two values per 32-bit word.
fn is_packed(dtype: DType) -> bool {
    matches!(dtype, DType::BF16 | DType::F16)
}

/// Elements per load: 8 packed 16-bit or quantized values or 4 f32 where
/// `K` is a multiple, else the widest that divides `K`.
pub(super) fn elems_per_load(wdtype: DType, k: u32) -> u32 {
    let widest = if is_packed(wdtype) || wdtype.is_quantized() {
        8
    } else {
        4
    };
    [8, 4, 2]
        .into_iter()
        .find(|&e| e <= widest && k.is_multiple_of(e))
        .unwrap_or(1)
}

/// The WGSL type of one chunk of `e` elements, widened to f32.
pub(super) fn chunk_type(e: u32) -> &'static str {
    match e {
        1 => "f32",
        2 => "vec2<f32>",
        4 => "vec4<f32>",
        _ => "mat2x4<f32>",
    }
}

/// The low and high value of a packed word `w`, widened to f32.
fn halves(dtype: DType, w: &str) -> (String, String) {
    if dtype == DType::BF16 {
        (
            format!("bitcast<f32>({w} << 16u)"),
            format!("bitcast<f32>({w} & 0xffff0000u)"),
        )
    } else {
        (
            format!("f16_bits_to_f32({w} & 0xffffu)"),
            format!("f16_bits_to_f32({w} >> 16u)"),
        )
    }
}

/// The return of an 8-element chunk from its two halves `a` and `b`: the
/// even elements in column 0, the odd ones in column 1.
const EVEN_ODD: &str =
    "return mat2x4<f32>(vec4<f32>(a.x, a.z, b.x, b.z), vec4<f32>(a.y, a.w, b.y, b.w));";

/// What a [`chunk_binding`] binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Operand {
    /// An activation: `read_write`, runtime-sized.
    Activation,
    /// A weight of this many values: read-only, a fixed-size array
    /// ([`Bindings::weight_vectors`]).
    Weight(u64),
}

/// Declares binding `name`, a `dtype` tensor whose rows are whole chunks of
/// `e` elements, as an array of its loads, with `fn {name}_chunk(i: u32)`
/// returning chunk `i` widened to f32 (8-element chunks: even elements in
/// column 0, odd ones in column 1).
pub(super) fn chunk_binding(
    b: &mut Bindings,
    w: &mut String,
    port: Port,
    name: &str,
    dtype: DType,
    e: u32,
    operand: Operand,
) {
    let ((array_of, elem_bytes), body) = match (is_packed(dtype), e) {
        (false, 8) => (
            ("vec4<f32>", 16),
            format!("let a = {name}[2u * i];\n  let b = {name}[2u * i + 1u];\n  {EVEN_ODD}"),
        ),
        (false, _) => (
            (chunk_type(e), 4 * u64::from(e)),
            format!("return {name}[i];"),
        ),
        (true, 1) => (
            ("u32", 4),
            if dtype == DType::BF16 {
                format!(
                    "let v = {name}[i >> 1u];\n  \
                     return bitcast<f32>(select(v << 16u, v & 0xffff0000u, (i & 1u) == 1u));"
                )
            } else {
                format!("return f16_bits_to_f32(({name}[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu);")
            },
        ),
        (true, 2) => {
            let (lo, hi) = halves(dtype, "v");
            (
                ("u32", 4),
                format!("let v = {name}[i];\n  return vec2<f32>({lo}, {hi});"),
            )
        }
        (true, 4) => {
            let ((l0, h0), (l1, h1)) = (halves(dtype, "v.x"), halves(dtype, "v.y"));
            (
                ("vec2<u32>", 8),
                format!("let v = {name}[i];\n  return vec4<f32>({l0}, {h0}, {l1}, {h1});"),
            )
        }
        (true, _) => (
            ("vec4<u32>", 16),
            if dtype == DType::BF16 {
                format!(
                    "let v = {name}[i];\n  return mat2x4<f32>(bitcast<vec4<f32>>(v << vec4<u32>(16u)), \
                     bitcast<vec4<f32>>(v & vec4<u32>(0xffff0000u)));"
                )
            } else {
                format!(
                    "let v = {name}[i];\n  return mat2x4<f32>(f16x4(v & vec4<u32>(0xffffu)), \
                     f16x4(v >> vec4<u32>(16u)));"
                )
            },
        ),
    };
    match operand {
        Operand::Activation => b.vectors(w, port, name, dtype, true, array_of),
        Operand::Weight(values) => {
            let bytes = dtype.bytes_for(values).unwrap_or(0);
            b.weight_vectors(w, port, name, dtype, (array_of, elem_bytes), bytes);
        }
    }
    let _ = writeln!(
        w,
        "fn {name}_chunk(i: u32) -> {c} {{\n  {body}\n}}",
        c = chunk_type(e)
    );
    if dtype == DType::F16 {
        if !w.contains(F16_DECODE) {
            w.push_str(F16_DECODE);
        }
        if e == 8 && !w.contains("fn f16x4(") {
            w.push_str(
                "fn f16x4(h: vec4<u32>) -> vec4<f32> {\n  return vec4<f32>(f16_bits_to_f32(h.x), \
                 f16_bits_to_f32(h.y), f16_bits_to_f32(h.z), f16_bits_to_f32(h.w));\n}\n",
            );
        }
    }
}

/// [`chunk_binding`] of a quantized weight of `values` values: chunks built
/// from the four values [`quant::declare`]'s decoder returns at a time.
fn quant_chunk_binding(
    b: &mut Bindings,
    w: &mut String,
    port: Port,
    name: &str,
    dtype: DType,
    e: u32,
    values: u64,
) {
    quant::declare(b, w, port, name, dtype, values);
    let body = match e {
        8 => format!("let a = {name}_q4(2u * i);\n  let b = {name}_q4(2u * i + 1u);\n  {EVEN_ODD}"),
        4 => format!("return {name}_q4(i);"),
        2 => format!("let q = {name}_q4(i >> 1u);\n  return select(q.xy, q.zw, (i & 1u) == 1u);"),
        _ => format!("return q_pickf({name}_q4(i >> 2u), i & 3u);"),
    };
    let _ = writeln!(
        w,
        "fn {name}_chunk(i: u32) -> {c} {{\n  {body}\n}}",
        c = chunk_type(e)
    );
}
