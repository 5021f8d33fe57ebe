//! Hardening against sizes, as a user meets them: huge and zero size flags
//! of `gerbilc compile` and `gerbil-run bench` are errors that name the
//! flag, the value and the limit (never a wrapped product, a panic or a
//! silent clamp), and a plan whose header was edited, with its checksum
//! made to match again, is refused by `gerbil-run` before it touches the
//! GPU.

use crate::common::*;

/// `gerbilc compile` of the tiny Llama with `flags`, into a temp dir.
fn compile_with(flags: &[&str]) -> (std::process::Output, tempfile::TempDir) {
    let dir = temp("sizes");
    let out = dir.path().join("t.plan");
    let repo = data("models/tiny/llama");
    let mut args = vec![
        "compile",
        repo.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    let o = gerbilc(&args);
    assert!(!out.exists(), "a refused compile wrote a plan");
    (o, dir)
}

/// The first line of standard error (the message a user reads).
fn error_line(o: &std::process::Output) -> String {
    let err = stderr(o);
    err.lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in:\n{err}"))
        .to_string()
}

#[test]
fn huge_and_zero_compile_sizes_are_errors_naming_the_flag_and_the_limit() {
    let context_limit = "exceeds the largest context gerbil supports (1073741824 tokens: each \
         layer's KV cache is one storage binding of at most 2 GiB - 4 bytes holding at least one \
         2-byte value per position, and kernels keep positions in u32); pick at most 1073741824";
    for huge in ["4294967296", "18446744073709551615"] {
        let (o, _dir) = compile_with(&["--max-context", huge]);
        assert_fails_with(&o, "");
        assert_eq!(
            error_line(&o),
            format!("error: --max-context {huge} {context_limit}")
        );
    }
    let (o, _dir) = compile_with(&["--max-context", "0"]);
    assert_fails_with(&o, "");
    assert_eq!(
        error_line(&o),
        "error: --max-context 0: the KV cache must hold at least 1 token"
    );

    let (o, _dir) = compile_with(&["--max-tokens-per-step", "0"]);
    assert_fails_with(&o, "");
    assert_eq!(
        error_line(&o),
        "error: --max-tokens-per-step 0: a step must take at least 1 token; give 1 or more, or \
         leave the flag out to let gerbilc choose"
    );
    let (o, _dir) = compile_with(&["--max-context", "16", "--max-tokens-per-step", "17"]);
    assert_fails_with(&o, "");
    assert_eq!(
        error_line(&o),
        "error: --max-tokens-per-step 17: a step cannot take more tokens than the KV cache \
         holds (16, --max-context); pick at most 16"
    );
    let (o, _dir) = compile_with(&["--max-tokens-per-step", "99999999999"]);
    assert_fails_with(&o, "");
    assert_eq!(
        error_line(&o),
        "error: --max-tokens-per-step 99999999999 exceeds the largest step gerbil supports \
         (65535 tokens: the embedding, RMSNorm and GEMV kernels dispatch one workgroup per token \
         along one axis, and WebGPU allows at most 65535 workgroups per dimension); pick at \
         most 65535"
    );

    let (o, _dir) = compile_with(&["--max-storage-binding", "18446744073709551615"]);
    assert_fails_with(&o, "");
    assert!(
        error_line(&o).starts_with(
            "error: --max-storage-binding 18446744073709551615 exceeds the largest storage \
             binding gerbil supports (2147483644 bytes"
        ),
        "{}",
        stderr(&o)
    );
    let (o, _dir) = compile_with(&["--max-storage-binding", "0"]);
    assert_fails_with(&o, "");
    assert_eq!(
        error_line(&o),
        "error: --max-storage-binding 0: a binding must hold at least one 4-byte value; give \
         the device's maxStorageBufferBindingSize"
    );
}

#[test]
fn huge_and_zero_bench_sizes_are_errors_before_the_gpu_opens() {
    let (_dir, plan) = tiny_plan("bench-sizes", &["--max-context", "16"]);
    let bench = |flags: &[&str]| {
        let mut args = vec![plan.to_str().unwrap(), "bench"];
        args.extend_from_slice(flags);
        let o = gerbil_run(&args);
        assert_fails_with(&o, "");
        error_line(&o)
    };
    assert_eq!(
        bench(&["--prompt-tokens", "0"]),
        "error: --prompt-tokens 0: bench times a prompt of at least 1 token; give 1 or more"
    );
    assert_eq!(
        bench(&["--prompt-tokens", "18446744073709551615"]),
        "error: --prompt-tokens 18446744073709551615 exceeds the plan's context of 16 tokens; \
         pick at most 16, or recompile with a larger --max-context"
    );
    assert_eq!(
        bench(&["--prompt-tokens", "4", "--new-tokens", "0"]),
        "error: --new-tokens 0: bench times at least 1 decode step; give 1 or more"
    );
    // These two wrapped a usize (a panic in a debug build).
    assert_eq!(
        bench(&[
            "--prompt-tokens",
            "4",
            "--new-tokens",
            "18446744073709551615"
        ]),
        "error: the decode depth 4 (--depth, else --prompt-tokens) + --new-tokens \
         18446744073709551615 exceeds the plan's context of 16 tokens; make them add up to at \
         most 16"
    );
    assert_eq!(
        bench(&[
            "--prompt-tokens",
            "4",
            "--depth",
            "18446744073709551615",
            "--new-tokens",
            "2"
        ]),
        "error: the decode depth 18446744073709551615 (--depth, else --prompt-tokens) + \
         --new-tokens 2 exceeds the plan's context of 16 tokens; make them add up to at most 16"
    );
}

#[test]
fn huge_and_zero_run_sizes_end_at_the_context_or_are_errors() {
    let (_dir, plan) = tiny_plan("run-sizes", &["--max-context", "16"]);
    let plan = plan.to_str().unwrap();
    // As many tokens as a usize holds: generation stops where the context
    // ends, instead of reserving memory for them or wrapping a sum.
    let o = gerbil_run(&[
        plan,
        "--input-ids",
        "1,2",
        "--max-new-tokens",
        "18446744073709551615",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(out["finish_reason"], "length", "{out}");
    assert_eq!(out["output_ids"].as_array().unwrap().len(), 15, "{out}");
    for ctx in ["0", "18446744073709551615"] {
        let o = gerbil_run(&[plan, "--ctx", ctx, "--input-ids", "1,2"]);
        assert_fails_with(&o, "");
        assert_eq!(
            error_line(&o),
            format!(
                "error: a context of {ctx} tokens is not possible: this plan holds 1 to 16 \
                 tokens; give --ctx at most 16, or recompile with a larger --max-context"
            )
        );
    }
}

#[test]
fn negative_and_fractional_numbers_say_what_the_flag_takes() {
    // Without clap's negative-number setting, `-5` read as an unknown flag.
    let (o, _dir) = compile_with(&["--max-context", "-5"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(
        error_line(&o),
        "error: invalid value '-5' for '--max-context <MAX_CONTEXT>': -5 is negative; give a \
         whole number, 0 or more"
    );
    let (o, _dir) = compile_with(&["--max-tokens-per-step", "1.5"]);
    assert_eq!(
        error_line(&o),
        "error: invalid value '1.5' for '--max-tokens-per-step <MAX_TOKENS_PER_STEP>': 1.5 is \
         not a whole number; give one without a fraction"
    );
    let (_d, plan) = tiny_plan("negative", &["--max-context", "16"]);
    let plan = plan.to_str().unwrap();
    for (flag, value) in [
        ("--ctx", "-1"),
        ("--max-new-tokens", "-3"),
        ("--seed", "-4"),
    ] {
        let mut args = vec![plan, "--input-ids", "1,2", "--temperature", "0.5"];
        args.extend([flag, value]);
        let o = gerbil_run(&args);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(
            error_line(&o).ends_with(&format!(
                "': {value} is negative; give a whole number, 0 or more"
            )),
            "{}",
            stderr(&o)
        );
    }
    // The penalties take negative values, as documented.
    let o = gerbil_run(&[
        plan,
        "--input-ids",
        "1,2",
        "--max-new-tokens",
        "2",
        "--temperature",
        "0.5",
        "--presence-penalty",
        "-1",
        "--frequency-penalty",
        "-0.5",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = gerbil_run(&[plan, "--input-ids", "1,2", "--temperature", "-1"]);
    assert_eq!(
        error_line(&o),
        "error: invalid sampling settings: temperature must be ≥ 0, got -1"
    );
}

/// An edit of a plan header's JSON.
type Edit = fn(&mut serde_json::Value);

#[test]
fn edited_headers_with_matching_checksums_are_refused_with_the_reason() {
    // One precision: an edit of the f32 caches' rows is not also caught by
    // the f16 ones'.
    let (dir, plan) = tiny_plan("edited", &["--max-context", "16", "--target", "portable"]);
    let cases: [(&str, Edit, &str); 6] = [
        (
            "context",
            |h| h["model"]["max_context"] = 4_294_967_296u64.into(),
            "model.max_context 4294967296 exceeds the largest context gerbil supports",
        ),
        (
            "step",
            |h| h["model"]["max_tokens_per_step"] = 0.into(),
            "model.max_tokens_per_step is 0; it must be at least 1",
        ),
        (
            "kv",
            |h| h["model"]["max_context"] = 24.into(),
            "(a KV cache) has 2048 bytes, not 24 (max_context) rows of 2-byte or 4-byte values",
        ),
        (
            // Twice the context fits the caches' bytes, not their rows.
            "rows",
            |h| h["model"]["max_context"] = 32.into(),
            "(a KV cache) has 2048 bytes: 32 (max_context) rows of 64 bytes, but its rows are \
             128 bytes",
        ),
        (
            // A context doubled consistently for the caches (rows of half
            // the bytes) still finds the RoPE table holding 16 positions.
            "rope",
            |h| {
                h["model"]["max_context"] = 32.into();
                for b in h["buffers"].as_array_mut().unwrap() {
                    if b["kind"]["kind"] == "kv_cache" {
                        b["kind"]["row_bytes"] = 64.into();
                    }
                }
            },
            "(rope_table) is indexed by position with shape [16, 16] in 1024 bytes, not 32 \
             (max_context) rows of 4-byte values",
        ),
        (
            "divisor",
            |h| h["variants"][0]["decode"][0]["workgroups"][0]["divisor"] = 0.into(),
            "divides its workgroup count (axis 0) by 0",
        ),
    ];
    for (tag, edit, reason) in cases {
        let edited = dir.path().join(format!("{tag}.plan"));
        std::fs::copy(&plan, &edited).unwrap();
        edit_header(&edited, edit);
        let path = edited.to_str().unwrap();
        let o = gerbil_run(&[path, "--input-ids", "1,2", "--max-new-tokens", "2"]);
        assert_fails_with(&o, &format!("{path}: inconsistent plan: "));
        assert_fails_with(&o, reason);
        assert_fails_with(
            &o,
            "; the file was edited or damaged: recompile it with `gerbilc compile`",
        );
    }
}
