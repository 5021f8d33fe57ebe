//! Tool calls in a model's own format: the grammar that lets a model call
//! the tools it was given (and only those, with arguments valid against
//! their schemas), the text that describes the tools to a model whose chat
//! template does not, and the reading of the calls back out of the text.
//!
//! Two formats cover the open models gerbil runs:
//!
//! | format | a call | models |
//! |---|---|---|
//! | [`ToolFormat::Hermes`] | `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>`, several in a row | Qwen 2.5 / 3, Hermes, SmolLM2 (1.7B), and every template without a tool format of its own (Gemma 3, SmolLM2-135M), which get the tools described in a system message |
//! | [`ToolFormat::Llama3`] | `{"name": "f", "parameters": {…}}`, one a turn | Llama 3.1–3.3 |
//!
//! [`ToolFormat::for_template`] picks one by what the chat template writes.
//! With `tool_choice` `auto`, the grammar lets the model answer in text
//! instead, as long as the text does not begin like a call (so a call is
//! always a whole, valid call); `required` or a named function leaves calls
//! only. The surprise: the model may call a tool it was given with
//! arguments its schema allows and still be wrong — the grammar guarantees
//! the form, not the judgement.

use crate::{with_layout, Grammar, GrammarError};
use serde_json::{json, Value};

/// A function the model may call (OpenAI's `tools[].function`).
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    /// Its name.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// A JSON schema of its arguments (an object).
    pub parameters: Value,
}

/// Whether and which tools the model must call (OpenAI's `tool_choice`,
/// other than `none`, which asks for no tools at all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// A call or a text answer, as the model likes.
    Auto,
    /// At least one call.
    Required,
    /// A call of this function.
    Named(String),
}

/// One call read from the model's text.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The function.
    pub name: String,
    /// Its arguments, as JSON text (what OpenAI's `arguments` holds).
    pub arguments: String,
}

/// What a model wrote when it could call tools: the text outside calls,
/// and the calls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolOutput {
    /// The text outside the calls, trimmed.
    pub content: String,
    /// The calls, in order.
    pub calls: Vec<ToolCall>,
}

/// How a model writes tool calls; see the [module docs](self).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>` tags around JSON with `name` and `arguments`.
    Hermes,
    /// Bare JSON with `name` and `parameters`.
    Llama3,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";

impl ToolFormat {
    /// The format the chat template `source` uses, and whether the template
    /// itself describes the tools (`true`) or the caller must
    /// ([`ToolFormat::system_prompt`]).
    pub fn for_template(source: Option<&str>) -> (ToolFormat, bool) {
        let source = source.unwrap_or("");
        if source.contains(HERMES_OPEN) {
            (ToolFormat::Hermes, true)
        } else if source.contains("<|python_tag|>") || source.contains("<|eom_id|>") {
            (ToolFormat::Llama3, true)
        } else {
            (ToolFormat::Hermes, false)
        }
    }

    /// The text a reply that calls a tool begins with.
    pub fn trigger(self) -> &'static str {
        match self {
            ToolFormat::Hermes => HERMES_OPEN,
            ToolFormat::Llama3 => "{",
        }
    }

    /// A system message describing `tools` and how to call them, for a
    /// template that has no tool format of its own.
    pub fn system_prompt(self, tools: &[Tool]) -> String {
        let mut text = String::from(
            "You may call one or more functions to answer the user. The functions, as JSON \
             signatures:\n<tools>\n",
        );
        for t in tools {
            let signature = json!({"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.parameters}});
            text.push_str(&signature.to_string());
            text.push('\n');
        }
        text.push_str("</tools>\n");
        let example = self.render(&[ToolCall {
            name: "function_name".into(),
            arguments: "{\"argument\": \"value\"}".into(),
        }]);
        text.push_str("To call a function, answer with exactly:\n");
        text.push_str(&example);
        text
    }

    /// The text of `calls` as the model writes them (for the assistant's
    /// earlier turns in a conversation).
    pub fn render(self, calls: &[ToolCall]) -> String {
        let key = self.arguments_key();
        calls
            .iter()
            .map(|c| {
                let arguments = serde_json::from_str::<Value>(&c.arguments)
                    .unwrap_or_else(|_| Value::String(c.arguments.clone()));
                let mut body = serde_json::Map::new();
                body.insert("name".into(), Value::String(c.name.clone()));
                body.insert(key.into(), arguments);
                let body = crate::one_line_json(&Value::Object(body));
                match self {
                    ToolFormat::Hermes => format!("{HERMES_OPEN}\n{body}\n{HERMES_CLOSE}"),
                    ToolFormat::Llama3 => body,
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "arguments",
            ToolFormat::Llama3 => "parameters",
        }
    }

    /// The grammar of a reply: calls of `tools` as `choice` allows (several
    /// in a row when `parallel` and the format has room for them), or, with
    /// [`ToolChoice::Auto`], text — any text not beginning like a call, or
    /// text of `text` (a `response_format`) when given.
    pub fn grammar(
        self,
        tools: &[Tool],
        choice: &ToolChoice,
        parallel: bool,
        text: Option<&Grammar>,
    ) -> Result<Grammar, GrammarError> {
        let callable: Vec<&Tool> = match choice {
            ToolChoice::Named(name) => {
                let named: Vec<&Tool> = tools.iter().filter(|t| &t.name == name).collect();
                if named.is_empty() {
                    return Err(GrammarError::Invalid(format!(
                        "tool_choice names the function `{name}`, which is not among the tools"
                    )));
                }
                named
            }
            ToolChoice::Auto | ToolChoice::Required => tools.iter().collect(),
        };
        if callable.is_empty() {
            return Err(GrammarError::Invalid("no tools were given".into()));
        }
        let mut lark = String::from("%llguidance {}\n");
        let calls = match (self, parallel) {
            (ToolFormat::Hermes, true) => "call (\"\\n\" call)*",
            _ => "call",
        };
        match (choice, text) {
            (ToolChoice::Auto, None) => {
                lark.push_str(&format!("start: TEXT | {calls}\n"));
                let trigger = regex_syntax_escape(self.trigger());
                lark.push_str(&format!(
                    "TEXT: /(?s:.*)/ & ~/{trigger}(?s:.*)/ & ~/[ \\t\\n]+(?s:.*)/\n"
                ));
            }
            (ToolChoice::Auto, Some(format)) => {
                lark.push_str(&format!("start: answer | {calls}\n"));
                lark.push_str(&format!("answer: {}\n", inline(format)?));
            }
            _ => lark.push_str(&format!("start: {calls}\n")),
        }
        match self {
            ToolFormat::Hermes => {
                lark.push_str("call: \"<tool_call>\\n\" body \"\\n</tool_call>\"\n");
            }
            ToolFormat::Llama3 => lark.push_str("call: body\n"),
        }
        let names: Vec<String> = (0..callable.len()).map(|i| format!("f{i}")).collect();
        lark.push_str(&format!("body: {}\n", names.join(" | ")));
        for (name, tool) in names.iter().zip(&callable) {
            // The call's schema wraps the parameters; their definitions move
            // to its root, where their references (`#/$defs/…`) point.
            let mut parameters = tool.parameters.clone();
            let mut schema = json!({
                "type": "object",
                "properties": {"name": {"const": tool.name}},
                "required": ["name", self.arguments_key()],
                "additionalProperties": false,
            });
            for defs in ["$defs", "definitions"] {
                if let Some(d) = parameters.as_object_mut().and_then(|p| p.remove(defs)) {
                    schema[defs] = d;
                }
            }
            schema["properties"][self.arguments_key()] = parameters;
            let schema = with_layout(schema);
            lark.push_str(&format!("{name}: %json {schema}\n"));
        }
        Ok(Grammar::Lark(lark))
    }

    /// The calls in `text` (a reply made under [`ToolFormat::grammar`], or
    /// any text: what is not a well-formed call stays content).
    pub fn parse(self, text: &str) -> ToolOutput {
        match self {
            ToolFormat::Hermes => {
                let mut out = ToolOutput::default();
                let mut content = String::new();
                let mut rest = text;
                while let Some(at) = rest.find(HERMES_OPEN) {
                    let after = &rest[at + HERMES_OPEN.len()..];
                    let Some(end) = after.find(HERMES_CLOSE) else {
                        break;
                    };
                    match read_call(after[..end].trim(), "arguments") {
                        Some(call) => {
                            content.push_str(&rest[..at]);
                            out.calls.push(call);
                        }
                        None => content
                            .push_str(&rest[..at + HERMES_OPEN.len() + end + HERMES_CLOSE.len()]),
                    }
                    rest = &after[end + HERMES_CLOSE.len()..];
                }
                content.push_str(rest);
                out.content = content.trim().to_string();
                out
            }
            ToolFormat::Llama3 => match read_call(text.trim(), "parameters") {
                Some(call) => ToolOutput {
                    content: String::new(),
                    calls: vec![call],
                },
                None => ToolOutput {
                    content: text.trim().to_string(),
                    calls: Vec::new(),
                },
            },
        }
    }
}

/// A call from JSON `{"name": …, key: {…}}`; `None` when it is not one.
fn read_call(json: &str, key: &str) -> Option<ToolCall> {
    let value: Value = serde_json::from_str(json).ok()?;
    let name = value.get("name")?.as_str()?.to_string();
    let arguments = value.get(key).filter(|a| a.is_object())?.to_string();
    Some(ToolCall { name, arguments })
}

/// `grammar` as a Lark expression (a JSON schema inline; a Lark grammar is
/// not allowed inside another).
fn inline(grammar: &Grammar) -> Result<String, GrammarError> {
    match grammar {
        Grammar::JsonObject => Ok(format!("%json {}", with_layout(json!({"type": "object"})))),
        Grammar::JsonSchema(schema) => Ok(format!("%json {}", with_layout(schema.clone()))),
        Grammar::Lark(_) => Err(GrammarError::Invalid(
            "a Lark grammar cannot be combined with tools".into(),
        )),
    }
}

/// `text` with the regex metacharacters escaped, for a Lark `/…/`.
fn regex_syntax_escape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if "\\.+*?()|[]{}^$/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
