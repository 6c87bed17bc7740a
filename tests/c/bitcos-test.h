// Shared by the C tests (test-bitcos-mm, test-bitcos-backend): failure counting and a deterministic RNG.
#pragma once

#include <stdint.h>
#include <stdio.h>

static int g_failures = 0;
static int g_checks = 0;

#define CHECK(cond, ...) do { g_checks++; if (!(cond)) { g_failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

// xorshift64*: deterministic across platforms; each test seeds it (rng_seed) before drawing
static uint64_t g_rng = 1;
static void rng_seed(uint64_t seed) { g_rng = seed; }
static uint64_t rng_u64(void) {
    g_rng ^= g_rng >> 12; g_rng ^= g_rng << 25; g_rng ^= g_rng >> 27;
    return g_rng * 2685821657736338717ull;
}
static double rng_unit(void) { return (double)(rng_u64() >> 11) / 9007199254740992.0; }
