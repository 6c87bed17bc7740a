// llama-bitcos-bench: times ggml's real CPU MUL_MAT on every weight of a GGUF, for side-by-side ratios
// of BITCOS against TQ2_0 / TQ1_0 / Q4_0 measured in one run (`ggml-bitcos bench gemv` writes the GGUF
// and reads this program's JSON lines). Also measures per-thread read bandwidth (beta) for the roofline.
//
//   llama-bitcos-bench gemv FILE.gguf[,FILE2.gguf...] THREADS REPS [NCOLS [grouped]]
//   llama-bitcos-bench decode FILE.gguf THREADS REPS
//   llama-bitcos-bench bandwidth MIB THREADS REPS
//   llama-bitcos-bench gamma TYPE K ROWS ITERS        (ggml's own types: tq2_0, tq1_0, q4_0, ...)
//   llama-bitcos-bench gemv-device FILE.gguf[,FILE2.gguf...] DEVICE REPS [NCOLS]
//   llama-bitcos-bench copy-device MIB DEVICE REPS
//
// gemv-device: the same MUL_MATs on a backend device (e.g. Vulkan0: `ggml-bitcos bench gpu`), each weight
// (with its companion) uploaded once; one timed graph holds INNER independent MUL_MATs of the weight, so a
// submission's fixed cost is spread over them, and repetitions interleave the weights as gemv does.
// copy-device: device copy bandwidth (a 1-D F32 CPY of MIB MiB; read + write bytes per second).
//
// decode: the weight matmuls of one generated token, as two ggml graphs over a model file: every ternary
// weight (TQ1_0, TQ2_0, BITCOS) against one activation column, and every other 2-D weight except
// token_embd (read by GET_ROWS, not a matmul) — e.g. the output projection. Each graph walks all its
// weights once per run, so for a model larger than the last-level cache they stream from DRAM as in
// llama.cpp's decode; `ggml-bitcos bench e2e` subtracts both from llama-bench's tg time per token to
// show what the rest of the model costs (the Amdahl bound of the ternary format's speed-up).
//
// gamma: CPU cycles (rdtsc) per 32 weights of one type's vec_dot on L1-resident data, one thread —
// the roofline's instruction cost. BITCOS's gamma comes from the kernel harness (ggml-bitcos bench kernels).
//
// BITCOS weights are linked to their companion (<name>.bitcos) through src[0], as the patched loader does.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "gguf.h"
#include "../bitcos-cpu-api.h" // ggml-cpu.h in both build modes (csrc/ is copied next to tools/)
#include "../bitcos-format.h"  // BITCOS_COMPANION_SUFFIX

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#    include <x86intrin.h>
#endif

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

static int ends_with(const char * s, const char * suffix) {
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

// The LCG all modes draw their data from; uniform values in [-1, 1) continue the sequence in *s.
static uint32_t lcg_next(uint32_t * s) {
    *s = *s * 1664525u + 1013904223u;
    return *s;
}

static void fill_uniform(float * x, int64_t n, uint32_t * s) {
    for (int64_t j = 0; j < n; ++j) {
        x[j] = ((lcg_next(s) >> 8) * (1.0f / 16777216.0f)) * 2.0f - 1.0f;
    }
}

// The companion "<name>.bitcos" of weight `name` in wctx; NULL for a weight without one.
static struct ggml_tensor * find_companion(struct ggml_context * wctx, const char * name) {
    char cname[GGML_MAX_NAME + sizeof(BITCOS_COMPANION_SUFFIX)];
    snprintf(cname, sizeof(cname), "%s" BITCOS_COMPANION_SUFFIX, name);
    return ggml_get_tensor(wctx, cname);
}

// Links a BITCOS weight to its companion "<name>.bitcos" through src[0], as the patched loader does;
// returns the bytes the matmul reads (weight plus companion, if any).
static size_t link_companion(struct ggml_context * wctx, const char * name, struct ggml_tensor * w) {
    struct ggml_tensor * comp = find_companion(wctx, name);
    if (comp) {
        w->src[0] = comp;
        return ggml_nbytes(w) + ggml_nbytes(comp);
    }
    return ggml_nbytes(w);
}

// FILES: one GGUF or several separated by commas, loaded with their data (weights + companions).
enum { MAX_FILES = 64 };
typedef struct {
    int                   n;
    int64_t               n_tensors; // over all files
    struct ggml_context * ctx[MAX_FILES];
    struct gguf_context * gguf[MAX_FILES];
} gguf_files;

static int gguf_files_open(const char * fnames, gguf_files * fs) {
    fs->n         = 0;
    fs->n_tensors = 0;
    char * list   = strdup(fnames);
    for (char *save = NULL, *f = strtok_r(list, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
        struct gguf_init_params gp = { /*.no_alloc =*/false, /*.ctx =*/&fs->ctx[fs->n] };
        if (fs->n == MAX_FILES || !(fs->gguf[fs->n] = gguf_init_from_file(f, gp))) {
            fprintf(stderr, "%s: cannot read GGUF (or more than %d files)\n", f, MAX_FILES);
            free(list);
            return 0;
        }
        fs->n_tensors += gguf_get_n_tensors(fs->gguf[fs->n]);
        fs->n++;
    }
    free(list);
    return 1;
}

static void gguf_files_close(gguf_files * fs) {
    for (int fi = 0; fi < fs->n; ++fi) {
        gguf_free(fs->gguf[fi]);
        ggml_free(fs->ctx[fi]);
    }
}

// One JSON line per timed weight (median and minimum of its reps times t, which it sorts); `where` is the
// run's "threads": N or "device": "NAME" field.
static void print_gemv_record(int file, const char * tensor, const struct ggml_tensor * w, int64_t ncols,
                              const char * where, int reps, size_t bytes, double * t, double checksum) {
    qsort(t, reps, sizeof(double), cmp_double);
    printf("{\"file\": %d, \"tensor\": \"%s\", \"type\": \"%s\", \"k\": %" PRId64 ", \"rows\": %" PRId64
           ", \"ncols\": %" PRId64 ", %s, \"reps\": %d, \"bytes\": %zu, \"median_us\": %.3f,"
           " \"min_us\": %.3f, \"checksum\": %.6g}\n",
           file, tensor, ggml_type_name(w->type), w->ne[0], w->ne[1], ncols, where, reps, bytes, t[reps / 2], t[0],
           checksum);
}

// One timed MUL_MAT per weight of a GGUF. All graphs are built first and the repetitions interleave the
// weights (rep 1 of every weight, then rep 2, ...), so a slow phase of a shared machine hits every type
// alike instead of biasing the ratios between types that would otherwise run minutes apart. "grouped"
// runs each weight's repetitions back to back instead, so that a small weight stays in L1/L2 (the
// interleaved loop makes all weights together the working set).
typedef struct {
    const char *          name;
    int                   file; // index in the FILES list
    struct ggml_tensor *  w;
    struct ggml_context * ctx;
    struct ggml_cgraph *  gf;
    struct ggml_tensor *  y;
    struct ggml_cplan     plan;
    uint8_t *             work;
    size_t                bytes;
    double *              t;
} gemv_case;

static int bench_gemv(const char * fnames, int n_threads, int reps, int64_t ncols, int grouped) {
    // one persistent threadpool, as llama.cpp uses: no thread start-up inside the timed region
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
    struct ggml_threadpool *      tp  = ggml_threadpool_new(&tpp);
    // FILES: all timed in the same interleaved loop
    gguf_files                    fs;
    if (!gguf_files_open(fnames, &fs)) {
        return 1;
    }
    gemv_case * cs = calloc((size_t) fs.n_tensors, sizeof(gemv_case));
    int         nc = 0;
    for (int fi = 0; fi < fs.n; ++fi) {
        struct gguf_context * g    = fs.gguf[fi];
        struct ggml_context * wctx = fs.ctx[fi];
        const int64_t         n    = gguf_get_n_tensors(g);
        for (int64_t i = 0; i < n; ++i) {
            const char * name = gguf_get_tensor_name(g, i);
            if (ends_with(name, BITCOS_COMPANION_SUFFIX)) {
                continue;
            }
            struct ggml_tensor * w = ggml_get_tensor(wctx, name);
            if (ggml_n_dims(w) != 2) {
                continue;
            }
            gemv_case * c             = &cs[nc++];
            c->name                   = name;
            c->file                   = fi;
            c->w                      = w;
            c->bytes                  = link_companion(wctx, name, w);
            const int64_t           k = w->ne[0], rows = w->ne[1];
            struct ggml_init_params ip = { /*.mem_size =*/ggml_tensor_overhead() * 8 + ggml_graph_overhead() +
                                               (size_t) (k + rows) * ncols * sizeof(float) + 1024 * 1024,
                                           /*.mem_buffer =*/NULL, /*.no_alloc =*/false };
            c->ctx                     = ggml_init(ip);
            struct ggml_tensor * x     = ggml_new_tensor_2d(c->ctx, GGML_TYPE_F32, k, ncols);
            uint32_t             s     = 12345;
            fill_uniform((float *) x->data, k * ncols, &s);
            c->y  = ggml_mul_mat(c->ctx, w, x);
            c->gf = ggml_new_graph(c->ctx);
            ggml_build_forward_expand(c->gf, c->y);
            c->plan           = ggml_graph_plan(c->gf, n_threads, tp);
            c->work           = c->plan.work_size ? malloc(c->plan.work_size) : NULL;
            c->plan.work_data = c->work;
            c->t              = malloc(sizeof(double) * reps);
            ggml_graph_compute(c->gf, &c->plan); // warm-up (page faults)
        }
    }
    if (grouped) {
        // each weight's repetitions back to back: a small weight stays in L1/L2 (cache-resident figures)
        for (int i = 0; i < nc; ++i) {
            for (int r = 0; r < reps; ++r) {
                const double t0 = now_us();
                ggml_graph_compute(cs[i].gf, &cs[i].plan);
                cs[i].t[r] = now_us() - t0;
            }
        }
    } else {
        for (int r = 0; r < reps; ++r) {
            for (int i = 0; i < nc; ++i) {
                const double t0 = now_us();
                ggml_graph_compute(cs[i].gf, &cs[i].plan);
                cs[i].t[r] = now_us() - t0;
            }
        }
    }
    for (int i = 0; i < nc; ++i) {
        gemv_case *   c    = &cs[i];
        const int64_t rows = c->w->ne[1];
        char          where[32];
        snprintf(where, sizeof(where), "\"threads\": %d", n_threads);
        print_gemv_record(c->file, c->name, c->w, ncols, where, reps, c->bytes, c->t,
                          (double) ((float *) c->y->data)[0] + ((float *) c->y->data)[rows - 1]);
        free(c->t);
        free(c->work);
        ggml_free(c->ctx);
    }
    fflush(stdout);
    free(cs);
    gguf_files_close(&fs);
    ggml_threadpool_free(tp);
    return 0;
}

static int is_ternary_type(enum ggml_type t) {
    const char * n = ggml_type_name(t);
    return n && (strcmp(n, "tq1_0") == 0 || strcmp(n, "tq2_0") == 0 || strncmp(n, "bitcos", 6) == 0);
}

static int bench_decode(const char * fname, int n_threads, int reps) {
    struct ggml_threadpool_params tpp  = ggml_threadpool_params_default(n_threads);
    struct ggml_threadpool *      tp   = ggml_threadpool_new(&tpp);
    struct ggml_context *         wctx = NULL;
    struct gguf_init_params       gp   = { /*.no_alloc =*/false, /*.ctx =*/&wctx };
    struct gguf_context *         g    = gguf_init_from_file(fname, gp);
    if (!g) {
        fprintf(stderr, "%s: cannot read GGUF\n", fname);
        return 1;
    }
    const int64_t n = gguf_get_n_tensors(g);
    for (int cls = 0; cls < 2; ++cls) {                // 0: ternary weights, 1: every other matmul weight
        const size_t graph_size = 2 * (size_t) n + 64; // one MUL_MAT and one input per weight at most
        size_t       mem        = ggml_graph_overhead_custom(graph_size, false) + 1024 * 1024;
        for (int64_t i = 0; i < n; ++i) {
            const struct ggml_tensor * w = ggml_get_tensor(wctx, gguf_get_tensor_name(g, i));
            mem += 2 * ggml_tensor_overhead() + (size_t) (w->ne[0] + w->ne[1]) * sizeof(float);
        }
        struct ggml_init_params ip    = { mem, NULL, false };
        struct ggml_context *   ctx   = ggml_init(ip);
        struct ggml_cgraph *    gf    = ggml_new_graph_custom(ctx, graph_size, false);
        size_t                  bytes = 0;
        int                     count = 0;
        uint32_t                s     = 12345;
        for (int64_t i = 0; i < n; ++i) {
            const char *         name = gguf_get_tensor_name(g, i);
            struct ggml_tensor * w    = ggml_get_tensor(wctx, name);
            if (ends_with(name, BITCOS_COMPANION_SUFFIX) || ggml_n_dims(w) != 2 ||
                strcmp(name, "token_embd.weight") == 0 || is_ternary_type(w->type) != (cls == 0)) {
                continue;
            }
            bytes += link_companion(wctx, name, w);
            struct ggml_tensor * x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, w->ne[0]);
            fill_uniform((float *) x->data, w->ne[0], &s);
            ggml_build_forward_expand(gf, ggml_mul_mat(ctx, w, x));
            count++;
        }
        if (count > 0) {
            struct ggml_cplan plan = ggml_graph_plan(gf, n_threads, tp);
            uint8_t *         work = plan.work_size ? malloc(plan.work_size) : NULL;
            plan.work_data         = work;
            ggml_graph_compute(gf, &plan); // warm-up
            double * t = malloc(sizeof(double) * reps);
            for (int r = 0; r < reps; ++r) {
                const double t0 = now_us();
                ggml_graph_compute(gf, &plan);
                t[r] = now_us() - t0;
            }
            qsort(t, reps, sizeof(double), cmp_double);
            printf("{\"decode_class\": \"%s\", \"tensors\": %d, \"threads\": %d, \"reps\": %d, \"bytes\": %zu,"
                   " \"median_us\": %.3f, \"min_us\": %.3f}\n",
                   cls == 0 ? "ternary" : "other", count, n_threads, reps, bytes, t[reps / 2], t[0]);
            fflush(stdout);
            free(t);
            free(work);
        }
        ggml_free(ctx);
    }
    gguf_free(g);
    ggml_free(wctx);
    ggml_threadpool_free(tp);
    return 0;
}

typedef struct {
    const uint64_t * p;
    size_t           n;
    uint64_t         sum;
} bw_job;

static void * bw_worker(void * arg) {
    bw_job * j  = (bw_job *) arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= j->n; i += 4) {
        s0 += j->p[i];
        s1 += j->p[i + 1];
        s2 += j->p[i + 2];
        s3 += j->p[i + 3];
    }
    j->sum = s0 + s1 + s2 + s3;
    return NULL;
}

static int bench_bandwidth(size_t mib, int n_threads, int reps) {
    const size_t n   = mib * 1024 * 1024 / sizeof(uint64_t);
    uint64_t *   buf = malloc(n * sizeof(uint64_t));
    for (size_t i = 0; i < n; ++i) {
        buf[i] = i;
    }
    double * t     = malloc(sizeof(double) * reps);
    uint64_t total = 0;
    for (int r = 0; r < reps; ++r) {
        pthread_t    th[64];
        bw_job       jobs[64];
        const double t0 = now_us();
        for (int i = 0; i < n_threads; ++i) {
            jobs[i].p = buf + n / n_threads * i;
            jobs[i].n = n / n_threads;
            pthread_create(&th[i], NULL, bw_worker, &jobs[i]);
        }
        for (int i = 0; i < n_threads; ++i) {
            pthread_join(th[i], NULL);
            total += jobs[i].sum;
        }
        t[r] = now_us() - t0;
    }
    qsort(t, reps, sizeof(double), cmp_double);
    printf("{\"bandwidth_mib\": %zu, \"threads\": %d, \"median_us\": %.3f, \"gb_per_s\": %.3f, \"checksum\": %" PRIu64
           "}\n",
           mib, n_threads, t[reps / 2], (double) (n * sizeof(uint64_t)) / (t[reps / 2] * 1e3), total);
    free(t);
    free(buf);
    return 0;
}

static uint64_t cycles_now(void) {
#if defined(__x86_64__)
    return __rdtsc();
#else
    return (uint64_t) (now_us() * 1e3); // no TSC: nanoseconds stand in for cycles
#endif
}

static int bench_gamma(const char * type_name, int64_t k, int64_t rows, int iters) {
    enum ggml_type type = GGML_TYPE_COUNT;
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * n = ggml_type_name((enum ggml_type) t);
        if (n && strcmp(n, type_name) == 0) {
            type = (enum ggml_type) t;
        }
    }
    const struct ggml_type_traits_cpu * tr = type == GGML_TYPE_COUNT ? NULL : ggml_get_type_traits_cpu(type);
    if (!tr || !tr->vec_dot) {
        fprintf(stderr, "gamma: type '%s' has no CPU vec_dot\n", type_name);
        return 1;
    }
    ggml_cpu_init();
    float *  wf = malloc(sizeof(float) * k * rows);
    float *  xf = malloc(sizeof(float) * k);
    uint32_t s  = 777;
    for (int64_t i = 0; i < k * rows; ++i) {
        const uint32_t r = (lcg_next(&s) >> 8) % 100;
        wf[i]            = r < 40 ? 0.0f : (r < 70 ? 0.5f : -0.5f); // ternary, z = 0.4
    }
    fill_uniform(xf, k, &s);
    const size_t wrow = ggml_row_size(type, k);
    uint8_t *    w    = malloc(wrow * rows);
    ggml_quantize_chunk(type, wf, w, 0, rows, k, NULL);
    const enum ggml_type vt = tr->vec_dot_type;
    uint8_t *            x  = malloc(ggml_row_size(vt, k));
    if (vt == GGML_TYPE_F32) {
        memcpy(x, xf, sizeof(float) * k);
    } else {
        ggml_get_type_traits_cpu(vt)->from_float(xf, x, k);
    }
    float    acc  = 0.0f, out;
    uint64_t best = UINT64_MAX;
    for (int it = 0; it < iters; ++it) {
        const uint64_t c0 = cycles_now();
        for (int64_t r = 0; r < rows; ++r) {
            tr->vec_dot((int) k, &out, 0, w + r * wrow, 0, x, 0, 1);
            acc += out;
        }
        const uint64_t c = cycles_now() - c0;
        best             = c < best ? c : best;
    }
    printf("{\"gamma_type\": \"%s\", \"k\": %" PRId64 ", \"rows\": %" PRId64 ", \"bytes\": %zu,"
           " \"cycles_per_32\": %.4f, \"checksum\": %g}\n",
           type_name, k, rows, wrow * rows, (double) best / ((double) k * rows / 32.0), (double) acc);
    free(wf);
    free(xf);
    free(w);
    free(x);
    return 0;
}

// ------------------------------------------------------------------------------------------- device runs
#define DEVICE_INNER 16 // MUL_MATs per timed graph (same weight, independent outputs)

static ggml_backend_t device_init(const char * name) {
    ggml_backend_dev_t dev = ggml_backend_dev_by_name(name);
    if (dev == NULL) {
        fprintf(stderr, "no backend device named %s; devices:", name);
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
            fprintf(stderr, " %s", ggml_backend_dev_name(ggml_backend_dev_get(i)));
        }
        fprintf(stderr, "\n");
        return NULL;
    }
    return ggml_backend_dev_init(dev, NULL);
}

typedef struct {
    const char *               name;
    int                        file;
    const struct ggml_tensor * src; // the weight as read from the file (host data)
    struct ggml_context *      ctx;
    struct ggml_cgraph *       gf;
    ggml_backend_buffer_t      buf;
    size_t                     bytes;
    double *                   t;
    float                      checksum;
} device_case;

static int bench_gemv_device(const char * fnames, const char * device, int reps, int64_t ncols) {
    ggml_backend_t backend = device_init(device);
    if (backend == NULL) {
        return 1;
    }
    gguf_files fs;
    if (!gguf_files_open(fnames, &fs)) {
        return 1;
    }
    device_case * cs = calloc((size_t) fs.n_tensors, sizeof(device_case));
    int           nc = 0;
    for (int fi = 0; fi < fs.n; ++fi) {
        for (int64_t i = 0; i < gguf_get_n_tensors(fs.gguf[fi]); ++i) {
            const char *               name = gguf_get_tensor_name(fs.gguf[fi], i);
            const struct ggml_tensor * src  = ggml_get_tensor(fs.ctx[fi], name);
            if (ends_with(name, BITCOS_COMPANION_SUFFIX) || ggml_n_dims(src) != 2) {
                continue;
            }
            device_case * c            = &cs[nc++];
            c->name                    = name;
            c->file                    = fi;
            c->src                     = src;
            struct ggml_init_params ip = { ggml_tensor_overhead() * (4 + 2 * DEVICE_INNER) + ggml_graph_overhead(),
                                           NULL, true };
            c->ctx                     = ggml_init(ip);
            struct ggml_tensor * w     = ggml_dup_tensor(c->ctx, src);
            ggml_set_name(w, name);
            const struct ggml_tensor * csrc = find_companion(fs.ctx[fi], name);
            struct ggml_tensor *       comp = csrc ? ggml_dup_tensor(c->ctx, csrc) : NULL;
            if (comp) {
                w->src[0] = comp; // the link the patched loader makes
            }
            struct ggml_tensor * x = ggml_new_tensor_2d(c->ctx, GGML_TYPE_F32, src->ne[0], ncols);
            c->gf                  = ggml_new_graph(c->ctx);
            for (int j = 0; j < DEVICE_INNER; ++j) {
                ggml_build_forward_expand(c->gf, ggml_mul_mat(c->ctx, w, x));
            }
            c->buf = ggml_backend_alloc_ctx_tensors(c->ctx, backend);
            if (c->buf == NULL || !ggml_backend_supports_op(backend, ggml_graph_node(c->gf, 0))) {
                fprintf(stderr, "%s: %s cannot run MUL_MAT of %s\n", name, device, ggml_type_name(src->type));
                return 1;
            }
            ggml_backend_tensor_set(w, src->data, 0, ggml_nbytes(src));
            if (comp) {
                ggml_backend_tensor_set(comp, csrc->data, 0, ggml_nbytes(csrc));
            }
            const size_t nx = (size_t) (src->ne[0] * ncols);
            float *      xs = malloc(nx * sizeof(float));
            uint32_t     s  = 12345;
            fill_uniform(xs, (int64_t) nx, &s);
            ggml_backend_tensor_set(x, xs, 0, nx * sizeof(float));
            free(xs);
            c->bytes = ggml_nbytes(src) + (csrc ? ggml_nbytes(csrc) : 0);
            c->t     = malloc(sizeof(double) * reps);
            ggml_backend_graph_compute(backend, c->gf); // warm-up: pipelines compiled, data resident
        }
    }
    for (int r = 0; r < reps; ++r) {
        for (int i = 0; i < nc; ++i) {
            const double t0 = now_us();
            ggml_backend_graph_compute(backend, cs[i].gf); // synchronous
            cs[i].t[r] = (now_us() - t0) / DEVICE_INNER;
        }
    }
    for (int i = 0; i < nc; ++i) {
        device_case *        c = &cs[i];
        struct ggml_tensor * y = ggml_graph_node(c->gf, 0);
        float                y0;
        ggml_backend_tensor_get(y, &y0, 0, sizeof(float));
        char where[GGML_MAX_NAME + 16];
        snprintf(where, sizeof(where), "\"device\": \"%s\"", device);
        print_gemv_record(c->file, c->name, c->src, ncols, where, reps, c->bytes, c->t, (double) y0);
        free(c->t);
        ggml_backend_buffer_free(c->buf);
        ggml_free(c->ctx);
    }
    fflush(stdout);
    free(cs);
    gguf_files_close(&fs);
    ggml_backend_free(backend);
    return 0;
}

static int bench_copy_device(size_t mib, const char * device, int reps) {
    ggml_backend_t backend = device_init(device);
    if (backend == NULL) {
        return 1;
    }
    const int64_t           n   = (int64_t) (mib * 1024 * 1024 / sizeof(float));
    struct ggml_init_params ip  = { ggml_tensor_overhead() * 4 + ggml_graph_overhead(), NULL, true };
    struct ggml_context *   ctx = ggml_init(ip);
    struct ggml_tensor *    a   = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
    struct ggml_tensor *    b   = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
    struct ggml_cgraph *    gf  = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, ggml_cpy(ctx, a, b));
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    if (buf == NULL) {
        fprintf(stderr, "%s: cannot allocate 2 x %zu MiB\n", device, mib);
        return 1;
    }
    ggml_backend_buffer_clear(buf, 0);
    ggml_backend_graph_compute(backend, gf);
    double * t = malloc(sizeof(double) * reps);
    for (int r = 0; r < reps; ++r) {
        const double t0 = now_us();
        ggml_backend_graph_compute(backend, gf);
        t[r] = now_us() - t0;
    }
    qsort(t, reps, sizeof(double), cmp_double);
    printf("{\"copy_mib\": %zu, \"device\": \"%s\", \"median_us\": %.3f, \"gb_per_s\": %.3f}\n", mib, device,
           t[reps / 2], 2.0 * (double) n * sizeof(float) / (t[reps / 2] * 1e3));
    free(t);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    ggml_backend_free(backend);
    return 0;
}

int main(int argc, char ** argv) {
    bitcos_load_backends();
    if (argc >= 6 && strcmp(argv[1], "gamma") == 0) {
        return bench_gamma(argv[2], atoll(argv[3]), atoll(argv[4]), atoi(argv[5]));
    }
    if (argc >= 5 && strcmp(argv[1], "gemv") == 0) {
        return bench_gemv(argv[2], atoi(argv[3]), atoi(argv[4]), argc > 5 ? atoll(argv[5]) : 1,
                          argc > 6 && strcmp(argv[6], "grouped") == 0);
    }
    if (argc >= 5 && strcmp(argv[1], "decode") == 0) {
        return bench_decode(argv[2], atoi(argv[3]), atoi(argv[4]));
    }
    if (argc >= 5 && strcmp(argv[1], "gemv-device") == 0) {
        return bench_gemv_device(argv[2], argv[3], atoi(argv[4]), argc > 5 ? atoll(argv[5]) : 1);
    }
    if (argc >= 5 && strcmp(argv[1], "copy-device") == 0) {
        return bench_copy_device((size_t) atoll(argv[2]), argv[3], atoi(argv[4]));
    }
    if (argc >= 5 && strcmp(argv[1], "bandwidth") == 0) {
        return bench_bandwidth((size_t) atoll(argv[2]), atoi(argv[3]), atoi(argv[4]));
    }
    fprintf(stderr,
            "usage: %s gemv FILE.gguf[,FILE.gguf...] THREADS REPS [NCOLS [grouped]]\n"
            "       %s decode FILE.gguf THREADS REPS\n"
            "       %s bandwidth MIB THREADS REPS\n"
            "       %s gamma TYPE K ROWS ITERS\n"
            "       %s gemv-device FILE.gguf[,FILE.gguf...] DEVICE REPS [NCOLS]\n"
            "       %s copy-device MIB DEVICE REPS\n",
            argv[0], argv[0], argv[0], argv[0], argv[0], argv[0]);
    return 2;
}
