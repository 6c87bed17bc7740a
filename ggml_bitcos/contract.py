"""The reference of the BITCOS kernels' arithmetic contract (v2, ``csrc/bitcos-kernels.h``) in numpy.

The contract fixes every fp32 operation of a BITCOS matmul so that the generic, AVX2 and AVX-512 kernels agree
bit for bit, and with TQ2_0's ``vec_dot`` on the same codes and scales. ``reference_mm`` evaluates it from the
plain ternary codes, independently of the C code and of the BITCOS encoding: exact integer lane sums, then the
contract's fp32 operations in its order. ``fma_f32`` is the correctly rounded fused multiply-add numpy lacks,
for the contract's fused form.
"""

from __future__ import annotations

import numpy as np

from .format import QK, QK_K, Variant
from .q8k import as_q8k, n_blocks


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Correctly rounded float32 fused multiply-add a * b + c, elementwise (numpy has none).

    The float64 product of two float32 is exact; TwoSum gives the float64 sum s and its exact error e; the
    sum is then rounded to odd (when e != 0 and s has an even significand, step s one ulp towards e), and
    rounding a round-to-odd float64 (53 >= 24 + 2 bits) to float32 is the correctly rounded result. A plain
    float64 a*b + c rounded to float32 would round twice and be wrong in rare halfway cases.
    """
    a64 = np.asarray(a, dtype=np.float32).astype(np.float64)
    b64 = np.asarray(b, dtype=np.float32).astype(np.float64)
    c64 = np.asarray(c, dtype=np.float32).astype(np.float64)
    p = a64 * b64
    s = p + c64
    bv = s - p
    e = (p - (s - bv)) + (c64 - bv)
    bits = np.ascontiguousarray(s).view(np.int64)
    fix = (e != 0) & ((bits & 1) == 0)
    toward_larger_magnitude = (e > 0) == (s > 0)
    bits = np.where(fix, np.where(toward_larger_magnitude, bits + 1, bits - 1), bits)
    return bits.view(np.float64).astype(np.float32)


def _contract_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray, fma: bool) -> np.ndarray:
    """The contract's FMA(a, b, c): fused, or a float32 product then a float32 sum."""
    if fma:
        return fma_f32(a, b, c)
    return (np.asarray(a, dtype=np.float32) * np.asarray(b, dtype=np.float32)) + np.asarray(c, dtype=np.float32)


def reference_lanes(codes: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Exact lane sums L[c, r, b, h, l] of the contract (bitcos-kernels.h) in int64.

    codes int (nr, k), q int (nc, k) (the activations of the matrix's k positions). Positions are padded
    with t = 0, q = 0 to whole Q8_K blocks; half h of block b is positions 256b + 128h .. +127.
    """
    codes = np.asarray(codes, dtype=np.int64)
    nr, k = codes.shape
    nc = q.shape[0]
    nby = n_blocks(k)
    tp = np.zeros((nr, nby * QK_K), dtype=np.int64)
    tp[:, :k] = codes + 1
    tp[:, k:] = 0  # absent positions: t = 0 and q = 0, so (t + 1) * q = 0 either way
    qp = np.zeros((nc, nby * QK_K), dtype=np.int64)
    qp[:, :k] = q
    # position j of half h: 32-chunk x = (j % 128) // 32, lane l = (j % 32) // 4, byte y = j % 4
    t6 = tp.reshape(nr, nby, 2, 4, 8, 4)
    q6 = qp.reshape(nc, nby, 2, 4, 8, 4)
    lanes = np.einsum("rbhxly,cbhxly->crbhl", t6, q6)  # sum (t + 1) * q by lane
    chunk = q6.sum(axis=(4, 5))  # (nc, nby, 2, 4): 32-position sums
    for h in range(2):
        lanes[:, :, :, h, 4 * h : 4 * h + 4] -= chunk[:, None, :, h, :]
    return lanes


def reference_mm(
    codes: np.ndarray,
    variant: Variant,
    y: np.ndarray,
    *,
    block_scales: np.ndarray | None = None,
    scale: float = 1.0,
    row_scales: np.ndarray | None = None,
    fma: bool = True,
) -> np.ndarray:
    """Independent numpy evaluation of the kernel contract v2 from the plain codes: dst (nc, nr) float32.

    Scales by variant (FORMAT.md §4.2): G128 / B128 ``block_scales`` fp16 (nr, k/128), B256 fp16 (nr, k/256)
    (both 128-halves of a 256-block use the one scale); PT / MATRIX ``scale`` (the matrix's) or ``row_scales``;
    ROW ``row_scales`` (nr,). Any k that is a multiple of 32 for the row-scaled variants.

    Integer lane sums in int64 (exact), then every fp32 operation of bitcos-kernels.h in its order,
    vectorised over rows, columns and lanes (each numpy float32 op is one IEEE operation per element, never
    fused; the fused form uses fma_f32).
    """
    variant = Variant(variant)
    codes = np.asarray(codes, dtype=np.int64)
    nr, k = codes.shape
    nb = -(-k // QK)
    nby = n_blocks(k)
    y = as_q8k(y, k)
    nc = y.shape[0]
    q = y["qs"].reshape(nc, -1)[:, :k].astype(np.int64)
    lanes = reference_lanes(codes, q)  # (nc, nr, nby, 2, 8)
    yd = y["d"].astype(np.float32)  # (nc, nby)
    acc = np.zeros((nc, nr, 8), dtype=np.float32)
    row_scaled = not variant.scale_block
    if row_scaled:
        rs = (
            np.full(nr, scale, dtype=np.float32)
            if row_scales is None
            else np.asarray(row_scales, dtype=np.float32).reshape(nr)
        )
    else:
        e = np.ascontiguousarray(np.asarray(block_scales, dtype="<f2").reshape(nr, k // variant.scale_block))
        if variant.scale_block == 2 * QK:
            e = np.repeat(e, 2, axis=1)  # one scale for both 128-halves
    for b in range(nby):
        both = (lanes[:, :, b, 0] + lanes[:, :, b, 1]).astype(np.float32)  # exact: |L| < 2^24
        if row_scaled:
            d = (yd[:, b, None] * rs[None, :]).astype(np.float32)  # (nc, nr)
            acc = _contract_fma(both, d[..., None], acc, fma)
            continue
        e0 = e[:, 2 * b]
        e1 = e[:, 2 * b + 1] if 2 * b + 1 < nb else e0
        same = e0.view(np.uint16) == e1.view(np.uint16)  # (nr,)
        d0 = (yd[:, b, None] * e0.astype(np.float32)[None, :]).astype(np.float32)  # (nc, nr)
        d1 = (yd[:, b, None] * e1.astype(np.float32)[None, :]).astype(np.float32)
        joint = _contract_fma(both, d0[..., None], acc, fma)
        split = _contract_fma(lanes[:, :, b, 0].astype(np.float32), d0[..., None], acc, fma)
        split = _contract_fma(lanes[:, :, b, 1].astype(np.float32), d1[..., None], split, fma)
        acc = np.where(same[None, :, None], joint, split)
    a = acc
    return ((a[..., 0] + a[..., 4]) + (a[..., 2] + a[..., 6])) + ((a[..., 1] + a[..., 5]) + (a[..., 3] + a[..., 7]))
