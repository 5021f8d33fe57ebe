//! Structured output and tool calls on the OpenAI endpoints:
//! `response_format`, `tools`, `tool_choice` and `parallel_tool_calls`
//! become one grammar ([`gerbil_grammar`]) that masks every token, and the
//! answer's text becomes `tool_calls` again.
//!
//! [`Structured::of`] reads the request (a 400 naming the field for
//! anything malformed); the handler compiles its grammar before the
//! request queues, so a schema llguidance cannot compile is a 400 too.
//! [`ToolStyle`] is the model's tool format, read once from its chat
//! template: a template that knows tools (Qwen's `<tool_call>`, Llama 3's
//! `<|python_tag|>`) gets them as `tools=` and renders earlier calls and
//! answers itself; any other gets the tools described in a system message,
//! earlier calls written as the model would write them and answers as user
//! turns in `<tool_response>` tags. The surprise is streaming: whether an
//! `auto` answer is text or calls shows only in its first characters, so
//! [`ToolStream`] holds text back while it could still begin a call, and
//! sends each call whole once the answer ends (OpenAI clients join deltas,
//! so one delta per call is a valid stream).

use crate::openai::{ApiError, Endpoint, Message, Request};
use gerbil::{ChatMessage, TextCodec};
use gerbil_grammar::tools::{Tool, ToolCall, ToolChoice, ToolFormat, ToolOutput};
use gerbil_grammar::Grammar;
use serde_json::Value;

/// How the model writes tool calls, and whether its template describes
/// tools itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolStyle {
    /// The format of a call.
    pub format: ToolFormat,
    /// The chat template takes `tools=` and renders calls and answers.
    pub native: bool,
}

impl ToolStyle {
    /// The style of a model with `codec` (Hermes, described in a system
    /// message, without one).
    pub fn of(codec: Option<&TextCodec>) -> ToolStyle {
        let (format, native) = ToolFormat::for_template(codec.and_then(TextCodec::chat_template));
        ToolStyle { format, native }
    }

    /// Message `i` of a request, with `content` already joined: an
    /// assistant's `tool_calls` appended in the model's format, and a tool's
    /// answer as the template expects it.
    pub(crate) fn message(
        &self,
        i: usize,
        m: &Message,
        mut content: String,
    ) -> Result<ChatMessage, ApiError> {
        if let Some(calls) = &m.tool_calls {
            if m.role != "assistant" {
                return Err(ApiError::invalid(
                    format!("`messages[{i}]` has `tool_calls` but is not the assistant's"),
                    Some("messages"),
                ));
            }
            let calls: Vec<ToolCall> = calls
                .iter()
                .map(|c| ToolCall {
                    name: c.function.name.clone(),
                    arguments: c.function.arguments.clone(),
                })
                .collect();
            if !calls.is_empty() {
                if !content.is_empty() {
                    content.push('\n');
                }
                content.push_str(&self.format.render(&calls));
            }
        }
        if m.role == "tool" && !self.native {
            let answer = format!("<tool_response>\n{content}\n</tool_response>");
            return Ok(ChatMessage::new("user", answer));
        }
        Ok(ChatMessage::new(m.role.clone(), content))
    }
}

/// The tools of a request, as the grammar and the template need them.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    /// The functions.
    pub tools: Vec<Tool>,
    /// `tool_choice`.
    pub choice: ToolChoice,
    /// `parallel_tool_calls`.
    pub parallel: bool,
    /// The request's `tools` list as sent: the template's `tools=`.
    pub definitions: Value,
}

/// What a request asks of its answer's form.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Structured {
    /// The grammar every token must follow (`None`: free text).
    pub grammar: Option<Grammar>,
    /// The tools, when the model may call some.
    pub tools: Option<ToolRequest>,
}

impl Structured {
    /// The form `request` asks for on `endpoint`, for a model of `style`.
    pub fn of(
        request: &Request,
        endpoint: Endpoint,
        style: &ToolStyle,
    ) -> Result<Structured, ApiError> {
        let format = response_format(request.response_format.as_ref())?;
        let tools = match endpoint {
            Endpoint::Chat => tool_request(request)?,
            Endpoint::Completion => {
                if request.tools.as_ref().is_some_and(|t| !t.is_null()) {
                    return Err(ApiError::invalid(
                        "`tools` belongs to /v1/chat/completions",
                        Some("tools"),
                    ));
                }
                None
            }
        };
        let grammar = match &tools {
            Some(t) => Some(
                style
                    .format
                    .grammar(&t.tools, &t.choice, t.parallel, format.as_ref())
                    .map_err(|e| ApiError::invalid(e.to_string(), Some("tools")))?,
            ),
            None => format,
        };
        Ok(Structured { grammar, tools })
    }

    /// The request field a grammar error belongs to.
    pub fn param(&self) -> &'static str {
        if self.tools.is_some() {
            "tools"
        } else {
            "response_format"
        }
    }
}

/// `response_format`: `text` (or none), `json_object` (llama.cpp's
/// `schema` beside it honoured), or `json_schema` with `json_schema.schema`.
fn response_format(v: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
    let bad = |why: &str| ApiError::invalid(why.to_string(), Some("response_format"));
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(match v.get("schema") {
            Some(schema) if !schema.is_null() => Grammar::JsonSchema(schema.clone()),
            _ => Grammar::JsonObject,
        })),
        Some("json_schema") => {
            let schema = v
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .filter(|s| s.is_object() || s.is_boolean())
                .ok_or_else(|| {
                    bad(
                        "`response_format.json_schema.schema` is required: the JSON schema \
                         of the answer",
                    )
                })?;
            Ok(Some(Grammar::JsonSchema(schema.clone())))
        }
        Some(other) => Err(bad(&format!(
            "`response_format.type` is `{other}`; expected `text`, `json_object` or `json_schema`"
        ))),
        None => Err(bad(
            "`response_format` needs a `type`: `text`, `json_object` or `json_schema`",
        )),
    }
}

/// `tools`, `tool_choice` and `parallel_tool_calls`; `None` when there are
/// no tools or `tool_choice` is `none`.
fn tool_request(request: &Request) -> Result<Option<ToolRequest>, ApiError> {
    let choice = match &request.tool_choice {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => match s.as_str() {
            "none" => return Ok(None),
            "auto" => Some(ToolChoice::Auto),
            "required" => Some(ToolChoice::Required),
            other => {
                return Err(ApiError::invalid(
                    format!(
                        "`tool_choice` is `{other}`; expected `none`, `auto`, `required` or \
                         {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"
                    ),
                    Some("tool_choice"),
                ))
            }
        },
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(name) => Some(ToolChoice::Named(name.to_string())),
            None => {
                return Err(ApiError::invalid(
                    "`tool_choice` must be `none`, `auto`, `required` or {\"type\": \
                     \"function\", \"function\": {\"name\": …}}",
                    Some("tool_choice"),
                ))
            }
        },
    };
    let definitions = match &request.tools {
        None | Some(Value::Null) => {
            return match choice {
                None => Ok(None),
                Some(_) => Err(ApiError::invalid(
                    "`tool_choice` needs `tools`: the functions the model may call",
                    Some("tool_choice"),
                )),
            }
        }
        Some(v) => v.clone(),
    };
    let Some(list) = definitions.as_array().filter(|l| !l.is_empty()) else {
        return Err(ApiError::invalid(
            "`tools` must be a non-empty list of {\"type\": \"function\", \"function\": {\"name\", \
             \"description\", \"parameters\"}}",
            Some("tools"),
        ));
    };
    let mut tools = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let bad = |why: &str| ApiError::invalid(format!("`tools[{i}]`: {why}"), Some("tools"));
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad("`type` must be `function`"));
        }
        let f = t
            .get("function")
            .ok_or_else(|| bad("`function` is missing"))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("`function.name` is missing"))?;
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(bad(&format!(
                "`function.name` `{name}` must be 1 to 64 letters, digits, `_` or `-`"
            )));
        }
        if tools.iter().any(|t: &Tool| t.name == name) {
            return Err(bad(&format!("a second function named `{name}`")));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(p) if p.is_object() => p.clone(),
            Some(_) => return Err(bad("`function.parameters` must be a JSON schema object")),
        };
        tools.push(Tool {
            name: name.to_string(),
            description: f
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string),
            parameters,
        });
    }
    Ok(Some(ToolRequest {
        tools,
        choice: choice.unwrap_or(ToolChoice::Auto),
        parallel: request.parallel_tool_calls.unwrap_or(true),
        definitions,
    }))
}

/// `messages` with the tools described for a template that does not
/// describe them: the description leads the system message (one is added
/// when there is none).
pub fn describe_tools(messages: &mut Vec<ChatMessage>, style: &ToolStyle, tools: &[Tool]) {
    if style.native {
        return;
    }
    let description = style.format.system_prompt(tools);
    match messages.first_mut().filter(|m| m.role == "system") {
        Some(system) => system.content = format!("{description}\n\n{}", system.content),
        None => messages.insert(0, ChatMessage::new("system", description)),
    }
}

/// A tool call's id: `call_` and 24 random hex digits.
pub fn call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

/// The streamed text of an answer that may call tools; see the [module
/// docs](self).
pub struct ToolStream {
    format: ToolFormat,
    state: StreamState,
}

enum StreamState {
    /// The text so far could still begin a call.
    Deciding(String),
    /// Plain text: stream it.
    Text,
    /// Calls: keep it to the end.
    Calls(String),
}

impl ToolStream {
    /// A stream of an answer in `format`.
    pub fn new(format: ToolFormat) -> ToolStream {
        ToolStream {
            format,
            state: StreamState::Deciding(String::new()),
        }
    }

    /// Takes the next piece of text; returns what may be sent now.
    pub fn push(&mut self, piece: &str) -> String {
        match &mut self.state {
            StreamState::Text => piece.to_string(),
            StreamState::Calls(all) => {
                all.push_str(piece);
                String::new()
            }
            StreamState::Deciding(held) => {
                held.push_str(piece);
                let trigger = self.format.trigger();
                if held.starts_with(trigger) {
                    self.state = StreamState::Calls(std::mem::take(held));
                    String::new()
                } else if trigger.starts_with(held.as_str()) {
                    String::new()
                } else {
                    let text = std::mem::take(held);
                    self.state = StreamState::Text;
                    text
                }
            }
        }
    }

    /// The end: text still held back, and the calls read from the rest.
    pub fn finish(self) -> ToolOutput {
        match self.state {
            StreamState::Text => ToolOutput::default(),
            StreamState::Deciding(held) => ToolOutput {
                content: held,
                calls: Vec::new(),
            },
            StreamState::Calls(all) => self.format.parse(&all),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::parse_request;

    fn structured(body: &str) -> Result<Structured, ApiError> {
        let style = ToolStyle {
            format: ToolFormat::Hermes,
            native: false,
        };
        Structured::of(&parse_request(body.as_bytes())?, Endpoint::Chat, &style)
    }

    #[test]
    fn response_formats_and_tools_become_grammars() {
        assert_eq!(structured("{}").unwrap(), Structured::default());
        let s = structured(r#"{"response_format": {"type": "text"}}"#).unwrap();
        assert_eq!(s.grammar, None);
        let s = structured(r#"{"response_format": {"type": "json_object"}}"#).unwrap();
        assert_eq!(s.grammar, Some(Grammar::JsonObject));
        let s = structured(
            r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}}}}"#,
        )
        .unwrap();
        assert_eq!(
            s.grammar,
            Some(Grammar::JsonSchema(serde_json::json!({"type": "array"})))
        );
        let tools = r#""tools": [{"type": "function", "function": {"name": "f"}}]"#;
        let s = structured(&format!("{{{tools}}}")).unwrap();
        let t = s.tools.unwrap();
        assert_eq!((t.choice, t.parallel), (ToolChoice::Auto, true));
        assert!(matches!(s.grammar, Some(Grammar::Lark(_))));
        let s = structured(&format!(r#"{{{tools}, "tool_choice": "none"}}"#)).unwrap();
        assert_eq!(s, Structured::default());
    }

    #[test]
    fn malformed_forms_name_their_field() {
        for (body, param) in [
            (r#"{"response_format": {"type": "xml"}}"#, "response_format"),
            (r#"{"response_format": {}}"#, "response_format"),
            (
                r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}"#,
                "response_format",
            ),
            (r#"{"tools": []}"#, "tools"),
            (r#"{"tools": [{"type": "function"}]}"#, "tools"),
            (
                r#"{"tools": [{"type": "function", "function": {"name": "a b"}}]}"#,
                "tools",
            ),
            (
                r#"{"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]}"#,
                "tools",
            ),
            (r#"{"tool_choice": "auto"}"#, "tool_choice"),
            (
                r#"{"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "always"}"#,
                "tool_choice",
            ),
            (
                r#"{"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}"#,
                "tools",
            ),
        ] {
            let e = structured(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        }
    }

    #[test]
    fn a_stream_holds_back_what_may_begin_a_call() {
        let mut s = ToolStream::new(ToolFormat::Hermes);
        assert_eq!(s.push("<tool"), "");
        assert_eq!(s.push("s are"), "<tools are");
        assert_eq!(s.push(" fun"), " fun");
        assert_eq!(s.finish(), ToolOutput::default());
        let mut s = ToolStream::new(ToolFormat::Hermes);
        for piece in [
            "<tool_",
            "call>\n{\"name\": \"f\", ",
            "\"arguments\": {}}\n</tool_call>",
        ] {
            assert_eq!(s.push(piece), "");
        }
        let out = s.finish();
        assert_eq!(out.calls.len(), 1);
        assert_eq!(out.calls[0].name, "f");
        let mut s = ToolStream::new(ToolFormat::Hermes);
        assert_eq!(s.push("<"), "");
        assert_eq!(s.finish().content, "<");
    }

    #[test]
    fn tool_history_is_written_for_the_template() {
        let style = ToolStyle {
            format: ToolFormat::Hermes,
            native: false,
        };
        let body = r#"{"messages": [
            {"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "5"}]}"#;
        let r = parse_request(body.as_bytes()).unwrap();
        let crate::openai::PromptInput::Chat(mut m) = r.chat_prompt(&style).unwrap() else {
            panic!("a chat prompt")
        };
        assert_eq!(
            m[1].content,
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>"
        );
        assert_eq!(
            m[2],
            ChatMessage::new("user", "<tool_response>\n5\n</tool_response>")
        );
        let tools = [Tool {
            name: "add".into(),
            description: None,
            parameters: serde_json::json!({"type": "object"}),
        }];
        describe_tools(&mut m, &style, &tools);
        assert_eq!(m[0].role, "system");
        assert!(m[0].content.contains("\"add\""));
        let native = ToolStyle {
            native: true,
            ..style
        };
        let crate::openai::PromptInput::Chat(m) = r.chat_prompt(&native).unwrap() else {
            panic!("a chat prompt")
        };
        assert_eq!(m[2], ChatMessage::new("tool", "5"));
    }
}
