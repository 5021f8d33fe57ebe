#!/usr/bin/env python3
"""HF transformers on the same weights, for scripts/device/bench.sh's comparison column.

    python3 scripts/device/hf-bench.py MODEL_DIR [--repeats 5] [--compile]

Loads MODEL_DIR in float16 on CUDA and prints one JSON object in the llama-bench convention:
pp512 (prompt tok/s of one 512-token forward), tg128 at depth 0 (greedy decode steps after a
1-token prompt, static KV cache) and at depth 4096 (after a 4096-token prompt): the time of a
128-token generate less that of a 1-token one, over 127 steps; medians of --repeats runs after a
warm-up. --compile wraps the forward in torch.compile (mode "reduce-overhead", the
setting HF documents for static-cache decoding); it takes minutes the first time.
"""
import argparse, json, statistics, time
import torch
from transformers import AutoModelForCausalLM


def timed(fn, repeats):
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float16).cuda().eval()
    if a.compile:
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    vocab = model.config.vocab_size
    ids = lambda n: (torch.arange(n, device="cuda") * 7919 + 13).remainder(vocab)[None, :]
    res = {"compile": a.compile}
    with torch.inference_mode():
        s = timed(lambda: model(ids(512)), a.repeats)
        res["pp512"] = 512 / s
        for depth in (0, 4096):
            prompt = ids(max(depth, 1))

            def gen(n):
                return lambda: model.generate(prompt, max_new_tokens=n, min_new_tokens=n,
                                              do_sample=False, cache_implementation="static",
                                              pad_token_id=0)

            # 127 decode steps: 128 generated tokens less the one the prefill yields.
            s = timed(gen(128), a.repeats) - timed(gen(1), a.repeats)
            res[f"tg128_d{depth}"] = 127 / s
    print(json.dumps(res))


if __name__ == "__main__":
    main()
