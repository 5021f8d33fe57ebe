//! RoPE inverse frequencies, computed the way transformers computes them.
//!
//! [`rope_frequencies`] turns a [`RopeParameters`] into the `inv_freq` vector
//! and attention scaling that [`gerbil_ir::WeightSource::RopeTable`] stores.
//! Each step mirrors one PyTorch f32 operation of transformers'
//! `_compute_*_rope_parameters`, in the same order, so results match bit for
//! bit except for `theta ** (2i/dim)`: we round the f64 power to f32 (the
//! correctly rounded value), while PyTorch's CPU kernel uses SLEEF's
//! `powf_u10` on vector lanes, which may be one ulp away.
//!
//! Python scalars meeting an f32 tensor are cast to f32 first (PyTorch's type
//! promotion), and `scalar / tensor` is `tensor.reciprocal() * scalar`
//! (`Tensor.__rtruediv__`): both matter for the last bit.

use crate::config::RopeParameters;
use crate::error::{FrontendError, Result};
use std::path::Path;

/// RoPE types [`rope_frequencies`] implements.
pub const SUPPORTED_ROPE_TYPES: &[&str] = &["default", "linear", "llama3"];

/// Inverse frequencies and attention scaling of a RoPE table.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeFrequencies {
    /// `rotary_dim / 2` inverse frequencies.
    pub inv_freq: Vec<f32>,
    /// Multiplier of cos and sin (1 for the supported types).
    pub attention_scaling: f32,
}

/// Plain RoPE: `inv_freq[i] = 1 / theta^(2i/dim)` for `i < dim/2`.
///
/// As torch: the exponent is `(2i as f32) / (dim as f32)`, the base is
/// `theta` cast to f32, the power is taken in f64 and rounded to f32, and the
/// reciprocal is taken in f32.
pub fn default_inv_freq(theta: f64, dim: u32) -> Vec<f32> {
    let base = f64::from(theta as f32);
    (0..dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / dim as f32;
            let p = base.powf(f64::from(exponent)) as f32;
            1.0f32 / p
        })
        .collect()
}

/// `linear` RoPE: the default frequencies divided by `factor` (in f32).
pub fn linear_inv_freq(inv_freq: &[f32], factor: f64) -> Vec<f32> {
    let factor = factor as f32;
    inv_freq.iter().map(|&f| f / factor).collect()
}

/// `llama3` RoPE: transformers' `_compute_llama3_parameters` applied to the
/// default frequencies. Wavelengths above `original / low_freq_factor` are
/// divided by `factor`, those below `original / high_freq_factor` are kept,
/// and the ones between are interpolated.
pub fn llama3_inv_freq(
    inv_freq: &[f32],
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_max_position_embeddings: u64,
) -> Vec<f32> {
    let old_context_len = original_max_position_embeddings as f64;
    // Python floats, cast to f32 when compared with the f32 tensor.
    let low_freq_wavelen = (old_context_len / low_freq_factor) as f32;
    let high_freq_wavelen = (old_context_len / high_freq_factor) as f32;
    let two_pi = (2.0 * std::f64::consts::PI) as f32;
    let factor32 = factor as f32;
    let old32 = old_context_len as f32;
    let low32 = low_freq_factor as f32;
    let span32 = (high_freq_factor - low_freq_factor) as f32;
    inv_freq
        .iter()
        .map(|&f| {
            // wavelen = 2 * math.pi / inv_freq  ->  inv_freq.reciprocal() * 2π
            let wavelen = (1.0f32 / f) * two_pi;
            let scaled = if wavelen > low_freq_wavelen {
                f / factor32
            } else {
                f
            };
            // smooth = (old / wavelen - low) / (high - low)
            let smooth = ((1.0f32 / wavelen) * old32 - low32) / span32;
            let smoothed = (1.0f32 - smooth) * scaled / factor32 + smooth * scaled;
            // `~(wavelen < high) * ~(wavelen > low)`, written as torch does.
            #[allow(clippy::neg_cmp_op_on_partial_ord)]
            let is_medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
            if is_medium {
                smoothed
            } else {
                scaled
            }
        })
        .collect()
}

fn require(value: Option<f64>, key: &str, path: &Path) -> Result<f64> {
    let v = value.ok_or_else(|| FrontendError::Config {
        path: path.to_path_buf(),
        key: format!("rope_parameters.{key}"),
        why: "required by this rope_type but missing".to_string(),
    })?;
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(FrontendError::Config {
            path: path.to_path_buf(),
            key: format!("rope_parameters.{key}"),
            why: format!("{v} is not a positive number"),
        })
    }
}

/// The number of leading dimensions of each head that rotate:
/// `int(head_dim * partial_rotary_factor)`, which must be even and positive.
pub fn rotary_dim(params: &RopeParameters, head_dim: u32, path: &Path) -> Result<u32> {
    let factor = params.partial_rotary_factor.unwrap_or(1.0);
    let dim = (f64::from(head_dim) * factor).floor();
    if !(factor > 0.0 && factor <= 1.0) || dim < 2.0 || !(dim as u32).is_multiple_of(2) {
        return Err(FrontendError::Config {
            path: path.to_path_buf(),
            key: "partial_rotary_factor".to_string(),
            why: format!(
                "{factor} × head_dim {head_dim} must give an even rotary dimension between 2 and head_dim"
            ),
        });
    }
    Ok(dim as u32)
}

/// Frequencies for a rotary dimension of `rotary_dim` with base `theta`
/// (the family resolves a missing `rope_theta` to its default first).
/// `path` names the config file in errors.
pub fn rope_frequencies(
    params: &RopeParameters,
    theta: f64,
    rotary_dim: u32,
    path: &Path,
) -> Result<RopeFrequencies> {
    if !(theta.is_finite() && theta > 1.0) {
        return Err(FrontendError::Config {
            path: path.to_path_buf(),
            key: "rope_parameters.rope_theta".to_string(),
            why: format!("{theta} is not a number greater than 1"),
        });
    }
    let base = default_inv_freq(theta, rotary_dim);
    let inv_freq = match params.rope_type.as_str() {
        "default" => base,
        "linear" => linear_inv_freq(&base, require(params.factor, "factor", path)?),
        "llama3" => {
            let factor = require(params.factor, "factor", path)?;
            let low = require(params.low_freq_factor, "low_freq_factor", path)?;
            let high = require(params.high_freq_factor, "high_freq_factor", path)?;
            let original = params
                .original_max_position_embeddings
                .filter(|&n| n > 0)
                .ok_or_else(|| FrontendError::Config {
                    path: path.to_path_buf(),
                    key: "rope_parameters.original_max_position_embeddings".to_string(),
                    why: "required by llama3 RoPE but missing or zero".to_string(),
                })?;
            if high <= low {
                return Err(FrontendError::Config {
                    path: path.to_path_buf(),
                    key: "rope_parameters.high_freq_factor".to_string(),
                    why: format!("{high} must be greater than low_freq_factor {low}"),
                });
            }
            llama3_inv_freq(&base, factor, low, high, original)
        }
        other => {
            return Err(FrontendError::UnsupportedRope {
                path: path.to_path_buf(),
                rope_type: other.to_string(),
                supported: SUPPORTED_ROPE_TYPES.iter().map(|s| s.to_string()).collect(),
            })
        }
    };
    Ok(RopeFrequencies {
        inv_freq,
        attention_scaling: 1.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected values from numpy float32 arithmetic following transformers'
    // formulas step by step (the power rounded from f64).
    const DEFAULT_10K_16: [u32; 8] = [
        0x3f800000, 0x3ea1e89b, 0x3dcccccd, 0x3d0186e3, 0x3c23d70a, 0x3b4f3e38, 0x3a83126f,
        0x39a5cb60,
    ];
    const LINEAR_10K_16_X4: [u32; 8] = [
        0x3e800000, 0x3da1e89b, 0x3ccccccd, 0x3c0186e3, 0x3b23d70a, 0x3a4f3e38, 0x3983126f,
        0x38a5cb60,
    ];
    // Llama 3.1: theta 5e5, head_dim 128, factor 8, low 1, high 4, original 8192.
    // Indices 0..29 keep their frequency, 29..35 are smoothed, 35.. are divided.
    const LLAMA31: [u32; 64] = [
        0x3f800000, 0x3f508ac1, 0x3f29e1c6, 0x3f0a6384, 0x3ee177bc, 0x3eb7ab7d, 0x3e959ee3,
        0x3e73c461, 0x3e4693b0, 0x3e21c3a0, 0x3e03c6a0, 0x3dd6b19c, 0x3daee4ad, 0x3d8e7898,
        0x3d681e67, 0x3d3d1684, 0x3d1a08c8, 0x3cfaf53f, 0x3ccc6f49, 0x3ca68939, 0x3c87a9c3,
        0x3c5d06ec, 0x3c340d6d, 0x3c12ac7f, 0x3beef74f, 0x3bc2aa76, 0x3b9e9402, 0x3b812e35,
        0x3b527720, 0x3b0dfd06, 0x3ab3d11d, 0x3a60979e, 0x3a0995d2, 0x39a3f108, 0x393b2dd2,
        0x38c86886, 0x38a3418d, 0x3884fdbf, 0x3858ac81, 0x38308199, 0x380fc8f8, 0x37ea426f,
        0x37bed4f4, 0x379b7475, 0x377d45c3, 0x374e51f5, 0x3728126b, 0x3708ea0f, 0x36df10c4,
        0x36b5b687, 0x369406cb, 0x36712b80, 0x36447610, 0x36200a69, 0x36025f34, 0x35d46808,
        0x35ad07a7, 0x358cf400, 0x3565a54d, 0x353b12c7, 0x351864a7, 0x34f848c2, 0x34ca41b0,
        0x34a4c2ff,
    ];

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    fn params(rope_type: &str) -> RopeParameters {
        RopeParameters {
            rope_type: rope_type.to_string(),
            ..RopeParameters::plain()
        }
    }

    fn check(p: &RopeParameters, theta: f64, dim: u32, expected: &[u32]) {
        let r = rope_frequencies(p, theta, dim, Path::new("config.json")).unwrap();
        assert_eq!(bits(&r.inv_freq), expected, "{p:?}");
        assert_eq!(r.attention_scaling, 1.0);
    }

    #[test]
    fn default_matches_transformers() {
        check(&params("default"), 10000.0, 16, &DEFAULT_10K_16);
    }

    #[test]
    fn linear_matches_transformers() {
        let p = RopeParameters {
            factor: Some(4.0),
            ..params("linear")
        };
        check(&p, 10000.0, 16, &LINEAR_10K_16_X4);
    }

    #[test]
    fn llama3_matches_transformers() {
        let p = RopeParameters {
            factor: Some(8.0),
            low_freq_factor: Some(1.0),
            high_freq_factor: Some(4.0),
            original_max_position_embeddings: Some(8192),
            ..params("llama3")
        };
        check(&p, 500000.0, 128, &LLAMA31);
        // The three regimes really are exercised.
        let base = default_inv_freq(500000.0, 128);
        assert_eq!(LLAMA31[28], base[28].to_bits());
        assert_eq!(LLAMA31[40], (base[40] / 8.0).to_bits());
        assert!((29..35)
            .all(|i| LLAMA31[i] != base[i].to_bits() && LLAMA31[i] != (base[i] / 8.0).to_bits()));
    }

    #[test]
    fn missing_llama3_key_is_named() {
        let p = RopeParameters {
            factor: Some(8.0),
            ..params("llama3")
        };
        let err = rope_frequencies(&p, 5e5, 128, Path::new("config.json")).unwrap_err();
        assert!(
            err.to_string().contains("rope_parameters.low_freq_factor"),
            "{err}"
        );
    }

    #[test]
    fn unknown_type_lists_supported() {
        let err = rope_frequencies(&params("yarn"), 1e4, 16, Path::new("config.json")).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("`yarn`") && msg.contains("default, linear, llama3"),
            "{msg}"
        );
    }

    #[test]
    fn partial_rotary_dim() {
        let p = RopeParameters {
            partial_rotary_factor: Some(0.5),
            ..params("default")
        };
        assert_eq!(rotary_dim(&p, 64, Path::new("c")).unwrap(), 32);
        assert_eq!(
            rotary_dim(&params("default"), 64, Path::new("c")).unwrap(),
            64
        );
        let odd = RopeParameters {
            partial_rotary_factor: Some(0.3),
            ..params("default")
        };
        assert!(rotary_dim(&odd, 10, Path::new("c")).is_err());
    }
}
