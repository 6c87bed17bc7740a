"""A CPU emulation of bitcos_cuda_mul_mat_mmq_kernel's index math (csrc/cuda/bitcos-cuda-mmq.cuh), statement by
statement: thread roles, the width-4 prefix sum of popcounts and the per-row sign cursor, the k-slab layout
of the shared tiles, the wmma fragments' element mapping (row-major A, col-major B, ldm 16, the accumulator
stored row-major) and the per-32 scales, in fp32 where the kernel is. Reads the real encoded bytes (blocks,
companion) through the companion header as the kernel does. No GPU here: this is what checks the tile
indexing in CI (tests/test_cuda.py::test_mmq_tile_emulation); the kernel itself runs only on a GPU.
"""

from __future__ import annotations

import numpy as np

BM, BN, BK, THREADS, WORDS, SLABS = 32, 64, 128, 128, 4, 8
G128, PT, MATRIX, ROW, B128, B256 = range(6)


class Comp:
    def __init__(self, blocks: np.ndarray, comp: np.ndarray) -> None:
        self.b = np.ascontiguousarray(blocks).view(np.uint8).reshape(-1)
        self.c = np.ascontiguousarray(comp).view(np.uint8).reshape(-1)
        c = self.c
        self.variant = int(c[6])
        self.k = self.u64(8)
        self.n_words = self.k // 32
        self.row_bytes = self.k // 128 * (18 if self.variant == G128 else 16) if self.variant <= PT else self.k // 8
        self.scales = self.u64(40)
        n_mats = self.u64(24)
        self.rows_per_mat = self.u64(16) // (n_mats or 1)
        sb = 128 if self.variant in (G128, B128) else 256 if self.variant == B256 else 0
        self.scales_per_row = self.k // sb if sb else 0
        self.word_shift = 3 if sb == 256 else 2
        self.pool = self.u64(64)

    def u64(self, off: int) -> int:
        return int(self.c[off : off + 8].view("<u8")[0])

    def u16(self, buf: np.ndarray, off: int) -> int:
        return int(buf[off : off + 2].view("<u2")[0])

    def u32(self, buf: np.ndarray, off: int) -> int:
        return int(buf[off : off + 4].view("<u4")[0])

    def row_sign_pos(self, r: int) -> int:
        g = int(self.c[7])
        base = self.u64(self.u64(48) + 8 * (r >> g))
        return base + self.u16(self.c, self.u64(56) + 2 * r)

    def sign_window(self, pos: int) -> int:
        lo = self.u32(self.c, self.pool + 4 * (pos >> 5))
        hi = self.u32(self.c, self.pool + 4 * ((pos >> 5) + 1))
        return ((hi << 32 | lo) >> (pos & 31)) & 0xFFFFFFFF

    def bitmap_word(self, row: int, w: int) -> int:
        if self.variant != G128:
            return self.u32(self.b, row + 4 * w)
        off = row + (w // 4) * 18 + 4 * (w % 4)
        return self.u16(self.b, off) | self.u16(self.b, off + 2) << 16

    def word_scale(self, row: int, r: int, w: int) -> np.float32:
        if self.variant == G128:
            d = self.u16(self.b, row + (w // 4) * 18 + 16)
        elif self.scales_per_row:
            d = self.u16(self.c, self.scales + 2 * (r * self.scales_per_row + (w >> self.word_shift)))
        else:
            return np.float32(1)
        return np.float32(np.array([d], "<u2").view(np.float16)[0])

    def row_scale(self, r: int) -> np.float32:
        s = self.c[self.scales :].view(np.uint8)
        if self.variant in (PT, MATRIX):
            return np.float32(s[4 * (r // self.rows_per_mat) :][:4].view("<f4")[0])
        if self.variant == ROW:
            return np.float32(s[4 * r :][:4].view("<f4")[0])
        return np.float32(1)


def lut_entry(key: int) -> int:
    m, s, e = key & 15, key >> 4, 0
    for i in range(4):
        if (m >> i) & 1:
            rank = bin(m & ((1 << i) - 1)).count("1")
            e |= (0xFF if (s >> rank) & 1 else 0x01) << (8 * i)
    return e


LUT = [lut_entry(e) for e in range(256)]


def quantize_q8(x: np.ndarray, k_pad: int) -> tuple[np.ndarray, np.ndarray]:
    """bitcos_cuda_quantize_q8_kernel: q (n_x, k_pad) int8, d (n_x, k_pad / 32) fp32."""
    n_x, k = x.shape
    xp = np.zeros((n_x, k_pad), np.float32)
    xp[:, :k] = x
    xb = xp.reshape(n_x, k_pad // 32, 32)
    amax = np.abs(xb).max(axis=2)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(amax[:, :, None] > 0, np.rint(xb / d[:, :, None]), 0)
    return np.clip(q, -127, 127).astype(np.int8).reshape(n_x, k_pad), d


def emulate(
    blocks: np.ndarray, comp: np.ndarray, x: np.ndarray, row0: int, rows: int, codes_out: np.ndarray | None = None
) -> np.ndarray:
    """dst (n_x, rows) as the kernel computes it; codes_out (rows, k) receives the decoded W tiles."""
    L = Comp(blocks, comp)
    n_x, k = x.shape
    k_pad = (k + BK - 1) // BK * BK
    q, d = quantize_q8(x, k_pad)
    dst = np.full((n_x, rows), np.nan, np.float32)

    def put(c: int, r: int, v: np.float32) -> None:
        dst[c, r] = v

    _block_rows(L, q.reshape(-1), d.reshape(-1), k_pad, row0, rows, n_x, lambda c: c, put, codes_out)
    return dst


def emulate_id(
    blocks: np.ndarray,
    comp: np.ndarray,
    x: np.ndarray,
    n_experts: int,
    rows: int,
    ne11: int,
    ids: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """MUL_MAT_ID through the batched kernel: x (n_tok * ne11, k) (column t * ne11 + j: token t's column j), ids
    (n_tok, n_used); bitcos_cuda_mmq_id_slots_kernel's grouping (in a random order, as atomics give) and the tile
    kernel's block z loop; dst (n_tok, n_used, rows), NaN where an id is out of range."""
    L = Comp(blocks, comp)
    n_tok, n_used = ids.shape
    k = x.shape[1]
    k_pad = (k + BK - 1) // BK * BK
    q, d = quantize_q8(x, k_pad)
    cap = n_used * n_tok
    slots = np.zeros((n_experts, cap), np.int64)
    counts = np.zeros(n_experts, np.int64)
    for i in rng.permutation(cap):
        t, u = divmod(int(i), n_used)
        e = int(ids[t, u])
        if 0 <= e < n_experts:
            slots[e, counts[e]] = i
            counts[e] += 1
    dst = np.full((n_tok, n_used, rows), np.nan, np.float32)
    for e in range(n_experts):
        sl = slots[e]

        def q_col(c: int, sl: np.ndarray = sl) -> int:
            return (int(sl[c]) // n_used) * ne11 + (int(sl[c]) % n_used) % ne11

        def put(c: int, r: int, v: np.float32, sl: np.ndarray = sl) -> None:
            t, u = divmod(int(sl[c]), n_used)
            dst[t, u, r] = v

        _block_rows(
            L,
            q.reshape(-1),
            d.reshape(-1),
            k_pad,
            e * rows,
            rows,
            int(counts[e]),
            q_col,
            put,
            None,
            n_y=(cap + BN - 1) // BN,
        )
    return dst


def _block_rows(
    L: Comp,
    qf: np.ndarray,
    df: np.ndarray,
    k_pad: int,
    row0: int,
    rows: int,
    n_x: int,
    q_col,
    put,
    codes_out: np.ndarray | None,
    n_y: int | None = None,
) -> None:
    """The tile kernel's blocks (x, y) for one z: n_x tile columns, column c reading quantized column q_col(c),
    output (c, r) going to put(c, r, value)."""
    nqb = k_pad // 32
    for bx in range((rows + BM - 1) // BM):
        for by in range(n_y if n_y is not None else (n_x + BN - 1) // BN):
            if by * BN >= n_x:
                continue  # the kernel's early exit (ID mode)
            r0, c0 = bx * BM, by * BN
            cursor, row_ok, gr, rowp = [0] * THREADS, [False] * THREADS, [0] * THREADS, [0] * THREADS
            for tid in range(THREADS):
                dr = tid // WORDS
                row_ok[tid] = r0 + dr < rows
                gr[tid] = row0 + r0 + dr
                rowp[tid] = gr[tid] * L.row_bytes if row_ok[tid] else 0
                cursor[tid] = L.row_sign_pos(gr[tid]) if row_ok[tid] else 0
            acc = np.zeros((THREADS // 32, 32, 2, 8), np.float32)  # [warp][lane][f][j]
            for w0 in range(0, L.n_words, WORDS):
                As = np.zeros(SLABS * BM * 16, np.uint8)
                Bs = np.zeros(SLABS * BN * 16, np.uint8)
                Ws = np.zeros((BM, WORDS), np.float32)
                Xs = np.zeros((BN, WORDS), np.float32)
                word, n, active = [0] * THREADS, [0] * THREADS, [False] * THREADS
                for tid in range(THREADS):
                    dw = tid % WORDS
                    w = w0 + dw
                    active[tid] = row_ok[tid] and w < L.n_words
                    word[tid] = L.bitmap_word(rowp[tid], w) if active[tid] else 0
                    n[tid] = bin(word[tid]).count("1")
                before = list(n)
                o = 1
                while o < WORDS:  # __shfl_up_sync(.., o, width 4)
                    prev = list(before)
                    for tid in range(THREADS):
                        if tid % WORDS >= o:
                            before[tid] += prev[tid - o]
                    o <<= 1
                for tid in range(THREADS):
                    dr, dw = tid // WORDS, tid % WORDS
                    total = before[(tid // WORDS) * WORDS + WORDS - 1]  # __shfl_sync(.., 3, width 4)
                    cw = [0] * 8
                    ws = np.float32(0)
                    if active[tid]:
                        s = L.sign_window(cursor[tid] + before[tid] - n[tid])
                        for j in range(8):
                            m = (word[tid] >> (4 * j)) & 15
                            cw[j] = LUT[m | (s & 15) << 4]
                            s >>= bin(m).count("1")
                        ws = L.word_scale(rowp[tid], gr[tid], w0 + dw)
                    cursor[tid] += total
                    a = np.array(cw, "<u4").view(np.uint8)
                    As[(2 * dw) * BM * 16 + dr * 16 :][:16] = a[:16]
                    As[(2 * dw + 1) * BM * 16 + dr * 16 :][:16] = a[16:]
                    Ws[dr][dw] = ws
                k0 = w0 * 32
                for i in range(BN * SLABS):
                    cn, slab = i // SLABS, i % SLABS
                    c = c0 + cn
                    if c < n_x:
                        Bs[slab * BN * 16 + cn * 16 :][:16] = qf[q_col(c) * k_pad + k0 + 16 * slab :][:16].view(
                            np.uint8
                        )
                for i in range(BN * WORDS):
                    cn, b = i // WORDS, i % WORDS
                    c = c0 + cn
                    Xs[cn][b] = df[q_col(c) * nqb + w0 + b] if c < n_x else 0
                if codes_out is not None:
                    for dr in range(BM):
                        if r0 + dr < rows:
                            for dw in range(WORDS):
                                if w0 + dw < L.n_words:
                                    kk = (w0 + dw) * 32
                                    codes_out[r0 + dr, kk : kk + 16] = As[(2 * dw) * BM * 16 + dr * 16 :][:16].view(
                                        np.int8
                                    )
                                    codes_out[r0 + dr, kk + 16 : kk + 32] = As[(2 * dw + 1) * BM * 16 + dr * 16 :][
                                        :16
                                    ].view(np.int8)
                As8, Bs8 = As.view(np.int8), Bs.view(np.int8)
                for warp in range(THREADS // 32):
                    wm, wn = warp // 2, warp % 2
                    for b in range(WORDS):
                        # load_matrix_sync(row_major, ldm 16): A[i][kk] = p[i * 16 + kk]
                        a0 = As8[(2 * b) * BM * 16 + wm * 16 * 16 :][:256].reshape(16, 16).astype(np.int32)
                        a1 = As8[(2 * b + 1) * BM * 16 + wm * 16 * 16 :][:256].reshape(16, 16).astype(np.int32)
                        for f in range(2):
                            cn0 = wn * 32 + f * 16
                            # load_matrix_sync(col_major, ldm 16): B[kk][n] = p[n * 16 + kk]
                            b0 = Bs8[(2 * b) * BN * 16 + cn0 * 16 :][:256].reshape(16, 16).T.astype(np.int32)
                            b1 = Bs8[(2 * b + 1) * BN * 16 + cn0 * 16 :][:256].reshape(16, 16).T.astype(np.int32)
                            Cs = (a0 @ b0 + a1 @ b1).reshape(-1)  # store_matrix_sync(mem_row_major, 16)
                            for lane in range(32):
                                for j in range(8):
                                    e = lane + 32 * j
                                    sc = np.float32(Ws[wm * 16 + e // 16][b] * Xs[cn0 + e % 16][b])
                                    acc[warp, lane, f, j] = np.float32(
                                        acc[warp, lane, f, j] + np.float32(np.float32(Cs[e]) * sc)
                                    )
            for warp in range(THREADS // 32):
                wm, wn = warp // 2, warp % 2
                for f in range(2):
                    for lane in range(32):
                        for j in range(8):
                            e = lane + 32 * j
                            r, c = r0 + wm * 16 + e // 16, c0 + wn * 32 + f * 16 + e % 16
                            if r < rows and c < n_x:
                                put(c, r, np.float32(acc[warp, lane, f, j] * L.row_scale(row0 + r)))
