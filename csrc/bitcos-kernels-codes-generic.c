// The 2-bit codes form of a BITCOS weight (bitcos-kernels.h, docs/KERNELS.md §8): the decode BITCOS -> codes
// (plain C, and a BMI2 pdep path on x86), the copy of block scales, and bitcos_codes_mm_generic, the plain C
// codes kernel every codes kernel must match bit for bit (and with it bitcos_mm_generic on the same weight).
#include "bitcos-kernels.h"

#include <string.h>

#if defined(BITCOS_ARCH_X86_64)
#    include <immintrin.h>
#endif

// Byte and bit shift of code j (0 .. 255) in its block's 64 bytes: TQ2_0's layout.
static inline size_t codes_byte(int j) {
    return (size_t) (32 * (j / 128) + j % 32);
}

static inline int codes_shift(int j) {
    return 2 * ((j % 128) / 32);
}

// The unit's bitmap, with the bytes past k of a partial last unit zero (absent weights).
static inline void codes_unit_bitmap(const bitcos_rows * w, const uint8_t * row, int64_t u, int64_t nu,
                                     uint64_t present[2]) {
    uint8_t         bm[BITCOS_BITMAP_BYTES] = { 0 };
    const size_t    tail                    = (size_t) (w->k % QK_BITCOS) / 8;
    const uint8_t * src                     = row + (size_t) u * w->unit_bytes;
    memcpy(bm, src, (tail && u == nu - 1) ? tail : sizeof bm);
    memcpy(present, bm, sizeof bm);
}

void bitcos_codes_decode_generic(const bitcos_rows * w, int64_t i0, int64_t i1, uint8_t * codes,
                                 size_t codes_row_bytes) {
    const int64_t nu = (w->k + QK_BITCOS - 1) / QK_BITCOS;
    for (int64_t i = i0; i < i1; ++i) {
        const uint8_t * row    = w->bits + (size_t) i * w->row_bytes;
        uint8_t *       out    = codes + (size_t) i * codes_row_bytes;
        uint64_t        cursor = w->sign_pos[i];
        memset(out, 0x55, bitcos_codes_row_bytes(w->k)); // u = 1 (t = 0) everywhere, padding included
        for (int64_t u = 0; u < nu; ++u) {
            uint64_t present[2];
            codes_unit_bitmap(w, row, u, nu, present);
            uint8_t * blk = out + (size_t) (u / 2) * BITCOS_CODES_BLOCK_BYTES;
            for (int h = 0; h < 2; ++h) {
                uint64_t signs = bitcos_sign_window(w->pool, cursor);
                cursor += (uint64_t) __builtin_popcountll(present[h]);
                for (int jj = 0; jj < 64; ++jj) {
                    if (!((present[h] >> jj) & 1)) {
                        continue;
                    }
                    const int     j    = (int) (128 * (u % 2)) + 64 * h + jj;
                    const uint8_t code = (signs & 1) ? 0 : 2;
                    signs >>= 1;
                    const int sh       = codes_shift(j);
                    blk[codes_byte(j)] = (uint8_t) ((blk[codes_byte(j)] & ~(3u << sh)) | ((unsigned) code << sh));
                }
            }
        }
    }
}

#if defined(BITCOS_ARCH_X86_64)
#    if defined(__BMI2__) && !defined(__znver1__) && !defined(__znver2__)
#        define CODES_BMI2_ATTR
#        define CODES_BMI2_BUILT 1
#    else
#        define CODES_BMI2_ATTR __attribute__((target("bmi2")))
#    endif

// One 128-weight unit: presence words P, negative words N = pdep(signs, P). Per 32 weights g (bits 32g .. of
// the unit), bit 0 of the code is "absent" and bit 1 "present and positive"; the two 32-bit masks are
// interleaved into 64 bits of codes in weight order, and each 8 codes (16 bits) are spread to bits 2g, 2g+1 of
// 8 consecutive bytes.
CODES_BMI2_ATTR static void codes_unit_bmi2(const uint64_t P[2], const uint64_t N[2], uint8_t out[32]) {
    uint64_t bytes[4] = { 0, 0, 0, 0 };
    for (int g = 0; g < 4; ++g) {
        const uint64_t p = (P[g / 2] >> (32 * (g % 2))) & 0xffffffffu;
        const uint64_t n = (N[g / 2] >> (32 * (g % 2))) & 0xffffffffu;
        const uint64_t c =
            _pdep_u64(~p & 0xffffffffu, 0x5555555555555555ull) | _pdep_u64(p & ~n & 0xffffffffu, 0xaaaaaaaaaaaaaaaaull);
        const uint64_t place = 0x0303030303030303ull << (2 * g);
        for (int q = 0; q < 4; ++q) {
            bytes[q] |= _pdep_u64((c >> (16 * q)) & 0xffffu, place);
        }
    }
    memcpy(out, bytes, sizeof bytes);
}

CODES_BMI2_ATTR static void codes_decode_bmi2(const bitcos_rows * w, int64_t i0, int64_t i1, uint8_t * codes,
                                              size_t codes_row_bytes) {
    const int64_t nu  = (w->k + QK_BITCOS - 1) / QK_BITCOS;
    const int64_t nby = (nu + 1) / 2;
    const size_t  cut = (size_t) (w->k % QK_BITCOS) / 8;
    for (int64_t i = i0; i < i1; ++i) {
        const uint8_t * row    = w->bits + (size_t) i * w->row_bytes;
        uint8_t *       out    = codes + (size_t) i * codes_row_bytes;
        uint64_t        cursor = w->sign_pos[i];
        for (int64_t u = 0; u < nu; ++u) {
            uint64_t P[2], N[2];
            if (cut && u == nu - 1) {
                codes_unit_bitmap(w, row, u, nu, P);
            } else {
                memcpy(P, row + (size_t) u * w->unit_bytes, sizeof P);
            }
            for (int h = 0; h < 2; ++h) {
                N[h] = _pdep_u64(bitcos_sign_window(w->pool, cursor), P[h]);
                cursor += (uint64_t) __builtin_popcountll(P[h]);
            }
            codes_unit_bmi2(P, N, out + (size_t) u * (BITCOS_CODES_BLOCK_BYTES / 2));
        }
        if (nu < 2 * nby) { // the last block's missing half: t = 0
            memset(out + (size_t) nu * (BITCOS_CODES_BLOCK_BYTES / 2), 0x55, BITCOS_CODES_BLOCK_BYTES / 2);
        }
    }
}

int bitcos_codes_decode_fast(void) {
#    if defined(CODES_BMI2_BUILT)
    return 1;
#    else
    static int fast = -1;
    if (fast < 0) {
        __builtin_cpu_init();
        fast = __builtin_cpu_supports("bmi2") && !__builtin_cpu_is("znver1") && !__builtin_cpu_is("znver2");
    }
    return fast;
#    endif
}

void bitcos_codes_decode(const bitcos_rows * w, int64_t i0, int64_t i1, uint8_t * codes, size_t codes_row_bytes) {
    if (bitcos_codes_decode_fast()) {
        codes_decode_bmi2(w, i0, i1, codes, codes_row_bytes);
    } else {
        bitcos_codes_decode_generic(w, i0, i1, codes, codes_row_bytes);
    }
}
#else
int bitcos_codes_decode_fast(void) {
    return 0;
}

void bitcos_codes_decode(const bitcos_rows * w, int64_t i0, int64_t i1, uint8_t * codes, size_t codes_row_bytes) {
    bitcos_codes_decode_generic(w, i0, i1, codes, codes_row_bytes);
}
#endif

void bitcos_codes_copy_block_scales(const bitcos_rows * w, int64_t i0, int64_t i1, uint8_t * scales) {
    const int64_t nu = (w->k + QK_BITCOS - 1) / QK_BITCOS;
    const int64_t ns = nu >> w->block_scale_shift;
    for (int64_t i = i0; i < i1; ++i) {
        for (int64_t s = 0; s < ns; ++s) {
            memcpy(scales + (size_t) (i * ns + s) * 2,
                   w->block_scale + (size_t) i * w->scale_row_bytes + (size_t) s * w->scale_stride, 2);
        }
    }
}

bitcos_codes_rows bitcos_codes_rows_of(const bitcos_rows * w, const uint8_t * codes, size_t codes_row_bytes) {
    const bitcos_codes_rows r = { w->k,           codes,           codes_row_bytes,    w->row_scale,
                                  w->block_scale, w->scale_stride, w->scale_row_bytes, w->block_scale_shift };
    return r;
}

void bitcos_codes_mm_generic(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                             float * const * dst) {
    const int64_t nu  = (w->k + QK_BITCOS - 1) / QK_BITCOS;
    const int64_t nby = (nu + 1) / 2;
    for (int64_t i = 0; i < nr; ++i) {
        const uint8_t * row = w->codes + (size_t) i * w->row_bytes;
        for (int64_t c = 0; c < nc; ++c) {
            float acc[8] = { 0 };
            for (int64_t b = 0; b < nby; ++b) {
                const bitcos_q8_K * yb      = &y[c][b];
                const uint8_t *     blk     = row + (size_t) b * BITCOS_CODES_BLOCK_BYTES;
                const int           halves  = (2 * b + 1 < nu) ? 2 : 1;
                int32_t             L[2][8] = { { 0 } };
                uint16_t            e[2]    = { 0, 0 };
                for (int h = 0; h < halves; ++h) {
                    if (w->row_scale == NULL) {
                        memcpy(&e[h],
                               w->block_scale + (size_t) i * w->scale_row_bytes +
                                   (size_t) ((2 * b + h) >> w->block_scale_shift) * w->scale_stride,
                               sizeof e[h]);
                    }
                    for (int jj = 0; jj < QK_BITCOS; ++jj) {
                        const int     j = QK_BITCOS * h + jj;
                        const int32_t u = (blk[codes_byte(j)] >> codes_shift(j)) & 3;
                        L[h][(jj % 32) / 4] += u * (int32_t) yb->qs[j];
                    }
                    for (int l = 4 * h; l < 4 * h + 4; ++l) {
                        L[h][l] -= (int32_t) yb->bsums[2 * l] + (int32_t) yb->bsums[2 * l + 1];
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
