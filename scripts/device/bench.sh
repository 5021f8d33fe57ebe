#!/usr/bin/env bash
# The H100 benchmark of docs/performance.md, run from the repo root on the `device` tool's machine.
#
# Expects what scripts/device/check-gpu.sh expects (.device/bin/{gerbilc,gerbil-run},
# .device/random_ref.py, .gl/), see docs/gpu-checks.md. For each model shape (default: SmolLM2-135M,
# Gemma 3 270M, Llama-3.2-1B), makes a random-weight bf16 model of that shape with transformers,
# compiles it as a user would (the default target, context 4608), checks its last-position logits against
# transformers (scripts/check-ref.py, one 13-token prompt: f32 within 1e-4 per unit of max |logit|,
# f16 within 5e-2), and runs for each precision variant (f16, f32), in the llama-bench convention,
#   gerbil-run bench --precision P --prompt-tokens 512 --new-tokens 128 --depth 0    --repeats 5 --json   (pp512, tg128)
#   gerbil-run bench --precision P --prompt-tokens 512 --new-tokens 128 --depth 4096 --repeats 3 --json   (tg128 @ d4096)
# (medians of the repeats after a warm-up; the depth-4096 run also samples the driver's GPU memory
# for the process with nvidia-smi), a sampled tg128 (f16), pp512 of each of the plan's variants
# (`--variant`: tensor cores, subgroups, portable), the time to first token of a 512-token prompt,
# load included, with a cold and a warm pipeline cache (`bench --cold`, then three warm runs; the
# driver's own shader cache off), then HF transformers on the same weights
# (scripts/device/hf-bench.py: f16, static cache; HF_COMPILE=1 adds torch.compile). The driver's
# count for a process that holds only the tiny Llama plan (~0.1 MiB of buffers) is the fixed cost of
# a Vulkan context, subtracted before comparing with the plan's bytes. Writes the JSON and logs to
# $OUT (or /tmp/gerbil-bench) and prints one markdown table with llama.cpp's H100 figures (from
# issue 8/9, same shapes, F16) beside ours.
#
# PARTS (default decode,prefill,start,hf,quant) picks what runs, to fit one device call: decode (the
# precision benches, depth 4096, sampled), prefill (pp512 per variant), start (TTFT cold / warm),
# hf (HF transformers), quant (the same weights compiled with `--quantize` for each of QUANTS,
# default "q8_0 q4_0": pp512, tg128 and GPU memory in f16 compute beside the bf16 plan's). The checks against transformers always run. The tensor-core variant is
# what a plain run picks on a GPU that has them; GERBIL_TENSOR_CORES=0 in the environment turns
# it off (gerbil-run maps it onto SessionOptions::tensor_cores) and benches the SIMT variants.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export XDG_RUNTIME_DIR=/tmp
out=${OUT:-/tmp/gerbil-bench}
mkdir -p "$out"
bin=.device/bin
status=0
parts=",${PARTS:-decode,prefill,start,hf,quant},"
quants=${QUANTS:-q8_0 q4_0}
part() { [[ $parts == *",$1,"* ]]; }
shapes=("$@")
[ ${#shapes[@]} -eq 0 ] && shapes=(tests/data/models/smollm2-135m/config.json
    tests/data/models/gemma3-270m/config.json scripts/device/configs/llama-3.2-1b/config.json)
echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"

# Runs gerbil-run with the given arguments in the background while sampling the driver's GPU
# memory for its process; writes {"driver_mib": peak, "driver_last_mib": steady} to $1, the steady
# state being the median of the samples (the process spends most of its life with every buffer
# allocated; the first and last samples may fall in its start or exit).
with_memory() {
    local mem=$1
    shift
    $bin/gerbil-run "$@" &
    local pid=$! m samples=()
    while kill -0 $pid 2>/dev/null; do
        m=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null \
            | awk -F', ' -v p=$pid '$1 == p { print $2 }')
        [ -n "$m" ] && samples+=("$m")
        sleep 0.2
    done
    wait $pid
    local rc=$? peak=0 steady=0
    if [ ${#samples[@]} -gt 0 ]; then
        peak=$(printf '%s\n' "${samples[@]}" | sort -n | tail -1)
        steady=$(printf '%s\n' "${samples[@]}" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    fi
    echo "{\"driver_mib\": $peak, \"driver_last_mib\": $steady}" > "$mem"
    return $rc
}

# The fixed cost of a process's Vulkan context: the tiny Llama plan decoding.
$bin/gerbilc compile tests/data/models/tiny/llama -o /tmp/tiny-llama.plan 2>/dev/null \
    && with_memory "$out/mem-baseline.json" /tmp/tiny-llama.plan bench --prompt-tokens 8 --new-tokens 100 \
        --repeats 30 --json > "$out/bench-baseline.json" 2>"$out/bench-baseline.log" || status=1

for cfg in "${shapes[@]}"; do
    name=$(basename "$(dirname "$cfg")")
    work=/tmp/bench-$name
    python3 .device/random_ref.py --config "$cfg" --out "$work" --lens 13 --dtype bfloat16 >/dev/null 2>&1 \
        || { echo "$name: making the random model failed"; status=1; continue; }
    $bin/gerbilc compile "$work/model" -o "$work/model.plan" --max-context 4608 2>/dev/null \
        || { echo "$name: compile failed"; status=1; continue; }
    python3 scripts/check-ref.py --run $bin/gerbil-run --plan "$work/model.plan" --ref "$work/ref.json" \
        > "$out/check-$name-f32.log" 2>&1 || status=1
    python3 scripts/check-ref.py --run $bin/gerbil-run --plan "$work/model.plan" --ref "$work/ref.json" \
        --precision f16 --abs-tol 5e-2 > "$out/check-$name-f16.log" 2>&1 || status=1
    for p in f16 f32; do
        part decode || continue
        $bin/gerbil-run "$work/model.plan" bench --precision $p --prompt-tokens 512 --new-tokens 128 \
            --depth 0 --repeats 5 --json > "$out/bench-$name-$p-d0.json" 2>>"$out/bench-$name.log" || status=1
        # tg128 at depth 4096, while sampling the driver's view of the process's GPU memory.
        with_memory "$out/mem-$name-$p.json" "$work/model.plan" bench --precision $p --prompt-tokens 512 \
            --new-tokens 128 --depth 4096 --repeats 3 --json \
            > "$out/bench-$name-$p-d4096.json" 2>>"$out/bench-$name.log" || status=1
    done
    # Sampled decode (temperature 0.8, top-k 40, top-p 0.95) at depth 0.
    if part decode; then
        $bin/gerbil-run "$work/model.plan" bench --precision f16 --prompt-tokens 512 --new-tokens 128 \
            --depth 0 --repeats 5 --json --temperature 0.8 --top-k 40 --top-p 0.95 \
            > "$out/bench-$name-f16-sampled.json" 2>>"$out/bench-$name.log" || status=1
    fi
    # Prefill of each of the plan's GPU variants (--variant): tensor cores, subgroups, portable (not
    # `cpu`, made for CPU adapters).
    variants=$($bin/gerbilc inspect "$work/model.plan" --json \
        | python3 -c "import json, sys; print(' '.join(v['name'] for v in json.load(sys.stdin)['variants'] if 'cpu' not in v['features']))")
    for v in $variants; do
        part prefill || continue
        $bin/gerbil-run "$work/model.plan" bench --variant "$v" --prompt-tokens 512 --new-tokens 8 --repeats 5 \
            --json > "$out/pp-$name-$v.json" 2>>"$out/bench-$name.log" || echo '{}' > "$out/pp-$name-$v.json"
    done
    echo "$variants" > "$out/variants-$name.txt"
    # Time to first token of a 512-token prompt, load included: a cold start (--cold: an empty
    # pipeline cache; the driver's own shader cache off) then three warm ones (the cache it wrote).
    for run in cold warm1 warm2 warm3; do
        part start || continue
        flag=""
        [ $run = cold ] && flag=--cold
        GERBIL_CACHE_DIR="$work/cache" __GL_SHADER_DISK_CACHE=0 $bin/gerbil-run "$work/model.plan" bench $flag \
            --prompt-tokens 512 --new-tokens 4 --repeats 1 --json > "$out/ttft-$name-$run.json" \
            2>>"$out/bench-$name.log" || status=1
    done
    # The same weights quantized (--quantize each of QUANTS), beside the bf16 plan in f16 compute:
    # pp512 and tg128 at depth 0 with the driver's GPU memory.
    for q in $quants; do
        part quant || continue
        if [ ! -s "$out/bench-$name-f16-d0.json" ]; then
            $bin/gerbil-run "$work/model.plan" bench --precision f16 --prompt-tokens 512 --new-tokens 128 \
                --depth 0 --repeats 5 --json > "$out/bench-$name-f16-d0.json" 2>>"$out/bench-$name.log" || status=1
        fi
        $bin/gerbilc compile "$work/model" -o "$work/model-$q.plan" --max-context 4608 \
            --quantize "$q" 2>>"$out/bench-$name.log" || { echo "$name $q: compile failed"; status=1; continue; }
        with_memory "$out/mem-$name-$q.json" "$work/model-$q.plan" bench --precision f16 --prompt-tokens 512 \
            --new-tokens 128 --depth 0 --repeats 5 --json > "$out/bench-$name-$q.json" \
            2>>"$out/bench-$name.log" || status=1
        $bin/gerbilc inspect "$work/model-$q.plan" | grep '^weights' > "$out/weights-$name-$q.txt"
    done
    hf_flags=""
    [ "${HF_COMPILE:-0}" = 1 ] && hf_flags=--compile
    part hf && { python3 scripts/device/hf-bench.py "$work/model" $hf_flags > "$out/hf-$name.json" \
        2>"$out/hf-$name.log" || echo "{}" > "$out/hf-$name.json"; }
done
QUANTS="$quants" python3 - "$out" "${shapes[@]}" <<'PY'
import json, os, sys
out, shapes = sys.argv[1], sys.argv[2:]
# llama.cpp on the same H100, F16 (issue 8 and 9): pp512, tg128.
llama = {"smollm2-135m": {"vk": (15541, 528), "cuda": (92706, 947)},
         "llama-3.2-1b": {"vk": (15467, 567), "cuda": (77534, 688)}}
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return {}
base = load(f"{out}/mem-baseline.json").get("driver_last_mib", 0)
print(f"Vulkan context baseline (driver's count for the tiny Llama plan's process): {base} MiB")
print()
print("| shape | variant | pp512 | tg128 | tg128 @ d4096 (ratio) | tg128 sampled (ratio) | GPU memory: driver − baseline / plan (steady) | HF f16 pp512 / tg128 / d4096 | llama.cpp Vulkan pp512 / tg128 | llama.cpp CUDA pp512 / tg128 | check |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for cfg in shapes:
    name = os.path.basename(os.path.dirname(cfg))
    hf = load(f"{out}/hf-{name}.json")
    h = " / ".join(f"{hf[k]:.0f}" if k in hf else "–" for k in ("pp512", "tg128_d0", "tg128_d4096"))
    l = llama.get(name, {})
    vk = " / ".join(map(str, l["vk"])) if "vk" in l else "–"
    cu = " / ".join(map(str, l["cuda"])) if "cuda" in l else "–"
    for p in ("f16", "f32"):
        d0, d4, mem = (load(f"{out}/{f}") for f in (f"bench-{name}-{p}-d0.json", f"bench-{name}-{p}-d4096.json",
                                                   f"mem-{name}-{p}.json"))
        sm = load(f"{out}/bench-{name}-{p}-sampled.json")
        try:
            check = open(f"{out}/check-{name}-{p}.log").read().strip().splitlines()[-1]
        except Exception:
            check = "?"
        if not d0:
            print(f"| {name} | {p}: not run (PARTS) or failed | | | | | | | | | {check} |")
            continue
        tg0, tg4 = d0["decode_tok_s"], d4.get("decode_tok_s", float("nan"))
        ts = sm.get("decode_tok_s")
        sampled = f"{ts:.1f} ({ts / tg0:.0%})" if ts else "–"
        plan_mib = sum(d4.get(k, 0) for k in ("weights_bytes", "kv_cache_bytes", "activation_bytes")) / 2**20
        drv, last = mem.get("driver_mib", 0), mem.get("driver_last_mib", 0)
        m = (f"{drv - base:.0f} peak, {last - base:.0f} decoding / {plan_mib:.0f} MiB ({(last - base) / plan_mib - 1:+.1%})"
             if last and plan_mib else "–")
        print(f"| {name} | {d0['variant']} ({d0.get('precision', '?')}, {d0.get('decode_loop', '?')}) | "
              f"{d0['prefill_tok_s']:.0f} | {tg0:.1f} | {tg4:.1f} ({tg4 / tg0:.0%}) | {sampled} | {m} | {h} | "
              f"{vk} | {cu} | {check} |")
print()
# llama.cpp pp512 on the same H100 (issue 9): Vulkan without tensor cores, Vulkan KHR coopmat, CUDA.
llama_pp = {"smollm2-135m": (15541, 21540, 92706), "llama-3.2-1b": (15467, 34636, 77534)}
print("| shape | variant (features) | pp512 | load ms | first token ms | llama.cpp pp512: Vulkan / KHR coopmat / CUDA |")
print("|---|---|---|---|---|---|")
for cfg in shapes:
    name = os.path.basename(os.path.dirname(cfg))
    try:
        variants = open(f"{out}/variants-{name}.txt").read().split()
    except Exception:
        variants = []
    ref = " / ".join(map(str, llama_pp[name])) if name in llama_pp else "–"
    for v in variants:
        r = load(f"{out}/pp-{name}-{v}.json")
        if not r:
            print(f"| {name} | {v} | not run on this GPU | | | {ref} |")
            continue
        print(f"| {name} | {v} ({r.get('precision', '?')}) | {r['prefill_tok_s']:.0f} | {r.get('load_ms', 0):.0f} | "
              f"{r.get('first_token_ms', 0):.0f} | {ref} |")
print()
# Quantized plans (--quantize) beside the bf16 plan, f16 compute, depth 0.
quants = os.environ.get("QUANTS", "").split()
if quants:
    print("| shape | weights | weight MiB | pp512 (× bf16) | tg128 (× bf16) | GPU memory: driver − baseline / plan |")
    print("|---|---|---|---|---|---|")
for cfg in shapes if quants else []:
    name = os.path.basename(os.path.dirname(cfg))
    bf = load(f"{out}/bench-{name}-f16-d0.json")
    for q in ["bf16"] + quants:
        r = bf if q == "bf16" else load(f"{out}/bench-{name}-{q}.json")
        if not r:
            print(f"| {name} | {q} | failed | | | |")
            continue
        mem = load(f"{out}/mem-{name}-{q}.json")
        plan_mib = sum(r.get(k, 0) for k in ("weights_bytes", "kv_cache_bytes", "activation_bytes")) / 2**20
        last = mem.get("driver_last_mib", 0)
        m = f"{last - base:.0f} / {plan_mib:.0f} MiB ({(last - base) / plan_mib - 1:+.1%})" if last and plan_mib else "–"
        pp, tg = r["prefill_tok_s"], r["decode_tok_s"]
        rel = lambda v, k: f" ({v / bf[k]:.2f})" if bf and q != "bf16" else ""
        print(f"| {name} | {q} | {r.get('weights_bytes', 0) / 2**20:.0f} | {pp:.0f}{rel(pp, 'prefill_tok_s')} | "
              f"{tg:.1f}{rel(tg, 'decode_tok_s')} | {m} |")
print()
# Start-up: load and time to first token of a 512-token prompt, cold and warm pipeline cache.
print("| shape | variant | pipelines (threads) | load ms cold / warm | of which pipelines ms cold / warm | TTFT 512 ms cold / warm (median of 3) |")
print("|---|---|---|---|---|---|")
for cfg in shapes:
    name = os.path.basename(os.path.dirname(cfg))
    cold = load(f"{out}/ttft-{name}-cold.json")
    warm = sorted((load(f"{out}/ttft-{name}-warm{i}.json") for i in (1, 2, 3)),
                  key=lambda r: r.get("first_token_ms", float("inf")))[1]
    if not cold or not warm:
        print(f"| {name} | failed | | | | |")
        continue
    print(f"| {name} | {warm['variant']} | {warm['pipelines']} ({warm['pipeline_threads']}) | "
          f"{cold['load_ms']:.0f} / {warm['load_ms']:.0f} | {cold['load_pipelines_ms']:.0f} / {warm['load_pipelines_ms']:.0f} | "
          f"{cold['first_token_ms']:.0f} / {warm['first_token_ms']:.0f} ({warm['pipeline_cache']}) |")
PY
exit $status
