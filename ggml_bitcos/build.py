"""Build the patched llama-cpp-python: for this project's wheel (`pip install .`, through the build backend
in buildsys/) or on its own (`ggml-bitcos build-llama`, scripts/build_llama.py).

Steps: fetch the pinned sdist (ggml_bitcos.upstream), extract it into a staging tree, copy csrc/ into
vendor/llama.cpp/ggml/src/ggml-bitcos/ (and the public headers ggml-bitcos.h, bitcos-format.h into
ggml/include/), copy the
C tests into .../ggml-bitcos/tests/, apply patches/*.patch in order, then build that tree with its own
backend (scikit-build-core). `build_package` unpacks the resulting `llama_cpp` package (bindings, shared
libraries, llama_cpp/bin/{llama-cli,llama-server,llama-bench,...}) into a folder that the project's root
CMakeLists.txt installs into the ggml-bitcos wheel, so one `pip install .` gives `from llama_cpp import Llama`
on the patched library; `build` (build-llama) pip-installs the tree as its own llama-cpp-python distribution
(or into a --target folder).

Incremental rebuilds: the staged tree is synced by content into one stable source directory
(<cache>/src/llama_cpp_python-<version>) — files whose bytes did not change keep their mtime — and the
CMake build directory (<cache>/build) is stable too, so ninja recompiles only what a change touches. (A
directory per patch hash would give a cold CMake build after every csrc edit; ccache alone cannot rescue it
because ggml's asserts embed absolute source paths.) ccache is used when installed.
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import llama_tools, upstream

REPO = Path(__file__).resolve().parent.parent
CSRC_DIR = REPO / "csrc"
PATCH_DIR = REPO / "patches"
CTEST_DIR = REPO / "tests" / "c"

LLAMA_DIR = "vendor/llama.cpp"
BITCOS_SRC_DIR = f"{LLAMA_DIR}/ggml/src/ggml-bitcos"
# Public headers of the patched ggml (also copied to ggml/include/): the API and the format's C layout.
PUBLIC_HEADERS = ("ggml-bitcos.h", "bitcos-format.h")
# csrc/vulkan/: the ggml-vulkan glue goes to ggml-bitcos/vulkan/; shaders (*.comp) and their includes (*.glsl)
# into ggml-vulkan's shader folder, where its build globs the shaders and the includes resolve
VULKAN_CSRC_DIR = CSRC_DIR / "vulkan"
VULKAN_SHADER_DIR = f"{LLAMA_DIR}/ggml/src/ggml-vulkan/vulkan-shaders"
SHADER_SUFFIXES = (".comp", ".glsl")
# csrc/sycl/, csrc/cuda/: the ggml-sycl and ggml-cuda glue and the device code each shares with its tests, to
# ggml-bitcos/sycl/ and ggml-bitcos/cuda/ (the backend patches add the glue to their targets and the folder to
# their include paths)
BACKEND_CSRC_DIRS = ("sycl", "cuda")

# llama.cpp tools the package installs into llama_cpp/bin (the llama-cpp-python tool-install patch).
TOOLS = ("llama-cli", "llama-completion", "llama-server", "llama-bench", "llama-perplexity")

BASE_CMAKE_ARGS = [
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DGGML_NATIVE=ON",
    "-DGGML_RPC=ON",  # ggml-rpc + rpc-server: a model split over machines (`--rpc host:port`)
]


# version label of the patched llama_cpp package (the version patch), checked at run time by llama_tools
PATCHED_VERSION_SUFFIX = llama_tools.PATCHED_VERSION_SUFFIX


class BuildError(RuntimeError):
    pass


def csrc_destinations() -> list[str]:
    """Paths (relative to the sdist root) that hold copies of this repository's C sources."""
    return [
        BITCOS_SRC_DIR,
        *(f"{LLAMA_DIR}/ggml/include/{h}" for h in PUBLIC_HEADERS),
        *(f"{VULKAN_SHADER_DIR}/{p.name}" for p in _vulkan_files() if p.suffix in SHADER_SUFFIXES),
    ]


def _csrc_files() -> list[Path]:
    return sorted(p for p in CSRC_DIR.iterdir() if p.suffix in (".c", ".h"))


def _vulkan_files() -> list[Path]:
    return sorted(p for p in VULKAN_CSRC_DIR.iterdir() if p.is_file()) if VULKAN_CSRC_DIR.is_dir() else []


def _backend_files(name: str) -> list[Path]:
    d = CSRC_DIR / name
    return sorted(p for p in d.iterdir() if p.is_file()) if d.is_dir() else []


def _tool_files() -> list[Path]:
    return sorted((CSRC_DIR / "tools").glob("*.c"))


def _ctest_files() -> list[Path]:
    return sorted([*CTEST_DIR.glob("*.c"), *CTEST_DIR.glob("*.h")]) if CTEST_DIR.is_dir() else []


def source_files() -> list[Path]:
    """Every file of this repository the patched tree is made from: patches, csrc (and its backend folders), C
    tests (the sdist must carry them all: tests/test_install.py)."""
    backends = [p for name in BACKEND_CSRC_DIRS for p in _backend_files(name)]
    return (
        sorted(PATCH_DIR.glob("*.patch")) + _csrc_files() + _vulkan_files() + backends + _tool_files() + _ctest_files()
    )


def source_hash() -> str:
    """Hash of everything that determines the patched tree: pinned sdist, patches, csrc, C tests."""
    h = hashlib.sha256(upstream.SDIST_SHA256.encode())
    for p in source_files():
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def copy_csrc(tree: Path) -> None:
    """Copy csrc/*.{c,h}, csrc/vulkan/, csrc/sycl/, csrc/cuda/ and tests/c/*.{c,h} into the sdist tree
    (replacing earlier copies)."""
    dest = tree / BITCOS_SRC_DIR
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for p in _csrc_files():
        shutil.copy2(p, dest / p.name)
    for header in PUBLIC_HEADERS:
        shutil.copy2(CSRC_DIR / header, tree / LLAMA_DIR / "ggml" / "include" / header)
    for p in _vulkan_files():
        target = tree / VULKAN_SHADER_DIR if p.suffix in SHADER_SUFFIXES else dest / "vulkan"
        target.mkdir(exist_ok=True)
        shutil.copy2(p, target / p.name)
    for name in BACKEND_CSRC_DIRS:
        files = _backend_files(name)
        if files:
            (dest / name).mkdir()
            for p in files:
                shutil.copy2(p, dest / name / p.name)
    tools = _tool_files()
    if tools:
        (dest / "tools").mkdir()
        for p in tools:
            shutil.copy2(p, dest / "tools" / p.name)
    if _ctest_files():
        (dest / "tests").mkdir()
        for p in _ctest_files():
            shutil.copy2(p, dest / "tests" / p.name)


def apply_patches(tree: Path) -> list[str]:
    """Apply patches/*.patch in order with `patch -p1`; any failure or fuzz is an error."""
    applied = []
    for patch in sorted(PATCH_DIR.glob("*.patch")):
        r = subprocess.run(
            ["patch", "-p1", "--forward", "--batch", "--fuzz=0", "-i", str(patch)],
            cwd=tree,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if r.returncode != 0:
            raise BuildError(
                f"patch {patch.name} does not apply to llama-cpp-python {upstream.SDIST_VERSION}:\n{r.stdout}"
            )
        applied.append(patch.name)
    return applied


def _sync_tree(src: Path, dst: Path) -> int:
    """Make dst identical to src, rewriting only files whose content differs. Returns files written."""
    written = 0
    dst.mkdir(parents=True, exist_ok=True)
    src_names = {p.name for p in src.iterdir()}
    for p in dst.iterdir():
        if p.name not in src_names:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    for p in src.iterdir():
        q = dst / p.name
        if p.is_dir() and not p.is_symlink():
            if q.exists() and not q.is_dir():
                q.unlink()
            written += _sync_tree(p, q)
        else:
            if q.is_dir():
                shutil.rmtree(q)
            if not q.exists() or not filecmp.cmp(p, q, shallow=False):
                shutil.copy2(p, q)
                os.utime(q)  # newer than any object built from the old content
                written += 1
    return written


def prepare_tree(work: Path | None = None) -> Path:
    """Return the patched source tree (stable path), re-staging it when patches/csrc/tests changed."""
    cache = work or upstream.cache_dir()
    stable = cache / "src" / upstream.SDIST_TOPDIR
    stamp = cache / "src" / ".bitcos-hash"
    digest = source_hash()
    if stable.is_dir() and stamp.exists() and stamp.read_text().strip() == digest:
        return stable
    stage = cache / f"stage-{digest}"
    if stage.exists():
        shutil.rmtree(stage)
    try:
        tree = upstream.extract_sdist(stage)
        copy_csrc(tree)
        names = apply_patches(tree)
        print(f"applied {len(names)} patches: {', '.join(names)}", flush=True)
        # build products written into the source tree by the package's install rules survive the sync
        keep = stable / "llama_cpp" / "lib"
        kept = None
        if keep.is_dir():
            kept = cache / "src" / ".lib-keep"
            if kept.exists():
                shutil.rmtree(kept)
            shutil.move(str(keep), str(kept))
        n = _sync_tree(tree, stable)
        if kept is not None:
            shutil.move(str(kept), str(keep))
        print(f"source tree {stable}: {n} files changed", flush=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    stamp.write_text(digest + "\n")
    return stable


def cmake_args_for(user_args: str | None) -> str:
    """Base args + ccache launcher (when installed) + the user's args last (they win)."""
    args = list(BASE_CMAKE_ARGS)
    if shutil.which("ccache"):
        args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    if user_args:
        args += shlex.split(user_args)
    return " ".join(shlex.quote(a) for a in args)


@contextlib.contextmanager
def build_lock(cache: Path) -> Iterator[None]:
    """One build at a time per cache (source tree + build dir): a second `pip install .` or build-llama waits
    here instead of running ninja in the same build directory concurrently."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    path = cache / "build.lock"
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another build of the patched llama.cpp in {cache} (lock {path})", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run_logged(
    cmd: list[str], env: dict[str, str], log: Path, verbose: bool, cwd: Path | None = None, mode: str = "w"
) -> int:
    with open(log, mode) as f:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            f.write(line)
            if verbose:
                sys.stdout.write(line)
        return proc.wait()


def _log_tail(log: Path, n: int = 60) -> str:
    return "".join(open(log, errors="replace").readlines()[-n:])


def _build_env(cmake_args: str | None, jobs: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env["CMAKE_ARGS"] = cmake_args_for(cmake_args)
    if jobs:
        env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(jobs)
    return env


def _cmake_bool(value: str) -> bool:
    return value.upper() in ("ON", "1", "TRUE", "YES", "Y")


def is_backend_dl(cmake_args: str) -> bool:
    """Whether the effective CMAKE_ARGS build ggml with GGML_BACKEND_DL (the last -DGGML_BACKEND_DL wins)."""
    on = False
    for arg in shlex.split(cmake_args):
        name, _, value = arg.removeprefix("-D").partition("=")
        if arg.startswith("-D") and name.split(":")[0] == "GGML_BACKEND_DL":
            on = _cmake_bool(value)
    return on


def build_dir_for(cache: Path, cmake_args: str) -> Path:
    """The stable CMake build dir: <cache>/build, or <cache>/build-portable for a GGML_BACKEND_DL build (the
    portable one, e.g. with GGML_CPU_ALL_VARIANTS: a CPU backend per ISA level). The two differ in almost every
    object's flags, so one dir each keeps both incremental when a machine (or CI) builds both."""
    return cache / ("build-portable" if is_backend_dl(cmake_args) else "build")


def _clear_installed_libs(tree: Path) -> None:
    """The patched tree's install rules copy every library into the source tree's llama_cpp/lib as well (the
    layout llama-cpp-python keeps for editable installs), and its wheel packs that folder: empty it before each
    build, so that a wheel holds this build's libraries only (not the libggml-cpu.so or libggml-vulkan.so of an
    earlier build with other options next to a portable build's CPU variants)."""
    shutil.rmtree(tree / "llama_cpp" / "lib", ignore_errors=True)


def _forget_stale_options(build_dir: Path, cmake_args: str) -> None:
    """CMake keeps every -D of an earlier configure in CMakeCache.txt (a -DGGML_VULKAN=ON stays on when the next
    build omits it), so when the effective CMAKE_ARGS differ from the last build's, start from a fresh cache; the
    objects stay, so ninja and ccache still rebuild only what the new options change."""
    stamp = build_dir / ".bitcos-cmake-args"
    cache_file = build_dir / "CMakeCache.txt"
    if cache_file.exists() and (not stamp.exists() or stamp.read_text() != cmake_args):
        print("  CMAKE_ARGS differ from the last build's: reconfiguring from a fresh CMake cache", flush=True)
        cache_file.unlink()
    build_dir.mkdir(parents=True, exist_ok=True)
    stamp.write_text(cmake_args)


def build(
    cmake_args: str | None = None,
    work: Path | None = None,
    jobs: int | None = None,
    log: Path | None = None,
    verbose: bool = False,
    target: Path | None = None,
) -> Path:
    """Build and pip-install the patched llama-cpp-python. cmake_args defaults to $CMAKE_ARGS.

    Returns the patched source tree. Raises BuildError with the log tail on failure.
    """
    t0 = time.monotonic()
    if cmake_args is None:
        cmake_args = os.environ.get("CMAKE_ARGS")
    cache = work or upstream.cache_dir()
    with build_lock(cache):
        tree = prepare_tree(cache)
        env = _build_env(cmake_args, jobs)
        build_dir = build_dir_for(cache, env["CMAKE_ARGS"])
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-build-isolation",
            "-v",
            f"--config-settings=build-dir={build_dir}",
            str(tree),
        ]
        if target is not None:  # a folder instead of this environment (e.g. a portable build for another machine)
            cmd += ["--no-deps", "--upgrade", "--target", str(target)]
        log = log or cache / "build-llama.log"
        print(
            f"building patched llama-cpp-python {upstream.SDIST_VERSION} (llama.cpp {upstream.LLAMA_CPP_COMMIT})",
            flush=True,
        )
        print(f"  CMAKE_ARGS={env['CMAKE_ARGS']}\n  build dir {build_dir}\n  log {log}", flush=True)
        _forget_stale_options(build_dir, env["CMAKE_ARGS"])
        _clear_installed_libs(tree)
        rc = _run_logged(cmd, env, log, verbose)
    dt = time.monotonic() - t0
    if rc != 0:
        raise BuildError(f"pip install of the patched tree failed after {dt:.0f} s (log {log}):\n{_log_tail(log)}")
    print(f"patched llama-cpp-python installed in {dt:.0f} s ({dt / 60:.1f} min)", flush=True)
    return tree


# The patched tree's own PEP 517 backend, run in a child process in the tree (its pyproject.toml): the same
# interpreter and packages as the caller (pip's isolated build environment under `pip install .`), no pip.
_WHEEL_SCRIPT = """import sys
from scikit_build_core.build import build_wheel
print("built wheel:", build_wheel(sys.argv[1], {"build-dir": sys.argv[2]}), flush=True)
"""

BUILD_INFO = "llama_build.json"


def build_package(
    stage: Path,
    cmake_args: str | None = None,
    work: Path | None = None,
    jobs: int | None = None,
    log: Path | None = None,
    verbose: bool = False,
) -> Path:
    """Build the patched llama-cpp-python's wheel in the incremental build dir (build_dir_for, as build-llama
    uses) and unpack its `llama_cpp` package into stage/llama_cpp (replaced), with stage/llama_build.json
    saying how it was built. Returns stage/llama_cpp. Used by the build backend (buildsys/) for the
    ggml-bitcos wheel. cmake_args defaults to $CMAKE_ARGS. Raises BuildError with the log tail on failure."""
    t0 = time.monotonic()
    if cmake_args is None:
        cmake_args = os.environ.get("CMAKE_ARGS")
    cache = work or upstream.cache_dir()
    log = log or cache / "build-llama.log"
    env = _build_env(cmake_args, jobs)
    build_dir = build_dir_for(cache, env["CMAKE_ARGS"])
    print(
        f"building patched llama-cpp-python {upstream.SDIST_VERSION} (llama.cpp {upstream.LLAMA_CPP_COMMIT})",
        flush=True,
    )
    print(f"  CMAKE_ARGS={env['CMAKE_ARGS']}\n  build dir {build_dir}\n  log {log}", flush=True)
    with build_lock(cache):
        tree = prepare_tree(cache)
        _forget_stale_options(build_dir, env["CMAKE_ARGS"])
        _clear_installed_libs(tree)
        with tempfile.TemporaryDirectory(prefix="wheel-", dir=cache) as out:
            rc = _run_logged([sys.executable, "-c", _WHEEL_SCRIPT, out, str(build_dir)], env, log, verbose, cwd=tree)
            wheels = sorted(Path(out).glob("*.whl"))
            if rc != 0 or len(wheels) != 1:
                dt = time.monotonic() - t0
                raise BuildError(
                    f"building the patched llama-cpp-python failed after {dt:.0f} s (log {log}):\n{_log_tail(log)}"
                )
            pkg = _unpack_package(wheels[0], "llama_cpp", stage)
    init = (pkg / "__init__.py").read_text()
    if PATCHED_VERSION_SUFFIX not in init:
        raise BuildError(f"{wheels[0].name}: llama_cpp/__init__.py has no {PATCHED_VERSION_SUFFIX} version")
    info = {
        "llama_cpp_python": upstream.SDIST_VERSION + PATCHED_VERSION_SUFFIX,
        "llama_cpp_commit": upstream.LLAMA_CPP_COMMIT,
        "source_hash": source_hash(),
        "user_cmake_args": cmake_args or "",
        "cmake_args": env["CMAKE_ARGS"],
    }
    (stage / BUILD_INFO).write_text(json.dumps(info, indent=1) + "\n")
    dt = time.monotonic() - t0
    print(f"patched llama-cpp-python built in {dt:.0f} s ({dt / 60:.1f} min): {pkg}", flush=True)
    return pkg


def _unpack_package(wheel: Path, package: str, stage: Path) -> Path:
    """Extract the wheel's top-level `package` folder into stage/package (replacing it), file modes kept."""
    dest = stage / package
    if dest.exists():
        shutil.rmtree(dest)
    stage.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if not info.filename.startswith(package + "/") or info.is_dir():
                continue
            out = stage / info.filename
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(out, mode)
    if not (dest / "__init__.py").is_file():
        raise BuildError(f"{wheel.name} has no {package}/ package")
    return dest


# Cross builds for another CPU (`build-llama --host TRIPLET --target DIR`): the patched llama.cpp's CPU backend and
# tools, built with a plain CMake configure of the staged tree's vendor/llama.cpp (the llama-cpp-python package and
# its bindings are for the machine that builds them, so they stay out).


@dataclass(frozen=True)
class CrossHost:
    """A foreign CPU build-llama can cross-build for: its GNU triplet's compilers and libraries (Debian's cross
    packages) and the explicit ISA that replaces -march=native."""

    triplet: str
    processor: str  # CMAKE_SYSTEM_PROCESSOR
    sysroot: Path  # the target's C library and libstdc++ (qemu-user's -L)
    arch_args: tuple[str, ...]
    apt_packages: tuple[str, ...]

    @property
    def cc(self) -> str:
        return f"{self.triplet}-gcc"

    @property
    def cxx(self) -> str:
        return f"{self.triplet}-g++"

    def emulator(self) -> list[str]:
        """How to run the build's programs on this machine (qemu-user with every ISA extension it emulates)."""
        return [f"qemu-{self.processor}", "-cpu", "max", "-L", str(self.sysroot)]


CROSS_HOSTS = {
    # Armv8.2-A + dotprod: Cortex-A76/Neoverse N1 (Raspberry Pi 5, Graviton 2) and everything newer (Apple M1+,
    # Graviton 3/4, Snapdragon X): the oldest cores with sdot/udot, on which llama.cpp's ARM kernels are fast.
    "aarch64-linux-gnu": CrossHost(
        triplet="aarch64-linux-gnu",
        processor="aarch64",
        sysroot=Path("/usr/aarch64-linux-gnu"),
        arch_args=("-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod",),
        apt_packages=("gcc-aarch64-linux-gnu", "g++-aarch64-linux-gnu", "qemu-user"),
    ),
}

# What a cross build makes and installs into DIR/bin: the llama.cpp tools, llama-debug (upstream's example that
# saves the last prompt token's logits: the tests compare them) and ggml-bitcos's C tools (as the tool-install
# patch builds them for the package).
CROSS_TOOLS = (
    "llama-cli",
    "llama-completion",
    "llama-bench",
    "llama-debug",
    "test-bitcos-mm",
    "test-bitcos-backend",
    "llama-bitcos-bench",
)

CROSS_CMAKE_ARGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_VULKAN=OFF",
    "-DGGML_CUDA=OFF",
    "-DGGML_SYCL=OFF",
    "-DGGML_RPC=OFF",
    "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",  # llama-cli is built on the server's code
    "-DLLAMA_BUILD_EXAMPLES=ON",  # llama-debug
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
]

_TOOLCHAIN = """# generated by ggml_bitcos.build (build-llama --host {triplet})
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR {processor})
set(CMAKE_C_COMPILER {cc})
set(CMAKE_CXX_COMPILER {cxx})
set(CMAKE_FIND_ROOT_PATH {sysroot})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
"""

# The build's top level: llama.cpp as a subdirectory, plus ggml-bitcos's C tools compiled from the sources the
# staged tree holds (the package build adds them through the tool-install patch to llama-cpp-python's
# CMakeLists.txt, which a cross build does not use). Executables and shared libraries are linked with their
# installed RPATH ($ORIGIN/../lib), so DIR/bin runs wherever DIR is copied.
_CROSS_PROJECT = """# generated by ggml_bitcos.build (build-llama --host {triplet})
cmake_minimum_required(VERSION 3.21)
project(ggml_bitcos_cross C CXX)
set(CMAKE_BUILD_WITH_INSTALL_RPATH ON)
set(CMAKE_INSTALL_RPATH "$ORIGIN/../lib")
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${{CMAKE_BINARY_DIR}}/bin)
add_subdirectory({llama} llama.cpp)
find_package(Threads REQUIRED)
set(BITCOS_DIR {llama}/ggml/src/ggml-bitcos)
add_executable(test-bitcos-mm ${{BITCOS_DIR}}/tests/test-bitcos-mm.c)
# its reference evaluates the kernels' arithmetic contract and must round the same way
target_compile_options(test-bitcos-mm PRIVATE -ffp-contract=off)
add_executable(test-bitcos-backend ${{BITCOS_DIR}}/tests/test-bitcos-backend.c)
add_executable(llama-bitcos-bench ${{BITCOS_DIR}}/tools/bitcos-bench.c)
foreach(tool test-bitcos-mm test-bitcos-backend llama-bitcos-bench)
    target_link_libraries(${{tool}} PRIVATE ggml ggml-base ggml-cpu m Threads::Threads)
endforeach()
"""


def _write_if_changed(path: Path, text: str) -> None:
    """Rewrite only on change: a new mtime would make ninja re-run CMake's configure step."""
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def cross_tools_missing(host: CrossHost) -> list[str]:
    """The programs a cross build for `host` needs that this machine lacks (compilers, cmake, ninja)."""
    return [t for t in (host.cc, host.cxx, "cmake", "ninja") if shutil.which(t) is None]


def cross_build_dir(host: CrossHost, work: Path | None = None) -> Path:
    return (work or upstream.cache_dir()) / f"build-{host.triplet}"


def build_cross(
    host: CrossHost,
    target: Path,
    cmake_args: str | None = None,
    work: Path | None = None,
    jobs: int | None = None,
    log: Path | None = None,
    verbose: bool = False,
) -> Path:
    """Cross-build the patched llama.cpp's CPU backend and CROSS_TOOLS for `host` in <cache>/build-<triplet>
    (incremental: ninja and ccache rebuild what changed) and install them into target/bin and target/lib, with
    target/llama_build.json saying how. cmake_args defaults to $CMAKE_ARGS (appended last). Returns target.
    Raises BuildError with the log tail on failure."""
    t0 = time.monotonic()
    if cmake_args is None:
        cmake_args = os.environ.get("CMAKE_ARGS")
    missing = cross_tools_missing(host)
    if missing:
        raise BuildError(
            f"cross-building for {host.triplet} needs {', '.join(missing)} "
            f"(Debian: apt-get install {' '.join(host.apt_packages)}; pip install cmake ninja)"
        )
    cache = work or upstream.cache_dir()
    build_dir = cross_build_dir(host, cache)
    log = log or cache / f"build-llama-{host.triplet}.log"
    args = ["-G", "Ninja", *CROSS_CMAKE_ARGS, *host.arch_args]
    if shutil.which("ccache"):
        args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    args += shlex.split(cmake_args or "")
    print(
        f"cross-building the patched llama.cpp {upstream.LLAMA_CPP_COMMIT} for {host.triplet}",
        flush=True,
    )
    print(f"  CMake options: {shlex.join(args)}\n  build dir {build_dir}\n  log {log}", flush=True)
    with build_lock(cache):
        tree = prepare_tree(cache)
        project = cache / "cross" / host.triplet
        fmt = {
            "triplet": host.triplet,
            "processor": host.processor,
            "cc": host.cc,
            "cxx": host.cxx,
            "sysroot": host.sysroot,
            "llama": (tree / LLAMA_DIR).as_posix(),
        }
        _write_if_changed(project / "toolchain.cmake", _TOOLCHAIN.format(**fmt))
        _write_if_changed(project / "CMakeLists.txt", _CROSS_PROJECT.format(**fmt))
        args.append(f"-DCMAKE_TOOLCHAIN_FILE={project / 'toolchain.cmake'}")
        _forget_stale_options(build_dir, shlex.join(args))
        configure = ["cmake", "-S", str(project), "-B", str(build_dir), *args]
        compile_ = ["cmake", "--build", str(build_dir), "--target", *CROSS_TOOLS]
        if jobs:
            compile_ += ["-j", str(jobs)]
        log.write_text("")
        for step in (configure, compile_):
            if _run_logged(step, dict(os.environ), log, verbose, mode="a") != 0:
                dt = time.monotonic() - t0
                raise BuildError(
                    f"cross build for {host.triplet} failed after {dt:.0f} s (log {log}):\n{_log_tail(log)}"
                )
        _install_cross(build_dir / "bin", target)
    info = {
        "host": host.triplet,
        "llama_cpp_commit": upstream.LLAMA_CPP_COMMIT,
        "source_hash": source_hash(),
        "cmake_args": shlex.join(args),
    }
    (target / BUILD_INFO).write_text(json.dumps(info, indent=1) + "\n")
    dt = time.monotonic() - t0
    print(
        f"cross build for {host.triplet} done in {dt:.0f} s ({dt / 60:.1f} min): {target}/bin, {target}/lib", flush=True
    )
    return target


def _install_cross(built: Path, target: Path) -> None:
    """CROSS_TOOLS into target/bin and every shared library of the build (symlinks kept) into target/lib,
    replacing what an earlier install left there."""
    for sub in ("bin", "lib"):
        if (target / sub).exists():
            shutil.rmtree(target / sub)
        (target / sub).mkdir(parents=True)
    for tool in CROSS_TOOLS:
        shutil.copy2(built / tool, target / "bin" / tool)
    for lib in sorted(built.glob("lib*.so*")):
        dest = target / "lib" / lib.name
        if lib.is_symlink():
            dest.symlink_to(os.readlink(lib))
        else:
            shutil.copy2(lib, dest)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `build-llama` to the ggml-bitcos CLI."""
    p = subparsers.add_parser(
        "build-llama",
        help="build and install the patched llama-cpp-python (llama.cpp with BITCOS)",
        description="Fetch the pinned llama-cpp-python sdist, apply patches/ and csrc/, and pip-install it. "
        "Extra CMake options come from $CMAKE_ARGS (e.g. -DGGML_VULKAN=ON) or --cmake-args.",
    )
    p.add_argument("--cmake-args", default=None, help="CMake options appended last (default: $CMAKE_ARGS)")
    p.add_argument("--work-dir", type=Path, default=None, help="cache dir (default ~/.cache/ggml-bitcos)")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel compile jobs")
    p.add_argument("-v", "--verbose", action="store_true", help="stream the build output")
    p.add_argument("--prepare-only", action="store_true", help="only stage the patched source tree")
    p.add_argument(
        "--target",
        type=Path,
        default=None,
        help="install the built llama_cpp package into this folder instead of this environment "
        "(with --host: where bin/ and lib/ go)",
    )
    p.add_argument(
        "--host",
        choices=sorted(CROSS_HOSTS),
        default=None,
        help="cross-build the CPU backend and tools for this CPU (with --target; needs its cross compilers)",
    )
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    try:
        if args.prepare_only:
            print(prepare_tree(args.work_dir))
        elif args.host is not None:
            if args.target is None:
                print("error: --host needs --target DIR (where bin/ and lib/ go)", file=sys.stderr)
                return 2
            host = CROSS_HOSTS[args.host]
            build_cross(host, args.target, args.cmake_args, work=args.work_dir, jobs=args.jobs, verbose=args.verbose)
        else:
            build(args.cmake_args, work=args.work_dir, jobs=args.jobs, verbose=args.verbose, target=args.target)
    except (BuildError, upstream.UpstreamError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
