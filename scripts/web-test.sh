#!/usr/bin/env bash
# The browser test (a row of scripts/test.sh, beside the other tests): builds the page with its
# engine (scripts/web.sh) and runs the CLI tests' `web::` browser test, which serves a plan with
# `gerbil-run serve --web-dir` and drives headless Chromium (WebGPU on SwiftShader) through
# chromedriver. It runs the `cli` test binary scripts/run-tests.py built (GERBIL_TEST_BINARIES),
# else builds it with `cargo test --no-run`. GERBIL_WEB_SCREENSHOTS=DIR keeps the page's
# screenshots. Before it, the runtime's tiny-model checks run in the same browser through
# wasm-bindgen-test (crates/web/tests/browser.rs, which embeds the tiny plans compiled here with
# target/debug/gerbilc: the one the test build made, else one built here; a gerbilc older than the
# sources it would rebuild from compiles the plans of its own day).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dist=target/web-dist
bash scripts/web.sh "$dist"

plans=$PWD/target/web-test-plans
gerbilc=target/debug/gerbilc
[ -x "$gerbilc" ] || cargo build --quiet -p gerbil-cli --bin gerbilc
rm -rf "$plans"
mkdir -p "$plans"
for model in tests/data/models/tiny/*/; do
    "$gerbilc" compile "$model" -o "$plans/$(basename "$model").plan" --quiet > /dev/null
done
# The test harness reads crates/web/webdriver.json (headless Chromium with WebGPU) and finds
# chromedriver through CHROMEDRIVER; the web profile shares the engine's dependencies built above.
GERBIL_WEB_TEST_PLANS=$plans CHROMEDRIVER=$(command -v chromedriver) WASM_BINDGEN_TEST_TIMEOUT=900 \
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
    cargo test -p gerbil-web --profile web --target wasm32-unknown-unknown --test browser
exe=$(python3 -c 'import json, os; print(json.loads(os.environ.get("GERBIL_TEST_BINARIES", "{}")).get("gerbil-cli::cli", ""))')
if [ -z "$exe" ]; then
    exe=$(cargo test -p gerbil-cli --test cli --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cli":
        print(m["executable"])')
fi
cd crates/cli
GERBIL_WEB_DIST="$PWD/../../$dist" "$exe" --ignored --exact \
    web::the_page_runs_the_plan_in_the_browser_and_answers_as_the_server_does \
    web::smollm2_in_the_page_gives_the_native_tokens_and_the_reference_answer
