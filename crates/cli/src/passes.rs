//! What the pass pipeline did, as `gerbilc` prints it: `--pass-stats` and
//! the `--bisect` note.

use gerbil_compiler::PassReport;
use std::fmt::Write;

/// One line per pass that ran: its name and how many rewrites it made.
pub fn pass_stats(report: &PassReport) -> String {
    let width = report.ran.iter().map(|r| r.name.len()).max().unwrap_or(0);
    let mut out = String::from("pass stats (rewrites per pass):\n");
    for r in &report.ran {
        let _ = writeln!(out, "  {:<width$}  {}", r.name, r.rewrites);
    }
    for name in &report.skipped {
        let _ = writeln!(out, "  {name:<width$}  disabled");
    }
    out
}

/// Which passes a `--bisect N` run ran and the one it stopped before.
pub fn bisect_note(report: &PassReport, limit: usize) -> String {
    let ran: Vec<&str> = report.ran.iter().map(|r| r.name.as_str()).collect();
    match &report.stopped_before {
        Some(next) => format!(
            "bisect: ran the first {} pass(es) [{}]; stopped before `{next}` (pass {})",
            ran.len(),
            ran.join(", "),
            ran.len() + 1
        ),
        None => format!(
            "bisect: all {} passes ran (limit {limit}) [{}]",
            ran.len(),
            ran.join(", ")
        ),
    }
}
