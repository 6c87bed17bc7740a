"""Fuzzing helpers (docs/FUZZING.md): seed GGUF files, building the two C fuzzers, running them.

Used by tests/test_fuzz.py (CI-sized runs in the default suite) and runnable for the long runs:

    python3 tests/fuzzing.py kernels --cases 1000000
    python3 tests/fuzzing.py asan-build                   # patched libllama + ggml with ASan+UBSan
    python3 tests/fuzzing.py loader --asan --cases 100000
    python3 tests/fuzzing.py findings                     # the inputs of findings 9 to 14 (fuzz-regressions/)

Not a test module itself (pytest collects test_*.py only).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gguf import GGUFValueType  # noqa: E402
from gguf.constants import GGMLQuantizationType as T  # noqa: E402

from dev import kernel_manifest  # noqa: E402
from ggml_bitcos import codec  # noqa: E402
from ggml_bitcos.format import COMPANION_SUFFIX, KEY_FORMAT_VERSION, Variant  # noqa: E402
from gguf_tools import GGUFStreamWriter, bitcos_type  # noqa: E402

CSRC = ROOT / "csrc"
CTESTS = ROOT / "tests" / "c"
REGRESSIONS = ROOT / "tests" / "data" / "fuzz-regressions"
ASAN_DIR = Path(os.environ.get("GGML_BITCOS_ASAN_DIR", Path.home() / ".cache" / "ggml-bitcos-asan"))
SAN_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
U32, F32, STR = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.STRING

# Sanitizer run-time options of every run: any report is fatal, aborts are reported (with the case saved).
ASAN_OPTIONS = "abort_on_error=1:halt_on_error=1:handle_abort=1:detect_leaks=0:allocator_may_return_null=1"
UBSAN_OPTIONS = "halt_on_error=1:abort_on_error=1:print_stacktrace=1"
# one upstream report suppressed (the file says which and why)
UBSAN_SUPPRESSIONS = ROOT / "tests" / "data" / "fuzz-ubsan.supp"


# --- seed files --------------------------------------------------------------------------------------------


def _codes(rng: np.random.Generator, rows: int, k: int, z: float) -> np.ndarray:
    nz = rng.random((rows, k)) >= z
    return np.where(nz, rng.choice(np.array([-1, 1], np.int8), size=(rows, k)), 0).astype(np.int8)


def _bitcos(rng: np.random.Generator, name: str, ne: tuple[int, ...], variant: Variant, z: float) -> list:
    k, rows = ne[0], int(np.prod(ne[1:]))
    n_mats = codec.n_mats_of(ne)
    codes = _codes(rng, rows, k, z)
    if variant.scale_block:  # G128, B128, B256: fp16 per 128 / 256 weights of a row
        d = rng.uniform(0.01, 0.1, size=(rows, k // variant.scale_block)).astype(np.float16)
        enc = codec.encode(codes, variant, block_scales=d, n_mats=n_mats)
    elif variant == Variant.ROW:  # fp32 per row
        enc = codec.encode(codes, variant, row_scales=rng.uniform(0.01, 0.1, rows).astype(np.float32), n_mats=n_mats)
    else:  # PT, MATRIX: fp32 per matrix
        enc = codec.encode(
            codes, variant, matrix_scales=rng.uniform(0.01, 0.1, n_mats).astype(np.float32), n_mats=n_mats
        )
    return [
        (name, bitcos_type(variant), ne, enc.blocks),
        (name + COMPANION_SUFFIX, T.I8, (enc.companion.size,), enc.companion.view(np.int8)),
    ]


def _write(path: Path, kv: list, tensors: list, arch: str = "llama", alignment: int | None = None) -> Path:
    # bitcos.format_version: the highest version of the file's BITCOS tensors (FORMAT.md §6)
    version_of = {v.type_id: v.version for v in Variant}  # 162 -> 2 (every v2 variant)
    versions = [version_of[int(tt)] for _n, tt, _ne, _d in tensors if int(tt) in version_of]
    with GGUFStreamWriter(path, arch, overwrite=True, alignment=alignment) as w:
        w.add_kv("general.architecture", arch, STR)
        if alignment is not None:
            w.add_kv("general.alignment", alignment, U32)
        w.add_kv(KEY_FORMAT_VERSION, max(versions, default=1), U32)
        for key, value, vtype in kv:
            if vtype == GGUFValueType.ARRAY:
                w.add_kv(key, value[0], vtype, value[1])
            else:
                w.add_kv(key, value, vtype)
        for name, ttype, ne, _ in tensors:
            w.add_tensor_info(name, ttype, ne)
        w.begin()
        for name, _, _, data in tensors:
            w.write_tensor(name, data)
    return path


def llama_seed(
    path: Path,
    *,
    n_embd: int = 128,
    n_ff: int = 256,
    n_vocab: int = 32,
    n_expert: int = 0,
    variants: dict[str, Variant] | None = None,
    z: dict[str, float] | None = None,
    bitcos_output: bool = False,
    bitcos_on: tuple[str, ...] = (),
    alignment: int | None = None,
    seed: int = 0,
    default: Variant = Variant.G128,
) -> Path:
    """A 1-layer llama with no tokenizer ("none": n_vocab dummy tokens) whose matrices are BITCOS: tens of KB,
    loads in milliseconds. variants/z: per short name (attn_q, ffn_down, ...; default `default` / 0.4)."""
    rng = np.random.default_rng(seed)
    variants = variants or {}
    z = z or {}
    shorts = ("attn_q", "attn_k", "attn_v", "attn_output") + (
        ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps") if n_expert else ("ffn_gate", "ffn_up", "ffn_down")
    )
    used = [variants.get(sh, default).type_id for sh in shorts]
    a = "llama"
    kv = [
        (f"{a}.context_length", 64, U32),
        (f"{a}.embedding_length", n_embd, U32),
        (f"{a}.block_count", 1, U32),
        (f"{a}.feed_forward_length", n_ff, U32),
        (f"{a}.attention.head_count", 2, U32),
        (f"{a}.attention.head_count_kv", 1, U32),
        (f"{a}.rope.dimension_count", n_embd // 2, U32),
        (f"{a}.attention.layer_norm_rms_epsilon", 1e-5, F32),
        (f"{a}.vocab_size", n_vocab, U32),
        ("tokenizer.ggml.model", "none", STR),
        # LLAMA_FTYPE_MOSTLY_BITCOS*: the majority type, as convert writes it (the loader names the model by it)
        ("general.file_type", max(set(used), key=used.count), U32),
    ]
    if n_expert:
        kv += [(f"{a}.expert_count", n_expert, U32), (f"{a}.expert_used_count", 2, U32)]
    mats = {
        "attn_q": (n_embd, n_embd),
        "attn_k": (n_embd, n_embd // 2),
        "attn_v": (n_embd, n_embd // 2),
        "attn_output": (n_embd, n_embd),
    }
    if n_expert:
        mats.update(
            {
                "ffn_gate_exps": (n_embd, n_ff, n_expert),
                "ffn_up_exps": (n_embd, n_ff, n_expert),
                "ffn_down_exps": (n_ff, n_embd, n_expert),
            }
        )
    else:
        mats.update({"ffn_gate": (n_embd, n_ff), "ffn_up": (n_embd, n_ff), "ffn_down": (n_ff, n_embd)})
    tensors: list = []
    if "token_embd" in bitcos_on:
        tensors += _bitcos(rng, "token_embd.weight", (n_embd, n_vocab), Variant.G128, 0.4)
    else:
        tensors.append(
            ("token_embd.weight", T.F32, (n_embd, n_vocab), rng.normal(0, 1, (n_vocab, n_embd)).astype(np.float32))
        )
    if "output_norm" in bitcos_on:
        tensors += _bitcos(rng, "output_norm.weight", (n_embd,), Variant.PT, 0.2)
    else:
        tensors.append(("output_norm.weight", T.F32, (n_embd,), np.ones(n_embd, np.float32)))
    if bitcos_output:
        tensors += _bitcos(rng, "output.weight", (n_embd, n_vocab), Variant.PT, 0.3)
    for norm in ("attn_norm", "ffn_norm"):
        tensors.append((f"blk.0.{norm}.weight", T.F32, (n_embd,), np.ones(n_embd, np.float32)))
    if n_expert:
        tensors.append(
            (
                "blk.0.ffn_gate_inp.weight",
                T.F32,
                (n_embd, n_expert),
                rng.normal(0, 0.1, (n_expert, n_embd)).astype(np.float32),
            )
        )
    for short, ne in mats.items():
        tensors += _bitcos(rng, f"blk.0.{short}.weight", ne, variants.get(short, default), z.get(short, 0.4))
    return _write(path, kv, tensors, alignment=alignment)


def gemma4_seed(path: Path, seed: int = 5, bitcos_ple: bool = False) -> Path:
    """A 2-layer gemma4 with per-layer embeddings and no tokenizer: per_layer_token_embd is the tensor
    llama.cpp reads lazily (--lazy-mode on/auto); bitcos_ple: it is BITCOS (refused: GET_ROWS, lazy)."""
    rng = np.random.default_rng(seed)
    a, e, ff, hd, n_layer, pl, nv = "gemma4", 128, 256, 64, 2, 64, 32
    kv = [
        (f"{a}.context_length", 64, U32),
        (f"{a}.embedding_length", e, U32),
        (f"{a}.block_count", n_layer, U32),
        (f"{a}.feed_forward_length", ff, U32),
        (f"{a}.attention.head_count", 2, U32),
        (f"{a}.attention.head_count_kv", 2, U32),
        (f"{a}.attention.key_length", hd, U32),
        (f"{a}.attention.value_length", hd, U32),
        (f"{a}.attention.key_length_swa", hd, U32),
        (f"{a}.attention.value_length_swa", hd, U32),
        (f"{a}.rope.dimension_count", hd, U32),
        (f"{a}.attention.layer_norm_rms_epsilon", 1e-6, F32),
        (f"{a}.attention.sliding_window", 64, U32),
        (f"{a}.attention.sliding_window_pattern", ([True] * n_layer, GGUFValueType.BOOL), GGUFValueType.ARRAY),
        (f"{a}.embedding_length_per_layer_input", pl, U32),
        (f"{a}.vocab_size", nv, U32),
        ("tokenizer.ggml.model", "none", STR),
        ("general.file_type", 160, U32),
    ]

    def f32(name: str, ne: tuple[int, ...], std: float = 0.05) -> tuple:
        return (name, T.F32, ne, rng.normal(0, std, tuple(reversed(ne))).astype(np.float32))

    def ones(name: str, n: int) -> tuple:
        return (name, T.F32, (n,), np.ones(n, np.float32))

    tensors: list = [
        f32("token_embd.weight", (e, nv), 1.0),
        ones("per_layer_proj_norm.weight", pl),
        ones("output_norm.weight", e),
    ]
    if bitcos_ple:
        tensors += _bitcos(rng, "per_layer_token_embd.weight", (pl * n_layer, nv), Variant.PT, 0.4)
    else:
        tensors.append(f32("per_layer_token_embd.weight", (pl * n_layer, nv), 1.0))
    tensors += _bitcos(rng, "per_layer_model_proj.weight", (e, pl * n_layer), Variant.PT, 0.4)
    for i in range(n_layer):
        b = f"blk.{i}."
        for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "post_norm"):
            tensors.append(ones(b + n + ".weight", e))
        tensors += [
            ones(b + "attn_q_norm.weight", hd),
            ones(b + "attn_k_norm.weight", hd),
            f32(b + "proj.weight", (pl, e)),
        ]  # K = 64: not BITCOS-able
        for n, ne, v in (
            ("attn_q", (e, e), Variant.G128),
            ("attn_k", (e, e), Variant.PT),
            ("attn_v", (e, e), Variant.G128),
            ("attn_output", (e, e), Variant.PT),
            ("ffn_gate", (e, ff), Variant.G128),
            ("ffn_up", (e, ff), Variant.PT),
            ("ffn_down", (ff, e), Variant.G128),
            ("inp_gate", (e, pl), Variant.G128),
        ):
            tensors += _bitcos(rng, b + n + ".weight", ne, v, 0.4)
    return _write(path, kv, tensors, arch=a)


def make_seeds(folder: Path) -> list[Path]:
    """The loader fuzzer's seed corpus: small valid BITCOS models covering every variant (version 1: G128, PT;
    version 2: MATRIX, ROW, B128, B256, alone and mixed with version 1 in one file), 2-D and 3-D (MoE)
    weights, row_group_log2 < 6 (ffn_down with K = 2048 at zero density 0: deltas over 16 bits), empty and
    full tensors, odd K (= 384; version 2: 160 and 224, partial last 128-weight units), a BITCOS output
    matrix, a gemma4 model whose per_layer_token_embd is read lazily (--lazy-mode), and general.alignment 4
    and 8 (companion sections only 4/8-byte aligned in memory under mmap; FORMAT.md promises 32 only for the
    default alignment), 2 and 1 (tensor data off ggml-backend's 32-byte alignment: the loader reads such a file
    instead of mapping it)."""
    folder.mkdir(parents=True, exist_ok=True)
    P, G = Variant.PT, Variant.G128
    M, R, B1, B2 = Variant.MATRIX, Variant.ROW, Variant.B128, Variant.B256
    return [
        llama_seed(
            folder / "dense-mixed.gguf",
            variants={"attn_q": P, "attn_v": P, "ffn_up": P, "ffn_down": P},
            z={"attn_k": 1.0, "attn_v": 0.0, "ffn_gate": 0.95},
            seed=1,
        ),
        llama_seed(
            folder / "moe.gguf", n_expert=4, variants={"ffn_up_exps": P, "ffn_down_exps": P, "attn_k": P}, seed=2
        ),
        llama_seed(folder / "wide-ff.gguf", n_ff=2048, variants={"ffn_gate": P}, z={"ffn_down": 0.0}, seed=3),
        llama_seed(
            folder / "odd-k.gguf",
            n_embd=384,
            n_ff=640,
            n_vocab=48,
            bitcos_output=True,
            variants={"attn_output": P, "ffn_gate": P},
            seed=4,
        ),
        gemma4_seed(folder / "gemma4-lazy.gguf"),
        llama_seed(folder / "align4.gguf", alignment=4, variants={"attn_q": P, "ffn_up": P}, seed=11),
        llama_seed(folder / "moe-align8.gguf", n_expert=4, alignment=8, variants={"ffn_up_exps": P}, seed=12),
        llama_seed(
            folder / "v2-dense.gguf",
            n_embd=256,
            n_ff=512,
            default=B2,
            variants={"attn_q": M, "attn_k": R, "attn_v": B1, "ffn_up": R, "ffn_down": M},
            z={"attn_k": 1.0, "attn_v": 0.0, "ffn_gate": 0.95},
            seed=21,
        ),
        llama_seed(
            folder / "v2-odd-k.gguf",
            n_embd=160,
            n_ff=224,
            n_vocab=40,
            default=M,
            variants={"attn_k": R, "ffn_down": R, "ffn_up": R},
            seed=22,
        ),
        llama_seed(
            folder / "v2-moe.gguf",
            n_expert=4,
            default=R,
            variants={"ffn_up_exps": B1, "ffn_down_exps": M, "attn_q": B1},
            seed=23,
        ),
        llama_seed(
            folder / "v2-mixed-v1.gguf",
            n_ff=2048,
            default=M,
            variants={"attn_q": G, "attn_v": P, "ffn_down": B2},
            z={"ffn_down": 0.0},
            seed=24,
        ),
        llama_seed(folder / "v2-align4.gguf", alignment=4, default=R, variants={"attn_q": B1, "ffn_up": M}, seed=25),
        llama_seed(folder / "align2.gguf", alignment=2, variants={"attn_q": P, "ffn_up": P}, seed=14),
        llama_seed(folder / "v2-align1.gguf", alignment=1, default=R, variants={"attn_q": B1, "ffn_up": M}, seed=15),
    ]


def split_seed(folder: Path, corrupt: bool = False) -> Path:
    """A 2-shard llama (llama.cpp's split files, <prefix>-0000N-of-00002.gguf): weights and KV in the first
    shard, every companion in the second, so that weight and companion come from different files (and
    mmaps). corrupt: one companion's row index broken (must be refused). Returns the first shard."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = llama_seed(folder / "split-src.gguf", variants={"attn_q": Variant.PT, "ffn_down": Variant.PT}, seed=13)
    from gguf_tools import open_gguf
    from gguf_tools.reader import field_value, tensor_bytes, tensor_ggml_shape

    r = open_gguf(tmp)
    kv = []
    for key, fld in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value, vtype, sub = field_value(fld)
        kv.append((key, (value, sub) if vtype == GGUFValueType.ARRAY else value, vtype))
    tensors = [(t.name, t.tensor_type, tensor_ggml_shape(t), tensor_bytes(t).copy()) for t in r.tensors]
    if corrupt:
        name, tt, ne, data = next(x for x in tensors if x[0].endswith(COMPANION_SUFFIX))
        hdr = codec.parse_header(data.view(np.uint8))
        data.view(np.uint8)[hdr.row_delta_offset + 2] ^= 1  # row 1's delta
    tag = "split-bad" if corrupt else "split"
    shards = [
        [t for t in tensors if not t[0].endswith(COMPANION_SUFFIX)],
        [t for t in tensors if t[0].endswith(COMPANION_SUFFIX)],
    ]
    paths = []
    for i, part in enumerate(shards):
        split_kv = [
            ("split.no", i, GGUFValueType.UINT16),
            ("split.count", 2, GGUFValueType.UINT16),
            ("split.tensors.count", len(tensors), GGUFValueType.INT32),
        ]
        paths.append(
            _write(
                folder / f"{tag}-{i + 1:05d}-of-00002.gguf",
                (kv if i == 0 else []) + split_kv,
                [(n, tt, ne, d.view(np.int8) if tt == T.I8 else d) for n, tt, ne, d in part],
            )
        )
    tmp.unlink()
    return paths[0]


def rewrite_seed(
    src: Path,
    dst: Path,
    *,
    retype: dict[str, T] | None = None,
    kv: dict[str, tuple] | None = None,
    shape: dict[str, tuple[int, ...]] | None = None,
    alignment: int | None = None,
    add: dict[str, tuple[int, ...]] | None = None,
) -> Path:
    """A seed written again with some F32 tensors as another type (`retype`: name -> type; the values
    converted or quantized with gguf-py, integers rounded, Q8_1 / Q8_K the F32 bytes) and some KV values changed (`kv`: key -> (value,
    GGUFValueType)), some tensors with another shape (`shape`: name -> ne; their first bytes kept, so no more
    elements than before); `alignment`: general.alignment; `add`: new F32 tensors of ones (name -> ne), which
    `retype` may retype too. The regression inputs of docs/FUZZING.md's findings
    are made this way, so each differs from its seed in exactly what the finding names."""
    from gguf import quants
    from gguf_tools import open_gguf
    from gguf_tools.reader import field_value, tensor_bytes, tensor_ggml_shape

    retype, kv, shape = retype or {}, kv or {}, shape or {}
    r = open_gguf(src)
    arch = field_value(r.fields["general.architecture"])[0]
    pairs = []
    for key, fld in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment", KEY_FORMAT_VERSION):
            continue
        value, vtype, sub = field_value(fld)
        value, vtype = kv.get(key, ((value, sub) if vtype == GGUFValueType.ARRAY else value, vtype))
        pairs.append((key, value, vtype))
    tensors = []
    items = [(t.name, tensor_ggml_shape(t), tensor_bytes(t).copy(), t.tensor_type, t.shape) for t in r.tensors]
    items += [(name, ne, np.ones(int(np.prod(ne)), np.float32), T.F32, ne) for name, ne in (add or {}).items()]
    for name, ne, data, tt, t_shape in items:
        if name in retype:
            assert tt == T.F32, name
            values, tt = data.view(np.float32).reshape(tuple(reversed(ne))), retype[name]
            if tt in (T.I8, T.I16, T.I32, T.I64, T.F64):
                dtype = {T.I8: np.int8, T.I16: np.int16, T.I32: np.int32, T.I64: np.int64, T.F64: np.float64}[tt]
                data = (values if tt == T.F64 else np.rint(values * 4)).astype(dtype)
            elif tt == T.Q1_0:  # no quantizer in gguf-py: per 128 weights an fp16 scale (mean |x|), sign bits
                blocks = values.reshape(-1, 128)
                d = np.abs(blocks).mean(axis=1).astype(np.float16).view(np.uint8).reshape(-1, 2)
                bits = np.packbits(blocks >= 0, axis=1, bitorder="little")
                data = np.concatenate([d, bits], axis=1).reshape(-1)
            elif tt in (T.Q8_1, T.Q8_K):  # no quantizer in gguf-py (activation types): the F32 bytes
                block, size = quants.GGML_QUANT_SIZES[tt]
                n = values.size // block * size
                data = np.frombuffer(values.tobytes()[:n].ljust(n, b"\0"), np.uint8).copy()
            else:
                data = quants.quantize(values, tt)
        if name in shape:
            ne = shape[name]
            data = data.reshape(-1).view(np.uint8)[: data.nbytes * int(np.prod(ne)) // int(np.prod(t_shape))]
            data = data.view(np.int8) if tt == T.I8 else data
        tensors.append((name, tt, ne, data.view(np.int8) if tt == T.I8 else data))
    if alignment is None and "general.alignment" in r.fields:
        alignment = int(field_value(r.fields["general.alignment"])[0])
    return _write(dst, pairs, tensors, arch=arch, alignment=alignment)


# The inputs of the loader fuzzer's findings 9 to 14 in upstream llama.cpp / ggml (docs/FUZZING.md §4), each
# an abort, crash or hang at the first decode, or (ubsan-*) a UBSan report, until the patch series refused or
# fixed it; kept in fuzz-regressions/ and made by `tests/fuzzing.py findings`: name -> (seed of make_seeds, or
# bitcos-output: a llama with a BITCOS output matrix, so token_embd serves GET_ROWS alone; tensors retyped; KV
# values; optionally tensor shapes and tensors added).
FINDING_INPUTS = {
    "rms-epsilon-negative": ("dense-mixed", {}, {"llama.attention.layer_norm_rms_epsilon": (-1e-5, F32)}),
    "norm-weight-f16": ("dense-mixed", {"blk.0.attn_norm.weight": T.F16}, {}),
    "token-embd-i8-get-rows": ("bitcos-output", {"token_embd.weight": T.I8}, {}),
    "token-embd-q8-1-get-rows": ("bitcos-output", {"token_embd.weight": T.Q8_1}, {}),
    "per-layer-token-embd-i32": ("gemma4-lazy", {"per_layer_token_embd.weight": T.I32}, {}),
    "ffn-gate-inp-f64": ("moe", {"blk.0.ffn_gate_inp.weight": T.F64}, {}),
    "rope-dims-odd": ("gemma4-lazy", {}, {"gemma4.rope.dimension_count": (63, U32)}),
    "rope-dims-zero": ("gemma4-lazy", {}, {"gemma4.rope.dimension_count": (0, U32)}),
    "ubsan-q1-0-misaligned-load": ("dense-mixed", {"token_embd.weight": T.Q1_0}, {}),
    "ubsan-empty-companion-direct-io": ("dense-mixed", {}, {}, {"blk.0.ffn_down.weight.bitcos": (0,)}),
    # not found by the fuzzer (its seeds have no rope_freqs): ggml_rope_ext asserts F32 frequency factors when the
    # loader builds the op to ask the devices
    "rope-freqs-f16": ("dense-mixed", {"rope_freqs.weight": T.F16}, {}, {}, {"rope_freqs.weight": (32,)}),
}


def write_finding_inputs(folder: Path) -> list[Path]:
    """The inputs of FINDING_INPUTS, each its seed with exactly the finding's change."""
    import tempfile

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        seeds = {p.stem: p for p in make_seeds(Path(tmp))}
        seeds["bitcos-output"] = llama_seed(Path(tmp) / "bitcos-output.gguf", bitcos_output=True, seed=4)
        return [
            rewrite_seed(
                seeds[seed],
                folder / f"{name}.gguf",
                retype=retype,
                kv=kv,
                shape=rest[0] if rest else None,
                add=rest[1] if len(rest) > 1 else None,
            )
            for name, (seed, retype, kv, *rest) in FINDING_INPUTS.items()
        ]


def make_refused_seeds(folder: Path) -> list[Path]:
    """Seeds the loader must refuse as they are (BITCOS where the model does not use MUL_MAT): a BITCOS
    token_embd (GET_ROWS), a 1-D BITCOS output_norm, and gemma4's lazily read per_layer_token_embd as BITCOS.
    Mutations of them explore the paths around the use checks; the driver takes them as refused=PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    return [
        llama_seed(folder / "refused-token-embd.gguf", bitcos_on=("token_embd",), seed=6),
        llama_seed(folder / "refused-norm.gguf", bitcos_on=("output_norm",), seed=7),
        gemma4_seed(folder / "refused-gemma4-ple.gguf", seed=8, bitcos_ple=True),
    ]


# --- building ----------------------------------------------------------------------------------------------


def _cc() -> str | None:
    return shutil.which("gcc") or shutil.which("cc")


# The kernel manifest (csrc/bitcos-kernels.json): which kernel files an architecture has and the target flags
# each is compiled with, as the harness library's CMakeLists.txt reads them.
KERNELS = kernel_manifest.load()


def variant_build_sources(arch: str) -> list[str]:
    """The files of csrc/ a ggml-cpu variant of `arch` compiles, all with the variant's flags (the ggml-cpu patch
    globs bitcos-kernels-*.c): every kernel file of the manifest (its codes kernel's too) that is for any
    architecture or for `arch`, and the kernel table."""
    files = [s for k in KERNELS.kernels if k.baseline or k.arch == arch for s in k.sources]
    return [*dict.fromkeys(files), "bitcos-kernels-table.c"]


def sanitizers_work(cc: str, folder: Path) -> bool:
    src = folder / "san.c"
    src.write_text("int main(void) { return 0; }\n")
    r = subprocess.run([cc, *SAN_FLAGS, str(src), "-o", str(folder / "san")], capture_output=True)
    return r.returncode == 0 and subprocess.run([str(folder / "san")], capture_output=True).returncode == 0


# Cross builds of the kernel fuzzer: architecture -> (C compiler, how to run its programs here on a CPU with
# every extension of its kernels), from the manifest's `cross`
CROSS_TARGETS = {a.name: (a.cross.cc, a.cross.run_command()) for a in KERNELS.arches.values() if a.cross is not None}


def build_kernel_program(
    folder: Path, program: Path, fma: int = 1, sanitize: bool = True, target: str | None = None, opt: str = "-O1"
) -> Path:
    """Compiles the C program `program` (tests/c/) with the kernel table and the manifest's kernels as the
    harness library builds them: those of arch "any" with the baseline flags, each of the architecture's with
    its own target flags; ASan+UBSan when `sanitize` and the compiler has them. `target` (a key of
    CROSS_TARGETS): cross-compile for that architecture instead (no sanitizers; run the program with the
    target's runner)."""
    cc = CROSS_TARGETS[target][0] if target else _cc()
    if cc is None or shutil.which(cc) is None:
        raise RuntimeError(f"no C compiler{f' for {target}' if target else ''}")
    folder.mkdir(parents=True, exist_ok=True)
    base = ["-std=c11", opt, "-g", "-ffp-contract=off", "-Wall", "-Wextra", f"-DBITCOS_FMA={fma}", "-I", str(CSRC)]
    if sanitize:
        base += SAN_FLAGS + ["-fno-sanitize-recover=all"]
    objs = []

    def obj(src: Path, name: str, flags: list[str]) -> None:
        o = folder / f"{name}.o"
        r = subprocess.run([cc, *base, *flags, "-c", str(src), "-o", str(o)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"compiling {src.name} ({name}) failed:\n{r.stderr[-3000:]}")
        objs.append(str(o))

    for k in KERNELS.baseline_kernels:
        for n, src in enumerate(k.sources):
            obj(CSRC / src, f"{k.ident}-{n}", [])
    arch = KERNELS.arch_of_machine(target or os.uname().machine)
    for k in KERNELS.kernels_of(arch) if arch else ():
        for n, src in enumerate(k.sources):
            obj(CSRC / src, f"{k.ident}-{n}", list(k.flags))
    if arch and KERNELS.kernels_of(arch):
        base.append("-DBITCOS_KERNELS_PER_FILE_FLAGS=1")
    obj(CSRC / "bitcos-kernels-table.c", "table", [])
    exe = folder / f"{program.stem}-fma{fma}"
    r = subprocess.run([cc, *base, str(program), *objs, "-lm", "-o", str(exe)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"linking {program.name} failed:\n{r.stderr[-3000:]}")
    return exe


def build_kernel_fuzzer(folder: Path, fma: int = 1, sanitize: bool = True, target: str | None = None) -> Path:
    """tests/c/fuzz-bitcos-kernels.c with every kernel of the architecture (build_kernel_program)."""
    return build_kernel_program(folder, CTESTS / "fuzz-bitcos-kernels.c", fma, sanitize, target)


def installed_llama_lib() -> Path | None:
    """llama_cpp/lib of the installed patched llama-cpp-python (found without importing it)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    lib = Path(spec.origin).parent / "lib"
    return lib if (lib / "libllama.so").is_file() else None


def llama_include_dirs(asan: bool = False) -> list[Path]:
    """llama.h / ggml.h of the patched tree the library was built from: the main build cache's for the
    installed library, the ASan build's own tree for the ASan library (each falls back to the other)."""
    from ggml_bitcos import upstream

    tops = [upstream.cache_dir() / "src", ASAN_DIR / "src"]
    for top in reversed(tops) if asan else tops:
        tree = top / upstream.SDIST_TOPDIR / "vendor" / "llama.cpp"
        if (tree / "include" / "llama.h").is_file():
            return [tree / "include", tree / "ggml" / "include"]
    raise RuntimeError("no patched llama.cpp tree: run scripts/install.sh (or `tests/fuzzing.py asan-build`)")


def build_loader_fuzzer(folder: Path, lib_dir: Path, sanitize: bool) -> Path:
    """Compiles tests/c/fuzz-bitcos-loader.c against libllama in lib_dir (rpath set)."""
    cc = _cc()
    if cc is None:
        raise RuntimeError("no C compiler")
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / ("fuzz-bitcos-loader-asan" if sanitize else "fuzz-bitcos-loader")
    inc = [x for d in llama_include_dirs(asan=sanitize) for x in ("-I", str(d))]
    cmd = [
        cc,
        "-std=gnu11",
        "-O1",
        "-g",
        "-Wall",
        "-Wextra",
        *inc,
        *(SAN_FLAGS if sanitize else []),
        str(CTESTS / "fuzz-bitcos-loader.c"),
        "-L",
        str(lib_dir),
        f"-Wl,-rpath,{lib_dir}",
        "-lllama",
        "-lggml",
        "-lggml-base",
        "-o",
        str(exe),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"compiling the loader fuzzer failed:\n{shlex.join(cmd)}\n{r.stderr[-3000:]}")
    return exe


def asan_lib_dir() -> Path:
    return ASAN_DIR / "build" / "bin"


def asan_build(jobs: int = 2) -> Path:
    """Patched llama.cpp (libllama, ggml-base, ggml-cpu; no tools) with -fsanitize=address,undefined, in its
    own build directory (ASAN_DIR, default ~/.cache/ggml-bitcos-asan), niced; incremental. Returns the
    directory holding libllama.so."""
    from ggml_bitcos import build

    tree = build.prepare_tree(ASAN_DIR)
    bdir = ASAN_DIR / "build"
    san = " ".join(SAN_FLAGS)
    launcher = (
        ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"] if shutil.which("ccache") else []
    )
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cfg = [
        "cmake",
        "-S",
        str(tree / "vendor" / "llama.cpp"),
        "-B",
        str(bdir),
        *gen,
        "-DCMAKE_BUILD_TYPE=Release",
        "-DCMAKE_C_FLAGS_RELEASE=-O1 -g1 -DNDEBUG",
        "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -g1 -DNDEBUG",
        f"-DCMAKE_C_FLAGS={san}",
        f"-DCMAKE_CXX_FLAGS={san}",
        "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined",
        "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined",
        "-DBUILD_SHARED_LIBS=ON",
        "-DGGML_NATIVE=ON",
        "-DLLAMA_BUILD_TOOLS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_COMMON=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        *launcher,
    ]
    nice = ["nice", "-n", "10"] if shutil.which("nice") else []
    subprocess.run([*nice, *cfg], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([*nice, "cmake", "--build", str(bdir), "--target", "llama", "-j", str(jobs)], check=True)
    return asan_lib_dir()


def ubsan_suppressions() -> Path:
    """UBSAN_SUPPRESSIONS copied to the temp folder (a path without spaces, which UBSAN_OPTIONS cannot quote)."""
    import tempfile

    text = UBSAN_SUPPRESSIONS.read_text()
    path = Path(tempfile.gettempdir()) / f"ggml-bitcos-fuzz-ubsan-{os.getuid()}.supp"
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def sanitizer_env() -> dict[str, str]:
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = ASAN_OPTIONS
    env["UBSAN_OPTIONS"] = f"{UBSAN_OPTIONS}:suppressions={ubsan_suppressions()}"
    env["GGML_NO_BACKTRACE"] = "1"  # ggml_abort would otherwise attach gdb for a backtrace
    return env


def seed_args(seeds: list[Path], refused: list[Path] = ()) -> list[str]:
    return [*map(str, seeds), *(f"refused={p}" for p in refused)]


def run_loader(
    exe: Path,
    seeds: list[Path],
    *,
    cases: int,
    seed: int = 1,
    first: int = 0,
    out: Path,
    decode: int = 4,
    timeout: float | None = None,
    extra: list[str] | None = None,
    refused: list[Path] = (),
) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(exe),
        "--seed",
        str(seed),
        "--first",
        str(first),
        "--cases",
        str(cases),
        "--decode",
        str(decode),
        "--out",
        str(out),
        *(extra or []),
        *seed_args(seeds, refused),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=sanitizer_env())


# --- command line (long runs) -----------------------------------------------------------------------------


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kernels", help="kernel fuzzer (generic/AVX2/AVX-512, guard pages, ASan+UBSan)")
    k.add_argument("--cases", type=int, default=100000)
    k.add_argument("--seed", type=int, default=7)
    k.add_argument("--fma", type=int, choices=(0, 1), default=1)
    k.add_argument("--front", action="store_true", help="guard pages before the buffers instead of after")
    k.add_argument("--no-sanitize", action="store_true")
    sub.add_parser("asan-build", help="build the patched libllama with ASan+UBSan (own build dir, niced)")
    fi = sub.add_parser("findings", help="write the inputs of findings 9 to 14 (FINDING_INPUTS)")
    fi.add_argument("folder", type=Path, nargs="?", default=REGRESSIONS)
    lo = sub.add_parser("loader", help="loader fuzzer: mutated BITCOS GGUF files through llama_model_load_from_file")
    lo.add_argument("--cases", type=int, default=100000)
    lo.add_argument("--seed", type=int, default=1)
    lo.add_argument("--first", type=int, default=0)
    lo.add_argument("--decode", type=int, default=4, help="decode with every N-th accepted model (0: never)")
    lo.add_argument("--asan", action="store_true", help="use the ASan+UBSan build (asan-build first)")
    lo.add_argument(
        "--no-extra-bufts",
        action="store_true",
        help="never the extra buffer types (long ASan runs: docs/FUZZING.md §4)",
    )
    lo.add_argument("--work", type=Path, default=Path("/tmp/ggml-bitcos-fuzz"))
    a = ap.parse_args(argv)
    if a.cmd == "kernels":
        exe = build_kernel_fuzzer(Path("/tmp/ggml-bitcos-fuzz/kernels"), a.fma, not a.no_sanitize)
        cmd = [str(exe), "--seed", str(a.seed), "--cases", str(a.cases), *(["--front"] if a.front else [])]
        return subprocess.run(cmd, env=sanitizer_env()).returncode
    if a.cmd == "asan-build":
        print(asan_build())
        return 0
    if a.cmd == "findings":
        for p in write_finding_inputs(a.folder):
            print(p)
        return 0
    lib = asan_lib_dir() if a.asan else installed_llama_lib()
    if lib is None or not (lib / "libllama.so").is_file():
        print("no libllama.so: run `tests/fuzzing.py asan-build` (--asan) or scripts/install.sh", file=sys.stderr)
        return 2
    exe = build_loader_fuzzer(a.work, lib, a.asan)
    seeds = make_seeds(a.work / "seeds")
    refused = make_refused_seeds(a.work / "seeds")
    cmd = [
        str(exe),
        "--seed",
        str(a.seed),
        "--first",
        str(a.first),
        "--cases",
        str(a.cases),
        "--decode",
        str(a.decode),
        "--out",
        str(a.work / "crashes"),
        "--progress",
        "10000",
        *(["--no-extra-bufts"] if a.no_extra_bufts else []),
        *seed_args(seeds, refused),
    ]
    (a.work / "crashes").mkdir(parents=True, exist_ok=True)
    print(shlex.join(cmd), flush=True)
    t0 = time.monotonic()
    rc = subprocess.run(cmd, env=sanitizer_env()).returncode
    print(f"exit {rc} after {time.monotonic() - t0:.0f} s", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(_main())
