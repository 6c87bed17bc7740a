// test-bitcos-mm: BITCOS MUL_MAT / MUL_MAT_ID through ggml's CPU backend against independent references.
//
// Built with the patched llama.cpp (the C-tools patch installs it as llama_cpp/bin/test-bitcos-mm) and run by
// tests/test_llama_build.py. Random ternary weights (fixed seeds) of every variant (version 1: G128, PT;
// version 2: MATRIX, ROW, B128, B256) are encoded with ggml_bitcos_encode(), linked to their companion
// (src[0]) and multiplied through a ggml graph (ggml_mul_mat / ggml_mul_mat_id, several thread counts). Each
// result is compared with
//   (1) the arithmetic contract of bitcos-kernels.h evaluated here from the int8 codes and the scales the
//       test drew (not from the bitmap or the companion) on activations quantized by ggml's own Q8_K
//       quantizer: must match bit for bit, for any thread count;
//   (2) a double-precision product of the dequantized weights (codes times scales) with the float
//       activations: must agree within the Q8_K rounding bound sum_k |w_k| * amax(block)/254 (plus slack);
//   (3) for B256 and MATRIX weights whose scales are fp16 values and K % 256 == 0: ggml's own TQ2_0 MUL_MAT
//       of a TQ2_0 tensor written here from the same codes and scales: bit for bit on x86-64 where the CPU
//       backend has AVX2 (the contract is TQ2_0's AVX2 arithmetic), within the bound of (2) elsewhere.
// Row lengths cover every multiple the variants allow (32, 96, 160: partial last 128-weight unit; 576, 640:
// a half Q8_K block at the end; 1536, 2048), zero densities 0 / 0.4 / 1, odd row counts, views, 3-D weights
// with broadcasting and MUL_MAT_ID. Also checks that ggml_bitcos_validate() accepts every encoded tensor and
// rejects corrupted ones. Compile with -ffp-contract=off so reference (1) rounds like the kernels.
#include "ggml.h"
#include "../bitcos-cpu-api.h" // ggml-cpu.h in both build modes (csrc/ is copied next to tests/)
#include "ggml-bitcos.h"
#include "bitcos-test.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float   d;
    int8_t  qs[256];
    int16_t bsums[16];
} q8k_block;

// A random BITCOS weight [k, n, n_mats] held as codes + scales (the references' view of it).
typedef struct {
    int            variant; // enum bitcos_variant
    enum ggml_type type;    // bitcos_variant_type_id(variant)
    int64_t        k, n, mats, rows;
    int8_t *       codes;   // rows*k
    uint16_t *     bscale;  // G128 / B128 / B256: rows * k/sblk fp16 scales
    float *        fscale;  // PT / MATRIX: mats scales; ROW: rows scales
} weight_ref;

static int64_t scale_block(const weight_ref * w) {
    return bitcos_variant_scale_block(w->variant);
}

// The scale of weight (row, col) as FORMAT.md 4.2 defines it.
static float weight_scale(const weight_ref * w, int64_t row, int64_t col) {
    const int64_t sb = scale_block(w);
    if (sb != 0) {
        return ggml_fp16_to_fp32(w->bscale[row * (w->k / sb) + col / sb]);
    }
    return w->variant == BITCOS_VARIANT_ROW ? w->fscale[row] : w->fscale[row / w->n];
}

// fp16_scales: draw the fp32 scales (PT, MATRIX, ROW) as fp16 values, so TQ2_0 can hold a MATRIX weight
static void weight_make(weight_ref * w, int variant, int64_t k, int64_t n, int64_t mats, double zero_density,
                        bool fp16_scales) {
    w->variant        = variant;
    w->type           = (enum ggml_type) bitcos_variant_type_id(variant);
    w->k              = k;
    w->n              = n;
    w->mats           = mats;
    w->rows           = n * mats;
    const int64_t sb  = scale_block(w);
    const int64_t nbs = sb ? w->rows * (k / sb) : 0;
    const int64_t nfs = variant == BITCOS_VARIANT_ROW ? w->rows : mats;
    w->codes          = malloc((size_t) (w->rows * k));
    w->bscale         = malloc(sizeof(uint16_t) * (size_t) (nbs + 1));
    w->fscale         = malloc(sizeof(float) * (size_t) nfs);
    for (int64_t i = 0; i < w->rows * k; ++i) {
        w->codes[i] = rng_unit() < zero_density ? 0 : (rng_u64() & 1 ? 1 : -1);
    }
    for (int64_t b = 0; b < nbs; ++b) {
        // a few zero scales, like blocks without non-zero weights
        w->bscale[b] = ggml_fp32_to_fp16(rng_unit() < 0.05 ? 0.0f : (float) (0.002 + 0.05 * rng_unit()));
    }
    for (int64_t m = 0; m < nfs; ++m) {
        const float s = (float) (0.01 + 0.1 * rng_unit());
        w->fscale[m]  = fp16_scales ? ggml_fp16_to_fp32(ggml_fp32_to_fp16(s)) : s;
    }
}

static void weight_free(weight_ref * w) {
    free(w->codes);
    free(w->bscale);
    free(w->fscale);
}

// Creates the ggml weight + companion in ctx (encoded by ggml_bitcos_encode) and links them.
static struct ggml_tensor * weight_to_ggml(struct ggml_context * ctx, const weight_ref * w) {
    const size_t cbytes =
        ggml_bitcos_encode(w->variant, w->k, w->rows, w->mats, w->codes, w->bscale, w->fscale, NULL, NULL, 0);
    CHECK(cbytes > 0, "encode size");
    struct ggml_tensor * t = w->mats > 1 ? ggml_new_tensor_3d(ctx, w->type, w->k, w->n, w->mats) :
                                           ggml_new_tensor_2d(ctx, w->type, w->k, w->n);
    struct ggml_tensor * c = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t) cbytes);
    ggml_set_name(t, "w");
    ggml_set_name(c, "w.bitcos");
    const size_t got = ggml_bitcos_encode(w->variant, w->k, w->rows, w->mats, w->codes, w->bscale, w->fscale, t->data,
                                          c->data, cbytes);
    CHECK(got == cbytes, "encode wrote %zu of %zu bytes", got, cbytes);
    t->src[0] = c;
    char       err[256];
    const bool ok = ggml_bitcos_validate(t, t->data, c->data, cbytes, err, sizeof(err));
    CHECK(ok, "validate rejected a freshly encoded tensor: %s", err);
    return t;
}

// TQ2_0 blocks of the same codes and scales (k % 256 == 0; B256: its scale per 256, MATRIX: the matrix scale,
// an fp16 value): qs byte j % 32 + 32 * (j / 128) holds code j + 1 at bit 2 * ((j % 128) / 32), then fp16 d.
static struct ggml_tensor * weight_to_tq2_0(struct ggml_context * ctx, const weight_ref * w) {
    struct ggml_tensor * t   = w->mats > 1 ? ggml_new_tensor_3d(ctx, GGML_TYPE_TQ2_0, w->k, w->n, w->mats) :
                                             ggml_new_tensor_2d(ctx, GGML_TYPE_TQ2_0, w->k, w->n);
    const int64_t        nb  = w->k / 256;
    const size_t         bsz = ggml_type_size(GGML_TYPE_TQ2_0);
    uint8_t *            out = (uint8_t *) t->data;
    memset(out, 0, ggml_nbytes(t));
    for (int64_t r = 0; r < w->rows; ++r) {
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t * blk = out + (size_t) (r * nb + b) * bsz;
            for (int j = 0; j < 256; ++j) {
                blk[j % 32 + 32 * (j / 128)] |=
                    (uint8_t) ((w->codes[r * w->k + 256 * b + j] + 1) << (2 * ((j % 128) / 32)));
            }
            const uint16_t d = ggml_fp32_to_fp16(weight_scale(w, r, 256 * b));
            CHECK(ggml_fp16_to_fp32(d) == weight_scale(w, r, 256 * b), "TQ2_0 cannot hold scale of row %lld",
                  (long long) r);
            memcpy(blk + 64, &d, sizeof(uint16_t));
        }
    }
    return t;
}

// Q8_K blocks of one activation row, zero-padded to a multiple of 256, with ggml's CPU quantizer.
static void quantize_q8k(const float * x, int64_t k, q8k_block * out) {
    const int64_t kp  = (k + 255) / 256 * 256;
    float *       pad = calloc((size_t) kp, sizeof(float));
    memcpy(pad, x, sizeof(float) * (size_t) k);
    ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float(pad, out, kp);
    free(pad);
}

// Reference (1): the bitcos-kernels.h arithmetic contract ("TQ2_0-exact") evaluated from the codes, one
// weight row, one activation row. `fused` selects the contract's FMA form (BITCOS_FMA = 1: fused multiply-add;
// 0: multiply, round, add), which depends on how ggml-cpu was compiled; the caller accepts either form but
// requires the same one everywhere.
static float mac(float a, float b, float c, bool fused) {
    if (fused) {
        return fmaf(a, b, c);
    }
    const float p = a * b;
    return p + c;
}

static float contract_dot(const weight_ref * w, int64_t row, const q8k_block * y, bool fused) {
    const int64_t nu     = (w->k + QK_BITCOS - 1) / QK_BITCOS; // 128-weight units, the last maybe partial
    const int64_t sb     = scale_block(w);
    float         acc[8] = { 0 };
    for (int64_t b = 0; b < (nu + 1) / 2; ++b) {
        const int halves  = 2 * b + 1 < nu ? 2 : 1;
        int32_t   L[2][8] = { { 0 } };
        for (int h = 0; h < halves; ++h) {
            for (int j = 0; j < QK_BITCOS; ++j) { // half h of Q8_K block b = 128-weight unit 2b + h
                const int64_t col = (2 * b + h) * QK_BITCOS + j;
                const int32_t t   = col < w->k ? w->codes[row * w->k + col] : 0; // past K: absent weights
                const int32_t q   = y[b].qs[QK_BITCOS * h + j];
                L[h][(j % 32) / 4] += (t + 1) * q;                               // lane of TQ2_0's partition
                L[h][4 * h + j / 32] -= q;                                       // minus the block's q sum of that lane
            }
        }
        if (sb == 0) {
            const float D = y[b].d * weight_scale(w, row, 0);
            for (int l = 0; l < 8; ++l)
                acc[l] = mac((float) (L[0][l] + L[1][l]), D, acc[l], fused);
        } else {
            const uint16_t e0 = ggml_fp32_to_fp16(weight_scale(w, row, (2 * b) * QK_BITCOS));
            const uint16_t e1 = halves == 2 ? ggml_fp32_to_fp16(weight_scale(w, row, (2 * b + 1) * QK_BITCOS)) : e0;
            if (e0 == e1) {
                const float D = y[b].d * ggml_fp16_to_fp32(e0);
                for (int l = 0; l < 8; ++l)
                    acc[l] = mac((float) (L[0][l] + L[1][l]), D, acc[l], fused);
            } else {
                const float D0 = y[b].d * ggml_fp16_to_fp32(e0);
                const float D1 = y[b].d * ggml_fp16_to_fp32(e1);
                for (int l = 0; l < 8; ++l) {
                    acc[l] = mac((float) L[0][l], D0, acc[l], fused);
                    acc[l] = mac((float) L[1][l], D1, acc[l], fused);
                }
            }
        }
    }
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// Reference (2): double-precision dot of dequantized weights and float activations + Q8_K error bound.
static void float_dot(const weight_ref * w, int64_t row, const float * x, double * ref, double * bound) {
    double s = 0.0, e = 0.0;
    for (int64_t b = 0; b < w->k; b += 256) {
        float amax = 0.0f;
        for (int64_t j = b; j < b + 256 && j < w->k; ++j) {
            amax = fmaxf(amax, fabsf(x[j]));
        }
        for (int64_t j = b; j < b + 256 && j < w->k; ++j) {
            const double wv = (double) weight_scale(w, row, j) * w->codes[row * w->k + j];
            s += wv * x[j];
            e += fabs(wv) * amax / 254.0;
        }
    }
    *ref   = s;
    *bound = e * 1.01 + 1e-6 * (1.0 + fabs(s));
}

static void compare(const char * what, const weight_ref * w, int64_t row, const float * x, const q8k_block * y,
                    float got) {
    // which FMA form the library uses is fixed by the first value where the two forms differ
    static int  form    = -1; // -1 unknown, 0 unfused, 1 fused
    const float e_fused = contract_dot(w, row, y, true), e_plain = contract_dot(w, row, y, false);
    const bool  m_fused = memcmp(&e_fused, &got, sizeof(float)) == 0;
    const bool  m_plain = memcmp(&e_plain, &got, sizeof(float)) == 0;
    if (form == -1 && m_fused != m_plain) {
        form = m_fused ? 1 : 0;
        printf("test-bitcos-mm: the library uses the %s form of the contract\n", form ? "fused (FMA)" : "unfused");
    }
    const bool ok = form == 1 ? m_fused : form == 0 ? m_plain : (m_fused || m_plain);
    CHECK(ok, "%s row %lld: got %.9g, contract %.9g (fused) / %.9g (unfused)", what, (long long) row, got, e_fused,
          e_plain);
    double ref, bound;
    float_dot(w, row, x, &ref, &bound);
    CHECK(fabs(got - ref) <= bound, "%s row %lld: got %.9g, float ref %.9g (bound %.3g)", what, (long long) row, got,
          ref, bound);
}

// Whether the CPU backend that runs here was compiled with `feature` (its ggml_backend_get_features list): the
// one ggml-cpu of a default build, or the variant ggml_backend_load_all() chose in a GGML_CPU_ALL_VARIANTS build.
static bool cpu_backend_has(const char * feature) {
    ggml_backend_dev_t                dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_reg_t                reg = dev ? ggml_backend_dev_backend_reg(dev) : NULL;
    const ggml_backend_get_features_t get =
        reg ? (ggml_backend_get_features_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features") : NULL;
    for (const struct ggml_backend_feature * f = get ? get(reg) : NULL; f && f->name; ++f) {
        if (strcmp(f->name, feature) == 0) {
            return true;
        }
    }
    return false;
}

// Reference (3): BITCOS vs ggml's TQ2_0 of the same codes and scales, one output. Bit for bit where TQ2_0 runs its
// x86 AVX2 kernel, whose arithmetic the contract is; a CPU backend without AVX2 (the x64 .. piledriver variants)
// runs TQ2_0's generic C, which sums a block's lanes first and keeps one accumulator: equal within the bound there.
static void compare_tq2_0(const char * what, const weight_ref * w, int64_t row, const float * x, float got, float tq) {
#if defined(__x86_64__) || defined(_M_X64)
    static int tq2_0_avx2 = -1;
    if (tq2_0_avx2 == -1) {
        tq2_0_avx2 = cpu_backend_has("AVX2");
    }
    if (tq2_0_avx2) {
        CHECK(memcmp(&got, &tq, sizeof(float)) == 0, "%s row %lld: got %.9g, TQ2_0 %.9g (must be bit-identical)", what,
              (long long) row, got, tq);
        return;
    }
#endif
    double ref, bound;
    float_dot(w, row, x, &ref, &bound);
    CHECK(fabs(got - tq) <= 2 * bound, "%s row %lld: got %.9g, TQ2_0 %.9g", what, (long long) row, got, tq);
}

static const char * variant_name(int v) {
    static const char * names[BITCOS_VARIANT_COUNT] = { "G128", "PT", "MATRIX", "ROW", "B128", "B256" };
    return v >= 0 && v < BITCOS_VARIANT_COUNT ? names[v] : "?";
}

// TQ2_0 can hold the weight exactly (reference (3)): B256 always, MATRIX with fp16 scales; K % 256 == 0
static bool tq2_0_comparable(const weight_ref * w) {
    return w->k % 256 == 0 && (w->variant == BITCOS_VARIANT_B256 || w->variant == BITCOS_VARIANT_MATRIX);
}

static struct ggml_context * new_ctx(size_t mb) {
    struct ggml_init_params p = { mb << 20, NULL, false };
    return ggml_init(p);
}

static void fill_random(struct ggml_tensor * t) {
    float * x = (float *) t->data;
    for (int64_t i = 0; i < ggml_nelements(t); ++i) {
        x[i] = (float) (2.0 * rng_unit() - 1.0);
    }
}

// MUL_MAT: weight [k, n, mats], src1 [k, batch, mats*bcast] (broadcast over dim 2), optional view of rows.
// With TQ2_0-comparable data the same graph also runs on a TQ2_0 copy of the weight (reference (3)).
// out (the BITCOS product) and outq (its TQ2_0 twin; NULL where there is none) computed in one graph.
static void compute(struct ggml_context * ctx, struct ggml_tensor * out, struct ggml_tensor * outq, int n_threads,
                    const char * what) {
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    if (outq) {
        ggml_build_forward_expand(gf, outq);
    }
    const enum ggml_status st = ggml_graph_compute_with_ctx(ctx, gf, n_threads);
    CHECK(st == GGML_STATUS_SUCCESS, "%s: compute status %d", what, (int) st);
}

static void test_mul_mat(int variant, int64_t k, int64_t n, int64_t mats, int64_t bcast, int64_t batch, double z,
                         int n_threads, int64_t view_row0) {
    char       what[200];
    weight_ref w;
    weight_make(&w, variant, k, n, mats, z, true);
    const bool tq = tq2_0_comparable(&w);
    snprintf(what, sizeof(what),
             "mul_mat %s k=%lld n=%lld mats=%lld bcast=%lld batch=%lld z=%.1f threads=%d view=%lld%s",
             variant_name(variant), (long long) k, (long long) n, (long long) mats, (long long) bcast,
             (long long) batch, z, n_threads, (long long) view_row0, tq ? " (+TQ2_0)" : "");
    struct ggml_context * ctx    = new_ctx(64);
    struct ggml_tensor *  wt     = weight_to_ggml(ctx, &w);
    struct ggml_tensor *  wq     = tq ? weight_to_tq2_0(ctx, &w) : NULL;
    int64_t               n_used = n;
    if (view_row0 > 0) {
        // rows view_row0 .. n-1 of the (2-D) weight: reaches the companion through view_src
        n_used = n - view_row0;
        wt     = ggml_view_2d(ctx, wt, k, n_used, wt->nb[1], (size_t) view_row0 * wt->nb[1]);
        wq     = wq ? ggml_view_2d(ctx, wq, k, n_used, wq->nb[1], (size_t) view_row0 * wq->nb[1]) : NULL;
    }
    struct ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, batch, mats * bcast);
    fill_random(x);
    struct ggml_tensor * out  = ggml_mul_mat(ctx, wt, x);
    struct ggml_tensor * outq = wq ? ggml_mul_mat(ctx, wq, x) : NULL;
    compute(ctx, out, outq, n_threads, what);

    q8k_block * y = malloc(sizeof(q8k_block) * (size_t) ((k + 255) / 256));
    for (int64_t i2 = 0; i2 < mats * bcast; ++i2) {
        for (int64_t c = 0; c < batch; ++c) {
            const float * xr = (const float *) ((const char *) x->data + c * x->nb[1] + i2 * x->nb[2]);
            quantize_q8k(xr, k, y);
            for (int64_t r = 0; r < n_used; ++r) {
                const int64_t row = (i2 / bcast) * n + view_row0 + r;
                const size_t  off = r * out->nb[0] + c * out->nb[1] + i2 * out->nb[2];
                const float   got = *(const float *) ((const char *) out->data + off);
                compare(what, &w, row, xr, y, got);
                if (outq) {
                    compare_tq2_0(what, &w, row, xr, got, *(const float *) ((const char *) outq->data + off));
                }
            }
        }
    }
    free(y);
    ggml_free(ctx);
    weight_free(&w);
}

// MUL_MAT_ID: experts [k, n, n_exp], src1 [k, n_used or 1, n_tok], ids [n_used, n_tok] (distinct per token).
static void test_mul_mat_id(int variant, int64_t k, int64_t n, int64_t n_exp, int64_t n_used, int64_t n_tok,
                            bool bcast_src1, double z, int n_threads) {
    char       what[200];
    weight_ref w;
    weight_make(&w, variant, k, n, n_exp, z, true);
    const bool tq = tq2_0_comparable(&w);
    snprintf(what, sizeof(what),
             "mul_mat_id %s k=%lld n=%lld experts=%lld used=%lld tokens=%lld bcast=%d z=%.1f threads=%d%s",
             variant_name(variant), (long long) k, (long long) n, (long long) n_exp, (long long) n_used,
             (long long) n_tok, (int) bcast_src1, z, n_threads, tq ? " (+TQ2_0)" : "");
    struct ggml_context * ctx  = new_ctx(64);
    struct ggml_tensor *  wt   = weight_to_ggml(ctx, &w);
    struct ggml_tensor *  wq   = tq ? weight_to_tq2_0(ctx, &w) : NULL;
    const int64_t         ne11 = bcast_src1 ? 1 : n_used;
    struct ggml_tensor *  x    = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, ne11, n_tok);
    fill_random(x);
    struct ggml_tensor * ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_used, n_tok);
    for (int64_t t = 0; t < n_tok; ++t) {
        int32_t * row = (int32_t *) ((char *) ids->data + t * ids->nb[1]);
        for (int64_t i = 0; i < n_used; ++i) {
            bool dup;
            do { // distinct experts per token, as a router's top-k gives
                row[i] = (int32_t) (rng_u64() % (uint64_t) n_exp);
                dup    = false;
                for (int64_t j = 0; j < i; ++j)
                    dup = dup || row[j] == row[i];
            } while (dup);
        }
    }
    struct ggml_tensor * out  = ggml_mul_mat_id(ctx, wt, x, ids);
    struct ggml_tensor * outq = wq ? ggml_mul_mat_id(ctx, wq, x, ids) : NULL;
    compute(ctx, out, outq, n_threads, what);

    q8k_block * y = malloc(sizeof(q8k_block) * (size_t) ((k + 255) / 256));
    for (int64_t t = 0; t < n_tok; ++t) {
        for (int64_t i = 0; i < n_used; ++i) {
            const int32_t e  = *(const int32_t *) ((const char *) ids->data + i * ids->nb[0] + t * ids->nb[1]);
            const float * xr = (const float *) ((const char *) x->data + (i % ne11) * x->nb[1] + t * x->nb[2]);
            quantize_q8k(xr, k, y);
            for (int64_t r = 0; r < n; ++r) {
                const size_t off = r * out->nb[0] + i * out->nb[1] + t * out->nb[2];
                const float  got = *(const float *) ((const char *) out->data + off);
                compare(what, &w, e * n + r, xr, y, got);
                if (outq) {
                    compare_tq2_0(what, &w, e * n + r, xr, got, *(const float *) ((const char *) outq->data + off));
                }
            }
        }
    }
    free(y);
    ggml_free(ctx);
    weight_free(&w);
}

// A corrupted weight or companion must be rejected by ggml_bitcos_validate (never read out of bounds later).
static void test_validate_rejects(int variant) {
    weight_ref w;
    weight_make(&w, variant, 256, 40, 2, 0.4, false);
    struct ggml_context * ctx  = new_ctx(8);
    struct ggml_tensor *  t    = weight_to_ggml(ctx, &w);
    struct ggml_tensor *  c    = t->src[0];
    const size_t          cb   = ggml_nbytes(c);
    uint8_t *             cd   = (uint8_t *) c->data;
    uint8_t *             save = malloc(cb);
    memcpy(save, cd, cb);
    struct ggml_bitcos_header h;
    ggml_bitcos_read_header(cd, &h);
    char err[256];

    struct {
        const char * name;
        size_t       off;
        uint8_t      xor_mask;
    } cases[] = {
        { "magic", 0, 0x01 },
        { "version", 4, 0x02 },
        { "version 1<->2", 4, 0x03 },
        { "variant", 6, 0x01 },
        { "variant +4", 6, 0x04 },
        { "row_group_log2", 7, 0x08 },
        { "n_cols", 8, 0x80 },
        { "n_rows", 16, 0x01 },
        { "n_mats", 24, 0x01 },
        { "n_sign_bits", 32, 0x01 },
        { "scales_offset", 40, 0x40 },
        { "row_base_offset", 48, 0x40 },
        { "pool_offset", 64, 0x40 },
        { "pool_bytes", 72, 0x40 },
        { "reserved", 100, 0x01 },
        { "row_delta[1]", (size_t) h.row_delta_offset + 2, 0x01 },
        { "row_base[last]", (size_t) h.row_base_offset + 8 * ((h.n_rows - 1) >> h.row_group_log2), 0x01 },
        { "pool tail", (size_t) (h.pool_offset + h.pool_bytes - 1), 0x01 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        memcpy(cd, save, cb);
        cd[cases[i].off] ^= cases[i].xor_mask;
        CHECK(!ggml_bitcos_validate(t, t->data, cd, cb, err, sizeof(err)), "%s: corrupted %s accepted",
              variant_name(variant), cases[i].name);
    }
    memcpy(cd, save, cb);
    CHECK(!ggml_bitcos_validate(t, t->data, cd, cb - 64, err, sizeof(err)), "truncated companion accepted");
    CHECK(!ggml_bitcos_validate(t, t->data, cd, 100, err, sizeof(err)), "companion shorter than header accepted");
    // flipping one bitmap bit breaks the row index invariants
    ((uint8_t *) t->data)[0] ^= 1;
    CHECK(!ggml_bitcos_validate(t, t->data, cd, cb, err, sizeof(err)), "bitmap change not detected");
    ((uint8_t *) t->data)[0] ^= 1;
    // an invalid scale (negative: sign bit set) is refused, and the message names where it is
    if (variant != BITCOS_VARIANT_G128) {
        const size_t last =
            variant == BITCOS_VARIANT_B128 || variant == BITCOS_VARIANT_B256 ?
                (size_t) (h.scales_offset + ggml_bitcos_scale_row_bytes(&h) * h.n_rows - 1) :
                (size_t) (h.scales_offset + 4 * (variant == BITCOS_VARIANT_ROW ? h.n_rows : h.n_mats) - 1);
        cd[last] ^= 0x80;
        CHECK(!ggml_bitcos_validate(t, t->data, cd, cb, err, sizeof(err)), "%s: negative scale accepted",
              variant_name(variant));
        const char * where = variant == BITCOS_VARIANT_ROW  ? "of row 79" :
                             variant == BITCOS_VARIANT_B128 ? "in block 1 of row 79" :
                             variant == BITCOS_VARIANT_B256 ? "in block 0 of row 79" :
                                                              "of matrix 1";
        CHECK(strstr(err, where) != NULL, "%s: message '%s' does not say '%s'", variant_name(variant), err, where);
        cd[last] ^= 0x80;
    }
    CHECK(ggml_bitcos_validate(t, t->data, cd, cb, err, sizeof(err)), "restored tensor rejected: %s", err);
    // a version-1 companion on the version-2 type and vice versa: the variant must match the weight type
    // (another variant of the same type can be a valid reading of the same bytes, e.g. B128 and ROW scales of
    // equal size, so only the other types' variants are certain refusals)
    for (int v = 0; v < BITCOS_VARIANT_COUNT; ++v) {
        if (bitcos_variant_type_id(v) == (int) w.type) {
            continue;
        }
        cd[BITCOS_HDR_VARIANT] = (uint8_t) v;
        CHECK(!ggml_bitcos_validate(t, t->data, cd, cb, err, sizeof(err)), "%s: variant %d accepted",
              variant_name(variant), v);
    }
    memcpy(cd, save, cb);
    free(save);
    ggml_free(ctx);
    weight_free(&w);
}

// The encoder refuses what the validator would: K not a multiple of the variant's, invalid scales.
static void test_encoder_refuses(void) {
    int8_t codes[2 * 512];
    memset(codes, 1, sizeof codes);
    uint16_t d16[2 * 4];
    float    f[2] = { 0.5f, 0.5f };
    for (int i = 0; i < 8; ++i)
        d16[i] = ggml_fp32_to_fp16(0.25f);
    for (int v = 0; v < BITCOS_VARIANT_COUNT; ++v) {
        const int64_t m = bitcos_variant_k_multiple(v);
        CHECK(ggml_bitcos_encode(v, m, 2, 1, codes, d16, f, NULL, NULL, 0) > 0, "%s: k=%lld refused", variant_name(v),
              (long long) m);
        CHECK(ggml_bitcos_encode(v, m + 16, 2, 1, codes, d16, f, NULL, NULL, 0) == 0, "%s: k=%lld accepted",
              variant_name(v), (long long) (m + 16));
        CHECK(m == 32 || ggml_bitcos_encode(v, m + 32, 2, 1, codes, d16, f, NULL, NULL, 0) == 0, "%s: k=%lld accepted",
              variant_name(v), (long long) (m + 32));
    }
    const float bad[4] = { -1.0f, -0.0f, NAN, 70000.0f };
    for (int i = 0; i < 4; ++i) {
        float fb[2] = { 0.5f, bad[i] };
        CHECK(ggml_bitcos_encode(BITCOS_VARIANT_ROW, 64, 2, 1, codes, NULL, fb, NULL, NULL, 0) == 0,
              "ROW scale %g accepted", (double) bad[i]);
        CHECK(ggml_bitcos_encode(BITCOS_VARIANT_MATRIX, 64, 2, 1, codes, NULL, fb + 1, NULL, NULL, 0) == 0,
              "MATRIX scale %g accepted", (double) bad[i]);
    }
    uint16_t db[2] = { ggml_fp32_to_fp16(0.5f), 0xbc00 /* -1.0 */ };
    CHECK(ggml_bitcos_encode(BITCOS_VARIANT_B256, 256, 2, 1, codes, db, NULL, NULL, NULL, 0) == 0,
          "B256 scale -1 accepted");
    CHECK(ggml_bitcos_encode(BITCOS_VARIANT_COUNT, 256, 2, 1, codes, db, f, NULL, NULL, 0) == 0,
          "unknown variant accepted");
}

int main(int argc, char ** argv) {
    rng_seed(0x9e3779b97f4a7c15ull);
    bitcos_load_backends();
    // argv[1] (optional): "quick" runs fewer shapes (the sanitizer build)
    const bool    quick      = argc > 1 && strcmp(argv[1], "quick") == 0;
    const int64_t ks_all[7]  = { 32, 96, 160, 576, 640, 1536, 2048 };
    const int64_t batches[3] = { 1, 3, 17 };
    const double  zs[3]      = { 0.0, 0.4, 1.0 };
    const int     threads[3] = { 1, 2, 3 };

    test_encoder_refuses();
    for (int v = 0; v < BITCOS_VARIANT_COUNT; ++v) {
        test_validate_rejects(v);
        const int64_t kmul = bitcos_variant_k_multiple(v);
        // every row length of ks_all the variant allows, plus 384 for the v1 types (an odd number of units)
        int64_t       ks[8];
        int           nk = 0;
        for (int i = 0; i < 7; ++i) {
            if (ks_all[i] % kmul == 0)
                ks[nk++] = ks_all[i];
        }
        if (kmul == QK_BITCOS)
            ks[nk++] = 384;
        for (int ki = 0; ki < nk; ++ki) {
            for (int bi = 0; bi < (quick ? 1 : 3); ++bi) {
                for (int zi = 0; zi < 3; ++zi) {
                    // n = 71: more than one 64-row run, odd, and not a multiple of the thread count
                    test_mul_mat(v, ks[ki], 71, 1, 1, batches[bi], zs[zi], threads[(ki + bi + zi) % 3], 0);
                }
            }
            if (quick) {
                continue;
            }
            // thread-count independence is implied by the bit-exact contract check; vary threads on one case too
            for (int th = 0; th < 3; ++th) {
                test_mul_mat(v, ks[ki], 131, 1, 1, 5, 0.4, threads[th], 0);
            }
            // 3-D weight with broadcasting over dim 2 (each matrix used by two src1 slices)
            test_mul_mat(v, ks[ki], 33, 3, 2, 4, 0.3, 2, 0);
            // a view of rows 7..n-1
            test_mul_mat(v, ks[ki], 91, 1, 1, 3, 0.5, 2, 7);
            // MoE: experts [k, n, 6], 2 used per token, 1 and 9 tokens, src1 per slot or broadcast
            test_mul_mat_id(v, ks[ki], 41, 6, 2, 1, false, 0.4, 2);
            test_mul_mat_id(v, ks[ki], 70, 6, 3, 9, false, 0.4, 3);
            test_mul_mat_id(v, ks[ki], 41, 6, 2, 5, true, 0.0, 1);
            test_mul_mat_id(v, ks[ki], 40, 4, 4, 3, false, 1.0, 2);
        }
    }
    printf("test-bitcos-mm: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
