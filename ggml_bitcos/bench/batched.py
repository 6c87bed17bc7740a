"""`ggml-bitcos bench batched`: batched decode — several sequences generated at once, where one decoded tile
of a BITCOS weight serves several activation columns.

Two views, both BITCOS vs TQ2_0 / TQ1_0 of the same model, ratios from one run:

1. ggml MUL_MAT with NCOLS = 1, 4, 8 columns (llama-bitcos-bench gemv, repetitions interleaving the types) on
   the model's largest ternary shape, BITCOS as --bitcos-types (default MATRIX and B256, what `convert`
   writes): the kernel cost per column of a batched decode step;
2. llama-server with `-np P` slots and P concurrent greedy completions of n tokens each (P = 1, 4, 8):
   aggregate generated tokens per second, the number a serving user sees. Every model runs once per round
   and the rounds alternate models, so a slow phase of a shared machine hits all of them.

Both views run in rounds; ratios are per-round ratios with their range (ggml_bitcos.bench.timing).

    ggml-bitcos bench batched [--preset bitnet-2b] [--zero-density 0.42] [--parallel 1,4,8] [--threads 2]
                              [--n-gen 64] [--rounds 2] [--bitcos-types bitcos_matrix,bitcos_b256]
                              [--workdir DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ggml_bitcos.bench import timing
from ggml_bitcos.bench.common import (
    DEFAULT_BITCOS_TYPES,
    add_bitcos_types_argument,
    bench_workdir,
    default_threads,
    machine_line,
    parse_ints,
    run_tool,
    write_json,
)
from ggml_bitcos.bench.e2e import e2e_models
from ggml_bitcos.bench.gemv import REF_ZERO_DENSITY, merge_tool_rounds, write_gemv_gguf

MODEL_TYPES = ("tq1_0", "tq2_0", "bitcos")
CTX_PER_SLOT = 256


def _completion(url: str, i: int, n_gen: int) -> dict[str, Any]:
    import requests

    r = requests.post(
        url + "/completion",
        timeout=1800,
        json={
            "prompt": f"Once upon a time, story number {i} began",
            "n_predict": n_gen,
            "temperature": 0,
            "seed": i,
            "ignore_eos": True,
            "cache_prompt": False,
        },
    )
    r.raise_for_status()
    return r.json()


def server_round(model: Path, parallel: list[int], threads: int, n_gen: int) -> list[dict[str, Any]]:
    """One llama-server with max(parallel) slots; for each P, P concurrent completions: aggregate tokens/s."""
    from ggml_bitcos import llama_run

    slots = max(parallel)
    out = []
    with llama_run.LlamaServer(model, threads=threads, ctx=slots * CTX_PER_SLOT, extra=["-np", str(slots)]) as srv:
        _completion(srv.url, 0, 4)  # warm-up: first-touch of the weights
        for p in parallel:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=p) as ex:
                res = list(ex.map(lambda i: _completion(srv.url, i, n_gen), range(p)))
            wall = time.perf_counter() - t0
            tokens = sum(int(r["tokens_predicted"]) for r in res)
            out.append(
                {
                    "parallel": p,
                    "tokens": tokens,
                    "wall_s": wall,
                    "agg_ts": tokens / wall,
                    "per_seq_ts": statistics.mean(float(r["timings"]["predicted_per_second"]) for r in res),
                }
            )
    return out


def bench_batched(
    workdir: Path,
    preset: str,
    z: float,
    parallel: list[int],
    threads: int,
    n_gen: int,
    rounds: int,
    gemm_shape: tuple[int, int],
    gemm_reps: int,
    log: Callable[[str], Any] = print,
    bitcos_types: Sequence[str] = DEFAULT_BITCOS_TYPES,
) -> dict[str, Any]:
    """Kernel columns sweep (the references and `bitcos_types`) and llama-server throughput per model and P, in
    `rounds` rounds that each run every type (medians over rounds; "rounds_us" / "rounds_ts": the per-round
    values)."""
    models = e2e_models(workdir, preset, z, log)
    rows, k = gemm_shape
    types = list(bitcos_types)
    ref = workdir / f"batched-ref-{rows}x{k}.gguf"
    bc = workdir / f"batched-{'-'.join(types)}-{rows}x{k}-z{z:.3f}.gguf"  # one file per type set in a kept workdir
    if not ref.exists():
        write_gemv_gguf(ref, rows, k, REF_ZERO_DENSITY, ["tq2_0", "tq1_0"])
    if not bc.exists():
        write_gemv_gguf(bc, rows, k, z, types, seed=1)
    gemm_runs: dict[int, list[list[dict[str, Any]]]] = {nc: [] for nc in parallel}
    for _ in range(rounds):  # each round every column count, each tool run interleaving the types
        for nc in parallel:
            gemm_runs[nc].append(
                run_tool(["gemv", f"{ref},{bc}", str(threads), str(gemm_reps), str(nc), "interleaved"])
            )
    gemm = [
        {
            "type": rec["tensor"].split(".", 1)[1],
            "ncols": nc,
            "median_us": rec["median_us"],
            "rounds_us": rec["rounds_us"],
        }
        for nc in parallel
        for rec in merge_tool_rounds(gemm_runs[nc])
    ]
    runs: dict[str, list[list[dict[str, Any]]]] = {t: [] for t in MODEL_TYPES}
    for i in range(rounds):
        for t in MODEL_TYPES:
            log(f"# round {i + 1}/{rounds}: llama-server {models[t].name}, -np {max(parallel)}")
            runs[t].append(server_round(models[t], parallel, threads, n_gen))
    server = []
    for t in MODEL_TYPES:
        for j, p in enumerate(parallel):
            vals = [rnd[j]["agg_ts"] for rnd in runs[t]]
            server.append(
                {
                    "type": t,
                    "parallel": p,
                    "agg_ts": statistics.median(vals),
                    "rounds_ts": vals,
                    "per_seq_ts": statistics.median(rnd[j]["per_seq_ts"] for rnd in runs[t]),
                    "tokens": [rnd[j]["tokens"] for rnd in runs[t]],
                }
            )
    return {
        "gemm": gemm,
        "server": server,
        "gemm_shape": [rows, k],
        "bitcos_types": types,
        "threads": threads,
        "n_gen": n_gen,
        "models": {t: str(p) for t, p in models.items()},
    }


def batched_table(res: dict[str, Any]) -> str:
    """Markdown: ggml MUL_MAT per column count and llama-server aggregate t/s per P (medians and ranges over
    rounds), with BITCOS's ratios (median of the per-round ratios with their range, or "within noise")."""
    rows, k = res["gemm_shape"]
    types = res["bitcos_types"]
    g = {(r["type"], r["ncols"]): r["rounds_us"] for r in res["gemm"]}
    out = [
        f"ggml MUL_MAT {rows} x {k}, {res['threads']} thread(s), µs per call, median (min-max) over rounds "
        "(ratio > 1: BITCOS faster)",
        "| columns | TQ2_0 µs | TQ1_0 µs | "
        + "".join(f"{t.upper()} µs | {t.upper()}/TQ2_0 | {t.upper()}/TQ1_0 | " for t in types),
        "|---" * (3 + 3 * len(types)) + "|",
    ]
    for nc in sorted({r["ncols"] for r in res["gemm"]}):
        a, b = g[("tq2_0", nc)], g[("tq1_0", nc)]
        cells = [
            f"{timing.value_cell(c, 0)} | {timing.time_ratio(a, c).cell()} | {timing.time_ratio(b, c).cell()} | "
            for c in (g[(t, nc)] for t in types)
        ]
        out.append(f"| {nc} | {timing.value_cell(a, 0)} | {timing.value_cell(b, 0)} | " + "".join(cells))
    s = {(r["type"], r["parallel"]): r["rounds_ts"] for r in res["server"]}
    out += [
        "",
        f"llama-server, {res['threads']} thread(s), P concurrent greedy completions of {res['n_gen']} "
        "tokens: aggregate generated tokens/s, median (min-max) over rounds",
        "| P | TQ1_0 t/s | TQ2_0 t/s | BITCOS t/s | BITCOS/TQ2_0 | BITCOS/TQ1_0 |",
        "|---|---|---|---|---|---|",
    ]
    for p in sorted({r["parallel"] for r in res["server"]}):
        a, b, c = (s[(t, p)] for t in ("tq1_0", "tq2_0", "bitcos"))
        out.append(
            f"| {p} | {timing.value_cell(a)} | {timing.value_cell(b)} | {timing.value_cell(c)} | "
            f"{timing.speed_ratio(c, b).cell()} | {timing.speed_ratio(c, a).cell()} |"
        )
    return "\n".join(out)


def batched_ratios(res: dict[str, Any]) -> list[dict[str, Any]]:
    """BITCOS's ratios of the tables with their spread, for the --json file: MUL_MAT per BITCOS type ("type"),
    llama-server for the converted model."""
    g = {(r["type"], r["ncols"]): r["rounds_us"] for r in res["gemm"]}
    s = {(r["type"], r["parallel"]): r["rounds_ts"] for r in res["server"]}
    out = []
    for nc in sorted({r["ncols"] for r in res["gemm"]}):
        for t in res["bitcos_types"]:
            for ref in ("tq2_0", "tq1_0"):
                spread = timing.time_ratio(g[(ref, nc)], g[(t, nc)])
                out.append({"view": "gemm", "type": t, "ncols": nc, "ref": ref, **spread.as_json()})
    for p in sorted({r["parallel"] for r in res["server"]}):
        for ref in ("tq2_0", "tq1_0"):
            spread = timing.speed_ratio(s[("bitcos", p)], s[(ref, p)])
            out.append({"view": "server", "parallel": p, "ref": ref, **spread.as_json()})
    return out


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds `bench batched` to the `bench` subparsers."""
    b = sub.add_parser(
        "batched",
        help="batched decode: MUL_MAT with 1/4/8 columns and llama-server with -np 1/4/8, BITCOS vs TQ2_0/TQ1_0",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("--preset", default="bitnet-2b")
    b.add_argument("--zero-density", type=float, default=0.42)
    b.add_argument("--parallel", type=parse_ints, default=[1, 4, 8])
    b.add_argument("--threads", type=int, default=max(default_threads()))
    b.add_argument("--n-gen", type=int, default=64)
    timing.add_rounds_argument(b, 2, "the MUL_MAT sweep and llama-server of every model")
    b.add_argument("--gemm-rows", type=int, default=6912, help="MUL_MAT rows (default: bitnet-2b's FFN)")
    b.add_argument("--gemm-k", type=int, default=2560)
    b.add_argument("--gemm-reps", type=int, default=15)
    add_bitcos_types_argument(b, "of the MUL_MAT sweep (llama-server runs the model `convert` writes)")
    b.add_argument("--workdir", type=Path, default=None, help="models are made once per workdir")
    b.add_argument("--json", type=Path)
    b.set_defaults(func=run)
    return b


def run(args: argparse.Namespace) -> int:
    """`bench batched`: measure, print the tables, write JSON when asked."""
    with bench_workdir(args.workdir) as wd:
        res = bench_batched(
            wd,
            args.preset,
            args.zero_density,
            args.parallel,
            args.threads,
            args.n_gen,
            args.rounds,
            (args.gemm_rows, args.gemm_k),
            args.gemm_reps,
            bitcos_types=args.bitcos_types,
        )
    title = f"ggml-bitcos bench batched, {args.preset} z={args.zero_density} — {machine_line([args.threads])}"
    res["machine"] = title
    res["ratios"] = batched_ratios(res)
    print(f"# {title}")
    print(batched_table(res))
    if args.json:
        write_json(args.json, res)
    return 0
