"""The converter's passes over a source, one module each, shared by ``convert`` and ``stats``; a tensor goes
through them in order and each module once:

1. ``read``: open + check the file (its types and data extents, BITCOS pairs, the refusals, how its forms are
   read) and which tensors are candidates;
2. ``analyse``: per candidate, whether and in which variant it converts (FORMAT.md §7), its encoded size, the
   grow check and, for a foreign type, why it stays; ``stats`` stops here;
3. ``encode``: the BITCOS weight and companion of an analysed tensor, kept from pass 2 within the cache
   budget or made again when it is written;
4. ``write``: the output's metadata, the write through ``rewrite.write_verified`` and the verification.

The libraries they call are leaves: ``source`` (a tensor's fp32 rows), the codecs (``codec``, ``foreign``,
``tq``, ``ternary``) and the GGUF layer (``gguf_tools``). This module holds what the command line chooses
(``ConvertOptions``) and the ``--scale`` choices.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..format import VERSION, VERSIONS, Variant
from ..rewrite import ConvertError

DEFAULT_CACHE_BYTES = 64 << 20  # encoded tensors kept between pass 2 and 3 up to this total (bytes)

# --scale: the variants each choice may write, per format version, coarse to fine (auto's tie order, §7)
SCALE_VARIANTS: dict[int, dict[str, tuple[Variant, ...]]] = {
    2: {
        "auto": (Variant.MATRIX, Variant.ROW, Variant.B256, Variant.B128),
        "tensor": (Variant.MATRIX,),
        "row": (Variant.ROW,),
        "256": (Variant.B256,),
        "128": (Variant.B128,),
    },
    1: {"auto": (Variant.PT, Variant.G128), "tensor": (Variant.PT,), "128": (Variant.G128,)},
}
SCALE_ALIASES = {"g128": "128"}  # the version-1 name, kept for old command lines
SCALE_CHOICES = ("auto", "tensor", "row", "256", "128", *SCALE_ALIASES)


def scale_variants(scale: str, format_version: int) -> tuple[Variant, ...]:
    """The variants ``--scale scale`` may write in ``format_version``, coarse to fine; ConvertError when the
    choice has no form in that version (row / 256 in version 1)."""
    if format_version not in VERSIONS:
        raise ConvertError(f"--format-version {format_version}: choose one of {', '.join(map(str, VERSIONS))}")
    choices = SCALE_VARIANTS[format_version]
    key = SCALE_ALIASES.get(scale, scale)
    if key not in choices:
        if key in SCALE_VARIANTS[VERSION]:
            raise ConvertError(
                f"--scale {scale} has no version-{format_version} form (version {format_version} "
                f"has --scale {', '.join(choices)})"
            )
        raise ConvertError(f"--scale {scale}: choose one of {', '.join(SCALE_CHOICES)}")
    return choices[key]


@dataclass(frozen=True)
class ConvertOptions:
    """What ``convert`` is asked to do (the command line's flags).

    ``scale``: auto | tensor | row | 256 | 128 (g128), the variants allowed (``SCALE_VARIANTS``) in
    ``format_version`` (2, or 1 for readers that predate it). Nothing converted is an error (no output) unless
    ``allow_copy``; a tensor whose BITCOS form would be larger than its source stays as it is unless
    ``force_grow``; ``strict``: every ternary tensor must end up BITCOS. ``i2s_layout``: the layout of the
    source's I2_S tensors (``foreign.I2S_LAYOUTS``; None: the default, and the result says it was assumed).
    ``cache_bytes``: encodings kept from the analysis for the write, up to this total.
    """

    scale: str = "auto"
    format_version: int = VERSION
    strict: bool = False
    allow_copy: bool = False
    force_grow: bool = False
    i2s_layout: str | None = None
    verify: bool = True
    force: bool = False
    progress: bool = True
    cache_bytes: int = DEFAULT_CACHE_BYTES


__all__ = ["DEFAULT_CACHE_BYTES", "SCALE_VARIANTS", "SCALE_CHOICES", "scale_variants", "ConvertOptions"]
