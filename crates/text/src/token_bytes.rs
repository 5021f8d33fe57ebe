//! The bytes of text each token id stands for: what a grammar-constrained
//! sampler matches a grammar against ([`TextCodec::token_bytes`]).
//!
//! A vocabulary stores tokens as strings in its decoder's own alphabet, not
//! as the text they produce: a byte-level BPE (GPT-2, SmolLM2, Llama 3,
//! Qwen) maps each byte to one printable character (`Ġ` for a space), and a
//! SentencePiece vocabulary (Llama 2, Gemma) writes a space as `▁` and an
//! unprintable byte as `<0xNN>`. This module undoes either mapping, as the
//! tokenizer's decoder would, but token by token and byte-exact: a byte-level
//! token holding half of a multi-byte character keeps its half (decoding it
//! alone would give U+FFFD). Added tokens are text as written; special ones
//! (`<|im_end|>`, `<start_of_turn>`) are kept apart, since they never appear
//! inside generated text.

use crate::TextCodec;

/// What one token id stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenBytes {
    /// Text: these bytes (a piece of UTF-8, possibly not whole characters).
    Text(Vec<u8>),
    /// A special token, by its content.
    Special(String),
    /// An id the vocabulary does not name (a gap, or past its end).
    Unused,
}

/// The GPT-2 byte-level alphabet: the character standing for each byte.
/// Printable Latin-1 bytes stand for themselves; the others, in order, for
/// U+0100 onwards.
fn byte_level_chars() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let mut chars = ['\0'; 256];
    let mut next = 256;
    for (b, c) in (0u32..).zip(chars.iter_mut()) {
        let code = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        *c = char::from_u32(code).unwrap_or('\0');
    }
    chars
}

/// A vocabulary string of a byte-level BPE as bytes; `None` when a
/// character is outside the alphabet.
fn byte_level(token: &str, alphabet: &std::collections::HashMap<char, u8>) -> Option<Vec<u8>> {
    token.chars().map(|c| alphabet.get(&c).copied()).collect()
}

/// A SentencePiece piece as bytes: `<0xNN>` is byte `NN`, `▁` a space.
fn sentencepiece(token: &str) -> Vec<u8> {
    if let Some(hex) = token
        .strip_prefix("<0x")
        .and_then(|t| t.strip_suffix('>'))
        .filter(|h| h.len() == 2)
    {
        if let Ok(b) = u8::from_str_radix(hex, 16) {
            return vec![b];
        }
    }
    token.replace('\u{2581}', " ").into_bytes()
}

impl TextCodec {
    /// What each id in `0..vocab_size()` stands for (see the [module
    /// docs](crate::token_bytes)).
    pub fn token_bytes(&self) -> Vec<TokenBytes> {
        let tokenizer = &self.tokenizer;
        let byte_level_decoder = tokenizer
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .is_some_and(|d| d.contains("\"ByteLevel\""));
        let alphabet: std::collections::HashMap<char, u8> =
            byte_level_chars().into_iter().zip(0..=255u8).collect();
        let added = tokenizer.get_added_tokens_decoder();
        let mut out = vec![TokenBytes::Unused; self.vocab_size()];
        for (token, id) in tokenizer.get_vocab(true) {
            let Some(slot) = out.get_mut(id as usize) else {
                continue;
            };
            *slot = match added.get(&id) {
                Some(a) if a.special => TokenBytes::Special(a.content.clone()),
                Some(a) => TokenBytes::Text(a.content.clone().into_bytes()),
                None if byte_level_decoder => match byte_level(&token, &alphabet) {
                    Some(bytes) => TokenBytes::Text(bytes),
                    None => TokenBytes::Text(token.into_bytes()),
                },
                None => TokenBytes::Text(sentencepiece(&token)),
            };
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_level_alphabet_is_a_bijection_with_gpt2s_space() {
        let chars = byte_level_chars();
        assert_eq!(chars[b' ' as usize], 'Ġ');
        assert_eq!(chars[b'\n' as usize], 'Ċ');
        assert_eq!(chars[b'a' as usize], 'a');
        let distinct: std::collections::HashSet<char> = chars.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn sentencepiece_pieces_become_their_text() {
        assert_eq!(sentencepiece("\u{2581}the"), b" the");
        assert_eq!(sentencepiece("<0x0A>"), b"\n");
        assert_eq!(sentencepiece("<0xZZ>"), b"<0xZZ>");
        assert_eq!(sentencepiece("<0x0AB>"), b"<0x0AB>");
    }
}
