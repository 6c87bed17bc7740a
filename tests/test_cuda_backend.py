"""BITCOS on ggml-cuda, end to end through the patched llama.cpp, on an NVIDIA GPU.

Needs a patched build with `-DGGML_CUDA=ON` and a CUDA device: on the project's machines (no NVIDIA GPU) these
tests skip; `dev/gpu_session.sh run` runs them on a lent GPU machine with BITCOS_REQUIRE_CUDA=1, which
turns a missing build or device into a failure. (tests/test_cuda.py tests the kernels themselves through a
standalone test program and their source through a host emulation; this module tests them inside ggml-cuda.)

- op level: llama_cpp/bin/test-bitcos-backend CUDA0: BITCOS MUL_MAT / MUL_MAT_ID on the device against the CPU
  backend (NMSE <= 5e-4; ggml-cuda has no TQ2_0 to compare with), every variant of format versions 1 and 2;
- end to end: tiny dense and MoE models converted to BITCOS (version 1: G128, PT; version 2: B256, MATRIX,
  MATRIX with rows ending in partial 128-weight units), offloaded to the GPU vs on the CPU: the same greedy
  tokens, prompt logits close, every BITCOS weight in the device's buffer;
- device memory: the BITCOS weights take their file bytes on the device, less than TQ2_0's.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ggml_bitcos.format import BITCOS_TYPE_IDS, COMPANION_SUFFIX
from gpu_offload import GPU_MODELS, LazyModels, backend_bin, generate

DEVICE = "CUDA0"


@pytest.fixture(scope="session")
def cuda_build(patched_llama) -> Path:
    """llama_cpp/bin of a patched build with ggml-cuda and a CUDA device; skips (or fails under
    BITCOS_REQUIRE_CUDA=1) otherwise."""
    return backend_bin("cuda", DEVICE, "BITCOS_REQUIRE_CUDA")


def test_op_level_against_cpu(cuda_build: Path) -> None:
    r = subprocess.run([str(cuda_build / "test-bitcos-backend"), DEVICE], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    m = re.search(r"(\d+) checks, 0 failures", r.stdout)
    assert m and int(m.group(1)) > 200, r.stdout[-2000:]
    assert "skipped" not in r.stdout, r.stdout[-3000:]  # every variant runs on the device


@pytest.fixture(scope="session")
def models(tmp_path_factory, cuda_build) -> dict[str, tuple[Path, Path]]:
    """(source, BITCOS conversion) per gpu_offload.GPU_MODELS entry (the Vulkan test's models), built on first use."""
    return LazyModels(tmp_path_factory.mktemp("cuda"))


def _tensor_mib(model: Path, pick) -> float:
    from gguf_tools import open_gguf  # the bounded, checked reader (issue 30), not gguf-py's alone

    return sum(int(t.n_bytes) for t in open_gguf(model).tensors if pick(t)) / 2**20


def _bitcos_mib(model: Path) -> float:
    """MiB of the model's BITCOS weights and their companions in the file."""
    return _tensor_mib(model, lambda t: int(t.tensor_type) in BITCOS_TYPE_IDS or t.name.endswith(COMPANION_SUFFIX))


@pytest.mark.parametrize("name", list(GPU_MODELS))
def test_offloaded_bitcos_same_tokens_as_cpu(models, tmp_path: Path, name: str) -> None:
    """All layers on the GPU vs all on the CPU: the first 4 greedy tokens identical and the prompt's logits
    within 2e-2 of the largest (every op of the graph rounds differently on the device, and the batched
    BITCOS path quantizes activations to int8 per 32 as ggml-cuda's MMQ does; ggml-vulkan on lavapipe differs
    from the CPU by 1.4-1.6e-2 for these models). The CPU keeps only the embeddings: every BITCOS weight is
    in CUDA0's buffer (a backend refusing its type would leave it on the CPU)."""
    _, out = models[name]
    t_gpu, l_gpu, log = generate(out, tmp_path / "gpu.npz", ngl=-1, n_tokens=4)
    assert re.search(r"offloaded (\d+)/\1 layers", log), log[-3000:]
    device = sum(float(m) for m in re.findall(rf"{DEVICE} model buffer size =\s*([0-9.]+) MiB", log))
    assert device >= _bitcos_mib(out), (device, _bitcos_mib(out), log[-3000:])
    t_cpu, l_cpu, _ = generate(out, tmp_path / "cpu.npz", ngl=0, n_tokens=4)
    print(
        json.dumps(
            {
                "model": name,
                "tokens_gpu": t_gpu.tolist(),
                "tokens_cpu": t_cpu.tolist(),
                "max_prompt_logit_diff": float(np.abs(l_gpu[0] - l_cpu[0]).max()),
                "max_prompt_logit": float(np.abs(l_cpu[0]).max()),
            }
        )
    )
    assert t_gpu.tolist() == t_cpu.tolist()
    assert float(np.abs(l_gpu[0] - l_cpu[0]).max()) <= 2e-2 * float(np.abs(l_cpu[0]).max())
    assert len(set(t_gpu.tolist())) > 2  # not degenerate


def test_device_memory_bitcos_vs_tq2_0(models, tmp_path: Path) -> None:
    """The capacity win on the device: CUDA0 holds the BITCOS weights (file bytes, companions included) and
    they are smaller than the TQ2_0 source's weights (ggml-cuda cannot offload TQ2_0 itself; its file bytes
    are what a backend with TQ2_0 would hold)."""
    src, out = models["dense-pt"]
    _, _, log = generate(out, tmp_path / "gpu.npz", ngl=-1, n_tokens=1)
    device = sum(float(m) for m in re.findall(rf"{DEVICE} model buffer size =\s*([0-9.]+) MiB", log))
    bitcos = _bitcos_mib(out)
    tq2_0 = _tensor_mib(src, lambda t: t.tensor_type.name == "TQ2_0")
    print(json.dumps({"device_MiB_bitcos_model": device, "bitcos_weights_MiB": bitcos, "tq2_0_weights_MiB": tq2_0}))
    assert bitcos <= device and bitcos < tq2_0
