//! Constrained generation: a [`TokenConstraint`] decides, before each token,
//! which ids may come next (JSON that must parse, a schema, a tool call).
//!
//! Give one to [`Generation::constrain`](crate::Generation::constrain) before
//! the first token. Each step then reads the logits back, lets the
//! constraint set every forbidden id's logit to −∞, samples as usual
//! (temperature, top-k/p, penalties, seed: the same rules, over what is
//! left), and tells the constraint which id was chosen. The surprise: a
//! constrained generation always takes the CPU path, one logits readback a
//! token, since the GPU's own sampler knows no masks; and it ends by itself
//! (finish reason `stop`) as soon as the constraint is complete, whether or
//! not the model would have written its end-of-sequence token there.
//!
//! `gerbil-grammar` implements the trait with llguidance (JSON schemas, Lark
//! grammars); a test can implement it in a few lines.

/// Which tokens may come next; see the [module docs](self).
pub trait TokenConstraint: Send {
    /// Sets the logit of every id that may not come next to −∞. Called once
    /// before each token is chosen, with the whole vocabulary's logits.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String>;
    /// Records the id chosen (always one `mask` allowed).
    fn accept(&mut self, token: u32) -> Result<(), String>;
    /// Whether the constrained text is complete and nothing may follow it.
    fn is_complete(&self) -> bool;
}
