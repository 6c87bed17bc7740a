"""csrc/bitcos-format.h (the C home of the format's constants) and ggml_bitcos/format.py (the Python home)
agree, constant by constant, and the companion header offsets in C match the bytes ``codec.Header.pack``
writes.

The header is parsed with regular expressions: every ``#define`` and every enum constant in it must have a
Python counterpart in ``python_mirror()``; block sizes come from the struct definitions (laid out with ctypes,
as a C compiler lays them out); each ``BITCOS_HDR_*`` offset, with the width its comment names (u8 … u64), is
checked by reading a packed header at that place.
"""

from __future__ import annotations

import ast
import ctypes
import re
import struct
from dataclasses import fields
from pathlib import Path

import pytest

from ggml_bitcos import codec
from ggml_bitcos.format import (
    BITMAP_BYTES,
    COMPANION_SUFFIX,
    HEADER_BYTES,
    HEADER_FIELDS,
    MAGIC,
    MAX_ROW_GROUP_LOG2,
    MAX_SCALE,
    POOL_TAIL,
    QK,
    QK_BITMAP,
    SECTION_ALIGN,
    TYPE_ID_BITMAP,
    VERSION,
    Variant,
)

FORMAT_H = Path(__file__).resolve().parent.parent / "csrc" / "bitcos-format.h"

C_TYPES = {
    "uint8_t": ctypes.c_uint8,
    "uint16_t": ctypes.c_uint16,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "int8_t": ctypes.c_int8,
    "int16_t": ctypes.c_int16,
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "float": ctypes.c_float,
}
FIELD_WIDTHS = {"u8": 1, "u16": 2, "u32": 4, "u64": 8}
HDR_PREFIX = "BITCOS_HDR_"


# --- reading the C header ------------------------------------------------------------------------------


def strip_comments(text: str) -> str:
    """The C text without // and /* */ comments (string literals kept as they are)."""
    pattern = re.compile(r'("(?:\\.|[^"\\])*")|//[^\n]*|/\*.*?\*/', re.S)
    return pattern.sub(lambda m: m.group(1) or "", text)


class CHeader:
    """The constants of a C header: object-like ``#define``s, enum constants (with the field width named in a
    trailing ``// u8`` … ``// u64`` comment, where there is one) and the sizes of its ``typedef struct``s.

    A ``#define`` whose value is names alone, none defined in the header (``#define X_STATIC_ASSERT
    _Static_assert``, ``#define BITCOS_FORMAT_FN static inline``) spells C, not a constant, and is left out;
    every other one must evaluate.
    """

    def __init__(self, text: str):
        code = strip_comments(text)
        self.raw: dict[str, str] = {}
        self.widths: dict[str, int] = {}
        for name, value in re.findall(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+(\S[^\n]*?)[ \t]*$", code, re.M):
            self.raw[name] = value
        for body in re.findall(r"\benum\s+\w*\s*\{(.*?)\}", text, re.S):
            for line in body.splitlines():
                m = re.match(r"\s*(\w+)\s*=\s*([^,/\n]*[^,/\s])\s*,?\s*(?://\s*(\w+))?", line)
                if m:
                    self.raw[m.group(1)] = m.group(2)
                    if m.group(3) in FIELD_WIDTHS:
                        self.widths[m.group(1)] = FIELD_WIDTHS[m.group(3)]
        self.raw = {
            name: value
            for name, value in self.raw.items()
            if not (
                re.fullmatch(r"[A-Za-z_]\w*(\s+[A-Za-z_]\w*)*", value)
                and not any(word in self.raw for word in value.split())
            )
        }
        self.structs: dict[str, type[ctypes.Structure]] = {}
        for body, name in re.findall(r"typedef\s+struct\s*\{(.*?)\}\s*(\w+)\s*;", code, re.S):
            members = []
            for ctype, member, count in re.findall(r"(\w+)\s+(\w+)\s*(?:\[([^\]]+)\])?\s*;", body):
                t = C_TYPES[ctype]
                members.append((member, t * self.value_of(count) if count else t))
            self.structs[name] = type(name, (ctypes.Structure,), {"_fields_": members})

    def value_of(self, expr: str) -> int | str:
        """The value of a constant expression: integer literals (suffixes u/l dropped), string literals,
        names of constants in this header, ``sizeof(struct)``, + - * / (C integer division) and parentheses."""
        expr = expr.strip()
        if re.fullmatch(r'"(?:\\.|[^"\\])*"', expr):
            return ast.literal_eval(expr)
        expr = re.sub(r"\bsizeof\s*\(\s*(\w+)\s*\)", lambda m: str(ctypes.sizeof(self.structs[m.group(1)])), expr)
        expr = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]+\b", r"\1", expr)
        return self._eval(ast.parse(expr.replace("/", "//"), mode="eval").body)

    def _eval(self, node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            value = self.value_of(self.raw[node.id])
            assert isinstance(value, int), node.id
            return value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self._eval(node.operand)
        if isinstance(node, ast.BinOp):
            ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__, ast.FloorDiv: int.__floordiv__}
            return ops[type(node.op)](self._eval(node.left), self._eval(node.right))
        raise ValueError(f"unsupported constant expression {ast.dump(node)}")

    def constants(self) -> dict[str, int | str]:
        return {name: self.value_of(value) for name, value in self.raw.items()}


# --- what Python says ----------------------------------------------------------------------------------


def marker(index: int, width: int) -> int:
    """A value of `width` bytes, every byte non-zero and different from other fields' bytes."""
    return int.from_bytes(bytes((16 * index + j + 1) & 0xFF for j in range(width)), "little")


def packed_header_with_markers(monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, dict[str, int]]:
    """``codec.Header.pack()`` with every field (magic and version included, through the codec's module
    constants) set to its own marker value, as wide as the field; returns (bytes, {field: marker})."""
    values = {name: marker(i, struct.calcsize("<" + code)) for i, (name, code) in enumerate(HEADER_FIELDS)}
    monkeypatch.setattr(codec, "MAGIC", values["magic"])
    monkeypatch.setattr(codec, "header_version", lambda _variant: values["version"])
    header = codec.Header(**{f.name: values[f.name] for f in fields(codec.Header)})
    return header.pack(), values


def python_mirror(packed: bytes, values: dict[str, int], c: CHeader) -> dict[str, int | str]:
    """Each C constant's value as the Python side has it. A header field's offset is the one C names when the
    packed header holds that field's marker there, read with the width C names; else -1 (never a C offset)."""
    mirror: dict[str, int | str] = {
        "BITCOS_TYPE_ID_G128": Variant.G128.type_id,
        "BITCOS_TYPE_ID_PT": Variant.PT.type_id,
        "BITCOS_TYPE_ID_BITMAP": TYPE_ID_BITMAP,
        "QK_BITCOS": QK,
        "QK_BITCOS_BITMAP": QK_BITMAP,
        "QK_BITCOS_B256": Variant.B256.scale_block,
        **{f"BITCOS_VARIANT_{v.name}": int(v) for v in Variant},
        "BITCOS_VARIANT_COUNT": len(Variant),
        "BITCOS_BITMAP_BYTES": BITMAP_BYTES,
        "BITCOS_BLOCK_BYTES_G128": Variant.G128.block_bytes,
        "BITCOS_BLOCK_BYTES_PT": Variant.PT.block_bytes,
        "BITCOS_COMPANION_SUFFIX": COMPANION_SUFFIX,
        "BITCOS_FORMAT_VERSION": VERSION,
        "BITCOS_MAGIC": MAGIC,
        "BITCOS_HEADER_BYTES": HEADER_BYTES,
        "BITCOS_SECTION_ALIGN": SECTION_ALIGN,
        "BITCOS_POOL_TAIL_BYTES": POOL_TAIL,
        "BITCOS_MAX_ROW_GROUP_LOG2": MAX_ROW_GROUP_LOG2,
        "BITCOS_MAX_SCALE": MAX_SCALE,
        HDR_PREFIX + "RESERVED": codec.HEADER_RESERVED_OFFSET,
    }
    c_values = c.constants()
    for name, _code in HEADER_FIELDS:
        key = HDR_PREFIX + name.upper()
        off, width = c_values.get(key), c.widths.get(key)
        found = (
            isinstance(off, int)
            and width is not None
            and 0 <= off
            and off + width <= len(packed)
            and int.from_bytes(packed[off : off + width], "little") == values[name]
        )
        mirror[key] = off if found else -1
    return mirror


def mismatches(c: CHeader, mirror: dict[str, int | str]) -> list[str]:
    """Every disagreement: a C constant without a Python counterpart, a Python one missing in C, a value."""
    c_values = c.constants()
    out = [f"{name}: no Python mirror in ggml_bitcos/format.py" for name in c_values if name not in mirror]
    out += [f"{name}: missing from csrc/bitcos-format.h" for name in mirror if name not in c_values]
    out += [
        f"{name}: C {c_values[name]!r}, Python {mirror[name]!r}"
        for name in c_values
        if name in mirror and c_values[name] != mirror[name]
    ]
    return out


def check(text: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    c = CHeader(text)
    packed, values = packed_header_with_markers(monkeypatch)
    problems = mismatches(c, python_mirror(packed, values, c))
    # the reserved bytes follow the last field and are zero up to HEADER_BYTES
    if any(packed[codec.HEADER_RESERVED_OFFSET :]):
        problems.append("reserved header bytes are not zero")
    return problems


# --- tests ---------------------------------------------------------------------------------------------


def test_c_header_and_format_py_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    assert check(FORMAT_H.read_text(), monkeypatch) == []


def test_c_variant_functions_agree_with_format_py(tmp_path: Path) -> None:
    """The header's per-variant functions (version, type id, K multiple, scale block, scales bytes, unit bytes)
    compiled with the C compiler give Variant's attributes, for every variant and a few shapes."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "v.c"
    src.write_text(
        '#include <stdio.h>\n#include "bitcos-format.h"\nint main(void) {\n'
        "  for (int v = 0; v < BITCOS_VARIANT_COUNT; ++v)\n"
        '    printf("%d %d %d %lld %lld %zu %llu %llu\\n", v, bitcos_variant_version(v), '
        "bitcos_variant_type_id(v), (long long) bitcos_variant_k_multiple(v), "
        "(long long) bitcos_variant_scale_block(v), bitcos_block_bytes(v), "
        "(unsigned long long) bitcos_scales_bytes(v, 1536, 7, 1), "
        "(unsigned long long) bitcos_scales_bytes(v, 2048, 12, 3));\n  return 0;\n}\n"
    )
    exe = tmp_path / "v"
    subprocess.run(
        [cc, "-std=c11", "-Wall", "-Werror", "-I", str(FORMAT_H.parent), str(src), "-o", str(exe)], check=True
    )
    got = [
        list(map(int, line.split()))
        for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    ]
    want = [
        [
            int(v),
            v.version,
            v.type_id,
            v.k_multiple,
            v.scale_block,
            v.block_bytes,
            v.scales_bytes(1536, 7, 1),
            v.scales_bytes(2048, 12, 3),
        ]
        for v in Variant
    ]
    assert got == want


def test_every_header_field_is_in_c_with_its_width() -> None:
    c = CHeader(FORMAT_H.read_text())
    codes = {"B": 1, "H": 2, "I": 4, "Q": 8}
    for name, code in HEADER_FIELDS:
        assert c.widths.get(HDR_PREFIX + name.upper()) == codes[code], name
    assert HDR_PREFIX + "RESERVED" in c.raw


@pytest.mark.parametrize(
    "old,new,expect",
    [
        ("#define BITCOS_TYPE_ID_PT   161", "#define BITCOS_TYPE_ID_PT   162", "BITCOS_TYPE_ID_PT: C 162"),
        ("#define BITCOS_MAGIC             0x53435442u", "#define BITCOS_MAGIC 0x53435443u", "BITCOS_MAGIC"),
        (
            "    uint16_t d;\n} block_bitcos_g128;",
            "    uint32_t d;\n} block_bitcos_g128;",
            "BITCOS_BLOCK_BYTES_G128: C 20",
        ),
        ("#define QK_BITCOS 128", "#define QK_BITCOS 256", "QK_BITCOS"),
        (
            "BITCOS_HDR_N_ROWS           = 16,",
            "BITCOS_HDR_N_ROWS           = 24,",
            "BITCOS_HDR_N_ROWS: C 24, Python -1",
        ),
        (
            "BITCOS_HDR_VERSION          = 4,   // u16",
            "BITCOS_HDR_VERSION          = 4,   // u32",
            "BITCOS_HDR_VERSION: C 4, Python -1",
        ),
        (
            "#define BITCOS_POOL_TAIL_BYTES   64",
            "#define BITCOS_POOL_TAIL_BYTES   64\n#define BITCOS_NEW_THING 3",
            "BITCOS_NEW_THING: no Python mirror",
        ),
        ("#define BITCOS_SECTION_ALIGN     64", "", "BITCOS_SECTION_ALIGN: missing from csrc/bitcos-format.h"),
        (
            '#define BITCOS_COMPANION_SUFFIX  ".bitcos"',
            '#define BITCOS_COMPANION_SUFFIX  ".bitcoz"',
            "BITCOS_COMPANION_SUFFIX",
        ),
    ],
)
def test_check_detects_a_changed_header(monkeypatch: pytest.MonkeyPatch, old: str, new: str, expect: str) -> None:
    """The comparison can fail: each edit of the C header is reported. (The edits match the header's text up to
    white space, so a reformatted header needs no new strings here.)"""
    text = FORMAT_H.read_text()
    where = re.compile(r"\s+".join(re.escape(part) for part in old.split()))
    assert len(where.findall(text)) == 1, old
    problems = check(where.sub(lambda _m: new, text, count=1), monkeypatch)
    assert any(expect in p for p in problems), problems
