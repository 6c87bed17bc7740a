"""The 2-bit codes form of a BITCOS weight (csrc/bitcos-kernels.h, docs/KERNELS.md §8): the decode BITCOS -> codes
(the generic C path and the fast one) gives exactly the bytes a numpy packing of the ternary codes gives (TQ2_0's
code layout, padding t = 0), and every codes kernel of the kernel table gives the float bits of the generic BITCOS
kernel on the weight the codes were decoded from: every variant, odd K, z = 0 / 0.4 / 1, 1-8 columns, both forms
of the contract's FMA. Needs the harness libraries (the ``kernel_library`` fixture builds or skips)."""

from __future__ import annotations

import numpy as np
import pytest

from ggml_bitcos import harness
from ggml_bitcos.format import QK_K, Variant
from ggml_bitcos.q8k import random_q8k
from ggml_bitcos.ternary import random_codes

VARIANTS = tuple(Variant)
ZERO_DENSITIES = (0.0, 0.4, 1.0)
# odd row lengths: partial last units (32, 96, 160, 576, 2080), a Q8_K block with one half (640, 2176: 17 units)
KS = (32, 96, 128, 160, 256, 576, 640, 2048, 2080, 2176)
VARIANT_KS = [(v, k) for v in VARIANTS for k in KS if k % v.k_multiple == 0]
NRS = (1, 5, 9)  # GEMM tiles of 4 rows (x86) and a remainder
NCS = (1, 2, 3, 4, 5, 8)
FMAS = (True, False)
FMA_IDS = ("fma", "nofma")


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def packed_codes(t: np.ndarray) -> np.ndarray:
    """The numpy reference of the codes form: ternary codes int8 (nr, k) as uint8 (nr, 64 per 256 weights), weight
    j = 128h + 32g + m of a block (u = t + 1, 1 past k) at bits 2g of byte 32h + m."""
    nr, k = t.shape
    nby = -(-k // QK_K)
    u = np.ones((nr, nby * QK_K), dtype=np.uint8)
    u[:, :k] = t + 1
    u = u.reshape(nr, nby, 2, 4, 32)
    out = np.zeros((nr, nby, 2, 32), dtype=np.uint8)
    for g in range(4):
        out |= u[:, :, :, g, :] << (2 * g)
    return out.reshape(nr, nby * 64)


class Case:
    """Random ternary codes, the scales of one variant, the BITCOS rows and activations of one case."""

    def __init__(self, seed: int, variant: Variant, z: float, k: int, nr: int, nc: int):
        rng = np.random.default_rng(seed)
        self.t = random_codes(rng, (nr, k), z)
        block_scales = None
        if variant.scale_block:
            block_scales = rng.uniform(0.0, 2.0, size=(nr, k // variant.scale_block)).astype(np.float16)
            same = rng.random(block_scales[:, 1::2].shape) < 0.5  # half the blocks one scale, half two
            block_scales[:, 1::2] = np.where(same, block_scales[:, 0::2][:, : same.shape[1]], block_scales[:, 1::2])
        row_scales = rng.uniform(0.05, 3.0, size=nr).astype(np.float32) if variant is Variant.ROW else None
        scale = float(np.float32(rng.uniform(0.05, 3.0)))
        self.w = harness.encode_rows(self.t, variant, block_scales=block_scales, scale=scale, row_scales=row_scales)
        self.y = random_q8k(rng, nc, k)
        self.y["d"] *= np.where(rng.random(self.y["d"].shape) < 0.3, -1.0, 1.0).astype(np.float32)


def seed_of(variant: Variant, z: float, k: int, nr: int, nc: int) -> int:
    return (variant * 1_000_003 + int(z * 1000) * 10_007 + k * 101 + nr * 17 + nc) & 0x7FFFFFFF


@pytest.fixture
def require(kernel_library):
    """require(impl, fma) skips unless the harness library of that FMA form has kernel impl and this CPU runs it."""

    def check(impl: str, fma: bool = True) -> None:
        if not harness.available(impl, fma):
            pytest.skip(f"{impl} not compiled in or not runnable on this CPU")

    return check


@pytest.mark.parametrize("fast", (False, True), ids=("generic", "fast"))
@pytest.mark.parametrize("z", ZERO_DENSITIES)
@pytest.mark.parametrize("variant,k", VARIANT_KS, ids=[f"{v.name.lower()}-k{k}" for v, k in VARIANT_KS])
def test_decode_equals_numpy_packing(kernel_library, variant: Variant, k: int, z: float, fast: bool) -> None:
    """Both decode paths write every byte of the codes (the buffer starts as 0xEE) exactly as numpy packs the
    ternary codes the reference codec encoded."""
    if fast and not harness.codes_decode_fast():
        pytest.skip("no fast decode path on this CPU")
    c = Case(seed_of(variant, z, k, 7, 1), variant, z, k, 7, 1)
    np.testing.assert_array_equal(harness.decode_codes(c.w, fast=fast).codes, packed_codes(c.t))


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name.lower() for v in VARIANTS])
def test_decode_of_a_row_range(kernel_library, variant: Variant) -> None:
    """Rows decoded in separate ranges (as the loader's threads split a weight; the run starting mid-tensor, its
    first sign not at pool bit 0) are the same bytes as the whole weight decoded at once."""
    k = 2304 if variant.k_multiple <= 256 else 2048
    c = Case(99 + variant, variant, 0.37, k, 23, 1)
    whole = harness.decode_codes(c.w).codes
    for lo, hi in ((0, 5), (5, 6), (6, 23)):
        np.testing.assert_array_equal(harness.decode_codes(c.w.rows(lo, hi)).codes, whole[lo:hi])


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
@pytest.mark.parametrize("z", ZERO_DENSITIES)
@pytest.mark.parametrize("variant,k", VARIANT_KS, ids=[f"{v.name.lower()}-k{k}" for v, k in VARIANT_KS])
def test_codes_kernel_equals_the_bitcos_kernel(
    require, impl: str, variant: Variant, k: int, z: float, fma: bool
) -> None:
    """Every codes kernel gives the generic BITCOS kernel's float bits on the weight the codes came from."""
    require(impl, fma)
    for nr in NRS:
        for nc in NCS:
            c = Case(seed_of(variant, z, k, nr, nc), variant, z, k, nr, nc)
            want = harness.mm("generic", c.w, c.y, fma)
            got = harness.codes_mm(impl, harness.decode_codes(c.w), c.y, fma)
            np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"nr={nr} nc={nc}")


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
def test_codes_kernel_tiles_and_long_rows(require, impl: str, fma: bool) -> None:
    """Shapes past the tiles (rows 4 + 3, columns 4 + 3, 17 columns) and a long row (16384 + 2080 weights)."""
    require(impl, fma)
    for variant, (nr, nc, k) in (
        (Variant.MATRIX, (7, 17, 2080)),
        (Variant.B128, (3, 7, 16384 + 2048)),
        (Variant.ROW, (33, 1, 16384 + 2080)),
        (Variant.G128, (6, 11, 4096)),
    ):
        c = Case(seed_of(variant, 0.42, k, nr, nc) + 1, variant, 0.42, k, nr, nc)
        got = harness.codes_mm(impl, harness.decode_codes(c.w), c.y, fma)
        np.testing.assert_array_equal(bits(got), bits(harness.mm("generic", c.w, c.y, fma)), err_msg=variant.name)


@pytest.mark.parametrize("variant", (Variant.G128, Variant.B128, Variant.B256), ids=("g128", "b128", "b256"))
def test_compacted_block_scales(require, impl: str, variant: Variant) -> None:
    """The block scales copied out of the weight (bitcos_codes_copy_block_scales: G128's from its bitmap blocks)
    at stride 2 serve the codes kernels as the original layout does."""
    require(impl)
    k, nr, nc = 2048, 6, 3
    c = Case(5 + variant, variant, 0.4, k, nr, nc)
    codes = harness.decode_codes(c.w)
    scales = harness.compact_block_scales(c.w)
    if variant is not Variant.G128:  # already compact in the companion
        np.testing.assert_array_equal(scales.view("<f2"), np.asarray(c.w.block_scales, dtype="<f2"))
    compact = harness.Descriptor(
        k, c.w.blocks, 16, c.w.pool, c.w.sign_pos, None, scales, 0, 2, scales.shape[1], codes.scales.block_scale_shift
    )
    got = harness.codes_mm(impl, harness.CodesRows(k, codes.codes, compact), c.y)
    np.testing.assert_array_equal(bits(got), bits(harness.mm("generic", c.w, c.y)))


def test_a_changed_code_changes_the_result(kernel_library) -> None:
    """The comparison can fail: one weight's sign flipped in the codes changes that row's result."""
    c = Case(3, Variant.MATRIX, 0.0, 256, 2, 1)
    codes = harness.decode_codes(c.w)
    changed = codes.codes.copy()
    changed[1, 7] ^= 2  # weight 7 of row 1 (z = 0: u is 0 or 2): t = -1 <-> +1
    a = harness.codes_mm("generic", codes, c.y)
    b = harness.codes_mm("generic", harness.CodesRows(codes.k, changed, codes.scales), c.y)
    assert bits(a)[0, 0] == bits(b)[0, 0] and bits(a)[0, 1] != bits(b)[0, 1]


def test_every_simd_entry_has_a_codes_kernel(kernel_library) -> None:
    """Each kernel of the table brings its own codes kernel (none runs the portable fallback)."""
    assert all(harness.has_codes(name) for name in harness.kernel_names())
