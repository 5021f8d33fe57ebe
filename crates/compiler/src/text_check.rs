//! `gerbilc compile`'s check of the checkpoint's text assets: the tokenizer
//! parses, and the chat template parses and renders a sample conversation,
//! so a broken one fails the compile instead of every later run.
//!
//! Call [`check_text_assets`] with what the frontend read. It builds the
//! runtime's own [`TextCodec`] (`gerbil-text`) — the same tokenizer library,
//! the same template environment and limits that `gerbil-run` uses, without
//! the GPU half. The surprise: a template may reject a system message on
//! purpose (`raise_exception`, Gemma 2 style); then the sample is tried
//! again without one, and only a template that rejects both fails.

use gerbil_frontend_hf::Checkpoint;
use gerbil_text::{ChatMessage, TemplateSandbox, TextCodec, TextError};

/// A checkpoint's tokenizer or chat template that every run of its plan would fail on: what
/// failed, and how to fix it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TextAssetError(String);

type Result<T> = std::result::Result<T, TextAssetError>;

/// A [`TextAssetError`] with a formatted message.
macro_rules! fail {
    ($($arg:tt)*) => {
        TextAssetError(format!($($arg)*))
    };
}

/// Fails when the checkpoint's `tokenizer.json` does not load or its chat
/// template does not parse, render (in `sandbox`, when given) or tokenize a
/// sample conversation.
pub fn check_text_assets(ckpt: &Checkpoint, sandbox: Option<TemplateSandbox>) -> Result<()> {
    let start = std::time::Instant::now();
    check(ckpt, sandbox)?;
    tracing::info!(
        ms = start.elapsed().as_millis() as u64,
        "checked the tokenizer and chat template"
    );
    Ok(())
}

fn check(ckpt: &Checkpoint, sandbox: Option<TemplateSandbox>) -> Result<()> {
    let text = &ckpt.text;
    let Some(json) = &text.tokenizer_json else {
        return Ok(());
    };
    let fix = "fix or remove it in the checkpoint directory (a plan without a tokenizer runs on token ids)";
    let codec = TextCodec::from_tokenizer_json(json)
        .map_err(|e| fail!("tokenizer.json: {e}; {fix}"))?
        .with_special_tokens(text.bos_token.clone(), text.eos_token.clone());
    let Some(template) = &text.chat_template else {
        return Ok(());
    };
    let fix = "fix chat_template.jinja (or `chat_template` in tokenizer_config.json)";
    let codec = codec
        .with_chat_template(template.clone())
        .map_err(|e| fail!("{e}; {fix}"))?
        .with_sandbox(sandbox);
    let turns = [
        ChatMessage::new("user", "Hello! What is 2 + 2?"),
        ChatMessage::new("assistant", "2 + 2 is 4."),
        ChatMessage::new("user", "And 3 + 3?"),
    ];
    let mut with_system = vec![ChatMessage::new("system", "You are a helpful assistant.")];
    with_system.extend(turns.iter().cloned());
    let rendered = match codec.encode_chat(&with_system, true) {
        Err(TextError::TemplateRaised { .. }) => codec.encode_chat(&turns, true),
        other => other,
    };
    rendered.map(|_| ()).map_err(|e| {
        fail!(
            "{e} (rendering a sample conversation: system, user, assistant, user, \
             with add_generation_prompt); every chat with this plan would fail: {fix}"
        )
    })
}
