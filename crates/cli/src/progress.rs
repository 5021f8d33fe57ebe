//! Progress bars on standard error, for the slow parts: writing a plan,
//! uploading weights to the GPU, prefilling a long prompt.
//!
//! Make one [`Progress`] per command from its `--quiet` flag and create
//! bars from it ([`Progress::bytes`], [`Progress::tokens`]); hand
//! [`Progress::runtime_hook`] to the runtime (`SessionOptions::progress`,
//! `Session::set_progress`) to get bars for the load and long prompts:
//!
//! ```
//! let progress = gerbil_cli::progress::Progress::new(true); // --quiet
//! let bar = progress.bytes("writing plan", 1 << 20);
//! bar.set_position(1 << 19);
//! bar.finish_and_clear();
//! assert!(progress.runtime_hook().is_none()); // quiet: no hook, no waits
//! ```
//!
//! Bars are drawn only when standard error is a terminal and `--quiet` was
//! not given; otherwise they are hidden and cost nothing. The surprise: log
//! lines would tear a bar in half, so every bar lives in one process-wide
//! `MultiProgress` and [`crate::logging`] writes each log line through
//! [`suspend`], which lifts the bars, prints, and redraws them.

use gerbil_runtime::progress::{Progress as Event, ProgressHook};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::{Mutex, OnceLock};

/// The bars of the process (drawn to standard error).
fn bars() -> &'static MultiProgress {
    static BARS: OnceLock<MultiProgress> = OnceLock::new();
    BARS.get_or_init(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
}

/// Runs `f` (which writes to standard error) with the bars lifted off the
/// screen, then redraws them.
pub fn suspend<R>(f: impl FnOnce() -> R) -> R {
    bars().suspend(f)
}

/// Whether bars may be drawn: standard error is a terminal, `quiet` is off.
pub fn bars_wanted(quiet: bool) -> bool {
    !quiet && std::io::stderr().is_terminal()
}

/// Where a command's bars come from: drawn, or hidden when quiet.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    shown: bool,
}

impl Progress {
    /// Bars for a command run with `--quiet` set to `quiet`: shown when
    /// [`bars_wanted`].
    pub fn new(quiet: bool) -> Progress {
        Progress {
            shown: bars_wanted(quiet),
        }
    }

    /// Whether bars are drawn.
    pub fn shown(&self) -> bool {
        self.shown
    }

    /// A bar of `total` bytes, labelled `message`.
    pub fn bytes(&self, message: &str, total: u64) -> ProgressBar {
        self.bar(
            message,
            total,
            "{msg} [{wide_bar}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        )
    }

    /// A bar of `total` prompt tokens, labelled `message`.
    pub fn tokens(&self, message: &str, total: u64) -> ProgressBar {
        self.bar(
            message,
            total,
            "{msg} [{wide_bar}] {pos}/{len} tokens ({per_sec}, {eta})",
        )
    }

    /// A bar of `total` things called `unit` (`inputs`), labelled
    /// `message`; a counter with a rate when the total is not known.
    pub fn items(&self, message: &str, total: Option<u64>, unit: &str) -> ProgressBar {
        match total {
            Some(total) => self.bar(
                message,
                total,
                &format!("{{msg}} [{{wide_bar}}] {{pos}}/{{len}} {unit} ({{per_sec}}, {{eta}})"),
            ),
            None => self.bar(message, 0, &format!("{{msg}} {{pos}} {unit} ({{per_sec}})")),
        }
    }

    fn bar(&self, message: &str, total: u64, template: &str) -> ProgressBar {
        if !self.shown {
            return ProgressBar::hidden();
        }
        let style = ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        let bar = bars().add(ProgressBar::new(total).with_style(style));
        bar.set_message(message.to_string());
        bar
    }

    /// A runtime hook drawing a bar for the weight upload and one for each
    /// prompt of several chunks (each cleared when it completes); `None`
    /// when bars are hidden, so the runtime does not wait for the GPU to
    /// report progress nobody sees.
    pub fn runtime_hook(&self) -> Option<ProgressHook> {
        if !self.shown {
            return None;
        }
        let progress = *self;
        let current: Mutex<Option<ProgressBar>> = Mutex::new(None);
        Some(ProgressHook::new(move |event| {
            let (done, total) = match event {
                Event::Weights { done, total } | Event::Prefill { done, total } => (done, total),
            };
            let mut current = current.lock().unwrap_or_else(|e| e.into_inner());
            let bar = current.get_or_insert_with(|| match event {
                Event::Weights { .. } => progress.bytes("uploading weights", total),
                Event::Prefill { .. } => progress.tokens("prompt", total),
            });
            bar.set_position(done);
            if done >= total {
                bar.finish_and_clear();
                *current = None;
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_gives_hidden_bars_and_no_runtime_hook() {
        let p = Progress::new(true);
        assert!(!p.shown());
        assert!(p.bytes("x", 10).is_hidden());
        assert!(p.tokens("x", 10).is_hidden());
        assert!(p.items("x", None, "inputs").is_hidden());
        assert!(p.runtime_hook().is_none());
    }
}
