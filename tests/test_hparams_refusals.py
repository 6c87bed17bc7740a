"""A model file with hyperparameters upstream llama.cpp asserts on (block count 0 or above LLAMA_MAX_LAYERS, an
expert count above LLAMA_MAX_EXPERTS, more experts used than there are, an embedding length of 0, a negative or
NaN norm epsilon) is refused with
a message, never by aborting the process: the loader patch on crafted files turns those GGML_ASSERTs into load errors, which reach
the CLI's log and Llama()'s ValueError, verbose or not.

Through the real patched llama.cpp (skips without it, fails under BITCOS_REQUIRE_LLAMA=1), on a tiny llama
whose uint32 keys are rewritten in place.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ggml_bitcos.llama_run import tool_path


def _set_u32(src: Path, dst: Path, key: str, value: int | float) -> None:
    """A copy of the GGUF `src` with the uint32 (or float32, for a float value) metadata value of `key` replaced
    (same length, so nothing moves)."""
    data = bytearray(src.read_bytes())
    k = struct.pack("<Q", len(key)) + key.encode()
    i = data.find(k)
    assert i > 0, f"{key} not in {src}"
    gguf_type, fmt = (6, "<f") if isinstance(value, float) else (4, "<I")  # GGUF_TYPE_FLOAT32 / UINT32
    assert struct.unpack_from("<I", data, i + len(k))[0] == gguf_type, f"{key} is not of type {gguf_type}"
    struct.pack_into(fmt, data, i + len(k) + 4, value)
    dst.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def base(tmp_path_factory, patched_llama) -> Path:
    d = tmp_path_factory.mktemp("hparams")
    src, out = d / "moe-tq2_0.gguf", d / "moe-bitcos.gguf"
    for args in (
        ["make-model", "-o", str(src), "--preset", "tiny", "--type", "tq2_0", "--moe", "4", "-q"],
        ["convert", str(src), "-o", str(out)],
    ):
        r = subprocess.run([sys.executable, "-m", "ggml_bitcos", *args], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    return out


CASES = {
    "block-count-0": ("llama.block_count", 0, "n_layer_all > 0"),
    "block-count-1M": ("llama.block_count", 1 << 20, "n_layer_all <= LLAMA_MAX_LAYERS"),
    "experts-above-max": ("llama.expert_count", 1 << 20, "n_expert <= LLAMA_MAX_EXPERTS"),
    "experts-used-above-count": ("llama.expert_used_count", 9, "n_expert_used_max <= hparams.n_expert"),
    "embedding-length-0": ("llama.embedding_length", 0, "n_embd > 0"),
    # ggml's RMS_NORM asserts eps >= 0 at the first decode
    "rms-epsilon-negative": ("llama.attention.layer_norm_rms_epsilon", -1e-5, "hparams.f_norm_rms_eps >= 0.0f"),
    "rms-epsilon-nan": (
        "llama.attention.layer_norm_rms_epsilon",
        float("nan"),
        "std::isfinite(hparams.f_norm_rms_eps)",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cli_refuses_with_reason(base: Path, tmp_path: Path, case: str) -> None:
    key, value, rule = CASES[case]
    bad = tmp_path / f"{case}.gguf"
    _set_u32(base, bad, key, value)
    r = subprocess.run(
        [str(tool_path("llama-completion")), "-m", str(bad), "-p", "Hi", "-n", "1", "-no-cnv", "--no-warmup"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode not in (0, -6, 134), f"exit {r.returncode}\n{r.stderr[-2000:]}"  # refused, not aborted
    assert "invalid hyperparameters in the model file" in r.stderr and rule in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("verbose", [False, True])
def test_python_gets_value_error(base: Path, tmp_path: Path, verbose: bool) -> None:
    bad = tmp_path / "bc0.gguf"
    _set_u32(base, bad, "llama.block_count", 0)
    code = textwrap.dedent(f"""
        from llama_cpp import Llama
        try:
            Llama({str(bad)!r}, verbose={verbose})
        except ValueError as e:
            print("VALUE-ERROR:", e)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"the interpreter died ({r.returncode})\n{r.stderr[-2000:]}"
    assert "VALUE-ERROR:" in r.stdout and "n_layer_all > 0" in r.stdout, r.stdout + r.stderr[-2000:]
