#!/usr/bin/env bash
# Installs everything ggml-bitcos needs on a fresh Debian machine with Python >= 3.10:
#   1. system packages when missing and we are root (ccache; gcc-aarch64-linux-gnu, g++-aarch64-linux-gnu and
#      qemu-user for the aarch64 kernel tests and the aarch64 llama.cpp build; llvm-19 and clang-19 for
#      the static model `python3 -m dev.mca`; with -DGGML_VULKAN=ON in
#      CMAKE_ARGS also glslc, libvulkan-dev, mesa-vulkan-drivers, spirv-tools/-headers, glslang-tools),
#   2. the tools the test suite uses (pytest, matplotlib, cmake, ninja, the pinned ruff and clang-format, ...),
#   3. `pip install .`: this package, whose build (buildsys/ggml_bitcos_backend.py) builds the patched llama.cpp
#      once (pinned llama-cpp-python sdist + patches/ + csrc/, incremental in ~/.cache/ggml-bitcos, ccache) and
#      ships its llama_cpp package (bindings, libraries, llama-cli/-server/-bench/-perplexity, rpc-server) in the
#      same wheel.
# CMAKE_ARGS passes through to the llama.cpp build, as with llama-cpp-python:
#   CMAKE_ARGS="-DGGML_VULKAN=ON" ./scripts/install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# Debian packages, installed only when missing and we are root (otherwise: say what to install)
apt_packages=()
command -v ccache >/dev/null 2>&1 || apt_packages+=(ccache)
# the aarch64 cross toolchain and user-mode emulator: the tests run the kernels and the llama.cpp tools of an
# aarch64 build (build-llama --host aarch64-linux-gnu) under qemu
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || apt_packages+=(gcc-aarch64-linux-gnu)
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || apt_packages+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null 2>&1 || apt_packages+=(qemu-user)
# llvm-mca and the compiler whose hot loops it models (`python3 -m dev.mca`, tests/test_bench_mca.py)
command -v llvm-mca-19 >/dev/null 2>&1 || apt_packages+=(llvm-19)
command -v clang-19 >/dev/null 2>&1 || apt_packages+=(clang-19)
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

# the linters at the versions pyproject.toml pins (its `lint` extra: tests/test_lint.py checks the tree with them)
lint_tools=$("$PY" -c 'import re; m = re.search(r"^lint = \[(.*)\]", open("pyproject.toml").read(), re.M); print(" ".join(re.findall(r"\"([^\"]+)\"", m.group(1))))')
# shellcheck disable=SC2086 # one word per pinned requirement
"$PY" -m pip install -q "pytest>=8" "matplotlib>=3.7" "scikit-build-core>=0.10" cmake ninja $lint_tools
# A llama-cpp-python distribution installed on its own (the stock one, or the patched one that older ggml-bitcos
# installs built separately) owns the same llama_cpp files as this package's wheel: remove it first.
if "$PY" -m pip show -q llama-cpp-python >/dev/null 2>&1; then
    "$PY" -m pip uninstall -y -q llama-cpp-python
fi
echo "install.sh: pip install . (builds the patched llama.cpp: ~11 min cold on 2 cores, about a minute warm;" \
     "log: ${GGML_BITCOS_CACHE:-$HOME/.cache/ggml-bitcos}/build-llama.log)"
"$PY" -m pip install -q .
echo "install.sh: done ($("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/ggml-bitcos)"
