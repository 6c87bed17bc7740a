"""``convert --to``: BITCOS back to TQ2_0 / TQ1_0 / F16 / BF16 / F32, bit-exactly.

The reference is independent of the code under test: gguf-py's ``dequantize`` of the *original* source tensor
(TQ2_0, F16, F32), which the forward conversion reproduces bit for bit (FORMAT.md §5); the back-converted
tensor, dequantized by gguf-py, must give the same fp32 bits. TQ2_0 -> BITCOS -> TQ2_0 gives the source's
bytes back; through the patched llama.cpp it generates the source's greedy tokens.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGUFValueType
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import dequantize

from ggml_bitcos.cli import main
from ggml_bitcos.convert import ConvertError, convert
from ggml_bitcos.convert_back import convert_back, default_output
from ggml_bitcos.format import BITCOS_TYPE_IDS, COMPANION_SUFFIX, KEY_FORMAT_VERSION, Variant
from ggml_bitcos.ternary import random_codes
from gguf_tools import GGUFStreamWriter, open_gguf, tensor_bytes, tensor_ggml_shape

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
TARGET_TYPES = {"tq2_0": T.TQ2_0, "tq1_0": T.TQ1_0, "f16": T.F16, "bf16": T.BF16, "f32": T.F32}


def gguf_floats(t) -> np.ndarray:
    """gguf-py's dequantization of any tensor, as fp32 bits (rows, K); BF16 by shifting (gguf-py has it too)."""
    ne = tensor_ggml_shape(t)
    rows = math.prod(ne[1:])
    raw = np.asarray(t.data)
    if t.tensor_type == T.BF16:
        x = (raw.reshape(-1).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif t.tensor_type in (T.F16, T.F32):
        x = raw.astype(np.float32)
    else:
        x = dequantize(raw, t.tensor_type)
    return np.ascontiguousarray(x.reshape(rows, ne[0]))


def _no_neg_zero(x: np.ndarray) -> np.ndarray:
    b = x.view(np.uint32).copy()
    b[b == 0x80000000] = 0
    return b


def check_back(
    src_path, mid_path, back_path, expect_kept: set[str] = frozenset(), expect_types: dict[str, T] | None = None
) -> None:
    """Every tensor that was BITCOS in ``mid_path`` dequantizes (gguf-py) in ``back_path`` to the original
    source's fp32 bits (-0.0 of a float source is +0.0 after BITCOS, FORMAT.md §5) and leaves no companion;
    every other tensor is the source's, byte for byte."""
    src = {t.name: t for t in open_gguf(src_path).tensors}
    mid = {t.name: t for t in open_gguf(mid_path).tensors}
    back = {t.name: t for t in open_gguf(back_path).tensors}
    assert [n for n in back if not n.endswith(COMPANION_SUFFIX)] == list(src)
    for name, s in src.items():
        b = back[name]
        if name in expect_kept:
            assert int(b.tensor_type) in BITCOS_TYPE_IDS and name + COMPANION_SUFFIX in back
            assert np.array_equal(tensor_bytes(b), tensor_bytes(mid[name]))
            continue
        assert name + COMPANION_SUFFIX not in back
        if int(mid[name].tensor_type) not in BITCOS_TYPE_IDS:
            assert b.tensor_type == s.tensor_type and np.array_equal(tensor_bytes(b), tensor_bytes(s)), name
            continue
        if expect_types is not None:
            assert b.tensor_type == expect_types[name], name
        assert tensor_ggml_shape(b) == tensor_ggml_shape(s)
        assert np.array_equal(gguf_floats(b).view(np.uint32), _no_neg_zero(gguf_floats(s))), name


# --- TQ2_0 sources: the round trip ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "version,model_scale,scale,moe,variant",
    [
        (1, "tensor", "auto", 0, Variant.PT),
        (1, "g128", "auto", 0, Variant.G128),
        (1, "tensor", "auto", 4, Variant.PT),
        (2, "tensor", "auto", 0, Variant.MATRIX),
        (2, "g128", "auto", 0, Variant.B256),
        (2, "tensor", "auto", 4, Variant.MATRIX),
        (2, "tensor", "row", 0, Variant.ROW),
        (2, "g128", "128", 0, Variant.B128),
    ],
)
def test_tq2_0_round_trip_byte_identical(model_factory, tmp_path, version, model_scale, scale, moe, variant):
    """TQ2_0 -> BITCOS (each variant that holds per-matrix / per-256 scales) -> TQ2_0: the source's bytes."""
    src = model_factory(src_type="tq2_0", scale=model_scale, moe=moe, z=0.42)
    mid, back = tmp_path / "mid.gguf", tmp_path / "back.gguf"
    res = convert(src, mid, progress=False, scale=scale, format_version=version)
    assert len(res.converted) == 14 and {r.variant for r in res.converted} == {variant}
    r = convert_back(mid, back, to="tq2_0", progress=False)
    assert r.verified and {t.target for t in r.tensors} == {"tq2_0"}
    s, b = open_gguf(src), open_gguf(back)
    assert [t.name for t in s.tensors] == [t.name for t in b.tensors]
    for x, y in zip(s.tensors, b.tensors):
        assert x.tensor_type == y.tensor_type and np.array_equal(tensor_bytes(x), tensor_bytes(y)), x.name
    assert int(b.get_field("general.file_type").contents()) == int(s.get_field("general.file_type").contents())
    assert b.get_field(KEY_FORMAT_VERSION) is None  # no BITCOS left: no bitcos.* keys


@pytest.mark.parametrize("to", ["tq1_0", "f16", "f32"])
def test_tq2_0_source_to_other_types(model_factory, tmp_path, to):
    src = model_factory(src_type="tq2_0", scale="g128", z=0.3)
    mid = tmp_path / "mid.gguf"
    convert(src, mid, progress=False)
    back = tmp_path / f"back-{to}.gguf"
    convert_back(mid, back, to=to, progress=False)
    conv = {t.name for t in open_gguf(mid).tensors if int(t.tensor_type) in BITCOS_TYPE_IDS}
    check_back(src, mid, back, expect_types={n: TARGET_TYPES[to] for n in conv})


# --- float sources: every representability rule ----------------------------------------------------------


def _float_model(path, seed: int = 9) -> None:
    """F16/F32 ternary tensors covering each case of FORMAT.md §10 (odd row counts, z = 0 and 1)."""
    rng = np.random.default_rng(seed)

    def ternary(rows, k, z, scale):
        return random_codes(rng, (rows, k), z).astype(np.float32) * np.float32(scale)

    per128 = random_codes(rng, (5, 512), 0.4).astype(np.float32)
    d = rng.choice(np.array([0.25, 0.5, 0.375], np.float32), (5, 4))  # halves differ: G128 only
    d[0, 0] = 0.2509765625  # 0.25 (1 + 2^-8): an fp16 value, not a bf16 one (7 fraction bits)
    per128 = (per128.reshape(5, 4, 128) * d[:, :, None]).reshape(5, 512)
    same_halves = random_codes(rng, (3, 512), 0.5).astype(np.float32)
    d2 = np.repeat(rng.choice(np.array([0.015625, 0.0234375], np.float32), (3, 2)), 2, axis=1)
    same_halves = (same_halves.reshape(3, 4, 128) * d2[:, :, None]).reshape(3, 512)
    same_halves[0, 128:256] = 0  # an empty half: its G128 d is 0, the other half's d decides
    same_halves[1, 0:256] = 0  # a whole empty 256-block
    tensors = {
        "blk.0.attn_q.weight": (T.F16, ternary(7, 256, 0.0, 0.0625)),  # z = 0, PT, fp16 & bf16 scale
        "blk.0.attn_k.weight": (T.F16, ternary(3, 256, 1.0, 0.0625)),  # z = 1: all zero
        "blk.0.attn_v.weight": (T.F32, ternary(9, 256, 0.5, 0.1)),  # PT scale 0.1: not fp16, not bf16
        "blk.0.attn_output.weight": (T.F16, per128),  # G128, halves differ: no TQ
        "blk.0.ffn_up.weight": (T.F16, same_halves),  # G128, equal halves: TQ ok
        "blk.0.ffn_down.weight": (T.F16, ternary(5, 384, 0.4, 0.0625)),  # K = 384: no TQ block
        "blk.0.ffn_gate.weight": (T.F16, ternary(4, 256, 0.3, 0.0626220703125)),  # 2^-4 (1 + 2^-9): fp16, not bf16
        "output_norm.weight": (T.F32, np.ones(256, np.float32)),
    }
    with GGUFStreamWriter(path, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_kv("general.file_type", 1, GGUFValueType.UINT32)
        for name, (tt, x) in tensors.items():
            w.add_tensor_info(name, tt, tuple(reversed(x.shape)))
        w.begin()
        for name, (tt, x) in tensors.items():
            w.write_tensor(name, x.astype(np.float16) if tt == T.F16 else x)


@pytest.fixture(scope="module", params=[1, 2], ids=["v1", "v2"])
def float_pair(tmp_path_factory, request):
    """(source, its conversion in format version 1 / 2, the variant holding per-128 scales)."""
    d = tmp_path_factory.mktemp("back")
    src, mid = d / "src.gguf", d / "mid-bitcos.gguf"
    _float_model(src)
    res = convert(src, mid, progress=False, force_grow=True, format_version=request.param)
    variants = {r.name: r.variant for r in res.converted}
    per128, per_matrix, per256 = (
        (Variant.G128, Variant.PT, Variant.G128) if request.param == 1 else (Variant.B128, Variant.MATRIX, Variant.B256)
    )
    assert variants["blk.0.attn_output.weight"] == per128 and variants["blk.0.attn_v.weight"] == per_matrix
    assert variants["blk.0.ffn_up.weight"] == per256 and len(variants) == 7
    from gguf_raw import read_tensor_table

    if request.param == 1:
        # the empty halves really carry a d of their own (0), unlike their partners: the TQ targets must cope
        t = read_tensor_table(mid)["blk.0.ffn_up.weight"]
        blocks = np.frombuffer(mid.read_bytes(), np.uint8, 3 * 4 * 18, t.offset).reshape(3, 4, 18)
        d = blocks[:, :, 16:].copy().view("<f2")[:, :, 0]
        assert d[0, 1] == 0 and d[0, 0] != 0 and d[1, 0] == d[1, 1] == 0
    else:
        # B256: the 256-block holding only an empty half has its other half's scale; the empty one has 0
        c = read_tensor_table(mid)["blk.0.ffn_up.weight" + COMPANION_SUFFIX]
        comp = np.frombuffer(mid.read_bytes(), np.uint8, c.ne[0], c.offset)
        off = int(comp[40:48].view("<u8")[0])  # scales_offset (FORMAT.md §4.1)
        d = comp[off : off + 3 * 2 * 2].view("<f2").reshape(3, 2)
        assert d[0, 0] != 0 and d[1, 0] == 0
    return src, mid, per128


# (target, tensors it cannot hold, a phrase of the reason)
IMPOSSIBLE = {
    "tq2_0": {
        "blk.0.attn_v.weight": "not an fp16 value",
        "blk.0.attn_output.weight": "different scales",
        "blk.0.ffn_down.weight": "not a multiple of 256",
    },
    "tq1_0": {
        "blk.0.attn_v.weight": "not an fp16 value",
        "blk.0.attn_output.weight": "different scales",
        "blk.0.ffn_down.weight": "not a multiple of 256",
    },
    "f16": {"blk.0.attn_v.weight": "not a F16 value"},
    "bf16": {
        "blk.0.attn_v.weight": "not a BF16 value",
        "blk.0.attn_output.weight": "not a BF16 value",
        "blk.0.ffn_gate.weight": "not a BF16 value",
    },
    "f32": {},
}


@pytest.mark.parametrize("to", sorted(IMPOSSIBLE))
def test_float_source_each_target(float_pair, tmp_path, to):
    src, mid, _per128 = float_pair
    bad = IMPOSSIBLE[to]
    out = tmp_path / f"out-{to}.gguf"
    if bad:
        with pytest.raises(ConvertError) as ei:
            convert_back(mid, out, to=to, progress=False)
        msg = str(ei.value)
        first = next(iter(n for n in open_gguf(mid).tensors if n.name in bad)).name
        assert f"tensor '{first}'" in msg and bad[first] in msg and str(mid) in msg and "--fallback" in msg
        assert not out.exists() and not list(tmp_path.glob(".*.tmp"))
        # each impossible tensor alone is refused for its own reason (a fallback reports them all)
        res = convert_back(mid, out, to=to, fallback="f32", progress=False)
        fell = {r.name: r.reason for r in res.tensors if r.target == "f32"}
        assert set(fell) == set(bad) and all(bad[n] in fell[n] for n in bad)
    else:
        res = convert_back(mid, out, to=to, progress=False)
    assert res.verified
    types = {r.name: TARGET_TYPES[r.target] for r in res.tensors}
    check_back(src, mid, out, expect_types=types)


def test_fallback_keep_and_cli(float_pair, tmp_path, capsys):
    src, mid, per128 = float_pair
    out = tmp_path / "kept.gguf"
    assert main(["convert", "--to", "tq2_0", "--fallback", "keep", str(mid), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "3 to BITCOS (kept)" in err and "verified bit-exact" in err
    assert f"fallback: blk.0.attn_output.weight ({per128.name}) -> BITCOS: not TQ2_0:" in err
    kept = set(IMPOSSIBLE["tq2_0"])
    check_back(src, mid, out, expect_kept=kept)
    r = open_gguf(out)
    assert r.get_field(KEY_FORMAT_VERSION) is not None  # BITCOS left: its keys stay
    # the kept weights are still valid BITCOS (the codec decodes them with all checks)
    assert main(["info", "--check", str(out)]) == 0
    capsys.readouterr()
    # default output name, an error without a fallback (exit 1, no file), flags of the other direction refused
    assert default_output(mid, "f16").name == "mid-f16.gguf"
    assert main(["convert", "--to", "f16", str(mid), "-q"]) == 1
    assert "blk.0.attn_v.weight" in capsys.readouterr().err and not (mid.parent / "mid-f16.gguf").exists()
    assert main(["convert", "--to", "f16", "--strict", str(mid)]) == 1
    assert main(["convert", "--fallback", "f32", str(src), "-o", str(tmp_path / "x.gguf")]) == 1
    assert main(["convert", "--to", "f32", str(src), "-o", str(tmp_path / "y.gguf")]) == 1
    assert "no BITCOS tensors" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "y.gguf").exists()


def test_corrupt_bitcos_refused_cleanly(float_pair, tmp_path, capsys):
    import shutil
    from gguf_raw import read_tensor_table

    _src, mid, _per128 = float_pair
    comp = read_tensor_table(mid)["blk.0.ffn_up.weight" + COMPANION_SUFFIX]
    bad = tmp_path / "bad.gguf"
    shutil.copyfile(mid, bad)
    with open(bad, "r+b") as f:
        f.seek(comp.offset + comp.ne[0] - 1)
        f.write(b"\x80")  # a bit in the pool's zero tail
    assert main(["convert", "--to", "f32", str(bad), "-o", str(tmp_path / "o.gguf")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(bad) in err and "tensor 'blk.0.ffn_up.weight'" in err and "n_sign_bits" in err
    assert not (tmp_path / "o.gguf").exists()


# --- through the patched llama.cpp -------------------------------------------------------------------


@pytest.mark.llama
def test_back_to_tq2_0_same_greedy_tokens_in_llama(tmp_path, patched_llama):
    from ggml_bitcos import llama_run
    from ggml_bitcos.make_model import PRESETS, make_model

    src = tmp_path / "src-tq2_0.gguf"
    make_model(src, PRESETS["tiny"], z=0.42, scale_mode="tensor", src_type="tq2_0", seed=7, progress=False)
    mid = tmp_path / "mid-bitcos.gguf"
    convert(src, mid, progress=False)
    want = llama_run.greedy_generate(src, PROMPT, 24, n_threads=2)
    outs = {}
    for to in ("tq2_0", "tq1_0", "f16", "f32"):
        outs[to] = tmp_path / f"back-{to}.gguf"
        convert_back(mid, outs[to], to=to, progress=False)
    got = llama_run.greedy_generate(outs["tq2_0"], PROMPT, 24, n_threads=2)
    assert got.tokens == want.tokens and np.array_equal(got.logits, want.logits)
    for to in ("tq1_0", "f16", "f32"):  # other kernels: they load and generate (rounding may differ)
        g = llama_run.greedy_generate(outs[to], PROMPT, 8, n_threads=2)
        assert len(g.tokens) == 8 and np.all(np.isfinite(g.logits))
