// aarch64 NEON BITCOS kernels: bitcos_mm_neon (Armv8.0 Advanced SIMD) and bitcos_mm_neon_dotprod (+ sdot), two
// entries of the kernel table from this one file. Whichever the target flags allow is built: the ggml-cpu build
// compiles the file once with the CPU variant's flags (one of the two), the harness and the fuzzer compile it
// twice, with -march=armv8-a and with -march=armv8.2-a+dotprod (docs/KERNELS.md §2c).
//
// Contract: bitcos-kernels.h (results bit-identical to bitcos_mm_generic) for every descriptor, so the table's
// `covers` is NULL. Design and static cycle counts: docs/KERNELS.md.
//
// Sign placement without pdep (per 64-weight presence word P, its 64 signs W from the row's cursor):
//   * the signs become a 64-byte table C of codes u = t + 1 (2 for +1, 0 for -1): broadcast, cmtst, bic;
//   * each weight's index into C is its rank among the present weights of P: per presence byte, a 256-entry
//     table gives the 8 ranks within the byte (0x80 for an absent weight), and adding the byte's prefix count
//     (cnt, then one multiply by 0x0101..00) in a general register makes them ranks within P;
//   * one tbx over the 4 registers of C gives 16 codes: an absent weight's index is >= 64, so it keeps the
//     default 1 (t = 0).
// Dot products: u . q in the contract's lanes. A 16-byte chunk at position 32g + 16s of a Q8_K block holds
// lanes 4s .. 4s+3 in its four 4-byte groups, so sdot (or smull + pairwise adds) into two int32x4 accumulators
// (s = 0, 1) gives the lanes directly; subtracting the 32-weight group sums (from the Q8_K bsums) gives the
// contract's L. A block's 256 codes are decoded once per row and serve every column of the call.
// Compile with -ffp-contract=off like every kernel file: the only fused operation is the contract's FMA.
#include "bitcos-kernels.h"

#if defined(BITCOS_BUILD_NEON) || defined(BITCOS_BUILD_NEON_DOTPROD)

#    include <arm_neon.h>

#    if defined(BITCOS_BUILD_NEON_DOTPROD)
#        define NEON_KERNEL(name) name##_neon_dotprod
// The contract's lanes of u . q over a 16-byte chunk: lane i += sum of bytes 4i .. 4i+3.
static inline int32x4_t neon_dot16(int32x4_t acc, uint8x16_t u, int8x16_t q) {
    return vdotq_s32(acc, vreinterpretq_s8_u8(u), q);
}
#    else
#        define NEON_KERNEL(name) name##_neon
static inline int32x4_t neon_dot16(int32x4_t acc, uint8x16_t u, int8x16_t q) {
    // |u q| <= 256, so a pair of products fits int16; exact like sdot
    const int16x8_t lo = vmull_s8(vreinterpret_s8_u8(vget_low_u8(u)), vget_low_s8(q));
    const int16x8_t hi = vmull_high_s8(vreinterpretq_s8_u8(u), q);
    return vpadalq_s16(acc, vpaddq_s16(lo, hi));
}
#    endif

// Columns per pass over a row's decoded block (two fp32x4 accumulators each).
#    define NEON_COLS 8

// neon_rank[v], byte i: the number of set bits of v below bit i when bit i is set, else 0x80 (an index past the
// 64-byte code table, whatever prefix count is added).
#    define NEON_POP3(v)    (((v) & 1) + (((v) >> 1) & 1) + (((v) >> 2) & 1))
#    define NEON_POP7(v)    (NEON_POP3(v) + NEON_POP3((v) >> 3) + (((v) >> 6) & 1))
#    define NEON_LOW(v, i)  ((v) & ((1u << (i)) - 1u))
#    define NEON_RANK(v, i) ((uint64_t) ((((v) >> (i)) & 1) ? NEON_POP7(NEON_LOW(v, i)) : 0x80) << (8 * (i)))
#    define NEON_RANKS(v)                                                                                            \
        (NEON_RANK(v, 0) | NEON_RANK(v, 1) | NEON_RANK(v, 2) | NEON_RANK(v, 3) | NEON_RANK(v, 4) | NEON_RANK(v, 5) | \
         NEON_RANK(v, 6) | NEON_RANK(v, 7))
#    define NEON_RANKS4(b)  NEON_RANKS((b) + 0u), NEON_RANKS((b) + 1u), NEON_RANKS((b) + 2u), NEON_RANKS((b) + 3u)
#    define NEON_RANKS16(b) NEON_RANKS4(b), NEON_RANKS4((b) + 4u), NEON_RANKS4((b) + 8u), NEON_RANKS4((b) + 12u)
#    define NEON_RANKS64(b) NEON_RANKS16(b), NEON_RANKS16((b) + 16u), NEON_RANKS16((b) + 32u), NEON_RANKS16((b) + 48u)

static const uint64_t neon_rank[256] = { NEON_RANKS64(0u), NEON_RANKS64(64u), NEON_RANKS64(128u), NEON_RANKS64(192u) };

static inline uint64_t neon_load_u64(const uint8_t * p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

// The 64 sign bits from pool bit pos, branch-free (bitcos_sign_window's bits: the 9-byte window of the format).
static inline uint64_t neon_signs(const uint8_t * pool, uint64_t pos) {
    const uint64_t lo = neon_load_u64(pool + (pos >> 3));
    const uint64_t hi = pool[(pos >> 3) + 8];
    const unsigned sh = (unsigned) (pos & 7);
    return (lo >> sh) | ((hi << 1) << (63 - sh));
}

// Codes u = t + 1 of the 64 weights of presence word p into u[0..3] (16 each, in weight order); advances cursor.
static inline void neon_decode64(uint64_t p, const uint8_t * pool, uint64_t * cursor, uint8x16_t * u) {
    static const uint8_t bcast[4][16] = {
        { 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1 },
        { 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3 },
        { 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5 },
        { 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7 },
    };
    const uint8x16_t bitsel = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ULL));
    const uint8x16_t two    = vdupq_n_u8(2);
    const uint8x16_t one    = vdupq_n_u8(1);
    // C[k] = 0 when sign k is set (t = -1), else 2 (t = +1)
    const uint8x16_t w      = vreinterpretq_u8_u64(vdupq_n_u64(neon_signs(pool, *cursor)));
    uint8x16x4_t     c;
    c.val[0]            = vbicq_u8(two, vtstq_u8(vqtbl1q_u8(w, vld1q_u8(bcast[0])), bitsel));
    c.val[1]            = vbicq_u8(two, vtstq_u8(vqtbl1q_u8(w, vld1q_u8(bcast[1])), bitsel));
    c.val[2]            = vbicq_u8(two, vtstq_u8(vqtbl1q_u8(w, vld1q_u8(bcast[2])), bitsel));
    c.val[3]            = vbicq_u8(two, vtstq_u8(vqtbl1q_u8(w, vld1q_u8(bcast[3])), bitsel));
    // inclusive prefix counts of p's bytes: byte 7 is popcount(p); shifted up one byte, the exclusive ones
    const uint64_t incl = vget_lane_u64(vreinterpret_u64_u8(vcnt_u8(vcreate_u8(p))), 0) * 0x0101010101010101ULL;
    const uint64_t excl = incl << 8;
    *cursor += incl >> 56;
    for (int b = 0; b < 8; b += 2) {
        const uint64_t i0 = neon_rank[(p >> (8 * b)) & 0xff] + ((excl >> (8 * b)) & 0xff) * 0x0101010101010101ULL;
        const uint64_t i1 =
            neon_rank[(p >> (8 * b + 8)) & 0xff] + ((excl >> (8 * b + 8)) & 0xff) * 0x0101010101010101ULL;
        u[b / 2] = vqtbx4q_u8(one, c, vcombine_u8(vcreate_u8(i0), vcreate_u8(i1)));
    }
}

// One row's decoded Q8_K block: codes, how many 128-weight halves it has, its unit scales (fp16 bits).
typedef struct {
    uint8x16_t u[16];
    int        halves;
    uint16_t   e[2];
} neon_block;

// Decodes block b of row i (its bitmap at row; cursor: the row's sign cursor).
static inline void neon_decode_block(const bitcos_rows * w, int64_t i, const uint8_t * row, int64_t b, int64_t nu,
                                     size_t tail, uint64_t * cursor, neon_block * blk) {
    blk->halves = (2 * b + 1 < nu) ? 2 : 1;
    blk->e[0] = blk->e[1] = 0;
    for (int h = 0; h < blk->halves; ++h) {
        const int64_t   u    = 2 * b + h;
        const uint8_t * bits = row + (size_t) u * w->unit_bytes;
        uint64_t        p0, p1;
        if (tail && u == nu - 1) {
            // a partial last unit: only its first `tail` bytes belong to the row; the rest are absent weights
            uint8_t partial[BITCOS_BITMAP_BYTES] = { 0 };
            memcpy(partial, bits, tail);
            p0 = neon_load_u64(partial);
            p1 = neon_load_u64(partial + 8);
        } else {
            p0 = neon_load_u64(bits);
            p1 = neon_load_u64(bits + 8);
        }
        neon_decode64(p0, w->pool, cursor, blk->u + 8 * h);
        neon_decode64(p1, w->pool, cursor, blk->u + 8 * h + 4);
        if (w->row_scale == NULL) {
            memcpy(&blk->e[h],
                   w->block_scale + (size_t) i * w->scale_row_bytes +
                       (size_t) (u >> w->block_scale_shift) * w->scale_stride,
                   sizeof blk->e[h]);
        }
    }
    if (blk->halves == 1) {
        blk->e[1] = blk->e[0];
    }
}

// The contract's FMA(x, D, acc), 4 lanes.
static inline float32x4_t neon_fma(float32x4_t x, float d, float32x4_t acc) {
#    if BITCOS_FMA
    return vfmaq_n_f32(acc, x, d);
#    else
    return vaddq_f32(vmulq_n_f32(x, d), acc);
#    endif
}

// Half h's lanes of u . q: lo gets lanes 0..3 (chunks 32g .. 32g+15), hi lanes 4..7 (chunks 32g+16 .. 32g+31).
static inline void neon_dot_half(const uint8x16_t * u, const int8_t * q, int32x4_t * lo, int32x4_t * hi) {
    int32x4_t a = vdupq_n_s32(0), c = vdupq_n_s32(0);
    for (int g = 0; g < 4; ++g) {
        a = neon_dot16(a, u[2 * g], vld1q_s8(q + 32 * g));
        c = neon_dot16(c, u[2 * g + 1], vld1q_s8(q + 32 * g + 16));
    }
    *lo = a;
    *hi = c;
}

// One decoded block of row i against column block yb: the contract's float step into acc[0] (lanes 0..3) and
// acc[1] (lanes 4..7).
static inline void neon_block_column(const bitcos_rows * w, int64_t i, const neon_block * blk, const bitcos_q8_K * yb,
                                     float32x4_t * acc) {
    // the 32-weight group sums: groups 0..3 (half 0) subtract from lanes 0..3, groups 4..7 from lanes 4..7
    const int32x4_t g0 = vpaddlq_s16(vld1q_s16(yb->bsums));
    int32x4_t       a0, b0, a1 = vdupq_n_s32(0), b1 = vdupq_n_s32(0), g1 = vdupq_n_s32(0);
    neon_dot_half(blk->u, yb->qs, &a0, &b0);
    if (blk->halves == 2) {
        neon_dot_half(blk->u + 8, yb->qs + QK_BITCOS, &a1, &b1);
        g1 = vpaddlq_s16(vld1q_s16(yb->bsums + 8));
    }
    if (w->row_scale != NULL || blk->e[0] == blk->e[1]) {
        const float d = yb->d * (w->row_scale != NULL ? w->row_scale[i] : bitcos_fp16_to_fp32(blk->e[0]));
        acc[0]        = neon_fma(vcvtq_f32_s32(vsubq_s32(vaddq_s32(a0, a1), g0)), d, acc[0]);
        acc[1]        = neon_fma(vcvtq_f32_s32(vsubq_s32(vaddq_s32(b0, b1), g1)), d, acc[1]);
    } else {
        const float d0 = yb->d * bitcos_fp16_to_fp32(blk->e[0]);
        const float d1 = yb->d * bitcos_fp16_to_fp32(blk->e[1]);
        acc[0]         = neon_fma(vcvtq_f32_s32(vsubq_s32(a0, g0)), d0, acc[0]);
        acc[1]         = neon_fma(vcvtq_f32_s32(b0), d0, acc[1]);
        acc[0]         = neon_fma(vcvtq_f32_s32(a1), d1, acc[0]);
        acc[1]         = neon_fma(vcvtq_f32_s32(vsubq_s32(b1, g1)), d1, acc[1]);
    }
}

// The contract's final reduction: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
static inline float neon_reduce(const float32x4_t * acc) {
    const float32x4_t s = vaddq_f32(acc[0], acc[1]);
    return (vgetq_lane_f32(s, 0) + vgetq_lane_f32(s, 2)) + (vgetq_lane_f32(s, 1) + vgetq_lane_f32(s, 3));
}

void NEON_KERNEL(bitcos_mm)(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                            float * const * dst) {
    const int64_t nu   = (w->k + QK_BITCOS - 1) / QK_BITCOS; // 128-weight units, the last maybe partial
    const int64_t nby  = (nu + 1) / 2;                       // Q8_K blocks
    const size_t  tail = (size_t) (w->k % QK_BITCOS) / 8;    // bitmap bytes of a partial last unit (0: none)
    for (int64_t c0 = 0; c0 < nc; c0 += NEON_COLS) {
        const int ncc = (int) (nc - c0 < NEON_COLS ? nc - c0 : NEON_COLS);
        for (int64_t i = 0; i < nr; ++i) {
            const uint8_t * row    = w->bits + (size_t) i * w->row_bytes;
            uint64_t        cursor = w->sign_pos[i];
            float32x4_t     acc[NEON_COLS][2];
            for (int c = 0; c < ncc; ++c) {
                acc[c][0] = acc[c][1] = vdupq_n_f32(0.0f);
            }
            for (int64_t b = 0; b < nby; ++b) {
                neon_block blk;
                neon_decode_block(w, i, row, b, nu, tail, &cursor, &blk);
                for (int c = 0; c < ncc; ++c) {
                    neon_block_column(w, i, &blk, &y[c0 + c][b], acc[c]);
                }
            }
            for (int c = 0; c < ncc; ++c) {
                dst[c0 + c][i] = neon_reduce(acc[c]);
            }
        }
    }
}

#else
typedef int bitcos_no_neon_kernel; // ISO C wants a declaration in every translation unit
#endif // BITCOS_BUILD_NEON || BITCOS_BUILD_NEON_DOTPROD
