"""Reading a source tensor as a converter does: its fp32 values in row chunks, as ggml would dequantize them
(any input type: F32/F16/BF16, TQ1_0/TQ2_0, the foreign types in the form the reader assigned). The
converter's analysis and verification read rows with it (``passes.analyse``, ``passes.write``); ``convert
--to`` dequantizes its output with it (ggml's arithmetic, to verify).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.gguf_reader import ReaderTensor

from gguf_tools import tensor_row_bytes, type_name

from . import foreign, tq

FLOAT_SOURCES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
TQ_SOURCES = (GGMLQuantizationType.TQ1_0, GGMLQuantizationType.TQ2_0)
SOURCE_TYPES = FLOAT_SOURCES + TQ_SOURCES + tuple(foreign.FOREIGN_TYPES)  # + I2_S, Q2_0, PQ2_0, PTQ1_0
CHUNK_WEIGHTS = 1 << 23  # rows are processed in chunks of about this many weights


# --- reading source tensors as fp32 ----------------------------------------------------------------


def bf16_to_float(raw: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns -> float32 (exact: a bf16 is the top half of an fp32)."""
    u = np.asarray(raw).view("<u2")
    return (u.astype(np.uint32) << 16).view(np.float32)


def chunk_rows(k: int) -> int:
    return max(1, CHUNK_WEIGHTS // max(k, 1))


def source_float_rows(t: ReaderTensor, start: int, stop: int) -> np.ndarray:
    """fp32 values of rows [start, stop) of a 2-D/3-D source tensor, as ggml would dequantize them."""
    raw = tensor_row_bytes(t)[start:stop]
    tt = t.tensor_type
    if tt == GGMLQuantizationType.F32:
        return raw.view("<f4")
    if tt == GGMLQuantizationType.F16:
        return raw.view("<f2").astype(np.float32)
    if tt == GGMLQuantizationType.BF16:
        return bf16_to_float(raw)
    if tt == GGMLQuantizationType.TQ2_0:
        return tq.tq_to_float(*tq.tq2_0_decode(raw))
    if tt == GGMLQuantizationType.TQ1_0:
        return tq.tq_to_float(*tq.tq1_0_decode(raw))
    if int(tt) in foreign.FOREIGN_TYPES:
        return foreign.float_rows(t, raw, start, stop)
    raise ValueError(f"cannot decode {type_name(tt)}")


def iter_row_chunks(n_rows: int, k: int) -> Iterator[tuple[int, int]]:
    step = chunk_rows(k)
    for s in range(0, n_rows, step):
        yield s, min(n_rows, s + step)


__all__ = [
    "FLOAT_SOURCES",
    "TQ_SOURCES",
    "SOURCE_TYPES",
    "CHUNK_WEIGHTS",
    "bf16_to_float",
    "source_float_rows",
    "iter_row_chunks",
]
