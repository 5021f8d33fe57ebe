//! Every fuzz target on its committed corpus, then on mutations of it.
//!
//! For each target in [`gerbil_fuzz::TARGETS`]: every file of
//! `fuzz/corpus/<target>/` is run once (the inputs the fuzzer found
//! interesting, crashes it once found included), then proptest mutates them
//! (byte overwrites, insertions, deletions, splices with another file) from a
//! fixed seed for [`BUDGET`] (or [`MAX_CASES`] inputs, whichever comes
//! first), so a regression shows up in `cargo test` on stable, without
//! cargo-fuzz. An input that panics is written to
//! `target/fuzz-failures/<target>-<n>.bin` and named in the failure: replay
//! it with `cargo +nightly fuzz run <target> <file>` or add it to the corpus.

use gerbil_fuzz::{Target, TARGETS};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Time each target is mutated for, after the replay.
const BUDGET: Duration = Duration::from_secs(2);
/// Most mutated inputs per target.
const MAX_CASES: usize = 20_000;
/// Longest mutated input.
const MAX_LEN: usize = 64 << 10;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = workspace().join("fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("corpus entry").path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let bytes = std::fs::read(&path).expect("corpus file");
            (path, bytes)
        })
        .collect()
}

/// Runs `input`; on a panic, saves it and fails naming the file.
fn run_one(name: &str, target: Target, input: &[u8], what: &str, case: usize) {
    if catch_unwind(AssertUnwindSafe(|| target(input))).is_err() {
        let dir = workspace().join("target/fuzz-failures");
        std::fs::create_dir_all(&dir).expect("create target/fuzz-failures");
        let path = dir.join(format!("{name}-{case}.bin"));
        std::fs::write(&path, input).expect("write the failing input");
        panic!(
            "fuzz target `{name}` panicked on {what}; the input is in {} \
             (replay: cargo +nightly fuzz run {name} {})",
            path.display(),
            path.display()
        );
    }
}

/// One edit of a mutation: at `at` (a fraction of the length), overwrite,
/// insert or delete `bytes`, or splice in part of another corpus file.
#[derive(Clone, Debug)]
enum Edit {
    Overwrite(f64, Vec<u8>),
    Insert(f64, Vec<u8>),
    Delete(f64, usize),
    Splice(f64, usize, f64, usize),
    /// A boundary number (0, 1, 0xff.., 0x80..) written over 8 bytes.
    Number(f64, u64),
}

fn edit() -> impl Strategy<Value = Edit> {
    let at = 0.0..1.0f64;
    let bytes = prop::collection::vec(any::<u8>(), 1..8);
    let numbers = prop::sample::select(vec![
        0,
        1,
        u64::MAX,
        1 << 63,
        u32::MAX as u64,
        1 << 31,
        (1 << 32) + 1,
        65_535,
        65_536,
    ]);
    prop_oneof![
        (at.clone(), bytes.clone()).prop_map(|(a, b)| Edit::Overwrite(a, b)),
        (at.clone(), bytes).prop_map(|(a, b)| Edit::Insert(a, b)),
        (at.clone(), 1..64usize).prop_map(|(a, n)| Edit::Delete(a, n)),
        (at.clone(), any::<usize>(), at.clone(), 1..256usize)
            .prop_map(|(a, f, s, n)| Edit::Splice(a, f, s, n)),
        (at, numbers).prop_map(|(a, n)| Edit::Number(a, n)),
    ]
}

fn apply(input: &mut Vec<u8>, edit: &Edit, corpus: &[(PathBuf, Vec<u8>)]) {
    let pos = |f: f64, len: usize| ((f * len as f64) as usize).min(len);
    match edit {
        Edit::Overwrite(a, b) => {
            let at = pos(*a, input.len());
            for (i, &byte) in b.iter().enumerate() {
                match input.get_mut(at + i) {
                    Some(slot) => *slot = byte,
                    None => input.push(byte),
                }
            }
        }
        Edit::Insert(a, b) => {
            let at = pos(*a, input.len());
            input.splice(at..at, b.iter().copied());
        }
        Edit::Delete(a, n) => {
            let at = pos(*a, input.len());
            let end = (at + n).min(input.len());
            input.drain(at..end);
        }
        Edit::Splice(a, file, s, n) => {
            let other = &corpus[file % corpus.len()].1;
            let start = pos(*s, other.len());
            let end = (start + n).min(other.len());
            let at = pos(*a, input.len());
            input.splice(at..at, other[start..end].iter().copied());
        }
        Edit::Number(a, n) => {
            let at = pos(*a, input.len());
            let end = (at + 8).min(input.len());
            input.splice(at..end, n.to_le_bytes());
        }
    }
    input.truncate(MAX_LEN);
}

fn fuzz_target(name: &str) {
    let target = TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, f)| f)
        .expect("a target of that name");
    let corpus = corpus(name);
    assert!(!corpus.is_empty(), "fuzz/corpus/{name} is empty");
    for (i, (path, bytes)) in corpus.iter().enumerate() {
        run_one(name, target, bytes, &path.display().to_string(), i);
    }
    // Mutations: a corpus file (or nothing) and one to eight edits.
    let strategy = (0..corpus.len() + 1, prop::collection::vec(edit(), 1..8));
    let seed: [u8; 32] = *b"gerbil fuzz corpus mutations v1.";
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let start = Instant::now();
    let mut cases = 0;
    while cases < MAX_CASES && start.elapsed() < BUDGET {
        let (file, edits) = strategy
            .new_tree(&mut runner)
            .expect("the strategy never rejects")
            .current();
        let mut input = corpus.get(file).map(|c| c.1.clone()).unwrap_or_default();
        for e in &edits {
            apply(&mut input, e, &corpus);
        }
        run_one(name, target, &input, &format!("mutation {cases}"), cases);
        cases += 1;
    }
    eprintln!(
        "{name}: {} corpus files, {cases} mutations in {:.1}s",
        corpus.len(),
        start.elapsed().as_secs_f64()
    );
}

#[test]
fn every_target_has_a_test() {
    let source = include_str!("corpus.rs");
    for (name, _) in TARGETS {
        assert!(
            source.contains(&format!("fn {name}() {{")),
            "tests/corpus.rs has no test for target `{name}`"
        );
    }
}

#[test]
fn plan() {
    fuzz_target("plan");
}

#[test]
fn compile() {
    fuzz_target("compile");
}

#[test]
fn codegen() {
    fuzz_target("codegen");
}

#[test]
fn safetensors() {
    fuzz_target("safetensors");
}

#[test]
fn gguf() {
    fuzz_target("gguf");
}

#[test]
fn shard_index() {
    fuzz_target("shard_index");
}

#[test]
fn template() {
    fuzz_target("template");
}

#[test]
fn request() {
    fuzz_target("request");
}
