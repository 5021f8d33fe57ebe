#!/usr/bin/env python3
"""Many users on one GPU, measured: `gerbil-run PLAN serve` answering one client, then N at once.

Starts `gerbil-run PLAN serve --slots N` (the plan compiled with `--max-batch N` decodes the
requests together; without it they run one at a time), warms it up, then sends N greedy
completion requests of --tokens tokens each: one after another (the single-client rate), then all
at once, streamed, timing each request's first token. Prints one JSON object: single-client and
aggregate decode tok/s, their ratio, the time to first token of the concurrent requests (p50, p99)
and whether every concurrent answer equals its solo answer (exit 1 if not). Standard library only.

    python3 scripts/serve-bench.py --bin target/release/gerbil-run --plan model.plan --clients 16 --tokens 128

`--serve-arg=ARG` (repeatable) passes ARG to `serve`, e.g. `--serve-arg=--no-tensor-cores`.
"""

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request


def start_server(binary, plan, clients, extra):
    proc = subprocess.Popen(
        [binary, plan, "serve", "--port", "0", "--slots", str(clients), "--max-queue", str(4 * clients),
         *extra],
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stderr:
        if line.startswith("listening on http://"):
            port = int(line.rsplit(":", 1)[1])
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, port
    raise SystemExit("the server ended before listening")


def completion(port, i, tokens):
    """A streamed greedy completion: its text, and seconds to its first token and to its end."""
    body = json.dumps({"prompt": f"Request {i}: once upon a time", "max_tokens": tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    start = time.monotonic()
    first = None
    text = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            piece = json.loads(line[6:])["choices"][0].get("text", "")
            if piece and first is None:
                first = time.monotonic() - start
            text.append(piece)
    return "".join(text), first or 0.0, time.monotonic() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--serve-arg", action="append", default=[],
                   help="one more argument of `serve` (repeatable), e.g. --serve-arg=--no-tensor-cores")
    a = p.parse_args()
    proc, port = start_server(a.bin, a.plan, a.clients, a.serve_arg)
    try:
        completion(port, -1, 8)  # warm-up: pipelines, caches
        t = time.monotonic()
        solo = [completion(port, i, a.tokens) for i in range(a.clients)]
        one_at_a_time = time.monotonic() - t
        together = [None] * a.clients

        def run(i):
            together[i] = completion(port, i, a.tokens)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(a.clients)]
        t = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        at_once = time.monotonic() - t
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    ttft = sorted(r[1] for r in together)
    total = a.clients * a.tokens
    single = total / one_at_a_time
    aggregate = total / at_once
    same = [s[0] for s in solo] == [r[0] for r in together]
    print(json.dumps({
        "clients": a.clients,
        "tokens": a.tokens,
        "single_client_tok_s": round(single, 1),
        "aggregate_tok_s": round(aggregate, 1),
        "ratio": round(aggregate / single, 2),
        "ttft_p50_s": round(statistics.median(ttft), 4),
        "ttft_p99_s": round(ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))], 4),
        "answers_equal_solo": same,
    }))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
