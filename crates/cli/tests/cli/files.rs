//! Files a careless user hands the tools: `-o` naming an input, a
//! directory or a device; a compile that fails; a FIFO, a directory or a
//! truncated file as the plan; two compiles racing for one `-o`. Each is a
//! clear error that names the path (or, for the race, one complete plan),
//! never a clobbered input, a leftover temporary file or a hang.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A copy of the tiny Llama checkpoint in a fresh directory.
fn tiny_copy(tag: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = temp(tag);
    let repo = dir.path().join("llama");
    std::fs::create_dir(&repo).unwrap();
    for e in std::fs::read_dir(data("models/tiny/llama")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), repo.join(e.file_name())).unwrap();
    }
    (dir, repo)
}

/// Names in `dir` that look like a gerbil temporary file.
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("gerbil-tmp") || n.ends_with(".partial"))
        .collect()
}

fn compile_args<'a>(repo: &'a Path, out: &'a Path) -> Vec<&'a str> {
    vec![
        "compile",
        repo.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]
}

/// Runs `cmd` and kills it if it has not ended within `limit`.
fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("the command still ran after {limit:?} (blocked?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn an_output_that_is_an_input_is_refused_and_the_input_is_untouched() {
    let (_dir, repo) = tiny_copy("out-is-input");
    for name in ["config.json", "model.safetensors"] {
        let input = repo.join(name);
        let before = std::fs::read(&input).unwrap();
        let o = gerbilc(&compile_args(&repo, &input));
        assert_fails_with(&o, "is the same file as the input");
        assert_fails_with(&o, name);
        assert_eq!(std::fs::read(&input).unwrap(), before, "{name} changed");
        assert!(temporaries(&repo).is_empty());
    }
    // The plan being read, as the SVG of `inspect`.
    let plan = repo.with_file_name("a.plan");
    compile_to(&repo, &plan, &[]);
    let before = std::fs::read(&plan).unwrap();
    let p = plan.to_str().unwrap();
    let o = gerbilc(&["inspect", p, "--svg", p]);
    assert_fails_with(&o, "is the same file as the input");
    assert_eq!(std::fs::read(&plan).unwrap(), before);
}

#[test]
fn an_output_that_is_a_directory_is_refused_and_left_empty() {
    let (dir, repo) = tiny_copy("out-is-dir");
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let o = gerbilc(&compile_args(&repo, &out));
    assert_fails_with(
        &o,
        &format!("`{}` is a directory; give a file name", out.display()),
    );
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
    assert!(temporaries(dir.path()).is_empty());
}

#[cfg(unix)]
#[test]
fn a_device_as_the_output_is_refused_before_any_work() {
    use std::os::unix::fs::FileTypeExt;
    let o = gerbilc(&compile_args(
        &data("models/tiny/llama"),
        Path::new("/dev/null"),
    ));
    assert_fails_with(&o, "`/dev/null` is a character device, not a regular file");
    let meta = std::fs::metadata("/dev/null").unwrap();
    assert!(meta.file_type().is_char_device());
}

#[test]
fn a_failing_compile_keeps_the_old_plan_and_leaves_no_temporary_file() {
    let (dir, repo) = tiny_copy("failing");
    let weights = repo.join("model.safetensors");
    let len = std::fs::metadata(&weights).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let out = dir.path().join("a.plan");
    std::fs::write(&out, b"the old plan").unwrap();
    let o = gerbilc(&compile_args(&repo, &out));
    assert_fails_with(&o, "model.safetensors");
    assert_eq!(std::fs::read(&out).unwrap(), b"the old plan");
    assert!(
        temporaries(dir.path()).is_empty(),
        "{:?}",
        temporaries(dir.path())
    );

    // And a compile that succeeds replaces it, leaving nothing else behind.
    compile_to(&data("models/tiny/llama"), &out, &[]);
    assert!(std::fs::read(&out).unwrap().starts_with(b"GERBPLAN"));
    assert!(temporaries(dir.path()).is_empty());
}

#[cfg(unix)]
#[test]
fn a_fifo_as_the_plan_is_an_error_at_once() {
    let dir = temp("fifo");
    let fifo = dir.path().join("a.plan");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let f = fifo.to_str().unwrap();
    let limit = Duration::from_secs(20);
    let mut run = gerbil_run_command(&[f, "--input-ids", "1"]);
    run.stdin(Stdio::null());
    let o = output_within(run, limit);
    assert_fails_with(&o, "is a FIFO (named pipe), not a regular file");
    assert_fails_with(&o, f);
    let mut inspect = Command::new(env!("CARGO_BIN_EXE_gerbilc"));
    inspect.args(["inspect", f]);
    let o = output_within(inspect, limit);
    assert_fails_with(&o, "is a FIFO (named pipe), not a regular file");
}

#[test]
fn a_directory_as_the_plan_says_so() {
    let dir = temp("dir-plan");
    let d = dir.path().to_str().unwrap();
    let o = gerbilc(&["inspect", d]);
    assert_fails_with(&o, &format!("`{d}` is a directory, not a regular file"));
    let o = gerbil_run(&[d, "--input-ids", "1"]);
    assert_fails_with(&o, &format!("`{d}` is a directory, not a regular file"));
}

#[test]
fn a_truncated_plan_is_a_clear_error() {
    let (_dir, plan) = tiny_plan("truncated", &[]);
    let len = std::fs::metadata(&plan).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&plan)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    let p = plan.to_str().unwrap();
    let expected = format!("truncated plan file ({} bytes, expected {len})", len - 100);
    assert_fails_with(&gerbilc(&["inspect", p]), &expected);
    assert_fails_with(&gerbil_run(&[p, "--input-ids", "1"]), &expected);
}

/// Two compiles of different models to one `-o` at once: both succeed, and
/// the file is byte for byte one of the two plans (the last rename wins).
#[test]
fn two_compiles_to_one_output_leave_one_complete_plan() {
    let dir = temp("race");
    let (llama, qwen) = (data("models/tiny/llama"), data("models/tiny/qwen2"));
    let alone = |repo: &Path, name: &str| {
        let path = dir.path().join(name);
        compile_to(repo, &path, &[]);
        std::fs::read(path).unwrap()
    };
    let (a, b) = (alone(&llama, "llama.plan"), alone(&qwen, "qwen.plan"));
    assert_ne!(a, b);
    let out = dir.path().join("shared.plan");
    for _ in 0..3 {
        let spawn = |repo: &Path| {
            Command::new(env!("CARGO_BIN_EXE_gerbilc"))
                .args(compile_args(repo, &out))
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn gerbilc")
        };
        let (x, y) = (spawn(&llama), spawn(&qwen));
        for child in [x, y] {
            let o = child.wait_with_output().unwrap();
            assert!(o.status.success(), "{}", stderr(&o));
        }
        let got = std::fs::read(&out).unwrap();
        assert!(got == a || got == b, "the plan is neither compile's");
        assert!(temporaries(dir.path()).is_empty());
    }
}

/// A checkpoint whose weights or config is a FIFO, or whose weights are a
/// directory: an error naming the file at once, not a compile blocked forever.
#[cfg(unix)]
#[test]
fn special_files_in_a_checkpoint_are_errors_at_once() {
    for (name, make) in [
        ("model.safetensors", "fifo"),
        ("config.json", "fifo"),
        ("model.safetensors", "dir"),
    ] {
        let (dir, repo) = tiny_copy("special-ckpt");
        let path = repo.join(name);
        std::fs::remove_file(&path).unwrap();
        if make == "fifo" {
            assert!(Command::new("mkfifo")
                .arg(&path)
                .status()
                .unwrap()
                .success());
        } else {
            std::fs::create_dir(&path).unwrap();
        }
        let out = dir.path().join("a.plan");
        let mut c = Command::new(env!("CARGO_BIN_EXE_gerbilc"));
        c.args(compile_args(&repo, &out));
        let o = output_within(c, Duration::from_secs(20));
        assert_fails_with(&o, &path.display().to_string());
        assert_fails_with(&o, "not a regular file");
        assert!(!out.exists());
    }
}

/// Ctrl-C while the plan is being written: the temporary file is removed,
/// the old plan stays as it was, and the status is the shell's 130.
#[test]
fn ctrl_c_while_writing_removes_the_temporary_and_keeps_the_old_plan() {
    let dir = temp("interrupt");
    let out = dir.path().join("model.plan");
    std::fs::write(&out, b"the old plan").unwrap();
    let repo = smollm2_dir();
    let mut args = compile_args(&repo, &out);
    args.push("-q");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gerbilc"))
        .args(&args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gerbilc");
    // SmolLM2's 270 MB of weights take long enough to write to catch the
    // temporary file in place.
    let start = Instant::now();
    while temporaries(dir.path()).is_empty() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "gerbilc ended before writing"
        );
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "no temporary file"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(
        err.contains("interrupted; removed the unfinished")
            && err.contains(".model.plan.gerbil-tmp-"),
        "{err}"
    );
    assert_eq!(temporaries(dir.path()), Vec::<String>::new());
    assert_eq!(std::fs::read(&out).unwrap(), b"the old plan");
}
