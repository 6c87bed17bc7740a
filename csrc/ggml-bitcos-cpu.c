// ggml-bitcos CPU glue: BITCOS src0 in ggml-cpu's MUL_MAT and MUL_MAT_ID (docs/FORMAT.md, versions 1 and 2).
//
// Both ops run in two phases separated by one barrier:
//   1. every thread quantizes its share of the src1 rows to Q8_K into the work buffer (rows whose length is
//      not a multiple of 256 are quantized from a zero-padded copy: the padding's q are 0, and the kernels
//      treat the weights past K as absent);
//   2. the output rows are cut into runs of up to BITCOS_RUN rows; each thread takes a contiguous range of
//      runs and calls the best kernel of the kernel table (bitcos-kernels.h) once per run and column chunk, with the
//      run's sign_pos array filled from the companion's row index and its scales described for the variant of the
//      weight's companion header (a row_scale array, or where the fp16 block scales are).
// Threads split output rows, never K, so every dst value is computed by one kernel call in the contract's
// order: results do not depend on the thread count.
#include "ggml-bitcos-cpu.h"
#include "ggml-bitcos.h"
#include "bitcos-kernels.h"

#include "ggml-cpu-impl.h"
#define GGML_COMMON_DECL_C
#include "ggml-common.h" // block_q8_K, QK_K: checked against the kernels' bitcos_q8_K below

#include <string.h>

// ggml-cpu's Q8_K quantizer (ggml-cpu/quants.h; the arch-specific version under the same name)
void quantize_row_q8_K(const float * GGML_RESTRICT x, void * GGML_RESTRICT y, int64_t k);

#define BITCOS_RUN  64 // rows per kernel call (bounds the sign_pos array on the stack)
#define BITCOS_COLS 64 // columns per kernel call (bounds the pointer arrays on the stack)

_Static_assert(sizeof(bitcos_q8_K) == sizeof(block_q8_K) && BITCOS_Q8K_BLOCK == QK_K,
               "bitcos_q8_K must match ggml's block_q8_K");

// The kernel table's lines: which kernel runs (once per process), and when the best kernel does not cover a
// weight's layout and the portable one runs it.
static void bitcos_cpu_log(const char * text) {
    GGML_LOG_WARN("%s", text);
}

static size_t pad64(size_t x) {
    return (x + 63) & ~(size_t) 63;
}

bool ggml_bitcos_cpu_supports_op(const struct ggml_tensor * op) {
    if (op->op != GGML_OP_MUL_MAT && op->op != GGML_OP_MUL_MAT_ID) {
        return false;
    }
    const struct ggml_tensor * src0 = op->src[0];
    const struct ggml_tensor * src1 = op->src[1];
    if (!ggml_bitcos_is_type(src0->type) || src1->type != GGML_TYPE_F32 || op->type != GGML_TYPE_F32) {
        return false;
    }
    // K: whole ggml blocks (128 weights for the version-1 types, 32 for GGML_TYPE_BITCOS); the variant's
    // stricter multiple (B128, B256) was checked against the header when the weight was loaded
    if (src1->nb[0] != sizeof(float) || src0->ne[0] % ggml_blck_size(src0->type) != 0) {
        return false;
    }
    int64_t row0, step[3];
    if (ggml_bitcos_companion(src0) == NULL || !ggml_bitcos_row_map(src0, &row0, step)) {
        return false;
    }
    if (op->op == GGML_OP_MUL_MAT_ID && (op->src[2]->type != GGML_TYPE_I32 || src1->ne[3] != 1)) {
        return false;
    }
    return true;
}

// Work buffer: [Q8_K rows of src1][per-thread zero-padded float row][MUL_MAT_ID: expert row lists]
struct bitcos_work {
    size_t q_row_bytes; // Q8_K bytes per src1 row
    size_t q_bytes;     // all quantized rows, padded
    size_t pad_bytes;   // per-thread padded float row (0 when K % 256 == 0)
    size_t ids_offset;  // MUL_MAT_ID: offset of counts[n_as] + pairs[n_as][n_slots]
    size_t total;
};

static struct bitcos_work bitcos_work_layout(const struct ggml_tensor * node, int n_threads) {
    const struct ggml_tensor * src1 = node->src[1];
    const int64_t              k    = src1->ne[0];
    const int64_t              nbq  = (k + BITCOS_Q8K_BLOCK - 1) / BITCOS_Q8K_BLOCK;
    struct bitcos_work         L;
    L.q_row_bytes = (size_t) nbq * sizeof(bitcos_q8_K);
    L.q_bytes     = pad64(L.q_row_bytes * (size_t) (src1->ne[1] * src1->ne[2] * src1->ne[3]));
    L.pad_bytes   = k % BITCOS_Q8K_BLOCK == 0 ? 0 : pad64((size_t) nbq * BITCOS_Q8K_BLOCK * sizeof(float));
    L.ids_offset  = L.q_bytes + L.pad_bytes * (size_t) n_threads;
    L.total       = L.ids_offset;
    if (node->op == GGML_OP_MUL_MAT_ID) {
        const struct ggml_tensor * ids     = node->src[2];
        const int64_t              n_as    = node->src[0]->ne[2];
        const int64_t              n_slots = ids->ne[0] * ids->ne[1];
        L.total += pad64((size_t) n_as * sizeof(int64_t)) + (size_t) (n_as * n_slots) * 2 * sizeof(int32_t);
    }
    L.total += 64; // slack for aligning wdata
    return L;
}

size_t ggml_bitcos_cpu_work_size(const struct ggml_tensor * node, int n_threads) {
    return bitcos_work_layout(node, n_threads).total;
}

// Phase 1: quantize src1 rows ith, ith+nth, ... to Q8_K.
static void bitcos_quantize_src1(const struct ggml_compute_params * params, const struct ggml_tensor * src1,
                                 uint8_t * wbase, const struct bitcos_work * L) {
    const int64_t k   = src1->ne[0];
    const int64_t nbq = (k + BITCOS_Q8K_BLOCK - 1) / BITCOS_Q8K_BLOCK;
    const int64_t n1 = src1->ne[1], n2 = src1->ne[2], n3 = src1->ne[3];
    float *       pad = L->pad_bytes ? (float *) (wbase + L->q_bytes + L->pad_bytes * (size_t) params->ith) : NULL;
    for (int64_t j = params->ith; j < n1 * n2 * n3; j += params->nth) {
        const int64_t i11 = j % n1, i12 = (j / n1) % n2, i13 = j / (n1 * n2);
        const float * x =
            (const float *) ((const char *) src1->data + i11 * src1->nb[1] + i12 * src1->nb[2] + i13 * src1->nb[3]);
        void * q = wbase + (size_t) j * L->q_row_bytes;
        if (pad == NULL) {
            quantize_row_q8_K(x, q, k);
        } else {
            memcpy(pad, x, (size_t) k * sizeof(float));
            memset(pad + k, 0, (size_t) (nbq * BITCOS_Q8K_BLOCK - k) * sizeof(float));
            quantize_row_q8_K(pad, q, nbq * BITCOS_Q8K_BLOCK);
        }
    }
}

// The weight as seen by the kernels: data, companion and how view rows map to companion rows. A weight in the
// 2-bit codes form (ggml-bitcos-cpu-codes.cpp's buffer) has its codes at codes + base row * codes_row_bytes and
// cdata is the copy of the companion's header and scales kept beside them (no sign pool).
struct bitcos_weight {
    const struct ggml_tensor * w;
    const uint8_t *            cdata;
    struct ggml_bitcos_header  hdr;
    int64_t                    row0, step[3];
    const uint8_t *            codes;       // NULL: the BITCOS form
    size_t                     codes_row_bytes;
    const uint8_t *            g128_scales; // codes form of v1 G128: the block scales copied out of its blocks
    size_t                     g128_scale_row;
};

static void bitcos_weight_init(struct bitcos_weight * bw, const struct ggml_tensor * w) {
    const struct ggml_tensor * comp = ggml_bitcos_companion(w);
    const struct ggml_tensor * base = w->view_src ? w->view_src : w;
    GGML_ASSERT(comp != NULL && "BITCOS weight without its companion tensor");
    GGML_ASSERT(ggml_bitcos_row_map(w, &bw->row0, bw->step));
    bw->w           = w;
    bw->cdata       = (const uint8_t *) comp->data;
    bw->codes       = NULL;
    bw->g128_scales = NULL;
    if (ggml_bitcos_is_codes_buffer(base->buffer)) {
        struct ggml_bitcos_codes_state st;
        memcpy(&st, (const char *) base->data + ggml_bitcos_codes_state_offset(base), sizeof st);
        GGML_ASSERT(st.status == GGML_BITCOS_CODES_READY && "BITCOS weight in the 2-bit form was not decoded");
        bw->codes           = (const uint8_t *) base->data;
        bw->codes_row_bytes = bitcos_codes_row_bytes(base->ne[0]);
        bw->cdata           = (const uint8_t *) base->data + ggml_bitcos_codes_companion_offset(base);
        if (st.g128_scale_row != 0) {
            bw->g128_scales    = bw->cdata + st.g128_scales;
            bw->g128_scale_row = st.g128_scale_row;
        }
    }
    ggml_bitcos_read_header(bw->cdata, &bw->hdr);
    // cheap consistency check; the full validation ran at load time (ggml_bitcos_validate)
    GGML_ASSERT(bw->hdr.magic == BITCOS_MAGIC && bw->hdr.n_cols == (uint64_t) w->ne[0] && bw->hdr.n_mats > 0 &&
                ggml_bitcos_type_has_variant(w->type, bw->hdr.variant));
}

// The codes form's part of bitcos_run_rows: n rows from base row g0 (step[0] base rows apart), written at dst[c] + d0.
static void bitcos_run_codes(const struct bitcos_weight * bw, int64_t g0, int64_t n, const float * row_scale,
                             const bitcos_q8_K * const * y, float * const * dst, int64_t nc, int64_t d0,
                             const bitcos_kernel * kernel) {
    const int         variant = bw->hdr.variant;
    bitcos_codes_rows rows;
    memset(&rows, 0, sizeof rows);
    rows.k         = bw->w->ne[0];
    rows.codes     = bw->codes + (size_t) g0 * bw->codes_row_bytes;
    rows.row_bytes = bw->codes_row_bytes * (size_t) bw->step[0];
    if (bitcos_variant_scale_block(variant) == 0) {
        rows.row_scale = row_scale;
    } else if (variant == BITCOS_VARIANT_G128) {
        rows.block_scale     = bw->g128_scales + (size_t) g0 * bw->g128_scale_row;
        rows.scale_stride    = sizeof(uint16_t);
        rows.scale_row_bytes = bw->g128_scale_row * (size_t) bw->step[0];
    } else {
        rows.block_scale       = ggml_bitcos_block_scales(bw->cdata, &bw->hdr, (uint64_t) g0);
        rows.scale_stride      = sizeof(uint16_t);
        rows.scale_row_bytes   = (size_t) (ggml_bitcos_scale_row_bytes(&bw->hdr) * (uint64_t) bw->step[0]);
        rows.block_scale_shift = variant == BITCOS_VARIANT_B256 ? 1 : 0;
    }
    float * dcol[BITCOS_COLS];
    for (int64_t c0 = 0; c0 < nc; c0 += BITCOS_COLS) {
        const int64_t cn = nc - c0 < BITCOS_COLS ? nc - c0 : BITCOS_COLS;
        for (int64_t c = 0; c < cn; ++c) {
            dcol[c] = dst[c0 + c] + d0;
        }
        bitcos_kernel_codes_mm(kernel, &rows, n, y + c0, cn, dcol);
    }
}

// dst[c][i - r0] = W(i, i2, i3) . y[c] for rows r0 <= i < r1 of matrix (i2, i3) of the weight (view).
static void bitcos_run_rows(const struct bitcos_weight * bw, int64_t i2, int64_t i3, int64_t r0, int64_t r1,
                            const bitcos_q8_K * const * y, float * const * dst, int64_t nc) {
    const struct ggml_tensor * w       = bw->w;
    // what this CPU variant's flags compiled in; named once per process ("BITCOS CPU kernel: <name>")
    const bitcos_kernel *      kernel  = bitcos_kernel_best_told(bitcos_cpu_log);
    const int                  variant = bw->hdr.variant;
    const int64_t              sblk    = bitcos_variant_scale_block(variant); // 0: a scale per row / matrix
    uint64_t                   sign_pos[BITCOS_RUN];
    float                      row_scale[BITCOS_RUN];
    float *                    dcol[BITCOS_COLS];
    int64_t                    r = r0;
    while (r < r1) {
        // base-tensor row of the run's first row; the run's rows are step[0] base rows apart
        const int64_t g0 = bw->row0 + r * bw->step[0] + i2 * bw->step[1] + i3 * bw->step[2];
        const int64_t n  = r1 - r < BITCOS_RUN ? r1 - r : BITCOS_RUN;
        for (int64_t j = 0; j < n; ++j) {
            const uint64_t g = (uint64_t) (g0 + j * bw->step[0]);
            if (bw->codes == NULL) {
                sign_pos[j] = ggml_bitcos_sign_pos(bw->cdata, &bw->hdr, g);
            }
            if (sblk == 0) {
                row_scale[j] = ggml_bitcos_row_scale(bw->cdata, &bw->hdr, g);
            }
        }
        if (bw->codes != NULL) {
            bitcos_run_codes(bw, g0, n, row_scale, y, dst, nc, r - r0, kernel);
            r += n;
            continue;
        }
        bitcos_rows rows;
        memset(&rows, 0, sizeof rows);
        rows.k          = w->ne[0];
        rows.bits       = (const uint8_t *) w->data + r * w->nb[1] + i2 * w->nb[2] + i3 * w->nb[3];
        rows.unit_bytes = bitcos_block_bytes(variant);
        rows.row_bytes  = w->nb[1];
        rows.pool       = bw->cdata + bw->hdr.pool_offset;
        rows.sign_pos   = sign_pos;
        if (sblk == 0) {
            rows.row_scale = row_scale; // PT / MATRIX: the matrix's scale per row; ROW: each row's own
        } else if (variant == BITCOS_VARIANT_G128) {
            // v1: the fp16 scale sits after each 128-weight unit's bitmap, in the weight's blocks
            rows.block_scale     = rows.bits + offsetof(block_bitcos_g128, d);
            rows.scale_stride    = sizeof(block_bitcos_g128);
            rows.scale_row_bytes = rows.row_bytes;
        } else {
            // B128 / B256: fp16 scales in the companion, one row of them per base row (views step over rows)
            rows.block_scale       = ggml_bitcos_block_scales(bw->cdata, &bw->hdr, (uint64_t) g0);
            rows.scale_stride      = sizeof(uint16_t);
            rows.scale_row_bytes   = (size_t) (ggml_bitcos_scale_row_bytes(&bw->hdr) * (uint64_t) bw->step[0]);
            rows.block_scale_shift = variant == BITCOS_VARIANT_B256 ? 1 : 0;
        }
        for (int64_t c0 = 0; c0 < nc; c0 += BITCOS_COLS) {
            const int64_t cn = nc - c0 < BITCOS_COLS ? nc - c0 : BITCOS_COLS;
            for (int64_t c = 0; c < cn; ++c) {
                dcol[c] = dst[c0 + c] + (r - r0);
            }
            bitcos_kernel_mm(kernel, &rows, n, y + c0, cn, dcol, bitcos_cpu_log);
        }
        r += n;
    }
}

static uint8_t * bitcos_wdata(const struct ggml_compute_params * params, size_t need) {
    uint8_t * p = (uint8_t *) (((uintptr_t) params->wdata + 63) & ~(uintptr_t) 63);
    GGML_ASSERT(p + need <= (uint8_t *) params->wdata + params->wsize && "BITCOS: work buffer too small");
    return p;
}

void ggml_bitcos_cpu_mul_mat(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];
    GGML_ASSERT(src1->type == GGML_TYPE_F32 && src1->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float));
    GGML_ASSERT(src0->ne[0] == src1->ne[0] && dst->ne[0] == src0->ne[1] && dst->ne[1] == src1->ne[1]);
    GGML_ASSERT(src1->ne[2] % src0->ne[2] == 0 && src1->ne[3] % src0->ne[3] == 0);

    const struct bitcos_work L     = bitcos_work_layout(dst, params->nth);
    uint8_t *                wbase = bitcos_wdata(params, L.ids_offset);
    bitcos_quantize_src1(params, src1, wbase, &L);
    ggml_barrier(params->threadpool);

    struct bitcos_weight bw;
    bitcos_weight_init(&bw, src0);

    const int64_t n_rows   = src0->ne[1];
    const int64_t n_chunks = (n_rows + BITCOS_RUN - 1) / BITCOS_RUN;
    const int64_t ne12 = src1->ne[2], ne13 = src1->ne[3], ne11 = src1->ne[1];
    const int64_t r2 = ne12 / src0->ne[2], r3 = ne13 / src0->ne[3];
    const int64_t n_units = n_chunks * ne12 * ne13;
    const int64_t u0      = n_units * params->ith / params->nth;
    const int64_t u1      = n_units * (params->ith + 1) / params->nth;

    const bitcos_q8_K * y[BITCOS_COLS];
    float *             d[BITCOS_COLS];
    for (int64_t u = u0; u < u1; ++u) {
        const int64_t mat = u / n_chunks, chunk = u % n_chunks;
        const int64_t i12 = mat % ne12, i13 = mat / ne12;
        const int64_t r0 = chunk * BITCOS_RUN;
        const int64_t r1 = r0 + BITCOS_RUN < n_rows ? r0 + BITCOS_RUN : n_rows;
        for (int64_t c0 = 0; c0 < ne11; c0 += BITCOS_COLS) {
            const int64_t cn = ne11 - c0 < BITCOS_COLS ? ne11 - c0 : BITCOS_COLS;
            for (int64_t c = 0; c < cn; ++c) {
                const int64_t i11 = c0 + c;
                y[c] = (const bitcos_q8_K *) (wbase + (size_t) ((i13 * ne12 + i12) * ne11 + i11) * L.q_row_bytes);
                d[c] = (float *) ((char *) dst->data + i11 * dst->nb[1] + i12 * dst->nb[2] + i13 * dst->nb[3]) + r0;
            }
            bitcos_run_rows(&bw, i12 / r2, i13 / r3, r0, r1, y, d, cn);
        }
    }
}

void ggml_bitcos_cpu_mul_mat_id(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];
    const struct ggml_tensor * ids  = dst->src[2];
    GGML_ASSERT(src1->type == GGML_TYPE_F32 && src1->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float));
    GGML_ASSERT(ids->type == GGML_TYPE_I32 && src1->ne[3] == 1 && src0->ne[3] == 1);
    GGML_ASSERT(src0->ne[0] == src1->ne[0] && dst->ne[0] == src0->ne[1]);

    const int64_t n_as    = src0->ne[2]; // experts
    const int64_t n_ids   = ids->ne[0];  // experts used per token
    const int64_t n_tok   = ids->ne[1];
    const int64_t ne11    = src1->ne[1]; // 1 (broadcast to every slot) or n_ids
    const int64_t n_slots = n_ids * n_tok;

    const struct bitcos_work L      = bitcos_work_layout(dst, params->nth);
    uint8_t *                wbase  = bitcos_wdata(params, L.total - 64);
    int64_t *                counts = (int64_t *) (wbase + L.ids_offset);
    int32_t *                pairs  = (int32_t *) (wbase + L.ids_offset + pad64((size_t) n_as * sizeof(int64_t)));

    bitcos_quantize_src1(params, src1, wbase, &L);
    if (params->ith == 0) {
        // group (slot, token) pairs by expert so each expert's rows are decoded once for all its columns
        memset(counts, 0, (size_t) n_as * sizeof(int64_t));
        for (int64_t t = 0; t < n_tok; ++t) {
            for (int64_t i = 0; i < n_ids; ++i) {
                const int32_t e = *(const int32_t *) ((const char *) ids->data + i * ids->nb[0] + t * ids->nb[1]);
                GGML_ASSERT(e >= 0 && e < n_as);
                int32_t * p = pairs + 2 * (e * n_slots + counts[e]++);
                p[0]        = (int32_t) i;
                p[1]        = (int32_t) t;
            }
        }
    }
    ggml_barrier(params->threadpool);

    struct bitcos_weight bw;
    bitcos_weight_init(&bw, src0);

    const int64_t n_rows   = src0->ne[1];
    const int64_t n_chunks = (n_rows + BITCOS_RUN - 1) / BITCOS_RUN;
    int64_t       n_units  = 0;
    for (int64_t e = 0; e < n_as; ++e) {
        n_units += counts[e] > 0 ? n_chunks : 0;
    }
    const int64_t u0 = n_units * params->ith / params->nth;
    const int64_t u1 = n_units * (params->ith + 1) / params->nth;

    const bitcos_q8_K * y[BITCOS_COLS];
    float *             d[BITCOS_COLS];
    int64_t             u = 0;
    for (int64_t e = 0; e < n_as && u < u1; ++e) {
        if (counts[e] == 0) {
            continue;
        }
        for (int64_t chunk = 0; chunk < n_chunks; ++chunk, ++u) {
            if (u < u0 || u >= u1) {
                continue;
            }
            const int64_t r0 = chunk * BITCOS_RUN;
            const int64_t r1 = r0 + BITCOS_RUN < n_rows ? r0 + BITCOS_RUN : n_rows;
            for (int64_t c0 = 0; c0 < counts[e]; c0 += BITCOS_COLS) {
                const int64_t cn = counts[e] - c0 < BITCOS_COLS ? counts[e] - c0 : BITCOS_COLS;
                for (int64_t c = 0; c < cn; ++c) {
                    const int32_t * p = pairs + 2 * (e * n_slots + c0 + c);
                    const int64_t   i = p[0], t = p[1];
                    y[c] = (const bitcos_q8_K *) (wbase + (size_t) (t * ne11 + i % ne11) * L.q_row_bytes);
                    d[c] = (float *) ((char *) dst->data + i * dst->nb[1] + t * dst->nb[2]) + r0;
                }
                bitcos_run_rows(&bw, e, 0, r0, r1, y, d, cn);
            }
        }
    }
}
