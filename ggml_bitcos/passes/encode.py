"""Pass 3, encode: the BITCOS weight and companion of an analysed tensor, made right after its analysis and
kept while they fit the encoding cache (``ConvertOptions.cache_bytes``), else made again when the weight is
written (from a new analysis); the output entries (``rewrite.OutputTensor``) of a converted tensor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf.gguf_reader import ReaderTensor

from gguf_tools import bitcos_type

from .. import codec
from ..format import COMPANION_SUFFIX, COMPANION_TYPE, Variant
from ..rewrite import ConvertError, OutputTensor
from . import ConvertOptions
from .analyse import Analysis, Planned, analyze_tensor


def encode_analysis(a: Analysis) -> codec.Encoded:
    """The BITCOS encoding of a tensor the analysis found convertible, in its chosen variant."""
    r = a.result
    assert r.converted and r.variant is not None and a.codes is not None and a.scales is not None
    v = r.variant
    if v.scale_block:
        kw = {"block_scales": a.scales}
    elif v is Variant.ROW:
        kw = {"row_scales": a.scales}
    else:
        kw = {"matrix_scales": a.scales}
    return codec.encode(a.codes, v, n_mats=codec.n_mats_of(r.ne), **kw)


def keep(path: Path, planned: Planned) -> int:
    """Encode a tensor whose analysis pass 2 kept (it fits the cache) and keep the encoding for the write;
    the analysis is released. Returns the bytes kept."""
    a, planned.analysis = planned.analysis, None
    if a is None:
        return 0
    r = planned.result
    planned.encoded = encode_analysis(a)
    del a
    if planned.encoded.nbytes != r.out_bytes or planned.encoded.companion.nbytes != r.companion_bytes:
        raise ConvertError(f"{path}: tensor '{r.name}': encoded size differs from the computed one")
    return planned.encoded.nbytes


def encode(path: Path, t: ReaderTensor, planned: Planned, options: ConvertOptions) -> codec.Encoded:
    """The encoding of a converted tensor: the cache's (handed over once), or made again."""
    enc, planned.encoded = planned.encoded, None
    if enc is None:
        enc = encode_analysis(analyze_tensor(t, options.scale, options.format_version))
        if enc.companion.nbytes != planned.result.companion_bytes:
            raise ConvertError(f"{path}: tensor '{t.name}': re-encoding changed the companion size")
    return enc


def converted_outputs(path: Path, t: ReaderTensor, planned: Planned, options: ConvertOptions) -> list[OutputTensor]:
    """The weight and companion of a converted tensor: encoded when the weight is written (``encode``), and
    released after the companion."""
    held: list[codec.Encoded] = []
    r = planned.result

    def weight() -> np.ndarray:
        held.append(encode(path, t, planned, options))
        return held[-1].blocks

    def companion() -> np.ndarray:
        return held.pop().companion.view(np.int8)

    assert r.variant is not None
    return [
        OutputTensor(t.name, bitcos_type(r.variant), r.ne, data=weight, progress_bytes=int(t.n_bytes)),
        OutputTensor(t.name + COMPANION_SUFFIX, COMPANION_TYPE, (r.companion_bytes,), data=companion),
    ]


__all__ = ["encode_analysis", "keep", "encode", "converted_outputs"]
