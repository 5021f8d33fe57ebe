//! A conversation: [`Chat`] holds the messages so far and the model, and
//! [`Chat::send`] answers a user message through the model's chat template.
//!
//! ```no_run
//! # async fn run(model: gerbil::Model) -> Result<(), gerbil::Error> {
//! use gerbil::{Chat, GenerationSettings};
//! let mut chat = Chat::new(model).with_system("You answer in one sentence.");
//! for question in ["What is the capital of France?", "And of Italy?"] {
//!     let mut reply = chat.send(question, &GenerationSettings::default())?;
//!     while let Some(piece) = reply.next().await {
//!         print!("{}", piece?.text);
//!     }
//!     println!();
//! }
//! # Ok(()) }
//! ```
//!
//! Each turn renders the whole conversation through the template and hands
//! it to [`Model::generate`], which keeps the KV cache of the tokens it
//! already holds: the earlier turns, the answers included, are not run
//! again, only the new message. The surprise: an answer re-rendered by the
//! template does not always tokenize to the tokens that were generated (a
//! stop string cut it, or the tokenizer would merge differently); the reuse
//! then ends at the first difference, which costs time, never correctness.

use crate::error::Error;
use crate::generation::{FinishReason, Generation, GenerationSettings, GenerationStats, Piece};
use crate::model::Model;
use gerbil_text::ChatMessage;

/// A conversation with a model.
pub struct Chat {
    model: Model,
    system: Option<String>,
    messages: Vec<ChatMessage>,
}

impl Chat {
    /// A new conversation (no system message: the template's default, if
    /// it has one).
    pub fn new(model: Model) -> Chat {
        Chat {
            model,
            system: None,
            messages: Vec::new(),
        }
    }

    /// Sets the system message.
    pub fn with_system(mut self, system: impl Into<String>) -> Chat {
        self.set_system(Some(system.into()));
        self
    }

    /// Sets or removes the system message, for the following turns.
    pub fn set_system(&mut self, system: Option<String>) {
        self.system = system;
    }

    /// The system message.
    pub fn system(&self) -> Option<&str> {
        self.system.as_deref()
    }

    /// The user and assistant messages so far (without the system message).
    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// Forgets the messages (the system message stays).
    pub fn reset(&mut self) {
        self.messages.clear();
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Ends the conversation, returning the model.
    pub fn into_model(self) -> Model {
        self.model
    }

    /// The conversation as the template sees it: the system message, then
    /// the turns.
    fn rendered(&self) -> Vec<ChatMessage> {
        let system = self.system.iter().map(|s| ChatMessage::new("system", s));
        system.chain(self.messages.iter().cloned()).collect()
    }

    /// Adds `user` and starts the assistant's answer. The answer joins the
    /// history when the reply ends or is dropped (as far as it got); if the
    /// template or the context refuses the message, the history is unchanged.
    pub fn send(
        &mut self,
        user: &str,
        settings: &GenerationSettings,
    ) -> Result<ChatReply<'_>, Error> {
        self.messages.push(ChatMessage::new("user", user));
        let prompt = match self.model.encode_chat(&self.rendered()) {
            Ok(p) => p,
            Err(e) => {
                self.messages.pop();
                return Err(e);
            }
        };
        match Generation::new(&mut self.model, &prompt, settings) {
            Ok(generation) => Ok(ChatReply {
                generation,
                messages: &mut self.messages,
                text: String::new(),
            }),
            Err(e) => {
                self.messages.pop();
                Err(e)
            }
        }
    }
}

/// The assistant's answer being generated; see [`Chat::send`].
pub struct ChatReply<'c> {
    generation: Generation<'c>,
    messages: &'c mut Vec<ChatMessage>,
    text: String,
}

impl ChatReply<'_> {
    /// The next token of the answer; `None` at its end.
    pub async fn next(&mut self) -> Option<Result<Piece, Error>> {
        let piece = self.generation.next().await;
        if let Some(Ok(p)) = &piece {
            self.text.push_str(&p.text);
        }
        piece
    }

    /// The answer's text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Why the answer ended; `None` while it runs.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.generation.finish_reason()
    }

    /// Counts and times: how many prompt tokens the KV cache already held,
    /// and how fast the rest ran.
    pub fn stats(&self) -> GenerationStats {
        self.generation.stats()
    }

    /// Stops the answer at the next token (see [`Generation::cancel`]).
    pub fn cancel(&mut self) {
        self.generation.cancel();
    }
}

impl Drop for ChatReply<'_> {
    fn drop(&mut self) {
        self.generation.cancel();
        self.messages.push(ChatMessage::new(
            "assistant",
            std::mem::take(&mut self.text),
        ));
    }
}
