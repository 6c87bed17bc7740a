// A plain 2-bit ternary GEMV (TQ2_0-like codes, dp4a), written as the yardstick for the BITCOS mat-vec's
// instruction count (dev/cuda_sass_count.py target `tq2`; docs/GPU.md §3). Not part of ggml: the
// layout is the simplest one a tuned 2-bit kernel would use, so its count is a floor for 2-bit decoding.
//
// Weights: code q = t + 1 in {0, 1, 2}, 2 bits each; a row is K / 64 uint4 units of 64 weights; unit g holds
// 32-weight blocks 2g (.x, .y) and 2g + 1 (.z, .w); in word h of a block, bits 8b + 2i, 8b + 2i + 1 are the
// code of weight 16h + 4i + b, so (word >> 2i) & 0x03030303 is the dp4a operand of activation dword 4h + i.
// One fp16 scale per 256 weights. Activations: int8 per 32 with an fp32 scale and the block's integer sum
// (q8_1-like), so sum t x = dp4a(q, x) - sum x. Warp per row, lane per 64-weight unit.
#include <cuda_fp16.h>

#include <cstdint>

static __device__ __forceinline__ int tq2_dp4a(uint32_t a, uint32_t b, int c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    return __dp4a((int) a, (int) b, c);
#else
    for (int i = 0; i < 4; ++i)
        c += (int) (int8_t) (a >> 8 * i) * (int) (int8_t) (b >> 8 * i);
    return c;
#endif
}

// dst[r] = sum_k W[r][k] x[k], r < rows; k % 256 == 0. Grid ceil(rows / blockDim.y), block (32, warps).
__global__ void tq2_reference_gemv(const uint4 * __restrict__ codes, const __half * __restrict__ wscale,
                                   const uint4 * __restrict__ xq, const float * __restrict__ xd,
                                   const int * __restrict__ xsum, float * __restrict__ dst, int rows, int k) {
    const int lane = threadIdx.x & 31;
    const int r    = blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= rows) {
        return;
    }
    const int      units = k / 64;
    const uint4 *  rc    = codes + (int64_t) r * units;
    const __half * rd    = wscale + (int64_t) r * (k / 256);
    float          acc   = 0.0f;
    for (int g = lane; g < units; g += 32) {
        const uint4 q  = rc[g];
        const uint4 x0 = xq[4 * g], x1 = xq[4 * g + 1], x2 = xq[4 * g + 2], x3 = xq[4 * g + 3];
        int         s0 = 0, s1 = 0;
        s0            = tq2_dp4a(q.x & 0x03030303u, x0.x, s0);
        s0            = tq2_dp4a((q.x >> 2) & 0x03030303u, x0.y, s0);
        s0            = tq2_dp4a((q.x >> 4) & 0x03030303u, x0.z, s0);
        s0            = tq2_dp4a((q.x >> 6) & 0x03030303u, x0.w, s0);
        s0            = tq2_dp4a(q.y & 0x03030303u, x1.x, s0);
        s0            = tq2_dp4a((q.y >> 2) & 0x03030303u, x1.y, s0);
        s0            = tq2_dp4a((q.y >> 4) & 0x03030303u, x1.z, s0);
        s0            = tq2_dp4a((q.y >> 6) & 0x03030303u, x1.w, s0);
        s1            = tq2_dp4a(q.z & 0x03030303u, x2.x, s1);
        s1            = tq2_dp4a((q.z >> 2) & 0x03030303u, x2.y, s1);
        s1            = tq2_dp4a((q.z >> 4) & 0x03030303u, x2.z, s1);
        s1            = tq2_dp4a((q.z >> 6) & 0x03030303u, x2.w, s1);
        s1            = tq2_dp4a(q.w & 0x03030303u, x3.x, s1);
        s1            = tq2_dp4a((q.w >> 2) & 0x03030303u, x3.y, s1);
        s1            = tq2_dp4a((q.w >> 4) & 0x03030303u, x3.z, s1);
        s1            = tq2_dp4a((q.w >> 6) & 0x03030303u, x3.w, s1);
        const float d = __half2float(rd[g / 4]);
        acc += (float) (s0 - xsum[2 * g]) * (d * xd[2 * g]) + (float) (s1 - xsum[2 * g + 1]) * (d * xd[2 * g + 1]);
    }
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) {
        dst[r] = acc;
    }
}
