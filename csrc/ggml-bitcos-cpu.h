// ggml-bitcos CPU backend glue: BITCOS mul_mat / mul_mat_id for ggml-cpu (hooked in by the ggml-cpu dispatch patch).
// Private to ggml-cpu; compiled into every CPU backend variant.
#pragma once

#include "ggml-bitcos.h"
#include "ggml-backend.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_compute_params;

// BITCOS is supported only as src0 of MUL_MAT / MUL_MAT_ID with an F32 src1, F32 dst and a linked companion
bool ggml_bitcos_cpu_supports_op(const struct ggml_tensor * op);

// work buffer bytes for a MUL_MAT / MUL_MAT_ID node with a BITCOS src0, run by n_threads threads
size_t ggml_bitcos_cpu_work_size(const struct ggml_tensor * node, int n_threads);

// Both run a weight in either form: BITCOS, or the 2-bit codes form of a CPU_BITCOS_2BIT buffer.
void ggml_bitcos_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst);
void ggml_bitcos_cpu_mul_mat_id(const struct ggml_compute_params * params, struct ggml_tensor * dst);

// A BITCOS weight as TQ2_0 blocks (for a device that runs TQ2_0 but has no BITCOS kernels; the llama.cpp loader
// finds it through the CPU backend's proc address "ggml_bitcos_cpu_to_tq2_0"): validates the weight data and its
// companion, then decodes every row in parallel into dst (ggml_row_size(GGML_TYPE_TQ2_0, K) bytes per row). False
// with a message in err when the data is invalid or TQ2_0 cannot hold it exactly (K % 256, a scale that is not an
// fp16 value, two scales in one 256-block).
bool ggml_bitcos_cpu_to_tq2_0(const struct ggml_tensor * w, const void * wdata, const void * cdata, size_t cbytes,
                              void * dst, char * err, size_t err_size);

// CPU_BITCOS_2BIT (ggml-bitcos-cpu-codes.cpp): ggml-cpu's extra buffer type for BITCOS weights decoded at load
// into the 2-bit codes form where that form is chosen (GGML_BITCOS_CPU_FORM, docs/KERNELS.md §9)
ggml_backend_buffer_type_t ggml_backend_cpu_bitcos_codes_buffer_type(void);

#ifdef __cplusplus
}
#endif
