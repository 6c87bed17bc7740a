// bitcos_codes_mm_avx512: the codes-form kernel (bitcos-kernels.h, docs/KERNELS.md §8) for AVX-512 F/BW/VL, the
// entry `avx512` of the kernel table (VNNI's vpdpbusd when the flags have it, else vpmaddubsw + vpmaddwd).
// Bit-identical to bitcos_codes_mm_generic.
//
// A half block's 32 code bytes are broadcast to both halves of a zmm and shifted by 0 | 2 (then 4 | 6) bits per
// 256-bit half (vpsrlvw), so one zmm holds the codes of two consecutive 32-weight groups, matching 64
// consecutive activations: two byte dot products per half block. Dword m of the result sums bytes 4m .. 4m+3,
// so the contract's lane l is dword l + dword l + 8 (one fold per block). The rest is the AVX2 codes kernel's:
// bsums for the subtracted sums, 1-row GEMV tiles with the codes prefetched far ahead and 2 x 4 GEMM tiles.
#include "bitcos-kernels.h"

#if defined(BITCOS_BUILD_AVX512)

#    include "bitcos-kernels-x86.h"

#    ifndef CODES_GEMV_ROWS
#        define CODES_GEMV_ROWS 1
#    endif
#    define CODES_GEMM_ROWS 2
#    define CODES_GEMM_COLS 4
#    define CODES_TILE_ROWS (CODES_GEMV_ROWS > CODES_GEMM_ROWS ? CODES_GEMV_ROWS : CODES_GEMM_ROWS)

#    if defined(__AVX512VNNI__)
#        define AVX512_CODES_DOT(acc, u, q) _mm512_dpbusd_epi32(acc, u, q)
#    else
#        define AVX512_CODES_DOT(acc, u, q) \
            _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, q), _mm512_set1_epi16(1)))
#    endif

// The codes of one half block as two zmm: groups 0 | 1 and 2 | 3.
X86_ALWAYS_INLINE void avx512_codes_half(const uint8_t * half, __m512i z[2]) {
    const __m512i three = _mm512_set1_epi8(3);
    const __m512i x     = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) half));
    const __m512i s01   = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i s23   = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    z[0]                = _mm512_and_si512(_mm512_srlv_epi16(x, s01), three);
    z[1]                = _mm512_and_si512(_mm512_srlv_epi16(x, s23), three);
}

// Dwords of u . q over a half block (128 activations at qs).
X86_ALWAYS_INLINE __m512i avx512_codes_dot(const __m512i z[2], const int8_t * qs) {
    const __m512i d = AVX512_CODES_DOT(_mm512_setzero_si512(), z[0], _mm512_loadu_si512((const void *) qs));
    return AVX512_CODES_DOT(d, z[1], _mm512_loadu_si512((const void *) (qs + 64)));
}

// The contract's 8 lanes of a dword vector: dword l + dword l + 8.
X86_ALWAYS_INLINE __m256i avx512_codes_fold(__m512i d) {
    return _mm256_add_epi32(_mm512_castsi512_si256(d), _mm512_extracti64x4_epi64(d, 1));
}

X86_ALWAYS_INLINE void avx512_block_scales(const bitcos_codes_rows * w, int64_t i, int64_t b, int halves,
                                           uint16_t e[2]) {
    const uint8_t * s = w->block_scale + (size_t) i * w->scale_row_bytes;
    memcpy(&e[0], s + (size_t) ((2 * b) >> w->block_scale_shift) * w->scale_stride, 2);
    e[1] = e[0];
    if (halves == 2) {
        memcpy(&e[1], s + (size_t) ((2 * b + 1) >> w->block_scale_shift) * w->scale_stride, 2);
    }
}

X86_ALWAYS_INLINE void avx512_codes_tile(const bitcos_codes_rows * w, int64_t i0, const int R,
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
            const int64_t   i   = i0 + r;
            const uint8_t * blk = w->codes + (size_t) i * w->row_bytes + (size_t) b * BITCOS_CODES_BLOCK_BYTES;
            _mm_prefetch((const char *) (blk + X86_CODES_PREFETCH_BLOCKS * BITCOS_CODES_BLOCK_BYTES), _MM_HINT_T0);
            __m512i z[4];
            avx512_codes_half(blk, z);
            if (halves == 2) {
                avx512_codes_half(blk + 32, z + 2);
            } else {
                z[2] = z[3] = _mm512_setzero_si512(); // never read; keeps GCC's -Wmaybe-uninitialized quiet
            }
            uint16_t e[2] = { 0, 0 };
            if (kind == CODES_PER_128) {
                avx512_block_scales(w, i, b, halves, e);
            }
            const float s = kind == CODES_ROW_SCALES ? w->row_scale[i] :
                            kind == CODES_PER_256    ? s256[r][b & 7] :
                                                       x86_fp16_to_fp32(e[0]);
            if (kind != CODES_PER_128 || e[0] == e[1]) {
                for (int c = 0; c < C; ++c) {
                    const int8_t * qs = y[c0 + c][b].qs;
                    __m512i        d  = avx512_codes_dot(z, qs);
                    if (halves == 2) {
                        d = _mm512_add_epi32(d, avx512_codes_dot(z + 2, qs + 128));
                    }
                    const __m256i L = _mm256_sub_epi32(avx512_codes_fold(d), Q[c]);
                    acc[r * C + c] =
                        X86_CONTRACT_FMA(_mm256, _mm256_cvtepi32_ps(L), _mm256_set1_ps(yd[c] * s), acc[r * C + c]);
                }
            } else { // two halves with different scales
                const float s1 = x86_fp16_to_fp32(e[1]);
                for (int c = 0; c < C; ++c) {
                    const int8_t * qs = y[c0 + c][b].qs;
                    const __m256i  L0 =
                        _mm256_sub_epi32(avx512_codes_fold(avx512_codes_dot(z, qs)), _mm256_and_si256(Q[c], half0));
                    const __m256i L1 = _mm256_sub_epi32(avx512_codes_fold(avx512_codes_dot(z + 2, qs + 128)),
                                                        _mm256_andnot_si256(half0, Q[c]));
                    __m256        a =
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

X86_ALWAYS_INLINE void avx512_codes_cols(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y,
                                         int64_t c0, const int C, float * const * dst, const int kind) {
    const int R = C == 1 ? CODES_GEMV_ROWS : CODES_GEMM_ROWS;
    int64_t   i = 0;
    for (; i + R <= nr; i += R) {
        avx512_codes_tile(w, i, R, y, c0, C, dst, kind);
    }
    for (; i < nr; ++i) {
        avx512_codes_tile(w, i, 1, y, c0, C, dst, kind);
    }
}

static void avx512_codes_mm(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                            float * const * dst, const int kind) {
    int64_t c = 0;
    for (; c + CODES_GEMM_COLS <= nc; c += CODES_GEMM_COLS) {
        avx512_codes_cols(w, nr, y, c, CODES_GEMM_COLS, dst, kind);
    }
    for (; c < nc; ++c) {
        avx512_codes_cols(w, nr, y, c, 1, dst, kind);
    }
}

static void avx512_codes_mm_row(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                                float * const * dst) {
    avx512_codes_mm(w, nr, y, nc, dst, CODES_ROW_SCALES);
}

static void avx512_codes_mm_per_256(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                                    float * const * dst) {
    avx512_codes_mm(w, nr, y, nc, dst, CODES_PER_256);
}

static void avx512_codes_mm_block(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                                  float * const * dst) {
    avx512_codes_mm(w, nr, y, nc, dst, CODES_PER_128);
}

void bitcos_codes_mm_avx512(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                            float * const * dst) {
    (w->row_scale != NULL      ? avx512_codes_mm_row :
     w->block_scale_shift == 1 ? avx512_codes_mm_per_256 :
                                 avx512_codes_mm_block)(w, nr, y, nc, dst);
}

#endif
