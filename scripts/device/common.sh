# Sourced by the device scripts (batch-bench.sh, web-bench.sh): what they share.

# The shapes benchmarked when none is given: SmolLM2-135M and Llama-3.2-1B.
default_shapes=(tests/data/models/smollm2-135m/config.json
    scripts/device/configs/llama-3.2-1b/config.json)

# random_model CONFIG WORK: a random-weight bf16 model of CONFIG's shape in WORK/model, made with
# transformers by .device/random_ref.py (its reference in WORK/ref.json), with a byte tokenizer of
# the config's vocabulary (byte-tokenizer.py), so serving and chat templates work.
random_model() {
    python3 .device/random_ref.py --config "$1" --out "$2" --lens 13 --dtype bfloat16 >/dev/null 2>&1 ||
        return 1
    local vocab
    vocab=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$1")
    python3 scripts/device/byte-tokenizer.py --vocab "$vocab" --out "$2/model"
}
