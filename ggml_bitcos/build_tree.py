"""The patched llama.cpp source tree, and what every build of it shares (ggml_bitcos.build: the package and
build-llama; ggml_bitcos.build_cross: other CPUs).

The tree is made from the pinned llama-cpp-python sdist (ggml_bitcos.upstream) and this project's build sources:
csrc/ (with its vulkan/, sycl/, cuda/ and tools/ folders) is copied into vendor/llama.cpp/ggml/src/ggml-bitcos/
(the public headers ggml-bitcos.h, bitcos-format.h into ggml/include/, the Vulkan shaders into ggml-vulkan's shader
folder), the C tests of tests/c/ into .../ggml-bitcos/tests/, then patches/*.patch are applied in order.

Where the build sources are: in a checkout or unpacked sdist, its csrc/, patches/ and tests/c/; in an installed
wheel, the copy the build backend put into it (ggml_bitcos/_data/, the same relative paths: stage_sources), so
`ggml-bitcos build-llama` works from any folder. Both give the same source_hash for the same files, so an installed
build-llama reuses the tree and build directories a `pip install .` left in the cache.

Incremental rebuilds: the staged tree is synced by content into one stable source directory
(<cache>/src/llama_cpp_python-<version>) - files whose bytes did not change keep their mtime - and the CMake build
directories are stable too, so ninja recompiles only what a change touches. (A directory per patch hash would give
a cold CMake build after every csrc edit; ccache alone cannot rescue it because ggml's asserts embed absolute source
paths.) One build at a time per cache (build_lock).
"""

from __future__ import annotations

import contextlib
import filecmp
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from . import upstream

# the checkout (or unpacked sdist) this package runs from, and the folder an installed wheel keeps the build sources
# in (the root CMakeLists.txt installs the backend's staged copy there)
CHECKOUT_DIR = Path(__file__).resolve().parent.parent
PACKAGE_DATA_DIR = Path(__file__).resolve().parent / "_data"


def _source_root() -> Path:
    return PACKAGE_DATA_DIR if (PACKAGE_DATA_DIR / "csrc").is_dir() else CHECKOUT_DIR


SOURCE_ROOT = _source_root()
CSRC_DIR = SOURCE_ROOT / "csrc"
PATCH_DIR = SOURCE_ROOT / "patches"
CTEST_DIR = SOURCE_ROOT / "tests" / "c"

# what build-llama and build_package write next to their output: how it was built (the wheel's copy is read by
# ggml_bitcos.llama_tools)
BUILD_INFO = "llama_build.json"


class BuildError(RuntimeError):
    pass


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


def csrc_destinations() -> list[str]:
    """Paths (relative to the sdist root) that hold copies of this repository's C sources."""
    return [
        BITCOS_SRC_DIR,
        *(f"{LLAMA_DIR}/ggml/include/{h}" for h in PUBLIC_HEADERS),
        *(f"{VULKAN_SHADER_DIR}/{p.name}" for p in _vulkan_files() if p.suffix in SHADER_SUFFIXES),
    ]


def _csrc_files() -> list[Path]:
    return sorted(p for p in CSRC_DIR.iterdir() if p.suffix in (".c", ".cpp", ".h"))


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


def require_sources() -> None:
    """Raise BuildError saying what is missing when neither a wheel's copy nor a checkout holds the build
    sources (e.g. a wheel built without this project's build backend)."""
    missing = [d for d in (CSRC_DIR, PATCH_DIR) if not d.is_dir()]
    if missing:
        raise BuildError(
            f"no build sources for the patched llama.cpp: {', '.join(map(str, missing))} missing (an installed "
            f"ggml-bitcos keeps them in {PACKAGE_DATA_DIR}, a checkout in csrc/ and patches/); reinstall "
            "ggml-bitcos with pip from its sdist or checkout, or run build-llama from a checkout"
        )


def stage_sources(dest: Path) -> list[Path]:
    """Copy source_files() into dest at their paths relative to the source root (dest replaced): what the build
    backend puts into the wheel as ggml_bitcos/_data, so that an installed package finds exactly the files a
    checkout's build reads, and hashes them alike. Returns the copies."""
    require_sources()
    if dest.exists():
        shutil.rmtree(dest)
    copies = []
    for p in source_files():
        q = dest / p.relative_to(SOURCE_ROOT)
        q.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, q)
        copies.append(q)
    return copies


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
    require_sources()
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


@contextlib.contextmanager
def build_lock(cache: Path) -> Iterator[None]:
    """One build at a time per cache (source tree + build dir): a second `pip install .` or build-llama waits
    here instead of running ninja in the same build directory concurrently."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    cache.mkdir(parents=True, exist_ok=True)  # a --work-dir not made yet
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


def run_logged(
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


def log_tail(log: Path, n: int = 60) -> str:
    return "".join(open(log, errors="replace").readlines()[-n:])


def forget_stale_options(build_dir: Path, cmake_args: str) -> None:
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
