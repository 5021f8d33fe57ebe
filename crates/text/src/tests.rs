//! Checks against references recorded with Python transformers 5.23 / tokenizers 0.23
//! (`tests/data/refs/`, schema in the fixtures README).
//!
//! The codecs are built from a checkpoint's text assets as the frontend reads them
//! (`gerbil_frontend_hf::TextAssets`, a dev-dependency) with the same builder calls
//! [`TextCodec::from_plan`] makes from what the compiler stored of those assets.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::{ChatMessage, TextCodec, TextError, TokenBytes};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data");

fn json(rel: &str) -> Json {
    let path = Path::new(DATA).join(rel);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap()
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn s(v: &Json) -> &str {
    v.as_str().unwrap()
}

/// The codec of an HF checkpoint directory, through the frontend's reader of its text assets.
fn from_hf_dir(dir: &Path) -> TextCodec {
    from_assets(gerbil_frontend_hf::TextAssets::load(dir).unwrap())
}

/// The codec built from text assets: tokenizer, special tokens, template.
fn from_assets(assets: gerbil_frontend_hf::TextAssets) -> TextCodec {
    let tokenizer = assets.tokenizer_json.as_deref().expect("tokenizer.json");
    let codec = TextCodec::from_tokenizer_json(tokenizer)
        .unwrap()
        .with_special_tokens(assets.bos_token, assets.eos_token);
    match assets.chat_template {
        Some(t) => codec.with_chat_template(t).unwrap(),
        None => codec,
    }
}

/// The codec of the GGUF file a real fixture was made from
/// (`$GERBIL_FIXTURES/<name>/gguf/<file>`, linked by build-fixtures.py),
/// through the frontend's GGUF reader.
fn from_gguf(name: &str, file: &str) -> Option<TextCodec> {
    let Some(root) = std::env::var_os("GERBIL_FIXTURES") else {
        eprintln!("skipping: GERBIL_FIXTURES is not set (scripts/build-fixtures.py --out DIR all)");
        return None;
    };
    let path = PathBuf::from(root).join(name).join("gguf").join(file);
    let ckpt = gerbil_frontend_hf::Checkpoint::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Some(from_assets(ckpt.text))
}

fn smollm2() -> TextCodec {
    from_hf_dir(&Path::new(DATA).join("models/smollm2-135m"))
}

/// Gemma's tokenizer.json (33 MB) is not in the repository; the fixture builder writes it.
fn gemma() -> Option<TextCodec> {
    let Some(root) = std::env::var_os("GERBIL_FIXTURES") else {
        eprintln!("skipping: GERBIL_FIXTURES is not set (scripts/build-fixtures.py --out DIR gemma3-270m)");
        return None;
    };
    let dir = PathBuf::from(root).join("gemma3-270m");
    if !dir.join("tokenizer.json").exists() {
        eprintln!(
            "skipping: {} has no tokenizer.json (build-fixtures.py gemma3-270m)",
            dir.display()
        );
        return None;
    }
    Some(from_hf_dir(&dir))
}

/// Every case of a `tokenizer-ref-v1` file: encode both ways, decode both ways.
fn check_tokenizer_ref(codec: &TextCodec, rel: &str) {
    let cases = json(rel)["cases"].as_array().unwrap().clone();
    assert_eq!(cases.len(), 20);
    let table = codec.token_bytes();
    assert_eq!(table.len(), codec.vocab_size());
    for case in &cases {
        let text = s(&case["text"]);
        let plain = ids(&case["ids"]);
        assert_eq!(
            codec.encode_plain(text, false).unwrap(),
            plain,
            "ids of {text:?}"
        );
        assert_eq!(
            codec.encode(text).unwrap(),
            ids(&case["ids_add_special_tokens"]),
            "ids+special of {text:?}"
        );
        assert_eq!(
            codec.decode(&plain, false).unwrap(),
            s(&case["decoded"]),
            "decode of {text:?}"
        );
        assert_eq!(
            codec.decode(&plain, true).unwrap(),
            s(&case["decoded_skip_special"]),
            "decode skip of {text:?}"
        );
        let tokens: Vec<String> = plain
            .iter()
            .map(|&id| codec.id_to_token(id).unwrap())
            .collect();
        let want: Vec<&str> = case["tokens"].as_array().unwrap().iter().map(s).collect();
        assert_eq!(tokens, want, "tokens of {text:?}");
        check_stream(codec, &[], &plain);
        check_token_bytes(codec, &table, &plain, s(&case["decoded_skip_special"]));
    }
}

/// The bytes of `ids` in `table` (special tokens left out), joined, are the text they
/// decode to: what a grammar sees is what the user gets. A SentencePiece
/// decoder drops the space that begins the text (`Strip`), so only the
/// ends are compared there.
fn check_token_bytes(codec: &TextCodec, table: &[TokenBytes], ids: &[u32], decoded: &str) {
    let mut bytes = Vec::new();
    for &id in ids {
        match &table[id as usize] {
            TokenBytes::Text(b) => bytes.extend_from_slice(b),
            TokenBytes::Special(content) => {
                assert_eq!(codec.id_to_token(id).as_deref(), Some(content.as_str()))
            }
            TokenBytes::Unused => panic!("id {id} of an encoding is unused"),
        }
    }
    let text = String::from_utf8(bytes).expect("whole tokens are whole characters");
    assert!(
        text == decoded || text.strip_prefix(' ') == Some(decoded),
        "{text:?} against {decoded:?}"
    );
}

/// Prompts of a `real-ref-v1` file: chat prompts through the template, raw text through the
/// tokenizer, and the streaming decoder over prompt and generated ids.
fn check_model_ref(codec: &TextCodec, rel: &str) {
    let reference = json(rel);
    for prompt in reference["prompts"].as_array().unwrap() {
        let id = s(&prompt["id"]);
        let text = s(&prompt["text"]);
        let input_ids = ids(&prompt["input_ids"]);
        let add_special = prompt["add_special_tokens"].as_bool().unwrap();
        match s(&prompt["kind"]) {
            "chat" => {
                let messages: Vec<ChatMessage> =
                    serde_json::from_value(prompt["messages"].clone()).unwrap();
                assert_eq!(
                    codec.apply_chat_template(&messages, true).unwrap(),
                    text,
                    "{id}"
                );
                assert!(
                    !add_special,
                    "{id}: chat prompts are tokenized without special tokens"
                );
                assert_eq!(
                    codec.encode_chat(&messages, true).unwrap(),
                    input_ids,
                    "{id}"
                );
            }
            // hand-written turns (Gemma base has no template) and raw text: tokenize as recorded
            _ => assert_eq!(
                codec.encode_plain(text, add_special).unwrap(),
                input_ids,
                "{id}"
            ),
        }
        if add_special {
            assert_eq!(codec.encode(text).unwrap(), input_ids, "{id}");
        }
        let greedy = ids(&prompt["greedy_ids"]);
        assert_eq!(
            codec.decode(&greedy, false).unwrap(),
            s(&prompt["generated_text"]),
            "{id}"
        );
        let all: Vec<u32> = input_ids.iter().chain(&greedy).copied().collect();
        check_stream(codec, &[], &all);
        check_stream(codec, &input_ids, &greedy);
    }
}

/// Streams `ids` (after `context`) one at a time; the pieces must add up to the decoded text.
fn check_stream(codec: &TextCodec, context: &[u32], ids: &[u32]) {
    for skip in [false, true] {
        let mut stream = codec.stream_decoder(skip).with_context(context);
        let mut out = String::new();
        for &id in ids {
            let piece = stream.push(id).unwrap();
            assert!(
                !piece.contains('\u{FFFD}'),
                "half a character emitted: {piece:?}"
            );
            out.push_str(&piece);
        }
        out.push_str(&stream.finish().unwrap());
        let with_context: Vec<u32> = context.iter().chain(ids).copied().collect();
        let full = codec.decode(&with_context, skip).unwrap();
        let before = codec.decode(context, skip).unwrap();
        assert_eq!(
            Some(out.as_str()),
            full.strip_prefix(&before),
            "stream of {ids:?} (skip={skip})"
        );
    }
}

#[test]
fn smollm2_tokenizer_matches_transformers() {
    check_tokenizer_ref(&smollm2(), "refs/tokenizer_smollm2-135m.json");
}

#[test]
fn smollm2_prompts_match_transformers() {
    check_model_ref(&smollm2(), "refs/smollm2-135m.json");
}

#[test]
fn smollm2_gguf_tokenizer_matches_transformers() {
    if let Some(codec) = from_gguf("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf") {
        check_tokenizer_ref(&codec, "refs/tokenizer_smollm2-135m.json");
        check_model_ref(&codec, "refs/smollm2-135m.json");
    }
}

#[test]
fn gemma3_gguf_tokenizer_matches_transformers() {
    if let Some(codec) = from_gguf("gemma3-270m", "gemma-3-270m-q4_k_m.gguf") {
        assert_eq!(codec.bos_token(), Some("<bos>"));
        check_tokenizer_ref(&codec, "refs/tokenizer_gemma3-270m.json");
        check_model_ref(&codec, "refs/gemma3-270m.json");
    }
}

#[test]
fn gemma3_matches_transformers_when_fixture_built() {
    if let Some(codec) = gemma() {
        assert!(!codec.has_chat_template());
        assert_eq!(codec.bos_token(), Some("<bos>"));
        check_tokenizer_ref(&codec, "refs/tokenizer_gemma3-270m.json");
        check_model_ref(&codec, "refs/gemma3-270m.json");
    }
}

#[test]
fn hf_dir_loads_special_tokens_and_template() {
    let codec = smollm2();
    assert_eq!(codec.bos_token(), Some("<|im_start|>"));
    assert_eq!(codec.eos_token(), Some("<|im_end|>"));
    assert_eq!(codec.token_to_id("<|im_end|>"), Some(2));
    assert_eq!(codec.vocab_size(), 49152);
    assert!(codec.has_chat_template());
}

#[test]
fn stream_waits_for_whole_characters() {
    let codec = smollm2();
    let ids = codec.encode("🥞").unwrap();
    assert!(
        ids.len() > 1,
        "the emoji should span several byte-level tokens: {ids:?}"
    );
    let mut stream = codec.stream_decoder(false);
    let pieces: Vec<String> = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
    assert!(
        pieces[..ids.len() - 1].iter().all(String::is_empty),
        "{pieces:?}"
    );
    assert_eq!(pieces.last().map(String::as_str), Some("🥞"));
    // cut short: finish() flushes the incomplete character as decode() would
    let mut stream = codec.stream_decoder(false);
    assert_eq!(stream.push(ids[0]).unwrap(), "");
    assert_eq!(
        stream.finish().unwrap(),
        codec.decode(&ids[..1], false).unwrap()
    );
    assert_eq!(stream.finish().unwrap(), "");
}

fn tiny_codec(template: &str) -> Result<TextCodec, TextError> {
    let bytes = std::fs::read(Path::new(DATA).join("models/smollm2-135m/tokenizer.json")).unwrap();
    TextCodec::from_tokenizer_json(&bytes)?
        .with_special_tokens(Some("<s>".into()), Some("</s>".into()))
        .with_chat_template(template)
}

#[test]
fn template_sees_transformers_variables() {
    let codec = tiny_codec(
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}\
         [{{ m.role | upper }}] {{ m.content.strip() }}{{ eos_token }}\n{% endfor %}\
         {% if add_generation_prompt %}[ASSISTANT]{% endif %}",
    )
    .unwrap();
    let messages = [
        ChatMessage::new("system", "ignored"),
        ChatMessage::new("user", "  hi <there> & 'you'  "),
    ];
    assert_eq!(
        codec.apply_chat_template(&messages, true).unwrap(),
        "<s>[USER] hi <there> & 'you'</s>\n[ASSISTANT]"
    );
    assert_eq!(
        codec.apply_chat_template(&messages, false).unwrap(),
        "<s>[USER] hi <there> & 'you'</s>\n"
    );
}

#[test]
fn errors_are_reported_not_panicked() {
    let invalid = TextCodec::from_tokenizer_json(b"{\"not\": \"a tokenizer\"}");
    assert!(
        matches!(invalid, Err(TextError::InvalidTokenizer { .. })),
        "{invalid:?}"
    );
    assert!(matches!(
        TextCodec::from_tokenizer_json(b"\xff\x00"),
        Err(TextError::InvalidTokenizer { .. })
    ));

    let bytes = std::fs::read(Path::new(DATA).join("models/smollm2-135m/tokenizer.json")).unwrap();
    let bare = TextCodec::from_tokenizer_json(&bytes).unwrap();
    let err = bare
        .encode_chat(&[ChatMessage::new("user", "hi")], true)
        .unwrap_err();
    assert!(matches!(err, TextError::NoChatTemplate));
    assert!(err.to_string().contains("has no chat template"), "{err}");

    let err = tiny_codec("{% for m in messages %}").unwrap_err();
    assert!(matches!(err, TextError::TemplateSyntax { .. }), "{err:?}");

    let codec = tiny_codec(
        "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}\
         {{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
    )
    .unwrap();
    match codec.apply_chat_template(&[ChatMessage::new("tool", "x")], true) {
        Err(TextError::TemplateRaised { message }) => {
            assert_eq!(message, "Only user and assistant roles are supported!")
        }
        other => panic!("expected TemplateRaised, got {other:?}"),
    }
    let codec = tiny_codec("{{ messages[0].content.no_such_method() }}").unwrap();
    let err = codec
        .apply_chat_template(&[ChatMessage::new("user", "x")], true)
        .unwrap_err();
    assert!(matches!(err, TextError::TemplateRender { .. }), "{err:?}");

    // ids outside the vocabulary are dropped, as in Python
    assert_eq!(bare.decode(&[19556, u32::MAX], false).unwrap(), "Hello");
}

#[test]
fn tools_reach_the_template_and_their_absence_is_falsy() {
    let src =
        "{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %};{% endif %}\
               {% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
    let codec = smollm2().with_chat_template(src).unwrap();
    let messages = [ChatMessage::new("user", "hi")];
    let tools = serde_json::json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {}}},
        {"type": "function", "function": {"name": "add", "parameters": {}}}
    ]);
    assert_eq!(
        codec
            .apply_chat_template_with_tools(&messages, Some(&tools), false)
            .unwrap(),
        "tools: get_weather add;user: hi\n"
    );
    assert_eq!(
        codec.apply_chat_template(&messages, false).unwrap(),
        "user: hi\n"
    );
    assert_eq!(codec.chat_template(), Some(src));
}
