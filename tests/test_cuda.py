"""BITCOS on CUDA (csrc/cuda/): the translation units compile with the nvcc this machine has, for sm_80 and
sm_90 (CI: no GPU, so compile only; not the whole ggml-cuda, whose headers need cuBLAS), and, where a CUDA
device exists (a lent GPU machine: dev/gpu_session.sh), the kernel runs against the numpy reference.

nvcc: $NVCC, else `nvcc` on PATH, else /usr/local/cuda/bin/nvcc. Skipped without it unless
BITCOS_REQUIRE_CUDA_COMPILE=1 (CI sets it where nvcc exists). BITCOS_CUDA_TEST_EXE: a test program built
elsewhere (dev/gpu_session.sh builds it here, so that the GPU machine's minutes go to running it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import gpu_cases
from dev import cuda_sass_count
from ggml_bitcos.format import Variant

ROOT = Path(__file__).resolve().parent.parent
ARCHS = ("sm_80", "sm_90")


def nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).exists():
            return cand
    return None


@pytest.fixture(scope="module")
def nvcc_path() -> str:
    exe = nvcc()
    if exe is None:
        if os.environ.get("BITCOS_REQUIRE_CUDA_COMPILE") == "1":
            pytest.fail("nvcc not found")
        pytest.skip("nvcc not found")
    return exe


@pytest.fixture(scope="module")
def ggml_include(tmp_path_factory) -> Path:
    """ggml/include of the pinned sdist with the project's patches and headers (ggml.h with the BITCOS ids)."""
    from ggml_bitcos import build, upstream

    tree = upstream.extract_sdist(tmp_path_factory.mktemp("cuda-tree") / "src")
    build.copy_csrc(tree)
    build.apply_patches(tree)
    return tree / "vendor" / "llama.cpp" / "ggml" / "include"


def compile_cuda(
    nvcc_exe: str, source: Path, out: Path, arch: str, include: list[Path], link: bool, extra: tuple[str, ...] = ()
) -> None:
    cmd = [
        nvcc_exe,
        "-std=c++17",
        "-O2",
        f"-arch={arch}",
        "-Werror",
        "all-warnings",
        "-Xcompiler",
        "-Wall,-Wextra",
        *extra,
        *(f"-I{p}" for p in include),
        str(source),
        "-o",
        str(out),
    ]
    if not link:
        cmd.insert(1, "-c")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_translation_units_compile(nvcc_path, ggml_include, tmp_path, arch):
    """The ggml-cuda glue (its kernels instantiated, device code through ptxas) and the standalone test
    program compile warning-free for each architecture; the glue's object holds the entry points the hooks
    call (their temporaries' sizes included) and the mat-vec (every column count, both table layouts),
    MUL_MAT_ID, activation-quantization and batched tensor-core kernels."""
    inc = [ggml_include, ROOT / "csrc", ROOT / "csrc" / "cuda"]
    obj = tmp_path / f"ggml-bitcos-cuda-{arch}.o"
    # the glue with ggml-cuda's own CUDA_FLAGS (its CMakeLists.txt: -use_fast_math -extended-lambda) and the host
    # warnings ggml adds for its C++ (-Wmissing-declarations caught the whole build's only warnings in the glue)
    compile_cuda(
        nvcc_path,
        ROOT / "csrc" / "cuda" / "ggml-bitcos-cuda.cu",
        obj,
        arch,
        inc,
        link=False,
        extra=(
            "-use_fast_math",
            "-extended-lambda",
            "-Xcompiler",
            "-Wmissing-declarations,-Wmissing-noreturn,-Wcast-qual,-Wextra-semi",
        ),
    )
    syms = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True).stdout
    for name in (
        "ggml_cuda_bitcos_supports_op",
        "ggml_cuda_bitcos_mul_mat(",
        "ggml_cuda_bitcos_mul_mat_id(",
        "ggml_cuda_bitcos_mul_mat_tmp_bytes(",
        "ggml_cuda_bitcos_mul_mat_id_tmp_bytes(",
        "bitcos_cuda_mul_mat_vec_kernel<1, 32, 8>",
        "bitcos_cuda_mul_mat_vec_kernel<8, 8, 8>",
        "bitcos_cuda_mul_mat_vec_id_kernel<32, 8>",
        "bitcos_cuda_mul_mat_vec_id_kernel<8, 8>",
        "bitcos_cuda_quantize_q8_kernel",
        "bitcos_cuda_mul_mat_mmq_kernel",
    ):
        assert name in syms, name
    compile_cuda(
        nvcc_path,
        ROOT / "tests" / "cuda" / "test-bitcos-cuda.cu",
        tmp_path / f"test-{arch}",
        arch,
        [ROOT / "csrc", ROOT / "csrc" / "cuda"],
        link=True,
    )


def cuda_device_present() -> bool:
    smi = shutil.which("nvidia-smi")
    return smi is not None and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def nvcc_or_prebuilt() -> str | None:
    if os.environ.get("BITCOS_CUDA_TEST_EXE"):
        return None
    exe = nvcc()
    if exe is None:
        pytest.skip("nvcc not found and no BITCOS_CUDA_TEST_EXE")
    return exe


# The batched path's cases (besides the SYCL test's, which it also runs): 1 / 8 / 9 / 33 / 64 / 65 columns (a
# second 64-column tile), odd row counts and rows past a 32-row tile, K of each variant including MATRIX / ROW
# rows ending in a partial 128-weight unit (32, 96, 576).
BATCHED_K = {
    Variant.G128: (128, 384, 2048),
    Variant.PT: (128, 384, 2048),
    Variant.B128: (128, 640, 2048),
    Variant.B256: (256, 768, 1536),
    Variant.MATRIX: (32, 96, 576, 2048),
    Variant.ROW: (32, 96, 576, 2048),
}
BATCHED_SHAPES = ((37, 33), (19, 64), (33, 9), (5, 8), (3, 1), (45, 65))  # (rows, columns)
# K past two of the mat-vec's 64-word warp steps, ending in a partial one (odd for MATRIX / ROW)
LONG_K = {
    Variant.G128: 4224,
    Variant.PT: 4224,
    Variant.B128: 4224,
    Variant.B256: 4352,
    Variant.MATRIX: 4192,
    Variant.ROW: 4192,
}
# K whose rows end mid-step for every lane count of the mat-vec (32 / 16 / 8 lanes a row, steps of 64 / 32 / 16
# words; the rest a word per lane in one or two half steps): 76 and (odd) 77 words: 1 / 2 / 4 whole steps, then
# 12 or 13 words (two half steps at 8 lanes); B256, 88 words: 1 / 2 / 5 whole steps, then 24 / 24 / 8 (two half
# steps at 16 lanes)
MID_STEP_K = {
    Variant.G128: 2432,
    Variant.PT: 2432,
    Variant.B128: 2432,
    Variant.B256: 2816,
    Variant.MATRIX: 2464,
    Variant.ROW: 2464,
}


def batched_cases(rng: np.random.Generator, variant: Variant, zs: tuple[float, ...] = (0.0, 0.4, 1.0)) -> list[dict]:
    cases = []
    for z in zs:
        for i, k in enumerate(BATCHED_K[variant]):
            for rows, n_x in BATCHED_SHAPES[i % 2 :: 2]:
                c = gpu_cases.make_case(rng, variant, rows, k, z, n_x)
                c.update(row0=0, n_rows=rows, wg=16)
                cases.append(c)
    if not variant.scale_block:  # MUL_MAT_ID: 3 experts of 19 rows, 300 columns (more than a 64-slot tile each)
        c = gpu_cases.make_case(rng, variant, 57, 384 if variant.version == 1 else 96, 0.4, 300, n_mats=3)
        c.update(row0=0, n_rows=57, wg=16)
        cases.append(c)
    return cases


def id_layout(c: dict) -> tuple[int, int, int, np.ndarray] | None:
    """tests/cuda/test-bitcos-cuda.cu's MUL_MAT_ID run of a case whose tensor has n_mats = E > 1 matrices:
    (E, rows per expert, ne11, ids (n_tok, 2)), ne11 = 2 for an even column count (else 1), ids[t][u] =
    (t + 2 u) % (E + 1) (E: out of range); None for a single matrix."""
    comp = np.ascontiguousarray(c["companion"]).view(np.uint8).reshape(-1)
    e = int(comp[24:32].view("<u8")[0])
    if e <= 1:
        return None
    n_x = c["x"].shape[0]
    ne11 = 2 if n_x % 2 == 0 else 1
    t = np.arange(n_x // ne11)[:, None]
    return e, c["n_rows"] // e, ne11, (t + 2 * np.arange(2)[None, :]) % (e + 1)


def check_id(c: dict, res: np.ndarray) -> None:
    """MUL_MAT_ID outputs (n_tok, n_used, rows per expert): NaN (untouched) for out-of-range ids, else
    check_batched per expert (every CUDA path runs on int8 activations)."""
    n_exp, rows_e, ne11, ids = id_layout(c)
    assert np.all(np.isnan(res[ids == n_exp]))
    for e in range(n_exp):
        t, u = np.nonzero(ids == e)
        cols = c["x"][t * ne11 + u % ne11]
        values = c["values"][e * rows_e : (e + 1) * rows_e].astype(np.float64)
        check_batched({"x": cols, "values": values, "row0": 0, "n_rows": rows_e}, res[t, u])


def quantize_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """bitcos_cuda_quantize_q8_kernel in numpy (IEEE fp32 division and round-half-even as on the device):
    per 32 values d = amax / 127, q = rint(x / d); returns (q, d) with q (n_x, k) and d (n_x, k / 32)."""
    n_x, k = x.shape
    xb = x.astype(np.float32).reshape(n_x, k // 32, 32)
    amax = np.abs(xb).max(axis=2)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(amax[:, :, None] > 0, np.rint(xb / d[:, :, None]), 0)
    return np.clip(q, -127, 127).reshape(n_x, k), d


def check_batched(c: dict, mm: np.ndarray) -> None:
    """The batched path: (1) the error bound of bitcos-cuda-mmq.cuh's comment against the exact fp64 product,
    |err| <= M (1/254 (1 + 2^-12) + (K/32 + 4) 2^-23), M = sum over 32-blocks b of (sum_b |W|) * amax_b(x)
    (int8 rounding moves a value by at most amax_b / 254; the rest is fp32 rounding of the per-block products
    and their K/32-term sum); (2) tighter, against the fp64 product with the same quantized activations, within
    that fp32 part alone (catches tile index errors that the int8 bound could hide)."""
    n_x, k = c["x"].shape
    values = c["values"][c["row0"] : c["row0"] + c["n_rows"]].astype(np.float64)
    x = c["x"].astype(np.float64)
    nb = k // 32
    amax = np.abs(x).reshape(n_x, nb, 32).max(axis=2)
    wsum = np.abs(values).reshape(-1, nb, 32).sum(axis=2)
    m = amax @ wsum.T
    fp32 = (nb + 4) * 2.0**-23
    assert np.all(np.isfinite(mm))
    err = np.abs(mm - x @ values.T)
    assert np.all(err <= m * (1 / 254 * (1 + 2.0**-12) + fp32) + 1e-30), float(np.max(err / (m + 1e-30)))
    q, d = quantize_q8(c["x"])
    xq = q.astype(np.float64) * np.repeat(d.astype(np.float64), 32, axis=1)
    mq = np.abs(xq).reshape(n_x, nb, 32).max(axis=2) @ wsum.T
    assert np.all(np.abs(mm - xq @ values.T) <= mq * fp32 + 1e-30)


@pytest.mark.parametrize("variant", list(Variant), ids=[v.name.lower() for v in Variant])
def test_cuda_kernel_matches_the_reference(nvcc_or_prebuilt, tmp_path, variant):
    """On a CUDA device: the mat-vec (dp4a table decode, both table layouts) and the batched path (tensor
    cores), both on int8 activations, on every variant of both format versions: the SYCL test's cases (z 0 /
    0.4 / 1, odd shapes, MATRIX / ROW rows ending in a partial 128-weight unit, 1-17 columns, runs starting
    mid-tensor, 3-D tensors with per-matrix scales) and batched_cases' (1-65 columns), within the int8 bound
    and within fp32 rounding of the product with the same quantized activations (check_batched); MUL_MAT_ID,
    mat-vec and batched, on the tensors of several matrices (check_id)."""
    if not cuda_device_present():
        pytest.skip("no CUDA device (runs on a lent GPU machine: dev/gpu_session.sh)")
    prebuilt = os.environ.get("BITCOS_CUDA_TEST_EXE")  # built elsewhere (the GPU machine has no nvcc)
    exe = Path(prebuilt) if prebuilt else tmp_path / "test-bitcos-cuda"
    if not prebuilt:
        compile_cuda(
            nvcc_or_prebuilt,
            ROOT / "tests" / "cuda" / "test-bitcos-cuda.cu",
            exe,
            "native",
            [ROOT / "csrc", ROOT / "csrc" / "cuda"],
            link=True,
        )
    rng = np.random.default_rng(31 + int(variant))
    run_and_check(exe, tmp_path, gpu_cases.variant_cases(rng, variant) + batched_cases(rng, variant))


def run_and_check(exe: Path, tmp_path: Path, cases: list[dict]) -> None:
    """Runs a test program (tests/cuda/test-bitcos-cuda.cu on a GPU, or tests/cuda/host-emulation.cpp) on the
    cases and checks its outputs: mat-vec, batched, and for tensors of several matrices MUL_MAT_ID both ways; all
    of them on int8 activations, so all within check_batched's bound and within fp32 rounding of the product
    with the same quantized activations (check_id for MUL_MAT_ID)."""
    inp, out = tmp_path / "in.bin", tmp_path / "out.bin"
    gpu_cases.write_cases(inp, cases)
    r = subprocess.run([str(exe), str(inp), str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    data = np.fromfile(out, dtype="<f4")
    off = 0
    for c in cases:
        n_x, k = c["x"].shape
        # the mat-vec and the batched path share the arithmetic (int8 activations per 32, exact int32 dots)
        for _path in ("mat-vec", "batched"):
            out = data[off : off + n_x * c["n_rows"]].reshape(n_x, c["n_rows"])
            off += out.size
            check_batched(c, out)
        lay = id_layout(c)
        if lay is not None:
            n_ids = lay[3].size * lay[1]
            for _path in ("mat-vec", "batched"):
                check_id(c, data[off : off + n_ids].reshape(*lay[3].shape, lay[1]))
                off += n_ids
    assert off == data.size


@pytest.fixture(scope="module")
def host_emulation(tmp_path_factory) -> Path:
    """tests/cuda/host-emulation.cpp built with the host C++ compiler (C++20: std::barrier)."""
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp("cuda-host") / "host-emulation"
    r = subprocess.run(
        [
            cxx,
            "-std=c++20",
            "-O1",
            "-pthread",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{ROOT / 'tests' / 'cuda' / 'host-shim'}",
            f"-I{ROOT / 'csrc'}",
            f"-I{ROOT / 'csrc' / 'cuda'}",
            str(ROOT / "tests" / "cuda" / "host-emulation.cpp"),
            "-o",
            str(exe),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return exe


@pytest.mark.parametrize("variant", list(Variant), ids=[v.name.lower() for v in Variant])
def test_cuda_kernels_in_host_emulation(host_emulation, tmp_path, variant):
    """Everywhere (no GPU): the kernels' own source (mat-vec, MUL_MAT_ID, quantization, slot grouping, the
    batched tile kernel in both modes) run on the CPU through tests/cuda/host-shim (a thread per CUDA thread,
    real barriers and shuffles, wmma with its alignment rules) and checked as on a GPU, on a small set: the
    batched cases at z 0.4 with K <= 640 (1-65 columns, partial units, rows past a tile), one case with K past
    two whole mat-vec warp steps (LONG_K), three with rows ending mid-step at 32, 16 and 8 lanes a row and 37
    rows (MID_STEP_K; the programs cycle the lanes a row by case number for 1 and 4 columns and MUL_MAT_ID)
    and, for PT / MATRIX /
    ROW, the SYCL test's 3-matrix tensor through MUL_MAT_ID (its 300-column one, which fills several slot
    tiles per expert, only in test_mmq_tile_emulation: too slow here). dev/gpu_session.sh runs the full
    set on a GPU."""
    rng = np.random.default_rng(53 + int(variant))
    cases = [c for c in batched_cases(rng, variant, zs=(0.4,)) if c["x"].shape[1] <= 640 and id_layout(c) is None]
    cases += [c for c in gpu_cases.variant_cases(rng, variant) if id_layout(c) is not None]
    # rows long enough for the mat-vec's whole 2048-weight warp steps before a partial one (an odd word count
    # where the variant allows it: a lane with one word of two)
    c = gpu_cases.make_case(rng, variant, 6, LONG_K[variant], 0.4, 3)
    c.update(row0=0, n_rows=6, wg=16)
    cases.append(c)
    # rows ending mid-step, three consecutive cases (the test programs take 32 / 16 / 8 lanes a row by case
    # number % 3 for 1 and 4 columns, 8 otherwise): 37 rows, not a multiple of 2 or 4 rows a warp, two
    # row-group rounds of the 2-block grid with 8 lanes (32 rows a round), the last group with 1 of 4 rows
    for rows, n_x in ((37, 1), (37, 4), (37, 1)):
        c = gpu_cases.make_case(rng, variant, rows + 2, MID_STEP_K[variant], 0.4, n_x)
        c.update(row0=1, n_rows=rows, wg=16)
        cases.append(c)
    run_and_check(host_emulation, tmp_path, cases)


@pytest.mark.parametrize("variant", list(Variant), ids=[v.name.lower() for v in Variant])
def test_mmq_tile_emulation(variant):
    """Everywhere (numpy, no GPU): tests/cuda/mmq_emulation.py, a statement-by-statement CPU emulation of the
    batched kernel's index math (thread roles, width-4 prefix sums and sign cursors, k-slab tiles, wmma
    fragment mapping, per-32 scales) on the encoded bytes, decodes every tile to the codec's exact codes and
    passes check_batched: on batched_cases at z 0.4 (1-65 columns, partial 128-weight units, rows past a
    32-row tile) and the SYCL cases with runs starting mid-tensor and per-matrix / per-row scales of 3-D
    tensors; for the tensors of several matrices also MUL_MAT_ID (slot grouping, expert blocks, check_id)."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "cuda"))
    import mmq_emulation as emu

    rng = np.random.default_rng(97 + int(variant))
    cases = batched_cases(rng, variant, zs=(0.4,))
    cases += [
        c for c in gpu_cases.variant_cases(rng, variant) if (c["row0"] or c["n_rows"] == 24) and c["x"].shape[1] <= 4352
    ]
    for c in cases:
        rows, k = c["n_rows"], c["x"].shape[1]
        codes = np.zeros((rows, k), np.int8)
        out = emu.emulate(c["blocks"], c["companion"], c["x"], c["row0"], rows, codes)
        assert np.array_equal(codes, c["codes"][c["row0"] : c["row0"] + rows])
        check_batched(c, out)
        lay = id_layout(c)
        if lay is not None:
            n_exp, rows_e, ne11, ids = lay
            check_id(c, emu.emulate_id(c["blocks"], c["companion"], c["x"], n_exp, rows_e, ne11, ids, rng))


# A made-up kernel in nvdisasm's form: an outer loop (one SHFL.UP a unit) around a counted inner loop of 8
# trips, a warp-shuffle fallback reached by BRA.DIV that jumps back into the loop (never taken by a converged
# warp: must not count), and an exit.
SASS_NESTED = """
.text._Z6kernelv:
        /*0000*/                   MOV R0, RZ ;
.L_x_0:
        /*0010*/                   UMOV UR5, URZ ;
        /*0020*/                   BRA.DIV UR4, `(.L_x_9) ;
        /*0030*/                   SHFL.UP P0, R1, R2, 0x1, RZ ;
.L_x_5:
        /*0040*/                   POPC R3, R2 ;
.L_x_1:
        /*0050*/                   LDS R4, [R3] ;
        /*0060*/                   IDP.4A.S8.S8 R5, R4, R4, R5 ;
        /*0070*/                   UIADD3 UR5, UR5, 0x1, URZ ;
        /*0080*/                   UISETP.NE.AND UP0, UPT, UR5, 0x8, UPT ;
        /*0090*/                   PLOP3.LUT P1, PT, PT, PT, UP0, 0x80, 0x0 ;
        /*00a0*/               @P1 BRA `(.L_x_1) ;
        /*00b0*/                   ISETP.GE.AND P2, PT, R0, R6, PT ;
        /*00c0*/              @!P2 BRA `(.L_x_0) ;
        /*00d0*/                   EXIT ;
.L_x_9:
        /*00e0*/                   WARPSYNC.COLLECTIVE R7, `(.L_x_10) ;
        /*00f0*/                   SHFL.UP P0, R1, R2, 0x1, RZ ;
.L_x_10:
        /*0100*/                   BRA `(.L_x_5) ;
"""


def test_sass_count_tool_reads_loops():
    """dev/cuda_sass_count.py's loop analysis on a made-up SASS listing (no nvcc needed): the hot loop is
    the outer one, its counted inner loop weighs 8 times, the divergent-shuffle fallback does not count."""
    tool = cuda_sass_count
    ins, labels = tool.parse_functions(SASS_NESTED)["_Z6kernelv"]
    rep = tool.count_hot_loop(ins, labels, "SHFL.UP", 1, 32, "kernel", {})
    # outer body: UMOV, BRA.DIV, SHFL.UP, POPC, ISETP, BRA = 6; inner: 6 instructions x 8 trips
    assert rep.inner_loops == [(".L_x_1", 6, 8)]
    assert rep.instructions_per_iter == 6 + 6 * 8
    assert rep.by_class["LDS"] == 8 and rep.by_class["DP4A"] == 8 and rep.by_class["SHFL"] == 1
    assert rep.weights_per_iter == 32 and rep.per_weight == pytest.approx(54 / 32)


def test_sass_count_of_the_mat_vec(nvcc_path):
    """The static count runs on the real kernels (sm_90) and gives positive instructions per weight for the
    BITCOS mat-vec and the 2-bit reference. Exact counts that are the decode's design (not the compiler's
    scheduling), checked: per 64-weight iteration of a lane, 16 table loads and 16 dp4a (one each per 4-weight
    group) and 8 POPC (each word's count and its 3 byte-boundary offsets). Needs nvdisasm or cuobjdump: where
    CI requires the CUDA compile (BITCOS_REQUIRE_CUDA_COMPILE=1) the tool installs them from PyPI into
    ~/.cache/ggml-bitcos/cuda-tools; elsewhere the test skips without them."""
    tool = cuda_sass_count
    dis = tool.find_disassembler(fetch=os.environ.get("BITCOS_REQUIRE_CUDA_COMPILE") == "1")
    if dis is None:
        pytest.skip("no nvdisasm / cuobjdump (dev/cuda_sass_count.py --fetch installs them)")
    bitcos = tool.measure("bitcos", ROOT, "sm_90", dis, nvcc_path, {})
    tq2 = tool.measure("tq2", ROOT, "sm_90", dis, nvcc_path, {})
    for rep in (bitcos, tq2):
        assert 0 < rep.per_weight < 100 and rep.instructions_per_iter > 0
    assert bitcos.weights_per_iter == 64
    assert bitcos.by_class["LDS"] == 16 and bitcos.by_class["DP4A"] == 16 and bitcos.by_class["POPC"] == 8
    assert tq2.by_class["DP4A"] == tq2.weights_per_iter / 4
