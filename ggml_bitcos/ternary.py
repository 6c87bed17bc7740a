"""Ternary weights in numpy: exact-ternary detection of float values (FORMAT.md §7) and the one generator
of random ternary codes.

* ``analyze_rows(x)``: codes and per-32-weight magnitudes of float32 rows (K % 32 == 0, the v2 row-length
  granularity: every variant's scale group is a whole number of 32-weight groups, so a tensor is ternary for
  some variant only if each 32-group holds one non-zero magnitude);
* ``TensorScales``: gathers those magnitudes chunk by chunk into per-row, per-256 and per-128 magnitudes of a
  whole tensor and decides which variants hold it exactly (``scales(variant)``, ``why_not(variant)``);
* ``is_row_ternary(x)``: the weaker per-row test the converter uses to report tensors that look ternary but
  cannot be converted (e.g. K % 32 != 0);
* ``random_codes(rng, shape, zero_density)``: random codes for synthetic models, tests and benchmarks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .format import MAX_SCALE, QK, QK_BITMAP, Variant

GROUP = QK_BITMAP  # weights per magnitude group of analyze_rows: the finest granularity of any variant


def group_magnitudes(mag: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge groups of ``n`` consecutive magnitudes along the last axis: (the merged group's common non-zero
    magnitude, 0 if none; whether the group holds one non-zero magnitude). ``mag`` (rows, m) with m % n == 0,
    every entry a group's common magnitude (0 for an empty group)."""
    rows, m = mag.shape
    g = mag.reshape(rows, m // n, n)
    hi = g.max(axis=2)
    lo = np.where(g > 0, g, np.inf).min(axis=2)
    return hi.astype(np.float32), (hi == 0) | (lo == hi)


@dataclass
class TernaryChunk:
    """Per-chunk analysis of float32 rows (rows, K) with K % 32 == 0."""

    codes: np.ndarray  # int8 (rows, K): sign of x (0 for ±0)
    mag32: np.ndarray  # float32 (rows, K/32): the 32-group's common non-zero |x| (0 if none)
    uniform: bool  # every 32-group: all non-zero |x| equal and finite

    def magnitudes(self, n: int) -> tuple[np.ndarray, bool]:
        """(common non-zero |x| per ``n`` weights of a row (rows, K/n), every such block uniform)."""
        mag, ok = group_magnitudes(self.mag32, n // GROUP)
        return mag, self.uniform and bool(np.all(ok))

    @property
    def block_mag(self) -> np.ndarray:
        """Per-128 magnitudes (rows, K/128) (K % 128 == 0; version 1's G128 blocks)."""
        return self.magnitudes(QK)[0]

    @property
    def blocks_uniform(self) -> bool:
        """Every 128-block holds one finite non-zero magnitude (K % 128 == 0)."""
        return self.magnitudes(QK)[1]


def analyze_rows(x: np.ndarray) -> TernaryChunk:
    """Codes and per-32-weight magnitudes of float32 rows; vectorized over the whole chunk."""
    rows, k = x.shape
    if k % GROUP:
        raise ValueError(f"row length {k} is not a multiple of {GROUP}")
    a = np.abs(x).reshape(rows, k // GROUP, GROUP)
    with np.errstate(invalid="ignore"):
        mag = a.max(axis=2)  # NaN propagates -> not uniform
        uniform = bool(np.all(np.isfinite(mag))) and bool(np.all((a == mag[:, :, None]) | (a == 0)))
    codes = (x > 0).view(np.int8) - (x < 0).view(np.int8)
    return TernaryChunk(codes, mag.astype(np.float32), uniform)


def is_row_ternary(x: np.ndarray) -> bool:
    """Each row's non-zero |x| are one finite value (used to report tensors that look ternary but
    cannot be converted, e.g. K % 32 != 0)."""
    a = np.abs(x.reshape(x.shape[0], -1))
    with np.errstate(invalid="ignore"):
        m = a.max(axis=1)
        return bool(np.all(np.isfinite(m))) and bool(np.all((a == m[:, None]) | (a == 0)))


def fp16_exact(mag: np.ndarray) -> bool:
    """Every magnitude is exactly an fp16 value (a block scale of G128, B128, B256)."""
    with np.errstate(over="ignore"):
        back = mag.astype(np.float16).astype(np.float32)
    return bool(np.array_equal(back, mag))


def matrix_scales(mag: np.ndarray, n_mats: int) -> np.ndarray | None:
    """Per-matrix scale when every matrix's non-zero magnitudes (any grouping of ``mag``: rows, blocks) are one
    value at most MAX_SCALE, else None."""
    per_mat, ok = group_magnitudes(np.asarray(mag, dtype=np.float32).reshape(1, -1), mag.size // n_mats)
    # a valid scale is at most MAX_SCALE (FORMAT.md §3.1); larger magnitudes stay unconverted
    if not bool(np.all(ok)) or not bool(np.all(per_mat <= MAX_SCALE)):
        return None
    return per_mat.reshape(n_mats)


# version-1 names (the converter's old helpers; tests of other modules use them)
g128_representable = fp16_exact
pt_scales = matrix_scales


class TensorScales:
    """The magnitudes of a whole tensor of ``n_rows`` rows of ``k`` weights (``n_mats`` matrices), gathered
    from ``analyze_rows`` chunks in row order (``add``), and which variants hold its values exactly
    (FORMAT.md §7): MATRIX / PT one magnitude per matrix, ROW one per row (both finite, <= MAX_SCALE), B256 /
    B128 / G128 one fp16 value per 256 / 128 weights of a row. Uniform 32-groups are required throughout
    (``ternary``); a chunk that is not uniform makes the tensor not ternary.

    Memory: 4 bytes per row and 3/64 byte per weight for the block magnitudes, beside the caller's codes."""

    def __init__(self, n_rows: int, k: int, n_mats: int) -> None:
        self.n_rows, self.k, self.n_mats = n_rows, k, n_mats
        self.ternary = k % GROUP == 0
        self.row_mag = np.zeros(n_rows, np.float32)
        self.row_ok = True
        self.block_mag: dict[int, np.ndarray] = {}  # 128 / 256 -> (R, K/n) float32
        self.block_ok: dict[int, bool] = {}
        for n in (128, 256):
            if k % n == 0:
                self.block_mag[n] = np.zeros((n_rows, k // n), np.float32)
                self.block_ok[n] = True

    def add(self, start: int, chunk: TernaryChunk) -> None:
        """Take the magnitudes of rows ``start ...`` (one chunk); a non-uniform chunk ends the analysis."""
        if not chunk.uniform:
            self.ternary = False
        if not self.ternary:
            return
        stop = start + chunk.mag32.shape[0]
        mag, ok = group_magnitudes(chunk.mag32, chunk.mag32.shape[1])
        self.row_mag[start:stop] = mag[:, 0]
        self.row_ok = self.row_ok and bool(np.all(ok))
        for n in self.block_mag:
            mag, ok = group_magnitudes(chunk.mag32, n // GROUP)
            self.block_mag[n][start:stop] = mag
            self.block_ok[n] = self.block_ok[n] and bool(np.all(ok))

    def why_not(self, variant: Variant) -> str | None:
        """None when ``variant`` holds the tensor's values exactly, else the reason in words."""
        if not self.ternary:
            return "not ternary"
        if self.k % variant.k_multiple:
            return f"row length {self.k} is not a multiple of {variant.k_multiple}"
        if variant.scale_block:
            n = variant.scale_block
            if not self.block_ok[n]:
                return f"non-zero magnitudes differ within a block of {n} weights"
            if not fp16_exact(self.block_mag[n]):
                return f"a block magnitude (per {n}) is not an fp16 value"
            return None
        if variant is Variant.ROW:
            if not self.row_ok:
                return "non-zero magnitudes differ within a row"
            if not bool(np.all(self.row_mag <= MAX_SCALE)):
                return f"a row magnitude exceeds {MAX_SCALE}"
            return None
        per_mat, ok = group_magnitudes(self.row_mag.reshape(1, -1), self.n_rows // self.n_mats)
        if not self.row_ok or not bool(np.all(ok)):
            return "non-zero magnitudes differ within a matrix"
        if not bool(np.all(per_mat <= MAX_SCALE)):
            return f"a matrix magnitude exceeds {MAX_SCALE}"
        return None

    def scales(self, variant: Variant) -> np.ndarray:
        """The variant's scales for ``codec.encode`` (call only when ``why_not`` is None): fp32 (M,) for MATRIX /
        PT, fp32 (R,) for ROW, the magnitudes (R, K/n) as fp16 for the block variants (0 for an empty block)."""
        assert self.why_not(variant) is None, variant
        if variant.scale_block:
            return self.block_mag[variant.scale_block].astype(np.float16)
        if variant is Variant.ROW:
            return self.row_mag.copy()
        s = matrix_scales(self.row_mag, self.n_mats)
        assert s is not None
        return s


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
    sign = (u & np.uint16(1)).astype(np.int8)  # 1 -> negative
    return (present.view(np.int8) * (np.int8(1) - np.int8(2) * sign)).astype(np.int8, copy=False)
