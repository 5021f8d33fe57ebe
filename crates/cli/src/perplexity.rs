//! `gerbil-run PLAN perplexity FILE`: how well a plan predicts a text, and how
//! far its next-token distributions are from another plan's (`--against`).
//!
//! The method is llama.cpp's `llama-perplexity` (with `--kl-divergence`):
//! the text is tokenized once and cut into windows of `--window` tokens
//! (the tokens the tokenizer adds to every text, such as a BOS, open each
//! window); each window runs from an empty cache and only its second half is
//! scored, so every scored token sees at least half a window of context.
//! With `--against BASE` both plans run every window, and each scored position
//! adds KL(base ‖ plan) and whether the two most likely tokens agree. What a
//! quantization costs is then a number: the quality table in
//! `docs/performance.md` was measured this way on `data/moby-dick.txt`.
//!
//! The surprise: a plan compiled as usual keeps only the last row of logits
//! (the `slice-last-row` pass saves the LM head's work on every other row),
//! so the scored half runs one token per step; a plan compiled with
//! `--disable-pass slice-last-row` returns every row of a step and scores
//! the half in prefill-sized steps, many times faster. Both give the same
//! numbers.

use crate::progress::Progress;
use anyhow::{bail, Context, Result};
use gerbil::{Model, ModelOptions};
use gerbil_plan::PlanFile;
use gerbil_runtime::Session;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Settings of `gerbil-run perplexity`.
#[derive(Clone, Debug)]
pub struct PerplexityOptions {
    /// Tokens per window; the second half of each is scored.
    pub window: usize,
    /// Score at most this many windows (the first ones).
    pub max_windows: Option<usize>,
    /// A second plan to compare against: KL divergence and top-1 agreement.
    pub against: Option<PathBuf>,
    /// How both plans are loaded; the context defaults to the window.
    pub model: ModelOptions,
    /// No progress bar.
    pub quiet: bool,
}

/// What `gerbil-run perplexity` measured (its `--json` object).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PerplexityReport {
    /// Tokens of the whole text.
    pub text_tokens: usize,
    /// Windows run.
    pub windows: usize,
    /// Tokens per window.
    pub window: usize,
    /// Tokens scored (half of every window).
    pub scored_tokens: usize,
    /// exp(mean negative log-likelihood of the scored tokens).
    pub perplexity: f64,
    /// The perplexity's standard error (from the mean's).
    pub perplexity_error: f64,
    /// Against `--against`'s plan, when given.
    pub against: Option<Comparison>,
}

/// How the plan's next-token distributions differ from a base plan's.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Comparison {
    /// The base plan's perplexity on the same scored tokens.
    pub base_perplexity: f64,
    /// Mean KL(base ‖ plan) per scored token, in nats.
    pub kld_mean: f64,
    /// The mean's standard error.
    pub kld_error: f64,
    /// Median KL divergence.
    pub kld_median: f64,
    /// 99th percentile of the KL divergence.
    pub kld_p99: f64,
    /// Largest KL divergence.
    pub kld_max: f64,
    /// Fraction of scored positions where both plans' most likely token is the same.
    pub top1_agreement: f64,
}

/// Runs `plan` (and `opts.against`) over `text` and scores it.
pub async fn perplexity(
    plan: &Path,
    text: &str,
    opts: &PerplexityOptions,
) -> Result<PerplexityReport> {
    if opts.window < 4 {
        bail!(
            "--window {} is too short to score: give at least 4 tokens (512 is usual)",
            opts.window
        );
    }
    let mut model = open(plan, opts).await?;
    let tokens = Tokens::of(&model, text)?;
    let mut base = match &opts.against {
        Some(path) => {
            // `--variant` picks the scored plan's variant; the base runs its
            // best at `--precision` (so one plan's variants compare).
            let mut base_opts = opts.clone();
            base_opts.model.session.variant = None;
            let base = open(path, &base_opts).await?;
            let theirs = Tokens::of(&base, text)?;
            if theirs != tokens || base.session().vocab_size() != model.session().vocab_size() {
                bail!(
                    "{} and {} tokenize the text differently: KL divergence compares two plans \
                     of the same model (the same tokenizer and vocabulary)",
                    plan.display(),
                    path.display()
                );
            }
            Some(base)
        }
        None => None,
    };
    let windows = tokens.windows(opts.window)?;
    let windows = &windows[..windows.len().min(opts.max_windows.unwrap_or(usize::MAX))];
    let bar = Progress::new(opts.quiet).tokens("scoring", (windows.len() * opts.window) as u64);
    let mut scores = Scores::default();
    for window in windows {
        let ours = score_window(model.session_mut(), window).await?;
        match &mut base {
            Some(base) => {
                let theirs = score_window(base.session_mut(), window).await?;
                for (o, t) in ours.iter().zip(&theirs) {
                    scores.add_pair(o, t);
                }
            }
            None => ours.iter().for_each(|o| scores.add(o)),
        }
        bar.inc(opts.window as u64);
    }
    bar.finish_and_clear();
    Ok(scores.report(
        tokens.body.len() + tokens.prefix.len(),
        windows.len(),
        opts.window,
    ))
}

/// Loads a plan with a context of one window unless `--ctx` chose one.
async fn open(path: &Path, opts: &PerplexityOptions) -> Result<Model> {
    let plan = PlanFile::open(path)?;
    let max = plan.header.model.max_context;
    let context = opts
        .model
        .session
        .context
        .unwrap_or(max.min(opts.window as u64));
    if (opts.window as u64) > context {
        bail!(
            "--window {} is longer than {}'s context of {context} tokens: give --window {context} \
             or less, or compile the plan with a larger --max-context",
            opts.window,
            path.display()
        );
    }
    let mut model_opts = opts.model.clone();
    model_opts.session.context = Some(context);
    // Every window on the variant itself: a score of its logits, never its
    // prefill fallback's.
    model_opts.session.prefill_fallback = gerbil_runtime::PrefillFallback::Off;
    let model = Model::load(&plan, &model_opts)
        .await
        .with_context(|| format!("loading {}", path.display()))?;
    Ok(model)
}

/// A text's tokens: the ones the tokenizer puts before every text (a BOS),
/// then the text's own.
#[derive(PartialEq, Eq, Debug)]
struct Tokens {
    prefix: Vec<u32>,
    body: Vec<u32>,
}

impl Tokens {
    fn of(model: &Model, text: &str) -> Result<Tokens> {
        let prefix = model.encode("")?;
        let mut body = model.encode(text)?;
        if body.starts_with(&prefix) {
            body.drain(..prefix.len());
        }
        Ok(Tokens { prefix, body })
    }

    /// Whole windows of `window` tokens, each the prefix and the next part
    /// of the text; what is left at the end is not scored.
    fn windows(&self, window: usize) -> Result<Vec<Vec<u32>>> {
        let own = window.saturating_sub(self.prefix.len());
        if own < window / 2 + 1 {
            bail!("--window {window} leaves no text to score after the tokenizer's {} added tokens: give a longer window", self.prefix.len());
        }
        let windows: Vec<Vec<u32>> = self
            .body
            .chunks_exact(own)
            .map(|part| [&self.prefix[..], part].concat())
            .collect();
        if windows.is_empty() {
            bail!(
                "the text has {} tokens, fewer than one window of {window}: give a longer text \
                 or a smaller --window",
                self.body.len() + self.prefix.len()
            );
        }
        Ok(windows)
    }
}

/// One scored position: the log-probabilities the plan gave and the token that came.
struct Scored {
    log_probs: Vec<f32>,
    target: u32,
}

/// Runs one window from an empty cache and returns the log-probabilities of
/// its second half's tokens: a prefill of the first half (less one token),
/// then the rest in steps as long as the plan returns rows for.
async fn score_window(session: &mut Session, window: &[u32]) -> Result<Vec<Scored>> {
    session.reset();
    let first = window.len() / 2;
    if first > 1 {
        session.forward_no_readback(&window[..first - 1]).await?;
    }
    let step = if session.header().io.logits_all_rows {
        session.header().model.max_tokens_per_step.max(1) as usize
    } else {
        1
    };
    let inputs = &window[first - 1..window.len() - 1];
    let mut scored = Vec::with_capacity(inputs.len());
    for (i, part) in inputs.chunks(step).enumerate() {
        session.forward_no_readback(part).await?;
        let rows = session.read_step_logits().await?;
        if rows.len() != part.len() {
            bail!(
                "the plan returned {} rows of logits for a step of {} tokens",
                rows.len(),
                part.len()
            );
        }
        for (j, row) in rows.into_iter().enumerate() {
            let target = window[first + i * step + j];
            scored.push(Scored {
                log_probs: log_softmax(row),
                target,
            });
        }
    }
    Ok(scored)
}

/// `logits` turned into log-probabilities in place (in f64 for the sum).
fn log_softmax(mut logits: Vec<f32>) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let log_sum = sum.ln() as f32;
    for l in &mut logits {
        *l = *l - max - log_sum;
    }
    logits
}

/// The index of the largest value (the first of equals).
fn argmax(values: &[f32]) -> usize {
    values
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
            if v > best.1 {
                (i, v)
            } else {
                best
            }
        })
        .0
}

/// KL(p ‖ q) in nats, from log-probabilities.
fn kl_divergence(log_p: &[f32], log_q: &[f32]) -> f64 {
    log_p
        .iter()
        .zip(log_q)
        .map(|(&lp, &lq)| {
            let p = f64::from(lp).exp();
            if p == 0.0 {
                0.0
            } else {
                p * (f64::from(lp) - f64::from(lq))
            }
        })
        .sum::<f64>()
        .max(0.0)
}

/// Running sums over the scored positions.
#[derive(Default)]
struct Scores {
    nll: Vec<f64>,
    base_nll: Vec<f64>,
    kld: Vec<f64>,
    agree: usize,
}

impl Scores {
    fn add(&mut self, ours: &Scored) {
        self.nll
            .push(-f64::from(ours.log_probs[ours.target as usize]));
    }

    fn add_pair(&mut self, ours: &Scored, base: &Scored) {
        self.add(ours);
        self.base_nll
            .push(-f64::from(base.log_probs[base.target as usize]));
        self.kld
            .push(kl_divergence(&base.log_probs, &ours.log_probs));
        if argmax(&ours.log_probs) == argmax(&base.log_probs) {
            self.agree += 1;
        }
    }

    fn report(mut self, text_tokens: usize, windows: usize, window: usize) -> PerplexityReport {
        let (nll, nll_error) = mean_and_error(&self.nll);
        let against = (!self.kld.is_empty()).then(|| {
            let (base_nll, _) = mean_and_error(&self.base_nll);
            let (kld_mean, kld_error) = mean_and_error(&self.kld);
            self.kld.sort_by(f64::total_cmp);
            Comparison {
                base_perplexity: base_nll.exp(),
                kld_mean,
                kld_error,
                kld_median: quantile(&self.kld, 0.5),
                kld_p99: quantile(&self.kld, 0.99),
                kld_max: self.kld.last().copied().unwrap_or(0.0),
                top1_agreement: self.agree as f64 / self.kld.len() as f64,
            }
        });
        PerplexityReport {
            text_tokens,
            windows,
            window,
            scored_tokens: self.nll.len(),
            perplexity: nll.exp(),
            perplexity_error: nll.exp() * nll_error,
            against,
        }
    }
}

/// The mean and its standard error.
fn mean_and_error(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt())
}

/// The `q` quantile of sorted values (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The report as `gerbil-run perplexity` prints it.
pub fn report_text(r: &PerplexityReport) -> String {
    let plural = if r.windows == 1 { "" } else { "s" };
    let mut s = format!(
        "{} tokens in {} window{plural} of {}, {} scored\nperplexity {:.4} ± {:.4}\n",
        r.text_tokens, r.windows, r.window, r.scored_tokens, r.perplexity, r.perplexity_error
    );
    if let Some(c) = &r.against {
        s.push_str(&format!(
            "base perplexity {:.4} (ratio {:.4})\nKL divergence mean {:.6} ± {:.6}, median {:.6}, \
             p99 {:.6}, max {:.6}\ntop-1 agreement {:.2}%\n",
            c.base_perplexity,
            r.perplexity / c.base_perplexity,
            c.kld_mean,
            c.kld_error,
            c.kld_median,
            c.kld_p99,
            c.kld_max,
            100.0 * c.top1_agreement
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scored(logits: &[f32], target: u32) -> Scored {
        Scored {
            log_probs: log_softmax(logits.to_vec()),
            target,
        }
    }

    #[test]
    fn log_softmax_sums_to_one_and_keeps_order() {
        let lp = log_softmax(vec![1.0, 3.0, -2.0, 0.5]);
        let total: f64 = lp.iter().map(|&l| f64::from(l).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert_eq!(argmax(&lp), 1);
        // Shifting every logit changes nothing.
        let shifted = log_softmax(vec![101.0, 103.0, 98.0, 100.5]);
        for (a, b) in lp.iter().zip(&shifted) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    #[test]
    fn kl_divergence_is_zero_for_equal_and_matches_the_formula() {
        let p = log_softmax(vec![0.3, 1.7, -0.4]);
        assert!(kl_divergence(&p, &p).abs() < 1e-12);
        let q = log_softmax(vec![1.1, 0.2, -0.9]);
        let expected: f64 = p
            .iter()
            .zip(&q)
            .map(|(&a, &b)| f64::from(a).exp() * (f64::from(a) - f64::from(b)))
            .sum();
        assert!((kl_divergence(&p, &q) - expected).abs() < 1e-9);
        assert!(kl_divergence(&p, &q) > 0.01);
    }

    #[test]
    fn a_uniform_model_has_the_vocabulary_as_perplexity() {
        let mut scores = Scores::default();
        for t in 0..10 {
            scores.add(&scored(&[0.25; 8], t % 8));
        }
        let r = scores.report(20, 1, 20);
        assert!((r.perplexity - 8.0).abs() < 1e-4, "{}", r.perplexity);
        assert_eq!(r.scored_tokens, 10);
        assert!(r.against.is_none());
    }

    #[test]
    fn a_comparison_counts_agreement_and_divergence() {
        let mut scores = Scores::default();
        let a = [2.0, 0.0, -1.0];
        let b = [0.0, 2.0, -1.0];
        scores.add_pair(&scored(&a, 0), &scored(&a, 0));
        scores.add_pair(&scored(&b, 0), &scored(&a, 0));
        let r = scores.report(8, 1, 8);
        let c = r.against.expect("a comparison");
        assert_eq!(c.top1_agreement, 0.5);
        assert_eq!(c.kld_median, 0.0);
        assert!(c.kld_max > 0.5 && c.kld_max == c.kld_p99);
        assert!(c.base_perplexity < r.perplexity);
    }

    #[test]
    fn windows_repeat_the_prefix_and_drop_the_tail() {
        let t = Tokens {
            prefix: vec![1],
            body: (10..20).collect(),
        };
        let w = t.windows(4).expect("windows");
        assert_eq!(
            w,
            vec![
                vec![1, 10, 11, 12],
                vec![1, 13, 14, 15],
                vec![1, 16, 17, 18]
            ]
        );
        assert!(t.windows(12).is_err());
        assert!(t.windows(2).is_err());
    }
}
