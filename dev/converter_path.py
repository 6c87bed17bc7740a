#!/usr/bin/env python3
"""The product files one source tensor passes through in ``ggml-bitcos convert`` (or ``stats``), in order.

Writes a GGUF holding one ternary weight (TQ2_0 by default; with a norm beside it, copied), runs the command
on it under ``sys.settrace`` from the subcommand's entry point (argument parsing and imports done before),
and records every call of a function of ``ggml_bitcos/`` or ``gguf_tools/``. A call *carries* the tensor
when an argument is it or a record holding it in a field (the reader's tensor, the converter's result,
analysis, plan or output entry: an object whose ``name`` is the tensor's name). Two counts, each with its
files in order (consecutive visits to one file count once) and its *returns*: visits to a file the tensor
had already left.

* the pass path (the default): visits are the ``ggml_bitcos`` calls that carry the tensor. Leaf calls do
  not count as visits: a call into what the passes read the tensor with (the GGUF layer ``gguf_tools/``,
  the row reader: ``LEAF_FUNCTIONS``), or a call that does not carry the tensor (the codecs on its rows,
  codes and scales; sizes), with everything it calls in turn; they are listed per file. The same rule and
  the same leaf functions count every version of the converter, also those from before its passes.
* ``--all``, the rule of issue 31's first numbers: a visit is every call whose arguments include the tensor
  or an object named like it (no record fields), and every product function such a call calls directly
  (leaf calls included).

  python3 dev/converter_path.py              # convert
  python3 dev/converter_path.py --stats      # stats (stops after the analysis)
  python3 dev/converter_path.py --functions  # the path's functions, file:function
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, FunctionType, ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from gguf.constants import GGMLQuantizationType  # noqa: E402

from ggml_bitcos import convert_cli, stats, tq  # noqa: E402
from ggml_bitcos.ternary import random_codes  # noqa: E402
from gguf_tools import GGUFStreamWriter  # noqa: E402

TENSOR = "blk.0.attn_q.weight"
PACKAGE = str(ROOT / "ggml_bitcos") + "/"
PRODUCT = (PACKAGE, str(ROOT / "gguf_tools") + "/")
# the row reader: product functions handed the tensor that only read it (its rows as fp32, the form the reader
# gave it), by the same names in every version of the converter; with the GGUF layer, leaf calls
LEAF_FUNCTIONS = {
    ("ggml_bitcos/source.py", "source_float_rows"),
    ("ggml_bitcos/source.py", "iter_row_chunks"),
    ("ggml_bitcos/foreign.py", "tensor_form"),
}


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


@dataclass
class Call:
    file: str  # relative to ROOT
    function: str
    named: bool  # an argument is named like the tensor (the --all rule)
    carries: bool  # an argument is the tensor or a record holding it in a field
    caller: Call | None  # the calling frame's call when it is a product function, else None
    product_parent: Call | None  # the nearest product function up the stack

    @property
    def leaf_library(self) -> bool:
        return not self.file.startswith("ggml_bitcos/") or (self.file, self.function) in LEAF_FUNCTIONS


def _named(v: object, tensor: str) -> bool:
    return not isinstance(v, str) and getattr(v, "name", None) == tensor


def _carries(v: object, tensor: str) -> bool:
    if _named(v, tensor):
        return True
    fields = getattr(v, "__dict__", None)
    if not isinstance(fields, dict) or isinstance(v, (type, ModuleType, FunctionType)):
        return False
    return any(_named(f, tensor) for f in list(fields.values()))


def trace(argv: list[str], tensor: str) -> list[Call]:
    """Every product call while ``ggml-bitcos ARGV`` runs, in order."""
    parser = argparse.ArgumentParser(prog="ggml-bitcos")
    sub = parser.add_subparsers(required=True)
    convert_cli.register(sub)
    stats.register(sub)
    args = parser.parse_args(argv)
    calls: list[Call] = []
    active: dict[int, Call] = {}  # id of a running product frame -> its call (removed when it returns)

    def tracer(frame: FrameType, event: str, _arg: object) -> Callable | None:
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(PRODUCT):
            return None
        n_args = code.co_argcount + code.co_kwonlyargcount
        values = [frame.f_locals.get(a) for a in code.co_varnames[:n_args]]
        up = frame.f_back
        while up is not None and id(up) not in active:
            up = up.f_back
        caller = active.get(id(frame.f_back)) if frame.f_back is not None else None
        call = Call(
            str(Path(code.co_filename).relative_to(ROOT)),
            code.co_name,
            any(_named(v, tensor) for v in values),
            any(_carries(v, tensor) for v in values),
            caller,
            active.get(id(up)) if up is not None else None,
        )
        calls.append(call)
        active[id(frame)] = call
        frame.f_trace_lines = False

        def local(f: FrameType, ev: str, _a: object) -> None:
            if ev == "return":
                active.pop(id(f), None)

        return local

    sys.settrace(tracer)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the command's own report
            args.func(args)
    finally:
        sys.settrace(None)
    return calls


def all_rule(calls: list[Call]) -> list[str]:
    """--all: the files of the calls named like the tensor and of the product functions they call directly."""
    return [c.file for c in calls if c.named or (c.caller is not None and c.caller.named)]


def pass_path(calls: list[Call]) -> tuple[list[Call], Counter[str]]:
    """The path's calls (ggml_bitcos calls carrying the tensor outside leaf calls) and the leaf calls per
    file:function."""
    role: dict[int, str] = {}  # id(call) -> "path" | "leaf" | "inside" (a leaf call's callees) | ""
    path: list[Call] = []
    leaves: Counter[str] = Counter()
    for c in calls:
        parent = role.get(id(c.product_parent), "") if c.product_parent is not None else ""
        if parent in ("leaf", "inside"):
            r = "inside"
        elif c.carries and not c.leaf_library:
            r = "path"
            path.append(c)
        elif (c.carries and c.leaf_library) or parent == "path":
            r = "leaf"
            leaves[f"{c.file}:{c.function}"] += 1
        else:
            r = ""
        role[id(c)] = r
    return path, leaves


def collapse(files: list[str]) -> tuple[list[str], int]:
    """Consecutive repeats collapsed, and the returns."""
    visits = [f for i, f in enumerate(files) if i == 0 or files[i - 1] != f]
    seen: set[str] = set()
    returns = 0
    for f in visits:
        returns += f in seen
        seen.add(f)
    return visits, returns


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stats", action="store_true", help="trace stats instead of convert")
    p.add_argument("--src-type", choices=("tq2_0", "tq1_0"), default="tq2_0")
    p.add_argument("--all", action="store_true", help="issue 31's first rule: leaf calls count as visits")
    p.add_argument("--functions", action="store_true", help="name each visit's functions (file:function)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = one_tensor_model(Path(tmp) / "one.gguf", a.src_type)
        argv = ["stats", str(src), "-q"] if a.stats else ["convert", str(src), "-o", str(Path(tmp) / "o.gguf"), "-q"]
        calls = trace(argv, TENSOR)
    if a.all:
        files = all_rule(calls)
        leaves: Counter[str] = Counter()
        named = [f"{c.file}:{c.function}" for c in calls if c.named or (c.caller is not None and c.caller.named)]
    else:
        path, leaves = pass_path(calls)
        files = [c.file for c in path]
        named = [f"{c.file}:{c.function}" for c in path]
    visits, returns = collapse(files)
    print(" -> ".join(collapse(named)[0] if a.functions else visits))
    print(f"{len(set(visits))} files, {len(visits)} visits, {returns} returns to a file the tensor had left")
    if leaves:
        per_file: Counter[str] = Counter()
        for key, n in leaves.items():
            per_file[key.split(":")[0]] += n
        print("leaf calls: " + ", ".join(f"{f} {n}" for f, n in sorted(per_file.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
