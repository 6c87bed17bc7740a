// ggml-bitcos-vulkan: BITCOS MUL_MAT / MUL_MAT_ID in ggml-vulkan (hooked in by the ggml-vulkan patch).
//
// Private to ggml-vulkan: compiled into its target next to ggml-vulkan.cpp and built on its internal header
// ggml-vulkan-common.h. Decode runs the mat-vec shader mul_mat_vec_bitcos_fast.comp (few instructions per
// weight; results within test-backend-ops' bound for TQ2_0, not bit-identical to it), with q8_1 activations and
// packed int8 dot products where the device accelerates them (ggml_vk_bitcos_int8), f32 activations elsewhere;
// with GGML_BITCOS_VULKAN_EXACT=1 in the environment when the device is created, mul_mat_vec_bitcos.comp, which
// mirrors TQ2_0's arithmetic, so a model converted from TQ2_0 gives TQ2_0's results bit for bit.
#pragma once

#include "ggml-vulkan-common.h"

#include <cstdint>
#include <functional>
#include <vector>

// The BITCOS types this backend has pipelines for (ggml_vk_load_shaders creates them for each): version 1's two
// and version 2's one, whose shaders read the variant from the weight's companion.
static constexpr ggml_type ggml_vk_bitcos_types[] = { GGML_TYPE_BITCOS_G128, GGML_TYPE_BITCOS_PT, GGML_TYPE_BITCOS };

// SPIR-V of the mat-vec shader for a BITCOS type (id: the MUL_MAT_ID form) in reduction mode `reduc`
// (shader_reduction_mode: shared memory, hybrid, subgroup), with q8_1 or f32 activations.
struct ggml_vk_bitcos_shader {
    const char * name;
    uint64_t     len;
    const void * data;
};
ggml_vk_bitcos_shader ggml_vk_bitcos_mat_vec_shader(ggml_type type, bool id, uint32_t reduc, bool q8_1);

// Whether the mat-vec pipelines run the TQ2_0-exact shader (GGML_BITCOS_VULKAN_EXACT=1) instead of the fast one.
bool ggml_vk_bitcos_exact();

// The q8_1 form's device requirements, decided while ggml-vulkan creates the device: the extension (so that
// device creation enables VK_KHR_shader_integer_dot_product's feature even where ggml-vulkan's own q8_1 shaders
// are not built), then the feature as queried. ggml_vk_bitcos_int8(): whether this device's BITCOS mat-vec
// takes q8_1 activations: GGML_BITCOS_VULKAN_INT8=1 / 0 forces it on (where the feature is there) / off,
// otherwise where the device accelerates packed 4x8-bit signed dot products; never with the exact shader.
bool ggml_vk_bitcos_has_int8_extension(const std::vector<vk::ExtensionProperties> & extensions);
void ggml_vk_bitcos_init_device(const vk_device & device, bool int8_feature);
bool ggml_vk_bitcos_int8(const vk_device & device);

// The tiled matrix multiply for prompt batches (MUL_MAT with more than mul_mat_vec_max_cols columns): its
// SPIR-V, its pipeline slot per device and type (created by ggml_vk_load_shaders), bindings and constants.
ggml_vk_bitcos_shader     ggml_vk_bitcos_mul_mm_shader(ggml_type type);
vk_pipeline &             ggml_vk_bitcos_mul_mm_pipeline(const vk_device & device, ggml_type type);
static constexpr uint32_t ggml_vk_bitcos_mul_mm_bindings = 4; // blocks, B, D, companion
struct ggml_vk_bitcos_mul_mm_push_constants {
    uint32_t k, rows, cols, stride_b, stride_d, row0, pad0, pad1;
};

// Descriptor bindings of the BITCOS mat-vec pipelines: the other mat-vec shaders' plus the companion.
static constexpr uint32_t ggml_vk_bitcos_extra_bindings = 1;

// Whether this device runs `op` that touches a BITCOS tensor: MUL_MAT / MUL_MAT_ID with the weight as src0
// (and the no-op ops the scheduler asks about: the weight itself, views); every other op is refused.
bool ggml_vk_bitcos_supports_op(const vk_device & device, const ggml_tensor * op);

// The mat-vec pipeline the backend chooses for a weight of type t, rows m, row length k, `cols` columns (MUL_MAT;
// 0 for MUL_MAT_ID) and activations of type b_type (F32 or Q8_1): ggml-vulkan's own selection, so BITCOS
// takes the workgroup size TQ2_0 would take on this device.
using ggml_vk_bitcos_pipeline_fn = std::function<vk_pipeline(uint32_t cols, ggml_type b_type)>;

void ggml_vk_bitcos_mul_mat(ggml_backend_vk_context * ctx, vk_context & subctx, const ggml_cgraph * cgraph,
                            int node_idx, const ggml_vk_bitcos_pipeline_fn & pipeline);
void ggml_vk_bitcos_mul_mat_id(ggml_backend_vk_context * ctx, vk_context & subctx, const ggml_cgraph * cgraph,
                               int node_idx, const ggml_vk_bitcos_pipeline_fn & pipeline);
