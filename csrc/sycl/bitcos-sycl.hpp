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
//  * Two contractions of the decoded codes. The tiled path (rows_dot_tiled / tiled_rows, below: what ggml-sycl
//    runs where xmx_tiles_supported: XMX with fp16 8 x 16 x 16) is the paper's: each lane stores its group's
//    two table dwords into a VNNI2 tile of W^T in local memory (they are already VNNI2 pairs), codes times
//    the fp16 group scale, and after four groups (16 reduction rows) one fp16 contraction with up to 8
//    activation columns (converted to fp16 once per 128 weights), fp32 accumulation: joint_matrix_mad, one
//    dpas.8x1, or sub_group_contraction, a sub-group loop that reads the same tile the same way (what the tests
//    run on a device without a matrix unit; ggml-sycl takes the row path there). The row path (rows_dot: every other
//    device) multiplies the codes with fp32 activations on the ALU, exact up to fp32 accumulation.
//  * Scales as stored. The block-scaled variants (v1 G128, v2 B128 / B256) scale per 128-weight unit (fp16;
//    B256 one scale per two units); PT / MATRIX / ROW multiply the row's sum by the matrix's or row's fp32
//    scale once. Version-2 rows (any K % 32) are walked 32-bit bitmap word by word, so a partial last unit
//    just has fewer words (and a word fills exactly two 16-row tiles). (The CPU kernels reproduce TQ2_0's
//    integer lanes instead; SYCL has no TQ2_0 to agree with, so these kernels accumulate in fp32 and are
//    compared against the exact reference: the row path within fp32 rounding, the tiled path within fp16's
//    rounding of the activations plus that — "Numerics" below.)
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
constexpr uint16_t HALF_PLUS  = 0x3C00; // +1
constexpr uint16_t HALF_MINUS = 0xBC00; // -1

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
template <int D> inline const uint16_t * lut_fill(uint16_t * lut, const sycl::nd_item<D> & it) {
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
inline uint64_t comp_u64(const uint8_t * c, size_t off) {
    return *reinterpret_cast<const uint64_t *>(c + off);
}
inline uint32_t comp_u32(const uint8_t * c, size_t off) {
    return *reinterpret_cast<const uint32_t *>(c + off);
}
inline uint16_t comp_u16(const uint8_t * c, size_t off) {
    return *reinterpret_cast<const uint16_t *>(c + off);
}

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
    l.variant             = comp[BITCOS_HDR_VARIANT];
    l.k                   = comp_u64(comp, BITCOS_HDR_N_COLS);
    l.n_words             = l.k / QK_BITCOS_BITMAP;
    l.n_units             = (l.k + QK_BITCOS - 1) / QK_BITCOS;
    l.unit_bytes          = bitcos_block_bytes(l.variant);
    l.row_bytes           = (size_t) bitcos_weight_row_bytes(l.variant, l.k);
    l.scales              = comp + comp_u64(comp, BITCOS_HDR_SCALES_OFFSET);
    const uint64_t n_mats = comp_u64(comp, BITCOS_HDR_N_MATS);
    l.rows_per_mat        = comp_u64(comp, BITCOS_HDR_N_ROWS) / (n_mats ? n_mats : 1);
    const int64_t sb      = bitcos_variant_scale_block(l.variant);
    l.scales_per_row      = sb ? l.k / (uint64_t) sb : 0;
    l.unit_shift          = sb > QK_BITCOS ? 1u : 0u; // B256: two 128-weight units per scale
    return l;
}

// Bitmap word q (weights 32q .. 32q + 31) of 128-weight unit u of a row (byte reads: v1 G128 units are 18
// bytes, so words are only 2-byte aligned there).
inline uint32_t bitmap_word(const weight_layout & l, const uint8_t * row, uint64_t u, int q) {
    const uint8_t * p = row + u * l.unit_bytes + 4 * q;
    return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

// 32-bit bitmap words of unit u (4, fewer in a partial last unit).
inline int unit_words(const weight_layout & l, uint64_t u) {
    const uint64_t left = l.n_words - 4 * u;
    return left < 4 ? (int) left : 4;
}

inline float half_bits_to_float(uint16_t h) {
    return (float) sycl::bit_cast<sycl::half>(h);
}

// true for the variants with an fp16 scale per 128 / 256 weights (G128, B128, B256), whose sums are scaled per
// unit; the others (PT, MATRIX, ROW) scale a whole row once (row_scale).
inline bool block_scaled(const weight_layout & l) {
    return bitcos_variant_scale_block(l.variant) != 0;
}

// The fp16 scale of unit u of global row r (block-scaled variants only): G128 in the block, B128 / B256 in the
// companion's f16[R][K / block] section.
inline float unit_scale(const weight_layout & l, const uint8_t * row, uint64_t r, uint64_t u) {
    const uint8_t * p = l.variant == BITCOS_VARIANT_G128 ? row + u * l.unit_bytes + offsetof(block_bitcos_g128, d) :
                                                           l.scales + 2 * (r * l.scales_per_row + (u >> l.unit_shift));
    return half_bits_to_float((uint16_t) (p[0] | p[1] << 8));
}

// The scale of a whole global row r: PT / MATRIX its matrix's, ROW its own; 1 for the block-scaled variants.
inline float row_scale(const weight_layout & l, uint64_t r) {
    return bitcos_variant_scale_block(l.variant) != 0 ?
               1.0f :
               reinterpret_cast<const float *>(l.scales)[bitcos_row_scale_index(l.variant, r, l.rows_per_mat)];
}

// A row's compacted sign stream as a 64-bit window with `n` valid bits, refilled from 32-bit pool words.
struct sign_window {
    const uint32_t * pool; // the pool as aligned 32-bit words (its section is 64-byte aligned)
    uint64_t         next; // index of the next pool word to load
    uint64_t         bits; // the window: bit 0 = next unconsumed sign
    unsigned         n;    // valid bits in `bits`

    inline void start(const uint8_t * comp, uint64_t pos) {
        pool = reinterpret_cast<const uint32_t *>(comp + comp_u64(comp, BITCOS_HDR_POOL_OFFSET));
        next = (pos >> 5) + 1;
        bits = pool[pos >> 5] >> (pos & 31);
        n    = 32 - (unsigned) (pos & 31);
    }
    // before a 32-weight bitmap word: at least 32 valid bits
    inline void refill() {
        if (n < 32) {
            bits |= (uint64_t) pool[next++] << n;
            n += 32;
        }
    }
    inline int  peek4() const { return (int) (bits & 15); }
    inline void consume(unsigned c) {
        bits >>= c;
        n -= c;
    }
};

// Calls f(group index j in 0..7, the group's 4 fp16 codes as uint16 bit patterns) for the 8 four-weight
// groups of one 32-bit bitmap word, after topping the window up.
template <typename F> inline void decode_word32(uint32_t word, sign_window & w, const uint16_t * lut, F && f) {
    w.refill();
    for (int j = 0; j < 8; ++j) {
        const int m   = (int) ((word >> (4 * j)) & 15u);
        const int key = m | (w.peek4() << 4);
        f(j, lut + key * LUT_CODES);
        w.consume((unsigned) sycl::popcount(m));
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
    const weight_layout l        = read_layout(comp);
    const bool          per_unit = block_scaled(l);
    const uint8_t *     row      = blocks + r * l.row_bytes;
    sign_window         w;
    w.start(comp, row_sign_pos(comp, r));
    float acc[MAX_COLS] = {};
    for (uint64_t u = 0; u < l.n_units; ++u) {
        float     s[MAX_COLS] = {};
        const int nq          = unit_words(l, u);
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
inline float row_dot(const uint8_t * blocks, const uint8_t * comp, uint64_t r, const float * x, const uint16_t * lut) {
    float out[MAX_COLS];
    rows_dot(blocks, comp, r, x, 0, 1, lut, out);
    return out[0];
}

// Dequantizes global row r into y[0 .. k): y = scale * t, one fp32 multiplication per weight, exactly as
// FORMAT.md §5 defines it (the batched path: dequantized tiles feed the backend's matrix multiply).
inline void dequantize_row(const uint8_t * blocks, const uint8_t * comp, uint64_t r, float * y, const uint16_t * lut) {
    const weight_layout l        = read_layout(comp);
    const bool          per_unit = block_scaled(l);
    const uint8_t *     row      = blocks + r * l.row_bytes;
    const float         rs       = row_scale(l, r);
    sign_window         w;
    w.start(comp, row_sign_pos(comp, r));
    for (uint64_t u = 0; u < l.n_units; ++u) {
        const float scale = per_unit ? unit_scale(l, row, r, u) : rs;
        const int   nq    = unit_words(l, u);
        for (int q = 0; q < nq; ++q) {
            float * yq = y + u * QK_BITCOS + 32 * q;
            decode_word32(bitmap_word(l, row, u, q), w, lut, [&](int j, const uint16_t * c) {
                for (int i = 0; i < 4; ++i) {
                    yq[4 * j + i] = half_bits_to_float(c[i]) * scale;
                }
            });
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// The tiled path: the paper's contraction (Fig. 6 / 8). A sub-group of 16 lanes decodes a 16-weight x 16-row
// tile of W^T into local memory in VNNI2 order and contracts it with up to 8 activation columns in fp16, fp32
// accumulation: one dpas.8x1 per tile on Xe2 through joint_matrix (xmx_contraction), a portable sub-group loop
// reading the same tile with the same layout elsewhere (sub_group_contraction: what the tests run on the CPU).
//
//  * Tile layout (VNNI2): the B operand of a K = 16 x N = 16 fp16 contraction, element [k][n] (reduction row k,
//    W row n = lane n) at half (k / 2) * 32 + 2 n + k % 2, i.e. dword (k / 2) * 16 + n holds rows k, k + 1 of
//    column n. A table entry (the four codes of rows 4g .. 4g + 3, code 0 in the low half) read as two dwords
//    is exactly the VNNI2 pairs (4g, 4g + 1) and (4g + 2, 4g + 3): the lane stores them as they come, at
//    dwords 2g * 16 + n and (2g + 1) * 16 + n, one register row apart, with no shuffle. A 32-weight bitmap
//    word is eight groups: two K = 16 tiles, contracted one after the other.
//  * Scales: the block-scaled variants (G128, B128, B256) multiply each code by the unit's fp16 scale in fp16
//    before the contraction (as the paper's `mul r54, scale, r74`); the product of +-1 / 0 and an fp16 value
//    is that value, so the tile holds W exactly. PT / MATRIX / ROW keep the codes and multiply the fp32
//    accumulator by the row's fp32 scale once at the end.
//  * Activations: converted fp32 -> fp16 once per 128-weight chunk into local memory by the whole work-group
//    (its sub-groups are different rows of the same columns), columns past the last and weights past K as
//    zeros: the A operand, TILE_M x 16 row-major.
//  * Numerics: the fp16 x fp16 products are exact in fp32 and are summed in fp32, so the result is the fp32
//    sum of W x~ with x~ = fp16(x): |y - W x~| <= fp32 accumulation error (about K 2^-24 sum |W x~| at worst),
//    and against the exact product |y - W x| <= sum |w| (|x| 2^-11 + 2^-25) + that (2^-11: fp16's rounding of
//    a normal activation, 2^-25 its absolute error below 2^-14). |x| > 65504 becomes inf: the path assumes
//    activations in fp16 range, as ggml-sycl's own fp16 matrix paths do. The fp32 rows_dot above is the exact
//    alternative.

constexpr int TILE_N      = 16;                        // W rows per sub-group: lanes, the DPAS N
constexpr int TILE_K      = 16;                        // reduction rows per contraction (fp16 DPAS K)
constexpr int TILE_M      = MAX_COLS;                  // activation columns per contraction (DPAS M, 8)
constexpr int TILE_DWORDS = TILE_K * TILE_N / 2;       // one VNNI2 tile: 128 dwords = 256 halves
constexpr int WORD_TILES  = QK_BITCOS_BITMAP / TILE_K; // tiles per 32-weight bitmap word (2)
constexpr int X_CHUNK     = QK_BITCOS;                 // activations per column converted to fp16 per step

// The half index of element [k][n] of a VNNI2-packed K x 16 tile.
inline int vnni2_index(int k, int n) {
    return (k >> 1) * (2 * TILE_N) + 2 * n + (k & 1);
}

// The code table as dword pairs (the same 2 KB as lut_fill's: entry e is dwords 2e, 2e + 1, codes 0 and 2 in
// the low halves), filled by the whole work-group, which then waits. Returns lut.
template <int D> inline const uint32_t * lut_fill_pairs(uint32_t * lut, const sycl::nd_item<D> & it) {
    const int lid = (int) it.get_local_linear_id(), nl = (int) it.get_local_range().size();
    for (int e = lid; e < LUT_ENTRIES; e += nl) {
        lut[2 * e]     = lut_code(e, 0) | (uint32_t) lut_code(e, 1) << 16;
        lut[2 * e + 1] = lut_code(e, 2) | (uint32_t) lut_code(e, 3) << 16;
    }
    sycl::group_barrier(it.get_group());
    return lut;
}

// Both halves of a VNNI2 dword times an fp16 scale, in fp16 (exact for the codes +-1 / 0).
inline uint32_t scale_pair(uint32_t pair, sycl::half scale) {
    const sycl::half lo = sycl::bit_cast<sycl::half>((uint16_t) pair) * scale;
    const sycl::half hi = sycl::bit_cast<sycl::half>((uint16_t) (pair >> 16)) * scale;
    return sycl::bit_cast<uint16_t>(lo) | (uint32_t) sycl::bit_cast<uint16_t>(hi) << 16;
}

// Lane n's column of the WORD_TILES tiles of one 32-weight bitmap word (tiles: the sub-group's, dwords),
// codes multiplied by `scale` when per_unit.
inline void decode_word_to_tiles(uint32_t word, sign_window & w, const uint32_t * lut, bool per_unit, sycl::half scale,
                                 uint32_t * tiles, int n) {
    w.refill();
    for (int j = 0; j < 8; ++j) {
        const int m   = (int) ((word >> (4 * j)) & 15u);
        const int key = m | (w.peek4() << 4);
        uint32_t  lo = lut[2 * key], hi = lut[2 * key + 1];
        if (per_unit) {
            lo = scale_pair(lo, scale);
            hi = scale_pair(hi, scale);
        }
        // group j: reduction rows 4 (j % 4) .. + 3 of tile j / 4, i.e. its VNNI2 dword rows 2 (j % 4), + 1
        uint32_t * col = tiles + (j >> 2) * TILE_DWORDS + 2 * (j & 3) * TILE_N + n;
        col[0]         = lo;
        col[TILE_N]    = hi;
        w.consume((unsigned) sycl::popcount(m));
    }
}

// The contraction acc[m][n] += sum_k a[m * lda + k] * tile[vnni2_index(k, n)] over one K = 16 tile, without
// matrix hardware: lane n keeps column n of the TILE_M x 16 accumulator and reads the packed tile exactly as
// the matrix unit does (dword (k / 2) * 16 + n, half k % 2). fp32 products of fp16 values (exact), fp32 sums.
struct sub_group_contraction {
    float acc[TILE_M];

    inline void zero(const sycl::sub_group &) {
        for (int m = 0; m < TILE_M; ++m) {
            acc[m] = 0.0f;
        }
    }
    inline void mad(const sycl::sub_group & sg, const sycl::half * a, int lda, const uint32_t * tile) {
        const int n = (int) sg.get_local_linear_id();
        for (int k = 0; k < TILE_K; ++k) {
            const uint32_t pair = tile[(k >> 1) * TILE_N + n];
            const float    b    = (float) sycl::bit_cast<sycl::half>((uint16_t) (pair >> (16 * (k & 1))));
            for (int m = 0; m < TILE_M; ++m) {
                acc[m] += (float) a[m * lda + k] * b;
            }
        }
    }
    // out: TILE_M x 16 row-major (the sub-group's local memory)
    inline void store(const sycl::sub_group & sg, float * out) const {
        const int n = (int) sg.get_local_linear_id();
        for (int m = 0; m < TILE_M; ++m) {
            out[m * TILE_N + n] = acc[m];
        }
    }
};

#ifndef BITCOS_SYCL_XMX
#    ifdef SYCL_EXT_ONEAPI_MATRIX
#        define BITCOS_SYCL_XMX 1
#    else
#        define BITCOS_SYCL_XMX 0
#    endif
#endif

#if BITCOS_SYCL_XMX
// Whether xmx_contraction runs on `dev` (host code): the matrix aspect and an fp16 x fp16 -> fp32 combination
// with N = 16, K = 16 and M = 8 (Xe2 and Xe-HPC; Xe-HPG, Arc A-series, has XMX but N = 8 with 8-lane
// sub-groups, so it takes the row kernel). A combination lists either fixed sizes or, with msize 0, a range.
inline bool xmx_tiles_supported(const sycl::device & dev) {
    namespace mx = sycl::ext::oneapi::experimental::matrix;
    if (!dev.has(sycl::aspect::ext_intel_matrix)) {
        return false;
    }
    for (const mx::combination & c :
         dev.get_info<sycl::ext::oneapi::experimental::info::device::matrix_combinations>()) {
        const bool types = c.atype == mx::matrix_type::fp16 && c.btype == mx::matrix_type::fp16 &&
                           c.ctype == mx::matrix_type::fp32 && c.dtype == mx::matrix_type::fp32;
        const bool sizes =
            c.nsize == TILE_N && c.ksize == TILE_K && (c.msize == TILE_M || (c.msize == 0 && c.max_msize >= TILE_M));
        if (types && sizes) {
            return true;
        }
    }
    return false;
}

// The same contraction on the matrix unit (Xe2's XMX: joint_matrix_mad is one dpas.8x1 for fp16 8 x 16 x 16).
// Only for devices that xmx_tiles_supported accepts: the runtime does not even build it without the aspect.
struct xmx_contraction {
    sycl::ext::oneapi::experimental::matrix::joint_matrix<
        sycl::sub_group, float, sycl::ext::oneapi::experimental::matrix::use::accumulator, TILE_M, TILE_N>
        acc;

    template <typename T> static auto local_ptr(T * p) {
        return sycl::address_space_cast<sycl::access::address_space::local_space, sycl::access::decorated::no>(p);
    }
    inline void zero(const sycl::sub_group & sg) {
        sycl::ext::oneapi::experimental::matrix::joint_matrix_fill(sg, acc, 0.0f);
    }
    inline void mad(const sycl::sub_group & sg, const sycl::half * a, int lda, const uint32_t * tile) {
        namespace mx = sycl::ext::oneapi::experimental::matrix;
        mx::joint_matrix<sycl::sub_group, sycl::half, mx::use::a, TILE_M, TILE_K, mx::layout::row_major>        ma;
        mx::joint_matrix<sycl::sub_group, sycl::half, mx::use::b, TILE_K, TILE_N, mx::layout::ext_intel_packed> mb;
        mx::joint_matrix_load(sg, ma, local_ptr(a), (size_t) lda);
        // the tile's dwords as the halves the matrix unit reads (stride: 2 x 16 halves per VNNI2 row)
        mx::joint_matrix_load(sg, mb, local_ptr(reinterpret_cast<const sycl::half *>(tile)), (size_t) (2 * TILE_N));
        mx::joint_matrix_mad(sg, acc, ma, mb, acc);
    }
    inline void store(const sycl::sub_group & sg, float * out) const {
        namespace mx = sycl::ext::oneapi::experimental::matrix;
        mx::joint_matrix_store(sg, acc, local_ptr(out), (size_t) TILE_N, mx::layout::row_major);
    }
};
#endif

// The work-group's local memory of the tiled path.
struct tile_slm {
    const uint32_t * lut;   // lut_fill_pairs' table (filled before the first call)
    sycl::half *     x;     // TILE_M x X_CHUNK activations in fp16, shared by the work-group
    uint32_t *       tiles; // this sub-group's WORD_TILES x TILE_DWORDS tile
    float *          out;   // this sub-group's TILE_M x TILE_N results
};

// Lane n of the sub-group: out[c] = sum_k W[row0 + n][k] * x[c * x_stride + k] for c < nc (1 <= nc <= TILE_M),
// for the lanes with n < n_valid (the others decode zeros and return nothing). Every work-item of the
// work-group calls it with the same x, x_stride and nc (it converts the activations together and waits at
// work-group barriers); each sub-group its own row0, n_valid and tile / out areas.
template <class Contraction, int D>
inline void rows_dot_tiled(const sycl::nd_item<D> & it, const uint8_t * blocks, const uint8_t * comp, uint64_t row0,
                           int n_valid, const float * x, uint64_t x_stride, int nc, const tile_slm & slm, float * out) {
    const sycl::sub_group sg    = it.get_sub_group();
    const int             n     = (int) sg.get_local_linear_id();
    const bool            valid = n < n_valid;
    const int             lid = (int) it.get_local_linear_id(), nl = (int) it.get_local_range().size();
    const weight_layout   l        = read_layout(comp);
    const bool            per_unit = block_scaled(l);
    const uint64_t        r        = row0 + (uint64_t) n;
    const uint8_t *       row      = blocks + r * l.row_bytes;
    sign_window           w;
    if (valid) {
        w.start(comp, row_sign_pos(comp, r));
    }
    Contraction acc;
    acc.zero(sg);
    for (uint64_t u = 0; u < l.n_units; ++u) { // chunk u: weights 128u .. 128u + 127
        sycl::group_barrier(it.get_group());   // the previous chunk's readers are done
        const uint64_t k0 = u * X_CHUNK;
        for (int i = lid; i < TILE_M * X_CHUNK; i += nl) {
            const int      m = i / X_CHUNK;
            const uint64_t k = k0 + (uint64_t) (i % X_CHUNK);
            slm.x[i]         = (sycl::half)(m < nc && k < l.k ? x[m * x_stride + k] : 0.0f);
        }
        sycl::group_barrier(it.get_group());
        const sycl::half scale = per_unit && valid ? (sycl::half) unit_scale(l, row, r, u) : (sycl::half) 1.0f;
        const int        nq    = unit_words(l, u); // uniform: every row has the same K
        for (int q = 0; q < nq; ++q) {
            if (valid) {
                decode_word_to_tiles(bitmap_word(l, row, u, q), w, slm.lut, per_unit, scale, slm.tiles, n);
            } else {
                for (int i = 0; i < WORD_TILES * TILE_DWORDS; i += TILE_N) {
                    slm.tiles[i + n] = 0; // a row past the end contributes zeros
                }
            }
            sycl::group_barrier(sg); // the tile is complete
            for (int t = 0; t < WORD_TILES; ++t) {
                acc.mad(sg, slm.x + 32 * q + TILE_K * t, X_CHUNK, slm.tiles + t * TILE_DWORDS);
            }
            sycl::group_barrier(sg); // and read before the next word overwrites it
        }
    }
    acc.store(sg, slm.out);
    sycl::group_barrier(sg);
    if (valid) {
        const float scale = row_scale(l, r);
        for (int c = 0; c < TILE_M; ++c) {
            if (c < nc) {
                out[c] = slm.out[c * TILE_N + n] * scale;
            }
        }
    }
}

// What one work-group of the tiled kernel computes: for W's rows w_row0 + i (i < the tensor's rows), results
// column j < nc to d[j * d_stride + i] from activations x[j * x_stride + k]; skip: nothing (MUL_MAT_ID's
// out-of-range expert id). ggml-sycl's glue and the tests describe their launches' work-groups with it.
struct tile_job {
    int64_t       w_row0;
    const float * x;
    int64_t       x_stride;
    int           nc;
    float *       d;
    int64_t       d_stride;
    bool          skip;
};

// The work-group's local memory of the tiled kernel, for all its sub-groups.
struct tile_group_slm {
    uint32_t *   lut;   // LUT_ENTRIES * 2 dwords
    sycl::half * x;     // TILE_M * X_CHUNK
    uint32_t *   tiles; // sub-groups * WORD_TILES * TILE_DWORDS
    float *      outs;  // sub-groups * TILE_M * TILE_N
};

// The tiled kernel's body for work-group row block `row_block` (rows row_block * local size .. + local size,
// 16 per sub-group) of job jb; rows: the rows of jb's matrix. The work-group must be whole 16-lane sub-groups
// (kernel property sub_group_size<16>); all its work-items call it.
template <class Contraction, int D>
inline void tiled_rows(const sycl::nd_item<D> & it, const tile_group_slm & g, const uint8_t * w, const uint8_t * c,
                       int64_t rows, int64_t row_block, const tile_job & jb) {
    const uint32_t * lut = lut_fill_pairs(g.lut, it);
    if (jb.skip) {
        return; // uniform: the whole work-group serves one job
    }
    const sycl::sub_group sg = it.get_sub_group();
    const int             s  = (int) sg.get_group_linear_id();
    const tile_slm        slm{ lut, g.x, g.tiles + s * WORD_TILES * TILE_DWORDS, g.outs + s * TILE_M * TILE_N };
    const int64_t         first   = row_block * (int64_t) it.get_local_range().size() + (int64_t) s * TILE_N;
    const int             n_valid = first >= rows ? 0 : (int) (rows - first < TILE_N ? rows - first : TILE_N);
    float                 out[TILE_M];
    rows_dot_tiled<Contraction>(it, w, c, (uint64_t) (jb.w_row0 + first), n_valid, jb.x, (uint64_t) jb.x_stride, jb.nc,
                                slm, out);
    const int64_t r = first + (int64_t) sg.get_local_linear_id();
    if (r < rows) {
        for (int j = 0; j < TILE_M; ++j) {
            if (j < jb.nc) {
                jb.d[j * jb.d_stride + r] = out[j];
            }
        }
    }
}

} // namespace bitcos_sycl
