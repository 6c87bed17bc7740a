"""ctypes binding to the standalone kernel harness ``libbitcos_kernels.so`` (root CMakeLists.txt).

The library holds the generic, AVX2 and AVX-512 BITCOS kernels of ``csrc/`` side by side. It comes in two
builds, one per form of the contract's FMA: ``libbitcos_kernels.so`` (``BITCOS_FMA=1``, fused, as GCC builds
llama.cpp's TQ2_0 kernel for x86 with FMA) and ``libbitcos_kernels_nofma.so`` (``BITCOS_FMA=0``); every
function here takes ``fma=True`` / ``fma=False`` to choose. A library is found, in this order, at
``$BITCOS_KERNELS_LIB`` (FMA build) / ``$BITCOS_KERNELS_NOFMA_LIB``, in the installed package
(``ggml_bitcos/lib/``, put there by ``pip install .``), or in a checkout's ``build/kernels/`` after

    cmake -S . -B build/kernels -DCMAKE_BUILD_TYPE=Release && cmake --build build/kernels

A kernel reads rows of one BITCOS matrix as ``BitcosRows``: the weight's blocks, the companion's sign pool and
each row's first sign position. ``encode_rows`` makes them with the reference codec (``codec.encode``), so
the kernels are tested on exactly the bytes a converted file holds. The activations are Q8_K
(``ggml_bitcos.q8k``); the independent numpy reference of the kernels' arithmetic is ``ggml_bitcos.contract``.
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

from . import codec
from .format import Variant
from .q8k import Q8K_DTYPE, as_q8k

IMPLS: Final = ("generic", "avx2", "avx512")
_IMPL_IDS: Final = {name: i for i, name in enumerate(IMPLS)}

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

    variant: Variant
    k: int
    blocks: np.ndarray     # uint8 (nr, row_bytes): per 128 weights bits[16] (+ fp16 d for G128)
    pool: np.ndarray       # uint8: sign bits of all rows back to back, zero tail >= 64 bytes
    sign_pos: np.ndarray   # uint64 (nr,): pool bit of each row's first sign
    scale: float = 1.0     # PT only: the matrix's scale (the kernels ignore it for G128)

    @property
    def nr(self) -> int:
        return int(self.blocks.shape[0])

    @classmethod
    def from_encoded(cls, enc: codec.Encoded) -> BitcosRows:
        """The kernel's view of a one-matrix encoding: its blocks, and from the companion the sign pool (with
        the format's zero tail), the row index resolved to sign positions and the PT scale."""
        hdr = enc.header
        if hdr.n_mats != 1:
            raise ValueError(f"the harness takes one matrix, the encoding has {hdr.n_mats}")
        scale = 1.0
        if enc.variant == Variant.PT:
            scale = float(enc.companion[hdr.scales_offset:hdr.scales_offset + 4].view("<f4")[0])
        return cls(enc.variant, hdr.n_cols, enc.blocks, codec.sign_pool(enc.companion, hdr),
                   codec.sign_positions(enc.companion, hdr), scale)


def encode_rows(codes: np.ndarray, variant: Variant, *, block_scales: np.ndarray | None = None,
                scale: float = 1.0) -> BitcosRows:
    """``BitcosRows`` of ternary codes int8 (nr, k) in {-1, 0, 1}, encoded by ``codec.encode`` as one matrix:
    G128 with ``block_scales`` (float16-castable (nr, k/128), >= 0), PT with the matrix scale ``scale`` (>= 0)."""
    enc = codec.encode(codes, variant, block_scales=block_scales, matrix_scales=np.array([scale], np.float32))
    return BitcosRows.from_encoded(enc)


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def mm(impl: str, w: BitcosRows, y: np.ndarray, fma: bool = True) -> np.ndarray:
    """dst (nc, nr) float32 from kernel `impl` of the given FMA form (raises if unavailable)."""
    lib = load_library(fma)
    y = as_q8k(y, w.k)
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
    y = as_q8k(y, w.k)
    nc = y.shape[0]
    dst = np.empty((nc, w.nr), dtype=np.float32)
    ticks = np.zeros(reps, dtype=np.uint64)
    rc = lib.bitcos_h_time(_IMPL_IDS[impl], w.variant, w.k, _ptr(w.blocks), w.blocks.shape[1], _ptr(w.pool),
                           _ptr(w.sign_pos), w.scale, w.nr, _ptr(y), nc, _ptr(dst), reps, _ptr(ticks))
    if rc != 0:
        raise RuntimeError(f"bitcos_h_time({impl}) failed: {rc}")
    return ticks
