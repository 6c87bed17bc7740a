// test-bitcos-backend: BITCOS MUL_MAT / MUL_MAT_ID on a GPU backend (e.g. Vulkan0) against the CPU backend and
// against TQ2_0 on the same GPU backend.
//
//   test-bitcos-backend [DEVICE]        (default: the first GPU device; exit 77 when there is none)
//   test-bitcos-backend --list          (the devices this build sees)
//
// Built with the patched llama.cpp (the C-tools patch) and run by tests/test_vulkan.py on lavapipe. Random
// ternary weights (fixed seeds) are encoded with ggml_bitcos_encode() and linked to their companion, then the
// same graph runs on the device and on the CPU backend. Checks:
//   (1) device vs CPU: NMSE <= 5e-4 (test-backend-ops' bound for TQ2_0 MUL_MAT);
//   (2) device BITCOS vs device TQ2_0 holding the same codes and scales (a TQ2_0 tensor written here from the
//       codes): NMSE <= 5e-4 (ggml-vulkan's default BITCOS mat-vec shader rounds differently from TQ2_0);
//       under GGML_BITCOS_VULKAN_EXACT=1, whose mat-vec shader mirrors TQ2_0's arithmetic, bit-identical
//       wherever the device runs both through their mat-vec shaders (<= 8 columns, <= 8 tokens for
//       MUL_MAT_ID, K % 256 == 0), NMSE <= 5e-4 elsewhere (both then take their matrix-multiply paths).
//       Only on a device with a TQ2_0 MUL_MAT (ggml-vulkan); on ggml-cuda / ggml-sycl (1) alone.
// Cases: every variant the device runs (version 1: G128, PT; version 2: MATRIX, ROW, B128, B256, each
// skipped with a note while the device's supports_op refuses GGML_TYPE_BITCOS), zero density 0 / 0.4 / 1, K 96
// (MATRIX, ROW) / 128 / 384 / 2048 / 4224, as far as the variant allows, 1..70 columns (mat-vec up to 8, the
// tiled mul_mm beyond), broadcast batches, views of whole rows, MUL_MAT_ID with 4 experts.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "../bitcos-cpu-api.h" // csrc/ is copied next to tests/
#include "ggml-bitcos.h"
#include "bitcos-test.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// A ternary weight [k, n, mats]: codes and scales that TQ2_0 holds exactly: one fp16 scale per 256 weights
// (both 128-halves share it; empty 256-blocks get 0 as TQ2_0's quantizer gives them) for the block-scaled
// variants, or an fp16-exact scale per matrix (PT, MATRIX) or row (ROW), repeated per 256-block.
typedef struct {
    int            variant; // enum bitcos_variant
    enum ggml_type type;    // bitcos_variant_type_id(variant)
    int64_t        k, n, mats, rows;
    int8_t *       codes;   // rows * k
    uint16_t *     d16;     // rows * ceil(k/256): the 256-block scales, or the matrix / row scale repeated
    float *        fscale;  // PT / MATRIX: mats; ROW: rows
} weight;

static void weight_make(weight * w, int variant, int64_t k, int64_t n, int64_t mats, double z) {
    w->variant            = variant;
    w->type               = (enum ggml_type) bitcos_variant_type_id(variant);
    w->k                  = k;
    w->n                  = n;
    w->mats               = mats;
    w->rows               = n * mats;
    const int64_t nb256   = (k + 255) / 256;
    const bool    per_row = variant == BITCOS_VARIANT_ROW;
    const bool    per_mat = variant == BITCOS_VARIANT_PT || variant == BITCOS_VARIANT_MATRIX;
    const int64_t nf      = per_row ? w->rows : mats;
    w->codes              = malloc((size_t) (w->rows * k));
    w->d16                = malloc(sizeof(uint16_t) * (size_t) (w->rows * nb256));
    w->fscale             = malloc(sizeof(float) * (size_t) nf);
    for (int64_t m = 0; m < nf; ++m) {
        w->fscale[m] = ggml_fp16_to_fp32(ggml_fp32_to_fp16((float) (0.01 + 0.05 * rng_unit()))); // fp16-exact
    }
    for (int64_t i = 0; i < w->rows * k; ++i) {
        w->codes[i] = rng_unit() < z ? 0 : (rng_u64() & 1 ? 1 : -1);
    }
    for (int64_t r = 0; r < w->rows; ++r) {
        for (int64_t b = 0; b < nb256; ++b) {
            bool any = false;
            for (int64_t j = 256 * b; j < 256 * (b + 1) && j < k; ++j) {
                any |= w->codes[r * k + j] != 0;
            }
            const float d = per_row ? w->fscale[r] : per_mat ? w->fscale[r / n] : (float) (0.005 + 0.1 * rng_unit());
            // an empty 256-block gets d = 0 in TQ2_0 (its quantizer's choice), whatever BITCOS's scale: both then
            // give exactly 0 on a GPU (the CPU, whose TQ2_0-exact arithmetic rounds the lane products of an
            // all-zero block with the scale, would differ there from BITCOS's row / matrix scale)
            w->d16[r * nb256 + b] = any ? ggml_fp32_to_fp16(d) : 0;
        }
    }
}

static void weight_free(weight * w) {
    free(w->codes);
    free(w->d16);
    free(w->fscale);
}

// TQ2_0 blocks of the same codes and scales (k % 256 == 0): qs byte j % 32 + 32 * (j / 128) holds code j + 1
// at bit 2 * ((j % 128) / 32), then the fp16 scale.
static void * weight_tq2_0(const weight * w) {
    const int64_t nb  = w->k / 256;
    const size_t  bsz = ggml_type_size(GGML_TYPE_TQ2_0);
    uint8_t *     out = calloc((size_t) (w->rows * nb), bsz);
    for (int64_t r = 0; r < w->rows; ++r) {
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t * blk = out + (size_t) (r * nb + b) * bsz;
            for (int j = 0; j < 256; ++j) {
                blk[j % 32 + 32 * (j / 128)] |=
                    (uint8_t) ((w->codes[r * w->k + 256 * b + j] + 1) << (2 * ((j % 128) / 32)));
            }
            memcpy(blk + 64, &w->d16[r * nb + b], sizeof(uint16_t));
        }
    }
    return out;
}

// BITCOS weight data + companion of the same codes and scales.
static size_t weight_bitcos(const weight * w, void ** blocks, void ** comp) {
    const int64_t sblk = bitcos_variant_scale_block(w->variant), nb256 = (w->k + 255) / 256;
    const int64_t nbs = sblk ? w->k / sblk : 0;
    uint16_t *    bs  = malloc(sizeof(uint16_t) * (size_t) (w->rows * nbs + 1));
    for (int64_t r = 0; r < w->rows; ++r) {
        for (int64_t b = 0; b < nbs; ++b) {
            bs[r * nbs + b] = w->d16[r * nb256 + b * sblk / 256];
        }
    }
    *blocks = malloc(ggml_row_size(w->type, w->k) * (size_t) w->rows);
    const size_t cbytes =
        ggml_bitcos_encode(w->variant, w->k, w->rows, w->mats, w->codes, bs, w->fscale, *blocks, NULL, 0);
    *comp = malloc(cbytes);
    ggml_bitcos_encode(w->variant, w->k, w->rows, w->mats, w->codes, bs, w->fscale, *blocks, *comp, cbytes);
    free(bs);
    return cbytes;
}

// Whether `dev` runs MUL_MAT with a weight of `variant` (probed on a graph without data).
static bool device_runs(ggml_backend_t dev, int variant) {
    struct ggml_init_params ip  = { 8 * ggml_tensor_overhead(), NULL, true };
    struct ggml_context *   ctx = ggml_init(ip);
    const int64_t k = 2 * bitcos_variant_k_multiple(variant) > 256 ? 2 * bitcos_variant_k_multiple(variant) : 256;
    struct ggml_tensor * W = ggml_new_tensor_2d(ctx, (enum ggml_type) bitcos_variant_type_id(variant), k, 8);
    struct ggml_tensor * C = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, 4096);
    char                 err[256];
    bool                 ok = ggml_bitcos_link(W, C, err, sizeof(err));
    struct ggml_tensor * X  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, 1);
    ok                      = ok && ggml_backend_supports_op(dev, ggml_mul_mat(ctx, W, X));
    ggml_free(ctx);
    return ok;
}

// Whether the device runs TQ2_0 MUL_MAT at all (ggml-vulkan does; ggml-cuda and ggml-sycl have no TQ2_0 kernel):
// without it the (2) checks have nothing to compare with and BITCOS is checked against the CPU backend only.
static bool device_runs_tq2_0(ggml_backend_t dev) {
    struct ggml_init_params ip  = { 4 * ggml_tensor_overhead(), NULL, true };
    struct ggml_context *   ctx = ggml_init(ip);
    struct ggml_tensor *    W   = ggml_new_tensor_2d(ctx, GGML_TYPE_TQ2_0, 256, 8);
    struct ggml_tensor *    X   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, 1);
    const bool              ok  = ggml_backend_supports_op(dev, ggml_mul_mat(ctx, W, X));
    ggml_free(ctx);
    return ok;
}

static bool g_dev_tq2_0 = true; // set in main: device_runs_tq2_0

static const char * variant_name(int v) {
    static const char * names[BITCOS_VARIANT_COUNT] = { "G128", "PT", "MATRIX", "ROW", "B128", "B256" };
    return v >= 0 && v < BITCOS_VARIANT_COUNT ? names[v] : "?";
}

// One op: dst = mul_mat(W, X) or mul_mat_id(W, X, ids), W as BITCOS or as TQ2_0.
typedef struct {
    const weight * w;
    bool           id;
    int64_t        cols, b2, b3; // MUL_MAT: X is [k, cols, b2, b3] (W broadcast over b2 / w->mats, b3);
                                 // MUL_MAT_ID: X is [k, cols, tokens], cols = 1 (one input for every expert) or n_used
    int64_t        n_used, tokens; // MUL_MAT_ID: ids [n_used, tokens]
    float *        x;
    int32_t *      ids;
    int64_t        view_row0, view_rows; // MUL_MAT of rows [view_row0, view_row0 + view_rows) of W (view_rows 0: all)
} op_case;

static float * run(ggml_backend_t backend, const op_case * c, bool as_tq2_0) {
    const weight *          w      = c->w;
    struct ggml_init_params ip     = { 16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    struct ggml_context *   ctx    = ggml_init(ip);
    const enum ggml_type    wtype  = as_tq2_0 ? GGML_TYPE_TQ2_0 : w->type;
    struct ggml_tensor *    W      = c->id || w->mats > 1 ? ggml_new_tensor_3d(ctx, wtype, w->k, w->n, w->mats) :
                                                            ggml_new_tensor_2d(ctx, wtype, w->k, w->n);
    void *                  blocks = NULL, *comp_data = NULL;
    size_t                  cbytes = 0;
    struct ggml_tensor *    C      = NULL;
    if (!as_tq2_0) {
        cbytes = weight_bitcos(w, &blocks, &comp_data);
        C      = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t) cbytes);
        char err[256];
        if (!ggml_bitcos_link(W, C, err, sizeof(err))) {
            fprintf(stderr, "link: %s\n", err);
            exit(1);
        }
    } else {
        blocks = weight_tq2_0(w);
    }
    struct ggml_tensor *X, *ids = NULL, *out;
    if (c->id) {
        X   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, w->k, c->cols, c->tokens);
        ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, c->n_used, c->tokens);
        out = ggml_mul_mat_id(ctx, W, X, ids);
    } else {
        X = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, w->k, c->cols, c->b2, c->b3);
        struct ggml_tensor * Wv =
            c->view_rows == 0 ? W :
                                ggml_view_2d(ctx, W, w->k, c->view_rows, W->nb[1], (size_t) c->view_row0 * W->nb[1]);
        out = ggml_mul_mat(ctx, Wv, X);
    }
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    ggml_backend_tensor_set(W, blocks, 0, ggml_nbytes(W));
    if (C) {
        ggml_backend_tensor_set(C, comp_data, 0, cbytes);
        char err[256];
        if (!ggml_bitcos_validate_tensor(W, err, sizeof(err))) {
            fprintf(stderr, "validate: %s\n", err);
            exit(1);
        }
    }
    ggml_backend_tensor_set(X, c->x, 0, ggml_nbytes(X));
    if (ids) {
        ggml_backend_tensor_set(ids, c->ids, 0, ggml_nbytes(ids));
    }
    if (!ggml_backend_supports_op(backend, out)) {
        fprintf(stderr, "backend %s does not support %s of %s [%lld, %lld, %lld] by [%lld, %lld, %lld, %lld]\n",
                ggml_backend_name(backend), ggml_op_name(out->op), ggml_type_name(W->type), (long long) W->ne[0],
                (long long) W->ne[1], (long long) W->ne[2], (long long) X->ne[0], (long long) X->ne[1],
                (long long) X->ne[2], (long long) X->ne[3]);
        exit(1);
    }
    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "graph compute failed on %s\n", ggml_backend_name(backend));
        exit(1);
    }
    float * res = malloc(ggml_nbytes(out));
    ggml_backend_tensor_get(out, res, 0, ggml_nbytes(out));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    free(blocks);
    free(comp_data);
    return res;
}

// Normalized mean squared error, the norm floored at (1e-4)^2 per output (outputs here are of order 1): an
// all-zero weight (z = 1) gives exact 0 on the device (an empty 256-block contributes 0, as TQ2_0's d = 0 does
// there) but ~1e-8 on the CPU, whose TQ2_0-exact arithmetic rounds eight lane products separately.
static double nmse(const float * a, const float * ref, size_t n) {
    double err = 0, norm = 0;
    for (size_t i = 0; i < n; ++i) {
        err += ((double) a[i] - ref[i]) * ((double) a[i] - ref[i]);
        norm += (double) ref[i] * ref[i];
    }
    return err / fmax(norm, 1e-8 * (double) n);
}

// tq2: against TQ2_0 on the device: TQ2_NONE (the device has no TQ2_0 kernel for the shape), TQ2_CLOSE
// (NMSE), TQ2_EXACT (bit for bit). Only when K % 256 == 0 (TQ2_0's block).
enum tq2_check { TQ2_NONE, TQ2_CLOSE, TQ2_EXACT };

// GGML_BITCOS_VULKAN_EXACT=1: the device runs its TQ2_0-exact mat-vec shader (set in main)
static bool g_exact_matvec = false;

static void check_case(ggml_backend_t dev, ggml_backend_t cpu, const op_case * c, size_t n_out, enum tq2_check tq2,
                       const char * what) {
    if (tq2 == TQ2_EXACT && !g_exact_matvec) {
        tq2 = TQ2_CLOSE;
    }
    float *      d = run(dev, c, false);
    float *      h = run(cpu, c, false);
    const double e = nmse(d, h, n_out);
    CHECK(e <= 5e-4, "%s: device vs CPU NMSE %g", what, e);
    if (c->w->k % 256 == 0 && tq2 != TQ2_NONE && g_dev_tq2_0) {
        float * t = run(dev, c, true);
        if (tq2 == TQ2_EXACT) {
            size_t diff = 0;
            for (size_t i = 0; i < n_out; ++i) {
                diff += memcmp(&d[i], &t[i], sizeof(float)) != 0;
            }
            CHECK(diff == 0, "%s: %zu of %zu outputs differ from TQ2_0 on the device (first: %.9g vs %.9g)", what, diff,
                  n_out, d[0], t[0]);
        } else {
            const double et = nmse(d, t, n_out);
            CHECK(et <= 5e-4, "%s: device BITCOS vs device TQ2_0 NMSE %g", what, et);
        }
        free(t);
    }
    free(d);
    free(h);
}

static float * random_x(size_t n) {
    float * x = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; ++i) {
        x[i] = (float) (2.0 * rng_unit() - 1.0);
    }
    return x;
}

int main(int argc, char ** argv) {
    rng_seed(0x2545f4914f6cdd1dull);
    const char * exact = getenv("GGML_BITCOS_VULKAN_EXACT");
    g_exact_matvec     = exact != NULL && strcmp(exact, "1") == 0;
    bitcos_load_backends();
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
            ggml_backend_dev_t d = ggml_backend_dev_get(i);
            printf("%s\t%s\n", ggml_backend_dev_name(d), ggml_backend_dev_description(d));
        }
        return 0;
    }
    ggml_backend_dev_t devd = NULL;
    if (argc > 1) {
        devd = ggml_backend_dev_by_name(argv[1]);
    } else {
        devd = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU);
    }
    if (devd == NULL) {
        printf("no GPU device%s%s: skipped\n", argc > 1 ? " named " : "", argc > 1 ? argv[1] : "");
        return 77;
    }
    ggml_backend_t dev = ggml_backend_dev_init(devd, NULL);
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, NULL);
    printf("device: %s (%s)\n", ggml_backend_dev_name(devd), ggml_backend_dev_description(devd));
    printf("mat-vec against TQ2_0 on the device: %s\n", g_exact_matvec ? "bit for bit (exact shader)" : "NMSE");
    g_dev_tq2_0 = device_runs_tq2_0(dev);
    if (!g_dev_tq2_0) {
        printf("%s has no TQ2_0 MUL_MAT: BITCOS is checked against the CPU backend only\n",
               ggml_backend_dev_name(devd));
    }

    const double  zs[3]    = { 0.0, 0.4, 1.0 };
    const int64_t ks[5]    = { 96, 128, 384, 2048, 4224 };
    const int64_t colss[7] = { 1, 2, 5, 8, 9, 17, 70 }; // > 8: the tiled mul_mm (70: three column tiles)
    char          what[160];
    for (int ti = 0; ti < BITCOS_VARIANT_COUNT; ++ti) {
        const int variant = ti;
        if (!device_runs(dev, variant)) {
            printf("%s does not run BITCOS variant %d (type %s): skipped\n", ggml_backend_name(dev), variant,
                   ggml_type_name((enum ggml_type) bitcos_variant_type_id(variant)));
            continue;
        }
        const int64_t kmul = bitcos_variant_k_multiple(variant);
        for (int zi = 0; zi < 3; ++zi) {
            for (int ki = 0; ki < 5; ++ki) {
                const int64_t k = ks[ki], n = 37 + 16 * ki;
                if (k % kmul != 0) {
                    continue;
                }
                weight w;
                weight_make(&w, variant, k, n, 1, zs[zi]);
                for (int ci = 0; ci < 7; ++ci) {
                    op_case c = { &w, false, colss[ci], 1, 1, 0, 0, NULL, NULL, 0, 0 };
                    c.x       = random_x((size_t) (k * c.cols));
                    snprintf(what, sizeof(what), "variant %d z=%.1f k=%lld n=%lld cols=%lld", variant, zs[zi],
                             (long long) k, (long long) n, (long long) c.cols);
                    check_case(dev, cpu, &c, (size_t) (n * c.cols), c.cols <= 8 ? TQ2_EXACT : TQ2_CLOSE, what);
                    free(c.x);
                }
                weight_free(&w);
            }
        }
        // broadcast: 2 matrices over 4 batches (TQ2_0 too), and over 4 x 3 (ggml-vulkan's TQ2_0 refuses ne3
        // broadcasting; BITCOS runs it), then a single-row matrix
        for (int64_t b3 = 1; b3 <= 3; b3 += 2) {
            weight w;
            weight_make(&w, variant, 512, 45, 2, 0.4);
            op_case c = { &w, false, 1, 4, b3, 0, 0, NULL, NULL, 0, 0 };
            c.x       = random_x((size_t) (512 * 4 * b3));
            snprintf(what, sizeof(what), "%s broadcast 2 matrices over 4x%lld batches", variant_name(w.variant),
                     (long long) b3);
            check_case(dev, cpu, &c, (size_t) (45 * 4 * b3), b3 == 1 ? TQ2_EXACT : TQ2_NONE, what);
            free(c.x);
            weight_free(&w);
        }
        {
            weight w;
            weight_make(&w, variant, 256, 1, 1, 0.4);
            op_case c1 = { &w, false, 3, 1, 1, 0, 0, NULL, NULL, 0, 0 };
            c1.x       = random_x(256 * 3);
            snprintf(what, sizeof(what), "%s one row", variant_name(w.variant));
            check_case(dev, cpu, &c1, 3, TQ2_EXACT, what);
            free(c1.x);
            weight_free(&w);
        }
        // views: consecutive whole rows of a weight (rows 5..44 and 0..19 of 61), 1 column (mat-vec) and 3 / 40
        // columns (the tiled matmul); against the CPU only (ggml-vulkan's TQ2_0 asserts on a view whose offset is
        // not storage-buffer aligned, while BITCOS binds the base weight)
        for (int vi = 0; vi < 2; ++vi) {
            weight w;
            weight_make(&w, variant, 512, 61, 1, 0.4);
            const int64_t cols_v[3] = { 1, 3, 40 };
            for (int ci = 0; ci < 3; ++ci) {
                op_case c = { &w, false, cols_v[ci], 1, 1, 0, 0, NULL, NULL, vi ? 0 : 5, vi ? 20 : 40 };
                c.x       = random_x((size_t) (512 * c.cols));
                snprintf(what, sizeof(what), "%s view rows %lld..%lld cols=%lld", variant_name(w.variant),
                         (long long) c.view_row0, (long long) (c.view_row0 + c.view_rows), (long long) c.cols);
                check_case(dev, cpu, &c, (size_t) (c.view_rows * c.cols), TQ2_NONE, what);
                free(c.x);
            }
            weight_free(&w);
        }
        // MUL_MAT_ID: 4 experts, 2 used per token; ne11 = 1 (broadcast input) and = n_used
        for (int tk = 0; tk < 3; ++tk) {
            const int64_t tokens = tk == 0 ? 1 : tk == 1 ? 3 : 9;
            for (int bcast = 0; bcast < 2; ++bcast) {
                weight w;
                weight_make(&w, variant, 768, 40, 4, 0.4);
                op_case c = { &w, true, bcast ? 1 : 2, 1, 1, 2, tokens, NULL, NULL, 0, 0 };
                c.x       = random_x((size_t) (768 * c.cols * tokens));
                c.ids     = malloc(sizeof(int32_t) * (size_t) (2 * tokens));
                for (int64_t t = 0; t < tokens; ++t) {
                    c.ids[2 * t]     = (int32_t) (rng_u64() % 4);
                    c.ids[2 * t + 1] = (c.ids[2 * t] + 1 + (int32_t) (rng_u64() % 3)) % 4;
                }
                snprintf(what, sizeof(what), "%s MUL_MAT_ID tokens=%lld ne11=%lld", variant_name(w.variant),
                         (long long) tokens, (long long) c.cols);
                check_case(dev, cpu, &c, (size_t) (40 * 2 * tokens), tokens <= 8 ? TQ2_EXACT : TQ2_CLOSE, what);
                free(c.x);
                free(c.ids);
                weight_free(&w);
            }
        }
    }
    ggml_backend_free(dev);
    ggml_backend_free(cpu);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
