"""``ggml-bitcos convert``: rewrite every exactly-ternary weight of a GGUF file as BITCOS (FORMAT.md).

The passes over the source (``ggml_bitcos.pipeline``: one function each, shared with ``stats``), each
streaming tensor by tensor through a read-only memory map:

1. read + check (``pipeline.open_source``): the file's types and data extents, its BITCOS pairs, the refusals;
2. analyse (``pipeline.analyse``): decode each candidate tensor to fp32 in row chunks, decide (FORMAT.md §7)
   whether and in which variant it converts and compute its encoded size (the output's tensor infos need
   every companion's byte size up front); the encoding itself is made and kept for pass 3 only while all
   kept encodings fit a small fixed budget (``DEFAULT_CACHE_BYTES``), otherwise pass 3 recomputes it;
3. encode + write (``pipeline.encode``, ``rewrite.write_verified``): header, metadata (+ ``bitcos.*`` keys),
   tensor infos, then tensor data one by one — copied tensors straight from the source map, converted ones
   as weight blocks followed by the companion — into a temporary file in the target folder, renamed onto
   the target only when complete;
4. verify (unless ``--no-verify``): reopen the output, decode every converted tensor with the full
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
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from gguf import GGUFValueType
from gguf.gguf_reader import ReaderTensor
from tqdm import tqdm

from gguf_tools import (
    CheckedGGUFReader,
    bitcos_type,
    field_value,
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
    Variant,
)
from .pipeline import DEFAULT_CACHE_BYTES, ConvertOptions, Planned, Source, analyse, encode, open_source
from .rewrite import ConvertError, OutputTensor, check_paths, size_line, verify_rewrite, write_verified
from .source import TQ_SOURCES, TensorResult, iter_row_chunks, scale_variants, source_float_rows


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


def _strict_problem(reader: CheckedGGUFReader, plan: dict[str, Planned], existing: set[str]) -> str | None:
    """--strict: the first tensor holding ternary weights that does not end up as BITCOS, and why.

    Ternary weights: any TQ1_0/TQ2_0 tensor, and any float tensor whose rows hold one magnitude each.
    Lookup tables (``token_embd``: GET_ROWS needs a fixed row layout) are never converted and never an error.
    """
    for t in reader.tensors:
        if "token_embd" in t.name or t.name.endswith(COMPANION_SUFFIX) or t.name + COMPANION_SUFFIX in existing:
            continue
        entry = plan.get(t.name)
        if entry is not None:
            r = entry.result
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


def convert(src: Path, out: Path | None = None, options: ConvertOptions | None = None, **changes) -> ConvertResult:
    """Convert ``src`` to ``out`` (default ``IN-bitcos.gguf``) as ``options`` says (``pipeline.ConvertOptions``;
    keyword ``changes`` replace its fields, e.g. ``convert(src, out, progress=False)``); the passes are
    ``pipeline``'s, see the module docstring."""
    opts = replace(options or ConvertOptions(), **changes)
    scale_variants(opts.scale, opts.format_version)  # refuse a bad choice before any work
    src = Path(src)
    out = Path(out) if out is not None else default_output(src)
    check_paths(src, out, opts.force)
    source = open_source(src, opts.i2s_layout)
    reader = source.reader
    result = ConvertResult(src, out, notes=source.notes, layout_assumed=source.layout_assumed)
    t0 = time.perf_counter()
    # the key/values to copy, read now; then the parsed vocabulary arrays are dropped (peak memory)
    metadata = _metadata_to_copy(reader)
    reader.drop_array_fields()
    plan = _analyse_all(source, opts)
    result.seconds["analyze"] = time.perf_counter() - t0
    problem = foreign.unloadable_left(reader.tensors, {name: (p.result,) for name, p in plan.items()})
    if problem:
        raise ConvertError(f"{src}: {problem}")
    result.tensors = [
        plan[t.name].result
        if t.name in plan
        else TensorResult(t.name, type_name(t.tensor_type), tensor_ggml_shape(t), src_bytes=int(t.n_bytes))
        for t in reader.tensors
    ]
    if opts.strict:
        problem = _strict_problem(reader, plan, source.names)
        if problem:
            raise ConvertError(f"{src}: {problem} (--strict)")
    n_bitcos = sum(1 for t in reader.tensors if t.tensor_type in BITCOS_TYPE_IDS)
    if not result.converted and not opts.allow_copy:
        raise ConvertError(_nothing_to_convert(src, result, n_bitcos))

    # pass 3: encode while writing, pass 4: verify the temporary file before it replaces anything
    outputs: list[OutputTensor] = []
    for t in reader.tensors:
        planned = plan.get(t.name)
        if planned is not None and planned.result.converted:
            outputs += _converted_outputs(source, t, planned, opts)
        else:
            outputs.append(
                OutputTensor(t.name, t.tensor_type, tensor_ggml_shape(t), source=t, progress_bytes=int(t.n_bytes))
            )

    def check(tmp_path: Path) -> None:
        verify_output(reader, tmp_path, result, progress=opts.progress, label=str(out))

    result.removed_stale = write_verified(
        reader,
        src,
        out,
        force=opts.force,
        metadata=_output_metadata(reader, metadata, result, n_bitcos),
        tensors=outputs,
        verify=check if opts.verify else None,
        progress=opts.progress,
        seconds=result.seconds,
    )
    result.verified = opts.verify
    result.seconds["total"] = time.perf_counter() - t0
    return result


def _analyse_all(source: Source, opts: ConvertOptions) -> dict[str, Planned]:
    """Pass 2 over every candidate, in file order, with the encoding cache's budget; --strict stops at the first
    ternary tensor that stays."""
    candidates = [t for t in source.reader.tensors if source.is_candidate(t)]
    bar = tqdm(
        total=sum(int(t.n_bytes) for t in candidates),
        desc="analyze",
        unit="B",
        unit_scale=True,
        disable=None if opts.progress else True,
    )
    plan: dict[str, Planned] = {}
    cached = 0
    with bar:
        for t in candidates:
            planned = analyse(source, t, opts, opts.cache_bytes - cached)
            if planned.encoded is not None:
                cached += planned.encoded.nbytes
            plan[t.name] = planned
            bar.set_postfix_str(t.name, refresh=False)
            bar.update(int(t.n_bytes))
            r = planned.result
            if opts.strict and not r.converted and r.ternary_looking:
                hint = " (--force-grow converts it anyway)" if r.grow_kept else ""
                raise ConvertError(
                    f"{source.path}: tensor '{t.name}': ternary but not converted: {r.reason}{hint} (--strict)"
                )
    return plan


def _output_metadata(
    reader: CheckedGGUFReader, metadata: list[tuple[str, tuple | ValueError]], result: ConvertResult, n_bitcos: int
) -> list[tuple | ValueError]:
    """The output's key/values: the source's, general.file_type replaced when anything converted, and the
    ``bitcos.*`` keys on a file holding BITCOS tensors."""
    kvs: list[tuple | ValueError] = []
    for key, kv in metadata:
        if isinstance(kv, ValueError):
            kvs.append(kv)
        elif not (key == "general.file_type" and result.converted):  # replaced: the file is now mostly BITCOS
            kvs.append((key, *kv))
    if result.converted:
        kvs.append(("general.file_type", file_type_of(result.converted), GGUFValueType.UINT32, None))
    if result.converted or n_bitcos > 0:  # no bitcos.* keys on a file without BITCOS tensors
        conv_types = {r.src_type for r in result.converted}
        kvs.append((KEY_FORMAT_VERSION, _file_format_version(reader, result), GGUFValueType.UINT32, None))
        kvs.append((KEY_CONVERTED_FROM, _merged_converted_from(reader, conv_types), GGUFValueType.STRING, None))
    return kvs


def _converted_outputs(source: Source, t: ReaderTensor, planned: Planned, opts: ConvertOptions) -> list[OutputTensor]:
    """The weight and companion of a converted tensor: encoded when the weight is written (pipeline.encode:
    from pass 2's cache or made again), and released after the companion."""
    held: list[codec.Encoded] = []
    r = planned.result

    def weight() -> np.ndarray:
        held.append(encode(source, t, planned, opts))
        return held[-1].blocks

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
    "ConvertOptions",
    "ConvertResult",
    "DEFAULT_CACHE_BYTES",
    "convert",
    "default_output",
    "summarize",
    "verify_output",
]
