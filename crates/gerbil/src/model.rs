//! The library's front door: a [`Model`] is a loaded plan with its tokenizer,
//! and [`Model::generate`] streams tokens and text for a prompt.
//!
//! ```no_run
//! # async fn run() -> Result<(), gerbil::Error> {
//! use gerbil::{GenerationSettings, Model, ModelOptions};
//! let mut model = Model::open("model.plan".as_ref(), &ModelOptions::default()).await?;
//! let prompt = model.encode("The capital of France is")?;
//! let mut generation = model.generate(&prompt, &GenerationSettings::default())?;
//! while let Some(piece) = generation.next().await {
//!     print!("{}", piece?.text);
//! }
//! # Ok(()) }
//! ```
//!
//! The surprise: the model remembers which tokens its KV cache holds, and a
//! prompt that begins with them prefills only the rest. A conversation
//! re-rendered through its chat template each turn therefore runs only the
//! new turn ([`crate::Chat`] relies on it), and a server answering requests
//! that share a system prompt skips it. Nothing is cached by content beyond
//! the one sequence in the KV cache.

use crate::error::Error;
use crate::generation::{Generation, GenerationSettings};
use gerbil_plan::PlanFile;
use gerbil_runtime::{Session, SessionOptions};
use gerbil_text::{ChatMessage, TemplateSandbox, TextCodec};
use std::sync::Arc;

/// How [`Model::load`] loads a plan: the GPU session's options and where chat templates render.
#[derive(Clone, Debug, Default)]
pub struct ModelOptions {
    /// The GPU session: adapter, precision, variant, context, pipeline cache, progress.
    pub session: SessionOptions,
    /// Where the chat template renders: in a child process under memory and CPU-time limits
    /// ([`TemplateSandbox`]), or in this process (`None`, the default).
    pub template_sandbox: Option<TemplateSandbox>,
}

/// A plan resident on a GPU, its tokenizer, and the tokens its KV cache holds.
pub struct Model {
    pub(crate) session: Session,
    pub(crate) codec: Option<Arc<TextCodec>>,
    /// Why the plan's tokenizer or chat template could not be loaded: kept,
    /// not returned by [`Model::load`], so the plan still runs on token ids;
    /// text in or out returns it.
    pub(crate) codec_error: Option<String>,
    /// The tokens whose KV-cache rows are valid, in order: always the
    /// session's first `position()` tokens.
    pub(crate) cached: Vec<u32>,
}

impl Model {
    /// Loads `plan` onto a GPU ([`Session::open`]) with its tokenizer and
    /// chat template. A tokenizer or template that does not load is not an
    /// error here: token ids still run, and text gets the error
    /// ([`Error::TextUnavailable`]).
    pub async fn load(plan: &PlanFile, opts: &ModelOptions) -> Result<Model, Error> {
        let (codec, codec_error) = match TextCodec::from_plan(plan) {
            Ok(codec) => (
                codec.map(|c| Arc::new(c.with_sandbox(opts.template_sandbox.clone()))),
                None,
            ),
            Err(e) => (None, Some(e.to_string())),
        };
        let session = Session::open(plan, &opts.session).await?;
        Ok(Model {
            session,
            codec,
            codec_error,
            cached: Vec::new(),
        })
    }

    /// Opens the plan file at `path` and loads it ([`Model::load`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub async fn open(path: &std::path::Path, opts: &ModelOptions) -> Result<Model, Error> {
        let plan = PlanFile::open(path)?;
        Model::load(&plan, opts).await
    }

    /// The tokenizer and chat template; `None` for a plan compiled without a
    /// `tokenizer.json`, or whose tokenizer does not load
    /// ([`Model::text_unavailable`]), which takes token ids only.
    pub fn codec(&self) -> Option<&TextCodec> {
        self.codec.as_deref()
    }

    /// The tokenizer and chat template as a shared handle, to tokenize on
    /// another thread while this model generates (the server does); `None`
    /// as [`Model::codec`].
    pub fn shared_codec(&self) -> Option<Arc<TextCodec>> {
        self.codec.clone()
    }

    /// Why the plan's tokenizer or chat template did not load, if it did not.
    pub fn text_unavailable(&self) -> Option<&str> {
        self.codec_error.as_deref()
    }

    /// The session that runs the plan (device, variant, memory, load times).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Positions the KV cache holds: the longest prompt plus generation.
    pub fn context(&self) -> u64 {
        self.session.context()
    }

    /// Tokens of the last generation still in the KV cache, which a prompt
    /// starting with them does not run again.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.cached
    }

    /// Forgets the KV cache: the next prompt is prefilled whole.
    pub fn clear_cache(&mut self) {
        self.cached.clear();
        self.session.reset();
    }

    /// The GPU session itself, for work below generation (raw logits, a
    /// step at a time). The caller may leave its KV cache in any state, so
    /// the model forgets what its cache held first ([`Model::clear_cache`]).
    pub fn session_mut(&mut self) -> &mut Session {
        self.clear_cache();
        &mut self.session
    }

    /// `text` as `tokenizer(text)` tokenizes it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, Error> {
        Ok(self.text_codec()?.encode(text)?)
    }

    /// `messages` through the model's chat template, ending with the
    /// assistant's turn opened (`apply_chat_template(…,
    /// add_generation_prompt=True)`).
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, Error> {
        Ok(self.text_codec()?.encode_chat(messages, true)?)
    }

    /// [`Model::encode_chat`] with the template's `tools` (OpenAI function
    /// definitions; `None`: no tools).
    pub fn encode_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
    ) -> Result<Vec<u32>, Error> {
        Ok(self
            .text_codec()?
            .encode_chat_with_tools(messages, tools, true)?)
    }

    fn text_codec(&self) -> Result<&TextCodec, Error> {
        match (&self.codec, &self.codec_error) {
            (Some(codec), _) => Ok(codec),
            (None, Some(reason)) => Err(Error::TextUnavailable(reason.clone())),
            (None, None) => Err(Error::NoTokenizer),
        }
    }

    /// Starts generating after `prompt` (token ids). Nothing runs until the
    /// first [`Generation::next`]; dropping the generation stops it. Errors
    /// here are settings or a prompt longer than the context.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        settings: &GenerationSettings,
    ) -> Result<Generation<'_>, Error> {
        Generation::new(self, prompt, settings)
    }

    /// How many leading tokens of `prompt` the KV cache already holds and a
    /// generation would keep: all of the shared prefix but the prompt's last
    /// token, which must run to give the first token's logits.
    pub fn reusable_prefix(&self, prompt: &[u32]) -> usize {
        let shared = self
            .cached
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        shared.min(prompt.len().saturating_sub(1))
    }
}
