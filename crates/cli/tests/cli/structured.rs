//! Structured output and tool calls through `gerbil-run PLAN serve`, as an
//! OpenAI client uses them: `response_format` with JSON schemas (greedy
//! and sampled, every answer parsed and validated by the `jsonschema`
//! crate), JSON mode, tool calls whole and streamed, a tool answer fed back,
//! the errors, and the OpenAI Python client's `parse` with a pydantic model.
//! On the tiny Llama with random weights: its answers have no sense, so
//! whatever form they take is the grammar's doing. The plan has a batch
//! schedule, so the server answers through continuous batching.

use crate::common::*;
use crate::serve::{error_of, Server};
use serde_json::{json, Value};
use std::sync::OnceLock;

fn plan() -> &'static std::path::Path {
    static PLAN: OnceLock<std::path::PathBuf> = OnceLock::new();
    // A batch schedule: the server decodes these requests together, so
    // constraints run through `gerbil::Batch` (the serve tests cover one
    // request at a time).
    PLAN.get_or_init(|| {
        let args = ["--max-context", "2048", "--max-batch", "4"];
        tiny_text_plan(&process_dir("structured"), &args)
    })
}

/// Schemas with nested objects, enums, arrays and numbers, each value
/// bounded so a random model's answer ends.
fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 10},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3}},
            "required": ["name", "age", "pets"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "position": {"type": "object", "properties": {
                "lat": {"type": "integer", "minimum": -90, "maximum": 90},
                "lon": {"type": "integer", "minimum": -180, "maximum": 180}},
                "required": ["lat", "lon"], "additionalProperties": false},
            "label": {"enum": ["home", "work", null]},
            "score": {"type": "integer", "minimum": 0, "maximum": 100},
            "weight": {"enum": [0.5, 2.25, -1e3]}},
            "required": ["position", "label"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "object", "properties": {
            "ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["ok", "n"], "additionalProperties": false}, "minItems": 1, "maxItems": 2}),
        json!({"$defs": {"leaf": {"type": "object", "properties": {"v": {"enum": [1, 2, 3]}},
                                  "required": ["v"], "additionalProperties": false}},
               "type": "object", "properties": {
                   "left": {"$ref": "#/$defs/leaf"}, "right": {"$ref": "#/$defs/leaf"}},
               "required": ["left", "right"], "additionalProperties": false}),
    ]
}

fn chat(content: &str) -> Value {
    json!([{"role": "user", "content": content}])
}

fn message(v: &Value) -> &Value {
    &v["choices"][0]["message"]
}

/// Every value of the schemas is bounded (a random model writes the digits
/// of an unbounded number forever), so the finish reason must be `stop`:
/// the grammar, not the token limit, ended every answer.
#[test]
fn json_schema_answers_parse_and_validate_greedy_and_sampled() {
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let server = Server::start(plan(), &[]);
    let schemas = schemas();
    for i in 0..20 {
        let schema = &schemas[i % schemas.len()];
        let mut body = json!({
            "messages": chat(&format!("answer {i}")),
            "max_tokens": 400,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "answer", "strict": true, "schema": schema}},
        });
        if i % 2 == 0 {
            body["temperature"] = json!(0);
        } else {
            body["temperature"] = json!(1.0);
            body["seed"] = json!(i);
        }
        let (status, v) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        let text = message(&v)["content"].as_str().expect("content");
        let answer: Value =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?} does not parse: {e}"));
        let validator = jsonschema::validator_for(schema).unwrap();
        assert!(validator.is_valid(&answer), "{text} against {schema}");
    }
    // JSON mode: an object. The tiny model may write a long one; it parses
    // whenever it ends by itself.
    let (status, v) = server.post(
        "/v1/chat/completions",
        &json!({"messages": chat("json"), "temperature": 0, "max_tokens": 300,
                "response_format": {"type": "json_object"}}),
    );
    assert_eq!(status, 200, "{v}");
    let text = message(&v)["content"].as_str().unwrap();
    assert!(text.starts_with('{'), "{text}");
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(text).unwrap().is_object());
    }
    // Streamed, the same text as whole.
    let body = json!({"messages": chat("answer 0"), "temperature": 0, "max_tokens": 400,
                      "stream": true, "response_format": {"type": "json_schema",
                      "json_schema": {"name": "a", "schema": schemas[0]}}});
    let (_, whole) = server.post("/v1/chat/completions", &{
        let mut b = body.clone();
        b["stream"] = json!(false);
        b
    });
    let streamed: String = server
        .stream("/v1/chat/completions", &body)
        .all_data()
        .iter()
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| {
            let c: Value = serde_json::from_str(d).unwrap();
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(streamed, message(&whole)["content"].as_str().unwrap());
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather",
         "description": "The weather in a city",
         "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add",
         "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 99},
            "b": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["a", "b"], "additionalProperties": false}}}
    ])
}

/// A `tool_calls` entry is well-formed: an id, type `function`, a name
/// among the tools, arguments (a string) that parse and validate.
fn check_call(call: &Value) -> String {
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    assert_eq!(call["type"], "function", "{call}");
    let name = call["function"]["name"].as_str().unwrap().to_string();
    let tools = tools();
    let tool = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not a tool"));
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .expect("arguments are JSON text");
    let validator = jsonschema::validator_for(&tool["function"]["parameters"]).unwrap();
    assert!(validator.is_valid(&args), "{call}");
    name
}

#[test]
fn tool_calls_whole_streamed_and_answered() {
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let server = Server::start(plan(), &[]);
    for (i, choice) in [
        json!("required"),
        json!({"type": "function", "function": {"name": "add"}}),
    ]
    .into_iter()
    .enumerate()
    {
        for seed in 0..3 {
            let body = json!({"messages": chat("What is 2 + 3?"), "tools": tools(),
                              "tool_choice": choice, "temperature": 0.8, "seed": seed,
                              "max_tokens": 300});
            let (status, v) = server.post("/v1/chat/completions", &body);
            assert_eq!(status, 200, "{v}");
            assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
            let m = message(&v);
            assert!(m["content"].is_null(), "{v}");
            let calls = m["tool_calls"].as_array().expect("tool_calls");
            assert!(!calls.is_empty());
            for call in calls {
                let name = check_call(call);
                if i == 1 {
                    assert_eq!(name, "add");
                }
            }
        }
    }
    // One call at most without parallel calls; streamed as deltas that a
    // client joins by index into the same calls as the whole answer.
    let body = json!({"messages": chat("weather?"), "tools": tools(), "tool_choice": "required",
                      "parallel_tool_calls": false, "temperature": 0, "max_tokens": 300});
    let (_, whole) = server.post("/v1/chat/completions", &body);
    let calls = message(&whole)["tool_calls"].as_array().unwrap().clone();
    assert_eq!(calls.len(), 1, "{whole}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = server.stream("/v1/chat/completions", &streamed).all_data();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut joined: Vec<Value> = Vec::new();
    let mut finish = Value::Null;
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        let choice = &c["choices"][0];
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
        for d in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let index = d["index"].as_u64().unwrap() as usize;
            if joined.len() <= index {
                joined.push(json!({"id": d["id"], "type": d["type"],
                                   "function": {"name": d["function"]["name"], "arguments": ""}}));
            }
            let args = joined[index]["function"]["arguments"]
                .as_str()
                .unwrap()
                .to_string()
                + d["function"]["arguments"].as_str().unwrap_or("");
            joined[index]["function"]["arguments"] = json!(args);
        }
        assert!(
            choice["delta"]
                .get("content")
                .is_none_or(|c| c == "" || c.is_null()),
            "{c}"
        );
    }
    assert_eq!(finish, "tool_calls");
    assert_eq!(joined.len(), 1);
    check_call(&joined[0]);
    assert_eq!(joined[0]["function"], calls[0]["function"]);

    // The call and its answer fed back: the conversation goes on, and
    // `auto` lets the model answer in text or call again.
    let call = &calls[0];
    let body = json!({"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}],
        "tools": tools(), "temperature": 0, "max_tokens": 40});
    let (status, v) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    let m = message(&v);
    match v["choices"][0]["finish_reason"].as_str() {
        Some("tool_calls") => m["tool_calls"].as_array().unwrap().iter().for_each(|c| {
            check_call(c);
        }),
        Some(_) => assert!(
            !m["content"].as_str().unwrap().starts_with("<tool_call>"),
            "{v}"
        ),
        None => panic!("{v}"),
    }
}

#[test]
fn malformed_forms_and_schemas_are_400s_naming_the_field() {
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let server = Server::start(plan(), &[]);
    for (body, param) in [
        (
            json!({"messages": chat("x"), "response_format": {"type": "json_schema",
                   "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/nowhere"}}}}),
            "response_format",
        ),
        (
            json!({"messages": chat("x"), "response_format": {"type": "yaml"}}),
            "response_format",
        ),
        (
            json!({"messages": chat("x"), "tools": [{"type": "function"}]}),
            "tools",
        ),
        (
            json!({"messages": chat("x"), "tools": tools(),
                   "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tools",
        ),
        (json!({"prompt": "x", "tools": tools()}), "tools"),
        (
            json!({"messages": chat("x"), "functions": [{"name": "f"}]}),
            "functions",
        ),
    ] {
        let path = if body.get("prompt").is_some() {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        let (status, v) = server.post(path, &body);
        error_of(status, &v, 400, Some(param));
    }
}

/// The OpenAI Python client (installed by scripts/install-deps.sh) parses
/// the answer into a pydantic model with `chat.completions.parse`, and a
/// strict tool's call, whole and streamed, into the tool's model.
#[test]
fn the_openai_python_client_parses_into_a_pydantic_model() {
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let server = Server::start(plan(), &[]);
    let said = server.run_client("openai-parse-check.py", &[]);
    assert!(said.contains("parsed 3 answers"), "{said}");
    assert!(said.contains("parsed tool calls"), "{said}");
}

/// Short schemas for a real model: enums, small integers, booleans, nested
/// objects and arrays, so every answer ends in a few tokens on lavapipe.
fn short_schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {
            "answer": {"enum": ["yes", "no"]},
            "count": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["answer", "count"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "city": {"enum": ["Paris", "London", "Rome"]},
            "sunny": {"type": "boolean"}},
            "required": ["city", "sunny"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                       "minItems": 1, "maxItems": 2}},
            "required": ["colors"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "point": {"type": "object", "properties": {
                "x": {"type": "integer", "minimum": 0, "maximum": 9},
                "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["x", "y"], "additionalProperties": false}},
            "required": ["point"], "additionalProperties": false}),
    ]
}

/// SmolLM2 (real weights and tokenizer), served with a batch schedule: 8
/// `json_schema` requests, each schema greedy and sampled, all at once, all
/// end with their JSON (`stop`) and validate. Eight, not more: on lavapipe a
/// SmolLM2 batch step costs about half a second per row.
#[test]
fn smollm2_answers_eight_schemas_in_a_batch() {
    const REQUESTS: usize = 8;
    let (_dir, plan) = compile(
        &smollm2_dir(),
        "smollm2-batch",
        &["--max-context", "256", "--max-batch", &REQUESTS.to_string()],
    );
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let slots = REQUESTS.to_string();
    let server = std::sync::Arc::new(Server::start(&plan, &["--slots", &slots]));
    let schemas = short_schemas();
    let requests: Vec<(Value, Value)> = (0..REQUESTS)
        .map(|i| {
            let schema = schemas[(i / 2) % schemas.len()].clone();
            let mut body = json!({
                "messages": chat(&format!("Question {i}: answer as JSON.")),
                "max_tokens": 40,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "a", "schema": schema}},
            });
            if i % 2 == 0 {
                body["temperature"] = json!(0);
            } else {
                body["temperature"] = json!(0.8);
                body["seed"] = json!(i);
            }
            (body, schema)
        })
        .collect();
    let threads: Vec<_> = requests
        .into_iter()
        .map(|(body, schema)| {
            let server = std::sync::Arc::clone(&server);
            std::thread::spawn(move || (server.post("/v1/chat/completions", &body), schema))
        })
        .collect();
    for t in threads {
        let ((status, v), schema) = t.join().unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        let text = message(&v)["content"].as_str().unwrap();
        let answer: Value =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?} does not parse: {e}"));
        let validator = jsonschema::validator_for(&schema).unwrap();
        assert!(validator.is_valid(&answer), "{text} against {schema}");
    }
}
