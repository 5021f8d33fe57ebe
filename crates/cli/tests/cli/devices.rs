//! GPUs, log levels and progress bars as a user meets them, over real
//! processes: `gerbil-run devices [--json]`, `--device N`, `-v`/`-vv`/`-vvv`
//! and `GERBIL_LOG`, and bars that show on a terminal (a pseudo-terminal
//! made by util-linux's `script`) but never with `--quiet` or on a pipe.

use crate::common::*;
use std::process::Output;

const IDS: &str = "14,34,328,242,438,202,17,354,183,500,325,56,88";

#[test]
fn devices_lists_lavapipe_with_its_backend_and_features() {
    let o = gerbil_run_clean(&["devices"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    for needle in [
        "llvmpipe",
        "backend vulkan, cpu device",
        "shader-f16 yes",
        "subgroups yes",
        "cooperative matrix no",
        "timestamp queries",
        "max storage binding",
        "* the default",
    ] {
        assert!(table.contains(needle), "`{needle}` missing:\n{table}");
    }
    assert!(
        table.lines().any(|l| l.starts_with("* 0  llvmpipe")),
        "{table}"
    );

    let o = gerbil_run_clean(&["devices", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON array");
    let list = v.as_array().expect("an array");
    for (i, a) in list.iter().enumerate() {
        assert_eq!(a["index"], i, "{a}");
        for key in [
            "shader_f16",
            "subgroups",
            "cooperative_matrix",
            "timestamp_queries",
            "default",
        ] {
            assert!(a[key].is_boolean(), "{key} in {a}");
        }
        assert!(a["max_storage_binding"].as_u64().unwrap_or(0) > 0, "{a}");
    }
    assert_eq!(list.iter().filter(|a| a["default"] == true).count(), 1);
    let lp = list
        .iter()
        .find(|a| a["name"].as_str().is_some_and(|n| n.contains("llvmpipe")))
        .expect("lavapipe listed");
    assert_eq!(lp["backend"], "vulkan");
    assert_eq!(lp["device_type"], "cpu");
    assert_eq!(lp["shader_f16"], true);
}

#[test]
fn a_plan_is_needed_except_by_devices_which_takes_none() {
    let o = gerbil_run_clean(&[]);
    assert_fails_with(&o, "no plan given");
    assert!(stderr(&o).contains("gerbil-run devices"), "{}", stderr(&o));
    let o = gerbil_run_clean(&["some.plan", "devices"]);
    assert_fails_with(&o, "`gerbil-run devices` takes no plan");
}

#[test]
fn device_zero_runs_a_plan_as_the_default_does_and_device_99_is_refused() {
    let (_dir, plan) = tiny_plan("device", &[]);
    let plan = plan.to_str().unwrap();
    let args = |extra: &[&'static str]| {
        let mut a = vec![
            plan,
            "--input-ids",
            IDS,
            "--max-new-tokens",
            "6",
            "--temperature",
            "0",
            "--json",
        ];
        a.extend_from_slice(extra);
        a
    };
    let default = gerbil_run_clean(&args(&[]));
    assert!(default.status.success(), "{}", stderr(&default));
    let chosen = gerbil_run_clean(&args(&["--device", "0"]));
    assert!(chosen.status.success(), "{}", stderr(&chosen));
    let ids = |o: &Output| {
        let v: serde_json::Value = serde_json::from_str(&stdout(o)).expect("JSON");
        v["output_ids"].clone()
    };
    assert_eq!(ids(&default), ids(&chosen));
    assert_eq!(ids(&chosen).as_array().map(Vec::len), Some(6));

    let o = gerbil_run_clean(&args(&["--device", "99"]));
    assert_fails_with(&o, "there is no GPU adapter 99");
    assert!(stderr(&o).contains("`gerbil-run devices` lists them"));
    let o = gerbil_run_clean(&[
        plan,
        "bench",
        "--device",
        "99",
        "--repeats",
        "1",
        "--prompt-tokens",
        "8",
        "--new-tokens",
        "8",
    ]);
    assert_fails_with(&o, "there is no GPU adapter 99");
}

/// Log lines of `stderr` (`<time> <LEVEL> <target>: ...`) as (level, target).
fn log_lines(stderr: &str) -> Vec<(String, String)> {
    stderr
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let (_time, level, target) = (words.next()?, words.next()?, words.next()?);
            let levels = ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"];
            levels
                .contains(&level)
                .then(|| (level.to_string(), target.trim_end_matches(':').to_string()))
        })
        .collect()
}

#[test]
fn each_v_shows_more_of_gerbil_and_only_three_show_wgpu() {
    let (_dir, plan) = tiny_plan("verbose", &[]);
    let plan = plan.to_str().unwrap();
    let go = |flags: &[&str]| {
        let mut a = vec![plan, "--input-ids", IDS, "--max-new-tokens", "2"];
        a.extend_from_slice(flags);
        let o = gerbil_run_clean(&a);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            !stderr(&o).contains('\x1b'),
            "no colours on a pipe: {}",
            stderr(&o)
        );
        log_lines(&stderr(&o))
    };
    assert!(go(&[]).is_empty(), "no logs without -v");

    let v = go(&["-v"]);
    assert!(
        v.contains(&("INFO".into(), "gerbil_runtime::device".into())),
        "{v:?}"
    );
    assert!(
        v.contains(&("INFO".into(), "gerbil_runtime::session".into())),
        "{v:?}"
    );
    assert!(v.iter().all(|(l, _)| l != "DEBUG"), "{v:?}");

    let vv = go(&["-vv"]);
    assert!(
        vv.iter()
            .any(|(l, t)| l == "DEBUG" && t.starts_with("gerbil_runtime")),
        "{vv:?}"
    );
    assert!(vv.iter().all(|(_, t)| t.starts_with("gerbil")), "{vv:?}");

    let vvv = go(&["-vvv"]);
    assert!(vvv.iter().any(|(_, t)| t.starts_with("wgpu")), "{vvv:?}");
    assert!(vvv.iter().all(|(_, t)| !t.starts_with("naga")), "{vvv:?}");

    // GERBIL_LOG replaces the -v levels.
    let mut c = clean_command(
        env!("CARGO_BIN_EXE_gerbil-run"),
        &[plan, "--input-ids", IDS, "--max-new-tokens", "2", "-vv"],
    );
    c.env("GERBIL_LOG", "gerbil_runtime::variant=info");
    let o = run_on_gpu(c);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        log_lines(&stderr(&o)),
        [("INFO".to_string(), "gerbil_runtime::variant".to_string())]
    );
}

#[test]
fn gerbilc_v_logs_the_compile_phases() {
    let dir = temp("gerbilc-v");
    let out = dir.path().join("tiny.plan");
    let repo = data("models/tiny/llama");
    let o = run_on_gpu(clean_command(
        env!("CARGO_BIN_EXE_gerbilc"),
        &[
            "compile",
            repo.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "-v",
        ],
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for phase in [
        "lowered the checkpoint",
        "ran the passes",
        "generated the kernels",
    ] {
        assert!(err.contains(phase), "`{phase}` missing:\n{err}");
    }
    assert!(log_lines(&err).iter().all(|(l, _)| l == "INFO"), "{err}");
}

/// Runs `args` under a pseudo-terminal (`script`), stdout to /dev/null;
/// returns what the terminal showed.
fn on_a_terminal(bin: &str, args: &[&str]) -> String {
    let line = std::iter::once(bin)
        .chain(args.iter().copied())
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut c = clean_command(
        "script",
        &["-qec", &format!("{line} >/dev/null"), "/dev/null"],
    );
    c.env("COLUMNS", "100");
    let o = run_on_gpu(c);
    assert!(
        o.status.success(),
        "under script(1) (util-linux): {}{}",
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

#[test]
fn bars_show_on_a_terminal_but_not_with_quiet_or_on_a_pipe() {
    // Chunks of 32 tokens, so that a 300-token prompt takes ten steps.
    let (_dir, plan) = tiny_plan(
        "bars",
        &["--max-context", "512", "--max-tokens-per-step", "32"],
    );
    let plan = plan.to_str().unwrap();
    let ids: Vec<String> = (0..300).map(|i| (i * 7 % 500 + 1).to_string()).collect();
    let ids = ids.join(",");
    let args = [plan, "--input-ids", &ids, "--max-new-tokens", "2"];
    let run_bin = env!("CARGO_BIN_EXE_gerbil-run");

    let shown = on_a_terminal(run_bin, &args);
    assert!(shown.contains("uploading weights"), "{shown:?}");
    assert!(shown.contains("/300 tokens"), "{shown:?}");
    assert!(shown.contains("\x1b["), "{shown:?}");

    let quiet: Vec<&str> = args.iter().copied().chain(["--quiet"]).collect();
    let hidden = on_a_terminal(run_bin, &quiet);
    assert!(!hidden.contains('\x1b'), "{hidden:?}");
    assert!(!hidden.contains("uploading"), "{hidden:?}");

    let piped = gerbil_run_clean(&args);
    assert!(piped.status.success(), "{}", stderr(&piped));
    assert!(!stderr(&piped).contains('\x1b'), "{}", stderr(&piped));
    assert!(!stderr(&piped).contains("uploading"), "{}", stderr(&piped));

    // gerbilc compile draws the plan being written, and not with --quiet.
    let dir = temp("bars-gerbilc");
    let out = dir.path().join("t.plan");
    let repo = data("models/tiny/llama");
    let compile = [
        "compile",
        repo.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    let shown = on_a_terminal(env!("CARGO_BIN_EXE_gerbilc"), &compile);
    assert!(shown.contains("writing plan"), "{shown:?}");
    let quiet: Vec<&str> = compile.iter().copied().chain(["--quiet"]).collect();
    let hidden = on_a_terminal(env!("CARGO_BIN_EXE_gerbilc"), &quiet);
    assert!(!hidden.contains('\x1b'), "{hidden:?}");
    assert!(hidden.contains("wrote"), "{hidden:?}");
}
