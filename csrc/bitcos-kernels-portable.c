// Portable BITCOS kernel: plain C, no intrinsics, for every CPU without a SIMD kernel of its own (RISC-V,
// POWER, s390x, LoongArch, WASM, 32-bit x86, and aarch64 until a NEON kernel lands). Bit-identical to
// bitcos_mm_generic under the arithmetic contract of bitcos-kernels.h; it differs only in how it reaches the
// contract's exact int32 lane sums:
//
// * Decode without a branch per weight: a 256-entry table keyed by a presence nibble and the next 4 sign
//   bits gives the nibble's 4 codes (the paper's Xe2 key); the sign window then advances by the nibble's
//   popcount. A unit of 128 weights is decoded once per row and serves every activation column (the generic
//   kernel decodes it again per column).
// * The lane sums split into a weight part and an activation part:
//       L[h][l] = sum_{j in lane l of half h} t_j q_j  +  sum_{j in lane l of half h} q_j  -  sum_{j in half h, j / 32
//       == l} q_j
//   The last two terms depend on the column alone, so they are summed once per column and block and added
//   to every row; per weight only t_j q_j remains, where nibble m of a half (weights 4m..4m+3) belongs to
//   lane m % 8.
#include "bitcos-kernels.h"

#include <math.h>
#include <string.h>

// Rows decoded together: their codes for one Q8_K block stay in cache while every column reads them.
#define PORTABLE_ROWS 8
// Columns per pass over a row group's codes (more columns: the codes are decoded again per pass).
#define PORTABLE_COLS 16

// bitcos_portable_codes[(presence << 4) | signs]: the 4 codes of a nibble whose presence bits are `presence`,
// its present weights taking the low bits of `signs` in order (1: -1, 0: +1).
#define PORTABLE_BIT(p, i)        (((p) >> (i)) & 1)
#define PORTABLE_CODE(p, s, i, n) (PORTABLE_BIT(p, i) ? ((((s) >> (n)) & 1) ? -1 : 1) : 0)
#define PORTABLE_ENTRY(x)                                                                                       \
    { PORTABLE_CODE((x) >> 4, (x) & 15, 0, 0), PORTABLE_CODE((x) >> 4, (x) & 15, 1, PORTABLE_BIT((x) >> 4, 0)), \
      PORTABLE_CODE((x) >> 4, (x) & 15, 2, PORTABLE_BIT((x) >> 4, 0) + PORTABLE_BIT((x) >> 4, 1)),              \
      PORTABLE_CODE((x) >> 4, (x) & 15, 3,                                                                      \
                    PORTABLE_BIT((x) >> 4, 0) + PORTABLE_BIT((x) >> 4, 1) + PORTABLE_BIT((x) >> 4, 2)) }
#define PORTABLE_ROW16(b)                                                                                     \
    PORTABLE_ENTRY((b) + 0), PORTABLE_ENTRY((b) + 1), PORTABLE_ENTRY((b) + 2), PORTABLE_ENTRY((b) + 3),       \
        PORTABLE_ENTRY((b) + 4), PORTABLE_ENTRY((b) + 5), PORTABLE_ENTRY((b) + 6), PORTABLE_ENTRY((b) + 7),   \
        PORTABLE_ENTRY((b) + 8), PORTABLE_ENTRY((b) + 9), PORTABLE_ENTRY((b) + 10), PORTABLE_ENTRY((b) + 11), \
        PORTABLE_ENTRY((b) + 12), PORTABLE_ENTRY((b) + 13), PORTABLE_ENTRY((b) + 14), PORTABLE_ENTRY((b) + 15)

static const int8_t bitcos_portable_codes[256][4] = {
    PORTABLE_ROW16(0),   PORTABLE_ROW16(16),  PORTABLE_ROW16(32),  PORTABLE_ROW16(48),
    PORTABLE_ROW16(64),  PORTABLE_ROW16(80),  PORTABLE_ROW16(96),  PORTABLE_ROW16(112),
    PORTABLE_ROW16(128), PORTABLE_ROW16(144), PORTABLE_ROW16(160), PORTABLE_ROW16(176),
    PORTABLE_ROW16(192), PORTABLE_ROW16(208), PORTABLE_ROW16(224), PORTABLE_ROW16(240),
};

// Present weights of a nibble.
static const uint8_t bitcos_portable_popcount4[16] = { 0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4 };

// The 128 codes of one unit (bitmap `bits`, 16 bytes) into t[0..127]; advances the row's sign cursor.
static inline void bitcos_portable_decode(const uint8_t * bits, const uint8_t * pool, uint64_t * cursor, int8_t * t) {
    for (int h = 0; h < 2; ++h) {
        uint64_t present;
        memcpy(&present, bits + 8 * h, 8);
        uint64_t signs = bitcos_sign_window(pool, *cursor);
        unsigned used  = 0;
        for (int m = 0; m < 16; ++m) {
            const unsigned p = (unsigned) (present >> (4 * m)) & 15u;
            memcpy(t + 64 * h + 4 * m, bitcos_portable_codes[(p << 4) | (unsigned) (signs & 15u)], 4);
            signs >>= bitcos_portable_popcount4[p];
            used += bitcos_portable_popcount4[p];
        }
        *cursor += used;
    }
}

// The weight part of a half's lane sums: L[l] += sum_{j % 32 in [4l, 4l+4)} t_j q_j over the half's 128 weights,
// as one product per position accumulated into 32 columns first (a loop compilers vectorize on every ISA).
static inline void bitcos_portable_dot(const int8_t * t, const int8_t * q, int32_t * L) {
    int32_t p[32];
    for (int x = 0; x < 32; ++x) {
        p[x] = (int32_t) t[x] * q[x] + (int32_t) t[32 + x] * q[32 + x] + (int32_t) t[64 + x] * q[64 + x] +
               (int32_t) t[96 + x] * q[96 + x];
    }
    for (int l = 0; l < 8; ++l) {
        L[l] += (p[4 * l] + p[4 * l + 1]) + (p[4 * l + 2] + p[4 * l + 3]);
    }
}

// The activation part of a half's lane sums for column block yb: corr[l] = (sum of q over lane l's positions)
// - (sum of q over 32-group l of this half, for the half's four groups).
static inline void bitcos_portable_corr(const int8_t * q, int h, int32_t * corr) {
    for (int l = 0; l < 8; ++l) {
        int32_t lane = 0;
        for (int g = 0; g < 4; ++g) {
            const int8_t * p = q + 32 * g + 4 * l;
            lane += (int32_t) p[0] + p[1] + p[2] + p[3];
        }
        int32_t group = 0;
        if (l / 4 == h) {
            for (int j = 0; j < 32; ++j) {
                group += q[32 * (l & 3) + j];
            }
        }
        corr[l] = lane - group;
    }
}

// Columns [0, nc) (nc <= PORTABLE_COLS) of rows [i0, i0 + ng) (ng <= PORTABLE_ROWS).
static void bitcos_portable_rows(const bitcos_rows * w, int64_t i0, int ng, const bitcos_q8_K * const * y, int64_t nc,
                                 float * const * dst) {
    const int64_t nu   = (w->k + QK_BITCOS - 1) / QK_BITCOS; // 128-weight units, the last maybe partial
    const int64_t nby  = (nu + 1) / 2;                       // Q8_K blocks
    const size_t  tail = (size_t) (w->k % QK_BITCOS) / 8;    // bitmap bytes of a partial last unit (0: none)
    int8_t        t[PORTABLE_ROWS][2][QK_BITCOS];            // one block's codes, per row
    uint16_t      e[PORTABLE_ROWS][2];                       // one block's fp16 unit scales, per row
    uint64_t      cursor[PORTABLE_ROWS];
    uint8_t       partial[BITCOS_BITMAP_BYTES];
    float         acc[PORTABLE_COLS][PORTABLE_ROWS][8];
    memset(acc, 0, sizeof acc);
    for (int r = 0; r < ng; ++r) {
        cursor[r] = w->sign_pos[i0 + r];
    }
    for (int64_t b = 0; b < nby; ++b) {
        const int halves = (2 * b + 1 < nu) ? 2 : 1;
        for (int r = 0; r < ng; ++r) {
            const uint8_t * row = w->bits + (size_t) (i0 + r) * w->row_bytes;
            for (int h = 0; h < halves; ++h) {
                const int64_t   u   = 2 * b + h;
                const uint8_t * blk = row + (size_t) u * w->unit_bytes;
                if (tail && u == nu - 1) {
                    memset(partial, 0, sizeof partial);
                    memcpy(partial, blk, tail);
                    blk = partial;
                }
                bitcos_portable_decode(blk, w->pool, &cursor[r], t[r][h]);
                e[r][h] = 0;
                if (w->row_scale == NULL) {
                    memcpy(&e[r][h],
                           w->block_scale + (size_t) (i0 + r) * w->scale_row_bytes +
                               (size_t) (u >> w->block_scale_shift) * w->scale_stride,
                           sizeof e[r][h]);
                }
            }
            if (halves == 1) {
                e[r][1] = e[r][0];
            }
        }
        for (int64_t c = 0; c < nc; ++c) {
            const bitcos_q8_K * yb         = &y[c][b];
            int32_t             corr[2][8] = { { 0 } };
            for (int h = 0; h < halves; ++h) {
                bitcos_portable_corr(yb->qs + QK_BITCOS * h, h, corr[h]);
            }
            for (int r = 0; r < ng; ++r) {
                int32_t L[2][8] = { { 0 } };
                for (int h = 0; h < halves; ++h) {
                    for (int l = 0; l < 8; ++l) {
                        L[h][l] = corr[h][l];
                    }
                    bitcos_portable_dot(t[r][h], yb->qs + QK_BITCOS * h, L[h]);
                }
                float * a = acc[c][r];
                if (w->row_scale != NULL || e[r][0] == e[r][1]) {
                    const float D =
                        yb->d * (w->row_scale != NULL ? w->row_scale[i0 + r] : bitcos_fp16_to_fp32(e[r][0]));
                    for (int l = 0; l < 8; ++l) {
                        a[l] = bitcos_contract_fma((float) (L[0][l] + L[1][l]), D, a[l]);
                    }
                } else {
                    const float D0 = yb->d * bitcos_fp16_to_fp32(e[r][0]);
                    const float D1 = yb->d * bitcos_fp16_to_fp32(e[r][1]);
                    for (int l = 0; l < 8; ++l) {
                        a[l] = bitcos_contract_fma((float) L[0][l], D0, a[l]);
                        a[l] = bitcos_contract_fma((float) L[1][l], D1, a[l]);
                    }
                }
            }
        }
    }
    for (int64_t c = 0; c < nc; ++c) {
        for (int r = 0; r < ng; ++r) {
            const float * a = acc[c][r];
            dst[c][i0 + r]  = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
        }
    }
}

void bitcos_mm_portable(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                        float * const * dst) {
    for (int64_t c0 = 0; c0 < nc; c0 += PORTABLE_COLS) {
        const int64_t ncc = nc - c0 < PORTABLE_COLS ? nc - c0 : PORTABLE_COLS;
        for (int64_t i0 = 0; i0 < nr; i0 += PORTABLE_ROWS) {
            const int ng = (int) (nr - i0 < PORTABLE_ROWS ? nr - i0 : PORTABLE_ROWS);
            bitcos_portable_rows(w, i0, ng, y + c0, ncc, dst + c0);
        }
    }
}
