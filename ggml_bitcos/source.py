"""Reading a source tensor as a converter does: its fp32 values in row chunks (any input type: F32/F16/BF16,
TQ1_0/TQ2_0, the foreign types in the form the reader assigned) and the analysis that decides whether and in
which BITCOS variant it converts (FORMAT.md §7). ``convert`` and ``stats`` analyse with it; ``convert --to``
dequantizes its output with it (ggml's arithmetic, to verify).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.gguf_reader import ReaderTensor

from gguf_tools import CheckedGGUFReader, tensor_ggml_shape, tensor_row_bytes, type_name

from . import codec, foreign, ternary, tq
from .format import (
    BITCOS_TYPE_IDS,
    COMPANION_SUFFIX,
    KEY_FORMAT_VERSION,
    MAX_WEIGHT_NAME,
    QK_K,
    TQ1_0_BLOCK_BYTES,
    TQ2_0_BLOCK_BYTES,
    VERSION,
    VERSIONS,
    Variant,
)
from .rewrite import ConvertError

FLOAT_SOURCES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
TQ_SOURCES = (GGMLQuantizationType.TQ1_0, GGMLQuantizationType.TQ2_0)
SOURCE_TYPES = FLOAT_SOURCES + TQ_SOURCES + tuple(foreign.FOREIGN_TYPES)  # + I2_S, Q2_0, PQ2_0, PTQ1_0
CHUNK_WEIGHTS = 1 << 23  # rows are processed in chunks of about this many weights

# --scale: the variants each choice may write, per format version, coarse to fine (auto's tie order, §7)
SCALE_VARIANTS: dict[int, dict[str, tuple[Variant, ...]]] = {
    2: {
        "auto": (Variant.MATRIX, Variant.ROW, Variant.B256, Variant.B128),
        "tensor": (Variant.MATRIX,),
        "row": (Variant.ROW,),
        "256": (Variant.B256,),
        "128": (Variant.B128,),
    },
    1: {"auto": (Variant.PT, Variant.G128), "tensor": (Variant.PT,), "128": (Variant.G128,)},
}
SCALE_ALIASES = {"g128": "128"}  # the version-1 name, kept for old command lines
SCALE_CHOICES = ("auto", "tensor", "row", "256", "128", *SCALE_ALIASES)


def scale_variants(scale: str, format_version: int) -> tuple[Variant, ...]:
    """The variants ``--scale scale`` may write in ``format_version``, coarse to fine; ConvertError when the
    choice has no form in that version (row / 256 in version 1)."""
    if format_version not in VERSIONS:
        raise ConvertError(f"--format-version {format_version}: choose one of {', '.join(map(str, VERSIONS))}")
    choices = SCALE_VARIANTS[format_version]
    key = SCALE_ALIASES.get(scale, scale)
    if key not in choices:
        if key in SCALE_VARIANTS[VERSION]:
            raise ConvertError(
                f"--scale {scale} has no version-{format_version} form (version {format_version} "
                f"has --scale {', '.join(choices)})"
            )
        raise ConvertError(f"--scale {scale}: choose one of {', '.join(SCALE_CHOICES)}")
    return choices[key]


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


# --- per-tensor decision ---------------------------------------------------------------------------


@dataclass
class TensorResult:
    name: str
    src_type: str
    ne: tuple[int, ...]
    src_form: str = ""  # the source type's form where it has several (foreign.form_label)
    converted: bool = False
    variant: Variant | None = None
    reason: str = ""  # why a candidate was not converted
    ternary_looking: bool = False  # a --strict error when not converted
    grow_kept: bool = False  # exact BITCOS form is larger than the source: kept (see --force-grow)
    measured: bool = False  # one magnitude per 32-weight group: n_zeros is the measured count
    n_weights: int = 0
    n_zeros: int = 0
    src_bytes: int = 0
    out_bytes: int = 0  # weight + companion for converted tensors
    companion_bytes: int = 0

    @property
    def zero_density(self) -> float:
        return self.n_zeros / self.n_weights if self.n_weights else 0.0


@dataclass
class Analysis:
    result: TensorResult
    codes: np.ndarray | None = None
    scales: np.ndarray | None = None  # the chosen variant's scales, as codec.encode takes them
    row_nonzero: np.ndarray | None = None  # non-zero weights per row (sizes the row index and sign pool)
    exact_bytes: dict[Variant, int] = field(default_factory=dict)  # every allowed exact variant -> its bytes


def is_candidate(name: str, t: ReaderTensor) -> bool:
    """A tensor convert looks at: a 2-D/3-D weight of a ternary-capable type, not a lookup table."""
    ne = tensor_ggml_shape(t)
    return (
        len(ne) in (2, 3)
        and t.tensor_type in SOURCE_TYPES
        and "token_embd" not in name
        and not name.endswith(COMPANION_SUFFIX)
    )


def _tq_block_scales(t: ReaderTensor, start: int, stop: int) -> np.ndarray:
    """|d| of each source 256-block of rows [start, stop) of a TQ1_0/TQ2_0 tensor, fp16 (rows, K/256)."""
    bb = TQ2_0_BLOCK_BYTES if t.tensor_type == GGMLQuantizationType.TQ2_0 else TQ1_0_BLOCK_BYTES
    return np.abs(tq.tq_block_scales(tensor_row_bytes(t)[start:stop], bb))


def variant_scales(t: ReaderTensor, variant: Variant, ts: ternary.TensorScales) -> np.ndarray:
    """The scales ``variant`` stores for tensor ``t``. Block variants from TQ1_0/TQ2_0 keep the source's d of
    every 256-block, for both 128-halves (B128, G128) and for blocks without a non-zero weight, so that the
    kernels' lane arithmetic equals TQ2_0's bit for bit (csrc/bitcos-kernels.h, FORMAT.md §3); every other
    scale is the common non-zero magnitude of its group (0 for an empty one)."""
    if variant.scale_block and t.tensor_type in TQ_SOURCES:
        d = np.concatenate([_tq_block_scales(t, s, e) for s, e in iter_row_chunks(ts.n_rows, ts.k)])
        return np.repeat(d, QK_K // variant.scale_block, axis=1) if variant.scale_block < QK_K else d
    return ts.scales(variant)


def analyze_tensor(
    t: ReaderTensor, scale: str = "auto", format_version: int = VERSION, *, want_codes: bool = True
) -> Analysis:
    """Decide whether a candidate converts and in which variant (FORMAT.md §7: among the variants ``scale``
    allows that hold the values exactly, the fewest bytes; ties to the coarser), and gather its codes and
    scales."""
    variants = scale_variants(scale, format_version)
    ne = tensor_ggml_shape(t)
    k = ne[0]
    n_rows = math.prod(ne[1:])
    res = TensorResult(t.name, type_name(t.tensor_type), ne, n_weights=k * n_rows, src_bytes=int(t.n_bytes))
    if foreign.tensor_form(t):
        res.src_form = foreign.form_label(int(t.tensor_type), foreign.tensor_form(t))
    is_tq = t.tensor_type in TQ_SOURCES

    if k == 0 or n_rows == 0:
        res.reason = "empty: a zero dimension (copied unchanged)"
        return Analysis(res)
    k_multiple = min(v.k_multiple for v in variants)
    if k % k_multiple:
        looks = all(ternary.is_row_ternary(source_float_rows(t, s, e)) for s, e in iter_row_chunks(n_rows, k))
        res.ternary_looking = looks
        res.reason = f"row length {k} is not a multiple of {k_multiple}" if looks else "not ternary"
        return Analysis(res)

    n_mats = codec.n_mats_of(ne)
    codes = np.empty((n_rows, k), dtype=np.int8) if want_codes else None
    ts = ternary.TensorScales(n_rows, k, n_mats)
    n_zeros = 0
    row_nonzero = np.empty(n_rows, dtype=np.int64)
    for s, e in iter_row_chunks(n_rows, k):
        ch = ternary.analyze_rows(source_float_rows(t, s, e))
        ts.add(s, ch)
        if not ts.ternary:
            res.ternary_looking = is_tq
            res.reason = "not ternary" if not is_tq else "non-finite scale"
            return Analysis(res)
        if codes is not None:
            codes[s:e] = ch.codes
        row_nonzero[s:e] = np.count_nonzero(ch.codes, axis=1)
        n_zeros += int(ch.codes.size - row_nonzero[s:e].sum())
        del ch
    res.n_zeros = n_zeros
    res.ternary_looking = True
    res.measured = True

    why = {v: ts.why_not(v) for v in variants}
    exact = [v for v in variants if why[v] is None]
    if not codec.weight_name_ok(t.name):
        res.reason = f"name longer than {MAX_WEIGHT_NAME} bytes (no room for the companion name)"
        return Analysis(res)
    if not exact:
        if scale != "auto":
            res.reason = f"--scale {scale}: {why[variants[0]]}"
        else:
            res.reason = "no variant holds its scales exactly: " + "; ".join(f"{v.name}: {w}" for v, w in why.items())
        return Analysis(res)
    g = codec.choose_row_group_log2(codec.row_sign_positions(row_nonzero))
    n_sign = res.n_weights - n_zeros

    def nbytes(v: Variant) -> int:
        return codec.encoded_nbytes(v, ne, n_sign, g)[0]

    sizes = {v: nbytes(v) for v in exact}
    # version 2: the fewest bytes (min keeps the first, coarsest, of equal sizes); version 1 as it always was:
    # PT whenever exact (for tiny tensors G128 can be smaller: PT's scales section costs 64 bytes)
    res.variant = min(exact, key=sizes.__getitem__) if format_version >= 2 else exact[0]
    res.converted = True
    scales = variant_scales(t, res.variant, ts) if want_codes else None
    return Analysis(res, codes, scales, row_nonzero, sizes)


def encoded_nbytes(a: Analysis) -> tuple[int, int]:
    """(weight + companion bytes, companion bytes) of ``encode_analysis(a)``, computed without encoding."""
    r = a.result
    assert r.converted and r.variant is not None and a.row_nonzero is not None
    g = codec.choose_row_group_log2(codec.row_sign_positions(a.row_nonzero))
    return codec.encoded_nbytes(r.variant, r.ne, r.n_weights - r.n_zeros, g)


def encode_analysis(a: Analysis) -> codec.Encoded:
    """The BITCOS encoding of a tensor ``analyze_tensor`` found convertible, in its chosen variant."""
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


def check_bitcos_file(reader: CheckedGGUFReader, path: Path) -> None:
    """FORMAT.md §1/§6: refuse a newer format version and unpaired weights/companions."""
    ver = reader.get_field(KEY_FORMAT_VERSION)
    if ver is not None and int(ver.contents()) > VERSION:
        raise ConvertError(
            f"{path}: {KEY_FORMAT_VERSION} {int(ver.contents())} is newer than this tool supports ({VERSION})"
        )
    types = {t.name: t.tensor_type for t in reader.tensors}
    for name, tt in types.items():
        if tt in BITCOS_TYPE_IDS and name + COMPANION_SUFFIX not in types:
            raise ConvertError(f"{path}: tensor '{name}': BITCOS weight without its companion tensor")
        if name.endswith(COMPANION_SUFFIX) and types.get(name[: -len(COMPANION_SUFFIX)]) not in BITCOS_TYPE_IDS:
            raise ConvertError(f"{path}: tensor '{name}': companion without a BITCOS weight")


def add_i2s_layout_option(p: argparse.ArgumentParser) -> None:
    """``--i2s-layout`` (convert, stats): which of bitnet.cpp's layouts a source's I2_S tensors are in."""
    p.add_argument(
        "--i2s-layout",
        choices=foreign.I2S_LAYOUTS,
        default=None,
        help="the layout of the source's I2_S tensors, which the file does not record: x86 (the default: "
        "bitnet.cpp's x86 builds and Python converters), arm (llama-quantize on an ARM build), "
        "x86-rows4 (an x86 build without ACT_PARALLEL); FORMAT.md §7.1",
    )


__all__ = [
    "FLOAT_SOURCES",
    "TQ_SOURCES",
    "SOURCE_TYPES",
    "SCALE_VARIANTS",
    "SCALE_CHOICES",
    "scale_variants",
    "source_float_rows",
    "iter_row_chunks",
    "TensorResult",
    "Analysis",
    "is_candidate",
    "analyze_tensor",
    "encoded_nbytes",
    "encode_analysis",
    "check_bitcos_file",
    "add_i2s_layout_option",
]
