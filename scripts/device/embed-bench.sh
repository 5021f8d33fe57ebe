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
# `gerbil-run bench --prompt-tokens 128 --batch 64 --repeats 7 --json` three times on the default
# variant and three with --tensor-cores, and checks each variant's vectors of two texts against
# PyTorch f32 (cosine). Prints `TORCH`, `GERBIL` and `CHECK` lines.
set -euo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
bin=.device/bin
model=/tmp/gerbil-minilm
python3 scripts/device/embed-torch.py "$1" "$model" 2>&1 | grep '^TORCH'
"$bin/gerbilc" compile "$model" -o "$model.plan" --target desktop --quiet
for r in 1 2 3; do
  echo "GERBIL default $("$bin/gerbil-run" "$model.plan" bench --prompt-tokens 128 --batch 64 --repeats 7 --json)"
  echo "GERBIL tensor-cores $("$bin/gerbil-run" "$model.plan" --tensor-cores bench --prompt-tokens 128 --batch 64 --repeats 7 --json)"
done
python3 - "$bin/gerbil-run" "$model" <<'PY'
import json, math, subprocess, sys
run, model = sys.argv[1], sys.argv[2]
refs = json.load(open(f"{model}/refs.json"))
for flags in (["--precision", "f32"], ["--precision", "f16"], ["--tensor-cores"]):
    for text, want in refs.items():
        out = subprocess.run([run, f"{model}.plan", *flags, "embed", "--text", text],
                             capture_output=True, text=True, check=True).stdout
        got = json.loads(out)["embedding"]
        dot = sum(a * b for a, b in zip(got, want))
        cos = dot / math.sqrt(sum(a * a for a in got) * sum(b * b for b in want))
        print("CHECK", " ".join(flags), f"{len(text)} chars: cosine {cos:.10f}")
PY
