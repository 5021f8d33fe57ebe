//! Target `request`: bytes as the body of a `/v1/chat/completions` or
//! `/v1/completions` request, through the server's parser and checks
//! ([`parse_request`], the prompt of either endpoint, [`Request::settings`]
//! under a greedy and a sampling model's defaults), without a model.
//!
//! [`Request::settings`]: gerbil_serve::openai::Request::settings

use gerbil_plan::GenerationDefaults;
use gerbil_serve::openai::parse_request;

/// Parses and checks the input as a request body for both endpoints.
pub fn request(data: &[u8]) {
    let Ok(request) = parse_request(data) else {
        return;
    };
    let _ = request.chat_prompt();
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
