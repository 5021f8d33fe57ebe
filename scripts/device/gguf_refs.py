#!/usr/bin/env python3
"""transformers references for the tiny quantized GGUF files (scripts/make-tiny-gguf.py).

On a machine with torch and transformers (and gguf-py, which transformers loads GGUF through):

    python3 scripts/device/gguf_refs.py fixtures/tiny-gguf OUT_DIR

For every `<family>-<TYPE>.gguf`, transformers loads the file itself
(`from_pretrained(dir, gguf_file=...)`, dequantizing to float32) and runs the inputs of
tests/data/refs/tiny/<family>.json: OUT_DIR/<family>-<TYPE>.json in the same "tiny-ref-v1" schema
(last_logits, greedy_ids, greedy_margins; float32, eager attention). A file transformers cannot
load is reported and skipped: its loader does not map every key gerbil reads (Qwen 3's
`attention.key_length`, for one).
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

torch.backends.cuda.matmul.allow_tf32 = False
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(src, out):
    os.makedirs(out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for f in sorted(os.listdir(src)):
        stem = f[:-len(".gguf")]
        if "-" not in stem:
            continue
        family = stem.split("-")[0]
        with open(os.path.join(REPO, "tests/data/refs/tiny", f"{family}.json")) as fh:
            inputs = [c["input_ids"] for c in json.load(fh)["cases"]]
        try:
            model = AutoModelForCausalLM.from_pretrained(
                src, gguf_file=f, dtype=torch.float32, attn_implementation="eager").to(dev).eval()
            cases = run(model, inputs, dev)
        except Exception as e:  # noqa: BLE001 - reported, then the next file
            print(f"{f}: transformers cannot run it: {type(e).__name__}: {str(e)[:300]}")
            continue
        ref = {"schema": "tiny-ref-v1", "model": stem, "model_dir": f"fixtures/tiny-gguf/{f}",
               "architecture": model.config.architectures[0] if model.config.architectures else "",
               "checkpoint_dtype": "gguf", "seed": 0,
               "compute": f"float32 (transformers {transformers.__version__} dequantizing the GGUF), "
                          f"attn_implementation=eager, {dev}, batch 1",
               "generator": {"script": "scripts/device/gguf_refs.py"},
               "greedy": {"new_tokens": 8}, "cases": cases}
        with open(os.path.join(out, f"{stem}.json"), "w") as fh:
            json.dump(ref, fh, separators=(",", ":"))
        print(f"{f}: " + ", ".join(f"{c['name']} greedy {c['greedy_ids']}" for c in cases))


def run(model, inputs, dev):
    """Last logits and 8 greedy tokens (full recompute each step) for each prompt."""
    cases = []
    with torch.no_grad():
        for ids in inputs:
            logits = model(torch.tensor([ids], device=dev)).logits[0].float().cpu()
            case = {"name": f"len{len(ids)}", "input_ids": ids, "last_logits": logits[-1].tolist()}
            out_ids, margins, cur = [], [], list(ids)
            for _ in range(8):
                l = model(torch.tensor([cur], device=dev)).logits[0, -1].float().cpu()
                t = torch.topk(l, 2).values
                margins.append(float(t[0] - t[1]))
                out_ids.append(int(torch.argmax(l)))
                cur = cur + out_ids[-1:]
            case["greedy_ids"], case["greedy_margins"] = out_ids, margins
            cases.append(case)
    return cases


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
