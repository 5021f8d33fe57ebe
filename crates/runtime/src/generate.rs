//! The generation loop: prefill the prompt, then decode one token per step
//! until `max_new_tokens` or an end-of-sequence token.

use crate::error::RuntimeError;
use crate::sampling::{Sampler, SamplingParams};
use crate::session::Session;

/// One generated token and the logits that chose it.
pub struct TokenEvent<'a> {
    /// The chosen token.
    pub token: u32,
    /// Logits of the distribution it was chosen from.
    pub logits: &'a [f32],
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
    let max = session.header().model.max_context;
    let needed = (prompt.len() + opts.max_new_tokens.saturating_sub(1)) as u64;
    if prompt.len() as u64 > max || (opts.max_new_tokens > 0 && needed > max) {
        return Err(RuntimeError::ContextOverflow { needed, max });
    }
    let mut sampler = Sampler::new(opts.sampling)?;
    let mut out = Vec::with_capacity(opts.max_new_tokens);
    if opts.max_new_tokens == 0 {
        return Ok(out);
    }
    let mut logits = session.forward(prompt).await?;
    loop {
        let token = sampler.sample(&logits);
        on_token(TokenEvent {
            token,
            logits: &logits,
        });
        out.push(token);
        if out.len() >= opts.max_new_tokens || opts.eos_token_ids.contains(&token) {
            break;
        }
        logits = session.forward(&[token]).await?;
    }
    Ok(out)
}
