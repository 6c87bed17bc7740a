"""convert, format version 2: any row length that is a multiple of 32, the scale granularity a model was
trained with (per matrix, per row, per 256, per 128), auto = the smallest exact variant, and the bits per weight each
variant must stay within (FORMAT.md §8).

The references are independent of the code under test: a decoder written here from FORMAT.md §3-§5 alone
(``spec_decode``: the file's bytes through tests/gguf_raw.py, header fields at their documented offsets, the
sign pool read in row-major order without the row index), the source's floats (plain casts), and sizes read
from the written file's tensor table.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from gguf import GGUFValueType
from gguf.constants import GGMLQuantizationType as T

from ggml_bitcos import tq
from ggml_bitcos.cli import main
from ggml_bitcos.convert import ConvertError, convert
from ggml_bitcos.convert_back import convert_back
from ggml_bitcos.format import COMPANION_SUFFIX, KEY_FORMAT_VERSION, Variant
from ggml_bitcos.ternary import random_codes
from gguf_tools import GGUFStreamWriter, open_gguf

from gguf_raw import read_tensor_table

TQ1_0_BITS = 1.6875  # TQ1_0: 54 bytes per 256 weights
TQ2_0_BITS = 2.0625  # TQ2_0: 66 bytes per 256 weights


# --- an independent reader of version-2 tensors (FORMAT.md) ------------------------------------------------


def spec_decode(path, name: str) -> tuple[np.ndarray, int, int]:
    """(fp32 values (R, K), companion variant byte, bytes of weight + companion) of BITCOS weight ``name``."""
    table = read_tensor_table(path)
    w, c = table[name], table[name + COMPANION_SUFFIX]
    assert w.type_id == 162 and c.type_id == 24  # BITCOS, I8 (FORMAT.md §1-2)
    k, rows = w.ne[0], math.prod(w.ne[1:])
    data = path.read_bytes()
    comp = np.frombuffer(data, np.uint8, c.ne[0], c.offset)
    magic, version, variant = struct.unpack_from("<IHB", comp, 0)
    n_cols, n_rows, n_mats, n_sign, scales_off = struct.unpack_from("<5Q", comp, 8)
    pool_off = struct.unpack_from("<Q", comp, 64)[0]
    assert (magic, version, n_cols, n_rows) == (0x53435442, 2, k, rows) and variant in (2, 3, 4, 5)
    bitmap = np.frombuffer(data, np.uint8, rows * k // 8, w.offset).reshape(rows, k // 8)
    present = np.unpackbits(bitmap, axis=1, bitorder="little").astype(bool)
    assert int(present.sum()) == n_sign
    signs = np.unpackbits(comp[pool_off:], bitorder="little")[:n_sign].astype(bool)
    t = np.zeros((rows, k), np.float32)
    t[present] = np.where(signs, -1.0, 1.0)  # row-major order of the non-zeros
    if variant == 2:  # MATRIX: f32 per matrix
        s = np.frombuffer(comp, "<f4", n_mats, scales_off)
        scale = np.repeat(np.repeat(s, rows // n_mats)[:, None], k, axis=1)
    elif variant == 3:  # ROW: f32 per row
        scale = np.repeat(np.frombuffer(comp, "<f4", rows, scales_off)[:, None], k, axis=1)
    else:  # B128 / B256: f16 per block of a row
        n = 128 if variant == 4 else 256
        s = np.frombuffer(comp, "<f2", rows * k // n, scales_off).reshape(rows, k // n).astype(np.float32)
        scale = np.repeat(s, n, axis=1)
    return scale * t, variant, rows * k // 8 + c.ne[0]


VARIANT_BYTE = {Variant.MATRIX: 2, Variant.ROW: 3, Variant.B128: 4, Variant.B256: 5}


def write_model(path, tensors: dict[str, tuple[T, np.ndarray]]) -> None:
    """A GGUF of float tensors; ``data`` in numpy order (BF16: uint16 bit patterns)."""
    with GGUFStreamWriter(path, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        for name, (tt, data) in tensors.items():
            w.add_tensor_info(name, tt, tuple(reversed(data.shape)))
        w.begin()
        for name, (tt, data) in tensors.items():
            w.write_tensor(name, data)


def as_type(x: np.ndarray, tt: T) -> np.ndarray:
    if tt == T.F16:
        return x.astype(np.float16)
    if tt == T.BF16:
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return x.astype(np.float32)


def source_floats(x: np.ndarray, tt: T) -> np.ndarray:
    """The fp32 values a source tensor holds, (R, K)."""
    if tt == T.BF16:
        v = (x.astype(np.uint32) << 16).view(np.float32)
    else:
        v = x.astype(np.float32)
    return v.reshape(-1, x.shape[-1])


def bits_equal_up_to_zero_sign(got: np.ndarray, want: np.ndarray) -> bool:
    w = want.view(np.uint32)
    return bool(np.array_equal(got.view(np.uint32), np.where(w == 0x80000000, np.uint32(0), w)))


# --- any row length that is a multiple of 32 ---------------------------------------------------------------

# (K, rows or (rows, experts), zero density, scale granularity, source type)
ODD_SHAPES = [
    (32, 7, 0.4, "row", T.F32),
    (96, 5, 0.0, "matrix", T.F16),
    (160, 9, 1.0, "matrix", T.F16),
    (576, 11, 0.42, "row", T.BF16),
    (576, (6, 3), 0.35, "matrix", T.F16),
    (640, 4, 0.5, "row", T.F16),
    (1536, 3, 0.3, "matrix", T.F32),
    (640, (3, 2), 0.4, "row", T.F32),
]


@pytest.fixture(scope="module")
def odd_model(tmp_path_factory):
    rng = np.random.default_rng(576)
    tensors, want = {}, {}
    for i, (k, rows, z, gran, tt) in enumerate(ODD_SHAPES):
        shape = (rows[1], rows[0], k) if isinstance(rows, tuple) else (rows, k)
        codes = random_codes(rng, shape, z)
        if gran == "matrix":  # one scale per matrix (per expert of a 3-D tensor): fp32 values fp16 lacks
            lead = shape[:1] + (1,) * (len(shape) - 1) if len(shape) == 3 else (1, 1)
            s = rng.uniform(0.01, 0.1, lead).astype(np.float32)
        else:  # one arbitrary scale per row
            s = rng.uniform(0.01, 0.1, shape[:-1] + (1,)).astype(np.float32)
        x = as_type(codes.astype(np.float32) * s, tt)
        name = f"blk.{i}.ffn_up{'_exps' if len(shape) == 3 else ''}.weight"
        tensors[name] = (tt, x)
        # a row scale that is not a bf16 value changes the values of a BF16 source: BF16 holds its own values
        want[name] = (Variant.MATRIX if gran == "matrix" or z == 1.0 else Variant.ROW, source_floats(x, tt))
    d = tmp_path_factory.mktemp("odd")
    src, out = d / "odd.gguf", d / "odd-bitcos.gguf"
    write_model(src, tensors)
    res = convert(src, out, progress=False, force_grow=True)
    return src, out, res, want


def test_odd_row_lengths_convert_bit_exactly(odd_model):
    """K = 32, 96, 160, 576, 640, 1536, 2-D and 3-D, z = 0 / 0.3-0.5 / 1, per-matrix and per-row scales: every
    tensor converts (MATRIX / ROW) and the spec decoder gives the source's fp32 bits back."""
    src, out, res, want = odd_model
    assert res.verified and {r.name for r in res.converted} == set(want)
    for name, (variant, x) in want.items():
        got, vbyte, _nbytes = spec_decode(out, name)
        assert vbyte == VARIANT_BYTE[variant], name
        assert bits_equal_up_to_zero_sign(got, x), name
    r = open_gguf(out)
    assert r.get_field(KEY_FORMAT_VERSION).contents() == 2
    assert r.get_field("general.file_type").contents() == 162  # mostly BITCOS (version 2)


def test_odd_row_lengths_refused_in_version_1(odd_model, tmp_path):
    """Version 1: rows a multiple of 128 and PT (one scale per matrix) or G128 (fp16 per 128: an F16 source's
    row scales); the per-row fp32 scales of the F32 / BF16 sources have no version-1 form."""
    src, _out, _res, want = odd_model
    res = convert(src, tmp_path / "v1.gguf", progress=False, force_grow=True, format_version=1, allow_copy=True)
    table = read_tensor_table(src)
    assert {r.name for r in res.converted} == {
        n
        for n, (v, _x) in want.items()
        if table[n].ne[0] % 128 == 0 and (v == Variant.MATRIX or table[n].type_id == int(T.F16))
    }
    for r in res.skipped:
        assert "multiple of 128" in r.reason or r.reason.startswith("no variant holds"), (r.name, r.reason)


def test_not_a_multiple_of_32_reported(tmp_path):
    rng = np.random.default_rng(3)
    x = random_codes(rng, (4, 100), 0.4).astype(np.float16) * np.float16(0.25)
    y = random_codes(rng, (4, 64), 0.4).astype(np.float16) * np.float16(0.25)
    src = tmp_path / "k100.gguf"
    write_model(src, {"blk.0.ffn_down.weight": (T.F16, x), "blk.0.ffn_up.weight": (T.F16, y)})
    res = convert(src, tmp_path / "o.gguf", progress=False, force_grow=True)
    assert [r.name for r in res.converted] == ["blk.0.ffn_up.weight"]
    r = {r.name: r for r in res.skipped}["blk.0.ffn_down.weight"]
    assert r.ternary_looking and r.reason == "row length 100 is not a multiple of 32"


# --- auto: the fewest bytes among the exact variants, ties to the coarser ---------------------------------------


def _sizes_from_file(path) -> dict[str, int]:
    table = read_tensor_table(path)
    return {
        n: math.prod(t.ne[1:]) * t.ne[0] // 8 + table[n + COMPANION_SUFFIX].ne[0]
        for n, t in table.items()
        if t.type_id == 162
    }


def test_auto_is_the_smallest_exact_variant(tmp_path):
    """Per-row fp16 scales at K = 256 / 512 / 1024 (ROW and both block variants exact), per-256 scales (B256 and
    B128), per-128 scales (B128 only): auto writes what the smallest forced conversion writes, and on a tie
    (K = 512: 4 bytes of scales per row either way) the coarser, ROW."""
    rng = np.random.default_rng(12)

    def ternary(rows, k, group):
        codes = random_codes(rng, (rows, k), 0.4).astype(np.float32)
        s = np.repeat(rng.uniform(0.01, 0.1, (rows, k // group)).astype(np.float16).astype(np.float32), group, 1)
        return (codes * s).astype(np.float16)

    tensors = {
        "blk.0.attn_q.weight": (T.F16, ternary(64, 256, 256)),  # ROW 4 B/row > B256 2 B/row
        "blk.0.attn_k.weight": (T.F16, ternary(64, 512, 512)),  # ROW = B256: tie -> ROW
        "blk.0.attn_v.weight": (T.F16, ternary(64, 1024, 1024)),  # ROW 4 B/row < B256 8 B/row
        "blk.0.ffn_up.weight": (T.F16, ternary(64, 1024, 256)),  # B256 < B128
        "blk.0.ffn_down.weight": (T.F16, ternary(64, 1024, 128)),
    }  # B128 only
    src = tmp_path / "src.gguf"
    write_model(src, tensors)
    forced = {}
    for scale in ("tensor", "row", "256", "128"):
        out = tmp_path / f"{scale}.gguf"
        convert(src, out, scale=scale, progress=False, force_grow=True, allow_copy=True)
        forced[scale] = _sizes_from_file(out)
    auto = tmp_path / "auto.gguf"
    res = convert(src, auto, progress=False, force_grow=True)
    got = _sizes_from_file(auto)
    chosen = {r.name: r.variant for r in res.converted}
    assert chosen == {
        "blk.0.attn_q.weight": Variant.B256,
        "blk.0.attn_k.weight": Variant.ROW,
        "blk.0.attn_v.weight": Variant.ROW,
        "blk.0.ffn_up.weight": Variant.B256,
        "blk.0.ffn_down.weight": Variant.B128,
    }
    order = ("tensor", "row", "256", "128")  # coarse to fine
    for name in tensors:
        options = [(forced[s][name], order.index(s)) for s in order if name in forced[s]]
        assert got[name] == min(options)[0], name
        assert spec_decode(auto, name)[1] == VARIANT_BYTE[chosen[name]]
    assert forced["row"]["blk.0.attn_k.weight"] == forced["256"]["blk.0.attn_k.weight"]  # a real tie


# --- bits per weight within the format's bounds --------------------------------------------------------------


def test_per_row_scaled_model_within_target(tmp_path, capsys):
    """A per-row-scaled model (TriLM / ParetoQ style: one fp32 scale per output channel, any fp32 value) converts
    to ROW at <= 2 - z + 32/K + 0.01 bits per weight, measured from the file (FORMAT.md §8: K >= 2048 and
    >= 2 M weights per tensor)."""
    rng = np.random.default_rng(2048)
    specs = {
        "blk.0.ffn_up.weight": (1024, 2048, 0.42),
        "blk.0.ffn_down.weight": (768, 2816, 0.30),
        "blk.0.attn_q.weight": (768, 3072, 0.55),
    }
    tensors = {}
    for name, (rows, k, z) in specs.items():
        codes = random_codes(rng, (rows, k), z)
        s = rng.lognormal(-4, 0.5, (rows, 1)).astype(np.float32)  # fp32 scales fp16 does not hold
        tensors[name] = (T.F32, codes.astype(np.float32) * s)
    src, out = tmp_path / "rows.gguf", tmp_path / "rows-bitcos.gguf"
    write_model(src, tensors)
    assert main(["convert", str(src), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    sizes = _sizes_from_file(out)
    for name, (rows, k, _z) in specs.items():
        x, vbyte, nbytes = spec_decode(out, name)
        assert vbyte == VARIANT_BYTE[Variant.ROW] and nbytes == sizes[name]
        assert bits_equal_up_to_zero_sign(x, tensors[name][1])
        z = 1 - np.count_nonzero(x) / x.size
        bits = 8 * nbytes / x.size
        assert bits <= 2 - z + 32 / k + 0.01, (name, bits, z)
        assert bits > 2 - z + 32 / k  # the index is not free
    # the summary names the variant and its real bits per weight
    n = sum(r * k for r, k, _z in specs.values())
    z_all = 1 - sum(np.count_nonzero(spec_decode(out, nm)[0]) for nm in specs) / n
    line = next(ln for ln in err.splitlines() if ln.strip().startswith("ROW"))
    assert f"{8 * sum(sizes.values()) / n:.4f} bits per weight" in line and f"z = {z_all:.4f}" in line
    assert "fp32 per row" in line and "3 tensor(s)" in line


def _tq_model(path, tt: T, z: float, rows: int = 512, k: int = 2048, seed: int = 0) -> np.ndarray:
    """One TQ tensor whose 256-blocks carry different scales (llama.cpp's quantizer: absmax per block)."""
    rng = np.random.default_rng(seed)
    codes = random_codes(rng, (rows, k), z)
    d = rng.uniform(0.01, 0.02, (rows, k // 256)).astype(np.float16)
    enc = tq.tq2_0_encode if tt == T.TQ2_0 else tq.tq1_0_encode
    with GGUFStreamWriter(path, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_tensor_info("blk.0.ffn_up.weight", tt, (k, rows))
        w.begin()
        w.write_tensor("blk.0.ffn_up.weight", enc(codes, d))
    return d


@pytest.mark.parametrize("z,smaller", [(0.42, True), (0.30, False)])
def test_tq2_0_with_varying_block_scales_against_tq1_0(tmp_path, z, smaller):
    """A TQ2_0 tensor with a different fp16 scale per 256-block converts to B256 (one scale per block, not two as
    G128 stored it) at 2.0625 - z + index bits: smaller than its TQ1_0 form (1.6875) at z = 0.42 and not at
    z = 0.30. Then the grow rule: from TQ2_0 it converts at either z (smaller than 2.0625); the same weights as
    TQ1_0 convert at z = 0.42 and stay TQ1_0 at z = 0.30 (unless --force-grow)."""
    src2, src1 = tmp_path / "tq2.gguf", tmp_path / "tq1.gguf"
    d = _tq_model(src2, T.TQ2_0, z)
    _tq_model(src1, T.TQ1_0, z)
    out2 = tmp_path / "tq2-bitcos.gguf"
    res = convert(src2, out2, progress=False)
    assert [r.variant for r in res.converted] == [Variant.B256]
    name = "blk.0.ffn_up.weight"
    x, vbyte, nbytes = spec_decode(out2, name)
    assert vbyte == VARIANT_BYTE[Variant.B256]
    n = x.size
    bits = 8 * nbytes / n
    z_real = 1 - np.count_nonzero(x) / n
    index = bits - (TQ2_0_BITS - z_real)  # row index, header, alignment: what B256 adds
    # FORMAT.md §8: 16 + 64/G bits per row (G = 64 rows per group at this density), a 128-byte header,
    # <= 3 x 63 alignment bytes, a 64-byte tail
    assert 0 < index <= (16 + 64 / 64) / 2048 + 8 * (128 + 3 * 63 + 64) / n
    assert bits < TQ2_0_BITS
    assert (bits < TQ1_0_BITS) == smaller == (TQ2_0_BITS - z_real + index < TQ1_0_BITS)
    # the stored B256 scales are the source's d, one per 256-block
    c = read_tensor_table(out2)[name + COMPANION_SUFFIX]
    comp = np.frombuffer(out2.read_bytes(), np.uint8, c.ne[0], c.offset)
    off = struct.unpack_from("<Q", comp, 40)[0]
    assert np.array_equal(np.frombuffer(comp, "<f2", d.size, off).reshape(d.shape), d)
    # as TQ1_0: converted when smaller, else kept (the summary says why) unless forced
    out1 = tmp_path / "tq1-bitcos.gguf"
    res1 = convert(src1, out1, progress=False, allow_copy=True)
    if smaller:
        assert [r.variant for r in res1.converted] == [Variant.B256]
        assert _sizes_from_file(out1)[name] == nbytes
    else:
        assert not res1.converted and res1.skipped[0].grow_kept
        assert read_tensor_table(out1)[name].type_id == int(T.TQ1_0)
        assert "BITCOS B256 would grow it" in res1.skipped[0].reason
        with pytest.raises(ConvertError, match="--force-grow"):
            convert(src1, tmp_path / "strict.gguf", progress=False, strict=True)
        res_f = convert(src1, tmp_path / "forced.gguf", progress=False, force_grow=True)
        assert [r.variant for r in res_f.converted] == [Variant.B256]
    # version 1 stored each 256-block's scale twice (G128): 1/16 bit more per weight
    out_v1 = tmp_path / "tq2-v1.gguf"
    convert(src2, out_v1, progress=False, format_version=1)
    t = read_tensor_table(out_v1)
    v1_bytes = 512 * 2048 // 128 * 18 + t[name + COMPANION_SUFFIX].ne[0]
    assert t[name].type_id == 160 and 8 * v1_bytes / n - bits == pytest.approx(1 / 16, abs=1e-3)


# --- the way back from the version-2 variants ------------------------------------------------------------


def test_row_variant_back_to_stock_types(tmp_path):
    """ROW -> TQ2_0 / TQ1_0 needs K % 256 and fp16 row scales (FORMAT.md §10); F16 needs fp16 values; F32
    always. K = 576 (no TQ block) converts back to F16 exactly."""
    rng = np.random.default_rng(10)
    c1, c2, c3 = (random_codes(rng, (6, k), 0.4).astype(np.float32) for k in (512, 512, 576))
    s16 = rng.uniform(0.01, 0.1, (6, 1)).astype(np.float16).astype(np.float32)
    s32 = s16 * np.float32(1 + 2**-20)  # not fp16, not bf16
    src = tmp_path / "rows.gguf"
    write_model(
        src,
        {
            "blk.0.attn_q.weight": (T.F32, c1 * s16),
            "blk.0.attn_k.weight": (T.F32, c2 * s32),
            "blk.0.attn_v.weight": (T.F16, (c3 * s16).astype(np.float16)),
        },
    )
    mid = tmp_path / "mid.gguf"
    res = convert(src, mid, progress=False, force_grow=True, scale="row")
    assert {r.variant for r in res.converted} == {Variant.ROW} and len(res.converted) == 3
    with pytest.raises(ConvertError, match=r"attn_k\.weight' \(ROW\).*row 0: fp32 scale .* is not an fp16 value"):
        convert_back(mid, tmp_path / "tq2.gguf", to="tq2_0", progress=False)
    back = convert_back(mid, tmp_path / "tq2.gguf", to="tq2_0", fallback="f32", progress=False)
    targets = {r.name: r.target for r in back.tensors}
    assert targets == {"blk.0.attn_q.weight": "tq2_0", "blk.0.attn_k.weight": "f32", "blk.0.attn_v.weight": "f32"}
    assert "not a multiple of 256" in {r.name: r for r in back.tensors}["blk.0.attn_v.weight"].reason
    f16 = convert_back(mid, tmp_path / "f16.gguf", to="f16", fallback="f32", progress=False)
    assert {r.name: r.target for r in f16.tensors}["blk.0.attn_v.weight"] == "f16"
    assert {r.name: r.target for r in f16.tensors}["blk.0.attn_k.weight"] == "f32"
    # values: every converted-back tensor dequantizes (gguf-py) to the BITCOS values
    from gguf.quants import dequantize

    for path in (tmp_path / "tq2.gguf", tmp_path / "f16.gguf"):
        for t in open_gguf(path).tensors:
            want = spec_decode(mid, t.name)[0]
            got = dequantize(np.asarray(t.data), t.tensor_type).reshape(want.shape).astype(np.float32)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (path.name, t.name)


def test_format_version_of_mixed_files(tmp_path):
    """bitcos.format_version is the highest version of the file's BITCOS tensors: a version-1 file whose other
    tensors are converted now (version 2) says 2; version 1 written alone says 1."""
    rng = np.random.default_rng(4)
    a = random_codes(rng, (4, 256), 0.4).astype(np.float16) * np.float16(0.25)
    b = random_codes(rng, (4, 96), 0.4).astype(np.float16) * np.float16(0.25)
    src = tmp_path / "mix.gguf"
    write_model(src, {"blk.0.attn_q.weight": (T.F16, a), "blk.0.attn_k.weight": (T.F16, b)})
    v1 = tmp_path / "v1.gguf"
    res = convert(src, v1, progress=False, force_grow=True, format_version=1)
    assert [r.name for r in res.converted] == ["blk.0.attn_q.weight"]  # K = 96: no version-1 form
    r1 = open_gguf(v1)
    assert r1.get_field(KEY_FORMAT_VERSION).contents() == 1 and r1.get_field("general.file_type").contents() == 161
    both = tmp_path / "both.gguf"
    res = convert(v1, both, progress=False, force_grow=True)
    assert [(r.name, r.variant) for r in res.converted] == [("blk.0.attn_k.weight", Variant.MATRIX)]
    table = read_tensor_table(both)
    assert table["blk.0.attn_q.weight"].type_id == 161 and table["blk.0.attn_k.weight"].type_id == 162
    assert open_gguf(both).get_field(KEY_FORMAT_VERSION).contents() == 2
