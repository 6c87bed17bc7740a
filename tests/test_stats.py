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


def _one_tensor_model(path, z: float, per_block: bool, seed: int = 0) -> None:
    """A GGUF holding one 2048 x 2048 F16 ternary tensor (fp16 scale per 128 or one per tensor)."""
    rng = np.random.default_rng(seed)
    codes = random_codes(rng, (N, K), z).astype(np.float16)
    if per_block:
        d = rng.uniform(0.01, 0.02, (N, K // 128)).astype(np.float16)
        x = (codes.reshape(N, K // 128, 128) * d[:, :, None]).reshape(N, K)
    else:
        x = codes * np.float16(0.015625)
    with GGUFStreamWriter(path, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_tensor_info("blk.0.ffn_up.weight", T.F16, (K, N))
        w.begin()
        w.write_tensor("blk.0.ffn_up.weight", x)


def test_size_formula_on_real_files(tmp_path, capsys):
    """File bits per converted weight, from the file size: <= (2 - z) + 0.125 + 0.01 (G128) and
    <= (2 - z) + 0.01 (PT), at K = 2048 (the rest of the file is a few hundred bytes of header)."""
    rows = []
    for z in SIZE_ZS:
        for per_block, variant, bound in ((True, Variant.G128, 2.125 - z + 0.01),
                                          (False, Variant.PT, 2.0 - z + 0.01)):
            src = tmp_path / f"src-{z}-{variant}.gguf"
            out = tmp_path / f"out-{z}-{variant}.gguf"
            _one_tensor_model(src, z, per_block, seed=int(100 * z))
            res = convert(src, out, progress=False, scale="g128" if per_block else "tensor")
            assert [r.variant for r in res.converted] == [variant]
            r = open_gguf(out)
            n = K * N
            file_bits = (out.stat().st_size - r.data_offset) * 8 / n
            zm = res.converted[0].zero_density
            assert abs(zm - z) < 0.002
            assert file_bits <= bound, (z, variant, file_bits, bound)
            formula = bits_per_weight(variant, zm)
            assert formula <= file_bits <= formula + 0.01
            m = collect(out, progress=False)
            assert abs(m.file_bits_per_weight - file_bits) < 1e-3        # tensor data vs data section
            rows.append((z, variant.name, zm, file_bits, formula))
    with capsys.disabled():
        print("\n  z     variant  measured z  file bpw  formula (2.125-z | 2-z)")
        for z, v, zm, fb, f in rows:
            print(f"  {z:<5} {v:<8} {zm:10.4f} {fb:9.4f} {f:9.4f}")


def test_stats_source_and_bitcos_agree(model_factory, tmp_path):
    src = model_factory(src_type="tq1_0", scale="g128", moe=4)
    out = tmp_path / "o.gguf"
    convert(src, out, progress=False, force_grow=True)      # G128 at z = 0.4 is larger than TQ1_0
    a = collect(src, progress=False)
    b = collect(out, progress=False)
    assert a.n_ternary_tensors == b.n_ternary_tensors == 14
    assert a.n_weights == b.n_weights and a.n_zeros == b.n_zeros
    assert abs(a.zero_density - 0.4) < 0.01
    z = a.zero_density
    assert a.bitcos_symbols == pytest.approx(2 - z)
    # real bits: what the G128 file holds (blocks + companions), not the 2.125 - z formula
    assert a.bitcos_g128 == b.bitcos_g128 == pytest.approx(b.file_bits_per_weight, rel=1e-12)
    assert a.bitcos_g128 > bits_per_weight(Variant.G128, z)                 # + row index and companion
    assert a.bitcos_pt is None and a.not_exact["PT"] == 14 and b.bitcos_pt is None   # per-256 scales differ
    assert a.baselines["TQ1_0"]["with_scale"] == 1.6875 and a.baselines["TQ2_0"]["with_scale"] == 2.0625
    assert a.baselines["5-trit g128"] == {"symbols": 1.625, "with_scale": 1.75}
    assert a.reduction_g128["TQ1_0"] == pytest.approx(1.6875 / a.bitcos_g128) and a.reduction_g128["TQ1_0"] < 1
    assert "x larger" in format_text(a).split("TQ1_0", 1)[1].splitlines()[0]     # never "smaller" for larger
    per = {t.name: t for t in b.tensors}
    assert per["blk.0.ffn_down_exps.weight"].type == "BITCOS_G128"
    text = format_text(b, with_tensors=True)
    assert "5-trit g128" in text and "blk.1.attn_v.weight" in text and "file:" in text


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
