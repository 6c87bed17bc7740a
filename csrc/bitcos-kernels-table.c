// The kernel table (bitcos-kernels.h): every BITCOS CPU kernel this build has, with its availability test and
// entry points, in order of preference. The ggml-cpu glue runs bitcos_kernel_best(); the harness library
// (bitcos-harness.c) exports the table by index and name to ggml_bitcos.harness, hence to the Python tests and
// `ggml-bitcos bench kernels`; the kernel fuzzer walks it. The entries come from the kernel manifest
// (bitcos-kernels.json, written out as bitcos-kernels-list.h): a new kernel is one entry there
// (docs/CONTRIBUTING.md, "Adding a CPU kernel").
//
// Two ways to build it:
//   * every kernel file and this one with the same target flags (ggml-cpu: one CPU variant, or GGML_NATIVE):
//     an entry is compiled in when those flags allow its kernel (BITCOS_BUILD_*), and ggml loads a variant
//     only on a CPU that has its flags, so `available` is always 1;
//   * each kernel file with its own flags, this one with the baseline flags and
//     -DBITCOS_KERNELS_PER_FILE_FLAGS (the harness library, the kernel fuzzer: root CMakeLists.txt,
//     tests/fuzzing.py): every entry of the architecture is compiled in, and `available` asks the CPU for
//     exactly the extensions its file was compiled with (the manifest's cpu_check).
#define BITCOS_KERNELS_LIST_TABLE 1
#include "bitcos-kernels.h"

#include <stdio.h>
#include <stdlib.h>

static int bitcos_always(void) {
    return 1;
}

static const bitcos_kernel bitcos_kernels[] = { BITCOS_KERNEL_ENTRIES };

#define BITCOS_N_KERNELS ((int) (sizeof(bitcos_kernels) / sizeof(bitcos_kernels[0])))

int bitcos_kernel_count(void) {
    return BITCOS_N_KERNELS;
}

const bitcos_kernel * bitcos_kernel_at(int i) {
    return i >= 0 && i < BITCOS_N_KERNELS ? &bitcos_kernels[i] : NULL;
}

const bitcos_kernel * bitcos_kernel_named(const char * name) {
    for (int i = 0; i < BITCOS_N_KERNELS; ++i) {
        const char *a = bitcos_kernels[i].name, *b = name;
        while (*a && *a == *b) {
            ++a;
            ++b;
        }
        if (*a == *b) {
            return &bitcos_kernels[i];
        }
    }
    return NULL;
}

const bitcos_kernel * bitcos_kernel_best(void) {
    // GGML_BITCOS_KERNEL=<name>: an available entry of lower preference instead (to compare kernels in one build,
    // e.g. avx2 on an AVX-512 CPU); an unknown or unavailable name is ignored
    const char * name = getenv("GGML_BITCOS_KERNEL");
    if (name != NULL && name[0] != '\0') {
        const bitcos_kernel * k = bitcos_kernel_named(name);
        if (k != NULL && k->available()) {
            return k;
        }
    }
    for (int i = BITCOS_N_KERNELS - 1; i > 0; --i) {
        if (bitcos_kernels[i].available()) {
            return &bitcos_kernels[i];
        }
    }
    return &bitcos_kernels[0];
}

// One flag per entry: set by the first fallback of that kernel; one for the line naming the best kernel. A race between
// threads can at worst print the line twice, so plain C11 atomics where the compiler has them, a volatile int elsewhere
// (MSVC's C mode).
#if defined(__STDC_NO_ATOMICS__) || defined(_MSC_VER)
static volatile int bitcos_fallback_told[BITCOS_N_KERNELS];
static volatile int bitcos_best_told;
static int          bitcos_first_fallback(int i) {
    const int first         = !bitcos_fallback_told[i];
    bitcos_fallback_told[i] = 1;
    return first;
}
static int bitcos_first_best_told(void) {
    const int first  = !bitcos_best_told;
    bitcos_best_told = 1;
    return first;
}
#else
#    include <stdatomic.h>
static atomic_int bitcos_fallback_told[BITCOS_N_KERNELS];
static atomic_int bitcos_best_told;
static int        bitcos_first_fallback(int i) {
    return atomic_exchange_explicit(&bitcos_fallback_told[i], 1, memory_order_relaxed) == 0;
}
static int bitcos_first_best_told(void) {
    return atomic_exchange_explicit(&bitcos_best_told, 1, memory_order_relaxed) == 0;
}
#endif

static void bitcos_tell(const char * text, bitcos_log_fn log) {
    if (log != NULL) {
        log(text);
    } else {
        fputs(text, stderr);
    }
}

const bitcos_kernel * bitcos_kernel_best_told(bitcos_log_fn log) {
    const bitcos_kernel * k = bitcos_kernel_best();
    if (bitcos_first_best_told()) {
        char text[64];
        snprintf(text, sizeof text, "BITCOS CPU kernel: %s\n", k->name);
        bitcos_tell(text, log);
    }
    return k;
}

static void bitcos_tell_fallback(const bitcos_kernel * k, const bitcos_rows * w, bitcos_log_fn log) {
    char text[320];
    snprintf(text, sizeof text,
             "BITCOS: the %s kernel does not cover this weight layout (k %% 128 = %d, unit stride %zu, %s, scale "
             "stride %zu); the portable kernel runs it and every other such call (reported once)\n",
             k->name, (int) (w->k % QK_BITCOS), w->unit_bytes,
             w->row_scale != NULL ? "row scales" :
             w->block_scale_shift ? "a scale per 256" :
                                    "a scale per 128",
             w->row_scale != NULL ? (size_t) 0 : w->scale_stride);
    bitcos_tell(text, log);
}

void bitcos_kernel_mm(const bitcos_kernel * k, const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y,
                      int64_t nc, float * const * dst, bitcos_log_fn log) {
    if (k->covers != NULL && !k->covers(w)) {
        if (bitcos_first_fallback((int) (k - bitcos_kernels))) {
            bitcos_tell_fallback(k, w, log);
        }
        bitcos_mm_portable(w, nr, y, nc, dst); // every descriptor, the same bits, 11-15x the generic kernel
        return;
    }
    k->mm(w, nr, y, nc, dst);
}

void bitcos_kernel_codes_mm(const bitcos_kernel * k, const bitcos_codes_rows * w, int64_t nr,
                            const bitcos_q8_K * const * y, int64_t nc, float * const * dst) {
    (k->codes_mm != NULL ? k->codes_mm : bitcos_codes_mm_portable)(w, nr, y, nc, dst);
}
