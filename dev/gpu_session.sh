#!/usr/bin/env bash
# BITCOS on a lent GPU machine (the `device` tool: one NVIDIA H200, 16 cores, nvcc 13.0 and PyTorch's pip
# cuBLAS, no package index), in two steps.
#
#   dev/gpu_session.sh prepare     # HERE, on the CPU dev machine: builds what the GPU machine cannot or
#                                      # should not spend its minutes on (~10 min Vulkan + ~27 min CUDA cold on 2
#                                      # cores; incremental afterwards)
#   dev/gpu_session.sh run [PART...]   # THERE, as the device command, with carry [".gpu", ".gl"]:
#       device run: carry=[".gpu",".gl"], timeout_s=590, command="bash dev/gpu_session.sh run"
#
# prepare: (a) a portable (GGML_NATIVE=OFF) Vulkan build of the patched llama-cpp-python (.gpu/llama_cpp_vulkan.tar.xz);
#          (b) a portable ggml-cuda build of it for the H200 only (sm_90, flash-attention kernels off, cuBLAS from
#          NVIDIA's pip wheel: scripts/cuda_toolkit_root.sh) (.gpu/llama_cpp_cuda.tar.xz), and the patched source
#          tree, trimmed (.gpu/llama-src.tar.xz), from which `run` rebuilds the CUDA package there when the
#          carried one does not start on the machine's image; (c) the kernel harness, the standalone CUDA kernel
#          test program (sm_90), the pure-Python wheels the package needs that the GPU image lacks, and the
#          Vulkan loader packages the device notes name (.gl/*.deb). All of it must stay under the tool's 64 MiB
#          carry limit (prepare prints the total).
# run:     the PARTs in the order given (default: cuda kernels vulkan cuda-bench vulkan-bench bandwidth, so that
#          every correctness check on every backend runs before any benchmark), each step under its own time limit
#          and inside the session's budget ($GPU_SESSION_SECONDS, default 540 s of the 10-minute command limit), a
#          failed or timed-out step recorded and the next one run:
#   cuda         (1) test-bitcos-backend CUDA0: BITCOS MUL_MAT / MUL_MAT_ID in ggml-cuda against the CPU backend;
#                (2) tests/test_cuda_backend.py: greedy tokens and logits of the tiny models, all layers on the GPU
#                vs the CPU, and the device memory of their weights;
#   kernels      the standalone CUDA kernel test (csrc/cuda/ against numpy: tests/test_cuda.py -k matches);
#   vulkan       where the machine has a Vulkan GPU device (test-bitcos-backend --list; the first one that is not
#                lavapipe, except in a dry run), test-bitcos-backend on it (BITCOS vs the CPU) under each BITCOS
#                mat-vec form: the default (the fast shader, with q8_1 activations where the device accelerates
#                int8 dot products), the fast shader's f32 form (GGML_BITCOS_VULKAN_INT8=0) and the exact shader
#                (GGML_BITCOS_VULKAN_EXACT=1, TQ2_0's arithmetic: also bit for bit vs TQ2_0); then
#                tests/test_vulkan_tq2_0.py on it (the TQ2_0 path for backends without BITCOS kernels);
#   cuda-bench   `ggml-bitcos bench gpu --device CUDA0 --refs q4_0,q8_0 --e2e-types bitcos`: mat-vec 32768x16384
#                and 4096x14336 at z 0.3/0.4/0.5 next to Q4_0 and Q8_0 and the device copy, llama-bench -ngl 99 on
#                the bitnet-2b shape, device model buffer vs TQ2_0's file bytes;
#   vulkan-bench `bench gpu --device VulkanN --no-e2e` under each form (mat-vec BITCOS vs TQ2_0, the TQ2_0
#                reference timed in each run), then `bench gpu` with llama-bench -ngl 99 under the default form
#                (reuses cuda-bench's weights and models), and again with GGML_BITCOS_VULKAN_REFUSE=1 (the BITCOS
#                model then runs as TQ2_0 on the device: the transcoded path beside the BITCOS kernels);
#   bandwidth    `ggml-bitcos bench bandwidth` on the 16 CPU cores (the many-core regime: little DRAM bandwidth
#                per core).
#          $GPU_SESSION_BENCH_ARGS replaces the benches' default `--rounds 2` (interleaved rounds, the ratio's
#          spread over them); $GPU_SESSION_VULKAN_BENCH_ARGS adds options to the Vulkan benches (a dry run on
#          lavapipe: small shapes).
# Results: $OUT/summary.md (one line per step: exit status, seconds, the end of its output) and
# $OUT/gpu-session-logs.tar.gz (every step's whole output and JSON), both rewritten after each step, so what
# has run comes back even when the command is killed; the markdown tables also go to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
step=${1:-}
[ $# -gt 0 ] && shift

# the CUDA build: H200 only (sm_90), no flash-attention kernels (they are most of ggml-cuda's compile time and
# BITCOS does not touch them), no VMM pool (it links libcuda.so, which a machine without the driver lacks; the
# legacy pool allocates with cudaMalloc), no NCCL (one GPU). Each build adds the toolkit root of
# cuda_toolkit_root.sh and -Wl,-rpath-link to its lib/: executables linking libggml-cuda.so must resolve its
# libcublas.so.13 there, and a toolkit assembled from pip wheels is not on the linker's search path (a system
# CUDA install is, through ld.so.conf)
CUDA_CMAKE_ARGS="-DGGML_CUDA=ON -DGGML_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_CUDA_FA=OFF \
-DGGML_CUDA_NO_VMM=ON -DGGML_CUDA_NCCL=OFF"
SRC_TOPDIR=llama_cpp_python-0.3.36
# what the tools and tests of the session need from the CUDA build (the device rebuild builds only these)
CUDA_TARGETS="llama test-bitcos-backend llama-bitcos-bench llama-bench llama-completion"

# relink_libs PKGDIR: a wheel cannot hold symbolic links, so an installed llama_cpp/lib holds libX.so and
# libX.so.N as byte copies of libX.so.N.M.P (libggml-cuda: 3 x 33 MB); make them links again before packing
relink_libs() {
    local f base alias
    for f in "$1"/llama_cpp/lib/lib*.so.*.*; do
        base=${f##*/}
        for alias in "${f%%.so.*}.so" "${f%.*.*}"; do
            if [ "$alias" != "$f" ] && [ -f "$alias" ] && [ ! -L "$alias" ] && cmp -s "$alias" "$f"; then
                ln -sf "$base" "$alias"
            fi
        done
    done
}

case "$step" in
prepare)
    # from scratch (the builds themselves are cached elsewhere): a package, wheel or .deb left by an earlier
    # prepare would travel too, eating the 64 MiB, and two versions of one wheel stop the install there
    rm -rf .gpu .gl
    mkdir -p .gpu/wheels .gl
    # (a) Vulkan
    CMAKE_ARGS="-DGGML_VULKAN=ON -DGGML_NATIVE=OFF ${CMAKE_ARGS:-}" python3 scripts/build_llama.py \
        --work-dir "$HOME/.cache/ggml-bitcos-portable" --target .gpu/vulkan-py
    relink_libs .gpu/vulkan-py
    tar -C .gpu/vulkan-py -cJf .gpu/llama_cpp_vulkan.tar.xz llama_cpp
    rm -rf .gpu/vulkan-py
    # (b) CUDA: a toolkit root with cuBLAS (pip wheel), the package built against it, the source for a rebuild
    # there. The root's path is part of the build's CMake arguments: keep it ($CUDA_TOOLKIT_ROOT_DIR) from one
    # prepare to the next, or the CMake cache starts afresh and ninja recompiles everything.
    root=$(scripts/cuda_toolkit_root.sh "${CUDA_TOOLKIT_ROOT_DIR:-$HOME/.cache/ggml-bitcos-cuda-toolkit}")
    launcher=""
    command -v ccache >/dev/null && launcher="-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
    CMAKE_ARGS="$CUDA_CMAKE_ARGS -DCUDAToolkit_ROOT=$root -DCMAKE_CUDA_COMPILER=$root/bin/nvcc $launcher \
-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$root/lib" \
        python3 scripts/build_llama.py --work-dir "$HOME/.cache/ggml-bitcos-cuda" --target .gpu/cuda-py -j 2
    # libggml-cuda.so loads libcudart.so.13 through its RUNPATH ($ORIGIN): the toolkit's runtime travels with it
    # (0.7 MB; the driver there runs any CUDA 13.0 runtime). cuBLAS (0.6 GB) does not: `run` finds the image's.
    cp -L "$root"/lib/libcudart.so.13 .gpu/cuda-py/llama_cpp/lib/
    relink_libs .gpu/cuda-py
    tar -C .gpu/cuda-py -cJf .gpu/llama_cpp_cuda.tar.xz llama_cpp
    rm -rf .gpu/cuda-py
    # the patched tree without what no build reads (docs, models, web UI, benchmark logs, git packs, media)
    tar -C "$HOME/.cache/ggml-bitcos-cuda/src" -cJf .gpu/llama-src.tar.xz --exclude=.git --exclude='*.mp4' \
        --exclude='*.webp' --exclude='*.png' --exclude="$SRC_TOPDIR/llama_cpp/lib" \
        --exclude="$SRC_TOPDIR/vendor/llama.cpp/"{docs,models,media,benches,gguf-py} "$SRC_TOPDIR"
    # (c) the kernel harness (its traffic generator drives bench bandwidth; its CPU dispatch is run-time)
    cmake -S . -B .gpu/kernels-build -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build .gpu/kernels-build -j2 >/dev/null
    mkdir -p .gpu/kernels && cp .gpu/kernels-build/libbitcos_kernels*.so .gpu/kernels/ && rm -rf .gpu/kernels-build
    # the CUDA kernels' standalone test program for the H200 (sm_90), driven there by tests/test_cuda.py
    nvcc -std=c++17 -O2 -arch=sm_90 -Icsrc -Icsrc/cuda tests/cuda/test-bitcos-cuda.cu -o .gpu/test-bitcos-cuda
    # the vocab-only GGUFs of the pinned sdist (make-model's tokenizers): the GPU machine cannot fetch the sdist
    mkdir -p .gpu/cache
    python3 -c 'from ggml_bitcos.upstream import vocab_gguf; import shutil, sys; [shutil.copy(vocab_gguf(v), sys.argv[1]) for v in ("llama-spm", "llama-bpe")]' .gpu/cache
    python3 -m pip download -q --no-deps -d .gpu/wheels pytest pluggy iniconfig packaging
    # llama_cpp imports diskcache (the GPU image has numpy, jinja2 and typing-extensions)
    python3 -m pip download -q --no-deps -d .gpu/wheels "gguf==0.19.0" tqdm diskcache
    o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    mkdir -p /tmp/amd64/partial
    apt-get $o update -qq
    (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
    du -sh .gpu/* .gl
    total=$(du -scm .gpu .gl | tail -1 | cut -f1)
    echo "carried: ${total} MiB (.gpu, .gl) + the tracked tree ($(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes), of the device tool's 64 MiB"
    ;;
run)
    # correctness on every backend first, then the benches: a session cut short still says whether the kernels
    # give the right numbers on the GPU
    parts=${*:-cuda kernels vulkan cuda-bench vulkan-bench bandwidth}
    export OUT=${OUT:-/tmp/out} PYTHONUNBUFFERED=1
    mkdir -p "$OUT"
    logs=/tmp/gpu-session-logs
    # the packages unpacked and the wheels installed: outside the checkout, so nothing of a run is carried next time
    pkgs=/tmp/gpu-session
    rm -rf "$logs" "$pkgs" && mkdir -p "$logs" "$pkgs"
    t0=$(date +%s)
    last_rc=0
    budget=${GPU_SESSION_SECONDS:-540}
    summary=$OUT/summary.md
    echo "# GPU session $(date -u +%FT%TZ), parts: $parts, budget ${budget} s" > "$summary"

    # pack_logs: what has run so far, in the two files that come back ($OUT holds at most 8)
    pack_logs() { tar -C "$logs" -czf "$OUT/gpu-session-logs.tar.gz" . || true; }
    # step NAME LIMIT_S COMMAND...: COMMAND (a function of this script, run in a child bash) under a time limit
    # no longer than the session has left, its output in $logs/NAME.txt; failure recorded, never fatal
    step() {
        local name=$1 limit=$2 left rc s
        shift 2
        left=$(( budget - ($(date +%s) - t0) ))
        if [ "$left" -lt 15 ]; then
            echo "- $name: NOT RUN (session budget spent)" | tee -a "$summary"
            return 0
        fi
        if [ "$limit" -gt "$left" ]; then limit=$left; fi
        echo "== $name (limit ${limit} s)"
        s=$(date +%s)
        set +e
        timeout -k 10 "$limit" bash -c "set -o pipefail; $*" > "$logs/$name.txt" 2>&1
        rc=$?
        set -e
        last_rc=$rc
        local verdict
        case "$rc" in
        0) verdict=ok ;;
        124|137) verdict="TIMED OUT after ${limit} s" ;;
        *) verdict="FAILED rc=$rc" ;;
        esac
        { echo "- $name: $verdict, $(( $(date +%s) - s )) s"; echo '```'; tail -n 25 "$logs/$name.txt"; echo '```'; } \
            >> "$summary"
        echo "-- $name: $verdict"; tail -n 40 "$logs/$name.txt"
        pack_logs
    }

    # setup (in this shell: the environment carries into the steps). GPU_SESSION_DRY_RUN=1 (a rehearsal on a
    # machine without the GPU) leaves the system alone: the loader packages are unpacked into / on the lent
    # machine only.
    if [ "${GPU_SESSION_DRY_RUN:-0}" != 1 ]; then
        for f in .gl/*.deb; do dpkg -x "$f" /; done
        ldconfig
    fi
    if [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
        export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    fi
    python3 -m pip install -q --no-index --no-deps --target "$pkgs/pydeps" .gpu/wheels/*.whl
    nvidia-smi > "$logs/nvidia-smi.txt" 2>&1 || true
    export BITCOS_KERNELS_LIB=$PWD/.gpu/kernels/libbitcos_kernels.so BITCOS_KERNELS_NOFMA_LIB=$PWD/.gpu/kernels/libbitcos_kernels_nofma.so
    pydeps=$pkgs/pydeps
    # make-model's vocab GGUFs come from the carried cache, copied so the run's own files stay outside the checkout
    mkdir -p /tmp/gpu-session-cache && cp .gpu/cache/*.gguf /tmp/gpu-session-cache/
    export GGML_BITCOS_CACHE=/tmp/gpu-session-cache

    # the tools each step runs (each in a child bash, PYTHONPATH naming the llama_cpp package of its backend)
    cuda_env() { export PYTHONPATH="$PWD:$pkgs/cuda-py:$pydeps"; }
    vulkan_env() { export PYTHONPATH="$PWD:$pkgs/vulkan-py:$pydeps"; }
    cuda_rebuild() {
        # the carried CUDA package does not start here: build it from the carried source with this machine's
        # nvcc and cuBLAS (PyTorch's nvidia-cublas), only the targets the session runs, on every core
        local root
        root=$(scripts/cuda_toolkit_root.sh /tmp/cuda-toolkit)
        rm -rf /tmp/llama-src /tmp/cuda-build && mkdir -p /tmp/llama-src
        tar -C /tmp/llama-src -xJf .gpu/llama-src.tar.xz
        cmake -S "/tmp/llama-src/$SRC_TOPDIR" -B /tmp/cuda-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
            -DLLAMA_CURL=OFF -DGGML_RPC=ON $CUDA_CMAKE_ARGS -DCUDAToolkit_ROOT="$root" \
            -DCMAKE_CUDA_COMPILER="$root/bin/nvcc" -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$root/lib"
        time cmake --build /tmp/cuda-build -j "$(nproc)" --target $CUDA_TARGETS
        # over the carried package: its Python bindings stay, the libraries and programs are this build's
        find /tmp/cuda-build -name 'lib*.so*' \( -type f -o -type l \) -exec cp -P {} $pkgs/cuda-py/llama_cpp/lib/ \;
        for t in $CUDA_TARGETS; do
            exe=$(find /tmp/cuda-build -type f -name "$t" -perm -u+x | head -1)
            [ -n "$exe" ] && cp "$exe" $pkgs/cuda-py/llama_cpp/bin/
        done
        ls -la $pkgs/cuda-py/llama_cpp/lib $pkgs/cuda-py/llama_cpp/bin
    }
    cuda_devices() { $pkgs/cuda-py/llama_cpp/bin/test-bitcos-backend --list; }
    cuda_op() { $pkgs/cuda-py/llama_cpp/bin/test-bitcos-backend CUDA0; }
    cuda_e2e() { cuda_env; BITCOS_REQUIRE_CUDA=1 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda_backend.py; }
    cuda_bench() {
        cuda_env
        python3 -m ggml_bitcos bench gpu --device CUDA0 --refs q4_0,q8_0 --e2e-types bitcos --workdir /tmp/bitcos-gpu \
            --json "$logs/bench-gpu-cuda.json" ${GPU_SESSION_BENCH_ARGS:---rounds 2}
    }
    kernels() {
        BITCOS_CUDA_TEST_EXE=$PWD/.gpu/test-bitcos-cuda PYTHONPATH="$PWD:$pydeps" \
            python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k matches
    }
    vulkan_devices() { $pkgs/vulkan-py/llama_cpp/bin/test-bitcos-backend --list; }
    # the BITCOS mat-vec form is chosen when ggml-vulkan creates the device: GGML_BITCOS_VULKAN_EXACT=1 in the
    # environment of the whole process selects the exact shader, GGML_BITCOS_VULKAN_INT8=0 the fast one's f32 form
    vulkan_op() { $pkgs/vulkan-py/llama_cpp/bin/test-bitcos-backend "$vk_dev"; }
    vulkan_op_f32() { GGML_BITCOS_VULKAN_INT8=0 $pkgs/vulkan-py/llama_cpp/bin/test-bitcos-backend "$vk_dev"; }
    vulkan_op_exact() { GGML_BITCOS_VULKAN_EXACT=1 $pkgs/vulkan-py/llama_cpp/bin/test-bitcos-backend "$vk_dev"; }
    # the mat-vec under each shader first (each run times TQ2_0 too), then llama-bench with the default one (its
    # bench gpu run times the mat-vec once more); the weights and models are made once in /tmp/bitcos-gpu
    vulkan_matvec() {
        vulkan_env
        python3 -m ggml_bitcos bench gpu --device "$vk_dev" --workdir /tmp/bitcos-gpu \
            --no-e2e --json "$logs/bench-gpu-vulkan-fast.json" ${GPU_SESSION_BENCH_ARGS:---rounds 2} ${GPU_SESSION_VULKAN_BENCH_ARGS:-}
    }
    vulkan_matvec_f32() {
        vulkan_env
        GGML_BITCOS_VULKAN_INT8=0 python3 -m ggml_bitcos bench gpu --device "$vk_dev" --workdir /tmp/bitcos-gpu \
            --no-e2e --json "$logs/bench-gpu-vulkan-f32.json" ${GPU_SESSION_BENCH_ARGS:---rounds 2} ${GPU_SESSION_VULKAN_BENCH_ARGS:-}
    }
    vulkan_matvec_exact() {
        vulkan_env
        GGML_BITCOS_VULKAN_EXACT=1 python3 -m ggml_bitcos bench gpu --device "$vk_dev" --workdir /tmp/bitcos-gpu \
            --no-e2e --json "$logs/bench-gpu-vulkan-exact.json" ${GPU_SESSION_BENCH_ARGS:---rounds 2} ${GPU_SESSION_VULKAN_BENCH_ARGS:-}
    }
    vulkan_e2e() {
        vulkan_env
        python3 -m ggml_bitcos bench gpu --device "$vk_dev" --workdir /tmp/bitcos-gpu \
            --json "$logs/bench-gpu-vulkan-e2e.json" ${GPU_SESSION_BENCH_ARGS:---rounds 2} ${GPU_SESSION_VULKAN_BENCH_ARGS:-}
    }
    # the loader's TQ2_0 path for backends without BITCOS kernels (Metal), with Vulkan made one by its test hook:
    # correctness on the device (BITCOS offloaded = its TQ2_0 source bit for bit), then llama-bench -ngl 99
    vulkan_tq2_0() {
        vulkan_env
        GGML_VK_VISIBLE_DEVICES=${vk_dev#Vulkan} BITCOS_REQUIRE_VULKAN=1 \
            python3 -m pytest -q -rA -p no:cacheprovider tests/test_vulkan_tq2_0.py
    }
    vulkan_e2e_tq2_0() {
        vulkan_env
        GGML_BITCOS_VULKAN_REFUSE=1 python3 -m ggml_bitcos bench gpu --device "$vk_dev" --workdir /tmp/bitcos-gpu \
            --json "$logs/bench-gpu-vulkan-e2e-tq2_0.json" ${GPU_SESSION_BENCH_ARGS:---rounds 2} \
            ${GPU_SESSION_VULKAN_BENCH_ARGS:-}
    }
    bandwidth() {
        export PYTHONPATH="$PWD:$pkgs/vulkan-py:$pydeps"
        local levels=none n
        for n in 1 3 7 15; do [ "$n" -lt "$(nproc)" ] && levels="$levels,copy*$n"; done
        python3 -m ggml_bitcos bench bandwidth --levels "$levels" --kernel-impl avx2 --workdir /tmp/bitcos-bw \
            --json "$logs/bench-bandwidth.json" --plot "$logs/bandwidth.png"
    }
    export -f cuda_env vulkan_env cuda_rebuild cuda_devices cuda_op cuda_e2e cuda_bench kernels vulkan_devices \
        vulkan_op vulkan_op_f32 vulkan_op_exact vulkan_matvec vulkan_matvec_f32 vulkan_matvec_exact vulkan_e2e bandwidth \
        vulkan_tq2_0 vulkan_e2e_tq2_0
    export pkgs pydeps logs SRC_TOPDIR CUDA_CMAKE_ARGS CUDA_TARGETS

    for part in $parts; do
        case "$part" in
        cuda)
            mkdir -p $pkgs/cuda-py && tar -C $pkgs/cuda-py -xJf .gpu/llama_cpp_cuda.tar.xz
            # libggml-cuda.so needs libcublas.so.13: the image's nvidia-cublas (PyTorch's), or $CUBLAS_LIB
            cublas_lib=${CUBLAS_LIB:-$(python3 -c 'import importlib.util, os
s = importlib.util.find_spec("nvidia.cu13")
print(next((os.path.join(d, "lib") for d in (s.submodule_search_locations if s else [])
            if os.path.exists(os.path.join(d, "lib", "libcublas.so.13"))), ""))' 2>/dev/null || true)}
            if [ -z "$cublas_lib" ]; then
                cublas_lib=$(find /opt /usr -name libcublas.so.13 2>/dev/null | head -1)
                cublas_lib=${cublas_lib%/*}
            fi
            export LD_LIBRARY_PATH="$cublas_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            echo "cuBLAS: ${cublas_lib:-not found (no nvidia-cublas in python3, no libcublas.so.13 under /opt, /usr)}" \
                | tee -a "$summary"
            ldd $pkgs/cuda-py/llama_cpp/lib/libggml-cuda.so > "$logs/ldd-ggml-cuda.txt" 2>&1 || true
            step cuda-devices 60 cuda_devices
            # rebuild there when the carried build cannot start (another glibc / libstdc++, a missing library) or
            # its CUDA runtime is newer than the driver; not when it starts and the machine simply has no GPU
            if [ "$last_rc" -ne 0 ] || grep -q 'driver version is insufficient' "$logs/cuda-devices.txt"; then
                step cuda-rebuild "${CUDA_REBUILD_SECONDS:-420}" cuda_rebuild
                step cuda-devices-rebuilt 60 cuda_devices
            fi
            step cuda-op 180 cuda_op
            step cuda-e2e 240 cuda_e2e
            ;;
        cuda-bench) step cuda-bench 330 cuda_bench ;;
        kernels) step kernels 120 kernels ;;
        vulkan | vulkan-bench)
            if [ ! -d $pkgs/vulkan-py/llama_cpp ]; then
                mkdir -p $pkgs/vulkan-py && tar -C $pkgs/vulkan-py -xJf .gpu/llama_cpp_vulkan.tar.xz
                step vulkan-devices 60 vulkan_devices
            fi
            # the first Vulkan device that is a GPU (lavapipe, a CPU, only in a dry run)
            vk_dev=$(awk -F'\t' -v any="${GPU_SESSION_DRY_RUN:-0}" \
                '$1 ~ /^Vulkan[0-9]+$/ && (any == 1 || $2 !~ /llvmpipe/) { print $1; exit }' \
                "$logs/vulkan-devices.txt" || true)
            if [ -z "$vk_dev" ]; then
                echo "- $part: NOT RUN (no Vulkan GPU device: see vulkan-devices)" | tee -a "$summary"
            elif [ "$part" = vulkan ]; then
                export vk_dev
                echo "Vulkan device: $vk_dev ($(awk -F'\t' -v d="$vk_dev" '$1 == d { print $2 }' "$logs/vulkan-devices.txt"))" \
                    | tee -a "$summary"
                step vulkan-op 180 vulkan_op
                step vulkan-op-f32 150 vulkan_op_f32
                step vulkan-op-exact 150 vulkan_op_exact
                step vulkan-tq2_0 120 vulkan_tq2_0
            else
                export vk_dev
                step vulkan-matvec 240 vulkan_matvec
                step vulkan-matvec-f32 150 vulkan_matvec_f32
                step vulkan-matvec-exact 150 vulkan_matvec_exact
                step vulkan-e2e 300 vulkan_e2e
                step vulkan-e2e-tq2_0 240 vulkan_e2e_tq2_0
            fi
            ;;
        bandwidth) step bandwidth 300 bandwidth ;;
        *) echo "unknown part $part (cuda, kernels, vulkan, cuda-bench, vulkan-bench, bandwidth)" | tee -a "$summary" ;;
        esac
    done
    echo "total $(( $(date +%s) - t0 )) s" | tee -a "$summary"
    pack_logs
    ;;
*)
    echo "usage: $0 prepare | run [cuda] [kernels] [vulkan] [cuda-bench] [vulkan-bench] [bandwidth]" >&2
    exit 2
    ;;
esac
