//! A `tokenizer.json` written from GGUF tokenizer metadata, as transformers
//! builds one when it loads a GGUF.
//!
//! `tokenizer.ggml.model` says which kind: `gpt2` is byte-level BPE (the
//! vocabulary, respelled into the byte alphabet where a converter left raw
//! text, and the file's merges; `tokenizer.ggml.pre` picks the split regex
//! of Llama 3, Qwen 2 or GPT-4o vocabularies), `llama` is SentencePiece BPE
//! with byte fallback, whose merges the file does not list: they are rebuilt
//! from the vocabulary, every split of a token into two tokens, best score
//! first. Gemma's scores do not follow its merge order, so there the
//! position in the file is the score, and its whitespace-only tokens are
//! respelled with `▁`. Tokens typed control (3) become special added tokens,
//! user-defined ones (4) plain added tokens; `add_bos_token` (on by default
//! for SentencePiece) puts BOS in front through the post-processor. Each
//! step follows transformers 5's `gguf_tokenizer_mapping.py`, so the result
//! tokenizes exactly like the `tokenizer.json` transformers writes.

use gerbil_gguf::{GgufError, GgufFile, Value as GgufValue};
use serde_json::{json, Map, Value};
use std::collections::{HashMap, HashSet};

/// Control tokens (`tokenizer.ggml.token_type`).
const CONTROL: i64 = 3;
/// User-defined tokens.
const USER_DEFINED: i64 = 4;

/// Split regexes of byte-level vocabularies, by `tokenizer.ggml.pre`.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn split_regex(pre: &str) -> Option<&'static str> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "smaug-bpe" | "dbrx" => LLAMA3_SPLIT,
        "qwen2" | "deepseek-r1-qwen" | "megrez" => QWEN2_SPLIT,
        "gpt-4o" | "llama4" => GPT4O_SPLIT,
        _ => return None,
    })
}

/// The tokenizer metadata of one file.
struct Vocab<'a> {
    tokens: Vec<&'a str>,
    types: Vec<i64>,
    scores: Vec<f64>,
}

/// `tokenizer.json` for `g` (architecture `arch`), or `None` when the file
/// carries no tokenizer.
pub fn tokenizer_json(g: &GgufFile, arch: &str) -> Result<Option<Value>, GgufError> {
    let Some(model) = g.str("tokenizer.ggml.model")? else {
        return Ok(None);
    };
    let vocab = read_vocab(g)?;
    let add_bos = g.bool("tokenizer.ggml.add_bos_token")?;
    let add_eos = g.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let mut tok = match model {
        "gpt2" => byte_level(g, &vocab)?,
        "llama" => sentencepiece(g, &vocab, arch)?,
        other => {
            return Err(g.key_error(
                "tokenizer.ggml.model",
                format!("tokenizer `{other}` is not supported (gpt2 and llama are)"),
            ))
        }
    };
    let byte_level = model == "gpt2";
    tok["added_tokens"] = added_tokens(&vocab, &tok["model"]["vocab"], byte_level);
    let token_text = |key: &str| -> Result<Option<String>, GgufError> {
        Ok(g.u64(key)?
            .and_then(|id| vocab.tokens.get(id as usize))
            .map(|t| t.to_string()))
    };
    let bos = token_text("tokenizer.ggml.bos_token_id")?;
    let eos = token_text("tokenizer.ggml.eos_token_id")?;
    let add_bos = add_bos.unwrap_or(!byte_level);
    tok["post_processor"] = post_processor(
        add_bos.then_some(()).and(bos.as_deref()),
        add_eos.then_some(()).and(eos.as_deref()),
        &tok["model"]["vocab"],
    );
    Ok(Some(tok))
}

fn read_vocab(g: &GgufFile) -> Result<Vocab<'_>, GgufError> {
    let key = "tokenizer.ggml.tokens";
    let tokens = g
        .require(key, GgufFile::array)?
        .iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| g.key_error(key, "expected strings"))
        })
        .collect::<Result<Vec<&str>, _>>()?;
    let numbers = |key: &str, get: fn(&GgufValue) -> Option<f64>| -> Result<Vec<f64>, GgufError> {
        let Some(items) = g.array(key)? else {
            return Ok(Vec::new());
        };
        if items.len() != tokens.len() {
            return Err(g.key_error(
                key,
                format!("{} entries for {} tokens", items.len(), tokens.len()),
            ));
        }
        items
            .iter()
            .map(|v| {
                get(v).ok_or_else(|| {
                    g.key_error(key, format!("expected numbers, found {}", v.kind()))
                })
            })
            .collect()
    };
    let types = numbers("tokenizer.ggml.token_type", |v| {
        v.as_i64().map(|i| i as f64)
    })?;
    Ok(Vocab {
        types: types.into_iter().map(|t| t as i64).collect(),
        scores: numbers("tokenizer.ggml.scores", GgufValue::as_f64)?,
        tokens,
    })
}

/// GPT-2's table from bytes to the printable characters byte-level
/// vocabularies spell them with.
fn bytes_to_unicode() -> [char; 256] {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        table[b as usize] = if printable(b) {
            char::from_u32(b).unwrap_or('\0')
        } else {
            let c = char::from_u32(next).unwrap_or('\0');
            next += 1;
            c
        };
    }
    table
}

/// A JSON object from `(key, value)` pairs as Python builds a dict: a
/// repeated key keeps its first position and takes the last value.
fn dict(pairs: impl Iterator<Item = (String, Value)>) -> Map<String, Value> {
    let mut m = Map::new();
    for (k, v) in pairs {
        m.insert(k, v);
    }
    m
}

/// Whether every character of `t` is in the byte-level alphabet `alphabet`.
fn in_alphabet(alphabet: &HashSet<char>, t: &str) -> bool {
    t.chars().all(|c| alphabet.contains(&c))
}

fn byte_level(g: &GgufFile, vocab: &Vocab) -> Result<Value, GgufError> {
    let table = bytes_to_unicode();
    let alphabet: HashSet<char> = table.into_iter().collect();
    let spelled = vocab.tokens.iter().enumerate().map(|(i, t)| {
        let t = if in_alphabet(&alphabet, t) {
            t.to_string()
        } else {
            t.bytes().map(|b| table[b as usize]).collect()
        };
        (t, json!(i))
    });
    let key = "tokenizer.ggml.merges";
    let merges = g
        .require(key, GgufFile::array)?
        .iter()
        .map(|m| {
            let m = m
                .as_str()
                .ok_or_else(|| g.key_error(key, "expected strings"))?;
            let (a, b) = m
                .split_once(' ')
                .ok_or_else(|| g.key_error(key, format!("merge {m:?} is not two tokens")))?;
            Ok(json!([a, b]))
        })
        .collect::<Result<Vec<Value>, GgufError>>()?;
    let pre = g.str("tokenizer.ggml.pre")?.unwrap_or("default");
    let pre_tokenizer = match split_regex(pre) {
        Some(re) => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        ]}),
        None => {
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
        }
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": "", "end_of_word_suffix": "",
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": Value::Object(dict(spelled)),
            "merges": merges,
        },
    }))
}

/// Whether Python's `str.strip()` would remove `c`.
fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Longest token a SentencePiece vocabulary may hold: rebuilding merges
/// looks up every split of every token, so the work grows with the square
/// of the length (real vocabularies stay under a few dozen bytes).
const MAX_TOKEN_BYTES: usize = 4096;

fn sentencepiece(g: &GgufFile, vocab: &Vocab, arch: &str) -> Result<Value, GgufError> {
    if let Some((i, t)) = vocab
        .tokens
        .iter()
        .enumerate()
        .find(|(_, t)| t.len() > MAX_TOKEN_BYTES)
    {
        return Err(g.key_error(
            "tokenizer.ggml.tokens",
            format!(
                "token {i} is {} bytes long; gerbil reads tokens of up to {MAX_TOKEN_BYTES}",
                t.len()
            ),
        ));
    }
    let gemma = arch.starts_with("gemma");
    let tokens: Vec<String> = vocab
        .tokens
        .iter()
        .map(|t| {
            if gemma && t.contains(' ') && t.chars().all(python_space) {
                "\u{2581}".repeat(t.chars().count())
            } else {
                t.to_string()
            }
        })
        .collect();
    let index: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    // Scores in dict order: each token's first position, its last score.
    let mut order: Vec<&str> = Vec::new();
    let mut score: HashMap<&str, f64> = HashMap::new();
    for (i, t) in tokens.iter().enumerate() {
        let s = if gemma {
            -(i as f64)
        } else {
            vocab.scores.get(i).copied().unwrap_or(0.0)
        };
        if score.insert(t, s).is_none() {
            order.push(t);
        }
    }
    let merges = generate_merges(&order, &score, &index);
    let vocab_json = dict(
        tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), json!(i))),
    );
    let model = json!({
        "type": "BPE", "dropout": null,
        "unk_token": if gemma { json!("<unk>") } else { Value::Null },
        "continuing_subword_prefix": null, "end_of_word_suffix": null,
        "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
        "vocab": Value::Object(vocab_json),
        "merges": merges.into_iter().map(|(a, b)| json!([a, b])).collect::<Vec<_>>(),
    });
    let replace = |from: &str, to: &str| json!({"type": "Replace", "pattern": {"String": from}, "content": to});
    let mut decoders = vec![
        replace("\u{2581}", " "),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    let (normalizer, pre_tokenizer) = if gemma {
        (
            replace(" ", "\u{2581}"),
            json!({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false}),
        )
    } else {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        if arch == "phi3" {
            (
                json!({"type": "Sequence", "normalizers": [
                    {"type": "Prepend", "prepend": "\u{2581}"}, replace(" ", "\u{2581}"),
                ]}),
                Value::Null,
            )
        } else {
            (
                Value::Null,
                json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "first", "split": false}),
            )
        }
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": model,
    }))
}

/// transformers' `generate_merges` with scores: for each token in `order`,
/// every split into two vocabulary tokens (sorted by their ids), then all
/// of them by (score, left length, right length) descending, ties kept in
/// that order.
fn generate_merges<'a>(
    order: &[&'a str],
    score: &HashMap<&str, f64>,
    index: &HashMap<&str, usize>,
) -> Vec<(&'a str, &'a str)> {
    let mut merges: Vec<(&str, &str, f64)> = Vec::new();
    for &merge in order {
        let s = score[merge];
        let start = merges.len();
        for (at, _) in merge.char_indices().skip(1) {
            let (l, r) = merge.split_at(at);
            if index.contains_key(l) && index.contains_key(r) {
                merges.push((l, r, s));
            }
        }
        merges[start..].sort_by_key(|m| (index[m.0], index[m.1]));
    }
    let len = |t: &str| t.chars().count();
    merges.sort_by(|a, b| {
        (b.2, len(b.0), len(b.1))
            .partial_cmp(&(a.2, len(a.0), len(a.1)))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    merges.into_iter().map(|(l, r, _)| (l, r)).collect()
}

/// Control tokens as special added tokens (in a byte-level vocabulary only
/// those spelled in its alphabet), then user-defined tokens found in the
/// vocabulary as plain ones, in id order.
fn added_tokens(vocab: &Vocab, model_vocab: &Value, byte_level: bool) -> Value {
    let alphabet: HashSet<char> = bytes_to_unicode().into_iter().collect();
    let mut added = Vec::new();
    for (i, (t, &ty)) in vocab.tokens.iter().zip(&vocab.types).enumerate() {
        let special = match ty {
            CONTROL if !byte_level || in_alphabet(&alphabet, t) => true,
            USER_DEFINED if model_vocab.get(*t).is_some() => false,
            _ => continue,
        };
        let id = model_vocab
            .get(*t)
            .and_then(Value::as_u64)
            .unwrap_or(i as u64);
        added.push((id, t, special));
    }
    added.sort_by_key(|a| a.0);
    let added: Vec<Value> = added
        .into_iter()
        .map(|(id, t, special)| {
            json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": special})
        })
        .collect();
    Value::Array(added)
}

/// The template that adds `bos` in front of (and `eos` after) every sequence.
fn post_processor(bos: Option<&str>, eos: Option<&str>, vocab: &Value) -> Value {
    let special = |t: &str, type_id: u32| json!({"SpecialToken": {"id": t, "type_id": type_id}});
    let seq = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = Map::new();
    for (part, type_id) in [("A", 0), ("B", 1)] {
        let list = if part == "A" { &mut single } else { &mut pair };
        if let Some(b) = bos {
            list.push(special(b, type_id));
        }
        list.push(seq(part, type_id));
        if let Some(e) = eos {
            list.push(special(e, type_id));
        }
    }
    let pair: Vec<Value> = single.iter().cloned().chain(pair).collect();
    for t in bos.into_iter().chain(eos) {
        let id = vocab.get(t).cloned().unwrap_or(Value::Null);
        specials.insert(t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
}
