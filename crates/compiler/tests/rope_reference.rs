//! gerbil's RoPE against transformers itself: for every RoPE type (default,
//! linear, llama3, YaRN with its derived, `mscale`-ratio and explicit
//! attention factors, LongRoPE's short and long factors, partial rotary), the
//! inverse frequencies and attention scaling that `gerbil_frontend_hf::rope`
//! computes, and the table rows that `rope_table` materializes from them,
//! compared with `tests/data/rope_reference.json`.
//!
//! The JSON comes from `scripts/rope-reference.py`, which runs transformers'
//! own RoPE initializers and rotary-embedding classes (it records the
//! transformers and torch versions). Frequencies must be within one ulp (the
//! power `θ^(2i/d)` is correctly rounded here, SLEEF's on the torch side);
//! attention scalings equal; table rows within 1e-6, plus the angle error that
//! a one-ulp frequency difference makes at that position.

use gerbil_compiler::rope_table;
use gerbil_frontend_hf::rope::{rope_frequencies, rotary_dim};
use gerbil_frontend_hf::{RopeContext, RopeParameters};
use gerbil_ir::rope_table::{cos_index, sin_index};
use serde_json::Value;
use std::path::Path;

const TABLE_TOL: f64 = 1e-6;

fn reference() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/rope_reference.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/rope-reference.py)", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn u64_of(case: &Value, key: &str) -> u64 {
    case[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{}: `{key}` is not an integer", case["name"]))
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect()
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// What one case measured, for the summary line.
struct Measured {
    /// Frequencies that differ from transformers' (each by one ulp at most).
    ulp_off: usize,
    /// Largest |Δ| of a table entry from transformers' frequencies.
    table_math: f64,
    /// Largest |Δ| of a table entry from gerbil's frequencies.
    end_to_end: f64,
}

/// Checks one case and returns what it measured, or every mismatch.
fn check_case(case: &Value) -> Result<Measured, String> {
    let params: RopeParameters = serde_json::from_value(case["parameters"].clone())
        .map_err(|e| format!("parameters: {e}"))?;
    let theta = params.rope_theta.ok_or("the case has no rope_theta")?;
    let config = Path::new("config.json");
    let rot =
        rotary_dim(&params, u64_of(case, "head_dim") as u32, config).map_err(|e| e.to_string())?;
    if u64::from(rot) != u64_of(case, "rotary_dim") {
        return Err(format!(
            "rotary_dim {rot}, transformers {}",
            case["rotary_dim"]
        ));
    }
    let rc = RopeContext {
        max_position_embeddings: u64_of(case, "max_position_embeddings"),
        context: u64_of(case, "context"),
    };
    let ours = rope_frequencies(&params, theta, rot, &rc, config).map_err(|e| e.to_string())?;

    // Frequencies: one ulp at most.
    let theirs: Vec<f32> = case["inv_freq_bits"]
        .as_array()
        .ok_or("no inv_freq_bits")?
        .iter()
        .map(|b| f32::from_bits(b.as_u64().unwrap_or(0) as u32))
        .collect();
    if theirs.len() != ours.inv_freq.len() {
        return Err(format!(
            "{} frequencies, transformers {}",
            ours.inv_freq.len(),
            theirs.len()
        ));
    }
    let mut ulp_off = 0;
    for (i, (a, b)) in ours.inv_freq.iter().zip(&theirs).enumerate() {
        let ulps = (i64::from(a.to_bits() as i32) - i64::from(b.to_bits() as i32)).abs();
        if ulps > 1 {
            return Err(format!(
                "inv_freq[{i}] = {a:e}, transformers {b:e} ({ulps} ulps)"
            ));
        }
        ulp_off += usize::from(ulps == 1);
    }

    // Attention scaling: transformers' Python float, rounded to the f32 the
    // table is scaled by; the rotary class used the same one.
    let scaling = case["attention_scaling"]
        .as_f64()
        .ok_or("no attention_scaling")?;
    if case["class_attention_scaling"].as_f64() != Some(scaling) {
        return Err("the rotary class scaled by another factor".into());
    }
    if ours.attention_scaling != scaling as f32 {
        return Err(format!(
            "attention scaling {}, transformers {scaling}",
            ours.attention_scaling
        ));
    }

    // Table rows: the layout and math with transformers' own frequencies,
    // then end to end with ours.
    let positions: Vec<u64> = case["positions"]
        .as_array()
        .ok_or("no positions")?
        .iter()
        .map(|p| p.as_u64().unwrap_or(0))
        .collect();
    let rows = positions.iter().max().map_or(0, |p| p + 1);
    let math = floats(&rope_table(&theirs, scaling as f32, rows));
    let end = floats(&rope_table(&ours.inv_freq, ours.attention_scaling, rows));
    let (mut table_math, mut end_to_end) = (0.0f64, 0.0f64);
    let rot = u64::from(rot);
    for (k, &p) in positions.iter().enumerate() {
        let (cos, sin) = (f64s(&case["cos"][k]), f64s(&case["sin"][k]));
        for i in 0..rot / 2 {
            let (ci, si) = (cos_index(p, i, rot) as usize, sin_index(p, i, rot) as usize);
            let (want_c, want_s) = (cos[i as usize], sin[i as usize]);
            let dm = (f64::from(math[ci]) - want_c)
                .abs()
                .max((f64::from(math[si]) - want_s).abs());
            if dm > TABLE_TOL {
                return Err(format!(
                    "table row {p}, pair {i} from transformers' frequencies: \
                     cos {} sin {}, transformers {want_c} {want_s}",
                    math[ci], math[si]
                ));
            }
            // A frequency one ulp away moves the angle by p·|Δf|.
            let df = f64::from(ours.inv_freq[i as usize]) - f64::from(theirs[i as usize]);
            let tol = TABLE_TOL + p as f64 * df.abs() * f64::from(ours.attention_scaling);
            let de = (f64::from(end[ci]) - want_c)
                .abs()
                .max((f64::from(end[si]) - want_s).abs());
            if de > tol {
                return Err(format!(
                    "table row {p}, pair {i}: cos {} sin {}, transformers {want_c} {want_s}",
                    end[ci], end[si]
                ));
            }
            table_math = table_math.max(dm);
            end_to_end = end_to_end.max(de);
        }
    }
    Ok(Measured {
        ulp_off,
        table_math,
        end_to_end,
    })
}

#[test]
fn rope_matches_transformers() {
    let reference = reference();
    let version = reference["transformers_version"].as_str().unwrap_or("?");
    assert!(
        reference["errors"].as_array().is_some_and(|e| e.is_empty()),
        "the reference recorded errors: {}",
        reference["errors"]
    );
    let cases = reference["cases"].as_array().expect("cases");
    let mut failures = Vec::new();
    for case in cases {
        match check_case(case) {
            Ok(m) => eprintln!(
                "{:<22} frequencies one ulp off: {}, table |Δ| {:.1e} (transformers' \
                 frequencies), {:.1e} (ours)",
                case["name"].as_str().unwrap_or("?"),
                m.ulp_off,
                m.table_math,
                m.end_to_end
            ),
            Err(e) => failures.push(format!("  {}: {e}", case["name"])),
        }
    }
    assert!(
        failures.is_empty(),
        "RoPE differs from transformers {version}:\n{}",
        failures.join("\n")
    );
    // Every type the issue names is covered.
    let names: Vec<&str> = cases.iter().filter_map(|c| c["name"].as_str()).collect();
    for want in [
        "default",
        "linear",
        "llama3",
        "yarn",
        "yarn_mscale",
        "yarn_attention_factor",
        "longrope_short",
        "longrope_long",
        "partial_default",
        "partial_yarn",
    ] {
        assert!(names.contains(&want), "no `{want}` case in the reference");
    }
}
