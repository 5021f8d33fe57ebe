//! The generation loop: prefill the prompt, then decode one token per step
//! until `max_new_tokens` or an end-of-sequence token.
//!
//! Generation whose caller does not need the logits runs on the GPU
//! ([`Session::decode_on_gpu`]: the plan's `sample_token` kernel chooses,
//! steps are encoded [`DECODE_BATCH`] at a time, no logits readback); with
//! [`GenerateOptions::keep_logits`] each step's logits are read and the
//! [`Sampler`] chooses on the CPU. Both make the same choice (the sampler's
//! noise is a hash of the seed and the position). Penalties
//! ([`SamplingParams::has_penalties`]) need the tokens so far, which only the
//! CPU keeps: with them, every step's logits are read back too.

use crate::error::RuntimeError;
use crate::sampling::{Sampler, SamplingParams, TokenHistory};
use crate::session::Session;

/// Decode steps per submission when decoding greedily on the GPU: enough
/// that the round trip of a readback hides behind the next batch, few enough
/// that tokens stream smoothly (a batch is ~10–30 ms on a fast GPU).
pub const DECODE_BATCH: usize = 8;

/// One generated token and the logits that chose it.
pub struct TokenEvent<'a> {
    /// The chosen token.
    pub token: u32,
    /// Logits of the distribution it was chosen from (after the penalties,
    /// when any are on); `None` when decoding ran on the GPU (ask for them
    /// with [`GenerateOptions::keep_logits`]).
    pub logits: Option<&'a [f32]>,
}

/// Settings of one generation.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_new_tokens: usize,
    /// Token choice.
    pub sampling: SamplingParams,
    /// Ids that stop generation (the stop token itself is emitted).
    pub eos_token_ids: Vec<u32>,
    /// Read every step's logits back (for [`TokenEvent::logits`]), which
    /// keeps the CPU in the loop.
    pub keep_logits: bool,
}

/// Runs the prompt and generates; `on_token` sees each token as it is chosen
/// (a server streams it from there; the future yields at every GPU readback).
/// Returns the generated ids. The session's KV cache is reset first.
pub async fn generate(
    session: &mut Session,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(TokenEvent<'_>),
) -> Result<Vec<u32>, RuntimeError> {
    session.reset();
    let max = session.context();
    // Saturating: `max_new_tokens` may be any usize a caller passes.
    let needed = (prompt.len() as u64).saturating_add(opts.max_new_tokens.saturating_sub(1) as u64);
    if prompt.len() as u64 > max || (opts.max_new_tokens > 0 && needed > max) {
        return Err(RuntimeError::ContextOverflow { needed, max });
    }
    let sampler = Sampler::new(opts.sampling)?;
    // Reserve for a typical reply, not for the whole context up front.
    let mut out = Vec::with_capacity(opts.max_new_tokens.min(4096));
    if opts.max_new_tokens == 0 {
        return Ok(out);
    }
    if !opts.keep_logits && session.can_sample_on_gpu(&opts.sampling) {
        session.set_sampling(&opts.sampling);
        session.forward_no_readback(prompt).await?;
        let out = session
            .decode_on_gpu(
                opts.max_new_tokens,
                &opts.eos_token_ids,
                DECODE_BATCH,
                |token| {
                    on_token(TokenEvent {
                        token,
                        logits: None,
                    });
                    true
                },
            )
            .await;
        session.set_sampling(&SamplingParams::default());
        return out;
    }
    let mut history = TokenHistory::with_prompt(prompt);
    let mut logits = session.forward(prompt).await?;
    loop {
        let position = u32::try_from(session.position().saturating_sub(1)).unwrap_or(u32::MAX);
        let token = sampler.sample_with_history(&mut logits, position, &history);
        history.push_generated(token);
        on_token(TokenEvent {
            token,
            logits: Some(&logits),
        });
        out.push(token);
        if out.len() >= opts.max_new_tokens || opts.eos_token_ids.contains(&token) {
            break;
        }
        logits = session.forward(&[token]).await?;
    }
    Ok(out)
}
