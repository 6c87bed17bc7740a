// Shared by the C tests (test-bitcos-mm, test-bitcos-backend) and the fuzzers (fuzz-bitcos-kernels,
// fuzz-bitcos-loader, fuzz-bitcos-validate): failure counting and a deterministic RNG.
#pragma once

#include <stdint.h>
#include <stdio.h>

// A test file that does not count failures (the fuzzers) includes the counters too: no unused warning for them.
#if defined(__GNUC__)
#    define BITCOS_TEST_MAYBE_UNUSED __attribute__((unused))
#else
#    define BITCOS_TEST_MAYBE_UNUSED
#endif

static int g_failures BITCOS_TEST_MAYBE_UNUSED = 0;
static int g_checks   BITCOS_TEST_MAYBE_UNUSED = 0;

#define CHECK(cond, ...)                                         \
    do {                                                         \
        g_checks++;                                              \
        if (!(cond)) {                                           \
            g_failures++;                                        \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fprintf(stderr, "\n");                               \
        }                                                        \
    } while (0)

// xorshift64*: deterministic across platforms; each test seeds it (rng_seed, rng_seed_case) before drawing
static uint64_t    g_rng = 1;
static inline void rng_seed(uint64_t seed) {
    g_rng = seed;
}
static inline uint64_t rng_u64(void) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 2685821657736338717ull;
}
static inline double rng_unit(void) {
    return (double) (rng_u64() >> 11) / 9007199254740992.0;
}
// uniform in [0, n) (modulo bias is irrelevant at test sizes); 0 for n = 0
static inline uint64_t rng_below(uint64_t n) {
    return n ? rng_u64() % n : 0;
}

// splitmix64's output function: spreads seeds that differ in a few bits over the whole state
static inline uint64_t rng_splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// The fuzzers' case seeding: case `index` of run `seed` draws the same values whatever ran before it (so a
// case replays alone with --seed S --first I --cases 1); never the all-zero state xorshift cannot leave.
static inline void rng_seed_case(uint64_t seed, uint64_t index) {
    g_rng = rng_splitmix64(seed * 0x100000001b3ull ^ rng_splitmix64(index + 1)) | 1;
}
