//! Incremental detokenization for printing tokens as they are generated.
//!
//! Decoding one id at a time is wrong twice over: byte-level tokens can hold half a UTF-8
//! character (an emoji is often 2–4 tokens), and some decoders change a token's text depending
//! on what precedes it (sentencepiece strips the leading space of the first token). So, like
//! text-generation-inference, we keep two offsets into the ids: `prefix` (a point where the
//! decoded text is known to be clean) and `read` (everything before it has been emitted). For
//! each new id we decode `ids[prefix..]` and `ids[prefix..read]` and emit the difference once
//! it no longer ends in U+FFFD (an incomplete character).

use super::{TextCodec, TextError};

const REPLACEMENT: char = '\u{FFFD}';

/// Turns generated ids into printable text pieces; concatenated, the pieces equal
/// `codec.decode(all_ids)` (for the byte-level and byte-fallback decoders used by current models).
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    codec: &'a TextCodec,
    state: StreamState,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder of ids into `codec`'s text; special tokens are left out
    /// when `skip_special_tokens`.
    pub fn new(codec: &'a TextCodec, skip_special_tokens: bool) -> Self {
        Self {
            codec,
            state: StreamState::new(skip_special_tokens),
        }
    }

    /// Uses the end of the prompt as decoding context without emitting it, so the first
    /// generated token is decoded as it reads after the prompt (e.g. keeps its leading space
    /// with sentencepiece decoders). A few tokens are enough; the last 5 are kept.
    pub fn with_context(mut self, prompt_ids: &[u32]) -> Self {
        self.state = self.state.with_context(prompt_ids);
        self
    }

    /// Adds one id; returns the text that became printable (often empty: a special token
    /// being skipped, or part of a character still waiting for its remaining bytes).
    pub fn push(&mut self, id: u32) -> Result<String, TextError> {
        self.state.push(self.codec, id)
    }

    /// Flushes what is still held back (an incomplete character at the very end is emitted
    /// as U+FFFD, as `decode` would) and clears the pending ids. Call once generation stops.
    pub fn finish(&mut self) -> Result<String, TextError> {
        self.state.finish(self.codec)
    }
}

/// What a [`StreamDecoder`] keeps between ids, without the codec: for a holder that cannot
/// borrow the codec for its whole life (a generation that also borrows the model owning it)
/// and passes it to every call instead.
#[derive(Clone, Debug)]
pub struct StreamState {
    skip_special_tokens: bool,
    /// Ids from the last clean point on (earlier ones are no longer needed).
    ids: Vec<u32>,
    /// `ids[..prefix]` is decoding context only; `ids[prefix..read]` was emitted already.
    prefix: usize,
    read: usize,
}

impl StreamState {
    /// An empty stream; special tokens are left out of the text when `skip_special_tokens`.
    pub fn new(skip_special_tokens: bool) -> Self {
        Self {
            skip_special_tokens,
            ids: Vec::new(),
            prefix: 0,
            read: 0,
        }
    }

    /// See [`StreamDecoder::with_context`].
    pub fn with_context(mut self, prompt_ids: &[u32]) -> Self {
        let tail = &prompt_ids[prompt_ids.len().saturating_sub(5)..];
        self.ids = tail.to_vec();
        self.prefix = 0;
        self.read = self.ids.len();
        self
    }

    /// See [`StreamDecoder::push`].
    pub fn push(&mut self, codec: &TextCodec, id: u32) -> Result<String, TextError> {
        self.ids.push(id);
        let prefix_text =
            codec.decode(&self.ids[self.prefix..self.read], self.skip_special_tokens)?;
        let new_text = codec.decode(&self.ids[self.prefix..], self.skip_special_tokens)?;
        if new_text.len() > prefix_text.len() && !new_text.ends_with(REPLACEMENT) {
            if let Some(piece) = new_suffix(&prefix_text, &new_text) {
                let piece = piece.to_owned();
                // Everything up to `read` is decoded cleanly: it becomes the new context.
                self.ids.drain(..self.read);
                self.prefix = 0;
                self.read = self.ids.len();
                return Ok(piece);
            }
        }
        Ok(String::new())
    }

    /// See [`StreamDecoder::finish`].
    pub fn finish(&mut self, codec: &TextCodec) -> Result<String, TextError> {
        if self.read == self.ids.len() {
            return Ok(String::new());
        }
        let prefix_text =
            codec.decode(&self.ids[self.prefix..self.read], self.skip_special_tokens)?;
        let new_text = codec.decode(&self.ids[self.prefix..], self.skip_special_tokens)?;
        let piece = new_suffix(&prefix_text, &new_text)
            .unwrap_or_default()
            .to_owned();
        self.ids.drain(..self.read);
        self.prefix = 0;
        self.read = self.ids.len();
        Ok(piece)
    }
}

/// The part of `new` after `prefix`, when `new` extends `prefix` (it always does for
/// byte-level and byte-fallback decoders).
fn new_suffix<'t>(prefix: &str, new: &'t str) -> Option<&'t str> {
    if new.starts_with(prefix) {
        new.get(prefix.len()..)
    } else {
        None
    }
}
