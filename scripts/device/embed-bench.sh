#!/usr/bin/env bash
# The sentence-embedding benchmark of docs/performance.md, run from the repo root on the `device`
# tool's machine: gerbil against PyTorch on a random-weight all-MiniLM-L6-v2 of the real shape.
#
#   bash scripts/device/embed-bench.sh MINILM_FILES
#
# MINILM_FILES: all-MiniLM-L6-v2's config.json, tokenizer files, modules.json, 1_Pooling/ and
# sentence_bert_config.json without the weights (copied from the fixture scripts/build-fixtures.py
# builds). Expects .device/bin/{gerbilc,gerbil-run} and .gl/ as check-gpu.sh does. Makes the model
# and PyTorch's timings (scripts/device/embed-torch.py), compiles it for the desktop target, runs
# `gerbil-run bench --prompt-tokens 128 --batch 64 --repeats 7 --json` three times with
# --no-tensor-cores and three with --tensor-cores (the default), and checks each variant's vectors of two texts against
# PyTorch f32 (cosine). Prints `TORCH`, `GERBIL` and `CHECK` lines.
set -euo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
bin=.device/bin
model=/tmp/gerbil-minilm
python3 scripts/device/embed-torch.py "$1" "$model" 2>&1 | grep '^TORCH'
"$bin/gerbilc" compile "$model" -o "$model.plan" --target desktop --quiet
for r in 1 2 3; do
  echo "GERBIL simt $("$bin/gerbil-run" "$model.plan" --no-tensor-cores bench --prompt-tokens 128 --batch 64 --repeats 7 --json)"
  echo "GERBIL tensor-cores $("$bin/gerbil-run" "$model.plan" --tensor-cores bench --prompt-tokens 128 --batch 64 --repeats 7 --json)"
done
python3 scripts/device/embed-check.py "$bin/gerbil-run" "$model"
