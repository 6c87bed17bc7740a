// fuzz-bitcos-validate: random corruptions of BITCOS weights/companions against ggml_bitcos_validate().
//
// Compiled by tests/test_llama_build.py with -fsanitize=address,undefined from csrc/ggml-bitcos.c and
// csrc/bitcos-kernels-generic.c plus the patched tree's ggml.h (no ggml library needed). For every mutated
// tensor the validator must return without reading outside the buffers; when it accepts, the reference
// kernel is run over every row using the companion's row index, which must stay inside the buffers too
// (ASan aborts the run otherwise). Every variant (versions 1 and 2; row lengths any multiple the variant
// allows, partial last 128-weight units included). Deterministic: fixed seed, fixed iteration count.
#include "ggml.h"
#include "ggml-bitcos.h"
#include "bitcos-kernels.h"
#include "bitcos-test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ggml-bitcos.c only uses ggml_type_name for messages; this harness does not link ggml
const char * ggml_type_name(enum ggml_type type) {
    return type == GGML_TYPE_BITCOS_PT ? "bitcos_pt" : type == GGML_TYPE_BITCOS_G128 ? "bitcos_g128" : "bitcos";
}

int main(void) {
    rng_seed(0x2545f4914f6cdd1dull);
    const int iters    = 6000;
    int       accepted = 0, rejected = 0;
    for (int it = 0; it < iters; ++it) {
        const int            variant = it % BITCOS_VARIANT_COUNT;
        const enum ggml_type type    = (enum ggml_type) bitcos_variant_type_id(variant);
        const int64_t        k       = bitcos_variant_k_multiple(variant) * (int64_t) (1 + rng_u64() % 9);
        const int64_t        n = 1 + (int64_t) (rng_u64() % 40), mats = 1 + (int64_t) (rng_u64() % 2);
        const int64_t        rows   = n * mats;
        const int64_t        sblk   = bitcos_variant_scale_block(variant);
        const int64_t        nbs    = sblk ? rows * (k / sblk) : 0;
        int8_t *             codes  = malloc((size_t) (rows * k));
        uint16_t *           d      = malloc(sizeof(uint16_t) * (size_t) (nbs + 1));
        float *              scales = malloc(sizeof(float) * (size_t) rows); // PT / MATRIX use the first mats
        const unsigned       pz     = (unsigned) (rng_u64() % 101);
        for (int64_t i = 0; i < rows * k; ++i) {
            codes[i] = (rng_u64() % 100) < pz ? 0 : ((rng_u64() & 1) ? 1 : -1);
        }
        for (int64_t i = 0; i < nbs; ++i) {
            d[i] = 0x2c00; // 1/16
        }
        for (int64_t i = 0; i < rows; ++i) {
            scales[i] = 0.25f * (float) (1 + i % 3);
        }
        const size_t cb        = ggml_bitcos_encode(variant, k, rows, mats, codes, d, scales, NULL, NULL, 0);
        const size_t row_bytes = (size_t) bitcos_weight_row_bytes(variant, (uint64_t) k);
        const size_t wb_size   = (size_t) rows * row_bytes;
        uint8_t *    wb        = malloc(wb_size);
        uint8_t *    cd        = malloc(cb);
        if (cb == 0 || ggml_bitcos_encode(variant, k, rows, mats, codes, d, scales, wb, cd, cb) != cb) {
            fprintf(stderr, "encode failed (variant %d, k %lld)\n", variant, (long long) k);
            return 1;
        }
        struct ggml_tensor t;
        memset(&t, 0, sizeof(t));
        t.type  = type;
        t.ne[0] = k;
        t.ne[1] = n;
        t.ne[2] = mats;
        t.ne[3] = 1;
        char err[256];
        if (!ggml_bitcos_validate(&t, wb, cd, cb, err, sizeof(err))) {
            fprintf(stderr, "valid tensor rejected: %s\n", err);
            return 1;
        }
        // mutate: header bytes, index bytes, any byte, bitmap bytes, or the declared size
        size_t    csize = cb;
        const int n_mut = 1 + (int) (rng_u64() % 4);
        for (int m = 0; m < n_mut; ++m) {
            switch (rng_u64() % 5) {
                case 0:
                    cd[rng_u64() % BITCOS_HEADER_BYTES] ^= (uint8_t) (1u << (rng_u64() % 8));
                    break;
                case 1:
                    cd[BITCOS_HEADER_BYTES + rng_u64() % (cb - BITCOS_HEADER_BYTES)] ^=
                        (uint8_t) (1u << (rng_u64() % 8));
                    break;
                case 2:
                    cd[rng_u64() % cb] = (uint8_t) rng_u64();
                    break;
                case 3:
                    wb[rng_u64() % wb_size] ^= (uint8_t) (1u << (rng_u64() % 8));
                    break;
                case 4:
                    csize = (size_t) (rng_u64() % (cb + 1));
                    break;
            }
        }
        // the buffer handed to the validator is exactly csize bytes (ASan sees reads beyond it)
        uint8_t * cexact = malloc(csize ? csize : 1);
        memcpy(cexact, cd, csize < cb ? csize : cb);
        if (ggml_bitcos_validate(&t, wb, cexact, csize, err, sizeof(err))) {
            accepted++;
            struct ggml_bitcos_header h;
            ggml_bitcos_read_header(cexact, &h);
            uint64_t * sp = malloc(sizeof(uint64_t) * (size_t) rows);
            for (int64_t r = 0; r < rows; ++r) {
                sp[r] = ggml_bitcos_sign_pos(cexact, &h, (uint64_t) r);
            }
            bitcos_q8_K *       y       = calloc((size_t) ((k + 255) / 256), sizeof(bitcos_q8_K));
            float *             out     = malloc(sizeof(float) * (size_t) rows);
            const bitcos_q8_K * ys[1]   = { y };
            float *             outs[1] = { out };
            // the descriptor as the CPU glue fills it, from the validated header only
            float *             rs      = malloc(sizeof(float) * (size_t) rows);
            for (int64_t r = 0; r < rows; ++r) {
                rs[r] = ggml_bitcos_row_scale(cexact, &h, (uint64_t) r);
            }
            for (int64_t m = 0; m < mats; ++m) {
                bitcos_rows br;
                memset(&br, 0, sizeof br);
                br.k          = k;
                br.bits       = wb + (size_t) (m * n) * row_bytes;
                br.unit_bytes = bitcos_block_bytes(h.variant);
                br.row_bytes  = row_bytes;
                br.pool       = cexact + h.pool_offset;
                br.sign_pos   = sp + m * n;
                if (bitcos_variant_scale_block(h.variant) == 0) {
                    br.row_scale = rs + m * n;
                } else if (h.variant == BITCOS_VARIANT_G128) {
                    br.block_scale     = br.bits + offsetof(block_bitcos_g128, d);
                    br.scale_stride    = sizeof(block_bitcos_g128);
                    br.scale_row_bytes = row_bytes;
                } else {
                    br.block_scale       = ggml_bitcos_block_scales(cexact, &h, (uint64_t) (m * n));
                    br.scale_stride      = sizeof(uint16_t);
                    br.scale_row_bytes   = (size_t) ggml_bitcos_scale_row_bytes(&h);
                    br.block_scale_shift = h.variant == BITCOS_VARIANT_B256;
                }
                outs[0] = out + m * n;
                bitcos_mm_generic(&br, n, ys, 1, outs);
            }
            free(rs);
            free(sp);
            free(y);
            free(out);
        } else {
            rejected++;
        }
        free(cexact);
        free(codes);
        free(d);
        free(scales);
        free(wb);
        free(cd);
    }
    printf("fuzz-bitcos-validate: %d iterations, %d rejected, %d accepted (then decoded in bounds)\n", iters, rejected,
           accepted);
    return rejected > 0 ? 0 : 1; // a fuzzer that never sees a rejection is not mutating anything
}
