#!/usr/bin/env python3
"""Runs the workspace's tests one binary at a time and prints each binary's wall time.

`scripts/test.sh` calls this for its `test` check. It builds every test binary once
(`cargo test --workspace --no-run`), runs each from its package's directory as `cargo test`
would, then the doctests (`cargo test --workspace --doc`), and ends with a table: each binary,
whether it passed, its passed/failed/ignored/skipped counts and its seconds, slowest first.
Arguments after `--` go to every test binary (a name filter, `--ignored`, ...). `--check
NAME=COMMAND` (repeatable) runs COMMAND beside the tests, after their build, as a row of its own
(`scripts/test.sh` runs the API docs, the browser build check and the browser test so: they fill
the cores lavapipe leaves idle), with `GERBIL_TEST_BINARIES` set to a JSON object of the test
binaries (`{"gerbil-cli::cli": "/…/cli-…", …}`) for a check that runs one of them.

`--clippy` builds the workspace's crates through clippy-driver (as `cargo clippy` does), so the
lints of every target `cargo clippy --workspace --all-targets` checks run inside the one test
build; any warning (rustc's or clippy's) fails the table's clippy row. That spares a second,
check-only build of every dependency (about 4 of CI's 20 minutes), and the tests still run when
a lint fails.

`--quick` is the edit loop's run: it skips the real-model tests (the SmolLM2 and Gemma 3 270M
fixtures through every path, named by `QUICK_SKIP`) and the doctests, and runs an eighth of the
property cases (`PROPTEST_CASES=32` unless set); each skipped test is counted in the table.

Property tests get one `PROPTEST_RNG_SEED` per run (printed first, and again on failure; set it
to replay a run), and `PROPTEST_CASES` scales every suite's case count (the suites read it through
their configs: 256 is the default scale).

A test binary folded from several suites (the e2e and CLI binaries: one module per former
binary) runs once per top-level module, so the table still names each suite's time.

Two runs go at once (`--jobs N` changes it; `--jobs 1` echoes each run's output as it comes):
lavapipe keeps about 1.6 of the 2 CI cores busy, and the rest of a suite's time is one core
compiling, validating or starting processes, so a second run fills the gaps. Three at once made CI
63 s slower: the kernel cases, started first, stretched from 435 to 740 s and ended alone. The longest suites
start first (`LONG_FIRST`), then the other suites of the folded binaries (they hold the GPU work),
then the rest; each run's output is printed whole when it ends.
A run's seconds are its wall time on the shared machine; the table's last line is the wall time of
all of them together.

`SUITE_ENV` gives a suite environment variables of its own (the kernel cases run lavapipe without
its LLVM optimizations).

The surprise: a binary's time includes lavapipe compiling its kernels, so the table says where a
slow suite's time goes, which `cargo test`'s own output never does.
"""

import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

RESULT = re.compile(
    r"test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored; (\d+) measured; (\d+) filtered out"
)


def clippy_driver():
    """The clippy-driver of the toolchain cargo uses (`rustup which`), else the one on PATH."""
    try:
        found = subprocess.run(
            ["rustup", "which", "clippy-driver"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True,
        )
        if found.returncode == 0 and found.stdout.strip():
            return found.stdout.strip()
    except FileNotFoundError:
        pass
    return shutil.which("clippy-driver")


def build(cargo, env):
    """Builds the test binaries; returns ((name, executable, package dir) for each, lint count).

    With a clippy-driver as `env`'s `RUSTC_WORKSPACE_WRAPPER` (as `cargo clippy` sets it),
    the workspace's crates compile through it: the lints run inside the one build of
    every target `cargo clippy --all-targets` checks, instead of a second, check-only build of the
    whole dependency tree. The lint count is every warning of the build (rustc's and clippy's:
    what `-D warnings` would refuse); each is printed as cargo would print it."""
    form = "json-diagnostic-rendered-ansi" if sys.stderr.isatty() else "json"
    cmd = [cargo, "test", "--workspace", "--no-run", f"--message-format={form}"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    binaries = []
    lints = 0
    for line in proc.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-message":
            diagnostic = msg["message"]
            sys.stderr.write(diagnostic.get("rendered") or "")
            # "N warnings emitted" is a summary, not a warning of its own.
            if diagnostic["level"] == "warning" and diagnostic["spans"]:
                lints += 1
            continue
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
    if proc.returncode != 0:
        sys.exit(f"building the tests failed ({' '.join(cmd)})")
    return binaries, lints


# Name fragments of the tests `--quick` leaves out: every test of a real checkpoint (the CLI's
# generation tests run SmolLM2 through `gerbil-run`; on lavapipe a SmolLM2 token takes seconds).
QUICK_SKIP = [
    "smollm2",
    "gemma3_270m",
    "real_models",
    "chat_answers_like_transformers",
    "generation::plain_and_chat_prompts_give_the_reference_continuations",
    "ctrl_c_while_writing_removes_the_temporary_and_keeps_the_old_plan",
    "lowered_ir_through_opt_equals_the_final_ir",
]


# The suites that run longest on lavapipe (the real checkpoints; the kernel cases, each a pipeline
# lavapipe compiles when its shader cache is cold), longest first: started first, so
# that none of them is left running alone at the end.
LONG_FIRST = [
    # The browser check compiles the wasm engine and runs Chromium: CPU-heavy for minutes, so it
    # starts first, beside the kernel cases, and is done before the suites that time themselves
    # (`cli slots`: 8 clients at once against one at a time) start.
    "web",
    # SmolLM2 served in batch steps: minutes of lavapipe, the longest suite of all.
    "cli structured",
    "e2e kernels",
    "e2e real_checkpoints",
    "e2e models",
    "e2e facade",
    "cli serve",
    "cli generation",
    "e2e passes",
]


# Environment of one suite's run. The kernel cases compile hundreds of kernels and run each once
# on small inputs: there lavapipe's LLVM optimizations cost more time than they save (`nopt`: 377 s
# of one core where the default took 436); every other suite runs its kernels for many steps, and
# without them the real-model and training suites took 1.7x the CPU time.
SUITE_ENV = {"e2e kernels": {"GALLIVM_PERF": "nopt"}}


def suite_env(label, env):
    """`env` with the variables `SUITE_ENV` sets for the suite of run `label`."""
    extra = [v for suite, v in SUITE_ENV.items() if is_run_of(label, suite)]
    return dict(env, **extra[0]) if extra else env


def is_run_of(label, suite):
    """Whether run `label` ("gerbil-e2e::e2e kernels", "web") is the run of `suite` ("e2e kernels")."""
    return label == suite or label.endswith(f"::{suite}")


def order(label, folded):
    """Sort key of a run: `LONG_FIRST`'s suites in its order, then folded suites, then the rest."""
    long = [i for i, suite in enumerate(LONG_FIRST) if is_run_of(label, suite)]
    return (long[0] if long else len(LONG_FIRST), not folded)


def counts(output):
    """(passed, failed, ignored, skipped) summed over the output's `test result:` lines."""
    passed = failed = ignored = skipped = 0
    for m in RESULT.finditer(output):
        passed += int(m.group(2))
        failed += int(m.group(3))
        ignored += int(m.group(4))
        skipped += int(m.group(6))
    return passed, failed, ignored, skipped


def run(cmd, cwd, env, echo):
    """Runs `cmd`; returns (ok, output, seconds). With `echo`, its output shows as it comes."""
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in proc.stdout:
        if echo:
            sys.stdout.write(line)
        lines.append(line)
    proc.wait()
    return proc.returncode == 0, "".join(lines), time.monotonic() - start


def has_filter(args):
    """Whether test-binary `args` name a test filter: a word that is not an option and not the
    value of `--skip` (an option's value, such as `--test-threads 1`'s, counts as a filter too:
    it only keeps a folded binary in one run)."""
    after_skip = False
    for a in args:
        if after_skip:
            after_skip = False
        elif a == "--skip":
            after_skip = True
        elif not a.startswith("-"):
            return True
    return False


def suites(exe, cwd, env):
    """The top-level modules of an integration-test binary whose tests all live in two or more
    of them (the folded e2e and CLI binaries), each as (module, the filter that selects exactly
    its tests, how many tests the filter leaves out); an empty list for any other binary."""
    proc = subprocess.run(
        [exe, "--list", "--format", "terse"], cwd=cwd, env=env, stdout=subprocess.PIPE, text=True
    )
    names = [line.rsplit(": ", 1)[0] for line in proc.stdout.splitlines() if ": " in line]
    if proc.returncode != 0 or not names or any("::" not in n for n in names):
        return []
    modules = sorted({n.split("::", 1)[0] for n in names})
    picks = [(m, f"{m}::", sum(not n.startswith(f"{m}::") for n in names)) for m in modules]
    # A filter is a substring: it must not also pick a test of another module.
    exact = all(n.startswith(f) for _, f, _ in picks for n in names if f in n)
    if len(modules) > 1 and not exact:
        print(
            f"warning: a module name of {os.path.basename(exe)} is part of another's "
            f"({', '.join(modules)}): it runs whole, in one run",
            flush=True,
        )
    return picks if len(modules) > 1 and exact else []


def main():
    args = sys.argv[1:]
    extra = args[args.index("--") + 1 :] if "--" in args else []
    own = args[: args.index("--")] if "--" in args else args
    quick = "--quick" in own
    jobs = int(own[own.index("--jobs") + 1]) if "--jobs" in own else 2
    checks = [own[i + 1].split("=", 1) for i, a in enumerate(own) if a == "--check"]
    lint = "--clippy" in own
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
    clippy = clippy_driver() if lint else None
    # The doctests build the libraries again unless cargo sees the same wrapper.
    cargo_env = dict(env, RUSTC_WORKSPACE_WRAPPER=clippy, CLIPPY_ARGS="") if clippy else env
    binaries, lints = build(cargo, cargo_env)
    built = time.monotonic() - start
    # With a name filter of the caller's, each binary runs once, filtered.
    filtered = has_filter(extra)
    planned = []
    for name, exe, cwd in binaries:
        parts = [] if filtered or name.endswith("unit)") else suites(exe, cwd, env)
        runs = [
            (f"{name} {m}", [exe, f, *extra], cwd, others, True, suite_env(f"{name} {m}", env))
            for m, f, others in parts
        ]
        planned += runs or [(name, [exe, *extra], cwd, 0, False, env)]
    if not extra and not quick:
        doc = [cargo, "test", "--workspace", "--doc"]
        planned.append(("doctests (cargo test --doc)", doc, None, 0, False, cargo_env))
    # Beside the long suites, before the short ones; told where the test binaries are.
    check_env = dict(env, GERBIL_TEST_BINARIES=json.dumps({name: exe for name, exe, _ in binaries}))
    planned += [(name, shlex.split(cmd), None, 0, True, check_env) for name, cmd in checks]
    planned.sort(key=lambda r: order(r[0], r[4]))

    printing = threading.Lock()

    def one(label, cmd, cwd, others, _folded, run_env):
        if jobs == 1:
            print(f"\n=== {label}", flush=True)
        ok, output, seconds = run(cmd, cwd, run_env, echo=jobs == 1)
        if jobs > 1:
            with printing:
                print(f"\n=== {label} ({seconds:.0f}s)\n{output}", end="", flush=True)
        passed, failed, ignored, skipped = counts(output)
        # The other modules' tests are filtered out by design, not skipped.
        return (label, ok, passed, failed, ignored, skipped - others, seconds)

    tests_start = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        rows = list(pool.map(lambda r: one(*r), planned))
    wall = time.monotonic() - tests_start
    if lint:
        # The lints ran inside the build: a row of their own, its count in the fail column.
        if not clippy:
            print("clippy-driver not found: rustup component add clippy", flush=True)
        label = f"clippy (in the build, {lints} warnings)"
        rows.append((label, bool(clippy) and lints == 0, 0, lints, 0, 0, 0.0))

    print(f"\n=== test binaries (build {built:.0f}s), slowest first")
    print(f"{'binary':<52} {'status':<7} {'pass':>5} {'fail':>5} {'ign':>4} {'skip':>4} {'secs':>6}")
    for name, ok, passed, failed, ignored, skipped, seconds in sorted(rows, key=lambda r: -r[-1]):
        status = "ok" if ok else "FAILED"
        print(
            f"{name:<52} {status:<7} {passed:>5} {failed:>5} {ignored:>4} {skipped:>4} "
            f"{seconds:>6.1f}"
        )
    failed = [r[0] for r in rows if not r[1]]
    sums = [sum(r[i] for r in rows) for i in (2, 3, 4, 5)]
    print(
        f"{f'total ({jobs} at once, wall time)':<52} {'':<7} {sums[0]:>5} {sums[1]:>5} "
        f"{sums[2]:>4} {sums[3]:>4} {wall:>6.1f}"
    )
    if failed:
        print("FAILED: " + ", ".join(failed))
        print(f"proptest cases reproduce with PROPTEST_RNG_SEED={seed}")
        sys.exit(1)


if __name__ == "__main__":
    main()
