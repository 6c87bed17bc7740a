"""The BITCOS v1 format's constants (docs/FORMAT.md), the one Python home of every number the spec fixes.

Every other module (codec, converter, stats, kernel harness, gguf_tools' type registration, the tests)
imports these names instead of repeating the numbers. The C mirror is ``csrc/bitcos-format.h``;
``tests/test_format.py`` parses that header and checks that both agree.

Facts that belong to upstream ggml (the TQ1_0/TQ2_0 block sizes, ``GGML_MAX_NAME``) are taken from gguf-py
(PyPI ``gguf``), which mirrors ggml's tables, rather than written here again.
"""

from __future__ import annotations

import enum
from typing import Final

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

QK: Final = 128                      # weights per BITCOS block (QK_BITCOS): one 128-bit presence bitmap
BITMAP_BYTES: Final = QK // 8        # bytes of the bitmap part of a block, the same in both variants


class Variant(enum.IntEnum):
    """The two BITCOS variants; the value is the companion header's ``variant`` byte (FORMAT.md §4.1).

    Each member also carries its ggml type id (FORMAT.md §2) and its bytes per 128-weight block (§3).
    """

    G128 = (0, 160, BITMAP_BYTES + 2)   # bitmap + fp16 d per 128 weights
    PT = (1, 161, BITMAP_BYTES)         # bitmap only; one fp32 scale per matrix in the companion

    type_id: int
    block_bytes: int

    def __new__(cls, value: int, type_id: int, block_bytes: int) -> Variant:
        member = int.__new__(cls, value)
        member._value_ = value
        member.type_id = type_id
        member.block_bytes = block_bytes
        return member

    @property
    def type_name(self) -> str:
        """The ggml type's name: ``BITCOS_G128`` / ``BITCOS_PT``."""
        return f"BITCOS_{self.name}"

    @classmethod
    def from_type_id(cls, type_id: int) -> Variant:
        """The variant stored as ggml type ``type_id``; ``ValueError`` when it is not a BITCOS type."""
        for v in cls:
            if v.type_id == int(type_id):
                return v
        raise ValueError(f"ggml type {int(type_id)} is not a BITCOS type")


BITCOS_TYPE_IDS: Final = frozenset(v.type_id for v in Variant)

# --- companion tensor (FORMAT.md §1, §4) -------------------------------------------------------------
COMPANION_SUFFIX: Final = ".bitcos"                   # companion name = weight name + suffix
COMPANION_TYPE: Final = GGMLQuantizationType.I8       # its ggml type; 1-D, one element per byte
GGML_MAX_NAME: Final = 64                             # ggml's tensor name buffer, NUL included
MAX_WEIGHT_NAME: Final = GGML_MAX_NAME - 1 - len(COMPANION_SUFFIX)   # 56: the companion name must fit
MAGIC: Final = 0x53435442                             # bytes "BTCS"
VERSION: Final = 1
HEADER_BYTES: Final = 128
SECTION_ALIGN: Final = 64                             # every section starts at a multiple of this
POOL_TAIL: Final = 64                                 # zero bytes after the padded sign pool
MAX_ROW_GROUP_LOG2: Final = 6
# Valid scales (FORMAT.md §3.1): finite, sign bit clear (>= +0.0), at most MAX_SCALE, the largest finite
# fp16 (a G128 d cannot exceed it; PT matrix scales share TQ1_0/TQ2_0's fp16 range).
MAX_SCALE: Final = 65504

# The header's fields in order, as (name, struct format character); the rest up to HEADER_BYTES is reserved
# and zero. Field offsets follow from the sizes (no padding: every field is at a multiple of its size).
HEADER_FIELDS: Final[tuple[tuple[str, str], ...]] = (
    ("magic", "I"), ("version", "H"), ("variant", "B"), ("row_group_log2", "B"),
    ("n_cols", "Q"), ("n_rows", "Q"), ("n_mats", "Q"), ("n_sign_bits", "Q"),
    ("scales_offset", "Q"), ("row_base_offset", "Q"), ("row_delta_offset", "Q"),
    ("pool_offset", "Q"), ("pool_bytes", "Q"),
)

# --- GGUF metadata (FORMAT.md §6) --------------------------------------------------------------------
KEY_FORMAT_VERSION: Final = "bitcos.format_version"
KEY_CONVERTED_FROM: Final = "bitcos.converted_from"

# --- the ternary source types BITCOS converts from losslessly (ggml's own tables, via gguf-py) --------
QK_K: Final = GGML_QUANT_SIZES[GGMLQuantizationType.TQ2_0][0]                # 256 weights per TQ block
TQ1_0_BLOCK_BYTES: Final = GGML_QUANT_SIZES[GGMLQuantizationType.TQ1_0][1]   # qs[48] qh[4] d: 54
TQ2_0_BLOCK_BYTES: Final = GGML_QUANT_SIZES[GGMLQuantizationType.TQ2_0][1]   # qs[64] d: 66
assert GGML_QUANT_SIZES[GGMLQuantizationType.TQ1_0][0] == QK_K


def bits_per_weight(variant: Variant, zero_density: float) -> float:
    """FORMAT.md §8 without the companion's overhead: the block (bitmap and, G128, the fp16 scale) plus one
    sign bit per non-zero weight, i.e. G128 2.125 − z, PT 2 − z."""
    return 8 * variant.block_bytes / QK + 1.0 - zero_density


__all__ = [
    "QK", "BITMAP_BYTES", "Variant", "BITCOS_TYPE_IDS", "COMPANION_SUFFIX", "COMPANION_TYPE", "GGML_MAX_NAME",
    "MAX_WEIGHT_NAME", "MAGIC", "VERSION", "HEADER_BYTES", "SECTION_ALIGN", "POOL_TAIL", "MAX_ROW_GROUP_LOG2",
    "MAX_SCALE",
    "HEADER_FIELDS", "KEY_FORMAT_VERSION", "KEY_CONVERTED_FROM", "QK_K", "TQ1_0_BLOCK_BYTES",
    "TQ2_0_BLOCK_BYTES", "bits_per_weight",
]
