//! [`Engine`]: one plan loaded on the browser's WebGPU device, answering chats and prompts.
//!
//! Built for a Web Worker: [`Engine::load`] reads the plan through a synchronous reader (see
//! [`crate::js_source`]) and uploads its weights; [`Engine::generate`] runs one request — a
//! conversation through the plan's chat template, a text prompt, or token ids (for plans
//! without a tokenizer) — and streams each token's id and text to a callback, the model keeping
//! the conversation's tokens in its KV cache so the next turn runs only what is new (the page
//! sends the whole conversation each time); [`Engine::stop`] ends the answer in progress at its
//! next token. Errors reach JavaScript as `Error`s whose message is gerbil's (device lost, out
//! of memory, a limit the adapter lacks with the fix, a plan without a tokenizer given text), so
//! the page can show them as they are. Timing is the page's: std has no clock in a browser.

use crate::js_source::{describe, progress_hook, JsSource};
use crate::settings::PageSettings;
use gerbil::{CancelToken, ChatMessage, FinishReason, Model, ModelOptions, SessionOptions};
use gerbil_plan::PlanFile;
use js_sys::{Function, Promise};
use serde_json::json;
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

/// Tokens an answer may take when the page sets no `max_tokens` and the model's config none.
const DEFAULT_MAX_TOKENS: usize = 512;

/// A plan resident on the browser's GPU.
#[wasm_bindgen]
pub struct Engine {
    /// Taken out while an answer runs (a second `generate` meanwhile is refused).
    model: Rc<RefCell<Option<Model>>>,
    /// Ends the answer in progress.
    cancel: Rc<RefCell<Option<CancelToken>>>,
    info: String,
}

#[wasm_bindgen]
impl Engine {
    /// Loads the plan of `size` bytes that `read(at, len)` returns as `Uint8Array`s (`name`
    /// stands for it in errors), telling `progress(done, total)` the weight bytes uploaded.
    /// Picks the fastest of the plan's variants the adapter runs.
    pub async fn load(
        name: String,
        size: f64,
        read: Function,
        progress: Function,
    ) -> Result<Engine, JsError> {
        let source = JsSource::new(size as u64, read);
        let plan = PlanFile::from_source(name, Box::new(source)).map_err(error)?;
        let (hook, _guard) = progress_hook(progress);
        let opts = ModelOptions {
            session: SessionOptions {
                progress: Some(hook),
                ..SessionOptions::default()
            },
            template_sandbox: None,
        };
        let model = Model::load(&plan, &opts).await.map_err(error)?;
        let info = describe_model(&model).to_string();
        Ok(Engine {
            model: Rc::new(RefCell::new(Some(model))),
            cancel: Rc::new(RefCell::new(None)),
            info,
        })
    }

    /// What runs: model, adapter, variant, context, GPU memory and the engine's wasm memory, as
    /// JSON.
    pub fn info(&self) -> String {
        self.info.clone()
    }

    /// Answers `request` (JSON, one of `{"messages": [{"role", "content"}]}`, `{"prompt":
    /// "text"}` or `{"input_ids": [ids]}`) with `settings` (JSON, see [`PageSettings`]),
    /// calling `on_token(text, id)` with each token generated (`text` is what it makes
    /// printable, often empty). Resolves to JSON stats: the generated ids (`output_ids`),
    /// prompt, cached and generated tokens, the prompt's and the decode's milliseconds
    /// (`prefill_ms`, `decode_ms`), the decode rate (`decode_tok_s`, null below two tokens), and
    /// why it finished.
    pub fn generate(&self, request: String, settings: String, on_token: Function) -> Promise {
        let model = self.model.clone();
        let cancel = self.cancel.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let Some(mut taken) = model.borrow_mut().take() else {
                return Err(js_error("an answer is already running; stop it first"));
            };
            let answer = answer(&mut taken, &cancel, &request, &settings, &on_token).await;
            *model.borrow_mut() = Some(taken);
            cancel.borrow_mut().take();
            answer.map(JsValue::from).map_err(|e| js_error(&e))
        })
    }

    /// Ends the answer in progress at its next token (nothing when none runs).
    pub fn stop(&self) {
        if let Some(token) = &*self.cancel.borrow() {
            token.cancel();
        }
    }

    /// The plan's self-test (`gerbil-run PLAN selftest`) in this browser: every variant its
    /// adapter runs against the reference the plan carries, the plan of `size` bytes read through
    /// `read(at, len)` as [`Engine::load`] reads it. Resolves to the report as JSON (`device`,
    /// `steps`, `max_abs`, `variants`: name, precision, status, max |Δ|, tolerance, reason) with
    /// `passed`; rejects when the plan has none. Sessions open one at a time beside the loaded
    /// model's, so the GPU holds two copies of the weights meanwhile.
    pub async fn selftest(name: String, size: f64, read: Function) -> Result<String, JsError> {
        let source = JsSource::new(size as u64, read);
        let plan = PlanFile::from_source(name, Box::new(source)).map_err(error)?;
        let report = gerbil_runtime::selftest::run(&plan, &SessionOptions::default())
            .await
            .map_err(error)?;
        let mut json = serde_json::to_value(&report).map_err(error)?;
        json["passed"] = report.passed().into();
        Ok(json.to_string())
    }

    /// Forgets the conversation the KV cache holds (the next answer runs its whole prompt).
    pub fn clear(&self) {
        if let Some(model) = &mut *self.model.borrow_mut() {
            model.clear_cache();
        }
    }
}

/// What [`Engine::generate`] is asked to continue.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
enum Request {
    /// A conversation, through the chat template.
    Messages(Vec<ChatMessage>),
    /// Text, tokenized as `tokenizer(text)` would.
    Prompt(String),
    /// Token ids as they are.
    InputIds(Vec<u32>),
}

/// One answer (see [`Engine::generate`]); the error is the page's message.
async fn answer(
    model: &mut Model,
    cancel: &RefCell<Option<CancelToken>>,
    request: &str,
    settings: &str,
    on_token: &Function,
) -> Result<String, String> {
    let request: Request = serde_json::from_str(request)
        .map_err(|e| format!("request: {e} (give one of messages, prompt or input_ids)"))?;
    let settings = PageSettings::parse(settings)?.request();
    let defaults = model.session().header().text.generation;
    let resolved = settings.resolve(&defaults, DEFAULT_MAX_TOKENS, || {
        (js_sys::Math::random() * 9_007_199_254_740_992.0) as u64
    });
    let prompt = match request {
        Request::Messages(messages) => model.encode_chat(&messages),
        Request::Prompt(text) => model.encode(&text),
        Request::InputIds(ids) => Ok(ids),
    }
    .map_err(|e| e.to_string())?;
    let mut generation = model
        .generate(&prompt, &resolved.settings)
        .map_err(|e| e.to_string())?;
    *cancel.borrow_mut() = Some(generation.cancel_token());
    while let Some(piece) = generation.next().await {
        let piece = piece.map_err(|e| e.to_string())?;
        on_token
            .call2(
                &JsValue::NULL,
                &JsValue::from_str(&piece.text),
                &JsValue::from(piece.token),
            )
            .map_err(|e| describe(&e))?;
    }
    let stats = generation.stats();
    let finish = generation
        .finish_reason()
        .unwrap_or(FinishReason::Cancelled);
    Ok(json!({
        "output_ids": generation.tokens(),
        "prompt_tokens": stats.prompt_tokens,
        "cached_tokens": stats.cached_tokens,
        "generated_tokens": stats.generated_tokens,
        "prefill_ms": stats.prefill.as_secs_f64() * 1e3,
        "decode_ms": stats.decode.as_secs_f64() * 1e3,
        "decode_tok_s": (stats.generated_tokens > 1).then(|| stats.decode_tokens_per_second()),
        "finish_reason": finish.name(),
        "seed": resolved.seed,
    })
    .to_string())
}

/// The model and where it runs, for [`Engine::info`].
fn describe_model(model: &Model) -> serde_json::Value {
    let session = model.session();
    let header = session.header();
    let variant = session.variant();
    let adapter = &session.gpu().adapter;
    let memory = session.memory();
    json!({
        "name": header.model.name,
        "family": header.model.family,
        "architecture": header.model.architecture,
        "adapter": adapter.name,
        "backend": format!("{:?}", adapter.backend),
        "variant": variant.name,
        "variants": header.variants.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
        "context": model.context(),
        "text": model.text_unavailable().is_none(),
        "weights_bytes": memory.weights,
        "kv_cache_bytes": memory.kv_cache,
        "activation_bytes": memory.activations,
        "wasm_memory_bytes": wasm_memory_bytes(),
    })
}

/// The engine's wasm memory: its peak, as wasm memory only grows. A plan's weights go from the
/// worker's reads to the GPU a window at a time, so this stays far below the plan's size.
fn wasm_memory_bytes() -> u32 {
    let memory: js_sys::WebAssembly::Memory = wasm_bindgen::memory().unchecked_into();
    memory
        .buffer()
        .unchecked_into::<js_sys::ArrayBuffer>()
        .byte_length()
}

fn error(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

fn js_error(message: &str) -> JsValue {
    js_sys::Error::new(message).into()
}

#[cfg(test)]
mod tests {
    use super::Request;

    #[test]
    fn a_request_is_exactly_one_of_messages_prompt_or_input_ids() {
        let parse = |json: &str| serde_json::from_str::<Request>(json);
        assert!(matches!(
            parse(r#"{"input_ids": [1, 2, 3]}"#),
            Ok(Request::InputIds(ids)) if ids == [1, 2, 3]
        ));
        assert!(matches!(parse(r#"{"prompt": "hi"}"#), Ok(Request::Prompt(t)) if t == "hi"));
        let chat = parse(r#"{"messages": [{"role": "user", "content": "hi"}]}"#);
        assert!(matches!(chat, Ok(Request::Messages(m)) if m.len() == 1));
        assert!(parse(r#"{"prompt": "hi", "input_ids": [1]}"#).is_err());
        assert!(parse(r#"{"input_ids": [-1]}"#).is_err());
        assert!(parse(r#"{"text": "hi"}"#).is_err());
    }
}
