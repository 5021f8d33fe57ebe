//! Writing trained weights back as a HuggingFace checkpoint directory:
//! `config.json`, the tokenizer and generation files copied as they were,
//! and `model.safetensors` with every tensor of the original checkpoint —
//! the trained ones rebuilt from the parameter buffer, the rest copied.
//!
//! ```no_run
//! # fn f(ckpt: &gerbil_frontend_hf::Checkpoint, params: &[gerbil_plan::Parameter],
//! #      sources: &[gerbil_ir::WeightSource], values: &[f32]) -> Result<(), gerbil_train::TrainError> {
//! gerbil_train::export::write_model("out".as_ref(), ckpt, params, sources, values)?;
//! # Ok(()) }
//! ```
//!
//! A trained tensor is written in the dtype the checkpoint stored it in
//! (bf16 and f16 rounded to nearest even from the f32 master copy), so the
//! output is the size of the input and `gerbilc compile` takes it as it took
//! the original. The exact f32 master copy travels in the optimizer state
//! ([`crate::state`]), for a run that resumes.
//!
//! A LoRA run writes [`write_adapter`]'s directory instead: the adapter
//! (PEFT's `adapter_config.json` and `adapter_model.safetensors`, naming the
//! base model's directory) beside the same config and tokenizer files, which
//! `gerbilc compile` opens as the base model with the adapter merged.
//!
//! The surprise: one IR weight may be several checkpoint tensors (a
//! `Concat` of row blocks) or part of one (`Rows` of a fused projection),
//! so tensors are rebuilt from the weights' sources, not copied by name.

use crate::TrainError;
use gerbil_frontend_hf::adapter::{Adapter, ADAPTER_CONFIG, ADAPTER_WEIGHTS};
use gerbil_frontend_hf::{Checkpoint, TensorView};
use gerbil_ir::{DType, WeightSource};
use gerbil_plan::{safe_file, Parameter};
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::Path;

/// The files besides the weights that make a checkpoint directory, copied
/// when the original has them.
const COMPANIONS: [&str; 9] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
];

/// Writes `ckpt` with its trained weights `values` (the parameter buffer:
/// each of `params`, made from the matching `sources`, at its offset) as a
/// checkpoint directory `dir`, which is created if need be.
pub fn write_model(
    dir: &Path,
    ckpt: &Checkpoint,
    params: &[Parameter],
    sources: &[WeightSource],
    values: &[f32],
) -> Result<(), TrainError> {
    create_dir(dir)?;
    let trained = trained_tensors(ckpt, params, sources, values)?;
    let mut tensors = Vec::new();
    for name in ckpt.weights.names() {
        let view = ckpt.tensor(name)?;
        let dtype = safetensors_dtype(view.dtype).ok_or_else(|| {
            TrainError::Export(format!(
                "tensor `{name}` is {}, which a safetensors checkpoint cannot hold; train \
                 from the model's safetensors checkpoint, not a GGUF file",
                view.dtype
            ))
        })?;
        let bytes = match trained.get(name) {
            Some(v) => TensorView::from_f32(v, view.dtype, Vec::new())
                .data
                .into_owned(),
            None => view.data.into_owned(),
        };
        let shape = view.shape.iter().map(|&d| d as usize).collect::<Vec<_>>();
        tensors.push((name.to_string(), dtype, shape, bytes));
    }
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes)
                .map(|v| (name.as_str(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TrainError::Export(e.to_string()))?;
    let metadata = [("format".to_string(), "pt".to_string())].into();
    let bytes = safetensors::serialize(views, Some(metadata))
        .map_err(|e| TrainError::Export(e.to_string()))?;
    safe_file::write_file(&dir.join("model.safetensors"), &bytes)?;
    // An adapter an earlier run left here would open merged into these.
    remove_stale(dir, &[ADAPTER_CONFIG, ADAPTER_WEIGHTS])?;
    copy_companions(ckpt, dir)
}

/// Removes `files` from `dir` where they are: what a run of the other kind
/// (whole model, adapter) left in the same output directory.
fn remove_stale(dir: &Path, files: &[&str]) -> Result<(), TrainError> {
    for f in files {
        let path = dir.join(f);
        if path.is_file() {
            std::fs::remove_file(&path)
                .map_err(|e| TrainError::Io(format!("{}: {e}", path.display())))?;
        }
    }
    Ok(())
}

/// Writes `adapter` with its trained factors `values` (the parameter
/// buffer: each of `params`, the factor `sources` names, at its offset) as
/// an adapter directory `dir` with `ckpt`'s config and tokenizer files.
pub fn write_adapter(
    dir: &Path,
    ckpt: &Checkpoint,
    adapter: &Adapter,
    params: &[Parameter],
    sources: &[WeightSource],
    values: &[f32],
) -> Result<(), TrainError> {
    create_dir(dir)?;
    let mut adapter = adapter.clone();
    for (p, source) in params.iter().zip(sources) {
        let start = p.offset as usize;
        let factor = match source {
            WeightSource::Adapter { tensor } => adapter.factors.get_mut(tensor),
            _ => None,
        };
        let (Some(factor), Some(value)) = (factor, values.get(start..start + p.len() as usize))
        else {
            return Err(TrainError::Export(format!(
                "trained weight `{}` is not one of the adapter's factors",
                p.label
            )));
        };
        factor.values = value.to_vec();
    }
    for (name, bytes) in adapter.to_files()? {
        safe_file::write_file(&dir.join(name), &bytes)?;
    }
    // A model an earlier run left here would be taken for the base.
    remove_stale(dir, &["model.safetensors", "model.safetensors.index.json"])?;
    copy_companions(ckpt, dir)
}

/// Creates `dir` (and its parents) if need be.
fn create_dir(dir: &Path) -> Result<(), TrainError> {
    std::fs::create_dir_all(dir).map_err(|e| TrainError::Io(format!("{}: {e}", dir.display())))
}

/// Copies `ckpt`'s config, tokenizer and generation files into `dir`.
fn copy_companions(ckpt: &Checkpoint, dir: &Path) -> Result<(), TrainError> {
    for file in COMPANIONS {
        let from = ckpt.dir.join(file);
        if from.is_file() {
            let bytes = std::fs::read(&from)
                .map_err(|e| TrainError::Io(format!("{}: {e}", from.display())))?;
            safe_file::write_file(&dir.join(file), &bytes)?;
        }
    }
    Ok(())
}

/// Every checkpoint tensor a trained weight covers, as f32, rebuilt from
/// the parameter buffer (rows no weight covers keep the original values).
fn trained_tensors(
    ckpt: &Checkpoint,
    params: &[Parameter],
    sources: &[WeightSource],
    values: &[f32],
) -> Result<BTreeMap<String, Vec<f32>>, TrainError> {
    let mut out: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    for (p, source) in params.iter().zip(sources) {
        let start = p.offset as usize;
        let mut value = values.get(start..start + p.len() as usize).ok_or_else(|| {
            TrainError::Export(format!(
                "weight `{}` lies past the parameters read back",
                p.label
            ))
        })?;
        // Each (tensor, first row, rows) the weight's values fill, in order.
        let parts: Vec<(&str, u64, Option<u64>)> = match source {
            WeightSource::Checkpoint { tensor } => vec![(tensor.as_str(), 0, None)],
            WeightSource::Rows {
                tensor,
                start,
                count,
            } => vec![(tensor.as_str(), *start, Some(*count))],
            WeightSource::Concat { tensors } => {
                tensors.iter().map(|t| (t.as_str(), 0, None)).collect()
            }
            WeightSource::RopeTable { .. } | WeightSource::Adapter { .. } => continue,
        };
        for (tensor, first, rows) in parts {
            let whole = match out.get_mut(tensor) {
                Some(w) => w,
                None => {
                    let view = ckpt.tensor(tensor)?;
                    let original = view.to_f32().ok_or_else(|| {
                        TrainError::Export(format!(
                            "tensor `{tensor}` is {}: only float tensors train",
                            view.dtype
                        ))
                    })?;
                    out.entry(tensor.to_string()).or_insert(original)
                }
            };
            let shape = ckpt.weights.shape(tensor).unwrap_or(&[]);
            let row: usize = shape.iter().skip(1).map(|&d| d as usize).product();
            let count = rows.unwrap_or(shape.first().copied().unwrap_or(1)) as usize;
            let at = first as usize * row;
            let len = count * row;
            let (head, rest) = value.split_at(len.min(value.len()));
            whole
                .get_mut(at..at + len)
                .filter(|w| w.len() == head.len())
                .ok_or_else(|| {
                    TrainError::Export(format!(
                        "weight `{}` does not fit tensor `{tensor}`'s rows",
                        p.label
                    ))
                })?
                .copy_from_slice(head);
            value = rest;
        }
        if !value.is_empty() {
            return Err(TrainError::Export(format!(
                "weight `{}` has {} more values than the tensors it was made of",
                p.label,
                value.len()
            )));
        }
    }
    Ok(out)
}

/// The safetensors dtype of a float or integer `dtype`.
fn safetensors_dtype(dtype: DType) -> Option<Dtype> {
    match dtype {
        DType::F32 => Some(Dtype::F32),
        DType::F16 => Some(Dtype::F16),
        DType::BF16 => Some(Dtype::BF16),
        DType::U32 => Some(Dtype::U32),
        _ => None,
    }
}
