"""The natural-loop finder of the static instruction counters (dev/mca.py: x86 / aarch64 assembly for llvm-mca;
dev/gpu_isa.py: AMD ISA; dev/cuda_sass_count.py: NVIDIA SASS). Each parses its listing into basic blocks with
successor lists (indices in layout order) and finds its loops with these."""

from __future__ import annotations

from collections.abc import Sequence


def predecessors(succ: Sequence[Sequence[int]], nodes: set[int] | None = None) -> list[list[int]]:
    """For each block the blocks (of `nodes`, default all) that branch or fall through to it."""
    pred: list[list[int]] = [[] for _ in succ]
    for u, vs in enumerate(succ):
        if nodes is None or u in nodes:
            for v in vs:
                pred[v].append(u)
    return pred


def reachable(succ: Sequence[Sequence[int]], entry: int = 0) -> set[int]:
    """The blocks reachable from `entry`."""
    seen, stack = {entry}, [entry]
    while stack:
        for v in succ[stack.pop()]:
            if v not in seen:
                seen.add(v)
                stack.append(v)
    return seen


def natural_loop(pred: Sequence[Sequence[int]], header: int, latch: int) -> set[int]:
    """The natural loop of the back edge latch -> header: the header and every block that reaches the latch
    without passing through the header."""
    body, stack = {header, latch}, [latch]
    while stack:
        n = stack.pop()
        if n == header:
            continue
        for p in pred[n]:
            if p not in body:
                body.add(p)
                stack.append(p)
    return body
