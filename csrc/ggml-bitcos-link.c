// ggml-bitcos-link: BITCOS weights as ggml tensors - the companion link (src[0]), views of a weight as rows
// of its base tensor, and the loader's link and post-load check (docs/FORMAT.md §1). Compiled into
// ggml-base by the type-ids patch; the llama.cpp loader calls these (loader patch) so that it carries no
// BITCOS logic of its own. Byte-level validation is ggml-bitcos.c.
#include "ggml-bitcos.h"
#include "ggml-backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    const size_t rb = base->nb[1];
    if (w->ne[0] != base->ne[0] || w->nb[0] != base->nb[0] || rb == 0) {
        return false;
    }
    const size_t offs = w->view_src ? w->view_offs : 0;
    if (offs % rb != 0 || w->nb[1] % rb != 0 || w->nb[2] % rb != 0 || w->nb[3] % rb != 0) {
        return false;
    }
    *row0   = (int64_t)(offs / rb);
    step[0] = (int64_t)(w->nb[1] / rb);
    step[1] = (int64_t)(w->nb[2] / rb);
    step[2] = (int64_t)(w->nb[3] / rb);
    return true;
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
        snprintf(err, err_size, "BITCOS tensor '%s' has no companion tensor '%s%s'",
                 ggml_get_name(w), ggml_get_name(w), BITCOS_COMPANION_SUFFIX);
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
    void * wcopy, * ccopy;
    const void * wdata = host_data(w, &wcopy);
    const void * cdata = host_data(c, &ccopy);
    bool ok;
    if (wdata == NULL || cdata == NULL) {
        snprintf(err, err_size, "out of memory for a host copy of the tensor (%zu + %zu bytes)",
                 ggml_nbytes(w), ggml_nbytes(c));
        ok = false;
    } else {
        ok = ggml_bitcos_validate(w, wdata, cdata, ggml_nbytes(c), err, err_size);
    }
    free(wcopy);
    free(ccopy);
    return ok;
}
