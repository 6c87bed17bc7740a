"""The Python readers and the patched llama.cpp accept and refuse the same crafted GGUF files (issue 30).

* The header corpus (tests/header_corpus.py: about 2,000 mutations of every header field of six small seeds,
  and special cases) through ``gguf_tools.open_gguf`` and through gguf.cpp itself, ``gguf_init_from_file``
  of the installed patched libggml-base, with llama.cpp's loader's one data rule on top (each tensor's data
  inside the file: ``llama_model_loader``'s "not within the file bounds"): the verdicts must be equal on every
  file, and gguf.cpp must never crash. gguf.cpp runs in a subprocess, restarted after a crash (a crash is a
  finding for the llama.cpp side, listed by the test).
* The one deliberate difference: a foreign ternary type id (I2_S, PQ2_0, PTQ1_0: FORMAT.md §7.1) is read by
  the readers, which convert it, and refused by this llama.cpp.
* Whole models through ``Llama()`` (the complete loader): a valid model with bytes appended loads, a tensor of
  5 dimensions and a vocabulary score array of 2^64 - 1 items are refused, by both.

Skips where the patched llama.cpp is not installed (``patched_llama``).
"""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import header_corpus
from header_corpus import deadline
from crafted import COMPANION_SUFFIX, Variant, llama_model
from gguf_raw import layout, patch, raw_gguf
from gguf_tools import GGUFError, open_gguf

_GGUF_VERDICT = textwrap.dedent("""
    import ctypes, os, sys
    L = ctypes.CDLL(sys.argv[1])
    class Params(ctypes.Structure):
        _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.POINTER(ctypes.c_void_p))]
    L.gguf_init_from_file.restype = ctypes.c_void_p
    L.gguf_init_from_file.argtypes = [ctypes.c_char_p, Params]
    for f, res, args in (
        ("gguf_get_n_tensors", ctypes.c_int64, [ctypes.c_void_p]),
        ("gguf_get_data_offset", ctypes.c_size_t, [ctypes.c_void_p]),
        ("gguf_get_tensor_offset", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int64]),
        ("gguf_get_tensor_size", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int64]),
        ("gguf_free", None, [ctypes.c_void_p]),
        ("ggml_free", None, [ctypes.c_void_p]),
    ):
        getattr(L, f).restype, getattr(L, f).argtypes = res, args
    for line in sys.stdin:
        path = line.rstrip("\\n")
        ctx = ctypes.c_void_p()
        g = L.gguf_init_from_file(path.encode(), Params(True, ctypes.pointer(ctx)))  # as llama_model_loader
        verdict = "refused"
        if g:
            verdict, size, start = "accepted", os.path.getsize(path), L.gguf_get_data_offset(g)
            for i in range(L.gguf_get_n_tensors(g)):
                end = start + L.gguf_get_tensor_offset(g, i) + L.gguf_get_tensor_size(g, i)
                if end > size:  # llama_model_loader: "data is not within the file bounds"
                    verdict = "refused"
                    break
            L.gguf_free(g)
            if ctx:
                L.ggml_free(ctx)
        print(verdict, path, flush=True)
""")


def _ggml_base() -> Path:
    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None and spec.origin is not None
    lib = Path(spec.origin).parent / "lib" / "libggml-base.so"
    if not lib.exists():
        pytest.skip(f"{lib} not found")
    return lib


def gguf_cpp_verdicts(paths: list[Path]) -> dict[str, str]:
    """{path: 'accepted' | 'refused' | 'crash N'} from gguf.cpp (+ the loader's bounds rule)."""
    lib, todo, out = _ggml_base(), [str(p) for p in paths], {}
    while todo:
        r = subprocess.run(
            [sys.executable, "-c", _GGUF_VERDICT, str(lib)],
            input=("\n".join(todo) + "\n").encode(),
            capture_output=True,
            timeout=300,
        )
        for line in r.stdout.decode().splitlines():
            verdict, path = line.split(" ", 1)
            out[path] = verdict
        todo = [p for p in todo if p not in out]
        if todo and r.returncode != 0:  # it died on the first one left: record that, go on after it
            out[todo.pop(0)] = f"crash {r.returncode}"
        elif todo:
            raise AssertionError(f"gguf.cpp driver stopped early: {r.stderr.decode()[-2000:]}")
    return out


def reader_verdict(path: Path) -> tuple[str, str]:
    try:
        with deadline(5):
            open_gguf(path)
    except GGUFError as e:
        return "refused", str(e)
    return "accepted", ""


def test_reader_and_gguf_cpp_agree_on_the_corpus(tmp_path: Path, patched_llama) -> None:
    cases = header_corpus.corpus()
    assert len(cases) >= 300
    paths = []
    for i, (_name, b) in enumerate(cases):
        p = tmp_path / f"{i}.gguf"
        p.write_bytes(b)
        paths.append(p)
    theirs = gguf_cpp_verdicts(paths)
    crashes = [f"{n}: {theirs[str(p)]}" for (n, _b), p in zip(cases, paths) if theirs[str(p)].startswith("crash")]
    mismatches = []
    for (name, _b), p in zip(cases, paths):
        ours, why = reader_verdict(p)
        if ours != theirs[str(p)] and not theirs[str(p)].startswith("crash"):
            mismatches.append(f"{name}: reader {ours} ({why or '-'}), gguf.cpp {theirs[str(p)]}")
    n_acc = sum(1 for v in theirs.values() if v == "accepted")
    assert not crashes, f"gguf.cpp crashed on {len(crashes)} of {len(cases)}:\n" + "\n".join(crashes[:20])
    assert not mismatches, f"{len(mismatches)} of {len(cases)} verdicts differ:\n" + "\n".join(mismatches[:30])
    assert 100 < n_acc < len(cases) - 1000, n_acc  # the corpus has both verdicts in number


@pytest.mark.parametrize("type_id", [36, 142, 143])
def test_foreign_types_are_the_one_deliberate_difference(tmp_path: Path, patched_llama, type_id: int) -> None:
    """I2_S (36: 1024 weights in 256 code bytes + its 32-byte tail), PQ2_0 (142), PTQ1_0 (143): the readers
    read them (convert's inputs, FORMAT.md §7.1), this llama.cpp refuses them."""
    nbytes = {36: 256 + 32, 142: 8 * 34, 143: 8 * 28}[type_id]
    arch = header_corpus.kv_str("general.architecture", "llama")
    p = tmp_path / "foreign.gguf"
    p.write_bytes(raw_gguf([arch], [("blk.0.attn_q.weight", (128, 8), type_id, 0)], bytes(nbytes)))
    assert reader_verdict(p) == ("accepted", "")
    assert gguf_cpp_verdicts([p])[str(p)] == "refused"


_LOAD = textwrap.dedent("""
    import json, sys
    from llama_cpp import Llama
    out = {}
    for p in sys.argv[1:]:
        try:
            Llama(p, n_ctx=64, n_threads=1, verbose=False)
            out[p] = None
        except Exception as e:
            out[p] = str(e)
    print("RESULT " + json.dumps(out))
""")


def _llama_loads(tmp_path: Path, files: dict[str, bytes]) -> tuple[dict[str, Path], dict[str, str | None]]:
    """Each of `files` written as <name>.gguf and loaded by Llama() in one child process (a crash fails the test):
    the paths, and per name None (loaded) or the exception's text."""
    paths = {}
    for name, data in files.items():
        paths[name] = tmp_path / f"{name}.gguf"
        paths[name].write_bytes(data)
    r = subprocess.run(
        [sys.executable, "-c", _LOAD, *map(str, paths.values())], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, f"Python process died ({r.returncode}):\n{r.stderr[-3000:]}"
    loaded = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT ") :])
    return paths, {name: loaded[str(p)] for name, p in paths.items()}


def test_llama_loads_and_refuses_the_same_whole_models(tmp_path: Path, patched_llama) -> None:
    good = llama_model(tmp_path / "good.gguf", {}, tokenizer=False)
    b = good.read_bytes()
    files: dict[str, bytes] = {"good": b, "trailing-1": b + b"\x01", "trailing-100k": b + bytes(100_000)}
    files["n-dims-5"] = patch(b, layout(b).info("output_norm.weight").n_dims_at, "<I", 5)
    with_vocab = llama_model(tmp_path / "vocab.gguf", {}, tokenizer=True).read_bytes()
    files["vocab"] = with_vocab
    scores = layout(with_vocab).kv("tokenizer.ggml.scores")
    files["scores-2^64-1"] = patch(with_vocab, scores.value_at + 4, "<Q", (1 << 64) - 1)
    files["scores-type-u64"] = patch(with_vocab, scores.value_at, "<I", 10)  # 8-byte items: past the end
    paths, loaded = _llama_loads(tmp_path, files)
    for name, p in paths.items():
        ours, why = reader_verdict(p)
        theirs = "accepted" if loaded[name] is None else "refused"
        assert ours == theirs, f"{name}: reader {ours} ({why}), Llama() {theirs} ({loaded[name]})"
        assert ours == ("accepted" if name in ("good", "trailing-1", "trailing-100k", "vocab") else "refused")


def test_llama_value_error_names_the_gguf_rule(tmp_path: Path, patched_llama) -> None:
    """A file gguf.cpp refuses makes Llama() raise ValueError with gguf.cpp's own reason (its first error of
    the read), not only "failed to load model": a moved data offset, a zero dimension (the next tensor's offset
    then disagrees), a companion given another type, 5 dimensions, an unknown type id."""
    good = llama_model(tmp_path / "good.gguf", {"blk.0.attn_q.weight": Variant.PT}, tokenizer=False)
    b = good.read_bytes()
    lay = layout(b)
    k, c = lay.info("blk.0.attn_k.weight"), lay.info("blk.0.attn_q.weight" + COMPANION_SUFFIX)
    rel = struct.unpack_from("<Q", b, k.offset_at)[0]
    cases = {
        "offset": (patch(b, k.offset_at, "<Q", rel + 32), "tensor 'blk.0.attn_k.weight' has offset"),
        "zero-dim": (patch(b, k.n_dims_at + 4 + 8, "<q", 0), "tensor 'blk.0.attn_v.weight' has offset"),
        "companion-type": (patch(b, c.type_at, "<I", 0), "tensor 'blk.0.attn_k.weight' has offset"),
        "n-dims-5": (patch(b, k.n_dims_at, "<I", 5), "invalid number of dimensions: 5 > 4"),
        "type-999": (patch(b, k.type_at, "<I", 999), "tensor 'blk.0.attn_k.weight' has invalid ggml type 999"),
    }
    paths, loaded = _llama_loads(tmp_path, {name: data for name, (data, _) in cases.items()})
    for name, p in paths.items():
        msg = loaded[name]
        assert msg is not None, f"{name}: loaded"
        assert msg.startswith(f"Failed to load model from file: {p}: ") and cases[name][1] in msg, f"{name}: {msg}"
