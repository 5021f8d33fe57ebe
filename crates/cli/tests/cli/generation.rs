//! `gerbil-run` generation as people use it: the plain run, `chat` over a
//! pipe, generation flags and their errors, `--ctx`, standard input as the
//! prompt, stop strings, and a reader that closes the pipe. SmolLM2 gives
//! the reference continuations (a real tokenizer and chat template); the
//! other text paths run on the tiny Llama with text of the tests' own
//! ([`tiny_text_plan`]), a thousand times faster on lavapipe.

use crate::common::*;
use gerbil_text::TextCodec;
use std::io::Read;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;

/// SmolLM2 compiled once for the whole file (a 256-token context keeps it
/// quick on lavapipe).
fn smollm2_plan() -> &'static PathBuf {
    static PLAN: OnceLock<PathBuf> = OnceLock::new();
    PLAN.get_or_init(|| {
        let plan = process_dir("smollm2").join("smollm2.plan");
        compile_to(&smollm2_dir(), &plan, &["--max-context", "256"]);
        plan
    })
}

/// The tiny Llama with text of the tests' own, compiled once for the whole
/// file, its context far past the model's 128 positions (it only warns) so
/// that a long generation outlasts a reader by seconds.
fn tiny_text() -> &'static str {
    static PLAN: OnceLock<PathBuf> = OnceLock::new();
    PLAN.get_or_init(|| tiny_text_plan(&process_dir("tiny-text"), &["--max-context", "1024"]))
        .to_str()
        .unwrap()
}

fn codec() -> TextCodec {
    let bytes = std::fs::read(smollm2_dir().join("tokenizer.json")).unwrap();
    TextCodec::from_tokenizer_json(&bytes).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The reference chat answer: the greedy tokens up to end-of-sequence, and
/// its text.
fn chat_answer() -> (Vec<u32>, String) {
    let p = reference_prompt("chat_capital");
    let greedy = ids(&p["greedy_ids"]);
    let end = greedy.iter().position(|&t| t == 2).expect("an <|im_end|>");
    let text = codec().decode(&greedy[..end], true).unwrap();
    (greedy[..=end].to_vec(), text)
}

#[test]
fn plain_and_chat_prompts_give_the_reference_continuations() {
    let plan = smollm2_plan().to_str().unwrap();
    // A raw prompt, the reference's first 8 tokens (a decode step costs a
    // second on lavapipe; the real-model suite checks all 32), ignoring
    // end-of-sequence as the reference did.
    let raw = reference_prompt("raw_french_emoji");
    let text = raw["text"].as_str().unwrap();
    let o = gerbil_run(&[
        plan,
        "--prompt",
        text,
        "--max-new-tokens",
        "8",
        "--ignore-eos",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let want = codec().decode(&ids(&raw["greedy_ids"])[..8], true).unwrap();
    assert_eq!(stdout(&o), format!("{want}\n"));
    let err = stderr(&o);
    assert!(
        err.contains("prompt 24 tokens") && err.contains("generated 8 tokens"),
        "{err}"
    );
    assert!(err.contains("finish length"), "{err}");
    // The chat prompt through --chat, and through --json.
    let question = reference_prompt("chat_capital")["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let (answer_ids, answer) = chat_answer();
    let o = gerbil_run(&[plan, "--chat", "--prompt", &question, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(ids(&json["output_ids"]), answer_ids);
    assert_eq!(json["text"], answer.as_str());
    assert_eq!(json["finish_reason"], "stop");
    assert_eq!(json["timings"]["generated_tokens"], answer_ids.len());
    assert!(json.get("seed").is_none(), "greedy has no seed");
}

/// The number before `word` in a timing line (`prompt 25 tokens (12 cached) … generated 30
/// tokens …`).
fn count_before(line: &str, word: &str) -> usize {
    let at = line
        .find(word)
        .unwrap_or_else(|| panic!("`{word}` in `{line}`"));
    line[at + word.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a count after `{word}` in `{line}`"))
}

#[test]
fn chat_over_a_pipe_keeps_history_and_reuses_the_cache() {
    let plan = tiny_text();
    let question = "what is the capital of france";
    let solo = gerbil_run(&[
        plan,
        "--chat",
        "--prompt",
        question,
        "--max-new-tokens",
        "12",
    ]);
    assert!(solo.status.success(), "{}", stderr(&solo));
    let input = format!("{question}\n/stats\nand of germany\n/bogus\n/reset\n/exit\nnever read\n");
    let o = gerbil_run_stdin(&[plan, "chat", "--max-new-tokens", "12"], &input);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    // The first turn answers as the one-shot `--chat` run does.
    assert!(out.starts_with(&stdout(&solo)), "first answer:\n{out}");
    let err = stderr(&o);
    let timing: Vec<&str> = err.lines().filter(|l| l.starts_with("prompt ")).collect();
    assert_eq!(timing.len(), 2, "two answers, none after /exit: {err}");
    // Turn two reuses the cache: at least turn one's prompt. (How much of
    // the answer also: the random model's answer need not tokenize again
    // as it was drawn; the facade's `chat_answers_like_transformers_and_reuses_earlier_turns`
    // counts it exactly on SmolLM2.)
    let (first, second) = (
        count_before(timing[0], "prompt "),
        count_before(timing[1], "prompt "),
    );
    let cached = count_before(timing[1], "(");
    assert!(first <= cached && cached < second, "{}", timing[1]);
    assert!(err.contains("2 messages;"), "/stats: {err}");
    assert!(err.contains("unknown command /bogus"), "{err}");
    assert!(err.contains("(conversation forgotten)"), "{err}");
}

/// `chat` on a terminal (a pseudo-terminal from util-linux's `script`):
/// Ctrl-C while an answer streams stops that answer, with a note, and the
/// session goes on (`/stats` answers, `/exit` ends it with status 0); Ctrl-C
/// at the prompt only says how to leave.
#[test]
fn chat_on_a_terminal_stops_an_answer_on_ctrl_c_and_goes_on() {
    use std::io::{Read, Write};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let plan = tiny_text();
    let question = "tell me everything";
    let flags = ["--max-new-tokens", "1000", "--temperature", "0"];
    // Alone, the greedy answer is long enough to be interrupted.
    let mut args = vec![plan, "--chat", "--prompt", question];
    args.extend(flags);
    let solo = gerbil_run(&args);
    assert!(solo.status.success(), "{}", stderr(&solo));
    let full = stderr(&solo)
        .lines()
        .find(|l| l.starts_with("prompt "))
        .map(|l| count_before(l, "generated "))
        .unwrap();
    assert!(full >= 300, "the greedy answer has only {full} tokens");

    // `exec`: no shell stays between the terminal and gerbil-run, since a
    // shell that does not exec its last command would die of the first
    // Ctrl-C (and `script -e` would report 130).
    let line = format!(
        "exec '{}' '{plan}' chat {}",
        env!("CARGO_BIN_EXE_gerbil-run"),
        flags.join(" ")
    );
    let mut child = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("SHELL", "/bin/sh")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let shown = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = std::sync::Arc::clone(&shown);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let wait_for = |what: &str, after: usize| {
        let start = Instant::now();
        loop {
            let text = shown.lock().unwrap().clone();
            if let Some(at) = text[after.min(text.len())..].find(what) {
                return after + at + what.len();
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "no `{what}` in {text:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let at = wait_for("> ", 0);
    stdin.write_all(b"\x03").unwrap();
    let at = wait_for("/exit or Ctrl-D ends the chat", at);
    stdin.write_all(format!("{question}\r").as_bytes()).unwrap();
    // Some of the answer, then Ctrl-C: soon, since a fast machine writes
    // the whole answer in half a second (a Ctrl-C before its first token
    // stops it too).
    let at = wait_for(question, at);
    std::thread::sleep(Duration::from_millis(100));
    stdin.write_all(b"\x03").unwrap();
    let at = wait_for("(answer stopped", at);
    let at = wait_for("> ", at);
    stdin.write_all(b"/stats\r").unwrap();
    let at = wait_for("2 messages;", at);
    wait_for("> ", at);
    stdin.write_all(b"/exit\r").unwrap();
    let status = child.wait().unwrap();
    let text = shown.lock().unwrap().clone();
    assert!(status.success(), "{status}: {text}");
    let generated = text
        .lines()
        .find(|l| l.starts_with("prompt "))
        .map(|l| count_before(l, "generated "))
        .unwrap_or_else(|| panic!("no timing line in {text:?}"));
    assert!(
        generated < full,
        "{generated} of {full} tokens: not stopped"
    );
}

/// `chat` keeps the conversation through a turn the context cannot hold,
/// a line longer than 1 MiB and bytes that are not UTF-8 (each with a note),
/// and answers the turns around them.
#[test]
fn chat_goes_on_past_what_it_cannot_send() {
    let plan = tiny_text();
    let mut input = b"hello there\n".to_vec();
    input.extend("zq".repeat(600).as_bytes()); // 1,200 tokens: past the 1,024-token context
    input.push(b'\n');
    input.extend(vec![b'a'; (1 << 20) + 1]);
    input.extend(b"\n\xff\xfe and then\n/stats\n");
    let o = gerbil_run_stdin(&[plan, "chat", "--max-new-tokens", "4"], &input);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("this turn was not sent") && err.contains("context"),
        "{err}"
    );
    assert!(err.contains("longer than 1048576 bytes"), "{err}");
    let answers = err.lines().filter(|l| l.starts_with("prompt ")).count();
    assert_eq!(answers, 2, "{err}");
    assert!(err.contains("4 messages;"), "/stats: {err}");
}

#[test]
fn flags_that_would_do_nothing_are_errors() {
    let (_d, tiny) = tiny_plan("flags", &["--max-context", "16"]);
    let tiny = tiny.to_str().unwrap();
    let plan = tiny_text();
    let cases: &[(&[&str], &str)] = &[
        (
            &[tiny, "--input-ids", "1,2", "--top-logits", "3"],
            "--top-logits only shows in the JSON output: add --json",
        ),
        (
            &[tiny, "--input-ids", "1,2", "--top-p", "0.9"],
            "--top-p only applies when sampling",
        ),
        (
            &[
                tiny,
                "--input-ids",
                "1,2",
                "--temperature",
                "0",
                "--seed",
                "3",
            ],
            "--temperature 0 decodes greedily",
        ),
        (
            &[tiny, "--input-ids", "1,2", "--stop", "x"],
            "--stop matches text, and this plan has no tokenizer",
        ),
        (
            &[tiny, "--input-ids", "1,2", "--chat"],
            "cannot be used with",
        ),
        (&[tiny, "--prompt", "hi", "--system", "s"], "--chat"),
        (
            &[tiny, "chat"],
            "this plan has no tokenizer, so it cannot chat",
        ),
        (
            &[plan, "--temperature", "0.5", "chat"],
            "`chat` takes its own flags",
        ),
        (
            &[tiny, "--input-ids", "1", "--ctx", "17"],
            "give --ctx at most 16",
        ),
        (
            &[tiny, "--input-ids", "1", "--ctx", "0"],
            "give --ctx at most 16",
        ),
        (
            &[tiny, "--input-ids", "1", "--repetition-penalty", "0"],
            "repetition",
        ),
        (&[tiny, "bench", "--ctx", "8"], "drop --ctx"),
        (
            &[tiny, "--input-ids", "1,2", "--system", "s"],
            "--system is the system message of a chat prompt: add --chat",
        ),
        (
            &[tiny, "bench", "--top-k", "3"],
            "--top-k only applies to sampled decoding",
        ),
        (
            &[tiny, "bench", "--min-p", "0.1", "--temperature", "0"],
            "--min-p only applies to sampled decoding",
        ),
        (
            &[tiny, "bench", "--repeats", "0"],
            "0 repetitions time nothing; give at least 1",
        ),
        (
            &[tiny, "serve", "--max-body-bytes", "100"],
            "100 bytes would refuse nearly every request; give at least 1024",
        ),
        (&["devices", "--device", "0"], "drop it here"),
        (
            &[tiny, "--input-ids", "1", "--json", "--top-logits", "0"],
            "0 records no logits",
        ),
        (
            &[plan, "--prompt", "hi", "--stop", ""],
            "a stop string is empty",
        ),
    ];
    for (args, needle) in cases {
        assert_fails_with(&gerbil_run(args), needle);
    }
}

#[test]
fn the_context_ends_a_generation_with_length() {
    let (_d, tiny) = tiny_plan("ctx", &["--max-context", "16"]);
    let tiny = tiny.to_str().unwrap();
    // 4 prompt tokens in a 6-token context: 3 tokens fit (the last is never fed).
    let o = gerbil_run(&[
        tiny,
        "--input-ids",
        "1,2,3,4",
        "--ctx",
        "6",
        "--max-new-tokens",
        "50",
        "--json",
        "--ignore-eos",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(json["output_ids"].as_array().unwrap().len(), 3);
    assert_eq!(json["finish_reason"], "length");
    // The same tokens as with the whole context.
    let o = gerbil_run(&[
        tiny,
        "--input-ids",
        "1,2,3,4",
        "--max-new-tokens",
        "3",
        "--json",
        "--ignore-eos",
    ]);
    let full: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(full["output_ids"], json["output_ids"]);
    assert_fails_with(
        &gerbil_run(&[tiny, "--input-ids", "1,2,3,4,5,6,7", "--ctx", "6"]),
        "7 tokens do not fit the context of 6 tokens",
    );
}

#[test]
fn seeds_and_penalties() {
    let (_d, tiny) = tiny_plan("seeds", &["--max-context", "32"]);
    let tiny = tiny.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            tiny,
            "--input-ids",
            "1,2,3",
            "--max-new-tokens",
            "12",
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = gerbil_run(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&stdout(&o)).unwrap()
    };
    let a = run(&["--temperature", "1.5", "--seed", "11"]);
    let b = run(&["--temperature", "1.5", "--seed", "11"]);
    assert_eq!(
        a["output_ids"], b["output_ids"],
        "a seed reproduces the tokens"
    );
    assert_eq!(a["seed"], 11);
    // Without a seed one is drawn and reported; two runs differ in it.
    let c = run(&["--temperature", "1.5"]);
    let d = run(&["--temperature", "1.5"]);
    assert!(c["seed"].is_u64() && c["seed"] != d["seed"], "{c} {d}");
    // The penalties change the greedy tokens (they run on the CPU sampler).
    let greedy = run(&[]);
    let penalized = run(&["--repetition-penalty", "3", "--frequency-penalty", "2"]);
    assert_ne!(penalized["output_ids"], greedy["output_ids"]);
}

#[test]
fn a_stop_string_cuts_the_text() {
    let plan = tiny_text();
    let run = |extra: &[&str]| {
        let mut args = vec![
            plan,
            "--prompt",
            "once upon a time",
            "--max-new-tokens",
            "16",
            "--ignore-eos",
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = gerbil_run(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&stdout(&o)).unwrap()
    };
    let greedy = run(&[]);
    let text = greedy["text"].as_str().unwrap().to_string();
    // Two letters from the middle of the text: the stop string may start
    // inside one token and end in the next.
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let word = (3..chars.len().saturating_sub(1))
        .map(|i| format!("{}{}", chars[i].1, chars[i + 1].1))
        .find(|w| w.chars().all(|c| c.is_ascii_alphabetic()))
        .unwrap_or_else(|| panic!("two letters in the greedy text {text:?}"));
    let stopped = run(&["--stop", &word]);
    assert_eq!(stopped["finish_reason"], "stop");
    let cut = &text[..text.find(&word).unwrap()];
    assert_eq!(stopped["text"], cut);
}

#[test]
fn the_prompt_from_standard_input() {
    let plan = tiny_text();
    let direct = gerbil_run(&[
        plan,
        "--prompt",
        "the capital of france is",
        "--max-new-tokens",
        "8",
    ]);
    let dash = gerbil_run_stdin(
        &[plan, "--prompt", "-", "--max-new-tokens", "8"],
        "the capital of france is\n",
    );
    let piped = gerbil_run_stdin(&[plan, "--max-new-tokens", "8"], "the capital of france is");
    assert!(direct.status.success(), "{}", stderr(&direct));
    assert!(!stdout(&direct).trim().is_empty(), "{}", stderr(&direct));
    assert_eq!(stdout(&dash), stdout(&direct), "{}", stderr(&dash));
    assert_eq!(stdout(&piped), stdout(&direct), "{}", stderr(&piped));
}

#[test]
fn a_closed_pipe_stops_generation_quietly() {
    let plan = tiny_text();
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let mut child = gerbil_run_command(&[
        plan,
        "--prompt",
        "once upon a time",
        "--max-new-tokens",
        "1000",
        "--ignore-eos",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut first = [0u8; 3];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "exit {:?}: {err}", o.status);
    assert!(!err.contains("error") && !err.contains("panicked"), "{err}");
    // It stopped instead of finishing: no timing line for 1000 tokens.
    assert!(!err.contains("generated 1000 tokens"), "{err}");
}

/// `perplexity` on the shipped text: a plan that returns every row of
/// logits (prefill-sized steps) and one that returns the last (a token per
/// step, the decode kernels) score the same; a plan against itself diverges
/// by nothing, and against its q8_0 compile by a little.
#[test]
fn perplexity_scores_a_text_and_compares_two_plans() {
    let dir = temp("perplexity");
    let plan = |name: &str, extra: &[&str]| {
        let sub = dir.path().join(name);
        tiny_text_plan(&sub, extra).to_str().unwrap().to_string()
    };
    let last = plan("last", &[]);
    let all = plan("all", &["--disable-pass", "slice-last-row"]);
    let q8 = plan(
        "q8",
        &["--quantize", "q8_0", "--disable-pass", "slice-last-row"],
    );
    let text = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/moby-dick.txt");
    let text = text.to_str().unwrap();
    let score = |plan: &str, extra: &[&str]| {
        let mut args = vec![
            plan,
            "perplexity",
            text,
            "--window",
            "48",
            "--max-windows",
            "3",
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = gerbil_run(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&stdout(&o)).unwrap()
    };
    let by_rows = score(&all, &[]);
    let by_tokens = score(&last, &[]);
    assert_eq!(by_rows["scored_tokens"], 72, "{by_rows}");
    assert_eq!(by_rows["windows"], 3);
    let ppl = by_rows["perplexity"].as_f64().unwrap();
    // Random weights over 512 ids with confident logits: worse than a uniform guess (512).
    assert!(ppl > 512.0 && ppl.is_finite(), "{by_rows}");
    let other = by_tokens["perplexity"].as_f64().unwrap();
    assert!((ppl - other).abs() < 1e-4 * ppl, "{by_rows} vs {by_tokens}");

    let itself = score(&all, &["--against", &last]);
    assert!(
        itself["against"]["kld_max"].as_f64().unwrap() < 1e-6,
        "{itself}"
    );
    assert_eq!(itself["against"]["top1_agreement"], 1.0);
    let quantized = score(&q8, &["--against", &all]);
    let c = &quantized["against"];
    let kld = c["kld_mean"].as_f64().unwrap();
    assert!(kld > 1e-7 && kld < 1e-2, "{quantized}");
    assert!((c["base_perplexity"].as_f64().unwrap() - ppl).abs() < 1e-4 * ppl);
    assert!(c["top1_agreement"].as_f64().unwrap() > 0.8, "{quantized}");

    let o = gerbil_run(&[&all, "perplexity", text, "--window", "4096"]);
    assert_fails_with(&o, "--window 4096 is longer than");

    // `--variant` picks the scored plan's variant only: one quantized plan's
    // float-dot decode against its int8-dot decode, the base's default (a
    // plan keeping one row of logits scores through the decode GEMVs),
    // differs a little.
    let desktop = plan("desktop", &["--quantize", "q8_0", "--target", "desktop"]);
    let int8 = score(
        &desktop,
        &["--variant", "subgroups-f16", "--against", &desktop],
    );
    let c = &int8["against"];
    let kld = c["kld_mean"].as_f64().unwrap();
    assert!(kld > 0.0 && kld < 0.1, "{int8}");
    assert!(c["top1_agreement"].as_f64().unwrap() > 0.7, "{int8}");
}

/// `--json-schema` on SmolLM2 (real weights, real tokenizer): the answer,
/// greedy and sampled, is JSON valid against the schema, and the run ends
/// with the JSON (`stop`), not at the token limit. `--json-object` and
/// `--grammar` constrain the tiny Llama; a schema that is not JSON, or a
/// grammar that does not compile, is a clear error before anything runs.
#[test]
fn json_schema_json_object_and_grammar_flags_constrain_the_answer() {
    let dir = temp("json-schema");
    let schema = serde_json::json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "London", "Rome"]}},
        "required": ["name", "age", "city"], "additionalProperties": false});
    let path = dir.path().join("person.json");
    std::fs::write(&path, schema.to_string()).unwrap();
    let plan = smollm2_plan().to_str().unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for sampling in [
        &["--temperature", "0"][..],
        &["--temperature", "1", "--seed", "3"],
    ] {
        let mut args = vec![
            plan,
            "--chat",
            "--prompt",
            "Describe a person as JSON.",
            "--json-schema",
            path.to_str().unwrap(),
            "--max-new-tokens",
            "60",
            "--json",
        ];
        args.extend(sampling);
        let out = gerbil_run(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(v["finish_reason"], "stop", "{v}");
        let text = v["text"].as_str().unwrap();
        let answer: serde_json::Value = serde_json::from_str(text).expect("JSON");
        assert!(validator.is_valid(&answer), "{text}");
    }

    let tiny = tiny_text();
    let out = gerbil_run(&[
        tiny,
        "--prompt",
        "x",
        "--json-object",
        "--temperature",
        "0",
        "--max-new-tokens",
        "200",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with('{'), "{}", stdout(&out));
    let grammar = dir.path().join("g.lark");
    std::fs::write(&grammar, "start: (\"yes\" | \"no\") \".\"").unwrap();
    let out = gerbil_run(&[
        tiny,
        "--prompt",
        "x",
        "--grammar",
        grammar.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stdout(&out);
    assert!(
        said.trim_end() == "yes." || said.trim_end() == "no.",
        "{said:?}"
    );

    std::fs::write(&grammar, "start: missing").unwrap();
    let out = gerbil_run(&[
        tiny,
        "--prompt",
        "x",
        "--grammar",
        grammar.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("missing"), "{}", stderr(&out));
    std::fs::write(&path, "{not json").unwrap();
    let out = gerbil_run(&[
        tiny,
        "--prompt",
        "x",
        "--json-schema",
        path.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is not valid JSON"),
        "{}",
        stderr(&out)
    );
}
