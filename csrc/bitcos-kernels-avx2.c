// AVX2 BITCOS kernel (x86-64-v3: AVX2, FMA, BMI2, F16C): bitcos_mm_avx2, one entry of the kernel table.
//
// Contract: bitcos-kernels.h (results bit-identical to bitcos_mm_generic). Shared x86 parts (sign decode,
// staging, tile scale, tile loop): bitcos-kernels-x86.h. Design and measurements: docs/KERNELS.md.
//
// Codes: P and N (bitcos-kernels-x86.h) expanded to bytes (broadcast, pshufb, and, cmpeq) give u = t + 1;
// vpmaddubsw over 32-byte chunks, summed in int16 (|word| <= 8 * 512), then vpmaddwd(., 1) gives the
// contract's 8 lanes directly, so the float part needs no fold.
// GEMV (one column): each row decodes straight into the dot products, one row after the other over a span of
// chunks. GEMM (several columns): each row's chunk is decoded once into a code buffer, then serves every
// column of the tile.
// Compile with -ffp-contract=off like every kernel file: the only fused operation allowed is the contract's
// explicit FMA (BITCOS_FMA), written as an intrinsic.
#include "bitcos-kernels.h"

#if defined(BITCOS_BUILD_AVX2)

#    include "bitcos-kernels-x86.h"

// The contract's FMA(a, b, c), 8 lanes.
X86_ALWAYS_INLINE __m256 avx2_fma8(__m256 a, __m256 b, __m256 c) {
    return X86_CONTRACT_FMA(_mm256, a, b, c);
}

// Codes u = t + 1 in {0, 1, 2} of 64 weights from the presence word at pbits and the negative-lane word n,
// as two vectors of 32. Each word is broadcast once, pshufb copies byte i of the word to lanes 8i .. 8i+7,
// and-ing with 1, 2, 4, .. 128 and cmpeq give -1 where lane j's bit is set; u = (1 - pm) & ~nm.
X86_ALWAYS_INLINE void avx2_codes64(const uint8_t * pbits, uint64_t n, __m256i * u0, __m256i * u1) {
    const __m256i idx_lo = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                            3, 3, 3, 3, 3, 3, 3);
    const __m256i idx_hi = _mm256_setr_epi8(4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7,
                                            7, 7, 7, 7, 7, 7, 7);
    const __m256i sel    = _mm256_set1_epi64x((long long) 0x8040201008040201ULL);
    const __m256i one    = _mm256_set1_epi8(1);
    const __m256i bp     = _mm256_set1_epi64x((long long) x86_load_u64(pbits));
    const __m256i bn     = _mm256_set1_epi64x((long long) n);
    const __m256i pm0    = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(bp, idx_lo), sel), sel);
    const __m256i nm0    = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(bn, idx_lo), sel), sel);
    const __m256i pm1    = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(bp, idx_hi), sel), sel);
    const __m256i nm1    = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(bn, idx_hi), sel), sel);
    *u0                  = _mm256_andnot_si256(nm0, _mm256_sub_epi8(one, pm0));
    *u1                  = _mm256_andnot_si256(nm1, _mm256_sub_epi8(one, pm1));
}

// Decodes the 128 codes of one unit (its bitmap at blk) into u[0..3].
X86_ALWAYS_INLINE void avx2_decode_block(const uint8_t * blk, const uint8_t * pool, uint64_t * cursor, __m256i u[4]) {
    const uint64_t n0 = x86_negatives(x86_load_u64(blk), pool, cursor);
    const uint64_t n1 = x86_negatives(x86_load_u64(blk + X86_WORD_BYTES), pool, cursor);
    avx2_codes64(blk, n0, &u[0], &u[1]);
    avx2_codes64(blk + X86_WORD_BYTES, n1, &u[2], &u[3]);
}

// int16 lanes of sum u*q over the 128 weights of one unit (4 x 32): |word| <= 4 * 512.
X86_ALWAYS_INLINE __m256i avx2_dot_block(const __m256i u[4], const int8_t * q) {
    __m256i s = _mm256_maddubs_epi16(u[0], _mm256_loadu_si256((const __m256i *) q));
    s         = _mm256_add_epi16(s, _mm256_maddubs_epi16(u[1], _mm256_loadu_si256((const __m256i *) (q + 32))));
    s         = _mm256_add_epi16(s, _mm256_maddubs_epi16(u[2], _mm256_loadu_si256((const __m256i *) (q + 64))));
    return _mm256_add_epi16(s, _mm256_maddubs_epi16(u[3], _mm256_loadu_si256((const __m256i *) (q + 96))));
}

// A row's scale source for the float part: the scale of its unit 0 (PER_256, PER_128) or its fp32 scale
// (PER_ROW); PER_128_IN_BLOCK's are read through the row's bitmap pointer.
typedef struct {
    const uint8_t * block;
    float           row;
} avx2_row_scale;

X86_ALWAYS_INLINE avx2_row_scale avx2_row_scale_of(const bitcos_rows * w, int ts, int64_t r) {
    avx2_row_scale s = { NULL, 0.0f };
    if (ts == TILE_SCALE_PER_ROW)
        s.row = w->row_scale[r];
    else if (ts == TILE_SCALE_PER_256 || ts == TILE_SCALE_PER_128)
        s.block = x86_row_scales(w, r);
    return s;
}

// Float part of one Q8_K block b for one (row, column): s0 / s are the int16 dot products of half 0 / the
// whole block (s = s0 when the block has one half), per the contract, with the tile scale.
X86_ALWAYS_INLINE __m256 avx2_block_float(__m256i s0, __m256i s, __m256i qsum, x86_shape sh, const int ts,
                                          const uint8_t * row, avx2_row_scale rs, int64_t b, int halves, float yd,
                                          float dpt, __m256 acc) {
    const __m256i ones16 = _mm256_set1_epi16(1);
    const __m256i lf     = _mm256_sub_epi32(_mm256_madd_epi16(s, ones16), qsum);
    if (ts == TILE_SCALE_SHARED) {
        return avx2_fma8(_mm256_cvtepi32_ps(lf), _mm256_set1_ps(dpt), acc);
    }
    if (ts == TILE_SCALE_PER_ROW) {
        return avx2_fma8(_mm256_cvtepi32_ps(lf), _mm256_set1_ps(yd * rs.row), acc);
    }
    if (ts == TILE_SCALE_PER_256) {
        const float e = x86_fp16_to_fp32(x86_load_u16(rs.block + (size_t) b * sh.sstride));
        return avx2_fma8(_mm256_cvtepi32_ps(lf), _mm256_set1_ps(yd * e), acc);
    }
    // v1 G128: the scale after each unit's bitmap, addressed from the row (x86_covered: block_scale is the
    // row's bits + 16, at the block stride), which the bitmap reads already hold; B128: adjacent fp16
    const int       in_block = ts == TILE_SCALE_PER_128_IN_BLOCK;
    const size_t    st       = in_block ? X86_G128_BYTES : sizeof(uint16_t);
    const uint8_t * p0       = in_block ? row + (size_t) (2 * b) * X86_G128_BYTES + offsetof(block_bitcos_g128, d) :
                                          rs.block + (size_t) (2 * b) * sizeof(uint16_t);
    const uint16_t  e0       = x86_load_u16(p0);
    const uint16_t  e1       = halves == 2 ? x86_load_u16(p0 + st) : e0;
    const __m256    d0       = _mm256_set1_ps(yd * x86_fp16_to_fp32(e0));
    if (e0 == e1) {
        return avx2_fma8(_mm256_cvtepi32_ps(lf), d0, acc);
    }
    // half 0 subtracts the sums of positions 0..127 (lanes 0..3), half 1 those of 128..255 (lanes 4..7)
    const __m256i l0 =
        _mm256_sub_epi32(_mm256_madd_epi16(s0, ones16), _mm256_blend_epi32(qsum, _mm256_setzero_si256(), 0xF0));
    const __m256i l1 = _mm256_sub_epi32(lf, l0);
    acc              = avx2_fma8(_mm256_cvtepi32_ps(l0), d0, acc);
    return avx2_fma8(_mm256_cvtepi32_ps(l1), _mm256_set1_ps(yd * x86_fp16_to_fp32(e1)), acc);
}

// GEMV of one Q8_K block b of a row (bitmap of its first unit at blk; its column data block j of chunk ch).
X86_ALWAYS_INLINE __m256 avx2_gemv_block(const bitcos_rows * w, x86_shape sh, const int ts, const uint8_t * row,
                                         const uint8_t * blk, avx2_row_scale rs, int64_t b, const int halves,
                                         const x86_col_chunk * ch, int j, uint64_t * cur, __m256 acc) {
    __m256i u[4];
#    if X86_BITMAP_PREFETCH_BYTES
    _mm_prefetch((const char *) (row + (size_t) (2 * b) * sh.ub + X86_BITMAP_PREFETCH_BYTES), _MM_HINT_T0);
#    endif
#    if X86_POOL_PREFETCH_BYTES
    _mm_prefetch((const char *) (w->pool + (*cur >> 3) + X86_POOL_PREFETCH_BYTES), _MM_HINT_T0);
#    endif
    avx2_decode_block(blk, w->pool, cur, u);
    const __m256i s0v = avx2_dot_block(u, ch->qs[j]);
    __m256i       sv  = s0v;
    if (halves == 2) {
        avx2_decode_block(blk + sh.ub, w->pool, cur, u);
        sv = _mm256_add_epi16(s0v, avx2_dot_block(u, ch->qs[j] + QK_BITCOS));
    }
    return avx2_block_float(s0v, sv, ch->qsum[j], sh, ts, row, rs, b, halves, ch->yd[j], ch->dpt[j], acc);
}

// GEMV, one row over the chunks [b0 .. s1) of a span (chunk i staged in cc[i]): decodes straight into the
// dot products. The blocks before sh.nfull have two whole units in place (no halves test, no last-block
// test); the row's last block may have one unit, or come from the row's copy `last` (x86_copy_last).
X86_ALWAYS_INLINE __m256 avx2_gemv_row_span(const bitcos_rows * w, x86_shape sh, const int ts, const uint8_t * row,
                                            const uint8_t * last, avx2_row_scale rs, uint64_t * cursor, int64_t s0,
                                            int64_t s1, const x86_col_chunk * cc, __m256 acc) {
    sh.ub        = X86_TILE_UNIT_BYTES(ts);
    uint64_t cur = *cursor;
    for (int64_t b0 = s0; b0 < s1; b0 += X86_CHUNK_BLOCKS) {
        const x86_col_chunk * ch  = &cc[(b0 - s0) / X86_CHUNK_BLOCKS];
        const int             nbk = x86_chunk_blocks(b0, sh.nby);
        const int             nd  = sh.nfull - b0 >= nbk ? nbk : (int) (sh.nfull - b0); // blocks with two whole units
        int                   j   = 0;
        for (; j < nd; ++j) {
            const int64_t b = b0 + j;
            acc = avx2_gemv_block(w, sh, ts, row, row + (size_t) (2 * b) * sh.ub, rs, b, 2, ch, j, &cur, acc);
        }
        for (; j < nbk; ++j) {
            const int64_t b = b0 + j;
            acc = avx2_gemv_block(w, sh, ts, row, x86_block_bits(sh, row, last, b), rs, b, x86_halves(b, sh.nb), ch, j,
                                  &cur, acc);
        }
    }
    *cursor = cur;
    return acc;
}

// GEMV of the nrt rows from r0 against one column yc (dc: the rows' outputs): one row at a time over a span
// of up to X86_GEMV_SPAN_CHUNKS chunks (the column staged in cc[0 ..]), so the bitmap and the sign pool are
// each read as one sequential stream through the tile (KERNELS.md §5).
static void avx2_gemv_tile(const bitcos_rows * w, int64_t r0, int nrt, const bitcos_q8_K * yc, float * dc) {
    const x86_shape            sh = x86_shape_of(w);
    float                      scale;
    const int                  ts = x86_tile_scale_of(w, sh, r0, nrt, &scale);
    _Alignas(64) x86_col_chunk cc[X86_GEMV_SPAN_CHUNKS];
    _Alignas(64) __m256        acc[X86_TILE_ROWS];
    x86_last_block             last[X86_TILE_ROWS];
    uint64_t                   cursor[X86_TILE_ROWS];
    x86_load_cursors(w, r0, nrt, cursor);
    x86_copy_last(w, sh, r0, nrt, last);
    for (int r = 0; r < nrt; ++r)
        acc[r] = _mm256_setzero_ps();
    for (int64_t s0 = 0; s0 < sh.nby; s0 += X86_GEMV_SPAN_CHUNKS * X86_CHUNK_BLOCKS) {
        const int64_t s1 = sh.nby - s0 < X86_GEMV_SPAN_CHUNKS * X86_CHUNK_BLOCKS ?
                               sh.nby :
                               s0 + X86_GEMV_SPAN_CHUNKS * X86_CHUNK_BLOCKS;
        for (int64_t b0 = s0; b0 < s1; b0 += X86_CHUNK_BLOCKS) {
            x86_stage_column(yc, b0, x86_chunk_blocks(b0, sh.nby), sh.nb, scale, &cc[(b0 - s0) / X86_CHUNK_BLOCKS]);
        }
        for (int r = 0; r < nrt; ++r) {
            const avx2_row_scale rs = avx2_row_scale_of(w, ts, r0 + r);
#    define AVX2_GEMV_ROW(m) \
        acc[r] = avx2_gemv_row_span(w, sh, m, x86_row(w, r0 + r), last[r].b, rs, &cursor[r], s0, s1, cc, acc[r])
            X86_TILE_SCALE_DISPATCH(ts, AVX2_GEMV_ROW)
#    undef AVX2_GEMV_ROW
        }
    }
    for (int r = 0; r < nrt; ++r)
        dc[r] = x86_reduce8(acc[r]);
}

// One row's chunk (nbk Q8_K blocks from b0) against the nct columns of the tile: decoded once into ubuf, then
// used by every column (acc[c]: the row's accumulator of column c). The blocks before sh.nfull have two whole
// units in place (no halves test, no last-block test), as in the GEMV.
X86_ALWAYS_INLINE void avx2_gemm_row(const bitcos_rows * w, x86_shape sh, const int ts, const uint8_t * row,
                                     const uint8_t * last, avx2_row_scale rs, uint64_t * cursor, int64_t b0, int nbk,
                                     __m256i (*ubuf)[8], const x86_col_chunk * cc, int nct, __m256 * acc) {
    sh.ub        = X86_TILE_UNIT_BYTES(ts);
    const int nd = sh.nfull - b0 >= nbk ? nbk : (int) (sh.nfull - b0);
    for (int j = 0; j < nd; ++j) {
        const uint8_t * blk = row + (size_t) (2 * (b0 + j)) * sh.ub;
        avx2_decode_block(blk, w->pool, cursor, ubuf[j]);
        avx2_decode_block(blk + sh.ub, w->pool, cursor, ubuf[j] + 4);
    }
    for (int j = nd; j < nbk; ++j) {
        const int64_t   b   = b0 + j;
        const uint8_t * blk = x86_block_bits(sh, row, last, b);
        avx2_decode_block(blk, w->pool, cursor, ubuf[j]);
        if (x86_halves(b, sh.nb) == 2)
            avx2_decode_block(blk + sh.ub, w->pool, cursor, ubuf[j] + 4);
    }
    for (int c = 0; c < nct; ++c) {
        __m256 a = b0 == 0 ? _mm256_setzero_ps() : acc[c]; // the contract's acc starts at +0
        for (int j = 0; j < nbk; ++j) {
            const int64_t b      = b0 + j;
            const int     halves = j < nd ? 2 : x86_halves(b, sh.nb);
            const __m256i s0     = avx2_dot_block(ubuf[j], cc[c].qs[j]);
            const __m256i s =
                halves == 2 ? _mm256_add_epi16(s0, avx2_dot_block(ubuf[j] + 4, cc[c].qs[j] + QK_BITCOS)) : s0;
            a = avx2_block_float(s0, s, cc[c].qsum[j], sh, ts, row, rs, b, halves, cc[c].yd[j], cc[c].dpt[j], a);
        }
        acc[c] = a;
    }
}

// GEMM of the nrt rows from r0 against the nct (<= X86_TILE_COLS) columns y[0 .. nct) (outputs dst[c][r0 ..]):
// chunk by chunk, each row's chunk is decoded once into a code buffer, then serves every column.
static void avx2_gemm_tile(const bitcos_rows * w, int64_t r0, int nrt, const bitcos_q8_K * const * y, int nct,
                           float * const * dst) {
    const x86_shape            sh = x86_shape_of(w);
    float                      scale;
    const int                  ts = x86_tile_scale_of(w, sh, r0, nrt, &scale);
    _Alignas(64) x86_col_chunk cc[X86_TILE_COLS];
    _Alignas(64) __m256i       ubuf[X86_CHUNK_BLOCKS][8];
    _Alignas(64) __m256        acc[X86_TILE_ROWS][X86_TILE_COLS];
    x86_last_block             last[X86_TILE_ROWS];
    uint64_t                   cursor[X86_TILE_ROWS];
    x86_load_cursors(w, r0, nrt, cursor);
    x86_copy_last(w, sh, r0, nrt, last);
    for (int64_t b0 = 0; b0 < sh.nby; b0 += X86_CHUNK_BLOCKS) {
        const int nbk = x86_chunk_blocks(b0, sh.nby);
        x86_stage_columns(y, nct, b0, nbk, sh.nb, scale, cc);
        for (int r = 0; r < nrt; ++r) {
            const uint8_t *      row = x86_row(w, r0 + r);
            const avx2_row_scale rs  = avx2_row_scale_of(w, ts, r0 + r);
#    define AVX2_GEMM_ROW(m) avx2_gemm_row(w, sh, m, row, last[r].b, rs, &cursor[r], b0, nbk, ubuf, cc, nct, acc[r])
            X86_TILE_SCALE_DISPATCH(ts, AVX2_GEMM_ROW)
#    undef AVX2_GEMM_ROW
        }
    }
    for (int r = 0; r < nrt; ++r) {
        for (int c = 0; c < nct; ++c)
            dst[c][r0 + r] = x86_reduce8(acc[r][c]);
    }
}

// The kernel: rows in tiles, a one-column tile through the GEMV, any other through the GEMM.
void bitcos_mm_avx2(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc, float * const * dst) {
    x86_tiles(w, nr, y, nc, dst, avx2_gemv_tile, avx2_gemm_tile);
}

int bitcos_covers_avx2(const bitcos_rows * w) {
    return x86_covered(w, x86_shape_of(w));
}

#else
typedef int bitcos_no_avx2_kernel; // ISO C wants a declaration in every translation unit
#endif // BITCOS_BUILD_AVX2
