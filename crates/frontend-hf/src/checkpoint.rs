//! A HuggingFace checkpoint directory, opened.
//!
//! ```no_run
//! # fn main() -> Result<(), gerbil_frontend_hf::FrontendError> {
//! use gerbil_frontend_hf::Checkpoint;
//! let ckpt = Checkpoint::open(std::path::Path::new("models/SmolLM2-135M"))?;
//! println!("{} layers", ckpt.config.num_hidden_layers);
//! let emb = ckpt.tensor("model.embed_tokens.weight")?;
//! println!("{:?} {}", emb.shape, emb.dtype);
//! # Ok(()) }
//! ```
//!
//! [`Checkpoint::open`] reads `config.json` (kept raw and typed), opens the
//! safetensors files (their tensors are read when asked for) and captures
//! the text assets. It does not pick a family
//! builder: that happens in [`crate::lower()`], so a directory of an
//! unsupported architecture can still be inspected. A directory without
//! weight files opens too (tokenizer-only fixtures); lowering it fails with
//! [`FrontendError::NoWeights`]. Two fix-ups make an embedder's files read
//! like the rest: a decoder saved without its head (`Qwen3Model`:
//! `layers.0…`, no `model.` prefix) gets the prefix the families read, and
//! the weights of sentence-transformers `Dense` modules (`2_Dense/model.safetensors`)
//! join the store as `2_Dense.linear.weight` ([`crate::sentence`]). A
//! directory with a LoRA adapter (`adapter_config.json`: what `gerbil-train
//! --lora` writes, or PEFT's) opens as its base model — the directory's own
//! `config.json` and weights, else those of the base it names — holding the
//! adapter, merged into every weight it covers ([`crate::adapter`]).

use crate::adapter::Adapter;
use crate::config::HfConfig;
use crate::error::{FrontendError, Result};
use crate::text::TextAssets;
use crate::weights::{TensorView, WeightStore};
use serde_json::Value;
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// The model configuration file.
pub const CONFIG_FILE: &str = "config.json";

/// A local HuggingFace model directory: configuration, weights, text assets.
#[derive(Debug)]
pub struct Checkpoint {
    /// The directory, as given.
    pub dir: PathBuf,
    /// Model name: the directory's name.
    pub name: String,
    /// `config.json` as parsed JSON, for family-specific keys.
    pub config_json: Value,
    /// The keys every decoder family shares, normalized across transformers versions.
    pub config: HfConfig,
    /// The weights (empty when the directory has none).
    pub weights: WeightStore,
    /// Whether weight files were found.
    pub has_weights: bool,
    /// Tokenizer, chat template and special tokens.
    pub text: TextAssets,
    /// The LoRA adapter the directory holds, if any.
    pub adapter: Option<Adapter>,
}

impl Checkpoint {
    /// Opens a checkpoint: a directory (parses `config.json`, opens
    /// `model.safetensors` or the shards of `model.safetensors.index.json`
    /// and reads the optional text assets), a GGUF file ([`crate::gguf`]),
    /// or a directory without `config.json` that holds exactly one GGUF file.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        if dir.is_dir() && Adapter::is_in(dir) {
            return open_adapter(dir);
        }
        Self::open_model(dir)
    }

    /// [`Checkpoint::open`] without looking for an adapter.
    fn open_model(dir: &Path) -> Result<Checkpoint> {
        let meta = std::fs::metadata(dir).map_err(|source| FrontendError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        if meta.is_file() && crate::gguf::is_gguf(dir) {
            return crate::gguf::open(dir);
        }
        if !meta.is_dir() {
            return Err(FrontendError::Io {
                path: dir.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    "expected a HuggingFace model directory or a GGUF file",
                ),
            });
        }
        let config_path = dir.join(CONFIG_FILE);
        if !config_path.exists() {
            if let Some(gguf) = single_gguf(dir)? {
                return crate::gguf::open(&gguf);
            }
        }
        check_regular(&config_path)?;
        let text = std::fs::read_to_string(&config_path).map_err(|source| FrontendError::Io {
            path: config_path.clone(),
            source,
        })?;
        let config_json: Value =
            serde_json::from_str(&text).map_err(|source| FrontendError::Json {
                path: config_path.clone(),
                source,
            })?;
        let config = HfConfig::from_json_str(&text, &config_path)?;
        let (mut weights, has_weights) = match WeightStore::open_dir(dir)? {
            Some(store) => (store, true),
            None => (WeightStore::empty(), false),
        };
        // A decoder saved without its LM head (an embedder's `Qwen3Model`)
        // names its tensors without the `model.` the families read.
        if weights.contains("embed_tokens.weight") && !weights.contains("model.embed_tokens.weight")
        {
            weights.prefix_names("model.");
        }
        crate::sentence::add_module_weights(dir, &mut weights)?;
        let text = TextAssets::load_with_config(dir, Some(&config_json))?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            name: dir_name(dir),
            config_json,
            config,
            weights,
            has_weights,
            text,
            adapter: None,
        })
    }

    /// The tensor called `name` (see [`WeightStore::tensor`]).
    /// With an adapter: its factors by their names, and the weights it
    /// covers merged while it is ([`Adapter::apply`]).
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        match &self.adapter {
            Some(a) => match a.factor(name) {
                Some(factor) => Ok(factor),
                None => a.apply(name, self.weights.tensor(name)?),
            },
            None => self.weights.tensor(name),
        }
    }

    /// Rows `start..start + count` of tensor `name` (see
    /// [`WeightStore::tensor_rows`]).
    pub fn tensor_rows(&self, name: &str, start: u64, count: u64) -> Result<TensorView<'_>> {
        if let Some(factor) = self.adapter.as_ref().and_then(|a| a.factor(name)) {
            let total = factor.shape[0];
            if start.checked_add(count).is_none_or(|end| end > total) {
                return Err(FrontendError::TensorShape {
                    name: name.to_string(),
                    expected: vec![start.saturating_add(count), factor.shape[1]],
                    found: factor.shape,
                });
            }
            let row = factor.data.len() / total.max(1) as usize;
            let (at, len) = (start as usize * row, count as usize * row);
            return Ok(TensorView {
                shape: vec![count, factor.shape[1]],
                data: Cow::Owned(factor.data[at..at + len].to_vec()),
                ..factor
            });
        }
        let rows = self.weights.tensor_rows(name, start, count)?;
        let Some(adapter) = self.adapter.as_ref().filter(|a| a.covers(name)) else {
            return Ok(rows);
        };
        let mut whole = adapter.apply(name, self.weights.tensor(name)?)?;
        let row_bytes = rows.data.len() as u64 / count.max(1);
        let at = (start * row_bytes) as usize;
        whole.data = Cow::Owned(whole.data[at..at + rows.data.len()].to_vec());
        whole.shape = rows.shape;
        Ok(whole)
    }

    /// Whether the checkpoint holds a tensor called `name` (an adapter's
    /// factors included).
    pub fn contains(&self, name: &str) -> bool {
        self.weights.contains(name)
            || self
                .adapter
                .as_ref()
                .is_some_and(|a| a.factors.contains_key(name))
    }

    /// Where the configuration came from, for error messages: `config.json`,
    /// or the GGUF file whose metadata it was written from.
    pub fn config_path(&self) -> PathBuf {
        self.config.path.clone()
    }
}

/// The checkpoint of adapter directory `dir`: its own `config.json`, text
/// assets and weights where it has them, the rest from the base model its
/// `adapter_config.json` names; holding the adapter, merged.
fn open_adapter(dir: &Path) -> Result<Checkpoint> {
    let mut adapter = Adapter::open(dir)?;
    let config = dir.join(crate::adapter::ADAPTER_CONFIG);
    // The base as found, made absolute: a checkpoint written elsewhere
    // names it from there.
    let named = Path::new(&adapter.config.base);
    let found = [dir.join(named), named.to_path_buf()]
        .into_iter()
        .find(|p| !adapter.config.base.is_empty() && p.join(CONFIG_FILE).is_file())
        .map(|p| p.canonicalize().unwrap_or(p));
    let named = adapter.config.base.clone();
    let base = || {
        found.clone().ok_or_else(|| FrontendError::Adapter {
            path: config.clone(),
            why: format!(
                "its base model `{named}` (`base_model_name_or_path`) is not a model directory \
                 here; set it to the base checkpoint's directory"
            ),
        })
    };
    if let Some(found) = &found {
        adapter.config.base = found.display().to_string();
    }
    let mut ckpt = if dir.join(CONFIG_FILE).is_file() {
        Checkpoint::open_model(dir)?
    } else {
        let mut ckpt = Checkpoint::open_model(&base()?)?;
        ckpt.name = dir_name(dir);
        ckpt
    };
    if !ckpt.has_weights {
        let from = base()?;
        ckpt.weights = WeightStore::open_dir(&from)?.ok_or_else(|| FrontendError::Adapter {
            path: config.clone(),
            why: format!("its base model {} has no weights", from.display()),
        })?;
        ckpt.has_weights = true;
    }
    adapter.check_fits(&ckpt.weights, &config)?;
    ckpt.adapter = Some(adapter);
    Ok(ckpt)
}

/// The one `.gguf` file in `dir`, `None` when there is none, an error
/// naming them when there are several (the user picks one by its path).
fn single_gguf(dir: &Path) -> Result<Option<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|source| FrontendError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        })
        .collect();
    found.sort();
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => {
            let names: Vec<String> = found
                .iter()
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            Err(FrontendError::Io {
                path: dir.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "no config.json, and {} GGUF files ({}): name the one to compile",
                        names.len(),
                        names.join(", ")
                    ),
                ),
            })
        }
    }
}

/// Refuses a checkpoint file that is not a regular file before it is opened:
/// opening a FIFO would block until something writes to it, and a directory
/// or a device cannot be read as one (`NotFound` passes through unchanged).
pub(crate) fn check_regular(path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|source| FrontendError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if meta.is_file() {
        return Ok(());
    }
    let kind = if meta.is_dir() {
        "a directory"
    } else {
        "a FIFO, a device or a socket"
    };
    Err(FrontendError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it is {kind}, not a regular file"),
        ),
    })
}

/// The last component of `dir` (after resolving `.` and `..`), or the path
/// as written when it has none.
fn dir_name(dir: &Path) -> String {
    let resolved = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    resolved
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string())
}
