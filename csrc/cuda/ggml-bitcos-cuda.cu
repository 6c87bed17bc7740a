// ggml-bitcos-cuda: BITCOS MUL_MAT / MUL_MAT_ID in ggml-cuda (see ggml-bitcos-cuda.cuh).
//
// The weight and its companion sit in the same device buffer (the loader creates the companion in the
// weight's context) and were validated on the host by the loader before upload, so the kernels read the
// companion's header, row index and sign pool unchecked. Mat-vec (up to BITCOS_CUDA_MMQ_MIN_COLS columns):
// blocks of 4 warps, one row per warp. More columns: the batched tensor-core kernel (bitcos-cuda.cuh) on
// activations quantized per 32 values (compute capability 7.2+; older devices keep the mat-vec).
#include "ggml-bitcos-cuda.cuh"

#include "bitcos-cuda.cuh"
#include "ggml-bitcos.h"

#include <algorithm>

// static as well as in the anonymous namespace: nvcc gives that namespace a name in the host code it hands
// to the host compiler, which then asks for a previous declaration (ggml-cuda's -Wmissing-declarations)
namespace {

constexpr int WARPS_PER_BLOCK = 4;

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

// The BITCOS weight a (view of a) tensor reads: its base tensor, and the base row of the view's first row.
static const ggml_tensor * bitcos_base(const ggml_tensor * w, int64_t * row0) {
    int64_t step[3];
    GGML_ASSERT(ggml_bitcos_row_map(w, row0, step));
    return w->view_src ? w->view_src : w;
}

}  // namespace

bool ggml_cuda_bitcos_supports_op(const ggml_tensor * op) {
    if (!ggml_bitcos_gpu_supports_op(op)) {
        return false;
    }
    if (op->op == GGML_OP_MUL_MAT) {          // grid limits: rows / 4 in x, column groups in y
        return (op->src[0]->ne[1] + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK <= INT32_MAX &&
               (op->src[1]->ne[1] + BITCOS_CUDA_MAX_COLS - 1) / BITCOS_CUDA_MAX_COLS <= 65535;
    }
    if (op->op == GGML_OP_MUL_MAT_ID) {       // one grid row per (token, slot)
        return op->src[2]->ne[0] * op->src[2]->ne[1] <= 65535;
    }
    return true;
}

void ggml_cuda_bitcos_mul_mat(cudaStream_t stream, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst) {
    int64_t view_row0 = 0;
    const ggml_tensor * base = bitcos_base(src0, &view_row0);
    const uint8_t * w = static_cast<const uint8_t *>(base->data);
    const uint8_t * c = static_cast<const uint8_t *>(ggml_bitcos_companion(src0)->data);
    const float   * x = static_cast<const float *>(src1->data);
    float         * d = static_cast<float *>(dst->data);

    const int64_t rows = src0->ne[1], ne02 = src0->ne[2], ne03 = src0->ne[3];
    const int64_t ne11 = src1->ne[1], ne12 = src1->ne[2], ne13 = src1->ne[3];
    const int64_t s11 = src1->nb[1] / sizeof(float), s12 = src1->nb[2] / sizeof(float), s13 = src1->nb[3] / sizeof(float);
    const int64_t d1 = dst->nb[1] / sizeof(float), d2 = dst->nb[2] / sizeof(float), d3 = dst->nb[3] / sizeof(float);
    const int64_t r2 = ne12 / ne02, r3 = ne13 / ne03;                 // broadcast of the weight's matrices

    if (ne11 > BITCOS_CUDA_MMQ_MIN_COLS && mmq_available()) {
        // batched: activations quantized per 32 into a stream-ordered temporary (one batch at a time, reused;
        // the stream orders the reuse), then the tensor-core tile kernel
        const int64_t k = src0->ne[0], k_pad = bitcos_cuda_mmq_k_pad(k), nqb = k_pad / BITCOS_CUDA_MMQ_QBLOCK;
        void * tmp = nullptr;
        check_cuda(cudaMallocAsync(&tmp, (size_t) (ne11 * nqb * sizeof(float) + ne11 * k_pad), stream), "cudaMallocAsync");
        float  * xd = static_cast<float *>(tmp);
        int8_t * xq = reinterpret_cast<int8_t *>(xd + ne11 * nqb);      // 16-byte aligned: nqb % 4 == 0
        const dim3 qgrid((unsigned) ne11, (unsigned) ((nqb + 3) / 4)), qblock(BITCOS_CUDA_WARP, 4);
        const dim3 mgrid((unsigned) ((rows + BITCOS_CUDA_MMQ_BM - 1) / BITCOS_CUDA_MMQ_BM),
                         (unsigned) ((ne11 + BITCOS_CUDA_MMQ_BN - 1) / BITCOS_CUDA_MMQ_BN));
        for (int64_t i13 = 0; i13 < ne13; ++i13) {
            for (int64_t i12 = 0; i12 < ne12; ++i12) {
                const int64_t row0 = view_row0 + ((i13 / r3) * ne02 + i12 / r2) * rows;
                bitcos_cuda_quantize_q8_kernel<<<qgrid, qblock, 0, stream>>>(x + i13 * s13 + i12 * s12, xq, xd, k,
                    k_pad, s11, ne11, 0);
                bitcos_cuda_mul_mat_mmq_kernel<<<mgrid, BITCOS_CUDA_MMQ_THREADS, 0, stream>>>(w, c, xq, xd,
                    d + i13 * d3 + i12 * d2, row0, rows, ne11, k_pad, d1, bitcos_cuda_mmq_ids{});
            }
        }
        check_launch();
        check_cuda(cudaFreeAsync(tmp, stream), "cudaFreeAsync");
        return;
    }

    const dim3 grid((unsigned) ((rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK),
                    (unsigned) ((ne11 + BITCOS_CUDA_MAX_COLS - 1) / BITCOS_CUDA_MAX_COLS));
    const dim3 block(BITCOS_CUDA_WARP, WARPS_PER_BLOCK);
    for (int64_t i13 = 0; i13 < ne13; ++i13) {
        for (int64_t i12 = 0; i12 < ne12; ++i12) {
            const int64_t row0 = view_row0 + ((i13 / r3) * ne02 + i12 / r2) * rows;     // global first row
            bitcos_cuda_mul_mat_kernel<<<grid, block, 0, stream>>>(w, c, x + i13 * s13 + i12 * s12,
                d + i13 * d3 + i12 * d2, row0, rows, src0->ne[0], ne11, s11, d1);
        }
    }
    check_launch();
}

void ggml_cuda_bitcos_mul_mat_id(cudaStream_t stream, ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];
    const ggml_tensor * ids  = dst->src[2];
    int64_t view_row0 = 0;
    const ggml_tensor * base = bitcos_base(src0, &view_row0);
    GGML_ASSERT(view_row0 == 0);
    const uint8_t * w = static_cast<const uint8_t *>(base->data);
    const uint8_t * c = static_cast<const uint8_t *>(ggml_bitcos_companion(src0)->data);

    const int64_t rows = src0->ne[1], n_experts = src0->ne[2];
    const int64_t n_used = ids->ne[0], n_tokens = ids->ne[1];

    if (n_tokens > BITCOS_CUDA_MMQ_MIN_COLS && n_experts <= 65535 && mmq_available()) {
        // batched: every activation column quantized, the (token, slot) pairs grouped by expert on the device,
        // then one tile-kernel launch over (row tiles, slot tiles, experts)
        const int64_t k = src0->ne[0], k_pad = bitcos_cuda_mmq_k_pad(k), nqb = k_pad / BITCOS_CUDA_MMQ_QBLOCK;
        const int64_t ne11 = src1->ne[1], n_cols = ne11 * n_tokens, cap = n_used * n_tokens;
        void * tmp = nullptr;
        const size_t bytes = (size_t) (n_cols * nqb * sizeof(float) + n_cols * k_pad) +
                             (size_t) (n_experts + n_experts * cap) * sizeof(int32_t);
        check_cuda(cudaMallocAsync(&tmp, bytes, stream), "cudaMallocAsync");
        float   * xd     = static_cast<float *>(tmp);
        int8_t  * xq     = reinterpret_cast<int8_t *>(xd + n_cols * nqb);
        int32_t * counts = reinterpret_cast<int32_t *>(xq + n_cols * k_pad);
        int32_t * slots  = counts + n_experts;
        check_cuda(cudaMemsetAsync(counts, 0, n_experts * sizeof(int32_t), stream), "cudaMemsetAsync");
        bitcos_cuda_quantize_q8_kernel<<<dim3((unsigned) n_cols, (unsigned) ((nqb + 3) / 4)), dim3(BITCOS_CUDA_WARP, 4), 0,
            stream>>>(static_cast<const float *>(src1->data), xq, xd, k, k_pad, src1->nb[1] / (int64_t) sizeof(float),
            ne11, src1->nb[2] / (int64_t) sizeof(float));
        bitcos_cuda_mmq_id_slots_kernel<<<(unsigned) ((cap + 255) / 256), 256, 0, stream>>>(
            static_cast<const int32_t *>(ids->data), slots, counts, n_experts, n_used, n_tokens,
            ids->nb[1] / (int64_t) sizeof(int32_t), cap);
        const bitcos_cuda_mmq_ids map = {slots, counts, cap, n_used, ne11, (int64_t) (dst->nb[1] / sizeof(float)),
                                         (int64_t) (dst->nb[2] / sizeof(float))};
        const dim3 mgrid((unsigned) ((rows + BITCOS_CUDA_MMQ_BM - 1) / BITCOS_CUDA_MMQ_BM),
                         (unsigned) ((cap + BITCOS_CUDA_MMQ_BN - 1) / BITCOS_CUDA_MMQ_BN), (unsigned) n_experts);
        bitcos_cuda_mul_mat_mmq_kernel<<<mgrid, BITCOS_CUDA_MMQ_THREADS, 0, stream>>>(w, c, xq, xd,
            static_cast<float *>(dst->data), 0, rows, 0, k_pad, 0, map);
        check_launch();
        check_cuda(cudaFreeAsync(tmp, stream), "cudaFreeAsync");
        return;
    }

    const dim3 grid((unsigned) ((rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK), (unsigned) (n_used * n_tokens));
    const dim3 block(BITCOS_CUDA_WARP, WARPS_PER_BLOCK);
    bitcos_cuda_mul_mat_id_kernel<<<grid, block, 0, stream>>>(w, c, static_cast<const float *>(src1->data),
        static_cast<const int32_t *>(ids->data), static_cast<float *>(dst->data), rows, n_experts, n_used,
        ids->nb[1] / (int64_t) sizeof(int32_t), src1->ne[1], src1->nb[1] / (int64_t) sizeof(float),
        src1->nb[2] / (int64_t) sizeof(float), dst->nb[1] / (int64_t) sizeof(float), dst->nb[2] / (int64_t) sizeof(float));
    check_launch();
}
