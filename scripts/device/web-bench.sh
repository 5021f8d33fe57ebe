#!/usr/bin/env bash
# The browser engine on a GPU, beside native gerbil-run: run from the repo root on the `device`
# tool's machine, which has no browser. The engine (crates/web, scripts/web.sh's folder carried
# as .device/web) runs in Deno (.device/deno), whose WebGPU is wgpu behind the browser's
# JavaScript API: a browser-grade WebGPU runtime, through scripts/deno-bench.js.
#
#   scripts/device/web-bench.sh [CONFIG.json ...]    # default: SmolLM2-135M and Llama-3.2-1B shapes
#
# Expects .device/bin/{gerbilc,gerbil-run}, .device/random_ref.py, .device/deno, .device/web and
# .gl/ (see docs/gpu-checks.md). For each shape: a random-weight bf16 model (transformers) with a
# byte tokenizer, compiled with --quantize q4_0 for the default (portable) target, the variant a
# browser runs; then, on that one plan,
#   gerbil-run PLAN bench --prompt-tokens 16 --new-tokens 128 --repeats 5 --json
#   deno run --allow-read scripts/deno-bench.js .device/web PLAN --prompt-tokens 16 --new-tokens 128 --runs 5
# and prints a markdown table of decode tok/s (medians after a warm-up) and their ratio. Logs and
# JSON go to $OUT (or /tmp/gerbil-web-bench).
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
source scripts/device/common.sh
export XDG_RUNTIME_DIR=/tmp NO_COLOR=1
out=${OUT:-/tmp/gerbil-web-bench}
mkdir -p "$out"
bin=.device/bin
status=0
echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
shapes=("$@")
[ ${#shapes[@]} -eq 0 ] && shapes=("${default_shapes[@]}")
rows=()
for cfg in "${shapes[@]}"; do
    name=$(basename "$(dirname "$cfg")")
    work=/tmp/web-$name
    random_model "$cfg" "$work" || { echo "$name: making the random model failed"; status=1; continue; }
    plan=$work/q4_0.plan
    $bin/gerbilc compile "$work/model" -o "$plan" --quantize q4_0 > "$out/compile-$name.log" 2>&1 \
        || { echo "$name: compile failed"; status=1; continue; }
    $bin/gerbil-run "$plan" bench --prompt-tokens 16 --new-tokens 128 --repeats 5 --json \
        > "$out/native-$name.json" 2> "$out/native-$name.log" || status=1
    .device/deno run --allow-read scripts/deno-bench.js .device/web "$plan" --prompt-tokens 16 \
        --new-tokens 128 --runs 5 > "$out/deno-$name.jsonl" 2> "$out/deno-$name.log" || status=1
    rows+=("$name")
done
python3 - "$out" "${rows[@]}" <<'PY'
import json, sys
out = sys.argv[1]
print("| shape (q4_0) | native variant | native decode tok/s | Deno WebGPU variant | Deno decode tok/s | Deno / native | Deno load ms | wasm memory |")
print("|---|---|---|---|---|---|---|---|")
for name in sys.argv[2:]:
    try:
        n = json.load(open(f"{out}/native-{name}.json"))
    except (OSError, ValueError):
        n = {}
    lines = []
    try:
        lines = [json.loads(l) for l in open(f"{out}/deno-{name}.jsonl") if l.startswith("{")]
    except (OSError, ValueError):
        pass
    info = lines[0] if lines else {}
    last = lines[-1] if lines else {}
    native = n.get("decode_tok_s")
    deno = last.get("median_decode_tok_s")
    ratio = f"{deno / native:.2f}×" if native and deno else "—"
    fmt = lambda v: f"{v:,.0f}" if isinstance(v, (int, float)) else "—"
    wasm = info.get("wasm_memory_bytes")
    print(f"| {name} | {n.get('variant', '—')} {n.get('precision', '')} | {fmt(native)} | "
          f"{info.get('variant', '—')} | {fmt(deno)} | {ratio} | {fmt(info.get('load_ms'))} | "
          f"{wasm / 2**20:.0f} MiB |" if wasm else
          f"| {name} | {n.get('variant', '—')} | {fmt(native)} | — | — | — | — | — |")
PY
exit $status
