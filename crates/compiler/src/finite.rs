//! The non-finite weight check: every checkpoint tensor a graph reads is
//! scanned for NaN and ±Inf, and so is every RoPE table's input.
//!
//! `gerbilc compile` scans each tensor as the plan writer reads it
//! ([`mod@crate::materialize`], unless `--allow-non-finite`), so the weights are
//! read once; before that, [`check_rope_tables_finite`] checks what the
//! RoPE tables are built from, which needs no tensor. [`check_weights_finite`]
//! is the whole check on its own, for a caller that builds no plan: it reads
//! the tensors one at a time (each dropped once scanned) and returns the
//! first (in graph order) holding a NaN or an infinity, with the index of
//! its first bad element.
//!
//! The surprise: a non-finite weight is not a crash but silent garbage — the
//! NaN spreads through every activation and the plan prints token 0 — so it
//! is refused where the tensor's name is still known. The scan only
//! looks at exponent bits (all ones means NaN or Inf in f32, f16 and bf16),
//! block by block with a branch-free fold the compiler vectorizes, over
//! bytes the writer reads anyway. Quantized
//! blocks are integers but for their f16 scales, so only those are read.

use crate::error::CompileError;
use crate::materialize::TensorSource;
use gerbil_ir::{DType, Graph, Op, WeightSource};
use std::collections::HashSet;

/// Elements per block: the fold runs branch-free over a block, and only a
/// block with a bad element is searched again for its index.
const BLOCK: usize = 4096;

/// Fails on the first checkpoint tensor that `graph` reads and that holds a
/// NaN or an infinity, reading one tensor at a time. RoPE tables built from
/// the config are checked too.
pub fn check_weights_finite(graph: &Graph, tensors: &dyn TensorSource) -> Result<(), CompileError> {
    check_rope_tables_finite(graph)?;
    let mut seen = HashSet::new();
    for node in graph.g.node_weights() {
        let Op::Weight(w) = &node.op else { continue };
        let names: Vec<&str> = match &w.source {
            WeightSource::Checkpoint { tensor }
            | WeightSource::Rows { tensor, .. }
            | WeightSource::Adapter { tensor } => vec![tensor],
            WeightSource::Concat { tensors } => tensors.iter().map(String::as_str).collect(),
            WeightSource::RopeTable { .. } => continue,
        };
        for name in names {
            if !seen.insert(name.to_owned()) {
                continue;
            }
            let view = tensors.tensor(name)?;
            if let Some((index, value)) = first_non_finite(&view.data, view.dtype) {
                return Err(CompileError::NonFiniteWeight {
                    tensor: name.to_owned(),
                    index: index as u64,
                    value,
                });
            }
        }
    }
    Ok(())
}

/// Fails on the first RoPE table of `graph` whose inverse frequencies or
/// attention scaling (from `rope_theta` and `rope_scaling`) are NaN or
/// infinite. Reads no tensor.
pub fn check_rope_tables_finite(graph: &Graph) -> Result<(), CompileError> {
    for node in graph.g.node_weights() {
        let Op::Weight(w) = &node.op else { continue };
        let WeightSource::RopeTable {
            inv_freq,
            attention_scaling,
        } = &w.source
        else {
            continue;
        };
        let values = inv_freq.iter().chain(std::iter::once(attention_scaling));
        if let Some((index, value)) = values.enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(CompileError::NonFiniteWeight {
                tensor: "the RoPE table (rope_theta, rope_scaling)".into(),
                index: index as u64,
                value: value.to_string(),
            });
        }
    }
    Ok(())
}

/// The index of the first NaN or infinity in little-endian `data` of
/// `dtype`, and its value as text (`NaN`, `inf`, `-inf`).
pub fn first_non_finite(data: &[u8], dtype: DType) -> Option<(usize, String)> {
    match dtype {
        DType::F32 => scan(data, |b: [u8; 4]| {
            let x = u32::from_le_bytes(b);
            (x & 0x7f80_0000 == 0x7f80_0000, f32::from_bits(x))
        }),
        DType::F16 => scan(data, |b: [u8; 2]| {
            let x = u16::from_le_bytes(b);
            let value = match x & 0x03ff {
                0 if x & 0x8000 != 0 => f32::NEG_INFINITY,
                0 => f32::INFINITY,
                _ => f32::NAN,
            };
            (x & 0x7c00 == 0x7c00, value)
        }),
        DType::BF16 => scan(data, |b: [u8; 2]| {
            let x = u16::from_le_bytes(b);
            (x & 0x7f80 == 0x7f80, f32::from_bits(u32::from(x) << 16))
        }),
        DType::U32 => None,
        _ => block_scales_non_finite(data, dtype),
    }
}

/// [`first_non_finite`] of ggml blocks: only their f16 scales can be NaN
/// or infinite; the index is the first value of the block.
fn block_scales_non_finite(data: &[u8], dtype: DType) -> Option<(usize, String)> {
    let (values, bytes) = dtype.block();
    data.chunks_exact(bytes as usize)
        .enumerate()
        .find_map(|(b, block)| {
            dtype.block_f16_fields().iter().find_map(|&at| {
                let at = at as usize;
                let field = block.get(at..at + 2)?;
                first_non_finite(field, DType::F16).map(|(_, v)| (b * values as usize, v))
            })
        })
}

/// `bad` says whether an element is non-finite and what it is worth.
fn scan<const W: usize>(
    data: &[u8],
    bad: impl Fn([u8; W]) -> (bool, f32),
) -> Option<(usize, String)> {
    let elem = |c: &[u8]| <[u8; W]>::try_from(c).map_or((false, 0.0), &bad);
    for (b, block) in data.chunks(BLOCK * W).enumerate() {
        let any = block.chunks_exact(W).fold(false, |acc, c| acc | elem(c).0);
        if any {
            let (i, value) = block
                .chunks_exact(W)
                .map(elem)
                .enumerate()
                .find(|(_, (is_bad, _))| *is_bad)
                .map(|(i, (_, v))| (i, v))?;
            return Some((b * BLOCK + i, value.to_string()));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_f32(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn finds_the_first_bad_element_in_every_float_dtype() {
        let mut v: Vec<f32> = (0..10_000).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
        assert_eq!(first_non_finite(&bytes_f32(&v), DType::F32), None);
        v[9001] = f32::NEG_INFINITY;
        v[9500] = f32::NAN;
        assert_eq!(
            first_non_finite(&bytes_f32(&v), DType::F32),
            Some((9001, "-inf".into()))
        );
        // bf16 is the upper half of the f32.
        let bf16: Vec<u8> = v
            .iter()
            .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        assert_eq!(
            first_non_finite(&bf16, DType::BF16),
            Some((9001, "-inf".into()))
        );
        // f16: 0x3c00 is 1.0, 0x7e00 a NaN, 0x7c00 +inf, 0x7bff the largest finite.
        let mut f16: Vec<u16> = vec![0x3c00; 5000];
        f16[4999] = 0x7bff;
        let to_bytes = |v: &[u16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(first_non_finite(&to_bytes(&f16), DType::F16), None);
        f16[4097] = 0x7e00;
        f16[4098] = 0x7c00;
        assert_eq!(
            first_non_finite(&to_bytes(&f16), DType::F16),
            Some((4097, "NaN".into()))
        );
        f16[4097] = 0x3c00;
        assert_eq!(
            first_non_finite(&to_bytes(&f16), DType::F16),
            Some((4098, "inf".into()))
        );
    }
}
