"""Numpy reference codec for BITCOS tensors (docs/FORMAT.md v1): the weight's fixed-size blocks and the
companion tensor (header, per-matrix scales, row index, sign pool).

Everything here works on whole arrays (no per-weight Python loops):

* ``encode(codes, ...)``  ternary codes int8 (R, K) + scales -> ``Encoded(blocks, companion)``
* ``decode(blocks, companion, ...)`` -> ``Decoded(codes, block_scales | matrix_scales)``;
  ``Decoded.to_float()`` -> float32 exactly as FORMAT.md §5 (one fp32 multiplication per weight)
* ``parse_header``, ``sign_positions``, ``sign_pool``: the companion's parts a reader (or the kernel
  harness) needs, checked; ``check_scales`` / ``invalid_scales``: the scale validity rule.

The format's constants are in ``ggml_bitcos.format``; TQ1_0/TQ2_0 are in ``ggml_bitcos.tq`` and exact-ternary
detection in ``ggml_bitcos.ternary``.

Shapes: a weight with ggml shape [K, N] or [K, N, E] is handled as R = N·E rows of K weights, M = E
matrices of N rows each (numpy order (E, N, K) reshaped to (R, K)).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, fields
from typing import Final

import numpy as np

from .format import (BITMAP_BYTES, HEADER_BYTES, HEADER_FIELDS, MAGIC, MAX_ROW_GROUP_LOG2, MAX_SCALE,
                     MAX_WEIGHT_NAME, POOL_TAIL, QK, SECTION_ALIGN, VERSION, Variant)

_FIELDS_FORMAT: Final = "<" + "".join(code for _name, code in HEADER_FIELDS)
HEADER_RESERVED_OFFSET: Final = struct.calcsize(_FIELDS_FORMAT)    # reserved, zero bytes from here on
_HEADER = struct.Struct(f"{_FIELDS_FORMAT}{HEADER_BYTES - HEADER_RESERVED_OFFSET}x")
assert _HEADER.size == HEADER_BYTES


class FormatError(ValueError):
    """A BITCOS weight/companion pair that violates docs/FORMAT.md."""


def _align(x: int, a: int = SECTION_ALIGN) -> int:
    return (x + a - 1) // a * a


def _variant_name(variant: int) -> str:
    """The variant's short name, or the bare number for a value that is no variant (in error messages)."""
    return Variant(variant).name if variant in set(Variant) else str(variant)


def _as_variant(variant: int) -> Variant:
    """``variant`` as a ``Variant`` member; ``ValueError`` naming it when it is none."""
    if variant not in set(Variant):
        raise ValueError(f"unknown variant {variant}")
    return Variant(variant)


@dataclass(frozen=True)
class Header:
    """The companion header's fields after magic and version (FORMAT.md §4.1)."""

    variant: Variant
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
        """The 128 header bytes: the fields in ``format.HEADER_FIELDS`` order, then zero reserved bytes."""
        values = {"magic": MAGIC, "version": VERSION, **{f.name: getattr(self, f.name) for f in fields(self)}}
        return _HEADER.pack(*(values[name] for name, _code in HEADER_FIELDS))


def invalid_scales(scales: np.ndarray) -> np.ndarray:
    """Boolean mask of the invalid values among fp16 or fp32 scales (FORMAT.md §3.1): valid is finite,
    sign bit clear (so -0.0 and every negative value are invalid) and <= MAX_SCALE. Works on the bit
    patterns, so NaN payloads and -0.0 are judged exactly as the C validator judges them."""
    s = np.asarray(scales)
    if s.dtype.itemsize == 2:
        bits = s.view("<u2") if s.dtype.kind == "u" else s.astype("<f2").view("<u2")
        return ((bits & 0x8000) != 0) | ((bits & 0x7C00) == 0x7C00)
    f = np.asarray(s, dtype="<f4")
    bits = f.view("<u4")
    with np.errstate(invalid="ignore"):
        return ((bits & 0x80000000) != 0) | ~(f <= np.float32(MAX_SCALE))   # NaN fails the comparison


def check_scales(variant: Variant, scales: np.ndarray) -> None:
    """``FormatError`` naming the first invalid scale: G128 ``scales`` are the fp16 block scales (R, K/128),
    PT the fp32 matrix scales (M,)."""
    bad = np.flatnonzero(invalid_scales(scales))
    if bad.size == 0:
        return
    i = int(bad[0])
    flat = np.asarray(scales).reshape(-1)
    if variant == Variant.G128:
        nb = np.asarray(scales).shape[-1]
        value = float(flat.view("<f2")[i]) if flat.dtype.kind == "u" else float(flat[i])
        raise FormatError(f"invalid fp16 scale {value!r} in block {i % nb} of row {i // nb} "
                          f"(valid: finite, >= +0.0; FORMAT.md 3.1)")
    raise FormatError(f"invalid scale {float(flat[i])!r} of matrix {i} "
                      f"(valid: finite, >= +0.0, <= {MAX_SCALE}; FORMAT.md 3.1)")


def canonical_header(variant: Variant, n_cols: int, n_rows: int, n_mats: int, n_sign_bits: int,
                     row_group_log2: int) -> Header:
    """The header with every offset at its canonical value (FORMAT.md §4.1)."""
    off = HEADER_BYTES
    scales_offset = 0
    if variant == Variant.PT:
        scales_offset = off
        off = _align(off + 4 * n_mats)
    g = 1 << row_group_log2
    row_base_offset = off
    off = _align(off + 8 * ((n_rows + g - 1) // g))
    row_delta_offset = off
    off = _align(off + 2 * n_rows)
    pool_offset = off
    pool_bytes = _align((n_sign_bits + 7) // 8) + POOL_TAIL
    return Header(Variant(variant), row_group_log2, n_cols, n_rows, n_mats, n_sign_bits, scales_offset,
                  row_base_offset, row_delta_offset, pool_offset, pool_bytes)


def companion_size(variant: Variant, n_cols: int, n_rows: int, n_mats: int, n_sign_bits: int,
                   row_group_log2: int) -> int:
    """Bytes of the companion tensor of a weight with these dimensions (FORMAT.md §4, §8)."""
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
    """A BITCOS weight as the two GGUF tensors' data (FORMAT.md §1)."""

    variant: Variant
    blocks: np.ndarray       # uint8 (R, K/128 * block bytes): the weight tensor's data
    companion: np.ndarray    # uint8 (companion bytes,): the ".bitcos" tensor's data
    header: Header

    @property
    def nbytes(self) -> int:
        return int(self.blocks.nbytes + self.companion.nbytes)


def encode(codes: np.ndarray, variant: Variant, *, block_scales: np.ndarray | None = None,
           matrix_scales: np.ndarray | None = None, n_mats: int = 1) -> Encoded:
    """Encode ternary codes (int8 (R, K), values -1/0/+1) into a BITCOS weight + companion.

    G128: ``block_scales`` fp16-castable (R, K/128), >= 0, stored as given (-0.0 as +0.0) even for a block
    with no non-zero weight: its d does not change decoded values, but the kernels' TQ2_0-exact arithmetic
    (csrc/bitcos-kernels.h) uses it, so a converter passes the source's block scale (FORMAT.md §3).
    PT: ``matrix_scales`` (n_mats,) float32, >= 0; rows are split evenly into ``n_mats`` matrices.
    """
    variant = _as_variant(variant)
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
    if variant == Variant.G128:
        if block_scales is None or block_scales.shape != (n_rows, nb):
            raise ValueError(f"G128 needs block_scales of shape {(n_rows, nb)}")
        with np.errstate(over="ignore"):  # too large for fp16 -> inf, refused below
            d = np.asarray(block_scales).astype(np.float16)
        if not np.all(np.isfinite(d)) or np.any(d < 0):
            raise ValueError("G128 block scales must be finite and >= 0")
        d = (d + np.float16(0)).astype("<f2")   # -0.0 -> +0.0
        blocks = np.empty((n_rows, nb, variant.block_bytes), dtype=np.uint8)
        blocks[:, :, :BITMAP_BYTES] = bitmap.reshape(n_rows, nb, BITMAP_BYTES)
        blocks[:, :, BITMAP_BYTES:] = d.view(np.uint8).reshape(n_rows, nb, 2)
        blocks = blocks.reshape(n_rows, nb * variant.block_bytes)
    else:
        if matrix_scales is None or np.shape(matrix_scales) != (n_mats,):
            raise ValueError(f"PT needs matrix_scales of shape {(n_mats,)}")
        s = np.asarray(matrix_scales, dtype=np.float32)
        if not np.all(np.isfinite(s)) or np.any(s < 0) or np.any(s > MAX_SCALE):
            raise ValueError(f"PT matrix scales must be finite, >= 0 and <= {MAX_SCALE}")
        s = s + np.float32(0)   # -0.0 -> +0.0
        blocks = bitmap

    # companion tensor
    comp = np.zeros(hdr.companion_bytes, dtype=np.uint8)
    comp[:HEADER_BYTES] = np.frombuffer(hdr.pack(), dtype=np.uint8)
    if variant == Variant.PT:
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
    values = dict(zip((name for name, _code in HEADER_FIELDS), _HEADER.unpack(raw)))
    magic, version, variant = values.pop("magic"), values.pop("version"), values["variant"]
    if magic != MAGIC:
        raise FormatError(f"bad companion magic 0x{magic:08x}")
    if version != VERSION:
        raise FormatError(f"companion version {version} is not supported (this reader knows {VERSION})")
    if variant not in set(Variant):
        raise FormatError(f"unknown variant {variant}")
    if values["row_group_log2"] > MAX_ROW_GROUP_LOG2:
        raise FormatError(f"row_group_log2 {values['row_group_log2']} > {MAX_ROW_GROUP_LOG2}")
    if any(raw[HEADER_RESERVED_OFFSET:]):
        raise FormatError("reserved header bytes are not zero")
    got = Header(**{**values, "variant": Variant(variant)})
    n_rows, n_mats, n_cols, n_sign = got.n_rows, got.n_mats, got.n_cols, got.n_sign_bits
    if n_mats == 0 or n_rows % n_mats:
        raise FormatError(f"n_rows {n_rows} is not a multiple of n_mats {n_mats}")
    if n_sign > n_rows * n_cols:
        raise FormatError(f"n_sign_bits {n_sign} exceeds the {n_rows * n_cols} weights")
    want = canonical_header(got.variant, n_cols, n_rows, n_mats, n_sign, got.row_group_log2)
    if got != want:
        raise FormatError(f"companion offsets are not canonical: {got} != {want}")
    if companion.nbytes != want.companion_bytes:
        raise FormatError(f"companion has {companion.nbytes} bytes, header says {want.companion_bytes}")
    return got


@dataclass
class Decoded:
    """A decoded BITCOS weight: codes and the scales of its variant."""

    variant: Variant
    codes: np.ndarray                      # int8 (R, K)
    block_scales: np.ndarray | None        # fp16 (R, K/128), G128
    matrix_scales: np.ndarray | None       # float32 (M,), PT
    header: Header

    def to_float(self, rows: slice | None = None) -> np.ndarray:
        """fp32 values of all rows or of ``rows`` (FORMAT.md §5)."""
        return codes_to_float(self.codes, self.variant, block_scales=self.block_scales,
                              matrix_scales=self.matrix_scales, rows=rows)


def codes_to_float(codes: np.ndarray, variant: Variant, *, block_scales: np.ndarray | None = None,
                   matrix_scales: np.ndarray | None = None, rows: slice | None = None) -> np.ndarray:
    """FORMAT.md §5: x = fp32(scale) * (float) t, one fp32 multiplication per weight."""
    n_rows, k = codes.shape
    rows = rows if rows is not None else slice(0, n_rows)
    start, stop, _ = rows.indices(n_rows)
    # in-place multiply: a fresh large temporary costs more in page faults than the arithmetic
    t = codes[start:stop].astype(np.float32)
    if variant == Variant.G128:
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


_POPCOUNT8: Final = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)
_VALIDATE_ROWS: Final = 1 << 16          # rows per chunk of the bitmap popcount (bounded temporaries)


def validate(blocks: np.ndarray, companion: np.ndarray, variant: Variant, n_cols: int, n_rows: int,
             n_mats: int) -> Header:
    """Check a BITCOS weight (raw block bytes) + companion against every rule of FORMAT.md §3.1 and §4, as the
    C validator (csrc/ggml-bitcos.c, run by the llama.cpp loader) does, without decoding; returns the header.

    The one Python implementation of the rules: ``decode``, ``ggml-bitcos info`` and ``ggml-bitcos stats`` call
    it. Order: header (magic, version, variant, g, reserved bytes, canonical offsets, size), variant and shape
    against the weight, the weight's byte size, the row index against the bitmap's popcounts, ``n_sign_bits``,
    the sign pool's bits beyond ``n_sign_bits``, the scales (§3.1). Also refused: a weight with no rows or
    no matrices (a zero dimension; the loader refuses such a tensor by its shape check)."""
    companion = np.asarray(companion).reshape(-1).view(np.uint8)
    hdr = parse_header(companion)
    if hdr.variant != variant:
        raise FormatError(f"companion variant {hdr.variant.name} does not match the weight type "
                          f"{_variant_name(variant)}")
    if (hdr.n_cols, hdr.n_rows, hdr.n_mats) != (n_cols, n_rows, n_mats):
        raise FormatError(f"companion shape (K={hdr.n_cols}, R={hdr.n_rows}, M={hdr.n_mats}) does not match "
                          f"the weight (K={n_cols}, R={n_rows}, M={n_mats})")
    if n_cols <= 0 or n_cols % QK:
        raise FormatError(f"row length {n_cols} is not a positive multiple of {QK}")
    if n_rows <= 0 or n_mats <= 0:
        raise FormatError(f"empty weight: a zero dimension (K={n_cols}, R={n_rows}, M={n_mats})")
    variant = hdr.variant
    nb = n_cols // QK
    bb = variant.block_bytes
    blocks = np.asarray(blocks).reshape(-1).view(np.uint8)
    if blocks.nbytes != n_rows * nb * bb:
        raise FormatError(f"weight has {blocks.nbytes} bytes, expected {n_rows * nb * bb}")
    blk = blocks.reshape(n_rows, nb, bb)

    # row index, consistent with the bitmap: sign_pos(r) = popcounts of rows < r
    row_counts = np.empty(n_rows, dtype=np.uint64)
    for s in range(0, n_rows, _VALIDATE_ROWS):
        e = min(n_rows, s + _VALIDATE_ROWS)
        row_counts[s:e] = _POPCOUNT8[blk[s:e, :, :BITMAP_BYTES]].reshape(e - s, -1).sum(axis=1, dtype=np.uint64)
    sign_pos = sign_positions(companion, hdr)
    expected = row_sign_positions(row_counts)
    if not np.array_equal(sign_pos, expected):
        bad = int(np.flatnonzero(sign_pos != expected)[0])
        raise FormatError(f"row index: sign_pos({bad}) = {int(sign_pos[bad])}, bitmap says {int(expected[bad])}")
    n_present = int(row_counts.sum(dtype=np.uint64))
    if n_present != hdr.n_sign_bits:
        raise FormatError(f"bitmap has {n_present} non-zero weights, header says {hdr.n_sign_bits}")
    # pool: every bit at or beyond n_sign_bits is zero (the partial last byte, the padding and the tail)
    pool = sign_pool(companion, hdr)
    s_bits = hdr.n_sign_bits
    used = (s_bits + 7) // 8
    if np.any(pool[used:]) or (s_bits % 8 and int(pool[used - 1]) >> (s_bits % 8)):
        raise FormatError("sign pool bits beyond n_sign_bits are not zero")
    if variant == Variant.G128:
        check_scales(variant, np.ascontiguousarray(blk[:, :, BITMAP_BYTES:]).view("<f2").reshape(n_rows, nb))
    else:
        check_scales(variant, companion[hdr.scales_offset:hdr.scales_offset + 4 * n_mats].view("<f4"))
    return hdr


def decode(blocks: np.ndarray, companion: np.ndarray, variant: Variant, n_cols: int, n_rows: int,
           n_mats: int) -> Decoded:
    """Decode a BITCOS weight (raw block bytes) + companion, after ``validate`` has checked every invariant of
    FORMAT.md §4 and the scales' validity (§3.1), as the C validator (csrc/ggml-bitcos.c) does."""
    companion = np.asarray(companion).reshape(-1).view(np.uint8)
    hdr = validate(blocks, companion, variant, n_cols, n_rows, n_mats)
    variant = hdr.variant
    nb = n_cols // QK
    bb = variant.block_bytes
    blk = np.asarray(blocks).reshape(-1).view(np.uint8).reshape(n_rows, nb, bb)
    bitmap = np.ascontiguousarray(blk[:, :, :BITMAP_BYTES]).reshape(n_rows, n_cols // 8)
    present = np.unpackbits(bitmap, axis=1, bitorder="little").view(np.bool_)
    del bitmap
    s = hdr.n_sign_bits
    signs = np.unpackbits(sign_pool(companion, hdr)[:(s + 7) // 8], bitorder="little", count=s).view(np.bool_)
    codes = present.view(np.int8).copy()          # 1 where present
    codes[present] = np.where(signs, np.int8(-1), np.int8(1))
    del present, signs
    block_scales = matrix_scales = None
    if variant == Variant.G128:
        block_scales = np.ascontiguousarray(blk[:, :, BITMAP_BYTES:]).view("<f2").reshape(n_rows, nb)
    else:
        matrix_scales = companion[hdr.scales_offset:hdr.scales_offset + 4 * n_mats].view("<f4").copy()
    return Decoded(variant, codes, block_scales, matrix_scales, hdr)


def sign_positions(companion: np.ndarray, hdr: Header) -> np.ndarray:
    """Pool bit of every row's first sign, uint64 (R,): ``row_base[r >> g] + row_delta[r]`` (FORMAT.md §4.3).

    Checks that ``row_delta`` is 0 for the first row of every group; ``decode`` checks the rest against the
    bitmap.
    """
    g = hdr.row_group_log2
    n_rows = hdr.n_rows
    n_groups = (n_rows + (1 << g) - 1) >> g
    row_base = companion[hdr.row_base_offset:hdr.row_base_offset + 8 * n_groups].view("<u8")
    row_delta = companion[hdr.row_delta_offset:hdr.row_delta_offset + 2 * n_rows].view("<u2")
    if np.any(row_delta[:: 1 << g] != 0):
        raise FormatError("row_delta of the first row of a group is not 0")
    return np.repeat(row_base, 1 << g)[:n_rows] + row_delta.astype(np.uint64)


def sign_pool(companion: np.ndarray, hdr: Header) -> np.ndarray:
    """The sign pool with its zero tail, a uint8 view into the companion (FORMAT.md §4.4)."""
    return companion[hdr.pool_offset:hdr.pool_offset + hdr.pool_bytes]


def weight_name_ok(name: str) -> bool:
    """The weight's name leaves room for the companion's (FORMAT.md §1)."""
    return len(name.encode("utf-8")) <= MAX_WEIGHT_NAME


def n_mats_of(ne: tuple[int, ...]) -> int:
    """Matrices in a weight of ggml shape ``ne``: ne2 · ne3 (1 for a 2-D weight)."""
    return math.prod(ne[2:]) if len(ne) > 2 else 1
