"""Crafted GGUF files for the loader-refusal tests (tests/test_refusals.py): tiny models of a few
architectures whose chosen tensors are stored as BITCOS (with an encoder-made companion), optionally with
corrupted scales. Not a test module itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFValueType
from gguf.constants import GGMLQuantizationType as T

from ggml_bitcos import codec
from ggml_bitcos.format import COMPANION_SUFFIX, Variant
from gguf_tools import GGUFStreamWriter, bitcos_type

U32, F32, BOOL, STR = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.BOOL, GGUFValueType.STRING


def _ternary(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    return rng.choice(np.array([-1, 0, 1], np.int8), size=(rows, k), p=[0.3, 0.4, 0.3])


def bitcos_pair(
    name: str, ne: tuple[int, ...], variant: Variant, rng: np.random.Generator, scale: float | None = None
) -> list[tuple[str, object, tuple[int, ...], np.ndarray]]:
    """The weight and companion tensors (name, ggml type, ggml shape, data) of a random ternary BITCOS
    weight of ggml shape ne; `scale`: the value of every scale (any float32, stored as given: the encoder
    would refuse invalid ones, so this writes past it)."""
    k, rows = ne[0], int(np.prod(ne[1:]))
    n_mats = codec.n_mats_of(ne)
    codes = _ternary(rng, rows, k)
    good = 0.05
    sb = variant.scale_block
    if variant == Variant.G128:
        enc = codec.encode(codes, variant, block_scales=np.full((rows, k // sb), good, np.float16))
        if scale is not None:
            blk = enc.blocks.reshape(rows, k // sb, variant.block_bytes)
            with np.errstate(over="ignore"):  # 1e38 -> inf: a crafted value
                d16 = np.full((rows, k // sb), scale, np.float32).astype(np.float16)
            blk[:, :, 16:18] = d16.view(np.uint8).reshape(rows, k // sb, 2)
    elif sb:  # B128 / B256: fp16 scales in the companion
        enc = codec.encode(codes, variant, block_scales=np.full((rows, k // sb), good, np.float16), n_mats=n_mats)
        if scale is not None:
            o = enc.header.scales_offset
            with np.errstate(over="ignore"):
                d16 = np.full(rows * (k // sb), scale, np.float32).astype("<f2")
            enc.companion[o : o + d16.nbytes] = d16.view(np.uint8)
    else:  # PT / MATRIX: f32 per matrix; ROW: f32 per row
        n = rows if variant == Variant.ROW else n_mats
        key = "row_scales" if variant == Variant.ROW else "matrix_scales"
        enc = codec.encode(codes, variant, n_mats=n_mats, **{key: np.full(n, good, np.float32)})
        if scale is not None:
            o = enc.header.scales_offset
            enc.companion[o : o + 4 * n] = np.full(n, scale, "<f4").view(np.uint8)
    return [
        (name, bitcos_type(variant), ne, enc.blocks),
        (name + COMPANION_SUFFIX, T.I8, (enc.companion.size,), enc.companion.view(np.int8)),
    ]


def write_gguf(
    path: Path,
    arch: str,
    kv: list[tuple[str, object, GGUFValueType]],
    tensors: list[tuple[str, object, tuple[int, ...], np.ndarray]],
) -> Path:
    with GGUFStreamWriter(path, arch, overwrite=True) as w:
        w.add_kv("general.architecture", arch, STR)
        for key, value, vtype in kv:
            sub = None
            if vtype == GGUFValueType.ARRAY:
                value, sub = value  # type: ignore[misc]
            w.add_kv(key, value, vtype, sub)
        for name, ttype, ne, _data in tensors:
            w.add_tensor_info(name, ttype, ne)
        w.begin()
        for name, _ttype, _ne, data in tensors:
            w.write_tensor(name, data)
    return path


def _f32(rng: np.random.Generator, name: str, ne: tuple[int, ...], std: float = 0.05):
    return (name, T.F32, ne, rng.normal(0, std, tuple(reversed(ne))).astype(np.float32))


def _f16(rng: np.random.Generator, name: str, ne: tuple[int, ...], std: float = 0.05):
    return (name, T.F16, ne, rng.normal(0, std, tuple(reversed(ne))).astype(np.float16))


def _tokenizer() -> tuple[list[tuple[str, object, GGUFValueType]], int]:
    """A real tokenizer (llama-spm, from the pinned sdist's vocab files): the CLI tools need one."""
    from ggml_bitcos.make_model import _tokenizer_fields

    fields, n_vocab = _tokenizer_fields("llama-spm")
    return [(k, (v, sub) if vt == GGUFValueType.ARRAY else v, vt) for k, v, vt, sub in fields], n_vocab


def _tensors(
    rng: np.random.Generator, shapes: dict[str, tuple[int, ...]], bitcos: dict[str, Variant], scale: float | None
) -> list:
    out = []
    for name, ne in shapes.items():
        if name in bitcos:
            out += bitcos_pair(name, ne, bitcos[name], rng, scale)
        elif len(ne) == 1:
            out.append(_ones(name, ne[0]))
        elif ne[1] > 1024:  # vocab-sized: F16 keeps the file small
            out.append(_f16(rng, name, ne, 1.0 if "token_embd" in name else 0.05))
        else:
            out.append(_f32(rng, name, ne, 1.0 if "token_embd" in name else 0.05))
    return out


def _ones(name: str, n: int):
    return (name, T.F32, (n,), np.ones(n, np.float32))


N_EMBD, N_FF, N_HEAD, HEAD_DIM = 128, 256, 2, 64


def llama_model(
    path: Path,
    bitcos: dict[str, Variant],
    scale: float | None = None,
    seed: int = 0,
    tokenizer: bool = True,
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> Path:
    """A 1-layer llama model; tensors named in `bitcos` (e.g. {"blk.0.attn_q.weight": Variant.PT}) are
    BITCOS, each with every scale set to `scale` when given. tokenizer=False: no tokenizer and 64 tokens
    (0.5 MB; enough for Llama(), not for the CLI tools). `shapes`: ggml shapes that replace the architecture's
    (crafted wrong-shaped tensors)."""
    rng = np.random.default_rng(seed)
    tok, n_vocab = _tokenizer() if tokenizer else ([("tokenizer.ggml.model", "none", STR)], 64)
    a = "llama"
    kv = [
        (f"{a}.context_length", 256, U32),
        (f"{a}.embedding_length", N_EMBD, U32),
        (f"{a}.block_count", 1, U32),
        (f"{a}.feed_forward_length", N_FF, U32),
        (f"{a}.attention.head_count", N_HEAD, U32),
        (f"{a}.attention.head_count_kv", N_HEAD, U32),
        (f"{a}.rope.dimension_count", HEAD_DIM, U32),
        (f"{a}.attention.layer_norm_rms_epsilon", 1e-5, F32),
        (f"{a}.vocab_size", n_vocab, U32),
        *tok,
    ]
    override = shapes
    shapes = {
        "token_embd.weight": (N_EMBD, n_vocab),
        "output.weight": (N_EMBD, n_vocab),
        "blk.0.attn_q.weight": (N_EMBD, N_EMBD),
        "blk.0.attn_k.weight": (N_EMBD, N_EMBD),
        "blk.0.attn_v.weight": (N_EMBD, N_EMBD),
        "blk.0.attn_output.weight": (N_EMBD, N_EMBD),
        "blk.0.ffn_gate.weight": (N_EMBD, N_FF),
        "blk.0.ffn_up.weight": (N_EMBD, N_FF),
        "blk.0.ffn_down.weight": (N_FF, N_EMBD),
        "output_norm.weight": (N_EMBD,),
        "blk.0.attn_norm.weight": (N_EMBD,),
        "blk.0.ffn_norm.weight": (N_EMBD,),
        **(override or {}),
    }
    return write_gguf(path, a, kv, _tensors(rng, shapes, bitcos, scale))


def gemma4_model(path: Path, bitcos: dict[str, Variant], seed: int = 0) -> Path:
    """A 1-layer gemma4 model with per-layer embeddings (per_layer_token_embd is read lazily with
    `--lazy-mode on`); tensors named in `bitcos` are BITCOS."""
    rng = np.random.default_rng(seed)
    tok, n_vocab = _tokenizer()
    a = "gemma4"
    n_layer = 2  # gemma4 needs >= 2 layers with a KV cache
    pl = 64  # per-layer embedding width
    ple = pl * n_layer  # 128: BITCOS can hold per_layer_token_embd
    kv = [
        (f"{a}.context_length", 256, U32),
        (f"{a}.embedding_length", N_EMBD, U32),
        (f"{a}.block_count", n_layer, U32),
        (f"{a}.feed_forward_length", N_FF, U32),
        (f"{a}.attention.head_count", N_HEAD, U32),
        (f"{a}.attention.head_count_kv", N_HEAD, U32),
        (f"{a}.attention.key_length", HEAD_DIM, U32),
        (f"{a}.attention.value_length", HEAD_DIM, U32),
        (f"{a}.attention.key_length_swa", HEAD_DIM, U32),
        (f"{a}.attention.value_length_swa", HEAD_DIM, U32),
        (f"{a}.rope.dimension_count", HEAD_DIM, U32),
        (f"{a}.attention.layer_norm_rms_epsilon", 1e-6, F32),
        (f"{a}.attention.sliding_window", 64, U32),
        (f"{a}.attention.sliding_window_pattern", ([True] * n_layer, BOOL), GGUFValueType.ARRAY),
        (f"{a}.embedding_length_per_layer_input", pl, U32),
        (f"{a}.vocab_size", n_vocab, U32),
        *tok,
    ]
    shapes = {
        "token_embd.weight": (N_EMBD, n_vocab),
        "per_layer_token_embd.weight": (ple, n_vocab),
        "per_layer_model_proj.weight": (N_EMBD, ple),
        "per_layer_proj_norm.weight": (pl,),
        "output_norm.weight": (N_EMBD,),
    }
    for i in range(n_layer):
        shapes.update(
            {
                f"blk.{i}.attn_norm.weight": (N_EMBD,),
                f"blk.{i}.attn_q.weight": (N_EMBD, N_EMBD),
                f"blk.{i}.attn_k.weight": (N_EMBD, N_EMBD),
                f"blk.{i}.attn_v.weight": (N_EMBD, N_EMBD),
                f"blk.{i}.attn_output.weight": (N_EMBD, N_EMBD),
                f"blk.{i}.attn_q_norm.weight": (HEAD_DIM,),
                f"blk.{i}.attn_k_norm.weight": (HEAD_DIM,),
                f"blk.{i}.post_attention_norm.weight": (N_EMBD,),
                f"blk.{i}.ffn_norm.weight": (N_EMBD,),
                f"blk.{i}.ffn_gate.weight": (N_EMBD, N_FF),
                f"blk.{i}.ffn_up.weight": (N_EMBD, N_FF),
                f"blk.{i}.ffn_down.weight": (N_FF, N_EMBD),
                f"blk.{i}.post_ffw_norm.weight": (N_EMBD,),
                f"blk.{i}.inp_gate.weight": (N_EMBD, pl),
                f"blk.{i}.proj.weight": (pl, N_EMBD),
                f"blk.{i}.post_norm.weight": (N_EMBD,),
            }
        )
    return write_gguf(path, a, kv, _tensors(rng, shapes, bitcos, None))
