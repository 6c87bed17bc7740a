"""ctypes binding to the standalone kernel harness ``libbitcos_kernels.so`` (root CMakeLists.txt).

The library holds every BITCOS CPU kernel of ``csrc/`` side by side: its kernel table
(csrc/bitcos-kernels-table.c), whose names ``kernel_names`` reads from the library (``generic`` first). It
comes in two builds, one per form of the contract's FMA: ``libbitcos_kernels.so`` (``BITCOS_FMA=1``, fused,
as GCC builds llama.cpp's TQ2_0 kernel for x86 with FMA) and ``libbitcos_kernels_nofma.so``
(``BITCOS_FMA=0``); every function here takes ``fma=True`` / ``fma=False`` to choose. A library is found,
in this order, at ``$BITCOS_KERNELS_LIB`` (FMA build) / ``$BITCOS_KERNELS_NOFMA_LIB``, in the installed package
(``ggml_bitcos/lib/``, put there by ``pip install .``), or in a checkout's ``build/kernels/`` after

    cmake -S . -B build/kernels -DCMAKE_BUILD_TYPE=Release && cmake --build build/kernels

A kernel reads rows of one BITCOS matrix as ``BitcosRows``: the weight's rows (bitmaps; v1 G128 with its fp16
scale after every 128 weights), the companion's sign pool, each row's first sign position and the scales of
its variant (FORMAT.md §4.2). ``BitcosRows.descriptor`` turns them into the C descriptor ``bitcos_rows``
(csrc/bitcos-kernels.h: unit stride, row scales or block scales with their stride and granularity) the way
the CPU glue does for a loaded tensor. ``encode_rows`` makes them with the reference codec
(``codec.encode``), so the kernels are tested on exactly the bytes a converted file holds. The activations are Q8_K
(``ggml_bitcos.q8k``); the independent numpy reference of the kernels' arithmetic is ``ggml_bitcos.contract``.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

import numpy as np

from . import codec
from .format import BITMAP_BYTES, QK, Variant
from .q8k import Q8K_DTYPE, as_q8k, n_blocks

HARNESS_ABI: Final = 5  # bitcos_h_abi() of a library with these entry points (csrc/bitcos-harness.c)
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
            if hasattr(lib, "bitcos_h_abi") and lib.bitcos_h_abi() == HARNESS_ABI:
                break
            stale.append(str(path))  # a build of other entry points (before the v2 descriptor): skip it
    else:
        searched = ", ".join(str(p) for p in library_candidates(fma))
        raise KernelLibraryNotFound(
            f"{_LIB_NAMES[fma]} not found (searched {searched}"
            + (f"; outdated builds skipped: {', '.join(stale)}" if stale else "")
            + "); build it with "
            "`cmake -S . -B build/kernels -DCMAKE_BUILD_TYPE=Release && cmake --build build/kernels` "
            "in the repository, or `pip install .`"
        )
    vp, i64, i32, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
    # impl, then the descriptor (k, bits, unit_bytes, row_bytes, pool, sign_pos, row_scale, block_scale,
    # scale_stride, scale_row_bytes, block_scale_shift), nr, y, nc, dst
    call_args = [i32, i64, vp, sz, sz, vp, vp, vp, vp, sz, sz, i32, i64, vp, i64, vp]
    lib.bitcos_h_kernel_count.argtypes = []
    lib.bitcos_h_kernel_count.restype = i32
    lib.bitcos_h_kernel_name.argtypes = [i32]
    lib.bitcos_h_kernel_name.restype = ctypes.c_char_p
    lib.bitcos_h_available.argtypes = [i32]
    lib.bitcos_h_available.restype = i32
    lib.bitcos_h_covers.argtypes = call_args
    lib.bitcos_h_covers.restype = i32
    lib.bitcos_h_mm.argtypes = call_args
    lib.bitcos_h_mm.restype = i32
    lib.bitcos_h_time.argtypes = call_args + [i32, vp]
    lib.bitcos_h_time.restype = i32
    lib.bitcos_h_q8k_size.argtypes = []
    lib.bitcos_h_q8k_size.restype = sz
    lib.bitcos_h_fma.argtypes = []
    lib.bitcos_h_fma.restype = i32
    # the codes form: decode (fast, the descriptor, i0, i1, codes, codes_row_bytes), kernels (impl, k, codes,
    # codes_row_bytes, row_scale, block_scale, scale_stride, scale_row_bytes, block_scale_shift, nr, y, nc, dst)
    lib.bitcos_h_has_codes.argtypes = [i32]
    lib.bitcos_h_has_codes.restype = i32
    lib.bitcos_h_codes_decode_fast.argtypes = []
    lib.bitcos_h_codes_decode_fast.restype = i32
    lib.bitcos_h_codes_decode.argtypes = [i32, i64, vp, sz, sz, vp, vp, vp, vp, sz, sz, i32, i64, i64, vp, sz]
    lib.bitcos_h_codes_decode.restype = i32
    lib.bitcos_h_codes_copy_block_scales.argtypes = [i64, vp, sz, sz, vp, vp, vp, sz, sz, i32, i64, i64, vp]
    lib.bitcos_h_codes_copy_block_scales.restype = i32
    codes_args = [i32, i64, vp, sz, vp, vp, sz, sz, i32, i64, vp, i64, vp]
    lib.bitcos_h_codes_mm.argtypes = codes_args
    lib.bitcos_h_codes_mm.restype = i32
    lib.bitcos_h_codes_time.argtypes = codes_args + [i32, vp]
    lib.bitcos_h_codes_time.restype = i32
    # the form decision (csrc/bitcos-form.h)
    f64, f64p = ctypes.c_double, ctypes.POINTER(ctypes.c_double)
    lib.bitcos_h_form_choose.argtypes = [f64, f64, f64, i32, f64, f64, f64p]
    lib.bitcos_h_form_choose.restype = i32
    lib.bitcos_h_form_physical_cores.argtypes = []
    lib.bitcos_h_form_physical_cores.restype = i32
    lib.bitcos_h_form_measure_beta.argtypes = [i32, f64]
    lib.bitcos_h_form_measure_beta.restype = f64
    lib.bitcos_h_form_beta_cached.argtypes = [i32, ctypes.POINTER(i32)]
    lib.bitcos_h_form_beta_cached.restype = f64
    lib.bitcos_h_form_measure_gamma.argtypes = [i32, f64, f64, f64p, f64p]
    lib.bitcos_h_form_measure_gamma.restype = i32
    if lib.bitcos_h_q8k_size() != Q8K_DTYPE.itemsize:
        raise RuntimeError("block_q8_K size mismatch between the library and Q8K_DTYPE")
    if bool(lib.bitcos_h_fma()) != fma:
        raise RuntimeError(f"{path} was built with BITCOS_FMA={lib.bitcos_h_fma()}, expected {int(fma)}")
    return lib


def library_path(fma: bool = True) -> Path | None:
    """Path of the library that load_library(fma) would use, or None."""
    return next((p for p in library_candidates(fma) if p.is_file()), None)


def kernel_names(fma: bool = True) -> tuple[str, ...]:
    """Names of the kernels compiled into the harness library, in the kernel table's order (csrc/bitcos-kernels-
    table.c: "generic" first, then from the least to the most preferred). Whether this CPU can run one:
    ``available``."""
    lib = load_library(fma)
    return tuple(lib.bitcos_h_kernel_name(i).decode() for i in range(lib.bitcos_h_kernel_count()))


def kernel_index(impl: str, fma: bool = True) -> int:
    """Index of kernel `impl` in the library's table (the `impl` argument of its C entry points)."""
    names = kernel_names(fma)
    if impl not in names:
        raise KeyError(f"kernel {impl!r} is not in the harness library (it has {', '.join(names)})")
    return names.index(impl)


def available(impl: str, fma: bool = True) -> bool:
    """True when `impl` is compiled into the library and this CPU can run it."""
    names = kernel_names(fma)
    return impl in names and bool(load_library(fma).bitcos_h_available(names.index(impl)))


def best_kernel(fma: bool = True) -> str:
    """The kernel the table prefers among those this CPU can run (what the ggml glue picks on this CPU)."""
    return next(i for i in reversed(kernel_names(fma)) if available(i, fma))


@dataclass(frozen=True)
class Descriptor:
    """The fields of the C ``bitcos_rows`` (csrc/bitcos-kernels.h) for one call, with the arrays they point
    into kept alive. ``row_scale`` None selects block scales."""

    k: int
    bits: np.ndarray  # uint8 (nr, row_bytes)
    unit_bytes: int
    pool: np.ndarray
    sign_pos: np.ndarray
    row_scale: np.ndarray | None  # float32 (nr,)
    block_scale: np.ndarray | None  # the array holding the block scales
    block_scale_offset: int  # byte offset of row 0's first scale in block_scale
    scale_stride: int
    scale_row_bytes: int
    block_scale_shift: int

    def args(self) -> tuple:
        """The descriptor's arguments of bitcos_h_mm / bitcos_h_time, in order."""
        bs = None if self.block_scale is None else _ptr(self.block_scale) + self.block_scale_offset
        rs = None if self.row_scale is None else _ptr(self.row_scale)
        return (
            self.k,
            _ptr(self.bits),
            self.unit_bytes,
            self.bits.shape[1],
            _ptr(self.pool),
            _ptr(self.sign_pos),
            rs,
            bs,
            self.scale_stride,
            self.scale_row_bytes,
            self.block_scale_shift,
        )


@dataclass(frozen=True)
class BitcosRows:
    """The arrays a kernel reads for nr rows of one BITCOS matrix (FORMAT.md §3, §4.2 - §4.4)."""

    variant: Variant
    k: int
    blocks: np.ndarray  # uint8 (nr, row bytes): the weight's rows (G128: bits[16] + fp16 d per 128; else K/8 bitmap)
    pool: np.ndarray  # uint8: sign bits of all rows back to back, zero tail >= 64 bytes
    sign_pos: np.ndarray  # uint64 (nr,): pool bit of each row's first sign
    scale: float = 1.0  # PT / MATRIX: the matrix's scale (ignored by the other variants)
    row_scales: np.ndarray | None = None  # ROW: float32 (nr,) (PT / MATRIX: overrides `scale` when given)
    block_scales: np.ndarray | None = None  # B128 / B256: fp16 (nr, k / scale_block) (G128: in `blocks`)

    @property
    def nr(self) -> int:
        return int(self.blocks.shape[0])

    def rows(self, lo: int, hi: int) -> BitcosRows:
        """Rows lo .. hi of the run, with the same sign pool (how a ggml thread sees its share of a matrix)."""
        return replace(
            self,
            blocks=self.blocks[lo:hi],
            sign_pos=self.sign_pos[lo:hi],
            row_scales=None if self.row_scales is None else self.row_scales[lo:hi],
            block_scales=None if self.block_scales is None else self.block_scales[lo:hi],
        )

    def descriptor(self) -> Descriptor:
        """The C descriptor of these rows (csrc/bitcos-kernels.h ``bitcos_rows``), built as the CPU glue does:
        v1 G128 reads its scales inside the blocks (stride 18, after each 16-byte bitmap); B128 / B256 from the
        companion's fp16 array (stride 2, a scale per 128 or per 256 weights); PT / MATRIX repeat the matrix's
        fp32 scale per row, ROW has its own."""
        v = Variant(self.variant)
        nr = self.nr
        unit_bytes = v.block_bytes if v is Variant.G128 else BITMAP_BYTES
        bits = np.ascontiguousarray(self.blocks, dtype=np.uint8)
        if bits.ndim != 2 or bits.shape[1] < self.k // 8:
            raise ValueError(f"blocks must be uint8 (rows, >= {self.k // 8}) for k = {self.k}")
        sign_pos = np.ascontiguousarray(self.sign_pos, dtype=np.uint64)
        if not v.scale_block:
            rs = (
                np.full(nr, self.scale, dtype=np.float32)
                if self.row_scales is None
                else np.ascontiguousarray(self.row_scales, dtype=np.float32).reshape(nr)
            )
            return Descriptor(self.k, bits, unit_bytes, self.pool, sign_pos, rs, None, 0, 0, 0, 0)
        shift = (v.scale_block // QK).bit_length() - 1  # 128 -> 0, 256 -> 1
        if v is Variant.G128:
            return Descriptor(
                self.k,
                bits,
                unit_bytes,
                self.pool,
                sign_pos,
                None,
                bits,
                BITMAP_BYTES,
                v.block_bytes,
                bits.shape[1],
                shift,
            )
        e = np.ascontiguousarray(np.asarray(self.block_scales).astype("<f2").reshape(nr, self.k // v.scale_block))
        return Descriptor(self.k, bits, unit_bytes, self.pool, sign_pos, None, e, 0, e.itemsize, e.strides[0], shift)

    @classmethod
    def from_encoded(cls, enc: codec.Encoded) -> BitcosRows:
        """The kernel's view of a one-matrix encoding: its weight rows, and from the companion the sign pool
        (with the format's zero tail), the row index resolved to sign positions and the scales section."""
        hdr = enc.header
        if hdr.n_mats != 1:
            raise ValueError(f"the harness takes one matrix, the encoding has {hdr.n_mats}")
        v = Variant(enc.variant)
        k, nr = hdr.n_cols, hdr.n_rows
        scale, row_scales, block_scales = 1.0, None, None
        comp, off = enc.companion, hdr.scales_offset
        if v in (Variant.PT, Variant.MATRIX):
            scale = float(comp[off : off + 4].view("<f4")[0])
        elif v is Variant.ROW:
            row_scales = comp[off : off + 4 * nr].view("<f4")
        elif v is not Variant.G128:
            block_scales = comp[off : off + v.scales_bytes(k, nr, 1)].view("<f2").reshape(nr, k // v.scale_block)
        return cls(
            v,
            k,
            enc.blocks,
            codec.sign_pool(comp, hdr),
            codec.sign_positions(comp, hdr),
            scale,
            row_scales,
            block_scales,
        )


def encode_rows(
    codes: np.ndarray,
    variant: Variant,
    *,
    block_scales: np.ndarray | None = None,
    scale: float = 1.0,
    row_scales: np.ndarray | None = None,
) -> BitcosRows:
    """``BitcosRows`` of ternary codes int8 (nr, k) in {-1, 0, 1}, encoded by ``codec.encode`` as one matrix:
    G128 / B128 / B256 with ``block_scales`` (float16-castable (nr, k / scale_block), >= 0), PT / MATRIX with
    the matrix scale ``scale`` (>= 0), ROW with ``row_scales`` (nr,)."""
    v = Variant(variant)
    if v.scale_block:
        enc = codec.encode(codes, v, block_scales=block_scales)
    elif v is Variant.ROW:
        enc = codec.encode(codes, v, row_scales=row_scales)
    else:
        enc = codec.encode(codes, v, matrix_scales=np.array([scale], np.float32))
    return BitcosRows.from_encoded(enc)


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def mm(impl: str, w: BitcosRows, y: np.ndarray, fma: bool = True) -> np.ndarray:
    """dst (nc, nr) float32 from kernel `impl` of the given FMA form (raises if unavailable)."""
    lib = load_library(fma)
    y = as_q8k(y, w.k)
    nc = y.shape[0]
    dst = np.full((nc, w.nr), np.nan, dtype=np.float32)
    d = w.descriptor()
    rc = lib.bitcos_h_mm(kernel_index(impl, fma), *d.args(), w.nr, _ptr(y), nc, _ptr(dst))
    if rc != 0:
        raise RuntimeError(f"bitcos_h_mm({impl}) failed: {rc} ({'unavailable' if rc == -1 else 'bad arguments'})")
    return dst


def covers(impl: str, w: BitcosRows, fma: bool = True) -> bool:
    """True when kernel `impl` runs w's layout on its own paths; False when the kernel table sends it to the
    generic kernel instead (and says so once on stderr when it runs)."""
    lib = load_library(fma)
    y = np.zeros((1, n_blocks(w.k)), dtype=Q8K_DTYPE)
    dst = np.empty((1, w.nr), dtype=np.float32)
    rc = lib.bitcos_h_covers(kernel_index(impl, fma), *w.descriptor().args(), w.nr, _ptr(y), 1, _ptr(dst))
    if rc < 0:
        raise RuntimeError(f"bitcos_h_covers({impl}) failed: {rc}")
    return bool(rc)


def time_mm(impl: str, w: BitcosRows, y: np.ndarray, reps: int, fma: bool = True) -> np.ndarray:
    """TSC ticks of `reps` back-to-back kernel calls (timed in C after one warm-up call)."""
    lib = load_library(fma)
    y = as_q8k(y, w.k)
    nc = y.shape[0]
    dst = np.empty((nc, w.nr), dtype=np.float32)
    ticks = np.zeros(reps, dtype=np.uint64)
    d = w.descriptor()
    rc = lib.bitcos_h_time(kernel_index(impl, fma), *d.args(), w.nr, _ptr(y), nc, _ptr(dst), reps, _ptr(ticks))
    if rc != 0:
        raise RuntimeError(f"bitcos_h_time({impl}) failed: {rc}")
    return ticks


# ------------------------------------------------------------------------------------------ the 2-bit codes form
CODES_BLOCK_BYTES: Final = 64  # bytes of codes per 256 weights (BITCOS_CODES_BLOCK_BYTES)


def codes_row_bytes(k: int) -> int:
    """Bytes of one row of codes (csrc/bitcos-kernels.h bitcos_codes_row_bytes)."""
    return n_blocks(k) * CODES_BLOCK_BYTES


@dataclass(frozen=True)
class CodesRows:
    """nr rows of one weight in the 2-bit codes form (csrc/bitcos-kernels.h ``bitcos_codes_rows``): the codes,
    uint8 (nr, >= codes_row_bytes(k)), and the scales of the BITCOS descriptor they were decoded from."""

    k: int
    codes: np.ndarray
    scales: Descriptor  # its row_scale / block_scale fields are the codes' scales

    @property
    def nr(self) -> int:
        return int(self.codes.shape[0])

    def args(self) -> tuple:
        """The descriptor's arguments of bitcos_h_codes_mm / bitcos_h_codes_time, in order."""
        d = self.scales
        bs = None if d.block_scale is None else _ptr(d.block_scale) + d.block_scale_offset
        rs = None if d.row_scale is None else _ptr(d.row_scale)
        return (
            self.k,
            _ptr(self.codes),
            self.codes.shape[1],
            rs,
            bs,
            d.scale_stride,
            d.scale_row_bytes,
            d.block_scale_shift,
        )


def has_codes(impl: str, fma: bool = True) -> bool:
    """True when kernel `impl` has a codes-form kernel of its own (the table runs the portable one otherwise)."""
    return bool(load_library(fma).bitcos_h_has_codes(kernel_index(impl, fma)))


def codes_decode_fast(fma: bool = True) -> bool:
    """True when the library's bitcos_codes_decode runs its fast (BMI2) path on this CPU."""
    return bool(load_library(fma).bitcos_h_codes_decode_fast())


def decode_codes(w: BitcosRows, fast: bool = True, fma: bool = True) -> CodesRows:
    """The codes form of w: bitcos_codes_decode (``fast``: the fastest path here) or the generic C decode."""
    lib = load_library(fma)
    d = w.descriptor()
    codes = np.full((w.nr, codes_row_bytes(w.k)), 0xEE, dtype=np.uint8)  # every byte written by the decode
    rc = lib.bitcos_h_codes_decode(int(fast), *d.args(), 0, w.nr, _ptr(codes), codes.shape[1])
    if rc != 0:
        raise RuntimeError(f"bitcos_h_codes_decode failed: {rc}")
    return CodesRows(w.k, codes, d)


def compact_block_scales(w: BitcosRows, fma: bool = True) -> np.ndarray:
    """bitcos_codes_copy_block_scales: w's fp16 block scales as uint8 (nr, 2 * scales per row), back to back."""
    lib = load_library(fma)
    d = w.descriptor()
    if d.block_scale is None:
        raise ValueError("compact_block_scales needs block scales")
    per_row = ((w.k + QK - 1) // QK) >> d.block_scale_shift
    out = np.zeros((w.nr, 2 * per_row), dtype=np.uint8)
    rc = lib.bitcos_h_codes_copy_block_scales(
        *d.args()[:6], _ptr(d.block_scale) + d.block_scale_offset, *d.args()[8:], 0, w.nr, _ptr(out)
    )
    if rc != 0:
        raise RuntimeError(f"bitcos_h_codes_copy_block_scales failed: {rc}")
    return out


def codes_mm(impl: str, w: CodesRows, y: np.ndarray, fma: bool = True) -> np.ndarray:
    """dst (nc, nr) float32 from kernel `impl`'s codes kernel through the table (bitcos_kernel_codes_mm)."""
    lib = load_library(fma)
    y = as_q8k(y, w.k)
    nc = y.shape[0]
    dst = np.full((nc, w.nr), np.nan, dtype=np.float32)
    rc = lib.bitcos_h_codes_mm(kernel_index(impl, fma), *w.args(), w.nr, _ptr(y), nc, _ptr(dst))
    if rc != 0:
        raise RuntimeError(f"bitcos_h_codes_mm({impl}) failed: {rc}")
    return dst


def time_codes_mm(impl: str, w: CodesRows, y: np.ndarray, reps: int, fma: bool = True) -> np.ndarray:
    """TSC ticks of `reps` back-to-back codes-kernel calls (timed in C after one warm-up call)."""
    lib = load_library(fma)
    y = as_q8k(y, w.k)
    nc = y.shape[0]
    dst = np.empty((nc, w.nr), dtype=np.float32)
    ticks = np.zeros(reps, dtype=np.uint64)
    rc = lib.bitcos_h_codes_time(kernel_index(impl, fma), *w.args(), w.nr, _ptr(y), nc, _ptr(dst), reps, _ptr(ticks))
    if rc != 0:
        raise RuntimeError(f"bitcos_h_codes_time({impl}) failed: {rc}")
    return ticks


# ------------------------------------------------------------------------------------------ the form decision
FORM_NAMES: Final = ("bitcos", "codes")  # enum bitcos_form (csrc/bitcos-form.h)
FORM_MARGIN: Final = 0.05  # BITCOS_FORM_MARGIN


def form_choose(
    gamma_bitcos: float, gamma_codes: float, beta_thread: float, n_threads: int, z: float, scale_bits: float = 0.0
) -> dict:
    """bitcos_form_choose: the roofline per form, T = bytes / beta_thread + gamma in ns per 32 weights per thread
    (gamma in ns per 32 weights, beta in GB/s per thread); "codes" only when T_bitcos > 1.05 T_codes.
    Keys: form ("bitcos" / "codes"), bytes_bitcos, bytes_codes (per 32 weights), t_bitcos, t_codes."""
    out = (ctypes.c_double * 4)()
    form = load_library().bitcos_h_form_choose(
        gamma_bitcos,
        gamma_codes,
        beta_thread,
        n_threads,
        z,
        scale_bits,
        ctypes.cast(out, ctypes.POINTER(ctypes.c_double)),
    )
    keys = ("bytes_bitcos", "bytes_codes", "t_bitcos", "t_codes")
    return {"form": FORM_NAMES[form], **dict(zip(keys, out, strict=True))}


def form_physical_cores() -> int:
    """bitcos_form_physical_cores: distinct (package, core) pairs of the online CPUs (llama.cpp's default threads)."""
    return int(load_library().bitcos_h_form_physical_cores())


def form_measure_beta(n_threads: int, seconds: float = 0.1) -> float:
    """bitcos_form_measure_beta: streaming-read GB/s per thread while n_threads threads stream together."""
    return float(load_library().bitcos_h_form_measure_beta(n_threads, seconds))


def form_beta_cached(n_threads: int) -> tuple[float, bool]:
    """bitcos_form_beta_cached: (GB/s per thread, whether it measured now) from $GGML_BITCOS_BETA, the cache file
    cpu-bandwidth-v2.txt in $GGML_BITCOS_CACHE_DIR / $XDG_CACHE_HOME/ggml-bitcos / ~/.cache/ggml-bitcos, or a
    measurement (appended to that file)."""
    measured = ctypes.c_int(0)
    gbs = load_library().bitcos_h_form_beta_cached(n_threads, ctypes.byref(measured))
    return float(gbs), bool(measured.value)


def form_measure_gamma(kernel_name: str, z: float, seconds: float = 0.02) -> tuple[float, float]:
    """bitcos_form_measure_gamma: (gamma_bitcos, gamma_codes) in ns per 32 weights of kernel `kernel_name` on the
    64 x 2048 cache-resident tile at zero density z, one column, min over ~2 ms repeats for about `seconds`."""
    gb, gc = ctypes.c_double(), ctypes.c_double()
    rc = load_library().bitcos_h_form_measure_gamma(
        kernel_index(kernel_name), z, seconds, ctypes.byref(gb), ctypes.byref(gc)
    )
    if rc != 0:
        raise RuntimeError(f"kernel {kernel_name!r} is not available on this CPU")
    return gb.value, gc.value
