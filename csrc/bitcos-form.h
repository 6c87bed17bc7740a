// Which in-memory form a BITCOS weight runs in on the CPU: the stored BITCOS form, or the 2-bit codes form
// decoded once at load (docs/KERNELS.md §8, §9). The choice is a roofline per form with the memory time and the
// decode time added, T = B / beta_thread + gamma, not the paper's max(B / beta_thread, gamma): a mat-vec thread
// walks one row stream at a time and its decode does not hide the stream's stalls (on the measured x86 VM the
// max() form predicted BITCOS 3 % faster where the codes form ran 8 % faster; the sum predicted 9 %, KERNELS.md
// §9). BITCOS streams fewer bytes (B = (2 - z) bits per weight) but costs more instructions (gamma), the codes
// form streams 2 bits per weight and decodes almost nothing. Where a thread's share of memory bandwidth is
// scarce the bytes weigh more and BITCOS wins; where it is plentiful (few threads, or a CPU whose BITCOS decode
// is slow) gamma weighs more and the codes form wins.
//
// Plain C11 with no ggml dependency: compiled into ggml-cpu (every CPU variant) and into the standalone harness
// library (root CMakeLists.txt), which the Python tests and `ggml-bitcos bench bandwidth` call.
#pragma once

#include "bitcos-kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

enum bitcos_form { BITCOS_FORM_BITCOS = 0, BITCOS_FORM_CODES = 1 };

// The codes form must be predicted >= 5 % faster to be chosen: gamma and beta are measured on a machine that
// is doing other things, and a decode costs load time and memory, so a near tie keeps the stored form instead
// of flipping between forms from one load to the next on measurement noise.
#define BITCOS_FORM_MARGIN 0.05

typedef struct {
    double gamma_bitcos; // ns per 32 weights per thread of the BITCOS kernel, cache-resident tile, 1 column
    double gamma_codes;  // the same for the codes-form kernel
    double beta_thread;  // GB/s of streaming read per thread while n_threads threads stream together
    int    n_threads;    // threads that will run the mat-muls
    double z;            // zero density of the model's BITCOS weights
    double scale_bits;   // bits per weight of the scales (same for both forms; 0 is fine)
} bitcos_form_inputs;

typedef struct {
    int    form;         // enum bitcos_form
    double bytes_bitcos; // bytes per 32 weights streamed: (2 - z) * 4 + scale_bits * 4
    double bytes_codes;  // 8 + scale_bits * 4
    double t_bitcos;     // predicted ns per 32 weights per thread: bytes / beta_thread + gamma
    double t_codes;
} bitcos_form_choice;

// T = B / beta_thread + gamma per form; CODES only when t_bitcos > (1 + MARGIN) * t_codes.
// z is clamped to [0, 1]. beta_thread <= 0 or NaN (unknown) gives t = +inf for both forms, hence BITCOS; so does
// a NaN gamma: without numbers the stored form stays.
bitcos_form_choice bitcos_form_choose(const bitcos_form_inputs * in);

// Physical cores (llama.cpp's default thread count is the physical core count): Linux: distinct
// /sys/devices/system/cpu/cpu*/topology/{physical_package_id,core_id} pairs of online CPUs; else or on failure
// the logical CPU count (sysconf). Always >= 1.
int bitcos_form_physical_cores(void);

// Measures streaming-read bandwidth per thread with n_threads threads each reading its own buffer (size chosen
// so that all buffers together exceed any LLC: e.g. 64 MiB per thread, capped by 1 GiB total), best of a few
// passes, about `seconds` in all (0.05-0.2 s); a pass counts only if its thread ran on a CPU for >= 90 % of it
// (else, on a busy machine, the best pass). GB/s per thread (1e9 bytes). 0 when the buffers cannot be had.
double bitcos_form_measure_beta(int n_threads, double seconds);

// Cached beta: the file `<dir>/cpu-bandwidth-v2.txt` where dir is $GGML_BITCOS_CACHE_DIR, else
// $XDG_CACHE_HOME/ggml-bitcos, else $HOME/.cache/ggml-bitcos; one line per key "<cpu model string>|<n_threads> <GB/s>"
// (CPU model from /proc/cpuinfo "model name" / "CPU part", else "unknown"). Missing -> measure, append (only a
// figure from passes that ran undisturbed), return.
// Env GGML_BITCOS_BETA=<GB/s per thread> overrides (no measure, no file). Unwritable dir -> measure and return.
// *measured (may be NULL) tells whether it measured now.
double bitcos_form_beta_cached(int n_threads, int * measured);

// gamma of both forms for kernel k of the kernel table (bitcos_kernel_best() in ggml-cpu) on a synthetic
// cache-resident tile at zero density z: 64 rows x 2048 weights, MATRIX-like row scales, a fixed-seed bitmap with
// density 1 - z, random signs, sign_pos from popcounts, a pool with the required 64-byte zero tail; the codes tile
// by bitcos_codes_decode + bitcos_codes_rows_of; one activation column (bitcos_q8_K, random qs, bsums consistent,
// d = 1). Min over repeats of ~2 ms each, total about `seconds` (a few ms to 50 ms). Results in ns per 32 weights
// (both NaN when the tile cannot be allocated).
void bitcos_form_measure_gamma(const bitcos_kernel * k, double z, double seconds, double * gamma_bitcos,
                               double * gamma_codes);

#ifdef __cplusplus
}
#endif
