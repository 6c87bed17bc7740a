// BITCOS decode for CUDA: device code shared by ggml-cuda's glue (ggml-bitcos-cuda.cu) and the standalone
// test program (tests/cuda/test-bitcos-cuda.cu). No ggml dependency; format offsets from bitcos-format.h.
//
// Design (why):
//  * A warp segment per row (the mat-vec: 8 lanes, 4 rows a warp, so that short rows leave no lanes idle; the
//    batched path: 4 lanes). The weight blocks are row-major, so a segment reads consecutive bitmap words of
//    one row (coalesced for PT and version 2; G128's 18-byte blocks are read as 16-bit halves). A version-2
//    row (any K % 32) is K/32 such words, so a partial last 128-weight unit needs no special case.
//  * Sign offsets by a segmented prefix sum. Each lane's first sign is the row cursor plus the exclusive
//    prefix sum of the popcounts of the segment's lanes before it (__shfl_up), so no lane walks another's
//    bits; the cursor advances by the segment's total (__shfl).
//  * pdep by table, as on Xe2 (bitcos-paper §II-D): a 4-weight group's codes are a function of its presence
//    nibble and 4 sign bits; a table in shared memory returns the 4 codes as packed int8 (one 32-bit load).
//  * Mat-vec (decode, up to 8 columns): int8 activations per 32 and dp4a, two words per lane, two per-lane
//    tables (leading / trailing sign windows at byte boundaries) so that the decode costs about one
//    instruction per weight; see "Mat-vec" below and docs/GPU.md §3 for the counts
//    (dev/cuda_sass_count.py). Batched (more columns): a tile decoded once into shared memory for 64
//    columns on tensor cores (bitcos-cuda-mmq.cuh), with the small 256-entry table.
//  * Each 32-weight block's exact int32 dot is scaled by its fp16 weight scale (G128, B128, B256) and its
//    activation scale; the row's sum by its matrix's or row's scale (PT, MATRIX, ROW) at the end.
// Instruction count, not bandwidth, limits such a decode on big GPUs (../shared BRIEF §5: a tuned table
// decode ran at ~2.7 instructions per weight against ~1.4 affordable on an H200 at 1.6 bits per weight).
#pragma once

#include "bitcos-format.h"

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#define BITCOS_CUDA_LUT_ENTRIES 256
#define BITCOS_CUDA_MAX_COLS    8
#define BITCOS_CUDA_WARP        32

// The batched path's table (256 entries, one copy: the tile decode is not its kernel's bottleneck). Entry `key`
// (presence nibble m | next 4 sign bits s << 4): code i of the group = 0 when weight i is absent,
// else -1 / +1 by bit rank_i(m) of s (1 = negative); packed as 4 int8 in a uint32, weight i in byte i.
__device__ __forceinline__ uint32_t bitcos_cuda_lut_entry(int key) {
    const int m = key & 15, s = key >> 4;
    uint32_t  e = 0;
    for (int i = 0; i < 4; ++i) {
        if ((m >> i) & 1) {
            const int     rank = __popc(m & ((1 << i) - 1));
            const uint8_t c    = ((s >> rank) & 1) ? (uint8_t) 0xFF : (uint8_t) 0x01;
            e |= (uint32_t) c << (8 * i);
        }
    }
    return e;
}

// Fills the block's table and waits for the whole block: every kernel's prologue (all threads must call it).
__device__ __forceinline__ void bitcos_cuda_lut_fill(uint32_t * lut) {
    for (int e = threadIdx.x + threadIdx.y * blockDim.x; e < BITCOS_CUDA_LUT_ENTRIES; e += blockDim.x * blockDim.y) {
        lut[e] = bitcos_cuda_lut_entry(e);
    }
    __syncthreads();
}

__device__ __forceinline__ uint64_t bitcos_cuda_u64(const uint8_t * c, uint64_t off) {
    return *reinterpret_cast<const uint64_t *>(c + off);
}

// Pool bit of the first sign of global row r (FORMAT.md §4.3).
__device__ __forceinline__ uint64_t bitcos_cuda_row_sign_pos(const uint8_t * comp, uint64_t r) {
    const unsigned g    = comp[BITCOS_HDR_ROW_GROUP_LOG2];
    const uint64_t base = bitcos_cuda_u64(comp, bitcos_cuda_u64(comp, BITCOS_HDR_ROW_BASE_OFFSET) + 8 * (r >> g));
    const uint16_t delta =
        *reinterpret_cast<const uint16_t *>(comp + bitcos_cuda_u64(comp, BITCOS_HDR_ROW_DELTA_OFFSET) + 2 * r);
    return base + delta;
}

// Where a weight's bitmap words and scales are, from its companion header (uniform: every thread reads the
// same header; the host glue reads no device memory per op). Version 1: rows of 128-weight blocks (G128 18
// bytes with d after the bitmap, PT 16), K % 128 == 0. Version 2 (type 162): a row is its K/8 bitmap bytes, any
// K % 32 == 0, so a row is simply K/32 bitmap words (a partial last 128-weight unit has fewer of them); scales
// in the companion per matrix (MATRIX, as PT), per row (ROW), or fp16 per 128 / 256 weights of a row (B128 /
// B256).
struct bitcos_cuda_layout {
    int             variant;
    uint64_t        k;              // weights per row
    uint64_t        n_words;        // 32-weight bitmap words per row
    uint64_t        row_bytes;
    const uint8_t * scales;         // the companion's scales section (unused by G128)
    uint64_t        rows_per_mat;   // PT / MATRIX
    uint64_t        scales_per_row; // B128 / B256
    unsigned        word_shift;     // B128 / B256: word w of a row has scale w >> word_shift of the row
};

__device__ __forceinline__ bitcos_cuda_layout bitcos_cuda_read_layout(const uint8_t * comp) {
    bitcos_cuda_layout l;
    l.variant             = comp[BITCOS_HDR_VARIANT];
    l.k                   = bitcos_cuda_u64(comp, BITCOS_HDR_N_COLS);
    l.n_words             = l.k / QK_BITCOS_BITMAP;
    l.row_bytes           = bitcos_weight_row_bytes(l.variant, l.k);
    l.scales              = comp + bitcos_cuda_u64(comp, BITCOS_HDR_SCALES_OFFSET);
    const uint64_t n_mats = bitcos_cuda_u64(comp, BITCOS_HDR_N_MATS);
    l.rows_per_mat        = bitcos_cuda_u64(comp, BITCOS_HDR_N_ROWS) / (n_mats ? n_mats : 1);
    const uint64_t sb     = (uint64_t) bitcos_variant_scale_block(l.variant);
    l.scales_per_row      = sb ? l.k / sb : 0;
    l.word_shift          = sb == QK_BITCOS_B256 ? 3u : 2u; // words per scale: 4 (128 weights), 8 (256)
    return l;
}

// The scale of a whole global row r: PT / MATRIX its matrix's, ROW its own; 1 for the block-scaled variants.
// The matrix index r / rows_per_mat in 32 bits where both fit (an inline sequence; a 64-bit division is a
// call of ~70 instructions, per row in the mat-vec).
__device__ __forceinline__ float bitcos_cuda_row_scale(const bitcos_cuda_layout & l, uint64_t r) {
    if (bitcos_variant_scale_block(l.variant) != 0) {
        return 1.0f;
    }
    const uint64_t i = l.variant == BITCOS_VARIANT_ROW   ? r :
                       ((r | l.rows_per_mat) >> 32) == 0 ? (uint64_t) ((uint32_t) r / (uint32_t) l.rows_per_mat) :
                                                           bitcos_row_scale_index(l.variant, r, l.rows_per_mat);
    return reinterpret_cast<const float *>(l.scales)[i];
}

// 32 sign bits from pool bit pos (two aligned 32-bit pool words, funnel-shifted; the pool's zero tail, FORMAT.md
// §4.4, covers the second word of the last signs).
__device__ __forceinline__ uint32_t bitcos_cuda_sign_window(const uint32_t * pool, uint64_t pos) {
    const uint32_t lo = pool[pos >> 5], hi = pool[(pos >> 5) + 1];
    return __funnelshift_r(lo, hi, (uint32_t) (pos & 31));
}

// Bitmap word w (weights 32w .. 32w + 31) of a row: G128 blocks are 18 bytes, so 16-bit reads there; every
// other layout is 16-byte units back to back, i.e. the row's words in order.
__device__ __forceinline__ uint32_t bitcos_cuda_bitmap_word(const bitcos_cuda_layout & l, const uint8_t * row,
                                                            uint64_t w) {
    if (l.variant != BITCOS_VARIANT_G128) {
        return reinterpret_cast<const uint32_t *>(row)[w];
    }
    const uint16_t * h = reinterpret_cast<const uint16_t *>(row + (w / 4) * sizeof(block_bitcos_g128) + 4 * (w % 4));
    return (uint32_t) h[0] | (uint32_t) h[1] << 16;
}

// The fp16 scale of the weights of bitmap word w of global row r for the block-scaled variants (G128 in the
// block, B128 / B256 in the companion's f16[R][K / block]); 1 for the row-scaled ones (bitcos_cuda_row_scale).
__device__ __forceinline__ float bitcos_cuda_word_scale(const bitcos_cuda_layout & l, const uint8_t * row, uint64_t r,
                                                        uint64_t w) {
    uint16_t d;
    if (l.variant == BITCOS_VARIANT_G128) {
        d = *reinterpret_cast<const uint16_t *>(row + (w / 4) * sizeof(block_bitcos_g128) +
                                                offsetof(block_bitcos_g128, d));
    } else if (l.scales_per_row != 0) {
        d = reinterpret_cast<const uint16_t *>(l.scales)[r * l.scales_per_row + (w >> l.word_shift)];
    } else {
        return 1.0f;
    }
    return __half2float(__ushort_as_half(d));
}

// ---------------------------------------------------------------------------------------------------------
// Mat-vec (up to BITCOS_CUDA_MAX_COLS columns: decode), on activations quantized per 32 to int8 by
// bitcos_cuda_quantize_q8_kernel (bitcos-cuda-mmq.cuh), as ggml-cuda's mmvq quantizes src1 to q8_1 for every quant
// type: the codes meet the activations in dp4a, so the arithmetic is the batched path's (its error bound in
// bitcos-cuda-mmq.cuh holds for both: y = s_r * sum_b fl32((float) P_rb * (w_rb * d_b)), P_rb the exact int32 dot of
// block b).
//
// Why this decode (dev/cuda_sass_count.py measures it; docs/GPU.md §3): on a big GPU a BITCOS
// GEMV is instruction-bound, not memory-bound, unless the decode costs about one instruction per weight; the
// integer ALU pipe (logic, shifts, byte permutes) issues at half the scheduler's rate and POPC at an eighth,
// so the decode keeps both off the per-weight path:
//  * A lane's 32-weight word is 4 presence bytes; each byte is two 4-weight groups, each decoded by one
//    shared-memory load of 4 int8 codes from a table keyed by (presence nibble, 4 sign bits), fed to dp4a.
//  * Two tables, so that no sign cursor moves inside a byte: the low group's key takes the 4 signs starting
//    at the byte's first sign ("leading" table: rank r <-> sign bit r), the high group's the 4 signs ending at
//    the byte's last sign ("trailing" table: rank r of k <-> sign bit 4 - k + r). Both windows are one funnel
//    shift of the lane's sign word at the byte boundaries, whose offsets are popcounts of the presence word's
//    low 8 / 16 / 24 bits (3 POPC per 32 weights).
//  * Key = one PRMT + one LOP3: X_B (the sign word shifted so that the 4 signs after boundary B sit at bits
//    12..15 and the 4 before it at bits 8..11) and P (the presence byte at bits 8..15, the lane's table copy
//    at bits 2..6, from one byte permute) merge into the byte address (key << 8 | table << 7 | copy << 2).
//  * One table copy per lane (bank = lane), so a warp's 32 loads are one shared-memory wavefront: 2 x 256
//    entries x 32 copies x 4 bytes = 64 KiB of dynamic shared memory per block (BITCOS_CUDA_GEMV_LUT_BYTES;
//    devices whose blocks cannot have 64 KiB take 8 copies, 16 KiB, and some bank conflicts).
#define BITCOS_CUDA_GEMV_MAX_COPIES 32

template <int COPIES> struct bitcos_cuda_gemv_lut {
    static_assert(COPIES == 32 || COPIES == 8, "table copies: 32 (64 KiB) or 8 (16 KiB)");
    static constexpr int SHIFT = COPIES == 32 ? 0 : 2; // address bits dropped by the 8-copy layout
    static constexpr int BYTES = (2 * 256 * BITCOS_CUDA_GEMV_MAX_COPIES * 4) >> SHIFT;
};

// Codes (4 int8, weight i in byte i) of a 4-weight group with presence nibble m and 4 sign bits s (1 =
// negative), s read as the leading or the trailing window (see above).
__device__ __forceinline__ uint32_t bitcos_cuda_gemv_lut_entry(uint32_t m, uint32_t s, bool trailing) {
    const int k    = __popc(m);
    uint32_t  e    = 0;
    int       rank = 0;
    for (int i = 0; i < 4; ++i) {
        if ((m >> i) & 1) {
            const int bit = trailing ? 4 - k + rank : rank;
            e |= (((s >> bit) & 1) ? 0xFFu : 0x01u) << (8 * i);
            ++rank;
        }
    }
    return e;
}

// Fills the block's tables (all threads must call it; ends with a barrier). Word index (key << 6 | table << 5
// | copy) >> SHIFT, leading key = m | s << 4, trailing key = s | m << 4; 16-byte stores of 4 copies.
template <int COPIES> __device__ __forceinline__ void bitcos_cuda_gemv_lut_fill(uint8_t * lut) {
    const int n = bitcos_cuda_gemv_lut<COPIES>::BYTES / 16;
    for (int i = threadIdx.x + threadIdx.y * blockDim.x; i < n; i += blockDim.x * blockDim.y) {
        const int      word = 4 * i; // first of the 4 copies this store writes
        const int      key = word / (2 * COPIES), trailing = (word / COPIES) & 1;
        const uint32_t e                  = trailing ? bitcos_cuda_gemv_lut_entry(key >> 4, key & 15, true) :
                                                       bitcos_cuda_gemv_lut_entry(key & 15, key >> 4, false);
        reinterpret_cast<uint4 *>(lut)[i] = make_uint4(e, e, e, e);
    }
    __syncthreads();
}

// a . b + c on 4 signed bytes (dp4a; sm_61+, a loop before)
__device__ __forceinline__ int bitcos_cuda_dp4a(uint32_t a, uint32_t b, int c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    return __dp4a((int) a, (int) b, c);
#else
    for (int i = 0; i < 4; ++i)
        c += (int) (int8_t) (a >> 8 * i) * (int) (int8_t) (b >> 8 * i);
    return c;
#endif
}

// Inclusive prefix sum over each aligned segment of LANES lanes (32: the whole warp; 16 / 8: a row of the
// mat-vec's several rows per warp). On the device each step is a shuffle whose "source lane in the segment"
// predicate (shfl's segment mask, c = (32 - LANES) << 8) guards the add (2 instructions a step; the C++ form
// costs a compare and a select more); log2(LANES) steps.
template <int LANES = BITCOS_CUDA_WARP> __device__ __forceinline__ int bitcos_cuda_warp_scan(int v) {
    static_assert(LANES == 32 || LANES == 16 || LANES == 8, "segments of 32, 16 or 8 lanes");
#if defined(__CUDA_ARCH__)
#    pragma unroll
    for (int o = 1; o < LANES; o <<= 1) {
        asm("{\n\t.reg .s32 t;\n\t.reg .pred p;\n\t"
            "shfl.sync.up.b32 t|p, %0, %1, %2, -1;\n\t@p add.s32 %0, %0, t;\n\t}"
            : "+r"(v)
            : "r"(o), "n"((32 - LANES) << 8));
    }
    return v;
#else
    const int seg_lane = threadIdx.x & (LANES - 1);
    for (int o = 1; o < LANES; o <<= 1) {
        const int t = __shfl_up_sync(0xffffffffu, v, o, LANES);
        if (seg_lane >= o)
            v += t;
    }
    return v;
#endif
}

// (a & mask) | (b & ~mask) in one LOP3 (ptxas splits the C++ form into two when a feeds several masks)
__device__ __forceinline__ uint32_t bitcos_cuda_bitselect(uint32_t a, uint32_t b, uint32_t mask) {
#if defined(__CUDA_ARCH__)
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(r) : "r"(a), "r"(b), "r"(mask));
    return r;
#else
    return (a & mask) | (b & ~mask);
#endif
}

// Where a row's bitmap words and word scales are, specialized so that the hot loop has no variant branch:
// WORDS32 (PT, MATRIX, ROW: 32-bit words, no word scale), WORDS32_F16 (B128, B256: fp16 per 4 or 8 words in the
// companion), G128 (18-byte blocks: 16-bit halves, the fp16 scale after each block's 16 bitmap bytes).
enum bitcos_cuda_row_kind { BITCOS_CUDA_WORDS32, BITCOS_CUDA_WORDS32_F16, BITCOS_CUDA_G128 };

// 32-bit shared-memory load at byte offset off of lut. On the device through the shared window's 32-bit
// address, so that ptxas keeps the table's base in a uniform register folded into the load (in C++ it adds
// it to every address: an instruction per lookup).
__device__ __forceinline__ uint32_t bitcos_cuda_lds(const uint8_t * lut, uint32_t off) {
#if defined(__CUDA_ARCH__)
    uint32_t v;
    asm("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"((uint32_t) __cvta_generic_to_shared(lut) + off));
    return v;
#else
    return *reinterpret_cast<const uint32_t *>(lut + off);
#endif
}

// The 8 dp4a operands (int8 codes of weights 4i .. 4i + 3) of a 32-weight bitmap word whose first sign is bit 0 of
// s (lut: the block's tables; copy_bits: this lane's table copy at address bits 2..6 of the 64 KiB layout).
template <int COPIES>
__device__ __forceinline__ void bitcos_cuda_decode_word(uint32_t word, uint32_t s, const uint8_t * lut,
                                                        uint32_t copy_bits, uint32_t codes[8]) {
    constexpr int  SHIFT = bitcos_cuda_gemv_lut<COPIES>::SHIFT;
    // X_B = bits 32.. of (s << 12) >> B as a 64-bit value, B = the sign offset of a byte boundary: bits 12..15
    // the 4 signs from B, bits 8..11 the 4 before it (zeros before the word's first sign)
    const uint32_t lo = s << 12, hi = s >> 20;
    uint32_t       x_b[5];
    x_b[0] = lo;
    x_b[1] = __funnelshift_rc(lo, hi, (uint32_t) __popc(word << 24));
    x_b[2] = __funnelshift_rc(lo, hi, (uint32_t) __popc(word << 16));
    x_b[3] = __funnelshift_rc(lo, hi, (uint32_t) __popc(word << 8));
    x_b[4] = __funnelshift_rc(lo, hi, (uint32_t) __popc(word));
    for (int j = 0; j < 4; ++j) {
        // presence byte j at bits 8..15, the copy bits below
        const uint32_t p     = __byte_perm(word, copy_bits, 0x5504u | (uint32_t) j << 4);
        const uint32_t lead  = bitcos_cuda_bitselect(x_b[j], p, 0xF000u);     // m_lo | s << 4
        const uint32_t trail = bitcos_cuda_bitselect(x_b[j + 1], p, 0x0F00u); // s | m_hi << 4
        codes[2 * j]         = bitcos_cuda_lds(lut, lead >> SHIFT);
        codes[2 * j + 1]     = bitcos_cuda_lds(lut + (128 >> SHIFT), trail >> SHIFT);
    }
}

// The integer dot product of a 32-weight word's codes (bitcos_cuda_decode_word: 8 dwords of 4 int8) with its 32
// int8 activations (two uint4), one dp4a chain in weight order.
__device__ __forceinline__ int bitcos_cuda_dot32(const uint32_t (&codes)[8], uint4 x0, uint4 x1) {
    int dot = 0;
    dot     = bitcos_cuda_dp4a(codes[0], x0.x, dot);
    dot     = bitcos_cuda_dp4a(codes[1], x0.y, dot);
    dot     = bitcos_cuda_dp4a(codes[2], x0.z, dot);
    dot     = bitcos_cuda_dp4a(codes[3], x0.w, dot);
    dot     = bitcos_cuda_dp4a(codes[4], x1.x, dot);
    dot     = bitcos_cuda_dp4a(codes[5], x1.y, dot);
    dot     = bitcos_cuda_dp4a(codes[6], x1.z, dot);
    dot     = bitcos_cuda_dp4a(codes[7], x1.w, dot);
    return dot;
}

// The fp16 scale of word w of a row of kind KIND (scales: the row's, bitcos_cuda_row_dot_kind's); 1 for the
// row-scaled kind (its scale is applied once, at the end). A function, not a lambda in the row loop: nvcc
// 13.0 compiled the lambda to 7 more instructions per step of the mat-vec's hot loop (dev/cuda_sass_count.py).
template <int KIND>
__device__ __forceinline__ float bitcos_cuda_kind_word_scale(const uint16_t * scales, uint32_t w, unsigned word_shift) {
    return KIND == BITCOS_CUDA_WORDS32 ?
               1.0f :
           KIND == BITCOS_CUDA_G128 ?
               __half2float(__ushort_as_half(scales[(w / 4) * (sizeof(block_bitcos_g128) / 2)])) :
               __half2float(__ushort_as_half(scales[w >> word_shift]));
}

// Cooperative over a segment of LANES lanes (the whole warp, or an aligned half / quarter of it: the warp's
// other segments run other rows in lockstep, every shuffle stays in its segment): out[c] (valid in every lane of
// the segment) = row r of W times quantized column c, c < NC: q (int8) + c * q_stride, d (fp32 per 32) + c *
// d_stride (bitcos_cuda_quantize_q8_kernel's layout); global row r of a BITCOS tensor (blocks: the weight data,
// comp: its companion) laid out as KIND; lut: the block's tables.
// Lane l of the segment takes words 2l, 2l + 1 of each (2 LANES)-word step (one prefix sum, one sign fetch and
// one loop iteration per 64 weights): whole steps without bounds checks, then the rest (fewer than 2 LANES
// words) a word per lane, in one or two half steps (lane l word l, then word LANES + l), bounds-checked.
template <int NC, int COPIES, int KIND, int LANES>
__device__ __forceinline__ void bitcos_cuda_row_dot_kind(const bitcos_cuda_layout & l, const uint8_t * blocks,
                                                         const uint8_t * comp, uint64_t r, const int8_t * q,
                                                         int64_t q_stride, const float * d, int64_t d_stride,
                                                         const uint8_t * lut, float * out) {
    const int        lane = threadIdx.x & (BITCOS_CUDA_WARP - 1), seg_lane = lane & (LANES - 1);
    const uint8_t *  row   = blocks + r * l.row_bytes;
    // the row's signs: pool words from the one holding its first sign, bit offsets relative to that word
    // (32-bit: a row has at most K signs)
    const uint64_t   first = bitcos_cuda_row_sign_pos(comp, r);
    const uint32_t * pool =
        reinterpret_cast<const uint32_t *>(comp + bitcos_cuda_u64(comp, BITCOS_HDR_POOL_OFFSET)) + (first >> 5);
    uint32_t         cursor    = (uint32_t) (first & 31);
    const uint32_t   copy_bits = (uint32_t) (lane % COPIES) << (2 + bitcos_cuda_gemv_lut<COPIES>::SHIFT);
    const uint16_t * scales    = KIND == BITCOS_CUDA_G128 ?
                                     reinterpret_cast<const uint16_t *>(row + offsetof(block_bitcos_g128, d)) :
                                     reinterpret_cast<const uint16_t *>(l.scales) + r * l.scales_per_row;
    float            acc[NC];
    for (int c = 0; c < NC; ++c)
        acc[c] = 0.0f;

    // words w (even) and w + 1 of a whole step (both in the row: has0 = has1 = true, the bounds checks compiled out)
    auto step = [&](uint32_t w, bool has0, bool has1) {
        uint32_t word0 = 0, word1 = 0;
        if (KIND == BITCOS_CUDA_G128) { // word w: half-words at byte (w / 4) * 18 + 4 (w % 4)
            const uint16_t * h =
                reinterpret_cast<const uint16_t *>(row + (w / 4) * sizeof(block_bitcos_g128) + 4 * (w % 4));
            if (has0)
                word0 = (uint32_t) h[0] | (uint32_t) h[1] << 16;
            if (has1)
                word1 = (uint32_t) h[2] | (uint32_t) h[3] << 16; // same block: w % 4 is 0 or 2
        } else {
            const uint32_t * wp = reinterpret_cast<const uint32_t *>(row) + w;
            if (has0)
                word0 = wp[0];
            if (has1)
                word1 = wp[1];
        }
        const int n0 = __popc(word0), n = n0 + __popc(word1);
        const int incl  = bitcos_cuda_warp_scan<LANES>(n);
        const int total = __shfl_sync(0xffffffffu, incl, LANES - 1, LANES);
        if (has0) {
            // 64 signs from the lane's first (3 pool words; the pool's zero tail covers the last ones), the
            // second word's from n0 on
            const uint32_t   pos = cursor + (uint32_t) (incl - n);
            const uint32_t * pw  = pool + (pos >> 5);
            const uint32_t   p0 = pw[0], p1 = pw[1], p2 = pw[2];
            const uint32_t   s0 = __funnelshift_r(p0, p1, pos), s_hi = __funnelshift_r(p1, p2, pos);
            const uint32_t   s1 = __funnelshift_rc(s0, s_hi, (uint32_t) n0);
            uint32_t         codes0[8], codes1[8];
            bitcos_cuda_decode_word<COPIES>(word0, s0, lut, copy_bits, codes0);
            bitcos_cuda_decode_word<COPIES>(word1, s1, lut, copy_bits, codes1);
            // both words share a scale block (4 or 8 words, aligned)
            const float ws = bitcos_cuda_kind_word_scale<KIND>(scales, w, l.word_shift);
            for (int c = 0; c < NC; ++c) {
                const uint4 * xq = reinterpret_cast<const uint4 *>(q + c * q_stride + 32 * (int64_t) w);
                const uint4   x0 = xq[0], x1 = xq[1], x2 = xq[2], x3 = xq[3];
                const float2  dw   = *reinterpret_cast<const float2 *>(d + c * d_stride + w);
                const int     dot0 = bitcos_cuda_dot32(codes0, x0, x1), dot1 = bitcos_cuda_dot32(codes1, x2, x3);
                acc[c] += (float) dot0 * (ws * dw.x);
                acc[c] += (float) dot1 * (ws * dw.y);
            }
        }
        cursor += (uint32_t) total;
    };
    // the partial last step's words (fewer than 2 LANES): a word per lane, one or two such half steps (half the
    // decode of a whole step each; a two-word step would leave lanes idle where at most LANES words are left)
    auto half_step = [&](uint32_t w, bool has) {
        uint32_t word = 0;
        if (has) {
            if (KIND == BITCOS_CUDA_G128) {
                const uint16_t * h =
                    reinterpret_cast<const uint16_t *>(row + (w / 4) * sizeof(block_bitcos_g128) + 4 * (w % 4));
                word = (uint32_t) h[0] | (uint32_t) h[1] << 16;
            } else {
                word = reinterpret_cast<const uint32_t *>(row)[w];
            }
        }
        const int n     = __popc(word);
        const int incl  = bitcos_cuda_warp_scan<LANES>(n);
        const int total = __shfl_sync(0xffffffffu, incl, LANES - 1, LANES);
        if (has) {
            const uint32_t   pos = cursor + (uint32_t) (incl - n);
            const uint32_t * pw  = pool + (pos >> 5);
            const uint32_t   s0  = __funnelshift_r(pw[0], pw[1], pos);
            uint32_t         codes[8];
            bitcos_cuda_decode_word<COPIES>(word, s0, lut, copy_bits, codes);
            const float ws = bitcos_cuda_kind_word_scale<KIND>(scales, w, l.word_shift);
            for (int c = 0; c < NC; ++c) {
                const uint4 * xq = reinterpret_cast<const uint4 *>(q + c * q_stride + 32 * (int64_t) w);
                const uint4   x0 = xq[0], x1 = xq[1];
                const int     dot = bitcos_cuda_dot32(codes, x0, x1);
                acc[c] += (float) dot * (ws * d[c * d_stride + w]);
            }
        }
        cursor += (uint32_t) total;
    };
    constexpr uint32_t STEP    = 2 * LANES;
    const uint32_t     n_words = (uint32_t) l.n_words;
    uint32_t           w0      = 0;
    for (; w0 + STEP <= n_words; w0 += STEP) {
        step(w0 + 2 * (uint32_t) seg_lane, true, true);
    }
    if (w0 < n_words) { // uniform: n_words - w0 words left, 1 .. 2 LANES - 1
        const uint32_t w = w0 + (uint32_t) seg_lane;
        half_step(w, w < n_words);
        if (w0 + LANES < n_words) {
            half_step(w + LANES, w + LANES < n_words);
        }
    }
    const float scale = bitcos_cuda_row_scale(l, r);
    for (int c = 0; c < NC; ++c) {
        float v = acc[c];
        for (int o = LANES / 2; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o, LANES);
        out[c] = v * scale;
    }
}

// Calls f(std::integral_constant<int, KIND>{}) for the row kind of layout l (uniform: once per kernel, before
// its row loop, so that the header's reads and divisions are not per row).
template <class F> __device__ __forceinline__ void bitcos_cuda_with_kind(const bitcos_cuda_layout & l, F && f) {
    if (l.variant == BITCOS_VARIANT_G128) {
        f(std::integral_constant<int, BITCOS_CUDA_G128>{});
    } else if (l.scales_per_row != 0) {
        f(std::integral_constant<int, BITCOS_CUDA_WORDS32_F16>{});
    } else {
        f(std::integral_constant<int, BITCOS_CUDA_WORDS32>{});
    }
}

// Calls f(std::integral_constant<int, NC>{}) for NC = nc (1 .. BITCOS_CUDA_MAX_COLS): the launchers' switch from a
// column count to the kernel instance that keeps NC accumulators.
template <class F> __host__ __forceinline__ void bitcos_cuda_with_cols(int nc, F && f) {
    switch (nc) {
        case 1:
            f(std::integral_constant<int, 1>{});
            break;
        case 2:
            f(std::integral_constant<int, 2>{});
            break;
        case 3:
            f(std::integral_constant<int, 3>{});
            break;
        case 4:
            f(std::integral_constant<int, 4>{});
            break;
        case 5:
            f(std::integral_constant<int, 5>{});
            break;
        case 6:
            f(std::integral_constant<int, 6>{});
            break;
        case 7:
            f(std::integral_constant<int, 7>{});
            break;
        default:
            f(std::integral_constant<int, 8>{});
            break;
    }
}

// Lanes per row of the mat-vec launched by the glue: 32, 16 or 8 (the kernel and its tests take all three). A warp runs
// 32 / LANES rows at once, one per segment; a lane's step is two words of its row whatever LANES, so the difference is
// the idle lanes of a row's partial last step (a step is 2 LANES words: K = 2560, 80 words, leaves 3/4 of the lanes
// idle in its second step at 32 lanes and none at 8), the prefix sum (log2(LANES) shuffle steps) and the row's fixed
// cost (its sign position, the segment reduction, the store), spread over K / LANES weights a lane. 8 lanes issue the
// fewest instructions per weight at every K measured (dev/cuda_sass_count.py bitcos --k
// 2048,2560,4096,6912,14336: 2.05-2.27 against 2.22-4.79 at 32 lanes; docs/GPU.md §3), and 8 lanes pad a row
// at most as much as 16 or 32 (16-word steps), so 8 at every K (one instance per column count in the glue); the cost is
// parallelism on small matrices (a quarter as many row groups: a 2560-row matrix keeps 640 warps busy), which only a
// timed GPU run can weigh.
#define BITCOS_CUDA_GEMV_LANES 8

// Calls f(std::integral_constant<int, LANES>{}) for LANES = lanes (32, 16 or 8): the launchers' switch to the
// kernel instance.
template <class F> __host__ __forceinline__ void bitcos_cuda_with_lanes(int lanes, F && f) {
    switch (lanes) {
        case 8:
            f(std::integral_constant<int, 8>{});
            break;
        case 16:
            f(std::integral_constant<int, 16>{});
            break;
        default:
            f(std::integral_constant<int, 32>{});
            break;
    }
}

// Dynamic shared memory (the host emulation's shim defines its own stand-in)
#ifndef BITCOS_CUDA_EXTERN_SHARED
#    define BITCOS_CUDA_EXTERN_SHARED(type, name) extern __shared__ __align__(16) type name[]
#endif

// The mat-vec kernels' rows: LANES lanes a row (the warp's segments take consecutive rows), grid-stride over
// the block's warps, the companion's layout read once and its row kind fixed (bitcos_cuda_with_kind) before the
// loop. f(kind, layout, r, ok) per row; ok is false for a segment past the last row, which still takes part in
// the segment's shuffles (on row rows - 1) and must not write.
template <int LANES, class F>
__device__ __forceinline__ void bitcos_cuda_gemv_rows(const uint8_t * comp, int64_t rows, F && f) {
    constexpr int            RPW = BITCOS_CUDA_WARP / LANES; // rows per warp
    const int                seg = (int) (threadIdx.x & (BITCOS_CUDA_WARP - 1)) / LANES;
    const bitcos_cuda_layout l   = bitcos_cuda_read_layout(comp);
    bitcos_cuda_with_kind(l, [&](auto kind) {
        for (int64_t g = ((int64_t) blockIdx.x * blockDim.y + threadIdx.y) * RPW; g < rows;
             g += (int64_t) gridDim.x * blockDim.y * RPW) {
            const int64_t r = g + seg;
            f(kind, l, r, r < rows);
        }
    });
}

// Mat-vec / small batch on quantized activations: NC columns (q + c * k_pad int8, d + c * (k_pad / 32) scales),
// dst[c * dst_col_stride + r] for r < rows (global row row0 + r), LANES lanes per row (the glue:
// BITCOS_CUDA_GEMV_LANES). Block (32, warps) with bitcos_cuda_gemv_lut<COPIES>::BYTES of dynamic shared memory; any
// grid.x: warp y of block x takes the 32 / LANES rows (x * warps + y) * 32 / LANES .., segment s of the warp row s of
// them, then every gridDim.x * warps * 32 / LANES-th group (the glue sizes the grid to what the device holds at once,
// so that each block fills its tables once for many rows). A segment past the last row runs the last row again (the
// warp's shuffles need every lane) and writes nothing.
template <int NC, int COPIES, int LANES>
static __global__ void __launch_bounds__(512)
bitcos_cuda_mul_mat_vec_kernel(const uint8_t * __restrict__ blocks, const uint8_t * __restrict__ comp,
                               const int8_t * __restrict__ q, const float * __restrict__ d, float * __restrict__ dst,
                               int64_t row0, int64_t rows, int64_t k_pad, int64_t dst_col_stride) {
    BITCOS_CUDA_EXTERN_SHARED(uint8_t, bitcos_cuda_smem);
    bitcos_cuda_gemv_lut_fill<COPIES>(bitcos_cuda_smem);
    bitcos_cuda_gemv_rows<LANES>(comp, rows, [&](auto kind, const bitcos_cuda_layout & l, int64_t r, bool ok) {
        float out[NC];
        bitcos_cuda_row_dot_kind<NC, COPIES, decltype(kind)::value, LANES>(
            l, blocks, comp, (uint64_t) (row0 + (ok ? r : rows - 1)), q, k_pad, d, k_pad / 32, bitcos_cuda_smem, out);
        if ((threadIdx.x & (LANES - 1)) == 0 && ok) {
            for (int c = 0; c < NC; ++c)
                dst[c * dst_col_stride + r] = out[c];
        }
    });
}

// MUL_MAT_ID on quantized activations: grid (any, n_used * n_tokens); slot (t, u) = blockIdx.y reads its expert
// id on the device (ids: n_used int32 per token, ids_stride int32 between tokens), quantized column t * ne11 +
// u % ne11, and writes dst[t * dst_tok_stride + u * dst_slot_stride + r]; rows (LANES lanes each) as
// bitcos_cuda_mul_mat_vec_kernel. Out-of-range ids are skipped, never read.
template <int COPIES, int LANES>
static __global__ void __launch_bounds__(512)
bitcos_cuda_mul_mat_vec_id_kernel(const uint8_t * __restrict__ blocks, const uint8_t * __restrict__ comp,
                                  const int8_t * __restrict__ q, const float * __restrict__ d,
                                  const int32_t * __restrict__ ids, float * __restrict__ dst, int64_t rows,
                                  int64_t n_experts, int64_t n_used, int64_t ids_stride, int64_t ne11, int64_t k_pad,
                                  int64_t dst_slot_stride, int64_t dst_tok_stride) {
    const int64_t u = (int64_t) blockIdx.y % n_used, t = (int64_t) blockIdx.y / n_used;
    const int32_t e = ids[t * ids_stride + u];
    if (e < 0 || e >= n_experts) {
        return; // uniform in the block, before its barrier
    }
    BITCOS_CUDA_EXTERN_SHARED(uint8_t, bitcos_cuda_smem);
    bitcos_cuda_gemv_lut_fill<COPIES>(bitcos_cuda_smem);
    const int64_t col = t * ne11 + u % ne11;
    bitcos_cuda_gemv_rows<LANES>(comp, rows, [&](auto kind, const bitcos_cuda_layout & l, int64_t r, bool ok) {
        float out[1];
        bitcos_cuda_row_dot_kind<1, COPIES, decltype(kind)::value, LANES>(
            l, blocks, comp, (uint64_t) (e * rows + (ok ? r : rows - 1)), q + col * k_pad, 0, d + col * (k_pad / 32), 0,
            bitcos_cuda_smem, out);
        if ((threadIdx.x & (LANES - 1)) == 0 && ok) {
            dst[t * dst_tok_stride + u * dst_slot_stride + r] = out[0];
        }
    });
}
