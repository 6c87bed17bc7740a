// ggml-bitcos-gpu: the host-side prologue of BITCOS MUL_MAT / MUL_MAT_ID that the C++ GPU glue shares
// (csrc/cuda/ggml-bitcos-cuda.cu, csrc/sycl/ggml-bitcos-sycl.cpp): which bytes the kernels read and how
// ggml's operand shapes and strides map to weight rows. The glue includes it as "../ggml-bitcos-gpu.h": it
// sits one folder above the glue both in csrc/ and in the patched tree's ggml/src/ggml-bitcos/, so neither
// the backend patches nor the tests' compile lines name its folder.
#pragma once

// <>, not "": the public copy in ggml/include that the glue itself includes, not the csrc copy beside this
// file in the patched tree (two files with one #pragma once each would define everything twice)
#include <ggml-bitcos.h>

#include <cstdint>

// The BITCOS weight an operand reads: its base tensor's weight bytes and companion bytes, and the base row of
// the operand's first row (a view of consecutive whole rows under MUL_MAT; 0 for the weight itself).
struct ggml_bitcos_gpu_weight {
    const uint8_t * w;
    const uint8_t * c;
    int64_t         row0;
};

// src0 of a BITCOS MUL_MAT / MUL_MAT_ID that ggml_bitcos_gpu_supports_op accepted (a linked weight or a
// whole-row view of one; anything else is a broken graph and aborts).
static inline ggml_bitcos_gpu_weight ggml_bitcos_gpu_weight_of(const ggml_tensor * src0) {
    int64_t row0 = 0, step[3];
    GGML_ASSERT(ggml_bitcos_row_map(src0, &row0, step));
    const ggml_tensor * base = src0->view_src ? src0->view_src : src0;
    return { static_cast<const uint8_t *>(base->data), static_cast<const uint8_t *>(ggml_bitcos_companion(src0)->data),
             row0 };
}

// MUL_MAT dst = src0 * src1 with a BITCOS src0: shapes, strides in floats (f32 activations and output), and
// ggml's broadcast of the weight's matrices over src1's batches (r2, r3).
struct ggml_bitcos_gpu_mul_mat {
    ggml_bitcos_gpu_weight weight;
    const float *          x;
    float *                d;
    int64_t                rows, ne02, ne03; // src0: rows per matrix, matrices
    int64_t                ne11, ne12, ne13; // src1: columns, batches
    int64_t                s11, s12, s13;    // src1 strides
    int64_t                d1, d2, d3;       // dst strides
    int64_t                r2, r3;           // src1 batches per weight matrix

    // The base row of the weight matrix that batch (i12, i13) multiplies.
    int64_t batch_row0(int64_t i12, int64_t i13) const { return weight.row0 + ((i13 / r3) * ne02 + i12 / r2) * rows; }
};

static inline ggml_bitcos_gpu_mul_mat ggml_bitcos_gpu_mul_mat_of(const ggml_tensor * src0, const ggml_tensor * src1,
                                                                 ggml_tensor * dst) {
    ggml_bitcos_gpu_mul_mat m;
    m.weight = ggml_bitcos_gpu_weight_of(src0);
    m.x      = static_cast<const float *>(src1->data);
    m.d      = static_cast<float *>(dst->data);
    m.rows = src0->ne[1], m.ne02 = src0->ne[2], m.ne03 = src0->ne[3];
    m.ne11 = src1->ne[1], m.ne12 = src1->ne[2], m.ne13 = src1->ne[3];
    m.s11 = src1->nb[1] / sizeof(float), m.s12 = src1->nb[2] / sizeof(float), m.s13 = src1->nb[3] / sizeof(float);
    m.d1 = dst->nb[1] / sizeof(float), m.d2 = dst->nb[2] / sizeof(float), m.d3 = dst->nb[3] / sizeof(float);
    m.r2 = m.ne12 / m.ne02, m.r3 = m.ne13 / m.ne03;
    return m;
}
