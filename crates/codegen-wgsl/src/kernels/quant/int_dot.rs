//! Integer dot products of block-quantized weights with int8 activations:
//! the decode GEMV of the f16 variants ([`super::super::gemv::Dots::Int8`]).
//!
//! Each thread quantizes its 32-value unit of `x` once (`q_x8`: scale
//! `d = max|x| / 127`, `q = round(x / d)` rounding half to even, packed four
//! to a word by `pack4xI8`, with the sums of the two halves' quants and of
//! `x` itself), then dots it with every weight row's unit four values an
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

use super::{helpers, k_unit_loads, plane_words, q6k_unit_loads, unrolled};
use gerbil_ir::DType;
use std::fmt::Write;

/// The WGSL type of a quantized unit of `x`.
pub(in crate::kernels) const QX: &str = "QX";

/// `QX` and its helpers (emitted once per module).
const QX_HELPERS: &str = "struct QX {
  q: array<u32, 8>,
  d: f32,
  lo: i32,
  hi: i32,
  sx: f32,
}
fn q_x8(x: array<vec4<f32>, 8>) -> QX {
  let m = max(max(max(abs(x[0]), abs(x[1])), max(abs(x[2]), abs(x[3]))),
              max(max(abs(x[4]), abs(x[5])), max(abs(x[6]), abs(x[7]))));
  let amax = max(max(m.x, m.y), max(m.z, m.w));
  let d = amax / 127.0f;
  let id = select(0.0f, 1.0f / d, amax > 0.0f);
  let q0 = vec4<i32>(round(x[0] * id));
  let q1 = vec4<i32>(round(x[1] * id));
  let q2 = vec4<i32>(round(x[2] * id));
  let q3 = vec4<i32>(round(x[3] * id));
  let q4 = vec4<i32>(round(x[4] * id));
  let q5 = vec4<i32>(round(x[5] * id));
  let q6 = vec4<i32>(round(x[6] * id));
  let q7 = vec4<i32>(round(x[7] * id));
  var r: QX;
  r.q = array<u32, 8>(pack4xI8(q0), pack4xI8(q1), pack4xI8(q2), pack4xI8(q3),
                      pack4xI8(q4), pack4xI8(q5), pack4xI8(q6), pack4xI8(q7));
  r.d = d;
  r.lo = dot(q0 + q1 + q2 + q3, vec4<i32>(1));
  r.hi = dot(q4 + q5 + q6 + q7, vec4<i32>(1));
  r.sx = d * f32(r.lo + r.hi);
  return r;
}
fn q_spread(bits: u32) -> u32 { return ((bits & 15u) * 0x00204081u) & 0x01010101u; }
";

/// `fn {name}_idot(u: u32, x: QX) -> f32`: the dot product of 32-value unit
/// `u` of binding `name` (declared with `values` values of quantized
/// `dtype`) with the quantized unit `x` (see the module documentation).
pub(in crate::kernels) fn int_dot_decoder(out: &mut String, name: &str, dtype: DType, values: u64) {
    let p = plane_words(dtype, values / dtype.block().0);
    let plane = |i: usize| p.get(i).copied().unwrap_or(0);
    let (p1, p2) = (plane(1), plane(2));
    // The low and high nibbles of quant vector `q` (`q[k]`: values `4k..4k + 4`
    // and `16 + 4k..`) dotted with x, `extra(k, hi)` or'ed into each.
    let nibble_dots = |extra: &dyn Fn(u32, bool) -> String| {
        unrolled(4, |k| {
            format!(
                "acc = acc + dot4I8Packed((q[{k}] & 0x0f0f0f0fu){}, x.q[{k}]) + dot4I8Packed(((q[{k}] >> 4u) & 0x0f0f0f0fu){}, x.q[{}]);",
                extra(k, false),
                extra(k, true),
                k + 4
            )
        })
    };
    let none = |_: u32, _: bool| String::new();
    let fifth = |k: u32, hi: bool| {
        format!(
            " | (q_spread(qh >> {}u) << 4u)",
            4 * k + if hi { 16 } else { 0 }
        )
    };
    let body = match dtype {
        DType::Q8_0 => format!(
            "  let d = q_half({name}_w({p1}u + (u >> 1u)), u & 1u);\n  let qa = {name}[2u * u];\n  \
             let qb = {name}[2u * u + 1u];\n  var acc = 0i;\n{}{}  return (d * x.d) * f32(acc);\n",
            unrolled(4, |k| format!("acc = acc + dot4I8Packed(qa[{k}], x.q[{k}]);")),
            unrolled(4, |k| format!("acc = acc + dot4I8Packed(qb[{k}], x.q[{}]);", k + 4)),
        ),
        DType::Q4_0 => format!(
            "  let d = q_half({name}_w({p1}u + (u >> 1u)), u & 1u);\n  let q = {name}[u];\n  \
             var acc = 0i;\n{}  return (d * x.d) * f32(acc - 8i * (x.lo + x.hi));\n",
            nibble_dots(&none)
        ),
        DType::Q5_0 => format!(
            "  let d = q_half({name}_w({p2}u + (u >> 1u)), u & 1u);\n  let q = {name}[u];\n  \
             let qh = {name}_w({p1}u + u);\n  var acc = 0i;\n{}  \
             return (d * x.d) * f32(acc - 16i * (x.lo + x.hi));\n",
            nibble_dots(&fifth)
        ),
        DType::Q4_1 => format!(
            "  let dm = {name}_w({p1}u + u);\n  let q = {name}[u];\n  var acc = 0i;\n{}  \
             return (q_half(dm, 0u) * x.d) * f32(acc) + q_half(dm, 1u) * x.sx;\n",
            nibble_dots(&none)
        ),
        DType::Q5_1 => format!(
            "  let dm = {name}_w({p2}u + u);\n  let q = {name}[u];\n  let qh = {name}_w({p1}u + u);\n  \
             var acc = 0i;\n{}  return (q_half(dm, 0u) * x.d) * f32(acc) + q_half(dm, 1u) * x.sx;\n",
            nibble_dots(&fifth)
        ),
        DType::Q4K | DType::Q5K => {
            let high = |v: &str, k: u32| {
                if dtype == DType::Q5K {
                    format!(" | (((({v}[{k}] >> sb) & 0x01010101u)) << 4u)")
                } else {
                    String::new()
                }
            };
            format!(
                "{}  var acc = 0i;\n{}{}  \
                 return (scale * x.d) * f32(acc) - minimum * x.sx;\n",
                k_unit_loads(name, dtype, p1, p2),
                unrolled(4, |k| format!(
                    "acc = acc + dot4I8Packed(((qa[{k}] >> shift) & 0x0f0f0f0fu){}, x.q[{k}]);",
                    high("ha", k)
                )),
                unrolled(4, |k| format!(
                    "acc = acc + dot4I8Packed(((qb[{k}] >> shift) & 0x0f0f0f0fu){}, x.q[{}]);",
                    high("hb", k),
                    k + 4
                )),
            )
        }
        DType::Q6K => format!(
            "{}  var a0 = 0i;\n  var a1 = 0i;\n{}{}  \
             return ((d * sc0) * x.d) * f32(a0 - 32i * x.lo) + ((d * sc1) * x.d) * f32(a1 - 32i * x.hi);\n",
            q6k_unit_loads(name, p1, p2),
            unrolled(4, |k| format!(
                "a0 = a0 + dot4I8Packed(((la[{k}] >> lo_shift) & 0x0f0f0f0fu) | (((ha[{k}] >> hi_shift) & 0x03030303u) << 4u), x.q[{k}]);"
            )),
            unrolled(4, |k| format!(
                "a1 = a1 + dot4I8Packed(((lb[{k}] >> lo_shift) & 0x0f0f0f0fu) | (((hb[{k}] >> hi_shift) & 0x03030303u) << 4u), x.q[{}]);",
                k + 4
            )),
        ),
        DType::F32 | DType::F16 | DType::BF16 | DType::U32 => return,
    };
    let _ = write!(out, "fn {name}_idot(u: u32, x: QX) -> f32 {{\n{body}}}\n");
    helpers(out);
    if !out.contains(QX_HELPERS) {
        out.push_str(QX_HELPERS);
    }
}
