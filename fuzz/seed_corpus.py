#!/usr/bin/env python3
"""Writes the seed inputs of every fuzz target into fuzz/corpus/<target>/seed-*.

Run from the repository root after building gerbilc (it compiles the tiny
Llama for the plan seeds):  python3 fuzz/seed_corpus.py target/release/gerbilc
Then minimize (docs/fuzzing.md): the committed corpus is the minimized one.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests/data/models/tiny")
MODELS = os.path.join(ROOT, "tests/data/models")


def write(target, name, data):
    d = os.path.join(ROOT, "fuzz/corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def mini_llama(dir):
    """A one-layer Llama small enough that its plan's data region is 10 KB."""
    config = json.loads(read(os.path.join(TINY, "llama/config.json")))
    config.update(hidden_size=16, head_dim=8, num_attention_heads=2, num_key_value_heads=1,
                  intermediate_size=24, num_hidden_layers=1, vocab_size=32,
                  max_position_embeddings=32)
    h, kv, i, v = 16, 8, 24, 32
    shapes = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h]}
    layer = {"input_layernorm": [h], "post_attention_layernorm": [h],
             "self_attn.q_proj": [h, h], "self_attn.k_proj": [kv, h], "self_attn.v_proj": [kv, h],
             "self_attn.o_proj": [h, h], "mlp.gate_proj": [i, h], "mlp.up_proj": [i, h],
             "mlp.down_proj": [h, i]}
    for name, shape in layer.items():
        shapes[f"model.layers.0.{name}.weight"] = shape
    tensors = []
    for k, (name, shape) in enumerate(sorted(shapes.items())):
        n = 1
        for d in shape:
            n *= d
        values = [((j * 7919 + k * 104729) % 1000) / 4000.0 - 0.125 for j in range(n)]
        if name.endswith("norm.weight"):
            values = [1.0 + x for x in values]
        tensors.append((name, "F32", shape, struct.pack(f"<{n}f", *values)))
    os.makedirs(dir, exist_ok=True)
    with open(os.path.join(dir, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(dir, "model.safetensors"), "wb") as f:
        f.write(safetensors_file(tensors))


def plan_seeds(gerbilc):
    with tempfile.TemporaryDirectory() as tmp:
        mini_llama(os.path.join(tmp, "mini"))
        for model, target in [(os.path.join(tmp, "mini"), "portable"),
                              (os.path.join(tmp, "mini"), "desktop")]:
            name = os.path.basename(model)
            out = os.path.join(tmp, f"{name}-{target}.plan")
            subprocess.run([gerbilc, "compile", model, "--target", target,
                            "-o", out, "--quiet"], check=True)
            plan = read(out)
            header_len = struct.unpack_from("<Q", plan, 16)[0]
            header = json.loads(plan[48:48 + header_len])
            # The weights are left out (the target fills the data region with
            # zeros) and kernel sources shortened: validation reads neither.
            for k in header["kernels"]:
                k["wgsl"] = k["wgsl"][:16]
            text = json.dumps(header, separators=(",", ":")).encode()
            data_offset = (48 + len(text) + 255) // 256 * 256
            data_len = struct.unpack_from("<Q", plan, 32)[0]
            pre = b"GERBPLAN" + struct.pack("<IIQQQII", 2, 0, len(text), data_offset, data_len,
                                            zlib.crc32(text), 0)
            write("plan", f"{name}-{target}.plan", pre + text)
        # The smallest file of every early failure: empty, magic only, a bare preamble.
        write("plan", "magic", b"GERBPLAN")
        write("plan", "preamble", b"GERBPLAN" + struct.pack("<IIQQQII", 2, 0, 2, 256, 0, 0, 0) + b"{}")


def framed_config(flags, max_context, max_tokens_per_step, config):
    return bytes([flags]) + struct.pack("<QQ", max_context, max_tokens_per_step) + config


def compile_seeds():
    for family in sorted(os.listdir(TINY)):
        config = read(os.path.join(TINY, family, "config.json"))
        for target in ["compile", "codegen"]:
            write(target, f"{family}", framed_config(0, 0, 0, config))
        write("compile", f"{family}-flags", framed_config(7, 96, 3, config))
    for model in ["smollm2-135m", "gemma3-270m"]:
        config = read(os.path.join(MODELS, model, "config.json"))
        write("compile", model, framed_config(2, 4096, 0, config))


def safetensors_file(tensors):
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds():
    f32 = lambda *xs: struct.pack(f"<{len(xs)}f", *xs)
    small = safetensors_file([
        ("model.embed_tokens.weight", "F32", [2, 2], f32(0.5, -1.0, 2.0, 0.25)),
        ("model.norm.weight", "BF16", [2], b"\x80\x3f\x00\x40"),
        ("model.layers.0.mlp.up_proj.weight", "F16", [1, 2], b"\x00\x3c\x00\xc0"),
        ("lm_head.weight", "I64", [1], struct.pack("<q", 7)),
    ])
    write("safetensors", "small", small)
    # A real checkpoint's header, its data cut off (the reader must say truncated).
    real = read(os.path.join(TINY, "llama/model.safetensors"))
    header_len = struct.unpack_from("<Q", real, 0)[0]
    write("safetensors", "tiny-llama-header", real[:8 + header_len])
    write("safetensors", "empty-header", safetensors_file([]))
    index = {"metadata": {"total_size": 28},
             "weight_map": {name: "model-00001-of-00001.safetensors"
                            for name in ["model.embed_tokens.weight", "model.norm.weight"]}}
    write("shard_index", "one-shard", json.dumps(index).encode() + b"\0" + small)
    index["weight_map"]["lm_head.weight"] = "model-00002-of-00002.safetensors"
    write("shard_index", "two-shards", json.dumps(index, indent=2).encode() + b"\0" + small)


GEMMA3 = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"
    "    {%- else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n"
)


def template_seeds():
    conversation = ["system", "Be brief.", "user", "Hi there! ", "assistant", " Hello.", "user", "2+2?"]
    def seed(source, messages):
        return "\0".join([source] + messages).encode()
    smol = read(os.path.join(MODELS, "smollm2-135m/chat_template.jinja")).decode()
    write("template", "smollm2", seed(smol, conversation))
    write("template", "smollm2-one", seed(smol, conversation[2:4]))
    write("template", "gemma3", seed(GEMMA3, conversation))
    write("template", "gemma3-alternation", seed(GEMMA3, conversation[2:6] + ["assistant", "x"]))
    write("template", "pycompat", seed(
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "[{{ m.role | upper }}] {{ m.content.strip().split(' ') | join(',') }}{{ eos_token }}\n"
        "{% endfor %}{{ messages | tojson(indent=2) }}{% if add_generation_prompt %}[A]{% endif %}",
        conversation))
    write("template", "macro-loop", seed(
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ n }}{% endif %}{% endmacro %}"
        "{% for i in range(10) %}{{ f(i) }}{% if i > 5 %}{% break %}{% endif %}{% endfor %}"
        "{{ 'ab' * 3 }}{{ messages[0]['content'][1:3] }}", conversation))


def request_seeds():
    bodies = {
        "chat": {"model": "gerbil", "messages": [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "Hi"}]},
        "chat-stream": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                        "stream": True, "stream_options": {"include_usage": True},
                        "max_completion_tokens": 16, "temperature": 0.7, "top_p": 0.9,
                        "top_k": 40, "min_p": 0.05, "seed": 42, "stop": ["\n", "END"],
                        "presence_penalty": 0.5, "frequency_penalty": -0.5,
                        "repetition_penalty": 1.1, "n": 1, "logprobs": False, "user": "me"},
        "completion": {"model": "gerbil", "prompt": "Once upon a time", "max_tokens": 32,
                       "stop": "\n", "ignore_eos": True},
        "completion-ids": {"prompt": [1, 2, 3], "temperature": 0, "seed": -1},
        "bad-n": {"prompt": "x", "n": 2, "logprobs": 5},
    }
    for name, body in bodies.items():
        write("request", name, json.dumps(body))


def gguf_file(arch, tokenizer, tensors):
    """A GGUF file: one-layer `arch` hyper-parameters, a 6-token vocabulary of `tokenizer` kind
    (gpt2 or llama), and `tensors` as (name, numpy array or raw blocks, ggml type)."""
    import gguf
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.gguf")
        w = gguf.GGUFWriter(path, arch)
        w.add_context_length(32)
        w.add_embedding_length(32)
        w.add_block_count(1)
        w.add_feed_forward_length(32)
        w.add_head_count(2)
        w.add_head_count_kv(1)
        w.add_layer_norm_rms_eps(1e-6)
        if arch == "gemma3":
            w.add_sliding_window(4)
        w.add_tokenizer_model(tokenizer)
        w.add_token_list(["<s>", "</s>", "a", "b", "ab", "\u2581ab"])
        w.add_token_types([3, 3, 1, 1, 1, 4])
        w.add_token_scores([0.0, 0.0, -1.0, -2.0, -3.0, -4.0])
        if tokenizer == "gpt2":
            w.add_token_merges(["a b"])
        w.add_bos_token_id(0)
        w.add_eos_token_id(1)
        w.add_chat_template("{{ messages[0]['content'] }}")
        for name, data, ty in tensors:
            w.add_tensor(name, data, raw_dtype=ty)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return read(path)


def gguf_seeds():
    import numpy as np
    import gguf
    T = gguf.GGMLQuantizationType
    rng = np.random.default_rng(7)

    def blocks(ty, rows, cols):
        n, size = gguf.GGML_QUANT_SIZES[ty]
        b = rng.integers(0, 256, size=(rows, cols // n * size), dtype=np.uint8)
        return b

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    layer = [("blk.0.attn_norm.weight", f32(32), T.F32),
             ("blk.0.attn_q.weight", blocks(T.Q8_0, 32, 32), T.Q8_0),
             ("blk.0.attn_k.weight", blocks(T.Q4_0, 16, 32), T.Q4_0),
             ("blk.0.attn_v.weight", f32(16, 32).astype(np.float16), T.F16),
             ("blk.0.attn_output.weight", blocks(T.Q5_1, 32, 32), T.Q5_1),
             ("blk.0.ffn_norm.weight", f32(32), T.F32),
             ("blk.0.ffn_gate.weight", blocks(T.Q4_1, 32, 32), T.Q4_1),
             ("blk.0.ffn_up.weight", blocks(T.Q5_0, 32, 32), T.Q5_0),
             ("blk.0.ffn_down.weight", f32(32, 32), T.F32)]
    head = [("token_embd.weight", blocks(T.Q8_0, 6, 32), T.Q8_0),
            ("output_norm.weight", f32(32), T.F32)]
    write("gguf", "llama-gpt2", gguf_file("llama", "gpt2", head + layer))
    write("gguf", "llama-spm", gguf_file("llama", "llama", head + layer))
    k_quants = [("token_embd.weight", blocks(T.Q6_K, 6, 256), T.Q6_K),
                ("output.weight", blocks(T.Q4_K, 6, 256), T.Q4_K),
                ("blk.0.attn_q.weight", blocks(T.Q5_K, 2, 256), T.Q5_K)]
    write("gguf", "gemma3-kquants", gguf_file("gemma3", "llama", k_quants))
    write("gguf", "blocks", read(os.path.join(ROOT, "crates/gguf/tests/data/blocks.gguf")))


if __name__ == "__main__":
    plan_seeds(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/gerbilc"))
    compile_seeds()
    safetensors_seeds()
    gguf_seeds()
    template_seeds()
    request_seeds()
