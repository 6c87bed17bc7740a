"""Numpy reference codec for BITCOS tensors (docs/FORMAT.md, versions 1 and 2): the weight's fixed-size blocks
and the companion tensor (header, scales, row index, sign pool).

Everything here works on whole arrays (no per-weight Python loops):

* ``encode(codes, ...)``  ternary codes int8 (R, K) + scales -> ``Encoded(blocks, companion)``
* ``decode(blocks, companion, type_id, ...)`` -> ``Decoded(codes, block_scales | matrix_scales | row_scales)``;
  ``Decoded.to_float()`` -> float32 exactly as FORMAT.md §5 (one fp32 multiplication per weight)
* ``parse_header``, ``sign_positions``, ``sign_pool``: the companion's parts a reader (or the kernel
  harness) needs, checked; ``check_scales`` / ``invalid_scales``: the scale validity rule.

The format's constants are in ``ggml_bitcos.format``; TQ1_0/TQ2_0 are in ``ggml_bitcos.tq`` and exact-ternary
detection in ``ggml_bitcos.ternary``.

Shapes: a weight with ggml shape [K, N] or [K, N, E] is handled as R = N·E rows of K weights, M = E
matrices of N rows each (numpy order (E, N, K) reshaped to (R, K)).

Scales by variant (FORMAT.md §4.2): ``block_scales`` fp16 (R, K / scale_block) for G128 / B128 / B256,
``matrix_scales`` float32 (M,) for PT / MATRIX, ``row_scales`` float32 (R,) for ROW.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, fields
from typing import Final

import numpy as np

from .format import (
    BITMAP_BYTES,
    HEADER_BYTES,
    HEADER_FIELDS,
    MAGIC,
    MAX_ROW_GROUP_LOG2,
    MAX_SCALE,
    MAX_WEIGHT_NAME,
    POOL_TAIL,
    QK,
    SECTION_ALIGN,
    VERSIONS,
    Variant,
)

_FIELDS_FORMAT: Final = "<" + "".join(code for _name, code in HEADER_FIELDS)
HEADER_RESERVED_OFFSET: Final = struct.calcsize(_FIELDS_FORMAT)  # reserved, zero bytes from here on
_HEADER = struct.Struct(f"{_FIELDS_FORMAT}{HEADER_BYTES - HEADER_RESERVED_OFFSET}x")
assert _HEADER.size == HEADER_BYTES


class FormatError(ValueError):
    """A BITCOS weight/companion pair that violates docs/FORMAT.md."""


def _align(x: int, a: int = SECTION_ALIGN) -> int:
    return (x + a - 1) // a * a


def _as_variant(variant: int) -> Variant:
    """``variant`` as a ``Variant`` member; ``ValueError`` naming it when it is none."""
    if variant not in set(Variant):
        raise ValueError(f"unknown variant {variant}")
    return Variant(variant)


def header_version(variant: Variant) -> int:
    """The companion header's ``version`` for a variant: 1 for G128 / PT, 2 for the rest (FORMAT.md §4.1)."""
    return Variant(variant).version


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
        """The 128 header bytes: the fields in ``format.HEADER_FIELDS`` order, then zero reserved bytes; the
        version is the variant's (1 for G128 / PT, 2 for the rest)."""
        values = {
            "magic": MAGIC,
            "version": header_version(self.variant),
            **{f.name: getattr(self, f.name) for f in fields(self)},
        }
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
        return ((bits & 0x80000000) != 0) | ~(f <= np.float32(MAX_SCALE))  # NaN fails the comparison


def check_scales(variant: Variant, scales: np.ndarray) -> None:
    """``FormatError`` naming the first invalid scale: ``scales`` are the variant's (module docstring): fp16
    block scales (R, K / scale_block), fp32 matrix scales (M,) or fp32 row scales (R,)."""
    bad = np.flatnonzero(invalid_scales(scales))
    if bad.size == 0:
        return
    i = int(bad[0])
    flat = np.asarray(scales).reshape(-1)
    if variant.scale_block:
        nb = np.asarray(scales).shape[-1]
        value = float(flat.view("<f2")[i]) if flat.dtype.kind == "u" else float(flat[i])
        raise FormatError(
            f"invalid fp16 scale {value!r} in block {i % nb} of row {i // nb} (valid: finite, >= +0.0; FORMAT.md 3.1)"
        )
    what = "row" if variant is Variant.ROW else "matrix"
    raise FormatError(
        f"invalid scale {float(flat[i])!r} of {what} {i} (valid: finite, >= +0.0, <= {MAX_SCALE}; FORMAT.md 3.1)"
    )


def canonical_header(
    variant: Variant, n_cols: int, n_rows: int, n_mats: int, n_sign_bits: int, row_group_log2: int
) -> Header:
    """The header with every offset at its canonical value (FORMAT.md §4.1)."""
    variant = Variant(variant)
    off = HEADER_BYTES
    scales_offset = 0
    if variant is not Variant.G128:
        scales_offset = off
        off = _align(off + variant.scales_bytes(n_cols, n_rows, n_mats))
    g = 1 << row_group_log2
    row_base_offset = off
    off = _align(off + 8 * ((n_rows + g - 1) // g))
    row_delta_offset = off
    off = _align(off + 2 * n_rows)
    pool_offset = off
    pool_bytes = _align((n_sign_bits + 7) // 8) + POOL_TAIL
    return Header(
        variant,
        row_group_log2,
        n_cols,
        n_rows,
        n_mats,
        n_sign_bits,
        scales_offset,
        row_base_offset,
        row_delta_offset,
        pool_offset,
        pool_bytes,
    )


def companion_size(
    variant: Variant, n_cols: int, n_rows: int, n_mats: int, n_sign_bits: int, row_group_log2: int
) -> int:
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
    blocks: np.ndarray  # uint8 (R, row bytes): the weight tensor's data (v1 G128 K/128·18, else K/8)
    companion: np.ndarray  # uint8 (companion bytes,): the ".bitcos" tensor's data
    header: Header

    @property
    def nbytes(self) -> int:
        return int(self.blocks.nbytes + self.companion.nbytes)


def encoded_nbytes(
    variant: Variant, ne: tuple[int, ...] | list[int], n_sign_bits: int, row_group_log2: int
) -> tuple[int, int]:
    """(weight + companion bytes, companion bytes) of a BITCOS tensor of ggml shape ``ne`` (ne0 = K first) in
    ``variant`` with ``n_sign_bits`` non-zero weights: the one size rule of an encoded tensor (FORMAT.md §8)."""
    k, n_rows = int(ne[0]), math.prod(int(x) for x in ne[1:])
    comp = companion_size(variant, k, n_rows, n_mats_of(tuple(int(x) for x in ne)), n_sign_bits, row_group_log2)
    return n_rows * weight_row_bytes(variant, k) + comp, comp


def weight_row_bytes(variant: Variant, n_cols: int) -> int:
    """Bytes of one row of the weight tensor: K/128 blocks of 18 bytes for G128, the K/8-byte bitmap otherwise."""
    return n_cols // QK * variant.block_bytes if variant is Variant.G128 else n_cols // 8


def check_row_length(variant: Variant, n_cols: int) -> None:
    """``ValueError`` unless ``n_cols`` is a positive multiple of the variant's K multiple (FORMAT.md §3)."""
    if n_cols <= 0 or n_cols % variant.k_multiple:
        raise ValueError(
            f"row length {n_cols} is not a positive multiple of {variant.k_multiple} (required by {variant.name})"
        )


def _scales_array(
    variant: Variant,
    n_rows: int,
    n_cols: int,
    n_mats: int,
    block_scales: np.ndarray | None,
    matrix_scales: np.ndarray | None,
    row_scales: np.ndarray | None,
) -> np.ndarray:
    """The variant's scales as stored: fp16 (R, K / scale_block), fp32 (M,) or fp32 (R,); -0.0 -> +0.0;
    ``ValueError`` on a missing or wrongly shaped argument or an invalid scale (FORMAT.md §3.1)."""
    if variant.scale_block:
        want, given, name = (n_rows, n_cols // variant.scale_block), block_scales, "block_scales"
        with np.errstate(over="ignore"):  # too large for fp16 -> inf, refused below
            cast = None if given is None else np.asarray(given).astype("<f2")
    else:
        if variant is Variant.ROW:
            want, given, name = (n_rows,), row_scales, "row_scales"
        else:
            want, given, name = (n_mats,), matrix_scales, "matrix_scales"
        cast = None if given is None else np.asarray(given, dtype="<f4")
    if cast is None or cast.shape != want:
        raise ValueError(f"{variant.name} needs {name} of shape {want}")
    cast = (cast + cast.dtype.type(0)).astype(cast.dtype)  # -0.0 -> +0.0
    try:
        check_scales(variant, cast)
    except FormatError as e:
        raise ValueError(f"{variant.name} {name}: {e}") from None
    return cast


def encode(
    codes: np.ndarray,
    variant: Variant,
    *,
    block_scales: np.ndarray | None = None,
    matrix_scales: np.ndarray | None = None,
    row_scales: np.ndarray | None = None,
    n_mats: int = 1,
) -> Encoded:
    """Encode ternary codes (int8 (R, K), values -1/0/+1) into a BITCOS weight + companion.

    Scales (module docstring) as the variant needs them, each valid (FORMAT.md §3.1; -0.0 is stored as +0.0):
    G128 / B128 / B256 ``block_scales`` fp16-castable (R, K / scale_block), stored as given even for a block
    with no non-zero weight: its scale does not change decoded values, but the kernels' TQ2_0-exact
    arithmetic (csrc/bitcos-kernels.h) uses it, so a converter passes the source's block scale (FORMAT.md §3).
    PT / MATRIX ``matrix_scales`` (n_mats,); ROW ``row_scales`` (R,). Rows split evenly into ``n_mats``
    matrices.
    """
    variant = _as_variant(variant)
    codes = np.ascontiguousarray(codes, dtype=np.int8)
    if codes.ndim != 2:
        raise ValueError("codes must be 2-D (rows, K)")
    n_rows, k = codes.shape
    check_row_length(variant, k)
    if n_mats < 1 or n_rows % n_mats:
        raise ValueError(f"{n_rows} rows do not split into {n_mats} matrices")
    present = codes != 0
    negative = codes < 0
    if np.count_nonzero(present) != np.count_nonzero(negative) + np.count_nonzero(codes == 1):
        raise ValueError("codes must be -1, 0 or +1")
    scales = _scales_array(variant, n_rows, k, n_mats, block_scales, matrix_scales, row_scales)

    bitmap = np.packbits(present, axis=1, bitorder="little")  # (R, K/8), LSB first
    row_counts = np.count_nonzero(present, axis=1)
    sign_pos = row_sign_positions(row_counts)
    n_sign = int(row_counts.sum())
    g = choose_row_group_log2(sign_pos)
    hdr = canonical_header(variant, k, n_rows, n_mats, n_sign, g)

    # weight tensor: G128 interleaves bitmap and fp16 d per 128 weights; every other variant is the bitmap
    if variant is Variant.G128:
        nb = k // QK
        blocks = np.empty((n_rows, nb, variant.block_bytes), dtype=np.uint8)
        blocks[:, :, :BITMAP_BYTES] = bitmap.reshape(n_rows, nb, BITMAP_BYTES)
        blocks[:, :, BITMAP_BYTES:] = scales.view(np.uint8).reshape(n_rows, nb, 2)
        blocks = blocks.reshape(n_rows, nb * variant.block_bytes)
    else:
        blocks = bitmap

    # companion tensor
    comp = np.zeros(hdr.companion_bytes, dtype=np.uint8)
    comp[:HEADER_BYTES] = np.frombuffer(hdr.pack(), dtype=np.uint8)
    if variant is not Variant.G128:
        raw = np.ascontiguousarray(scales).view(np.uint8).reshape(-1)
        comp[hdr.scales_offset : hdr.scales_offset + raw.shape[0]] = raw
    gsize = 1 << g
    row_base = sign_pos[::gsize]
    row_delta = (sign_pos - np.repeat(row_base, gsize)[:n_rows]).astype("<u2")
    comp[hdr.row_base_offset : hdr.row_base_offset + 8 * row_base.shape[0]] = row_base.astype("<u8").view(np.uint8)
    comp[hdr.row_delta_offset : hdr.row_delta_offset + 2 * n_rows] = row_delta.view(np.uint8)
    # sign pool: signs of the non-zero weights in row-major order (rows back to back, increasing k)
    signs = negative[present]
    pool = np.packbits(signs, bitorder="little")
    comp[hdr.pool_offset : hdr.pool_offset + pool.shape[0]] = pool
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
    if version not in VERSIONS:
        raise FormatError(
            f"companion version {version} is not supported (this reader knows {', '.join(map(str, VERSIONS))})"
        )
    if variant not in set(Variant):
        raise FormatError(f"unknown variant {variant}")
    if Variant(variant).version != version:
        raise FormatError(
            f"variant {Variant(variant).name} belongs to format version {Variant(variant).version}, "
            f"the companion says version {version}"
        )
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
        bad = next(f.name for f in fields(Header) if getattr(got, f.name) != getattr(want, f.name))
        raise FormatError(
            f"companion section offsets/sizes are not canonical (FORMAT.md 4.1): {bad} {getattr(got, bad)}, "
            f"expected {getattr(want, bad)}"
        )
    if companion.nbytes != want.companion_bytes:
        raise FormatError(f"companion has {companion.nbytes} bytes, header says {want.companion_bytes}")
    return got


@dataclass
class Decoded:
    """A decoded BITCOS weight: codes and the scales of its variant (module docstring)."""

    variant: Variant
    codes: np.ndarray  # int8 (R, K)
    block_scales: np.ndarray | None  # fp16 (R, K / scale_block): G128, B128, B256
    matrix_scales: np.ndarray | None  # float32 (M,): PT, MATRIX
    header: Header
    row_scales: np.ndarray | None = None  # float32 (R,): ROW

    def to_float(self, rows: slice | None = None) -> np.ndarray:
        """fp32 values of all rows or of ``rows`` (FORMAT.md §5)."""
        return codes_to_float(
            self.codes,
            self.variant,
            block_scales=self.block_scales,
            matrix_scales=self.matrix_scales,
            row_scales=self.row_scales,
            rows=rows,
        )

    def row_scale_values(self) -> np.ndarray | None:
        """float32 (R,): each row's one scale for PT / MATRIX / ROW (the matrix's, repeated), else None."""
        if self.row_scales is not None:
            return self.row_scales
        if self.matrix_scales is None:
            return None
        return np.repeat(self.matrix_scales.astype(np.float32), self.codes.shape[0] // self.matrix_scales.shape[0])


def codes_to_float(
    codes: np.ndarray,
    variant: Variant,
    *,
    block_scales: np.ndarray | None = None,
    matrix_scales: np.ndarray | None = None,
    row_scales: np.ndarray | None = None,
    rows: slice | None = None,
) -> np.ndarray:
    """FORMAT.md §5: x = fp32(scale) * (float) t, one fp32 multiplication per weight."""
    variant = Variant(variant)
    n_rows, k = codes.shape
    rows = rows if rows is not None else slice(0, n_rows)
    start, stop, _ = rows.indices(n_rows)
    # in-place multiply: a fresh large temporary costs more in page faults than the arithmetic
    t = codes[start:stop].astype(np.float32)
    if variant.scale_block:
        assert block_scales is not None
        d = block_scales[start:stop].astype(np.float32)
        sb = variant.scale_block
        t3 = t.reshape(stop - start, k // sb, sb)
        np.multiply(t3, d[:, :, None], out=t3)
        return t
    if variant is Variant.ROW:
        assert row_scales is not None
        row_scale = row_scales.astype(np.float32)[start:stop]
    else:
        assert matrix_scales is not None
        n_per_mat = n_rows // matrix_scales.shape[0]
        row_scale = matrix_scales.astype(np.float32)[np.arange(start, stop) // n_per_mat]
    np.multiply(t, row_scale[:, None], out=t)
    return t


_POPCOUNT8: Final = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)
_VALIDATE_ROWS: Final = 1 << 16  # rows per chunk of the bitmap popcount (bounded temporaries)


def _weight_type_id(weight_type: int) -> int:
    """The ggml type id of a weight; a ``Variant`` stands for its own type (G128 -> 160, PT -> 161, v2 -> 162)."""
    return weight_type.type_id if isinstance(weight_type, Variant) else int(weight_type)


def row_bitmaps(blocks: np.ndarray, variant: Variant, n_cols: int, n_rows: int) -> np.ndarray:
    """uint8 (R, K/8) view or copy of every row's bitmap (G128 drops the in-block d)."""
    if variant is Variant.G128:
        nb = n_cols // QK
        return np.ascontiguousarray(blocks.reshape(n_rows, nb, variant.block_bytes)[:, :, :BITMAP_BYTES]).reshape(
            n_rows, n_cols // 8
        )
    return blocks.reshape(n_rows, n_cols // 8)


def stored_scales(blocks: np.ndarray, companion: np.ndarray, hdr: Header) -> np.ndarray:
    """The variant's scales as stored (views): fp16 (R, K / scale_block), fp32 (M,) or fp32 (R,)."""
    v, n_rows, n_cols = hdr.variant, hdr.n_rows, hdr.n_cols
    if v is Variant.G128:
        nb = n_cols // QK
        return (
            np.ascontiguousarray(blocks.reshape(n_rows, nb, v.block_bytes)[:, :, BITMAP_BYTES:])
            .view("<f2")
            .reshape(n_rows, nb)
        )
    raw = companion[hdr.scales_offset : hdr.scales_offset + v.scales_bytes(n_cols, n_rows, hdr.n_mats)]
    if v.scale_block:
        return raw.view("<f2").reshape(n_rows, n_cols // v.scale_block)
    return raw.view("<f4")


def validate(
    blocks: np.ndarray, companion: np.ndarray, weight_type: int, n_cols: int, n_rows: int, n_mats: int
) -> Header:
    """Check a BITCOS weight (raw block bytes of ggml type ``weight_type``: 160, 161 or 162) + companion against
    every rule of FORMAT.md §3, §3.1 and §4, as the C validator (csrc/ggml-bitcos.c, run by the llama.cpp loader)
    does, without decoding; returns the header.

    The one Python implementation of the rules: ``decode``, ``ggml-bitcos info`` and ``ggml-bitcos stats`` call
    it. Order: header (magic, version, variant, version of the variant, g, reserved bytes, canonical offsets,
    size), variant against the weight's type, shape against the weight, row length, the weight's byte size,
    the row index against the bitmap's popcounts, ``n_sign_bits``, the sign pool's bits beyond
    ``n_sign_bits``, the scales (§3.1). Also refused: a weight with no rows or no matrices (a zero dimension;
    the loader refuses such a tensor by its shape check)."""
    type_id = _weight_type_id(weight_type)
    companion = np.asarray(companion).reshape(-1).view(np.uint8)
    hdr = parse_header(companion)
    if hdr.variant.type_id != type_id:
        raise FormatError(
            f"companion variant {hdr.variant.name} (format version {hdr.variant.version}) does not "
            f"match the weight type {type_id} ({_type_name(type_id)})"
        )
    if (hdr.n_cols, hdr.n_rows, hdr.n_mats) != (n_cols, n_rows, n_mats):
        raise FormatError(
            f"companion shape (K={hdr.n_cols}, R={hdr.n_rows}, M={hdr.n_mats}) does not match "
            f"the weight (K={n_cols}, R={n_rows}, M={n_mats})"
        )
    variant = hdr.variant
    try:
        check_row_length(variant, n_cols)
    except ValueError as e:
        raise FormatError(str(e)) from None
    if n_rows <= 0 or n_mats <= 0:
        raise FormatError(f"empty weight: a zero dimension (K={n_cols}, R={n_rows}, M={n_mats})")
    blocks = np.asarray(blocks).reshape(-1).view(np.uint8)
    want_bytes = n_rows * weight_row_bytes(variant, n_cols)
    if blocks.nbytes != want_bytes:
        raise FormatError(f"weight has {blocks.nbytes} bytes, expected {want_bytes}")

    # row index, consistent with the bitmap: sign_pos(r) = popcounts of rows < r
    row_counts = np.empty(n_rows, dtype=np.uint64)
    for s in range(0, n_rows, _VALIDATE_ROWS):
        e = min(n_rows, s + _VALIDATE_ROWS)
        part = blocks[s * want_bytes // n_rows : e * want_bytes // n_rows]
        bitmaps = row_bitmaps(part, variant, n_cols, e - s)
        row_counts[s:e] = _POPCOUNT8[bitmaps].sum(axis=1, dtype=np.uint64)
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
    check_scales(variant, stored_scales(blocks, companion, hdr))
    return hdr


def _type_name(type_id: int) -> str:
    for v in Variant:
        if v.type_id == type_id:
            return v.type_name
    return "not a BITCOS type"


def decode(
    blocks: np.ndarray, companion: np.ndarray, weight_type: int, n_cols: int, n_rows: int, n_mats: int
) -> Decoded:
    """Decode a BITCOS weight (raw block bytes of ggml type ``weight_type``) + companion, after ``validate`` has
    checked every invariant of FORMAT.md §3 and §4 and the scales' validity (§3.1), as the C validator
    (csrc/ggml-bitcos.c) does."""
    companion = np.asarray(companion).reshape(-1).view(np.uint8)
    hdr = validate(blocks, companion, weight_type, n_cols, n_rows, n_mats)
    variant = hdr.variant
    blocks = np.asarray(blocks).reshape(-1).view(np.uint8)
    present = np.unpackbits(row_bitmaps(blocks, variant, n_cols, n_rows), axis=1, bitorder="little").view(np.bool_)
    s = hdr.n_sign_bits
    signs = np.unpackbits(sign_pool(companion, hdr)[: (s + 7) // 8], bitorder="little", count=s).view(np.bool_)
    codes = present.view(np.int8).copy()  # 1 where present
    codes[present] = np.where(signs, np.int8(-1), np.int8(1))
    del present, signs
    scales = stored_scales(blocks, companion, hdr).copy()
    block_scales = scales if variant.scale_block else None
    row_scales = scales if variant is Variant.ROW else None
    matrix_scales = scales if variant in (Variant.PT, Variant.MATRIX) else None
    return Decoded(variant, codes, block_scales, matrix_scales, hdr, row_scales)


def sign_positions(companion: np.ndarray, hdr: Header) -> np.ndarray:
    """Pool bit of every row's first sign, uint64 (R,): ``row_base[r >> g] + row_delta[r]`` (FORMAT.md §4.3).

    Checks that ``row_delta`` is 0 for the first row of every group; ``decode`` checks the rest against the
    bitmap.
    """
    g = hdr.row_group_log2
    n_rows = hdr.n_rows
    n_groups = (n_rows + (1 << g) - 1) >> g
    row_base = companion[hdr.row_base_offset : hdr.row_base_offset + 8 * n_groups].view("<u8")
    row_delta = companion[hdr.row_delta_offset : hdr.row_delta_offset + 2 * n_rows].view("<u2")
    if np.any(row_delta[:: 1 << g] != 0):
        raise FormatError("row_delta of the first row of a group is not 0")
    return np.repeat(row_base, 1 << g)[:n_rows] + row_delta.astype(np.uint64)


def sign_pool(companion: np.ndarray, hdr: Header) -> np.ndarray:
    """The sign pool with its zero tail, a uint8 view into the companion (FORMAT.md §4.4)."""
    return companion[hdr.pool_offset : hdr.pool_offset + hdr.pool_bytes]


def weight_name_ok(name: str) -> bool:
    """The weight's name leaves room for the companion's (FORMAT.md §1)."""
    return len(name.encode("utf-8")) <= MAX_WEIGHT_NAME


def n_mats_of(ne: tuple[int, ...]) -> int:
    """Matrices in a weight of ggml shape ``ne``: ne2 · ne3 (1 for a 2-D weight)."""
    return math.prod(ne[2:]) if len(ne) > 2 else 1
