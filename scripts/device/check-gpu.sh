#!/usr/bin/env bash
# GPU correctness and speed check on a real GPU machine (the `device` tool's H100), run from the repo root.
#
# Expects, in the carried, git-ignored folder .device/:
#   bin/gerbilc, bin/gerbil-run     release builds (cargo build --release -p gerbil-cli)
#   bin/e2e                         the e2e test binary (cargo test --release -p gerbil-e2e --test e2e --no-run)
#   random_ref.py                   makes a random-weight HF model + its transformers reference (torch there)
# and .gl/ with the Vulkan loader .debs (see docs/gpu-checks.md).
#
# 1. the tiny-model e2e tests and the random-graph pass-equivalence test through the GPU's real Vulkan driver;
# 2. for each config given (default: SmolLM2-135M's), a random-weight model of that shape made with
#    transformers on this machine, compiled with gerbilc, checked with scripts/check-ref.py;
# 3. gerbil-run bench (with --profile) on that model.
# Writes logs to $OUT (or /tmp/gerbil-gpu).
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export XDG_RUNTIME_DIR=/tmp GERBIL_REPO=$PWD
out=${OUT:-/tmp/gerbil-gpu}
mkdir -p "$out"
bin=.device/bin
status=0

echo "=== tiny models (e2e tests) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
$bin/e2e models::tiny models::chunked models::weights_larger models::every_optional models::every_position models::odd --test-threads=1 2>&1 | tee "$out/tiny.log" | grep -E "^test |test result" || status=1
echo "=== random graphs: every pass preserves results"
$bin/e2e passes:: 2>&1 | tee "$out/passes.log" | grep -E "^test |test result" || status=1

configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(tests/data/models/smollm2-135m/config.json)
for cfg in "${configs[@]}"; do
    name=$(basename "$(dirname "$cfg")")
    work=/tmp/rand-$name
    echo "=== random-weight $name from $cfg"
    python3 .device/random_ref.py --config "$cfg" --out "$work" --lens 1,13,100 --dtype bfloat16 2>&1 | tail -1
    $bin/gerbilc compile "$work/model" -o "$work/model.plan" --target desktop || { status=1; continue; }
    python3 scripts/check-ref.py --run $bin/gerbil-run --plan "$work/model.plan" --ref "$work/ref.json" \
        | tee "$out/check-$name.log" || status=1
    echo "=== bench $name"
    $bin/gerbil-run "$work/model.plan" bench --prompt-tokens 128 --new-tokens 128 --repeats 3 --profile \
        2>&1 | tee "$out/bench-$name.log"
done
exit $status
