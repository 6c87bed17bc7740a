"""Pass 1, read + check: open a source (``gguf_tools.open_gguf``: types, forms, data extents), check its BITCOS
pairs and format version, refuse a source no conversion can run right, say how its forms are read, and tell
the candidates (the tensors pass 2 analyses)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from gguf.gguf_reader import ReaderTensor

from gguf_tools import CheckedGGUFReader, open_gguf, tensor_form, tensor_ggml_shape

from ..foreign import I2_S, I2S_DEFAULT_LAYOUT, I2S_LAYOUTS, i2_s_layout_problem
from ..format import BITCOS_TYPE_IDS, COMPANION_SUFFIX, KEY_FORMAT_VERSION, VERSION
from ..rewrite import ConvertError
from ..source import SOURCE_TYPES

HADAMARD_KEY_PREFIX: Final = "prism.hadamard."  # Prism's rotated-basis models: need a runtime transform


@dataclass
class Source:
    """A source opened and checked."""

    path: Path
    reader: CheckedGGUFReader
    notes: list[str] = field(default_factory=list)  # how it was read (forms, the I2_S layout)
    layout_assumed: bool = False  # its I2_S tensors are read in the default layout, which the file does not record
    names: set[str] = field(default_factory=set)  # every tensor's name

    def is_candidate(self, t: ReaderTensor) -> bool:
        """A tensor the analysis looks at: a 2-D/3-D weight of a ternary-capable type, not a lookup table,
        not already in BITCOS form."""
        return (
            len(tensor_ggml_shape(t)) in (2, 3)
            and t.tensor_type in SOURCE_TYPES
            and "token_embd" not in t.name
            and not t.name.endswith(COMPANION_SUFFIX)
            and t.name + COMPANION_SUFFIX not in self.names
        )


def open_source(
    path: Path, i2s_layout: str | None, error: Callable[[Path, str], Exception] = lambda p, m: ConvertError(f"{p}: {m}")
) -> Source:
    """Open ``path``, check its BITCOS pairs and format version, and refuse a source no conversion can run right
    (``source_problem``), as ``error``."""
    reader = open_gguf(path, i2s_layout=i2s_layout)
    check_bitcos_file(reader, path)
    problem = source_problem(reader)
    if problem:
        raise error(path, problem)
    src = Source(path, reader, list(reader.form_notes), names={t.name for t in reader.tensors})
    layout_note = i2_s_layout_note(reader)
    if layout_note:
        src.notes.append(layout_note)
        src.layout_assumed = i2s_layout is None
    return src


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


def check_names_writable(reader: CheckedGGUFReader, path: Path) -> None:
    """``convert`` and ``convert --to`` write every key and tensor name as UTF-8. A name that is not UTF-8 (which
    gguf.cpp and the readers accept, the readers with its stray bytes escaped: ``gguf_tools.header``) cannot be
    copied byte for byte, so they refuse such a file rather than rename anything."""
    bad = reader.header.not_utf8
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ConvertError(
            f"{path}: {bad[0]}{more}: the name is not UTF-8; this tool writes names as UTF-8 and cannot copy it "
            f"byte for byte (info and stats read the file)"
        )


def validate_bitcos_tensors(reader: CheckedGGUFReader, path: Path) -> int:
    """Validate every BITCOS weight and its companion as the llama.cpp loader does (``info.validate_bitcos_tensor``:
    the one check behind ``info`` and ``stats``); ``ConvertError`` naming the tensor and the rule on the first
    one that fails. ``convert`` runs it before it copies them, so it never writes a file the loader refuses
    (issue 30: ``--allow-copy`` copied a broken companion and called the copy verified). Returns how many."""
    from gguf_tools import GGUFError

    from ..info import validate_bitcos_tensor

    by_name = {t.name: t for t in reader.tensors}
    n = 0
    for t in reader.tensors:
        if t.tensor_type in BITCOS_TYPE_IDS:
            try:
                validate_bitcos_tensor(path, t, by_name.get(t.name + COMPANION_SUFFIX))
            except GGUFError as e:
                raise ConvertError(str(e)) from None
            reader.release_pages()
            n += 1
    return n


def source_problem(reader: CheckedGGUFReader) -> str | None:
    """A reason the source cannot be converted to a file this llama.cpp runs correctly, before any work."""
    for key in reader.fields:
        if key.startswith(HADAMARD_KEY_PREFIX):
            return (
                f"metadata key '{key}': the model's weights are stored in Prism's Hadamard-rotated basis, "
                f"which needs the activation transform of Prism's llama.cpp fork; this llama.cpp does not "
                f"apply it, so the converted file (bit-exact weights) would compute a different model"
            )
    for t in reader.tensors:
        if int(t.tensor_type) == I2_S:
            k = int(t.shape[0])
            n_rows = math.prod(int(x) for x in t.shape[1:])
            layout = tensor_form(t) or I2S_DEFAULT_LAYOUT
            why = i2_s_layout_problem(layout, n_rows, k)
            if why:
                fits = [x for x in I2S_LAYOUTS if i2_s_layout_problem(x, n_rows, k) is None]
                hint = (
                    f"--i2s-layout {' or '.join(fits)} reads it if the file holds that layout"
                    if fits
                    else "no layout of bitnet.cpp's quantizer holds it"
                )
                return f"tensor '{t.name}' (I2_S, shape {list(t.shape)}): {why}; {hint}"
    return None


def i2_s_layout_note(reader: CheckedGGUFReader) -> str | None:
    """One line saying which I2_S layout a source with I2_S tensors is read in and whether that is an
    assumption (the file records no layout: FORMAT.md §7.1), or None for a source without I2_S tensors."""
    if not any(int(t.tensor_type) == I2_S for t in reader.tensors):
        return None
    layout = getattr(reader, "i2s_layout", None)
    if layout:
        return f"I2_S tensors read in bitnet.cpp's {layout} layout (--i2s-layout {layout})"
    return (
        f"I2_S tensors read in bitnet.cpp's {I2S_DEFAULT_LAYOUT} layout, an assumption: the file does not "
        f"record its layout; a file quantized by an ARM build of bitnet.cpp, or by an x86 build without "
        f"ACT_PARALLEL, needs --i2s-layout arm or --i2s-layout x86-rows4 (FORMAT.md §7.1)"
    )


def add_i2s_layout_option(p: argparse.ArgumentParser) -> None:
    """``--i2s-layout`` (convert, stats): which of bitnet.cpp's layouts a source's I2_S tensors are in."""
    p.add_argument(
        "--i2s-layout",
        choices=I2S_LAYOUTS,
        default=None,
        help="the layout of the source's I2_S tensors, which the file does not record: x86 (the default: "
        "bitnet.cpp's x86 builds and Python converters), arm (llama-quantize on an ARM build), "
        "x86-rows4 (an x86 build without ACT_PARALLEL); FORMAT.md §7.1",
    )


__all__ = [
    "HADAMARD_KEY_PREFIX",
    "Source",
    "open_source",
    "check_bitcos_file",
    "check_names_writable",
    "validate_bitcos_tensors",
    "source_problem",
    "i2_s_layout_note",
    "add_i2s_layout_option",
]
