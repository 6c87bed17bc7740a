"""`ggml-bitcos bench kernels`: cycles per 32 weights of every BITCOS CPU kernel of the harness library.

L1-resident microbenchmark (default 16 rows x 2048 weights: ~4-9 KB of weights and signs) on the standalone
harness library (ggml_bitcos.harness). Each configuration is timed in C with rdtsc around single kernel
calls (Python never sits inside the timed region), in rounds that each time every implementation; the table
shows the median over the rounds' medians (or the minimum), the speed-ups with their spread over rounds.
rdtsc counts reference cycles at the constant TSC frequency, which equals core cycles only when the core
runs at its nominal clock (see docs/KERNELS.md).

    ggml-bitcos bench kernels [--rows 16] [--k 2048] [--nc 1,4,16] [--z 0,0.4,0.95] [--variant g128] [--no-fma]
                              [--no-codes]

Each kernel is timed on the BITCOS weight and, as NAME/2bit, on the same weight decoded into the 2-bit codes
form (docs/KERNELS.md §8), in the same rounds, with the per-round ratio 2bit / BITCOS.

Variants (FORMAT.md §4.2): g128 and pt (version 1), matrix, row, b128, b256 (version 2); a comma list times
several, each on its own table. --k must be a multiple of the variant's row-length multiple (32 for matrix /
row, whose last 128-weight unit is partial when k % 128 != 0; 128 for g128 / pt / b128; 256 for b256).
    python -m ggml_bitcos.bench.kernels ...
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Final

import numpy as np

from ggml_bitcos import harness
from ggml_bitcos.bench import timing
from ggml_bitcos.bench.common import DEFAULT_BITCOS_TYPES, bitcos_variant, parse_floats, parse_ints, platform_cpu
from ggml_bitcos.format import Variant
from ggml_bitcos.q8k import random_q8k
from ggml_bitcos.ternary import random_codes


VARIANT_NAMES: Final = tuple(v.name.lower() for v in Variant)
CODES_SUFFIX: Final = "/2bit"  # a kernel's codes-form column: "avx512/2bit"


def parse_variants(text: str) -> list[Variant]:
    """``--variant``: a comma list of variant names (any case), e.g. ``g128`` or ``matrix,b256``."""
    out: list[Variant] = []
    for name in (n.strip() for n in text.split(",")):
        if name.lower() not in VARIANT_NAMES:
            raise argparse.ArgumentTypeError(f"unknown variant {name!r}; choose from {', '.join(VARIANT_NAMES)}")
        out.append(Variant[name.upper()])
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class KernelTiming:
    """One configuration's timing: TSC ticks per 32 weight x column products."""

    impl: str
    variant: str
    rows: int
    k: int
    nc: int
    zero_density: float
    cycles_per_32: float  # median over rounds of each round's median TSC ticks per 32 weight x column products
    cycles_per_32_min: float  # best repeat of all rounds
    rounds_median: tuple[float, ...]  # each round's median (round order: the speed-ups pair them)
    rounds_min: tuple[float, ...]  # each round's best repeat


def generic_reps(reps: int) -> int:
    """Timed calls of the slow scalar kernel: fewer than `reps`, so the whole table takes a few seconds."""
    return max(5, reps // 10)


def measure(
    impls: list[str],
    variant: Variant,
    rows: int,
    k: int,
    ncs: list[int],
    zs: list[float],
    reps: int,
    seed: int = 0,
    fma: bool = True,
    rounds: int = 3,
    codes_form: bool = False,
) -> list[KernelTiming]:
    """Times every (z, nc, impl) on the same random matrix and activations per (z, nc): `rounds` rounds, each
    timing every implementation with `reps` calls in turn (generic, avx2, avx512, generic, ...).

    Block scales (G128, B128, B256) are random, so nearly every Q8_K block of G128 / B128 has two different
    half scales (the contract's two-FMA case); a tensor converted from TQ2_0 has equal halves and runs slightly
    faster (B256 always has: one scale per Q8_K block). ROW gets random row scales, PT / MATRIX one scale.
    `codes_form`: also time each kernel's codes-form kernel on the weight decoded (as impl + CODES_SUFFIX)."""
    rng = np.random.default_rng(seed)
    variant = Variant(variant)
    vname = variant.name.lower()
    out: list[KernelTiming] = []
    for z in zs:
        codes = random_codes(rng, (rows, k), z)
        block_scales = (
            rng.uniform(0.0, 2.0, size=(rows, k // variant.scale_block)).astype(np.float16)
            if variant.scale_block
            else None
        )
        row_scales = rng.uniform(0.05, 2.0, size=rows).astype(np.float32) if variant is Variant.ROW else None
        w = harness.encode_rows(codes, variant, block_scales=block_scales, scale=0.5, row_scales=row_scales)
        w2 = harness.decode_codes(w, fma=fma)
        timed = impls + [i + CODES_SUFFIX for i in impls] if codes_form else list(impls)
        for nc in ncs:
            y = random_q8k(rng, nc, k)
            units = rows * k * nc / 32.0
            reference = harness.mm("generic", w, y, fma)
            for impl in impls:
                if impl != "generic" and not np.array_equal(
                    harness.mm(impl, w, y, fma).view(np.uint32), reference.view(np.uint32)
                ):
                    raise RuntimeError(f"{impl} differs from generic (z={z}, nc={nc}): not timing a wrong kernel")
                if codes_form and not np.array_equal(
                    harness.codes_mm(impl, w2, y, fma).view(np.uint32), reference.view(np.uint32)
                ):
                    raise RuntimeError(f"{impl}{CODES_SUFFIX} differs from generic (z={z}, nc={nc})")
            per_round: dict[str, list[np.ndarray]] = {impl: [] for impl in timed}
            for _ in range(rounds):
                for impl in timed:
                    kernel = impl.removesuffix(CODES_SUFFIX)
                    n = generic_reps(reps) if kernel == "generic" else reps
                    t = (
                        harness.time_codes_mm(kernel, w2, y, n, fma)
                        if impl.endswith(CODES_SUFFIX)
                        else harness.time_mm(kernel, w, y, n, fma)
                    )
                    per_round[impl].append(t.astype(np.float64) / units)
            for impl in timed:
                medians = tuple(float(np.median(t)) for t in per_round[impl])
                mins = tuple(float(t.min()) for t in per_round[impl])
                out.append(
                    KernelTiming(impl, vname, rows, k, nc, z, float(np.median(medians)), min(mins), medians, mins)
                )
    return out


def best_impl(fma: bool = True) -> str:
    """The fastest implementation this CPU can run from the harness library (the kernel table's choice)."""
    return harness.best_kernel(fma)


def gamma_l1(
    rows: int = 16,
    k: int = 2048,
    z: float = 0.4,
    reps: int = 400,
    impl: str | None = None,
    rounds: int = 2,
    types: Sequence[str] = DEFAULT_BITCOS_TYPES,
) -> dict[str, float]:
    """Kernel cost gamma for the roofline (ggml_bitcos.bench.roofline): TSC ticks per 32 weights, L1-resident
    (rows x k, default 16 x 2048), one column (GEMV), single thread, zero density z, best implementation,
    minimum over `rounds` x `reps` calls. One key per name of `types` (bitcos_<variant>). Raises
    KernelLibraryNotFound when the harness library is not built. `impl`: the implementation to time instead of
    the best one (e.g. "avx2" to match a llama.cpp built for x86-64-v3)."""
    impl = impl or best_impl()
    out: dict[str, float] = {}
    for name in types:
        (t,) = measure([impl], bitcos_variant(name), rows, k, [1], [z], reps, rounds=rounds)
        out[name] = t.cycles_per_32_min
    return out


def format_table(timings: list[KernelTiming], impls: list[str], stat: str = "median") -> str:
    """Text table of ticks per 32 weights per (z, nc), one column per implementation, with the speed-ups
    over the generic kernel when it was timed (median of the per-round speed-ups with their range, or
    "within noise"), and of each codes-form column over its kernel on the BITCOS weight."""
    head = f"{'z':>5} {'nc':>4} " + " ".join(f"{i:>9}" for i in impls)
    speedups = "generic" in impls and len(impls) > 1
    if speedups:
        head += "   speedup vs generic (min-max over rounds)"
    lines = [head, "-" * len(head)]
    keys = sorted({(t.zero_density, t.nc) for t in timings})
    for z, nc in keys:
        row = {t.impl: t for t in timings if t.zero_density == z and t.nc == nc}
        value = {i: (t.cycles_per_32 if stat == "median" else t.cycles_per_32_min) for i, t in row.items()}
        per_round = {i: (t.rounds_median if stat == "median" else t.rounds_min) for i, t in row.items()}
        line = f"{z:5.2f} {nc:4d} " + " ".join(f"{value[i]:9.3f}" for i in impls)
        if speedups:
            line += "   " + "  ".join(
                f"{i}: {timing.time_ratio(per_round['generic'], per_round[i]).cell()}"
                for i in impls
                if i != "generic" and not i.endswith(CODES_SUFFIX)
            )
        codes = [i for i in impls if i.endswith(CODES_SUFFIX) and i.removesuffix(CODES_SUFFIX) in per_round]
        if codes:
            line += "   2bit vs BITCOS: " + "  ".join(
                f"{i.removesuffix(CODES_SUFFIX)}: "
                f"{timing.time_ratio(per_round[i.removesuffix(CODES_SUFFIX)], per_round[i]).cell()}"
                for i in codes
            )
        lines.append(line)
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `bench kernels` (shared by the subcommand and `python -m`)."""
    p.add_argument("--rows", type=int, default=16, help="rows of the weight matrix (default 16)")
    p.add_argument(
        "--k",
        type=int,
        default=2048,
        help="weights per row, a multiple of the variant's row-length multiple (default 2048)",
    )
    p.add_argument("--nc", type=parse_ints, default=[1, 4, 16], help="activation columns, comma list (default 1,4,16)")
    p.add_argument("--z", type=parse_floats, default=[0.0, 0.4, 0.95], help="zero densities (default 0,0.4,0.95)")
    p.add_argument(
        "--variant",
        type=parse_variants,
        default=[Variant.G128],
        help=f"comma list of {', '.join(VARIANT_NAMES)} (default g128)",
    )
    p.add_argument(
        "--impl",
        default="all",
        help="comma list of kernel names (the harness library's kernel table: generic, avx2, avx512 "
        "on x86-64) or 'all' (default)",
    )
    p.add_argument("--reps", type=int, default=400, help="timed calls per configuration and round (default 400)")
    timing.add_rounds_argument(p, 3, "every implementation")
    p.add_argument(
        "--stat",
        choices=("median", "min"),
        default="median",
        help="statistic over the repeats shown in the table (min is robust to other processes "
        "sharing the core; default median)",
    )
    p.add_argument("--json", action="store_true", help="print JSON records (median and min) instead of the table")
    p.add_argument(
        "--no-codes",
        action="store_true",
        help="time the kernels on the BITCOS weight only, not also on its 2-bit codes form (NAME/2bit)",
    )
    p.add_argument(
        "--no-fma",
        action="store_true",
        help="time the BITCOS_FMA=0 build (multiply, then add) instead of the fused one",
    )


def run(args: argparse.Namespace) -> int:
    """`bench kernels`: check the options and the library, time, print the table (or JSON records)."""
    fma = not args.no_fma
    try:
        harness.load_library(fma)
    except harness.KernelLibraryNotFound as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    bad_k = [v.name.lower() for v in args.variant if args.k % v.k_multiple]
    if args.k <= 0 or bad_k or args.rows <= 0:
        print(
            f"error: --k must be a positive multiple of {max(v.k_multiple for v in args.variant)} for "
            f"{','.join(v.name.lower() for v in args.variant)} and --rows positive",
            file=sys.stderr,
        )
        return 2
    names = list(harness.kernel_names(fma))
    wanted = names if args.impl == "all" else [i.strip() for i in args.impl.split(",")]
    unknown = [i for i in wanted if i not in names]
    if unknown:
        print(f"error: unknown kernel(s) {unknown}; choose from {names}", file=sys.stderr)
        return 2
    impls = [i for i in wanted if harness.available(i, fma)]
    skipped = [i for i in wanted if i not in impls]
    timings = {
        v: measure(
            impls,
            v,
            args.rows,
            args.k,
            args.nc,
            args.z,
            args.reps,
            fma=fma,
            rounds=args.rounds,
            codes_form=not args.no_codes,
        )
        for v in args.variant
    }
    columns = impls if args.no_codes else impls + [i + CODES_SUFFIX for i in impls]
    if args.json:
        print(json.dumps([asdict(t) for ts in timings.values() for t in ts], indent=1))
        return 0
    print(f"library: {harness.library_path(fma)}  cpu: {platform_cpu()}")
    if skipped:
        print(f"not available on this CPU/library: {', '.join(skipped)}")
    for v, ts in timings.items():
        print(
            f"\nBITCOS kernels, {v.name} (format version {v.version}), {args.rows} rows x {args.k} weights, "
            f"TSC ticks per 32 weights per column ({args.stat} over {args.rounds} rounds of {args.reps} calls; "
            f"generic {generic_reps(args.reps)}), BITCOS_FMA={int(fma)}"
        )
        print(format_table(ts, columns, args.stat))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds `bench kernels` to the `bench` subparsers; its handler is stored as `func`."""
    p = sub.add_parser(
        "kernels",
        help="cycles per 32 weights of the BITCOS CPU kernels (generic, AVX2, AVX-512)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def main(argv: list[str] | None = None) -> int:
    """`python -m ggml_bitcos.bench.kernels`: the same options and output as `ggml-bitcos bench kernels`."""
    parser = argparse.ArgumentParser(
        prog="python -m ggml_bitcos.bench.kernels",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
