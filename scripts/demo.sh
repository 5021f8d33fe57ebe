#!/usr/bin/env bash
# Compiles SmolLM2-135M-Instruct to a plan and chats with it:  bash scripts/demo.sh ["your question"]
set -euo pipefail
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} # lavapipe warns when it is unset
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-deps.sh
python3 scripts/build-fixtures.py --out fixtures smollm2-135m
cargo build --release -p gerbil-cli
bin="${CARGO_TARGET_DIR:-target}/release"
"$bin/gerbilc" compile fixtures/smollm2-135m -o fixtures/smollm2.plan
"$bin/gerbil-run" fixtures/smollm2.plan --chat --prompt "${1:-What is the capital of France?}" --max-new-tokens 64
