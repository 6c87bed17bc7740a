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
//  * Scales as stored. The block-scaled variants (v1 G128, v2 B128 / B256) multiply each 128-weight unit's
//    sum by fp32 of its fp16 scale; PT / MATRIX / ROW multiply the row's sum by the matrix's or row's scale
//    once. Version-2 rows (any K % 32) are walked 32-bit bitmap word by word, so a partial last unit just has
//    fewer words. (The CPU kernels reproduce TQ2_0's integer lanes instead; SYCL has no TQ2_0
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

// Where a weight's bitmap words and scales are, from its companion header (every work-item of a kernel reads
// the same header, so every branch on the variant is uniform; the host glue needs no per-op header read).
// Version 1: rows of 128-weight blocks (G128 18 bytes with the fp16 d after the bitmap, PT 16 bytes), K % 128
// == 0. Version 2 (type 162): a row is its K/8 bitmap bytes, K % 32 == 0, so the last 128-weight unit may be
// partial (32, 64 or 96 weights: only its first (K % 128) / 8 bytes belong to the row); the scales are in the
// companion per matrix (MATRIX, as PT), per row (ROW) or per 128 / 256 weights of a row (B128 / B256, fp16).
struct weight_layout {
    int             variant;
    uint64_t        k;              // weights per row
    uint64_t        n_words;        // 32-weight bitmap words per row (k / 32)
    uint64_t        n_units;        // 128-weight units per row, the last maybe partial
    size_t          unit_bytes;     // bytes from one unit's bitmap to the next
    size_t          row_bytes;
    const uint8_t * scales;         // the companion's scales section (unused by G128)
    uint64_t        rows_per_mat;   // PT / MATRIX
    uint64_t        scales_per_row; // B128 / B256: fp16 scales per row
    unsigned        unit_shift;     // B128 / B256: the scale of unit u is scale u >> unit_shift of the row
};

inline weight_layout read_layout(const uint8_t * comp) {
    weight_layout l;
    l.variant    = comp[BITCOS_HDR_VARIANT];
    l.k          = comp_u64(comp, BITCOS_HDR_N_COLS);
    l.n_words    = l.k / QK_BITCOS_BITMAP;
    l.n_units    = (l.k + QK_BITCOS - 1) / QK_BITCOS;
    l.unit_bytes = bitcos_block_bytes(l.variant);
    l.row_bytes  = (size_t) bitcos_weight_row_bytes(l.variant, l.k);
    l.scales     = comp + comp_u64(comp, BITCOS_HDR_SCALES_OFFSET);
    const uint64_t n_mats = comp_u64(comp, BITCOS_HDR_N_MATS);
    l.rows_per_mat = comp_u64(comp, BITCOS_HDR_N_ROWS) / (n_mats ? n_mats : 1);
    const int64_t sb = bitcos_variant_scale_block(l.variant);
    l.scales_per_row = sb ? l.k / (uint64_t) sb : 0;
    l.unit_shift     = sb > QK_BITCOS ? 1u : 0u;      // B256: two 128-weight units per scale
    return l;
}

// Bitmap word q (weights 32q .. 32q + 31) of 128-weight unit u of a row (byte reads: v1 G128 units are 18
// bytes, so words are only 2-byte aligned there).
inline uint32_t bitmap_word(const weight_layout & l, const uint8_t * row, uint64_t u, int q) {
    const uint8_t * p = row + u * l.unit_bytes + 4 * q;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// 32-bit bitmap words of unit u (4, fewer in a partial last unit).
inline int unit_words(const weight_layout & l, uint64_t u) {
    const uint64_t left = l.n_words - 4 * u;
    return left < 4 ? (int) left : 4;
}

inline float half_bits_to_float(uint16_t h) {
    return (float)sycl::bit_cast<sycl::half>(h);
}

// true for the variants with an fp16 scale per 128 / 256 weights (G128, B128, B256), whose sums are scaled per
// unit; the others (PT, MATRIX, ROW) scale a whole row once (row_scale).
inline bool block_scaled(const weight_layout & l) {
    return bitcos_variant_scale_block(l.variant) != 0;
}

// The fp16 scale of unit u of global row r (block-scaled variants only): G128 in the block, B128 / B256 in the
// companion's f16[R][K / block] section.
inline float unit_scale(const weight_layout & l, const uint8_t * row, uint64_t r, uint64_t u) {
    const uint8_t * p = l.variant == BITCOS_VARIANT_G128
        ? row + u * l.unit_bytes + offsetof(block_bitcos_g128, d)
        : l.scales + 2 * (r * l.scales_per_row + (u >> l.unit_shift));
    return half_bits_to_float((uint16_t)(p[0] | p[1] << 8));
}

// The scale of a whole global row r: PT / MATRIX its matrix's, ROW its own; 1 for the block-scaled variants.
inline float row_scale(const weight_layout & l, uint64_t r) {
    return bitcos_variant_scale_block(l.variant) != 0 ? 1.0f
         : reinterpret_cast<const float *>(l.scales)[bitcos_row_scale_index(l.variant, r, l.rows_per_mat)];
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

// Columns one decode of a row serves (the batched path: a decoded 4-weight group meets up to this many
// activation columns before the next group is decoded).
constexpr int MAX_COLS = 8;

// out[c] = sum_k W[r][k] * x[c * x_stride + k] for c < nc (1 <= nc <= MAX_COLS), global row r of a BITCOS
// tensor (blocks: the weight data, comp: its companion), k = n_cols weights, x: fp32 activations. fp32
// accumulation: per 128-weight unit a partial sum per column, scaled by the unit's fp16 scale (G128, B128,
// B256), then by the row's scale (PT, MATRIX, ROW). The row is decoded once for all nc columns.
inline void rows_dot(const uint8_t * blocks, const uint8_t * comp, uint64_t r, const float * x, uint64_t x_stride,
                     int nc, const uint16_t * lut, float * out) {
    const weight_layout l = read_layout(comp);
    const bool per_unit = block_scaled(l);
    const uint8_t * row = blocks + r * l.row_bytes;
    sign_window w;
    w.start(comp, row_sign_pos(comp, r));
    float acc[MAX_COLS] = {};
    for (uint64_t u = 0; u < l.n_units; ++u) {
        float s[MAX_COLS] = {};
        const int nq = unit_words(l, u);
        for (int q = 0; q < nq; ++q) {
            const uint64_t k0 = u * QK_BITCOS + 32 * q;
            decode_word32(bitmap_word(l, row, u, q), w, lut, [&](int j, const uint16_t * code) {
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
        const float d = per_unit ? unit_scale(l, row, r, u) : 1.0f;
        for (int c = 0; c < MAX_COLS; ++c) {
            acc[c] += per_unit ? s[c] * d : s[c];
        }
    }
    const float scale = row_scale(l, r);
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
    const weight_layout l = read_layout(comp);
    const bool per_unit = block_scaled(l);
    const uint8_t * row = blocks + r * l.row_bytes;
    const float rs = row_scale(l, r);
    sign_window w;
    w.start(comp, row_sign_pos(comp, r));
    for (uint64_t u = 0; u < l.n_units; ++u) {
        const float scale = per_unit ? unit_scale(l, row, r, u) : rs;
        const int nq = unit_words(l, u);
        for (int q = 0; q < nq; ++q) {
            float * yq = y + u * QK_BITCOS + 32 * q;
            decode_word32(bitmap_word(l, row, u, q), w, lut, [&](int j, const uint16_t * c) {
                for (int i = 0; i < 4; ++i) {
                    yq[4*j + i] = half_bits_to_float(c[i]) * scale;
                }
            });
        }
    }
}

}  // namespace bitcos_sycl
