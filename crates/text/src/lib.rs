//! gerbil's text half: tokenizer, chat template, stop strings and streaming detokenizer.
//!
//! [`TextCodec`] wraps a HuggingFace `tokenizer.json` (via the `tokenizers` crate) and an
//! optional Jinja chat template (rendered with `minijinja`), and reproduces what Python
//! `transformers` does with the same files. It is built from the plan alone
//! ([`TextCodec::from_plan`]): the compiler's frontend is the one reader of a checkpoint's
//! `tokenizer_config.json`, chat template files and generation config, and stores what it
//! found in the plan's `text` header and tokenizer section.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use gerbil_text::{ChatMessage, TextCodec};
//! let plan = gerbil_plan::PlanFile::open("smollm2.plan".as_ref())?;
//! let codec = TextCodec::from_plan(&plan)?.expect("the checkpoint had a tokenizer.json");
//! let prompt = codec.encode_chat(&[ChatMessage::new("user", "Hi!")], true)?; // apply_chat_template(tokenize=True)
//! let raw = codec.encode("The capital of France is")?;                      // tokenizer(text)
//! let mut stream = codec.stream_decoder(false).with_context(&prompt);
//! for id in [504, 3575] {
//!     print!("{}", stream.push(id)?); // only complete characters, never half an emoji
//! }
//! print!("{}", stream.finish()?);
//! # let _ = raw; Ok(()) }
//! ```
//!
//! The surprise: a chat prompt is rendered to text first and then tokenized with
//! `add_special_tokens = false` — the template writes `<bos>` itself where the model wants
//! one, so [`TextCodec::encode_chat`] never adds a second one, while [`TextCodec::encode`]
//! (plain text) lets the tokenizer's post-processor decide.
//!
//! The crate knows no GPU: the compiler checks a checkpoint's text assets with it at compile
//! time (`gerbil_compiler::check_text_assets`), and the `gerbil` facade streams generated
//! text through it ([`StopText`] ends it at a stop string).

#![warn(missing_docs)]

mod sandbox;
mod stop;
mod stream;
mod template;
mod token_bytes;

#[cfg(test)]
mod tests;

use std::fmt;

use gerbil_plan::PlanFile;
use serde::{Deserialize, Serialize};

pub use sandbox::{serve_child, TemplateSandbox, CHILD_ARG, CHILD_ENV};
pub use stop::StopText;
pub use stream::{StreamDecoder, StreamState};
use template::ChatTemplate;
pub use token_bytes::TokenBytes;

/// Everything that can go wrong turning text into ids and back.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// The plan's tokenizer section could not be read (the file changed).
    #[error(transparent)]
    Plan(#[from] gerbil_plan::PlanError),
    /// `tokenizer.json` is not a file the `tokenizers` library understands.
    #[error(
        "invalid tokenizer.json: {detail}; expected the HuggingFace `tokenizers` JSON format \
         (the `tokenizer.json` a fast tokenizer saves), not a sentencepiece `tokenizer.model`"
    )]
    InvalidTokenizer {
        /// What the `tokenizers` library said.
        detail: String,
    },
    /// The tokenizer failed on this input.
    #[error("tokenizing failed: {detail}")]
    Encode {
        /// What the `tokenizers` library said.
        detail: String,
    },
    /// The tokenizer failed to turn ids back into text.
    #[error("decoding token ids failed: {detail}")]
    Decode {
        /// What the `tokenizers` library said.
        detail: String,
    },
    /// A chat prompt was asked for, but the model ships no chat template.
    #[error(
        "this model has no chat template (no chat_template.jinja and no `chat_template` in \
         tokenizer_config.json); it is probably a base model: give it raw text instead of chat \
         messages, or supply a template"
    )]
    NoChatTemplate,
    /// The chat template is not valid Jinja (or uses syntax `minijinja` does not support).
    #[error("the chat template does not parse: {source}")]
    TemplateSyntax {
        /// minijinja's parse error.
        #[source]
        source: minijinja::Error,
    },
    /// The chat template called `raise_exception(message)`, e.g. for a role it does not allow.
    #[error("the chat template rejected the conversation: {message}")]
    TemplateRaised {
        /// The template's message.
        message: String,
    },
    /// The chat template hit one of the limits it renders under (fuel, recursion, output size).
    #[error(
        "the chat template {reason}; it is broken or hostile: fix the template or pass another"
    )]
    TemplateLimit {
        /// Which limit, and what it means.
        reason: String,
    },
    /// Rendering the chat template failed for another reason.
    #[error("rendering the chat template failed: {source}")]
    TemplateRender {
        /// minijinja's error.
        #[source]
        source: minijinja::Error,
    },
    /// Rendering in the [`TemplateSandbox`] failed: the child's own error, or why the child
    /// could not run.
    #[error("{detail}")]
    TemplateSandbox {
        /// The error as the child wrote it, or what went wrong starting it.
        detail: String,
    },
}

/// One turn of a conversation, as `transformers` expects it: `{"role": ..., "content": ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `"system"`, `"user"`, `"assistant"`, ... — whatever the template understands.
    pub role: String,
    /// The message's text.
    pub content: String,
}

impl ChatMessage {
    /// A message of `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A model's tokenizer plus its chat template and special tokens.
pub struct TextCodec {
    tokenizer: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    sandbox: Option<TemplateSandbox>,
}

impl fmt::Debug for TextCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TextCodec")
            .field("vocab_size", &self.vocab_size())
            .field("has_chat_template", &self.has_chat_template())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl TextCodec {
    /// Builds a codec from the bytes of a `tokenizer.json`, without chat template or special
    /// tokens (add them with [`Self::with_chat_template`] and [`Self::with_special_tokens`]).
    pub fn from_tokenizer_json(bytes: &[u8]) -> Result<Self, TextError> {
        let mut tokenizer =
            tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| TextError::InvalidTokenizer {
                detail: e.to_string(),
            })?;
        // `tokenizer(text)` in transformers never truncates or pads unless asked to, whatever
        // tokenizer.json says.
        tokenizer
            .with_truncation(None)
            .map_err(|e| TextError::InvalidTokenizer {
                detail: e.to_string(),
            })?;
        tokenizer.with_padding(None);
        Ok(Self {
            tokenizer,
            template: None,
            bos_token: None,
            eos_token: None,
            sandbox: None,
        })
    }

    /// Sets the Jinja chat template (the content of `chat_template.jinja`). Fails if it does not
    /// parse, so a broken template is reported when the model is loaded, not at the first prompt.
    pub fn with_chat_template(mut self, source: impl Into<String>) -> Result<Self, TextError> {
        self.template = Some(ChatTemplate::new(source.into())?);
        Ok(self)
    }

    /// Renders the chat template in `sandbox`, a child process under memory and CPU-time
    /// limits, instead of in this process (`None`: in this process).
    pub fn with_sandbox(mut self, sandbox: Option<TemplateSandbox>) -> Self {
        self.sandbox = sandbox;
        self
    }

    /// Sets the `bos_token` / `eos_token` strings the chat template sees.
    pub fn with_special_tokens(mut self, bos: Option<String>, eos: Option<String>) -> Self {
        self.bos_token = bos;
        self.eos_token = eos;
        self
    }

    /// The plan's tokenizer with its chat template and special tokens, as the frontend read
    /// them from the checkpoint; `None` when the checkpoint had no `tokenizer.json` (tiny test
    /// models), in which case the caller feeds token ids.
    pub fn from_plan(plan: &PlanFile) -> Result<Option<Self>, TextError> {
        let text = &plan.header.text;
        let Some(section) = text.tokenizer else {
            return Ok(None);
        };
        let codec = Self::from_tokenizer_json(&plan.section_bytes(section)?)?
            .with_special_tokens(text.bos_token.clone(), text.eos_token.clone());
        match &text.chat_template {
            Some(t) => codec.with_chat_template(t.clone()).map(Some),
            None => Ok(Some(codec)),
        }
    }

    /// `tokenizer(text)["input_ids"]` in transformers: special tokens added as the
    /// tokenizer's post-processor says (SmolLM2: none; Gemma: `<bos>` in front).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        self.encode_plain(text, true)
    }

    /// Tokenizes `text`, with or without the post-processor's special tokens.
    pub fn encode_plain(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TextError> {
        let encoding = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TextError::Encode {
                detail: e.to_string(),
            })?;
        Ok(encoding.get_ids().to_vec())
    }

    /// `tokenizer(text, truncation=True, max_length=max_tokens)["input_ids"]`:
    /// the text's tokens cut from the right so that, with the special tokens
    /// the post-processor adds (BERT's `[CLS]` and `[SEP]`), at most
    /// `max_tokens` remain — what sentence-transformers feeds an encoder.
    pub fn encode_truncated(&self, text: &str, max_tokens: usize) -> Result<Vec<u32>, TextError> {
        let encode_err = |e: tokenizers::Error| TextError::Encode {
            detail: e.to_string(),
        };
        let mut encoding = self
            .tokenizer
            .encode_fast(text, false)
            .map_err(encode_err)?;
        let added = self
            .tokenizer
            .get_post_processor()
            .map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, false));
        encoding.truncate(
            max_tokens.saturating_sub(added),
            0,
            tokenizers::TruncationDirection::Right,
        );
        let encoding = self
            .tokenizer
            .post_process(encoding, None, true)
            .map_err(encode_err)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// `tokenizer.decode(ids, skip_special_tokens=...)`. Like the Python library, ids the
    /// tokenizer does not know are silently left out.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextError> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| TextError::Decode {
                detail: e.to_string(),
            })
    }

    /// Renders the chat template like `tokenizer.apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=...)`.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        self.apply_chat_template_with_tools(messages, None, add_generation_prompt)
    }

    /// [`Self::apply_chat_template`] with `tools=` (a JSON list of OpenAI
    /// function definitions, as transformers passes them): templates that know
    /// tools (Qwen's, Llama 3's) describe them to the model; others ignore them.
    pub fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        let template = self.template.as_ref().ok_or(TextError::NoChatTemplate)?;
        let (bos_token, eos_token) = (self.bos_token.as_deref(), self.eos_token.as_deref());
        match &self.sandbox {
            Some(sandbox) => sandbox.render(&sandbox::RenderRequest {
                template: template.source().into(),
                messages: messages.into(),
                tools: tools.map(std::borrow::Cow::Borrowed),
                add_generation_prompt,
                bos_token: bos_token.map(Into::into),
                eos_token: eos_token.map(Into::into),
            }),
            None => template.render(messages, tools, add_generation_prompt, bos_token, eos_token),
        }
    }

    /// The chat template's Jinja source, if the model ships one.
    pub fn chat_template(&self) -> Option<&str> {
        self.template.as_ref().map(ChatTemplate::source)
    }

    /// `tokenizer.apply_chat_template(messages, tokenize=True, ...)`: the rendered text,
    /// tokenized without adding special tokens.
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, TextError> {
        self.encode_chat_with_tools(messages, None, add_generation_prompt)
    }

    /// [`Self::encode_chat`] with `tools=` (see [`Self::apply_chat_template_with_tools`]).
    pub fn encode_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, TextError> {
        let text = self.apply_chat_template_with_tools(messages, tools, add_generation_prompt)?;
        self.encode_plain(&text, false)
    }

    /// A detokenizer for generated ids; see [`StreamDecoder`].
    pub fn stream_decoder(&self, skip_special_tokens: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special_tokens)
    }

    /// Whether the model ships a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// The beginning-of-sequence token's text, as the template sees it.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The end-of-sequence token's text, as the template sees it.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The id of a token string (e.g. `"<|im_end|>"`), if the vocabulary has it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The token string of an id, if the vocabulary has it.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    /// Number of ids the tokenizer knows, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// The most UTF-8 bytes of any token string of the vocabulary, added
    /// tokens included: no token stands for more bytes of text (a byte-level
    /// token's characters each stand for one byte and take one or two; a
    /// SentencePiece piece's are the text's own), so a text of `n` bytes is
    /// at least `n / longest_token_bytes()` tokens.
    pub fn longest_token_bytes(&self) -> usize {
        self.tokenizer
            .get_vocab(true)
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .max(1)
    }
}
