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
    // Two inputs a step: three texts already take two steps.
    let (dir, plan) = compile(&minilm_dir(), "minilm", &["--quiet", "--max-batch", "2"]);
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
    // A JSONL stream that can be read once (a pipe, as `<(zcat …)` is).
    let from_pipe = vectors(&gerbil_run_stdin(
        &[plan, "embed", "--jsonl", "/dev/stdin"],
        "\"Hi\"\n{\"text\": \"a\"}\n",
    ));
    assert_eq!(from_pipe, from_args);

    // Across steps, as a .npy file and through standard output, cut to 64
    // dimensions: the same vectors' first values, back at unit length.
    let npy = dir.path().join("out.npy");
    let three = [plan, "embed", "--text", "Hi", "--text", "a", "--text", "Hi"];
    let shortened = [&three[..], &["--dimensions", "64", "--format", "npy"]].concat();
    let to_file = gerbil_run_clean(&[&shortened[..], &["-o", npy.to_str().unwrap()]].concat());
    assert!(to_file.status.success(), "{}", stderr(&to_file));
    let to_stdout = gerbil_run_clean(&shortened);
    assert!(to_stdout.status.success(), "{}", stderr(&to_stdout));
    let file = std::fs::read(&npy).unwrap();
    assert_eq!(to_stdout.stdout, file);
    let array = npyz::NpyFile::new(&file[..]).unwrap();
    assert_eq!(array.shape(), [3, 64]);
    let values: Vec<f32> = array.into_vec().unwrap();
    for (row, want) in values
        .chunks(64)
        .zip([&from_args[0], &from_args[1], &from_args[0]])
    {
        let norm = want[..64].iter().map(|x| x * x).sum::<f64>().sqrt();
        for (got, want) in row.iter().zip(&want[..64]) {
            assert!(
                (f64::from(*got) - want / norm).abs() < 1e-5,
                "{got} vs {want}"
            );
        }
    }

    // What it cannot embed, each a clear error.
    assert_fails_with(&gerbil_run_stdin(&[plan, "embed"], ""), "no texts to embed");
    assert_fails_with(
        &gerbil_run_clean(&[plan, "embed", "--text", "a", "--dimensions", "385"]),
        "give 1 to 384",
    );
    let long = "word ".repeat(400);
    assert_fails_with(
        &gerbil_run_clean(&[plan, "embed", "--text", &long]),
        "--truncate",
    );
    // A run that fails part way leaves no output file that looks whole.
    let failed = dir.path().join("failed.npy");
    let args = ["--format", "npy", "-o", failed.to_str().unwrap()];
    let o = gerbil_run_clean(&[&three[..], &["--text", &long], &args].concat());
    assert_fails_with(&o, "--truncate");
    assert!(!failed.exists(), "a failed run wrote {}", failed.display());
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

/// `serve` on an embedding plan answers `POST /v1/embeddings` in OpenAI's
/// shape (the OpenAI Python client's `embeddings.create` gets
/// sentence-transformers' vectors), refuses bad requests with an OpenAI
/// error naming the field, and says which endpoints each kind of plan has.
#[test]
fn serve_answers_embeddings_and_says_what_each_plan_is() {
    use crate::serve::Server;
    let (_dir, plan) = compile(&minilm_dir(), "minilm-serve", &["--quiet"]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let server = Server::start(&plan, &[]);
    let reference = data("refs/all-minilm-l6-v2.json");
    let said = server.run_client(
        "openai-embeddings-check.py",
        &["--reference", reference.to_str().unwrap()],
    );
    assert!(said.contains("embeddings match"), "{said}");
    let (status, body) = server.post(
        "/v1/embeddings",
        &serde_json::json!({"input": [101, 7632, 102]}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"][0]["embedding"].as_array().unwrap().len(), 384);
    let long = "word ".repeat(400);
    for (request, param) in [
        (serde_json::json!({"input": []}), "input"),
        (serde_json::json!({"input": ["a", 7]}), "input"),
        (serde_json::json!({"input": long}), "input"),
        (serde_json::json!({"input": [999999]}), "input"),
        (
            serde_json::json!({"input": "a", "dimensions": 385}),
            "dimensions",
        ),
    ] {
        let (status, body) = server.post("/v1/embeddings", &request);
        assert_eq!(status, 400, "{request}: {body}");
        assert_eq!(body["error"]["param"], param, "{body}");
    }
    let (status, body) = server.post(
        "/v1/embeddings",
        &serde_json::json!({"input": long, "truncate": true}),
    );
    assert_eq!(
        (status, body["usage"]["prompt_tokens"].as_u64()),
        (200, Some(256))
    );
    // Concurrent requests share steps, each answered with its own vectors;
    // a bad one among them fails alone.
    let solo = |text: &str| {
        let (status, body) = server.post("/v1/embeddings", &serde_json::json!({"input": text}));
        assert_eq!(status, 200, "{body}");
        body["data"][0]["embedding"].clone()
    };
    let texts = ["Hi", "a", "A cat sat on the mat.", "Un chat s'assit."];
    let alone: Vec<Value> = texts.iter().map(|t| solo(t)).collect();
    let metric = |name: &str| -> f64 {
        let mut r = crate::serve::Response::read(server.send_with(
            "GET",
            "/metrics",
            &[("Host", "127.0.0.1")],
            b"",
        ));
        let text = r.text();
        let line = text.lines().find(|l| l.starts_with(&format!("{name} ")));
        line.and_then(|l| l.split(' ').nth(1)?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    let (requests, batches) = (
        metric("gerbil_embedding_requests_total"),
        metric("gerbil_embedding_batches_total"),
    );
    let headers = [("Host", "127.0.0.1"), ("Content-Type", "application/json")];
    let sent: Vec<_> = (0..16)
        .map(|i| {
            let input = match i {
                5 => serde_json::json!([999999]),
                _ => serde_json::json!(texts[i % texts.len()]),
            };
            let body = serde_json::json!({"input": input}).to_string();
            server.send_with("POST", "/v1/embeddings", &headers, body.as_bytes())
        })
        .collect();
    for (i, stream) in sent.into_iter().enumerate() {
        let mut r = crate::serve::Response::read(stream);
        let body: Value = serde_json::from_str(&r.text()).unwrap();
        if i == 5 {
            assert_eq!(
                (r.status, &body["error"]["param"]),
                (400, &Value::from("input"))
            );
            continue;
        }
        assert_eq!(r.status, 200, "{body}");
        let (got, want) = (&body["data"][0]["embedding"], &alone[i % texts.len()]);
        let d = got.as_array().unwrap().iter().zip(want.as_array().unwrap());
        let d = d.map(|(a, b)| (a.as_f64().unwrap() - b.as_f64().unwrap()).abs());
        assert!(d.fold(0.0, f64::max) < 1e-5, "request {i}");
    }
    let (requests, batches) = (
        metric("gerbil_embedding_requests_total") - requests,
        metric("gerbil_embedding_batches_total") - batches,
    );
    // The bad request was refused before it joined; the 15 others took
    // fewer calls than requests.
    assert_eq!(requests, 15.0);
    assert!(
        batches < requests,
        "{batches} calls for {requests} requests"
    );
    let chat = serde_json::json!({"messages": [{"role": "user", "content": "hi"}]});
    let (status, body) = server.post("/v1/chat/completions", &chat);
    assert_eq!(status, 400);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/v1/embeddings"));
    drop(server);
    let (_lm_dir, lm) = tiny_plan("lm-serve", &[]);
    let server = Server::start(&lm, &[]);
    let (status, body) = server.post("/v1/embeddings", &serde_json::json!({"input": [1, 2]}));
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not an embedding model"),
        "{body}"
    );
}
