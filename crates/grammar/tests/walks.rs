//! Constrained JSON without a GPU: SmolLM2's real vocabulary, and a
//! "model" that picks uniformly among the ids the constraint leaves (a
//! seeded walk, the hardest case: no preference for closing anything).
//! Whatever it picks, the text parses and validates against the schema
//! (checked by the `jsonschema` crate, not by llguidance), and the
//! constraint ends the walk by itself.

use gerbil::{TextCodec, TokenConstraint};
use gerbil_grammar::tools::{Tool, ToolCall, ToolChoice, ToolFormat};
use gerbil_grammar::{Grammar, GrammarError, Grammars};
use gerbil_text::TokenBytes;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};

const VOCAB: usize = 49152;
const EOS: u32 = 2;

fn codec() -> Arc<TextCodec> {
    static CODEC: OnceLock<Arc<TextCodec>> = OnceLock::new();
    Arc::clone(CODEC.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/data/models/smollm2-135m/tokenizer.json"
        );
        let bytes = std::fs::read(path).expect("SmolLM2's tokenizer.json");
        Arc::new(TextCodec::from_tokenizer_json(&bytes).expect("tokenizer"))
    }))
}

fn grammars() -> &'static Grammars {
    static G: OnceLock<Grammars> = OnceLock::new();
    G.get_or_init(|| Grammars::for_vocabulary(codec(), VOCAB, &[EOS]).expect("grammars"))
}

/// A walk of at most `limit` tokens under `grammar`, choosing the
/// `seed`-th allowed id (mod their count) at each step; the text, and
/// whether the constraint completed.
fn walk(grammar: &Grammar, mut seed: u64, limit: usize) -> (String, bool) {
    let mut c = grammars().constraint(grammar).expect("compiles");
    let table = codec().token_bytes();
    let mut bytes = Vec::new();
    for _ in 0..limit {
        let mut logits = vec![0.0f32; VOCAB];
        c.mask(&mut logits).expect("mask");
        let allowed: Vec<u32> = (0..VOCAB as u32)
            .filter(|&i| logits[i as usize] == 0.0)
            .collect();
        assert!(!allowed.is_empty(), "nothing allowed after {bytes:?}");
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let token = allowed[(seed >> 33) as usize % allowed.len()];
        c.accept(token).expect("accept");
        match &table[token as usize] {
            TokenBytes::Text(b) => bytes.extend_from_slice(b),
            other => assert_eq!(token, EOS, "{other:?} chosen"),
        }
        if c.is_complete() || token == EOS {
            return (String::from_utf8(bytes).expect("UTF-8"), true);
        }
    }
    (String::from_utf8_lossy(&bytes).into_owned(), false)
}

/// Schemas whose every value is bounded, so a walk ends: nested objects,
/// enums, arrays, integers, numbers, booleans, nullable and `$ref`s.
fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 150}},
            "required": ["name", "age"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "sizes": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
                      "minItems": 1, "maxItems": 3}},
            "required": ["color", "sizes"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "point": {"type": "object", "properties": {
                "x": {"type": "integer", "minimum": 0, "maximum": 9},
                "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["x", "y"], "additionalProperties": false},
            "ok": {"type": "boolean"},
            "note": {"type": ["string", "null"], "maxLength": 4}},
            "required": ["point", "ok", "note"], "additionalProperties": false}),
        json!({"$defs": {"item": {"type": "object", "properties": {
                "id": {"type": "integer", "minimum": 1, "maximum": 99},
                "tag": {"const": "x"}},
                "required": ["id", "tag"], "additionalProperties": false}},
            "type": "object", "properties": {
                "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "maxItems": 2}},
            "required": ["items"], "additionalProperties": false}),
        json!({"type": "array", "items": {"enum": [1, 2.5, "three", null]}, "maxItems": 4}),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn every_walk_is_json_valid_against_its_schema(seed in any::<u64>(), which in 0usize..5) {
        let schema = schemas().swap_remove(which);
        let (text, complete) = walk(&Grammar::JsonSchema(schema.clone()), seed, 400);
        prop_assert!(complete, "no end after 400 tokens: {}", text);
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| TestCaseError::fail(format!("{text:?} does not parse: {e}")))?;
        let validator = jsonschema::validator_for(&schema).expect("a valid schema");
        prop_assert!(validator.is_valid(&value), "{} is not valid against {}", text, schema);
        prop_assert!(!text.contains('\n'), "one line: {}", text);
    }
}

#[test]
fn json_object_mode_gives_an_object() {
    // An object is unbounded: walk until the constraint completes, a few seeds.
    let mut ended = 0;
    for seed in 0..8 {
        let (text, complete) = walk(&Grammar::JsonObject, seed, 300);
        if complete {
            ended += 1;
            let v: Value = serde_json::from_str(&text).expect("parses");
            assert!(v.is_object(), "{text}");
        } else {
            assert!(text.starts_with('{'), "{text}");
        }
    }
    assert!(ended > 0, "no walk closed its object");
}

#[test]
fn a_lark_grammar_and_its_special_tokens() {
    let g = Grammar::Lark(r#"start: ("yes" | "no") "!""#.into());
    for seed in 0..4 {
        let (text, complete) = walk(&g, seed, 10);
        assert!(complete);
        assert!(text == "yes!" || text == "no!", "{text}");
    }
}

#[test]
fn bad_schemas_and_grammars_are_errors_before_any_token() {
    for bad in [
        Grammar::JsonSchema(json!({"type": "no-such-type"})),
        Grammar::JsonSchema(json!({"$ref": "#/$defs/missing"})),
        Grammar::Lark("start: undefined_rule".into()),
    ] {
        match grammars().constraint(&bad) {
            Err(GrammarError::Invalid(msg)) => assert!(!msg.is_empty()),
            Err(e) => panic!("{bad:?}: {e}"),
            Ok(_) => panic!("{bad:?} compiled"),
        }
    }
}

#[test]
fn a_vocabulary_wider_than_the_tokenizer_and_one_without_an_end() {
    let g = Grammars::for_vocabulary(codec(), VOCAB + 64, &[]).expect("padded");
    let mut c = g
        .constraint(&Grammar::Lark(r#"start: "ok""#.into()))
        .unwrap();
    let mut logits = vec![0.0f32; VOCAB + 64];
    c.mask(&mut logits).unwrap();
    assert!(logits[VOCAB..].iter().all(|&l| l == f32::NEG_INFINITY));
    let ok = codec().encode_plain("ok", false).unwrap();
    for t in ok {
        c.accept(t).unwrap();
    }
    assert!(c.is_complete(), "complete without an end-of-sequence id");
    assert!(matches!(
        Grammars::for_vocabulary(codec(), 100, &[EOS]),
        Err(GrammarError::Vocabulary(_))
    ));
}

fn weather_tools() -> Vec<Tool> {
    vec![
        Tool {
            name: "get_weather".into(),
            description: Some("The weather in a city".into()),
            parameters: json!({"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 6},
                "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": false}),
        },
        Tool {
            name: "add".into(),
            description: None,
            // As pydantic writes a model with a nested one: `$defs` and a
            // reference from the root of the parameters.
            parameters: json!({"$defs": {"Small": {"type": "integer", "minimum": 0, "maximum": 99}},
                "type": "object", "properties": {
                "a": {"$ref": "#/$defs/Small"},
                "b": {"$ref": "#/$defs/Small"}},
                "required": ["a", "b"], "additionalProperties": false}),
        },
    ]
}

/// Whether `call` names one of `tools` with arguments valid against its schema.
fn valid_call(tools: &[Tool], call: &ToolCall) -> bool {
    let Some(tool) = tools.iter().find(|t| t.name == call.name) else {
        return false;
    };
    let args: Value = serde_json::from_str(&call.arguments).expect("arguments parse");
    jsonschema::validator_for(&tool.parameters)
        .expect("schema")
        .is_valid(&args)
}

/// Under `required` or a named choice, every walk is one or more whole,
/// valid calls, read back by `parse` with nothing left over; rendering the
/// calls gives the text again.
#[test]
fn required_and_named_tool_calls_are_whole_valid_calls() {
    let tools = weather_tools();
    for format in [ToolFormat::Hermes, ToolFormat::Llama3] {
        for (choice, parallel) in [
            (ToolChoice::Required, true),
            (ToolChoice::Required, false),
            (ToolChoice::Named("add".into()), true),
        ] {
            let grammar = format.grammar(&tools, &choice, parallel, None).unwrap();
            for seed in 0..6 {
                let (text, complete) = walk(&grammar, seed, 300);
                assert!(complete, "{format:?} {choice:?}: {text}");
                let out = format.parse(&text);
                assert_eq!(out.content, "", "{text}");
                assert!(!out.calls.is_empty(), "{text}");
                assert!(parallel || out.calls.len() == 1, "{text}");
                for call in &out.calls {
                    assert!(valid_call(&tools, call), "{call:?} in {text}");
                    if let ToolChoice::Named(n) = &choice {
                        assert_eq!(&call.name, n);
                    }
                }
                assert_eq!(format.render(&out.calls), text);
            }
        }
    }
}

/// Under `auto`, a walk is text that never begins like a call, or calls;
/// with a response format, the text is JSON of that format.
#[test]
fn auto_tool_choice_gives_text_or_calls() {
    let tools = weather_tools();
    let format = ToolFormat::Hermes;
    let grammar = format
        .grammar(&tools, &ToolChoice::Auto, true, None)
        .unwrap();
    for seed in 0..12 {
        let (text, _) = walk(&grammar, seed, 40);
        let out = format.parse(&text);
        if text.starts_with("<tool_call>") {
            assert!(out.content.is_empty() || !out.calls.is_empty(), "{text}");
        } else {
            assert!(!text.starts_with(char::is_whitespace), "{text:?}");
        }
    }
    let schema = json!({"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
                        "required": ["answer"], "additionalProperties": false});
    let with_format = format
        .grammar(
            &tools,
            &ToolChoice::Auto,
            false,
            Some(&Grammar::JsonSchema(schema)),
        )
        .unwrap();
    for seed in 0..8 {
        let (text, complete) = walk(&with_format, seed, 300);
        assert!(complete, "{text}");
        let out = format.parse(&text);
        if out.calls.is_empty() {
            let v: Value = serde_json::from_str(&text).expect("JSON answer");
            assert!(v["answer"] == "yes" || v["answer"] == "no", "{text}");
        } else {
            assert!(out.calls.iter().all(|c| valid_call(&tools, c)), "{text}");
        }
    }
}

#[test]
fn formats_follow_the_template_and_parse_leaves_non_calls_as_content() {
    assert_eq!(
        ToolFormat::for_template(Some("{{ '<tool_call>' }}")),
        (ToolFormat::Hermes, true)
    );
    assert_eq!(
        ToolFormat::for_template(Some("<|python_tag|>")),
        (ToolFormat::Llama3, true)
    );
    assert_eq!(ToolFormat::for_template(None), (ToolFormat::Hermes, false));
    let out = ToolFormat::Hermes.parse(
        "Let me see. <tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call> \
         <tool_call>not json</tool_call>",
    );
    assert_eq!(
        out.calls,
        vec![ToolCall {
            name: "add".into(),
            arguments: "{\"a\":1,\"b\":2}".into()
        }]
    );
    assert_eq!(out.content, "Let me see.  <tool_call>not json</tool_call>");
    let prompt = ToolFormat::Hermes.system_prompt(&weather_tools());
    assert!(prompt.contains("\"get_weather\"") && prompt.contains("<tool_call>"));
    assert!(ToolFormat::Hermes
        .grammar(
            &weather_tools(),
            &ToolChoice::Named("nope".into()),
            true,
            None
        )
        .is_err());
}
