//! The model's vocabulary as llguidance sees it: a trie of the bytes each
//! id stands for ([`TextCodec::token_bytes`]), the plan's
//! end-of-sequence ids, and the model's own tokenizer for text.
//!
//! Built once per model ([`crate::Grammars::new`]); every grammar compiled
//! afterwards shares it. The surprise: the trie covers the logits' width,
//! not the tokenizer's: ids past the tokenizer's end (padding rows of the
//! LM head) and ids it leaves unnamed stand for no bytes, so no grammar ever
//! allows them; and a plan without end-of-sequence ids gets one extra id
//! past the logits, which the model can never choose, so a finished grammar
//! still has an end to ask for.

use crate::GrammarError;
use gerbil_text::{TextCodec, TokenBytes};
use std::sync::Arc;
use toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// Longest token the trie holds (toktrie's own limit is 1,024 bytes).
const MAX_TOKEN_BYTES: usize = 1024;
/// Most bytes of all tokens together (toktrie's trie holds about 4M nodes).
const MAX_VOCABULARY_BYTES: usize = 3 << 20;

/// The tokenizer environment llguidance compiles grammars against.
pub(crate) struct Vocabulary {
    trie: TokTrie,
    codec: Arc<TextCodec>,
}

impl Vocabulary {
    /// The vocabulary of a model with `logits` ids, its `codec` and its
    /// end-of-sequence ids `eos`.
    pub(crate) fn new(
        codec: Arc<TextCodec>,
        logits: usize,
        eos: &[u32],
    ) -> Result<Vocabulary, GrammarError> {
        let mut words: Vec<Vec<u8>> = codec
            .token_bytes()
            .into_iter()
            .map(|t| match t {
                TokenBytes::Text(bytes) => bytes,
                TokenBytes::Special(content) => {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(content.as_bytes());
                    w
                }
                TokenBytes::Unused => Vec::new(),
            })
            .collect();
        if words.len() > logits {
            return Err(GrammarError::Vocabulary(format!(
                "the tokenizer has {} ids but the model only {logits} logits",
                words.len()
            )));
        }
        words.resize(logits, Vec::new());
        let mut eos: Vec<u32> = eos
            .iter()
            .copied()
            .filter(|&e| (e as usize) < logits)
            .collect();
        if eos.is_empty() {
            let mut end = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            end.extend_from_slice(b"<|gerbil:end|>");
            words.push(end);
            eos.push(logits as u32);
        }
        if let Some(long) = words.iter().position(|w| w.len() > MAX_TOKEN_BYTES) {
            return Err(GrammarError::Vocabulary(format!(
                "token {long} is {} bytes long, more than the {MAX_TOKEN_BYTES} a grammar can \
                 match",
                words[long].len()
            )));
        }
        let total: usize = words.iter().map(Vec::len).sum();
        if total > MAX_VOCABULARY_BYTES {
            return Err(GrammarError::Vocabulary(format!(
                "the vocabulary's tokens hold {total} bytes, more than the \
                 {MAX_VOCABULARY_BYTES} a grammar's token trie can"
            )));
        }
        let info = TokRxInfo {
            vocab_size: words.len() as u32,
            tok_eos: eos[0],
            tok_bos: None,
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: None,
        };
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
        Ok(Vocabulary { trie, codec })
    }
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.codec
                .encode_plain(text, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        })
    }
}
