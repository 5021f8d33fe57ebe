#!/usr/bin/env python3
"""Write crates/gguf/tests/data/blocks.gguf: for every block type gerbil decodes, random blocks
(`<TYPE>.q`) and the values gguf-py dequantizes them to (`<TYPE>.want`, F32), the reference the
Rust tests compare against bit for bit (transformers loads GGUF through the same gguf-py code);
and for every type gguf-py quantizes, float rows (`<TYPE>.src`) and its blocks of them
(`<TYPE>.quantized`).

    python3 scripts/make-gguf-blocks.py      # needs numpy and gguf==0.19.0

The blocks are random bytes, so every bit pattern of the quantized fields occurs; only the f16
scale fields are overwritten with finite values of a realistic size. Deterministic (seed 20).
"""
import os
import numpy as np
import gguf
from gguf.quants import dequantize

T = gguf.GGMLQuantizationType
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   "crates", "gguf", "tests", "data", "blocks.gguf")
# (type, byte offsets of its f16 scale fields within a block)
TYPES = [(T.Q8_0, [0]), (T.Q4_0, [0]), (T.Q4_1, [0, 2]), (T.Q5_0, [0]), (T.Q5_1, [0, 2]),
         (T.Q4_K, [0, 2]), (T.Q5_K, [0, 2]), (T.Q6_K, [208])]
ROWS = 3


def main():
    rng = np.random.default_rng(20)
    w = gguf.GGUFWriter(OUT, "blocks")
    for ty, scales in TYPES:
        block_len, block_bytes = gguf.GGML_QUANT_SIZES[ty]
        blocks = rng.integers(0, 256, size=(ROWS * 2, block_bytes), dtype=np.uint8)
        for at in scales:
            s = (rng.standard_normal(ROWS * 2) * 0.02).astype(np.float16)
            blocks[:, at:at + 2] = s.view(np.uint8).reshape(-1, 2)
        q = blocks.reshape(ROWS, 2 * block_bytes)
        w.add_tensor(f"{ty.name}.q", q, raw_dtype=ty)
        w.add_tensor(f"{ty.name}.want", dequantize(q, ty).astype(np.float32))
    for ty in [T.F16, T.BF16]:
        x = rng.standard_normal((ROWS, 8)).astype(np.float32)
        raw = x.astype(np.float16) if ty == T.F16 else gguf.quants.quantize(x, ty)
        w.add_tensor(f"{ty.name}.q", raw, raw_dtype=ty)
        w.add_tensor(f"{ty.name}.want", dequantize(raw, ty).astype(np.float32))
    # The quantizers: float rows (random, plus a zero block, a constant block and a block of
    # exact half-steps, where rounding ties) and what gguf-py's quantize makes of them,
    # bit-exact with ggml's reference quantizers.
    qrng = np.random.default_rng(21)
    for ty in [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]:
        x = (qrng.standard_normal((ROWS, 4 * 32)) * 0.05).astype(np.float32)
        x[0, :32] = 0.0
        x[1, :32] = 0.25
        x[2, :32] = np.arange(32, dtype=np.float32) * 0.5 - 8.0
        x[2, 32:64] *= 1e4
        w.add_tensor(f"{ty.name}.src", x)
        w.add_tensor(f"{ty.name}.quantized", gguf.quants.quantize(x, ty), raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(OUT, os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()
