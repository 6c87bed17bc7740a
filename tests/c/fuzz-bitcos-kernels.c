// fuzz-bitcos-kernels: random valid BITCOS matrices through the generic, AVX2 and AVX-512 kernels, every input
// buffer ending exactly at a PROT_NONE guard page, results compared with the generic kernel bit for bit.
//
// Built by tests/test_fuzz.py (docs/FUZZING.md) from the kernel table and kernel files of csrc/ exactly as the
// harness library builds them (root CMakeLists.txt: bitcos-kernels-avx2.c with x86-64-v3 flags and AVX-512
// off, bitcos-kernels-avx512.c with x86-64-v4 + VNNI & co., the table and the generic kernel with baseline
// flags and BITCOS_KERNELS_PER_FILE_FLAGS), all with -fsanitize=address,undefined where the compiler has
// them. This file has no ggml dependency.
//
// Each case (seeded: case i of seed s is reproducible alone with --seed s --first i --cases 1):
//   * a random tensor of any variant (FORMAT.md §4.2: v1 G128, PT; v2 MATRIX, ROW, B128, B256), k a multiple
//     of the variant's row-length multiple up to 6144 (MATRIX / ROW: any multiple of 32, so a partial last
//     128-weight unit of 32, 64 or 96 weights; odd numbers of units included), 1 .. 80 rows, a zero density
//     drawn per case from {0, 0.01, 0.3, 0.5, 0.95, 0.99, 1, uniform} with whole empty or full units and rows
//     mixed in, fp16 block scales (neighbouring units equal half of the time, zero, subnormal and 65504 among
//     them), fp32 matrix / row scales; described to the kernels as the CPU glue does (bitcos_rows: v1 G128's
//     scales in its blocks, B128 / B256 an fp16 array, PT / MATRIX the matrix scale repeated per row, ROW its
//     own); a quarter of the B128 / B256 cases keep their scales at a stride of 4 or 6 bytes instead of 2 (a
//     layout the SIMD paths do not all cover: they must fall back to the generic kernel or read it right);
//   * a run of consecutive rows [r0, r0 + nr) of it, biased to start mid-tensor and to end at the last row
//     (whose sign cursor ends exactly at S, the tensor's sign count);
//   * placed in guard-page buffers (mmap, the page after the buffer PROT_NONE): the run's weight blocks
//     (exactly nr * row_bytes: the last row's bitmap, a partial unit included, ends at the guard, so a read
//     of more than (k % 128) / 8 bytes of a partial unit faults), the block or row scales (exactly the run's),
//     the tensor's sign pool with exactly the format's tail (FORMAT.md §4.4:
//     roundup(ceil(S/8), 64) + 64 bytes, every bit past S zero), the run's sign positions (nr u64), each
//     activation column (ceil(k/256) Q8_K blocks, zero-padded past k as the contract asks) and each
//     destination column (nr floats), each ending at its guard page; with --front the buffers start right
//     after a PROT_NONE page instead (underflow), half of them 8..56 bytes later (only 8-byte aligned);
//     --short-tail N takes N bytes off the pool's tail, a self-test that the guard is live (a kernel that
//     loads a whole register near the end of the signs must then fault); --short-bits N takes N bytes off
//     the end of the run's bitmap, the same self-test for the bitmap reads;
//   * nc = 1 .. 20 activation columns (GEMV and the GEMM tiles), Q8_K scales of both signs;
//   * every kernel of the table this CPU can run (generic always; a SIMD kernel when the CPU has every
//     extension its file was compiled for) is called through bitcos_kernel_mm, as the ggml glue calls it, and
//     each float result must equal the generic one bit for bit
//     (NaN results, which only overflowing extreme scales can make, must be NaN in both);
//   * the 2-bit codes form (bitcos-kernels.h): the run decoded by bitcos_codes_decode and by the generic decode
//     into a guard-page buffer of exactly nr rows of codes (the same bytes both ways), with the tensor's scales
//     or, for block scales half of the time, those copied out by bitcos_codes_copy_block_scales; every kernel's
//     codes kernel, through bitcos_kernel_codes_mm, must give the generic BITCOS kernel's bits.
// Exit status: 0 when every case matched, 1 on a mismatch (the case and the first differing value printed),
// a signal / sanitizer report on a bad access.
#define _GNU_SOURCE
#include "bitcos-kernels.h"
#include "bitcos-test.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_COLS 20

// ---- guard-page buffers ----
static size_t g_page;
static int    g_front;      // 1: buffers start right after a PROT_NONE page; 0: they end right before one
static size_t g_short_tail; // --short-tail N: the pool gets N bytes less than the format's tail (self-test)
static size_t g_short_bits; // --short-bits N: the run's bitmap buffer gets N bytes less (self-test)

typedef struct {
    uint8_t * map;
    size_t    map_len;
    uint8_t * p;
} gbuf;

static gbuf galloc(size_t n) {
    gbuf         b;
    const size_t data_pages = (n + g_page - 1) / g_page + (n == 0);
    b.map_len               = (data_pages + 1) * g_page;
    b.map                   = mmap(NULL, b.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b.map == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    if (g_front) {
        // half of the buffers start 8..56 bytes after the guard: only 8-byte aligned, as the companion
        // sections of a GGUF with general.alignment 8 are under mmap
        const size_t mis = (rng_u64() & 1) ? 8 * (size_t) (1 + rng_below(7)) : 0;
        if (n + mis > data_pages * g_page) {
            munmap(b.map, b.map_len);
            b.map_len += g_page;
            b.map = mmap(NULL, b.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (b.map == MAP_FAILED) {
                perror("mmap");
                exit(2);
            }
        }
        if (mprotect(b.map, g_page, PROT_NONE) != 0) {
            perror("mprotect");
            exit(2);
        }
        b.p = b.map + g_page + mis;
    } else {
        if (mprotect(b.map + data_pages * g_page, g_page, PROT_NONE) != 0) {
            perror("mprotect");
            exit(2);
        }
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
    switch (rng_below(16)) {
        case 0:
            return 0;                                       // +0
        case 1:
            return (uint16_t) (1 + rng_below(0x3ff));       // subnormal
        case 2:
            return 0x7bff;                                  // 65504, the largest valid scale
        case 3:
            return (uint16_t) (0x0400 + rng_below(0x7800)); // any normal
        default:
            return (uint16_t) (0x2000 + rng_below(0x2000)); // 2^-7 .. 2: the usual range
    }
}

static float rand_q8_d(void) {
    float d;
    switch (rng_below(12)) {
        case 0:
            d = 16384.0f;
            break;
        case 1:
            d = 1e-8f;
            break;
        default:
            d = (float) (rng_unit() * 0.05 + 1e-4);
            break;
    }
    return (rng_u64() & 1) ? -d : d;
}

typedef struct {
    uint64_t seed, index;
    int      variant;
    int64_t  k, rows, r0, nr, nc;
    double   z;
    uint64_t n_signs;
    size_t   scale_stride; // block scales: bytes from one to the next (2 in the format)
} case_desc;

static const char * const g_variant_names[BITCOS_VARIANT_COUNT] = { "G128", "PT", "MATRIX", "ROW", "B128", "B256" };

static void print_case(FILE * f, const case_desc * c) {
    fprintf(f,
            "case seed=%" PRIu64 " index=%" PRIu64 " variant=%s k=%" PRId64 " rows=%" PRId64 " run=[%" PRId64
            ", %" PRId64 ") nc=%" PRId64 " z=%.3f S=%" PRIu64 " scale_stride=%zu %s\n",
            c->seed, c->index, g_variant_names[c->variant], c->k, c->rows, c->r0, c->r0 + c->nr, c->nc, c->z,
            c->n_signs, c->scale_stride, g_front ? "front-guard" : "end-guard");
}

static float rand_f32_scale(void) {
    switch (rng_below(10)) {
        case 0:
            return 0.0f;
        case 1:
            return 65504.0f;
        case 2:
            return 1e-30f; // far below fp16's range: fine for fp32 scales
        default:
            return (float) (rng_unit() * 4.0);
    }
}

typedef const bitcos_kernel * impl;

static uint64_t g_nan_cases = 0;

// 1 when the nc columns of nr results equal ref bit for bit (both NaN counts as equal); else prints the case.
static int same_as_reference(const case_desc * c, const char * what, const char * name, float * const * dcols,
                             const float * ref) {
    for (int64_t col = 0; col < c->nc; ++col) {
        for (int64_t i = 0; i < c->nr; ++i) {
            const float want = ref[col * c->nr + i], got = dcols[col][i];
            uint32_t    a, b;
            memcpy(&a, &want, 4);
            memcpy(&b, &got, 4);
            if (a != b && !(want != want && got != got)) {
                print_case(stdout, c);
                printf("MISMATCH %s%s vs generic: column %" PRId64 " row %" PRId64 " (tensor row %" PRId64
                       "): %a (0x%08x) != %a (0x%08x)\n",
                       name, what, col, i, c->r0 + i, (double) got, b, (double) want, a);
                return 0;
            }
        }
    }
    return 1;
}

// The codes form of the run w: both decodes, then every kernel's codes kernel against ref (the generic BITCOS
// kernel's results). Returns 0 when all matched.
static int run_codes(const case_desc * c, const bitcos_rows * w, const impl * impls, int n_impls,
                     const bitcos_q8_K * const * ycols, const float * ref) {
    const size_t rb    = bitcos_codes_row_bytes(c->k);
    gbuf         codes = galloc(rb * (size_t) c->nr);
    uint8_t *    plain = malloc(rb * (size_t) c->nr + 1);
    bitcos_codes_decode(w, 0, c->nr, codes.p, rb);
    bitcos_codes_decode_generic(w, 0, c->nr, plain, rb);
    int rc = 0;
    if (memcmp(codes.p, plain, rb * (size_t) c->nr) != 0) {
        print_case(stdout, c);
        printf("MISMATCH bitcos_codes_decode vs bitcos_codes_decode_generic\n");
        rc = 1;
    }
    free(plain);
    bitcos_codes_rows cw      = bitcos_codes_rows_of(w, codes.p, rb);
    // block scales copied out at stride 2, half of the time (what a loader does for v1 G128)
    const int64_t     ns      = w->row_scale ? 0 : ((c->k + QK_BITCOS - 1) / QK_BITCOS) >> w->block_scale_shift;
    const size_t      cbytes  = ns && (rng_u64() & 1) ? 2 * (size_t) (ns * c->nr) : 0;
    gbuf              compact = galloc(cbytes);
    if (cbytes) {
        bitcos_codes_copy_block_scales(w, 0, c->nr, compact.p);
        cw.block_scale     = compact.p;
        cw.scale_stride    = 2;
        cw.scale_row_bytes = 2 * (size_t) ns;
    }
    for (int m = 0; m < n_impls && rc == 0; ++m) {
        gbuf    dbuf[MAX_COLS];
        float * dcols[MAX_COLS];
        for (int64_t col = 0; col < c->nc; ++col) {
            dbuf[col] = galloc(sizeof(float) * (size_t) c->nr);
            memset(dbuf[col].p, 0xff, sizeof(float) * (size_t) c->nr);
            dcols[col] = (float *) (void *) dbuf[col].p;
        }
        bitcos_kernel_codes_mm(impls[m], &cw, c->nr, ycols, c->nc, dcols);
        rc = !same_as_reference(c, cbytes ? " codes (compacted scales)" : " codes", impls[m]->name, dcols, ref);
        for (int64_t col = 0; col < c->nc; ++col) {
            gfree(&dbuf[col]);
        }
    }
    gfree(&compact);
    gfree(&codes);
    return rc;
}

// Runs one case; returns 0 when every kernel matched the generic one.
static int run_case(uint64_t seed, uint64_t index, const impl * impls, int n_impls) {
    rng_seed_case(seed, index);
    case_desc c              = { .seed = seed, .index = index, .scale_stride = sizeof(uint16_t) };
    c.variant                = (int) rng_below(BITCOS_VARIANT_COUNT);
    const int64_t km         = bitcos_variant_k_multiple(c.variant);
    const int64_t kmax       = 6144 / km; // rows up to 6144 weights
    c.k                      = km * (rng_below(4) == 0 ? 1 + (int64_t) rng_below((uint64_t) kmax) :
                                                         1 + (int64_t) rng_below((uint64_t) (kmax < 24 ? kmax : 24)));
    c.rows                   = rng_below(3) == 0 ? 1 + (int64_t) rng_below(80) : 1 + (int64_t) rng_below(12);
    static const double zs[] = { 0.0, 0.01, 0.3, 0.5, 0.95, 0.99, 1.0, -1.0 };
    c.z                      = zs[rng_below(8)];
    if (c.z < 0) {
        c.z = rng_unit();
    }
    // the run: mid-tensor start half of the time, ending at the last row half of the time
    c.r0                       = (rng_u64() & 1) ? (int64_t) rng_below((uint64_t) c.rows) : 0;
    c.nr                       = (rng_u64() & 1) ? c.rows - c.r0 : 1 + (int64_t) rng_below((uint64_t) (c.rows - c.r0));
    static const int64_t ncs[] = { 1, 1, 1, 2, 3, 4, 5, 8, 9, 16, 17, 20 };
    c.nc                       = ncs[rng_below(12)];

    const int     g128       = c.variant == BITCOS_VARIANT_G128;
    const int64_t nu         = (c.k + QK_BITCOS - 1) / QK_BITCOS; // 128-weight units, the last maybe partial
    const size_t  unit_bytes = bitcos_block_bytes(c.variant);     // 18 for v1 G128, else 16
    const size_t  row_bytes  = g128 ? (size_t) nu * unit_bytes : (size_t) c.k / 8;
    const int64_t nby        = (c.k + BITCOS_Q8K_BLOCK - 1) / BITCOS_Q8K_BLOCK;
    const int64_t sblock     = bitcos_variant_scale_block(c.variant); // weights per block scale (0: row scales)
    const int64_t nscale     = sblock ? c.k / sblock : 0;             // block scales per row
    if (sblock && !g128 && rng_below(4) == 0) {
        c.scale_stride = rng_below(2) ? 4 : 6;                        // not the format's layout: see the header
    }

    // codes of the whole tensor, with empty / full units and rows mixed in
    int8_t * codes = malloc((size_t) (c.rows * c.k));
    for (int64_t r = 0; r < c.rows; ++r) {
        const int row_mode = (int) rng_below(10); // 0: empty row, 1: full row, else per unit
        for (int64_t u = 0; u < nu; ++u) {
            const int blk_mode = row_mode == 0 ? 0 : row_mode == 1 ? 1 : (int) rng_below(12);
            for (int64_t j = 0; j < QK_BITCOS && u * QK_BITCOS + j < c.k; ++j) {
                int8_t t;
                if (blk_mode == 0) {
                    t = 0;
                } else if (blk_mode == 1) {
                    t = (rng_u64() & 1) ? 1 : -1;
                } else {
                    t = rng_unit() < c.z ? 0 : ((rng_u64() & 1) ? 1 : -1);
                }
                codes[r * c.k + u * QK_BITCOS + j] = t;
            }
        }
    }
    // signs of the whole tensor and each row's first sign position
    uint64_t * pos_all = malloc(sizeof(uint64_t) * (size_t) (c.rows + 1));
    uint64_t   S       = 0;
    for (int64_t r = 0; r < c.rows; ++r) {
        pos_all[r] = S;
        for (int64_t i = 0; i < c.k; ++i) {
            S += codes[r * c.k + i] != 0;
        }
    }
    pos_all[c.rows]         = S;
    c.n_signs               = S;
    const size_t pool_bytes = ((S + 7) / 8 + 63) / 64 * 64 + BITCOS_POOL_TAIL_BYTES; // FORMAT.md §4.4

    gbuf pool = galloc(pool_bytes - g_short_tail);
    memset(pool.p, 0, pool_bytes - g_short_tail);
    {
        uint64_t p = 0;
        for (int64_t i = 0; i < c.rows * c.k; ++i) {
            if (codes[i] != 0) {
                if (codes[i] < 0) {
                    pool.p[p >> 3] |= (uint8_t) (1u << (p & 7));
                }
                ++p;
            }
        }
    }
    // the run's bitmaps (v1 G128: with its fp16 scale after each unit's bitmap) and block scales
    const size_t bits_bytes = (size_t) c.nr * row_bytes;
    const size_t short_bits = g_short_bits < bits_bytes ? g_short_bits : 0;
    gbuf         blocks     = galloc(bits_bytes - short_bits);
    uint8_t *    bits       = malloc(bits_bytes);
    memset(bits, 0, bits_bytes);
    const size_t scale_row_bytes = g128 ? row_bytes : (size_t) nscale * c.scale_stride;
    gbuf         bscale          = galloc(sblock && !g128 ? (size_t) c.nr * scale_row_bytes : 0);
    if (sblock && !g128) {
        memset(bscale.p, 0, (size_t) c.nr * scale_row_bytes);
    }
    for (int64_t r = 0; r < c.nr; ++r) {
        uint8_t *      row = bits + (size_t) r * row_bytes;
        const int8_t * t   = codes + (c.r0 + r) * c.k;
        for (int64_t i = 0; i < c.k; ++i) {
            if (t[i] != 0) {
                row[(size_t) (i / QK_BITCOS) * (g128 ? unit_bytes : BITCOS_BITMAP_BYTES) +
                    (size_t) (i % QK_BITCOS) / 8] |= (uint8_t) (1u << (i & 7));
            }
        }
        uint16_t prev_d = 0;
        for (int64_t g = 0; g < nscale; ++g) {
            // the second unit of a Q8_K block shares its scale half of the time (the contract's one-D path)
            const uint16_t d = ((g & 1) && (rng_u64() & 1)) ? prev_d : rand_fp16_scale();
            prev_d           = d;
            uint8_t * dp     = g128 ? row + (size_t) g * unit_bytes + BITCOS_BITMAP_BYTES :
                                      bscale.p + (size_t) r * scale_row_bytes + (size_t) g * c.scale_stride;
            memcpy(dp, &d, sizeof d);
        }
    }
    memcpy(blocks.p, bits, bits_bytes - short_bits);
    free(bits);
    // row scales: the matrix's repeated (PT, MATRIX), or one per row (ROW, a quarter of them the same)
    gbuf rscale = galloc(sblock ? 0 : sizeof(float) * (size_t) c.nr);
    if (!sblock) {
        const float m = rng_below(10) == 0 ? 0.0f : (float) (rng_unit() * 4.0);
        for (int64_t r = 0; r < c.nr; ++r) {
            const float v = c.variant == BITCOS_VARIANT_ROW ? (rng_below(4) == 0 ? m : rand_f32_scale()) : m;
            memcpy(rscale.p + sizeof(float) * (size_t) r, &v, sizeof v);
        }
    }
    gbuf spos = galloc(sizeof(uint64_t) * (size_t) c.nr);
    memcpy(spos.p, pos_all + c.r0, sizeof(uint64_t) * (size_t) c.nr);

    // activations: one guard-page buffer per column
    gbuf                ybuf[MAX_COLS];
    const bitcos_q8_K * ycols[MAX_COLS];
    for (int64_t col = 0; col < c.nc; ++col) {
        ybuf[col]           = galloc(sizeof(bitcos_q8_K) * (size_t) nby);
        bitcos_q8_K * y     = (bitcos_q8_K *) (void *) ybuf[col].p;
        const int     small = rng_below(3) == 0;
        for (int64_t b = 0; b < nby; ++b) {
            y[b].d = rand_q8_d();
            for (int j = 0; j < BITCOS_Q8K_BLOCK; ++j) {
                const int64_t kk = b * BITCOS_Q8K_BLOCK + j;
                int8_t        q  = 0;
                if (kk < c.k) {
                    const int sel = (int) rng_below(20);
                    q             = sel == 0 ? -128 :
                                    sel == 1 ? 127 :
                                    small    ? (int8_t) ((int) rng_below(7) - 3) :
                                               (int8_t) ((int) rng_below(255) - 127);
                }
                y[b].qs[j] = q;
            }
            for (int g = 0; g < BITCOS_Q8K_BLOCK / 16; ++g) {
                int sum = 0;
                for (int j = 0; j < 16; ++j) {
                    sum += y[b].qs[16 * g + j];
                }
                y[b].bsums[g] = (int16_t) sum;
            }
        }
        ycols[col] = y;
    }

    bitcos_rows w;
    w.k                 = c.k;
    w.bits              = blocks.p;
    w.unit_bytes        = g128 ? unit_bytes : BITCOS_BITMAP_BYTES;
    w.row_bytes         = row_bytes;
    w.pool              = pool.p;
    w.sign_pos          = (const uint64_t *) (const void *) spos.p;
    w.row_scale         = sblock ? NULL : (const float *) (const void *) rscale.p;
    w.block_scale       = !sblock ? NULL : g128 ? blocks.p + BITCOS_BITMAP_BYTES : bscale.p;
    w.scale_stride      = g128 ? unit_bytes : c.scale_stride;
    w.scale_row_bytes   = sblock ? scale_row_bytes : 0;
    w.block_scale_shift = sblock == 2 * QK_BITCOS ? 1 : 0;

    float * ref = malloc(sizeof(float) * (size_t) (c.nr * c.nc));
    int     rc  = 0;
    for (int m = 0; m < n_impls && rc == 0; ++m) {
        gbuf    dbuf[MAX_COLS];
        float * dcols[MAX_COLS];
        for (int64_t col = 0; col < c.nc; ++col) {
            dbuf[col] = galloc(sizeof(float) * (size_t) c.nr);
            memset(dbuf[col].p, 0xff, sizeof(float) * (size_t) c.nr); // NaN: a row left unwritten shows
            dcols[col] = (float *) (void *) dbuf[col].p;
        }
        bitcos_kernel_mm(impls[m], &w, c.nr, ycols, c.nc, dcols, NULL);
        if (m == 0) {
            for (int64_t col = 0; col < c.nc; ++col) {
                memcpy(ref + col * c.nr, dcols[col], sizeof(float) * (size_t) c.nr);
            }
        } else {
            rc = !same_as_reference(&c, "", impls[m]->name, dcols, ref);
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
    if (rc == 0) {
        rc = run_codes(&c, &w, impls, n_impls, ycols, ref);
    }
    free(ref);
    for (int64_t col = 0; col < c.nc; ++col) {
        gfree(&ybuf[col]);
    }
    gfree(&spos);
    gfree(&rscale);
    gfree(&bscale);
    gfree(&blocks);
    gfree(&pool);
    free(pos_all);
    free(codes);
    return rc;
}

int main(int argc, char ** argv) {
    uint64_t seed = 1, first = 0, cases = 2000;
    double   seconds = 0;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "--first") && i + 1 < argc) {
            first = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "--cases") && i + 1 < argc) {
            cases = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
            seconds = strtod(argv[++i], NULL); // stop early when this much time has passed
        } else if (!strcmp(argv[i], "--short-tail") && i + 1 < argc) {
            // self-test of the guard: with less than the format's tail some read must fault
            g_short_tail = (size_t) strtoull(argv[++i], NULL, 0);
            if (g_short_tail > BITCOS_POOL_TAIL_BYTES) {
                g_short_tail = BITCOS_POOL_TAIL_BYTES;
            }
        } else if (!strcmp(argv[i], "--short-bits") && i + 1 < argc) {
            g_short_bits = (size_t) strtoull(argv[++i], NULL, 0); // self-test of the bitmap's guard
        } else if (!strcmp(argv[i], "--front")) {
            g_front = 1;
        } else {
            fprintf(stderr,
                    "usage: %s [--seed S] [--first I] [--cases N] [--seconds T] [--front] [--short-tail N] "
                    "[--short-bits N]\n",
                    argv[0]);
            return 2;
        }
    }
    g_page = (size_t) sysconf(_SC_PAGESIZE);
    impl impls[16];
    int  n = 0;
    for (int i = 0; i < bitcos_kernel_count() && n < 16; ++i) { // the generic kernel first: the reference
        if (bitcos_kernel_at(i)->available()) {
            impls[n++] = bitcos_kernel_at(i);
        }
    }
    printf("kernels:");
    for (int i = 0; i < n; ++i) {
        printf(" %s", impls[i]->name);
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
            if ((double) (t1.tv_sec - t0.tv_sec) + 1e-9 * (double) (t1.tv_nsec - t0.tv_nsec) > seconds) {
                break;
            }
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double dt = (double) (t1.tv_sec - t0.tv_sec) + 1e-9 * (double) (t1.tv_nsec - t0.tv_nsec);
    printf("ok: %" PRIu64 " cases (seed %" PRIu64 ", first %" PRIu64 "), %d kernels each, %" PRIu64
           " with NaN results, %.1f s, %.0f cases/s\n",
           done, seed, first, n, g_nan_cases, dt, dt > 0 ? done / dt : 0.0);
    return 0;
}
