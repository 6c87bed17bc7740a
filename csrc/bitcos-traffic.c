// Memory traffic generator for `ggml-bitcos bench bandwidth` (ggml_bitcos/bench/bandwidth.py), part of the
// standalone harness library (root CMakeLists.txt).
//
// Why: decode is a GEMV, and whether BITCOS's smaller payload makes it faster depends on the DRAM bandwidth
// each compute thread gets. A development VM gives one thread ~30 GB/s, a 64-core server ~4-6 GB/s per core
// (the paper's winning regime). The benchmark runs this generator on the other cores, pinned there, while
// one compute thread runs the GEMV or llama-bench decode: the traffic it generates is what the compute
// thread no longer gets, and the benchmark measures the bandwidth that is left in the same run.
//
// Modes (a buffer much larger than the last-level cache, walked sequentially in 256 KiB slices):
//   read  - 64-bit loads summed into 8 independent accumulators (pure read traffic)
//   write - memset of each slice (stores: a read for ownership plus a write-back per line, unless the C
//           library chooses non-temporal stores)
//   copy  - memcpy of the first half of the buffer into the second (read + write)
// A positive rate (GB/s of bytes touched) paces the walk: after each slice the generator waits until the
// clock has caught up, so several levels between idle and flat out can be swept.
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define BITCOS_TRAFFIC_READ  0
#define BITCOS_TRAFFIC_WRITE 1
#define BITCOS_TRAFFIC_COPY  2

#define BITCOS_TRAFFIC_SLICE ((size_t) 256 * 1024)

static double bitcos_traffic_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

static uint64_t bitcos_traffic_read_slice(const uint8_t * p, size_t n) {
    uint64_t     a[8]  = { 0 };
    const size_t words = n / sizeof(uint64_t);
    for (size_t i = 0; i + 8 <= words; i += 8) {
        for (int j = 0; j < 8; ++j) {
            uint64_t v;
            memcpy(&v, p + (i + j) * sizeof(uint64_t), sizeof v);
            a[j] += v;
        }
    }
    return a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}

// Generates traffic of the given mode over buf[0 .. bytes) for `seconds` (at least one slice), at most
// gb_per_s GB/s of bytes touched (<= 0: as fast as possible). Writes the bytes touched (read + written) to
// *moved and a checksum of what was read to *checksum (so the loads cannot be optimised away). Returns the
// elapsed seconds, or -1 on bad arguments.
double bitcos_h_traffic(int mode, uint8_t * buf, size_t bytes, double gb_per_s, double seconds, uint64_t * moved,
                        uint64_t * checksum) {
    if (buf == NULL || bytes < 2 * BITCOS_TRAFFIC_SLICE || moved == NULL || checksum == NULL ||
        mode < BITCOS_TRAFFIC_READ || mode > BITCOS_TRAFFIC_COPY) {
        return -1.0;
    }
    // copy reads the first half and writes the second; the others walk the whole buffer
    const size_t span   = mode == BITCOS_TRAFFIC_COPY ? bytes / 2 : bytes;
    const size_t slices = span / BITCOS_TRAFFIC_SLICE;
    const double t0     = bitcos_traffic_now();
    uint64_t     done = 0, sum = 0;
    size_t       s = 0;
    for (;;) {
        const size_t off = s * BITCOS_TRAFFIC_SLICE;
        switch (mode) {
            case BITCOS_TRAFFIC_READ:
                sum += bitcos_traffic_read_slice(buf + off, BITCOS_TRAFFIC_SLICE);
                done += BITCOS_TRAFFIC_SLICE;
                break;
            case BITCOS_TRAFFIC_WRITE:
                memset(buf + off, (int) (s & 0xff), BITCOS_TRAFFIC_SLICE);
                done += BITCOS_TRAFFIC_SLICE;
                break;
            default:
                memcpy(buf + span + off, buf + off, BITCOS_TRAFFIC_SLICE);
                done += 2 * BITCOS_TRAFFIC_SLICE;
                break;
        }
        s        = s + 1 == slices ? 0 : s + 1;
        double t = bitcos_traffic_now() - t0;
        if (gb_per_s > 0) {
            const double due = (double) done / (gb_per_s * 1e9); // when this much traffic is due
            while (t < due) {
                t = bitcos_traffic_now() - t0;
            }
        }
        if (t >= seconds) {
            *moved    = done;
            *checksum = sum ^ buf[span - 1];
            return t;
        }
    }
}
