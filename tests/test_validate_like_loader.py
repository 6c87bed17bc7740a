"""``stats`` and ``info`` validate BITCOS tensors like the llama.cpp loader.

Crafted corrupted files (row index, bitmap popcount, sign pool, scales, header, a zero dimension): ``ggml-bitcos
stats`` and ``ggml-bitcos info`` (the one Python implementation: ``info.validate_bitcos_tensor`` ->
``codec.validate``) and the patched llama.cpp (``Llama(path)``, skipped without it) refuse exactly the same
files, each naming the tensor; the Python commands print one line, no traceback. The unmodified file is
accepted by all three.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType
from gguf.constants import GGMLQuantizationType as T

from crafted import llama_model
from ggml_bitcos import codec
from ggml_bitcos.cli import main
from ggml_bitcos.format import COMPANION_SUFFIX, Variant
from gguf_tools import GGUFStreamWriter, open_gguf, tensor_bytes

# every variant in one model: version 1 (PT, G128) and version 2 (MATRIX, ROW, B128; B256 on the one weight
# with K = 256)
PT_T, G_T = "blk.0.attn_q.weight", "blk.0.ffn_up.weight"
MAT_T, ROW_T, B128_T, B256_T = (
    "blk.0.attn_v.weight",
    "blk.0.attn_k.weight",
    "blk.0.ffn_gate.weight",
    "blk.0.ffn_down.weight",
)
BITCOS = {
    PT_T: Variant.PT,
    G_T: Variant.G128,
    MAT_T: Variant.MATRIX,
    ROW_T: Variant.ROW,
    B128_T: Variant.B128,
    B256_T: Variant.B256,
}


def _locate(path: Path, name: str) -> tuple[int, int, codec.Header]:
    """(file offset of the weight's data, of its companion's data, the companion header)."""
    r = open_gguf(path)
    by = {t.name: t for t in r.tensors}
    w, c = by[name], by[name + COMPANION_SUFFIX]
    hdr = codec.parse_header(tensor_bytes(c))
    return int(w.data_offset), int(c.data_offset), hdr


def _patch(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def _read(path: Path, at: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(at)
        return f.read(n)


# name -> (tensor, mutation(path, weight offset, companion offset, header), a phrase of the Python message)
Mutation = Callable[[Path, int, int, codec.Header], None]


def _row_delta(p: Path, w: int, c: int, h: codec.Header) -> None:  # row 1 is no group's first row
    assert h.row_group_log2 > 0
    old = int.from_bytes(_read(p, c + h.row_delta_offset + 2, 2), "little")
    _patch(p, c + h.row_delta_offset + 2, (old + 1).to_bytes(2, "little"))


def _row_base(p: Path, w: int, c: int, h: codec.Header) -> None:  # the first row's base is not 0
    _patch(p, c + h.row_base_offset, (8).to_bytes(8, "little"))


def _bitmap_first_row(p: Path, w: int, c: int, h: codec.Header) -> None:  # popcount of row 0 changes
    b = _read(p, w, 1)[0]
    _patch(p, w, bytes([b ^ 0x01]))


def _bitmap_last_row(p: Path, w: int, c: int, h: codec.Header) -> None:  # only the total count changes
    row_bytes = codec.weight_row_bytes(Variant(h.variant), h.n_cols)
    at = w + (h.n_rows - 1) * row_bytes
    b = _read(p, at, 1)[0]
    _patch(p, at, bytes([b ^ 0x01]))


def _pool_tail(p: Path, w: int, c: int, h: codec.Header) -> None:  # last byte of the zero tail
    _patch(p, c + h.pool_offset + h.pool_bytes - 1, b"\x80")


def _pool_partial(p: Path, w: int, c: int, h: codec.Header) -> None:  # a bit just past n_sign_bits
    s = h.n_sign_bits
    at = c + h.pool_offset + s // 8
    _patch(p, at, bytes([_read(p, at, 1)[0] | (1 << (s % 8))]))


def _pt_scale(value: float) -> Mutation:
    def m(p: Path, w: int, c: int, h: codec.Header) -> None:
        _patch(p, c + h.scales_offset, np.array([value], "<f4").tobytes())

    return m


def _g128_scale(bits: int) -> Mutation:
    def m(p: Path, w: int, c: int, h: codec.Header) -> None:
        _patch(p, w + 16 + 18 * 3, bits.to_bytes(2, "little"))  # block 3 of row 0

    return m


def _companion_f32(index: int, value: float) -> Mutation:  # scale `index` of the section (matrix or row)
    def m(p: Path, w: int, c: int, h: codec.Header) -> None:
        _patch(p, c + h.scales_offset + 4 * index, np.array([value], "<f4").tobytes())

    return m


def _companion_f16(index: int, bits: int) -> Mutation:  # fp16 scale `index` of the section (row-major)
    def m(p: Path, w: int, c: int, h: codec.Header) -> None:
        _patch(p, c + h.scales_offset + 2 * index, bits.to_bytes(2, "little"))

    return m


def _header_byte(offset: int, value: int) -> Mutation:
    def m(p: Path, w: int, c: int, h: codec.Header) -> None:
        _patch(p, c + offset, bytes([value]))

    return m


def _magic(p: Path, w: int, c: int, h: codec.Header) -> None:
    _patch(p, c, b"XXXX")


def _n_sign(p: Path, w: int, c: int, h: codec.Header) -> None:  # header and bitmap disagree
    _patch(p, c + 32, (h.n_sign_bits - 4096).to_bytes(8, "little"))


CASES: dict[str, tuple[str, Mutation, str]] = {
    "row-delta": (PT_T, _row_delta, "row index"),
    "row-base": (G_T, _row_base, "row index"),
    "bitmap-row0": (G_T, _bitmap_first_row, "row index"),
    "bitmap-popcount": (PT_T, _bitmap_last_row, "non-zero weights"),
    "pool-tail": (PT_T, _pool_tail, "sign pool bits beyond n_sign_bits"),
    "pool-partial-byte": (G_T, _pool_partial, "sign pool bits beyond n_sign_bits"),
    "scale-negative": (PT_T, _pt_scale(-0.5), "invalid scale"),
    "scale-nan": (PT_T, _pt_scale(float("nan")), "invalid scale"),
    "scale-huge": (PT_T, _pt_scale(1e38), "invalid scale"),
    "fp16-scale-nan": (G_T, _g128_scale(0x7E00), "invalid fp16 scale"),
    "fp16-scale-neg": (G_T, _g128_scale(0xB800), "invalid fp16 scale"),
    "fp16-scale-inf": (G_T, _g128_scale(0x7C00), "invalid fp16 scale"),
    "magic": (PT_T, _magic, "bad companion magic"),
    "n-sign-bits": (PT_T, _n_sign, "canonical"),  # the pool's size no longer matches the header
    # version 2
    "v2-row-delta": (ROW_T, _row_delta, "row index"),
    "v2-bitmap-row0": (B128_T, _bitmap_first_row, "row index"),
    "v2-bitmap-popcount": (MAT_T, _bitmap_last_row, "non-zero weights"),
    "v2-pool-tail": (B256_T, _pool_tail, "sign pool bits beyond n_sign_bits"),
    "v2-matrix-scale-nan": (MAT_T, _companion_f32(0, float("nan")), "invalid scale"),
    "v2-row-scale-negative": (ROW_T, _companion_f32(5, -0.5), "of row 5"),
    "v2-row-scale-minus-zero": (ROW_T, _companion_f32(127, -0.0), "of row 127"),
    "v2-b128-scale-inf": (B128_T, _companion_f16(3, 0x7C00), "in block 0 of row 3"),  # K = 128: 1 per row
    "v2-b256-scale-neg": (B256_T, _companion_f16(1, 0xB800), "in block 0 of row 1"),
    "v2-version-1": (ROW_T, _header_byte(4, 1), "version"),  # a version-2 variant with version 1
    "v2-variant-g128": (B128_T, _header_byte(6, 0), "variant"),  # a version-1 variant on type 162
    "v2-variant-pt": (MAT_T, _header_byte(6, 1), "variant"),
}
ZERO_DIM = "zero-dim"  # a BITCOS weight of ggml shape (128, 0)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, tuple[Path, str | None, str | None]]:
    """name -> (file, the tensor it breaks or None, the phrase of the Python message)."""
    d = tmp_path_factory.mktemp("validate")
    good = llama_model(d / "good.gguf", BITCOS, tokenizer=False)
    out: dict[str, tuple[Path, str | None, str | None]] = {"good": (good, None, None)}
    for name, (tensor, mutate, phrase) in CASES.items():
        p = d / f"{name}.gguf"
        p.write_bytes(good.read_bytes())
        mutate(p, *_locate(p, tensor))
        out[name] = (p, tensor, phrase)
    out[ZERO_DIM] = (
        llama_model(d / "zero-dim.gguf", BITCOS, tokenizer=False, shapes={PT_T: (128, 0)}),
        PT_T,
        "zero dimension",
    )
    return out


def _python_tool(capsys, cmd: str, path: Path) -> tuple[int, str, str]:
    rc = main([cmd, str(path)] + (["-q"] if cmd == "stats" else []))
    got = capsys.readouterr()
    return rc, got.out, got.err


@pytest.mark.parametrize("cmd", ["stats", "info"])
@pytest.mark.parametrize("case", ["good", *CASES, ZERO_DIM])
def test_stats_and_info_refuse_like_the_loader(files, capsys, cmd: str, case: str) -> None:
    path, tensor, phrase = files[case]
    rc, out, err = _python_tool(capsys, cmd, path)
    if tensor is None:
        assert rc == 0 and err == "", err
        return
    assert rc == 1, f"{cmd} accepted {case}: {out}"
    assert out == "", out  # no numbers for a file the loader refuses
    assert err.count("\n") == 1 and "Traceback" not in err, err  # one line
    assert str(path) in err and f"tensor '{tensor}'" in err and phrase in err, err


def test_stats_zero_dimension_source_tensor(tmp_path: Path, capsys) -> None:
    """A ternary source tensor with a zero dimension is a one-line error (it once raised ZeroDivisionError)."""
    p = tmp_path / "zero.gguf"
    with GGUFStreamWriter(p, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        w.add_tensor_info("blk.0.ffn_up.weight", T.TQ2_0, (256, 0))
        w.add_tensor_info("blk.0.ffn_down.weight", T.F16, (256, 4, 0))
        w.begin()
        w.write_tensor("blk.0.ffn_up.weight", np.zeros(0, np.uint8))
        w.write_tensor("blk.0.ffn_down.weight", np.zeros(0, np.uint8))
    for args in (["stats", str(p)], ["stats", "--tensors", str(p)], ["stats", "--json", str(p)]):
        rc = main(args)
        got = capsys.readouterr()
        assert rc == 1 and got.out == "", got.out
        assert got.err.count("\n") == 1 and "tensor 'blk.0.ffn_up.weight'" in got.err and "zero dimension" in got.err
    # convert copies such a tensor unchanged (it held a ValueError traceback too): here nothing is left to convert
    rc = main(["convert", str(p), "-o", str(tmp_path / "out.gguf"), "-q"])
    got = capsys.readouterr()
    assert rc == 1 and got.err.count("\n") == 1 and "nothing to convert" in got.err, got.err


_LOAD = textwrap.dedent("""
    import json, sys
    from llama_cpp import Llama
    out = {}
    for p in sys.argv[1:]:
        try:
            Llama(p, n_ctx=64, n_threads=1, verbose=False)
            out[p] = None
        except Exception as e:
            out[p] = f"{type(e).__name__}: {e}"
    print("RESULT " + json.dumps(out))
""")


def test_llama_refuses_the_same_files(files, patched_llama) -> None:
    paths = [str(p) for p, _t, _ph in files.values()]
    r = subprocess.run([sys.executable, "-c", _LOAD, *paths], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"Python process died ({r.returncode}):\n{r.stderr[-3000:]}"
    got = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT ") :])
    for case, (path, tensor, _phrase) in files.items():
        msg = got[str(path)]
        if tensor is None:
            assert msg is None, f"{case}: {msg}"
        else:
            assert msg is not None, f"llama.cpp loaded {case}, which stats and info refuse"
            assert f"'{tensor}'" in msg, f"{case}: {msg}"
