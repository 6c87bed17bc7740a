// ggml-bitcos-cuda: BITCOS MUL_MAT / MUL_MAT_ID in ggml-cuda (see ggml-bitcos-cuda.cuh).
//
// The weight and its companion sit in the same device buffer (the loader creates the companion in the
// weight's context) and were validated on the host by the loader before upload, so the kernels read the
// companion's header, row index and sign pool unchecked. Both paths run on activations quantized per 32 values
// (bitcos_cuda_quantize_q8_kernel into a ggml-cuda pool temporary). Mat-vec (up to BITCOS_CUDA_MMQ_MIN_COLS
// columns): blocks of 16 warps, 8 lanes a row (4 rows a warp: BITCOS_CUDA_GEMV_LANES), one block per
// multiprocessor, each block's 64 KiB decode tables filled once for the many rows it takes. More columns: the
// batched tensor-core kernel (bitcos-cuda-mmq.cuh; compute capability 7.2+, older devices keep the mat-vec, 8
// columns per launch).
#include "ggml-bitcos-cuda.cuh"

#include "../ggml-bitcos-gpu.h"
#include "bitcos-cuda-mmq.cuh"
#include "ggml-bitcos.h"

#include <algorithm>

// static as well as in the anonymous namespace: nvcc gives that namespace a name in the host code it hands
// to the host compiler, which then asks for a previous declaration (ggml-cuda's -Wmissing-declarations)
namespace {

// mat-vec: 8 lanes a row, 4 rows a warp (BITCOS_CUDA_GEMV_LANES), 16 warps a block (the kernel's launch bound,
// 512 threads: its 8-column instance needs 96 registers), one block per multiprocessor: each block fills 64 KiB of
// tables (~512 cycles of the shared-store path), so more blocks per multiprocessor would cost more fills than their
// latency hiding wins on decode-sized matrices (unmeasured: a lent GPU's `bench gpu` decides)
constexpr int WARPS_PER_BLOCK    = 16;
constexpr int GEMV_BLOCKS_PER_SM = 1;

// A failed launch aborts with CUDA's reason, as ggml-cuda's CUDA_CHECK does.
static void check_launch() {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        GGML_ABORT("BITCOS CUDA kernel launch failed: %s", cudaGetErrorString(err));
    }
}

static void check_cuda(cudaError_t err, const char * what) {
    if (err != cudaSuccess) {
        GGML_ABORT("BITCOS CUDA %s failed: %s", what, cudaGetErrorString(err));
    }
}

// The batched kernel's int8 wmma needs compute capability 7.2+ (queried per call: two attribute reads).
static bool mmq_available() {
    int dev = 0, major = 0, minor = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cudaDeviceGetAttribute");
    return major * 10 + minor >= 72;
}

// The mat-vec's launch shape on the current device: the table copies its blocks can hold (32: 64 KiB of
// dynamic shared memory, raised once per kernel instance and device; else 8: 16 KiB) and how many blocks run
// at once (grid.x beyond that would only fill the tables again).
struct gemv_shape {
    int copies;
    int resident_blocks;
};

template <auto KERNEL> void raise_smem_limit(int bytes) {
    static bool raised[64] = {}; // per kernel instance and device (ggml-cuda: at most 16)
    int         dev        = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    if (dev >= 64 || !raised[dev]) {
        check_cuda(cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                   "cudaFuncSetAttribute");
        if (dev < 64)
            raised[dev] = true;
    }
}

static gemv_shape gemv_launch_shape() {
    int dev = 0, optin = 0, per_sm = 0, n_sm = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev),
               "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    const int copies  = optin >= bitcos_cuda_gemv_lut<32>::BYTES ? 32 : 8;
    const int bytes   = copies == 32 ? bitcos_cuda_gemv_lut<32>::BYTES : bitcos_cuda_gemv_lut<8>::BYTES;
    const int by_smem = per_sm / (bytes + 1024); // the runtime reserves 1 KiB per block
    return { copies, std::max(1, n_sm * std::max(1, std::min(by_smem, GEMV_BLOCKS_PER_SM))) };
}

// Quantizes ncols columns of k fp32 (column c at x + (c / cols_per_batch) * batch_stride + (c % cols_per_batch) *
// col_stride, strides in floats) per 32 into xq (int8, k_pad per column) and xd (fp32, k_pad / 32 per column).
static void quantize_columns(cudaStream_t stream, const float * x, int8_t * xq, float * xd, int64_t k, int64_t ncols,
                             int64_t col_stride, int64_t cols_per_batch, int64_t batch_stride) {
    const int64_t nqb = bitcos_cuda_mmq_k_pad(k) / BITCOS_CUDA_MMQ_QBLOCK;
    bitcos_cuda_quantize_q8_kernel<<<dim3((unsigned) ncols, (unsigned) ((nqb + 3) / 4)), dim3(BITCOS_CUDA_WARP, 4), 0,
                                     stream>>>(x, xq, xd, k, bitcos_cuda_mmq_k_pad(k), col_stride, cols_per_batch,
                                               batch_stride);
}

// Rows one block of the mat-vec takes at once (BITCOS_CUDA_GEMV_LANES lanes a row, several rows a warp).
constexpr int64_t GEMV_ROWS_PER_BLOCK = (int64_t) WARPS_PER_BLOCK * (BITCOS_CUDA_WARP / BITCOS_CUDA_GEMV_LANES);

// The mat-vec over quantized columns c0 .. c0 + nc of one batch (nc <= BITCOS_CUDA_MAX_COLS).
template <int COPIES>
void launch_gemv(cudaStream_t stream, int nc, const gemv_shape & shape, const uint8_t * w, const uint8_t * c,
                 const int8_t * xq, const float * xd, float * d, int64_t row0, int64_t rows, int64_t k_pad,
                 int64_t d1) {
    constexpr int bytes = bitcos_cuda_gemv_lut<COPIES>::BYTES, LANES = BITCOS_CUDA_GEMV_LANES;
    const int64_t row_blocks = (rows + GEMV_ROWS_PER_BLOCK - 1) / GEMV_ROWS_PER_BLOCK;
    const dim3    grid((unsigned) std::min<int64_t>(row_blocks, shape.resident_blocks)),
        block(BITCOS_CUDA_WARP, WARPS_PER_BLOCK);
    bitcos_cuda_with_cols(nc, [&](auto ncv) {
        constexpr int NC = decltype(ncv)::value;
        raise_smem_limit<bitcos_cuda_mul_mat_vec_kernel<NC, COPIES, LANES>>(bytes);
        bitcos_cuda_mul_mat_vec_kernel<NC, COPIES, LANES>
            <<<grid, block, bytes, stream>>>(w, c, xq, xd, d, row0, rows, k_pad, d1);
    });
}

// The temporary of a call: the activations' per-32 scales (fp32, nqb per column), then their int8 codes (k_pad
// per column: 16-byte aligned, as the kernels' uint4 loads need, since nqb % 4 == 0, k_pad % 128 == 0 and the
// hook's pool allocation is at least 128-byte aligned), then MUL_MAT_ID's batched path's per-expert counts and
// slot lists. The hooks allocate it from ggml-cuda's pool (ggml-bitcos-cuda.cuh).
static size_t quantized_bytes(int64_t k, int64_t ncols) {
    const int64_t k_pad = bitcos_cuda_mmq_k_pad(k);
    return (size_t) (ncols * (k_pad / BITCOS_CUDA_MMQ_QBLOCK) * (int64_t) sizeof(float) + ncols * k_pad);
}

// MUL_MAT_ID's path: the batched kernel above 8 tokens (compute capability 7.2+, experts within grid.z).
static bool mul_mat_id_batched(const ggml_tensor * dst) {
    const int64_t n_experts = dst->src[0]->ne[2], n_tokens = dst->src[2]->ne[1];
    return n_tokens > BITCOS_CUDA_MMQ_MIN_COLS && n_experts <= 65535 && mmq_available();
}

static size_t mul_mat_id_tmp_bytes(const ggml_tensor * dst, bool batched) {
    const ggml_tensor * src0      = dst->src[0];
    const int64_t       n_experts = src0->ne[2], cap = dst->src[2]->ne[0] * dst->src[2]->ne[1];
    return quantized_bytes(src0->ne[0], dst->src[1]->ne[1] * dst->src[2]->ne[1]) +
           (batched ? (size_t) (n_experts + n_experts * cap) * sizeof(int32_t) : 0);
}

static void check_tmp(const void * tmp, size_t tmp_bytes, size_t need) {
    GGML_ASSERT(tmp_bytes >= need && "BITCOS CUDA temporary smaller than its tmp_bytes");
    GGML_ASSERT(reinterpret_cast<uintptr_t>(tmp) % 16 == 0 && "BITCOS CUDA temporary not 16-byte aligned");
}

} // namespace

size_t ggml_cuda_bitcos_mul_mat_tmp_bytes(const ggml_tensor * src0, const ggml_tensor * src1) {
    return quantized_bytes(src0->ne[0], src1->ne[1]); // one batch at a time, the space reused
}

size_t ggml_cuda_bitcos_mul_mat_id_tmp_bytes(const ggml_tensor * dst) {
    return mul_mat_id_tmp_bytes(dst, mul_mat_id_batched(dst));
}

bool ggml_cuda_bitcos_supports_op(const ggml_tensor * op) {
    if (!ggml_bitcos_gpu_supports_op(op)) {
        return false;
    }
    if (op->op == GGML_OP_MUL_MAT) { // grid limits: the batched kernel's column tiles in y
        return (op->src[1]->ne[1] + BITCOS_CUDA_MMQ_BN - 1) / BITCOS_CUDA_MMQ_BN <= 65535;
    }
    if (op->op == GGML_OP_MUL_MAT_ID) { // one grid row per (token, slot)
        return op->src[2]->ne[0] * op->src[2]->ne[1] <= 65535;
    }
    return true;
}

void ggml_cuda_bitcos_mul_mat(cudaStream_t stream, const ggml_tensor * src0, const ggml_tensor * src1,
                              ggml_tensor * dst, void * tmp, size_t tmp_bytes) {
    const ggml_bitcos_gpu_mul_mat m    = ggml_bitcos_gpu_mul_mat_of(src0, src1, dst);
    const uint8_t *               w    = m.weight.w;
    const uint8_t *               c    = m.weight.c;
    const int64_t                 rows = m.rows, ne11 = m.ne11, d1 = m.d1;

    // activations quantized per 32 into the hook's temporary (one batch at a time, reused; the stream orders
    // the reuse), then the batched tensor-core kernel (more than 8 columns) or the mat-vec
    const int64_t    k = src0->ne[0], k_pad = bitcos_cuda_mmq_k_pad(k), nqb = k_pad / BITCOS_CUDA_MMQ_QBLOCK;
    const bool       batched = ne11 > BITCOS_CUDA_MMQ_MIN_COLS && mmq_available();
    const gemv_shape shape   = batched ? gemv_shape{} : gemv_launch_shape();
    check_tmp(tmp, tmp_bytes, ggml_cuda_bitcos_mul_mat_tmp_bytes(src0, src1));
    float *    xd = static_cast<float *>(tmp);
    int8_t *   xq = reinterpret_cast<int8_t *>(xd + ne11 * nqb); // 16-byte aligned: nqb % 4 == 0
    const dim3 mgrid((unsigned) ((rows + BITCOS_CUDA_MMQ_BM - 1) / BITCOS_CUDA_MMQ_BM),
                     (unsigned) ((ne11 + BITCOS_CUDA_MMQ_BN - 1) / BITCOS_CUDA_MMQ_BN));
    for (int64_t i13 = 0; i13 < m.ne13; ++i13) {
        for (int64_t i12 = 0; i12 < m.ne12; ++i12) {
            const int64_t row0 = m.batch_row0(i12, i13); // global first row
            float *       dd   = m.d + i13 * m.d3 + i12 * m.d2;
            quantize_columns(stream, m.x + i13 * m.s13 + i12 * m.s12, xq, xd, k, ne11, m.s11, ne11, 0);
            if (batched) {
                bitcos_cuda_mul_mat_mmq_kernel<<<mgrid, BITCOS_CUDA_MMQ_THREADS, 0, stream>>>(
                    w, c, xq, xd, dd, row0, rows, ne11, k_pad, d1, bitcos_cuda_mmq_ids{});
                continue;
            }
            for (int64_t c0 = 0; c0 < ne11; c0 += BITCOS_CUDA_MAX_COLS) {
                const int nc = (int) std::min<int64_t>(BITCOS_CUDA_MAX_COLS, ne11 - c0);
                if (shape.copies == 32) {
                    launch_gemv<32>(stream, nc, shape, w, c, xq + c0 * k_pad, xd + c0 * nqb, dd + c0 * d1, row0, rows,
                                    k_pad, d1);
                } else {
                    launch_gemv<8>(stream, nc, shape, w, c, xq + c0 * k_pad, xd + c0 * nqb, dd + c0 * d1, row0, rows,
                                   k_pad, d1);
                }
            }
        }
    }
    check_launch();
}

void ggml_cuda_bitcos_mul_mat_id(cudaStream_t stream, ggml_tensor * dst, void * tmp, size_t tmp_bytes) {
    const ggml_tensor *          src0   = dst->src[0];
    const ggml_tensor *          src1   = dst->src[1];
    const ggml_tensor *          ids    = dst->src[2];
    const ggml_bitcos_gpu_weight weight = ggml_bitcos_gpu_weight_of(src0);
    GGML_ASSERT(weight.row0 == 0);
    const uint8_t * w = weight.w;
    const uint8_t * c = weight.c;

    const int64_t rows = src0->ne[1], n_experts = src0->ne[2];
    const int64_t n_used = ids->ne[0], n_tokens = ids->ne[1];

    // every activation column quantized per 32 (both paths); then either the (token, slot) pairs grouped by
    // expert on the device and one tile-kernel launch over (row tiles, slot tiles, experts), or the mat-vec
    // over (rows, slots)
    const bool    batched = mul_mat_id_batched(dst);
    const int64_t k = src0->ne[0], k_pad = bitcos_cuda_mmq_k_pad(k), nqb = k_pad / BITCOS_CUDA_MMQ_QBLOCK;
    const int64_t ne11 = src1->ne[1], n_cols = ne11 * n_tokens, cap = n_used * n_tokens;
    check_tmp(tmp, tmp_bytes, mul_mat_id_tmp_bytes(dst, batched));
    float *  xd = static_cast<float *>(tmp);
    int8_t * xq = reinterpret_cast<int8_t *>(xd + n_cols * nqb);
    quantize_columns(stream, static_cast<const float *>(src1->data), xq, xd, k, n_cols,
                     src1->nb[1] / (int64_t) sizeof(float), ne11, src1->nb[2] / (int64_t) sizeof(float));
    if (batched) {
        int32_t * counts = reinterpret_cast<int32_t *>(xq + n_cols * k_pad);
        int32_t * slots  = counts + n_experts;
        check_cuda(cudaMemsetAsync(counts, 0, n_experts * sizeof(int32_t), stream), "cudaMemsetAsync");
        bitcos_cuda_mmq_id_slots_kernel<<<(unsigned) ((cap + 255) / 256), 256, 0, stream>>>(
            static_cast<const int32_t *>(ids->data), slots, counts, n_experts, n_used, n_tokens,
            ids->nb[1] / (int64_t) sizeof(int32_t), cap);
        const bitcos_cuda_mmq_ids map = { slots,
                                          counts,
                                          cap,
                                          n_used,
                                          ne11,
                                          (int64_t) (dst->nb[1] / sizeof(float)),
                                          (int64_t) (dst->nb[2] / sizeof(float)) };
        const dim3                mgrid((unsigned) ((rows + BITCOS_CUDA_MMQ_BM - 1) / BITCOS_CUDA_MMQ_BM),
                                        (unsigned) ((cap + BITCOS_CUDA_MMQ_BN - 1) / BITCOS_CUDA_MMQ_BN), (unsigned) n_experts);
        bitcos_cuda_mul_mat_mmq_kernel<<<mgrid, BITCOS_CUDA_MMQ_THREADS, 0, stream>>>(
            w, c, xq, xd, static_cast<float *>(dst->data), 0, rows, 0, k_pad, 0, map);
    } else {
        // a block per (row block, slot); row blocks capped so that all slots' blocks fit on the device at once
        const gemv_shape shape      = gemv_launch_shape();
        const int64_t    row_blocks = (rows + GEMV_ROWS_PER_BLOCK - 1) / GEMV_ROWS_PER_BLOCK;
        const dim3 grid((unsigned) std::max<int64_t>(1, std::min<int64_t>(row_blocks, shape.resident_blocks / cap)),
                        (unsigned) cap);
        const dim3 block(BITCOS_CUDA_WARP, WARPS_PER_BLOCK);
        auto       run = [&](auto copies) {
            constexpr int COPIES = decltype(copies)::value, lut_bytes = bitcos_cuda_gemv_lut<COPIES>::BYTES;
            constexpr int LANES = BITCOS_CUDA_GEMV_LANES;
            raise_smem_limit<bitcos_cuda_mul_mat_vec_id_kernel<COPIES, LANES>>(lut_bytes);
            bitcos_cuda_mul_mat_vec_id_kernel<COPIES, LANES><<<grid, block, lut_bytes, stream>>>(
                w, c, xq, xd, static_cast<const int32_t *>(ids->data), static_cast<float *>(dst->data), rows, n_experts,
                n_used, ids->nb[1] / (int64_t) sizeof(int32_t), ne11, k_pad, dst->nb[1] / (int64_t) sizeof(float),
                dst->nb[2] / (int64_t) sizeof(float));
        };
        if (shape.copies == 32) {
            run(std::integral_constant<int, 32>{});
        } else {
            run(std::integral_constant<int, 8>{});
        }
    }
    check_launch();
}
