"""Crafted GGUF headers and BITCOS copies (issue 30): every Python reader (``open_gguf``, and through it info,
stats and convert) refuses at once, in one line naming the file, the key or tensor and the rule, what gguf.cpp
refuses, and accepts what it accepts. One test per finding of the issue; each failed on the code before it:

1. a huge count (array items, KV pairs, tensor infos, a string length) is refused within a deadline (gguf-py
   alone looped forever, its memory growing, on an array of 2^64 - 1 items);
2. a tensor of more than 4 dimensions is refused, by the readers and by ``convert`` (it wrote one and called
   it verified); 4 dimensions and empty dimensions are accepted, as gguf.cpp accepts them;
3. ``convert --allow-copy`` validates the BITCOS tensors it copies (a NaN scale, a broken row index or
   companion header: it wrote the copy and called it verified);
4. bytes after the data section are accepted with a note, as llama.cpp accepts them (they were refused);
6. a corrupted tensor info is refused naming the tensor and the rule (it was "IndexError: ..."), a
   non-canonical companion offset in a short line (it was a 600-character dataclass repr);
7. a temporary file of a killed convert is removed by the next convert into the same folder whatever its
   output (only a convert to the same output did), and a running convert's is kept.

The reader-vs-gguf.cpp verdicts over the whole crafted corpus (tests/header_corpus.py) are
tests/test_gguf_verdicts.py; here every rule of ``gguf_tools.header.RULES`` is shown to be hit by that corpus.
"""

from __future__ import annotations

import re
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType
from gguf.constants import GGMLQuantizationType as T

import header_corpus
from header_corpus import deadline
from crafted import llama_model
from ggml_bitcos import codec
from ggml_bitcos.cli import main
from ggml_bitcos.format import COMPANION_SUFFIX, HEADER_FIELDS, Variant
from ggml_bitcos.ternary import random_codes
from gguf_raw import layout, patch, raw_gguf, read_tensor_table
from gguf_tools import GGUFError, GGUFStreamWriter, open_gguf
from gguf_tools.header import RULES
from gguf_tools.writer import TEMP_SUFFIX

ROOT = Path(__file__).resolve().parents[1]
EXCEPTION_NAME = re.compile(r"\b[A-Z][A-Za-z]*(Error|Exception)\b")


def refusal(path: Path, seconds: float = 3.0) -> GGUFError:
    with deadline(seconds), pytest.raises(GGUFError) as e:
        open_gguf(path)
    return e.value


def assert_one_line(msg: str, path: Path, *needles: str) -> None:
    assert "\n" not in msg and str(path) in msg, msg
    assert not EXCEPTION_NAME.search(msg), msg  # a reason, not an exception's name
    for n in needles:
        assert n in msg, (n, msg)


def cli(capsys, *args: str) -> tuple[int, str, str]:
    with deadline(20):
        rc = main(list(args))
    got = capsys.readouterr()
    return rc, got.out, got.err


def seed(tmp_path: Path, name: str = "plain") -> tuple[Path, bytes]:
    b = header_corpus.seeds()[name]
    return tmp_path / f"{name}.gguf", b


# --- 1. bounded: huge counts refused at once --------------------------------------------------------------


def _huge(b: bytes, case: str) -> bytes:
    lay = layout(b)
    if case == "scores-count":  # the example: an f32 array of 2^64 - 1 items
        return patch(b, lay.kv("tokenizer.ggml.scores").value_at + 4, "<Q", (1 << 64) - 1)
    if case == "tokens-count":  # strings: each needs at least its 8-byte length
        return patch(b, lay.kv("tokenizer.ggml.tokens").value_at + 4, "<Q", (1 << 64) - 1)
    if case == "tokens-count-1g":  # under gguf.cpp's 2^30-item limit, over the file's size
        return patch(b, lay.kv("tokenizer.ggml.tokens").value_at + 4, "<Q", 1 << 30)
    if case == "kv-count":
        return patch(b, 16, "<Q", (1 << 63) - 1)
    if case == "tensor-count":
        return patch(b, 8, "<Q", (1 << 63) - 1)
    if case == "key-length":
        return patch(b, lay.kv("seed.flag").at, "<Q", (1 << 64) - 1)
    if case == "name-length":
        return patch(b, lay.info("blk.0.attn_q.weight").at, "<Q", (1 << 30) - 1)
    raise AssertionError(case)


HUGE = {  # case -> (the key or tensor named, the rule's words)
    "scores-count": ("key 'tokenizer.ggml.scores'", "array of 18446744073709551615 f32 items exceeds"),
    "tokens-count": ("key 'tokenizer.ggml.tokens'", "array of 18446744073709551615 str items exceeds"),
    "tokens-count-1g": ("key 'tokenizer.ggml.tokens'", "needs at least 8589934592 bytes, 16778000 remain"),
    "kv-count": ("key count 9223372036854775807", "cannot fit in the file"),
    "tensor-count": ("tensor count 9223372036854775807", "cannot fit in the file"),
    "key-length": ("key 4", "exceeds the 1 GiB limit of a GGUF string"),
    "name-length": ("the name of tensor 1", "runs past the end of the file"),
}


def big_seed(tmp_path: Path) -> tuple[Path, bytes]:
    """The plain seed with 16 MB of tensor data after its header: enough file for gguf-py to walk a huge count
    item by item for many seconds, its memory growing, before it reaches the end (the issue's hang)."""
    b = header_corpus.with_data(
        header_corpus.base_kv(), [*header_corpus.PLAIN_TENSORS, ("big.weight", (1 << 22,), header_corpus.F32_T)]
    )
    return tmp_path / "big.gguf", b


@pytest.mark.parametrize("case", sorted(HUGE))
def test_huge_counts_refused_at_once(tmp_path: Path, case: str) -> None:
    path, b = big_seed(tmp_path)
    path.write_bytes(_huge(b, case))
    t0 = time.perf_counter()
    e = refusal(path)
    assert time.perf_counter() - t0 < 1.0
    assert_one_line(str(e), path, *HUGE[case])


def test_huge_array_count_refused_by_every_command(tmp_path: Path, capsys) -> None:
    """The issue's file through info, stats, convert and convert --allow-copy: one line each, no output."""
    path, b = big_seed(tmp_path)
    path.write_bytes(_huge(b, "scores-count"))
    for args in (
        ["info", str(path)],
        ["stats", "-q", str(path)],
        ["convert", str(path)],
        ["convert", "--allow-copy", str(path)],
    ):
        rc, out, err = cli(capsys, *args)
        assert rc == 1 and out == "", (args, out)
        assert err.count("\n") == 1 and err.startswith("ggml-bitcos: error: "), (args, err)
        assert_one_line(err.strip(), path, "tokenizer.ggml.scores", "exceeds")
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


# --- 2. n_dims > 4 ----------------------------------------------------------------------------------------


def test_more_than_four_dimensions_refused(tmp_path: Path, capsys) -> None:
    cases = dict(header_corpus.special_cases())
    for case, dims in (("special/5-d", 5), ("special/8-d", 8)):
        path = tmp_path / f"{dims}d.gguf"
        path.write_bytes(cases[case])
        assert_one_line(str(refusal(path)), path, "tensor 'a.weight'", f"invalid number of dimensions: {dims} > 4")
        out = tmp_path / "copy.gguf"
        rc, _out, err = cli(capsys, "convert", "--allow-copy", str(path), "-o", str(out))
        assert rc == 1 and "invalid number of dimensions" in err and not out.exists(), err
    # a corrupted n_dims in a valid file, read before anything else of that tensor info
    path, b = seed(tmp_path)
    path.write_bytes(patch(b, layout(b).info("blk.0.ffn_up.weight").n_dims_at, "<I", 5))
    assert_one_line(str(refusal(path)), path, "tensor 'blk.0.ffn_up.weight'", "5 > 4 (GGML_MAX_DIMS)")


def test_four_dimensions_and_empty_dimensions_accepted(tmp_path: Path) -> None:
    """gguf.cpp's limits, not stricter: 4-D, 0-D (one element), and zero-sized dimensions are valid GGUF."""
    path, b = seed(tmp_path)
    path.write_bytes(b)
    r = open_gguf(path)
    assert [len(t.shape) for t in r.tensors] == [1, 2, 2, 3, 4]
    arch = header_corpus.kv_str("general.architecture", "llama")
    path.write_bytes(raw_gguf([arch], [("s.weight", (), header_corpus.F32_T, 0)], bytes(4)))  # 0-D: 1 element
    assert open_gguf(path).tensors[0].n_elements == 1
    for case in ("special/zero-dim-4d",):
        path.write_bytes(dict(header_corpus.special_cases())[case])
        assert open_gguf(path).tensors[0].n_elements == 0
    path.write_bytes(header_corpus.seeds()["empty-tensor"])
    assert [t.n_elements for t in open_gguf(path).tensors] == [0, 4]
    # (2^62, 0): empty, and numpy cannot shape it: read flat, not a failure
    path.write_bytes(patch(header_corpus.seeds()["empty-tensor"], 0, "<4s", b"GGUF"))
    e = layout(path.read_bytes()).info("e.weight")
    path.write_bytes(patch(path.read_bytes(), e.n_dims_at + 4, "<Q", 1 << 62))
    assert open_gguf(path).tensors[0].n_elements == 0


def test_negative_and_overflowing_dimensions_refused(tmp_path: Path) -> None:
    path, b = seed(tmp_path)
    q = layout(b).info("blk.0.attn_q.weight")
    path.write_bytes(patch(b, q.n_dims_at + 4, "<Q", (1 << 64) - 1))
    assert_one_line(str(refusal(path)), path, "tensor 'blk.0.attn_q.weight'", "dimension 0 has -1 elements (< 0)")
    path.write_bytes(patch(b, q.n_dims_at + 4, "<QQ", 1 << 32, 1 << 32))
    assert_one_line(str(refusal(path)), path, "tensor 'blk.0.attn_q.weight'", "more than INT64_MAX elements")
    # gguf.cpp's order: a product past INT64_MAX is refused even when a later dimension is 0
    path.write_bytes(dict(header_corpus.special_cases())["special/overflow-then-zero"])
    assert_one_line(str(refusal(path)), path, "tensor 'o.weight'", "more than INT64_MAX elements")


# --- 3. convert --allow-copy validates the BITCOS tensors it copies ---------------------------------------

Q = "blk.0.attn_q.weight"


def _field_offset(name: str) -> int:
    codes = ""
    for n, c in HEADER_FIELDS:
        if n == name:
            return struct.calcsize("<" + codes)
        codes += c
    raise KeyError(name)


def _break(path: Path, how: str) -> None:
    b = path.read_bytes()
    comp = read_tensor_table(path)[Q + COMPANION_SUFFIX]
    c = comp.offset
    hdr = codec.parse_header(np.frombuffer(b, np.uint8, comp.ne[0], c))
    if how == "nan-scale":
        b = patch(b, c + hdr.scales_offset, "<f", float("nan"))
    elif how == "row-delta":  # row 1's delta: the row index no longer matches the bitmap
        b = patch(b, c + hdr.row_delta_offset + 2, "<H", 0xFFFF)
    elif how == "companion-offset":  # a section offset off its canonical value
        b = patch(b, c + _field_offset("scales_offset"), "<Q", hdr.scales_offset + 64)
    else:
        raise AssertionError(how)
    path.write_bytes(b)


BROKEN = {"nan-scale": "invalid scale", "row-delta": "row index", "companion-offset": "not canonical"}


@pytest.fixture(scope="module")
def bitcos_model(tmp_path_factory) -> Path:
    """A 1-layer llama with one BITCOS (MATRIX) weight, every other tensor F32 / F16 noise (nothing converts)."""
    return llama_model(tmp_path_factory.mktemp("bitcos") / "m.gguf", {Q: Variant.MATRIX}, tokenizer=False)


@pytest.mark.parametrize("how", sorted(BROKEN))
def test_allow_copy_refuses_a_broken_bitcos_tensor(tmp_path: Path, capsys, bitcos_model: Path, how: str) -> None:
    src = tmp_path / "src.gguf"
    src.write_bytes(bitcos_model.read_bytes())
    _break(src, how)
    rc, _o, err = cli(capsys, "info", str(src))  # the loader's validation, as info runs it
    assert rc == 1 and BROKEN[how] in err, err
    out = tmp_path / "copy.gguf"
    rc, _o, err = cli(capsys, "convert", "--allow-copy", str(src), "-o", str(out))
    assert rc == 1 and not out.exists(), err
    assert err.count("\n") == 1 and f"tensor '{Q}'" in err and BROKEN[how] in err and "verified" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.gguf"]


def test_allow_copy_of_a_valid_bitcos_file_says_what_was_verified(tmp_path: Path, capsys, bitcos_model: Path) -> None:
    out = tmp_path / "copy.gguf"
    rc, _o, err = cli(capsys, "convert", "--allow-copy", str(bitcos_model), "-o", str(out))
    assert rc == 0, err
    assert "verified bit-exact against the source as read" in err
    assert "its 1 BITCOS weight(s), copied, validated as llama.cpp's loader does" in err, err
    assert main(["info", str(out)]) == 0


def test_non_canonical_companion_offset_message_is_short(tmp_path: Path, capsys, bitcos_model: Path) -> None:
    src = tmp_path / "src.gguf"
    src.write_bytes(bitcos_model.read_bytes())
    _break(src, "companion-offset")
    for cmd in (["info", str(src)], ["stats", "-q", str(src)]):
        rc, _o, err = cli(capsys, *cmd)
        assert rc == 1 and err.count("\n") == 1, err
        assert "scales_offset 192, expected 128" in err and "Header(" not in err and len(err) < 260, err


# --- 4. bytes after the data section -----------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 7, 100_000])
def test_trailing_bytes_accepted_with_a_note(tmp_path: Path, capsys, bitcos_model: Path, n: int) -> None:
    """gguf.cpp only needs each tensor's data inside the file (llama_model_loader checks it), so bytes after
    the last tensor load and run in llama.cpp; every reader accepts them too, saying so."""
    src = tmp_path / "src.gguf"
    src.write_bytes(bitcos_model.read_bytes() + b"\x5a" * n)
    r = open_gguf(src)
    assert any(f"{n} bytes follow the last tensor's data" in note for note in r.form_notes), r.form_notes
    rc, out, err = cli(capsys, "info", str(src))
    assert rc == 0 and f"* source: {n} bytes follow" in out, (out, err)
    rc, _o, err = cli(capsys, "stats", "-q", str(src))
    assert rc == 0, err
    dst = tmp_path / "copy.gguf"
    rc, _o, err = cli(capsys, "convert", "--allow-copy", str(src), "-o", str(dst))
    assert rc == 0 and f"source: {n} bytes follow" in err, err
    assert not open_gguf(dst).form_notes  # the rewrite does not copy them
    # bytes that only pad the last tensor's data to the alignment are no trailing data
    seedp, b = seed(tmp_path)
    seedp.write_bytes(b + bytes(16))  # its last tensor's 16 bytes end unpadded
    assert not open_gguf(seedp).form_notes


# --- 6. a corrupted tensor info names the tensor and the rule ----------------------------------------------

CORRUPT_INFO = {  # patch of blk.0.ffn_up.weight's info -> the rule's words
    "n-dims-huge": (lambda i: (i.n_dims_at, "<I", 0xFFFFFFFF), "invalid number of dimensions: 4294967295 > 4"),
    "type-negative": (lambda i: (i.type_at, "<I", 0xFFFFFFFF), "unknown ggml type id -1"),
    "type-hole": (lambda i: (i.type_at, "<I", 100), "unknown ggml type id 100"),
    "block": (lambda i: (i.n_dims_at + 4, "<Q", 33), "row length 33 is not a multiple of the Q8_0 block size 32"),
    "offset": (lambda i: (i.offset_at, "<Q", 8), "data offset 8 is not a multiple of the file's alignment 32"),
    "name-length": (lambda i: (i.at, "<Q", 64), "too long: 64 bytes, ggml takes at most 63 (GGML_MAX_NAME)"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT_INFO))
def test_corrupt_tensor_info_names_the_tensor_and_rule(tmp_path: Path, case: str) -> None:
    path, b = seed(tmp_path)
    where, words = CORRUPT_INFO[case]
    info = layout(b).info("blk.0.ffn_up.weight")
    path.write_bytes(patch(b, *where(info)))
    msg = str(refusal(path))
    assert_one_line(msg, path, words)
    # (a name too long is given with its index and the bytes read as its name)
    assert (
        "tensor 2: name 'blk.0.ffn_up.weight" in msg if case == "name-length" else "tensor 'blk.0.ffn_up.weight'" in msg
    )


def test_every_header_rule_is_hit_by_the_corpus(tmp_path: Path) -> None:
    """Each rule of ``gguf_tools.header.RULES`` (the one list the reader, gguf.cpp's checks and docs/FUZZING.md
    share) refuses some case of tests/header_corpus.py, and every message is one line without an exception
    name; the corpus's verdicts against gguf.cpp itself are tests/test_gguf_verdicts.py."""
    hit: dict[str, str] = {}
    path = tmp_path / "case.gguf"
    t0 = time.perf_counter()
    for name, b in header_corpus.corpus():
        path.write_bytes(b)
        try:
            with deadline(3):
                open_gguf(path)
        except GGUFError as e:
            assert e.rule in RULES, (name, e.rule, str(e))
            assert_one_line(str(e), path)
            hit.setdefault(e.rule, name)
    assert set(hit) == set(RULES), f"rules no case hits: {sorted(set(RULES) - set(hit))}"
    assert time.perf_counter() - t0 < 30


# --- 7. temporary files of killed converts ------------------------------------------------------------------

_LIVE_WRITER = textwrap.dedent("""
    import sys
    from gguf import GGUFValueType
    from gguf_tools import GGUFStreamWriter
    w = GGUFStreamWriter(sys.argv[1], "llama")
    w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
    w.begin()  # creates and flocks its temporary file
    print(w.flush(), flush=True)
    sys.stdin.read()  # until the test ends it (SIGKILL)
""")


def _ternary_model(path: Path) -> Path:
    x = (random_codes(np.random.default_rng(0), (32, 256), 0.4) * 0.25).astype(np.float16)
    with GGUFStreamWriter(path, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_tensor_info("blk.0.attn_q.weight", T.F16, (256, 32))
        w.begin()
        w.write_tensor("blk.0.attn_q.weight", x)
    return path


def test_stale_temp_of_any_output_removed_by_the_next_convert(tmp_path: Path, capsys) -> None:
    src = _ternary_model(tmp_path / "m.gguf")
    # a running convert of another output: alive, holding its temporary file's flock
    env = {"PYTHONPATH": str(ROOT)}
    live = subprocess.Popen(
        [sys.executable, "-c", _LIVE_WRITER, str(tmp_path / "third.gguf")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert live.stdout is not None
        live_tmp = Path(live.stdout.readline().strip())
        assert live_tmp.exists() and live_tmp.parent == tmp_path
        # a killed convert of a third output: its PID is no process any more, nobody holds its flock
        pid = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
        stale = tmp_path / f".other.gguf.{pid}.0badf00d{TEMP_SUFFIX}"
        stale.write_bytes(b"GGUF" + bytes(60))
        rc, _o, err = cli(capsys, "convert", str(src), "-o", str(tmp_path / "mine.gguf"))
        assert rc == 0, err
        assert f"removed 1 stale temporary file(s) left in {tmp_path} by killed runs: {stale.name}" in err, err
        assert not stale.exists() and live_tmp.exists()  # the running one's is kept
        live.kill()  # SIGKILL: it cannot clean up
        live.wait(10)
        rc, _o, err = cli(
            capsys, "convert", "--to", "tq2_0", str(tmp_path / "mine.gguf"), "-o", str(tmp_path / "b.gguf")
        )
        assert rc == 0 and f"removed 1 stale temporary file(s) left in {tmp_path}" in err and live_tmp.name in err, err
        assert not live_tmp.exists()
    finally:
        if live.poll() is None:
            live.kill()
            live.wait(10)


def test_names_not_utf8_read_as_gguf_cpp_reads_them_and_not_rewritten(tmp_path: Path, capsys) -> None:
    """gguf.cpp takes any bytes as a key or tensor name: the readers read such a file (the stray bytes shown as
    escapes); convert, which writes names as UTF-8, refuses it rather than rename anything."""
    cases = dict(header_corpus.special_cases())
    for case, shown in (
        ("special/key-not-utf8", "key 'x.\\xff\\xfe'"),
        ("special/tensor-not-utf8", "tensor 'w.\\xff'"),
    ):
        path = tmp_path / "n.gguf"
        path.write_bytes(cases[case])
        r = open_gguf(path)
        assert r.header.not_utf8 == (shown,)
        assert cli(capsys, "info", str(path))[0] == 0
        out = tmp_path / "out.gguf"
        rc, _o, err = cli(capsys, "convert", "--allow-copy", str(path), "-o", str(out))
        assert rc == 1 and f"{shown}: the name is not UTF-8" in err and not out.exists(), err
