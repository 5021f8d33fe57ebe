//! Helpers shared by the integration tests: fixture paths and scratch
//! directories (a `tempfile::TempDir` with a tag and subdirectories).

#![allow(dead_code)]

pub mod random_checkpoint;

use std::path::{Path, PathBuf};

/// Root of the model fixtures.
pub const MODELS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/models");

/// Path of a fixture model, e.g. `model("tiny/llama")`.
pub fn model(rel: &str) -> PathBuf {
    Path::new(MODELS).join(rel)
}

/// A scratch directory under the system temp dir, removed on drop.
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    /// A fresh, empty directory whose name contains `tag`.
    pub fn new(tag: &str) -> Self {
        TempDir(
            tempfile::Builder::new()
                .prefix(&format!("gerbil-frontend-hf-{tag}-"))
                .tempdir()
                .unwrap(),
        )
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// A subdirectory (created).
    pub fn subdir(&self, name: &str) -> PathBuf {
        let p = self.path().join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}

/// Copies the files of `src` (not recursive) into `dst`, which must exist.
/// Copies are writable even when the fixtures are read-only.
pub fn copy_files(src: &Path, dst: &Path) {
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            let bytes = std::fs::read(entry.path()).unwrap();
            std::fs::write(dst.join(entry.file_name()), bytes).unwrap();
        }
    }
}

/// A writable copy of fixture `rel` in a new subdirectory `name` of `tmp`.
pub fn copy_model(tmp: &TempDir, rel: &str, name: &str) -> PathBuf {
    let dst = tmp.subdir(name);
    copy_files(&model(rel), &dst);
    dst
}

/// `config.json` of `dir`, parsed.
pub fn read_config(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

/// Writes `value` as `dir/config.json`.
pub fn write_config(dir: &Path, value: &serde_json::Value) {
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(value).unwrap(),
    )
    .unwrap();
}

/// Edits `dir/config.json` in place.
pub fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let mut v = read_config(dir);
    f(v.as_object_mut().unwrap());
    write_config(dir, &v);
}

/// An owned tensor for writing safetensors files in tests.
pub struct OwnedTensor {
    pub dtype: safetensors::Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl safetensors::View for &OwnedTensor {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// All tensors of a safetensors file, by name.
pub fn read_tensors(path: &Path) -> Vec<(String, OwnedTensor)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, OwnedTensor)> = st
        .tensors()
        .into_iter()
        .map(|(name, v)| {
            (
                name,
                OwnedTensor {
                    dtype: v.dtype(),
                    shape: v.shape().to_vec(),
                    data: v.data().to_vec(),
                },
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Writes tensors to a safetensors file.
pub fn write_tensors(path: &Path, tensors: &[(String, OwnedTensor)]) {
    let views: Vec<(&str, &OwnedTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// An f32 tensor of `shape` filled with `value`.
pub fn f32_tensor(shape: &[usize], value: f32) -> OwnedTensor {
    let n: usize = shape.iter().product();
    OwnedTensor {
        dtype: safetensors::Dtype::F32,
        shape: shape.to_vec(),
        data: value.to_le_bytes().repeat(n),
    }
}
