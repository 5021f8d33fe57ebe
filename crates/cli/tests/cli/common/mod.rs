//! Helpers the command-line tests share: running the real binaries, temp
//! directories, compiling the tiny Llama (with text of the tests' own: [`tiny_text_plan`]) and
//! the SmolLM2 fixture, and the transformers references.

mod tiny_text;
pub use tiny_text::{tiny_text_model, tiny_text_plan, tiny_text_plan_of};

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;

/// Serializes GPU work among the command-line tests (lavapipe already uses every core).
pub static GPU: Mutex<()> = Mutex::new(());

/// A file under `tests/data` of the workspace.
pub fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(rel)
}

/// A fresh temp directory, removed with its contents when dropped.
pub fn temp(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("gerbil-cli-{tag}-"))
        .tempdir()
        .expect("create temp dir")
}

/// A directory for files that live as long as the test process (plans a
/// `static` compiles once): statics are never dropped, so a [`temp`] there
/// would leak its files into `/tmp` on every run. This one lies under the
/// target directory's scratch space, and each run writes the same names
/// again. It is never emptied: two test processes may share it, and
/// `gerbilc` writes a plan under a temporary name and renames it into
/// place, so one process's compile never pulls a plan from under another.
pub fn process_dir(tag: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("gerbil-cli-{tag}"));
    std::fs::create_dir_all(&dir).expect("create the process directory");
    dir
}

/// Runs `gerbilc` and collects its output.
pub fn gerbilc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gerbilc"))
        .args(args)
        .output()
        .expect("spawn gerbilc")
}

/// `gerbil-run` as a command without the on-disk pipeline cache.
pub fn gerbil_run_command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gerbil-run"));
    c.args(args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .env("GERBIL_PIPELINE_CACHE", "0");
    c
}

/// Runs `gerbil-run` (holding the GPU lock) and collects its output.
pub fn gerbil_run(args: &[&str]) -> Output {
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    gerbil_run_command(args).output().expect("spawn gerbil-run")
}

/// Runs `gerbil-run` (holding the GPU lock) with extra environment
/// variables, which may override `GERBIL_PIPELINE_CACHE=0`.
pub fn gerbil_run_with(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Output {
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    gerbil_run_command(args)
        .envs(env.iter().copied())
        .output()
        .expect("spawn gerbil-run")
}

/// A command for the binary `bin` without the pipeline cache, the caller's
/// `GERBIL_LOG`, or standard input (for tests that read the logs).
pub fn clean_command(bin: &str, args: &[&str]) -> Command {
    let mut c = Command::new(bin);
    c.args(args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .env("GERBIL_PIPELINE_CACHE", "0")
        .env_remove("GERBIL_LOG")
        .stdin(Stdio::null());
    c
}

/// Runs `c` holding the GPU lock and collects its output.
pub fn run_on_gpu(mut c: Command) -> Output {
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    c.output().expect("spawn")
}

/// Runs `gerbil-run` as a [`clean_command`] (holding the GPU lock).
pub fn gerbil_run_clean(args: &[&str]) -> Output {
    run_on_gpu(clean_command(env!("CARGO_BIN_EXE_gerbil-run"), args))
}

/// Runs `gerbil-run` with `input` on standard input.
pub fn gerbil_run_stdin(args: &[&str], input: impl AsRef<[u8]>) -> Output {
    use std::io::Write;
    let _gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let mut child = gerbil_run_command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gerbil-run");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_ref()).unwrap();
    drop(stdin);
    child.wait_with_output().expect("gerbil-run output")
}

/// The process's standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The process's standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Compiles `repo` with extra flags into a temp directory; returns the
/// directory (deleted when dropped) and the plan's path.
pub fn compile(repo: &Path, tag: &str, extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let dir = temp(tag);
    let out = dir.path().join(format!("{tag}.plan"));
    compile_to(repo, &out, extra);
    (dir, out)
}

/// Compiles `repo` with extra flags into the plan file `out`.
pub fn compile_to(repo: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "compile",
        repo.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = gerbilc(&args);
    assert!(o.status.success(), "gerbilc failed: {}", stderr(&o));
}

/// The tiny random Llama (no tokenizer) compiled with extra flags.
pub fn tiny_plan(tag: &str, extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    compile(&data("models/tiny/llama"), tag, extra)
}

/// The SmolLM2-135M-Instruct fixture (`$GERBIL_FIXTURES/smollm2-135m`).
pub fn smollm2_dir() -> PathBuf {
    std::env::var_os("GERBIL_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"))
        .join("smollm2-135m")
}

/// The SmolLM2 reference (`tests/data/refs/smollm2-135m.json`).
pub fn smollm2_reference() -> serde_json::Value {
    let text = std::fs::read_to_string(data("refs/smollm2-135m.json")).expect("reference");
    serde_json::from_str(&text).expect("reference JSON")
}

/// One prompt of the SmolLM2 reference, by id.
pub fn reference_prompt(id: &str) -> serde_json::Value {
    smollm2_reference()["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == id)
        .unwrap_or_else(|| panic!("no reference prompt {id}"))
        .clone()
}

/// Asserts that the process failed with `needle` in its standard error, and
/// without a panic.
pub fn assert_fails_with(o: &Output, needle: &str) {
    assert!(
        !o.status.success(),
        "expected failure, got success: {}",
        stdout(o)
    );
    let err = stderr(o);
    assert!(
        err.contains(needle),
        "expected `{needle}` in stderr:\n{err}"
    );
    assert!(
        !err.contains("panicked"),
        "panicked instead of an error:\n{err}"
    );
}

/// Rewrites the header of the plan at `path` with `edit` applied, and its
/// header checksum to match, as a careful vandal would (the verbatim
/// `config.json` is dropped so the edited header fits the padding).
pub fn edit_header(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut bytes = std::fs::read(path).unwrap();
    let word = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let (len, data_offset) = (word(&bytes, 16) as usize, word(&bytes, 24) as usize);
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[48..48 + len]).unwrap();
    edit(&mut header);
    header["model"]["config"] = serde_json::json!({});
    let json = serde_json::to_vec(&header).unwrap();
    assert!(
        48 + json.len() <= data_offset,
        "the edited header does not fit"
    );
    bytes[48..data_offset].fill(0);
    bytes[48..48 + json.len()].copy_from_slice(&json);
    bytes[16..24].copy_from_slice(&(json.len() as u64).to_le_bytes());
    bytes[40..44].copy_from_slice(&crc32fast::hash(&json).to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}
