//! Block-quantized weights on the GPU: the layout a plan stores ggml's
//! blocks in ([`gpu_layout`]) and the WGSL that decodes them in registers
//! ([`declare`], [`dot_decoder`], and with int8 activations
//! [`int_dot_decoder`]).
//!
//! Every kernel that reads a weight reads a quantized one through the same
//! loaders as a dense one (`load_`, `pair_` and the matmul templates' chunk
//! loaders): each is built on one function per binding,
//! `fn {name}_q4(c: u32) -> vec4<f32>`, which returns values `4c .. 4c + 4`
//! of the binding dequantized to f32 ([`declare`]). The decode GEMV instead
//! dots a whole 32-value unit with `x` and scales the sum once
//! ([`dot_decoder`]). In every ggml format four consecutive values from a
//! multiple of 4 share their scales and sit in consecutive bytes of one
//! 32-bit word of each quant array. The arithmetic of `_q4` is gguf-py's, in
//! its order (`d · sc` first for the K types), so its values are the ones
//! transformers dequantizes.
//!
//! The surprise is the layout: not ggml's array of blocks but *planes*. A
//! buffer of `n` blocks holds, for each field group of the format in turn,
//! that group of all `n` blocks — the quants first (16, 32, 128 or 192
//! bytes a block), then the high bits, the scale words, the f16 scales — so
//! a thread reads its block's quants with 16-byte loads and the threads of
//! a subgroup, on consecutive blocks, read consecutive memory in one
//! instruction. In ggml's layout each thread's block starts 18 or 34 bytes
//! after the last, and every load instruction of a subgroup touched all of
//! its blocks' cache lines: a Q4_0 decode GEMV ran at a quarter of the
//! bandwidth of bf16 (H100). The planes take exactly ggml's bytes; the
//! buffer is padded to 16 bytes, and the binding is an `array<vec4<u32>, N>`
//! of exactly its size (a fixed size, so a browser checks indices against a
//! constant: [`Bindings::weight_vectors`](super::Bindings::weight_vectors)).
//! The repacking runs once, when the plan is written, on each weight buffer
//! after its rows are cut, so row shards and concatenations work on ggml's
//! blocks as on any rows; the decoders know each binding's block count
//! ([`Bindings::matrix`](super::Bindings::matrix)). No decoder indexes a
//! vector with a run-time index (`v[i & 3]`), which NVIDIA's compiler may
//! keep in local memory: `q_pick` selects instead.

mod int_dot;

pub(super) use int_dot::{int_dot_decoder, qw_words};

use super::{Bindings, F16_DECODE};
use gerbil_ir::DType;
use gerbil_plan::{Access, Elem, Port};
use std::fmt::Write;

/// The planes of `dtype`: byte ranges of a ggml block, in plane order.
fn planes(dtype: DType) -> &'static [(usize, usize)] {
    match dtype {
        DType::Q8_0 => &[(2, 34), (0, 2)],
        DType::Q4_0 => &[(2, 18), (0, 2)],
        DType::Q5_0 => &[(6, 22), (2, 6), (0, 2)],
        DType::Q4_1 => &[(4, 20), (0, 4)],
        DType::Q5_1 => &[(8, 24), (4, 8), (0, 4)],
        DType::Q4K => &[(16, 144), (0, 16)],
        DType::Q5K => &[(48, 176), (16, 48), (0, 16)],
        DType::Q6K => &[(0, 192), (192, 208), (208, 210)],
        DType::F32 | DType::F16 | DType::BF16 | DType::U32 => &[],
    }
}

/// Whether consecutive rows of a stored `dtype` buffer are one byte range
/// of it: for plain dtypes; a quantized buffer keeps each plane of every
/// block together, so a run of rows is spread over the planes.
pub fn rows_are_ranges(dtype: DType) -> bool {
    planes(dtype).is_empty()
}

/// The first word of each plane of a buffer of `blocks` blocks of `dtype`.
fn plane_words(dtype: DType, blocks: u64) -> Vec<u64> {
    let mut at = 0;
    planes(dtype)
        .iter()
        .map(|&(a, b)| {
            let start = at;
            at += blocks * (b - a) as u64 / 4;
            start
        })
        .collect()
}

/// Bytes of a buffer of `values` values of quantized `dtype` as the plan
/// stores it: ggml's bytes, padded to 16.
pub fn stored_bytes(dtype: DType, values: u64) -> Option<u64> {
    Some(dtype.bytes_for(values)?.div_ceil(16).saturating_mul(16))
}

/// `ggml`, whole blocks of `dtype` as ggml writes them, in the plane layout
/// the kernels read (see the module documentation), padded to 16 bytes.
/// Plain dtypes are only padded to 4.
pub fn gpu_layout(dtype: DType, ggml: &[u8]) -> Vec<u8> {
    let block = dtype.block().1 as usize;
    let mut out = Vec::with_capacity(ggml.len() + 16);
    for &(a, b) in planes(dtype) {
        for blk in ggml.chunks_exact(block) {
            out.extend_from_slice(&blk[a..b]);
        }
    }
    if planes(dtype).is_empty() {
        out.extend_from_slice(ggml);
    }
    let align = if dtype.is_quantized() { 16 } else { 4 };
    out.resize(out.len().div_ceil(align) * align, 0);
    out
}

/// Shared WGSL helpers of the decoders (emitted once per module).
const HELPERS: &str = "fn q_bytes(w: u32) -> vec4<u32> {
  return (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
}
fn q_nibbles(w: u32, shift: u32) -> vec4<f32> {
  return vec4<f32>((vec4<u32>(w >> shift) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xfu));
}
fn q_bits(w: u32, shift: u32, mask: u32) -> vec4<u32> {
  return (q_bytes(w) >> vec4<u32>(shift)) & vec4<u32>(mask);
}
fn q_half(w: u32, hi: u32) -> f32 { return f16_bits_to_f32((w >> (16u * hi)) & 0xffffu); }
fn q_signed(w: u32) -> vec4<f32> {
  return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}
fn q_pick(v: vec4<u32>, k: u32) -> u32 {
  return select(select(v.x, v.y, k == 1u), select(v.z, v.w, k == 3u), k >= 2u);
}
fn q_pickf(v: vec4<f32>, k: u32) -> f32 {
  return select(select(v.x, v.y, k == 1u), select(v.z, v.w, k == 3u), k >= 2u);
}
fn q_xsum(x: array<vec4<f32>, 8>) -> f32 {
  let s = x[0] + x[1] + x[2] + x[3] + x[4] + x[5] + x[6] + x[7];
  return s.x + s.y + s.z + s.w;
}
";

/// Emits the helpers a decoder uses, once per module.
fn helpers(out: &mut String) {
    for h in [HELPERS, F16_DECODE] {
        if !out.contains(h) {
            out.push_str(h);
        }
    }
}

/// The K types' scale and minimum of sub-block `sb` (0..8) from their
/// 16-byte header `hdr` (`vec4<u32>`: `d | dmin << 16`, then the 12 bytes
/// of 6-bit scales and minimums).
const K_SCALES: &str = "  let kb = 8u * (sb & 3u);\n  let s0 = (hdr.y >> kb) & 0xffu;\n  \
     let s1 = (hdr.z >> kb) & 0xffu;\n  let s2 = (hdr.w >> kb) & 0xffu;\n  \
     var sc = s0 & 63u;\n  var mn = s1 & 63u;\n  \
     if (sb >= 4u) {\n    sc = (s2 & 15u) | ((s0 >> 6u) << 4u);\n    \
     mn = (s2 >> 4u) | ((s1 >> 6u) << 4u);\n  }\n  \
     let scale = q_half(hdr.x, 0u) * f32(sc);\n  let minimum = q_half(hdr.x, 1u) * f32(mn);\n";

/// The fifth bits of four values as f32 `16`s: bits `shift..shift + 4` of `qh`.
fn fifth_bits(qh: &str, shift: &str) -> String {
    format!("vec4<f32>((((vec4<u32>({qh} >> ({shift})) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) << vec4<u32>(4u)))")
}

/// Declares binding `name`, `values` values of quantized `dtype` in the
/// plane layout, as an `array<vec4<u32>>` with `{name}_w(i)` (word `i`),
/// `{name}_q4(c)` (values `4c..4c + 4` in f32), `load_{name}(i)` and
/// `pair_{name}(word)` (values `2·word`, `2·word + 1`).
pub(super) fn declare(
    b: &mut Bindings,
    out: &mut String,
    port: Port,
    name: &str,
    dtype: DType,
    values: u64,
) {
    let n = b.push(name, port, Access::Read, Elem::Blocks);
    let p = plane_words(dtype, values / dtype.block().0);
    let plane = |i: usize| p.get(i).copied().unwrap_or(0);
    let (p1, p2) = (plane(1), plane(2));
    let body = match dtype {
        DType::Q8_0 => format!(
            "  let b = c >> 3u;\n  let d = q_half({name}_w({p1}u + (b >> 1u)), b & 1u);\n  \
             return d * q_signed({name}_w(b * 8u + (c & 7u)));\n"
        ),
        DType::Q4_0 => format!(
            "  let b = c >> 3u;\n  let i = c & 7u;\n  let d = q_half({name}_w({p1}u + (b >> 1u)), b & 1u);\n  \
             return d * (q_nibbles({name}_w(b * 4u + (i & 3u)), (i >> 2u) * 4u) - vec4<f32>(8.0f));\n"
        ),
        DType::Q5_0 => format!(
            "  let b = c >> 3u;\n  let i = c & 7u;\n  let d = q_half({name}_w({p2}u + (b >> 1u)), b & 1u);\n  \
             let hi = {};\n  \
             return d * (q_nibbles({name}_w(b * 4u + (i & 3u)), (i >> 2u) * 4u) + hi - vec4<f32>(16.0f));\n",
            fifth_bits(&format!("{name}_w({p1}u + b)"), "4u * i")
        ),
        DType::Q4_1 => format!(
            "  let b = c >> 3u;\n  let i = c & 7u;\n  let dm = {name}_w({p1}u + b);\n  \
             return q_half(dm, 0u) * q_nibbles({name}_w(b * 4u + (i & 3u)), (i >> 2u) * 4u) + vec4<f32>(q_half(dm, 1u));\n"
        ),
        DType::Q5_1 => format!(
            "  let b = c >> 3u;\n  let i = c & 7u;\n  let dm = {name}_w({p2}u + b);\n  let hi = {};\n  \
             return q_half(dm, 0u) * (q_nibbles({name}_w(b * 4u + (i & 3u)), (i >> 2u) * 4u) + hi) + vec4<f32>(q_half(dm, 1u));\n",
            fifth_bits(&format!("{name}_w({p1}u + b)"), "4u * i")
        ),
        DType::Q4K | DType::Q5K => {
            let header = if dtype == DType::Q4K { p1 } else { p2 };
            let high = if dtype == DType::Q5K {
                format!(
                    " + vec4<f32>(q_bits({name}_w({p1}u + s * 8u + ((j & 31u) >> 2u)), sb, 1u) << vec4<u32>(4u))"
                )
            } else {
                String::new()
            };
            format!(
                "  let s = c >> 6u;\n  let j = (c & 63u) * 4u;\n  let sb = j >> 5u;\n  \
                 let hdr = {name}[{}u + s];\n{K_SCALES}  \
                 let q = q_nibbles({name}_w(s * 32u + (j >> 6u) * 8u + ((j & 31u) >> 2u)), (sb & 1u) * 4u){high};\n  \
                 return scale * q - vec4<f32>(minimum);\n",
                header / 4
            )
        }
        DType::Q6K => format!(
            "  let s = c >> 6u;\n  let j = (c & 63u) * 4u;\n  let h = j >> 7u;\n  let r = j & 127u;\n  \
             let lo = q_bits({name}_w(s * 48u + 16u * h + ((r & 63u) >> 2u)), 4u * (r >> 6u), 15u);\n  \
             let hi = q_bits({name}_w(s * 48u + 32u + 8u * h + ((r & 31u) >> 2u)), 2u * (r >> 5u), 3u);\n  \
             let sw = {name}_w({p1}u + s * 4u + (j >> 6u));\n  \
             let sc = f32(bitcast<i32>(sw << (24u - 8u * ((j >> 4u) & 3u))) >> 24u);\n  \
             let d = q_half({name}_w({p2}u + (s >> 1u)), s & 1u);\n  \
             return (d * sc) * (vec4<f32>(lo | (hi << vec4<u32>(4u))) - vec4<f32>(32.0f));\n"
        ),
        DType::F32 | DType::F16 | DType::BF16 | DType::U32 => String::new(),
    };
    let array = super::array_type("vec4<u32>", 16, stored_bytes(dtype, values).unwrap_or(0));
    let _ = write!(
        out,
        "@group(0) @binding({n}) var<storage, read> {name}: {array};\n\
         fn {name}_w(i: u32) -> u32 {{ return q_pick({name}[i >> 2u], i & 3u); }}\n\
         fn {name}_q4(c: u32) -> vec4<f32> {{\n{body}}}\n\
         fn load_{name}(i: u32) -> f32 {{ return q_pickf({name}_q4(i >> 2u), i & 3u); }}\n\
         fn pair_{name}(word: u32) -> vec2<f32> {{\n  let q = {name}_q4(word >> 1u);\n  \
         return select(q.xy, q.zw, (word & 1u) == 1u);\n}}\n"
    );
    helpers(out);
}

/// The WGSL type of one 32-value unit of `x` in [`dot_decoder`]'s dot
/// products: eight `vec4`s in order.
pub(super) const UNIT: &str = "array<vec4<f32>, 8>";

/// `n` lines `f(k)`, `k = 0..n`, each indented and ended.
fn unrolled(n: u32, f: impl Fn(u32) -> String) -> String {
    (0..n).map(|k| format!("  {}\n", f(k))).collect()
}

/// The opening of a Q4_K or Q5_K unit decoder (a 32-value sub-block `u`):
/// its super-block `s` and sub-block `sb`, their `scale` and `minimum`
/// ([`K_SCALES`]), the quant vectors `qa` and `qb`, Q5_K's high-bit vectors
/// `ha` and `hb`, and the nibble `shift`; shared by [`dot_decoder`] and
/// [`int_dot_decoder`].
fn k_unit_loads(name: &str, dtype: DType, p1: u64, p2: u64) -> String {
    let header = if dtype == DType::Q4K { p1 } else { p2 };
    let qh = if dtype == DType::Q5K {
        format!(
            "  let ha = {name}[{}u + 2u * s];\n  let hb = {name}[{}u + 2u * s + 1u];\n",
            p1 / 4,
            p1 / 4
        )
    } else {
        String::new()
    };
    format!(
        "  let s = u >> 3u;\n  let sb = u & 7u;\n  let hdr = {name}[{}u + s];\n{K_SCALES}  \
         let qa = {name}[8u * s + 2u * (sb >> 1u)];\n  let qb = {name}[8u * s + 2u * (sb >> 1u) + 1u];\n{qh}  \
         let shift = (sb & 1u) * 4u;\n",
        header / 4
    )
}

/// The opening of a Q6_K unit decoder (a quarter of a 128-value half): the
/// low and high quant vectors `la`, `lb`, `ha`, `hb` and their shifts, the
/// two 16-value scales `sc0`, `sc1` and the super-block scale `d`; shared
/// by [`dot_decoder`] and [`int_dot_decoder`].
fn q6k_unit_loads(name: &str, p1: u64, p2: u64) -> String {
    format!(
        "  let s = u >> 3u;\n  let v = u & 7u;\n  let h = v >> 2u;\n  \
         let la = {name}[12u * s + 4u * h + 2u * (v & 1u)];\n  let lb = {name}[12u * s + 4u * h + 2u * (v & 1u) + 1u];\n  \
         let ha = {name}[12u * s + 8u + 2u * h];\n  let hb = {name}[12u * s + 8u + 2u * h + 1u];\n  \
         let lo_shift = 4u * ((v & 3u) >> 1u);\n  let hi_shift = 2u * (v & 3u);\n  \
         let sw = {name}_w({p1}u + 4u * s + (v >> 1u));\n  let sh = 16u * (v & 1u);\n  \
         let sc0 = f32(bitcast<i32>(sw << (24u - sh)) >> 24u);\n  \
         let sc1 = f32(bitcast<i32>(sw << (16u - sh)) >> 24u);\n  \
         let d = q_half({name}_w({p2}u + (s >> 1u)), s & 1u);\n"
    )
}

/// `fn {name}_qdot(u: u32, x: array<vec4<f32>, 8>) -> f32`: the dot product
/// of 32-value unit `u` of binding `name` ([`declare`]d with `values`
/// values of quantized `dtype`) with `x`, for the decode GEMV. Where
/// `_q4` scales every value, this sums the unit's quants times `x` once per
/// scale and scales the sum, `a · Σ q·x + b · Σ x` for a format whose values
/// are `a · q + b` (the offset of the symmetric formats is taken from `q`
/// first, so their sums do not cancel): one multiply-add per value, the
/// quants read with 16-byte loads. A unit is a 32-value block, a sub-block
/// of Q4_K and Q5_K, or a quarter of a Q6_K half (two 16-value scales).
pub(super) fn dot_decoder(out: &mut String, name: &str, dtype: DType, values: u64) {
    let p = plane_words(dtype, values / dtype.block().0);
    let plane = |i: usize| p.get(i).copied().unwrap_or(0);
    let (p1, p2) = (plane(1), plane(2));
    // The dot products of the low and high nibbles of quant vector `q`
    // (`q[k]`: values `4k..4k + 4` and `16 + 4k..`) with `x`, `extra(k, hi)`
    // added to each.
    let nibble_dots = |q: &str, off: &str, extra: &dyn Fn(u32, bool) -> String| {
        unrolled(4, |k| {
            format!(
                "acc = acc + dot(q_nibbles({q}[{k}], 0u){}{off}, x[{k}]) + dot(q_nibbles({q}[{k}], 4u){}{off}, x[{}]);",
                extra(k, false),
                extra(k, true),
                k + 4
            )
        })
    };
    let none = |_: u32, _: bool| String::new();
    let fifth = |k: u32, hi: bool| {
        format!(
            " + {}",
            fifth_bits("qh", &format!("{}u", 4 * k + if hi { 16 } else { 0 }))
        )
    };
    let body = match dtype {
        DType::Q8_0 => format!(
            "  let d = q_half({name}_w({p1}u + (u >> 1u)), u & 1u);\n  let qa = {name}[2u * u];\n  \
             let qb = {name}[2u * u + 1u];\n  var acc = 0.0f;\n{}{}  return d * acc;\n",
            unrolled(4, |k| format!("acc = acc + dot(q_signed(qa[{k}]), x[{k}]);")),
            unrolled(4, |k| format!("acc = acc + dot(q_signed(qb[{k}]), x[{}]);", k + 4)),
        ),
        DType::Q4_0 => format!(
            "  let d = q_half({name}_w({p1}u + (u >> 1u)), u & 1u);\n  let q = {name}[u];\n  \
             var acc = 0.0f;\n{}  return d * acc;\n",
            nibble_dots("q", " - vec4<f32>(8.0f)", &none)
        ),
        DType::Q5_0 => format!(
            "  let d = q_half({name}_w({p2}u + (u >> 1u)), u & 1u);\n  let q = {name}[u];\n  \
             let qh = {name}_w({p1}u + u);\n  var acc = 0.0f;\n{}  return d * acc;\n",
            nibble_dots("q", " - vec4<f32>(16.0f)", &fifth)
        ),
        DType::Q4_1 => format!(
            "  let dm = {name}_w({p1}u + u);\n  let q = {name}[u];\n  var acc = 0.0f;\n{}  \
             return q_half(dm, 0u) * acc + q_half(dm, 1u) * q_xsum(x);\n",
            nibble_dots("q", "", &none)
        ),
        DType::Q5_1 => format!(
            "  let dm = {name}_w({p2}u + u);\n  let q = {name}[u];\n  let qh = {name}_w({p1}u + u);\n  \
             var acc = 0.0f;\n{}  return q_half(dm, 0u) * acc + q_half(dm, 1u) * q_xsum(x);\n",
            nibble_dots("q", "", &fifth)
        ),
        DType::Q4K | DType::Q5K => {
            let high = |v: &str, k: u32| {
                if dtype == DType::Q5K {
                    format!(" + vec4<f32>(q_bits({v}[{k}], sb, 1u) << vec4<u32>(4u))")
                } else {
                    String::new()
                }
            };
            format!(
                "{}  var acc = 0.0f;\n{}{}  \
                 return scale * acc - minimum * q_xsum(x);\n",
                k_unit_loads(name, dtype, p1, p2),
                unrolled(4, |k| format!(
                    "acc = acc + dot(q_nibbles(qa[{k}], shift){}, x[{k}]);",
                    high("ha", k)
                )),
                unrolled(4, |k| format!(
                    "acc = acc + dot(q_nibbles(qb[{k}], shift){}, x[{}]);",
                    high("hb", k),
                    k + 4
                )),
            )
        }
        DType::Q6K => format!(
            "{}  var s0 = 0.0f;\n  var s1 = 0.0f;\n{}{}  \
             return (d * sc0) * s0 + (d * sc1) * s1;\n",
            q6k_unit_loads(name, p1, p2),
            unrolled(4, |k| format!(
                "s0 = s0 + dot(vec4<f32>(q_bits(la[{k}], lo_shift, 15u) | (q_bits(ha[{k}], hi_shift, 3u) << vec4<u32>(4u))) - vec4<f32>(32.0f), x[{k}]);"
            )),
            unrolled(4, |k| format!(
                "s1 = s1 + dot(vec4<f32>(q_bits(lb[{k}], lo_shift, 15u) | (q_bits(hb[{k}], hi_shift, 3u) << vec4<u32>(4u))) - vec4<f32>(32.0f), x[{}]);",
                k + 4
            )),
        ),
        DType::F32 | DType::F16 | DType::BF16 | DType::U32 => return,
    };
    let _ = write!(
        out,
        "fn {name}_qdot(u: u32, x: {UNIT}) -> f32 {{\n{body}}}\n"
    );
    helpers(out);
}

/// `fn {name}_unit(u: u32) -> array<vec4<f32>, 8>`: 32-value unit `u` of
/// binding `name` ([`declare`]d with `values` values of quantized `dtype`)
/// dequantized, in [`dot_decoder`]'s order (vector `k` is what it dots with
/// `x[k]`), from the same loads: for a tile that dots each unit with
/// several rows of `x` ([`matmul_cpu`](super::matmul_cpu)), where
/// [`dot_decoder`] would decode it once per row.
pub(super) fn unit_decoder(out: &mut String, name: &str, dtype: DType, values: u64) {
    let p = plane_words(dtype, values / dtype.block().0);
    let plane = |i: usize| p.get(i).copied().unwrap_or(0);
    let (p1, p2) = (plane(1), plane(2));
    // The nibble vectors of `q` (low nibbles of word `k` first, then the
    // high ones) with `extra(k, hi)` added, each through `value`.
    let nibbles = |value: &dyn Fn(String) -> String, extra: &dyn Fn(u32, bool) -> String| {
        let lo = (0..4).map(|k| value(format!("q_nibbles(q[{k}], 0u){}", extra(k, false))));
        let hi = (0..4).map(|k| value(format!("q_nibbles(q[{k}], 4u){}", extra(k, true))));
        lo.chain(hi).collect::<Vec<_>>()
    };
    let none = |_: u32, _: bool| String::new();
    let fifth = |k: u32, hi: bool| {
        format!(
            " + {}",
            fifth_bits("qh", &format!("{}u", 4 * k + if hi { 16 } else { 0 }))
        )
    };
    let scaled = |offset: &'static str| move |v: String| format!("d * ({v}{offset})");
    let affine = |v: String| format!("a * ({v}) + vec4<f32>(b)");
    let (loads, vectors) = match dtype {
        DType::Q8_0 => (
            format!(
                "  let d = q_half({name}_w({p1}u + (u >> 1u)), u & 1u);\n  let qa = {name}[2u * u];\n  \
                 let qb = {name}[2u * u + 1u];\n"
            ),
            (0..8)
                .map(|k| {
                    let q = if k < 4 { "qa" } else { "qb" };
                    format!("d * q_signed({q}[{}])", k % 4)
                })
                .collect(),
        ),
        DType::Q4_0 => (
            format!("  let d = q_half({name}_w({p1}u + (u >> 1u)), u & 1u);\n  let q = {name}[u];\n"),
            nibbles(&scaled(" - vec4<f32>(8.0f)"), &none),
        ),
        DType::Q5_0 => (
            format!(
                "  let d = q_half({name}_w({p2}u + (u >> 1u)), u & 1u);\n  let q = {name}[u];\n  \
                 let qh = {name}_w({p1}u + u);\n"
            ),
            nibbles(&scaled(" - vec4<f32>(16.0f)"), &fifth),
        ),
        DType::Q4_1 => (
            format!(
                "  let dm = {name}_w({p1}u + u);\n  let q = {name}[u];\n  \
                 let a = q_half(dm, 0u);\n  let b = q_half(dm, 1u);\n"
            ),
            nibbles(&affine, &none),
        ),
        DType::Q5_1 => (
            format!(
                "  let dm = {name}_w({p2}u + u);\n  let q = {name}[u];\n  let qh = {name}_w({p1}u + u);\n  \
                 let a = q_half(dm, 0u);\n  let b = q_half(dm, 1u);\n"
            ),
            nibbles(&affine, &fifth),
        ),
        DType::Q4K | DType::Q5K => (
            k_unit_loads(name, dtype, p1, p2),
            (0..8)
                .map(|k| {
                    let (q, h) = if k < 4 { ("qa", "ha") } else { ("qb", "hb") };
                    let high = if dtype == DType::Q5K {
                        format!(" + vec4<f32>(q_bits({h}[{}], sb, 1u) << vec4<u32>(4u))", k % 4)
                    } else {
                        String::new()
                    };
                    format!(
                        "scale * (q_nibbles({q}[{}], shift){high}) - vec4<f32>(minimum)",
                        k % 4
                    )
                })
                .collect(),
        ),
        DType::Q6K => (
            q6k_unit_loads(name, p1, p2),
            (0..8)
                .map(|k| {
                    let (l, h, sc) = if k < 4 { ("la", "ha", "sc0") } else { ("lb", "hb", "sc1") };
                    format!(
                        "(d * {sc}) * (vec4<f32>(q_bits({l}[{i}], lo_shift, 15u) | \
                         (q_bits({h}[{i}], hi_shift, 3u) << vec4<u32>(4u))) - vec4<f32>(32.0f))",
                        i = k % 4
                    )
                })
                .collect(),
        ),
        DType::F32 | DType::F16 | DType::BF16 | DType::U32 => return,
    };
    let _ = write!(
        out,
        "fn {name}_unit(u: u32) -> {UNIT} {{\n{loads}  return {UNIT}(\n    {});\n}}\n",
        vectors.join(",\n    ")
    );
    helpers(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planes_keep_every_byte_of_every_block() {
        // Three Q4_0 blocks of 18 bytes: d = bytes 0..2, then 16 quant bytes.
        let ggml: Vec<u8> = (0..54u8).collect();
        let gpu = gpu_layout(DType::Q4_0, &ggml);
        // The quants of the three blocks, then their scales, padded to 16.
        let mut want: Vec<u8> = (2..18).chain(20..36).chain(38..54).collect();
        want.extend([0, 1, 18, 19, 36, 37]);
        want.resize(64, 0);
        assert_eq!(gpu, want);
        assert_eq!(stored_bytes(DType::Q4_0, 96), Some(64));
        // Every type's planes tile its block exactly.
        for dtype in gerbil_ir::QUANTIZED {
            let mut covered: Vec<(usize, usize)> = planes(dtype).to_vec();
            covered.sort();
            let mut at = 0;
            for (a, b) in covered {
                assert_eq!(a, at, "{dtype}");
                at = b;
            }
            assert_eq!(at as u64, dtype.block().1, "{dtype}");
        }
        // Plain dtypes are only padded.
        assert_eq!(gpu_layout(DType::BF16, &[1, 2]), vec![1, 2, 0, 0]);
    }
}
