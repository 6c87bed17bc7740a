"""ctypes binding to the standalone kernel harness ``libbitcos_kernels.so`` (root CMakeLists.txt).

The library holds the generic, AVX2 and AVX-512 BITCOS kernels of ``csrc/`` side by side. It comes in two
builds, one per form of the contract's FMA: ``libbitcos_kernels.so`` (``BITCOS_FMA=1``, fused, as GCC builds
llama.cpp's TQ2_0 kernel for x86 with FMA) and ``libbitcos_kernels_nofma.so`` (``BITCOS_FMA=0``); every
function here takes ``fma=True`` / ``fma=False`` to choose. A library is found, in this order, at
``$BITCOS_KERNELS_LIB`` (FMA build) / ``$BITCOS_KERNELS_NOFMA_LIB``, in the installed package
(``ggml_bitcos/lib/``, put there by ``pip install .``), or in a checkout's ``build/kernels/`` after

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

_LIB_NAMES: Final = {True: "libbitcos_kernels.so", False: "libbitcos_kernels_nofma.so"}
_LIB_ENV: Final = {True: "BITCOS_KERNELS_LIB", False: "BITCOS_KERNELS_NOFMA_LIB"}


class KernelLibraryNotFound(RuntimeError):
    """The harness library is neither installed nor built in the checkout."""


def library_candidates(fma: bool = True) -> list[Path]:
    """Places searched for the harness library of the given FMA form, in order."""
    here = Path(__file__).resolve().parent
    name = _LIB_NAMES[fma]
    cands: list[Path] = []
    env = os.environ.get(_LIB_ENV[fma])
    if env:
        cands.append(Path(env))
    # the package directory; an editable install (pip install -e .) adds the site-packages copy holding lib/
    # as a second entry of the package __path__
    pkg_dirs = [here] + [Path(p) for p in getattr(sys.modules.get(__package__ or ""), "__path__", [])]
    for d in dict.fromkeys(pkg_dirs):
        cands.append(d / "lib" / name)
    cands.append(here.parent / "build" / "kernels" / name)
    return cands


@functools.lru_cache(maxsize=2)
def load_library(fma: bool = True) -> ctypes.CDLL:
    """Loads the harness library of the given FMA form (cached); raises KernelLibraryNotFound with the build
    command if absent."""
    fma = bool(fma)
    stale: list[str] = []
    for path in library_candidates(fma):
        if path.is_file():
            lib = ctypes.CDLL(str(path))
            if hasattr(lib, "bitcos_h_fma"):
                break
            stale.append(str(path))        # a build from before the two FMA forms (contract v1): skip it
    else:
        searched = ", ".join(str(p) for p in library_candidates(fma))
        raise KernelLibraryNotFound(
            f"{_LIB_NAMES[fma]} not found (searched {searched}"
            + (f"; outdated builds skipped: {', '.join(stale)}" if stale else "") + "); build it with "
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
    lib.bitcos_h_fma.argtypes = []
    lib.bitcos_h_fma.restype = i32
    if lib.bitcos_h_q8k_size() != Q8K_DTYPE.itemsize:
        raise RuntimeError("block_q8_K size mismatch between the library and Q8K_DTYPE")
    if bool(lib.bitcos_h_fma()) != fma:
        raise RuntimeError(f"{path} was built with BITCOS_FMA={lib.bitcos_h_fma()}, expected {int(fma)}")
    return lib


def library_path(fma: bool = True) -> Path | None:
    """Path of the library that load_library(fma) would use, or None."""
    return next((p for p in library_candidates(fma) if p.is_file()), None)


def available(impl: str, fma: bool = True) -> bool:
    """True when `impl` is compiled into the library and this CPU can run it."""
    return bool(load_library(fma).bitcos_h_available(_IMPL_IDS[impl]))


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


def mm(impl: str, w: BitcosRows, y: np.ndarray, fma: bool = True) -> np.ndarray:
    """dst (nc, nr) float32 from kernel `impl` of the given FMA form (raises if unavailable)."""
    lib = load_library(fma)
    y = _q8k_array(y, w.k)
    nc = y.shape[0]
    dst = np.full((nc, w.nr), np.nan, dtype=np.float32)
    rc = lib.bitcos_h_mm(_IMPL_IDS[impl], w.variant, w.k, _ptr(w.blocks), w.blocks.shape[1], _ptr(w.pool),
                         _ptr(w.sign_pos), w.scale, w.nr, _ptr(y), nc, _ptr(dst))
    if rc != 0:
        raise RuntimeError(f"bitcos_h_mm({impl}) failed: {rc} ({'unavailable' if rc == -1 else 'bad arguments'})")
    return dst


def time_mm(impl: str, w: BitcosRows, y: np.ndarray, reps: int, fma: bool = True) -> np.ndarray:
    """TSC ticks of `reps` back-to-back kernel calls (timed in C after one warm-up call)."""
    lib = load_library(fma)
    y = _q8k_array(y, w.k)
    nc = y.shape[0]
    dst = np.empty((nc, w.nr), dtype=np.float32)
    ticks = np.zeros(reps, dtype=np.uint64)
    rc = lib.bitcos_h_time(_IMPL_IDS[impl], w.variant, w.k, _ptr(w.blocks), w.blocks.shape[1], _ptr(w.pool),
                           _ptr(w.sign_pos), w.scale, w.nr, _ptr(y), nc, _ptr(dst), reps, _ptr(ticks))
    if rc != 0:
        raise RuntimeError(f"bitcos_h_time({impl}) failed: {rc}")
    return ticks


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Correctly rounded float32 fused multiply-add a * b + c, elementwise (numpy has none).

    The float64 product of two float32 is exact; TwoSum gives the float64 sum s and its exact error e; the
    sum is then rounded to odd (when e != 0 and s has an even significand, step s one ulp towards e), and
    rounding a round-to-odd float64 (53 >= 24 + 2 bits) to float32 is the correctly rounded result. A plain
    float64 a*b + c rounded to float32 would round twice and be wrong in rare halfway cases.
    """
    a64 = np.asarray(a, dtype=np.float32).astype(np.float64)
    b64 = np.asarray(b, dtype=np.float32).astype(np.float64)
    c64 = np.asarray(c, dtype=np.float32).astype(np.float64)
    p = a64 * b64
    s = p + c64
    bv = s - p
    e = (p - (s - bv)) + (c64 - bv)
    bits = np.ascontiguousarray(s).view(np.int64)
    fix = (e != 0) & ((bits & 1) == 0)
    toward_larger_magnitude = (e > 0) == (s > 0)
    bits = np.where(fix, np.where(toward_larger_magnitude, bits + 1, bits - 1), bits)
    return bits.view(np.float64).astype(np.float32)


def _contract_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray, fma: bool) -> np.ndarray:
    """The contract's FMA(a, b, c): fused, or a float32 product then a float32 sum."""
    if fma:
        return fma_f32(a, b, c)
    return (np.asarray(a, dtype=np.float32) * np.asarray(b, dtype=np.float32)) + np.asarray(c, dtype=np.float32)


def reference_lanes(codes: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Exact lane sums L[c, r, b, h, l] of the contract (bitcos-kernels.h) in int64.

    codes int (nr, k), q int (nc, k) (the activations of the matrix's k positions). Positions are padded
    with t = 0, q = 0 to whole Q8_K blocks; half h of block b is positions 256b + 128h .. +127.
    """
    codes = np.asarray(codes, dtype=np.int64)
    nr, k = codes.shape
    nc = q.shape[0]
    nby = -(-k // QK_K)
    tp = np.zeros((nr, nby * QK_K), dtype=np.int64)
    tp[:, :k] = codes + 1
    tp[:, k:] = 0                       # absent positions: t = 0 and q = 0, so (t + 1) * q = 0 either way
    qp = np.zeros((nc, nby * QK_K), dtype=np.int64)
    qp[:, :k] = q
    # position j of half h: 32-chunk x = (j % 128) // 32, lane l = (j % 32) // 4, byte y = j % 4
    t6 = tp.reshape(nr, nby, 2, 4, 8, 4)
    q6 = qp.reshape(nc, nby, 2, 4, 8, 4)
    lanes = np.einsum("rbhxly,cbhxly->crbhl", t6, q6)                 # sum (t + 1) * q by lane
    chunk = q6.sum(axis=(4, 5))                                         # (nc, nby, 2, 4): 32-position sums
    for h in range(2):
        lanes[:, :, :, h, 4*h:4*h + 4] -= chunk[:, None, :, h, :]
    return lanes


def reference_mm(codes: np.ndarray, variant: int, y: np.ndarray, *, block_scales: np.ndarray | None = None,
                 scale: float = 1.0, fma: bool = True) -> np.ndarray:
    """Independent numpy evaluation of the kernel contract v2 from the plain codes: dst (nc, nr) float32.

    Integer lane sums in int64 (exact), then every fp32 operation of bitcos-kernels.h in its order,
    vectorised over rows, columns and lanes (each numpy float32 op is one IEEE operation per element, never
    fused; the fused form uses fma_f32).
    """
    codes = np.asarray(codes, dtype=np.int64)
    nr, k = codes.shape
    nb = k // QK
    nby = -(-k // QK_K)
    y = _q8k_array(y, k)
    nc = y.shape[0]
    q = y["qs"].reshape(nc, -1)[:, :k].astype(np.int64)
    lanes = reference_lanes(codes, q)                                    # (nc, nr, nby, 2, 8)
    yd = y["d"].astype(np.float32)                                       # (nc, nby)
    acc = np.zeros((nc, nr, 8), dtype=np.float32)
    if variant == VARIANT_G128:
        e = np.ascontiguousarray(np.asarray(block_scales, dtype="<f2").reshape(nr, nb))
    for b in range(nby):
        both = (lanes[:, :, b, 0] + lanes[:, :, b, 1]).astype(np.float32)        # exact: |L| < 2^24
        if variant == VARIANT_PT:
            d = (yd[:, b] * np.float32(scale)).astype(np.float32)
            acc = _contract_fma(both, d[:, None, None], acc, fma)
            continue
        e0 = e[:, 2*b]
        e1 = e[:, 2*b + 1] if 2*b + 1 < nb else e0
        same = e0.view(np.uint16) == e1.view(np.uint16)                          # (nr,)
        d0 = (yd[:, b, None] * e0.astype(np.float32)[None, :]).astype(np.float32)   # (nc, nr)
        d1 = (yd[:, b, None] * e1.astype(np.float32)[None, :]).astype(np.float32)
        joint = _contract_fma(both, d0[..., None], acc, fma)
        split = _contract_fma(lanes[:, :, b, 0].astype(np.float32), d0[..., None], acc, fma)
        split = _contract_fma(lanes[:, :, b, 1].astype(np.float32), d1[..., None], split, fma)
        acc = np.where(same[None, :, None], joint, split)
    a = acc
    return ((a[..., 0] + a[..., 4]) + (a[..., 2] + a[..., 6])) + ((a[..., 1] + a[..., 5]) + (a[..., 3] + a[..., 7]))
