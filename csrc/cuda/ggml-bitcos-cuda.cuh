// ggml-bitcos-cuda: BITCOS MUL_MAT / MUL_MAT_ID in ggml-cuda, called from three hooks of the ggml-cuda patch
// (supports_op, ggml_cuda_mul_mat, ggml_cuda_mul_mat_id). The decode is bitcos-cuda.cuh's table decode
// (8 lanes per row), shared with tests/cuda/test-bitcos-cuda.cu; both paths run on activations quantized per 32 to
// int8.
#pragma once

// Only ggml.h and the CUDA runtime: the hooks pass ggml-cuda's stream, so this translation unit compiles without
// ggml-cuda's headers (which need cuBLAS's), as the project's CI checks with nvcc for sm_80 and sm_90.
#include "ggml.h"

#include <cuda_runtime.h>

#include <cstddef>

// Whether ggml-cuda runs `op` for a BITCOS weight: ggml_bitcos_gpu_supports_op's shared rules (ggml-bitcos.h)
// within the kernels' grid limits.
bool ggml_cuda_bitcos_supports_op(const ggml_tensor * op);

// The device temporary of one call (the activations quantized per 32: int8 codes and fp32 scales; MUL_MAT_ID's
// batched path adds its per-expert slot lists), in bytes. The hooks take it from ggml-cuda's pool, as ggml-cuda's
// own ops take theirs (ggml_cuda_pool_alloc on ctx.pool(): cached buffers reused from call to call, and no memory
// alloc / free nodes in the CUDA graphs ggml-cuda captures and updates), and pass it to the calls below, which
// check its size and its 16-byte alignment (the pool's allocations are 128-byte aligned or more). MUL_MAT_ID's
// depends on the device (compute capability 7.2+ takes the batched path above 8 tokens).
size_t ggml_cuda_bitcos_mul_mat_tmp_bytes(const ggml_tensor * src0, const ggml_tensor * src1);
size_t ggml_cuda_bitcos_mul_mat_id_tmp_bytes(const ggml_tensor * dst);

// dst = src0 * src1 for a BITCOS src0, batches broadcast as ggml's MUL_MAT defines them (one launch per batch),
// activations quantized per 32 to int8 first: up to 8 columns 8 lanes per row, one decode per 8 columns
// (dp4a); more columns (compute capability 7.2+) 32 x 64 output tiles on tensor cores, one decode per 64.
// tmp: tmp_bytes >= ggml_cuda_bitcos_mul_mat_tmp_bytes(src0, src1) of device memory, used in stream order.
void ggml_cuda_bitcos_mul_mat(cudaStream_t stream, const ggml_tensor * src0, const ggml_tensor * src1,
                              ggml_tensor * dst, void * tmp, size_t tmp_bytes);

// MUL_MAT_ID with a BITCOS expert tensor, expert ids read on the device: up to 8 tokens one mat-vec launch; more
// tokens (compute capability 7.2+) the batched kernel over the (token, slot) pairs grouped by expert.
// tmp: tmp_bytes >= ggml_cuda_bitcos_mul_mat_id_tmp_bytes(dst) of device memory, used in stream order.
void ggml_cuda_bitcos_mul_mat_id(cudaStream_t stream, ggml_tensor * dst, void * tmp, size_t tmp_bytes);
