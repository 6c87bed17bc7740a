"""Build the patched llama-cpp-python (llama.cpp with BITCOS) for this machine: for this project's wheel
(`build_package`, run by the build backend in buildsys/ under `pip install .`) or on its own (`build`:
`ggml-bitcos build-llama`, scripts/build_llama.py, which also dispatches `--host` to ggml_bitcos.build_cross).

Both build the patched source tree (ggml_bitcos.build_tree: pinned sdist + csrc/ + C tests + patches/, stable and
synced by content) with that tree's own backend (scikit-build-core) in a stable CMake build directory
(<cache>/build, or <cache>/build-portable for GGML_BACKEND_DL builds), so ninja and ccache rebuild only what changed.
`build_package` unpacks the resulting `llama_cpp` package (bindings, shared libraries, llama_cpp/bin/{llama-cli,
llama-server,llama-bench,...}) into a folder that the project's root CMakeLists.txt installs into the ggml-bitcos
wheel, so one `pip install .` gives `from llama_cpp import Llama` on the patched library; `build` pip-installs the
tree as its own llama-cpp-python distribution (or into a --target folder).

The tree's and the cross build's names that callers use (BuildError, prepare_tree, copy_csrc, source_files,
CROSS_HOSTS, build_cross, ...) are importable from here as well.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from . import llama_tools, upstream
from .build_cross import CROSS_HOSTS, CROSS_TOOLS, CrossHost, build_cross, cross_build_dir, cross_tools_missing
from .build_tree import (
    BITCOS_SRC_DIR,
    BUILD_INFO,
    BuildError,
    apply_patches,
    build_lock,
    copy_csrc,
    csrc_destinations,
    forget_stale_options,
    log_tail,
    prepare_tree,
    run_logged,
    source_files,
    source_hash,
    stage_sources,
)

# the names other modules, scripts and tests take from here
__all__ = [
    "BITCOS_SRC_DIR",
    "BUILD_INFO",
    "CROSS_HOSTS",
    "CROSS_TOOLS",
    "BuildError",
    "CrossHost",
    "apply_patches",
    "build",
    "build_cross",
    "build_dir_for",
    "build_package",
    "cmake_args_for",
    "copy_csrc",
    "cross_build_dir",
    "cross_tools_missing",
    "csrc_destinations",
    "prepare_tree",
    "register",
    "source_files",
    "source_hash",
    "stage_sources",
]

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


def _isolation_args() -> list[str]:
    """pip builds the tree with this environment's scikit-build-core where it has one (no download: the build
    backend's environment, or a checkout's tools), else in pip's isolated build environment (a user's `pip install
    ggml-bitcos` carries no build tools)."""
    return ["--no-build-isolation"] if importlib.util.find_spec("scikit_build_core") is not None else []


def cmake_args_for(user_args: str | None) -> str:
    """Base args + ccache launcher (when installed) + the user's args last (they win)."""
    args = list(BASE_CMAKE_ARGS)
    if shutil.which("ccache"):
        args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    if user_args:
        args += shlex.split(user_args)
    return " ".join(shlex.quote(a) for a in args)


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
            *_isolation_args(),
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
        forget_stale_options(build_dir, env["CMAKE_ARGS"])
        _clear_installed_libs(tree)
        rc = run_logged(cmd, env, log, verbose)
    dt = time.monotonic() - t0
    if rc != 0:
        raise BuildError(f"pip install of the patched tree failed after {dt:.0f} s (log {log}):\n{log_tail(log)}")
    print(f"patched llama-cpp-python installed in {dt:.0f} s ({dt / 60:.1f} min)", flush=True)
    return tree


# The patched tree's own PEP 517 backend, run in a child process in the tree (its pyproject.toml): the same
# interpreter and packages as the caller (pip's isolated build environment under `pip install .`), no pip.
_WHEEL_SCRIPT = """import sys
from scikit_build_core.build import build_wheel
print("built wheel:", build_wheel(sys.argv[1], {"build-dir": sys.argv[2]}), flush=True)
"""


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
        forget_stale_options(build_dir, env["CMAKE_ARGS"])
        _clear_installed_libs(tree)
        with tempfile.TemporaryDirectory(prefix="wheel-", dir=cache) as out:
            rc = run_logged([sys.executable, "-c", _WHEEL_SCRIPT, out, str(build_dir)], env, log, verbose, cwd=tree)
            wheels = sorted(Path(out).glob("*.whl"))
            if rc != 0 or len(wheels) != 1:
                dt = time.monotonic() - t0
                raise BuildError(
                    f"building the patched llama-cpp-python failed after {dt:.0f} s (log {log}):\n{log_tail(log)}"
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
