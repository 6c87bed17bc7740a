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


def test_every_kernel_has_a_model() -> None:
    """Every kernel of the manifest (csrc/bitcos-kernels.json) on every architecture it is built for needs its
    model in dev/mca.py (its hot loops' marks), the reference excepted; the models' flags are the manifest's."""
    assert mca.unmodelled_kernels() == []
    for m in mca.MODELS:
        if not m.upstream:
            assert m.source == mca.KERNELS.kernel(m.name).source and m.flags == mca.KERNELS.kernel(m.name).flags


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
    avx2 = mca.compile_flags(by[("x86_64", "avx2")], "znver4")
    assert avx2 == ["-O3", "-DNDEBUG", "-ffp-contract=off", "-DBITCOS_FMA=1", *mca.KERNELS.kernel("avx2").flags]
    assert mca.compile_flags(by[("x86_64", "tq2_0")], "znver4") == ["-O3", "-DNDEBUG", "-march=x86-64-v4"]


def test_bench_mca_real(llvm_mca: str) -> None:
    """The real kernels through the real toolchain, one CPU per architecture, 1 and 4 columns: every model
    whose source exists gives a prediction, TQ2_0's vec_dot runs once per column, and every BITCOS kernel
    decodes a block once for all columns (its cycles per column fall from 1 to 4 columns)."""
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
    for cpu, kernel, _ in expected:
        one_col, four = preds[(cpu, kernel, 1)], preds[(cpu, kernel, 4)]
        if kernel == "tq2_0":
            assert four["cycles_per_32"] == pytest.approx(4 * one_col["cycles_per_32"])
            assert four["ratio_to_tq2_0"] == pytest.approx(1.0)
        else:
            assert four["cycles_per_32_per_column"] < one_col["cycles_per_32_per_column"], (four, one_col)


def test_cpus_by_architecture(llvm_mca: str) -> None:
    """--cpus goes to the architecture whose llvm-mca knows each name; apple-m1 is LLVM 19's apple-a14."""
    got = mca.cpus_for("apple-m1,znver4,neoverse-v2", ["aarch64", "x86_64"], llvm_mca)
    assert got == {"aarch64": ["apple-a14", "neoverse-v2"], "x86_64": ["znver4"]}
    assert mca.cpus_for(None, ["x86_64"], llvm_mca) == {"x86_64": list(mca.CPUS["x86_64"])}
    with pytest.raises(mca.McaError, match="no CPU foo"):
        mca.cpus_for("foo", ["aarch64"], llvm_mca)
