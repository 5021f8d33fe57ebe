#!/usr/bin/env bash
# Many users on one GPU (issue 23), measured on the `device` tool's machine, run from the repo root.
#
# Expects what scripts/device/bench.sh expects (.device/bin/{gerbilc,gerbil-run}, .device/random_ref.py,
# .gl/; .device/bin/e2e for the batch tests). First runs the e2e batch tests (batch rows against
# one sequence's steps, every family) through the GPU's driver. Then, for each model shape (default:
# SmolLM2-135M and Llama-3.2-1B), makes a random-weight bf16 model with transformers, gives it a
# byte-level tokenizer of its vocabulary (scripts/device/byte-tokenizer.py: random weights come
# without one, and serving needs text), compiles it for the desktop target with `--max-batch $BATCH`
# (default 16) as it is and with `--quantize` for each of QUANTS (default q4_0), checks the bf16
# plan's f16 logits against transformers, and for each plan runs
#   gerbil-run PLAN bench --precision f16 --prompt-tokens 16 --new-tokens 128 --batch $BATCH --repeats 3 --json
#   python3 scripts/serve-bench.py --plan PLAN --clients $BATCH --tokens 128     (16 clients, 128-token answers)
# RUN_FLAGS (e.g. "--no-tensor-cores") go to both `bench` and `serve`.
# Writes the JSON and logs to $OUT (or /tmp/gerbil-batch) and prints one markdown table.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
source scripts/device/common.sh
export XDG_RUNTIME_DIR=/tmp GERBIL_REPO=$PWD
out=${OUT:-/tmp/gerbil-batch}
mkdir -p "$out"
bin=.device/bin
batch=${BATCH:-16}
quants=${QUANTS:-q4_0}
read -r -a run_flags <<< "${RUN_FLAGS:-}"
serve_args=()
for f in "${run_flags[@]}"; do serve_args+=("--serve-arg=$f"); done
status=0
echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
if [ -x $bin/e2e ] && [ -z "${SKIP_TESTS:-}" ]; then
    $bin/e2e batch:: --test-threads=1 > "$out/e2e-batch.log" 2>&1 || status=1
    grep -E "^test |test result" "$out/e2e-batch.log"
fi
shapes=("$@")
[ ${#shapes[@]} -eq 0 ] && shapes=("${default_shapes[@]}")
rows=()
for cfg in "${shapes[@]}"; do
    name=$(basename "$(dirname "$cfg")")
    work=/tmp/batch-$name
    random_model "$cfg" "$work" || { echo "$name: making the random model failed"; status=1; continue; }
    for w in bf16 $quants; do
        plan=$work/$w.plan
        flags=()
        [ "$w" != bf16 ] && flags=(--quantize "$w")
        $bin/gerbilc compile "$work/model" -o "$plan" --target desktop --max-batch "$batch" "${flags[@]}" \
            > "$out/compile-$name-$w.log" 2>&1 || { echo "$name $w: compile failed"; status=1; continue; }
        if [ "$w" = bf16 ]; then
            python3 scripts/check-ref.py --run $bin/gerbil-run --plan "$plan" --ref "$work/ref.json" \
                --precision f16 --abs-tol 5e-2 > "$out/check-$name-f16.log" 2>&1 || status=1
            tail -1 "$out/check-$name-f16.log"
        fi
        $bin/gerbil-run "$plan" bench --precision f16 --prompt-tokens 16 --new-tokens 128 --batch "$batch" \
            --repeats 3 --json "${run_flags[@]}" > "$out/bench-$name-$w.json" 2> "$out/bench-$name-$w.log" || status=1
        python3 scripts/serve-bench.py --bin $bin/gerbil-run --plan "$plan" --clients "$batch" --tokens 128 \
            "${serve_args[@]}" > "$out/serve-$name-$w.json" 2> "$out/serve-$name-$w.log" || status=1
        rows+=("$name $w")
    done
done
python3 - "$out" "${rows[@]}" <<'PY'
import json, sys
out = sys.argv[1]
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return {}
print("| shape | weights | decode alone | batch step (rows) | × alone | serve: 1 client | serve: N clients | × | TTFT p50 / p99 | answers equal |")
print("|---|---|---|---|---|---|---|---|---|---|")
for row in sys.argv[2:]:
    name, w = row.split()
    b = load(f"{out}/bench-{name}-{w}.json")
    s = load(f"{out}/serve-{name}-{w}.json")
    bb = b.get("batch") or {}
    def f(v, fmt="{:,.0f}"):
        return fmt.format(v) if isinstance(v, (int, float)) else "–"
    print(f"| {name} | {w} | {f(b.get('decode_tok_s'))} | {f(bb.get('tok_s'))} ({bb.get('rows', '–')}) | "
          f"{f(bb.get('vs_one'), '{:.1f}')} | {f(s.get('single_client_tok_s'))} | {f(s.get('aggregate_tok_s'))} | "
          f"{f(s.get('ratio'), '{:.1f}')} | {f(1e3 * s['ttft_p50_s'] if 'ttft_p50_s' in s else None, '{:.0f}')} / {f(1e3 * s['ttft_p99_s'] if 'ttft_p99_s' in s else None, '{:.0f}')} ms | "
          f"{s.get('answers_equal_solo', '–')} |")
PY
exit $status
