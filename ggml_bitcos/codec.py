"""Numpy reference codec for BITCOS tensors (docs/FORMAT.md v1), TQ1_0/TQ2_0 readers and writers,
and exact-ternary detection (FORMAT.md §7).

Everything here works on whole arrays (no per-weight Python loops):

* ``encode(codes, ...)``  ternary codes int8 (R, K) + scales -> ``Encoded(blocks, companion)``
* ``decode(blocks, companion, ...)`` -> ``Decoded(codes, block_scales | matrix_scales)``;
  ``Decoded.to_float()`` -> float32 exactly as FORMAT.md §5 (one fp32 multiplication per weight)
* ``tq1_0_decode`` / ``tq2_0_decode`` -> (codes, fp16 scale per 256); ``tq*_encode`` the inverse
* ``analyze_ternary(x)`` -> which variants represent float32 values exactly, with codes and scales

Shapes: a weight with ggml shape [K, N] or [K, N, E] is handled as R = N·E rows of K weights, M = E
matrices of N rows each (numpy order (E, N, K) reshaped to (R, K)).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Final

import numpy as np

QK: Final = 128                      # weights per BITCOS block
QK_K: Final = 256                    # weights per TQ1_0/TQ2_0 block
VARIANT_G128: Final = 0
VARIANT_PT: Final = 1
VARIANT_NAMES: Final = {VARIANT_G128: "G128", VARIANT_PT: "PT"}
TYPE_IDS: Final = {VARIANT_G128: 160, VARIANT_PT: 161}
BLOCK_BYTES: Final = {VARIANT_G128: 18, VARIANT_PT: 16}
MAGIC: Final = 0x53435442            # bytes "BTCS"
VERSION: Final = 1
HEADER_BYTES: Final = 128
SECTION_ALIGN: Final = 64
POOL_TAIL: Final = 64
MAX_ROW_GROUP_LOG2: Final = 6
MAX_WEIGHT_NAME: Final = 56          # companion name = weight name + ".bitcos" must fit GGML_MAX_NAME-1
COMPANION_SUFFIX: Final = ".bitcos"

TQ1_0_BLOCK_BYTES: Final = 54        # qs[48] qh[4] d
TQ2_0_BLOCK_BYTES: Final = 66        # qs[64] d

_HEADER = struct.Struct("<IHBBQQQQQQQQQ48x")
assert _HEADER.size == HEADER_BYTES


class FormatError(ValueError):
    """A BITCOS weight/companion pair that violates docs/FORMAT.md."""


def _align(x: int, a: int = SECTION_ALIGN) -> int:
    return (x + a - 1) // a * a


@dataclass(frozen=True)
class Header:
    variant: int
    row_group_log2: int
    n_cols: int
    n_rows: int
    n_mats: int
    n_sign_bits: int
    scales_offset: int
    row_base_offset: int
    row_delta_offset: int
    pool_offset: int
    pool_bytes: int

    @property
    def companion_bytes(self) -> int:
        return self.pool_offset + self.pool_bytes

    def pack(self) -> bytes:
        return _HEADER.pack(MAGIC, VERSION, self.variant, self.row_group_log2, self.n_cols, self.n_rows,
                            self.n_mats, self.n_sign_bits, self.scales_offset, self.row_base_offset,
                            self.row_delta_offset, self.pool_offset, self.pool_bytes)


def canonical_header(variant: int, n_cols: int, n_rows: int, n_mats: int, n_sign_bits: int,
                     row_group_log2: int) -> Header:
    """The header with every offset at its canonical value (FORMAT.md §4.1)."""
    off = HEADER_BYTES
    scales_offset = 0
    if variant == VARIANT_PT:
        scales_offset = off
        off = _align(off + 4 * n_mats)
    g = 1 << row_group_log2
    row_base_offset = off
    off = _align(off + 8 * ((n_rows + g - 1) // g))
    row_delta_offset = off
    off = _align(off + 2 * n_rows)
    pool_offset = off
    pool_bytes = _align((n_sign_bits + 7) // 8) + POOL_TAIL
    return Header(variant, row_group_log2, n_cols, n_rows, n_mats, n_sign_bits, scales_offset,
                  row_base_offset, row_delta_offset, pool_offset, pool_bytes)


def companion_size(variant: int, n_cols: int, n_rows: int, n_mats: int, n_sign_bits: int,
                   row_group_log2: int) -> int:
    return canonical_header(variant, n_cols, n_rows, n_mats, n_sign_bits, row_group_log2).companion_bytes


def choose_row_group_log2(sign_pos: np.ndarray) -> int:
    """Largest g <= 6 such that every row_delta (sign_pos[r] - sign_pos[first row of r's group]) < 2^16."""
    r = sign_pos.shape[0]
    for g in range(MAX_ROW_GROUP_LOG2, 0, -1):
        size = 1 << g
        starts = sign_pos[::size]
        # deltas grow along a group, so the largest is at the group's last row
        last_idx = np.minimum(np.arange(0, r, size) + size - 1, r - 1)
        if r == 0 or int((sign_pos[last_idx] - starts).max()) <= 0xFFFF:
            return g
    return 0


def row_sign_positions(row_counts: np.ndarray) -> np.ndarray:
    """Exclusive prefix sum of per-row non-zero counts, uint64."""
    pos = np.zeros(row_counts.shape[0], dtype=np.uint64)
    if row_counts.shape[0] > 1:
        np.cumsum(row_counts[:-1], dtype=np.uint64, out=pos[1:])
    return pos


@dataclass
class Encoded:
    variant: int
    blocks: np.ndarray       # uint8 (R, K/128 * block bytes): the weight tensor's data
    companion: np.ndarray    # uint8 (companion bytes,): the ".bitcos" tensor's data
    header: Header

    @property
    def nbytes(self) -> int:
        return int(self.blocks.nbytes + self.companion.nbytes)


def encode(codes: np.ndarray, variant: int, *, block_scales: np.ndarray | None = None,
           matrix_scales: np.ndarray | None = None, n_mats: int = 1) -> Encoded:
    """Encode ternary codes (int8 (R, K), values -1/0/+1) into a BITCOS weight + companion.

    G128: ``block_scales`` fp16-castable (R, K/128), >= 0, stored as given (-0.0 as +0.0) even for a block
    with no non-zero weight: its d does not change decoded values, but the kernels' TQ2_0-exact arithmetic
    (csrc/bitcos-kernels.h) uses it, so a converter passes the source's block scale (FORMAT.md §3).
    PT: ``matrix_scales`` (n_mats,) float32, >= 0; rows are split evenly into ``n_mats`` matrices.
    """
    codes = np.ascontiguousarray(codes, dtype=np.int8)
    if codes.ndim != 2:
        raise ValueError("codes must be 2-D (rows, K)")
    n_rows, k = codes.shape
    if k == 0 or k % QK:
        raise ValueError(f"row length {k} is not a positive multiple of {QK}")
    if n_mats < 1 or n_rows % n_mats:
        raise ValueError(f"{n_rows} rows do not split into {n_mats} matrices")
    nb = k // QK
    present = codes != 0
    negative = codes < 0
    if np.count_nonzero(present) != np.count_nonzero(negative) + np.count_nonzero(codes == 1):
        raise ValueError("codes must be -1, 0 or +1")

    bitmap = np.packbits(present, axis=1, bitorder="little")          # (R, K/8), LSB first
    row_counts = np.count_nonzero(present, axis=1)
    sign_pos = row_sign_positions(row_counts)
    n_sign = int(row_counts.sum())
    g = choose_row_group_log2(sign_pos)
    hdr = canonical_header(variant, k, n_rows, n_mats, n_sign, g)

    # weight tensor: fixed-size blocks
    if variant == VARIANT_G128:
        if block_scales is None or block_scales.shape != (n_rows, nb):
            raise ValueError(f"G128 needs block_scales of shape {(n_rows, nb)}")
        d = np.asarray(block_scales).astype(np.float16)
        if not np.all(np.isfinite(d)) or np.any(d < 0):
            raise ValueError("G128 block scales must be finite and >= 0")
        d = (d + np.float16(0)).astype("<f2")   # -0.0 -> +0.0
        blocks = np.empty((n_rows, nb, BLOCK_BYTES[variant]), dtype=np.uint8)
        blocks[:, :, :16] = bitmap.reshape(n_rows, nb, 16)
        blocks[:, :, 16:] = d.view(np.uint8).reshape(n_rows, nb, 2)
        blocks = blocks.reshape(n_rows, nb * BLOCK_BYTES[variant])
    elif variant == VARIANT_PT:
        if matrix_scales is None or np.shape(matrix_scales) != (n_mats,):
            raise ValueError(f"PT needs matrix_scales of shape {(n_mats,)}")
        s = np.asarray(matrix_scales, dtype=np.float32)
        if not np.all(np.isfinite(s)) or np.any(s < 0):
            raise ValueError("PT matrix scales must be finite and >= 0")
        s = s + np.float32(0)   # -0.0 -> +0.0
        blocks = bitmap
    else:
        raise ValueError(f"unknown variant {variant}")

    # companion tensor
    comp = np.zeros(hdr.companion_bytes, dtype=np.uint8)
    comp[:HEADER_BYTES] = np.frombuffer(hdr.pack(), dtype=np.uint8)
    if variant == VARIANT_PT:
        comp[hdr.scales_offset:hdr.scales_offset + 4 * n_mats] = s.astype("<f4").view(np.uint8)
    gsize = 1 << g
    row_base = sign_pos[::gsize]
    row_delta = (sign_pos - np.repeat(row_base, gsize)[:n_rows]).astype("<u2")
    comp[hdr.row_base_offset:hdr.row_base_offset + 8 * row_base.shape[0]] = row_base.astype("<u8").view(np.uint8)
    comp[hdr.row_delta_offset:hdr.row_delta_offset + 2 * n_rows] = row_delta.view(np.uint8)
    # sign pool: signs of the non-zero weights in row-major order (rows back to back, increasing k)
    signs = negative[present]
    pool = np.packbits(signs, bitorder="little")
    comp[hdr.pool_offset:hdr.pool_offset + pool.shape[0]] = pool
    return Encoded(variant, blocks, comp, hdr)


def parse_header(companion: np.ndarray) -> Header:
    """Parse and check a companion header: magic, version, field ranges, canonical offsets, size."""
    if companion.nbytes < HEADER_BYTES:
        raise FormatError(f"companion has {companion.nbytes} bytes, less than the {HEADER_BYTES}-byte header")
    raw = companion[:HEADER_BYTES].tobytes()
    (magic, version, variant, g, n_cols, n_rows, n_mats, n_sign, scales_off, rb_off, rd_off,
     pool_off, pool_bytes) = _HEADER.unpack(raw)
    if magic != MAGIC:
        raise FormatError(f"bad companion magic 0x{magic:08x}")
    if version != VERSION:
        raise FormatError(f"companion version {version} is not supported (this reader knows {VERSION})")
    if variant not in (VARIANT_G128, VARIANT_PT):
        raise FormatError(f"unknown variant {variant}")
    if g > MAX_ROW_GROUP_LOG2:
        raise FormatError(f"row_group_log2 {g} > {MAX_ROW_GROUP_LOG2}")
    if any(raw[80:128]):
        raise FormatError("reserved header bytes are not zero")
    if n_mats == 0 or n_rows % n_mats:
        raise FormatError(f"n_rows {n_rows} is not a multiple of n_mats {n_mats}")
    if n_sign > n_rows * n_cols:
        raise FormatError(f"n_sign_bits {n_sign} exceeds the {n_rows * n_cols} weights")
    want = canonical_header(variant, n_cols, n_rows, n_mats, n_sign, g)
    got = Header(variant, g, n_cols, n_rows, n_mats, n_sign, scales_off, rb_off, rd_off, pool_off, pool_bytes)
    if got != want:
        raise FormatError(f"companion offsets are not canonical: {got} != {want}")
    if companion.nbytes != want.companion_bytes:
        raise FormatError(f"companion has {companion.nbytes} bytes, header says {want.companion_bytes}")
    return got


@dataclass
class Decoded:
    variant: int
    codes: np.ndarray                      # int8 (R, K)
    block_scales: np.ndarray | None        # fp16 (R, K/128), G128
    matrix_scales: np.ndarray | None       # float32 (M,), PT
    header: Header

    def to_float(self, rows: slice | None = None) -> np.ndarray:
        return codes_to_float(self.codes, self.variant, block_scales=self.block_scales,
                              matrix_scales=self.matrix_scales, rows=rows)


def codes_to_float(codes: np.ndarray, variant: int, *, block_scales: np.ndarray | None = None,
                   matrix_scales: np.ndarray | None = None, rows: slice | None = None) -> np.ndarray:
    """FORMAT.md §5: x = fp32(scale) * (float) t, one fp32 multiplication per weight."""
    n_rows, k = codes.shape
    rows = rows if rows is not None else slice(0, n_rows)
    start, stop, _ = rows.indices(n_rows)
    # in-place multiply: a fresh large temporary costs more in page faults than the arithmetic
    t = codes[start:stop].astype(np.float32)
    if variant == VARIANT_G128:
        assert block_scales is not None
        d = block_scales[start:stop].astype(np.float32)
        t3 = t.reshape(stop - start, k // QK, QK)
        np.multiply(t3, d[:, :, None], out=t3)
        return t
    assert matrix_scales is not None
    n_per_mat = n_rows // matrix_scales.shape[0]
    row_scale = matrix_scales.astype(np.float32)[np.arange(start, stop) // n_per_mat]
    np.multiply(t, row_scale[:, None], out=t)
    return t


def decode(blocks: np.ndarray, companion: np.ndarray, variant: int, n_cols: int, n_rows: int,
           n_mats: int) -> Decoded:
    """Decode a BITCOS weight (raw block bytes) + companion, checking every invariant of FORMAT.md §4."""
    companion = np.asarray(companion).reshape(-1).view(np.uint8)
    hdr = parse_header(companion)
    if hdr.variant != variant:
        raise FormatError(f"companion variant {VARIANT_NAMES[hdr.variant]} does not match the weight type "
                          f"{VARIANT_NAMES.get(variant, variant)}")
    if (hdr.n_cols, hdr.n_rows, hdr.n_mats) != (n_cols, n_rows, n_mats):
        raise FormatError(f"companion shape (K={hdr.n_cols}, R={hdr.n_rows}, M={hdr.n_mats}) does not match "
                          f"the weight (K={n_cols}, R={n_rows}, M={n_mats})")
    nb = n_cols // QK
    bb = BLOCK_BYTES[variant]
    blocks = np.asarray(blocks).reshape(-1).view(np.uint8)
    if blocks.nbytes != n_rows * nb * bb:
        raise FormatError(f"weight has {blocks.nbytes} bytes, expected {n_rows * nb * bb}")
    blk = blocks.reshape(n_rows, nb, bb)
    bitmap = np.ascontiguousarray(blk[:, :, :16]).reshape(n_rows, n_cols // 8)
    present = np.unpackbits(bitmap, axis=1, bitorder="little").view(np.bool_)
    row_counts = np.count_nonzero(present, axis=1)

    # row index: sign_pos(r) = row_base[r >> g] + row_delta[r], consistent with the bitmap
    g = hdr.row_group_log2
    n_groups = (n_rows + (1 << g) - 1) >> g
    row_base = companion[hdr.row_base_offset:hdr.row_base_offset + 8 * n_groups].view("<u8")
    row_delta = companion[hdr.row_delta_offset:hdr.row_delta_offset + 2 * n_rows].view("<u2")
    if np.any(row_delta[:: 1 << g] != 0):
        raise FormatError("row_delta of the first row of a group is not 0")
    sign_pos = np.repeat(row_base, 1 << g)[:n_rows] + row_delta.astype(np.uint64)
    expected = row_sign_positions(row_counts)
    if not np.array_equal(sign_pos, expected):
        bad = int(np.flatnonzero(sign_pos != expected)[0])
        raise FormatError(f"row index: sign_pos({bad}) = {int(sign_pos[bad])}, bitmap says {int(expected[bad])}")
    if int(row_counts.sum()) != hdr.n_sign_bits:
        raise FormatError(f"bitmap has {int(row_counts.sum())} non-zero weights, header says {hdr.n_sign_bits}")
    # pool tail section padding must be zero (between sections too)
    pool = companion[hdr.pool_offset:hdr.pool_offset + hdr.pool_bytes]
    s = hdr.n_sign_bits
    used = (s + 7) // 8
    if np.any(pool[used:]) or (s % 8 and int(pool[used - 1]) >> (s % 8)):
        raise FormatError("sign pool bits beyond n_sign_bits are not zero")
    signs = np.unpackbits(pool[:used], bitorder="little", count=s).view(np.bool_)

    codes = present.view(np.int8).copy()          # 1 where present
    codes[present] = np.where(signs, np.int8(-1), np.int8(1))
    block_scales = matrix_scales = None
    if variant == VARIANT_G128:
        block_scales = np.ascontiguousarray(blk[:, :, 16:]).view("<f2").reshape(n_rows, nb)
    else:
        matrix_scales = companion[hdr.scales_offset:hdr.scales_offset + 4 * n_mats].view("<f4").copy()
    return Decoded(variant, codes, block_scales, matrix_scales, hdr)


# --- TQ1_0 / TQ2_0 (ggml block layouts; 256 weights per block, fp16 scale d last) -----------------

def _tq_check(raw: np.ndarray, block_bytes: int) -> tuple[np.ndarray, int]:
    raw = np.asarray(raw).view(np.uint8)
    rows = raw.shape[0] if raw.ndim == 2 else 1
    raw = raw.reshape(rows, -1)
    if raw.shape[1] % block_bytes:
        raise ValueError(f"row of {raw.shape[1]} bytes is not a whole number of {block_bytes}-byte blocks")
    return raw, raw.shape[1] // block_bytes


def tq2_0_decode(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TQ2_0 rows (R, nblk*66 bytes) -> (codes int8 (R, nblk*256), d fp16 (R, nblk)).

    Block: qs[64], d. Weight 128j + 32l + m is 2-bit field l of byte qs[32j + m], code = field - 1.
    """
    raw, nblk = _tq_check(raw, TQ2_0_BLOCK_BYTES)
    rows = raw.shape[0]
    blk = raw.reshape(rows, nblk, TQ2_0_BLOCK_BYTES)
    qs = blk[:, :, :64].reshape(rows, nblk, 2, 1, 32)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)
    fields = (qs >> shifts) & np.uint8(3)                       # (rows, nblk, 2, 4, 32)
    codes = fields.view(np.int8) - np.int8(1)
    d = tq_block_scales(raw, TQ2_0_BLOCK_BYTES)
    return codes.reshape(rows, nblk * QK_K), d


def tq_block_scales(raw: np.ndarray, block_bytes: int) -> np.ndarray:
    """The fp16 d of every block of TQ1_0/TQ2_0 rows (R, nblk*block_bytes) -> (R, nblk); d is the last 2 bytes."""
    raw, nblk = _tq_check(raw, block_bytes)
    blk = raw.reshape(raw.shape[0], nblk, block_bytes)
    return np.ascontiguousarray(blk[:, :, block_bytes - 2:]).view("<f2").reshape(raw.shape[0], nblk)


def tq2_0_encode(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Inverse of tq2_0_decode: codes (R, K) in {-1,0,1}, d (R, K/256) -> uint8 (R, K/256*66)."""
    rows, k = codes.shape
    nblk = k // QK_K
    q = (codes.astype(np.int8) + np.int8(1)).view(np.uint8).reshape(rows, nblk, 2, 4, 32)
    packed = q[:, :, :, 0] | (q[:, :, :, 1] << 2) | (q[:, :, :, 2] << 4) | (q[:, :, :, 3] << 6)
    out = np.empty((rows, nblk, TQ2_0_BLOCK_BYTES), dtype=np.uint8)
    out[:, :, :64] = packed.reshape(rows, nblk, 64)
    out[:, :, 64:] = np.asarray(d).astype("<f2").reshape(rows, nblk, 1).view(np.uint8)
    return out.reshape(rows, nblk * TQ2_0_BLOCK_BYTES)


_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _trits_of(b: np.ndarray, n_digits: int) -> np.ndarray:
    """Digits (most significant first) of bytes holding ceil(v * 256 / 243): (..., n) -> (..., n_digits, n).

    Multiplying by 3^i modulo 256 shifts digit i to the top; (x * 3) >> 8 reads the top digit.
    """
    m = (b[..., None, :] * _POW3[:n_digits].reshape(n_digits, 1)).astype(np.uint8)
    return ((m.astype(np.uint16) * 3) >> 8).astype(np.int8)


def tq1_0_decode(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TQ1_0 rows (R, nblk*54 bytes) -> (codes int8 (R, nblk*256), d fp16 (R, nblk)).

    Block: qs[48], qh[4], d. qs[0:32] hold weights 0..159 (weight 32i + j is digit i of byte j),
    qs[32:48] weights 160..239 (160 + 16i + j), qh weights 240..255 (240 + 4i + j, 4 digits).
    """
    raw, nblk = _tq_check(raw, TQ1_0_BLOCK_BYTES)
    rows = raw.shape[0]
    blk = raw.reshape(rows, nblk, TQ1_0_BLOCK_BYTES)
    a = _trits_of(blk[:, :, 0:32], 5).reshape(rows, nblk, 160)
    b = _trits_of(blk[:, :, 32:48], 5).reshape(rows, nblk, 80)
    c = _trits_of(blk[:, :, 48:52], 4).reshape(rows, nblk, 16)
    codes = np.concatenate([a, b, c], axis=2) - np.int8(1)
    d = tq_block_scales(raw, TQ1_0_BLOCK_BYTES)
    return codes.reshape(rows, nblk * QK_K), d


def _pack_trits(q: np.ndarray, n_digits: int) -> np.ndarray:
    """(…, n_digits, n) trits 0..2, most significant first -> (…, n) bytes ceil(v * 256 / 243)."""
    weights = (3 ** np.arange(4, 4 - n_digits, -1)).astype(np.uint16).reshape(n_digits, 1)
    v = (q.astype(np.uint16) * weights).sum(axis=-2, dtype=np.uint16)
    return ((v * 256 + 242) // 243).astype(np.uint8)


def tq1_0_encode(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Inverse of tq1_0_decode: codes (R, K) in {-1,0,1}, d (R, K/256) -> uint8 (R, K/256*54)."""
    rows, k = codes.shape
    nblk = k // QK_K
    q = (codes.astype(np.int8) + np.int8(1)).view(np.uint8).reshape(rows, nblk, QK_K)
    out = np.empty((rows, nblk, TQ1_0_BLOCK_BYTES), dtype=np.uint8)
    out[:, :, 0:32] = _pack_trits(q[:, :, :160].reshape(rows, nblk, 5, 32), 5)
    out[:, :, 32:48] = _pack_trits(q[:, :, 160:240].reshape(rows, nblk, 5, 16), 5)
    # qh: 4 trits in the top 4 base-3 digits (v = sum t_i 3^(4-i), lowest digit 0)
    out[:, :, 48:52] = _pack_trits(q[:, :, 240:].reshape(rows, nblk, 4, 4), 4)
    out[:, :, 52:] = np.asarray(d).astype("<f2").reshape(rows, nblk, 1).view(np.uint8)
    return out.reshape(rows, nblk * TQ1_0_BLOCK_BYTES)


def tq_to_float(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    """ggml's dequantize_row_tq*_0: x = (float) t * fp32(d) per 256-block."""
    rows, k = codes.shape
    nblk = k // QK_K
    x = codes.astype(np.float32)
    x3 = x.reshape(rows, nblk, QK_K)
    np.multiply(x3, d.astype(np.float32)[:, :, None], out=x3)
    return x


# --- float sources ---------------------------------------------------------------------------------

def bf16_to_float(raw: np.ndarray) -> np.ndarray:
    u = np.asarray(raw).view("<u2")
    return (u.astype(np.uint32) << 16).view(np.float32)


# --- exact ternary detection (FORMAT.md §7) ---------------------------------------------------------

@dataclass
class TernaryChunk:
    """Per-chunk analysis of float32 rows (rows, K) with K % 128 == 0."""
    codes: np.ndarray          # int8 (rows, K): sign of x (0 for ±0)
    block_mag: np.ndarray      # float32 (rows, K/128): the block's common non-zero |x| (0 if none)
    blocks_uniform: bool       # every block: all non-zero |x| equal and finite


def analyze_rows(x: np.ndarray) -> TernaryChunk:
    """Codes and per-128-block magnitudes of float32 rows; vectorized over the whole chunk."""
    rows, k = x.shape
    a = np.abs(x).reshape(rows, k // QK, QK)
    with np.errstate(invalid="ignore"):
        mag = a.max(axis=2)                                   # NaN propagates -> not uniform
        uniform = bool(np.all(np.isfinite(mag))) and bool(np.all((a == mag[:, :, None]) | (a == 0)))
    codes = (x > 0).view(np.int8) - (x < 0).view(np.int8)
    return TernaryChunk(codes, mag.astype(np.float32), uniform)


def is_row_ternary(x: np.ndarray) -> bool:
    """Each row's non-zero |x| are one finite value (used to report tensors that look ternary but
    cannot be converted, e.g. K % 128 != 0)."""
    a = np.abs(x.reshape(x.shape[0], -1))
    with np.errstate(invalid="ignore"):
        m = a.max(axis=1)
        return bool(np.all(np.isfinite(m))) and bool(np.all((a == m[:, None]) | (a == 0)))


def g128_representable(block_mag: np.ndarray) -> bool:
    """Every block's magnitude is exactly an fp16 value (the block scale d)."""
    with np.errstate(over="ignore"):
        back = block_mag.astype(np.float16).astype(np.float32)
    return bool(np.array_equal(back, block_mag))


def pt_scales(block_mag: np.ndarray, n_mats: int) -> np.ndarray | None:
    """Per-matrix scale when every matrix's non-zero magnitudes are one value, else None."""
    per_mat = block_mag.reshape(n_mats, -1)
    hi = per_mat.max(axis=1)
    lo = np.where(per_mat > 0, per_mat, np.inf).min(axis=1)
    ok = (hi == 0) | (lo == hi)
    if not bool(np.all(ok)):
        return None
    return hi.astype(np.float32)


def bits_per_weight_formula(variant: int, z: float) -> float:
    """FORMAT.md §8 without companion overhead: G128 2.125 - z, PT 2 - z."""
    return (2.125 if variant == VARIANT_G128 else 2.0) - z


def weight_name_ok(name: str) -> bool:
    return len(name.encode("utf-8")) <= MAX_WEIGHT_NAME


def n_mats_of(ne: tuple[int, ...]) -> int:
    return math.prod(ne[2:]) if len(ne) > 2 else 1


# --- throughput measurement (python -m ggml_bitcos.codec) -----------------------------------------

def measure_throughput(rows: int = 4096, k: int = 4096, z: float = 0.4, repeats: int = 5,
                       seed: int = 0) -> dict[str, float]:
    """Median M weights/s of encode, decode (to codes, all checks) and decode + to_float, per variant,
    on one thread (numpy here does not multithread these operations)."""
    import time
    rng = np.random.default_rng(seed)
    u = rng.random((rows, k))
    codes = np.where(u < z, 0, np.where(rng.random((rows, k)) < 0.5, -1, 1)).astype(np.int8)
    d = rng.uniform(0.01, 1.0, (rows, k // QK)).astype(np.float16)
    s = np.array([0.5], dtype=np.float32)
    n = rows * k
    out: dict[str, float] = {}

    def med(fn) -> float:
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return n / sorted(ts)[len(ts) // 2] / 1e6

    for v in (VARIANT_G128, VARIANT_PT):
        name = VARIANT_NAMES[v]
        enc = encode(codes, v, block_scales=d, matrix_scales=s)
        out[f"{name} encode"] = med(lambda: encode(codes, v, block_scales=d, matrix_scales=s))
        out[f"{name} decode"] = med(lambda: decode(enc.blocks, enc.companion, v, k, rows, 1))
        out[f"{name} decode+float"] = med(lambda: decode(enc.blocks, enc.companion, v, k, rows, 1).to_float())
    return out


if __name__ == "__main__":
    import sys
    z_arg = float(sys.argv[1]) if len(sys.argv) > 1 else 0.4
    for key, val in measure_throughput(z=z_arg).items():
        print(f"{key:<20} {val:8.1f} M weights/s")
