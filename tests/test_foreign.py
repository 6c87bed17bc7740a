"""Foreign ternary inputs: bitnet.cpp's I2_S and Prism ML's Q2_0 / PQ2_0 / PTQ1_0 (docs/FORMAT.md, "Input
formats"). Files are written here byte by byte (a small GGUF writer of this module, not gguf-py) with
``ggml_bitcos.foreign``'s encoders, converted with ``ggml-bitcos convert``, and every converted tensor is
compared bit for bit with an element-by-element dequantizer written in this file straight from the layout
description (not with the decoders the converter uses).
"""

from __future__ import annotations

import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ggml_bitcos import codec, foreign
from ggml_bitcos.format import BITCOS_TYPE_IDS, COMPANION_SUFFIX, Variant
from ggml_bitcos.ternary import random_codes

FORMATS = ["I2_S", "Q2_0", "PQ2_0", "PTQ1_0"]
TYPE_ID = {"I2_S": 36, "Q2_0": 42, "PQ2_0": 142, "PTQ1_0": 143}


# --- a minimal GGUF v3 reader/writer of its own --------------------------------------------------------

def _kv_string(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", 8) + struct.pack("<Q", len(v)) + v


def _kv_u32(key: str, value: int) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<II", 4, value)


_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip(b: bytes, vt: int, off: int) -> int:
    if vt == 8:
        return off + 8 + struct.unpack_from("<Q", b, off)[0]
    if vt == 9:
        it, n = struct.unpack_from("<IQ", b, off)
        off += 12
        if it in _SCALAR:
            return off + n * _SCALAR[it]
        for _ in range(n):
            off = _skip(b, it, off)
        return off
    return off + _SCALAR[vt]


def read_raw(path: Path) -> tuple[int, bytes, list[tuple[str, tuple[int, ...], int, bytes]]]:
    """(kv count, raw kv section, [(name, ne, type id, data bytes up to the next tensor or end)])."""
    b = path.read_bytes()
    assert b[:4] == b"GGUF"
    _v, n_t, n_kv = struct.unpack_from("<IQQ", b, 4)
    off = 24
    for _ in range(n_kv):
        kl = struct.unpack_from("<Q", b, off)[0]
        assert b[off + 8:off + 8 + kl] != b"general.alignment"
        off += 8 + kl
        off = _skip(b, struct.unpack_from("<I", b, off)[0], off + 4)
    kv = b[24:off]
    infos = []
    for _ in range(n_t):
        nl = struct.unpack_from("<Q", b, off)[0]
        name = b[off + 8:off + 8 + nl].decode()
        off += 8 + nl
        nd = struct.unpack_from("<I", b, off)[0]
        ne = struct.unpack_from(f"<{nd}Q", b, off + 4)
        off += 4 + 8 * nd
        tt, o = struct.unpack_from("<IQ", b, off)
        off += 12
        infos.append((name, tuple(ne), tt, o))
    start = (off + 31) // 32 * 32
    ends = sorted(o for *_x, o in infos)[1:] + [len(b) - start]
    end_of = dict(zip(sorted(o for *_x, o in infos), ends))
    return n_kv, kv, [(n, ne, tt, b[start + o:start + end_of[o]]) for n, ne, tt, o in infos]


def write_raw(path: Path, n_kv: int, kv: bytes, tensors: list[tuple[str, tuple[int, ...], int, bytes]]) -> Path:
    """GGUF v3, alignment 32: header, the raw kv section, tensor infos, data (each padded to 32)."""
    infos, data, off = b"", b"", 0
    for name, ne, tt, raw in tensors:
        nm = name.encode()
        infos += struct.pack("<Q", len(nm)) + nm + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        infos += struct.pack("<IQ", tt, off)
        pad = (-len(raw)) % 32
        data += raw + b"\0" * pad
        off += len(raw) + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), n_kv) + kv + infos
    head += b"\0" * ((-len(head)) % 32)
    path.write_bytes(head + data)
    return path


# --- the dequantizer from the layout description, one weight at a time (vectorized over weights) ---------

def _f16(raw: bytes, at: np.ndarray) -> np.ndarray:
    b = np.frombuffer(raw, dtype=np.uint8)
    return (b[at].astype(np.uint16) | (b[at + 1].astype(np.uint16) << 8)).view(np.float16).astype(np.float32)


def spec_dequantize(fmt: str, raw: bytes, ne: tuple[int, ...]) -> np.ndarray:
    """fp32 (rows, K) of a tensor's data bytes, each weight from its own byte and bit position."""
    k, rows = ne[0], math.prod(ne[1:])
    b = np.frombuffer(raw, dtype=np.uint8)
    r, w = np.meshgrid(np.arange(rows), np.arange(k), indexing="ij")
    if fmt in ("Q2_0", "PQ2_0"):
        blk = 64 if fmt == "Q2_0" else 128
        bb = 2 + blk // 4
        base = (r * (k // blk) + w // blk) * bb            # start of the weight's block
        j = w % blk
        code = ((b[base + 2 + j // 4] >> (2 * (j % 4))) & 3).astype(np.int32) - 1
        d = _f16(raw, base)
    elif fmt == "PTQ1_0":
        base = (r * (k // 128) + w // 128) * 28
        j = w % 128
        byte = np.where(j < 80, j % 16, np.where(j < 120, 16 + (j - 80) % 8, 24 + (j - 120) % 2))
        n = np.where(j < 80, j // 16, np.where(j < 120, (j - 80) // 8, (j - 120) // 2))
        v = b[base + byte].astype(np.int64)
        code = ((v * 3 ** n) % 256 * 3) // 256 - 1
        d = _f16(raw, base + 26)
    elif fmt == "I2_S":
        f = r * k + w                                       # the weight's index in the flattened tensor
        pos = f % 128
        field = (b[(f // 128) * 32 + pos % 32] >> (6 - 2 * (pos // 32))) & 3
        assert np.all(field != 3)
        code = field.astype(np.int32) - 1
        d = np.float32(struct.unpack_from("<f", raw, rows * k // 4)[0])
    else:
        raise AssertionError(fmt)
    return (code.astype(np.float32) * d).astype(np.float32)


# --- building sources ------------------------------------------------------------------------------

def encode(fmt: str, codes: np.ndarray, scales) -> bytes:
    if fmt == "I2_S":
        return foreign.i2_s_encode(codes, scales).tobytes()
    return {"Q2_0": foreign.q2_0_encode, "PQ2_0": foreign.pq2_0_encode,
            "PTQ1_0": foreign.ptq1_0_encode}[fmt](codes, scales).tobytes()


def random_scales(fmt: str, rng: np.random.Generator, rows: int, k: int):
    """Per-source-granularity scales; Q2_0's two 64-halves of every 128-block share one d (G128-exact)."""
    if fmt == "I2_S":
        return np.float32(rng.uniform(0.01, 0.1))         # an fp32 that fp16 does not hold, typically
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
    return subprocess.run([sys.executable, "-m", "ggml_bitcos", "convert", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


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
        dc, ds = foreign.i2_s_decode(np.frombuffer(raw, np.uint8)[:rows * k // 4], scales, k)
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
        if tt != TYPE_ID[fmt] or tt_o == tt:                              # copied (or kept) byte for byte
            assert (tt_o, raw_o[:len(raw)]) == (tt, raw)
            continue
        assert tt_o in BITCOS_TYPE_IDS and ne_o == ne, name
        comp = o[name + COMPANION_SUFFIX][2]
        k, rows = ne[0], math.prod(ne[1:])
        # the weight's bytes (FORMAT.md §2/§3, written out): 18 / 16 per 128 weights (v1), K/8 per row (v2)
        n_bytes = {160: rows * k // 128 * 18, 161: rows * k // 128 * 16, 162: rows * k // 8}[tt_o]
        dec = codec.decode(np.frombuffer(raw_o, np.uint8)[:n_bytes], np.frombuffer(comp, np.uint8), tt_o, k, rows,
                           codec.n_mats_of(ne))
        variants[name] = dec.variant
        got = dec.to_float(slice(0, rows)).view(np.uint32)
        want = spec_dequantize(fmt, raw, ne).view(np.uint32)
        want = np.where(want == np.uint32(0x80000000), np.uint32(0), want)      # -0.0 -> +0.0 (FORMAT.md §5)
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
    r = run_convert(str(src), "-o", str(out), "-q", "--format-version", str(version),
                    *(["--force-grow"] if fmt == "Q2_0" else []))
    assert r.returncode == 0, r.stdout
    _types, variants = _check_bit_exact(src, out, fmt)
    per_matrix, per_block = (Variant.PT, Variant.G128) if version == 1 else (Variant.MATRIX, Variant.B128)
    for name in SHAPES:
        if DENSITY[name] == 1.0 or fmt == "I2_S":
            want = per_matrix              # an all-zero tensor (z = 1) has one magnitude (none) per matrix
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
    d = rng.uniform(0.01, 0.1, (4, 4)).astype(np.float16)           # every 64-half its own scale
    ok_codes = random_codes(rng, (4, 256), 0.4)
    ok_d = np.repeat(rng.uniform(0.01, 0.1, (4, 2)).astype(np.float16), 2, axis=1)
    row_codes = random_codes(rng, (3, 576), 0.4)
    row_d = np.repeat(rng.uniform(0.01, 0.1, (3, 1)).astype(np.float16), 9, axis=1)
    mat_codes = random_codes(rng, (5, 576), 0.3)
    mat_d = np.full((5, 9), 0.0234375, np.float16)
    src = write_raw(tmp_path / "q2.gguf", 1, _kv_string("general.architecture", "llama"), [
        ("blk.0.attn_q.weight", (256, 4), 42, encode("Q2_0", codes, d)),
        ("blk.0.attn_k.weight", (256, 4), 42, encode("Q2_0", ok_codes, ok_d)),
        ("blk.0.attn_v.weight", (576, 3), 42, encode("Q2_0", row_codes, row_d)),
        ("blk.0.attn_output.weight", (576, 5), 42, encode("Q2_0", mat_codes, mat_d))])
    out = tmp_path / "q2-bitcos.gguf"
    r = run_convert(str(src), "-o", str(out), "--force-grow")
    assert r.returncode == 0, r.stdout
    assert "blk.0.attn_q.weight" in r.stdout and "two halves of a 128-weight block" in r.stdout
    types, variants = _check_bit_exact(src, out, "Q2_0")
    assert types["blk.0.attn_q.weight"] == 42
    assert variants == {"blk.0.attn_k.weight": Variant.B128, "blk.0.attn_v.weight": Variant.ROW,
                        "blk.0.attn_output.weight": Variant.MATRIX}
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
        raw[5] |= 0xC0                                                  # weight 5 of block 0: field 3
        raw = bytes(raw)
    src = write_raw(tmp_path / "bad.gguf", 1, _kv_string("general.architecture", "llama"),
                    [("blk.0.attn_q.weight", (128, 2), TYPE_ID[fmt], raw)])
    out = tmp_path / "bad-bitcos.gguf"
    r = run_convert(str(src), "-o", str(out))
    assert r.returncode != 0
    assert "blk.0.attn_q.weight" in r.stdout and f"cannot load {fmt}" in r.stdout, r.stdout
    assert not out.exists()


def test_prism_hadamard_model_refused(tmp_path):
    src = build_source(tmp_path / "rot.gguf", "PTQ1_0", extra_kv=_kv_u32("prism.hadamard.block_size", 128),
                       n_extra=1)
    r = run_convert(str(src), "-o", str(tmp_path / "rot-bitcos.gguf"))
    assert r.returncode != 0 and "prism.hadamard.block_size" in r.stdout and "Hadamard" in r.stdout


def test_i2_s_tail_must_be_in_file(tmp_path):
    """The reader sizes an I2_S tensor as its codes plus the 32-byte scale tail (bitnet.cpp's ggml_nbytes)."""
    from gguf_tools import GGUFError, open_gguf
    codes = random_codes(np.random.default_rng(3), (2, 128), 0.4)
    raw = encode("I2_S", codes, 0.5)
    path = write_raw(tmp_path / "t.gguf", 1, _kv_string("general.architecture", "llama"),
                     [("blk.0.attn_q.weight", (128, 2), 36, raw)])
    assert foreign.i2_s_scale(open_gguf(path).tensors[0]) == np.float32(0.5)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(GGUFError, match="truncated"):
        open_gguf(path)


# --- through llama.cpp: the same weights as TQ2_0 and as a foreign type give the same tokens -------------

def _reencode(src: Path, dst: Path, fmt: str) -> Path:
    """``src`` (a make-model TQ2_0 model) with every TQ2_0 tensor rewritten in ``fmt``, same codes and scales."""
    from ggml_bitcos import tq
    n_kv, kv, tensors = read_raw(src)
    out = []
    for name, ne, tt, raw in tensors:
        if tt == 35:
            k, rows = ne[0], math.prod(ne[1:])
            codes, d = tq.tq2_0_decode(np.frombuffer(raw, np.uint8)[:rows * k // 256 * 66].reshape(rows, -1))
            if fmt == "I2_S":
                assert np.all(d == d[0, 0])                          # --scale tensor: one scale per matrix
                data = encode(fmt, codes, np.float32(d[0, 0]))
            else:
                per = {"Q2_0": 4, "PQ2_0": 2, "PTQ1_0": 2}[fmt]      # source blocks of 64 / 128 per 256
                data = encode(fmt, codes, np.repeat(d, per, axis=1))
            out.append((name, ne, TYPE_ID[fmt], data))
        else:
            out.append((name, ne, tt, raw))
    return write_raw(dst, n_kv, kv, out)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("fmt,scale", [("I2_S", "tensor"), ("PTQ1_0", "g128"), ("Q2_0", "g128")])
def test_converted_model_runs_like_tq2_0(tmp_path, patched_llama, fmt, scale, version):
    """make-model's TQ2_0 model, re-encoded as I2_S (per-tensor scale) or PTQ1_0 / Q2_0 (its per-256 scales
    repeated per 128 / 64), converted: same BITCOS weights as the TQ2_0 file converted, same greedy tokens."""
    from ggml_bitcos import llama_run
    tq2 = tmp_path / "tq2.gguf"
    r = subprocess.run([sys.executable, "-m", "ggml_bitcos", "make-model", "-o", str(tq2), "--preset", "tiny",
                        "--zero-density", "0.42", "--type", "tq2_0", "--scale", scale, "--seed", "7"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 0, r.stdout
    src = _reencode(tq2, tmp_path / f"{fmt}.gguf", fmt)
    out, ref = tmp_path / f"{fmt}-bitcos.gguf", tmp_path / "tq2-bitcos.gguf"
    for a, b in ((src, out), (tq2, ref)):
        r = run_convert(str(a), "-o", str(b), "-q", "--format-version", str(version))
        assert r.returncode == 0, r.stdout
    got = {n: (tt, raw) for n, _ne, tt, raw in read_raw(out)[2]}
    for name, _ne, tt, raw in read_raw(ref)[2]:
        if tt in BITCOS_TYPE_IDS and scale == "tensor":
            assert got[name] == (tt, raw), name      # PT / MATRIX: byte-identical to the TQ2_0 route
        elif tt in BITCOS_TYPE_IDS:
            assert got[name][0] == tt, name
    prompt = "The quick brown fox jumps over the lazy dog. Once upon a time"
    a = llama_run.greedy_generate(tq2, prompt, 16, n_threads=2)
    b = llama_run.greedy_generate(out, prompt, 16, n_threads=2)
    assert a.tokens == b.tokens


def test_stock_gguf_py_does_not_learn_foreign_types():
    """The start-up hook teaches stock gguf-py tools the BITCOS types only: an I2_S tensor sized without its
    tail must never reach gguf-new-metadata (which would copy it without its scale)."""
    code = ("import gguf, sys; from gguf.constants import GGMLQuantizationType as T; "
            "print(T(160).name, 36 in T._value2member_map_, 143 in T._value2member_map_)")
    r = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       cwd="/")
    if "is not a valid" in r.stdout:
        pytest.skip("the gguf-py start-up hook is not installed in this environment")
    assert r.stdout.split() == ["BITCOS_G128", "False", "False"], r.stdout
