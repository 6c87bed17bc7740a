"""TQ1_0 and TQ2_0, ggml's ternary quant types, as numpy arrays: the sources BITCOS converts from losslessly.

Both types hold 256 weights per block (``format.QK_K``) as ternary codes and an fp16 scale ``d`` in the block's
last two bytes:

* ``tq2_0_decode`` / ``tq1_0_decode``: raw rows -> (codes int8 (R, K), d fp16 (R, K/256)); ``tq*_encode``
  the inverse (what make-model, ternarize and the benchmarks write);
* ``tq_block_scales``: only the d of every block (the converter keeps them as G128 block scales);
* ``tq_to_float``: ggml's ``dequantize_row_tq*_0``, the fp32 values a BITCOS conversion must reproduce.
"""

from __future__ import annotations

import numpy as np

from .format import QK_K, TQ1_0_BLOCK_BYTES, TQ2_0_BLOCK_BYTES


def _tq_check(raw: np.ndarray, block_bytes: int) -> tuple[np.ndarray, int]:
    raw = np.asarray(raw).view(np.uint8)
    rows = raw.shape[0] if raw.ndim == 2 else 1
    raw = raw.reshape(rows, -1)
    if raw.shape[1] % block_bytes:
        raise ValueError(f"row of {raw.shape[1]} bytes is not a whole number of {block_bytes}-byte blocks")
    return raw, raw.shape[1] // block_bytes


def tq2_0_decode(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TQ2_0 rows (R, nblk*66 bytes) -> (codes int8 (R, nblk*256), d fp16 (R, nblk)).

    Block: qs[64], d. Weight 128j + 32l + m is 2-bit field l of byte qs[32j + m], code = field - 1.
    """
    raw, nblk = _tq_check(raw, TQ2_0_BLOCK_BYTES)
    rows = raw.shape[0]
    blk = raw.reshape(rows, nblk, TQ2_0_BLOCK_BYTES)
    qs = blk[:, :, :64].reshape(rows, nblk, 2, 1, 32)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)
    fields = (qs >> shifts) & np.uint8(3)  # (rows, nblk, 2, 4, 32)
    codes = fields.view(np.int8) - np.int8(1)
    d = tq_block_scales(raw, TQ2_0_BLOCK_BYTES)
    return codes.reshape(rows, nblk * QK_K), d


def tq_block_scales(raw: np.ndarray, block_bytes: int) -> np.ndarray:
    """The fp16 d of every block of TQ1_0/TQ2_0 rows (R, nblk*block_bytes) -> (R, nblk); d is the last 2 bytes."""
    raw, nblk = _tq_check(raw, block_bytes)
    blk = raw.reshape(raw.shape[0], nblk, block_bytes)
    return np.ascontiguousarray(blk[:, :, block_bytes - 2 :]).view("<f2").reshape(raw.shape[0], nblk)


def tq2_0_encode(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Inverse of tq2_0_decode: codes (R, K) in {-1,0,1}, d (R, K/256) -> uint8 (R, K/256*66)."""
    rows, k = codes.shape
    nblk = k // QK_K
    q = (codes.astype(np.int8) + np.int8(1)).view(np.uint8).reshape(rows, nblk, 2, 4, 32)
    packed = q[:, :, :, 0] | (q[:, :, :, 1] << 2) | (q[:, :, :, 2] << 4) | (q[:, :, :, 3] << 6)
    out = np.empty((rows, nblk, TQ2_0_BLOCK_BYTES), dtype=np.uint8)
    out[:, :, :64] = packed.reshape(rows, nblk, 64)
    out[:, :, 64:] = np.asarray(d).astype("<f2").reshape(rows, nblk, 1).view(np.uint8)
    return out.reshape(rows, nblk * TQ2_0_BLOCK_BYTES)


_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _trits_of(b: np.ndarray, n_digits: int) -> np.ndarray:
    """Digits (most significant first) of bytes holding ceil(v * 256 / 243): (..., n) -> (..., n_digits, n).

    Multiplying by 3^i modulo 256 shifts digit i to the top; (x * 3) >> 8 reads the top digit.
    """
    m = (b[..., None, :] * _POW3[:n_digits].reshape(n_digits, 1)).astype(np.uint8)
    return ((m.astype(np.uint16) * 3) >> 8).astype(np.int8)


def tq1_0_decode(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TQ1_0 rows (R, nblk*54 bytes) -> (codes int8 (R, nblk*256), d fp16 (R, nblk)).

    Block: qs[48], qh[4], d. qs[0:32] hold weights 0..159 (weight 32i + j is digit i of byte j),
    qs[32:48] weights 160..239 (160 + 16i + j), qh weights 240..255 (240 + 4i + j, 4 digits).
    """
    raw, nblk = _tq_check(raw, TQ1_0_BLOCK_BYTES)
    rows = raw.shape[0]
    blk = raw.reshape(rows, nblk, TQ1_0_BLOCK_BYTES)
    a = _trits_of(blk[:, :, 0:32], 5).reshape(rows, nblk, 160)
    b = _trits_of(blk[:, :, 32:48], 5).reshape(rows, nblk, 80)
    c = _trits_of(blk[:, :, 48:52], 4).reshape(rows, nblk, 16)
    codes = np.concatenate([a, b, c], axis=2) - np.int8(1)
    d = tq_block_scales(raw, TQ1_0_BLOCK_BYTES)
    return codes.reshape(rows, nblk * QK_K), d


def _pack_trits(q: np.ndarray, n_digits: int) -> np.ndarray:
    """(…, n_digits, n) trits 0..2, most significant first -> (…, n) bytes ceil(v * 256 / 243)."""
    weights = (3 ** np.arange(4, 4 - n_digits, -1)).astype(np.uint16).reshape(n_digits, 1)
    v = (q.astype(np.uint16) * weights).sum(axis=-2, dtype=np.uint16)
    return ((v * 256 + 242) // 243).astype(np.uint8)


def tq1_0_encode(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Inverse of tq1_0_decode: codes (R, K) in {-1,0,1}, d (R, K/256) -> uint8 (R, K/256*54)."""
    rows, k = codes.shape
    nblk = k // QK_K
    q = (codes.astype(np.int8) + np.int8(1)).view(np.uint8).reshape(rows, nblk, QK_K)
    out = np.empty((rows, nblk, TQ1_0_BLOCK_BYTES), dtype=np.uint8)
    out[:, :, 0:32] = _pack_trits(q[:, :, :160].reshape(rows, nblk, 5, 32), 5)
    out[:, :, 32:48] = _pack_trits(q[:, :, 160:240].reshape(rows, nblk, 5, 16), 5)
    # qh: 4 trits in the top 4 base-3 digits (v = sum t_i 3^(4-i), lowest digit 0)
    out[:, :, 48:52] = _pack_trits(q[:, :, 240:].reshape(rows, nblk, 4, 4), 4)
    out[:, :, 52:] = np.asarray(d).astype("<f2").reshape(rows, nblk, 1).view(np.uint8)
    return out.reshape(rows, nblk * TQ1_0_BLOCK_BYTES)


def tq_to_float(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    """ggml's dequantize_row_tq*_0: x = (float) t * fp32(d) per 256-block."""
    rows, k = codes.shape
    nblk = k // QK_K
    x = codes.astype(np.float32)
    x3 = x.reshape(rows, nblk, QK_K)
    np.multiply(x3, d.astype(np.float32)[:, :, None], out=x3)
    return x
