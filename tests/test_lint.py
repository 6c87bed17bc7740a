"""The tree passes its linters and formatters: ruff (lint and format, settings in pyproject.toml) for Python and
clang-format (.clang-format) for C and C++, at the versions the project pins (pyproject.toml's `lint` extra;
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
C_GLOBS = ("*.c", "*.h", "*.cpp", "*.hpp", "*.cu", "*.cuh", "*.inc")
C_FOLDERS = ("csrc", "tests", "dev")


def tool(name: str) -> str:
    """The tool's path: the interpreter's scripts folder first (where pip put the pinned version)."""
    here = Path(sys.executable).parent / name
    path = str(here) if here.exists() else shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (scripts/install.sh installs the pinned version)")
        pytest.skip(f"{name} is not installed (pip install '.[lint]')")
    return path


def c_sources() -> list[str]:
    r = subprocess.run(
        [
            "git",
            "ls-files",
            *(f"{d}/**/{g}" for d in C_FOLDERS for g in C_GLOBS),
            *(f"{d}/{g}" for d in C_FOLDERS for g in C_GLOBS),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    return sorted(set(r.stdout.split()))


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_ruff_check():
    r = run(tool("ruff"), "check", "--output-format", "concise", ".")
    assert r.returncode == 0, r.stdout


def test_ruff_format():
    r = run(tool("ruff"), "format", "--check", ".")
    assert r.returncode == 0, r.stdout + "\nfix with: ruff format ."


def test_clang_format():
    files = c_sources()
    assert any(f.startswith("csrc/") for f in files)
    r = run(tool("clang-format"), "--dry-run", "-Werror", "--style=file", *files)
    assert r.returncode == 0, r.stdout[-4000:] + "\nfix with: clang-format -i --style=file FILES"
