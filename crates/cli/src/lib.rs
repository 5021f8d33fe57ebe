//! The `gerbilc` and `gerbil-run` command-line tools.
//!
//! The compiler itself is the `gerbil-compiler` crate and the runtime is
//! `gerbil-runtime`; this crate holds argument handling and output only:
//! [`run`] drives generation, JSON output and benchmarks; [`inspect`]
//! summarizes a plan and [`schedule`] lists its dispatches; [`passes`]
//! prints what the pass pipeline did; [`tune`] measures prefill GEMM tiles. The binaries in `src/bin` parse
//! arguments and call these. No other crate depends on this one.

pub mod inspect;
pub mod passes;
pub mod run;
pub mod schedule;
pub mod tune;

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
