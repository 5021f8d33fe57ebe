//! `gerbil-run PLAN chat`: an interactive conversation on standard input.
//!
//! Each line is a user message; the answer streams to standard output and a
//! timing line follows on standard error. Lines starting with `/` are
//! commands: `/reset` forgets the conversation, `/system TEXT` sets the
//! system message (`/system` alone removes it), `/stats` shows the context
//! in use and the last turn's numbers, `/exit` (or end of input) ends. It
//! reads lines, not a terminal, so `printf 'Hi\nAnd you?\n' | gerbil-run m.plan
//! chat` holds a two-turn conversation; the `> ` prompt appears only when
//! standard input is a terminal.
//!
//! The conversation lives in a [`gerbil::Chat`]: each turn runs
//! only its own tokens, the earlier turns stay in the KV cache.

use crate::console::{note, timing_line, Stdout};
use crate::gen_args::SamplingArgs;
use anyhow::{bail, Result};
use gerbil::{Chat, FinishReason, GenerationStats, Model, ModelOptions};
use gerbil_plan::PlanFile;
use std::io::{BufRead, IsTerminal, Write};

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
    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal();
    if interactive {
        note(HELP);
    }
    let mut out = Stdout::new();
    let mut last: Option<(GenerationStats, Option<FinishReason>)> = None;
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            let _ = write!(std::io::stderr(), "> ");
            let _ = std::io::stderr().flush();
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
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
        let mut reply = chat.send(line, &settings)?;
        while let Some(piece) = reply.next().await {
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
