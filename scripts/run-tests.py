#!/usr/bin/env python3
"""Runs the workspace's tests one binary at a time and prints each binary's wall time.

`scripts/test.sh` calls this for its `test` check. It builds every test binary once
(`cargo test --workspace --no-run`), runs each from its package's directory as `cargo test`
would, then the doctests (`cargo test --workspace --doc`), and ends with a table: each binary,
whether it passed, its passed/failed/ignored/skipped counts and its seconds, slowest first.
Arguments after `--` go to every test binary (a name filter, `--ignored`, ...).

`--quick` is the edit loop's run: it skips the real-model tests (the SmolLM2 and Gemma 3 270M
fixtures through every path, named by `QUICK_SKIP`) and the doctests, and runs an eighth of the
property cases (`PROPTEST_CASES=32` unless set); each skipped test is counted in the table.

Property tests get one `PROPTEST_RNG_SEED` per run (printed first, and again on failure; set it
to replay a run), and `PROPTEST_CASES` scales every suite's case count (the suites read it through
their configs: 256 is the default scale).

The surprise: a binary's time includes lavapipe compiling its kernels, so the table says where a
slow suite's time goes, which `cargo test`'s own output never does.
"""

import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

RESULT = re.compile(
    r"test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored; (\d+) measured; (\d+) filtered out"
)


def build(cargo):
    """Builds the test binaries; returns (name, executable, package dir) for each."""
    cmd = [cargo, "test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"building the tests failed ({' '.join(cmd)})")
    binaries = []
    for line in proc.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        package = msg["package_id"]
        # "path+file:///…/crates/plan#gerbil-plan@0.1.0" or "…#0.1.0" (name = dir name)
        pkg_name = re.sub(r"@.*$", "", package.split("#")[-1])
        if re.fullmatch(r"[0-9.]+", pkg_name):
            pkg_name = package.split("#")[0].rstrip("/").split("/")[-1]
        kind = "unit" if target["kind"] != ["test"] else target["name"]
        name = f"{pkg_name}::{kind}" if kind != "unit" else f"{pkg_name} ({target['name']}, unit)"
        binaries.append((name, msg["executable"], os.path.dirname(msg["manifest_path"])))
    return binaries


# Name fragments of the tests `--quick` leaves out: every test of a real checkpoint (the CLI's
# generation tests run SmolLM2 through `gerbil-run`; on lavapipe a SmolLM2 token takes seconds).
QUICK_SKIP = [
    "smollm2",
    "gemma3_270m",
    "real_models",
    "chat_answers_like_transformers",
    "generation::plain_and_chat_prompts_give_the_reference_continuations",
    "generation::chat_over_a_pipe_keeps_history_and_reuses_the_cache",
    "generation::flags_that_would_do_nothing_are_errors",
    "generation::a_stop_string_cuts_the_text",
    "generation::the_prompt_from_standard_input",
    "generation::a_closed_pipe_stops_generation_quietly",
    "ctrl_c_while_writing_removes_the_temporary_and_keeps_the_old_plan",
    "lowered_ir_through_opt_equals_the_final_ir",
]


def counts(output):
    """(passed, failed, ignored, skipped) summed over the output's `test result:` lines."""
    passed = failed = ignored = skipped = 0
    for m in RESULT.finditer(output):
        passed += int(m.group(2))
        failed += int(m.group(3))
        ignored += int(m.group(4))
        skipped += int(m.group(6))
    return passed, failed, ignored, skipped


def run(cmd, cwd, env):
    """Runs `cmd`, echoing its output; returns (ok, output, seconds)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line)
    proc.wait()
    return proc.returncode == 0, "".join(lines), time.monotonic() - start


def main():
    args = sys.argv[1:]
    extra = args[args.index("--") + 1 :] if "--" in args else []
    own = args[: args.index("--")] if "--" in args else args
    quick = "--quick" in own
    cargo = os.environ.get("CARGO") or shutil.which("cargo")
    # One proptest seed per run, printed, so that a failure reproduces with it.
    seed = os.environ.get("PROPTEST_RNG_SEED") or str(random.getrandbits(63))
    env = dict(os.environ, CARGO=cargo, PROPTEST_RNG_SEED=seed)
    if quick:
        env.setdefault("PROPTEST_CASES", "32")
        for fragment in QUICK_SKIP:
            extra += ["--skip", fragment]
    print(f"proptest seed: PROPTEST_RNG_SEED={seed}", flush=True)
    start = time.monotonic()
    binaries = build(cargo)
    built = time.monotonic() - start
    rows = []
    for name, exe, cwd in binaries:
        print(f"\n=== {name}", flush=True)
        ok, output, seconds = run([exe, *extra], cwd, env)
        rows.append((name, ok, *counts(output), seconds))
    if not extra and not quick:
        print("\n=== doctests", flush=True)
        ok, output, seconds = run([cargo, "test", "--workspace", "--doc"], None, env)
        rows.append(("doctests (cargo test --doc)", ok, *counts(output), seconds))

    print(f"\n=== test binaries (build {built:.0f}s), slowest first")
    print(f"{'binary':<52} {'status':<7} {'pass':>5} {'fail':>5} {'ign':>4} {'skip':>4} {'secs':>6}")
    for name, ok, passed, failed, ignored, skipped, seconds in sorted(rows, key=lambda r: -r[-1]):
        status = "ok" if ok else "FAILED"
        print(
            f"{name:<52} {status:<7} {passed:>5} {failed:>5} {ignored:>4} {skipped:>4} "
            f"{seconds:>6.1f}"
        )
    total = sum(r[-1] for r in rows)
    failed = [r[0] for r in rows if not r[1]]
    sums = [sum(r[i] for r in rows) for i in (2, 3, 4, 5)]
    print(
        f"{'total':<52} {'':<7} {sums[0]:>5} {sums[1]:>5} {sums[2]:>4} {sums[3]:>4} "
        f"{total:>6.1f}"
    )
    if failed:
        print("FAILED: " + ", ".join(failed))
        print(f"proptest cases reproduce with PROPTEST_RNG_SEED={seed}")
        sys.exit(1)


if __name__ == "__main__":
    main()
