"""stats: the Table I row; the size formula against real converted files (FORMAT.md §8)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGUFValueType
from gguf.constants import GGMLQuantizationType as T

from ggml_bitcos.convert import convert
from ggml_bitcos.format import Variant, bits_per_weight
from ggml_bitcos.ternary import random_codes
from ggml_bitcos.stats import collect, format_text
from gguf_tools import GGUFStreamWriter, open_gguf

SIZE_ZS = [0.0, 0.3, 0.42, 0.5, 0.95, 1.0]
K = N = 2048


def _one_tensor_model(path, z: float, scale: str, seed: int = 0) -> None:
    """A GGUF holding one 2048 x 2048 F16 ternary tensor: an fp16 scale per 128 or per 256 weights, per row, or
    one for the tensor (``scale`` 128 / 256 / row / tensor)."""
    rng = np.random.default_rng(seed)
    codes = random_codes(rng, (N, K), z).astype(np.float16)
    if scale in ("128", "256"):
        g = int(scale)
        d = rng.uniform(0.01, 0.02, (N, K // g)).astype(np.float16)
        x = (codes.reshape(N, K // g, g) * d[:, :, None]).reshape(N, K)
    elif scale == "row":
        x = codes * rng.uniform(0.01, 0.02, (N, 1)).astype(np.float16)
    else:
        x = codes * np.float16(0.015625)
    with GGUFStreamWriter(path, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_tensor_info("blk.0.ffn_up.weight", T.F16, (K, N))
        w.begin()
        w.write_tensor("blk.0.ffn_up.weight", x)


# (source scale, format version, variant convert's auto picks, its bits per weight without the index)
SIZE_CASES = [
    ("128", 2, Variant.B128, 2.125),
    ("256", 2, Variant.B256, 2.0625),
    ("row", 2, Variant.ROW, 2 + 32 / K),
    ("tensor", 2, Variant.MATRIX, 2.0),
    ("128", 1, Variant.G128, 2.125),
    ("tensor", 1, Variant.PT, 2.0),
]


def test_size_formula_on_real_files(tmp_path, capsys):
    """File bits per converted weight, from the file size, within 0.01 of the variant's formula (FORMAT.md §8:
    B128 / G128 2.125 - z, B256 2.0625 - z, ROW 2 - z + 32/K, MATRIX / PT 2 - z) at K = 2048 (the rest of the
    file is a few hundred bytes of header); stats reports the file's bits and the same number for the source."""
    rows = []
    for z in SIZE_ZS:
        for scale, version, variant, base in SIZE_CASES:
            src = tmp_path / f"src-{z}-{scale}.gguf"
            out = tmp_path / f"out-{z}-{variant.name}.gguf"
            if not src.exists():
                _one_tensor_model(src, z, scale, seed=int(100 * z))
            res = convert(src, out, progress=False, format_version=version)
            if z == 1.0:  # all zero: one (zero) scale per matrix is exact and the smallest
                variant, base = (Variant.MATRIX if version == 2 else Variant.PT), 2.0
            assert [r.variant for r in res.converted] == [variant]
            r = open_gguf(out)
            n = K * N
            file_bits = (out.stat().st_size - r.data_offset) * 8 / n
            zm = res.converted[0].zero_density
            assert abs(zm - z) < 0.002
            formula = bits_per_weight(variant, zm, K)
            assert formula == pytest.approx(base - zm)
            assert formula <= file_bits <= formula + 0.01, (z, variant, file_bits, formula)
            m = collect(out, progress=False)
            assert abs(m.file_bits_per_weight - file_bits) < 1e-3  # tensor data vs data section
            assert m.variant_bits[variant.name] == pytest.approx(m.file_bits_per_weight, rel=1e-12)
            if version == 2:
                ms = collect(src, progress=False)
                assert ms.bitcos_auto == pytest.approx(m.file_bits_per_weight, rel=1e-12)
            rows.append((z, variant.name, zm, file_bits, formula))
    with capsys.disabled():
        print("\n  z     variant  measured z  file bpw  formula")
        for z, v, zm, fb, f in rows:
            print(f"  {z:<5} {v:<8} {zm:10.4f} {fb:9.4f} {f:9.4f}")


def test_stats_source_and_bitcos_agree(model_factory, tmp_path):
    """A TQ1_0 MoE model with per-256 scales: its version-2 conversion is B256; stats of source and file agree on
    every variant (the file's other variants computed from its bitmap and scales alone)."""
    src = model_factory(src_type="tq1_0", scale="g128", moe=4)
    out = tmp_path / "o.gguf"
    convert(src, out, progress=False, force_grow=True)  # B256 at z = 0.4 is larger than TQ1_0
    a = collect(src, progress=False)
    b = collect(out, progress=False)
    assert a.n_ternary_tensors == b.n_ternary_tensors == 14
    assert a.n_weights == b.n_weights and a.n_zeros == b.n_zeros
    assert abs(a.zero_density - 0.4) < 0.01
    z = a.zero_density
    assert a.bitcos_symbols == pytest.approx(2 - z)
    # real bits: what the B256 file holds (blocks + companions), not the 2.0625 - z formula
    assert a.variant_bits["B256"] == b.variant_bits["B256"] == pytest.approx(b.file_bits_per_weight, rel=1e-12)
    assert a.bitcos_auto == b.bitcos_auto == a.variant_bits["B256"]
    assert a.variant_bits["B256"] > bits_per_weight(Variant.B256, z)  # + row index and companion
    # per-128 layouts hold per-256 scales too (each twice), 0.0625 bit per weight more
    for name in ("B128", "G128"):
        assert a.variant_bits[name] == b.variant_bits[name]
        assert a.variant_bits[name] - a.variant_bits["B256"] == pytest.approx(0.0625, abs=0.002)
    assert a.bitcos_g128 == a.variant_bits["G128"]
    for name in ("PT", "MATRIX"):  # the 256-blocks' scales differ
        assert a.variant_bits[name] is None and a.not_exact[name] == 14 and b.variant_bits[name] is None
    # ROW holds the 12 tensors with K = 256 (one block per row), not the two ffn_down_exps (K = 768), and costs
    # 2 bytes per row more than B256 there
    assert a.variant_bits["ROW"] is None and a.not_exact["ROW"] == b.not_exact["ROW"] == 2
    per_src = {t.name: t for t in a.tensors}
    q = per_src["blk.0.attn_q.weight"]
    assert q.variant_bytes["ROW"] - q.variant_bytes["B256"] == 2 * q.n_weights // 256
    assert a.bitcos_pt is None
    assert a.baselines["TQ1_0"]["with_scale"] == 1.6875 and a.baselines["TQ2_0"]["with_scale"] == 2.0625
    assert a.baselines["5-trit g128"] == {"symbols": 1.625, "with_scale": 1.75}
    assert a.reduction_auto["TQ1_0"] == pytest.approx(1.6875 / a.bitcos_auto) and a.reduction_auto["TQ1_0"] < 1
    assert a.reduction["B256"]["TQ2_0"] == pytest.approx(2.0625 / a.variant_bits["B256"])
    assert "x larger" in format_text(a).split("TQ1_0", 1)[1].splitlines()[0]  # never "smaller" for larger
    per = {t.name: t for t in b.tensors}
    assert per["blk.0.ffn_down_exps.weight"].type == "BITCOS/B256"
    text = format_text(b, with_tensors=True)
    assert "5-trit g128" in text and "blk.1.attn_v.weight" in text and "file:" in text
    assert "BITCOS B256" in text and "n/a" in text.split("BITCOS MATRIX", 1)[1].splitlines()[0]


def test_stats_on_a_version1_file(model_factory, tmp_path):
    """A version-1 PT file: stats names it and computes the version-2 layouts from it (MATRIX = PT bytes)."""
    src = model_factory(src_type="tq2_0", scale="tensor", z=0.45)
    out = tmp_path / "v1.gguf"
    convert(src, out, progress=False, format_version=1)
    m = collect(out, progress=False)
    assert {t.type for t in m.tensors} == {"BITCOS_PT"}
    assert m.variant_bits["PT"] == pytest.approx(m.file_bits_per_weight, rel=1e-12)
    assert m.variant_bits["MATRIX"] == m.variant_bits["PT"] and m.bitcos_auto == m.variant_bits["MATRIX"]
    assert m.variant_bits["ROW"] > m.variant_bits["MATRIX"]


def test_cli_stats_json_and_plot(model_factory, tmp_path, capsys):
    from ggml_bitcos.cli import main

    src = model_factory()
    png = tmp_path / "fig1.png"
    assert main(["stats", str(src), "--json", "--tensors", "--plot", str(png)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["n_ternary_tensors"] == 14 and len(d["tensors"]) == 14
    assert abs(d["zero_density"] - 0.4) < 0.01
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["stats", str(src), "-q"]) == 0
    assert "zero density z =" in capsys.readouterr().out
