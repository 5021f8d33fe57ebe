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
//!
//! Types: `default`, `linear`, `llama3`, `yarn` (with its attention factor
//! from `mscale`/`mscale_all_dim`) and `longrope` (short or long factors by
//! [`RopeContext::context`], attention factor `√(1 + ln f / ln original)`).
//! The unit tests compare bit patterns with `tests/rope_reference.py`, a
//! numpy transcription of transformers' formulas; against transformers 5.23
//! itself (torch 2.11, CPU) the yarn and longrope cases agree bit for bit
//! except one YaRN frequency one ulp away, from the SLEEF power above.

use crate::config::{kernel_f32, RopeParameters};
use crate::error::{FrontendError, Result};
use std::path::Path;

/// RoPE types [`rope_frequencies`] implements.
pub const SUPPORTED_ROPE_TYPES: &[&str] = &["default", "linear", "llama3", "yarn", "longrope"];

/// Inverse frequencies and attention scaling of a RoPE table.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeFrequencies {
    /// `rotary_dim / 2` inverse frequencies.
    pub inv_freq: Vec<f32>,
    /// Multiplier of cos and sin (1 except for `yarn` and `longrope`).
    pub attention_scaling: f32,
}

/// What RoPE variants read besides their own parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeContext {
    /// The config's `max_position_embeddings` (`yarn` and `longrope` derive
    /// a missing `factor` from it).
    pub max_position_embeddings: u64,
    /// The longest sequence the plan will run (its KV-cache capacity).
    /// `longrope` uses its long factors when this exceeds
    /// `original_max_position_embeddings`, its short factors otherwise.
    /// transformers decides per forward call from the current sequence
    /// length instead; one plan has one table, so it decides once.
    pub context: u64,
}

/// Plain RoPE: `inv_freq[i] = 1 / theta^(2i/dim)` for `i < dim/2`.
///
/// As torch: the exponent is `(2i as f32) / (dim as f32)`, the base is
/// `theta` cast to f32, the power is taken in f64 and rounded to f32, and the
/// reciprocal is taken in f32.
pub fn default_inv_freq(theta: f64, dim: u32) -> Vec<f32> {
    pos_freqs(theta, dim)
        .into_iter()
        .map(|p| 1.0f32 / p)
        .collect()
}

/// `base^(2i/dim)` for `i < dim/2` as torch computes `base ** (arange(0, dim, 2) / dim)`
/// in f32 (see [`default_inv_freq`]).
fn pos_freqs(theta: f64, dim: u32) -> Vec<f32> {
    let base = f64::from(theta as f32);
    (0..dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / dim as f32;
            base.powf(f64::from(exponent)) as f32
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

/// YaRN's attention factor for `factor` (transformers' `get_mscale` logic,
/// in f64): `0.1·ln(factor) + 1`, or the ratio of two such terms scaled by
/// `mscale` and `mscale_all_dim` when both are set and non-zero.
pub fn yarn_attention_factor(factor: f64, mscale: Option<f64>, mscale_all_dim: Option<f64>) -> f64 {
    let get = |scale: f64, m: f64| {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * m * scale.ln() + 1.0
        }
    };
    match (mscale, mscale_all_dim) {
        (Some(m), Some(all)) if m != 0.0 && all != 0.0 => get(factor, m) / get(factor, all),
        _ => get(factor, 1.0),
    }
}

/// The YaRN parameters [`yarn_inv_freq`] reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// Context extension factor.
    pub factor: f64,
    /// Pre-training context length.
    pub original_max_position_embeddings: u64,
    /// Rotations at the high-frequency end of the ramp.
    pub beta_fast: f64,
    /// Rotations at the low-frequency end of the ramp.
    pub beta_slow: f64,
    /// Whether the ramp ends are rounded to whole dimensions.
    pub truncate: bool,
}

/// `yarn` RoPE: transformers' `_compute_yarn_parameters`. Each frequency is
/// a blend of the original (extrapolated) one and the one divided by
/// `factor` (interpolated), with a linear ramp over the dimensions between
/// the correction range that `beta_fast`/`beta_slow` give. The range is
/// computed in f64 (Python floats), the blend in f32 (torch).
pub fn yarn_inv_freq(theta: f64, dim: u32, y: &Yarn) -> Vec<f32> {
    let correction_dim = |rotations: f64| {
        (f64::from(dim)
            * (y.original_max_position_embeddings as f64
                / (rotations * 2.0 * std::f64::consts::PI))
                .ln())
            / (2.0 * theta.ln())
    };
    let (mut low, mut high) = (correction_dim(y.beta_fast), correction_dim(y.beta_slow));
    if y.truncate {
        low = low.floor();
        high = high.ceil();
    }
    let low = low.max(0.0);
    let mut high = high.min(f64::from(dim) - 1.0);
    if low == high {
        high += 0.001; // transformers: "prevent singularity"
    }
    let (low32, span32) = (low as f32, (high - low) as f32);
    let factor32 = y.factor as f32;
    pos_freqs(theta, dim)
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let ramp = ((i as f32 - low32) / span32).clamp(0.0, 1.0);
            let extrapolation_factor = 1.0f32 - ramp;
            let extrapolation = 1.0f32 / p;
            let interpolation = 1.0f32 / (factor32 * p);
            interpolation * (1.0f32 - extrapolation_factor) + extrapolation * extrapolation_factor
        })
        .collect()
}

/// `longrope` RoPE: `1 / (ext_i · base^(2i/dim))` with the per-frequency
/// factors `ext` (transformers' `_compute_longrope_parameters`, in f32).
pub fn longrope_inv_freq(theta: f64, dim: u32, ext_factors: &[f64]) -> Vec<f32> {
    pos_freqs(theta, dim)
        .into_iter()
        .zip(ext_factors)
        .map(|(p, &e)| 1.0f32 / (e as f32 * p))
        .collect()
}

/// LongRoPE's attention factor: `sqrt(1 + ln(factor) / ln(original))`, or 1
/// when `factor ≤ 1` (in f64, as transformers).
pub fn longrope_attention_factor(factor: f64, original_max_position_embeddings: u64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        (1.0 + factor.ln() / (original_max_position_embeddings as f64).ln()).sqrt()
    }
}

fn require(value: Option<f64>, key: &str, path: &Path) -> Result<f64> {
    let v = value.ok_or_else(|| FrontendError::Config {
        path: path.to_path_buf(),
        key: format!("rope_parameters.{key}"),
        why: "required by this rope_type but missing".to_string(),
    })?;
    if v.is_finite() && v > 0.0 {
        kernel_f32(v).map_err(|why| FrontendError::Config {
            path: path.to_path_buf(),
            key: format!("rope_parameters.{key}"),
            why,
        })?;
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

fn config_err(path: &Path, key: &str, why: String) -> FrontendError {
    FrontendError::Config {
        path: path.to_path_buf(),
        key: format!("rope_parameters.{key}"),
        why,
    }
}

/// `original_max_position_embeddings` of a type that needs it (always set
/// by config parsing for those types; checked for hand-built parameters).
fn original_of(params: &RopeParameters, path: &Path) -> Result<u64> {
    params
        .original_max_position_embeddings
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            config_err(
                path,
                "original_max_position_embeddings",
                format!("required by {} RoPE but missing or zero", params.rope_type),
            )
        })
}

/// `factor`, or `max_position_embeddings / original` when absent (what
/// `yarn` and `longrope` do).
fn factor_or_ratio(
    params: &RopeParameters,
    original: u64,
    rc: &RopeContext,
    path: &Path,
) -> Result<f64> {
    match params.factor {
        Some(_) => require(params.factor, "factor", path),
        None => Ok(rc.max_position_embeddings as f64 / original as f64),
    }
}

/// Frequencies for a rotary dimension of `rotary_dim` with base `theta`
/// (the family resolves a missing `rope_theta` to its default first).
/// `path` names the config file in errors.
pub fn rope_frequencies(
    params: &RopeParameters,
    theta: f64,
    rotary_dim: u32,
    rc: &RopeContext,
    path: &Path,
) -> Result<RopeFrequencies> {
    if !(theta.is_finite() && theta > 1.0) {
        return Err(FrontendError::Config {
            path: path.to_path_buf(),
            key: "rope_parameters.rope_theta".to_string(),
            why: format!("{theta} is not a number greater than 1"),
        });
    }
    kernel_f32(theta).map_err(|why| FrontendError::Config {
        path: path.to_path_buf(),
        key: "rope_parameters.rope_theta".to_string(),
        why,
    })?;
    let base = default_inv_freq(theta, rotary_dim);
    let mut attention_scaling = 1.0;
    let inv_freq = match params.rope_type.as_str() {
        "default" => base,
        "linear" => linear_inv_freq(&base, require(params.factor, "factor", path)?),
        "llama3" => {
            let factor = require(params.factor, "factor", path)?;
            let low = require(params.low_freq_factor, "low_freq_factor", path)?;
            let high = require(params.high_freq_factor, "high_freq_factor", path)?;
            let original = original_of(params, path)?;
            if high <= low {
                return Err(FrontendError::Config {
                    path: path.to_path_buf(),
                    key: "rope_parameters.high_freq_factor".to_string(),
                    why: format!("{high} must be greater than low_freq_factor {low}"),
                });
            }
            llama3_inv_freq(&base, factor, low, high, original)
        }
        "yarn" => {
            let original = original_of(params, path)?;
            let factor = factor_or_ratio(params, original, rc, path)?;
            let optional = |v: Option<f64>, key, default| match v {
                // transformers: `get(key) or default`, so 0 means the default.
                Some(x) if x != 0.0 => require(Some(x), key, path),
                _ => Ok(default),
            };
            let y = Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast: optional(params.beta_fast, "beta_fast", 32.0)?,
                beta_slow: optional(params.beta_slow, "beta_slow", 1.0)?,
                truncate: params.truncate.unwrap_or(true),
            };
            attention_scaling = match params.attention_factor {
                Some(a) => require(Some(a), "attention_factor", path)?,
                None => yarn_attention_factor(factor, params.mscale, params.mscale_all_dim),
            };
            yarn_inv_freq(theta, rotary_dim, &y)
        }
        "longrope" => {
            let original = original_of(params, path)?;
            let factor = factor_or_ratio(params, original, rc, path)?;
            attention_scaling = match params.attention_factor {
                Some(a) => require(Some(a), "attention_factor", path)?,
                None => longrope_attention_factor(factor, original),
            };
            let (key, ext) = if rc.context > original {
                ("long_factor", &params.long_factor)
            } else {
                ("short_factor", &params.short_factor)
            };
            let ext = ext.as_ref().ok_or_else(|| {
                config_err(path, key, "required by longrope RoPE but missing".into())
            })?;
            let pairs = rotary_dim as usize / 2;
            if ext.len() != pairs {
                return Err(config_err(
                    path,
                    key,
                    format!(
                        "has {} factors; rotary dimension {rotary_dim} needs {pairs}",
                        ext.len()
                    ),
                ));
            }
            if let Some(bad) = ext.iter().find(|e| !(e.is_finite() && **e > 0.0)) {
                return Err(config_err(
                    path,
                    key,
                    format!("{bad} is not a positive number"),
                ));
            }
            longrope_inv_freq(theta, rotary_dim, ext)
        }
        other => {
            return Err(FrontendError::UnsupportedRope {
                path: path.to_path_buf(),
                rope_type: other.to_string(),
                supported: SUPPORTED_ROPE_TYPES.iter().map(|s| s.to_string()).collect(),
            })
        }
    };
    // The parameters are each representable, but their combination may still
    // overflow or vanish in f32 (a huge factor over a tiny frequency).
    let attention_scaling =
        kernel_f32(attention_scaling).map_err(|why| config_err(path, "attention_factor", why))?;
    if let Some(f) = inv_freq.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
        return Err(config_err(
            path,
            &params.rope_type,
            format!(
                "these parameters give an inverse frequency of {f} in f32, where the kernels \
                 need positive finite ones; check rope_theta and the scaling factors"
            ),
        ));
    }
    Ok(RopeFrequencies {
        inv_freq,
        attention_scaling,
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

    // From `tests/rope_reference.py` (numpy, transformers' formulas).
    // attention_scaling = 1.138629436111989 -> f32 0x3f91be9c
    const YARN_QWEN: [u32; 64] = [
        0x3f800000, 0x3f4e4bad, 0x3f263de0, 0x3f05f6ef, 0x3ed7e89b, 0x3eadfcff, 0x3e8c3504,
        0x3e61f835, 0x3e361887, 0x3e12bd91, 0x3dec7fd6, 0x3dbe94c6, 0x3d99940d, 0x3d778513,
        0x3d47763f, 0x3d20bc1d, 0x3d0186e3, 0x3cd0c1a8, 0x3ca8398b, 0x3c879008, 0x3c5a7bf2,
        0x3c301052, 0x3c0de12d, 0x3be4aa46, 0x3bb02377, 0x3b876388, 0x3b4fa550, 0x3b1ed248,
        0x3af241df, 0x3ab82bc0, 0x3a8b8207, 0x3a527db8, 0x3a1e0eb2, 0x39ec1968, 0x39af3d02,
        0x39811c3e, 0x393c93be, 0x39083e37, 0x38c23e9a, 0x38881d0a, 0x383a7753, 0x38164324,
        0x37f22ce2, 0x37c327b5, 0x379d43a4, 0x377d75d4, 0x374c3fbe, 0x372497ab, 0x3704a2b2,
        0x36d5c441, 0x36ac431d, 0x368ad0ed, 0x365fba4f, 0x36344a0e, 0x361148e3, 0x35ea2732,
        0x35bcb0c1, 0x35980e02, 0x35751070, 0x35457bab, 0x351f23e4, 0x35003dec, 0x34ceaf79,
        0x34a68e4c,
    ];
    // attention_scaling = 0.9495608824621653 -> f32 0x3f73166c
    const YARN_SMALL: [u32; 16] = [
        0x3f800000, 0x3ee334e6, 0x3e09e187, 0x3cb61887, 0x3c4ccccd, 0x3be655c2, 0x3b8186e3,
        0x3b11ad39, 0x3aa3d70a, 0x3a38449c, 0x39cf3e38, 0x39691528, 0x3903126f, 0x38936a16,
        0x3825cb60, 0x37ba7753,
    ];
    // attention_scaling = 1.1902380714238083 -> f32 0x3f9859b9
    const LONGROPE_SHORT: [u32; 16] = [
        0x3f800000, 0x3f06271f, 0x3e8d41c2, 0x3e155834, 0x3d9e7702, 0x3d28ae8b, 0x3cb412d4,
        0x3c40bb73, 0x3bcec3a7, 0x3b5e4a75, 0x3aef72ed, 0x3a813232, 0x3a0ba573, 0x39972bc7,
        0x3923e087, 0x38b1e21d,
    ];
    // attention_scaling = 1.1902380714238083 -> f32 0x3f9859b9
    const LONGROPE_LONG: [u32; 16] = [
        0x3f800000, 0x3ed228e0, 0x3e1e3a76, 0x3d7939f7, 0x3ccede63, 0x3c335cff, 0x3ba0f4cf,
        0x3b1469c1, 0x3a8bda4c, 0x3a062292, 0x39828adb, 0x39009bf3, 0x388006c7, 0x3800963d,
        0x378226ac, 0x3704a094,
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

    /// A context of `context` tokens for a model of 128k positions.
    fn rc(context: u64) -> RopeContext {
        RopeContext {
            max_position_embeddings: 131072,
            context,
        }
    }

    fn freqs(p: &RopeParameters, theta: f64, dim: u32, context: u64) -> RopeFrequencies {
        rope_frequencies(p, theta, dim, &rc(context), Path::new("config.json")).unwrap()
    }

    fn check(p: &RopeParameters, theta: f64, dim: u32, expected: &[u32]) {
        let r = freqs(p, theta, dim, 4096);
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
        let err = rope_frequencies(&p, 5e5, 128, &rc(4096), Path::new("config.json")).unwrap_err();
        assert!(
            err.to_string().contains("rope_parameters.low_freq_factor"),
            "{err}"
        );
    }

    #[test]
    fn unknown_type_lists_supported() {
        let err = rope_frequencies(
            &params("dynamic"),
            1e4,
            16,
            &rc(4096),
            Path::new("config.json"),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("`dynamic`") && msg.contains("default, linear, llama3, yarn, longrope"),
            "{msg}"
        );
    }

    #[test]
    fn yarn_matches_transformers() {
        let p = RopeParameters {
            factor: Some(4.0),
            original_max_position_embeddings: Some(32768),
            ..params("yarn")
        };
        let r = freqs(&p, 1e6, 128, 4096);
        assert_eq!(bits(&r.inv_freq), YARN_QWEN);
        assert_eq!(r.attention_scaling.to_bits(), 0x3f91be9c);
        // Dimensions below the ramp keep their frequency, those above are
        // divided by the factor, those on it are blended.
        let base = default_inv_freq(1e6, 128);
        assert_eq!(YARN_QWEN[10], base[10].to_bits());
        assert_eq!(
            YARN_QWEN[50],
            (1.0f32 / (4.0f32 * (1.0 / base[50]))).to_bits()
        );
        assert!(YARN_QWEN[30] != base[30].to_bits());

        let small = RopeParameters {
            factor: Some(8.0),
            original_max_position_embeddings: Some(64),
            beta_fast: Some(8.0),
            beta_slow: Some(2.0),
            truncate: Some(false),
            mscale: Some(0.707),
            mscale_all_dim: Some(1.0),
            ..params("yarn")
        };
        let r = freqs(&small, 1e4, 32, 4096);
        assert_eq!(bits(&r.inv_freq), YARN_SMALL);
        assert_eq!(r.attention_scaling.to_bits(), 0x3f73166c);
        // An explicit attention factor wins.
        let given = RopeParameters {
            attention_factor: Some(1.5),
            ..small
        };
        assert_eq!(freqs(&given, 1e4, 32, 4096).attention_scaling, 1.5);
    }

    #[test]
    fn longrope_picks_factors_by_context() {
        let p = RopeParameters {
            original_max_position_embeddings: Some(4096),
            short_factor: Some((0..16).map(|i| 1.0 + 0.0731 * f64::from(i)).collect()),
            long_factor: Some(
                (0..16)
                    .map(|i| 1.0 + 0.37 * f64::from(i).powf(1.5))
                    .collect(),
            ),
            ..params("longrope")
        };
        // factor = 131072 / 4096 = 32, so sqrt(1 + ln 32 / ln 4096).
        for (context, expected) in [(4096, LONGROPE_SHORT), (4097, LONGROPE_LONG)] {
            let r = freqs(&p, 1e4, 32, context);
            assert_eq!(bits(&r.inv_freq), expected, "context {context}");
            assert_eq!(r.attention_scaling.to_bits(), 0x3f9859b9);
        }
        // An explicit factor replaces the ratio.
        let one = RopeParameters {
            factor: Some(1.0),
            ..p.clone()
        };
        assert_eq!(freqs(&one, 1e4, 32, 4096).attention_scaling, 1.0);
        // Factor lists must cover every frequency.
        let short = RopeParameters {
            short_factor: Some(vec![1.0; 15]),
            ..p
        };
        let err = rope_frequencies(&short, 1e4, 32, &rc(16), Path::new("config.json")).unwrap_err();
        assert!(
            err.to_string().contains("rope_parameters.short_factor")
                && err.to_string().contains("16"),
            "{err}"
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
