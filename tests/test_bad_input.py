"""Bad input: a clear one-line error naming the file (and tensor), exit code != 0, input untouched,
no partial output left behind."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType
from gguf.constants import GGMLQuantizationType as T

from ggml_bitcos import codec
from ggml_bitcos.cli import main
from ggml_bitcos.convert import ConvertError, convert
from ggml_bitcos.format import COMPANION_SUFFIX, KEY_FORMAT_VERSION, Variant
from ggml_bitcos.ternary import random_codes
from gguf_tools import GGUFError, GGUFStreamWriter, open_gguf


def small_model(path: Path, rows: int = 512, k: int = 1024) -> Path:
    """A ~2 MB GGUF: one TQ2_0-free F16 ternary weight, one F32 norm (no tokenizer: fast)."""
    rng = np.random.default_rng(0)
    x = (random_codes(rng, (rows, k), 1 / 3) * 0.25).astype(np.float16)
    with GGUFStreamWriter(path, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_tensor_info("blk.0.attn_q.weight", T.F16, (k, rows))
        w.add_tensor_info("blk.0.attn_norm.weight", T.F32, (k,))
        w.begin()
        w.write_tensor("blk.0.attn_q.weight", x)
        w.write_tensor("blk.0.attn_norm.weight", np.ones(k, np.float32))
    return path


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    rc = main(args)
    err = capsys.readouterr().err.strip()
    return rc, err


def assert_clean_failure(rc: int, err: str, folder: Path, keep: set[str], *needles: str) -> None:
    assert rc != 0
    # progress lines may precede it; the error itself is exactly one line, the last
    lines = [ln for ln in err.splitlines() if ln.startswith("ggml-bitcos:")]
    assert len(lines) == 1 and err.splitlines()[-1] == lines[0], err
    assert lines[0].startswith("ggml-bitcos: error: ")
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert {p.name for p in folder.iterdir()} == keep  # no partial output, no temp file


def test_not_a_gguf(tmp_path, capsys):
    f = tmp_path / "notes.gguf"
    f.write_text("hello, this is not a model\n" * 10)
    h = digest(f)
    rc, err = run_cli(["convert", str(f)], capsys)
    assert_clean_failure(rc, err, tmp_path, {"notes.gguf"}, str(f), "not a GGUF file")
    rc, err = run_cli(["stats", str(f)], capsys)
    assert_clean_failure(rc, err, tmp_path, {"notes.gguf"}, str(f), "not a GGUF file")
    assert digest(f) == h
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    rc, err = run_cli(["convert", str(empty)], capsys)
    assert_clean_failure(rc, err, tmp_path, {"notes.gguf", "empty.gguf"}, str(empty), "not a GGUF file")


def test_missing_input(tmp_path, capsys):
    rc, err = run_cli(["convert", str(tmp_path / "nope.gguf")], capsys)
    assert_clean_failure(rc, err, tmp_path, set(), "nope.gguf", "no such file")


@pytest.mark.parametrize("cut,needle", [(40, "truncated"), (200, "truncated"), (-1000, "truncated")])
def test_truncated(tmp_path, capsys, cut: int, needle: str):
    good = small_model(tmp_path / "good.gguf")
    data = good.read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data[:cut] if cut > 0 else data[: len(data) + cut])
    good.unlink()
    h = digest(bad)
    rc, err = run_cli(["convert", str(bad)], capsys)
    assert_clean_failure(rc, err, tmp_path, {"bad.gguf"}, str(bad), needle)
    if cut < 0:
        assert "blk.0.attn_norm.weight" in err or "blk.0.attn_q.weight" in err  # names the tensor
    assert digest(bad) == h


def test_unknown_tensor_type(tmp_path, capsys):
    f = small_model(tmp_path / "m.gguf")
    r = open_gguf(f)
    t = r.tensors[0]
    name_len = len(t.name.encode())
    type_off = t.field.offset + 8 + name_len + 4 + 8 * len(t.shape)
    del r
    raw = bytearray(f.read_bytes())
    assert int.from_bytes(raw[type_off : type_off + 4], "little") == int(T.F16)
    raw[type_off : type_off + 4] = (99).to_bytes(4, "little")
    f.write_bytes(bytes(raw))
    h = digest(f)
    with pytest.raises(GGUFError, match="unknown ggml type id 99"):
        open_gguf(f)
    rc, err = run_cli(["convert", str(f)], capsys)
    assert_clean_failure(rc, err, tmp_path, {"m.gguf"}, str(f), "blk.0.attn_q.weight", "unknown ggml type id 99")
    assert digest(f) == h


def test_output_is_input(tmp_path, capsys):
    f = small_model(tmp_path / "m.gguf")
    h = digest(f)
    rc, err = run_cli(["convert", str(f), "-o", str(f), "--force"], capsys)
    assert_clean_failure(rc, err, tmp_path, {"m.gguf"}, str(f), "output path is the input")
    link = tmp_path / "alias.gguf"
    os.symlink(f, link)
    rc, err = run_cli(["convert", str(f), "-o", str(link), "--force"], capsys)
    assert_clean_failure(rc, err, tmp_path, {"m.gguf", "alias.gguf"}, "output path is the input")
    assert digest(f) == h


def test_output_exists(tmp_path, capsys):
    f = small_model(tmp_path / "m.gguf")
    out = tmp_path / "m-bitcos.gguf"
    out.write_bytes(b"precious")
    rc, err = run_cli(["convert", str(f)], capsys)
    assert_clean_failure(rc, err, tmp_path, {"m.gguf", "m-bitcos.gguf"}, str(out), "already exists", "--force")
    assert out.read_bytes() == b"precious"
    rc, err = run_cli(["convert", str(f), "--force", "-q"], capsys)
    # one scale per matrix: version 2's MATRIX (convert's default format version)
    assert rc == 0 and open_gguf(out).tensors[0].tensor_type == Variant.MATRIX.type_id


def test_disk_full_monkeypatched(tmp_path, capsys, monkeypatch):
    f = small_model(tmp_path / "m.gguf")
    h = digest(f)
    import gguf.gguf_writer as gw

    real = gw.GGUFWriter.write_tensor_data
    calls = {"n": 0}

    def failing(self, tensor, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, tensor, *a, **kw)

    monkeypatch.setattr(gw.GGUFWriter, "write_tensor_data", failing)
    rc, err = run_cli(["convert", str(f)], capsys)
    assert_clean_failure(rc, err, tmp_path, {"m.gguf"}, "m-bitcos.gguf", "No space left on device")
    assert digest(f) == h


def test_disk_full_real_tmpfs(tmp_path, capsys):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    if (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here")
    try:
        f = small_model(tmp_path / "m.gguf")
        h = digest(f)
        rc, err = run_cli(["convert", str(f), "-o", str(mnt / "out.gguf")], capsys)
        assert_clean_failure(rc, err, mnt, set(), str(mnt / "out.gguf"), "No space left on device")
        assert digest(f) == h
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_verification_failure_leaves_nothing(tmp_path, capsys, monkeypatch):
    """A wrong encoding (one sign flipped) is caught by the verify pass: error, no output."""
    f = small_model(tmp_path / "m.gguf")
    real = codec.encode

    def corrupt(*a, **kw):
        enc = real(*a, **kw)
        enc.companion[enc.header.pool_offset] ^= 1
        return enc

    monkeypatch.setattr(codec, "encode", corrupt)
    rc, err = run_cli(["convert", str(f)], capsys)
    assert_clean_failure(rc, err, tmp_path, {"m.gguf"}, "blk.0.attn_q.weight", "verification failed")
    with pytest.raises(ConvertError):
        convert(f, progress=False)
    monkeypatch.setattr(codec, "encode", real)
    convert(f, progress=False)  # and with the real codec it passes
    assert (tmp_path / "m-bitcos.gguf").exists()


def test_missing_output_folder(tmp_path, capsys):
    f = small_model(tmp_path / "m.gguf")
    rc, err = run_cli(["convert", str(f), "-o", str(tmp_path / "no" / "dir.gguf")], capsys)
    assert_clean_failure(rc, err, tmp_path, {"m.gguf"}, "does not exist")


def test_unpaired_bitcos_and_newer_version(tmp_path, capsys):
    f = small_model(tmp_path / "m.gguf")
    out = tmp_path / "c.gguf"
    convert(f, out, progress=False)
    r = open_gguf(out)
    # rewrite the file without the companion: an invalid BITCOS file
    bad = tmp_path / "nocomp.gguf"
    with GGUFStreamWriter(bad, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        keep = [t for t in r.tensors if not t.name.endswith(COMPANION_SUFFIX)]
        for t in keep:
            w.add_tensor_info(t.name, t.tensor_type, tuple(int(x) for x in t.shape))
        w.begin()
        for t in keep:
            w.write_tensor(t.name, np.asarray(t.data))
    rc, err = run_cli(["stats", str(bad)], capsys)
    assert rc == 1 and "without its companion" in err and "blk.0.attn_q.weight" in err
    newer = tmp_path / "v3.gguf"
    with GGUFStreamWriter(newer, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_kv(KEY_FORMAT_VERSION, 3, GGUFValueType.UINT32)
        w.add_tensor_info("a", T.F32, (4,))
        w.begin()
        w.write_tensor("a", np.zeros(4, np.float32))
    rc, err = run_cli(["convert", str(newer)], capsys)
    assert rc == 1 and "format_version 3" in err
    assert not (tmp_path / "v3-bitcos.gguf").exists()


# --- crafted version-2 companions: refused by the Python reader and the llama.cpp loader, naming the tensor ---


def _v2_model(path: Path, variant: Variant, k: int, header: dict[int, bytes] | None = None) -> Path:
    """One type-162 weight `blk.0.attn_q.weight` [k, 8] of `variant`; `header`: companion header bytes to
    overwrite (offset -> bytes), written past the encoder."""
    rng = np.random.default_rng(1)
    codes = random_codes(rng, (8, k), 0.4)
    kw = (
        {"block_scales": np.full((8, k // variant.scale_block), 0.5, np.float16)}
        if variant.scale_block
        else {"row_scales": np.full(8, 0.5, np.float32)}
        if variant == Variant.ROW
        else {"matrix_scales": np.full(1, 0.5, np.float32)}
    )
    enc = codec.encode(codes, variant, **kw)
    comp = enc.companion.copy()
    for off, b in (header or {}).items():
        comp[off : off + len(b)] = np.frombuffer(b, np.uint8)
    from gguf_tools import bitcos_type

    with GGUFStreamWriter(path, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_kv(KEY_FORMAT_VERSION, 2, GGUFValueType.UINT32)
        w.add_tensor_info("blk.0.attn_q.weight", bitcos_type(variant), (k, 8))
        w.add_tensor_info("blk.0.attn_q.weight" + COMPANION_SUFFIX, T.I8, (comp.size,))
        w.begin()
        w.write_tensor("blk.0.attn_q.weight", enc.blocks)
        w.write_tensor("blk.0.attn_q.weight" + COMPANION_SUFFIX, comp.view(np.int8))
    return path


V2_BAD = {  # name -> (variant, K, header bytes, phrase of the Python message)
    "version-1": (Variant.MATRIX, 96, {4: (1).to_bytes(2, "little")}, "version"),
    "variant-g128": (Variant.ROW, 128, {6: bytes([0])}, "G128"),
    "variant-unknown": (Variant.ROW, 128, {6: bytes([9])}, "variant 9"),
    "reserved": (Variant.B256, 256, {100: bytes([1])}, "reserved"),
}


@pytest.mark.parametrize("case", sorted(V2_BAD))
def test_crafted_v2_companion_refused_naming_the_tensor(tmp_path, capsys, case: str) -> None:
    variant, k, header, phrase = V2_BAD[case]
    good = _v2_model(tmp_path / "good.gguf", variant, k)
    assert main(["info", "--check", str(good)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    bad = _v2_model(tmp_path / "bad.gguf", variant, k, header)
    rc, err = run_cli(["info", "--check", str(bad)], capsys)
    assert rc == 1 and err.count("\n") == 0, err
    assert str(bad) in err and "blk.0.attn_q.weight" in err and phrase in err, err
