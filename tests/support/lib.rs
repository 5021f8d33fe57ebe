//! Shared helpers of gerbil's end-to-end tests: where the test data lives,
//! compiling a checkpoint to a temporary plan, the reference-file schemas,
//! and a lock that keeps GPU tests from running at the same time (lavapipe
//! already uses every core).

pub mod coop_emulation;
pub mod kernel_harness;

pub use gerbil_interp::{interpreter, reference};

use gerbil_compiler::{
    compile, Checkpoint, CompileOptions, Materializer, Rounding, TensorSource, WeightOptions,
};
use gerbil_passes::PassReport;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The CPU interpreter's weights from `tensors`: as a plan would hold them,
/// but a NaN is computed with, not refused (the interpreter checks what it
/// is given).
pub fn interpreter_weights(tensors: &dyn TensorSource) -> Materializer<'_> {
    Materializer {
        tensors,
        options: WeightOptions {
            rounding: Rounding::Ggml,
            allow_non_finite: true,
        },
    }
}

/// The repository root: `$GERBIL_REPO` if set (for test binaries copied to
/// another machine), else the checkout this crate was built from.
pub fn repo_root() -> PathBuf {
    match std::env::var_os("GERBIL_REPO") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
    }
}

/// `tests/data`.
pub fn data_dir() -> PathBuf {
    repo_root().join("tests/data")
}

/// Every tiny decoder of `tests/data/models/tiny`: one per family, plus
/// the Llama stored in bf16.
pub const TINY_DECODERS: &[&str] = &[
    "llama",
    "llama_bf16",
    "qwen2",
    "qwen3",
    "mistral",
    "gemma3",
    "phi3",
];

/// A tiny random-weight model's directory, e.g. `tiny_model("llama")`.
pub fn tiny_model(name: &str) -> PathBuf {
    data_dir().join("models/tiny").join(name)
}

/// A real model built by `scripts/build-fixtures.py`: `$GERBIL_FIXTURES/<name>`
/// or `<repo>/fixtures/<name>`. Panics with the command to run if absent.
pub fn fixture(name: &str) -> PathBuf {
    let dir = fixtures_root().join(name);
    assert!(
        dir.join("model.safetensors").is_file(),
        "{} is missing: run `python3 scripts/build-fixtures.py --out fixtures {name}` (or scripts/test.sh)",
        dir.display()
    );
    dir
}

/// Tiny model `name` as a GGUF file (`$GERBIL_FIXTURES/tiny-gguf/<name>.gguf`,
/// written by `scripts/make-tiny-gguf.py` from build-fixtures.py). Panics
/// with the command to run if absent.
pub fn tiny_gguf(name: &str) -> PathBuf {
    let path = fixtures_root()
        .join("tiny-gguf")
        .join(format!("{name}.gguf"));
    assert!(
        path.is_file(),
        "{} is missing: run `python3 scripts/build-fixtures.py --out fixtures all` (or scripts/test.sh)",
        path.display()
    );
    path
}

/// Where `scripts/build-fixtures.py` wrote the fixtures: `$GERBIL_FIXTURES`,
/// else `<repo>/fixtures`.
fn fixtures_root() -> PathBuf {
    std::env::var_os("GERBIL_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("fixtures"))
}

static GPU: Mutex<()> = Mutex::new(());

/// Serializes GPU work across the tests of one binary.
pub fn gpu_lock() -> MutexGuard<'static, ()> {
    GPU.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh directory under the system temp dir whose name contains `tag`;
/// removed with everything in it when the returned value is dropped, so a
/// test run leaves nothing behind (a compiled plan is hundreds of MB).
pub fn temp_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("gerbil-test-{tag}-"))
        .tempdir()
        .expect("create temp dir")
}

/// A file in a temporary directory of its own, deleted with the directory
/// when this value is dropped. Derefs to the file's path.
pub struct TempFile {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for TempFile {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TempFile {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

/// Compiles `repo` to a plan in a temp dir, letting `tweak` adjust the
/// options; the plan is deleted when the returned value is dropped.
pub fn compile_plan(repo: &Path, tweak: impl FnOnce(&mut CompileOptions)) -> TempFile {
    compile_plan_reporting(repo, tweak).0
}

/// [`compile_plan`], with what each pass did.
pub fn compile_plan_reporting(
    repo: &Path,
    tweak: impl FnOnce(&mut CompileOptions),
) -> (TempFile, PassReport) {
    let dir = temp_dir("plan");
    let out = dir.path().join("model.plan");
    // These tests check the plans against transformers themselves: the
    // self-test's reference (seconds of CPU time on a real model) is left
    // out unless `tweak` asks for it (the CLI's tests check it).
    let mut opts = CompileOptions {
        selftest: false,
        ..CompileOptions::default()
    };
    tweak(&mut opts);
    let ckpt = Checkpoint::open(repo).unwrap_or_else(|e| panic!("opening {}: {e}", repo.display()));
    let compiled = compile(&ckpt, &opts, &mut ())
        .unwrap_or_else(|e| panic!("compiling {}: {e}", repo.display()));
    compiled
        .plan
        .write(&out)
        .unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    let plan = TempFile {
        path: out,
        _dir: dir,
    };
    (plan, compiled.passes)
}

/// One case of a `tiny-ref-v1` reference.
#[derive(Debug, Deserialize)]
pub struct TinyCase {
    /// `len1` or `len13`.
    pub name: String,
    /// Prompt.
    pub input_ids: Vec<u32>,
    /// Logits of the last prompt position.
    pub last_logits: Vec<f32>,
    /// Logits of every prompt position (13-token case only).
    pub logits: Option<Vec<Vec<f32>>>,
    /// 8 greedy tokens.
    pub greedy_ids: Vec<u32>,
}

/// A `tiny-ref-v1` reference file.
#[derive(Debug, Deserialize)]
pub struct TinyRef {
    /// Model name.
    pub model: String,
    /// Architecture.
    pub architecture: String,
    /// The cases.
    pub cases: Vec<TinyCase>,
}

/// Loads `tests/data/refs/tiny/<name>.json`.
pub fn tiny_ref(name: &str) -> TinyRef {
    read_tiny_ref(&format!("refs/tiny/{name}.json"))
}

/// Parses the `tiny-ref-v1` file at `rel` under `tests/data`.
fn read_tiny_ref(rel: &str) -> TinyRef {
    let path = data_dir().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Loads `tests/data/refs/tiny-gguf/<name>.json`: transformers on the
/// quantized tiny GGUF `<name>.gguf` (scripts/device/gguf_refs.py).
pub fn tiny_gguf_ref(name: &str) -> TinyRef {
    read_tiny_ref(&format!("refs/tiny-gguf/{name}.json"))
}

/// The names of the references in `tests/data/refs/tiny-gguf/`, sorted.
pub fn tiny_gguf_refs() -> Vec<String> {
    let dir = data_dir().join("refs/tiny-gguf");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".json").map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

/// One prompt of a `real-ref-v1` reference.
#[derive(Debug, Deserialize)]
pub struct RealPrompt {
    /// Prompt id.
    pub id: String,
    /// `chat`, `raw` or `gemma_turns`.
    pub kind: String,
    /// Chat messages, for `chat` prompts.
    pub messages: Option<Vec<serde_json::Value>>,
    /// The exact string that was tokenized.
    pub text: String,
    /// Whether special tokens were added.
    pub add_special_tokens: bool,
    /// Prompt ids.
    pub input_ids: Vec<u32>,
    /// 32 greedy tokens.
    pub greedy_ids: Vec<u32>,
    /// Per step, the 10 largest `[id, logit]`.
    pub top10: Vec<Vec<(u32, f32)>>,
    /// Top-1 minus top-2 logit per step.
    pub greedy_margins: Vec<f32>,
}

/// A `real-ref-v1` reference file.
#[derive(Debug, Deserialize)]
pub struct RealRef {
    /// Model name.
    pub model: String,
    /// The prompts.
    pub prompts: Vec<RealPrompt>,
}

/// Loads `tests/data/refs/<name>.json`.
pub fn real_ref(name: &str) -> RealRef {
    let path = data_dir().join(format!("refs/{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Largest absolute difference of two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// proptest's configuration for a suite that runs `cases` cases at the default scale, shrinking at
/// most `max_shrink_iters` times. `PROPTEST_CASES` (proptest's own variable; 256 when unset)
/// scales every suite alike: `PROPTEST_CASES=2560` runs ten times the cases everywhere,
/// `PROPTEST_CASES=32` an eighth (at least one). Failures persist beside the test's source
/// (`tests/NAME.proptest-regressions`, committed so every later run replays them first), and
/// `PROPTEST_RNG_SEED` (set and printed by `scripts/run-tests.py`) makes a run reproducible.
pub fn proptest_config(cases: u32, max_shrink_iters: u32) -> proptest::test_runner::Config {
    use proptest::test_runner::{Config, FileFailurePersistence};
    let scale = Config::default().cases;
    Config {
        cases: (u64::from(cases) * u64::from(scale) / 256).clamp(1, u64::from(u32::MAX)) as u32,
        max_shrink_iters,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    }
}
