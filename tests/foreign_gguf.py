"""Foreign ternary GGUF inputs for the tests, written without the product's code: a minimal GGUF v3
reader/writer of its own (not gguf-py), writers modelled on each producer's original quantizer (bitnet.cpp's
``quantize_i2_s`` in its three build configurations, Prism's ``quantize_row_pq2_0_ref`` for the legacy
group-128 Q2_0), and element-by-element dequantizers written from the layout descriptions (docs/FORMAT.md
§7.1). Not a test module itself."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np

TYPE_ID = {"I2_S": 36, "Q2_0": 42, "PQ2_0": 142, "PTQ1_0": 143, "TQ1_0": 34, "TQ2_0": 35, "F16": 1, "F32": 0}


# --- a minimal GGUF v3 reader/writer of its own --------------------------------------------------------


def _kv_string(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", 8) + struct.pack("<Q", len(v)) + v


def _kv_u32(key: str, value: int) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<II", 4, value)


_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip(b: bytes, vt: int, off: int) -> int:
    if vt == 8:
        return off + 8 + struct.unpack_from("<Q", b, off)[0]
    if vt == 9:
        it, n = struct.unpack_from("<IQ", b, off)
        off += 12
        if it in _SCALAR:
            return off + n * _SCALAR[it]
        for _ in range(n):
            off = _skip(b, it, off)
        return off
    return off + _SCALAR[vt]


def read_raw(path: Path) -> tuple[int, bytes, list[tuple[str, tuple[int, ...], int, bytes]]]:
    """(kv count, raw kv section, [(name, ne, type id, data bytes up to the next tensor or end)])."""
    b = path.read_bytes()
    assert b[:4] == b"GGUF"
    _v, n_t, n_kv = struct.unpack_from("<IQQ", b, 4)
    off = 24
    for _ in range(n_kv):
        kl = struct.unpack_from("<Q", b, off)[0]
        assert b[off + 8 : off + 8 + kl] != b"general.alignment"
        off += 8 + kl
        off = _skip(b, struct.unpack_from("<I", b, off)[0], off + 4)
    kv = b[24:off]
    infos = []
    for _ in range(n_t):
        nl = struct.unpack_from("<Q", b, off)[0]
        name = b[off + 8 : off + 8 + nl].decode()
        off += 8 + nl
        nd = struct.unpack_from("<I", b, off)[0]
        ne = struct.unpack_from(f"<{nd}Q", b, off + 4)
        off += 4 + 8 * nd
        tt, o = struct.unpack_from("<IQ", b, off)
        off += 12
        infos.append((name, tuple(ne), tt, o))
    start = (off + 31) // 32 * 32
    ends = sorted(o for *_x, o in infos)[1:] + [len(b) - start]
    end_of = dict(zip(sorted(o for *_x, o in infos), ends))
    return n_kv, kv, [(n, ne, tt, b[start + o : start + end_of[o]]) for n, ne, tt, o in infos]


def write_raw(path: Path, n_kv: int, kv: bytes, tensors: list[tuple[str, tuple[int, ...], int, bytes]]) -> Path:
    """GGUF v3, alignment 32: header, the raw kv section, tensor infos, data (each padded to 32)."""
    infos, data, off = b"", b"", 0
    for name, ne, tt, raw in tensors:
        nm = name.encode()
        infos += struct.pack("<Q", len(nm)) + nm + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        infos += struct.pack("<IQ", tt, off)
        pad = (-len(raw)) % 32
        data += raw + b"\0" * pad
        off += len(raw) + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), n_kv) + kv + infos
    head += b"\0" * ((-len(head)) % 32)
    path.write_bytes(head + data)
    return path


# --- the dequantizer from the layout description, one weight at a time (vectorized over weights) ---------


def _f16(raw: bytes, at: np.ndarray) -> np.ndarray:
    b = np.frombuffer(raw, dtype=np.uint8)
    return (b[at].astype(np.uint16) | (b[at + 1].astype(np.uint16) << 8)).view(np.float16).astype(np.float32)


def spec_dequantize(fmt: str, raw: bytes, ne: tuple[int, ...]) -> np.ndarray:
    """fp32 (rows, K) of a tensor's data bytes, each weight from its own byte and bit position."""
    k, rows = ne[0], math.prod(ne[1:])
    b = np.frombuffer(raw, dtype=np.uint8)
    r, w = np.meshgrid(np.arange(rows), np.arange(k), indexing="ij")
    if fmt in ("Q2_0", "PQ2_0"):
        blk = 64 if fmt == "Q2_0" else 128
        bb = 2 + blk // 4
        base = (r * (k // blk) + w // blk) * bb  # start of the weight's block
        j = w % blk
        code = ((b[base + 2 + j // 4] >> (2 * (j % 4))) & 3).astype(np.int32) - 1
        d = _f16(raw, base)
    elif fmt == "PTQ1_0":
        base = (r * (k // 128) + w // 128) * 28
        j = w % 128
        byte = np.where(j < 80, j % 16, np.where(j < 120, 16 + (j - 80) % 8, 24 + (j - 120) % 2))
        n = np.where(j < 80, j // 16, np.where(j < 120, (j - 80) // 8, (j - 120) // 2))
        v = b[base + byte].astype(np.int64)
        code = ((v * 3**n) % 256 * 3) // 256 - 1
        d = _f16(raw, base + 26)
    elif fmt in ("I2_S", "I2_S:x86", "I2_S:arm", "I2_S:x86-rows4"):
        field = i2_s_field(b, r, w, k, fmt.partition(":")[2] or "x86")
        assert np.all(field != 3)
        code = field.astype(np.int32) - 1
        d = np.float32(struct.unpack_from("<f", raw, rows * k // 4)[0])
    elif fmt == "Q2_0:g128":
        return spec_dequantize("PQ2_0", raw, ne)
    else:
        raise AssertionError(fmt)
    return (code.astype(np.float32) * d).astype(np.float32)


def i2_s_field(b: np.ndarray, r: np.ndarray, w: np.ndarray, k: int, layout: str) -> np.ndarray:
    """The 2-bit field of weight (row r, column w) of I2_S code bytes ``b`` in ``layout``: where bitnet.cpp's
    quantize_i2_s puts it in each build configuration."""
    if layout == "x86-rows4":  # no ACT_PARALLEL: byte (r // 4) * k + w, row r % 4 from the top
        return (b[(r // 4) * k + w] >> (6 - 2 * (r % 4))) & 3
    qk, per = (128, 32) if layout == "x86" else (64, 16)  # QK_I2_S; bytes per block
    f = r * k + w  # the weight's index in the flattened tensor
    pos = f % qk
    return (b[(f // qk) * per + pos % per] >> (6 - 2 * (pos // per))) & 3


def quantize_i2_s(x: np.ndarray, layout: str, tail_junk: bytes = b"") -> bytes:
    """bitnet.cpp's quantize_i2_s on fp32 rows ``x`` (rows, k), written weight by weight as its loops do:
    scale = max|x| (in double), field 1 for |x| < 1e-6, else 2 if x * scale > 0, else 0; the code bytes in
    ``layout``; then the fp32 scale and 28 bytes the C function leaves unwritten (``tail_junk``)."""
    rows, k = x.shape
    n = rows * k
    flat = x.reshape(-1).astype(np.float64)
    scale = float(np.max(np.abs(flat))) if n else 0.0
    q8 = np.where(np.abs(flat) < 1e-6, 1, np.where(flat * scale > 0, 2, 0)).astype(np.uint8)
    out = np.zeros(n // 4, dtype=np.uint8)
    if layout == "x86-rows4":
        assert rows % 4 == 0
        q = q8.reshape(rows, k)
        for rg in range(rows // 4):
            out[rg * k : (rg + 1) * k] = (q[4 * rg] << 6) | (q[4 * rg + 1] << 4) | (q[4 * rg + 2] << 2) | q[4 * rg + 3]
    else:
        qk, per = (128, 32) if layout == "x86" else (64, 16)
        for j in range(qk):  # weight j of every block: its byte and field
            group_idx, group_pos = j // per, j % per
            out[group_pos::per][: n // qk] |= (q8[j::qk][: n // qk] << (6 - 2 * group_idx)).astype(np.uint8)
    tail = struct.pack("<f", np.float32(scale)) + (tail_junk + bytes(28))[:28]
    return out.tobytes() + tail


def quantize_q2_0_g128(x: np.ndarray) -> bytes:
    """Prism's quantize_row_pq2_0_ref, which its older releases wrote under Q2_0's id 42: per 128 weights,
    d = max|x| stored as fp16 first, then 32 bytes of 2-bit fields q = round(x / d) + 1 clamped to 0..3
    (C's roundf: half away from zero), weight j in bits 2(j % 4) of byte j / 4."""
    rows, k = x.shape
    out = bytearray()
    for row in x.astype(np.float32):
        for blk in row.reshape(-1, 128):
            amax = float(np.max(np.abs(blk)))
            inv = 1.0 / amax if amax else 0.0
            v = blk.astype(np.float64) * inv
            q = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5) + 1, 0, 3).astype(np.uint8)
            qs = q.reshape(32, 4)
            out += struct.pack("<e", amax) + bytes(qs[:, 0] | (qs[:, 1] << 2) | (qs[:, 2] << 4) | (qs[:, 3] << 6))
    return bytes(out)


def ternary_floats(rng: np.random.Generator, rows: int, k: int, z: float, scale: float) -> np.ndarray:
    """fp32 rows holding {-scale, 0, +scale} with zero density about ``z``."""
    codes = rng.choice(np.array([-1, 0, 1], dtype=np.int8), size=(rows, k), p=[(1 - z) / 2, z, (1 - z) / 2])
    return codes.astype(np.float32) * np.float32(scale)
