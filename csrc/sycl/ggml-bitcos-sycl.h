// ggml-bitcos-sycl: BITCOS MUL_MAT / MUL_MAT_ID in ggml-sycl, called from three hooks of the ggml-sycl patch
// (patches/: supports_op, ggml_sycl_mul_mat, ggml_sycl_mul_mat_id). The decode itself is the device code of
// bitcos-sycl.hpp (the paper's Xe2 design), shared with the tests that run it through the SYCL runtime's
// kernel compiler on an OpenCL CPU device.
#pragma once

#include "common.hpp" // ggml-sycl: ggml_backend_sycl_context, queue_ptr

// Whether ggml-sycl runs `op` for a BITCOS weight: ggml_bitcos_gpu_supports_op's shared rules (ggml-bitcos.h).
// (The hook in ggml-sycl.cpp also refuses weights in split buffers, whose test is static there: rows spread
// over devices would be separated from their companion.)
bool ggml_sycl_bitcos_supports_op(const ggml_tensor * op);

// dst = src0 * src1 for a BITCOS src0 (any number of columns: one decode of a row serves up to 8; batches
// broadcast as ggml's MUL_MAT defines it).
void ggml_sycl_bitcos_mul_mat(ggml_backend_sycl_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1,
                              ggml_tensor * dst);

// MUL_MAT_ID with a BITCOS expert tensor src0: one kernel, the expert ids read on the device.
void ggml_sycl_bitcos_mul_mat_id(ggml_backend_sycl_context & ctx, ggml_tensor * dst);
