#!/usr/bin/env python3
"""Write the tiny test models as GGUF files, the way llama.cpp's converter would:

    python3 scripts/make-tiny-gguf.py --out fixtures/tiny-gguf     # needs numpy and gguf==0.19.0

For each family in FAMILIES, tests/data/models/tiny/<family> (config.json + float32
model.safetensors) becomes OUT/<family>.gguf: hyper-parameters under gguf-py's key names, tensors
under the names gguf-py's own HF-to-GGUF map gives (so the names do not come from gerbil's table),
float32 data, Llama's query and key rows permuted as convert_hf_to_gguf.py permutes them. Loading
one must give back exactly the original weights, so gerbil's plan of the GGUF is checked against
the transformers references of the original model.

Then OUT/<family>-<TYPE>.gguf for each block type in QUANT_TYPES: the same, with every matrix
whose rows are whole blocks quantized by gguf-py (bit-exact with llama.cpp's reference
quantizers); norms, biases and the 176-wide down projections stay float32, as llama.cpp falls
back for rows that are not whole blocks. Their references are transformers loading the file
itself (tests/data/refs/tiny-gguf/, made on a GPU machine by scripts/device/gguf_refs.py).
Deterministic; takes a few seconds.
"""
import argparse
import json
import os
import struct

import numpy as np
import gguf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "tests", "data", "models", "tiny")
QUANT_TYPES = [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0,
               gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q5_0,
               gguf.GGMLQuantizationType.Q5_1]
FAMILIES = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2,
            "qwen3": gguf.MODEL_ARCH.QWEN3, "phi3": gguf.MODEL_ARCH.PHI3}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (path, name, info["dtype"])
        s, e = info["data_offsets"]
        out[name] = np.frombuffer(data[s:e], dtype=np.float32).reshape(info["shape"])
    return out


def permute(w, n_head):
    """llama.cpp's LlamaModel.permute: each head's rotary halves interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert(family, out_dir, qtype=None):
    arch = FAMILIES[family]
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    src = os.path.join(TINY, family)
    with open(os.path.join(src, "config.json")) as f:
        c = json.load(f)
    tensors = read_safetensors(os.path.join(src, "model.safetensors"))
    suffix = f"-{qtype.name}" if qtype is not None else ""
    path = os.path.join(out_dir, f"{family}{suffix}.gguf")
    w = gguf.GGUFWriter(path, arch_name)
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    w.add_vocab_size(c["vocab_size"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(c["rope_parameters"]["rope_theta"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if family == "llama":
        w.add_rope_dimension_count(head_dim)
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    w.add_pad_token_id(c["pad_token_id"])
    names = gguf.get_tensor_name_map(arch, c["num_hidden_layers"])
    for hf, t in sorted(tensors.items()):
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf
        if family == "llama" and hf.endswith("q_proj.weight"):
            t = permute(t, heads)
        elif family == "llama" and hf.endswith("k_proj.weight"):
            t = permute(t, kv_heads)
        t = np.ascontiguousarray(t)
        block = gguf.GGML_QUANT_SIZES[qtype][0] if qtype is not None else 0
        if qtype is not None and t.ndim == 2 and t.shape[1] % block == 0:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for family in FAMILIES:
        print("[make-tiny-gguf]", convert(family, a.out))
        for qtype in QUANT_TYPES:
            convert(family, a.out, qtype)


if __name__ == "__main__":
    main()
