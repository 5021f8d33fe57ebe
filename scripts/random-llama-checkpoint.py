#!/usr/bin/env python3
"""Write a Llama checkpoint of a real model's shape with random bf16 weights, to measure what
`gerbilc compile` costs on a large model without downloading one:

    python3 scripts/random-llama-checkpoint.py --shape 8b --out /tmp/big8b    # needs numpy
    /usr/bin/time -v gerbilc compile /tmp/big8b --quantize q4_k_m -o /tmp/big8b.plan

Shapes: `8b` (Llama-3.1-8B: hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336,
vocab 128256, untied LM head; 16 GB) and `1b` (Llama-3.2-1B's sizes with an untied head:
hidden 2048, 16 layers, intermediate 8192; 3 GB). The safetensors files (shards of at most
`--shard-gb`, with `model.safetensors.index.json`) are written by hand: 8 bytes of header length,
the JSON header, the data. There is no tokenizer (gerbilc compiles without one).

The values are random but finite (gerbilc refuses NaN and infinities): random bf16 bit patterns
whose exponent stays below 2^1. They repeat a 64 MiB pool at shifting offsets, so writing is as
fast as the disk; the numbers mean nothing, only the sizes do.
"""
import argparse
import json
import os

import numpy as np

SHAPES = {
    "8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256),
    "1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256),
}
POOL_BYTES = 64 << 20


def tensors(s):
    """(name, shape) of every tensor, in the order transformers saves them."""
    h, head_dim = s["hidden"], s["hidden"] // s["heads"]
    kv = s["kv_heads"] * head_dim
    yield "model.embed_tokens.weight", (s["vocab"], h)
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (h, h)
        yield p + "self_attn.k_proj.weight", (kv, h)
        yield p + "self_attn.v_proj.weight", (kv, h)
        yield p + "self_attn.o_proj.weight", (h, h)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (s["intermediate"], h)
        yield p + "mlp.up_proj.weight", (s["intermediate"], h)
        yield p + "mlp.down_proj.weight", (h, s["intermediate"])
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (s["vocab"], h)


def config(s):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "hidden_size": s["hidden"],
        "intermediate_size": s["intermediate"],
        "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "head_dim": s["hidden"] // s["heads"],
        "vocab_size": s["vocab"],
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    }


def pool():
    """Random finite bf16 values: exponent bits below 0x80 (|x| < 2)."""
    bits = np.random.default_rng(0).integers(0, 1 << 16, POOL_BYTES // 2, dtype=np.uint16)
    return (bits & ~np.uint16(0x4000)).tobytes()


def shards(named, limit):
    """The tensors split into files of at most `limit` bytes (a larger tensor alone)."""
    out, size = [[]], 0
    for name, shape in named:
        n = 2 * int(np.prod(shape))
        if out[-1] and size + n > limit:
            out.append([])
            size = 0
        out[-1].append((name, shape, n))
        size += n
    return out


def write_shard(path, entries, data, start):
    """Writes one safetensors file; returns where in the pool the next tensor starts."""
    header, offset = {}, 0
    for name, shape, n in entries:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for _, _, n in entries:
            while n > 0:
                piece = data[start : start + min(n, len(data) - start)]
                f.write(piece)
                n -= len(piece)
                start = (start + len(piece)) % len(data)
            start = (start + 4096) % len(data)
    return start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=SHAPES, default="8b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shard-gb", type=float, default=5.0)
    args = ap.parse_args()
    s = SHAPES[args.shape]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config(s), f, indent=2)
    files = shards(list(tensors(s)), int(args.shard_gb * 1e9))
    data, start, weight_map, total = pool(), 0, {}, 0
    for i, entries in enumerate(files):
        name = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        start = write_shard(os.path.join(args.out, name), entries, data, start)
        for tensor, _, n in entries:
            weight_map[tensor] = name
            total += n
        print(f"wrote {name} ({sum(e[2] for e in entries) / 1e9:.2f} GB)")
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    print(f"{args.out}: {len(weight_map)} tensors, {total / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
