//! The rotary-embedding table that [`WeightSource::RopeTable`](crate::WeightSource::RopeTable)
//! stands for, defined once: the compiler materializes it with [`rope_table`], and every
//! kernel that reads it indexes it with the layout written here.
//!
//! Layout (the one contract every RoPE kernel reads): `f32[rows, 2·pairs]`,
//! row `p` holds `cos(p·f_i)·s` for every inverse frequency `f_i`, then
//! `sin(p·f_i)·s`. `s` is the attention scaling of YaRN and LongRoPE (1 for
//! plain RoPE). Kernels index it as `table[p·ROT + i]` (cos) and
//! `table[p·ROT + ROT/2 + i]` (sin), with `ROT = 2·pairs` the rotary width.
//!
//! The arithmetic follows transformers: the angle is the f32 product of the
//! position and the f32 frequency; cos and sin of that f32 angle are taken in
//! f64 and rounded to f32 (torch's f32 cos/sin are correctly rounded to within
//! an ulp), then multiplied by `s` in f32.

/// Bytes of the table for `rows` positions: little-endian f32, row-major.
pub fn rope_table(inv_freq: &[f32], scaling: f32, rows: u64) -> Vec<u8> {
    let pairs = inv_freq.len();
    let mut out = Vec::with_capacity(rows as usize * pairs * 2 * 4);
    for p in 0..rows {
        let angles: Vec<f32> = inv_freq.iter().map(|&f| p as f32 * f).collect();
        for &a in &angles {
            out.extend_from_slice(&(((a as f64).cos() as f32) * scaling).to_le_bytes());
        }
        for &a in &angles {
            out.extend_from_slice(&(((a as f64).sin() as f32) * scaling).to_le_bytes());
        }
    }
    out
}

/// Element index of `cos(p·f_i)` in a table of rotary width `rot`.
pub fn cos_index(p: u64, i: u64, rot: u64) -> u64 {
    p * rot + i
}

/// Element index of `sin(p·f_i)` in a table of rotary width `rot`.
pub fn sin_index(p: u64, i: u64, rot: u64) -> u64 {
    p * rot + rot / 2 + i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn rows_hold_scaled_cos_then_sin() {
        let inv_freq = [1.0f32, 0.125, 0.003];
        let s = 1.25f32;
        let t = floats(&rope_table(&inv_freq, s, 7));
        assert_eq!(t.len(), 7 * 6);
        for p in 0..7u64 {
            for (i, f) in inv_freq.iter().enumerate() {
                let a = (p as f32 * f) as f64;
                let c = t[cos_index(p, i as u64, 6) as usize];
                let sn = t[sin_index(p, i as u64, 6) as usize];
                assert!(
                    (c as f64 - a.cos() * s as f64).abs() < 1e-6,
                    "cos p={p} i={i}"
                );
                assert!(
                    (sn as f64 - a.sin() * s as f64).abs() < 1e-6,
                    "sin p={p} i={i}"
                );
            }
        }
        // Position 0: cos = s, sin = 0 exactly.
        assert_eq!(&t[..6], &[s, s, s, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn the_angle_is_an_f32_product() {
        // A large position where f64 and f32 products differ: the table must
        // use the f32 one, as transformers does.
        let f = 0.1f32;
        let p = 4000u64;
        let t = floats(&rope_table(&[f], 1.0, p + 1));
        let a32 = (p as f32 * f) as f64;
        assert_eq!(t[cos_index(p, 0, 2) as usize], a32.cos() as f32);
        assert_ne!(a32, p as f64 * f as f64);
    }
}
