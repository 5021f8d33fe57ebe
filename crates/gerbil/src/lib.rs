//! gerbil for embedders: load a compiled plan onto a GPU, generate text from it, hold a chat.
//!
//! ```no_run
//! # async fn run() -> Result<(), gerbil::Error> {
//! use gerbil::{Chat, GenerationSettings, Model, ModelOptions};
//! let model = Model::open("model.plan".as_ref(), &ModelOptions::default()).await?;
//! let mut chat = Chat::new(model);
//! let mut reply = chat.send("What is the capital of France?", &GenerationSettings::default())?;
//! while let Some(piece) = reply.next().await {
//!     print!("{}", piece?.text);
//! }
//! # Ok(()) }
//! ```
//!
//! This crate joins the two halves a program otherwise wires up itself: the GPU runtime
//! (`gerbil-runtime`: session, decode-ahead, samplers) and the text half (`gerbil-text`:
//! tokenizer, chat template, stop strings, streaming decode). [`Model`] is a loaded plan with
//! its tokenizer, [`Generation`] one streamed answer, [`Chat`] a conversation. The surprise:
//! a plan whose tokenizer does not load still loads, and runs on token ids; only its text
//! calls fail ([`Error::TextUnavailable`]).
//!
//! Like the runtime it builds for `wasm32-unknown-unknown` (WebGPU in a browser); load the
//! plan there with `gerbil_plan::PlanFile::from_bytes` and [`Model::load`].

#![warn(missing_docs)]

pub mod batch;
pub mod chat;
pub mod constraint;
mod decoding;
pub mod embedding;
pub mod error;
pub mod generation;
pub mod model;
pub mod settings;
mod slots;

pub use batch::Batch;
pub use chat::{Chat, ChatReply};
pub use constraint::TokenConstraint;
pub use embedding::{shorten_embedding, LongInputs};
pub use error::Error;
pub use generation::{
    CancelToken, FinishReason, Generation, GenerationSettings, GenerationStats, Piece,
};
pub use model::{Model, ModelOptions};
pub use settings::{
    effective_temperature, ResolvedSettings, SettingsRequest, GREEDY_BELOW, HF_TOP_K,
};

pub use gerbil_plan::GenerationDefaults;
pub use gerbil_runtime::{PrecisionChoice, RuntimeError, SamplingParams, Session, SessionOptions};
pub use gerbil_text::{ChatMessage, TemplateSandbox, TextCodec, TextError};
