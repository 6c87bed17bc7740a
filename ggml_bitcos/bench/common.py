"""Helpers every benchmark of ``ggml-bitcos bench`` shares: what machine ran it, option parsing, the
llama-bitcos-bench tool, working folders, JSON and figure files.

One place for each, so that the gemv, roofline, e2e and kernels benchmarks describe the machine, parse
comma lists and run the tool the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ggml_bitcos.format import Variant

BENCH_TOOL = "llama-bitcos-bench"


# ------------------------------------------------------------------------------------------ machine
def cpuinfo_field(name: str) -> str | None:
    """Value of the first ``name : value`` line of /proc/cpuinfo (e.g. "model name", "cpu MHz"); None when
    the file or the field is missing (not Linux, restricted container)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name):
            return line.split(":", 1)[1].strip()
    return None


def platform_cpu() -> str:
    """The CPU as Python's platform module names it (often only the architecture, e.g. "x86_64")."""
    return platform.processor() or platform.machine()


def machine_line(threads: list[int]) -> str:
    """One line for a result's title: CPU model, logical CPUs and the thread counts measured."""
    cpu = cpuinfo_field("model name") or platform_cpu()
    return f"{cpu}, {os.cpu_count()} logical CPUs, threads {','.join(map(str, threads))}"


def tsc_ghz() -> float:
    """Cycle counter rate (rdtsc ticks per ns), from /proc/cpuinfo's 'cpu MHz' as a fallback estimate."""
    mhz = cpuinfo_field("cpu MHz")
    return float(mhz) / 1000.0 if mhz is not None else float("nan")


# -------------------------------------------------------------------------------------------- options
def parse_floats(text: str) -> list[float]:
    """Comma list of floats (argparse `type`): "0,0.4,0.95" -> [0.0, 0.4, 0.95]; empty items skipped."""
    return [float(x) for x in text.split(",") if x.strip()]


def parse_ints(text: str) -> list[int]:
    """Comma list of ints (argparse `type`): "1,4,16" -> [1, 4, 16]; empty items skipped."""
    return [int(x) for x in text.split(",") if x.strip()]


# the BITCOS types the GEMV benchmarks time unless told otherwise: what `convert` (format version 2, --scale auto)
# writes for the common sources, MATRIX for one scale per tensor (BitNet) and B256 for TQ2_0's per-256 scales
DEFAULT_BITCOS_TYPES = ("bitcos_matrix", "bitcos_b256")


def bitcos_variant(name: str) -> Variant:
    """The variant of a benchmark type name ``bitcos_<variant>``: bitcos_pt, bitcos_g128 (format version 1),
    bitcos_matrix, bitcos_row, bitcos_b128, bitcos_b256 (version 2); ValueError for any other name."""
    variant = Variant.__members__.get(name[len("bitcos_") :].upper()) if name.startswith("bitcos_") else None
    if variant is None:
        names = ", ".join(v.name.lower() for v in Variant)
        raise ValueError(f"unknown BITCOS type {name!r}: bitcos_<variant>, variant one of {names}")
    return variant


def parse_bitcos_types(text: str) -> list[str]:
    """``--bitcos-types`` (argparse `type`): a comma list of bitcos_<variant> names, in order, each once."""
    names = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    try:
        for name in names:
            bitcos_variant(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not names:
        raise argparse.ArgumentTypeError("--bitcos-types: at least one bitcos_<variant>")
    return names


def add_bitcos_types_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """Adds ``--bitcos-types`` to a GEMV benchmark's parser; `what` says what the types are timed in."""
    parser.add_argument(
        "--bitcos-types",
        type=parse_bitcos_types,
        default=list(DEFAULT_BITCOS_TYPES),
        help=f"comma list of the BITCOS types {what}: bitcos_matrix, bitcos_row, bitcos_b128, bitcos_b256 "
        "(format version 2), bitcos_pt, bitcos_g128 (version 1; what older readers load) "
        f"(default {','.join(DEFAULT_BITCOS_TYPES)}: what `convert` writes)",
    )


def default_threads() -> list[int]:
    """Thread counts measured unless told otherwise: one thread and all logical CPUs."""
    return sorted({1, os.cpu_count() or 1})


# --------------------------------------------------------------------------------- llama-bitcos-bench
def run_tool(args: list[str], timeout: float = 3600) -> list[dict[str, Any]]:
    """Runs ``llama-bitcos-bench ARGS`` (installed with the patched llama.cpp) and returns its JSON records,
    one per stdout line starting with "{"; raises RuntimeError with the end of stderr when it fails."""
    from ggml_bitcos import llama_run

    exe = llama_run.tool_path(BENCH_TOOL)
    r = subprocess.run(
        [str(exe), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if r.returncode != 0:
        raise RuntimeError(f"{BENCH_TOOL} {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def read_bandwidth_gb_s(threads: int) -> float:
    """Measured read bandwidth (GB/s) of `threads` threads streaming a 1 GiB buffer (best of 5): the beta
    of the roofline and the DRAM floor of the decode breakdown."""
    return run_tool(["bandwidth", "1024", str(threads), "5"])[0]["gb_per_s"]


# ---------------------------------------------------------------------------------------------- files
@contextlib.contextmanager
def bench_workdir(requested: Path | None) -> Iterator[Path]:
    """The folder for a benchmark's generated files: `requested` (kept afterwards) or a temporary folder
    removed when the block ends."""
    if requested is not None:
        yield requested
        return
    with tempfile.TemporaryDirectory(prefix="bitcos-bench-") as td:
        yield Path(td)


def write_json(path: Path, data: Any, **dumps_kwargs: Any) -> None:
    """Writes `data` as indented JSON (the --json files of the benchmarks)."""
    path.write_text(json.dumps(data, indent=1, **dumps_kwargs))


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, out: Path, title: str) -> None:
    """Titles, lays out and writes a benchmark figure (PNG at 110 dpi, as in docs/img)."""
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
