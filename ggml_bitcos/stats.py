"""``ggml-bitcos stats``: the paper's Table I row for a model (source or BITCOS GGUF).

Measured: the zero density z of the ternary weights (every tensor ``convert`` would treat as ternary,
plus every BITCOS tensor, whose zeros come from its companion header: K·R − n_sign_bits). Then, in bits per
ternary weight:

* BITCOS, per variant, **as a file carries it**: the exact bytes of the weight blocks and the companion
  (bitmap, fp16 block scales or fp32 per-matrix scales, row index, sign pool, header, alignment, pool tail;
  FORMAT.md §8) that ``convert`` writes for each tensor, summed over the model — for a source model what
  the conversion would write, for a BITCOS file what it holds (and the variant it does not use, computed from
  the same row index). A variant that cannot store every tensor exactly is reported as such, with no number.
  ``auto`` is ``convert``'s choice: PT where exact, else G128 (before its grow check);
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

from gguf_tools import GGUFError, open_gguf, tensor_bytes, tensor_ggml_shape, type_name

from . import codec
from .convert import analyze_tensor, check_bitcos_file, is_candidate
from .format import BITCOS_TYPE_IDS, BITMAP_BYTES, COMPANION_SUFFIX, QK, Variant
from .info import validate_bitcos_tensor

# (symbols only, with scales) bits per weight of the fixed-rate baselines
BASELINES: dict[str, tuple[float, float]] = {
    "2-bit g128": (2.0, 2.125),
    "5-trit g128": (1.625, 1.75),
    "TQ1_0": (1.625, 1.6875),
    "TQ2_0": (2.0, 2.0625),
}
AUTO = "auto"


@dataclass
class TensorStat:
    name: str
    type: str
    shape: list[int]
    n_weights: int
    n_zeros: int
    zero_density: float
    n_mats: int
    file_bits_per_weight: float | None = None   # BITCOS tensors: (weight + companion) bytes * 8 / n
    # exact bytes (weight blocks + companion) of the tensor in each variant; None: the variant is not exact
    variant_bytes: dict[str, int | None] = field(default_factory=dict)


@dataclass
class ModelStats:
    path: str
    n_ternary_tensors: int
    n_weights: int
    n_zeros: int
    zero_density: float
    bitcos_symbols: float
    bitcos_g128: float | None                       # real bits per weight stored as G128 (None: not exact)
    bitcos_pt: float | None                         # real bits per weight stored as PT (None: not exact)
    baselines: dict[str, dict[str, float]]
    reduction_g128: dict[str, float]                # baseline with scales / real G128 bits (> 1: BITCOS smaller)
    reduction_pt: dict[str, float]
    bitcos_auto: float | None = None                # convert's choice per tensor: PT where exact, else G128
    reduction_auto: dict[str, float] = field(default_factory=dict)
    reduction_symbols: dict[str, float] = field(default_factory=dict)   # baseline symbols / (2 - z)
    not_exact: dict[str, int] = field(default_factory=dict)              # variant -> tensors it cannot store
    bitcos_tensors: int = 0
    bitcos_weights: int = 0
    file_bits_per_weight: float | None = None          # over the BITCOS tensors of the file
    tensors: list[TensorStat] = field(default_factory=list)


def encoded_bytes(variant: Variant, ne: tuple[int, ...] | list[int], n_sign_bits: int, row_group_log2: int) -> int:
    """Bytes a BITCOS weight of ggml shape ``ne`` takes in ``variant``: its blocks plus its companion."""
    k, n_rows = int(ne[0]), math.prod(int(x) for x in ne[1:])
    n_mats = codec.n_mats_of(tuple(int(x) for x in ne))
    return (n_rows * (k // QK) * variant.block_bytes
            + codec.companion_size(variant, k, n_rows, n_mats, n_sign_bits, row_group_log2))


def _other_variant_exact(variant: Variant, weight: np.ndarray, dec_hdr: codec.Header, companion: np.ndarray) -> bool:
    """Whether a BITCOS tensor stored as ``variant`` is also exact in the other variant (FORMAT.md §7)."""
    if variant == Variant.PT:          # G128 needs each matrix scale to be an fp16 value
        s = companion[dec_hdr.scales_offset:dec_hdr.scales_offset + 4 * dec_hdr.n_mats].view("<f4")
        with np.errstate(over="ignore"):
            return bool(np.array_equal(s.astype(np.float16).astype(np.float32), s))
    # PT needs one magnitude per matrix over the blocks that hold non-zero weights
    blk = weight.reshape(dec_hdr.n_mats, -1, variant.block_bytes)
    present = blk[:, :, :BITMAP_BYTES].any(axis=2)
    d = np.ascontiguousarray(blk[:, :, BITMAP_BYTES:]).view("<f2")[:, :, 0].astype(np.float32)
    for m in range(dec_hdr.n_mats):
        v = d[m][present[m]]
        if v.size and not np.all(v == v[0]):
            return False
    return True


def collect(path: Path, *, progress: bool = True) -> ModelStats:
    reader = open_gguf(path)
    check_bitcos_file(reader, path)
    by_name = {t.name: t for t in reader.tensors}
    stats: list[TensorStat] = []
    todo = [t for t in reader.tensors if t.tensor_type in BITCOS_TYPE_IDS or
            (is_candidate(t.name, t) and t.name + COMPANION_SUFFIX not in by_name)]
    bar = tqdm(total=sum(int(t.n_bytes) for t in todo), desc="stats", unit="B", unit_scale=True,
               disable=None if progress else True)   # None: off when stderr is not a terminal
    for t in todo:
        ne = tensor_ggml_shape(t)
        n_rows, k = math.prod(ne[1:]), ne[0]
        if t.tensor_type not in BITCOS_TYPE_IDS and 0 in ne:
            raise GGUFError(path, f"empty weight: a zero dimension (ne = {list(ne)})", t.name)
        if t.tensor_type in BITCOS_TYPE_IDS:
            comp = by_name.get(t.name + COMPANION_SUFFIX)
            hdr = validate_bitcos_tensor(path, t, comp)     # the loader's rules (info.py, codec.validate)
            cbytes = tensor_bytes(comp)
            variant = Variant.from_type_id(t.tensor_type)
            other = Variant.G128 if variant == Variant.PT else Variant.PT
            n = k * n_rows
            actual = int(t.n_bytes) + int(comp.n_bytes)
            vb: dict[str, int | None] = {variant.name: actual, other.name: None}
            if _other_variant_exact(variant, tensor_bytes(t), hdr, cbytes):
                vb[other.name] = encoded_bytes(other, ne, hdr.n_sign_bits, hdr.row_group_log2)
            stats.append(TensorStat(t.name, type_name(t.tensor_type), list(ne), n, n - hdr.n_sign_bits,
                                    1 - hdr.n_sign_bits / n, codec.n_mats_of(ne), 8 * actual / n, vb))
        else:
            a = analyze_tensor(t, "auto", want_codes=False)
            r = a.result
            if r.measured:
                assert a.row_nonzero is not None
                g = codec.choose_row_group_log2(codec.row_sign_positions(a.row_nonzero))
                n_sign = r.n_weights - r.n_zeros
                vb = {Variant.PT.name: encoded_bytes(Variant.PT, ne, n_sign, g) if a.pt is not None else None,
                      Variant.G128.name: encoded_bytes(Variant.G128, ne, n_sign, g) if a.g128_ok else None}
                stats.append(TensorStat(t.name, r.src_type, list(ne), r.n_weights, r.n_zeros, r.zero_density,
                                        codec.n_mats_of(ne), variant_bytes=vb))
        reader.release_pages()
        bar.set_postfix_str(t.name, refresh=False)
        bar.update(int(t.n_bytes))
    bar.close()
    return summarize_stats(str(path), stats)


def _auto_bytes(s: TensorStat) -> int | None:
    pt, g = s.variant_bytes.get(Variant.PT.name), s.variant_bytes.get(Variant.G128.name)
    return pt if pt is not None else g


def summarize_stats(path: str, stats: list[TensorStat]) -> ModelStats:
    n = sum(s.n_weights for s in stats)
    nz = sum(s.n_zeros for s in stats)
    z = nz / n if n else 0.0
    real: dict[str, float | None] = {}
    not_exact: dict[str, int] = {}
    for name, get in ((Variant.G128.name, lambda s: s.variant_bytes.get(Variant.G128.name)),
                      (Variant.PT.name, lambda s: s.variant_bytes.get(Variant.PT.name)), (AUTO, _auto_bytes)):
        sizes = [get(s) for s in stats]
        not_exact[name] = sum(1 for x in sizes if x is None)
        real[name] = 8 * sum(sizes) / n if n and not_exact[name] == 0 else None   # type: ignore[arg-type]

    def red(bits: float | None) -> dict[str, float]:
        return {k: b / bits for k, (_a, b) in BASELINES.items()} if bits else {}

    baselines = {k: {"symbols": a, "with_scale": b} for k, (a, b) in BASELINES.items()}
    m = ModelStats(path, len(stats), n, nz, z, 2.0 - z, real[Variant.G128.name], real[Variant.PT.name], baselines,
                   red(real[Variant.G128.name]), red(real[Variant.PT.name]), bitcos_auto=real[AUTO],
                   reduction_auto=red(real[AUTO]),
                   reduction_symbols={k: a / (2.0 - z) for k, (a, _b) in BASELINES.items()} if z < 2 else {},
                   not_exact=not_exact, tensors=stats)
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
    out = [f"{m.path}",
           f"ternary tensors: {m.n_ternary_tensors}   weights: {m.n_weights:,}   "
           f"zero density z = {m.zero_density:.4f} ({100 * m.zero_density:.2f} % 0)"]
    if not m.n_weights:
        out.append("no ternary tensors found")
        return "\n".join(out)
    out.append("")
    out.append("bits per weight as a file stores them (BITCOS: blocks + companion: bitmap, signs, scales, row index, "
               "header, alignment)")

    def bits(v: float | None, key: str) -> str:
        return f"{v:>9.4f}" if v is not None else f"{'n/a':>9}" + f"  (not exact for {m.not_exact[key]} tensors)"

    out.append(f"{'BITCOS auto (PT, else G128)':<30}{bits(m.bitcos_auto, AUTO)}")
    out.append(f"{'BITCOS PT':<30}{bits(m.bitcos_pt, Variant.PT.name)}")
    out.append(f"{'BITCOS G128':<30}{bits(m.bitcos_g128, Variant.G128.name)}")
    out.append(f"{'BITCOS symbols only (2 - z)':<30}{m.bitcos_symbols:>9.4f}")
    out.append("")
    out.append(f"{'baseline':<30}{'bits/w':>9}{'symbols':>9}   {'BITCOS auto vs it':<22}{'symbols vs symbols':<20}")
    for k, v in m.baselines.items():
        label = k if k.startswith("TQ") else f"{k} (paper layout)"
        out.append(f"{label:<30}{v['with_scale']:>9.4f}{v['symbols']:>9.3f}   "
                   f"{_compare(m.reduction_auto.get(k)):<22}{_compare(m.reduction_symbols.get(k)):<20}")
    if m.file_bits_per_weight is not None:
        kinds = ",".join(sorted({s.type for s in m.tensors if s.file_bits_per_weight is not None}))
        out.append(f"file: {m.bitcos_tensors} BITCOS tensors ({kinds}), {m.bitcos_weights:,} weights, "
                   f"{m.file_bits_per_weight:.4f} bits per weight incl. companion")
    if with_tensors:
        out.append("")
        out.append(f"{'tensor':<36}{'type':<12}{'shape':<22}{'z':>8}{'PT bpw':>9}{'G128 bpw':>10}{'file bpw':>10}")
        for s in m.tensors:
            def b(key: str) -> str:
                x = s.variant_bytes.get(key)
                return f"{8 * x / s.n_weights:.4f}" if x is not None else "n/a"
            fb = f"{s.file_bits_per_weight:.4f}" if s.file_bits_per_weight is not None else "-"
            out.append(f"{s.name:<36}{s.type:<12}{'x'.join(map(str, s.shape)):<22}{s.zero_density:>8.4f}"
                       f"{b(Variant.PT.name):>9}{b(Variant.G128.name):>10}{fb:>10}")
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
    ax.fill_between(zs, 2.0 - zs, 1.625, where=zs > 0.375, color="tab:green", alpha=0.15,
                    label="BITCOS smaller (z > 0.375)")
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
    p = subparsers.add_parser("stats", help="zero density and bits per weight of a model (paper Table I row)",
                              description=__doc__.splitlines()[0])
    p.add_argument("input", type=Path, metavar="IN.gguf")
    p.add_argument("--tensors", action="store_true", help="also list every ternary tensor")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="draw the paper's Fig. 1 view")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    m = collect(args.input, progress=not args.quiet and not args.json)
    print(to_json(m, args.tensors) if args.json else format_text(m, args.tensors))
    if args.plot:
        plot(m, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0
