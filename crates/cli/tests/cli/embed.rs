//! `gerbil-run PLAN embed` on all-MiniLM-L6-v2: a JSON line per input from
//! --text, standard input or JSONL alike, the vectors sentence-transformers
//! makes, and clear errors for what it cannot embed.

use crate::common::*;
use serde_json::Value;
use std::path::PathBuf;

fn minilm_dir() -> PathBuf {
    smollm2_dir().with_file_name("all-minilm-l6-v2")
}

/// The `embedding` arrays of `embed`'s output lines.
fn vectors(o: &std::process::Output) -> Vec<Vec<f64>> {
    assert!(o.status.success(), "embed failed: {}", stderr(o));
    stdout(o)
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let v: Value = serde_json::from_str(line).expect("a JSON line");
            assert_eq!(v["index"], i);
            v["embedding"]
                .as_array()
                .expect("embedding")
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

#[test]
fn embed_prints_sentence_transformers_vectors_from_every_input() {
    let (dir, plan) = compile(&minilm_dir(), "minilm", &["--quiet"]);
    let plan = plan.to_str().unwrap();
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(data("refs/all-minilm-l6-v2.json")).unwrap())
            .unwrap();
    let want: Vec<Vec<f64>> = ["hi", "a"]
        .iter()
        .map(|name| {
            let case = reference["cases"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == *name)
                .unwrap();
            case["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect();
    let from_args = vectors(&gerbil_run_clean(&[
        plan, "embed", "--text", "Hi", "--text", "a",
    ]));
    assert_eq!(from_args.len(), 2);
    for (got, want) in from_args.iter().zip(&want) {
        let d = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(d < 1e-4, "max |Δ| {d}");
    }
    let from_stdin = vectors(&gerbil_run_stdin(&[plan, "embed"], "Hi\na\n"));
    assert_eq!(from_stdin, from_args);
    let jsonl = dir.path().join("in.jsonl");
    std::fs::write(&jsonl, "\"Hi\"\n{\"text\": \"a\"}\n").unwrap();
    let from_jsonl = vectors(&gerbil_run_clean(&[
        plan,
        "embed",
        "--jsonl",
        jsonl.to_str().unwrap(),
    ]));
    assert_eq!(from_jsonl, from_args);

    // What it cannot embed, each a clear error.
    assert_fails_with(&gerbil_run_stdin(&[plan, "embed"], ""), "no texts to embed");
    let long = "word ".repeat(400);
    assert_fails_with(
        &gerbil_run_clean(&[plan, "embed", "--text", &long]),
        "--truncate",
    );
    let cut = vectors(&gerbil_run_clean(&[
        plan,
        "embed",
        "--truncate",
        "--text",
        &long,
    ]));
    assert_eq!(cut[0].len(), 384);
    std::fs::write(&jsonl, "[1, 2]\n").unwrap();
    assert_fails_with(
        &gerbil_run_clean(&[plan, "embed", "--jsonl", jsonl.to_str().unwrap()]),
        "line 1",
    );
    let (_lm, lm) = tiny_plan("lm", &[]);
    assert_fails_with(
        &gerbil_run_clean(&[lm.to_str().unwrap(), "embed", "--text", "x"]),
        "not an embedding model",
    );
}
