"""The numpy codec against an independent per-bit reference (plain Python, written from FORMAT.md),
round trips on random codes, TQ1_0/TQ2_0 (ggml_bitcos.tq) against gguf-py, and ternary detection
(ggml_bitcos.ternary)."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from ggml_bitcos import codec, ternary, tq
from ggml_bitcos.format import TQ1_0_BLOCK_BYTES, TQ2_0_BLOCK_BYTES, Variant, bits_per_weight
from ggml_bitcos.ternary import random_codes

ZS = [0.0, 0.01, 0.5, 0.99, 1.0]


def random_d(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(0.001, 2.0, shape).astype(np.float16)


# --- an independent, slow, per-bit reference encoder (plain Python, from docs/FORMAT.md) ----------


def _roundup(x: int, a: int) -> int:
    return -(-x // a) * a


def ref_row_index(codes: list[list[int]]) -> tuple[list[int], int, int]:
    """FORMAT.md §4.3 by hand: each row's first sign bit, the number of signs, and the largest row-group log2
    g <= 6 whose deltas fit in 16 bits."""
    sign_pos, acc = [], 0
    for row in codes:
        sign_pos.append(acc)
        acc += sum(1 for v in row if v != 0)
    g = next(
        c for c in range(6, -1, -1) if all(sign_pos[r] - sign_pos[(r >> c) << c] <= 0xFFFF for r in range(len(codes)))
    )
    return sign_pos, acc, g


def ref_companion(
    codes: list[list[int]], version: int, variant: int, n_mats: int, section: bytes | None
) -> tuple[bytes, int]:
    """FORMAT.md §4 by hand: the companion (header, the scales ``section`` when the variant has one, row index,
    sign pool) of ``codes``, and its row-group log2."""
    rows, k = len(codes), len(codes[0])
    sign_pos, n_sign, g = ref_row_index(codes)
    n_groups = -(-rows // (1 << g))
    scales_off = 128 if section is not None else 0
    base_off = _roundup(128 + len(section or b""), 64)
    delta_off = _roundup(base_off + 8 * n_groups, 64)
    pool_off = _roundup(delta_off + 2 * rows, 64)
    pool_bytes = _roundup(-(-n_sign // 8), 64) + 64
    comp = bytearray(pool_off + pool_bytes)
    comp[0:128] = struct.pack(
        "<IHBBQQQQQQQQQ",
        0x53435442,
        version,
        variant,
        g,
        k,
        rows,
        n_mats,
        n_sign,
        scales_off,
        base_off,
        delta_off,
        pool_off,
        pool_bytes,
    ) + bytes(48)
    if section is not None:
        comp[scales_off : scales_off + len(section)] = section
    for grp in range(n_groups):
        comp[base_off + 8 * grp : base_off + 8 * grp + 8] = struct.pack("<Q", sign_pos[grp << g])
    for r in range(rows):
        comp[delta_off + 2 * r : delta_off + 2 * r + 2] = struct.pack("<H", sign_pos[r] - sign_pos[(r >> g) << g])
    bit = 0
    for r in range(rows):
        assert bit == sign_pos[r]
        for v in codes[r]:
            if v != 0:
                if v < 0:
                    comp[pool_off + bit // 8] |= 1 << (bit % 8)
                bit += 1
    return bytes(comp), g


def ref_encode(
    codes: list[list[int]],
    variant: Variant,
    block_d: list[list[float]] | None,
    mat_scales: list[float] | None,
    n_mats: int,
) -> tuple[bytes, bytes, int]:
    rows, k = len(codes), len(codes[0])
    weight = bytearray()
    for r in range(rows):
        for b in range(k // 128):
            bits = bytearray(16)
            for j in range(128):
                if codes[r][128 * b + j] != 0:
                    bits[j // 8] |= 1 << (j % 8)  # weight j: bit j % 8 (LSB first) of byte j / 8
            weight += bits
            if variant == Variant.G128:
                weight += struct.pack("<e", block_d[r][b])  # stored as given, even when empty
    section = b"".join(struct.pack("<f", s) for s in mat_scales) if variant == Variant.PT else None
    comp, g = ref_companion(codes, 1, int(variant), n_mats, section)
    return bytes(weight), comp, g


@pytest.mark.parametrize("variant", [Variant.G128, Variant.PT])
@pytest.mark.parametrize(
    "rows,k,z,n_mats,want_g",
    [
        (5, 256, 0.4, 1, 6),  # small: whole tensor in one group
        (6, 384, 0.0, 3, 6),  # 3 matrices (PT scales per matrix)
        (40, 2048, 0.0, 1, 5),  # 39 * 2048 > 65535 in one group of 64 -> g = 5
        (10, 8192, 0.0, 2, 3),  # 7 * 8192 fits, 15 * 8192 does not -> g = 3
        (2, 65664, 0.0, 1, 0),  # one row alone overflows 16 bits -> g = 0
        (3, 128, 1.0, 1, 6),  # all zero: empty pool, d = 0
    ],
)
def test_layout_matches_per_bit_reference(variant: Variant, rows: int, k: int, z: float, n_mats: int, want_g: int):
    rng = np.random.default_rng(1234 + rows + k)
    codes = random_codes(rng, (rows, k), z)
    d = random_d(rng, (rows, k // 128))
    scales = rng.uniform(0.01, 1.0, n_mats).astype(np.float32)
    enc = codec.encode(codes, variant, block_scales=d, matrix_scales=scales, n_mats=n_mats)
    ref_w, ref_c, ref_g = ref_encode(codes.tolist(), variant, d.astype(np.float32).tolist(), scales.tolist(), n_mats)
    assert ref_g == want_g
    assert enc.header.row_group_log2 == want_g
    assert enc.blocks.tobytes() == ref_w
    assert enc.companion.tobytes() == ref_c
    # pool tail: every bit beyond n_sign_bits is zero, and >= 64 bytes of zero tail
    h = enc.header
    pool = enc.companion[h.pool_offset :]
    assert len(pool) - (h.n_sign_bits + 7) // 8 >= 64
    assert not np.any(pool[(h.n_sign_bits + 7) // 8 :])
    assert h.companion_bytes == enc.companion.nbytes


def test_bit_order_by_hand():
    """Weight 0 negative and weight 9 positive in one G128 block: bitmap byte0 bit0, byte1 bit1."""
    codes = np.zeros((1, 128), dtype=np.int8)
    codes[0, 0] = -1
    codes[0, 9] = 1
    codes[0, 127] = -1
    enc = codec.encode(codes, Variant.G128, block_scales=np.array([[0.5]], dtype=np.float16))
    b = enc.blocks[0]
    assert b[0] == 0b1 and b[1] == 0b10 and b[15] == 0x80 and not np.any(b[2:15])
    assert b[16:18].tobytes() == struct.pack("<e", 0.5)
    h = enc.header
    assert h.n_sign_bits == 3
    # signs in increasing k: -, +, -  -> bits 1, 0, 1
    assert enc.companion[h.pool_offset] == 0b101


@pytest.mark.parametrize("variant", [Variant.G128, Variant.PT])
@pytest.mark.parametrize("z", ZS)
@pytest.mark.parametrize("rows,k", [(1, 128), (3, 384), (37, 2048), (37, 128), (1, 2048), (3, 128)])
def test_round_trip(variant: Variant, z: float, rows: int, k: int):
    rng = np.random.default_rng(int(z * 1000) * 7 + rows * 13 + k)
    codes = random_codes(rng, (rows, k), z)
    n_mats = 1 if rows % 3 else 3 if rows >= 3 else 1
    d = random_d(rng, (rows, k // 128))
    scales = rng.uniform(0.01, 1.0, n_mats).astype(np.float32)
    enc = codec.encode(codes, variant, block_scales=d, matrix_scales=scales, n_mats=n_mats)
    dec = codec.decode(enc.blocks, enc.companion, variant, k, rows, n_mats)
    assert np.array_equal(dec.codes, codes)
    x = dec.to_float()
    if variant == Variant.G128:
        assert np.array_equal(dec.block_scales, d)  # kept even for empty blocks
        want = codes.astype(np.float32) * np.repeat(d.astype(np.float32), 128, axis=1)
    else:
        assert np.array_equal(dec.matrix_scales, scales)
        want = codes.astype(np.float32) * np.repeat(scales, rows // n_mats)[:, None]
    assert np.array_equal(x.view(np.uint32), (want + np.float32(0)).view(np.uint32))  # +0.0 for zeros
    # size formula (FORMAT.md §8): exact companion size
    assert enc.companion.nbytes == codec.companion_size(
        variant, k, rows, n_mats, int(np.count_nonzero(codes)), enc.header.row_group_log2
    )


def _encoded(variant: Variant = Variant.G128, rows: int = 9, k: int = 256, z: float = 0.3):
    rng = np.random.default_rng(99)
    codes = random_codes(rng, (rows, k), z)
    enc = codec.encode(
        codes, variant, block_scales=random_d(rng, (rows, k // 128)), matrix_scales=np.array([0.25], dtype=np.float32)
    )
    return enc, rows, k


@pytest.mark.parametrize(
    "corrupt,match",
    [
        (lambda c, h: c.__setitem__(0, 0), "magic"),
        (lambda c, h: c.__setitem__(4, 2), "version"),
        (lambda c, h: c.__setitem__(7, 7), "row_group_log2"),
        (lambda c, h: c.__setitem__(100, 1), "reserved"),
        (lambda c, h: c.__setitem__(h.row_delta_offset + 2, c[h.row_delta_offset + 2] ^ 1), "row"),
        (lambda c, h: c.__setitem__(h.row_base_offset, 1), "row"),
        (lambda c, h: c.__setitem__(h.companion_bytes - 1, 1), "beyond"),
        (lambda c, h: c.__setitem__(48, c[48] + 64), "canonical"),
    ],
)
def test_decode_rejects_corruption(corrupt, match: str):
    enc, rows, k = _encoded()
    comp = enc.companion.copy()
    corrupt(comp, enc.header)
    with pytest.raises(codec.FormatError, match=match):
        codec.decode(enc.blocks, comp, Variant.G128, k, rows, 1)


def test_decode_rejects_mismatches():
    enc, rows, k = _encoded()
    with pytest.raises(codec.FormatError, match="variant"):
        codec.decode(enc.blocks[:, : rows * 0 + 32], enc.companion, Variant.PT, k, rows, 1)
    with pytest.raises(codec.FormatError, match="shape"):
        codec.decode(enc.blocks, enc.companion, Variant.G128, k, rows + 1, 1)
    with pytest.raises(codec.FormatError, match="bytes"):
        codec.decode(enc.blocks, enc.companion[:-1], Variant.G128, k, rows, 1)
    blocks = enc.blocks.copy()
    blocks[0, 0] ^= 1  # a bitmap bit flipped: row index no longer consistent
    with pytest.raises(codec.FormatError):
        codec.decode(blocks, enc.companion, Variant.G128, k, rows, 1)


def test_encode_rejects_bad_input():
    codes = np.zeros((2, 128), dtype=np.int8)
    with pytest.raises(ValueError):
        codec.encode(np.zeros((2, 100), dtype=np.int8), Variant.PT, matrix_scales=np.ones(1, np.float32))
    with pytest.raises(ValueError):
        codec.encode(codes + 2, Variant.PT, matrix_scales=np.ones(1, np.float32))
    with pytest.raises(ValueError):
        codec.encode(codes, Variant.PT, matrix_scales=-np.ones(1, np.float32))
    with pytest.raises(ValueError):
        codec.encode(codes, Variant.G128, block_scales=np.full((2, 1), np.nan, np.float16))


# --- TQ1_0 / TQ2_0 ---------------------------------------------------------------------------------

TQ = [
    (GGMLQuantizationType.TQ2_0, tq.tq2_0_encode, tq.tq2_0_decode),
    (GGMLQuantizationType.TQ1_0, tq.tq1_0_encode, tq.tq1_0_decode),
]


@pytest.mark.parametrize("qtype,enc,dec", TQ, ids=["TQ2_0", "TQ1_0"])
@pytest.mark.parametrize("rows,k,z", [(1, 256, 0.0), (3, 768, 0.5), (37, 2048, 0.99), (5, 256, 1.0)])
def test_tq_writer_reader_vs_gguf_py(qtype, enc, dec, rows: int, k: int, z: float):
    rng = np.random.default_rng(rows * 31 + k)
    codes = random_codes(rng, (rows, k), z)
    d = random_d(rng, (rows, k // 256))
    d[0, 0] = -d[0, 0]  # a negative scale must round trip too
    raw = enc(codes, d)
    block_bytes = TQ2_0_BLOCK_BYTES if qtype == GGMLQuantizationType.TQ2_0 else TQ1_0_BLOCK_BYTES
    assert raw.shape == (rows, k // 256 * block_bytes)
    got_codes, got_d = dec(raw)
    assert np.array_equal(got_codes, codes) and np.array_equal(got_d.view(np.uint16), d.view(np.uint16))
    # gguf-py's own dequantization of our packing gives the codes back
    ref = dequantize(raw, qtype)
    assert np.array_equal(ref.view(np.uint32), tq.tq_to_float(got_codes, got_d).view(np.uint32))
    want = codes.astype(np.float32) * np.repeat(d.astype(np.float32), 256, axis=1)
    assert np.array_equal(ref.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("qtype,enc,dec", TQ, ids=["TQ2_0", "TQ1_0"])
def test_tq_reader_on_gguf_py_quantize(qtype, enc, dec):
    rng = np.random.default_rng(5)
    codes = random_codes(rng, (7, 512), 0.4)
    x = codes.astype(np.float32) * np.float32(0.375)
    raw = quantize(x, qtype)
    got_codes, got_d = dec(raw)
    assert np.array_equal(tq.tq_to_float(got_codes, got_d), dequantize(raw, qtype))
    assert np.array_equal(got_codes, codes)


# --- exact ternary detection -----------------------------------------------------------------------


def test_analyze_rows_and_variants():
    rng = np.random.default_rng(3)
    codes = random_codes(rng, (6, 256), 0.4)
    s = np.float32(0.1)  # not an fp16 value
    x = codes.astype(np.float32) * s
    ch = ternary.analyze_rows(x)
    assert ch.blocks_uniform and np.array_equal(ch.codes, codes)
    assert ternary.pt_scales(ch.block_mag, 2) is not None
    assert not ternary.g128_representable(ch.block_mag)
    x16 = codes.astype(np.float32) * np.float32(np.float16(0.1))
    assert ternary.g128_representable(ternary.analyze_rows(x16).block_mag)
    # a second magnitude in one block: not ternary
    y = x.copy()
    y[0, codes[0] != 0][:1] *= 2
    y[0, np.flatnonzero(codes[0])[0]] *= 2
    assert not ternary.analyze_rows(y).blocks_uniform
    # NaN / inf are never ternary
    y = x.copy()
    y[1, 3] = np.nan
    assert not ternary.analyze_rows(y).blocks_uniform
    y[1, 3] = np.inf
    assert not ternary.analyze_rows(y).blocks_uniform
    # -0.0 is a zero code
    y = x.copy()
    y[2, :] = -0.0
    assert np.all(ternary.analyze_rows(y).codes[2] == 0)
    # per-matrix scales differ between matrices: PT still applies (one scale per matrix)
    z2 = np.concatenate([x[:3], 2 * x[3:]])
    mags = ternary.analyze_rows(z2).block_mag
    sc = ternary.pt_scales(mags, 2)
    assert sc is not None and sc[1] == 2 * sc[0]
    assert ternary.pt_scales(mags, 1) is None


def test_size_overhead_bound():
    """FORMAT.md §8: companion overhead <= 0.01 bit per weight for K >= 2048 and >= 2 M weights
    (at exactly 1 M weights, 512 x 2048 at z = 0, it is 0.01025: 18 bits per row + 192 fixed bytes)."""
    for variant in (Variant.G128, Variant.PT):
        for z in (0.0, 0.5, 1.0):
            rows, k = 1024, 2048
            s = int((1 - z) * rows * k)
            g = 5 if z < 0.5 else 6
            comp = codec.companion_size(variant, k, rows, 1, s, g)
            overhead = (8 * comp - s) / (rows * k)
            assert overhead <= 0.01, (variant, z, overhead)
            assert math.isclose(bits_per_weight(variant, z), (2.125 if variant == Variant.G128 else 2.0) - z)


# --- format version 2: bitmap-only weights, scales in the companion, any K % 32 ---------------------

V2 = [Variant.MATRIX, Variant.ROW, Variant.B128, Variant.B256]


def ref_encode_v2(codes: list[list[int]], variant: Variant, scales: list, n_mats: int) -> tuple[bytes, bytes]:
    """Per-bit reference of FORMAT.md §3-§4 for version 2, plain Python. ``scales``: MATRIX one float per
    matrix, ROW one per row, B128 / B256 a list per row of the row's block scales."""
    rows, k = len(codes), len(codes[0])
    weight = bytearray()
    for r in range(rows):
        bits = bytearray(k // 8)  # the row's bitmap, K/8 bytes, no scales
        for j in range(k):
            if codes[r][j] != 0:
                bits[j // 8] |= 1 << (j % 8)
        weight += bits
    if variant is Variant.ROW or variant is Variant.MATRIX:
        section = b"".join(struct.pack("<f", s) for s in scales)
    else:
        section = b"".join(struct.pack("<e", d) for row in scales for d in row)
    comp, _g = ref_companion(codes, 2, int(variant), n_mats, section)
    return bytes(weight), comp


def v2_scales(rng: np.random.Generator, variant: Variant, rows: int, k: int, n_mats: int) -> dict[str, np.ndarray]:
    """encode()'s keyword for the variant's scales, random valid values."""
    if variant.scale_block:
        return {"block_scales": random_d(rng, (rows, k // variant.scale_block))}
    if variant is Variant.ROW:
        return {"row_scales": rng.uniform(0.01, 1.0, rows).astype(np.float32)}
    return {"matrix_scales": rng.uniform(0.01, 1.0, n_mats).astype(np.float32)}


def v2_shapes(variant: Variant) -> list[tuple[int, int]]:
    """(rows, K) cases the variant allows: odd K multiples of 32 for MATRIX / ROW."""
    ks = [32, 96, 160, 576, 640, 1536] if variant.k_multiple == 32 else [128, 384, 640, 2048]
    ks = [k for k in ks if k % variant.k_multiple == 0] or [256, 768, 2048]
    return [(r, k) for k, r in zip(ks, [1, 3, 7, 37, 5, 2])]


@pytest.mark.parametrize("variant", V2, ids=lambda v: v.name)
@pytest.mark.parametrize("z", [0.0, 0.4, 1.0])
def test_v2_layout_matches_per_bit_reference(variant: Variant, z: float):
    for rows, k in v2_shapes(variant):
        rng = np.random.default_rng(77 + rows + k + int(10 * z))
        n_mats = 3 if rows % 3 == 0 else 1
        codes = random_codes(rng, (rows, k), z)
        kw = v2_scales(rng, variant, rows, k, n_mats)
        enc = codec.encode(codes, variant, n_mats=n_mats, **kw)
        scales = next(iter(kw.values()))
        ref_scales = scales.astype(np.float32).tolist()
        ref_w, ref_c = ref_encode_v2(codes.tolist(), variant, ref_scales, n_mats)
        assert enc.blocks.shape == (rows, k // 8)
        assert enc.blocks.tobytes() == ref_w, (variant, rows, k)
        assert enc.companion.tobytes() == ref_c, (variant, rows, k)
        assert enc.header.companion_bytes == codec.companion_size(
            variant, k, rows, n_mats, int(np.count_nonzero(codes)), enc.header.row_group_log2
        )
        # decode gives codes, scales and the float values of FORMAT.md §5 back
        dec = codec.decode(enc.blocks, enc.companion, variant.type_id, k, rows, n_mats)
        assert dec.variant is variant and np.array_equal(dec.codes, codes)
        if variant.scale_block:
            per_weight = np.repeat(scales.astype(np.float32), variant.scale_block, axis=1)
            assert np.array_equal(dec.block_scales.view(np.uint16), scales.view(np.uint16))
        elif variant is Variant.ROW:
            per_weight = np.repeat(scales[:, None], k, axis=1)
            assert np.array_equal(dec.row_scales, scales)
        else:
            per_weight = np.repeat(np.repeat(scales, rows // n_mats)[:, None], k, axis=1)
            assert np.array_equal(dec.matrix_scales, scales)
        want = codes.astype(np.float32) * per_weight + np.float32(0)
        assert np.array_equal(dec.to_float().view(np.uint32), want.view(np.uint32))
        assert np.array_equal(dec.to_float(slice(1, rows)), want[1:])


def test_v2_matrix_rows_are_pt_rows():
    """For K % 128 == 0 a version-2 weight is byte for byte a version-1 PT weight (FORMAT.md §3); the
    companions differ in version, variant and nothing else."""
    rng = np.random.default_rng(8)
    codes = random_codes(rng, (9, 384), 0.4)
    s = np.array([0.5, 0.25, 2.0], np.float32)
    pt = codec.encode(codes, Variant.PT, matrix_scales=s, n_mats=3)
    v2 = codec.encode(codes, Variant.MATRIX, matrix_scales=s, n_mats=3)
    assert pt.blocks.tobytes() == v2.blocks.tobytes()
    a, b = pt.companion.copy(), v2.companion.copy()
    assert (a[4], a[6], b[4], b[6]) == (1, 1, 2, 2)
    a[4] = a[6] = b[4] = b[6] = 0
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize(
    "corrupt,match",
    [
        (lambda c: c.__setitem__(4, 1), "version"),  # v2 variant with a version-1 header
        (lambda c: c.__setitem__(6, 6), "unknown variant"),
        (lambda c: c.__setitem__(6, 2), "canonical|matrix|variant"),  # ROW -> MATRIX: scales section shrinks
        (lambda c: c.__setitem__(4, 3), "version 3"),
    ],
)
def test_v2_decode_rejects_corrupt_headers(corrupt, match: str):
    rng = np.random.default_rng(5)
    rows = 20  # 80 bytes of row scales: ROW's scales section is 128 bytes after alignment, MATRIX's 64
    codes = random_codes(rng, (rows, 96), 0.3)
    enc = codec.encode(codes, Variant.ROW, row_scales=np.linspace(0.1, 1, rows, dtype=np.float32))
    comp = enc.companion.copy()
    corrupt(comp)
    with pytest.raises(codec.FormatError, match=match):
        codec.decode(enc.blocks, comp, Variant.ROW.type_id, 96, rows, 1)


def test_v2_decode_rejects_type_and_shape_mismatches():
    rng = np.random.default_rng(6)
    codes = random_codes(rng, (4, 256), 0.3)
    enc = codec.encode(codes, Variant.B256, block_scales=random_d(rng, (4, 1)))
    with pytest.raises(codec.FormatError, match="does not match the weight type 161"):
        codec.decode(enc.blocks, enc.companion, Variant.PT.type_id, 256, 4, 1)
    with pytest.raises(codec.FormatError, match="weight has"):
        codec.decode(enc.blocks[:, :16], enc.companion, Variant.B256.type_id, 256, 4, 1)
    pt = codec.encode(codes, Variant.PT, matrix_scales=np.ones(1, np.float32))
    with pytest.raises(codec.FormatError, match="does not match the weight type 162"):
        codec.decode(pt.blocks, pt.companion, 162, 256, 4, 1)


@pytest.mark.parametrize(
    "variant,bad,match",
    [
        (Variant.ROW, np.float32(np.nan), "of row 2"),
        (Variant.ROW, np.float32(-1.0), "of row 2"),
        (Variant.ROW, np.float32(70000.0), "of row 2"),
        (Variant.MATRIX, np.float32(np.inf), "of matrix 0"),
        (Variant.B128, np.float16(-0.5), "in block 1 of row 2"),
        (Variant.B256, np.float16(np.inf), "in block 1 of row 2"),
    ],
)
def test_v2_invalid_scales_refused(variant: Variant, bad, match: str):
    """A crafted companion whose stored scale is invalid (FORMAT.md §3.1) is refused, naming where; the
    encoder refuses the same scale."""
    rng = np.random.default_rng(9)
    rows, k = 4, 512
    codes = random_codes(rng, (rows, k), 0.3)
    kw = v2_scales(rng, variant, rows, k, 1)
    enc = codec.encode(codes, variant, **kw)
    comp = enc.companion.copy()
    off = enc.header.scales_offset
    if variant.scale_block:
        idx, width = 2 * (k // variant.scale_block) + 1, 2
    else:
        idx, width = (2 if variant is Variant.ROW else 0), 4
    comp[off + width * idx : off + width * (idx + 1)] = np.frombuffer(bad.tobytes(), np.uint8)
    with pytest.raises(codec.FormatError, match=match):
        codec.decode(enc.blocks, comp, variant.type_id, k, rows, 1)
    key, arr = next(iter(kw.items()))
    arr = arr.copy()
    arr.reshape(-1)[idx] = bad
    with pytest.raises(ValueError):
        codec.encode(codes, variant, **{key: arr})


def test_v2_encode_row_length_rules():
    codes = np.zeros((2, 96), dtype=np.int8)
    codec.encode(codes, Variant.MATRIX, matrix_scales=np.ones(1, np.float32))
    codec.encode(codes, Variant.ROW, row_scales=np.ones(2, np.float32))
    with pytest.raises(ValueError, match="multiple of 128"):
        codec.encode(codes, Variant.B128, block_scales=np.ones((2, 0), np.float16))
    with pytest.raises(ValueError, match="multiple of 256"):
        codec.encode(np.zeros((2, 384), np.int8), Variant.B256, block_scales=np.ones((2, 1), np.float16))
    with pytest.raises(ValueError, match="multiple of 32"):
        codec.encode(np.zeros((2, 48), np.int8), Variant.ROW, row_scales=np.ones(2, np.float32))
    with pytest.raises(ValueError, match="row_scales"):
        codec.encode(codes, Variant.ROW, row_scales=np.ones(3, np.float32))


def test_v2_bits_per_weight():
    """FORMAT.md §8: B256 2.0625 - z, B128 2.125 - z, ROW 2 - z + 32/K, MATRIX 2 - z; the companion's exact
    size agrees within the overhead bound at K = 2048."""
    rows, k, z = 1024, 2048, 0.42
    s = int((1 - z) * rows * k)
    for v, want in [(Variant.B256, 2.0625), (Variant.B128, 2.125), (Variant.ROW, 2 + 32 / k), (Variant.MATRIX, 2.0)]:
        assert math.isclose(bits_per_weight(v, z, k), want - z)
        real = 8 * (rows * k // 8 + codec.companion_size(v, k, rows, 1, s, 5)) / (rows * k)
        assert want - z <= real <= want - z + 0.01, (v, real)
