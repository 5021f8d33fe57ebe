//! `gerbil-run PLAN selftest`: every variant lavapipe runs passes against the
//! reference `gerbilc compile` stored (the CPU interpreter's output on a
//! short prompt), the tensor-core one is skipped with the reason, a kernel
//! broken on purpose fails naming its variant (and only it), and a plan
//! without a reference says how to get one.

use crate::common::*;
use serde_json::Value;

/// The statuses of a `selftest --json` report, by variant.
fn statuses(report: &Value) -> Vec<(String, String)> {
    report["variants"]
        .as_array()
        .expect("variants")
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap_or_default().to_string(),
                v["status"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn status<'a>(all: &'a [(String, String)], name: &str) -> &'a str {
    all.iter()
        .find(|(n, _)| n == name)
        .map_or("absent", |(_, s)| s.as_str())
}

#[test]
fn every_variant_passes_and_a_broken_kernel_fails_naming_its_variant() {
    let (dir, plan) = tiny_plan("selftest", &[]);
    let path = plan.to_str().unwrap();
    let o = gerbil_run(&[path, "selftest", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: Value = serde_json::from_str(&stdout(&o)).expect("one JSON object");
    let steps: Vec<usize> = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_array().unwrap().len())
        .collect();
    assert_eq!(steps, [7, 1], "a prefill, then a decode step");
    let all = statuses(&report);
    for name in ["cpu", "portable", "portable-f16"] {
        assert_eq!(status(&all, name), "passed", "{name}: {report}");
    }
    assert_eq!(status(&all, "tensor-f16"), "skipped", "{report}");
    for v in report["variants"].as_array().unwrap() {
        if v["status"] == "passed" {
            let (d, tol) = (v["max_abs_diff"].as_f64(), v["tolerance"].as_f64());
            assert!(d.unwrap() <= tol.unwrap(), "{v}");
        }
    }
    let text = stdout(&gerbil_run(&[path, "selftest"]));
    assert!(text.contains("steps of 7 + 1"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("portable ") && l.ends_with("passed")),
        "{text}"
    );

    // Halve the RMSNorm of every kernel only `portable` runs.
    let broken = dir.path().join("broken.plan");
    std::fs::copy(&plan, &broken).unwrap();
    edit_header(&broken, |h| {
        let mut users: Vec<Vec<String>> = vec![Vec::new(); h["kernels"].as_array().unwrap().len()];
        for v in h["variants"].as_array().unwrap() {
            for phase in ["prefill", "decode"] {
                for d in v[phase].as_array().unwrap() {
                    let k = d["kernel"].as_u64().unwrap() as usize;
                    users[k].push(v["name"].as_str().unwrap().to_string());
                }
            }
        }
        let mut edited = 0;
        for (k, kernel) in h["kernels"].as_array_mut().unwrap().iter_mut().enumerate() {
            let wgsl = kernel["wgsl"].as_str().unwrap();
            if users[k].iter().all(|u| u == "portable") && wgsl.contains("1.0f / sqrt(") {
                kernel["wgsl"] = wgsl.replace("1.0f / sqrt(", "0.5f / sqrt(").into();
                edited += 1;
            }
        }
        assert!(edited > 0, "no portable-only norm kernel to break");
    });
    let broken = broken.to_str().unwrap();
    let o = gerbil_run(&[broken, "selftest", "--json"]);
    assert!(!o.status.success());
    assert_fails_with(
        &o,
        "the self-test failed for `portable`: the output differs",
    );
    let all = statuses(&serde_json::from_str(&stdout(&o)).expect("one JSON object"));
    assert_eq!(status(&all, "portable"), "failed");
    for name in ["cpu", "portable-f16"] {
        assert_eq!(status(&all, name), "passed", "{name}");
    }
}

/// One input, of at most the tokens the model takes (4 with `--max-context 4`).
#[test]
fn an_embedding_plan_checks_its_vector() {
    let bert = data("models/tiny-encoder/bert");
    for (tag, flags, tokens) in [
        ("bert", &[][..], 8),
        ("bert-4", &["--max-context", "4"][..], 4),
    ] {
        let (_dir, plan) = compile(&bert, tag, flags);
        let o = gerbil_run(&[plan.to_str().unwrap(), "selftest", "--json"]);
        assert!(o.status.success(), "{tag}: {}", stderr(&o));
        let report: Value = serde_json::from_str(&stdout(&o)).unwrap();
        let steps = report["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 1, "{report}");
        assert_eq!(steps[0].as_array().unwrap().len(), tokens, "{report}");
        assert_eq!(status(&statuses(&report), "cpu"), "passed", "{report}");
    }
}

#[test]
fn a_plan_without_a_selftest_says_how_to_get_one() {
    let (_dir, plan) = tiny_plan("no-selftest", &["--no-selftest"]);
    let o = gerbil_run(&[plan.to_str().unwrap(), "selftest"]);
    assert_fails_with(&o, "the plan has no self-test");
    assert_fails_with(&o, "recompile it without that flag");
}
