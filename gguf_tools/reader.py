"""Reading GGUF files through gguf-py's ``GGUFReader``, with errors that name the file and tensor.

Before gguf-py walks anything, ``gguf_tools.header.scan`` walks the header with gguf.cpp's rules and bounds
taken from the file's size (every count, string length and shape; issue 30: gguf-py alone loops forever on
an array of 2^64 − 1 items). gguf-py then parses the metadata and tensor infos. This module adds what a
command-line tool needs on top: the BITCOS and foreign types registered (``gguf_tools.types``), and before
any tensor is trusted the data-section checks of gguf.cpp and llama.cpp's loader (docs/USAGE.md §1, FORMAT.md
§7.1): each tensor's data where its type and shape put it — offsets aligned, each tensor's data starting
exactly where the previous one's (padded) ends, in the order of the tensor infos — and inside the file.
Bytes after the last tensor's data are accepted, as llama.cpp accepts them, with a note
(``CheckedGGUFReader.form_notes``); they are not copied by a rewrite. gguf-py itself only checks that its views
fit in the file, so a tensor whose bytes run into the next one's would otherwise be read as garbage.

Where a type id means different layouts to different producers, the reader decides the *form* of each
tensor (``SourceTensor.form``, ``gguf_tools.type_table``): Q2_0 (id 42) is upstream's group-64 type unless
only Prism's legacy group-128 sizes fit the file's data extents; I2_S is read in the layout the caller
names (``i2s_layout``), x86 by default, since the file records none.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.constants import GGMLQuantizationType, GGUFEndian
from gguf.gguf_reader import ReaderField, ReaderTensor

from . import header as _header
from . import type_table
from . import types as _types  # (importing it registers the BITCOS types)


class GGUFError(Exception):
    """A problem with a GGUF file; ``str()`` is a one-line message naming the file (and the tensor or
    metadata key)."""

    def __init__(
        self,
        path: os.PathLike[str] | str,
        problem: str,
        tensor: str | None = None,
        *,
        key: str | None = None,
        rule: str | None = None,
    ):
        self.path = Path(path)
        self.problem = problem
        self.tensor = tensor
        self.key = key
        self.rule = rule  # the rule of ``header.RULES`` a header or data-section refusal broke (else None)
        if tensor:
            where = f"{self.path}: tensor '{_header.printable(tensor)}': "
        else:
            where = f"{self.path}: key '{_header.printable(key)}': " if key else f"{self.path}: "
        super().__init__(where + problem)


class CheckedGGUFReader(GGUFReader):
    """``GGUFReader`` that validates tensor types and extents before building tensor views.

    Speed: gguf-py parses metadata with one small slice of ``self.data`` per value; slicing an
    ``np.memmap`` runs ``memmap.__array_finalize__`` each time, which made parsing a 32 k-token vocab
    take ~1 s and a 128 k one ~9 s. ``data`` is therefore exposed as a plain ``ndarray`` view of the
    same map (same bytes, no copy; the view keeps the map alive) — gguf-py's parsing code is unchanged.
    """

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        return self._plain_data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._mmap = value
        self._plain_data = value.view(np.ndarray)

    def release_pages(self) -> None:
        """Drop this process's mapping of the file's pages (``madvise(MADV_DONTNEED)``; the data stays in
        the page cache and is read again on the next access, views stay valid). Streaming tools call it
        after each tensor, so the file's pages they have touched do not add up in their resident memory
        (every touched page of a mapping counts in RSS until it is unmapped)."""
        mm = getattr(self._mmap, "_mmap", None)
        if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            try:
                mm.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):
                pass

    def drop_array_fields(self, min_items: int = 64) -> list[str]:
        """Forget the parsed array fields of at least ``min_items`` items (tokenizer vocabularies, merges,
        scores); returns their keys. gguf-py keeps two numpy views per string item (~0.7 KB each: ~0.3 GB
        for a 128k-token BPE vocabulary with its merges); a streaming tool that has taken what it needs
        (``field_value``) drops them, so they do not add to its peak memory."""
        keys = [
            k
            for k, f in self.fields.items()
            if f.types and f.types[0] == GGUFValueType.ARRAY and len(f.data) >= min_items
        ]
        for k in keys:
            del self.fields[k]
        return keys

    def __init__(self, path: os.PathLike[str] | str, mode: Any = "r", *, i2s_layout: str | None = None):
        """gguf-py's ``GGUFReader.__init__``, after ``header.scan`` (``HeaderProblem`` on a rule broken): the
        counts gguf-py walks are then bounded, and the alignment and data start are gguf.cpp's."""
        self.i2s_layout = i2s_layout  # None: the default layout, assumed (the converter and stats say so)
        self.form_notes: list[str] = []  # file-level lines on how the file was read (stats, info, convert)
        _types.register_foreign_types()  # I2_S, Q2_0, PQ2_0, PTQ1_0 (type_table): convert reads them
        self.data = np.memmap(path, mode=mode)
        self.header = _header.scan(self._plain_data)
        self.byte_order = "I"  # the scan refuses the other byte order, as gguf.cpp does
        self.endianess = GGUFEndian.LITTLE if sys.byteorder == "little" else GGUFEndian.BIG
        self.fields = OrderedDict()
        self.tensors = []
        offs = 4
        version = self._get(offs, np.uint32)
        offs += self._push_field(ReaderField(offs, "GGUF.version", [version], [0], [GGUFValueType.UINT32]))
        counts = self._get(offs, np.uint64, 2)
        offs += self._push_field(ReaderField(offs, "GGUF.tensor_count", [counts[:1]], [0], [GGUFValueType.UINT64]))
        offs += self._push_field(ReaderField(offs, "GGUF.kv_count", [counts[1:]], [0], [GGUFValueType.UINT64]))
        offs = self._build_fields(offs, self.header.n_kv)
        offs, tensor_fields = self._build_tensor_info(offs, self.header.n_tensors)
        if offs != self.header.infos_end:  # both walk the same rules; a difference is a bug here
            raise _header.HeaderProblem(
                "truncated", f"header parsed to byte {offs}, scanned to {self.header.infos_end}"
            )
        self.alignment = self.header.alignment
        self.data_offset = self.header.data_start
        self._build_tensors(self.data_offset, tensor_fields)

    def _build_fields(self, offs: int, count: int) -> int:
        """gguf-py's, each key named as ``header.scan`` names it (``header.name_str``: a key that is not UTF-8,
        which gguf.cpp accepts, keeps its stray bytes as escapes instead of failing the file)."""
        for _ in range(count):
            orig_offs = offs
            kv_klen, kv_kdata = self._get_str(offs)
            offs += int(kv_klen.nbytes + kv_kdata.nbytes)
            raw_kv_type = self._get(offs, np.uint32)
            offs += int(raw_kv_type.nbytes)
            parts: list[np.ndarray] = [kv_klen, kv_kdata, raw_kv_type]
            idxs_offs = len(parts)
            field_size, field_parts, field_idxs, field_types = self._get_field_parts(offs, raw_kv_type[0])
            parts += field_parts
            name = _header.name_str(bytes(kv_kdata))
            field = ReaderField(orig_offs, name, parts, [idx + idxs_offs for idx in field_idxs], field_types)
            self._push_field(field, skip_sum=True)
            offs += field_size
        return offs

    def _get_tensor_info_field(self, orig_offs: int) -> ReaderField:
        """gguf-py's, the name as ``header.scan`` names it (``header.name_str``)."""
        offs = orig_offs
        name_len, name_data = self._get_str(offs)
        offs += int(name_len.nbytes + name_data.nbytes)
        n_dims = self._get(offs, np.uint32)
        offs += int(n_dims.nbytes)
        dims = self._get(offs, np.uint64, n_dims[0])
        offs += int(dims.nbytes)
        raw_dtype = self._get(offs, np.uint32)
        offs += int(raw_dtype.nbytes)
        offset_tensor = self._get(offs, np.uint64)
        name = _header.name_str(bytes(name_data))
        return ReaderField(orig_offs, name, [name_len, name_data, n_dims, dims, raw_dtype, offset_tensor], [1, 3, 4, 5])

    def _build_tensors(self, start_offs: int, fields: list[ReaderField]) -> None:  # type: ignore[override]
        infos = [
            _Info(t.name, t.type_id, t.ne, t.offset, field)
            for t, field in zip(self.header.tensors, fields, strict=True)
        ]
        size, align = int(self.data.shape[0]), int(self.alignment)
        layout = self.i2s_layout or type_table.I2S_DEFAULT_LAYOUT
        forms = {i.name: layout for i in infos if i.type_id == type_table.I2_S}
        problem, trailing = _extent_problem(infos, forms, int(start_offs), size, align)
        if problem is not None or trailing:
            # id 42: upstream's group-64 Q2_0, or Prism's legacy group-128 form when only its sizes fit the
            # data offsets (or fit them exactly, where upstream's leave bytes after the last tensor)
            legacy = {i.name: type_table.Q2_0_LEGACY_FORM for i in infos if i.type_id == type_table.Q2_0}
            if legacy and all(i.ne[0] % type_table.Q2_0_LEGACY.block == 0 for i in infos if i.name in legacy):
                p2, t2 = _extent_problem(infos, forms | legacy, int(start_offs), size, align)
                if p2 is None and (problem is not None or not t2):
                    forms |= legacy
                    problem, trailing = None, t2
                    self.form_notes.append(
                        f"Q2_0 tensors ({len(legacy)}) are Prism's legacy group-128 form (34 bytes per 128 "
                        f"weights, PQ2_0's layout), not upstream's group-64 Q2_0: only those sizes fit the "
                        f"file's data offsets"
                    )
        if problem is not None:
            raise _TensorProblem(*problem)
        if trailing:
            self.form_notes.append(trailing)
        self.tensors = [self._tensor_view(i, int(start_offs), forms.get(i.name, "")) for i in infos]

    def _tensor_view(self, info: _Info, start_offs: int, form: str) -> SourceTensor:
        """A tensor as gguf-py builds it (same dtypes and shapes), sized by its form."""
        n_elems = math.prod(info.ne)
        np_dims = tuple(reversed(info.ne))
        ggml_type = GGMLQuantizationType(info.type_id)
        offs = start_offs + info.offset
        if ggml_type in _PLAIN_ITEM_TYPES:
            item_type, n_bytes = _PLAIN_ITEM_TYPES[ggml_type], n_elems * np.dtype(_PLAIN_ITEM_TYPES[ggml_type]).itemsize
            data, dims = self._get(offs, item_type, n_elems), np_dims
        else:
            block, block_bytes = _types.type_block(info.type_id, form)  # I2_S: its code bytes, tail excluded
            n_bytes = n_elems // block * block_bytes
            dims = (*np_dims[:-1], np_dims[-1] // block * block_bytes) if np_dims else ()
            data = self._get(offs, np.uint8, n_bytes)
        if n_elems or all(d < 1 << 31 for d in dims):
            data = data.reshape(dims)  # (an empty tensor with a huge dimension stays flat: numpy cannot shape it)
        t = SourceTensor(
            name=info.name,
            tensor_type=ggml_type,
            shape=info.field.parts[3],
            n_elements=n_elems,
            n_bytes=n_bytes,
            data_offset=offs,
            data=data,
            field=info.field,
        )
        t.form = form
        return t


class SourceTensor(ReaderTensor):
    """gguf-py's ``ReaderTensor`` and the form it was read in (``form``: "" where the type has one form;
    ``type_table`` for the others)."""

    form: str


@dataclass(frozen=True)
class _Info:
    name: str
    type_id: int
    ne: tuple[int, ...]
    offset: int  # from the start of the data section
    field: ReaderField


_PLAIN_ITEM_TYPES: dict[GGMLQuantizationType, Any] = {
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


def _extent_problem(
    infos: list[_Info], forms: dict[str, str], data_start: int, file_size: int, alignment: int
) -> tuple[tuple[str, str, str] | None, str]:
    """(the first (tensor, problem, rule of ``header.RULES``) breaking the data section's rules, or None; a note on bytes after the last
    tensor's data and padding, or ""), each tensor sized by its type in ``forms``. The rules are gguf.cpp's
    (offsets aligned, each tensor's data starting where the previous one's ends padded to the alignment, so in
    order and never overlapping) and llama.cpp's loader's (each tensor's data inside the file). Bytes after the
    last tensor are no error to either (a last tensor larger than its type and shape say looks the same)."""
    problem = _extent_rule_problem(infos, forms, data_start, file_size, alignment)
    if problem is not None or not infos:
        return problem, ""
    last = infos[-1]
    end = last.offset + _types.tensor_nbytes(last.type_id, last.ne, forms.get(last.name, ""))
    extra = file_size - data_start - (end + alignment - 1) // alignment * alignment
    if extra <= 0:
        return None, ""
    return None, (
        f"{extra} bytes follow the last tensor's data ('{last.name}') and its padding: ignored, as llama.cpp "
        f"ignores them (a rewrite does not copy them)"
    )


def _extent_rule_problem(
    infos: list[_Info], forms: dict[str, str], data_start: int, file_size: int, alignment: int
) -> tuple[str, str, str] | None:
    expected, prev, prev_end, what = 0, "", 0, ""
    for info in infos:
        form = forms.get(info.name, "")
        try:
            nbytes = _types.tensor_nbytes(info.type_id, info.ne, form)
        except ValueError as e:
            return info.name, str(e), "block"
        if info.offset % alignment:
            return (
                info.name,
                f"data offset {info.offset} is not a multiple of the file's alignment {alignment}",
                "offset",
            )
        if info.offset != expected:
            if not prev:
                return (
                    info.name,
                    (f"data offset {info.offset}: the first tensor's data must start the data section (offset 0)"),
                    "offset",
                )
            if info.offset < expected:
                return (
                    info.name,
                    (
                        f"data offset {info.offset} overlaps tensor '{prev}' ({what}), whose data "
                        f"runs to offset {prev_end} (padded: {expected})"
                    ),
                    "offset",
                )
            return (
                info.name,
                (
                    f"data offset {info.offset} is {info.offset - expected} bytes past offset "
                    f"{expected}, where tensor '{prev}' ({what}) ends: that tensor holds more bytes "
                    f"than its type and shape say"
                ),
                "offset",
            )
        what = f"{_type_label(info.type_id, form)} {list(info.ne)}: {nbytes} bytes"
        end = data_start + info.offset + nbytes
        if end > file_size:
            return (
                info.name,
                f"file is truncated: tensor data ({what}) ends at byte {end}, file has {file_size} bytes",
                "data-bounds",
            )
        prev, prev_end = info.name, info.offset + nbytes
        expected = info.offset + (nbytes + alignment - 1) // alignment * alignment
    return None


def _type_label(type_id: int, form: str) -> str:
    return type_table.form_label(type_id, form) if type_table.foreign_type(type_id) else _types.type_name(type_id)


class _TensorProblem(Exception):
    def __init__(self, tensor: str, problem: str, rule: str):
        self.tensor = tensor
        self.problem = problem
        self.rule = rule
        super().__init__(problem)


def open_gguf(path: os.PathLike[str] | str, *, i2s_layout: str | None = None) -> CheckedGGUFReader:
    """Open a GGUF file read-only (memory-mapped); raise ``GGUFError`` with a clear message if it is not one
    or a tensor's data is not where its type and shape put it. ``i2s_layout``: the layout its I2_S tensors are
    read in (``type_table.I2S_LAYOUTS``; None: the default, assumed)."""
    p = Path(path)
    if not p.exists():
        raise GGUFError(p, "no such file")
    if not p.is_file():
        raise GGUFError(p, "not a regular file")
    size = p.stat().st_size
    if size < 24:  # magic, version, tensor count, kv count
        raise GGUFError(p, f"not a GGUF file (only {size} bytes)")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GGUFError(p, f"not a GGUF file (magic {magic!r}, expected b'GGUF')")
    try:
        return CheckedGGUFReader(p, "r", i2s_layout=i2s_layout)
    except _header.HeaderProblem as e:
        raise GGUFError(p, e.problem, e.tensor, key=e.key, rule=e.rule) from None
    except _TensorProblem as e:
        raise GGUFError(p, e.problem, e.tensor, rule=e.rule) from None
    except (ValueError, IndexError, KeyError, OverflowError, struct.error, UnicodeDecodeError, MemoryError) as e:
        # not expected after header.scan (it refuses what gguf-py would trip on); kept so that a corrupt header
        # can never become a traceback
        raise GGUFError(p, f"corrupt GGUF header: {e}") from None


def field_value(field: ReaderField) -> tuple[Any, GGUFValueType, GGUFValueType | None]:
    """(python value, value type, array item type) of a metadata field, as GGUFWriter takes them."""
    if not field.types:
        raise ValueError(f"metadata key {field.name} has no type")
    main = field.types[0]
    if main == GGUFValueType.ARRAY:
        if len(field.types) != 2:
            raise ValueError(f"metadata key {field.name}: nested arrays are not supported")
        sub = field.types[1]
        if sub == GGUFValueType.STRING:
            # keep raw bytes: exact round trip even for tokens that are not valid UTF-8
            return [bytes(field.parts[i]) for i in field.data], main, sub
        return field.contents(), main, sub
    if main == GGUFValueType.STRING:
        return bytes(field.parts[-1]), main, None
    return field.contents(), main, None


def tensor_form(t: ReaderTensor) -> str:
    """The form the reader assigned to a tensor (``SourceTensor.form``; "" for a plain gguf-py tensor)."""
    return getattr(t, "form", "")


def tensor_ggml_shape(t: ReaderTensor) -> tuple[int, ...]:
    """ggml order (ne0 = row length first)."""
    return tuple(int(x) for x in t.shape)


def tensor_rows_cols(t: ReaderTensor) -> tuple[int, int]:
    """(rows, row length) of a tensor seen as a 2-D matrix of rows (ne1*ne2*ne3, ne0)."""
    ne = tensor_ggml_shape(t)
    k = ne[0]
    rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
    return rows, k


def tensor_bytes(t: ReaderTensor) -> np.ndarray:
    """The tensor's raw data as a flat uint8 view into the memory map (no copy)."""
    raw = t.data
    return raw.reshape(-1).view(np.uint8)


def tensor_row_bytes(t: ReaderTensor) -> np.ndarray:
    """Raw data as (rows, bytes per row) uint8, a view."""
    rows, _k = tensor_rows_cols(t)
    return tensor_bytes(t).reshape(rows, -1)
