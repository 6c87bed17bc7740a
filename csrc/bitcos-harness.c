// Standalone harness around the BITCOS kernels (libbitcos_kernels.so): flat C entry points for the Python
// tests and `ggml-bitcos bench kernels` (ggml_bitcos/harness.py, ggml_bitcos/bench/kernels.py).
//
// CMakeLists.txt builds it twice, with -DBITCOS_FMA=1 (libbitcos_kernels.so) and -DBITCOS_FMA=0
// (libbitcos_kernels_nofma.so), passing the same value to every object so that all kernels of one library
// implement the same form of the contract. The kernels are the kernel table's (bitcos-kernels-table.c, built
// with BITCOS_KERNELS_PER_FILE_FLAGS: each SIMD kernel file compiled with its own target flags, the CPU asked
// at run time): an `impl` argument below is an index into that table, whose names bitcos_h_kernel_name gives.
#include "bitcos-form.h"
#include "bitcos-kernels.h"

#include <stdint.h>
#include <string.h>

#define BITCOS_H_MAX_COLS 4096

// Number of kernels in the table (compiled in; bitcos_h_available says which this CPU can run).
int bitcos_h_kernel_count(void) {
    return bitcos_kernel_count();
}

// Name of kernel `impl` ("generic", "avx2", ...), NULL outside the table.
const char * bitcos_h_kernel_name(int impl) {
    const bitcos_kernel * k = bitcos_kernel_at(impl);
    return k ? k->name : NULL;
}

// 1 when kernel `impl` is compiled in and this CPU has every extension its object was built for.
int bitcos_h_available(int impl) {
    const bitcos_kernel * k = bitcos_kernel_at(impl);
    return k != NULL && k->available();
}

static const bitcos_kernel * bitcos_h_kernel(int impl) {
    return bitcos_h_available(impl) ? bitcos_kernel_at(impl) : NULL;
}

// Version of the entry points below (ggml_bitcos/harness.py skips a library of another version): 2 = the
// bitcos_rows descriptor of format version 2 (bits, unit stride, row or block scales); 3 = the kernels by
// the table's index and name (bitcos_h_kernel_count, bitcos_h_kernel_name), bitcos_h_covers; 4 = the 2-bit
// codes form (bitcos_h_codes_*); 5 = the form decision (bitcos_h_form_*, bitcos-form.h).
int bitcos_h_abi(void) {
    return 5;
}

// Arguments of one call in flat form: nc columns of ceil(k/256) Q8_K blocks each, back to back in y, and
// dst as nc columns of nr floats.
typedef struct {
    bitcos_rows         rows;
    const bitcos_q8_K * ycols[BITCOS_H_MAX_COLS];
    float *             dcols[BITCOS_H_MAX_COLS];
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
        unit_bytes < BITCOS_BITMAP_BYTES || row_bytes < (size_t) (k / 8) ||
        (nr > 0 && (bits == NULL || pool == NULL || sign_pos == NULL))) {
        return -2;
    }
    if (row_scale == NULL) {
        if (block_scale == NULL || (block_scale_shift != 0 && block_scale_shift != 1) ||
            k % ((int64_t) QK_BITCOS << block_scale_shift) != 0 || scale_stride < sizeof(uint16_t) ||
            scale_row_bytes < (size_t) ((nu >> block_scale_shift) - 1) * scale_stride + sizeof(uint16_t)) {
            return -2;
        }
    }
    bitcos_rows * r      = &call->rows;
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
    const int64_t nby    = (k + BITCOS_Q8K_BLOCK - 1) / BITCOS_Q8K_BLOCK;
    for (int64_t c = 0; c < nc; ++c) {
        call->ycols[c] = y + c * nby;
        call->dcols[c] = dst + c * nr;
    }
    return 0;
}

// The table entry `impl` (-1 when it is not available here) and the call its arguments describe, in this
// thread's call record (-2 when they are no valid descriptor): the common start of the timing and coverage
// entry points.
static int bitcos_h_prepare(int impl, const bitcos_kernel ** kernel, const bitcos_h_call ** call, int64_t k,
                            const uint8_t * bits, size_t unit_bytes, size_t row_bytes, const uint8_t * pool,
                            const uint64_t * sign_pos, const float * row_scale, const uint8_t * block_scale,
                            size_t scale_stride, size_t scale_row_bytes, int block_scale_shift, const bitcos_q8_K * y,
                            int64_t nc, float * dst, int64_t nr) {
    static _Thread_local bitcos_h_call record;
    *kernel = bitcos_h_kernel(impl);
    *call   = &record;
    if (*kernel == NULL) {
        return -1;
    }
    return bitcos_h_setup(&record, k, bits, unit_bytes, row_bytes, pool, sign_pos, row_scale, block_scale, scale_stride,
                          scale_row_bytes, block_scale_shift, y, nc, dst, nr);
}

static inline uint64_t bitcos_h_tsc(void) {
#if defined(__x86_64__) || defined(__i386__)
    uint32_t lo, hi;
    __asm__ __volatile__("lfence\n\trdtsc\n\tlfence" : "=a"(lo), "=d"(hi)::"memory");
    return ((uint64_t) hi << 32) | lo;
#else
    return 0;
#endif
}

// Times `reps` back-to-back calls (after one warm-up call), writing each call's TSC ticks to ticks[rep].
// rdtsc counts at the constant reference frequency, not the core clock (see docs/KERNELS.md). The
// descriptor's fields are bitcos_rows' (k .. block_scale_shift); row_scale NULL selects block scales.
int bitcos_h_time(int impl, int64_t k, const uint8_t * bits, size_t unit_bytes, size_t row_bytes, const uint8_t * pool,
                  const uint64_t * sign_pos, const float * row_scale, const uint8_t * block_scale, size_t scale_stride,
                  size_t scale_row_bytes, int block_scale_shift, int64_t nr, const bitcos_q8_K * y, int64_t nc,
                  float * dst, int reps, uint64_t * ticks) {
    const bitcos_kernel * kernel;
    const bitcos_h_call * call;
    const int rc = bitcos_h_prepare(impl, &kernel, &call, k, bits, unit_bytes, row_bytes, pool, sign_pos, row_scale,
                                    block_scale, scale_stride, scale_row_bytes, block_scale_shift, y, nc, dst, nr);
    if (rc != 0) {
        return rc;
    }
    bitcos_kernel_mm(kernel, &call->rows, nr, call->ycols, nc, call->dcols, NULL);
    for (int i = 0; i < reps; ++i) {
        const uint64_t t0 = bitcos_h_tsc();
        bitcos_kernel_mm(kernel, &call->rows, nr, call->ycols, nc, call->dcols, NULL);
        ticks[i] = bitcos_h_tsc() - t0;
    }
    return 0;
}

// 1 when kernel `impl` runs the descriptor on its own paths, 0 when the table sends it to the generic kernel
// (reported once on stderr), -1 when impl is not available here, -2 on bad arguments.
int bitcos_h_covers(int impl, int64_t k, const uint8_t * bits, size_t unit_bytes, size_t row_bytes,
                    const uint8_t * pool, const uint64_t * sign_pos, const float * row_scale,
                    const uint8_t * block_scale, size_t scale_stride, size_t scale_row_bytes, int block_scale_shift,
                    int64_t nr, const bitcos_q8_K * y, int64_t nc, float * dst) {
    const bitcos_kernel * kernel;
    const bitcos_h_call * call;
    const int rc = bitcos_h_prepare(impl, &kernel, &call, k, bits, unit_bytes, row_bytes, pool, sign_pos, row_scale,
                                    block_scale, scale_stride, scale_row_bytes, block_scale_shift, y, nc, dst, nr);
    return rc != 0 ? rc : kernel->covers == NULL || kernel->covers(&call->rows);
}

// One kernel call (bitcos_h_time with no timed repetition). Returns 0, -1 when impl is not available
// here, -2 on bad arguments.
int bitcos_h_mm(int impl, int64_t k, const uint8_t * bits, size_t unit_bytes, size_t row_bytes, const uint8_t * pool,
                const uint64_t * sign_pos, const float * row_scale, const uint8_t * block_scale, size_t scale_stride,
                size_t scale_row_bytes, int block_scale_shift, int64_t nr, const bitcos_q8_K * y, int64_t nc,
                float * dst) {
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

// ---- The 2-bit codes form (bitcos-kernels.h) ----

// 1 when kernel `impl` has a codes-form kernel of its own (else the table runs the portable one for it).
int bitcos_h_has_codes(int impl) {
    const bitcos_kernel * k = bitcos_kernel_at(impl);
    return k != NULL && k->codes_mm != NULL;
}

// 1 when bitcos_codes_decode runs its fast (BMI2) path on this CPU.
int bitcos_h_codes_decode_fast(void) {
    return bitcos_codes_decode_fast();
}

// Decodes rows i0 .. i1 of the descriptor's rows into codes (row stride codes_row_bytes): fast 0 the generic C
// decode, 1 bitcos_codes_decode (the fastest path here). Returns 0, -2 on bad arguments.
int bitcos_h_codes_decode(int fast, int64_t k, const uint8_t * bits, size_t unit_bytes, size_t row_bytes,
                          const uint8_t * pool, const uint64_t * sign_pos, const float * row_scale,
                          const uint8_t * block_scale, size_t scale_stride, size_t scale_row_bytes,
                          int block_scale_shift, int64_t i0, int64_t i1, uint8_t * codes, size_t codes_row_bytes) {
    static _Thread_local bitcos_h_call record;
    static const bitcos_q8_K           y0;
    float                              d0;
    if (bitcos_h_setup(&record, k, bits, unit_bytes, row_bytes, pool, sign_pos, row_scale, block_scale, scale_stride,
                       scale_row_bytes, block_scale_shift, &y0, 1, &d0, i1) != 0 ||
        i0 < 0 || i0 > i1 || codes == NULL || codes_row_bytes < bitcos_codes_row_bytes(k)) {
        return -2;
    }
    (fast ? bitcos_codes_decode : bitcos_codes_decode_generic)(&record.rows, i0, i1, codes, codes_row_bytes);
    return 0;
}

// bitcos_codes_copy_block_scales of rows i0 .. i1 of a block-scale descriptor. Returns 0, -2 on bad arguments.
int bitcos_h_codes_copy_block_scales(int64_t k, const uint8_t * bits, size_t unit_bytes, size_t row_bytes,
                                     const uint8_t * pool, const uint64_t * sign_pos, const uint8_t * block_scale,
                                     size_t scale_stride, size_t scale_row_bytes, int block_scale_shift, int64_t i0,
                                     int64_t i1, uint8_t * scales) {
    static _Thread_local bitcos_h_call record;
    static const bitcos_q8_K           y0;
    float                              d0;
    if (bitcos_h_setup(&record, k, bits, unit_bytes, row_bytes, pool, sign_pos, NULL, block_scale, scale_stride,
                       scale_row_bytes, block_scale_shift, &y0, 1, &d0, i1) != 0 ||
        i0 < 0 || i0 > i1 || scales == NULL) {
        return -2;
    }
    bitcos_codes_copy_block_scales(&record.rows, i0, i1, scales);
    return 0;
}

typedef struct {
    bitcos_codes_rows   rows;
    const bitcos_q8_K * ycols[BITCOS_H_MAX_COLS];
    float *             dcols[BITCOS_H_MAX_COLS];
} bitcos_h_codes_call;

// Times `reps` calls (after one warm-up call) of kernel impl's codes kernel through bitcos_kernel_codes_mm, as
// bitcos_h_time does for the BITCOS kernels. The descriptor's fields are bitcos_codes_rows'. Returns 0, -1 when
// impl is not available here, -2 on bad arguments.
int bitcos_h_codes_time(int impl, int64_t k, const uint8_t * codes, size_t codes_row_bytes, const float * row_scale,
                        const uint8_t * block_scale, size_t scale_stride, size_t scale_row_bytes, int block_scale_shift,
                        int64_t nr, const bitcos_q8_K * y, int64_t nc, float * dst, int reps, uint64_t * ticks) {
    static _Thread_local bitcos_h_codes_call call;
    const bitcos_kernel *                    kernel = bitcos_h_kernel(impl);
    const int64_t                            nu     = (k + QK_BITCOS - 1) / QK_BITCOS;
    if (kernel == NULL) {
        return -1;
    }
    if (nc < 1 || nc > BITCOS_H_MAX_COLS || k <= 0 || k % QK_BITCOS_BITMAP != 0 || nr < 0 ||
        codes_row_bytes < bitcos_codes_row_bytes(k) || (nr > 0 && codes == NULL)) {
        return -2;
    }
    if (row_scale == NULL && (block_scale == NULL || (block_scale_shift != 0 && block_scale_shift != 1) ||
                              k % ((int64_t) QK_BITCOS << block_scale_shift) != 0 || scale_stride < sizeof(uint16_t) ||
                              scale_row_bytes < (size_t) ((nu >> block_scale_shift) - 1) * scale_stride + 2)) {
        return -2;
    }
    const bitcos_codes_rows r = { k,           codes,        codes_row_bytes, row_scale,
                                  block_scale, scale_stride, scale_row_bytes, block_scale_shift };
    call.rows                 = r;
    const int64_t nby         = (k + BITCOS_Q8K_BLOCK - 1) / BITCOS_Q8K_BLOCK;
    for (int64_t c = 0; c < nc; ++c) {
        call.ycols[c] = y + c * nby;
        call.dcols[c] = dst + c * nr;
    }
    bitcos_kernel_codes_mm(kernel, &call.rows, nr, call.ycols, nc, call.dcols);
    for (int i = 0; i < reps; ++i) {
        const uint64_t t0 = bitcos_h_tsc();
        bitcos_kernel_codes_mm(kernel, &call.rows, nr, call.ycols, nc, call.dcols);
        ticks[i] = bitcos_h_tsc() - t0;
    }
    return 0;
}

// One call of kernel impl's codes kernel (bitcos_h_codes_time with no timed repetition).
int bitcos_h_codes_mm(int impl, int64_t k, const uint8_t * codes, size_t codes_row_bytes, const float * row_scale,
                      const uint8_t * block_scale, size_t scale_stride, size_t scale_row_bytes, int block_scale_shift,
                      int64_t nr, const bitcos_q8_K * y, int64_t nc, float * dst) {
    return bitcos_h_codes_time(impl, k, codes, codes_row_bytes, row_scale, block_scale, scale_stride, scale_row_bytes,
                               block_scale_shift, nr, y, nc, dst, 0, NULL);
}

// ---- The form decision (bitcos-form.h) ----

// bitcos_form_choose on flat arguments; out[0..3] = bytes_bitcos, bytes_codes, t_bitcos, t_codes. Returns the form.
int bitcos_h_form_choose(double gamma_bitcos, double gamma_codes, double beta_thread, int n_threads, double z,
                         double scale_bits, double * out) {
    const bitcos_form_inputs in = { gamma_bitcos, gamma_codes, beta_thread, n_threads, z, scale_bits };
    const bitcos_form_choice c  = bitcos_form_choose(&in);
    out[0]                      = c.bytes_bitcos;
    out[1]                      = c.bytes_codes;
    out[2]                      = c.t_bitcos;
    out[3]                      = c.t_codes;
    return c.form;
}

int bitcos_h_form_physical_cores(void) {
    return bitcos_form_physical_cores();
}

double bitcos_h_form_measure_beta(int n_threads, double seconds) {
    return bitcos_form_measure_beta(n_threads, seconds);
}

double bitcos_h_form_beta_cached(int n_threads, int * measured) {
    return bitcos_form_beta_cached(n_threads, measured);
}

// gamma of both forms for kernel `impl` (ns per 32 weights). Returns 0, -1 when impl is not available here.
int bitcos_h_form_measure_gamma(int impl, double z, double seconds, double * gamma_bitcos, double * gamma_codes) {
    const bitcos_kernel * k = bitcos_h_kernel(impl);
    if (k == NULL) {
        return -1;
    }
    bitcos_form_measure_gamma(k, z, seconds, gamma_bitcos, gamma_codes);
    return 0;
}
