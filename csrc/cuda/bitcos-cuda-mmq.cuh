// BITCOS batched path for CUDA (prompt processing) and the activation quantization both paths read: device code
// shared by ggml-cuda's glue (ggml-bitcos-cuda.cu) and the standalone test program (tests/cuda/test-bitcos-cuda.cu),
// on the table decode, layout reads and sign cursor of bitcos-cuda.cuh (design: its header comment).
#pragma once

#include "bitcos-cuda.cuh"

// ---------------------------------------------------------------------------------------------------------
// Batched path (src1 with more than BITCOS_CUDA_MMQ_MIN_COLS columns: prompt processing), in the manner of
// ggml-cuda's MMQ for its quant types: the activations are quantized per 32 values to int8 with an fp32 scale
// (bitcos_cuda_quantize_q8_kernel, q8_1-like without the sum), a thread block decodes a 32-row x 128-weight tile
// of W into shared memory as exact int8 codes {-1, 0, 1} (the same table decode and sign cursor as the mat-vec;
// every variant, partial last 128-weight units and rows past the end read as zero codes), and the 32 x 64 output
// tile is accumulated on tensor cores (nvcuda::wmma, int8 16x16x16 -> int32, sm_72+).
//
// Arithmetic (it is not bit-identical to the CPU, whose activations stay fp32):
//   x_k ~ q_k * d_b, d_b = fl(amax_b / 127), q_k = rint(x_k / d_b) in [-127, 127] per 32-value block b of a
//   column (d_b = 0, q = 0 for an all-zero block);
//   y[r][c] = s_r * sum_b fl32( (float) P_rcb * (w_rb * d_cb) ),  P_rcb = sum_{k in b} code_rk * q_ck (int32,
//   exact: |P| <= 32 * 127), w_rb the fp16 scale of the weights of block b (G128 / B128 / B256; 1 otherwise),
//   s_r the row's scale (PT / MATRIX / ROW; 1 otherwise); blocks are summed in fp32 in k order.
// Error against the exact sum_k W_rk x_ck (W_rk = s_r w_rb code_rk): rounding x to q_k d_b moves each value
// by at most d_b / 2 ~ amax_b / 254 (plus an fp32 ulp of x_k), so
//   |err| <= sum_b (sum_{k in b} |W_rk|) * amax_cb * (1/254) + (K/32 + 4) * 2^-23 * sum_b (sum_{k in b} |W_rk|) *
//   amax_cb
// (the second term: the fp32 products and the K/32-term fp32 sum). With M = sum_b (sum_{k in b} |W_rk|) *
// amax_cb >= sum_k |W_rk x_ck| this is about M * 2^-8, the int8 rounding of a q8_1 activation; the device
// test (tests/test_cuda.py) checks exactly this bound against an fp64 product.
#include <mma.h>

#define BITCOS_CUDA_MMQ_MIN_COLS 8   // more columns than this: the batched path (ggml-bitcos-cuda.cu)
#define BITCOS_CUDA_MMQ_BM       32  // W rows per block tile
#define BITCOS_CUDA_MMQ_BN       64  // activation columns per block tile
#define BITCOS_CUDA_MMQ_BK       128 // weights per K step (4 bitmap words per row)
#define BITCOS_CUDA_MMQ_THREADS  128 // 4 warps; BM * BK / 32 == 128: one bitmap word per thread per step
#define BITCOS_CUDA_MMQ_QBLOCK   32  // activation quantization block

// The quantized activations' K, padded to the K step (the pad holds zero codes and zero scales).
static __host__ __device__ __forceinline__ int64_t bitcos_cuda_mmq_k_pad(int64_t k) {
    return (k + BITCOS_CUDA_MMQ_BK - 1) / BITCOS_CUDA_MMQ_BK * BITCOS_CUDA_MMQ_BK;
}

// x (ncols columns of k fp32: column c at x + (c / cols_per_batch) * x_batch_stride + (c % cols_per_batch) *
// x_col_stride) -> q (int8, column c at q + c * k_pad) and d (fp32, column c's k_pad / 32 scales at d + c *
// (k_pad / 32)). Grid (ncols, ceil(k_pad / 32 / 4)), block (32, 4): warp y of block (c, by) quantizes the
// 32-block b = by * 4 + y of column c; values past k are 0.
static __global__ void bitcos_cuda_quantize_q8_kernel(const float * __restrict__ x, int8_t * __restrict__ q,
                                                      float * __restrict__ d, int64_t k, int64_t k_pad,
                                                      int64_t x_col_stride, int64_t cols_per_batch,
                                                      int64_t x_batch_stride) {
    const int     lane = threadIdx.x & (BITCOS_CUDA_WARP - 1);
    const int64_t c    = blockIdx.x;
    const float * xc   = x + (c / cols_per_batch) * x_batch_stride + (c % cols_per_batch) * x_col_stride;
    const int64_t b    = (int64_t) blockIdx.y * blockDim.y + threadIdx.y;
    const int64_t nb   = k_pad / BITCOS_CUDA_MMQ_QBLOCK;
    if (b >= nb) {
        return; // whole warps only: b is uniform in a warp
    }
    const int64_t i    = b * BITCOS_CUDA_MMQ_QBLOCK + lane;
    const float   v    = i < k ? xc[i] : 0.0f;
    float         amax = fabsf(v);
    for (int o = BITCOS_CUDA_WARP / 2; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    // __fdiv_rn: IEEE divisions also under ggml-cuda's -use_fast_math, so the glue quantizes exactly as the
    // device test (built without it) and its numpy mirror do
    const float dq   = __fdiv_rn(amax, 127.0f);
    int         qi   = amax > 0.0f ? __float2int_rn(__fdiv_rn(v, dq)) : 0;
    qi               = qi > 127 ? 127 : (qi < -127 ? -127 : qi);
    q[c * k_pad + i] = (int8_t) qi;
    if (lane == 0) {
        d[c * nb + b] = dq;
    }
}

// MUL_MAT_ID's columns for the batched kernel: expert e's slots (t * n_used + u for token t, slot u) at
// slots[e * slot_cap ..], counts[e] of them (bitcos_cuda_mmq_id_slots_kernel); slot (t, u) reads quantized
// column t * ne11 + u % ne11 and writes dst + t * dst_tok_stride + u * dst_slot_stride. slots == nullptr: plain
// MUL_MAT (tile column c is quantized column c, written at dst + c * dst_col_stride).
struct bitcos_cuda_mmq_ids {
    const int32_t * slots;
    const int32_t * counts;
    int64_t         slot_cap, n_used, ne11, dst_slot_stride, dst_tok_stride;
};

// Groups MUL_MAT_ID's (token, slot) pairs by expert: one thread per pair, counts zeroed before; out-of-range
// ids are skipped (never read as rows). The order within an expert is arbitrary, which changes nothing: every
// output column's arithmetic is independent of the others in its tile.
static __global__ void bitcos_cuda_mmq_id_slots_kernel(const int32_t * __restrict__ ids, int32_t * __restrict__ slots,
                                                       int32_t * __restrict__ counts, int64_t n_experts, int64_t n_used,
                                                       int64_t n_tokens, int64_t ids_stride, int64_t slot_cap) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_used * n_tokens) {
        return;
    }
    const int64_t t = i / n_used, u = i % n_used;
    const int32_t e = ids[t * ids_stride + u];
    if (e < 0 || e >= n_experts) {
        return;
    }
    const int pos             = atomicAdd(&counts[e], 1);
    slots[e * slot_cap + pos] = (int32_t) i;
}

// dst[c * dst_col_stride + r] = row r (global row row0 + r) of W times column c of the quantized activations
// (q, d as bitcos_cuda_quantize_q8_kernel wrote them, k_pad = bitcos_cuda_mmq_k_pad(K)), r < rows, c < ncols.
// Grid (ceil(rows / BM), ceil(ncols / BN)), block (BITCOS_CUDA_MMQ_THREADS). Needs sm_72+ (int8 wmma); on an
// older device the host glue keeps the mat-vec kernel (this body traps there).
// MUL_MAT_ID (ids.slots set): grid (ceil(rows / BM), ceil(ids.slot_cap / BN), n_experts); block z takes expert
// z (global rows row0 + z * rows ..) and its ids.counts[z] slots as the tile columns (bitcos_cuda_mmq_ids);
// blocks past the count exit at once.
//
// Shared tiles are k-slabs of 16 (tile[slab][row or column][16 bytes]) so that every wmma fragment pointer is
// 32-byte aligned (wmma's load_matrix_sync requirement) with ldm = 16: A (W codes, row-major 16 x 16 per
// fragment) at As + slab * BM * 16 + row * 16, B (activations, col-major: element (k, n) at n * 16 + k) at
// Bs + slab * BN * 16 + column * 16.
// Roles. Decode: thread t takes row t / 4 of the tile and word t % 4 of the K step (weights 32 (t % 4) ..
// +31), i.e. slabs 2 (t % 4) and 2 (t % 4) + 1; the 4 threads of a row are 4 consecutive lanes, whose width-4
// prefix sum of popcounts gives each its sign offset; each keeps the row's sign cursor in a register across
// K steps (all four add the same total). MMA: warp w computes rows (w / 2) * 16 .. +15 and columns (w % 2) * 32
// .. +31 (two 16 x 16 fragments), per 32-weight block two k16 wmma steps into a fresh int32 fragment, stored
// to the warp's 16 x 16 scratch and scaled in fp32 into 2 x 8 per-lane accumulators (element e = lane + 32 j of
// a fragment: row e / 16, column e % 16).
static __global__ void __launch_bounds__(BITCOS_CUDA_MMQ_THREADS)
bitcos_cuda_mul_mat_mmq_kernel(const uint8_t * __restrict__ blocks, const uint8_t * __restrict__ comp,
                               const int8_t * __restrict__ q, const float * __restrict__ d, float * __restrict__ dst,
                               int64_t row0, int64_t rows, int64_t ncols, int64_t k_pad, int64_t dst_col_stride,
                               bitcos_cuda_mmq_ids ids) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 720
    (void) blocks;
    (void) comp;
    (void) q;
    (void) d;
    (void) dst;
    (void) row0;
    (void) rows;
    (void) ncols;
    (void) k_pad;
    (void) dst_col_stride;
    (void) ids;
    __trap();
#else
    using namespace nvcuda;
    constexpr int       BM = BITCOS_CUDA_MMQ_BM, BN = BITCOS_CUDA_MMQ_BN, BK = BITCOS_CUDA_MMQ_BK;
    constexpr int       WORDS = BK / QK_BITCOS_BITMAP; // 4 bitmap words (and activation blocks) per K step
    constexpr int       SLABS = BK / 16;
    __shared__ uint32_t lut[BITCOS_CUDA_LUT_ENTRIES];
    __shared__ __align__(128) signed char As[SLABS * BM * 16];
    __shared__ __align__(128) signed char Bs[SLABS * BN * 16];
    __shared__ __align__(128) int Cs[BITCOS_CUDA_MMQ_THREADS / BITCOS_CUDA_WARP][16 * 16];
    __shared__ float              Ws[BM][WORDS];   // weight scale of (tile row, word of the step)
    __shared__ float              Xs[BN][WORDS];   // activation scale of (tile column, block of the step)
    const int32_t *               slots = nullptr; // MUL_MAT_ID: this block's expert's slots
    if (ids.slots != nullptr) {
        const int64_t e = blockIdx.z;
        ncols           = ids.counts[e];
        row0 += e * rows;
        slots = ids.slots + e * ids.slot_cap;
        if ((int64_t) blockIdx.y * BITCOS_CUDA_MMQ_BN >= ncols) {
            return; // uniform in the block, before its first barrier
        }
    }
    // quantized activation column and output column offset of tile column c (< ncols)
    auto q_col = [&](int64_t c) -> int64_t {
        if (slots == nullptr)
            return c;
        const int64_t sl = slots[c];
        return (sl / ids.n_used) * ids.ne11 + (sl % ids.n_used) % ids.ne11;
    };
    auto dst_col = [&](int64_t c) -> int64_t {
        if (slots == nullptr)
            return c * dst_col_stride;
        const int64_t sl = slots[c];
        return (sl / ids.n_used) * ids.dst_tok_stride + (sl % ids.n_used) * ids.dst_slot_stride;
    };
    bitcos_cuda_lut_fill(lut);

    const int                tid = threadIdx.x, lane = tid & (BITCOS_CUDA_WARP - 1), warp = tid / BITCOS_CUDA_WARP;
    const bitcos_cuda_layout l = bitcos_cuda_read_layout(comp);
    const uint32_t * pool = reinterpret_cast<const uint32_t *>(comp + bitcos_cuda_u64(comp, BITCOS_HDR_POOL_OFFSET));
    const int64_t    r0 = (int64_t) blockIdx.x * BM, c0 = (int64_t) blockIdx.y * BN;
    const int64_t    nqb = k_pad / BITCOS_CUDA_MMQ_QBLOCK;

    // decode role
    const int       dr = tid / WORDS, dw = tid % WORDS;
    const bool      row_ok = r0 + dr < rows;
    const uint64_t  gr     = (uint64_t) (row0 + r0 + dr);
    const uint8_t * row    = blocks + (row_ok ? gr * l.row_bytes : 0);
    uint64_t        cursor = row_ok ? bitcos_cuda_row_sign_pos(comp, gr) : 0;

    // mma role
    const int wm = warp / 2, wn = warp % 2;
    float     acc[2][8];
    for (int f = 0; f < 2; ++f)
        for (int j = 0; j < 8; ++j)
            acc[f][j] = 0.0f;

    const uint64_t n_words = l.n_words;
    for (uint64_t w0 = 0; w0 < n_words; w0 += WORDS) {
        // W tile: one bitmap word per thread, codes into slabs 2 dw, 2 dw + 1 of row dr
        const uint64_t w      = w0 + dw;
        const bool     active = row_ok && w < n_words;
        const uint32_t word   = active ? bitcos_cuda_bitmap_word(l, row, w) : 0u;
        const int      n      = __popc(word);
        int            before = n; // inclusive prefix sum over the row's 4 lanes
        for (int o = 1; o < WORDS; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, before, o, WORDS);
            if (dw >= o)
                before += v;
        }
        const int total = __shfl_sync(0xffffffffu, before, WORDS - 1, WORDS);
        uint32_t  codes[8];
        float     ws = 0.0f;
        if (active) {
            uint32_t s = bitcos_cuda_sign_window(pool, cursor + (uint64_t) (before - n));
            for (int j = 0; j < 8; ++j) {
                const uint32_t m = (word >> (4 * j)) & 15u;
                codes[j]         = lut[m | (s & 15u) << 4];
                s >>= __popc(m);
            }
            ws = bitcos_cuda_word_scale(l, row, gr, w);
        } else {
            for (int j = 0; j < 8; ++j)
                codes[j] = 0u;
        }
        cursor += (uint64_t) total;
        *reinterpret_cast<uint4 *>(As + (2 * dw) * BM * 16 + dr * 16) =
            make_uint4(codes[0], codes[1], codes[2], codes[3]);
        *reinterpret_cast<uint4 *>(As + (2 * dw + 1) * BM * 16 + dr * 16) =
            make_uint4(codes[4], codes[5], codes[6], codes[7]);
        Ws[dr][dw] = ws;

        // activation tile: BN columns x SLABS 16-byte pieces, and the step's scales
        const int64_t k0 = (int64_t) w0 * QK_BITCOS_BITMAP;
        for (int i = tid; i < BN * SLABS; i += BITCOS_CUDA_MMQ_THREADS) {
            const int     cn = i / SLABS, slab = i % SLABS;
            const int64_t c = c0 + cn;
            uint4         v = make_uint4(0u, 0u, 0u, 0u);
            if (c < ncols)
                v = *reinterpret_cast<const uint4 *>(q + q_col(c) * k_pad + k0 + 16 * slab);
            *reinterpret_cast<uint4 *>(Bs + slab * BN * 16 + cn * 16) = v;
        }
        for (int i = tid; i < BN * WORDS; i += BITCOS_CUDA_MMQ_THREADS) {
            const int     cn = i / WORDS, b = i % WORDS;
            const int64_t c = c0 + cn;
            Xs[cn][b]       = c < ncols ? d[q_col(c) * nqb + (int64_t) w0 + b] : 0.0f;
        }
        __syncthreads();

        for (int b = 0; b < WORDS; ++b) { // 32-weight block b of the step: slabs 2 b, 2 b + 1
            wmma::fragment<wmma::matrix_a, 16, 16, 16, signed char, wmma::row_major> a0, a1;
            wmma::load_matrix_sync(a0, As + (2 * b) * BM * 16 + wm * 16 * 16, 16);
            wmma::load_matrix_sync(a1, As + (2 * b + 1) * BM * 16 + wm * 16 * 16, 16);
            for (int f = 0; f < 2; ++f) {
                const int                                                                cn0 = wn * 32 + f * 16;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, signed char, wmma::col_major> b0, b1;
                wmma::load_matrix_sync(b0, Bs + (2 * b) * BN * 16 + cn0 * 16, 16);
                wmma::load_matrix_sync(b1, Bs + (2 * b + 1) * BN * 16 + cn0 * 16, 16);
                wmma::fragment<wmma::accumulator, 16, 16, 16, int> cf;
                wmma::fill_fragment(cf, 0);
                wmma::mma_sync(cf, a0, b0, cf);
                wmma::mma_sync(cf, a1, b1, cf);
                wmma::store_matrix_sync(Cs[warp], cf, 16, wmma::mem_row_major);
                __syncwarp();
                for (int j = 0; j < 8; ++j) {
                    const int e = lane + BITCOS_CUDA_WARP * j;
                    acc[f][j] += (float) Cs[warp][e] * (Ws[wm * 16 + e / 16][b] * Xs[cn0 + e % 16][b]);
                }
                __syncwarp();
            }
        }
        __syncthreads(); // the tiles are rewritten by the next step
    }

    for (int f = 0; f < 2; ++f) {
        for (int j = 0; j < 8; ++j) {
            const int     e = lane + BITCOS_CUDA_WARP * j;
            const int64_t r = r0 + wm * 16 + e / 16, c = c0 + wn * 32 + f * 16 + e % 16;
            if (r < rows && c < ncols) {
                dst[dst_col(c) + r] = acc[f][j] * bitcos_cuda_row_scale(l, (uint64_t) (row0 + r));
            }
        }
    }
#endif
}
