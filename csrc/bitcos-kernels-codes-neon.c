// aarch64 codes-form kernels (bitcos-kernels.h, docs/KERNELS.md §8): bitcos_codes_mm_neon (Armv8.0 Advanced SIMD)
// or bitcos_codes_mm_neon_dotprod (+ sdot), by the flags this file is compiled with, like bitcos-kernels-neon.c.
// Bit-identical to bitcos_codes_mm_generic.
//
// A half block's 32 code bytes are two 16-byte registers; a shift by 2g and an and give the codes of 32-weight
// group g, positions 32g .. 32g+15 and 32g+16 .. 32g+31. A 16-byte chunk at 32g + 16s holds the contract's
// lanes 4s .. 4s+3 in its 4-byte groups, so sdot (or smull + pairwise adds, exact in int16) into two int32x4
// accumulators gives the lanes; the 32-weight group sums come from the Q8_K bsums. A block's codes are made
// once per row and serve up to NEON_CODES_COLS columns.
#include "bitcos-kernels.h"

#if defined(BITCOS_BUILD_NEON) || defined(BITCOS_BUILD_NEON_DOTPROD)

#    include <arm_neon.h>

#    define NEON_CODES_INLINE static inline __attribute__((always_inline))
#    define NEON_CODES_COLS   4

#    if defined(BITCOS_BUILD_NEON_DOTPROD)
#        define NEON_CODES_KERNEL bitcos_codes_mm_neon_dotprod
NEON_CODES_INLINE int32x4_t neon_codes_dot16(int32x4_t acc, uint8x16_t u, int8x16_t q) {
    return vdotq_s32(acc, vreinterpretq_s8_u8(u), q);
}
#    else
#        define NEON_CODES_KERNEL bitcos_codes_mm_neon
NEON_CODES_INLINE int32x4_t neon_codes_dot16(int32x4_t acc, uint8x16_t u, int8x16_t q) {
    const int16x8_t lo = vmull_s8(vreinterpret_s8_u8(vget_low_u8(u)), vget_low_s8(q));
    const int16x8_t hi = vmull_high_s8(vreinterpretq_s8_u8(u), q);
    return vpadalq_s16(acc, vpaddq_s16(lo, hi));
}
#    endif

NEON_CODES_INLINE float32x4_t neon_codes_fma(float32x4_t x, float d, float32x4_t acc) {
#    if BITCOS_FMA
    return vfmaq_n_f32(acc, x, d);
#    else
    return vaddq_f32(vmulq_n_f32(x, d), acc);
#    endif
}

// The codes of a half block: u[2g] positions 32g .. 32g+15, u[2g+1] 32g+16 .. 32g+31.
NEON_CODES_INLINE void neon_codes_half(const uint8_t * half, uint8x16_t u[8]) {
    const uint8x16_t three = vdupq_n_u8(3);
    const uint8x16_t x0 = vld1q_u8(half), x1 = vld1q_u8(half + 16);
    u[0] = vandq_u8(x0, three);
    u[1] = vandq_u8(x1, three);
    u[2] = vandq_u8(vshrq_n_u8(x0, 2), three);
    u[3] = vandq_u8(vshrq_n_u8(x1, 2), three);
    u[4] = vandq_u8(vshrq_n_u8(x0, 4), three);
    u[5] = vandq_u8(vshrq_n_u8(x1, 4), three);
    u[6] = vshrq_n_u8(x0, 6);
    u[7] = vshrq_n_u8(x1, 6);
}

NEON_CODES_INLINE void neon_codes_dot_half(const uint8x16_t * u, const int8_t * q, int32x4_t * lo, int32x4_t * hi) {
    int32x4_t a = vdupq_n_s32(0), c = vdupq_n_s32(0);
    for (int g = 0; g < 4; ++g) {
        a = neon_codes_dot16(a, u[2 * g], vld1q_s8(q + 32 * g));
        c = neon_codes_dot16(c, u[2 * g + 1], vld1q_s8(q + 32 * g + 16));
    }
    *lo = a;
    *hi = c;
}

void NEON_CODES_KERNEL(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                       float * const * dst) {
    const int64_t nu = (w->k + QK_BITCOS - 1) / QK_BITCOS, nby = (nu + 1) / 2;
    for (int64_t i = 0; i < nr; ++i) {
        const uint8_t * row = w->codes + (size_t) i * w->row_bytes;
        for (int64_t c0 = 0; c0 < nc; c0 += NEON_CODES_COLS) {
            const int   ncc = (int) (nc - c0 < NEON_CODES_COLS ? nc - c0 : NEON_CODES_COLS);
            float32x4_t acc[NEON_CODES_COLS][2];
            for (int c = 0; c < NEON_CODES_COLS; ++c) {
                acc[c][0] = acc[c][1] = vdupq_n_f32(0.0f);
            }
            for (int64_t b = 0; b < nby; ++b) {
                const int       halves = (2 * b + 1 < nu) ? 2 : 1;
                const uint8_t * blk    = row + (size_t) b * BITCOS_CODES_BLOCK_BYTES;
                uint8x16_t      u[2][8];
                uint16_t        e[2] = { 0, 0 };
                for (int h = 0; h < halves; ++h) {
                    neon_codes_half(blk + 32 * h, u[h]);
                    if (w->row_scale == NULL) {
                        memcpy(&e[h],
                               w->block_scale + (size_t) i * w->scale_row_bytes +
                                   (size_t) ((2 * b + h) >> w->block_scale_shift) * w->scale_stride,
                               2);
                    }
                }
                if (halves == 1) {
                    e[1] = e[0];
                }
                const int   split = w->row_scale == NULL && e[0] != e[1];
                const float s0    = w->row_scale != NULL ? w->row_scale[i] : bitcos_fp16_to_fp32(e[0]);
                const float s1    = split ? bitcos_fp16_to_fp32(e[1]) : s0;
                for (int c = 0; c < ncc; ++c) {
                    const bitcos_q8_K * yb = &y[c0 + c][b];
                    int32x4_t           lo[2], hi[2];
                    for (int h = 0; h < halves; ++h) {
                        neon_codes_dot_half(u[h], yb->qs + QK_BITCOS * h, &lo[h], &hi[h]);
                    }
                    const int32x4_t g0 = vpaddlq_s16(vld1q_s16(yb->bsums));
                    float32x4_t *   a  = acc[c];
                    if (halves == 1) {
                        const float d = yb->d * s0;
                        a[0]          = neon_codes_fma(vcvtq_f32_s32(vsubq_s32(lo[0], g0)), d, a[0]);
                        a[1]          = neon_codes_fma(vcvtq_f32_s32(hi[0]), d, a[1]);
                        continue;
                    }
                    const int32x4_t g1 = vpaddlq_s16(vld1q_s16(yb->bsums + 8));
                    if (!split) {
                        const float d = yb->d * s0;
                        a[0]          = neon_codes_fma(vcvtq_f32_s32(vsubq_s32(vaddq_s32(lo[0], lo[1]), g0)), d, a[0]);
                        a[1]          = neon_codes_fma(vcvtq_f32_s32(vsubq_s32(vaddq_s32(hi[0], hi[1]), g1)), d, a[1]);
                    } else {
                        const float d0 = yb->d * s0, d1 = yb->d * s1;
                        a[0] = neon_codes_fma(vcvtq_f32_s32(vsubq_s32(lo[0], g0)), d0, a[0]);
                        a[1] = neon_codes_fma(vcvtq_f32_s32(hi[0]), d0, a[1]);
                        a[0] = neon_codes_fma(vcvtq_f32_s32(lo[1]), d1, a[0]);
                        a[1] = neon_codes_fma(vcvtq_f32_s32(vsubq_s32(hi[1], g1)), d1, a[1]);
                    }
                }
            }
            for (int c = 0; c < ncc; ++c) {
                const float32x4_t s = vaddq_f32(acc[c][0], acc[c][1]);
                dst[c0 + c][i] =
                    (vgetq_lane_f32(s, 0) + vgetq_lane_f32(s, 2)) + (vgetq_lane_f32(s, 1) + vgetq_lane_f32(s, 3));
            }
        }
    }
}

#endif
