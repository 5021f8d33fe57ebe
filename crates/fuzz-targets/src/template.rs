//! Target `template`: bytes as a chat template and a conversation, rendered
//! as `gerbil-run chat` and the server render them (the runtime's minijinja
//! environment with its fuel, recursion and output limits), so a template
//! must end — with text or an error — in bounded time and memory.
//!
//! The input splits at NUL bytes: the template source, then roles and
//! contents in turn (a role without content gets an empty one); the
//! generation prompt is added when the number of pieces is even. Invalid
//! UTF-8 is replaced, as a file read with `from_utf8_lossy` would be.

use crate::frame::split_nul;
use gerbil_text::{ChatMessage, TextCodec};

/// A one-word tokenizer: the target renders templates, it does not tokenize.
const TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
"normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,
"model":{"type":"WordLevel","vocab":{"<unk>":0},"unk_token":"<unk>"}}"#;

/// Renders the input's template over the input's messages.
pub fn template(data: &[u8]) {
    let pieces = split_nul(data);
    let source = String::from_utf8_lossy(pieces[0]).into_owned();
    let messages: Vec<ChatMessage> = pieces[1..]
        .chunks(2)
        .map(|m| {
            let text = |i: usize| String::from_utf8_lossy(m.get(i).copied().unwrap_or(&[]));
            ChatMessage::new(text(0), text(1))
        })
        .collect();
    let add_generation_prompt = pieces.len().is_multiple_of(2);
    let codec = TextCodec::from_tokenizer_json(TOKENIZER.as_bytes())
        .expect("the built-in tokenizer parses")
        .with_special_tokens(Some("<s>".into()), Some("</s>".into()));
    let Ok(codec) = codec.with_chat_template(source) else {
        return;
    };
    let _ = codec.apply_chat_template(&messages, add_generation_prompt);
}
