//! ggml's reference quantizers: f32 values in, blocks out
//! ([`TensorType::quantize`]). The 32-value block types are here; the K
//! types' searches are in [`crate::kquant`].
//!
//! ```
//! use gerbil_gguf::TensorType;
//! let values: Vec<f32> = (0..32).map(|i| i as f32 / 8.0 - 2.0).collect();
//! let blocks = TensorType::Q8_0.quantize(&values).unwrap();
//! let mut back = vec![0.0; 32];
//! TensorType::Q8_0.dequantize(&blocks, &mut back).unwrap();
//! assert!(back.iter().zip(&values).all(|(b, v)| (b - v).abs() < 0.01));
//! ```
//!
//! Each is `quantize_row_*_ref` of ggml-quants.c, operation for operation in
//! f32, so the blocks are llama.cpp's and gguf-py's byte for byte (the tests
//! compare with gguf-py on random rows, a zero block, a constant block and
//! rounding ties). The surprise is the rounding: Q8_0 rounds half away from
//! zero (`roundf`), the 4- and 5-bit types add `offset + 0.5` and truncate,
//! and the symmetric ones take their scale from the value of largest
//! magnitude *with its sign* (`d = max / −8`), so the extreme value is
//! exactly `−8 · d` and the other end gets the one spare level.

use crate::kquant;
use crate::types::TensorType;
use half::f16;

/// The block of `x` (one block's values) appended to `out` for each type.
type Quantizer = fn(&[f32], &mut Vec<u8>);

impl TensorType {
    /// The types [`Self::quantize`] writes.
    pub const QUANTIZABLE: [TensorType; 8] = [
        TensorType::Q8_0,
        TensorType::Q4_0,
        TensorType::Q4_1,
        TensorType::Q5_0,
        TensorType::Q5_1,
        TensorType::Q4_K,
        TensorType::Q5_K,
        TensorType::Q6_K,
    ];

    /// `values` (a whole number of blocks) quantized to blocks of this type
    /// as ggml's reference quantizer writes them. Fails, naming the type, for
    /// a type it does not write or a length that is not whole blocks.
    pub fn quantize(self, values: &[f32]) -> Result<Vec<u8>, String> {
        let quantizer: Quantizer = match self {
            Self::Q8_0 => q8_0,
            Self::Q4_0 => |x, out| symmetric(x, 4, out),
            Self::Q4_1 => |x, out| affine(x, 4, out),
            Self::Q5_0 => |x, out| symmetric(x, 5, out),
            Self::Q5_1 => |x, out| affine(x, 5, out),
            Self::Q4_K => |x, out| kquant::affine_k(x, 4, out),
            Self::Q5_K => |x, out| kquant::affine_k(x, 5, out),
            Self::Q6_K => kquant::q6_k,
            other => return Err(format!("gerbil does not quantize to {}", other.name())),
        };
        let len = self.block_len() as usize;
        if !values.len().is_multiple_of(len) {
            return Err(format!(
                "{}: {} values are not whole blocks of {len}",
                self.name(),
                values.len()
            ));
        }
        let mut out = Vec::with_capacity(values.len() / len * self.block_bytes() as usize);
        for block in values.chunks_exact(len) {
            quantizer(block, &mut out);
        }
        Ok(out)
    }
}

/// `1 / d`, or 0 for a zero scale.
fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

fn q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    out.extend(f16::from_f32(d).to_le_bytes());
    out.extend(x.iter().map(|v| (v * id).round() as i8 as u8));
}

/// Q4_0 and Q5_0: `d = max / −2^(bits−1)` from the value of largest
/// magnitude (the first such), `q = min(2^bits − 1, trunc(x / d + 2^(bits−1) + 0.5))`.
fn symmetric(x: &[f32], bits: u32, out: &mut Vec<u8>) {
    let max = x
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let half = (1u32 << (bits - 1)) as f32;
    let d = max / -half;
    let id = inverse(d);
    out.extend(f16::from_f32(d).to_le_bytes());
    let q: Vec<u8> = x
        .iter()
        .map(|v| ((v * id + (half + 0.5)) as u8).min((1 << bits) - 1))
        .collect();
    pack(&q, bits, out);
}

/// Q4_1 and Q5_1: `d = (max − min) / (2^bits − 1)`, `q = min(2^bits − 1,
/// trunc((x − min) / d + 0.5))`, the minimum stored after the scale.
fn affine(x: &[f32], bits: u32, out: &mut Vec<u8>) {
    let (min, max) = x
        .iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let top = (1u32 << bits) - 1;
    let d = (max - min) / top as f32;
    let id = inverse(d);
    out.extend(f16::from_f32(d).to_le_bytes());
    out.extend(f16::from_f32(min).to_le_bytes());
    let q: Vec<u8> = x
        .iter()
        .map(|v| (((v - min) * id + 0.5) as u8).min(top as u8))
        .collect();
    pack(&q, bits, out);
}

/// The quants of one block as ggml packs them: for 5 bits first the fifth
/// bits (`qh`, bit `j` for value `j`), then for both value `j`'s low nibble
/// with value `j + 16`'s above it.
fn pack(q: &[u8], bits: u32, out: &mut Vec<u8>) {
    if bits == 5 {
        let qh = q
            .iter()
            .enumerate()
            .fold(0u32, |h, (j, &v)| h | (u32::from(v >> 4) << j));
        out.extend(qh.to_le_bytes());
    }
    let (lo, hi) = q.split_at(q.len() / 2);
    out.extend(lo.iter().zip(hi).map(|(&a, &b)| (a & 0x0f) | (b << 4)));
}
