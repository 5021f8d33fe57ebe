//! The optimizer's hyper-parameters and the learning rate of each step.
//!
//! The schedule is a linear warmup to the learning rate over `warmup`
//! steps (step 0 at `lr / warmup`), then constant; without warmup every
//! step uses `lr`. The defaults are `torch.optim.AdamW`'s (β = 0.9, 0.999,
//! ε = 1e-8, λ = 0.01) with the clipping norm of HF's `Trainer` (1.0).
//!
//! The surprise: the warmup's first step is at `lr / warmup`, not at zero
//! as in HF's `get_linear_schedule_with_warmup`: a step at learning rate
//! zero changes no weight and wastes a batch.

/// What `gerbil-train`'s optimizer flags set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hyperparameters {
    /// Peak learning rate.
    pub lr: f64,
    /// Steps of linear warmup (0: none).
    pub warmup: u64,
    /// AdamW's `β₁`, `β₂`.
    pub betas: (f64, f64),
    /// AdamW's `ε`.
    pub eps: f64,
    /// Decoupled weight decay `λ`.
    pub weight_decay: f64,
    /// The global gradient norm clipped to (`None`: no clipping).
    pub max_grad_norm: Option<f64>,
}

impl Default for Hyperparameters {
    fn default() -> Self {
        Hyperparameters {
            lr: 1e-3,
            warmup: 0,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
        }
    }
}

impl Hyperparameters {
    /// The learning rate of step `step` (from 0).
    pub fn lr_at(&self, step: u64) -> f64 {
        match self.warmup {
            0 => self.lr,
            w => self.lr * ((step + 1) as f64 / w as f64).min(1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warmup_climbs_linearly_then_holds() {
        let h = Hyperparameters {
            lr: 0.01,
            warmup: 4,
            ..Default::default()
        };
        let lrs: Vec<f64> = (0..6).map(|s| h.lr_at(s)).collect();
        assert_eq!(lrs, [0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01]);
        assert_eq!(Hyperparameters::default().lr_at(0), 1e-3);
    }
}
