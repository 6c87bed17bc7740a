"""The CPU's in-memory form of BITCOS weights, chosen at load (docs/KERNELS.md §9): the BITCOS form (the file's
bytes, mmap-ed) or the 2-bit codes form (decoded at load into ggml-cpu's CPU_BITCOS_2BIT buffer). Both must give
bit-identical logits on every variant, odd K, dense and MoE; the load log names the form and the numbers behind
an automatic choice; --no-repack keeps BITCOS.

Needs the patched build (scripts/install.sh); skips without it except under BITCOS_REQUIRE_LLAMA=1.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ggml_bitcos import llama_run
from ggml_bitcos.llama_run import tool_path

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"

# name -> (make-model options of the source, convert options): every variant, odd K (rows of 288 and 608
# weights: K % 256 != 0), MoE
MODELS = {
    "b256": (["--type", "tq2_0", "--scale", "g128"], []),
    "matrix": (["--type", "tq2_0", "--scale", "tensor"], []),
    "row": (["--type", "tq2_0", "--scale", "row"], ["--scale", "row"]),
    "b128": (["--type", "tq2_0", "--scale", "g128"], ["--scale", "128"]),
    "moe-b256": (["--type", "tq2_0", "--scale", "g128", "--moe", "4"], []),
    "g128-v1": (["--type", "tq2_0", "--scale", "g128"], ["--format-version", "1", "--scale", "g128"]),
    "pt-v1": (["--type", "tq2_0", "--scale", "tensor"], ["--format-version", "1"]),
    "matrix-k288": (["--type", "f16", "--scale", "tensor", "--n-embd", "288", "--n-ff", "608"], []),
}


def _cli(*args: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ggml_bitcos", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert r.returncode == 0, f"ggml-bitcos {' '.join(args)} failed:\n{r.stdout[-3000:]}"


@pytest.fixture(scope="module")
def models(tmp_path_factory, patched_llama) -> dict[str, tuple[Path, Path]]:
    d = tmp_path_factory.mktemp("cpu-form")
    out = {}
    for name, (make, conv) in MODELS.items():
        src, dst = d / f"{name}-src.gguf", d / f"{name}-bitcos.gguf"
        _cli("make-model", "-o", str(src), "--preset", "tiny", "--zero-density", "0.42", "--seed", "5", "-q", *make)
        _cli("convert", str(src), "-o", str(dst), *conv)
        out[name] = (src, dst)
    return out


def _generate(monkeypatch, model: Path, form: str, **kw) -> llama_run.Generation:
    monkeypatch.setenv("GGML_BITCOS_CPU_FORM", form)
    return llama_run.greedy_generate(model, PROMPT, 24, n_threads=2, **kw)


@pytest.mark.parametrize("name", list(MODELS))
def test_both_forms_bit_identical(models, monkeypatch, name):
    src, out = models[name]
    bitcos = _generate(monkeypatch, out, "bitcos")
    codes = _generate(monkeypatch, out, "2bit")
    assert bitcos.tokens == codes.tokens, f"{name}: greedy tokens differ between the forms"
    assert np.array_equal(bitcos.logits, codes.logits), f"{name}: logits differ between the forms"
    assert len(set(codes.tokens)) > 3  # not a degenerate model
    if "k288" not in name:  # a TQ2_0 source: its own tokens too
        assert _generate(monkeypatch, src, "auto").tokens == codes.tokens


def test_no_mmap_codes_form_identical(models, monkeypatch):
    _, out = models["moe-b256"]
    a = _generate(monkeypatch, out, "2bit")
    b = _generate(monkeypatch, out, "2bit", use_mmap=False)
    assert a.tokens == b.tokens and np.array_equal(a.logits, b.logits)


def _load_log(model: Path, env: dict[str, str], *extra: str) -> str:
    cmd = [str(tool_path("llama-completion")), "-m", str(model), "-p", "Hi", "-n", "2", "-t", "2", "-no-cnv"]
    cmd += ["--no-warmup", "-c", "256", "-v", *extra]  # -v: the load log (llama.cpp prints it at info level)
    r = subprocess.run(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **env},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr


def test_load_log_names_the_form(models):
    _, out = models["b256"]
    log = _load_log(out, {"GGML_BITCOS_CPU_FORM": "2bit"})
    assert re.search(r"BITCOS: \d+ weights in CPU_BITCOS_2BIT, the 2-bit codes form: [\d.]+ MiB", log), log[-3000:]
    assert "decoded in" in log
    log = _load_log(out, {"GGML_BITCOS_CPU_FORM": "bitcos"})
    assert re.search(r"BITCOS: \d+ weights in CPU(_Mapped)?, the BITCOS form", log), log[-3000:]


def test_no_repack_keeps_bitcos(models):
    _, out = models["b256"]
    log = _load_log(out, {"GGML_BITCOS_CPU_FORM": "2bit"}, "--no-repack")
    assert "CPU_BITCOS_2BIT" not in log and re.search(r"weights in CPU(_Mapped)?, the BITCOS form", log), log[-3000:]


_AUTO = re.compile(
    r"BITCOS CPU form: (BITCOS|2-bit codes) \(auto: z ([\d.]+), (\d+) threads, beta ([\d.]+) GB/s per thread .*?"
    r"predicted ([\d.]+) vs ([\d.]+) ns"
)


@pytest.mark.parametrize("beta", ["0.5", "1000"])
def test_auto_choice_follows_the_roofline(models, tmp_path, beta):
    """With the bandwidth given (GGML_BITCOS_BETA), the automatic choice is the rule applied to the numbers
    the log prints: BITCOS unless the 2-bit form's predicted time is 10 % below BITCOS's. A scarce bandwidth
    (0.5 GB/s per thread) binds both forms by their bytes: BITCOS."""
    _, out = models["b256"]
    env = {"GGML_BITCOS_CPU_FORM": "auto", "GGML_BITCOS_BETA": beta, "GGML_BITCOS_CACHE_DIR": str(tmp_path)}
    log = _load_log(out, env)
    m = _AUTO.search(log)
    assert m, log[-3000:]
    form, z, t_bitcos, t_codes = m.group(1), float(m.group(2)), float(m.group(5)), float(m.group(6))
    assert abs(z - 0.42) < 0.02
    assert float(m.group(4)) == pytest.approx(float(beta), rel=0.01)
    expect = "2-bit codes" if t_bitcos > 1.10 * t_codes else "BITCOS"
    assert form == expect, m.group(0)
    if beta == "0.5":
        assert form == "BITCOS"
    buffer = "CPU_BITCOS_2BIT" if form == "2-bit codes" else "CPU(_Mapped)?"
    assert re.search(rf"weights in {buffer}, the", log), log[-3000:]
