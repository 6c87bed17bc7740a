// BITCOS decode for CUDA: device code shared by ggml-cuda's glue (ggml-bitcos-cuda.cu) and the standalone
// test program (tests/cuda/test-bitcos-cuda.cu). No ggml dependency; format offsets from bitcos-format.h.
//
// Design (why):
//  * A warp per row, lanes per 32-bit bitmap word. The weight blocks are row-major, so the 32 lanes of a
//    warp read 32 consecutive bitmap words of one row (128 B, coalesced for PT; G128's 18-byte blocks are
//    read as 16-bit halves), i.e. 1024 weights per warp step.
//  * Sign offsets by a warp prefix sum. Each lane's first sign is the row cursor plus the exclusive
//    prefix sum of the popcounts of the lanes before it (__shfl_up), so no lane walks another's bits; the
//    cursor advances by the warp total (__shfl).
//  * pdep by table, as on Xe2 (bitcos-paper §II-D): a 4-weight group's codes are a function of its presence
//    nibble and the next 4 sign bits; a 256-entry table in shared memory returns the 4 codes as packed int8
//    (one 32-bit load), and the lane's 32-bit sign window (a funnel shift of two pool words) shifts by the
//    nibble's popcount. 8 lookups per 32 weights.
//  * fp32 activations and accumulation, per 128-weight block scaled by G128's d, by the PT matrix scale at
//    the end; a warp reduction (__shfl_xor) per row. Up to BITCOS_CUDA_MAX_COLS columns share one decode.
// Instruction count, not bandwidth, limits such a decode on big GPUs (../shared BRIEF §5: ~2.7 instructions
// per weight for a similar table decode vs ~1.4 affordable on an H200); this kernel is written for
// correctness and coalescing first and is measured by scripts/gpu_session.sh where a GPU is lent.
#pragma once

#include "bitcos-format.h"

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#define BITCOS_CUDA_LUT_ENTRIES 256
#define BITCOS_CUDA_MAX_COLS    8
#define BITCOS_CUDA_WARP        32

// Entry `key` (presence nibble m | next 4 sign bits s << 4): code i of the group = 0 when weight i is absent,
// else -1 / +1 by bit rank_i(m) of s (1 = negative); packed as 4 int8 in a uint32, weight i in byte i.
__device__ __forceinline__ uint32_t bitcos_cuda_lut_entry(int key) {
    const int m = key & 15, s = key >> 4;
    uint32_t e = 0;
    for (int i = 0; i < 4; ++i) {
        if ((m >> i) & 1) {
            const int rank = __popc(m & ((1 << i) - 1));
            const uint8_t c = ((s >> rank) & 1) ? (uint8_t) 0xFF : (uint8_t) 0x01;
            e |= (uint32_t) c << (8 * i);
        }
    }
    return e;
}

// Fills the block's table and waits for the whole block: every kernel's prologue (all threads must call it).
__device__ __forceinline__ void bitcos_cuda_lut_fill(uint32_t * lut) {
    for (int e = threadIdx.x + threadIdx.y * blockDim.x; e < BITCOS_CUDA_LUT_ENTRIES; e += blockDim.x * blockDim.y) {
        lut[e] = bitcos_cuda_lut_entry(e);
    }
    __syncthreads();
}

__device__ __forceinline__ uint64_t bitcos_cuda_u64(const uint8_t * c, uint64_t off) {
    return *reinterpret_cast<const uint64_t *>(c + off);
}

// Pool bit of the first sign of global row r (FORMAT.md §4.3).
__device__ __forceinline__ uint64_t bitcos_cuda_row_sign_pos(const uint8_t * comp, uint64_t r) {
    const unsigned g = comp[BITCOS_HDR_ROW_GROUP_LOG2];
    const uint64_t base = bitcos_cuda_u64(comp, bitcos_cuda_u64(comp, BITCOS_HDR_ROW_BASE_OFFSET) + 8 * (r >> g));
    const uint16_t delta = *reinterpret_cast<const uint16_t *>(comp + bitcos_cuda_u64(comp, BITCOS_HDR_ROW_DELTA_OFFSET) + 2 * r);
    return base + delta;
}

// PT: the matrix scale of global row r; G128: 1 (its scales are per block).
__device__ __forceinline__ float bitcos_cuda_row_scale(const uint8_t * comp, uint64_t r) {
    if (comp[BITCOS_HDR_VARIANT] != BITCOS_VARIANT_PT) {
        return 1.0f;
    }
    const uint64_t per_mat = bitcos_cuda_u64(comp, BITCOS_HDR_N_ROWS) / bitcos_cuda_u64(comp, BITCOS_HDR_N_MATS);
    return reinterpret_cast<const float *>(comp + bitcos_cuda_u64(comp, BITCOS_HDR_SCALES_OFFSET))[r / per_mat];
}

// 32 sign bits from pool bit pos (two aligned 32-bit pool words, funnel-shifted; the pool's zero tail, FORMAT.md
// §4.4, covers the second word of the last signs).
__device__ __forceinline__ uint32_t bitcos_cuda_sign_window(const uint32_t * pool, uint64_t pos) {
    const uint32_t lo = pool[pos >> 5], hi = pool[(pos >> 5) + 1];
    return __funnelshift_r(lo, hi, (uint32_t) (pos & 31));
}

// Bitmap word q (0..3, weights 32q .. 32q+31) of 128-weight block b of a row, for either variant (G128 blocks
// are 18 bytes, so 16-bit reads).
__device__ __forceinline__ uint32_t bitcos_cuda_bitmap_word(const uint8_t * row, uint64_t b, int q, int g128) {
    if (!g128) {
        return reinterpret_cast<const uint32_t *>(row + b * sizeof(block_bitcos_pt))[q];
    }
    const uint16_t * h = reinterpret_cast<const uint16_t *>(row + b * sizeof(block_bitcos_g128) + 4 * q);
    return (uint32_t) h[0] | (uint32_t) h[1] << 16;
}

__device__ __forceinline__ float bitcos_cuda_g128_scale(const uint8_t * row, uint64_t b) {
    const uint16_t d = *reinterpret_cast<const uint16_t *>(row + b * sizeof(block_bitcos_g128) + offsetof(block_bitcos_g128, d));
    return __half2float(__ushort_as_half(d));
}

// Warp-cooperative: out[c] (valid in every lane) = sum_k W[r][k] * x[c * x_stride + k] for c < nc, global row
// r of a BITCOS tensor (blocks: the weight data, comp: its companion).
__device__ __forceinline__ void bitcos_cuda_row_dot(const uint8_t * blocks, const uint8_t * comp, uint64_t r,
                                                    const float * x, uint64_t x_stride, int nc,
                                                    const uint32_t * lut, float * out) {
    const int      lane = threadIdx.x & (BITCOS_CUDA_WARP - 1);
    const int      g128 = comp[BITCOS_HDR_VARIANT] == BITCOS_VARIANT_G128;
    const uint64_t k    = bitcos_cuda_u64(comp, BITCOS_HDR_N_COLS);
    const uint64_t nb   = k / QK_BITCOS;
    const size_t   bb   = g128 ? sizeof(block_bitcos_g128) : sizeof(block_bitcos_pt);
    const uint8_t  * row  = blocks + r * nb * bb;
    const uint32_t * pool = reinterpret_cast<const uint32_t *>(comp + bitcos_cuda_u64(comp, BITCOS_HDR_POOL_OFFSET));
    uint64_t cursor = bitcos_cuda_row_sign_pos(comp, r);
    float acc[BITCOS_CUDA_MAX_COLS];
    for (int c = 0; c < BITCOS_CUDA_MAX_COLS; ++c) acc[c] = 0.0f;
    const uint64_t n_words = k / 32;
    for (uint64_t w0 = 0; w0 < n_words; w0 += BITCOS_CUDA_WARP) {
        const uint64_t w = w0 + lane;                 // this lane's 32-weight word of the row
        const bool active = w < n_words;
        const uint32_t word = active ? bitcos_cuda_bitmap_word(row, w / 4, (int) (w % 4), g128) : 0u;
        const int n = __popc(word);
        int before = n;                               // inclusive warp prefix sum of the popcounts
        for (int o = 1; o < BITCOS_CUDA_WARP; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, before, o);
            if (lane >= o) before += v;
        }
        const int total = __shfl_sync(0xffffffffu, before, BITCOS_CUDA_WARP - 1);
        if (active) {
            uint32_t s = bitcos_cuda_sign_window(pool, cursor + (uint64_t) (before - n));
            float part[BITCOS_CUDA_MAX_COLS];
            for (int c = 0; c < BITCOS_CUDA_MAX_COLS; ++c) part[c] = 0.0f;
            for (int j = 0; j < 8; ++j) {
                const uint32_t m = (word >> (4 * j)) & 15u;
                const uint32_t e = lut[m | (s & 15u) << 4];
                s >>= __popc(m);
                const float c0 = (float) (int8_t) (e & 0xFF), c1 = (float) (int8_t) ((e >> 8) & 0xFF);
                const float c2 = (float) (int8_t) ((e >> 16) & 0xFF), c3 = (float) (int8_t) (e >> 24);
                for (int c = 0; c < BITCOS_CUDA_MAX_COLS; ++c) {
                    if (c < nc) {
                        const float * xg = x + c * x_stride + w * 32 + 4 * j;
                        part[c] += c0 * xg[0] + c1 * xg[1] + c2 * xg[2] + c3 * xg[3];
                    }
                }
            }
            const float d = g128 ? bitcos_cuda_g128_scale(row, w / 4) : 1.0f;
            for (int c = 0; c < BITCOS_CUDA_MAX_COLS; ++c) acc[c] += part[c] * d;
        }
        cursor += (uint64_t) total;
    }
    const float scale = bitcos_cuda_row_scale(comp, r);
    for (int c = 0; c < BITCOS_CUDA_MAX_COLS; ++c) {
        float v = acc[c];
        for (int o = BITCOS_CUDA_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        out[c] = v * scale;
    }
}

// Kernel bodies (templates so that ggml-cuda's glue and the test program instantiate the same code).
// Mat-vec / small batch: grid (ceil(rows / warps per block), column groups * batches), block (32, warps):
// warp y of block x decodes global row row0 + blockIdx.x * blockDim.y + y for columns c0 .. c0 + nc.
static __global__ void bitcos_cuda_mul_mat_kernel(const uint8_t * __restrict__ blocks, const uint8_t * __restrict__ comp,
                                           const float * __restrict__ x, float * __restrict__ dst,
                                           int64_t row0, int64_t rows, int64_t k, int64_t ncols,
                                           int64_t x_col_stride, int64_t dst_col_stride) {
    __shared__ uint32_t lut[BITCOS_CUDA_LUT_ENTRIES];
    bitcos_cuda_lut_fill(lut);
    const int64_t r = (int64_t) blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= rows) {
        return;
    }
    const int64_t c0 = (int64_t) blockIdx.y * BITCOS_CUDA_MAX_COLS;
    const int nc = (int) (ncols - c0 < BITCOS_CUDA_MAX_COLS ? ncols - c0 : BITCOS_CUDA_MAX_COLS);
    float out[BITCOS_CUDA_MAX_COLS];
    bitcos_cuda_row_dot(blocks, comp, (uint64_t) (row0 + r), x + c0 * x_col_stride, (uint64_t) x_col_stride, nc, lut, out);
    if ((threadIdx.x & (BITCOS_CUDA_WARP - 1)) == 0) {
        for (int c = 0; c < nc; ++c) dst[(c0 + c) * dst_col_stride + r] = out[c];
    }
    (void) k;
}

// MUL_MAT_ID: grid (ceil(rows / warps per block), n_used * n_tokens); slot (t, u) reads its expert id on the
// device (ids: n_used int32 per token, ids_stride int32 between tokens), activation column u % ne11 of token
// t, and writes dst[t * dst_tok_stride + u * dst_slot_stride + r]. Out-of-range ids are skipped, never read.
static __global__ void bitcos_cuda_mul_mat_id_kernel(const uint8_t * __restrict__ blocks, const uint8_t * __restrict__ comp,
                                                     const float * __restrict__ x, const int32_t * __restrict__ ids,
                                                     float * __restrict__ dst, int64_t rows, int64_t n_experts,
                                                     int64_t n_used, int64_t ids_stride, int64_t ne11,
                                                     int64_t x_col_stride, int64_t x_tok_stride,
                                                     int64_t dst_slot_stride, int64_t dst_tok_stride) {
    __shared__ uint32_t lut[BITCOS_CUDA_LUT_ENTRIES];
    bitcos_cuda_lut_fill(lut);
    const int64_t r = (int64_t) blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= rows) {
        return;
    }
    const int64_t u = (int64_t) blockIdx.y % n_used, t = (int64_t) blockIdx.y / n_used;
    const int32_t e = ids[t * ids_stride + u];
    if (e < 0 || e >= n_experts) {
        return;
    }
    float out[BITCOS_CUDA_MAX_COLS];
    bitcos_cuda_row_dot(blocks, comp, (uint64_t) (e * rows + r), x + t * x_tok_stride + (u % ne11) * x_col_stride, 0,
                        1, lut, out);
    if ((threadIdx.x & (BITCOS_CUDA_WARP - 1)) == 0) {
        dst[t * dst_tok_stride + u * dst_slot_stride + r] = out[0];
    }
}
