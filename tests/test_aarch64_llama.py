"""The patched llama.cpp cross-built for aarch64 (`ggml-bitcos build-llama --host aarch64-linux-gnu`, the
aarch64_llama fixture) and run under qemu-user: a BITCOS model must behave there as its TQ2_0 source does, dense
and MoE, and the load log must name the BITCOS kernel that runs; its test-bitcos-mm checks BITCOS MUL_MAT /
MUL_MAT_ID through that CPU backend against the kernels' arithmetic contract.

TQ2_0 runs upstream's NEON vec_dot there, BITCOS the kernel the aarch64 build's table picks, so their logits
agree to rounding (1e-3 of the largest, as on x86: tests/test_e2e.py), not bit for bit. Emulation says nothing
about speed. Without the cross toolchain or qemu-user these tests skip, except under BITCOS_REQUIRE_AARCH64=1
(set by .ci/run), where that is a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ggml_bitcos import build

HOST = build.CROSS_HOSTS["aarch64-linux-gnu"]
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
N_TOKENS = 16
# The kernels an aarch64 build can name at load (the kernel table's names, docs/KERNELS.md): NEON ones where the
# build's ISA has them, else the portable kernel; never the generic reference, never an x86 kernel.
AARCH64_KERNELS = ("neon-i8mm", "neon-dotprod", "neon", "portable")
KERNEL_LINE = re.compile(r"BITCOS CPU kernel: (\S+)")

# name -> make-model options of the TQ2_0 source (z = 0.42, a scale per 256 weights: convert writes B256)
PAIRS = {
    "dense": ["--scale", "g128"],
    "moe": ["--scale", "g128", "--moe", "4"],
}


def _cli(*args: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ggml_bitcos", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert r.returncode == 0, f"ggml-bitcos {' '.join(args)} failed:\n{r.stdout[-3000:]}"


@pytest.fixture(scope="module")
def arm_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """(TQ2_0 source, its BITCOS conversion) of a tiny dense llama and a tiny MoE one."""
    d = tmp_path_factory.mktemp("aarch64")
    pairs = {}
    for name, make in PAIRS.items():
        src, out = d / f"{name}-tq2_0.gguf", d / f"{name}-bitcos.gguf"
        _cli("make-model", "-o", str(src), "--preset", "tiny", "--zero-density", "0.42", "--seed", "7", *make)
        _cli("convert", str(src), "-o", str(out))
        pairs[name] = (src, out)
    return pairs


def _run_arm(
    prefix: Path, tool: str, *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """One of the aarch64 build's tools under qemu-user (-cpu max: every extension the build may use); `env`:
    variables added to its environment."""
    cmd = [*HOST.emulator(), str(prefix / "bin" / tool), *args]
    r = subprocess.run(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **env} if env else None,
    )
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-4000:]}"
    return r


def _completion(prefix: Path, model: Path) -> subprocess.CompletedProcess[str]:
    """Greedy llama-completion of N_TOKENS tokens, one thread (upstream's TQ2_0 MoE path is not deterministic
    with more on a loaded host: tests/test_e2e.py)."""
    return _run_arm(
        prefix,
        "llama-completion",
        *("-m", str(model), "-p", PROMPT, "-n", str(N_TOKENS), "--temp", "0", "--top-k", "1", "--seed", "0"),
        *("-t", "1", "-no-cnv", "--no-warmup", "--simple-io", "-c", "512"),
    )


def _last_logits(prefix: Path, model: Path, out_dir: Path, env: dict[str, str] | None = None) -> np.ndarray:
    """The logits of the prompt's last token, saved by upstream's llama-debug (--save-logits writes them as raw
    float32 into <dir>/llamacpp-<model stem>.bin)."""
    _run_arm(
        prefix,
        "llama-debug",
        *("-m", str(model), "-p", PROMPT, "-t", "1", "-c", "512", "--no-warmup"),
        *("--save-logits", "--logits-output-dir", str(out_dir)),
        env=env,
    )
    return np.fromfile(out_dir / f"llamacpp-{model.stem}.bin", dtype=np.float32)


@pytest.mark.parametrize("name", list(PAIRS))
def test_aarch64_completion_identical_text(aarch64_llama: Path, arm_pairs, name: str) -> None:
    src, out = arm_pairs[name]
    a = _completion(aarch64_llama, src).stdout
    b = _completion(aarch64_llama, out).stdout
    assert a == b, f"{name}: aarch64 greedy text differs\nTQ2_0:  {a!r}\nBITCOS: {b!r}"
    generated = a[a.find(PROMPT) + len(PROMPT) :] if PROMPT in a else a
    # the model must not be degenerate, or equality would prove little
    assert len(set(generated.split())) > 3, f"{name}: degenerate generation {a!r}"


@pytest.mark.parametrize("name", list(PAIRS))
def test_aarch64_logits_match_tq2(aarch64_llama: Path, arm_pairs, tmp_path: Path, name: str) -> None:
    src, out = arm_pairs[name]
    a = _last_logits(aarch64_llama, src, tmp_path / "tq2_0")
    b = _last_logits(aarch64_llama, out, tmp_path / "bitcos")
    assert a.shape == b.shape and a.size > 1000, (a.shape, b.shape)
    assert np.isfinite(a).all() and np.isfinite(b).all()
    scale = float(np.max(np.abs(a)))
    diff = float(np.max(np.abs(a - b)))
    print(f"{name}: aarch64 max |logit diff| {diff:.3g} (largest |logit| {scale:.3g})")
    assert diff <= 1e-3 * scale, f"{name}: max |logit diff| {diff} > 1e-3 * {scale}"
    assert int(np.argmax(a)) == int(np.argmax(b))


@pytest.mark.parametrize("name", list(PAIRS))
def test_aarch64_cpu_forms_bit_identical(aarch64_llama: Path, arm_pairs, tmp_path: Path, name: str) -> None:
    """The 2-bit codes form (decoded at load, the NEON codes kernels) and the BITCOS form give the same logits
    bit for bit on aarch64 too (docs/KERNELS.md §8-9)."""
    _, out = arm_pairs[name]
    a = _last_logits(aarch64_llama, out, tmp_path / "bitcos", env={"GGML_BITCOS_CPU_FORM": "bitcos"})
    b = _last_logits(aarch64_llama, out, tmp_path / "2bit", env={"GGML_BITCOS_CPU_FORM": "2bit"})
    assert a.size > 1000 and np.array_equal(a, b), f"{name}: max |diff| {float(np.max(np.abs(a - b)))}"


def test_aarch64_load_log_names_kernel(aarch64_llama: Path, arm_pairs) -> None:
    """The log names the BITCOS kernel once, and it is one an aarch64 build has."""
    _, out = arm_pairs["dense"]
    log = _completion(aarch64_llama, out).stderr
    names = KERNEL_LINE.findall(log)
    assert names, f"no 'BITCOS CPU kernel: <name>' line in the log:\n{log[-3000:]}"
    assert len(set(names)) == 1 and names[0] in AARCH64_KERNELS, names


def test_aarch64_c_mul_mat(aarch64_llama: Path) -> None:
    """test-bitcos-mm (tests/c) of the aarch64 build: BITCOS MUL_MAT / MUL_MAT_ID through that CPU backend, every
    variant, bit for bit against the kernels' arithmetic contract and within the Q8_K bound of a float
    reference, as tests/test_llama_build.py runs it on x86."""
    r = _run_arm(aarch64_llama, "test-bitcos-mm")
    assert " 0 failures" in r.stdout, (r.stdout + r.stderr)[-4000:]
