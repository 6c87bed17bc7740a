"""`python3 -m dev.mca` (dev/mca.py, a maintainer's instrument), the static model of the CPU kernels: its parts on made-up C, assembly and llvm-mca outputs (markers
inserted in the right loop, loops found by the control-flow graph, markers of unrolled and inlined copies,
the per-block arithmetic), then a real run on every kernel file with llvm-mca 19 and clang 19 (skipped without
them unless BITCOS_REQUIRE_MCA=1). The predictions are never compared with a speed: only their structure is
checked (every model runs, TQ2_0 pays per column).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dev import mca

X86_ASM = """\
\t.text
\t.globl\tkern
\t.type\tkern, @function
kern:
.LFB0:
\t.cfi_startproc
\tpushq\t%rbx
\txorl\t%eax, %eax
.L3:
#APP
# 12 "k.c" 1
\t# BITCOS-MCA-TICK outer
# 0 "" 2
#NO_APP
\tmovq\t(%rdi,%rax,8), %rdx
.L2:
#APP
\t# BITCOS-MCA-TICK inner
#NO_APP
\taddq\t$1, %rdx
\tcmpq\t%rsi, %rdx
\tjne\t.L2
\taddq\t$1, %rax
\tcmpq\t$8, %rax
\tjne\t.L3
.L5:
\tsubl\t$1, %ecx
\tjne\t.L5
\tpopq\t%rbx
\tret
.L9:
\tud2
\t.cfi_endproc
\t.size\tkern, .-kern
other:
\tret
"""

AARCH64_ASM = """\
kern:                                   // @kern
// %bb.0:
\tmov\tx8, xzr
.LBB0_1:                                // =>This Inner Loop Header: Depth=1
\t//APP
\t// BITCOS-MCA-TICK body
\t//NO_APP
\tldr\tq0, [x0, x8]
\tadd\tx8, x8, #16                     // index
\tcmp\tx8, #256
\tb.ne\t.LBB0_1
\tcbz\tx1, .LBB0_3
.LBB0_3:
\tret
"""


def one(n: int, d: dict[str, int]) -> float:
    return 1.0


def test_parse_functions_x86() -> None:
    funcs = mca.parse_functions(X86_ASM, "#")
    assert set(funcs) == {"kern", "other"}
    insns = mca.instructions(funcs["kern"])
    assert insns[0] == "pushq\t%rbx" and insns[-1] == "ud2" and len(insns) == 14
    assert [(name, value) for _, name, value in mca.tick_positions(funcs["kern"])] == [("outer", None), ("inner", None)]
    cfg = mca.build_cfg(funcs["kern"])
    loops = sorted(mca.natural_loops(cfg), key=len)
    # the inner loop, the unmarked one after it, the outer loop holding the inner
    assert [len(lp) for lp in loops] == [1, 1, 3]


def test_instances_x86() -> None:
    funcs = mca.parse_functions(X86_ASM, "#")
    names = ["outer", "inner"]
    inner = mca.find_instance(funcs, mca.Mark("inner", "f", "", one), names)
    assert inner.function == "kern" and inner.ticks == 1
    assert inner.body == ["addq\t$1, %rdx", "cmpq\t%rsi, %rdx", "jne\t.L2"]
    # the outer loop without the nested marked loop; the unmarked loop after it is no part of it
    outer = mca.find_instance(funcs, mca.Mark("outer", "f", "", one), names)
    assert outer.body == ["movq\t(%rdi,%rax,8), %rdx", "addq\t$1, %rax", "cmpq\t$8, %rax", "jne\t.L3"]
    assert outer.notes == []
    with pytest.raises(mca.McaError, match="no marker"):
        mca.find_instance(funcs, mca.Mark("missing", "f", "", one), names)


def test_parse_functions_aarch64_keeps_immediates() -> None:
    funcs = mca.parse_functions(AARCH64_ASM, "//")
    inst = mca.find_instance(funcs, mca.Mark("body", "f", "", one), ["body"])
    assert inst.body == ["ldr\tq0, [x0, x8]", "add\tx8, x8, #16", "cmp\tx8, #256", "b.ne\t.LBB0_1"]


def test_unrolled_selected_and_loopless_markers() -> None:
    asm = """\
f:
\tmovl\t$0, %eax
#APP
\t# BITCOS-MCA-TICK pre
#NO_APP
.L2:
\taddl\t$1, %eax
\tcmpl\t$5, %eax
\tjne\t.L2
\tret
g:
\txorl\t%eax, %eax
.L7:
\t# BITCOS-MCA-TICK body 0
\taddl\t$2, %eax
\tjne\t.L7
.L8:
\t# BITCOS-MCA-TICK body 1
\taddl\t$1, %eax
\t# BITCOS-MCA-TICK body 1
\taddl\t$1, %eax
\tjne\t.L8
\tret
"""
    funcs = mca.parse_functions(asm, "#")
    # a marker before a label belongs to the block that falls through into it: no loop around it, so the
    # entry's path to the first return, without the loop (noted)
    pre = mca.find_instance(funcs, mca.Mark("pre", "f", "", one), ["pre"])
    assert pre.body == ["movl\t$0, %eax", "ret"]
    assert len(pre.notes) == 1 and "3 instructions" in pre.notes[0]
    # the instance whose selected value is 1, with its two unrolled copies
    body = mca.find_instance(funcs, mca.Mark("body", "g", "", one), ["body"])
    assert body.ticks == 2 and body.body == ["addl\t$1, %eax", "addl\t$1, %eax", "jne\t.L8"]


TILES_ASM = """\
kern:
	mov	x8, xzr
.LBB0_1:
	// BITCOS-MCA-TICK codes-gemm-block 2
	// BITCOS-MCA-TICK codes-gemv-block 2
	add	x8, x8, #1
	cmp	x8, x1
	b.ne	.LBB0_1
.LBB0_2:
	// BITCOS-MCA-TICK codes-gemm-block 1
	// BITCOS-MCA-TICK codes-gemv-block 1
	add	x9, x9, #1
	add	x10, x10, #1
	cmp	x9, x1
	b.ne	.LBB0_2
.LBB0_3:
	// BITCOS-MCA-TICK codes-gemm-block 0
	// BITCOS-MCA-TICK codes-gemv-block 0
	sub	x11, x11, #1
	cbnz	x11, .LBB0_3
	ret
"""


def test_tagged_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """One block loop inlined as several tiles, its markers' value the tile's tag (the NEON codes kernels: 1 for
    the rows x 1 column GEMV tile, 2 for the 1 row x 4 columns GEMM tile, 0 for another scale kind): each mark
    takes the loop whose tag is its `value`, and the marks of a column count are only those of tiles that run."""
    funcs = mca.parse_functions(TILES_ASM, "//")
    names = ["codes-gemm-block", "codes-gemv-block"]
    gemv = mca.find_instance(funcs, mca.Mark("codes-gemv-block", "f", "", one, "tag", value=1), names)
    gemm = mca.find_instance(funcs, mca.Mark("codes-gemm-block", "f", "", one, "tag", value=2), names)
    assert gemv.body == ["add\tx9, x9, #1", "add\tx10, x10, #1", "cmp\tx9, x1", "b.ne\t.LBB0_2"]
    assert gemm.body == ["add\tx8, x8, #1", "cmp\tx8, x1", "b.ne\t.LBB0_1"]
    assert mca.selected(mca.Mark("m", "f", "", one, "tag"), 2) and not mca.selected(mca.Mark("m", "f", "", one), 0)
    # the model's tile width is the kernel file's
    defines = mca.int_defines((mca.CSRC / mca.KERNELS.kernel("neon").codes_source).read_text())
    assert defines["NEON_CODES_COLS"] == mca.NEON_CODES_COLS and defines["NEON_CODES_GEMV_ROWS"] > 1
    d = {"NEON_CODES_COLS": 4, "NEON_CODES_GEMV_ROWS": 3}
    by_nc = {nc: {m.name: m.per_block(nc, d) for m in mca._neon_codes_marks(nc)} for nc in (1, 3, 4, 5, 8)}
    assert by_nc == {
        1: {"codes-gemv-block": pytest.approx(1 / 3)},
        3: {"codes-gemv-block": 1.0},
        4: {"codes-gemm-block": 1.0},
        5: {"codes-gemm-block": 1.0, "codes-gemv-block": pytest.approx(1 / 3)},
        8: {"codes-gemm-block": 2.0},
    }
    # nc = 5: the GEMM tile's loop once and the GEMV tile's a third of a time per row and block
    monkeypatch.setattr(
        mca, "run_mca", lambda tool, arch, cpu, body: mca.McaSummary(100, 100 * len(body), 100 * len(body), 1.0)
    )
    model = mca.KernelModel("k", "aarch64", "k.c", False, mca._neon_codes_marks)
    p = mca.predict(model, "neoverse-v2", 5, TILES_ASM, "llvm-mca", d)
    assert p.cycles_per_32 == pytest.approx((3 * 1 + 4 / 3) / 8)


C_SOURCE = """\
static void f(int n, int * a);
static void f(int n, int * a) {
    for (int i = 0; i < n; ++i) {
        a[i] = 0;
    }
    for (int j = 0; j < n; ++j) { a[j] += 1; }
}
void g(int * a) { f(1, a); }
"""


def test_insert_marks() -> None:
    marks = (
        mca.Mark("second", "f", r"for \(int j", one),
        mca.Mark("first", "f", r"\{\s*(?P<loop>for \(int i)", one, select="n > 0"),
    )
    out = mca.insert_marks(C_SOURCE, marks, "aarch64")
    assert 'for (int j = 0; j < n; ++j) { __asm__ volatile("// BITCOS-MCA-TICK second"); a[j] += 1; }' in out
    assert 'for (int i = 0; i < n; ++i) { __asm__ volatile("// BITCOS-MCA-TICK first %c0" ::"i"((int) (n > 0)));' in out
    assert out.count("BITCOS-MCA-TICK") == 2
    with pytest.raises(mca.McaError, match="no loop"):
        mca.insert_marks(C_SOURCE, (mca.Mark("x", "f", r"for \(int k", one),), "x86_64")
    with pytest.raises(mca.McaError, match="no definition"):
        mca.insert_marks(C_SOURCE, (mca.Mark("x", "h", r"for", one),), "x86_64")


def test_substitutions_and_defines() -> None:
    text = "#define X86_TILE_COLS        8  // columns\n    const int  halves = (2 * b + 1 < nu) ? 2 : 1;\n"
    for pattern, repl in mca._x86_shape(4):
        text = __import__("re").sub(pattern, repl, text)
    assert "const int  halves = 2;" in text and mca.int_defines(text) == {"X86_TILE_COLS": 4}


MCA_OUTPUT = """\
Iterations:        200
Instructions:      4600
Total Cycles:      1213
Total uOps:        5000

Dispatch Width:    6
uOps Per Cycle:    4.12
IPC:               3.79
Block RThroughput: 5.8
"""


def test_parse_mca_summary() -> None:
    s = mca.parse_mca_summary(MCA_OUTPUT)
    assert (s.iterations, s.instructions, s.total_cycles, s.block_rthroughput) == (200, 4600, 1213, 5.8)
    assert s.cycles_per_iteration == pytest.approx(6.065) and s.instructions_per_iteration == 23
    with pytest.raises(mca.McaError, match="Total Cycles"):
        mca.parse_mca_summary(MCA_OUTPUT.replace("Total Cycles", "Cycles"))


def test_predict_adds_loops_per_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cycles per 32 weights = sum over loop instances of cycles per pass x passes per 256 weights / 8;
    marks that resolve to one loop count it once, and must agree on its passes."""
    monkeypatch.setattr(
        mca, "run_mca", lambda tool, arch, cpu, body: mca.McaSummary(100, 100 * len(body), 200 * len(body), 1.0)
    )
    marks = (
        mca.Mark("outer", "f", "", one),
        mca.Mark("inner", "f", "", lambda n, d: 4.0 * n),
        mca.Mark("inner-again", "f", "", lambda n, d: 4.0 * n),
    )
    model = mca.KernelModel("k", "x86_64", "k.c", False, lambda nc: marks)
    assert model.flags == ()  # not a kernel of the manifest
    asm = X86_ASM.replace("# BITCOS-MCA-TICK inner", "# BITCOS-MCA-TICK inner\n\t# BITCOS-MCA-TICK inner-again")
    p = mca.predict(model, "znver4", 2, asm, "llvm-mca", {})
    # outer: 4 instructions at 2 cycles, once; inner: 3 at 2 cycles, 8 times per block
    assert p.cycles_per_32 == pytest.approx((4 * 2 * 1 + 3 * 2 * 8) / 8)
    assert p.instructions_per_32 == pytest.approx((4 + 3 * 8) / 8)
    assert [lp["marks"] for lp in p.loops] == [["outer"], ["inner", "inner-again"]]
    assert p.cycles_per_32_per_column == pytest.approx(p.cycles_per_32 / 2)
    bad = marks[:2] + (mca.Mark("inner-again", "f", "", one),)
    with pytest.raises(mca.McaError, match="share a loop"):
        mca.predict(mca.KernelModel("k", "x86_64", "k.c", False, lambda nc: bad), "znver4", 2, asm, "llvm-mca", {})


def test_every_kernel_has_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel of the manifest (csrc/bitcos-kernels.json) on every architecture it is built for, and its
    codes-form kernel (NAME/2bit, as `bench kernels` names it), needs its model in dev/mca.py (its hot loops'
    marks), those of NOT_MODELLED excepted; the models' sources and flags are the manifest's."""
    from ggml_bitcos.bench.kernels import CODES_SUFFIX

    assert mca.CODES_SUFFIX == CODES_SUFFIX
    assert mca.unmodelled_kernels() == []
    for m in mca.MODELS:
        if m.upstream:
            continue
        k = mca.KERNELS.kernel(m.name.removesuffix(mca.CODES_SUFFIX))
        assert m.source == (k.codes_source if m.name.endswith(mca.CODES_SUFFIX) else k.source), m.name
        assert m.flags == k.flags, m.name
    # the aarch64 codes kernels are modelled; without their models they are reported
    assert {(m.arch, m.name) for m in mca.MODELS} >= {("aarch64", "neon/2bit"), ("aarch64", "neon-dotprod/2bit")}
    monkeypatch.setattr(mca, "MODELS", tuple(m for m in mca.MODELS if not m.name.endswith(mca.CODES_SUFFIX)))
    assert mca.unmodelled_kernels() == ["aarch64/neon/2bit", "aarch64/neon-dotprod/2bit"]


def test_compile_flags_from_the_manifest() -> None:
    """How each architecture's models are compiled comes from the manifest: aarch64 with clang for the triple,
    a native build per CPU or the kernel's flags tuned for it; x86-64 as the harness library builds it."""
    by = {(m.arch, m.name): m for m in mca.MODELS}
    assert mca.compile_flags(by[("aarch64", "portable")], "neoverse-v2") == [
        "--target=aarch64-linux-gnu",
        "-O3",
        "-DNDEBUG",
        "-ffp-contract=off",
        "-mcpu=neoverse-v2",
    ]
    assert mca.compile_flags(by[("aarch64", "neon-dotprod")], "apple-a14")[-2:] == [
        "-march=armv8.2-a+dotprod",
        "-mtune=apple-a14",
    ]
    assert mca.compile_flags(by[("aarch64", "tq2_0")], "cortex-a76")[-1] == "-mcpu=cortex-a76"
    # a codes kernel: its table entry's flags; TQ2_0 built like the Armv8.0 kernel: that kernel's, tuned
    assert mca.compile_flags(by[("aarch64", "neon/2bit")], "neoverse-v2")[-2:] == [
        "-march=armv8-a",
        "-mtune=neoverse-v2",
    ]
    assert mca.compile_flags(by[("aarch64", "tq2_0@neon")], "apple-a14") == [
        "--target=aarch64-linux-gnu",
        "-O3",
        "-DNDEBUG",
        "-march=armv8-a",
        "-mtune=apple-a14",
    ]
    avx2 = mca.compile_flags(by[("x86_64", "avx2")], "znver4")
    assert avx2 == ["-O3", "-DNDEBUG", "-ffp-contract=off", "-DBITCOS_FMA=1", *mca.KERNELS.kernel("avx2").flags]
    assert mca.compile_flags(by[("x86_64", "tq2_0")], "znver4") == ["-O3", "-DNDEBUG", "-march=x86-64-v4"]


def test_bench_mca_real(llvm_mca: str) -> None:
    """The real kernels through the real toolchain, one CPU per architecture, 1 and 4 columns: every model
    whose source exists gives a prediction, TQ2_0's vec_dot (native and built like the Armv8.0 kernel) runs once
    per column, and every BITCOS kernel, the codes kernels too, decodes a block once for all columns (its cycles
    per column fall from 1 to 4 columns)."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "dev.mca",
            "--cpus",
            "neoverse-v2,znver4",
            "--nc",
            "1,4",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=mca.kernel_manifest.ROOT,  # `python3 -m dev.mca` runs from a checkout
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    out = json.loads(r.stdout)
    assert out["not_modelled"] == []
    preds = {(p["cpu"], p["kernel"], p["nc"]): p for p in out["predictions"]}
    expected = {
        (cpu, m.name, nc)
        for m in mca.MODELS
        for cpu in (("neoverse-v2",) if m.arch == "aarch64" else ("znver4",))
        for nc in (1, 4)
        if m.upstream or (mca.CSRC / m.source).is_file()
    }
    assert set(preds) == expected
    for p in out["predictions"]:
        assert p["cycles_per_32"] > 0 and p["instructions_per_32"] > 0, p
        assert all(lp["instructions"] > 0 and lp["passes_per_block"] > 0 for lp in p["loops"]), p
    upstream = {m.name for m in mca.MODELS if m.upstream}
    for cpu, kernel, _ in expected:
        one_col, four = preds[(cpu, kernel, 1)], preds[(cpu, kernel, 4)]
        if kernel in upstream:  # a vec_dot per column, every loop of it modelled
            assert four["cycles_per_32"] == pytest.approx(4 * one_col["cycles_per_32"])
            assert all(lp["notes"] == [] for lp in one_col["loops"]), one_col
            if kernel == "tq2_0":
                assert four["ratio_to_tq2_0"] == pytest.approx(1.0)
        else:
            assert four["cycles_per_32_per_column"] < one_col["cycles_per_32_per_column"], (four, one_col)
        # against TQ2_0 built with the same flags where the native build has more (dotprod): the Armv8.0 kernels
        same = kernel in ("neon", "neon/2bit")
        assert (one_col["ratio_to_tq2_0_same_flags"] is not None) == same, one_col
    # the codes kernels: the GEMV tile at 1 column, the GEMM tile at 4, each one loop with no part left out
    for kernel in ("neon/2bit", "neon-dotprod/2bit"):
        for nc, mark in ((1, "codes-gemv-block"), (4, "codes-gemm-block")):
            (lp,) = preds[("neoverse-v2", kernel, nc)]["loops"]
            assert lp["marks"] == [mark] and lp["notes"] == [], lp


def test_cpus_by_architecture(llvm_mca: str) -> None:
    """--cpus goes to the architecture whose llvm-mca knows each name; apple-m1 is LLVM 19's apple-a14."""
    got = mca.cpus_for("apple-m1,znver4,neoverse-v2", ["aarch64", "x86_64"], llvm_mca)
    assert got == {"aarch64": ["apple-a14", "neoverse-v2"], "x86_64": ["znver4"]}
    assert mca.cpus_for(None, ["x86_64"], llvm_mca) == {"x86_64": list(mca.CPUS["x86_64"])}
    with pytest.raises(mca.McaError, match="no CPU foo"):
        mca.cpus_for("foo", ["aarch64"], llvm_mca)
