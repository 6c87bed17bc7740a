// fuzz-bitcos-kernels: random valid BITCOS matrices through the generic, AVX2 and AVX-512 kernels, every input
// buffer ending exactly at a PROT_NONE guard page, results compared with the generic kernel bit for bit.
//
// Built by tests/test_fuzz.py (docs/FUZZING.md) from csrc/bitcos-kernels-generic.c and csrc/bitcos-kernels-x86.c
// exactly as the harness library builds them (root CMakeLists.txt: the x86 file twice, x86-64-v3 with AVX-512
// off -> bitcos_mm_avx2_v3, x86-64-v4 + VNNI & co. -> bitcos_mm_avx512_v4; the generic file with baseline
// flags), all with -fsanitize=address,undefined where the compiler has them. This file has no ggml dependency.
//
// Each case (seeded: case i of seed s is reproducible alone with --seed s --first i --cases 1):
//   * a random tensor of any variant (version 1: G128, PT; version 2: MATRIX, ROW, B128, B256), k any multiple
//     the variant allows up to 6144 (for MATRIX / ROW any multiple of 32: partial last 128-weight units of
//     32, 64, 96), 1 .. 80 rows, a zero density drawn per case from {0, 0.01, 0.3, 0.5, 0.95, 0.99, 1,
//     uniform} with whole empty or full units and rows mixed in, fp16 block scales (G128 in the blocks,
//     B128 / B256 in their own buffer; neighbouring 128-halves equal half of the time, zero, subnormal and
//     65504 among them), fp32 row scales (PT / MATRIX one value for the run, ROW one per row, zero among them);
//   * a run of consecutive rows [r0, r0 + nr) of it, biased to start mid-tensor and to end at the last row
//     (whose sign cursor ends exactly at S, the tensor's sign count);
//   * placed in guard-page buffers (mmap, the page after the buffer PROT_NONE): the run's weight rows
//     (exactly nr * row_bytes: a version-2 row is k/8 bytes, so its partial last unit ends at the guard), the
//     run's block scales (exactly nr * scale_row_bytes) or row scales (nr floats), the tensor's sign pool with exactly the format's tail (FORMAT.md §4.4:
//     roundup(ceil(S/8), 64) + 64 bytes, every bit past S zero), the run's sign positions (nr u64), each
//     activation column (ceil(k/256) Q8_K blocks, zero-padded past k as the contract asks) and each
//     destination column (nr floats), each ending at its guard page; with --front the buffers start right
//     after a PROT_NONE page instead (underflow), half of them 8..56 bytes later (only 8-byte aligned); --short-tail N takes N bytes off the pool's tail, a self-test
//     that the guard is live (a kernel that loads a whole register near the end of the signs must then fault);
//   * nc = 1 .. 20 activation columns (GEMV and the GEMM tiles), Q8_K scales of both signs;
//   * every kernel this CPU can run (generic always; AVX2 / AVX-512 when the CPU has every extension their
//     object was compiled for) is called, and each float result must equal the generic one bit for bit
//     (NaN results, which only overflowing extreme scales can make, must be NaN in both).
// Exit status: 0 when every case matched, 1 on a mismatch (the case and the first differing value printed),
// a signal / sanitizer report on a bad access.
#define _GNU_SOURCE
#include "bitcos-kernels.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if !defined(FUZZ_NO_X86)   // tests/fuzzing.py defines it where the x86 objects are not built
void bitcos_mm_avx2_v3(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                       float * const * dst);
void bitcos_mm_avx512_v4(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                         float * const * dst);
#endif

#define MAX_COLS 20

// ---- deterministic PRNG (splitmix64 seeding, xorshift64*) ----
static uint64_t g_rng;
static uint64_t rnd(void) {
    g_rng ^= g_rng >> 12; g_rng ^= g_rng << 25; g_rng ^= g_rng >> 27;
    return g_rng * 2685821657736338717ull;
}
static uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static uint64_t below(uint64_t n) { return n ? rnd() % n : 0; }
static double unif(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }

// ---- guard-page buffers ----
static size_t g_page;
static int    g_front;   // 1: buffers start right after a PROT_NONE page; 0: they end right before one
static size_t g_short_tail;  // --short-tail N: the pool gets N bytes less than the format's tail (self-test)

typedef struct { uint8_t * map; size_t map_len; uint8_t * p; } gbuf;

static gbuf galloc(size_t n) {
    gbuf b;
    const size_t data_pages = (n + g_page - 1) / g_page + (n == 0);
    b.map_len = (data_pages + 1) * g_page;
    b.map = mmap(NULL, b.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b.map == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    if (g_front) {
        // half of the buffers start 8..56 bytes after the guard: only 8-byte aligned, as the companion
        // sections of a GGUF with general.alignment 8 are under mmap
        const size_t mis = (rnd() & 1) ? 8 * (size_t)(1 + below(7)) : 0;
        if (n + mis > data_pages * g_page) {
            munmap(b.map, b.map_len);
            b.map_len += g_page;
            b.map = mmap(NULL, b.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (b.map == MAP_FAILED) { perror("mmap"); exit(2); }
        }
        if (mprotect(b.map, g_page, PROT_NONE) != 0) { perror("mprotect"); exit(2); }
        b.p = b.map + g_page + mis;
    } else {
        if (mprotect(b.map + data_pages * g_page, g_page, PROT_NONE) != 0) { perror("mprotect"); exit(2); }
        b.p = b.map + data_pages * g_page - n;
    }
    return b;
}
static void gfree(gbuf * b) {
    munmap(b->map, b->map_len);
    b->map = NULL;
}

// ---- values ----
static uint16_t rand_fp16_scale(void) {
    switch (below(16)) {
    case 0:  return 0;                                        // +0
    case 1:  return (uint16_t)(1 + below(0x3ff));             // subnormal
    case 2:  return 0x7bff;                                   // 65504, the largest valid scale
    case 3:  return (uint16_t)(0x0400 + below(0x7800));       // any normal
    default: return (uint16_t)(0x2000 + below(0x2000));       // 2^-7 .. 2: the usual range
    }
}

static float rand_q8_d(void) {
    float d;
    switch (below(12)) {
    case 0:  d = 16384.0f; break;
    case 1:  d = 1e-8f; break;
    default: d = (float)(unif() * 0.05 + 1e-4); break;
    }
    return (rnd() & 1) ? -d : d;
}

typedef struct {
    uint64_t seed, index;
    int variant;
    int64_t k, rows, r0, nr, nc;
    double z;
    uint64_t n_signs;
} case_desc;

static const char * variant_name(int v) {
    static const char * names[BITCOS_VARIANT_COUNT] = { "G128", "PT", "MATRIX", "ROW", "B128", "B256" };
    return v >= 0 && v < BITCOS_VARIANT_COUNT ? names[v] : "?";
}

static void print_case(FILE * f, const case_desc * c) {
    fprintf(f, "case seed=%" PRIu64 " index=%" PRIu64 " variant=%s k=%" PRId64 " rows=%" PRId64 " run=[%" PRId64
               ", %" PRId64 ") nc=%" PRId64 " z=%.3f S=%" PRIu64 " %s\n", c->seed, c->index,
            variant_name(c->variant), c->k, c->rows, c->r0, c->r0 + c->nr, c->nc, c->z,
            c->n_signs, g_front ? "front-guard" : "end-guard");
}

typedef struct { const char * name; bitcos_mm_fn fn; } impl;

static uint64_t g_nan_cases = 0;

// Runs one case; returns 0 when every kernel matched the generic one.
static int run_case(uint64_t seed, uint64_t index, const impl * impls, int n_impls) {
    g_rng = splitmix(seed * 0x100000001b3ull ^ splitmix(index + 1)) | 1;
    case_desc c = { .seed = seed, .index = index };
    c.variant = (int)below(BITCOS_VARIANT_COUNT);
    const int64_t kmul = bitcos_variant_k_multiple(c.variant);
    const int64_t kmax = 48 * QK_BITCOS / kmul, ksmall = 6 * QK_BITCOS / kmul;   // up to 48 or 6 units
    c.k = kmul * (below(4) == 0 ? 1 + (int64_t)below((uint64_t)kmax) : 1 + (int64_t)below((uint64_t)ksmall));
    c.rows = below(3) == 0 ? 1 + (int64_t)below(80) : 1 + (int64_t)below(12);
    static const double zs[] = { 0.0, 0.01, 0.3, 0.5, 0.95, 0.99, 1.0, -1.0 };
    c.z = zs[below(8)];
    if (c.z < 0) {
        c.z = unif();
    }
    // the run: mid-tensor start half of the time, ending at the last row half of the time
    c.r0 = (rnd() & 1) ? (int64_t)below((uint64_t)c.rows) : 0;
    c.nr = (rnd() & 1) ? c.rows - c.r0 : 1 + (int64_t)below((uint64_t)(c.rows - c.r0));
    static const int64_t ncs[] = { 1, 1, 1, 2, 3, 4, 5, 8, 9, 16, 17, 20 };
    c.nc = ncs[below(12)];

    const int64_t nu = (c.k + QK_BITCOS - 1) / QK_BITCOS;     // 128-weight units, the last maybe partial
    const size_t ub = bitcos_block_bytes(c.variant);           // unit stride: 18 (G128), else 16
    const int v1 = bitcos_variant_version(c.variant) == 1;
    const size_t row_bytes = v1 ? (size_t)nu * ub : (size_t)(c.k / 8);
    const int64_t nby = (nu + 1) / 2;
    const int64_t sblk = bitcos_variant_scale_block(c.variant);   // 0: row scales

    // codes of the whole tensor, with empty / full units and rows mixed in
    int8_t * codes = malloc((size_t)(c.rows * c.k));
    for (int64_t r = 0; r < c.rows; ++r) {
        const int row_mode = (int)below(10);                 // 0: empty row, 1: full row, else per unit
        for (int64_t b = 0; b < nu; ++b) {
            const int blk_mode = row_mode == 0 ? 0 : row_mode == 1 ? 1 : (int)below(12);
            for (int64_t j = 0; j < QK_BITCOS && b * QK_BITCOS + j < c.k; ++j) {
                int8_t t;
                if (blk_mode == 0) {
                    t = 0;
                } else if (blk_mode == 1) {
                    t = (rnd() & 1) ? 1 : -1;
                } else {
                    t = unif() < c.z ? 0 : ((rnd() & 1) ? 1 : -1);
                }
                codes[r * c.k + b * QK_BITCOS + j] = t;
            }
        }
    }
    // signs of the whole tensor and each row's first sign position
    uint64_t * pos_all = malloc(sizeof(uint64_t) * (size_t)(c.rows + 1));
    uint64_t S = 0;
    for (int64_t r = 0; r < c.rows; ++r) {
        pos_all[r] = S;
        for (int64_t i = 0; i < c.k; ++i) {
            S += codes[r * c.k + i] != 0;
        }
    }
    pos_all[c.rows] = S;
    c.n_signs = S;
    const size_t pool_bytes = ((S + 7) / 8 + 63) / 64 * 64 + BITCOS_POOL_TAIL_BYTES;   // FORMAT.md §4.4

    gbuf pool = galloc(pool_bytes - g_short_tail);
    memset(pool.p, 0, pool_bytes - g_short_tail);
    {
        uint64_t p = 0;
        for (int64_t i = 0; i < c.rows * c.k; ++i) {
            if (codes[i] != 0) {
                if (codes[i] < 0) {
                    pool.p[p >> 3] |= (uint8_t)(1u << (p & 7));
                }
                ++p;
            }
        }
    }
    // the run's weight rows (v1 blocks with G128's scale after each bitmap; v2 plain k/8-byte bitmaps)
    gbuf blocks = galloc((size_t)c.nr * row_bytes);
    memset(blocks.p, 0, (size_t)c.nr * row_bytes);
    for (int64_t r = 0; r < c.nr; ++r) {
        const int8_t * t = codes + (c.r0 + r) * c.k;
        for (int64_t j = 0; j < c.k; ++j) {
            if (t[j] != 0) {
                blocks.p[(size_t)r * row_bytes + (size_t)(j / QK_BITCOS) * ub + (size_t)(j % QK_BITCOS) / 8] |=
                    (uint8_t)(1u << (j & 7));
            }
        }
    }
    // scales: fp16 per 128 (G128 in the blocks, B128 in its own buffer) or per 256 (B256), else fp32 per row
    const size_t scale_row_bytes = sblk && !v1 ? sizeof(uint16_t) * (size_t)(c.k / sblk) : 0;
    gbuf sbuf = galloc(sblk ? (v1 ? 0 : (size_t)c.nr * scale_row_bytes) : sizeof(float) * (size_t)c.nr);
    if (sblk) {
        uint16_t prev_d = 0;
        for (int64_t r = 0; r < c.nr; ++r) {
            for (int64_t b = 0; b < c.k / sblk; ++b) {
                // the second half of a Q8_K block shares its scale half of the time (the contract's one-D path)
                const uint16_t d = (sblk == QK_BITCOS && (b & 1) && (rnd() & 1)) ? prev_d : rand_fp16_scale();
                uint8_t * dst = v1 ? blocks.p + (size_t)r * row_bytes + (size_t)b * ub + BITCOS_BITMAP_BYTES
                                   : sbuf.p + (size_t)r * scale_row_bytes + sizeof(uint16_t) * (size_t)b;
                memcpy(dst, &d, sizeof d);
                prev_d = d;
            }
        }
    } else {
        const float s0 = below(10) == 0 ? 0.0f : (float)(unif() * 4.0);
        for (int64_t r = 0; r < c.nr; ++r) {
            const float s = c.variant == BITCOS_VARIANT_ROW ? (below(10) == 0 ? 0.0f : (float)(unif() * 4.0)) : s0;
            memcpy(sbuf.p + sizeof(float) * (size_t)r, &s, sizeof s);
        }
    }
    gbuf spos = galloc(sizeof(uint64_t) * (size_t)c.nr);
    memcpy(spos.p, pos_all + c.r0, sizeof(uint64_t) * (size_t)c.nr);

    // activations: one guard-page buffer per column
    gbuf ybuf[MAX_COLS];
    const bitcos_q8_K * ycols[MAX_COLS];
    for (int64_t col = 0; col < c.nc; ++col) {
        ybuf[col] = galloc(sizeof(bitcos_q8_K) * (size_t)nby);
        bitcos_q8_K * y = (bitcos_q8_K *)(void *)ybuf[col].p;
        const int small = below(3) == 0;
        for (int64_t b = 0; b < nby; ++b) {
            y[b].d = rand_q8_d();
            for (int j = 0; j < BITCOS_Q8K_BLOCK; ++j) {
                const int64_t kk = b * BITCOS_Q8K_BLOCK + j;
                int8_t q = 0;
                if (kk < c.k) {
                    const int sel = (int)below(20);
                    q = sel == 0 ? -128 : sel == 1 ? 127 : small ? (int8_t)((int)below(7) - 3)
                                                                 : (int8_t)((int)below(255) - 127);
                }
                y[b].qs[j] = q;
            }
            for (int g = 0; g < BITCOS_Q8K_BLOCK / 16; ++g) {
                int s = 0;
                for (int j = 0; j < 16; ++j) {
                    s += y[b].qs[16*g + j];
                }
                y[b].bsums[g] = (int16_t)s;
            }
        }
        ycols[col] = y;
    }

    bitcos_rows w;
    memset(&w, 0, sizeof w);
    w.k          = c.k;
    w.bits       = blocks.p;
    w.unit_bytes = ub;
    w.row_bytes  = row_bytes;
    w.pool       = pool.p;
    w.sign_pos   = (const uint64_t *)(const void *)spos.p;
    if (!sblk) {
        w.row_scale = (const float *)(const void *)sbuf.p;
    } else if (v1) {
        w.block_scale     = blocks.p + BITCOS_BITMAP_BYTES;
        w.scale_stride    = ub;
        w.scale_row_bytes = row_bytes;
    } else {
        w.block_scale       = sbuf.p;
        w.scale_stride      = sizeof(uint16_t);
        w.scale_row_bytes   = scale_row_bytes;
        w.block_scale_shift = sblk == 256;
    }

    float * ref = malloc(sizeof(float) * (size_t)(c.nr * c.nc));
    int rc = 0;
    for (int m = 0; m < n_impls && rc == 0; ++m) {
        gbuf dbuf[MAX_COLS];
        float * dcols[MAX_COLS];
        for (int64_t col = 0; col < c.nc; ++col) {
            dbuf[col] = galloc(sizeof(float) * (size_t)c.nr);
            memset(dbuf[col].p, 0xff, sizeof(float) * (size_t)c.nr);   // NaN: a row left unwritten shows
            dcols[col] = (float *)(void *)dbuf[col].p;
        }
        impls[m].fn(&w, c.nr, ycols, c.nc, dcols);
        for (int64_t col = 0; col < c.nc && rc == 0; ++col) {
            for (int64_t i = 0; i < c.nr; ++i) {
                float * want = &ref[col * c.nr + i];
                const float got = dcols[col][i];
                if (m == 0) {
                    *want = got;
                    continue;
                }
                uint32_t a, b;
                memcpy(&a, want, 4);
                memcpy(&b, &got, 4);
                const int both_nan = *want != *want && got != got;
                if (a != b && !both_nan) {
                    print_case(stdout, &c);
                    printf("MISMATCH %s vs generic: column %" PRId64 " row %" PRId64 " (tensor row %" PRId64
                           "): %a (0x%08x) != %a (0x%08x)\n", impls[m].name, col, i, c.r0 + i, (double)got, b,
                           (double)*want, a);
                    rc = 1;
                    break;
                }
            }
        }
        if (m == 0) {
            for (int64_t j = 0; j < c.nr * c.nc; ++j) {
                if (ref[j] != ref[j]) {
                    ++g_nan_cases;
                    break;
                }
            }
        }
        for (int64_t col = 0; col < c.nc; ++col) {
            gfree(&dbuf[col]);
        }
    }
    free(ref);
    for (int64_t col = 0; col < c.nc; ++col) {
        gfree(&ybuf[col]);
    }
    gfree(&spos);
    gfree(&sbuf);
    gfree(&blocks);
    gfree(&pool);
    free(pos_all);
    free(codes);
    return rc;
}

#if !defined(FUZZ_NO_X86)
static int cpu_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") &&
           __builtin_cpu_supports("f16c");
}
static int cpu_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("avx512bitalg") &&
           __builtin_cpu_supports("avx512vpopcntdq") && __builtin_cpu_supports("bmi2");
}
#endif

int main(int argc, char ** argv) {
    uint64_t seed = 1, first = 0, cases = 2000;
    double seconds = 0;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "--first") && i + 1 < argc) {
            first = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "--cases") && i + 1 < argc) {
            cases = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
            seconds = strtod(argv[++i], NULL);     // stop early when this much time has passed
        } else if (!strcmp(argv[i], "--short-tail") && i + 1 < argc) {
            // self-test of the guard: with less than the format's tail some read must fault
            g_short_tail = (size_t)strtoull(argv[++i], NULL, 0);
            if (g_short_tail > BITCOS_POOL_TAIL_BYTES) {
                g_short_tail = BITCOS_POOL_TAIL_BYTES;
            }
        } else if (!strcmp(argv[i], "--front")) {
            g_front = 1;
        } else {
            fprintf(stderr, "usage: %s [--seed S] [--first I] [--cases N] [--seconds T] [--front] [--short-tail N]\n", argv[0]);
            return 2;
        }
    }
    g_page = (size_t)sysconf(_SC_PAGESIZE);
    impl impls[3];
    int n = 0;
    impls[n++] = (impl){ "generic", bitcos_mm_generic };
#if !defined(FUZZ_NO_X86)
    if (cpu_avx2()) {
        impls[n++] = (impl){ "avx2", bitcos_mm_avx2_v3 };
    }
    if (cpu_avx512()) {
        impls[n++] = (impl){ "avx512", bitcos_mm_avx512_v4 };
    }
#endif
    printf("kernels:");
    for (int i = 0; i < n; ++i) {
        printf(" %s", impls[i].name);
    }
    printf(" (BITCOS_FMA=%d, %s guard pages)\n", BITCOS_FMA, g_front ? "front" : "end");
    fflush(stdout);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t done = 0;
    for (uint64_t i = first; i < first + cases; ++i) {
        if (run_case(seed, i, impls, n) != 0) {
            printf("FAILED after %" PRIu64 " cases\n", done);
            return 1;
        }
        ++done;
        if (seconds > 0 && (done & 15) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if ((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec) > seconds) {
                break;
            }
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("ok: %" PRIu64 " cases (seed %" PRIu64 ", first %" PRIu64 "), %d kernels each, %" PRIu64
           " with NaN results, %.1f s, %.0f cases/s\n", done, seed, first, n, g_nan_cases, dt, dt > 0 ? done / dt : 0.0);
    return 0;
}
