"""Synthetic ternary llama-architecture GGUF models (``ggml-bitcos make-model``).

The model is a valid llama.cpp ``llama`` model with a real tokenizer (the ``tokenizer.*`` keys and
arrays of an upstream vocab-only GGUF), random weights drawn so activations stay O(1):

* the 7 projection matrices of every layer (attn q/k/v/output, ffn gate/up/down; MoE: the three 3-D
  ``ffn_*_exps`` tensors) are ternary, zero density ``z``, codes t with P(0) = z, P(+1) = P(-1) = (1-z)/2,
  and scale ~ 1/sqrt(K (1 - z)) so each output has unit variance for unit-variance inputs (every
  matmul in llama follows an RMS norm); ``--scale tensor`` uses one scale per matrix (BitNet-style),
  ``--scale row`` one per output row (TriLM / ParetoQ-style), ``--scale g128`` a different scale per 128
  weights (per 256 for TQ1_0/TQ2_0, their native group; per row where K is no multiple of the group);
* token_embd / output: F16 or Q8_0, N(0, 1) embeddings, output rows scaled so logits are O(3);
* norms F32 ones; MoE router ``ffn_gate_inp`` F32.

Everything is deterministic given the seed (each tensor has its own stream, seeded by (seed, name)).
"""

from __future__ import annotations

import argparse
import errno
import functools
import math
import time
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGUFValueType
from gguf.constants import GGMLQuantizationType, LlamaFileType
from tqdm import tqdm

from gguf_tools import GGUFStreamWriter, field_value, open_gguf

from . import codec, tq
from .format import QK, QK_K
from .ternary import random_codes

SOURCE_TYPES = {
    "tq2_0": GGMLQuantizationType.TQ2_0,
    "tq1_0": GGMLQuantizationType.TQ1_0,
    "f16": GGMLQuantizationType.F16,
}
EMBD_TYPES = {"f16": GGMLQuantizationType.F16, "q8_0": GGMLQuantizationType.Q8_0}
FILE_TYPES = {"tq2_0": LlamaFileType.MOSTLY_TQ2_0, "tq1_0": LlamaFileType.MOSTLY_TQ1_0, "f16": LlamaFileType.MOSTLY_F16}


@dataclass(frozen=True)
class ModelShape:
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ctx: int
    vocab: str  # upstream vocab name for ggml_bitcos.upstream.vocab_gguf
    embd_type: str = "f16"
    n_expert: int = 0
    n_expert_used: int = 0
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


PRESETS: dict[str, ModelShape] = {
    # small enough for tests: hidden and ffn multiples of 256 so TQ1_0/TQ2_0 apply everywhere
    "tiny": ModelShape(n_embd=256, n_ff=768, n_layer=2, n_head=4, n_head_kv=2, n_ctx=512, vocab="llama-spm"),
    # SmolLM2-135M's widths (hidden 576 = 4.5 x 128, ffn 1536): rows that only version 2 stores (K % 32);
    # F16 ternary matrices (TQ1_0/TQ2_0 need K % 256), 3 layers
    "smol": ModelShape(n_embd=576, n_ff=1536, n_layer=3, n_head=9, n_head_kv=3, n_ctx=512, vocab="llama-spm"),
    # BitNet b1.58 2B4T's shape
    "bitnet-2b": ModelShape(
        n_embd=2560,
        n_ff=6912,
        n_layer=30,
        n_head=20,
        n_head_kv=5,
        n_ctx=4096,
        vocab="llama-bpe",
        embd_type="q8_0",
        rope_freq_base=500000.0,
    ),
}


@dataclass
class TensorPlan:
    name: str
    ggml_type: GGMLQuantizationType
    ne: tuple[int, ...]  # ggml order
    make: Callable[[], np.ndarray]  # produces the data (bytes or typed array)
    ternary: bool = False


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _base_scale(k: int, z: float) -> float:
    return 1.0 / math.sqrt(k * max(1.0 - z, 1.0 / k))


def ternary_tensor(
    rng: np.random.Generator, ne: tuple[int, ...], z: float, scale_mode: str, src_type: str
) -> tuple[GGMLQuantizationType, np.ndarray]:
    """(ggml type, data) of one ternary weight with ggml shape ne = (K, N[, E])."""
    k = ne[0]
    n_mats = codec.n_mats_of(ne)
    rows = math.prod(ne[1:])
    codes = random_codes(rng, (rows, k), z)
    base = _base_scale(k, z)
    use_tq = src_type in ("tq2_0", "tq1_0") and k % QK_K == 0
    group = QK_K if use_tq else QK  # scale group for g128 mode
    if k % group:
        group = k  # odd row length: one scale per row
    if scale_mode == "tensor":
        per_mat = (base * rng.uniform(0.8, 1.2, n_mats)).astype(np.float16)
        d = np.repeat(per_mat, rows // n_mats)[:, None].repeat(k // group, axis=1)
    elif scale_mode == "row":
        d = (base * rng.uniform(0.75, 1.25, rows)).astype(np.float16)[:, None].repeat(k // group, axis=1)
    elif scale_mode == "g128":
        d = (base * rng.uniform(0.75, 1.25, (rows, k // group))).astype(np.float16)
    else:
        raise ValueError(f"unknown scale mode {scale_mode}")
    if use_tq:
        enc = tq.tq2_0_encode if src_type == "tq2_0" else tq.tq1_0_encode
        return SOURCE_TYPES[src_type], enc(codes, d)
    # F16 holding ternary values: fp16(d) * t is exact in fp16
    x = (codes.reshape(rows, k // group, group).astype(np.float16) * d[:, :, None]).reshape(rows, k)
    return GGMLQuantizationType.F16, x


def _q8_0_random(rng: np.random.Generator, rows: int, k: int, std: float) -> np.ndarray:
    """Q8_0 data (34-byte blocks: fp16 d, int8 qs[32]) with uniform qs: fast, no float detour."""
    nb = k // 32
    qs = np.frombuffer(rng.bytes(rows * k), dtype=np.int8).reshape(rows, nb, 32)
    qs = np.maximum(qs, np.int8(-127))
    out = np.empty((rows, nb, 34), dtype=np.uint8)
    d = np.float16(std * math.sqrt(3.0) / 127.0)  # uniform[-127,127] has std 127/sqrt(3)
    out[:, :, :2] = np.frombuffer(np.array([d], dtype="<f2").tobytes(), dtype=np.uint8)
    out[:, :, 2:] = qs.view(np.uint8)
    return out.reshape(rows, nb * 34)


def _dense(rng: np.random.Generator, ne: tuple[int, int], std: float, ggml_type: GGMLQuantizationType) -> np.ndarray:
    k, rows = ne
    if ggml_type == GGMLQuantizationType.Q8_0:
        return _q8_0_random(rng, rows, k, std)
    x = rng.standard_normal((rows, k), dtype=np.float32) * np.float32(std)
    return x.astype(np.float16) if ggml_type == GGMLQuantizationType.F16 else x


def plan_tensors(
    shape: ModelShape, n_vocab: int, z: float, scale_mode: str, src_type: str, seed: int
) -> list[TensorPlan]:
    e, f, hd = shape.n_embd, shape.n_ff, shape.head_dim
    q_out, kv_out = shape.n_head * hd, shape.n_head_kv * hd
    embd_type = EMBD_TYPES[shape.embd_type]
    plans: list[TensorPlan] = []

    def dense(name: str, ne: tuple[int, int], std: float, t: GGMLQuantizationType) -> None:
        plans.append(TensorPlan(name, t, ne, lambda: _dense(_rng(seed, name), ne, std, t)))

    def norm(name: str, n: int) -> None:
        plans.append(TensorPlan(name, GGMLQuantizationType.F32, (n,), lambda: np.ones(n, dtype=np.float32)))

    def ternary(name: str, ne: tuple[int, ...]) -> None:
        k = ne[0]
        t = SOURCE_TYPES[src_type] if (src_type != "f16" and k % QK_K == 0) else GGMLQuantizationType.F16
        plans.append(
            TensorPlan(
                name, t, ne, lambda: ternary_tensor(_rng(seed, name), ne, z, scale_mode, src_type)[1], ternary=True
            )
        )

    dense("token_embd.weight", (e, n_vocab), 1.0, embd_type)
    norm("output_norm.weight", e)
    dense("output.weight", (e, n_vocab), 3.0 / math.sqrt(e), embd_type)
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", e)
        ternary(p + "attn_q.weight", (e, q_out))
        ternary(p + "attn_k.weight", (e, kv_out))
        ternary(p + "attn_v.weight", (e, kv_out))
        ternary(p + "attn_output.weight", (q_out, e))
        norm(p + "ffn_norm.weight", e)
        if shape.n_expert:
            dense(p + "ffn_gate_inp.weight", (e, shape.n_expert), 1.0 / math.sqrt(e), GGMLQuantizationType.F32)
            ternary(p + "ffn_gate_exps.weight", (e, f, shape.n_expert))
            ternary(p + "ffn_down_exps.weight", (f, e, shape.n_expert))
            ternary(p + "ffn_up_exps.weight", (e, f, shape.n_expert))
        else:
            ternary(p + "ffn_gate.weight", (e, f))
            ternary(p + "ffn_down.weight", (f, e))
            ternary(p + "ffn_up.weight", (e, f))
    return plans


@functools.lru_cache(maxsize=4)
def _tokenizer_fields(vocab: str) -> tuple[list[tuple[str, object, GGUFValueType, GGUFValueType | None]], int]:
    from .upstream import vocab_gguf

    reader = open_gguf(vocab_gguf(vocab))
    out = []
    n_vocab = 0
    for key, fld in reader.fields.items():
        if key.startswith("tokenizer."):
            value, vtype, sub = field_value(fld)
            out.append((key, value, vtype, sub))
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(value)
    if n_vocab == 0:
        raise RuntimeError(f"vocab {vocab}: no tokenizer.ggml.tokens")
    return out, n_vocab


def make_model(
    out: Path,
    shape: ModelShape,
    *,
    z: float = 0.4,
    scale_mode: str = "tensor",
    src_type: str = "tq2_0",
    seed: int = 0,
    force: bool = False,
    progress: bool = True,
) -> Path:
    if not 0.0 <= z <= 1.0:
        raise ValueError(f"zero density {z} is not in [0, 1]")
    if shape.n_embd % shape.n_head or shape.n_head % shape.n_head_kv:
        raise ValueError("n_embd must be a multiple of n_head and n_head a multiple of n_head_kv")
    if shape.n_embd % 32:
        raise ValueError("n_embd must be a multiple of 32")
    tok_fields, n_vocab = _tokenizer_fields(shape.vocab)
    plans = plan_tensors(shape, n_vocab, z, scale_mode, src_type, seed)

    w = GGUFStreamWriter(out, "llama", overwrite=force)
    try:
        arch = "llama"
        kv = w.add_kv
        kv("general.architecture", arch, GGUFValueType.STRING)
        kv("general.type", "model", GGUFValueType.STRING)
        kv("general.name", f"bitcos-synthetic-{shape.n_layer}L-{shape.n_embd}", GGUFValueType.STRING)
        kv(
            "general.description",
            f"synthetic ternary model: zero density {z}, scale {scale_mode}, "
            f"{src_type}, seed {seed} (ggml-bitcos make-model)",
            GGUFValueType.STRING,
        )
        kv("general.file_type", int(FILE_TYPES[src_type]), GGUFValueType.UINT32)
        kv("general.quantization_version", 2, GGUFValueType.UINT32)
        kv(f"{arch}.vocab_size", n_vocab, GGUFValueType.UINT32)
        kv(f"{arch}.context_length", shape.n_ctx, GGUFValueType.UINT32)
        kv(f"{arch}.embedding_length", shape.n_embd, GGUFValueType.UINT32)
        kv(f"{arch}.block_count", shape.n_layer, GGUFValueType.UINT32)
        kv(f"{arch}.feed_forward_length", shape.n_ff, GGUFValueType.UINT32)
        kv(f"{arch}.attention.head_count", shape.n_head, GGUFValueType.UINT32)
        kv(f"{arch}.attention.head_count_kv", shape.n_head_kv, GGUFValueType.UINT32)
        kv(f"{arch}.rope.dimension_count", shape.head_dim, GGUFValueType.UINT32)
        kv(f"{arch}.rope.freq_base", shape.rope_freq_base, GGUFValueType.FLOAT32)
        kv(f"{arch}.attention.layer_norm_rms_epsilon", shape.rms_eps, GGUFValueType.FLOAT32)
        if shape.n_expert:
            kv(f"{arch}.expert_count", shape.n_expert, GGUFValueType.UINT32)
            kv(f"{arch}.expert_used_count", shape.n_expert_used, GGUFValueType.UINT32)
        for key, value, vtype, sub in tok_fields:
            kv(key, value, vtype, sub)
        for p in plans:
            w.add_tensor_info(p.name, p.ggml_type, p.ne)
        w.begin()
        # disable=None: no bar when stderr is not a terminal
        with tqdm(
            total=len(plans), desc=f"make-model {out.name}", unit="tensor", disable=None if progress else True
        ) as bar:
            for p in plans:
                w.write_tensor(p.name, p.make())
                bar.update(1)
        w.finish()
    except BaseException:
        w.abort()
        raise
    return out


# --- command line --------------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "make-model",
        help="write a synthetic ternary llama GGUF with a real tokenizer",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("-o", "--output", required=True, type=Path, help="output .gguf path")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--zero-density", type=float, default=0.4, metavar="Z", help="fraction of zero weights (0..1)")
    p.add_argument(
        "--scale",
        choices=["g128", "row", "tensor"],
        default="tensor",
        help="tensor: one scale per matrix (BitNet-style); row: one per output row (TriLM-style); "
        "g128: one per 128 weights (per 256 for TQ1_0/TQ2_0)",
    )
    p.add_argument(
        "--type",
        dest="src_type",
        choices=sorted(SOURCE_TYPES),
        default="tq2_0",
        help="storage of the ternary matrices (F16 where K %% 256 != 0)",
    )
    p.add_argument("--embd-type", choices=sorted(EMBD_TYPES), help="token_embd/output type (preset default)")
    p.add_argument("--moe", type=int, default=0, metavar="N_EXPERTS", help="mixture of experts with N experts")
    p.add_argument("--experts-used", type=int, default=2, help="experts used per token (MoE)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-embd", type=int)
    p.add_argument("--n-ff", type=int)
    p.add_argument("--n-layer", type=int)
    p.add_argument("--n-head", type=int)
    p.add_argument("--n-head-kv", type=int)
    p.add_argument("--n-ctx", type=int)
    p.add_argument("--vocab", choices=["llama-spm", "llama-bpe"], help="upstream tokenizer (preset default)")
    p.add_argument("--force", action="store_true", help="overwrite the output if it exists")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def shape_from_args(args: argparse.Namespace) -> ModelShape:
    shape = PRESETS[args.preset]
    overrides = {
        k: v
        for k, v in {
            "n_embd": args.n_embd,
            "n_ff": args.n_ff,
            "n_layer": args.n_layer,
            "n_head": args.n_head,
            "n_head_kv": args.n_head_kv,
            "n_ctx": args.n_ctx,
            "vocab": args.vocab,
            "embd_type": args.embd_type,
        }.items()
        if v is not None
    }
    if args.moe:
        overrides["n_expert"] = args.moe
        overrides["n_expert_used"] = min(args.experts_used, args.moe)
    return replace(shape, **overrides)


def run(args: argparse.Namespace) -> int:
    import sys

    out: Path = args.output
    if out.exists() and not args.force:
        raise FileExistsError(errno.EEXIST, "output already exists (use --force to overwrite)", str(out))
    t0 = time.perf_counter()
    make_model(
        out,
        shape_from_args(args),
        z=args.zero_density,
        scale_mode=args.scale,
        src_type=args.src_type,
        seed=args.seed,
        force=args.force,
        progress=not args.quiet,
    )
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0
