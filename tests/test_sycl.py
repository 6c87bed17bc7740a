"""The BITCOS SYCL kernels (csrc/sycl/bitcos-sycl.hpp: the paper's Xe2 design, lanes own rows, a 2 KB
table in local memory replaces pdep) executed on a real SYCL device: the SYCL runtime's kernel compiler
builds them at run time and Intel's OpenCL CPU device runs them (no icpx, no Intel GPU here).

The inputs come from the project's reference codec (codec.encode), the expected values from numpy straight
from the ternary codes and scales: dequantized rows must match bit for bit (FORMAT.md §5: one fp32
multiplication per weight), mat-vec results within fp32 accumulation error of the float64 product.

Needs the SYCL runtime (PyPI dpcpp-cpp-rt: headers, libsycl, the kernel compiler, the OpenCL CPU device):
`scripts/sycl_runtime.sh` installs it into ~/.cache/ggml-bitcos/sycl-rt (CI does); $BITCOS_SYCL_RT points
elsewhere. Skipped without it unless BITCOS_REQUIRE_SYCL=1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ggml_bitcos import codec
from ggml_bitcos.format import Variant
from gpu_cases import VARIANT_IDS, make_case, variant_cases, write_cases

ROOT = Path(__file__).resolve().parent.parent
SYCL_TEST_DIR = ROOT / "tests" / "sycl"
DEFAULT_RT = Path.home() / ".cache" / "ggml-bitcos" / "sycl-rt"


def sycl_runtime() -> Path | None:
    """Prefix holding include/sycl/sycl.hpp, lib/libsycl.so and lib/libintelocl.so, or None."""
    rt = Path(os.environ.get("BITCOS_SYCL_RT", DEFAULT_RT))
    ok = all((rt / p).exists() for p in ("include/sycl/sycl.hpp", "lib/libsycl.so", "lib/libintelocl.so"))
    return rt if ok else None


@pytest.fixture(scope="module")
def sycl_host(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The host program built against the runtime, and the environment that selects the OpenCL CPU device."""
    rt = sycl_runtime()
    if rt is None:
        msg = f"SYCL runtime not found at {os.environ.get('BITCOS_SYCL_RT', DEFAULT_RT)} (scripts/sycl_runtime.sh)"
        if os.environ.get("BITCOS_REQUIRE_SYCL") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp("sycl") / "test-bitcos-sycl"
    subprocess.run(
        [
            cxx,
            "-std=c++17",
            "-O1",
            "-DSYCL_DISABLE_FSYCL_SYCLHPP_WARNING",
            str(SYCL_TEST_DIR / "test-bitcos-sycl.cpp"),
            f"-I{ROOT / 'csrc'}",
            f"-I{rt / 'include'}",
            f"-L{rt / 'lib'}",
            "-lsycl",
            f"-Wl,-rpath,{rt / 'lib'}",
            "-o",
            str(exe),
        ],
        check=True,
        capture_output=True,
    )
    # the OpenCL ICD loader of the runtime finds Intel's CPU device through this; the Level Zero adapter's
    # "UR adapter initialization failed" on a machine without an Intel GPU is harmless
    env = dict(os.environ, OCL_ICD_FILENAMES=str(rt / "lib" / "libintelocl.so"))
    return exe, env


def run_cases(sycl_host, tmp_path: Path, cases: list[dict]) -> list[dict[str, np.ndarray]]:
    """Runs every case (rows row0 .. row0 + n_rows of its tensor) in one process; returns per case "mv" (the
    fp32 mat-vec, (n_x, n_rows)), "dq" (dequantized, (n_rows, k)), "tiles" (the tiled path with the portable
    contraction, (n_x, n_rows)) and, where the device ran the joint_matrix kernel, "xmx" (likewise)."""
    exe, env = sycl_host
    inp, out = tmp_path / "in.bin", tmp_path / "out.bin"
    write_cases(inp, cases)
    r = subprocess.run(
        [str(exe), str(ROOT / "csrc"), str(SYCL_TEST_DIR / "bitcos-sycl-kernels.jit.cpp"), str(inp), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # the joint_matrix kernel must at least have compiled; it runs where the device has the matrix aspect
    assert "xmx: runnable" in r.stdout or "xmx: built, not runnable" in r.stdout, r.stdout
    blocks = ["mv", "dq", "tiles"] + (["xmx"] if "xmx: runnable" in r.stdout else [])
    data = np.fromfile(out, dtype="<f4")
    res, off = [], 0
    for c in cases:
        n_x, k = c["x"].shape
        got = {}
        for name in blocks:
            shape = (c["n_rows"], k) if name == "dq" else (n_x, c["n_rows"])
            got[name] = data[off : off + shape[0] * shape[1]].reshape(shape)
            off += got[name].size
        res.append(got)
    assert off == data.size
    return res


def check(case: dict, got: dict[str, np.ndarray]) -> None:
    rows = slice(case["row0"], case["row0"] + case["n_rows"])
    values = case["values"][rows].astype(np.float64)
    k = values.shape[1]
    fp32_sum = 4 * np.finfo(np.float32).eps * np.sqrt(k)  # fp32 accumulation, relative to sum |w x|
    # dequantized: the very same fp32 values (bit patterns)
    assert np.array_equal(got["dq"].view(np.uint32), case["values"][rows].view(np.uint32))
    # fp32 mat-vec: within fp32 accumulation error of the float64 product
    x = case["x"].astype(np.float64)
    ref, mag = x @ values.T, np.abs(x) @ np.abs(values.T)
    assert np.all(np.abs(got["mv"] - ref) <= fp32_sum * mag + 1e-30), np.max(np.abs(got["mv"] - ref) / (mag + 1e-30))
    # the tiled path (bitcos-sycl.hpp, "Numerics"): the fp32 sum of W fp16(x), so tightly against the product
    # with fp16-rounded activations, and within fp16's rounding of x of the exact product
    x16 = case["x"].astype(np.float16).astype(np.float64)
    ref16, mag16 = x16 @ values.T, np.abs(x16) @ np.abs(values.T)
    fp16_x = 2.0**-11 * mag + 2.0**-25 * np.abs(values).sum(axis=1)
    for name in ("tiles", "xmx"):
        if name in got:
            y = got[name]
            assert np.all(np.abs(y - ref16) <= fp32_sum * mag16 + 1e-30), (
                name,
                np.max(np.abs(y - ref16) / (mag16 + 1e-30)),
            )
            assert np.all(np.abs(y - ref) <= fp16_x + fp32_sum * mag + 1e-30), (
                name,
                np.max(np.abs(y - ref) / (mag + 1e-30)),
            )


@pytest.mark.parametrize("variant", list(Variant), ids=VARIANT_IDS)
def test_sycl_kernels_match_the_reference(sycl_host, tmp_path, variant):
    """Every variant of both format versions (variant_cases: zero densities 0 / 0.4 / 1, odd shapes, partial
    last 128-weight units for MATRIX / ROW, 3-D tensors with per-matrix scales), mat-vec and dequantization."""
    rng = np.random.default_rng(21 + int(variant))
    cases = variant_cases(rng, variant)
    for case, got in zip(cases, run_cases(sycl_host, tmp_path, cases)):
        check(case, got)


@pytest.mark.parametrize("variant, k, nth", [(Variant.PT, 512, 7), (Variant.MATRIX, 96, -1)], ids=["pt", "matrix-k96"])
def test_sycl_kernels_see_a_single_sign(sycl_host, tmp_path, variant, k, nth):
    """Flipping the stored sign of one present weight (in the companion's pool) changes exactly that row's
    mat-vec result and exactly that weight's dequantized value: the kernels read the sign stream (K = 96: the
    last present weight of a row that ends in a partial unit, whose sign the next row's stream follows)."""
    rng = np.random.default_rng(5)
    case = make_case(rng, variant, 9, k, 0.4, 1)
    case.update(row0=0, n_rows=9, wg=16)
    hdr = codec.parse_header(case["companion"].view(np.uint8))
    present = np.flatnonzero(case["codes"][4])
    row, col = 4, int(present[nth])  # a present weight of row 4
    pos = int(codec.sign_positions(case["companion"].view(np.uint8), hdr)[row]) + (nth % len(present))
    flipped = dict(case, companion=case["companion"].copy())
    flipped["companion"].view(np.uint8)[hdr.pool_offset + pos // 8] ^= np.uint8(1 << (pos % 8))
    before, after = run_cases(sycl_host, tmp_path, [case, flipped])
    for name in ("mv", "tiles", "xmx"):
        if name in before:
            assert list(np.flatnonzero(before[name][0] != after[name][0])) == [row], name
    changed = np.argwhere(before["dq"] != after["dq"])
    assert changed.tolist() == [[row, col]] and after["dq"][row, col] == -before["dq"][row, col]


# ------------------------------------------------------------------------------ ggml-sycl build gate
# No icpx here, so ggml-sycl cannot be built; the strictest check available is a full C++ front-end pass
# (parse, templates, overloads, types) of the patched sources by clang++ against the real SYCL, oneMKL and
# ggml headers, with the definitions ggml-sycl's CMakeLists.txt sets. Device-code generation (and so what
# only icpx's SYCL device pass would catch) is not checked; the device code itself runs in the tests above.
SYCL_CLANG = os.environ.get("BITCOS_SYCL_CLANG", "clang++-22")
GGML_SYCL_DEFINES = [
    "-DGGML_SYCL_DNNL=0",
    "-DGGML_SYCL_WARP_SIZE=16",
    "-DGGML_SYCL_GRAPH",
    "-DSYCL_DISABLE_FSYCL_SYCLHPP_WARNING",
]


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory) -> Path:
    """A fresh copy of the pinned sdist with csrc/ copied in and patches/ applied, as the build stages it."""
    from ggml_bitcos import build, upstream

    rt = sycl_runtime()
    if rt is None or not (rt / "include" / "oneapi" / "mkl.hpp").exists() or shutil.which(SYCL_CLANG) is None:
        msg = f"needs {SYCL_CLANG} and the SYCL runtime with the oneMKL headers (scripts/sycl_runtime.sh)"
        if os.environ.get("BITCOS_REQUIRE_SYCL") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    tree = upstream.extract_sdist(tmp_path_factory.mktemp("sycl-gate") / "src")
    build.copy_csrc(tree)
    build.apply_patches(tree)
    return tree


def sycl_syntax_check(tree: Path, sources: list[Path], strict: bool) -> subprocess.CompletedProcess:
    rt = sycl_runtime()
    ggml = tree / "vendor" / "llama.cpp" / "ggml"
    flags = [
        "-fsyntax-only",
        "-std=c++17",
        *GGML_SYCL_DEFINES,
        "-Wno-narrowing",
        f"-I{ggml / 'include'}",
        f"-I{ggml / 'src'}",
        f"-I{ggml / 'src' / 'ggml-sycl'}",
        f"-I{ggml / 'src' / 'ggml-bitcos' / 'sycl'}",
        "-isystem",
        str(rt / "include"),
    ]
    if strict:
        # our glue: every warning is an error, except two that only upstream headers raise here (static
        # helpers of ggml-impl.h unused in this file; SYCL's host-pass deprecation of parallel_for overloads)
        flags += ["-Wall", "-Wextra", "-Werror", "-Wno-unused-function", "-Wno-deprecated-declarations"]
    return subprocess.run([SYCL_CLANG, *flags, *map(str, sources)], capture_output=True, text=True, timeout=1800)


def test_ggml_sycl_patch_passes_the_syntax_gate(patched_tree):
    """The patched ggml-sycl.cpp (with the BITCOS hooks) and the BITCOS glue pass clang's full front end;
    the glue with -Wall -Wextra -Werror."""
    ggml_sycl = patched_tree / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-sycl"
    glue = patched_tree / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-bitcos" / "sycl" / "ggml-bitcos-sycl.cpp"
    text = (ggml_sycl / "ggml-sycl.cpp").read_text()
    assert "ggml_sycl_bitcos_mul_mat(" in text and "ggml_sycl_bitcos_supports_op(" in text, "hooks missing"
    assert "ggml-bitcos-sycl.cpp" in (ggml_sycl / "CMakeLists.txt").read_text()
    r = sycl_syntax_check(patched_tree, [glue], strict=True)
    assert r.returncode == 0, r.stderr[-4000:]
    r = sycl_syntax_check(patched_tree, [ggml_sycl / "ggml-sycl.cpp"], strict=False)
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.mark.slow
def test_every_ggml_sycl_source_passes_the_syntax_gate(patched_tree):
    """Every ggml-sycl translation unit of the patched tree (slow: GGML_BITCOS_SLOW=1 or --run-slow; ~10 min
    on 2 cores)."""
    ggml_sycl = patched_tree / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-sycl"
    failed = []
    for src in sorted(ggml_sycl.rglob("*.cpp")):
        r = sycl_syntax_check(patched_tree, [src], strict=False)
        if r.returncode != 0:
            failed.append(f"{src.relative_to(ggml_sycl)}:\n{r.stderr[-1500:]}")
    assert not failed, "\n".join(failed)
