// bitcos_codes_mm_avx2: the codes-form kernel (bitcos-kernels.h, docs/KERNELS.md §8) for x86-64-v3, the entry
// `avx2` of the kernel table. Bit-identical to bitcos_codes_mm_generic.
//
// A half block's 32 code bytes give the codes of its four 32-weight groups by a shift and an and (TQ2_0's
// layout); vpmaddubsw against the activations gives int16 pair sums (|.| <= 512, at most 8 summed per block),
// vpmaddwd(., 1) the contract's 8 lanes directly (dword l = bytes 4l .. 4l+3). The subtracted 32-weight sums
// come from the Q8_K bsums (vpmaddwd(bsums, 1)), staged per block and column for every row of a tile. Tiles: 1
// row against 1 column (GEMV: one stream, prefetched far ahead, ran faster than 2 or 4 rows), 2 rows against 4
// columns (GEMM); the codes of a row's block are made once and serve every column of the tile. The GEMM is bound
// by vpmaddubsw and 16 ymm: 1-4 x 2-8 tiles, unrolled or not, one D per column ran 0.79-1.04x of 2 x 4.
#include "bitcos-kernels.h"

#if defined(BITCOS_BUILD_AVX2)

#    include "bitcos-kernels-x86.h"

#    define CODES_GEMV_ROWS 1
#    define CODES_GEMM_ROWS 2
#    define CODES_GEMM_COLS 4
#    define CODES_TILE_ROWS (CODES_GEMV_ROWS > CODES_GEMM_ROWS ? CODES_GEMV_ROWS : CODES_GEMM_ROWS)

// The 8 code vectors of a block (4 per half, group g of half h at [4h + g]); the second half only when present.
X86_ALWAYS_INLINE void avx2_codes_block(const uint8_t * blk, int halves, __m256i cv[8]) {
    const __m256i three = _mm256_set1_epi8(3);
    for (int h = 0; h < halves; ++h) {
        const __m256i x = _mm256_loadu_si256((const __m256i *) (blk + 32 * h));
        cv[4 * h + 0]   = _mm256_and_si256(x, three);
        cv[4 * h + 1]   = _mm256_and_si256(_mm256_srli_epi16(x, 2), three);
        cv[4 * h + 2]   = _mm256_and_si256(_mm256_srli_epi16(x, 4), three);
        cv[4 * h + 3]   = _mm256_and_si256(_mm256_srli_epi16(x, 6), three);
    }
}

// int16 pair sums of u . q over half h (4 groups of 32).
X86_ALWAYS_INLINE __m256i avx2_codes_half(const __m256i * cv, const int8_t * qs) {
    const __m256i p0 = _mm256_maddubs_epi16(cv[0], _mm256_loadu_si256((const __m256i *) (qs + 0)));
    const __m256i p1 = _mm256_maddubs_epi16(cv[1], _mm256_loadu_si256((const __m256i *) (qs + 32)));
    const __m256i p2 = _mm256_maddubs_epi16(cv[2], _mm256_loadu_si256((const __m256i *) (qs + 64)));
    const __m256i p3 = _mm256_maddubs_epi16(cv[3], _mm256_loadu_si256((const __m256i *) (qs + 96)));
    return _mm256_add_epi16(_mm256_add_epi16(p0, p1), _mm256_add_epi16(p2, p3));
}

// The fp16 block scales e0, e1 of block b of row i (e1 = e0 for a block with one half).
X86_ALWAYS_INLINE void avx2_block_scales(const bitcos_codes_rows * w, int64_t i, int64_t b, int halves, uint16_t e[2]) {
    const uint8_t * s = w->block_scale + (size_t) i * w->scale_row_bytes;
    memcpy(&e[0], s + (size_t) ((2 * b) >> w->block_scale_shift) * w->scale_stride, 2);
    e[1] = e[0];
    if (halves == 2) {
        memcpy(&e[1], s + (size_t) ((2 * b + 1) >> w->block_scale_shift) * w->scale_stride, 2);
    }
}

// R rows from i0 against C columns from c0; kind: how it finds the scales.
X86_ALWAYS_INLINE void avx2_codes_tile(const bitcos_codes_rows * w, int64_t i0, const int R,
                                       const bitcos_q8_K * const * y, int64_t c0, const int C, float * const * dst,
                                       const int kind) {
    const int64_t nu = (w->k + QK_BITCOS - 1) / QK_BITCOS, nby = (nu + 1) / 2;
    const __m256i ones16 = _mm256_set1_epi16(1);
    const __m256i half0  = _mm256_setr_epi32(-1, -1, -1, -1, 0, 0, 0, 0);
    __m256        acc[CODES_TILE_ROWS * CODES_GEMM_COLS];
    for (int a = 0; a < R * C; ++a) {
        acc[a] = _mm256_setzero_ps();
    }
    float s256[CODES_TILE_ROWS][8]; // CODES_PER_256: the rows' scales of 8 blocks, converted 8 at a time
    for (int64_t b = 0; b < nby; ++b) {
        const int halves = 2 * b + 1 < nu ? 2 : 1;
        if (kind == CODES_PER_256 && (b & 7) == 0) {
            codes_stage_per_256(w, i0, R, b, nby, s256);
        }
        __m256i Q[CODES_GEMM_COLS];
        float   yd[CODES_GEMM_COLS];
        for (int c = 0; c < C; ++c) {
            const bitcos_q8_K * yb = &y[c0 + c][b];
            Q[c]                   = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *) yb->bsums), ones16);
            yd[c]                  = yb->d;
            if (halves == 1) {
                Q[c] = _mm256_and_si256(Q[c], half0);
            }
        }
        for (int r = 0; r < R; ++r) {
            const int64_t   i = i0 + r;
            __m256i         cv[8];
            const uint8_t * blk = w->codes + (size_t) i * w->row_bytes + (size_t) b * BITCOS_CODES_BLOCK_BYTES;
            _mm_prefetch((const char *) (blk + X86_CODES_PREFETCH_BLOCKS * BITCOS_CODES_BLOCK_BYTES), _MM_HINT_T0);
            avx2_codes_block(blk, halves, cv);
            uint16_t e[2] = { 0, 0 };
            if (kind == CODES_PER_128) {
                avx2_block_scales(w, i, b, halves, e);
            }
            const float s = kind == CODES_ROW_SCALES ? w->row_scale[i] :
                            kind == CODES_PER_256    ? s256[r][b & 7] :
                                                       x86_fp16_to_fp32(e[0]);
            if (kind != CODES_PER_128 || e[0] == e[1]) {
                for (int c = 0; c < C; ++c) {
                    const int8_t * qs = y[c0 + c][b].qs;
                    __m256i        p  = avx2_codes_half(cv, qs);
                    if (halves == 2) {
                        p = _mm256_add_epi16(p, avx2_codes_half(cv + 4, qs + 128));
                    }
                    const __m256i L = _mm256_sub_epi32(_mm256_madd_epi16(p, ones16), Q[c]);
                    acc[r * C + c] =
                        X86_CONTRACT_FMA(_mm256, _mm256_cvtepi32_ps(L), _mm256_set1_ps(yd[c] * s), acc[r * C + c]);
                }
            } else { // two halves with different scales
                const float s1 = x86_fp16_to_fp32(e[1]);
                for (int c = 0; c < C; ++c) {
                    const int8_t * qs = y[c0 + c][b].qs;
                    const __m256i  L0 = _mm256_sub_epi32(_mm256_madd_epi16(avx2_codes_half(cv, qs), ones16),
                                                         _mm256_and_si256(Q[c], half0));
                    const __m256i  L1 = _mm256_sub_epi32(_mm256_madd_epi16(avx2_codes_half(cv + 4, qs + 128), ones16),
                                                         _mm256_andnot_si256(half0, Q[c]));
                    __m256         a =
                        X86_CONTRACT_FMA(_mm256, _mm256_cvtepi32_ps(L0), _mm256_set1_ps(yd[c] * s), acc[r * C + c]);
                    acc[r * C + c] = X86_CONTRACT_FMA(_mm256, _mm256_cvtepi32_ps(L1), _mm256_set1_ps(yd[c] * s1), a);
                }
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) {
            dst[c0 + c][i0 + r] = x86_reduce8(acc[r * C + c]);
        }
    }
}

// Every row tile of columns c0 .. c0 + C.
X86_ALWAYS_INLINE void avx2_codes_cols(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y,
                                       int64_t c0, const int C, float * const * dst, const int kind) {
    const int R = C == 1 ? CODES_GEMV_ROWS : CODES_GEMM_ROWS;
    int64_t   i = 0;
    for (; i + R <= nr; i += R) {
        avx2_codes_tile(w, i, R, y, c0, C, dst, kind);
    }
    for (; i < nr; ++i) {
        avx2_codes_tile(w, i, 1, y, c0, C, dst, kind);
    }
}

static void avx2_codes_mm(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                          float * const * dst, const int kind) {
    int64_t c = 0;
    for (; c + CODES_GEMM_COLS <= nc; c += CODES_GEMM_COLS) {
        avx2_codes_cols(w, nr, y, c, CODES_GEMM_COLS, dst, kind);
    }
    for (; c < nc; ++c) {
        avx2_codes_cols(w, nr, y, c, 1, dst, kind);
    }
}

static void avx2_codes_mm_row(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                              float * const * dst) {
    avx2_codes_mm(w, nr, y, nc, dst, CODES_ROW_SCALES);
}

static void avx2_codes_mm_per_256(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                                  float * const * dst) {
    avx2_codes_mm(w, nr, y, nc, dst, CODES_PER_256);
}

static void avx2_codes_mm_block(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                                float * const * dst) {
    avx2_codes_mm(w, nr, y, nc, dst, CODES_PER_128);
}

void bitcos_codes_mm_avx2(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                          float * const * dst) {
    (w->row_scale != NULL      ? avx2_codes_mm_row :
     w->block_scale_shift == 1 ? avx2_codes_mm_per_256 :
                                 avx2_codes_mm_block)(w, nr, y, nc, dst);
}

#endif
