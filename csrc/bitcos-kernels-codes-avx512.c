// bitcos_codes_mm_avx512: the codes-form kernel (bitcos-kernels.h, docs/KERNELS.md §8) for AVX-512 F/BW/VL, the
// entry `avx512` of the kernel table (VNNI's vpdpbusd when the flags have it, else vpmaddubsw + vpmaddwd).
// Bit-identical to bitcos_codes_mm_generic.
//
// A half block's 32 code bytes are broadcast to both halves of a zmm and shifted by 0 | 2 (then 4 | 6) bits per
// 256-bit half (vpsrlvw), so one zmm holds the codes of two consecutive 32-weight groups, matching 64
// consecutive activations: two byte dot products per half block. Dword m of the result sums bytes 4m .. 4m+3,
// so the contract's lane l is dword l + dword l + 8 (one fold per block). Subtracted sums from the bsums, as in
// the AVX2 codes kernel. Tiles, rows x columns: GEMV 1 x 1 with the codes prefetched far ahead; GEMM 4 x 4, two
// columns per zmm accumulator, so the fold, the subtraction, the conversion and the FMA take one instruction per
// two outputs: 1.25-1.38x the 2 x 4 tile with a ymm per output (dev/codes_gemm_bench.sh, 2-vCPU Xeon VM). 8 x 4
// ties; 6 x 4, 3 x 8, 2 x 8, 4 x 2 are slower, 4 x 8 spills; two rows per zmm (a group's codes of both rows
// against broadcast activations: no fold) ran 1.06-1.27x.
#include "bitcos-kernels.h"

#if defined(BITCOS_BUILD_AVX512)

#    include "bitcos-kernels-x86.h"

#    ifndef CODES_GEMV_ROWS
#        define CODES_GEMV_ROWS 1
#    endif
#    ifndef CODES_GEMM_ROWS
#        define CODES_GEMM_ROWS 4
#    endif
#    ifndef CODES_GEMM_COLS
#        define CODES_GEMM_COLS 4
#    endif
#    define CODES_GEMM_PAIRS (CODES_GEMM_COLS / 2)
#    if CODES_GEMM_COLS % 2 != 0 || CODES_GEMM_COLS < 2
#        error "the GEMM tile holds column pairs"
#    endif
// a kind of its own here: row scales all equal in the tile (every MATRIX tile), D per column and block
#    define CODES_ONE_SCALE 16
// the tile's rows and pairs unrolled, so its accumulators stay in registers (GCC leaves the row loop rolled, the
// accumulators in memory: 12 % slower)
#    define CODES_UNROLL    _Pragma("GCC unroll 8")

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

// Row i's block b for both tiles: the codes some blocks ahead prefetched, the block decoded into z (z[2..3] of
// its second half; zero for a lone half), and for per-128 scales its halves' fp16 scales in e (else 0).
X86_ALWAYS_INLINE void avx512_codes_row_block(const bitcos_codes_rows * w, int64_t i, int64_t b, int halves, int kind,
                                              __m512i z[4], uint16_t e[2]) {
    const uint8_t * blk = w->codes + (size_t) i * w->row_bytes + (size_t) b * BITCOS_CODES_BLOCK_BYTES;
    _mm_prefetch((const char *) (blk + X86_CODES_PREFETCH_BLOCKS * BITCOS_CODES_BLOCK_BYTES), _MM_HINT_T0);
    avx512_codes_half(blk, z);
    if (halves == 2) {
        avx512_codes_half(blk + 32, z + 2);
    } else {
        z[2] = z[3] = _mm512_setzero_si512(); // never read; keeps GCC's -Wmaybe-uninitialized quiet
    }
    e[0] = e[1] = 0;
    if (kind == CODES_PER_128) {
        avx512_block_scales(w, i, b, halves, e);
    }
}

// GEMV: R rows from i0 against column c0.
X86_ALWAYS_INLINE void avx512_codes_gemv_tile(const bitcos_codes_rows * w, int64_t i0, const int R,
                                              const bitcos_q8_K * const * y, int64_t c0, float * const * dst,
                                              const int kind) {
    const int64_t nu = (w->k + QK_BITCOS - 1) / QK_BITCOS, nby = (nu + 1) / 2;
    const __m256i ones16 = _mm256_set1_epi16(1);
    const __m256i half0  = _mm256_setr_epi32(-1, -1, -1, -1, 0, 0, 0, 0);
    __m256        acc[CODES_GEMV_ROWS];
    for (int r = 0; r < R; ++r) {
        acc[r] = _mm256_setzero_ps();
    }
    float s256[CODES_GEMV_ROWS][8]; // CODES_PER_256: the rows' scales of 8 blocks, converted 8 at a time
    for (int64_t b = 0; b < nby; ++b) {
        const int halves = 2 * b + 1 < nu ? 2 : 1;
        if (kind == CODES_PER_256 && (b & 7) == 0) {
            codes_stage_per_256(w, i0, R, b, nby, s256);
        }
        const bitcos_q8_K * yb = &y[c0][b];
        __m256i             Q  = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *) yb->bsums), ones16);
        if (halves == 1) {
            Q = _mm256_and_si256(Q, half0);
        }
        for (int r = 0; r < R; ++r) {
            const int64_t i = i0 + r;
            __m512i       z[4];
            uint16_t      e[2];
            avx512_codes_row_block(w, i, b, halves, kind, z, e);
            const float s = kind == CODES_ROW_SCALES ? w->row_scale[i] :
                            kind == CODES_PER_256    ? s256[r][b & 7] :
                                                       x86_fp16_to_fp32(e[0]);
            if (kind != CODES_PER_128 || e[0] == e[1]) {
                __m512i d = avx512_codes_dot(z, yb->qs);
                if (halves == 2) {
                    d = _mm512_add_epi32(d, avx512_codes_dot(z + 2, yb->qs + 128));
                }
                const __m256i L = _mm256_sub_epi32(avx512_codes_fold(d), Q);
                acc[r]          = X86_CONTRACT_FMA(_mm256, _mm256_cvtepi32_ps(L), _mm256_set1_ps(yb->d * s), acc[r]);
            } else { // two halves with different scales
                const float   s1 = x86_fp16_to_fp32(e[1]);
                const __m256i L0 =
                    _mm256_sub_epi32(avx512_codes_fold(avx512_codes_dot(z, yb->qs)), _mm256_and_si256(Q, half0));
                const __m256i L1 = _mm256_sub_epi32(avx512_codes_fold(avx512_codes_dot(z + 2, yb->qs + 128)),
                                                    _mm256_andnot_si256(half0, Q));
                const __m256  a  = X86_CONTRACT_FMA(_mm256, _mm256_cvtepi32_ps(L0), _mm256_set1_ps(yb->d * s), acc[r]);
                acc[r]           = X86_CONTRACT_FMA(_mm256, _mm256_cvtepi32_ps(L1), _mm256_set1_ps(yb->d * s1), a);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        dst[c0][i0 + r] = x86_reduce8(acc[r]);
    }
}

X86_ALWAYS_INLINE __m512i avx512_codes_dot4(const __m512i z[4], const int8_t * qs, __m512i d, int halves) {
    d = AVX512_CODES_DOT(d, z[0], _mm512_loadu_si512((const void *) qs));
    d = AVX512_CODES_DOT(d, z[1], _mm512_loadu_si512((const void *) (qs + 64)));
    if (halves == 2) {
        d = AVX512_CODES_DOT(d, z[2], _mm512_loadu_si512((const void *) (qs + 128)));
        d = AVX512_CODES_DOT(d, z[3], _mm512_loadu_si512((const void *) (qs + 192)));
    }
    return d;
}

// The contract's lanes of two columns' dword vectors a, b in one zmm: a's 8 lanes, then b's.
X86_ALWAYS_INLINE __m512i avx512_codes_fold_pair(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x44), _mm512_shuffle_i64x2(a, b, 0xee));
}

// GEMM: R rows from i0 against C (even) columns from c0, the columns in pairs, one zmm accumulator per row and pair
// (a column's 8 lanes in each 256-bit half), so the fold, the subtracted sums, the conversion, the scale product
// and the FMA take one instruction per two outputs. Each row's block is decoded once for all C columns.
X86_ALWAYS_INLINE void avx512_codes_gemm_tile(const bitcos_codes_rows * w, int64_t i0, const int R,
                                              const bitcos_q8_K * const * y, int64_t c0, const int C,
                                              float * const * dst, const int kind) {
    const int64_t nu = (w->k + QK_BITCOS - 1) / QK_BITCOS, nby = (nu + 1) / 2;
    const int     P      = C / 2;
    const __m256i ones16 = _mm256_set1_epi16(1);
    const __m512i half0  = _mm512_setr_epi32(-1, -1, -1, -1, 0, 0, 0, 0, -1, -1, -1, -1, 0, 0, 0, 0);
    __m512        acc[CODES_GEMM_ROWS * CODES_GEMM_PAIRS];
    for (int a = 0; a < R * P; ++a) {
        acc[a] = _mm512_setzero_ps();
    }
    float s256[CODES_GEMM_ROWS][8]; // CODES_PER_256: the rows' scales of 8 blocks, converted 8 at a time
    for (int64_t b = 0; b < nby; ++b) {
        const int halves = 2 * b + 1 < nu ? 2 : 1;
        if (kind == CODES_PER_256 && (b & 7) == 0) {
            codes_stage_per_256(w, i0, R, b, nby, s256);
        }
        __m512i Q[CODES_GEMM_PAIRS];
        __m512  yd[CODES_GEMM_PAIRS];
        for (int p = 0; p < P; ++p) {
            const bitcos_q8_K * ya = &y[c0 + 2 * p][b];
            const bitcos_q8_K * yb = &y[c0 + 2 * p + 1][b];
            const __m256i       qa = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *) ya->bsums), ones16);
            const __m256i       qb = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *) yb->bsums), ones16);
            Q[p]                   = _mm512_inserti64x4(_mm512_castsi256_si512(qa), qb, 1);
            if (halves == 1) {
                Q[p] = _mm512_and_si512(Q[p], half0);
            }
            yd[p] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(ya->d)), _mm256_set1_ps(yb->d), 1);
            if (kind == CODES_ONE_SCALE) {
                yd[p] = _mm512_mul_ps(yd[p], _mm512_set1_ps(w->row_scale[i0]));
            }
        }
        CODES_UNROLL
        for (int r = 0; r < R; ++r) {
            const int64_t i = i0 + r;
            __m512i       z[4];
            uint16_t      e[2];
            avx512_codes_row_block(w, i, b, halves, kind, z, e);
            const float s = kind == CODES_ROW_SCALES ? w->row_scale[i] :
                            kind == CODES_PER_256    ? s256[r][b & 7] :
                            kind == CODES_PER_128    ? x86_fp16_to_fp32(e[0]) :
                                                       0.0f;
            if (kind != CODES_PER_128 || e[0] == e[1]) {
                CODES_UNROLL
                for (int p = 0; p < P; ++p) {
                    const __m512i da = avx512_codes_dot4(z, y[c0 + 2 * p][b].qs, _mm512_setzero_si512(), halves);
                    const __m512i db = avx512_codes_dot4(z, y[c0 + 2 * p + 1][b].qs, _mm512_setzero_si512(), halves);
                    const __m512i L  = _mm512_sub_epi32(avx512_codes_fold_pair(da, db), Q[p]);
                    const __m512  D  = kind == CODES_ONE_SCALE ? yd[p] : _mm512_mul_ps(yd[p], _mm512_set1_ps(s));
                    acc[r * P + p]   = X86_CONTRACT_FMA(_mm512, _mm512_cvtepi32_ps(L), D, acc[r * P + p]);
                }
            } else { // two halves with different scales
                const float s1 = x86_fp16_to_fp32(e[1]);
                for (int p = 0; p < P; ++p) {
                    const int8_t * qa = y[c0 + 2 * p][b].qs;
                    const int8_t * qb = y[c0 + 2 * p + 1][b].qs;
                    const __m512i  L0 =
                        _mm512_sub_epi32(avx512_codes_fold_pair(avx512_codes_dot(z, qa), avx512_codes_dot(z, qb)),
                                         _mm512_and_si512(Q[p], half0));
                    const __m512i L1 = _mm512_sub_epi32(
                        avx512_codes_fold_pair(avx512_codes_dot(z + 2, qa + 128), avx512_codes_dot(z + 2, qb + 128)),
                        _mm512_andnot_si512(half0, Q[p]));
                    const __m512 a = X86_CONTRACT_FMA(_mm512, _mm512_cvtepi32_ps(L0),
                                                      _mm512_mul_ps(yd[p], _mm512_set1_ps(s)), acc[r * P + p]);
                    acc[r * P + p] =
                        X86_CONTRACT_FMA(_mm512, _mm512_cvtepi32_ps(L1), _mm512_mul_ps(yd[p], _mm512_set1_ps(s1)), a);
                }
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int p = 0; p < P; ++p) {
            dst[c0 + 2 * p][i0 + r]     = x86_reduce8(_mm512_castps512_ps256(acc[r * P + p]));
            dst[c0 + 2 * p + 1][i0 + r] = x86_reduce8(_mm512_extractf32x8_ps(acc[r * P + p], 1));
        }
    }
}

X86_ALWAYS_INLINE int avx512_codes_one_scale(const bitcos_codes_rows * w, int64_t i0, int R) {
    for (int r = 1; r < R; ++r) {
        if (memcmp(&w->row_scale[i0 + r], &w->row_scale[i0], sizeof(float)) != 0) {
            return 0;
        }
    }
    return 1;
}

// Every row tile of columns c0 .. c0 + C: GEMV tiles of CODES_GEMV_ROWS rows for C == 1, else GEMM tiles.
X86_ALWAYS_INLINE void avx512_codes_cols(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y,
                                         int64_t c0, const int C, float * const * dst, const int kind) {
    int64_t i = 0;
    if (C == 1) {
        for (; i + CODES_GEMV_ROWS <= nr; i += CODES_GEMV_ROWS) {
            avx512_codes_gemv_tile(w, i, CODES_GEMV_ROWS, y, c0, dst, kind);
        }
        for (; i < nr; ++i) {
            avx512_codes_gemv_tile(w, i, 1, y, c0, dst, kind);
        }
        return;
    }
    for (; i + CODES_GEMM_ROWS <= nr; i += CODES_GEMM_ROWS) {
        if (kind == CODES_ROW_SCALES && avx512_codes_one_scale(w, i, CODES_GEMM_ROWS)) {
            avx512_codes_gemm_tile(w, i, CODES_GEMM_ROWS, y, c0, C, dst, CODES_ONE_SCALE);
        } else {
            avx512_codes_gemm_tile(w, i, CODES_GEMM_ROWS, y, c0, C, dst, kind);
        }
    }
    for (; i < nr; ++i) {
        avx512_codes_gemm_tile(w, i, 1, y, c0, C, dst, kind);
    }
}

// Columns in tiles of CODES_GEMM_COLS, the rest in tiles of 4 and 2, a last odd one as a GEMV.
static void avx512_codes_mm(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                            float * const * dst, const int kind) {
    int64_t c = 0;
    for (; c + CODES_GEMM_COLS <= nc; c += CODES_GEMM_COLS) {
        avx512_codes_cols(w, nr, y, c, CODES_GEMM_COLS, dst, kind);
    }
#    if CODES_GEMM_COLS > 4
    if (c + 4 <= nc) {
        avx512_codes_cols(w, nr, y, c, 4, dst, kind);
        c += 4;
    }
#    endif
#    if CODES_GEMM_COLS > 2
    if (c + 2 <= nc) {
        avx512_codes_cols(w, nr, y, c, 2, dst, kind);
        c += 2;
    }
#    endif
    if (c < nc) {
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
