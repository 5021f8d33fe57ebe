//! `gerbilc inspect PLAN --schedule`: every dispatch of every schedule, in
//! order, with the IR label it came from and the kernel it runs, and the
//! steps it runs in where it runs in some only (`T ≤ 48`, `T ≥ 49`: a
//! prefill matmul's short-prompt and tiled forms).

use gerbil_plan::{Dispatch, PlanHeader};
use std::fmt::Write;

/// The prefill and decode schedules of each variant, one dispatch a line:
/// index, layer (`-` outside the layers), IR label, kernel name, the range
/// of `T` it runs in (if not every step).
pub fn render_schedule(header: &PlanHeader) -> String {
    let mut out = String::new();
    for v in &header.variants {
        for (name, list) in [("prefill", &v.prefill), ("decode", &v.decode)] {
            let _ = writeln!(out, "{} {name} ({} dispatches)", v.name, list.len());
            render_list(&mut out, header, list);
        }
    }
    out
}

fn render_list(out: &mut String, header: &PlanHeader, list: &[Dispatch]) {
    let width = list.iter().map(|d| d.label.len()).max().unwrap_or(0);
    for (i, d) in list.iter().enumerate() {
        let layer = d.layer.map_or("-".to_string(), |l| l.to_string());
        let kernel = header.kernels.get(d.kernel as usize).map_or_else(
            || format!("<kernel {} missing>", d.kernel),
            |k| k.name.clone(),
        );
        let most = header.model.max_tokens_per_step;
        let tokens = match d.tokens {
            None => String::new(),
            Some(r) if r.min <= 1 => format!("  (T ≤ {})", r.max),
            Some(r) if u64::from(r.max) >= most => format!("  (T ≥ {})", r.min),
            Some(r) => format!("  ({} ≤ T ≤ {})", r.min, r.max),
        };
        let _ = writeln!(
            out,
            "  {i:>4}  {layer:>3}  {:<width$}  {kernel}{tokens}",
            d.label
        );
    }
}
