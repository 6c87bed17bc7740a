#!/usr/bin/env python3
"""The product files one source tensor passes through in ``ggml-bitcos convert`` (or ``stats``), in order.

Writes a GGUF holding one ternary weight (TQ2_0 by default; with a norm beside it, copied), runs the command
on it under ``sys.settrace`` from the subcommand's entry point (argument parsing and imports done before), and
follows the weight: every function of ``ggml_bitcos/`` or ``gguf_tools/`` called with it (or with the
converter's result, analysis or output entry of it), and every product function such a function calls (its
rows, codes, scales), is a visit to that function's file; consecutive visits to one file count once. Printed: the files in order, how many there are, and the returns: visits to a file the
tensor had already left. Numbers for issue 31's closing note:

  python3 dev/converter_path.py              # convert
  python3 dev/converter_path.py --stats      # stats (stops after the analysis)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from gguf.constants import GGMLQuantizationType  # noqa: E402

from ggml_bitcos import convert_cli, stats, tq  # noqa: E402
from ggml_bitcos.ternary import random_codes  # noqa: E402
from gguf_tools import GGUFStreamWriter  # noqa: E402

TENSOR = "blk.0.attn_q.weight"
PRODUCT = tuple(str(ROOT / d) + "/" for d in ("ggml_bitcos", "gguf_tools"))


def one_tensor_model(path: Path, src_type: str) -> Path:
    rng = np.random.default_rng(0)
    k, rows = 512, 64
    codes = random_codes(rng, (rows, k), 0.4)
    d = np.full((rows, k // 256), 0.02, dtype=np.float16)
    data = {"tq2_0": tq.tq2_0_encode, "tq1_0": tq.tq1_0_encode}[src_type](codes, d)
    w = GGUFStreamWriter(path, "llama", overwrite=True)
    w.add_tensor_info("blk.0.attn_norm.weight", GGMLQuantizationType.F32, (k,))
    w.add_tensor_info(TENSOR, GGMLQuantizationType[src_type.upper()], (k, rows))
    w.begin()
    w.write_tensor("blk.0.attn_norm.weight", np.ones(k, dtype=np.float32))
    w.write_tensor(TENSOR, data)
    w.finish()
    return path


def trace(argv: list[str], tensor: str) -> list[str]:
    """The product files whose functions are handed ``tensor`` while ``ggml-bitcos ARGV`` runs, in order,
    consecutive duplicates collapsed: every call with an argument named ``tensor`` (a gguf-py tensor, the
    converter's per-tensor result, analysis or output entry: anything whose ``name`` is that name)."""
    parser = argparse.ArgumentParser(prog="ggml-bitcos")
    sub = parser.add_subparsers(required=True)
    convert_cli.register(sub)
    stats.register(sub)
    args = parser.parse_args(argv)
    visits: list[str] = []
    holders: set[int] = set()  # ids of the frames handed the tensor (the id of a finished frame is not reused
    # while one of its callees runs, and a callee is all that is looked up)

    def tracer(frame: FrameType, event: str, _arg: object) -> None:
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(PRODUCT):
            return
        n_args = code.co_argcount + code.co_kwonlyargcount
        values = [frame.f_locals.get(a) for a in code.co_varnames[:n_args]]
        holds = any(not isinstance(v, str) and getattr(v, "name", None) == tensor for v in values)
        if holds:
            holders.add(id(frame))
        if holds or (frame.f_back is not None and id(frame.f_back) in holders):
            f = str(Path(code.co_filename).relative_to(ROOT))
            if not visits or visits[-1] != f:
                visits.append(f)

    sys.settrace(tracer)
    try:
        args.func(args)
    finally:
        sys.settrace(None)
    return visits


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stats", action="store_true", help="trace stats instead of convert")
    p.add_argument("--src-type", choices=("tq2_0", "tq1_0"), default="tq2_0")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = one_tensor_model(Path(tmp) / "one.gguf", a.src_type)
        argv = ["stats", str(src), "-q"] if a.stats else ["convert", str(src), "-o", str(Path(tmp) / "o.gguf"), "-q"]
        visits = trace(argv, TENSOR)
    seen: set[str] = set()
    returns = 0
    for f in visits:
        returns += f in seen
        seen.add(f)
    print(" -> ".join(visits))
    print(f"{len(seen)} files, {len(visits)} visits, {returns} returns to a file the tensor had left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
