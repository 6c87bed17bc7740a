"""BITCOS CPU kernels (csrc/): the generic C, portable C, AVX2 and AVX-512 kernels bit-identical to each other and to an
independent numpy evaluation of the arithmetic contract v2 in csrc/bitcos-kernels.h (``contract.reference_mm``,
computed from the plain codes and scales, not from the encoding), for every variant of format versions 1 and 2
(G128, PT; MATRIX, ROW, B128, B256: FORMAT.md §4.2), row lengths down to 32 (a partial last 128-weight unit
when K % 128 != 0), and both forms of the contract's FMA (libbitcos_kernels.so: BITCOS_FMA=1,
libbitcos_kernels_nofma.so: BITCOS_FMA=0). The kernels read the rows through the C descriptor ``bitcos_rows``
that ``harness.BitcosRows.descriptor`` builds from the reference codec's bytes, as the CPU glue does.

Needs the harness libraries; when neither installed nor built, the ``kernel_library`` fixture (conftest.py)
builds them with cmake into build/kernels (as docs/KERNELS.md describes) or skips. A SIMD path is skipped when
/proc/cpuinfo lacks its extensions. The AVX2 path tested here is the x86-64-v3 object (compiled with AVX-512
off).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ggml_bitcos import contract, harness, tq
from ggml_bitcos.format import QK, QK_K, Variant
from ggml_bitcos.q8k import Q8K_DTYPE, quantize_q8k, random_q8k
from ggml_bitcos.ternary import random_codes

# TQ2_0's real vec_dot (the installed ggml) and its comparison helpers; the fixture tq2_vec_dot is in conftest.py
import fuzzing  # noqa: E402  (the kernel manifest, as the fuzzer builds the kernels)
import tq2_reference as tq2c  # noqa: E402  (tests/ is on sys.path, as for crafted.py)

VARIANTS = tuple(Variant)
VARIANT_IDS = tuple(v.name.lower() for v in VARIANTS)
ZERO_DENSITIES = (0.0, 0.4, 1.0)
# every row length of the brief that a variant allows (K % k_multiple == 0): MATRIX / ROW all of them, with
# partial last units at 32, 64, 96, 160, 576 (4.5 units), 640 is 5 units (odd: a Q8_K block with one half)
KS = (32, 64, 96, 128, 160, 384, 576, 640, 1536, 2048)
VARIANT_KS = [(v, k) for v in VARIANTS for k in KS if k % v.k_multiple == 0]
NRS = (1, 3, 5, 17)  # odd row counts: the AVX-512 GEMV pairs rows, an odd last row pairs with itself
NCS = (1, 2, 5, 9)  # GEMV, column pairs, an odd last column, a second column tile (8 per tile)
FMAS = (True, False)
FMA_IDS = ("fma", "nofma")

# The kernels whose table entry covers every descriptor (no `covers` test): the reference and the portable one.
UNIVERSAL = ("generic", "portable")

# Extensions each harness object was compiled for (CMakeLists.txt); a CPU missing one skips the path.
CPU_FLAGS_NEEDED = {
    "avx2": {"avx2", "fma", "bmi2", "f16c"},
    "avx512": {
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512dq",
        "avx512cd",
        "avx512_vnni",
        "avx512_vbmi2",
        "avx512_bitalg",
        "avx512_vpopcntdq",
        "bmi2",
        "f16c",
    },
}


@pytest.fixture
def require(kernel_library, cpu_flags: set[str]) -> Callable[..., None]:
    """require(impl, fma=True) skips the calling test unless this CPU and the harness library of that FMA
    form can run kernel `impl` (the generic one always runs)."""

    def check(impl: str, fma: bool = True) -> None:
        missing = CPU_FLAGS_NEEDED.get(impl, set()) - cpu_flags
        if missing:
            pytest.skip(f"CPU lacks {sorted(missing)} for {impl}")
        if not harness.available(impl, fma):
            pytest.skip(f"{impl} not compiled into the harness library")

    return check


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def random_block_scales(rng: np.random.Generator, nr: int, k: int, block: int = QK) -> np.ndarray:
    """fp16 scales per `block` weights. Per 128 (G128, B128): about half of the Q8_K blocks have two equal
    half scales (as every block of a tensor converted from TQ2_0: one FMA per lane in the contract) and the
    others two different ones (two FMAs), so both cases and their mixture inside one row pair / column pair
    are exercised."""
    ds = rng.uniform(0.0, 2.0, size=(nr, k // block)).astype(np.float16)
    if block == QK:
        odd = ds[:, 1::2]
        same = rng.random(odd.shape) < 0.5
        ds[:, 1::2] = np.where(same, ds[:, 0::2][:, : odd.shape[1]], odd)
    return ds


class Case:
    """Random codes, the scales of one variant, the encoded rows and activations of one test case."""

    def __init__(self, seed: int, variant: Variant, z: float, k: int, nr: int, nc: int):
        rng = np.random.default_rng(seed)
        self.variant, self.k = variant, k
        self.codes = random_codes(rng, (nr, k), z)
        self.block_scales = random_block_scales(rng, nr, k, variant.scale_block) if variant.scale_block else None
        self.scale = float(np.float32(rng.uniform(0.05, 3.0)))
        self.row_scales = rng.uniform(0.05, 3.0, size=nr).astype(np.float32) if variant is Variant.ROW else None
        self.w = harness.encode_rows(
            self.codes, variant, block_scales=self.block_scales, scale=self.scale, row_scales=self.row_scales
        )
        self.y = random_q8k(rng, nc, k)
        # ggml's Q8_K scale carries the sign of the block's largest |x|: negative scales occur
        self.y["d"] *= np.where(rng.random(self.y["d"].shape) < 0.3, -1.0, 1.0).astype(np.float32)

    def reference(self, fma: bool, y: np.ndarray | None = None) -> np.ndarray:
        return contract.reference_mm(
            self.codes,
            self.variant,
            self.y if y is None else y,
            block_scales=self.block_scales,
            scale=self.scale,
            row_scales=self.row_scales,
            fma=fma,
        )


def case_seed(variant: Variant, z: float, k: int, nr: int, nc: int) -> int:
    return (variant * 1_000_003 + int(z * 1000) * 10_007 + k * 101 + nr * 17 + nc) & 0x7FFFFFFF


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
@pytest.mark.parametrize("z", ZERO_DENSITIES)
@pytest.mark.parametrize("variant,k", VARIANT_KS, ids=[f"{v.name.lower()}-k{k}" for v, k in VARIANT_KS])
def test_every_kernel_equals_the_numpy_contract(
    require, impl: str, variant: Variant, k: int, z: float, fma: bool
) -> None:
    """Every kernel gives the numpy reference's float bits (so all kernels give the same bits), every
    variant, every row length it allows, odd row counts and several column counts (GEMV and GEMM tiles)."""
    require(impl, fma)
    for nr in NRS:
        for nc in NCS:
            c = Case(case_seed(variant, z, k, nr, nc), variant, z, k, nr, nc)
            out = harness.mm(impl, c.w, c.y, fma)
            assert out.shape == (nc, nr)
            np.testing.assert_array_equal(bits(out), bits(c.reference(fma)), err_msg=f"nr={nr} nc={nc}")


# Shapes around the kernels' internal tiles: 32 rows, 8 columns, chunks of 8 Q8_K blocks (2048 weights), GEMV
# spans of 8 chunks (16384 weights), rows of <= 512 bitmap bytes paired adjacently in the AVX-512 GEMV.
TILE_SHAPES = [
    (33, 9, 2048 * 2 + 384),
    (32, 8, 2048),
    (64, 17, 2048 + 128),
    (40, 3, 6144),
    (7, 1, 2048 * 3),
    (35, 1, 16384 + 2048 + 256),
    (33, 3, 2048 + 96),
    (9, 1, 4096 + 160),
    (65, 2, 32),
]


TILE_CASES = [(v, s) for v in VARIANTS for s in TILE_SHAPES if s[2] % v.k_multiple == 0]


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
@pytest.mark.parametrize(
    "variant,shape", TILE_CASES, ids=[f"{v.name.lower()}-nr{s[0]}-nc{s[1]}-k{s[2]}" for v, s in TILE_CASES]
)
def test_tile_edges_against_reference(
    require, impl: str, variant: Variant, shape: tuple[int, int, int], fma: bool
) -> None:
    require(impl, fma)
    nr, nc, k = shape
    for z in (0.0, 0.4, 1.0):
        c = Case(case_seed(variant, z, k, nr, nc) + 7, variant, z, k, nr, nc)
        np.testing.assert_array_equal(bits(harness.mm(impl, c.w, c.y, fma)), bits(c.reference(fma)), err_msg=f"z={z}")


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_rows_starting_mid_tensor(require, impl: str, variant: Variant, fma: bool) -> None:
    """A run of rows whose first sign is not at pool bit 0 (how ggml threads split a matrix): the bitmap,
    the sign positions and the row or block scales all start at the run's first row."""
    require(impl, fma)
    k = 2048 + 512 if variant is Variant.B256 else 2048 + 384 if variant.k_multiple == QK else 2048 + 96
    c = Case(11 + variant, variant, 0.37, k, 23, 3)
    ref = c.reference(fma)
    for lo, hi in ((5, 23), (1, 2), (9, 20)):
        np.testing.assert_array_equal(bits(harness.mm(impl, c.w.rows(lo, hi), c.y, fma)), bits(ref[:, lo:hi]))


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_dense_words_inside_sparse_rows(require, impl: str, variant: Variant, fma: bool) -> None:
    """The AVX-512 GEMV reads signs with a byte-granular window that holds only 57 bits; a chunk of bitmaps
    at the unit stride of 16 (every variant but G128) takes it without a per-word test when a vector popcount
    finds no word with more than 57 present weights (KERNELS.md §3). Sparse rows (z = 0.5) with single words
    of exactly 57, 58, 63 and 64 present weights at different chunks and rows must decode exactly on every
    path, in the one-column and the tiled form, with long and with short rows, and in a row's shorter last
    chunk (k = 2560, 6912; and 6912 + 32 with a partial last unit for MATRIX / ROW)."""
    require(impl, fma)
    rng = np.random.default_rng(57 + variant)
    # k = 6144: long rows (the GEMV pairs r with r + nrh); k = 4096, 2560: short rows (adjacent pairs, §5);
    # k = 2560 / 6912 end in a chunk of 2 / 3 Q8_K blocks (words -8 .. -1 / -12 .. -1)
    shapes = [(7, 2048 * 3), (9, 4096), (7, 2560), (7, 6912), (7, 6912 + 32)]
    for nr, k in [(nr, k) for nr, k in shapes if k % variant.k_multiple == 0]:
        codes = random_codes(rng, (nr, k), 0.5)
        words = k // 64
        for row, word, present in (
            (0, 5, 64),
            (3, 40, 58),
            (4, 40, 57),
            (6, 95, 58),
            (1, 64, 64),
            (5, 33, 63),
            (2, -2, 58),
            (0, -1, 64),
            (6, -3, 57),
        ):
            seg = rng.choice(np.array([-1, 1], dtype=np.int8), size=64)
            seg[rng.permutation(64)[: 64 - present]] = 0
            w0 = 64 * (word % words)
            codes[row, w0 : w0 + 64] = seg
        ds = random_block_scales(rng, nr, k, variant.scale_block) if variant.scale_block else None
        rs = rng.uniform(0.5, 1.5, nr).astype(np.float32) if variant is Variant.ROW else None
        w = harness.encode_rows(codes, variant, block_scales=ds, scale=0.75, row_scales=rs)
        for nc in (1, 3):
            y = random_q8k(rng, nc, k)
            ref = contract.reference_mm(codes, variant, y, block_scales=ds, scale=0.75, row_scales=rs, fma=fma)
            np.testing.assert_array_equal(bits(harness.mm(impl, w, y, fma)), bits(ref), err_msg=f"k={k} nc={nc}")


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
def test_row_scales_uniform_in_some_tiles(require, impl: str, fma: bool) -> None:
    """The SIMD kernels run a tile of rows whose row scales are all the same (bitwise) like a MATRIX tile
    (y.d * scale staged once per column block), any other tile per row: a ROW tensor whose first tile has
    one scale, whose second differs in its last row only, and whose third is short and uniform again."""
    require(impl, fma)
    rng = np.random.default_rng(3)
    nr, k = 70, 2048 + 160
    codes = random_codes(rng, (nr, k), 0.3)
    rs = np.full(nr, np.float32(0.8125))
    rs[63] = np.float32(0.8125) * np.float32(1 + 2**-20)
    rs[64:] = np.float32(1.25)
    w = harness.encode_rows(codes, Variant.ROW, row_scales=rs)
    for nc in (1, 4):
        y = random_q8k(rng, nc, k)
        ref = contract.reference_mm(codes, Variant.ROW, y, row_scales=rs, fma=fma)
        np.testing.assert_array_equal(bits(harness.mm(impl, w, y, fma)), bits(ref), err_msg=f"nc={nc}")


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
def test_extreme_values(require, impl: str, fma: bool) -> None:
    """int8 -128 / 127 activations against all -1 / +1 codes (q + 128 and -q overflow traps), large and
    subnormal fp16 block scales and fp32 row scales, negative Q8_K scales; every variant."""
    require(impl, fma)
    k, nr = 2048 + 256, 4
    codes = np.empty((nr, k), dtype=np.int8)
    codes[0] = -1
    codes[1] = 1
    codes[2] = np.where(np.arange(k) % 2 == 0, -1, 1)
    codes[3] = np.where(np.arange(k) % 3 == 0, 0, -1)
    y = np.zeros((3, (k + 255) // 256), dtype=Q8K_DTYPE)
    y["qs"][0] = -128
    y["qs"][1] = 127
    y["qs"][2] = np.where(np.arange(256) % 2 == 0, -128, 127).astype(np.int8)
    y["d"] = np.float32(1.5e-3)
    y["d"][:, 1::2] = np.float32(-2.5e-3)
    rs = np.array([65504.0, 6e-8, 1.0, 0.0], dtype=np.float32)
    for variant in VARIANTS:
        ds = None
        if variant.scale_block:
            ds = np.full((nr, k // variant.scale_block), 65504.0, dtype=np.float16)
            ds[2] = np.float16(6e-8)  # subnormal
            ds[3, ::2] = 0.0
        rsv = rs if variant is Variant.ROW else None
        w = harness.encode_rows(codes, variant, block_scales=ds, scale=0.75, row_scales=rsv)
        ref = contract.reference_mm(codes, variant, y, block_scales=ds, scale=0.75, row_scales=rsv, fma=fma)
        np.testing.assert_array_equal(bits(harness.mm(impl, w, y, fma)), bits(ref), err_msg=variant.name)


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
def test_tq2_0_data_same_bits_in_b256_g128_matrix_pt(kernel_library, cpu_flags: set[str], fma: bool) -> None:
    """A TQ2_0 tensor (one fp16 scale per 256) as B256 and as G128 with each scale in both halves, and a
    TQ2_0 tensor with one scale as MATRIX and as PT, give the same bits on every kernel: the layouts differ
    (scales in the companion or in the blocks), the arithmetic may not. With llama.cpp installed,
    test_tq2_0_reference_b256_matrix compares them with TQ2_0's own vec_dot too."""
    rng = np.random.default_rng(256)
    nr, k = 37, 2048 + 256
    codes = random_codes(rng, (nr, k), 0.35)
    d = rng.uniform(0.1, 2.0, size=(nr, k // QK_K)).astype(np.float16)
    y = random_q8k(rng, 5, k)
    impls = [
        i
        for i in harness.kernel_names(fma)
        if CPU_FLAGS_NEEDED.get(i, set()) <= cpu_flags and harness.available(i, fma)
    ]
    pairs = (
        (
            harness.encode_rows(codes, Variant.B256, block_scales=d),
            harness.encode_rows(codes, Variant.G128, block_scales=np.repeat(d, 2, axis=1)),
        ),
        (
            harness.encode_rows(codes, Variant.MATRIX, scale=float(d[0, 0])),
            harness.encode_rows(codes, Variant.PT, scale=float(d[0, 0])),
        ),
    )
    for v2, v1 in pairs:
        want = harness.mm("generic", v1, y, fma)
        for impl in impls:
            for w in (v2, v1):
                np.testing.assert_array_equal(
                    bits(harness.mm(impl, w, y, fma)), bits(want), err_msg=f"{impl} {w.variant.name}"
                )


def test_tq2_0_reference_b256_matrix(tq2_vec_dot) -> None:
    """B256 (each TQ2_0 block's scale) and MATRIX (a TQ2_0 tensor with one scale) equal the installed ggml's
    TQ2_0 vec_dot bit for bit, every kernel (the FMA form that ggml was built with). Uses the TQ2_0 reference of
    tests/tq2_reference.py; skipped without llama_cpp."""
    t = tq2c
    vec_dot, fma, _ = tq2_vec_dot
    for k in (256, 768, 2304):
        for variant in (Variant.B256, Variant.MATRIX):
            for magnitude in ("normal", "large"):
                rng = np.random.default_rng(k + 13 * variant + (magnitude == "large"))
                nr = 24
                codes = t.mixed_density_codes(rng, nr, k)
                if variant is Variant.B256:
                    d = rng.uniform(0.0, 3.0, size=(nr, k // QK_K)).astype(np.float16)
                    if magnitude == "large":
                        d = (d.astype(np.float32) * 1e4).astype(np.float16)
                    w = harness.encode_rows(codes, variant, block_scales=d)
                else:
                    d16 = np.float16(rng.uniform(0.01, 2.0) * (1e3 if magnitude == "large" else 1.0))
                    d = np.full((nr, k // QK_K), d16, dtype=np.float16)
                    w = harness.encode_rows(codes, variant, scale=float(np.float32(d16)))
                t.assert_kernels_match_tq2_0(vec_dot, fma, tq.tq2_0_encode(codes, d), w, rng, k, magnitude)


def test_reference_detects_a_single_flipped_sign(kernel_library) -> None:
    """The comparisons above can fail: one flipped sign changes the result, in the reference and the kernel,
    also in a partial last unit."""
    for variant, k, idx_from_end in ((Variant.G128, 384, False), (Variant.ROW, 96, True)):
        c = Case(3, variant, 0.3, k, 2, 1)
        nz = np.flatnonzero(c.codes[0])
        idx = int(nz[-1] if idx_from_end else nz[10])
        flipped = c.codes.copy()
        flipped[0, idx] = -flipped[0, idx]
        c.y["qs"].reshape(1, -1)[0, idx] = 100
        a = c.reference(True)
        b = contract.reference_mm(
            flipped, variant, c.y, block_scales=c.block_scales, scale=c.scale, row_scales=c.row_scales
        )
        assert a[0, 0] != b[0, 0]
        w2 = harness.encode_rows(flipped, variant, block_scales=c.block_scales, scale=c.scale, row_scales=c.row_scales)
        assert harness.mm("generic", w2, c.y)[0, 0] == b[0, 0] != harness.mm("generic", c.w, c.y)[0, 0]


def test_encoder_layout() -> None:
    """The rows the harness passes to a kernel follow FORMAT.md: LSB-first bitmap, v1 G128's fp16 d after
    each 16 bitmap bytes, version-2 rows K/8 bitmap bytes back to back, signs packed back to back, the pool
    with its zero tail; and the descriptor built from them is the one the header describes."""
    codes = np.zeros((2, 128), dtype=np.int8)
    codes[0, [0, 9, 127]] = [1, -1, -1]
    codes[1, [3]] = [-1]
    w = harness.encode_rows(codes, Variant.G128, block_scales=np.array([[1.0], [0.5]], dtype=np.float16))
    assert w.blocks.shape == (2, 18)
    assert w.blocks[0, 0] == 0b1 and w.blocks[0, 1] == 0b10 and w.blocks[0, 15] == 0x80
    assert w.blocks[0, 16:18].view("<f2")[0] == 1.0
    assert list(w.sign_pos) == [0, 3]
    assert w.pool[0] == 0b1110  # signs: row0 (+, -, -), row1 (-)
    assert w.pool.size == 64 + 64
    d = w.descriptor()
    assert (d.unit_bytes, d.scale_stride, d.scale_row_bytes, d.block_scale_shift, d.block_scale_offset) == (
        18,
        18,
        18,
        0,
        16,
    )
    assert d.row_scale is None and d.block_scale is d.bits

    codes = np.zeros((2, 96), dtype=np.int8)
    codes[0, [0, 95]] = [1, -1]
    codes[1, [40]] = [1]
    w = harness.encode_rows(codes, Variant.ROW, row_scales=np.array([0.5, 2.0], np.float32))
    assert w.blocks.shape == (2, 12) and w.blocks[0, 0] == 1 and w.blocks[0, 11] == 0x80 and w.blocks[1, 5] == 1
    d = w.descriptor()
    assert d.unit_bytes == 16 and list(d.row_scale) == [0.5, 2.0] and d.block_scale is None
    w = harness.encode_rows(np.zeros((3, 512), np.int8), Variant.B256, block_scales=np.ones((3, 2), np.float16))
    d = w.descriptor()
    assert (d.unit_bytes, d.scale_stride, d.scale_row_bytes, d.block_scale_shift) == (16, 2, 4, 1)
    assert w.blocks.shape == (3, 64)


def test_descriptors_the_simd_paths_do_not_cover_run_the_reference(require, impl: str) -> None:
    """The SIMD kernels cover the layouts the format has (bitcos-kernels-x86.h x86_covered); the kernel table
    runs any other valid descriptor on the portable kernel, with the same result: B128 scales at a stride of 4
    (not adjacent: not covered), B256 scales at a stride of 6 (covered: per-256 scales are read one by one at
    any stride). bitcos_h_covers tells which runs."""
    require(impl)
    for variant in (Variant.B128, Variant.B256):
        c = Case(40 + variant, variant, 0.3, 1536, 5, 3)
        for stride in (4, 6):
            e = np.zeros((5, 1536 // variant.scale_block * stride), np.uint8)
            for r in range(5):
                for u in range(1536 // variant.scale_block):
                    e[r, u * stride : u * stride + 2] = c.block_scales[r, u : u + 1].view(np.uint8)
            d = replace(c.w.descriptor(), block_scale=e, scale_stride=stride, scale_row_bytes=e.shape[1])
            dst = np.full((3, 5), np.nan, np.float32)
            lib = harness.load_library(True)
            rc = lib.bitcos_h_mm(harness.kernel_index(impl), *d.args(), 5, c.y.ctypes.data, 3, dst.ctypes.data)
            assert rc == 0
            covered = lib.bitcos_h_covers(harness.kernel_index(impl), *d.args(), 5, c.y.ctypes.data, 3, dst.ctypes.data)
            assert covered == int(impl in UNIVERSAL or variant is Variant.B256), (variant.name, stride)
            np.testing.assert_array_equal(bits(dst), bits(c.reference(True)), err_msg=f"{variant.name} {stride}")


def test_kernel_table(kernel_library) -> None:
    """The harness library's kernel table (names from C): the generic kernel first and always available,
    names unique, the best kernel available, and every layout the format has (each variant as the reference
    codec encodes it, k with a partial unit where the variant allows one) covered by every kernel, so no
    converted file ever runs on the fallback."""
    names = harness.kernel_names()
    assert names[0] == "generic" and len(set(names)) == len(names), names
    assert harness.available("generic") and harness.available(harness.best_kernel())
    for variant in VARIANTS:
        k = 2048 + (32 if variant.k_multiple == 32 else 0)
        c = Case(7 + variant, variant, 0.3, k, 3, 1)
        for impl in names:
            if harness.available(impl):
                assert harness.covers(impl, c.w), (impl, variant.name)


# -march levels of llama.cpp's x86 CPU variants and the kernel each one's table prefers
GGML_X86_BUILDS = (("x86-64", "portable"), ("x86-64-v3", "avx2"), ("x86-64-v4", "avx512"))


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 builds")
@pytest.mark.parametrize("march,kernel", GGML_X86_BUILDS, ids=[m for m, _ in GGML_X86_BUILDS])
def test_ggml_x86_variant_names_its_kernel_once(tmp_path: Path, march: str, kernel: str) -> None:
    """Built as ggml-cpu builds a CPU variant (every kernel file and the table with the variant's flags), the
    table's best entry is the kernel those flags allow, and bitcos_kernel_best_told (the glue's load-time
    line) names it exactly once however often it is asked for. The program only lists the table, so it runs on
    any x86-64 CPU."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    csrc, ctests = fuzzing.CSRC, fuzzing.CTESTS
    srcs = [csrc / s for s in fuzzing.variant_build_sources("x86_64")]
    exe = tmp_path / "cases"
    flags = ["-std=c11", "-O1", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", f"-march={march}"]
    r = subprocess.run(
        [cc, *flags, "-I", str(csrc), *map(str, srcs), str(ctests / "bitcos-kernel-cases.c"), "-lm", "-o", str(exe)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    empty = tmp_path / "none.bin"
    empty.write_bytes(np.zeros(12, "<i8").tobytes())
    r = subprocess.run([str(exe), str(empty), str(tmp_path / "out.bin")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[0].split()[-1] == kernel, r.stdout
    assert r.stderr.splitlines() == [f"BITCOS CPU kernel: {kernel}"], r.stderr


_FALLBACK_SCRIPT = """
import sys
from dataclasses import replace
import numpy as np
from ggml_bitcos import harness
from ggml_bitcos.format import Variant
from ggml_bitcos.q8k import random_q8k
rng = np.random.default_rng(3)
codes = rng.integers(-1, 2, size=(4, 512)).astype(np.int8)
w = harness.encode_rows(codes, Variant.B128, block_scales=np.ones((4, 4), np.float16))
e = np.zeros((4, 16), np.uint8)
e[:, 0::4] = np.ones((4, 4), np.float16).view(np.uint8)[:, 0::2]
e[:, 1::4] = np.ones((4, 4), np.float16).view(np.uint8)[:, 1::2]
d = replace(w.descriptor(), block_scale=e, scale_stride=4, scale_row_bytes=16)
y = random_q8k(rng, 2, 512)
dst = np.zeros((2, 4), np.float32)
lib = harness.load_library(True)
for _ in range(3):
    assert lib.bitcos_h_mm(harness.kernel_index(sys.argv[1]), *d.args(), 4, y.ctypes.data, 2, dst.ctypes.data) == 0
"""


def test_uncovered_layout_is_reported_once(require, impl: str, kernel_library) -> None:
    """A descriptor a SIMD kernel does not cover runs on the portable kernel, and the kernel table says so once
    per kernel and process (in ggml: GGML_LOG_WARN; in the harness: stderr), naming the kernel; the generic
    and the portable kernels cover everything and say nothing."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    require(impl)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    r = subprocess.run(
        [sys.executable, "-c", _FALLBACK_SCRIPT, impl], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if "does not cover" in ln]
    if impl in UNIVERSAL:
        assert lines == []
    else:
        assert len(lines) == 1 and f"the {impl} kernel" in lines[0] and "portable kernel runs it" in lines[0], lines


def test_harness_refuses_bad_descriptors(kernel_library) -> None:
    """bitcos_h_mm checks the descriptor's shape before any kernel runs: k not a multiple of 32, block scales
    whose granularity does not divide k, a row shorter than k/8 bytes."""
    c = Case(5, Variant.B256, 0.3, 512, 2, 1)
    d = c.w.descriptor()
    lib = harness.load_library(True)
    dst = np.zeros((1, 2), np.float32)
    for bad in (replace(d, k=500), replace(d, k=384), replace(d, block_scale_shift=2), replace(d, bits=d.bits[:, :60])):
        assert lib.bitcos_h_mm(0, *bad.args(), 2, c.y.ctypes.data, 1, dst.ctypes.data) == -2


def test_quantize_q8k_round_trip() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 640)).astype(np.float32)
    y = quantize_q8k(x)
    assert y.shape == (3, 3)
    deq = (y["qs"].astype(np.float32) * y["d"][..., None]).reshape(3, -1)[:, :640]
    assert np.all(np.abs(deq - x) <= np.repeat(np.abs(y["d"]), 256, axis=1)[:, :640] * 0.5 + 1e-6)
    assert np.all(np.abs(y["qs"]) <= 127)
    np.testing.assert_array_equal(y["bsums"], y["qs"].reshape(3, 3, 16, 16).sum(axis=3))
    assert not y["qs"].reshape(3, -1)[:, 640:].any()
    r = random_q8k(rng, 2, 96)
    assert r["qs"].reshape(2, -1)[:, 96:].any() == 0 and r["qs"].reshape(2, -1)[:, :96].any()


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
def test_quantized_activations_through_all_paths(kernel_library, cpu_flags: set[str], fma: bool) -> None:
    """Realistic activations (ggml's Q8_K quantizer, zero-padded past K) instead of random int8."""
    rng = np.random.default_rng(8)
    nr, nc = 12, 4
    simd_impls = [impl for impl, need in CPU_FLAGS_NEEDED.items() if need <= cpu_flags]
    for variant, k in ((Variant.G128, 4096), (Variant.MATRIX, 576), (Variant.B256, 1536), (Variant.ROW, 4096 + 64)):
        codes = random_codes(rng, (nr, k), 0.45)
        ds = (
            rng.uniform(0.01, 0.1, size=(nr, k // variant.scale_block)).astype(np.float16)
            if variant.scale_block
            else None
        )
        rs = rng.uniform(0.01, 0.1, size=nr).astype(np.float32)
        w = harness.encode_rows(codes, variant, block_scales=ds, scale=0.05, row_scales=rs)
        y = quantize_q8k(rng.normal(size=(nc, k)).astype(np.float32))
        ref = contract.reference_mm(
            codes, variant, y, block_scales=ds, scale=0.05, row_scales=rs if variant is Variant.ROW else None, fma=fma
        )
        for impl in [*UNIVERSAL, *simd_impls]:
            if harness.available(impl, fma):
                np.testing.assert_array_equal(
                    bits(harness.mm(impl, w, y, fma)), bits(ref), err_msg=f"{impl} {variant.name}"
                )


def test_fma_forms_differ_and_reference_follows_each(kernel_library) -> None:
    """The two builds really implement different arithmetic (so testing both is meaningful), and each
    matches the reference of its own form only."""
    c = Case(99, Variant.PT, 0.3, 4096, 32, 4)
    fused = harness.mm("generic", c.w, c.y, True)
    plain = harness.mm("generic", c.w, c.y, False)
    assert np.count_nonzero(bits(fused) != bits(plain)) > 10
    for got, fma in ((fused, True), (plain, False)):
        np.testing.assert_array_equal(bits(got), bits(c.reference(fma)))


def test_numpy_fma_is_correctly_rounded() -> None:
    """contract.fma_f32 against the C library's fmaf, on random values and on cases built so that a
    float64 a*b + c rounded to float32 would round twice (exact result just off a float32 halfway point)."""
    import ctypes.util

    libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    libm.fmaf.restype = ctypes.c_float
    libm.fmaf.argtypes = [ctypes.c_float] * 3
    rng = np.random.default_rng(4)
    n = 4000
    a = rng.integers(-70000, 70000, n).astype(np.float32)
    b = (rng.uniform(-1, 1, n) * np.exp2(rng.integers(-30, 5, n))).astype(np.float32)
    c = (rng.uniform(-1, 1, n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    # halfway cases: 2^32 + 1 = 641 * 6700417, so a = 641 * 2^-10 and b = 6700417 * 2^-46 (both exact
    # float32) give a * b = 2^-24 * (1 + 2^-32); with c = 1 the exact sum is 1 + 2^-24 + 2^-56, just above the
    # float32 halfway point 1 + 2^-24. float64 drops the 2^-56 (one rounding, to the halfway point), float32
    # then rounds to even (1.0): wrong; the true fma gives 1 + 2^-23. Scaled by 2^s and with both signs.
    scales = np.exp2(np.arange(-20, 21, 4)).astype(np.float32)
    sign = np.repeat(np.array([1, -1], np.float32), scales.size)
    sc = np.tile(scales, 2)
    ha = sign * np.float32(641 * 2.0**-10) * sc
    hb = np.full(sc.size, np.float32(6700417 * 2.0**-46))
    hc = sign * sc
    naive = (ha.astype(np.float64) * hb + hc).astype(np.float32)
    assert np.all(naive == hc)  # the double rounding these cases are built to catch
    a = np.concatenate([a, ha])
    b = np.concatenate([b, hb])
    c = np.concatenate([c, hc])
    got = contract.fma_f32(a, b, c)
    want = np.array([libm.fmaf(x, y_, z) for x, y_, z in zip(a.tolist(), b.tolist(), c.tolist())], np.float32)
    np.testing.assert_array_equal(bits(got), bits(want))


class GuardedArray:
    """A copy of `a` whose last byte sits right before a PROT_NONE page: reading past it faults."""

    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def __init__(self, a: np.ndarray):
        page = mmap.PAGESIZE
        n = a.nbytes
        npages = -(-n // page) + 1
        self.buf = mmap.mmap(-1, (npages + 1) * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.base = np.frombuffer(self.buf, dtype=np.uint8)
        self.guard = npages * page
        assert self._libc.mprotect(self.base.ctypes.data + self.guard, page, 0) == 0
        self.array = self.base[self.guard - n : self.guard].view(a.dtype).reshape(a.shape)
        self.array[...] = a

    def close(self) -> None:
        assert (
            self._libc.mprotect(self.base.ctypes.data + self.guard, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_WRITE)
            == 0
        )
        del self.array, self.base
        self.buf.close()


def test_pool_reads_stay_inside_the_format_tail(require, impl: str) -> None:
    """The sign pool ends exactly at a PROT_NONE page: a read past the FORMAT.md §4.4 tail would crash."""
    require(impl)
    rng = np.random.default_rng(21)
    for variant, k in ((Variant.G128, 2048 + 384), (Variant.MATRIX, 2048 + 416)):
        for z in (0.0, 0.5, 1.0):
            nr = 9
            codes = random_codes(rng, (nr, k), z)
            codes[-1, -200:] = 0  # the last row ends in zeros: its cursor sits at the end of the signs
            ds = rng.uniform(0.0, 2.0, size=(nr, k // QK)).astype(np.float16) if variant.scale_block else None
            w = harness.encode_rows(codes, variant, block_scales=ds, scale=0.5)
            g = GuardedArray(w.pool)
            y = random_q8k(rng, 2, k)
            ref = contract.reference_mm(codes, variant, y, block_scales=ds, scale=0.5)
            np.testing.assert_array_equal(bits(harness.mm(impl, replace(w, pool=g.array), y)), bits(ref))
            g.close()


@pytest.mark.parametrize("variant", (Variant.MATRIX, Variant.ROW), ids=("matrix", "row"))
def test_partial_unit_reads_stay_inside_the_row(require, impl: str, variant: Variant) -> None:
    """With K % 128 != 0 the last unit of a row holds (K % 128) / 8 bitmap bytes; the bitmap of the run's
    last row ends exactly at a PROT_NONE page, so a kernel reading the whole 16-byte unit faults. Every
    partial size (32, 64, 96 weights), alone and after whole units, one and several columns, dense rows
    (every bit of the partial unit present)."""
    require(impl)
    rng = np.random.default_rng(96)
    for k in (32, 64, 96, 160, 2048 + 224, 4096 + 32):
        for z in (0.0, 0.5):
            nr = 5
            codes = random_codes(rng, (nr, k), z)
            rs = rng.uniform(0.5, 2.0, nr).astype(np.float32) if variant is Variant.ROW else None
            w = harness.encode_rows(codes, variant, scale=0.5, row_scales=rs)
            g = GuardedArray(w.blocks)
            for nc in (1, 3):
                y = random_q8k(rng, nc, k)
                ref = contract.reference_mm(codes, variant, y, scale=0.5, row_scales=rs)
                np.testing.assert_array_equal(
                    bits(harness.mm(impl, replace(w, blocks=g.array), y)), bits(ref), err_msg=f"k={k} z={z} nc={nc}"
                )
            g.close()
