"""`ggml-bitcos bench …`: the paper's measurements reproduced on the machine at hand.

* ``gemv``     — Fig. 11: GEMV time over zero density, BITCOS vs TQ2_0 / TQ1_0 (Q4_0 as a familiar
                 reference), through ggml's real CPU MUL_MAT (llama-bitcos-bench), ratios from one run whose
                 repetitions interleave all types (``--order grouped``: back to back, cache-resident).
* ``roofline`` — Table II / Fig. 10: measured per-thread read bandwidth beta and instruction cost gamma
                 (cycles per 32 weights, L1-resident), the predicted bound for each z, next to measured.
* ``e2e``      — Fig. 12: llama-bench tg128 / pp512 for one model in TQ1_0, TQ2_0 and BITCOS, in rounds over
                 all models (medians over rounds), and where a generated token's time goes: its ternary
                 matmuls, its other matmuls (llama-bitcos-bench decode) and the rest, with the Amdahl ceiling
                 of the tg ratio.
* ``kernels``  — the BITCOS kernel microbenchmark (ggml_bitcos.kbench).

Every ratio printed is measured in the same invocation; nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ggml_bitcos import codec, llama_run

REF_TYPES = ("tq2_0", "tq1_0", "q4_0")


# ---------------------------------------------------------------------------------------------- utils
def machine_line(threads: list[int]) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs, threads {','.join(map(str, threads))}"


def _run_tool(args: list[str], timeout: float = 3600) -> list[dict[str, Any]]:
    exe = llama_run.tool_path("llama-bitcos-bench")
    r = subprocess.run([str(exe), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bitcos-bench {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def _codes(rows: int, k: int, z: float, seed: int) -> np.ndarray:
    from ggml_bitcos.make_model import ternary_codes

    return ternary_codes(np.random.default_rng(seed), (rows, k), z)


def write_gemv_gguf(path: Path, rows: int, k: int, z: float, types: list[str], seed: int = 0) -> None:
    """One GGUF holding the same ternary matrix (zero density z) in each requested type."""
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFValueType, quants

    import gguf_tools

    codes = _codes(rows, k, z, seed)
    scale = np.float16(1.0 / np.sqrt(k))
    datas: list[tuple[str, Any, tuple[int, ...], np.ndarray]] = []
    for t in types:
        if t == "tq2_0":
            datas.append((f"w.{t}", T.TQ2_0, (k, rows), codec.tq2_0_encode(codes, np.full((rows, k // 256), scale))))
        elif t == "tq1_0":
            datas.append((f"w.{t}", T.TQ1_0, (k, rows), codec.tq1_0_encode(codes, np.full((rows, k // 256), scale))))
        elif t == "q4_0":
            parts = [quants.quantize(codes[i:i + 1024].astype(np.float32) * np.float32(scale), T.Q4_0)
                     for i in range(0, rows, 1024)]
            datas.append((f"w.{t}", T.Q4_0, (k, rows), np.concatenate(parts, axis=0)))
        elif t in ("bitcos_pt", "bitcos_g128"):
            if t == "bitcos_pt":
                enc = codec.encode(codes, codec.VARIANT_PT, matrix_scales=np.array([scale], np.float32))
                gt = gguf_tools.BITCOS_PT
            else:
                enc = codec.encode(codes, codec.VARIANT_G128, block_scales=np.full((rows, k // 128), scale))
                gt = gguf_tools.BITCOS_G128
            datas.append((f"w.{t}", gt, (k, rows), enc.blocks))
            datas.append((f"w.{t}.bitcos", T.I8, (enc.companion.nbytes,), enc.companion.view(np.int8)))
        else:
            raise ValueError(f"unknown type {t}")
    del codes
    with gguf_tools.GGUFStreamWriter(path, arch="bitcos-bench", overwrite=True) as w:
        w.add_kv("general.architecture", "bitcos-bench", GGUFValueType.STRING)
        for name, gt, ne, _ in datas:
            w.add_tensor_info(name, gt, ne)
        w.begin()
        for name, _, _, data in datas:
            w.write_tensor(name, data)


# ----------------------------------------------------------------------------------------------- gemv
def bench_gemv(rows: int, k: int, zs: list[float], threads: list[int], reps: int, workdir: Path,
               bitcos_types: list[str], refs: list[str], log=print, order: str = "interleaved") -> list[dict[str, Any]]:
    """Time every type on the same shape; references once (their speed does not depend on z). `order`:
    "interleaved" (each repetition walks every weight: noise hits all types alike; the working set is all
    weights together) or "grouped" (each weight's repetitions back to back: a small weight stays in L1/L2)."""
    workdir.mkdir(parents=True, exist_ok=True)
    files: list[tuple[float | None, Path]] = []
    t0 = time.perf_counter()
    ref_path = workdir / f"gemv-ref-{rows}x{k}.gguf"
    write_gemv_gguf(ref_path, rows, k, 0.4, refs)
    files.append((None, ref_path))
    for z in zs:
        p = workdir / f"gemv-bitcos-{rows}x{k}-z{z:.3f}.gguf"
        write_gemv_gguf(p, rows, k, z, bitcos_types, seed=1)
        files.append((z, p))
    log(f"# wrote {len(files)} GGUFs in {time.perf_counter() - t0:.1f} s")
    results = []
    for nt in threads:
        # one tool call for every file: its repetitions interleave all types and zero densities
        for rec in _run_tool(["gemv", ",".join(str(p) for _, p in files), str(nt), str(reps), "1", order]):
            rec["z"] = files[rec["file"]][0]
            rec["type"] = rec["tensor"].split(".", 1)[1]
            results.append(rec)
    return results


def gemv_table(results: list[dict[str, Any]]) -> str:
    lines = []
    for nt in sorted({r["threads"] for r in results}):
        rs = [r for r in results if r["threads"] == nt]
        refs = {r["type"]: r for r in rs if r["z"] is None}
        lines.append(f"\n## threads = {nt}   shape {rs[0]['rows']} x {rs[0]['k']} (rows x K)")
        lines.append("| type | z | median µs | GB/s | bits/weight | vs TQ2_0 | vs TQ1_0 | vs Q4_0 |")
        lines.append("|---|---|---|---|---|---|---|---|")
        ordered = [r for r in rs if r["z"] is None] + sorted((r for r in rs if r["z"] is not None),
                                                              key=lambda r: (r["type"], r["z"]))
        for r in ordered:
            n_w = r["rows"] * r["k"]
            ratio = {t: (refs[t]["median_us"] / r["median_us"]) if t in refs else float("nan") for t in REF_TYPES}
            zs = "-" if r["z"] is None else f"{r['z']:.2f}"
            lines.append(f"| {r['type']} | {zs} | {r['median_us']:.1f} | {r['bytes'] / r['median_us'] / 1e3:.2f} "
                         f"| {8 * r['bytes'] / n_w:.3f} | {ratio['tq2_0']:.3f}x | {ratio['tq1_0']:.3f}x "
                         f"| {ratio['q4_0']:.3f}x |")
    return "\n".join(lines)


def gemv_plot(results: list[dict[str, Any]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    thr = sorted({r["threads"] for r in results})
    fig, axes = plt.subplots(1, len(thr), figsize=(6 * len(thr), 4.2), squeeze=False)
    for ax, nt in zip(axes[0], thr):
        rs = [r for r in results if r["threads"] == nt]
        for t in sorted({r["type"] for r in rs if r["z"] is not None}):
            pts = sorted((r["z"], r["median_us"]) for r in rs if r["type"] == t and r["z"] is not None)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=t.upper())
        for r in rs:
            if r["z"] is None:
                ax.axhline(r["median_us"], linestyle="--", label=r["type"].upper(),
                           color={"tq2_0": "C3", "tq1_0": "C4", "q4_0": "C7"}.get(r["type"], "k"))
        ax.set_xlabel("zero density z")
        ax.set_ylabel("GEMV time (µs, median)")
        ax.set_title(f"{rs[0]['rows']}x{rs[0]['k']}, {nt} thread(s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


# ------------------------------------------------------------------------------------------- roofline
def bench_roofline(threads: list[int], zs: list[float], rows: int, k: int, reps: int, workdir: Path,
                   log=print) -> dict[str, Any]:
    """beta (GB/s per thread count), gamma (cycles/32 weights), predicted vs measured GEMV time."""
    beta = {nt: _run_tool(["bandwidth", "1024", str(nt), "5"])[0]["gb_per_s"] for nt in threads}
    gam: dict[str, float] = {}
    for t in REF_TYPES:
        gam[t] = _run_tool(["gamma", t, "2048", "8", "2000"])[0]["cycles_per_32"]
    try:
        from ggml_bitcos import kbench

        for variant, g in kbench.gamma_l1().items():
            gam[variant] = g
    except Exception as e:  # kernel harness not built: roofline without BITCOS gamma
        log(f"# BITCOS gamma unavailable ({e}); build the harness with `pip install .`")
    ghz = tsc_ghz()
    res = bench_gemv(rows, k, zs, threads, reps, workdir, ["bitcos_pt"], list(REF_TYPES), log)
    rows_out = []
    for r in res:
        n_w = r["rows"] * r["k"]
        nt = r["threads"]
        t_mem = r["bytes"] / (beta[nt] * 1e3)                            # µs at the measured bandwidth
        g = gam.get(r["type"], float("nan"))
        t_ins = (n_w / 32) * g / (ghz * 1e3) / nt                         # µs if instruction-bound
        bound = "memory" if t_mem >= t_ins else "instructions"
        rows_out.append({**r, "t_mem_us": t_mem, "t_ins_us": t_ins, "predicted_us": max(t_mem, t_ins),
                         "bound": bound, "gamma": g})
    return {"beta_gb_s": beta, "gamma_cycles_per_32": gam, "tsc_ghz": ghz, "rows": rows_out}


def tsc_ghz() -> float:
    """Cycle counter rate (rdtsc ticks per ns), from /proc/cpuinfo's 'cpu MHz' as a fallback estimate."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1]) / 1000.0
    except OSError:
        pass
    return float("nan")


def roofline_table(rf: dict[str, Any]) -> str:
    out = ["| threads | beta GB/s |", "|---|---|"]
    out += [f"| {nt} | {b:.2f} |" for nt, b in rf["beta_gb_s"].items()]
    out += ["", "| kernel | gamma (cycles / 32 weights, L1) |", "|---|---|"]
    out += [f"| {t} | {g:.3f} |" for t, g in rf["gamma_cycles_per_32"].items()]
    out += ["", "| type | z | threads | memory-bound µs | instr-bound µs | predicted | bound | measured µs | measured/predicted |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in rf["rows"]:
        zs = "-" if r["z"] is None else f"{r['z']:.2f}"
        out.append(f"| {r['type']} | {zs} | {r['threads']} | {r['t_mem_us']:.0f} | {r['t_ins_us']:.0f} | "
                   f"{r['predicted_us']:.0f} | {r['bound']} | {r['median_us']:.0f} | "
                   f"{r['median_us'] / r['predicted_us']:.2f} |")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------ e2e
# e2e model labels (tables) -> keys of e2e_models()
E2E_LABELS = {"TQ1_0": "tq1_0", "TQ2_0": "tq2_0", "BITCOS": "bitcos"}


def e2e_label(model_filename: str) -> str:
    """Table label of an e2e model file (names as e2e_models() writes them)."""
    name = Path(model_filename).name
    return "BITCOS" if "bitcos" in name else ("TQ2_0" if "tq2_0" in name else "TQ1_0")


def e2e_models(workdir: Path, preset: str, z: float, log=print) -> dict[str, Path]:
    """The benchmark model as TQ1_0 and TQ2_0 (make-model, deterministic) and the TQ2_0 file converted to
    BITCOS; made once per workdir."""
    workdir.mkdir(parents=True, exist_ok=True)
    models = {}
    for t in ("tq1_0", "tq2_0"):
        p = workdir / f"{preset}-z{z:.2f}-{t}.gguf"
        if not p.exists():
            _cli(["make-model", "-o", str(p), "--preset", preset, "--zero-density", str(z), "--type", t,
                  "--scale", "tensor", "--seed", "1"], log)
        models[t] = p
    b = workdir / f"{preset}-z{z:.2f}-bitcos.gguf"
    if not b.exists():
        _cli(["convert", str(models["tq2_0"]), "-o", str(b)], log)
    models["bitcos"] = b
    return models


def bench_e2e(workdir: Path, preset: str, z: float, threads: list[int], reps: int, n_prompt: int,
              n_gen: int, rounds: int = 1, log=print) -> list[dict[str, Any]]:
    """llama-bench over the three models, `rounds` times: each round runs every model and thread count once
    (with `reps` repetitions), so a slow phase of a shared machine hits all of them; the result per test is
    the median over rounds (`avg_ts`), with the rounds' spread as `stddev_ts` and their values in
    `rounds_ts`."""
    models = e2e_models(workdir, preset, z, log)
    runs = []
    for i in range(rounds):
        if rounds > 1:
            log(f"# llama-bench round {i + 1}/{rounds}")
        runs.append(llama_run.run_bench([models["tq1_0"], models["tq2_0"], models["bitcos"]], n_prompt=n_prompt,
                                        n_gen=n_gen, threads=threads, repetitions=reps))
    return merge_rounds(runs)


def merge_rounds(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One llama-bench record per (model, test, threads): the first round's record with avg_ts = the median
    over rounds and stddev_ts = their standard deviation (llama-bench's own when there is one round)."""
    if len(runs) == 1:
        return runs[0]
    def key(r):
        return (r["model_filename"], r["n_prompt"], r["n_gen"], r["n_threads"])
    vals: dict[Any, list[float]] = {}
    for run in runs:
        for r in run:
            vals.setdefault(key(r), []).append(r["avg_ts"])
    out = []
    for r in runs[0]:
        v = vals[key(r)]
        out.append({**r, "avg_ts": float(np.median(v)), "stddev_ts": float(np.std(v)), "rounds_ts": v})
    return out


def decode_breakdown(models: dict[str, Path], threads: list[int], reps: int,
                     rounds: int = 1) -> list[dict[str, Any]]:
    """Per model and thread count: the time of one token's ternary weight matmuls and of its other matmuls
    (output projection), each graph walking all its weights once per run (`llama-bitcos-bench decode`),
    plus the read bandwidth with that many threads. With several rounds the models alternate and each
    time is the median of the rounds' medians."""
    out = []
    for t in threads:
        betas = [_run_tool(["bandwidth", "1024", str(t), "5"])[0]["gb_per_s"] for _ in range(rounds)]
        beta = float(np.median(betas))
        recs = {label: {"model": label, "threads": t, "beta_gb_s": beta} for label in E2E_LABELS}
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(rounds):
            for label, key in E2E_LABELS.items():
                path = models[key]
                for r in _run_tool(["decode", str(path), str(t), str(reps)]):
                    times.setdefault((label, r["decode_class"]), []).append(r["median_us"])
                    recs[label][r["decode_class"] + "_bytes"] = r["bytes"]
        for (label, cls), v in times.items():
            recs[label][cls + "_us"] = float(np.median(v))
        out.extend(recs.values())
    return out


def breakdown_table(rows: list[dict[str, Any]], breakdown: list[dict[str, Any]]) -> str:
    """tg time per token split into ternary matmuls, other matmuls and the rest (tg minus both), and the
    Amdahl ceiling of BITCOS's tg speed-up over TQ2_0: the ratio if BITCOS's ternary matmuls took only
    their bytes / beta (DRAM-bound) and everything else stayed as measured."""
    tg = {}
    for r in rows:
        if r["n_prompt"] == 0:
            tg[(e2e_label(r["model_filename"]), r["n_threads"])] = 1e3 / r["avg_ts"]
    out = ["| model | threads | tg ms/token | ternary matmuls ms | ternary MB | ternary GB/s | other matmuls ms |"
           " rest ms |", "|---|---|---|---|---|---|---|---|"]
    for b in breakdown:
        total = tg.get((b["model"], b["threads"]))
        if total is None or "ternary_us" not in b:
            continue
        tern, other = b["ternary_us"] / 1e3, b.get("other_us", 0.0) / 1e3
        b["tg_ms"], b["rest_ms"] = total, total - tern - other
        out.append(f"| {b['model']} | {b['threads']} | {total:.1f} | {tern:.1f} | {b['ternary_bytes'] / 1e6:.0f} | "
                   f"{b['ternary_bytes'] / (tern * 1e6):.1f} | {other:.1f} | {b['rest_ms']:.1f} |")
    notes = []
    for t in sorted({b["threads"] for b in breakdown}):
        q = {b["model"]: b for b in breakdown if b["threads"] == t and "tg_ms" in b}
        if "TQ2_0" in q and "BITCOS" in q:
            bc = q["BITCOS"]
            floor_ms = bc["ternary_bytes"] / (bc["beta_gb_s"] * 1e6)
            ceiling = q["TQ2_0"]["tg_ms"] / (bc["tg_ms"] - bc["ternary_us"] / 1e3 + floor_ms)
            kernel_ratio = q["TQ2_0"]["ternary_us"] / bc["ternary_us"]
            notes.append(f"{t} thread(s): BITCOS ternary matmuls {kernel_ratio:.3f}x TQ2_0's; tg ceiling "
                         f"{ceiling:.3f}x TQ2_0 if they ran at {bc['beta_gb_s']:.1f} GB/s ({floor_ms:.1f} ms)")
    return "\n".join(out + [""] + notes)


def _cli(args: list[str], log) -> None:
    log(f"# ggml-bitcos {' '.join(args)}")
    r = subprocess.run([sys.executable, "-m", "ggml_bitcos", *args])
    if r.returncode != 0:
        raise RuntimeError(f"ggml-bitcos {' '.join(args)} failed")


def e2e_table(rows: list[dict[str, Any]]) -> str:
    def kind(r):
        return "pp" if r["n_prompt"] > 0 else "tg"

    base = {}
    for r in rows:
        r["_label"] = e2e_label(r["model_filename"])
        base[(r["_label"], kind(r), r["n_threads"])] = r["avg_ts"]
    out = ["| model | test | threads | t/s | vs TQ2_0 | vs TQ1_0 | size MiB |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        key = (kind(r), r["n_threads"])
        test = f"pp{r['n_prompt']}" if kind(r) == "pp" else f"tg{r['n_gen']}"
        out.append(f"| {r['_label']} | {test} | {r['n_threads']} | {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} | "
                   f"{r['avg_ts'] / base.get(('TQ2_0', *key), float('nan')):.3f}x | "
                   f"{r['avg_ts'] / base.get(('TQ1_0', *key), float('nan')):.3f}x | "
                   f"{r['model_size'] / 2**20:.1f} |")
    return "\n".join(out)


def e2e_plot(rows: list[dict[str, Any]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, kind in zip(axes, ("tg", "pp")):
        rs = [r for r in rows if (r["n_prompt"] > 0) == (kind == "pp")]
        labels = [f"{r['_label']}\n{r['n_threads']}t" for r in rs]
        ax.bar(range(len(rs)), [r["avg_ts"] for r in rs], yerr=[r["stddev_ts"] for r in rs],
               color=["C2" if r["_label"] == "BITCOS" else ("C3" if r["_label"] == "TQ2_0" else "C4") for r in rs])
        ax.set_xticks(range(len(rs)), labels, fontsize=8)
        ax.set_ylabel("tokens / s")
        ax.set_title("decode (tg)" if kind == "tg" else "prompt processing (pp)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


# ------------------------------------------------------------------------------------------------ CLI
def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="benchmarks: gemv, roofline, e2e, kernels",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="bench_cmd", required=True)
    ncpu = os.cpu_count() or 1

    g = sub.add_parser("gemv", help="GEMV zero-density sweep (paper Fig. 11)")
    g.add_argument("--rows", type=int, default=32768, help="output rows N (default 32768)")
    g.add_argument("--k", type=int, default=16384, help="row length K (default 16384)")
    g.add_argument("--z", type=_floats, default=[0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 0.95])
    g.add_argument("--threads", type=_ints, default=sorted({1, ncpu}))
    g.add_argument("--reps", type=int, default=9)
    g.add_argument("--order", choices=("interleaved", "grouped"), default="interleaved",
                   help="interleaved: every repetition walks all weights (robust ratios on a shared machine; "
                        "the working set is all weights); grouped: each weight's repetitions back to back "
                        "(a small weight stays in L1/L2: the cache-resident figure)")
    g.add_argument("--bitcos-types", default="bitcos_pt,bitcos_g128")
    g.add_argument("--workdir", type=Path, default=None, help="where the test GGUFs go (default: a temp dir)")
    g.add_argument("--json", type=Path, help="write all measurements as JSON")
    g.add_argument("--plot", type=Path, help="write the figure (PNG)")
    g.set_defaults(func=_run_gemv)

    r = sub.add_parser("roofline", help="beta, gamma and the roofline prediction (paper Table II / Fig. 10)")
    r.add_argument("--rows", type=int, default=32768)
    r.add_argument("--k", type=int, default=16384)
    r.add_argument("--z", type=_floats, default=[0.0, 0.3, 0.4, 0.5, 0.95])
    r.add_argument("--threads", type=_ints, default=sorted({1, ncpu}))
    r.add_argument("--reps", type=int, default=7)
    r.add_argument("--workdir", type=Path, default=None)
    r.add_argument("--json", type=Path)
    r.set_defaults(func=_run_roofline)

    e = sub.add_parser("e2e", help="llama-bench tg/pp for TQ1_0, TQ2_0, BITCOS (paper Fig. 12)")
    e.add_argument("--preset", default="bitnet-2b")
    e.add_argument("--zero-density", type=float, default=0.42)
    e.add_argument("--threads", type=_ints, default=sorted({1, ncpu}))
    e.add_argument("--reps", type=int, default=1, help="llama-bench repetitions per round (default 1)")
    e.add_argument("--rounds", type=int, default=3,
                   help="rounds over all models; results are medians over rounds (default 3)")
    e.add_argument("-p", "--n-prompt", type=int, default=512)
    e.add_argument("-n", "--n-gen", type=int, default=128)
    e.add_argument("--workdir", type=Path, default=Path("bench-models"))
    e.add_argument("--json", type=Path)
    e.add_argument("--plot", type=Path)
    e.add_argument("--breakdown-reps", type=int, default=9,
                   help="runs of the per-token matmul graphs (llama-bitcos-bench decode) per model")
    e.add_argument("--no-breakdown", action="store_true", help="skip the decode time breakdown")
    e.set_defaults(func=_run_e2e)

    try:
        from ggml_bitcos import kbench

        kbench.register(sub)
    except ImportError:
        pass


def _workdir(arg: Path | None) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    if arg is not None:
        return arg, None
    td = tempfile.TemporaryDirectory(prefix="bitcos-bench-")
    return Path(td.name), td


def _run_gemv(args: argparse.Namespace) -> int:
    wd, td = _workdir(args.workdir)
    try:
        res = bench_gemv(args.rows, args.k, args.z, args.threads, args.reps, wd,
                         args.bitcos_types.split(","), list(REF_TYPES), order=args.order)
    finally:
        if td:
            td.cleanup()
    title = f"ggml-bitcos bench gemv ({args.order}) — {machine_line(args.threads)}"
    print(f"# {title}")
    print(gemv_table(res))
    if args.json:
        args.json.write_text(json.dumps({"machine": title, "results": res}, indent=1))
    if args.plot:
        gemv_plot(res, args.plot, title)
        print(f"# plot: {args.plot}")
    return 0


def _run_roofline(args: argparse.Namespace) -> int:
    wd, td = _workdir(args.workdir)
    try:
        rf = bench_roofline(args.threads, args.z, args.rows, args.k, args.reps, wd)
    finally:
        if td:
            td.cleanup()
    print(f"# ggml-bitcos bench roofline — {machine_line(args.threads)}; TSC {rf['tsc_ghz']:.2f} GHz")
    print(roofline_table(rf))
    if args.json:
        args.json.write_text(json.dumps(rf, indent=1, default=str))
    return 0


def _run_e2e(args: argparse.Namespace) -> int:
    rows = bench_e2e(args.workdir, args.preset, args.zero_density, args.threads, args.reps, args.n_prompt,
                     args.n_gen, rounds=args.rounds)
    title = (f"llama-bench, {args.preset} z={args.zero_density} — {machine_line(args.threads)}")
    print(f"# {title}")
    print(e2e_table(rows))
    breakdown = []
    if not args.no_breakdown:
        breakdown = decode_breakdown(e2e_models(args.workdir, args.preset, args.zero_density), args.threads,
                                     args.breakdown_reps, rounds=args.rounds)
        print("\n# where a generated token's time goes (llama-bitcos-bench decode; rest = tg - matmuls)")
        print(breakdown_table(rows, breakdown))
    if args.json:
        args.json.write_text(json.dumps({"llama_bench": rows, "decode_breakdown": breakdown}, indent=1))
    if args.plot:
        e2e_plot(rows, args.plot, title)
        print(f"# plot: {args.plot}")
    return 0
