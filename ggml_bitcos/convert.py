"""``ggml-bitcos convert``: rewrite every exactly-ternary weight of a GGUF file as BITCOS (FORMAT.md).

The passes over the source are ``ggml_bitcos.passes``' modules, shared with ``stats``; a tensor goes through
each once, streaming tensor by tensor through a read-only memory map:

1. read + check (``passes.read.open_source``): the file's types and data extents, its BITCOS pairs, the
   refusals, the candidates;
2. analyse (``passes.analyse.analyse``): decode each candidate tensor to fp32 in row chunks, decide (FORMAT.md
   §7) whether and in which variant it converts and compute its encoded size (the output's tensor infos need
   every companion's byte size up front);
3. encode (``passes.encode``): right after its analysis while all kept encodings fit a small fixed budget
   (``DEFAULT_CACHE_BYTES``), otherwise again (a new analysis) when the weight is written;
4. write + verify (``rewrite.write_verified`` with ``passes.write``'s metadata and check): header, metadata
   (+ ``bitcos.*`` keys), tensor infos, then tensor data one by one — copied tensors straight from the
   source map, converted ones as weight blocks followed by the companion — into a temporary file in the
   target folder; unless ``--no-verify``, the temporary file is reopened, every converted tensor decoded
   with the full invariant checks and its fp32 bit patterns compared with the source's (−0.0 mapped to
   +0.0, §5), copied tensors byte for byte; renamed onto the target only when complete and verified (a
   failed verification deletes it).

Memory: one tensor at a time. Every array of a tensor is released before the next one is read, and the
memory-mapped files' pages are dropped from the process after each tensor (``release_pages``), so the peak
resident memory is the interpreter and the parsed metadata, plus the encoding cache (at most
``DEFAULT_CACHE_BYTES``), plus the working set of the largest converted tensor (about 6 bytes per weight:
the int8 codes and the encoder's / decoder's bitmaps, sign bits and fp32 row chunks); docs/USAGE.md §4.

Crash safety: the output is written by ``gguf_tools.GGUFStreamWriter`` (temporary file under ``flock``,
fsync, atomic rename, folder fsync; stale temporary files of killed runs removed by the next run).

Each pass shows a tqdm progress bar on stderr when ``progress`` is on and stderr is a terminal
(``disable=None`` is tqdm's "off unless a TTY": no bar lines in logs or captured output).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from tqdm import tqdm

from gguf_tools import CheckedGGUFReader, tensor_ggml_shape, type_name

from . import foreign
from .format import BITCOS_TYPE_IDS, COMPANION_SUFFIX, Variant
from .passes import DEFAULT_CACHE_BYTES, ConvertOptions, scale_variants
from .passes.analyse import Planned, TensorResult, analyse, unloadable_left
from .passes.encode import converted_outputs, keep
from .passes.read import Source, check_names_writable, open_source, validate_bitcos_tensors
from .passes.write import metadata_to_copy, output_metadata, verify_output
from .rewrite import ConvertError, OutputTensor, check_paths, size_line, stale_line, write_verified
from .source import TQ_SOURCES


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
    removed_stale: list[Path] = field(default_factory=list)  # temp files of killed runs removed (docs/USAGE.md §3)
    bitcos_validated: int = 0  # BITCOS weights of the source, validated as the loader does and copied

    @property
    def converted(self) -> list[TensorResult]:
        return [t for t in self.tensors if t.converted]

    @property
    def skipped(self) -> list[TensorResult]:
        return [t for t in self.tensors if not t.converted and t.reason]


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
    """Convert ``src`` to ``out`` (default ``IN-bitcos.gguf``) as ``options`` says (``passes.ConvertOptions``;
    keyword ``changes`` replace its fields, e.g. ``convert(src, out, progress=False)``); the passes are
    ``passes``' modules, see the module docstring."""
    opts = replace(options or ConvertOptions(), **changes)
    scale_variants(opts.scale, opts.format_version)  # refuse a bad choice before any work
    src = Path(src)
    out = Path(out) if out is not None else default_output(src)
    check_paths(src, out, opts.force)
    source = open_source(src, opts.i2s_layout)
    reader = source.reader
    result = ConvertResult(src, out, notes=source.notes, layout_assumed=source.layout_assumed)
    check_names_writable(reader, src)
    # the BITCOS tensors it holds are copied as they are: each must pass the loader's validation first
    result.bitcos_validated = validate_bitcos_tensors(reader, src)
    t0 = time.perf_counter()
    # the key/values to copy, read now; then the parsed vocabulary arrays are dropped (peak memory)
    metadata = metadata_to_copy(reader)
    reader.drop_array_fields()
    plan = _analyse_all(source, opts)
    result.seconds["analyze"] = time.perf_counter() - t0
    problem = unloadable_left(reader.tensors, plan)
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

    # pass 3 for the tensors the cache did not keep: encoded while writing; pass 4: verify the temporary file
    # before it replaces anything
    outputs: list[OutputTensor] = []
    for t in reader.tensors:
        planned = plan.get(t.name)
        if planned is not None and planned.result.converted:
            outputs += converted_outputs(src, t, planned, opts)
        else:
            outputs.append(
                OutputTensor(t.name, t.tensor_type, tensor_ggml_shape(t), source=t, progress_bytes=int(t.n_bytes))
            )

    def check(tmp_path: Path) -> None:
        verify_output(reader, tmp_path, result.converted, progress=opts.progress, label=str(out))

    result.removed_stale = write_verified(
        reader,
        src,
        out,
        force=opts.force,
        metadata=output_metadata(reader, metadata, result.converted, n_bitcos),
        tensors=outputs,
        verify=check if opts.verify else None,
        progress=opts.progress,
        seconds=result.seconds,
    )
    result.verified = opts.verify
    result.seconds["total"] = time.perf_counter() - t0
    return result


def _analyse_all(source: Source, opts: ConvertOptions) -> dict[str, Planned]:
    """Pass 2 over every candidate, in file order, each followed by pass 3 while the encoding cache has room;
    --strict stops at the first ternary tensor that stays."""
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
            planned = analyse(t, opts, opts.cache_bytes - cached)
            cached += keep(source.path, planned)
            source.reader.release_pages()
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
        lines.append(stale_line(result.removed_stale, result.out))
    return lines


def verified_words(result: ConvertResult) -> str:
    """What the verification of a conversion established, in words: the output against the source *as read*,
    and where how it was read is an assumption (an I2_S layout the file does not record), that too."""
    words = "verified bit-exact against the source as read"
    if result.bitcos_validated:
        words += f" (its {result.bitcos_validated} BITCOS weight(s), copied, validated as llama.cpp's loader does)"
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
