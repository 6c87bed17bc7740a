// BITCOS matrix kernels: the contract every implementation (generic C, AVX2, AVX-512, ...) shares, the
// descriptor they read and the kernel table through which every caller finds them.
//
// Format: docs/FORMAT.md, its C layout bitcos-format.h. This header has no ggml dependency, so the same
// kernels compile into ggml-cpu (via patches/) and into the standalone harness libbitcos_kernels (root
// CMakeLists.txt) used by the Python tests and `ggml-bitcos bench kernels`. Design: docs/KERNELS.md; adding
// a kernel: docs/CONTRIBUTING.md.
//
// Arithmetic contract v2 ("TQ2_0-exact"; every implementation must produce bit-identical results).
//
// Why this shape: llama.cpp's x86 TQ2_0 and TQ1_0 kernels (AVX2) accumulate each 256-block in eight
// int32 lanes, scale them with one fused multiply-add per lane and reduce the lanes at the end. A BITCOS
// tensor converted from TQ2_0 must give *bit-identical* logits, because any 1-ulp difference in a matmul
// output can flip a Q8_K rounding of the next layer's input and change the generated text. So BITCOS
// reproduces that arithmetic exactly, using the same lane partition of the integer sums.
//
//   For row i, activation column c and Q8_K block b (256 weights, j = position in the block, t = ternary
//   code, q = activation; positions past k have t = 0 and q = 0), for lane l in 0..7 and half h in {0,1}:
//     L[h][l] = sum_{j in half h, j % 32 in [4l, 4l+4)} (t_j + 1) * q_j  -  sum_{j in half h, j / 32 == l} q_j
//   (exact int32; the second sum is bsums[2l] + bsums[2l+1] restricted to half h, i.e. non-zero only for
//   h == l / 4; L[0][l] + L[1][l] is exactly TQ2_0's lane l.)
//     Block scales (v1 G128, v2 B128 / B256), fp16 e0, e1 = the scales of 128-weight units 2b and 2b+1 (for B256
//     both are the 256-block's one scale; e1 = e0 and L[1] = 0 when the block has one half):
//         if bits(e0) == bits(e1):  D = y.d * fp32(e0);  acc[l] = FMA(float(L[0][l] + L[1][l]), D, acc[l])
//         else:  D0 = y.d * fp32(e0); D1 = y.d * fp32(e1);
//                acc[l] = FMA(float(L[0][l]), D0, acc[l]);  acc[l] = FMA(float(L[1][l]), D1, acc[l])
//     Row scales (v1 PT, v2 MATRIX: the matrix's scale; v2 ROW: the row's), fp32 s:
//         D = y.d * s;  acc[l] = FMA(float(L[0][l] + L[1][l]), D, acc[l])
//   acc[] starts at +0.0f; blocks in increasing b; then
//     dst[c][i] = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
//   FMA(a, b, c) is a fused multiply-add when BITCOS_FMA is 1, else (a * b) rounded, then + c rounded.
//   BITCOS_FMA follows what GCC does to TQ2_0's `_mm256_add_ps(_mm256_mul_ps(x, d), acc)`: it contracts
//   it to vfmadd when the target has FMA (GCC's default -ffp-contract=fast); clang does not.
//   Every other operation is one IEEE fp32 operation in the order written; kernel files are compiled
//   with -ffp-contract=off so that only the explicit FMA is fused. Inputs are finite.
//
// Result: on x86-64 builds with AVX2 by GCC (GGML_NATIVE and the AVX2/AVX-512 CPU variants), a BITCOS
// matmul equals llama.cpp's TQ2_0 matmul bit for bit whenever the BITCOS tensor holds the same ternary
// codes and scales (every tensor `ggml-bitcos convert` made from TQ2_0/TQ1_0, and PT tensors whose scale
// is the TQ2_0 block scale; B256 and MATRIX tensors made from TQ2_0). Elsewhere it equals TQ2_0 up to float
// summation order.
//
// Activations are ggml block_q8_K (256 per block). A row length k that is not a multiple of 256 (any multiple
// of 32 in version 2) uses ceil(k/256) blocks; the caller quantizes a zero-padded copy, so the padding
// contributes nothing (its q are 0, and its t are 0 because the kernels treat bitmap bits past k as absent).
#pragma once

#include "bitcos-format.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

// Overridable (-DBITCOS_FMA=0/1) so the harness can test both forms in every implementation.
#ifndef BITCOS_FMA
#    if defined(__FMA__) && !defined(__clang__)
#        define BITCOS_FMA 1
#    else
#        define BITCOS_FMA 0
#    endif
#endif

// Weights per Q8_K activation block (ggml's QK_K): the contract's unit of integer accumulation.
#define BITCOS_Q8K_BLOCK 256

// Same layout as ggml's block_q8_K (ggml-common.h); checked by a static_assert where both are visible.
typedef struct {
    float   d;
    int8_t  qs[BITCOS_Q8K_BLOCK];
    int16_t bsums[BITCOS_Q8K_BLOCK / 16];
} bitcos_q8_K;

// A run of consecutive rows of one BITCOS matrix, in any variant (the kernels never look at the variant: the
// caller describes where bitmaps and scales are).
//
// A row is cut into nu = ceil(k/128) units of 128 weights; unit u's bitmap is 16 bytes at
// bits + i*row_bytes + u*unit_bytes. When k % 128 != 0 (version 2 MATRIX / ROW, k a multiple of 32) the
// last unit holds only k % 128 weights and only the first (k % 128) / 8 bytes of its bitmap belong to the
// row: the kernels read no further (the next bytes are the next row's, or past the tensor's end) and
// treat the missing bits as absent weights.
typedef struct {
    int64_t          k;          // weights per row, a positive multiple of 32
    const uint8_t *  bits;       // bitmap of unit 0 of the first row of the run
    size_t           unit_bytes; // bytes from one unit's bitmap to the next: 18 (v1 G128), 16 (every other variant)
    size_t           row_bytes;  // bytes from one row's bitmap to the next
    const uint8_t *  pool;       // sign pool of the tensor (bit 0 = first sign); >= 64 zero bytes of tail
    const uint64_t * sign_pos;   // sign_pos[i]: pool bit of the first sign of row i of this run
    // Scales, one of two forms. Row scales: row_scale != NULL, row i's fp32 scale is row_scale[i] (PT and
    // MATRIX repeat the matrix's scale). Block scales (row_scale == NULL; k % (128 << block_scale_shift) == 0):
    // the fp16 scale of unit u of row i is at block_scale + i*scale_row_bytes + (u >> block_scale_shift)*scale_stride.
    const float *    row_scale;
    const uint8_t *  block_scale;       // v1 G128: bits + 16 (d inside each block); B128 / B256: the companion's scales
    size_t           scale_stride;      // v1 G128: 18; B128 / B256: 2
    size_t           scale_row_bytes;   // v1 G128: row_bytes; B128 / B256: 2 * k / (128 << block_scale_shift)
    int              block_scale_shift; // 0: a scale per 128 weights (G128, B128); 1: per 256 (B256)
} bitcos_rows;

// dst[c][i] = sum_k W[i][k] * Y[c][k] for 0 <= i < nr, 0 <= c < nc, with the arithmetic contract above.
// y[c] points at the ceil(k/256) Q8_K blocks of column c; dst[c] at the nr floats of column c.
typedef void (*bitcos_mm_fn)(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                             float * const * dst);

// ---- The 2-bit codes form (docs/KERNELS.md §8) ----
//
// A BITCOS weight decoded once (at load) into 2 bits per weight, for CPUs where the decode, not memory, bounds
// the BITCOS kernels. Per row, ceil(k/256) blocks of BITCOS_CODES_BLOCK_BYTES bytes: TQ2_0's code bytes without
// its per-block d. Weight j of a block has the code u = t + 1 in {0, 1, 2} at bits 2 * ((j % 128) / 32) of byte
// 32 * (j / 128) + j % 32; weights past k (the rest of the last block) have u = 1 (t = 0). The scales stay as
// the BITCOS tensor has them, in the same fields as bitcos_rows (row scales, or fp16 block scales at
// block_scale + i*scale_row_bytes + (u >> block_scale_shift)*scale_stride for 128-weight unit u); v1 G128's
// scales, inside its bitmap blocks, can be copied out with bitcos_codes_copy_block_scales.
#define BITCOS_CODES_BLOCK_BYTES (BITCOS_Q8K_BLOCK / 4)

// Bytes of one row of codes of k weights.
static inline size_t bitcos_codes_row_bytes(int64_t k) {
    return (size_t) ((k + BITCOS_Q8K_BLOCK - 1) / BITCOS_Q8K_BLOCK) * BITCOS_CODES_BLOCK_BYTES;
}

// A run of consecutive rows of one weight in the codes form.
typedef struct {
    int64_t         k;         // weights per row, a positive multiple of 32
    const uint8_t * codes;     // codes of the first row of the run
    size_t          row_bytes; // bytes from one row's codes to the next (>= bitcos_codes_row_bytes(k))
    // Scales, as in bitcos_rows.
    const float *   row_scale;
    const uint8_t * block_scale;
    size_t          scale_stride;
    size_t          scale_row_bytes;
    int             block_scale_shift;
} bitcos_codes_rows;

// dst[c][i] = W[i] . Y[c] from the codes form, with the arithmetic contract above: bit-identical to the BITCOS
// kernels on the weight the codes were decoded from. The 32-weight activation sums come from the Q8_K bsums.
typedef void (*bitcos_codes_mm_fn)(const bitcos_codes_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                                   float * const * dst);

// Decodes rows i0 .. i1 (exclusive) of the run w into codes: row i at codes + i * codes_row_bytes
// (>= bitcos_codes_row_bytes(w->k)). Rows are independent, so callers split a weight into row ranges, one per
// thread. bitcos_codes_decode takes the fastest path this CPU has (x86: BMI2 pdep when the build's flags or
// the CPU at run time have it, not on Zen 1/2 where pdep is microcoded); bitcos_codes_decode_generic is the
// plain C reference of it.
void bitcos_codes_decode(const bitcos_rows * w, int64_t i0, int64_t i1, uint8_t * codes, size_t codes_row_bytes);
void bitcos_codes_decode_generic(const bitcos_rows * w, int64_t i0, int64_t i1, uint8_t * codes,
                                 size_t codes_row_bytes);
// 1 when bitcos_codes_decode runs the BMI2 path here.
int  bitcos_codes_decode_fast(void);
// Copies the fp16 block scales of rows i0 .. i1 of w (row_scale NULL) into scales, ceil(k/128) >> shift of them
// per row back to back (row i at scales + i * 2 * (ceil(k/128) >> shift)): the layout of a B128 / B256 companion,
// for v1 G128 whose scales sit in the bitmap blocks the codes form replaces.
void bitcos_codes_copy_block_scales(const bitcos_rows * w, int64_t i0, int64_t i1, uint8_t * scales);
// The codes descriptor of w's rows decoded into codes (row stride codes_row_bytes), with w's scales.
bitcos_codes_rows bitcos_codes_rows_of(const bitcos_rows * w, const uint8_t * codes, size_t codes_row_bytes);

// ---- The kernel table (bitcos-kernels-table.c) ----
//
// Every caller (the ggml-cpu glue, the harness library and through it the Python tests and benchmarks, the
// kernel fuzzer) finds the kernels here, by index or name, and runs them through bitcos_kernel_mm.
typedef struct {
    const char * name;                    // the manifest's name: "generic", "portable", "avx2", ...
    int (*available)(void);               // 1 when this CPU can run it
    int (*covers)(const bitcos_rows * w); // 1 when its own paths handle w; NULL: every descriptor
    bitcos_mm_fn       mm;                // the kernel; w must be one `covers` accepts
    bitcos_codes_mm_fn codes_mm;          // its codes-form kernel (every codes descriptor); NULL: none
} bitcos_kernel;

// Receives the one line a kernel's fallback reports (bitcos_kernel_mm); NULL: stderr.
typedef void (*bitcos_log_fn)(const char * text);

// The kernels compiled into this build, in order of preference (the generic one first, always index 0).
int                   bitcos_kernel_count(void);
const bitcos_kernel * bitcos_kernel_at(int i);
const bitcos_kernel * bitcos_kernel_named(const char * name); // NULL when not compiled in
// The last available entry: the best kernel this CPU can run (or the available entry $GGML_BITCOS_KERNEL names).
const bitcos_kernel * bitcos_kernel_best(void);
// bitcos_kernel_best(); the first call in the process also gives log (NULL: stderr) the line
// "BITCOS CPU kernel: <name>\n" (the ggml glue's line at the first BITCOS mat-mul, i.e. at model load's warm-up).
const bitcos_kernel * bitcos_kernel_best_told(bitcos_log_fn log);

// Runs k->mm, or bitcos_mm_portable when k does not cover w; the first time that happens for k, log gets one
// line naming the kernel, the layout and the kernel that runs instead (reported once per kernel and process).
// k must be an entry of the table (bitcos_kernel_at, bitcos_kernel_named, bitcos_kernel_best).
void bitcos_kernel_mm(const bitcos_kernel * k, const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y,
                      int64_t nc, float * const * dst, bitcos_log_fn log);

// Runs k->codes_mm, or the portable codes kernel when k has none.
void bitcos_kernel_codes_mm(const bitcos_kernel * k, const bitcos_codes_rows * w, int64_t nr,
                            const bitcos_q8_K * const * y, int64_t nc, float * const * dst);

// ---- The kernels ----
//
// Which kernels this translation unit's target flags build (BITCOS_BUILD_*) and their entry points come from the
// kernel manifest, bitcos-kernels.json, through the header written from it. Each kernel file defines its entry
// points only under its macro, and the table lists them under the same one, so a build that compiles every file
// with one set of flags (ggml-cpu, one CPU variant) gets exactly the kernels those flags allow. The harness
// library and the kernel fuzzer compile each kernel file with its own flags instead and define
// BITCOS_KERNELS_PER_FILE_FLAGS for the table, which then lists all of the architecture's kernels and asks the CPU
// at run time (bitcos-kernels-table.c).
#include "bitcos-kernels-list.h"

// The contract's FMA(a, b, c) in the form BITCOS_FMA selects (the plain C kernels; SIMD kernels use intrinsics).
static inline float bitcos_contract_fma(float a, float b, float c) {
#if BITCOS_FMA
    return fmaf(a, b, c);
#else
    const float p = a * b;
    return p + c;
#endif
}

// The 64 sign bits from pool bit `pos`, the first in bit 0. The pool carries >= 64 zero bytes of tail
// (FORMAT.md §4.4), so the 9-byte window never leaves the tensor.
static inline uint64_t bitcos_sign_window(const uint8_t * pool, uint64_t pos) {
    uint64_t lo;
    memcpy(&lo, pool + (pos >> 3), 8);
    const unsigned sh = (unsigned) (pos & 7);
    return sh ? (lo >> sh) | ((uint64_t) pool[(pos >> 3) + 8] << (64 - sh)) : lo;
}

// IEEE binary16 -> binary32, exact (no ggml dependency).
static inline float bitcos_fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t) (h & 0x8000u) << 16;
    uint32_t       exp  = (h >> 10) & 0x1fu;
    uint32_t       mant = h & 0x3ffu;
    uint32_t       bits;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {
        // subnormal: normalise
        exp = 113u;
        while ((mant & 0x400u) == 0) {
            mant <<= 1;
            exp--;
        }
        mant &= 0x3ffu;
        bits = sign | (exp << 23) | (mant << 13);
    }
    union {
        uint32_t u;
        float    f;
    } v = { bits };
    return v.f;
}

// The contract's scale step for one Q8_K block, in the reference kernels: L[h][l] the block's exact lane sums per
// half, yd the block's activation scale, row_scale the row's fp32 scale (NULL: block scales e[0], e[1], fp16 bits,
// e[1] == e[0] when the block has one half).
static inline void bitcos_contract_block(float acc[8], const int32_t L[2][8], float yd, const float * row_scale,
                                         const uint16_t e[2]) {
    if (row_scale != NULL || e[0] == e[1]) {
        const float D = yd * (row_scale != NULL ? *row_scale : bitcos_fp16_to_fp32(e[0]));
        for (int l = 0; l < 8; ++l) {
            acc[l] = bitcos_contract_fma((float) (L[0][l] + L[1][l]), D, acc[l]);
        }
    } else {
        const float D0 = yd * bitcos_fp16_to_fp32(e[0]);
        const float D1 = yd * bitcos_fp16_to_fp32(e[1]);
        for (int l = 0; l < 8; ++l) {
            acc[l] = bitcos_contract_fma((float) L[0][l], D0, acc[l]);
            acc[l] = bitcos_contract_fma((float) L[1][l], D1, acc[l]);
        }
    }
}

// The contract's final sum of the eight lanes.
static inline float bitcos_contract_reduce(const float acc[8]) {
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

#ifdef __cplusplus
}
#endif
