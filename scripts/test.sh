#!/usr/bin/env bash
# gerbil's test command (what CI runs): dependencies, the SmolLM2 fixture, fmt, every test binary
# with its wall time (scripts/run-tests.py) built through clippy (any lint or rustc warning fails
# its row), and beside the tests the API docs with warnings as errors and the browser test (the
# page and its wasm engine built by scripts/web.sh, run in headless Chromium: scripts/web-test.sh).
# Every check runs even when an earlier one fails; the summary says which failed.
#
# `scripts/test.sh --quick` is the edit loop: the tests only, without the real-model ones, the
# doctests and most property cases (scripts/run-tests.py --quick), still linted (the same build);
# no fmt, docs or wasm.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
quick=0
case "${1:-}" in
--quick) quick=1 ;;
"") ;;
*)
    echo "usage: scripts/test.sh [--quick]" >&2
    exit 2
    ;;
esac

# Setup failures make the checks meaningless: stop right away.
bash scripts/install-deps.sh
python3 scripts/build-fixtures.py --out fixtures all

export GERBIL_FIXTURES="$PWD/fixtures"
export LP_NUM_THREADS=2 # lavapipe: one thread per core of the CI machine
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} # lavapipe warns when it is unset
unset RUST_TEST_THREADS
# One build from scratch: incremental caches only cost disk (17 GB) and time here.
export CARGO_INCREMENTAL=0

summary=()
failed=0
check() {
    local name=$1
    shift
    local start=$SECONDS status
    echo "=== $name: $*"
    if "$@"; then status=ok; else status=FAILED; failed=1; fi
    summary+=("$(printf '%-7s %-7s %4ds' "$name" "$status" $((SECONDS - start)))")
}

if [ "$quick" -eq 1 ]; then
    check test python3 scripts/run-tests.py --quick --clippy
    printf '%s\n' "${summary[@]}"
    exit $failed
fi

check fmt cargo fmt --all -- --check
# The tests, built through clippy-driver (the lints of `cargo clippy --workspace --all-targets`
# without a second, check-only build of every dependency; a warning fails the clippy row), and
# beside them (rows of run-tests.py's table, after the test build) the API docs,
# private items included (module docs link the helpers they explain), with every other rustdoc
# warning (a broken or ambiguous link) an error, and the browser test (which builds the runtime,
# text, facade and web crates for wasm32 with WebGPU).
check test python3 scripts/run-tests.py --clippy \
    --check "doc=env RUSTDOCFLAGS='-D warnings -A rustdoc::private_intra_doc_links' cargo doc --workspace --no-deps --document-private-items" \
    --check "web=bash scripts/web-test.sh"

echo
echo "=== summary"
printf '%s\n' "${summary[@]}"
if [ "$failed" -ne 0 ]; then
    echo "some checks FAILED"
    exit 1
fi
echo "all checks passed"
