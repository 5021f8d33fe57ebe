//! The `gerbilc` and `gerbil-run` command-line tools.
//!
//! [`compile`] is the compiler driver (frontend → passes → codegen → plan
//! file); [`run`] executes plans (generation, JSON output, benchmarks);
//! [`inspect`] summarizes a plan. The binaries in `src/bin` only parse
//! arguments and call these.

pub mod compile;
pub mod inspect;
pub mod run;

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
