// ggml-bitcos-link: BITCOS weights as ggml tensors - the companion link (src[0]), views of a weight as rows
// of its base tensor, and the loader's link and post-load check (docs/FORMAT.md §1). Compiled into
// ggml-base by the type-ids patch; the llama.cpp loader calls these (loader patch) so that it carries no
// BITCOS logic of its own. Byte-level validation is ggml-bitcos.c.
#include "ggml-bitcos.h"
#include "ggml-bitcos-impl.h"
#include "bitcos-kernels.h" // bitcos_codes_row_bytes
#include "ggml-backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// --- the last load error of this thread ---------------------------------------------------------------
// Thread-local (like errno): concurrent loads on different threads keep their own message, and a caller
// reads the message of the load it just made on its own thread. Fixed size: no allocation, never fails.
static _Thread_local char g_last_error[1024];

void ggml_bitcos_set_last_error(const char * msg) {
    if (msg == NULL) {
        g_last_error[0] = '\0';
        return;
    }
    snprintf(g_last_error, sizeof(g_last_error), "%s", msg);
}

const char * ggml_bitcos_last_error(void) {
    return g_last_error;
}

bool ggml_bitcos_op_involves(const struct ggml_tensor * op) {
    if (ggml_bitcos_is_type(op->type)) {
        return true;
    }
    for (int i = 0; i < GGML_MAX_SRC; ++i) {
        if (op->src[i] && ggml_bitcos_is_type(op->src[i]->type)) {
            return true;
        }
    }
    return false;
}

struct ggml_tensor * ggml_bitcos_companion(const struct ggml_tensor * w) {
    const struct ggml_tensor * base = w->view_src ? w->view_src : w;
    // only a leaf weight carries the link; an op result with a BITCOS type has src[0] = its operand
    if (base->op != GGML_OP_NONE || !ggml_bitcos_is_type(base->type)) {
        return NULL;
    }
    struct ggml_tensor * c = base->src[0];
    if (c == NULL || c->type != GGML_TYPE_I8) {
        return NULL;
    }
    return c;
}

bool ggml_bitcos_row_map(const struct ggml_tensor * w, int64_t * row0, int64_t step[3]) {
    const struct ggml_tensor * base = w->view_src ? w->view_src : w;
    const size_t               rb   = base->nb[1];
    if (w->ne[0] != base->ne[0] || w->nb[0] != base->nb[0] || rb == 0) {
        return false;
    }
    const size_t offs = w->view_src ? w->view_offs : 0;
    if (offs % rb != 0 || w->nb[1] % rb != 0 || w->nb[2] % rb != 0 || w->nb[3] % rb != 0) {
        return false;
    }
    *row0   = (int64_t) (offs / rb);
    step[0] = (int64_t) (w->nb[1] / rb);
    step[1] = (int64_t) (w->nb[2] / rb);
    step[2] = (int64_t) (w->nb[3] / rb);
    return true;
}

bool ggml_bitcos_gpu_supports_op(const struct ggml_tensor * op) {
    switch (op->op) {
        case GGML_OP_NONE: // the weight itself as a scheduler asks about it: storage, no computation
        case GGML_OP_RESHAPE:
        case GGML_OP_VIEW:
        case GGML_OP_PERMUTE:
        case GGML_OP_TRANSPOSE:
            return true;
        case GGML_OP_MUL_MAT:
        case GGML_OP_MUL_MAT_ID:
            break;
        default:
            return false;
    }
    const struct ggml_tensor * src0 = op->src[0];
    const struct ggml_tensor * src1 = op->src[1];
    // every BITCOS type: version 1 (whole 128-weight blocks) and version 2 (GGML_TYPE_BITCOS, rows of whole
    // 32-weight blocks; the GPU kernels read the variant and its scales from the companion header and stop a
    // row's partial last 128-weight unit at K)
    if (src0 == NULL || src1 == NULL || !ggml_bitcos_is_type(src0->type) || ggml_bitcos_companion(src0) == NULL ||
        !ggml_is_contiguous(src0) || src0->ne[0] % ggml_blck_size(src0->type) != 0) {
        return false;
    }
    if (src0->view_src != NULL) {
        // a view: consecutive whole rows of a 2-D weight (e.g. a slice of a fused projection), MUL_MAT only;
        // the kernels then read the base weight from the view's first row
        const struct ggml_tensor * base = src0->view_src;
        int64_t                    row0, step[3];
        if (op->op != GGML_OP_MUL_MAT || !ggml_bitcos_row_map(src0, &row0, step) || step[0] != 1 ||
            base->ne[2] * base->ne[3] != 1 || src0->ne[2] * src0->ne[3] != 1) {
            return false;
        }
    }
    if (src1->type != GGML_TYPE_F32 || op->type != GGML_TYPE_F32 || src1->nb[0] != sizeof(float) ||
        src1->nb[1] % sizeof(float) != 0 || src1->nb[2] % sizeof(float) != 0 || src1->nb[3] % sizeof(float) != 0 ||
        !ggml_is_contiguous(op)) {
        return false;
    }
    if (op->op == GGML_OP_MUL_MAT) {
        return src1->ne[2] % src0->ne[2] == 0 && src1->ne[3] % src0->ne[3] == 0;
    }
    const struct ggml_tensor * ids = op->src[2];
    return ids != NULL && ids->type == GGML_TYPE_I32 && ids->nb[0] == sizeof(int32_t) &&
           ids->nb[1] % sizeof(int32_t) == 0 && src1->ne[3] == 1 && src0->ne[3] == 1;
}

size_t ggml_bitcos_companion_weight_name_len(const char * name) {
    const size_t n  = strlen(name);
    const size_t ns = strlen(BITCOS_COMPANION_SUFFIX);
    return n > ns && strcmp(name + n - ns, BITCOS_COMPANION_SUFFIX) == 0 ? n - ns : 0;
}

bool ggml_bitcos_link(struct ggml_tensor * w, struct ggml_tensor * c, char * err, size_t err_size) {
    if (!ggml_bitcos_is_type(w->type)) {
        snprintf(err, err_size, "tensor '%s' is not a BITCOS tensor (type %d)", ggml_get_name(w), (int) w->type);
        return false;
    }
    if (c == NULL) {
        snprintf(err, err_size, "BITCOS tensor '%s' has no companion tensor '%s%s'", ggml_get_name(w), ggml_get_name(w),
                 BITCOS_COMPANION_SUFFIX);
        return false;
    }
    if (c->type != GGML_TYPE_I8 || ggml_n_dims(c) != 1) {
        snprintf(err, err_size, "companion tensor '%s' must be a 1-D I8 tensor", ggml_get_name(c));
        return false;
    }
    w->src[0] = c;
    return true;
}

// Host-readable data of `t`: t->data itself in a host buffer, else a malloc'd copy returned in *copy.
static const void * host_data(const struct ggml_tensor * t, void ** copy) {
    *copy = NULL;
    if (ggml_backend_buffer_is_host(t->buffer)) {
        return t->data;
    }
    *copy = malloc(ggml_nbytes(t));
    if (*copy != NULL) {
        ggml_backend_tensor_get(t, *copy, 0, ggml_nbytes(t));
    }
    return *copy;
}

bool ggml_bitcos_validate_tensor(const struct ggml_tensor * w, char * err, size_t err_size) {
    const struct ggml_tensor * c = w->src[0];
    if (c == NULL || w->buffer == NULL || c->buffer == NULL) {
        snprintf(err, err_size, "companion not loaded");
        return false;
    }
    if (ggml_bitcos_is_codes_buffer(w->buffer)) {
        // decoded into the codes form at load: the buffer validated both tensors before decoding and kept no
        // BITCOS bytes to check again; its verdict is in the weight's allocation
        struct ggml_bitcos_codes_state st;
        memcpy(&st, (const char *) w->data + ggml_bitcos_codes_state_offset(w), sizeof st);
        if (st.status == GGML_BITCOS_CODES_READY) {
            return true;
        }
        snprintf(err, err_size, "%s",
                 st.status == GGML_BITCOS_CODES_INVALID ?
                     st.error :
                     "the weight or its companion was never loaded into the 2-bit form's buffer");
        return false;
    }
    void *       wcopy, *ccopy;
    const void * wdata = host_data(w, &wcopy);
    const void * cdata = host_data(c, &ccopy);
    bool         ok;
    if (wdata == NULL || cdata == NULL) {
        snprintf(err, err_size, "out of memory for a host copy of the tensor (%zu + %zu bytes)", ggml_nbytes(w),
                 ggml_nbytes(c));
        ok = false;
    } else {
        ok = ggml_bitcos_validate(w, wdata, cdata, ggml_nbytes(c), err, err_size);
    }
    free(wcopy);
    free(ccopy);
    return ok;
}

bool ggml_bitcos_check_use(const struct ggml_tensor * w, enum ggml_op op, bool lazy, char * err, size_t err_size) {
    if (!ggml_bitcos_is_type(w->type)) {
        return true;
    }
    if (op != GGML_OP_MUL_MAT && op != GGML_OP_MUL_MAT_ID) {
        return ggml_bitcos_fail(err, err_size,
                                "BITCOS tensor '%s' (%s) is used with %s by this model architecture; a BITCOS "
                                "type is only valid on the weight of a matrix multiplication (MUL_MAT / MUL_MAT_ID)",
                                ggml_get_name(w), ggml_type_name(w->type), ggml_op_name(op));
    }
    if (lazy) {
        return ggml_bitcos_fail(err, err_size,
                                "BITCOS tensor '%s' (%s) would be read lazily (--lazy-mode); BITCOS weights "
                                "are loaded and validated in full: use --lazy-mode off",
                                ggml_get_name(w), ggml_type_name(w->type));
    }
    return true;
}

static bool is_view_op(enum ggml_op op) {
    return op == GGML_OP_NONE || op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE ||
           op == GGML_OP_TRANSPOSE;
}

bool ggml_bitcos_graph_check(struct ggml_cgraph * graph, struct ggml_backend ** backends, int n_backends, char * err,
                             size_t err_size) {
    for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
        const struct ggml_tensor * node = ggml_graph_node(graph, i);
        if (!ggml_bitcos_op_involves(node) || is_view_op(node->op)) {
            continue;
        }
        // the BITCOS operand (a weight or a view of one), named by its base tensor
        const struct ggml_tensor * w = ggml_bitcos_is_type(node->type) ? node : NULL;
        for (int j = 0; j < GGML_MAX_SRC && w == NULL; ++j) {
            if (node->src[j] && ggml_bitcos_is_type(node->src[j]->type)) {
                w = node->src[j];
            }
        }
        const struct ggml_tensor * base = w->view_src ? w->view_src : w;
        if ((node->op != GGML_OP_MUL_MAT && node->op != GGML_OP_MUL_MAT_ID) || node->src[0] != w) {
            return ggml_bitcos_fail(err, err_size,
                                    "BITCOS tensor '%s' is used with %s in node '%s'; a BITCOS type is only "
                                    "valid on the weight (src0) of a matrix multiplication (MUL_MAT / MUL_MAT_ID)",
                                    ggml_get_name(base), ggml_op_desc(node), ggml_get_name(node));
        }
        const ggml_backend_buffer_t buf  = base->buffer;
        bool                        runs = false;
        for (int b = 0; b < n_backends && !runs; ++b) {
            runs = (buf == NULL || ggml_backend_supports_buft(backends[b], ggml_backend_buffer_get_type(buf))) &&
                   ggml_backend_supports_op(backends[b], node);
        }
        if (!runs) {
            return ggml_bitcos_fail(err, err_size,
                                    "no backend can run %s '%s' on BITCOS tensor '%s' where it is stored (%s): "
                                    "the companion is missing, the operand is not whole rows of the weight, or the "
                                    "activations are not F32",
                                    ggml_op_desc(node), ggml_get_name(node), ggml_get_name(base),
                                    buf ? ggml_backend_buffer_name(buf) : "no buffer");
        }
    }
    return true;
}

// --- the 2-bit codes form's layout (ggml-cpu's CPU_BITCOS_2BIT buffer) ----------------------------------

bool ggml_bitcos_is_codes_buffer(struct ggml_backend_buffer * buffer) {
    return buffer != NULL &&
           strcmp(ggml_backend_buft_name(ggml_backend_buffer_get_type(buffer)), GGML_BITCOS_CODES_BUFT_NAME) == 0;
}

static size_t pad64(size_t x) {
    return (x + 63) & ~(size_t) 63;
}

static int64_t codes_rows(const struct ggml_tensor * w) {
    return w->ne[1] * w->ne[2] * w->ne[3];
}

size_t ggml_bitcos_codes_bytes(const struct ggml_tensor * w) {
    return pad64(bitcos_codes_row_bytes(w->ne[0]) * (size_t) codes_rows(w));
}

size_t ggml_bitcos_codes_state_offset(const struct ggml_tensor * w) {
    return ggml_bitcos_codes_bytes(w);
}

size_t ggml_bitcos_codes_companion_offset(const struct ggml_tensor * w) {
    return ggml_bitcos_codes_state_offset(w) + pad64(sizeof(struct ggml_bitcos_codes_state));
}

size_t ggml_bitcos_codes_alloc_size(const struct ggml_tensor * w) {
    // the companion's header and scales section for the largest variant the weight's type may hold, and for
    // v1 G128 the block scales copied out of its bitmap blocks (2 bytes per 128 weights). The codes buffer asks
    // for huge pages, so unused room costs memory: each type gets only what its variants can use.
    const size_t rows   = (size_t) codes_rows(w);
    const size_t blocks = (size_t) ((w->ne[0] + 127) / 128) * rows;
    const size_t mats   = (size_t) (w->ne[2] * w->ne[3]);
    size_t       scales = 0, g128 = 0;
    if (w->type == GGML_TYPE_BITCOS_G128) {
        g128 = 2 * blocks;
    } else if (w->type == GGML_TYPE_BITCOS_PT) {
        scales = 4 * mats;
    } else { // MATRIX: 4 per matrix; ROW: 4 per row; B128 / B256: 2 per 128 / 256 weights
        scales = 2 * blocks > 4 * rows ? 2 * blocks : 4 * rows;
    }
    return ggml_bitcos_codes_companion_offset(w) + pad64(BITCOS_HEADER_BYTES + scales) + pad64(g128);
}

double ggml_bitcos_codes_decode_seconds(const struct ggml_tensor * w) {
    if (!ggml_bitcos_is_codes_buffer(w->buffer)) {
        return -1.0;
    }
    struct ggml_bitcos_codes_state st;
    memcpy(&st, (const char *) w->data + ggml_bitcos_codes_state_offset(w), sizeof st);
    return (double) st.decode_ns * 1e-9;
}

// op_params[0]: a tag saying the hint was set; op_params[1]: the density as a float
#define BITCOS_ZHINT_TAG 0x7a424354 // "TCBz"

void ggml_bitcos_set_model_zero_density(struct ggml_tensor * w, float z) {
    const int32_t tag = BITCOS_ZHINT_TAG;
    memcpy(w->op_params, &tag, sizeof tag);
    memcpy((char *) w->op_params + sizeof tag, &z, sizeof z);
}

float ggml_bitcos_model_zero_density(const struct ggml_tensor * w) {
    const struct ggml_tensor * base = w->view_src ? w->view_src : w;
    int32_t                    tag;
    float                      z;
    memcpy(&tag, base->op_params, sizeof tag);
    memcpy(&z, (const char *) base->op_params + sizeof tag, sizeof z);
    return tag == BITCOS_ZHINT_TAG && z >= 0.0f && z <= 1.0f ? z : -1.0f;
}

// --- TQ2_0-exact weights (devices without BITCOS kernels) ---------------------------------------------

size_t ggml_bitcos_tq2_0_exact_bytes(const void * header) {
    struct ggml_bitcos_header h;
    ggml_bitcos_read_header(header, &h);
    // the scales section (none in v1 G128) lies right after the header, the row index right after it
    const bool scales_here =
        h.variant == BITCOS_VARIANT_G128 ? h.scales_offset == 0 : h.scales_offset == BITCOS_HEADER_BYTES;
    if (h.magic != BITCOS_MAGIC || !scales_here || h.row_base_offset < BITCOS_HEADER_BYTES ||
        h.row_base_offset - BITCOS_HEADER_BYTES > ((uint64_t) 1 << 32)) {
        return 0;
    }
    return (size_t) h.row_base_offset;
}

static bool f16_exact(float s) {
    return ggml_fp16_to_fp32(ggml_fp32_to_fp16(s)) == s;
}

bool ggml_bitcos_tq2_0_exact(const struct ggml_tensor * w, const void * cdata, size_t cbytes, char * why,
                             size_t why_size) {
    const size_t need = cbytes >= BITCOS_HEADER_BYTES ? ggml_bitcos_tq2_0_exact_bytes(cdata) : 0;
    if (need == 0 || need > cbytes) {
        return ggml_bitcos_fail(why, why_size, "its companion header is not valid");
    }
    struct ggml_bitcos_header h;
    ggml_bitcos_read_header(cdata, &h);
    const uint64_t rows = (uint64_t) (w->ne[1] * w->ne[2] * w->ne[3]), mats = (uint64_t) (w->ne[2] * w->ne[3]);
    if (w->ne[0] % 256 != 0) {
        return ggml_bitcos_fail(why, why_size, "rows of %lld weights are not whole TQ2_0 blocks of 256",
                                (long long) w->ne[0]);
    }
    if (!ggml_bitcos_type_has_variant(w->type, h.variant) || h.n_cols != (uint64_t) w->ne[0] || h.n_rows != rows ||
        h.n_mats != mats || need - BITCOS_HEADER_BYTES < bitcos_scales_bytes(h.variant, h.n_cols, h.n_rows, h.n_mats)) {
        return ggml_bitcos_fail(why, why_size, "its companion header does not match the weight");
    }
    switch (h.variant) {
        case BITCOS_VARIANT_B256:
            return true;
        case BITCOS_VARIANT_PT:
        case BITCOS_VARIANT_MATRIX:
            for (uint64_t m = 0; m < mats; ++m) {
                if (!f16_exact(ggml_bitcos_matrix_scale(cdata, &h, m))) {
                    return ggml_bitcos_fail(why, why_size, "matrix %llu's scale is not an fp16 value",
                                            (unsigned long long) m);
                }
            }
            return true;
        case BITCOS_VARIANT_ROW:
            for (uint64_t r = 0; r < rows; ++r) {
                if (!f16_exact(ggml_bitcos_row_scale(cdata, &h, r))) {
                    return ggml_bitcos_fail(why, why_size, "row %llu's scale is not an fp16 value",
                                            (unsigned long long) r);
                }
            }
            return true;
        case BITCOS_VARIANT_B128:
            for (uint64_t r = 0; r < rows; ++r) {
                const uint8_t * sc = ggml_bitcos_block_scales(cdata, &h, r);
                for (int64_t b = 0; b < w->ne[0] / 256; ++b) {
                    if (memcmp(sc + 4 * b, sc + 4 * b + 2, 2) != 0) {
                        return ggml_bitcos_fail(why, why_size,
                                                "row %llu has two scales in one 256-weight block (B128 split scales)",
                                                (unsigned long long) r);
                    }
                }
            }
            return true;
        default: // v1 G128: its scales are in the weight's blocks, which are not read before the buffer is chosen
            return ggml_bitcos_fail(why, why_size,
                                    "a version-1 G128 weight (its scales are not checked before loading)");
    }
}
