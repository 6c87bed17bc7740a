"""`ggml-bitcos bench gemv`: GEMV time over zero density, BITCOS vs TQ2_0 / TQ1_0 (paper Fig. 11).

Every type holds the same ternary matrix and runs through ggml's real CPU MUL_MAT (llama-bitcos-bench gemv);
each round is one tool run whose repetitions interleave all types (``--order grouped``: back to back,
cache-resident), and the ratios are per-round ratios with their spread (bench.timing). Q4_0 is a familiar
reference.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ggml_bitcos import codec
from ggml_bitcos.bench import timing
from ggml_bitcos.bench.common import (
    add_bitcos_types_argument,
    bench_workdir,
    bitcos_variant,
    default_threads,
    machine_line,
    parse_floats,
    parse_ints,
    pyplot,
    run_tool,
    save_figure,
    write_json,
)
from ggml_bitcos.format import QK_K, Variant
from ggml_bitcos.ternary import random_codes
from ggml_bitcos.tq import tq1_0_encode, tq2_0_encode

# the reference types every BITCOS type is compared with (table columns, roofline rows)
REF_TYPES = ("tq2_0", "tq1_0", "q4_0")
# the zero density of the reference weights: their speed does not depend on it
REF_ZERO_DENSITY = 0.4
REF_COLORS = {"tq2_0": "C3", "tq1_0": "C4", "q4_0": "C7"}


def gemv_codes(rows: int, k: int, z: float, seed: int) -> np.ndarray:
    """The benchmark's ternary matrix int8 (rows, k): zeros with probability z, balanced signs; the same
    for a given seed, so every type of one file holds the same weights."""
    return random_codes(np.random.default_rng(seed), (rows, k), z)


def _encoded_tensors(
    codes: np.ndarray, t: str, scale: np.float16
) -> list[tuple[str, Any, tuple[int, ...], np.ndarray]]:
    """GGUF tensors (name, type, ne, data) holding `codes` as type `t`: one weight, plus the companion for
    BITCOS."""
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    import gguf_tools

    rows, k = codes.shape
    ne = (k, rows)
    if t in ("tq2_0", "tq1_0"):
        encode = tq2_0_encode if t == "tq2_0" else tq1_0_encode
        gt = T.TQ2_0 if t == "tq2_0" else T.TQ1_0
        return [(f"w.{t}", gt, ne, encode(codes, np.full((rows, k // QK_K), scale)))]
    if t in ("q4_0", "q8_0"):  # ggml's common quant types, the references of backends without TQ2_0 (ggml-cuda)
        gt = T.Q4_0 if t == "q4_0" else T.Q8_0
        parts = [
            quants.quantize(codes[i : i + 1024].astype(np.float32) * np.float32(scale), gt)
            for i in range(0, rows, 1024)
        ]
        return [(f"w.{t}", gt, ne, np.concatenate(parts, axis=0))]
    # bitcos_<variant> (version 2: ggml type BITCOS; version 1: BITCOS_PT / BITCOS_G128); every scale is `scale`
    variant = bitcos_variant(t)
    if variant.scale_block:
        enc = codec.encode(codes, variant, block_scales=np.full((rows, k // variant.scale_block), scale))
    elif variant is Variant.ROW:
        enc = codec.encode(codes, variant, row_scales=np.full(rows, scale, np.float32))
    else:
        enc = codec.encode(codes, variant, matrix_scales=np.array([scale], np.float32))
    gt = gguf_tools.bitcos_type(variant)
    return [
        (f"w.{t}", gt, ne, enc.blocks),
        (f"w.{t}.bitcos", T.I8, (enc.companion.nbytes,), enc.companion.view(np.int8)),
    ]


def write_gemv_gguf(path: Path, rows: int, k: int, z: float, types: list[str], seed: int = 0) -> None:
    """One GGUF holding the same ternary matrix (zero density z) in each requested type."""
    from gguf import GGUFValueType

    import gguf_tools

    codes = gemv_codes(rows, k, z, seed)
    scale = np.float16(1.0 / np.sqrt(k))
    tensors = [tensor for t in types for tensor in _encoded_tensors(codes, t, scale)]
    del codes
    with gguf_tools.GGUFStreamWriter(path, arch="bitcos-bench", overwrite=True) as w:
        w.add_kv("general.architecture", "bitcos-bench", GGUFValueType.STRING)
        for name, gt, ne, _ in tensors:
            w.add_tensor_info(name, gt, ne)
        w.begin()
        for name, _, _, data in tensors:
            w.write_tensor(name, data)


def bench_gemv(
    rows: int,
    k: int,
    zs: list[float],
    threads: list[int],
    reps: int,
    workdir: Path,
    bitcos_types: list[str],
    refs: list[str],
    log: Callable[[str], Any] = print,
    order: str = "interleaved",
    rounds: int = 3,
) -> list[dict[str, Any]]:
    """Time every type on the same shape; references once (their speed does not depend on z). `order`:
    "interleaved" (each repetition walks every weight: noise hits all types alike; the working set is all
    weights together) or "grouped" (each weight's repetitions back to back: a small weight stays in L1/L2).
    `rounds` tool runs per thread count, each timing every type and z (A B C, A B C, ...).

    One record per (file, tensor, threads) from the tool, with "z" (None for the references), "type",
    median_us = the median over rounds of the tool's per-round medians and "rounds_us" = those per-round
    medians (round order: the ratios pair them)."""
    workdir.mkdir(parents=True, exist_ok=True)
    files: list[tuple[float | None, Path]] = []
    t0 = time.perf_counter()
    ref_path = workdir / f"gemv-ref-{rows}x{k}.gguf"
    write_gemv_gguf(ref_path, rows, k, REF_ZERO_DENSITY, refs)
    files.append((None, ref_path))
    for z in zs:
        p = workdir / f"gemv-bitcos-{rows}x{k}-z{z:.3f}.gguf"
        write_gemv_gguf(p, rows, k, z, bitcos_types, seed=1)
        files.append((z, p))
    log(f"# wrote {len(files)} GGUFs in {time.perf_counter() - t0:.1f} s")
    results = []
    for nt in threads:
        # one tool call per round for every file: its repetitions interleave all types and zero densities
        runs = [
            run_tool(["gemv", ",".join(str(p) for _, p in files), str(nt), str(reps), "1", order])
            for _ in range(rounds)
        ]
        for rec in merge_tool_rounds(runs):
            rec["z"] = files[rec["file"]][0]
            rec["type"] = rec["tensor"].split(".", 1)[1]
            results.append(rec)
    return results


def merge_tool_rounds(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One record per (file, tensor) from rounds of llama-bitcos-bench gemv / gemv-device runs over the same
    files: median_us = the median of the rounds' medians, "rounds_us" = those medians in round order, min_us =
    the fastest repetition of all rounds."""
    merged = timing.merge_rounds(runs, lambda r: (r["file"], r["tensor"]), "median_us", "rounds_us")
    fastest: dict[tuple[int, str], float] = {}
    for run in runs:
        for r in run:
            key = (r["file"], r["tensor"])
            fastest[key] = min(fastest.get(key, r["min_us"]), r["min_us"])
    return [{**r, "min_us": fastest[(r["file"], r["tensor"])]} for r in merged]


def rounds_us(record: dict[str, Any]) -> list[float]:
    """The per-round median µs of a gemv record (its one value when it was not run in rounds)."""
    return record.get("rounds_us", [record["median_us"]])


def gemv_ratios(results: list[dict[str, Any]], group: str = "threads") -> list[dict[str, Any]]:
    """Every record's speed ratio to each reference record (z None) with the same `group` field (thread count;
    the shape in bench gpu), > 1: faster than the reference, with its spread over rounds, for the --json
    files: {"type", "z", group, "ref", **RatioSpread.as_json()}."""
    out = []
    for r in results:
        for ref in results:
            if ref["z"] is None and ref is not r and ref[group] == r[group]:
                spread = timing.time_ratio(rounds_us(ref), rounds_us(r))
                out.append({"type": r["type"], "z": r["z"], group: r[group], "ref": ref["type"], **spread.as_json()})
    return out


def gemv_table(results: list[dict[str, Any]]) -> str:
    """Markdown tables, one per thread count: time (median and range over rounds), bandwidth, bits per weight
    and the ratios to each reference type (> 1: faster than the reference; median of the per-round ratios
    with their range, or "within noise")."""
    lines = []
    for nt in sorted({r["threads"] for r in results}):
        rs = [r for r in results if r["threads"] == nt]
        refs = {r["type"]: r for r in rs if r["z"] is None}
        n_rounds = max(len(rounds_us(r)) for r in rs)
        lines.append(f"\n## threads = {nt}   shape {rs[0]['rows']} x {rs[0]['k']} (rows x K), {n_rounds} round(s)")
        lines.append("| type | z | median µs (min-max) | GB/s | bits/weight | vs TQ2_0 | vs TQ1_0 | vs Q4_0 |")
        lines.append("|---|---|---|---|---|---|---|---|")
        ordered = [r for r in rs if r["z"] is None] + sorted(
            (r for r in rs if r["z"] is not None), key=lambda r: (r["type"], r["z"])
        )
        for r in ordered:
            n_w = r["rows"] * r["k"]
            ratio = {
                t: timing.time_ratio(rounds_us(refs[t]), rounds_us(r)).cell() if t in refs and refs[t] is not r else "-"
                for t in REF_TYPES
            }
            zs = "-" if r["z"] is None else f"{r['z']:.2f}"
            lines.append(
                f"| {r['type']} | {zs} | {timing.value_cell(rounds_us(r), 1)} | "
                f"{r['bytes'] / r['median_us'] / 1e3:.2f} | {8 * r['bytes'] / n_w:.3f} | {ratio['tq2_0']} | "
                f"{ratio['tq1_0']} | {ratio['q4_0']} |"
            )
    return "\n".join(lines)


def gemv_plot(results: list[dict[str, Any]], out: Path, title: str) -> None:
    """GEMV time over z per BITCOS type, the references as horizontal lines; one panel per thread count."""
    plt = pyplot()
    thr = sorted({r["threads"] for r in results})
    fig, axes = plt.subplots(1, len(thr), figsize=(6 * len(thr), 4.2), squeeze=False)
    for ax, nt in zip(axes[0], thr):
        rs = [r for r in results if r["threads"] == nt]
        for t in sorted({r["type"] for r in rs if r["z"] is not None}):
            pts = sorted((r["z"], r["median_us"]) for r in rs if r["type"] == t and r["z"] is not None)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=t.upper())
        for r in rs:
            if r["z"] is None:
                ax.axhline(
                    r["median_us"], linestyle="--", label=r["type"].upper(), color=REF_COLORS.get(r["type"], "k")
                )
        ax.set_xlabel("zero density z")
        ax.set_ylabel("GEMV time (µs, median)")
        ax.set_title(f"{rs[0]['rows']}x{rs[0]['k']}, {nt} thread(s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, out, title)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds `bench gemv` to the `bench` subparsers."""
    g = sub.add_parser("gemv", help="GEMV zero-density sweep (paper Fig. 11)")
    g.add_argument("--rows", type=int, default=32768, help="output rows N (default 32768)")
    g.add_argument("--k", type=int, default=16384, help="row length K (default 16384)")
    g.add_argument("--z", type=parse_floats, default=[0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 0.95])
    g.add_argument("--threads", type=parse_ints, default=default_threads())
    g.add_argument("--reps", type=int, default=9, help="repetitions per round (default 9)")
    timing.add_rounds_argument(g, 3, "every type and z")
    g.add_argument(
        "--order",
        choices=("interleaved", "grouped"),
        default="interleaved",
        help="interleaved: every repetition walks all weights (robust ratios on a shared machine; "
        "the working set is all weights); grouped: each weight's repetitions back to back "
        "(a small weight stays in L1/L2: the cache-resident figure)",
    )
    add_bitcos_types_argument(g, "to time at every z")
    g.add_argument("--workdir", type=Path, default=None, help="where the test GGUFs go (default: a temp dir)")
    g.add_argument("--json", type=Path, help="write all measurements as JSON")
    g.add_argument("--plot", type=Path, help="write the figure (PNG)")
    g.set_defaults(func=run)
    return g


def run(args: argparse.Namespace) -> int:
    """`bench gemv`: measure, print the table, write JSON and figure when asked."""
    with bench_workdir(args.workdir) as wd:
        res = bench_gemv(
            args.rows,
            args.k,
            args.z,
            args.threads,
            args.reps,
            wd,
            args.bitcos_types,
            list(REF_TYPES),
            order=args.order,
            rounds=args.rounds,
        )
    title = f"ggml-bitcos bench gemv ({args.order}) — {machine_line(args.threads)}"
    print(f"# {title}")
    print(gemv_table(res))
    if args.json:
        write_json(args.json, {"machine": title, "results": res, "ratios": gemv_ratios(res)})
    if args.plot:
        gemv_plot(res, args.plot, title)
        print(f"# plot: {args.plot}")
    return 0
