"""ctypes binding to the standalone kernel harness ``libbitcos_kernels.so`` (root CMakeLists.txt).

The library holds the generic, AVX2 and AVX-512 BITCOS kernels of ``csrc/`` side by side. It is found, in
this order, at ``$BITCOS_KERNELS_LIB``, in the installed package (``ggml_bitcos/lib/``, put there by
``pip install .``), or in a checkout's ``build/kernels/`` after

    cmake -S . -B build/kernels -DCMAKE_BUILD_TYPE=Release && cmake --build build/kernels

Besides the binding this module has what tests and benchmarks need around it: a minimal BITCOS row encoder
(FORMAT.md §3/§4.3/§4.4, the parts a kernel reads), a numpy Q8_K quantizer and an independent numpy
implementation of the kernel contract (csrc/bitcos-kernels.h) that reproduces its fp32 operation order.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

QK: Final = 128
QK_K: Final = 256
VARIANT_G128: Final = 0
VARIANT_PT: Final = 1
BLOCK_BYTES: Final = {VARIANT_G128: 18, VARIANT_PT: 16}
POOL_TAIL: Final = 64

IMPLS: Final = ("generic", "avx2", "avx512")
_IMPL_IDS: Final = {name: i for i, name in enumerate(IMPLS)}

# ggml block_q8_K: float d; int8 qs[256]; int16 bsums[16] (292 bytes, no padding)
Q8K_DTYPE: Final = np.dtype([("d", "<f4"), ("qs", "i1", (QK_K,)), ("bsums", "<i2", (16,))])
assert Q8K_DTYPE.itemsize == 292

_LIB_NAME: Final = "libbitcos_kernels.so"


class KernelLibraryNotFound(RuntimeError):
    """libbitcos_kernels.so is neither installed nor built in the checkout."""


def library_candidates() -> list[Path]:
    """Places searched for the harness library, in order."""
    here = Path(__file__).resolve().parent
    cands: list[Path] = []
    env = os.environ.get("BITCOS_KERNELS_LIB")
    if env:
        cands.append(Path(env))
    # the package directory; an editable install (pip install -e .) adds the site-packages copy holding lib/
    # as a second entry of the package __path__
    pkg_dirs = [here] + [Path(p) for p in getattr(sys.modules.get(__package__ or ""), "__path__", [])]
    for d in dict.fromkeys(pkg_dirs):
        cands.append(d / "lib" / _LIB_NAME)
    cands.append(here.parent / "build" / "kernels" / _LIB_NAME)
    return cands


@functools.lru_cache(maxsize=1)
def load_library() -> ctypes.CDLL:
    """Loads the harness library (cached); raises KernelLibraryNotFound with the build command if absent."""
    for path in library_candidates():
        if path.is_file():
            lib = ctypes.CDLL(str(path))
            break
    else:
        searched = ", ".join(str(p) for p in library_candidates())
        raise KernelLibraryNotFound(
            f"{_LIB_NAME} not found (searched {searched}); build it with "
            "`cmake -S . -B build/kernels -DCMAKE_BUILD_TYPE=Release && cmake --build build/kernels` "
            "in the repository, or `pip install .`")
    vp, i64, i32, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
    call_args = [i32, i32, i64, vp, sz, vp, vp, ctypes.c_float, i64, vp, i64, vp]
    lib.bitcos_h_available.argtypes = [i32]
    lib.bitcos_h_available.restype = i32
    lib.bitcos_h_mm.argtypes = call_args
    lib.bitcos_h_mm.restype = i32
    lib.bitcos_h_time.argtypes = call_args + [i32, vp]
    lib.bitcos_h_time.restype = i32
    lib.bitcos_h_q8k_size.argtypes = []
    lib.bitcos_h_q8k_size.restype = sz
    if lib.bitcos_h_q8k_size() != Q8K_DTYPE.itemsize:
        raise RuntimeError("block_q8_K size mismatch between the library and Q8K_DTYPE")
    return lib


def library_path() -> Path | None:
    """Path of the library that load_library() would use, or None."""
    return next((p for p in library_candidates() if p.is_file()), None)


def available(impl: str) -> bool:
    """True when `impl` is compiled into the library and this CPU can run it."""
    return bool(load_library().bitcos_h_available(_IMPL_IDS[impl]))


@dataclass(frozen=True)
class BitcosRows:
    """The arrays a kernel reads for nr rows of one BITCOS matrix (FORMAT.md §3, §4.3, §4.4)."""

    variant: int
    k: int
    blocks: np.ndarray     # uint8 (nr, row_bytes): per 128 weights bits[16] (+ fp16 d for G128)
    pool: np.ndarray       # uint8: sign bits of all rows back to back, zero tail >= 64 bytes
    sign_pos: np.ndarray   # uint64 (nr,): pool bit of each row's first sign
    scale: float = 1.0     # PT only

    @property
    def nr(self) -> int:
        return int(self.blocks.shape[0])


def encode_rows(codes: np.ndarray, variant: int, *, block_scales: np.ndarray | None = None,
                scale: float = 1.0) -> BitcosRows:
    """Encodes ternary codes int8 (nr, k) in {-1, 0, 1}; block_scales float16 (nr, k/128) for G128."""
    codes = np.asarray(codes, dtype=np.int8)
    nr, k = codes.shape
    if k % QK != 0:
        raise ValueError("k must be a multiple of 128")
    nb = k // QK
    bits = np.packbits(codes != 0, axis=1, bitorder="little").reshape(nr, nb, QK // 8)
    if variant == VARIANT_G128:
        if block_scales is None:
            raise ValueError("G128 needs block_scales")
        d = np.ascontiguousarray(np.asarray(block_scales, dtype="<f2").reshape(nr, nb, 1)).view(np.uint8)
        blocks = np.concatenate([bits, d], axis=2)
    else:
        blocks = bits
    blocks = np.ascontiguousarray(blocks.reshape(nr, nb * BLOCK_BYTES[variant]))
    present = codes != 0
    signs = (codes[present] < 0)                 # row-major: rows back to back, increasing k
    n_signs = int(signs.size)
    sign_bytes = -(-n_signs // 8)
    pool_bytes = -(-sign_bytes // 64) * 64 + POOL_TAIL      # FORMAT.md §4.4
    pool = np.zeros(pool_bytes, dtype=np.uint8)
    packed = np.packbits(signs, bitorder="little")
    pool[:packed.size] = packed
    counts = present.sum(axis=1, dtype=np.uint64)
    sign_pos = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.uint64)
    return BitcosRows(variant, k, blocks, pool, sign_pos, float(np.float32(scale)))


def random_codes(rng: np.random.Generator, nr: int, k: int, zero_density: float) -> np.ndarray:
    """Random ternary codes with the given fraction of zeros and balanced signs."""
    present = rng.random((nr, k)) >= zero_density
    sign = np.where(rng.random((nr, k)) < 0.5, -1, 1)
    return (present * sign).astype(np.int8)


def random_q8k(rng: np.random.Generator, nc: int, k: int) -> np.ndarray:
    """Random Q8_K activations (nc, ceil(k/256)): full int8 range (-128 included), positive scales."""
    nby = -(-k // QK_K)
    y = np.zeros((nc, nby), dtype=Q8K_DTYPE)
    y["qs"] = rng.integers(-128, 128, size=(nc, nby, QK_K), dtype=np.int8)
    y["d"] = rng.uniform(1e-3, 0.05, size=(nc, nby)).astype(np.float32)
    y["bsums"] = y["qs"].reshape(nc, nby, 16, 16).sum(axis=3, dtype=np.int16)
    return y


def quantize_q8k(x: np.ndarray) -> np.ndarray:
    """float32 (nc, k) -> Q8_K (nc, ceil(k/256)) as ggml's quantize_row_q8_K does (k zero-padded to 256)."""
    x = np.asarray(x, dtype=np.float32)
    nc, k = x.shape
    nby = -(-k // QK_K)
    xp = np.zeros((nc, nby * QK_K), dtype=np.float32)
    xp[:, :k] = x
    xb = xp.reshape(nc, nby, QK_K)
    idx = np.abs(xb).argmax(axis=2)
    vmax = np.take_along_axis(xb, idx[..., None], axis=2)[..., 0]     # signed value of largest |x|
    y = np.zeros((nc, nby), dtype=Q8K_DTYPE)
    nz = vmax != 0
    iscale = np.where(nz, np.float32(-127.0) / np.where(nz, vmax, 1), 0).astype(np.float32)
    q = np.rint(xb * iscale[..., None]).clip(-128, 127).astype(np.int8)
    y["qs"] = np.minimum(q, 127)
    y["d"] = np.where(nz, np.float32(1.0) / np.where(nz, iscale, 1), 0).astype(np.float32)
    y["bsums"] = y["qs"].reshape(nc, nby, 16, 16).sum(axis=3, dtype=np.int16)
    return y


def _q8k_array(y: np.ndarray, k: int) -> np.ndarray:
    y = np.ascontiguousarray(y, dtype=Q8K_DTYPE)
    if y.ndim != 2 or y.shape[1] != -(-k // QK_K):
        raise ValueError(f"activations must be Q8_K (nc, {-(-k // QK_K)})")
    return y


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def mm(impl: str, w: BitcosRows, y: np.ndarray) -> np.ndarray:
    """dst (nc, nr) float32 from kernel `impl` (raises if unavailable)."""
    lib = load_library()
    y = _q8k_array(y, w.k)
    nc = y.shape[0]
    dst = np.full((nc, w.nr), np.nan, dtype=np.float32)
    rc = lib.bitcos_h_mm(_IMPL_IDS[impl], w.variant, w.k, _ptr(w.blocks), w.blocks.shape[1], _ptr(w.pool),
                         _ptr(w.sign_pos), w.scale, w.nr, _ptr(y), nc, _ptr(dst))
    if rc != 0:
        raise RuntimeError(f"bitcos_h_mm({impl}) failed: {rc} ({'unavailable' if rc == -1 else 'bad arguments'})")
    return dst


def time_mm(impl: str, w: BitcosRows, y: np.ndarray, reps: int) -> np.ndarray:
    """TSC ticks of `reps` back-to-back kernel calls (timed in C after one warm-up call)."""
    lib = load_library()
    y = _q8k_array(y, w.k)
    nc = y.shape[0]
    dst = np.empty((nc, w.nr), dtype=np.float32)
    ticks = np.zeros(reps, dtype=np.uint64)
    rc = lib.bitcos_h_time(_IMPL_IDS[impl], w.variant, w.k, _ptr(w.blocks), w.blocks.shape[1], _ptr(w.pool),
                           _ptr(w.sign_pos), w.scale, w.nr, _ptr(y), nc, _ptr(dst), reps, _ptr(ticks))
    if rc != 0:
        raise RuntimeError(f"bitcos_h_time({impl}) failed: {rc}")
    return ticks


def reference_mm(codes: np.ndarray, variant: int, y: np.ndarray, *, block_scales: np.ndarray | None = None,
                 scale: float = 1.0) -> np.ndarray:
    """Independent numpy evaluation of the kernel contract from the plain codes: dst (nc, nr) float32.

    Integer sums in int64 (exact), then every fp32 operation of bitcos-kernels.h in its order, vectorised
    over rows and columns (each numpy float32 op is one IEEE operation per element, never fused).
    """
    codes = np.asarray(codes, dtype=np.int64)
    nr, k = codes.shape
    nb = k // QK
    y = _q8k_array(y, k)
    nc = y.shape[0]
    q = y["qs"].reshape(nc, -1)[:, :k].astype(np.int64)                          # (nc, k)
    isum = np.einsum("rgj,cgj->crg", codes.reshape(nr, nb, QK), q.reshape(nc, nb, QK))  # (nc, nr, nb)
    yd = y["d"].astype(np.float32)                                                 # (nc, nby)
    acc = np.zeros((nc, nr), dtype=np.float32)
    if variant == VARIANT_G128:
        d = np.asarray(block_scales, dtype=np.float16).astype(np.float32).reshape(nr, nb)
        for b in range((nb + 1) // 2):
            part = isum[:, :, 2*b].astype(np.float32) * d[None, :, 2*b]
            if 2*b + 1 < nb:
                part = part + isum[:, :, 2*b + 1].astype(np.float32) * d[None, :, 2*b + 1]
            acc = acc + yd[:, b, None] * part
        return acc
    for b in range((nb + 1) // 2):
        pair = isum[:, :, 2*b] + (isum[:, :, 2*b + 1] if 2*b + 1 < nb else 0)
        acc = acc + yd[:, b, None] * pair.astype(np.float32)
    return acc * np.float32(scale)
