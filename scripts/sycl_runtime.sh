#!/usr/bin/env bash
# The SYCL runtime the SYCL tests need, from PyPI (no oneAPI installer, no root): headers, libsycl, the
# runtime kernel compiler (libsycl-jit) and Intel's OpenCL CPU device (libintelocl), pinned.
#
#   scripts/sycl_runtime.sh [PREFIX]      # default ~/.cache/ggml-bitcos/sycl-rt (a venv; ~1.7 GB)
#
# tests/test_sycl.py finds it there (or at $BITCOS_SYCL_RT) and JIT-compiles the BITCOS SYCL kernels
# (csrc/sycl/) for the OpenCL CPU device. Reruns are cheap: an existing, complete prefix is kept.
set -euo pipefail
PY=${PYTHON:-python3}
DPCPP_VERSION=2026.2.0
prefix=${1:-$HOME/.cache/ggml-bitcos/sycl-rt}
stamp="$prefix/.dpcpp-cpp-rt-$DPCPP_VERSION"
if [ -f "$stamp" ] && [ -f "$prefix/include/sycl/sycl.hpp" ] && [ -f "$prefix/lib/libintelocl.so" ]; then
    echo "sycl_runtime.sh: $prefix (dpcpp-cpp-rt $DPCPP_VERSION) already installed"
    exit 0
fi
rm -rf "$prefix"
"$PY" -m venv "$prefix"
"$prefix/bin/python" -m pip install -q "dpcpp-cpp-rt==$DPCPP_VERSION"
touch "$stamp"
echo "sycl_runtime.sh: installed dpcpp-cpp-rt $DPCPP_VERSION into $prefix"
