#!/usr/bin/env bash
# Training speed (issue 27) on the `device` tool's machine, run from the repo root: gerbil-train
# against PyTorch eager (fused AdamW) in f32 and under bf16 autocast, each shape on random weights.
#
# Expects .device/bin/gerbil-train and .gl/ (the Vulkan loader's packages). For each model shape
# (default: SmolLM2-135M and Llama-3.2-1B, scripts/device/common.sh), makes an f32 random-weight
# model from the config with transformers and gives it a byte-level tokenizer of its vocabulary
# (byte-tokenizer.py), then trains on data/moby-dick.txt for $STEPS steps (default 8) of $BATCH
# sequences (default 4) of $SEQ tokens (default 512):
#   gerbil-train MODEL --data data/moby-dick.txt --steps S --seq-len L --batch B --json-log LOG
#   python3 scripts/device/train-torch.py --speed --config DIR ... --autocast none|bf16
# Tokens/s is the median over the steps after the first two (gerbil: from the log's seconds);
# gerbil's profile of one pass (--profile) goes to profile-SHAPE.json and its summary to
# the output. With LORA=R, both also train a rank-R adapter (`--lora R --lora-alpha 2R`), and
# gerbil-train's LoRA run of $TWIN_STEPS steps (default 30, lr 1e-3, batch 2 of 256 tokens) is
# checked against PyTorch's twin (train-torch.py --lora: the same starting factors), step by step.
# With MIXED=1, gerbil-train also runs with --precision mixed (every matmul on tensor cores), and
# a mixed run of $TWIN_STEPS steps is checked against PyTorch's f32 twin the same way. With
# TORCH=0, PyTorch does not run (its columns read "-", no twin): gerbil's numbers alone, faster;
# with F32=0, neither does gerbil-train's f32 run.
# Writes logs to $OUT (or /tmp/gerbil-train-bench) and prints one markdown table.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
source scripts/device/common.sh
export XDG_RUNTIME_DIR=/tmp
out=${OUT:-/tmp/gerbil-train-bench}
mkdir -p "$out"
steps=${STEPS:-8}
batch=${BATCH:-4}
seq=${SEQ:-512}
echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
shapes=("$@")
[ ${#shapes[@]} -eq 0 ] && shapes=("${default_shapes[@]}")
lora=${LORA:-}
mixed=
[ "${MIXED:-0}" != 0 ] && mixed=1
rows=("| shape | seq × batch | gerbil-train | PyTorch f32 | PyTorch bf16 autocast |${mixed:+ gerbil-train --precision mixed |}${lora:+ gerbil-train --lora $lora | PyTorch f32 --lora $lora |}"
    "|---|---|---|---|---|${mixed:+---|}${lora:+---|---|}")
# Step-by-step losses of two runs' logs: the worst relative difference.
compare() {
    python3 - "$1" "$2" "$3" <<'PY'
import json, sys
g, t = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
if not (g and t):
    sys.exit(f"{sys.argv[3]}: a run wrote no steps")
worst = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(g, t))
print(f"{sys.argv[3]}, {min(len(g), len(t))} steps: loss {t[0]['loss']:.4f} -> "
      f"{t[-1]['loss']:.4f} (PyTorch), {g[-1]['loss']:.4f} (gerbil); worst relative difference {worst:.1e}")
PY
}
twin=(--data data/moby-dick.txt --steps "${TWIN_STEPS:-30}" --seq-len 256 --batch 2 --lr 1e-3)
for cfg in "${shapes[@]}"; do
    name=$(basename "$(dirname "$cfg")")
    work=/tmp/train-$name
    mkdir -p "$work"
    python3 - "$cfg" "$work/model" <<'PY' || { echo "$name: making the model failed"; continue; }
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.from_pretrained(sys.argv[1])
torch.manual_seed(0)
AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(sys.argv[2])
PY
    vocab=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$cfg")
    python3 scripts/device/byte-tokenizer.py --vocab "$vocab" --out "$work/model"
    if [ "${F32:-1}" != 0 ]; then
        .device/bin/gerbil-train "$work/model" --data data/moby-dick.txt --steps "$steps" --seq-len "$seq" \
            --batch "$batch" --lr 1e-5 --out "$work/out" --json-log "$out/gerbil-$name.jsonl" -q \
            --profile "$out/profile-$name.json" > "$out/gerbil-$name.log" 2>&1 ||
            { echo "$name: gerbil-train failed"; tail -5 "$out/gerbil-$name.log"; }
        grep -A16 "one pass" "$out/gerbil-$name.log"
    fi
    gerbil_rate() {
        [ -s "$1" ] || { echo "-"; return; }
        python3 - "$1" "$((batch * seq))" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
t = [b["seconds"] - a["seconds"] for a, b in zip(lines, lines[1:])][1:]
print(round(int(sys.argv[2]) / statistics.median(t)) if t else "-")
PY
    }
    gerbil="-"
    [ "${F32:-1}" != 0 ] && gerbil=$(gerbil_rate "$out/gerbil-$name.jsonl")
    torch_rate() {
        [ "${TORCH:-1}" = 0 ] && { echo "-"; return; }
        python3 scripts/device/train-torch.py --speed --config "$(dirname "$cfg")" --steps "$steps" \
            --seq-len "$seq" --batch "$batch" --autocast "$@" 2> "$out/torch-$name-$1.log" |
            tee -a "$out/torch.jsonl" | python3 -c "import json,sys; print(round(json.load(sys.stdin)['tokens_per_s']))"
    }
    f32=$(torch_rate none)
    bf16=$(torch_rate bf16)
    row="| $name | $seq × $batch | $gerbil | $f32 | $bf16 |"
    if [ -n "$mixed" ]; then
        .device/bin/gerbil-train "$work/model" --data data/moby-dick.txt --steps "$steps" \
            --seq-len "$seq" --batch "$batch" --lr 1e-5 --out "$work/mixed-out" --precision mixed \
            --json-log "$out/gerbil-mixed-$name.jsonl" -q --profile "$out/profile-mixed-$name.json" \
            > "$out/gerbil-mixed-$name.log" 2>&1 ||
            { echo "$name: gerbil-train --precision mixed failed"; tail -5 "$out/gerbil-mixed-$name.log"; }
        grep -A16 "one pass" "$out/gerbil-mixed-$name.log"
        row+=" $(gerbil_rate "$out/gerbil-mixed-$name.jsonl") |"
    fi
    if [ -n "$mixed" ] && [ "${TORCH:-1}" != 0 ]; then
        .device/bin/gerbil-train "$work/model" "${twin[@]}" --precision mixed -q \
            --out "$work/twin-mixed-out" --json-log "$out/twin-mixed-gerbil-$name.jsonl" \
            > "$out/twin-mixed-gerbil-$name.log" 2>&1 || echo "$name: the mixed twin failed"
        python3 scripts/device/train-torch.py --model "$work/model" "${twin[@]}" \
            --json-log "$out/twin-f32-torch-$name.jsonl" 2> "$out/twin-f32-torch-$name.log"
        compare "$out/twin-mixed-gerbil-$name.jsonl" "$out/twin-f32-torch-$name.jsonl" \
            "$name mixed twin (PyTorch f32)"
    fi
    if [ -n "$lora" ]; then
        lora_flags=(--lora "$lora" --lora-alpha "$((2 * lora))")
        .device/bin/gerbil-train "$work/model" --data data/moby-dick.txt --steps "$steps" \
            --seq-len "$seq" --batch "$batch" --lr 1e-5 --out "$work/lora-out" "${lora_flags[@]}" \
            --json-log "$out/gerbil-lora-$name.jsonl" -q --profile "$out/profile-lora-$name.json" \
            > "$out/gerbil-lora-$name.log" 2>&1 ||
            { echo "$name: gerbil-train --lora failed"; tail -5 "$out/gerbil-lora-$name.log"; }
        grep -A16 "one pass" "$out/gerbil-lora-$name.log"
        grep -h "GPU buffers" "$out/gerbil-lora-$name.log"
        [ "${F32:-1}" != 0 ] && grep -h "GPU buffers" "$out/gerbil-$name.log"
        row+=" $(gerbil_rate "$out/gerbil-lora-$name.jsonl") | $(torch_rate none "${lora_flags[@]}") |"
        if [ "${TORCH:-1}" != 0 ]; then
            .device/bin/gerbil-train "$work/model" "${twin[@]}" "${lora_flags[@]}" -q \
                --out "$work/twin-out" --json-log "$out/twin-gerbil-$name.jsonl" \
                > "$out/twin-gerbil-$name.log" 2>&1 || echo "$name: the LoRA twin failed"
            python3 scripts/device/train-torch.py --model "$work/model" "${twin[@]}" "${lora_flags[@]}" \
                --json-log "$out/twin-torch-$name.jsonl" 2> "$out/twin-torch-$name.log"
            compare "$out/twin-gerbil-$name.jsonl" "$out/twin-torch-$name.jsonl" "$name LoRA twin"
        fi
    fi
    rows+=("$row")
done
printf '%s\n' "${rows[@]}" | tee "$out/table.md"
