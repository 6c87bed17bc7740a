"""A bounded scan of a GGUF header with gguf.cpp's rules, before anything walks it.

gguf-py's ``GGUFReader`` trusts the header's counts: an array of 2^64 − 1 items, or a tensor count of 2^63,
makes it loop item by item past the end of the file, building an empty view each time, until memory runs out
(issue 30). ``scan`` walks the same bytes first, with every count, length and shape bounded by what is left of
the file before anything is built from it, so a crafted header costs time and memory in proportion to the
file's size at most; only then does the reader hand the header to gguf-py (whose walk is then bounded too).

The rules are gguf.cpp's (``gguf_init_from_reader`` of the patched llama.cpp; ``RULES`` lists each with the
gguf.cpp check it mirrors), so this scan refuses a header exactly when gguf.cpp does; ``RULES`` is the one
list the reader, its tests and docs/FUZZING.md share. The bounds from the file's size refuse early what
gguf.cpp would refuse when a read hits the end of the file: a key needs at least 13 bytes, a tensor info 24,
an array item its size (a string 8 bytes for its length), so a count that cannot fit in the bytes left is
refused before the walk. Where this reader differs:

* none refuses more than gguf.cpp: a key or tensor name that is not UTF-8 is accepted, as gguf.cpp accepts
  it (GGUF's strings should be UTF-8), read with its stray bytes as backslash escapes (``Header.not_utf8``
  lists them; ``convert``, which cannot write them back byte for byte, refuses such a file).

What the scan leaves to the reader (``gguf_tools.reader``): the data section's rules, which need each tensor's
size in its form (offsets in order and padded, each tensor's data inside the file).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from . import types as _types

GGUF_VERSION: Final = 3  # the newest version gguf.cpp reads
GGUF_MAX_STRING_LENGTH: Final = 1 << 30  # gguf.cpp: bytes of one string
GGUF_MAX_ARRAY_ELEMENTS: Final = 1 << 30  # gguf.cpp: items of one array
GGML_MAX_DIMS: Final = 4
GGML_MAX_NAME: Final = 64  # a tensor name has at most GGML_MAX_NAME - 1 bytes
GGUF_DEFAULT_ALIGNMENT: Final = 32
INT64_MAX: Final = (1 << 63) - 1
SIZE_MAX: Final = (1 << 64) - 1
MIN_KV_BYTES: Final = 8 + 1 + 4  # key length, a 1-byte key (empty keys are refused), value type (+ its value)
MIN_TENSOR_INFO_BYTES: Final = 8 + 4 + 4 + 8  # name length, n_dims, type, offset (a 0-byte name, 0 dims)

# GGUF value types: id -> (gguf.cpp's name, bytes of one value; 0: a string or an array)
VALUE_TYPES: Final[dict[int, tuple[str, int]]] = {
    0: ("u8", 1),
    1: ("i8", 1),
    2: ("u16", 2),
    3: ("i16", 2),
    4: ("u32", 4),
    5: ("i32", 4),
    6: ("f32", 4),
    7: ("bool", 1),
    8: ("str", 0),
    9: ("arr", 0),
    10: ("u64", 8),
    11: ("i64", 8),
    12: ("f64", 8),
}
STRING, ARRAY, UINT32 = 8, 9, 4

# rule -> (what it refuses, the gguf.cpp check it mirrors); the one list of the header rules (docs/FUZZING.md §5)
RULES: Final[dict[str, tuple[str, str]]] = {
    "truncated": ("a field runs past the end of the file", "every read: nbytes_remain"),
    "version": ("GGUF version 0, 1, > 3, or of the other byte order", "bad GGUF version / endianness"),
    "count": ("a negative key or tensor count, or one that cannot fit in the file", "number of ... must be in"),
    "string-length": ("a string over 1 GiB or past the end of the file", "string length exceeds"),
    "key-empty": ("an empty key", "key is empty"),
    "key-duplicate": ("a key given twice", "duplicate key"),
    "value-type": ("an unknown value type, or an array of arrays", "has invalid GGUF type"),
    "array-count": ("an array over 2^30 items or larger than what is left of the file", "read(vector)"),
    "alignment": ("general.alignment not a u32 (an array too), 0 or not a power of two", "must be of type u32"),
    "name-length": ("a tensor name of 64 bytes or more", "tensor name is too long"),
    "tensor-duplicate": ("a tensor name given twice", "duplicate tensor name"),
    "n-dims": ("more than 4 dimensions", "invalid number of dimensions"),
    "dim-negative": ("a dimension < 0 (0 is accepted: an empty tensor)", "invalid number of elements"),
    "elements-overflow": ("more than INT64_MAX elements", "may cause overflow errors"),
    "tensor-type": ("a type id ggml does not define (holes, removed types, >= GGML_TYPE_COUNT)", "invalid ggml type"),
    "block": ("a row length that is no multiple of the type's block", "not a multiple of block size"),
    "size-overflow": ("more than SIZE_MAX bytes of data", "has a size in bytes >"),
    "data-start": ("tensor infos whose padded end lies past the end of the file", "failed to seek"),
    # checked by the reader (gguf_tools.reader._extent_problem), which sizes each tensor in its form
    "offset": ("a tensor's data not where the previous one's padded data ends", "has offset ..., expected"),
    "data-bounds": ("a tensor's data past the end of the file", "llama_model_loader: not within the file bounds"),
}


class HeaderProblem(Exception):
    """A header that breaks one of ``RULES``: ``rule``, a one-line ``problem``, and the ``key`` or ``tensor``
    it concerns (None where it is the file's)."""

    def __init__(self, rule: str, problem: str, *, key: str | None = None, tensor: str | None = None):
        assert rule in RULES, rule
        self.rule = rule
        self.problem = problem
        self.key = key
        self.tensor = tensor
        super().__init__(problem)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ne: tuple[int, ...]  # ggml order, ne0 first
    type_id: int
    offset: int  # from the start of the data section


@dataclass(frozen=True)
class Header:
    version: int
    n_tensors: int
    n_kv: int
    alignment: int
    keys: tuple[str, ...]
    tensors: tuple[TensorInfo, ...]
    infos_end: int  # the byte after the last tensor info
    data_start: int  # the data section: infos_end padded to the alignment
    file_size: int
    not_utf8: tuple[str, ...] = ()  # "key 'K'" / "tensor 'T'" of each name that is not UTF-8 (read with escapes)


_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


class _Cursor:
    def __init__(self, buf: memoryview, size: int):
        self.buf = buf
        self.size = size
        self.pos = 0

    @property
    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str, **where: str | None) -> None:
        if n > self.left:
            raise HeaderProblem(
                "truncated",
                f"the file ends inside the GGUF header: {what} needs {n} bytes at offset {self.pos}, "
                f"{self.left} remain",
                **where,
            )

    def unpack(self, s: struct.Struct, what: str, **where: str | None) -> int:
        self.need(s.size, what, **where)
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return int(v)

    def string(self, what: str, **where: str | None) -> bytes:
        n = self.unpack(_U64, f"the length of {what}", **where)
        if n > GGUF_MAX_STRING_LENGTH:
            raise HeaderProblem(
                "string-length",
                f"{what}: length {n} exceeds the 1 GiB limit of a GGUF string (GGUF_MAX_STRING_LENGTH)",
                **where,
            )
        if n > self.left:
            raise HeaderProblem(
                "string-length",
                f"{what}: length {n} runs past the end of the file ({self.left} bytes remain at offset {self.pos})",
                **where,
            )
        b = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return b


def _skip_strings(c: _Cursor, n: int, key: str) -> None:
    """Step over an array of ``n`` strings (a vocabulary: the one loop of the scan that runs per item, bounded
    by ``n`` <= the bytes left / 8)."""
    buf, size, pos, unpack = c.buf, c.size, c.pos, _U64.unpack_from
    for j in range(n):
        if pos + 8 > size:
            c.pos = pos
            c.need(8, f"the length of string {j} of the array", key=key)
        (m,) = unpack(buf, pos)
        pos += 8
        if m > size - pos or m > GGUF_MAX_STRING_LENGTH:
            c.pos = pos - 8
            c.string(f"string {j} of the array", key=key)  # raises, naming the rule
        pos += m
    c.pos = pos


def name_str(raw: bytes) -> str:
    """A key or tensor name as this reader names it: its UTF-8, stray bytes as backslash escapes (gguf.cpp
    takes any bytes)."""
    return raw.decode("utf-8", errors="backslashreplace")


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)}


def printable(name: str, limit: int = 96) -> str:
    """A name for a message: control characters escaped, at most ``limit`` characters."""
    s = name.translate(_CONTROL)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def scan(buf: object, size: int | None = None) -> Header:
    """Walk the GGUF header in ``buf`` (bytes, an mmap or a uint8 array of the whole file; ``size``: its length
    when ``buf`` is longer) with gguf.cpp's rules and the bounds from the file's size; ``HeaderProblem`` on the
    first rule broken. The magic is the caller's to check."""
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf.cast("B")  # type: ignore[arg-type]
    c = _Cursor(mv, len(mv) if size is None else int(size))
    c.pos = 4
    version = c.unpack(_U32, "the GGUF version")
    if version == 0:
        raise HeaderProblem("version", "bad GGUF version 0")
    if version & 0xFFFF == 0:
        raise HeaderProblem(
            "version",
            f"GGUF version {version} ({version:#010x}): a file of the other byte order (big-endian?); "
            f"llama.cpp reads files of this machine's byte order only",
        )
    if version == 1:
        raise HeaderProblem("version", "GGUF version 1 is no longer supported (llama.cpp reads versions 2 and 3)")
    if version > GGUF_VERSION:
        raise HeaderProblem("version", f"GGUF version {version} is newer than the {GGUF_VERSION} llama.cpp reads")
    n_tensors = c.unpack(_I64, "the tensor count")
    n_kv = c.unpack(_I64, "the key count")
    for what, n in (("tensor count", n_tensors), ("key count", n_kv)):
        if n < 0:
            raise HeaderProblem("count", f"{what} {n} is negative (as gguf.cpp reads it, an int64)")
    if n_kv * MIN_KV_BYTES > c.left:
        raise HeaderProblem(
            "count",
            f"key count {n_kv} cannot fit in the file: each key needs at least {MIN_KV_BYTES} bytes, "
            f"{c.left} remain after the header",
        )
    if n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_INFO_BYTES > c.left:
        raise HeaderProblem(
            "count",
            f"tensor count {n_tensors} cannot fit in the file: each tensor info needs at least "
            f"{MIN_TENSOR_INFO_BYTES} bytes, {c.left} remain after the header and {n_kv} keys",
        )

    keys: list[str] = []
    not_utf8: list[str] = []
    seen_keys: set[bytes] = set()
    alignment = GGUF_DEFAULT_ALIGNMENT
    for i in range(n_kv):
        raw_key = c.string(f"key {i}")
        if not raw_key:
            raise HeaderProblem("key-empty", f"key {i} is empty")
        key = name_str(raw_key)
        if "\\x" in key and not _is_utf8(raw_key):
            not_utf8.append(f"key '{printable(key)}'")
        if raw_key in seen_keys:
            raise HeaderProblem("key-duplicate", f"duplicate key (KV pair {i})", key=key)
        seen_keys.add(raw_key)
        keys.append(key)
        vtype = c.unpack(_I32, "its value type", key=key)
        is_array = vtype == ARRAY
        n = 1
        if is_array:
            vtype = c.unpack(_I32, "its array item type", key=key)
            n = c.unpack(_U64, "its array item count", key=key)
        if vtype not in VALUE_TYPES or vtype == ARRAY:
            raise HeaderProblem(
                "value-type",
                "an array of arrays (GGUF has none)" if is_array and vtype == ARRAY else f"invalid GGUF type {vtype}",
                key=key,
            )
        tname, tsize = VALUE_TYPES[vtype]
        if is_array:
            if n > GGUF_MAX_ARRAY_ELEMENTS:
                raise HeaderProblem(
                    "array-count",
                    f"array of {n} {tname} items exceeds the {GGUF_MAX_ARRAY_ELEMENTS}-item limit "
                    f"(GGUF_MAX_ARRAY_ELEMENTS)",
                    key=key,
                )
            each = tsize or 8  # a string needs at least its 8-byte length
            if n * each > c.left:
                raise HeaderProblem(
                    "array-count",
                    f"array of {n} {tname} items needs {'at least ' if not tsize else ''}{n * each} bytes, "
                    f"{c.left} remain in the file",
                    key=key,
                )
        if vtype == STRING and is_array:
            _skip_strings(c, n, key)
        elif vtype == STRING:
            c.string("its string value", key=key)
        else:
            c.need(n * tsize, f"its {n} {tname} value{'s' if n != 1 else ''}", key=key)
            if key == "general.alignment" and vtype == UINT32 and not is_array:
                (alignment,) = _U32.unpack_from(mv, c.pos)
            c.pos += n * tsize
        if key == "general.alignment" and (vtype != UINT32 or is_array):
            raise HeaderProblem("alignment", f"must be of type u32 but is {'arr' if is_array else tname}", key=key)
    if alignment == 0 or alignment & (alignment - 1):
        raise HeaderProblem("alignment", f"alignment {alignment} is not a power of 2", key="general.alignment")

    infos: list[TensorInfo] = []
    seen_names: set[bytes] = set()
    for i in range(n_tensors):
        raw = c.string(f"the name of tensor {i}")
        name = name_str(raw)
        if len(raw) >= GGML_MAX_NAME:
            raise HeaderProblem(
                "name-length",
                f"tensor {i}: name '{printable(name)}' is too long: {len(raw)} bytes, ggml takes at most "
                f"{GGML_MAX_NAME - 1} (GGML_MAX_NAME)",
            )
        if "\\x" in name and not _is_utf8(raw):
            not_utf8.append(f"tensor '{printable(name)}'")
        if raw in seen_names:
            raise HeaderProblem("tensor-duplicate", f"a second tensor of the same name (tensor {i})", tensor=name)
        seen_names.add(raw)
        n_dims = c.unpack(_U32, "its number of dimensions", tensor=name)
        if n_dims > GGML_MAX_DIMS:
            raise HeaderProblem(
                "n-dims",
                f"invalid number of dimensions: {n_dims} > {GGML_MAX_DIMS} (GGML_MAX_DIMS)",
                tensor=name,
            )
        ne: list[int] = []
        for j in range(n_dims):
            d = c.unpack(_I64, f"dimension {j}", tensor=name)
            if d < 0:
                raise HeaderProblem("dim-negative", f"dimension {j} has {d} elements (< 0)", tensor=name)
            ne.append(d)
        n_elem = ne[0] if ne else 1
        for d in ne[1:]:  # gguf.cpp's order: a product past INT64_MAX is refused even if a later dimension is 0
            if d > 1 and INT64_MAX // d < n_elem:
                raise HeaderProblem(
                    "elements-overflow", f"shape {ne} has more than INT64_MAX elements (overflow)", tensor=name
                )
            n_elem *= d
        type_id = c.unpack(_I32, "its type", tensor=name)
        if type_id < 0 or not _types.is_known_type(type_id):
            raise HeaderProblem("tensor-type", f"unknown ggml type id {type_id}", tensor=name)
        block, block_bytes = _types.type_block(type_id)
        ne0 = ne[0] if ne else 1
        if ne0 % block:
            raise HeaderProblem(
                "block",
                f"row length {ne0} is not a multiple of the {_types.type_name(type_id)} block size {block}",
                tensor=name,
            )
        if n_elem // block * block_bytes > SIZE_MAX:
            raise HeaderProblem("size-overflow", f"shape {ne}: more than SIZE_MAX bytes of data", tensor=name)
        offset = c.unpack(_U64, "its data offset", tensor=name)
        infos.append(TensorInfo(name, tuple(ne), type_id, offset))
    infos_end = c.pos
    data_start = (infos_end + alignment - 1) // alignment * alignment
    if n_tensors and data_start > c.size:
        raise HeaderProblem(
            "data-start",
            f"the data section would start at byte {data_start} (the tensor infos end at {infos_end}, padded to "
            f"the alignment {alignment}), past the end of the file ({c.size} bytes)",
        )
    return Header(
        version, n_tensors, n_kv, alignment, tuple(keys), tuple(infos), infos_end, data_start, c.size, tuple(not_utf8)
    )


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


__all__ = [
    "GGML_MAX_DIMS",
    "GGML_MAX_NAME",
    "GGUF_MAX_ARRAY_ELEMENTS",
    "GGUF_MAX_STRING_LENGTH",
    "Header",
    "HeaderProblem",
    "RULES",
    "TensorInfo",
    "name_str",
    "printable",
    "scan",
]
