"""Used by scripts/device/embed-bench.sh on the GPU box:

    python3 scripts/device/embed-torch.py SRC_DIR OUT_DIR

Copies SRC_DIR (all-MiniLM-L6-v2's config, tokenizer and sentence-transformers files, without
weights) to OUT_DIR, saves a random-weight BertModel of that config there (fan-in scaled matrices,
non-trivial norms and biases), and times it in PyTorch on CUDA: `BertModel` + mean pooling +
normalize on ready token tensors (f16 and f32), and sentence-transformers' `encode` (f16,
tokenization included) when it is installed; one 128-token input, then 64 of them at once, medians
of 7 after two warm-ups. Writes OUT_DIR/refs.json (f32 vectors of two texts, for checking gerbil's)
and prints one line `TORCH {json}`."""
import json, os, shutil, statistics, sys, time
import torch
from transformers import BertConfig, BertModel

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
for f in os.listdir(src):
    p = os.path.join(src, f)
    if os.path.isdir(p):
        shutil.copytree(p, os.path.join(out, f), dirs_exist_ok=True)
    else:
        shutil.copy(p, out)
cfg = BertConfig.from_pretrained(src)
torch.manual_seed(0)
model = BertModel(cfg, add_pooling_layer=False).eval()
with torch.no_grad():
    for n, p in model.named_parameters():
        if "LayerNorm.weight" in n:
            p.copy_(1 + 0.1 * torch.randn_like(p))
        elif p.dim() == 1:
            p.copy_(0.1 * torch.randn_like(p))
        else:
            p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
model.save_pretrained(out, safe_serialization=True)


def embed(m, ids):
    h = m(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids)).last_hidden_state
    v = h.float().mean(dim=1)
    return torch.nn.functional.normalize(v, dim=-1)


def timed(fn, reps=7):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


res = {}
vocab = cfg.vocab_size
ids64 = torch.tensor([[(b * 7919 + t * 104729) % vocab for t in range(128)] for b in range(64)]).cuda()
for dtype in (torch.float16, torch.float32):
    m = BertModel.from_pretrained(out, add_pooling_layer=False, torch_dtype=dtype).cuda().eval()
    with torch.inference_mode():
        one = timed(lambda: embed(m, ids64[:1]))
        many = timed(lambda: embed(m, ids64))
    res[str(dtype)] = {"latency_ms": one, "batch64_ms": many, "sentences_per_s": 64 / (many / 1e3)}
    if dtype == torch.float32:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(out)
        texts = ["hello world", "A cat sat on the mat. " * 20]
        with torch.inference_mode():
            refs = {t: embed(m, tok(t, return_tensors="pt", truncation=True, max_length=256)["input_ids"].cuda()).cpu()[0].tolist() for t in texts}
        json.dump(refs, open(os.path.join(out, "refs.json"), "w"))
try:
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(out, device="cuda").half()
    texts = ["word " * 126] * 64
    res["sentence_transformers_f16"] = {
        "latency_ms": timed(lambda: st.encode(texts[:1])),
        "batch64_ms": timed(lambda: st.encode(texts, batch_size=64)),
    }
except Exception as e:  # not installed on the box
    res["sentence_transformers"] = f"unavailable: {e.__class__.__name__}"
print("TORCH", json.dumps(res))
