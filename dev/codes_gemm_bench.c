// Timing driver for the x86 codes-form GEMM (docs/KERNELS.md §8): several builds of a codes kernel (tile shapes,
// the committed one as `base`) and TQ2_0's vec_dot from the installed ggml, called the way the ggml-cpu glue calls
// them (runs of 64 rows x 64 columns; TQ2_0 as ggml's mul_mat: 16 x 16 blocks of one vec_dot per output), one
// thread, in interleaved rounds. Every build's output must equal the generic codes kernel's bit for bit.
// Built and run by dev/codes_gemm_bench.sh, which names the builds in VARIANTS.
#include "bitcos-kernels.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define X(name) void name(const bitcos_codes_rows *, int64_t, const bitcos_q8_K * const *, int64_t, float * const *);
VARIANTS
#undef X

typedef struct {
    const char *       name;
    bitcos_codes_mm_fn fn;
} variant;

static const variant variants[] = {
#define X(name) { #name, name },
    VARIANTS
#undef X
};
#define NV ((int) (sizeof variants / sizeof variants[0]))

typedef void (*vec_dot_fn)(int n, float * s, size_t bs, const void * x, size_t bx, const void * y, size_t by, int nrc);

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static uint16_t fp16_of(float f) { // positive normal values in range only
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t) ((((u >> 23) & 0xff) - 112) << 10 | ((u >> 13) & 0x3ff));
}

typedef struct {
    int64_t              n, k, nc, nby;
    uint8_t *            codes;
    float *              row_scale;
    uint8_t *            block_scale; // B256: fp16 per 256 weights
    bitcos_q8_K *        yq;
    const bitcos_q8_K ** y;
    uint8_t *            tq2; // TQ2_0 blocks: 64 code bytes + fp16 d
} problem;

// The glue's calls (csrc/ggml-bitcos-cpu.c): runs of 64 rows, each against the columns 64 at a time.
static void run_codes(const problem * p, bitcos_codes_mm_fn fn, float * out) {
    float * dcol[64];
    for (int64_t r0 = 0; r0 < p->n; r0 += 64) {
        const int64_t     nr = p->n - r0 < 64 ? p->n - r0 : 64;
        bitcos_codes_rows w;
        memset(&w, 0, sizeof w);
        w.k         = p->k;
        w.codes     = p->codes + (size_t) r0 * p->nby * 64;
        w.row_bytes = (size_t) p->nby * 64;
        if (p->row_scale) {
            w.row_scale = p->row_scale + r0;
        } else {
            w.block_scale       = p->block_scale + (size_t) r0 * p->nby * 2;
            w.scale_stride      = 2;
            w.scale_row_bytes   = (size_t) p->nby * 2;
            w.block_scale_shift = 1;
        }
        for (int64_t c0 = 0; c0 < p->nc; c0 += 64) {
            const int64_t cn = p->nc - c0 < 64 ? p->nc - c0 : 64;
            for (int64_t c = 0; c < cn; ++c) {
                dcol[c] = out + (size_t) (c0 + c) * p->n + r0;
            }
            fn(&w, nr, p->y + c0, cn, dcol);
        }
    }
}

// ggml's mul_mat for a type without a GEMM: 16 x 16 blocks, one vec_dot per (row, column), rows in 64-row chunks.
static void run_tq2(const problem * p, vec_dot_fn vd, float * out) {
    const size_t rb = (size_t) p->nby * 66;
    for (int64_t r0 = 0; r0 < p->n; r0 += 64) {
        const int64_t r1 = p->n < r0 + 64 ? p->n : r0 + 64;
        for (int64_t c0 = 0; c0 < p->nc; c0 += 16) {
            for (int64_t i0 = r0; i0 < r1; i0 += 16) {
                for (int64_t c = c0; c < c0 + 16 && c < p->nc; ++c) {
                    for (int64_t i = i0; i < i0 + 16 && i < r1; ++i) {
                        vd((int) p->k, out + (size_t) c * p->n + i, 0, p->tq2 + i * rb, 0, p->y[c], 0, 1);
                    }
                }
            }
        }
    }
}

static problem make(int64_t n, int64_t k, int64_t nc, const char * kind) {
    problem p;
    memset(&p, 0, sizeof p);
    p.n = n, p.k = k, p.nc = nc, p.nby = (k + 255) / 256;
    p.codes = aligned_alloc(64, (size_t) n * p.nby * 64);
    for (size_t j = 0; j < (size_t) n * p.nby * 64; ++j) {
        uint8_t b = 0;
        for (int g = 0; g < 4; ++g) {
            b |= (uint8_t) ((rnd() % 3) << (2 * g));
        }
        p.codes[j] = b;
    }
    if (!strcmp(kind, "b256")) {
        p.block_scale = malloc((size_t) n * p.nby * 2);
        for (int64_t j = 0; j < n * p.nby; ++j) {
            const uint16_t h = fp16_of(0.5f + (float) (rnd() % 1000) / 1000.0f);
            memcpy(p.block_scale + 2 * j, &h, 2);
        }
    } else {
        p.row_scale     = malloc((size_t) n * sizeof(float));
        const float one = 0.0123f;
        for (int64_t i = 0; i < n; ++i) {
            p.row_scale[i] = !strcmp(kind, "row") ? 0.01f + (float) (rnd() % 1000) / 7000.0f : one;
        }
    }
    p.yq = aligned_alloc(64, ((size_t) nc * p.nby * sizeof(bitcos_q8_K) + 63) / 64 * 64);
    p.y  = malloc((size_t) nc * sizeof *p.y);
    for (int64_t c = 0; c < nc; ++c) {
        for (int64_t b = 0; b < p.nby; ++b) {
            bitcos_q8_K * q = &p.yq[c * p.nby + b];
            q->d            = (float) (rnd() % 10000) / 3e5f * ((rnd() & 1) ? 1 : -1);
            for (int j = 0; j < 256; ++j) {
                q->qs[j] = (int8_t) (rnd() % 256 - 128);
            }
            for (int g = 0; g < 16; ++g) {
                int s = 0;
                for (int j = 0; j < 16; ++j) {
                    s += q->qs[16 * g + j];
                }
                q->bsums[g] = (int16_t) s;
            }
        }
        p.y[c] = &p.yq[c * p.nby];
    }
    p.tq2 = malloc((size_t) n * p.nby * 66);
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t b = 0; b < p.nby; ++b) {
            uint8_t * t = p.tq2 + (i * p.nby + b) * 66;
            memcpy(t, p.codes + (i * p.nby + b) * 64, 64);
            const uint16_t h = p.row_scale ? fp16_of(p.row_scale[i]) : 0;
            memcpy(t + 64, p.block_scale ? p.block_scale + 2 * (i * p.nby + b) : (const uint8_t *) &h, 2);
        }
    }
    return p;
}

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

int main(int argc, char ** argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s N K NC KIND(matrix|row|b256) ROUNDS [libggml-cpu.so]\n", argv[0]);
        return 2;
    }
    const int64_t n = atoll(argv[1]), k = atoll(argv[2]), nc = atoll(argv[3]);
    const int     rounds = atoi(argv[5]);
    problem       p      = make(n, k, nc, argv[4]);

    vec_dot_fn vd = NULL;
    if (argc > 6 && strcmp(argv[4], "row") != 0) { // TQ2_0 has one fp16 d per block: not ROW's fp32 scales
        void * h = dlopen(argv[6], RTLD_NOW);
        if (h) {
            void (*init)(void)          = (void (*)(void)) dlsym(h, "ggml_cpu_init");
            const void * (*traits)(int) = (const void * (*) (int) ) dlsym(h, "ggml_get_type_traits_cpu");
            if (init && traits) {
                init();
                const struct {
                    void * from_float;
                    void * vec_dot;
                } * t = traits(35); // GGML_TYPE_TQ2_0
                vd    = (vec_dot_fn) t->vec_dot;
            }
        }
        if (!vd) {
            fprintf(stderr, "no TQ2_0 vec_dot from %s: %s\n", argv[6], dlerror());
        }
    }

    const int nt  = NV + (vd ? 1 : 0);
    float *   ref = malloc((size_t) nc * n * sizeof(float));
    float *   out = malloc((size_t) nc * n * sizeof(float));
    // the reference: the generic codes kernel on the first 128 columns (it is ~200x slower)
    problem   q   = p;
    q.nc          = nc < 128 ? nc : 128;
    run_codes(&q, bitcos_codes_mm_generic, ref);
    for (int v = 0; v < NV; ++v) {
        memset(out, 0xff, (size_t) nc * n * sizeof(float));
        run_codes(&p, variants[v].fn, out);
        if (memcmp(out, ref, (size_t) q.nc * n * sizeof(float)) != 0) {
            fprintf(stderr, "%s differs from the generic codes kernel\n", variants[v].name);
            return 1;
        }
    }
    if (vd) { // TQ2_0 equals the contract only for the same scales: MATRIX's fp32 scale rounds to fp16 there
        run_tq2(&p, vd, out);
    }

    double * t = calloc((size_t) rounds * nt, sizeof(double));
    for (int r = 0; r < rounds; ++r) {
        for (int v = 0; v < nt; ++v) {
            double best = 1e30;
            for (int rep = 0; rep < 2; ++rep) {
                const double t0 = now();
                if (v < NV) {
                    run_codes(&p, variants[v].fn, out);
                } else {
                    run_tq2(&p, vd, out);
                }
                const double dt = now() - t0;
                best            = dt < best ? dt : best;
            }
            t[r * nt + v] = best;
        }
    }
    printf("N=%lld K=%lld nc=%lld %s, 1 thread, %d rounds (each the best of 2 calls); ms: min / median; ratio to "
           "the first: median (range) over rounds\n",
           (long long) n, (long long) k, (long long) nc, argv[4], rounds);
    for (int v = 0; v < nt; ++v) {
        double a[256], ratio[256];
        for (int r = 0; r < rounds; ++r) {
            a[r]     = t[r * nt + v];
            ratio[r] = t[r * nt] / t[r * nt + v];
        }
        qsort(a, rounds, sizeof(double), cmp_double);
        qsort(ratio, rounds, sizeof(double), cmp_double);
        const double ns32 = a[0] * 1e9 / ((double) n * k * nc / 32);
        printf("  %-20s %8.2f / %8.2f ms  %.3f ns/32w/col  speed %.3fx (%.3f-%.3f)\n",
               v < NV ? variants[v].name : "tq2_0", a[0] * 1e3, a[rounds / 2] * 1e3, ns32, ratio[rounds / 2], ratio[0],
               ratio[rounds - 1]);
    }
    return 0;
}
