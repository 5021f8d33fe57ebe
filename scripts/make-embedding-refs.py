#!/usr/bin/env python3
"""Make the sentence-embedding references: all-MiniLM-L6-v2 through sentence-transformers, and
tiny random BERT and XLM-RoBERTa encoders through transformers.

    python3 -m venv /tmp/stvenv && /tmp/stvenv/bin/pip install torch sentence-transformers transformers
    python3 scripts/build-fixtures.py --out fixtures all-minilm-l6-v2
    /tmp/stvenv/bin/python scripts/make-embedding-refs.py --fixture fixtures/all-minilm-l6-v2 [--only minilm|tiny|xlmr]

The committed references were made on CPU with torch 2.15.0 (PyPI's +cu132 build), transformers
5.24.0, sentence-transformers 6.2.0, tokenizers 0.23.3, numpy 2.4.6, Python 3.11.7 (each file's
"producer" has them); a second run writes identical files.

minilm -> tests/data/refs/all-minilm-l6-v2.json ("embed-ref-v1"): the fixture directory loaded with
  `SentenceTransformer(dir, device="cpu")` (float32, modules.json: Transformer -> mean Pooling ->
  Normalize), each text in TEXTS encoded on its own (batch 1, so no padding), with the token ids the
  model saw (`model.preprocess`; `tokenize` before sentence-transformers 6: [CLS] ... [SEP],
  lower-cased WordPiece, truncated to max_seq_length 256 tokens including [CLS] and [SEP]; five
  texts are longer on purpose, their cases carry "untruncated_len") and
  the unit-length embedding rounded to 7 significant digits. Then a small retrieval check: for
  each query, the documents ranked by descending cosine (and the cosines, in document order).
  Each embedding is also recomputed from the BertModel by hand (mean over the tokens, L2
  normalised) and must agree, so the file describes exactly that computation.

tiny -> tests/data/models/tiny-encoder/bert/ (config.json, model.safetensors float32, modules.json,
  sentence_bert_config.json, 1_Pooling/config.json: the MiniLM fixture's layout, no tokenizer) and
  tests/data/refs/tiny-encoder/bert.json ("tiny-embed-ref-v1"): a random `BertModel(add_pooling_layer=False)`
  of hidden 32, 2 layers, 4 heads, every parameter overwritten with random values (LayerNorm weights
  1 + 0.3 r, LayerNorm and linear biases 0.3 r, embeddings 0.5 r, linear weights r / sqrt(fan-in)),
  so no weight or bias is 0 or 1. For id sequences of lengths 1, 2, 7, 20, 63 (attention mask all
  ones, token_type_ids all zeros) it records the last hidden state, its mean and first ([CLS]) rows
  and the L2-normalised mean, computed in float64 from the saved float32 weights (eager attention),
  written with 9 significant digits.

xlmr -> tests/data/models/tiny-encoder/xlm_roberta/ (the same files) and
  tests/data/refs/tiny-encoder/xlm_roberta.json ("tiny-embed-ref-v1"): a random
  `XLMRobertaModel(add_pooling_layer=False)` of hidden 48, 2 layers, 6 heads, intermediate 96,
  vocab 130, max_position_embeddings 40, type_vocab_size 1, pad_token_id 1, layer_norm_eps 1e-5,
  randomized like the tiny BERT (its own seed); row pad_token_id of the word and position embeddings
  keeps its random values too (nn.Embedding's padding_idx only zeroes it at init; the position row
  is never read). XLM-R numbers positions from padding_idx + 1: transformers derives the position
  ids from input_ids as padding_idx + (cumulative count of non-pad tokens), which for ids that are
  never the pad id is padding_idx + 1 + t, so at most max_position_embeddings - padding_idx - 1 = 38
  positions are usable (sentence_bert_config.json's max_seq_length 38). Its sentence-transformers
  pipeline is Transformer -> CLS Pooling -> Normalize (1_Pooling/config.json: pooling_mode_cls_token
  only). Cases: id sequences of lengths 1, 2, 7, 20, 38 with ids in 3..129 (never <s> 0, <pad> 1 or
  </s> 2), recorded as for the tiny BERT except that embedding = the L2-normalised first row
  (cls_pooled), which is what the pipeline outputs.

qwen3 -> tests/data/models/tiny-encoder/qwen3_embedding/ and refs/tiny-encoder/qwen3_embedding.json:
  a decoder-based embedder laid out as Qwen3-Embedding is: a random `Qwen3Model` (no LM head, so
  its tensors have no `model.` prefix) of hidden 32, 2 layers, 4 heads, 2 KV heads, head_dim 16,
  intermediate 64, vocab 150, max_position_embeddings 128, whose config.json still says
  `Qwen3ForCausalLM`; pipeline Transformer -> last-token Pooling -> Normalize (max_seq_length 64).
  Causal attention; embedding = the L2-normalised last row.

gemma -> tests/data/models/tiny-encoder/embedding_gemma/ and refs/tiny-encoder/embedding_gemma.json:
  EmbeddingGemma's layout: a random `Gemma3TextModel` with use_bidirectional_attention (hidden 32,
  3 layers of types sliding, sliding, full with sliding_window 4 -- which transformers turns into
  4 // 2 + 1 = 3 for bidirectional attention, two-sided: a token sees keys within distance 2 -- 4 heads, 2 KV heads, head_dim 16, intermediate 64, vocab 150,
  query_pre_attn_scalar 16); pipeline Transformer -> mean Pooling -> Dense 32->64 (no bias) ->
  Dense 64->32 (bias) -> Normalize, each Dense an identity-activation linear layer in
  N_Dense/model.safetensors (`linear.weight`, `linear.bias`) with N_Dense/config.json.
  embedding = normalize(D2(D1(mean rows))), computed by hand in float64.

Each tiny model is also run in float32 and must agree with its float64 reference within 1e-5.
"""
import argparse
import json
import os
import platform
import random
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; read when huggingface_hub is imported

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFS = os.path.join(REPO, "tests", "data", "refs")
TINY_DIR = os.path.join(REPO, "tests", "data", "models", "tiny-encoder", "bert")
TINY_SEED = 4242
TINY_LENS = [1, 2, 7, 20, 63]
XLMR_DIR = os.path.join(REPO, "tests", "data", "models", "tiny-encoder", "xlm_roberta")
XLMR_SEED = 4243
XLMR_LENS = [1, 2, 7, 20, 38]
QWEN3_DIR = os.path.join(REPO, "tests", "data", "models", "tiny-encoder", "qwen3_embedding")
QWEN3_SEED = 4244
GEMMA_DIR = os.path.join(REPO, "tests", "data", "models", "tiny-encoder", "embedding_gemma")
GEMMA_SEED = 4245
DECODER_LENS = [1, 2, 7, 20, 63]

LONG_PROSE = (
    "The history of the river valley is written in its stones. Long before the first farmers cleared "
    "the oak forests, glaciers had carved the wide basin and left behind ridges of gravel that still "
    "shape the roads today. The earliest settlements clustered on these dry ridges, above the reach of "
    "the spring floods, and the pattern persisted for centuries: churches, markets and later railway "
    "stations were all built on the same narrow strips of high ground. When engineers finally "
    "straightened the river in the nineteenth century, the floods became rarer but the meadows dried "
    "out, the fish disappeared and the old mills fell silent one after another. Today conservation "
    "groups are trying to restore some of the original meanders, arguing that a river which is allowed "
    "to spread out over its floodplain protects the towns downstream better than any concrete wall. "
    "Farmers are divided: some welcome the compensation payments and the return of the storks, others "
    "fear losing fields their families have worked for generations. The debate has filled town hall "
    "meetings for a decade, and every new proposal is met with petitions, counter-petitions, expert "
    "reports and long letters to the local newspaper, which has published more articles about water "
    "levels than about any other subject since it was founded. Whatever the outcome, everyone agrees "
    "that the valley will look very different in fifty years, and that the decisions taken now will be "
    "judged by grandchildren who will never have seen the river the way it is today."
)
LONG_TECH = (
    "To configure the service, create a file named settings.toml in the working directory. The "
    "[server] table accepts host, port and workers; the [storage] table accepts path, max_size_mb and "
    "compression, which may be one of none, lz4 or zstd. Environment variables override the file: "
    "APP_SERVER_PORT=8080 sets the port, APP_STORAGE_PATH=/var/lib/app sets the data directory. "
    "On startup the service validates every value and refuses to run if, for example, the port is "
    "outside 1-65535 or the storage path is not writable. Logs go to standard error in JSON lines; set "
    "APP_LOG=debug for verbose output, including the timing of each request, the size of the response "
    "and the identifier of the worker thread that handled it. Upgrading from version 1.x requires "
    "running the migrate subcommand once, which rewrites the on-disk index in the new format and "
    "keeps a backup copy next to it with the suffix .bak; the backup can be deleted after the first "
    "successful start. If the migration is interrupted, simply run it again: it is idempotent and "
    "resumes where it stopped. For high availability run at least three instances behind a load "
    "balancer and point them at shared storage with consistent locking semantics."
)

# (name, text); names only label the cases
TEXTS = [
    ("empty", ""),
    ("a", "a"),
    ("hi", "Hi"),
    ("question_mark", "?"),
    ("space", " "),
    ("ellipsis", "..."),
    ("newline_tab", "\n\t"),
    ("spaces_many", "      "),
    ("single_word", "Embeddings"),
    ("uppercase", "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG"),
    ("sentence_fox", "The quick brown fox jumps over the lazy dog."),
    ("sentence_cat", "A cat is sitting on the windowsill, watching the birds outside."),
    ("sentence_weather", "It will probably rain tomorrow afternoon, so bring an umbrella."),
    ("sentence_question", "How do I reset my password if I no longer have access to my email?"),
    ("sentence_science", "Photosynthesis converts light energy into chemical energy stored in glucose."),
    ("sentence_finance", "The central bank raised interest rates by a quarter of a percentage point."),
    ("sentence_sport", "She scored twice in the second half and her team won the final 3-1."),
    ("sentence_food", "Slice the onions thinly and fry them slowly in butter until golden brown."),
    ("sentence_negation", "This is not a good idea at all."),
    ("sentence_affirm", "This is a good idea."),
    ("two_sentences", "I bought a new laptop last week. The battery lasts almost twelve hours."),
    ("contractions", "We'll see what they've done; it isn't what we'd hoped, is it?"),
    ("punctuation_heavy", "Wait -- what?! No... (really?) [yes]; {maybe}: \"quoted\" & 'single' / back\\slash"),
    ("hyphenated", "state-of-the-art, well-known, mother-in-law, e-mail, co-operate"),
    ("url_email", "Contact support@example.com or visit https://example.org/help?topic=login#faq"),
    ("numbers", "3.14159 2.71828 1.41421 42 1000000 -7 0.001 1e-9"),
    ("date_money", "On 2024-03-15 the invoice #A-1093 for $1,249.99 (EUR 1.150,00) was paid."),
    ("phone_math", "Call +1 (555) 010-9999; x^2 + y^2 = r^2 and 7 * 6 = 42."),
    ("code_python", "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"),
    ("code_rust", "fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); println!(\"{:?}\", v); }"),
    ("code_sql", "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;"),
    ("json", "{\"id\": 17, \"tags\": [\"a\", \"b\"], \"ok\": true, \"score\": null}"),
    ("repeated_word", "hello hello hello hello hello hello hello hello"),
    ("repeated_char", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
    ("rare_words", "Sesquipedalian floccinaucinihilipilification antidisestablishmentarianism"),
    ("french", "Le cœur a ses raisons que la raison ne connaît point. Où est la bibliothèque ?"),
    ("french_accents", "élève, garçon, naïve, déjà vu, crème brûlée, Noël, façade"),
    ("german", "Die Straße ist nass, weil es gestern geregnet hat. Grüße aus München!"),
    ("german_compound", "Donaudampfschifffahrtsgesellschaftskapitän"),
    ("spanish", "¿Dónde está la estación de tren? ¡Muchas gracias, señor!"),
    ("chinese", "我喜欢在周末去公园散步。"),
    ("japanese", "東京は日本の首都です。ひらがなとカタカナも使います。"),
    ("korean", "안녕하세요, 만나서 반갑습니다."),
    ("arabic", "مرحبا بالعالم، كيف حالك اليوم؟"),
    ("russian", "Москва — столица России. Привет, как дела?"),
    ("greek", "Καλημέρα κόσμε, τι κάνεις;"),
    ("hindi", "नमस्ते, आप कैसे हैं?"),
    ("emoji_only", "😀🎉🚀"),
    ("emoji_mixed", "I love pizza 🍕 and coffee ☕ in the morning ☀️!"),
    ("mixed_scripts", "English, Français, Deutsch, 中文, 日本語, Русский, العربية"),
    ("combining_marks", "cafe\u0301 vs caf\u00e9, n\u0303 vs \u00f1"),
    ("zero_width_nbsp", "zero\u200bwidth\u00a0space\u3000ideographic"),
    ("control_chars", "tab\there\rcarriage\x0bvertical\x0cform"),
    ("leading_trailing_ws", "   padded with spaces and a newline   \n"),
    ("long_prose_truncated", LONG_PROSE),
    ("long_tech_truncated", LONG_TECH),
    ("long_repeated_truncated", " ".join(["buffalo"] * 300)),
    ("long_mixed_truncated", "Numbers: " + ", ".join(str(i * 37 % 1000) for i in range(200))),
    ("exactly_limit", " ".join(["word"] * 254)),  # 254 + [CLS] + [SEP] = 256 tokens
    ("one_over_limit_truncated", " ".join(["word"] * 255)),
]

RETRIEVAL_QUERIES = [
    "How do I bake bread at home?",
    "What is the capital of France?",
    "Tips for improving sleep quality",
    "How does a car engine work?",
    "Best way to learn a programming language",
]
RETRIEVAL_DOCUMENTS = [
    "Paris is the capital and most populous city of France.",
    "Mix flour, water, salt and yeast, let the dough rise, then bake it in a hot oven.",
    "Keep a regular bedtime, avoid screens late at night and keep your bedroom cool and dark.",
    "An internal combustion engine burns fuel in cylinders to push pistons that turn a crankshaft.",
    "Write small programs every day and read other people's code to learn a new language quickly.",
    "Berlin is the capital of Germany and has a population of about 3.7 million.",
    "Sourdough uses a fermented starter instead of commercial yeast.",
    "Electric cars use batteries and motors instead of a combustion engine.",
    "Caffeine in the afternoon can make it harder to fall asleep.",
    "The Eiffel Tower was completed in 1889 for the World's Fair.",
    "Python and JavaScript are popular first languages for beginners.",
]


def sig(x, digits):
    """A float rounded to `digits` significant digits (a Python float, so JSON prints it short)."""
    return float(f"{float(x):.{digits - 1}e}")


def versions():
    import tokenizers
    import transformers
    v = {"torch": torch.__version__, "transformers": transformers.__version__,
         "tokenizers": tokenizers.__version__, "numpy": np.__version__,
         "python": platform.python_version()}
    try:
        import sentence_transformers
        v["sentence_transformers"] = sentence_transformers.__version__
    except ImportError:
        pass
    return v


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path) / 1e3:.1f} KB)")


# ---------------------------------------------------------------------------------------------
# all-MiniLM-L6-v2


def check_pipeline(model):
    """The loaded SentenceTransformer is Transformer -> mean Pooling -> Normalize, as the ref says."""
    mods = list(model)
    assert [type(m).__name__ for m in mods] == ["Transformer", "Pooling", "Normalize"], mods
    assert mods[1].get_config_dict().get("pooling_mode") == "mean", mods[1].get_config_dict()
    assert model.max_seq_length == 256, model.max_seq_length
    assert type(mods[0].auto_model).__name__ == "BertModel", mods[0]


def by_hand(model, ids):
    """Mean over the BertModel's last hidden state, L2-normalised: what the ref claims encode does."""
    bert = model[0].auto_model
    x = torch.tensor([ids])
    with torch.no_grad():
        h = bert(input_ids=x, attention_mask=torch.ones_like(x), token_type_ids=torch.zeros_like(x))
    m = h.last_hidden_state[0].mean(0)
    return (m / m.norm().clamp_min(1e-12)).numpy()


def minilm(fixture):
    from sentence_transformers import SentenceTransformer
    torch.manual_seed(0)
    model = SentenceTransformer(fixture, device="cpu")
    model.eval()
    check_pipeline(model)
    tok = model.tokenizer
    cases, worst, truncated = [], 0.0, 0
    for name, text in TEXTS:
        features = (model.preprocess if hasattr(model, "preprocess") else model.tokenize)([text])
        assert not features["token_type_ids"].any() and features["attention_mask"].all(), features
        ids = features["input_ids"][0].tolist()
        full = len(tok(text, add_special_tokens=True)["input_ids"])
        assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id, (name, ids)
        assert len(ids) == min(full, model.max_seq_length), (name, len(ids), full)
        truncated += full > len(ids)
        emb = model.encode([text], batch_size=1, convert_to_numpy=True)[0]
        assert emb.dtype == np.float32 and emb.shape == (384,), (emb.dtype, emb.shape)
        worst = max(worst, float(np.abs(emb - by_hand(model, ids)).max()))
        case = {"name": name, "text": text, "ids": ids, "embedding": [sig(v, 7) for v in emb]}
        if full > len(ids):
            case["untruncated_len"] = full
        cases.append(case)
    assert worst < 1e-5, f"encode and the by-hand mean pooling differ by {worst}"
    print(f"minilm: {len(cases)} texts, {truncated} truncated to 256 tokens, "
          f"encode vs by-hand max |diff| {worst:.2e}")

    q = model.encode(RETRIEVAL_QUERIES, batch_size=1, convert_to_numpy=True)
    d = model.encode(RETRIEVAL_DOCUMENTS, batch_size=1, convert_to_numpy=True)
    scores = q.astype(np.float64) @ d.astype(np.float64).T
    ranking = [[int(j) for j in np.argsort(-row, kind="stable")] for row in scores]
    for qi, row in enumerate(scores):
        top = sorted(row, reverse=True)
        print(f"  query {qi}: top {ranking[qi][:3]}, margin top1-top2 {top[0] - top[1]:.4f}")

    ref = {
        "schema": "embed-ref-v1",
        "model": "all-minilm-l6-v2",
        "producer": versions(),
        "compute": "SentenceTransformer(dir, device='cpu'), float32, each text encoded alone (batch 1, "
                   "no padding); token_type_ids all 0, attention mask all 1",
        "max_seq_length": model.max_seq_length,
        "pooling": "mean",
        "normalize": True,
        "cases": cases,
        "retrieval": {
            "queries": RETRIEVAL_QUERIES,
            "documents": RETRIEVAL_DOCUMENTS,
            "ranking": ranking,
            "scores": [[sig(v, 7) for v in row] for row in scores],
        },
    }
    write_json(os.path.join(REFS, "all-minilm-l6-v2.json"), ref)


# ---------------------------------------------------------------------------------------------
# tiny random encoders: BERT and XLM-RoBERTa


def tiny_config():
    from transformers import BertConfig
    return BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
                      hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0)


def randomize(model, seed):
    """Every parameter redrawn: nothing left at an initializer's 0 or 1."""
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        r = torch.randn(p.shape, generator=g, dtype=torch.float32)
        if "LayerNorm.weight" in name:
            val = 1.0 + 0.3 * r
        elif p.ndim == 1:
            val = 0.3 * r
        elif "embeddings" in name:
            val = 0.5 * r
        else:
            val = r / p.shape[1] ** 0.5
        with torch.no_grad():
            p.copy_(val)


def xlmr_config():
    from transformers import XLMRobertaConfig
    return XLMRobertaConfig(vocab_size=130, hidden_size=48, num_hidden_layers=2, num_attention_heads=6,
                            intermediate_size=96, max_position_embeddings=40, type_vocab_size=1,
                            pad_token_id=1, hidden_act="gelu", layer_norm_eps=1e-5)


def save_tiny(model, out_dir=TINY_DIR, pooling="mean", max_seq_length=None):
    """config.json + model.safetensors (float32) from save_pretrained, then the sentence-transformers
    files of the MiniLM fixture's layout (`pooling`: "mean" or "cls"; max_seq_length defaults to
    max_position_embeddings)."""
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    for f in os.listdir(out_dir):
        if f not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(out_dir, f))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    assert pooling in ("mean", "cls"), pooling
    pooling = {"word_embedding_dimension": model.config.hidden_size,
               "pooling_mode_cls_token": pooling == "cls",
               "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False}
    if max_seq_length is None:
        max_seq_length = model.config.max_position_embeddings
    sbert = {"max_seq_length": max_seq_length, "do_lower_case": False}
    for rel, obj in [("modules.json", modules), ("1_Pooling/config.json", pooling),
                     ("sentence_bert_config.json", sbert)]:
        path = os.path.join(out_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")


def check_saved(out_dir):
    """Every saved tensor is float32 and holds no exact 0 or 1; returns the sorted tensor names."""
    from safetensors import safe_open
    with safe_open(os.path.join(out_dir, "model.safetensors"), "pt") as f:
        names = sorted(f.keys())
        for n in names:
            t = f.get_tensor(n)
            assert t.dtype == torch.float32, (n, t.dtype)
            assert not ((t == 0).any() or (t == 1).any()), f"{n} has a 0 or a 1"
    return names


def tiny_ref(model_cls, out_dir, model_name, seed, lens, first_id, pooling, compute):
    """The tiny-embed-ref-v1 file for the saved model in out_dir: float64 from the float32 weights,
    ids drawn from random.Random(seed) in first_id..vocab_size-1; the float32 model must agree."""
    model = model_cls.from_pretrained(out_dir, add_pooling_layer=False, attn_implementation="eager").double().eval()
    model32 = model_cls.from_pretrained(out_dir, add_pooling_layer=False, attn_implementation="eager").eval()
    rng = random.Random(seed)
    cases, worst = [], 0.0
    for n in lens:
        ids = [rng.randrange(first_id, model.config.vocab_size) for _ in range(n)]
        x = torch.tensor([ids])
        with torch.no_grad():
            h = model(input_ids=x, attention_mask=torch.ones_like(x),
                      token_type_ids=torch.zeros_like(x)).last_hidden_state[0]
            h32 = model32(input_ids=x, attention_mask=torch.ones_like(x),
                          token_type_ids=torch.zeros_like(x)).last_hidden_state[0]
        mean = h.mean(0)
        pooled = mean if pooling == "mean" else h[0]
        emb = pooled / pooled.norm()
        pooled32 = h32.mean(0) if pooling == "mean" else h32[0]
        worst = max(worst, float((h32.double() - h).abs().max()),
                    float(((pooled32 / pooled32.norm()).double() - emb).abs().max()))
        cases.append(tiny_case(n, ids, h, emb))
    write_tiny_ref(model_cls, out_dir, model_name, seed, compute, cases, worst)


def tiny_case(n, ids, h, emb):
    """One case of a tiny-embed-ref-v1 file: the ids, the last hidden state `h`, its mean and first
    rows, and the pipeline's embedding `emb`, at 9 significant digits."""
    return {
        "name": f"len{n}",
        "ids": ids,
        "last_hidden_state": [[sig(v, 9) for v in row] for row in h.tolist()],
        "mean_pooled": [sig(v, 9) for v in h.mean(0).tolist()],
        "cls_pooled": [sig(v, 9) for v in h[0].tolist()],
        "embedding": [sig(v, 9) for v in emb.tolist()],
    }


def write_tiny_ref(model_cls, out_dir, model_name, seed, compute, cases, worst):
    """Writes refs/tiny-encoder/MODEL.json, once the float32 run (`worst` from float64) agrees."""
    assert worst < 1e-5, f"{model_name}: float32 and float64 differ by {worst}"
    print(f"{model_name}: float32 vs float64 max |diff| {worst:.2e} (last hidden state and embedding)")
    write_json(os.path.join(REFS, "tiny-encoder", f"{model_name}.json"), {
        "schema": "tiny-embed-ref-v1",
        "model": model_name,
        "model_dir": os.path.relpath(out_dir, REPO),
        "architecture": model_cls.__name__,
        "checkpoint_dtype": "float32",
        "seed": seed,
        "compute": compute,
        "producer": versions(),
        "cases": cases,
    })


def tiny():
    from transformers import BertModel
    torch.manual_seed(TINY_SEED)
    model = BertModel(tiny_config(), add_pooling_layer=False)
    randomize(model, TINY_SEED)
    save_tiny(model.to(torch.float32))
    names = check_saved(TINY_DIR)
    print(f"tiny: {TINY_DIR}: {len(names)} tensors: {', '.join(names[:6])}, ...")
    tiny_ref(BertModel, TINY_DIR, "bert", TINY_SEED, TINY_LENS, 1, "mean",
             "float64 (float32 weights upcast), attn_implementation=eager, CPU, batch 1, no padding; "
             "attention mask all 1, token_type_ids all 0; embedding = mean_pooled / ||mean_pooled||")


def xlmr():
    from transformers import XLMRobertaModel
    torch.manual_seed(XLMR_SEED)
    model = XLMRobertaModel(xlmr_config(), add_pooling_layer=False)
    randomize(model, XLMR_SEED)
    pad = model.config.pad_token_id
    usable = model.config.max_position_embeddings - pad - 1  # positions run pad + 1 .. pad + n
    assert max(XLMR_LENS) == usable, (XLMR_LENS, usable)
    save_tiny(model.to(torch.float32), XLMR_DIR, pooling="cls", max_seq_length=usable)
    names = check_saved(XLMR_DIR)
    print(f"xlmr: {XLMR_DIR}: {len(names)} tensors: {', '.join(names[:6])}, ...")
    tiny_ref(XLMRobertaModel, XLMR_DIR, "xlm_roberta", XLMR_SEED, XLMR_LENS, pad + 2, "cls",
             "float64 (float32 weights upcast), attn_implementation=eager, CPU, batch 1, no padding; "
             "attention mask all 1, token_type_ids all 0; no id is the pad id 1, so position ids are "
             f"padding_idx + 1 + t = {pad + 1}, {pad + 2}, ... (at most {usable} positions); "
             "embedding = cls_pooled / ||cls_pooled||")


# ---------------------------------------------------------------------------------------------
# tiny random decoder-based embedders: Qwen3-Embedding's and EmbeddingGemma's layouts


def write_files(out_dir, files):
    for rel, obj in files:
        path = os.path.join(out_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")


def save_decoder(model, out_dir, architecture, pooling, dense, max_seq_length):
    """config.json (architectures set to `architecture`) + model.safetensors + the
    sentence-transformers files; `dense` is a list of (in, out, bias, weight, bias tensor)."""
    from safetensors.torch import save_file
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    for f in os.listdir(out_dir):
        if f not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(out_dir, f))
    with open(os.path.join(out_dir, "config.json")) as f:
        config = json.load(f)
    config["architectures"] = [architecture]
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    files = [("config.json", config),
             ("1_Pooling/config.json", {"word_embedding_dimension": model.config.hidden_size,
                                        "pooling_mode": pooling}),
             ("sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})]
    for i, (fin, fout, bias, w, b) in enumerate(dense):
        path = f"{i + 2}_Dense"
        modules.append({"idx": i + 2, "name": str(i + 2), "path": path,
                        "type": "sentence_transformers.models.Dense"})
        files.append((f"{path}/config.json", {"in_features": fin, "out_features": fout, "bias": bias,
                                              "activation_function": "torch.nn.modules.linear.Identity"}))
        tensors = {"linear.weight": w.contiguous()}
        if bias:
            tensors["linear.bias"] = b.contiguous()
        os.makedirs(os.path.join(out_dir, path), exist_ok=True)
        save_file(tensors, os.path.join(out_dir, path, "model.safetensors"))
    n = len(modules)
    modules.append({"idx": n, "name": str(n), "path": f"{n}_Normalize",
                    "type": "sentence_transformers.models.Normalize"})
    files.append(("modules.json", modules))
    write_files(out_dir, files)


def decoder_ref(model_cls, out_dir, model_name, seed, pooling, dense, compute):
    """tiny-embed-ref-v1 for a decoder-based embedder: float64 from the float32 weights."""
    model = model_cls.from_pretrained(out_dir, attn_implementation="eager").double().eval()
    model32 = model_cls.from_pretrained(out_dir, attn_implementation="eager").eval()
    rng = random.Random(seed)
    cases, worst = [], 0.0

    def head(h, dtype):
        v = h.mean(0) if pooling == "mean" else h[-1]
        for (_, _, bias, w, b) in dense:
            v = w.to(dtype) @ v + (b.to(dtype) if bias else 0)
        return v, v / v.norm()

    for n in DECODER_LENS:
        ids = [rng.randrange(0, model.config.vocab_size) for _ in range(n)]
        x = torch.tensor([ids])
        with torch.no_grad():
            h = model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0]
            h32 = model32(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0]
        _, emb = head(h, torch.float64)
        _, emb32 = head(h32, torch.float32)
        worst = max(worst, float((h32.double() - h).abs().max()), float((emb32.double() - emb).abs().max()))
        cases.append(tiny_case(n, ids, h, emb))
    write_tiny_ref(model_cls, out_dir, model_name, seed, compute, cases, worst)


def qwen3():
    from transformers import Qwen3Config, Qwen3Model
    torch.manual_seed(QWEN3_SEED)
    config = Qwen3Config(vocab_size=150, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False)
    model = Qwen3Model(config)
    randomize(model, QWEN3_SEED)
    save_decoder(model.to(torch.float32), QWEN3_DIR, "Qwen3ForCausalLM", "lasttoken", [], 64)
    names = check_saved(QWEN3_DIR)
    assert not any(n.startswith("model.") for n in names), names[:4]
    print(f"qwen3: {QWEN3_DIR}: {len(names)} tensors: {', '.join(names[:6])}, ...")
    decoder_ref(Qwen3Model, QWEN3_DIR, "qwen3_embedding", QWEN3_SEED, "lasttoken", [],
                "float64 (float32 weights upcast), attn_implementation=eager, CPU, batch 1, no padding; "
                "causal attention; embedding = last row / ||last row||")


def gemma():
    from transformers import Gemma3TextConfig, Gemma3TextModel
    torch.manual_seed(GEMMA_SEED)
    config = Gemma3TextConfig(vocab_size=150, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              max_position_embeddings=128, query_pre_attn_scalar=16, sliding_window=4,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                              use_bidirectional_attention=True, final_logit_softcapping=None,
                              attn_logit_softcapping=None, tie_word_embeddings=True)
    model = Gemma3TextModel(config)
    randomize(model, GEMMA_SEED)
    g = torch.Generator().manual_seed(GEMMA_SEED + 1)
    dense = [(32, 64, False, torch.randn(64, 32, generator=g) / 32 ** 0.5, None),
             (64, 32, True, torch.randn(32, 64, generator=g) / 64 ** 0.5, 0.3 * torch.randn(32, generator=g))]
    save_decoder(model.to(torch.float32), GEMMA_DIR, "Gemma3TextModel", "mean", dense, 64)
    names = check_saved(GEMMA_DIR)
    print(f"gemma: {GEMMA_DIR}: {len(names)} tensors: {', '.join(names[:6])}, ...")
    decoder_ref(Gemma3TextModel, GEMMA_DIR, "embedding_gemma", GEMMA_SEED, "mean", dense,
                "float64 (float32 weights upcast), attn_implementation=eager, CPU, batch 1, no padding; "
                "bidirectional attention (sliding layers: |i - j| < sliding_window // 2 + 1 = 3); "
                "embedding = normalize(Dense2(Dense1(mean rows)))")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture", default=os.path.join(os.environ.get("GERBIL_FIXTURES", "fixtures"),
                                                      "all-minilm-l6-v2"),
                    help="all-MiniLM-L6-v2 from build-fixtures.py (default $GERBIL_FIXTURES/all-minilm-l6-v2)")
    ap.add_argument("--only", choices=["minilm", "tiny", "xlmr", "qwen3", "gemma"])
    a = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if a.only in (None, "minilm"):
        minilm(a.fixture)
    if a.only in (None, "tiny"):
        tiny()
    if a.only in (None, "xlmr"):
        xlmr()
    if a.only in (None, "qwen3"):
        qwen3()
    if a.only in (None, "gemma"):
        gemma()


if __name__ == "__main__":
    main()
