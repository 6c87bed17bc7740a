"""Tests of the patched llama-cpp-python build (`ggml-bitcos build-llama`).

Every test here needs that build installed and skips cleanly (with the reason) when it is not. They check:
the package identity and tools, ggml's type table (ctypes), the C test of BITCOS mul_mat / mul_mat_id
(llama_cpp/bin/test-bitcos-mm), and loading tiny llama-architecture GGUFs written here from the format spec
(docs/FORMAT.md) with an encoder independent of the C one: the BITCOS model must give the same logits as
the same model stored in F32 (up to Q8_K activation rounding), and crafted files must fail to load with an
error naming the tensor. End-to-end tests on real models live elsewhere (the lead's).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ggml_bitcos import llama_tools
from ggml_bitcos.format import Variant

llama = pytest.mark.llama  # tests that need the patched build installed

BITCOS_G128 = Variant.G128.type_id
BITCOS_PT = Variant.PT.type_id
BITCOS_BITMAP = Variant.MATRIX.type_id  # 162, every version-2 variant
TOOLS = llama_tools.TOOLS


@pytest.fixture(scope="session")
def llama_pkg() -> Path:
    """The installed llama_cpp package directory, when it is the patched build."""
    pkg = llama_tools.llama_cpp_dir()
    if pkg is None:
        pytest.skip("llama_cpp is not installed (run `ggml-bitcos build-llama`)")
    init = (pkg / "__init__.py").read_text()
    if "+bitcos" not in init:
        pytest.skip(f"installed llama_cpp at {pkg} is not the patched build (run `ggml-bitcos build-llama`)")
    return pkg


@pytest.fixture(scope="session")
def ggml_base(llama_pkg: Path) -> ctypes.CDLL:
    libs = sorted((llama_pkg / "lib").glob("libggml-base.so*"))
    if not libs:
        pytest.skip("libggml-base not found in llama_cpp/lib")
    lib = ctypes.CDLL(str(libs[0]))
    lib.ggml_type_name.restype = ctypes.c_char_p
    lib.ggml_type_name.argtypes = [ctypes.c_int]
    lib.ggml_type_size.restype = ctypes.c_size_t
    lib.ggml_type_size.argtypes = [ctypes.c_int]
    lib.ggml_blck_size.restype = ctypes.c_int64
    lib.ggml_blck_size.argtypes = [ctypes.c_int]
    lib.ggml_is_quantized.restype = ctypes.c_bool
    lib.ggml_is_quantized.argtypes = [ctypes.c_int]
    return lib


@llama
def test_version_marks_patched_build(llama_pkg: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert r.stdout.strip() == "0.3.36+bitcos1"


@llama
@pytest.mark.parametrize("tool", TOOLS)
def test_tools_installed_and_run(llama_pkg: Path, tool: str) -> None:
    exe = llama_pkg / "bin" / tool
    assert exe.is_file() and os.access(exe, os.X_OK), f"{exe} missing"
    r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "version" in (r.stdout + r.stderr).lower()


@llama
def test_llama_tools_wrapper_finds_tools(llama_pkg: Path) -> None:
    from ggml_bitcos import llama_tools

    for tool in TOOLS:
        assert llama_tools.tool_path(tool) == llama_pkg / "bin" / tool


@llama
def test_type_table(ggml_base: ctypes.CDLL) -> None:
    assert ggml_base.ggml_type_name(BITCOS_G128) == b"bitcos_g128"
    assert ggml_base.ggml_type_name(BITCOS_PT) == b"bitcos_pt"
    assert (ggml_base.ggml_blck_size(BITCOS_G128), ggml_base.ggml_type_size(BITCOS_G128)) == (128, 18)
    assert (ggml_base.ggml_blck_size(BITCOS_PT), ggml_base.ggml_type_size(BITCOS_PT)) == (128, 16)
    assert ggml_base.ggml_type_name(BITCOS_BITMAP) == b"bitcos"
    assert (ggml_base.ggml_blck_size(BITCOS_BITMAP), ggml_base.ggml_type_size(BITCOS_BITMAP)) == (32, 4)
    assert all(ggml_base.ggml_is_quantized(t) for t in (BITCOS_G128, BITCOS_PT, BITCOS_BITMAP))
    # ids between upstream's last type and BITCOS are holes
    for hole in (43, 100, 159):
        assert ggml_base.ggml_blck_size(hole) == 0 and ggml_base.ggml_type_name(hole) is None


@llama
def test_c_mul_mat(llama_pkg: Path) -> None:
    exe = llama_pkg / "bin" / "test-bitcos-mm"
    if not exe.is_file():
        pytest.skip("test-bitcos-mm was not built (tests/c missing at build time)")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert " 0 failures" in r.stdout


# ---------------------------------------------------------------------------------------------------------
# A BITCOS writer written from docs/FORMAT.md (independent of csrc/ggml-bitcos.c's encoder)


def _pad64(x: int) -> int:
    return (x + 63) // 64 * 64


def encode_bitcos(
    codes: np.ndarray, variant: int, d16: np.ndarray | None, scales: np.ndarray | None, n_mats: int
) -> tuple[np.ndarray, bytes]:
    """codes [R, K] int8 in {-1,0,1} -> (weight bytes [R, row bytes] uint8, companion bytes), any variant
    (FORMAT.md §3, §4). d16: the fp16 block scales (bit patterns) of G128 [R, K/128], B128 [R, K/128] and B256
    [R, K/256]; scales: f32 per matrix (PT, MATRIX) or per row (ROW)."""
    R, K = codes.shape
    present = codes != 0
    if variant <= 1:  # version 1: blocks of 128 weights, G128's scale after each bitmap
        nb = K // 128
        bitmap = np.packbits(present.reshape(R, nb, 128), axis=-1, bitorder="little")  # [R, nb, 16]
        if variant == 0:
            assert d16 is not None
            blocks = np.concatenate([bitmap, d16.astype("<u2").reshape(R, nb, 1).view(np.uint8)], axis=-1)
        else:
            blocks = bitmap
    else:  # version 2: the bitmap alone, K/8 bytes per row
        blocks = np.packbits(present, axis=-1, bitorder="little")
    pc = present.sum(axis=1).astype(np.uint64)
    sign_pos = np.concatenate([[0], np.cumsum(pc)[:-1]]).astype(np.uint64)
    S = int(pc.sum())
    g = 0
    for cand in range(6, -1, -1):
        G = 1 << cand
        first = sign_pos[(np.arange(R) // G) * G]
        if int((sign_pos - first).max(initial=0)) <= 0xFFFF:
            g = cand
            break
    G = 1 << g
    row_base = sign_pos[::G].astype("<u8")
    row_delta = (sign_pos - sign_pos[(np.arange(R) // G) * G]).astype("<u2")
    signs = codes[present] < 0  # row-major: row by row, k increasing
    pool_bytes = _pad64((S + 7) // 8) + 64
    pool = np.zeros(pool_bytes, np.uint8)
    packed = np.packbits(signs, bitorder="little")
    pool[: packed.size] = packed

    # the scales section (FORMAT.md §4.2): none for G128; f32 per matrix / row; f16 per 128 / 256 of a row
    if variant == 0:
        section = b""
    elif variant in (1, 2, 3):
        assert scales is not None and scales.size == (R if variant == 3 else n_mats)
        section = scales.astype("<f4").tobytes()
    else:
        assert d16 is not None and d16.shape == (R, K // (128 if variant == 4 else 256))
        section = d16.astype("<u2").tobytes()
    pos = 128
    scales_offset = 0
    if variant != 0:
        scales_offset = _pad64(pos)
        pos = scales_offset + len(section)
    row_base_offset = _pad64(pos)
    pos = row_base_offset + 8 * row_base.size
    row_delta_offset = _pad64(pos)
    pos = row_delta_offset + 2 * R
    pool_offset = _pad64(pos)
    comp = bytearray(pool_offset + pool_bytes)
    hdr = np.zeros(
        1,
        dtype=np.dtype(
            [
                ("magic", "<u4"),
                ("version", "<u2"),
                ("variant", "u1"),
                ("g", "u1"),
                ("n_cols", "<u8"),
                ("n_rows", "<u8"),
                ("n_mats", "<u8"),
                ("S", "<u8"),
                ("scales", "<u8"),
                ("row_base", "<u8"),
                ("row_delta", "<u8"),
                ("pool", "<u8"),
                ("pool_bytes", "<u8"),
            ]
        ),
    )
    hdr[0] = (
        0x53435442,
        1 if variant <= 1 else 2,
        variant,
        g,
        K,
        R,
        n_mats,
        S,
        scales_offset,
        row_base_offset,
        row_delta_offset,
        pool_offset,
        pool_bytes,
    )
    comp[: hdr.nbytes] = hdr.tobytes()
    comp[scales_offset : scales_offset + len(section)] = section
    comp[row_base_offset : row_base_offset + 8 * row_base.size] = row_base.tobytes()
    comp[row_delta_offset : row_delta_offset + 2 * R] = row_delta.tobytes()
    comp[pool_offset:] = pool.tobytes()
    return blocks.reshape(R, -1), bytes(comp)


class _RawType(int):
    """Stands in for a GGMLQuantizationType member gguf-py does not know (it only packs the integer)."""

    @property
    def name(self) -> str:  # used in gguf-py log messages
        return f"TYPE_{int(self)}"


N_EMBD, N_FF, N_VOCAB, N_HEAD = 128, 384, 64, 2
# scale -> (variant, n_embd, n_ff): every K of the model a multiple of what the variant allows; MATRIX and ROW
# get K = 160 and 224, which are not multiples of 128 (partial last 128-weight units)
SCALES = {
    "g128": (Variant.G128, 128, 384),
    "pt": (Variant.PT, 128, 384),
    "matrix": (Variant.MATRIX, 160, 224),
    "row": (Variant.ROW, 160, 224),
    "b128": (Variant.B128, 128, 384),
    "b256": (Variant.B256, 256, 512),
}


def _matrices(n_expert: int, n_embd: int = N_EMBD, n_ff: int = N_FF) -> dict[str, tuple[int, int, int]]:
    """Ternary matrices of the 1-layer model: name -> (experts, N, K); experts = 0 for a 2-D weight."""
    mats = {
        "attn_q": (0, n_embd, n_embd),
        "attn_k": (0, n_embd, n_embd),
        "attn_v": (0, n_embd, n_embd),
        "attn_output": (0, n_embd, n_embd),
    }
    if n_expert:
        mats.update(
            {
                "ffn_gate_exps": (n_expert, n_ff, n_embd),
                "ffn_up_exps": (n_expert, n_ff, n_embd),
                "ffn_down_exps": (n_expert, n_embd, n_ff),
            }
        )
    else:
        mats.update({"ffn_gate": (0, n_ff, n_embd), "ffn_up": (0, n_ff, n_embd), "ffn_down": (0, n_embd, n_ff)})
    return mats


def _scales(
    rng: np.random.Generator, variant: int, rows: int, k: int, mats: int
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
    """(fp16 block scales as uint16, f32 matrix / row scales, f32 scale of every weight [rows, k])."""
    s = np.float16(0.05 + 0.05 * rng.random(mats)).astype(np.float16)  # one per matrix / expert
    if variant in (1, 2):  # one per matrix
        return (
            None,
            s.astype(np.float32),
            np.repeat(s.astype(np.float32), rows // mats)[:, None] * np.ones((1, k), np.float32),
        )
    if variant == 3:  # one f32 per row, not fp16 values
        r = (0.05 + 0.05 * rng.random(rows)).astype(np.float32)
        return None, r, r[:, None] * np.ones((1, k), np.float32)
    blk = 256 if variant == 5 else 128
    # exact fp16 values that vary per block
    d16 = (np.full((rows, k // blk), s[0]).view(np.uint16) + rng.integers(0, 64, (rows, k // blk))).astype(np.uint16)
    return d16, None, np.repeat(d16.view(np.float16).astype(np.float32), blk, axis=1)


def write_model(
    path: Path, storage: str, scale: str, seed: int = 7, corrupt: str | None = None, n_expert: int = 0
) -> None:
    """A 1-layer llama GGUF whose matrices are ternary. storage: 'f32' (dequantized reference) or 'bitcos';
    scale: a key of SCALES, the variant (version 1: 'g128' fp16 scale per 128 weights, 'pt' one scale per
    matrix / expert; version 2: 'matrix', 'row', 'b128', 'b256'), which also fixes the model's widths. With
    n_expert > 0 the FFN is a mixture of experts (3-D weights, MUL_MAT_ID), 2 experts used per token."""
    import gguf

    variant, n_embd, n_ff = SCALES[scale]
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(256)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(1)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(n_embd // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(N_VOCAB)
    writer.add_tokenizer_model("none")
    if storage == "bitcos":
        writer.add_file_type(variant.type_id)  # FORMAT.md §6: LLAMA_FTYPE_MOSTLY_BITCOS* = the type id
    if n_expert:
        writer.add_expert_count(n_expert)
        writer.add_expert_used_count(2)
        writer.add_tensor("blk.0.ffn_gate_inp.weight", rng.normal(0, 1, (n_expert, n_embd)).astype(np.float32))
    writer.add_tensor("token_embd.weight", rng.normal(0, 1, (N_VOCAB, n_embd)).astype(np.float32))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    writer.add_tensor("output.weight", rng.normal(0, 0.2, (N_VOCAB, n_embd)).astype(np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(n_embd, np.float32))
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(n_embd, np.float32))
    for m, (e, n, k) in _matrices(n_expert, n_embd, n_ff).items():
        mats = max(e, 1)
        rows = mats * n
        codes = rng.choice(np.array([-1, 0, 1], np.int8), size=(rows, k), p=[0.3, 0.4, 0.3])
        shape = (e, n, k) if e else (n, k)
        name = f"blk.0.{m}.weight"
        d16, fs, dense_scale = _scales(rng, variant, rows, k, mats)
        if storage == "f32":
            dense = codes.astype(np.float32) * dense_scale
            writer.add_tensor(name, dense.reshape(shape).astype(np.float32))
            continue
        blocks, comp_b = encode_bitcos(codes, variant, d16, fs, mats)
        comp = bytearray(comp_b)
        if corrupt == "row_delta" and m == "attn_q":
            rd = int.from_bytes(comp[56:64], "little")
            r = 1 if comp[7] > 0 else 0
            comp[rd + 2 * r] ^= 0x01  # sign_pos(1) off by one, or a group head's delta != 0
        if corrupt == "magic" and m == "ffn_down":
            comp[0] ^= 0xFF
        writer.add_tensor(name, blocks.view(np.int8), raw_shape=shape, raw_dtype=_RawType(variant.type_id))
        if corrupt != "missing_companion" or m != "ffn_up":
            writer.add_tensor(name + ".bitcos", np.frombuffer(bytes(comp), np.int8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


_EVAL = textwrap.dedent("""
    import sys, numpy as np
    from llama_cpp import Llama
    llm = Llama(sys.argv[1], n_ctx=64, n_threads=int(sys.argv[3]), n_batch=64, logits_all=True, verbose=False)
    llm.eval([1, 5, 9, 13, 2, 40, 63])
    np.save(sys.argv[2], np.array(llm.eval_logits, dtype=np.float32))
""")


def _eval_logits(model: Path, out: Path, threads: int = 2) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _EVAL, str(model), str(out), str(threads)], capture_output=True, text=True, timeout=300
    )


@llama
@pytest.mark.parametrize("n_expert", [0, 4], ids=["dense", "moe"])
@pytest.mark.parametrize("scale", list(SCALES))
def test_bitcos_model_matches_f32(llama_pkg: Path, tmp_path: Path, scale: str, n_expert: int) -> None:
    ref_model, bc_model = tmp_path / "ref.gguf", tmp_path / "bitcos.gguf"
    write_model(ref_model, "f32", scale, n_expert=n_expert)
    write_model(bc_model, "bitcos", scale, n_expert=n_expert)
    r = _eval_logits(ref_model, tmp_path / "ref.npy")
    assert r.returncode == 0, r.stderr[-3000:]
    for threads in (1, 2):
        r = _eval_logits(bc_model, tmp_path / f"bc{threads}.npy", threads)
        assert r.returncode == 0, r.stderr[-3000:]
    ref = np.load(tmp_path / "ref.npy")
    got1, got2 = np.load(tmp_path / "bc1.npy"), np.load(tmp_path / "bc2.npy")
    assert ref.shape == got1.shape == (7, N_VOCAB)
    assert np.all(np.isfinite(got1))
    np.testing.assert_array_equal(got1, got2)  # rows split across threads, never K: identical results
    # activations are quantized to Q8_K (<= 0.4 % of the block max per value); logits must agree closely
    err = float(np.abs(got1 - ref).max() / np.abs(ref).max())
    assert err < 0.02, f"relative logit error {err:.4f}"  # measured: 0.006


@pytest.mark.parametrize(
    "corrupt, message",
    [
        ("row_delta", "invalid BITCOS tensor 'blk.0.attn_q.weight'"),
        ("magic", "invalid BITCOS tensor 'blk.0.ffn_down.weight'"),
        ("missing_companion", "BITCOS tensor 'blk.0.ffn_up.weight' has no companion"),
    ],
)
@llama
@pytest.mark.parametrize("scale", ["g128", "row"])
@pytest.mark.parametrize("use_mmap", [True, False], ids=["mmap", "read"])
def test_crafted_file_fails_with_tensor_name(
    llama_pkg: Path, tmp_path: Path, corrupt: str, message: str, use_mmap: bool, scale: str
) -> None:
    model = tmp_path / f"bad-{corrupt}.gguf"
    write_model(model, "bitcos", scale, corrupt=corrupt)
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys\nfrom llama_cpp import Llama\nLlama(sys.argv[1], n_ctx=64, use_mmap={use_mmap}, verbose=True)",
            str(model),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0
    assert message in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize(
    "variant, k, rows, mats, p_zero",
    [
        (0, 128, 5, 1, 0.4),
        (0, 384, 70, 1, 0.0),
        (1, 2048, 33, 3, 0.5),
        (1, 256, 200, 2, 1.0),
        (0, 2048, 300, 1, 0.01),
        (2, 96, 7, 1, 0.4),
        (2, 32, 1, 1, 0.0),
        (3, 160, 33, 3, 0.5),
        (3, 2048, 300, 1, 0.01),
        (4, 384, 70, 1, 0.0),
        (4, 128, 9, 3, 1.0),
        (5, 512, 41, 1, 0.3),
        (5, 2048, 300, 2, 0.4),
    ],
)
@llama
def test_c_encoder_matches_spec_writer(
    ggml_base: ctypes.CDLL, variant: int, k: int, rows: int, mats: int, p_zero: float
) -> None:
    """ggml_bitcos_encode (C, used by the C tests) and the FORMAT.md writer above produce identical bytes."""
    rng = np.random.default_rng(k * rows + variant)
    p = [(1 - p_zero) / 2, p_zero, (1 - p_zero) / 2]
    codes = np.ascontiguousarray(rng.choice(np.array([-1, 0, 1], np.int8), size=(rows, k), p=p))
    blk = 256 if variant == 5 else 128
    d16 = np.ascontiguousarray(np.float16(rng.uniform(0.01, 0.1, (rows, k // blk))).view(np.uint16))
    scales = np.ascontiguousarray(rng.uniform(0.01, 0.1, rows if variant == 3 else mats).astype(np.float32))
    blocks, comp = encode_bitcos(codes, variant, d16, scales, mats)
    f = ggml_base.ggml_bitcos_encode
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
    args = (variant, k, rows, mats, codes.ctypes.data, d16.ctypes.data, scales.ctypes.data)
    size = f(*args, None, None, 0)
    assert size == len(comp)
    wbuf = np.zeros(blocks.size, np.uint8)
    cbuf = np.zeros(size, np.uint8)
    assert f(*args, wbuf.ctypes.data, cbuf.ctypes.data, size) == size
    assert wbuf.tobytes() == blocks.tobytes()
    assert cbuf.tobytes() == comp


# ---------------------------------------------------------------------------------------------------------
# Build plumbing that needs no build


def test_cmake_args_user_last() -> None:
    from ggml_bitcos import build

    args = build.cmake_args_for("-DGGML_VULKAN=ON -DGGML_NATIVE=OFF")
    assert args.startswith("-DLLAMA_BUILD_TOOLS=ON")
    assert args.endswith("-DGGML_VULKAN=ON -DGGML_NATIVE=OFF")  # the user's options win (CMake: last -D)


def test_portable_build_has_its_own_build_dir(tmp_path: Path) -> None:
    """A GGML_BACKEND_DL build (the portable one) and a default build keep separate CMake build dirs; the last
    -DGGML_BACKEND_DL decides, in any of CMake's boolean spellings."""
    from ggml_bitcos import build

    def bdir(user: str | None) -> str:
        return build.build_dir_for(tmp_path, build.cmake_args_for(user)).name

    assert bdir(None) == bdir("-DGGML_VULKAN=ON") == bdir("-DGGML_BACKEND_DL=ON -DGGML_BACKEND_DL=OFF") == "build"
    portable = "-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF"
    assert bdir(portable) == bdir("-DGGML_BACKEND_DL:BOOL=1") == bdir("-DGGML_BACKEND_DL=yes") == "build-portable"


@pytest.fixture(scope="session")
def patched_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pinned sdist with csrc copied in and the patch series applied (no compile)."""
    from ggml_bitcos import build, upstream

    try:
        upstream.fetch_sdist()
    except upstream.UpstreamError as e:
        pytest.skip(f"sdist not available: {e}")
    tree = upstream.extract_sdist(tmp_path_factory.mktemp("sdist") / "x")
    build.copy_csrc(tree)
    build.apply_patches(tree)
    return tree


def test_patch_series_applies(patched_tree: Path) -> None:
    from ggml_bitcos import build

    ggml_h = (patched_tree / "vendor/llama.cpp/ggml/include/ggml.h").read_text()
    assert "GGML_TYPE_BITCOS_G128 = 160" in ggml_h and "GGML_TYPE_BITCOS      = 162" in ggml_h
    assert "GGML_TYPE_COUNT   = 163" in ggml_h
    assert (patched_tree / "vendor/llama.cpp/ggml/include/ggml-bitcos.h").is_file()
    assert (patched_tree / build.BITCOS_SRC_DIR / "tests" / "test-bitcos-mm.c").is_file()
    assert '__version__ = "0.3.36+bitcos1"' in (patched_tree / "llama_cpp/__init__.py").read_text()


def test_patches_regenerate_byte_identically(tmp_path: Path) -> None:
    """scripts/make_patches.py init + export reproduces patches/ exactly: the series is its own source."""
    from ggml_bitcos import upstream

    try:
        upstream.fetch_sdist()
    except upstream.UpstreamError as e:
        pytest.skip(f"sdist not available: {e}")
    repo = Path(__file__).resolve().parent.parent
    before = {p.name: p.read_bytes() for p in sorted((repo / "patches").glob("*.patch"))}
    script = repo / "scripts" / "make_patches.py"
    out = tmp_path / "patches"
    subprocess.run([sys.executable, str(script), "init", str(tmp_path / "dev")], check=True, capture_output=True)
    subprocess.run(
        [sys.executable, str(script), "export", str(tmp_path / "dev"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    after = {p.name: p.read_bytes() for p in sorted(out.glob("*.patch"))}
    assert list(after) == list(before)
    for name in before:
        assert after[name] == before[name], f"{name} does not regenerate byte-identically"


def test_patch_headers_say_what_and_why() -> None:
    """Every patch has a subject and a body (what and why); code and docs cite patches by concern, not number."""
    import re

    repo = Path(__file__).resolve().parent.parent
    for patch in sorted((repo / "patches").glob("*.patch")):
        head = patch.read_text().split("\ndiff --git ", 1)[0]
        subject, _, body = head.partition("\n\n")
        assert "Subject: [PATCH]" in subject, patch.name
        assert len(body.split()) >= 20, f"{patch.name}: header body too short to say what and why"
    cited = re.compile(r"patch(es/| )0\d{3}")
    for path in [
        *repo.glob("csrc/**/*.[ch]"),
        *repo.glob("ggml_bitcos/**/*.py"),
        *repo.glob("gguf_tools/*.py"),
        *repo.glob("tests/**/*.[ch]"),
        *repo.glob("tests/*.py"),
        *repo.glob("docs/*.md"),
        repo / "README.md",
    ]:
        assert not cited.search(path.read_text()), f"{path} cites a patch by number"


def test_validator_fuzz_under_asan(patched_tree: Path, tmp_path: Path) -> None:
    """Corrupted companions never make the validator (or, once accepted, the kernel) read out of bounds."""
    import shutil

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    repo = Path(__file__).resolve().parent.parent
    exe = tmp_path / "fuzz"
    cmd = [
        cc,
        "-std=c11",
        "-O1",
        "-g",
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
        "-I",
        str(patched_tree / "vendor/llama.cpp/ggml/include"),
        "-I",
        str(repo / "csrc"),
        str(repo / "tests/c/fuzz-bitcos-validate.c"),
        str(repo / "csrc/ggml-bitcos.c"),
        str(repo / "csrc/bitcos-kernels-generic.c"),
        "-o",
        str(exe),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 and "sanitize" in r.stderr:
        pytest.skip(f"sanitizers unavailable: {r.stderr[-500:]}")
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "rejected" in r.stdout


_GGUF_OPEN = textwrap.dedent("""
    import ctypes, sys
    lib = ctypes.CDLL(sys.argv[1])
    class Params(ctypes.Structure):
        _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]
    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, Params]
    ok = lib.gguf_init_from_file(sys.argv[2].encode(), Params(True, None))
    print("opened" if ok else "refused")
""")


@pytest.mark.slow
def test_unpatched_ggml_refuses_bitcos_file(tmp_path: Path) -> None:
    """Upstream ggml (no patches) must refuse a BITCOS GGUF with 'invalid ggml type', never misread it.

    Builds only upstream's ggml-base (the GGUF reader) from the pinned sdist, about a minute on 2 cores.
    """
    import shutil
    from ggml_bitcos import upstream

    if shutil.which("cmake") is None or shutil.which("cc") is None:
        pytest.skip("cmake / C compiler not available")
    try:
        upstream.fetch_sdist()
    except upstream.UpstreamError as e:
        pytest.skip(f"sdist not available: {e}")
    tree = upstream.extract_sdist(tmp_path / "x")
    bdir = tmp_path / "b"
    launcher = (
        ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"] if shutil.which("ccache") else []
    )
    # configured from llama.cpp's top level (ggml alone is not standalone-configurable in the sdist)
    r = subprocess.run(
        [
            "cmake",
            "-S",
            str(tree / "vendor/llama.cpp"),
            "-B",
            str(bdir),
            "-DGGML_NATIVE=OFF",
            "-DBUILD_SHARED_LIBS=ON",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_BUILD_TOOLS=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_SERVER=OFF",
            "-DLLAMA_BUILD_COMMON=OFF",
            "-DLLAMA_BUILD_APP=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_CURL=OFF",
            *launcher,
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    subprocess.run(
        ["cmake", "--build", str(bdir), "--target", "ggml-base", "-j", str(os.cpu_count() or 2)],
        check=True,
        capture_output=True,
    )
    lib = next(bdir.rglob("libggml-base.so"))
    model = tmp_path / "bitcos.gguf"
    write_model(model, "bitcos", "g128")
    r = subprocess.run([sys.executable, "-c", _GGUF_OPEN, str(lib), str(model)], capture_output=True, text=True)
    assert r.stdout.strip() == "refused"
    assert "has invalid ggml type 160" in r.stderr
    # control: the same reader opens the F32 model
    write_model(tmp_path / "f32.gguf", "f32", "g128")
    r = subprocess.run(
        [sys.executable, "-c", _GGUF_OPEN, str(lib), str(tmp_path / "f32.gguf")], capture_output=True, text=True
    )
    assert r.stdout.strip() == "opened", r.stderr[-2000:]


@llama
def test_patched_gguf_reader_refuses_hole_type_ids(llama_pkg: Path, tmp_path: Path) -> None:
    """Ids between upstream's last type and BITCOS (43..159) are holes: refused as invalid, like ids past the
    last BITCOS type (>= 163)."""
    import gguf

    lib = sorted((llama_pkg / "lib").glob("libggml-base.so*"))[0]
    for type_id in (100, BITCOS_BITMAP + 1):
        path = tmp_path / f"t{type_id}.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_tensor("x", np.zeros(256, np.int8), raw_shape=(256,), raw_dtype=_RawType(type_id))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        r = subprocess.run([sys.executable, "-c", _GGUF_OPEN, str(lib), str(path)], capture_output=True, text=True)
        assert r.stdout.strip() == "refused"
        assert f"has invalid ggml type {type_id}" in r.stderr, r.stderr[-2000:]


@llama
@pytest.mark.parametrize(
    "scale, type_name",
    [("pt", "BITCOS_PT"), ("g128", "BITCOS_G128"), ("matrix", "BITCOS"), ("row", "BITCOS"), ("b256", "BITCOS")],
)
def test_llama_bench_names_the_measured_bits_per_weight(
    llama_pkg: Path, tmp_path: Path, scale: str, type_name: str
) -> None:
    """BITCOS is variable-rate, so llama-bench's model column (llama_model_desc) carries the rate measured on
    the file, a number as for every other type: 8 * (blocks + companions) / weights of the BITCOS tensors,
    here computed independently from the file's tensor table."""
    import json

    from ggml_bitcos import llama_run

    import gguf_tools

    out = tmp_path / "m-bitcos.gguf"
    write_model(out, "bitcos", scale)
    reader = gguf_tools.open_gguf(out)
    bitcos = {v.type_id for v in Variant}
    weights = {t.name: t for t in reader.tensors if int(t.tensor_type) in bitcos}
    bits = sum(8 * int(t.n_bytes) for t in weights.values())
    bits += sum(8 * int(t.n_bytes) for t in reader.tensors if t.name.endswith(".bitcos") and t.name[:-7] in weights)
    n = sum(int(t.n_elements) for t in weights.values())
    r = subprocess.run(
        [
            str(llama_run.tool_path("llama-bench")),
            "-m",
            str(out),
            "-p",
            "0",
            "-n",
            "1",
            "-r",
            "1",
            "-o",
            "json",
            "-t",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    model_type = json.loads(r.stdout)[0]["model_type"]
    assert f"{type_name} - {bits / n:.2f} bpw ternary" in model_type, (model_type, bits / n)
    assert "guessed" not in model_type  # general.file_type named it


@llama
def test_quantize_refuses_bitcos_input_without_output(patched_llama, model_factory, tmp_path: Path) -> None:
    """llama_model_quantize on a BITCOS file (llama-quantize's engine, through the bindings) fails with a message
    naming a BITCOS tensor and the way back, and leaves no output file; the TQ2_0 source quantizes fine."""
    from ggml_bitcos import convert

    src = model_factory(z=0.4, seed=2)
    bitcos = tmp_path / "m-bitcos.gguf"
    convert.convert(src, bitcos, progress=False)
    script = textwrap.dedent("""
        import sys, llama_cpp
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
        p.allow_requantize = True          # TQ2_0 -> Q8_0 is a requantization
        sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))
    """)
    out = tmp_path / "q8.gguf"
    r = subprocess.run(
        [sys.executable, "-c", script, str(bitcos), str(out)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode != 0 and not out.exists()
    assert "cannot be requantized" in r.stderr and "ggml-bitcos convert --to" in r.stderr, r.stderr[-2000:]
    ok = subprocess.run([sys.executable, "-c", script, str(src), str(out)], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and out.stat().st_size > 0, ok.stderr[-2000:]
