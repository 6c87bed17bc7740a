"""The ggml type ids and block sizes this project adds to gguf-py's table: the BITCOS types (docs/FORMAT.md
§2) and the foreign ternary types of other llama.cpp lines (FORMAT.md §7.1), with the forms a foreign type id
is read in. The facts the GGUF layer needs to size and name a tensor live here, below ``ggml_bitcos``, which
builds on them (``ggml_bitcos.format`` for the BITCOS variants, ``ggml_bitcos.foreign`` for the codecs).

| type | id | block | bytes | scale | this project's llama.cpp loads it |
|---|---|---|---|---|---|
| ``I2_S`` (bitnet.cpp) | 36 | 128 / 64 / 4 rows | n/4 + a 32-byte tensor tail | one fp32 per tensor, in the tail | no |
| ``Q2_0`` (upstream ggml, from Prism ML) | 42 | 64 | 18 | fp16 per 64 | yes |
| ``Q2_0``, Prism's legacy group-128 form | 42 | 128 | 34 (PQ2_0's bytes) | fp16 per 128 | no (misread as group 64) |
| ``PQ2_0`` (Prism ML fork) | 142 | 128 | 34 | fp16 per 128 | no |
| ``PTQ1_0`` (Prism ML fork) | 143 | 128 | 28 | fp16 per 128 | no |

A *form* is what a type id means in a given file where producers disagree: I2_S has three layouts of the same
bytes (``I2S_LAYOUTS``; the file does not record which, so the reader is told, x86 by default), and id 42 is
either upstream's group-64 Q2_0 or Prism's older group-128 one (told apart by the tensors' data extents:
``gguf_tools.reader``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# --- BITCOS (FORMAT.md §2) ------------------------------------------------------------------------------
TYPE_ID_G128: Final = 160  # version 1: bitmap + fp16 d per 128 weights
TYPE_ID_PT: Final = 161  # version 1: bitmap; fp32 scale per matrix in the companion
TYPE_ID_BITMAP: Final = 162  # every version-2 variant (ggml GGML_TYPE_BITCOS, type name "bitcos")

# name -> (type id, weights per ggml block, bytes per ggml block): a v1 block is 128 weights (a 16-byte bitmap,
# G128 with its fp16 scale), a v2 block 32 weights (a 4-byte bitmap)
BITCOS_TYPES: Final[dict[str, tuple[int, int, int]]] = {
    "BITCOS_G128": (TYPE_ID_G128, 128, 18),
    "BITCOS_PT": (TYPE_ID_PT, 128, 16),
    "BITCOS": (TYPE_ID_BITMAP, 32, 4),
}

# --- foreign ternary types (FORMAT.md §7.1) ------------------------------------------------------------
I2_S: Final = 36
Q2_0: Final = 42
PQ2_0: Final = 142
PTQ1_0: Final = 143

I2_S_TAIL: Final = 32  # bytes after the packed codes: the fp32 scale, then 28 bytes the quantizer leaves unwritten

# bitnet.cpp's quantize_i2_s writes one of three layouts, chosen by its build (FORMAT.md §7.1):
#   x86       - x86 with ACT_PARALLEL (its default config) and its Python converters: blocks of 128 weights of
#               the flattened tensor in 32 bytes, weight 32g + p in bits 7-2g..6-2g of byte p;
#   arm       - ARM builds: blocks of 64 weights in 16 bytes, weight 16g + p in bits 7-2g..6-2g of byte p;
#   x86-rows4 - x86 without ACT_PARALLEL: rows 4r..4r+3 interleaved, byte (r, col) holds row 4r + i in bits
#               7-2i..6-2i.
I2S_LAYOUTS: Final = ("x86", "x86-rows4", "arm")
I2S_DEFAULT_LAYOUT: Final = "x86"
Q2_0_LEGACY_FORM: Final = "g128"  # SourceTensor.form of a Q2_0 tensor in Prism's legacy group-128 form


@dataclass(frozen=True)
class ForeignType:
    name: str
    type_id: int
    block: int  # weights per sizing unit: the tensor's bytes are n / block * block_bytes + tail_bytes
    block_bytes: int
    tail_bytes: int  # bytes after the blocks (I2_S: the fp32 scale's 32-byte tail)
    loadable: bool  # this project's llama.cpp (upstream 0c1e570 + patches) loads tensors of this form
    scale: str  # the scale granularity, in words

    def nbytes(self, n_weights: int) -> int:
        """Bytes of a tensor of ``n_weights`` weights in a GGUF file (its producer's ggml_nbytes)."""
        return n_weights // self.block * self.block_bytes + self.tail_bytes


FOREIGN_TYPES: Final[dict[int, ForeignType]] = {
    ft.type_id: ft
    for ft in (
        # I2_S's ggml traits size 1 weight per byte, and its ggml_nbytes quarters that and adds the tail
        ForeignType("I2_S", I2_S, 4, 1, I2_S_TAIL, False, "one fp32 per tensor"),
        ForeignType("Q2_0", Q2_0, 64, 18, 0, True, "fp16 per 64 weights"),
        ForeignType("PQ2_0", PQ2_0, 128, 34, 0, False, "fp16 per 128 weights"),
        ForeignType("PTQ1_0", PTQ1_0, 128, 28, 0, False, "fp16 per 128 weights"),
    )
}
Q2_0_LEGACY: Final = ForeignType("Q2_0", Q2_0, 128, 34, 0, False, "fp16 per 128 weights")


def foreign_type(type_id: int, form: str = "") -> ForeignType | None:
    """The table entry of a foreign type id in ``form`` (None for a type that is not foreign)."""
    if int(type_id) == Q2_0 and form == Q2_0_LEGACY_FORM:
        return Q2_0_LEGACY
    return FOREIGN_TYPES.get(int(type_id))


def form_label(type_id: int, form: str) -> str:
    """A type and its form in words, e.g. ``Q2_0 (Prism's legacy group-128 form)``, ``I2_S (x86 layout)``."""
    name = FOREIGN_TYPES[int(type_id)].name if int(type_id) in FOREIGN_TYPES else f"type {int(type_id)}"
    if int(type_id) == Q2_0 and form == Q2_0_LEGACY_FORM:
        return "Q2_0 (Prism's legacy group-128 form)"
    if int(type_id) == I2_S and form:
        return f"I2_S ({form} layout)"
    return name


__all__ = [
    "TYPE_ID_G128",
    "TYPE_ID_PT",
    "TYPE_ID_BITMAP",
    "BITCOS_TYPES",
    "I2_S",
    "Q2_0",
    "PQ2_0",
    "PTQ1_0",
    "I2_S_TAIL",
    "I2S_LAYOUTS",
    "I2S_DEFAULT_LAYOUT",
    "Q2_0_LEGACY_FORM",
    "ForeignType",
    "FOREIGN_TYPES",
    "Q2_0_LEGACY",
    "foreign_type",
    "form_label",
]
