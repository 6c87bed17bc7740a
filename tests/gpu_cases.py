"""Test cases shared by the GPU kernel tests (tests/test_sycl.py, tests/test_cuda.py): random ternary tensors
encoded by the reference codec with their exact fp32 values, the shapes each variant is checked on, and the
binary input file the SYCL and CUDA test programs read."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ggml_bitcos import codec
from ggml_bitcos.format import Variant
from ggml_bitcos.ternary import random_codes


def make_case(
    rng: np.random.Generator, variant: Variant, rows: int, k: int, z: float, n_x: int, n_mats: int = 1
) -> dict:
    """A random ternary tensor encoded by the reference codec, its activations and its exact fp32 values
    (computed here from the codes and scales, not by the codec's decoder)."""
    codes = random_codes(rng, (rows, k), z)
    if variant.scale_block:
        # G128 / B128 / B256: fp16 scales with varied exponents; G128 and B128 get about half of their
        # 256-blocks with two different halves
        nb = k // variant.scale_block
        scales = rng.uniform(0.01, 2.0, (rows, nb)) * 2.0 ** rng.integers(-6, 4, (rows, nb))
        scales = scales.astype(np.float16)
        enc = codec.encode(codes, variant, block_scales=scales)
        per_weight = np.repeat(scales.astype(np.float32), variant.scale_block, axis=1)
    elif variant is Variant.ROW:
        scales = (rng.uniform(0.001, 3.0, rows) * 2.0 ** rng.integers(-4, 4, rows)).astype(np.float32)
        enc = codec.encode(codes, variant, row_scales=scales, n_mats=n_mats)
        per_weight = scales[:, None]
    else:
        mats = rng.uniform(0.001, 3.0, n_mats).astype(np.float32)
        enc = codec.encode(codes, variant, matrix_scales=mats, n_mats=n_mats)
        per_weight = np.repeat(mats, rows // n_mats)[:, None]
    values = codes.astype(np.float32) * per_weight  # one fp32 multiplication per weight (§5)
    x = rng.standard_normal((n_x, k)).astype(np.float32)
    return {"blocks": enc.blocks, "companion": enc.companion, "values": values.reshape(rows, k), "x": x, "codes": codes}


# (rows, K, activation columns, first row, rows run, work-group) per variant: odd row counts, work-groups
# smaller and larger than the row count (the tiled kernel: 1-4 sub-groups of 16 rows), 1, 2, 3, 8, 9 and 17
# columns (one decode serves up to 8; with 8 or more, column 7 is scaled into fp16's subnormal range, which a
# tiled kernel flushing it to zero would fail), runs starting mid-tensor. Version 1 and B128 rows are multiples of 128, B256 of 256; MATRIX / ROW take any multiple of 32,
# so their K include rows ending in a partial 128-weight unit (32, 96, 160, 576, 4256).
SHAPES_128 = ((1, 128, 1, 0, 1, 16), (37, 384, 3, 0, 37, 16), (19, 4224, 1, 5, 13, 64), (64, 2048, 17, 0, 64, 32))
SHAPES = {
    Variant.G128: SHAPES_128,
    Variant.PT: SHAPES_128,
    Variant.B128: SHAPES_128 + ((9, 640, 8, 0, 9, 16),),
    Variant.B256: ((1, 256, 1, 0, 1, 16), (37, 768, 3, 0, 37, 16), (19, 4352, 1, 5, 13, 64), (64, 1536, 17, 0, 64, 32)),
}
SHAPES[Variant.MATRIX] = SHAPES[Variant.ROW] = (
    (1, 32, 1, 0, 1, 16),
    (37, 96, 3, 0, 37, 16),
    (19, 576, 1, 5, 13, 64),
    (23, 160, 17, 0, 23, 32),
    (64, 2048, 9, 0, 64, 32),
    (5, 4256, 8, 1, 4, 16),
)
VARIANT_IDS = [v.name.lower() for v in Variant]


def variant_cases(rng: np.random.Generator, variant: Variant) -> list[dict]:
    """A variant's test cases (zero densities 0 / 0.4 / 1 for every shape of SHAPES), plus for per-matrix and
    per-row scales a 3-D tensor whose matrices / rows have their own scales (the rows MUL_MAT_ID reads)."""
    cases = []
    for z in (0.0, 0.4, 1.0):
        for rows, k, n_x, row0, n_rows, wg in SHAPES[variant]:
            c = make_case(rng, variant, rows, k, z, n_x)
            c.update(row0=row0, n_rows=n_rows, wg=wg)
            if n_x >= 8:
                c["x"][7] *= np.float32(2.0**-20)  # column 7 in fp16's subnormal range (the tiled path)
            cases.append(c)
    if not variant.scale_block:
        c = make_case(rng, variant, 24, 640 if variant.version == 1 else 608, 0.4, 2, n_mats=3)
        c.update(row0=0, n_rows=24, wg=16)
        cases.append(c)
    return cases


def write_cases(path: Path, cases: list[dict]) -> None:
    """The GPU test programs' input (tests/sycl/test-bitcos-sycl.cpp, tests/cuda/test-bitcos-cuda.cu): "BSYC",
    version 1, the case count, then per case its sizes, rows, work-group and the weight, companion and
    activations."""
    with open(path, "wb") as f:
        f.write(b"BSYC" + struct.pack("<II", 1, len(cases)))
        for c in cases:
            blocks = np.ascontiguousarray(c["blocks"]).view(np.uint8).reshape(-1)
            comp = np.ascontiguousarray(c["companion"]).view(np.uint8).reshape(-1)
            n_x, k = c["x"].shape
            f.write(struct.pack("<7Q", blocks.nbytes, comp.nbytes, c["n_rows"], k, n_x, c["row0"], c["wg"]))
            f.write(blocks.tobytes() + comp.tobytes() + np.ascontiguousarray(c["x"], "<f4").tobytes())
