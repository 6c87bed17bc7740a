// x86 SIMD BITCOS kernels: AVX2 and AVX-512 (F/BW/VL; VNNI, BMI2 and F16C used when present).
//
// Contract: bitcos-kernels.h (results bit-identical to bitcos_mm_generic). Design notes and measured
// cycles: docs/KERNELS.md. This file defines only what the compiler's target flags allow (the same guards
// as the header's declarations): on a non-x86 target, or without AVX2, it defines nothing. Compile it with
// -ffp-contract=off like every kernel file (GCC fuses intrinsic multiplies and adds into FMAs otherwise,
// which would change the rounding).
//
// Integer part (exact, so any order is allowed). Per 64 weights of a row:
//   P = presence word, S = 64 sign bits at the row's cursor, N = pdep(S, P) (negative lanes), cursor += |P|.
//   AVX-512: u = t + 1 in {0, 1, 2} from two masked byte moves (blend by P: 1 -> 2, zero by N), then one
//     vpdpbusd(u, q) = sum t*q + sum q against the raw signed activations; sum q per group is a column
//     property, staged once per tile. Exact for every int8 q, -128 included.
//   AVX2: t in {-1, 0, +1} from P and N expanded to bytes (broadcast, pshufb, and, min / cmpeq), then
//     vpmaddubsw(q', t) with q' = q ^ 0x80 = q + 128 staged once per tile: sum t*q' = sum t*q + 128 sum t,
//     and sum t = |P| - 2|N| is a scalar popcount per row.
// Each group of 128 weights gives one vector of lane partial sums; 16 groups (a "chunk", 2048 weights) are
// reduced together by a transpose tree, so a group costs about two vector ops of reduction instead of a
// full horizontal sum.
// Float part: exactly the header's order, vectorised across the groups of a chunk where the contract has
// no dependency (per-group products and per-Q8_K-block parts); the acc chain itself stays sequential.
// GEMV (one column) decodes straight into the dot products, two rows interleaved (AVX-512); several columns
// decode each row chunk once into a code buffer and reuse it for every column.
#include "bitcos-kernels.h"

#if defined(__AVX2__) && !(defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)))
// AVX2 targets these kernels do not cover: 32-bit x86 (they need 64-bit GPRs for pdep/kmov on 64-bit words)
// and compilers without GCC builtins/attributes (MSVC). Keep the symbols the header declares so
// bitcos_mm_best() links, and run the reference.
void bitcos_mm_avx2(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                    float * const * dst) {
    bitcos_mm_generic(w, nr, y, nc, dst);
}
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
void bitcos_mm_avx512(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                      float * const * dst) {
    bitcos_mm_generic(w, nr, y, nc, dst);
}
#endif
#elif defined(__x86_64__) && defined(__AVX2__)

#include <immintrin.h>
#include <string.h>

#define BX_ALWAYS_INLINE static inline __attribute__((always_inline))
#define BX_CHUNK_G 16                    // groups of 128 per chunk (one reduction tree)
#define BX_CHUNK_K (BX_CHUNK_G * BITCOS_QK)
#define BX_CT      8                     // activation columns per tile (q' staging buffer: 8 x 2 KB)
#define BX_RT      32                    // rows per tile (amortises the q' staging)

// Slot of group g (0..15) in a chunk's reduction: even groups first, then odd groups, so the reduced vector
// holds isum[0,2,..,14] then isum[1,3,..,15] and a Q8_K block's two groups sit 8 lanes apart.
#define BX_SLOT(g) (((g) & 1) ? 8 + ((g) >> 1) : ((g) >> 1))

BX_ALWAYS_INLINE uint64_t bx_load_u64(const uint8_t * p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

// Scatters the low popcount(mask) bits of src to the set positions of mask. BMI2 pdep is one fast
// instruction on Intel since Haswell and AMD since Zen 3; on Zen 1/2 it is microcoded with a cost that
// grows with the mask's popcount (hundreds of cycles for dense masks), so -march=znver1/znver2 builds, and
// AVX2 builds without -mbmi2, use the loop (about three ops per set bit).
BX_ALWAYS_INLINE uint64_t bx_pdep(uint64_t src, uint64_t mask) {
#if defined(__BMI2__) && !defined(__znver1__) && !defined(__znver2__)
    return _pdep_u64(src, mask);
#else
    uint64_t out = 0;
    for (uint64_t m = mask; m != 0; m &= m - 1) {
        if (src & 1) out |= m & (~m + 1);
        src >>= 1;
    }
    return out;
#endif
}

// 64 sign bits starting at pool bit `pos`, from the two aligned-index qwords covering them. Reads at most
// up to byte (pos >> 3) + 16 of the pool, inside the >= 64-byte zero tail guaranteed by FORMAT.md §4.4.
// The high part is shifted in two steps ((hi << 1) << (63 - s)) so s = 0 needs no branch.
BX_ALWAYS_INLINE uint64_t bx_sign_window(const uint8_t * pool, uint64_t pos) {
    const uint8_t * p  = pool + ((pos >> 6) << 3);
    const uint64_t  lo = bx_load_u64(p);
    const uint64_t  hi = bx_load_u64(p + 8);
    return (lo >> (pos & 63)) | ((hi << 1) << (~pos & 63));
}

// Per-chunk state of one row: everything the column loop needs that does not depend on the column.
typedef struct {
    int32_t  corr[BX_CHUNK_G];  // AVX2: 128 * sum(t) of each group, by slot (q' bias correction)
    uint16_t dh[BX_CHUNK_G];    // fp16 group scales by slot (G128; 0 for absent groups)
} bx_row_chunk;

// fp32 scales of a row chunk, slots 0-7 (even groups) and 8-15 (odd groups).
BX_ALWAYS_INLINE void bx_chunk_scales(const bx_row_chunk * rc, __m256 * de, __m256 * dodd) {
#if defined(__F16C__)
    *de   = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)rc->dh));
    *dodd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rc->dh + 8)));
#else
    float d[BX_CHUNK_G];
    for (int i = 0; i < BX_CHUNK_G; ++i) d[i] = bitcos_fp16_to_fp32(rc->dh[i]);
    *de   = _mm256_loadu_ps(d);
    *dodd = _mm256_loadu_ps(d + 8);
#endif
}

BX_ALWAYS_INLINE uint16_t bx_group_scale_bits(const uint8_t * blk, int g128) {
    uint16_t dh = 0;
    if (g128) {
        memcpy(&dh, blk + 16, 2);
    }
    return dh;
}

// acc + p[0] + p[1] + ... + p[n-1], one fp32 addition at a time in that order (the contract's acc chain).
BX_ALWAYS_INLINE float bx_chain_add(float acc, __m256 p, int n) {
    if (n == 8) {
        const __m128 lo = _mm256_castps256_ps128(p);
        const __m128 hi = _mm256_extractf128_ps(p, 1);
        __m128 a = _mm_set_ss(acc);
        a = _mm_add_ss(a, lo);
        a = _mm_add_ss(a, _mm_movehdup_ps(lo));
        a = _mm_add_ss(a, _mm_movehl_ps(lo, lo));
        a = _mm_add_ss(a, _mm_shuffle_ps(lo, lo, 3));
        a = _mm_add_ss(a, hi);
        a = _mm_add_ss(a, _mm_movehdup_ps(hi));
        a = _mm_add_ss(a, _mm_movehl_ps(hi, hi));
        a = _mm_add_ss(a, _mm_shuffle_ps(hi, hi, 3));
        return _mm_cvtss_f32(a);
    }
    float prod[8];
    _mm256_storeu_ps(prod, p);
    for (int b = 0; b < n; ++b) {
        acc = acc + prod[b];
    }
    return acc;
}

// Float part of the contract for one row, one column and one chunk: ie/io hold the exact integer sums of
// the even/odd groups (by Q8_K block), de/dodd their scales, yd the chunk's Q8_K scales, ng the number of
// groups present (<= 16). Returns the updated accumulator.
BX_ALWAYS_INLINE float bx_float_phase(__m256i ie, __m256i io, __m256 de, __m256 dodd, const float * yd,
                                      int ng, int g128, float acc) {
    const int    nbc = (ng + 1) >> 1;             // Q8_K blocks touched by this chunk
    const __m256 vy  = _mm256_loadu_ps(yd);
    __m256 prod;
    if (g128) {
        const __m256 pe = _mm256_mul_ps(_mm256_cvtepi32_ps(ie), de);
        const __m256 po = _mm256_mul_ps(_mm256_cvtepi32_ps(io), dodd);
        prod = _mm256_mul_ps(vy, _mm256_add_ps(pe, po));
        if (ng & 1) {
            // the lone last group of an odd row: part is its product alone (no "+ 0.0f")
            float pe_s[8], prod_s[8];
            _mm256_storeu_ps(pe_s, pe);
            _mm256_storeu_ps(prod_s, prod);
            prod_s[nbc - 1] = yd[nbc - 1] * pe_s[nbc - 1];
            prod = _mm256_loadu_ps(prod_s);
        }
    } else {
        // PT: the two groups' integer sums are added before the conversion (absent odd group: isum 0)
        prod = _mm256_mul_ps(vy, _mm256_cvtepi32_ps(_mm256_add_epi32(ie, io)));
    }
    return bx_chain_add(acc, prod, nbc);
}

// Stages columns c0 .. c0+nct-1 of chunk g0 as bytes (q ^ xor_bias; zero beyond the matrix, so absent groups
// contribute nothing) and the Q8_K scales of the chunk's blocks.
BX_ALWAYS_INLINE void bx_stage_columns(const bitcos_q8_K * const * y, int64_t c0, int nct, int64_t g0, int ng,
                                       char xor_bias, uint8_t (*qbuf)[BX_CHUNK_K], float (*ydbuf)[8]) {
    const __m256i bias = _mm256_set1_epi8(xor_bias);
    for (int c = 0; c < nct; ++c) {
        const bitcos_q8_K * yb = y[c0 + c] + g0 / 2;
        for (int j = 0; j < 8; ++j) {
            const int nh = ng - 2*j;            // halves (groups) of block j present in the chunk
            uint8_t * out = qbuf[c] + 256*j;
            ydbuf[c][j] = nh > 0 ? yb[j].d : 0.0f;
            for (int h = 0; h < 2; ++h) {
                for (int v = 0; v < 4; ++v) {
                    __m256i x = _mm256_setzero_si256();
                    if (h < nh) {
                        x = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(yb[j].qs + 128*h + 32*v)), bias);
                    }
                    _mm256_storeu_si256((__m256i *)(out + 128*h + 32*v), x);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// AVX2
// ---------------------------------------------------------------------------------------------------------

// Codes t in {-1, 0, +1} of 64 weights from the presence word at pbits and the negative-lane word n, as two
// vectors of 32. Each bit set is broadcast once (P straight from memory, N from the GPR), pshufb copies
// byte i of the word to lanes 8i .. 8i+7, and-ing with 1, 2, 4, .. 128 isolates lane j's bit; then
// t = min(p, 1) | (n ? -1 : 0).
BX_ALWAYS_INLINE void bx2_codes64(const uint8_t * pbits, uint64_t n, __m256i * t0, __m256i * t1) {
    const __m256i idx_lo = _mm256_setr_epi8(0,0,0,0,0,0,0,0, 1,1,1,1,1,1,1,1, 2,2,2,2,2,2,2,2, 3,3,3,3,3,3,3,3);
    const __m256i idx_hi = _mm256_setr_epi8(4,4,4,4,4,4,4,4, 5,5,5,5,5,5,5,5, 6,6,6,6,6,6,6,6, 7,7,7,7,7,7,7,7);
    const __m256i sel    = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i one    = _mm256_set1_epi8(1);
    const __m256i bp     = _mm256_set1_epi64x((long long)bx_load_u64(pbits));
    const __m256i bn     = _mm256_set1_epi64x((long long)n);
    *t0 = _mm256_or_si256(_mm256_min_epu8(_mm256_and_si256(_mm256_shuffle_epi8(bp, idx_lo), sel), one),
                          _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(bn, idx_lo), sel), sel));
    *t1 = _mm256_or_si256(_mm256_min_epu8(_mm256_and_si256(_mm256_shuffle_epi8(bp, idx_hi), sel), one),
                          _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(bn, idx_hi), sel), sel));
}

// Decodes one group (128 weights) into 4 x 32 codes; returns 128 * sum(t) and advances the cursor.
BX_ALWAYS_INLINE int32_t bx2_decode_group(const uint8_t * blk, const uint8_t * pool, uint64_t * cursor,
                                          __m256i t[4]) {
    const uint64_t p0 = bx_load_u64(blk), p1 = bx_load_u64(blk + 8);
    const uint64_t c0 = *cursor;
    const int n0 = __builtin_popcountll(p0), n1 = __builtin_popcountll(p1);
    const uint64_t c1 = c0 + (uint64_t)n0;
    *cursor = c1 + (uint64_t)n1;
    const uint64_t m0 = bx_pdep(bx_sign_window(pool, c0), p0);
    const uint64_t m1 = bx_pdep(bx_sign_window(pool, c1), p1);
    bx2_codes64(blk,     m0, &t[0], &t[1]);
    bx2_codes64(blk + 8, m1, &t[2], &t[3]);
    return 128 * (n0 + n1 - 2 * (__builtin_popcountll(m0) + __builtin_popcountll(m1)));
}

// Lane partial sums (8 x int32) of sum t*q' over one group; |lane| <= 16 * 255.
BX_ALWAYS_INLINE __m256i bx2_dot_group(const __m256i t[4], const uint8_t * qp) {
    __m256i s = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)qp), t[0]);
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(qp + 32)), t[1]));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(qp + 64)), t[2]));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(qp + 96)), t[3]));
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));   // int16 lanes <= 4 * 510: no saturation
}

// 8 vectors of 8 lane partial sums -> one vector of the 8 totals, in input order.
BX_ALWAYS_INLINE __m256i bx2_tree8(const __m256i x[8]) {
    const __m256i h01 = _mm256_hadd_epi32(x[0], x[1]);
    const __m256i h23 = _mm256_hadd_epi32(x[2], x[3]);
    const __m256i h45 = _mm256_hadd_epi32(x[4], x[5]);
    const __m256i h67 = _mm256_hadd_epi32(x[6], x[7]);
    const __m256i k03 = _mm256_hadd_epi32(h01, h23);    // per 128-bit lane: x0..x3 partials
    const __m256i k47 = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(k03, k47, 0x20), _mm256_permute2x128_si256(k03, k47, 0x31));
}

// Rows per pass of the AVX2 GEMV. 1: with only 16 ymm registers a second interleaved row spills and measured
// slower (3.7 vs 3.5 ticks per 32 weights); the loop below has no remainder handling for larger values.
#define BX2_GEMV_ROWS 1

// One full chunk (16 groups) of rows r0 .. r0+nrt-1 against one staged column (q' = q ^ 0x80), codes never
// stored. g128 is a compile-time constant at both call sites.
BX_ALWAYS_INLINE void bx2_gemv_rows(const bitcos_rows * w, int64_t r0, int nrt, int64_t g0, const int ng,
                                    const uint8_t * q, const float * yd, const int g128, uint64_t * cursor,
                                    float (*acc)[BX_CT]) {
    const size_t bb = g128 ? BITCOS_BLOCK_BYTES_G128 : BITCOS_BLOCK_BYTES_PT;
    for (int r = 0; r + BX2_GEMV_ROWS <= nrt; r += BX2_GEMV_ROWS) {
        const uint8_t * row[BX2_GEMV_ROWS];
        uint64_t        cur[BX2_GEMV_ROWS];
        bx_row_chunk    rc[BX2_GEMV_ROWS];
        __m256i         x[BX2_GEMV_ROWS][BX_CHUNK_G];
#pragma GCC unroll 8
        for (int i = 0; i < BX2_GEMV_ROWS; ++i) {
            row[i] = w->blocks + (size_t)(r0 + r + i) * w->row_bytes + (size_t)g0 * bb;
            cur[i] = cursor[r + i];
        }
#pragma GCC unroll 16
        for (int g = 0; g < BX_CHUNK_G; ++g) {
#pragma GCC unroll 8
            for (int i = 0; i < BX2_GEMV_ROWS; ++i) {
                const uint8_t * blk = row[i] + (size_t)g * bb;
                if (g < ng) {
                    __m256i t[4];
                    rc[i].corr[BX_SLOT(g)] = bx2_decode_group(blk, w->pool, &cur[i], t);
                    rc[i].dh[BX_SLOT(g)]   = bx_group_scale_bits(blk, g128);
                    x[i][BX_SLOT(g)]       = bx2_dot_group(t, q + 128*g);
                } else {
                    rc[i].corr[BX_SLOT(g)] = 0;
                    rc[i].dh[BX_SLOT(g)]   = 0;
                    x[i][BX_SLOT(g)]       = _mm256_setzero_si256();
                }
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < BX2_GEMV_ROWS; ++i) {
            cursor[r + i] = cur[i];
            __m256 de = _mm256_setzero_ps(), dodd = _mm256_setzero_ps();
            if (g128) bx_chunk_scales(&rc[i], &de, &dodd);
            const __m256i ie = _mm256_sub_epi32(bx2_tree8(x[i]),     _mm256_loadu_si256((const __m256i *)rc[i].corr));
            const __m256i io = _mm256_sub_epi32(bx2_tree8(x[i] + 8), _mm256_loadu_si256((const __m256i *)(rc[i].corr + 8)));
            acc[r + i][0] = bx_float_phase(ie, io, de, dodd, yd, ng, g128, acc[r + i][0]);
        }
    }
}

void bitcos_mm_avx2(const bitcos_rows * w, int64_t nr,
                    const bitcos_q8_K * const * y, int64_t nc, float * const * dst) {
    const int64_t nb   = w->k / BITCOS_QK;
    const int     g128 = w->variant == BITCOS_VARIANT_G128;
    const size_t  bb   = g128 ? BITCOS_BLOCK_BYTES_G128 : BITCOS_BLOCK_BYTES_PT;
    _Alignas(64) uint8_t qbuf[BX_CT][BX_CHUNK_K];
    _Alignas(64) float   ydbuf[BX_CT][8];
    _Alignas(64) __m256i tbuf[BX_CHUNK_G][4];
    uint64_t cursor[BX_RT];
    float    acc[BX_RT][BX_CT];
    for (int64_t r0 = 0; r0 < nr; r0 += BX_RT) {
        const int nrt = (int)(nr - r0 < BX_RT ? nr - r0 : BX_RT);
        for (int64_t c0 = 0; c0 < nc; c0 += BX_CT) {
            const int nct = (int)(nc - c0 < BX_CT ? nc - c0 : BX_CT);
            for (int r = 0; r < nrt; ++r) {
                cursor[r] = w->sign_pos[r0 + r];
                for (int c = 0; c < nct; ++c) acc[r][c] = 0.0f;
            }
            for (int64_t g0 = 0; g0 < nb; g0 += BX_CHUNK_G) {
                const int ng = (int)(nb - g0 < BX_CHUNK_G ? nb - g0 : BX_CHUNK_G);
                bx_stage_columns(y, c0, nct, g0, ng, (char)0x80, qbuf, ydbuf);
                if (nct == 1) {
                    // GEMV: decode straight into the dot products, no staging of the codes
                    if (ng == BX_CHUNK_G) {
                        if (g128) bx2_gemv_rows(w, r0, nrt, g0, BX_CHUNK_G, qbuf[0], ydbuf[0], 1, cursor, acc);
                        else      bx2_gemv_rows(w, r0, nrt, g0, BX_CHUNK_G, qbuf[0], ydbuf[0], 0, cursor, acc);
                    } else {
                        if (g128) bx2_gemv_rows(w, r0, nrt, g0, ng, qbuf[0], ydbuf[0], 1, cursor, acc);
                        else      bx2_gemv_rows(w, r0, nrt, g0, ng, qbuf[0], ydbuf[0], 0, cursor, acc);
                    }
                    continue;
                }
                for (int r = 0; r < nrt; ++r) {
                    const uint8_t * row = w->blocks + (size_t)(r0 + r) * w->row_bytes + (size_t)g0 * bb;
                    bx_row_chunk rc;
                    for (int g = 0; g < BX_CHUNK_G; ++g) {
                        const int s = BX_SLOT(g);
                        if (g < ng) {
                            const uint8_t * blk = row + (size_t)g * bb;
                            rc.corr[s] = bx2_decode_group(blk, w->pool, &cursor[r], tbuf[g]);
                            rc.dh[s]   = bx_group_scale_bits(blk, g128);
                        } else {
                            rc.corr[s] = 0;
                            rc.dh[s]   = 0;
                        }
                    }
                    __m256 de, dodd;
                    bx_chunk_scales(&rc, &de, &dodd);
                    for (int c = 0; c < nct; ++c) {
                        __m256i xe[8], xo[8];
                        for (int j = 0; j < 8; ++j) {
                            xe[j] = 2*j < ng     ? bx2_dot_group(tbuf[2*j],     qbuf[c] + 128*(2*j))     : _mm256_setzero_si256();
                            xo[j] = 2*j + 1 < ng ? bx2_dot_group(tbuf[2*j + 1], qbuf[c] + 128*(2*j + 1)) : _mm256_setzero_si256();
                        }
                        const __m256i ce = _mm256_loadu_si256((const __m256i *)rc.corr);
                        const __m256i co = _mm256_loadu_si256((const __m256i *)(rc.corr + 8));
                        acc[r][c] = bx_float_phase(_mm256_sub_epi32(bx2_tree8(xe), ce), _mm256_sub_epi32(bx2_tree8(xo), co),
                                                   de, dodd, ydbuf[c], ng, g128, acc[r][c]);
                    }
                }
            }
            for (int r = 0; r < nrt; ++r) {
                for (int c = 0; c < nct; ++c) {
                    dst[c0 + c][r0 + r] = g128 ? acc[r][c] : acc[r][c] * w->scale;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// AVX-512
// ---------------------------------------------------------------------------------------------------------
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)

// acc + sum over 4-byte groups of u(u8) * q(s8), per int32 lane.
BX_ALWAYS_INLINE __m512i bx5_dpbusd(__m512i acc, __m512i u, __m512i q) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, u, q);
#else
    const __m512i p16 = _mm512_maddubs_epi16(u, q);        // |pair| <= 2 * 256: no saturation
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p16, _mm512_set1_epi16(1)));
#endif
}

// Codes of one group as u = t + 1 in {0, 1, 2} (unsigned operand of vpdpbusd against the raw signed q):
// sum u*q = sum t*q + sum q, and sum q per group is a column property staged once per tile. Two masked
// byte moves per 64 weights: blend by P (1 -> 2), then zero the negative lanes N.
typedef struct { __m512i lo, hi; } bx5_codes;

BX_ALWAYS_INLINE uint64_t bx5_half(const uint8_t * bits, const uint8_t * pool, uint64_t * cursor, __m512i * u) {
    const uint64_t p   = bx_load_u64(bits);
    const uint64_t pos = *cursor;
    *cursor = pos + (uint64_t)__builtin_popcountll(p);
    const uint64_t n = bx_pdep(bx_sign_window(pool, pos), p);
    const __m512i one = _mm512_set1_epi8(1), two = _mm512_set1_epi8(2);
    *u = _mm512_mask_mov_epi8(_mm512_mask_blend_epi8(_cvtu64_mask64(p), one, two), _cvtu64_mask64(n),
                              _mm512_setzero_si512());
    return n;
}

BX_ALWAYS_INLINE void bx5_decode_group(const uint8_t * blk, const uint8_t * pool, uint64_t * cursor, bx5_codes * t) {
    bx5_half(blk,     pool, cursor, &t->lo);
    bx5_half(blk + 8, pool, cursor, &t->hi);
}

BX_ALWAYS_INLINE __m512i bx5_dot_group(const bx5_codes * t, const uint8_t * q) {
    __m512i s = bx5_dpbusd(_mm512_setzero_si512(), t->lo, _mm512_loadu_si512((const void *)q));
    return bx5_dpbusd(s, t->hi, _mm512_loadu_si512((const void *)(q + 64)));
}

// 16 vectors of 16 lane partial sums (|lane| <= 8 * 256) -> one vector of the 16 totals in input order.
// Two levels of packs_epi32 + madd_epi16 (exact: every intermediate fits int16) sum within 128-bit lanes;
// two levels of 128-bit lane shuffles finish across lanes: 33 ops for 16 groups. (An unpack + add tree
// that keeps the multiplier pipe free for vpdpbusd needs 45 ops and measured slightly slower here.)
BX_ALWAYS_INLINE __m512i bx5_tree16(const __m512i x[16]) {
    __m512i yv[8], zv[4];
    const __m512i ones = _mm512_set1_epi16(1);
    for (int j = 0; j < 8; ++j) yv[j] = _mm512_madd_epi16(_mm512_packs_epi32(x[2*j], x[2*j + 1]), ones);
    for (int j = 0; j < 4; ++j) zv[j] = _mm512_madd_epi16(_mm512_packs_epi32(yv[2*j], yv[2*j + 1]), ones);
    // zv[m], 128-bit lane L: partial sums over lane L of x[4m .. 4m+3]
    const __m512i w01 = _mm512_add_epi32(_mm512_shuffle_i32x4(zv[0], zv[1], 0x88), _mm512_shuffle_i32x4(zv[0], zv[1], 0xDD));
    const __m512i w23 = _mm512_add_epi32(_mm512_shuffle_i32x4(zv[2], zv[3], 0x88), _mm512_shuffle_i32x4(zv[2], zv[3], 0xDD));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(w01, w23, 0x88), _mm512_shuffle_i32x4(w01, w23, 0xDD));
}

// sum q of each group of a staged column chunk, by slot.
BX_ALWAYS_INLINE __m512i bx5_column_sums(const uint8_t * q) {
    const __m512i one = _mm512_set1_epi8(1);
    __m512i x[BX_CHUNK_G];
    for (int g = 0; g < BX_CHUNK_G; ++g) {
        const __m512i s = bx5_dpbusd(_mm512_setzero_si512(), one, _mm512_loadu_si512((const void *)(q + 128*g)));
        x[BX_SLOT(g)] = bx5_dpbusd(s, one, _mm512_loadu_si512((const void *)(q + 128*g + 64)));
    }
    return bx5_tree16(x);
}

// Float part for a reduced chunk (slot order) and the row's scales.
BX_ALWAYS_INLINE float bx5_float_phase(__m512i isum, __m256 de, __m256 dodd, const float * yd, int ng, int g128,
                                       float acc) {
    return bx_float_phase(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1), de, dodd, yd, ng,
                          g128, acc);
}

// One full chunk (16 groups) of rows r0 .. r0+nrt-1 against one staged column, codes never stored:
// decode -> vpdpbusd -> tree -> float part. g128 is a compile-time constant at both call sites.
#ifndef BX5_GEMV_ROWS
#define BX5_GEMV_ROWS 2
#endif

BX_ALWAYS_INLINE void bx5_gemv_rows(const bitcos_rows * w, int64_t r0, int nrt, int64_t g0, const int ng,
                                    const uint8_t * q, __m512i qsum, const float * yd, const int g128,
                                    uint64_t * cursor, float (*acc)[BX_CT]) {
    const size_t bb = g128 ? BITCOS_BLOCK_BYTES_G128 : BITCOS_BLOCK_BYTES_PT;
    int r = 0;
#if BX5_GEMV_ROWS > 1
    __m512i      isum_buf[BX_RT];    // exact sums of each row pair, float part deferred (see below)
    bx_row_chunk dh_buf[BX_RT];
    // several rows per pass: their decode chains (cursor -> window -> pdep -> mask -> dot) interleave
    for (; r + BX5_GEMV_ROWS <= nrt; r += BX5_GEMV_ROWS) {
        const uint8_t * row[BX5_GEMV_ROWS];
        uint64_t        cur[BX5_GEMV_ROWS];
        bx_row_chunk    rc[BX5_GEMV_ROWS];
        __m512i         x[BX5_GEMV_ROWS][BX_CHUNK_G];
#pragma GCC unroll 8
        for (int i = 0; i < BX5_GEMV_ROWS; ++i) {
            row[i] = w->blocks + (size_t)(r0 + r + i) * w->row_bytes + (size_t)g0 * bb;
            cur[i] = cursor[r + i];
        }
#pragma GCC unroll 16
        for (int g = 0; g < BX_CHUNK_G; ++g) {
#pragma GCC unroll 8
            for (int i = 0; i < BX5_GEMV_ROWS; ++i) {
                const uint8_t * blk = row[i] + (size_t)g * bb;
                if (g < ng) {
                    bx5_codes t;
                    bx5_decode_group(blk, w->pool, &cur[i], &t);
                    rc[i].dh[BX_SLOT(g)] = bx_group_scale_bits(blk, g128);
                    x[i][BX_SLOT(g)]     = bx5_dot_group(&t, q + 128*g);
                } else {
                    rc[i].dh[BX_SLOT(g)] = 0;
                    x[i][BX_SLOT(g)]     = _mm512_setzero_si512();
                }
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < BX5_GEMV_ROWS; ++i) {
            cursor[r + i] = cur[i];
            isum_buf[r + i] = _mm512_sub_epi32(bx5_tree16(x[i]), qsum);
            dh_buf[r + i]   = rc[i];
        }
    }
    // float parts after all decodes of the tile: independent chains, no latency tail between decodes
    // (2.18 vs 2.23 ticks per 32 weights)
    for (int i = 0; i < r; ++i) {
        __m256 de = _mm256_setzero_ps(), dodd = _mm256_setzero_ps();
        if (g128) bx_chunk_scales(&dh_buf[i], &de, &dodd);
        acc[i][0] = bx5_float_phase(isum_buf[i], de, dodd, yd, ng, g128, acc[i][0]);
    }
#endif
    for (; r < nrt; ++r) {
        const uint8_t * row = w->blocks + (size_t)(r0 + r) * w->row_bytes + (size_t)g0 * bb;
        uint64_t cur = cursor[r];
        bx_row_chunk rc;
        __m512i x[BX_CHUNK_G];
#pragma GCC unroll 16
        for (int g = 0; g < BX_CHUNK_G; ++g) {
            const uint8_t * blk = row + (size_t)g * bb;
            if (g < ng) {
                bx5_codes t;
                bx5_decode_group(blk, w->pool, &cur, &t);
                rc.dh[BX_SLOT(g)] = bx_group_scale_bits(blk, g128);
                x[BX_SLOT(g)]     = bx5_dot_group(&t, q + 128*g);
            } else {
                rc.dh[BX_SLOT(g)] = 0;
                x[BX_SLOT(g)]     = _mm512_setzero_si512();
            }
        }
        cursor[r] = cur;
        __m256 de = _mm256_setzero_ps(), dodd = _mm256_setzero_ps();
        if (g128) bx_chunk_scales(&rc, &de, &dodd);
        acc[r][0] = bx5_float_phase(_mm512_sub_epi32(bx5_tree16(x), qsum), de, dodd, yd, ng, g128, acc[r][0]);
    }
}

void bitcos_mm_avx512(const bitcos_rows * w, int64_t nr,
                      const bitcos_q8_K * const * y, int64_t nc, float * const * dst) {
    const int64_t nb   = w->k / BITCOS_QK;
    const int     g128 = w->variant == BITCOS_VARIANT_G128;
    const size_t  bb   = g128 ? BITCOS_BLOCK_BYTES_G128 : BITCOS_BLOCK_BYTES_PT;
    _Alignas(64) uint8_t   qbuf[BX_CT][BX_CHUNK_K];
    _Alignas(64) float     ydbuf[BX_CT][8];
    _Alignas(64) __m512i   qsum[BX_CT];
    _Alignas(64) bx5_codes tbuf[BX_CHUNK_G];
    uint64_t cursor[BX_RT];
    float    acc[BX_RT][BX_CT];
    for (int64_t r0 = 0; r0 < nr; r0 += BX_RT) {
        const int nrt = (int)(nr - r0 < BX_RT ? nr - r0 : BX_RT);
        for (int64_t c0 = 0; c0 < nc; c0 += BX_CT) {
            const int nct = (int)(nc - c0 < BX_CT ? nc - c0 : BX_CT);
            for (int r = 0; r < nrt; ++r) {
                cursor[r] = w->sign_pos[r0 + r];
                for (int c = 0; c < nct; ++c) acc[r][c] = 0.0f;
            }
            for (int64_t g0 = 0; g0 < nb; g0 += BX_CHUNK_G) {
                const int ng = (int)(nb - g0 < BX_CHUNK_G ? nb - g0 : BX_CHUNK_G);
                bx_stage_columns(y, c0, nct, g0, ng, 0, qbuf, ydbuf);
                for (int c = 0; c < nct; ++c) qsum[c] = bx5_column_sums(qbuf[c]);
                if (nct == 1) {
                    // GEMV: decode straight into the dot products, no staging of the codes. Full chunks get
                    // their own instantiation (ng constant: no per-group test in the unrolled loop).
                    if (ng == BX_CHUNK_G) {
                        if (g128) bx5_gemv_rows(w, r0, nrt, g0, BX_CHUNK_G, qbuf[0], qsum[0], ydbuf[0], 1, cursor, acc);
                        else      bx5_gemv_rows(w, r0, nrt, g0, BX_CHUNK_G, qbuf[0], qsum[0], ydbuf[0], 0, cursor, acc);
                    } else {
                        if (g128) bx5_gemv_rows(w, r0, nrt, g0, ng, qbuf[0], qsum[0], ydbuf[0], 1, cursor, acc);
                        else      bx5_gemv_rows(w, r0, nrt, g0, ng, qbuf[0], qsum[0], ydbuf[0], 0, cursor, acc);
                    }
                    continue;
                }
                for (int r = 0; r < nrt; ++r) {
                    const uint8_t * row = w->blocks + (size_t)(r0 + r) * w->row_bytes + (size_t)g0 * bb;
                    bx_row_chunk rc;
                    for (int g = 0; g < BX_CHUNK_G; ++g) {
                        const int s = BX_SLOT(g);
                        if (g < ng) {
                            const uint8_t * blk = row + (size_t)g * bb;
                            bx5_decode_group(blk, w->pool, &cursor[r], &tbuf[g]);
                            rc.dh[s] = bx_group_scale_bits(blk, g128);
                        } else {
                            rc.dh[s] = 0;
                        }
                    }
                    __m256 de = _mm256_setzero_ps(), dodd = _mm256_setzero_ps();
                    if (g128) bx_chunk_scales(&rc, &de, &dodd);
                    for (int c = 0; c < nct; ++c) {
                        __m512i x[BX_CHUNK_G];
                        for (int g = 0; g < BX_CHUNK_G; ++g) {
                            x[BX_SLOT(g)] = g < ng ? bx5_dot_group(&tbuf[g], qbuf[c] + 128*g) : _mm512_setzero_si512();
                        }
                        acc[r][c] = bx5_float_phase(_mm512_sub_epi32(bx5_tree16(x), qsum[c]), de, dodd, ydbuf[c],
                                                    ng, g128, acc[r][c]);
                    }
                }
            }
            for (int r = 0; r < nrt; ++r) {
                for (int c = 0; c < nct; ++c) {
                    dst[c0 + c][r0 + r] = g128 ? acc[r][c] : acc[r][c] * w->scale;
                }
            }
        }
    }
}

#endif // AVX-512
#endif // x86-64 && AVX2
