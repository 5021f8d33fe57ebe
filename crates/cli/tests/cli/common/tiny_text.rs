//! The tiny Llama as a model with text: a byte-level BPE tokenizer of
//! exactly its 512 ids and a ChatML template, written by the tests. Tests of
//! the text paths (prompts, chat, stop strings, standard input, the server)
//! run on it in milliseconds a token, where SmolLM2 takes a second or more
//! on lavapipe; the SmolLM2 tests keep to what only a real tokenizer and
//! real weights prove (the reference continuations).

use super::{compile_to, data};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// GPT-2's byte-to-character map of byte-level tokenizers.
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap()
            }
        })
        .collect()
}

/// A byte-level BPE `tokenizer.json` of exactly 512 ids for the tiny Llama:
/// three special tokens (`<|im_end|>` is id 2, its end-of-sequence), the
/// 256 bytes, and merges of letter pairs for the rest.
fn tiny_tokenizer() -> Value {
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let mut vocab = serde_json::Map::new();
    for (i, s) in specials.iter().enumerate() {
        vocab.insert(s.to_string(), json!(i));
    }
    for (b, c) in byte_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(specials.len() + b));
    }
    let letters: Vec<String> = "Ġetaoinshrdlcumwfgypbvk"
        .chars()
        .map(String::from)
        .collect();
    let mut merges = Vec::new();
    'pairs: for a in &letters {
        for b in &letters {
            if vocab.len() == 512 {
                break 'pairs;
            }
            let merged = format!("{a}{b}");
            if !vocab.contains_key(&merged) {
                vocab.insert(merged, json!(vocab.len()));
                merges.push(json!([a, b]));
            }
        }
    }
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": i, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": merges},
    })
}

/// The tiny Llama with [`tiny_tokenizer`] and a ChatML template, compiled
/// into `dir` with `extra` flags.
pub fn tiny_text_plan(dir: &Path, extra: &[&str]) -> PathBuf {
    tiny_text_plan_of("llama", dir, extra)
}

/// [`tiny_text_plan`] of the tiny model of `family` (`tests/data/models/tiny/FAMILY`; each has
/// the 512 ids of [`tiny_tokenizer`]).
pub fn tiny_text_plan_of(family: &str, dir: &Path, extra: &[&str]) -> PathBuf {
    // The Llama's names (`tiny-text`, `tiny.plan`) are what other tests see as model names.
    let named = |llama: &str, other: String| {
        if family == "llama" {
            llama.to_string()
        } else {
            other
        }
    };
    let model = tiny_text_model(
        family,
        &dir.join(named("tiny-text", format!("tiny-text-{family}"))),
    );
    let plan = dir.join(named("tiny.plan", format!("tiny-{family}.plan")));
    compile_to(&model, &plan, extra);
    plan
}

/// The checkpoint directory of [`tiny_text_plan_of`]: the tiny model of
/// `family` with [`tiny_tokenizer`] and a ChatML template, written to
/// `model`.
pub fn tiny_text_model(family: &str, model: &Path) -> PathBuf {
    let model = model.to_path_buf();
    std::fs::create_dir_all(&model).unwrap();
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(
            data(&format!("models/tiny/{family}")).join(f),
            model.join(f),
        )
        .unwrap();
    }
    std::fs::write(model.join("tokenizer.json"), tiny_tokenizer().to_string()).unwrap();
    let template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let config = json!({"chat_template": template, "eos_token": "<|im_end|>"});
    std::fs::write(model.join("tokenizer_config.json"), config.to_string()).unwrap();
    model
}
