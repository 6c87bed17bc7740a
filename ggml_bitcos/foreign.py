"""Ternary GGUF tensor types of other llama.cpp lines, read and written in numpy (docs/FORMAT.md, "Input
formats", has the layouts and where each fact comes from).

| type | id | block | bytes | scale | this project's llama.cpp loads it |
|---|---|---|---|---|---|
| ``I2_S`` (bitnet.cpp) | 36 | 128 | 32 per block + a 32-byte tensor tail | one fp32 per tensor, in the tail | no |
| ``Q2_0`` (upstream ggml, from Prism ML) | 42 | 64 | 18 | fp16 per 64 | yes |
| ``PQ2_0`` (Prism ML fork) | 142 | 128 | 34 | fp16 per 128 | no |
| ``PTQ1_0`` (Prism ML fork) | 143 | 128 | 28 | fp16 per 128 | no |

Every type decodes to ``x = fp32(code) * fp32(scale)``, one fp32 multiplication, exactly as each source's
own dequantizer computes it; the converter (``convert.source_float_rows``) reads these floats and decides
the BITCOS variant from them like for any other source (FORMAT.md §7): I2_S always fits MATRIX (PT in
version 1; one scale per tensor), PQ2_0 and PTQ1_0 fit B128 (G128; a coarser variant when their block scales
agree), Q2_0 fits MATRIX, ROW or B128 when its per-64 scales agree at that granularity (else it stays Q2_0,
which llama.cpp runs).

Per type: ``*_decode(raw)`` -> (codes int8 (R, K), scales at the source's granularity, exact), and
``*_encode(codes, scales)`` the inverse, written from the layout description rather than from the decoder
(the tests write files with the encoders and check them against a third, element-by-element dequantizer).
Q2_0 and PQ2_0 codes are in {-1, 0, 1, 2} (code 2 means +2·d: not ternary); I2_S code 3 has no meaning in
bitnet.cpp's quantizer and reads as NaN here, so such a tensor is never taken for ternary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

I2_S: Final = 36
Q2_0: Final = 42
PQ2_0: Final = 142
PTQ1_0: Final = 143

I2_S_BLOCK: Final = 128          # weights per I2_S block (bitnet.cpp's x86 layout; its dequantizer's layout)
I2_S_TAIL: Final = 32            # bytes after the packed codes: fp32 scale, then zeros (alignment)
HADAMARD_KEY_PREFIX: Final = "prism.hadamard."   # Prism's rotated-basis models: need a runtime transform


@dataclass(frozen=True)
class ForeignType:
    name: str
    type_id: int
    block: int            # weights per block
    block_bytes: int      # bytes per block (I2_S: per 128 weights, without the tensor tail)
    loadable: bool        # this project's llama.cpp (upstream 0c1e570 + patches) loads tensors of this type
    scale: str            # the scale granularity, in words


FOREIGN_TYPES: Final[dict[int, ForeignType]] = {ft.type_id: ft for ft in (
    ForeignType("I2_S", I2_S, I2_S_BLOCK, 32, False, "one fp32 per tensor"),
    ForeignType("Q2_0", Q2_0, 64, 18, True, "fp16 per 64 weights"),
    ForeignType("PQ2_0", PQ2_0, 128, 34, False, "fp16 per 128 weights"),
    ForeignType("PTQ1_0", PTQ1_0, 128, 28, False, "fp16 per 128 weights"),
)}


# --- 2-bit codes: Q2_0 / PQ2_0 ----------------------------------------------------------------------
# block: fp16 d, then qs[block/4]; weight j is bits 2(j%4)..2(j%4)+1 of qs[j/4]; code = field - 1

def _q2_decode(raw: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    raw = np.asarray(raw).view(np.uint8)
    rows = raw.shape[0] if raw.ndim == 2 else 1
    bb = 2 + block // 4
    blk = raw.reshape(rows, -1, bb)
    nblk = blk.shape[1]
    d = np.ascontiguousarray(blk[:, :, :2]).view("<f2").reshape(rows, nblk)
    qs = blk[:, :, 2:]                                               # (rows, nblk, block/4)
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
    f = (codes + 1).astype(np.uint8).reshape(rows, nblk, block // 4, 4)    # weight 4b + i -> field i of byte b
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

_PTQ1_GROUPS: Final = ((0, 16, 5, 0), (16, 24, 5, 80), (24, 26, 4, 120))   # (byte lo, hi, digits, first weight)


def ptq1_0_decode(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PTQ1_0 rows (R, K/128*28) -> (codes int8 in {-1,0,1} (R, K), d fp16 (R, K/128))."""
    raw = np.asarray(raw).view(np.uint8)
    rows = raw.shape[0] if raw.ndim == 2 else 1
    blk = raw.reshape(rows, -1, 28)
    nblk = blk.shape[1]
    codes = np.empty((rows, nblk, 128), dtype=np.int8)
    for lo, hi, nd, first in _PTQ1_GROUPS:
        b = blk[:, :, lo:hi].astype(np.uint16)                           # (rows, nblk, c)
        pw = (3 ** np.arange(nd, dtype=np.uint16)).reshape(nd, 1)
        digit = ((((b[:, :, None, :] * pw) & 0xFF) * 3) >> 8)            # (rows, nblk, nd, c)
        codes[:, :, first:first + nd * (hi - lo)] = digit.reshape(rows, nblk, -1).astype(np.int8) - 1
    d = np.ascontiguousarray(blk[:, :, 26:28]).view("<f2").reshape(rows, nblk)
    return codes.reshape(rows, nblk * 128), d


def ptq1_0_encode(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    codes = np.asarray(codes, dtype=np.int8)
    rows, k = codes.shape
    if k % 128 or np.any(np.abs(codes) > 1):
        raise ValueError("PTQ1_0 codes must be in -1..1 and rows a multiple of 128")
    nblk = k // 128
    t = (codes + 1).astype(np.uint16).reshape(rows, nblk, 128)          # digits 0..2
    out = np.empty((rows, nblk, 28), dtype=np.uint8)
    for lo, hi, nd, first in _PTQ1_GROUPS:
        c = hi - lo
        v = np.zeros((rows, nblk, c), dtype=np.uint16)
        for n in range(nd):                                              # most significant digit first
            v = v * 3 + t[:, :, first + n * c: first + (n + 1) * c]
        v = v * (3 ** (5 - nd))                                          # qh: pad with a zero lowest digit
        out[:, :, lo:hi] = ((v * 256 + 242) // 243).astype(np.uint8)
    out[:, :, 26:28] = np.asarray(d, dtype="<f2").reshape(rows, nblk, 1).view(np.uint8)
    return out.reshape(rows, -1)


# --- I2_S: bitnet.cpp -----------------------------------------------------------------------------
# The whole tensor's weights, flattened row after row, in blocks of 128: block i is bytes 32i..32i+31;
# weight 32g + p of a block is bits 6-2g..7-2g of byte p (g = 0 in the top bits). Code = field - 1
# (field 3 is unused). After the n/4 bytes of codes: a 32-byte tail whose first 4 bytes are the fp32 scale.

def i2_s_decode(packed: np.ndarray, scale: float, k: int) -> tuple[np.ndarray, np.float32]:
    """I2_S codes of a whole tensor (n/4 bytes, tail excluded) -> (codes int8 (n/k, k), fp32 scale).

    Field 3 (never written by bitnet.cpp) decodes to code 2, which no ternary check accepts."""
    b = np.asarray(packed).view(np.uint8).reshape(-1, I2_S_BLOCK // 4)             # (blocks, 32)
    fields = (b[:, None, :] >> np.array([6, 4, 2, 0], dtype=np.uint8).reshape(1, 4, 1)) & np.uint8(3)
    codes = fields.reshape(-1).view(np.int8) - np.int8(1)                          # weight 32g + p
    return codes.reshape(-1, k), np.float32(scale)


def i2_s_encode(codes: np.ndarray, scale: float) -> np.ndarray:
    """Codes (R, K) in {-1,0,1} and the tensor's scale -> the tensor's bytes: n/4 code bytes + 32-byte tail."""
    codes = np.asarray(codes, dtype=np.int8)
    n = codes.size
    if n % I2_S_BLOCK or np.any(np.abs(codes) > 1):
        raise ValueError("I2_S codes must be in -1..1 and the tensor a multiple of 128 weights")
    f = (codes.reshape(-1, 4, 32) + 1).astype(np.uint8)                            # (blocks, group g, pos p)
    packed = (f[:, 0] << 6) | (f[:, 1] << 4) | (f[:, 2] << 2) | f[:, 3]
    tail = np.zeros(I2_S_TAIL, dtype=np.uint8)
    tail[:4] = np.frombuffer(np.float32(scale).tobytes(), dtype=np.uint8)
    return np.concatenate([packed.reshape(-1), tail])


def i2_s_nbytes(n_weights: int) -> int:
    """Bytes of an I2_S tensor's data in a GGUF file (bitnet.cpp's ggml_nbytes: n/4 + 32)."""
    return n_weights // 4 + I2_S_TAIL


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
    return np.frombuffer(fmap[at:at + 4].tobytes(), dtype="<f4")[0]


def _float(codes: np.ndarray, scales: np.ndarray, group: int) -> np.ndarray:
    """fp32(code) * fp32(scale of the code's group): each source's dequantization, one multiplication."""
    rows, k = codes.shape
    x = codes.astype(np.float32).reshape(rows, k // group, group)
    x *= np.asarray(scales).astype(np.float32).reshape(rows, k // group, 1)
    return x.reshape(rows, k)


def float_rows(t, raw_rows: np.ndarray, start: int, stop: int) -> np.ndarray:
    """fp32 values of rows [start, stop) of a foreign-type tensor ``t`` (gguf-py ReaderTensor), exactly as
    its source's dequantizer computes them; ``raw_rows`` are those rows' bytes (R, bytes per row)."""
    tt = int(t.tensor_type)
    if tt == Q2_0:
        return _float(*q2_0_decode(raw_rows), 64)
    if tt == PQ2_0:
        return _float(*pq2_0_decode(raw_rows), 128)
    if tt == PTQ1_0:
        return _float(*ptq1_0_decode(raw_rows), 128)
    if tt == I2_S:
        k = int(t.shape[0])
        if k % I2_S_BLOCK:          # blocks run over the flattened tensor and straddle rows: decode it all
            codes, scale = i2_s_decode(np.asarray(t.data).reshape(-1), i2_s_scale(t), k)
            codes = codes[start:stop]
        else:
            codes, scale = i2_s_decode(raw_rows, i2_s_scale(t), k)
        x = codes.astype(np.float32) * scale
        x[codes > 1] = np.nan                                  # field 3: not a ternary weight
        return x
    raise ValueError(f"not a foreign ternary type: {tt}")


# --- the converter's policy ------------------------------------------------------------------------

def must_convert(type_id: int) -> bool:
    """A tensor of this type must become BITCOS: this project's llama.cpp cannot load it as it is (so a
    BITCOS form larger than the source is still taken: the source form does not run here at all)."""
    ft = FOREIGN_TYPES.get(int(type_id))
    return ft is not None and not ft.loadable


def explain(t, result) -> None:
    """Make the reason of an unconverted foreign-type tensor ``t`` (its ``convert.TensorResult``) say what
    the source layout holds and why BITCOS cannot hold it exactly."""
    ft = FOREIGN_TYPES.get(int(t.tensor_type))
    if ft is None or result.converted or result.grow_kept or not result.reason.startswith(
            ("not ternary", "no variant holds")):
        return
    raw = np.asarray(t.data).view(np.uint8)
    rows = math.prod(int(x) for x in t.shape[1:])
    if ft.type_id in (Q2_0, PQ2_0):
        codes, d = _q2_decode(raw.reshape(rows, -1), ft.block)
        if np.any(codes == 2):
            result.ternary_looking = False
            result.reason = f"not ternary: {ft.name} code 3 (+2·d) present"
        elif not np.all(np.isfinite(d)):
            result.ternary_looking = False
            result.reason = f"not ternary: non-finite {ft.name} block scale"
        elif ft.type_id == Q2_0:
            result.ternary_looking = True
            result.reason = ("Q2_0 block scales (fp16 per 64 weights) differ between the two halves of a "
                             "128-weight block and within rows: no BITCOS variant (one scale per matrix, per "
                             "row, per 256 or per 128 weights) holds them exactly; kept as Q2_0, which "
                             "llama.cpp runs")
    elif ft.type_id == I2_S:
        result.reason = "not ternary: I2_S field 3 (never written by bitnet.cpp) or a non-finite scale"
    elif ft.type_id == PTQ1_0:
        result.reason = "not ternary: non-finite PTQ1_0 block scale"


def source_problem(reader) -> str | None:
    """A reason the source cannot be converted to a file this llama.cpp runs correctly, before any work."""
    for key in reader.fields:
        if key.startswith(HADAMARD_KEY_PREFIX):
            return (f"metadata key '{key}': the model's weights are stored in Prism's Hadamard-rotated basis, "
                    f"which needs the activation transform of Prism's llama.cpp fork; this llama.cpp does not "
                    f"apply it, so the converted file (bit-exact weights) would compute a different model")
    return None


def unloadable_left(tensors, plan) -> str | None:
    """After analysis: the first tensor of a type this llama.cpp cannot load that stays unconverted, as one
    line (the output would not load), or None. ``tensors``: the source's gguf-py ReaderTensors; ``plan``:
    name -> (convert.TensorResult, ...) of the analyzed candidates."""
    left = []
    for t in tensors:
        if not must_convert(t.tensor_type):
            continue
        r = plan.get(t.name, (None,))[0]
        if r is not None and r.converted:
            continue
        if r is not None and r.reason:
            why = r.reason
        elif "token_embd" in t.name:
            why = "a lookup table (GET_ROWS), which BITCOS cannot serve"
        else:
            why = f"{len(t.shape)}-D (only 2-D and 3-D weights convert)"
        left.append((t, why))
    if not left:
        return None
    t, why = left[0]
    name = FOREIGN_TYPES[int(t.tensor_type)].name
    more = f" (and {len(left) - 1} more such tensor(s))" if len(left) > 1 else ""
    return (f"tensor '{t.name}' ({name}) cannot become BITCOS: {why}{more}; this llama.cpp cannot load "
            f"{name} tensors, so the output would not load and none is written")


__all__ = ["I2_S", "Q2_0", "PQ2_0", "PTQ1_0", "FOREIGN_TYPES", "ForeignType", "q2_0_decode", "q2_0_encode",
           "pq2_0_decode", "pq2_0_encode", "ptq1_0_decode", "ptq1_0_encode", "i2_s_decode", "i2_s_encode",
           "i2_s_nbytes", "i2_s_scale", "float_rows", "must_convert", "explain",
           "source_problem", "unloadable_left"]
