"""Ternary GGUF tensor types of other llama.cpp lines, read and written in numpy (docs/FORMAT.md §7.1 has the
layouts, the forms of each type that are read, and where each fact comes from). Their ids, block sizes and
forms are ``gguf_tools.type_table``'s (the GGUF layer sizes their tensors); this module decodes and encodes
them (the converter's policy for them is in its passes: ``passes.read`` refuses, ``passes.analyse`` decides).

Where producers disagree on what a type id means (I2_S's three layouts, Q2_0's legacy group-128 form: the
table's *forms*), the reader marks each tensor with its form (``SourceTensor.form``); every function
here that decodes or sizes a tensor goes by it.

Every type decodes to ``x = fp32(code) * fp32(scale)``, one fp32 multiplication, exactly as each source's
own dequantizer computes it; the converter (``source.source_float_rows``) reads these floats and decides
the BITCOS variant from them like for any other source (FORMAT.md §7): I2_S always fits MATRIX (PT in
version 1; one scale per tensor), PQ2_0, PTQ1_0 and legacy Q2_0 fit B128 (G128; a coarser variant when their
block scales agree), Q2_0 fits MATRIX, ROW or B128 when its per-64 scales agree at that granularity (else it
stays Q2_0, which llama.cpp runs).

Per type: ``*_decode(raw)`` -> (codes int8 (R, K), scales at the source's granularity, exact), and
``*_encode(codes, scales)`` the inverse, written from the layout description rather than from the decoder
(the tests write files with writers of their own, modelled on the original quantizers, and check them
against an element-by-element dequantizer). Q2_0 and PQ2_0 codes are in {-1, 0, 1, 2} (code 2 means +2·d:
not ternary); I2_S code 3 has no meaning in bitnet.cpp's quantizer and reads as NaN here, so such a tensor is
never taken for ternary.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np

from gguf_tools.reader import tensor_form
from gguf_tools.type_table import (
    FOREIGN_TYPES,
    I2_S,
    I2_S_TAIL,
    I2S_DEFAULT_LAYOUT,
    I2S_LAYOUTS,
    PQ2_0,
    PTQ1_0,
    Q2_0,
    Q2_0_LEGACY,
    Q2_0_LEGACY_FORM,
    ForeignType,
    foreign_type,
    form_label,
)


# --- 2-bit codes: Q2_0 / PQ2_0 ----------------------------------------------------------------------
# block: fp16 d, then qs[block/4]; weight j is bits 2(j%4)..2(j%4)+1 of qs[j/4]; code = field - 1


def _q2_decode(raw: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    raw = np.asarray(raw).view(np.uint8)
    rows = raw.shape[0] if raw.ndim == 2 else 1
    bb = 2 + block // 4
    blk = raw.reshape(rows, -1, bb)
    nblk = blk.shape[1]
    d = np.ascontiguousarray(blk[:, :, :2]).view("<f2").reshape(rows, nblk)
    qs = blk[:, :, 2:]  # (rows, nblk, block/4)
    fields = (qs[:, :, :, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & np.uint8(3)
    codes = fields.reshape(rows, nblk * block).view(np.int8) - np.int8(1)
    return codes, d


def _q2_encode(codes: np.ndarray, d: np.ndarray, block: int) -> np.ndarray:
    codes = np.asarray(codes, dtype=np.int8)
    rows, k = codes.shape
    nblk = k // block
    if k % block or np.any((codes < -1) | (codes > 2)):
        raise ValueError(f"codes must be in -1..2 and rows a multiple of {block}")
    out = np.empty((rows, nblk, 2 + block // 4), dtype=np.uint8)
    out[:, :, :2] = np.asarray(d, dtype="<f2").reshape(rows, nblk, 1).view(np.uint8)
    f = (codes + 1).astype(np.uint8).reshape(rows, nblk, block // 4, 4)  # weight 4b + i -> field i of byte b
    out[:, :, 2:] = f[..., 0] | (f[..., 1] << 2) | (f[..., 2] << 4) | (f[..., 3] << 6)
    return out.reshape(rows, -1)


def q2_0_decode(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q2_0 rows (R, K/64*18) -> (codes int8 in {-1,0,1,2} (R, K), d fp16 (R, K/64))."""
    return _q2_decode(raw, 64)


def q2_0_encode(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    return _q2_encode(codes, d, 64)


def pq2_0_decode(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PQ2_0 rows (R, K/128*34) -> (codes int8 in {-1,0,1,2} (R, K), d fp16 (R, K/128))."""
    return _q2_decode(raw, 128)


def pq2_0_encode(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    return _q2_encode(codes, d, 128)


# --- PTQ1_0: base-3 digits, TQ1_0's packing at 128 weights ---------------------------------------------
# block: qs[24], qh[2], fp16 d. Bytes hold ceil(v * 256 / 243) of a 5-digit base-3 number v (qh: 4 digits
# then one zero digit); digit n (most significant first) of byte b is ((b * 3^n mod 256) * 3) >> 8.
# qs[0:16]: weight 16n + m is digit n of byte m; qs[16:24]: weight 80 + 8n + m is digit n of byte 16 + m;
# qh: weight 120 + 2n + h is digit n of qh[h]. Code = digit - 1.

_PTQ1_GROUPS: Final = ((0, 16, 5, 0), (16, 24, 5, 80), (24, 26, 4, 120))  # (byte lo, hi, digits, first weight)


def ptq1_0_decode(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PTQ1_0 rows (R, K/128*28) -> (codes int8 in {-1,0,1} (R, K), d fp16 (R, K/128))."""
    raw = np.asarray(raw).view(np.uint8)
    rows = raw.shape[0] if raw.ndim == 2 else 1
    blk = raw.reshape(rows, -1, 28)
    nblk = blk.shape[1]
    codes = np.empty((rows, nblk, 128), dtype=np.int8)
    for lo, hi, nd, first in _PTQ1_GROUPS:
        b = blk[:, :, lo:hi].astype(np.uint16)  # (rows, nblk, c)
        pw = (3 ** np.arange(nd, dtype=np.uint16)).reshape(nd, 1)
        digit = (((b[:, :, None, :] * pw) & 0xFF) * 3) >> 8  # (rows, nblk, nd, c)
        codes[:, :, first : first + nd * (hi - lo)] = digit.reshape(rows, nblk, -1).astype(np.int8) - 1
    d = np.ascontiguousarray(blk[:, :, 26:28]).view("<f2").reshape(rows, nblk)
    return codes.reshape(rows, nblk * 128), d


def ptq1_0_encode(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    codes = np.asarray(codes, dtype=np.int8)
    rows, k = codes.shape
    if k % 128 or np.any(np.abs(codes) > 1):
        raise ValueError("PTQ1_0 codes must be in -1..1 and rows a multiple of 128")
    nblk = k // 128
    t = (codes + 1).astype(np.uint16).reshape(rows, nblk, 128)  # digits 0..2
    out = np.empty((rows, nblk, 28), dtype=np.uint8)
    for lo, hi, nd, first in _PTQ1_GROUPS:
        c = hi - lo
        v = np.zeros((rows, nblk, c), dtype=np.uint16)
        for n in range(nd):  # most significant digit first
            v = v * 3 + t[:, :, first + n * c : first + (n + 1) * c]
        v = v * (3 ** (5 - nd))  # qh: pad with a zero lowest digit
        out[:, :, lo:hi] = ((v * 256 + 242) // 243).astype(np.uint8)
    out[:, :, 26:28] = np.asarray(d, dtype="<f2").reshape(rows, nblk, 1).view(np.uint8)
    return out.reshape(rows, -1)


# --- I2_S: bitnet.cpp -----------------------------------------------------------------------------
# The n/4 code bytes of a whole tensor in one of I2S_LAYOUTS, then a 32-byte tail whose first 4 bytes are the
# fp32 scale. Field f of a weight is code f - 1 (field 3 is unused).


def i2_s_layout_problem(layout: str, n_rows: int, k: int) -> str | None:
    """Why a tensor of ``n_rows`` rows of ``k`` weights cannot be stored in ``layout`` by bitnet.cpp's
    quantizer (it would drop or misplace weights), or None."""
    if layout not in I2S_LAYOUTS:
        return f"unknown I2_S layout '{layout}' (one of {', '.join(I2S_LAYOUTS)})"
    n = n_rows * k
    if layout == "x86" and n % 128:
        return f"the x86 layout needs a multiple of 128 weights, the tensor has {n}"
    if layout == "arm" and n % 64:
        return f"the arm layout needs a multiple of 64 weights, the tensor has {n}"
    if layout == "x86-rows4" and n_rows % 4:
        return f"the x86-rows4 layout needs a multiple of 4 rows, the tensor has {n_rows}"
    return None


def _i2_s_fields(b: np.ndarray, k: int, layout: str) -> np.ndarray:
    """Fields (0..3) of the code bytes ``b`` in ``layout``, as (rows, k) in weight order."""
    shifts = np.array([6, 4, 2, 0], dtype=np.uint8)
    if layout == "x86-rows4":
        g = b.reshape(-1, 1, k)  # (row groups, 1, col)
        return ((g >> shifts.reshape(1, 4, 1)) & np.uint8(3)).reshape(-1, k)  # row 4r + i = shift 6 - 2i
    per = 32 if layout == "x86" else 16  # bytes per block
    blk = b.reshape(-1, 1, per)  # (blocks, 1, pos p)
    return ((blk >> shifts.reshape(1, 4, 1)) & np.uint8(3)).reshape(-1, k)  # weight per*g + p of a block


def i2_s_decode(
    packed: np.ndarray, scale: float, k: int, layout: str = I2S_DEFAULT_LAYOUT
) -> tuple[np.ndarray, np.float32]:
    """I2_S code bytes in ``layout`` (whole blocks / row groups, tail excluded) -> (codes int8 (rows, k), fp32
    scale). Field 3 (never written by bitnet.cpp) decodes to code 2, which no ternary check accepts."""
    b = np.asarray(packed).view(np.uint8).reshape(-1)
    codes = _i2_s_fields(b, k, layout).view(np.int8) - np.int8(1)
    return codes, np.float32(scale)


def i2_s_encode(codes: np.ndarray, scale: float, layout: str = I2S_DEFAULT_LAYOUT) -> np.ndarray:
    """Codes (R, K) in {-1,0,1} and the tensor's scale -> the tensor's bytes in ``layout``: n/4 code bytes and
    the 32-byte tail (scale first, zeros after)."""
    codes = np.asarray(codes, dtype=np.int8)
    rows, k = codes.shape
    problem = i2_s_layout_problem(layout, rows, k)
    if problem or np.any(np.abs(codes) > 1):
        raise ValueError(problem or "I2_S codes must be in -1..1")
    f = (codes + 1).astype(np.uint8)
    if layout == "x86-rows4":
        f = f.reshape(rows // 4, 4, k)  # (row group, row i, col)
        packed = (f[:, 0] << 6) | (f[:, 1] << 4) | (f[:, 2] << 2) | f[:, 3]
    else:
        per = 32 if layout == "x86" else 16
        f = f.reshape(-1, 4, per)  # (block, group g, pos p)
        packed = (f[:, 0] << 6) | (f[:, 1] << 4) | (f[:, 2] << 2) | f[:, 3]
    tail = np.zeros(I2_S_TAIL, dtype=np.uint8)
    tail[:4] = np.frombuffer(np.float32(scale).tobytes(), dtype=np.uint8)
    return np.concatenate([packed.reshape(-1), tail])


def i2_s_nbytes(n_weights: int) -> int:
    """Bytes of an I2_S tensor's data in a GGUF file (bitnet.cpp's ggml_nbytes: n/4 + 32)."""
    return FOREIGN_TYPES[I2_S].nbytes(n_weights)


# --- reading source tensors ----------------------------------------------------------------------


def _file_map(arr: np.ndarray) -> np.ndarray:
    """The whole-file memory map a gguf-py tensor view was cut from (GGUFReader maps the file at offset 0)."""
    a = arr
    while isinstance(a, np.ndarray) and not isinstance(a, np.memmap):
        a = a.base
    if not isinstance(a, np.memmap) or getattr(a, "offset", 0) != 0:
        raise ValueError("I2_S tensor is not a view of a whole-file memory map (cannot reach its scale)")
    return a.view(np.ndarray).reshape(-1).view(np.uint8)


def i2_s_scale(t) -> np.float32:
    """The fp32 scale in the tail of an I2_S gguf-py ReaderTensor (4 bytes after its n/4 code bytes)."""
    n = math.prod(int(x) for x in t.shape)
    fmap = _file_map(t.data)
    at = int(t.data_offset) + n // 4
    if at + I2_S_TAIL > fmap.size:
        raise ValueError(f"tensor '{t.name}': I2_S scale tail lies beyond the end of the file")
    return np.frombuffer(fmap[at : at + 4].tobytes(), dtype="<f4")[0]


def _float(codes: np.ndarray, scales: np.ndarray, group: int) -> np.ndarray:
    """fp32(code) * fp32(scale of the code's group): each source's dequantization, one multiplication."""
    rows, k = codes.shape
    x = codes.astype(np.float32).reshape(rows, k // group, group)
    x *= np.asarray(scales).astype(np.float32).reshape(rows, k // group, 1)
    return x.reshape(rows, k)


def _i2_s_rows(t, start: int, stop: int) -> np.ndarray:
    """Codes of rows [start, stop) of an I2_S tensor in its layout (decoding only the blocks they touch)."""
    k = int(t.shape[0])
    layout = tensor_form(t) or I2S_DEFAULT_LAYOUT
    b = np.asarray(t.data).reshape(-1).view(np.uint8)  # the n/4 code bytes
    if layout == "x86-rows4":
        g0, g1 = start // 4, -(-stop // 4)
        codes, _ = i2_s_decode(b[g0 * k : g1 * k], 0.0, k, layout)
        return codes[start - 4 * g0 : stop - 4 * g0]
    per = 128 if layout == "x86" else 64
    if k % per:  # blocks run over the flattened tensor and straddle rows: decode it all
        codes, _ = i2_s_decode(b, 0.0, k, layout)
        return codes[start:stop]
    codes, _ = i2_s_decode(b[start * k // 4 : stop * k // 4], 0.0, k, layout)
    return codes


def float_rows(t, raw_rows: np.ndarray, start: int, stop: int) -> np.ndarray:
    """fp32 values of rows [start, stop) of a foreign-type tensor ``t`` (a reader's tensor, in its form),
    exactly as its source's dequantizer computes them; ``raw_rows`` are those rows' bytes (R, bytes per row)."""
    tt = int(t.tensor_type)
    ft = foreign_type(tt, tensor_form(t))
    if ft is None:
        raise ValueError(f"not a foreign ternary type: {tt}")
    if ft.type_id in (Q2_0, PQ2_0):
        return _float(*_q2_decode(raw_rows, ft.block), ft.block)
    if tt == PTQ1_0:
        return _float(*ptq1_0_decode(raw_rows), 128)
    codes = _i2_s_rows(t, start, stop)
    x = codes.astype(np.float32) * i2_s_scale(t)
    x[codes > 1] = np.nan  # field 3: not a ternary weight
    return x


__all__ = [
    "I2_S",
    "Q2_0",
    "PQ2_0",
    "PTQ1_0",
    "FOREIGN_TYPES",
    "ForeignType",
    "I2S_LAYOUTS",
    "I2S_DEFAULT_LAYOUT",
    "Q2_0_LEGACY",
    "Q2_0_LEGACY_FORM",
    "foreign_type",
    "tensor_form",
    "form_label",
    "q2_0_decode",
    "q2_0_encode",
    "pq2_0_decode",
    "pq2_0_encode",
    "ptq1_0_decode",
    "ptq1_0_encode",
    "i2_s_layout_problem",
    "i2_s_decode",
    "i2_s_encode",
    "i2_s_nbytes",
    "i2_s_scale",
    "float_rows",
]
