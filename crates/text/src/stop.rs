//! Stop strings in streamed text: [`StopText`] passes generated text through
//! and ends it at the first occurrence of any stop string, which is left out.
//!
//! Feed it each decoded piece with [`StopText::push`]; it returns what may be
//! shown now and whether a stop string was found. The surprise: a stop string
//! can arrive split over several tokens (`"\n\n"` as `"\n"` + `"\n"`, or
//! `"User:"` as `"Us"` + `"er:"`), so text that could be the beginning of a
//! stop string is held back until the next piece decides it, and
//! [`StopText::finish`] releases it when generation ends for another reason.
//! Text once shown never contains the beginning of a stop string that later
//! completes, so a stream of pieces equals the final text exactly.

/// The stop strings of one generation and the text held back for them.
#[derive(Clone, Debug, Default)]
pub struct StopText {
    stops: Vec<String>,
    /// Decoded text not shown yet: a tail that may begin a stop string.
    held: String,
}

impl StopText {
    /// A matcher for `stops` (empty strings are ignored; a generation
    /// refuses them before it starts).
    pub fn new(stops: &[String]) -> Self {
        StopText {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Adds a decoded piece. Returns the text that can be shown now and
    /// whether a stop string ended the text (then the returned text stops
    /// just before it, and later pieces must not be pushed).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        if let Some(at) = first_completed(&self.held, &self.stops) {
            let shown = self.held[..at].to_string();
            self.held.clear();
            return (shown, true);
        }
        let keep = self.undecided_tail();
        let shown = self.held[..keep].to_string();
        self.held.drain(..keep);
        (shown, false)
    }

    /// The text still held back (generation ended without a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Where the longest tail of `held` that begins some stop string starts
    /// (`held.len()` when none does).
    fn undecided_tail(&self) -> usize {
        self.held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len())
    }
}

/// Where the stop string that completes first in `text` starts (the one
/// ending earliest; of those, the longest): the cut a stream makes, since a
/// streamed stop is found as soon as its last character arrives.
fn first_completed(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter_map(|s| text.find(s.as_str()).map(|at| (at + s.len(), at)))
        .min()
        .map(|(_, at)| at)
}

#[cfg(test)]
mod tests {
    use super::{first_completed, StopText};
    use proptest::prelude::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopText::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let (shown, stopped) = m.push(p);
            out.push_str(&shown);
            if stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn a_stop_split_over_pieces_is_found_and_left_out() {
        assert_eq!(
            run(&["User:"], &["Hi", " there\nUs", "er: more"]),
            ("Hi there\n".into(), true)
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
        // A false start is released as soon as it cannot be a stop string.
        assert_eq!(run(&["User:"], &["Us", "ually"]), ("Usually".into(), false));
        // The stop that completes first wins, as it would when streamed.
        assert_eq!(run(&["c", "b"], &["abc"]), ("a".into(), true));
        assert_eq!(run(&["abc", "b"], &["abc"]), ("a".into(), true));
        assert_eq!(run(&["abc", "bc"], &["abc"]), ("".into(), true));
        assert_eq!(run(&[], &["x", "y"]), ("xy".into(), false));
    }

    #[test]
    fn held_text_is_released_piece_by_piece() {
        let stops = vec!["STOP".to_string()];
        let mut m = StopText::new(&stops);
        assert_eq!(m.push("abS"), ("ab".into(), false));
        assert_eq!(m.push("T"), (String::new(), false));
        assert_eq!(m.push("x"), ("STx".into(), false));
        assert_eq!(m.push("é S"), ("é ".into(), false));
        assert_eq!(m.finish(), "S");
    }

    proptest! {
        /// Streaming equals cutting the whole text where its first stop
        /// string to complete begins, however the text is split into pieces.
        #[test]
        fn streaming_equals_cutting_the_whole_text(
            text in "[ab\\n é]{0,24}",
            stops in proptest::collection::vec("[ab\\n]{1,3}", 0..3),
            cuts in proptest::collection::vec(0usize..24, 0..6),
        ) {
            let mut bounds: Vec<usize> = cuts
                .into_iter()
                .filter(|&c| c <= text.len() && text.is_char_boundary(c))
                .collect();
            bounds.push(0);
            bounds.push(text.len());
            bounds.sort_unstable();
            bounds.dedup();
            let pieces: Vec<&str> = bounds.windows(2).map(|w| &text[w[0]..w[1]]).collect();
            let stop_refs: Vec<&str> = stops.iter().map(String::as_str).collect();
            let want = match first_completed(&text, &stops) {
                Some(at) => (text[..at].to_string(), true),
                None => (text.clone(), false),
            };
            prop_assert_eq!(run(&stop_refs, &pieces), want);
        }
    }
}
