//! One answer's token choice and text, whatever runs the model: what
//! [`crate::Generation`] (one sequence, the GPU's sampler or the CPU's) and
//! [`crate::Batch`] (several sequences, one batch step a token) share.
//!
//! [`Decoding::new`] checks a prompt and settings against the model;
//! [`Decoding::choose`] picks a token from a step's logits on the CPU
//! (non-finite check, the constraint's mask, the sampler with penalties);
//! [`Decoding::piece`] records a chosen token and says what text it makes
//! printable and whether the answer ended (end-of-sequence, a stop string,
//! the token limit, a complete constraint). The surprise: the limit counts
//! the context too — token `i > 0` is chosen by the step at position
//! `prompt + i − 1`, which must be inside it.

use crate::constraint::TokenConstraint;
use crate::error::Error;
use crate::generation::{FinishReason, GenerationSettings, GenerationStats, Piece};
use crate::model::Model;
use gerbil_runtime::sampling::{top_logits, Sampler, TokenHistory};
use gerbil_runtime::RuntimeError;
use gerbil_text::{StopText, StreamState, TextCodec};
use std::sync::Arc;

/// A chosen token and, when the settings ask for them, its step's largest
/// logits.
pub(crate) type Choice = (u32, Option<Vec<(u32, f32)>>);

/// The choice and text state of one answer; see the [module docs](self).
pub(crate) struct Decoding {
    pub(crate) settings: GenerationSettings,
    sampler: Sampler,
    eos: Vec<u32>,
    /// Most tokens the answer may have (settings and context).
    pub(crate) limit: usize,
    pub(crate) output: Vec<u32>,
    text: Option<(Arc<TextCodec>, StreamState)>,
    stop: StopText,
    pub(crate) finish: Option<FinishReason>,
    pub(crate) stats: GenerationStats,
    pub(crate) constraint: Option<Box<dyn TokenConstraint>>,
    /// What the penalties see: the prompt and the tokens chosen.
    history: TokenHistory,
}

impl Decoding {
    /// Checks `prompt` and `settings` against `model`.
    pub(crate) fn new(
        model: &Model,
        prompt: &[u32],
        settings: &GenerationSettings,
    ) -> Result<Decoding, Error> {
        let sampler = Sampler::new(settings.sampling)?;
        if settings.stop.iter().any(String::is_empty) {
            return Err(RuntimeError::Sampling(
                "a stop string is empty, which would end the text before it starts; \
                 give stop strings of at least one character"
                    .into(),
            )
            .into());
        }
        if prompt.is_empty() {
            return Err(RuntimeError::EmptyInput.into());
        }
        let vocab = model.session.vocab_size();
        if let Some(&id) = prompt.iter().find(|&&id| u64::from(id) >= vocab) {
            return Err(RuntimeError::TokenOutOfRange { id, vocab }.into());
        }
        let context = model.session.context();
        let len = prompt.len() as u64;
        if len > context {
            return Err(RuntimeError::ContextOverflow {
                needed: len,
                max: context,
            }
            .into());
        }
        let room = usize::try_from(context - len + 1).unwrap_or(usize::MAX);
        let eos = if settings.ignore_eos {
            Vec::new()
        } else {
            model.session.header().text.eos_token_ids.clone()
        };
        let text = model.codec.clone().map(|c| {
            let state = StreamState::new(true).with_context(prompt);
            (c, state)
        });
        Ok(Decoding {
            settings: settings.clone(),
            sampler,
            eos,
            limit: settings.max_new_tokens.min(room),
            output: Vec::new(),
            text,
            stop: StopText::new(&settings.stop),
            finish: None,
            stats: GenerationStats {
                prompt_tokens: prompt.len(),
                ..GenerationStats::default()
            },
            constraint: None,
            history: TokenHistory::with_prompt(prompt),
        })
    }

    /// Chooses the next token from `logits`, the step's at KV-cache
    /// `position`: checked finite, masked by the constraint, sampled; with
    /// the step's largest logits when the settings ask for them.
    pub(crate) fn choose(&mut self, logits: &mut [f32], position: u64) -> Result<Choice, Error> {
        check_finite(logits, self.output.len() + 1, position)?;
        if let Some(c) = &mut self.constraint {
            c.mask(logits).map_err(Error::Constraint)?;
            if logits.iter().all(|&l| l == f32::NEG_INFINITY) {
                return Err(Error::Constraint(
                    "the constraint allows no token here".into(),
                ));
            }
        }
        let at = u32::try_from(position).unwrap_or(u32::MAX);
        let token = self.sampler.sample_with_history(logits, at, &self.history);
        if let Some(c) = &mut self.constraint {
            c.accept(token).map_err(Error::Constraint)?;
        }
        self.history.push_generated(token);
        let top = self.settings.top_logits.map(|k| top_logits(logits, k));
        Ok((token, top))
    }

    /// Whether every choice needs the step's logits on the CPU: a
    /// constraint masks them, or the caller asked for the largest ones.
    pub(crate) fn needs_logits(&self) -> bool {
        self.settings.top_logits.is_some() || self.constraint.is_some()
    }

    /// Whether the GPU's greedy token is this answer's choice: greedy, no
    /// penalties, and the logits not needed ([`Decoding::needs_logits`]).
    pub(crate) fn greedy_on_gpu(&self) -> bool {
        let sampling = &self.settings.sampling;
        !self.needs_logits() && sampling.is_greedy() && !sampling.has_penalties()
    }

    /// Takes `token`, chosen on the GPU as [`Decoding::greedy_on_gpu`]
    /// allows, as [`Decoding::choose`] would have chosen it.
    pub(crate) fn chosen_on_gpu(&mut self, token: u32) -> Choice {
        self.history.push_generated(token);
        (token, None)
    }

    /// Records `token` (with its step's `top` logits) and turns it into a
    /// piece; sets the finish reason when the answer ends with it.
    pub(crate) fn piece(
        &mut self,
        token: u32,
        top: Option<Vec<(u32, f32)>>,
    ) -> Result<Piece, Error> {
        self.output.push(token);
        self.stats.generated_tokens = self.output.len();
        let mut text = String::new();
        let mut stopped =
            self.eos.contains(&token) || self.constraint.as_ref().is_some_and(|c| c.is_complete());
        if let Some((codec, state)) = &mut self.text {
            let mut piece = state.push(codec, token)?;
            if stopped || self.output.len() >= self.limit {
                piece.push_str(&state.finish(codec)?);
            }
            let (shown, hit) = self.stop.push(&piece);
            text = shown;
            stopped |= hit;
        }
        if stopped {
            self.finish = Some(FinishReason::Stop);
        } else if self.output.len() >= self.limit {
            text.push_str(&self.stop.finish());
            self.finish = Some(FinishReason::Length);
        }
        Ok(Piece { token, text, top })
    }
}

/// Fails with [`RuntimeError::NonFiniteLogits`] when a logit of `step` (at
/// KV-cache `position`) is NaN or infinite.
pub(crate) fn check_finite(logits: &[f32], step: usize, position: u64) -> Result<(), Error> {
    // Blocks without an early exit, which the compiler vectorizes (a
    // quarter of the time of `position` alone on a 128,256-token row);
    // the position only when one fails.
    let finite = |block: &[f32]| block.iter().fold(true, |ok, x| ok & x.is_finite());
    if logits.chunks(1024).all(finite) {
        return Ok(());
    }
    match logits.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(token) => Err(RuntimeError::NonFiniteLogits {
            step,
            position,
            token: token as u32,
            value: logits[token].to_string(),
        }
        .into()),
    }
}
