"""Throughput of the numpy reference codec (ggml_bitcos.codec): M weights/s of encode, decode and
decode + to_float per variant.

    python -m ggml_bitcos.bench.codec [ZERO_DENSITY]      # default 0.4
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np

from ggml_bitcos.codec import decode, encode
from ggml_bitcos.format import QK, Variant
from ggml_bitcos.ternary import random_codes


def measure_throughput(
    rows: int = 4096, k: int = 4096, z: float = 0.4, repeats: int = 5, seed: int = 0
) -> dict[str, float]:
    """Median M weights/s of encode, decode (to codes, all checks) and decode + to_float, per variant,
    on one thread (numpy here does not multithread these operations)."""
    rng = np.random.default_rng(seed)
    codes = random_codes(rng, (rows, k), z)
    d = rng.uniform(0.01, 1.0, (rows, k // QK)).astype(np.float16)
    s = np.array([0.5], dtype=np.float32)
    n = rows * k
    out: dict[str, float] = {}

    def median_rate(fn: Callable[[], object]) -> float:
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return n / sorted(ts)[len(ts) // 2] / 1e6

    for v in (Variant.G128, Variant.PT):
        enc = encode(codes, v, block_scales=d, matrix_scales=s)
        out[f"{v.name} encode"] = median_rate(lambda: encode(codes, v, block_scales=d, matrix_scales=s))
        out[f"{v.name} decode"] = median_rate(lambda: decode(enc.blocks, enc.companion, v, k, rows, 1))
        out[f"{v.name} decode+float"] = median_rate(lambda: decode(enc.blocks, enc.companion, v, k, rows, 1).to_float())
    return out


def main(argv: list[str] | None = None) -> int:
    """Prints measure_throughput() at the zero density given as the only argument (default 0.4)."""
    argv = sys.argv[1:] if argv is None else argv
    z = float(argv[0]) if argv else 0.4
    for key, val in measure_throughput(z=z).items():
        print(f"{key:<20} {val:8.1f} M weights/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
