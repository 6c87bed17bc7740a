"""``ggml-bitcos convert --to tq2_0|tq1_0|f16|bf16|f32``: BITCOS weights back to a stock ggml type, bit-exactly.

Every BITCOS weight (and its companion) becomes one tensor of the target type whose ggml dequantization equals
the BITCOS tensor's dequantized fp32 values (FORMAT.md §5) bit for bit; everything else is copied. A target
that cannot hold a tensor's values exactly (FORMAT.md §10) is an error naming the tensor and the reason,
unless ``--fallback`` names another type (or ``keep``: leave it BITCOS) for such tensors:

* TQ2_0 / TQ1_0: one fp16 scale ``d`` per 256 weights, so K must be a multiple of 256; B256 always; a G128 or
  B128 weight's two 128-halves of each 256-block must carry the same ``d`` (a half without non-zero weights
  takes the other half's; both empty: the first half's, which is what ``convert`` wrote from a TQ source, so
  TQ2_0 -> BITCOS -> TQ2_0 gives the source's bytes back); a PT / MATRIX / ROW weight's fp32 matrix (row)
  scales must be exactly fp16 values;
* F16: every value exactly an fp16 (always for the fp16 block scales G128, B128, B256; PT / MATRIX / ROW: the
  scales that multiply a non-zero weight are fp16 values);
* BF16: every value exactly a bf16 (scales with at most 8 significant bits);
* F32: always.

Three passes as in ``convert``: decide (decode each weight, check the target, nothing written), write (into a
temporary file renamed onto the target only when complete), verify (reopen, dequantize each converted tensor
with ggml's arithmetic and compare its fp32 bits with the BITCOS decode; copied tensors byte for byte).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFValueType
from gguf.constants import GGMLQuantizationType, LlamaFileType
from gguf.gguf_reader import ReaderTensor
from tqdm import tqdm

from gguf_tools import CheckedGGUFReader, field_value, open_gguf, tensor_bytes, tensor_ggml_shape, type_name

from . import codec, tq
from .format import BITCOS_TYPE_IDS, COMPANION_SUFFIX, QK, QK_K
from .rewrite import ConvertError, OutputTensor, check_paths, size_line, stale_line, verify_rewrite, write_verified
from .passes.read import check_bitcos_file, check_names_writable
from .source import source_float_rows

# target name -> (ggml type, llama file type written as general.file_type)
TARGETS: dict[str, tuple[GGMLQuantizationType, LlamaFileType]] = {
    "tq2_0": (GGMLQuantizationType.TQ2_0, LlamaFileType.MOSTLY_TQ2_0),
    "tq1_0": (GGMLQuantizationType.TQ1_0, LlamaFileType.MOSTLY_TQ1_0),
    "f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
    "bf16": (GGMLQuantizationType.BF16, LlamaFileType.MOSTLY_BF16),
    "f32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),
}
KEEP = "keep"
NEG_ZERO_BITS = np.uint32(0x80000000)


class NotRepresentable(Exception):
    """The target type cannot hold the tensor's values exactly; ``str()`` says why."""


def default_output(src: Path, to: str) -> Path:
    stem = src.stem if src.suffix == ".gguf" else src.name
    if stem.endswith("-bitcos"):
        stem = stem[: -len("-bitcos")]
    return src.with_name(f"{stem}-{to}.gguf")


@dataclass
class BackResult:
    name: str
    variant: str
    ne: tuple[int, ...]
    target: str = ""  # the type written ("keep": left BITCOS)
    reason: str = ""  # why the requested target was not possible
    src_bytes: int = 0  # weight + companion
    out_bytes: int = 0


@dataclass
class ConvertBackResult:
    src: Path
    out: Path
    to: str
    tensors: list[BackResult] = field(default_factory=list)
    verified: bool = False
    seconds: dict[str, float] = field(default_factory=dict)
    removed_stale: list[Path] = field(default_factory=list)  # temp files of killed runs removed (docs/USAGE.md §3)


def _decode(path: Path, w: ReaderTensor, comp: ReaderTensor) -> codec.Decoded:
    ne = tensor_ggml_shape(w)
    try:
        return codec.decode(
            tensor_bytes(w), tensor_bytes(comp), int(w.tensor_type), ne[0], math.prod(ne[1:]), codec.n_mats_of(ne)
        )
    except codec.FormatError as e:
        raise ConvertError(f"{path}: tensor '{w.name}': {e}") from None


def tq_scales(dec: codec.Decoded) -> np.ndarray:
    """fp16 ``d`` per 256-block (R, K/256) that reproduces ``dec``'s values in TQ1_0/TQ2_0, or NotRepresentable."""
    n_rows, k = dec.codes.shape
    if k % QK_K:
        raise NotRepresentable(f"row length {k} is not a multiple of {QK_K} (one TQ block)")
    nb = k // QK_K
    halves = QK_K // QK
    if dec.block_scales is None:  # fp32 per matrix (PT, MATRIX) or per row (ROW): each must be an fp16
        per_matrix = dec.matrix_scales is not None
        s = (dec.matrix_scales if per_matrix else dec.row_scales).astype(np.float32)
        with np.errstate(over="ignore"):
            s16 = s.astype(np.float16)
        bad = np.flatnonzero(s16.astype(np.float32).view(np.uint32) != s.view(np.uint32))
        if bad.size:
            i = int(bad[0])
            raise NotRepresentable(
                f"{'matrix' if per_matrix else 'row'} {i}: fp32 scale {float(s[i])!r} is not an "
                f"fp16 value ({bad.size} such scales)"
            )
        if per_matrix:
            s16 = np.repeat(s16, n_rows // s16.shape[0])
        return np.ascontiguousarray(np.repeat(s16[:, None], nb, axis=1)).astype("<f2")
    if dec.block_scales.shape[1] == nb:  # one fp16 scale per 256 (B256): TQ's own granularity
        return np.ascontiguousarray(dec.block_scales).view("<f2")
    d = dec.block_scales.reshape(n_rows, nb, halves)
    bits = d.view(np.uint16)
    present = dec.codes.reshape(n_rows, nb, halves, QK).any(axis=3)
    # a half with non-zero weights decides; both empty: the first half (what convert wrote from a TQ source)
    first_present = np.where(present[:, :, 0] | ~present[:, :, 1], 0, 1)
    chosen = np.take_along_axis(bits, first_present[:, :, None], axis=2)[:, :, 0]
    clash = present.all(axis=2) & (bits[:, :, 0] != bits[:, :, 1])
    if clash.any():
        r, b = (int(x) for x in np.argwhere(clash)[0])
        raise NotRepresentable(
            f"row {r}, weights {b * QK_K}..{b * QK_K + QK_K - 1}: the two 128-blocks carry "
            f"different scales {float(d[r, b, 0])!r} and {float(d[r, b, 1])!r} "
            f"({int(clash.sum())} such 256-blocks)"
        )
    return np.ascontiguousarray(chosen).view("<f2")


def encode_target(dec: codec.Decoded, target: str) -> np.ndarray:
    """The target type's raw bytes of the tensor (rows, bytes per row); NotRepresentable when not exact."""
    if target in ("tq2_0", "tq1_0"):
        d = tq_scales(dec)
        enc = tq.tq2_0_encode if target == "tq2_0" else tq.tq1_0_encode
        return enc(dec.codes, d)
    x = dec.to_float()
    xb = x.view(np.uint32)
    if target == "f32":
        return x.view(np.uint8)
    if target == "f16":
        with np.errstate(over="ignore"):
            y = x.astype("<f2")
        bad = y.astype(np.float32).view(np.uint32) != xb
    elif target == "bf16":
        y = (xb >> np.uint32(16)).astype("<u2")
        bad = (xb & np.uint32(0xFFFF)) != 0
    else:
        raise ValueError(f"unknown target {target}")
    if bad.any():
        r, c = (int(v) for v in np.argwhere(bad)[0])
        raise NotRepresentable(
            f"row {r} col {c}: value {float(x[r, c])!r} is not a {target.upper()} value ({int(bad.sum())} such weights)"
        )
    return y.view(np.uint8)


def convert_back(
    src: Path,
    out: Path | None = None,
    *,
    to: str,
    fallback: str | None = None,
    verify: bool = True,
    force: bool = False,
    progress: bool = True,
) -> ConvertBackResult:
    """Write ``src`` with every BITCOS weight as ``to`` (see the module docstring)."""
    if to not in TARGETS:
        raise ConvertError(f"--to {to}: choose one of {', '.join(TARGETS)}")
    if fallback is not None and fallback != KEEP and fallback not in TARGETS:
        raise ConvertError(f"--fallback {fallback}: choose one of {', '.join([*TARGETS, KEEP])}")
    src = Path(src)
    out = Path(out) if out is not None else default_output(src, to)
    check_paths(src, out, force)
    reader = open_gguf(src)
    check_bitcos_file(reader, src)
    check_names_writable(reader, src)
    result = ConvertBackResult(src, out, to)
    by_name = {t.name: t for t in reader.tensors}
    weights = [t for t in reader.tensors if int(t.tensor_type) in BITCOS_TYPE_IDS]
    if not weights:
        raise ConvertError(f"{src}: no BITCOS tensors to convert back")
    t0 = time.perf_counter()

    # pass 1: decide each tensor's type (decode + exactness check; nothing is kept)
    plan: dict[str, BackResult] = {}
    bar = tqdm(total=len(weights), desc="check", unit="tensor", disable=None if progress else True)
    for w in weights:
        comp = by_name[w.name + COMPANION_SUFFIX]
        dec = _decode(src, w, comp)
        r = BackResult(w.name, dec.variant.name, tensor_ggml_shape(w), src_bytes=int(w.n_bytes) + int(comp.n_bytes))
        for cand in [to] + ([fallback] if fallback else []):
            if cand == KEEP:
                r.target = KEEP
                break
            try:
                r.out_bytes = encode_target(dec, cand).nbytes
                r.target = cand
                break
            except NotRepresentable as e:
                r.reason = r.reason or str(e)
                if fallback is None or cand == fallback:
                    msg = f"{src}: tensor '{w.name}' ({r.variant}): cannot be stored as {cand.upper()} exactly: {e}"
                    if fallback is None:
                        msg += (
                            " (--fallback f32|f16|bf16|keep converts such tensors to another type or leaves "
                            "them BITCOS)"
                        )
                    bar.close()
                    raise ConvertError(msg) from None
        del dec
        reader.release_pages()
        plan[w.name] = r
        bar.update(1)
    bar.close()
    result.tensors = [plan[w.name] for w in weights]
    result.seconds["check"] = time.perf_counter() - t0

    # pass 2: write, pass 3: verify the temporary file before it replaces anything (rewrite.write_verified)
    kept = any(r.target == KEEP for r in result.tensors)
    kvs: list[tuple | ValueError] = []
    for key, fld in reader.fields.items():
        if key.startswith("GGUF.") or (key.startswith("bitcos.") and not kept):
            continue
        try:
            value, vtype, sub = field_value(fld)
        except ValueError as e:
            kvs.append(e)
            continue
        if key == "general.file_type" and not kept:
            value, vtype, sub = int(TARGETS[to][1]), GGUFValueType.UINT32, None
        kvs.append((key, value, vtype, sub))
    if not kept and reader.get_field("general.file_type") is None:
        kvs.append(("general.file_type", int(TARGETS[to][1]), GGUFValueType.UINT32, None))
    outputs: list[OutputTensor] = []
    for t in reader.tensors:
        base = t.name[: -len(COMPANION_SUFFIX)] if t.name.endswith(COMPANION_SUFFIX) else None
        if base in plan and plan[base].target != KEEP:
            continue  # the companion of a weight converted back
        r = plan.get(t.name)
        if r is not None and r.target != KEEP:
            outputs.append(
                OutputTensor(
                    t.name,
                    TARGETS[r.target][0],
                    r.ne,
                    progress_bytes=int(t.n_bytes),
                    data=_encoder(src, t, by_name[t.name + COMPANION_SUFFIX], r.target),
                )
            )
        else:
            outputs.append(
                OutputTensor(t.name, t.tensor_type, tensor_ggml_shape(t), source=t, progress_bytes=int(t.n_bytes))
            )

    def check(tmp_path: Path) -> None:
        verify_back(reader, tmp_path, result, label=str(out))

    result.removed_stale = write_verified(
        reader,
        src,
        out,
        force=force,
        metadata=kvs,
        tensors=outputs,
        verify=check if verify else None,
        progress=progress,
        seconds=result.seconds,
    )
    result.verified = verify
    result.seconds["total"] = time.perf_counter() - t0
    return result


def _encoder(src: Path, w: ReaderTensor, comp: ReaderTensor, target: str):
    """The bytes of weight ``w`` (with its companion) in ``target``, made when the output tensor is written."""
    return lambda: encode_target(_decode(src, w, comp), target)


def verify_back(src_reader: CheckedGGUFReader, out_path: Path, result: ConvertBackResult, *, label: str) -> None:
    """Each converted tensor dequantizes (ggml's arithmetic) to the BITCOS decode's fp32 bits; others are
    byte-equal; no companion of a converted weight is left."""
    src_t = {t.name: t for t in src_reader.tensors}
    converted = {r.name: r for r in result.tensors if r.target != KEEP}

    def check(t: ReaderTensor, o: ReaderTensor, _out: dict[str, ReaderTensor]) -> None:
        r = converted[t.name]
        want_type = TARGETS[r.target][0]
        if int(o.tensor_type) != int(want_type) or tensor_ggml_shape(o) != r.ne:
            raise ConvertError(
                f"{label}: tensor '{t.name}': verification failed: written as "
                f"{type_name(o.tensor_type)} {tensor_ggml_shape(o)}"
            )
        want = _decode(Path(label), t, src_t[t.name + COMPANION_SUFFIX]).to_float().view(np.uint32)
        got = source_float_rows(o, 0, want.shape[0]).view(np.uint32)  # ggml's dequantization
        if not np.array_equal(got, want):
            rr, cc = (int(v) for v in np.argwhere(got != want)[0])
            raise ConvertError(
                f"{label}: tensor '{t.name}': verification failed: row {rr} col {cc} dequantizes "
                f"to bits 0x{int(got[rr, cc]):08x}, BITCOS 0x{int(want[rr, cc]):08x}"
            )

    verify_rewrite(
        src_reader,
        out_path,
        label,
        rewritten={name: check for name in converted},
        dropped=frozenset(name + COMPANION_SUFFIX for name in converted),
    )


def summarize(res: ConvertBackResult) -> list[str]:
    counts: dict[str, int] = {}
    for r in res.tensors:
        counts[r.target] = counts.get(r.target, 0) + 1
    lines = [
        f"converted {len(res.tensors)} BITCOS tensors back: "
        + ", ".join(f"{n} to {t.upper() if t != KEEP else 'BITCOS (kept)'}" for t, n in counts.items())
    ]
    for r in res.tensors:
        if r.target != res.to:
            lines.append(
                f"fallback: {r.name} ({r.variant}) -> {r.target.upper() if r.target != KEEP else 'BITCOS'}: "
                f"not {res.to.upper()}: {r.reason}"
            )
    lines.append(size_line(res.src, res.out, res.verified))
    lines.append("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in res.seconds.items()))
    if res.removed_stale:
        lines.append(stale_line(res.removed_stale, res.out))
    return lines


def print_summary(res: ConvertBackResult) -> None:
    for line in summarize(res):
        print(line, file=sys.stderr)


__all__ = [
    "TARGETS",
    "KEEP",
    "NotRepresentable",
    "ConvertBackResult",
    "BackResult",
    "convert_back",
    "default_output",
    "encode_target",
    "tq_scales",
    "summarize",
]
