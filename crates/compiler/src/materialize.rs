//! Weight materialization: the bytes of every weight buffer, from its
//! [`WeightSource`].
//!
//! Checkpoint tensors and row ranges of them are borrowed straight from the
//! source (the bytes the checkpoint read from its files, once per tensor),
//! so compiling a 1 GB model does not copy those 1 GB again; concatenations
//! and RoPE tables are built in memory. A weight that codegen split into row
//! shards is cut here, after materialization, so a shard of a concatenation
//! is exact too. Quantized weights are concatenated and cut as ggml's
//! blocks, then each buffer is repacked into the GPU layout last; a float
//! tensor the graph wants quantized (`--quantize`) is quantized as it is
//! materialized.
//!
//! [`TensorSource`] is the seam that lets tests build plans from tensors made
//! in memory instead of a checkpoint directory.

use crate::error::CompileError;
use crate::quantize::{quantize_tensor, Rounding};
use gerbil_codegen_wgsl::{kernels::quant, WeightBuffer};
use gerbil_frontend_hf::{Checkpoint, FrontendError, TensorView};
use gerbil_ir::{rope_table::rope_table, DType, WeightSource};
use std::borrow::Cow;

/// Where weight bytes come from: a checkpoint, or tensors built in memory (tests).
pub trait TensorSource {
    /// The tensor's dtype, shape and raw little-endian bytes.
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, FrontendError>;
}

impl TensorSource for Checkpoint {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, FrontendError> {
        Checkpoint::tensor(self, name)
    }
}

fn weight_error(source: &WeightSource, reason: String) -> CompileError {
    CompileError::Weight {
        weight: source.to_string(),
        reason,
    }
}

/// Rows `rows` (all of them for `None`) of tensor `name` as `dtype`: as
/// stored, or a float tensor quantized to the block type `--quantize` gave
/// it. The rows are cut before quantizing, so a tensor read as several row
/// ranges (Phi-3's `qkv_proj`) is quantized once per range, not whole each time.
fn checked<'a>(
    tensors: &'a dyn TensorSource,
    source: &WeightSource,
    name: &str,
    dtype: DType,
    rows: Option<(u64, u64)>,
    rounding: Rounding,
) -> Result<Cow<'a, [u8]>, CompileError> {
    let mut view = tensors.tensor(name)?;
    if let Some((start, count)) = rows {
        let total = view.shape.first().copied().unwrap_or(0);
        let end = start
            .checked_add(count)
            .filter(|&e| e <= total && total > 0);
        let Some(end) = end else {
            return Err(weight_error(
                source,
                format!("tensor `{name}` has {total} rows"),
            ));
        };
        let row_bytes = view.data.len() as u64 / total;
        view.data = &view.data[(start * row_bytes) as usize..(end * row_bytes) as usize];
        view.shape[0] = count;
    }
    if view.dtype == dtype {
        return Ok(Cow::Borrowed(view.data));
    }
    if dtype.is_quantized() && !view.dtype.is_quantized() {
        let blocks = quantize_tensor(&view, dtype, rounding)
            .map_err(|e| weight_error(source, format!("tensor `{name}`: {e}")))?;
        return Ok(Cow::Owned(blocks));
    }
    Err(weight_error(
        source,
        format!(
            "tensor `{name}` is {} but the graph expects {dtype}",
            view.dtype
        ),
    ))
}

/// The bytes of a whole weight of `dtype` whose leading dimension is `rows`
/// (the RoPE table's row count is the plan's context); a float tensor that
/// `dtype` wants quantized is quantized by `rounding`'s quantizer.
pub fn materialize<'a>(
    tensors: &'a dyn TensorSource,
    source: &WeightSource,
    dtype: DType,
    rows: u64,
    rounding: Rounding,
) -> Result<Cow<'a, [u8]>, CompileError> {
    Ok(match source {
        WeightSource::Checkpoint { tensor } => {
            checked(tensors, source, tensor, dtype, None, rounding)?
        }
        WeightSource::Concat { tensors: names } => {
            let mut v = Vec::new();
            for t in names {
                v.extend_from_slice(&checked(tensors, source, t, dtype, None, rounding)?);
            }
            Cow::Owned(v)
        }
        WeightSource::Rows {
            tensor,
            start,
            count,
        } => checked(
            tensors,
            source,
            tensor,
            dtype,
            Some((*start, *count)),
            rounding,
        )?,
        WeightSource::RopeTable {
            inv_freq,
            attention_scaling,
        } => Cow::Owned(rope_table(inv_freq, *attention_scaling, rows)),
    })
}

/// The bytes of one weight buffer: its source materialized, cut to its row
/// shard if it is one, and padded to a multiple of 4 bytes; quantized
/// blocks are then laid out as the kernels read them
/// ([`quant::gpu_layout`]).
pub fn weight_buffer_bytes<'a>(
    tensors: &'a dyn TensorSource,
    w: &WeightBuffer,
    rounding: Rounding,
) -> Result<Cow<'a, [u8]>, CompileError> {
    let mut bytes = match w.rows {
        None => {
            let rows = w.ty.shape.first().and_then(|d| d.as_const()).unwrap_or(0);
            materialize(tensors, &w.source, w.ty.dtype, rows, rounding)?
        }
        Some((start, count)) => {
            // A shard: materialize the whole tensor, then keep its rows.
            let whole_rows = start + count;
            let all = materialize(tensors, &w.source, w.ty.dtype, whole_rows, rounding)?;
            let row_bytes = (w.ty.size_bytes(0, 0) / count.max(1)) as usize;
            let (a, b) = (start as usize * row_bytes, whole_rows as usize * row_bytes);
            if b > all.len() {
                return Err(weight_error(
                    &w.source,
                    format!("rows {start}..{whole_rows} exceed the tensor"),
                ));
            }
            match all {
                Cow::Borrowed(all) => Cow::Borrowed(&all[a..b]),
                Cow::Owned(all) => Cow::Owned(all[a..b].to_vec()),
            }
        }
    };
    if w.ty.dtype.is_quantized() {
        bytes = Cow::Owned(quant::gpu_layout(w.ty.dtype, &bytes));
    } else if !bytes.len().is_multiple_of(4) {
        let mut v = bytes.into_owned();
        v.resize(v.len().div_ceil(4) * 4, 0);
        bytes = Cow::Owned(v);
    }
    Ok(bytes)
}
