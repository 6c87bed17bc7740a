"""Reading GGUF files through gguf-py's ``GGUFReader``, with errors that name the file and tensor.

No GGUF parsing happens here: gguf-py parses the header, metadata and tensor infos. This module adds
what a command-line tool needs on top: the BITCOS types registered (``gguf_tools.types``), a check of
every tensor's type id and data extent *before* gguf-py builds its arrays (so an unknown type or a
truncated file is reported as such, naming the tensor, instead of as a bare ``ValueError`` or a reshape
error), and float decoding of the tensor types the converter reads.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.gguf_reader import ReaderField, ReaderTensor

from . import types as _types  # noqa: F401  (registers the BITCOS types)


class GGUFError(Exception):
    """A problem with a GGUF file; ``str()`` is a one-line message naming the file."""

    def __init__(self, path: os.PathLike[str] | str, problem: str, tensor: str | None = None):
        self.path = Path(path)
        self.problem = problem
        self.tensor = tensor
        where = f"{self.path}: tensor '{tensor}': " if tensor else f"{self.path}: "
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
        keys = [k for k, f in self.fields.items()
                if f.types and f.types[0] == GGUFValueType.ARRAY and len(f.data) >= min_items]
        for k in keys:
            del self.fields[k]
        return keys

    def _build_tensors(self, start_offs: int, fields: list[ReaderField]) -> None:  # type: ignore[override]
        _types.register_foreign_types()   # I2_S, Q2_0, PQ2_0, PTQ1_0: convert reads them (ggml_bitcos/foreign.py)
        file_size = int(self.data.shape[0])
        for field in fields:
            _name_len, name_data, _n_dims, dims, raw_dtype, offset_tensor = field.parts
            name = bytes(name_data).decode("utf-8", errors="replace")
            type_id = int(raw_dtype[0])
            if not _types.is_known_type(type_id):
                raise _TensorProblem(name, f"unknown ggml type id {type_id}")
            block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
            n_elems = math.prod(int(d) for d in dims)
            if int(dims[0]) % block_size != 0:
                raise _TensorProblem(name, f"row length {int(dims[0])} is not a multiple of the "
                                           f"{_types.type_name(type_id)} block size {block_size}")
            n_bytes = n_elems // block_size * type_size
            if _types.type_name(type_id) == "I2_S":
                n_bytes += 32                 # the tail holding the tensor's fp32 scale (bitnet.cpp)
            end = int(start_offs) + int(offset_tensor[0]) + n_bytes
            if end > file_size:
                raise _TensorProblem(name, f"file is truncated: tensor data ends at byte {end}, "
                                           f"file has {file_size} bytes")
        super()._build_tensors(start_offs, fields)


class _TensorProblem(Exception):
    def __init__(self, tensor: str, problem: str):
        self.tensor = tensor
        self.problem = problem
        super().__init__(problem)


def open_gguf(path: os.PathLike[str] | str) -> CheckedGGUFReader:
    """Open a GGUF file read-only (memory-mapped); raise ``GGUFError`` with a clear message if it is not one."""
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
        return CheckedGGUFReader(p, "r")
    except _TensorProblem as e:
        raise GGUFError(p, e.problem, e.tensor) from None
    except (ValueError, IndexError, OverflowError, struct.error, UnicodeDecodeError, MemoryError) as e:
        # gguf-py reads past the end of a truncated header as short arrays, which then fail to unpack
        # or decode; anything raised while parsing the header means a truncated or corrupt file.
        raise GGUFError(p, f"truncated or corrupt GGUF header ({type(e).__name__}: {e})") from None


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
