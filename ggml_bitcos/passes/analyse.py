"""Pass 2, analyse: per candidate, whether and in which variant it converts (FORMAT.md §7: among the variants
``--scale`` allows that hold its values exactly, the fewest bytes), its encoded size (the output's tensor
infos need every companion's size up front), the grow check, and for a foreign type why it stays or must
convert (this llama.cpp cannot load it). ``stats`` stops after this pass."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.gguf_reader import ReaderTensor

from gguf_tools import tensor_form, tensor_ggml_shape, tensor_row_bytes, type_name

from .. import codec, ternary, tq
from ..foreign import I2_S, PQ2_0, PTQ1_0, Q2_0, foreign_type, form_label, pq2_0_decode, q2_0_decode
from ..format import MAX_WEIGHT_NAME, QK_K, TQ1_0_BLOCK_BYTES, TQ2_0_BLOCK_BYTES, VERSION, Variant
from ..source import TQ_SOURCES, iter_row_chunks, source_float_rows
from . import ConvertOptions, scale_variants


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


def variant_scales(
    variant: Variant, ts: ternary.TensorScales, tq_rows: np.ndarray | None = None, tq_block_bytes: int = 0
) -> np.ndarray:
    """The scales ``variant`` stores for a tensor (``tq_rows``: its row bytes when it is TQ1_0/TQ2_0, in
    blocks of ``tq_block_bytes``). Block variants from TQ1_0/TQ2_0 keep the source's d of every 256-block, for
    both 128-halves (B128, G128) and for blocks without a non-zero weight, so that the kernels' lane
    arithmetic equals TQ2_0's bit for bit (csrc/bitcos-kernels.h, FORMAT.md §3); every other scale is the
    common non-zero magnitude of its group (0 for an empty one)."""
    if variant.scale_block and tq_rows is not None:
        d = np.concatenate(
            [np.abs(tq.tq_block_scales(tq_rows[s:e], tq_block_bytes)) for s, e in iter_row_chunks(ts.n_rows, ts.k)]
        )
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
    form = tensor_form(t)
    if form:
        res.src_form = form_label(int(t.tensor_type), form)
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
    if not codec.weight_name_ok(res.name):
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
    scales = None
    if want_codes:
        tq_block_bytes = TQ2_0_BLOCK_BYTES if t.tensor_type == GGMLQuantizationType.TQ2_0 else TQ1_0_BLOCK_BYTES
        scales = variant_scales(res.variant, ts, tensor_row_bytes(t) if is_tq else None, tq_block_bytes)
    return Analysis(res, codes, scales, row_nonzero, sizes)


def encoded_nbytes(a: Analysis) -> tuple[int, int]:
    """(weight + companion bytes, companion bytes) of the encoding of ``a``, computed without encoding."""
    r = a.result
    assert r.converted and r.variant is not None and a.row_nonzero is not None
    g = codec.choose_row_group_log2(codec.row_sign_positions(a.row_nonzero))
    return codec.encoded_nbytes(r.variant, r.ne, r.n_weights - r.n_zeros, g)


@dataclass
class Planned:
    """A candidate after pass 2: its result; its analysis while pass 3 is to encode it at once (it fits the
    encoding cache), then its encoding while the cache holds it."""

    result: TensorResult
    must_convert: bool = False  # its source type does not load here (``must_convert``)
    analysis: Analysis | None = None
    encoded: codec.Encoded | None = None


def analyse(t: ReaderTensor, options: ConvertOptions, cache_left: int) -> Planned:
    """Pass 2 for one candidate: the variant and encoded size (FORMAT.md §7); a tensor that would grow stays
    unless ``force_grow`` or its source type does not load here (``must_convert``); the analysis is kept for
    pass 3 to encode at once when the encoding fits ``cache_left``. The reason of a foreign tensor that stays
    says what its layout holds (``explain``)."""
    must = must_convert(t)
    a = analyze_tensor(t, options.scale, options.format_version)
    r = a.result
    planned = Planned(r, must)
    if r.converted:
        r.out_bytes, r.companion_bytes = encoded_nbytes(a)
        if r.out_bytes > r.src_bytes and not options.force_grow and not must:
            r.converted, r.grow_kept = False, True
            n = max(r.n_weights, 1)
            r.reason = (
                f"BITCOS {r.variant.name} would grow it: {8 * r.src_bytes / n:.4f} -> "
                f"{8 * r.out_bytes / n:.4f} bits per weight at z = {r.zero_density:.3f}"
            )
        elif r.out_bytes <= cache_left:
            planned.analysis = a
    del a
    explain(t, r)
    return planned


def must_convert(t: ReaderTensor) -> bool:
    """Tensor ``t`` must become BITCOS: this project's llama.cpp cannot load it as it is (so a BITCOS form
    larger than the source is still taken: the source form does not run here at all, or is misread there)."""
    ft = foreign_type(int(t.tensor_type), tensor_form(t))
    return ft is not None and not ft.loadable


def explain(t: ReaderTensor, result: TensorResult) -> None:
    """Make the reason of an unconverted foreign-type tensor ``t`` say what the source layout holds and why
    BITCOS cannot hold it exactly."""
    ft = foreign_type(int(t.tensor_type), tensor_form(t))
    if (
        ft is None
        or result.converted
        or result.grow_kept
        or not result.reason.startswith(("not ternary", "no variant holds"))
    ):
        return
    raw = np.asarray(t.data).view(np.uint8)
    rows = math.prod(int(x) for x in t.shape[1:])
    if ft.type_id in (Q2_0, PQ2_0):
        codes, d = (q2_0_decode if ft.block == 64 else pq2_0_decode)(raw.reshape(rows, -1))
        if np.any(codes == 2):
            result.ternary_looking = False
            result.reason = f"not ternary: {ft.name} code 3 (+2·d) present"
        elif not np.all(np.isfinite(d)):
            result.ternary_looking = False
            result.reason = f"not ternary: non-finite {ft.name} block scale"
        elif ft.type_id == Q2_0 and ft.loadable:
            result.ternary_looking = True
            result.reason = (
                "Q2_0 block scales (fp16 per 64 weights) differ between the two halves of a "
                "128-weight block and within rows: no BITCOS variant (one scale per matrix, per "
                "row, per 256 or per 128 weights) holds them exactly; kept as Q2_0, which "
                "llama.cpp runs"
            )
    elif ft.type_id == I2_S:
        result.reason = "not ternary: I2_S field 3 (never written by bitnet.cpp) or a non-finite scale"
    elif ft.type_id == PTQ1_0:
        result.reason = "not ternary: non-finite PTQ1_0 block scale"


def unloadable_left(tensors: list[ReaderTensor], plan: dict[str, Planned]) -> str | None:
    """After analysis: the first tensor of a type this llama.cpp cannot load that stays unconverted, as one
    line (the output would not load), or None. ``tensors``: the source's; ``plan``: the analysed candidates."""
    left = []
    for t in tensors:
        entry = plan.get(t.name)
        if not (entry.must_convert if entry is not None else must_convert(t)):
            continue
        r = entry.result if entry is not None else None
        if r is not None and r.converted:
            continue
        if r is not None and r.reason:
            why = r.reason
        elif "token_embd" in t.name:
            why = "a lookup table (GET_ROWS), which BITCOS cannot serve"
        else:
            why = f"{len(t.shape)}-D (only 2-D and 3-D weights convert)"
        left.append((t, why))
    if not left:
        return None
    t, why = left[0]
    name = form_label(int(t.tensor_type), tensor_form(t))
    more = f" (and {len(left) - 1} more such tensor(s))" if len(left) > 1 else ""
    cannot = "would misread" if int(t.tensor_type) == Q2_0 else "cannot load"
    return (
        f"tensor '{t.name}' ({name}) cannot become BITCOS: {why}{more}; this llama.cpp {cannot} "
        f"{name} tensors, so the output would not load right and none is written"
    )


__all__ = [
    "TensorResult",
    "Analysis",
    "variant_scales",
    "analyze_tensor",
    "encoded_nbytes",
    "Planned",
    "analyse",
    "must_convert",
    "explain",
    "unloadable_left",
]
