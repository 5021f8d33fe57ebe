#!/usr/bin/env python3
"""Decode speed of the browser engine in a page against native `gerbil-run` on the same Vulkan
implementation and the same plan: headless Chromium runs WebGPU on its SwiftShader Vulkan driver,
and the native binary is given that same driver through VK_ICD_FILENAMES.

    python3 scripts/web-speed.py PLAN [--dist target/web-dist] [--prompt-tokens 16]
        [--new-tokens 32] [--runs 3] [--gerbil-run target/release/gerbil-run]

The page runs through its address contract (`?run=1&engine=browser&input_ids=…`, greedy, the
result JSON in `#result`), served with its plan by `gerbil-run PLAN serve --web-dir DIST` and
driven through chromedriver's WebDriver API; the first load (download, cache, pipelines) is a
warm-up, then each run reloads the page (the plan comes from the browser's cache). Native runs
`gerbil-run PLAN bench` with the same prompt length and new tokens, once before each page run, so
both sides see the same moments of a noisy machine. Prints each run and one JSON line: both
medians, their ratio and the median of the runs' own ratios.

The surprise: both sides decode with the tokens chosen on the GPU, in batches, so the ratio is the
browser's WebGPU (every buffer access checked, commands crossing into the GPU process) against
wgpu's Vulkan backend, on identical kernels.
"""

import argparse
import glob
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, method, path, body=None, timeout=900):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())["value"]


def wait_port(port, what, limit=60):
    start = time.monotonic()
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() - start > limit:
                sys.exit(f"{what} did not start on port {port}")
            time.sleep(0.2)


def swiftshader_icd():
    found = glob.glob("/usr/lib/chromium/vk_swiftshader_icd.json") + glob.glob(
        "/usr/lib*/chromium*/vk_swiftshader_icd.json"
    )
    if not found:
        sys.exit("no vk_swiftshader_icd.json beside Chromium (Debian's chromium package has one)")
    return found[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan")
    ap.add_argument("--dist", default="target/web-dist")
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gerbil-run", default="target/release/gerbil-run")
    a = ap.parse_args()
    if a.runs < 1:
        sys.exit("--runs must be at least 1")
    env = dict(os.environ, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))

    icd = swiftshader_icd()

    def native():
        run = subprocess.run(
            [a.gerbil_run, a.plan, "bench", "--prompt-tokens", str(a.prompt_tokens),
             "--new-tokens", str(a.new_tokens), "--repeats", "1", "--json"],
            env=dict(env, VK_ICD_FILENAMES=icd), stdout=subprocess.PIPE, check=True, text=True,
        )
        bench = json.loads(run.stdout)
        print(json.dumps({"native": bench["device"], "variant": bench["variant"],
                          "decode_tok_s": bench["decode_tok_s"]}), flush=True)
        return bench["decode_tok_s"]

    port, driver_port = free_port(), free_port()
    server = subprocess.Popen(
        [a.gerbil_run, a.plan, "serve", "--port", str(port), "--web-dir", a.dist],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    driver = subprocess.Popen(["chromedriver", f"--port={driver_port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, "gerbil-run serve", limit=300)
        wait_port(driver_port, "chromedriver")
        base = f"http://127.0.0.1:{driver_port}"
        args = ["--headless=new", "--no-sandbox", "--enable-unsafe-webgpu"]
        caps = {"capabilities": {"alwaysMatch": {"goog:chromeOptions": {"args": args}}}}
        session = call(base, "POST", "/session", caps)["sessionId"]
        ids = ",".join(str(1 + (i * 37) % 500) for i in range(a.prompt_tokens))
        url = (f"http://127.0.0.1:{port}/?run=1&engine=browser&input_ids={ids}"
               f"&max_new_tokens={a.new_tokens}&temperature=0")
        speeds, natives = [], []
        for run in range(a.runs + 1):
            if run > 0:
                natives.append(native())
            call(base, "POST", f"/session/{session}/url", {"url": url})
            start = time.monotonic()
            while True:
                text = call(base, "POST", f"/session/{session}/execute/sync", {
                    "script": "const r = document.getElementById('result');"
                              "return r && r.textContent ? r.textContent : null", "args": []})
                if text:
                    break
                if time.monotonic() - start > 1800:
                    sys.exit("the page gave no result in 30 minutes")
                time.sleep(0.5)
            result = json.loads(text)
            if "error" in result:
                sys.exit(f"the page failed: {result['error']}")
            result.pop("output_ids", None)
            result.pop("text", None)
            # The first load downloads the plan and compiles pipelines: a warm-up.
            if run > 0:
                if not result.get("tok_s"):
                    sys.exit(f"the page gave no decode speed: {result}")
                speeds.append(result["tok_s"])
            print(json.dumps({"run": run, "warmup": run == 0, **result}), flush=True)
        call(base, "DELETE", f"/session/{session}")
    finally:
        server.terminate()
        driver.terminate()
    page, nat = statistics.median(speeds), statistics.median(natives)
    paired = statistics.median(p / n for p, n in zip(speeds, natives))
    print(json.dumps({"page_decode_tok_s": page, "native_decode_tok_s": nat,
                      "page_over_native": page / nat, "median_run_ratio": paired}))


if __name__ == "__main__":
    main()
