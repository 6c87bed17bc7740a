"""A/B timing of the BITCOS kernels across the format-version-2 descriptor change (docs/notes/2026-12-02-kernels-history.md §6e).

Loads a harness library built from the sources before the change (v1 entry points: variant, blocks, row
bytes, pool, sign positions, scale) next to this checkout's (ggml_bitcos.harness) into one process and
times both on the same bytes (the reference codec's v1 G128 / PT encodings, identical in both versions),
alternating batches of calls, so that a machine shared with other jobs slows both alike. Prints, per
implementation, the mean of the faster half of each batch's TSC ticks per 32 weights (best batch), and the
ratio after / before: the minimum alone moves in steps of the VM's TSC granularity (26 ticks here, 2 % of a
16 x 2048 GEMV call), the faster half's mean resolves below it and still drops the calls another job hit.

    git archive 2fb3dce^ | tar -x -C /tmp/before && cmake -S /tmp/before -B /tmp/before/build/kernels \\
        -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/before/build/kernels
    PYTHONPATH=. python3 scripts/kernels-ab.py /tmp/before/build/kernels/libbitcos_kernels.so [ROWS K]
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

from ggml_bitcos import harness
from ggml_bitcos.format import QK, Variant
from ggml_bitcos.q8k import random_q8k
from ggml_bitcos.ternary import random_codes

REPS, ROUNDS = 300, 7


def faster_half(ticks: np.ndarray) -> float:
    """Mean of the faster half of one batch's call times."""
    t = np.sort(np.asarray(ticks, dtype=np.float64))
    return float(t[:len(t) // 2].mean())


def main(argv: list[str]) -> int:
    old = ctypes.CDLL(argv[1])
    rows = int(argv[2]) if len(argv) > 2 else 16
    k = int(argv[3]) if len(argv) > 3 else 2048
    vp, i64, i32, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
    old.bitcos_h_time.argtypes = [i32, i32, i64, vp, sz, vp, vp, ctypes.c_float, i64, vp, i64, vp, i32, vp]
    rng = np.random.default_rng(1)
    codes = random_codes(rng, (rows, k), 0.4)
    rnd = rng.uniform(0, 2, (rows, k // QK)).astype(np.float16)
    eq = np.repeat(rnd[:, ::2], 2, axis=1)
    # (name, variant, scales, the v1 case timed as "before")
    cases = [("g128-random", Variant.G128, dict(block_scales=rnd), None),
             ("g128-equal", Variant.G128, dict(block_scales=eq), None),
             ("pt", Variant.PT, dict(scale=0.5), None),
             ("matrix~pt", Variant.MATRIX, dict(scale=0.5), "pt"),
             ("b256~g128eq", Variant.B256, dict(block_scales=rnd[:, ::2]), "g128-equal")]
    ws = {name: harness.encode_rows(codes, v, **kw) for name, v, kw, _ in cases}

    def t_old(impl: str, w: harness.BitcosRows, y: np.ndarray, nc: int) -> int:
        dst = np.empty((nc, rows), np.float32)
        ticks = np.zeros(REPS, np.uint64)
        rc = old.bitcos_h_time(harness.kernel_index(impl), int(w.variant), k, w.blocks.ctypes.data, w.blocks.shape[1],
                               w.pool.ctypes.data, w.sign_pos.ctypes.data, w.scale, rows, y.ctypes.data, nc,
                               dst.ctypes.data, REPS, ticks.ctypes.data)
        if rc != 0:
            raise RuntimeError(f"old bitcos_h_time: {rc}")
        return faster_half(ticks)

    print(f"{rows} x {k}, z = 0.4, TSC ticks per 32 weights (faster half of {REPS} calls, best of {ROUNDS}), A/B interleaved")
    for nc in (1, 4, 16):
        y = random_q8k(np.random.default_rng(nc), nc, k)
        for impl in ("avx2", "avx512"):
            if not harness.available(impl):
                continue
            for name, _, _, before in cases:
                a = b = float("inf")
                for _ in range(ROUNDS):
                    b = min(b, t_old(impl, ws[before or name], y, nc))
                    a = min(a, faster_half(harness.time_mm(impl, ws[name], y, REPS)))
                u = rows * k * nc / 32
                print(f"nc={nc:2d} {impl:6s} {name:12s} before {b / u:6.3f} after {a / u:6.3f} ratio {a / b:5.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
