#!/usr/bin/env python3
"""Expected RoPE frequencies for the unit tests in `src/rope.rs`.

Reproduces transformers' `_compute_yarn_parameters` and
`_compute_longrope_parameters` (modeling_rope_utils.py, transformers 5.23) with
numpy, one torch operation at a time: Python floats stay float64 until they
meet an f32 tensor, where they are cast to float32; tensor arithmetic is
float32. `base ** (arange(0, dim, 2) / dim)` is taken in float64 and rounded
to float32 (the correctly rounded value; torch's SLEEF kernel may be one ulp
away, see src/rope.rs). Prints Rust constants: `python3 rope_reference.py`.
"""
import math
import numpy as np

f32 = np.float32


def pos_freqs(base, dim):
    exps = np.arange(0, dim, 2, dtype=np.int64).astype(f32) / f32(dim)
    return (np.float64(f32(base)) ** exps.astype(np.float64)).astype(f32)


def yarn(base, dim, factor, original, beta_fast=None, beta_slow=None, truncate=True,
         mscale=None, mscale_all_dim=None, attention_factor=None):
    def get_mscale(scale, m=1):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = beta_fast or 32
    beta_slow = beta_slow or 1

    def find_correction_dim(num_rotations):
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = find_correction_dim(beta_fast), find_correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=f32) - f32(low)) / f32(high - low), f32(0), f32(1))
    p = pos_freqs(base, dim)
    extrapolation = f32(1.0) / p
    interpolation = f32(1.0) / (f32(factor) * p)
    ef = f32(1) - ramp
    inv = interpolation * (f32(1) - ef) + extrapolation * ef
    return inv.astype(f32), attention_factor


def longrope(base, dim, ext, factor, original):
    attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    inv = f32(1.0) / (np.array(ext, dtype=f32) * pos_freqs(base, dim))
    return inv.astype(f32), attention_factor


def show(name, inv, att):
    words = ", ".join(f"0x{b:08x}" for b in inv.view(np.uint32))
    print(f"// attention_scaling = {att!r} -> f32 0x{np.float32(att).view(np.uint32):08x}")
    print(f"const {name}: [u32; {len(inv)}] = [{words}];")


# Qwen2.5-style YaRN: theta 1e6, head_dim 128, factor 4, original 32768.
show("YARN_QWEN", *yarn(1e6, 128, 4.0, 32768))
# Untruncated ramp, explicit betas, mscale ratio: theta 1e4, dim 32, factor 8, original 64.
show("YARN_SMALL", *yarn(1e4, 32, 8.0, 64, beta_fast=8, beta_slow=2, truncate=False,
                         mscale=0.707, mscale_all_dim=1.0))
# Phi-3-style LongRoPE: theta 1e4, head_dim 32, original 4096, max_position 131072.
SHORT = [1.0 + 0.0731 * i for i in range(16)]
LONG = [1.0 + 0.37 * i ** 1.5 for i in range(16)]
show("LONGROPE_SHORT", *longrope(1e4, 32, SHORT, 131072 / 4096, 4096))
show("LONGROPE_LONG", *longrope(1e4, 32, LONG, 131072 / 4096, 4096))
