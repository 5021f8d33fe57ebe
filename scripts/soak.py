#!/usr/bin/env python3
"""Soak `gerbil-run PLAN serve`: mixed clients for a while on 127.0.0.1, then a verdict.

    python3 scripts/soak.py PLAN [--minutes 10] [--clients 8] [--gerbil-run target/release/gerbil-run]

Starts the server on a free port and runs, until the time is up, clients that each loop over
a mix of requests: whole and streamed chat and text completions (greedy, a few tokens), a stream
the client drops after its first event, bad requests (not JSON, a text/plain POST, a prompt over
the context by its size, an unknown route), a connection that sends half a head and waits past the
server's --header-timeout (2 s here), and a body that never arrives (--body-timeout 2 s). Every
answer must be the status the kind expects (200, 400, 404, 408, 415; a closed connection for the
half head), with an OpenAI error object on errors. The server's resident memory (VmRSS) is sampled
every 10 s. Prints requests and failures per kind and the RSS samples; exits 1 if any request got
an unexpected answer, the server died, or the RSS at the end is more than 10% (and 16 MiB) above
its level after the first minute's warm-up. Standard library only.
"""
import argparse
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

PROMPTS = ["Hello", "What is the capital of France?", "Count to five.", "Tell me a story."]


def request(port, method, path, body=None, content_type="application/json", timeout=300):
    """One request on its own connection: (status, parsed JSON or raw text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": content_type} if body is not None else {}
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    try:
        return resp.status, json.loads(data)
    except ValueError:
        return resp.status, data.decode("utf-8", "replace")


def is_error_object(v):
    return isinstance(v, dict) and isinstance(v.get("error"), dict) and "message" in v["error"]


def stream(port, body, drop_after_first=False):
    """A streamed completion: True when it ends with [DONE] (or was dropped as planned)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        return False
    ok = False
    while True:
        line = resp.fp.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            if drop_after_first:
                conn.sock.close()
                return True
            if line.strip() == b"data: [DONE]":
                ok = True
                break
    conn.close()
    return ok


def half_head(port, wait):
    """Sends half a request head; True when the server closes it within `wait` seconds."""
    s = socket.create_connection(("127.0.0.1", port), timeout=wait)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    try:
        closed = s.recv(1) == b""
    except (socket.timeout, ConnectionResetError):
        closed = False
    s.close()
    return closed


def missing_body(port):
    """A body that never arrives: the server answers 408."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              b"Content-Type: application/json\r\nContent-Length: 50\r\n\r\n{")
    head = s.recv(64)
    s.close()
    return head.startswith(b"HTTP/1.1 408")


def one_round(port, i):
    """Runs kind number `i` of the mix; returns (kind, ok)."""
    prompt = PROMPTS[i % len(PROMPTS)]
    kinds = [
        "chat", "completion", "stream", "dropped-stream", "not-json", "text-plain",
        "too-large", "unknown-route", "half-head", "missing-body",
    ]
    kind = kinds[i % len(kinds)]
    greedy = {"temperature": 0, "max_tokens": 8}
    if kind == "chat":
        s, v = request(port, "POST", "/v1/chat/completions",
                       json.dumps({"messages": [{"role": "user", "content": prompt}], **greedy}))
        return kind, s == 200 and v["choices"][0]["message"]["role"] == "assistant"
    if kind == "completion":
        s, v = request(port, "POST", "/v1/completions", json.dumps({"prompt": prompt, **greedy}))
        return kind, s == 200 and isinstance(v["choices"][0]["text"], str)
    if kind in ("stream", "dropped-stream"):
        body = {"messages": [{"role": "user", "content": prompt}], "stream": True, **greedy}
        return kind, stream(port, body, drop_after_first=kind == "dropped-stream")
    if kind == "not-json":
        s, v = request(port, "POST", "/v1/completions", "{not json")
        return kind, s == 400 and is_error_object(v)
    if kind == "text-plain":
        s, v = request(port, "POST", "/v1/completions", json.dumps({"prompt": prompt}), "text/plain")
        return kind, s == 415 and is_error_object(v)
    if kind == "too-large":
        s, v = request(port, "POST", "/v1/completions", json.dumps({"prompt": "a" * 900_000}))
        return kind, s == 400 and is_error_object(v)
    if kind == "unknown-route":
        s, v = request(port, "GET", "/v2/nothing")
        return kind, s == 404 and is_error_object(v)
    if kind == "half-head":
        return kind, half_head(port, 10)
    return kind, missing_body(port)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--gerbil-run", default="target/release/gerbil-run")
    args = ap.parse_args()

    server = subprocess.Popen(
        [args.gerbil_run, args.plan, "serve", "--port", "0", "--header-timeout", "2",
         "--body-timeout", "2", "--max-connections", "64"],
        stderr=subprocess.PIPE, text=True)
    port = None
    for line in server.stderr:
        if line.startswith("listening on http://"):
            port = int(line.strip().rsplit(":", 1)[1])
            break
    if port is None:
        sys.exit("the server did not start")
    threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
    end = time.time() + args.minutes * 60
    done, failed = Counter(), Counter()
    lock = threading.Lock()

    def client(c):
        i = c
        while time.time() < end:
            try:
                kind, ok = one_round(port, i)
            except Exception as e:  # noqa: BLE001 - every failure counts
                kind, ok = f"exception {type(e).__name__}", False
            with lock:
                done[kind] += 1
                if not ok:
                    failed[kind] += 1
            i += args.clients

    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    start = time.time()
    for t in threads:
        t.start()
    samples = []
    while any(t.is_alive() for t in threads):
        if server.poll() is not None:
            break
        samples.append((round(time.time() - start), rss_kib(server.pid)))
        time.sleep(10)
    for t in threads:
        t.join()
    alive = server.poll() is None
    server.send_signal(2)
    try:
        code = server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        code = "killed after 30 s"

    print(f"{sum(done.values())} requests in {args.minutes} min from {args.clients} clients:")
    for kind in sorted(done):
        print(f"  {kind:16s} {done[kind]:6d}  failed {failed[kind]}")
    print("RSS (s, MiB): " + ", ".join(f"{s}: {k / 1024:.0f}" for s, k in samples))
    warm = [k for s, k in samples if s >= 60] or [k for _, k in samples]
    growth = (warm[-1] - warm[0]) if warm else 0
    flat = growth <= max(0.10 * warm[0], 16 * 1024) if warm else False
    print(f"RSS after warm-up {warm[0] / 1024:.0f} MiB, at the end {warm[-1] / 1024:.0f} MiB: "
          f"{'flat' if flat else 'GROWING'}; server exit on Ctrl-C: {code}")
    ok = alive and not failed and flat and code == 0
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
