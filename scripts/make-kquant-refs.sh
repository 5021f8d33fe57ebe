#!/usr/bin/env bash
# Write crates/gguf/tests/data/kquants.gguf: float rows (`src`: random, plus a zero super-block, a
# constant one, one of tiny values and one with an outlier) and the Q4_K, Q5_K and Q6_K blocks
# llama.cpp's own reference quantizers (`quantize_row_q*_K_ref` in ggml-quants.c, what
# `llama-quantize` runs without an importance matrix) make of them: the test reference of
# gerbil-gguf's K-quantizers. llama.cpp's source comes from the llama-cpp-python sdist on PyPI
# (pinned by sha256); scripts/kquant-ref/harness.c calls its quantizers, compiled without FMA
# contraction (-ffp-contract=off, plain x86-64), so every operation rounds as in the Rust code.
#
#     bash scripts/make-kquant-refs.sh      # needs curl, gcc, python3 with numpy and gguf==0.19.0
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
url=https://files.pythonhosted.org/packages/e4/b4/c8cd17629ced0b9644a71d399a91145aedef109c0333443bef015e45b704/llama_cpp_python-0.3.16.tar.gz
sha=34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6
curl -sSL -o "$work/src.tar.gz" "$url"
echo "$sha  $work/src.tar.gz" | sha256sum -c --quiet
tar xzf "$work/src.tar.gz" -C "$work" llama_cpp_python-0.3.16/vendor/llama.cpp/ggml
ggml=$work/llama_cpp_python-0.3.16/vendor/llama.cpp/ggml
gcc -O2 -ffp-contract=off -march=x86-64 -I "$ggml/include" -I "$ggml/src" -o "$work/harness" \
    "$repo/scripts/kquant-ref/harness.c" "$repo/scripts/kquant-ref/stubs.c" "$ggml/src/ggml-quants.c" -lm
python3 - "$work" "$repo/crates/gguf/tests/data/kquants.gguf" <<'PY'
import os, subprocess, sys
import numpy as np
import gguf
work, out = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(22)
x = (rng.standard_normal((4, 1024)) * 0.05).astype(np.float32)
x[0, :256] = 0.0
x[1, :256] = 0.125
x[2, :256] *= 1e-6
x[3, 7] = 3.0
with open(f"{work}/x.bin", "wb") as f:
    f.write(np.int64(x.size).tobytes())
    f.write(x.tobytes())
names = ["Q4_K", "Q5_K", "Q6_K"]
subprocess.run([f"{work}/harness", f"{work}/x.bin"] + [f"{work}/{n}.bin" for n in names], check=True)
T = gguf.GGMLQuantizationType
w = gguf.GGUFWriter(out, "kquants")
w.add_tensor("src", x)
for n in names:
    blocks = np.fromfile(f"{work}/{n}.bin", dtype=np.uint8)
    w.add_tensor(f"{n}.quantized", blocks.reshape(4, -1), raw_dtype=T[n])
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(out, os.path.getsize(out), "bytes")
PY
