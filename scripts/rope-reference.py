#!/usr/bin/env python3
"""RoPE frequencies, attention scalings and cos/sin rows from transformers itself.

Writes JSON on stdout: for each RoPE case (default, linear, llama3, YaRN with
its derived attention factor and with explicit `attention_factor` /
`mscale`+`mscale_all_dim`, LongRoPE short and long factors, partial rotary),
the `inv_freq` that transformers' RoPE initializer returns (as f32 bit
patterns), its attention scaling, and the `cos`/`sin` rows that the model's
rotary-embedding class returns at a few positions (first `rotary_dim/2`
columns; the second half repeats them).

    python3 scripts/rope-reference.py > crates/compiler/tests/data/rope_reference.json

Needs torch and transformers (4.x or 5.x). The `parameters` of each case use
transformers' own key names, which are also gerbil's `RopeParameters` keys;
`context` is the KV-cache capacity gerbil compiles for (LongRoPE picks its
factors by it, as transformers does by the sequence length).

The surprise: LongRoPE's rotary class switches to the long factors only when a
forward call sees a position past `original_max_position_embeddings`, so the
long case asks for such positions (and the short case stays below them).
"""
import importlib
import json
import sys

import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

V5 = int(transformers.__version__.split(".")[0]) >= 5

SHORT = [1.0 + 0.0731 * i for i in range(16)]
LONG = [1.0 + 0.37 * i ** 1.5 for i in range(16)]
POSITIONS = [0, 1, 2, 7, 63, 100, 1000, 4095]

# (name, head_dim, max_position_embeddings, context, parameters, positions)
CASES = [
    ("default", 64, 4096, 4096, {"rope_type": "default", "rope_theta": 10000.0}, POSITIONS),
    ("linear", 64, 4096, 4096,
     {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, POSITIONS),
    ("llama3", 128, 131072, 4096,
     {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, POSITIONS),
    # Qwen2.5-style YaRN, attention factor 0.1 ln 4 + 1.
    ("yarn", 128, 131072, 4096,
     {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
      "original_max_position_embeddings": 32768}, POSITIONS),
    # Untruncated ramp, explicit betas, attention factor from mscale / mscale_all_dim.
    ("yarn_mscale", 32, 512, 512,
     {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
      "original_max_position_embeddings": 64, "beta_fast": 8.0, "beta_slow": 2.0,
      "truncate": False, "mscale": 0.707, "mscale_all_dim": 1.0}, [0, 1, 5, 63, 64, 300, 511]),
    # An explicit attention factor wins over the derived one.
    ("yarn_attention_factor", 32, 512, 512,
     {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
      "original_max_position_embeddings": 64, "beta_fast": 8.0, "beta_slow": 2.0,
      "attention_factor": 1.5}, [0, 1, 5, 63, 64, 300, 511]),
    # Phi-3-style LongRoPE, factor 131072 / 4096 = 32: short factors up to 4096 tokens.
    ("longrope_short", 32, 131072, 4096,
     {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 4096,
      "short_factor": SHORT, "long_factor": LONG}, [0, 1, 2, 7, 100, 1000, 4095]),
    # ... and long factors past them.
    ("longrope_long", 32, 131072, 8192,
     {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 4096,
      "short_factor": SHORT, "long_factor": LONG}, [0, 1, 2, 7, 100, 4096, 5000, 8191]),
    # Partial rotary: half of each 64-wide head rotates.
    ("partial_default", 64, 4096, 4096,
     {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}, POSITIONS),
    ("partial_yarn", 64, 8192, 8192,
     {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
      "original_max_position_embeddings": 2048, "partial_rotary_factor": 0.5}, POSITIONS),
]


# Rotary classes tried in order; the first whose frequencies have the case's
# rotary width is used (Llama's ignores `partial_rotary_factor`).
CLASSES = [
    ("llama", "LlamaConfig", "LlamaRotaryEmbedding"),
    ("phi3", "Phi3Config", "Phi3RotaryEmbedding"),
    ("stablelm", "StableLmConfig", "StableLmRotaryEmbedding"),
    ("gpt_neox", "GPTNeoXConfig", "GPTNeoXRotaryEmbedding"),
]


def make_config(config_cls, head_dim, max_pos, params):
    heads = 2
    kwargs = dict(vocab_size=32, hidden_size=heads * head_dim, intermediate_size=8,
                  num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=heads,
                  head_dim=head_dim, max_position_embeddings=max_pos)
    extra = {k: v for k, v in params.items() if k not in ("rope_type", "rope_theta")}
    if "partial_rotary_factor" in params:
        kwargs["partial_rotary_factor"] = params["partial_rotary_factor"]
    if V5:
        kwargs["rope_parameters"] = dict(params)
    else:
        kwargs["rope_theta"] = params["rope_theta"]
        kwargs["rope_scaling"] = {"rope_type": params["rope_type"], **extra}
        if "original_max_position_embeddings" in params:
            kwargs["original_max_position_embeddings"] = params["original_max_position_embeddings"]
    return config_cls(**kwargs)


def initializer(rotary_cls, rope_type):
    if rope_type in ROPE_INIT_FUNCTIONS:
        return ROPE_INIT_FUNCTIONS[rope_type], f"ROPE_INIT_FUNCTIONS[{rope_type!r}]"
    # transformers >= 5.5 keeps the default initializer on each rotary class.
    return (rotary_cls.compute_default_rope_parameters,
            f"{rotary_cls.__name__}.compute_default_rope_parameters")


def bits(t):
    return [int(b) for b in t.detach().to(torch.float32).contiguous().view(torch.int32)
            .numpy().astype("uint32")]


def floats(t):
    return [float(x) for x in t.detach().to(torch.float32).tolist()]


def run_case(module, config_name, class_name, name, head_dim, max_pos, context, params,
             positions):
    mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    config = make_config(getattr(transformers, config_name), head_dim, max_pos, params)
    rotary_cls = getattr(mod, class_name)
    rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    half = rotary_dim // 2
    fn, fn_name = initializer(rotary_cls, params["rope_type"])
    # LongRoPE's initializer picks its factors by `seq_len`, like the forward pass.
    if params["rope_type"] == "longrope":
        inv_freq, scaling = fn(config, "cpu", seq_len=context)
    else:
        inv_freq, scaling = fn(config, "cpu")
    if inv_freq.numel() != half:
        raise ValueError(f"{fn_name} gave {inv_freq.numel()} frequencies, expected {half}")
    rotary = rotary_cls(config=config)
    pos = torch.tensor([positions], dtype=torch.long)
    x = torch.zeros(1, len(positions), head_dim, dtype=torch.float32)
    with torch.no_grad():
        cos, sin = rotary(x, pos)
    cos, sin = cos[0], sin[0]
    if cos.shape[-1] != rotary_dim:
        raise ValueError(f"{class_name} gave cos of width {cos.shape[-1]}, expected {rotary_dim}")
    if not torch.equal(rotary.inv_freq.float(), inv_freq.float()):
        raise ValueError(f"{class_name} ran with other frequencies than {fn_name}")
    return {
        "name": name,
        "head_dim": head_dim,
        "rotary_dim": rotary_dim,
        "max_position_embeddings": max_pos,
        "context": context,
        "parameters": params,
        "initializer": fn_name,
        "rotary_class": class_name,
        "inv_freq_bits": bits(inv_freq),
        "inv_freq": floats(inv_freq),
        "attention_scaling": float(scaling),
        "class_attention_scaling": float(rotary.attention_scaling),
        "positions": positions,
        "cos": [floats(row[:half]) for row in cos],
        "sin": [floats(row[:half]) for row in sin],
    }


def case_json(case, errors):
    tried = []
    for module, config_name, class_name in CLASSES:
        try:
            return run_case(module, config_name, class_name, *case)
        except Exception as e:  # noqa: BLE001 - try the next class, report all at the end
            tried.append(f"{class_name}: {type(e).__name__}: {e}")
    errors.append({"name": case[0], "tried": tried})
    return None


def main():
    torch.set_num_threads(1)
    out = {
        "schema": "rope-reference-v1",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "generated_by": "scripts/rope-reference.py",
        "cases": [],
        "errors": [],
    }
    for case in CASES:
        c = case_json(case, out["errors"])
        if c is not None:
            out["cases"].append(c)
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
