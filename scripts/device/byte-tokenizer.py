#!/usr/bin/env python3
"""Write a byte-level BPE tokenizer.json of a given vocabulary size into a random-weight model.

Random-weight models of real shapes (random_ref.py) come without tokenizer files, and serving needs
text. This tokenizer encodes text as its UTF-8 bytes (ids 0-255, no merges) and decodes every other
id to a distinct printable name (`<t1234>`), so any token a random model samples turns into text and
two runs agree on text exactly when they agree on tokens. Standard library only.

    python3 scripts/device/byte-tokenizer.py --vocab 128256 --out DIR/model
"""
import argparse
import json
import os


def byte_chars():
    """GPT-2's printable stand-in for each byte, as the ByteLevel pre-tokenizer maps them."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, required=True, help="the model's vocab_size (at least 256)")
    p.add_argument("--out", required=True, help="the model directory to write tokenizer.json into")
    a = p.parse_args()
    if a.vocab < 256:
        raise SystemExit(f"--vocab {a.vocab}: a byte-level vocabulary needs at least 256 ids")
    vocab = {c: i for i, c in enumerate(byte_chars())}
    for i in range(256, a.vocab):
        vocab[f"<t{i}>"] = i
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": level,
        "post_processor": None,
        "decoder": level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": []},
    }
    with open(os.path.join(a.out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)


if __name__ == "__main__":
    main()
