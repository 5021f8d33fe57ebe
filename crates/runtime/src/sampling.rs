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

use crate::error::RuntimeError;

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
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Whether every choice is the argmax (temperature 0 or top-k 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// The 32-byte uniform the `sample_token` kernel reads: seed (low, high
    /// word), temperature (0 when greedy), top-k (0 = all; saturated to
    /// `u32::MAX`), top-p, min-p, two zero words.
    pub fn to_words(&self) -> [u32; 8] {
        let t = if self.is_greedy() {
            0.0
        } else {
            self.temperature
        };
        [
            self.seed as u32,
            (self.seed >> 32) as u32,
            t.to_bits(),
            u32::try_from(self.top_k).unwrap_or(u32::MAX),
            self.top_p.to_bits(),
            self.min_p.to_bits(),
            0,
            0,
        ]
    }
}

/// Index of the largest value; the lowest index wins ties; NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] || logits[best].is_nan() && !v.is_nan() {
            best = i;
        }
    }
    best as u32
}

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
    fn pcg(v: u32) -> u32 {
        let s = v.wrapping_mul(747_796_405).wrapping_add(2_891_336_453);
        let w = ((s >> ((s >> 28) + 4)) ^ s).wrapping_mul(277_803_737);
        (w >> 22) ^ w
    }
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

/// A validated sampling configuration.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
}

impl Sampler {
    /// A sampler; rejects a negative or non-finite temperature, top-p outside
    /// (0, 1] and min-p outside [0, 1].
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

    /// Picks the token that follows the token at `position`.
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
        }
    }

    #[test]
    fn argmax_prefers_lowest_id_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
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

    #[test]
    fn bad_settings_are_errors() {
        assert!(Sampler::new(params(-1.0, 0, 1.0, 0.0)).is_err());
        let e = Sampler::new(params(1.0, 0, 0.0, 0.0)).unwrap_err();
        assert!(e.to_string().contains("top-p"));
        let e = Sampler::new(params(1.0, 0, 1.0, 1.5)).unwrap_err();
        assert!(e.to_string().contains("min-p"));
    }
}
