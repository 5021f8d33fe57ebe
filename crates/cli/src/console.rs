//! Where generated text goes: standard output as it streams, a timing line
//! on standard error after each generation.
//!
//! [`Stdout`] writes and flushes each piece and remembers when the reader
//! went away (`gerbil-run … | head -c 3`): the caller stops generating at
//! once and exits quietly, as `yes | head` does, instead of running to the
//! end and failing with "Broken pipe". Rust ignores SIGPIPE, so a closed
//! pipe shows up here as a write error; `print!` would panic on it.

use gerbil::{FinishReason, GenerationStats};
use serde::Serialize;
use std::io::{ErrorKind, Write};

/// Standard output for streamed text.
pub struct Stdout {
    out: std::io::StdoutLock<'static>,
    closed: bool,
}

impl Default for Stdout {
    fn default() -> Self {
        Stdout::new()
    }
}

impl Stdout {
    /// Locks standard output.
    pub fn new() -> Stdout {
        Stdout {
            out: std::io::stdout().lock(),
            closed: false,
        }
    }

    /// Writes and flushes `text`. Returns `Ok(false)` once the reader has
    /// closed the pipe (nothing more should be written), an error for any
    /// other failure.
    pub fn write(&mut self, text: &str) -> std::io::Result<bool> {
        if self.closed {
            return Ok(false);
        }
        match self
            .out
            .write_all(text.as_bytes())
            .and_then(|()| self.out.flush())
        {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the reader has closed the pipe.
    pub fn is_closed(&self) -> bool {
        self.closed
    }
}

/// Counts, speeds and the finish reason of one generation, for `--json`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Timings {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Of those, tokens the KV cache held already.
    pub cached_tokens: usize,
    /// Milliseconds to run the rest of the prompt.
    pub prompt_ms: f64,
    /// Prompt tokens run per second.
    pub prompt_tok_s: f64,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Milliseconds from the end of the prompt to the last token.
    pub generated_ms: f64,
    /// Generated tokens per second (the decode steps after the first token).
    pub generated_tok_s: f64,
}

impl Timings {
    /// The timings of `stats`.
    pub fn of(stats: &GenerationStats) -> Timings {
        Timings {
            prompt_tokens: stats.prompt_tokens,
            cached_tokens: stats.cached_tokens,
            prompt_ms: stats.prefill.as_secs_f64() * 1e3,
            prompt_tok_s: stats.prefill_tokens_per_second(),
            generated_tokens: stats.generated_tokens,
            generated_ms: stats.decode.as_secs_f64() * 1e3,
            generated_tok_s: stats.decode_tokens_per_second(),
        }
    }
}

/// The line printed to standard error after a generation, e.g.
/// `prompt 25 tokens (12 cached) 812.3 tok/s · generated 30 tokens 61.0 tok/s · finish stop`.
pub fn timing_line(stats: &GenerationStats, finish: Option<FinishReason>) -> String {
    let t = Timings::of(stats);
    let cached = if t.cached_tokens > 0 {
        format!(" ({} cached)", t.cached_tokens)
    } else {
        String::new()
    };
    format!(
        "prompt {} tokens{cached} {:.1} tok/s · generated {} tokens {:.1} tok/s · finish {}",
        t.prompt_tokens,
        t.prompt_tok_s,
        t.generated_tokens,
        t.generated_tok_s,
        finish.map_or("none", FinishReason::name)
    )
}

/// Writes `text` to standard output. A reader that went away gives an
/// error that [`exit`] turns into a quiet exit.
pub fn print(text: &str) -> std::io::Result<()> {
    print_bytes(text.as_bytes())
}

/// Writes `bytes` to standard output, as [`print()`] writes text.
pub fn print_bytes(bytes: &[u8]) -> std::io::Result<()> {
    let mut out = StdoutWriter::new();
    out.write_all(bytes)?;
    out.flush()
}

/// Ends a command-line tool with `main`'s result: status 0 on success and
/// when the error is only that standard output's reader went away
/// (`gerbilc compile … --dump-ir all | head`: the reader got what it wanted,
/// as with `yes | head`); otherwise the error and its causes on one line of
/// standard error, status 1.
pub fn exit(result: anyhow::Result<()>) -> ! {
    let code = match result {
        Ok(()) => 0,
        Err(e) if reader_gone(&e) => 0,
        Err(e) => {
            note(&format!("error: {}", crate::error_message(&e)));
            1
        }
    };
    std::process::exit(code)
}

/// Standard output (locked) for long outputs such as IR dumps: a write after
/// its reader went away fails with an error that carries [`ReaderGone`], so
/// [`exit`] can tell it from a broken pipe anywhere else (a socket, say),
/// which stays an error.
pub struct StdoutWriter(std::io::StdoutLock<'static>);

impl StdoutWriter {
    /// Locks standard output.
    pub fn new() -> StdoutWriter {
        StdoutWriter(std::io::stdout().lock())
    }
}

impl Default for StdoutWriter {
    fn default() -> Self {
        StdoutWriter::new()
    }
}

impl Write for StdoutWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf).map_err(mark_reader_gone)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush().map_err(mark_reader_gone)
    }
}

/// The cause of a write error once standard output's reader went away.
#[derive(Debug, thiserror::Error)]
#[error("the reader of standard output went away")]
pub struct ReaderGone;

fn mark_reader_gone(e: std::io::Error) -> std::io::Error {
    if e.kind() == ErrorKind::BrokenPipe {
        std::io::Error::new(ErrorKind::BrokenPipe, ReaderGone)
    } else {
        e
    }
}

/// Whether `e` or one of its causes is a write to standard output after its
/// reader went away.
fn reader_gone(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<ReaderGone>()
            || c.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .is_some_and(|inner| inner.is::<ReaderGone>())
    })
}

/// Writes a line to standard error, ignoring failure (a closed stderr must
/// not end the program: `eprintln!` would panic).
pub fn note(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}
