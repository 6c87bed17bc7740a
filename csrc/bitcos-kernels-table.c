// The kernel table (bitcos-kernels.h): every BITCOS CPU kernel this build has, with its availability test and
// entry points, in order of preference. The ggml-cpu glue runs bitcos_kernel_best(); the harness library
// (bitcos-harness.c) exports the table by index and name to ggml_bitcos.harness, hence to the Python tests and
// `ggml-bitcos bench kernels`; the kernel fuzzer walks it. A new kernel is one entry here, under the macro
// that says its file was compiled (docs/CONTRIBUTING.md, "Adding a CPU kernel").
//
// Two ways to build it:
//   * every kernel file and this one with the same target flags (ggml-cpu: one CPU variant, or GGML_NATIVE):
//     an entry is compiled in when those flags allow its kernel (BITCOS_BUILD_*), and ggml loads a variant
//     only on a CPU that has its flags, so `available` is always 1;
//   * each kernel file with its own flags, this one with the baseline flags and
//     -DBITCOS_KERNELS_PER_FILE_FLAGS (the harness library, the kernel fuzzer: root CMakeLists.txt,
//     tests/fuzzing.py): every entry of the architecture is compiled in, and `available` asks the CPU for
//     exactly the extensions its file was compiled with.
#include "bitcos-kernels.h"

#include <stdio.h>

#if defined(BITCOS_KERNELS_PER_FILE_FLAGS) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#    define BITCOS_TABLE_AVX2   1
#    define BITCOS_TABLE_AVX512 1
#elif defined(BITCOS_KERNELS_PER_FILE_FLAGS) && (defined(BITCOS_BUILD_NEON) || defined(BITCOS_BUILD_NEON_DOTPROD))
#    define BITCOS_TABLE_NEON         1
#    define BITCOS_TABLE_NEON_DOTPROD 1
#else
#    if defined(BITCOS_BUILD_NEON)
#        define BITCOS_TABLE_NEON 1
#    endif
#    if defined(BITCOS_BUILD_NEON_DOTPROD)
#        define BITCOS_TABLE_NEON_DOTPROD 1
#    endif
#    if defined(BITCOS_BUILD_AVX2)
#        define BITCOS_TABLE_AVX2 1
#    endif
#    if defined(BITCOS_BUILD_AVX512)
#        define BITCOS_TABLE_AVX512 1
#    endif
#endif

static int bitcos_always(void) {
    return 1;
}

#if defined(BITCOS_KERNELS_PER_FILE_FLAGS) && defined(BITCOS_TABLE_AVX2)
// The extensions of the x86-64-v3 flags the harness compiles bitcos-kernels-avx2.c with (CMakeLists.txt).
static int bitcos_cpu_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") &&
           __builtin_cpu_supports("f16c");
}
// The extensions of the x86-64-v4 + Ice Lake / Zen 4 flags bitcos-kernels-avx512.c is compiled with.
static int bitcos_cpu_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("avx512bitalg") &&
           __builtin_cpu_supports("avx512vpopcntdq") && __builtin_cpu_supports("bmi2");
}
#    define BITCOS_AVAILABLE_AVX2   bitcos_cpu_avx2
#    define BITCOS_AVAILABLE_AVX512 bitcos_cpu_avx512
#else
#    define BITCOS_AVAILABLE_AVX2   bitcos_always
#    define BITCOS_AVAILABLE_AVX512 bitcos_always
#endif

#if defined(BITCOS_KERNELS_PER_FILE_FLAGS) && defined(BITCOS_TABLE_NEON_DOTPROD)
// The dotprod kernel's object is compiled with -march=armv8.2-a+dotprod (CMakeLists.txt): ask the CPU for sdot.
#    if defined(__linux__)
#        include <sys/auxv.h>
#        ifndef HWCAP_ASIMDDP
#            define HWCAP_ASIMDDP (1UL << 20) // the Linux arm64 ABI's bit (asm/hwcap.h)
#        endif
static int bitcos_cpu_dotprod(void) {
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
}
#    elif defined(__APPLE__)
#        include <sys/sysctl.h>
static int bitcos_cpu_dotprod(void) {
    int    v = 0;
    size_t n = sizeof v;
    return sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &n, NULL, 0) == 0 && v != 0;
}
#    else
static int bitcos_cpu_dotprod(void) {
    return 0; // no portable way to ask: the Armv8.0 kernel runs
}
#    endif
#    define BITCOS_AVAILABLE_NEON_DOTPROD bitcos_cpu_dotprod
#else
#    define BITCOS_AVAILABLE_NEON_DOTPROD bitcos_always
#endif

static const bitcos_kernel bitcos_kernels[] = {
    { "generic", bitcos_always, NULL, bitcos_mm_generic },
    { "portable", bitcos_always, NULL, bitcos_mm_portable },
#if defined(BITCOS_TABLE_NEON)
    { "neon", bitcos_always, NULL, bitcos_mm_neon }, // Advanced SIMD is part of every aarch64 CPU
#endif
#if defined(BITCOS_TABLE_NEON_DOTPROD)
    { "neon-dotprod", BITCOS_AVAILABLE_NEON_DOTPROD, NULL, bitcos_mm_neon_dotprod },
#endif
#if defined(BITCOS_TABLE_AVX2)
    { "avx2", BITCOS_AVAILABLE_AVX2, bitcos_covers_avx2, bitcos_mm_avx2 },
#endif
#if defined(BITCOS_TABLE_AVX512)
    { "avx512", BITCOS_AVAILABLE_AVX512, bitcos_covers_avx512, bitcos_mm_avx512 },
#endif
};

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
