//! The generation settings a checkpoint recommends: the sampling keys of
//! `generation_config.json`, read by [`crate::TextAssets`] and stored in the
//! plan by the compiler.
//!
//! Read with [`GenerationConfig::from_json`] on the parsed file. A key that
//! is absent or `null` stays `None` — not transformers' default for it
//! (`temperature` 1, `top_k` 50, ...): whoever generates decides what absent
//! means. A key that is present must have the right type and range, else the
//! error names the file and the key; transformers itself would only fail at
//! generation time. The surprise, kept from transformers: unless `do_sample`
//! is `true`, generation is greedy, whatever `temperature` says.

use crate::error::{FrontendError, Result};
use serde_json::Value;
use std::path::Path;

/// The sampling keys of `generation_config.json`, each `None` when absent.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    /// `do_sample`: sample (`true`) or decode greedily.
    pub do_sample: Option<bool>,
    /// `temperature`: finite, ≥ 0.
    pub temperature: Option<f32>,
    /// `top_k`: a non-negative integer (0 = all tokens).
    pub top_k: Option<u64>,
    /// `top_p`: in (0, 1].
    pub top_p: Option<f32>,
    /// `min_p`: in [0, 1].
    pub min_p: Option<f32>,
    /// `repetition_penalty`: finite, > 0 (1 = off).
    pub repetition_penalty: Option<f32>,
    /// `max_new_tokens`: a positive integer.
    pub max_new_tokens: Option<u64>,
    /// `max_length` (prompt and generation): a non-negative integer.
    pub max_length: Option<u64>,
}

/// The ranges a float key may take.
enum Range {
    /// ≥ 0.
    NonNegative,
    /// > 0.
    Positive,
    /// (0, 1].
    OpenUnit,
    /// [0, 1].
    Unit,
}

impl GenerationConfig {
    /// The keys of `gc`, the parsed `generation_config.json` at `path`
    /// (named in errors); `None` (no file) gives every key absent.
    pub fn from_json(gc: Option<&Value>, path: &Path) -> Result<GenerationConfig> {
        let get = |key: &str| gc.and_then(|v| v.get(key)).filter(|v| !v.is_null());
        let float = |key: &str, range: Range| -> Result<Option<f32>> {
            let Some(v) = get(key) else {
                return Ok(None);
            };
            let x = v
                .as_f64()
                .ok_or_else(|| err(path, key, format!("expected a number, found {v}")))?
                as f32;
            let (ok, want) = match range {
                Range::NonNegative => (x >= 0.0, "a finite number ≥ 0"),
                Range::Positive => (x > 0.0, "a finite number > 0"),
                Range::OpenUnit => (x > 0.0 && x <= 1.0, "a number in (0, 1]"),
                Range::Unit => ((0.0..=1.0).contains(&x), "a number in [0, 1]"),
            };
            if !x.is_finite() || !ok {
                return Err(err(path, key, format!("must be {want}, found {v}")));
            }
            Ok(Some(x))
        };
        let count = |key: &str, min: u64| -> Result<Option<u64>> {
            let Some(v) = get(key) else {
                return Ok(None);
            };
            match v.as_u64() {
                Some(n) if n >= min => Ok(Some(n)),
                _ => Err(err(
                    path,
                    key,
                    format!("must be an integer ≥ {min}, found {v}"),
                )),
            }
        };
        let do_sample = match get("do_sample") {
            None => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(v) => {
                return Err(err(
                    path,
                    "do_sample",
                    format!("expected true or false, found {v}"),
                ))
            }
        };
        Ok(GenerationConfig {
            do_sample,
            temperature: float("temperature", Range::NonNegative)?,
            top_k: count("top_k", 0)?,
            top_p: float("top_p", Range::OpenUnit)?,
            min_p: float("min_p", Range::Unit)?,
            repetition_penalty: float("repetition_penalty", Range::Positive)?,
            max_new_tokens: count("max_new_tokens", 1)?,
            max_length: count("max_length", 0)?,
        })
    }
}

fn err(path: &Path, key: &str, why: String) -> FrontendError {
    FrontendError::Config {
        path: path.to_path_buf(),
        key: key.to_string(),
        why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: Value) -> Result<GenerationConfig> {
        GenerationConfig::from_json(Some(&v), Path::new("/m/generation_config.json"))
    }

    #[test]
    fn every_key_is_read_and_absent_or_null_keys_stay_absent() {
        let all = json!({
            "do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.9,
            "min_p": 0.05, "repetition_penalty": 1.1, "max_new_tokens": 256,
            "max_length": 4096, "eos_token_id": [1, 2]
        });
        assert_eq!(
            read(all).unwrap(),
            GenerationConfig {
                do_sample: Some(true),
                temperature: Some(0.6),
                top_k: Some(20),
                top_p: Some(0.9),
                min_p: Some(0.05),
                repetition_penalty: Some(1.1),
                max_new_tokens: Some(256),
                max_length: Some(4096),
            }
        );
        let some = json!({"temperature": 0.7, "top_p": null, "eos_token_id": 2});
        assert_eq!(
            read(some).unwrap(),
            GenerationConfig {
                temperature: Some(0.7),
                ..GenerationConfig::default()
            }
        );
        let none = GenerationConfig::from_json(None, Path::new("x")).unwrap();
        assert_eq!(none, GenerationConfig::default());
    }

    #[test]
    fn bad_values_name_the_file_and_the_key() {
        for (v, key) in [
            (json!({"temperature": -1.0}), "temperature"),
            (json!({"temperature": "NaN"}), "temperature"),
            (json!({"temperature": 1e300}), "temperature"),
            (json!({"top_p": 0.0}), "top_p"),
            (json!({"top_p": 1.5}), "top_p"),
            (json!({"min_p": -0.1}), "min_p"),
            (json!({"top_k": -1}), "top_k"),
            (json!({"top_k": 2.5}), "top_k"),
            (json!({"repetition_penalty": 0.0}), "repetition_penalty"),
            (json!({"max_new_tokens": 0}), "max_new_tokens"),
            (json!({"max_length": "long"}), "max_length"),
            (json!({"do_sample": "yes"}), "do_sample"),
        ] {
            let e = read(v.clone()).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("/m/generation_config.json: `{key}`: ")),
                "{v}: {e}"
            );
        }
        let e = read(json!({"temperature": -1})).unwrap_err().to_string();
        assert_eq!(
            e,
            "/m/generation_config.json: `temperature`: must be a finite number ≥ 0, found -1"
        );
    }
}
