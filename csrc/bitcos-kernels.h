// BITCOS matrix kernels: the contract shared by the generic C, AVX2 and AVX-512 implementations.
//
// Format: docs/FORMAT.md. This header has no ggml dependency so the same kernels compile into ggml-cpu
// (via patches/) and into the standalone harness libbitcos_kernels (root CMakeLists.txt) used by the
// Python tests and `ggml-bitcos bench kernels`.
//
// Arithmetic contract (every implementation must produce bit-identical results):
//   For row i and activation column c, with nb = k/128 groups and t = ternary code of the weight:
//     isum[g] = sum_{j<128} t[i][128g+j] * y[c][(128g+j)/256].qs[(128g+j)%256]        (exact int32)
//   G128: acc = 0.0f
//         for b in 0 .. ceil(nb/2)-1:
//             part = (float)isum[2b] * fp32(d[2b])
//             if 2b+1 < nb: part = part + (float)isum[2b+1] * fp32(d[2b+1])
//             acc = acc + y[c][b].d * part
//         dst[c][i] = acc
//   PT:   acc = 0.0f
//         for b: acc = acc + y[c][b].d * (float)(isum[2b] + (2b+1 < nb ? isum[2b+1] : 0))
//         dst[c][i] = acc * scale
//   Every operation above is one IEEE fp32 operation in that order; files implementing it are compiled
//   with -ffp-contract=off so no compiler fuses a multiply and an add differently in different files.
//
// Activations are ggml block_q8_K (256 per block). A row length k that is an odd multiple of 128 uses
// ceil(k/256) blocks whose last half is ignored (the caller quantizes with zero padding).
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BITCOS_QK            128
#define BITCOS_VARIANT_G128  0
#define BITCOS_VARIANT_PT    1
#define BITCOS_BLOCK_BYTES_G128 18
#define BITCOS_BLOCK_BYTES_PT   16

// Same layout as ggml's block_q8_K (ggml-common.h); checked by a static_assert where both are visible.
typedef struct {
    float   d;
    int8_t  qs[256];
    int16_t bsums[16];
} bitcos_q8_K;

// A run of consecutive rows of one BITCOS matrix.
typedef struct {
    int              variant;    // BITCOS_VARIANT_G128 or BITCOS_VARIANT_PT
    int64_t          k;          // weights per row, a multiple of 128
    const uint8_t  * blocks;     // first block of the first row
    size_t           row_bytes;  // bytes from one row's blocks to the next (k/128 * block bytes)
    const uint8_t  * pool;       // sign pool of the tensor (bit 0 = first sign); >= 64 zero bytes of tail
    const uint64_t * sign_pos;   // sign_pos[i]: pool bit of the first sign of row i of this run
    float            scale;      // PT: the matrix's scale; ignored for G128
} bitcos_rows;

// dst[c][i] = sum_k W[i][k] * Y[c][k] for 0 <= i < nr, 0 <= c < nc, with the arithmetic contract above.
// y[c] points at the ceil(k/256) Q8_K blocks of column c; dst[c] at the nr floats of column c.
typedef void (*bitcos_mm_fn)(const bitcos_rows * w, int64_t nr,
                             const bitcos_q8_K * const * y, int64_t nc, float * const * dst);

void bitcos_mm_generic(const bitcos_rows * w, int64_t nr,
                       const bitcos_q8_K * const * y, int64_t nc, float * const * dst);
#if defined(__AVX2__)
void bitcos_mm_avx2(const bitcos_rows * w, int64_t nr,
                    const bitcos_q8_K * const * y, int64_t nc, float * const * dst);
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
void bitcos_mm_avx512(const bitcos_rows * w, int64_t nr,
                      const bitcos_q8_K * const * y, int64_t nc, float * const * dst);
#endif

// The best implementation this translation unit was compiled for.
bitcos_mm_fn bitcos_mm_best(void);
const char * bitcos_mm_best_name(void);

// IEEE binary16 -> binary32, exact (no ggml dependency).
static inline float bitcos_fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp  = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {
        // subnormal: normalise
        exp = 113u;
        while ((mant & 0x400u) == 0) { mant <<= 1; exp--; }
        mant &= 0x3ffu;
        bits = sign | (exp << 23) | (mant << 13);
    }
    union { uint32_t u; float f; } v = { bits };
    return v.f;
}

#ifdef __cplusplus
}
#endif
