// x86 SIMD BITCOS kernels: AVX2 and AVX-512 (F/BW/VL; VNNI, BMI2 and F16C used when present).
//
// Contract: bitcos-kernels.h, arithmetic contract v2 (results bit-identical to bitcos_mm_generic, hence to
// llama.cpp's AVX2 TQ2_0 kernel). Design notes and measured cycles: docs/KERNELS.md. This file defines only
// what the compiler's target flags allow (the same guards as the header's declarations): on a non-x86
// target, or without AVX2, it defines nothing. Compile it with -ffp-contract=off like every kernel file:
// the only fused operation allowed is the contract's explicit FMA (BITCOS_FMA), which is written as an
// intrinsic here; GCC would otherwise fuse the BITCOS_FMA=0 form's multiply and add.
//
// Integer part (exact). Per 64 weights of a row: P = presence word, S = 64 sign bits at the row's cursor
// (the AVX-512 GEMV reads S with one byte-granular load when the row tile is not dense, KERNELS.md §3),
// N = pdep(S, P) (negative lanes), cursor += |P|; the codes are used as u = t + 1 in {0, 1, 2}, the
// unsigned operand of a byte dot product against the raw signed activations q (exact for q = -128 too):
//   AVX-512: u from two masked byte moves (blend by P: 1 -> 2, zero by N); vpdpbusd over 64-byte chunks
//     gives dword m = sum over j % 64 in [4m, 4m+4), so the contract's lane l (j % 32 in [4l, 4l+4)) is
//     dword l + dword l+8 ("fold"). Four vpdpbusd per Q8_K block go into one register; the half-0 partial
//     (after the first two) is kept for G128 blocks whose two fp16 scales differ.
//   AVX2: u from P and N expanded to bytes (broadcast, pshufb, and, cmpeq); vpmaddubsw over 32-byte chunks,
//     summed in int16 (|word| <= 8 * 512), then vpmaddwd(., 1) gives the 8 contract lanes directly.
// Minus the 32-position activation sums of the block (a column property, staged once per tile and chunk).
// Float part: one 8-lane FMA (two for a G128 block with different half scales) per block, the final
// reduction in the contract's order. AVX-512 keeps two 8-lane accumulators in one zmm: two rows against
// one column (GEMV) or one row against two columns (several columns), so the fold, conversion and FMA
// serve two accumulators per instruction; every lane is still exactly the contract's operation.
// GEMV (one column) decodes straight into the dot products, two rows interleaved (AVX-512: rows r and r + nrh,
// so that the bitmap and sign reads stay four sequential streams, or adjacent rows when rows are short;
// KERNELS.md §5, memory). With several
// columns each row's codes are decoded once and reused for every column of the tile: AVX-512 block by
// block in registers (all column pairs before the next block), AVX2 a chunk at a time into a code buffer.
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

#if BITCOS_FMA && !defined(__FMA__)
#error "BITCOS_FMA=1 needs FMA instructions in the x86 kernels: compile with -mfma (or -DBITCOS_FMA=0)"
#endif

#define BX_ALWAYS_INLINE static inline __attribute__((always_inline))
#define BX_CHUNK_B 8                     // Q8_K blocks per chunk (2048 weights): staging granularity
#define BX_CT      8                     // activation columns per tile
#define BX_RT      32                    // rows per tile (amortises the staging of the columns)
// GEMV memory order (docs/KERNELS.md §5): a row (AVX2) or a row pair (AVX-512) walks up to BX_GEMV_SPAN
// chunks before the next, so the bitmap and the sign pool are read as a few sequential streams through the
// row tile; the bitmap is also prefetched BX_PF_BITS bytes ahead of each row's position (0: no prefetch).
#define BX_GEMV_SPAN 8                   // chunks (16384 weights) of a column staged at once; <= BX_CT
_Static_assert(BX_GEMV_SPAN <= BX_CT, "the GEMV stages a span's chunks in the column tile's buffers");
// Rows of at most this many block bytes (PT: k <= 4096) pair adjacent rows in the GEMV (see bitcos_mm_avx512)
#ifndef BX_ADJ_ROW_BYTES
#define BX_ADJ_ROW_BYTES 512
#endif
#ifndef BX_PF_BITS
#define BX_PF_BITS 512
#endif

BX_ALWAYS_INLINE uint64_t bx_load_u64(const uint8_t * p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

BX_ALWAYS_INLINE uint16_t bx_load_u16(const uint8_t * p) {
    uint16_t v;
    memcpy(&v, p, 2);
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

// Negative-lane word of the 64 weights with presence word p at the row's cursor; advances the cursor.
BX_ALWAYS_INLINE uint64_t bx_negatives(uint64_t p, const uint8_t * pool, uint64_t * cursor) {
    const uint64_t pos = *cursor;
    *cursor = pos + (uint64_t)__builtin_popcountll(p);
    return bx_pdep(bx_sign_window(pool, pos), p);
}

// Same with a cheaper window for rows that are not dense: one unaligned load at byte pos / 8, shifted by
// pos % 8, holds at least 57 valid bits, enough for any word with popcount <= 57; denser words take the
// two-qword window (a branch, so a row whose words often exceed 57 present weights should not use this).
// Reads at most up to byte (pos >> 3) + 7 of the pool on the fast path.
// checked = 0: the caller has verified that every word it passes has at most 57 present weights (the AVX-512
// GEMV checks a PT row pair's chunk with vector popcounts up front), so the per-word test goes away.
BX_ALWAYS_INLINE uint64_t bx_negatives_fast(uint64_t p, const uint8_t * pool, uint64_t * cursor, const int checked) {
    const uint64_t pos = *cursor;
    const uint64_t n   = (uint64_t)__builtin_popcountll(p);
    *cursor = pos + n;
    uint64_t s = bx_load_u64(pool + (pos >> 3)) >> (pos & 7);
    if (checked && __builtin_expect(n > 57, 0)) s = bx_sign_window(pool, pos);
    return bx_pdep(s, p);
}

// fp16 -> fp32, exact either way.
BX_ALWAYS_INLINE float bx_h2f(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return bitcos_fp16_to_fp32(h);
#endif
}

// The contract's FMA(a, b, c), 8 lanes.
BX_ALWAYS_INLINE __m256 bx_fma8(__m256 a, __m256 b, __m256 c) {
#if BITCOS_FMA
    return _mm256_fmadd_ps(a, b, c);
#else
    return _mm256_add_ps(_mm256_mul_ps(a, b), c);
#endif
}

// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), the contract's final reduction.
BX_ALWAYS_INLINE float bx_reduce8(__m256 a) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));  // a_l + a_{l+4}
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                                    // s0+s2, s1+s3
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// 8 vectors of 8 int32 -> one vector of the 8 totals, in input order.
BX_ALWAYS_INLINE __m256i bx2_tree8(const __m256i x[8]) {
    const __m256i h01 = _mm256_hadd_epi32(x[0], x[1]);
    const __m256i h23 = _mm256_hadd_epi32(x[2], x[3]);
    const __m256i h45 = _mm256_hadd_epi32(x[4], x[5]);
    const __m256i h67 = _mm256_hadd_epi32(x[6], x[7]);
    const __m256i k03 = _mm256_hadd_epi32(h01, h23);    // per 128-bit lane: x0..x3 partials
    const __m256i k47 = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(k03, k47, 0x20), _mm256_permute2x128_si256(k03, k47, 0x31));
}

// The 8 sums of 32 consecutive activations of a Q8_K block (lane l: positions 32l .. 32l+31; lanes 4..7
// zero when the block has only its first half in the matrix): the contract's subtracted term.
BX_ALWAYS_INLINE __m256i bx_block_qsums(const int8_t * qs, int halves) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256i v[8];
    for (int i = 0; i < 8; ++i) {
        v[i] = i < 4*halves
             ? _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, _mm256_loadu_si256((const __m256i *)(qs + 32*i))), ones16)
             : _mm256_setzero_si256();
    }
    return bx2_tree8(v);
}

// Staged data of one activation column for one chunk of blocks.
typedef struct {
    __m256i        qsum[BX_CHUNK_B];   // bx_block_qsums of each block
    float          yd[BX_CHUNK_B];     // y.d
    float          dpt[BX_CHUNK_B];    // PT: y.d * scale
    const int8_t * qs[BX_CHUNK_B];     // the block's activations
} bx_col_chunk;

BX_ALWAYS_INLINE void bx_stage_column(const bitcos_q8_K * yc, int64_t b0, int nbk, int64_t nb, float scale,
                                      bx_col_chunk * cc) {
    for (int j = 0; j < nbk; ++j) {
        const int64_t b = b0 + j;
        const int halves = 2*b + 1 < nb ? 2 : 1;
        cc->qsum[j] = bx_block_qsums(yc[b].qs, halves);
        cc->yd[j]   = yc[b].d;
        cc->dpt[j]  = yc[b].d * scale;
        cc->qs[j]   = yc[b].qs;
    }
}

// fp16 scales of G128 block b of a row (e1 = e0 for a block with one half), as the contract defines them.
BX_ALWAYS_INLINE void bx_block_scale_bits(const uint8_t * row, int64_t b, int halves, uint16_t * e0, uint16_t * e1) {
    *e0 = bx_load_u16(row + (size_t)(2*b) * BITCOS_BLOCK_BYTES_G128 + 16);
    *e1 = halves == 2 ? bx_load_u16(row + (size_t)(2*b + 1) * BITCOS_BLOCK_BYTES_G128 + 16) : *e0;
}

// ---------------------------------------------------------------------------------------------------------
// AVX2
// ---------------------------------------------------------------------------------------------------------

// Codes u = t + 1 in {0, 1, 2} of 64 weights from the presence word at pbits and the negative-lane word n,
// as two vectors of 32. Each word is broadcast once, pshufb copies byte i of the word to lanes 8i .. 8i+7,
// and-ing with 1, 2, 4, .. 128 and cmpeq give -1 where lane j's bit is set; u = (1 - pm) & ~nm.
BX_ALWAYS_INLINE void bx2_codes64(const uint8_t * pbits, uint64_t n, __m256i * u0, __m256i * u1) {
    const __m256i idx_lo = _mm256_setr_epi8(0,0,0,0,0,0,0,0, 1,1,1,1,1,1,1,1, 2,2,2,2,2,2,2,2, 3,3,3,3,3,3,3,3);
    const __m256i idx_hi = _mm256_setr_epi8(4,4,4,4,4,4,4,4, 5,5,5,5,5,5,5,5, 6,6,6,6,6,6,6,6, 7,7,7,7,7,7,7,7);
    const __m256i sel    = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i one    = _mm256_set1_epi8(1);
    const __m256i bp     = _mm256_set1_epi64x((long long)bx_load_u64(pbits));
    const __m256i bn     = _mm256_set1_epi64x((long long)n);
    const __m256i pm0 = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(bp, idx_lo), sel), sel);
    const __m256i nm0 = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(bn, idx_lo), sel), sel);
    const __m256i pm1 = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(bp, idx_hi), sel), sel);
    const __m256i nm1 = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(bn, idx_hi), sel), sel);
    *u0 = _mm256_andnot_si256(nm0, _mm256_sub_epi8(one, pm0));
    *u1 = _mm256_andnot_si256(nm1, _mm256_sub_epi8(one, pm1));
}

// Decodes the 128 codes of one G128/PT block into u[0..3].
BX_ALWAYS_INLINE void bx2_decode_half(const uint8_t * blk, const uint8_t * pool, uint64_t * cursor, __m256i u[4]) {
    const uint64_t n0 = bx_negatives(bx_load_u64(blk), pool, cursor);
    const uint64_t n1 = bx_negatives(bx_load_u64(blk + 8), pool, cursor);
    bx2_codes64(blk,     n0, &u[0], &u[1]);
    bx2_codes64(blk + 8, n1, &u[2], &u[3]);
}

// int16 lanes of sum u*q over 128 weights (4 x 32): |word| <= 4 * 512.
BX_ALWAYS_INLINE __m256i bx2_dot_half(const __m256i u[4], const int8_t * q) {
    __m256i s = _mm256_maddubs_epi16(u[0], _mm256_loadu_si256((const __m256i *)q));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(u[1], _mm256_loadu_si256((const __m256i *)(q + 32))));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(u[2], _mm256_loadu_si256((const __m256i *)(q + 64))));
    return _mm256_add_epi16(s, _mm256_maddubs_epi16(u[3], _mm256_loadu_si256((const __m256i *)(q + 96))));
}

// Float part of one block for one (row, column): s0 / s are the int16 dot products of half 0 / the whole
// block (s = s0 when the block has one half), per the contract.
BX_ALWAYS_INLINE __m256 bx2_block_float(__m256i s0, __m256i s, __m256i qsum, const uint8_t * row, int64_t b,
                                        int halves, float yd, float dpt, int g128, __m256 acc) {
    const __m256i ones16 = _mm256_set1_epi16(1);
    const __m256i lf = _mm256_sub_epi32(_mm256_madd_epi16(s, ones16), qsum);
    if (!g128) {
        return bx_fma8(_mm256_cvtepi32_ps(lf), _mm256_set1_ps(dpt), acc);
    }
    uint16_t e0, e1;
    bx_block_scale_bits(row, b, halves, &e0, &e1);
    const __m256 d0 = _mm256_set1_ps(yd * bx_h2f(e0));
    if (e0 == e1) {
        return bx_fma8(_mm256_cvtepi32_ps(lf), d0, acc);
    }
    // half 0 subtracts the sums of positions 0..127 (lanes 0..3), half 1 those of 128..255 (lanes 4..7)
    const __m256i l0 = _mm256_sub_epi32(_mm256_madd_epi16(s0, ones16), _mm256_blend_epi32(qsum, _mm256_setzero_si256(), 0xF0));
    const __m256i l1 = _mm256_sub_epi32(lf, l0);
    acc = bx_fma8(_mm256_cvtepi32_ps(l0), d0, acc);
    return bx_fma8(_mm256_cvtepi32_ps(l1), _mm256_set1_ps(yd * bx_h2f(e1)), acc);
}

void bitcos_mm_avx2(const bitcos_rows * w, int64_t nr,
                    const bitcos_q8_K * const * y, int64_t nc, float * const * dst) {
    const int64_t nb   = w->k / BITCOS_QK;
    const int64_t nby  = (nb + 1) / 2;
    const int     g128 = w->variant == BITCOS_VARIANT_G128;
    const size_t  bb   = g128 ? BITCOS_BLOCK_BYTES_G128 : BITCOS_BLOCK_BYTES_PT;
    _Alignas(64) bx_col_chunk cc[BX_CT];
    _Alignas(64) __m256i      ubuf[BX_CHUNK_B][8];
    _Alignas(64) __m256       acc[BX_RT][BX_CT];
    uint64_t cursor[BX_RT];
    for (int64_t r0 = 0; r0 < nr; r0 += BX_RT) {
        const int nrt = (int)(nr - r0 < BX_RT ? nr - r0 : BX_RT);
        for (int64_t c0 = 0; c0 < nc; c0 += BX_CT) {
            const int nct = (int)(nc - c0 < BX_CT ? nc - c0 : BX_CT);
            for (int r = 0; r < nrt; ++r) {
                cursor[r] = w->sign_pos[r0 + r];
                for (int c = 0; c < nct; ++c) acc[r][c] = _mm256_setzero_ps();
            }
            if (nct == 1) {
                // GEMV: decode straight into the dot products, one row at a time over a span of up to
                // BX_GEMV_SPAN chunks (the column staged in cc[0 ..]), so the bitmap and the sign pool are
                // each read as one sequential stream through the tile (KERNELS.md §5, memory).
                for (int64_t s0 = 0; s0 < nby; s0 += BX_GEMV_SPAN * BX_CHUNK_B) {
                    const int64_t s1 = nby - s0 < BX_GEMV_SPAN * BX_CHUNK_B ? nby : s0 + BX_GEMV_SPAN * BX_CHUNK_B;
                    for (int64_t b0 = s0; b0 < s1; b0 += BX_CHUNK_B) {
                        const int nbk = (int)(nby - b0 < BX_CHUNK_B ? nby - b0 : BX_CHUNK_B);
                        bx_stage_column(y[c0], b0, nbk, nb, w->scale, &cc[(b0 - s0) / BX_CHUNK_B]);
                    }
                    for (int r = 0; r < nrt; ++r) {
                        const uint8_t * row = w->blocks + (size_t)(r0 + r) * w->row_bytes;
                        uint64_t cur = cursor[r];
                        __m256 a = acc[r][0];
                        for (int64_t b0 = s0; b0 < s1; b0 += BX_CHUNK_B) {
                            const bx_col_chunk * ch = &cc[(b0 - s0) / BX_CHUNK_B];
                            const int nbk = (int)(nby - b0 < BX_CHUNK_B ? nby - b0 : BX_CHUNK_B);
                            for (int j = 0; j < nbk; ++j) {
                                const int64_t b = b0 + j;
                                const int halves = 2*b + 1 < nb ? 2 : 1;
                                __m256i u[4];
#if BX_PF_BITS
                                _mm_prefetch((const char *)(row + (size_t)(2*b) * bb + BX_PF_BITS), _MM_HINT_T0);
#endif
                                bx2_decode_half(row + (size_t)(2*b) * bb, w->pool, &cur, u);
                                const __m256i s0v = bx2_dot_half(u, ch->qs[j]);
                                __m256i sv = s0v;
                                if (halves == 2) {
                                    bx2_decode_half(row + (size_t)(2*b + 1) * bb, w->pool, &cur, u);
                                    sv = _mm256_add_epi16(s0v, bx2_dot_half(u, ch->qs[j] + 128));
                                }
                                a = bx2_block_float(s0v, sv, ch->qsum[j], row, b, halves, ch->yd[j], ch->dpt[j], g128, a);
                            }
                        }
                        acc[r][0] = a;
                        cursor[r] = cur;
                    }
                }
            }
            for (int64_t b0 = 0; nct > 1 && b0 < nby; b0 += BX_CHUNK_B) {   // several columns
                const int nbk = (int)(nby - b0 < BX_CHUNK_B ? nby - b0 : BX_CHUNK_B);
                for (int c = 0; c < nct; ++c) bx_stage_column(y[c0 + c], b0, nbk, nb, w->scale, &cc[c]);
                for (int r = 0; r < nrt; ++r) {
                    const uint8_t * row = w->blocks + (size_t)(r0 + r) * w->row_bytes;
                    for (int j = 0; j < nbk; ++j) {
                        const int64_t b = b0 + j;
                        bx2_decode_half(row + (size_t)(2*b) * bb, w->pool, &cursor[r], ubuf[j]);
                        if (2*b + 1 < nb) bx2_decode_half(row + (size_t)(2*b + 1) * bb, w->pool, &cursor[r], ubuf[j] + 4);
                    }
                    for (int c = 0; c < nct; ++c) {
                        __m256 a = acc[r][c];
                        for (int j = 0; j < nbk; ++j) {
                            const int64_t b = b0 + j;
                            const int halves = 2*b + 1 < nb ? 2 : 1;
                            const __m256i s0 = bx2_dot_half(ubuf[j], cc[c].qs[j]);
                            const __m256i s  = halves == 2 ? _mm256_add_epi16(s0, bx2_dot_half(ubuf[j] + 4, cc[c].qs[j] + 128)) : s0;
                            a = bx2_block_float(s0, s, cc[c].qsum[j], row, b, halves, cc[c].yd[j], cc[c].dpt[j], g128, a);
                        }
                        acc[r][c] = a;
                    }
                }
            }
            for (int r = 0; r < nrt; ++r) {
                for (int c = 0; c < nct; ++c) dst[c0 + c][r0 + r] = bx_reduce8(acc[r][c]);
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

// The contract's FMA(a, b, c), 16 lanes.
BX_ALWAYS_INLINE __m512 bx5_fma16(__m512 a, __m512 b, __m512 c) {
#if BITCOS_FMA
    return _mm512_fmadd_ps(a, b, c);
#else
    return _mm512_add_ps(_mm512_mul_ps(a, b), c);
#endif
}

// Sign windows of the AVX-512 decode (KERNELS.md §3): BX_WIN_QWORDS two aligned qwords (any word),
// BX_WIN_BYTE one byte-granular load with the dense-word fallback, BX_WIN_BYTE_UNCHECKED the same load with
// no per-word test (only for words known to hold at most 57 present weights).
#define BX_WIN_QWORDS          0
#define BX_WIN_BYTE            1
#define BX_WIN_BYTE_UNCHECKED  2

// u = t + 1 of 64 weights: two masked byte moves (blend by P: 1 -> 2, then zero the negative lanes N).
// The P mask is loaded from memory (kmovq k, m64) instead of moved from the GPR that popcount reads:
// 64-bit GPR -> mask writes bound the GEMV on Zen 5 (2.21 vs 2.31 ticks per 32 weights, G128 with equal
// halves; the multi-column path is within 3 % either way). Inline asm, because GCC merges _load_mask64
// with the GPR load of the same word.
BX_ALWAYS_INLINE __m512i bx5_codes64w(const uint8_t * bits, const uint8_t * pool, uint64_t * cursor, const int win) {
    const uint64_t p = bx_load_u64(bits);
    const uint64_t n = win == BX_WIN_QWORDS ? bx_negatives(p, pool, cursor)
                     : bx_negatives_fast(p, pool, cursor, win == BX_WIN_BYTE);
    __mmask64 pm;
    __asm__("kmovq %1, %0" : "=k"(pm) : "m"(*(const uint64_t *)bits));
    return _mm512_mask_mov_epi8(_mm512_mask_blend_epi8(pm, _mm512_set1_epi8(1), _mm512_set1_epi8(2)),
                                _cvtu64_mask64(n), _mm512_setzero_si512());
}

BX_ALWAYS_INLINE __m512i bx5_codes64(const uint8_t * bits, const uint8_t * pool, uint64_t * cursor) {
    return bx5_codes64w(bits, pool, cursor, BX_WIN_QWORDS);
}

// Dword lanes of one block's dot products: z0 over half 0, z over the block (z = z0 with one half).
// Decodes the row's codes on the way (GEMV form).
BX_ALWAYS_INLINE void bx5_block_dots(const uint8_t * blk, size_t bb, int halves, const uint8_t * pool,
                                     uint64_t * cursor, const int8_t * q, const int win, __m512i * z0, __m512i * z) {
    const __m512i u0 = bx5_codes64w(blk,     pool, cursor, win);
    const __m512i u1 = bx5_codes64w(blk + 8, pool, cursor, win);
    *z0 = bx5_dpbusd(bx5_dpbusd(_mm512_setzero_si512(), u0, _mm512_loadu_si512((const void *)q)),
                     u1, _mm512_loadu_si512((const void *)(q + 64)));
    *z = *z0;
    if (halves == 2) {
        const __m512i u2 = bx5_codes64w(blk + bb,     pool, cursor, win);
        const __m512i u3 = bx5_codes64w(blk + bb + 8, pool, cursor, win);
        *z = bx5_dpbusd(bx5_dpbusd(*z0, u2, _mm512_loadu_si512((const void *)(q + 128))),
                        u3, _mm512_loadu_si512((const void *)(q + 192)));
    }
}

// Same from decoded codes u[0..3].
BX_ALWAYS_INLINE void bx5_block_dots_u(const __m512i u[4], int halves, const int8_t * q, __m512i * z0, __m512i * z) {
    *z0 = bx5_dpbusd(bx5_dpbusd(_mm512_setzero_si512(), u[0], _mm512_loadu_si512((const void *)q)),
                     u[1], _mm512_loadu_si512((const void *)(q + 64)));
    *z = halves == 2 ? bx5_dpbusd(bx5_dpbusd(*z0, u[2], _mm512_loadu_si512((const void *)(q + 128))),
                                  u[3], _mm512_loadu_si512((const void *)(q + 192)))
                     : *z0;
}

// [a_l + a_{l+8} for l < 8, b_l + b_{l+8} for l < 8]: the contract lanes of two accumulators side by side.
BX_ALWAYS_INLINE __m512i bx5_fold2(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x44), _mm512_shuffle_i64x2(a, b, 0xEE));
}

BX_ALWAYS_INLINE __m512 bx5_pair_f(float lo, float hi) {
    return _mm512_insertf32x8(_mm512_set1_ps(lo), _mm256_set1_ps(hi), 1);
}

// Float part of one block for a pair of accumulators (lanes 0-7: A, 8-15: B). qsum2 holds the 32-position
// sums of A's and B's columns, yd2 their y.d, dpt2 y.d * scale (PT); e0v / e1v the fp32 scales of the two
// halves for A's and B's rows (G128), split the lanes whose block has e0 != e1 (bitwise). Split lanes take
// two FMAs; lanes that do not split get (L0 + L1, 0) instead of (L0, L1), and FMA(0, D1, acc) = acc
// exactly (acc is never -0: it starts at +0 and a sum is -0 only when both operands are).
BX_ALWAYS_INLINE __m512 bx5_block_float(__m512i zA0, __m512i zA, __m512i zB0, __m512i zB, __m512i qsum2,
                                        __m512 yd2, __m512 dpt2, int g128, __m512 e0v, __m512 e1v,
                                        __mmask16 split, __m512 acc) {
    const __m512i lf = _mm512_sub_epi32(bx5_fold2(zA, zB), qsum2);
    if (!g128) {
        return bx5_fma16(_mm512_cvtepi32_ps(lf), dpt2, acc);
    }
    const __m512 d0 = _mm512_mul_ps(yd2, e0v);
    if (__builtin_expect(split == 0, 1)) {
        return bx5_fma16(_mm512_cvtepi32_ps(lf), d0, acc);
    }
    const __m512i l0 = _mm512_sub_epi32(bx5_fold2(zA0, zB0), _mm512_maskz_mov_epi32(0x0F0F, qsum2));
    const __m512i la = _mm512_mask_mov_epi32(lf, split, l0);
    const __m512i lb = _mm512_maskz_sub_epi32(split, lf, l0);
    const __m512  d1 = _mm512_mul_ps(yd2, e1v);
    acc = bx5_fma16(_mm512_cvtepi32_ps(la), d0, acc);
    return bx5_fma16(_mm512_cvtepi32_ps(lb), d1, acc);
}

// Staged column data in pair form: for GEMV (rows paired) both halves are the same column.
typedef struct {
    __m512i qsum2[BX_CHUNK_B];
    __m512  yd2[BX_CHUNK_B];
    __m512  dpt2[BX_CHUNK_B];
} bx5_pair_chunk;

BX_ALWAYS_INLINE void bx5_stage_pair(const bx_col_chunk * a, const bx_col_chunk * b, int nbk, bx5_pair_chunk * pc) {
    for (int j = 0; j < nbk; ++j) {
        pc->qsum2[j] = _mm512_inserti64x4(_mm512_castsi256_si512(a->qsum[j]), b->qsum[j], 1);
        pc->yd2[j]   = bx5_pair_f(a->yd[j], b->yd[j]);
        pc->dpt2[j]  = bx5_pair_f(a->dpt[j], b->dpt[j]);
    }
}

BX_ALWAYS_INLINE void bx5_store_pair(__m512 acc, float * da, float * db) {
    *da = bx_reduce8(_mm512_castps512_ps256(acc));
    if (db) *db = bx_reduce8(_mm512_extractf32x8_ps(acc, 1));
}

// fp32 scales of G128 block b for a pair of rows: e0v = [e0(A) x8, e0(B) x8], e1v likewise, and the lanes
// whose row has e0 != e1 (bitwise; fp16 -> fp32 is injective, so the fp32 bits compare the same).
BX_ALWAYS_INLINE __mmask16 bx5_pair_scales(const uint8_t * rowA, const uint8_t * rowB, int64_t b, int halves,
                                           __m512 * e0v, __m512 * e1v) {
    const size_t o0 = (size_t)(2*b) * BITCOS_BLOCK_BYTES_G128 + 16;
    const size_t o1 = halves == 2 ? o0 + BITCOS_BLOCK_BYTES_G128 : o0;
    // 32-bit loads ending at each scale (bitmap bytes 14-15, then d: never past the block) go straight to
    // vector registers: GPR -> vector transfers compete with the decode's mask writes
    const __m128i a0 = _mm_loadu_si32(rowA + o0 - 2), b0 = _mm_loadu_si32(rowB + o0 - 2);
    const __m128i a1 = _mm_loadu_si32(rowA + o1 - 2), b1 = _mm_loadu_si32(rowB + o1 - 2);
    const __m128i h  = _mm_unpacklo_epi64(_mm_unpacklo_epi32(a0, b0), _mm_unpacklo_epi32(a1, b1));
    const __m512  f  = _mm512_castps256_ps512(_mm256_cvtph_ps(h));     // odd lanes: e0(A), e0(B), e1(A), e1(B)
    *e0v = _mm512_permutexvar_ps(_mm512_setr_epi32(1,1,1,1,1,1,1,1, 3,3,3,3,3,3,3,3), f);
    *e1v = _mm512_permutexvar_ps(_mm512_setr_epi32(5,5,5,5,5,5,5,5, 7,7,7,7,7,7,7,7), f);
    return _mm512_cmpneq_epi32_mask(_mm512_castps_si512(*e0v), _mm512_castps_si512(*e1v));
}

// GEMV over one chunk for rows A and B (B may be A again, with its own cursor copy, for an odd last row).
BX_ALWAYS_INLINE __m512 bx5_gemv_pair(const bitcos_rows * w, const uint8_t * rowA, const uint8_t * rowB,
                                      uint64_t * curA, uint64_t * curB, int64_t b0, const int nbk, int64_t nb,
                                      const bx_col_chunk * cc, const bx5_pair_chunk * pc, const int g128,
                                      const int full2, const int win, __m512 acc) {
    const size_t bb = g128 ? BITCOS_BLOCK_BYTES_G128 : BITCOS_BLOCK_BYTES_PT;
    const uint8_t * pool = w->pool;
    uint64_t ca = *curA, cb = *curB;      // locals: the pointers may alias as far as the compiler knows
    for (int j = 0; j < nbk; ++j) {
        const int64_t b = b0 + j;
        const int halves = full2 || 2*b + 1 < nb ? 2 : 1;
        __m512i zA0, zA, zB0, zB;
#if BX_PF_BITS
        _mm_prefetch((const char *)(rowA + (size_t)(2*b) * bb + BX_PF_BITS), _MM_HINT_T0);
        _mm_prefetch((const char *)(rowB + (size_t)(2*b) * bb + BX_PF_BITS), _MM_HINT_T0);
#endif
        bx5_block_dots(rowA + (size_t)(2*b) * bb, bb, halves, pool, &ca, cc->qs[j], win, &zA0, &zA);
        bx5_block_dots(rowB + (size_t)(2*b) * bb, bb, halves, pool, &cb, cc->qs[j], win, &zB0, &zB);
        __m512 e0v = _mm512_setzero_ps(), e1v = _mm512_setzero_ps();
        __mmask16 split = 0;
        if (g128) split = bx5_pair_scales(rowA, rowB, b, halves, &e0v, &e1v);
        acc = bx5_block_float(zA0, zA, zB0, zB, pc->qsum2[j], pc->yd2[j], pc->dpt2[j], g128, e0v, e1v, split, acc);
    }
    *curA = ca;
    *curB = cb;
    return acc;
}

// 1 when no 64-weight word of the PT chunk of nbk Q8_K blocks starting at block b0 of the row holds more than 57
// present weights, so the chunk can take the unchecked byte window: one vector popcount per 8 words (the chunk's
// 32 * nbk bitmap bytes are contiguous in a PT row) instead of a compare and branch per word (1.81 -> 1.745
// ticks per 32 weights, 256 x 2048 at z = 0.4; KERNELS.md §3). Without VPOPCNTDQ: 0 (the checked window).
BX_ALWAYS_INLINE int bx5_pt_chunk_sparse(const uint8_t * row, int64_t b0, const int nbk) {
#if defined(__AVX512VPOPCNTDQ__)
    const uint8_t * p = row + (size_t)(2*b0) * BITCOS_BLOCK_BYTES_PT;
    const int bytes = nbk * 2 * BITCOS_BLOCK_BYTES_PT;                 // 32 per Q8_K block
    __m512i m = _mm512_setzero_si512();
    int i = 0;
    for (; i + 64 <= bytes; i += 64) {
        m = _mm512_max_epu64(m, _mm512_popcnt_epi64(_mm512_loadu_si512((const void *)(p + i))));
    }
    if (i < bytes) {                                                    // an odd block count: its last 32 bytes
        m = _mm512_max_epu64(m, _mm512_popcnt_epi64(_mm512_maskz_loadu_epi64(0x0F, (const void *)(p + i))));
    }
    return _mm512_cmpgt_epu64_mask(m, _mm512_set1_epi64(57)) == 0;
#else
    (void)row; (void)b0; (void)nbk;
    return 0;
#endif
}

void bitcos_mm_avx512(const bitcos_rows * w, int64_t nr,
                      const bitcos_q8_K * const * y, int64_t nc, float * const * dst) {
    const int64_t nb   = w->k / BITCOS_QK;
    const int64_t nby  = (nb + 1) / 2;
    const int     g128 = w->variant == BITCOS_VARIANT_G128;
    const size_t  bb   = g128 ? BITCOS_BLOCK_BYTES_G128 : BITCOS_BLOCK_BYTES_PT;
    _Alignas(64) bx_col_chunk   cc[BX_CT];
    _Alignas(64) bx5_pair_chunk pc[BX_CT];
    _Alignas(64) __m512         acc[BX_RT][BX_CT / 2];   // GEMV: acc[r][0] holds rows r, r + nrh
    uint64_t cursor[BX_RT + 1];
    for (int64_t r0 = 0; r0 < nr; r0 += BX_RT) {
        const int nrt = (int)(nr - r0 < BX_RT ? nr - r0 : BX_RT);
        for (int64_t c0 = 0; c0 < nc; c0 += BX_CT) {
            const int nct = (int)(nc - c0 < BX_CT ? nc - c0 : BX_CT);
            const int ncp = (nct + 1) / 2;                  // column pairs (an odd last column pairs with itself)
            for (int r = 0; r < nrt; ++r) {
                cursor[r] = w->sign_pos[r0 + r];
                for (int p = 0; p < BX_CT / 2; ++p) acc[r][p] = _mm512_setzero_ps();
            }
            // GEMV row pairs (KERNELS.md §5, memory): long rows pair r with r + nrh, so the bitmap and the pool
            // are read as four long sequential streams through the tile; short rows (at most BX_ADJ_ROW_BYTES
            // bytes of blocks) pair 2p with 2p + 1, which are adjacent in both the bitmap and
            // the pool: two streams that run through the whole matrix instead of two that restart per tile.
            const int nrh = (nrt + 1) / 2;                  // pairs; an odd tile's last row pairs with a copy
            const int adj = w->row_bytes <= BX_ADJ_ROW_BYTES;
#define BX_PAIR_A(p) (adj ? 2*(p) : (p))
#define BX_PAIR_B(p) (adj ? 2*(p) + 1 : (p) + nrh)
            cursor[nrt] = cursor[BX_PAIR_A(nrh - 1)];       // the copy the odd last row pairs with
            if (nct == 1) {
                // The byte-granular sign window (bx_negatives_fast) pays off unless many 64-weight words have
                // more than 57 present weights; the tile's mean density, from its rows' sign counts, decides
                // (more than 85 % of the weights present: the two-qword window, KERNELS.md §3; a one-row tile:
                // too, as its count is unknown).
                const int fastwin = nrt > 1 &&
                    20 * (w->sign_pos[r0 + nrt - 1] - w->sign_pos[r0]) <= 17 * (uint64_t)(nrt - 1) * (uint64_t)w->k;
                // GEMV: two rows per pass, their decode chains interleave; one zmm holds both accumulators.
                // The pair (BX_PAIR_A/B above) walks a whole span (up to BX_GEMV_SPAN chunks, staged in
                // cc/pc[0 ..]) before the next pair: the bitmap and the pool are then read as a few
                // sequential streams (with k <= 16384 one span is the whole row, and row r ends where row
                // r + 1 starts, in both), which the hardware prefetchers follow;
                // the previous chunk-outer order, with 32 rows' streams
                // interleaved, ran DRAM-resident weights at 4.7 instead of 2.0-2.2 ticks (KERNELS.md §5).
                for (int64_t s0 = 0; s0 < nby; s0 += BX_GEMV_SPAN * BX_CHUNK_B) {
                    int nch = 0;
                    for (int64_t b0 = s0; b0 < nby && nch < BX_GEMV_SPAN; b0 += BX_CHUNK_B, ++nch) {
                        const int nbk = (int)(nby - b0 < BX_CHUNK_B ? nby - b0 : BX_CHUNK_B);
                        bx_stage_column(y[c0], b0, nbk, nb, w->scale, &cc[nch]);
                        bx5_stage_pair(&cc[nch], &cc[nch], nbk, &pc[nch]);
                    }
                    for (int r = 0; r < nrh; ++r) {
                        const int ra = BX_PAIR_A(r), rb = BX_PAIR_B(r) < nrt ? BX_PAIR_B(r) : ra;
                        const uint8_t * rowA = w->blocks + (size_t)(r0 + ra) * w->row_bytes;
                        const uint8_t * rowB = w->blocks + (size_t)(r0 + rb) * w->row_bytes;
                        uint64_t * curA = &cursor[ra];
                        uint64_t * curB = BX_PAIR_B(r) < nrt ? &cursor[rb] : &cursor[nrt];
                        __m512 a = acc[r][0];
                        for (int q = 0; q < nch; ++q) {
                            // full chunks and G128/PT get their own instantiations (constant trip count, variant)
                            const int64_t b0 = s0 + (int64_t)q * BX_CHUNK_B;
                            const int nbk = (int)(nby - b0 < BX_CHUNK_B ? nby - b0 : BX_CHUNK_B);
                            if (nbk == BX_CHUNK_B && 2*(b0 + BX_CHUNK_B) <= nb) {   // every block has two halves
                                if (!g128 && bx5_pt_chunk_sparse(rowA, b0, BX_CHUNK_B) && bx5_pt_chunk_sparse(rowB, b0, BX_CHUNK_B)) {
                                    // no word of this PT chunk has more than 57 present weights: no per-word test
                                    a = bx5_gemv_pair(w, rowA, rowB, curA, curB, b0, BX_CHUNK_B, nb, &cc[q], &pc[q], 0, 1, BX_WIN_BYTE_UNCHECKED, a);
                                } else if (!g128 && fastwin) {
                                    a = bx5_gemv_pair(w, rowA, rowB, curA, curB, b0, BX_CHUNK_B, nb, &cc[q], &pc[q], 0, 1, BX_WIN_BYTE, a);
                                } else if (!g128) {
                                    a = bx5_gemv_pair(w, rowA, rowB, curA, curB, b0, BX_CHUNK_B, nb, &cc[q], &pc[q], 0, 1, BX_WIN_QWORDS, a);
                                } else if (fastwin) {
                                    a = bx5_gemv_pair(w, rowA, rowB, curA, curB, b0, BX_CHUNK_B, nb, &cc[q], &pc[q], 1, 1, BX_WIN_BYTE, a);
                                } else {
                                    a = bx5_gemv_pair(w, rowA, rowB, curA, curB, b0, BX_CHUNK_B, nb, &cc[q], &pc[q], 1, 1, BX_WIN_QWORDS, a);
                                }
                            } else if (!g128 && 2*(b0 + nbk) <= nb &&
                                       bx5_pt_chunk_sparse(rowA, b0, nbk) && bx5_pt_chunk_sparse(rowB, b0, nbk)) {
                                // the shorter last chunk of a row whose length is a multiple of 256 (k = 2560: a
                                // fifth of every row): the same test and window
                                a = bx5_gemv_pair(w, rowA, rowB, curA, curB, b0, nbk, nb, &cc[q], &pc[q], 0, 1, BX_WIN_BYTE_UNCHECKED, a);
                            } else if (fastwin) {
                                if (g128) a = bx5_gemv_pair(w, rowA, rowB, curA, curB, b0, nbk, nb, &cc[q], &pc[q], 1, 0, BX_WIN_BYTE, a);
                                else      a = bx5_gemv_pair(w, rowA, rowB, curA, curB, b0, nbk, nb, &cc[q], &pc[q], 0, 0, BX_WIN_BYTE, a);
                            } else {
                                if (g128) a = bx5_gemv_pair(w, rowA, rowB, curA, curB, b0, nbk, nb, &cc[q], &pc[q], 1, 0, BX_WIN_QWORDS, a);
                                else      a = bx5_gemv_pair(w, rowA, rowB, curA, curB, b0, nbk, nb, &cc[q], &pc[q], 0, 0, BX_WIN_QWORDS, a);
                            }
                        }
                        acc[r][0] = a;
                    }
                }
            }
            for (int64_t b0 = 0; nct > 1 && b0 < nby; b0 += BX_CHUNK_B) {   // several columns
                const int nbk = (int)(nby - b0 < BX_CHUNK_B ? nby - b0 : BX_CHUNK_B);
                for (int c = 0; c < nct; ++c) bx_stage_column(y[c0 + c], b0, nbk, nb, w->scale, &cc[c]);
                for (int p = 0; p < ncp; ++p) {
                    const int cb = 2*p + 1 < nct ? 2*p + 1 : 2*p;
                    bx5_stage_pair(&cc[2*p], &cc[cb], nbk, &pc[p]);
                }
                for (int r = 0; r < nrt; ++r) {
                    // each block of the row is decoded once, then serves every column pair of the tile
                    const uint8_t * row = w->blocks + (size_t)(r0 + r) * w->row_bytes;
                    for (int j = 0; j < nbk; ++j) {
                        const int64_t b = b0 + j;
                        const int halves = 2*b + 1 < nb ? 2 : 1;
                        const uint8_t * blk = row + (size_t)(2*b) * bb;
                        __m512i u[4];
                        u[0] = bx5_codes64(blk,     w->pool, &cursor[r]);
                        u[1] = bx5_codes64(blk + 8, w->pool, &cursor[r]);
                        u[2] = u[3] = _mm512_setzero_si512();
                        if (halves == 2) {
                            u[2] = bx5_codes64(blk + bb,     w->pool, &cursor[r]);
                            u[3] = bx5_codes64(blk + bb + 8, w->pool, &cursor[r]);
                        }
                        __m512 e0v = _mm512_setzero_ps(), e1v = _mm512_setzero_ps();
                        __mmask16 split = 0;
                        if (g128) split = bx5_pair_scales(row, row, b, halves, &e0v, &e1v);
                        for (int p = 0; p < ncp; ++p) {
                            const int cb = 2*p + 1 < nct ? 2*p + 1 : 2*p;
                            __m512i zA0, zA, zB0, zB;
                            bx5_block_dots_u(u, halves, cc[2*p].qs[j], &zA0, &zA);
                            bx5_block_dots_u(u, halves, cc[cb].qs[j], &zB0, &zB);
                            acc[r][p] = bx5_block_float(zA0, zA, zB0, zB, pc[p].qsum2[j], pc[p].yd2[j], pc[p].dpt2[j],
                                                        g128, e0v, e1v, split, acc[r][p]);
                        }
                    }
                }
            }
            if (nct == 1) {
                for (int r = 0; r < nrh; ++r) {
                    bx5_store_pair(acc[r][0], &dst[c0][r0 + BX_PAIR_A(r)],
                                   BX_PAIR_B(r) < nrt ? &dst[c0][r0 + BX_PAIR_B(r)] : NULL);
                }
            } else {
                for (int r = 0; r < nrt; ++r) {
                    for (int p = 0; p < ncp; ++p) {
                        bx5_store_pair(acc[r][p], &dst[c0 + 2*p][r0 + r], 2*p + 1 < nct ? &dst[c0 + 2*p + 1][r0 + r] : NULL);
                    }
                }
            }
        }
    }
}

#undef BX_PAIR_A
#undef BX_PAIR_B

#endif // AVX-512
#endif // x86-64 && AVX2
