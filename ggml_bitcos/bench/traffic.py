"""Memory-traffic generators for `ggml-bitcos bench bandwidth`: processes pinned to the CPUs the compute thread
does not use, each reading, writing or copying a buffer much larger than the last-level cache
(csrc/bitcos-traffic.c through the harness library), at a set rate or flat out, so that the compute thread has
the DRAM bandwidth per core of a busier machine. A generator is this module run as a process:

    python -m ggml_bitcos.bench.traffic MODE RATE CPU MIB
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

TRAFFIC_MODES = {"read": 0, "write": 1, "copy": 2}  # csrc/bitcos-traffic.c BITCOS_TRAFFIC_*


def compute_cpu() -> int:
    """The CPU the compute thread is pinned to: the first this process may run on (CPU 0 on a plain machine;
    a container's cpuset may start elsewhere). The generators take the others, in order."""
    return min(os.sched_getaffinity(0))


def generator_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0) - {compute_cpu()})


GENERATOR_BUFFER_MIB = 512  # per generator: well above any last-level cache here
GENERATOR_SLICE_S = 0.2  # how often a generator checks for the stop signal


# ------------------------------------------------------------------------------------------- levels
@dataclass(frozen=True)
class Level:
    """One traffic level: `count` generators of `mode` at `rate` GB/s each (0: flat out)."""

    mode: str
    rate: float = 0.0
    count: int = 0

    @property
    def label(self) -> str:
        if self.mode == "none":
            return "none"
        rate = f":{self.rate:g}" if self.rate > 0 else ""
        return f"{self.mode}{rate}*{self.count}"


def parse_level(text: str, other_cpus: int) -> Level:
    """MODE[:RATE][*COUNT] -> Level; COUNT defaults to every CPU but the compute CPU."""
    text = text.strip()
    count = other_cpus
    if "*" in text:
        text, c = text.split("*", 1)
        count = int(c)
    rate = 0.0
    if ":" in text:
        text, r = text.split(":", 1)
        rate = float(r)
    if text == "none":
        return Level("none")
    if text not in TRAFFIC_MODES:
        raise argparse.ArgumentTypeError(f"unknown traffic mode {text!r} (none, {', '.join(TRAFFIC_MODES)})")
    if count < 1 or count > other_cpus:
        raise argparse.ArgumentTypeError(
            f"{count} generators need {count} CPUs besides CPU {compute_cpu()}; this machine has {other_cpus}"
        )
    return Level(text, rate, count)


# --------------------------------------------------------------------------------------- generators
def traffic_lib() -> ctypes.CDLL:
    """The harness library with bitcos_h_traffic (built with the kernels: `pip install .` or build/kernels)."""
    from ggml_bitcos import harness

    lib = harness.load_library(True)
    if not hasattr(lib, "bitcos_h_traffic"):
        raise harness.KernelLibraryNotFound(
            f"{harness.library_path(True)} predates the traffic generator; rebuild it (`pip install .` or "
            "`cmake --build build/kernels`)"
        )
    lib.bitcos_h_traffic.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_double,
        ctypes.c_double,
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_uint64),
    ]
    lib.bitcos_h_traffic.restype = ctypes.c_double
    return lib


def generator_main(mode: str, rate: float, cpu: int, mib: int) -> int:
    """Body of one generator process: pins itself to `cpu`, says "ready", generates traffic until SIGTERM,
    then prints one JSON line with the bytes it touched per second."""
    os.sched_setaffinity(0, {cpu})
    lib = traffic_lib()
    buf = np.ones(mib << 20, dtype=np.uint8)  # touched once here, so no page faults while measured
    stop = False

    def on_term(_sig: int, _frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    moved, checksum = ctypes.c_uint64(0), ctypes.c_uint64(0)
    total, elapsed = 0, 0.0
    while not stop:
        t = lib.bitcos_h_traffic(
            TRAFFIC_MODES[mode],
            buf.ctypes.data,
            buf.nbytes,
            rate,
            GENERATOR_SLICE_S,
            ctypes.byref(moved),
            ctypes.byref(checksum),
        )
        if t < 0:
            raise RuntimeError("bitcos_h_traffic: bad arguments")
        total += moved.value
        elapsed += t
    print(
        json.dumps(
            {
                "cpu": cpu,
                "mode": mode,
                "gb_per_s": total / elapsed / 1e9 if elapsed else 0.0,
                "checksum": checksum.value,
            }
        ),
        flush=True,
    )
    return 0


@contextmanager
def traffic(level: Level, cpus: list[int]) -> Iterator[list[dict[str, Any]]]:
    """Runs the level's generators on the first `count` of `cpus` while the block runs;
    afterwards the list yielded
    holds each generator's measured GB/s."""
    procs: list[subprocess.Popen[str]] = []
    stats: list[dict[str, Any]] = []
    try:
        for i in range(level.count):
            cpu = cpus[i]
            p = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ggml_bitcos.bench.traffic",
                    level.mode,
                    str(level.rate),
                    str(cpu),
                    str(GENERATOR_BUFFER_MIB),
                ],
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
            )
            procs.append(p)
        for p in procs:
            line = p.stdout.readline() if p.stdout else ""
            if line.strip() != "ready":
                raise RuntimeError(f"traffic generator failed to start (exit {p.poll()})")
        time.sleep(0.3)  # let the generators reach their steady rate
        yield stats
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                out, _ = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            for line in (out or "").splitlines():
                if line.startswith("{"):
                    stats.append(json.loads(line))


@contextmanager
def pinned(cpu: int) -> Iterator[None]:
    """Pins this process (and the tools it starts) to one CPU for the block."""
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


def main(argv: list[str] | None = None) -> int:
    mode, rate, cpu, mib = (sys.argv[1:] if argv is None else argv)[:4]
    return generator_main(mode, float(rate), int(cpu), int(mib))


if __name__ == "__main__":
    sys.exit(main())
