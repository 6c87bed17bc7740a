"""`ggml-bitcos bench bandwidth`: where BITCOS wins — GEMV and decode speed against the DRAM bandwidth left
per compute thread.

BITCOS reads 2 - z bits per weight where TQ2_0 reads 2.06: it wins once a thread's share of DRAM bandwidth,
not its instruction rate, bounds the GEMV. A 2-core VM gives its one compute thread ~30 GB/s (the
bandwidth-rich extreme); a many-core server gives each core a few GB/s. This benchmark simulates the
latter honestly: traffic generators (csrc/bitcos-traffic.c, one process per other CPU, pinned there) read,
write or copy a buffer much larger than the last-level cache while one compute thread, pinned to the first CPU,

  1. measures the read bandwidth it has left (llama-bitcos-bench bandwidth: beta per core),
  2. times the same ternary GEMV as BITCOS (--bitcos-types, default MATRIX and B256: what `convert` writes)
     and TQ2_0 / TQ1_0 through ggml's MUL_MAT (llama-bitcos-bench gemv, repetitions interleaving the types,
     in rounds: ratios per round, printed with their spread),
  3. optionally runs llama-bench decode (tg) on a TQ2_0 model and its BITCOS conversion (--models),

for each traffic level. The roofline max(bytes / beta, weights / 32 * gamma / f) of each type, with gamma
(cycles per 32 weights, L1-resident) measured in the same invocation, predicts the speed ratio over all
beta; the crossover is where the prediction reaches 1. Each level also gets the in-memory form ggml-cpu's
decision rule (csrc/bitcos-form.h, docs/KERNELS.md §9) would choose at the beta measured there: "choice: bitcos"
or "codes", from the gamma of both forms on that rule's own 64 x 2048 tile.

    ggml-bitcos bench bandwidth [--levels none,read,write,copy] [--rows 16384 --k 16384] [--z 0.42]
                                [--bitcos-types bitcos_matrix,bitcos_b256]
                                [--models tq2_0.gguf,bitcos.gguf] [--json out.json] [--plot out.png]

A level is MODE[:RATE][*COUNT]: MODE none|read|write|copy, RATE the GB/s each generator aims at (default:
flat out), COUNT the number of generator processes (default: one per CPU but the compute CPU). On a machine
with many cores, "copy*1,copy*3,copy*7,..." sweeps down the bandwidth per core.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ggml_bitcos.bench import timing
from ggml_bitcos.bench.common import (
    DEFAULT_BITCOS_TYPES,
    add_bitcos_types_argument,
    bench_workdir,
    bitcos_variant,
    machine_line,
    pyplot,
    run_tool,
    save_figure,
    tsc_ghz,
    write_json,
)
from ggml_bitcos.bench.gemv import REF_ZERO_DENSITY, merge_tool_rounds, write_gemv_gguf
from ggml_bitcos.bench.traffic import Level, compute_cpu, generator_cpus, parse_level, pinned, traffic

REFS = ("tq2_0", "tq1_0")


# -------------------------------------------------------------------------------------- measurement
def measure_level(
    level: Level,
    gemv_files: list[tuple[float | None, Path]],
    reps: int,
    models: list[Path] | None,
    n_gen: int,
    tg_reps: int,
    rounds: int = 3,
) -> dict[str, Any]:
    """beta left to the compute CPU, GEMV times per type and (with models) llama-bench tg, under `level`; the
    GEMV and tg in `rounds` rounds, each timing every type (medians over rounds, "rounds_us" / "tg_rounds_ts":
    the per-round values)."""
    from ggml_bitcos import llama_run

    gen_cpus = generator_cpus()  # before pinning this process to the compute CPU
    gemv_runs: list[list[dict[str, Any]]] = []
    tg_runs: list[list[dict[str, Any]]] = []
    with pinned(compute_cpu()):
        ctx = traffic(level, gen_cpus) if level.mode != "none" else _no_traffic()
        with ctx as gen_stats:
            beta = run_tool(["bandwidth", "512", "1", "5"])[0]["gb_per_s"]
            for _ in range(rounds):
                gemv_runs.append(
                    run_tool(["gemv", ",".join(str(p) for _, p in gemv_files), "1", str(reps), "1", "interleaved"])
                )
                if models:
                    tg_runs.append(
                        llama_run.run_bench(models, n_prompt=0, n_gen=n_gen, threads=[1], repetitions=tg_reps)
                    )
            beta_after = run_tool(["bandwidth", "512", "1", "5"])[0]["gb_per_s"]
    times = {}
    for rec in merge_tool_rounds(gemv_runs):
        t = rec["tensor"].split(".", 1)[1]
        times[t] = {
            "median_us": rec["median_us"],
            "rounds_us": rec["rounds_us"],
            "bytes": rec["bytes"],
            "weights": rec["rows"] * rec["k"],
        }
    tg_rounds: dict[str, list[float]] = {}
    for run in tg_runs:
        for r in run:
            if r.get("n_gen", 0) > 0:
                tg_rounds.setdefault(Path(r["model_filename"]).name, []).append(r["avg_ts"])
    return {
        "level": level.label,
        "beta_gb_s": 0.5 * (beta + beta_after),
        "beta_before": beta,
        "beta_after": beta_after,
        "generators": gen_stats,
        "generated_gb_s": sum(g["gb_per_s"] for g in gen_stats),
        "gemv": times,
        "tg_ts": {name: timing.median(v) for name, v in tg_rounds.items()},
        "tg_rounds_ts": tg_rounds,
    }


@contextmanager
def _no_traffic() -> Iterator[list[dict[str, Any]]]:
    yield []


def gammas(
    log: Callable[[str], Any], impl: str | None = None, bitcos_types: Sequence[str] = DEFAULT_BITCOS_TYPES
) -> dict[str, float]:
    """Cycles (TSC ticks) per 32 weights, L1-resident, one thread: ggml's own vec_dot for TQ2_0/TQ1_0 and, for
    each of `bitcos_types`, the BITCOS kernel of the harness that the installed ggml runs (`impl`; default the
    best this CPU has: match it to the llama.cpp build, e.g. "avx2" for a GGML_NATIVE=OFF x86-64-v3 build) —
    the roofline's instruction cost."""
    g = {t: run_tool(["gamma", t, "2048", "8", "2000"])[0]["cycles_per_32"] for t in REFS}
    try:
        from ggml_bitcos.bench.kernels import gamma_l1

        g.update(gamma_l1(impl=impl, types=bitcos_types))
    except Exception as e:  # harness missing: no BITCOS prediction
        log(f"# BITCOS gamma unavailable ({e})")
    return g


def form_gammas(log: Callable[[str], Any], impl: str | None, z: float) -> dict[str, Any] | None:
    """gamma of the BITCOS and the 2-bit codes kernel (ns per 32 weights, one thread) on the tile ggml-cpu's form
    decision measures at load (bitcos_form_measure_gamma), for kernel `impl` (default: the best here); None
    without the harness."""
    try:
        from ggml_bitcos import harness

        impl = impl or harness.best_kernel()
        gb, gc = harness.form_measure_gamma(impl, z, 0.05)
    except Exception as e:  # harness missing: no choice
        log(f"# form gamma unavailable ({e})")
        return None
    return {"kernel": impl, "bitcos_ns": gb, "codes_ns": gc}


def form_choice(fg: dict[str, Any], beta_gb_s: float, z: float) -> dict[str, Any]:
    """The form bitcos_form_choose picks for one compute thread at beta_gb_s: form, bytes and predicted ns per 32
    weights of each."""
    from ggml_bitcos import harness

    return harness.form_choose(fg["bitcos_ns"], fg["codes_ns"], beta_gb_s, 1, z)


def predicted_us(n_weights: int, n_bytes: int, gamma: float, beta_gb_s: float, ghz: float) -> float:
    """Roofline time of one GEMV: the slower of streaming its bytes at beta and executing it at gamma."""
    return max(n_bytes / (beta_gb_s * 1e3), n_weights / 32 * gamma / (ghz * 1e3))


def predicted_ratio(rec: dict[str, Any], t: str, ref: str, gam: dict[str, float], beta: float, ghz: float) -> float:
    """Predicted speed of type t relative to ref (> 1: t faster) at beta GB/s per core."""
    a, b = rec["gemv"][t], rec["gemv"][ref]
    return predicted_us(b["weights"], b["bytes"], gam[ref], beta, ghz) / predicted_us(
        a["weights"], a["bytes"], gam[t], beta, ghz
    )


def crossover_beta(rec: dict[str, Any], t: str, ref: str, gam: dict[str, float], ghz: float) -> float | None:
    """Bandwidth per core (GB/s) below which the roofline predicts t faster than ref (None: never/always)."""
    grid = np.geomspace(0.25, 200.0, 4000)
    r = np.array([predicted_ratio(rec, t, ref, gam, b, ghz) for b in grid])
    faster = r > 1.0
    if faster.all() or not faster.any():
        return None
    i = int(np.argmax(~faster))  # first beta at which t is no longer faster
    return float(grid[i])


def bench_bandwidth(
    levels: list[Level],
    rows: int,
    k: int,
    z: float,
    reps: int,
    workdir: Path,
    models: list[Path] | None = None,
    n_gen: int = 32,
    tg_reps: int = 1,
    kernel_impl: str | None = None,
    log: Callable[[str], Any] = print,
    rounds: int = 3,
    bitcos_types: Sequence[str] = DEFAULT_BITCOS_TYPES,
) -> dict[str, Any]:
    """Every level's measurements, the gammas and the roofline prediction of each of `bitcos_types` (see the
    module docstring)."""
    workdir.mkdir(parents=True, exist_ok=True)
    types = list(bitcos_types)
    ref = workdir / f"bw-ref-{rows}x{k}.gguf"
    bc = workdir / f"bw-{'-'.join(types)}-{rows}x{k}-z{z:.3f}.gguf"  # a kept --workdir holds one file per type set
    if not ref.exists():
        write_gemv_gguf(ref, rows, k, REF_ZERO_DENSITY, list(REFS))
    if not bc.exists():
        write_gemv_gguf(bc, rows, k, z, types, seed=1)
    with pinned(compute_cpu()):
        gam = gammas(log, kernel_impl, types)
        fg = form_gammas(log, kernel_impl, z)
    ghz = tsc_ghz()
    out = []
    for lv in levels:
        rec = measure_level(lv, [(None, ref), (z, bc)], reps, models, n_gen, tg_reps, rounds)
        rec["predicted"] = {t: predicted_ratio(rec, t, "tq2_0", gam, rec["beta_gb_s"], ghz) for t in types if t in gam}
        if fg is not None:
            rec["form_choice"] = form_choice(fg, rec["beta_gb_s"], z)
        out.append(rec)
        log(
            f"# {lv.label}: beta {rec['beta_gb_s']:.1f} GB/s, generators {rec['generated_gb_s']:.1f} GB/s, "
            + ", ".join(f"{t} {v['median_us']:.0f} us" for t, v in rec["gemv"].items())
        )
    cross = {t: crossover_beta(out[0], t, "tq2_0", gam, ghz) for t in types if t in gam}
    return {
        "levels": out,
        "gamma": gam,
        "tsc_ghz": ghz,
        "crossover_gb_s": cross,
        "form_gamma": fg,
        "z": z,
        "rows": rows,
        "k": k,
        "bitcos_types": types,
    }


# ------------------------------------------------------------------------------------------- output
def gemv_rounds(rec: dict[str, Any], t: str) -> list[float]:
    """Per-round GEMV µs of type t at one level (its one value in a record made before rounds)."""
    g = rec["gemv"][t]
    return g.get("rounds_us", [g["median_us"]])


def tg_ratio(rec: dict[str, Any]) -> timing.RatioSpread | None:
    """Per-round llama-bench tg ratio of the BITCOS model (its file name contains "bitcos") to the other one
    at one level; None without exactly those two models."""
    tg = rec.get("tg_rounds_ts") or {name: [v] for name, v in rec["tg_ts"].items()}
    bc = next((n for n in tg if "bitcos" in n), None)
    other = next((n for n in tg if n != bc), None)
    if len(tg) != 2 or bc is None or other is None:
        return None
    return timing.speed_ratio(tg[bc], tg[other])


def variant_label(t: str) -> str:
    """The short name of a BITCOS type in the ratio keys and table columns: bitcos_matrix -> "matrix"."""
    return bitcos_variant(t).name.lower()


def level_ratios(rec: dict[str, Any], bitcos_types: Sequence[str]) -> dict[str, timing.RatioSpread]:
    """The measured ratios of one level with their spread: the GEMV of every BITCOS type against TQ2_0
    ("matrix_vs_tq2_0", ...), the first type against TQ1_0, and tg BITCOS against the other model (when
    measured)."""
    first = bitcos_types[0]
    out = {
        f"{variant_label(t)}_vs_tq2_0": timing.time_ratio(gemv_rounds(rec, "tq2_0"), gemv_rounds(rec, t))
        for t in bitcos_types
    }
    out[f"{variant_label(first)}_vs_tq1_0"] = timing.time_ratio(gemv_rounds(rec, "tq1_0"), gemv_rounds(rec, first))
    tg = tg_ratio(rec)
    if tg is not None:
        out["tg_bitcos_vs_other"] = tg
    return out


def bandwidth_table(res: dict[str, Any]) -> str:
    """Markdown: per level, beta left, generated traffic, GEMV speed ratios measured (median of the per-round
    ratios with their range, or "within noise") vs predicted for the first BITCOS type, the others' measured
    ratios to TQ2_0, the first's to TQ1_0, tg ratio."""
    types = res["bitcos_types"]
    first, others = variant_label(types[0]), [variant_label(t) for t in types[1:]]
    head = first.upper()
    lines = [
        f"| level | beta left GB/s | generators GB/s | TQ2_0 µs | {head} µs | {head}/TQ2_0 measured | predicted | "
        + "".join(f"{o.upper()}/TQ2_0 | " for o in others)
        + f"{head}/TQ1_0 | tg BITCOS/TQ2_0 |",
        "|---" * (9 + len(others)) + "|",
    ]
    for r in res["levels"]:
        ratios = level_ratios(r, types)
        tgr = ratios["tg_bitcos_vs_other"].cell() if "tg_bitcos_vs_other" in ratios else "-"
        lines.append(
            f"| {r['level']} | {r['beta_gb_s']:.1f} | {r['generated_gb_s']:.1f} | "
            f"{timing.value_cell(gemv_rounds(r, 'tq2_0'), 0)} | {timing.value_cell(gemv_rounds(r, types[0]), 0)} | "
            f"{ratios[f'{first}_vs_tq2_0'].cell()} | {r['predicted'].get(types[0], float('nan')):.3f}x | "
            + "".join(f"{ratios[f'{o}_vs_tq2_0'].cell()} | " for o in others)
            + f"{ratios[f'{first}_vs_tq1_0'].cell()} | {tgr} |"
        )
    cross = ", ".join(
        f"{t}: {'none in 0.25-200 GB/s' if b is None else f'{b:.1f} GB/s'}" for t, b in res["crossover_gb_s"].items()
    )
    gam = ", ".join(f"{t} {g:.2f}" for t, g in res["gamma"].items())
    n_rounds = max(len(gemv_rounds(r, "tq2_0")) for r in res["levels"])
    lines += [
        "",
        f"µs: median (min-max) over {n_rounds} round(s); measured ratios: median of the per-round ratios (min-max)",
        f"gamma (TSC ticks / 32 weights, L1): {gam}; TSC {res['tsc_ghz']:.2f} GHz",
        f"predicted crossover (BITCOS faster than TQ2_0 below): {cross}",
    ]
    fg = res.get("form_gamma")
    if fg:
        lines.append(
            f"in-memory form (csrc/bitcos-form.h, 1 thread, {fg['kernel']}: gamma bitcos {fg['bitcos_ns']:.3f} ns, "
            f"codes {fg['codes_ns']:.3f} ns per 32 weights):"
        )
    for r in res["levels"]:
        c = r.get("form_choice")
        if c:
            lines.append(
                f"  {r['level']}: choice: {c['form']} (t_bitcos {c['t_bitcos']:.3f} ns, t_codes {c['t_codes']:.3f} ns "
                f"at {r['beta_gb_s']:.1f} GB/s)"
            )
    return "\n".join(lines)


def bandwidth_plot(res: dict[str, Any], out: Path, title: str) -> None:
    """Speed ratio vs TQ2_0 against the bandwidth per core: measured GEMV (and tg) points, the roofline
    curve, the crossover and the byte ratio."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    base = res["levels"][0]
    betas = [r["beta_gb_s"] for r in res["levels"]]
    grid = np.geomspace(1.0, max(60.0, 1.3 * max(betas)), 300)
    for i, t in enumerate(res["bitcos_types"]):
        color = f"C{i}"
        if t not in res["gamma"]:
            continue
        pred = [predicted_ratio(base, t, "tq2_0", res["gamma"], b, res["tsc_ghz"]) for b in grid]
        ax.plot(grid, pred, "-", color=color, alpha=0.6, label=f"{t.upper()} roofline")
        meas = [timing.time_ratio(gemv_rounds(r, "tq2_0"), gemv_rounds(r, t)).median for r in res["levels"]]
        ax.plot(betas, meas, "o", color=color, label=f"{t.upper()} GEMV measured")
        cb = res["crossover_gb_s"].get(t)
        if cb is not None:
            ax.axvline(cb, color=color, linestyle=":", alpha=0.8)
            ax.annotate(
                f"{t.upper()} crossover {cb:.1f} GB/s",
                (cb, 1.0),
                textcoords="offset points",
                xytext=(4, 8 + 14 * i),
                fontsize=8,
                color=color,
            )
    tg_pts = [(r["beta_gb_s"], tg.median) for r in res["levels"] if (tg := tg_ratio(r)) is not None]
    if tg_pts:
        ax.plot(
            [p[0] for p in tg_pts],
            [p[1] for p in tg_pts],
            "s",
            color=f"C{len(res['bitcos_types'])}",
            label="tg (llama-bench, 1 thread)",
        )
    first = res["bitcos_types"][0]
    byte_ratio = base["gemv"]["tq2_0"]["bytes"] / base["gemv"][first]["bytes"]
    ax.axhline(
        byte_ratio,
        color="C0",
        linestyle="--",
        alpha=0.4,
        label=f"byte ratio {variant_label(first).upper()} {byte_ratio:.2f}x",
    )
    ax.axhline(1.0, color="k", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("DRAM read bandwidth left to the compute thread (GB/s per core)")
    ax.set_ylabel("speed vs TQ2_0 (> 1: BITCOS faster)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    save_figure(fig, out, title)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds `bench bandwidth` to the `bench` subparsers."""
    b = sub.add_parser(
        "bandwidth",
        help="GEMV/decode speed vs the DRAM bandwidth left per core (traffic generators on the other CPUs)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument(
        "--levels",
        default="none,read,write,copy",
        help="comma list of MODE[:RATE][*COUNT] (default none,read,write,copy)",
    )
    b.add_argument("--rows", type=int, default=16384)
    b.add_argument("--k", type=int, default=16384)
    b.add_argument("--z", type=float, default=0.42, help="zero density of the BITCOS weights (default 0.42)")
    add_bitcos_types_argument(b, "to time and predict (the first is the table's main column)")
    b.add_argument("--reps", type=int, default=7, help="GEMV repetitions per round (default 7)")
    timing.add_rounds_argument(b, 3, "the GEMV of every type (and llama-bench tg over --models) per level")
    b.add_argument(
        "--models",
        default=None,
        help="comma list of GGUF models for llama-bench tg at 1 thread per level (e.g. a TQ2_0 "
        "model and its BITCOS conversion; the BITCOS file's name must contain 'bitcos')",
    )
    b.add_argument("--n-gen", type=int, default=32)
    b.add_argument("--tg-reps", type=int, default=1, help="llama-bench repetitions per round (default 1)")
    b.add_argument(
        "--kernel-impl",
        default=None,
        help="BITCOS kernel whose L1 cost the roofline uses, a name of the harness library's kernel "
        "table (default: the best this CPU has; use the one the installed llama.cpp was built "
        "for, e.g. avx2 for GGML_NATIVE=OFF)",
    )
    b.add_argument("--workdir", type=Path, default=None)
    b.add_argument("--json", type=Path)
    b.add_argument("--plot", type=Path)
    b.set_defaults(func=run)
    return b


def run(args: argparse.Namespace) -> int:
    """`bench bandwidth`: measure every level, print the table, write JSON and figure when asked."""
    ncpu = len(os.sched_getaffinity(0))
    if ncpu < 2:
        print("bench bandwidth: needs at least 2 CPUs (one computes, the others generate traffic)", file=sys.stderr)
        return 2
    try:
        levels = [parse_level(x, ncpu - 1) for x in args.levels.split(",") if x.strip()]
    except argparse.ArgumentTypeError as e:
        print(f"bench bandwidth: {e}", file=sys.stderr)
        return 2
    models = [Path(m) for m in args.models.split(",")] if args.models else None
    with bench_workdir(args.workdir) as wd:
        res = bench_bandwidth(
            levels,
            args.rows,
            args.k,
            args.z,
            args.reps,
            wd,
            models,
            args.n_gen,
            args.tg_reps,
            args.kernel_impl,
            rounds=args.rounds,
            bitcos_types=args.bitcos_types,
        )
    title = (
        f"ggml-bitcos bench bandwidth, {args.rows}x{args.k}, z={args.z}, compute on CPU {compute_cpu()} "
        f"— {machine_line([1])}"
    )
    res["machine"] = title
    for lv in res["levels"]:
        lv["ratios"] = {name: spread.as_json() for name, spread in level_ratios(lv, res["bitcos_types"]).items()}
    print(f"# {title}")
    print(bandwidth_table(res))
    if args.json:
        write_json(args.json, res)
    if args.plot:
        bandwidth_plot(res, args.plot, title)
        print(f"# plot: {args.plot}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m ggml_bitcos.bench.bandwidth")
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_parser(sub)
    args = ap.parse_args(["bandwidth", *argv])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
