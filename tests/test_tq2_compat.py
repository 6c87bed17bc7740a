"""BITCOS kernels are bit-identical to llama.cpp's TQ2_0 dot product (arithmetic contract v2,
csrc/bitcos-kernels.h).

The reference is the real thing (tests/tq2_reference.py): ``vec_dot`` of GGML_TYPE_TQ2_0 from the
``libggml-cpu.so`` of the installed (patched) llama-cpp-python, called through ctypes on TQ2_0 rows made by
``tq.tq2_0_encode`` and Q8_K activations. The same ternary codes and scales go through the BITCOS kernels of the harness library (generic,
AVX2, AVX-512) in every variant that holds them: a PT / MATRIX matrix (scale = fp32 of the TQ2_0 fp16 d, one d
for the whole matrix), a ROW matrix (one d per row), a B256 matrix (each 256-block's TQ2_0 d, what convert
writes from TQ2_0 by default) and a G128 / B128 matrix (both halves of every 256-block get that block's d).
Skipped when llama_cpp is not installed. The FMA form compared is the one that ggml was compiled with
(tq2_reference.expected_fma).
"""

from __future__ import annotations

import numpy as np
import pytest

from ggml_bitcos import harness, tq
from ggml_bitcos.format import QK_K, Variant
from ggml_bitcos.ternary import random_codes
from tq2_reference import KS, assert_kernels_match_tq2_0, bits, mixed_density_codes, random_q8k_column, tq2_dots


@pytest.mark.parametrize("variant", tuple(Variant))
@pytest.mark.parametrize("magnitude", ("normal", "large"))
@pytest.mark.parametrize("k", KS)
def test_bit_identical_to_tq2_0(tq2_vec_dot, variant: Variant, k: int, magnitude: str) -> None:
    """Block variants with each TQ2_0 block scale (per 256 as it is, per 128 in both halves), ROW with one scale
    per row, PT / MATRIX with one scale for the matrix."""
    vec_dot, fma, _ = tq2_vec_dot
    rng = np.random.default_rng(k * (7 if variant.scale_block else 11) + 3 * int(variant) + (magnitude == "large"))
    nr = 48
    codes = mixed_density_codes(rng, nr, k)
    if variant.scale_block:
        d = rng.uniform(0.0, 3.0, size=(nr, k // QK_K)).astype(np.float16)
        if magnitude == "large":
            d = (d.astype(np.float32) * 1e4).astype(np.float16)
        w = harness.encode_rows(codes, variant, block_scales=np.repeat(d, QK_K // variant.scale_block, axis=1))
    elif variant is Variant.ROW:
        d_row = rng.uniform(0.01, 2.0, size=nr) * (1e3 if magnitude == "large" else 1.0)
        d = np.repeat(d_row.astype(np.float16)[:, None], k // QK_K, axis=1)
        w = harness.encode_rows(codes, variant, row_scales=d[:, 0].astype(np.float32))
    else:
        d16 = np.float16(rng.uniform(0.01, 2.0) * (1e3 if magnitude == "large" else 1.0))
        d = np.full((nr, k // QK_K), d16, dtype=np.float16)
        w = harness.encode_rows(codes, variant, scale=float(np.float32(d16)))
    assert_kernels_match_tq2_0(vec_dot, fma, tq.tq2_0_encode(codes, d), w, rng, k, magnitude)


def test_other_fma_form_is_not_tq2_0(tq2_vec_dot) -> None:
    """The comparison can fail: the other FMA form differs from TQ2_0 somewhere, and so does one flipped code."""
    vec_dot, fma, _ = tq2_vec_dot
    rng = np.random.default_rng(5)
    k, nr = 2048, 64
    codes = random_codes(rng, (nr, k), 0.3)
    d = rng.uniform(0.5, 2.0, size=(nr, k // QK_K)).astype(np.float16)
    y = random_q8k_column(rng, k, "normal")
    want = tq2_dots(vec_dot, tq.tq2_0_encode(codes, d), y)
    w = harness.encode_rows(codes, Variant.G128, block_scales=np.repeat(d, 2, axis=1))
    other = harness.mm("generic", w, y[None, :], not fma)[0]
    assert np.count_nonzero(bits(other) != bits(want)) > 0
    flipped = codes.copy()
    j = int(np.flatnonzero(flipped[0])[0])
    flipped[0, j] = -flipped[0, j]
    y["qs"].reshape(-1)[j] = 100
    y["bsums"] = y["qs"].reshape(-1, 16, 16).sum(axis=2, dtype=np.int16)
    want = tq2_dots(vec_dot, tq.tq2_0_encode(codes, d), y)
    w2 = harness.encode_rows(flipped, Variant.G128, block_scales=np.repeat(d, 2, axis=1))
    assert harness.mm("generic", w2, y[None, :], fma)[0][0] != want[0]
