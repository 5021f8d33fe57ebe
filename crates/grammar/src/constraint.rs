//! One generation's grammar state: llguidance's [`Matcher`] behind gerbil's
//! [`TokenConstraint`].
//!
//! Made by [`crate::Grammars::constraint`]; give it to
//! `Generation::constrain`. After each accepted token it computes the next
//! step's mask at once, so it knows whether anything but an end could
//! follow: when only the end-of-sequence ids may come next (or the grammar
//! stopped), the constraint is complete and the generation ends there,
//! without spending a step on the end token.

use gerbil::TokenConstraint;
use llguidance::Matcher;
use toktrie::SimpleVob;

/// A compiled grammar following one generation.
pub struct GrammarConstraint {
    matcher: Matcher,
    /// The mask for the next token, computed after the last accepted one.
    next: Option<SimpleVob>,
    complete: bool,
    eos: Vec<u32>,
}

impl GrammarConstraint {
    pub(crate) fn new(matcher: Matcher, eos: Vec<u32>) -> GrammarConstraint {
        GrammarConstraint {
            matcher,
            next: None,
            complete: false,
            eos,
        }
    }

    /// The grammar's error, if it has one, as text.
    fn failed(&self, what: &str) -> String {
        let detail = self
            .matcher
            .get_error()
            .unwrap_or_else(|| "unknown error".into());
        format!("{what}: {detail}")
    }

    fn compute_mask(&mut self) -> Result<SimpleVob, String> {
        self.matcher
            .compute_mask_or_eos()
            .map_err(|e| format!("computing the token mask failed: {e}"))
    }
}

impl TokenConstraint for GrammarConstraint {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let mask = match self.next.take() {
            Some(mask) => mask,
            None => self.compute_mask()?,
        };
        if self.matcher.is_error() {
            return Err(self.failed("the grammar failed"));
        }
        for (id, logit) in logits.iter_mut().enumerate() {
            if !mask.is_allowed(id as u32) {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        self.matcher
            .consume_token(token)
            .map_err(|e| format!("token {token} does not fit the grammar: {e}"))?;
        if self.matcher.is_stopped() {
            self.complete = true;
            return Ok(());
        }
        let mask = self.compute_mask()?;
        // Counting the set bits first: a mask of free text holds most of the
        // vocabulary, and is never only the end ids.
        let set = mask.num_set();
        let only_end =
            set > 0 && set <= self.eos.len() && mask.iter().all(|id| self.eos.contains(&id));
        self.complete = only_end;
        self.next = Some(mask);
        Ok(())
    }

    fn is_complete(&self) -> bool {
        self.complete
    }
}
