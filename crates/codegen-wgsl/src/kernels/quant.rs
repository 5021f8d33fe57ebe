//! Block-quantized weights on the GPU: the layout a plan stores ggml's
//! blocks in ([`gpu_layout`]) and the WGSL that decodes them in registers
//! ([`decoder`]).
//!
//! Every kernel that reads a weight reads a quantized one through the same
//! loaders as a dense one ([`Bindings::weight`](super::Bindings::weight),
//! the matmul templates' chunk loaders): each is built on one function per
//! binding, `fn {name}_q4(c: u32) -> vec4<f32>`, which returns values
//! `4c .. 4c + 4` of the buffer dequantized to f32. In every ggml format
//! four consecutive values from a multiple of 4 share their scales and sit
//! in consecutive bytes of one 32-bit word of each quant array, so a call is
//! one word per array plus the block's scales. The arithmetic is gguf-py's,
//! in its order (`d · sc` first for the K types), so the values are the
//! ones transformers dequantizes.
//!
//! The surprise is the layout. WGSL reads storage as 32-bit words, and four
//! of the formats have blocks of `4k + 2` bytes (Q8_0 34, Q4_0 18, Q5_0 22,
//! Q6_K 210): their blocks would start at odd half-words. So blocks go in
//! pairs with both f16 scales moved to the pair's last word — `[body₀][body₁][d₀ d₁]`,
//! the same bytes in the same space, every field word-aligned (an odd last
//! block is padded by 2 bytes, which the 4-byte rounding of every buffer
//! adds anyway). Blocks of `4k` bytes (Q4_1, Q5_1, Q4_K, Q5_K) stay as ggml
//! writes them. The repacking runs once, when the plan is written, on each
//! weight buffer after its rows are cut, so row shards and concatenations
//! work on ggml's blocks as on any rows.

use gerbil_ir::DType;
use std::fmt::Write;

/// Where a block keeps its f16 scale, if the block is not a whole number of
/// words: the byte offset of the `d` that [`gpu_layout`] moves out.
fn moved_scale(dtype: DType) -> Option<usize> {
    let (_, bytes) = dtype.block();
    if !dtype.is_quantized() || bytes % 4 == 0 {
        return None;
    }
    dtype.block_f16_fields().first().map(|&o| o as usize)
}

/// `ggml`, whole blocks of `dtype` as ggml writes them, in the layout the
/// kernels read (see the module documentation), padded to a multiple of 4
/// bytes. Plain dtypes and word-aligned blocks are only padded.
pub fn gpu_layout(dtype: DType, ggml: &[u8]) -> Vec<u8> {
    let block = dtype.block().1 as usize;
    let mut out = Vec::with_capacity(ggml.len() + 4);
    match moved_scale(dtype) {
        None => out.extend_from_slice(ggml),
        Some(at) => {
            for pair in ggml.chunks(2 * block) {
                let mut scales = [0u8; 4];
                for (i, b) in pair.chunks(block).enumerate() {
                    out.extend_from_slice(&b[..at.min(b.len())]);
                    out.extend_from_slice(b.get(at + 2..).unwrap_or(&[]));
                    if let Some(d) = b.get(at..at + 2) {
                        scales[2 * i..2 * i + 2].copy_from_slice(d);
                    }
                }
                out.extend_from_slice(&scales);
            }
        }
    }
    out.resize(out.len().div_ceil(4) * 4, 0);
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
";

/// The WGSL addressing a paired block `b` of `body` words: `base` (the
/// pair's first word), `body` (this block's first word) and `d` (its f16
/// scale).
fn paired(name: &str, body_words: u32) -> String {
    let pair = 2 * body_words + 1;
    format!(
        "  let p = b >> 1u;\n  let s = b & 1u;\n  let body = p * {pair}u + s * {body_words}u;\n  \
         let d = q_half({name}[p * {pair}u + {}u], s);\n",
        2 * body_words
    )
}

/// The K types' scale and minimum of sub-block `sb` (0..8) from the three
/// scale words at `base + 1`, and `d`, `dmin` from word `base`.
fn k_scales(name: &str) -> String {
    format!(
        "  let dd = {name}[base];\n  let s0 = q_bytes({name}[base + 1u]);\n  \
         let s1 = q_bytes({name}[base + 2u]);\n  let s2 = q_bytes({name}[base + 3u]);\n  \
         let k = sb & 3u;\n  var sc = s0[k] & 63u;\n  var mn = s1[k] & 63u;\n  \
         if (sb >= 4u) {{\n    sc = (s2[k] & 15u) | ((s0[k] >> 6u) << 4u);\n    \
         mn = (s2[k] >> 4u) | ((s1[k] >> 6u) << 4u);\n  }}\n  \
         let scale = q_half(dd, 0u) * f32(sc);\n  let minimum = q_half(dd, 1u) * f32(mn);\n"
    )
}

/// `fn {name}_q4(c: u32) -> vec4<f32>`: values `4c .. 4c + 4` of binding
/// `name` (an `array<u32>` in [`gpu_layout`]) of quantized `dtype`, with the
/// helpers it needs. Appends nothing for a plain dtype.
pub(super) fn decoder(out: &mut String, name: &str, dtype: DType) {
    let body = match dtype {
        DType::Q8_0 => format!(
            "  let b = c >> 3u;\n{}  let w = {name}[body + (c & 7u)];\n  \
             let q = bitcast<vec4<i32>>(vec4<u32>(w) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);\n  \
             return d * vec4<f32>(q);\n",
            paired(name, 8)
        ),
        DType::Q4_0 => format!(
            "  let b = c >> 3u;\n  let i = c & 7u;\n{}  \
             return d * (q_nibbles({name}[body + (i & 3u)], (i >> 2u) * 4u) - vec4<f32>(8.0f));\n",
            paired(name, 4)
        ),
        DType::Q5_0 => format!(
            "  let b = c >> 3u;\n  let i = c & 7u;\n{}  \
             let hi = vec4<f32>(((vec4<u32>({name}[body] >> (4u * i)) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) << vec4<u32>(4u));\n  \
             return d * (q_nibbles({name}[body + 1u + (i & 3u)], (i >> 2u) * 4u) + hi - vec4<f32>(16.0f));\n",
            paired(name, 5)
        ),
        DType::Q4_1 => format!(
            "  let b = c >> 3u;\n  let i = c & 7u;\n  let base = b * 5u;\n  \
             let dm = {name}[base];\n  \
             return q_half(dm, 0u) * q_nibbles({name}[base + 1u + (i & 3u)], (i >> 2u) * 4u) + vec4<f32>(q_half(dm, 1u));\n"
        ),
        DType::Q5_1 => format!(
            "  let b = c >> 3u;\n  let i = c & 7u;\n  let base = b * 6u;\n  \
             let dm = {name}[base];\n  \
             let hi = vec4<f32>(((vec4<u32>({name}[base + 1u] >> (4u * i)) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) << vec4<u32>(4u));\n  \
             return q_half(dm, 0u) * (q_nibbles({name}[base + 2u + (i & 3u)], (i >> 2u) * 4u) + hi) + vec4<f32>(q_half(dm, 1u));\n"
        ),
        DType::Q4K => format!(
            "  let base = (c >> 6u) * 36u;\n  let j = (c & 63u) * 4u;\n  let sb = j >> 5u;\n{}  \
             let q = q_nibbles({name}[base + 4u + (j >> 6u) * 8u + ((j & 31u) >> 2u)], (sb & 1u) * 4u);\n  \
             return scale * q - vec4<f32>(minimum);\n",
            k_scales(name)
        ),
        DType::Q5K => format!(
            "  let base = (c >> 6u) * 44u;\n  let j = (c & 63u) * 4u;\n  let sb = j >> 5u;\n{}  \
             let lo = q_nibbles({name}[base + 12u + (j >> 6u) * 8u + ((j & 31u) >> 2u)], (sb & 1u) * 4u);\n  \
             let hi = vec4<f32>(q_bits({name}[base + 4u + ((j & 31u) >> 2u)], sb, 1u) << vec4<u32>(4u));\n  \
             return scale * (lo + hi) - vec4<f32>(minimum);\n",
            k_scales(name)
        ),
        DType::Q6K => format!(
            "  let b = c >> 6u;\n  let j = (c & 63u) * 4u;\n{}  \
             let h = j >> 7u;\n  let r = j & 127u;\n  \
             let lo = q_bits({name}[body + (64u * h + (r & 63u)) / 4u], 4u * (r >> 6u), 15u);\n  \
             let hi = q_bits({name}[body + 32u + (32u * h + (r & 31u)) / 4u], 2u * (r >> 5u), 3u);\n  \
             let sw = {name}[body + 48u + (j >> 6u)];\n  \
             let sc = f32(bitcast<i32>(sw << (24u - 8u * ((j >> 4u) & 3u))) >> 24u);\n  \
             return (d * sc) * (vec4<f32>(lo | (hi << vec4<u32>(4u))) - vec4<f32>(32.0f));\n",
            paired(name, 52)
        ),
        DType::F32 | DType::F16 | DType::BF16 | DType::U32 => return,
    };
    let _ = write!(out, "fn {name}_q4(c: u32) -> vec4<f32> {{\n{body}}}\n");
    if !out.contains(HELPERS) {
        out.push_str(HELPERS);
    }
    if !out.contains(super::F16_DECODE) {
        out.push_str(super::F16_DECODE);
    }
}

/// The WGSL type of one 32-value unit of `x` in [`dot_decoder`]'s dot
/// products: eight `vec4`s in order.
pub(super) const UNIT: &str = "array<vec4<f32>, 8>";

/// Helpers of the block dot products (emitted once per module).
const DOT_HELPERS: &str = "fn q_signed(w: u32) -> vec4<f32> {
  return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}
fn q_xsum(x: array<vec4<f32>, 8>) -> f32 {
  let s = x[0] + x[1] + x[2] + x[3] + x[4] + x[5] + x[6] + x[7];
  return s.x + s.y + s.z + s.w;
}
";

/// `n` lines `f(k)`, `k = 0..n`, each indented and ended.
fn unrolled(n: u32, f: impl Fn(u32) -> String) -> String {
    (0..n).map(|k| format!("  {}\n", f(k))).collect()
}

/// The fifth bits of four values as f32 `16`s: bits `shift..shift + 4` of `qh`.
fn fifth_bits(qh: &str, shift: &str) -> String {
    format!("vec4<f32>((((vec4<u32>({qh} >> ({shift})) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) << vec4<u32>(4u)))")
}

/// `fn {name}_qdot(u: u32, x: array<vec4<f32>, 8>) -> f32`: the dot product
/// of 32-value unit `u` of binding `name` (quantized `dtype` in
/// [`gpu_layout`]) with `x`, for the decode GEMV. Where [`decoder`] scales
/// every value, this sums the unit's quants times `x` once per scale and
/// scales the sum, `a · Σ q·x + b · Σ x` for a format whose values are
/// `a · q + b` (the offset of the symmetric formats is taken from `q`
/// first, so their sums do not cancel): one multiply-add per value. A unit
/// is a 32-value block, a sub-block of Q4_K and Q5_K, or a quarter of a
/// Q6_K half (two 16-value scales). Appends nothing for a plain dtype.
pub(super) fn dot_decoder(out: &mut String, name: &str, dtype: DType) {
    let body = match dtype {
        DType::Q8_0 => format!(
            "  let b = u;\n{}  var acc = 0.0f;\n{}  return d * acc;\n",
            paired(name, 8),
            unrolled(8, |k| format!(
                "acc = acc + dot(q_signed({name}[body + {k}u]), x[{k}]);"
            ))
        ),
        DType::Q4_0 => format!(
            "  let b = u;\n{}  var acc = 0.0f;\n{}  return d * acc;\n",
            paired(name, 4),
            unrolled(4, |k| format!(
                "let qw{k} = {name}[body + {k}u];\n  acc = acc + dot(q_nibbles(qw{k}, 0u) - vec4<f32>(8.0f), x[{k}]) + dot(q_nibbles(qw{k}, 4u) - vec4<f32>(8.0f), x[{}]);",
                k + 4
            ))
        ),
        DType::Q5_0 => format!(
            "  let b = u;\n{}  let qh = {name}[body];\n  var acc = 0.0f;\n{}  return d * acc;\n",
            paired(name, 5),
            unrolled(4, |k| format!(
                "let qw{k} = {name}[body + {}u];\n  acc = acc + dot(q_nibbles(qw{k}, 0u) + {} - vec4<f32>(16.0f), x[{k}]) + dot(q_nibbles(qw{k}, 4u) + {} - vec4<f32>(16.0f), x[{}]);",
                k + 1,
                fifth_bits("qh", &format!("{}u", 4 * k)),
                fifth_bits("qh", &format!("{}u", 16 + 4 * k)),
                k + 4
            ))
        ),
        DType::Q4_1 | DType::Q5_1 => {
            let (words, qs) = if dtype == DType::Q4_1 { (5, 1) } else { (6, 2) };
            let high = |shift: u32| {
                if dtype == DType::Q5_1 {
                    format!(" + {}", fifth_bits("qh", &format!("{shift}u")))
                } else {
                    String::new()
                }
            };
            format!(
                "  let base = u * {words}u;\n  let dm = {name}[base];\n{}  var acc = 0.0f;\n{}  \
                 return q_half(dm, 0u) * acc + q_half(dm, 1u) * q_xsum(x);\n",
                if dtype == DType::Q5_1 {
                    format!("  let qh = {name}[base + 1u];\n")
                } else {
                    String::new()
                },
                unrolled(4, |k| format!(
                    "let qw{k} = {name}[base + {}u];\n  acc = acc + dot(q_nibbles(qw{k}, 0u){}, x[{k}]) + dot(q_nibbles(qw{k}, 4u){}, x[{}]);",
                    k + qs,
                    high(4 * k),
                    high(16 + 4 * k),
                    k + 4
                ))
            )
        }
        DType::Q4K | DType::Q5K => {
            let (words, qs) = if dtype == DType::Q4K { (36, 4) } else { (44, 12) };
            let high = |k: u32| {
                if dtype == DType::Q5K {
                    format!(" + vec4<f32>(q_bits({name}[base + {}u], sb, 1u) << vec4<u32>(4u))", 4 + k)
                } else {
                    String::new()
                }
            };
            format!(
                "  let base = (u >> 3u) * {words}u;\n  let sb = u & 7u;\n{}  let qs = base + {qs}u + (sb >> 1u) * 8u;\n  \
                 let shift = (sb & 1u) * 4u;\n  var acc = 0.0f;\n{}  return scale * acc - minimum * q_xsum(x);\n",
                k_scales(name),
                unrolled(8, |k| format!(
                    "acc = acc + dot(q_nibbles({name}[qs + {k}u], shift){}, x[{k}]);",
                    high(k)
                ))
            )
        }
        DType::Q6K => format!(
            "  let b = u >> 3u;\n  let v = u & 7u;\n{}  let h = v >> 2u;\n  \
             let ql = body + 16u * h + 8u * (v & 1u);\n  let lo_shift = 4u * ((v & 3u) >> 1u);\n  \
             let qh = body + 32u + 8u * h;\n  let hi_shift = 2u * (v & 3u);\n  \
             let sw = {name}[body + 48u + (v >> 1u)];\n  let sh = 16u * (v & 1u);\n  \
             let sc0 = f32(bitcast<i32>(sw << (24u - sh)) >> 24u);\n  \
             let sc1 = f32(bitcast<i32>(sw << (16u - sh)) >> 24u);\n  var s0 = 0.0f;\n  var s1 = 0.0f;\n{}  \
             return (d * sc0) * s0 + (d * sc1) * s1;\n",
            paired(name, 52),
            unrolled(8, |k| format!(
                "{} = {} + dot(vec4<f32>(q_bits({name}[ql + {k}u], lo_shift, 15u) | (q_bits({name}[qh + {k}u], hi_shift, 3u) << vec4<u32>(4u))) - vec4<f32>(32.0f), x[{k}]);",
                if k < 4 { "s0" } else { "s1" },
                if k < 4 { "s0" } else { "s1" },
            ))
        ),
        DType::F32 | DType::F16 | DType::BF16 | DType::U32 => return,
    };
    let _ = write!(
        out,
        "fn {name}_qdot(u: u32, x: {UNIT}) -> f32 {{\n{body}}}\n"
    );
    for helpers in [HELPERS, DOT_HELPERS, super::F16_DECODE] {
        if !out.contains(helpers) {
            out.push_str(helpers);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_blocks_keep_every_byte_and_align_every_field() {
        // Three Q4_0 blocks of 18 bytes: d = bytes 0..2, then 16 quant bytes.
        let ggml: Vec<u8> = (0..54u8).collect();
        let gpu = gpu_layout(DType::Q4_0, &ggml);
        // Pair 0: body 0, body 1, then d0 d1; block 2: body, d, padding.
        let mut want: Vec<u8> = (2..18).chain(20..36).chain([0, 1, 18, 19]).collect();
        want.extend((38..54).chain([36, 37, 0, 0]));
        assert_eq!(gpu, want);
        // Q6_K keeps its d last: the same move from its end.
        let q6: Vec<u8> = (0..210).map(|i| (i % 251) as u8).collect();
        let gpu = gpu_layout(DType::Q6K, &q6);
        assert_eq!(&gpu[..208], &q6[..208]);
        assert_eq!(&gpu[208..210], &q6[208..]);
        assert_eq!(gpu.len(), 212);
        // Word-aligned blocks are unchanged.
        let q41: Vec<u8> = (0..40).collect();
        assert_eq!(gpu_layout(DType::Q4_1, &q41), q41);
    }
}
