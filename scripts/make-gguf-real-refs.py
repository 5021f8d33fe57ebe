#!/usr/bin/env python3
"""transformers references for the real quantized GGUF files of the fixtures.

    python3 scripts/make-gguf-real-refs.py FIXTURES
    (torch, transformers, gguf and numpy installed; a CPU is enough, ~1 minute)

For SmolLM2-135M-Instruct.Q4_1.gguf and gemma-3-270m-q4_k_m.gguf (scripts/build-fixtures.py puts
them under FIXTURES/<model>/gguf/), transformers loads the file itself (`from_pretrained(dir,
gguf_file=...)`, dequantizing every tensor to float32) and runs the prompts of the float model's
reference (tests/data/refs/<model>.json, the same input ids): 32 greedy tokens with the KV cache
(end of sequence not honoured), the top-10 logits and the greedy margin of every step. Writes
tests/data/refs/<model>-<quant>.json in that reference's `real-ref-v1` schema.
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = [("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf", "q4_1"),
         ("gemma3-270m", "gemma-3-270m-q4_k_m.gguf", "q4_k_m")]


def greedy(model, ids, steps):
    """`steps` greedy tokens after `ids`, with each step's top-10 logits and margin."""
    out, top10, margins = [], [], []
    past = None
    inp = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(steps):
            r = model(input_ids=inp, past_key_values=past, use_cache=True)
            past = r.past_key_values
            logits = r.logits[0, -1].float()
            vals, idx = torch.topk(logits, 10)
            top10.append([[int(i), float(v)] for v, i in zip(vals, idx)])
            margins.append(float(vals[0] - vals[1]))
            tok = int(idx[0])
            out.append(tok)
            inp = torch.tensor([[tok]])
    return out, top10, margins


def main(fixtures):
    torch.manual_seed(0)
    for model_name, file, quant in FILES:
        d = os.path.join(fixtures, model_name, "gguf")
        with open(os.path.join(REPO, "tests/data/refs", f"{model_name}.json")) as f:
            base = json.load(f)
        model = AutoModelForCausalLM.from_pretrained(
            d, gguf_file=file, dtype=torch.float32, attn_implementation="eager").eval()
        tok = AutoTokenizer.from_pretrained(os.path.join(fixtures, model_name))
        prompts = []
        for p in base["prompts"]:
            steps = p["max_new_tokens"]
            ids, top10, margins = greedy(model, p["input_ids"], steps)
            eos = p["eos_token_ids"]
            stop = next((i for i, t in enumerate(ids) if t in eos), None)
            until = ids if stop is None else ids[:stop + 1]
            q = dict(p)
            q.update({
                "greedy_ids": ids, "stop_at": stop, "top10": top10, "greedy_margins": margins,
                "generated_text": tok.decode(ids),
                "generated_text_until_eos": tok.decode(until),
                "generated_text_until_eos_skip_special": tok.decode(until, skip_special_tokens=True),
            })
            prompts.append(q)
            print(f"{model_name} {quant} {p['id']}: {q['generated_text_until_eos']!r}", flush=True)
        ref = {k: v for k, v in base.items() if k not in ("prompts", "model_safetensors_sha256")}
        ref.update({
            "model": f"{model_name}-{quant}",
            "model_dir": f"<build.py --out DIR>/{model_name}/gguf/{file}",
            "compute": f"float32 (transformers dequantizing the {quant.upper()} GGUF), "
                       "attn_implementation=eager, CPU, batch 1",
            "generator": {"script": "scripts/make-gguf-real-refs.py", "torch": torch.__version__,
                          "transformers": transformers.__version__},
            "prompts": prompts,
        })
        out = os.path.join(REPO, "tests/data/refs", f"{model_name}-{quant}.json")
        with open(out, "w") as f:
            json.dump(ref, f, separators=(",", ":"))
        print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1])
