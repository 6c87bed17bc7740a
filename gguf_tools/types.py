"""Teach gguf-py (PyPI ``gguf`` 0.19.0) the three BITCOS ggml types, in one place.

gguf-py keeps its type table in two module-level objects that every part of it (reader, writer,
quants) reads at call time:

* ``GGMLQuantizationType`` — an ``IntEnum``; ``GGMLQuantizationType(160)`` raises ``ValueError``, which
  is why ``GGUFReader`` refuses a file holding a BITCOS tensor;
* ``GGML_QUANT_SIZES`` — ``{type: (block_size, type_size)}``, used to size tensor data (reader) and to
  turn a byte shape into a logical shape (writer, ``quant_shape_from_byte_shape``).

Registering a type therefore means adding an enum member (so the id parses and has a ``.name``) and a
size entry. Python's ``Enum`` has no public API to extend a class after creation; we create the member
the same way ``EnumType`` does (``int.__new__`` + ``_name_``/``_value_``) and enter it in the three
lookup tables the enum machinery uses (``_value2member_map_`` for ``Type(160)``, ``_member_map_`` for
``Type['BITCOS_G128']``, ``_member_names_`` for iteration). The function is idempotent and refuses to
run if gguf-py already uses the ids for something else (a future gguf-py release), rather than
silently shadowing a real upstream type.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, Protocol

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

# name -> (type id, block size in weights, bytes per block); docs/FORMAT.md §2: BITCOS_G128 (160), BITCOS_PT (161),
# BITCOS (162, every version-2 variant)
from .type_table import BITCOS_TYPES, FOREIGN_TYPES, TYPE_ID_BITMAP, TYPE_ID_G128, TYPE_ID_PT, foreign_type


def _add_enum_member(enum_cls: type[GGMLQuantizationType], name: str, value: int) -> GGMLQuantizationType:
    member = int.__new__(enum_cls, value)
    member._name_ = name
    member._value_ = value
    member.__objclass__ = enum_cls  # type: ignore[attr-defined]
    member.__init__()  # IntEnum members run __init__ with no args; keeps parity with real members
    enum_cls._value2member_map_[value] = member
    enum_cls._member_map_[name] = member
    enum_cls._member_names_.append(name)
    # class attribute access (GGMLQuantizationType.BITCOS_G128); type.__setattr__ bypasses the
    # EnumType guard against reassigning members
    type.__setattr__(enum_cls, name, member)
    return member


def _register(name: str, type_id: int, block_size: int, type_size: int) -> str | None:
    """Register one type with gguf-py: an enum member and a size entry. Returns None when done (or already
    there, the same), else why not: gguf-py uses the id or the name for something else, or sizes it
    differently. Never shadows what gguf-py defines itself."""
    existing = GGMLQuantizationType._value2member_map_.get(type_id)
    if existing is None:
        if name in GGMLQuantizationType._member_map_:
            return f"gguf-py already defines {name} with a different id"
        existing = _add_enum_member(GGMLQuantizationType, name, type_id)
    elif existing.name != name:
        return f"gguf-py already uses ggml type id {type_id} for {existing.name}; cannot register {name}"
    old = GGML_QUANT_SIZES.get(existing)
    if old is not None and old != (block_size, type_size):
        return f"gguf-py sizes {name} as {old}, expected {(block_size, type_size)}"
    GGML_QUANT_SIZES[existing] = (block_size, type_size)
    return None


def register_bitcos_types() -> None:
    """Make ``GGMLQuantizationType.BITCOS_G128`` / ``BITCOS_PT`` / ``BITCOS`` and their sizes known to gguf-py;
    RuntimeError if gguf-py already uses an id or name differently."""
    for name, (type_id, block_size, type_size) in BITCOS_TYPES.items():
        problem = _register(name, type_id, block_size, type_size)
        if problem:
            raise RuntimeError(problem)


register_bitcos_types()

# gguf-py 0.19 sizes a Q8_1 block as 40 bytes (fp32 d and s, an old layout); ggml's block_q8_1 holds two fp16:
# 36 bytes. The reader sizes tensors as gguf.cpp does (ggml's type traits), so the entry is ggml's.
if GGML_QUANT_SIZES.get(GGMLQuantizationType.Q8_1) == (32, 40):
    GGML_QUANT_SIZES[GGMLQuantizationType.Q8_1] = (32, 36)


def register_foreign_types() -> list[str]:
    """Teach gguf-py the foreign ternary types (``type_table.FOREIGN_TYPES``: I2_S, Q2_0, PQ2_0,
    PTQ1_0), for this project's reader only (``CheckedGGUFReader`` calls it; the gguf-py start-up hook does
    not, so stock tools such as gguf-new-metadata never copy an I2_S tensor without its tail). Each is sized
    by its table entry's blocks (I2_S as its ``n/4`` code bytes: the reader adds the tail). An id or name
    gguf-py already uses differently is left alone. Returns the names registered or already present."""
    return [
        ft.name for ft in FOREIGN_TYPES.values() if _register(ft.name, ft.type_id, ft.block, ft.block_bytes) is None
    ]


def type_block(type_id: int, form: str = "") -> tuple[int, int]:
    """(weights, bytes) of one block of a registered ggml type in ``form`` (``type_table``), tail excluded."""
    ft = foreign_type(type_id, form)
    if ft is not None:
        return ft.block, ft.block_bytes
    return GGML_QUANT_SIZES[GGMLQuantizationType(int(type_id))]


def tensor_nbytes(type_id: int, ne: Sequence[int], form: str = "") -> int:
    """Bytes of a tensor's data in a GGUF file, from its type (in ``form``) and ggml shape (ne0 first): what
    gguf.cpp's ggml_nbytes (and, for the foreign types, their producers') gives; the one size rule the reader,
    the writer and the converter share. ValueError when the row length is no multiple of the block."""
    block, block_bytes = type_block(type_id, form)
    ne0 = int(ne[0]) if len(ne) else 1  # a tensor of 0 dimensions holds one element (gguf.cpp: ne all 1)
    if ne0 % block:
        raise ValueError(f"row length {ne0} is not a multiple of the {type_name(type_id)} block size {block}")
    n = math.prod(int(d) for d in ne)
    ft = foreign_type(type_id, form)
    return ft.nbytes(n) if ft is not None else n // block * block_bytes


BITCOS_G128: Final = GGMLQuantizationType(TYPE_ID_G128)
BITCOS_PT: Final = GGMLQuantizationType(TYPE_ID_PT)
BITCOS: Final = GGMLQuantizationType(TYPE_ID_BITMAP)


class _StoredAsType(Protocol):
    type_id: int


def bitcos_type(variant: _StoredAsType) -> GGMLQuantizationType:
    """The registered ggml type that stores ``variant`` (a ``ggml_bitcos.format.Variant``: its ``type_id``)."""
    return GGMLQuantizationType(variant.type_id)


def is_known_type(type_id: int) -> bool:
    """True when gguf-py (after registration) can size a tensor of this ggml type id."""
    member = GGMLQuantizationType._value2member_map_.get(int(type_id))
    return member is not None and member in GGML_QUANT_SIZES


def type_name(type_id: int) -> str:
    """gguf-py's name of a ggml type id (after registration), or ``type N`` for an unknown id."""
    member = GGMLQuantizationType._value2member_map_.get(int(type_id))
    return member.name if member is not None else f"type {int(type_id)}"
