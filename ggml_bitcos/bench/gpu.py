"""`ggml-bitcos bench gpu`: BITCOS vs TQ2_0 on a GPU backend device (ggml-vulkan), ratios from one invocation.

* mat-vec: ggml MUL_MAT with one column on the device (llama-bitcos-bench gemv-device) for each shape, the
  reference types once (`--refs`, default TQ2_0; Q4_0 / Q8_0 on a backend without TQ2_0 such as ggml-cuda)
  and BITCOS (MATRIX, what `convert` writes for a per-matrix scale) at each zero density, repetitions interleaved across all weights, in rounds; time per
  MUL_MAT, effective GB/s (weight + companion bytes / time) and the ratio to each reference with its spread
  over rounds (ggml_bitcos.bench.timing);
* the device's copy bandwidth (llama-bitcos-bench copy-device), the roof those GB/s are compared with;
* end to end: llama-bench -ngl 99 tg / pp, in rounds over the models, on a generated model (default the
  BitNet-b1.58-2B shape) in TQ1_0, TQ2_0 and BITCOS (`--e2e-types`), the file bytes of their ternary weights
  (no layout conversion at upload: the file's tensor bytes, companions included) and the device's model
  buffer as llama.cpp reports it at load.

The device is chosen as llama.cpp documents it (`--device Vulkan0`; GGML_VK_VISIBLE_DEVICES picks which
Vulkan devices exist). A backend without TQ2_0 (ggml-sycl, ggml-cuda) is compared with TQ2_0 on another
backend of the same GPU: `--device SYCL0 --ref-device Vulkan0` (two runs per round, so those ratios span
runs), or with ggml's common types on itself: `--device CUDA0 --refs q4_0,q8_0 --e2e-types bitcos` (a TQ2_0
model there would run on the CPU). Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from ggml_bitcos.bench import timing
from ggml_bitcos.bench.common import bench_workdir, parse_floats, run_tool, write_json
from ggml_bitcos.bench.gemv import gemv_ratios, merge_tool_rounds, rounds_us, write_gemv_gguf

DEFAULT_SHAPES = "32768x16384,4096x14336"  # DRAM-resident and L2-resident on an H200-class GPU
# the mat-vec references `--refs` can name (gemv.write_gemv_gguf writes each) and the llama-bench models
REF_TYPES = ("tq2_0", "tq1_0", "q4_0", "q8_0")
E2E_TYPES = ("tq1_0", "tq2_0", "bitcos")


def parse_types(allowed: tuple[str, ...]):
    """argparse `type` for a comma list drawn from `allowed` (order kept, at least one)."""

    def parse(text: str) -> list[str]:
        names = [t.strip().lower() for t in text.split(",") if t.strip()]
        bad = [t for t in names if t not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list of {', '.join(allowed)}")
        return names

    return parse


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """ "ROWSxK,ROWSxK" -> [(rows, k), ...] (argparse `type`)."""
    return [(int(r), int(k)) for r, k in (item.lower().split("x") for item in text.split(",") if item.strip())]


def bench_matvec(
    device: str,
    shapes: list[tuple[int, int]],
    zs: list[float],
    reps: int,
    workdir: Path,
    ref_device: str | None = None,
    refs: list[str] | None = None,
    rounds: int = 3,
) -> list[dict[str, Any]]:
    """One gemv-device run over every shape's files: the reference types `refs` (default TQ2_0; z = 0.4, their
    speed does not depend on z) and BITCOS MATRIX per z. Records carry "z" (None for the references) and "shape".
    With `ref_device` (a backend without TQ2_0, e.g. SYCL0, measured against TQ2_0 on Vulkan0 of the same GPU)
    the references run there in a second run. A file already in `workdir` is reused (its name says what it
    holds; it is written whole or not at all), so a second device's run over the same --workdir (the GPU
    session's CUDA and Vulkan runs) spends no time making the same weights again. Each of `rounds` rounds runs
    every file (with `ref_device`: the references' run, then BITCOS's), merged by gemv.merge_tool_rounds."""
    refs = refs or ["tq2_0"]
    workdir.mkdir(parents=True, exist_ok=True)
    files: list[tuple[tuple[int, int], float | None, Path]] = []
    for rows, k in shapes:
        p = workdir / f"gpu-ref-{'-'.join(refs)}-{rows}x{k}.gguf"
        if not p.exists():
            write_gemv_gguf(p, rows, k, 0.4, refs)
        files.append(((rows, k), None, p))
        for z in zs:
            p = workdir / f"gpu-bitcos-matrix-{rows}x{k}-z{z:.2f}.gguf"
            if not p.exists():
                write_gemv_gguf(p, rows, k, z, ["bitcos_matrix"], seed=1)
            files.append(((rows, k), z, p))
    if ref_device is None or ref_device == device:
        runs = [
            run_tool(["gemv-device", ",".join(str(p) for _, _, p in files), device, str(reps), "1"])
            for _ in range(rounds)
        ]
        return [{**rec, "shape": files[rec["file"]][0], "z": files[rec["file"]][1]} for rec in merge_tool_rounds(runs)]
    parts = (
        (ref_device, [f for f in files if f[1] is None]),
        (device, [f for f in files if f[1] is not None]),
    )
    part_runs: list[list[list[dict[str, Any]]]] = [[], []]
    for _ in range(rounds):
        for i, (dev, part) in enumerate(parts):
            part_runs[i].append(run_tool(["gemv-device", ",".join(str(p) for _, _, p in part), dev, str(reps), "1"]))
    out = []
    for (dev, part), runs in zip(parts, part_runs):
        for rec in merge_tool_rounds(runs):
            out.append({**rec, "shape": part[rec["file"]][0], "z": part[rec["file"]][1], "device": dev})
    return out


def matvec_table(records: list[dict[str, Any]], copy_gb_s: float) -> str:
    """Markdown: per shape, the references then BITCOS by z: µs (median and range over rounds), GB/s, fraction
    of the copy bandwidth, the time ratio to each reference (> 1: faster than it; median of the per-round
    ratios with their range, or "within noise")."""
    lines = [f"device copy bandwidth: {copy_gb_s:.1f} GB/s (read + write)"]
    for shape in sorted({tuple(r["shape"]) for r in records}, reverse=True):
        rs = [r for r in records if tuple(r["shape"]) == shape]
        refs = [r for r in rs if r["z"] is None]
        lines += [
            f"\n## {shape[0]} x {shape[1]} (rows x K), one column",
            "| type | z | median µs (min-max) | GB/s | of copy | "
            + " | ".join(f"vs {r['type'].upper()}" for r in refs)
            + " |",
            "|---|---|---|---|---|" + "---|" * len(refs),
        ]
        for r in refs + sorted((r for r in rs if r["z"] is not None), key=lambda r: r["z"]):
            gb_s = r["bytes"] / r["median_us"] / 1e3
            z = "-" if r["z"] is None else f"{r['z']:.2f}"
            lines.append(
                f"| {r['type']} | {z} | {timing.value_cell(rounds_us(r), 1)} | {gb_s:.1f} | {gb_s / copy_gb_s:.2f} | "
                + " | ".join(
                    "-" if ref is r else timing.time_ratio(rounds_us(ref), rounds_us(r)).cell() for ref in refs
                )
                + " |"
            )
    return "\n".join(lines)


def weight_bytes(model: Path) -> int:
    """Bytes of a model's ternary weights and BITCOS companions: what -ngl 99 puts on the device for them."""
    import gguf_tools

    from ggml_bitcos.format import BITCOS_TYPE_IDS, COMPANION_SUFFIX

    def ternary(t) -> bool:  # the format's list of BITCOS types, not a copy of their names here
        return (
            t.tensor_type.name in ("TQ1_0", "TQ2_0")
            or int(t.tensor_type) in BITCOS_TYPE_IDS
            or t.name.endswith(COMPANION_SUFFIX)
        )

    reader = gguf_tools.open_gguf(model)
    return sum(int(t.n_bytes) for t in reader.tensors if ternary(t))


def device_buffer_mib(model: Path, device: str, timeout: float = 600) -> float:
    """MiB of the model buffer llama.cpp allocates on `device` with every layer offloaded, as its load log
    reports it ("CUDA0 model buffer size = ... MiB"): the device memory the weights really take. One token
    of llama-completion; raises RuntimeError when the load fails or the log names no buffer on the device."""
    from ggml_bitcos import llama_run

    cmd = [
        str(llama_run.tool_path("llama-completion")),
        "-m",
        str(model),
        "-p",
        "Hello",
        "-n",
        "1",
        "-ngl",
        "99",
        "-dev",
        device,
        "--temp",
        "0",
        "-no-cnv",
        "--no-warmup",
        "-c",
        "256",
        "-lv",
        "4",
    ]  # the load log's buffer sizes are printed from verbosity 4 on (0.00 in the fitting dry run)
    r = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if r.returncode != 0:
        raise llama_run.tool_failure("llama-completion", r.returncode, model, r.stderr)
    sizes = re.findall(rf"{re.escape(device)} model buffer size =\s*([0-9.]+) MiB", r.stderr)
    if not sizes:
        raise RuntimeError(
            f"llama-completion -dev {device}: no '{device} model buffer size' in its log:\n{r.stderr[-2000:]}"
        )
    return sum(float(x) for x in sizes)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds `bench gpu` to the `bench` subparsers."""
    g = sub.add_parser(
        "gpu",
        help="BITCOS vs TQ2_0 on a GPU device: mat-vec, copy bandwidth, llama-bench -ngl 99",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument("--device", default="Vulkan0", help="ggml backend device (default Vulkan0)")
    g.add_argument(
        "--ref-device",
        default=None,
        help="device for the TQ2_0 reference when --device has no TQ2_0 (e.g. --device SYCL0 "
        "--ref-device Vulkan0 on an Intel Arc GPU); default: the same device",
    )
    g.add_argument(
        "--refs",
        type=parse_types(REF_TYPES),
        default=["tq2_0"],
        help=f"mat-vec reference types, comma list of {', '.join(REF_TYPES)} (default tq2_0; "
        "e.g. q4_0,q8_0 on ggml-cuda, which has no TQ2_0)",
    )
    g.add_argument(
        "--shapes",
        type=parse_shapes,
        default=parse_shapes(DEFAULT_SHAPES),
        help=f"ROWSxK list (default {DEFAULT_SHAPES})",
    )
    g.add_argument("--z", type=parse_floats, default=[0.3, 0.4, 0.5], help="BITCOS zero densities")
    g.add_argument("--reps", type=int, default=20, help="timed graphs per weight and round (16 MUL_MATs each)")
    timing.add_rounds_argument(g, 3, "the mat-vec of every weight, and llama-bench over the models")
    g.add_argument("--copy-mib", type=int, default=1024, help="size of the copy-bandwidth buffer")
    g.add_argument("--e2e-preset", default="bitnet-2b", help="make-model preset for llama-bench")
    g.add_argument("--zero-density", type=float, default=0.42, help="z of the llama-bench model")
    g.add_argument(
        "--e2e-types",
        type=parse_types(E2E_TYPES),
        default=list(E2E_TYPES),
        help="models llama-bench runs, comma list of tq1_0, tq2_0, bitcos (default all three; "
        "bitcos alone on a backend without TQ2_0)",
    )
    g.add_argument("--no-e2e", action="store_true", help="skip llama-bench")
    g.add_argument("--workdir", type=Path, default=None, help="where the generated GGUFs go (default: temp)")
    g.add_argument("--json", type=Path, help="write all measurements as JSON")
    g.set_defaults(func=run)
    return g


def run(args: argparse.Namespace) -> int:
    """`bench gpu`: mat-vec table, copy bandwidth, llama-bench -ngl 99 and device weight bytes."""
    from ggml_bitcos import llama_run
    from ggml_bitcos.bench.e2e import e2e_models, e2e_ratios, e2e_table, merge_rounds

    out: dict[str, Any] = {"device": args.device, "vk_visible": os.environ.get("GGML_VK_VISIBLE_DEVICES")}
    with bench_workdir(args.workdir) as wd:
        copy = run_tool(["copy-device", str(args.copy_mib), args.device, "5"])[0]
        records = bench_matvec(
            args.device, args.shapes, args.z, args.reps, wd, args.ref_device, args.refs, rounds=args.rounds
        )
        print(f"# ggml-bitcos bench gpu on {args.device}")
        print(matvec_table(records, copy["gb_per_s"]))
        out.update(copy=copy, matvec=records, matvec_ratios=gemv_ratios(records, group="shape"))
        if not args.no_e2e:
            models = e2e_models(wd, args.e2e_preset, args.zero_density)
            # each model on the device it is compared on: llama-bench's -dev pins it there (references on
            # --ref-device, BITCOS on --device)
            model_device = {
                t: args.device if t == "bitcos" or not args.ref_device else args.ref_device for t in args.e2e_types
            }
            # in rounds, each running every model once (each on its device: with --ref-device, two llama-bench
            # runs per round)
            devices = list(dict.fromkeys(model_device.values()))
            runs: dict[str, list[list[dict[str, Any]]]] = {dev: [] for dev in devices}
            for _ in range(args.rounds):
                for dev in devices:
                    runs[dev].append(
                        llama_run.run_bench(
                            [models[t] for t in args.e2e_types if model_device[t] == dev],
                            repetitions=1,
                            extra=["-ngl", "99", "-dev", dev],
                        )
                    )
            rows = [r for dev in devices for r in merge_rounds(runs[dev])]
            print(f"\n# llama-bench -ngl 99, {args.e2e_preset} z={args.zero_density}")
            print(e2e_table(rows))
            mem = {t: weight_bytes(models[t]) for t in E2E_TYPES}
            print(
                "\n# file bytes of the ternary weights (MiB): "
                + ", ".join(f"{t.upper()} {b / 2**20:.1f} ({b / mem['tq2_0']:.3f}x TQ2_0)" for t, b in mem.items())
            )
            buffers = {t: device_buffer_mib(models[t], dev) for t, dev in model_device.items()}
            print(
                "# device model buffer at load, all layers offloaded (MiB): "
                + ", ".join(f"{t.upper()} on {model_device[t]} {mib:.1f}" for t, mib in buffers.items())
            )
            vs_tq2 = e2e_ratios(rows, "TQ2_0")
            out.update(
                llama_bench=[{**r, "vs_TQ2_0": vs_tq2[i].as_json()} if i in vs_tq2 else r for i, r in enumerate(rows)],
                weight_bytes=mem,
                device_buffer_mib=buffers,
                e2e_devices=model_device,
            )
    if args.json:
        write_json(args.json, out)
    return 0
