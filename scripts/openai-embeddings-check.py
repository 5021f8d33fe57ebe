#!/usr/bin/env python3
"""Embeddings through the OpenAI Python client, as an app uses them.

Sends `client.embeddings.create` to a gerbil server serving an embedding plan
(all-MiniLM-L6-v2) with the texts of two reference cases, once as the client's
default (base64 on the wire) and once with `encoding_format="float"`, and with
`dimensions=64`; compares the vectors with sentence-transformers' from the
reference file, and prints `embeddings match` when every one is within 1e-4 (the
cut ones unit length again). Used by crates/cli/tests/cli/embed.rs; by hand:

    python3 scripts/openai-embeddings-check.py --base-url http://127.0.0.1:8080/v1 \\
        --reference tests/data/refs/all-minilm-l6-v2.json
"""

import argparse
import json
import math
import sys

import openai


def close(a, b, tol=1e-4):
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--reference", required=True)
    args = ap.parse_args()
    with open(args.reference) as f:
        cases = {c["name"]: c for c in json.load(f)["cases"]}
    picked = [cases["hi"], cases["a"]]
    texts = [c["text"] for c in picked]
    client = openai.OpenAI(base_url=args.base_url, api_key="unused")
    for fmt in (openai.NOT_GIVEN, "float"):
        r = client.embeddings.create(model="minilm", input=texts, encoding_format=fmt)
        got = [d.embedding for d in sorted(r.data, key=lambda d: d.index)]
        for c, v in zip(picked, got):
            if not close(v, c["embedding"]):
                sys.exit(f"{c['name']} ({fmt}): differs from sentence-transformers")
        if r.usage.prompt_tokens != sum(len(c["ids"]) for c in picked):
            sys.exit(f"usage {r.usage} does not count the tokens")
    r = client.embeddings.create(model="minilm", input=texts[0], dimensions=64)
    v = r.data[0].embedding
    want = picked[0]["embedding"][:64]
    norm = math.sqrt(sum(x * x for x in want))
    if not close(v, [x / norm for x in want]):
        sys.exit("dimensions=64: not the first 64 values renormalized")
    print("embeddings match")


if __name__ == "__main__":
    main()
