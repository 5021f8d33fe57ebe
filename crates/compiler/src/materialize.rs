//! Weight materialization: the bytes of every weight buffer, from its
//! [`WeightSource`], made one buffer at a time while the plan is written.
//!
//! [`weight_buffer_bytes`] reads the checkpoint tensors one buffer needs
//! (each read hands its bytes over; nothing is kept between calls), scans
//! each for NaN and infinities as it is read unless
//! [`WeightOptions::allow_non_finite`], cuts row ranges and row shards,
//! concatenates, quantizes a float tensor the graph wants quantized
//! (`--quantize`) and repacks ggml blocks into the GPU layout last. A tensor
//! that needs no transform is passed on as read, never copied again. The
//! caller writes the bytes and drops them before asking for the next buffer,
//! so compiling holds one weight buffer and the tensors it is made of, not
//! the model.
//!
//! The surprise: rows are cut *before* anything else is done to them, as
//! they are read. A weight that codegen split into row shards reads only its
//! own rows ([`TensorSource::tensor_rows`]: one positional read of them from
//! a safetensors file) of only the parts of a concatenation they come from,
//! and quantizes only those, so an LM head split in nine is read and
//! quantized once, not nine times over; this gives the bytes cutting the
//! whole would give because ggml's blocks never cross a row. The NaN scan
//! covers what is read, and names an element by its index in the whole
//! tensor. [`TensorSource`] is the seam that lets tests build plans from
//! tensors made in memory instead of a checkpoint directory (and count what
//! is read).

use crate::error::CompileError;
use crate::finite::first_non_finite;
use crate::quantize::{quantize_tensor, Rounding};
use gerbil_codegen_wgsl::{kernels::quant, WeightBuffer};
use gerbil_frontend_hf::{Checkpoint, FrontendError, TensorView};
use gerbil_ir::{rope_table::rope_table, DType, WeightSource};
use std::borrow::Cow;

/// Where weight bytes come from: a checkpoint, or tensors built in memory (tests).
pub trait TensorSource {
    /// The tensor's dtype, shape and raw little-endian bytes, borrowed or
    /// owned; materialization drops them as soon as it has used them.
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, FrontendError>;

    /// The tensor's leading dimension (1 for a scalar). The default reads
    /// the tensor; a source that knows shapes without reading overrides it.
    fn rows(&self, name: &str) -> Result<u64, FrontendError> {
        Ok(self.tensor(name)?.shape.first().copied().unwrap_or(1))
    }

    /// Rows `start..start + count` of the tensor, which holds them (the
    /// caller checked with [`TensorSource::rows`]). The default reads the
    /// whole tensor and cuts it; a source that can read rows alone (a
    /// checkpoint) overrides it.
    fn tensor_rows(
        &self,
        name: &str,
        start: u64,
        count: u64,
    ) -> Result<TensorView<'_>, FrontendError> {
        let view = self.tensor(name)?;
        Ok(keep_rows(view, start, count))
    }
}

impl TensorSource for Checkpoint {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, FrontendError> {
        Checkpoint::tensor(self, name)
    }

    fn rows(&self, name: &str) -> Result<u64, FrontendError> {
        if let Some(f) = self.adapter.as_ref().and_then(|a| a.factors.get(name)) {
            return Ok(f.shape[0]);
        }
        let (_, shape) = self.weights.tensor_type(name)?;
        Ok(shape.first().copied().unwrap_or(1))
    }

    fn tensor_rows(
        &self,
        name: &str,
        start: u64,
        count: u64,
    ) -> Result<TensorView<'_>, FrontendError> {
        Checkpoint::tensor_rows(self, name, start, count)
    }
}

/// Rows `start..start + count` of `view` (as many of them as it holds);
/// bytes it owns are cut in place.
fn keep_rows(mut view: TensorView<'_>, start: u64, count: u64) -> TensorView<'_> {
    let total = view.shape.first().copied().unwrap_or(1).max(1);
    let row_bytes = view.data.len() as u64 / total;
    let len = view.data.len() as u64;
    let a = (start.saturating_mul(row_bytes)).min(len) as usize;
    let b = (start.saturating_add(count).saturating_mul(row_bytes)).min(len) as usize;
    view.data = match view.data {
        Cow::Borrowed(all) => Cow::Borrowed(&all[a..b]),
        Cow::Owned(mut all) => {
            all.truncate(b);
            all.drain(..a);
            all.shrink_to_fit();
            Cow::Owned(all)
        }
    };
    if let Some(rows) = view.shape.first_mut() {
        *rows = count;
    }
    view
}

/// How weights are materialized.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WeightOptions {
    /// The quantizer of the float tensors the graph gives a block type.
    pub rounding: Rounding,
    /// Pass NaN and infinities through (`--allow-non-finite`) instead of
    /// refusing the first tensor that holds one.
    pub allow_non_finite: bool,
}

fn weight_error(source: &WeightSource, reason: String) -> CompileError {
    CompileError::Weight {
        weight: source.to_string(),
        reason,
    }
}

/// Rows `rows` (all of them for `None`) of tensor `name`, read alone where
/// the source can, and scanned for NaN and infinities unless `options`
/// allow them (the index named is the element's in the whole tensor).
fn read<'a>(
    tensors: &'a dyn TensorSource,
    source: &WeightSource,
    name: &str,
    rows: Option<(u64, u64)>,
    options: WeightOptions,
) -> Result<TensorView<'a>, CompileError> {
    let (view, first_row) = match rows {
        None => (tensors.tensor(name)?, 0),
        Some((start, count)) => {
            let total = tensors.rows(name)?;
            if start.checked_add(count).is_none_or(|end| end > total) || total == 0 {
                return Err(weight_error(
                    source,
                    format!("tensor `{name}` has {total} rows, not {start}..{start}+{count}"),
                ));
            }
            (tensors.tensor_rows(name, start, count)?, start)
        }
    };
    if !options.allow_non_finite {
        if let Some((index, value)) = first_non_finite(&view.data, view.dtype) {
            let row_values: u64 = view.shape.iter().skip(1).product();
            return Err(CompileError::NonFiniteWeight {
                tensor: name.to_owned(),
                index: first_row * row_values + index as u64,
                value,
            });
        }
    }
    Ok(view)
}

/// `view` (tensor `name`) as `dtype`: as it is, or a float tensor quantized
/// to the block type `--quantize` gave it.
fn converted<'a>(
    view: TensorView<'a>,
    dtype: DType,
    rounding: Rounding,
    source: &WeightSource,
    name: &str,
) -> Result<Cow<'a, [u8]>, CompileError> {
    if view.dtype == dtype {
        return Ok(view.data);
    }
    // A training graph's f32 master copy of a 16-bit weight: exact.
    if dtype == DType::F32 && matches!(view.dtype, DType::F16 | DType::BF16) {
        return Ok(Cow::Owned(widened(&view.data, view.dtype)));
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

/// Little-endian f16 or bf16 `bytes` as f32 bytes.
fn widened(bytes: &[u8], from: DType) -> Vec<u8> {
    bytes
        .chunks_exact(2)
        .flat_map(|b| {
            let bits = u16::from_le_bytes([b[0], b[1]]);
            let v = match from {
                DType::BF16 => half::bf16::from_bits(bits).to_f32(),
                _ => half::f16::from_bits(bits).to_f32(),
            };
            v.to_le_bytes()
        })
        .collect()
}

/// Rows `rows` (all of them for `None`) of tensor `name` as `dtype`. Only
/// the rows are read and quantized, so a tensor read as several row ranges
/// (Phi-3's `qkv_proj`, a sharded LM head) is read and quantized once per
/// range, not whole each time.
fn checked<'a>(
    tensors: &'a dyn TensorSource,
    source: &WeightSource,
    name: &str,
    dtype: DType,
    rows: Option<(u64, u64)>,
    options: WeightOptions,
) -> Result<Cow<'a, [u8]>, CompileError> {
    let view = read(tensors, source, name, rows, options)?;
    converted(view, dtype, options.rounding, source, name)
}

/// The bytes of a whole weight of `dtype` whose leading dimension is `rows`
/// (the RoPE table's row count is the plan's context); a float tensor that
/// `dtype` wants quantized is quantized by `options`' quantizer.
pub fn materialize<'a>(
    tensors: &'a dyn TensorSource,
    source: &WeightSource,
    dtype: DType,
    rows: u64,
    options: WeightOptions,
) -> Result<Cow<'a, [u8]>, CompileError> {
    Ok(match source {
        WeightSource::Checkpoint { tensor } | WeightSource::Adapter { tensor } => {
            checked(tensors, source, tensor, dtype, None, options)?
        }
        WeightSource::Concat { tensors: names } => {
            let mut v = Vec::new();
            for t in names {
                v.extend_from_slice(&checked(tensors, source, t, dtype, None, options)?);
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
            options,
        )?,
        WeightSource::RopeTable {
            inv_freq,
            attention_scaling,
        } => Cow::Owned(rope_table(inv_freq, *attention_scaling, rows)),
    })
}

/// Rows `start..start + count` of the weight `source` of `dtype`, made
/// from those rows alone: only the tensors of a concatenation the rows come
/// from are read, and only the rows are quantized.
fn materialize_shard<'a>(
    tensors: &'a dyn TensorSource,
    source: &WeightSource,
    dtype: DType,
    (start, count): (u64, u64),
    options: WeightOptions,
) -> Result<Cow<'a, [u8]>, CompileError> {
    let end = start.saturating_add(count);
    let exceed = |rows: u64| {
        weight_error(
            source,
            format!("rows {start}..{end} exceed the tensor ({rows} rows)"),
        )
    };
    match source {
        WeightSource::Checkpoint { tensor } | WeightSource::Adapter { tensor } => checked(
            tensors,
            source,
            tensor,
            dtype,
            Some((start, count)),
            options,
        ),
        WeightSource::Rows {
            tensor,
            start: first,
            count: rows,
        } => {
            if end > *rows {
                return Err(exceed(*rows));
            }
            let rows = Some((first.saturating_add(start), count));
            checked(tensors, source, tensor, dtype, rows, options)
        }
        WeightSource::Concat { tensors: names } => {
            let mut v = Vec::new();
            let mut first = 0u64;
            for name in names {
                let rows = tensors.rows(name)?;
                let (lo, hi) = (start.max(first), end.min(first.saturating_add(rows)));
                if lo < hi {
                    let part = Some((lo - first, hi - lo));
                    v.extend_from_slice(&checked(tensors, source, name, dtype, part, options)?);
                }
                first = first.saturating_add(rows);
            }
            if end > first {
                return Err(exceed(first));
            }
            Ok(Cow::Owned(v))
        }
        WeightSource::RopeTable { .. } => {
            let all = materialize(tensors, source, dtype, end, options)?;
            let row_bytes = all.len() / end.max(1) as usize;
            Ok(Cow::Owned(
                all[start as usize * row_bytes..end as usize * row_bytes].to_vec(),
            ))
        }
    }
}

/// The compiler's materialization as the CPU interpreter's source of
/// weights ([`gerbil_interp::Weights`]): the bytes a plan would hold,
/// before the GPU's plane layout.
pub struct Materializer<'a> {
    /// Where the tensors come from.
    pub tensors: &'a dyn TensorSource,
    /// Quantization rounding and the non-finite check.
    pub options: WeightOptions,
}

impl gerbil_interp::Weights for Materializer<'_> {
    fn weight_bytes(
        &self,
        source: &WeightSource,
        dtype: DType,
        rows: u64,
    ) -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(materialize(self.tensors, source, dtype, rows, self.options)?.into_owned())
    }
}

/// The bytes of one weight buffer: its source materialized (only its rows,
/// for a row shard), padded to a multiple of 4 bytes; quantized blocks are
/// then laid out as the kernels read them ([`quant::gpu_layout`]).
pub fn weight_buffer_bytes<'a>(
    tensors: &'a dyn TensorSource,
    w: &WeightBuffer,
    options: WeightOptions,
) -> Result<Cow<'a, [u8]>, CompileError> {
    let mut bytes = match w.rows {
        None => {
            let rows = w.ty.shape.first().and_then(|d| d.as_const()).unwrap_or(0);
            materialize(tensors, &w.source, w.ty.dtype, rows, options)?
        }
        Some(shard) => materialize_shard(tensors, &w.source, w.ty.dtype, shard, options)?,
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

#[cfg(test)]
mod tests {
    use super::*;
    use gerbil_ir::TensorType;
    use std::cell::RefCell;
    use std::collections::HashMap;

    /// f32 tensors in memory, handed out as copies (as a checkpoint's file
    /// reads are), every read logged.
    #[derive(Default)]
    struct Tensors {
        tensors: HashMap<String, (Vec<u64>, Vec<u8>)>,
        reads: RefCell<Vec<String>>,
    }

    impl Tensors {
        fn add(&mut self, name: &str, rows: u64, cols: u64, seed: u64) {
            let data = (0..rows * cols)
                .flat_map(|i| (((i * 7919 + seed * 31) % 1009) as f32 / 101.0 - 5.0).to_le_bytes())
                .collect();
            self.tensors.insert(name.into(), (vec![rows, cols], data));
        }
    }

    impl TensorSource for Tensors {
        fn tensor(&self, name: &str) -> Result<TensorView<'_>, FrontendError> {
            self.reads.borrow_mut().push(name.into());
            let (shape, data) = self
                .tensors
                .get(name)
                .ok_or_else(|| FrontendError::MissingTensor { name: name.into() })?;
            Ok(TensorView {
                dtype: DType::F32,
                shape: shape.clone(),
                data: Cow::Owned(data.clone()),
            })
        }

        fn rows(&self, name: &str) -> Result<u64, FrontendError> {
            let (shape, _) = self
                .tensors
                .get(name)
                .ok_or_else(|| FrontendError::MissingTensor { name: name.into() })?;
            Ok(shape[0])
        }

        fn tensor_rows(
            &self,
            name: &str,
            start: u64,
            count: u64,
        ) -> Result<TensorView<'_>, FrontendError> {
            let view = self.tensor(name)?;
            self.reads
                .borrow_mut()
                .push(format!("rows {start}+{count}"));
            Ok(keep_rows(view, start, count))
        }
    }

    fn shard(source: WeightSource, dtype: DType, cols: u64, rows: (u64, u64)) -> WeightBuffer {
        WeightBuffer {
            buffer: 0,
            source,
            ty: TensorType::fixed(dtype, &[rows.1, cols]),
            rows: Some(rows),
        }
    }

    /// A shard as it was made before shards were cut first: the whole weight
    /// materialized, then its rows kept.
    fn cut_from_the_whole(tensors: &Tensors, w: &WeightBuffer) -> Vec<u8> {
        let (start, count) = w.rows.unwrap();
        let all = materialize(
            tensors,
            &w.source,
            w.ty.dtype,
            start + count,
            WeightOptions::default(),
        )
        .unwrap();
        let row_bytes = (w.ty.size_bytes(0, 0) / count) as usize;
        let rows = &all[start as usize * row_bytes..(start + count) as usize * row_bytes];
        if w.ty.dtype.is_quantized() {
            quant::gpu_layout(w.ty.dtype, rows)
        } else {
            rows.to_vec()
        }
    }

    #[test]
    fn a_shard_made_from_its_rows_is_the_shard_of_the_whole() {
        let cols = 256;
        let mut tensors = Tensors::default();
        tensors.add("a", 6, cols, 1);
        tensors.add("b", 10, cols, 2);
        let concat = WeightSource::Concat {
            tensors: vec!["a".into(), "b".into()],
        };
        let rows = WeightSource::Rows {
            tensor: "b".into(),
            start: 3,
            count: 6,
        };
        let whole = WeightSource::Checkpoint { tensor: "b".into() };
        for dtype in [DType::F32, DType::Q8_0, DType::Q4K, DType::Q6K] {
            for (source, total) in [(&concat, 16), (&rows, 6), (&whole, 10)] {
                for (start, count) in [(0, 2), (0, total), (1, 4), (total - 3, 3)] {
                    let w = shard(source.clone(), dtype, cols, (start, count));
                    let made = weight_buffer_bytes(&tensors, &w, WeightOptions::default()).unwrap();
                    assert_eq!(
                        made.as_ref(),
                        cut_from_the_whole(&tensors, &w),
                        "{dtype} {source} rows {start}+{count}"
                    );
                }
            }
        }
        // Only the rows a shard holds, of the parts of a concatenation they
        // come from, are read.
        tensors.reads.borrow_mut().clear();
        let w = shard(concat.clone(), DType::Q8_0, cols, (7, 3));
        weight_buffer_bytes(&tensors, &w, WeightOptions::default()).unwrap();
        assert_eq!(*tensors.reads.borrow(), ["b", "rows 1+3"]);
        let w = shard(concat, DType::Q8_0, cols, (14, 3));
        let e = weight_buffer_bytes(&tensors, &w, WeightOptions::default()).unwrap_err();
        assert!(
            e.to_string()
                .contains("rows 14..17 exceed the tensor (16 rows)"),
            "{e}"
        );
    }

    #[test]
    fn a_non_finite_value_is_named_by_its_index_in_the_whole_tensor() {
        let mut tensors = Tensors::default();
        tensors.add("w", 4, 32, 0);
        let (_, data) = tensors.tensors.get_mut("w").unwrap();
        data[(3 * 32 + 5) * 4..(3 * 32 + 6) * 4].copy_from_slice(&f32::NAN.to_le_bytes());
        let source = WeightSource::Checkpoint { tensor: "w".into() };
        let w = shard(source, DType::Q8_0, 32, (2, 2));
        let e = weight_buffer_bytes(&tensors, &w, WeightOptions::default()).unwrap_err();
        assert!(
            e.to_string()
                .contains("tensor `w` holds a non-finite value (NaN) at element 101"),
            "{e}"
        );
        let allow = WeightOptions {
            allow_non_finite: true,
            ..WeightOptions::default()
        };
        assert!(weight_buffer_bytes(&tensors, &w, allow).is_ok());
    }
}
