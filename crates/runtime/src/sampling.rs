//! Choosing the next token from logits: greedy, or seeded sampling with
//! temperature, top-k, top-p and min-p — the same choice on the CPU as the
//! plan's `sample_token` kernel makes on the GPU.
//!
//! Sampling is the Gumbel-max trick: among the kept tokens, the one with the
//! largest `logit / T + g` wins, where `g = −ln(−ln u)` and `u` is a hash of
//! (seed, position, token id) — an exact draw from the softmax of the kept
//! logits at temperature `T`, with no sequential random state. So the GPU can
//! sample many steps ahead, a batch size never changes the tokens, and the
//! same seed gives the same tokens on every device (up to float rounding at
//! a near-tie). The kept tokens are those at or above a threshold: the k-th
//! largest logit (top-k); then the largest logit such that the tokens
//! at or above it still hold `top_p` of the kept probability (top-p); then
//! `max + T·ln(min_p)` (min-p) — transformers' order. Tokens tied at a threshold are all kept. NaN
//! logits are never kept or chosen.
//!
//! Penalties run on the CPU only, before all of that (greedy included): the
//! repetition penalty of transformers over every id of the context, then the
//! presence and frequency penalties of OpenAI over the generated ids. The
//! caller keeps a [`TokenHistory`] up to date and calls
//! [`Sampler::sample_with_history`]; a step touches only the ids the history
//! holds, never the whole vocabulary. The GPU's `sample_token` kernel knows
//! nothing of penalties, so [`crate::Session::can_sample_on_gpu`] says no
//! when they are on and generation reads every step's logits back.

use crate::error::RuntimeError;
use gerbil_plan::sampling::{pcg, SamplingUniform};
use std::collections::HashMap;

/// How to pick tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax, lowest id wins a tie).
    pub temperature: f32,
    /// Keep only the `k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the most likely tokens whose probability adds up to `p` (1 = all).
    pub top_p: f32,
    /// Keep tokens at least `min_p` times as likely as the most likely (0 = all).
    pub min_p: f32,
    /// Random seed; the same seed gives the same tokens.
    pub seed: u64,
    /// transformers' repetition penalty `p > 0` (1 = off): the logit `l` of
    /// every id already in the context (prompt and generated) becomes
    /// `l / p` when `l > 0`, else `l · p`.
    pub repetition_penalty: f32,
    /// OpenAI's presence penalty in [−2, 2] (0 = off): subtracted once from
    /// the logit of every id generated so far.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty in [−2, 2] (0 = off): subtracted from the
    /// logit of every generated id as many times as it was generated.
    pub frequency_penalty: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        }
    }
}

impl SamplingParams {
    /// Whether every choice is the argmax (temperature 0 or top-k 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Whether any penalty is on (they need the CPU: see
    /// [`crate::Session::can_sample_on_gpu`]).
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// The 32-byte uniform the `sample_token` kernel reads: seed (low, high
    /// word), temperature (0 when greedy), top-k (0 = all; saturated to
    /// `u32::MAX`), top-p, min-p, two zero words. Penalties are not in it.
    pub fn to_words(&self) -> [u32; 8] {
        let temperature = if self.is_greedy() {
            0.0
        } else {
            self.temperature
        };
        SamplingUniform {
            seed: self.seed,
            temperature,
            top_k: u32::try_from(self.top_k).unwrap_or(u32::MAX),
            top_p: self.top_p,
            min_p: self.min_p,
        }
        .to_words()
    }
}

/// Index of the largest value; the lowest index wins ties; NaN never wins
/// (0 when every value is NaN).
///
/// Two passes the compiler vectorizes: the largest value, in [`LANES`]
/// independent maxima (`f32::max` passes over NaN), then its first index.
/// A batch step chooses 16 rows of a 128,256-token vocabulary this way
/// each step, where a one-pass loop comparing each value with the best so
/// far took 9× as long (260 µs a row on a 2-core CI machine).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = logits.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = m.max(v);
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    // Only NaN compares unequal to the maximum; when all are NaN, none
    // matches and 0 wins.
    logits.iter().position(|&v| v == max).unwrap_or(0) as u32
}

/// Independent maxima of [`argmax`]'s first pass.
const LANES: usize = 16;

/// The `k` largest logits as `(id, logit)`, largest first, ties by lower id.
pub fn top_logits(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let k = k.min(ids.len());
    if k < ids.len() && k > 0 {
        ids.select_nth_unstable_by(k - 1, cmp);
        ids.truncate(k);
    }
    ids.sort_by(cmp);
    ids.truncate(k);
    ids.into_iter().map(|i| (i, logits[i as usize])).collect()
}

/// 32 well-mixed bits of `(seed, position, id)`: the kernel's `mix`, word
/// for word (a PCG output permutation over a running state).
pub fn hash(seed: u64, position: u32, id: u32) -> u32 {
    let mut h = pcg(seed as u32);
    h = pcg(h ^ (seed >> 32) as u32);
    h = pcg(h ^ position);
    pcg(h ^ id)
}

/// The Gumbel noise `−ln(−ln u)` of token `id` at `position`, with `u` in
/// (0, 1) from 24 bits of [`hash`].
pub fn gumbel(seed: u64, position: u32, id: u32) -> f32 {
    let u = ((hash(seed, position, id) >> 8) as f32 + 0.5) / 16_777_216.0;
    -(-u.ln()).ln()
}

/// The tokens the penalties look at: every distinct id of the context (the
/// prompt and what was generated) and how many times each was generated.
/// Start it with the prompt, push each generated token, and hand it to
/// [`Sampler::sample_with_history`]. Memory and time per step grow with the
/// distinct ids, not with the vocabulary.
#[derive(Clone, Debug, Default)]
pub struct TokenHistory {
    /// Distinct ids of the context → times generated (0: prompt only).
    counts: HashMap<u32, u32>,
}

impl TokenHistory {
    /// A history holding `prompt` (tokens that count for the repetition
    /// penalty only).
    pub fn with_prompt(prompt: &[u32]) -> TokenHistory {
        let mut history = TokenHistory::default();
        history.push_prompt(prompt);
        history
    }

    /// Adds context tokens that were not generated (a prompt, a chat turn's
    /// new input): the repetition penalty sees them, presence and frequency
    /// do not.
    pub fn push_prompt(&mut self, tokens: &[u32]) {
        for &t in tokens {
            self.counts.entry(t).or_insert(0);
        }
    }

    /// Adds a generated token: every penalty sees it.
    pub fn push_generated(&mut self, token: u32) {
        *self.counts.entry(token).or_insert(0) += 1;
    }

    /// Forgets every token (a new conversation).
    pub fn clear(&mut self) {
        self.counts.clear();
    }
}

/// A validated sampling configuration.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
}

impl Sampler {
    /// A sampler; rejects a negative or non-finite temperature, top-p outside
    /// (0, 1], min-p outside [0, 1], a repetition penalty that is not a
    /// finite number > 0, and presence or frequency penalties outside
    /// [−2, 2].
    pub fn new(params: SamplingParams) -> Result<Sampler, RuntimeError> {
        if !params.temperature.is_finite() || params.temperature < 0.0 {
            return Err(RuntimeError::Sampling(format!(
                "temperature must be ≥ 0, got {}",
                params.temperature
            )));
        }
        if params.top_p.is_nan() || params.top_p <= 0.0 || params.top_p > 1.0 {
            return Err(RuntimeError::Sampling(format!(
                "top-p must be in (0, 1], got {}",
                params.top_p
            )));
        }
        if params.min_p.is_nan() || !(0.0..=1.0).contains(&params.min_p) {
            return Err(RuntimeError::Sampling(format!(
                "min-p must be in [0, 1], got {}",
                params.min_p
            )));
        }
        let p = params.repetition_penalty;
        if !p.is_finite() || p <= 0.0 {
            return Err(RuntimeError::Sampling(format!(
                "--repetition-penalty must be a finite number > 0 (1 = off), got {p}"
            )));
        }
        for (flag, v) in [
            ("--presence-penalty", params.presence_penalty),
            ("--frequency-penalty", params.frequency_penalty),
        ] {
            if v.is_nan() || !(-2.0..=2.0).contains(&v) {
                return Err(RuntimeError::Sampling(format!(
                    "{flag} must be in [-2, 2] (0 = off), got {v}"
                )));
            }
        }
        Ok(Sampler { params })
    }

    /// The settings.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether every choice is the argmax (temperature 0 or top-k 1).
    pub fn is_greedy(&self) -> bool {
        self.params.is_greedy()
    }

    /// Applies the penalties to `logits` in place (nothing when they are
    /// off): for each id of `history`, the repetition penalty, then minus the
    /// presence penalty if it was generated and the frequency penalty times
    /// the times it was generated (vLLM's order). Ids outside `logits` are
    /// skipped.
    pub fn penalize(&self, logits: &mut [f32], history: &TokenHistory) {
        let p = &self.params;
        if !p.has_penalties() {
            return;
        }
        let rep = p.repetition_penalty;
        for (&id, &generated) in &history.counts {
            let Some(l) = logits.get_mut(id as usize) else {
                continue;
            };
            if rep != 1.0 {
                *l = if *l < 0.0 { *l * rep } else { *l / rep };
            }
            if generated > 0 {
                *l -= p.presence_penalty + p.frequency_penalty * generated as f32;
            }
        }
    }

    /// Picks the token that follows the token at `position` after the
    /// penalties: [`Sampler::penalize`] (which leaves the penalized logits in
    /// `logits`), then [`Sampler::sample`].
    pub fn sample_with_history(
        &self,
        logits: &mut [f32],
        position: u32,
        history: &TokenHistory,
    ) -> u32 {
        self.penalize(logits, history);
        self.sample(logits, position)
    }

    /// Picks the token that follows the token at `position`, with no
    /// penalties (see [`Sampler::sample_with_history`]).
    pub fn sample(&self, logits: &[f32], position: u32) -> u32 {
        let p = self.params;
        if p.is_greedy() {
            return argmax(logits);
        }
        let inv_t = 1.0 / p.temperature;
        let max = logits
            .iter()
            .copied()
            .filter(|v| !v.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            return argmax(logits);
        }
        let mut floor = f32::NEG_INFINITY;
        if p.top_k > 0 && p.top_k < logits.len() {
            floor = floor.max(kth_largest(logits, p.top_k));
        }
        if p.top_p < 1.0 {
            floor = floor.max(top_p_floor(logits, floor, max, inv_t, p.top_p));
        }
        if p.min_p > 0.0 {
            floor = floor.max(max + p.temperature * p.min_p.ln());
        }
        let mut best: Option<(f32, u32)> = None;
        for (i, &l) in logits.iter().enumerate() {
            if l.is_nan() || l < floor {
                continue;
            }
            let v = (l - max) * inv_t + gumbel(p.seed, position, i as u32);
            if best.is_none_or(|(b, _)| v > b) {
                best = Some((v, i as u32));
            }
        }
        best.map_or_else(|| argmax(logits), |(_, i)| i)
    }
}

/// The `k`-th largest logit that is not NaN (`k ≥ 1`), or −∞ if fewer
/// than `k` are not NaN.
fn kth_largest(logits: &[f32], k: usize) -> f32 {
    let mut kept: Vec<f32> = logits.iter().copied().filter(|l| !l.is_nan()).collect();
    if kept.len() < k {
        return f32::NEG_INFINITY;
    }
    kept.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    kept[k - 1]
}

/// The smallest logit `θ ≥ floor` such that the tokens at or above `θ` hold
/// at least `top_p` of the probability of the tokens at or above `floor`.
fn top_p_floor(logits: &[f32], floor: f32, max: f32, inv_t: f32, top_p: f32) -> f32 {
    let mut kept: Vec<f32> = logits
        .iter()
        .copied()
        .filter(|&l| !l.is_nan() && l >= floor)
        .collect();
    kept.sort_by(|a, b| b.total_cmp(a));
    let weight = |l: f32| f64::from(((l - max) * inv_t).exp());
    let total: f64 = kept.iter().map(|&l| weight(l)).sum();
    let mut acc = 0.0;
    for (i, &l) in kept.iter().enumerate() {
        acc += weight(l);
        // Ties with the next value stay together.
        if acc >= f64::from(top_p) * total && kept.get(i + 1) != Some(&l) {
            return l;
        }
    }
    floor
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: 7,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn argmax_prefers_lowest_id_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
    }

    /// The two-pass argmax against the definition, one comparison at a
    /// time, over rows of every length around the lanes with ties, NaN,
    /// infinities and signed zeros.
    #[test]
    fn argmax_is_the_first_largest_value_that_is_not_nan() {
        fn definition(logits: &[f32]) -> u32 {
            let mut best = 0usize;
            for (i, &v) in logits.iter().enumerate() {
                if v > logits[best] || logits[best].is_nan() && !v.is_nan() {
                    best = i;
                }
            }
            best as u32
        }
        let pool = [
            f32::NAN,
            f32::NEG_INFINITY,
            f32::INFINITY,
            -0.0,
            0.0,
            -1.5,
            2.0,
            2.0,
            7.25,
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for len in (0..70).chain([1000, 4097]) {
            for _ in 0..50 {
                let row: Vec<f32> = (0..len)
                    .map(|_| {
                        state = state
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        pool[(state >> 33) as usize % pool.len()]
                    })
                    .collect();
                assert_eq!(argmax(&row), definition(&row), "{row:?}");
            }
        }
        assert_eq!(argmax(&[f32::NAN; 20]), 0);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn top_logits_sorted_and_whole_vocab() {
        let l = [0.5, 2.0, -1.0, 2.0];
        assert_eq!(top_logits(&l, 2), vec![(1, 2.0), (3, 2.0)]);
        assert_eq!(top_logits(&l, 10).len(), 4);
    }

    #[test]
    fn seeded_sampling_is_deterministic_and_respects_top_k() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let s = Sampler::new(params(1.0, 5, 1.0, 0.0)).unwrap();
        let run = || (0..40).map(|p| s.sample(&logits, p)).collect::<Vec<_>>();
        let a = run();
        assert_eq!(a, run());
        let allowed: Vec<u32> = top_logits(&logits, 5).iter().map(|x| x.0).collect();
        assert!(a.iter().all(|t| allowed.contains(t)));
        assert!(a.iter().collect::<std::collections::HashSet<_>>().len() > 1);
    }

    /// Frequencies over many positions follow the softmax at temperature T
    /// (Gumbel-max is exact): within 4 standard deviations per token.
    #[test]
    fn sampling_follows_the_softmax() {
        let logits = [1.0f32, 0.0, 2.0, -1.0, 0.5];
        let t = 0.8;
        let s = Sampler::new(params(t, 0, 1.0, 0.0)).unwrap();
        let n = 40_000u32;
        let mut count = [0u32; 5];
        for p in 0..n {
            count[s.sample(&logits, p) as usize] += 1;
        }
        let z: f64 = logits.iter().map(|&l| f64::from(l / t).exp()).sum();
        for (i, &c) in count.iter().enumerate() {
            let want = f64::from(logits[i] / t).exp() / z;
            let sd = (want * (1.0 - want) / f64::from(n)).sqrt();
            let got = f64::from(c) / f64::from(n);
            assert!((got - want).abs() < 4.0 * sd, "token {i}: {got} vs {want}");
        }
    }

    #[test]
    fn top_p_and_min_p_keep_the_likely_tokens() {
        // Probabilities at T = 1: ~0.64, 0.24, 0.09, 0.03.
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let seen = |p: SamplingParams| {
            let s = Sampler::new(p).unwrap();
            let mut set: Vec<u32> = (0..2000).map(|pos| s.sample(&logits, pos)).collect();
            set.sort_unstable();
            set.dedup();
            set
        };
        assert_eq!(seen(params(1.0, 0, 0.5, 0.0)), vec![0]);
        assert_eq!(seen(params(1.0, 0, 0.8, 0.0)), vec![0, 1]);
        assert_eq!(seen(params(1.0, 0, 1.0, 0.2)), vec![0, 1]);
        assert_eq!(seen(params(1.0, 0, 1.0, 0.1)), vec![0, 1, 2]);
        assert_eq!(seen(params(1.0, 3, 1.0, 0.0)), vec![0, 1, 2]);
    }

    #[test]
    fn nan_is_never_chosen() {
        let logits = [f32::NAN, 1.0, f32::NAN, 0.5];
        let s = Sampler::new(params(2.0, 0, 0.9, 0.0)).unwrap();
        assert!((0..500).all(|p| matches!(s.sample(&logits, p), 1 | 3)));
        assert_eq!(argmax(&logits), 1);
    }

    #[test]
    fn top_k_counts_only_tokens_that_are_not_nan() {
        let logits = [f32::NAN, 1.0, f32::NAN, 3.0, 2.0, f32::NAN];
        let s = Sampler::new(params(5.0, 2, 1.0, 0.0)).unwrap();
        let mut seen: Vec<u32> = (0..500).map(|p| s.sample(&logits, p)).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, vec![3, 4]);
        // Fewer than k tokens that are not NaN: all of them stay.
        let s = Sampler::new(params(5.0, 5, 1.0, 0.0)).unwrap();
        let mut seen: Vec<u32> = (0..500).map(|p| s.sample(&logits, p)).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, vec![1, 3, 4]);
    }

    fn penalties(repetition: f32, presence: f32, frequency: f32) -> SamplingParams {
        SamplingParams {
            repetition_penalty: repetition,
            presence_penalty: presence,
            frequency_penalty: frequency,
            ..SamplingParams::default()
        }
    }

    fn assert_close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() < 1e-6, "logit {i}: {g} vs {w} ({got:?})");
        }
    }

    const LOGITS: [f32; 6] = [1.7, -0.9, 2.4, -3.1, 0.6, 1.2];

    /// transformers' rule: a positive logit is divided by the penalty, a
    /// negative one multiplied, so both become less likely; ids not in the
    /// context are untouched.
    #[test]
    fn repetition_penalty_follows_the_sign_rule() {
        let s = Sampler::new(penalties(1.5, 0.0, 0.0)).unwrap();
        let mut l = LOGITS;
        s.penalize(&mut l, &TokenHistory::with_prompt(&[0, 1, 3, 0]));
        assert_close(&l, &[1.7 / 1.5, -1.35, 2.4, -4.65, 0.6, 1.2]);
        // Generated tokens count too, once each however often they appear.
        let mut h = TokenHistory::default();
        h.push_generated(2);
        h.push_generated(2);
        let mut l = LOGITS;
        s.penalize(&mut l, &h);
        assert_close(&l, &[1.7, -0.9, 1.6, -3.1, 0.6, 1.2]);
    }

    /// Presence subtracts once per generated id, frequency once per time it
    /// was generated; prompt tokens are not counted. With a repetition
    /// penalty, it divides first.
    #[test]
    fn presence_and_frequency_count_generated_tokens() {
        let mut h = TokenHistory::with_prompt(&[1, 4]);
        for t in [2, 4, 2, 2] {
            h.push_generated(t);
        }
        let mut l = LOGITS;
        Sampler::new(penalties(1.0, 0.5, 0.25))
            .unwrap()
            .penalize(&mut l, &h);
        // 2: 2.4 − 0.5 − 3·0.25; 4: 0.6 − 0.5 − 0.25; 1 (prompt only) unchanged.
        assert_close(&l, &[1.7, -0.9, 1.15, -3.1, -0.15, 1.2]);
        let mut l = LOGITS;
        Sampler::new(penalties(1.5, 0.5, 0.25))
            .unwrap()
            .penalize(&mut l, &h);
        assert_close(&l, &[1.7, -1.35, 0.35, -3.1, -0.35, 1.2]);
        // Negative penalties make generated tokens more likely.
        let mut l = LOGITS;
        Sampler::new(penalties(1.0, -1.0, -0.5))
            .unwrap()
            .penalize(&mut l, &h);
        assert_close(&l, &[1.7, -0.9, 4.9, -3.1, 2.1, 1.2]);
    }

    #[test]
    fn penalties_off_or_out_of_range_ids_leave_logits_alone() {
        let h = TokenHistory::with_prompt(&[0, 2, 5, 99]);
        let mut l = LOGITS;
        Sampler::new(SamplingParams::default())
            .unwrap()
            .penalize(&mut l, &h);
        assert_eq!(l.map(f32::to_bits), LOGITS.map(f32::to_bits));
        // Id 99 is past the vocabulary: skipped, no panic.
        let mut l = LOGITS;
        Sampler::new(penalties(2.0, 0.0, 0.0))
            .unwrap()
            .penalize(&mut l, &h);
        assert_close(&l, &[0.85, -0.9, 1.2, -3.1, 0.6, 0.6]);
    }

    /// Greedy decoding takes the argmax of the penalized logits.
    #[test]
    fn greedy_with_repetition_penalty_changes_the_argmax() {
        let logits = [1.7f32, -0.9, 2.4, -3.1, 0.6, 2.0];
        let h = TokenHistory::with_prompt(&[2, 3]);
        let greedy = |p: SamplingParams| {
            let mut l = logits;
            Sampler::new(p).unwrap().sample_with_history(&mut l, 9, &h)
        };
        assert_eq!(greedy(SamplingParams::default()), 2);
        // 2.4 / 1.1 ≈ 2.18 still beats 2.0; 2.4 / 1.3 ≈ 1.85 does not.
        assert_eq!(greedy(penalties(1.1, 0.0, 0.0)), 2);
        assert_eq!(greedy(penalties(1.3, 0.0, 0.0)), 5);
        // A penalty below 1 favours the context: 2.4 / 0.5 = 4.8 wins more
        // clearly, and −3.1 · 0.5 = −1.55 rises.
        assert_eq!(greedy(penalties(0.5, 0.0, 0.0)), 2);
    }

    /// Sampling draws from the penalized logits: a heavily penalized token
    /// is never drawn although it is the likeliest without penalties.
    #[test]
    fn sampling_draws_from_penalized_logits() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let top = argmax(&logits);
        let mut h = TokenHistory::default();
        for _ in 0..40 {
            h.push_generated(top);
        }
        let p = SamplingParams {
            temperature: 1.0,
            seed: 3,
            ..penalties(1.0, 0.0, 2.0)
        };
        let s = Sampler::new(p).unwrap();
        let plain = (0..500)
            .filter(|&pos| s.sample(&logits, pos) == top)
            .count();
        assert!(plain > 10, "{plain}");
        let penalized = (0..500)
            .filter(|&pos| s.sample_with_history(&mut logits.clone(), pos, &h) == top)
            .count();
        assert_eq!(penalized, 0);
    }

    #[test]
    fn bad_penalties_are_errors_naming_the_flag() {
        for (p, flag) in [
            (penalties(0.0, 0.0, 0.0), "--repetition-penalty"),
            (penalties(-1.2, 0.0, 0.0), "--repetition-penalty"),
            (penalties(f32::NAN, 0.0, 0.0), "--repetition-penalty"),
            (penalties(f32::INFINITY, 0.0, 0.0), "--repetition-penalty"),
            (penalties(1.0, 2.5, 0.0), "--presence-penalty"),
            (penalties(1.0, f32::NAN, 0.0), "--presence-penalty"),
            (penalties(1.0, 0.0, -2.1), "--frequency-penalty"),
            (penalties(1.0, 0.0, f32::INFINITY), "--frequency-penalty"),
        ] {
            let e = Sampler::new(p).unwrap_err().to_string();
            assert!(e.contains(flag), "{p:?}: {e}");
        }
        assert!(Sampler::new(penalties(1.3, -2.0, 2.0)).is_ok());
        assert!(penalties(1.3, 0.0, 0.0).has_penalties());
        assert!(penalties(1.0, 0.0, 0.1).has_penalties());
        assert!(!SamplingParams::default().has_penalties());
    }

    #[test]
    fn bad_settings_are_errors() {
        assert!(Sampler::new(params(-1.0, 0, 1.0, 0.0)).is_err());
        let e = Sampler::new(params(1.0, 0, 0.0, 0.0)).unwrap_err();
        assert!(e.to_string().contains("top-p"));
        let e = Sampler::new(params(1.0, 0, 1.0, 1.5)).unwrap_err();
        assert!(e.to_string().contains("min-p"));
    }
}
