"""``ggml-bitcos info``: the BITCOS view of a GGUF file, in the style of ``gguf-dump``.

For every BITCOS weight: its variant (G128 / PT in version 1; MATRIX / ROW / B128 / B256 in version 2), logical shape, zero density ``z`` (from the companion header:
``1 − n_sign_bits / (K·R)``), the bits per weight the file really spends on it (weight blocks + companion,
i.e. bitmap, scales, row index, sign pool, header and alignment) and the companion's parts; then totals and
the file's ``bitcos.*`` metadata. Every tensor is validated like the llama.cpp loader validates it
(``validate_bitcos_tensor``: the companion's type and shape, then ``codec.validate``: header, row index
against the bitmap, sign pool, scales — FORMAT.md §3.1, §4), before anything is printed; ``stats`` uses the
same function. A problem is one line naming the file, the tensor and what is wrong.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gguf_tools import GGUFError, open_gguf, tensor_bytes, tensor_ggml_shape, type_name

from . import codec
from .format import (
    BITCOS_TYPE_IDS,
    COMPANION_SUFFIX,
    COMPANION_TYPE,
    KEY_CONVERTED_FROM,
    KEY_FORMAT_VERSION,
    VERSIONS,
    Variant,
)


@dataclass
class TensorInfo:
    index: int  # position among the file's tensors, 0-based (printed 1-based, as gguf-dump does)
    name: str
    variant: str
    shape: list[int]  # ggml order, ne0 first
    n_weights: int
    n_nonzero: int
    zero_density: float
    weight_bytes: int  # fixed-size blocks: bitmap (+ fp16 d for G128)
    companion_bytes: int
    scales_bytes: int  # the companion's scales section (G128: the d inside the weight blocks, counted there)
    index_bytes: int  # row_base + row_delta
    pool_bytes: int  # sign pool incl. its padding and zero tail
    row_group: int  # rows per row_base entry, G = 2^g
    bits_per_weight: float  # (weight + companion) · 8 / weights: what the file spends
    scale_bits_per_weight: float
    index_bits_per_weight: float


@dataclass
class FileInfo:
    path: str
    format_version: int | None
    versions: list[int]  # the companion versions of the file's BITCOS tensors (FORMAT.md §9)
    converted_from: str | None
    file_type: int | None
    n_tensors: int
    tensors: list[TensorInfo]
    source_notes: list[str] = field(default_factory=list)  # the forms the reader saw (e.g. legacy Q2_0)

    def totals(self) -> dict[str, float | int]:
        n = sum(t.n_weights for t in self.tensors)
        nz = sum(t.n_nonzero for t in self.tensors)
        wb = sum(t.weight_bytes for t in self.tensors)
        cb = sum(t.companion_bytes for t in self.tensors)
        return {
            "tensors": len(self.tensors),
            "weights": n,
            "zero_density": 1 - nz / n if n else 0.0,
            "weight_bytes": wb,
            "companion_bytes": cb,
            "bits_per_weight": 8 * (wb + cb) / n if n else 0.0,
            "index_bits_per_weight": 8 * sum(t.index_bytes for t in self.tensors) / n if n else 0.0,
        }


def validate_bitcos_tensor(path: Path, w, comp) -> codec.Header:  # noqa: ANN001 (ReaderTensor)
    """Validate a BITCOS weight and its companion as the llama.cpp loader does (FORMAT.md §1, §3.1, §4: the
    one implementation behind ``info``, ``stats`` and ``codec.decode``); ``GGUFError`` naming the tensor."""
    name = w.name
    if comp is None:
        raise GGUFError(path, f"BITCOS weight without its companion tensor '{name + COMPANION_SUFFIX}'", name)
    if int(comp.tensor_type) != int(COMPANION_TYPE) or len(tensor_ggml_shape(comp)) != 1:
        raise GGUFError(
            path,
            f"companion is {type_name(comp.tensor_type)} with shape {tensor_ggml_shape(comp)}, "
            f"expected a 1-D {COMPANION_TYPE.name} tensor",
            comp.name,
        )
    ne = tensor_ggml_shape(w)
    if len(ne) < 2:
        raise GGUFError(path, f"BITCOS weight has {len(ne)} dimension(s); it must have 2 or 3", name)
    try:
        return codec.validate(
            tensor_bytes(w), tensor_bytes(comp), int(w.tensor_type), ne[0], math.prod(ne[1:]), codec.n_mats_of(ne)
        )
    except codec.FormatError as e:
        raise GGUFError(path, str(e), name) from None


def tensor_info(path: Path, index: int, w, comp, *, check: bool = True) -> TensorInfo:  # noqa: ANN001
    """Validated facts of one BITCOS weight + companion; ``GGUFError`` naming the tensor on a problem.
    (``check`` is kept for callers; every tensor is always fully validated.)"""
    hdr = validate_bitcos_tensor(path, w, comp)
    name = w.name
    variant = hdr.variant
    ne = tensor_ggml_shape(w)
    k, n_rows, n_mats = ne[0], math.prod(ne[1:]), codec.n_mats_of(ne)
    n = k * n_rows
    g = 1 << hdr.row_group_log2
    index_bytes = 8 * ((n_rows + g - 1) // g) + 2 * n_rows
    scales_bytes = variant.scales_bytes(k, n_rows, n_mats)
    weight_bytes = int(w.n_bytes)
    g128_scale_bytes = 2 * (n // 128) if variant is Variant.G128 else 0
    return TensorInfo(
        index,
        name,
        variant.name,
        list(ne),
        n,
        hdr.n_sign_bits,
        1 - hdr.n_sign_bits / n,
        weight_bytes,
        int(comp.n_bytes),
        scales_bytes,
        index_bytes,
        hdr.pool_bytes,
        g,
        8 * (weight_bytes + int(comp.n_bytes)) / n,
        8 * (scales_bytes + g128_scale_bytes) / n,
        8 * index_bytes / n,
    )


def collect(path: Path, *, check: bool = False) -> FileInfo:
    path = Path(path)
    reader = open_gguf(path)

    def meta(key: str):  # noqa: ANN202
        f = reader.get_field(key)
        return f.contents() if f is not None else None

    version = meta(KEY_FORMAT_VERSION)
    if version is not None and int(version) not in VERSIONS:
        raise GGUFError(
            path,
            f"{KEY_FORMAT_VERSION} {int(version)} is not a version this tool supports "
            f"({', '.join(map(str, VERSIONS))})",
        )
    by_name = {t.name: t for t in reader.tensors}
    infos: list[TensorInfo] = []
    for i, t in enumerate(reader.tensors):
        if t.name.endswith(COMPANION_SUFFIX) and int(t.tensor_type) == int(COMPANION_TYPE):
            base = by_name.get(t.name[: -len(COMPANION_SUFFIX)])
            if base is None or int(base.tensor_type) not in BITCOS_TYPE_IDS:
                raise GGUFError(path, "companion without a BITCOS weight", t.name)
        if int(t.tensor_type) in BITCOS_TYPE_IDS:
            infos.append(tensor_info(path, i, t, by_name.get(t.name + COMPANION_SUFFIX), check=check))
            reader.release_pages()
    ft = meta("general.file_type")
    versions = sorted({Variant[t.variant].version for t in infos})
    return FileInfo(
        str(path),
        int(version) if version is not None else None,
        versions,
        meta(KEY_CONVERTED_FROM),
        int(ft) if ft is not None else None,
        len(reader.tensors),
        infos,
        list(reader.form_notes),
    )


def format_text(info: FileInfo) -> str:
    ft = f"{info.file_type} ({type_name(info.file_type)})" if info.file_type in BITCOS_TYPE_IDS else str(info.file_type)
    out = [
        f"* BITCOS view of {info.path}",
        f"* format version {info.format_version if info.format_version is not None else '(no ' + KEY_FORMAT_VERSION + ')'}"
        f", converted from {info.converted_from or '-'}, general.file_type {ft}",
        *(f"* source: {note}" for note in info.source_notes),
    ]
    if not info.tensors:
        out.append(f"* no BITCOS tensors among the {info.n_tensors} tensors (not a converted file)")
        return "\n".join(out)
    by_var = {v.name: sum(1 for t in info.tensors if t.variant == v.name) for v in Variant}
    counts = ", ".join(f"{n} {name}" for name, n in by_var.items() if n)
    out.append(
        f"* {len(info.tensors)} BITCOS weights ({counts}; companion version"
        f"{'s' if len(info.versions) > 1 else ''} {', '.join(map(str, info.versions))}) + "
        f"{len(info.tensors)} companions of {info.n_tensors} tensors"
    )
    out.append("* bits/w: weight blocks + companion, per weight; scale, index: their share of it")
    out.append(
        f"    {'#':>3}: {'weights':>10} | {'ne0':>5}, {'ne1':>5}, {'ne2':>3} | {'var':<6} | {'z':>6} | "
        f"{'bits/w':>6} | {'scale':>5} | {'index':>5} | {'weight B':>9} | {'compan. B':>9} | "
        f"{'pool B':>9} | {'G':>2} | name"
    )
    for t in info.tensors:
        ne = list(t.shape) + [1] * (3 - len(t.shape))
        out.append(
            f"    {t.index + 1:>3}: {t.n_weights:>10} | {ne[0]:>5}, {ne[1]:>5}, {ne[2]:>3} | {t.variant:<6} | "
            f"{t.zero_density:>6.4f} | {t.bits_per_weight:>6.4f} | {t.scale_bits_per_weight:>5.3f} | "
            f"{t.index_bits_per_weight:>5.3f} | {t.weight_bytes:>9} | {t.companion_bytes:>9} | "
            f"{t.pool_bytes:>9} | {t.row_group:>2} | {t.name}"
        )
    tot = info.totals()
    out.append(
        f"* total: {tot['weights']:,} BITCOS weights, z = {tot['zero_density']:.4f}, "
        f"{tot['bits_per_weight']:.4f} bits per weight ({tot['weight_bytes']:,} weight + "
        f"{tot['companion_bytes']:,} companion bytes; row index {tot['index_bits_per_weight']:.4f} bits "
        f"per weight)"
    )
    return "\n".join(out)


def to_json(info: FileInfo) -> str:
    d = asdict(info)
    d["totals"] = info.totals()
    return json.dumps(d, indent=2)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "info",
        help="the BITCOS view of a GGUF file (per-tensor variant, z, bits per weight)",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("input", type=Path, metavar="FILE.gguf")
    p.add_argument(
        "--check",
        action="store_true",
        help="accepted for scripts: every BITCOS tensor is always validated like the llama.cpp loader "
        "does (header, row index, sign pool, scales)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    info = collect(args.input, check=args.check)
    try:
        print(to_json(info) if args.json else format_text(info))
        sys.stdout.flush()
    except BrokenPipeError:  # `ggml-bitcos info FILE | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


__all__ = ["TensorInfo", "FileInfo", "validate_bitcos_tensor", "collect", "format_text", "to_json", "register", "run"]
