//! The sentence-transformers pipeline around an encoder: how token rows
//! become one vector, and how long an input may be.
//!
//! [`SentencePipeline::read`] reads what sentence-transformers saves beside
//! the transformer's own files: `modules.json` (the modules in order: the
//! `Transformer`, then `Pooling`, optionally `Normalize`), the pooling
//! module's `config.json` (both the old `pooling_mode_*_tokens` booleans
//! and the newer `pooling_mode` string) and `sentence_bert_config.json`
//! (`max_seq_length`). A directory without `modules.json` gets what
//! sentence-transformers gives a plain transformers model: mean pooling, no
//! normalization. The surprise: `Normalize` has no files of its own (the
//! `2_Normalize` directory it names usually does not exist), so only its
//! entry in `modules.json` says the vectors are unit length.

use crate::checkpoint::check_regular;
use crate::error::{FrontendError, Result};
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
        for m in modules {
            let kind = m.kind.rsplit('.').next().unwrap_or_default();
            match kind {
                "Transformer" => {}
                "Normalize" => pipeline.normalize = true,
                "Pooling" => {
                    let path = dir.join(&m.path).join("config.json");
                    pipeline.pooling = pooling_of(&read_json(&path)?, &path)?;
                }
                _ => {
                    return Err(FrontendError::Config {
                        path: modules_path,
                        key: "type".into(),
                        why: format!(
                            "sentence-transformers module `{}` is not supported (gerbil runs \
                             Transformer, Pooling and Normalize)",
                            m.kind
                        ),
                    })
                }
            }
        }
        Ok(pipeline)
    }
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
