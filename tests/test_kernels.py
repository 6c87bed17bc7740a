"""BITCOS CPU kernels (csrc/): AVX2 and AVX-512 bit-identical to the generic C kernel, and the generic kernel
bit-identical to an independent numpy evaluation of the arithmetic contract v2 in csrc/bitcos-kernels.h,
for both forms of the contract's FMA (libbitcos_kernels.so: BITCOS_FMA=1, libbitcos_kernels_nofma.so:
BITCOS_FMA=0).

Needs the harness libraries; when neither installed nor built, the ``kernel_library`` fixture (conftest.py)
builds them with cmake into build/kernels (as docs/KERNELS.md describes) or skips. A SIMD path is skipped when
/proc/cpuinfo lacks its extensions. The AVX2 path tested here is the x86-64-v3 object (compiled with AVX-512
off).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from ggml_bitcos import contract, harness
from ggml_bitcos.format import QK, Variant
from ggml_bitcos.q8k import Q8K_DTYPE, quantize_q8k, random_q8k
from ggml_bitcos.ternary import random_codes

ZERO_DENSITIES = (0.0, 0.01, 0.3, 0.5, 0.95, 1.0)
KS = (128, 384, 2048, 4096 + 128)
NRS = (1, 2, 3, 5, 17)
NCS = (1, 2, 5, 16)
VARIANTS = (Variant.G128, Variant.PT)
FMAS = (True, False)
FMA_IDS = ("fma", "nofma")

# Extensions each harness object was compiled for (CMakeLists.txt); a CPU missing one skips the path.
CPU_FLAGS_NEEDED = {
    "avx2": {"avx2", "fma", "bmi2", "f16c"},
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512_vbmi2",
               "avx512_bitalg", "avx512_vpopcntdq", "bmi2", "f16c"},
}


@pytest.fixture
def require(kernel_library, cpu_flags: set[str]) -> Callable[..., None]:
    """require(impl, fma=True) skips the calling test unless this CPU and the harness library of that FMA
    form can run kernel `impl`."""
    def check(impl: str, fma: bool = True) -> None:
        missing = CPU_FLAGS_NEEDED.get(impl, set()) - cpu_flags
        if missing:
            pytest.skip(f"CPU lacks {sorted(missing)} for {impl}")
        if not harness.available(impl, fma):
            pytest.skip(f"{impl} not compiled into the harness library")
    return check


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def random_block_scales(rng: np.random.Generator, nr: int, k: int) -> np.ndarray:
    """fp16 G128 scales where about half of the Q8_K blocks have two equal half scales (as every block of a
    tensor converted from TQ2_0: one FMA per lane in the contract) and the others two different ones (two
    FMAs), so both cases and their mixture inside one row pair / column pair are exercised."""
    ds = rng.uniform(0.0, 2.0, size=(nr, k // QK)).astype(np.float16)
    odd = ds[:, 1::2]
    same = rng.random(odd.shape) < 0.5
    ds[:, 1::2] = np.where(same, ds[:, 0::2][:, :odd.shape[1]], odd)
    return ds


def make_case(seed: int, variant: Variant, z: float, k: int, nr: int, nc: int):
    rng = np.random.default_rng(seed)
    codes = random_codes(rng, (nr, k), z)
    block_scales = random_block_scales(rng, nr, k)
    scale = float(rng.uniform(0.05, 3.0))
    w = harness.encode_rows(codes, variant, block_scales=block_scales, scale=scale)
    y = random_q8k(rng, nc, k)
    # ggml's Q8_K scale carries the sign of the block's largest |x|: negative scales occur
    y["d"] *= np.where(rng.random(y["d"].shape) < 0.3, -1.0, 1.0).astype(np.float32)
    return codes, block_scales, scale, w, y


def case_seed(variant: Variant, z: float, k: int, nr: int, nc: int) -> int:
    return (variant * 1_000_003 + int(z * 1000) * 10_007 + k * 101 + nr * 17 + nc) & 0x7FFFFFFF


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("z", ZERO_DENSITIES)
@pytest.mark.parametrize("variant", VARIANTS, ids=("g128", "pt"))
def test_generic_matches_numpy_reference(kernel_library, variant: Variant, z: float, k: int, fma: bool) -> None:
    for nr in NRS:
        for nc in NCS:
            codes, ds, scale, w, y = make_case(case_seed(variant, z, k, nr, nc), variant, z, k, nr, nc)
            ref = contract.reference_mm(codes, variant, y, block_scales=ds, scale=scale, fma=fma)
            out = harness.mm("generic", w, y, fma)
            assert out.shape == (nc, nr)
            np.testing.assert_array_equal(bits(out), bits(ref), err_msg=f"nr={nr} nc={nc}")


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
@pytest.mark.parametrize("impl", ("avx2", "avx512"))
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("z", ZERO_DENSITIES)
@pytest.mark.parametrize("variant", VARIANTS, ids=("g128", "pt"))
def test_simd_bit_identical_to_generic(require, impl: str, variant: Variant, z: float, k: int,
                                      fma: bool) -> None:
    require(impl, fma)
    for nr in NRS:
        for nc in NCS:
            _, _, _, w, y = make_case(case_seed(variant, z, k, nr, nc) ^ 0x5A5A, variant, z, k, nr, nc)
            want = harness.mm("generic", w, y, fma)
            got = harness.mm(impl, w, y, fma)
            np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"{impl} nr={nr} nc={nc}")


# Shapes around the kernels' internal tiles: 32 rows, 8 columns, chunks of 16 groups (2048 weights).
TILE_SHAPES = [(33, 9, 2048 * 2 + 384), (32, 8, 2048), (64, 17, 2048 + 128), (40, 3, 6144), (7, 1, 2048 * 3)]


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
@pytest.mark.parametrize("impl", ("generic", "avx2", "avx512"))
@pytest.mark.parametrize("shape", TILE_SHAPES, ids=lambda s: f"nr{s[0]}-nc{s[1]}-k{s[2]}")
@pytest.mark.parametrize("variant", VARIANTS, ids=("g128", "pt"))
def test_tile_edges_against_reference(require, impl: str, variant: Variant, shape: tuple[int, int, int],
                                      fma: bool) -> None:
    if impl != "generic":
        require(impl, fma)
    nr, nc, k = shape
    for z in (0.0, 0.4, 1.0):
        codes, ds, scale, w, y = make_case(case_seed(variant, z, k, nr, nc) + 7, variant, z, k, nr, nc)
        ref = contract.reference_mm(codes, variant, y, block_scales=ds, scale=scale, fma=fma)
        np.testing.assert_array_equal(bits(harness.mm(impl, w, y, fma)), bits(ref), err_msg=f"z={z}")


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
@pytest.mark.parametrize("impl", ("generic", "avx2", "avx512"))
def test_rows_starting_mid_tensor(require, impl: str, fma: bool) -> None:
    """A run of rows whose first sign is not at pool bit 0 (how ggml threads split a matrix)."""
    if impl != "generic":
        require(impl, fma)
    rng = np.random.default_rng(11)
    nr, k, nc = 23, 2048 + 384, 3
    codes = random_codes(rng, (nr, k), 0.37)
    ds = random_block_scales(rng, nr, k)
    w = harness.encode_rows(codes, Variant.G128, block_scales=ds)
    y = random_q8k(rng, nc, k)
    ref = contract.reference_mm(codes, Variant.G128, y, block_scales=ds, fma=fma)
    for lo, hi in ((5, 23), (1, 2), (9, 20)):
        # same pool, blocks from row lo on: pointer arithmetic exactly as a ggml thread would do it
        part = harness.BitcosRows(w.variant, k, w.blocks[lo:hi], w.pool, w.sign_pos[lo:hi])
        np.testing.assert_array_equal(bits(harness.mm(impl, part, y, fma)), bits(ref[:, lo:hi]))


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
@pytest.mark.parametrize("impl", ("generic", "avx2", "avx512"))
@pytest.mark.parametrize("variant", VARIANTS, ids=("g128", "pt"))
def test_dense_words_inside_sparse_rows(require, impl: str, variant: Variant, fma: bool) -> None:
    """The AVX-512 GEMV reads signs with a byte-granular window that holds only 57 bits; a PT chunk takes
    it without a per-word test when a vector popcount finds no word with more than 57 present weights
    (KERNELS.md §3). Sparse rows (z = 0.5) with single words of exactly 57, 58, 63 and 64 present weights at
    different chunks and rows must decode exactly on every path, in the one-column and the tiled form, with
    long and with short rows, and in a row's shorter last chunk (k = 2560, 6912)."""
    if impl != "generic":
        require(impl, fma)
    rng = np.random.default_rng(57)
    # k = 6144: long rows (the GEMV pairs r with r + nrh); k = 4096, 2560: short rows (adjacent pairs, §5);
    # k = 2560 / 6912 end in a chunk of 2 / 3 Q8_K blocks (words -8 .. -1 / -12 .. -1)
    for nr, k in ((7, 2048 * 3), (9, 4096), (7, 2560), (7, 6912)):
        codes = random_codes(rng, (nr, k), 0.5)
        words = k // 64
        for row, word, present in ((0, 5, 64), (3, 40, 58), (4, 40, 57), (6, 95, 58), (1, 64, 64), (5, 33, 63),
                                   (2, -2, 58), (0, -1, 64), (6, -3, 57)):
            seg = rng.choice(np.array([-1, 1], dtype=np.int8), size=64)
            seg[rng.permutation(64)[: 64 - present]] = 0
            w0 = 64 * (word % words)
            codes[row, w0: w0 + 64] = seg
        ds = random_block_scales(rng, nr, k)
        w = harness.encode_rows(codes, variant, block_scales=ds, scale=0.75)
        for nc in (1, 3):
            y = random_q8k(rng, nc, k)
            ref = contract.reference_mm(codes, variant, y, block_scales=ds, scale=0.75, fma=fma)
            np.testing.assert_array_equal(bits(harness.mm(impl, w, y, fma)), bits(ref), err_msg=f"k={k} nc={nc}")


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
@pytest.mark.parametrize("impl", ("generic", "avx2", "avx512"))
def test_extreme_values(require, impl: str, fma: bool) -> None:
    """int8 -128 / 127 activations against all -1 / +1 codes (q + 128 and -q overflow traps), large and
    subnormal fp16 block scales, negative Q8_K scales."""
    if impl != "generic":
        require(impl, fma)
    k, nr = 2048 + 128, 4
    codes = np.empty((nr, k), dtype=np.int8)
    codes[0] = -1
    codes[1] = 1
    codes[2] = np.where(np.arange(k) % 2 == 0, -1, 1)
    codes[3] = np.where(np.arange(k) % 3 == 0, 0, -1)
    ds = np.full((nr, k // QK), 65504.0, dtype=np.float16)
    ds[2] = np.float16(6e-8)      # subnormal
    ds[3, ::2] = 0.0
    y = np.zeros((3, (k + 255) // 256), dtype=Q8K_DTYPE)
    y["qs"][0] = -128
    y["qs"][1] = 127
    y["qs"][2] = np.where(np.arange(256) % 2 == 0, -128, 127).astype(np.int8)
    y["d"] = np.float32(1.5e-3)
    y["d"][:, 1::2] = np.float32(-2.5e-3)
    for variant in VARIANTS:
        w = harness.encode_rows(codes, variant, block_scales=ds, scale=0.75)
        ref = contract.reference_mm(codes, variant, y, block_scales=ds, scale=0.75, fma=fma)
        np.testing.assert_array_equal(bits(harness.mm(impl, w, y, fma)), bits(ref))


def test_reference_detects_a_single_flipped_sign(kernel_library) -> None:
    """The comparisons above can fail: one flipped sign changes the result."""
    codes, ds, scale, w, y = make_case(3, Variant.G128, 0.3, 384, 2, 1)
    idx = int(np.flatnonzero(codes[0])[10])
    flipped = codes.copy()
    flipped[0, idx] = -flipped[0, idx]
    y["qs"].reshape(1, -1)[0, idx] = 100
    a = contract.reference_mm(codes, Variant.G128, y, block_scales=ds)
    b = contract.reference_mm(flipped, Variant.G128, y, block_scales=ds)
    assert a[0, 0] != b[0, 0]
    w2 = harness.encode_rows(flipped, Variant.G128, block_scales=ds)
    assert harness.mm("generic", w2, y)[0, 0] == b[0, 0] != harness.mm("generic", w, y)[0, 0]


def test_encoder_layout() -> None:
    """The rows the harness passes to a kernel follow FORMAT.md: LSB-first bitmap, fp16 d after it, signs
    packed back to back, the pool with its zero tail."""
    codes = np.zeros((2, 128), dtype=np.int8)
    codes[0, [0, 9, 127]] = [1, -1, -1]
    codes[1, [3]] = [-1]
    w = harness.encode_rows(codes, Variant.G128, block_scales=np.array([[1.0], [0.5]], dtype=np.float16))
    assert w.blocks.shape == (2, 18)
    assert w.blocks[0, 0] == 0b1 and w.blocks[0, 1] == 0b10 and w.blocks[0, 15] == 0x80
    assert w.blocks[0, 16:18].view("<f2")[0] == 1.0
    assert list(w.sign_pos) == [0, 3]
    assert w.pool[0] == 0b1110          # signs: row0 (+, -, -), row1 (-)
    assert w.pool.size == 64 + 64


def test_quantize_q8k_round_trip() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 640)).astype(np.float32)
    y = quantize_q8k(x)
    assert y.shape == (3, 3)
    deq = (y["qs"].astype(np.float32) * y["d"][..., None]).reshape(3, -1)[:, :640]
    assert np.all(np.abs(deq - x) <= np.repeat(np.abs(y["d"]), 256, axis=1)[:, :640] * 0.5 + 1e-6)
    assert np.all(np.abs(y["qs"]) <= 127)
    np.testing.assert_array_equal(y["bsums"], y["qs"].reshape(3, 3, 16, 16).sum(axis=3))


@pytest.mark.parametrize("fma", FMAS, ids=FMA_IDS)
def test_quantized_activations_through_all_paths(kernel_library, cpu_flags: set[str], fma: bool) -> None:
    """Realistic activations (ggml's Q8_K quantizer) instead of random int8."""
    rng = np.random.default_rng(8)
    nr, k, nc = 12, 4096, 4
    codes = random_codes(rng, (nr, k), 0.45)
    ds = rng.uniform(0.01, 0.1, size=(nr, k // QK)).astype(np.float16)
    w = harness.encode_rows(codes, Variant.G128, block_scales=ds)
    y = quantize_q8k(rng.normal(size=(nc, k)).astype(np.float32))
    ref = contract.reference_mm(codes, Variant.G128, y, block_scales=ds, fma=fma)
    simd_impls = [impl for impl, need in CPU_FLAGS_NEEDED.items() if need <= cpu_flags]
    for impl in ["generic"] + simd_impls:
        if harness.available(impl, fma):
            np.testing.assert_array_equal(bits(harness.mm(impl, w, y, fma)), bits(ref), err_msg=impl)


def test_fma_forms_differ_and_reference_follows_each(kernel_library) -> None:
    """The two builds really implement different arithmetic (so testing both is meaningful), and each
    matches the reference of its own form only."""
    codes, ds, scale, w, y = make_case(99, Variant.PT, 0.3, 4096, 32, 4)
    fused = harness.mm("generic", w, y, True)
    plain = harness.mm("generic", w, y, False)
    assert np.count_nonzero(bits(fused) != bits(plain)) > 10
    for got, fma in ((fused, True), (plain, False)):
        np.testing.assert_array_equal(bits(got), bits(contract.reference_mm(codes, Variant.PT, y, scale=scale, fma=fma)))


def test_numpy_fma_is_correctly_rounded() -> None:
    """contract.fma_f32 against the C library's fmaf, on random values and on cases built so that a
    float64 a*b + c rounded to float32 would round twice (exact result just off a float32 halfway point)."""
    import ctypes
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
    ha = sign * np.float32(641 * 2.0 ** -10) * sc
    hb = np.full(sc.size, np.float32(6700417 * 2.0 ** -46))
    hc = sign * sc
    naive = (ha.astype(np.float64) * hb + hc).astype(np.float32)
    assert np.all(naive == hc)                         # the double rounding these cases are built to catch
    a = np.concatenate([a, ha])
    b = np.concatenate([b, hb])
    c = np.concatenate([c, hc])
    got = contract.fma_f32(a, b, c)
    want = np.array([libm.fmaf(x, y_, z) for x, y_, z in zip(a.tolist(), b.tolist(), c.tolist())], np.float32)
    np.testing.assert_array_equal(bits(got), bits(want))


@pytest.mark.parametrize("impl", ("generic", "avx2", "avx512"))
def test_pool_reads_stay_inside_the_format_tail(require, impl: str) -> None:
    """The sign pool ends exactly at a PROT_NONE page: a read past the FORMAT.md §4.4 tail would crash."""
    if impl != "generic":
        require(impl)
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    rng = np.random.default_rng(21)
    for z in (0.0, 0.5, 1.0):
        nr, k = 9, 2048 + 384
        codes = random_codes(rng, (nr, k), z)
        codes[-1, -200:] = 0          # the last row ends in zeros: its cursor sits at the end of the signs
        ds = rng.uniform(0.0, 2.0, size=(nr, k // QK)).astype(np.float16)
        w = harness.encode_rows(codes, Variant.G128, block_scales=ds)
        npages = -(-w.pool.size // page) + 1
        buf = mmap.mmap(-1, (npages + 1) * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        base = np.frombuffer(buf, dtype=np.uint8)
        guard = npages * page
        assert libc.mprotect(base.ctypes.data + guard, page, 0) == 0
        pool = base[guard - w.pool.size:guard]
        pool[:] = w.pool
        fenced = harness.BitcosRows(w.variant, k, w.blocks, pool, w.sign_pos)
        y = random_q8k(rng, 2, k)
        ref = contract.reference_mm(codes, Variant.G128, y, block_scales=ds)
        np.testing.assert_array_equal(bits(harness.mm(impl, fenced, y)), bits(ref))
        assert libc.mprotect(base.ctypes.data + guard, page, mmap.PROT_READ | mmap.PROT_WRITE) == 0
        del pool, base, fenced
        buf.close()
