"""BITCOS weights on a GPU backend that runs TQ2_0 but has no BITCOS kernels (Metal, or any backend that gains
TQ2_0): the llama.cpp loader creates each TQ2_0-exact weight there as TQ2_0, decoded on the host at load
(the loader patch "BITCOS weights as TQ2_0"; docs/GPU.md §1). Tested on lavapipe with the Vulkan backend made
such a backend by its test hook GGML_BITCOS_VULKAN_REFUSE=1 (it then refuses every BITCOS op): a BITCOS file offloaded then runs TQ2_0 on
the device and gives its TQ2_0 source's offloaded tokens and logits bit for bit; a weight TQ2_0 cannot hold
stays on the CPU, and the load log says why; GGML_BITCOS_TQ2_0=0 turns the path off.

Needs a Vulkan build and device, as tests/test_vulkan.py (BITCOS_REQUIRE_VULKAN=1 makes their absence a failure).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpu_offload import PROMPT, LazyModels, backend_bin, generate


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GGML_VK_VISIBLE_DEVICES", "0")
    env.pop("GGML_BITCOS_VULKAN_EXACT", None)
    env.pop("GGML_BITCOS_VULKAN_INT8", None)
    env["GGML_BITCOS_VULKAN_REFUSE"] = "1"
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def models(tmp_path_factory, patched_llama) -> LazyModels:
    backend_bin("vulkan", "Vulkan0", "BITCOS_REQUIRE_VULKAN", env=_env())
    return LazyModels(tmp_path_factory.mktemp("vk-tq2"))


TQ2_LINE = re.compile(r"BITCOS: (\d+) weights in (\S+) as TQ2_0 .*decoded in ([\d.]+) s")


@pytest.mark.parametrize("name", ["dense-b256", "dense-matrix", "moe-b256", "dense-pt"])
def test_offloaded_as_tq2_0_identical_to_source(models, tmp_path: Path, name: str) -> None:
    """Every weight goes to the device as real TQ2_0: prompt and decode are TQ2_0's own computation, so tokens and
    logits equal the TQ2_0 source's bit for bit."""
    src, out = models[name]
    t_src, l_src, _ = generate(src, tmp_path / "a.npz", -1, 16, env=_env())
    t_out, l_out, log = generate(out, tmp_path / "b.npz", -1, 16, env=_env())
    m = TQ2_LINE.search(log)
    assert m and m.group(2).startswith("Vulkan0"), log[-3000:]
    assert "stay on the CPU" not in log and "offloaded 3/3 layers" in log, log[-3000:]
    assert t_src.tolist() == t_out.tolist()
    assert np.array_equal(l_src, l_out), f"max |logit diff| {float(np.abs(l_src - l_out).max())}"
    assert len(set(t_src.tolist())) > 3  # not degenerate


def test_partial_offload(models, tmp_path: Path) -> None:
    """-ngl 2 (the output layer and one of the two repeating layers): that layer's weights run TQ2_0 on the
    device, the other's BITCOS on the CPU (which gives TQ2_0's greedy tokens, logits to rounding: test_e2e.py)."""
    src, out = models["dense-b256"]
    t_src, l_src, _ = generate(src, tmp_path / "a.npz", 2, 16, env=_env())
    t_out, l_out, log = generate(out, tmp_path / "b.npz", 2, 16, env=_env())
    m = TQ2_LINE.search(log)
    assert m and 0 < int(m.group(1)) < 14, log[-3000:]  # the tiny preset's 2 layers hold 14 ternary weights
    assert re.search(r"BITCOS: \d+ weights in CPU", log), log[-3000:]
    assert t_src.tolist() == t_out.tolist()
    assert float(np.abs(l_src - l_out).max()) <= 1e-3 * float(np.abs(l_src).max())


def test_not_tq2_0_exact_stays_on_cpu(models, tmp_path: Path) -> None:
    """Rows of 288 / 608 weights are not whole TQ2_0 blocks: those weights stay BITCOS on the CPU (the rest of
    each layer on the device) and the log says why, once per reason."""
    _, out = models["dense-matrix-k288"]
    tokens, logits, log = generate(out, tmp_path / "a.npz", -1, 8, env=_env())
    why = re.findall(
        r"BITCOS: (\d+) weights stay on the CPU: Vulkan0 runs TQ2_0, not BITCOS, and rows of (\d+) weights", log
    )
    assert sorted(why) == [("12", "288"), ("2", "608")] or len(why) == 4, log[-3000:]  # (the fit pass logs too)
    assert not TQ2_LINE.search(log) and len(tokens) == 8 and np.isfinite(logits).all()


def test_b128_split_scales_stay_on_cpu(tmp_path: Path, models) -> None:
    """A B128 weight whose 256-blocks hold two scales cannot be TQ2_0: it stays on the CPU, with the reason."""
    src, out = tmp_path / "g128-f16.gguf", tmp_path / "b128.gguf"
    for args in (
        ["make-model", "-o", str(src), "--preset", "tiny", "--type", "f16", "--scale", "g128", "--seed", "3", "-q"],
        ["convert", str(src), "-o", str(out), "--scale", "128"],
    ):
        r = subprocess.run([sys.executable, "-m", "ggml_bitcos", *args], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    _, _, log = generate(out, tmp_path / "a.npz", -1, 4, env=_env())
    assert "two scales in one 256-weight block" in log, log[-3000:]


def test_switch_off_keeps_bitcos_on_cpu(models, tmp_path: Path) -> None:
    _, out = models["dense-b256"]
    _, _, log = generate(out, tmp_path / "a.npz", -1, 4, env=_env(GGML_BITCOS_TQ2_0="0"))
    assert not TQ2_LINE.search(log) and re.search(r"BITCOS: \d+ weights in CPU", log), log[-3000:]


def test_prompt_identical_to_source(models, tmp_path: Path) -> None:
    """A multi-token prompt (the device's TQ2_0 matmul, not only its mat-vec) on a MoE model."""
    src, out = models["moe-b256"]
    _, l_src, _ = generate(src, tmp_path / "a.npz", -1, 2, prompt=PROMPT * 3, env=_env())
    _, l_out, _ = generate(out, tmp_path / "b.npz", -1, 2, prompt=PROMPT * 3, env=_env())
    assert np.array_equal(l_src, l_out)
