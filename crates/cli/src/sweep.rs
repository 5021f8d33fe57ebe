//! `gerbil-run PLAN bench --sweep`: prefill and decode speed across context
//! lengths, on one loaded session.
//!
//! [`context_lengths`] picks the lengths: doubling from 128 up to the plan's
//! context, with the context itself last (from a quarter of the context
//! where it is under 512, so a small plan still gets three points). At each
//! length `L`, [`sweep`] times a prefill of an `L`-token prompt (tokens per
//! second of the whole prompt, chunked as the plan's prefill step requires)
//! and a decode of `--new-tokens` tokens from `L` tokens of context — or
//! from `context − new_tokens` where `L` leaves no room for them — taking the
//! median of `--repeats`. The tokens are synthetic, as in `bench`.
//!
//! The surprising part: the model is loaded once for every point, so a sweep
//! costs one load plus its prefills and decodes; the first prefill is a
//! warm-up (pipelines' first use) and is not timed. [`run_sweep`] is the
//! command: the table or JSON on stdout, the chart through [`crate::plot`].

use crate::plot::plot_svg;
use crate::run::{median, time_decode};
use anyhow::{bail, Context, Result};
use gerbil_plan::{safe_file, PlanFile};
use gerbil_runtime::{
    PipelineCacheOptions, PrecisionChoice, SamplingParams, Session, SessionOptions,
};
use serde::Serialize;
use std::fmt::Write;
use std::time::Instant;

/// Settings of a sweep.
#[derive(Clone, Debug)]
pub struct SweepOptions {
    /// Tokens decoded at each point.
    pub new_tokens: usize,
    /// How decode chooses tokens (greedy by default).
    pub sampling: SamplingParams,
    /// Timed repetitions at each point (the median is reported).
    pub repeats: usize,
    /// Which precision variant runs.
    pub precision: PrecisionChoice,
    /// Run the plan's variant of this name instead of the best one.
    pub variant: Option<String>,
    /// Where compiled pipelines are kept between runs (`None`: nowhere).
    pub pipeline_cache: Option<PipelineCacheOptions>,
    /// Adapter index of `gerbil-run devices` (`None`: the default one).
    pub adapter: Option<usize>,
    /// Use the tensor-core variant where the adapter has cooperative
    /// matrices (`SessionOptions::tensor_cores`).
    pub tensor_cores: bool,
}

/// Speed at one context length.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepPoint {
    /// Context length: the prefill's prompt tokens.
    pub context: usize,
    /// Prompt tokens per second (median).
    pub prefill_tok_s: f64,
    /// Tokens of context when the timed decode started.
    pub decode_depth: usize,
    /// Generated tokens per second (median).
    pub decode_tok_s: f64,
}

/// A sweep's points and what they ran on.
#[derive(Clone, Debug, Serialize)]
pub struct SweepReport {
    /// Adapter name and backend.
    pub device: String,
    /// Model name.
    pub model: String,
    /// The plan variant that ran.
    pub variant: String,
    /// Its precision: `f32` or `f16`.
    pub precision: String,
    /// Tokens decoded at each point.
    pub new_tokens: usize,
    /// One point per context length, shortest first.
    pub points: Vec<SweepPoint>,
}

/// Context lengths of a sweep over a plan of `max` tokens of context:
/// doubling from 128 (from `max / 4` when that is smaller) and ending at `max`.
pub fn context_lengths(max: usize) -> Vec<usize> {
    let mut lengths = Vec::new();
    let mut l = 128.min(max / 4).max(1);
    while l < max {
        lengths.push(l);
        l *= 2;
    }
    if max > 0 {
        lengths.push(max);
    }
    lengths
}

/// Times prefill and decode at every length of [`context_lengths`].
pub async fn sweep(plan_path: &std::path::Path, opts: &SweepOptions) -> Result<SweepReport> {
    let plan = PlanFile::open(plan_path)?;
    let max = plan.header.model.max_context as usize;
    if opts.new_tokens == 0 || opts.new_tokens >= max {
        bail!(
            "--new-tokens {} must be between 1 and the plan's context {max} minus 1 for a sweep",
            opts.new_tokens
        );
    }
    let session_opts = SessionOptions {
        precision: opts.precision,
        variant: opts.variant.clone(),
        pipeline_cache: opts.pipeline_cache.clone(),
        adapter: opts.adapter,
        tensor_cores: opts.tensor_cores,
        ..crate::env::session_defaults()
    };
    let mut session = Session::open(&plan, &session_opts).await?;
    gerbil_runtime::Sampler::new(opts.sampling)?;
    session.set_sampling(&opts.sampling);
    let vocab = session.vocab_size() as u32;
    let tokens = crate::run::synthetic_ids(max, vocab);
    let lengths = context_lengths(max);
    // Warm-up: the pipelines' first use; the timed prompts run on the
    // variant itself, never its prefill fallback.
    session.reset();
    session.forward(&tokens[..lengths[0]]).await?;
    session.create_step_pipelines().await?;
    let mut points = Vec::with_capacity(lengths.len());
    for &context in &lengths {
        let depth = context.min(max - opts.new_tokens);
        let (mut prefill, mut decode) = (Vec::new(), Vec::new());
        for _ in 0..opts.repeats.max(1) {
            session.reset();
            let t0 = Instant::now();
            session.forward(&tokens[..context]).await?;
            prefill.push(t0.elapsed().as_secs_f64());
            let context_ids = &tokens[..depth.max(1)];
            decode.push(
                time_decode(
                    &mut session,
                    context_ids,
                    depth,
                    opts.new_tokens,
                    &opts.sampling,
                )
                .await?,
            );
        }
        points.push(SweepPoint {
            context,
            prefill_tok_s: context as f64 / median(prefill),
            decode_depth: depth,
            decode_tok_s: opts.new_tokens as f64 / median(decode),
        });
    }
    Ok(SweepReport {
        device: format!(
            "{} ({:?})",
            session.gpu().adapter.name,
            session.gpu().adapter.backend
        ),
        model: plan.header.model.name.clone(),
        variant: session.variant().name.clone(),
        precision: session.variant().precision.name().to_string(),
        new_tokens: opts.new_tokens,
        points,
    })
}

/// `bench --sweep`: runs the sweep, writes its chart to `plot` when given,
/// and prints a table, or with `json` the points as one JSON array.
pub async fn run_sweep(
    plan_path: &std::path::Path,
    opts: &SweepOptions,
    json: bool,
    plot: Option<&std::path::Path>,
) -> Result<()> {
    if let Some(path) = plot {
        safe_file::check_output(path, &[plan_path.to_path_buf()])?;
    }
    let report = sweep(plan_path, opts).await?;
    if let Some(path) = plot {
        safe_file::write_file(path, plot_svg(&report)?.as_bytes())
            .with_context(|| format!("writing the chart to {}", path.display()))?;
        crate::console::note(&format!("wrote {}", path.display()));
    }
    if json {
        crate::console::print(&format!("{}\n", serde_json::to_string(&report.points)?))?;
    } else {
        crate::console::print(&render_table(&report))?;
    }
    Ok(())
}

/// The sweep as a table, one context length a line.
pub fn render_table(r: &SweepReport) -> String {
    let mut s = format!(
        "device   {}\nmodel    {}, variant {} ({}); decode of {} tokens\n",
        r.device, r.model, r.variant, r.precision, r.new_tokens
    );
    s += "context  prefill tok/s  decode depth  decode tok/s\n";
    for p in &r.points {
        let _ = writeln!(
            s,
            "{:>7}  {:>13.1}  {:>12}  {:>12.1}",
            p.context, p.prefill_tok_s, p.decode_depth, p.decode_tok_s
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::context_lengths;

    #[test]
    fn lengths_double_to_the_context_and_end_at_it() {
        assert_eq!(context_lengths(4096), [128, 256, 512, 1024, 2048, 4096]);
        assert_eq!(context_lengths(3000), [128, 256, 512, 1024, 2048, 3000]);
        assert_eq!(context_lengths(64), [16, 32, 64]);
        assert_eq!(context_lengths(256), [64, 128, 256]);
        assert_eq!(context_lengths(2), [1, 2]);
        assert_eq!(context_lengths(1), [1]);
    }
}
