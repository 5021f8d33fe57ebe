//! `gerbil-run PLAN selftest`: the runtime's self-test report
//! ([`gerbil_runtime::selftest`]) as text.
//!
//! One line per variant, best first: its precision, the largest |Δ| from
//! the reference and the tolerance, and `passed`, `FAILED` or why it was
//! skipped. The surprise: a plan with no variant this device passes is a
//! failure too, so a device that skips everything does not look healthy.

use gerbil_runtime::selftest::{SelfTestReport, Status};

/// The report as lines of text.
pub fn report_text(r: &SelfTestReport) -> String {
    let tokens: usize = r.steps.iter().map(Vec::len).sum();
    let shape: Vec<String> = r.steps.iter().map(|s| s.len().to_string()).collect();
    let mut s = format!(
        "self-test on {}: {tokens} tokens in steps of {} against the CPU interpreter's output \
         (largest |value| {:.3})\n",
        if r.device.is_empty() {
            "this device"
        } else {
            &r.device
        },
        shape.join(" + "),
        r.max_abs
    );
    let width = r.variants.iter().map(|v| v.name.len()).max().unwrap_or(0);
    for v in &r.variants {
        let line = match (v.status, v.max_abs_diff, &v.reason) {
            (Status::Skipped, _, reason) => {
                format!("skipped: {}", reason.as_deref().unwrap_or("not run"))
            }
            (status, Some(d), _) => format!(
                "max |Δ| {d:.2e} (tolerance {:.2e})  {}",
                v.tolerance,
                if status == Status::Passed {
                    "passed"
                } else {
                    "FAILED"
                }
            ),
            (_, None, reason) => format!("FAILED: {}", reason.as_deref().unwrap_or("no output")),
        };
        s += &format!("  {:<width$}  {}  {line}\n", v.name, v.precision);
    }
    s
}

/// Why the self-test failed, naming the variants: those whose output is
/// past their tolerance, and those that could not run (with the reason).
pub fn failure(r: &SelfTestReport) -> String {
    let failed = |wrong: bool| -> Vec<String> {
        r.variants
            .iter()
            .filter(|v| v.status == Status::Failed && v.max_abs_diff.is_some() == wrong)
            .map(|v| match (&v.reason, wrong) {
                (Some(reason), false) => format!("`{}` ({reason})", v.name),
                _ => format!("`{}`", v.name),
            })
            .collect()
    };
    let (wrong, broken) = (failed(true), failed(false));
    let mut parts = Vec::new();
    if !wrong.is_empty() {
        parts.push(format!(
            "the self-test failed for {}: the output differs from the reference past the \
             tolerance (this device or its driver computes it wrongly, or the variant is less \
             accurate on this model than its tolerance allows); run another variant with \
             --variant, and report the device, driver and model to gerbil's issues",
            wrong.join(", ")
        ));
    }
    if !broken.is_empty() {
        parts.push(format!("the self-test could not run {}", broken.join(", ")));
    }
    if parts.is_empty() {
        return "the self-test ran no variant on this device: see the reasons above".into();
    }
    parts.join("; ")
}
