//! Memory-mapped access to a checkpoint's safetensors files.
//!
//! [`SafetensorsStore::open_dir`] finds `model.safetensors` (preferred, as
//! transformers does) or the shards listed in `model.safetensors.index.json`,
//! maps each file with `memmap2` and validates its header with the
//! `safetensors` crate (offsets cover the file exactly, sizes match shapes).
//! After that, [`SafetensorsStore::tensor`] is a hash lookup and a slice of
//! the map: no bytes are copied. [`SafetensorsStore::from_bytes`] and
//! [`SafetensorsStore::from_index_json`] run the same checks on files already
//! in memory (tests, fuzzing).
//!
//! The surprise: unsupported dtypes (I64, U8, F8...) are accepted when the
//! file is opened, because checkpoints often carry tensors nobody reads; the
//! error comes only when such a tensor is asked for.

use crate::error::{FrontendError, Result};
use gerbil_ir::DType;
use memmap2::{Mmap, MmapMut};
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Name of a single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Name of the index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// A borrowed view of one tensor: dtype, shape and the raw little-endian bytes
/// exactly as stored in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorView<'a> {
    /// Element type.
    pub dtype: DType,
    /// Shape, outermost first.
    pub shape: Vec<u64>,
    /// The bytes, `shape.product() * dtype.size_bytes()` of them.
    pub data: &'a [u8],
}

/// One mapped file.
struct Shard {
    path: PathBuf,
    map: Mmap,
}

/// Where one tensor lives.
#[derive(Clone, Debug)]
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<u64>,
    /// Byte range within the shard's map.
    start: usize,
    end: usize,
}

/// The tensors of one checkpoint, over memory maps kept alive for the store's
/// lifetime.
pub struct SafetensorsStore {
    shards: Vec<Shard>,
    tensors: HashMap<String, Entry>,
}

impl std::fmt::Debug for SafetensorsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsStore")
            .field("files", &self.files())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

#[derive(Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> FrontendError + '_ {
    move |source| FrontendError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl SafetensorsStore {
    /// A store with no files and no tensors.
    pub fn empty() -> Self {
        SafetensorsStore {
            shards: Vec::new(),
            tensors: HashMap::new(),
        }
    }

    /// Opens the weights of a checkpoint directory: `model.safetensors` if it
    /// exists, else the shards named by `model.safetensors.index.json`.
    /// Returns `Ok(None)` when the directory has neither.
    pub fn open_dir(dir: &Path) -> Result<Option<Self>> {
        let single = dir.join(SINGLE_FILE);
        if single.exists() {
            return Self::open_files(&[single]).map(Some);
        }
        let index = dir.join(INDEX_FILE);
        if index.exists() {
            return Self::open_index(&index).map(Some);
        }
        Ok(None)
    }

    /// Opens a sharded checkpoint from its index; every tensor the index names
    /// must be in the shard it names.
    pub fn open_index(index_path: &Path) -> Result<Self> {
        crate::checkpoint::check_regular(index_path)?;
        let text = std::fs::read_to_string(index_path).map_err(io_err(index_path))?;
        Self::from_index_json(index_path, &text, Self::open_files)
    }

    /// Reads an index already in memory, as [`Self::open_index`] reads the
    /// file at `index_path` (which names it in errors and locates the shards):
    /// checks that `weight_map` names plain file names, opens those shards
    /// with `open` ([`Self::open_files`], or [`Self::from_bytes`] for shards
    /// in memory) and checks that every tensor is in the shard it names.
    pub fn from_index_json(
        index_path: &Path,
        text: &str,
        open: impl FnOnce(&[PathBuf]) -> Result<Self>,
    ) -> Result<Self> {
        let index: Index = serde_json::from_str(text).map_err(|source| FrontendError::Json {
            path: index_path.to_path_buf(),
            source,
        })?;
        let dir = index_path.parent().unwrap_or(Path::new("."));
        let mut files: Vec<&str> = index.weight_map.values().map(String::as_str).collect();
        files.sort_unstable();
        files.dedup();
        let mut paths = Vec::with_capacity(files.len());
        for f in &files {
            // Shards are plain file names next to the index.
            if Path::new(f).file_name().and_then(|n| n.to_str()) != Some(*f) {
                return Err(FrontendError::Safetensors {
                    path: index_path.to_path_buf(),
                    msg: format!(
                        "weight_map names `{f}`, which is not a file name in this directory"
                    ),
                });
            }
            paths.push(dir.join(f));
        }
        let store = open(&paths)?;
        for (name, file) in &index.weight_map {
            let found = store
                .tensors
                .get(name)
                .map(|e| store.shards[e.shard].path.file_name() == Some(file.as_ref()));
            if found != Some(true) {
                return Err(FrontendError::Safetensors {
                    path: index_path.to_path_buf(),
                    msg: format!(
                        "weight_map says `{name}` is in `{file}`, but that shard does not hold it"
                    ),
                });
            }
        }
        Ok(store)
    }

    /// Opens and validates the given safetensors files as one store. A tensor
    /// name that appears in two files is an error.
    pub fn open_files(paths: &[PathBuf]) -> Result<Self> {
        let mut store = Self::empty();
        for path in paths {
            crate::checkpoint::check_regular(path)?;
            let file = File::open(path).map_err(io_err(path))?;
            // SAFETY: the map is read-only and lives as long as the store. As
            // with every mmap, a process truncating the file while it is
            // mapped would fault; checkpoints are not rewritten while read.
            let map = unsafe { Mmap::map(&file) }.map_err(io_err(path))?;
            store.add_shard(path, map)?;
        }
        Ok(store)
    }

    /// A store over safetensors files already in memory, each a name (for
    /// errors and [`Self::files`]) and its bytes, validated exactly as
    /// [`Self::open_files`] validates files (the bytes are copied into
    /// anonymous maps). For tests and fuzzing.
    pub fn from_bytes(files: &[(PathBuf, &[u8])]) -> Result<Self> {
        let mut store = Self::empty();
        for (path, bytes) in files {
            let mut map = MmapMut::map_anon(bytes.len()).map_err(io_err(path))?;
            map.copy_from_slice(bytes);
            store.add_shard(path, map.make_read_only().map_err(io_err(path))?)?;
        }
        Ok(store)
    }

    /// Validates one file's header and adds its tensors.
    fn add_shard(&mut self, path: &Path, map: Mmap) -> Result<()> {
        let shard = self.shards.len();
        let corrupt = |msg: String| FrontendError::Safetensors {
            path: path.to_path_buf(),
            msg,
        };
        // `read_metadata` checks that the offsets tile the data section and
        // that the data section ends exactly at the end of the file, so every
        // range below lies within the map.
        let (header_len, meta) = SafeTensors::read_metadata(&map).map_err(|e| {
            corrupt(format!(
                "{e} ({} bytes; truncated or corrupted? download it again)",
                map.len()
            ))
        })?;
        let data_start = 8 + header_len;
        for (name, info) in meta.tensors() {
            let (s, e) = info.data_offsets;
            let entry = Entry {
                shard,
                dtype: info.dtype,
                shape: info.shape.iter().map(|&d| d as u64).collect(),
                start: data_start + s,
                end: data_start + e,
            };
            if self.tensors.insert(name.clone(), entry).is_some() {
                return Err(corrupt(format!(
                    "tensor `{name}` also appears in an earlier shard"
                )));
            }
        }
        self.shards.push(Shard {
            path: path.to_path_buf(),
            map,
        });
        Ok(())
    }

    /// The tensor called `name`, or an error if it is absent or its dtype is
    /// not BF16, F16 or F32.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| FrontendError::MissingTensor {
                name: name.to_string(),
            })?;
        let dtype = match e.dtype {
            Dtype::BF16 => DType::BF16,
            Dtype::F16 => DType::F16,
            Dtype::F32 => DType::F32,
            other => {
                return Err(FrontendError::UnsupportedDtype {
                    name: name.to_string(),
                    dtype: other.to_string(),
                })
            }
        };
        Ok(TensorView {
            dtype,
            shape: e.shape.clone(),
            data: &self.shards[e.shard].map[e.start..e.end],
        })
    }

    /// Whether the store holds a tensor called `name` (of any dtype).
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The shape of tensor `name`, whatever its dtype.
    pub fn shape(&self, name: &str) -> Option<&[u64]> {
        self.tensors.get(name).map(|e| e.shape.as_slice())
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the store holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The mapped files, in the order they were opened.
    pub fn files(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path.as_path()).collect()
    }
}
