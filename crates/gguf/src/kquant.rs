//! ggml's reference quantizers for the K types Q4_K, Q5_K and Q6_K: 256
//! values a super-block, searched scales per sub-block, the scales themselves
//! quantized against the super-block's largest ([`TensorType::quantize`](crate::TensorType::quantize)
//! dispatches here).
//!
//! Each is `quantize_row_q*_K_ref` of ggml-quants.c, operation for operation
//! in f32 (no fused multiply-adds), so the blocks equal llama.cpp's
//! `llama-quantize` without an importance matrix (built without FMA
//! contraction; `scripts/make-kquant-refs.sh` compiles ggml's own code to
//! make the test's reference blocks). The surprise is how much search there
//! is: Q4_K and Q5_K try 21 and 16 scales per 32 values for the one that
//! minimizes the error weighted by `rms + |x|` (`best_affine`), Q6_K 19 per
//! 16 values weighted by `x²` (`best_symmetric`), and the final quants are
//! then recomputed against the scales as rounded to 6 or 8 bits — except in
//! a sub-block whose rounded scale is zero, which keeps the search's.

use half::f16;

/// Below this largest magnitude a group is all zeros (ggml's `GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even through the float adder.
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// f32 through f16 and back, as ggml stores and then reads a scale.
fn via_f16(v: f32) -> (u16, f32) {
    let h = f16::from_f32(v);
    (h.to_bits(), h.to_f32())
}

/// ggml's `make_qkx2_quants`: the scale and minimum of `x` (quants `0..=nmax`
/// in `l`) minimizing the `weights`-weighted squared error, over `nstep + 1`
/// candidate scales `(rmin + rdelta·is + nmax) / (max − min)`. Returns
/// `(scale, −min)`.
fn best_affine(
    x: &[f32],
    weights: &[f32],
    nmax: i32,
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..x.len() {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..x.len() {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * q as f32 + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    let mut aux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..x.len() {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = q as u8;
            let w = weights[i];
            let qf = q as f32;
            sum_l += w * qf;
            sum_l2 += w * qf * qf;
            sum_xl += w * qf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..x.len() {
                let diff = this_scale * aux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                l[..x.len()].copy_from_slice(&aux[..x.len()]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qx_quants` with `rmse_type = 1` (weights `x²`): the scale
/// of `x` (quants `l` in `0..2·nmax`, offset `nmax`) over 19 candidates.
fn best_symmetric(x: &[f32], nmax: i32, l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let sums = |iscale: f32, l: Option<&mut [i8]>| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        let mut out = l;
        for (i, &v) in x.iter().enumerate() {
            let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            if let Some(out) = out.as_deref_mut() {
                out[i] = (q + nmax) as i8;
            }
            let w = v * v;
            sumlx += w * v * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        (sumlx, suml2)
    };
    let iscale = -(nmax as f32) / max;
    let (sumlx, suml2) = sums(iscale, Some(l));
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale, None);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            sums(iscale, Some(l));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// A K type's 6-bit scale and minimum of sub-block `j` (ggml's `get_scale_min_k4`).
fn scale_min(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// One Q4_K (`bits` 4) or Q5_K (`bits` 5) super-block of `x` (256 values),
/// appended to `out`.
pub(crate) fn affine_k(x: &[f32], bits: u32, out: &mut Vec<u8>) {
    let nmax = (1i32 << bits) - 1;
    let (rmin, nstep) = if bits == 4 { (-1.0, 20) } else { (-0.5, 15) };
    let mut l = [0u8; 256];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    let mut weights = [0f32; 32];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2 = xs.iter().fold(0f32, |s, v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (scale, min) = best_affine(xs, &weights, nmax, &mut l[32 * j..], rmin, 0.1, nstep);
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let (d_bits, d) = via_f16(max_scale / 63.0);
    let (dmin_bits, dmin) = via_f16(max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = scale_min(j, &packed);
        let dj = d * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for i in 0..32 {
            l[32 * j + i] = nearest_int((x[32 * j + i] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    out.extend(d_bits.to_le_bytes());
    out.extend(dmin_bits.to_le_bytes());
    out.extend(packed);
    if bits == 5 {
        let mut qh = [0u8; 32];
        for (g, group) in l.chunks(64).enumerate() {
            for j in 0..32 {
                qh[j] |= ((group[j] >> 4) << (2 * g)) | ((group[j + 32] >> 4) << (2 * g + 1));
            }
        }
        out.extend(qh);
    }
    for group in l.chunks(64) {
        out.extend((0..32).map(|j| (group[j] & 0xf) | ((group[j + 32] & 0xf) << 4)));
    }
}

/// One Q6_K super-block of `x` (256 values), appended to `out`.
pub(crate) fn q6_k(x: &[f32], out: &mut Vec<u8>) {
    let mut l = [0i8; 256];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ib in 0..16 {
        let scale = best_symmetric(&x[16 * ib..16 * ib + 16], 32, &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        out.extend([0u8; 210]);
        return;
    }
    let iscale = -128.0 / max_scale;
    let (d_bits, d) = via_f16(1.0 / iscale);
    let mut sc = [0i8; 16];
    for ib in 0..16 {
        sc[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
    }
    for j in 0..16 {
        let dj = d * f32::from(sc[j]);
        if dj == 0.0 {
            continue;
        }
        for i in 0..16 {
            l[16 * j + i] = (nearest_int(x[16 * j + i] / dj).clamp(-32, 31) + 32) as i8;
        }
    }
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for (h, half) in l.chunks(128).enumerate() {
        let q = |i: usize| half[i] as u8;
        for i in 0..32 {
            ql[64 * h + i] = (q(i) & 0xf) | ((q(i + 64) & 0xf) << 4);
            ql[64 * h + i + 32] = (q(i + 32) & 0xf) | ((q(i + 96) & 0xf) << 4);
            qh[32 * h + i] = (q(i) >> 4)
                | ((q(i + 32) >> 4) << 2)
                | ((q(i + 64) >> 4) << 4)
                | ((q(i + 96) >> 4) << 6);
        }
    }
    out.extend(ql);
    out.extend(qh);
    out.extend(sc.iter().map(|&s| s as u8));
    out.extend(d_bits.to_le_bytes());
}
