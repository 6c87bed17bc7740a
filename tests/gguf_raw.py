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
