"""Used by scripts/device/decoder-embed.sh on the GPU box:

    python3 scripts/device/decoder-embed-models.py TOKENIZER_DIR OUT_DIR

Makes two random-weight decoder-based embedders of real shapes in OUT_DIR, each a
sentence-transformers directory with TOKENIZER_DIR's tokenizer (SmolLM2's: the vocabulary is
49152 rows, not the real models' 151669 or 262144; every other size is the real one):

  qwen3-embedding-0.6b  Qwen3-Embedding-0.6B: hidden 1024, 28 layers, 16 heads, 8 KV heads,
                        head_dim 128, intermediate 3072; config says Qwen3ForCausalLM, weights
                        saved from Qwen3Model (no `model.` prefix); last-token pooling, Normalize.
  embeddinggemma-300m   EmbeddingGemma-300m: hidden 768, 24 layers (5 sliding : 1 full,
                        sliding_window 512, bidirectional), 3 heads, 1 KV head, head_dim 256,
                        intermediate 1152; mean pooling, Dense 768->3072->768, Normalize.

Weights are float32 (fan-in scaled matrices, norms and biases non-trivial). For each model it
writes OUT_DIR/NAME/refs.json: sentence-transformers' float32 vectors (CUDA) of a few texts,
each encoded alone, and prints `TORCH {json}` timings: sentence-transformers `encode` in f16 of
one 128-token input and of 64 at once (tokenization included), medians of 7 after two warm-ups.
"""
import json, os, shutil, statistics, sys, time
import torch
from sentence_transformers import SentenceTransformer

tok_dir, out = sys.argv[1], sys.argv[2]
TEXTS = [
    "A cat sat on the mat.",
    "The history of the river valley is written in its stones, long before the first farmers.",
    "Numbers: 3.14159 2.71828 1.41421 42 1000000",
    "x",
]


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            r = torch.randn(p.shape, generator=g)
            p.copy_(0.1 * r if p.dim() == 1 else r / p.shape[-1] ** 0.5)


def sentence_files(d, hidden, pooling, dense, max_seq_length):
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    os.makedirs(f"{d}/1_Pooling", exist_ok=True)
    json.dump({"word_embedding_dimension": hidden, "pooling_mode": pooling}, open(f"{d}/1_Pooling/config.json", "w"))
    g = torch.Generator().manual_seed(7)
    from safetensors.torch import save_file
    for i, (fin, fout) in enumerate(dense):
        path = f"{i + 2}_Dense"
        modules.append({"idx": i + 2, "name": str(i + 2), "path": path, "type": "sentence_transformers.models.Dense"})
        os.makedirs(f"{d}/{path}", exist_ok=True)
        json.dump({"in_features": fin, "out_features": fout, "bias": False,
                   "activation_function": "torch.nn.modules.linear.Identity"}, open(f"{d}/{path}/config.json", "w"))
        save_file({"linear.weight": torch.randn(fout, fin, generator=g) / fin ** 0.5}, f"{d}/{path}/model.safetensors")
    n = len(modules)
    modules.append({"idx": n, "name": str(n), "path": f"{n}_Normalize", "type": "sentence_transformers.models.Normalize"})
    json.dump(modules, open(f"{d}/modules.json", "w"))
    json.dump({"max_seq_length": max_seq_length, "do_lower_case": False}, open(f"{d}/sentence_bert_config.json", "w"))
    for f in os.listdir(tok_dir):
        if f.startswith("tokenizer") or f == "special_tokens_map.json":
            shutil.copy(os.path.join(tok_dir, f), d)


def qwen3(d):
    from transformers import Qwen3Config, Qwen3Model
    cfg = Qwen3Config(vocab_size=49152, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
                      rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
    m = Qwen3Model(cfg)
    randomize(m, 1)
    m.save_pretrained(d, safe_serialization=True)
    c = json.load(open(f"{d}/config.json"))
    c["architectures"] = ["Qwen3ForCausalLM"]
    json.dump(c, open(f"{d}/config.json", "w"))
    sentence_files(d, 1024, "lasttoken", [], 1024)


def gemma(d):
    from transformers import Gemma3TextConfig, Gemma3TextModel
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(24)]
    cfg = Gemma3TextConfig(vocab_size=49152, hidden_size=768, intermediate_size=1152, num_hidden_layers=24,
                           num_attention_heads=3, num_key_value_heads=1, head_dim=256, max_position_embeddings=2048,
                           query_pre_attn_scalar=256, sliding_window=512, layer_types=types,
                           use_bidirectional_attention=True, final_logit_softcapping=None,
                           attn_logit_softcapping=None)
    m = Gemma3TextModel(cfg)
    randomize(m, 2)
    m.save_pretrained(d, safe_serialization=True)
    sentence_files(d, 768, "mean", [(768, 3072), (3072, 768)], 2048)


def median_ms(f):
    for _ in range(2):
        f()
    times = []
    for _ in range(7):
        torch.cuda.synchronize()
        t = time.perf_counter()
        f()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


for name, make in [("qwen3-embedding-0.6b", qwen3), ("embeddinggemma-300m", gemma)]:
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    make(d)
    st = SentenceTransformer(d, device="cuda", model_kwargs={"torch_dtype": torch.float32,
                                                               "attn_implementation": "eager"})
    refs = {t: st.encode([t], convert_to_numpy=True)[0].tolist() for t in TEXTS}
    json.dump(refs, open(f"{d}/refs.json", "w"))
    st16 = SentenceTransformer(d, device="cuda", model_kwargs={"torch_dtype": torch.float16})
    # A 128-token input: SmolLM2's tokenizer makes one token of " a".
    text = "a" + " a" * 127
    assert len(st16.tokenizer(text)["input_ids"]) == 128, len(st16.tokenizer(text)["input_ids"])
    one = median_ms(lambda: st16.encode([text], batch_size=64))
    many = median_ms(lambda: st16.encode([text] * 64, batch_size=64))
    print("TORCH " + json.dumps({"model": name, "st_f16_1_ms": one, "st_f16_64_ms": many,
                                 "st_f16_64_inputs_per_s": 64 / (many / 1e3)}), flush=True)
