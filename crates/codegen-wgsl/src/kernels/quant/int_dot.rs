//! Integer dot products of block-quantized weights with int8 activations:
//! the decode GEMV of the f16 variants ([`super::super::gemv::Dots::Int8`]).
//!
//! Each 32-value unit of `x` is quantized once (`QX`: scale
//! `d = max|x| / 127`, `q = round(x · (1 / d))` rounding half to even,
//! packed four to a word by `pack4xI8`, with the sums of the two halves'
//! quants and `sx = d · Σq`, the sum of `x` as rounded;
//! [`gemv_int8`](super::super::gemv_int8) stages it in workgroup
//! memory), then dotted with every weight row's unit four values an
//! instruction (`dot4I8Packed`, SPIR-V `OpSDot` where the device has integer
//! dot products, a few shifts elsewhere): the quants are read as bytes
//! straight from the block, a nibble format's two halves by one mask each,
//! the fifth or sixth bits spread into the bytes with a multiply. The scales
//! are applied once per unit, `d_w · d_x · Σ q·q_x` plus each format's
//! offset (`−8 · d_w · d_x · Σ q_x` for Q4_0) or minimum (`m · d_x · Σ q_x`),
//! so the kernel computes exactly the dot product with `x` rounded to its
//! int8 units, which is what the tests check it against.
//! [`int_dot_decoder`] emits `fn {name}_idot(u, x: QX) -> f32` for a binding
//! [`super::declare`]d before it. llama.cpp's `mmvq` does the same with x
//! as `q8_1` blocks.
//!
//! The surprise is where the error comes from: not the weights (their
//! quants are exact integers) but `x`, rounded to 8 bits per 32 values —
//! about 0.2% of the unit's largest value per element, which the f16
//! variants' contract (logits within 5e-2 of f32) absorbs and the f32
//! variants' (exact against transformers) would not, so only the f16
//! variants use it.

use super::{helpers, plane_words, unrolled, K_SCALES};
use gerbil_ir::DType;
use std::fmt::Write;

/// `QX` and its helpers (emitted once per module).
const QX_HELPERS: &str = "struct QX {
  q: array<u32, 8>,
  d: f32,
  lo: i32,
  hi: i32,
  sx: f32,
}
fn q_spread(bits: u32) -> u32 { return ((bits & 15u) * 0x00204081u) & 0x01010101u; }
";

/// The fields of [`int_dot_decoder`]'s `QW` for `dtype`, each `(name,
/// type)`: the words of one unit, as loaded.
fn qw_fields(dtype: DType) -> &'static [(&'static str, &'static str)] {
    const V: &str = "vec4<u32>";
    const W: &str = "u32";
    match dtype {
        DType::Q8_0 => &[("a", V), ("b", V), ("s", W), ("t", W)],
        DType::Q4_0 | DType::Q4_1 => &[("a", V), ("s", W), ("t", W)],
        DType::Q5_0 | DType::Q5_1 => &[("a", V), ("s", W), ("e", W), ("t", W)],
        DType::Q4K => &[("a", V), ("b", V), ("h", V), ("t", W)],
        DType::Q5K => &[("a", V), ("b", V), ("c", V), ("d", V), ("h", V), ("t", W)],
        DType::Q6K => &[
            ("a", V),
            ("b", V),
            ("c", V),
            ("d", V),
            ("s", W),
            ("e", W),
            ("t", W),
        ],
        DType::F32 | DType::F16 | DType::BF16 | DType::U32 => &[],
    }
}

/// The 32-bit words [`int_dot_decoder`]'s `QW` loads for one unit of
/// `dtype` (its last field, the unit's index, is not loaded).
pub(in crate::kernels) fn qw_words(dtype: DType) -> u32 {
    let fields = qw_fields(dtype);
    fields[..fields.len().saturating_sub(1)]
        .iter()
        .map(|(_, t)| if t.starts_with("vec4") { 4 } else { 1 })
        .sum()
}

/// For binding `name` (declared with `values` values of quantized `dtype`):
/// `fn {name}_iload(u: u32) -> QW`, the words of its 32-value unit `u` as
/// loaded, and (once per module) the struct `QW` and `fn q_idot(w: QW, x:
/// QX) -> f32`, their dot product with the quantized unit `x` (see the
/// module documentation). Loads and arithmetic are apart so a kernel can
/// issue a unit's loads before its `x` is ready.
pub(in crate::kernels) fn int_dot_decoder(out: &mut String, name: &str, dtype: DType, values: u64) {
    let p = plane_words(dtype, values / dtype.block().0);
    let plane = |i: usize| p.get(i).copied().unwrap_or(0);
    let (p1, p2) = (plane(1), plane(2));
    // Each field's load, in `qw_fields` order.
    let loads: Vec<String> = match dtype {
        DType::Q8_0 => vec![
            format!("{name}[2u * u]"),
            format!("{name}[2u * u + 1u]"),
            format!("{name}_w({p1}u + (u >> 1u))"),
            "u".into(),
        ],
        DType::Q4_0 => vec![
            format!("{name}[u]"),
            format!("{name}_w({p1}u + (u >> 1u))"),
            "u".into(),
        ],
        DType::Q4_1 => vec![
            format!("{name}[u]"),
            format!("{name}_w({p1}u + u)"),
            "u".into(),
        ],
        DType::Q5_0 => vec![
            format!("{name}[u]"),
            format!("{name}_w({p2}u + (u >> 1u))"),
            format!("{name}_w({p1}u + u)"),
            "u".into(),
        ],
        DType::Q5_1 => vec![
            format!("{name}[u]"),
            format!("{name}_w({p2}u + u)"),
            format!("{name}_w({p1}u + u)"),
            "u".into(),
        ],
        DType::Q4K | DType::Q5K => {
            let header = if dtype == DType::Q4K { p1 } else { p2 };
            let mut l = vec![
                format!("{name}[8u * (u >> 3u) + 2u * ((u & 7u) >> 1u)]"),
                format!("{name}[8u * (u >> 3u) + 2u * ((u & 7u) >> 1u) + 1u]"),
            ];
            if dtype == DType::Q5K {
                l.push(format!("{name}[{}u + 2u * (u >> 3u)]", p1 / 4));
                l.push(format!("{name}[{}u + 2u * (u >> 3u) + 1u]", p1 / 4));
            }
            l.push(format!("{name}[{}u + (u >> 3u)]", header / 4));
            l.push("u".into());
            l
        }
        DType::Q6K => vec![
            format!("{name}[12u * (u >> 3u) + 4u * ((u & 7u) >> 2u) + 2u * (u & 1u)]"),
            format!("{name}[12u * (u >> 3u) + 4u * ((u & 7u) >> 2u) + 2u * (u & 1u) + 1u]"),
            format!("{name}[12u * (u >> 3u) + 8u + 2u * ((u & 7u) >> 2u)]"),
            format!("{name}[12u * (u >> 3u) + 8u + 2u * ((u & 7u) >> 2u) + 1u]"),
            format!("{name}_w({p1}u + 4u * (u >> 3u) + ((u & 7u) >> 1u))"),
            format!("{name}_w({p2}u + (u >> 4u))"),
            "u".into(),
        ],
        DType::F32 | DType::F16 | DType::BF16 | DType::U32 => return,
    };
    let fields = qw_fields(dtype);
    let init: Vec<String> = fields
        .iter()
        .zip(&loads)
        .map(|((_, _), load)| load.clone())
        .collect();
    let _ = writeln!(
        out,
        "fn {name}_iload(u: u32) -> QW {{
  return QW({});
}}",
        init.join(", ")
    );
    helpers(out);
    if !out.contains(QX_HELPERS) {
        out.push_str(QX_HELPERS);
    }
    if !out.contains("struct QW {") {
        let decl: Vec<String> = fields
            .iter()
            .map(|(f, t)| format!("  {f}: {t},\n"))
            .collect();
        let _ = write!(
            out,
            "struct QW {{\n{}}}\nfn q_idot(w: QW, x: QX) -> f32 {{\n{}}}\n",
            decl.concat(),
            idot_body(dtype)
        );
    }
}

/// The body of `q_idot` for `dtype`: the unit's words are `w`'s fields.
fn idot_body(dtype: DType) -> String {
    // The low and high nibbles of quant vector `q` (`q[k]`: values `4k..4k + 4`
    // and `16 + 4k..`) dotted with x, `extra(k, hi)` or'ed into each.
    let nibble_dots = |extra: &dyn Fn(u32, bool) -> String| {
        unrolled(4, |k| {
            format!(
                "acc = acc + dot4I8Packed((w.a[{k}] & 0x0f0f0f0fu){}, x.q[{k}]) + dot4I8Packed(((w.a[{k}] >> 4u) & 0x0f0f0f0fu){}, x.q[{}]);",
                extra(k, false),
                extra(k, true),
                k + 4
            )
        })
    };
    let none = |_: u32, _: bool| String::new();
    let fifth = |k: u32, hi: bool| {
        format!(
            " | (q_spread(w.e >> {}u) << 4u)",
            4 * k + if hi { 16 } else { 0 }
        )
    };
    match dtype {
        DType::Q8_0 => format!(
            "  let d = q_half(w.s, w.t & 1u);\n  var acc = 0i;\n{}{}  return (d * x.d) * f32(acc);\n",
            unrolled(4, |k| format!("acc = acc + dot4I8Packed(w.a[{k}], x.q[{k}]);")),
            unrolled(4, |k| format!("acc = acc + dot4I8Packed(w.b[{k}], x.q[{}]);", k + 4)),
        ),
        DType::Q4_0 => format!(
            "  let d = q_half(w.s, w.t & 1u);\n  var acc = 0i;\n{}  \
             return (d * x.d) * f32(acc - 8i * (x.lo + x.hi));\n",
            nibble_dots(&none)
        ),
        DType::Q5_0 => format!(
            "  let d = q_half(w.s, w.t & 1u);\n  var acc = 0i;\n{}  \
             return (d * x.d) * f32(acc - 16i * (x.lo + x.hi));\n",
            nibble_dots(&fifth)
        ),
        DType::Q4_1 | DType::Q5_1 => format!(
            "  var acc = 0i;\n{}  return (q_half(w.s, 0u) * x.d) * f32(acc) + q_half(w.s, 1u) * x.sx;\n",
            nibble_dots(if dtype == DType::Q5_1 { &fifth } else { &none })
        ),
        DType::Q4K | DType::Q5K => {
            let high = |v: &str, k: u32| {
                if dtype == DType::Q5K {
                    format!(" | ((((w.{v}[{k}] >> sb) & 0x01010101u)) << 4u)")
                } else {
                    String::new()
                }
            };
            format!(
                "  let sb = w.t & 7u;\n  let hdr = w.h;\n{K_SCALES}  let shift = (sb & 1u) * 4u;\n  \
                 var acc = 0i;\n{}{}  \
                 return (scale * x.d) * f32(acc) - minimum * x.sx;\n",
                unrolled(4, |k| format!(
                    "acc = acc + dot4I8Packed(((w.a[{k}] >> shift) & 0x0f0f0f0fu){}, x.q[{k}]);",
                    high("c", k)
                )),
                unrolled(4, |k| format!(
                    "acc = acc + dot4I8Packed(((w.b[{k}] >> shift) & 0x0f0f0f0fu){}, x.q[{}]);",
                    high("d", k),
                    k + 4
                )),
            )
        }
        DType::Q6K => format!(
            "  let v = w.t & 7u;\n  let lo_shift = 4u * ((v & 3u) >> 1u);\n  let hi_shift = 2u * (v & 3u);\n  \
             let sh = 16u * (v & 1u);\n  \
             let sc0 = f32(bitcast<i32>(w.s << (24u - sh)) >> 24u);\n  \
             let sc1 = f32(bitcast<i32>(w.s << (16u - sh)) >> 24u);\n  \
             let d = q_half(w.e, (w.t >> 3u) & 1u);\n  var a0 = 0i;\n  var a1 = 0i;\n{}{}  \
             return ((d * sc0) * x.d) * f32(a0 - 32i * x.lo) + ((d * sc1) * x.d) * f32(a1 - 32i * x.hi);\n",
            unrolled(4, |k| format!(
                "a0 = a0 + dot4I8Packed(((w.a[{k}] >> lo_shift) & 0x0f0f0f0fu) | (((w.c[{k}] >> hi_shift) & 0x03030303u) << 4u), x.q[{k}]);"
            )),
            unrolled(4, |k| format!(
                "a1 = a1 + dot4I8Packed(((w.b[{k}] >> lo_shift) & 0x0f0f0f0fu) | (((w.d[{k}] >> hi_shift) & 0x03030303u) << 4u), x.q[{}]);",
                k + 4
            )),
        ),
        DType::F32 | DType::F16 | DType::BF16 | DType::U32 => String::new(),
    }
}
