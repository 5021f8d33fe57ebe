//! Text assets of a checkpoint: tokenizer, chat template, special tokens.
//!
//! This is gerbil's only reader of these files: the compiler stores what it
//! finds in the plan, and the runtime builds its tokenizer from the plan alone.
//! Everything here is optional (tiny test models have no tokenizer), but a
//! file that exists and is malformed is an error naming the file and the key,
//! not a silent `None`.
//! Sources, in the order transformers uses them:
//!
//! - `tokenizer.json`: kept as raw bytes for the runtime's tokenizer;
//! - chat template: a `chat_template.jinja` file, else `tokenizer_config.json`
//!   key `chat_template` (a string, or a list of `{name, template}` from which
//!   `default` is taken; a list without `default` means no chat template, and
//!   an entry that is not such an object is an error). transformers lets the
//!   `.jinja` file override the key when both exist, and so do we;
//! - `bos_token` / `eos_token` from `tokenizer_config.json` (a string or an
//!   `AddedToken` object with `content`);
//! - end-of-sequence ids from `generation_config.json` `eos_token_id` (an int
//!   or a list), else from `config.json`;
//! - the recommended sampling settings of `generation_config.json`
//!   ([`GenerationConfig`]).

use crate::error::{FrontendError, Result};
use crate::generation::GenerationConfig;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The tokenizer file.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The tokenizer configuration file.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// The standalone chat template file.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
/// The generation defaults file.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// Tokenizer and chat assets captured from a checkpoint directory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TextAssets {
    /// Raw bytes of `tokenizer.json`, if present.
    pub tokenizer_json: Option<Vec<u8>>,
    /// The Jinja chat template, if any.
    pub chat_template: Option<String>,
    /// Beginning-of-sequence token text.
    pub bos_token: Option<String>,
    /// End-of-sequence token text.
    pub eos_token: Option<String>,
    /// Ids that end generation (generation_config.json, else config.json).
    pub eos_token_ids: Vec<u32>,
    /// Sampling settings from generation_config.json.
    pub generation: GenerationConfig,
}

/// Reads a file if it exists; `Ok(None)` when it does not.
fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match crate::checkpoint::check_regular(path).and_then(|()| {
        std::fs::read(path).map_err(|source| FrontendError::Io {
            path: path.to_path_buf(),
            source,
        })
    }) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(FrontendError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Reads and parses a JSON file if it exists.
fn read_optional_json(path: &Path) -> Result<Option<Value>> {
    let Some(bytes) = read_optional(path)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| FrontendError::Json {
            path: path.to_path_buf(),
            source,
        })
}

fn config_err(path: &Path, key: &str, why: String) -> FrontendError {
    FrontendError::Config {
        path: path.to_path_buf(),
        key: key.to_string(),
        why,
    }
}

/// A special token: a string, `{"content": ...}` or null.
fn token_text(v: Option<&Value>, path: &Path, key: &str) -> Result<Option<String>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(config_err(
                path,
                key,
                "token object has no string `content`".to_string(),
            )),
        },
        Some(other) => Err(config_err(
            path,
            key,
            format!("expected a string or a token object, found {other}"),
        )),
    }
}

/// `eos_token_id`: an int, a list of ints, or null.
fn token_ids(v: Option<&Value>, path: &Path, key: &str) -> Result<Option<Vec<u32>>> {
    let one = |v: &Value| {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| config_err(path, key, format!("{v} is not a token id")))
    };
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items.iter().map(one).collect::<Result<_>>().map(Some),
        Some(v) => one(v).map(|id| Some(vec![id])),
    }
}

/// `chat_template` in tokenizer_config.json: a string, or a list of
/// `{name, template}` of which `default` is taken. As in transformers (which
/// turns the list into a dict), every entry must be well-formed and the last
/// `default` wins.
fn chat_template_key(v: Option<&Value>, path: &Path) -> Result<Option<String>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(items)) => {
            let mut default = None;
            for (i, item) in items.iter().enumerate() {
                let name = item.get("name").and_then(Value::as_str);
                let template = item.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some("default"), Some(t)) => default = Some(t.to_string()),
                    (Some(_), Some(_)) => {}
                    _ => {
                        return Err(config_err(
                            path,
                            &format!("chat_template[{i}]"),
                            format!(
                                "expected an object {{\"name\": string, \"template\": string}}, \
                                 found {item}"
                            ),
                        ))
                    }
                }
            }
            Ok(default)
        }
        Some(other) => Err(config_err(
            path,
            "chat_template",
            format!("expected a string or a list of named templates, found {other}"),
        )),
    }
}

impl TextAssets {
    /// Reads the text assets of `dir`, falling back to `config.json` (if any)
    /// for end-of-sequence ids.
    pub fn load(dir: &Path) -> Result<Self> {
        let config = read_optional_json(&dir.join(crate::checkpoint::CONFIG_FILE))?;
        Self::load_with_config(dir, config.as_ref())
    }

    /// Reads the text assets of `dir`; `config` is the already-parsed
    /// `config.json`, used as the fallback for `eos_token_id`.
    pub fn load_with_config(dir: &Path, config: Option<&Value>) -> Result<Self> {
        let tokenizer_json = read_optional(&dir.join(TOKENIZER_FILE))?;

        let tc_path: PathBuf = dir.join(TOKENIZER_CONFIG_FILE);
        let tc = read_optional_json(&tc_path)?;
        let tc_get = |k: &str| tc.as_ref().and_then(|v| v.get(k));

        let jinja_path = dir.join(CHAT_TEMPLATE_FILE);
        let chat_template = match read_optional(&jinja_path)? {
            Some(bytes) => Some(String::from_utf8(bytes).map_err(|e| {
                config_err(&jinja_path, "chat template", format!("not UTF-8: {e}"))
            })?),
            None => chat_template_key(tc_get("chat_template"), &tc_path)?,
        };
        let bos_token = token_text(tc_get("bos_token"), &tc_path, "bos_token")?;
        let eos_token = token_text(tc_get("eos_token"), &tc_path, "eos_token")?;

        let gc_path = dir.join(GENERATION_CONFIG_FILE);
        let gc = read_optional_json(&gc_path)?;
        let from_gc = token_ids(
            gc.as_ref().and_then(|v| v.get("eos_token_id")),
            &gc_path,
            "eos_token_id",
        )?;
        let eos_token_ids = match from_gc {
            Some(ids) => ids,
            None => token_ids(
                config.and_then(|v| v.get("eos_token_id")),
                &dir.join(crate::checkpoint::CONFIG_FILE),
                "eos_token_id",
            )?
            .unwrap_or_default(),
        };
        let generation = GenerationConfig::from_json(gc.as_ref(), &gc_path)?;

        Ok(TextAssets {
            tokenizer_json,
            chat_template,
            bos_token,
            eos_token,
            eos_token_ids,
            generation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const P: &str = "tokenizer_config.json";

    #[test]
    fn token_forms() {
        let p = Path::new(P);
        assert_eq!(
            token_text(Some(&json!("<s>")), p, "bos_token").unwrap(),
            Some("<s>".into())
        );
        assert_eq!(
            token_text(
                Some(&json!({"content": "</s>", "lstrip": false})),
                p,
                "eos_token"
            )
            .unwrap(),
            Some("</s>".into())
        );
        assert_eq!(
            token_text(Some(&Value::Null), p, "bos_token").unwrap(),
            None
        );
        assert!(token_text(Some(&json!(3)), p, "bos_token").is_err());
    }

    #[test]
    fn id_forms() {
        let p = Path::new("generation_config.json");
        assert_eq!(
            token_ids(Some(&json!(2)), p, "eos_token_id").unwrap(),
            Some(vec![2])
        );
        assert_eq!(
            token_ids(Some(&json!([1, 106])), p, "eos_token_id").unwrap(),
            Some(vec![1, 106])
        );
        let err = token_ids(Some(&json!(-1)), p, "eos_token_id").unwrap_err();
        assert!(err.to_string().contains("eos_token_id"), "{err}");
    }

    #[test]
    fn chat_template_forms() {
        let p = Path::new(P);
        let list = json!([
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "D"}
        ]);
        assert_eq!(chat_template_key(Some(&list), p).unwrap(), Some("D".into()));
        assert_eq!(
            chat_template_key(Some(&json!("S")), p).unwrap(),
            Some("S".into())
        );
        assert!(chat_template_key(Some(&json!([1])), p).is_err());
        let twice = json!([
            {"name": "default", "template": "first"},
            {"name": "default", "template": "last"}
        ]);
        assert_eq!(
            chat_template_key(Some(&twice), p).unwrap(),
            Some("last".into())
        );
        let no_default = json!([{"name": "tool_use", "template": "T"}]);
        assert_eq!(chat_template_key(Some(&no_default), p).unwrap(), None);
    }

    #[test]
    fn a_malformed_chat_template_list_names_the_file_and_the_entry() {
        let p = Path::new("/m/tokenizer_config.json");
        let err = chat_template_key(Some(&json!([1])), p).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/m/tokenizer_config.json: `chat_template[0]`: expected an object \
             {\"name\": string, \"template\": string}, found 1"
        );
        // An entry after `default` is checked too, and a template must be a string.
        let list = json!([
            {"name": "default", "template": "D"},
            {"name": "rag", "template": ["not", "a", "string"]}
        ]);
        let err = chat_template_key(Some(&list), p).unwrap_err().to_string();
        assert!(err.contains("`chat_template[1]`"), "{err}");
        assert!(err.contains(r#"["not","a","string"]"#), "{err}");
        let err = chat_template_key(Some(&json!([{"template": "T"}])), p).unwrap_err();
        assert!(err.to_string().contains("`chat_template[0]`"), "{err}");
    }
}
