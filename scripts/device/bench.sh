#!/usr/bin/env bash
# The H100 benchmark of docs/performance.md, run from the repo root on the `device` tool's machine.
#
# Expects what scripts/device/check-gpu.sh expects (.device/bin/{gerbilc,gerbil-run},
# .device/random_ref.py, .gl/), see docs/gpu-checks.md. For each model shape (default: SmolLM2-135M,
# Gemma 3 270M, Llama-3.2-1B), makes a random-weight bf16 model of that shape with transformers,
# compiles it for the desktop target, checks its last-position logits against transformers
# (scripts/check-ref.py, one 13-token prompt), and runs
#   gerbil-run bench --prompt-tokens 512 --new-tokens 128 --repeats 5 [--json]
# (prefill and decode tok/s are medians of the repeats). Writes bench-NAME.json and bench-NAME.log to
# $OUT (or /tmp/gerbil-bench) and prints one summary line per shape.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export XDG_RUNTIME_DIR=/tmp
out=${OUT:-/tmp/gerbil-bench}
mkdir -p "$out"
bin=.device/bin
status=0
shapes=("$@")
[ ${#shapes[@]} -eq 0 ] && shapes=(tests/data/models/smollm2-135m/config.json
    tests/data/models/gemma3-270m/config.json scripts/device/configs/llama-3.2-1b/config.json)
echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
for cfg in "${shapes[@]}"; do
    name=$(basename "$(dirname "$cfg")")
    work=/tmp/bench-$name
    python3 .device/random_ref.py --config "$cfg" --out "$work" --lens 13 --dtype bfloat16 >/dev/null 2>&1 \
        || { echo "$name: making the random model failed"; status=1; continue; }
    $bin/gerbilc compile "$work/model" -o "$work/model.plan" --target desktop 2>/dev/null \
        || { echo "$name: compile failed"; status=1; continue; }
    python3 scripts/check-ref.py --run $bin/gerbil-run --plan "$work/model.plan" --ref "$work/ref.json" \
        > "$out/check-$name.log" 2>&1 || status=1
    $bin/gerbil-run "$work/model.plan" bench --prompt-tokens 512 --new-tokens 128 --repeats 5 \
        > "$out/bench-$name.log" 2>&1
    $bin/gerbil-run "$work/model.plan" bench --prompt-tokens 512 --new-tokens 128 --repeats 5 --json \
        > "$out/bench-$name.json" 2>/dev/null || status=1
    python3 - "$name" "$out/bench-$name.json" "$out/check-$name.log" <<'PY'
import json, sys
name, path, check = sys.argv[1:]
r = json.load(open(path))
ok = open(check).read().strip().splitlines()[-1]
print(f"{name:14} variant {r['variant']:9} pp512 {r['prefill_tok_s']:8.0f} tok/s   tg128 {r['decode_tok_s']:6.1f} tok/s"
      f"   dispatches {r['dispatches'][0]}/{r['dispatches'][1]}   check: {ok}")
PY
done
exit $status
