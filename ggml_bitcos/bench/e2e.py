"""`ggml-bitcos bench e2e`: llama-bench tg / pp for one model in TQ1_0, TQ2_0 and BITCOS (paper Fig. 12).

The models run in rounds, each running every model (medians over rounds, ratios as the median of the
per-round ratios with their range, or "within noise": ggml_bitcos.bench.timing), and the decode breakdown
says where a generated token's time goes: its ternary matmuls, its other matmuls (llama-bitcos-bench decode)
and the rest, with the Amdahl ceiling of the tg ratio.

Tables and plots derive what they show (model labels, tg time per token, the rest of it) from the raw
records through the helpers below; they never write into them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ggml_bitcos import llama_run
from ggml_bitcos.bench import timing
from ggml_bitcos.bench.common import (
    default_threads,
    machine_line,
    parse_ints,
    pyplot,
    read_bandwidth_gb_s,
    run_tool,
    save_figure,
    write_json,
)

Log = Callable[[str], Any]

# e2e model labels (tables) -> keys of e2e_models()
E2E_LABELS = {"TQ1_0": "tq1_0", "TQ2_0": "tq2_0", "BITCOS": "bitcos"}
LABEL_COLORS = {"BITCOS": "C2", "TQ2_0": "C3", "TQ1_0": "C4"}


# ------------------------------------------------------------------------------------------- models
def e2e_label(model_filename: str) -> str:
    """Table label of an e2e model file (names as e2e_models() writes them)."""
    name = Path(model_filename).name
    return "BITCOS" if "bitcos" in name else ("TQ2_0" if "tq2_0" in name else "TQ1_0")


# The CPU's in-memory forms of BITCOS weights (GGML_BITCOS_CPU_FORM, docs/KERNELS.md §9): "auto" is what a
# user gets (the load-time choice), the other two force one form; records carry it as "bitcos_form".
FORMS = ("auto", "bitcos", "2bit")
FORM_LABELS = {"bitcos": "BITCOS form", "2bit": "2-bit form"}


def record_label(record: dict[str, Any]) -> str:
    """Table label of a llama-bench record: the model's, with the forced CPU form of a BITCOS run."""
    label = e2e_label(record["model_filename"])
    form = record.get("bitcos_form", "auto")
    return label if form == "auto" or label != "BITCOS" else f"BITCOS ({FORM_LABELS[form]})"


def auto_form_line(model: Path, threads: int) -> str:
    """The load log's line on the CPU form the automatic choice takes for `model` at `threads` threads (what
    llama-bench's auto rows ran), from a one-token llama-completion run; "" when the log has none."""
    r = subprocess.run(
        [str(llama_run.tool_path("llama-completion")), "-m", str(model), "-p", "Hi", "-n", "1", "-t", str(threads)]
        + ["-no-cnv", "--no-warmup", "-c", "256", "-v"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "GGML_BITCOS_CPU_FORM": "auto", "GGML_BITCOS_THREADS": str(threads)},
        timeout=600,
    )
    found = [ln for ln in r.stderr.splitlines() if "BITCOS CPU form:" in ln]
    return found[-1].split("BITCOS CPU form:", 1)[1].strip() if found else ""


def _cli(args: list[str], log: Log) -> None:
    """Runs a `ggml-bitcos` subcommand in a child process (its memory is freed when it ends)."""
    log(f"# ggml-bitcos {' '.join(args)}")
    r = subprocess.run([sys.executable, "-m", "ggml_bitcos", *args])
    if r.returncode != 0:
        raise RuntimeError(f"ggml-bitcos {' '.join(args)} failed")


def e2e_models(workdir: Path, preset: str, z: float, log: Log = print) -> dict[str, Path]:
    """The benchmark model as TQ1_0 and TQ2_0 (make-model, deterministic) and the TQ2_0 file converted to
    BITCOS; made once per workdir."""
    workdir.mkdir(parents=True, exist_ok=True)
    models = {}
    for t in ("tq1_0", "tq2_0"):
        p = workdir / f"{preset}-z{z:.2f}-{t}.gguf"
        if not p.exists():
            _cli(
                [
                    "make-model",
                    "-o",
                    str(p),
                    "--preset",
                    preset,
                    "--zero-density",
                    str(z),
                    "--type",
                    t,
                    "--scale",
                    "tensor",
                    "--seed",
                    "1",
                ],
                log,
            )
        models[t] = p
    b = workdir / f"{preset}-z{z:.2f}-bitcos.gguf"
    if not b.exists():
        _cli(["convert", str(models["tq2_0"]), "-o", str(b)], log)
    models["bitcos"] = b
    return models


# ---------------------------------------------------------------------------------------- llama-bench
def llama_bench_rounds(
    models: list[Path],
    rounds: int,
    reps: int,
    n_prompt: int = 512,
    n_gen: int = 128,
    threads: list[int] | None = None,
    extra: list[str] | None = None,
    log: Log = print,
    forms: tuple[str, ...] = ("auto",),
) -> list[dict[str, Any]]:
    """llama-bench over `models`, `rounds` times: each round runs every model (and thread count) once, with
    `reps` repetitions, so a slow phase of a shared machine hits all of them; merged by merge_rounds. Each thread
    count runs on its own, with the automatic CPU form chosen for that many threads (GGML_BITCOS_THREADS); each
    other entry of `forms` runs the BITCOS models again with that form forced."""
    runs = []
    bitcos_models = [m for m in models if e2e_label(str(m)) == "BITCOS"]
    for i in range(rounds):
        if rounds > 1:
            log(f"# llama-bench round {i + 1}/{rounds}")
        records: list[dict[str, Any]] = []
        for t in threads or [0]:
            for form in forms:
                env = {"GGML_BITCOS_CPU_FORM": form}
                if t:
                    env["GGML_BITCOS_THREADS"] = str(t)
                run_models = models if form == "auto" else bitcos_models
                if not run_models:
                    continue
                recs = llama_run.run_bench(
                    run_models,
                    n_prompt=n_prompt,
                    n_gen=n_gen,
                    threads=[t] if t else None,
                    repetitions=reps,
                    extra=extra,
                    env=env,
                )
                records += [{**r, "bitcos_form": form} for r in recs]
        runs.append(records)
    return merge_rounds(runs)


def bench_e2e(
    workdir: Path,
    preset: str,
    z: float,
    threads: list[int],
    reps: int,
    n_prompt: int,
    n_gen: int,
    rounds: int = 3,
    log: Log = print,
    forms: tuple[str, ...] = FORMS,
) -> list[dict[str, Any]]:
    """llama-bench over the three models in `rounds` interleaved rounds (llama_bench_rounds), BITCOS also in each
    forced CPU form of `forms`."""
    models = e2e_models(workdir, preset, z, log)
    return llama_bench_rounds(
        [models["tq1_0"], models["tq2_0"], models["bitcos"]],
        rounds,
        reps,
        n_prompt=n_prompt,
        n_gen=n_gen,
        threads=threads,
        log=log,
        forms=forms,
    )


def merge_rounds(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One llama-bench record per (model, test, threads): the first round's record with avg_ts = the median
    over rounds, rounds_ts = the per-round values (round order: the ratios pair them) and stddev_ts = their
    standard deviation (llama-bench's own when there is one round)."""

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["model_filename"], r.get("bitcos_form", "auto"), r["n_prompt"], r["n_gen"], r["n_threads"])

    merged = timing.merge_rounds(runs, key, "avg_ts", "rounds_ts")
    if len(runs) == 1:
        return merged
    return [{**r, "stddev_ts": float(np.std(r["rounds_ts"]))} for r in merged]


def rounds_ts(record: dict[str, Any]) -> list[float]:
    """The per-round tokens/s of a llama-bench record (its one value when it was not run in rounds)."""
    return record.get("rounds_ts", [record["avg_ts"]])


def record_kind(record: dict[str, Any]) -> str:
    """ "pp" (prompt processing) or "tg" (generation) for a llama-bench record."""
    return "pp" if record["n_prompt"] > 0 else "tg"


def tg_ms_per_token(rows: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
    """Milliseconds per generated token by (model label, threads), from the tg records of llama-bench."""
    return {(record_label(r), r["n_threads"]): 1e3 / r["avg_ts"] for r in rows if r["n_prompt"] == 0}


def e2e_ratios(rows: list[dict[str, Any]], ref: str) -> dict[int, timing.RatioSpread]:
    """Per-round tokens/s ratio of each record (by its index in `rows`) to the `ref` model's record of the
    same test and thread count; the reference itself and records without a reference are left out."""
    base = {(record_label(r), record_kind(r), r["n_threads"]): r for r in rows}
    out = {}
    for i, r in enumerate(rows):
        b = base.get((ref, record_kind(r), r["n_threads"]))
        if b is not None and b is not r and len(rounds_ts(b)) == len(rounds_ts(r)):
            out[i] = timing.speed_ratio(rounds_ts(r), rounds_ts(b))
    return out


def e2e_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of tokens/s per model, test and thread count (median and range over rounds), with the
    ratios to TQ2_0 and TQ1_0 (median of the per-round ratios, their range, or "within noise")."""
    vs = {ref: e2e_ratios(rows, ref) for ref in ("TQ2_0", "TQ1_0")}
    n_rounds = max(len(rounds_ts(r)) for r in rows) if rows else 0
    out = [
        f"tokens/s: median (min-max) over {n_rounds} round(s); ratios: median of the per-round ratios (min-max)",
        "| model | test | threads | t/s | vs TQ2_0 | vs TQ1_0 | size MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows):
        test = f"pp{r['n_prompt']}" if record_kind(r) == "pp" else f"tg{r['n_gen']}"
        cells = [vs[ref][i].cell() if i in vs[ref] else "-" for ref in ("TQ2_0", "TQ1_0")]
        ts = timing.value_cell(rounds_ts(r)) if "rounds_ts" in r else f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}"
        out.append(
            f"| {record_label(r)} | {test} | {r['n_threads']} | {ts} | {cells[0]} | {cells[1]} | "
            f"{r['model_size'] / 2**20:.1f} |"
        )
    return "\n".join(out)


def e2e_plot(rows: list[dict[str, Any]], out: Path, title: str) -> None:
    """Bar charts of tokens/s (tg left, pp right) per model and thread count."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, kind in zip(axes, ("tg", "pp")):
        rs = [r for r in rows if record_kind(r) == kind]
        labels = [record_label(r) for r in rs]
        ax.bar(
            range(len(rs)),
            [r["avg_ts"] for r in rs],
            yerr=[r["stddev_ts"] for r in rs],
            color=[LABEL_COLORS.get(label.split(" (")[0], "C4") for label in labels],
        )
        ax.set_xticks(range(len(rs)), [f"{label}\n{r['n_threads']}t" for label, r in zip(labels, rs)], fontsize=8)
        ax.set_ylabel("tokens / s")
        ax.set_title("decode (tg)" if kind == "tg" else "prompt processing (pp)")
    save_figure(fig, out, title)


# ---------------------------------------------------------------------------------- decode breakdown
def decode_breakdown(models: dict[str, Path], threads: list[int], reps: int, rounds: int = 1) -> list[dict[str, Any]]:
    """Per model and thread count: the time of one token's ternary weight matmuls and of its other matmuls
    (output projection), each graph walking all its weights once per run (`llama-bitcos-bench decode`),
    plus the read bandwidth with that many threads. With several rounds the models alternate and each
    time is the median of the rounds' medians ("rounds_<class>_us": the per-round medians)."""
    out = []
    for t in threads:
        beta = float(np.median([read_bandwidth_gb_s(t) for _ in range(rounds)]))
        recs = {label: {"model": label, "threads": t, "beta_gb_s": beta} for label in E2E_LABELS}
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(rounds):
            for label, key in E2E_LABELS.items():
                for r in run_tool(["decode", str(models[key]), str(t), str(reps)]):
                    times.setdefault((label, r["decode_class"]), []).append(r["median_us"])
                    recs[label][r["decode_class"] + "_bytes"] = r["bytes"]
        for (label, cls), v in times.items():
            recs[label][cls + "_us"] = float(np.median(v))
            recs[label][f"rounds_{cls}_us"] = v
        out.extend(recs.values())
    return out


def with_tg_split(rows: list[dict[str, Any]], breakdown: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the breakdown records; those with a measured tg time and ternary matmul time get "tg_ms"
    (ms per generated token) and "rest_ms" (tg minus the ternary and other matmuls)."""
    tg = tg_ms_per_token(rows)
    out = []
    for b in breakdown:
        total = tg.get((b["model"], b["threads"]))
        if total is None or "ternary_us" not in b:
            out.append(dict(b))
            continue
        out.append({**b, "tg_ms": total, "rest_ms": total - b["ternary_us"] / 1e3 - b.get("other_us", 0.0) / 1e3})
    return out


def tg_ceiling(
    rows: list[dict[str, Any]], tq2: dict[str, Any], bc: dict[str, Any], floor_ms: float
) -> timing.RatioSpread:
    """The Amdahl ceiling of BITCOS's tg ratio to TQ2_0 per round (breakdown records with their tg split): TQ2_0's
    ms per token over BITCOS's with its ternary matmuls taking `floor_ms`. Round i pairs llama-bench's round i
    with the decode breakdown's round i; the medians alone when the round counts differ."""
    tg = {
        record_label(r): [1e3 / v for v in rounds_ts(r)]
        for r in rows
        if r["n_prompt"] == 0 and r["n_threads"] == bc["threads"]
    }
    tq2_ms, bc_ms = tg.get("TQ2_0", []), tg.get("BITCOS", [])
    tern_us = bc.get("rounds_ternary_us", [bc["ternary_us"]])
    if not (len(tq2_ms) == len(bc_ms) == len(tern_us)):
        tq2_ms, bc_ms, tern_us = [tq2["tg_ms"]], [bc["tg_ms"]], [bc["ternary_us"]]
    return timing.RatioSpread(tuple(a / (b - u / 1e3 + floor_ms) for a, b, u in zip(tq2_ms, bc_ms, tern_us)))


def breakdown_table(rows: list[dict[str, Any]], breakdown: list[dict[str, Any]]) -> str:
    """tg time per token split into ternary matmuls, other matmuls and the rest (tg minus both), and the
    Amdahl ceiling of BITCOS's tg speed-up over TQ2_0: the ratio if BITCOS's ternary matmuls took only
    their bytes / beta (DRAM-bound) and everything else stayed as measured."""
    split = [b for b in with_tg_split(rows, breakdown) if "tg_ms" in b]
    out = [
        "| model | threads | tg ms/token | ternary matmuls ms | ternary MB | ternary GB/s | other matmuls ms |"
        " rest ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b in split:
        tern, other = b["ternary_us"] / 1e3, b.get("other_us", 0.0) / 1e3
        out.append(
            f"| {b['model']} | {b['threads']} | {b['tg_ms']:.1f} | {tern:.1f} | "
            f"{b['ternary_bytes'] / 1e6:.0f} | {b['ternary_bytes'] / (tern * 1e6):.1f} | {other:.1f} | "
            f"{b['rest_ms']:.1f} |"
        )
    notes = []
    for t in sorted({b["threads"] for b in breakdown}):
        q = {b["model"]: b for b in split if b["threads"] == t}
        if "TQ2_0" in q and "BITCOS" in q:
            bc = q["BITCOS"]
            floor_ms = bc["ternary_bytes"] / (bc["beta_gb_s"] * 1e6)
            ceiling = tg_ceiling(rows, q["TQ2_0"], bc, floor_ms)
            kernel_ratio = timing.time_ratio(
                q["TQ2_0"].get("rounds_ternary_us", [q["TQ2_0"]["ternary_us"]]),
                bc.get("rounds_ternary_us", [bc["ternary_us"]]),
            )
            notes.append(
                f"{t} thread(s): BITCOS ternary matmuls vs TQ2_0's {kernel_ratio.cell()}; tg ceiling vs TQ2_0 "
                f"{ceiling.cell()} if they ran at {bc['beta_gb_s']:.1f} GB/s ({floor_ms:.1f} ms)"
            )
    return "\n".join(out + [""] + notes)


def e2e_json(rows: list[dict[str, Any]], breakdown: list[dict[str, Any]]) -> dict[str, Any]:
    """The --json file: llama-bench records with their table label ("_label") and the decode breakdown with
    its tg split (the keys these files have always had), each llama-bench record with the spread of its
    ratios to TQ2_0 and TQ1_0 ("vs_TQ2_0", "vs_TQ1_0": timing.RatioSpread.as_json)."""
    vs = {ref: e2e_ratios(rows, ref) for ref in ("TQ2_0", "TQ1_0")}
    return {
        "llama_bench": [
            {
                **r,
                "_label": record_label(r),
                **{f"vs_{ref}": vs[ref][i].as_json() for ref in vs if i in vs[ref]},
            }
            for i, r in enumerate(rows)
        ],
        "decode_breakdown": with_tg_split(rows, breakdown),
    }


# ------------------------------------------------------------------------------------------------ CLI
def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds `bench e2e` to the `bench` subparsers."""
    e = sub.add_parser("e2e", help="llama-bench tg/pp for TQ1_0, TQ2_0, BITCOS (paper Fig. 12)")
    e.add_argument("--preset", default="bitnet-2b")
    e.add_argument("--zero-density", type=float, default=0.42)
    e.add_argument("--threads", type=parse_ints, default=default_threads())
    e.add_argument("--reps", type=int, default=1, help="llama-bench repetitions per round (default 1)")
    timing.add_rounds_argument(e, 3, "llama-bench over all models")
    e.add_argument("-p", "--n-prompt", type=int, default=512)
    e.add_argument("-n", "--n-gen", type=int, default=128)
    e.add_argument("--workdir", type=Path, default=Path("bench-models"))
    e.add_argument("--json", type=Path)
    e.add_argument("--plot", type=Path)
    e.add_argument(
        "--breakdown-reps",
        type=int,
        default=9,
        help="runs of the per-token matmul graphs (llama-bitcos-bench decode) per model",
    )
    e.add_argument("--no-breakdown", action="store_true", help="skip the decode time breakdown")
    e.add_argument(
        "--forms",
        type=lambda v: tuple(f for f in v.split(",") if f),
        default=FORMS,
        help="CPU forms of the BITCOS weights to run (GGML_BITCOS_CPU_FORM): auto (the load-time choice, always "
        "run), bitcos, 2bit; default auto,bitcos,2bit",
    )
    e.set_defaults(func=run)
    return e


def run(args: argparse.Namespace) -> int:
    """`bench e2e`: llama-bench rounds, the decode breakdown, tables, JSON and figure when asked."""
    rows = bench_e2e(
        args.workdir,
        args.preset,
        args.zero_density,
        args.threads,
        args.reps,
        args.n_prompt,
        args.n_gen,
        rounds=args.rounds,
        forms=tuple(dict.fromkeys(("auto", *args.forms))),
    )
    title = f"llama-bench, {args.preset} z={args.zero_density} — {machine_line(args.threads)}"
    print(f"# {title}")
    print(e2e_table(rows))
    bitcos_model = e2e_models(args.workdir, args.preset, args.zero_density)["bitcos"]
    for t in args.threads:
        print(f"# BITCOS rows at {t} thread(s), the automatic CPU form: {auto_form_line(bitcos_model, t)}")
    breakdown = []
    if not args.no_breakdown:
        breakdown = decode_breakdown(
            e2e_models(args.workdir, args.preset, args.zero_density),
            args.threads,
            args.breakdown_reps,
            rounds=args.rounds,
        )
        print("\n# where a generated token's time goes (llama-bitcos-bench decode; rest = tg - matmuls)")
        print(breakdown_table(rows, breakdown))
    if args.json:
        write_json(args.json, e2e_json(rows, breakdown))
    if args.plot:
        e2e_plot(rows, args.plot, title)
        print(f"# plot: {args.plot}")
    return 0
