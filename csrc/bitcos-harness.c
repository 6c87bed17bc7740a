// Standalone harness around the BITCOS kernels (libbitcos_kernels.so): flat C entry points for the Python
// tests and `ggml-bitcos bench kernels` (ggml_bitcos/harness.py, ggml_bitcos/bench/kernels.py).
//
// CMakeLists.txt builds it twice, with -DBITCOS_FMA=1 (libbitcos_kernels.so) and -DBITCOS_FMA=0
// (libbitcos_kernels_nofma.so), passing the same value to every object so that all paths of one library
// implement the same form of the contract.
// The generic kernel is compiled with the baseline flags; the x86 file is compiled twice by CMakeLists.txt,
// once for x86-64-v3 (AVX2, its symbol renamed to bitcos_mm_avx2_v3) and once for x86-64-v4 + VNNI & co.
// (bitcos_mm_avx512_v4), so all paths sit side by side and the CPU picks which ones may run.
#include "bitcos-kernels.h"

#include <stdint.h>
#include <string.h>

#define BITCOS_IMPL_GENERIC 0
#define BITCOS_IMPL_AVX2    1
#define BITCOS_IMPL_AVX512  2

#if defined(BITCOS_HARNESS_X86)
void bitcos_mm_avx2_v3(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                       float * const * dst);
void bitcos_mm_avx512_v4(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                         float * const * dst);
#endif

#define BITCOS_H_MAX_COLS 4096

// 1 when implementation `impl` is compiled in and this CPU has every extension its object was built for.
int bitcos_h_available(int impl) {
    switch (impl) {
    case BITCOS_IMPL_GENERIC:
        return 1;
#if defined(BITCOS_HARNESS_X86)
    case BITCOS_IMPL_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c");
    case BITCOS_IMPL_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512vnni") &&
               __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("avx512bitalg") &&
               __builtin_cpu_supports("avx512vpopcntdq") && __builtin_cpu_supports("bmi2");
#endif
    default:
        return 0;
    }
}

static bitcos_mm_fn bitcos_h_fn(int impl) {
    if (!bitcos_h_available(impl)) {
        return NULL;
    }
    switch (impl) {
    case BITCOS_IMPL_GENERIC: return bitcos_mm_generic;
#if defined(BITCOS_HARNESS_X86)
    case BITCOS_IMPL_AVX2:    return bitcos_mm_avx2_v3;
    case BITCOS_IMPL_AVX512:  return bitcos_mm_avx512_v4;
#endif
    default:                  return NULL;
    }
}

// Version of the entry points below (ggml_bitcos/harness.py skips a library of another version): 2 = the
// bitcos_rows descriptor of format version 2 (bits, unit stride, row or block scales).
int bitcos_h_abi(void) {
    return 2;
}

// Arguments of one call in flat form: nc columns of ceil(k/256) Q8_K blocks each, back to back in y, and
// dst as nc columns of nr floats.
typedef struct {
    bitcos_rows         rows;
    const bitcos_q8_K * ycols[BITCOS_H_MAX_COLS];
    float             * dcols[BITCOS_H_MAX_COLS];
} bitcos_h_call;

// The descriptor's fields as bitcos_rows names them (csrc/bitcos-kernels.h), checked for what every kernel
// assumes: k a positive multiple of 32; units of at least a bitmap; either row scales or block scales whose
// granularity divides k.
static int bitcos_h_setup(bitcos_h_call * call, int64_t k, const uint8_t * bits, size_t unit_bytes, size_t row_bytes,
                          const uint8_t * pool, const uint64_t * sign_pos, const float * row_scale,
                          const uint8_t * block_scale, size_t scale_stride, size_t scale_row_bytes,
                          int block_scale_shift, const bitcos_q8_K * y, int64_t nc, float * dst, int64_t nr) {
    const int64_t nu = (k + QK_BITCOS - 1) / QK_BITCOS;
    if (nc < 1 || nc > BITCOS_H_MAX_COLS || k <= 0 || k % QK_BITCOS_BITMAP != 0 || nr < 0 ||
        unit_bytes < BITCOS_BITMAP_BYTES || row_bytes < (size_t)(k / 8) || (nr > 0 && (bits == NULL || pool == NULL ||
        sign_pos == NULL))) {
        return -2;
    }
    if (row_scale == NULL) {
        if (block_scale == NULL || (block_scale_shift != 0 && block_scale_shift != 1) ||
            k % ((int64_t)QK_BITCOS << block_scale_shift) != 0 || scale_stride < sizeof(uint16_t) ||
            scale_row_bytes < (size_t)((nu >> block_scale_shift) - 1) * scale_stride + sizeof(uint16_t)) {
            return -2;
        }
    }
    bitcos_rows * r = &call->rows;
    r->k                 = k;
    r->bits              = bits;
    r->unit_bytes        = unit_bytes;
    r->row_bytes         = row_bytes;
    r->pool              = pool;
    r->sign_pos          = sign_pos;
    r->row_scale         = row_scale;
    r->block_scale       = block_scale;
    r->scale_stride      = scale_stride;
    r->scale_row_bytes   = scale_row_bytes;
    r->block_scale_shift = block_scale_shift;
    const int64_t nby = (k + BITCOS_Q8K_BLOCK - 1) / BITCOS_Q8K_BLOCK;
    for (int64_t c = 0; c < nc; ++c) {
        call->ycols[c] = y + c * nby;
        call->dcols[c] = dst + c * nr;
    }
    return 0;
}

static inline uint64_t bitcos_h_tsc(void) {
#if defined(__x86_64__) || defined(__i386__)
    uint32_t lo, hi;
    __asm__ __volatile__("lfence\n\trdtsc\n\tlfence" : "=a"(lo), "=d"(hi) :: "memory");
    return ((uint64_t)hi << 32) | lo;
#else
    return 0;
#endif
}

// Times `reps` back-to-back calls (after one warm-up call), writing each call's TSC ticks to ticks[rep].
// rdtsc counts at the constant reference frequency, not the core clock (see docs/KERNELS.md). The
// descriptor's fields are bitcos_rows' (k .. block_scale_shift); row_scale NULL selects block scales.
int bitcos_h_time(int impl, int64_t k, const uint8_t * bits, size_t unit_bytes, size_t row_bytes,
                  const uint8_t * pool, const uint64_t * sign_pos, const float * row_scale,
                  const uint8_t * block_scale, size_t scale_stride, size_t scale_row_bytes, int block_scale_shift,
                  int64_t nr, const bitcos_q8_K * y, int64_t nc, float * dst, int reps, uint64_t * ticks) {
    const bitcos_mm_fn fn = bitcos_h_fn(impl);
    if (fn == NULL) {
        return -1;
    }
    static _Thread_local bitcos_h_call call;
    const int rc = bitcos_h_setup(&call, k, bits, unit_bytes, row_bytes, pool, sign_pos, row_scale, block_scale,
                                  scale_stride, scale_row_bytes, block_scale_shift, y, nc, dst, nr);
    if (rc != 0) {
        return rc;
    }
    fn(&call.rows, nr, call.ycols, nc, call.dcols);
    for (int i = 0; i < reps; ++i) {
        const uint64_t t0 = bitcos_h_tsc();
        fn(&call.rows, nr, call.ycols, nc, call.dcols);
        ticks[i] = bitcos_h_tsc() - t0;
    }
    return 0;
}

// One kernel call (bitcos_h_time with no timed repetition). Returns 0, -1 when impl is not available
// here, -2 on bad arguments.
int bitcos_h_mm(int impl, int64_t k, const uint8_t * bits, size_t unit_bytes, size_t row_bytes,
                const uint8_t * pool, const uint64_t * sign_pos, const float * row_scale,
                const uint8_t * block_scale, size_t scale_stride, size_t scale_row_bytes, int block_scale_shift,
                int64_t nr, const bitcos_q8_K * y, int64_t nc, float * dst) {
    return bitcos_h_time(impl, k, bits, unit_bytes, row_bytes, pool, sign_pos, row_scale, block_scale, scale_stride,
                         scale_row_bytes, block_scale_shift, nr, y, nc, dst, 0, NULL);
}

// The contract's FMA form this library was built with (BITCOS_FMA, the same for every object in it).
int bitcos_h_fma(void) {
    return BITCOS_FMA;
}

// Size of the Q8_K block as this library sees it (the Python side checks its dtype against it).
size_t bitcos_h_q8k_size(void) {
    return sizeof(bitcos_q8_K);
}
