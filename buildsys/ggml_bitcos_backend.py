"""PEP 517 build backend of ggml-bitcos: scikit-build-core, with the patched llama.cpp inside the wheel.

`pip install .` (a checkout or the sdist) runs build_wheel below, which
  1. builds the patched llama-cpp-python (pinned sdist + patches/ + csrc/) with ggml_bitcos.build.build_package
     in the incremental cache (~/.cache/ggml-bitcos or $GGML_BITCOS_CACHE: stable source tree and CMake build
     dir, ccache), CMAKE_ARGS passing through as with llama-cpp-python, one build at a time per cache;
  2. copies the files that build reads (ggml_bitcos.build.stage_sources: csrc/, patches/, tests/c/) into the same
     stage folder, as _data/;
  3. hands that folder to the root CMakeLists.txt (-DBITCOS_LLAMA_CPP_STAGE), which installs the `llama_cpp` package
     into the wheel next to ggml_bitcos, gguf_tools, the kernel harness libraries and the gguf-py start-up hook, and
     _data/ as ggml_bitcos/_data (where an installed `ggml-bitcos build-llama` finds its sources).
So one install gives `from llama_cpp import Llama` and the llama-* tools on the BITCOS build, and llama.cpp is
compiled once (never a stock llama-cpp-python first: the project does not depend on that distribution).
Everything else (sdist, metadata, requirements) is scikit-build-core's.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

from scikit_build_core import build as _skb

ROOT = Path(__file__).resolve().parent.parent

build_sdist = _skb.build_sdist
get_requires_for_build_sdist = _skb.get_requires_for_build_sdist
if hasattr(_skb, "prepare_metadata_for_build_wheel"):
    prepare_metadata_for_build_wheel = _skb.prepare_metadata_for_build_wheel
    prepare_metadata_for_build_editable = _skb.prepare_metadata_for_build_editable


def _bitcos_build():
    """ggml_bitcos.build of this source tree (standard library only: importable in pip's build environment)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from ggml_bitcos import build, upstream

    return build, upstream


def _extra_requires() -> list[str]:
    # the pinned llama-cpp-python sdist is fetched with `python -m pip download` (the user's index settings);
    # pip's isolated build environment has no pip of its own, so ask for one when the sdist is not cached yet
    _, upstream = _bitcos_build()
    if upstream.sdist_cached() or importlib.util.find_spec("pip") is not None:
        return []
    return ["pip"]


def get_requires_for_build_wheel(config_settings=None):
    return [*_skb.get_requires_for_build_wheel(config_settings), *_extra_requires()]


def get_requires_for_build_editable(config_settings=None):
    return [*_skb.get_requires_for_build_editable(config_settings), *_extra_requires()]


def _build(hook, wheel_directory, config_settings, metadata_directory):
    """Build the patched llama_cpp package into a fresh stage folder with the build's sources beside it, point the
    root CMakeLists.txt at it (cmake.define.BITCOS_LLAMA_CPP_STAGE) and run scikit-build-core's hook."""
    build, upstream = _bitcos_build()
    stage = Path(tempfile.mkdtemp(prefix="wheel-stage-", dir=upstream.cache_dir()))
    try:
        try:
            # the build's output goes to its log file and to stdout, which pip shows with -v (as for
            # llama-cpp-python's own CMake output) and on failure
            build.build_package(stage, verbose=True)
            build.stage_sources(stage / "_data")
        except (build.BuildError, upstream.UpstreamError) as e:
            print(f"ggml-bitcos: {e}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None
        settings = dict(config_settings or {})
        settings["cmake.define.BITCOS_LLAMA_CPP_STAGE"] = str(stage)
        return hook(wheel_directory, settings, metadata_directory)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _build(_skb.build_wheel, wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _build(_skb.build_editable, wheel_directory, config_settings, metadata_directory)
