"""`python3 -m dev.gpu_isa` (a maintainer's instrument, run from a checkout): instructions per weight of the Vulkan mat-vec shaders (and, with --prompt, per
multiply-add of the prompt path's matrix multiply) in real AMD GPU ISA, without a GPU (Mesa RADV's null
device), BITCOS against TQ2_0.

What it compiles: the mat-vec pipelines of every BITCOS shader source in csrc/vulkan (each mul_mat_vec*.comp
that bitcos-vulkan-shaders-gen.inc compiles: every type variant, mat-vec and mat-vec-id) and upstream's
mul_mat_vec_tq2_0.comp, as SPIR-V made by ggml-vulkan's own generator (vulkan-shaders-gen.cpp of the pinned
sdist, built into the cache with the BITCOS list included: the same defines, glslc flags and names as a Vulkan
build; vk_shaders_gen_driver.cpp), or taken from a Vulkan build's vulkan-shaders.spv folder (`--spv-dir`).
Each becomes a compute pipeline on RADV's null device for one AMD family (`RADV_FORCE_FAMILY`: gfx1100 RDNA3,
gfx1030 RDNA2, gfx90a CDNA2) with ggml-vulkan's parameters for its mat-vec on that device (ggml-vulkan.cpp,
ggml_vk_load_shaders: workgroup size = the subgroup size, NUM_ROWS = rm_kq (4 on GCN/CDNA, else 2), NUM_COLS
= 1, 2, 4, 8, the subgroup-only reduction variant, the subgroup size required with full subgroups), created
with VK_KHR_pipeline_executable_properties capturing statistics and the ISA (vk_pipeline_stats.c). Nothing
runs on the null device, so correctness stays with the lavapipe tests.

How it counts: the ISA is split into basic blocks; loops are the natural loops of backward branches (ACO lays
out a loop's header first and branches back to it); the hot loop is the outermost loop with the most vector
memory instructions in its body, the first in layout order of those (mat-vec's main() calls compute_outputs()
for full row groups first, then for a partial one; setup loops load less). One iteration's cost is the
longest path from its header back to it: a divergent branch (s_cbranch_execz, taken only when no lane is
active) is assumed not taken, so both arms of a divergent if run, as a wave with mixed lanes runs them; a
uniform branch (scc / vcc) takes its longer arm; an inner loop counts its own longest iteration times its trip
count. Instructions are classed VALU, SALU, VMEM, SMEM, LDS and
control (waits, branches, scheduling hints); one instruction issues once per wave, so its count per weight a
lane handles is the count "per weight per lane". The weights one iteration covers, and the trip counts of
inner loops, come from the shader: a line in the .comp source

    // gpu-isa: weights-per-iteration = 16 * NUM_ROWS; inner-trips = NUM_ROWS, BLOCK_SIZE / 16

(weights per lane and activation column in one hot-loop iteration, and the trip counts of every inner loop
of the hot loop in layout order, which is source order: a loop before the loops inside it, siblings in turn,
so a chain of nested loops reads outermost inward; 0 for a loop the measured case never enters; in the
specialization constants BLOCK_SIZE, NUM_ROWS, NUM_COLS), and for upstream's TQ2_0 shader from
UPSTREAM_SHAPES here. Reported per weight (all columns: what a memory-bound mat-vec may spend,
docs/PERFORMANCE.md's budget) and per weight and column; plus VGPRs, SGPRs, LDS bytes and waves per SIMD
(RADV's occupancy from VGPRs, SGPRs and LDS for the family). With --budget, per GPU of gpu_datasheets.json
the budget and a predicted BITCOS / TQ2_0 mat-vec speed from BITCOS's pipeline the backend runs there by
default: the fast shader's q8_1 form where the GPU has accelerated int8 dot products (then also its f32 form,
GGML_BITCOS_VULKAN_INT8=0), the f32 form elsewhere.

`--prompt` measures the prompt path instead: mul_mm_bitcos.comp (32 x 32 tiles) against upstream's
mul_mm.comp, the generic matrix multiply ggml-vulkan runs TQ2_0 prompts through (scalar form, TQ2_0 by
specialization constant, at its 32 x 32 and 64 x 64 tiles), each with ggml-vulkan's creation parameters. A
matrix multiply's tag adds `columns = ...` (the columns one iteration covers; a mat-vec's are NUM_COLS), in
the source's integer #defines or upstream's specialization constants (WARPTILE_NAMES): per weight and column
is then per multiply-add and lane.

    python3 -m dev.gpu_isa                          # gfx1100, gfx1030, gfx90a; 1, 2, 4, 8 columns
    python3 -m dev.gpu_isa --families gfx1100 --json # {"family", "cols", "bitcos", "tq2_0"} per row
    python3 -m dev.gpu_isa --spv-dir BUILD/vendor/llama.cpp/ggml/src/ggml-vulkan/vulkan-shaders.spv
    python3 -m dev.gpu_isa --keep-isa /tmp/isa       # every pipeline's ISA text and statistics
    python3 -m dev.gpu_isa --budget                 # + per-GPU budget and predicted BITCOS / TQ2_0 speed
    python3 -m dev.gpu_isa --prompt [--json]        # the prompt path, per multiply-add
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import operator
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ggml_bitcos import upstream
from dev.loops import natural_loop, predecessors

HERE = Path(__file__).resolve().parent
REPO_VULKAN = HERE.parent / "csrc" / "vulkan"
REPO_FORMAT_H = HERE.parent / "csrc" / "bitcos-format.h"
UPSTREAM_SHADERS = f"{upstream.SDIST_TOPDIR}/vendor/llama.cpp/ggml/src/ggml-vulkan/vulkan-shaders"

# the families asked for by name -> RADV_FORCE_FAMILY's name for them in Mesa 22.3 (its family table)
FAMILIES = {"gfx1100": "gfx1100", "gfx1030": "navi21", "gfx90a": "aldebaran"}
DEFAULT_COLS = (1, 2, 4, 8)
# upstream's mat-vec shaders this tool compares with (ggml-vulkan's TQ2_0 one): the same tag a BITCOS shader
# carries in its source. 16 threads per 256-weight superblock: 16 weights per lane and row per iteration.
UPSTREAM_SHAPES = {"mul_mat_vec_tq2_0.comp": "weights-per-iteration = 16 * NUM_ROWS; inner-trips ="}
REDUCTION_SUFFIX = {"shmem": "", "hybrid": "_subgroup", "subgroup": "_subgroup_no_shmem"}
PIPELINE_NAME = re.compile(
    r"^(?P<kind>mul_mat_vec(?:_id)?)_(?P<type>.+?)_(?P<b>f32|f16|q8_1)_f32(?P<red>_subgroup_no_shmem|_subgroup)?$"
)
TAG = re.compile(r"//\s*gpu-isa:\s*(.+)$", re.M)


# --------------------------------------------------------------------------------------- ISA analysis
def classify(op: str) -> str:
    """AMD GCN / RDNA opcode -> VALU, SALU, VMEM, SMEM, LDS or control."""
    if op.startswith(("v_",)):
        return "VALU"
    if op.startswith(("buffer_", "global_", "flat_", "scratch_", "image_", "tbuffer_")):
        return "VMEM"
    if op.startswith(("s_load_", "s_buffer_load_", "s_store_", "s_buffer_store_", "s_scratch_", "s_dcache_", "s_gl1_")):
        return "SMEM"
    if op.startswith("ds_"):
        return "LDS"
    if op.startswith(
        ("s_waitcnt", "s_branch", "s_cbranch_", "s_nop", "s_delay_alu", "s_endpgm", "s_barrier", "s_clause")
    ) or op in ("s_code_end", "s_sleep", "s_setprio", "s_sendmsg", "s_inst_prefetch", "s_icache_inv"):
        return "control"
    if op.startswith("s_"):
        return "SALU"
    return "other"


CLASSES = ("VALU", "SALU", "VMEM", "SMEM", "LDS", "control", "other")


@dataclass
class Block:
    label: str | None
    ops: list[str]  # opcodes in order
    succ: list[int] = field(default_factory=list)
    skip: set[int] = field(default_factory=set)  # successors reached only when no lane is active


@dataclass
class Loop:
    header: int
    latches: set[int]
    body: set[int]
    children: list[Loop] = field(default_factory=list)


def parse_isa(text: str) -> list[Block]:
    """RADV's "Assembly" representation (ACO: `BBn:` labels, one tab-indented instruction a line, encodings
    after ';') -> basic blocks with successors. A block ends at a label, a branch or s_endpgm."""
    blocks: list[Block] = [Block(None, [])]
    targets: list[list[tuple[str, str]]] = [[]]  # per block: (branch opcode, target label)
    for raw in text.splitlines():
        line = raw.split(";", 1)[0].rstrip()
        if not line.strip():
            continue
        m = re.match(r"^\s*(BB\d+|[A-Za-z_.$][\w.$]*):\s*$", line)
        if m:
            if blocks[-1].ops or blocks[-1].label is not None:
                blocks.append(Block(m.group(1), []))
                targets.append([])
            else:
                blocks[-1].label = m.group(1)
            continue
        if not raw[:1].isspace():
            continue  # a header line of the listing, not an instruction
        parts = line.split()
        op = parts[0]
        blocks[-1].ops.append(op)
        if op == "s_branch" or op.startswith("s_cbranch_"):
            targets[-1].append((op, parts[1].rstrip(",")))
        if op == "s_branch" or op.startswith("s_cbranch_") or op == "s_endpgm":
            blocks.append(Block(None, []))
            targets.append([])
    # drop empty unlabelled blocks (after a final branch)
    keep = [i for i, b in enumerate(blocks) if b.ops or b.label is not None]
    blocks = [blocks[i] for i in keep]
    targets = [targets[i] for i in keep]
    index = {b.label: i for i, b in enumerate(blocks) if b.label}
    for i, b in enumerate(blocks):
        last = b.ops[-1] if b.ops else ""
        for op, t in targets[i]:
            if t not in index:
                raise ValueError(f"branch to unknown label {t}")
            b.succ.append(index[t])
            if op == "s_cbranch_execz":
                b.skip.add(index[t])
        falls = last != "s_branch" and last != "s_endpgm"
        if falls and i + 1 < len(blocks):
            b.succ.append(i + 1)
    return blocks


def find_loops(blocks: list[Block]) -> list[Loop]:
    """Natural loops of the backward branches (target at or before the branch), one per header, nested:
    the returned list holds the outermost loops in layout order, each with its children."""
    preds = predecessors([b.succ for b in blocks])
    by_header: dict[int, Loop] = {}
    for u, b in enumerate(blocks):
        for h in b.succ:
            if h > u:
                continue
            body = natural_loop(preds, h, u)
            lp = by_header.setdefault(h, Loop(h, set(), set()))
            lp.latches.add(u)
            lp.body |= body
    loops = sorted(by_header.values(), key=lambda lp: (len(lp.body), lp.header))
    outer: list[Loop] = []
    for i, lp in enumerate(loops):
        parent = next((q for q in loops[i + 1 :] if lp.body < q.body), None)
        (parent.children if parent else outer).append(lp)
    for lp in loops:
        lp.children.sort(key=lambda c: c.header)
    outer.sort(key=lambda lp: lp.header)
    return outer


def loop_depth(lp: Loop) -> int:
    """Levels of loops inside `lp` (0: none)."""
    return 1 + max((loop_depth(c) for c in lp.children), default=-1)


def inner_loops(lp: Loop) -> list[Loop]:
    """The loops inside `lp` in layout order: each before the loops inside it, siblings in order (for a
    chain of nested loops: outermost inward)."""
    out: list[Loop] = []
    for c in sorted(lp.children, key=lambda c: c.header):
        out.append(c)
        out.extend(inner_loops(c))
    return out


def iteration_cost(blocks: list[Block], lp: Loop, trips: list[int] | dict[int, int]) -> Counter[str]:
    """Instructions by class of one iteration of `lp` on its longest path (see the module's doc): the path
    from the header to a latch over forward edges, divergent skips not taken, each inner loop contracted into
    one node costing its trip count x its own iteration. `trips`: the trip counts of the inner loops in
    layout order (inner_loops), or by header block."""
    if not isinstance(trips, dict):
        nested = inner_loops(lp)
        if len(trips) < len(nested):
            raise ValueError(f"loop at {blocks[lp.header].label}: inner loop without a trip count (inner-trips tag)")
        trips = {c.header: t for c, t in zip(nested, trips)}
    child_of: dict[int, Loop] = {}
    for c in lp.children:
        for bi in c.body:
            child_of[bi] = c
    child_cost = {c.header: iteration_cost(blocks, c, trips) for c in lp.children}
    for h in child_cost:
        child_cost[h] = Counter({k: v * trips[h] for k, v in child_cost[h].items()})

    def node(bi: int) -> int:
        return child_of[bi].header if bi in child_of else bi

    def cost(n: int) -> Counter[str]:
        return child_cost[n] if n in child_cost else Counter(classify(op) for op in blocks[n].ops)

    def out_edges(n: int) -> set[int]:
        members = child_of[n].body if n in child_cost else {n}
        out = set()
        for bi in members:
            for s in blocks[bi].succ:
                if s in blocks[bi].skip or s not in lp.body or s in members or s == lp.header:
                    continue
                out.add(node(s))
        return out

    nodes = sorted({node(bi) for bi in lp.body})
    best: dict[int, Counter[str]] = {lp.header: cost(lp.header)}
    for n in nodes:  # layout order is a topological order of the forward edges (structured control flow)
        if n not in best:
            continue
        for s in out_edges(n):
            if s <= n:
                continue  # an inner back edge left after contraction would be a loop we did not find
            cand = best[n] + cost(s)
            if s not in best or sum(cand.values()) > sum(best[s].values()):
                best[s] = cand
    ends = [best[node(u)] for u in lp.latches if node(u) in best]
    if not ends:
        raise ValueError(f"loop at {blocks[lp.header].label}: no path from its header to its back edge")
    return max(ends, key=lambda c: sum(c.values()))


@dataclass
class HotLoop:
    label: str
    per_iteration: Counter[str]
    depth: int  # levels of inner loops
    top_level_loops: int
    inner_loops: int = 0  # inner loops at every level (siblings counted apart)


def hot_loop(isa: str, trips: list[int]) -> HotLoop:
    """The hot loop of a mat-vec's (or matrix multiply's) ISA and one iteration's cost by class: of the
    outermost loops, the one with the most vector memory instructions in its body (the weight and activation
    loads; a setup loop filling shared memory or a run's popcount has fewer), the first in layout order of
    those (mat-vec's main() calls compute_outputs() for full row groups first, then for a partial one).
    `trips`: the trip counts of its inner loops in layout order (see inner_loops)."""
    blocks = parse_isa(isa)
    outer = find_loops(blocks)
    if not outer:
        raise ValueError("no loop in the ISA")

    def vmem(lp: Loop) -> int:
        return sum(classify(op) == "VMEM" for bi in lp.body for op in blocks[bi].ops)

    lp = max(outer, key=lambda c: (vmem(c), -c.header))
    depth, n_inner = loop_depth(lp), len(inner_loops(lp))
    if n_inner != len(trips):
        raise ValueError(
            f"hot loop at {blocks[lp.header].label} holds {n_inner} inner loop(s) in {depth} level(s), the "
            f"shader's inner-trips tag names {len(trips)}"
        )
    cost = iteration_cost(blocks, lp, trips)
    return HotLoop(blocks[lp.header].label or f"block{lp.header}", cost, depth, len(outer), n_inner)


# ---------------------------------------------------------------------------------------- shader tags
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def eval_expr(text: str, names: dict[str, int]) -> int:
    """Integer arithmetic (+ - * / //, parentheses) over the specialization constants' names."""

    def ev(n: ast.AST) -> int:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name) and n.id in names:
            return names[n.id]
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
            return ev(n.left) // ev(n.right)
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:
            return _OPS[type(n.op)](ev(n.left), ev(n.right))
        raise ValueError(f"gpu-isa tag: cannot evaluate {text!r}")

    return ev(ast.parse(text.strip(), mode="eval"))


@dataclass
class Shape:
    """A shader's gpu-isa tag: weights per lane and column per hot-loop iteration, the inner loops' trip
    counts in layout order (source order: a loop before the loops inside it, siblings in order; 0 for a loop
    the measured case never enters) and, for a matrix multiply, the columns one iteration covers (a mat-vec's
    are NUM_COLS)."""

    weights: str
    inner_trips: list[str]
    columns: str | None = None

    @classmethod
    def parse(cls, tag: str) -> Shape:
        fields = dict((k.strip(), v.strip()) for k, v in (item.split("=", 1) for item in tag.split(";") if "=" in item))
        if "weights-per-iteration" not in fields:
            raise ValueError(f"gpu-isa tag without weights-per-iteration: {tag!r}")
        trips = [t for t in fields.get("inner-trips", "").split(",") if t.strip()]
        return cls(fields["weights-per-iteration"], trips, fields.get("columns"))

    def evaluate(self, names: dict[str, int]) -> tuple[int, list[int]]:
        return eval_expr(self.weights, names), [eval_expr(t, names) for t in self.inner_trips]

    def evaluate_columns(self, names: dict[str, int]) -> int:
        return eval_expr(self.columns if self.columns is not None else "NUM_COLS", names)


def shader_shape(source: Path) -> Shape | None:
    """The gpu-isa tag of a shader source (UPSTREAM_SHAPES for upstream's), None without one."""
    if source.name in UPSTREAM_SHAPES:
        return Shape.parse(UPSTREAM_SHAPES[source.name])
    m = TAG.search(source.read_text())
    return Shape.parse(m.group(1)) if m else None


# ------------------------------------------------------------------------------------------- tools
def tools_dir() -> Path:
    d = upstream.cache_dir() / "gpu-isa"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:16]


def _compile(cmd: list[str], what: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"building {what} failed:\n{' '.join(cmd)}\n{r.stdout}{r.stderr}")


def _install_dir(tmp: Path, dest: Path) -> None:
    """Moves a folder made under a temporary name into place; another process that got there first wins (the
    same inputs made the same contents)."""
    try:
        tmp.replace(dest)
    except OSError:
        if not dest.exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def stats_tool() -> Path:
    """vk_pipeline_stats built against libvulkan (cached by its source's hash)."""
    src = HERE / "vk_pipeline_stats.c"
    exe = tools_dir() / f"vk_pipeline_stats-{_digest(src.read_bytes())}"
    if not exe.exists():
        tmp = exe.with_suffix(".tmp")
        _compile([os.environ.get("CC", "cc"), "-O1", "-o", str(tmp), str(src), "-lvulkan"], "vk_pipeline_stats")
        tmp.replace(exe)
    return exe


def upstream_shaders() -> Path:
    """The pinned sdist's vulkan-shaders folder, extracted once into the cache (read-only source)."""
    dest = tools_dir() / f"upstream-{upstream.SDIST_VERSION}"
    if not (dest / "vulkan-shaders-gen.cpp").exists():
        tmp = Path(tempfile.mkdtemp(dir=tools_dir()))
        with tarfile.open(upstream.fetch_sdist(), "r:gz") as tf:
            members = [m for m in tf.getmembers() if m.name.startswith(UPSTREAM_SHADERS + "/") and m.isfile()]
            for m in members:
                m.name = m.name[len(UPSTREAM_SHADERS) + 1 :]
                if "/" not in m.name:
                    tf.extract(m, tmp, filter="data")
        _install_dir(tmp, dest)
    return dest


@dataclass
class ShaderTree:
    """A folder laid out as a Vulkan build lays out its shader sources: upstream's vulkan-shaders with the
    BITCOS shaders copied in, the generator built with this tree's BITCOS list."""

    root: Path
    gen: Path
    sources: list[Path]  # the mat-vec sources to measure: BITCOS ones, then upstream's TQ2_0


def shader_tree(vulkan_dir: Path = REPO_VULKAN, format_h: Path = REPO_FORMAT_H) -> ShaderTree:
    up = upstream_shaders()
    inc = vulkan_dir / "bitcos-vulkan-shaders-gen.inc"
    ours = sorted(p for p in vulkan_dir.iterdir() if p.suffix in (".comp", ".glsl"))
    key = _digest(inc.read_bytes(), format_h.read_bytes(), *(p.name.encode() + p.read_bytes() for p in ours))
    root = tools_dir() / f"tree-{key}"
    if not (root / "done").exists():
        shutil.rmtree(root, ignore_errors=True)  # a build cut short
        tmp = Path(tempfile.mkdtemp(dir=tools_dir()))
        sh = tmp / "vulkan-shaders"
        shutil.copytree(up, sh)
        for p in ours:
            shutil.copy(p, sh / p.name)
        # the .inc includes "../../ggml-bitcos/bitcos-format.h", as it lies in ggml/src/ggml-bitcos/vulkan/
        (tmp / "src" / "ggml-bitcos" / "vulkan").mkdir(parents=True)
        shutil.copy(format_h, tmp / "src" / "ggml-bitcos" / "bitcos-format.h")
        shutil.copy(inc, tmp / "src" / "ggml-bitcos" / "vulkan" / inc.name)
        gen = tmp / "vk_shaders_gen_driver"
        _compile(
            [
                os.environ.get("CXX", "c++"),
                "-std=c++17",
                "-O1",
                "-pthread",
                f'-DUPSTREAM_GEN="{up / "vulkan-shaders-gen.cpp"}"',
                f'-DBITCOS_GEN_INC="{tmp / "src" / "ggml-bitcos" / "vulkan" / inc.name}"',
                str(HERE / "vk_shaders_gen_driver.cpp"),
                "-o",
                str(gen),
            ],
            "the shader generator",
        )
        (tmp / "done").write_text("")
        _install_dir(tmp, root)
    mat_vec = [p.name for p in ours if p.suffix == ".comp" and p.name.startswith("mul_mat_vec")]
    srcs = [root / "vulkan-shaders" / n for n in mat_vec] + [root / "vulkan-shaders" / n for n in UPSTREAM_SHAPES]
    return ShaderTree(root, root / "vk_shaders_gen_driver", srcs)


def pipeline_variant(name: str, source: str) -> str:
    """The type variant a pipeline computes (tq2_0, bitcos, bitcos_pt, bitcos_g128), its shader's own suffix
    taken off: mul_mat_vec_bitcos_g128_fast_f32_f32 from mul_mat_vec_bitcos_fast.comp is bitcos_g128."""
    kind = PIPELINE_NAME.match(name).group("type")
    stem = source.removesuffix(".comp")
    suffix = stem[len("mul_mat_vec_bitcos") :] if stem.startswith("mul_mat_vec_bitcos") else ""
    return kind[: -len(suffix)] if suffix and kind.endswith(suffix) else kind


@dataclass
class Pipeline:
    name: str  # the generator's name, e.g. mul_mat_vec_bitcos_f32_f32_subgroup_no_shmem
    spv: Path
    source: str  # the .comp file it comes from ("" when taken from a build folder)
    shape: Shape | None

    @property
    def variant(self) -> str:
        return pipeline_variant(self.name, self.source)


def reduction_of(name: str) -> str:
    """The reduction mode a mat-vec pipeline's name says (REDUCTION_SUFFIX's keys)."""
    red = PIPELINE_NAME.match(name).group("red") or ""
    return next(k for k, v in REDUCTION_SUFFIX.items() if v == red)


# glslc for the generator, compiling only the variants measured (the name patterns in $GPU_ISA_NAMES where set, else
# the reduction modes in $GPU_ISA_REDUCTIONS, f32 or q8_1 activations): every other output is left empty, so a
# cold cache compiles a quarter of the mat-vec variants and a handful of upstream's hundreds of matmul ones
GLSLC_FILTER = """#!/bin/sh
out=; prev=
for a; do [ "$prev" = -o ] && out=$a; prev=$a; done
name=$(basename "$out" .spv)
if [ -n "$GPU_ISA_NAMES" ]; then
set -f
for pat in $GPU_ISA_NAMES; do
case "$name" in $pat) exec "$GPU_ISA_GLSLC" "$@" ;; esac
done
: > "$out"
exit 0
fi
case "$name" in
*_subgroup_no_shmem) red=subgroup ;;
*_subgroup) red=hybrid ;;
*) red=shmem ;;
esac
case "$name" in *_f16_f32*) red=none ;; esac
case " $GPU_ISA_REDUCTIONS " in
*" $red "*) exec "$GPU_ISA_GLSLC" "$@" ;;
esac
: > "$out"
"""


def _generate(tree: ShaderTree, src: Path, out: Path, **filters: str) -> list[tuple[str, str]]:
    """The generator run on one source of the tree into `out` (once: its list of (name, SPIR-V path) stays
    there), glslc called through GLSLC_FILTER with `filters` (GPU_ISA_NAMES or GPU_ISA_REDUCTIONS)."""
    listing = out / "list.txt"
    if not listing.exists():
        glslc = os.environ.get("GLSLC") or shutil.which("glslc")
        if glslc is None:
            raise RuntimeError("no glslc (apt-get install glslc)")
        wrapper = tools_dir() / "glslc-filter.sh"
        if not wrapper.exists() or wrapper.read_text() != GLSLC_FILTER:
            tmp = wrapper.with_suffix(f".{os.getpid()}")
            tmp.write_text(GLSLC_FILTER)
            tmp.chmod(0o755)
            tmp.replace(wrapper)
        env = {**os.environ, "GPU_ISA_GLSLC": glslc, "GPU_ISA_NAMES": "", "GPU_ISA_REDUCTIONS": "", **filters}
        out.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([str(tree.gen), str(wrapper), str(src), str(out)], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"compiling {src.name} failed:\n{r.stdout}{r.stderr}")
        listing.write_text(r.stdout)
    return [tuple(line.split("\t")) for line in listing.read_text().splitlines()]


def compile_shaders(tree: ShaderTree, reductions: set[str] | None = None) -> list[Pipeline]:
    """The mat-vec variants of the tree's sources in the given reduction modes (default all), compiled with
    the generator once per tree and set of modes: the SPIR-V and the generator's list of it stay in the
    tree's folder."""
    reductions = set(REDUCTION_SUFFIX) if reductions is None else reductions
    found = []
    for src in tree.sources:
        out = tree.root / "spv" / f"{src.stem}.{'-'.join(sorted(reductions))}"
        listing = _generate(tree, src, out, GPU_ISA_REDUCTIONS=" ".join(sorted(reductions)))
        shape = shader_shape(src)
        for name, path in listing:
            m = PIPELINE_NAME.match(name)
            if m and m.group("b") != "f16" and reduction_of(name) in reductions:
                found.append(Pipeline(name, Path(path), src.name, shape))
    return found


def build_dir_shaders(spv_dir: Path, tree_sources: list[Path]) -> list[Pipeline]:
    """The mat-vec SPIR-V of a Vulkan build (its vulkan-shaders.spv folder). A BITCOS pipeline's source is
    told by its name: the source whose suffix (mul_mat_vec_bitcos_fast.comp: _fast) ends its type, else the
    one without a suffix (mul_mat_vec_bitcos.comp)."""
    shapes = {p.name: shader_shape(p) for p in tree_sources}
    shapes.update({n: Shape.parse(tag) for n, tag in UPSTREAM_SHAPES.items()})
    suffixes = {
        n: n.removesuffix(".comp")[len("mul_mat_vec_bitcos") :] for n in shapes if n.startswith("mul_mat_vec_bitcos")
    }
    found = []
    for p in sorted(spv_dir.glob("mul_mat_vec*.spv")):
        m = PIPELINE_NAME.match(p.stem)
        if not m or not (m.group("type").startswith("bitcos") or m.group("type") == "tq2_0"):
            continue
        if m.group("type") == "tq2_0":
            src = "mul_mat_vec_tq2_0.comp"
        else:
            src = next((n for n, suf in suffixes.items() if suf and m.group("type").endswith(suf)), None)
            src = src or next((n for n, suf in suffixes.items() if not suf), "")
        found.append(Pipeline(p.stem, p, src, shapes.get(src)))
    return found


# --------------------------------------------------------------------------------------- the device
@dataclass
class DeviceParams:
    """ggml-vulkan's mat-vec parameters on a device (ggml_vk_load_shaders, ggml_vk_get_dequantize_mul_mat_vec)."""

    name: str
    subgroup_size: int  # required, with full subgroups; also the workgroup size (DMMV_WG_SIZE_SUBGROUP)
    num_rows: int  # rm_kq
    reduction: str  # shmem / hybrid / subgroup
    int8_dot: bool = False  # integerDotProduct4x8BitPackedSignedAccelerated: BITCOS runs its q8_1 mat-vec


def device_params(dev: dict[str, Any]) -> DeviceParams:
    """From the device's properties as vk_pipeline_stats --device reports them: AMD uses the subgroup-size
    workgroup (dmmv_wg = DMMV_WG_SIZE_SUBGROUP off NVIDIA and Intel), rm_kq = 4 on GCN/CDNA (fixed 64-wide
    subgroups), 2 elsewhere, and the subgroup-only reduction where subgroup arithmetic exists."""
    amd = dev["vendor_id"] == 0x1002
    gcn = amd and dev["min_subgroup_size"] == 64 and dev["max_subgroup_size"] == 64
    sg16 = max(dev["subgroup_size"], 16)
    red = "subgroup" if dev["subgroup_arithmetic"] else "shmem"
    return DeviceParams(dev["name"], sg16, 4 if gcn else 2, red, bool(dev.get("int8_dot_accelerated")))


def radv_env(family: str) -> dict[str, str]:
    env = dict(os.environ)
    env["RADV_FORCE_FAMILY"] = FAMILIES.get(family, family)
    # RADV only: the null device is Mesa's radeon ICD; a lavapipe or real device would answer otherwise
    icds = sorted(Path("/usr/share/vulkan/icd.d").glob("radeon_icd.*.json"))
    if icds:
        env["VK_ICD_FILENAMES"] = env["VK_DRIVER_FILES"] = ":".join(map(str, icds))
    return env


def query_device(family: str) -> dict[str, Any]:
    r = subprocess.run([str(stats_tool()), "--device"], capture_output=True, text=True, env=radv_env(family))
    if r.returncode != 0:
        raise RuntimeError(f"no RADV null device for {family}: {r.stderr.strip() or r.stdout.strip()}")
    dev = json.loads(r.stdout)
    if "Null hardware" not in dev["name"]:
        raise RuntimeError(f"{family}: the Vulkan device is {dev['name']!r}, not RADV's null hardware")
    return dev


def radv_null_available() -> bool:
    try:
        query_device("gfx1100")
    except (RuntimeError, OSError, ValueError):
        return False
    return True


# --------------------------------------------------------------------------------------- measuring
@dataclass
class Result:
    pipeline: str
    source: str
    cols: int
    num_rows: int
    block_size: int
    stats: dict[str, Any]
    loop: HotLoop | None
    weights_per_iteration: int | None
    error: str | None = None
    wave_size: int | None = None  # the subgroup size RADV compiled for (wave32 / wave64)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "pipeline": self.pipeline,
            "source": self.source,
            "block_size": self.block_size,
            "num_rows": self.num_rows,
            "num_cols": self.cols,
            "wave_size": self.wave_size,
            "vgprs": self.stats.get("VGPRs"),
            "sgprs": self.stats.get("SGPRs"),
            "lds_bytes": self.stats.get("LDS size"),
            "waves_per_simd": self.stats.get("Subgroups per SIMD"),
            "shader_instructions": self.stats.get("Instructions"),
        }
        if self.error:
            d["error"] = self.error
        if self.loop is not None:
            total = sum(self.loop.per_iteration.values())
            d["hot_loop"] = {"label": self.loop.label, "instructions": total, "inner_loop_levels": self.loop.depth}
            d["hot_loop_by_class"] = {k: self.loop.per_iteration.get(k, 0) for k in CLASSES}
        if self.loop is not None and self.weights_per_iteration:
            w = self.weights_per_iteration
            total = sum(self.loop.per_iteration.values())
            d["weights_per_iteration"] = w
            d["per_weight"] = total / w
            d["per_weight_and_column"] = total / w / self.cols
            d["per_weight_by_class"] = {k: self.loop.per_iteration.get(k, 0) / w for k in CLASSES}
        return d


def create_pipelines(family: str, jobs: list[str], keep: Path | None = None) -> dict[str, tuple[dict[str, Any], str]]:
    """vk_pipeline_stats on RADV's null device for `family`: one job line each ("KEY SPV SUBGROUP [robust]
    ID=VALUE..."); per KEY the first executable's properties and statistics and its ISA text (their files stay
    in keep/family when given)."""
    with tempfile.TemporaryDirectory() as td:
        outdir = keep / family if keep else Path(td)
        outdir.mkdir(parents=True, exist_ok=True)
        jobfile = Path(td) / "jobs"
        jobfile.write_text("".join(f"{line}\n" for line in jobs))
        r = subprocess.run(
            [str(stats_tool()), str(jobfile), str(outdir)], capture_output=True, text=True, env=radv_env(family)
        )
        if r.returncode != 0:
            raise RuntimeError(f"{family}: pipeline creation failed: {r.stderr.strip()}")
        out = {}
        for line in jobs:
            key = line.split(" ", 1)[0]
            info = json.loads((outdir / f"{key}.json").read_text())["executables"][0]
            out[key] = (info, (outdir / f"{key}.Assembly.txt").read_text())
        return out


def count_hot_loop(res: Result, shape: Shape | None, isa: str, names: dict[str, int], columns: bool = False) -> None:
    """res's hot loop and weights per iteration from the shader's gpu-isa tag with `names` bound (and, for a
    matrix multiply, the columns one iteration covers); the reason in res.error where that fails."""
    try:
        if shape is None:
            raise ValueError("no gpu-isa tag in the shader source: weights per iteration unknown")
        weights, trips = shape.evaluate(names)
        if columns:
            res.cols = shape.evaluate_columns(names)
        res.loop = hot_loop(isa, trips)
        res.weights_per_iteration = weights
    except ValueError as e:
        res.error = str(e)


def measure(
    family: str, pipelines: list[Pipeline], cols: tuple[int, ...], keep: Path | None = None
) -> tuple[DeviceParams, list[Result]]:
    """Every mat-vec pipeline of the family's reduction mode at each column count (mat-vec-id: one column, as
    ggml-vulkan builds it), compiled on RADV's null device for `family`."""
    params = device_params(query_device(family))
    chosen = [p for p in pipelines if reduction_of(p.name) == params.reduction]
    chosen = [p for p in chosen if PIPELINE_NAME.match(p.name).group("b") in ("f32", "q8_1")]
    jobs: list[tuple[str, Pipeline, int]] = []
    for p in chosen:
        is_id = PIPELINE_NAME.match(p.name).group("kind") == "mul_mat_vec_id"
        for n in (1,) if is_id else cols:
            jobs.append((f"{p.source.removesuffix('.comp') or 'build'}.{p.name}.c{n}", p, n))
    lines = []
    for key, p, n in jobs:
        spec = f"0={params.subgroup_size} 1={params.num_rows}" + ("" if "_id_" in p.name else f" 2={n}")
        lines.append(f"{key} {p.spv} {params.subgroup_size} {spec}")
    created = create_pipelines(family, lines, keep)
    results = []
    names = {"BLOCK_SIZE": params.subgroup_size, "NUM_ROWS": params.num_rows}
    for key, p, n in jobs:
        info, isa = created[key]
        res = Result(p.name, p.source, n, params.num_rows, params.subgroup_size, info["statistics"], None, None)
        res.wave_size = info.get("subgroup_size")
        count_hot_loop(res, p.shape, isa, {**names, "NUM_COLS": n})
        results.append(res)
    return params, results


# ------------------------------------------------------------------------------------------ prompt path
# The prompt path (MUL_MAT with more columns than a mat-vec takes): BITCOS's tiled mul_mm_bitcos.comp against
# upstream's generic matrix multiply mul_mm.comp, which ggml-vulkan runs TQ2_0 prompts through (dequantizing
# into shared memory; ggml-vulkan's TQ2_0 has no integer-dot matmul). The scalar form: a Vulkan build whose
# glslc lacks GL_KHR_cooperative_matrix (Debian's) has no other, and neither has RADV before cooperative
# matrix support. One SPIR-V serves every non-LUT quant, the type a specialization constant (MmTypeA).
PROMPT_BITCOS = "mul_mm_bitcos.comp"
PROMPT_UPSTREAM = "mul_mm.comp"
# its variants for an f32 B: f16 accumulators (ggml-vulkan's choice for a quant type on a device with fp16
# arithmetic at GGML_PREC_DEFAULT, as on every RADV family here) and f32 ones (GGML_PREC_F32); the default first
UPSTREAM_MM = ("matmul_quant_f32_f16acc", "matmul_quant_f32")
# 11 ALIGNED (K a multiple of the tile's, B contiguous: a prompt's usual case), 12 MmTypeA (ggml_type_ids.glsl)
GGML_TYPE_TQ2_0 = 35
# the tag for mul_mm.comp: per workgroup iteration a BM x BK slice of A times BN columns, over BLOCK_SIZE lanes
UPSTREAM_MM_SHAPE = "weights-per-iteration = BM * BK / BLOCK_SIZE; columns = BN; inner-trips ="
WARPTILE_NAMES = ("BLOCK_SIZE", "BM", "BN", "BK", "WM", "WN", "WMITER", "TM", "TN", "TK", "WARP")


def upstream_mm_tiles(dev: dict[str, Any]) -> list[tuple[int, list[int]]]:
    """ggml-vulkan's quant matmul tiles without cooperative matrices (ggml_vk_load_shaders: s_warptile_mmq,
    m_warptile_mmq; spec constants 0-10 as WARPTILE_NAMES), by their index in its pipeline names (_aligned_0:
    small, 32 x 32 as mul_mm_bitcos.comp's; _aligned_1: medium, 64 x 64, what its tile selector picks for a
    prompt of more than 32 tokens when the large tile is off, as it is on AMD without cooperative matrices)."""
    sg = dev["subgroup_size"]
    sg8, sg32 = max(sg, 8), max(sg, 32)
    warp8 = min(sg8, 64)
    small = [sg32, 32, 32, 32, 8 if sg == 8 else 32, 32, 2, 2, 2, 1, sg8]
    gcn = dev["vendor_id"] == 0x1002 and dev["min_subgroup_size"] == 64 and dev["max_subgroup_size"] == 64
    medium = [256, 64, 64, 32, 16, 16, 2, 2, 2, 1, 16] if gcn else [128, 64, 64, 32, warp8, 32, 2, 4, 2, 1, warp8]
    return [(0, small), (1, medium)]


def source_defines(source: Path) -> dict[str, int]:
    """A shader's integer #defines (mul_mm_bitcos.comp's TM, TN, TK), names its gpu-isa tag may use."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^#define\s+(\w+)\s+(\d+)\b", source.read_text(), re.M)}


def prompt_variant(name: str) -> str:
    """The type a prompt pipeline computes: mul_mm_bitcos_pt -> bitcos_pt; upstream's matmul -> tq2_0."""
    return name.removeprefix("mul_mm_") if name.startswith("mul_mm_bitcos") else "tq2_0"


def compile_prompt_shaders(tree: ShaderTree) -> list[Pipeline]:
    """mul_mm_bitcos.comp's variants and upstream's UPSTREAM_MM, compiled by the generator as a build does
    (only those: the filter leaves every other matmul variant empty)."""
    found = []
    bitcos_src = tree.root / "vulkan-shaders" / PROMPT_BITCOS
    for src, shape, keep in (
        (bitcos_src, shader_shape(bitcos_src), lambda n: n.startswith("mul_mm_bitcos")),
        (tree.root / "vulkan-shaders" / PROMPT_UPSTREAM, Shape.parse(UPSTREAM_MM_SHAPE), lambda n: n in UPSTREAM_MM),
    ):
        names = " ".join(UPSTREAM_MM) if src.name == PROMPT_UPSTREAM else "mul_mm_bitcos*"
        listing = _generate(tree, src, tree.root / "spv" / f"{src.stem}.prompt", GPU_ISA_NAMES=names)
        found += [Pipeline(n, Path(path), src.name, shape) for n, path in listing if keep(n)]
    if not any(p.source == PROMPT_BITCOS for p in found):
        raise RuntimeError(f"the generator compiled no {PROMPT_BITCOS} variant")
    return found


def measure_prompt(
    family: str, pipelines: list[Pipeline], tree: ShaderTree, keep: Path | None = None
) -> tuple[DeviceParams, list[Result]]:
    """The prompt pipelines compiled on RADV's null device for `family` with ggml-vulkan's creation
    parameters: mul_mm_bitcos (64 invocations, no specialization constants, no required subgroup size) and
    upstream's matmul at each tile of upstream_mm_tiles (ALIGNED, MmTypeA = TQ2_0); both with robust buffer
    access, which ggml-vulkan leaves on for matrix multiplies. One iteration of the hot loop covers
    `weights` weights per lane times `columns` columns: the counts per weight and column are per
    multiply-add and lane."""
    dev = query_device(family)
    params = device_params(dev)
    defines = source_defines(tree.root / "vulkan-shaders" / PROMPT_BITCOS)
    jobs: list[tuple[str, str, Pipeline, str, dict[str, int]]] = []  # key, label, pipeline, spec, names
    for p in pipelines:
        if p.source == PROMPT_BITCOS:
            jobs.append((f"{p.source.removesuffix('.comp')}.{p.name}", p.name, p, "", defines))
            continue
        for i, tile in upstream_mm_tiles(dev):
            spec = " ".join(f"{k}={v}" for k, v in enumerate(tile)) + f" 11=1 12={GGML_TYPE_TQ2_0}"
            label = f"{p.name}_aligned_{i}"
            jobs.append((f"{p.source.removesuffix('.comp')}.{label}", label, p, spec, dict(zip(WARPTILE_NAMES, tile))))
    created = create_pipelines(family, [f"{key} {p.spv} 0 robust {spec}" for key, _, p, spec, _ in jobs], keep)
    results = []
    for key, label, p, _, names in jobs:
        info, isa = created[key]
        res = Result(
            label,
            p.source,
            0,
            names.get("BM", names.get("TM", 0)),
            names.get("BLOCK_SIZE", 64),
            info["statistics"],
            None,
            None,
            wave_size=info.get("subgroup_size"),
        )
        count_hot_loop(res, p.shape, isa, names, columns=True)
        results.append(res)
    return params, results


# ------------------------------------------------------------------------------------------ output
# The mat-vec ggml-bitcos runs by default (GGML_BITCOS_VULKAN_EXACT unset): the fast shader, in its q8_1 form (int8
# activations, packed dot products) where the device accelerates int8 dot products, in its f32 form elsewhere.
DEFAULT_BITCOS_SOURCE = "mul_mat_vec_bitcos_fast.comp"


def default_bitcos(results: list[Result], cols: int, int8_dot: bool, variant: str = "bitcos") -> Result | None:
    """Of a family's results, the mat-vec (not -id) pipeline of `variant` the backend runs by default at
    `cols` columns on a device with (int8_dot) or without accelerated int8 dot products."""
    b = "q8_1" if int8_dot else "f32"
    for r in results:
        m = PIPELINE_NAME.match(r.pipeline)
        if (
            m
            and r.cols == cols
            and r.source == DEFAULT_BITCOS_SOURCE
            and m.group("kind") == "mul_mat_vec"
            and m.group("b") == b
            and pipeline_variant(r.pipeline, r.source) == variant
        ):
            return r
    return None


def rows_json(
    family: str, results: list[Result], cols: tuple[int, ...], params: DeviceParams | None = None
) -> list[dict[str, Any]]:
    """One object per column count: {"family", "cols", "bitcos": {pipeline: counts}, "tq2_0": counts}; the
    mat-vec-id pipelines (one column) under "bitcos_id" / "tq2_0_id" in the one-column object. With the
    device's parameters also "int8_dot_accelerated" and "bitcos_default": the key in "bitcos" of the v2
    pipeline the backend runs by default there (None when it was not measured)."""
    out = []
    for n in cols:
        row: dict[str, Any] = {"family": family, "cols": n, "bitcos": {}, "tq2_0": None}
        if params is not None:
            d = default_bitcos(results, n, params.int8_dot)
            row["int8_dot_accelerated"] = params.int8_dot
            row["bitcos_default"] = f"{d.source}:{d.pipeline}" if d else None
        for r in results:
            m = PIPELINE_NAME.match(r.pipeline)
            is_id = m.group("kind") == "mul_mat_vec_id"
            if r.cols != n or (is_id and n != 1):
                continue
            if m.group("type") == "tq2_0":
                row["tq2_0_id" if is_id else "tq2_0"] = r.as_dict()
            else:
                row.setdefault("bitcos_id", {}) if is_id else None
                (row["bitcos_id"] if is_id else row["bitcos"])[f"{r.source}:{r.pipeline}"] = r.as_dict()
        out.append(row)
    return out


def table(family: str, params: DeviceParams, results: list[Result], cols: tuple[int, ...]) -> str:
    """Markdown: per pipeline and column count, instructions per weight per lane (all columns) and per weight
    and column, the classes, VGPRs and waves per SIMD."""
    lines = [
        f"### {family} ({params.name}): workgroup {params.subgroup_size}, NUM_ROWS {params.num_rows}, "
        f"{params.reduction} reduction, int8 dot {'accelerated' if params.int8_dot else 'not accelerated'}",
        "",
        "| pipeline (source) | cols | per weight | per weight & col | VALU | SALU | VMEM | SMEM | LDS | ctrl "
        "| loop instr / weights | VGPRs | SGPRs | LDS B | waves/SIMD |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    order = sorted(results, key=lambda r: ("tq2_0" not in r.pipeline, r.source, "_id_" in r.pipeline, r.pipeline))
    for r in order:
        d = r.as_dict()
        name = f"{r.pipeline.removesuffix(REDUCTION_SUFFIX[params.reduction])} ({r.source or 'build'})"
        if "per_weight" in d:
            c = d["per_weight_by_class"]
            cells = [
                f"{d['per_weight']:.2f}",
                f"{d['per_weight_and_column']:.2f}",
                *(f"{c[k]:.2f}" for k in ("VALU", "SALU", "VMEM", "SMEM", "LDS", "control")),
                f"{d['hot_loop']['instructions']} / {d['weights_per_iteration']}",
            ]
        else:
            cells = ["-"] * 8 + [d.get("error", "")]
        lines.append(
            f"| {name} | {r.cols} | "
            + " | ".join(cells)
            + f" | {d['vgprs']} | {d['sgprs']} | {d['lds_bytes']} | {d['waves_per_simd']} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ budget
DATASHEETS = HERE / "gpu_datasheets.json"
BITS_PER_WEIGHT = {"bitcos": 1.6, "tq2_0": 2.0625}  # BITCOS at z = 0.4 (FORMAT.md), TQ2_0's fixed rate


def load_datasheets(path: Path = DATASHEETS) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["gpus"]


def budget(gpu: dict[str, Any], bits_per_weight: float) -> float:
    """Instructions per weight per lane a mat-vec may spend and stay memory-bound: lane-instructions per second
    (ALU lanes x clock) over weights per second at full memory bandwidth."""
    lane_rate = gpu["alu_lanes"] * gpu["clock_ghz"] * 1e9
    weight_rate = gpu["bandwidth_gbs"] * 1e9 * 8 / bits_per_weight
    return lane_rate / weight_rate


# AMD's scalar unit issues one wave instruction per SALU slot; a wave64 VALU instruction takes 2 cycles on an
# RDNA SIMD32 and 4 on a GCN / CDNA SIMD16, where a SIMD gets an issue slot every 4 cycles: the SALU work a
# vector instruction slot can hide, per family
SALU_PER_VALU_SLOT = {"gfx1100": 0.5, "gfx1030": 0.5, "gfx90a": 1.0}


def issue_count(d: dict[str, Any], gpu: dict[str, Any]) -> float:
    """Issue-limiting instructions per weight per lane on `gpu` from its proxy's counts: on AMD (a scalar unit
    beside the vector ALUs) the larger of VALU and SALU in vector-slot terms; elsewhere (NVIDIA, Intel, Apple)
    uniform work runs on the vector lanes too: VALU + SALU."""
    c = d["per_weight_by_class"]
    if gpu["scalar_unit"]:
        return max(c["VALU"], c["SALU"] * SALU_PER_VALU_SLOT.get(gpu["proxy"], 1.0))
    return c["VALU"] + c["SALU"]


def predict(gpu: dict[str, Any], bitcos: dict[str, Any], tq2: dict[str, Any]) -> dict[str, float]:
    """Predicted BITCOS / TQ2_0 speed of one mat-vec: each takes the longer of its memory time and its issue
    time (the proxy's counts over the GPU's lane rate), per weight."""
    lane_rate = gpu["alu_lanes"] * gpu["clock_ghz"] * 1e9
    t = {}
    for name, d in (("bitcos", bitcos), ("tq2_0", tq2)):
        mem = BITS_PER_WEIGHT[name] / 8 / (gpu["bandwidth_gbs"] * 1e9)
        t[name] = max(mem, issue_count(d, gpu) / lane_rate)
    return {
        "speed_ratio": t["tq2_0"] / t["bitcos"],
        "bitcos_s_per_gweight": t["bitcos"] * 1e9,
        "tq2_0_s_per_gweight": t["tq2_0"] * 1e9,
    }


def budget_table(measured: list[tuple[str, DeviceParams, list[Result]]], cols: tuple[int, ...]) -> str:
    """Markdown: per GPU its budget at BITCOS's and TQ2_0's bits per weight and, from its proxy family's counts,
    the predicted BITCOS / TQ2_0 mat-vec speed: BITCOS's v2 pipeline the backend runs by default on that GPU
    (default_bitcos: where the datasheet says the GPU has accelerated packed int8 dot products the fast shader's
    q8_1 form, then also a row for its f32 form (GGML_BITCOS_VULKAN_INT8=0); elsewhere the f32 form) against
    upstream's TQ2_0 shader (f32 activations: ggml-vulkan has no integer-dot mat-vec for TQ2_0). The datasheet
    figures stay in gpu_datasheets.json."""
    by_family = {f: res for f, _, res in measured}
    lines = [
        "| GPU | budget @1.6 | budget @2.0625 | proxy | cols | BITCOS pipeline | issue count B / T "
        "| predicted BITCOS / TQ2_0 |",
        "|---|---:|---:|---|---:|---|---|---:|",
    ]
    for gpu in load_datasheets():
        res = by_family.get(gpu["proxy"])
        head = f"| {gpu['gpu']} | {budget(gpu, 1.6):.2f} | {budget(gpu, 2.0625):.2f} | {gpu['proxy']} "
        if res is None:
            lines.append(head + "| - | (proxy not measured) | - | - |")
            continue
        int8 = bool(gpu.get("int8_dot_accelerated"))
        forms = [(True, "fast q8_1"), (False, "fast f32 (INT8=0)")] if int8 else [(False, "fast f32")]
        for n, (q8, form) in ((n, f) for n in cols for f in forms):
            tq2 = next((r.as_dict() for r in res if r.cols == n and r.pipeline.startswith("mul_mat_vec_tq2_0_")), None)
            r = default_bitcos(res, n, q8)
            d = r.as_dict() if r is not None else {}
            if tq2 is None or "per_weight" not in d or "per_weight" not in tq2:
                lines.append(head + f"| {n} | {form} (not measured) | - | - |")
                continue
            p = predict(gpu, d, tq2)
            lines.append(
                head + f"| {n} | {form} | {issue_count(d, gpu):.2f} / {issue_count(tq2, gpu):.2f} "
                f"| {p['speed_ratio']:.2f}x |"
            )
    return "\n".join(lines)


def prompt_json(family: str, params: DeviceParams, results: list[Result]) -> dict[str, Any]:
    """One object per family: {"family", "kind": "prompt", "bitcos": {source:pipeline: counts}, "tq2_0":
    {pipeline: counts}, "tq2_0_default": the pipeline ggml-vulkan picks for a prompt of more than 32 tokens}.
    Counts per weight and column ("per_weight_and_column") are per multiply-add and lane."""
    row: dict[str, Any] = {
        "family": family,
        "kind": "prompt",
        "bitcos": {},
        "tq2_0": {},
        "tq2_0_default": f"{UPSTREAM_MM[0]}_aligned_1",
    }
    for r in results:
        if r.source == PROMPT_BITCOS:
            row["bitcos"][f"{r.source}:{r.pipeline}"] = r.as_dict()
        else:
            row["tq2_0"][r.pipeline] = r.as_dict()
    return row


def prompt_table(family: str, params: DeviceParams, results: list[Result]) -> str:
    """Markdown: per prompt pipeline its hot-loop instructions per multiply-add and lane, by class, and its
    VGPRs, LDS and occupancy."""
    lines = [
        f"### {family} ({params.name}): prompt path, instructions per multiply-add per lane",
        "",
        "| pipeline (source) | tile rows x cols | per MAC | VALU | SALU | VMEM | SMEM | LDS | ctrl "
        "| loop instr / (weights x cols) | wave | VGPRs | SGPRs | LDS B | waves/SIMD |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(results, key=lambda r: (r.source != PROMPT_BITCOS, r.pipeline)):
        d = r.as_dict()
        if "per_weight" in d:
            w, c = d["weights_per_iteration"], r.cols
            cells = [
                f"{d['per_weight_and_column']:.2f}",
                *(f"{d['per_weight_by_class'][k] / c:.3f}" for k in ("VALU", "SALU", "VMEM", "SMEM", "LDS", "control")),
                f"{d['hot_loop']['instructions']} / ({w} x {c})",
            ]
        else:
            cells = ["-"] * 7 + [d.get("error", "")]
        lines.append(
            f"| {r.pipeline} ({r.source}) | {r.num_rows} x {r.cols} | "
            + " | ".join(cells)
            + f" | {r.wave_size} | {d['vgprs']} | {d['sgprs']} | {d['lds_bytes']} | {d['waves_per_simd']} |"
        )
    return "\n".join(lines)


def select(pipelines: list[Pipeline], types: list[str] | None) -> list[Pipeline]:
    if not types:
        return pipelines
    return [p for p in pipelines if p.variant in types]


def run_all(
    families: list[str],
    cols: tuple[int, ...],
    types: list[str] | None = None,
    spv_dir: Path | None = None,
    vulkan_dir: Path = REPO_VULKAN,
    keep: Path | None = None,
) -> list[tuple[str, DeviceParams, list[Result]]]:
    tree = shader_tree(vulkan_dir)
    if spv_dir is not None:
        pipelines = build_dir_shaders(spv_dir, tree.sources)
    else:
        pipelines = compile_shaders(tree, {device_params(query_device(f)).reduction for f in families})
    pipelines = select(pipelines, types)
    return [(f, *measure(f, pipelines, cols, keep)) for f in families]


def run_prompt(
    families: list[str],
    types: list[str] | None = None,
    spv_dir: Path | None = None,
    vulkan_dir: Path = REPO_VULKAN,
    keep: Path | None = None,
) -> list[tuple[str, DeviceParams, list[Result]]]:
    """The prompt path (compile_prompt_shaders, measure_prompt) on each family; with `spv_dir` the SPIR-V of
    a Vulkan build (its mul_mm_bitcos*.spv and UPSTREAM_MM files)."""
    tree = shader_tree(vulkan_dir)
    if spv_dir is not None:
        bitcos_shape = shader_shape(tree.root / "vulkan-shaders" / PROMPT_BITCOS)
        pipelines = [
            Pipeline(f.stem, f, PROMPT_BITCOS, bitcos_shape) for f in sorted(spv_dir.glob("mul_mm_bitcos*.spv"))
        ]
        pipelines += [
            Pipeline(n, spv_dir / f"{n}.spv", PROMPT_UPSTREAM, Shape.parse(UPSTREAM_MM_SHAPE))
            for n in UPSTREAM_MM
            if (spv_dir / f"{n}.spv").is_file()
        ]
    else:
        pipelines = compile_prompt_shaders(tree)
    if types:
        pipelines = [p for p in pipelines if prompt_variant(p.name) in types]
    return [(f, *measure_prompt(f, pipelines, tree, keep)) for f in families]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--families", default="gfx1100,gfx1030,gfx90a", help="comma list of " + ", ".join(FAMILIES))
    p.add_argument(
        "--cols", default=",".join(map(str, DEFAULT_COLS)), help="activation columns (mat-vec pipelines NUM_COLS)"
    )
    p.add_argument(
        "--types",
        help="comma list of pipeline types to measure (tq2_0, bitcos, bitcos_pt, bitcos_g128, ...); default all",
    )
    p.add_argument("--spv-dir", type=Path, help="take the SPIR-V from a Vulkan build's vulkan-shaders.spv folder")
    p.add_argument(
        "--vulkan-dir", type=Path, default=REPO_VULKAN, help="the BITCOS shader sources (default: csrc/vulkan)"
    )
    p.add_argument("--keep-isa", type=Path, help="folder to keep every pipeline's SPIR-V, ISA and statistics in")
    p.add_argument("--json", nargs="?", const="-", help="print JSON (or write it to this file)")
    p.add_argument(
        "--budget",
        action="store_true",
        help="also the per-GPU instruction budget (gpu_datasheets.json) and the predicted BITCOS / TQ2_0 speed",
    )
    p.add_argument(
        "--prompt",
        action="store_true",
        help="the prompt path instead of the mat-vec: mul_mm_bitcos.comp against upstream's matmul for TQ2_0, "
        "per multiply-add (--cols and --budget do not apply)",
    )


def run(args: argparse.Namespace) -> int:
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    cols = tuple(int(c) for c in args.cols.split(","))
    types = [t.strip() for t in args.types.split(",")] if args.types else None
    if getattr(args, "prompt", False):
        return run_prompt_cli(args, families, types)
    try:
        measured = run_all(families, cols, types, args.spv_dir, args.vulkan_dir, args.keep_isa)
    except RuntimeError as e:
        print(f"gpu-isa: {e}", file=sys.stderr)
        return 2
    if args.json:
        rows = [row for f, params, res in measured for row in rows_json(f, res, cols, params)]
        text = json.dumps(rows, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    if args.json != "-":
        print("# dev.gpu_isa: hot-loop instructions per weight per lane (RADV null device, static)")
        for f, params, res in measured:
            print()
            print(table(f, params, res, cols))
        if args.budget:
            print()
            print(
                "### Budget and prediction (a static prediction, not a measurement): instructions per weight per "
                "lane a mat-vec may spend and stay memory-bound (gpu_datasheets.json); issue count B / T: the "
                "proxy's BITCOS / TQ2_0 hot-loop count per weight per lane that limits issue (AMD: max(VALU, "
                "SALU in vector slots); others: VALU + SALU)"
            )
            print()
            print(budget_table(measured, cols))
    return 0


def _write_json(dest: str, obj: Any) -> None:
    text = json.dumps(obj, indent=1)
    if dest == "-":
        print(text)
    else:
        Path(dest).write_text(text + "\n")


def run_prompt_cli(args: argparse.Namespace, families: list[str], types: list[str] | None) -> int:
    """`--prompt`: the prompt path's tables (or JSON: one prompt_json object per family)."""
    if args.budget:
        print("gpu-isa: --budget applies to the mat-vec only; ignored with --prompt", file=sys.stderr)
    try:
        measured = run_prompt(families, types, args.spv_dir, args.vulkan_dir, args.keep_isa)
    except RuntimeError as e:
        print(f"gpu-isa: {e}", file=sys.stderr)
        return 2
    if args.json:
        _write_json(args.json, [prompt_json(f, params, res) for f, params, res in measured])
    if args.json != "-":
        print(
            "# dev.gpu_isa --prompt: hot-loop instructions per multiply-add per lane (RADV null "
            "device, static). TQ2_0: upstream's matmul (mul_mm.comp, no cooperative matrix), _aligned_0 the 32 x 32 "
            "tile as BITCOS's, _aligned_1 the 64 x 64 one ggml-vulkan picks for prompts; _f16acc its default"
        )
        for f, params, res in measured:
            print()
            print(prompt_table(f, params, res))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m dev.gpu_isa", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
