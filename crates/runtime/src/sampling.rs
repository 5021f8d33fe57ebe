//! Choosing the next token from logits: greedy or seeded sampling with
//! temperature, top-k and top-p, on the CPU.

use crate::error::RuntimeError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How to pick tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax, lowest id wins a tie).
    pub temperature: f32,
    /// Keep only the `k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `p` (1 = all).
    pub top_p: f32,
    /// Random seed; the same seed gives the same tokens.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
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

/// A seeded sampler.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    /// A sampler; rejects negative temperature, top-p outside (0, 1].
    pub fn new(params: SamplingParams) -> Result<Sampler, RuntimeError> {
        if params.temperature.is_nan()
            || params.temperature < 0.0
            || params.temperature.is_infinite()
        {
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
        Ok(Sampler {
            params,
            rng: StdRng::seed_from_u64(params.seed),
        })
    }

    /// Whether every choice is the argmax (temperature 0 or top-k 1).
    pub fn is_greedy(&self) -> bool {
        self.params.temperature == 0.0 || self.params.top_k == 1
    }

    /// Picks the next token.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = self.params;
        if self.is_greedy() {
            return argmax(logits);
        }
        let k = if p.top_k == 0 { logits.len() } else { p.top_k };
        let cands = top_logits(logits, k);
        let max = cands[0].1;
        let mut probs: Vec<f64> = cands
            .iter()
            .map(|&(_, l)| (f64::from(l - max) / f64::from(p.temperature)).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, &x) in probs.iter().enumerate() {
                acc += x;
                if acc >= f64::from(p.top_p) {
                    keep = i + 1;
                    break;
                }
            }
        }
        let total: f64 = probs[..keep].iter().sum();
        let mut r = self.rng.random::<f64>() * total;
        for i in 0..keep {
            r -= probs[i];
            if r <= 0.0 {
                return cands[i].0;
            }
        }
        cands[keep - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 5,
            top_p: 1.0,
            seed: 7,
        };
        let run = || {
            let mut s = Sampler::new(params).unwrap();
            (0..20).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        let allowed: Vec<u32> = top_logits(&logits, 5).iter().map(|x| x.0).collect();
        assert!(a.iter().all(|t| allowed.contains(t)));
        assert!(a.iter().collect::<std::collections::HashSet<_>>().len() > 1);
    }

    #[test]
    fn bad_settings_are_errors() {
        let bad = SamplingParams {
            temperature: -1.0,
            ..Default::default()
        };
        assert!(Sampler::new(bad).is_err());
        let bad = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        };
        assert!(Sampler::new(bad).unwrap_err().to_string().contains("top-p"));
    }
}
