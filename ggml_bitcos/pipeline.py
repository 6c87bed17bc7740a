"""The converter's passes over a source, one function per pass, shared by ``convert`` and ``stats``:

1. ``open_source``: read + check (the file, its BITCOS pairs, the foreign-format refusals, how its forms are
   read) and which tensors are candidates;
2. ``analyse``: per candidate, whether and in which variant it converts (``source.analyze_tensor``, FORMAT.md
   §7), its encoded size, the grow check and, for a foreign type, why it stays; ``stats`` stops here;
3. ``encode``: the BITCOS encoding of an analysed tensor, kept from pass 2 within the cache budget or made
   again when it is written;
4. write + verify: ``convert.convert`` hands the outputs to ``rewrite.write_verified``.

``ConvertOptions`` holds what the command line chooses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gguf.gguf_reader import ReaderTensor

from gguf_tools import CheckedGGUFReader, open_gguf

from . import codec, foreign
from .format import COMPANION_SUFFIX, VERSION
from .rewrite import ConvertError
from .source import TensorResult, analyze_tensor, check_bitcos_file, encode_analysis, encoded_nbytes, is_candidate

DEFAULT_CACHE_BYTES = 64 << 20  # encoded tensors kept between pass 1 and 2 up to this total (bytes)


@dataclass(frozen=True)
class ConvertOptions:
    """What ``convert`` is asked to do (the command line's flags).

    ``scale``: auto | tensor | row | 256 | 128 (g128), the variants allowed (``source.SCALE_VARIANTS``) in
    ``format_version`` (2, or 1 for readers that predate it). Nothing converted is an error (no output) unless
    ``allow_copy``; a tensor whose BITCOS form would be larger than its source stays as it is unless
    ``force_grow``; ``strict``: every ternary tensor must end up BITCOS. ``i2s_layout``: the layout of the
    source's I2_S tensors (``foreign.I2S_LAYOUTS``; None: the default, and the result says it was assumed).
    ``cache_bytes``: encodings kept from the analysis for the write, up to this total.
    """

    scale: str = "auto"
    format_version: int = VERSION
    strict: bool = False
    allow_copy: bool = False
    force_grow: bool = False
    i2s_layout: str | None = None
    verify: bool = True
    force: bool = False
    progress: bool = True
    cache_bytes: int = DEFAULT_CACHE_BYTES


@dataclass
class Source:
    """A source opened and checked (pass 1)."""

    path: Path
    reader: CheckedGGUFReader
    notes: list[str] = field(default_factory=list)  # how it was read (forms, the I2_S layout)
    layout_assumed: bool = False  # its I2_S tensors are read in the default layout, which the file does not record
    names: set[str] = field(default_factory=set)  # every tensor's name

    def is_candidate(self, t: ReaderTensor) -> bool:
        """A tensor the analysis looks at: a ternary-capable weight not already in BITCOS form."""
        return is_candidate(t.name, t) and t.name + COMPANION_SUFFIX not in self.names


def open_source(
    path: Path, i2s_layout: str | None, error: Callable[[Path, str], Exception] = lambda p, m: ConvertError(f"{p}: {m}")
) -> Source:
    """Pass 1: open ``path`` (``gguf_tools.open_gguf``: types and data extents), check its BITCOS pairs and format
    version, and refuse a source no conversion can run right (``foreign.source_problem``), as ``error``."""
    reader = open_gguf(path, i2s_layout=i2s_layout)
    check_bitcos_file(reader, path)
    problem = foreign.source_problem(reader)
    if problem:
        raise error(path, problem)
    src = Source(path, reader, list(reader.form_notes), names={t.name for t in reader.tensors})
    layout_note = foreign.i2_s_layout_note(reader)
    if layout_note:
        src.notes.append(layout_note)
        src.layout_assumed = i2s_layout is None
    return src


@dataclass
class Planned:
    """A candidate after pass 2: its result, and its encoding while the cache holds it."""

    result: TensorResult
    encoded: codec.Encoded | None = None


def analyse(src: Source, t: ReaderTensor, options: ConvertOptions, cache_left: int) -> Planned:
    """Pass 2 for one candidate: the variant and encoded size (FORMAT.md §7); a tensor that would grow stays
    unless ``force_grow`` or its source type does not load here (``foreign.must_convert``); the encoding is
    made now when it fits ``cache_left``, else in pass 3. The reason of a foreign tensor that stays says what
    its layout holds (``foreign.explain``)."""
    a = analyze_tensor(t, options.scale, options.format_version)
    r = a.result
    planned = Planned(r)
    if r.converted:
        r.out_bytes, r.companion_bytes = encoded_nbytes(a)
        if r.out_bytes > r.src_bytes and not options.force_grow and not foreign.must_convert(t):
            r.converted, r.grow_kept = False, True
            n = max(r.n_weights, 1)
            r.reason = (
                f"BITCOS {r.variant.name} would grow it: {8 * r.src_bytes / n:.4f} -> "
                f"{8 * r.out_bytes / n:.4f} bits per weight at z = {r.zero_density:.3f}"
            )
        elif r.out_bytes <= cache_left:
            planned.encoded = encode_analysis(a)
            if planned.encoded.nbytes != r.out_bytes or planned.encoded.companion.nbytes != r.companion_bytes:
                raise ConvertError(f"{src.path}: tensor '{t.name}': encoded size differs from the computed one")
    del a
    src.reader.release_pages()
    foreign.explain(t, r)
    return planned


def encode(src: Source, t: ReaderTensor, planned: Planned, options: ConvertOptions) -> codec.Encoded:
    """Pass 3 for one converted tensor: its encoding from pass 2's cache (handed over once), or made again."""
    enc, planned.encoded = planned.encoded, None
    if enc is None:
        enc = encode_analysis(analyze_tensor(t, options.scale, options.format_version))
        if enc.companion.nbytes != planned.result.companion_bytes:
            raise ConvertError(f"{src.path}: tensor '{t.name}': re-encoding changed the companion size")
    return enc


__all__ = ["DEFAULT_CACHE_BYTES", "ConvertOptions", "Source", "open_source", "Planned", "analyse", "encode"]
