// bitcos-kernel-cases: runs kernel test cases written by Python through every kernel of the table this CPU can run,
// and writes every kernel's results back, for a kernel that Python cannot call in place (a cross-compiled build
// run under qemu-user: tests/test_kernels_aarch64.py; cases from ggml_bitcos.harness, the same descriptors the
// harness library gets).
//
//     bitcos-kernel-cases CASES OUT      prints "kernels: NAME ..." (the table, in order) and "cases: N" on stdout,
//                                        and the table's "BITCOS CPU kernel: NAME" line once on stderr
//
// CASES: little-endian records, each a header of 12 int64
//     k, nr, nc, unit_bytes, row_bytes, pool_bytes, has_row_scale, block_scale_bytes, block_scale_offset,
//     scale_stride, scale_row_bytes, block_scale_shift
// then the arrays: bits (nr * row_bytes), pool (pool_bytes), sign_pos (nr uint64), row scales (nr float32, when
// has_row_scale), the block scale array (block_scale_bytes; the descriptor points block_scale_offset bytes
// into it), activations (nc columns of ceil(k / 256) Q8_K blocks). A header with k == 0 ends the file.
// OUT: per case and per table entry, an int32 (1: the kernel ran, 0: this CPU cannot run it), nc * nr float32
// (column-major like dst; NaN where it did not run), then nc * nr float32 of its codes-form kernel
// (bitcos_kernel_codes_mm) on the case's rows decoded into the 2-bit codes form (bitcos_codes_decode).
#include "bitcos-kernels.h"

#include <stdio.h>
#include <stdlib.h>

static void * read_array(FILE * f, size_t n) {
    void * p = malloc(n ? n : 1);
    if (p == NULL || fread(p, 1, n, f) != n) {
        fprintf(stderr, "short read (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

static void write_all(FILE * f, const void * p, size_t n) {
    if (fwrite(p, 1, n, f) != n) {
        fprintf(stderr, "write failed\n");
        exit(2);
    }
}

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s CASES OUT\n", argv[0]);
        return 2;
    }
    FILE * in  = fopen(argv[1], "rb");
    FILE * out = fopen(argv[2], "wb");
    if (in == NULL || out == NULL) {
        perror("open");
        return 2;
    }
    printf("kernels:");
    for (int i = 0; i < bitcos_kernel_count(); ++i) {
        printf(" %s", bitcos_kernel_at(i)->name);
    }
    printf("\n");
    fflush(stdout);
    // the line the ggml glue logs at the first BITCOS mat-mul, on stderr here; asked twice, told once
    bitcos_kernel_best_told(NULL);
    bitcos_kernel_best_told(NULL);
    int64_t ncases = 0;
    for (;;) {
        int64_t h[12];
        if (fread(h, sizeof h, 1, in) != 1) {
            fprintf(stderr, "short header\n");
            return 2;
        }
        if (h[0] == 0) {
            break;
        }
        const int64_t k = h[0], nr = h[1], nc = h[2], nby = (k + BITCOS_Q8K_BLOCK - 1) / BITCOS_Q8K_BLOCK;
        bitcos_rows   w;
        memset(&w, 0, sizeof w);
        w.k                        = k;
        w.unit_bytes               = (size_t) h[3];
        w.row_bytes                = (size_t) h[4];
        uint8_t *  bits            = read_array(in, (size_t) (nr * h[4]));
        uint8_t *  pool            = read_array(in, (size_t) h[5]);
        uint64_t * sign_pos        = read_array(in, (size_t) nr * sizeof(uint64_t));
        float *    row_scale       = h[6] ? read_array(in, (size_t) nr * sizeof(float)) : NULL;
        uint8_t *  block_scale     = read_array(in, (size_t) h[7]);
        w.bits                     = bits;
        w.pool                     = pool;
        w.sign_pos                 = sign_pos;
        w.row_scale                = row_scale;
        w.block_scale              = row_scale != NULL ? NULL : block_scale + h[8];
        w.scale_stride             = (size_t) h[9];
        w.scale_row_bytes          = (size_t) h[10];
        w.block_scale_shift        = (int) h[11];
        bitcos_q8_K *        y     = read_array(in, (size_t) (nc * nby) * sizeof(bitcos_q8_K));
        const bitcos_q8_K ** ycols = malloc((size_t) nc * sizeof *ycols);
        float *              dst   = malloc((size_t) (nc * nr) * sizeof(float));
        float **             dcols = malloc((size_t) nc * sizeof *dcols);
        for (int64_t c = 0; c < nc; ++c) {
            ycols[c] = y + c * nby;
            dcols[c] = dst + c * nr;
        }
        const size_t rb    = bitcos_codes_row_bytes(k);
        uint8_t *    codes = malloc(rb * (size_t) nr);
        bitcos_codes_decode(&w, 0, nr, codes, rb);
        const bitcos_codes_rows cw = bitcos_codes_rows_of(&w, codes, rb);
        for (int i = 0; i < bitcos_kernel_count(); ++i) {
            const bitcos_kernel * kern = bitcos_kernel_at(i);
            const int32_t         ran  = kern->available() ? 1 : 0;
            for (int64_t j = 0; j < nc * nr; ++j) {
                dst[j] = NAN;
            }
            if (ran) {
                bitcos_kernel_mm(kern, &w, nr, ycols, nc, dcols, NULL);
            }
            write_all(out, &ran, sizeof ran);
            write_all(out, dst, (size_t) (nc * nr) * sizeof(float));
            for (int64_t j = 0; j < nc * nr; ++j) {
                dst[j] = NAN;
            }
            if (ran) {
                bitcos_kernel_codes_mm(kern, &cw, nr, ycols, nc, dcols);
            }
            write_all(out, dst, (size_t) (nc * nr) * sizeof(float));
        }
        free(codes);
        free(bits);
        free(pool);
        free(sign_pos);
        free(row_scale);
        free(block_scale);
        free(y);
        free(ycols);
        free(dst);
        free(dcols);
        ++ncases;
    }
    fclose(in);
    if (fclose(out) != 0) {
        perror("close");
        return 2;
    }
    printf("cases: %lld\n", (long long) ncases);
    return 0;
}
