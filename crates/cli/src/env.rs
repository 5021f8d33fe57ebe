//! The environment variables `gerbil-run` and `gerbilc` read, and the typed
//! options they become: the libraries read none (`tests/e2e/architecture.rs`
//! checks), so an embedder or a server chooses per model.
//!
//! | variable | option |
//! |---|---|
//! | `GERBIL_TENSOR_CORES=0` | `SessionOptions::tensor_cores` off (on by default) |
//! | `GERBIL_SHADER_CHECKS=1` | `SessionOptions::shader_checks` |
//! | `GERBIL_PIPELINE_THREADS=N` | `SessionOptions::pipeline_threads` |
//! | `GERBIL_PIPELINE_CACHE=0`, `GERBIL_CACHE_DIR` | `SessionOptions::pipeline_cache` ([`pipeline_cache_dir`]); `GERBIL_CACHE_DIR` also holds the plans `gerbil-run ORG/NAME` compiles ([`cache_root`]) |
//! | `GERBIL_API_KEY` | `serve`'s API key when neither `--api-key` nor `--api-key-file` gives one ([`api_key`]) |
//! | `GERBIL_TEMPLATE_CHILD` | with the one argument `--gerbil-template-child`, a template-rendering child ([`serve_template_child`], [`template_sandbox`]); alone, nothing |
//!
//! The surprise: a variable set to the empty string counts as unset, and a
//! switch counts as on for any value but `0` (and `off`/`false` for the
//! cache).

use gerbil_runtime::pipeline::ShaderChecks;
use gerbil_runtime::SessionOptions;
use std::ffi::OsString;
use std::path::PathBuf;

/// The variable, unless unset or empty.
pub(crate) fn var(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|v| !v.is_empty())
}

/// Whether a switch variable is on: set to anything but `0`.
fn switch(name: &str) -> bool {
    var(name).is_some_and(|v| v != "0")
}

/// Session options with what the environment sets (tensor cores, shader
/// checks, pipeline threads) and the library's defaults for the rest.
pub fn session_defaults() -> SessionOptions {
    SessionOptions {
        tensor_cores: tensor_cores(),
        shader_checks: shader_checks(),
        pipeline_threads: pipeline_threads(),
        ..SessionOptions::default()
    }
}

/// `GERBIL_TENSOR_CORES`: request tensor cores where the adapter has them
/// unless it is `0` (unset or empty: yes).
pub fn tensor_cores() -> bool {
    tensor_cores_with(false, false)
}

/// Whether to request tensor cores given `gerbil-run`'s flags: `--tensor-cores`
/// (`on`) yes, `--no-tensor-cores` (`off`) no, neither: `GERBIL_TENSOR_CORES`
/// ([`tensor_cores`]).
pub fn tensor_cores_with(on: bool, off: bool) -> bool {
    tensor_cores_from(on, off, var("GERBIL_TENSOR_CORES").as_deref())
}

/// [`tensor_cores_with`] given the variable's value (`None`: unset or empty).
fn tensor_cores_from(on: bool, off: bool, value: Option<&std::ffi::OsStr>) -> bool {
    on || (!off && value.is_none_or(|v| v != "0"))
}

/// `GERBIL_SHADER_CHECKS`: keep wgpu's shader runtime checks.
pub fn shader_checks() -> ShaderChecks {
    match switch("GERBIL_SHADER_CHECKS") {
        true => ShaderChecks::Checked,
        false => ShaderChecks::Unchecked,
    }
}

/// `GERBIL_PIPELINE_THREADS`: threads creating pipelines (to compare serial
/// and parallel creation); `None` when unset or not a number.
pub fn pipeline_threads() -> Option<usize> {
    var("GERBIL_PIPELINE_THREADS")?.to_str()?.parse().ok()
}

/// The pipeline cache directory: `$GERBIL_CACHE_DIR/pipelines`, else the
/// platform's user cache directory plus `gerbil/pipelines`
/// (`$XDG_CACHE_HOME`, else `~/.cache` on Linux and other Unixes;
/// `~/Library/Caches` on macOS; `%LOCALAPPDATA%` on Windows). `None` when
/// `GERBIL_PIPELINE_CACHE` is `0`, `off` or `false`, or when no such
/// variable is set.
pub fn pipeline_cache_dir() -> Option<PathBuf> {
    if let Some(v) = var("GERBIL_PIPELINE_CACHE") {
        if matches!(v.to_str(), Some("0" | "off" | "false")) {
            return None;
        }
    }
    cache_root().map(|root| root.join("pipelines"))
}

/// gerbil's cache directory: `$GERBIL_CACHE_DIR`, else the platform's user
/// cache directory plus `gerbil` (see [`pipeline_cache_dir`]); it holds
/// `pipelines/` and `plans/` (`gerbil-run ORG/NAME`). `None` when no such
/// variable is set.
pub fn cache_root() -> Option<PathBuf> {
    if let Some(root) = var("GERBIL_CACHE_DIR") {
        return Some(PathBuf::from(root));
    }
    let user_cache = if cfg!(windows) {
        var("LOCALAPPDATA").map(PathBuf::from)
    } else if cfg!(target_os = "macos") {
        var("HOME").map(|h| PathBuf::from(h).join("Library/Caches"))
    } else {
        var("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
    };
    user_cache.map(|d| d.join("gerbil"))
}

/// Chat templates render in children of this program
/// ([`TemplateSandbox`](gerbil_text::TemplateSandbox)); `None` off Unix or
/// when the program's path is unknown.
pub fn template_sandbox() -> Option<gerbil_text::TemplateSandbox> {
    gerbil_text::TemplateSandbox::new(std::env::current_exe().ok()?)
}

/// `GERBIL_API_KEY`, when set and not empty.
pub fn api_key() -> Option<String> {
    std::env::var("GERBIL_API_KEY")
        .ok()
        .filter(|k| !k.trim().is_empty())
}

/// Call first in `main`: when this process was started to render a chat
/// template (its one argument `--gerbil-template-child`, and
/// `GERBIL_TEMPLATE_CHILD` holding its limits), renders it and exits;
/// otherwise returns. The variable alone changes nothing.
pub fn serve_template_child() {
    let mut args = std::env::args_os().skip(1);
    let as_child =
        args.next().is_some_and(|a| a == gerbil_text::CHILD_ARG) && args.next().is_none();
    if !as_child {
        return;
    }
    if let Some(limits) = std::env::var_os(gerbil_text::CHILD_ENV) {
        gerbil_text::serve_child(&limits);
    }
}

#[cfg(test)]
mod tests {
    use super::tensor_cores_from;
    use std::ffi::OsStr;

    #[test]
    fn tensor_cores_are_on_unless_a_flag_or_the_variable_says_no() {
        let zero = Some(OsStr::new("0"));
        let one = Some(OsStr::new("1"));
        // (--tensor-cores, --no-tensor-cores, GERBIL_TENSOR_CORES) -> on?
        let cases = [
            (false, false, None, true),
            (false, false, one, true),
            (false, false, zero, false),
            (false, true, None, false),
            (false, true, one, false),
            (true, false, zero, true),
            (true, false, None, true),
        ];
        for (on, off, value, want) in cases {
            assert_eq!(
                tensor_cores_from(on, off, value),
                want,
                "--tensor-cores {on}, --no-tensor-cores {off}, GERBIL_TENSOR_CORES {value:?}"
            );
        }
    }
}
