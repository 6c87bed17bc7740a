// test-bitcos-mm: BITCOS MUL_MAT / MUL_MAT_ID through ggml's CPU backend against two independent references.
//
// Built with the patched llama.cpp (the C-tools patch installs it as llama_cpp/bin/test-bitcos-mm) and run by
// tests/test_llama_build.py. Random ternary weights (fixed seeds) are encoded with ggml_bitcos_encode(),
// linked to their companion (src[0]) and multiplied through a ggml graph (ggml_mul_mat / ggml_mul_mat_id,
// several thread counts). Each result is compared with
//   (1) the arithmetic contract (v2) of bitcos-kernels.h evaluated here from the int8 codes (not the bitmap)
//       on activations quantized by ggml's own Q8_K quantizer: must match bit for bit, for any thread count;
//   (2) a double-precision product of the dequantized weights with the float activations: must agree within
//       the Q8_K rounding bound sum_k |w_k| * amax(block)/254 (plus float slack).
// Also checks that ggml_bitcos_validate() accepts every encoded tensor and rejects corrupted companions.
// Compile with -ffp-contract=off so reference (1) rounds like the kernels.
#include "ggml.h"
#include "ggml-cpu.h"
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

// A random BITCOS weight [k, n, n_mats] held as codes + float scales (the reference's view of it).
typedef struct {
    enum ggml_type type;
    int64_t k, n, mats, rows;
    int8_t   * codes;   // rows*k
    uint16_t * d16;     // rows*k/128 (G128)
    float    * dmat;    // mats (PT)
} weight_ref;

static float weight_scale(const weight_ref * w, int64_t row, int64_t col) {
    if (w->type == GGML_TYPE_BITCOS_PT) {
        return w->dmat[row / w->n];
    }
    return ggml_fp16_to_fp32(w->d16[row * (w->k / QK_BITCOS) + col / QK_BITCOS]);
}

static void weight_make(weight_ref * w, enum ggml_type type, int64_t k, int64_t n, int64_t mats, double zero_density) {
    w->type = type; w->k = k; w->n = n; w->mats = mats; w->rows = n * mats;
    w->codes = malloc((size_t)(w->rows * k));
    w->d16   = malloc(sizeof(uint16_t) * (size_t)(w->rows * k / QK_BITCOS));
    w->dmat  = malloc(sizeof(float) * (size_t) mats);
    for (int64_t i = 0; i < w->rows * k; ++i) {
        w->codes[i] = rng_unit() < zero_density ? 0 : (rng_u64() & 1 ? 1 : -1);
    }
    for (int64_t b = 0; b < w->rows * k / QK_BITCOS; ++b) {
        // a few zero scales, like blocks without non-zero weights
        w->d16[b] = ggml_fp32_to_fp16(rng_unit() < 0.05 ? 0.0f : (float)(0.002 + 0.05 * rng_unit()));
    }
    for (int64_t m = 0; m < mats; ++m) {
        w->dmat[m] = (float)(0.01 + 0.1 * rng_unit());
    }
}

static void weight_free(weight_ref * w) {
    free(w->codes); free(w->d16); free(w->dmat);
}

// Creates the ggml weight + companion in ctx (encoded by ggml_bitcos_encode) and links them.
static struct ggml_tensor * weight_to_ggml(struct ggml_context * ctx, const weight_ref * w) {
    const size_t cbytes = ggml_bitcos_encode(w->type, w->k, w->rows, w->mats, w->codes, w->d16, w->dmat, NULL, NULL, 0);
    CHECK(cbytes > 0, "encode size");
    struct ggml_tensor * t = w->mats > 1 ? ggml_new_tensor_3d(ctx, w->type, w->k, w->n, w->mats)
                                         : ggml_new_tensor_2d(ctx, w->type, w->k, w->n);
    struct ggml_tensor * c = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t) cbytes);
    ggml_set_name(t, "w");
    ggml_set_name(c, "w.bitcos");
    const size_t got = ggml_bitcos_encode(w->type, w->k, w->rows, w->mats, w->codes, w->d16, w->dmat, t->data, c->data, cbytes);
    CHECK(got == cbytes, "encode wrote %zu of %zu bytes", got, cbytes);
    t->src[0] = c;
    char err[256];
    const bool ok = ggml_bitcos_validate(t, t->data, c->data, cbytes, err, sizeof(err));
    CHECK(ok, "validate rejected a freshly encoded tensor: %s", err);
    return t;
}

// Q8_K blocks of one activation row, zero-padded to a multiple of 256, with ggml's CPU quantizer.
static void quantize_q8k(const float * x, int64_t k, q8k_block * out) {
    const int64_t kp = (k + 255) / 256 * 256;
    float * pad = calloc((size_t) kp, sizeof(float));
    memcpy(pad, x, sizeof(float) * (size_t) k);
    ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float(pad, out, kp);
    free(pad);
}

// Reference (1): the bitcos-kernels.h arithmetic contract v2 ("TQ2_0-exact") evaluated from the codes, one
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
    const int64_t nb = w->k / QK_BITCOS;
    float acc[8] = {0};
    for (int64_t b = 0; b < (nb + 1) / 2; ++b) {
        const int halves = 2*b + 1 < nb ? 2 : 1;
        int32_t L[2][8] = {{0}};
        for (int h = 0; h < halves; ++h) {
            for (int j = 0; j < QK_BITCOS; ++j) {  // half h of Q8_K block b = BITCOS block 2b + h
                const int32_t t = w->codes[row * w->k + (2*b + h) * QK_BITCOS + j];
                const int32_t q = y[b].qs[QK_BITCOS*h + j];
                L[h][(j % 32) / 4] += (t + 1) * q;   // lane of TQ2_0's partition
                L[h][4*h + j / 32] -= q;             // minus the block's q sum of that lane
            }
        }
        if (w->type == GGML_TYPE_BITCOS_PT) {
            const float D = y[b].d * w->dmat[row / w->n];
            for (int l = 0; l < 8; ++l) acc[l] = mac((float)(L[0][l] + L[1][l]), D, acc[l], fused);
        } else {
            const uint16_t e0 = w->d16[row*nb + 2*b];
            const uint16_t e1 = halves == 2 ? w->d16[row*nb + 2*b + 1] : e0;
            if (e0 == e1) {
                const float D = y[b].d * ggml_fp16_to_fp32(e0);
                for (int l = 0; l < 8; ++l) acc[l] = mac((float)(L[0][l] + L[1][l]), D, acc[l], fused);
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
    *ref = s;
    *bound = e * 1.01 + 1e-6 * (1.0 + fabs(s));
}

static void compare(const char * what, const weight_ref * w, int64_t row, const float * x, const q8k_block * y, float got) {
    // which FMA form the library uses is fixed by the first value where the two forms differ
    static int form = -1;  // -1 unknown, 0 unfused, 1 fused
    const float e_fused = contract_dot(w, row, y, true), e_plain = contract_dot(w, row, y, false);
    const bool m_fused = memcmp(&e_fused, &got, sizeof(float)) == 0;
    const bool m_plain = memcmp(&e_plain, &got, sizeof(float)) == 0;
    if (form == -1 && m_fused != m_plain) {
        form = m_fused ? 1 : 0;
        printf("test-bitcos-mm: the library uses the %s form of the contract\n", form ? "fused (FMA)" : "unfused");
    }
    const bool ok = form == 1 ? m_fused : form == 0 ? m_plain : (m_fused || m_plain);
    CHECK(ok, "%s row %lld: got %.9g, contract %.9g (fused) / %.9g (unfused)", what, (long long) row, got,
          e_fused, e_plain);
    double ref, bound;
    float_dot(w, row, x, &ref, &bound);
    CHECK(fabs(got - ref) <= bound, "%s row %lld: got %.9g, float ref %.9g (bound %.3g)", what, (long long) row, got, ref, bound);
}

static struct ggml_context * new_ctx(size_t mb) {
    struct ggml_init_params p = { mb << 20, NULL, false };
    return ggml_init(p);
}

static void fill_random(struct ggml_tensor * t) {
    float * x = (float *) t->data;
    for (int64_t i = 0; i < ggml_nelements(t); ++i) {
        x[i] = (float)(2.0 * rng_unit() - 1.0);
    }
}

// MUL_MAT: weight [k, n, mats], src1 [k, batch, mats*bcast] (broadcast over dim 2), optional view of rows.
static void test_mul_mat(enum ggml_type type, int64_t k, int64_t n, int64_t mats, int64_t bcast, int64_t batch,
                         double z, int n_threads, int64_t view_row0) {
    char what[160];
    snprintf(what, sizeof(what), "mul_mat %s k=%lld n=%lld mats=%lld bcast=%lld batch=%lld z=%.1f threads=%d view=%lld",
             ggml_type_name(type), (long long) k, (long long) n, (long long) mats, (long long) bcast,
             (long long) batch, z, n_threads, (long long) view_row0);
    weight_ref w;
    weight_make(&w, type, k, n, mats, z);
    struct ggml_context * ctx = new_ctx(64);
    struct ggml_tensor * wt = weight_to_ggml(ctx, &w);
    int64_t n_used = n;
    if (view_row0 > 0) {
        // rows view_row0 .. n-1 of the (2-D) weight: reaches the companion through view_src
        n_used = n - view_row0;
        wt = ggml_view_2d(ctx, wt, k, n_used, wt->nb[1], (size_t) view_row0 * wt->nb[1]);
    }
    struct ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, batch, mats * bcast);
    fill_random(x);
    struct ggml_tensor * out = ggml_mul_mat(ctx, wt, x);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    const enum ggml_status st = ggml_graph_compute_with_ctx(ctx, gf, n_threads);
    CHECK(st == GGML_STATUS_SUCCESS, "%s: compute status %d", what, (int) st);

    q8k_block * y = malloc(sizeof(q8k_block) * (size_t)((k + 255) / 256));
    for (int64_t i2 = 0; i2 < mats * bcast; ++i2) {
        for (int64_t c = 0; c < batch; ++c) {
            const float * xr = (const float *)((const char *) x->data + c*x->nb[1] + i2*x->nb[2]);
            quantize_q8k(xr, k, y);
            for (int64_t r = 0; r < n_used; ++r) {
                const int64_t row = (i2 / bcast) * n + view_row0 + r;
                const float got = *(const float *)((const char *) out->data + r*out->nb[0] + c*out->nb[1] + i2*out->nb[2]);
                compare(what, &w, row, xr, y, got);
            }
        }
    }
    free(y);
    ggml_free(ctx);
    weight_free(&w);
}

// MUL_MAT_ID: experts [k, n, n_exp], src1 [k, n_used or 1, n_tok], ids [n_used, n_tok] (distinct per token).
static void test_mul_mat_id(enum ggml_type type, int64_t k, int64_t n, int64_t n_exp, int64_t n_used, int64_t n_tok,
                            bool bcast_src1, double z, int n_threads) {
    char what[160];
    snprintf(what, sizeof(what), "mul_mat_id %s k=%lld n=%lld experts=%lld used=%lld tokens=%lld bcast=%d z=%.1f threads=%d",
             ggml_type_name(type), (long long) k, (long long) n, (long long) n_exp, (long long) n_used,
             (long long) n_tok, (int) bcast_src1, z, n_threads);
    weight_ref w;
    weight_make(&w, type, k, n, n_exp, z);
    struct ggml_context * ctx = new_ctx(64);
    struct ggml_tensor * wt = weight_to_ggml(ctx, &w);
    const int64_t ne11 = bcast_src1 ? 1 : n_used;
    struct ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, ne11, n_tok);
    fill_random(x);
    struct ggml_tensor * ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_used, n_tok);
    for (int64_t t = 0; t < n_tok; ++t) {
        int32_t * row = (int32_t *)((char *) ids->data + t*ids->nb[1]);
        for (int64_t i = 0; i < n_used; ++i) {
            bool dup;
            do {  // distinct experts per token, as a router's top-k gives
                row[i] = (int32_t)(rng_u64() % (uint64_t) n_exp);
                dup = false;
                for (int64_t j = 0; j < i; ++j) dup = dup || row[j] == row[i];
            } while (dup);
        }
    }
    struct ggml_tensor * out = ggml_mul_mat_id(ctx, wt, x, ids);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    const enum ggml_status st = ggml_graph_compute_with_ctx(ctx, gf, n_threads);
    CHECK(st == GGML_STATUS_SUCCESS, "%s: compute status %d", what, (int) st);

    q8k_block * y = malloc(sizeof(q8k_block) * (size_t)((k + 255) / 256));
    for (int64_t t = 0; t < n_tok; ++t) {
        for (int64_t i = 0; i < n_used; ++i) {
            const int32_t e = *(const int32_t *)((const char *) ids->data + i*ids->nb[0] + t*ids->nb[1]);
            const float * xr = (const float *)((const char *) x->data + (i % ne11)*x->nb[1] + t*x->nb[2]);
            quantize_q8k(xr, k, y);
            for (int64_t r = 0; r < n; ++r) {
                const float got = *(const float *)((const char *) out->data + r*out->nb[0] + i*out->nb[1] + t*out->nb[2]);
                compare(what, &w, e * n + r, xr, y, got);
            }
        }
    }
    free(y);
    ggml_free(ctx);
    weight_free(&w);
}

// A corrupted companion must be rejected by ggml_bitcos_validate (never read out of bounds later).
static void test_validate_rejects(enum ggml_type type) {
    weight_ref w;
    weight_make(&w, type, 256, 40, 1, 0.4);
    struct ggml_context * ctx = new_ctx(8);
    struct ggml_tensor * t = weight_to_ggml(ctx, &w);
    struct ggml_tensor * c = t->src[0];
    const size_t cb = ggml_nbytes(c);
    uint8_t * cd = (uint8_t *) c->data;
    uint8_t * save = malloc(cb);
    memcpy(save, cd, cb);
    struct ggml_bitcos_header h;
    ggml_bitcos_read_header(cd, &h);
    char err[256];

    struct { const char * name; size_t off; uint8_t xor_mask; } cases[] = {
        { "magic",            0,                          0x01 },
        { "version",          4,                          0x02 },
        { "variant",          6,                          0x01 },
        { "row_group_log2",   7,                          0x08 },
        { "n_cols",           8,                          0x80 },
        { "n_rows",           16,                         0x01 },
        { "n_sign_bits",      32,                         0x01 },
        { "row_base_offset",  48,                         0x40 },
        { "pool_offset",      64,                         0x40 },
        { "pool_bytes",       72,                         0x40 },
        { "reserved",         100,                        0x01 },
        { "row_delta[1]",     (size_t) h.row_delta_offset + 2,         0x01 },
        { "row_base[last]",   (size_t) h.row_base_offset + 8*((h.n_rows - 1) >> h.row_group_log2), 0x01 },
        { "pool tail",        (size_t)(h.pool_offset + h.pool_bytes - 1), 0x01 },
    };
    for (size_t i = 0; i < sizeof(cases)/sizeof(cases[0]); ++i) {
        memcpy(cd, save, cb);
        cd[cases[i].off] ^= cases[i].xor_mask;
        CHECK(!ggml_bitcos_validate(t, t->data, cd, cb, err, sizeof(err)), "%s: corrupted %s accepted",
              ggml_type_name(type), cases[i].name);
    }
    memcpy(cd, save, cb);
    CHECK(!ggml_bitcos_validate(t, t->data, cd, cb - 64, err, sizeof(err)), "truncated companion accepted");
    CHECK(!ggml_bitcos_validate(t, t->data, cd, 100, err, sizeof(err)), "companion shorter than header accepted");
    // flipping one bitmap bit breaks the row index invariants
    ((uint8_t *) t->data)[0] ^= 1;
    CHECK(!ggml_bitcos_validate(t, t->data, cd, cb, err, sizeof(err)), "bitmap change not detected");
    ((uint8_t *) t->data)[0] ^= 1;
    CHECK(ggml_bitcos_validate(t, t->data, cd, cb, err, sizeof(err)), "restored tensor rejected: %s", err);
    free(save);
    ggml_free(ctx);
    weight_free(&w);
}

int main(int argc, char ** argv) {
    rng_seed(0x9e3779b97f4a7c15ull);
    (void) argc; (void) argv;
    const enum ggml_type types[2] = { GGML_TYPE_BITCOS_G128, GGML_TYPE_BITCOS_PT };
    const int64_t ks[3] = { 128, 384, 2048 };
    const int64_t batches[3] = { 1, 3, 17 };
    const double zs[3] = { 0.0, 0.5, 1.0 };
    const int threads[3] = { 1, 2, 3 };

    for (int ti = 0; ti < 2; ++ti) {
        test_validate_rejects(types[ti]);
        for (int ki = 0; ki < 3; ++ki) {
            for (int bi = 0; bi < 3; ++bi) {
                for (int zi = 0; zi < 3; ++zi) {
                    // n = 70: more than one 64-row run, and not a multiple of the thread count
                    test_mul_mat(types[ti], ks[ki], 70, 1, 1, batches[bi], zs[zi], threads[(ki + bi + zi) % 3], 0);
                }
            }
            // thread-count independence is implied by the bit-exact contract check; vary threads on one case too
            for (int th = 0; th < 3; ++th) {
                test_mul_mat(types[ti], ks[ki], 131, 1, 1, 5, 0.4, threads[th], 0);
            }
            // 3-D weight with broadcasting over dim 2 (each matrix used by two src1 slices)
            test_mul_mat(types[ti], ks[ki], 33, 3, 2, 4, 0.3, 2, 0);
            // a view of rows 7..n-1
            test_mul_mat(types[ti], ks[ki], 90, 1, 1, 3, 0.5, 2, 7);
            // MoE: experts [k, n, 6], 2 used per token, 1 and 9 tokens, src1 per slot or broadcast
            test_mul_mat_id(types[ti], ks[ki], 40, 6, 2, 1, false, 0.4, 2);
            test_mul_mat_id(types[ti], ks[ki], 70, 6, 3, 9, false, 0.4, 3);
            test_mul_mat_id(types[ti], ks[ki], 40, 6, 2, 5, true, 0.0, 1);
            test_mul_mat_id(types[ti], ks[ki], 40, 4, 4, 3, false, 1.0, 2);
        }
    }
    printf("test-bitcos-mm: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
