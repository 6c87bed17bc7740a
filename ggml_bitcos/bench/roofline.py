"""`ggml-bitcos bench roofline`: the roofline of the GEMV (paper Table II / Fig. 10).

Measured per-thread read bandwidth beta and instruction cost gamma (cycles per 32 weights, L1-resident),
the bound they predict for each type and zero density, next to the measured GEMV time.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ggml_bitcos.bench import timing
from ggml_bitcos.bench.common import (
    DEFAULT_BITCOS_TYPES,
    add_bitcos_types_argument,
    bench_workdir,
    default_threads,
    machine_line,
    parse_floats,
    parse_ints,
    read_bandwidth_gb_s,
    run_tool,
    tsc_ghz,
    write_json,
)
from ggml_bitcos.bench.gemv import REF_TYPES, bench_gemv, rounds_us


def bench_roofline(
    threads: list[int],
    zs: list[float],
    rows: int,
    k: int,
    reps: int,
    workdir: Path,
    log: Callable[[str], Any] = print,
    rounds: int = 3,
    bitcos_types: Sequence[str] = DEFAULT_BITCOS_TYPES,
) -> dict[str, Any]:
    """beta (GB/s per thread count), gamma (cycles/32 weights), predicted vs measured GEMV time of the
    references and `bitcos_types` (the GEMV in `rounds` interleaved rounds, bench_gemv)."""
    beta = {nt: read_bandwidth_gb_s(nt) for nt in threads}
    gam: dict[str, float] = {}
    for t in REF_TYPES:
        gam[t] = run_tool(["gamma", t, "2048", "8", "2000"])[0]["cycles_per_32"]
    try:
        from ggml_bitcos.bench.kernels import gamma_l1

        gam.update(gamma_l1(types=bitcos_types))
    except Exception as e:  # kernel harness not built: roofline without BITCOS gamma
        log(f"# BITCOS gamma unavailable ({e}); build the harness with `pip install .`")
    ghz = tsc_ghz()
    res = bench_gemv(rows, k, zs, threads, reps, workdir, list(bitcos_types), list(REF_TYPES), log, rounds=rounds)
    rows_out = []
    for r in res:
        n_w = r["rows"] * r["k"]
        nt = r["threads"]
        t_mem = r["bytes"] / (beta[nt] * 1e3)  # µs at the measured bandwidth
        g = gam.get(r["type"], float("nan"))
        t_ins = (n_w / 32) * g / (ghz * 1e3) / nt  # µs if instruction-bound
        bound = "memory" if t_mem >= t_ins else "instructions"
        rows_out.append(
            {**r, "t_mem_us": t_mem, "t_ins_us": t_ins, "predicted_us": max(t_mem, t_ins), "bound": bound, "gamma": g}
        )
    return {"beta_gb_s": beta, "gamma_cycles_per_32": gam, "tsc_ghz": ghz, "rows": rows_out}


def roofline_table(rf: dict[str, Any]) -> str:
    """Markdown tables of beta per thread count, gamma per kernel and predicted vs measured GEMV time."""
    out = ["| threads | beta GB/s |", "|---|---|"]
    out += [f"| {nt} | {b:.2f} |" for nt, b in rf["beta_gb_s"].items()]
    out += ["", "| kernel | gamma (cycles / 32 weights, L1) |", "|---|---|"]
    out += [f"| {t} | {g:.3f} |" for t, g in rf["gamma_cycles_per_32"].items()]
    out += [
        "",
        "| type | z | threads | memory-bound µs | instr-bound µs | predicted | bound | measured µs (min-max) "
        "| measured/predicted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rf["rows"]:
        zs = "-" if r["z"] is None else f"{r['z']:.2f}"
        out.append(
            f"| {r['type']} | {zs} | {r['threads']} | {r['t_mem_us']:.0f} | {r['t_ins_us']:.0f} | "
            f"{r['predicted_us']:.0f} | {r['bound']} | {timing.value_cell(rounds_us(r), 0)} | "
            f"{timing.value_cell([t / r['predicted_us'] for t in rounds_us(r)])} |"
        )
    return "\n".join(out)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds `bench roofline` to the `bench` subparsers."""
    r = sub.add_parser("roofline", help="beta, gamma and the roofline prediction (paper Table II / Fig. 10)")
    r.add_argument("--rows", type=int, default=32768)
    r.add_argument("--k", type=int, default=16384)
    r.add_argument("--z", type=parse_floats, default=[0.0, 0.3, 0.4, 0.5, 0.95])
    r.add_argument("--threads", type=parse_ints, default=default_threads())
    r.add_argument("--reps", type=int, default=7, help="GEMV repetitions per round (default 7)")
    timing.add_rounds_argument(r, 3, "the GEMV of every type and z")
    add_bitcos_types_argument(r, "to predict and time at every z")
    r.add_argument("--workdir", type=Path, default=None)
    r.add_argument("--json", type=Path)
    r.set_defaults(func=run)
    return r


def run(args: argparse.Namespace) -> int:
    """`bench roofline`: measure, print the tables, write JSON when asked."""
    with bench_workdir(args.workdir) as wd:
        rf = bench_roofline(
            args.threads, args.z, args.rows, args.k, args.reps, wd, rounds=args.rounds, bitcos_types=args.bitcos_types
        )
    print(f"# ggml-bitcos bench roofline — {machine_line(args.threads)}; TSC {rf['tsc_ghz']:.2f} GHz")
    print(roofline_table(rf))
    if args.json:
        write_json(args.json, rf, default=str)
    return 0
