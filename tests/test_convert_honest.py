"""Honest convert and stats: nothing to convert is an error (unless --allow-copy), a tensor BITCOS would make
larger stays in its source type (unless --force-grow) and the summary says which and why, --strict fails on
any ternary tensor that does not end up BITCOS, and stats reports the bits a file really carries.

"Would grow" is checked against the sizes of a real --force-grow conversion read from the file itself
(tests/gguf_raw.py), not against the converter's own arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGUFValueType
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import quantize

from ggml_bitcos import tq
from ggml_bitcos.cli import main
from ggml_bitcos.convert import ConvertError, convert
from ggml_bitcos.format import BITCOS_TYPE_IDS, COMPANION_SUFFIX, KEY_FORMAT_VERSION, QK_K, TQ1_0_BLOCK_BYTES
from ggml_bitcos.stats import collect, format_text
from ggml_bitcos.ternary import random_codes
from gguf_tools import GGUFStreamWriter, open_gguf, tensor_bytes

from gguf_raw import read_tensor_table

# TQ1_0 tensors: (name, rows, K, zero density, per-256 scales differ?) — odd row counts, z = 0 and 1
TQ1_SPECS = [
    ("blk.0.attn_q.weight", 7, 512, 0.0, False),
    ("blk.0.attn_k.weight", 5, 256, 0.30, True),
    ("blk.0.attn_v.weight", 9, 768, 0.45, False),
    ("blk.0.attn_output.weight", 33, 1024, 0.55, False),
    ("blk.0.ffn_up.weight", 64, 2048, 0.70, True),
    ("blk.0.ffn_down.weight", 3, 256, 1.0, False),
    ("blk.0.ffn_gate.weight", 96, 2048, 0.45, False),
    ("blk.1.ffn_up.weight", 64, 2048, 0.30, False),  # PT 2 - z + index = 1.71 > TQ1_0's 1.6875
]


def _tq1_model(path) -> None:
    rng = np.random.default_rng(21)
    with GGUFStreamWriter(path, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_kv("general.file_type", 36, GGUFValueType.UINT32)
        data = []
        for name, rows, k, z, varying in TQ1_SPECS:
            codes = random_codes(rng, (rows, k), z)
            if varying:
                d = rng.uniform(0.01, 0.02, (rows, k // QK_K)).astype(np.float16)
            else:
                d = np.full((rows, k // QK_K), 0.015625, np.float16)
            w.add_tensor_info(name, T.TQ1_0, (k, rows))
            data.append((name, tq.tq1_0_encode(codes, d)))
        w.begin()
        for name, raw in data:
            w.write_tensor(name, raw)


def _bitcos_bytes(path) -> dict[str, int]:
    """weight + companion bytes per BITCOS weight, from the file's own tensor table."""
    table = read_tensor_table(path)
    out = {}
    for name, t in table.items():
        if t.type_id in BITCOS_TYPE_IDS:
            # FORMAT.md §2/§3, written out on purpose: 18 / 16 bytes per 128 weights (v1), K/8 bytes per row (v2)
            row_bytes = {160: t.ne[0] // 128 * 18, 161: t.ne[0] // 128 * 16, 162: t.ne[0] // 8}[t.type_id]
            out[name] = math.prod(t.ne[1:]) * row_bytes + table[name + COMPANION_SUFFIX].ne[0]
    return out


@pytest.fixture(scope="module", params=[1, 2], ids=["v1", "v2"])
def tq1(tmp_path_factory, request):
    """(source, its --force-grow conversion, BITCOS bytes per tensor, TQ1_0 bytes, the tensors that grow,
    format version); each format version grows the same tensors: the z = 0.30 one as PT / MATRIX,
    the varying-scale z = 0.30 one as G128 and as B256 (2.0625 - 0.30 > 1.6875)."""
    d = tmp_path_factory.mktemp("honest")
    src = d / "tq1.gguf"
    _tq1_model(src)
    forced = d / "forced.gguf"
    convert(src, forced, progress=False, force_grow=True, format_version=request.param)
    sizes = _bitcos_bytes(forced)
    assert set(sizes) == {s[0] for s in TQ1_SPECS}
    tq1_bytes = {name: rows * k // QK_K * TQ1_0_BLOCK_BYTES for name, rows, k, *_ in TQ1_SPECS}
    grows = {n for n in sizes if sizes[n] > tq1_bytes[n]}
    # the model must exercise both outcomes, or the test below proves nothing
    assert grows and set(sizes) - grows and {"blk.1.ffn_up.weight", "blk.0.attn_k.weight"} <= grows
    return src, forced, sizes, tq1_bytes, grows, request.param


def test_grow_kept_in_source_type(tq1, tmp_path, capsys):
    src, _forced, sizes, tq1_bytes, grows, version = tq1
    out = tmp_path / "out.gguf"
    assert main(["convert", str(src), "-o", str(out), "--format-version", str(version)]) == 0
    err = capsys.readouterr().err
    table = read_tensor_table(out)
    kept = {n for n, t in table.items() if t.type_id == int(T.TQ1_0)}
    assert kept == grows
    assert set(_bitcos_bytes(out)) == set(sizes) - grows
    s, o = {t.name: t for t in open_gguf(src).tensors}, {t.name: t for t in open_gguf(out).tensors}
    for n in kept:  # kept byte for byte
        assert np.array_equal(tensor_bytes(o[n]), tensor_bytes(s[n])) and n + COMPANION_SUFFIX not in o
    assert f"kept in their source type: {len(grows)} tensor(s)" in err and "--force-grow" in err
    for n in grows:
        line = next(ln for ln in err.splitlines() if ln.strip().startswith(n))
        n_w = next(r * k for name, r, k, *_ in TQ1_SPECS if name == n)
        assert f"{8 * tq1_bytes[n] / n_w:.4f} -> {8 * sizes[n] / n_w:.4f} bits per weight" in line
    for n in set(sizes) - grows:
        assert not any(ln.strip().startswith(n) for ln in err.splitlines())


def test_strict_means_every_ternary_tensor(tq1, tmp_path, capsys):
    src, _forced, _sizes, _b, grows, version = tq1
    out = tmp_path / "strict.gguf"
    v = ["--format-version", str(version)]
    assert main(["convert", str(src), "-o", str(out), "--strict", *v]) == 1
    err = capsys.readouterr().err
    first = next(name for name, *_ in TQ1_SPECS if name in grows)
    assert f"tensor '{first}'" in err and "--force-grow" in err and "--strict" in err and not out.exists()
    assert main(["convert", str(src), "-o", str(out), "--strict", "--force-grow", "-q", *v]) == 0
    assert {t.type_id for n, t in read_tensor_table(out).items()} <= BITCOS_TYPE_IDS | {int(T.I8)}


def test_all_grow_is_nothing_to_convert(tmp_path, capsys):
    """Every tensor would grow (TQ1_0 at z = 0, K = 256): an error naming them, no output."""
    rng = np.random.default_rng(2)
    src = tmp_path / "z0.gguf"
    with GGUFStreamWriter(src, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_tensor_info("blk.0.ffn_up.weight", T.TQ1_0, (256, 3))
        w.begin()
        w.write_tensor(
            "blk.0.ffn_up.weight", tq.tq1_0_encode(random_codes(rng, (3, 256), 0.0), np.full((3, 1), 0.5, np.float16))
        )
    out = tmp_path / "o.gguf"
    assert main(["convert", str(src), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "nothing to convert" in err and "blk.0.ffn_up.weight" in err and "would grow" in err
    assert "--force-grow" in err and "--allow-copy" in err and not out.exists()


def _non_ternary_model(path) -> None:
    rng = np.random.default_rng(4)
    dense = rng.standard_normal((8, 256)).astype(np.float32)
    with GGUFStreamWriter(path, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_kv("general.file_type", 7, GGUFValueType.UINT32)
        w.add_tensor_info("blk.0.attn_q.weight", T.Q8_0, (256, 8))
        w.add_tensor_info("blk.0.attn_k.weight", T.F32, (256, 8))
        w.begin()
        w.write_tensor("blk.0.attn_q.weight", quantize(dense, T.Q8_0))
        w.write_tensor("blk.0.attn_k.weight", dense)


@pytest.mark.parametrize("extra", [[], ["--strict"]])
def test_nothing_ternary_is_an_error(tmp_path, capsys, extra):
    src = tmp_path / "q8.gguf"
    _non_ternary_model(src)
    out = tmp_path / "out.gguf"
    assert main(["convert", str(src), "-o", str(out), *extra]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(src) in err and "nothing to convert: no ternary tensor found" in err
    assert "Q8_0" in err and "--allow-copy" in err
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))


def test_allow_copy_writes_an_untagged_copy(tmp_path, capsys):
    src = tmp_path / "q8.gguf"
    _non_ternary_model(src)
    out = tmp_path / "out.gguf"
    assert main(["convert", str(src), "-o", str(out), "--allow-copy", "-q"]) == 0
    s, o = open_gguf(src), open_gguf(out)
    assert all(np.array_equal(tensor_bytes(a), tensor_bytes(b)) for a, b in zip(s.tensors, o.tensors))
    assert o.get_field(KEY_FORMAT_VERSION) is None  # not tagged BITCOS
    assert int(o.get_field("general.file_type").contents()) == 7


def test_version_1_output_unchanged(tmp_path):
    """--format-version 1 writes what convert wrote before version 2 existed (commit ea7ec69, sha256 below): PT
    whenever exact, even where G128 would take fewer bytes (the z = 1 tensor of 3 x 256 weights)."""
    import hashlib

    src = tmp_path / "tq1.gguf"
    _tq1_model(src)
    out = tmp_path / "v1.gguf"
    convert(src, out, progress=False, format_version=1)
    assert (
        hashlib.sha256(out.read_bytes()).hexdigest()
        == "919d4d3218478a9135c68827ac4bdf15337e1a7645b12409d1c00d7a080c3132"
    )


@pytest.mark.parametrize("version,k,multiple", [(1, 320, 128), (2, 80, 32)])
def test_cannot_convert_name_with_strict(tmp_path, version, k, multiple):
    """A ternary tensor skipped for any reason (here: its row length) is a --strict error; without it a
    report."""
    rng = np.random.default_rng(8)
    x = random_codes(rng, (4, k), 0.4).astype(np.float16) * np.float16(0.5)
    y = random_codes(rng, (4, 256), 0.4).astype(np.float16) * np.float16(0.5)
    src = tmp_path / f"k{k}.gguf"
    with GGUFStreamWriter(src, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_tensor_info("blk.0.ffn_down.weight", T.F16, (k, 4))
        w.add_tensor_info("blk.0.ffn_up.weight", T.F16, (256, 4))
        w.begin()
        w.write_tensor("blk.0.ffn_down.weight", x)
        w.write_tensor("blk.0.ffn_up.weight", y)
    res = convert(src, tmp_path / "o.gguf", progress=False, format_version=version)
    assert [r.name for r in res.converted] == ["blk.0.ffn_up.weight"]
    with pytest.raises(ConvertError, match=rf"ffn_down\.weight.*multiple of {multiple}.*--strict"):
        convert(src, tmp_path / "o2.gguf", progress=False, strict=True, format_version=version)
    assert not (tmp_path / "o2.gguf").exists()


# every --scale choice of each version and the variant it writes
FORCED = {
    (1, "g128"): "G128",
    (1, "tensor"): "PT",
    (2, "tensor"): "MATRIX",
    (2, "row"): "ROW",
    (2, "256"): "B256",
    (2, "128"): "B128",
}


@pytest.mark.parametrize("tq1", [2], indirect=True, ids=["v2"])
def test_stats_real_bits_per_variant(tq1, tmp_path):
    """stats on the source: each tensor's bits in each variant are the bytes a conversion to that variant writes
    (None where it is not exact: no conversion writes it); auto is convert's own choice."""
    src, forced, sizes, tq1_bytes, _grows, _version = tq1
    m = collect(src, progress=False)
    per = {t.name: t for t in m.tensors}
    n = sum(r * k for _n, r, k, *_ in TQ1_SPECS)
    for (version, scale), vname in FORCED.items():
        out = tmp_path / f"{vname}.gguf"
        convert(src, out, progress=False, force_grow=True, allow_copy=True, scale=scale, format_version=version)
        got = _bitcos_bytes(out)
        for name, *_ in TQ1_SPECS:
            assert per[name].variant_bytes[vname] == got.get(name), (vname, name)
        want_bits = 8 * sum(got.values()) / n if len(got) == len(TQ1_SPECS) else None
        assert m.variant_bits[vname] == (pytest.approx(want_bits, rel=1e-12) if want_bits else None), vname
        assert m.not_exact[vname] == len(TQ1_SPECS) - len(got), vname
    auto = sum(sizes.values())  # convert's own choice per tensor
    assert m.bitcos_auto == pytest.approx(8 * auto / n, rel=1e-12)
    tq1_bits = 8 * sum(tq1_bytes.values()) / n
    assert tq1_bits == pytest.approx(1.6875)
    line = next(ln for ln in format_text(m).splitlines() if ln.startswith("TQ1_0"))
    ratio = 1.6875 / m.bitcos_auto
    assert (f"{ratio:.3f}x smaller" if ratio > 1 else f"{1 / ratio:.3f}x larger") in line
    # the BITCOS file's own view agrees with the source's prediction
    mb = collect(forced, progress=False)
    assert mb.bitcos_auto == pytest.approx(m.bitcos_auto, rel=1e-12)
    assert mb.file_bits_per_weight == pytest.approx(8 * auto / n, rel=1e-12)
