"""llama.cpp's TQ2_0 dot product as the reference the BITCOS kernels must equal bit for bit: ``vec_dot`` of
GGML_TYPE_TQ2_0 from the CPU backend (``libggml-cpu.so``, or in a portable build the ``libggml-cpu-<variant>.so``
ggml loads here) of the installed (patched) llama-cpp-python, called through ctypes,
and the helpers that compare every harness kernel with it (tests/test_tq2_compat.py, tests/test_kernels.py;
the fixture ``tq2_vec_dot`` in conftest.py loads it).

Which form of the contract's FMA matches depends on how ggml was compiled: GCC contracts TQ2_0's
``_mm256_add_ps(_mm256_mul_ps(..))`` into vfmadd when the target has FMA (the project's GGML_NATIVE build on
an FMA machine); clang does not. ``expected_fma`` picks the form from the CPU flags and the library's compiler
note.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType

from ggml_bitcos import harness
from ggml_bitcos.format import QK_K, TQ2_0_BLOCK_BYTES
from ggml_bitcos.q8k import Q8K_DTYPE, random_q8k
from ggml_bitcos.ternary import random_codes


class GgmlTypeTraitsCpu(ctypes.Structure):
    """struct ggml_type_traits_cpu (ggml-cpu.h)."""

    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


# void ggml_vec_dot_t(int n, float * s, size_t bs, const void * x, size_t bx, const void * y, size_t by, int nrc)
VEC_DOT = ctypes.CFUNCTYPE(
    None,
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_float),
    ctypes.c_size_t,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
)


# The GGML_CPU_ALL_VARIANTS modules compiled without FMA (ggml's x86 variant list): no contraction there
NO_FMA_VARIANTS = frozenset({"x64", "sse42", "sandybridge", "ivybridge"})


def llama_cpp_package() -> Path | None:
    """The installed llama_cpp package folder, found without importing it."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def cpu_backend_library(pkg: Path) -> Path | None:
    """The CPU backend of a llama_cpp package: lib/libggml-cpu.so, or in a portable build (GGML_BACKEND_DL +
    GGML_CPU_ALL_VARIANTS) the lib/libggml-cpu-<variant>.so that ggml_backend_load_all() loads on this CPU:
    the one with the highest ggml_backend_score() (0: this CPU cannot run it), the first on a tie."""
    lib = pkg / "lib"
    if (lib / "libggml-cpu.so").is_file():
        return lib / "libggml-cpu.so"
    best, best_score = None, 0
    for path in sorted(lib.glob("libggml-cpu-*.so")):
        score_fn = ctypes.CDLL(str(path)).ggml_backend_score
        score_fn.restype = ctypes.c_int
        score = score_fn()
        if score > best_score:
            best, best_score = path, score
    return best


def ggml_cpu_library() -> Path | None:
    """The CPU backend library of the installed llama_cpp package (cpu_backend_library)."""
    pkg = llama_cpp_package()
    return cpu_backend_library(pkg) if pkg is not None else None


def expected_fma(lib_path: Path, cpu_flags: set[str]) -> bool:
    """The FMA form of TQ2_0 in this ggml build: fused when GCC compiled it for a target with FMA (a native
    build on an FMA machine, or a CPU variant with FMA)."""
    built_by_clang = b"clang version" in lib_path.read_bytes()
    variant = lib_path.stem.removeprefix("libggml-cpu").removeprefix("-")
    return "fma" in cpu_flags and not built_by_clang and variant not in NO_FMA_VARIANTS


def load_tq2_vec_dot(cpu_flags: set[str]):
    """(TQ2_0's vec_dot from the installed ggml, the FMA form it uses, its library), or None when no patched
    llama_cpp with a libggml-cpu.so is installed."""
    path = ggml_cpu_library()
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    lib.ggml_cpu_init.argtypes = []
    lib.ggml_cpu_init.restype = None
    lib.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    lib.ggml_get_type_traits_cpu.restype = ctypes.POINTER(GgmlTypeTraitsCpu)
    lib.ggml_cpu_init()
    traits = lib.ggml_get_type_traits_cpu(int(GGMLQuantizationType.TQ2_0)).contents
    assert traits.vec_dot, "TQ2_0 has no vec_dot in this ggml"
    return VEC_DOT(traits.vec_dot), expected_fma(path, cpu_flags), lib  # keep lib referenced


def tq2_dots(vec_dot, rows: np.ndarray, y: np.ndarray) -> np.ndarray:
    """TQ2_0 rows (R, nblk*66) . one Q8_K column (nblk,): float32 (R,), one vec_dot call per row."""
    y = np.ascontiguousarray(y, dtype=Q8K_DTYPE)
    out = np.empty(rows.shape[0], dtype=np.float32)
    k = rows.shape[1] // TQ2_0_BLOCK_BYTES * QK_K
    s = ctypes.c_float()
    for i in range(rows.shape[0]):
        row = np.ascontiguousarray(rows[i])
        vec_dot(k, ctypes.byref(s), 0, row.ctypes.data, 0, y.ctypes.data, 0, 1)
        out[i] = s.value
    return out


def random_q8k_column(rng: np.random.Generator, k: int, magnitude: str) -> np.ndarray:
    """Q8_K activations for one column; 'large' uses extreme int8 values and scales up to 1e4 (both signs),
    so the products and sums reach large exponents where rounding differences would show."""
    y = random_q8k(rng, 1, k)[0]
    if magnitude == "large":
        q = rng.choice(np.array([-128, -127, 127, 126, -1, 0, 1], dtype=np.int8), size=y["qs"].shape)
        y["qs"] = np.where(rng.random(y["qs"].shape) < 0.5, q, y["qs"])
        y["d"] = (rng.uniform(0.5, 1.0, y["d"].shape) * np.exp2(rng.integers(0, 14, y["d"].shape))).astype(np.float32)
    y["d"] *= np.where(rng.random(y["d"].shape) < 0.3, -1.0, 1.0).astype(np.float32)
    y["bsums"] = y["qs"].reshape(-1, 16, 16).sum(axis=2, dtype=np.int16)  # TQ2_0 reads the bsums
    return y


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


KS = (256, 512, 768, 1280, 2048, 2304)


def assert_kernels_match_tq2_0(
    vec_dot, fma: bool, tq2: np.ndarray, w, rng: np.random.Generator, k: int, magnitude: str
) -> None:
    """Every available BITCOS kernel gives TQ2_0's vec_dot bit for bit, on three activation columns."""
    for _ in range(3):
        y = random_q8k_column(rng, k, magnitude)
        want = tq2_dots(vec_dot, tq2, y)
        for impl in harness.kernel_names(fma):
            if not harness.available(impl, fma):
                continue
            got = harness.mm(impl, w, y[None, :], fma)[0]
            np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"{impl} (BITCOS_FMA={int(fma)})")


def mixed_density_codes(rng: np.random.Generator, nr: int, k: int) -> np.ndarray:
    """nr rows of k ternary codes, each row at its own zero density drawn uniformly from [0, 1)."""
    return np.concatenate([random_codes(rng, (1, k), float(z)) for z in rng.uniform(0.0, 1.0, nr)])
