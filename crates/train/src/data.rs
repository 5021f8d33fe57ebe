//! The batches of a training run, as `gerbil-train` documents them: the
//! tokenized file (BOS as the tokenizer adds it, no separators) is cut into
//! consecutive, non-overlapping windows of `L + 1` tokens, a tail too
//! short for one dropped; step `i` takes windows `i·B … i·B + B − 1`,
//! wrapping at the end. A window's first `L` tokens are the input and its
//! last `L` the next-token targets.
//!
//! ```
//! use gerbil_train::Windows;
//! let stream: Vec<u32> = (0..11).collect();
//! let windows = Windows::new(stream, 2)?; // three windows of 3, two tokens dropped
//! let batch = windows.batch(1, 2); // step 1 of batches of 2: windows 2 and 0
//! assert_eq!(batch, [&[6, 7, 8][..], &[0, 1, 2][..]]);
//! assert_eq!(Windows::split(batch[0]), (&[6, 7][..], &[7, 8][..]));
//! # Ok::<(), gerbil_train::DataError>(())
//! ```
//!
//! With `--shuffle SEED` ([`Windows::shuffled`]) each pass over the
//! windows takes them in an order of its own, drawn from the seed and the
//! pass's number: the same seed gives the same batches.
//!
//! The surprise: a window shares no token with the next, so the last token
//! of a window is a target but never an input; that is what PyTorch
//! scripts that chunk a corpus into `L + 1` blocks do, and what
//! `scripts/make-train-refs.py` does.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::cell::RefCell;

/// Mixes a pass's number into the shuffle's seed (the golden ratio's bits).
const PASS_MIX: u64 = 0x9e37_79b9_7f4a_7c15;

/// Why a token stream cannot be cut into windows.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DataError {
    /// Fewer tokens than one window needs.
    #[error(
        "the training text has {tokens} tokens, fewer than one window of {needed} \
         (--seq-len {seq_len} + 1); use a longer text or a smaller --seq-len"
    )]
    TooShort {
        /// Tokens in the stream.
        tokens: usize,
        /// Tokens of one window.
        needed: usize,
        /// The sequence length asked for.
        seq_len: usize,
    },
    /// A sequence length of zero.
    #[error("--seq-len must be at least 1")]
    EmptySequence,
    /// A sequence longer than the model's context.
    #[error(
        "--seq-len {seq_len} is longer than the model's context of {context} tokens; \
         use at most --seq-len {context}"
    )]
    PastContext {
        /// The sequence length asked for.
        seq_len: usize,
        /// The model's context (`max_position_embeddings`).
        context: usize,
    },
}

/// A token stream cut into windows of `seq_len + 1`; see the module docs.
#[derive(Clone, Debug)]
pub struct Windows {
    stream: Vec<u32>,
    seq_len: usize,
    count: usize,
    /// The shuffle's seed, and the last pass's order.
    shuffle: Option<(u64, RefCell<Option<PassOrder>>)>,
}

/// A pass's number and the order it takes the windows in.
type PassOrder = (usize, Vec<usize>);

impl Windows {
    /// Cuts `stream` into windows of `seq_len + 1` tokens for a model of
    /// `context` positions (a sequence may fill them all).
    pub fn for_model(stream: Vec<u32>, seq_len: usize, context: usize) -> Result<Self, DataError> {
        if seq_len > context {
            return Err(DataError::PastContext { seq_len, context });
        }
        Windows::new(stream, seq_len)
    }

    /// Cuts `stream` into windows of `seq_len + 1` tokens.
    pub fn new(stream: Vec<u32>, seq_len: usize) -> Result<Self, DataError> {
        if seq_len == 0 {
            return Err(DataError::EmptySequence);
        }
        let count = stream.len() / (seq_len + 1);
        if count == 0 {
            return Err(DataError::TooShort {
                tokens: stream.len(),
                needed: seq_len + 1,
                seq_len,
            });
        }
        Ok(Windows {
            stream,
            seq_len,
            count,
            shuffle: None,
        })
    }

    /// The same windows, each pass over them in an order drawn from `seed`
    /// and the pass's number.
    pub fn shuffled(self, seed: u64) -> Self {
        Windows {
            shuffle: Some((seed, RefCell::new(None))),
            ..self
        }
    }

    /// Which window is the `w`-th taken, counted around the stream.
    fn taken(&self, w: usize) -> usize {
        let (pass, at) = (w / self.count, w % self.count);
        let Some((seed, order)) = &self.shuffle else {
            return at;
        };
        let mut order = order.borrow_mut();
        match &*order {
            Some((p, o)) if *p == pass => o[at],
            _ => {
                let mut o: Vec<usize> = (0..self.count).collect();
                let mut rng = StdRng::seed_from_u64(seed ^ (pass as u64).wrapping_mul(PASS_MIX));
                o.shuffle(&mut rng);
                let taken = o[at];
                *order = Some((pass, o));
                taken
            }
        }
    }

    /// The whole token stream.
    pub fn tokens(&self) -> &[u32] {
        &self.stream
    }

    /// Number of windows.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The `w`-th window taken (of `seq_len + 1` tokens), counted around
    /// the stream: window `count` is window 0 again (without a shuffle; with
    /// one, the first of the next pass's order).
    pub fn window(&self, w: usize) -> &[u32] {
        let len = self.seq_len + 1;
        let w = self.taken(w);
        &self.stream[w * len..(w + 1) * len]
    }

    /// The `batch` windows of step `step`: `step·batch + b` for each
    /// `b < batch`, around the stream (none for a batch of 0, which a
    /// trainer refuses).
    pub fn batch(&self, step: usize, batch: usize) -> Vec<&[u32]> {
        (0..batch)
            .map(|b| self.window(step.wrapping_mul(batch).wrapping_add(b)))
            .collect()
    }

    /// A window's input tokens and next-token targets (both empty for a
    /// window of fewer than two tokens, which [`Windows`] never makes).
    pub fn split(window: &[u32]) -> (&[u32], &[u32]) {
        match window {
            [] | [_] => (&[], &[]),
            _ => (&window[..window.len() - 1], &window[1..]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_short_a_stream_says_how_many_tokens_a_window_needs() {
        let err = Windows::new(vec![1, 2, 3], 3).unwrap_err();
        assert_eq!(
            err,
            DataError::TooShort {
                tokens: 3,
                needed: 4,
                seq_len: 3
            }
        );
        assert!(err.to_string().contains("smaller --seq-len"), "{err}");
        assert_eq!(
            Windows::new(vec![1], 0).unwrap_err(),
            DataError::EmptySequence
        );
    }

    #[test]
    fn a_sequence_past_the_model_s_context_says_the_most_it_may_be() {
        let err = Windows::for_model(vec![0; 100], 64, 32).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--seq-len 64 is longer than the model's context of 32 tokens; use at most --seq-len 32"
        );
        assert!(Windows::for_model(vec![0; 100], 32, 32).is_ok());
    }

    #[test]
    fn steps_walk_the_windows_in_order_and_wrap() {
        let w = Windows::new((0..20).collect(), 4).unwrap();
        assert_eq!(w.count(), 4);
        let firsts = |step| -> Vec<u32> { w.batch(step, 3).iter().map(|w| w[0]).collect() };
        assert_eq!(firsts(0), [0, 5, 10]);
        assert_eq!(firsts(1), [15, 0, 5]);
        assert_eq!(firsts(4), [0, 5, 10]);
    }

    #[test]
    fn a_shuffle_takes_every_window_once_a_pass_and_repeats_with_its_seed() {
        let w = Windows::new((0..100).collect(), 4).unwrap().shuffled(7);
        let pass = |p: usize| -> Vec<u32> { (0..20).map(|i| w.window(p * 20 + i)[0]).collect() };
        let (first, second) = (pass(0), pass(1));
        let mut sorted = first.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..20).map(|i| i * 5).collect::<Vec<u32>>());
        assert_ne!(first, second, "each pass has an order of its own");
        assert_ne!(first, sorted, "a shuffled pass is not in file order");
        let again = Windows::new((0..100).collect(), 4).unwrap().shuffled(7);
        assert_eq!(again.window(25), w.window(25));
    }
}
