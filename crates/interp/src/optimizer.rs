//! The optimizer step a trainer takes after each batch's gradients, in f64:
//! global-norm gradient clipping as `torch.nn.utils.clip_grad_norm_` does
//! it ([`clip_grad_norm`]) and AdamW as `torch.optim.AdamW` does it
//! ([`AdamW::step`]: decoupled weight decay, bias correction).
//!
//! It is the oracle of the GPU optimizer, the way [`mod@crate::gradient`]
//! is of the backward kernels: `tests/e2e/training.rs` trains every tiny
//! decoder with it on the interpreter and compares the losses with
//! PyTorch's recorded ones (`scripts/make-train-refs.py`).
//!
//! The surprise: PyTorch's clipping divides by `norm + 1e-6`, not by
//! `max(norm, 1e-6)`, so a gradient whose norm is exactly the limit is
//! still scaled (by a hair); this does the same.

/// AdamW's hyper-parameters (the learning rate is given per step).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// `β₁`, the first moment's decay.
    pub beta1: f64,
    /// `β₂`, the second moment's decay.
    pub beta2: f64,
    /// Added to the second moment's root.
    pub eps: f64,
    /// Decoupled weight decay: each step multiplies a weight by `1 − lr·λ`.
    pub weight_decay: f64,
}

/// The moments of every tensor an [`AdamW`] updates, and the steps taken.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdamWState {
    /// Steps taken so far.
    pub steps: u64,
    /// First moments, one per tensor (empty until the first step).
    pub m: Vec<Vec<f64>>,
    /// Second moments, one per tensor.
    pub v: Vec<Vec<f64>>,
    /// Whether the moments are stored in 8 bits ([`quantize_moments`]):
    /// after each step they keep only the values their bytes hold.
    pub eight_bit: bool,
}

/// Moments per block of the 8-bit state: a block shares one scale per moment.
pub const STATE_BLOCK: usize = 256;

impl AdamWState {
    /// A state whose moments are stored in 8 bits.
    pub fn eight_bit() -> Self {
        AdamWState {
            eight_bit: true,
            ..Default::default()
        }
    }
}

/// The 8-bit state's rounding of one tensor's moments, in place: per block
/// of [`STATE_BLOCK`], `m` as `round(m / max|m| · 127)` (a signed byte) and
/// `√v` as `round(√v / max √v · 255)` (an unsigned byte, so small second
/// moments keep their relative precision), each block with its two
/// scales; the values become what those bytes and scales decode to. Ties
/// round to even, as WGSL's `round`.
pub fn quantize_moments(m: &mut [f64], v: &mut [f64]) {
    for (m, v) in m.chunks_mut(STATE_BLOCK).zip(v.chunks_mut(STATE_BLOCK)) {
        let ms = m.iter().fold(0.0f64, |a, x| a.max(x.abs()));
        let vs = v.iter().fold(0.0f64, |a, x| a.max(x.sqrt()));
        for x in m.iter_mut() {
            *x = if ms > 0.0 {
                (*x / ms * 127.0).round_ties_even() * ms / 127.0
            } else {
                0.0
            };
        }
        for x in v.iter_mut() {
            let r = if vs > 0.0 {
                (x.sqrt() / vs * 255.0).round_ties_even() * vs / 255.0
            } else {
                0.0
            };
            *x = r * r;
        }
    }
}

impl AdamW {
    /// One step at learning rate `lr` over `params` and their `grads` (in
    /// the same order at every step):
    /// `w ← w·(1 − lr·λ)`, `m ← β₁m + (1 − β₁)g`, `v ← β₂v + (1 − β₂)g²`,
    /// `w ← w − lr/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)`.
    pub fn step(
        &self,
        state: &mut AdamWState,
        lr: f64,
        params: &mut [&mut Vec<f64>],
        grads: &[Vec<f64>],
    ) {
        assert_eq!(params.len(), grads.len(), "a gradient per tensor");
        if state.m.is_empty() {
            state.m = grads.iter().map(|g| vec![0.0; g.len()]).collect();
            state.v = state.m.clone();
        }
        state.steps += 1;
        let t = state.steps as i32;
        let step_size = lr / (1.0 - self.beta1.powi(t));
        let root_correction = (1.0 - self.beta2.powi(t)).sqrt();
        for (i, (w, g)) in params.iter_mut().zip(grads).enumerate() {
            let (m, v) = (&mut state.m[i], &mut state.v[i]);
            for j in 0..g.len() {
                w[j] *= 1.0 - lr * self.weight_decay;
                m[j] = self.beta1 * m[j] + (1.0 - self.beta1) * g[j];
                v[j] = self.beta2 * v[j] + (1.0 - self.beta2) * g[j] * g[j];
                w[j] -= step_size * m[j] / (v[j].sqrt() / root_correction + self.eps);
            }
            if state.eight_bit {
                quantize_moments(m, v);
            }
        }
    }
}

/// Scales `grads` so that their global L2 norm is at most `max_norm`, as
/// `torch.nn.utils.clip_grad_norm_`: by `min(1, max_norm / (norm + 1e-6))`.
/// Returns the norm before clipping.
pub fn clip_grad_norm(grads: &mut [Vec<f64>], max_norm: f64) -> f64 {
    let norm = grads.iter().flatten().map(|g| g * g).sum::<f64>().sqrt();
    let scale = (max_norm / (norm + 1e-6)).min(1.0);
    if scale < 1.0 {
        grads.iter_mut().flatten().for_each(|g| *g *= scale);
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_step_moves_each_weight_by_the_learning_rate() {
        // Bias correction makes step 1's m̂/√v̂ = g/|g| (eps aside).
        let opt = AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 0.0,
            weight_decay: 0.0,
        };
        let mut state = AdamWState::default();
        let mut w = vec![1.0, -2.0, 0.5];
        opt.step(&mut state, 0.1, &mut [&mut w], &[vec![3.0, -0.25, 1e-3]]);
        let want = [0.9, -1.9, 0.4];
        for (a, b) in w.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{w:?}");
        }
        assert_eq!(state.steps, 1);
    }

    #[test]
    fn weight_decay_is_decoupled_from_the_gradient() {
        let opt = AdamW {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.5,
        };
        let mut w = vec![2.0];
        opt.step(&mut AdamWState::default(), 0.1, &mut [&mut w], &[vec![0.0]]);
        // A zero gradient leaves only the decay: 2 · (1 − 0.1 · 0.5).
        assert!((w[0] - 1.9).abs() < 1e-12, "{w:?}");
    }

    #[test]
    fn the_eight_bit_state_keeps_a_block_s_largest_moment_exactly() {
        let mut m: Vec<f64> = (0..300).map(|i| (f64::from(i) * 0.37).sin()).collect();
        let mut v: Vec<f64> = (0..300)
            .map(|i| (f64::from(i) * 0.11).cos().powi(2))
            .collect();
        let (m0, v0) = (m.clone(), v.clone());
        quantize_moments(&mut m, &mut v);
        for (block, (m, m0)) in m.chunks(256).zip(m0.chunks(256)).enumerate() {
            let max = m0.iter().fold(0.0f64, |a, x| a.max(x.abs()));
            let err = m
                .iter()
                .zip(m0)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            // Half a step of 127 over the block's largest magnitude.
            assert!(err <= max / 254.0 + 1e-15, "block {block}: {err}");
            assert!(m.iter().any(|x| (x.abs() - max).abs() < 1e-15));
        }
        for (a, b) in v.iter().zip(&v0) {
            assert!((a.sqrt() - b.sqrt()).abs() <= 1.0 / 510.0 + 1e-15);
        }
    }

    #[test]
    fn clipping_scales_only_norms_over_the_limit() {
        let mut grads = vec![vec![3.0], vec![4.0]];
        let norm = clip_grad_norm(&mut grads, 1.0);
        assert!((norm - 5.0).abs() < 1e-12);
        let clipped = (grads[0][0].powi(2) + grads[1][0].powi(2)).sqrt();
        assert!((clipped - 5.0 / (5.0 + 1e-6)).abs() < 1e-12, "{clipped}");
        let mut small = vec![vec![0.3, 0.4]];
        assert!((clip_grad_norm(&mut small, 1.0) - 0.5).abs() < 1e-12);
        assert_eq!(small, vec![vec![0.3, 0.4]]);
    }
}
