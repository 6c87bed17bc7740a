// ggml-bitcos-vulkan: BITCOS MUL_MAT / MUL_MAT_ID in ggml-vulkan (see ggml-bitcos-vulkan.h).
//
// MUL_MAT with up to mul_mat_vec_max_cols columns (decode) runs the mat-vec shader, more columns (prompt
// batches) the tiled mul_mm_bitcos.comp; MUL_MAT_ID runs the mat-vec-id shader, one dispatch per token as
// ggml-vulkan's own mat-vec-id path does. The mat-vec push constants and workgroup grid are ggml-vulkan's,
// with batch_stride_a in weights, so the shader finds global rows for the companion's row index. The weight
// and its companion are in the same device buffer (the loader creates the companion in the weight's
// context) and were validated on the host by the loader before any graph ran.
#include "ggml-bitcos-vulkan.h"

#include "ggml-bitcos.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace {

// shader_reduction_mode order: shared memory, hybrid (subgroup + shared memory), subgroup only
#define BITCOS_VK_SHADERS(PREFIX)                                                                         \
    {                                                                                                     \
        { #PREFIX, PREFIX##_len, PREFIX##_data },                                                         \
            { #PREFIX "_subgroup", PREFIX##_subgroup_len, PREFIX##_subgroup_data }, {                     \
            #PREFIX "_subgroup_no_shmem", PREFIX##_subgroup_no_shmem_len, PREFIX##_subgroup_no_shmem_data \
        }                                                                                                 \
    }

// The shader sets, one per BITCOS type: v1 G128, v1 PT, v2 BITCOS (whose shaders read the variant, MATRIX / ROW
// / B128 / B256, from the companion header: one ggml type, so one pipeline, for all four).
constexpr size_t N_TYPES = 3;

size_t type_index(ggml_type type) {
    GGML_ASSERT(ggml_bitcos_is_type(type));
    return type == GGML_TYPE_BITCOS_G128 ? 0 : type == GGML_TYPE_BITCOS_PT ? 1 : 2;
}

// [form][type][id][reduc], forms: the fast shader (mul_mat_vec_bitcos_fast.comp) with f32 activations, the exact
// one (mul_mat_vec_bitcos.comp, TQ2_0's arithmetic), the fast one with q8_1 activations
enum { FORM_FAST_F32, FORM_EXACT, FORM_FAST_Q8_1, N_FORMS };
const ggml_vk_bitcos_shader mat_vec_shaders[N_FORMS][N_TYPES][2][SHADER_REDUCTION_MODE_COUNT] = {
    {
        { BITCOS_VK_SHADERS(mul_mat_vec_bitcos_g128_fast_f32_f32),
          BITCOS_VK_SHADERS(mul_mat_vec_id_bitcos_g128_fast_f32_f32) },
        { BITCOS_VK_SHADERS(mul_mat_vec_bitcos_pt_fast_f32_f32),
          BITCOS_VK_SHADERS(mul_mat_vec_id_bitcos_pt_fast_f32_f32) },
        { BITCOS_VK_SHADERS(mul_mat_vec_bitcos_fast_f32_f32), BITCOS_VK_SHADERS(mul_mat_vec_id_bitcos_fast_f32_f32) },
    },
    {
        { BITCOS_VK_SHADERS(mul_mat_vec_bitcos_g128_f32_f32), BITCOS_VK_SHADERS(mul_mat_vec_id_bitcos_g128_f32_f32) },
        { BITCOS_VK_SHADERS(mul_mat_vec_bitcos_pt_f32_f32), BITCOS_VK_SHADERS(mul_mat_vec_id_bitcos_pt_f32_f32) },
        { BITCOS_VK_SHADERS(mul_mat_vec_bitcos_f32_f32), BITCOS_VK_SHADERS(mul_mat_vec_id_bitcos_f32_f32) },
    },
    {
        { BITCOS_VK_SHADERS(mul_mat_vec_bitcos_g128_fast_q8_1_f32),
          BITCOS_VK_SHADERS(mul_mat_vec_id_bitcos_g128_fast_q8_1_f32) },
        { BITCOS_VK_SHADERS(mul_mat_vec_bitcos_pt_fast_q8_1_f32),
          BITCOS_VK_SHADERS(mul_mat_vec_id_bitcos_pt_fast_q8_1_f32) },
        { BITCOS_VK_SHADERS(mul_mat_vec_bitcos_fast_q8_1_f32), BITCOS_VK_SHADERS(mul_mat_vec_id_bitcos_fast_q8_1_f32) },
    },
};

#undef BITCOS_VK_SHADERS

const ggml_vk_bitcos_shader mul_mm_shaders[N_TYPES] = {
    { "mul_mm_bitcos_g128", mul_mm_bitcos_g128_len, mul_mm_bitcos_g128_data },
    { "mul_mm_bitcos_pt", mul_mm_bitcos_pt_len, mul_mm_bitcos_pt_data },
    { "mul_mm_bitcos", mul_mm_bitcos_len, mul_mm_bitcos_data },
};

constexpr uint32_t MUL_MM_TILE = 32; // rows and columns per workgroup (mul_mm_bitcos.comp's TM, TN)

// The q8_1 form's activation pass: blocks of 32 activations per workgroup (mul_mat_vec_bitcos_fast.comp's
// QUANTIZE_BLOCKS_PER_WG) and bytes per 128 activations (ggml-vulkan's block_q8_1_x4: 4 f16 pairs + 128 int8)
constexpr uint32_t QUANTIZE_BLOCKS_PER_WG = 32;
constexpr uint64_t Q8_1_X4_BYTES          = 144;

// Per device: whether its mat-vec takes q8_1 activations (ggml_vk_bitcos_init_device)
std::mutex                               int8_mutex;
std::map<const vk_device_struct *, bool> int8_devices;

// The mul_mm pipelines live here rather than in vk_device_struct (whose layout is upstream's), one per type and
// device, created by ggml_vk_load_shaders through ggml_vk_bitcos_mul_mm_pipeline().
std::mutex                                                           mul_mm_mutex;
std::map<const vk_device_struct *, std::array<vk_pipeline, N_TYPES>> mul_mm_pipelines;

// The first fused op's operand (bias of ADD / ADD_ID, scale of MUL) and the second's, as ggml-vulkan's
// mat-vec paths bind them; unused bindings get D.
struct fused_operands {
    vk_subbuffer f0, f1;
    uint32_t     flags = 0;
};

fused_operands mul_mat_fused(ggml_backend_vk_context * ctx, const ggml_cgraph * cgraph, int node_idx,
                             const vk_subbuffer & d_D) {
    fused_operands f{ d_D, d_D };
    for (int k = 1; k <= ctx->num_additional_fused_ops; ++k) { // MUL_MAT + ADD (+ ADD): biases
        const ggml_tensor * add  = cgraph->nodes[node_idx + k];
        const ggml_tensor * prev = cgraph->nodes[node_idx + k - 1];
        const ggml_tensor * bias = add->src[0] == prev ? add->src[1] : add->src[0];
        (k == 1 ? f.f0 : f.f1)   = ggml_vk_tensor_subbuffer(ctx, bias);
        f.flags |= k == 1 ? MAT_VEC_FUSION_FLAGS_BIAS0 : MAT_VEC_FUSION_FLAGS_BIAS1;
    }
    return f;
}

fused_operands mul_mat_id_fused(ggml_backend_vk_context * ctx, const ggml_cgraph * cgraph, int node_idx,
                                const vk_subbuffer & d_D) {
    fused_operands f{ d_D, d_D };
    if (ctx->num_additional_fused_ops > 0) { // ADD_ID (bias) or MUL (scale)
        const ggml_tensor * op = cgraph->nodes[node_idx + 1];
        f.f0                   = ggml_vk_tensor_subbuffer(ctx, op->src[1]);
        f.flags |= op->op == GGML_OP_MUL ? MAT_VEC_FUSION_FLAGS_SCALE0 : MAT_VEC_FUSION_FLAGS_BIAS0;
    }
    if (ctx->num_additional_fused_ops > 1) { // then MUL (scale)
        f.f1 = ggml_vk_tensor_subbuffer(ctx, cgraph->nodes[node_idx + 2]->src[1]);
        f.flags |= MAT_VEC_FUSION_FLAGS_SCALE1;
    }
    return f;
}

// Row-index and pool positions are 32-bit in the shader; buffers must fit one storage binding.
bool fits_shader(const vk_device & device, const ggml_tensor * t) {
    return ggml_nbytes(t) <= device->properties.limits.maxStorageBufferRange && ggml_nbytes(t) < UINT32_MAX;
}

} // namespace

static bool env_is_1(const char * name) {
    const char * v = getenv(name);
    return v != nullptr && strcmp(v, "1") == 0;
}

bool ggml_vk_bitcos_exact() {
    return env_is_1("GGML_BITCOS_VULKAN_EXACT");
}

ggml_vk_bitcos_shader ggml_vk_bitcos_mat_vec_shader(ggml_type type, bool id, uint32_t reduc, bool q8_1) {
    GGML_ASSERT(reduc < SHADER_REDUCTION_MODE_COUNT);
    const int form = q8_1 ? FORM_FAST_Q8_1 : ggml_vk_bitcos_exact() ? FORM_EXACT : FORM_FAST_F32;
    return mat_vec_shaders[form][type_index(type)][id][reduc];
}

bool ggml_vk_bitcos_has_int8_extension(const std::vector<vk::ExtensionProperties> & extensions) {
    return std::any_of(extensions.begin(), extensions.end(), [](const vk::ExtensionProperties & e) {
        return strcmp(e.extensionName, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME) == 0;
    });
}

void ggml_vk_bitcos_init_device(const vk_device & device, bool int8_feature) {
    vk::PhysicalDeviceShaderIntegerDotProductProperties dot_props;
    bool                                                accelerated = false;
    if (int8_feature) {
        vk::PhysicalDeviceProperties2 props2;
        props2.pNext = &dot_props;
        device->physical_device.getProperties2(&props2);
        accelerated = dot_props.integerDotProduct4x8BitPackedSignedAccelerated;
    }
    const char * force = getenv("GGML_BITCOS_VULKAN_INT8");
    bool         int8  = force != nullptr ? strcmp(force, "1") == 0 : accelerated;
    if (int8 && !int8_feature) {
        GGML_LOG_WARN(
            "ggml_vulkan: GGML_BITCOS_VULKAN_INT8=1: %s has no integer dot product (shaderIntegerDotProduct): "
            "f32 activations\n",
            device->properties.deviceName.data());
        int8 = false;
    }
    int8 = int8 && !ggml_vk_bitcos_exact();
    {
        std::lock_guard<std::mutex> lock(int8_mutex);
        int8_devices[device.get()] = int8;
    }
    GGML_LOG_INFO("ggml_vulkan: BITCOS mat-vec on %s: %s\n", device->properties.deviceName.data(),
                  ggml_vk_bitcos_exact() ? "TQ2_0-exact shader (GGML_BITCOS_VULKAN_EXACT=1)" :
                  int8                   ? "q8_1 activations, packed int8 dot products" :
                                           "f32 activations");
}

bool ggml_vk_bitcos_int8(const vk_device & device) {
    std::lock_guard<std::mutex> lock(int8_mutex);
    const auto                  it = int8_devices.find(device.get());
    return it != int8_devices.end() && it->second;
}

ggml_vk_bitcos_shader ggml_vk_bitcos_mul_mm_shader(ggml_type type) {
    return mul_mm_shaders[type_index(type)];
}

vk_pipeline & ggml_vk_bitcos_mul_mm_pipeline(const vk_device & device, ggml_type type) {
    const size_t                t = type_index(type);
    std::lock_guard<std::mutex> lock(mul_mm_mutex);
    return mul_mm_pipelines[device.get()][t]; // map nodes stay put
}

bool ggml_vk_bitcos_supports_op(const vk_device & device, const ggml_tensor * op) {
    // test hook: GGML_BITCOS_VULKAN_REFUSE=1 makes this backend one without BITCOS kernels, so that the loader's
    // TQ2_0 path for such devices (Metal, ...) runs on lavapipe in the tests (tests/test_vulkan_tq2_0.py)
    if (env_is_1("GGML_BITCOS_VULKAN_REFUSE")) {
        return false;
    }
    if (!ggml_bitcos_gpu_supports_op(op)) { // the rules every GPU backend shares (ggml-bitcos.h)
        return false;
    }
    if (op->op != GGML_OP_MUL_MAT && op->op != GGML_OP_MUL_MAT_ID) {
        return true; // storage ops
    }
    // this backend's limits: 32-bit element indices and buffer ranges in the shaders, workgroup counts
    const ggml_tensor * src0 = op->src[0];
    const ggml_tensor * src1 = op->src[1];
    const ggml_tensor * base = src0->view_src ? src0->view_src : src0;
    if (ggml_nelements(base) >= UINT32_MAX || !fits_shader(device, base) ||
        !fits_shader(device, ggml_bitcos_companion(src0))) {
        return false;
    }
    if (src0->view_src != nullptr && src1->ne[2] * src1->ne[3] != 1) {
        return false; // a view runs as one batch
    }
    if (op->op == GGML_OP_MUL_MAT) {
        // mat-vec: one column of every batch, or up to 8 columns of a single batch; mul_mm: a single batch
        const bool batched = src1->ne[2] * src1->ne[3] > 1;
        return (src1->ne[1] == 1 || !batched) &&
               (uint64_t) (src1->ne[2] * src1->ne[3]) <= device->properties.limits.maxComputeWorkGroupCount[1] &&
               (uint64_t) CEIL_DIV(src1->ne[1], MUL_MM_TILE) <= device->properties.limits.maxComputeWorkGroupCount[1] &&
               (uint64_t) CEIL_DIV(src0->ne[1], MUL_MM_TILE) <= device->properties.limits.maxComputeWorkGroupCount[0];
    }
    return (uint64_t) op->src[2]->ne[0] <= device->properties.limits.maxComputeWorkGroupCount[1];
}

// Workgroup grid over the output rows as ggml-vulkan's mat-vec paths lay it out (x: rows, spilling into z).
static std::array<uint32_t, 3> row_grid(ggml_backend_vk_context * ctx, uint32_t rows, uint32_t groups_y) {
    uint32_t groups_x = rows, groups_z = 1;
    if (rows > ctx->device->properties.limits.maxComputeWorkGroupCount[0]) {
        groups_z = 64;
        groups_x = CEIL_DIV(groups_x, groups_z);
    }
    return { groups_x, groups_y, groups_z };
}

// Whether a mat-vec over activations src1 takes the q8_1 form: the device's choice, and src1 one contiguous f32 run
// (so that its 32-activation blocks are the q8_1 blocks the shader addresses)
static bool use_q8_1(ggml_backend_vk_context * ctx, const ggml_tensor * src1) {
    return ggml_vk_bitcos_int8(ctx->device) && src1->type == GGML_TYPE_F32 && ggml_is_contiguous(src1);
}

// The q8_1 form's activations: src1 quantized into prealloc_y in ggml-vulkan's q8_1_x4 layout, skipped when it
// already holds them (prealloc_y's last-use bookkeeping, as ggml-vulkan's own quantize_y paths keep it). The
// pass runs the mat-vec pipeline itself (push constant ncols = 0: mul_mat_vec_bitcos_fast.comp's
// quantize_activations, src1 bound as fuse0, prealloc_y as D) rather than a pipeline of its own: with another
// pipeline dispatched before the BITCOS mat-vec in one MUL_MAT, Mesa 22.3's lavapipe, the test device, corrupts
// its heap (docs/GPU.md §1.1). `dispatch(d_Q, pc, elements)` records the pass with the caller's bindings.
template <typename PC, typename Dispatch>
static vk_subbuffer quantize_activations(ggml_backend_vk_context * ctx, vk_context & subctx, vk_pipeline & dmmv,
                                         const ggml_tensor * src1, const Dispatch & dispatch) {
    const uint64_t n    = ggml_nelements(src1); // a multiple of 32: K % 32 == 0 in every BITCOS version
    const uint64_t size = CEIL_DIV(n, 128) * Q8_1_X4_BYTES;
    GGML_ASSERT(n % 32 == 0 && n < UINT32_MAX && size <= ctx->device->properties.limits.maxStorageBufferRange);
    if (ctx->prealloc_size_y < size) {
        ctx->prealloc_size_y = size;
        ggml_vk_preallocate_buffers(ctx, subctx); // submits what is recorded, then grows prealloc_y
    }
    const vk_subbuffer d_Q = ggml_vk_subbuffer(ctx, ctx->prealloc_y, 0);
    if (ctx->prealloc_y_last_pipeline_used == dmmv.get() && ctx->prealloc_y_last_tensor_used == src1 &&
        !ctx->prealloc_y_last_k_padded) {
        return d_Q;
    }
    if (ctx->prealloc_y_need_sync) {
        ggml_vk_sync_buffers(ctx, subctx);
    }
    PC pc{};
    pc.ncols                = 0;
    pc.stride_b             = (uint32_t) n;
    // QUANTIZE_BLOCKS_PER_WG blocks of 32 per workgroup, workgroups along x, then y
    const uint32_t groups   = (uint32_t) CEIL_DIV(n / 32, QUANTIZE_BLOCKS_PER_WG);
    const uint32_t groups_x = std::min(groups, ctx->device->properties.limits.maxComputeWorkGroupCount[0]);
    ggml_pipeline_request_descriptor_sets(ctx, dmmv, 1);
    dispatch(d_Q, pc, std::array<uint32_t, 3>{ groups_x * dmmv->wg_denoms[0], CEIL_DIV(groups, groups_x), 1 });
    ggml_vk_sync_buffers(ctx, subctx);
    ctx->prealloc_y_last_pipeline_used = dmmv.get();
    ctx->prealloc_y_last_tensor_used   = src1;
    ctx->prealloc_y_last_k_padded      = false;
    return d_Q;
}

void ggml_vk_bitcos_mul_mat(ggml_backend_vk_context * ctx, vk_context & subctx, const ggml_cgraph * cgraph,
                            int node_idx, const ggml_vk_bitcos_pipeline_fn & pipeline) {
    const ggml_tensor * dst  = cgraph->nodes[node_idx];
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];

    const uint32_t k = (uint32_t) src0->ne[0], rows = (uint32_t) src0->ne[1];
    const uint32_t ne11 = (uint32_t) src1->ne[1], ne12 = (uint32_t) src1->ne[2], ne13 = (uint32_t) src1->ne[3];
    const uint32_t col_stride = (uint32_t) (src1->nb[1] / sizeof(float));

    // the shaders address the weight by global rows (the companion's row index is global): bind the base
    // weight, and for a view start at its first row (row_map: consecutive whole rows, see supports_op)
    int64_t view_row0 = 0, step[3];
    GGML_ASSERT(ggml_bitcos_row_map(src0, &view_row0, step));
    const vk_subbuffer   d_X = ggml_vk_tensor_subbuffer(ctx, src0->view_src ? src0->view_src : src0);
    const vk_subbuffer   d_Y = ggml_vk_tensor_subbuffer(ctx, src1);
    const vk_subbuffer   d_C = ggml_vk_tensor_subbuffer(ctx, ggml_bitcos_companion(src0));
    const vk_subbuffer   d_D = ggml_vk_tensor_subbuffer(ctx, cgraph->nodes[node_idx + ctx->num_additional_fused_ops]);
    const fused_operands f   = mul_mat_fused(ctx, cgraph, node_idx, d_D);

    if (ne11 == 1 || (ne11 <= mul_mat_vec_max_cols && view_row0 == 0)) {
        // mat-vec. Three layouts of its push constants:
        //  - one column per batch: batch_stride_a = weights per matrix, matrices broadcast by r2 / r3;
        //  - one column of a view: batch index 1 (base_work_group_y) whose "matrix" starts at the view's
        //    first row (batch_stride_a = row0 * k), zero batch strides for B and D;
        //  - up to mul_mat_vec_max_cols columns of a single batch: batch strides step columns, matrix 0.
        vk_mat_vec_push_constants pc       = { k, col_stride, col_stride, rows, 0, 0, 0, f.flags, 0, 1, 1, 1, 1 };
        uint32_t                  groups_y = 1;
        if (view_row0 > 0) {
            pc.batch_stride_a    = (uint32_t) view_row0 * k;
            pc.base_work_group_y = 1;
        } else if (ne11 == 1) {
            pc.batch_stride_a = k * rows;
            pc.batch_stride_b = (uint32_t) (src1->nb[2] / sizeof(float));
            pc.batch_stride_d = (uint32_t) (dst->nb[2] / sizeof(float));
            pc.ne02           = (uint32_t) src0->ne[2];
            pc.ne12           = ne12;
            pc.broadcast2     = ne12 / (uint32_t) src0->ne[2];
            pc.broadcast3     = ne13 / (uint32_t) src0->ne[3];
            groups_y          = ne12 * ne13;
        } else {
            pc.batch_stride_b = col_stride;
            pc.batch_stride_d = (uint32_t) (dst->nb[1] / sizeof(float));
        }
        const bool   q8_1 = use_q8_1(ctx, src1);
        vk_pipeline  dmmv = pipeline(ne11, q8_1 ? GGML_TYPE_Q8_1 : GGML_TYPE_F32);
        vk_subbuffer d_B  = d_Y;
        if (q8_1) {
            d_B = quantize_activations<vk_mat_vec_push_constants>(
                ctx, subctx, dmmv, src1, [&](const vk_subbuffer & d_Q, const auto & qpc, const auto & elements) {
                    ggml_vk_dispatch_pipeline(ctx, subctx, dmmv, { d_X, d_Q, d_Q, d_Y, d_Y, d_C }, qpc, elements);
                });
        }
        ggml_pipeline_request_descriptor_sets(ctx, dmmv, 1);
        ggml_vk_dispatch_pipeline(ctx, subctx, dmmv, { d_X, d_B, d_D, f.f0, f.f1, d_C }, pc,
                                  row_grid(ctx, rows, groups_y));
        if (q8_1) {
            ctx->prealloc_y_need_sync = true; // the next writer of prealloc_y waits for this read
        }
        return;
    }
    // a prompt batch (or several columns of a view): the tiled matrix multiply decodes each 32-row tile once
    // per 32 columns
    vk_pipeline & mm = ggml_vk_bitcos_mul_mm_pipeline(ctx->device, src0->type);
    ggml_pipeline_request_descriptor_sets(ctx, mm, 1);
    const ggml_vk_bitcos_mul_mm_push_constants pc = {
        k, rows, ne11, col_stride, (uint32_t) (dst->nb[1] / sizeof(float)), (uint32_t) view_row0, 0, 0,
    };
    ggml_vk_dispatch_pipeline(ctx, subctx, mm, { d_X, d_Y, d_D, d_C }, pc,
                              { CEIL_DIV(rows, MUL_MM_TILE), CEIL_DIV(ne11, MUL_MM_TILE), 1 });
}

void ggml_vk_bitcos_mul_mat_id(ggml_backend_vk_context * ctx, vk_context & subctx, const ggml_cgraph * cgraph,
                               int node_idx, const ggml_vk_bitcos_pipeline_fn & pipeline) {
    const ggml_tensor * dst  = cgraph->nodes[node_idx];
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];
    const ggml_tensor * ids  = dst->src[2];

    const uint32_t k = (uint32_t) src0->ne[0], rows = (uint32_t) src0->ne[1];
    const uint32_t n_used = (uint32_t) ids->ne[0], n_tokens = (uint32_t) ids->ne[1];

    const vk_subbuffer   d_X   = ggml_vk_tensor_subbuffer(ctx, src0);
    const vk_subbuffer   d_Y   = ggml_vk_tensor_subbuffer(ctx, src1);
    const vk_subbuffer   d_ids = ggml_vk_tensor_subbuffer(ctx, ids);
    const vk_subbuffer   d_C   = ggml_vk_tensor_subbuffer(ctx, ggml_bitcos_companion(src0));
    const vk_subbuffer   d_D   = ggml_vk_tensor_subbuffer(ctx, cgraph->nodes[node_idx + ctx->num_additional_fused_ops]);
    const fused_operands f     = mul_mat_id_fused(ctx, cgraph, node_idx, d_D);

    const bool   q8_1 = use_q8_1(ctx, src1);
    vk_pipeline  dmmv = pipeline(0, q8_1 ? GGML_TYPE_Q8_1 : GGML_TYPE_F32);
    vk_subbuffer d_B  = d_Y;
    if (q8_1) {
        d_B = quantize_activations<vk_mat_vec_id_push_constants>(
            ctx, subctx, dmmv, src1, [&](const vk_subbuffer & d_Q, const auto & qpc, const auto & elements) {
                ggml_vk_dispatch_pipeline(ctx, subctx, dmmv, { d_X, d_Q, d_Q, d_Y, d_Y, d_ids, d_C }, qpc, elements);
            });
    }
    ggml_pipeline_request_descriptor_sets(ctx, dmmv, n_tokens);
    for (uint32_t t = 0; t < n_tokens; ++t) {
        const vk_mat_vec_id_push_constants pc = {
            k,
            (uint32_t) (src1->nb[1] / sizeof(float)),
            (uint32_t) (src1->nb[1] / sizeof(float)),
            rows,
            k * rows,
            (uint32_t) (src1->nb[2] / sizeof(float)),
            (uint32_t) (dst->nb[2] / sizeof(float)),
            f.flags,
            n_used,
            (uint32_t) src1->ne[1],
            t,
            (uint32_t) (ids->nb[1] / sizeof(int32_t)),
        };
        ggml_vk_dispatch_pipeline(ctx, subctx, dmmv, { d_X, d_B, d_D, f.f0, f.f1, d_ids, d_C }, pc,
                                  row_grid(ctx, rows, n_used));
    }
    if (q8_1) {
        ctx->prealloc_y_need_sync = true;
    }
}
