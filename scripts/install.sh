#!/usr/bin/env bash
# Installs everything ggml-bitcos needs on a fresh Debian machine with Python >= 3.10:
#   1. system packages (ccache, only when missing and we are root),
#   2. Python dependencies,
#   3. the patched llama.cpp: pinned llama-cpp-python sdist + patches/ + csrc/, built once
#      (llama_cpp Python bindings, shared libraries and llama-cli/-server/-bench/-perplexity),
#   4. this package (ggml-bitcos, with its kernel harness library).
# CMAKE_ARGS passes through to the llama.cpp build, as with llama-cpp-python:
#   CMAKE_ARGS="-DGGML_VULKAN=ON" ./scripts/install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! command -v ccache >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq ccache >/dev/null) || echo "install.sh: ccache not installed (continuing without it)"
fi
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}

"$PY" -m pip install -q "gguf==0.19.0" "numpy>=1.26" "requests>=2.28" "pytest>=8" "matplotlib>=3.7" \
    "scikit-build-core>=0.10" cmake ninja typing-extensions diskcache jinja2
"$PY" scripts/build_llama.py
"$PY" -m pip install -q --no-build-isolation --no-deps .
echo "install.sh: done ($(command -v ggml-bitcos || echo 'ggml-bitcos not on PATH'))"
