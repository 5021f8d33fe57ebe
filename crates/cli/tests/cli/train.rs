//! `gerbil-train` as a user drives it, on the tiny Llama with the tests'
//! byte-level tokenizer ([`common::tiny_text_model`]) and the first
//! kilobytes of `data/moby-dick.txt`: a run writes its JSON log, its
//! checkpoints, its profile and a model `gerbilc` compiles; a resumed run continues
//! exactly where the checkpoint stopped; Ctrl-C saves the steps taken; and
//! bad input is a clear error.

use crate::common::{self, stderr, temp, tiny_text_model, GPU};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The first `bytes` of Moby-Dick, written to `dir/text.txt`.
fn text(dir: &Path, bytes: usize) -> PathBuf {
    let book = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/moby-dick.txt");
    let all = std::fs::read_to_string(book).unwrap();
    let cut = all.char_indices().nth(bytes).map_or(all.len(), |(i, _)| i);
    let path = dir.join("text.txt");
    std::fs::write(&path, &all[..cut]).unwrap();
    path
}

fn command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gerbil-train"));
    c.args(args).env("XDG_RUNTIME_DIR", std::env::temp_dir());
    c
}

/// Runs `gerbil-train` holding the GPU lock.
fn gerbil_train(args: &[&str]) -> Output {
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    command(args).output().expect("spawn gerbil-train")
}

/// The flags of a small run of `steps` into `out`, logging to `log`.
fn flags<'a>(model: &'a str, data: &'a str, steps: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        model,
        "--data",
        data,
        "--steps",
        steps,
        "--seq-len",
        "16",
        "--batch",
        "2",
        "--lr",
        "1e-2",
        "--warmup",
        "2",
        "--out",
        out,
        "-q",
    ]
}

fn log_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_run_logs_every_step_saves_checkpoints_and_writes_a_model_gerbilc_compiles() {
    let dir = temp("train-run");
    let model = tiny_text_model("llama", &dir.path().join("tiny"));
    let data = text(dir.path(), 4000);
    let (out, log) = (dir.path().join("out"), dir.path().join("log.jsonl"));
    let profile = dir.path().join("profile.json");
    let mut args = flags(s(&model), s(&data), "6", s(&out));
    args.extend(["--json-log", s(&log), "--save-every", "3"]);
    args.extend(["--profile", s(&profile)]);
    let o = gerbil_train(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    // The profile: every dispatch of one sequence, the costliest on stderr.
    let times: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&profile).unwrap()).unwrap();
    assert!(times.len() > 50, "{} dispatches", times.len());
    assert!(
        times.iter().any(|t| t["label"] == "lm_head.grad.x"),
        "{times:?}"
    );
    assert!(times.iter().all(|t| t["nanos"].as_f64().unwrap() >= 0.0));
    assert!(stderr(&o).contains("one pass:"), "{}", stderr(&o));
    let lines = log_lines(&log);
    assert_eq!(lines.len(), 6);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["step"], i + 1, "{l}");
        assert!(l["loss"].as_f64().unwrap().is_finite(), "{l}");
        assert!(l["grad_norm"].as_f64().unwrap() > 0.0, "{l}");
        assert_eq!(l["tokens"], 32, "{l}");
    }
    // The warmup: step 1 at lr / 2, then the learning rate.
    assert_eq!(lines[0]["lr"], 5e-3);
    assert_eq!(lines[5]["lr"], 1e-2);
    let loss = |i: usize| lines[i]["loss"].as_f64().unwrap();
    assert!(
        loss(5) < loss(0),
        "the loss fell: {} -> {}",
        loss(0),
        loss(5)
    );
    for dir in [out.join("checkpoint-3"), out.clone()] {
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "optimizer.safetensors",
        ] {
            assert!(dir.join(f).is_file(), "{} lacks {f}", dir.display());
        }
    }
    let plan = dir.path().join("trained.plan");
    common::compile_to(&out, &plan, &[]);
    let o = common::gerbil_run(&[s(&plan), "--prompt", "Call me", "--max-new-tokens", "4"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_resumed_run_takes_the_steps_an_uninterrupted_one_takes() {
    let dir = temp("train-resume");
    let model = tiny_text_model("llama", &dir.path().join("tiny"));
    let data = text(dir.path(), 4000);
    let whole_log = dir.path().join("whole.jsonl");
    let mut args = flags(s(&model), s(&data), "4", "");
    let whole = dir.path().join("whole");
    args[14] = s(&whole);
    args.extend(["--json-log", s(&whole_log)]);
    let o = gerbil_train(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    // Two steps, then two more from the checkpoint.
    let half = dir.path().join("half");
    let o = gerbil_train(&flags(s(&model), s(&data), "2", s(&half)));
    assert!(o.status.success(), "{}", stderr(&o));
    let rest_log = dir.path().join("rest.jsonl");
    let rest = dir.path().join("rest");
    let mut args = flags(s(&half), s(&data), "4", s(&rest));
    args.extend(["--resume", "--json-log", s(&rest_log)]);
    let o = gerbil_train(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let (whole, rest) = (log_lines(&whole_log), log_lines(&rest_log));
    assert_eq!(rest.len(), 2);
    for (w, r) in whole[2..].iter().zip(&rest) {
        assert_eq!(w["step"], r["step"]);
        assert_eq!(w["lr"], r["lr"]);
        // The same kernels on the same bytes: the same losses.
        assert_eq!(w["loss"], r["loss"], "{w} against {r}");
        assert_eq!(w["grad_norm"], r["grad_norm"], "{w} against {r}");
    }
}

#[test]
fn ctrl_c_saves_the_steps_taken_and_says_how_to_resume() {
    let dir = temp("train-interrupt");
    let model = tiny_text_model("llama", &dir.path().join("tiny"));
    let data = text(dir.path(), 4000);
    let (out, log) = (dir.path().join("out"), dir.path().join("log.jsonl"));
    let mut args = flags(s(&model), s(&data), "100000", s(&out));
    args.extend(["--json-log", s(&log)]);
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let child = command(&args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gerbil-train");
    let start = Instant::now();
    while std::fs::read_to_string(&log).map_or(0, |t| t.lines().count()) < 2 {
        assert!(start.elapsed() < Duration::from_secs(300), "no steps");
        std::thread::sleep(Duration::from_millis(20));
    }
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(130), "{err}");
    let steps = log_lines(&log).len();
    let checkpoint = out.join(format!("checkpoint-{steps}"));
    assert!(
        err.contains(&format!(
            "interrupted: {steps} steps saved in {}",
            checkpoint.display()
        )) && err.contains("--resume"),
        "{err}"
    );
    assert!(checkpoint.join("optimizer.safetensors").is_file(), "{err}");
    assert!(checkpoint.join("model.safetensors").is_file(), "{err}");
}

/// Runs `gerbil-train` expecting it to fail; its standard error.
fn refused(args: &[&str]) -> String {
    let o = gerbil_train(args);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    stderr(&o)
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = temp("train-errors");
    let model = tiny_text_model("llama", &dir.path().join("tiny"));
    let data = text(dir.path(), 4000);
    let out = dir.path().join("out");
    let (m, d, o) = (s(&model), s(&data), s(&out));
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "  \n").unwrap();
    let err = refused(&flags(m, s(&empty), "2", o));
    assert!(err.contains("is empty"), "{err}");
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "Call me Ishmael.").unwrap();
    let err = refused(&flags(m, s(&short), "2", o));
    assert!(
        err.contains("fewer than one window of 17") && err.contains("--seq-len"),
        "{err}"
    );
    let mut args = flags(m, d, "2", o);
    args[6] = "200";
    let err = refused(&args);
    assert!(
        err.contains("longer than the model's context of 128 tokens"),
        "{err}"
    );
    let mut args = flags(m, d, "2", o);
    args[10] = "0";
    let err = refused(&args);
    assert!(err.contains("--lr"), "{err}");
    // A model without a tokenizer.
    let bare = common::data("models/tiny/llama");
    let err = refused(&flags(s(&bare), d, "2", o));
    assert!(err.contains("no tokenizer.json"), "{err}");
    // Resuming a checkpoint without optimizer state, then with another
    // model's, then with the other kind of state.
    let err = refused(&[flags(m, d, "2", o), vec!["--resume"]].concat());
    assert!(
        err.contains("optimizer.safetensors") && err.contains("--resume"),
        "{err}"
    );
    let qwen = tiny_text_model("qwen2", &dir.path().join("qwen"));
    let qwen_out = dir.path().join("qwen-out");
    let o2 = gerbil_train(&flags(s(&qwen), d, "1", s(&qwen_out)));
    assert!(o2.status.success(), "{}", stderr(&o2));
    let mixed = tiny_text_model("llama", &dir.path().join("mixed"));
    std::fs::copy(
        qwen_out.join("optimizer.safetensors"),
        mixed.join("optimizer.safetensors"),
    )
    .unwrap();
    let err = refused(&[flags(s(&mixed), d, "2", o), vec!["--resume"]].concat());
    assert!(err.contains("is the state of another model"), "{err}");
    let err = refused(
        &[
            flags(s(&qwen_out), d, "2", o),
            vec!["--resume", "--optimizer-state", "8bit"],
        ]
        .concat(),
    );
    assert!(err.contains("resume with --optimizer-state f32"), "{err}");
    let err = refused(&[flags(s(&qwen_out), d, "1", o), vec!["--resume"]].concat());
    assert!(err.contains("has taken 1 steps already"), "{err}");
    // Other batches than the checkpoint's run took.
    let mut args = flags(s(&qwen_out), d, "3", o);
    args[8] = "1";
    let err = refused(&[args, vec!["--resume"]].concat());
    assert!(err.contains("it was made with --batch 2"), "{err}");
    let err = refused(&[flags(s(&qwen_out), s(&short), "3", o), vec!["--resume"]].concat());
    assert!(err.contains("fewer than one window"), "{err}");
    let other = text(&dir.path().join("qwen"), 3000);
    let err = refused(&[flags(s(&qwen_out), s(&other), "3", o), vec!["--resume"]].concat());
    assert!(err.contains("another training text"), "{err}");
    // Mixed precision needs tensor cores: on an adapter without cooperative
    // matrices (lavapipe) it is refused, naming the way out; on one with
    // them it trains.
    let mixed_run = gerbil_train(&[flags(m, d, "1", o), vec!["--precision", "mixed"]].concat());
    if mixed_run.status.success() {
        assert!(out.join("model.safetensors").is_file());
    } else {
        let err = stderr(&mixed_run);
        assert_eq!(mixed_run.status.code(), Some(1), "{err}");
        assert!(
            err.contains("--precision mixed") && err.contains("train with --precision f32"),
            "{err}"
        );
    }
    // A micro-batch that does not divide the batch.
    let err = refused(&[flags(m, d, "1", o), vec!["--micro-batch", "3"]].concat());
    assert!(
        err.contains("does not divide the batch of 2") && err.contains("--micro-batch"),
        "{err}"
    );
    // Zero steps: a usage error, as clap reports them (status 2).
    let zero = gerbil_train(&flags(m, d, "0", o));
    assert_eq!(zero.status.code(), Some(2), "{}", stderr(&zero));
    assert!(
        stderr(&zero).contains("must be at least 1"),
        "{}",
        stderr(&zero)
    );
}

#[test]
fn a_lora_run_writes_an_adapter_that_compiles_merged_and_resumes_exactly() {
    let dir = temp("train-lora");
    let model = tiny_text_model("llama", &dir.path().join("tiny"));
    let data = text(dir.path(), 4000);
    let (m, d) = (s(&model), s(&data));
    let lora = ["--lora", "2", "--lora-alpha", "4"];
    let (whole, whole_log) = (dir.path().join("whole"), dir.path().join("whole.jsonl"));
    let o = gerbil_train(
        &[
            flags(m, d, "4", s(&whole)),
            lora.to_vec(),
            vec!["--json-log", s(&whole_log)],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let half = dir.path().join("half");
    let o = gerbil_train(&[flags(m, d, "2", s(&half)), lora.to_vec()].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    // The adapter in PEFT's files, beside the model's config and tokenizer.
    for f in [
        "adapter_config.json",
        "adapter_model.safetensors",
        "config.json",
        "tokenizer.json",
        "optimizer.safetensors",
    ] {
        assert!(half.join(f).is_file(), "{} lacks {f}", half.display());
    }
    assert!(!half.join("model.safetensors").exists());
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(half.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(config["r"], 2);
    assert_eq!(config["lora_alpha"], 4.0);
    let base = model.canonicalize().unwrap();
    assert_eq!(config["base_model_name_or_path"], s(&base));
    let targets = config["target_modules"].as_array().unwrap();
    assert_eq!(targets.len(), 7, "{config}");
    // Resumed (LoRA is implied by the adapter checkpoint): the steps the
    // uninterrupted run took.
    let (rest, rest_log) = (dir.path().join("rest"), dir.path().join("rest.jsonl"));
    let args = [
        flags(s(&half), d, "4", s(&rest)),
        vec!["--resume", "--json-log", s(&rest_log)],
    ];
    let o = gerbil_train(&args.concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let (whole_lines, rest_lines) = (log_lines(&whole_log), log_lines(&rest_log));
    assert_eq!(rest_lines.len(), 2);
    for (w, r) in whole_lines[2..].iter().zip(&rest_lines) {
        assert_eq!(w["loss"], r["loss"], "{w} against {r}");
        assert_eq!(w["grad_norm"], r["grad_norm"], "{w} against {r}");
    }
    // `gerbilc compile` takes the adapter back, merged into the base model.
    let plan = dir.path().join("lora.plan");
    common::compile_to(&whole, &plan, &[]);
    let o = common::gerbil_run(&[s(&plan), "--prompt", "Call me", "--max-new-tokens", "4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Bad LoRA settings.
    let out = dir.path().join("out");
    let err = refused(&[flags(m, d, "2", s(&out)), vec!["--lora", "1000"]].concat());
    assert!(
        err.contains("rank 1000 is larger than projection") && err.contains("smaller --lora"),
        "{err}"
    );
    let args = [
        flags(m, d, "2", s(&out)),
        vec!["--lora", "2", "--lora-targets", "q_proj,qkv"],
    ];
    let err = refused(&args.concat());
    assert!(
        err.contains("no projection called `qkv`") && err.contains("q_proj"),
        "{err}"
    );
    let args = [
        flags(s(&half), d, "4", s(&out)),
        vec!["--resume", "--lora", "3"],
    ];
    let err = refused(&args.concat());
    assert!(err.contains("has rank 2, --lora asks for 3"), "{err}");
    let resume = ["--resume", "--lora", "2", "--lora-alpha", "5"];
    let err = refused(&[flags(s(&half), d, "4", s(&out)), resume.to_vec()].concat());
    assert!(
        err.contains("has alpha 4 over") && err.contains("leave out --lora-alpha"),
        "{err}"
    );
    let nan = ["--lora", "2", "--lora-alpha", "nan"];
    let bad_alpha = gerbil_train(&[flags(m, d, "2", s(&out)), nan.to_vec()].concat());
    assert_eq!(bad_alpha.status.code(), Some(2), "{}", stderr(&bad_alpha));
    // A whole model's checkpoint does not resume as an adapter.
    let full = dir.path().join("full");
    let o = gerbil_train(&flags(m, d, "1", s(&full)));
    assert!(o.status.success(), "{}", stderr(&o));
    let resume = ["--resume", "--lora", "2"];
    let err = refused(&[flags(s(&full), d, "2", s(&out)), resume.to_vec()].concat());
    assert!(err.contains("holds a whole model, not an adapter"), "{err}");
    // A whole-model run into the adapter's directory leaves no adapter
    // behind to be merged into its weights.
    let o = gerbil_train(&flags(m, d, "1", s(&half)));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(half.join("model.safetensors").is_file());
    assert!(!half.join("adapter_config.json").exists());
}
