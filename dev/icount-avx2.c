// Instruction counts per 32 weights of the AVX2 GEMVs, BITCOS vs llama.cpp's TQ2_0
// (docs/notes/2026-12-02-kernels-history.md, §6d): a driver for valgrind's callgrind, which counts instructions exactly
// whatever else the machine runs (valgrind cannot run AVX-512 code, so the AVX-512 kernel's count comes from its
// disassembly instead).
//
//   cc -O2 dev/icount-avx2.c -o /tmp/icount -ldl
//   # BITCOS: the AVX2 kernel object (x86-64-v3) of the kernel harness (build/kernels or the installed package)
//   valgrind --tool=callgrind --toggle-collect=bitcos_mm_avx2 /tmp/icount 64 2048 0.4 0 10
//   build/kernels/libbitcos_kernels.so # TQ2_0: ggml's AVX2 vec_dot from a GGML_NATIVE=OFF (x86-64-v3) build of the
//   patched llama.cpp valgrind --tool=callgrind --toggle-collect=ggml_vec_dot_tq2_0_q8_K /tmp/icount 64 2048 0.4 1 10
//   .../libggml-cpu.so # instructions per 32 weights = "Collected" / (rows * k / 32 * reps)
//
// Arguments: rows k zero_density which(0 = BITCOS PT / MATRIX, 1 = TQ2_0) reps library. The data are random (fixed
// seed): a bitmap of the given density with a consistent sign pool for BITCOS, random 2-bit codes for TQ2_0;
// both kernels' instruction counts do not depend on the values.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
typedef struct {
    float   d;
    int8_t  qs[256];
    int16_t bsums[16];
} q8k;
typedef struct {
    uint8_t  qs[64];
    uint16_t d;
} tq2;
// bitcos_h_mm (csrc/bitcos-harness.c, ABI 3; impl 1 = "avx2", bitcos_h_kernel_name(1)): impl, then the bitcos_rows
// fields k, bits, unit_bytes, row_bytes, pool, sign_pos, row_scale, block_scale, scale_stride, scale_row_bytes,
// block_scale_shift; nr, y, nc, dst
typedef int (*mm_fn)(int, int64_t, const uint8_t *, size_t, size_t, const uint8_t *, const uint64_t *, const float *,
                     const uint8_t *, size_t, size_t, int, int64_t, const q8k *, int64_t, float *);
typedef void (*vd_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
int main(int argc, char ** argv) {
    int    rows = atoi(argv[1]), k = atoi(argv[2]);
    double z     = atof(argv[3]);
    int    which = atoi(argv[4]);
    int    reps  = atoi(argv[5]);
    srand(1);
    int        nb     = k / 128;
    size_t     rb     = (size_t) nb * 16;
    uint8_t *  blocks = malloc(rows * rb);
    uint64_t * sp     = malloc(8 * (rows + 1));
    uint64_t   c      = 0;
    for (int r = 0; r < rows; r++) {
        sp[r] = c;
        for (size_t i = 0; i < rb * 8; i++) {
            int present = (rand() / (double) RAND_MAX) >= z;
            if (i % 8 == 0)
                blocks[r * rb + i / 8] = 0;
            if (present) {
                blocks[r * rb + i / 8] |= 1 << (i % 8);
                c++;
            }
        }
    }
    size_t    pb   = (c + 7) / 8 + 64;
    uint8_t * pool = calloc(pb, 1);
    for (size_t i = 0; i < (c + 7) / 8; i++)
        pool[i] = rand();
    int   nby = k / 256;
    q8k * y   = malloc(sizeof(q8k) * nby);
    for (int b = 0; b < nby; b++) {
        y[b].d = 0.01f;
        for (int i = 0; i < 256; i++)
            y[b].qs[i] = rand() % 255 - 127;
        for (int i = 0; i < 16; i++) {
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += y[b].qs[16 * i + j];
            y[b].bsums[i] = s;
        }
    }
    float * dst = malloc(4 * rows);
    if (which == 0) {
        void *  h  = dlopen(argv[6], RTLD_NOW);
        mm_fn   mm = (mm_fn) dlsym(h, "bitcos_h_mm");
        float * rs = malloc(4 * rows);
        for (int r = 0; r < rows; r++)
            rs[r] = 0.01f; // PT / MATRIX: the matrix scale per row
        for (int i = 0; i < reps; i++)
            mm(1, k, blocks, 16, rb, pool, sp, rs, NULL, 0, 0, 0, rows, y, 1, dst);
    } else {
        void * h           = dlopen(argv[6], RTLD_NOW);
        void (*init)(void) = dlsym(h, "ggml_cpu_init");
        init();
        vd_fn vd = (vd_fn) dlsym(h, "ggml_vec_dot_tq2_0_q8_K");
        tq2 * x  = malloc(sizeof(tq2) * nby * rows);
        for (int i = 0; i < nby * rows; i++) {
            for (int j = 0; j < 64; j++)
                x[i].qs[j] = rand();
            x[i].d = 0x2000;
        }
        for (int i = 0; i < reps; i++)
            for (int r = 0; r < rows; r++)
                vd(k, &dst[r], 0, x + (size_t) r * nby, 0, y, 0, 1);
    }
    printf("%f\n", dst[0]);
    return 0;
}
