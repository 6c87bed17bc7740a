"""Crafted BITCOS files are refused at load, never abort, and the reason reaches the user.

Through the real patched llama.cpp (skips without it): a BITCOS type on a tensor the architecture does not
use as a MUL_MAT / MUL_MAT_ID weight (token embeddings, norms, gemma4's lazily read per_layer_token_embd)
under every load and lazy mode; invalid scales (NaN, ±Inf, negative, -0.0, above 65504); the refusal
message on every run of the CLI tools (the log is flushed at exit) and in the exception of
``Llama(path)``, verbose or not. Without it: the scale rule in the Python reader and both encoders.
"""

from __future__ import annotations

import ctypes
import json
import math
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import tq2_reference
from crafted import gemma4_model, llama_model
from ggml_bitcos import codec, llama_tools, ternary
from ggml_bitcos.format import MAX_SCALE, Variant

# --- helpers ------------------------------------------------------------------------------------------

_LOAD = textwrap.dedent("""
    import json, sys
    from llama_cpp import Llama
    out = {}
    for p in sys.argv[2:]:
        try:
            Llama(p, n_ctx=64, n_threads=1, verbose=sys.argv[1] == "1")
            out[p] = None
        except Exception as e:
            out[p] = f"{type(e).__name__}: {e}"
    print("RESULT " + json.dumps(out))
""")


def python_load(paths: list[Path], verbose: bool) -> dict[str, str | None]:
    """Llama(path) for each path in one subprocess: {path: None (loaded) or 'ExcType: message'}."""
    r = subprocess.run(
        [sys.executable, "-c", _LOAD, "1" if verbose else "0", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"Python process died ({r.returncode}):\n{r.stderr[-3000:]}"
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def run_tool(tool: str, model: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(llama_tools.tool_path(tool)), "-m", str(model), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def completion(model: Path, *args: str) -> subprocess.CompletedProcess:
    return run_tool(
        "llama-completion",
        model,
        "-p",
        "hi",
        "-n",
        "4",
        "-no-cnv",
        "--no-warmup",
        "-c",
        "128",
        "--temp",
        "0",
        "--top-k",
        "1",
        "-t",
        "2",
        *args,
    )


def assert_refused(r: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit status 1 (not a signal: no abort) and every needle in the output."""
    out = r.stdout + r.stderr
    assert r.returncode == 1, f"exit status {r.returncode}:\n{out[-3000:]}"
    for n in needles:
        assert n in out, f"{n!r} not in:\n{out[-3000:]}"


# --- a BITCOS type where no matrix multiplication reads it -------------------------------------------

LOAD_MODES = [
    [],
    ["-lzm", "on"],
    ["-lzm", "auto"],
    ["-lzm", "off"],
    ["-lzm", "on", "-lm", "none"],
    ["-lm", "none"],
    ["-lm", "mmap"],
    ["-lm", "dio"],
]

MISUSED = {  # name -> (architecture, BITCOS tensor, the op the architecture uses it with)
    "gemma4-ple": ("gemma4", "per_layer_token_embd.weight", "GET_ROWS"),
    "llama-embd": ("llama", "token_embd.weight", "GET_ROWS"),
    "llama-norm": ("llama", "blk.0.attn_norm.weight", "MUL"),
}


@pytest.fixture(scope="module")
def misused(tmp_path_factory, patched_llama) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("misused")
    out = {}
    for name, (arch, tensor, _op) in MISUSED.items():
        make = gemma4_model if arch == "gemma4" else llama_model
        out[name] = make(d / f"{name}.gguf", {tensor: Variant.G128})
    # and a gemma4 whose BITCOS tensors are all matrix weights: loads under every mode
    out["gemma4-ok"] = gemma4_model(
        d / "gemma4-ok.gguf",
        {
            "blk.0.attn_q.weight": Variant.PT,
            "blk.1.ffn_down.weight": Variant.G128,
            "blk.0.inp_gate.weight": Variant.G128,
        },
    )
    out["gemma4-f32"] = gemma4_model(d / "gemma4-f32.gguf", {})
    return out


@pytest.mark.parametrize("mode", LOAD_MODES, ids=lambda m: " ".join(m) or "default")
@pytest.mark.parametrize("name", sorted(MISUSED))
def test_misused_bitcos_tensor_refused_by_cli(misused, name: str, mode: list[str]) -> None:
    _arch, tensor, op = MISUSED[name]
    assert_refused(
        completion(misused[name], *mode), f"BITCOS tensor '{tensor}'", f"is used with {op}", "MUL_MAT / MUL_MAT_ID"
    )


@pytest.mark.parametrize(
    "mode", [[], ["-lzm", "on"], ["-lzm", "on", "-lm", "none"]], ids=["default", "lazy", "lazy-no-mmap"]
)
def test_gemma4_bitcos_matrices_run_with_lazy_embeddings(misused, mode: list[str]) -> None:
    """per_layer_token_embd (F32) read lazily next to BITCOS matrix weights: loads and generates the same
    greedy text as without lazy reading."""
    r = completion(misused["gemma4-ok"], *mode)
    assert r.returncode == 0, r.stderr[-3000:]
    ref = completion(misused["gemma4-ok"], "-lzm", "off")
    assert ref.returncode == 0 and r.stdout == ref.stdout and r.stdout.strip()


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_misused_bitcos_tensor_refused_by_python(misused, verbose: bool) -> None:
    names = sorted(MISUSED)
    got = python_load([misused[n] for n in names] + [misused["gemma4-ok"]], verbose)
    for n in names:
        msg = got[str(misused[n])]
        assert msg is not None and msg.startswith("ValueError: Failed to load model from file: "), msg
        assert str(misused[n]) in msg and f"BITCOS tensor '{MISUSED[n][1]}'" in msg, msg
    assert got[str(misused["gemma4-ok"])] is None


# --- scales --------------------------------------------------------------------------------------------

BAD_SCALES = {
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "negative": -0.5,
    "-0.0": -0.0,
    "huge": 1e38,
    "above-fp16": 65536.0,
}
GOOD_SCALES = {"zero": 0.0, "max": float(MAX_SCALE), "tiny": 1e-30}


def _scale_cases() -> list[tuple[str, Variant, float, bool]]:
    cases = []
    for variant in Variant:
        for name, s in BAD_SCALES.items():
            cases.append((f"{variant.name}-{name}", variant, s, False))
        for name, s in GOOD_SCALES.items():
            # a G128 d is fp16: 1e-30 rounds to +0.0, a valid value too
            cases.append((f"{variant.name}-{name}", variant, s, True))
    return cases


SCALE_CASES = _scale_cases()


def tensor_of(variant: Variant) -> str:
    """The crafted tensor: ffn_up (K = 128), or for B256 (K a multiple of 256) ffn_down (K = 256)."""
    return "blk.0.ffn_down.weight" if variant.k_multiple > 128 else "blk.0.ffn_up.weight"


@pytest.fixture(scope="module")
def scale_models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("scales")
    return {
        name: llama_model(d / f"{name}.gguf", {tensor_of(variant): variant}, scale=s, tokenizer=False)
        for name, variant, s, _ok in SCALE_CASES
    }


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_scales_refused_by_llama_load(scale_models, patched_llama, verbose: bool) -> None:
    got = python_load(list(scale_models.values()), verbose)
    for name, variant, s, ok in SCALE_CASES:
        path = str(scale_models[name])
        msg = got[path]
        if ok:
            assert msg is None, f"{name}: {msg}"
            continue
        assert msg is not None, f"{name}: scale {s} was accepted"
        assert path in msg and f"invalid BITCOS tensor '{tensor_of(variant)}'" in msg and "invalid" in msg, msg
        # where: "in block B of row R" (fp16 block scales), "of row R" (ROW), "of matrix M" (PT, MATRIX)
        where = (
            ("fp16 scale", "in block 0 of row 0")
            if variant.scale_block
            else ("scale", "of row 0" if variant == Variant.ROW else "of matrix 0")
        )
        assert all(w in msg for w in where), msg


@pytest.mark.parametrize("name", [c[0] for c in SCALE_CASES])
def test_scales_refused_by_python_reader(scale_models, capsys, name: str) -> None:
    """`ggml-bitcos info --check` (codec.decode) applies the same rule, naming file and tensor."""
    from ggml_bitcos.cli import main

    ok = {c[0]: c[3] for c in SCALE_CASES}[name]
    variant = {c[0]: c[1] for c in SCALE_CASES}[name]
    rc = main(["info", "--check", str(scale_models[name])])
    err = capsys.readouterr().err
    if ok:
        assert rc == 0, err
    else:
        assert rc == 1 and tensor_of(variant) in err and "invalid" in err and "scale" in err, err
        assert err.strip().count("\n") == 0, err  # one line, no traceback


def test_scale_rule_python() -> None:
    f32 = np.array([0.0, 1.0, MAX_SCALE, 1e-45, -0.0, -1.0, np.nan, np.inf, -np.inf, 65504.01, 1e38], np.float32)
    assert codec.invalid_scales(f32).tolist() == [False] * 4 + [True] * 7
    f16 = np.array([0.0, 1.0, 65504.0, 6e-8, -0.0, -1.0, np.nan, np.inf, -np.inf], np.float16)
    assert codec.invalid_scales(f16).tolist() == [False] * 4 + [True] * 5
    assert codec.invalid_scales(f16.view(np.uint16)).tolist() == [False] * 4 + [True] * 5
    codes = np.ones((2, 128), np.int8)
    for bad in (-1.0, np.nan, np.inf, MAX_SCALE * 2):
        with pytest.raises(ValueError, match="finite"):
            codec.encode(codes, Variant.PT, matrix_scales=np.array([bad], np.float32))
        with pytest.raises(ValueError, match="finite"):
            codec.encode(codes, Variant.G128, block_scales=np.full((2, 1), bad, np.float32))
    # -0.0 is written as +0.0: the encoder never produces an invalid scale
    enc = codec.encode(codes, Variant.PT, matrix_scales=np.array([-0.0], np.float32))
    assert not codec.invalid_scales(codec.decode(enc.blocks, enc.companion, Variant.PT, 128, 2, 1).matrix_scales).any()
    # the converter's exact-ternary test never picks a PT scale above the bound
    mag = np.full((4, 1), 70000.0, np.float32)
    assert ternary.pt_scales(mag, 1) is None
    assert ternary.pt_scales(mag / 2, 1) is not None


# --- the C API: encoder, graph check, last error -------------------------------------------------------


@pytest.fixture(scope="module")
def libs(patched_llama) -> tuple[ctypes.CDLL, ctypes.CDLL]:
    pkg = llama_tools.llama_cpp_dir()
    base = ctypes.CDLL(str(sorted((pkg / "lib").glob("libggml-base.so*"))[0]))
    cpu = ctypes.CDLL(str(tq2_reference.cpu_backend_library(pkg)))  # libggml-cpu.so or the variant ggml loads
    return base, cpu


def test_c_encoder_refuses_invalid_scales(libs) -> None:
    base, _ = libs
    f = base.ggml_bitcos_encode
    f.restype = ctypes.c_size_t
    f.argtypes = [
        ctypes.c_int,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
    ]
    codes = np.ones((2, 256), np.int8)
    for s, ok in [
        (0.5, True),
        (0.0, True),
        (float(MAX_SCALE), True),
        (-0.0, False),
        (-1.0, False),
        (math.nan, False),
        (math.inf, False),
        (65505.0, False),
    ]:
        sc = np.array([0.25, s], np.float32)  # the bad one last: every scale is checked
        for v in (Variant.PT, Variant.MATRIX, Variant.ROW):
            # PT / MATRIX: the scale of matrix 1 of 2; ROW: the scale of row 1
            n_mats = 1 if v == Variant.ROW else 2
            n = f(v, 256, 2, n_mats, codes.ctypes.data, None, sc.ctypes.data, None, None, 0)
            assert (n > 0) == ok, (v.name, s)
        for v in (Variant.G128, Variant.B128, Variant.B256):
            nb = 2 * 256 // v.scale_block  # the scales of 2 rows; the bad one last
            with np.errstate(over="ignore"):
                d16 = np.array([0.25] * (nb - 1) + [s], np.float32).astype(np.float16).view(np.uint16)  # 65505 -> 65504
            ok16 = not codec.invalid_scales(d16).any()  # the C and the Python rule agree
            assert ok16 == (ok or s == 65505.0)
            n = f(v, 256, 2, 1, codes.ctypes.data, d16.ctypes.data, None, None, None, 0)
            assert (n > 0) == ok16, (v.name, s)


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def test_graph_check_names_the_tensor(libs) -> None:
    """A graph reading a BITCOS weight with anything but MUL_MAT is refused with its name (the scheduler
    would abort on it); MUL_MAT on the CPU backend passes."""
    base, cpu = libs
    vp = ctypes.c_void_p
    base.ggml_init.restype, base.ggml_init.argtypes = vp, [_InitParams]
    for fn, args in {
        "ggml_new_tensor_1d": [vp, ctypes.c_int, ctypes.c_int64],
        "ggml_new_tensor_2d": [vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64],
        "ggml_set_name": [vp, ctypes.c_char_p],
        "ggml_get_rows": [vp, vp, vp],
        "ggml_mul_mat": [vp, vp, vp],
        "ggml_new_graph": [vp],
        "ggml_build_forward_expand": [vp, vp],
    }.items():
        getattr(base, fn).restype, getattr(base, fn).argtypes = vp, args
    base.ggml_bitcos_link.restype = ctypes.c_bool
    base.ggml_bitcos_link.argtypes = [vp, vp, ctypes.c_char_p, ctypes.c_size_t]
    base.ggml_bitcos_graph_check.restype = ctypes.c_bool
    base.ggml_bitcos_graph_check.argtypes = [vp, ctypes.POINTER(vp), ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    base.ggml_free.argtypes = [vp]
    cpu.ggml_backend_cpu_init.restype = vp
    base.ggml_backend_free.argtypes = [vp]

    ctx = base.ggml_init(_InitParams(16 << 20, None, True))
    backend = cpu.ggml_backend_cpu_init()
    try:
        w = base.ggml_new_tensor_2d(ctx, Variant.PT.type_id, 256, 8)
        base.ggml_set_name(w, b"blk.0.ffn_up.weight")
        c = base.ggml_new_tensor_1d(ctx, 24, 1024)  # I8 companion
        base.ggml_set_name(c, b"blk.0.ffn_up.weight.bitcos")
        err = ctypes.create_string_buffer(512)
        assert base.ggml_bitcos_link(w, c, err, 512), err.value
        backends = (vp * 1)(backend)

        def check(node) -> tuple[bool, str]:  # noqa: ANN001
            g = base.ggml_new_graph(ctx)
            base.ggml_build_forward_expand(g, node)
            e = ctypes.create_string_buffer(512)
            return base.ggml_bitcos_graph_check(g, backends, 1, e, 512), e.value.decode()

        ids = base.ggml_new_tensor_1d(ctx, 26, 4)  # I32
        ok, msg = check(base.ggml_get_rows(ctx, w, ids))
        assert not ok and "'blk.0.ffn_up.weight'" in msg and "GET_ROWS" in msg, msg
        x = base.ggml_new_tensor_2d(ctx, 0, 256, 3)  # F32 activations
        ok, msg = check(base.ggml_mul_mat(ctx, w, x))
        assert ok, msg
        x16 = base.ggml_new_tensor_2d(ctx, 1, 256, 3)  # F16 activations: no backend runs that
        ok, msg = check(base.ggml_mul_mat(ctx, w, x16))
        assert not ok and "'blk.0.ffn_up.weight'" in msg and "no backend" in msg, msg
    finally:
        base.ggml_backend_free(backend)
        base.ggml_free(ctx)


def test_check_use_rules(libs) -> None:
    """The loader's per-tensor rule: only MUL_MAT / MUL_MAT_ID weights, never read lazily (no architecture
    reads a matrix weight lazily today, so the lazy branch is checked here)."""
    base, _ = libs
    vp = ctypes.c_void_p
    base.ggml_init.restype, base.ggml_init.argtypes = vp, [_InitParams]
    base.ggml_new_tensor_2d.restype = vp
    base.ggml_new_tensor_2d.argtypes = [vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_set_name.restype, base.ggml_set_name.argtypes = vp, [vp, ctypes.c_char_p]
    base.ggml_op_name.restype, base.ggml_op_name.argtypes = ctypes.c_char_p, [ctypes.c_int]
    base.ggml_bitcos_check_use.restype = ctypes.c_bool
    base.ggml_bitcos_check_use.argtypes = [vp, ctypes.c_int, ctypes.c_bool, ctypes.c_char_p, ctypes.c_size_t]
    base.ggml_free.argtypes = [vp]
    op: dict[str, int] = {}
    wanted = {"MUL", "MUL_MAT", "MUL_MAT_ID", "GET_ROWS"}
    i = 0
    while not wanted <= op.keys():  # stop at the last one wanted: ggml_op_name does not check its bound
        op[base.ggml_op_name(i).decode()] = i
        i += 1
    ctx = base.ggml_init(_InitParams(1 << 20, None, True))
    try:
        w = base.ggml_new_tensor_2d(ctx, Variant.G128.type_id, 256, 8)
        base.ggml_set_name(w, b"blk.0.attn_q.weight")
        f32 = base.ggml_new_tensor_2d(ctx, 0, 256, 8)
        err = ctypes.create_string_buffer(512)
        assert base.ggml_bitcos_check_use(w, op["MUL_MAT"], False, err, 512)
        assert base.ggml_bitcos_check_use(w, op["MUL_MAT_ID"], False, err, 512)
        assert base.ggml_bitcos_check_use(f32, op["GET_ROWS"], True, err, 512)  # not BITCOS: not its business
        for name, lazy, needle in [
            ("GET_ROWS", False, "used with GET_ROWS"),
            ("MUL", False, "used with MUL"),
            ("MUL_MAT", True, "read lazily"),
        ]:
            assert not base.ggml_bitcos_check_use(w, op[name], lazy, err, 512)
            assert "'blk.0.attn_q.weight'" in err.value.decode() and needle in err.value.decode(), err.value
    finally:
        base.ggml_free(ctx)


def test_last_error_is_per_thread(libs) -> None:
    base, _ = libs
    base.ggml_bitcos_last_error.restype = ctypes.c_char_p
    base.ggml_bitcos_set_last_error.argtypes = [ctypes.c_char_p]
    base.ggml_bitcos_set_last_error(b"main thread")
    seen = []

    def other() -> None:
        seen.append(base.ggml_bitcos_last_error())
        base.ggml_bitcos_set_last_error(b"x" * 5000)  # longer than the buffer: truncated, no overflow
        seen.append(len(base.ggml_bitcos_last_error()))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [b"", 1023]
    assert base.ggml_bitcos_last_error() == b"main thread"
    base.ggml_bitcos_set_last_error(None)
    assert base.ggml_bitcos_last_error() == b""


# --- the message reaches the user on every run ----------------------------------------------------------


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory, patched_llama) -> Path:
    return llama_model(tmp_path_factory.mktemp("nan") / "nan.gguf", {tensor_of(Variant.PT): Variant.PT}, scale=math.nan)


NAN_MESSAGE = f"invalid BITCOS tensor '{tensor_of(Variant.PT)}': invalid scale nan of matrix 0"


@pytest.mark.parametrize("tool", ["llama-completion", "llama-cli"])
def test_cli_prints_refusal_every_time(nan_model, tool: str) -> None:
    """The tools log asynchronously; the log is flushed at exit, so no run loses the message (it was lost
    in ~38 % of llama-completion runs)."""
    args = ["-p", "hi", "-n", "4", "--no-warmup", "-c", "128", "-t", "1"]
    args += ["-no-cnv"] if tool == "llama-completion" else ["-st"]
    for _ in range(8):
        assert_refused(run_tool(tool, nan_model, *args), NAN_MESSAGE)


def test_llama_bench_and_server_name_the_reason(nan_model) -> None:
    assert_refused(
        run_tool("llama-bench", nan_model, "-p", "8", "-n", "0", "-r", "1"),
        f"failed to load model '{nan_model}': {NAN_MESSAGE}",
    )
    assert_refused(run_tool("llama-server", nan_model, "--port", "0", "-t", "1"), NAN_MESSAGE)


def test_llama_run_helpers_name_the_reason(nan_model) -> None:
    """The package's own wrappers (demo, benchmarks, tests) put the refusal reason in their exception's
    first line."""
    import llama_helpers
    from ggml_bitcos import llama_run

    for call in (
        lambda: llama_helpers.run_completion(nan_model, "hi", 4),
        lambda: llama_helpers.run_cli(nan_model, "hi", 4),
        lambda: llama_run.LlamaServer(nan_model).__enter__(),
    ):
        with pytest.raises(RuntimeError) as e:
            call()
        first = str(e.value).splitlines()[0]
        assert str(nan_model) in first and NAN_MESSAGE in first, first
    with pytest.raises(ValueError, match=re.escape(f"{nan_model}: {NAN_MESSAGE}")):
        llama_run.greedy_generate(nan_model, "hi", 2)
