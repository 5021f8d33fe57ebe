#!/usr/bin/env bash
# Decoder-based embedders at their real shapes on the `device` tool's machine, from the repo root:
# random-weight Qwen3-Embedding-0.6B and EmbeddingGemma-300m (scripts/device/decoder-embed-models.py
# makes them and sentence-transformers' vectors and timings), compiled for the desktop target.
#
#   bash scripts/device/decoder-embed.sh TOKENIZER_DIR
#
# TOKENIZER_DIR: SmolLM2's tokenizer files (the fixture scripts/build-fixtures.py builds). Expects
# .device/bin/{gerbilc,gerbil-run} and .gl/ as check-gpu.sh does. Prints `TORCH` lines, `CHECK`
# lines (each variant's cosine with sentence-transformers' float32 vector, per text), `GERBIL`
# lines (`bench --prompt-tokens 128 --batch 64`, --no-tensor-cores and the default, tensor cores, and 64 inputs of 64
# tokens: what packing mixed lengths saves over padding them to 128) and one `--profile` table.
set -euo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
bin=.device/bin
out=/tmp/gerbil-decoder-embed
python3 scripts/device/decoder-embed-models.py "$1" "$out" 2>&1 | grep -E '^TORCH|Error|error' || true
for name in qwen3-embedding-0.6b embeddinggemma-300m; do
  model="$out/$name"
  "$bin/gerbilc" compile "$model" -o "$model.plan" --target desktop --quiet
  python3 scripts/device/embed-check.py "$bin/gerbil-run" "$model"
  for r in 1 2 3; do
    echo "GERBIL $name simt $("$bin/gerbil-run" "$model.plan" --no-tensor-cores bench --prompt-tokens 128 --batch 64 --repeats 7 --json)"
    echo "GERBIL $name tensor-cores $("$bin/gerbil-run" "$model.plan" --tensor-cores bench --prompt-tokens 128 --batch 64 --repeats 7 --json)"
    echo "GERBIL $name tensor-cores-64tok $("$bin/gerbil-run" "$model.plan" --tensor-cores bench --prompt-tokens 64 --batch 64 --repeats 7 --json)"
  done
  "$bin/gerbil-run" "$model.plan" --tensor-cores bench --prompt-tokens 128 --batch 64 --repeats 3 --profile | head -24
done
