"""Crafted GGUF headers (issue 30): small seed files written byte by byte (tests/gguf_raw.py) and the mutations
of their header fields that tests/test_crafted_headers.py and the reader-vs-gguf.cpp verdict test run. Not a
test module itself.

Each case is (name, bytes); the mutations cover every field gguf.cpp reads: the version, both counts, key
lengths, value types, array item types and counts, string lengths, ``general.alignment`` (value and type),
duplicate keys and tensor names, name lengths, ``n_dims``, each dimension, type ids (holes, removed types,
foreign ids, BITCOS ids), data offsets, truncation at every field and appended bytes, and a seeded set of
random overwrites of header bytes with interesting values.
"""

from __future__ import annotations

import contextlib
import random
import signal
import struct
from collections.abc import Iterator

import numpy as np

from gguf_raw import gguf_string, layout, patch, raw_gguf, raw_kv


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in the block once it has run ``seconds`` (SIGALRM interrupts a Python loop: a reader
    walking an unbounded count fails the test instead of hanging it)."""

    def expired(*_a: object) -> None:
        raise TimeoutError(f"still running after {seconds} s: a count the reader did not bound")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


STR, ARR, U32, U64, F32, BOOL, I32 = 8, 9, 4, 10, 6, 7, 5
F32_T, F16_T, Q8_0_T, I8_T, BITCOS_T = 0, 1, 8, 24, 162
TYPE_SIZES = {F32_T: (1, 4), F16_T: (1, 2), Q8_0_T: (32, 34), I8_T: (1, 1)}

TOKENS = [b"<unk>", b"a", b"bc", b"def"]


def kv_str(key: str, s: bytes | str) -> bytes:
    return raw_kv(key, STR, gguf_string(s))


def kv_u32(key: str, v: int) -> bytes:
    return raw_kv(key, U32, struct.pack("<I", v))


def kv_f32_array(key: str, values: list[float]) -> bytes:
    return raw_kv(key, ARR, struct.pack("<IQ", F32, len(values)) + struct.pack(f"<{len(values)}f", *values))


def kv_str_array(key: str, items: list[bytes]) -> bytes:
    return raw_kv(key, ARR, struct.pack("<IQ", STR, len(items)) + b"".join(gguf_string(s) for s in items))


def with_data(
    kvs: list[bytes], tensors: list[tuple[str, tuple[int, ...], int]], *, alignment: int = 32, extra: bytes = b""
) -> bytes:
    """A file of these KV pairs and tensors (name, ne, type id), each tensor's data random bytes of its size at
    its padded offset (F32 / F16 data made finite)."""
    rng = np.random.default_rng(len(tensors))
    infos, data = [], b""
    for name, ne, tt in tensors:
        block, size = TYPE_SIZES[tt]
        n = int(np.prod(ne)) if ne else 1
        nbytes = n // block * size
        body = rng.normal(0, 1, n).astype(np.float32 if tt == F32_T else np.float16).tobytes()
        body = body if tt in (F32_T, F16_T) else rng.integers(0, 64, nbytes, dtype=np.uint8).tobytes()
        data += bytes((-len(data)) % alignment)
        infos.append((name, ne, tt, len(data)))
        data += body[:nbytes]
    return raw_gguf(kvs, infos, data + extra, alignment=alignment)


def base_kv() -> list[bytes]:
    """The seeds' KV pairs: a string, the alignment, an f32 and a string array (a vocabulary's), a bool, a u64."""
    return [
        kv_str("general.architecture", "llama"),
        kv_u32("general.alignment", 32),
        kv_f32_array("tokenizer.ggml.scores", [0.0, -1.0, -2.0, -3.0]),
        kv_str_array("tokenizer.ggml.tokens", TOKENS),
        raw_kv("seed.flag", BOOL, b"\x01"),
        raw_kv("seed.u64", U64, struct.pack("<Q", 7)),
    ]


PLAIN_TENSORS = [
    ("blk.0.attn_norm.weight", (8,), F32_T),
    ("blk.0.attn_q.weight", (32, 2), F16_T),
    ("blk.0.ffn_up.weight", (32, 2), Q8_0_T),
    ("blk.0.ffn_up_exps.weight", (2, 2, 2), F32_T),
    ("blk.0.four_d.weight", (2, 1, 2, 1), F32_T),
]


def seeds() -> dict[str, bytes]:
    """Small valid files (each a few hundred bytes to 2 KB) that every reader and gguf.cpp accept."""
    base = base_kv()
    return {
        "plain": with_data(base, PLAIN_TENSORS),
        "align8": with_data(
            [kv_str("general.architecture", "llama"), kv_u32("general.alignment", 8)],
            [("a.weight", (3,), F32_T), ("b.weight", (5,), F16_T), ("c.weight", (7,), I8_T)],
            alignment=8,
        ),
        "no-tensors": raw_gguf(base, [], b""),
        "empty-tensor": with_data(base[:2], [("e.weight", (8, 0), F32_T), ("f.weight", (4,), F32_T)]),
        "name63": with_data(base[:1], [("n" * 63, (4,), F32_T)]),
        "version2": with_data(base[:1], [("v.weight", (4,), F32_T)]).replace(b"GGUF\x03", b"GGUF\x02", 1),
    }


INTERESTING_U64 = [0, 1, 2, 3, 7, 8, 63, 64, 255, 1 << 20, (1 << 30) - 1, 1 << 30, (1 << 30) + 1, 1 << 31, 1 << 32]
INTERESTING_U64 += [(1 << 62), (1 << 63) - 1, 1 << 63, (1 << 64) - 2, (1 << 64) - 1]
INTERESTING_U32 = [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 31, 32, 64, 255, 1 << 16, (1 << 31) - 1, 1 << 31]
INTERESTING_U32 += [(1 << 32) - 1]
TYPE_IDS = [0, 1, 2, 4, 5, 8, 9, 23, 24, 30, 31, 36, 38, 39, 41, 42, 43, 100, 142, 143, 159, 160, 161, 162, 163, 255]
TYPE_IDS += [(1 << 31) - 1, (1 << 32) - 1]


def mutations(name: str, b: bytes) -> list[tuple[str, bytes]]:
    """Every targeted mutation of seed ``b`` (named ``name``), each as (case name, bytes)."""
    lay = layout(b)
    out: list[tuple[str, bytes]] = []

    def add(what: str, data: bytes) -> None:
        out.append((f"{name}/{what}", data))

    for v in (0, 1, 2, 3, 4, 0x03000000, 0xFFFFFFFF):
        add(f"version={v}", patch(b, 4, "<I", v))
    n_t, n_kv = len(lay.infos), len(lay.kvs)
    for v in sorted({0, max(n_t - 1, 0), n_t + 1, 1 << 31, (1 << 63) - 1, 1 << 63, (1 << 64) - 1}):
        add(f"n_tensors={v}", patch(b, 8, "<Q", v))
    for v in sorted({0, max(n_kv - 1, 0), n_kv + 1, 1 << 31, (1 << 63) - 1, 1 << 63, (1 << 64) - 1}):
        add(f"n_kv={v}", patch(b, 16, "<Q", v))
    for kv in lay.kvs:
        k = kv.key
        for v in (0, len(k) - 1, len(k) + 1, 1 << 30, (1 << 30) + 1, len(b), (1 << 64) - 1):
            add(f"{k}/key_len={v}", patch(b, kv.at, "<Q", v))
        for t in (0, 1, 4, 5, 6, 7, 8, 9, 10, 12, 13, 1 << 31, (1 << 32) - 1):
            if t != kv.vtype:
                add(f"{k}/type={t}", patch(b, kv.type_at, "<I", t))
        if kv.vtype == STR:
            for v in (0, 1, 1 << 30, (1 << 30) + 1, len(b), (1 << 64) - 1):
                add(f"{k}/str_len={v}", patch(b, kv.value_at, "<Q", v))
        if kv.vtype == ARR:
            for t in (0, 1, 4, 7, 8, 9, 10, 12, 13, (1 << 32) - 1):
                if t != kv.item_type:
                    add(f"{k}/item_type={t}", patch(b, kv.value_at, "<I", t))
            for v in INTERESTING_U64:
                add(f"{k}/count={v}", patch(b, kv.value_at + 4, "<Q", v))
            if kv.item_type == STR:
                first = kv.value_at + 12
                for v in (0, 2, (1 << 30) + 1, (1 << 64) - 1):
                    add(f"{k}/item0_len={v}", patch(b, first, "<Q", v))
        if k == "general.alignment":
            for v in INTERESTING_U32:
                add(f"alignment={v}", patch(b, kv.value_at, "<I", v))
            for t in (I32, F32, 0):  # same-size or smaller types: the value's bytes read as another type
                add(f"alignment/type={t}", patch(b, kv.type_at, "<I", t))
    # a key or tensor name equal to an earlier one of the same length
    keys = [kv for kv in lay.kvs]
    for i, a in enumerate(keys):
        for c in keys[i + 1 :]:
            if len(a.key) == len(c.key):
                add(f"dup-key/{c.key}", patch(b, c.at + 8, f"<{len(a.key)}s", a.key.encode()))
    for i, a in enumerate(lay.infos):
        for c in lay.infos[i + 1 :]:
            if len(a.name) == len(c.name):
                add(f"dup-tensor/{c.name}", patch(b, c.at + 8, f"<{len(a.name)}s", a.name.encode()))
    for t in lay.infos:
        nm = t.name
        for v in (0, len(nm) - 1, len(nm) + 1, 64, 1 << 30, (1 << 30) + 1, (1 << 64) - 1):
            add(f"{nm}/name_len={v}", patch(b, t.at, "<Q", v))
        for v in (0, 1, 2, 3, 4, 5, 8, 64, (1 << 32) - 1):
            if v != len(t.ne):
                add(f"{nm}/n_dims={v}", patch(b, t.n_dims_at, "<I", v))
        for j in range(len(t.ne)):
            for v in (0, 1, 3, 1 << 31, 1 << 32, 1 << 62, (1 << 63) - 1, 1 << 63, (1 << 64) - 1):
                add(f"{nm}/ne{j}={v}", patch(b, t.n_dims_at + 4 + 8 * j, "<Q", v))
        for v in TYPE_IDS:
            add(f"{nm}/type={v}", patch(b, t.type_at, "<I", v))
        for d in (1, 8, lay.alignment, -lay.alignment, 1 << 40, (1 << 64) - 1):
            (off,) = struct.unpack_from("<Q", b, t.offset_at)
            add(f"{nm}/offset{d:+d}", patch(b, t.offset_at, "<Q", (off + d) % (1 << 64)))
    # truncations: at and inside every field boundary of the header, and in the data section
    cuts = {24, 23, 30, lay.infos_end, lay.infos_end - 1, lay.data_start, len(b) - 1, len(b) - 8}
    for kv in lay.kvs:
        cuts |= {kv.at + 4, kv.type_at, kv.value_at, kv.end - 1}
    for t in lay.infos:
        cuts |= {t.at + 4, t.n_dims_at, t.type_at, t.offset_at, t.end - 1}
    for n in sorted(c for c in cuts if 24 <= c < len(b)):
        add(f"cut={n}", b[:n])
    for n in (1, 7, 31, 32, 100_000):
        add(f"append={n}", b + bytes(n))
    # seeded random overwrites of 1 ... 8 header bytes with interesting values
    rng = random.Random(f"{name}-{len(b)}")
    for i in range(40):
        pos = rng.randrange(4, lay.infos_end)
        kind = rng.choice(["u8", "u32", "u64"])
        if kind == "u8":
            add(f"rand{i}/u8@{pos}", patch(b, pos, "<B", rng.choice([0, 1, 0x7F, 0x80, 0xFF])))
        elif kind == "u32":
            add(f"rand{i}/u32@{pos}", patch(b, pos, "<I", rng.choice(INTERESTING_U32)))
        else:
            add(f"rand{i}/u64@{pos}", patch(b, pos, "<Q", rng.choice(INTERESTING_U64)))
    return out


def _align_array(n: int) -> bytes:
    """``general.alignment`` as an array of ``n`` u32 values 32."""
    return raw_kv("general.alignment", ARR, struct.pack("<IQ", U32, n) + struct.pack(f"<{n}I", *[32] * n))


def special_cases() -> list[tuple[str, bytes]]:
    """Cases no field patch of a seed makes: a 5-D tensor with all its data, ``general.alignment`` as an array,
    nested arrays, 64-byte names, non-UTF-8 names, an empty key, a tensor count 0 file with infos."""
    arch = kv_str("general.architecture", "llama")
    five = raw_gguf([arch], [("a.weight", (2, 1, 1, 1, 2), F32_T, 0)], bytes(16))
    return [
        ("special/5-d", five),
        ("special/8-d", raw_gguf([arch], [("a.weight", (1,) * 8, F32_T, 0)], bytes(4))),
        ("special/alignment-array-1", with_data([arch, _align_array(1)], [("a.weight", (4,), F32_T)])),
        ("special/alignment-array-0", raw_gguf([arch, _align_array(0)], [("a.weight", (4,), F32_T, 0)], bytes(16))),
        ("special/alignment-array-2", raw_gguf([arch, _align_array(2)], [("a.weight", (4,), F32_T, 0)], bytes(16))),
        (
            "special/nested-array",
            raw_gguf([arch, raw_kv("x.nested", ARR, struct.pack("<IQ", ARR, 1) + struct.pack("<IQ", U32, 0))], [], b""),
        ),
        ("special/name64", with_data([arch], [("n" * 64, (4,), F32_T)])),
        ("special/empty-key", raw_gguf([arch, kv_u32("", 1)], [], b"")),
        ("special/key-not-utf8", raw_gguf([arch, raw_kv(b"x.\xff\xfe", U32, struct.pack("<I", 1))], [], b"")),
        ("special/tensor-not-utf8", raw_gguf([arch], [(b"w.\xff", (4,), F32_T, 0)], bytes(16))),
        ("special/data-start-past-eof", _ends_in_padding(arch)),
        ("special/zero-dim-4d", with_data([arch], [("z.weight", (4, 3, 0, 2), F32_T)])),
        ("special/overflow-then-zero", raw_gguf([arch], [("o.weight", (1 << 32, 1 << 32, 0), F32_T, 0)], b"")),
    ]


def _ends_in_padding(arch: bytes) -> bytes:
    """An empty tensor, and the file ends after the tensor infos, before the padding to the data section."""
    b = raw_gguf([arch], [("e.weight", (0,), F32_T, 0)], b"")
    end = layout(b).infos_end
    assert end % 32, end
    return b[:end]


def corpus() -> list[tuple[str, bytes]]:
    """Every seed (valid) and every mutation of every seed, and the special cases: several hundred files."""
    cases: list[tuple[str, bytes]] = []
    for name, b in seeds().items():
        cases.append((f"{name}/seed", b))
        cases += mutations(name, b)
    return cases + special_cases()
