#!/usr/bin/env bash
# Installs everything ggml-bitcos needs on a fresh Debian machine with Python >= 3.10:
#   1. system packages when missing and we are root (ccache; with -DGGML_VULKAN=ON in CMAKE_ARGS also glslc,
#      libvulkan-dev, mesa-vulkan-drivers, spirv-tools/-headers, glslang-tools),
#   2. Python dependencies,
#   3. the patched llama.cpp: pinned llama-cpp-python sdist + patches/ + csrc/, built once
#      (llama_cpp Python bindings, shared libraries and llama-cli/-server/-bench/-perplexity),
#   4. this package (ggml-bitcos, with its kernel harness library).
# CMAKE_ARGS passes through to the llama.cpp build, as with llama-cpp-python:
#   CMAKE_ARGS="-DGGML_VULKAN=ON" ./scripts/install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# Debian packages, installed only when missing and we are root (otherwise: say what to install)
apt_packages=()
command -v ccache >/dev/null 2>&1 || apt_packages+=(ccache)
case " ${CMAKE_ARGS:-} " in
    *-DGGML_VULKAN=ON*|*-DGGML_VULKAN=1*)
        # Vulkan: shader compiler, headers + loader, and Mesa's drivers (lavapipe: a CPU Vulkan device for tests)
        command -v glslc >/dev/null 2>&1 || apt_packages+=(glslc)
        [ -f /usr/include/vulkan/vulkan.h ] || apt_packages+=(libvulkan-dev)
        compgen -G "/usr/share/vulkan/icd.d/lvp_icd*.json" >/dev/null || apt_packages+=(mesa-vulkan-drivers)
        command -v spirv-val >/dev/null 2>&1 || apt_packages+=(spirv-tools spirv-headers glslang-tools);;
esac
if [ ${#apt_packages[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_packages[@]}" >/dev/null) ||
            echo "install.sh: could not apt-get install ${apt_packages[*]}"
    else
        echo "install.sh: not root: install these Debian packages first if missing: ${apt_packages[*]}"
    fi
fi
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}

"$PY" -m pip install -q "gguf==0.19.0" "numpy>=1.26" "requests>=2.28" "pytest>=8" "matplotlib>=3.7" \
    "scikit-build-core>=0.10" cmake ninja typing-extensions diskcache jinja2
"$PY" scripts/build_llama.py
"$PY" -m pip install -q --no-build-isolation --no-deps .
echo "install.sh: done ($(command -v ggml-bitcos || echo 'ggml-bitcos not on PATH'))"
