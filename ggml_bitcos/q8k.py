"""ggml's Q8_K activation blocks in numpy: the ``vec_dot_type`` BITCOS and TQ2_0 kernels multiply weights with.

A Q8_K block holds 256 activations (``format.QK_K``) as int8 with one fp32 scale and the sums of every 16
values (``block_q8_K`` in ggml-common.h). The kernel harness passes these arrays to C, and the arithmetic
contract's reference (``ggml_bitcos.contract``) reads them, so both use this one definition.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from .format import QK_K

# ggml block_q8_K: float d; int8 qs[256]; int16 bsums[16] (292 bytes, no padding)
Q8K_DTYPE: Final = np.dtype([("d", "<f4"), ("qs", "i1", (QK_K,)), ("bsums", "<i2", (QK_K // 16,))])
assert Q8K_DTYPE.itemsize == 292


def n_blocks(k: int) -> int:
    """Q8_K blocks of a column of k activations (k zero-padded to a multiple of 256)."""
    return -(-k // QK_K)


def _with_bsums(y: np.ndarray) -> np.ndarray:
    """Fills ``bsums`` from ``qs`` (the sums of every 16 int8 values) and returns ``y``."""
    nc, nby = y.shape
    y["bsums"] = y["qs"].reshape(nc, nby, QK_K // 16, 16).sum(axis=3, dtype=np.int16)
    return y


def random_q8k(rng: np.random.Generator, nc: int, k: int) -> np.ndarray:
    """Random Q8_K activations (nc, ceil(k/256)): full int8 range (-128 included), positive scales; the
    positions past k are 0, as in ggml's quantization of a zero-padded row (the kernels' contract,
    csrc/bitcos-kernels.h, relies on it when k % 256 != 0)."""
    nby = n_blocks(k)
    y = np.zeros((nc, nby), dtype=Q8K_DTYPE)
    qs = rng.integers(-128, 128, size=(nc, nby * QK_K), dtype=np.int8)
    qs[:, k:] = 0
    y["qs"] = qs.reshape(nc, nby, QK_K)
    y["d"] = rng.uniform(1e-3, 0.05, size=(nc, nby)).astype(np.float32)
    return _with_bsums(y)


def quantize_q8k(x: np.ndarray) -> np.ndarray:
    """float32 (nc, k) -> Q8_K (nc, ceil(k/256)) as ggml's quantize_row_q8_K does (k zero-padded to 256)."""
    x = np.asarray(x, dtype=np.float32)
    nc, k = x.shape
    nby = n_blocks(k)
    xp = np.zeros((nc, nby * QK_K), dtype=np.float32)
    xp[:, :k] = x
    xb = xp.reshape(nc, nby, QK_K)
    idx = np.abs(xb).argmax(axis=2)
    vmax = np.take_along_axis(xb, idx[..., None], axis=2)[..., 0]  # signed value of largest |x|
    y = np.zeros((nc, nby), dtype=Q8K_DTYPE)
    nz = vmax != 0
    iscale = np.where(nz, np.float32(-127.0) / np.where(nz, vmax, 1), 0).astype(np.float32)
    q = np.rint(xb * iscale[..., None]).clip(-128, 127).astype(np.int8)
    y["qs"] = np.minimum(q, 127)
    y["d"] = np.where(nz, np.float32(1.0) / np.where(nz, iscale, 1), 0).astype(np.float32)
    return _with_bsums(y)


def as_q8k(y: np.ndarray, k: int) -> np.ndarray:
    """``y`` as a C-contiguous Q8_K array (nc, ceil(k/256)) for k activations per column; ``ValueError`` if
    its shape does not fit."""
    y = np.ascontiguousarray(y, dtype=Q8K_DTYPE)
    if y.ndim != 2 or y.shape[1] != n_blocks(k):
        raise ValueError(f"activations must be Q8_K (nc, {n_blocks(k)})")
    return y
