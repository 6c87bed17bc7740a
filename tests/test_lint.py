"""The tree passes its linters and formatters: ruff (lint and format, settings in pyproject.toml) for Python and
clang-format (.clang-format) for every C and C++ source git tracks (generated files excepted, each named with its
reason in NOT_FORMATTED), at the versions the project pins (pyproject.toml's `lint` extra;
scripts/install.sh installs them). Without those tools the tests skip, except in CI, where a missing tool fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
C_SUFFIXES = (".c", ".h", ".cpp", ".hpp", ".cu", ".cuh", ".inc")
# Tracked C/C++ files clang-format does not check, each with the reason: generated files only.
NOT_FORMATTED = {
    "csrc/bitcos-kernels-list.h": "written by dev/kernel_manifest.py from csrc/bitcos-kernels.json; "
    "tests/test_kernel_manifest.py checks it is exactly the generator's output",
}


def tool(name: str) -> str:
    """The tool's path: the interpreter's scripts folder first (where pip put the pinned version)."""
    here = Path(sys.executable).parent / name
    path = str(here) if here.exists() else shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (scripts/install.sh installs the pinned version)")
        pytest.skip(f"{name} is not installed (pip install '.[lint]')")
    return path


def tracked_c_sources() -> list[str]:
    """Every C/C++ source git tracks, anywhere in the tree."""
    r = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
    return sorted(f for f in r.stdout.split("\0") if f.endswith(C_SUFFIXES))


def c_sources() -> list[str]:
    """The C/C++ sources clang-format checks: every tracked one but the generated files of NOT_FORMATTED."""
    return [f for f in tracked_c_sources() if f not in NOT_FORMATTED]


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_ruff_check():
    r = run(tool("ruff"), "check", "--output-format", "concise", ".")
    assert r.returncode == 0, r.stdout


def test_ruff_format():
    r = run(tool("ruff"), "format", "--check", ".")
    assert r.returncode == 0, r.stdout + "\nfix with: ruff format ."


def test_not_formatted_are_tracked_c_sources():
    """The exclusion list names tracked C/C++ files only (a moved or deleted file leaves it)."""
    assert set(NOT_FORMATTED) <= set(tracked_c_sources()), set(NOT_FORMATTED) - set(tracked_c_sources())


def test_clang_format():
    files = c_sources()
    assert {"csrc", "tests", "dev"} <= {f.split("/")[0] for f in files}
    r = run(tool("clang-format"), "--dry-run", "-Werror", "--style=file", *files)
    assert r.returncode == 0, r.stdout[-4000:] + "\nfix with: clang-format -i --style=file FILES"
