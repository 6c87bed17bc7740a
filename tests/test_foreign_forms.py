"""Foreign GGUF inputs read right or refused (docs/FORMAT.md §7.1):

* bitnet.cpp's I2_S in each of its three layouts (x86, arm, x86-rows4), read with ``--i2s-layout``, and the
  default layout announced as an assumption;
* Prism's legacy group-128 Q2_0 under id 42, recognised from the data extents and read as what it is;
* every reader (convert, convert --allow-copy, convert --to, stats, info) refuses a file whose tensor data
  is not where its type and shape put it (too short, too long, overlapping, truncated), naming the file, the
  tensor and the rule, and writes nothing; bytes after the last tensor's data (a last tensor longer than its
  type and shape say looks the same) are accepted with a note, as llama.cpp accepts them (issue 30).

The files are written by tests/foreign_gguf.py (its own GGUF writer and writers modelled on the original
quantizers), and converted tensors are checked against its element-by-element dequantizer.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from foreign_gguf import (
    TYPE_ID,
    _kv_string,
    quantize_i2_s,
    quantize_q2_0_g128,
    read_raw,
    spec_dequantize,
    ternary_floats,
    write_raw,
)
import gguf_tools
from ggml_bitcos import codec, foreign, tq
from ggml_bitcos.format import BITCOS_TYPE_IDS, COMPANION_SUFFIX
from ggml_bitcos.ternary import random_codes

LAYOUTS = ["x86", "arm", "x86-rows4"]
ARCH_KV = _kv_string("general.architecture", "llama")
NORM = ("blk.0.attn_norm.weight", (256,), 0, np.ones(256, dtype="<f4").tobytes())
# (name, (K, rows...), zero density): a 65,536-weight attn_q, all-zero and zero-free tensors, a 3-D expert
# tensor, and K = 192 (x86 blocks of 128 and arm blocks of 64 straddle rows)
I2S_TENSORS = [
    ("blk.0.attn_q.weight", (256, 256), 0.4),
    ("blk.0.attn_k.weight", (256, 8), 1.0),
    ("blk.0.attn_v.weight", (256, 8), 0.0),
    ("blk.0.ffn_up_exps.weight", (128, 4, 2), 0.35),
    ("blk.0.ffn_down.weight", (192, 12), 0.5),
]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ggml_bitcos", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def i2s_source(path: Path, layout: str, seed: int = 0) -> tuple[Path, dict[str, np.ndarray]]:
    """A model whose ternary tensors are I2_S in ``layout``, with junk in each tail's unwritten 28 bytes;
    returns the file and each tensor's true fp32 values (rows, K)."""
    rng = np.random.default_rng([seed, len(layout)])
    tensors, truth = [NORM], {}
    for name, ne, z in I2S_TENSORS:
        k, rows = ne[0], math.prod(ne[1:])
        x = ternary_floats(rng, rows, k, z, float(np.float32(rng.uniform(0.01, 0.1))))
        truth[name] = x  # {-s, 0, +s}: the quantizer's scale max|x| is s, and each code times s gives x back
        tensors.append((name, ne, TYPE_ID["I2_S"], quantize_i2_s(x, layout, tail_junk=rng.bytes(28))))
    return write_raw(path, 1, ARCH_KV, tensors), truth


def converted_floats(out: Path) -> dict[str, np.ndarray]:
    """fp32 values of every BITCOS tensor of ``out`` (the reference codec; rows, K)."""
    tensors = {n: (ne, tt, raw) for n, ne, tt, raw in read_raw(out)[2]}
    floats = {}
    for name, (ne, tt, raw) in tensors.items():
        if tt not in BITCOS_TYPE_IDS:
            continue
        k, rows = ne[0], math.prod(ne[1:])
        n_bytes = {160: rows * k // 128 * 18, 161: rows * k // 128 * 16, 162: rows * k // 8}[tt]
        comp = tensors[name + COMPANION_SUFFIX][2]
        dec = codec.decode(
            np.frombuffer(raw, np.uint8)[:n_bytes], np.frombuffer(comp, np.uint8), tt, k, rows, codec.n_mats_of(ne)
        )
        floats[name] = dec.to_float(slice(0, rows))
    return floats


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Bit-exact up to the sign of zero (FORMAT.md §5)."""
    w = want.astype(np.float32).view(np.uint32)
    w = np.where(w == np.uint32(0x80000000), np.uint32(0), w)
    return np.array_equal(got.view(np.uint32), w)


# --- I2_S: three layouts ------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_i2s_writer_and_reader_agree_on_each_layout(layout):
    """The quantizer-modelled writer, the element-by-element dequantizer and the product's decoder and encoder
    agree on every layout (z = 0.4 and the edge densities, K = 192 straddling blocks)."""
    rng = np.random.default_rng(11)
    for k, rows, z in ((256, 8, 0.4), (192, 12, 0.0), (128, 4, 1.0)):
        x = ternary_floats(rng, rows, k, z, 0.0625)
        raw = quantize_i2_s(x, layout)
        assert len(raw) == foreign.i2_s_nbytes(rows * k)
        spec = spec_dequantize(f"I2_S:{layout}", raw, (k, rows))
        assert same_bits(spec, x if z < 1.0 else np.zeros_like(x))
        codes, scale = foreign.i2_s_decode(np.frombuffer(raw, np.uint8)[: rows * k // 4], 0.0, k, layout)
        assert np.array_equal(codes, np.sign(x).astype(np.int8))
        want_scale = np.float32(np.max(np.abs(x)))
        assert foreign.i2_s_encode(codes, want_scale, layout).tobytes() == raw


@pytest.mark.parametrize("layout", LAYOUTS)
def test_convert_i2s_layout_bit_exact(tmp_path, layout):
    """``convert --i2s-layout L`` reads a file written in layout L bit-exactly (junk in the tails, a 3-D
    tensor, rows straddling blocks), says which layout it read, and the output decodes to the true values."""
    src, truth = i2s_source(tmp_path / f"i2s-{layout}.gguf", layout)
    out = tmp_path / "out.gguf"
    r = cli("convert", str(src), "-o", str(out), "--i2s-layout", layout)
    assert r.returncode == 0, r.stdout
    assert f"source: I2_S tensors read in bitnet.cpp's {layout} layout (--i2s-layout {layout})" in r.stdout
    assert "verified bit-exact against the source as read" in r.stdout and "assumed" not in r.stdout
    got = converted_floats(out)
    assert set(got) == set(truth)
    for name, x in truth.items():
        assert same_bits(got[name], x), name


def test_default_i2s_layout_is_announced(tmp_path):
    """Without --i2s-layout the x86 layout is read and every conversion says it assumed it and how to choose
    another, in the summary and with -q; the "verified" line says what it verified against."""
    src, truth = i2s_source(tmp_path / "i2s.gguf", "x86")
    for quiet in ([], ["-q"]):
        out = tmp_path / f"out{len(quiet)}.gguf"
        r = cli("convert", str(src), "-o", str(out), *quiet)
        assert r.returncode == 0, r.stdout
        notes = [ln for ln in r.stdout.splitlines() if ln.startswith("source: I2_S")]
        assert len(notes) == 1 and "an assumption" in notes[0], r.stdout
        assert "--i2s-layout arm" in notes[0] and "--i2s-layout x86-rows4" in notes[0]
        if not quiet:
            assert (
                "verified bit-exact against the source as read (its I2_S tensors read in the assumed x86 "
                "layout" in r.stdout
            )
    assert same_bits(converted_floats(out)["blk.0.attn_q.weight"], truth["blk.0.attn_q.weight"])
    r = cli("stats", str(src), "-q")
    assert r.returncode == 0 and "an assumption" in r.stdout, r.stdout


@pytest.mark.parametrize("layout", ["arm", "x86-rows4"])
def test_wrong_layout_reads_other_weights(tmp_path, layout):
    """Why the layout matters: the same bytes read in the default layout give other weights (the zero count is
    the same, the positions are not), which is why the assumption is always printed."""
    src, truth = i2s_source(tmp_path / "i2s.gguf", layout)
    out = tmp_path / "out.gguf"
    assert cli("convert", str(src), "-o", str(out), "-q").returncode == 0
    got = converted_floats(out)["blk.0.attn_q.weight"]
    x = truth["blk.0.attn_q.weight"]
    assert np.count_nonzero(got) == np.count_nonzero(x)
    assert np.count_nonzero(got != x) > 10_000


def test_layout_that_cannot_hold_the_tensor_is_refused(tmp_path):
    """A layout bitnet.cpp could not have written a tensor in (x86-rows4 needs rows in fours, x86 needs
    blocks of 128) is refused naming the tensor, with the layouts that fit; nothing is written."""
    rng = np.random.default_rng(2)
    x = ternary_floats(rng, 3, 64, 0.4, 0.5)  # 3 rows, 192 weights: only arm fits
    src = write_raw(
        tmp_path / "odd.gguf",
        1,
        ARCH_KV,
        [NORM, ("blk.0.attn_q.weight", (64, 3), TYPE_ID["I2_S"], quantize_i2_s(x, "arm"))],
    )
    for args, rule in (([], "multiple of 128 weights"), (["--i2s-layout", "x86-rows4"], "multiple of 4 rows")):
        out = tmp_path / "odd-out.gguf"
        r = cli("convert", str(src), "-o", str(out), *args)
        assert r.returncode == 1, r.stdout
        assert "tensor 'blk.0.attn_q.weight'" in r.stdout and rule in r.stdout and "--i2s-layout arm" in r.stdout
        assert not out.exists()
    out = tmp_path / "odd-out.gguf"
    assert cli("convert", str(src), "-o", str(out), "--i2s-layout", "arm", "-q").returncode == 0
    assert same_bits(converted_floats(out)["blk.0.attn_q.weight"], x)


# --- legacy group-128 Q2_0 ------------------------------------------------------------------------------


def legacy_q2_source(path: Path, seed: int = 0, plus_two: bool = False) -> tuple[Path, dict[str, np.ndarray]]:
    """Prism's legacy Q2_0 (group 128 under id 42): per-128 scales that differ block to block; the last tensor
    is Q2_0 too."""
    rng = np.random.default_rng(seed)
    tensors, truth = [NORM], {}
    for name, (k, rows), z in (
        ("blk.0.attn_q.weight", (256, 8), 0.4),
        ("blk.0.attn_k.weight", (384, 4), 0.0),
        ("blk.0.attn_v.weight", (128, 6), 1.0),
        ("output.weight", (256, 5), 0.3),
    ):
        codes = random_codes(rng, (rows, k), z)
        d = rng.uniform(0.01, 0.1, (rows, k // 128)).astype(np.float16).astype(np.float32)
        x = codes.astype(np.float32) * np.repeat(d, 128, axis=1)
        raw = bytearray(quantize_q2_0_g128(x))
        truth[name] = spec_dequantize("Q2_0:g128", bytes(raw), (k, rows))
        assert same_bits(truth[name], x), name  # the writer stores ternary values exactly
        if plus_two and name == "blk.0.attn_k.weight":  # field 3 (+2·d, which no ternary type holds)
            raw[(1 * k // 128) * 34 + 2 + 5 // 4] |= 3 << 2 * (5 % 4)  # for weight 5 of row 1
        tensors.append((name, (k, rows), TYPE_ID["Q2_0"], bytes(raw)))
    return write_raw(path, 1, ARCH_KV, tensors), truth


def test_legacy_q2_0_group_128_converts_bit_exactly(tmp_path):
    """Group-128 Q2_0 under id 42 is recognised from the tensors' data extents (its sizes fit group 128 and
    not 64), read as PQ2_0's bytes, converted bit-exactly; convert, stats and info say which form they saw."""
    src, truth = legacy_q2_source(tmp_path / "bonsai-q2_0.gguf")
    out = tmp_path / "out.gguf"
    r = cli("convert", str(src), "-o", str(out))
    assert r.returncode == 0, r.stdout
    assert "source: Q2_0 tensors (4) are Prism's legacy group-128 form" in r.stdout
    got = converted_floats(out)
    assert set(got) == set(truth)
    for name, x in truth.items():
        assert same_bits(got[name], x), name
    r = cli("stats", str(src), "--tensors", "-q")
    assert r.returncode == 0 and "legacy group-128 form" in r.stdout, r.stdout
    r = cli("stats", str(src), "--json", "--tensors")
    d = json.loads(r.stdout)
    assert any("legacy group-128" in n for n in d["source_notes"])
    assert {t["type"] for t in d["tensors"]} == {"Q2_0 (Prism's legacy group-128 form)"}
    r = cli("info", str(src))
    assert r.returncode == 0 and "* source: Q2_0 tensors (4) are Prism's legacy group-128 form" in r.stdout


def test_legacy_q2_0_that_cannot_convert_is_never_copied(tmp_path):
    """A legacy Q2_0 tensor holding a +2·d code cannot become BITCOS, and llama.cpp would misread it as group
    64: refused even with --allow-copy, nothing written."""
    src, _truth = legacy_q2_source(tmp_path / "plus2.gguf", plus_two=True)
    out = tmp_path / "out.gguf"
    r = cli("convert", str(src), "-o", str(out), "--allow-copy")
    assert r.returncode == 1, r.stdout
    assert "blk.0.attn_k.weight" in r.stdout and "legacy group-128" in r.stdout and "misread" in r.stdout
    assert not out.exists()


def test_upstream_q2_0_group_64_stays_group_64(tmp_path):
    """Upstream's group-64 Q2_0 (18 bytes per 64) is read as such: no legacy note, values bit-exact."""
    rng = np.random.default_rng(4)
    codes = random_codes(rng, (4, 256), 0.4)
    d = np.repeat(rng.uniform(0.01, 0.1, (4, 2)).astype(np.float16), 2, axis=1)
    raw = foreign.q2_0_encode(codes, d).tobytes()
    src = write_raw(tmp_path / "q2.gguf", 1, ARCH_KV, [NORM, ("blk.0.attn_q.weight", (256, 4), 42, raw)])
    out = tmp_path / "out.gguf"
    r = cli("convert", str(src), "-o", str(out), "--force-grow")
    assert r.returncode == 0 and "legacy" not in r.stdout, r.stdout
    assert same_bits(converted_floats(out)["blk.0.attn_q.weight"], spec_dequantize("Q2_0", raw, (256, 4)))


# --- data extents checked like gguf.cpp, by every reader ---------------------------------------------------


def _tensor_bytes(fmt: str, rng: np.random.Generator, rows: int, k: int) -> bytes:
    codes = random_codes(rng, (rows, k), 0.4)
    if fmt == "I2_S":
        return quantize_i2_s(codes.astype(np.float32) * np.float32(0.5), "x86")
    if fmt == "F16":
        return (codes.astype(np.float16) * np.float16(0.5)).tobytes()
    if fmt in ("TQ1_0", "TQ2_0"):
        d = np.full((rows, k // 256), 0.5, np.float16)
        return (tq.tq2_0_encode if fmt == "TQ2_0" else tq.tq1_0_encode)(codes, d).tobytes()
    d = np.full((rows, k // (64 if fmt == "Q2_0" else 128)), 0.5, np.float16)
    return {"Q2_0": foreign.q2_0_encode, "PQ2_0": foreign.pq2_0_encode, "PTQ1_0": foreign.ptq1_0_encode}[fmt](
        codes, d
    ).tobytes()


def _raw_file(path: Path, tensors: list[tuple[str, tuple[int, ...], int, bytes, int]]) -> Path:
    """GGUF v3, alignment 32, each tensor's data at the offset given (data padded, gaps zero-filled)."""
    infos, data = b"", bytearray()
    for name, ne, tt, raw, off in tensors:
        nm = name.encode()
        infos += struct.pack("<Q", len(nm)) + nm + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        infos += struct.pack("<IQ", tt, off)
        data[len(data) :] = bytes(max(0, off + len(raw) - len(data)))
        data[off : off + len(raw)] = raw
    data += bytes((-len(data)) % 32)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 1) + ARCH_KV + infos
    head += bytes((-len(head)) % 32)
    path.write_bytes(head + bytes(data))
    return path


def _pad(n: int) -> int:
    return (n + 31) // 32 * 32


CRAFT_TYPES = ["I2_S", "Q2_0", "PQ2_0", "PTQ1_0", "TQ1_0", "TQ2_0", "F16"]
CRAFTS = {  # case -> (rule words the error must contain, the tensor it names)
    "short": ("overlaps tensor 'blk.0.attn_q.weight'", "blk.0.attn_k.weight"),
    "long": ("where tensor 'blk.0.attn_q.weight'", "blk.0.attn_k.weight"),
    "overlap": ("overlaps tensor 'blk.0.attn_q.weight'", "blk.0.attn_k.weight"),
    "truncated": ("file is truncated", "blk.0.attn_k.weight"),
    "misaligned": ("not a multiple of the file's alignment", "blk.0.attn_k.weight"),
}


def crafted_file(path: Path, fmt: str, case: str) -> Path:
    """Two 512 x 4 tensors of ``fmt`` after a norm; the first (or last) one's data is one block short or
    long for its type and shape, or the second one's offset points into the first one's data."""
    rng = np.random.default_rng([TYPE_ID[fmt], len(case)])
    q, k = _tensor_bytes(fmt, rng, 4, 512), _tensor_bytes(fmt, rng, 4, 512)
    norm = (*NORM, 0)
    q_off = _pad(len(NORM[3]))
    if case == "short":
        q = q[:-64]
    elif case == "long":
        q = q + bytes(64)
    k_off = q_off + _pad(len(q))
    if case == "overlap":
        k_off = q_off + 64
    elif case == "misaligned":
        k_off += 8
    elif case == "last-long":
        k = k + bytes(64)
    elif case == "truncated":
        k = k[:-64]
    tt = TYPE_ID[fmt]
    return _raw_file(
        path, [norm, ("blk.0.attn_q.weight", (512, 4), tt, q, q_off), ("blk.0.attn_k.weight", (512, 4), tt, k, k_off)]
    )


@pytest.mark.parametrize("fmt", CRAFT_TYPES)
def test_valid_crafted_file_reads(tmp_path, fmt):
    """The crafted files' writer itself makes files every reader accepts when nothing is wrong."""
    path = crafted_file(tmp_path / "ok.gguf", fmt, "none")
    r = cli("stats", str(path), "-q")
    assert r.returncode == 0, r.stdout


@pytest.mark.parametrize("case", sorted(CRAFTS))
@pytest.mark.parametrize("fmt", CRAFT_TYPES)
def test_bad_extent_refused_by_every_reader(tmp_path, capsys, fmt, case):
    """A tensor whose data does not match its type and shape is refused by convert (also with --allow-copy),
    convert --to, stats and info: one line naming the file, the tensor and the rule; no output file. (The
    command-line entry point in this process: the matrix is large; test_bad_extent_message_from_the_command
    runs the installed command once.)"""
    from ggml_bitcos.cli import main

    path = crafted_file(tmp_path / f"{fmt}-{case}.gguf", fmt, case)
    rule, tensor = CRAFTS[case]
    out = tmp_path / "out.gguf"
    for args in (
        ["convert", str(path), "-o", str(out)],
        ["convert", str(path), "-o", str(out), "--allow-copy"],
        ["convert", "--to", "tq2_0", str(path), "-o", str(out)],
        ["stats", str(path), "-q"],
        ["info", str(path)],
    ):
        assert main(args) == 1, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"ggml-bitcos: error: {path}: tensor '{tensor}': "), (args, err)
        assert rule in err[0], (args, err)
        assert not out.exists() and not list(tmp_path.glob(".out.gguf*")), args


@pytest.mark.parametrize("fmt", CRAFT_TYPES)
def test_last_tensor_longer_is_trailing_data_accepted(tmp_path, capsys, fmt):
    """64 bytes after the last tensor's data: llama.cpp loads such a file (gguf.cpp checks only that each
    tensor's data lies inside it), so stats and info read it, saying so, and convert --allow-copy drops them."""
    from ggml_bitcos.cli import main

    path = crafted_file(tmp_path / f"{fmt}.gguf", fmt, "last-long")
    assert main(["info", str(path)]) == 0
    assert "* source: 64 bytes follow the last tensor's data ('blk.0.attn_k.weight')" in capsys.readouterr().out
    assert main(["stats", str(path), "-q"]) == 0, capsys.readouterr().err
    out = tmp_path / "out.gguf"
    assert main(["convert", str(path), "-o", str(out), "--allow-copy", "-q"]) == 0, capsys.readouterr().err
    assert "bytes follow" not in " ".join(gguf_tools.open_gguf(out).form_notes)


def test_bad_extent_message_from_the_command(tmp_path):
    """The same refusal through the command as users run it: exit 1, the one line, no traceback."""
    path = crafted_file(tmp_path / "q2.gguf", "Q2_0", "long")
    r = cli("convert", str(path), "--allow-copy")
    assert r.returncode == 1 and "Traceback" not in r.stdout, r.stdout
    assert r.stdout.strip() == (
        f"ggml-bitcos: error: {path}: tensor 'blk.0.attn_k.weight': data offset 1664 is 64 "
        f"bytes past offset 1600, where tensor 'blk.0.attn_q.weight' (Q2_0 [512, 4]: 576 "
        f"bytes) ends: that tensor holds more bytes than its type and shape say"
    )
    assert not (tmp_path / "q2-bitcos.gguf").exists()
