#!/usr/bin/env bash
# The SYCL runtime the SYCL tests need, from PyPI (no oneAPI installer, no root): headers, libsycl, the
# runtime kernel compiler (libsycl-jit) and Intel's OpenCL CPU device (libintelocl), plus the oneMKL headers
# ggml-sycl includes (for the syntax gate of the patched ggml-sycl sources), pinned.
#
#   scripts/sycl_runtime.sh [PREFIX]      # default ~/.cache/ggml-bitcos/sycl-rt (a venv; ~1.7 GB)
#
# tests/test_sycl.py finds it there (or at $BITCOS_SYCL_RT) and JIT-compiles the BITCOS SYCL kernels
# (csrc/sycl/) for the OpenCL CPU device. Reruns are cheap: an existing, complete prefix is kept.
set -euo pipefail
PY=${PYTHON:-python3}
# clang++-22 (Debian) for the syntax gate of the patched ggml-sycl sources; installed when missing and root
if ! command -v clang++-22 >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-22 >/dev/null) ||
            echo "sycl_runtime.sh: could not apt-get install clang-22"
    else
        echo "sycl_runtime.sh: not root: install clang-22 (Debian) for the ggml-sycl syntax gate"
    fi
fi
DPCPP_VERSION=2026.2.0
prefix=${1:-$HOME/.cache/ggml-bitcos/sycl-rt}
stamp="$prefix/.dpcpp-cpp-rt-$DPCPP_VERSION-mkl"
if [ -f "$stamp" ] && [ -f "$prefix/include/sycl/sycl.hpp" ] && [ -f "$prefix/lib/libintelocl.so" ] &&
   [ -f "$prefix/include/oneapi/mkl.hpp" ]; then
    echo "sycl_runtime.sh: $prefix (dpcpp-cpp-rt $DPCPP_VERSION) already installed"
    exit 0
fi
rm -rf "$prefix"
"$PY" -m venv "$prefix"
"$prefix/bin/python" -m pip install -q "dpcpp-cpp-rt==$DPCPP_VERSION"
# headers only (no libraries): ggml-sycl's dpct helpers include oneapi/mkl.hpp, which includes mkl.h
"$prefix/bin/python" -m pip install -q --no-deps "onemkl-sycl-include==$DPCPP_VERSION" "mkl-include==$DPCPP_VERSION"
touch "$stamp"
echo "sycl_runtime.sh: installed dpcpp-cpp-rt $DPCPP_VERSION into $prefix"
