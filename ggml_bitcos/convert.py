"""``ggml-bitcos convert``: rewrite every exactly-ternary weight of a GGUF file as BITCOS (FORMAT.md).

Three passes over the source, each streaming tensor by tensor through a read-only memory map:

1. analyze: decode each candidate tensor to fp32 in row chunks, decide (FORMAT.md §7) whether and in
   which variant it converts and compute its encoded size (the output's tensor infos need every
   companion's byte size up front); the encoding itself is made and kept for pass 2 only while all kept
   encodings fit a small fixed budget (``DEFAULT_CACHE_BYTES``), otherwise pass 2 recomputes it;
2. write: header, metadata (+ ``bitcos.*`` keys), tensor infos, then tensor data one by one — copied
   tensors straight from the source map, converted ones as weight blocks followed by the companion —
   into a temporary file in the target folder, renamed onto the target only when complete;
3. verify (unless ``--no-verify``): reopen the output, decode every converted tensor with the full
   invariant checks and compare its fp32 bit patterns with the source's (−0.0 mapped to +0.0, §5);
   copied tensors are compared byte for byte. A failed verification deletes the output.

Memory: one tensor at a time. Every array of a tensor is released before the next one is read, and the
memory-mapped files' pages are dropped from the process after each tensor (``release_pages``), so the peak
resident memory is the interpreter and the parsed metadata, plus the encoding cache (at most
``DEFAULT_CACHE_BYTES``), plus the working set of the largest converted tensor (about 6 bytes per weight:
the int8 codes and the encoder's / decoder's bitmaps, sign bits and fp32 row chunks); README "Memory".

Crash safety: the output is written by ``gguf_tools.GGUFStreamWriter`` (temporary file under ``flock``,
fsync, atomic rename, folder fsync; stale temporary files of killed runs removed by the next run).

Each pass shows a tqdm progress bar on stderr when ``progress`` is on and stderr is a terminal
(``disable=None`` is tqdm's "off unless a TTY": no bar lines in logs or captured output).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFValueType
from gguf.gguf_reader import ReaderTensor
from tqdm import tqdm

from gguf_tools import (
    CheckedGGUFReader,
    bitcos_type,
    field_value,
    open_gguf,
    tensor_bytes,
    tensor_ggml_shape,
    type_name,
)

from . import codec, foreign
from .format import (
    BITCOS_TYPE_IDS,
    COMPANION_SUFFIX,
    COMPANION_TYPE,
    KEY_CONVERTED_FROM,
    KEY_FORMAT_VERSION,
    TYPE_ID_BITMAP,
    VERSION,
    Variant,
)
from .rewrite import ConvertError, OutputTensor, check_paths, size_line, verify_rewrite, write_verified
from .source import (
    TQ_SOURCES,
    TensorResult,
    analyze_tensor,
    check_bitcos_file,
    encode_analysis,
    encoded_nbytes,
    is_candidate,
    iter_row_chunks,
    scale_variants,
    source_float_rows,
)

DEFAULT_CACHE_BYTES = 64 << 20  # encoded tensors kept between pass 1 and 2 up to this total (bytes)


def default_output(src: Path) -> Path:
    return (
        src.with_name(src.stem + "-bitcos.gguf") if src.suffix == ".gguf" else src.with_name(src.name + "-bitcos.gguf")
    )


# --- the conversion --------------------------------------------------------------------------------


@dataclass
class ConvertResult:
    src: Path
    out: Path
    tensors: list[TensorResult] = field(default_factory=list)
    verified: bool = False
    notes: list[str] = field(default_factory=list)  # how the source was read (forms, I2_S layout)
    layout_assumed: bool = False  # its I2_S tensors were read in the default layout, which the file does not record
    seconds: dict[str, float] = field(default_factory=dict)
    removed_stale: list[Path] = field(default_factory=list)  # temp files of killed runs removed (README)

    @property
    def converted(self) -> list[TensorResult]:
        return [t for t in self.tensors if t.converted]

    @property
    def skipped(self) -> list[TensorResult]:
        return [t for t in self.tensors if not t.converted and t.reason]


def _metadata_to_copy(reader: CheckedGGUFReader) -> list[tuple[str, tuple | ValueError]]:
    """(key, (value, type, item type)) of every key/value the output copies (not ``GGUF.*``, not ``bitcos.*``);
    a key that cannot be copied carries its ``ValueError`` (raised when the output is written)."""
    out: list[tuple[str, tuple | ValueError]] = []
    for key, fld in reader.fields.items():
        if key.startswith("GGUF.") or key.startswith("bitcos."):
            continue
        try:
            out.append((key, field_value(fld)))
        except ValueError as e:
            out.append((key, e))
    return out


def _merged_converted_from(reader: CheckedGGUFReader, new_types: set[str]) -> str:
    old = reader.get_field(KEY_CONVERTED_FROM)
    types = set(new_types)
    if old is not None and old.types == [GGUFValueType.STRING]:
        types |= {x for x in old.contents().split(",") if x}
    return ",".join(sorted(types))


def _file_format_version(reader: CheckedGGUFReader, result: ConvertResult) -> int:
    """bitcos.format_version of the output (FORMAT.md §6): the highest version of its BITCOS tensors, the
    converted ones and those copied from a source that already held BITCOS."""
    versions = [r.variant.version for r in result.converted if r.variant is not None]
    versions += [
        tensor_format_version(int(t.tensor_type)) for t in reader.tensors if int(t.tensor_type) in BITCOS_TYPE_IDS
    ]
    return max(versions)


def tensor_format_version(type_id: int) -> int:
    """The format version of a BITCOS weight of ggml type ``type_id`` (every variant stored as that type has it)."""
    return next(v.version for v in Variant if v.type_id == type_id)


def file_type_of(converted: list[TensorResult]) -> int:
    """general.file_type of a converted file: LLAMA_FTYPE_MOSTLY_BITCOS (162) / _G128 (160) / _PT (161), the
    ggml type ids (the file-types patch), of the type most converted weights have, so llama.cpp names the
    model as BITCOS rather than as its source type; ties to the newer format, then PT."""
    count: dict[int, int] = {}
    for r in converted:
        assert r.variant is not None
        count[r.variant.type_id] = count.get(r.variant.type_id, 0) + 1
    order = (TYPE_ID_BITMAP, Variant.PT.type_id, Variant.G128.type_id)
    return max(order, key=lambda tid: (count.get(tid, 0), -order.index(tid)))


def _grows(r: TensorResult) -> bool:
    """The BITCOS form (weight + companion) would take more bytes than the source tensor."""
    return r.out_bytes > r.src_bytes


def _strict_problem(
    reader: CheckedGGUFReader, plan: dict[str, tuple[TensorResult, codec.Encoded | None]], existing: set[str]
) -> str | None:
    """--strict: the first tensor holding ternary weights that does not end up as BITCOS, and why.

    Ternary weights: any TQ1_0/TQ2_0 tensor, and any float tensor whose rows hold one magnitude each.
    Lookup tables (``token_embd``: GET_ROWS needs a fixed row layout) are never converted and never an error.
    """
    for t in reader.tensors:
        if "token_embd" in t.name or t.name.endswith(COMPANION_SUFFIX) or t.name + COMPANION_SUFFIX in existing:
            continue
        entry = plan.get(t.name)
        if entry is not None:
            r = entry[0]
            if not r.converted and r.ternary_looking:
                hint = " (--force-grow converts it anyway)" if r.grow_kept else ""
                return f"tensor '{t.name}' ({r.src_type}): ternary but not converted: {r.reason}{hint}"
        elif t.tensor_type in TQ_SOURCES:
            return (
                f"tensor '{t.name}' ({type_name(t.tensor_type)}): ternary but not converted: "
                f"{len(tensor_ggml_shape(t))}-D (only 2-D and 3-D weights convert)"
            )
    return None


def _nothing_to_convert(src: Path, result: ConvertResult, n_bitcos: int) -> str:
    """Why a conversion found nothing to convert, as one line for the error."""
    kept = [r for r in result.tensors if not r.converted and r.ternary_looking]
    if kept:
        why = "; ".join(f"{r.name}: {r.reason}" for r in kept[:3]) + (
            f"; and {len(kept) - 3} more" if len(kept) > 3 else ""
        )
        what = f"{len(kept)} ternary tensor(s) stay as they are ({why})"
    elif n_bitcos:
        what = f"all {n_bitcos} ternary weights are already BITCOS"
    else:
        types = sorted({r.src_type for r in result.tensors})
        what = f"no ternary tensor found (tensor types: {', '.join(types)})"
    grow = "; --force-grow converts the tensors BITCOS would make larger" if any(r.grow_kept for r in kept) else ""
    return f"{src}: nothing to convert: {what}{grow}; --allow-copy writes an unchanged copy anyway"


def convert(
    src: Path,
    out: Path | None = None,
    *,
    scale: str = "auto",
    strict: bool = False,
    verify: bool = True,
    force: bool = False,
    progress: bool = True,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    allow_copy: bool = False,
    force_grow: bool = False,
    format_version: int = VERSION,
    i2s_layout: str | None = None,
) -> ConvertResult:
    """Convert ``src`` to ``out`` (default ``IN-bitcos.gguf``); see the module docstring for the passes.

    ``scale``: auto | tensor | row | 256 | 128 (g128), the variants allowed (``SCALE_VARIANTS``) in
    ``format_version`` (2, or 1 for readers that predate it). Nothing converted is an error (no output) unless
    ``allow_copy``; a tensor whose BITCOS form would be larger than its source stays as it is unless
    ``force_grow``; ``strict``: every ternary tensor must end up BITCOS. ``i2s_layout``: the layout of the
    source's I2_S tensors (``foreign.I2S_LAYOUTS``; None: the default, and the result says it was assumed).
    """
    scale_variants(scale, format_version)  # refuse a bad choice before any work
    src = Path(src)
    out = Path(out) if out is not None else default_output(src)
    check_paths(src, out, force)
    reader = open_gguf(src, i2s_layout=i2s_layout)
    check_bitcos_file(reader, src)
    problem = foreign.source_problem(reader)
    if problem:
        raise ConvertError(f"{src}: {problem}")
    result = ConvertResult(src, out, notes=list(reader.form_notes))
    layout_note = foreign.i2_s_layout_note(reader)
    if layout_note:
        result.notes.append(layout_note)
        result.layout_assumed = i2s_layout is None
    t0 = time.perf_counter()
    # the key/values to copy, read now; then the parsed vocabulary arrays are dropped (peak memory)
    metadata = _metadata_to_copy(reader)
    reader.drop_array_fields()

    # names of tensors already in BITCOS form (re-running convert on a converted file copies them)
    existing = {t.name for t in reader.tensors}

    # pass 1: analyze (+ encode, cached within budget)
    candidates = [t for t in reader.tensors if is_candidate(t.name, t) and t.name + COMPANION_SUFFIX not in existing]
    bar = tqdm(
        total=sum(int(t.n_bytes) for t in candidates),
        desc="analyze",
        unit="B",
        unit_scale=True,
        disable=None if progress else True,
    )
    plan: dict[str, tuple[TensorResult, codec.Encoded | None]] = {}
    cached = 0
    for t in candidates:
        a = analyze_tensor(t, scale, format_version)
        r = a.result
        enc = None
        if r.converted:
            r.out_bytes, r.companion_bytes = encoded_nbytes(a)
            if _grows(r) and not force_grow and not foreign.must_convert(t):
                r.converted, r.grow_kept = False, True
                n = max(r.n_weights, 1)
                r.reason = (
                    f"BITCOS {r.variant.name} would grow it: {8 * r.src_bytes / n:.4f} -> "
                    f"{8 * r.out_bytes / n:.4f} bits per weight at z = {r.zero_density:.3f}"
                )
            elif cached + r.out_bytes <= cache_bytes:  # else recomputed in pass 2 (sizes are kept)
                enc = encode_analysis(a)
                if enc.nbytes != r.out_bytes or enc.companion.nbytes != r.companion_bytes:
                    raise ConvertError(f"{src}: tensor '{t.name}': encoded size differs from the computed one")
                cached += enc.nbytes
        del a
        reader.release_pages()
        foreign.explain(t, r)
        plan[t.name] = (r, enc)
        bar.set_postfix_str(t.name, refresh=False)
        bar.update(int(t.n_bytes))
        if strict and not r.converted and r.ternary_looking:
            bar.close()
            hint = " (--force-grow converts it anyway)" if r.grow_kept else ""
            raise ConvertError(f"{src}: tensor '{t.name}': ternary but not converted: {r.reason}{hint} (--strict)")
    bar.close()
    result.seconds["analyze"] = time.perf_counter() - t0
    problem = foreign.unloadable_left(reader.tensors, plan)
    if problem:
        raise ConvertError(f"{src}: {problem}")
    result.tensors = [
        plan[t.name][0]
        if t.name in plan
        else TensorResult(t.name, type_name(t.tensor_type), tensor_ggml_shape(t), src_bytes=int(t.n_bytes))
        for t in reader.tensors
    ]
    if strict:
        problem = _strict_problem(reader, plan, existing)
        if problem:
            raise ConvertError(f"{src}: {problem} (--strict)")
    n_bitcos = sum(1 for t in reader.tensors if t.tensor_type in BITCOS_TYPE_IDS)
    if not result.converted and not allow_copy:
        raise ConvertError(_nothing_to_convert(src, result, n_bitcos))
    tag_bitcos = bool(result.converted) or n_bitcos > 0  # no bitcos.* keys on a file without BITCOS tensors

    # pass 2: write, pass 3: verify the temporary file before it replaces anything (rewrite.write_verified)
    kvs: list[tuple | ValueError] = []
    for key, kv in metadata:
        if isinstance(kv, ValueError):
            kvs.append(kv)
        elif not (key == "general.file_type" and result.converted):  # replaced: the file is now mostly BITCOS
            kvs.append((key, *kv))
    if result.converted:
        kvs.append(("general.file_type", file_type_of(result.converted), GGUFValueType.UINT32, None))
    if tag_bitcos:
        conv_types = {r.src_type for r in result.converted}
        kvs.append((KEY_FORMAT_VERSION, _file_format_version(reader, result), GGUFValueType.UINT32, None))
        kvs.append((KEY_CONVERTED_FROM, _merged_converted_from(reader, conv_types), GGUFValueType.STRING, None))
    outputs: list[OutputTensor] = []
    for t in reader.tensors:
        r = plan[t.name][0] if t.name in plan else None
        if r is not None and r.converted:
            outputs += _converted_outputs(src, t, r, plan, scale, format_version)
        else:
            outputs.append(
                OutputTensor(t.name, t.tensor_type, tensor_ggml_shape(t), source=t, progress_bytes=int(t.n_bytes))
            )

    def check(tmp_path: Path) -> None:
        verify_output(reader, tmp_path, result, progress=progress, label=str(out))

    result.removed_stale = write_verified(
        reader,
        src,
        out,
        force=force,
        metadata=kvs,
        tensors=outputs,
        verify=check if verify else None,
        progress=progress,
        seconds=result.seconds,
    )
    result.verified = verify
    result.seconds["total"] = time.perf_counter() - t0
    return result


def _converted_outputs(
    src: Path,
    t: ReaderTensor,
    r: TensorResult,
    plan: dict[str, tuple[TensorResult, codec.Encoded | None]],
    scale: str,
    format_version: int,
) -> list[OutputTensor]:
    """The weight and companion of a converted tensor: its encoding from pass 1's cache, or made again when
    the weight is written (the cache keeps only what fits its budget), and released after the companion."""
    held: list[codec.Encoded] = []

    def weight() -> np.ndarray:
        enc = plan[t.name][1]
        if enc is None:
            enc = encode_analysis(analyze_tensor(t, scale, format_version))
            if enc.companion.nbytes != r.companion_bytes:
                raise ConvertError(f"{src}: tensor '{t.name}': re-encoding changed the companion size")
        plan[t.name] = (r, None)
        held.append(enc)
        return enc.blocks

    def companion() -> np.ndarray:
        return held.pop().companion.view(np.int8)

    assert r.variant is not None
    return [
        OutputTensor(t.name, bitcos_type(r.variant), r.ne, data=weight, progress_bytes=int(t.n_bytes)),
        OutputTensor(t.name + COMPANION_SUFFIX, COMPANION_TYPE, (r.companion_bytes,), data=companion),
    ]


def verify_output(
    src_reader: CheckedGGUFReader,
    out_path: Path,
    result: ConvertResult,
    *,
    progress: bool = True,
    label: str | None = None,
) -> None:
    """Every converted tensor decodes to the source's fp32 bits (−0.0 -> +0.0); others are byte-equal."""
    label = label or str(out_path)

    def check(r: TensorResult) -> Callable[[ReaderTensor, ReaderTensor, dict[str, ReaderTensor]], None]:
        def converted(t: ReaderTensor, o: ReaderTensor, out_tensors: dict[str, ReaderTensor]) -> None:
            comp = out_tensors.get(t.name + COMPANION_SUFFIX)
            if comp is None or o.tensor_type not in BITCOS_TYPE_IDS:
                raise ConvertError(f"{label}: tensor '{t.name}': verification failed: not written as BITCOS")
            ne = tensor_ggml_shape(o)
            n_rows, k = math.prod(ne[1:]), ne[0]
            try:
                dec = codec.decode(
                    tensor_bytes(o), tensor_bytes(comp), int(o.tensor_type), k, n_rows, codec.n_mats_of(ne)
                )
            except codec.FormatError as e:
                raise ConvertError(f"{label}: tensor '{t.name}': verification failed: {e}") from None
            if dec.variant != r.variant:
                raise ConvertError(
                    f"{label}: tensor '{t.name}': verification failed: written as "
                    f"{dec.variant.name}, chosen {r.variant.name}"
                )
            for s, e in iter_row_chunks(n_rows, k):
                want = source_float_rows(t, s, e)
                got = dec.to_float(slice(s, e))
                # bit-exact up to the sign of zero (FORMAT.md §5): IEEE-equal (so +0 == -0, and a
                # NaN never matches) and the output never holds -0.0; non-zero equal floats have equal bits
                if not np.array_equal(got, want) or np.any(got.view(np.uint32) == np.uint32(0x80000000)):
                    gb, wb = got.view(np.uint32), want.view(np.uint32)
                    wb = np.where(wb == np.uint32(0x80000000), np.uint32(0), wb)
                    bad = np.argwhere(gb != wb)[0]
                    raise ConvertError(
                        f"{label}: tensor '{t.name}': verification failed: row {s + int(bad[0])} "
                        f"col {int(bad[1])} decodes to bits 0x{int(gb[tuple(bad)]):08x}, "
                        f"source 0x{int(wb[tuple(bad)]):08x}"
                    )
                del want, got

        return converted

    verify_rewrite(
        src_reader, out_path, label, rewritten={r.name: check(r) for r in result.converted}, progress=progress
    )


def summarize(result: ConvertResult) -> list[str]:
    conv = result.converted
    n_w = sum(r.n_weights for r in conv)
    n_z = sum(r.n_zeros for r in conv)
    out_b = sum(r.out_bytes for r in conv)
    src_b = sum(r.src_bytes for r in conv)
    by_var = {v: [r for r in conv if r.variant == v] for v in Variant}
    counts = ", ".join(f"{len(rs)} {v.name}" for v, rs in by_var.items() if rs)
    lines = [f"source: {note}" for note in result.notes]
    lines.append(
        f"converted {len(conv)} tensors{f' ({counts})' if counts else ''} of "
        f"{len(result.tensors)}; copied {len(result.tensors) - len(conv)} unchanged"
    )
    if n_w:
        lines.append(
            f"ternary weights {n_w:,}: zero density {n_z / n_w:.4f}, "
            f"{8 * src_b / n_w:.4f} -> {8 * out_b / n_w:.4f} bits per weight (tensor data)"
        )
    for v, rs in by_var.items():
        if not rs:
            continue
        w = sum(r.n_weights for r in rs)
        z = sum(r.n_zeros for r in rs) / w
        lines.append(
            f"  {v.name} ({v.type_name}, scales {_scale_words(v)}): {len(rs)} tensor(s), {w:,} weights, "
            f"z = {z:.4f}: {8 * sum(r.out_bytes for r in rs) / w:.4f} bits per weight (weight + "
            f"companion; {8 * sum(r.src_bytes for r in rs) / w:.4f} in the source)"
        )
    grown = [r for r in result.skipped if r.grow_kept]
    if grown:
        lines.append(
            f"kept in their source type: {len(grown)} tensor(s) that BITCOS would make larger "
            f"(--force-grow converts them):"
        )
    for r in grown:
        lines.append(f"  {r.name} ({r.src_form or r.src_type}): {r.reason}")
    for r in result.skipped:
        if r.reason != "not ternary" and not r.grow_kept:
            lines.append(f"not converted: {r.name} ({r.src_form or r.src_type}): {r.reason}")
    n_nt = sum(1 for r in result.skipped if r.reason == "not ternary")
    if n_nt:
        lines.append(
            f"not converted: {n_nt} non-ternary tensor(s): "
            + ", ".join(r.name for r in result.skipped if r.reason == "not ternary")[:300]
        )
    lines.append(size_line(result.src, result.out, result.verified, verified_words(result)))
    lines.append("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in result.seconds.items()))
    if result.removed_stale:
        lines.append(
            f"removed {len(result.removed_stale)} stale temporary file(s) of {result.out.name} left by "
            f"killed runs: " + ", ".join(p.name for p in result.removed_stale)
        )
    return lines


def verified_words(result: ConvertResult) -> str:
    """What the verification of a conversion established, in words: the output against the source *as read*,
    and where how it was read is an assumption (an I2_S layout the file does not record), that too."""
    words = "verified bit-exact against the source as read"
    if result.layout_assumed:
        words += f" (its I2_S tensors read in the assumed {foreign.I2S_DEFAULT_LAYOUT} layout: see 'source:' above)"
    return words


def _scale_words(v: Variant) -> str:
    """A variant's scale granularity in words (the summary)."""
    if v.scale_block:
        return f"fp16 per {v.scale_block}"
    return "fp32 per row" if v is Variant.ROW else "fp32 per matrix"


__all__ = [
    "ConvertError",
    "ConvertResult",
    "DEFAULT_CACHE_BYTES",
    "convert",
    "default_output",
    "summarize",
    "verify_output",
]
