//! Opening a GGUF file: header, metadata and tensor directory, checked
//! against the file's length before anything is allocated.
//!
//! ```no_run
//! # fn main() -> Result<(), gerbil_gguf::GgufError> {
//! let gguf = gerbil_gguf::GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf".as_ref())?;
//! println!("{:?}", gguf.str("general.architecture")?);
//! for t in gguf.tensors() {
//!     println!("{} {:?} {}", t.name, t.shape(), t.ty);
//! }
//! let values = gguf.read_f32(gguf.tensor("token_embd.weight").unwrap())?;
//! # Ok(()) }
//! ```
//!
//! [`GgufFile::open`] reads the header sequentially and keeps the file open;
//! tensor data is read (one positional read per tensor) only when asked for,
//! so opening an 8B model costs its metadata, not its weights. The surprise
//! worth knowing: every length in the file — of a string, an array, a
//! tensor — is checked against the bytes that remain before a buffer of that
//! size exists, so a corrupt or hostile file is an error naming the key or
//! tensor, never an allocation of what it claims. Versions 2 and 3 are read
//! (version 1, with 32-bit lengths, predates every model on the hub).

use crate::error::GgufError;
use crate::types::TensorType;
use crate::value::Value;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// The first four bytes of every GGUF file.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest nesting of arrays accepted (GGUF files use at most 2).
const MAX_ARRAY_DEPTH: u32 = 8;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;

/// One tensor's directory entry.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// Name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions in ggml's order: `dims[0]` is the innermost (a row's length).
    pub dims: Vec<u64>,
    /// Element or block type.
    pub ty: TensorType,
    /// Byte offset of the data from the start of the file.
    pub offset: u64,
    /// Byte length of the data.
    pub bytes: u64,
}

impl TensorInfo {
    /// The shape outermost first, as safetensors and PyTorch write it.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    /// Number of values.
    pub fn values(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// Where the bytes are.
enum Source {
    File(File),
    Memory(Vec<u8>),
}

/// An open GGUF file.
pub struct GgufFile {
    path: PathBuf,
    source: Source,
    /// The format version (2 or 3).
    pub version: u32,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<TensorInfo>,
    by_name: BTreeMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens `path` and reads its header, metadata and tensor directory.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        let len = meta.len();
        let header = Header::read(path, BufReader::new(&file), len)?;
        Ok(header.into_file(path, Source::File(file)))
    }

    /// Reads a GGUF file already in memory; `path` names it in errors.
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let len = bytes.len() as u64;
        let header = Header::read(path, bytes.as_slice(), len)?;
        Ok(header.into_file(path, Source::Memory(bytes)))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, Value> {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// The tensors, in directory order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// An error about `key`.
    pub fn key_error(&self, key: &str, why: impl Into<String>) -> GgufError {
        GgufError::Metadata {
            path: self.path.clone(),
            key: key.to_string(),
            why: why.into(),
        }
    }

    /// `key` converted by `get`, `None` when absent, an error naming the
    /// key and both types when present with another type.
    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        get: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, GgufError> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => get(v).map(Some).ok_or_else(|| {
                self.key_error(key, format!("expected {expected}, found {}", v.kind()))
            }),
        }
    }

    /// `key` as a non-negative integer (any integer type).
    pub fn u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.typed(key, "a non-negative integer", Value::as_u64)
    }

    /// `key` as a number.
    pub fn f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        self.typed(key, "a number", Value::as_f64)
    }

    /// `key` as a boolean.
    pub fn bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.typed(key, "a boolean", Value::as_bool)
    }

    /// `key` as text.
    pub fn str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.typed(key, "a string", Value::as_str)
    }

    /// `key` as an array.
    pub fn array(&self, key: &str) -> Result<Option<&[Value]>, GgufError> {
        self.typed(key, "an array", Value::as_array)
    }

    /// `key`, which must be present, converted by one of the accessors above.
    pub fn require<'a, T>(
        &'a self,
        key: &str,
        get: impl FnOnce(&'a Self, &str) -> Result<Option<T>, GgufError>,
    ) -> Result<T, GgufError> {
        get(self, key)?.ok_or_else(|| self.key_error(key, "missing"))
    }

    /// The stored bytes of `t`, read from the file.
    pub fn read(&self, t: &TensorInfo) -> Result<Vec<u8>, GgufError> {
        let (at, n) = (t.offset, t.bytes);
        let truncated = |len| GgufError::Truncated {
            path: self.path.clone(),
            what: format!("tensor \"{}\"", t.name),
            at,
            needed: n,
            len,
        };
        match &self.source {
            Source::Memory(bytes) => Ok(bytes[at as usize..(at + n) as usize].to_vec()),
            Source::File(file) => {
                use positioned_io::ReadAt;
                let mut buf = vec![0u8; n as usize];
                file.read_exact_at(at, &mut buf).map_err(|source| {
                    if source.kind() == std::io::ErrorKind::UnexpectedEof {
                        // Shortened since it was opened.
                        truncated(file.metadata().map_or(0, |m| m.len()))
                    } else {
                        GgufError::Io {
                            path: self.path.clone(),
                            source,
                        }
                    }
                })?;
                Ok(buf)
            }
        }
    }

    /// The values of `t` as f32, dequantized.
    pub fn read_f32(&self, t: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        let bytes = self.read(t)?;
        let mut out = vec![0f32; t.values() as usize];
        t.ty.dequantize(&bytes, &mut out)
            .map_err(|why| GgufError::Tensor {
                path: self.path.clone(),
                tensor: t.name.clone(),
                why,
            })?;
        Ok(out)
    }
}

/// What the header holds, before the source is attached.
struct Header {
    version: u32,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<TensorInfo>,
    by_name: BTreeMap<String, usize>,
}

impl Header {
    fn into_file(self, path: &Path, source: Source) -> GgufFile {
        GgufFile {
            path: path.to_path_buf(),
            source,
            version: self.version,
            metadata: self.metadata,
            tensors: self.tensors,
            by_name: self.by_name,
        }
    }

    fn read(path: &Path, reader: impl Read, len: u64) -> Result<Header, GgufError> {
        let mut r = Cursor {
            path,
            reader,
            pos: 0,
            len,
        };
        let not_gguf = |why: String| GgufError::NotGguf {
            path: path.to_path_buf(),
            why,
        };
        if len < 4 {
            return Err(not_gguf(format!(
                "{len} bytes: too short to be a GGUF file"
            )));
        }
        let magic = r.bytes(4, "the magic")?;
        if magic != MAGIC {
            return Err(not_gguf(format!(
                "starts with {magic:02x?}, not \"GGUF\": not a GGUF file"
            )));
        }
        let version = r.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(not_gguf(format!(
                "GGUF version {version}; gerbil reads versions 2 and 3 \
                 (convert it again with a current llama.cpp)"
            )));
        }
        let n_tensors = r.u64("the tensor count")?;
        let n_kv = r.u64("the metadata count")?;
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = r.string(&format!("metadata key #{i}"))?;
            let what = format!("metadata key \"{key}\"");
            let ty = r.u32(&what)?;
            let value = r.value(ty, &key, 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(r.metadata_error(&key, "appears twice".into()));
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => a,
                _ => {
                    return Err(r.metadata_error(
                        "general.alignment",
                        format!("{v:?} is not a power of two"),
                    ))
                }
            },
        };
        let mut tensors = Vec::new();
        let mut by_name = BTreeMap::new();
        for i in 0..n_tensors {
            let name = r.string(&format!("tensor #{i}'s name"))?;
            let what = format!("tensor \"{name}\"");
            let tensor_error = |why: String| GgufError::Tensor {
                path: path.to_path_buf(),
                tensor: name.clone(),
                why,
            };
            let n_dims = r.u32(&what)?;
            if n_dims > MAX_DIMS {
                return Err(tensor_error(format!(
                    "{n_dims} dimensions; GGUF allows at most {MAX_DIMS}"
                )));
            }
            let dims = (0..n_dims)
                .map(|_| r.u64(&what))
                .collect::<Result<Vec<u64>, _>>()?;
            let type_id = r.u32(&what)?;
            let offset = r.u64(&what)?;
            let ty = TensorType::from_id(type_id).ok_or_else(|| {
                tensor_error(format!(
                    "unknown tensor type id {type_id} (a newer llama.cpp type?); gerbil reads {}",
                    crate::types::supported_names()
                ))
            })?;
            let values = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| tensor_error(format!("dimensions {dims:?} overflow")))?;
            let row = dims.first().copied().unwrap_or(1);
            if !row.is_multiple_of(ty.block_len()) {
                return Err(tensor_error(format!(
                    "rows of {row} values are not whole {ty} blocks of {}",
                    ty.block_len()
                )));
            }
            let bytes = ty
                .bytes_for(values)
                .ok_or_else(|| tensor_error(format!("dimensions {dims:?} overflow")))?;
            if !offset.is_multiple_of(alignment) {
                return Err(tensor_error(format!(
                    "data offset {offset} is not a multiple of the alignment {alignment}"
                )));
            }
            if by_name.insert(name.clone(), tensors.len()).is_some() {
                return Err(tensor_error("appears twice in the directory".into()));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
                bytes,
            });
        }
        let data_start = r.pos.div_ceil(alignment) * alignment;
        for t in &mut tensors {
            t.offset = t.offset.saturating_add(data_start);
            if t.offset.checked_add(t.bytes).is_none_or(|end| end > len) {
                return Err(GgufError::Truncated {
                    path: path.to_path_buf(),
                    what: format!("tensor \"{}\" ({} {:?})", t.name, t.ty, t.shape()),
                    at: t.offset,
                    needed: t.bytes,
                    len,
                });
            }
        }
        // Two tensors sharing bytes means a directory entry with the wrong
        // type or shape.
        let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.bytes > 0).collect();
        order.sort_by_key(|t| t.offset);
        for w in order.windows(2) {
            if w[0].offset + w[0].bytes > w[1].offset {
                return Err(GgufError::Tensor {
                    path: path.to_path_buf(),
                    tensor: w[0].name.clone(),
                    why: format!(
                        "its {} bytes ({} {:?}) run into tensor \"{}\" at offset {}: \
                         its type or shape disagrees with the data",
                        w[0].bytes,
                        w[0].ty,
                        w[0].shape(),
                        w[1].name,
                        w[1].offset
                    ),
                });
            }
        }
        Ok(Header {
            version,
            metadata,
            tensors,
            by_name,
        })
    }
}

/// A sequential reader that knows how many bytes remain.
struct Cursor<'p, R> {
    path: &'p Path,
    reader: R,
    pos: u64,
    len: u64,
}

impl<R: Read> Cursor<'_, R> {
    fn metadata_error(&self, key: &str, why: String) -> GgufError {
        GgufError::Metadata {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            why,
        }
    }

    /// Fails unless `n` more bytes remain.
    fn need(&self, n: u64, what: &str) -> Result<(), GgufError> {
        if n > self.len - self.pos {
            return Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: what.to_string(),
                at: self.pos,
                needed: n,
                len: self.len,
            });
        }
        Ok(())
    }

    fn bytes(&mut self, n: u64, what: &str) -> Result<Vec<u8>, GgufError> {
        self.need(n, what)?;
        let mut buf = vec![0u8; n as usize];
        self.reader
            .read_exact(&mut buf)
            .map_err(|source| GgufError::Io {
                path: self.path.to_path_buf(),
                source,
            })?;
        self.pos += n;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let b = self.bytes(N as u64, what)?;
        Ok(std::array::from_fn(|i| b[i]))
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let n = self.u64(what)?;
        let bytes = self.bytes(n, what)?;
        String::from_utf8(bytes).map_err(|e| GgufError::NotGguf {
            path: self.path.to_path_buf(),
            why: format!("{what}: text that is not UTF-8 ({e})"),
        })
    }

    /// A value of GGUF type `ty` under `key`, arrays nested `depth` deep.
    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<Value, GgufError> {
        let what = format!("metadata key \"{key}\"");
        let w = what.as_str();
        Ok(match ty {
            0 => Value::U8(self.array::<1>(w)?[0]),
            1 => Value::I8(self.array::<1>(w)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(w)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(w)?)),
            4 => Value::U32(self.u32(w)?),
            5 => Value::I32(i32::from_le_bytes(self.array(w)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(w)?)),
            7 => match self.array::<1>(w)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.metadata_error(key, format!("bool byte {b} is not 0 or 1"))),
            },
            8 => {
                let n = self.u64(w)?;
                let bytes = self.bytes(n, w)?;
                Value::Str(String::from_utf8(bytes).map_err(|e| {
                    self.metadata_error(key, format!("text that is not UTF-8 ({e})"))
                })?)
            }
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.metadata_error(
                        key,
                        format!("arrays nested more than {MAX_ARRAY_DEPTH} deep"),
                    ));
                }
                let elem = self.u32(w)?;
                let count = self.u64(w)?;
                let min = min_size(elem).ok_or_else(|| {
                    self.metadata_error(key, format!("unknown array element type {elem}"))
                })?;
                self.need(
                    count.saturating_mul(min),
                    &format!("{what} ({count} elements)"),
                )?;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(w)?),
            11 => Value::I64(i64::from_le_bytes(self.array(w)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(w)?)),
            other => return Err(self.metadata_error(key, format!("unknown value type {other}"))),
        })
    }
}

/// The fewest bytes a value of GGUF type `ty` takes, or `None` for an
/// unknown type.
fn min_size(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => return None,
    })
}
