// Generic (portable C) BITCOS kernel: the reference every SIMD path must match bit for bit.
// Contract and arithmetic order: bitcos-kernels.h. Format: docs/FORMAT.md.
#include "bitcos-kernels.h"

#include <string.h>

// Reads the 64 sign bits starting at pool bit `pos` (little-endian, LSB first). The pool carries >= 64
// zero bytes of tail (FORMAT.md §4.4), so the 9-byte window below never leaves the tensor.
static inline uint64_t bitcos_sign_window(const uint8_t * pool, uint64_t pos) {
    uint64_t lo, hi;
    memcpy(&lo, pool + (pos >> 3), 8);
    const unsigned sh = (unsigned)(pos & 7);
    if (sh == 0) {
        return lo;
    }
    hi = pool[(pos >> 3) + 8];
    return (lo >> sh) | (hi << (64 - sh));
}

static inline uint64_t bitcos_load_u64(const uint8_t * p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

// Decodes the 128 codes of one block into t and advances the row's sign cursor.
static inline void bitcos_decode_block(const uint8_t * bits, const uint8_t * pool, uint64_t * cursor, int8_t * t) {
    for (int h = 0; h < 2; ++h) {
        const uint64_t present = bitcos_load_u64(bits + 8*h);
        uint64_t       signs   = bitcos_sign_window(pool, *cursor);
        for (int j = 0; j < 64; ++j) {
            if ((present >> j) & 1) {
                t[64*h + j] = (signs & 1) ? -1 : 1;
                signs >>= 1;
            } else {
                t[64*h + j] = 0;
            }
        }
        *cursor += (uint64_t)__builtin_popcountll(present);
    }
}

void bitcos_mm_generic(const bitcos_rows * w, int64_t nr,
                       const bitcos_q8_K * const * y, int64_t nc, float * const * dst) {
    const int64_t nb = w->k / BITCOS_QK;
    const size_t  bb = w->variant == BITCOS_VARIANT_G128 ? BITCOS_BLOCK_BYTES_G128 : BITCOS_BLOCK_BYTES_PT;
    int8_t t[BITCOS_QK];
    for (int64_t i = 0; i < nr; ++i) {
        const uint8_t * row = w->blocks + (size_t)i * w->row_bytes;
        for (int64_t c = 0; c < nc; ++c) {
            uint64_t cursor    = w->sign_pos[i];
            float    acc       = 0.0f;
            float    part      = 0.0f;  // G128: scaled sum of the current Q8_K block's two groups
            int32_t  isum_pair = 0;     // PT: integer sum of the current Q8_K block's two groups
            for (int64_t g = 0; g < nb; ++g) {
                const uint8_t * blk = row + (size_t)g * bb;
                bitcos_decode_block(blk, w->pool, &cursor, t);
                const bitcos_q8_K * yb = &y[c][g/2];
                const int8_t      * q  = yb->qs + 128*(g & 1);
                int32_t isum = 0;
                for (int j = 0; j < BITCOS_QK; ++j) {
                    isum += (int32_t)t[j] * (int32_t)q[j];
                }
                const int last_of_pair = (g & 1) == 1 || g == nb - 1;
                if (w->variant == BITCOS_VARIANT_G128) {
                    uint16_t dh;
                    memcpy(&dh, blk + 16, 2);
                    const float d = bitcos_fp16_to_fp32(dh);
                    part = (g & 1) == 0 ? (float)isum * d : part + (float)isum * d;
                    if (last_of_pair) {
                        acc = acc + yb->d * part;
                    }
                } else {
                    isum_pair = (g & 1) == 0 ? isum : isum_pair + isum;
                    if (last_of_pair) {
                        acc = acc + yb->d * (float)isum_pair;
                    }
                }
            }
            dst[c][i] = w->variant == BITCOS_VARIANT_G128 ? acc : acc * w->scale;
        }
    }
}

bitcos_mm_fn bitcos_mm_best(void) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(BITCOS_HAVE_X86_KERNELS)
    return bitcos_mm_avx512;
#elif defined(__AVX2__) && defined(BITCOS_HAVE_X86_KERNELS)
    return bitcos_mm_avx2;
#else
    return bitcos_mm_generic;
#endif
}

const char * bitcos_mm_best_name(void) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(BITCOS_HAVE_X86_KERNELS)
    return "avx512";
#elif defined(__AVX2__) && defined(BITCOS_HAVE_X86_KERNELS)
    return "avx2";
#else
    return "generic";
#endif
}
