"""Portable x86 builds: GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS + GGML_NATIVE=OFF, the build for other machines.

Such a build has no libggml-cpu.so: one CPU backend module per x86 ISA level (libggml-cpu-x64.so ..
libggml-cpu-zen4.so), all in llama_cpp/lib, of which ggml_backend_load_all() loads the best this CPU runs. Each
carries the BITCOS kernels its compile flags allow (csrc/bitcos-kernels-table.c): AVX-512 from skylakex up, AVX2
in haswell and alderlake, the portable kernel below AVX2. Checked here, on the package the project's own build
makes with those options (ggml_bitcos.build.build_package, its own build dir <cache>/build-portable):

- every variant is there, and its exported kernel symbols are those of its ISA level;
- per variant this CPU can run (a copy of the package holding only that libggml-cpu-<variant>.so):
  `from llama_cpp import Llama` loads exactly that module (found next to libggml, not beside the Python
  executable) and its kernel table picks the variant's kernel; a BITCOS model generates its TQ2_0 source's
  greedy tokens with bit-identical logits (AVX2 and AVX-512 variants), or below AVX2, where TQ2_0 runs its generic
  C that sums in another order than the contract, the first 16 tokens with KLD <= 1e-3 per step;
  the load log names the BITCOS kernel the variant runs, and test-bitcos-mm (linked to ggml/ggml-base only)
  finds the CPU backend from llama_cpp/bin and passes against the contract and TQ2_0.

Slow (a cold build of all variants takes ~1 h on 2 cores; CI keeps it incremental): GGML_BITCOS_SLOW=1 or
--run-slow. BITCOS_PORTABLE_PKG=<llama_cpp package folder> tests an existing portable build instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from install_helpers import PORTABLE_CMAKE_ARGS, ROOT

# ggml's x86 CPU variants at the pinned commit (ggml/src/CMakeLists.txt, GGML_CPU_ALL_VARIANTS, GCC) and the BITCOS
# kernel each one's flags allow: "avx512" needs AVX-512 F/BW/VL, "avx2" AVX2 (bitcos-kernels.h, BITCOS_BUILD_*)
VARIANT_KERNEL = {
    "x64": "portable",
    "sse42": "portable",
    "sandybridge": "portable",
    "ivybridge": "portable",
    "piledriver": "portable",
    "haswell": "avx2",
    "alderlake": "avx2",
    "skylakex": "avx512",
    "cannonlake": "avx512",
    "cascadelake": "avx512",
    "icelake": "avx512",
    "cooperlake": "avx512",
    "zen4": "avx512",
    "sapphirerapids": "avx512",
}
# the kernel entry points a variant must export (and, for the kernels above its level, must not)
KERNEL_SYMBOLS = {
    "portable": {"bitcos_mm_generic", "bitcos_mm_portable"},
    "avx2": {"bitcos_mm_generic", "bitcos_mm_portable", "bitcos_mm_avx2"},
    "avx512": {"bitcos_mm_generic", "bitcos_mm_portable", "bitcos_mm_avx2", "bitcos_mm_avx512"},
}
ALL_KERNEL_SYMBOLS = KERNEL_SYMBOLS["avx512"]

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
N_TOKENS = 32
N_TOKENS_BELOW_AVX2 = 16  # compared where TQ2_0 is not bit-identical (a near tie may flip a later token)

pytestmark = pytest.mark.slow

# Run in a child process with a one-variant copy of the package first on the path: whether this CPU runs the
# variant (its ggml_backend_score), the BITCOS kernel its table picks, then greedy generation of each model through
# llama_cpp.Llama (verbose: the load log on stderr), the CPU modules mapped into the process, the logits saved.
VARIANT_RUN = r"""
import ctypes, json, sys
from pathlib import Path
import numpy as np
pkg_root, out_dir, prompt, n = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
(variant,) = (pkg_root / "llama_cpp" / "lib").glob("libggml-cpu-*.so")
module = ctypes.CDLL(str(variant))
if module.ggml_backend_score() == 0:
    print(json.dumps({"runs": False}))
    sys.exit(0)
module.bitcos_kernel_best.restype = ctypes.POINTER(ctypes.c_char_p)  # the kernel table entry the glue runs
import llama_cpp
from ggml_bitcos import llama_run
res = {"runs": True, "llama_cpp": llama_cpp.__file__, "tokens": {}}
res["kernel_best"] = module.bitcos_kernel_best().contents.value.decode()
for i, model in enumerate(sys.argv[5:]):
    g = llama_run.greedy_generate(Path(model), prompt, n, n_threads=2, verbose=True)
    res["tokens"][model] = g.tokens
    np.save(out_dir / f"logits-{i}.npy", g.logits)
res["cpu_modules"] = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libggml-cpu" in l})
print(json.dumps(res))
"""


@pytest.fixture(scope="session")
def portable_pkg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The llama_cpp package of a portable build (PORTABLE_CMAKE_ARGS), built by ggml_bitcos.build.build_package
    in the cache's build-portable dir (incremental), or $BITCOS_PORTABLE_PKG."""
    given = os.environ.get("BITCOS_PORTABLE_PKG")
    if given:
        return Path(given)
    from ggml_bitcos import build

    stage = tmp_path_factory.mktemp("portable-stage")
    try:
        return build.build_package(stage, cmake_args=PORTABLE_CMAKE_ARGS)
    except build.BuildError as e:
        pytest.fail(f"portable build failed: {e}")


@pytest.fixture(scope="session")
def model_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(TQ2_0 source, its BITCOS conversion): a tiny llama, per-128 scales (B256 after conversion), z = 0.42."""
    d = tmp_path_factory.mktemp("portable-models")
    src, out = d / "tiny-tq2_0.gguf", d / "tiny-bitcos.gguf"
    make = ["make-model", "-o", str(src), "--preset", "tiny", "--zero-density", "0.42", "--type", "tq2_0"]
    for args in (make + ["--scale", "g128", "--seed", "7", "-q"], ["convert", str(src), "-o", str(out)]):
        r = subprocess.run([sys.executable, "-m", "ggml_bitcos", *args], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0, r.stdout + r.stderr
    return src, out


def _variants(pkg: Path) -> dict[str, Path]:
    lib = pkg / "lib"
    return {p.name.removeprefix("libggml-cpu-").removesuffix(".so"): p for p in sorted(lib.glob("libggml-cpu-*.so"))}


def _exported(lib: Path) -> set[str]:
    r = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in r.stdout.splitlines() if line.strip()}


def _kld(la: np.ndarray, lb: np.ndarray) -> np.ndarray:
    """KL(softmax(la) || softmax(lb)) per row, in float64."""
    la, lb = la.astype(np.float64), lb.astype(np.float64)
    la -= la.max(axis=1, keepdims=True)
    lb -= lb.max(axis=1, keepdims=True)
    lpa = la - np.log(np.exp(la).sum(axis=1, keepdims=True))
    lpb = lb - np.log(np.exp(lb).sum(axis=1, keepdims=True))
    return (np.exp(lpa) * (lpa - lpb)).sum(axis=1)


def _one_variant_copy(pkg: Path, variant: str, dest: Path) -> Path:
    """dest/llama_cpp: the package with libggml-cpu-<variant>.so as its only CPU backend."""
    keep = f"libggml-cpu-{variant}.so"
    shutil.copytree(
        pkg,
        dest / "llama_cpp",
        ignore=lambda d, names: [n for n in names if n.startswith("libggml-cpu-") and n != keep],
    )
    return dest


def test_every_variant_in_the_package(portable_pkg: Path) -> None:
    """All x86 variants in llama_cpp/lib, no libggml-cpu.so, the DL-built libraries and the tools beside them."""
    assert set(_variants(portable_pkg)) == set(VARIANT_KERNEL)
    lib = portable_pkg / "lib"
    assert not (lib / "libggml-cpu.so").exists()
    for name in ("libggml.so", "libggml-base.so", "libllama.so"):
        assert any(lib.glob(name + "*")), name
    for tool in ("test-bitcos-mm", "llama-bitcos-bench", "llama-completion"):
        assert (portable_pkg / "bin" / tool).is_file(), tool


@pytest.mark.parametrize("variant", list(VARIANT_KERNEL))
def test_variant_carries_the_kernel_its_isa_allows(portable_pkg: Path, variant: str) -> None:
    """The variant's module exports exactly the BITCOS kernels of its ISA level (compiled with its flags)."""
    got = _exported(_variants(portable_pkg)[variant]) & ALL_KERNEL_SYMBOLS
    assert got == KERNEL_SYMBOLS[VARIANT_KERNEL[variant]], (variant, sorted(got))


@pytest.mark.parametrize("variant", list(VARIANT_KERNEL))
def test_variant_runs_bitcos_like_tq2_0(
    portable_pkg: Path, model_pair: tuple[Path, Path], variant: str, tmp_path: Path
) -> None:
    """A copy of the package with only this variant: Llama() loads it from llama_cpp/lib, BITCOS generates TQ2_0's
    greedy tokens (bit for bit from AVX2 up), the log names the variant's BITCOS kernel, and
    llama_cpp/bin/test-bitcos-mm finds the same module and passes."""
    kernel = VARIANT_KERNEL[variant]
    root = _one_variant_copy(portable_pkg, variant, tmp_path / "pkg")
    module = root / "llama_cpp" / "lib" / f"libggml-cpu-{variant}.so"
    src, out = model_pair
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(ROOT)]))
    r = subprocess.run(
        [sys.executable, "-c", VARIANT_RUN, str(root), str(tmp_path), PROMPT, str(N_TOKENS), str(src), str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,  # not beside any libggml-cpu-*.so: the module must be found next to libggml
    )
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    if not res["runs"]:
        pytest.skip(f"this CPU cannot run the {variant} variant (ggml_backend_score 0)")
    assert res["llama_cpp"].startswith(str(root)), res["llama_cpp"]
    assert res["cpu_modules"] == [str(module)], res["cpu_modules"]
    assert res["kernel_best"] == kernel, f"{variant}: its kernel table runs {res['kernel_best']}, not {kernel}"
    a, b = res["tokens"][str(src)], res["tokens"][str(out)]
    la, lb = np.load(tmp_path / "logits-0.npy"), np.load(tmp_path / "logits-1.npy")
    assert len(set(a)) > 3  # not a degenerate model
    if kernel != "portable":
        # TQ2_0 runs its AVX2 kernel, whose arithmetic the contract is: the same bits, every step
        assert a == b, f"{variant}: greedy tokens differ\nTQ2_0: {a}\nBITCOS: {b}"
        np.testing.assert_array_equal(la, lb, err_msg=f"{variant}: logits not bit-identical to TQ2_0")
    else:
        # TQ2_0's generic C sums in another order (docs/KERNELS.md §1): the first tokens agree, and the next-token
        # distributions to float rounding (measured on x64: KLD <= 1.9e-4 per step)
        n = N_TOKENS_BELOW_AVX2
        assert a[:n] == b[:n], f"{variant}: first {n} greedy tokens differ\nTQ2_0: {a[:n]}\nBITCOS: {b[:n]}"
        kld = _kld(la[:n], lb[:n])
        assert kld.max() <= 1e-3, f"{variant}: KLD(TQ2_0 || BITCOS) per step up to {kld.max():.3g}"

    mm = subprocess.run(
        [str(root / "llama_cpp" / "bin" / "test-bitcos-mm"), "quick"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert mm.returncode == 0 and " 0 failures" in mm.stdout, (mm.stdout + mm.stderr)[-4000:]

    assert f"BITCOS CPU kernel: {kernel}" in r.stderr, f"{variant}: no 'BITCOS CPU kernel: {kernel}' in the load log"
