"""The BITCOS format's constants (versions 1 and 2) (docs/FORMAT.md), the one Python home of every number the spec fixes.

Every other module (codec, converter, stats, kernel harness, the tests) imports these names instead of
repeating the numbers; the ggml type ids and block sizes come from the GGUF layer below
(``gguf_tools.type_table``), which registers the types with gguf-py. The C mirror is ``csrc/bitcos-format.h``;
``tests/test_format.py`` parses that header and checks that both agree.

Facts that belong to upstream ggml (the TQ1_0/TQ2_0 block sizes, ``GGML_MAX_NAME``) are taken from gguf-py
(PyPI ``gguf``), which mirrors ggml's tables, rather than written here again.
"""

from __future__ import annotations

import enum
from typing import Final

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from gguf_tools.type_table import BITCOS_TYPES, TYPE_ID_BITMAP, TYPE_ID_G128, TYPE_ID_PT

QK: Final = 128  # weights per v1 block and per kernel unit (QK_BITCOS): a 128-bit bitmap
BITMAP_BYTES: Final = QK // 8  # bytes of the bitmap of 128 weights, the same in every variant
QK_BITMAP: Final = 32  # weights per v2 ggml block (QK_BITCOS_BITMAP): the v2 row-length granularity
# the ggml type ids (TYPE_ID_G128 160, TYPE_ID_PT 161, TYPE_ID_BITMAP 162: every version-2 variant) and their
# ggml block sizes are the GGUF layer's facts: gguf_tools.type_table


class Variant(enum.IntEnum):
    """The BITCOS variants; the value is the companion header's ``variant`` byte (FORMAT.md §4.1).

    Each member carries its ggml type id (FORMAT.md §2), its format version, the bytes per 128 weights of its
    weight tensor (§3), the multiple that its row length K must be, and its scale granularity along a row
    (``scale_block``: weights per fp16 block scale; 0 for fp32 scales per row or per matrix).
    """

    # name    value type id         version  bytes/128 weights   K multiple  scale_block
    G128 = (0, TYPE_ID_G128, 1, BITMAP_BYTES + 2, 128, 128)  # v1: bitmap + fp16 d per 128 weights
    PT = (1, TYPE_ID_PT, 1, BITMAP_BYTES, 128, 0)  # v1: bitmap; fp32 scale per matrix in the companion
    MATRIX = (2, TYPE_ID_BITMAP, 2, BITMAP_BYTES, 32, 0)  # v2: fp32 scale per matrix
    ROW = (3, TYPE_ID_BITMAP, 2, BITMAP_BYTES, 32, 0)  # v2: fp32 scale per row
    B128 = (4, TYPE_ID_BITMAP, 2, BITMAP_BYTES, 128, 128)  # v2: fp16 scale per 128 weights of a row
    B256 = (5, TYPE_ID_BITMAP, 2, BITMAP_BYTES, 256, 256)  # v2: fp16 scale per 256 weights of a row

    type_id: int
    version: int
    block_bytes: int
    k_multiple: int
    scale_block: int

    def __new__(
        cls, value: int, type_id: int, version: int, block_bytes: int, k_multiple: int, scale_block: int
    ) -> Variant:
        member = int.__new__(cls, value)
        member._value_ = value
        member.type_id = type_id
        member.version = version
        member.block_bytes = block_bytes
        member.k_multiple = k_multiple
        member.scale_block = scale_block
        return member

    @property
    def type_name(self) -> str:
        """The ggml type's name: ``BITCOS_G128`` / ``BITCOS_PT`` (v1), ``BITCOS`` (every v2 variant)."""
        return "BITCOS" if self.version == 2 else f"BITCOS_{self.name}"

    @property
    def ggml_block(self) -> tuple[int, int]:
        """(weights, bytes) of one ggml block of the weight tensor: (128, 18) / (128, 16) in v1, (32, 4) in v2."""
        _type_id, block, block_bytes = BITCOS_TYPES[self.type_name]
        return block, block_bytes

    def scales_bytes(self, n_cols: int, n_rows: int, n_mats: int) -> int:
        """Bytes of the companion's scales section (FORMAT.md §4.2); 0 for G128 (its scales are in the blocks)."""
        if self in (Variant.PT, Variant.MATRIX):
            return 4 * n_mats
        if self is Variant.ROW:
            return 4 * n_rows
        if self in (Variant.B128, Variant.B256):
            return 2 * n_rows * (n_cols // self.scale_block)
        return 0

    @classmethod
    def from_type_id(cls, type_id: int) -> Variant:
        """The variant stored as v1 ggml type ``type_id``; ``ValueError`` when it is not a v1 BITCOS type (a v2
        weight's variant is in its companion header, not in its type)."""
        for v in cls:
            if v.version == 1 and v.type_id == int(type_id):
                return v
        raise ValueError(f"ggml type {int(type_id)} is not a version-1 BITCOS type")


BITCOS_TYPE_IDS: Final = frozenset(v.type_id for v in Variant)

# --- companion tensor (FORMAT.md §1, §4) -------------------------------------------------------------
COMPANION_SUFFIX: Final = ".bitcos"  # companion name = weight name + suffix
COMPANION_TYPE: Final = GGMLQuantizationType.I8  # its ggml type; 1-D, one element per byte
GGML_MAX_NAME: Final = 64  # ggml's tensor name buffer, NUL included
MAX_WEIGHT_NAME: Final = GGML_MAX_NAME - 1 - len(COMPANION_SUFFIX)  # 56: the companion name must fit
MAGIC: Final = 0x53435442  # bytes "BTCS"
VERSION: Final = 2  # the newest format version; readers accept 1 and 2
VERSIONS: Final = (1, 2)
HEADER_BYTES: Final = 128
SECTION_ALIGN: Final = 64  # every section starts at a multiple of this
POOL_TAIL: Final = 64  # zero bytes after the padded sign pool
MAX_ROW_GROUP_LOG2: Final = 6
# Valid scales (FORMAT.md §3.1), every scale of every variant: finite, sign bit clear (>= +0.0), at most
# MAX_SCALE, the largest finite fp16 (an fp16 scale cannot exceed it; fp32 scales share TQ1_0/TQ2_0's range).
MAX_SCALE: Final = 65504

# The header's fields in order, as (name, struct format character); the rest up to HEADER_BYTES is reserved
# and zero. Field offsets follow from the sizes (no padding: every field is at a multiple of its size).
HEADER_FIELDS: Final[tuple[tuple[str, str], ...]] = (
    ("magic", "I"),
    ("version", "H"),
    ("variant", "B"),
    ("row_group_log2", "B"),
    ("n_cols", "Q"),
    ("n_rows", "Q"),
    ("n_mats", "Q"),
    ("n_sign_bits", "Q"),
    ("scales_offset", "Q"),
    ("row_base_offset", "Q"),
    ("row_delta_offset", "Q"),
    ("pool_offset", "Q"),
    ("pool_bytes", "Q"),
)

# --- GGUF metadata (FORMAT.md §6) --------------------------------------------------------------------
KEY_FORMAT_VERSION: Final = "bitcos.format_version"
KEY_CONVERTED_FROM: Final = "bitcos.converted_from"

# --- the ternary source types BITCOS converts from losslessly (ggml's own tables, via gguf-py) --------
QK_K: Final = GGML_QUANT_SIZES[GGMLQuantizationType.TQ2_0][0]  # 256 weights per TQ block
TQ1_0_BLOCK_BYTES: Final = GGML_QUANT_SIZES[GGMLQuantizationType.TQ1_0][1]  # qs[48] qh[4] d: 54
TQ2_0_BLOCK_BYTES: Final = GGML_QUANT_SIZES[GGMLQuantizationType.TQ2_0][1]  # qs[64] d: 66
assert GGML_QUANT_SIZES[GGMLQuantizationType.TQ1_0][0] == QK_K


def bits_per_weight(variant: Variant, zero_density: float, n_cols: int = 0) -> float:
    """FORMAT.md §8 without the companion's header, alignment and row index: bitmap, scales and one sign bit per
    non-zero weight, i.e. G128 / B128 2.125 − z, B256 2.0625 − z, PT / MATRIX 2 − z (the per-matrix scale
    counted as 0), ROW 2 − z + 32 / K (``n_cols`` = K needed)."""
    scale_bits = 0.0
    if variant.scale_block:
        scale_bits = 16 / variant.scale_block
    elif variant is Variant.ROW:
        if n_cols <= 0:
            raise ValueError("ROW needs the row length n_cols")
        scale_bits = 32 / n_cols
    return 1.0 + scale_bits + 1.0 - zero_density


__all__ = [
    "QK",
    "BITMAP_BYTES",
    "QK_BITMAP",
    "TYPE_ID_G128",
    "TYPE_ID_PT",
    "TYPE_ID_BITMAP",
    "Variant",
    "BITCOS_TYPE_IDS",
    "COMPANION_SUFFIX",
    "COMPANION_TYPE",
    "GGML_MAX_NAME",
    "MAX_WEIGHT_NAME",
    "MAGIC",
    "VERSION",
    "VERSIONS",
    "HEADER_BYTES",
    "SECTION_ALIGN",
    "POOL_TAIL",
    "MAX_ROW_GROUP_LOG2",
    "MAX_SCALE",
    "HEADER_FIELDS",
    "KEY_FORMAT_VERSION",
    "KEY_CONVERTED_FROM",
    "QK_K",
    "TQ1_0_BLOCK_BYTES",
    "TQ2_0_BLOCK_BYTES",
    "bits_per_weight",
]
