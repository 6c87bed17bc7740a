"""Pass 4, write + verify: the output's key/values (the source's, ``general.file_type`` and the ``bitcos.*``
keys), the tensors written through ``rewrite.write_verified`` (temporary file, renamed onto the target only
when complete and verified), and the verification: every converted tensor decodes to the source's fp32 bits
(−0.0 mapped to +0.0, FORMAT.md §5), every other tensor is byte-equal."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGUFValueType
from gguf.gguf_reader import ReaderTensor

from gguf_tools import CheckedGGUFReader, field_value, tensor_bytes, tensor_ggml_shape

from .. import codec
from ..format import BITCOS_TYPE_IDS, COMPANION_SUFFIX, KEY_CONVERTED_FROM, KEY_FORMAT_VERSION, TYPE_ID_BITMAP, Variant
from ..rewrite import ConvertError, verify_rewrite
from ..source import iter_row_chunks, source_float_rows
from .analyse import TensorResult

Metadata = list[tuple[str, tuple | ValueError]]


def metadata_to_copy(reader: CheckedGGUFReader) -> Metadata:
    """(key, (value, type, item type)) of every key/value the output copies (not ``GGUF.*``, not ``bitcos.*``);
    a key that cannot be copied carries its ``ValueError`` (raised when the output is written)."""
    out: Metadata = []
    for key, fld in reader.fields.items():
        if key.startswith("GGUF.") or key.startswith("bitcos."):
            continue
        try:
            out.append((key, field_value(fld)))
        except ValueError as e:
            out.append((key, e))
    return out


def _merged_converted_from(reader: CheckedGGUFReader, new_types: set[str]) -> str:
    old = reader.get_field(KEY_CONVERTED_FROM)
    types = set(new_types)
    if old is not None and old.types == [GGUFValueType.STRING]:
        types |= {x for x in old.contents().split(",") if x}
    return ",".join(sorted(types))


def tensor_format_version(type_id: int) -> int:
    """The format version of a BITCOS weight of ggml type ``type_id`` (every variant stored as that type has it)."""
    return next(v.version for v in Variant if v.type_id == type_id)


def _file_format_version(reader: CheckedGGUFReader, converted: list[TensorResult]) -> int:
    """bitcos.format_version of the output (FORMAT.md §6): the highest version of its BITCOS tensors, the
    converted ones and those copied from a source that already held BITCOS."""
    versions = [r.variant.version for r in converted if r.variant is not None]
    versions += [
        tensor_format_version(int(t.tensor_type)) for t in reader.tensors if int(t.tensor_type) in BITCOS_TYPE_IDS
    ]
    return max(versions)


def file_type_of(converted: list[TensorResult]) -> int:
    """general.file_type of a converted file: LLAMA_FTYPE_MOSTLY_BITCOS (162) / _G128 (160) / _PT (161), the
    ggml type ids (the file-types patch), of the type most converted weights have, so llama.cpp names the
    model as BITCOS rather than as its source type; ties to the newer format, then PT."""
    count: dict[int, int] = {}
    for r in converted:
        assert r.variant is not None
        count[r.variant.type_id] = count.get(r.variant.type_id, 0) + 1
    order = (TYPE_ID_BITMAP, Variant.PT.type_id, Variant.G128.type_id)
    return max(order, key=lambda tid: (count.get(tid, 0), -order.index(tid)))


def output_metadata(
    reader: CheckedGGUFReader, metadata: Metadata, converted: list[TensorResult], n_bitcos: int
) -> list[tuple | ValueError]:
    """The output's key/values: the source's, general.file_type replaced when anything converted, and the
    ``bitcos.*`` keys on a file holding BITCOS tensors."""
    kvs: list[tuple | ValueError] = []
    for key, kv in metadata:
        if isinstance(kv, ValueError):
            kvs.append(kv)
        elif not (key == "general.file_type" and converted):  # replaced: the file is now mostly BITCOS
            kvs.append((key, *kv))
    if converted:
        kvs.append(("general.file_type", file_type_of(converted), GGUFValueType.UINT32, None))
    if converted or n_bitcos > 0:  # no bitcos.* keys on a file without BITCOS tensors
        conv_types = {r.src_type for r in converted}
        kvs.append((KEY_FORMAT_VERSION, _file_format_version(reader, converted), GGUFValueType.UINT32, None))
        kvs.append((KEY_CONVERTED_FROM, _merged_converted_from(reader, conv_types), GGUFValueType.STRING, None))
    return kvs


def verify_output(
    src_reader: CheckedGGUFReader,
    out_path: Path,
    converted: list[TensorResult],
    *,
    progress: bool = True,
    label: str | None = None,
) -> None:
    """Every converted tensor decodes to the source's fp32 bits (−0.0 -> +0.0); others are byte-equal."""
    label = label or str(out_path)

    def check(r: TensorResult) -> Callable[[ReaderTensor, ReaderTensor, dict[str, ReaderTensor]], None]:
        def converted_tensor(t: ReaderTensor, o: ReaderTensor, out_tensors: dict[str, ReaderTensor]) -> None:
            comp = out_tensors.get(t.name + COMPANION_SUFFIX)
            if comp is None or o.tensor_type not in BITCOS_TYPE_IDS:
                raise ConvertError(f"{label}: tensor '{t.name}': verification failed: not written as BITCOS")
            ne = tensor_ggml_shape(o)
            n_rows, k = math.prod(ne[1:]), ne[0]
            try:
                dec = codec.decode(
                    tensor_bytes(o), tensor_bytes(comp), int(o.tensor_type), k, n_rows, codec.n_mats_of(ne)
                )
            except codec.FormatError as e:
                raise ConvertError(f"{label}: tensor '{t.name}': verification failed: {e}") from None
            if dec.variant != r.variant:
                raise ConvertError(
                    f"{label}: tensor '{t.name}': verification failed: written as "
                    f"{dec.variant.name}, chosen {r.variant.name}"
                )
            for s, e in iter_row_chunks(n_rows, k):
                want = source_float_rows(t, s, e)
                got = dec.to_float(slice(s, e))
                # bit-exact up to the sign of zero (FORMAT.md §5): IEEE-equal (so +0 == -0, and a
                # NaN never matches) and the output never holds -0.0; non-zero equal floats have equal bits
                if not np.array_equal(got, want) or np.any(got.view(np.uint32) == np.uint32(0x80000000)):
                    gb, wb = got.view(np.uint32), want.view(np.uint32)
                    wb = np.where(wb == np.uint32(0x80000000), np.uint32(0), wb)
                    bad = np.argwhere(gb != wb)[0]
                    raise ConvertError(
                        f"{label}: tensor '{t.name}': verification failed: row {s + int(bad[0])} "
                        f"col {int(bad[1])} decodes to bits 0x{int(gb[tuple(bad)]):08x}, "
                        f"source 0x{int(wb[tuple(bad)]):08x}"
                    )
                del want, got

        return converted_tensor

    verify_rewrite(src_reader, out_path, label, rewritten={r.name: check(r) for r in converted}, progress=progress)


__all__ = ["metadata_to_copy", "tensor_format_version", "file_type_of", "output_metadata", "verify_output"]
