#!/usr/bin/env bash
# BITCOS on a lent GPU machine (the `device` tool: an NVIDIA H200 with no package index), in two steps.
#
#   scripts/gpu_session.sh prepare     # HERE, on the CPU dev machine (~5 min cold): builds what the GPU
#                                      # machine cannot (it has no glslc, no Vulkan headers, no PyPI)
#   scripts/gpu_session.sh run         # THERE, as the device command, with carry [".gpu", ".gl"]:
#                                      #   device run: carry=[".gpu",".gl"], command="bash scripts/gpu_session.sh run"
#
# prepare: a portable (GGML_NATIVE=OFF) Vulkan build of the patched llama-cpp-python, installed into .gpu/py
#          and packed as .gpu/llama_cpp.tar.xz (the carry limit is 64 MiB; the SPIR-V packs well), the pure-
#          Python wheels the package needs that the GPU image lacks (.gpu/wheels), and the Vulkan loader
#          packages the device notes name (.gl/*.deb).
# run:     unpacks both, picks the NVIDIA Vulkan driver, then (1) test-bitcos-backend on the GPU: BITCOS vs
#          the CPU backend and bit for bit vs TQ2_0 on the same device; (2) `ggml-bitcos bench gpu`: mat-vec
#          32768x16384 and 4096x14336 at z 0.3/0.4/0.5 with the device copy bandwidth, llama-bench -ngl 99 on
#          the bitnet-2b shape, device memory of the weights; (3) the CUDA kernels (csrc/cuda/: mat-vec,
#          batched tensor-core path, MUL_MAT_ID both ways; tests/cuda/test-bitcos-cuda.cu) against numpy
#          through tests/test_cuda.py with a test program built here; (4) `ggml-bitcos bench bandwidth` on the
#          machine's 16 CPU cores: one compute core with 0/1/3/7/15 traffic generators beside it, the many-core
#          regime (a few GB/s per core) that a 2-core VM cannot reach (issue 11). Results go to $OUT (the
#          device tool returns it).
set -euo pipefail
cd "$(dirname "$0")/.."
step=${1:-}

case "$step" in
prepare)
    mkdir -p .gpu/wheels .gl
    CMAKE_ARGS="-DGGML_VULKAN=ON -DGGML_NATIVE=OFF ${CMAKE_ARGS:-}" python3 scripts/build_llama.py \
        --work-dir "$HOME/.cache/ggml-bitcos-portable" --target .gpu/py
    tar -C .gpu/py -cJf .gpu/llama_cpp.tar.xz llama_cpp
    rm -rf .gpu/py
    # the kernel harness (its traffic generator drives bench bandwidth; its CPU dispatch is run-time)
    cmake -S . -B .gpu/kernels-build -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build .gpu/kernels-build -j2 >/dev/null
    mkdir -p .gpu/kernels && cp .gpu/kernels-build/libbitcos_kernels*.so .gpu/kernels/ && rm -rf .gpu/kernels-build
    # the CUDA kernel's test program for the H200 (sm_90; the GPU machine has no nvcc) and pytest to drive it
    nvcc -std=c++17 -O2 -arch=sm_90 -Icsrc -Icsrc/cuda tests/cuda/test-bitcos-cuda.cu -o .gpu/test-bitcos-cuda
    python3 -m pip download -q --no-deps -d .gpu/wheels pytest pluggy iniconfig packaging
    python3 -m pip download -q --no-deps -d .gpu/wheels "gguf==0.19.0" tqdm
    o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    mkdir -p /tmp/amd64/partial
    apt-get $o update -qq
    (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
    du -sh .gpu .gl
    ;;
run)
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    if [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
        export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    fi
    mkdir -p .gpu/py
    tar -C .gpu/py -xJf .gpu/llama_cpp.tar.xz
    python3 -m pip install -q --no-index --no-deps --target .gpu/py .gpu/wheels/*.whl
    export PYTHONPATH="$PWD:$PWD/.gpu/py" OUT=${OUT:-/tmp/out}
    mkdir -p "$OUT"
    bin=.gpu/py/llama_cpp/bin
    "$bin/test-bitcos-backend" --list | tee "$OUT/devices.txt"
    "$bin/test-bitcos-backend" Vulkan0 > "$OUT/test-bitcos-backend.txt" 2>&1 || echo "test-bitcos-backend FAILED"
    tail -3 "$OUT/test-bitcos-backend.txt"
    python3 -m ggml_bitcos bench gpu --device Vulkan0 --workdir /tmp/bitcos-gpu --json "$OUT/bench-gpu.json" \
        | tee "$OUT/bench-gpu.md"
    # (3) the CUDA kernels against the numpy reference on the H200 (every variant, v1 and v2: the SYCL test's cases
    # and the batched path's; mat-vec, batched int8 wmma, MUL_MAT_ID; a few seconds)
    BITCOS_CUDA_TEST_EXE=$PWD/.gpu/test-bitcos-cuda python3 -m pytest -q tests/test_cuda.py -k matches \
        2>&1 | tee "$OUT/test-cuda.txt" | tail -3
    export BITCOS_KERNELS_LIB=$PWD/.gpu/kernels/libbitcos_kernels.so BITCOS_KERNELS_NOFMA_LIB=$PWD/.gpu/kernels/libbitcos_kernels_nofma.so
    ncpu=$(nproc)
    levels=none
    for n in 1 3 7 15; do [ "$n" -lt "$ncpu" ] && levels="$levels,copy*$n"; done
    python3 -m ggml_bitcos bench bandwidth --levels "$levels" --kernel-impl avx2 --workdir /tmp/bitcos-bw \
        --json "$OUT/bench-bandwidth.json" --plot "$OUT/bandwidth.png" | tee "$OUT/bench-bandwidth.md"
    ;;
*)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
