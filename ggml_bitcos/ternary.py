"""Ternary weights in numpy: exact-ternary detection of float values (FORMAT.md §7) and the one generator
of random ternary codes.

* ``analyze_rows(x)``: codes and per-128-block magnitudes of float32 rows; with ``g128_representable`` and
  ``pt_scales`` it decides which BITCOS variant represents the values exactly (the converter's test);
* ``is_row_ternary(x)``: the weaker per-row test the converter uses to report tensors that look ternary but
  cannot be converted;
* ``random_codes(rng, shape, zero_density)``: random codes for synthetic models, tests and benchmarks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .format import MAX_SCALE, QK


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
    """Per-matrix scale when every matrix's non-zero magnitudes are one value (at most MAX_SCALE), else None."""
    per_mat = block_mag.reshape(n_mats, -1)
    hi = per_mat.max(axis=1)
    lo = np.where(per_mat > 0, per_mat, np.inf).min(axis=1)
    ok = (hi == 0) | (lo == hi)
    # a valid PT scale is at most MAX_SCALE (FORMAT.md §4.2); larger magnitudes stay unconverted
    if not bool(np.all(ok)) or not bool(np.all(hi <= MAX_SCALE)):
        return None
    return hi.astype(np.float32)


def random_codes(rng: np.random.Generator, shape: tuple[int, ...], zero_density: float) -> np.ndarray:
    """int8 ternary codes of ``shape``: 0 with probability ``zero_density`` (resolution 2^-15), else -1 or +1
    with equal probability.

    One little-endian uint16 per weight from ``rng.bytes``: the top 15 bits decide presence, bit 0 the sign.
    This draw order is part of what make-model's seeds mean (a model made with a given seed must stay byte
    for byte the same), so it must not change.
    """
    n = math.prod(shape)
    u = np.frombuffer(rng.bytes(2 * n), dtype="<u2").reshape(shape)
    if zero_density >= 1:
        return np.zeros(shape, dtype=np.int8)
    threshold = np.uint16(round(zero_density * 32768))
    present = (u >> np.uint16(1)) >= threshold
    sign = (u & np.uint16(1)).astype(np.int8)             # 1 -> negative
    return (present.view(np.int8) * (np.int8(1) - np.int8(2) * sign)).astype(np.int8, copy=False)
