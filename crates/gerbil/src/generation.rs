//! One generation as a stream: [`Generation::next`] yields each token with
//! the text it adds, until an end-of-sequence token, a stop string, the
//! token limit, the end of the context, or cancellation.
//!
//! The first `next` prefills the prompt (what the model's KV cache does not
//! hold already, see [`crate::Model`]); then tokens come from the GPU's own
//! sampler, several steps encoded per submission
//! (`AheadDecoder`), or — when the caller wants each step's
//! logits or uses penalties — from the CPU [`Sampler`](gerbil_runtime::sampling::Sampler) on read-back logits.
//! Both choose the same tokens.
//!
//! Cancel by dropping the generation, by [`Generation::cancel`], or from
//! another thread or task with a [`CancelToken`]: the stream ends at the next
//! token with [`FinishReason::Cancelled`]. However it ends, the model's KV
//! cache keeps every token fed so far for the next prompt to reuse. The
//! surprise: the GPU may have decoded a few tokens past the end (it only
//! learns of an end-of-sequence token from a readback); those only wrote
//! KV-cache rows past the kept position, which later steps overwrite.
//!
//! Non-finite logits end the stream with [`RuntimeError::NonFiniteLogits`]
//! naming the step: the CPU path checks every step's logits; the GPU path
//! reads back and checks the prompt's (one row, once), which catches weights
//! holding NaN/Inf, and afterwards relies on `sample_token`, which never
//! picks a NaN (a row that is NaN throughout mid-generation is not detected).

use crate::constraint::TokenConstraint;
use crate::decoding::{check_finite, Choice, Decoding};
use crate::error::Error;
use crate::model::Model;
use gerbil_runtime::sampling::SamplingParams;
use gerbil_runtime::AheadDecoder;
use gerbil_runtime::Clock;
use gerbil_runtime::{RuntimeError, DECODE_BATCH, DECODE_BATCH_MOST};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How one generation chooses and ends.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationSettings {
    /// Most tokens to generate (fewer when the context ends first).
    pub max_new_tokens: usize,
    /// Token choice: greedy by default.
    pub sampling: SamplingParams,
    /// Strings that end the text (left out of it).
    pub stop: Vec<String>,
    /// Keep going past the plan's end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Return the `k` largest logits of every step ([`Piece::top`]); keeps
    /// the CPU in the loop.
    pub top_logits: Option<usize>,
}

impl Default for GenerationSettings {
    fn default() -> Self {
        GenerationSettings {
            max_new_tokens: 128,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: false,
            top_logits: None,
        }
    }
}

/// One generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    /// The token id.
    pub token: u32,
    /// Text this token makes printable: complete characters only, special
    /// tokens left out, text that may begin a stop string held back until
    /// it is decided (so it can be empty). Empty without a tokenizer.
    pub text: String,
    /// `[id, logit]` of the largest logits of the step that chose it,
    /// largest first (with [`GenerationSettings::top_logits`]).
    pub top: Option<Vec<(u32, f32)>>,
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_new_tokens`, or the end of the context.
    Length,
    /// Cancelled by the caller.
    Cancelled,
}

impl FinishReason {
    /// The OpenAI API's name: `stop`, `length`, `cancelled`.
    pub fn name(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// Counts and times of one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GenerationStats {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Of those, tokens the KV cache held already (not run again).
    pub cached_tokens: usize,
    /// Time to run the rest of the prompt.
    pub prefill: Duration,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Time from the end of the prefill to the last token.
    pub decode: Duration,
}

impl GenerationStats {
    /// Prompt tokens run (not cached) per second of prefill.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        (self.prompt_tokens - self.cached_tokens) as f64 / self.prefill.as_secs_f64().max(1e-9)
    }

    /// Decode steps per second (the first token comes from the prefill).
    pub fn decode_tokens_per_second(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

/// Cancels a [`Generation`] from elsewhere (another thread or task); clones
/// share the flag.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// Asks the generation to stop at its next token.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether [`CancelToken::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Where the tokens come from.
enum Source {
    /// The prompt has not run yet.
    Pending,
    /// The GPU samples; tokens returned in batches.
    Gpu {
        decoder: Box<AheadDecoder>,
        ready: VecDeque<u32>,
    },
    /// The CPU samples from read-back logits; `feed` is the last token,
    /// run before the next choice.
    Cpu { logits: Vec<f32>, feed: Option<u32> },
    /// Ended.
    Done,
}

/// A generation in progress; see the [module docs](self).
pub struct Generation<'m> {
    model: &'m mut Model,
    prompt: Vec<u32>,
    source: Source,
    decoding: Decoding,
    cancel: CancelToken,
    clock: Clock,
}

impl<'m> Generation<'m> {
    pub(crate) fn new(
        model: &'m mut Model,
        prompt: &[u32],
        settings: &GenerationSettings,
    ) -> Result<Self, Error> {
        let decoding = Decoding::new(model, prompt, settings)?;
        Ok(Generation {
            prompt: prompt.to_vec(),
            source: Source::Pending,
            decoding,
            cancel: CancelToken::default(),
            clock: Clock::start(),
            model,
        })
    }

    /// Chooses every token under `constraint` (see [`crate::constraint`]);
    /// only before the first token.
    pub fn constrain(&mut self, constraint: Box<dyn TokenConstraint>) -> Result<(), Error> {
        if !matches!(self.source, Source::Pending) {
            return Err(Error::Constraint(
                "a constraint must be set before the first token".into(),
            ));
        }
        self.decoding.constraint = Some(constraint);
        Ok(())
    }

    /// The next token, or `None` once the generation has ended (then
    /// [`Generation::finish_reason`] says why). An error ends it too.
    pub async fn next(&mut self) -> Option<Result<Piece, Error>> {
        if self.decoding.finish.is_some() {
            return None;
        }
        if self.cancel.is_cancelled() {
            self.end(FinishReason::Cancelled);
            return None;
        }
        if self.decoding.output.len() >= self.decoding.limit {
            self.end(FinishReason::Length);
            return None;
        }
        match self.step().await {
            Ok(piece) => Some(Ok(piece)),
            Err(e) => {
                // The KV cache may hold half a step: forget it.
                self.source = Source::Done;
                self.decoding.finish = Some(FinishReason::Cancelled);
                self.model.clear_cache();
                Some(Err(e))
            }
        }
    }

    /// Ends the generation now: [`Generation::next`] returns `None`, with
    /// [`FinishReason::Cancelled`].
    pub fn cancel(&mut self) {
        if self.decoding.finish.is_none() {
            self.end(FinishReason::Cancelled);
        }
    }

    /// A token that cancels this generation from another thread or task.
    pub fn cancel_token(&self) -> CancelToken {
        self.cancel.clone()
    }

    /// Why it ended; `None` while it runs.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.decoding.finish
    }

    /// The tokens generated so far.
    pub fn tokens(&self) -> &[u32] {
        &self.decoding.output
    }

    /// The sequence slot of the model's KV cache it runs in (chosen when
    /// its prompt runs, at the first [`Generation::next`]).
    pub fn slot(&self) -> usize {
        self.model.session.slot()
    }

    /// Counts and times so far.
    pub fn stats(&self) -> GenerationStats {
        self.decoding.stats
    }

    /// Chooses the next token and turns it into a piece.
    async fn step(&mut self) -> Result<Piece, Error> {
        if matches!(self.source, Source::Pending) {
            self.prefill().await?;
        }
        let (token, top) = self.choose().await?;
        let piece = self.decoding.piece(token, top)?;
        let prefill = self.decoding.stats.prefill;
        self.decoding.stats.decode = self.clock.elapsed().saturating_sub(prefill);
        if let Some(reason) = self.decoding.finish {
            self.end(reason);
        }
        Ok(piece)
    }

    /// Runs the prompt's uncached tokens and picks where tokens come from.
    async fn prefill(&mut self) -> Result<(), Error> {
        // A previous generation's decode-ahead steps may still be running
        // past its end: wait for them here so the prompt's time is its own.
        self.model.session.sync().await?;
        self.clock = Clock::start();
        let keep = self.model.place_prompt(&self.prompt, &[])?;
        self.decoding.stats.cached_tokens = keep;
        let rest = &self.prompt[keep..];
        let settings = &self.decoding.settings;
        let session = &mut self.model.session;
        let on_gpu = !self.decoding.needs_logits() && session.can_sample_on_gpu(&settings.sampling);
        self.source = if on_gpu {
            session.set_sampling(&settings.sampling);
            // The prompt's logits are read back once (a row, far cheaper than the
            // prefill) to stop a plan whose weights hold NaN/Inf at step 1.
            let logits = session.forward(rest).await?;
            check_finite(&logits, 1, session.position().saturating_sub(1))?;
            let limit = self.decoding.limit;
            let decoder = Box::new(AheadDecoder::new(
                session,
                limit,
                DECODE_BATCH,
                DECODE_BATCH_MOST,
            )?);
            Source::Gpu {
                decoder,
                ready: VecDeque::new(),
            }
        } else {
            let logits = session.forward(rest).await?;
            Source::Cpu { logits, feed: None }
        };
        self.model.cached.extend_from_slice(rest);
        self.decoding.stats.prefill = self.clock.elapsed();
        Ok(())
    }

    /// The next token and, on the CPU path with `top_logits`, its step's
    /// largest logits.
    async fn choose(&mut self) -> Result<Choice, Error> {
        let session = &mut self.model.session;
        match &mut self.source {
            Source::Gpu { decoder, ready } => {
                if ready.is_empty() {
                    ready.extend(decoder.next_batch(session).await?);
                }
                ready.pop_front().map(|t| (t, None)).ok_or_else(|| {
                    session
                        .gpu()
                        .device_lost("decoding", "the GPU returned no token".into())
                        .into()
                })
            }
            Source::Cpu { logits, feed } => {
                if let Some(t) = feed.take() {
                    *logits = session.forward(&[t]).await?;
                    self.model.cached.push(t);
                }
                let position = session.position().saturating_sub(1);
                let (token, top) = self.decoding.choose(logits, position)?;
                *feed = Some(token);
                Ok((token, top))
            }
            Source::Pending | Source::Done => Err(RuntimeError::EmptyInput.into()),
        }
    }

    /// Records why it ended and leaves the KV cache holding every token fed
    /// (the prompt and all generated tokens but the last).
    fn end(&mut self, reason: FinishReason) {
        self.decoding.finish = Some(reason);
        let prefill = self.decoding.stats.prefill;
        self.decoding.stats.decode = self.clock.elapsed().saturating_sub(prefill);
        match std::mem::replace(&mut self.source, Source::Done) {
            Source::Gpu { decoder, .. } => {
                let output = &self.decoding.output;
                decoder.finish(&mut self.model.session, output.len());
                let fed = output.len().saturating_sub(1);
                self.model.cached.extend_from_slice(&output[..fed]);
                self.model.session.set_sampling(&SamplingParams::default());
            }
            Source::Cpu { .. } | Source::Pending | Source::Done => {}
        }
        debug_assert_eq!(
            self.model.cached.len() as u64,
            self.model.session.position(),
            "the model's cached tokens follow its KV cache"
        );
    }
}

impl Drop for Generation<'_> {
    fn drop(&mut self) {
        if self.decoding.finish.is_none() {
            self.end(FinishReason::Cancelled);
        }
    }
}
