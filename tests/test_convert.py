"""convert: generated models (dense and MoE, each source type) converted and checked tensor by tensor
against an independent decoding of the source (gguf-py's dequantize for TQ, plain casts for floats)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGUFValueType
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import dequantize

from ggml_bitcos import codec, tq
from ggml_bitcos.convert import ConvertError, convert, default_output
from ggml_bitcos.format import (
    BITCOS_TYPE_IDS,
    COMPANION_SUFFIX,
    COMPANION_TYPE,
    KEY_CONVERTED_FROM,
    KEY_FORMAT_VERSION,
    QK,
    TYPE_ID_BITMAP,
    TYPE_ID_G128,
    TYPE_ID_PT,
    Variant,
)
from ggml_bitcos.ternary import random_codes
from gguf_tools import GGUFStreamWriter, open_gguf, tensor_bytes, tensor_ggml_shape

PROJ = ["attn_q", "attn_k", "attn_v", "attn_output"]


def independent_source_floats(t) -> np.ndarray:
    """fp32 values of a source tensor, rows x K, without the converter's own readers."""
    ne = tensor_ggml_shape(t)
    rows = math.prod(ne[1:])
    raw = np.asarray(t.data)
    if t.tensor_type in (T.TQ1_0, T.TQ2_0):
        return dequantize(raw, t.tensor_type).reshape(rows, ne[0])
    if t.tensor_type == T.F16:
        return raw.astype(np.float32).reshape(rows, ne[0])
    if t.tensor_type == T.F32:
        return raw.astype(np.float32).reshape(rows, ne[0])
    if t.tensor_type == T.BF16:
        u = raw.reshape(-1).view(np.uint16).astype(np.uint32) << 16
        return u.view(np.float32).reshape(rows, ne[0])
    raise AssertionError(t.tensor_type)


def check_converted(src_path, out_path, expect_variant: Variant | None = None) -> dict[str, Variant]:
    """Every converted tensor decodes to the source's fp32 bits (up to -0.0); every other tensor and
    every metadata value is copied; companions follow their weights; general.file_type and
    bitcos.format_version follow the written types. Returns {name: variant}."""
    src = open_gguf(src_path)
    out = open_gguf(out_path)
    out_list = [t.name for t in out.tensors]
    out_t = {t.name: t for t in out.tensors}
    variants: dict[str, Variant] = {}
    for t in src.tensors:
        o = out_t[t.name]
        if o.tensor_type in BITCOS_TYPE_IDS:
            assert tensor_ggml_shape(o) == tensor_ggml_shape(t)
            comp_name = t.name + COMPANION_SUFFIX
            assert out_list[out_list.index(t.name) + 1] == comp_name  # companion right after
            comp = out_t[comp_name]
            assert comp.tensor_type == COMPANION_TYPE and len(tensor_ggml_shape(comp)) == 1
            ne = tensor_ggml_shape(o)
            rows = math.prod(ne[1:])
            dec = codec.decode(
                tensor_bytes(o), tensor_bytes(comp), int(o.tensor_type), ne[0], rows, codec.n_mats_of(ne)
            )
            variants[t.name] = dec.variant
            assert int(o.tensor_type) == dec.variant.type_id
            want = independent_source_floats(t)
            got = dec.to_float()
            assert np.array_equal(got, want)  # IEEE-equal (-0.0 == +0.0)
            w = want.view(np.uint32)
            assert np.array_equal(got.view(np.uint32), np.where(w == 0x80000000, 0, w))
            assert not np.any(got.view(np.uint32) == 0x80000000)
        else:
            assert o.tensor_type == t.tensor_type
            assert np.array_equal(tensor_bytes(o), tensor_bytes(t))
    if expect_variant is not None:
        assert set(variants.values()) == {expect_variant}
    for key, f in src.fields.items():
        if key.startswith("GGUF.") or (key == "general.file_type" and variants):
            continue
        g = out.get_field(key)
        assert g is not None and g.types == f.types, key
        assert all(bytes(a) == bytes(b) for a, b in zip(f.parts, g.parts)), key
    if variants:
        # the highest version written; LLAMA_FTYPE_MOSTLY_BITCOS* = the type ids, by the majority of converted
        # tensors (ties: the newer type, then PT)
        assert out.get_field(KEY_FORMAT_VERSION).contents() == max(v.version for v in variants.values())
        per_type = [
            sum(1 for v in variants.values() if v.type_id == tid) for tid in (TYPE_ID_BITMAP, TYPE_ID_PT, TYPE_ID_G128)
        ]
        majority = (TYPE_ID_BITMAP, TYPE_ID_PT, TYPE_ID_G128)[per_type.index(max(per_type))]
        assert out.get_field("general.file_type").contents() == majority
    return variants


CASES = [
    # (source type, scale, moe, expected variant with --scale auto: version 1, version 2)
    ("tq2_0", "tensor", 0, Variant.PT, Variant.MATRIX),
    ("tq1_0", "g128", 4, Variant.G128, Variant.B256),  # TQ's per-256 scales
    ("f16", "g128", 0, Variant.G128, Variant.B128),  # per-128 scales
    pytest.param("f16", "tensor", 4, Variant.PT, Variant.MATRIX, marks=pytest.mark.slow),
    pytest.param("tq2_0", "g128", 4, Variant.G128, Variant.B256, marks=pytest.mark.slow),
    pytest.param("tq1_0", "tensor", 0, Variant.PT, Variant.MATRIX, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("src_type,scale,moe,v1,v2", CASES)
def test_convert_generated_model(model_factory, tmp_path, src_type, scale, moe, v1, v2, version):
    src = model_factory(src_type=src_type, scale=scale, moe=moe)
    out = tmp_path / "out.gguf"
    # TQ1_0 at z = 0.4 grows as G128 (1.6875 -> ~1.8 bits): force it, the mechanics are under test here
    res = convert(src, out, progress=False, force_grow=True, format_version=version)
    assert res.verified
    variants = check_converted(src, out, v1 if version == 1 else v2)
    assert len(variants) == 7 * 2  # 7 projections x 2 layers (MoE: 4 attention + 3 expert tensors)
    names = set(variants)
    assert "token_embd.weight" not in names and "output.weight" not in names
    if moe:
        assert "blk.0.ffn_down_exps.weight" in names and "blk.0.ffn_gate_inp.weight" not in names
    out_r = open_gguf(out)
    conv_from = out_r.get_field(KEY_CONVERTED_FROM).contents()
    assert conv_from == {"tq2_0": "TQ2_0", "tq1_0": "TQ1_0", "f16": "F16"}[src_type]


@pytest.mark.parametrize(
    "version,forced",
    [
        (1, {"g128": Variant.G128, "128": Variant.G128, "tensor": Variant.PT}),
        (
            2,
            {
                "g128": Variant.B128,
                "128": Variant.B128,
                "256": Variant.B256,
                "row": Variant.ROW,
                "tensor": Variant.MATRIX,
            },
        ),
    ],
)
def test_forced_scale_modes(model_factory, tmp_path, version, forced):
    """Every --scale choice of a version writes its variant where exact (a per-matrix scale is exact at every
    granularity); a choice that is not exact converts nothing, reported, and --strict makes it an error."""
    src = model_factory(src_type="tq2_0", scale="tensor")
    for scale, variant in forced.items():
        out = tmp_path / f"{scale}.gguf"
        convert(src, out, scale=scale, progress=False, format_version=version)
        check_converted(src, out, variant)
    # per-256 scales (TQ2_0 blocks): one per matrix never holds them; one per row only where K = 256
    src_g = model_factory(src_type="tq2_0", scale="g128")
    if version == 2:
        res = convert(src_g, tmp_path / "rows-of-g.gguf", scale="row", progress=False)
        assert {r.name for r in res.converted} == {r.name for r in res.tensors if r.ne[0] == 256 and r.measured}
        assert (
            "--scale row: non-zero magnitudes differ within a row"
            in {r.name: r for r in res.skipped}["blk.0.ffn_down.weight"].reason
        )  # K = 768
        check_converted(src_g, tmp_path / "rows-of-g.gguf", Variant.ROW)
    for scale in ("tensor",):
        with pytest.raises(ConvertError, match=f"nothing to convert.*--scale {scale}.*--allow-copy"):
            convert(src_g, tmp_path / "t.gguf", scale=scale, progress=False, format_version=version)
        assert not (tmp_path / "t.gguf").exists()
        res = convert(src_g, tmp_path / "t.gguf", scale=scale, progress=False, allow_copy=True, format_version=version)
        (tmp_path / "t.gguf").unlink()
        assert not res.converted
        assert all(f"--scale {scale}" in r.reason for r in res.skipped if r.ternary_looking)
        with pytest.raises(ConvertError, match="strict"):
            convert(src_g, tmp_path / "t2.gguf", scale=scale, strict=True, progress=False, format_version=version)
        assert not (tmp_path / "t2.gguf").exists()


def test_scale_choices_without_a_version_1_form(model_factory, tmp_path):
    src = model_factory(src_type="tq2_0", scale="tensor")
    for scale in ("row", "256"):
        with pytest.raises(ConvertError, match=f"--scale {scale} has no version-1 form"):
            convert(src, tmp_path / "o.gguf", scale=scale, format_version=1, progress=False)
    with pytest.raises(ConvertError, match="--format-version 3"):
        convert(src, tmp_path / "o.gguf", format_version=3, progress=False)
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("version", [1, 2])
def test_k_not_multiple_of_128(model_factory, tmp_path, version):
    """ffn_down K = 320 (F16 ternary, K % 128 != 0): version 1 reports it (and --strict fails), version 2
    converts it (a multiple of 32)."""
    src = model_factory(src_type="tq2_0", n_ff=320)
    res = convert(src, tmp_path / "o.gguf", progress=False, format_version=version)
    skipped = {r.name: r for r in res.skipped}
    assert "blk.0.ffn_up.weight" in {r.name for r in res.converted}
    variants = check_converted(src, tmp_path / "o.gguf")
    if version == 2:
        assert variants["blk.0.ffn_down.weight"] == Variant.MATRIX and "blk.0.ffn_down.weight" not in skipped
        convert(src, tmp_path / "o2.gguf", strict=True, progress=False)
        return
    assert "multiple of 128" in skipped["blk.0.ffn_down.weight"].reason
    with pytest.raises(ConvertError, match=r"blk\.0\.ffn_down\.weight.*multiple of 128"):
        convert(src, tmp_path / "o2.gguf", strict=True, progress=False, format_version=1)


def _write_float_model(path, tensors: dict[str, tuple[T, np.ndarray]], alignment: int | None = None) -> None:
    with GGUFStreamWriter(path, "llama", alignment=alignment) as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_kv("test.array", [1.5, 2.5], GGUFValueType.ARRAY, GGUFValueType.FLOAT32)
        if alignment:
            w.add_kv("general.alignment", alignment, GGUFValueType.UINT32)
        for name, (tt, data) in tensors.items():
            w.add_tensor_info(name, tt, tuple(reversed(data.shape)))  # BF16 data: uint16 bit patterns
        w.begin()
        for name, (tt, data) in tensors.items():
            w.write_tensor(name, data)


def _bf16(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def test_float_sources_bf16_f32_negative_zero_and_non_ternary(tmp_path):
    rng = np.random.default_rng(11)
    codes = random_codes(rng, (2, 40, 256), 1 / 3)  # 3-D: 2 experts
    s = np.array([0.0078125, 0.01171875], dtype=np.float32)[:, None, None]  # bf16- and fp16-exact
    x = codes.astype(np.float32) * s
    x[x == 0] = -0.0 * (rng.random(np.count_nonzero(x == 0)) < 0.5)  # mixed -0.0 / +0.0
    x_bf = _bf16(x)
    odd = random_codes(rng, (8, 256), 1 / 3).astype(np.float32) * np.float32(0.1)  # PT only (0.1 not fp16)
    dense = rng.standard_normal((16, 256)).astype(np.float32)
    src = tmp_path / "floats.gguf"
    _write_float_model(
        src,
        {
            "blk.0.ffn_up_exps.weight": (T.BF16, x_bf),
            "blk.0.attn_q.weight": (T.F32, odd),
            "blk.0.attn_k.weight": (T.F32, dense),
            "token_embd.weight": (T.F32, odd.copy()),
            "blk.0.attn_norm.weight": (T.F32, np.ones(256, np.float32)),
        },
        alignment=64,
    )
    res = convert(src, progress=False)
    out = default_output(src)
    assert out.name == "floats-bitcos.gguf" and out.exists()
    variants = check_converted(src, out)
    assert variants == {"blk.0.ffn_up_exps.weight": Variant.MATRIX, "blk.0.attn_q.weight": Variant.MATRIX}
    convert(src, tmp_path / "v1.gguf", progress=False, format_version=1)
    assert check_converted(src, tmp_path / "v1.gguf") == dict.fromkeys(variants, Variant.PT)
    assert {r.name for r in res.skipped} == {"blk.0.attn_k.weight"}
    r = open_gguf(out)
    assert r.alignment == 64 and r.get_field(KEY_CONVERTED_FROM).contents() == "BF16,F32"
    # fp16 block scales cannot represent 0.1 exactly: reported, and --strict fails
    for scale in ("g128", "256"):
        res2 = convert(src, tmp_path / "g.gguf", scale=scale, progress=False, force=True)
        assert "not an fp16 value" in {t.name: t for t in res2.skipped}["blk.0.attn_q.weight"].reason
        with pytest.raises(ConvertError):
            convert(src, tmp_path / "g2.gguf", scale=scale, strict=True, progress=False)


def test_cache_budget_recompute_path(model_factory, tmp_path):
    """With no room to cache encodings, pass 2 re-encodes: identical output."""
    src = model_factory(src_type="tq2_0", scale="tensor")
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    convert(src, a, progress=False, verify=False)
    convert(src, b, progress=False, cache_bytes=0)
    assert a.read_bytes() == b.read_bytes()


def test_reconvert_converted_file_is_identity(model_factory, tmp_path):
    src = model_factory(src_type="tq2_0", scale="tensor")
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    convert(src, a, progress=False)
    with pytest.raises(ConvertError, match="nothing to convert: all 14 ternary weights are already BITCOS"):
        convert(a, b, progress=False)
    assert not b.exists()
    res = convert(a, b, progress=False, allow_copy=True)
    assert not res.converted
    ra, rb = open_gguf(a), open_gguf(b)
    assert [t.name for t in ra.tensors] == [t.name for t in rb.tensors]
    assert all(np.array_equal(tensor_bytes(x), tensor_bytes(y)) for x, y in zip(ra.tensors, rb.tensors))


def test_cli_convert(model_factory, tmp_path, capsys):
    from ggml_bitcos.cli import main

    src = model_factory(src_type="tq2_0", scale="tensor")
    out = tmp_path / "cli.gguf"
    assert main(["convert", str(src), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "converted 14 tensors" in err and "verified bit-exact" in err
    assert main(["convert", str(src), "-o", str(out), "--no-verify", "--force", "-q"]) == 0


@pytest.mark.parametrize(
    "version,scale,variant", [(1, "auto", Variant.G128), (2, "auto", Variant.B256), (2, "128", Variant.B128)]
)
def test_tq_source_keeps_block_scale_of_empty_halves(tmp_path, version, scale, variant):
    """A block-scaled tensor from TQ2_0 keeps the source 256-block's d, in both 128-halves (G128, B128) and in
    empty blocks too (FORMAT §3): the kernels' TQ2_0-exact arithmetic uses d even where all codes are zero."""
    rng = np.random.default_rng(5)
    rows, k = 4, 512
    codes = random_codes(rng, (rows, k), 1 / 3)
    codes[0, 128:256] = 0  # an empty second half
    codes[1, 0:256] = 0  # a whole empty 256-block
    d = rng.uniform(0.01, 1.0, (rows, k // 256)).astype(np.float16)  # per-block scales: not per matrix/row
    src = tmp_path / "tq2.gguf"
    with GGUFStreamWriter(src, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_tensor_info("blk.0.ffn_up.weight", T.TQ2_0, (k, rows))
        w.begin()
        w.write_tensor("blk.0.ffn_up.weight", tq.tq2_0_encode(codes, d))
    out = tmp_path / "out.gguf"
    res = convert(
        src,
        out,
        progress=False,
        force_grow=True,
        scale=scale,  # 4 x 512: the companion's fixed
        format_version=version,
    )  # bytes dominate
    assert [r.variant for r in res.converted] == [variant]
    ts = {t.name: t for t in open_gguf(out).tensors}
    t, comp = ts["blk.0.ffn_up.weight"], ts["blk.0.ffn_up.weight" + COMPANION_SUFFIX]
    if variant is Variant.G128:
        blocks = tensor_bytes(t).reshape(rows, k // QK, Variant.G128.block_bytes)
        stored = np.ascontiguousarray(blocks[:, :, 16:18]).view("<f2").reshape(rows, k // QK)
    else:  # the scales section (FORMAT.md §4.2), read at the header's scales_offset
        c = tensor_bytes(comp).view(np.uint8)
        off = int(c[40:48].view("<u8")[0])
        n = rows * (k // variant.scale_block)
        stored = c[off : off + 2 * n].view("<f2").reshape(rows, -1)
    assert np.array_equal(stored, d if variant is Variant.B256 else np.repeat(d, 2, axis=1))
    check_converted(src, out, variant)


# sha256 of the files convert wrote before format version 2 existed (commit ea7ec69), per source model
# (model_factory's defaults: z = 0.4, seed 0, --force-grow): --format-version 1 must keep writing them.
V1_OUTPUT_SHA256 = {
    ("tq2_0", "tensor", 0): "659e79a6842dd86a9a8e15919179d9f55b7adb36b6addf5d355f6b76236b2c99",
    ("tq1_0", "g128", 4): "226ed49b83dafe8150f1b91310a7707b0d5bf03f3e1425e9e6f2568396e3496b",
    ("f16", "g128", 0): "8831d1240fec195fe30ff70470a34cb877064b2e216f8c8a602015662df948d0",
}


@pytest.mark.parametrize("src_type,scale,moe", list(V1_OUTPUT_SHA256))
def test_version_1_output_unchanged(model_factory, tmp_path, src_type, scale, moe):
    import hashlib

    src = model_factory(src_type=src_type, scale=scale, moe=moe)
    out = tmp_path / "v1.gguf"
    convert(src, out, progress=False, force_grow=True, format_version=1)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == V1_OUTPUT_SHA256[(src_type, scale, moe)]
