"""What the tests that install ggml-bitcos share (tests/test_install.py, tests/test_portable.py,
tests/test_readme_commands.py): the project's sdist, clean venvs with the package installed as a user installs it,
the portable build's options, and a stand-in for a stock llama_cpp."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# the build for other x86 machines, as llama.cpp's releases are made (docs/INSTALL.md): a CPU backend per ISA level
PORTABLE_CMAKE_ARGS = "-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF"


def build_sdist(out: Path) -> Path:
    """The project's sdist, built by its own backend (as `python -m build --sdist` does), in a child process."""
    code = (
        "import sys; sys.path.insert(0, 'buildsys'); import ggml_bitcos_backend as b; print(b.build_sdist(sys.argv[1]))"
    )
    r = subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out / r.stdout.strip().splitlines()[-1]


def make_venv(venv: Path) -> Path:
    """A clean venv (no system site-packages); returns its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    return venv / "bin"


def venv_env(venv: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a shell with the venv activated: its bin first on PATH, VIRTUAL_ENV set, no
    PYTHONPATH (nothing of the checkout leaks in)."""
    env = dict(os.environ if env is None else env)
    env.pop("PYTHONPATH", None)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    return env


def check_pip_log(text: str) -> None:
    """A pip install of ggml-bitcos built the patched llama.cpp with this project's backend, once, and installed
    no stock llama-cpp-python."""
    installed = text.rsplit("Successfully installed", 1)[-1].splitlines()[0]
    assert "ggml-bitcos-0.1.0" in installed and "llama" not in installed, installed
    assert text.count("building patched llama-cpp-python") == 1


def venv_install(venv: Path, source: str, log: Path, env: dict[str, str] | None = None) -> float:
    """A clean venv with `pip install -v SOURCE` (build isolation, deps from the index as a user gets them);
    returns the install's seconds. env: the environment (default: this one)."""
    make_venv(venv)
    t0 = time.monotonic()
    with open(log, "w") as f:
        r = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-v", source],
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=7200,
            cwd=venv,
            env=env,
        )
    dt = time.monotonic() - t0
    text = log.read_text()
    assert r.returncode == 0, text[-4000:]
    check_pip_log(text)
    return dt


def stock_llama_cpp(folder: Path) -> Path:
    """A stand-in for the stock llama-cpp-python package (no +bitcos version, no bin/), to put first on
    PYTHONPATH; returns the folder."""
    pkg = folder / "llama_cpp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('raise SystemExit("stock llama_cpp imported")\n__version__ = "0.3.36"\n')
    return folder
