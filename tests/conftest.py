"""Shared fixtures. Tests run from a checkout (PYTHONPATH or this file puts the repo root on sys.path)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def model_factory(tmp_path_factory: pytest.TempPathFactory):
    """make_model with a session cache: factory(name, **kwargs) -> path (each distinct model made once)."""
    from dataclasses import replace

    from ggml_bitcos.make_model import PRESETS, make_model

    cache: dict[tuple, Path] = {}
    folder = tmp_path_factory.mktemp("models")

    def factory(
        *,
        z: float = 0.4,
        scale: str = "tensor",
        src_type: str = "tq2_0",
        moe: int = 0,
        seed: int = 0,
        **shape_overrides,
    ) -> Path:
        key = (z, scale, src_type, moe, seed, tuple(sorted(shape_overrides.items())))
        if key not in cache:
            shape = replace(PRESETS["tiny"], **shape_overrides)
            if moe:
                shape = replace(shape, n_expert=moe, n_expert_used=2)
            path = folder / f"m{len(cache)}.gguf"
            make_model(path, shape, z=z, scale_mode=scale, src_type=src_type, seed=seed, progress=False)
            cache[key] = path
        return cache[key]

    return factory


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow", action="store_true", default=False, help="also run tests marked slow (or set GGML_BITCOS_SLOW=1)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import os

    if config.getoption("--run-slow") or os.environ.get("GGML_BITCOS_SLOW") == "1":
        return
    # `-m slow` (or any -m expression naming slow) selects them explicitly
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: use --run-slow or GGML_BITCOS_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def patched_llama() -> None:
    """Skip unless the patched llama.cpp build is installed (fail instead under BITCOS_REQUIRE_LLAMA=1)."""
    import os

    from ggml_bitcos import llama_run

    if not llama_run.is_patched():
        if os.environ.get("BITCOS_REQUIRE_LLAMA") == "1":
            pytest.fail("patched llama.cpp is not installed but BITCOS_REQUIRE_LLAMA=1")
        pytest.skip("patched llama.cpp not installed (run scripts/install.sh)")


@pytest.fixture(scope="session")
def radv_null_isa():
    """`dev.gpu_isa` measured once on RADV's null gfx1100 device: TQ2_0 and the v2 BITCOS pipelines at 1 and
    4 columns, as (DeviceParams, [Result]). Skips without the null device, glslc, a C/C++ compiler or the
    pinned sdist in the cache (fails instead under BITCOS_REQUIRE_RADV_NULL=1, as in CI)."""
    import os

    from ggml_bitcos import upstream
    from dev import gpu_isa

    missing = [t for t in ("glslc", "cc", "c++") if shutil.which(t) is None]
    if not upstream.sdist_cached():
        missing.append(f"the pinned sdist in {upstream.cache_dir()}")
    if not missing and not gpu_isa.radv_null_available():
        missing.append("RADV's null device (mesa-vulkan-drivers, libvulkan-dev)")
    if missing:
        if os.environ.get("BITCOS_REQUIRE_RADV_NULL") == "1":
            pytest.fail(f"BITCOS_REQUIRE_RADV_NULL=1 but missing: {', '.join(missing)}")
        pytest.skip(f"missing: {', '.join(missing)}")
    ((_, params, results),) = gpu_isa.run_all(["gfx1100"], (1, 4), types=["tq2_0", "bitcos"])
    return params, results


@pytest.fixture(scope="session")
def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def load_kernel_library() -> str | None:
    """Loads both kernel harness libraries (FMA and no-FMA), building them into build/kernels with cmake (as
    docs/KERNELS.md describes) when neither installed nor built. Returns None, or why they cannot be had."""
    from ggml_bitcos import harness

    try:
        harness.load_library(False)
        harness.load_library(True)
        return None
    except harness.KernelLibraryNotFound:
        pass
    if shutil.which("cmake") is None:
        return "libbitcos_kernels.so not built and cmake not available"
    build = ROOT / "build" / "kernels"
    subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"], check=True, capture_output=True
    )
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)
    harness.load_library.cache_clear()
    harness.load_library(False)
    harness.load_library(True)
    return None


@pytest.fixture(scope="session")
def kernel_library() -> ctypes.CDLL:
    """Both kernel harness libraries loaded (load_kernel_library), skipping when that is impossible. Returns the
    FMA library."""
    from ggml_bitcos import harness

    reason = load_kernel_library()
    if reason is not None:
        pytest.skip(reason)
    return harness.load_library(True)


@pytest.fixture(scope="session")
def tq2_vec_dot(kernel_library, cpu_flags: set[str]):
    """(TQ2_0's vec_dot from the installed ggml, the FMA form it uses, its library): the reference of
    tests/tq2_reference.py; needs the kernel harness libraries (kernel_library) to compare with."""
    import tq2_reference

    ref = tq2_reference.load_tq2_vec_dot(cpu_flags)
    if ref is None:
        pytest.skip("llama_cpp (patched llama-cpp-python) is not installed: no libggml-cpu.so to compare with")
    return ref


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test with an `impl` argument runs once per kernel of the harness library's kernel table, by the names
    the library itself gives (csrc/bitcos-kernels-table.c through ggml_bitcos.harness.kernel_names), so a new
    kernel is tested without a list to update here; without the library, once as "generic" (its
    kernel_library fixture then skips)."""
    if "impl" not in metafunc.fixturenames:
        return
    from ggml_bitcos import harness

    names = harness.kernel_names() if load_kernel_library() is None else ("generic",)
    metafunc.parametrize("impl", names)


@pytest.fixture(scope="session")
def aarch64_llama() -> Path:
    """The patched llama.cpp cross-built for aarch64 (ggml_bitcos.build.build_cross) into <cache>/aarch64-linux-gnu
    (bin/, lib/): incremental in <cache>/build-aarch64-linux-gnu, so a warm build only checks that nothing
    changed. Skips without the cross toolchain, qemu-user, cmake or ninja (fails instead under
    BITCOS_REQUIRE_AARCH64=1, as CI sets it: scripts/install.sh installs them). CMAKE_ARGS is not passed on: it
    holds the x86 build's options (-DGGML_VULKAN=ON in CI)."""
    import os

    from ggml_bitcos import build, upstream

    host = build.CROSS_HOSTS["aarch64-linux-gnu"]
    missing = build.cross_tools_missing(host) + [e for e in host.emulator()[:1] if shutil.which(e) is None]
    if missing:
        why = f"no aarch64 cross build: {', '.join(missing)} missing (apt-get install {' '.join(host.apt_packages)})"
        if os.environ.get("BITCOS_REQUIRE_AARCH64") == "1":
            pytest.fail(f"{why} but BITCOS_REQUIRE_AARCH64=1")
        pytest.skip(why)
    target = upstream.cache_dir() / host.triplet
    try:
        build.build_cross(host, target, cmake_args="")
    except build.BuildError as e:
        pytest.fail(str(e))
    return target


@pytest.fixture(scope="session")
def llvm_mca() -> str:
    """llvm-mca and clang 19 for the static model (`python3 -m dev.mca`): the llvm-mca path; skips without
    them (fails instead under BITCOS_REQUIRE_MCA=1, as CI sets it: scripts/install.sh installs both)."""
    import os

    from dev import mca

    path = mca.llvm_mca_path()
    if path is None or mca.find_tool(("clang-19", "clang")) is None:
        if os.environ.get("BITCOS_REQUIRE_MCA") == "1":
            pytest.fail("llvm-mca or clang is missing but BITCOS_REQUIRE_MCA=1")
        pytest.skip("no llvm-mca / clang (apt-get install llvm-19 clang-19)")
    return path
