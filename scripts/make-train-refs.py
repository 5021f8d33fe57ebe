#!/usr/bin/env python3
"""Records PyTorch's training of every tiny decoder: tests/data/refs/train/<name>.json.

Each model (f32 master weights, eager attention) trains for STEPS steps on the same token stream
with torch.optim.AdamW, torch.nn.utils.clip_grad_norm_ and a linear warmup, and the file keeps the
settings, the stream, and per step the mean loss, the gradient norm before clipping and the
learning rate. gerbil's trainers are checked against these trajectories (tests/e2e/training.rs).

Batches are what `gerbil-train` documents: the stream is cut into consecutive, non-overlapping
windows of SEQ + 1 tokens (a tail too short for one is dropped), and step i takes windows
i*BATCH ... i*BATCH + BATCH - 1, wrapping at the end; each window's first SEQ tokens are the input
and its last SEQ the targets. The loss is the mean cross-entropy over the batch's tokens.

With --lora, each model instead trains a LoRA adapter (lora-<name>.json, LORA_STEPS steps): every
projection of LORA_TARGETS the model has as an nn.Linear of its own gets A (rank x in) and
B (out x rank) with the output x W^T + (alpha / rank) (x A^T) B^T, the model's weights frozen;
B starts at zero and A at gerbil's documented values (scripts/lora_ref.py).

Usage: python3 scripts/make-train-refs.py [--out tests/data/refs/train] [--lora] [MODEL ...]
(needs torch and transformers; CPU is enough.)
"""

import argparse
import json
import os
import random
import sys

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lora_ref  # noqa: E402  (scripts/lora_ref.py: gerbil-train --lora in PyTorch)

MODELS = ["llama", "llama_bf16", "qwen2", "qwen3", "mistral", "gemma3", "phi3"]
SEQ, BATCH, STEPS = 16, 2, 50
SETTINGS = {
    "seq_len": SEQ,
    "batch": BATCH,
    "steps": STEPS,
    "lr": 1e-3,
    "warmup": 5,
    "betas": [0.9, 0.95],
    "eps": 1e-8,
    "weight_decay": 0.1,
    "max_grad_norm": 1.0,
}
LORA = {"rank": 4, "alpha": 8.0, "seed": 7}
LORA_TARGETS = lora_ref.DEFAULT_TARGETS
LORA_STEPS = 20
# 24 windows and a 5-token tail: the steps wrap around the stream every 12 steps.
STREAM_TOKENS = 24 * (SEQ + 1) + 5


def windows(stream, seq, batch, step):
    """The batch of step `step`, as documented above."""
    count = len(stream) // (seq + 1)
    picks = [(step * batch + b) % count for b in range(batch)]
    return [stream[w * (seq + 1) : (w + 1) * (seq + 1)] for w in picks]


def lr_at(step):
    """Linear warmup over `warmup` steps (step 0 at lr / warmup), then constant."""
    s = SETTINGS
    return s["lr"] * min(1.0, (step + 1) / s["warmup"]) if s["warmup"] else s["lr"]


def record(model_dir, name, lora):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    )
    model.train()
    vocab = model.config.vocab_size
    rng = random.Random(name)
    stream = [rng.randrange(vocab) for _ in range(STREAM_TOKENS)]
    s = SETTINGS
    steps_to_take = LORA_STEPS if lora else STEPS
    if lora:
        params = lora_ref.add_lora(model, LORA["rank"], LORA["alpha"], LORA_TARGETS, LORA["seed"])
    else:
        params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        params, lr=s["lr"], betas=tuple(s["betas"]), eps=s["eps"], weight_decay=s["weight_decay"]
    )
    steps = []
    for i in range(steps_to_take):
        for group in opt.param_groups:
            group["lr"] = lr_at(i)
        batch = torch.tensor(windows(stream, SEQ, BATCH, i))
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, s["max_grad_norm"])
        opt.step()
        opt.zero_grad()
        steps.append({"loss": loss.item(), "grad_norm": norm.item(), "lr": lr_at(i)})
    return {
        "schema": "train-ref-v1",
        "model": name,
        "torch": torch.__version__,
        **SETTINGS,
        "steps": steps_to_take,
        **({"lora": {**LORA, "targets": LORA_TARGETS}} if lora else {}),
        "stream": stream,
        "trajectory": steps,
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(repo, "tests/data/refs/train"))
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters")
    parser.add_argument("models", nargs="*", default=MODELS)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    for name in args.models:
        ref = record(os.path.join(repo, "tests/data/models/tiny", name), name, args.lora)
        path = os.path.join(args.out, f"{'lora-' if args.lora else ''}{name}.json")
        with open(path, "w") as f:
            json.dump(ref, f, indent=1)
            f.write("\n")
        first, last = ref["trajectory"][0], ref["trajectory"][-1]
        print(f"{name:<11} loss {first['loss']:.4f} -> {last['loss']:.4f}  {path}")


if __name__ == "__main__":
    main()
