"""BITCOS on CUDA (csrc/cuda/): the translation units compile with the nvcc this machine has, for sm_80 and
sm_90 (CI: no GPU, so compile only; not the whole ggml-cuda, whose headers need cuBLAS), and, where a CUDA
device exists (a lent GPU machine: scripts/gpu_session.sh), the kernel runs against the numpy reference.

nvcc: $NVCC, else `nvcc` on PATH, else /usr/local/cuda/bin/nvcc. Skipped without it unless
BITCOS_REQUIRE_CUDA_COMPILE=1 (CI sets it where nvcc exists). BITCOS_CUDA_TEST_EXE: a test program built
elsewhere (scripts/gpu_session.sh builds it here for the GPU machine, which has no nvcc).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ggml_bitcos.format import Variant

ROOT = Path(__file__).resolve().parent.parent
ARCHS = ("sm_80", "sm_90")


def nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).exists():
            return cand
    return None


@pytest.fixture(scope="module")
def nvcc_path() -> str:
    exe = nvcc()
    if exe is None:
        if os.environ.get("BITCOS_REQUIRE_CUDA_COMPILE") == "1":
            pytest.fail("nvcc not found")
        pytest.skip("nvcc not found")
    return exe


@pytest.fixture(scope="module")
def ggml_include(tmp_path_factory) -> Path:
    """ggml/include of the pinned sdist with the project's patches and headers (ggml.h with the BITCOS ids)."""
    from ggml_bitcos import build, upstream

    tree = upstream.extract_sdist(tmp_path_factory.mktemp("cuda-tree") / "src")
    build.copy_csrc(tree)
    build.apply_patches(tree)
    return tree / "vendor" / "llama.cpp" / "ggml" / "include"


def compile_cuda(nvcc_exe: str, source: Path, out: Path, arch: str, include: list[Path], link: bool) -> None:
    cmd = [nvcc_exe, "-std=c++17", "-O2", f"-arch={arch}", "-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra",
           *(f"-I{p}" for p in include), str(source), "-o", str(out)]
    if not link:
        cmd.insert(1, "-c")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_translation_units_compile(nvcc_path, ggml_include, tmp_path, arch):
    """The ggml-cuda glue (its kernels instantiated, device code through ptxas) and the standalone test
    program compile warning-free for each architecture; the glue's object holds both kernels."""
    inc = [ggml_include, ROOT / "csrc", ROOT / "csrc" / "cuda"]
    obj = tmp_path / f"ggml-bitcos-cuda-{arch}.o"
    compile_cuda(nvcc_path, ROOT / "csrc" / "cuda" / "ggml-bitcos-cuda.cu", obj, arch, inc, link=False)
    syms = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True).stdout
    for name in ("ggml_cuda_bitcos_supports_op", "ggml_cuda_bitcos_mul_mat(", "ggml_cuda_bitcos_mul_mat_id(",
                 "bitcos_cuda_mul_mat_kernel", "bitcos_cuda_mul_mat_id_kernel"):
        assert name in syms, name
    compile_cuda(nvcc_path, ROOT / "tests" / "cuda" / "test-bitcos-cuda.cu", tmp_path / f"test-{arch}", arch,
                 [ROOT / "csrc", ROOT / "csrc" / "cuda"], link=True)


def cuda_device_present() -> bool:
    smi = shutil.which("nvidia-smi")
    return smi is not None and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def nvcc_or_prebuilt() -> str | None:
    if os.environ.get("BITCOS_CUDA_TEST_EXE"):
        return None
    exe = nvcc()
    if exe is None:
        pytest.skip("nvcc not found and no BITCOS_CUDA_TEST_EXE")
    return exe


@pytest.mark.parametrize("variant", list(Variant), ids=[v.name.lower() for v in Variant])
def test_cuda_kernel_matches_the_reference(nvcc_or_prebuilt, tmp_path, variant):
    """On a CUDA device: mat-vec of every variant of both format versions, the SYCL test's cases (z 0 / 0.4 /
    1, odd shapes, MATRIX / ROW rows ending in a partial 128-weight unit, 1-17 columns, runs starting
    mid-tensor, 3-D tensors with per-matrix scales), within fp32 accumulation error of the float64 product."""
    if not cuda_device_present():
        pytest.skip("no CUDA device (runs on a lent GPU machine: scripts/gpu_session.sh)")
    import test_sycl as ref

    prebuilt = os.environ.get("BITCOS_CUDA_TEST_EXE")      # built elsewhere (the GPU machine has no nvcc)
    exe = Path(prebuilt) if prebuilt else tmp_path / "test-bitcos-cuda"
    if not prebuilt:
        compile_cuda(nvcc_or_prebuilt, ROOT / "tests" / "cuda" / "test-bitcos-cuda.cu", exe, "native",
                     [ROOT / "csrc", ROOT / "csrc" / "cuda"], link=True)
    cases = ref.variant_cases(np.random.default_rng(31 + int(variant)), variant)
    inp, out = tmp_path / "in.bin", tmp_path / "out.bin"
    ref.write_cases(inp, cases)
    r = subprocess.run([str(exe), str(inp), str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    data = np.fromfile(out, dtype="<f4")
    off = 0
    for c in cases:
        n_x, k = c["x"].shape
        mv = data[off:off + n_x * c["n_rows"]].reshape(n_x, c["n_rows"])
        off += mv.size
        values = c["values"][c["row0"]:c["row0"] + c["n_rows"]].astype(np.float64)
        exact = c["x"].astype(np.float64) @ values.T
        mag = np.abs(c["x"].astype(np.float64)) @ np.abs(values.T)
        assert np.all(np.abs(mv - exact) <= 4 * np.finfo(np.float32).eps * np.sqrt(k) * mag + 1e-30)
    assert off == data.size
