// bitcos_codes_mm_portable: the codes-form kernel (bitcos-kernels.h, docs/KERNELS.md §8) in plain C that a
// compiler vectorizes on any ISA: a block's 256 codes are unpacked once per row and column tile into bytes,
// and each column's lanes are summed as 32 int32 columns (position j % 32 of each 32-weight group) before the
// contract's 4-position lanes are formed. Bit-identical to bitcos_codes_mm_generic.
#include "bitcos-kernels.h"

#include <string.h>

#define PORTABLE_CODES_COLS 8 // columns per pass over a row's unpacked block

// u[j] = the code of weight j of the block (0 .. 255).
static inline void codes_unpack(const uint8_t * blk, int halves, int8_t u[BITCOS_Q8K_BLOCK]) {
    for (int h = 0; h < halves; ++h) {
        for (int g = 0; g < 4; ++g) {
            for (int m = 0; m < 32; ++m) {
                u[128 * h + 32 * g + m] = (int8_t) ((blk[32 * h + m] >> (2 * g)) & 3);
            }
        }
    }
}

// The contract's L[h][0 .. 8) of half h: sum u q per lane, minus the half's 32-weight activation sums.
static inline void codes_lanes(const int8_t * u, const bitcos_q8_K * yb, int h, int32_t L[8]) {
    int32_t s[32] = { 0 };
    for (int g = 0; g < 4; ++g) {
        for (int m = 0; m < 32; ++m) {
            s[m] += (int32_t) u[128 * h + 32 * g + m] * (int32_t) yb->qs[128 * h + 32 * g + m];
        }
    }
    for (int l = 0; l < 8; ++l) {
        L[l] = (s[4 * l] + s[4 * l + 1]) + (s[4 * l + 2] + s[4 * l + 3]);
    }
    for (int l = 4 * h; l < 4 * h + 4; ++l) {
        L[l] -= (int32_t) yb->bsums[2 * l] + (int32_t) yb->bsums[2 * l + 1];
    }
}

void bitcos_codes_mm_portable(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                              float * const * dst) {
    const int64_t nu  = (w->k + QK_BITCOS - 1) / QK_BITCOS;
    const int64_t nby = (nu + 1) / 2;
    int8_t        u[BITCOS_Q8K_BLOCK];
    for (int64_t i = 0; i < nr; ++i) {
        const uint8_t * row = w->codes + (size_t) i * w->row_bytes;
        for (int64_t c0 = 0; c0 < nc; c0 += PORTABLE_CODES_COLS) {
            const int nct = (int) (nc - c0 < PORTABLE_CODES_COLS ? nc - c0 : PORTABLE_CODES_COLS);
            float     acc[PORTABLE_CODES_COLS][8];
            memset(acc, 0, sizeof acc);
            for (int64_t b = 0; b < nby; ++b) {
                const int halves = (2 * b + 1 < nu) ? 2 : 1;
                codes_unpack(row + (size_t) b * BITCOS_CODES_BLOCK_BYTES, halves, u);
                uint16_t e[2] = { 0, 0 };
                if (w->row_scale == NULL) {
                    for (int h = 0; h < halves; ++h) {
                        memcpy(&e[h],
                               w->block_scale + (size_t) i * w->scale_row_bytes +
                                   (size_t) ((2 * b + h) >> w->block_scale_shift) * w->scale_stride,
                               sizeof e[h]);
                    }
                    if (halves == 1) {
                        e[1] = e[0];
                    }
                }
                const int   split = w->row_scale == NULL && e[0] != e[1];
                const float s0    = w->row_scale != NULL ? w->row_scale[i] : bitcos_fp16_to_fp32(e[0]);
                const float s1    = split ? bitcos_fp16_to_fp32(e[1]) : s0;
                for (int c = 0; c < nct; ++c) {
                    const bitcos_q8_K * yb      = &y[c0 + c][b];
                    int32_t             L[2][8] = { { 0 } };
                    for (int h = 0; h < halves; ++h) {
                        codes_lanes(u, yb, h, L[h]);
                    }
                    if (!split) {
                        const float D = yb->d * s0;
                        for (int l = 0; l < 8; ++l) {
                            acc[c][l] = bitcos_contract_fma((float) (L[0][l] + L[1][l]), D, acc[c][l]);
                        }
                    } else {
                        const float D0 = yb->d * s0;
                        const float D1 = yb->d * s1;
                        for (int l = 0; l < 8; ++l) {
                            acc[c][l] = bitcos_contract_fma((float) L[0][l], D0, acc[c][l]);
                            acc[c][l] = bitcos_contract_fma((float) L[1][l], D1, acc[c][l]);
                        }
                    }
                }
            }
            for (int c = 0; c < nct; ++c) {
                const float * a = acc[c];
                dst[c0 + c][i]  = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
            }
        }
    }
}
