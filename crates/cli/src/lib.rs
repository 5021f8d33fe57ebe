//! The `gerbilc`, `gerbil-run` and `gerbil-train` command-line tools.
//!
//! The compiler itself is the `gerbil-compiler` crate and the runtime is
//! `gerbil-runtime`; this crate holds argument handling and output only:
//! [`run`] drives generation, JSON output and benchmarks ([`gen_args`]
//! turns the generation flags into settings, [`console`] streams to the
//! terminal), [`chat`] holds a conversation, [`perplexity`] scores a text (and
//! compares two plans on it), [`sweep`] times
//! generation across context lengths and [`plot`] charts a sweep; [`inspect`]
//! summarizes a plan, [`schedule`] lists its dispatches and [`graph_svg`]
//! draws one layer of them (through [`svg_canvas`]); [`train`] fine-tunes
//! a model (`gerbil-train`); [`passes`]
//! prints what the pass pipeline did; [`mod@env`] maps gerbil's environment
//! variables onto the libraries' typed options and [`hub_env`] reads the Hugging Face
//! environment variables for the hub client; [`devices`] lists the GPUs;
//! [`progress`] draws progress bars, [`logging`] sets up `-v` logs and
//! [`numbers`] parses numeric flags. The binaries in `src/bin` parse
//! arguments and call these.
//!
//! Libraries do the work: `gerbil-compiler` compiles (and checks a
//! checkpoint's text assets), `gerbil-hub` fetches hub models,
//! `gerbil-tune` measures GEMM tiles, `gerbil-train` trains, `gerbil` (the facade over
//! `gerbil-runtime` and `gerbil-text`) generates, and `gerbil-serve` is the
//! HTTP server. No other crate depends on this one (`tests/e2e/architecture.rs`
//! checks it).

pub mod chat;
pub mod console;
pub mod devices;
pub mod embed;
pub mod env;
pub mod gen_args;
pub mod graph_svg;
pub mod hub_env;
pub mod inspect;
pub mod logging;
pub mod numbers;
pub mod passes;
pub mod perplexity;
pub mod plan_cache;
pub mod plot;
pub mod progress;
pub mod run;
pub mod schedule;
pub mod selftest;
pub mod svg_canvas;
pub mod sweep;
pub mod train;

/// An error and its causes on one line, leaving out causes whose text an
/// earlier message already includes (library errors often embed their source).
pub fn error_message(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if msg.contains(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg
}
