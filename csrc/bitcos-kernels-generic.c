// Generic (portable C) BITCOS kernel: the reference every SIMD path must match bit for bit.
// Contract and arithmetic order: bitcos-kernels.h. Format: docs/FORMAT.md, its C layout bitcos-format.h.
#include "bitcos-kernels.h"

#include <math.h>
#include <string.h>

_Static_assert(BITCOS_BITMAP_BYTES == 2 * sizeof(uint64_t), "a block's bitmap is two u64 presence words");

static inline uint64_t bitcos_load_u64(const uint8_t * p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

// Decodes the 128 codes of one unit into t and advances the row's sign cursor. `bits` holds the unit's
// 16-byte bitmap (a partial last unit is first copied into a zero-filled buffer by the caller).
static inline void bitcos_decode_block(const uint8_t * bits, const uint8_t * pool, uint64_t * cursor, int8_t * t) {
    for (int h = 0; h < 2; ++h) {
        const uint64_t present = bitcos_load_u64(bits + sizeof(uint64_t) * h);
        uint64_t       signs   = bitcos_sign_window(pool, *cursor);
        for (int j = 0; j < 64; ++j) {
            if ((present >> j) & 1) {
                t[64 * h + j] = (signs & 1) ? -1 : 1;
                signs >>= 1;
            } else {
                t[64 * h + j] = 0;
            }
        }
        *cursor += (uint64_t) __builtin_popcountll(present);
    }
}

void bitcos_mm_generic(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                       float * const * dst) {
    const int64_t nu   = (w->k + QK_BITCOS - 1) / QK_BITCOS; // 128-weight units, the last maybe partial
    const int64_t nby  = (nu + 1) / 2;                       // Q8_K blocks
    const size_t  tail = (size_t) (w->k % QK_BITCOS) / 8;    // bitmap bytes of a partial last unit (0: none)
    int8_t        t[2][QK_BITCOS];
    uint8_t       partial[BITCOS_BITMAP_BYTES];
    for (int64_t i = 0; i < nr; ++i) {
        const uint8_t * row = w->bits + (size_t) i * w->row_bytes;
        if (tail) {
            memset(partial, 0, sizeof partial);
            memcpy(partial, row + (size_t) (nu - 1) * w->unit_bytes, tail);
        }
        for (int64_t c = 0; c < nc; ++c) {
            uint64_t cursor = w->sign_pos[i];
            float    acc[8] = { 0 };
            for (int64_t b = 0; b < nby; ++b) {
                const bitcos_q8_K * yb      = &y[c][b];
                const int           halves  = (2 * b + 1 < nu) ? 2 : 1;
                int32_t             L[2][8] = { { 0 } };
                uint16_t            e[2]    = { 0, 0 };
                for (int h = 0; h < halves; ++h) {
                    const int64_t   u   = 2 * b + h;
                    const uint8_t * blk = (tail && u == nu - 1) ? partial : row + (size_t) u * w->unit_bytes;
                    bitcos_decode_block(blk, w->pool, &cursor, t[h]);
                    if (w->row_scale == NULL) {
                        memcpy(&e[h],
                               w->block_scale + (size_t) i * w->scale_row_bytes +
                                   (size_t) (u >> w->block_scale_shift) * w->scale_stride,
                               sizeof e[h]);
                    }
                    const int8_t * q = yb->qs + QK_BITCOS * h;
                    for (int j = 0; j < QK_BITCOS; ++j) {
                        L[h][(j % 32) / 4] += ((int32_t) t[h][j] + 1) * (int32_t) q[j];
                        L[h][4 * h + j / 32] -= (int32_t) q[j];
                    }
                }
                if (halves == 1) {
                    e[1] = e[0];
                }
                bitcos_contract_block(acc, (const int32_t(*)[8]) L, yb->d,
                                      w->row_scale != NULL ? &w->row_scale[i] : NULL, e);
            }
            dst[c][i] = bitcos_contract_reduce(acc);
        }
    }
}
