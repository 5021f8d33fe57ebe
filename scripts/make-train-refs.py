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
B starts at zero and A at gerbil's documented values (`gerbil_frontend_hf::adapter::init_values`:
SplitMix64 from the seed, drawn over the A factors in name order, uniform in +-1/sqrt(in)).

Usage: python3 scripts/make-train-refs.py [--out tests/data/refs/train] [--lora] [MODEL ...]
(needs torch and transformers; CPU is enough.)
"""

import argparse
import json
import os
import random

import torch
from transformers import AutoModelForCausalLM

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
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
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


MASK = (1 << 64) - 1


def init_values(state, count, bound):
    """gerbil's `adapter::init_values`: (new state, `count` values uniform in +-bound)."""
    out = []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        u = (z >> 11) / float(1 << 53)
        out.append((2.0 * u - 1.0) * bound)
    return state, out


class LoraLinear(torch.nn.Module):
    def __init__(self, base, a, b, scale):
        super().__init__()
        self.base, self.scale = base, scale
        self.lora_A = torch.nn.Parameter(a)
        self.lora_B = torch.nn.Parameter(b)

    def forward(self, x):
        f = torch.nn.functional
        return self.base(x) + self.scale * f.linear(f.linear(x, self.lora_A), self.lora_B)


def add_lora(model):
    """Freezes `model` and wraps its targeted projections; returns the factors, A's and B's."""
    for p in model.parameters():
        p.requires_grad_(False)
    found = {}
    for mname, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in mname:
            if mname.rsplit(".", 1)[-1] in LORA_TARGETS:
                found[f"base_model.model.{mname}.lora_A.weight"] = (mname, mod)
    state, wrapped = LORA["seed"], []
    for a_name in sorted(found):
        mname, mod = found[a_name]
        r, (out, inp) = LORA["rank"], mod.weight.shape
        state, values = init_values(state, r * inp, 1.0 / inp ** 0.5)
        a = torch.tensor(values, dtype=torch.float32).reshape(r, inp)
        b = torch.zeros(out, r, dtype=torch.float32)
        lora = LoraLinear(mod, a, b, LORA["alpha"] / r)
        parent = model.get_submodule(mname.rsplit(".", 1)[0])
        setattr(parent, mname.rsplit(".", 1)[-1], lora)
        wrapped.append(lora)
    return [m.lora_A for m in wrapped] + [m.lora_B for m in wrapped]


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
    params = add_lora(model) if lora else [p for p in model.parameters() if p.requires_grad]
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
