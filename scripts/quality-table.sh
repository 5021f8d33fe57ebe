#!/usr/bin/env bash
# The quality table of docs/performance.md: what each --quantize scheme costs against the bf16 plan
# of the same checkpoint, by `gerbil-run perplexity --against` on data/moby-dick.txt (windows of 512
# tokens, the second half of each scored; plans compiled with `--disable-pass slice-last-row` so a
# window's scored half runs in one step, f32 compute).
#
#   scripts/quality-table.sh MODEL_DIR WINDOWS [SCHEMES…]
#
# MODEL_DIR is a HF checkpoint directory (the fixtures' smollm2-135m or gemma3-270m), WINDOWS how
# many windows to score (the text holds 55 for SmolLM2's tokenizer); SCHEMES default to q8_0 q4_0
# q4_k_m q4f16_1. Uses target/release's binaries (cargo build --release -p gerbil-cli --bins).
# Prints one markdown row per scheme; the plans go to a temporary directory, removed at the end.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
model=$1
windows=$2
shift 2
schemes=("$@")
[ ${#schemes[@]} -eq 0 ] && schemes=(q8_0 q4_0 q4_k_m q4f16_1)
bin=target/release
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
# 128-token steps keep a step's logits (every row) within the portable target's 128 MiB binding
# for Gemma's 262k-token vocabulary.
compile() {
    $bin/gerbilc compile "$model" -o "$tmp/$1.plan" --max-context 512 --max-tokens-per-step 128 \
        --disable-pass slice-last-row -q "${@:2}" >/dev/null
}
compile bf16
echo "| scheme | plan MB | perplexity | ratio to bf16 | KLD mean | KLD p99 | top-1 agreement |"
echo "|---|---|---|---|---|---|---|"
for s in "${schemes[@]}"; do
    compile "$s" --quantize "$s"
    mb=$(( $(stat -c %s "$tmp/$s.plan") / 1000000 ))
    $bin/gerbil-run "$tmp/$s.plan" perplexity data/moby-dick.txt --max-windows "$windows" \
        --against "$tmp/bf16.plan" --precision f32 --json -q >"$tmp/$s.json"
    python3 - "$s" "$mb" "$tmp/$s.json" <<'PY'
import json, sys
s, mb, path = sys.argv[1], sys.argv[2], sys.argv[3]
r = json.load(open(path))
c = r["against"]
print(f"| `{s}` | {mb} | {r['perplexity']:.3f} ± {r['perplexity_error']:.3f} | "
      f"{r['perplexity'] / c['base_perplexity']:.4f} | {c['kld_mean']:.4f} ± {c['kld_error']:.4f} | "
      f"{c['kld_p99']:.4f} | {100 * c['top1_agreement']:.2f}% |", flush=True)
PY
done
echo "bf16: $(( $(stat -c %s "$tmp/bf16.plan") / 1000000 )) MB, perplexity $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f\"{r['against']['base_perplexity']:.3f}; {r['scored_tokens']} tokens scored in {r['windows']} windows of {r['window']}\")" "$tmp/${schemes[-1]}.json")"
