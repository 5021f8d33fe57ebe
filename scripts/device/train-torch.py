#!/usr/bin/env python3
"""PyTorch's side of gerbil-train's checks, on the device: the same run, or its speed.

Twin mode (default) trains a HF checkpoint on a text file exactly as `gerbil-train` documents it —
the text tokenized as `tokenizer(text)` does, cut into consecutive non-overlapping windows of
L + 1 tokens, step i taking windows i*B ... i*B + B - 1 (wrapping), linear warmup from lr/W,
torch.optim.AdamW and clip_grad_norm_ — in f32 with eager attention, and writes the same JSON
log (`{"step", "loss", "grad_norm", "lr"}` per line), so the two loss curves lie side by side.

Speed mode (`--speed`) trains a model of the checkpoint's config (random weights are as fast as
real ones) for `--steps` steps of `--batch` random sequences of `--seq-len` tokens with fused
AdamW, eager PyTorch in f32 (`--autocast none`) or under bf16 autocast (`--autocast bf16`), and
prints one JSON line: the median tokens/s of the steps after two warm-up steps.

With `--lora R [--lora-alpha A]`, either mode trains a LoRA adapter as `gerbil-train --lora` does
(scripts/lora_ref.py: the same projections, the same starting factors from `--seed`).

Usage:
  python3 scripts/device/train-torch.py --model DIR --data FILE --steps N --seq-len L --batch B \\
      --lr X [--warmup W] [--weight-decay D] [--betas B1,B2] [--eps E] [--max-grad-norm G] \\
      --json-log FILE
  python3 scripts/device/train-torch.py --speed --config DIR --steps N --seq-len L --batch B \\
      [--autocast none|bf16]
"""

import argparse
import json
import statistics
import time

import os
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lora_ref  # noqa: E402  (scripts/lora_ref.py)


def trained(args, model):
    """The parameters the run trains: every weight, or a new LoRA adapter's factors."""
    if args.lora:
        alpha = args.lora_alpha if args.lora_alpha is not None else float(args.lora)
        return lora_ref.add_lora(model, args.lora, alpha, seed=args.seed)
    return [p for p in model.parameters() if p.requires_grad]


def windows(stream, seq, batch, step):
    count = len(stream) // (seq + 1)
    picks = [(step * batch + b) % count for b in range(batch)]
    return [stream[w * (seq + 1) : (w + 1) * (seq + 1)] for w in picks]


def lr_at(args, step):
    return args.lr * min(1.0, (step + 1) / args.warmup) if args.warmup else args.lr


def twin(args, device):
    tok = AutoTokenizer.from_pretrained(args.model)
    with open(args.data, encoding="utf-8") as f:
        stream = tok(f.read())["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation="eager"
    ).to(device)
    model.train()
    vocab = model.config.vocab_size
    params = trained(args, model)
    betas = tuple(float(b) for b in args.betas.split(","))
    opt = torch.optim.AdamW(
        params, lr=args.lr, betas=betas, eps=args.eps, weight_decay=args.weight_decay
    )
    clip = None if args.max_grad_norm == "none" else float(args.max_grad_norm)
    log = open(args.json_log, "w")
    for i in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(args, i)
        batch = torch.tensor(windows(stream, args.seq_len, args.batch, i), device=device)
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, vocab).float(), batch[:, 1:].reshape(-1)
        )
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip else float("inf"))
        opt.step()
        opt.zero_grad()
        line = {"step": i + 1, "loss": loss.item(), "grad_norm": norm.item(), "lr": lr_at(args, i)}
        log.write(json.dumps(line) + "\n")
        log.flush()
    if args.out:
        model.save_pretrained(args.out)


def speed(args, device):
    config = AutoConfig.from_pretrained(args.config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device)
    model.train()
    vocab = config.vocab_size
    params = trained(args, model)
    opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
    times = []
    for i in range(args.steps):
        batch = torch.randint(0, vocab, (args.batch, args.seq_len + 1), device=device)
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
            logits = model(input_ids=batch[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, vocab).float(), batch[:, 1:].reshape(-1)
            )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    tokens = args.batch * args.seq_len
    rate = tokens / statistics.median(times[2:])
    print(json.dumps({
        "engine": f"pytorch-eager-{'f32' if args.autocast == 'none' else 'bf16-autocast'}"
        + (f"-lora{args.lora}" if args.lora else ""),
        "config": args.config, "seq_len": args.seq_len, "batch": args.batch,
        "tokens_per_s": round(rate, 1), "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--speed", action="store_true")
    p.add_argument("--model")
    p.add_argument("--config")
    p.add_argument("--data")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--betas", default="0.9,0.999")
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--max-grad-norm", default="1.0")
    p.add_argument("--autocast", default="none", choices=["none", "bf16"])
    p.add_argument("--lora", type=int, default=0)
    p.add_argument("--lora-alpha", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-log")
    p.add_argument("--out")
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.speed:
        speed(args, device)
    else:
        twin(args, device)


if __name__ == "__main__":
    main()
