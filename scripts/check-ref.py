#!/usr/bin/env python3
"""Checks a compiled plan against a transformers reference (schema tiny-ref-v1).

    python3 scripts/check-ref.py --run target/release/gerbil-run --plan model.plan --ref ref.json \
        [--tol 1e-4 | --abs-tol 5e-2] [--precision f32|f16|auto]

For every case it runs `gerbil-run --input-ids ... --top-logits VOCAB --json --ignore-eos`, compares
the full last-position logits with `last_logits` (max |Δ| ≤ tol, scaled by the logit magnitude when
the logits are large; `--abs-tol` instead bounds it absolutely, the f16 variants' 5e-2) and the greedy
tokens with `greedy_ids` (exact). `--precision` (default f32) is passed to gerbil-run. Prints one line per case and a
`N passed, M failed` summary; exits 1 on any failure. Needs only the Python standard library.
"""
import argparse, json, subprocess, sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True, help="gerbil-run binary")
    ap.add_argument("--plan", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--tol", type=float, default=1e-4, help="max |Δlogit| per unit of max |logit| (at least 1)")
    ap.add_argument("--abs-tol", type=float, help="max |Δlogit|, not scaled (overrides --tol)")
    ap.add_argument("--precision", default="f32", help="gerbil-run --precision")
    ap.add_argument("--variant", help="gerbil-run --variant (overrides --precision)")
    a = ap.parse_args()
    ref = json.load(open(a.ref))
    passed = failed = 0
    for case in ref["cases"]:
        ids = case["input_ids"]
        want = case["last_logits"]
        n_new = len(case["greedy_ids"])
        cmd = [a.run, a.plan, "--input-ids", ",".join(map(str, ids)), "--max-new-tokens", str(n_new),
               "--temperature", "0", "--top-logits", str(len(want)), "--json", "--ignore-eos",
               *(["--variant", a.variant] if a.variant else ["--precision", a.precision])]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"FAIL {case['name']}: gerbil-run exited {out.returncode}: {out.stderr.strip()[-500:]}")
            failed += 1
            continue
        res = json.loads(out.stdout)
        got = [0.0] * len(want)
        for i, l in res["steps"][0]["top"]:
            got[i] = l
        scale = max(1.0, max(abs(x) for x in want))
        if any(g is None or g != g for g in got):
            print(f"FAIL {case['name']}: non-finite logits from gerbil-run")
            failed += 1
            continue
        diff = max(abs(g - w) for g, w in zip(got, want))
        tol = a.abs_tol if a.abs_tol is not None else a.tol * scale
        greedy_ok = res["output_ids"] == case["greedy_ids"]
        ok = diff <= tol and greedy_ok
        print(f"{'ok  ' if ok else 'FAIL'} {ref.get('model', '?')}/{case['name']} ({a.precision}): {len(ids)} prompt tokens, "
              f"max|Δlogit| {diff:.2e} (tol {tol:.2e}, max|logit| {scale:.1f}), "
              f"greedy {'identical' if greedy_ok else 'DIFFERS'} {res['output_ids']} vs {case['greedy_ids']}")
        passed += ok
        failed += not ok
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
