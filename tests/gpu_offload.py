"""What the GPU backends' end-to-end tests share (tests/test_vulkan.py on lavapipe in CI, tests/test_cuda_backend.py
on a lent GPU): the tiny models, built once per session on first use, and greedy generation in a fresh process.
One table for both, so a model that checks a format path on one backend checks it on the other too."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ggml_bitcos import llama_tools

REPO = Path(__file__).resolve().parent.parent
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"

# name: (make-model options, convert options); tiny llama, z = 0.42, seed 11. Version 1 (`--format-version 1`):
# G128, PT; version 2 (the default): a TQ2_0 source with block scales converts to B256 (its one fp16 scale per
# 256 weights), one with a scale per matrix to MATRIX. "dense-matrix-k288": F16 source rows of 288 and 608
# weights (attention and FFN inputs), so every version-2 weight ends in a partial 128-weight unit (32 and 96
# weights); no TQ2_0 twin.
GPU_MODELS: dict[str, tuple[list[str], list[str]]] = {
    "dense-g128": (["--type", "tq2_0", "--scale", "g128"], ["--format-version", "1", "--scale", "128"]),
    "dense-pt": (["--type", "tq2_0", "--scale", "tensor"], ["--format-version", "1", "--scale", "tensor"]),
    "moe-g128": (["--type", "tq2_0", "--scale", "g128", "--moe", "4"], ["--format-version", "1", "--scale", "128"]),
    "dense-b256": (["--type", "tq2_0", "--scale", "g128"], ["--scale", "256"]),
    "dense-matrix": (["--type", "tq2_0", "--scale", "tensor"], ["--scale", "tensor"]),
    "moe-b256": (["--type", "tq2_0", "--scale", "g128", "--moe", "4"], ["--scale", "256"]),
    "dense-matrix-k288": (
        ["--type", "f16", "--scale", "tensor", "--n-embd", "288", "--n-ff", "608"],
        ["--scale", "tensor"],
    ),
}


class LazyModels(dict):
    """name -> (source, BITCOS conversion) for GPU_MODELS, made in `directory` when first asked for."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory

    def __missing__(self, name: str) -> tuple[Path, Path]:
        make, conv = GPU_MODELS[name]
        src, out = self.directory / f"{name}-src.gguf", self.directory / f"{name}-bitcos.gguf"
        for args in (
            ["make-model", "-o", str(src), "--preset", "tiny", "--zero-density", "0.42", "--seed", "11", *make],
            ["convert", str(src), "-o", str(out), *conv],
        ):
            r = subprocess.run([sys.executable, "-m", "ggml_bitcos", *args], capture_output=True, text=True)
            assert r.returncode == 0, r.stdout + r.stderr
        self[name] = (src, out)
        return self[name]


_GENERATE = textwrap.dedent("""
    import sys
    import numpy as np
    from ggml_bitcos import llama_run
    model, out, n_tokens, ngl, mmap = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
    g = llama_run.greedy_generate(model, sys.argv[6], n_tokens, n_threads=1, use_mmap=mmap, n_gpu_layers=ngl,
                                  verbose=True)
    np.savez(out, tokens=np.array(g.tokens), logits=g.logits)
""")


def generate(
    model: Path,
    out: Path,
    ngl: int,
    n_tokens: int,
    prompt: str = PROMPT,
    mmap: bool = True,
    env: dict[str, str] | None = None,
) -> tuple[np.ndarray, np.ndarray, str]:
    """Greedy tokens and logits in a fresh process (the device is chosen by `env`), and llama.cpp's load log
    (stderr). One CPU thread: what stays on the CPU (embeddings, MoE routing) is then deterministic; upstream's
    2-thread CPU MoE path is not on a loaded host (see test_e2e)."""
    r = subprocess.run(
        [sys.executable, "-c", _GENERATE, str(model), str(out), str(n_tokens), str(ngl), "1" if mmap else "0", prompt],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    z = np.load(out)
    return z["tokens"], z["logits"], r.stderr


def backend_bin(backend: str, device: str, require_var: str, env: dict[str, str] | None = None) -> Path:
    """llama_cpp/bin of the installed patched build when it has the ggml backend `backend` (its library
    libggml-<backend>.so, e.g. "cuda", "vulkan") and test-bitcos-backend lists `device`; else the test skips, or
    fails when the environment sets `require_var` to 1 (a machine that must have that device)."""

    def unavailable(why: str):
        if os.environ.get(require_var) == "1":
            pytest.fail(f"{require_var}=1 but {why}")
        pytest.skip(why)

    pkg = llama_tools.llama_cpp_dir()
    assert pkg is not None
    if not list((pkg / "lib").glob(f"libggml-{backend}.so*")):
        unavailable(
            f"the installed llama.cpp has no {backend} backend "
            f"(CMAKE_ARGS=-DGGML_{backend.upper()}=ON ./scripts/install.sh)"
        )
    exe = pkg / "bin" / "test-bitcos-backend"
    if not exe.is_file():
        unavailable(f"{exe} is not built")
    r = subprocess.run([str(exe), "--list"], env=env, capture_output=True, text=True, timeout=120)
    if device not in r.stdout:
        unavailable(f"no {device} visible:\n{r.stdout}{r.stderr[-2000:]}")
    return pkg / "bin"
