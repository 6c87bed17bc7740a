// bitcos-form.h: the roofline rule and what it needs measured on the machine at hand (beta per thread, cached per
// CPU model and thread count; gamma of both forms, per process; the physical cores). Design: docs/KERNELS.md §9.
#if defined(__linux__) && !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#    define _POSIX_C_SOURCE 200809L // clock_gettime, sysconf under -std=c11 (ggml's builds define their own)
#endif

#include "bitcos-form.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__SSE2__)
#    include <emmintrin.h> // _mm_clflush
#endif
#ifndef _WIN32
#    include <pthread.h>
#    include <sched.h>
#    include <stdatomic.h>
#    include <sys/stat.h>
#    include <unistd.h>
#endif

static double form_now_ns(void) {
    struct timespec ts;
#ifdef _WIN32
    timespec_get(&ts, TIME_UTC); // C11; no monotonic clock without windows.h
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    return 1e9 * (double) ts.tv_sec + (double) ts.tv_nsec;
}

// ---- The rule ----

bitcos_form_choice bitcos_form_choose(const bitcos_form_inputs * in) {
    bitcos_form_choice c;
    const double       z    = !(in->z > 0) ? 0 : in->z > 1 ? 1 : in->z; // NaN: 0, the most BITCOS bytes
    const double       sb   = in->scale_bits > 0 ? in->scale_bits * 4 : 0;
    const double       beta = in->beta_thread;
    c.bytes_bitcos          = (2 - z) * 4 + sb; // a bitmap bit per weight + a sign bit per non-zero, per 32 weights
    c.bytes_codes           = 8 + sb;           // 2 bits per weight
    // GB/s is bytes per ns; without beta or a gamma both times are infinite, so the comparison below keeps BITCOS
    const int known         = beta > 0 && !isnan(in->gamma_bitcos) && !isnan(in->gamma_codes);
    c.t_bitcos              = known ? c.bytes_bitcos / beta + in->gamma_bitcos : (double) INFINITY;
    c.t_codes               = known ? c.bytes_codes / beta + in->gamma_codes : (double) INFINITY;
    c.form = c.t_bitcos > (1 + BITCOS_FORM_MARGIN) * c.t_codes ? BITCOS_FORM_CODES : BITCOS_FORM_BITCOS;
    return c;
}

// ---- Physical cores ----

#ifdef __linux__
static long form_topology(long cpu, const char * name) { // -1 when unreadable
    char path[128];
    long v = -1;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/topology/%s", cpu, name);
    FILE * f = fopen(path, "r");
    if (f != NULL) {
        v = fscanf(f, "%ld", &v) == 1 ? v : -1;
        fclose(f);
    }
    return v;
}

// Distinct (package, core) pairs over the online list ("0-3,8,10-11"); 0 when any of it cannot be read.
static int form_linux_cores(void) {
    enum { MAX_CPUS = 4096 };
    char     list[4096];
    uint64_t ids[MAX_CPUS];
    int      n = 0, cores = 0;
    FILE *   f   = fopen("/sys/devices/system/cpu/online", "r");
    int      bad = f == NULL || fgets(list, sizeof list, f) == NULL;
    if (f != NULL) {
        fclose(f);
    }
    for (char *p = list, *end; !bad && *p != '\0' && *p != '\n'; p = end + (*end == ',')) {
        const long lo = strtol(p, &end, 10), hi = *end == '-' ? strtol(end + 1, &end, 10) : lo;
        bad = end == p || lo < 0 || hi < lo;
        for (long cpu = lo; !bad && cpu <= hi; ++cpu) {
            const long     pkg = form_topology(cpu, "physical_package_id"), core = form_topology(cpu, "core_id");
            const uint64_t id   = ((uint64_t) pkg << 32) | (uint32_t) core;
            int            seen = 0;
            bad                 = pkg < 0 || core < 0 || n == MAX_CPUS;
            for (int i = 0; !bad && i < n && !seen; ++i) {
                seen = ids[i] == id;
            }
            if (!bad) {
                cores += !seen;
                ids[n++] = id;
            }
        }
    }
    return bad ? 0 : cores;
}
#endif

int bitcos_form_physical_cores(void) {
    long n = 0;
#ifdef __linux__
    n = form_linux_cores();
#endif
#ifndef _WIN32
    n = n > 0 ? n : sysconf(_SC_NPROCESSORS_ONLN);
#endif
    return n >= 1 ? (int) n : 1;
}

// ---- beta: streaming read bandwidth per thread ----

#ifndef _WIN32
static double form_thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return 1e9 * (double) ts.tv_sec + (double) ts.tv_nsec;
}
#endif

#ifndef _WIN32
// Sums the buffer in 8 independent 64-bit lanes, one cache line per step: enough loads in flight to stream at
// DRAM speed from one thread, and a result that keeps the loads from being optimised away.
static uint64_t form_read_all(const uint8_t * p, size_t n) {
    uint64_t a[8] = { 0 };
    for (size_t i = 0; i + 64 <= n; i += 64) {
        for (int j = 0; j < 8; ++j) {
            uint64_t v;
            memcpy(&v, p + i + 8 * j, 8);
            a[j] += v;
        }
    }
    return a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}

typedef struct {
    size_t     bytes;    // per thread
    double     deadline; // ns: passes that end later do not count (the others may have stopped streaming)
    int        n;
    atomic_int ready, failed;
} form_beta_run;

typedef struct {
    form_beta_run * run;
    pthread_t       tid;
    int             id;
    double          best_gbs;
    int             settled; // best_gbs is from a pass that ran on a CPU throughout
    uint64_t        sum;     // what the thread read: a store the compiler must keep, so the loads stay
} form_beta_thread;

// One thread: touches its own buffer (its pages local to it), waits until every thread has (page faults are not
// streaming), then reads it pass after pass until the deadline; its best pass that ended while all streamed.
static void * form_beta_worker(void * arg) {
    form_beta_thread * me  = (form_beta_thread *) arg;
    form_beta_run *    run = me->run;
    uint8_t *          buf = (uint8_t *) malloc(run->bytes);
    if (buf != NULL) {
        memset(buf, 1 + me->id, run->bytes);
    } else {
        atomic_store(&run->failed, 1);
    }
    atomic_fetch_add(&run->ready, 1);
    while (atomic_load(&run->ready) < run->n && !atomic_load(&run->failed)) {
        sched_yield();
    }
    for (int pass = 0; buf != NULL && !atomic_load(&run->failed); ++pass) {
#    if defined(__SSE2__)
        // Out of every cache first: x86 server LLCs reach hundreds of MiB (a 480 MiB L3 made one thread's 64 MiB
        // read 2x faster than DRAM); evicting clean lines moves no data, so the other threads' passes don't notice.
        for (size_t o = 0; o < run->bytes; o += 64) {
            _mm_clflush(buf + o);
        }
        _mm_mfence();
#    endif
        const double t = form_now_ns(), cpu0 = form_thread_cpu_ns();
        me->sum ^= form_read_all(buf, run->bytes);
        const double end = form_now_ns(), cpu = form_thread_cpu_ns() - cpu0;
        // a pass during which the thread was not on a CPU the whole time (another process running) measured the
        // scheduler, not the memory: it counts only when no pass ran undisturbed, and then is not cached
        const int    ran = cpu >= 0.9 * (end - t);
        const double gbs = (double) run->bytes / fmax(end - t, 1); // bytes per ns is GB/s
        if ((end <= run->deadline || me->best_gbs == 0) && (ran || !me->settled)) {
            me->best_gbs = ran && !me->settled ? gbs : fmax(me->best_gbs, gbs);
            me->settled |= ran;
        }
        if (end >= run->deadline && pass >= 1) {
            break;
        }
    }
    free(buf);
    return NULL;
}

// beta per thread; *settled: every thread's figure comes from a pass it ran on a CPU throughout.
static double form_measure_beta(int n_threads, double seconds, int * settled) {
    *settled          = 0;
    n_threads         = n_threads < 1 ? 1 : n_threads > 1024 ? 1024 : n_threads;
    const size_t  cap = ((size_t) 1 << 30) / (size_t) n_threads;
    form_beta_run run;
    run.bytes    = (cap < ((size_t) 64 << 20) ? cap : ((size_t) 64 << 20)) & ~(size_t) 63;
    run.deadline = form_now_ns() + (seconds > 0 ? seconds : 0.1) * 1e9;
    run.n        = n_threads;
    atomic_init(&run.ready, 0);
    atomic_init(&run.failed, 0);
    form_beta_thread * th = (form_beta_thread *) calloc((size_t) n_threads, sizeof *th);
    if (th == NULL) {
        return 0;
    }
    int started = 1; // thread 0 is the caller
    for (int i = 0; i < n_threads; ++i) {
        th[i].run = &run;
        th[i].id  = i;
    }
    while (started < n_threads && pthread_create(&th[started].tid, NULL, form_beta_worker, &th[started]) == 0) {
        started++;
    }
    if (started < n_threads) {
        atomic_store(&run.failed, 1); // the started threads stop waiting for the others and quit
    }
    form_beta_worker(&th[0]);
    double gbs = INFINITY;
    *settled   = 1;
    for (int i = 0; i < n_threads; ++i) {
        if (i > 0 && i < started) {
            pthread_join(th[i].tid, NULL);
        }
        gbs = fmin(gbs, th[i].best_gbs); // the slowest thread bounds a mat-mul: rows are split evenly
        *settled &= th[i].settled;
    }
    free(th);
    return atomic_load(&run.failed) ? 0 : gbs;
}
#else
static double form_measure_beta(int n_threads, double seconds, int * settled) {
    (void) n_threads;
    (void) seconds;
    *settled = 0;
    return 0; // no threads without windows.h: unknown, so bitcos_form_choose keeps BITCOS (GGML_BITCOS_BETA sets it)
}
#endif

double bitcos_form_measure_beta(int n_threads, double seconds) {
    int settled;
    return form_measure_beta(n_threads, seconds, &settled);
}

// ---- beta, cached per CPU model and thread count ----

// The first "model name" (x86) or "CPU part" (ARM) of /proc/cpuinfo, with '|' and control characters blanked
// so that it cannot break the cache file's "<model>|<n> <GB/s>" lines.
static void form_cpu_model(char * out, size_t size) {
    char   line[512], part[256] = "";
    int    named = 0; // x86 has a "model name"; ARM (mostly) only "CPU part"
    FILE * f     = fopen("/proc/cpuinfo", "r");
    while (!named && f != NULL && fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        const char * v            = strchr(line, ':');
        v                         = v != NULL ? v + 1 + strspn(v + 1, " \t") : "";
        named                     = strncmp(line, "model name", 10) == 0;
        if (named || (part[0] == '\0' && strncmp(line, "CPU part", 8) == 0)) {
            snprintf(part, sizeof part, "%s%s", named ? "" : "CPU part ", v);
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    snprintf(out, size, "%s", part[0] != '\0' ? part : "unknown");
    for (char * c = out; *c != '\0'; ++c) {
        *c = *c == '|' || (unsigned char) *c < 32 ? ' ' : *c;
    }
}

// mkdir -p; 0 when the directory exists afterwards.
static int form_mkdirs(char * path) {
#ifndef _WIN32
    for (char * p = path + 1; *p != '\0'; ++p) {
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0755);
            *p = '/';
        }
    }
    return mkdir(path, 0755) == 0 || errno == EEXIST ? 0 : -1;
#else
    (void) path;
    return -1; // no cache file on Windows (and no measurement either)
#endif
}

double bitcos_form_beta_cached(int n_threads, int * measured) {
    static const char * dirs[3][2] = { { "GGML_BITCOS_CACHE_DIR", "" },
                                       { "XDG_CACHE_HOME", "/ggml-bitcos" },
                                       { "HOME", "/.cache/ggml-bitcos" } };
    const char *        env        = getenv("GGML_BITCOS_BETA");
    char                dir[3840]  = "", file[4096], key[320], model[256], line[512], *end;
    const double        given      = env != NULL ? strtod(env, &end) : 0;
    int                 ignored;
    measured  = measured != NULL ? measured : &ignored;
    *measured = 0;
    if (env != NULL && end != env && isfinite(given) && given > 0) {
        return given;
    }
    for (int i = 0; i < 3 && dir[0] == '\0'; ++i) {
        const char * v = getenv(dirs[i][0]);
        if (v != NULL && *v != '\0' && strlen(v) + strlen(dirs[i][1]) < sizeof dir) {
            strcat(strcpy(dir, v), dirs[i][1]);
        }
    }
    n_threads = n_threads < 1 ? 1 : n_threads;
    form_cpu_model(model, sizeof model);
    snprintf(key, sizeof key, "%s|%d", model, n_threads);
    snprintf(file, sizeof file, "%s/cpu-bandwidth-v2.txt", dir);
    FILE * f      = dir[0] != '\0' ? fopen(file, "r") : NULL;
    double cached = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL) { // the last valid line of the key wins
        char * sp = strrchr(line, ' ');
        if (sp != NULL && (size_t) (sp - line) == strlen(key) && strncmp(line, key, strlen(key)) == 0) {
            const double v = strtod(sp + 1, NULL);
            cached         = isfinite(v) && v > 0 ? v : cached;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    if (cached > 0) {
        return cached;
    }
    int          settled;
    const double gbs = form_measure_beta(n_threads, 0.1, &settled);
    *measured        = 1;
    // one short write in append mode: processes loading models at the same time do not interleave their lines;
    // a figure from threads that were not running throughout (a busy machine) is used once, never cached
    if (gbs > 0 && settled && dir[0] != '\0' && form_mkdirs(dir) == 0 && (f = fopen(file, "a")) != NULL) {
        fprintf(f, "%s %.3f\n", key, gbs);
        fclose(f);
    }
    return gbs;
}

// ---- gamma of both forms ----

enum { FORM_NR = 64, FORM_K = 2048 }; // the tile: 64 rows x 2048 weights, ~26 KiB of BITCOS, 32 KiB of codes

// ns per call over `calls` back-to-back calls of one form's kernel on the tile (w for BITCOS, else cw).
static double form_time(const bitcos_kernel * k, const bitcos_rows * w, const bitcos_codes_rows * cw,
                        const bitcos_q8_K * const * y, float * const * dst, long calls) {
    const double t0 = form_now_ns();
    for (long i = 0; i < calls; ++i) {
        if (w != NULL) {
            bitcos_kernel_mm(k, w, FORM_NR, y, 1, dst, NULL);
        } else {
            bitcos_kernel_codes_mm(k, cw, FORM_NR, y, 1, dst);
        }
    }
    return (form_now_ns() - t0) / (double) calls;
}

static uint64_t form_rng(uint64_t * s) { // splitmix64: the same tile in every process and on every platform
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z          = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z          = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void bitcos_form_measure_gamma(const bitcos_kernel * k, double z, double seconds, double * gamma_bitcos,
                               double * gamma_codes) {
    enum { NB = FORM_K / BITCOS_Q8K_BLOCK, ROW_BYTES = FORM_K / 8, BITS = FORM_NR * ROW_BYTES };
    const size_t crb = bitcos_codes_row_bytes(FORM_K);
    // one allocation: the activations (first: float-aligned), bitmaps, the pool (room for every sign and the zero
    // tail the kernels read past the last sign), codes
    uint8_t *    mem = (uint8_t *) calloc(1, NB * sizeof(bitcos_q8_K) + BITS + (BITS + 64) + FORM_NR * crb);
    *gamma_bitcos = *gamma_codes = NAN;
    if (mem == NULL) {
        return;
    }
    bitcos_q8_K * y    = (bitcos_q8_K *) mem;
    uint8_t *     bits = mem + NB * sizeof(bitcos_q8_K), *pool = bits + BITS, *codes = pool + BITS + 64;
    uint64_t      sign_pos[FORM_NR], s = 0x5eed, pos = 0;
    float         scale[FORM_NR], dst[FORM_NR];
    z = !(z > 0) ? 0 : z > 1 ? 1 : z;
    for (int i = 0; i < FORM_NR; ++i) {
        scale[i]    = 0.5f; // MATRIX: the matrix's scale repeated per row
        sign_pos[i] = pos;
        for (int j = 0; j < FORM_K; ++j) {
            if ((double) (form_rng(&s) >> 11) * 0x1p-53 < 1 - z) {
                bits[i * ROW_BYTES + j / 8] |= (uint8_t) (1u << (j % 8));
                pool[pos >> 3] |= (uint8_t) ((form_rng(&s) & 1) << (pos & 7));
                pos++;
            }
        }
    }
    for (int j = 0; j < FORM_K; ++j) {
        bitcos_q8_K * b             = &y[j / BITCOS_Q8K_BLOCK];
        b->d                        = 1.0f;
        b->qs[j % BITCOS_Q8K_BLOCK] = (int8_t) ((int) (form_rng(&s) % 255) - 127);
        b->bsums[j % BITCOS_Q8K_BLOCK / 16] += b->qs[j % BITCOS_Q8K_BLOCK];
    }
    const bitcos_rows   w     = { FORM_K, bits, BITCOS_BITMAP_BYTES, ROW_BYTES, pool, sign_pos, scale, NULL, 0, 0, 0 };
    const bitcos_q8_K * yc[1] = { y };
    float *             dc[1] = { dst };
    k                         = k != NULL ? k : bitcos_kernel_best();
    bitcos_codes_decode(&w, 0, FORM_NR, codes, crb);
    const bitcos_codes_rows cw     = bitcos_codes_rows_of(&w, codes, crb);
    // calls per repeat so that one lasts ~2 ms (less when the budget is small), after a warm-up call each
    const double            budget = (seconds > 0 ? seconds : 0.02) * 1e9, per32 = (double) FORM_NR * FORM_K / 32;
    long                    calls[2];
    for (int f = 0; f < 2; ++f) {
        form_time(k, f ? NULL : &w, &cw, yc, dc, 1);
        calls[f] = (long) fmax(1, fmin(2e6, budget / 6) / fmax(form_time(k, f ? NULL : &w, &cw, yc, dc, 1), 1));
    }
    double       best[2] = { INFINITY, INFINITY };
    const double t0      = form_now_ns();
    // the forms alternate, so that a change of clock or load during the measurement touches both alike
    for (int rep = 0; rep < 2 || form_now_ns() - t0 < budget; ++rep) {
        for (int f = 0; f < 2; ++f) {
            best[f] = fmin(best[f], form_time(k, f ? NULL : &w, &cw, yc, dc, calls[f]) / per32);
        }
    }
    *gamma_bitcos = best[0];
    *gamma_codes  = best[1];
    free(mem);
}
