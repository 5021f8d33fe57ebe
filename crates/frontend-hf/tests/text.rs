//! Text assets: tokenizer bytes, chat template, special tokens, EOS ids.

mod common;

use common::*;
use gerbil_frontend_hf::{Checkpoint, TextAssets};
use serde_json::json;

#[test]
fn smollm2_assets() {
    let dir = model("smollm2-135m");
    let text = TextAssets::load(&dir).unwrap();
    let tokenizer = text.tokenizer_json.as_deref().unwrap();
    assert_eq!(
        tokenizer,
        std::fs::read(dir.join("tokenizer.json")).unwrap()
    );
    let template = text.chat_template.as_deref().unwrap();
    assert!(
        template.starts_with("{% for message in messages %}"),
        "{template}"
    );
    assert!(template.contains("<|im_start|>assistant"));
    assert_eq!(text.bos_token.as_deref(), Some("<|im_start|>"));
    assert_eq!(text.eos_token.as_deref(), Some("<|im_end|>"));
    assert_eq!(text.eos_token_ids, vec![2]);

    // The same through a checkpoint (which opens without weights).
    let ckpt = Checkpoint::open(&dir).unwrap();
    assert!(!ckpt.has_weights);
    assert_eq!(ckpt.text, text);
    assert_eq!(ckpt.config.num_hidden_layers, 30);
    assert_eq!(ckpt.config.head_dim, 64);
}

#[test]
fn tiny_models_have_no_tokenizer() {
    let text = TextAssets::load(&model("tiny/llama")).unwrap();
    assert_eq!(
        text,
        TextAssets {
            eos_token_ids: vec![2],
            ..TextAssets::default()
        }
    );
}

#[test]
fn tokenizer_config_forms() {
    let tmp = TempDir::new("tokcfg");
    let dir = tmp.path();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({
            "bos_token": {"content": "<s>", "lstrip": false, "__type": "AddedToken"},
            "eos_token": "</s>",
            "chat_template": [
                {"name": "tool_use", "template": "TOOLS"},
                {"name": "default", "template": "DEFAULT"}
            ]
        })
        .to_string(),
    )
    .unwrap();
    // generation_config's list wins over config.json's single id.
    std::fs::write(
        dir.join("config.json"),
        json!({"eos_token_id": 2}).to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        json!({"eos_token_id": [2, 32007]}).to_string(),
    )
    .unwrap();
    let text = TextAssets::load(dir).unwrap();
    assert_eq!(text.bos_token.as_deref(), Some("<s>"));
    assert_eq!(text.eos_token.as_deref(), Some("</s>"));
    assert_eq!(text.chat_template.as_deref(), Some("DEFAULT"));
    assert_eq!(text.eos_token_ids, vec![2, 32007]);

    // Without generation_config.json, config.json's id is the fallback.
    std::fs::remove_file(dir.join("generation_config.json")).unwrap();
    assert_eq!(TextAssets::load(dir).unwrap().eos_token_ids, vec![2]);

    // A chat_template.jinja file overrides the key, as in transformers.
    std::fs::write(dir.join("chat_template.jinja"), "FROM FILE").unwrap();
    assert_eq!(
        TextAssets::load(dir).unwrap().chat_template.as_deref(),
        Some("FROM FILE")
    );
}

#[test]
fn string_chat_template_key() {
    let tmp = TempDir::new("tokstr");
    std::fs::write(
        tmp.path().join("tokenizer_config.json"),
        json!({"chat_template": "{{ messages }}", "eos_token": null}).to_string(),
    )
    .unwrap();
    let text = TextAssets::load(tmp.path()).unwrap();
    assert_eq!(text.chat_template.as_deref(), Some("{{ messages }}"));
    assert_eq!(text.eos_token, None);
    assert!(text.eos_token_ids.is_empty());
}

#[test]
fn a_malformed_chat_template_list_is_an_error_naming_file_and_entry() {
    let tmp = TempDir::new("tokbad");
    let path = tmp.path().join("tokenizer_config.json");
    std::fs::write(
        &path,
        json!({"chat_template": [
            {"name": "default", "template": "D"},
            {"name": "tool_use"}
        ]})
        .to_string(),
    )
    .unwrap();
    let err = TextAssets::load(tmp.path()).unwrap_err().to_string();
    assert!(err.starts_with(&path.display().to_string()), "{err}");
    assert!(err.contains("`chat_template[1]`"), "{err}");
    assert!(err.contains(r#"{"name":"tool_use"}"#), "{err}");

    // A chat_template.jinja file replaces the key, so the list is not read at all.
    std::fs::write(tmp.path().join("chat_template.jinja"), "FROM FILE").unwrap();
    let text = TextAssets::load(tmp.path()).unwrap();
    assert_eq!(text.chat_template.as_deref(), Some("FROM FILE"));
}

#[test]
fn generation_config_sampling_keys() {
    let tmp = TempDir::new("gencfg");
    let dir = tmp.path();
    let gc = dir.join("generation_config.json");
    std::fs::write(
        &gc,
        json!({"do_sample": true, "temperature": 0.6, "top_p": 0.9, "eos_token_id": 2}).to_string(),
    )
    .unwrap();
    let g = TextAssets::load(dir).unwrap().generation;
    assert_eq!(
        (
            g.do_sample,
            g.temperature,
            g.top_p,
            g.top_k,
            g.max_new_tokens
        ),
        (Some(true), Some(0.6), Some(0.9), None, None)
    );
    std::fs::write(&gc, r#"{"temperature": "NaN"}"#).unwrap();
    let e = TextAssets::load(dir).unwrap_err().to_string();
    assert!(e.contains("generation_config.json: `temperature`"), "{e}");
}
