//! `gerbil-run PLAN chat`: an interactive conversation on standard input.
//!
//! Each line is a user message; the answer streams to standard output and a
//! timing line follows on standard error. Lines starting with `/` are
//! commands: `/reset` forgets the conversation, `/system TEXT` sets the
//! system message (`/system` alone removes it), `/stats` shows the context
//! in use and the last turn's numbers, `/exit` (or end of input) ends. On a
//! terminal the line is edited with `rustyline` (arrows, history of the
//! session's lines, Ctrl-D ends) and Ctrl-C stops the answer being written,
//! not the session; elsewhere it reads lines, so `printf 'Hi\nAnd you?\n' |
//! gerbil-run m.plan chat` holds a two-turn conversation and Ctrl-C ends it
//! as any program.
//!
//! The conversation lives in a [`gerbil::Chat`]: each turn runs
//! only its own tokens, the earlier turns stay in the KV cache. A turn the
//! context cannot hold, a line longer than [`MAX_LINE_BYTES`] or one the
//! chat template refuses is set aside with a note, and the conversation goes
//! on as it was; bytes that are not UTF-8 are read as U+FFFD. Only a GPU or
//! input failure ends the session. The surprise: Ctrl-C is a key while
//! the editor reads a line (the terminal is raw then) and a signal while an
//! answer streams, so the signal handler only ever stops answers.

use crate::console::{note, timing_line, Stdout};
use crate::gen_args::SamplingArgs;
use anyhow::{bail, Result};
use gerbil::{Chat, Error, FinishReason, GenerationStats, Model, ModelOptions, RuntimeError};
use gerbil_plan::PlanFile;
use rustyline::error::ReadlineError;
use std::io::{BufRead, IsTerminal};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The longest line `chat` takes as a message, in bytes; a longer one is
/// skipped whole (the bytes past this are read and dropped, never kept).
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// One line of input.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// The line without its newline, invalid UTF-8 replaced by U+FFFD.
    Text(String),
    /// A line longer than [`MAX_LINE_BYTES`], dropped.
    TooLong,
    /// The end of the input.
    End,
}

/// Reads one line of at most [`MAX_LINE_BYTES`] from `input`.
fn read_line(input: &mut impl BufRead) -> std::io::Result<Line> {
    let mut bytes = Vec::new();
    let mut too_long = false;
    loop {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            return Ok(match (too_long, bytes.is_empty()) {
                (true, _) => Line::TooLong,
                (false, true) => Line::End,
                (false, false) => Line::Text(String::from_utf8_lossy(&bytes).into_owned()),
            });
        }
        let newline = buf.iter().position(|&b| b == b'\n');
        let part = &buf[..newline.unwrap_or(buf.len())];
        if !too_long && bytes.len() + part.len() <= MAX_LINE_BYTES {
            bytes.extend_from_slice(part);
        } else {
            too_long = true;
            bytes = Vec::new();
        }
        let used = newline.map_or(buf.len(), |i| i + 1);
        input.consume(used);
        if newline.is_some() {
            return Ok(if too_long {
                Line::TooLong
            } else {
                Line::Text(String::from_utf8_lossy(&bytes).into_owned())
            });
        }
    }
}

/// Where the lines come from: a line editor on a terminal, else bounded
/// reads of standard input.
enum Input {
    Editor(Box<rustyline::DefaultEditor>),
    Lines(std::io::StdinLock<'static>),
}

impl Input {
    fn read(&mut self) -> Result<Line> {
        match self {
            Input::Lines(stdin) => Ok(read_line(stdin)?),
            Input::Editor(editor) => loop {
                match editor.readline("> ") {
                    Ok(line) if line.len() > MAX_LINE_BYTES => return Ok(Line::TooLong),
                    Ok(line) => {
                        if !line.trim().is_empty() {
                            // Only a line the editor itself refuses fails here.
                            let _ = editor.add_history_entry(line.as_str());
                        }
                        return Ok(Line::Text(line));
                    }
                    Err(ReadlineError::Interrupted) => {
                        note("(Ctrl-C stops an answer; /exit or Ctrl-D ends the chat)");
                    }
                    Err(ReadlineError::Eof) => return Ok(Line::End),
                    Err(e) => return Err(e.into()),
                }
            },
        }
    }
}

/// Whether `e` refuses only this turn (too long for the context, or refused
/// by the chat template), so the conversation can go on.
fn refuses_the_turn(e: &Error) -> bool {
    matches!(
        e,
        Error::Runtime(RuntimeError::ContextOverflow { .. }) | Error::Text(_)
    )
}

/// Settings of `gerbil-run PLAN chat`.
#[derive(Clone, Debug)]
pub struct ChatOptions {
    /// The system message to start with.
    pub system: Option<String>,
    /// Token choice and limits, before the model's defaults fill them in.
    pub sampling: SamplingArgs,
    /// How the plan is loaded.
    pub model: ModelOptions,
    /// No timing line after each answer.
    pub quiet: bool,
}

const HELP: &str =
    "commands: /reset (forget the conversation), /system TEXT (set the system message; \
     /system alone removes it), /stats, /exit";

/// Runs the conversation until `/exit` or the end of standard input.
pub async fn chat(plan_path: &std::path::Path, opts: &ChatOptions) -> Result<()> {
    let plan = PlanFile::open(plan_path)?;
    if plan.header.text.tokenizer.is_none() {
        bail!("this plan has no tokenizer, so it cannot chat; recompile a checkpoint with tokenizer.json");
    }
    if plan.header.text.chat_template.is_none() {
        bail!(
            "this model has no chat template (a base model?); use `gerbil-run PLAN --prompt TEXT` instead"
        );
    }
    let resolved = opts.sampling.resolve(&plan.header.text.generation)?;
    if let Some(seed) = resolved.seed {
        tracing::info!(seed, "sampling");
    }
    let settings = resolved.settings;
    let model = Model::load(&plan, &opts.model).await?;
    drop(plan);
    let mut chat = Chat::new(model);
    chat.set_system(opts.system.clone());
    let interactive = std::io::stdin().is_terminal();
    // Set by Ctrl-C while an answer streams (a terminal only).
    let stop = Arc::new(AtomicBool::new(false));
    let mut input = if interactive {
        note(HELP);
        let editor = rustyline::DefaultEditor::new()?;
        // After the editor, which installs a SIGINT handler of its own for
        // its lifetime: ours runs first and then calls the editor's.
        signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
        Input::Editor(Box::new(editor))
    } else {
        Input::Lines(std::io::stdin().lock())
    };
    let mut out = Stdout::new();
    let mut last: Option<(GenerationStats, Option<FinishReason>)> = None;
    loop {
        let line = match input.read()? {
            Line::End => break,
            Line::TooLong => {
                note(&format!(
                    "(that line is longer than {MAX_LINE_BYTES} bytes and was skipped; the \
                     conversation goes on)"
                ));
                continue;
            }
            Line::Text(line) => line,
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(command) = line.strip_prefix('/') {
            let (name, arg) = command.split_once(' ').unwrap_or((command, ""));
            match name {
                "exit" | "quit" => break,
                "reset" => {
                    chat.reset();
                    note("(conversation forgotten)");
                }
                "system" => {
                    let text = arg.trim();
                    chat.set_system((!text.is_empty()).then(|| text.to_string()));
                    note(if text.is_empty() {
                        "(system message removed)"
                    } else {
                        "(system message set)"
                    });
                }
                "stats" => note(&stats_text(&chat, last.as_ref())),
                _ => note(&format!("unknown command /{name}; {HELP}")),
            }
            continue;
        }
        let mut reply = match chat.send(line, &settings) {
            Ok(reply) => reply,
            Err(e) if refuses_the_turn(&e) => {
                note(&format!(
                    "(this turn was not sent: {e}; the conversation goes on without it, and \
                     /reset starts a new one with the whole context)"
                ));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        stop.store(false, Ordering::Relaxed);
        let mut stopped = false;
        while let Some(piece) = reply.next().await {
            if stop.swap(false, Ordering::Relaxed) && !stopped {
                reply.cancel();
                stopped = true;
            }
            if !out.write(&piece?.text)? {
                return Ok(());
            }
        }
        let stats = reply.stats();
        let finish = reply.finish_reason();
        drop(reply);
        if !out.write("\n")? {
            return Ok(());
        }
        if stopped {
            note("(answer stopped; the conversation keeps what was written)");
        }
        if !opts.quiet {
            note(&timing_line(&stats, finish));
        }
        last = Some((stats, finish));
    }
    Ok(())
}

/// What `/stats` prints.
fn stats_text(chat: &Chat, last: Option<&(GenerationStats, Option<FinishReason>)>) -> String {
    let model = chat.model();
    let mut text = format!(
        "{} messages; {} of {} context tokens in the KV cache",
        chat.messages().len(),
        model.cached_tokens().len(),
        model.context()
    );
    if let Some((stats, finish)) = last {
        text.push_str(&format!("\nlast turn: {}", timing_line(stats, *finish)));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8]) -> Vec<Line> {
        let mut reader = std::io::BufReader::with_capacity(7, input);
        let mut out = Vec::new();
        loop {
            match read_line(&mut reader).unwrap() {
                Line::End => return out,
                line => out.push(line),
            }
        }
    }

    #[test]
    fn lines_are_bounded_and_read_lossily() {
        let long = vec![b'a'; MAX_LINE_BYTES + 1];
        let mut input = b"hi\n\xff\xfeok\n".to_vec();
        input.extend(&long);
        input.extend(b"\nafter\nlast");
        let text = |s: &str| Line::Text(s.to_string());
        assert_eq!(
            lines(&input),
            [
                text("hi"),
                text("\u{fffd}\u{fffd}ok"),
                Line::TooLong,
                text("after"),
                text("last")
            ]
        );
        let exactly = vec![b'b'; MAX_LINE_BYTES];
        assert_eq!(lines(&exactly), [Line::Text("b".repeat(MAX_LINE_BYTES))]);
        assert_eq!(lines(b""), []);
    }
}
