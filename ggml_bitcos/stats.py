"""``ggml-bitcos stats``: the paper's Table I row for a model (source or BITCOS GGUF).

Measured: the zero density z of the ternary weights (every tensor ``convert`` would treat as ternary,
plus every BITCOS tensor, whose zeros come from its companion header: K·R − n_sign_bits). Derived, in
bits per ternary weight:

* BITCOS symbols only: 2 − z; with scales: G128 2.125 − z (fp16 per 128), PT 2 − z + 32·M / n;
* 2-bit packing, group 128: 2.000 symbols, 2.125 with an fp16 scale per 128;
* 5 trits per byte, group 128 (the paper's "5-trit"): 1.625 symbols (8/5 rounded up per 128: 26 bytes
  hold 130 trits -> 208 bits / 128), 1.750 with the scale;
* TQ1_0: 1.6875 (54 bytes / 256); TQ2_0: 2.0625 (66 bytes / 256);
* reduction factors: baseline / BITCOS (with scales) — > 1 means BITCOS is smaller;
* for BITCOS files, the actual bits: (weight + companion bytes) · 8 / weights.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gguf_tools import open_gguf, tensor_bytes, tensor_ggml_shape, type_name

from . import codec
from .convert import analyze_tensor, check_bitcos_file, is_candidate
from .format import BITCOS_TYPE_IDS, COMPANION_SUFFIX, Variant, bits_per_weight

# (symbols only, with scales) bits per weight of the fixed-rate baselines
BASELINES: dict[str, tuple[float, float]] = {
    "2-bit g128": (2.0, 2.125),
    "5-trit g128": (1.625, 1.75),
    "TQ1_0": (1.625, 1.6875),
    "TQ2_0": (2.0, 2.0625),
}


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


@dataclass
class ModelStats:
    path: str
    n_ternary_tensors: int
    n_weights: int
    n_zeros: int
    zero_density: float
    bitcos_symbols: float
    bitcos_g128: float
    bitcos_pt: float
    baselines: dict[str, dict[str, float]]
    reduction_g128: dict[str, float]
    reduction_pt: dict[str, float]
    bitcos_tensors: int = 0
    bitcos_weights: int = 0
    file_bits_per_weight: float | None = None          # over the BITCOS tensors of the file
    file_bits_formula: dict[str, float] = field(default_factory=dict)
    tensors: list[TensorStat] = field(default_factory=list)


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
        if t.tensor_type in BITCOS_TYPE_IDS:
            comp = by_name.get(t.name + COMPANION_SUFFIX)
            if comp is None:
                raise codec.FormatError(f"{path}: tensor '{t.name}': BITCOS weight without its companion")
            hdr = codec.parse_header(tensor_bytes(comp))
            n = k * n_rows
            stats.append(TensorStat(t.name, type_name(t.tensor_type), list(ne), n, n - hdr.n_sign_bits,
                                    1 - hdr.n_sign_bits / n, codec.n_mats_of(ne),
                                    8 * (int(t.n_bytes) + int(comp.n_bytes)) / n))
        else:
            r = analyze_tensor(t, "auto", want_codes=False).result
            if r.measured:
                stats.append(TensorStat(t.name, r.src_type, list(ne), r.n_weights, r.n_zeros, r.zero_density,
                                        codec.n_mats_of(ne)))
        bar.set_postfix_str(t.name, refresh=False)
        bar.update(int(t.n_bytes))
    bar.close()
    return summarize_stats(str(path), stats)


def summarize_stats(path: str, stats: list[TensorStat]) -> ModelStats:
    n = sum(s.n_weights for s in stats)
    nz = sum(s.n_zeros for s in stats)
    z = nz / n if n else 0.0
    mats = sum(s.n_mats for s in stats)
    g128 = bits_per_weight(Variant.G128, z)
    pt = bits_per_weight(Variant.PT, z) + (32 * mats / n if n else 0.0)
    baselines = {k: {"symbols": a, "with_scale": b} for k, (a, b) in BASELINES.items()}
    red_g = {k: b / g128 for k, (_a, b) in BASELINES.items()}
    red_p = {k: b / pt for k, (_a, b) in BASELINES.items()}
    bit = [s for s in stats if s.file_bits_per_weight is not None]
    m = ModelStats(path, len(stats), n, nz, z, 2.0 - z, g128, pt, baselines, red_g, red_p, tensors=stats)
    if bit:
        nb = sum(s.n_weights for s in bit)
        zb = sum(s.n_zeros for s in bit) / nb
        m.bitcos_tensors = len(bit)
        m.bitcos_weights = nb
        m.file_bits_per_weight = sum(s.file_bits_per_weight * s.n_weights for s in bit) / nb  # type: ignore[operator]
        kinds = {s.type for s in bit}
        m.file_bits_formula = {"G128 (2.125 - z)": bits_per_weight(Variant.G128, zb),
                               "PT (2 - z)": bits_per_weight(Variant.PT, zb), "z": zb,
                               "variants": ",".join(sorted(kinds))}  # type: ignore[dict-item]
    return m


def format_text(m: ModelStats, with_tensors: bool = False) -> str:
    out = [f"{m.path}",
           f"ternary tensors: {m.n_ternary_tensors}   weights: {m.n_weights:,}   "
           f"zero density z = {m.zero_density:.4f} ({100 * m.zero_density:.2f} % 0)"]
    if not m.n_weights:
        out.append("no ternary tensors found")
        return "\n".join(out)
    out.append("")
    out.append(f"{'layout':<22}{'symbols':>9}{'+scale':>9}{'red. vs G128':>14}{'red. vs PT':>12}")
    out.append(f"{'BITCOS G128 (2-z)':<22}{m.bitcos_symbols:>9.3f}{m.bitcos_g128:>9.3f}")
    out.append(f"{'BITCOS PT   (2-z)':<22}{m.bitcos_symbols:>9.3f}{m.bitcos_pt:>9.3f}")
    for k, v in m.baselines.items():
        out.append(f"{k:<22}{v['symbols']:>9.3f}{v['with_scale']:>9.4f}"
                   f"{m.reduction_g128[k]:>13.2f}x{m.reduction_pt[k]:>11.2f}x")
    out.append("reduction = baseline with scale / BITCOS with scale; > 1: BITCOS is smaller")
    if m.file_bits_per_weight is not None:
        f = m.file_bits_formula
        out.append(f"file: {m.bitcos_tensors} BITCOS tensors ({f['variants']}), {m.bitcos_weights:,} weights, "
                   f"{m.file_bits_per_weight:.4f} bits per weight incl. companion "
                   f"(formula: G128 {f['G128 (2.125 - z)']:.4f}, PT {f['PT (2 - z)']:.4f})")
    if with_tensors:
        out.append("")
        out.append(f"{'tensor':<36}{'type':<12}{'shape':<22}{'z':>8}{'file bpw':>10}")
        for s in m.tensors:
            fb = f"{s.file_bits_per_weight:.4f}" if s.file_bits_per_weight is not None else "-"
            out.append(f"{s.name:<36}{s.type:<12}{'x'.join(map(str, s.shape)):<22}{s.zero_density:>8.4f}{fb:>10}")
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
