"""Foreign ternary inputs: bitnet.cpp's I2_S and Prism ML's Q2_0 / PQ2_0 / PTQ1_0 (docs/FORMAT.md, "Input
formats"). Files are written here byte by byte (a small GGUF writer of this module, not gguf-py) with
``ggml_bitcos.foreign``'s encoders, converted with ``ggml-bitcos convert``, and every converted tensor is
compared bit for bit with an element-by-element dequantizer written in this file straight from the layout
description (not with the decoders the converter uses).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from foreign_gguf import (
    TYPE_ID,
    _kv_string,
    _kv_u32,
    quantize_i2_s,
    quantize_q2_0_g128,
    read_raw,
    spec_dequantize,
    write_raw,
)
from ggml_bitcos import codec, foreign
from ggml_bitcos.format import BITCOS_TYPE_IDS, COMPANION_SUFFIX, Variant
from ggml_bitcos.ternary import random_codes

FORMATS = ["I2_S", "Q2_0", "PQ2_0", "PTQ1_0"]


# --- building sources ------------------------------------------------------------------------------


def encode(fmt: str, codes: np.ndarray, scales) -> bytes:
    if fmt == "I2_S":
        return foreign.i2_s_encode(codes, scales).tobytes()
    return {"Q2_0": foreign.q2_0_encode, "PQ2_0": foreign.pq2_0_encode, "PTQ1_0": foreign.ptq1_0_encode}[fmt](
        codes, scales
    ).tobytes()


def random_scales(fmt: str, rng: np.random.Generator, rows: int, k: int):
    """Per-source-granularity scales; Q2_0's two 64-halves of every 128-block share one d (G128-exact)."""
    if fmt == "I2_S":
        return np.float32(rng.uniform(0.01, 0.1))  # an fp32 that fp16 does not hold, typically
    if fmt == "Q2_0":
        d = rng.uniform(0.01, 0.1, (rows, k // 128)).astype(np.float16)
        return np.repeat(d, 2, axis=1)
    return rng.uniform(0.01, 0.1, (rows, k // 128)).astype(np.float16)


SHAPES = {"blk.0.attn_q.weight": (384, 5), "blk.0.ffn_up_exps.weight": (256, 3, 2), "blk.1.attn_k.weight": (128, 7)}
DENSITY = {"blk.0.attn_q.weight": 0.4, "blk.0.ffn_up_exps.weight": 0.0, "blk.1.attn_k.weight": 1.0}


def build_source(path: Path, fmt: str, seed: int = 0, extra_kv: bytes = b"", n_extra: int = 0) -> Path:
    rng = np.random.default_rng([seed, TYPE_ID[fmt]])
    kv = _kv_string("general.architecture", "llama") + _kv_string("general.name", f"foreign {fmt}") + extra_kv
    tensors = [("blk.0.attn_norm.weight", (384,), 0, np.ones(384, dtype="<f4").tobytes())]
    for name, ne in SHAPES.items():
        k, rows = ne[0], math.prod(ne[1:])
        codes = random_codes(rng, (rows, k), DENSITY[name])
        tensors.append((name, ne, TYPE_ID[fmt], encode(fmt, codes, random_scales(fmt, rng, rows, k))))
    return write_raw(path, 2 + n_extra, kv, tensors)


def run_convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ggml_bitcos", "convert", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


# --- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("z", [0.0, 0.4, 1.0])
def test_codec_against_spec(fmt, z):
    """encode -> bytes -> (a) the decoders give the codes and scales back, (b) the spec dequantizer agrees."""
    rng = np.random.default_rng([1, TYPE_ID[fmt], int(z * 10)])
    rows, k = 3, 384
    codes = random_codes(rng, (rows, k), z)
    scales = random_scales(fmt, rng, rows, k)
    raw = encode(fmt, codes, scales)
    if fmt == "I2_S":
        assert len(raw) == foreign.i2_s_nbytes(rows * k)
        dc, ds = foreign.i2_s_decode(np.frombuffer(raw, np.uint8)[: rows * k // 4], scales, k)
        want = codes.astype(np.float32) * np.float32(scales)
    else:
        dec = {"Q2_0": foreign.q2_0_decode, "PQ2_0": foreign.pq2_0_decode, "PTQ1_0": foreign.ptq1_0_decode}[fmt]
        dc, ds = dec(np.frombuffer(raw, np.uint8).reshape(rows, -1))
        assert np.array_equal(ds.view(np.uint16), np.asarray(scales, dtype=np.float16).view(np.uint16))
        group = k // ds.shape[1]
        want = codes.astype(np.float32) * np.repeat(ds.astype(np.float32), group, axis=1)
    assert np.array_equal(dc, codes)
    assert np.array_equal(spec_dequantize(fmt, raw, (k, rows)).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", ["Q2_0", "PQ2_0"])
def test_q2_code_plus_two(fmt):
    """The 2-bit types' fourth code (+2·d) round-trips and dequantizes to 2·d."""
    codes = np.array([[2, -1, 0, 1] * 32], dtype=np.int8)
    d = np.full((1, 128 // (64 if fmt == "Q2_0" else 128)), 0.5, dtype=np.float16)
    raw = encode(fmt, codes, d)
    assert np.array_equal(spec_dequantize(fmt, raw, (128, 1)), codes.astype(np.float32) * 0.5)


def _check_bit_exact(src: Path, out: Path, fmt: str) -> dict[str, int]:
    _n, _kv, s_tensors = read_raw(src)
    _n, _kv, o_tensors = read_raw(out)
    o = {n: (ne, tt, raw) for n, ne, tt, raw in o_tensors}
    types, variants = {}, {}
    for name, ne, tt, raw in s_tensors:
        ne_o, tt_o, raw_o = o[name]
        types[name] = tt_o
        if tt != TYPE_ID[fmt] or tt_o == tt:  # copied (or kept) byte for byte
            assert (tt_o, raw_o[: len(raw)]) == (tt, raw)
            continue
        assert tt_o in BITCOS_TYPE_IDS and ne_o == ne, name
        comp = o[name + COMPANION_SUFFIX][2]
        k, rows = ne[0], math.prod(ne[1:])
        # the weight's bytes (FORMAT.md §2/§3, written out): 18 / 16 per 128 weights (v1), K/8 per row (v2)
        n_bytes = {160: rows * k // 128 * 18, 161: rows * k // 128 * 16, 162: rows * k // 8}[tt_o]
        dec = codec.decode(
            np.frombuffer(raw_o, np.uint8)[:n_bytes], np.frombuffer(comp, np.uint8), tt_o, k, rows, codec.n_mats_of(ne)
        )
        variants[name] = dec.variant
        got = dec.to_float(slice(0, rows)).view(np.uint32)
        want = spec_dequantize(fmt, raw, ne).view(np.uint32)
        want = np.where(want == np.uint32(0x80000000), np.uint32(0), want)  # -0.0 -> +0.0 (FORMAT.md §5)
        assert np.array_equal(got, want), name
    return types, variants


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("fmt", FORMATS)
def test_convert_bit_exact(tmp_path, fmt, version):
    """z = 0.4, 0 and 1, a 3-D tensor, odd row counts: every tensor converts and decodes to the source's values;
    I2_S (one scale per tensor) as PT / MATRIX, the per-128 (Q2_0: per-64, equal in pairs) sources as G128 /
    B128, or ROW where a row is one 128-block (K = 128: one scale per row; ROW and B128 take the same
    bytes, and auto takes the coarser)."""
    src = build_source(tmp_path / f"{fmt}.gguf", fmt)
    out = tmp_path / f"{fmt}-bitcos.gguf"
    # --force-grow: tensors this small grow by the companion's fixed overhead (Q2_0 would stay as it is; the
    # types llama.cpp cannot load convert regardless)
    r = run_convert(
        str(src), "-o", str(out), "-q", "--format-version", str(version), *(["--force-grow"] if fmt == "Q2_0" else [])
    )
    assert r.returncode == 0, r.stdout
    _types, variants = _check_bit_exact(src, out, fmt)
    per_matrix, per_block = (Variant.PT, Variant.G128) if version == 1 else (Variant.MATRIX, Variant.B128)
    for name in SHAPES:
        if DENSITY[name] == 1.0 or fmt == "I2_S":
            want = per_matrix  # an all-zero tensor (z = 1) has one magnitude (none) per matrix
        elif SHAPES[name][0] == 128 and version == 2:
            want = Variant.ROW
        else:
            want = per_block
        assert variants[name] == want, name


def test_q2_0_split_scales_stay_q2_0(tmp_path):
    """Q2_0 (fp16 per 64) converts where one scale per matrix, per row or per 128 holds its scales: a 128-block's
    halves equal -> B128; one scale per row, K = 576 (no 128-blocks) -> ROW; one per matrix, K = 576 -> MATRIX.
    Halves with different d: no BITCOS variant holds them; the tensor stays Q2_0 (llama.cpp runs it), the
    summary says why, and --strict refuses."""
    rng = np.random.default_rng(5)
    codes = random_codes(rng, (4, 256), 0.4)
    d = rng.uniform(0.01, 0.1, (4, 4)).astype(np.float16)  # every 64-half its own scale
    ok_codes = random_codes(rng, (4, 256), 0.4)
    ok_d = np.repeat(rng.uniform(0.01, 0.1, (4, 2)).astype(np.float16), 2, axis=1)
    row_codes = random_codes(rng, (3, 576), 0.4)
    row_d = np.repeat(rng.uniform(0.01, 0.1, (3, 1)).astype(np.float16), 9, axis=1)
    mat_codes = random_codes(rng, (5, 576), 0.3)
    mat_d = np.full((5, 9), 0.0234375, np.float16)
    src = write_raw(
        tmp_path / "q2.gguf",
        1,
        _kv_string("general.architecture", "llama"),
        [
            ("blk.0.attn_q.weight", (256, 4), 42, encode("Q2_0", codes, d)),
            ("blk.0.attn_k.weight", (256, 4), 42, encode("Q2_0", ok_codes, ok_d)),
            ("blk.0.attn_v.weight", (576, 3), 42, encode("Q2_0", row_codes, row_d)),
            ("blk.0.attn_output.weight", (576, 5), 42, encode("Q2_0", mat_codes, mat_d)),
        ],
    )
    out = tmp_path / "q2-bitcos.gguf"
    r = run_convert(str(src), "-o", str(out), "--force-grow")
    assert r.returncode == 0, r.stdout
    assert "blk.0.attn_q.weight" in r.stdout and "two halves of a 128-weight block" in r.stdout
    types, variants = _check_bit_exact(src, out, "Q2_0")
    assert types["blk.0.attn_q.weight"] == 42
    assert variants == {
        "blk.0.attn_k.weight": Variant.B128,
        "blk.0.attn_v.weight": Variant.ROW,
        "blk.0.attn_output.weight": Variant.MATRIX,
    }
    r = run_convert(str(src), "-o", str(tmp_path / "strict.gguf"), "--strict", "--force-grow")
    assert r.returncode != 0 and "blk.0.attn_q.weight" in r.stdout and not (tmp_path / "strict.gguf").exists()


@pytest.mark.parametrize("fmt", ["PQ2_0", "I2_S"])
def test_unloadable_type_not_ternary_fails(tmp_path, fmt):
    """A PQ2_0 tensor with code +2, an I2_S tensor with the unused field 3: not ternary, and llama.cpp cannot
    load the source type, so the conversion fails naming the tensor and writes nothing."""
    rng = np.random.default_rng(9)
    codes = random_codes(rng, (2, 128), 0.4)
    if fmt == "PQ2_0":
        codes[1, 7] = 2
        raw = encode(fmt, codes, np.full((2, 1), 0.25, dtype=np.float16))
    else:
        raw = bytearray(encode(fmt, codes, 0.25))
        raw[5] |= 0xC0  # weight 5 of block 0: field 3
        raw = bytes(raw)
    src = write_raw(
        tmp_path / "bad.gguf",
        1,
        _kv_string("general.architecture", "llama"),
        [("blk.0.attn_q.weight", (128, 2), TYPE_ID[fmt], raw)],
    )
    out = tmp_path / "bad-bitcos.gguf"
    r = run_convert(str(src), "-o", str(out))
    assert r.returncode != 0
    assert "blk.0.attn_q.weight" in r.stdout and f"cannot load {fmt}" in r.stdout, r.stdout
    assert not out.exists()


def test_prism_hadamard_model_refused(tmp_path):
    src = build_source(tmp_path / "rot.gguf", "PTQ1_0", extra_kv=_kv_u32("prism.hadamard.block_size", 128), n_extra=1)
    r = run_convert(str(src), "-o", str(tmp_path / "rot-bitcos.gguf"))
    assert r.returncode != 0 and "prism.hadamard.block_size" in r.stdout and "Hadamard" in r.stdout


def test_i2_s_tail_must_be_in_file(tmp_path):
    """The reader sizes an I2_S tensor as its codes plus the 32-byte scale tail (bitnet.cpp's ggml_nbytes)."""
    from gguf_tools import GGUFError, open_gguf

    codes = random_codes(np.random.default_rng(3), (2, 128), 0.4)
    raw = encode("I2_S", codes, 0.5)
    path = write_raw(
        tmp_path / "t.gguf",
        1,
        _kv_string("general.architecture", "llama"),
        [("blk.0.attn_q.weight", (128, 2), 36, raw)],
    )
    assert foreign.i2_s_scale(open_gguf(path).tensors[0]) == np.float32(0.5)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(GGUFError, match="truncated"):
        open_gguf(path)


# --- through llama.cpp: the same weights as TQ2_0 and as a foreign type give the same tokens -------------


def _reencode(src: Path, dst: Path, fmt: str) -> Path:
    """``src`` (a make-model TQ2_0 model) with every TQ2_0 tensor rewritten in ``fmt``, same values. The forms
    without a product encoder of their own go through tests/foreign_gguf.py's quantizer-modelled writers:
    ``I2_S:arm`` / ``I2_S:x86-rows4`` (bitnet.cpp's other layouts), ``Q2_0:g128`` (Prism's legacy Q2_0)."""
    from ggml_bitcos import tq

    n_kv, kv, tensors = read_raw(src)
    out = []
    for name, ne, tt, raw in tensors:
        if tt == 35:
            k, rows = ne[0], math.prod(ne[1:])
            codes, d = tq.tq2_0_decode(np.frombuffer(raw, np.uint8)[: rows * k // 256 * 66].reshape(rows, -1))
            if fmt.startswith("I2_S:"):
                x = codes.astype(np.float32) * np.float32(d[0, 0])
                data = quantize_i2_s(x, fmt.partition(":")[2])
            elif fmt == "Q2_0:g128":
                data = quantize_q2_0_g128(tq.tq_to_float(codes, d))
            elif fmt == "I2_S":
                assert np.all(d == d[0, 0])  # --scale tensor: one scale per matrix
                data = encode(fmt, codes, np.float32(d[0, 0]))
            else:
                per = {"Q2_0": 4, "PQ2_0": 2, "PTQ1_0": 2}[fmt]  # source blocks of 64 / 128 per 256
                data = encode(fmt, codes, np.repeat(d, per, axis=1))
            out.append((name, ne, TYPE_ID[fmt.partition(":")[0]], data))
        else:
            out.append((name, ne, tt, raw))
    return write_raw(dst, n_kv, kv, out)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(
    "fmt,scale",
    [
        ("I2_S", "tensor"),
        ("PTQ1_0", "g128"),
        ("Q2_0", "g128"),
        ("I2_S:arm", "tensor"),
        ("I2_S:x86-rows4", "tensor"),
        ("Q2_0:g128", "g128"),
    ],
)
def test_converted_model_runs_like_tq2_0(tmp_path, patched_llama, fmt, scale, version):
    """make-model's TQ2_0 model, re-encoded as I2_S in each layout (per-tensor scale), PTQ1_0 / Q2_0 / legacy
    group-128 Q2_0 (its per-256 scales repeated per 128 / 64), converted (with --i2s-layout for I2_S): the same
    BITCOS weights as the TQ2_0 file converted, same greedy tokens."""
    from ggml_bitcos import llama_run

    tq2 = tmp_path / "tq2.gguf"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ggml_bitcos",
            "make-model",
            "-o",
            str(tq2),
            "--preset",
            "tiny",
            "--zero-density",
            "0.42",
            "--type",
            "tq2_0",
            "--scale",
            scale,
            "--seed",
            "7",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert r.returncode == 0, r.stdout
    src = _reencode(tq2, tmp_path / "src.gguf", fmt)
    out, ref = tmp_path / "src-bitcos.gguf", tmp_path / "tq2-bitcos.gguf"
    layout = ["--i2s-layout", fmt.partition(":")[2]] if fmt.startswith("I2_S:") else []
    for a, b, extra in ((src, out, layout), (tq2, ref, [])):
        r = run_convert(str(a), "-o", str(b), "-q", "--format-version", str(version), *extra)
        assert r.returncode == 0, r.stdout
    got = {n: (tt, raw) for n, _ne, tt, raw in read_raw(out)[2]}
    for name, _ne, tt, raw in read_raw(ref)[2]:
        if tt in BITCOS_TYPE_IDS and scale == "tensor":
            assert got[name] == (tt, raw), name  # PT / MATRIX: byte-identical to the TQ2_0 route
        elif tt in BITCOS_TYPE_IDS:
            assert got[name][0] == tt, name
    prompt = "The quick brown fox jumps over the lazy dog. Once upon a time"
    a = llama_run.greedy_generate(tq2, prompt, 16, n_threads=2)
    b = llama_run.greedy_generate(out, prompt, 16, n_threads=2)
    assert a.tokens == b.tokens


def test_stock_gguf_py_does_not_learn_foreign_types():
    """The start-up hook teaches stock gguf-py tools the BITCOS types only: an I2_S tensor sized without its
    tail must never reach gguf-new-metadata (which would copy it without its scale)."""
    code = (
        "import gguf, sys; from gguf.constants import GGMLQuantizationType as T; "
        "print(T(160).name, 36 in T._value2member_map_, 143 in T._value2member_map_)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/"
    )
    if "is not a valid" in r.stdout:
        pytest.skip("the gguf-py start-up hook is not installed in this environment")
    assert r.stdout.split() == ["BITCOS_G128", "False", "False"], r.stdout
