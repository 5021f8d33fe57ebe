//! Chat templates rendered in a child process, under operating-system limits on its memory and
//! CPU time.
//!
//! The in-process renderer bounds a template's steps (fuel), nesting and output, but not the
//! strings it builds on the way: `{% set ns.s = ns.s ~ ns.s %}` in a 40-step loop asks for a
//! terabyte before it writes a byte, and minijinja has no hook on concatenation (Jinja's own
//! maintainers answer the same question with "set resource limits in the OS"). So a
//! [`TemplateSandbox`] renders in a child of this program instead: it starts the program again
//! with [`CHILD_ARG`] as its argument and [`CHILD_ENV`] set, and the program's `main` hands that
//! variable's value to [`serve_child`] before anything else. The child caps its address space and CPU time with `setrlimit`, reads one request
//! (template, messages, special tokens) as JSON on stdin, renders it with the in-process
//! renderer and writes the outcome as JSON on stdout. A child that runs out of memory aborts,
//! one that runs out of CPU time is killed, and either way the parent reports
//! [`TextError::TemplateLimit`] instead of the machine swapping or the process dying.
//!
//! Usage: `gerbilc` and `gerbil-run` check [`CHILD_ARG`] and [`CHILD_ENV`] first in `main` (and call
//! [`serve_child`] when it is set), and hand [`TemplateSandbox::new`] with their own executable
//! to the codecs they build. The library reads no environment variable itself. The surprise: it costs one
//! process start per render (a few milliseconds, against hundreds for the prompt's prefill),
//! and it exists on Unix only; elsewhere templates render in-process, under the in-process
//! limits.

use std::borrow::Cow;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use super::template::ChatTemplate;
use super::{ChatMessage, TextError};

/// The environment variable that, with [`CHILD_ARG`] as the only argument, makes a program
/// started by [`TemplateSandbox`] a renderer: its value is the child's limits,
/// `MEMORY_BYTES,CPU_SECONDS`.
pub const CHILD_ENV: &str = "GERBIL_TEMPLATE_CHILD";

/// The one argument a renderer is started with: the variable alone, exported by accident,
/// does not turn a program into a renderer.
pub const CHILD_ARG: &str = "--gerbil-template-child";

/// Address space a render may use beyond eight times its request: the program's own mappings
/// and the largest output the renderer writes (64 MiB) with room to spare.
pub const BASE_MEMORY_BYTES: u64 = 1 << 30;

/// CPU time a render may take; fuel ends real templates in well under a second.
pub const CPU_SECONDS: u64 = 10;

/// Where templates render: the program to start as the child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateSandbox {
    program: PathBuf,
}

impl TemplateSandbox {
    /// Renders in children started from `program`: the running program's own executable,
    /// which must call [`serve_child`] first in `main` when [`CHILD_ENV`] is set (never use it
    /// from a test harness or a program that does not: the child would run that program
    /// again). On Linux `/proc/self/exe` is used instead when it exists: the running binary
    /// even when its file was replaced (an upgrade under a running server). `None` off Unix.
    pub fn new(program: PathBuf) -> Option<Self> {
        if !cfg!(unix) {
            return None;
        }
        let own = std::path::Path::new("/proc/self/exe");
        let program = match cfg!(target_os = "linux") && own.exists() {
            true => own.to_path_buf(),
            false => program,
        };
        Some(Self { program })
    }

    /// Renders `template` for `request` in a child process.
    pub(super) fn render(&self, request: &RenderRequest<'_>) -> Result<String, TextError> {
        let input = serde_json::to_vec(request).map_err(|e| sandbox_error(e.to_string()))?;
        let memory = BASE_MEMORY_BYTES.saturating_add((input.len() as u64).saturating_mul(8));
        let mut child = Command::new(&self.program)
            .arg(CHILD_ARG)
            .env(CHILD_ENV, format!("{memory},{CPU_SECONDS}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                sandbox_error(format!("could not start {}: {e}", self.program.display()))
            })?;
        // The child reads all of stdin before it writes, so no thread is needed; a child
        // that dies early closes the pipe, and its exit status says why.
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(&input);
        }
        let output = child
            .wait_with_output()
            .map_err(|e| sandbox_error(e.to_string()))?;
        if !output.status.success() {
            return Err(died(&output, memory));
        }
        let outcome: Outcome = serde_json::from_slice(&output.stdout).map_err(|e| {
            sandbox_error(format!("the renderer's answer is not what it writes: {e}"))
        })?;
        outcome.into_result()
    }
}

/// What a child renders.
#[derive(Serialize, Deserialize)]
pub(super) struct RenderRequest<'a> {
    pub template: Cow<'a, str>,
    pub messages: Cow<'a, [ChatMessage]>,
    pub tools: Option<Cow<'a, serde_json::Value>>,
    pub add_generation_prompt: bool,
    pub bos_token: Option<Cow<'a, str>>,
    pub eos_token: Option<Cow<'a, str>>,
}

/// A render's result as the child writes it: the prompt, or the kind of error and its text.
#[derive(Serialize, Deserialize)]
enum Outcome {
    Prompt(String),
    Raised(String),
    Limit(String),
    Failed(String),
}

impl Outcome {
    fn of(result: Result<String, TextError>) -> Self {
        match result {
            Ok(prompt) => Outcome::Prompt(prompt),
            Err(TextError::TemplateRaised { message }) => Outcome::Raised(message),
            Err(TextError::TemplateLimit { reason }) => Outcome::Limit(reason),
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }

    fn into_result(self) -> Result<String, TextError> {
        match self {
            Outcome::Prompt(prompt) => Ok(prompt),
            Outcome::Raised(message) => Err(TextError::TemplateRaised { message }),
            Outcome::Limit(reason) => Err(TextError::TemplateLimit { reason }),
            Outcome::Failed(detail) => Err(TextError::TemplateSandbox { detail }),
        }
    }
}

fn sandbox_error(detail: String) -> TextError {
    TextError::TemplateSandbox {
        detail: format!("the template renderer failed: {detail}"),
    }
}

/// Why a child ended without an answer: a limit (it was killed for CPU time, or aborted on
/// a failed allocation), or a crash reported as it is.
fn died(output: &std::process::Output, memory: u64) -> TextError {
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("memory allocation of") {
        return TextError::TemplateLimit {
            reason: format!(
                "needed more than {} MiB of memory: it builds strings too large",
                memory >> 20
            ),
        };
    }
    #[cfg(unix)]
    {
        use rustix::process::Signal;
        use std::os::unix::process::ExitStatusExt;
        let killed = [Signal::XCPU.as_raw(), Signal::KILL.as_raw()];
        if output.status.signal().is_some_and(|s| killed.contains(&s)) {
            return TextError::TemplateLimit {
                reason: format!("ran for more than {CPU_SECONDS} s of CPU time: it loops too long"),
            };
        }
    }
    sandbox_error(format!(
        "it ended with {}: {}",
        output.status,
        stderr.trim()
    ))
}

/// In a program started by [`TemplateSandbox`] (its only argument [`CHILD_ARG`]), with
/// `limits` the value of its [`CHILD_ENV`]: applies the limits, renders the request on stdin,
/// writes the outcome on stdout and exits. On Linux it also asks to be killed when its parent
/// dies, so a render outlives no server. Call it first in `main`, before any thread or
/// allocation of size.
pub fn serve_child(limits: &std::ffi::OsStr) -> ! {
    let code = match child(&limits.to_string_lossy()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("gerbil template renderer: {e}");
            2
        }
    };
    std::process::exit(code);
}

fn child(limits: &str) -> Result<(), String> {
    let (memory, seconds) = limits
        .split_once(',')
        .and_then(|(m, s)| Some((m.parse::<u64>().ok()?, s.parse::<u64>().ok()?)))
        .ok_or_else(|| format!("{CHILD_ENV}={limits} is not MEMORY_BYTES,CPU_SECONDS"))?;
    limit(memory, seconds)?;
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .map_err(|e| e.to_string())?;
    let request: RenderRequest<'_> =
        serde_json::from_slice(&input).map_err(|e| format!("bad request: {e}"))?;
    let outcome = Outcome::of(
        ChatTemplate::new(request.template.into_owned()).and_then(|t| {
            t.render(
                &request.messages,
                request.tools.as_deref(),
                request.add_generation_prompt,
                request.bos_token.as_deref(),
                request.eos_token.as_deref(),
            )
        }),
    );
    let answer = serde_json::to_vec(&outcome).map_err(|e| e.to_string())?;
    std::io::stdout()
        .write_all(&answer)
        .map_err(|e| e.to_string())
}

/// Caps this process's address space at `memory` bytes and its CPU time at `seconds` (then
/// `SIGXCPU`, and `SIGKILL` a second later); on Linux, `SIGKILL` when its parent dies.
#[cfg(unix)]
fn limit(memory: u64, seconds: u64) -> Result<(), String> {
    use rustix::process::{setrlimit, Resource, Rlimit};
    #[cfg(target_os = "linux")]
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(|e| format!("prctl(PR_SET_PDEATHSIG): {e}"))?;
    let cap = |n: u64| Rlimit {
        current: Some(n),
        maximum: Some(n),
    };
    setrlimit(Resource::As, cap(memory)).map_err(|e| format!("setrlimit(AS): {e}"))?;
    let cpu = Rlimit {
        current: Some(seconds),
        maximum: Some(seconds + 1),
    };
    setrlimit(Resource::Cpu, cpu).map_err(|e| format!("setrlimit(CPU): {e}"))
}

#[cfg(not(unix))]
fn limit(_memory: u64, _seconds: u64) -> Result<(), String> {
    Ok(())
}
