"""``ggml-bitcos info``: the per-tensor BITCOS view against an independent reading of the file (tests/gguf_raw.py
for offsets and shapes, the generated codes for z), and one-line errors for broken files."""

from __future__ import annotations

import json
import math
import shutil
import struct

import numpy as np
import pytest
from gguf import GGUFValueType
from gguf.constants import GGMLQuantizationType as T

from ggml_bitcos.cli import main
from ggml_bitcos.convert import convert
from ggml_bitcos.format import COMPANION_SUFFIX, QK, Variant
from ggml_bitcos.ternary import random_codes
from gguf_tools import GGUFStreamWriter

from gguf_raw import read_tensor_table

# (name, ggml shape, zero density, per-128 scales?) — odd row counts, a 3-D (MoE-like) weight, z = 0 and 1
SPECS = [
    ("blk.0.attn_q.weight", (384, 3), 0.42, False),
    ("blk.0.ffn_up.weight", (256, 7), 0.0, True),
    ("blk.0.ffn_down.weight", (128, 5), 1.0, True),
    ("blk.0.ffn_gate_exps.weight", (384, 5, 3), 0.3, True),
    ("blk.0.attn_k.weight", (640, 129), 0.55, False),
]


def _write_model(path, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    codes_by_name = {}
    with GGUFStreamWriter(path, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        data = []
        for name, ne, z, per_block in SPECS:
            k, rows = ne[0], math.prod(ne[1:])
            codes = random_codes(rng, (rows, k), z)
            if per_block:
                d = rng.uniform(0.01, 0.02, (rows, k // QK)).astype(np.float16)
                x = (codes.reshape(rows, k // QK, QK).astype(np.float16) * d[:, :, None]).reshape(rows, k)
            else:
                x = codes.astype(np.float16) * np.float16(0.25)
            w.add_tensor_info(name, T.F16, ne)
            data.append((name, x))
            codes_by_name[name] = codes
        w.add_tensor_info("output_norm.weight", T.F32, (256,))
        w.begin()
        for name, x in data:
            w.write_tensor(name, x)
        w.write_tensor("output_norm.weight", np.ones(256, np.float32))
    return codes_by_name


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    d = tmp_path_factory.mktemp("info")
    src, out = d / "src.gguf", d / "out.gguf"
    codes = _write_model(src)
    res = convert(src, out, progress=False)
    assert len(res.converted) == len(SPECS)
    return out, codes


def test_info_matches_independent_reading(converted, capsys):
    out, codes = converted
    table = read_tensor_table(out)
    raw = out.read_bytes()
    assert main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format_version"] == 2 and info["versions"] == [2] and info["converted_from"] == "F16"
    by_name = {t["name"]: t for t in info["tensors"]}
    assert set(by_name) == {name for name, *_ in SPECS}
    names = list(table)
    tot_bytes = tot_w = tot_nz = 0
    for name, ne, z, per_block in SPECS:
        t = by_name[name]
        c = codes[name]
        n = c.size
        nz = int(np.count_nonzero(c))
        wt, comp = table[name], table[name + COMPANION_SUFFIX]
        variant = Variant(raw[comp.offset + 6])  # the companion header's variant byte
        assert wt.type_id == variant.type_id == 162
        assert t["variant"] == variant.name and t["shape"] == list(ne) and t["index"] == names.index(name)
        # random fp16 scales per 128: B128; one scale (or none: all zero): MATRIX (FORMAT.md §7, fewest bytes)
        assert variant == (Variant.B128 if per_block and z < 1 else Variant.MATRIX)
        assert t["n_weights"] == n and t["n_nonzero"] == nz
        assert t["zero_density"] == pytest.approx(1 - nz / n, abs=0)
        rows, k = math.prod(ne[1:]), ne[0]
        weight_bytes = rows * k // 8  # version 2: the bitmap alone
        comp_bytes = comp.ne[0]
        assert t["weight_bytes"] == weight_bytes and t["companion_bytes"] == comp_bytes
        assert t["bits_per_weight"] == pytest.approx(8 * (weight_bytes + comp_bytes) / n, rel=1e-12)
        # the row index from the header's row_group_log2 (byte 7 of the companion data)
        g = 1 << raw[comp.offset + 7]
        assert t["row_group"] == g
        assert t["index_bits_per_weight"] == pytest.approx(8 * (8 * -(-rows // g) + 2 * rows) / n, rel=1e-12)
        m = math.prod(ne[2:]) if len(ne) > 2 else 1
        scale_bits = 8 * (4 * m if variant == Variant.MATRIX else 2 * n // QK) / n
        assert t["scale_bits_per_weight"] == pytest.approx(scale_bits, rel=1e-12)
        tot_bytes += weight_bytes + comp_bytes
        tot_w += n
        tot_nz += nz
    assert info["totals"]["bits_per_weight"] == pytest.approx(8 * tot_bytes / tot_w, rel=1e-12)
    assert info["totals"]["zero_density"] == pytest.approx(1 - tot_nz / tot_w, rel=1e-12)

    # the text form: one gguf-dump-style line per BITCOS weight, numbered 1-based as gguf-dump numbers tensors
    assert main(["info", str(out), "--check"]) == 0
    text = capsys.readouterr().out
    for name, *_ in SPECS:
        line = next(ln for ln in text.splitlines() if ln.endswith(f"| {name}"))
        assert line.strip().startswith(f"{names.index(name) + 1}:")
        assert f"{by_name[name]['zero_density']:.4f}" in line and f"{by_name[name]['bits_per_weight']:.4f}" in line
    assert "format version 2" in text and f"{tot_w:,} BITCOS weights" in text


def test_info_on_a_file_without_bitcos(tmp_path, capsys):
    src = tmp_path / "src.gguf"
    _write_model(src)
    assert main(["info", str(src)]) == 0
    assert "no BITCOS tensors" in capsys.readouterr().out


def _patch(src, dst, offset: int, data: bytes) -> None:
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _one_line_error(capsys, argv: list[str], *needles: str) -> str:
    assert main(argv) == 1
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert "\n" not in err and "Traceback" not in err and cap.out == ""
    for s in needles:
        assert s in err, (s, err)
    return err


def test_info_errors_name_file_tensor_problem(converted, tmp_path, capsys):
    out, _codes = converted
    table = read_tensor_table(out)
    name = "blk.0.ffn_gate_exps.weight"
    comp = table[name + COMPANION_SUFFIX]

    bad = tmp_path / "magic.gguf"
    _patch(out, bad, comp.offset, b"XXXX")
    _one_line_error(capsys, ["info", str(bad)], str(bad), f"tensor '{name}'", "bad companion magic")

    # header parses, but K disagrees with the weight's shape: a MATRIX tensor, whose layout does not depend on K
    q = "blk.0.attn_q.weight"
    bad = tmp_path / "ncols.gguf"
    _patch(out, bad, table[q + COMPANION_SUFFIX].offset + 8, struct.pack("<Q", 768))
    _one_line_error(capsys, ["info", str(bad)], str(bad), f"tensor '{q}'", "does not match the weight")
    # the same edit on a B128 tensor moves its scales section: the offsets are no longer canonical
    bad = tmp_path / "ncols-b128.gguf"
    _patch(out, bad, comp.offset + 8, struct.pack("<Q", 768))
    _one_line_error(capsys, ["info", str(bad)], str(bad), f"tensor '{name}'", "not canonical")
    # a version-2 variant in a version-1 header
    bad = tmp_path / "v1.gguf"
    _patch(out, bad, comp.offset + 4, struct.pack("<H", 1))
    _one_line_error(capsys, ["info", str(bad)], str(bad), f"tensor '{name}'", "belongs to format version 2")

    bad = tmp_path / "version.gguf"
    _patch(out, bad, comp.offset + 4, struct.pack("<H", 9))
    _one_line_error(capsys, ["info", str(bad)], str(bad), f"tensor '{name}'", "version 9")

    # a set bit in the sign pool's zero tail: the header is fine; info validates like the loader,
    # with or without --check
    bad = tmp_path / "tail.gguf"
    _patch(out, bad, comp.offset + comp.ne[0] - 1, b"\x01")
    _one_line_error(capsys, ["info", str(bad)], str(bad), f"tensor '{name}'", "beyond n_sign_bits")
    _one_line_error(capsys, ["info", "--check", str(bad)], str(bad), f"tensor '{name}'", "beyond n_sign_bits")

    _one_line_error(capsys, ["info", str(tmp_path / "nope.gguf")], "nope.gguf", "no such file")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all, just text")
    _one_line_error(capsys, ["info", str(junk)], str(junk), "not a GGUF file")
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(out.read_bytes()[: comp.offset + 10])
    _one_line_error(capsys, ["info", str(trunc)], str(trunc), "truncated")


def test_info_weight_without_companion(tmp_path, capsys):
    path = tmp_path / "lonely.gguf"
    from gguf_tools import bitcos_type

    with GGUFStreamWriter(path, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_tensor_info("blk.0.ffn_up.weight", bitcos_type(Variant.PT), (128, 2))
        w.begin()
        w.write_tensor("blk.0.ffn_up.weight", np.zeros(2 * 16, np.uint8))
    _one_line_error(capsys, ["info", str(path)], str(path), "tensor 'blk.0.ffn_up.weight'", "without its companion")
