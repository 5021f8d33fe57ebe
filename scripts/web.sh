#!/usr/bin/env bash
# Builds gerbil's web page with its browser engine into a static folder anyone can host
# (default web/dist): the page (web/index.html, app.js, style.css), the engine's worker
# (web/worker.js) and the engine itself (crates/web, wasm32 with WebGPU, bound to JavaScript by
# wasm-bindgen into pkg/). `gerbil-run PLAN serve --web-dir web/dist` serves it with the plan.
#
#   scripts/web.sh [OUT_DIR]
#
# Installs what it needs when missing: the wasm32-unknown-unknown Rust target and the
# wasm-bindgen CLI of the version Cargo.lock pins (the CLI and the library must match).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-web/dist}

log() { echo "[web] $*"; }

version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print }' Cargo.lock)
if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
    log "adding the wasm32-unknown-unknown Rust target"
    rustup target add wasm32-unknown-unknown
fi
if [ "$(wasm-bindgen --version 2>/dev/null)" != "wasm-bindgen $version" ]; then
    log "installing wasm-bindgen-cli $version (a few minutes, once)"
    # Not --locked: the CLI's own lockfile pins a yanked dependency. --debug: 156 s of CPU to
    # build where a release build takes 526, and it binds the engine in 3 s instead of 0.6,
    # to the same bytes.
    cargo install --quiet --debug wasm-bindgen-cli --version "$version"
fi

log "building the engine (crates/web) for wasm32-unknown-unknown"
cargo build --quiet -p gerbil-web --profile web --target wasm32-unknown-unknown
rm -rf "$out"
mkdir -p "$out"
wasm-bindgen --target web --no-typescript --out-dir "$out/pkg" \
    target/wasm32-unknown-unknown/web/gerbil_web.wasm
cp web/index.html web/app.js web/worker.js web/style.css "$out/"
log "built $out ($(du -sh "$out" | cut -f1)): serve it with gerbil-run PLAN serve --web-dir $out, or any static server"
