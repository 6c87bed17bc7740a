"""`python3 -m dev.mca` (a maintainer's instrument, run from a checkout): a static model of the CPU kernels' hot loops in llvm-mca - a prediction, not a measurement.

Cycles per 32 weights of every BITCOS kernel file of an architecture, of the codes-form kernels (NAME/2bit, the 2-bit
codes of docs/KERNELS.md §8; aarch64) and of upstream's TQ2_0 vec_dot (ggml_vec_dot_tq2_0_q8_K, compiled from the
pinned upstream source fetched at run time, never copied into this repository; on aarch64 also built like the Armv8.0
kernel, tq2_0@neon: the reference of the kernels without dotprod) from the same compiler, at 1 and several
activation columns, on the CPUs llvm-mca models:

    python3 -m dev.mca [--arch aarch64,x86_64] [--cpus apple-a14,neoverse-v2] [--nc 1,4] [--json]
    python3 -m dev.mca --arch x86_64 --measure      # + this machine's measured ticks, predicted/measured

How (docs/PERFORMANCE.md, "Static model"): each kernel file is copied to a temporary folder and a marker
(an empty `asm volatile` whose text is a comment "BITCOS-MCA-TICK name") is inserted as the first statement of
the loops a model names; the copy is compiled to assembly as the kernel manifest (csrc/bitcos-kernels.json,
`mca` of each architecture) says: aarch64: clang --target=aarch64-linux-gnu -mcpu=CPU, the native build of that
core, or a kernel's own flags with -mtune=CPU; x86-64: the kernel's flags as the harness library builds it, GCC
by default like the measured library. In the assembly, the innermost loop that holds a marker (labels and
backward branches) is its instance; its instructions, without the nested loops that are instances of other
markers, go to llvm-mca, which reports the steady-state cycles of one pass. A model adds its loops' cycles,
each times how often it runs per row and 256 weights at nc columns (markers an unrolled loop holds several of
divide that count). Loops outside the named ones (per-tile staging of the columns, reductions) are not
modelled.

What the model assumes: llvm-mca takes every instruction of the loop body as executed once per pass (branches
not taken and no mispredictions; a cold path laid out inside the loop counts as if taken), every load hits L1,
and the data-dependent parts (popcounts, table lookups, sign windows) cost the same for any data: the kernels'
decode is branch-free per weight, so the zero density changes no instruction count. It is a prediction:
`--measure` (x86-64) puts it next to `bench kernels`' measured TSC ticks on this machine, the model's error.

LLVM 19 has no `apple-m1` scheduling model: `apple-a14` is the M1's performance core (Firestorm).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

from dev import kernel_manifest
from dev.loops import natural_loop, predecessors, reachable
from ggml_bitcos.bench.common import parse_ints

CSRC: Final = kernel_manifest.CSRC
# The architectures and kernels (csrc/bitcos-kernels.json): triples, default CPUs and how to compile for them
KERNELS: Final = kernel_manifest.load()

# The CPUs of the default tables (llvm-mca 19's -mcpu names: the manifest's) and what a reader knows them as.
CPUS: Final = {a.name: a.mca.cpus for a in KERNELS.arches.values()}
CPU_NOTES: Final = {
    "apple-a14": "Apple M1 / A14 performance core (Firestorm); LLVM 19 has no apple-m1 model",
    "apple-m4": "Apple M4 performance core; LLVM 19 schedules it with apple-a14's model (same numbers)",
    "neoverse-v2": "AWS Graviton4, NVIDIA Grace",
    "cortex-a76": "Raspberry Pi 5, many Android phones",
    "sapphirerapids": "Intel Xeon 4th gen (the nearest model of the dev VM's Xeon with AMX)",
    "icelake-server": "Intel Xeon 3rd gen",
    "znver4": "AMD Zen 4",
    "znver5": "AMD Zen 5; LLVM 19 schedules it with znver4's model (same numbers)",
}
TRIPLES: Final = {a.name: a.mca.triple for a in KERNELS.arches.values()}
# The assembler comment that starts a marker's text, per architecture.
COMMENT: Final = {a.name: a.mca.asm_comment for a in KERNELS.arches.values()}
TICK: Final = "BITCOS-MCA-TICK"
BLOCK: Final = 256  # weights per Q8_K block: a model's unit of work (one row x 256 weights)
MCA_ITERATIONS: Final = 200
CODES_SUFFIX: Final = "/2bit"  # a codes-form kernel's name: "neon/2bit" (bench kernels' NAME/2bit)
TQ2: Final = "tq2_0"  # upstream's TQ2_0 vec_dot, the reference of every ratio

# The upstream files TQ2_0's vec_dot is compiled from (and the headers they include), per architecture.
UPSTREAM_GGML: Final = "vendor/llama.cpp/ggml/"
UPSTREAM_QUANTS: Final = {a.name: a.mca.upstream_quants for a in KERNELS.arches.values()}


class McaError(RuntimeError):
    """A tool is missing, a compile failed, or a marker is not where a model says it is."""


# ---------------------------------------------------------------------------------------------- models
@dataclass(frozen=True)
class Mark:
    """A loop of a kernel's source whose body gets a marker, and how often one body runs.

    `loop` is a regular expression matched inside the C function `function` (its first match): the `for` loop
    marked starts where the match (or its group named "loop") starts, and has a braced body. `per_block(nc, defines)` is the number of
    times the body runs per row and 256 weights at nc columns (`defines`: the file's integer #defines).
    `select`: a C expression printed into the marker (a compile-time constant after inlining, e.g. the tile
    scale kind); only instances where it is non-zero (or, with `value`, equal to it: several marks on one loop
    inlined as several tiles) are modelled. `asm_function`: the compiled function holding the instance (for
    loops inlined into several)."""

    name: str
    function: str
    loop: str
    per_block: Callable[[int, dict[str, int]], float]
    select: str | None = None
    asm_function: str | None = None
    value: int | None = None  # only instances whose selected value is this one (a tile's tag), not just non-zero


@dataclass(frozen=True)
class KernelModel:
    """One kernel path of one source file: its marks for nc columns and how it is compiled.

    `name`: a kernel of the manifest (csrc/bitcos-kernels.json), whose target flags the file is compiled with,
    its codes-form kernel ("neon/2bit"), or "tq2_0" for upstream's vec_dot (built natively for each CPU) and
    "tq2_0@NAME" for it built with the flags of the manifest's kernel NAME (`like`: NAME), the reference of the
    kernels built with those flags. `source`: a file of csrc/ or, for upstream, the path under
    vendor/llama.cpp/ggml/. `marks(nc)`: the loops that make up the path at nc columns. `substitutions(nc)`:
    (regex, replacement) edits of the copy's headers and source (a tile size made equal to nc, so an unrolled
    column loop holds exactly the columns that run)."""

    name: str
    arch: str
    source: str
    upstream: bool
    marks: Callable[[int], tuple[Mark, ...]]
    substitutions: Callable[[int], tuple[tuple[str, str], ...]] = lambda nc: ()
    like: str | None = None

    @property
    def flags(self) -> tuple[str, ...]:
        """The kernel's target flags from the manifest (none for a kernel of every architecture or for upstream,
        but for a `like` build of it: that kernel's); a codes-form kernel ("neon/2bit") has its table entry's."""
        known = {k.name: k for k in KERNELS.kernels}
        base = self.like if self.upstream else self.name.removesuffix(CODES_SUFFIX)
        return known[base].flags if base in known else ()


def bitcos_model(
    name: str,
    arch: str,
    marks: Callable[[int], tuple[Mark, ...]],
    substitutions: Callable[[int], tuple[tuple[str, str], ...]],
) -> KernelModel:
    """The model of the manifest's kernel `name` on `arch` (its source file from the manifest)."""
    return KernelModel(name, arch, KERNELS.kernel(name).source, False, marks, substitutions)


def codes_model(
    name: str,
    arch: str,
    marks: Callable[[int], tuple[Mark, ...]],
    substitutions: Callable[[int], tuple[tuple[str, str], ...]],
) -> KernelModel:
    """The model of the codes-form kernel (docs/KERNELS.md §8) of the manifest's kernel `name`: "name/2bit", as
    `bench kernels` names it, from the kernel's codes_source, compiled with the kernel's flags."""
    return KernelModel(name + CODES_SUFFIX, arch, KERNELS.kernel(name).codes_source, False, marks, substitutions)


def upstream_model(
    arch: str,
    marks: Callable[[int], tuple[Mark, ...]],
    like: str | None = None,
    substitutions: Callable[[int], tuple[tuple[str, str], ...]] = lambda nc: (),
) -> KernelModel:
    """Upstream's TQ2_0 vec_dot on `arch` (the manifest's upstream_quants file): "tq2_0", built natively for each
    CPU, or "tq2_0@NAME", built with the target flags of the manifest's kernel NAME (`like`), what a core that
    runs that kernel runs of TQ2_0 (aarch64 without dotprod: TQ2_0's smlal path)."""
    name = TQ2 if like is None else f"{TQ2}@{like}"
    return KernelModel(name, arch, UPSTREAM_QUANTS[arch], True, marks, substitutions, like)


def _portable_marks(nc: int) -> tuple[Mark, ...]:
    rows_fn = "bitcos_portable_rows"
    return (
        # decode: per row, one pass per 128-weight half (both levels marked: either may be the innermost loop)
        Mark("decode-row", rows_fn, r"for \(int r = 0; r < ng; \+\+r\) \{\s*const uint8_t \* row", lambda n, d: 1.0),
        Mark(
            "decode-half", rows_fn, r"for \(int h = 0; h < halves; \+\+h\) \{\s*const int64_t\s+u\b", lambda n, d: 2.0
        ),
        # a 64-weight word: 4 per row and block
        Mark("decode-word", "bitcos_portable_decode", r"for \(int h = 0; h < 2; \+\+h\)", lambda n, d: 4.0),
        # the column's activation sums: once per column and row group of PORTABLE_ROWS rows
        Mark(
            "corr",
            rows_fn,
            r"for \(int h = 0; h < halves; \+\+h\) \{\s*bitcos_portable_corr",
            lambda n, d: 2.0 * n / d["PORTABLE_ROWS"],
        ),
        Mark("corr-lane", "bitcos_portable_corr", r"for \(int l = 0; l < 8; \+\+l\)", lambda n, d: 2.0 * n),
        # the products and the float part: per row and column
        Mark("dot-row", rows_fn, r"for \(int r = 0; r < ng; \+\+r\) \{\s*int32_t L", lambda n, d: float(n)),
        Mark("dot-half", rows_fn, r"for \(int h = 0; h < halves; \+\+h\) \{\s*for \(int l", lambda n, d: 2.0 * n),
        # the float part per lane: one FMA (row scales, equal unit scales: MATRIX runs this) or two (not run)
        Mark(
            "fma-one",
            rows_fn,
            r"for \(int l = 0; l < 8; \+\+l\) \{\s*a\[l\] = bitcos_contract_fma\(\(float\) \(",
            lambda n, d: 8.0 * n,
        ),
        Mark(
            "fma-two",
            rows_fn,
            r"for \(int l = 0; l < 8; \+\+l\) \{\s*a\[l\] = bitcos_contract_fma\(\(float\) L",
            lambda n, d: 0.0,
        ),
    )


_SHARED = "ts == TILE_SCALE_SHARED"  # the MATRIX / PT variants' tile scale: one scale for the whole tile


def _avx512_marks(nc: int) -> tuple[Mark, ...]:
    if nc == 1:
        # GEMV: a row pair per pass; the chunk routine a full chunk of a sparse-enough MATRIX tile runs
        # (every 64-weight word under 58 present weights, true at z >= ~0.1 for random data)
        return (
            Mark(
                "gemv-pair-block",
                "avx512_gemv_pair",
                r"for \(int j = 0; j < nbk; \+\+j\)",
                lambda n, d: 0.5,
                asm_function="avx512_gemv_shared_full_unchecked",
            ),
        )
    return (
        Mark(
            "gemm-row-block", "avx512_gemm_row_chunk", r"for \(int j = 0; j < nbk; \+\+j\)", lambda n, d: 1.0, _SHARED
        ),
    )


def _avx2_marks(nc: int) -> tuple[Mark, ...]:
    if nc == 1:
        return (Mark("gemv-block", "avx2_gemv_row_span", r"for \(; j < nd; \+\+j\)", lambda n, d: 1.0, _SHARED),)
    return (
        Mark("gemm-decode", "avx2_gemm_row", r"for \(int j = 0; j < nd; \+\+j\)", lambda n, d: 1.0, _SHARED),
        Mark(
            "gemm-column",
            "avx2_gemm_row",
            r"for \(int c = 0; c < nct; \+\+c\) \{[^{]*(?P<loop>for \(int j = 0; j < nbk; \+\+j\))",
            lambda n, d: float(n),
            _SHARED,
        ),
    )


def _shape(nc: int) -> tuple[tuple[str, str], ...]:
    # the modelled case: k a multiple of 256 (every Q8_K block has two whole 128-weight units: no partial-unit
    # copy) and row scales (the MATRIX variant `--measure` times): the other paths are not compiled in
    return (
        (r"(const int\s+halves\s*=)[^;]*;", r"\g<1> 2;"),
        (r"\bw->k\s*%\s*QK_BITCOS\b", "0"),
        (r"\bw->row_scale\s*!=\s*NULL\b", "1"),
        (r"\bw->row_scale\s*==\s*NULL\b", "0"),
    )


def _x86_shape(nc: int) -> tuple[tuple[str, str], ...]:
    # + a column tile of exactly the modelled columns (even: the AVX-512 GEMM pairs them)
    return (*_shape(nc), (r"(#define X86_TILE_COLS\s+)\d+", rf"\g<1>{max(2, nc + nc % 2)}"))


def _neon_marks(nc: int) -> tuple[Mark, ...]:
    if nc == 1:
        # GEMV: a row's block per pass, each unit decoded straight into its dot products
        return (
            Mark("gemv-block", "neon_gemv_row", r"for \(int64_t b = 0; b < sh\.nby; \+\+b\)", lambda n, d: 1.0),
            Mark("gemv-half", "neon_gemv_row", r"for \(int h = 0; h < halves; \+\+h\)", lambda n, d: 2.0),
        )
    # GEMM: a row's block decoded once, then every column
    return (
        Mark("gemm-block", "neon_gemm_row", r"for \(int64_t b = 0; b < sh\.nby; \+\+b\)", lambda n, d: 1.0),
        Mark(
            "gemm-decode-half",
            "neon_gemm_row",
            r"for \(int h = 0; h < halves; \+\+h\) \{\s*neon_decode",
            lambda n, d: 2.0,
        ),
        Mark(
            "gemm-column", "neon_gemm_row", r"for \(int c = 0; c < ncc; \+\+c\) \{\s*int32x4_t", lambda n, d: float(n)
        ),
        Mark(
            "gemm-dot-half",
            "neon_gemm_row",
            r"for \(int h = 0; h < halves; \+\+h\) \{\s*neon_dot",
            lambda n, d: 2.0 * n,
        ),
    )


# The codes kernels' tiles (row scales: the MATRIX case), tagged by the value of the block loop's marker: 1 for a
# tile of several rows and 1 column, 2 for 1 row and several columns (0: another scale kind, 3: a single row).
_NEON_CODES_TAG = "kind != NEON_CODES_ROW ? 0 : R > 1 && C == 1 ? 1 : R == 1 && C > 1 ? 2 : 3"
NEON_CODES_COLS: Final = 4  # the file's NEON_CODES_COLS, which tiles run at nc columns (tests/test_bench_mca.py)


def _neon_codes_marks(nc: int) -> tuple[Mark, ...]:
    # nc // NEON_CODES_COLS tiles of 1 row x NEON_CODES_COLS columns per row (a block's codes made once for them),
    # then each remaining column in tiles of NEON_CODES_GEMV_ROWS rows (a block's activation loads and group sums
    # shared by them): a block per pass. The single-row tail of a row count that is not a multiple of the tile's
    # rows is not modelled. A mark must not count 0 passes (its blocks would leave the other tile's loop), so
    # each is there only when its tile runs.
    loop = r"for \(int64_t b = 0; b < nfull; \+\+b\)"
    gemm = Mark(
        "codes-gemm-block",
        "neon_codes_tile",
        loop,
        lambda n, d: float(n // d["NEON_CODES_COLS"]),
        _NEON_CODES_TAG,
        value=2,
    )
    gemv = Mark(
        "codes-gemv-block",
        "neon_codes_tile",
        loop,
        lambda n, d: (n % d["NEON_CODES_COLS"]) / d["NEON_CODES_GEMV_ROWS"],
        _NEON_CODES_TAG,
        value=1,
    )
    return (*((gemm,) if nc >= NEON_CODES_COLS else ()), *((gemv,) if nc % NEON_CODES_COLS else ()))


def _tq2_marks(nc: int) -> tuple[Mark, ...]:
    # one vec_dot per row and column, a 256-weight block per pass
    return (
        Mark("vec-dot-block", "ggml_vec_dot_tq2_0_q8_K", r"for \(int i = 0; i < nb; \+\+i\)", lambda n, d: float(n)),
    )


def _tq2_unrolled(nc: int) -> tuple[tuple[str, str], ...]:
    # The block's two 128-weight chunks unrolled, as GCC -O3 compiles them (clang keeps the loop of the
    # Armv8.0 path, whose accumulator chain llvm-mca would then charge as if it ran on from block to block)
    return ((r"(for \(size_t j = 0; j < sizeof\(x->qs\); j \+= 32\))", r'_Pragma("GCC unroll 2") \1'),)


MODELS: Final = (
    bitcos_model("neon", "aarch64", _neon_marks, _shape),
    bitcos_model("neon-dotprod", "aarch64", _neon_marks, _shape),
    bitcos_model("portable", "aarch64", _portable_marks, _shape),
    codes_model("neon", "aarch64", _neon_codes_marks, _shape),
    codes_model("neon-dotprod", "aarch64", _neon_codes_marks, _shape),
    upstream_model("aarch64", _tq2_marks),
    upstream_model("aarch64", _tq2_marks, "neon", _tq2_unrolled),
    bitcos_model("avx512", "x86_64", _avx512_marks, _x86_shape),
    bitcos_model("avx2", "x86_64", _avx2_marks, _x86_shape),
    bitcos_model("portable", "x86_64", _portable_marks, _shape),
    upstream_model("x86_64", _tq2_marks),
)
# Kernels of the manifest that are no hot loop of their own (the references), and codes-form kernels not modelled
# yet (the 2-bit form's targets are on aarch64; the x86 ones are measured by `bench kernels`).
NOT_MODELLED: Final = ("generic", "generic/2bit", "portable/2bit", "avx2/2bit", "avx512/2bit")


def unmodelled_kernels() -> list[str]:
    """ "arch/name" of every kernel the manifest builds for an architecture of its own or for all of them, and of
    its codes-form kernel ("name/2bit"), that no model covers on that architecture (a new kernel needs its model
    here)."""
    have = {(m.arch, m.name) for m in MODELS if not m.upstream}
    kernels = [(a, k) for a in KERNELS.arches for k in (*KERNELS.baseline_kernels, *KERNELS.kernels_of(a))]
    want = [(a, k.name) for a, k in kernels] + [(a, k.name + CODES_SUFFIX) for a, k in kernels if k.codes_source]
    return [f"{a}/{n}" for a, n in want if n not in NOT_MODELLED and (a, n) not in have]


# ------------------------------------------------------------------------------------- source markers
def _matching(text: str, i: int, open_: str, close: str) -> int:
    """Index just past the `close` that matches the `open_` at text[i] (comments and strings are not skipped:
    the kernels' code has no unbalanced braces in them)."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_:
            depth += 1
        elif text[j] == close:
            depth -= 1
            if depth == 0:
                return j + 1
    raise McaError(f"unbalanced {open_}{close} from offset {i}")


def function_body(text: str, function: str) -> tuple[int, int]:
    """(start, end) of the braces of C function `function`'s definition (not a declaration or a call)."""
    for m in re.finditer(r"\b" + re.escape(function) + r"\s*\(", text):
        close = _matching(text, m.end() - 1, "(", ")")
        rest = re.match(r"\s*\{", text[close:])
        if rest:
            start = close + rest.end() - 1
            return start, _matching(text, start, "{", "}")
    raise McaError(f"no definition of {function}()")


def marker_statement(name: str, arch: str, select: str | None) -> str:
    """The statement a mark inserts: an empty asm whose text is an assembler comment naming the mark (and the
    value of `select`, a constant after inlining)."""
    if select is None:
        return f'__asm__ volatile("{COMMENT[arch]} {TICK} {name}");'
    return f'__asm__ volatile("{COMMENT[arch]} {TICK} {name} %c0" ::"i"((int) ({select})));'


def insert_marks(text: str, marks: Iterable[Mark], arch: str) -> str:
    """`text` with each mark's statement as the first statement of its loop body."""
    for mark in marks:
        start, end = function_body(text, mark.function)
        m = re.compile(mark.loop).search(text, start, end)
        if not m:
            raise McaError(f"mark {mark.name}: no loop /{mark.loop}/ in {mark.function}()")
        header = m.start("loop") if "loop" in m.re.groupindex else m.start()
        if not text.startswith("for", header):
            raise McaError(f"mark {mark.name}: /{mark.loop}/ does not start at a for loop")
        paren = text.index("(", header)
        close = _matching(text, paren, "(", ")")
        brace = re.match(r"\s*\{", text[close:])
        if not brace:
            raise McaError(f"mark {mark.name}: the loop in {mark.function}() has no braces")
        at = close + brace.end()
        text = text[:at] + " " + marker_statement(mark.name, arch, mark.select) + text[at:]
    return text


def int_defines(text: str) -> dict[str, int]:
    """The integer object-like #defines of a source text (e.g. PORTABLE_ROWS)."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s*#\s*define\s+(\w+)\s+(\d+)\b", text, re.M)}


# ------------------------------------------------------------------------------------------ assembly
@dataclass
class AsmItem:
    kind: str  # "insn", "label" or "tick"
    text: str


BRANCH_MNEMONICS: Final = re.compile(r"^(j[a-z]+|b|b\.[a-z]+|b[a-z]{2}|cbn?z|tbn?z)$")
JUMP_MNEMONICS: Final = ("jmp", "jmpq", "b", "br")  # no fall-through
RETURN_MNEMONICS: Final = ("ret", "retq")
CALL_MNEMONICS: Final = ("call", "callq", "bl", "blr")


def parse_functions(asm: str, comment: str = "#") -> dict[str, list[AsmItem]]:
    """The assembly's functions (a global label at column 0 starts one): instructions, local labels and
    markers, directives and comments (`comment`: the architecture's comment start, COMMENT) dropped."""
    funcs: dict[str, list[AsmItem]] = {}
    cur: list[AsmItem] | None = None
    for line in asm.splitlines():
        m = re.match(r"^([A-Za-z_.$][\w.$]*):", line)
        if m:
            name = m.group(1)
            if name.startswith("."):
                if cur is not None:
                    cur.append(AsmItem("label", name))
            else:
                cur = funcs.setdefault(name, [])
            continue
        if cur is None:
            continue
        s = line.strip()
        if TICK in s:
            cur.append(AsmItem("tick", s[s.index(TICK) + len(TICK) :].strip()))
            continue
        if not s or s.startswith((".", "#", "//", ";")):
            continue
        if comment in s:  # a trailing comment
            s = s[: s.index(comment)].rstrip()
        if s:
            cur.append(AsmItem("insn", s))
    return funcs


def instructions(items: list[AsmItem]) -> list[str]:
    return [it.text for it in items if it.kind == "insn"]


@dataclass
class Cfg:
    """The control-flow graph of a function: basic blocks as [first, last] instruction indices, successors."""

    blocks: list[tuple[int, int]]
    succ: list[list[int]]

    def block_of(self, insn: int) -> int:
        return next(i for i, (a, b) in enumerate(self.blocks) if a <= insn <= b)


def _branch_target(insn: str, labels: dict[str, int]) -> str | None:
    parts = insn.replace(",", " ").split()
    if parts and BRANCH_MNEMONICS.match(parts[0]) and parts[-1] in labels:
        return parts[-1]
    return None


def build_cfg(items: list[AsmItem]) -> Cfg:
    """Basic blocks split at labels and after branches; edges to branch targets (local labels) and to the
    next block unless the block ends with an unconditional jump or a return (indirect jumps: no edges)."""
    insns = instructions(items)
    labels: dict[str, int] = {}
    n = 0
    for it in items:
        if it.kind == "label":
            labels[it.text] = n
        elif it.kind == "insn":
            n += 1
    starts = {0} | {i for i in labels.values() if i < len(insns)}
    for i, s in enumerate(insns):
        first = s.split()[0]
        if (_branch_target(s, labels) or first in JUMP_MNEMONICS or first in RETURN_MNEMONICS) and i + 1 < len(insns):
            starts.add(i + 1)
    order = sorted(starts)
    blocks = [(a, (order[k + 1] if k + 1 < len(order) else len(insns)) - 1) for k, a in enumerate(order)]
    index = {a: k for k, (a, _) in enumerate(blocks)}
    succ: list[list[int]] = []
    for k, (_, last) in enumerate(blocks):
        s = insns[last] if last >= 0 else ""
        first = s.split()[0] if s else ""
        out = []
        target = _branch_target(s, labels) if s else None
        if target is not None and labels[target] in index:
            out.append(index[labels[target]])
        if first not in JUMP_MNEMONICS and first not in RETURN_MNEMONICS and k + 1 < len(blocks):
            out.append(k + 1)
        succ.append(out)
    return Cfg(blocks, succ)


def natural_loops(cfg: Cfg) -> list[frozenset[int]]:
    """The natural loops of the graph (blocks reachable from the entry), one per header: every block that
    reaches a back edge's source without passing the header, where a back edge goes to a block dominating
    its source."""
    n = len(cfg.blocks)
    reach = reachable(cfg.succ)
    pred = predecessors(cfg.succ, reach)
    dom: list[set[int]] = [set(reach) for _ in range(n)]
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for v in sorted(reach - {0}):
            ps = [dom[p] for p in pred[v] if p in reach]
            new = (set.intersection(*ps) if ps else set()) | {v}
            if new != dom[v]:
                dom[v], changed = new, True
    loops: dict[int, set[int]] = {}
    for u in reach:
        for h in cfg.succ[u]:
            if h in dom[u]:  # back edge u -> h
                loops.setdefault(h, {h}).update(natural_loop(pred, h, u))
    return [frozenset(b) for b in loops.values()]


def tick_positions(items: list[AsmItem]) -> list[tuple[int, str, int | None]]:
    """(instruction the marker sits with, mark name, selected value or None) of every marker: the next
    instruction, or the previous one when a label comes first (the marker ends a block that falls through
    into the label, e.g. the preheader of a loop that starts right after it)."""
    out = []
    n = 0
    pending: list[tuple[str, int | None]] = []
    label_seen = False
    for it in items:
        if it.kind == "insn":
            out.extend((max(n - 1, 0) if label_seen else n, name, value) for name, value in pending)
            pending, label_seen = [], False
            n += 1
        elif it.kind == "label":
            label_seen = bool(pending)
        else:
            parts = it.text.split()
            value = int(parts[1]) if len(parts) > 1 and re.fullmatch(r"-?\d+", parts[1]) else None
            if label_seen:  # a marker after the label: the labelled block's
                out.extend((max(n - 1, 0), name, v) for name, v in pending)
                pending, label_seen = [], False
            pending.append((parts[0], value))
    out.extend((max(n - 1, 0), name, value) for name, value in pending)
    return out


@dataclass
class Instance:
    """The compiled code of one mark: a loop (or, with no loop around its marker, the function's path from
    its entry to its first return)."""

    function: str
    blocks: frozenset[int]
    ticks: int  # markers of the mark inside (an unrolled loop holds several)
    body: list[str]  # the instructions given to llvm-mca, in layout order
    notes: list[str] = field(default_factory=list)


def selected(mark: Mark, value: int | None) -> bool:
    """Whether a marker of `mark` with the selected value `value` (None: no select) is an instance of it."""
    if mark.value is not None:
        return value == mark.value
    return value is None or value != 0


def find_instance(
    funcs: dict[str, list[AsmItem]], mark: Mark, all_marks: Iterable[str], never: Iterable[str] = ()
) -> Instance:
    """The instance of `mark`: in `mark.asm_function` (or any function), the innermost loops holding its
    markers whose selected value is non-zero; the one with the most markers (the first on a tie). Its body
    leaves out every nested loop (a marked one is an instance of its own; an unmarked one is a cold version
    the vectorizer made, or a loop no mark names: noted) and the blocks holding markers of the marks in
    `never` (paths the modelled case does not run) or with a selected value of 0."""
    names = set(all_marks)
    never = set(never)
    best: tuple[int, str, frozenset[int]] | None = None
    for fname, items in funcs.items():
        if mark.asm_function is not None and fname != mark.asm_function:
            continue
        ticks = [t for t in tick_positions(items) if t[1] == mark.name and selected(mark, t[2])]
        insns = instructions(items)
        if not ticks or not insns:
            continue
        cfg = build_cfg(items)
        loops = natural_loops(cfg)
        groups: dict[frozenset[int], int] = {}
        for at, _, _ in ticks:
            blk = cfg.block_of(at)
            inside = [lp for lp in loops if blk in lp]
            if inside:
                key = min(inside, key=len)
            else:  # no loop: the entry's path to the first return
                ret = next((i for i, s in enumerate(insns) if s.split()[0] in RETURN_MNEMONICS), len(insns) - 1)
                key = frozenset(k for k, (a, _) in enumerate(cfg.blocks) if a <= ret)
            groups[key] = groups.get(key, 0) + 1
        for key, count in groups.items():
            if best is None or count > best[0]:
                best = (count, fname, key)
    if best is None:
        raise McaError(f"mark {mark.name}: no marker in {mark.asm_function or 'any function'} of the assembly")
    count, fname, blocks = best
    items = funcs[fname]
    insns = instructions(items)
    cfg = build_cfg(items)
    ticks = tick_positions(items)
    marked_blocks = {cfg.block_of(at) for at, name, _ in ticks if name in names}
    # blocks of a path the modelled case does not run (its mark counts 0 passes, or its selected value is 0)
    not_run = {cfg.block_of(at) for at, name, value in ticks if name in never or value == 0}
    skip: set[int] = set(not_run & blocks) if not_run & blocks != blocks else set()
    notes: list[str] = []
    for lp in natural_loops(cfg):
        if lp < blocks:
            skip |= lp
            if not lp & marked_blocks:
                size = sum(cfg.blocks[k][1] - cfg.blocks[k][0] + 1 for k in lp)
                notes.append(f"{fname}: an inner loop of {size} instructions without a marker left out")
    keep = sorted(blocks - skip)
    body = [insns[i] for k in keep for i in range(cfg.blocks[k][0], cfg.blocks[k][1] + 1)]
    calls = [s for s in body if s.split()[0] in CALL_MNEMONICS]
    if calls:  # a library call (memcpy of a cold path): llvm-mca would charge it 100 cycles
        notes.append(f"{fname}: {len(calls)} call(s) left out ({', '.join(sorted(set(calls)))})")
        body = [s for s in body if s.split()[0] not in CALL_MNEMONICS]
    return Instance(fname, blocks, count, body, notes)


# ------------------------------------------------------------------------------------------ llvm-mca
@dataclass(frozen=True)
class McaSummary:
    iterations: int
    instructions: int
    total_cycles: int
    block_rthroughput: float

    @property
    def cycles_per_iteration(self) -> float:
        return self.total_cycles / self.iterations

    @property
    def instructions_per_iteration(self) -> float:
        return self.instructions / self.iterations


def parse_mca_summary(text: str) -> McaSummary:
    """The summary view of llvm-mca's output (the first code region's)."""

    def field_(name: str) -> str:
        m = re.search(rf"^{name}:\s+([\d.]+)", text, re.M)
        if not m:
            raise McaError(f"llvm-mca output has no '{name}:' line")
        return m.group(1)

    return McaSummary(
        int(field_("Iterations")),
        int(field_("Instructions")),
        int(field_("Total Cycles")),
        float(field_("Block RThroughput")),
    )


def find_tool(names: Iterable[str]) -> str | None:
    """The first of `names` on PATH (or under /usr/lib/llvm-19/bin)."""
    for n in names:
        path = shutil.which(n) or shutil.which(n, path="/usr/lib/llvm-19/bin")
        if path:
            return path
    return None


def llvm_mca_path() -> str | None:
    return find_tool(("llvm-mca-19", "llvm-mca"))


def run_mca(mca: str, arch: str, cpu: str, body: list[str]) -> McaSummary:
    """llvm-mca's summary for `body` (instructions, one a line) as a loop on -mcpu=`cpu`."""
    r = subprocess.run(
        [
            mca,
            f"-mtriple={TRIPLES[arch]}",
            f"-mcpu={cpu}",
            f"-iterations={MCA_ITERATIONS}",
            "-resource-pressure=false",
            "-instruction-info=false",
        ],
        input="\n".join(body) + "\n",
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise McaError(f"llvm-mca -mcpu={cpu} failed:\n{r.stderr[-2000:]}")
    return parse_mca_summary(r.stdout)


# ------------------------------------------------------------------------------------------ compiling
def compiler_for(arch: str, x86_cc: str) -> str:
    """The compiler of an architecture (the manifest's mca.compiler): clang 19 for a "clang" one (aarch64: the
    same compiler builds every kernel's copy), `x86_cc` for a "host" one (x86-64: GCC, what built the measured
    harness library and llama.cpp)."""
    clang = KERNELS.arches[arch].mca.compiler == "clang"
    cc = find_tool(("clang-19", "clang")) if clang else find_tool((x86_cc,))
    if cc is None:
        raise McaError(f"no compiler for {arch} ({'clang-19' if clang else x86_cc})")
    return cc


def compile_flags(model: KernelModel, cpu: str) -> list[str]:
    """-O3 -DNDEBUG, -ffp-contract=off for kernel files, --target for a clang-compiled architecture, then the
    manifest's: for upstream its upstream_flags (x86-64: x86-64-v4, TQ2_0's AVX2 vec_dot in an AVX-512 build,
    what GGML_NATIVE makes on these cores), for a kernel the architecture's defines (x86-64: BITCOS_FMA=1, as
    the measured library) and its target flags; where the architecture is tuned for each CPU (aarch64), a
    native build of `cpu` (-mcpu) when there are no target flags, else -mtune=`cpu` beside them."""
    mca = KERNELS.arches[model.arch].mca
    out = ["-O3", "-DNDEBUG"] + ([] if model.upstream else ["-ffp-contract=off"])
    if mca.compiler == "clang":
        out = [f"--target={mca.triple}", *out]
    flags = [*mca.upstream_flags, *model.flags] if model.upstream else [*mca.defines, *model.flags]
    if mca.tune_for_cpu:
        flags.append(f"-mtune={cpu}" if flags else f"-mcpu={cpu}")
    return [*out, *flags]


def stage_upstream(dest: Path) -> Path:
    """The pinned upstream ggml sources (headers and the arch quants.c files) extracted into dest; returns
    the ggml folder. Fetched by ggml_bitcos.upstream, never stored in this repository."""
    from ggml_bitcos import upstream

    prefix = f"{upstream.SDIST_TOPDIR}/{UPSTREAM_GGML}"
    wanted = tuple(UPSTREAM_QUANTS.values())
    with tarfile.open(upstream.fetch_sdist(), "r:gz") as tf:
        members = [
            m
            for m in tf.getmembers()
            if m.isfile() and m.name.startswith(prefix) and (m.name.endswith(".h") or m.name[len(prefix) :] in wanted)
        ]
        tf.extractall(dest, members=members, filter="data")
    return dest / prefix


def staged_source(model: KernelModel, nc: int, csrc: Path, ggml: Path | None, work: Path) -> tuple[Path, list[str]]:
    """A marked copy of the model's source for nc columns (its headers copied beside it, with the model's
    substitutions); returns the file and its include flags."""
    folder = work / f"{model.arch}-{model.name}-nc{nc}"
    folder.mkdir(parents=True, exist_ok=True)
    subs = model.substitutions(nc)

    def edit(text: str) -> str:
        for pattern, repl in subs:
            text = re.sub(pattern, repl, text)
        return text

    if model.upstream:
        assert ggml is not None
        src = ggml / model.source
        out = folder / Path(model.source).name
        includes = [f"-I{ggml / 'include'}", f"-I{ggml / 'src'}", f"-I{ggml / 'src' / 'ggml-cpu'}", f"-I{src.parent}"]
    else:
        src = csrc / model.source
        out = folder / model.source
        for h in csrc.glob("*.h"):
            (folder / h.name).write_text(edit(h.read_text()))
        includes = [f"-I{folder}"]
    if not src.is_file():
        raise McaError(f"{src}: not found")
    out.write_text(insert_marks(edit(src.read_text()), model.marks(nc), model.arch))
    return out, includes


def compile_asm(cc: str, src: Path, flags: list[str], includes: list[str]) -> str:
    out = src.with_suffix(".s")
    r = subprocess.run([cc, *flags, *includes, "-S", str(src), "-o", str(out)], capture_output=True, text=True)
    if r.returncode != 0:
        raise McaError(f"{Path(cc).name} {' '.join(flags)} {src.name} failed:\n{r.stderr[-3000:]}")
    return out.read_text()


def compiler_version(cc: str) -> str:
    r = subprocess.run([cc, "--version"], capture_output=True, text=True)
    return r.stdout.splitlines()[0] if r.returncode == 0 and r.stdout else Path(cc).name


# ------------------------------------------------------------------------------------------ the model
@dataclass
class Prediction:
    """One kernel on one CPU at nc columns: cycles and instructions per 32 weights of the matrix (all columns
    together) and per column, with the loop instances they come from."""

    arch: str
    cpu: str
    kernel: str
    nc: int
    cycles_per_32: float
    instructions_per_32: float
    loops: list[dict]

    @property
    def cycles_per_32_per_column(self) -> float:
        return self.cycles_per_32 / self.nc


def predict(model: KernelModel, cpu: str, nc: int, asm: str, mca: str, defines: dict[str, int]) -> Prediction:
    """Adds the model's loop instances (each once, however many marks resolve to it), each llvm-mca cycles
    per pass times its passes per row and 256 weights, to cycles and instructions per 32 weights."""
    funcs = parse_functions(asm, COMMENT[model.arch])
    marks = model.marks(nc)
    seen: dict[tuple[str, frozenset[int]], dict] = {}
    never = [m.name for m in marks if m.per_block(nc, defines) == 0]
    for mark in marks:
        if mark.name in never:
            continue
        inst = find_instance(funcs, mark, [m.name for m in marks], never)
        passes = mark.per_block(nc, defines) / inst.ticks
        key = (inst.function, inst.blocks)
        if key in seen:
            if abs(seen[key]["passes_per_block"] - passes) > 1e-9:
                raise McaError(
                    f"{model.name}: marks {seen[key]['marks']} and {mark.name} share a loop but count "
                    f"{seen[key]['passes_per_block']} and {passes} passes per block"
                )
            seen[key]["marks"].append(mark.name)
            continue
        s = run_mca(mca, model.arch, cpu, inst.body)
        seen[key] = {
            "marks": [mark.name],
            "function": inst.function,
            "instructions": len(inst.body),
            "markers": inst.ticks,
            "passes_per_block": passes,
            "cycles_per_pass": s.cycles_per_iteration,
            "block_rthroughput": s.block_rthroughput,
            "notes": inst.notes,
        }
    loops = list(seen.values())
    per_block_cycles = sum(lp["cycles_per_pass"] * lp["passes_per_block"] for lp in loops)
    per_block_insns = sum(lp["instructions"] * lp["passes_per_block"] for lp in loops)
    scale = 32 / BLOCK
    return Prediction(model.arch, cpu, model.name, nc, per_block_cycles * scale, per_block_insns * scale, loops)


def run_models(
    arches: list[str],
    cpus: dict[str, list[str]],
    ncs: list[int],
    csrc: Path = CSRC,
    x86_cc: str = "gcc",
    log: Callable[[str], None] = lambda s: None,
) -> tuple[list[Prediction], dict[str, str]]:
    """Every model of `arches` whose source exists, on each CPU and column count; returns the predictions
    and the compilers used (per architecture)."""
    mca = llvm_mca_path()
    if mca is None:
        raise McaError("llvm-mca not found (Debian: apt-get install llvm-19)")
    out: list[Prediction] = []
    compilers: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bitcos-mca-") as td:
        work = Path(td)
        ggml = stage_upstream(work / "upstream")
        for arch in arches:
            cc = compiler_for(arch, x86_cc)
            compilers[arch] = compiler_version(cc)
            for model in (m for m in MODELS if m.arch == arch):
                src_path = (ggml / model.source) if model.upstream else (csrc / model.source)
                if not src_path.is_file():
                    log(f"# {model.name}: {src_path} not found, skipped")
                    continue
                defines = int_defines(src_path.read_text())
                asm_cache: dict[tuple, str] = {}
                for nc in ncs:
                    staged, includes = staged_source(model, nc, csrc, ggml, work)
                    for cpu in cpus[arch]:
                        flags = compile_flags(model, cpu)
                        key = (nc, tuple(flags))
                        if key not in asm_cache:
                            asm_cache[key] = compile_asm(cc, staged, flags, includes)
                        out.append(predict(model, cpu, nc, asm_cache[key], mca, defines))
    return out, compilers


# ------------------------------------------------------------------------------------------ measuring
# A dependent chain of 3-cycle multiplies (imul r64, imm: 3 cycles of latency on every x86-64 core of the last
# fifteen years), timed with rdtsc: TSC ticks per core cycle, the minimum over short runs (a run the VM or
# another process interrupts is slower, never faster). An add-immediate chain would not do: newer Intel cores
# fold dependent immediate adds in the renamer.
CLOCK_PROBE_C: Final = r"""
#include <stdio.h>
#include <x86intrin.h>
int main(void) {
    double best = 1e9;
    for (int rep = 0; rep < 2000; ++rep) {
        long x = 1, n = 200;
        unsigned long long t0 = __rdtsc();
        __asm__ volatile("1:\n.rept 100\nimul $3, %0, %0\n.endr\ndec %1\njnz 1b\n" : "+r"(x), "+r"(n));
        unsigned long long t1 = __rdtsc();
        double r = (double) (t1 - t0) / (200.0 * 100 * 3);
        if (r < best) best = r;
    }
    printf("%.4f\n", best);
    return 0;
}
"""


def tsc_ticks_per_core_cycle(cc: str = "gcc") -> float:
    """TSC ticks per core cycle of this x86-64 machine (CLOCK_PROBE_C compiled and run): below 1 when the core
    runs above the TSC rate (turbo), so measured ticks / this = core cycles, what llvm-mca predicts."""
    with tempfile.TemporaryDirectory(prefix="bitcos-clock-") as td:
        src, exe = Path(td) / "clock.c", Path(td) / "clock"
        src.write_text(CLOCK_PROBE_C)
        r = subprocess.run([cc, "-O2", str(src), "-o", str(exe)], capture_output=True, text=True)
        if r.returncode != 0:
            raise McaError(f"compiling the clock probe failed:\n{r.stderr[-2000:]}")
        return float(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)


@dataclass(frozen=True)
class Measured:
    """This machine's measured cost per 32 weights per column (min over repeats), keyed (kernel, nc), in TSC
    ticks, and the TSC ticks per core cycle that convert them to core cycles."""

    ticks: dict[tuple[str, int], float]
    ticks_per_cycle: float

    def cycles(self, kernel: str, nc: int) -> float | None:
        t = self.ticks.get((kernel, nc))
        return t / self.ticks_per_cycle if t is not None else None


def measure_x86(
    ncs: list[int], rows: int = 64, k: int = 2048, z: float = 0.4, reps: int = 400, cc: str = "gcc"
) -> Measured:
    """This machine's cost per 32 weights per column: `bench kernels` on MATRIX (rows x k, z, min of reps) for
    each BITCOS kernel of the harness library, TQ2_0's vec_dot from llama-bitcos-bench gamma (one column; a
    vec_dot per column, so the same per column at any nc; left out without the patched llama.cpp), and the
    TSC ticks per core cycle."""
    from ggml_bitcos import harness
    from ggml_bitcos.bench.common import run_tool
    from ggml_bitcos.bench.kernels import measure
    from ggml_bitcos.format import Variant

    out: dict[tuple[str, int], float] = {}
    modelled = [m.name for m in MODELS if m.arch == "x86_64" and not m.upstream]
    impls = [i for i in modelled if harness.available(i, True)]
    for t in measure(impls, Variant.MATRIX, rows, k, ncs, [z], reps):
        out[(t.impl, t.nc)] = t.cycles_per_32_min
    try:
        tq = min(run_tool(["gamma", "tq2_0", str(k), str(rows), "2000"])[0]["cycles_per_32"] for _ in range(3))
        for nc in ncs:
            out[(TQ2, nc)] = tq
    except Exception:  # no patched llama.cpp installed: BITCOS kernels only
        pass
    return Measured(out, tsc_ticks_per_core_cycle(cc))


# ------------------------------------------------------------------------------------------ output
def ratio_to_tq2(preds: list[Prediction], p: Prediction, ref_name: str = TQ2) -> float | None:
    """p's cycles / those of the TQ2_0 model `ref_name` on the same CPU and columns (None: not modelled)."""
    ref = next(
        (q for q in preds if q.kernel == ref_name and q.arch == p.arch and q.cpu == p.cpu and q.nc == p.nc), None
    )
    return p.cycles_per_32 / ref.cycles_per_32 if ref is not None and ref.cycles_per_32 > 0 else None


def same_flags_reference(p: Prediction) -> str:
    """The TQ2_0 model built with p's target flags ("tq2_0@neon" for neon and neon/2bit)."""
    return f"{TQ2}@{p.kernel.removesuffix(CODES_SUFFIX)}"


def ratio_to_tq2_same_flags(preds: list[Prediction], p: Prediction) -> float | None:
    """p / TQ2_0 built with p's target flags, where such a model exists (a kernel whose flags lack what the
    native build has, e.g. neon without dotprod); None elsewhere."""
    return None if p.kernel.startswith(TQ2) else ratio_to_tq2(preds, p, same_flags_reference(p))


def format_table(preds: list[Prediction], arch: str, measured: Measured | None = None) -> str:
    """One line per (CPU, nc, kernel): predicted cycles per 32 weights (all columns, per column), static
    instructions per 32 weights, the ratio to TQ2_0 at the same nc; with `measured`, this machine's measured
    TSC ticks and core cycles per 32 weights per column and predicted / measured (cycles)."""
    same = any(p.arch == arch and p.kernel.startswith(TQ2 + "@") for p in preds)
    head = f"{'cpu':<15} {'nc':>3} {'kernel':<17} {'cyc/32w':>8} {'per col':>8} {'insn/32w':>9} {'vs TQ2_0':>9}"
    if same:
        head += f" {'same flags':>10}"
    if measured is not None:
        head += f" {'ticks':>7} {'meas.cyc':>8} {'pred/meas':>9}"
    lines = [head, "-" * len(head)]
    rows = [p for p in preds if p.arch == arch]
    for cpu in dict.fromkeys(p.cpu for p in rows):
        for nc in sorted({p.nc for p in rows}):
            for p in (q for q in rows if q.cpu == cpu and q.nc == nc):
                r = ratio_to_tq2(preds, p)
                line = (
                    f"{cpu:<15} {nc:>3} {p.kernel:<17} {p.cycles_per_32:8.2f} {p.cycles_per_32_per_column:8.2f} "
                    f"{p.instructions_per_32:9.1f} {('%.2fx' % r) if r is not None else '-':>9}"
                )
                if same:
                    rs = ratio_to_tq2_same_flags(preds, p)
                    line += f" {('%.2fx' % rs) if rs is not None else '-':>10}"
                if measured is not None:
                    m = measured.cycles(p.kernel, nc)
                    line += (
                        f" {measured.ticks[(p.kernel, nc)]:7.2f} {m:8.2f} {p.cycles_per_32_per_column / m:8.2f}x"
                        if m
                        else f" {'-':>7} {'-':>8} {'-':>9}"
                    )
                lines.append(line)
    return "\n".join(lines)


def format_loops(preds: list[Prediction], arch: str) -> str:
    """The loops behind each prediction of `arch`: where they are, their size and their llvm-mca cycles."""
    lines = [
        f"\n{'cpu':<15} {'nc':>3} {'kernel':<17} {'function':<36} {'marks':<28} {'insns':>5} {'passes':>6} "
        f"{'cyc/pass':>8} {'bound':>6}"
    ]
    for p in (q for q in preds if q.arch == arch):
        for lp in p.loops:
            lines.append(
                f"{p.cpu:<15} {p.nc:>3} {p.kernel:<17} {lp['function'][:36]:<36} {','.join(lp['marks'])[:28]:<28} "
                f"{lp['instructions']:>5} {lp['passes_per_block']:>6.3g} {lp['cycles_per_pass']:>8.2f} "
                f"{lp['block_rthroughput']:>6.1f}"
            )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--arch",
        default=",".join(KERNELS.arches),
        help=f"comma list of architectures: {', '.join(KERNELS.arches)} (default all)",
    )
    p.add_argument(
        "--cpus",
        default=None,
        help="comma list of llvm-mca -mcpu names (default: "
        + "; ".join(f"{a}: {','.join(c)}" for a, c in CPUS.items())
        + "); each goes to the architecture whose llvm-mca knows it (apple-m1: apple-a14)",
    )
    p.add_argument("--nc", type=parse_ints, default=[1, 4], help="activation columns, comma list (default 1,4)")
    p.add_argument("--x86-cc", default="gcc", help="compiler of the x86-64 kernels (default gcc, as the harness)")
    p.add_argument("--csrc", type=Path, default=CSRC, help="the kernel sources (default this checkout's csrc/)")
    p.add_argument(
        "--measure",
        action="store_true",
        help="x86-64 host: also time the harness kernels (MATRIX 64 x 2048, z 0.4, min of 400) and TQ2_0 "
        "(llama-bitcos-bench gamma) and print predicted / measured",
    )
    p.add_argument("--json", action="store_true", help="print JSON records instead of the tables")
    p.add_argument(
        "--loops",
        action="store_true",
        help="after each table, the loops of every prediction: compiled function, marks, instructions, "
        "passes per 256 weights, llvm-mca cycles per pass and its resource bound (Block RThroughput)",
    )


# Names a reader may use for a core LLVM 19 knows by another name.
CPU_ALIASES: Final = {"apple-m1": "apple-a14"}


def known_cpus(mca: str, arch: str) -> set[str]:
    """The -mcpu names llvm-mca knows for an architecture (from its -mcpu=help)."""
    r = subprocess.run([mca, f"-mtriple={TRIPLES[arch]}", "-mcpu=help"], capture_output=True, text=True)
    return set(re.findall(r"^\s+([\w.-]+)\s+- Select the", r.stdout + r.stderr, re.M))


def cpus_for(wanted: str | None, arches: list[str], mca: str) -> dict[str, list[str]]:
    """The CPUs of each architecture: the defaults (CPUS), or the comma list `wanted` split by the
    architecture whose llvm-mca knows each name (aliases such as apple-m1 resolved); McaError for a name no
    architecture knows."""
    if wanted is None:
        return {a: list(CPUS[a]) for a in arches}
    names = [CPU_ALIASES.get(c.strip(), c.strip()) for c in wanted.split(",") if c.strip()]
    known = {a: known_cpus(mca, a) for a in arches}
    unknown = [c for c in names if not any(c in known[a] for a in arches)]
    if unknown:
        raise McaError(f"llvm-mca knows no CPU {', '.join(unknown)} for {', '.join(arches)}")
    return {a: [c for c in dict.fromkeys(names) if c in known[a]] for a in arches}


def run(args: argparse.Namespace) -> int:
    arches = [a.strip() for a in args.arch.split(",") if a.strip()]
    bad = [a for a in arches if a not in CPUS]
    if bad or not args.nc or min(args.nc) < 1:
        print(f"error: --arch must be a list of {', '.join(CPUS)} and --nc positive", file=sys.stderr)
        return 2
    try:
        if llvm_mca_path() is None:
            raise McaError("llvm-mca not found (Debian: apt-get install llvm-19)")
        if not (args.csrc / "bitcos-kernels.h").is_file():
            # an installed package has no csrc/: the kernels are modelled from a checkout's sources
            raise McaError(f"no kernel sources in {args.csrc}: run from a ggml-bitcos checkout or pass --csrc DIR")
        cpus = cpus_for(args.cpus, arches, llvm_mca_path() or "")
        preds, compilers = run_models(
            arches, cpus, args.nc, args.csrc, args.x86_cc, log=lambda m: print(m, file=sys.stderr)
        )
    except McaError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    measured = None
    if args.measure and "x86_64" in arches and os.uname().machine == "x86_64":
        from ggml_bitcos import harness

        try:
            measured = measure_x86(args.nc, cc=args.x86_cc)
        except harness.KernelLibraryNotFound as e:
            print(f"# --measure: {e}", file=sys.stderr)
    missing = unmodelled_kernels()
    if args.json:
        recs = []
        for p in preds:
            rec = asdict(p)
            rec["cycles_per_32_per_column"] = p.cycles_per_32_per_column
            rec["ratio_to_tq2_0"] = ratio_to_tq2(preds, p)
            rec["ratio_to_tq2_0_same_flags"] = ratio_to_tq2_same_flags(preds, p)
            rec["compiler"] = compilers[p.arch]
            if measured is not None and p.arch == "x86_64":
                rec["measured_ticks_per_32_per_column"] = measured.ticks.get((p.kernel, p.nc))
                rec["measured_cycles_per_32_per_column"] = measured.cycles(p.kernel, p.nc)
                rec["tsc_ticks_per_core_cycle"] = measured.ticks_per_cycle
            recs.append(rec)
        print(json.dumps({"predictions": recs, "not_modelled": missing}, indent=1))
        return 0
    mca = llvm_mca_path() or "llvm-mca"
    ver = subprocess.run([mca, "--version"], capture_output=True, text=True).stdout
    ver_m = re.search(r"LLVM version ([\d.]+)", ver)
    for arch in arches:
        print(
            f"\n{arch}: llvm-mca {ver_m.group(1) if ver_m else '?'} PREDICTIONS (static model, not measured), "
            f"compiler: {compilers.get(arch, '?')}"
        )
        print("cycles per 32 weights of the matrix (all nc columns; 'per col' = / nc), static instructions per")
        print(
            "32 weights, BITCOS / TQ2_0 cycles at the same nc ('same flags': / TQ2_0 built with the kernel's target"
            " flags, tq2_0@NAME, where the native build has more)"
            + (
                "; measured: this machine's core cycles per 32 weights per column (min of `bench kernels`' TSC "
                f"ticks / {measured.ticks_per_cycle:.3f} TSC ticks per core cycle)"
                if measured and arch == "x86_64"
                else ""
            )
        )
        print(format_table(preds, arch, measured if arch == "x86_64" else None))
        if args.loops:
            print(format_loops(preds, arch))
        for cpu in cpus[arch]:
            if cpu in CPU_NOTES:
                print(f"  {cpu}: {CPU_NOTES[cpu]}")
    notes = {n for p in preds for lp in p.loops for n in lp["notes"]}
    for n in sorted(notes):
        print(f"note: {n}")
    if missing:
        print(f"not modelled (no model in dev/mca.py): {', '.join(missing)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m dev.mca",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
