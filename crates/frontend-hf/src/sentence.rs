//! The sentence-transformers pipeline around an encoder: how token rows
//! become one vector, and how long an input may be.
//!
//! [`SentencePipeline::read`] reads what sentence-transformers saves beside
//! the transformer's own files: `modules.json` (the modules in order: the
//! `Transformer`, then `Pooling`, any `Dense` projections, optionally
//! `Normalize`), the pooling module's `config.json` (both the old
//! `pooling_mode_*_tokens` booleans and the newer `pooling_mode` string),
//! each `Dense` module's `config.json` and `sentence_bert_config.json`
//! (`max_seq_length`). A directory without `modules.json` gets what
//! sentence-transformers gives a plain transformers model: mean pooling, no
//! normalization. A `Dense` module keeps its weights in its own directory
//! (`2_Dense/model.safetensors`, `linear.weight`); [`add_module_weights`]
//! adds them to the checkpoint's store as `2_Dense.linear.weight`. The
//! surprise: `Normalize` has no files of its own (the `2_Normalize`
//! directory it names usually does not exist), so only its entry in
//! `modules.json` says the vectors are unit length.

use crate::checkpoint::check_regular;
use crate::error::{FrontendError, Result};
use crate::weights::WeightStore;
use serde::Deserialize;
use std::path::Path;

/// How an encoder's token rows become one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolingMode {
    /// The mean of every token's row.
    Mean,
    /// The first token's row (`[CLS]`).
    Cls,
    /// Each column's largest value.
    Max,
    /// The last token's row (decoder-based embedders).
    LastToken,
}

impl PoolingMode {
    /// The name the plan records: `mean`, `cls`, `max` or `last`.
    pub fn name(self) -> &'static str {
        match self {
            PoolingMode::Mean => "mean",
            PoolingMode::Cls => "cls",
            PoolingMode::Max => "max",
            PoolingMode::LastToken => "last",
        }
    }
}

/// The pipeline after the transformer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentencePipeline {
    /// How rows are pooled.
    pub pooling: PoolingMode,
    /// Whether the pooled vector is L2-normalized.
    pub normalize: bool,
    /// Most tokens of an input (`sentence_bert_config.json`), if said.
    pub max_seq_length: Option<u64>,
    /// Linear projections of the pooled vector, in order (EmbeddingGemma's
    /// 768 → 3072 → 768).
    pub dense: Vec<DenseLayer>,
}

/// A sentence-transformers `Dense` module: `y = W·x (+ b)`, no activation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DenseLayer {
    /// Its weights' names start with this (`2_Dense.`): `linear.weight`,
    /// `linear.bias`.
    pub prefix: String,
    /// Input width.
    pub in_features: u64,
    /// Output width.
    pub out_features: u64,
    /// Whether it adds a bias.
    pub bias: bool,
}

#[derive(Deserialize)]
struct DenseConfig {
    in_features: u64,
    out_features: u64,
    #[serde(default = "yes")]
    bias: bool,
    #[serde(default = "tanh")]
    activation_function: String,
}

fn yes() -> bool {
    true
}

/// sentence-transformers' default activation of a `Dense` module.
fn tanh() -> String {
    "torch.nn.modules.activation.Tanh".into()
}

#[derive(Deserialize)]
struct Module {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    path: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PoolingConfig {
    pooling_mode: Option<String>,
    pooling_mode_cls_token: bool,
    pooling_mode_mean_tokens: bool,
    pooling_mode_max_tokens: bool,
    pooling_mode_mean_sqrt_len_tokens: bool,
    pooling_mode_weightedmean_tokens: bool,
    pooling_mode_lasttoken: bool,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SentenceBertConfig {
    max_seq_length: Option<u64>,
}

/// Reads and parses the JSON file `path` into `T`.
fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    check_regular(path)?;
    let text = std::fs::read_to_string(path).map_err(|source| FrontendError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| FrontendError::Json {
        path: path.to_path_buf(),
        source,
    })
}

impl SentencePipeline {
    /// The pipeline saved in the checkpoint directory `dir`.
    pub fn read(dir: &Path) -> Result<SentencePipeline> {
        let mut pipeline = SentencePipeline {
            pooling: PoolingMode::Mean,
            normalize: false,
            max_seq_length: None,
            dense: Vec::new(),
        };
        let bert_config = dir.join("sentence_bert_config.json");
        if bert_config.exists() {
            let c: SentenceBertConfig = read_json(&bert_config)?;
            pipeline.max_seq_length = c.max_seq_length.filter(|&n| n > 0);
        }
        let modules_path = dir.join("modules.json");
        if !modules_path.exists() {
            return Ok(pipeline);
        }
        let modules: Vec<Module> = read_json(&modules_path)?;
        let bad = |why: String| FrontendError::Config {
            path: modules_path.clone(),
            key: "type".into(),
            why,
        };
        // Where the pipeline is: the transformer, pooled, then normalized.
        let (mut pooled, mut normalized) = (false, false);
        for m in modules {
            let kind = kind(&m);
            if normalized && kind != "Normalize" {
                return Err(bad(format!(
                    "module `{}` after Normalize is not supported",
                    m.kind
                )));
            }
            match kind {
                "Transformer" => {}
                "Normalize" => {
                    pipeline.normalize = true;
                    normalized = true;
                }
                "Pooling" => {
                    let path = dir.join(&m.path).join("config.json");
                    pipeline.pooling = pooling_of(&read_json(&path)?, &path)?;
                    pooled = true;
                }
                "Dense" if !pooled => {
                    return Err(bad("a Dense module before Pooling is not supported".into()))
                }
                "Dense" => pipeline.dense.push(dense_of(dir, &m.path)?),
                _ => {
                    return Err(bad(format!(
                        "sentence-transformers module `{}` is not supported (gerbil runs \
                         Transformer, Pooling, Dense and Normalize)",
                        m.kind
                    )))
                }
            }
        }
        Ok(pipeline)
    }
}

/// A module's type without its Python package (`Pooling`, `Dense`, ...).
fn kind(m: &Module) -> &str {
    m.kind.rsplit('.').next().unwrap_or_default()
}

/// Whether `dir` has a `modules.json` with a `Pooling` module (one that
/// does not parse says no here; [`SentencePipeline::read`] names its fault).
pub(crate) fn pools(dir: &Path) -> bool {
    let path = dir.join("modules.json");
    path.exists()
        && read_json::<Vec<Module>>(&path).is_ok_and(|ms| ms.iter().any(|m| kind(m) == "Pooling"))
}

/// The `Dense` module saved in `dir/path`.
fn dense_of(dir: &Path, path: &str) -> Result<DenseLayer> {
    let config_path = dir.join(path).join("config.json");
    let c: DenseConfig = read_json(&config_path)?;
    if c.activation_function.rsplit('.').next() != Some("Identity") {
        return Err(FrontendError::Config {
            path: config_path,
            key: "activation_function".into(),
            why: format!(
                "`{}` is not supported; gerbil runs Dense modules without an activation \
                 (torch.nn.modules.linear.Identity)",
                c.activation_function
            ),
        });
    }
    Ok(DenseLayer {
        prefix: format!("{}.", path.trim_end_matches('/')),
        in_features: c.in_features,
        out_features: c.out_features,
        bias: c.bias,
    })
}

/// Adds the weights of the `Dense` modules `modules.json` in `dir` names
/// (`PATH/model.safetensors`) to `store`, under `PATH.` (nothing when the
/// directory has no `modules.json`). A module saved only as
/// `pytorch_model.bin` is an error naming the conversion.
pub(crate) fn add_module_weights(dir: &Path, store: &mut WeightStore) -> Result<()> {
    let modules_path = dir.join("modules.json");
    if !modules_path.exists() {
        return Ok(());
    }
    let modules: Vec<Module> = read_json(&modules_path)?;
    for m in modules.iter().filter(|m| kind(m) == "Dense") {
        let file = dir.join(&m.path).join("model.safetensors");
        if !file.exists() {
            return Err(FrontendError::Config {
                path: dir.join(&m.path),
                key: "model.safetensors".into(),
                why: "the Dense module has no model.safetensors (an old save in \
                      pytorch_model.bin?): load and save the model again with a recent \
                      sentence-transformers, which writes safetensors"
                    .into(),
            });
        }
        store.add_file(&file, &format!("{}.", m.path.trim_end_matches('/')))?;
    }
    Ok(())
}

/// The one pooling mode a pooling config selects.
fn pooling_of(c: &PoolingConfig, path: &Path) -> Result<PoolingMode> {
    let bad = |why: String| FrontendError::Config {
        path: path.to_path_buf(),
        key: "pooling_mode".into(),
        why,
    };
    if let Some(mode) = &c.pooling_mode {
        return match mode.as_str() {
            "mean" => Ok(PoolingMode::Mean),
            "cls" => Ok(PoolingMode::Cls),
            "max" => Ok(PoolingMode::Max),
            "lasttoken" => Ok(PoolingMode::LastToken),
            other => Err(bad(format!(
                "`{other}` is not supported; gerbil pools by mean, cls, max or lasttoken"
            ))),
        };
    }
    let flags = [
        (c.pooling_mode_mean_tokens, Some(PoolingMode::Mean)),
        (c.pooling_mode_cls_token, Some(PoolingMode::Cls)),
        (c.pooling_mode_max_tokens, Some(PoolingMode::Max)),
        (c.pooling_mode_lasttoken, Some(PoolingMode::LastToken)),
        (c.pooling_mode_mean_sqrt_len_tokens, None),
        (c.pooling_mode_weightedmean_tokens, None),
    ];
    let on: Vec<Option<PoolingMode>> = flags.iter().filter(|f| f.0).map(|f| f.1).collect();
    match on.as_slice() {
        [Some(mode)] => Ok(*mode),
        [None] => Err(bad(
            "mean_sqrt_len and weightedmean pooling are not supported; gerbil pools by mean, \
             cls, max or lasttoken"
                .into(),
        )),
        [] => Err(bad("no pooling mode is switched on".into())),
        _ => Err(bad(
            "several pooling modes at once (a concatenated vector) are not supported".into(),
        )),
    }
}
