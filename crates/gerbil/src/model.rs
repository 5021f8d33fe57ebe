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
//! that share a system prompt skips it. A session with several sequence
//! slots ([`gerbil_runtime::SessionOptions::slots`]) keeps that many
//! sequences, and each prompt runs in the slot that serves the most of it
//! ([`crate::slots`]): users taking turns keep their conversations cached.

use crate::error::Error;
use crate::generation::{Generation, GenerationSettings};
use gerbil_plan::PlanFile;
use gerbil_runtime::{RuntimeError, Session, SessionOptions};
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
    /// session's first `position()` tokens (of the current slot).
    pub(crate) cached: Vec<u32>,
    /// The other slots' tokens (the current slot's entry is unused).
    parked: Vec<Vec<u32>>,
    /// When each slot was last chosen (a counter).
    last_used: Vec<u64>,
    uses: u64,
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
        let slots = session.slots();
        Ok(Model {
            session,
            codec,
            codec_error,
            cached: Vec::new(),
            parked: vec![Vec::new(); slots],
            last_used: vec![0; slots],
            uses: 0,
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

    /// Forgets the KV cache, every slot's: the next prompt is prefilled whole.
    pub fn clear_cache(&mut self) {
        self.cached.clear();
        for tokens in &mut self.parked {
            tokens.clear();
        }
        self.session.reset_all();
    }

    /// Moves to the slot for `prompt` ([`Model::enter_slot_for`]) and keeps
    /// only the prefix of its cache that the prompt reuses; how many tokens
    /// that is (the rest of the prompt runs from there).
    pub(crate) fn place_prompt(&mut self, prompt: &[u32], busy: &[bool]) -> Result<usize, Error> {
        self.enter_slot_for(prompt, busy)?;
        let keep = self.reusable_prefix(prompt);
        self.session.truncate(keep as u64);
        self.cached.truncate(keep);
        Ok(keep)
    }

    /// Runs the following steps in slot `slot`, its tokens becoming the
    /// current ones.
    pub(crate) fn switch_slot(&mut self, slot: usize) -> Result<(), Error> {
        let current = self.session.slot();
        if slot != current {
            self.session.set_slot(slot)?;
            let next = std::mem::take(&mut self.parked[slot]);
            self.parked[current] = std::mem::replace(&mut self.cached, next);
        }
        Ok(())
    }

    /// Records that slot `slot`'s KV cache now holds `token` next.
    pub(crate) fn push_token(&mut self, slot: usize, token: u32) {
        if slot == self.session.slot() {
            self.cached.push(token);
        } else if let Some(tokens) = self.parked.get_mut(slot) {
            tokens.push(token);
        }
    }

    /// The tokens slot `slot`'s KV cache holds ([`gerbil_runtime::Session::slots`]).
    pub fn slot_tokens(&self, slot: usize) -> &[u32] {
        if slot == self.session.slot() {
            &self.cached
        } else {
            self.parked.get(slot).map_or(&[], Vec::as_slice)
        }
    }

    /// Moves the session to the slot that serves the most of `prompt`
    /// ([`crate::slots::place`]), copying a shared prefix there first when
    /// it is another slot's.
    /// Slots `busy` (a batch's running sequences) are only copied from.
    pub(crate) fn enter_slot_for(&mut self, prompt: &[u32], busy: &[bool]) -> Result<(), Error> {
        let n = self.session.slots();
        if n <= 1 {
            return Ok(());
        }
        let current = self.session.slot();
        let views: Vec<&[u32]> = (0..n).map(|s| self.slot_tokens(s)).collect();
        let place = crate::slots::place(&views, &self.last_used, busy, current, prompt)
            .ok_or(RuntimeError::Slot { slot: n, slots: n })?;
        let copied = place
            .copy_from
            .map(|(from, rows)| (from, rows, views[from][..rows].to_vec()));
        self.switch_slot(place.slot)?;
        if let Some((from, rows, tokens)) = copied {
            self.session
                .copy_slot_prefix(from, place.slot, rows as u64)?;
            self.cached = tokens;
        }
        self.uses += 1;
        self.last_used[place.slot] = self.uses;
        Ok(())
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

    pub(crate) fn text_codec(&self) -> Result<&TextCodec, Error> {
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
        crate::slots::reusable(&self.cached, prompt)
    }
}
