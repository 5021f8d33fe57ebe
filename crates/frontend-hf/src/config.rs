//! Typed view of a HuggingFace `config.json`.
//!
//! [`HfConfig::from_json_str`] parses the keys every decoder-only family shares
//! and normalizes the two spellings transformers has used: v5 writes
//! `rope_parameters: {rope_theta, rope_type, ...}` and `dtype`, v4 writes a
//! top-level `rope_theta`, `rope_scaling: {type | rope_type, factor, ...}` and
//! `torch_dtype`. Both produce the same [`HfConfig`], so everything downstream
//! sees one shape. Family-specific keys are read by the family builders from
//! the raw JSON that [`crate::Checkpoint`] keeps alongside.
//!
//! The surprise: `rope_parameters` may also be a map from layer type to
//! parameters (Gemma 3: `{"full_attention": {...}, "sliding_attention": {...}}`),
//! which is why [`RopeConfig`] has two forms. Per-layer-type parameters do not
//! inherit the top-level `rope_theta`: which default applies depends on the
//! layer type and the family (Gemma 3's sliding layers fall back to
//! `rope_local_base_freq`), so the family resolves it.
//!
//! Numbers arrive as f64 but the kernels compute in f32: [`kernel_f32`] is the
//! one checked conversion every config value that reaches a kernel goes
//! through, so `1e39` or `1e-50` is a config error naming the key, not an
//! infinity or a zero in the plan.

use crate::error::{FrontendError, Result};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `v` as the f32 the kernels use, or why it cannot be: a finite `v` that
/// becomes infinite, or a non-zero one that becomes 0.
pub fn kernel_f32(v: f64) -> std::result::Result<f32, String> {
    let r = v as f32;
    if v.is_finite() && (r.is_infinite() || (v != 0.0 && r == 0.0)) {
        Err(format!(
            "{v:e} becomes {r} in f32, the precision the kernels compute in; \
             use a value between {:e} and {:e}",
            f32::MIN_POSITIVE,
            f32::MAX
        ))
    } else {
        Ok(r)
    }
}

/// A token id or a list of them (`eos_token_id` may be either).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    /// A single id.
    One(u32),
    /// Several ids.
    Many(Vec<u32>),
}

impl TokenIds {
    /// The ids as a list.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// The keys of `config.json` as written, v4 and v5 spellings side by side.
#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    architectures: Option<Vec<String>>,
    #[serde(default)]
    model_type: Option<String>,
    hidden_size: u64,
    intermediate_size: u64,
    num_hidden_layers: u64,
    num_attention_heads: u64,
    #[serde(default)]
    num_key_value_heads: Option<u64>,
    #[serde(default)]
    head_dim: Option<u64>,
    vocab_size: u64,
    #[serde(default)]
    rms_norm_eps: Option<f64>,
    /// An encoder's LayerNorm epsilon, read where `rms_norm_eps` is absent.
    #[serde(default)]
    layer_norm_eps: Option<f64>,
    max_position_embeddings: u64,
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
    #[serde(default)]
    hidden_act: Option<String>,
    #[serde(default)]
    hidden_activation: Option<String>,
    #[serde(default)]
    attention_bias: Option<bool>,
    #[serde(default)]
    mlp_bias: Option<bool>,
    #[serde(default)]
    dtype: Option<String>,
    #[serde(default)]
    torch_dtype: Option<String>,
    #[serde(default)]
    rope_parameters: Option<Value>,
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default)]
    rope_scaling: Option<Value>,
    #[serde(default)]
    partial_rotary_factor: Option<f64>,
    #[serde(default)]
    original_max_position_embeddings: Option<u64>,
    #[serde(default)]
    sliding_window: Option<u64>,
    #[serde(default)]
    bos_token_id: Option<TokenIds>,
    #[serde(default)]
    eos_token_id: Option<TokenIds>,
    #[serde(default)]
    pad_token_id: Option<TokenIds>,
}

/// One set of RoPE parameters, as in v5's `rope_parameters` (or v4's
/// `rope_scaling` plus the top-level `rope_theta`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct RopeParameters {
    /// `rope_type` (v4: `type`); `default` when absent.
    #[serde(default = "default_rope_type")]
    pub rope_type: String,
    /// Base of the frequencies; `None` means the family's default.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// Scaling factor (`linear`, `llama3`, ...).
    #[serde(default)]
    pub factor: Option<f64>,
    /// `llama3`: low-frequency factor.
    #[serde(default)]
    pub low_freq_factor: Option<f64>,
    /// `llama3`: high-frequency factor.
    #[serde(default)]
    pub high_freq_factor: Option<f64>,
    /// `llama3` / `yarn` / `longrope`: context length the model was
    /// pre-trained with. For these types it is always set after parsing:
    /// a top-level `original_max_position_embeddings` takes priority, then
    /// this key, then `max_position_embeddings` (as transformers'
    /// `standardize_rope_params`).
    #[serde(default)]
    pub original_max_position_embeddings: Option<u64>,
    /// Fraction of each head that rotates (1 when absent).
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    /// `yarn` / `longrope`: multiplier of cos and sin; derived from `factor`
    /// when absent.
    #[serde(default)]
    pub attention_factor: Option<f64>,
    /// `yarn`: rotations above which dimensions keep their frequency (32).
    #[serde(default)]
    pub beta_fast: Option<f64>,
    /// `yarn`: rotations below which dimensions are fully interpolated (1).
    #[serde(default)]
    pub beta_slow: Option<f64>,
    /// `yarn`: numerator scale of the derived attention factor.
    #[serde(default)]
    pub mscale: Option<f64>,
    /// `yarn`: denominator scale of the derived attention factor.
    #[serde(default)]
    pub mscale_all_dim: Option<f64>,
    /// `yarn`: whether the correction range is rounded to whole dimensions (true).
    #[serde(default)]
    pub truncate: Option<bool>,
    /// `longrope`: per-frequency divisors for contexts up to
    /// `original_max_position_embeddings`.
    #[serde(default)]
    pub short_factor: Option<Vec<f64>>,
    /// `longrope`: per-frequency divisors for longer contexts.
    #[serde(default)]
    pub long_factor: Option<Vec<f64>>,
    /// Every other key, kept for RoPE variants added later.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

fn default_rope_type() -> String {
    "default".to_string()
}

impl RopeParameters {
    /// Plain RoPE with the family's default base.
    pub fn plain() -> Self {
        RopeParameters {
            rope_type: default_rope_type(),
            rope_theta: None,
            factor: None,
            low_freq_factor: None,
            high_freq_factor: None,
            original_max_position_embeddings: None,
            partial_rotary_factor: None,
            attention_factor: None,
            beta_fast: None,
            beta_slow: None,
            mscale: None,
            mscale_all_dim: None,
            truncate: None,
            short_factor: None,
            long_factor: None,
            extra: BTreeMap::new(),
        }
    }

    /// `rope_theta`, or the family's default when the config has none.
    pub fn theta_or(&self, default: f64) -> f64 {
        self.rope_theta.unwrap_or(default)
    }

    /// Parses one parameter object; accepts v4's `type` for `rope_type`.
    fn from_value(value: &Value, path: &Path, key: &str) -> Result<Self> {
        let mut obj = match value {
            Value::Object(m) => m.clone(),
            other => {
                return Err(FrontendError::Config {
                    path: path.to_path_buf(),
                    key: key.to_string(),
                    why: format!("expected an object, found {other}"),
                })
            }
        };
        // transformers: rope_type = rope_scaling.get("rope_type", rope_scaling.get("type"))
        let legacy_type = obj.remove("type");
        if !obj.contains_key("rope_type") {
            if let Some(t) = legacy_type {
                obj.insert("rope_type".to_string(), t);
            }
        }
        serde_json::from_value(Value::Object(obj)).map_err(|e| FrontendError::Config {
            path: path.to_path_buf(),
            key: key.to_string(),
            why: e.to_string(),
        })
    }
}

/// The model's RoPE configuration.
#[derive(Clone, Debug, PartialEq)]
// One per config, never in a collection: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum RopeConfig {
    /// One set of parameters for every layer.
    Uniform(RopeParameters),
    /// Parameters per layer type (`full_attention`, `sliding_attention`, ...).
    PerLayerType(BTreeMap<String, RopeParameters>),
}

impl RopeConfig {
    /// The single parameter set, or an error for per-layer-type configs
    /// (families that use one table for all layers call this).
    pub fn uniform(&self, path: &Path) -> Result<&RopeParameters> {
        match self {
            RopeConfig::Uniform(p) => Ok(p),
            RopeConfig::PerLayerType(m) => Err(FrontendError::Config {
                path: path.to_path_buf(),
                key: "rope_parameters".to_string(),
                why: format!(
                    "this architecture uses one RoPE for all layers, but the config gives \
                     parameters per layer type ({})",
                    m.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            }),
        }
    }
}

/// The keys shared by decoder-only families, normalized across transformers
/// versions and validated (positive sizes, heads dividing evenly).
#[derive(Clone, Debug, PartialEq)]
pub struct HfConfig {
    /// The file this came from (for error messages).
    pub path: PathBuf,
    /// `architectures` (model classes), usually one.
    pub architectures: Vec<String>,
    /// `model_type`, if present.
    pub model_type: Option<String>,
    /// Width of the residual stream.
    pub hidden_size: u64,
    /// Width of the MLP's hidden layer.
    pub intermediate_size: u64,
    /// Number of decoder layers.
    pub num_hidden_layers: u64,
    /// Query heads.
    pub num_attention_heads: u64,
    /// Key/value heads (`num_attention_heads` when absent).
    pub num_key_value_heads: u64,
    /// Width of one head (`head_dim`, else `hidden_size / num_attention_heads`).
    pub head_dim: u64,
    /// `head_dim` as written in the config, if it is (families whose class
    /// has its own default, like Qwen 3's 128, need to know).
    pub explicit_head_dim: Option<u64>,
    /// Vocabulary size (rows of the embedding table).
    pub vocab_size: u64,
    /// RMSNorm epsilon (an encoder's `layer_norm_eps`: its LayerNorm's).
    pub rms_norm_eps: f64,
    /// Maximum context length the model was trained for.
    pub max_position_embeddings: u64,
    /// `tie_word_embeddings`; `None` means the family's default.
    pub tie_word_embeddings: Option<bool>,
    /// `hidden_act` (Gemma: `hidden_activation`), if present.
    pub hidden_act: Option<String>,
    /// `attention_bias`; `None` means the family's default.
    pub attention_bias: Option<bool>,
    /// `mlp_bias`; `None` means the family's default.
    pub mlp_bias: Option<bool>,
    /// Storage dtype the checkpoint was saved in (`dtype`, v4 `torch_dtype`).
    pub dtype: Option<String>,
    /// RoPE parameters (v5 `rope_parameters` or v4 `rope_theta` + `rope_scaling`).
    pub rope: RopeConfig,
    /// The top-level `rope_theta` when [`RopeConfig::PerLayerType`] (whose
    /// parameters do not inherit it; the family decides). `None` for
    /// uniform parameters, which already hold it.
    pub rope_theta: Option<f64>,
    /// The top-level `original_max_position_embeddings`, if present.
    pub original_max_position_embeddings: Option<u64>,
    /// Sliding attention window, if any.
    pub sliding_window: Option<u64>,
    /// `bos_token_id`, if present (the first one when a list).
    pub bos_token_id: Option<u32>,
    /// `eos_token_id` as a list (empty when absent).
    pub eos_token_ids: Vec<u32>,
    /// `pad_token_id`, if present (the first one when a list): the
    /// embedding row training leaves to its other readers.
    pub pad_token_id: Option<u32>,
}

impl HfConfig {
    /// Parses and validates the text of a `config.json`; `path` is used in errors.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self> {
        let raw: RawConfig = serde_json::from_str(text).map_err(|source| FrontendError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        let bad = |key: &str, why: String| FrontendError::Config {
            path: path.to_path_buf(),
            key: key.to_string(),
            why,
        };
        for (key, v) in [
            ("hidden_size", raw.hidden_size),
            ("intermediate_size", raw.intermediate_size),
            ("num_attention_heads", raw.num_attention_heads),
            ("vocab_size", raw.vocab_size),
            ("max_position_embeddings", raw.max_position_embeddings),
        ] {
            if v == 0 {
                return Err(bad(key, "must be positive".to_string()));
            }
        }
        let heads = raw.num_attention_heads;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(bad(
                "num_key_value_heads",
                format!("{kv_heads} does not divide num_attention_heads {heads}"),
            ));
        }
        let head_dim = match raw.head_dim {
            Some(0) => return Err(bad("head_dim", "must be positive".to_string())),
            Some(d) => d,
            None if raw.hidden_size.is_multiple_of(heads) => raw.hidden_size / heads,
            None => {
                return Err(bad(
                    "head_dim",
                    format!(
                    "absent, and hidden_size {} is not a multiple of num_attention_heads {heads}",
                    raw.hidden_size
                ),
                ))
            }
        };
        let Some(eps) = raw.rms_norm_eps.or(raw.layer_norm_eps) else {
            return Err(bad(
                "rms_norm_eps",
                "missing field `rms_norm_eps` (an encoder's `layer_norm_eps` is absent too)"
                    .to_string(),
            ));
        };
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(bad(
                "rms_norm_eps",
                format!("{eps} is not a finite non-negative number"),
            ));
        }
        kernel_f32(eps).map_err(|why| bad("rms_norm_eps", why))?;
        let rope = parse_rope(&raw, path)?;
        Ok(HfConfig {
            path: path.to_path_buf(),
            architectures: raw.architectures.unwrap_or_default(),
            model_type: raw.model_type,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            explicit_head_dim: raw.head_dim,
            vocab_size: raw.vocab_size,
            rms_norm_eps: eps,
            max_position_embeddings: raw.max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings,
            hidden_act: raw.hidden_act.or(raw.hidden_activation),
            attention_bias: raw.attention_bias,
            mlp_bias: raw.mlp_bias,
            dtype: raw.dtype.or(raw.torch_dtype),
            rope_theta: match rope {
                RopeConfig::PerLayerType(_) => raw.rope_theta,
                RopeConfig::Uniform(_) => None,
            },
            rope,
            original_max_position_embeddings: raw.original_max_position_embeddings,
            sliding_window: raw.sliding_window,
            bos_token_id: raw.bos_token_id.and_then(|t| t.to_vec().first().copied()),
            eos_token_ids: raw.eos_token_id.map(|t| t.to_vec()).unwrap_or_default(),
            pad_token_id: raw.pad_token_id.and_then(|t| t.to_vec().first().copied()),
        })
    }

    /// `architectures[0]`, or an error naming the file when absent.
    pub fn architecture(&self) -> Result<&str> {
        self.architectures
            .first()
            .map(String::as_str)
            .ok_or_else(|| FrontendError::Config {
                path: self.path.clone(),
                key: "architectures".to_string(),
                why: "missing or empty: cannot tell which model class this is".to_string(),
            })
    }
}

/// Normalizes v5 `rope_parameters` and v4 `rope_theta` + `rope_scaling`.
fn parse_rope(raw: &RawConfig, path: &Path) -> Result<RopeConfig> {
    // Top-level keys fill in what the parameter object leaves out (v4 style,
    // and v5 configs that still carry `rope_theta` or `partial_rotary_factor`),
    // as transformers' `standardize_rope_params` does. Per-layer-type
    // parameters get no `rope_theta` here (see the module docs).
    let fill = |mut p: RopeParameters, nested: bool| {
        if p.rope_theta.is_none() && !nested {
            p.rope_theta = raw.rope_theta;
        }
        if p.partial_rotary_factor.is_none() {
            p.partial_rotary_factor = raw.partial_rotary_factor;
        }
        if matches!(p.rope_type.as_str(), "llama3" | "yarn" | "longrope") {
            // A top-level value wins over the parameter's own.
            p.original_max_position_embeddings = raw
                .original_max_position_embeddings
                .or(p.original_max_position_embeddings)
                .or(Some(raw.max_position_embeddings));
        }
        p
    };
    match &raw.rope_parameters {
        Some(Value::Object(m)) if !m.is_empty() && m.values().all(Value::is_object) => {
            let mut per = BTreeMap::new();
            for (layer_type, v) in m {
                let key = format!("rope_parameters.{layer_type}");
                per.insert(
                    layer_type.clone(),
                    fill(RopeParameters::from_value(v, path, &key)?, true),
                );
            }
            Ok(RopeConfig::PerLayerType(per))
        }
        Some(v @ Value::Object(_)) => Ok(RopeConfig::Uniform(fill(
            RopeParameters::from_value(v, path, "rope_parameters")?,
            false,
        ))),
        Some(Value::Null) | None => match &raw.rope_scaling {
            Some(v @ Value::Object(_)) => Ok(RopeConfig::Uniform(fill(
                RopeParameters::from_value(v, path, "rope_scaling")?,
                false,
            ))),
            Some(Value::Null) | None => {
                Ok(RopeConfig::Uniform(fill(RopeParameters::plain(), false)))
            }
            Some(other) => Err(FrontendError::Config {
                path: path.to_path_buf(),
                key: "rope_scaling".to_string(),
                why: format!("expected an object or null, found {other}"),
            }),
        },
        Some(other) => Err(FrontendError::Config {
            path: path.to_path_buf(),
            key: "rope_parameters".to_string(),
            why: format!("expected an object, found {other}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#""architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 512, "rms_norm_eps": 1e-6, "max_position_embeddings": 128"#;

    fn parse(extra: &str) -> Result<HfConfig> {
        let text = format!("{{{BASE}{extra}}}");
        HfConfig::from_json_str(&text, Path::new("config.json"))
    }

    fn uniform(c: &HfConfig) -> &RopeParameters {
        c.rope.uniform(Path::new("config.json")).unwrap()
    }

    #[test]
    fn defaults_are_derived() {
        let c = parse("").unwrap();
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.num_key_value_heads, 4);
        assert_eq!(uniform(&c), &RopeParameters::plain());
        assert!(c.eos_token_ids.is_empty());
    }

    #[test]
    fn v4_and_v5_rope_keys_agree() {
        let v5 = parse(
            r#", "dtype": "bfloat16", "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}"#,
        )
        .unwrap();
        let v4 = parse(
            r#", "torch_dtype": "bfloat16", "rope_theta": 500000.0, "rope_scaling": {"type": "llama3",
            "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
            "original_max_position_embeddings": 8192}"#,
        )
        .unwrap();
        assert_eq!(v4, v5);
        assert_eq!(uniform(&v4).factor, Some(8.0));
        assert_eq!(v4.dtype.as_deref(), Some("bfloat16"));
    }

    #[test]
    fn rope_type_wins_over_legacy_type() {
        let c =
            parse(r#", "rope_scaling": {"type": "linear", "rope_type": "dynamic", "factor": 2}"#)
                .unwrap();
        assert_eq!(uniform(&c).rope_type, "dynamic");
        assert!(uniform(&c).extra.is_empty());
    }

    #[test]
    fn null_rope_scaling_is_default() {
        let c = parse(r#", "rope_theta": 1e6, "rope_scaling": null"#).unwrap();
        assert_eq!(uniform(&c).rope_type, "default");
        assert_eq!(uniform(&c).rope_theta, Some(1e6));
    }

    #[test]
    fn per_layer_type_rope() {
        let c = parse(
            r#", "rope_parameters": {"full_attention": {"rope_theta": 1e6, "rope_type": "default"},
            "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}}"#,
        )
        .unwrap();
        let RopeConfig::PerLayerType(m) = &c.rope else {
            panic!("expected per-layer-type rope, got {:?}", c.rope)
        };
        assert_eq!(m["sliding_attention"].rope_theta, Some(1e4));
        let err = c.rope.uniform(Path::new("config.json")).unwrap_err();
        assert!(err.to_string().contains("per layer type"), "{err}");
    }

    #[test]
    fn original_context_is_filled_for_the_types_that_need_it() {
        // Absent: max_position_embeddings (128).
        let c = parse(r#", "rope_parameters": {"rope_type": "yarn", "factor": 4.0}"#).unwrap();
        assert_eq!(uniform(&c).original_max_position_embeddings, Some(128));
        // A top-level value wins over the parameter's own (Phi-3 style).
        let c = parse(
            r#", "original_max_position_embeddings": 32, "rope_scaling": {"type": "longrope",
            "original_max_position_embeddings": 64, "short_factor": [1], "long_factor": [2]}"#,
        )
        .unwrap();
        let p = uniform(&c);
        assert_eq!(p.original_max_position_embeddings, Some(32));
        assert_eq!(p.long_factor.as_deref(), Some(&[2.0][..]));
        assert_eq!(c.original_max_position_embeddings, Some(32));
        // Other types are left alone.
        let c = parse(r#", "rope_parameters": {"rope_type": "linear", "factor": 4.0}"#).unwrap();
        assert_eq!(uniform(&c).original_max_position_embeddings, None);
    }

    #[test]
    fn per_layer_type_rope_does_not_inherit_the_top_level_theta() {
        let c = parse(
            r#", "rope_theta": 5e5, "partial_rotary_factor": 0.5, "rope_parameters": {
            "full_attention": {"rope_type": "default"},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}"#,
        )
        .unwrap();
        let RopeConfig::PerLayerType(m) = &c.rope else {
            panic!("{:?}", c.rope)
        };
        assert_eq!(m["full_attention"].rope_theta, None);
        assert_eq!(m["full_attention"].partial_rotary_factor, Some(0.5));
        assert_eq!(c.rope_theta, Some(5e5));
        // Uniform parameters hold the top-level theta themselves.
        let c = parse(r#", "rope_theta": 5e5"#).unwrap();
        assert_eq!((uniform(&c).rope_theta, c.rope_theta), (Some(5e5), None));
    }

    #[test]
    fn eos_list() {
        let c = parse(r#", "eos_token_id": [2, 7], "bos_token_id": 1"#).unwrap();
        assert_eq!(c.eos_token_ids, vec![2, 7]);
        assert_eq!(c.bos_token_id, Some(1));
    }

    #[test]
    fn bad_values_are_named() {
        let cases = [
            (r#", "num_key_value_heads": 3"#, "num_key_value_heads"),
            (r#", "head_dim": 0"#, "head_dim"),
            (r#", "rope_scaling": 3"#, "rope_scaling"),
            (
                r#", "rope_parameters": {"rope_type": 5}"#,
                "rope_parameters",
            ),
        ];
        for (extra, key) in cases {
            let err = parse(extra).unwrap_err().to_string();
            assert!(err.contains(key), "{extra}: {err}");
        }
        let err = HfConfig::from_json_str("{}", Path::new("config.json"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("config.json") && err.contains("hidden_size"),
            "{err}"
        );
    }

    #[test]
    fn kernel_f32_refuses_values_that_overflow_or_vanish() {
        assert_eq!(kernel_f32(1e-6), Ok(1e-6));
        assert_eq!(kernel_f32(0.0), Ok(0.0));
        let e = kernel_f32(1e39).unwrap_err();
        assert!(e.starts_with("1e39 becomes inf in f32"), "{e}");
        assert!(kernel_f32(-1e39).is_err());
        let e = kernel_f32(1e-50).unwrap_err();
        assert!(e.contains("becomes 0 in f32"), "{e}");
        let text = format!("{{{}}}", BASE.replace("1e-6", "1e-50"));
        let err = HfConfig::from_json_str(&text, Path::new("config.json"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("config.json: `rms_norm_eps`: "), "{err}");
        assert!(err.contains("becomes 0 in f32"), "{err}");
    }
}
