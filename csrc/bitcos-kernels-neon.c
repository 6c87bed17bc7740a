// aarch64 NEON BITCOS kernels: bitcos_mm_neon (Armv8.0 Advanced SIMD) and bitcos_mm_neon_dotprod (+ sdot), two
// entries of the kernel table from this one file. Whichever the target flags allow is built: the ggml-cpu build
// compiles the file once with the CPU variant's flags (one of the two), the harness and the fuzzer compile it
// twice, with -march=armv8-a and with -march=armv8.2-a+dotprod (docs/KERNELS.md §2d).
//
// Contract: bitcos-kernels.h (results bit-identical to bitcos_mm_generic) for every descriptor, so the table's
// `covers` is NULL. Design and static cycle counts: docs/KERNELS.md.
//
// Sign placement without pdep (per 64-weight presence word P, its 64 signs W from the row's cursor):
//   * the signs become a 64-byte table C of codes u = t + 1 (2 for +1, 0 for -1): broadcast, ushl, and;
//   * each weight's index into C is its rank among the present weights of P: per presence byte, a 256-entry
//     table gives the 8 ranks within the byte (0x80 for an absent weight), and adding the byte's prefix count
//     (cnt, one multiply by 0x0101..00 in a general register, a tbl broadcast) makes them ranks within P;
//   * one tbx over the 4 registers of C gives 16 codes: an absent weight's index is >= 64, so it keeps the
//     default 1 (t = 0).
// Dot products: u . q in the contract's lanes. A 16-byte chunk at position 32g + 16s of a Q8_K block holds
// lanes 4s .. 4s+3 in its four 4-byte groups, so sdot (or smull + pairwise adds) into two int32x4 accumulators
// (s = 0, 1) gives the lanes directly; subtracting the 32-weight group sums (from the Q8_K bsums) gives the
// contract's L. GEMV: each unit is decoded straight into its dot products; GEMM: a block's 256 codes are
// decoded once per row and serve up to NEON_COLS columns.
// Compile with -ffp-contract=off like every kernel file: the only fused operation is the contract's FMA.
#include "bitcos-kernels.h"

#if defined(BITCOS_BUILD_NEON) || defined(BITCOS_BUILD_NEON_DOTPROD)

#    include <arm_neon.h>

// The helpers are inlined into the kernel's loops (a call per block and column would cost more than its body).
#    define NEON_INLINE static inline __attribute__((always_inline))

#    if defined(BITCOS_BUILD_NEON_DOTPROD)
#        define NEON_KERNEL(name) name##_neon_dotprod
// The contract's lanes of u . q over a 16-byte chunk: lane i += sum of bytes 4i .. 4i+3.
NEON_INLINE int32x4_t neon_dot16(int32x4_t acc, uint8x16_t u, int8x16_t q) {
    return vdotq_s32(acc, vreinterpretq_s8_u8(u), q);
}
#    else
#        define NEON_KERNEL(name) name##_neon
NEON_INLINE int32x4_t neon_dot16(int32x4_t acc, uint8x16_t u, int8x16_t q) {
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

NEON_INLINE uint64_t neon_load_u64(const uint8_t * p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

// The 64 sign bits from pool bit pos, branch-free (bitcos_sign_window's bits: the 9-byte window of the format).
NEON_INLINE uint64_t neon_signs(const uint8_t * pool, uint64_t pos) {
    const uint64_t lo = neon_load_u64(pool + (pos >> 3));
    const uint64_t hi = pool[(pos >> 3) + 8];
    const unsigned sh = (unsigned) (pos & 7);
    return (lo >> sh) | ((hi << 1) << (63 - sh));
}

// The decode's constant vectors, set up once per kernel call.
typedef struct {
    uint8x16_t bcast[4]; // bcast[r]: byte 2r to lanes 0..7, byte 2r+1 to lanes 8..15
    int8x16_t  bit_to_1; // 1, 0, -1, .. -6 in every 8 lanes: shifts bit i of lane i % 8 to bit 1
    uint8x16_t two, one;
} neon_consts;

NEON_INLINE neon_consts neon_consts_init(void) {
    neon_consts k;
    for (int r = 0; r < 4; ++r) {
        k.bcast[r] = vcombine_u8(vdup_n_u8((uint8_t) (2 * r)), vdup_n_u8((uint8_t) (2 * r + 1)));
    }
    static const int8_t shifts[16] = { 1, 0, -1, -2, -3, -4, -5, -6, 1, 0, -1, -2, -3, -4, -5, -6 };
    k.bit_to_1                     = vld1q_s8(shifts);
    k.two                          = vdupq_n_u8(2);
    k.one                          = vdupq_n_u8(1);
    return k;
}

// Codes u = t + 1 of the 64 weights of presence word p into u[0..3] (16 each, in weight order); advances cursor.
NEON_INLINE void neon_decode64(const neon_consts * k, uint64_t p, const uint8_t * pool, uint64_t * cursor,
                               uint8x16_t * u) {
    // C[j] = 0 when the word's sign j is set (t = -1), else 2 (t = +1): lane j of the inverted sign byte shifted so
    // that its bit j % 8 lands on bit 1, and 2 (two operations; a test-and-select costs three as compilers emit it)
    const uint8x16_t w = vreinterpretq_u8_u64(vdupq_n_u64(~neon_signs(pool, *cursor)));
    uint8x16x4_t     c;
    for (int r = 0; r < 4; ++r) {
        c.val[r] = vandq_u8(vshlq_u8(vqtbl1q_u8(w, k->bcast[r]), k->bit_to_1), k->two);
    }
    // prefix counts of p's bytes (inclusive: byte 7 is popcount(p); one byte up: exclusive), broadcast per byte
    const uint64_t   incl = vget_lane_u64(vreinterpret_u64_u8(vcnt_u8(vcreate_u8(p))), 0) * 0x0101010101010101ULL;
    const uint8x16_t excl = vreinterpretq_u8_u64(vdupq_n_u64(incl << 8));
    *cursor += incl >> 56;
    for (int r = 0; r < 4; ++r) {
        const uint64x2_t ranks = vcombine_u64(vld1_u64(&neon_rank[(p >> (16 * r)) & 0xff]),
                                              vld1_u64(&neon_rank[(p >> (16 * r + 8)) & 0xff]));
        const uint8x16_t idx   = vaddq_u8(vreinterpretq_u8_u64(ranks), vqtbl1q_u8(excl, k->bcast[r]));
        u[r]                   = vqtbx4q_u8(k->one, c, idx);
    }
}

// The two presence words of unit u of a row (a partial last unit's missing bytes are absent weights).
NEON_INLINE void neon_unit_bits(const bitcos_rows * w, const uint8_t * row, int64_t u, int64_t nu, size_t tail,
                                uint64_t p[2]) {
    const uint8_t * bits = row + (size_t) u * w->unit_bytes;
    if (tail && u == nu - 1) {
        // only the unit's first `tail` bytes belong to the row (the next bytes may be past the tensor)
        uint8_t partial[BITCOS_BITMAP_BYTES] = { 0 };
        memcpy(partial, bits, tail);
        bits = partial;
        p[0] = neon_load_u64(bits);
        p[1] = neon_load_u64(bits + 8);
        return;
    }
    p[0] = neon_load_u64(bits);
    p[1] = neon_load_u64(bits + 8);
}

// The fp16 scale bits of unit u of row i (block scales only).
NEON_INLINE uint16_t neon_unit_scale(const bitcos_rows * w, int64_t i, int64_t u) {
    uint16_t e;
    memcpy(&e,
           w->block_scale + (size_t) i * w->scale_row_bytes + (size_t) (u >> w->block_scale_shift) * w->scale_stride,
           sizeof e);
    return e;
}

// Decodes the 128 codes of unit u of row i into u8[0..7]; its scale into *e (block scales).
NEON_INLINE void neon_decode_unit(const neon_consts * k, const bitcos_rows * w, int64_t i, const uint8_t * row,
                                  int64_t u, int64_t nu, size_t tail, uint64_t * cursor, uint8x16_t * u8,
                                  uint16_t * e) {
    uint64_t p[2];
    neon_unit_bits(w, row, u, nu, tail, p);
    neon_decode64(k, p[0], w->pool, cursor, u8);
    neon_decode64(k, p[1], w->pool, cursor, u8 + 4);
    *e = w->row_scale == NULL ? neon_unit_scale(w, i, u) : 0;
}

// The contract's FMA(x, D, acc), 4 lanes.
NEON_INLINE float32x4_t neon_fma(float32x4_t x, float d, float32x4_t acc) {
#    if BITCOS_FMA
    return vfmaq_n_f32(acc, x, d);
#    else
    return vaddq_f32(vmulq_n_f32(x, d), acc);
#    endif
}

// A half's lanes of u . q: lo gets lanes 0..3 (chunks 32g .. 32g+15), hi lanes 4..7 (chunks 32g+16 .. 32g+31).
NEON_INLINE void neon_dot_half(const uint8x16_t * u, const int8_t * q, int32x4_t * lo, int32x4_t * hi) {
    int32x4_t a = vdupq_n_s32(0), c = vdupq_n_s32(0);
    for (int g = 0; g < 4; ++g) {
        a = neon_dot16(a, u[2 * g], vld1q_s8(q + 32 * g));
        c = neon_dot16(c, u[2 * g + 1], vld1q_s8(q + 32 * g + 16));
    }
    *lo = a;
    *hi = c;
}

// The contract's float step of one Q8_K block of row i and column block yb into acc[0] (lanes 0..3) and acc[1]
// (lanes 4..7): lo[h] / hi[h] are half h's lanes of u . q, e[] the halves' fp16 scales (block scales).
NEON_INLINE void neon_block_float(const bitcos_rows * w, int64_t i, int halves, const uint16_t * e,
                                  const bitcos_q8_K * yb, const int32x4_t * lo, const int32x4_t * hi,
                                  float32x4_t * acc) {
    // the 32-weight group sums: groups 0..3 (half 0) subtract from lanes 0..3, groups 4..7 (half 1) from 4..7
    const int32x4_t g0 = vpaddlq_s16(vld1q_s16(yb->bsums));
    if (halves == 1) {
        const float d = yb->d * (w->row_scale != NULL ? w->row_scale[i] : bitcos_fp16_to_fp32(e[0]));
        acc[0]        = neon_fma(vcvtq_f32_s32(vsubq_s32(lo[0], g0)), d, acc[0]);
        acc[1]        = neon_fma(vcvtq_f32_s32(hi[0]), d, acc[1]);
        return;
    }
    const int32x4_t g1 = vpaddlq_s16(vld1q_s16(yb->bsums + 8));
    if (w->row_scale != NULL || e[0] == e[1]) {
        const float d = yb->d * (w->row_scale != NULL ? w->row_scale[i] : bitcos_fp16_to_fp32(e[0]));
        acc[0]        = neon_fma(vcvtq_f32_s32(vsubq_s32(vaddq_s32(lo[0], lo[1]), g0)), d, acc[0]);
        acc[1]        = neon_fma(vcvtq_f32_s32(vsubq_s32(vaddq_s32(hi[0], hi[1]), g1)), d, acc[1]);
    } else {
        const float d0 = yb->d * bitcos_fp16_to_fp32(e[0]);
        const float d1 = yb->d * bitcos_fp16_to_fp32(e[1]);
        acc[0]         = neon_fma(vcvtq_f32_s32(vsubq_s32(lo[0], g0)), d0, acc[0]);
        acc[1]         = neon_fma(vcvtq_f32_s32(hi[0]), d0, acc[1]);
        acc[0]         = neon_fma(vcvtq_f32_s32(lo[1]), d1, acc[0]);
        acc[1]         = neon_fma(vcvtq_f32_s32(vsubq_s32(hi[1], g1)), d1, acc[1]);
    }
}

// The contract's final reduction: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
NEON_INLINE float neon_reduce(const float32x4_t * acc) {
    const float32x4_t s = vaddq_f32(acc[0], acc[1]);
    return (vgetq_lane_f32(s, 0) + vgetq_lane_f32(s, 2)) + (vgetq_lane_f32(s, 1) + vgetq_lane_f32(s, 3));
}

// The row's geometry: units, Q8_K blocks, bitmap bytes of a partial last unit (0: none).
typedef struct {
    int64_t nu, nby;
    size_t  tail;
} neon_shape;

// GEMV of row i against one column y: each unit is decoded straight into its dot products (no code buffer).
NEON_INLINE float neon_gemv_row(const neon_consts * k, const bitcos_rows * w, neon_shape sh, int64_t i,
                                const bitcos_q8_K * y) {
    const uint8_t * row    = w->bits + (size_t) i * w->row_bytes;
    uint64_t        cursor = w->sign_pos[i];
    float32x4_t     acc[2] = { vdupq_n_f32(0.0f), vdupq_n_f32(0.0f) };
    for (int64_t b = 0; b < sh.nby; ++b) {
        const int  halves = (2 * b + 1 < sh.nu) ? 2 : 1;
        int32x4_t  lo[2], hi[2];
        uint16_t   e[2];
        uint8x16_t u8[8];
        for (int h = 0; h < halves; ++h) {
            neon_decode_unit(k, w, i, row, 2 * b + h, sh.nu, sh.tail, &cursor, u8, &e[h]);
            neon_dot_half(u8, y[b].qs + QK_BITCOS * h, &lo[h], &hi[h]);
        }
        neon_block_float(w, i, halves, e, &y[b], lo, hi, acc);
    }
    return neon_reduce(acc);
}

// Row i against the ncc (<= NEON_COLS) columns y[0 ..]: each block is decoded once into a code buffer, then
// serves every column.
NEON_INLINE void neon_gemm_row(const neon_consts * k, const bitcos_rows * w, neon_shape sh, int64_t i,
                               const bitcos_q8_K * const * y, int ncc, float * const * dst) {
    const uint8_t * row    = w->bits + (size_t) i * w->row_bytes;
    uint64_t        cursor = w->sign_pos[i];
    float32x4_t     acc[NEON_COLS][2];
    for (int c = 0; c < ncc; ++c) {
        acc[c][0] = acc[c][1] = vdupq_n_f32(0.0f);
    }
    for (int64_t b = 0; b < sh.nby; ++b) {
        const int  halves = (2 * b + 1 < sh.nu) ? 2 : 1;
        uint16_t   e[2];
        uint8x16_t u8[16];
        for (int h = 0; h < halves; ++h) {
            neon_decode_unit(k, w, i, row, 2 * b + h, sh.nu, sh.tail, &cursor, u8 + 8 * h, &e[h]);
        }
        for (int c = 0; c < ncc; ++c) {
            int32x4_t lo[2], hi[2];
            for (int h = 0; h < halves; ++h) {
                neon_dot_half(u8 + 8 * h, y[c][b].qs + QK_BITCOS * h, &lo[h], &hi[h]);
            }
            neon_block_float(w, i, halves, e, &y[c][b], lo, hi, acc[c]);
        }
    }
    for (int c = 0; c < ncc; ++c) {
        dst[c][i] = neon_reduce(acc[c]);
    }
}

void NEON_KERNEL(bitcos_mm)(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                            float * const * dst) {
    const neon_consts k = neon_consts_init();
    neon_shape        sh;
    sh.nu   = (w->k + QK_BITCOS - 1) / QK_BITCOS; // 128-weight units, the last maybe partial
    sh.nby  = (sh.nu + 1) / 2;                    // Q8_K blocks
    sh.tail = (size_t) (w->k % QK_BITCOS) / 8;
    if (nc == 1) {
        for (int64_t i = 0; i < nr; ++i) {
            dst[0][i] = neon_gemv_row(&k, w, sh, i, y[0]);
        }
        return;
    }
    for (int64_t c0 = 0; c0 < nc; c0 += NEON_COLS) {
        const int ncc = (int) (nc - c0 < NEON_COLS ? nc - c0 : NEON_COLS);
        for (int64_t i = 0; i < nr; ++i) {
            neon_gemm_row(&k, w, sh, i, y + c0, ncc, dst + c0);
        }
    }
}

#else
typedef int bitcos_no_neon_kernel; // ISO C wants a declaration in every translation unit
#endif // BITCOS_BUILD_NEON || BITCOS_BUILD_NEON_DOTPROD
