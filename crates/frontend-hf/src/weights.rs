//! Reading a checkpoint's safetensors files.
//!
//! [`WeightStore::open_dir`] finds `model.safetensors` (preferred, as
//! transformers does) or the shards listed in `model.safetensors.index.json`,
//! keeps each file open, reads its header and validates it with the
//! `safetensors` crate (offsets cover the file exactly, sizes match shapes).
//! [`WeightStore::tensor`] reads a tensor's bytes with one positional
//! read each time it is asked for and hands them over: the store keeps
//! nothing, so a caller that drops each tensor after use (the compiler
//! writes a plan one weight at a time) holds one tensor in memory, never
//! the checkpoint. A file that another program truncates meanwhile is
//! [`FrontendError::Changed`], never a fault: a memory map of the file, as
//! before, died with SIGBUS there. A tensor asked for twice is read twice
//! (from the page cache, as a rule).
//! [`WeightStore::tensor_rows`] reads only some of a tensor's rows (a row
//! shard of a large LM head), from a safetensors file with one positional
//! read of just those bytes.
//! [`WeightStore::from_bytes`] and [`WeightStore::from_index_json`]
//! run the same checks on files already in memory (tests, fuzzing).
//!
//! The surprise: unsupported dtypes (I64, U8, F8...) are accepted when the
//! file is opened, because checkpoints often carry tensors nobody reads; the
//! error comes only when such a tensor is asked for.

use crate::error::{FrontendError, Result};
use crate::gguf::names::{self, Fixup};
use gerbil_gguf::{GgufFile, TensorInfo, TensorType};
use gerbil_ir::DType;
use safetensors::tensor::Metadata;
use safetensors::{Dtype, SafeTensorError, SafeTensors};
use serde::Deserialize;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Name of a single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Name of the index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One tensor: dtype, shape and the raw little-endian bytes exactly as
/// stored in the file, borrowed from a file in memory or read (owned), to be
/// dropped once used.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorView<'a> {
    /// Element type.
    pub dtype: DType,
    /// Shape, outermost first.
    pub shape: Vec<u64>,
    /// The bytes, `dtype.bytes_for(shape.product())` of them (ggml blocks
    /// for a quantized dtype).
    pub data: Cow<'a, [u8]>,
}

impl TensorView<'_> {
    /// The values as f32 (`None` for a dtype that is not a float: a
    /// quantized block type or an integer).
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        let halves = || {
            self.data
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
        };
        Some(match self.dtype {
            DType::F32 => self
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            DType::BF16 => halves()
                .map(|h| half::bf16::from_bits(h).to_f32())
                .collect(),
            DType::F16 => halves().map(|h| half::f16::from_bits(h).to_f32()).collect(),
            _ => return None,
        })
    }

    /// A view of `values` stored as `dtype` (f32, or f16 and bf16 rounded
    /// to nearest even).
    pub fn from_f32(values: &[f32], dtype: DType, shape: Vec<u64>) -> TensorView<'static> {
        let data = match dtype {
            DType::BF16 => values
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
            DType::F16 => values
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
            _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        let dtype = match dtype {
            DType::BF16 | DType::F16 => dtype,
            _ => DType::F32,
        };
        TensorView {
            dtype,
            shape,
            data: Cow::Owned(data),
        }
    }
}

/// One safetensors file.
struct Shard {
    path: PathBuf,
    bytes: ShardBytes,
}

/// Where a file's bytes are: an open file, read tensor by tensor, or a
/// buffer in memory.
enum ShardBytes {
    File {
        file: File,
        /// Length when opened.
        len: u64,
    },
    Memory(Vec<u8>),
    /// A GGUF file: tensors are read, decoded and fixed up by
    /// [`GgufTensor`].
    Gguf(GgufFile),
}

/// A tensor in a GGUF file and what loading it must undo.
#[derive(Clone, Debug)]
struct GgufTensor {
    info: TensorInfo,
    fixup: Fixup,
    /// The block type it keeps, read as ggml's blocks (a matrix of a type
    /// the kernels decode); `None`: read as F32, F16 or BF16.
    quantized: Option<DType>,
}

/// The IR dtype of GGUF tensor type `ty` when the kernels decode its blocks.
fn block_dtype(ty: TensorType) -> Option<DType> {
    Some(match ty {
        TensorType::Q8_0 => DType::Q8_0,
        TensorType::Q4_0 => DType::Q4_0,
        TensorType::Q4_1 => DType::Q4_1,
        TensorType::Q5_0 => DType::Q5_0,
        TensorType::Q5_1 => DType::Q5_1,
        TensorType::Q4_K => DType::Q4K,
        TensorType::Q5_K => DType::Q5K,
        TensorType::Q6_K => DType::Q6K,
        _ => return None,
    })
}

/// Where one tensor lives.
#[derive(Clone, Debug)]
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<u64>,
    /// Byte range within the shard's file.
    start: usize,
    end: usize,
    /// Set for a tensor of a GGUF file (`start` and `end` are then unused).
    gguf: Option<GgufTensor>,
}

/// Largest safetensors header the `safetensors` crate accepts (its
/// `MAX_HEADER_SIZE`): a longer one is refused before it is read.
const MAX_HEADER_LEN: u64 = 100_000_000;

/// The tensors of one checkpoint, over its files kept open for the store's
/// lifetime.
pub struct WeightStore {
    shards: Vec<Shard>,
    tensors: HashMap<String, Entry>,
}

impl std::fmt::Debug for WeightStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightStore")
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

impl WeightStore {
    /// A store with no files and no tensors.
    pub fn empty() -> Self {
        WeightStore {
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
            store.add_file(path, "")?;
        }
        Ok(store)
    }

    /// Adds the tensors of safetensors file `path`, each name after
    /// `prefix` (a sentence-transformers module's own weights, such as
    /// `2_Dense/model.safetensors`, under `2_Dense.`).
    pub fn add_file(&mut self, path: &Path, prefix: &str) -> Result<()> {
        crate::checkpoint::check_regular(path)?;
        let file = File::open(path).map_err(io_err(path))?;
        let len = file.metadata().map_err(io_err(path))?.len();
        self.add_shard(path, ShardBytes::File { file, len }, prefix)
    }

    /// Puts `prefix` before every tensor name: a bare transformer saved
    /// without its task head (`Qwen3Model`: `layers.0…`) then reads as the
    /// `*ForCausalLM` checkpoint the families expect (`model.layers.0…`).
    /// An LM head (`lm_head.*`) keeps its name: it sits beside the model,
    /// not in it.
    pub fn prefix_names(&mut self, prefix: &str) {
        self.tensors = std::mem::take(&mut self.tensors)
            .into_iter()
            .map(|(name, e)| match name.starts_with("lm_head.") {
                true => (name, e),
                false => (format!("{prefix}{name}"), e),
            })
            .collect();
    }

    /// A store over safetensors files already in memory, each a name (for
    /// errors and [`Self::files`]) and its bytes, validated exactly as
    /// [`Self::open_files`] validates files (the bytes are copied). For
    /// tests and fuzzing.
    pub fn from_bytes(files: &[(PathBuf, &[u8])]) -> Result<Self> {
        let mut store = Self::empty();
        for (path, bytes) in files {
            store.add_shard(path, ShardBytes::Memory(bytes.to_vec()), "")?;
        }
        Ok(store)
    }

    /// A store over the tensors of GGUF file `g` of architecture `arch`
    /// (with `heads` query and `kv_heads` key/value heads), under their
    /// HuggingFace names ([`crate::gguf::names`]); tensors no family reads
    /// are left out. Quantized matrices keep their blocks (the kernels
    /// decode them); other quantized tensors, and norms stored as `1 + w`,
    /// read as F32; plain F32, F16 and BF16 tensors keep their type.
    pub fn from_gguf(g: GgufFile, arch: &str, heads: u64, kv_heads: u64) -> Result<Self> {
        let path = g.path().to_path_buf();
        let mut tensors = HashMap::new();
        for info in g.tensors() {
            let Some(name) = names::hf_name(arch, &info.name) else {
                continue;
            };
            let fixup = names::fixup(arch, &info.name, heads, kv_heads);
            let dtype = match info.ty {
                TensorType::F32 => Dtype::F32,
                TensorType::F16 if fixup != Fixup::SubtractOne => Dtype::F16,
                TensorType::BF16 if fixup != Fixup::SubtractOne => Dtype::BF16,
                _ => Dtype::F32,
            };
            let entry = Entry {
                shard: 0,
                dtype,
                shape: info.shape(),
                start: 0,
                end: 0,
                gguf: Some(GgufTensor {
                    info: info.clone(),
                    fixup,
                    quantized: block_dtype(info.ty)
                        .filter(|_| info.dims.len() == 2 && fixup != Fixup::SubtractOne),
                }),
            };
            if tensors.insert(name.clone(), entry).is_some() {
                return Err(FrontendError::Safetensors {
                    path,
                    msg: format!("two tensors map to `{name}`"),
                });
            }
        }
        Ok(WeightStore {
            shards: vec![Shard {
                path,
                bytes: ShardBytes::Gguf(g),
            }],
            tensors,
        })
    }

    /// Validates one file's header and adds its tensors, named after `prefix`.
    fn add_shard(&mut self, path: &Path, bytes: ShardBytes, prefix: &str) -> Result<()> {
        let shard = self.shards.len();
        let corrupt = |msg: String| FrontendError::Safetensors {
            path: path.to_path_buf(),
            msg,
        };
        // The header is checked as `read_metadata` checks a whole file: the
        // offsets tile the data section and the data section ends exactly at
        // the end of the file, so every range below lies within it.
        let (header_len, meta) = match &bytes {
            ShardBytes::File { file, len } => read_header(path, file, *len)?,
            ShardBytes::Memory(bytes) => {
                SafeTensors::read_metadata(bytes).map_err(|e| (e, bytes.len() as u64))
            }
            ShardBytes::Gguf(_) => unreachable!("GGUF files are added by from_gguf"),
        }
        .map_err(|(e, len)| {
            corrupt(format!(
                "{e} ({len} bytes; truncated or corrupted? download it again)"
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
                gguf: None,
            };
            if self
                .tensors
                .insert(format!("{prefix}{name}"), entry)
                .is_some()
            {
                return Err(corrupt(format!(
                    "tensor `{prefix}{name}` also appears in an earlier shard"
                )));
            }
        }
        self.shards.push(Shard {
            path: path.to_path_buf(),
            bytes,
        });
        Ok(())
    }

    /// The tensor called `name`, or an error if it is absent or its dtype is
    /// not BF16, F16 or F32. Its bytes are read from the file on every call
    /// and belong to the caller.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        let (e, dtype) = self.entry(name)?;
        Ok(TensorView {
            dtype,
            shape: e.shape.clone(),
            data: self.data(e)?,
        })
    }

    /// Rows `start..start + count` of tensor `name` (rows of its leading
    /// dimension), with the errors of [`Self::tensor`]: a tensor stored as
    /// is (a safetensors file) reads those rows alone; a GGUF tensor, whose
    /// fix-ups move rows, is read whole and cut. Rows beyond the tensor are
    /// [`FrontendError::TensorShape`].
    pub fn tensor_rows(&self, name: &str, start: u64, count: u64) -> Result<TensorView<'_>> {
        let (e, dtype) = self.entry(name)?;
        let total = e.shape.first().copied().unwrap_or(1);
        if start.checked_add(count).is_none_or(|end| end > total) {
            let mut expected = e.shape.clone();
            if let Some(rows) = expected.first_mut() {
                *rows = start.saturating_add(count);
            }
            return Err(FrontendError::TensorShape {
                name: name.to_string(),
                expected,
                found: e.shape.clone(),
            });
        }
        let mut shape = e.shape.clone();
        if let Some(rows) = shape.first_mut() {
            *rows = count;
        }
        let data = if e.gguf.is_some() || total == 0 {
            let all = self.data(e)?;
            let row_bytes = all.len() / total.max(1) as usize;
            cut(all, start as usize * row_bytes, count as usize * row_bytes)
        } else {
            let row_bytes = ((e.end - e.start) as u64 / total) as usize;
            let from = e.start + start as usize * row_bytes;
            self.range(e, from, from + count as usize * row_bytes)?
        };
        Ok(TensorView { dtype, shape, data })
    }

    /// The dtype and shape of tensor `name`, with the errors of
    /// [`Self::tensor`], without reading its bytes.
    pub fn tensor_type(&self, name: &str) -> Result<(DType, &[u64])> {
        let (e, dtype) = self.entry(name)?;
        Ok((dtype, &e.shape))
    }

    /// Where tensor `name` lives and its dtype, or why it cannot be read.
    fn entry(&self, name: &str) -> Result<(&Entry, DType)> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| FrontendError::MissingTensor {
                name: name.to_string(),
            })?;
        if let Some(q) = e.gguf.as_ref().and_then(|t| t.quantized) {
            return Ok((e, q));
        }
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
        Ok((e, dtype))
    }

    /// The bytes of `e`: a slice of a file in memory, or read from the file
    /// (for the caller to keep or drop).
    fn data<'s>(&'s self, e: &'s Entry) -> Result<Cow<'s, [u8]>> {
        if let ShardBytes::Gguf(g) = &self.shards[e.shard].bytes {
            let t = e
                .gguf
                .as_ref()
                .unwrap_or_else(|| unreachable!("a GGUF entry"));
            return Ok(Cow::Owned(read_gguf(g, t, e.dtype)?));
        }
        self.range(e, e.start, e.end)
    }

    /// Bytes `from..to` of the safetensors file of `e`: borrowed from a
    /// file in memory, or read.
    fn range<'s>(&'s self, e: &Entry, from: usize, to: usize) -> Result<Cow<'s, [u8]>> {
        let shard = &self.shards[e.shard];
        match &shard.bytes {
            ShardBytes::Memory(bytes) => Ok(Cow::Borrowed(&bytes[from..to])),
            ShardBytes::File { file, len } => {
                let mut bytes = vec![0u8; to - from];
                read_exact_at(&shard.path, file, *len, from as u64, &mut bytes)?;
                Ok(Cow::Owned(bytes))
            }
            ShardBytes::Gguf(_) => unreachable!("GGUF tensors are read by read_gguf"),
        }
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

    /// The files, in the order they were opened.
    pub fn files(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path.as_path()).collect()
    }
}

/// Bytes `from..from + len` of `bytes` (which hold them), cut in place when
/// owned.
fn cut(bytes: Cow<'_, [u8]>, from: usize, len: usize) -> Cow<'_, [u8]> {
    match bytes {
        Cow::Borrowed(all) => Cow::Borrowed(&all[from..from + len]),
        Cow::Owned(mut all) => {
            all.truncate(from + len);
            all.drain(..from);
            all.shrink_to_fit();
            Cow::Owned(all)
        }
    }
}

/// The bytes of GGUF tensor `t` as `dtype`: as stored for a plain type or
/// kept blocks, else dequantized to f32; then llama.cpp's transform undone
/// (row by row: a row of blocks moves as a whole).
fn read_gguf(g: &GgufFile, t: &GgufTensor, dtype: Dtype) -> Result<Vec<u8>> {
    let info = &t.info;
    let mut bytes = if t.quantized.is_none() && dtype == Dtype::F32 && info.ty != TensorType::F32 {
        let mut values = g.read_f32(info)?;
        if t.fixup == Fixup::SubtractOne {
            values.iter_mut().for_each(|v| *v -= 1.0);
        }
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    } else {
        g.read(info)?
    };
    if t.fixup == Fixup::SubtractOne && info.ty == TensorType::F32 {
        for chunk in bytes.chunks_exact_mut(4) {
            let v = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) - 1.0;
            chunk.copy_from_slice(&v.to_le_bytes());
        }
    }
    if let Fixup::Unpermute { heads } = t.fixup {
        let rows = info.shape().first().copied().unwrap_or(1);
        if rows == 0 {
            return Ok(bytes);
        }
        if heads
            .checked_mul(2)
            .is_none_or(|pairs| pairs == 0 || !rows.is_multiple_of(pairs))
        {
            return Err(FrontendError::Safetensors {
                path: g.path().to_path_buf(),
                msg: format!(
                    "tensor `{}` has {rows} rows, which do not split into {heads} heads \
                     of rotary pairs (do the head counts belong to this file?)",
                    info.name
                ),
            });
        }
        let row_bytes = bytes.len() / rows as usize;
        bytes = names::unpermute_rows(&bytes, rows as usize, row_bytes, heads as usize);
    }
    Ok(bytes)
}

/// Reads and checks the header of the safetensors file `file` of `len`
/// bytes exactly as `SafeTensors::read_metadata` checks a whole file in
/// memory (the same errors), reading only the header; a failed check is the
/// error and the file's length.
fn read_header(
    path: &Path,
    file: &File,
    len: u64,
) -> Result<std::result::Result<(usize, Metadata), (SafeTensorError, u64)>> {
    let mut n = [0u8; 8];
    let got = len.min(8) as usize;
    read_exact_at(path, file, len, 0, &mut n[..got])?;
    let header_len = u64::from_le_bytes(n);
    // A header longer than the crate allows is refused from its length alone.
    let prefix_len = if got < 8 || header_len > MAX_HEADER_LEN {
        got as u64
    } else {
        len.min(8 + header_len)
    };
    let mut prefix = vec![0u8; prefix_len as usize];
    read_exact_at(path, file, len, 0, &mut prefix)?;
    Ok(match SafeTensors::read_metadata(&prefix) {
        Ok(found) if prefix_len == len => Ok(found),
        // The header is all there (a shorter file fails above) and valid
        // on its own: check that its data section ends where the file does.
        Ok(_) | Err(SafeTensorError::MetadataIncompleteBuffer) => {
            match serde_json::from_slice::<Metadata>(&prefix[8..]) {
                Ok(meta) if prefix_len + meta.data_len() as u64 == len => {
                    Ok((header_len as usize, meta))
                }
                Ok(_) => Err((SafeTensorError::MetadataIncompleteBuffer, len)),
                Err(e) => Err((SafeTensorError::InvalidHeaderDeserialization(e), len)),
            }
        }
        Err(e) => Err((e, len)),
    })
}

/// Fills `buf` from byte `at` of `file`, which was `len` bytes long when
/// opened; a file that has become shorter is [`FrontendError::Changed`].
fn read_exact_at(path: &Path, file: &File, len: u64, at: u64, buf: &mut [u8]) -> Result<()> {
    use positioned_io::ReadAt;
    file.read_exact_at(at, buf).map_err(|source| {
        if source.kind() == std::io::ErrorKind::UnexpectedEof {
            FrontendError::Changed {
                path: path.to_path_buf(),
                found: file.metadata().map_or(at, |m| m.len()),
                expected: len,
            }
        } else {
            FrontendError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}
