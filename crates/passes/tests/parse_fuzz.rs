//! The parser never panics: random strings and random edits of real dumps
//! (tiny Llama lowered and fully fused) either parse into a graph that
//! verifies and prints back to a fixed point, or fail with a located error.

mod common;

use gerbil_ir::{parse, print::print, verify};
use gerbil_passes::{default_pipeline, PassManager};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use std::sync::OnceLock;

/// Dumps of tiny Llama as lowered and after the default pipeline.
fn dumps() -> &'static [String; 2] {
    static DUMPS: OnceLock<[String; 2]> = OnceLock::new();
    DUMPS.get_or_init(|| {
        let mut g = common::tiny("llama");
        let lowered = print(&g);
        PassManager::new(default_pipeline())
            .run(&mut g, |_, _| {})
            .unwrap();
        [lowered, print(&g)]
    })
}

/// Characters that matter to the grammar, plus a few that never do.
const CHARS: &[char] = &[
    '%', '#', '~', '"', '\\', '{', '}', '(', ')', '[', ']', ',', '=', ':', '.', '0', '1', '9', '-',
    'e', 'T', ' ', '\n', '/', 'é', '\0',
];

/// One edit of a text: `(kind, position, char)`.
fn edit(text: &str, kind: u8, at: usize, c: char) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    let i = at % (chars.len() + 1);
    match kind % 4 {
        0 if i < chars.len() => chars[i] = c,
        1 if i < chars.len() => {
            chars.remove(i);
        }
        2 => chars.insert(i, c),
        _ => {
            // Swap two lines, or drop one.
            let mut lines: Vec<&str> = text.lines().collect();
            let j = at % lines.len().max(1);
            if c.is_ascii_digit() && j + 1 < lines.len() {
                lines.swap(j, j + 1);
            } else if j < lines.len() {
                lines.remove(j);
            }
            return lines.join("\n");
        }
    }
    chars.into_iter().collect()
}

fn check(text: &str) -> Result<(), TestCaseError> {
    match parse(text) {
        Ok(g) => {
            prop_assert!(verify(&g).is_ok(), "parsed graph does not verify");
            let printed = print(&g);
            let again = parse(&printed).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(print(&again), printed);
        }
        Err(e) => {
            prop_assert!(
                e.line >= 1 && e.column >= 1 && !e.message.is_empty(),
                "{}",
                e
            );
            prop_assert!(e.line <= text.lines().count().max(1), "{}", e);
        }
    }
    Ok(())
}

proptest! {
    // proptest's default 256 cases (`PROPTEST_CASES` changes it); failures persist beside this
    // file (`parse_fuzz.proptest-regressions`).
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_strings_never_panic(text in "\\PC{0,200}") {
        check(&text)?;
    }

    #[test]
    fn random_graph_like_lines_never_panic(
        lines in prop::collection::vec("[ %#~a-z0-9_.=:,(){}\\[\\]\"-]{0,40}", 0..6),
    ) {
        check(&format!("graph g\n{}", lines.join("\n")))?;
    }

    #[test]
    fn edited_dumps_never_panic(
        which in 0usize..2,
        edits in prop::collection::vec((any::<u8>(), any::<usize>(), prop::sample::select(CHARS)), 1..4),
    ) {
        let mut text = dumps()[which].clone();
        for (kind, at, c) in edits {
            text = edit(&text, kind, at, c);
        }
        check(&text)?;
    }
}
