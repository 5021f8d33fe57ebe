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

/// A hyper-parameter no optimizer step can use, with the flag that sets it.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum HyperError {
    /// A value outside its range.
    #[error("{flag} {value} is out of range: {expected}")]
    OutOfRange {
        /// The command-line flag.
        flag: &'static str,
        /// The value given.
        value: f64,
        /// What it must be.
        expected: &'static str,
    },
}

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
    /// Checks every value against its range, as PyTorch's `AdamW` and
    /// `clip_grad_norm_` would accept it (a clipping norm of 0 zeroes every
    /// gradient there, which no run wants, so it is refused here).
    pub fn check(&self) -> Result<(), HyperError> {
        let out = |flag, value, expected| HyperError::OutOfRange {
            flag,
            value,
            expected,
        };
        let finite = |v: f64| v.is_finite();
        if !(finite(self.lr) && self.lr > 0.0) {
            return Err(out("--lr", self.lr, "a positive number, such as 1e-4"));
        }
        for (flag, beta) in [
            ("--betas (first)", self.betas.0),
            ("--betas (second)", self.betas.1),
        ] {
            if !(0.0..1.0).contains(&beta) {
                return Err(out(flag, beta, "at least 0 and below 1, such as 0.9,0.999"));
            }
        }
        if !(finite(self.eps) && self.eps > 0.0) {
            return Err(out("--eps", self.eps, "a positive number, such as 1e-8"));
        }
        if !(finite(self.weight_decay) && self.weight_decay >= 0.0) {
            return Err(out("--weight-decay", self.weight_decay, "0 or more"));
        }
        match self.max_grad_norm {
            Some(g) if g.is_nan() || g <= 0.0 => {
                Err(out("--max-grad-norm", g, "a positive number, such as 1.0"))
            }
            _ => Ok(()),
        }
    }

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
    fn values_out_of_range_name_their_flag() {
        assert_eq!(Hyperparameters::default().check(), Ok(()));
        let bad = |h: Hyperparameters| h.check().unwrap_err().to_string();
        let d = Hyperparameters::default();
        assert!(bad(Hyperparameters { lr: 0.0, ..d }).starts_with("--lr 0 is out of range"));
        let err = bad(Hyperparameters {
            betas: (0.9, 1.0),
            ..d
        });
        assert!(
            err.starts_with("--betas (second) 1 is out of range"),
            "{err}"
        );
        assert!(bad(Hyperparameters { eps: f64::NAN, ..d }).starts_with("--eps NaN"));
        assert!(bad(Hyperparameters {
            weight_decay: -0.1,
            ..d
        })
        .starts_with("--weight-decay -0.1"));
        let err = bad(Hyperparameters {
            max_grad_norm: Some(0.0),
            ..d
        });
        assert!(err.starts_with("--max-grad-norm 0"), "{err}");
        let unclipped = Hyperparameters {
            max_grad_norm: None,
            ..d
        };
        assert_eq!(unclipped.check(), Ok(()));
    }

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
