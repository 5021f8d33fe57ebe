//! The OpenAI API's shapes: the request body of `/v1/chat/completions` and
//! `/v1/completions`, how its fields become [`GenerationSettings`], the
//! response objects and stream chunks, and the error object.
//!
//! Parse a body with [`parse_request`], check it against the endpoint with
//! [`Request::chat_prompt`] or [`Request::completion_prompt`], then turn it
//! into settings with [`Request::settings`]; every mistake is an
//! [`ApiError`] (status 400, `invalid_request_error`, `param` naming the
//! field). Fields a client may send that change nothing here (`user`,
//! `stream_options` other than `include_usage`, …) are accepted and ignored,
//! as OpenAI's own server does; fields that would change the answer and that
//! gerbil cannot honour (`n` above 1, `logprobs`, the deprecated `functions`
//! and `function_call`) are errors naming the field. `response_format` and
//! `tools` are read by [`crate::structured`].
//!
//! The surprise is the defaults: a field the request leaves out takes the
//! model's `generation_config.json` value (as `model.generate()` would), so a
//! model whose config samples samples unless the request says
//! `"temperature": 0`; `max_tokens` left out runs to the end of the context.

use crate::structured::ToolStyle;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gerbil::{ChatMessage, GenerationSettings, GenerationStats, SettingsRequest};
use gerbil_grammar::tools::ToolCall;
use gerbil_plan::GenerationDefaults;
use serde::Deserialize;
use serde_json::{json, Value};

/// An OpenAI-style error: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong and how to fix it.
    pub message: String,
    /// `invalid_request_error` or `server_error`.
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    /// A machine-readable reason (`context_length_exceeded`, …).
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (a busy server's 503).
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
            retry_after: None,
        }
    }

    /// A 500 `server_error` (the GPU failed during a generation).
    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// The same error with another status.
    pub fn with_status(mut self, status: StatusCode) -> ApiError {
        self.status = status;
        self
    }

    /// The same error with a `code`.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// The same error with a `Retry-After` of `seconds`.
    pub fn with_retry_after(mut self, seconds: u32) -> ApiError {
        self.retry_after = Some(seconds);
        self
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

/// A string or a list of strings (`stop`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged, expecting = "a string or a list of strings")]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A completion prompt: text, or token ids.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged, expecting = "a string or a list of token ids")]
pub enum PromptField {
    Text(String),
    Ids(Vec<u32>),
}

/// A message's content: a string, or a list of `{"type": "text", "text"}`
/// parts (joined).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(
    untagged,
    expecting = "a string or a list of {\"type\": \"text\", \"text\"} parts"
)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// One chat message.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant's earlier calls:
    /// `[{"id", "type": "function", "function": {"name", "arguments"}}]`.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallMessage>>,
    /// A tool's answer: the call it answers (accepted; the model sees the
    /// answers in order).
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// One entry of an assistant message's `tool_calls`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ToolCallMessage {
    #[serde(default)]
    pub id: Option<String>,
    pub function: FunctionCallMessage,
}

/// The function of a [`ToolCallMessage`].
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct FunctionCallMessage {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// `stream_options`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and no choices) before `[DONE]`.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// The body of both completion endpoints; each checks that its own prompt
/// field is there and the other's is not.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Request {
    /// Accepted and ignored: the server has one model.
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub messages: Option<Vec<Message>>,
    #[serde(default)]
    pub prompt: Option<PromptField>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Extension: ≤ 0 keeps every token.
    #[serde(default)]
    pub top_k: Option<i64>,
    /// Extension.
    #[serde(default)]
    pub min_p: Option<f32>,
    /// Any integer; its 64 bits are the seed.
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub stop: Option<OneOrMany>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    /// Extension (transformers' repetition penalty).
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    /// Extension: keep going past end-of-sequence tokens.
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// Extension (vLLM's): a whole answer's choice also lists the ids of
    /// the tokens generated (`token_ids`).
    #[serde(default)]
    pub return_token_ids: Option<bool>,
    /// Only 1.
    #[serde(default)]
    pub n: Option<u64>,
    /// Not supported when true.
    #[serde(default)]
    pub logprobs: Option<Value>,
    /// `{"type": "text" | "json_object" | "json_schema"}`
    /// ([`crate::structured`]).
    #[serde(default)]
    pub response_format: Option<Value>,
    /// Functions the model may call ([`crate::structured`]).
    #[serde(default)]
    pub tools: Option<Value>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function",
    /// "function": {"name"}}`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Several calls in one answer (default true).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// Not supported (the deprecated form of `tools`).
    #[serde(default)]
    pub functions: Option<Value>,
    /// Only `"none"` (the deprecated form of `tool_choice`).
    #[serde(default)]
    pub function_call: Option<Value>,
}

/// Parses a request body; a syntax error or a field of the wrong type is a
/// 400 naming the field.
pub fn parse_request(body: &[u8]) -> Result<Request, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("the request body is not valid JSON: {e}"), None))?;
    if !value.is_object() {
        return Err(ApiError::invalid(
            "the request body must be a JSON object",
            None,
        ));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let top = path.split(['.', '[']).next().unwrap_or(&path).to_string();
        ApiError::invalid(format!("`{path}`: {}", e.into_inner()), Some(&top))
    })
}

/// What the worker tokenizes.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    /// Messages through the chat template.
    Chat(Vec<ChatMessage>),
    /// Text through the tokenizer.
    Text(String),
    /// Token ids as they are.
    Ids(Vec<u32>),
    /// An embedding request's inputs, tokenized (an embedding plan).
    Embed(Vec<Vec<u32>>),
}

impl Request {
    /// The messages of a `/v1/chat/completions` request, earlier tool calls
    /// and tool answers written the way `style` says.
    pub fn chat_prompt(&self, style: &ToolStyle) -> Result<PromptInput, ApiError> {
        if self.prompt.is_some() {
            return Err(ApiError::invalid(
                "`prompt` belongs to /v1/completions; /v1/chat/completions takes `messages`",
                Some("prompt"),
            ));
        }
        let Some(messages) = &self.messages else {
            return Err(ApiError::invalid(
                "`messages` is required: a list of {\"role\", \"content\"} objects",
                Some("messages"),
            ));
        };
        if messages.is_empty() {
            return Err(ApiError::invalid(
                "`messages` is empty: give at least one message",
                Some("messages"),
            ));
        }
        let mut out = Vec::with_capacity(messages.len());
        for (i, m) in messages.iter().enumerate() {
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            ("text", None) => {
                                return Err(ApiError::invalid(
                                    format!("`messages[{i}].content[{j}]` has no `text`"),
                                    Some("messages"),
                                ))
                            }
                            (other, _) => {
                                return Err(ApiError::invalid(
                                    format!(
                                        "`messages[{i}].content[{j}]` is of type `{other}`; \
                                         this model takes text parts only"
                                    ),
                                    Some("messages"),
                                ))
                            }
                        }
                    }
                    text
                }
            };
            out.push(style.message(i, m, content)?);
        }
        Ok(PromptInput::Chat(out))
    }

    /// The prompt of a `/v1/completions` request.
    pub fn completion_prompt(&self) -> Result<PromptInput, ApiError> {
        if self.messages.is_some() {
            return Err(ApiError::invalid(
                "`messages` belongs to /v1/chat/completions; /v1/completions takes `prompt`",
                Some("messages"),
            ));
        }
        match &self.prompt {
            Some(PromptField::Text(t)) => Ok(PromptInput::Text(t.clone())),
            Some(PromptField::Ids(ids)) => Ok(PromptInput::Ids(ids.clone())),
            None => Err(ApiError::invalid(
                "`prompt` is required: a string (or a list of token ids)",
                Some("prompt"),
            )),
        }
    }

    /// Whether to answer with server-sent events.
    pub fn streams(&self) -> bool {
        self.stream == Some(true)
    }

    /// Whether a streamed answer ends with a `usage` chunk.
    pub fn stream_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }

    /// The generation settings: the request's fields, the model's
    /// `defaults` for the ones it leaves out, and `random_seed` when it
    /// samples without a seed.
    pub fn settings(
        &self,
        defaults: &GenerationDefaults,
        random_seed: u64,
    ) -> Result<GenerationSettings, ApiError> {
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return Err(ApiError::invalid(
                format!("`n` is {n}; this server returns one choice per request (n = 1)"),
                Some("n"),
            ));
        }
        if matches!(&self.logprobs, Some(v) if !v.is_null() && *v != Value::Bool(false)) {
            return Err(ApiError::invalid(
                "`logprobs` is not supported by this server; leave it out",
                Some("logprobs"),
            ));
        }
        self.refuse_what_changes_the_answer()?;
        let max_new_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(n), _) => positive(n, "max_completion_tokens")?,
            (None, Some(n)) => positive(n, "max_tokens")?,
            // The context ends the generation (finish reason `length`).
            (None, None) => usize::MAX,
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(OneOrMany::One(s)) => vec![s.clone()],
            Some(OneOrMany::Many(v)) => v.clone(),
        };
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "`stop` holds an empty string, which would end every answer at once",
                Some("stop"),
            ));
        }
        let asked = SettingsRequest {
            max_new_tokens: Some(max_new_tokens),
            temperature: self.temperature,
            top_k: self
                .top_k
                .map(|k| usize::try_from(k.max(0)).unwrap_or(usize::MAX)),
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed.map(|s| s as u64),
            stop,
            ignore_eos: self.ignore_eos.unwrap_or(false),
        };
        let settings = asked.resolve(defaults, usize::MAX, || random_seed).settings;
        let s = &settings.sampling;
        check(s.temperature, "temperature", "a number ≥ 0", |t| t >= 0.0)?;
        check(s.top_p, "top_p", "in (0, 1]", |p| p > 0.0 && p <= 1.0)?;
        check(s.min_p, "min_p", "in [0, 1]", |p| (0.0..=1.0).contains(&p))?;
        check(
            s.repetition_penalty,
            "repetition_penalty",
            "a number > 0 (1 = off)",
            |p| p > 0.0,
        )?;
        check(s.presence_penalty, "presence_penalty", "in [-2, 2]", |p| {
            (-2.0..=2.0).contains(&p)
        })?;
        check(
            s.frequency_penalty,
            "frequency_penalty",
            "in [-2, 2]",
            |p| (-2.0..=2.0).contains(&p),
        )?;
        Ok(settings)
    }
}

impl Request {
    /// The deprecated `functions` and `function_call`, which the server
    /// does not honour: an error naming the field and its successor, rather
    /// than an answer that ignores it (`function_call` of `"none"`, and
    /// null, pass).
    fn refuse_what_changes_the_answer(&self) -> Result<(), ApiError> {
        let plain = |v: &Value| match v {
            Value::Null => true,
            Value::String(s) => s == "none",
            _ => false,
        };
        let given = [
            ("functions", &self.functions, "tools"),
            ("function_call", &self.function_call, "tool_choice"),
        ];
        for (field, value, successor) in given {
            if let Some(v) = value.as_ref().filter(|v| !plain(v)) {
                return Err(ApiError::invalid(
                    format!(
                        "`{field}` ({v}) is the deprecated form of `{successor}`, which this \
                         server supports: send `{successor}` instead"
                    ),
                    Some(field),
                ));
            }
        }
        Ok(())
    }
}

/// `n` as a token count of at least 1.
fn positive(n: u64, field: &str) -> Result<usize, ApiError> {
    if n == 0 {
        return Err(ApiError::invalid(
            format!("`{field}` must be at least 1"),
            Some(field),
        ));
    }
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// Checks a finite float against `ok`; the error says `expected`.
fn check(v: f32, field: &str, expected: &str, ok: impl Fn(f32) -> bool) -> Result<(), ApiError> {
    if v.is_finite() && ok(v) {
        Ok(())
    } else {
        Err(ApiError::invalid(
            format!("`{field}` must be {expected}, got {v}"),
            Some(field),
        ))
    }
}

/// Which endpoint answers: the shapes differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// What every response object and chunk of one request shares.
#[derive(Clone, Debug)]
pub struct Envelope {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Envelope {
    /// A new id (`chatcmpl-…` / `cmpl-…`) stamped now.
    pub fn new(endpoint: Endpoint, model: &str) -> Envelope {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        };
        Envelope {
            endpoint,
            id: format!("{prefix}-{:016x}", rand::random::<u64>()),
            created: unix_now(),
            model: model.to_string(),
        }
    }

    /// The whole answer (no stream); a chat's tool `calls` (with their ids)
    /// go into `message.tool_calls`, and `content` is null when only calls
    /// were written.
    pub fn response(
        &self,
        text: &str,
        calls: &[(String, ToolCall)],
        finish_reason: &str,
        stats: &GenerationStats,
    ) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut message = json!({"role": "assistant", "content": text});
                if !calls.is_empty() {
                    if text.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = calls
                        .iter()
                        .map(|(id, c)| tool_call_object(None, id, c))
                        .collect();
                }
                json!({
                    "index": 0,
                    "message": message,
                    "logprobs": null,
                    "finish_reason": finish_reason,
                })
            }
            Endpoint::Completion => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish_reason,
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(stats),
            "timings": timings(stats),
        })
    }

    /// A stream chunk: the first of a chat (`role`), text, or the last
    /// (`finish_reason`, no text).
    pub fn chunk(&self, piece: ChunkPiece<'_>) -> Value {
        let (text, finish): (Option<&str>, Option<&str>) = match piece {
            ChunkPiece::Start | ChunkPiece::Call { .. } => (None, None),
            ChunkPiece::Text(t) => (Some(t), None),
            ChunkPiece::Finish(f) => (None, Some(f)),
        };
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let delta = match piece {
                    ChunkPiece::Start => json!({"role": "assistant", "content": ""}),
                    ChunkPiece::Text(t) => json!({"content": t}),
                    ChunkPiece::Call { index, id, call } => {
                        json!({"tool_calls": [tool_call_object(Some(index), id, call)]})
                    }
                    ChunkPiece::Finish(_) => json!({}),
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            Endpoint::Completion => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "logprobs": null,
                "finish_reason": finish,
            }),
        };
        self.chunk_with(json!([choice]), Value::Null)
    }

    /// The chunk after the last one when the client asked for
    /// `stream_options.include_usage`: no choices, the usage and timings.
    pub fn usage_chunk(&self, stats: &GenerationStats) -> Value {
        let mut v = self.chunk_with(json!([]), usage(stats));
        v["timings"] = timings(stats);
        v
    }

    fn chunk_with(&self, choices: Value, usage: Value) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if !usage.is_null() {
            v["usage"] = usage;
        }
        v
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }
}

/// Seconds since the Unix epoch (`created`).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What a stream chunk carries.
#[derive(Clone, Copy, Debug)]
pub enum ChunkPiece<'a> {
    /// The first chunk of a chat: the assistant's role.
    Start,
    /// Generated text.
    Text(&'a str),
    /// One whole tool call (a chat's), the `index`-th of the answer.
    Call {
        index: usize,
        id: &'a str,
        call: &'a ToolCall,
    },
    /// The end, with the finish reason.
    Finish(&'a str),
}

/// A tool call as OpenAI writes it: `{"id", "type": "function", "function":
/// {"name", "arguments"}}`, with its `index` in a stream's delta.
fn tool_call_object(index: Option<usize>, id: &str, call: &ToolCall) -> Value {
    let mut v = json!({
        "id": id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    });
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}

/// `usage`: prompt, completion and total tokens, and how many prompt
/// tokens the KV cache held already.
fn usage(stats: &GenerationStats) -> Value {
    json!({
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    })
}

/// `timings`, with llama-server's names: the prompt tokens run and the
/// tokens generated, their milliseconds and rates, and the prompt tokens
/// the cache held. `predicted_ms` runs from the end of the prompt (whose
/// step chose the first token) to the last token, so `predicted_per_second`
/// counts the tokens after the first (0 for one token), as `bench` and the
/// logs do; llama-server counts them all. A client cannot time the decode
/// itself: tokens reach it in bursts (decode-ahead sends a batch of steps'
/// tokens at once).
fn timings(stats: &GenerationStats) -> Value {
    json!({
        "cache_n": stats.cached_tokens,
        "prompt_n": stats.prompt_tokens.saturating_sub(stats.cached_tokens),
        "prompt_ms": stats.prefill.as_secs_f64() * 1e3,
        "prompt_per_second": stats.prefill_tokens_per_second(),
        "predicted_n": stats.generated_tokens,
        "predicted_ms": stats.decode.as_secs_f64() * 1e3,
        "predicted_per_second": stats.decode_tokens_per_second(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(body: &str) -> Result<Request, ApiError> {
        parse_request(body.as_bytes())
    }

    #[test]
    fn wrong_types_name_the_field() {
        let e = req(r#"{"messages": 3}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"), "{e:?}");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e = req(r#"{"prompt": "a", "max_tokens": "x"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"), "{e:?}");
        assert!(e.message.contains("invalid type"), "{}", e.message);
        let e = req(r#"{"messages": [{"role": "user", "content": 5}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"), "{e:?}");
        assert!(
            e.message.starts_with("`messages[0].content`: "),
            "{}",
            e.message
        );
        assert!(e.message.contains("a string or a list"), "{}", e.message);
        let e = req(r#"{"messages": [{"role": "user", "content": "hi"}]"#).unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        assert_eq!(e.param, None);
        let e = req("[1]").unwrap_err();
        assert!(e.message.contains("JSON object"), "{}", e.message);
    }

    #[test]
    fn prompts_belong_to_their_endpoint() {
        let r = req(r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}"#).unwrap();
        assert_eq!(
            r.chat_prompt(&ToolStyle::of(None)).unwrap(),
            PromptInput::Chat(vec![ChatMessage::new("user", "ab")])
        );
        assert_eq!(
            r.completion_prompt().unwrap_err().param.as_deref(),
            Some("messages")
        );
        let r = req(r#"{"prompt": [1, 2]}"#).unwrap();
        assert_eq!(r.completion_prompt().unwrap(), PromptInput::Ids(vec![1, 2]));
        assert_eq!(
            r.chat_prompt(&ToolStyle::of(None))
                .unwrap_err()
                .param
                .as_deref(),
            Some("prompt")
        );
        let r = req(r#"{"messages": []}"#).unwrap();
        assert!(r
            .chat_prompt(&ToolStyle::of(None))
            .unwrap_err()
            .message
            .contains("empty"));
    }

    #[test]
    fn request_fields_override_the_model_defaults() {
        let sampling_model = GenerationDefaults {
            do_sample: Some(true),
            temperature: Some(0.6),
            top_p: Some(0.9),
            ..GenerationDefaults::default()
        };
        let s = req("{}").unwrap().settings(&sampling_model, 77).unwrap();
        let p = s.sampling;
        assert_eq!(
            (p.temperature, p.top_k, p.top_p, p.seed),
            (0.6, 50, 0.9, 77)
        );
        assert_eq!(s.max_new_tokens, usize::MAX);
        let r = req(r#"{"temperature": 0, "max_tokens": 5, "seed": -1, "stop": "x"}"#).unwrap();
        let s = r.settings(&sampling_model, 77).unwrap();
        assert!(s.sampling.is_greedy());
        assert_eq!(s.sampling.seed, u64::MAX);
        assert_eq!((s.max_new_tokens, s.stop), (5, vec!["x".to_string()]));
        let r = req(r#"{"max_tokens": 5, "max_completion_tokens": 7, "top_k": -1, "presence_penalty": 0.5, "repetition_penalty": 1.1}"#).unwrap();
        let s = r.settings(&GenerationDefaults::default(), 0).unwrap();
        assert_eq!((s.max_new_tokens, s.sampling.top_k), (7, 0));
        assert_eq!(s.sampling.temperature, 0.0, "a greedy model stays greedy");
        assert_eq!(
            (s.sampling.presence_penalty, s.sampling.repetition_penalty),
            (0.5, 1.1)
        );
    }

    #[test]
    fn out_of_range_settings_are_errors() {
        let d = GenerationDefaults::default();
        for (body, param) in [
            (r#"{"temperature": -1}"#, "temperature"),
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"min_p": 2}"#, "min_p"),
            (r#"{"presence_penalty": 3}"#, "presence_penalty"),
            (r#"{"frequency_penalty": -2.5}"#, "frequency_penalty"),
            (r#"{"repetition_penalty": 0}"#, "repetition_penalty"),
            (r#"{"max_tokens": 0}"#, "max_tokens"),
            (r#"{"stop": ["a", ""]}"#, "stop"),
            (r#"{"n": 2}"#, "n"),
            (r#"{"logprobs": true}"#, "logprobs"),
            (r#"{"functions": []}"#, "functions"),
            (r#"{"function_call": {"name": "f"}}"#, "function_call"),
        ] {
            let e = req(body).unwrap().settings(&d, 0).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        }
        assert!(req(r#"{"logprobs": false, "n": 1}"#)
            .unwrap()
            .settings(&d, 0)
            .is_ok());
        let plain = r#"{"response_format": {"type": "text"}, "tool_choice": "none", "tools": null,
                        "function_call": "none"}"#;
        assert!(req(plain).unwrap().settings(&d, 0).is_ok());
        // A temperature too small to divide by decodes greedily, as on the command line.
        let s = req(r#"{"temperature": 1e-40}"#)
            .unwrap()
            .settings(&d, 0)
            .unwrap();
        assert!(s.sampling.is_greedy());
    }

    #[test]
    fn chunks_have_openai_shapes() {
        let chat = Envelope::new(Endpoint::Chat, "m");
        assert!(chat.id.starts_with("chatcmpl-"));
        let first = chat.chunk(ChunkPiece::Start);
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        let text = chat.chunk(ChunkPiece::Text("hi"));
        assert_eq!(text["choices"][0]["delta"]["content"], "hi");
        assert!(text["choices"][0]["finish_reason"].is_null());
        let last = chat.chunk(ChunkPiece::Finish("stop"));
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        let stats = GenerationStats {
            prompt_tokens: 3,
            cached_tokens: 1,
            prefill: std::time::Duration::from_millis(40),
            generated_tokens: 5,
            decode: std::time::Duration::from_millis(200),
        };
        let usage = chat.usage_chunk(&stats);
        assert_eq!(usage["usage"]["total_tokens"], 8);
        assert_eq!(usage["choices"], json!([]));
        let t = &usage["timings"];
        assert_eq!(
            (t["cache_n"].clone(), t["prompt_n"].clone()),
            (json!(1), json!(2))
        );
        assert_eq!(t["predicted_n"], 5);
        assert!(
            (t["prompt_ms"].as_f64().unwrap() - 40.0).abs() < 1e-9,
            "{t}"
        );
        assert!(
            (t["prompt_per_second"].as_f64().unwrap() - 50.0).abs() < 1e-6,
            "{t}"
        );
        // Four intervals between five tokens in 200 ms.
        assert!(
            (t["predicted_per_second"].as_f64().unwrap() - 20.0).abs() < 1e-6,
            "{t}"
        );
        let cmpl = Envelope::new(Endpoint::Completion, "m");
        let whole = cmpl.response("abc", &[], "length", &stats);
        assert_eq!(whole["object"], "text_completion");
        assert_eq!(whole["choices"][0]["text"], "abc");
        assert_eq!(whole["usage"]["completion_tokens"], 5);
        assert_eq!(whole["timings"], usage["timings"]);
    }
}
