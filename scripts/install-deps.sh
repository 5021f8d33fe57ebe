#!/usr/bin/env bash
# Installs what gerbil's tests need besides Rust; safe to run again (does nothing when all is there).
#  - a Vulkan driver: with no ICD registered, Mesa's (lavapipe runs the GPU tests on the CPU);
#  - numpy and gguf==0.19.0 for scripts/build-fixtures.py, and the OpenAI client (openai,
#    pydantic) that tests drive the server with (scripts/openai-parse-check.py);
#  - the wasm32-unknown-unknown Rust target, to build the engine for the browser;
#  - Chromium and chromedriver (Debian's chromium, chromium-driver), the headless browser with
#    WebGPU that the browser test drives (scripts/web-test.sh; scripts/web.sh installs the
#    wasm-bindgen CLI itself).
set -euo pipefail

log() { echo "[install-deps] $*"; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        log "need root for: $* (and sudo is not installed)"
        return 1
    fi
}

# --- Vulkan ---------------------------------------------------------------------------
shopt -s nullglob
icds=(/usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json)
shopt -u nullglob
have_loader() { ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; }
if [ ${#icds[@]} -gt 0 ] && have_loader; then
    log "Vulkan: ${#icds[@]} ICD(s) registered, loader present"
elif command -v apt-get >/dev/null; then
    log "Vulkan: no ICD or no loader; installing mesa-vulkan-drivers (lavapipe)"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        mesa-vulkan-drivers libvulkan1
else
    log "Vulkan: no ICD in /usr/share/vulkan/icd.d and no apt-get here;"
    log "install Mesa's Vulkan drivers (lavapipe) and the Vulkan loader with your package manager"
    exit 1
fi

# --- Rust target for the browser build check -------------------------------------------
# Not fatal: without the target only the `wasm` check fails, and cargo's error names the target.
if rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
    log "Rust: wasm32-unknown-unknown target installed"
elif command -v rustup >/dev/null && rustup target add wasm32-unknown-unknown; then
    log "Rust: added the wasm32-unknown-unknown target"
else
    log "Rust: could not add the wasm32-unknown-unknown target (rustup target add wasm32-unknown-unknown);"
    log "the wasm check will fail, the other checks still run"
fi

# --- A browser with WebGPU for the browser test -----------------------------------------
# Not fatal: without it only the `web` check fails, naming chromedriver.
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    log "browser: chromium and chromedriver installed"
elif command -v apt-get >/dev/null; then
    log "browser: installing chromium and chromium-driver"
    as_root apt-get update -q || true
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        chromium chromium-driver || log "could not install chromium; the web check will fail"
else
    log "browser: no chromium and no apt-get here; install Chromium and its chromedriver"
fi

# --- Python packages: the fixture builder's, and the OpenAI client the server tests drive ---
if ! command -v python3 >/dev/null; then
    log "python3 not found; install Python >= 3.10"
    exit 1
fi
if python3 - <<'PY'
import sys
from importlib.metadata import version
import numpy, gguf, openai, pydantic  # noqa: F401
sys.exit(0 if version("gguf") == "0.19.0" and version("openai") == "3.57.0" else 1)
PY
then
    log "Python: numpy, gguf 0.19.0, openai and pydantic importable"
else
    user="--user"
    if python3 -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
        user=""  # inside a virtualenv pip refuses --user
    fi
    log "Python: pip install $user numpy gguf==0.19.0 openai==3.57.0 pydantic==2.13.4"
    python3 -m pip install $user --quiet numpy gguf==0.19.0 openai==3.57.0 pydantic==2.13.4
fi
