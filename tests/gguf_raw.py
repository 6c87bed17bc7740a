"""An independent GGUF v3 header parser for the tests (not gguf-py, not gguf_tools): tensor names, type ids,
shapes and absolute data offsets straight from the file's bytes. Not a test module itself."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value types


@dataclass
class RawTensor:
    name: str
    type_id: int
    ne: tuple[int, ...]
    offset: int  # absolute file offset of the tensor's data


def read_tensor_table(path: Path) -> dict[str, RawTensor]:
    b = Path(path).read_bytes()
    assert b[:4] == b"GGUF"
    _ver, n_t, n_kv = struct.unpack_from("<IQQ", b, 4)
    off = 24
    alignment = 32

    def skip_value(vt: int, off: int) -> int:
        if vt == 8:
            (n,) = struct.unpack_from("<Q", b, off)
            return off + 8 + n
        if vt == 9:
            it, n = struct.unpack_from("<IQ", b, off)
            off += 12
            if it in _SCALAR_SIZES:
                return off + n * _SCALAR_SIZES[it]
            for _ in range(n):
                off = skip_value(it, off)
            return off
        return off + _SCALAR_SIZES[vt]

    for _ in range(n_kv):
        (kl,) = struct.unpack_from("<Q", b, off)
        key = b[off + 8 : off + 8 + kl].decode()
        off += 8 + kl
        (vt,) = struct.unpack_from("<I", b, off)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", b, off + 4)
        off = skip_value(vt, off + 4)
    rel = {}
    for _ in range(n_t):
        (nl,) = struct.unpack_from("<Q", b, off)
        name = b[off + 8 : off + 8 + nl].decode()
        off += 8 + nl
        (nd,) = struct.unpack_from("<I", b, off)
        ne = struct.unpack_from(f"<{nd}Q", b, off + 4)
        off += 4 + 8 * nd
        tt, o = struct.unpack_from("<IQ", b, off)
        off += 12
        rel[name] = (tt, tuple(ne), o)
    data_start = (off + alignment - 1) // alignment * alignment
    return {n: RawTensor(n, tt, ne, data_start + o) for n, (tt, ne, o) in rel.items()}


# --- byte-level layout and writing, for crafted headers (tests/test_crafted_headers.py) -------------------------


@dataclass
class RawKV:
    key: str
    at: int  # offset of the key's length field
    type_at: int  # offset of the value type
    value_at: int  # offset of the value (an array: of its item type; its count follows at value_at + 4)
    end: int
    vtype: int
    item_type: int | None = None  # arrays
    count: int | None = None  # arrays


@dataclass
class RawInfo:
    name: str
    at: int  # offset of the name's length field
    n_dims_at: int
    type_at: int  # the ggml type id (after the dimensions)
    offset_at: int  # the data offset
    end: int
    ne: tuple[int, ...]


@dataclass
class RawLayout:
    """Where each field of a (valid) GGUF header lies: mutations patch these offsets."""

    kvs: list[RawKV]
    infos: list[RawInfo]
    infos_end: int
    data_start: int
    alignment: int

    def kv(self, key: str) -> RawKV:
        return next(k for k in self.kvs if k.key == key)

    def info(self, name: str) -> RawInfo:
        return next(t for t in self.infos if t.name == name)


def layout(b: bytes) -> RawLayout:
    """The field offsets of a valid GGUF v3 header in ``b``."""
    _ver, n_t, n_kv = struct.unpack_from("<IQQ", b, 4)
    off, alignment = 24, 32
    kvs: list[RawKV] = []
    for _ in range(n_kv):
        at = off
        (kl,) = struct.unpack_from("<Q", b, off)
        key = b[off + 8 : off + 8 + kl].decode()
        type_at = off + 8 + kl
        (vt,) = struct.unpack_from("<I", b, type_at)
        value_at = type_at + 4
        item_type = count = None
        if vt == 9:
            item_type, count = struct.unpack_from("<IQ", b, value_at)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", b, value_at)
        end = _skip(b, vt, value_at)
        kvs.append(RawKV(key, at, type_at, value_at, end, vt, item_type, count))
        off = end
    infos: list[RawInfo] = []
    for _ in range(n_t):
        at = off
        (nl,) = struct.unpack_from("<Q", b, off)
        name = b[off + 8 : off + 8 + nl].decode()
        n_dims_at = off + 8 + nl
        (nd,) = struct.unpack_from("<I", b, n_dims_at)
        ne = struct.unpack_from(f"<{nd}Q", b, n_dims_at + 4)
        type_at = n_dims_at + 4 + 8 * nd
        infos.append(RawInfo(name, at, n_dims_at, type_at, type_at + 4, type_at + 12, tuple(ne)))
        off = type_at + 12
    return RawLayout(kvs, infos, off, (off + alignment - 1) // alignment * alignment, alignment)


def _skip(b: bytes, vt: int, off: int) -> int:
    if vt == 8:
        (n,) = struct.unpack_from("<Q", b, off)
        return off + 8 + n
    if vt == 9:
        it, n = struct.unpack_from("<IQ", b, off)
        off += 12
        if it in _SCALAR_SIZES:
            return off + n * _SCALAR_SIZES[it]
        for _ in range(n):
            off = _skip(b, it, off)
        return off
    return off + _SCALAR_SIZES[vt]


def patch(b: bytes, at: int, fmt: str, *values: int) -> bytes:
    """``b`` with ``struct.pack(fmt, *values)`` written at ``at`` (past the end: the file grows)."""
    raw = struct.pack(fmt, *values)
    out = bytearray(b)
    if at + len(raw) > len(out):
        out.extend(bytes(at + len(raw) - len(out)))
    out[at : at + len(raw)] = raw
    return bytes(out)


def gguf_string(s: bytes | str) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def raw_kv(key: bytes | str, vtype: int, value: bytes) -> bytes:
    """One KV pair: the key, the value type, and ``value`` as already packed bytes."""
    return gguf_string(key) + struct.pack("<I", vtype) + value


def raw_gguf(
    kvs: list[bytes],
    infos: list[tuple[bytes | str, tuple[int, ...], int, int]],
    data: bytes,
    *,
    alignment: int = 32,
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
) -> bytes:
    """A GGUF file from packed KV pairs (``raw_kv``), tensor infos (name, ne, type id, data offset) and the data
    section's bytes, the data section starting at the next multiple of ``alignment``; the counts default to
    the lists' lengths. Nothing is checked: this writes what it is given."""
    head = b"GGUF" + struct.pack(
        "<IQQ", version, len(infos) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv
    )
    head += b"".join(kvs)
    for name, ne, tt, off in infos:
        head += gguf_string(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, tt, off)
    head += bytes((-len(head)) % alignment)
    return head + data
