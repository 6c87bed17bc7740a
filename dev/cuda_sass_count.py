#!/usr/bin/env python3
"""Static instruction count of a CUDA GEMV's steady-state loop, per weight and lane, by instruction class.

No GPU needed: compiles a kernel for one architecture (nvcc -cubin, ggml-cuda's flags), disassembles it
(nvdisasm, else cuobjdump), splits the kernel into basic blocks, finds its loops (back edges, natural loop
bodies) and counts the instructions one iteration of the hot loop issues: every instruction of its body (an
inner loop's body times its trip count), divided by the weights one lane handles per iteration. Predicated-off
instructions issue too, so they count; both arms of a branch inside the loop count (an upper bound where
the loop has such branches: the report says how many it has).

Targets (what the numbers in docs/GPU.md §3 were measured with):
  bitcos  the BITCOS mat-vec, tests/cuda/test-bitcos-cuda.cu's instance for one activation column; hot loop:
          the loop holding the warp prefix sum (SHFL.UP): two 32-bit bitmap words (64 weights) per lane per
          iteration (one word at commit fa24b23 and before); of its per-layout loops the cheapest, the
          others listed
  bitcos4 the same for 4 columns sharing one decode, counted per weight and column
  tq2     tests/cuda/tq2-reference.cu: a TQ2_0-like 2-bit GEMV (dp4a), 64 weights per lane per iteration

  bitcos and bitcos4 take --lanes (32, 16, 8: the instance with that many lanes a row, several rows a warp
  below 32; default 32). --k K1,K2,..: the effective count over whole rows of K weights at 32, 16 and 8 lanes
  a row: per row, its fixed cost (the blocks of the row loop on this layout's path outside the hot loop: row
  setup, segment reduction, store, loop control) + its whole steps x the hot loop + the partial last step
  (the path's blocks between the hot loop and the reduction) if the row's words do not fill its steps,
  divided by the weights of the row a lane has (K / lanes); both arms of a branch on the path count.

  python3 dev/cuda_sass_count.py                 # both targets, this tree, sm_90
  python3 dev/cuda_sass_count.py --rev fa24b23   # the bitcos target as it was at a commit
  python3 dev/cuda_sass_count.py bitcos --k 2048,2560,4096,6912,14336   # whole rows, 32 / 16 / 8 lanes
  python3 dev/cuda_sass_count.py --json          # machine-readable

The disassembler: $NVDISASM / $CUOBJDUMP, PATH, the CUDA toolkit's bin, or the PyPI wheels installed under
~/.cache/ggml-bitcos/cuda-tools (--fetch installs them there with pip; nvcc 13.0's toolkit here has none).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as `python3 dev/cuda_sass_count.py`: the checkout's root holds the dev package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from dev.loops import natural_loop, predecessors, reachable  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOOLS_DIR = Path.home() / ".cache" / "ggml-bitcos" / "cuda-tools"
TOOLS_PIP = ("nvidia-cuda-nvdisasm==13.2.78", "nvidia-cuda-cuobjdump==13.2.78")

# Instruction classes: opcode (before the first '.') -> class. What matters on Hopper is which pipe issues it:
# the ALU pipe (16 lanes per scheduler: half the issue rate) runs logic, shifts, integer adds, compares, byte
# permutes; the FMA-heavy pipe (also half rate) runs IMAD and IDP4A; POPC has a quarter of the ALU's rate.
CLASSES = {
    "LOP3": "logic/shift",
    "SHF": "logic/shift",
    "PRMT": "logic/shift",
    "LEA": "logic/shift",
    "IADD3": "int add/cmp",
    "ISETP": "int add/cmp",
    "SEL": "int add/cmp",
    "IMNMX": "int add/cmp",
    "VIADD": "int add/cmp",
    "IABS": "int add/cmp",
    "SGXT": "logic/shift",
    "BMSK": "logic/shift",
    "IMAD": "IMAD",
    "IMUL": "IMAD",
    "IDP": "DP4A",
    "IDP4A": "DP4A",
    "FFMA": "FP32",
    "FADD": "FP32",
    "FMUL": "FP32",
    "FMNMX": "FP32",
    "FSEL": "FP32",
    "FSETP": "FP32",
    "HADD2": "FP32",
    "HFMA2": "FP32",
    "I2F": "convert",
    "F2I": "convert",
    "I2FP": "convert",
    "F2FP": "convert",
    "POPC": "POPC",
    "FLO": "POPC",
    "BREV": "POPC",
    "LDS": "LDS",
    "LDG": "LDG",
    "LD": "LDG",
    "LDC": "LDC",
    "ULDC": "uniform",
    "SHFL": "SHFL",
    "BRA": "branch",
    "BSSY": "branch",
    "BSYNC": "branch",
    "WARPSYNC": "branch",
    "BREAK": "branch",
    "MOV": "move",
    "CS2R": "move",
    "S2R": "move",
    "S2UR": "move",
    "R2UR": "move",
    "PLOP3": "predicate",
    "P2R": "predicate",
    "R2P": "predicate",
}


def classify(op: str) -> str:
    base = op.split(".")[0]
    if base.startswith("U") and base not in CLASSES:
        return "uniform"  # the uniform datapath: one issue per warp, off the vector pipes
    return CLASSES.get(base, "other")


@dataclass
class Instr:
    addr: int
    pred: str
    op: str
    args: str

    @property
    def text(self) -> str:
        return f"{self.pred + ' ' if self.pred else ''}{self.op} {self.args}".strip()


@dataclass
class Block:
    start: int  # index of its first instruction
    end: int  # one past its last
    label: str | None
    succ: list[int] = field(default_factory=list)


LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
LABEL = re.compile(r"^(\.L_[A-Za-z0-9_]+):")
FUNC = re.compile(r"^\s*\.text\.([A-Za-z0-9_$.]+):")
TARGET = re.compile(r"`\((\.L_[A-Za-z0-9_]+)\)")


def parse_functions(sass: str) -> dict[str, tuple[list[Instr], dict[str, int]]]:
    """nvdisasm -c output -> {mangled name: (instructions, label -> index of the next instruction)}."""
    funcs: dict[str, tuple[list[Instr], dict[str, int]]] = {}
    cur = None
    for line in sass.splitlines():
        m = FUNC.match(line)
        if m:
            cur = funcs.setdefault(m.group(1), ([], {}))
            continue
        if cur is None:
            continue
        m = LABEL.match(line.strip())
        if m:
            cur[1][m.group(1)] = len(cur[0])
            continue
        m = LINE.search(line)
        if m:
            cur[0].append(Instr(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4).strip()))
    return funcs


def build_blocks(ins: list[Instr], labels: dict[str, int]) -> tuple[list[Block], dict[int, int]]:
    """Basic blocks and the map instruction index -> block index."""
    starts = {0, *labels.values()}
    for i, x in enumerate(ins):
        if x.op.split(".")[0] in ("BRA", "BRX", "EXIT", "RET", "BREAK") and i + 1 < len(ins):
            starts.add(i + 1)
    starts = sorted(s for s in starts if s < len(ins))
    label_at = {v: k for k, v in labels.items()}
    blocks = [Block(s, e, label_at.get(s)) for s, e in zip(starts, starts[1:] + [len(ins)])]
    of = {}
    for bi, b in enumerate(blocks):
        for i in range(b.start, b.end):
            of[i] = bi
    for bi, b in enumerate(blocks):
        last = ins[b.end - 1]
        base = last.op.split(".")[0]
        uncond = last.pred in ("", "@PT")
        if last.op.startswith("BRA.DIV"):
            # the divergent-warp fallback of a warp shuffle: never taken by a converged warp, and its code
            # jumps back into the loop; leaving the edge out keeps that code out of the loop
            if bi + 1 < len(blocks):
                b.succ.append(bi + 1)
        elif base == "BRA":
            t = TARGET.search(last.args)
            if t and t.group(1) in labels and labels[t.group(1)] < len(ins):
                b.succ.append(of[labels[t.group(1)]])
            if not uncond and bi + 1 < len(blocks):
                b.succ.append(bi + 1)
        elif base in ("EXIT", "RET"):
            if not uncond and bi + 1 < len(blocks):
                b.succ.append(bi + 1)
        elif bi + 1 < len(blocks):
            b.succ.append(bi + 1)
    return blocks, of


@dataclass
class Loop:
    header: int
    latch: int
    body: set[int]
    trips: int | None = None  # for an inner loop: iterations per iteration of its parent


def find_loops(blocks: list[Block]) -> list[Loop]:
    """Natural loops of the back edges u -> h (h at or before u in layout order, as nvcc lays loops out)."""
    succ = [b.succ for b in blocks]
    reach = reachable(succ)
    preds = predecessors(succ, reach)
    return [Loop(h, u, natural_loop(preds, h, u)) for u in sorted(reach) for h in succ[u] if h <= u]


def counted_trips(ins: list[Instr], blocks: list[Block], loop: Loop) -> int | None:
    """Trip count of a loop of the form `i = 0; do { ...; i += 1 } while (i != N)`: the register compared
    with an immediate by the (U)ISETP.NE that decides the back edge, incremented by one in the body."""
    idx = [i for bi in loop.body for i in range(blocks[bi].start, blocks[bi].end)]
    for i in sorted(idx, reverse=True):
        x = ins[i]
        if x.op.split(".")[0] in ("ISETP", "UISETP") and ".NE." in x.op + ".":
            parts = [p.strip() for p in x.args.split(",")]
            if len(parts) >= 4 and re.fullmatch(r"0x[0-9a-f]+|[0-9]+", parts[3]):
                reg = parts[2]
                incr = any(
                    ins[j].op.split(".")[0] in ("IADD3", "UIADD3", "VIADD")
                    and ins[j].args.replace(" ", "").startswith(f"{reg},{reg},0x1")
                    for j in idx
                )
                if incr:
                    return int(parts[3], 0)
    return None


@dataclass
class Report:
    kernel: str
    weights_per_iter: int
    instructions_per_iter: float
    by_class: dict[str, float]
    inner_loops: list[tuple[str, int, int]]  # (header label, instructions per trip, trips)
    branches_in_body: int
    alternatives: list[tuple[float, str]] = field(default_factory=list)
    row_overhead: float | None = None  # per row (segment) outside the hot loop and its partial step
    tail_step: float | None = None  # the partial last step after the whole ones
    row_calls: list[str] = field(default_factory=list)  # CALLs on the row's path (their callees not counted)
    tail_parts: int = 1  # the partial step's code as this many equal steps (prefix sums)

    def effective(self, k: int, lanes: int, words_per_lane: int = 2) -> float:
        """Instructions per weight per lane (and column, for several) over a whole row of k weights with
        `lanes` lanes a row: the row's overhead, its whole steps (hot-loop iterations) and, if the row's words
        do not fill them, the partial last step, divided by the weights a lane has of the row (k / lanes)."""
        n_words = k // 32
        step = words_per_lane * lanes
        whole, partial = divmod(n_words, step)
        # the partial step's code: tail_parts sub-steps of step / tail_parts words each, as many run as the rest
        # needs (one two-word step before commit 2ad8842; now up to two one-word half steps)
        sub_words = step // self.tail_parts
        parts = -(-partial // sub_words)
        per_row = (
            (self.row_overhead or 0.0)
            + whole * self.instructions_per_iter
            + (self.tail_step or 0.0) * parts / self.tail_parts
        )
        cols = self.weights_per_iter / (32 * words_per_lane)
        return per_row * lanes / k / cols

    @property
    def per_weight(self) -> float:
        return self.instructions_per_iter / self.weights_per_iter


def loop_weights(
    ins: list[Instr], blocks: list[Block], loops: list[Loop], hot: Loop, kernel: str, trips_override: dict[str, int]
) -> tuple[dict[int, int], list[tuple[str, int, int]]]:
    """How often each block of `hot` runs per iteration of it (inner loops' trip counts multiplied in)."""
    weight = {bi: 1 for bi in hot.body}
    rep = []
    for lp in sorted((lp for lp in loops if lp.body < hot.body), key=lambda lp: len(lp.body)):
        lab = blocks[lp.header].label or f"block{lp.header}"
        t = trips_override.get(lab) or counted_trips(ins, blocks, lp)
        if t is None:
            raise SystemExit(f"{kernel}: inner loop {lab} has no recognizable trip count: pass --trip {lab}=N")
        for bi in lp.body:
            weight[bi] *= t
        rep.append((lab, sum(blocks[bi].end - blocks[bi].start for bi in lp.body), t))
    return weight, rep


def count_hot_loop(
    ins: list[Instr],
    labels: dict[str, int],
    marker: str,
    per_unit: int,
    weights: int,
    kernel: str,
    trips_override: dict[str, int],
) -> Report:
    """The hot loop is the loop running the most `marker` instructions per iteration; of several such (a
    kernel specialized per layout has one each) the one issuing the fewest instructions, the others reported
    as alternatives. It covers (markers per iteration / per_unit) units of `weights` weights per lane (nvcc
    may unroll it)."""
    blocks, of = build_blocks(ins, labels)
    loops = find_loops(blocks)
    best = None
    others = []  # (markers, instructions) of every loop with markers
    for lp in loops:
        try:
            w, rep = loop_weights(ins, blocks, loops, lp, kernel, trips_override)
        except SystemExit:
            continue  # holds a loop of unknown trip count (a row loop, say)
        n = sum(w[of[i]] for i, x in enumerate(ins) if of[i] in lp.body and x.op.startswith(marker))
        if n:
            others.append(
                (n, sum(w[bi] * (blocks[bi].end - blocks[bi].start) for bi in lp.body), blocks[lp.header].label)
            )
        cnt = sum(w[bi] * (blocks[bi].end - blocks[bi].start) for bi in lp.body)
        if n and (best is None or n > best[0] or (n == best[0] and cnt < best[4])):
            best = (n, lp, w, rep, cnt)
    if best is None:
        raise SystemExit(f"{kernel}: no loop runs a {marker} instruction")
    n_mark, hot, weight, inner_rep, _ = best
    if n_mark % per_unit:
        raise SystemExit(f"{kernel}: {n_mark} {marker} per iteration, not a multiple of {per_unit}")
    by_class: Counter[str] = Counter()
    n_branch = 0
    for bi, w in weight.items():
        for i in range(blocks[bi].start, blocks[bi].end):
            by_class[classify(ins[i].op)] += w
            if ins[i].op.startswith("BRA") and not (bi == hot.latch and i == blocks[bi].end - 1):
                n_branch += 1
    total = sum(by_class.values())
    # the other loops doing the same work (a kernel specialized per layout has one each), per weight
    alt = sorted(
        (cnt / (weights * n // per_unit), lab)
        for n, cnt, lab in others
        if n == n_mark and lab != blocks[hot.header].label
    )
    rep = Report(kernel, weights * n_mark // per_unit, total, dict(by_class), inner_rep, n_branch, alt)
    rep.row_overhead, rep.tail_step, rep.row_calls, tail_marks = row_path_costs(ins, blocks, loops, hot, marker)
    rep.tail_parts = max(1, tail_marks // per_unit)
    return rep


def row_path_costs(
    ins: list[Instr], blocks: list[Block], loops: list[Loop], hot: Loop, marker: str = "SHFL.UP"
) -> tuple[float | None, float | None, list[str], int]:
    """What a row costs besides the hot loop's iterations, for the loop around the hot one (the kernel's row
    loop): (overhead, tail). The row's path is the blocks of the row loop from its header to the hot loop
    (backwards from the hot loop's header) and from the hot loop's exit back to the row loop's header
    (forwards); other specializations of the row (other layouts' loops) are on neither. `tail` is the part of
    the forward path laid out before the first SHFL.BFLY (the final segment reduction): the partial last step;
    `overhead` the rest (row setup, layout dispatch, reduction, store, row-loop control). Both arms of a
    branch on the path count (upper bounds; the tail's skip branch counts in the overhead); a CALL counts as
    one instruction, its callee not (the third value lists them); the fourth is the markers (prefix-sum
    shuffles) in the tail: a tail of two half steps has twice the hot loop's. (None, None, [], 0) without an
    enclosing loop."""
    outer = [lp for lp in loops if hot.body < lp.body]
    if not outer:
        return None, None, [], 0
    row = min(outer, key=lambda lp: len(lp.body))
    preds: dict[int, list[int]] = {i: [] for i in range(len(blocks))}
    for i, b in enumerate(blocks):
        for t in b.succ:
            preds[t].append(i)
    back, stack = set(), [p for p in preds[hot.header] if p not in hot.body and p in row.body]
    while stack:
        n = stack.pop()
        if n in back or n in hot.body or n not in row.body:
            continue
        back.add(n)
        if n != row.header:
            stack.extend(preds[n])
    fwd, stack = set(), [t for bi in hot.body for t in blocks[bi].succ if t not in hot.body]
    while stack:
        n = stack.pop()
        if n in fwd or n in hot.body or n not in row.body or n == row.header:
            continue
        fwd.add(n)
        stack.extend(blocks[n].succ)

    def size(bi: int) -> int:
        return blocks[bi].end - blocks[bi].start

    bfly = [
        blocks[bi].start
        for bi in fwd
        if any(ins[i].op.startswith("SHFL.BFLY") for i in range(blocks[bi].start, blocks[bi].end))
    ]
    first_bfly = min(bfly) if bfly else None
    tail_blocks = [bi for bi in fwd - back if first_bfly is not None and blocks[bi].start < first_bfly]
    tail = sum(size(bi) for bi in tail_blocks)
    marks = sum(ins[i].op.startswith(marker) for bi in tail_blocks for i in range(blocks[bi].start, blocks[bi].end))
    path = back | fwd | {row.header}
    total = sum(size(bi) for bi in path)
    calls = [
        ins[i].args
        for bi in sorted(path)
        for i in range(blocks[bi].start, blocks[bi].end)
        if ins[i].op.startswith("CALL")
    ]
    return float(total - tail), float(tail), calls, marks


def find_disassembler(fetch: bool) -> tuple[str, str] | None:
    """('nvdisasm' | 'cuobjdump', path) or None."""
    for kind, env in (("nvdisasm", "NVDISASM"), ("cuobjdump", "CUOBJDUMP")):
        cands = [
            os.environ.get(env),
            shutil.which(kind),
            f"/usr/local/cuda/bin/{kind}",
            str(TOOLS_DIR / "nvidia" / "cu13" / "bin" / kind),
        ]
        for c in cands:
            if c and Path(c).is_file() and os.access(c, os.X_OK):
                return kind, c
    if fetch:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--target", str(TOOLS_DIR), *TOOLS_PIP], check=True
        )
        return find_disassembler(False)
    return None


def find_nvcc() -> str | None:
    for c in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if c and Path(c).exists():
            return c
    return None


def disassemble(cubin: Path, dis: tuple[str, str]) -> str:
    kind, exe = dis
    args = [exe, "-c", str(cubin)] if kind == "nvdisasm" else [exe, "-sass", str(cubin)]
    r = subprocess.run(args, capture_output=True, text=True, check=True)
    if kind == "nvdisasm":
        return r.stdout
    # cuobjdump: "Function : NAME" headers and absolute branch targets; rewritten into nvdisasm's form (a
    # label before every instruction, branch targets as labels)
    out = []
    for line in r.stdout.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            out.append(f".text.{m.group(1)}:")
            continue
        a = re.search(r"/\*([0-9a-f]{4,})\*/", line)
        if a is None:
            continue
        line = re.sub(
            r"(BRA\s+(?:\w+\s*,\s*)?)(0x[0-9a-f]+)", lambda t: f"{t.group(1)}`(.L_a{int(t.group(2), 16):x})", line
        )
        out.append(f".L_a{int(a.group(1), 16):x}:")
        out.append(line)
    return "\n".join(out)


TARGETS = {
    # name: (source, kernel-name regex, marker opcode, markers per unit, weights per lane per unit, what): the
    # bitcos unit is one 32-weight bitmap word (a 5-step warp prefix sum: 5 SHFL.UP), the tq2 one 64 weights
    # (16 dp4a)
    # The kernel: the first mangled-name prefix that matches (the one-column, 32-copy instance of the mat-vec
    # template; before it, the untemplated kernel of commit fa24b23 and earlier).
    # The weights per unit go with the kernel: the mat-vec's lanes take two words per prefix sum, the kernel
    # of fa24b23 one.
    "bitcos": (
        "tests/cuda/test-bitcos-cuda.cu",
        (
            ("_Z30bitcos_cuda_mul_mat_vec_kernelILi1ELi32ELi32EEv", 64),
            ("_Z30bitcos_cuda_mul_mat_vec_kernelILi1ELi32EEv", 64),
            ("_Z26bitcos_cuda_mul_mat_kernelP", 32),
        ),
        "SHFL.UP",
        5,
        "BITCOS mat-vec, 1 column",
    ),
    "tq2": (
        "tests/cuda/tq2-reference.cu",
        (("_Z18tq2_reference_gemvP", 64),),
        "IDP",
        16,
        "TQ2_0-like 2-bit GEMV (dp4a)",
    ),
    # one decode, 4 activation columns (a small batch): the count is per weight and column
    "bitcos4": (
        "tests/cuda/test-bitcos-cuda.cu",
        (
            ("_Z30bitcos_cuda_mul_mat_vec_kernelILi4ELi32ELi32EEv", 64 * 4),
            ("_Z30bitcos_cuda_mul_mat_vec_kernelILi4ELi32EEv", 64 * 4),
        ),
        "SHFL.UP",
        5,
        "BITCOS mat-vec, 4 columns (per weight and column)",
    ),
}
NVCC_FLAGS = ("-std=c++17", "-O3", "-use_fast_math", "-extended-lambda")  # ggml-cuda's, plus its -O3


_SASS: dict[tuple[str, str, str], str] = {}


def gemv_lanes(k: int) -> int:
    """BITCOS_CUDA_GEMV_LANES (csrc/cuda/bitcos-cuda.cuh): the lanes a row the glue launches (8 at every K)."""
    return 8


def measure(
    target: str,
    tree: Path,
    arch: str,
    dis: tuple[str, str],
    nvcc: str,
    trips_override: dict[str, int],
    keep: Path | None = None,
    lanes: int = 32,
) -> Report:
    """The target's hot loop; for the bitcos targets the mat-vec instance with `lanes` lanes a row (its prefix
    sum has log2(lanes) SHFL.UP steps)."""
    src, kernels, marker, per_unit, _ = TARGETS[target]
    if target.startswith("bitcos"):
        if lanes != 32:  # no fallback to the kernels before lanes per row
            kernels = kernels[:1]
        kernels = tuple((pre.replace("ELi32ELi32EEv", f"ELi32ELi{lanes}EEv"), wt) for pre, wt in kernels)
        per_unit = {32: 5, 16: 4, 8: 3}[lanes]
    key = (str(tree), src, arch)
    if key not in _SASS:  # one compile per source (the instances share it)
        with tempfile.TemporaryDirectory() as td:
            cubin = Path(td) / f"{target}.cubin"
            cmd = [
                nvcc,
                *NVCC_FLAGS,
                f"-arch={arch}",
                "-cubin",
                f"-I{tree / 'csrc'}",
                f"-I{tree / 'csrc' / 'cuda'}",
                str(tree / src),
                "-o",
                str(cubin),
            ]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"nvcc failed:\n{r.stdout}{r.stderr}")
            _SASS[key] = disassemble(cubin, dis)
    sass = _SASS[key]
    if keep is not None:
        keep.write_text(sass)
    funcs = parse_functions(sass)
    name, weights = next(((n, wt) for pre, wt in kernels for n in funcs if n.startswith(pre)), (None, 0))
    if name is None:
        raise SystemExit(
            f"{target}: no kernel named {' or '.join(p for p, _ in kernels)}... in {src}; kernels: {list(funcs)}"
        )
    ins, labels = funcs[name]
    return count_hot_loop(ins, labels, marker, per_unit, weights, name, trips_override)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="*", metavar="TARGET", help="bitcos, bitcos4, tq2 (default: bitcos, tq2)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--rev", help="measure the sources as they were at this git revision (git archive)")
    ap.add_argument(
        "--trip",
        action="append",
        default=[],
        metavar="LABEL=N",
        help="trip count of an inner loop the tool cannot read",
    )
    ap.add_argument("--fetch", action="store_true", help="pip-install nvdisasm into %s if missing" % TOOLS_DIR)
    ap.add_argument("--keep-sass", type=Path, help="folder to write each target's disassembly into")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--lanes",
        type=int,
        choices=(32, 16, 8),
        default=32,
        help="the bitcos targets' instance: lanes a row (default 32, the only one before commit 64bea8c)",
    )
    ap.add_argument(
        "--k",
        help="comma-separated row lengths: the bitcos targets' effective instructions per weight "
        "over whole rows (row overhead and the partial last step counted) for 32 / 16 / 8 "
        "lanes a row and the one the glue launches (BITCOS_CUDA_GEMV_LANES)",
    )
    a = ap.parse_args()
    nvcc = find_nvcc()
    if nvcc is None:
        print("cuda_sass_count: no nvcc", file=sys.stderr)
        return 2
    dis = find_disassembler(a.fetch)
    if dis is None:
        print(
            f"cuda_sass_count: no nvdisasm / cuobjdump (--fetch installs them from PyPI into {TOOLS_DIR})",
            file=sys.stderr,
        )
        return 2
    a.targets = a.targets or ["bitcos", "tq2"]
    for t in a.targets:
        if t not in TARGETS:
            ap.error(f"unknown target {t}")
    trips = {k: int(v) for k, v in (t.split("=") for t in a.trip)}
    results = {}
    per_lanes: dict[tuple[str, int], Report] = {}
    with tempfile.TemporaryDirectory() as td:
        tree = ROOT
        if a.rev:
            tree = Path(td) / "tree"
            tree.mkdir()
            arch = subprocess.run(
                ["git", "-C", str(ROOT), "archive", a.rev, "csrc", "tests/cuda", "tests/gpu-cases.hpp"],
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(tree)], input=arch, check=True)
        for t in a.targets:
            if not (tree / TARGETS[t][0]).exists():
                print(f"cuda_sass_count: {t}: {TARGETS[t][0]} not in that tree, skipped", file=sys.stderr)
                continue
            keep = a.keep_sass / f"{t}.sass" if a.keep_sass else None
            if keep:
                a.keep_sass.mkdir(parents=True, exist_ok=True)
            results[t] = measure(t, tree, a.arch, dis, nvcc, trips, keep, a.lanes if t.startswith("bitcos") else 32)
            if a.k and t.startswith("bitcos"):
                for lanes in {32, 16, 8} - {a.lanes}:
                    try:
                        per_lanes[(t, lanes)] = measure(t, tree, a.arch, dis, nvcc, trips, None, lanes)
                    except SystemExit:  # a tree before lanes per row: 32 only
                        pass
    ks = [int(v) for v in a.k.split(",")] if a.k else []
    effective = {}
    for t, r in results.items():
        if not (ks and t.startswith("bitcos")):
            continue
        words = 1 if "mul_mat_kernelP" in r.kernel else 2  # commit fa24b23 and before: a word per lane
        insts = {a.lanes: r, **{lanes: per_lanes[(t, lanes)] for lanes in (32, 16, 8) if (t, lanes) in per_lanes}}
        effective[t] = {k: {lanes: rr.effective(k, lanes, words) for lanes, rr in insts.items()} for k in ks}
    if a.json:
        print(
            json.dumps(
                {
                    t: {
                        "kernel": r.kernel,
                        "weights_per_iteration": r.weights_per_iter,
                        "instructions_per_iteration": r.instructions_per_iter,
                        "instructions_per_weight": r.per_weight,
                        "by_class_per_weight": {k: v / r.weights_per_iter for k, v in sorted(r.by_class.items())},
                        "inner_loops": r.inner_loops,
                        "branches_in_body": r.branches_in_body,
                        "other_loops_per_weight": [v for v, _ in r.alternatives],
                        "row_overhead": r.row_overhead,
                        "tail_step": r.tail_step,
                        "row_calls": r.row_calls,
                        "effective_per_weight": {
                            str(k): {str(lanes): v for lanes, v in e.items()} for k, e in effective.get(t, {}).items()
                        },
                        "lanes_taken": {str(k): gemv_lanes(k) for k in effective.get(t, {})},
                    }
                    for t, r in results.items()
                },
                indent=1,
            )
        )
        return 0
    for t, r in results.items():
        print(f"{t}: {TARGETS[t][4]} ({a.arch}{', ' + a.rev if a.rev else ''})")
        print(f"  kernel {r.kernel}")
        inner = "; ".join(f"inner loop {loop}: {n} instructions x {k}" for loop, n, k in r.inner_loops)
        print(
            f"  hot loop: {r.instructions_per_iter:.0f} instructions per iteration of {r.weights_per_iter} weights per lane"
            f"{' (' + inner + ')' if inner else ''}; {r.branches_in_body} forward branches inside"
        )
        print(f"  instructions per weight per lane: {r.per_weight:.3f}")
        if r.alternatives:
            print(
                "  other loops doing the same work (per weight): "
                + ", ".join(f"{v:.3f} ({lab})" for v, lab in r.alternatives)
            )
        for k, v in sorted(r.by_class.items(), key=lambda kv: -kv[1]):
            print(f"    {k:12s} {v / r.weights_per_iter:6.3f}  ({v:.0f} per iteration)")
        if t in effective:
            lanes_all = sorted({lanes for e in effective[t].values() for lanes in e}, reverse=True)
            print(
                f"  whole rows (row overhead {r.row_overhead:.0f} and partial step {r.tail_step:.0f} instructions"
                f"{f' in {r.tail_parts} half steps' if r.tail_parts > 1 else ''} at {a.lanes} lanes; * = the lanes the "
                f"glue launches):"
            )
            print("    K      " + "".join(f"{str(lanes) + ' lanes':>11s}" for lanes in lanes_all))
            for k, e in effective[t].items():
                cells = "".join(
                    f"{(f'{e[n]:.2f}' + ('*' if n == gemv_lanes(k) and len(e) > 1 else ' ')) if n in e else '-':>11s}"
                    for n in lanes_all
                )
                print(f"    {k:<7d}{cells}")
            if r.row_calls:
                print(f"    (on the row's path, callees not counted: {'; '.join(r.row_calls)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
