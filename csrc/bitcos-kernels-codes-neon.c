// aarch64 codes-form kernels (bitcos-kernels.h, docs/KERNELS.md §8): bitcos_codes_mm_neon (Armv8.0 Advanced SIMD)
// or bitcos_codes_mm_neon_dotprod (+ sdot), by the flags this file is compiled with, like bitcos-kernels-neon.c.
// Bit-identical to bitcos_codes_mm_generic.
//
// A half block's 32 code bytes are two 16-byte registers x0, x1; a shift and an and give the codes of 32-weight
// group g (positions 32g .. 32g+15 from x0, 32g+16 .. 32g+31 from x1). A 16-byte chunk at 32g + 16s holds the
// contract's lanes 4s .. 4s+3 in its 4-byte groups, so sdot into two int32x4 accumulators gives the lanes
// (Armv8.0: smull / smlal into four int16x8 accumulators, |.| <= 8 * 256 a block, then addp and sadalp, exact).
// The subtracted 32-weight group sums come from the Q8_K bsums (saddlp), negated once per block and column and
// taken as the accumulators' start. Tiles: NEON_CODES_GEMV_ROWS rows against 1 column (GEMV: a block's
// activation loads and group sums serve every row; with sdot the codes are scaled, neon_codes_order), 1 row
// against NEON_CODES_COLS columns (GEMM: a row's codes made once for every column). The block loop has no
// horizontal reduction and keeps every accumulator in a register; the last block of a row of 128 weights past a
// multiple of 256 (one half) has a copy of its own.
#include "bitcos-kernels.h"

#if defined(BITCOS_BUILD_NEON) || defined(BITCOS_BUILD_NEON_DOTPROD)

#    include <arm_neon.h>

#    define NEON_CODES_INLINE    static inline __attribute__((always_inline))
#    define NEON_CODES_COLS      4 // columns of a 1-row tile
#    define NEON_CODES_GEMV_ROWS 3 // rows of a 1-column tile (at most 4; 4 runs out of registers)
// The tile loops (constant trip counts after inlining) unrolled whole, so every accumulator stays in a register.
#    define NEON_CODES_UNROLL    _Pragma("GCC unroll 16")

// How a tile finds its scales: row scales, an fp16 scale per 256 weights (one per block), or per 128 (a block's
// two halves may differ: the contract's split).
enum { NEON_CODES_ROW = 1, NEON_CODES_PER_256 = 2, NEON_CODES_PER_128 = 3 };

#    if defined(BITCOS_BUILD_NEON_DOTPROD)
#        define NEON_CODES_KERNEL bitcos_codes_mm_neon_dotprod

// The integer lanes of one row, column and block (or half block): lanes 0-3 and 4-7.
typedef struct {
    int32x4_t lo, hi;
} neon_codes_acc;

NEON_CODES_INLINE void neon_codes_start(neon_codes_acc * a, int32x4_t lo, int32x4_t hi) {
    a->lo = lo;
    a->hi = hi;
}

// + the products of group g: ua, ub the codes of its positions 0-15 and 16-31, qa, qb their activations.
NEON_CODES_INLINE void neon_codes_add(neon_codes_acc * a, uint8x16_t ua, uint8x16_t ub, int8x16_t qa, int8x16_t qb,
                                      int first) {
    (void) first;
    a->lo = vdotq_s32(a->lo, vreinterpretq_s8_u8(ua), qa);
    a->hi = vdotq_s32(a->hi, vreinterpretq_s8_u8(ub), qb);
}

NEON_CODES_INLINE void neon_codes_lanes(const neon_codes_acc * a, int32x4_t * lo, int32x4_t * hi) {
    *lo = a->lo;
    *hi = a->hi;
}

// The groups in the order they are added. Scaled (a 1-column tile, where a block's codes serve one column): 16 u
// (x & 48) for group 2, then the lanes / 4 (exact: a multiple of 4), 4 u (x & 12) for group 1, / 4 again, then u
// for groups 0 and 3 (x & 3, x >> 6): one and or shift a group instead of a shift and an and, for two shifts of
// the lanes a block. Not scaled (several columns: the lanes' shifts would be per column): u = (x >> 2g) & 3.
NEON_CODES_INLINE int neon_codes_order(int k, const int scaled) {
    return scaled ? (k == 0 ? 2 : k == 1 ? 1 : k == 2 ? 0 : 3) : k;
}

NEON_CODES_INLINE uint8x16_t neon_codes_group(uint8x16_t x, const int g, const int scaled) {
    switch (g) {
        case 0:
            return vandq_u8(x, vdupq_n_u8(3));
        case 1:
            return scaled ? vandq_u8(x, vdupq_n_u8(12)) : vandq_u8(vshrq_n_u8(x, 2), vdupq_n_u8(3));
        case 2:
            return scaled ? vandq_u8(x, vdupq_n_u8(48)) : vandq_u8(vshrq_n_u8(x, 4), vdupq_n_u8(3));
        default:
            return vshrq_n_u8(x, 6);
    }
}

// After the groups of neon_codes_order(0 .. k), k < 3.
NEON_CODES_INLINE void neon_codes_rescale(neon_codes_acc * a, const int k, const int scaled) {
    if (scaled && k < 2) {
        a->lo = vshrq_n_s32(a->lo, 2);
        a->hi = vshrq_n_s32(a->hi, 2);
    }
}

// The lanes' start from the pair sums of the bsums (the group sums G): -G at the scale of the first group.
NEON_CODES_INLINE int32x4_t neon_codes_start_value(int32x4_t group_sums, const int scaled) {
    return scaled ? vmulq_n_s32(group_sums, -16) : vnegq_s32(group_sums);
}
#    else
#        define NEON_CODES_KERNEL bitcos_codes_mm_neon

// int16 lanes of bytes 0-7 / 8-15 of the chunks at 32g (p0, p1) and 32g + 16 (p2, p3), and the int32 start.
typedef struct {
    int16x8_t p0, p1, p2, p3;
    int32x4_t lo, hi;
} neon_codes_acc;

NEON_CODES_INLINE void neon_codes_start(neon_codes_acc * a, int32x4_t lo, int32x4_t hi) {
    a->p0 = a->p1 = a->p2 = a->p3 = vdupq_n_s16(0); // dead where the first add is known (smull)
    a->lo                         = lo;
    a->hi                         = hi;
}

NEON_CODES_INLINE void neon_codes_add(neon_codes_acc * a, uint8x16_t ua, uint8x16_t ub, int8x16_t qa, int8x16_t qb,
                                      int first) {
    const int8x16_t sa = vreinterpretq_s8_u8(ua), sb = vreinterpretq_s8_u8(ub);
    if (first) {
        a->p0 = vmull_s8(vget_low_s8(sa), vget_low_s8(qa));
        a->p1 = vmull_high_s8(sa, qa);
        a->p2 = vmull_s8(vget_low_s8(sb), vget_low_s8(qb));
        a->p3 = vmull_high_s8(sb, qb);
    } else {
        a->p0 = vmlal_s8(a->p0, vget_low_s8(sa), vget_low_s8(qa));
        a->p1 = vmlal_high_s8(a->p1, sa, qa);
        a->p2 = vmlal_s8(a->p2, vget_low_s8(sb), vget_low_s8(qb));
        a->p3 = vmlal_high_s8(a->p3, sb, qb);
    }
}

NEON_CODES_INLINE void neon_codes_lanes(const neon_codes_acc * a, int32x4_t * lo, int32x4_t * hi) {
    *lo = vpadalq_s16(a->lo, vpaddq_s16(a->p0, a->p1));
    *hi = vpadalq_s16(a->hi, vpaddq_s16(a->p2, a->p3));
}

// The groups in order, each u = (x >> 2g) & 3 (scaled codes would need a shift of every int16 accumulator).
NEON_CODES_INLINE int neon_codes_order(int k, const int scaled) {
    (void) scaled;
    return k;
}

NEON_CODES_INLINE uint8x16_t neon_codes_group(uint8x16_t x, const int g, const int scaled) {
    (void) scaled;
    const uint8x16_t three = vdupq_n_u8(3);
    switch (g) {
        case 0:
            return vandq_u8(x, three);
        case 1:
            return vandq_u8(vshrq_n_u8(x, 2), three);
        case 2:
            return vandq_u8(vshrq_n_u8(x, 4), three);
        default:
            return vshrq_n_u8(x, 6);
    }
}

NEON_CODES_INLINE void neon_codes_rescale(neon_codes_acc * a, const int k, const int scaled) {
    (void) a;
    (void) k;
    (void) scaled;
}

NEON_CODES_INLINE int32x4_t neon_codes_start_value(int32x4_t group_sums, const int scaled) {
    (void) scaled;
    return vnegq_s32(group_sums);
}
#    endif

// acc + x * d, the contract's FMA.
NEON_CODES_INLINE float32x4_t neon_codes_fma(float32x4_t x, float d, float32x4_t acc) {
#    if BITCOS_FMA
    return vfmaq_n_f32(acc, x, d);
#    else
    return vaddq_f32(vmulq_n_f32(x, d), acc);
#    endif
}

// fp16 bits -> fp32 (exact: every binary16 is a binary32).
NEON_CODES_INLINE float neon_codes_fp16(const uint8_t * p) {
    __fp16 h;
    memcpy(&h, p, sizeof h);
    return (float) h;
}

// The fp16 scale bits of 128-weight unit u of row i.
NEON_CODES_INLINE uint16_t neon_codes_scale_bits(const bitcos_codes_rows * w, int64_t i, int64_t u) {
    uint16_t e;
    memcpy(&e,
           w->block_scale + (size_t) i * w->scale_row_bytes + (size_t) (u >> w->block_scale_shift) * w->scale_stride,
           sizeof e);
    return e;
}

// Block b (H halves) of R rows (codes of row r at rows[r]) against C columns (blocks at ys[c]): every FMA of the
// contract into acc[r * C + c].
NEON_CODES_INLINE void neon_codes_block(const bitcos_codes_rows * w, int64_t i0, const int R,
                                        const uint8_t * const * rows, float32x4_t s, const int C,
                                        const bitcos_q8_K * const * ys, int64_t b, const int H, const int kind,
                                        float32x4_t (*acc)[2]) {
    // PER_128 keeps each half's lanes apart (a block whose two scales differ has two FMAs per lane)
    const int       sep    = kind == NEON_CODES_PER_128 && H == 2;
    const int       scaled = C == 1; // the group order and codes (neon_codes_order)
    const int32x4_t zero   = vdupq_n_s32(0);
    int32x4_t       g0[NEON_CODES_COLS], g1[NEON_CODES_COLS];
    float           yd[NEON_CODES_COLS];
    NEON_CODES_UNROLL
    for (int c = 0; c < C; ++c) {
        const bitcos_q8_K * yb = &ys[c][b];
        yd[c]                  = yb->d;
        g0[c]                  = neon_codes_start_value(vpaddlq_s16(vld1q_s16(yb->bsums)), scaled);
        g1[c]                  = H == 2 ? neon_codes_start_value(vpaddlq_s16(vld1q_s16(yb->bsums + 8)), scaled) : zero;
    }
    neon_codes_acc a[2][NEON_CODES_GEMV_ROWS * NEON_CODES_COLS];
    NEON_CODES_UNROLL
    for (int r = 0; r < R; ++r) {
        NEON_CODES_UNROLL
        for (int c = 0; c < C; ++c) {
            if (sep) {
                neon_codes_start(&a[0][r * C + c], g0[c], zero);
                neon_codes_start(&a[1][r * C + c], zero, g1[c]);
            } else {
                neon_codes_start(&a[0][r * C + c], g0[c], g1[c]);
            }
        }
    }
    uint8x16_t x0[2][NEON_CODES_GEMV_ROWS], x1[2][NEON_CODES_GEMV_ROWS];
    NEON_CODES_UNROLL
    for (int h = 0; h < H; ++h) {
        NEON_CODES_UNROLL
        for (int r = 0; r < R; ++r) {
            x0[h][r] = vld1q_u8(rows[r] + (size_t) b * BITCOS_CODES_BLOCK_BYTES + 32 * h);
            x1[h][r] = vld1q_u8(rows[r] + (size_t) b * BITCOS_CODES_BLOCK_BYTES + 32 * h + 16);
        }
    }
    // scaled: group by group over the halves (a group's scale ends before the lanes' shift); else half by half
    const int no = scaled ? 4 : H, np = scaled ? H : 4;
    NEON_CODES_UNROLL
    for (int o = 0; o < no; ++o) {
        NEON_CODES_UNROLL
        for (int p = 0; p < np; ++p) {
            const int        k = scaled ? o : p, h = scaled ? p : o, g = neon_codes_order(k, scaled);
            neon_codes_acc * ah = a[sep ? h : 0];
            int8x16_t        qa[NEON_CODES_COLS], qb[NEON_CODES_COLS];
            NEON_CODES_UNROLL
            for (int c = 0; c < C; ++c) {
                qa[c] = vld1q_s8(ys[c][b].qs + 128 * h + 32 * g);
                qb[c] = vld1q_s8(ys[c][b].qs + 128 * h + 32 * g + 16);
            }
            NEON_CODES_UNROLL
            for (int r = 0; r < R; ++r) {
                const uint8x16_t ua = neon_codes_group(x0[h][r], g, scaled), ub = neon_codes_group(x1[h][r], g, scaled);
                NEON_CODES_UNROLL
                for (int c = 0; c < C; ++c) {
                    neon_codes_add(&ah[r * C + c], ua, ub, qa[c], qb[c], k == 0 && (h == 0 || sep));
                }
            }
        }
        if (scaled && o < 2) {
            NEON_CODES_UNROLL
            for (int t = 0; t < R * C; ++t) {
                neon_codes_rescale(&a[0][t], o, scaled);
                if (sep) {
                    neon_codes_rescale(&a[1][t], o, scaled);
                }
            }
        }
    }
    // row scales: the D of row r and column c is lane r of dr[c] (one multiply for every row of the tile)
    float dr[NEON_CODES_COLS][4];
    if (kind == NEON_CODES_ROW) {
        NEON_CODES_UNROLL
        for (int c = 0; c < C; ++c) {
            vst1q_f32(dr[c], vmulq_n_f32(s, yd[c]));
        }
    }
    NEON_CODES_UNROLL
    for (int r = 0; r < R; ++r) {
        const int64_t i  = i0 + r;
        uint16_t      e0 = 0, e1 = 0;
        float         s0 = 0.0f;
        if (kind == NEON_CODES_PER_256) {
            s0 = neon_codes_fp16(w->block_scale + (size_t) i * w->scale_row_bytes + (size_t) b * w->scale_stride);
        } else if (kind == NEON_CODES_PER_128) {
            e0 = neon_codes_scale_bits(w, i, 2 * b);
            e1 = H == 2 ? neon_codes_scale_bits(w, i, 2 * b + 1) : e0;
            s0 = neon_codes_fp16((const uint8_t *) &e0);
        }
        NEON_CODES_UNROLL
        for (int c = 0; c < C; ++c) {
            float32x4_t * ac = acc[r * C + c];
            int32x4_t     lo, hi;
            neon_codes_lanes(&a[0][r * C + c], &lo, &hi);
            if (sep) {
                int32x4_t lo1, hi1;
                neon_codes_lanes(&a[1][r * C + c], &lo1, &hi1);
                if (e0 != e1) {
                    const float d0 = yd[c] * s0, d1 = yd[c] * neon_codes_fp16((const uint8_t *) &e1);
                    ac[0] = neon_codes_fma(vcvtq_f32_s32(lo), d0, ac[0]);
                    ac[1] = neon_codes_fma(vcvtq_f32_s32(hi), d0, ac[1]);
                    ac[0] = neon_codes_fma(vcvtq_f32_s32(lo1), d1, ac[0]);
                    ac[1] = neon_codes_fma(vcvtq_f32_s32(hi1), d1, ac[1]);
                    continue;
                }
                lo = vaddq_s32(lo, lo1);
                hi = vaddq_s32(hi, hi1);
            }
            const float d = kind == NEON_CODES_ROW ? dr[c][r] : yd[c] * s0;
            ac[0]         = neon_codes_fma(vcvtq_f32_s32(lo), d, ac[0]);
            ac[1]         = neon_codes_fma(vcvtq_f32_s32(hi), d, ac[1]);
        }
    }
}

// R rows from i0 against C columns from c0 (R * C <= 4): every block, then the contract's lane sum.
NEON_CODES_INLINE void neon_codes_tile(const bitcos_codes_rows * w, int64_t i0, const int R,
                                       const bitcos_q8_K * const * y, int64_t c0, const int C, float * const * dst,
                                       const int kind) {
    const int64_t       nu = (w->k + QK_BITCOS - 1) / QK_BITCOS, nfull = nu / 2;
    const uint8_t *     rows[NEON_CODES_GEMV_ROWS];
    float               s[4] = { 0.0f, 0.0f, 0.0f, 0.0f }; // row scales
    const bitcos_q8_K * ys[NEON_CODES_COLS];
    float32x4_t         acc[NEON_CODES_GEMV_ROWS * NEON_CODES_COLS][2];
    for (int r = 0; r < R; ++r) {
        rows[r] = w->codes + (size_t) (i0 + r) * w->row_bytes;
        s[r]    = kind == NEON_CODES_ROW ? w->row_scale[i0 + r] : 0.0f;
    }
    for (int c = 0; c < C; ++c) {
        ys[c] = y[c0 + c];
    }
    for (int t = 0; t < R * C; ++t) {
        acc[t][0] = acc[t][1] = vdupq_n_f32(0.0f);
    }
    const float32x4_t s4 = vld1q_f32(s);
    for (int64_t b = 0; b < nfull; ++b) {
        neon_codes_block(w, i0, R, rows, s4, C, ys, b, 2, kind, acc);
    }
    if (nu & 1) { // a last block of one half
        neon_codes_block(w, i0, R, rows, s4, C, ys, nfull, 1, kind, acc);
    }
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) {
            const float32x4_t v = vaddq_f32(acc[r * C + c][0], acc[r * C + c][1]);
            dst[c0 + c][i0 + r] =
                (vgetq_lane_f32(v, 0) + vgetq_lane_f32(v, 2)) + (vgetq_lane_f32(v, 1) + vgetq_lane_f32(v, 3));
        }
    }
}

// Every row against every column: 1-row tiles of NEON_CODES_COLS columns, then each remaining column with tiles of
// NEON_CODES_GEMV_ROWS rows (and single rows).
NEON_CODES_INLINE void neon_codes_mm(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                                     float * const * dst, const int kind) {
    int64_t c = 0;
    for (; c + NEON_CODES_COLS <= nc; c += NEON_CODES_COLS) {
        for (int64_t i = 0; i < nr; ++i) {
            neon_codes_tile(w, i, 1, y, c, NEON_CODES_COLS, dst, kind);
        }
    }
    for (; c < nc; ++c) {
        int64_t i = 0;
        for (; i + NEON_CODES_GEMV_ROWS <= nr; i += NEON_CODES_GEMV_ROWS) {
            neon_codes_tile(w, i, NEON_CODES_GEMV_ROWS, y, c, 1, dst, kind);
        }
        for (; i < nr; ++i) {
            neon_codes_tile(w, i, 1, y, c, 1, dst, kind);
        }
    }
}

static void neon_codes_mm_row(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                              float * const * dst) {
    neon_codes_mm(w, nr, y, nc, dst, NEON_CODES_ROW);
}

static void neon_codes_mm_per_256(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                                  float * const * dst) {
    neon_codes_mm(w, nr, y, nc, dst, NEON_CODES_PER_256);
}

static void neon_codes_mm_per_128(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                                  float * const * dst) {
    neon_codes_mm(w, nr, y, nc, dst, NEON_CODES_PER_128);
}

void NEON_CODES_KERNEL(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                       float * const * dst) {
    (w->row_scale != NULL      ? neon_codes_mm_row :
     w->block_scale_shift == 1 ? neon_codes_mm_per_256 :
                                 neon_codes_mm_per_128)(w, nr, y, nc, dst);
}

#endif
