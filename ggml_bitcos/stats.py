"""``ggml-bitcos stats``: the paper's Table I row for a model (source or BITCOS GGUF).

Measured: the zero density z of the ternary weights (every tensor ``convert`` would treat as ternary,
plus every BITCOS tensor, whose zeros come from its companion header: K·R − n_sign_bits). Then, in bits per
ternary weight:

* BITCOS, per variant (version 2: MATRIX, ROW, B256, B128; version 1: PT, G128), **as a file carries it**:
  the exact bytes of the weight tensor and the companion (bitmap, scales, row index, sign pool, header,
  alignment, pool tail; FORMAT.md §8) that ``convert`` writes for each tensor, summed over the model — for a
  source model what the conversion would write, for a BITCOS file what it holds and what each other variant
  would take (from the file's bitmap and scales: which variants hold its values exactly, FORMAT.md §7). A
  variant that cannot store every tensor exactly is reported as such, with no number. ``auto`` is
  ``convert``'s choice: per tensor the version-2 variant with the fewest bytes (before its grow check);
* BITCOS symbols only: 2 − z;
* TQ1_0: 1.6875 (54 bytes / 256), TQ2_0: 2.0625 (66 bytes / 256): real file layouts;
* 2-bit packing, group 128: 2.000 symbols, 2.125 with an fp16 scale per 128, and 5 trits per byte, group 128
  (the paper's "5-trit"): 1.625 symbols (26 bytes hold 130 trits -> 208 bits / 128), 1.750 with the scale —
  layouts from the paper, not ggml types;
* validation: every BITCOS tensor is checked with the llama.cpp loader's rules before it is counted
  (``info.validate_bitcos_tensor`` -> ``codec.validate``, the same function ``info`` runs); a file the
  loader refuses is an error naming the file and tensor, never a number;
* comparisons like with like: BITCOS with everything against a baseline with its scales, symbols against
  symbols; ``reduction`` = baseline / BITCOS, printed as "x smaller" (> 1) or "x larger" (< 1).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gguf.gguf_reader import ReaderTensor

from gguf_tools import GGUFError, tensor_bytes, tensor_ggml_shape

from . import codec, ternary
from .passes.analyse import Analysis, analyze_tensor
from .passes.read import add_i2s_layout_option, open_source
from .format import BITCOS_TYPE_IDS, COMPANION_SUFFIX, QK, QK_BITMAP, Variant
from .info import validate_bitcos_tensor

# (symbols only, with scales) bits per weight of the fixed-rate baselines
BASELINES: dict[str, tuple[float, float]] = {
    "2-bit g128": (2.0, 2.125),
    "5-trit g128": (1.625, 1.75),
    "TQ1_0": (1.625, 1.6875),
    "TQ2_0": (2.0, 2.0625),
}
AUTO = "auto"
V2_VARIANTS = (Variant.MATRIX, Variant.ROW, Variant.B256, Variant.B128)  # auto's candidates, coarse to fine
_STATS_ROWS = 1 << 14  # rows per chunk of a BITCOS tensor


@dataclass
class TensorStat:
    name: str
    type: str
    shape: list[int]
    n_weights: int
    n_zeros: int
    zero_density: float
    n_mats: int
    file_bits_per_weight: float | None = None  # BITCOS tensors: (weight + companion) bytes * 8 / n
    # exact bytes (weight + companion) of the tensor in each variant (all six, by name); None: not exact
    variant_bytes: dict[str, int | None] = field(default_factory=dict)


@dataclass
class ModelStats:
    path: str
    n_ternary_tensors: int
    n_weights: int
    n_zeros: int
    zero_density: float
    bitcos_symbols: float
    bitcos_g128: float | None  # real bits per weight stored as G128 (None: not exact)
    bitcos_pt: float | None  # real bits per weight stored as PT (None: not exact)
    baselines: dict[str, dict[str, float]]
    reduction_g128: dict[str, float]  # baseline with scales / real G128 bits (> 1: BITCOS smaller)
    reduction_pt: dict[str, float]
    bitcos_auto: float | None = None  # convert's choice per tensor: fewest bytes among v2 variants
    variant_bits: dict[str, float | None] = field(default_factory=dict)  # every variant (by name) -> real bits
    reduction: dict[str, dict[str, float]] = field(default_factory=dict)  # variant -> baseline / its bits
    reduction_auto: dict[str, float] = field(default_factory=dict)
    reduction_symbols: dict[str, float] = field(default_factory=dict)  # baseline symbols / (2 - z)
    not_exact: dict[str, int] = field(default_factory=dict)  # variant -> tensors it cannot store
    bitcos_tensors: int = 0
    bitcos_weights: int = 0
    file_bits_per_weight: float | None = None  # over the BITCOS tensors of the file
    tensors: list[TensorStat] = field(default_factory=list)
    source_notes: list[str] = field(default_factory=list)  # the forms the reader saw (legacy Q2_0, I2_S layout)


def encoded_bytes(variant: Variant, ne: tuple[int, ...] | list[int], n_sign_bits: int, row_group_log2: int) -> int:
    """Bytes a BITCOS weight of ggml shape ``ne`` takes in ``variant``: its weight tensor plus its companion."""
    return codec.encoded_nbytes(variant, ne, n_sign_bits, row_group_log2)[0]


def bitcos_tensor_scales(weight: np.ndarray, companion: np.ndarray, hdr: codec.Header) -> ternary.TensorScales:
    """The magnitudes of a (validated) BITCOS tensor per 32-weight group — its scale where the group holds a
    non-zero weight, 0 where it holds none — gathered like ``convert`` gathers a source's, so the same rules
    say which variants would hold it exactly (FORMAT.md §7). Reads bitmaps and scales only, never the signs."""
    v, k, n_rows, n_mats = hdr.variant, hdr.n_cols, hdr.n_rows, hdr.n_mats
    ts = ternary.TensorScales(n_rows, k, n_mats)
    scales = codec.stored_scales(weight, companion, hdr)
    row_bytes = codec.weight_row_bytes(v, k)
    groups = k // QK_BITMAP
    for s in range(0, n_rows, _STATS_ROWS):
        e = min(n_rows, s + _STATS_ROWS)
        bitmaps = codec.row_bitmaps(weight[s * row_bytes : e * row_bytes], v, k, e - s)
        present = bitmaps.reshape(e - s, groups, QK_BITMAP // 8).any(axis=2)
        if v.scale_block:
            per_group = np.repeat(scales[s:e].astype(np.float32), v.scale_block // QK_BITMAP, axis=1)
        elif v is Variant.ROW:
            per_group = np.repeat(scales[s:e, None], groups, axis=1)
        else:
            per_mat = scales[np.arange(s, e) // (n_rows // n_mats)]
            per_group = np.repeat(per_mat[:, None], groups, axis=1)
        mag32 = np.where(present, per_group, np.float32(0)).astype(np.float32)
        ts.add(s, ternary.TernaryChunk(np.empty((0, 0), np.int8), mag32, True))
    return ts


def _variant_bytes(exact: set[Variant], ne: list[int], n_sign: int, g: int) -> dict[str, int | None]:
    """Bytes of the tensor in every variant (by name), None where the variant does not hold it exactly."""
    return {v.name: encoded_bytes(v, ne, n_sign, g) if v in exact else None for v in Variant}


def _v1_exact(exact_v2: set[Variant], k: int) -> set[Variant]:
    """Version 1's variants that hold a tensor exactly, from version 2's: PT where MATRIX is (K % 128), G128
    where B128 is (the same per-128 fp16 scales, kept in the blocks)."""
    out = set()
    if Variant.MATRIX in exact_v2 and k % QK == 0:
        out.add(Variant.PT)
    if Variant.B128 in exact_v2:
        out.add(Variant.G128)
    return out


def collect(path: Path, *, progress: bool = True, i2s_layout: str | None = None) -> ModelStats:
    """Passes 1 and 2 of the converter (``passes.read``: read + check, ``passes.analyse``) over ``path``, and
    every BITCOS tensor it already holds validated and measured."""
    source = open_source(path, i2s_layout, error=GGUFError)
    by_name = {t.name: t for t in source.reader.tensors}
    todo = [t for t in source.reader.tensors if t.tensor_type in BITCOS_TYPE_IDS or source.is_candidate(t)]
    bar = tqdm(
        total=sum(int(t.n_bytes) for t in todo),
        desc="stats",
        unit="B",
        unit_scale=True,
        disable=None if progress else True,
    )  # None: off when stderr is not a terminal
    stats: list[TensorStat] = []
    with bar:
        for t in todo:
            if t.tensor_type in BITCOS_TYPE_IDS:
                stats.append(_bitcos_stat(path, t, by_name.get(t.name + COMPANION_SUFFIX)))
            else:
                if 0 in tensor_ggml_shape(t):
                    raise GGUFError(path, f"empty weight: a zero dimension (ne = {list(tensor_ggml_shape(t))})", t.name)
                stat = _source_stat(analyze_tensor(t, "auto", want_codes=False))
                if stat is not None:
                    stats.append(stat)
            source.reader.release_pages()
            bar.set_postfix_str(t.name, refresh=False)
            bar.update(int(t.n_bytes))
    m = summarize_stats(str(path), stats)
    m.source_notes = source.notes
    return m


def _bitcos_stat(path: Path, t: ReaderTensor, comp: ReaderTensor | None) -> TensorStat:
    """A BITCOS tensor of the file, validated with the loader's rules (info.py, codec.validate): its bytes as
    stored, and those of every other variant that holds it exactly."""
    ne = tensor_ggml_shape(t)
    hdr = validate_bitcos_tensor(path, t, comp)
    assert comp is not None  # validate_bitcos_tensor refuses a weight without its companion
    weight, cbytes = tensor_bytes(t).reshape(-1).view(np.uint8), tensor_bytes(comp).reshape(-1).view(np.uint8)
    ts = bitcos_tensor_scales(weight, cbytes, hdr)
    exact = {v for v in Variant if ts.why_not(v) is None}
    n = ne[0] * math.prod(ne[1:])
    actual = int(t.n_bytes) + int(comp.n_bytes)
    vb = _variant_bytes(exact, list(ne), hdr.n_sign_bits, hdr.row_group_log2)
    vb[hdr.variant.name] = actual
    return TensorStat(
        t.name,
        hdr.variant.type_name if hdr.variant.version == 1 else f"BITCOS/{hdr.variant.name}",
        list(ne),
        n,
        n - hdr.n_sign_bits,
        1 - hdr.n_sign_bits / n,
        codec.n_mats_of(ne),
        8 * actual / n,
        vb,
    )


def _source_stat(a: Analysis) -> TensorStat | None:
    """A candidate's analysis (convert's, before its grow check) as a stat: its zeros and its bytes in every
    variant that holds it exactly; None for a tensor that is not ternary (or cannot be measured)."""
    r = a.result
    ne = r.ne
    if not r.measured:
        return None
    assert a.row_nonzero is not None
    g = codec.choose_row_group_log2(codec.row_sign_positions(a.row_nonzero))
    exact_v2 = set(a.exact_bytes)
    vb = _variant_bytes(exact_v2 | _v1_exact(exact_v2, ne[0]), list(ne), r.n_weights - r.n_zeros, g)
    return TensorStat(
        r.name,
        r.src_form or r.src_type,
        list(ne),
        r.n_weights,
        r.n_zeros,
        r.n_zeros / r.n_weights,  # measured: n_weights > 0
        codec.n_mats_of(ne),
        variant_bytes=vb,
    )


def _auto_bytes(s: TensorStat) -> int | None:
    """convert's choice (FORMAT.md §7): the version-2 variant with the fewest bytes; ties to the coarser."""
    sizes = [s.variant_bytes.get(v.name) for v in V2_VARIANTS]
    sizes = [x for x in sizes if x is not None]
    return min(sizes) if sizes else None


def summarize_stats(path: str, stats: list[TensorStat]) -> ModelStats:
    n = sum(s.n_weights for s in stats)
    nz = sum(s.n_zeros for s in stats)
    z = nz / n if n else 0.0
    real: dict[str, float | None] = {}
    not_exact: dict[str, int] = {}
    getters = [(v.name, (lambda s, key=v.name: s.variant_bytes.get(key))) for v in Variant] + [(AUTO, _auto_bytes)]
    for name, get in getters:
        sizes = [get(s) for s in stats]
        not_exact[name] = sum(1 for x in sizes if x is None)
        real[name] = 8 * sum(sizes) / n if n and not_exact[name] == 0 else None  # type: ignore[arg-type]

    def red(bits: float | None) -> dict[str, float]:
        return {k: b / bits for k, (_a, b) in BASELINES.items()} if bits else {}

    baselines = {k: {"symbols": a, "with_scale": b} for k, (a, b) in BASELINES.items()}
    m = ModelStats(
        path,
        len(stats),
        n,
        nz,
        z,
        2.0 - z,
        real[Variant.G128.name],
        real[Variant.PT.name],
        baselines,
        red(real[Variant.G128.name]),
        red(real[Variant.PT.name]),
        bitcos_auto=real[AUTO],
        variant_bits={v.name: real[v.name] for v in Variant},
        reduction={v.name: red(real[v.name]) for v in Variant},
        reduction_auto=red(real[AUTO]),
        reduction_symbols={k: a / (2.0 - z) for k, (a, _b) in BASELINES.items()} if z < 2 else {},
        not_exact=not_exact,
        tensors=stats,
    )
    bit = [s for s in stats if s.file_bits_per_weight is not None]
    if bit:
        nb = sum(s.n_weights for s in bit)
        m.bitcos_tensors = len(bit)
        m.bitcos_weights = nb
        m.file_bits_per_weight = sum(s.file_bits_per_weight * s.n_weights for s in bit) / nb  # type: ignore[operator]
    return m


def _compare(ratio: float | None) -> str:
    """baseline / BITCOS as words: never "smaller" for something larger."""
    if ratio is None:
        return "-"
    if abs(ratio - 1.0) < 5e-4:
        return "same size"
    return f"{ratio:.3f}x smaller" if ratio > 1 else f"{1 / ratio:.3f}x larger"


def format_text(m: ModelStats, with_tensors: bool = False) -> str:
    out = [
        f"{m.path}",
        *(f"source: {note}" for note in m.source_notes),
        f"ternary tensors: {m.n_ternary_tensors}   weights: {m.n_weights:,}   "
        f"zero density z = {m.zero_density:.4f} ({100 * m.zero_density:.2f} % 0)",
    ]
    if not m.n_weights:
        out.append("no ternary tensors found")
        return "\n".join(out)
    out.append("")
    out.append(
        "bits per weight as a file stores them (BITCOS: blocks + companion: bitmap, signs, scales, row index, "
        "header, alignment)"
    )

    def bits(v: float | None, key: str) -> str:
        return f"{v:>9.4f}" if v is not None else f"{'n/a':>9}" + f"  (not exact for {m.not_exact[key]} tensors)"

    out.append(f"{'BITCOS auto (fewest bytes)':<30}{bits(m.bitcos_auto, AUTO)}")
    for v in V2_VARIANTS:
        out.append(f"{'BITCOS ' + v.name:<30}{bits(m.variant_bits[v.name], v.name)}")
    for v in (Variant.PT, Variant.G128):
        out.append(f"{'BITCOS ' + v.name + ' (version 1)':<30}{bits(m.variant_bits[v.name], v.name)}")
    out.append(f"{'BITCOS symbols only (2 - z)':<30}{m.bitcos_symbols:>9.4f}")
    out.append("")
    out.append(f"{'baseline':<30}{'bits/w':>9}{'symbols':>9}   {'BITCOS auto vs it':<22}{'symbols vs symbols':<20}")
    for k, v in m.baselines.items():
        label = k if k.startswith("TQ") else f"{k} (paper layout)"
        out.append(
            f"{label:<30}{v['with_scale']:>9.4f}{v['symbols']:>9.3f}   "
            f"{_compare(m.reduction_auto.get(k)):<22}{_compare(m.reduction_symbols.get(k)):<20}"
        )
    if m.file_bits_per_weight is not None:
        kinds = ",".join(sorted({s.type for s in m.tensors if s.file_bits_per_weight is not None}))
        out.append(
            f"file: {m.bitcos_tensors} BITCOS tensors ({kinds}), {m.bitcos_weights:,} weights, "
            f"{m.file_bits_per_weight:.4f} bits per weight incl. companion"
        )
    if with_tensors:
        out.append("")
        out.append(
            f"{'tensor':<36}{'type':<16}{'shape':<22}{'z':>8}"
            + "".join(f"{v.name + ' bpw':>11}" for v in V2_VARIANTS)
            + f"{'file bpw':>10}"
        )
        for s in m.tensors:

            def b(key: str) -> str:
                x = s.variant_bytes.get(key)
                return f"{8 * x / s.n_weights:.4f}" if x is not None else "n/a"

            fb = f"{s.file_bits_per_weight:.4f}" if s.file_bits_per_weight is not None else "-"
            out.append(
                f"{s.name:<36}{s.type:<16}{'x'.join(map(str, s.shape)):<22}{s.zero_density:>8.4f}"
                + "".join(f"{b(v.name):>11}" for v in V2_VARIANTS)
                + f"{fb:>10}"
            )
    return "\n".join(out)


def plot(m: ModelStats, path: Path) -> None:
    """The paper's Fig. 1 view: the model at its z on the 2 − z line vs the five-trit plateau."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    zs = np.linspace(0.0, 1.0, 201)
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    ax.plot(zs, 2.0 - zs, color="tab:green", label="BITCOS symbols, 2 − z")
    ax.axhline(1.625, color="tab:red", linestyle="--", label="five-trit packing, 1.625")
    ax.axhline(2.0, color="tab:gray", linestyle=":", label="2-bit packing, 2.000")
    ax.fill_between(
        zs, 2.0 - zs, 1.625, where=zs > 0.375, color="tab:green", alpha=0.15, label="BITCOS smaller (z > 0.375)"
    )
    z = m.zero_density
    y = min(2.0 - z, 1.625)
    ax.plot([z], [2.0 - z], "o", color="black", label=f"{Path(m.path).name}: z = {z:.3f}")
    if y < 2.0 - z:
        ax.plot([z], [y], "x", color="tab:red")
    ax.set_xlabel("zero density z")
    ax.set_ylabel("bits per weight (symbols only)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0.9, 2.1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title("Effective bit-width: BITCOS vs five-trit packing")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def to_json(m: ModelStats, with_tensors: bool) -> str:
    d = asdict(m)
    if not with_tensors:
        d.pop("tensors")
    return json.dumps(d, indent=2)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "stats",
        help="zero density and bits per weight of a model (paper Table I row)",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("input", type=Path, metavar="IN.gguf")
    p.add_argument("--tensors", action="store_true", help="also list every ternary tensor")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="draw the paper's Fig. 1 view")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_i2s_layout_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    m = collect(args.input, progress=not args.quiet and not args.json, i2s_layout=args.i2s_layout)
    print(to_json(m, args.tensors) if args.json else format_text(m, args.tensors))
    if args.plot:
        plot(m, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0
