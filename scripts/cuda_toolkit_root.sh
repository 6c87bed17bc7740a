#!/usr/bin/env bash
# Prints a CUDA toolkit root that CMake's FindCUDAToolkit accepts for a whole -DGGML_CUDA=ON build: nvcc, the
# CUDA runtime AND cuBLAS (ggml-cuda links CUDA::cublas).
#
#   root=$(scripts/cuda_toolkit_root.sh DEST)
#   CMAKE_ARGS="-DGGML_CUDA=ON -DCUDAToolkit_ROOT=$root -DCMAKE_CUDA_COMPILER=$root/bin/nvcc ..." ...
#
# Why: the project's machines and the lent GPU machine have nvcc and libcudart, assembled from NVIDIA's pip
# wheels, but no cuBLAS in the toolkit folder; NVIDIA ships cuBLAS as the pip wheel nvidia-cublas (headers and
# libraries under nvidia/cu13/). Where the toolkit has cuBLAS already, that toolkit is printed and DEST is not
# touched. Otherwise DEST becomes the toolkit's tree as symbolic links (the toolkit itself is never modified)
# with the cuBLAS headers and libraries linked into include/ and lib/, taken from, in this order:
#   $CUBLAS_DIR (a folder with include/cublas_v2.h and lib/libcublas.so.13), an nvidia-cublas that python3
#   imports (the GPU machine's image has one: PyTorch's), or nvidia-cublas==$NVIDIA_CUBLAS_VERSION downloaded
#   with pip into ~/.cache/ggml-bitcos-cublas (the version of the CUDA 13.0 toolkit here).
# nvcc itself is copied, not linked: it finds its headers relative to its own file (nvcc.profile's $(_HERE_)),
# so the copy compiles against DEST/include, cuBLAS included.
# Environment: CUDA_HOME (default: the first of /usr/local/cuda, /usr/local/cuda-* holding bin/nvcc).
# Linking executables against libggml-cuda.so needs -Wl,-rpath-link,DEST/lib (DEST/lib is on no search path of
# the linker); at run time they need libcublas.so.13 / libcublasLt.so.13 on the loader's path (DEST/lib).
set -euo pipefail
dest=${1:?usage: $0 DEST}
NVIDIA_CUBLAS_VERSION=${NVIDIA_CUBLAS_VERSION:-13.0.2.14}

toolkit=${CUDA_HOME:-}
if [ -z "$toolkit" ]; then
    for d in /usr/local/cuda /usr/local/cuda-*; do
        if [ -x "$d/bin/nvcc" ]; then toolkit=$d; break; fi
    done
fi
if [ -z "$toolkit" ] || [ ! -x "$toolkit/bin/nvcc" ]; then
    echo "cuda_toolkit_root: no CUDA toolkit (bin/nvcc) in \$CUDA_HOME, /usr/local/cuda or /usr/local/cuda-*" >&2
    exit 1
fi
toolkit=$(readlink -f "$toolkit")
has_cublas() { [ -f "$1/include/cublas_v2.h" ] && ls "$1"/lib*/libcublas.so* >/dev/null 2>&1; }
if has_cublas "$toolkit"; then
    echo "$toolkit"
    exit 0
fi

cublas=${CUBLAS_DIR:-}
if [ -z "$cublas" ]; then
    # an installed nvidia-cublas (a namespace package: nvidia/cu13/{include,lib})
    cublas=$(python3 - <<'EOF' 2>/dev/null || true
import importlib.util, os
spec = importlib.util.find_spec("nvidia.cu13")
for d in (spec.submodule_search_locations if spec else []):
    if os.path.isfile(os.path.join(d, "include", "cublas_v2.h")):
        print(d)
        break
EOF
)
fi
if [ -z "$cublas" ]; then
    cache=${GGML_BITCOS_CUBLAS_CACHE:-$HOME/.cache/ggml-bitcos-cublas}/$NVIDIA_CUBLAS_VERSION
    if [ ! -f "$cache/nvidia/cu13/include/cublas_v2.h" ]; then
        mkdir -p "$cache"
        python3 -m pip download -q --no-deps --only-binary=:all: -d "$cache/wheel" \
            "nvidia-cublas==$NVIDIA_CUBLAS_VERSION" >&2
        python3 -m zipfile -e "$cache"/wheel/nvidia_cublas-*.whl "$cache"
        rm -rf "$cache/wheel"
    fi
    cublas=$cache/nvidia/cu13
fi
if [ ! -f "$cublas/include/cublas_v2.h" ] || [ ! -f "$cublas/lib/libcublas.so.13" ]; then
    echo "cuda_toolkit_root: $cublas has no include/cublas_v2.h and lib/libcublas.so.13" >&2
    exit 1
fi
cublas=$(readlink -f "$cublas")

rm -rf "$dest"
mkdir -p "$dest"
cp -rs "$toolkit/." "$dest/"
# relative links of the toolkit (lib64 -> lib, targets/<arch>/include -> ../../include) must point into DEST,
# not back into the toolkit, or FindCUDAToolkit would look for cuBLAS where it is not
find "$toolkit" -type l | while read -r link; do
    target=$(readlink "$link")
    case "$target" in /*) continue ;; esac
    rel=${link#"$toolkit"/}
    rm -f "$dest/$rel"
    ln -s "$target" "$dest/$rel"
done
rm "$dest/bin/nvcc"
cp "$toolkit/bin/nvcc" "$dest/bin/nvcc"
libdir=$dest/lib
[ -d "$libdir" ] || libdir=$dest/lib64
for f in "$cublas"/include/*; do ln -sf "$f" "$dest/include/"; done
for f in "$cublas"/lib/*; do ln -sf "$f" "$libdir/"; done
# the link-time names (the wheel ships only the sonames)
ln -sf libcublas.so.13 "$libdir/libcublas.so"
ln -sf libcublasLt.so.13 "$libdir/libcublasLt.so"
echo "$(readlink -f "$dest")"
