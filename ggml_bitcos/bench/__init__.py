"""`ggml-bitcos bench …`: the paper's measurements reproduced on the machine at hand.

* ``gemv``     — Fig. 11: GEMV time over zero density, BITCOS vs TQ2_0 / TQ1_0 (Q4_0 as a familiar
                 reference), through ggml's real CPU MUL_MAT (llama-bitcos-bench), ratios from one run whose
                 repetitions interleave all types (``--order grouped``: back to back, cache-resident).
* ``roofline`` — Table II / Fig. 10: measured per-thread read bandwidth beta and instruction cost gamma
                 (cycles per 32 weights, L1-resident), the predicted bound for each z, next to measured.
* ``bandwidth``— where BITCOS wins: GEMV (and llama-bench tg) speed vs TQ2_0 against the DRAM bandwidth
                 left per compute thread, traffic generators on the other CPUs cutting it, with the roofline's
                 prediction and the crossover.
* ``e2e``      — Fig. 12: llama-bench tg128 / pp512 for one model in TQ1_0, TQ2_0 and BITCOS, in rounds over
                 all models (medians over rounds), and where a generated token's time goes: its ternary
                 matmuls, its other matmuls (llama-bitcos-bench decode) and the rest, with the Amdahl ceiling
                 of the tg ratio.
* ``batched``  — batched decode: MUL_MAT with 1/4/8 columns and llama-server with -np 1/4/8 concurrent
                 sequences (aggregate tokens/s), BITCOS vs TQ2_0 / TQ1_0.
* ``gpu``      — on a GPU backend device (ggml-vulkan): mat-vec BITCOS vs TQ2_0 with the device's copy
                 bandwidth, llama-bench -ngl 99, device memory of the weights.
* ``kernels``  — the BITCOS kernel microbenchmark (ggml_bitcos.bench.kernels).

The maintainers' static instruments (llvm-mca on the CPU kernels, the Vulkan shaders in AMD ISA, CUDA SASS) are
not benchmarks of the user's machine: they live in dev/ (``python3 -m dev.mca``, ``python3 -m dev.gpu_isa``).

Every ratio printed is measured in the same invocation, in rounds that each run every type (A B C, A B C, ...),
and printed as the median of the per-round ratios with their range, or as "within noise" when the rounds do
not agree on a difference (ggml_bitcos.bench.timing); nothing here asserts a timing.
"""

# One module per benchmark (gemv, roofline, bandwidth, e2e, batched, gpu, kernels; codec: the numpy codec's
# throughput, run with `python -m ggml_bitcos.bench.codec`) and common.py for what they share. The modules are imported in
# register() only, so `python -m ggml_bitcos.bench.kernels` runs its module once.

from __future__ import annotations

import argparse
import importlib

# `bench` subcommands in the order `--help` lists them, each a module with add_parser(subparsers)
BENCH_MODULES = ("gemv", "roofline", "bandwidth", "e2e", "batched", "gpu")
# needs the kernel harness binding; left out of the CLI when that cannot be imported
OPTIONAL_BENCH_MODULES = ("kernels",)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `bench` with its gemv, roofline, bandwidth, e2e, batched, gpu and kernels subcommands (CLI registration, see cli.py)."""
    p = subparsers.add_parser(
        "bench",
        help="benchmarks: gemv, roofline, bandwidth, e2e, batched, gpu, kernels",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="bench_cmd", required=True)
    for name in BENCH_MODULES:
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    for name in OPTIONAL_BENCH_MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ImportError:
            continue
        module.add_parser(sub)
