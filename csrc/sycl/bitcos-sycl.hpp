// BITCOS decode for SYCL devices, after the paper's Xe2 kernel (bitcos-paper.txt §II-D, Fig. 6-9).
//
// Device code only: no ggml dependency, so the same header is compiled into ggml-sycl by icpx and, in this
// project's tests, handed as source to the SYCL runtime's kernel compiler (sycl_ext_oneapi_kernel_compiler)
// and run on Intel's OpenCL CPU device (tests/sycl/test-bitcos-sycl.cpp, tests/test_sycl.py). Format:
// docs/FORMAT.md; offsets from bitcos-format.h.
//
// The design (why it looks like this):
//  * Lanes own rows. A work-item decodes one output row: the 16 lanes of a sub-group are 16 rows (the
//    paper's 16 output columns of W^T), each with its own sign cursor into the compacted sign pool, so no
//    lane waits for another's prefix sum.
//  * pdep by table. GPUs have no pdep; a 4-weight group's codes are a function of its presence nibble m
//    and the next 4 sign bits s of the row's stream, so one lookup in a 256-entry table in local memory
//    (SLM), keyed m | s << 4, returns the group's four codes (fp16 +1 / -1 / 0: 2 KB, the paper's table;
//    on Xe2 the two dwords feed DPAS in VNNI2 order). The window then shifts by popcount(m) only: the
//    windows of consecutive groups overlap, the bits consumed do not.
//  * Refill per 32 weights. A 32-weight bitmap word consumes at most 32 signs, so the 64-bit window is
//    topped up with one aligned 32-bit pool word before each bitmap word whenever it holds fewer than 32
//    valid bits; the pool's zero tail (FORMAT.md §4.4) makes the last refill safe.
//  * Scales as stored. G128 multiplies each 128-weight block's sum by fp32(d); PT multiplies the row's sum
//    by the matrix scale once. (The CPU kernels reproduce TQ2_0's integer lanes instead; SYCL has no TQ2_0
//    to agree with, so these kernels accumulate in fp32 and are compared against the exact reference
//    within fp32 rounding.)
#pragma once

#include "bitcos-format.h"

#include <sycl/sycl.hpp>

#include <cstddef>
#include <cstdint>

namespace bitcos_sycl {

// 4 codes per LUT entry, 256 entries: key = presence nibble | (next 4 sign bits) << 4.
constexpr int LUT_ENTRIES = 256;
constexpr int LUT_CODES   = 4;

// fp16 bit patterns of the codes (IEEE binary16): the table's values, as on Xe2 where DPAS reads them.
constexpr uint16_t HALF_ZERO  = 0x0000;
constexpr uint16_t HALF_PLUS  = 0x3C00;   // +1
constexpr uint16_t HALF_MINUS = 0xBC00;   // -1

// Entry `key` of the table: weight i of the group (bit i of m) takes the sign of its rank among the
// group's present weights, i.e. bit popcount(m & ((1 << i) - 1)) of s (1 = negative).
inline uint16_t lut_code(int key, int i) {
    const int m = key & 15, s = key >> 4;
    if (!((m >> i) & 1)) {
        return HALF_ZERO;
    }
    const int rank = sycl::popcount(m & ((1 << i) - 1));
    return ((s >> rank) & 1) ? HALF_MINUS : HALF_PLUS;
}

// Fills the work-group's table cooperatively (work-item l of n writes entries l, l + n, ...) and waits for the
// whole group: every kernel's prologue. All work-items of the group must call it. Returns lut.
template <int D>
inline const uint16_t * lut_fill(uint16_t * lut, const sycl::nd_item<D> & it) {
    const int lid = (int) it.get_local_linear_id(), nl = (int) it.get_local_range().size();
    for (int e = lid; e < LUT_ENTRIES; e += nl) {
        for (int i = 0; i < LUT_CODES; ++i) {
            lut[e * LUT_CODES + i] = lut_code(e, i);
        }
    }
    sycl::group_barrier(it.get_group());
    return lut;
}

// Little-endian reads from the companion (byte offsets; fields are naturally aligned, sections 64-aligned).
inline uint64_t comp_u64(const uint8_t * c, size_t off) { return *reinterpret_cast<const uint64_t *>(c + off); }
inline uint32_t comp_u32(const uint8_t * c, size_t off) { return *reinterpret_cast<const uint32_t *>(c + off); }
inline uint16_t comp_u16(const uint8_t * c, size_t off) { return *reinterpret_cast<const uint16_t *>(c + off); }

// Pool bit of the first sign of global row r (FORMAT.md §4.3).
inline uint64_t row_sign_pos(const uint8_t * comp, uint64_t r) {
    const unsigned g = comp[BITCOS_HDR_ROW_GROUP_LOG2];
    return comp_u64(comp, comp_u64(comp, BITCOS_HDR_ROW_BASE_OFFSET) + 8 * (r >> g)) +
           comp_u16(comp, comp_u64(comp, BITCOS_HDR_ROW_DELTA_OFFSET) + 2 * r);
}

// The scale of a whole row for PT (matrix r / n_rows_per_mat), 1 for G128 (whose scales are per block).
inline float row_scale(const uint8_t * comp, uint64_t r) {
    if (comp[BITCOS_HDR_VARIANT] != BITCOS_VARIANT_PT) {
        return 1.0f;
    }
    const uint64_t per_mat = comp_u64(comp, BITCOS_HDR_N_ROWS) / comp_u64(comp, BITCOS_HDR_N_MATS);
    const float * scales = reinterpret_cast<const float *>(comp + comp_u64(comp, BITCOS_HDR_SCALES_OFFSET));
    return scales[r / per_mat];
}

// A row's compacted sign stream as a 64-bit window with `n` valid bits, refilled from 32-bit pool words.
struct sign_window {
    const uint32_t * pool;   // the pool as aligned 32-bit words (its section is 64-byte aligned)
    uint64_t         next;   // index of the next pool word to load
    uint64_t         bits;   // the window: bit 0 = next unconsumed sign
    unsigned         n;      // valid bits in `bits`

    inline void start(const uint8_t * comp, uint64_t pos) {
        pool = reinterpret_cast<const uint32_t *>(comp + comp_u64(comp, BITCOS_HDR_POOL_OFFSET));
        next = (pos >> 5) + 1;
        bits = pool[pos >> 5] >> (pos & 31);
        n    = 32 - (unsigned)(pos & 31);
    }
    // before a 32-weight bitmap word: at least 32 valid bits
    inline void refill() {
        if (n < 32) {
            bits |= (uint64_t)pool[next++] << n;
            n += 32;
        }
    }
    inline int peek4() const { return (int)(bits & 15); }
    inline void consume(unsigned c) { bits >>= c; n -= c; }
};

// Calls f(group index j in 0..7, the group's 4 fp16 codes as uint16 bit patterns) for the 8 four-weight
// groups of one 32-bit bitmap word, after topping the window up.
template <typename F>
inline void decode_word32(uint32_t word, sign_window & w, const uint16_t * lut, F && f) {
    w.refill();
    for (int j = 0; j < 8; ++j) {
        const int m   = (int)((word >> (4 * j)) & 15u);
        const int key = m | (w.peek4() << 4);
        f(j, lut + key * LUT_CODES);
        w.consume((unsigned)sycl::popcount(m));
    }
}

inline float half_bits_to_float(uint16_t h) {
    return (float)sycl::bit_cast<sycl::half>(h);
}

// Bytes of one 128-weight block of a row of the given variant, and of its bitmap.
inline size_t block_bytes(int variant) {
    return variant == BITCOS_VARIANT_G128 ? sizeof(block_bitcos_g128) : sizeof(block_bitcos_pt);
}

// Columns one decode of a row serves (the batched path: a decoded 4-weight group meets up to this many
// activation columns before the next group is decoded).
constexpr int MAX_COLS = 8;

// out[c] = sum_k W[r][k] * x[c * x_stride + k] for c < nc (1 <= nc <= MAX_COLS), global row r of a BITCOS
// tensor (blocks: the weight data, comp: its companion), k = n_cols weights (a multiple of 128), x: fp32
// activations. fp32 accumulation: per 128-weight block a partial sum per column, scaled by the block's fp16
// d (G128), then by the matrix scale (PT). The row is decoded once for all nc columns.
inline void rows_dot(const uint8_t * blocks, const uint8_t * comp, uint64_t r, const float * x, uint64_t x_stride,
                     int nc, const uint16_t * lut, float * out) {
    const int      variant = comp[BITCOS_HDR_VARIANT];
    const uint64_t k       = comp_u64(comp, BITCOS_HDR_N_COLS);
    const size_t   bb      = block_bytes(variant);
    const uint64_t nb      = k / QK_BITCOS;
    const uint8_t * row = blocks + r * nb * bb;
    sign_window w;
    w.start(comp, row_sign_pos(comp, r));
    float acc[MAX_COLS] = {};
    for (uint64_t b = 0; b < nb; ++b) {
        const uint8_t * blk = row + b * bb;
        float s[MAX_COLS] = {};
        for (int q = 0; q < QK_BITCOS / 32; ++q) {
            const uint32_t word = (uint32_t)blk[4*q] | (uint32_t)blk[4*q + 1] << 8 |
                                  (uint32_t)blk[4*q + 2] << 16 | (uint32_t)blk[4*q + 3] << 24;
            const uint64_t k0 = b * QK_BITCOS + 32 * q;
            decode_word32(word, w, lut, [&](int j, const uint16_t * code) {
                const float c0 = half_bits_to_float(code[0]), c1 = half_bits_to_float(code[1]);
                const float c2 = half_bits_to_float(code[2]), c3 = half_bits_to_float(code[3]);
                for (int c = 0; c < MAX_COLS; ++c) {
                    if (c < nc) {
                        const float * xg = x + c * x_stride + k0 + 4 * j;
                        s[c] += c0 * xg[0] + c1 * xg[1] + c2 * xg[2] + c3 * xg[3];
                    }
                }
            });
        }
        float d = 1.0f;
        if (variant == BITCOS_VARIANT_G128) {
            d = half_bits_to_float((uint16_t)(blk[offsetof(block_bitcos_g128, d)] |
                                              blk[offsetof(block_bitcos_g128, d) + 1] << 8));
        }
        for (int c = 0; c < MAX_COLS; ++c) {
            acc[c] += variant == BITCOS_VARIANT_G128 ? s[c] * d : s[c];
        }
    }
    const float scale = row_scale(comp, r);
    for (int c = 0; c < MAX_COLS; ++c) {
        if (c < nc) {
            out[c] = acc[c] * scale;
        }
    }
}

// One column: sum_k W[r][k] * x[k].
inline float row_dot(const uint8_t * blocks, const uint8_t * comp, uint64_t r, const float * x,
                     const uint16_t * lut) {
    float out[MAX_COLS];
    rows_dot(blocks, comp, r, x, 0, 1, lut, out);
    return out[0];
}

// Dequantizes global row r into y[0 .. k): y = scale * t, one fp32 multiplication per weight, exactly as
// FORMAT.md §5 defines it (the batched path: dequantized tiles feed the backend's matrix multiply).
inline void dequantize_row(const uint8_t * blocks, const uint8_t * comp, uint64_t r, float * y,
                           const uint16_t * lut) {
    const int      variant = comp[BITCOS_HDR_VARIANT];
    const uint64_t k       = comp_u64(comp, BITCOS_HDR_N_COLS);
    const size_t   bb      = block_bytes(variant);
    const uint64_t nb      = k / QK_BITCOS;
    const uint8_t * row = blocks + r * nb * bb;
    const float pt = row_scale(comp, r);
    sign_window w;
    w.start(comp, row_sign_pos(comp, r));
    for (uint64_t b = 0; b < nb; ++b) {
        const uint8_t * blk = row + b * bb;
        float scale = pt;
        if (variant == BITCOS_VARIANT_G128) {
            scale = half_bits_to_float((uint16_t)(blk[offsetof(block_bitcos_g128, d)] |
                                                  blk[offsetof(block_bitcos_g128, d) + 1] << 8));
        }
        for (int q = 0; q < QK_BITCOS / 32; ++q) {
            const uint32_t word = (uint32_t)blk[4*q] | (uint32_t)blk[4*q + 1] << 8 |
                                  (uint32_t)blk[4*q + 2] << 16 | (uint32_t)blk[4*q + 3] << 24;
            float * yq = y + b * QK_BITCOS + 32 * q;
            decode_word32(word, w, lut, [&](int j, const uint16_t * c) {
                for (int i = 0; i < 4; ++i) {
                    yq[4*j + i] = half_bits_to_float(c[i]) * scale;
                }
            });
        }
    }
}

}  // namespace bitcos_sycl
