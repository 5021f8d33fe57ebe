//! Target `request`: bytes as the body of a `/v1/chat/completions` or
//! `/v1/completions` request, through the server's parser and checks
//! ([`parse_request`], the prompt of either endpoint for a model with and
//! one without a tool format in its template, the structured-output and tool
//! fields, [`Request::settings`] under a greedy and a sampling model's
//! defaults), without a model.
//!
//! [`Request::settings`]: gerbil_serve::openai::Request::settings

use gerbil_grammar::tools::ToolFormat;
use gerbil_plan::GenerationDefaults;
use gerbil_serve::openai::{parse_request, Endpoint};
use gerbil_serve::structured::{Structured, ToolStyle};

/// Parses and checks the input as a request body for both endpoints.
pub fn request(data: &[u8]) {
    let Ok(request) = parse_request(data) else {
        return;
    };
    for native in [false, true] {
        let style = ToolStyle {
            format: ToolFormat::Hermes,
            native,
        };
        let _ = request.chat_prompt(&style);
        let _ = Structured::of(&request, Endpoint::Chat, &style);
        let _ = Structured::of(&request, Endpoint::Completion, &style);
    }
    let _ = request.completion_prompt();
    let _ = (request.streams(), request.stream_usage());
    let sampling = GenerationDefaults {
        do_sample: Some(true),
        temperature: Some(0.7),
        top_k: Some(u64::MAX),
        top_p: Some(0.9),
        min_p: Some(0.05),
        repetition_penalty: Some(1.1),
        max_new_tokens: Some(u64::MAX),
        max_length: Some(u64::MAX),
    };
    for defaults in [GenerationDefaults::default(), sampling] {
        let _ = request.settings(&defaults, 0x5eed);
    }
}
