// Shared helpers of the x86 SIMD kernels (bitcos-kernels-avx2.c, bitcos-kernels-avx512.c): the sign decode,
// the column staging, the call's shape and tile scale, the tile loop. Everything here is static inline, so
// each kernel file compiles it with its own target flags.
//
// Contract: bitcos-kernels.h, arithmetic contract v2 (every result bit-identical to bitcos_mm_generic, hence
// to llama.cpp's AVX2 TQ2_0 kernel). Layout: bitcos-format.h. Design and measurements: docs/KERNELS.md.
// Names: x86_ = shared by both kernels, avx2_ / avx512_ = one kernel's own.
//
// Integer part (exact). Per 64 weights of a row: P = presence word, S = 64 sign bits at the row's cursor,
// N = pdep(S, P) (the negative lanes), cursor += |P|. The codes enter a byte dot product as u = t + 1 in
// {0, 1, 2}, the unsigned operand against the raw signed activations q (exact for q = -128 too); the
// contract's subtracted term, the 32-position activation sums of a block, is a column property staged once
// per tile and chunk (x86_stage_column). Float part: one 8-lane FMA per block (two when the block's two
// 128-weight units have different fp16 scales), the final reduction in the contract's order.
//
// Descriptor (bitcos_rows): every variant, told apart by where its scales are (x86_shape_of: enum
// x86_tile_scale), never by its variant id. A row with a partial last unit (k % 128 != 0) reads that unit's
// (k % 128) / 8 bitmap bytes once per tile into a zero-filled copy of the row's last Q8_K block
// (x86_copy_last); the decode then reads 16 bytes per unit from the copy as from any block. The kernels
// cover the layouts x86_covered accepts; the kernel table runs any other descriptor on the portable kernel.
#pragma once

#include "bitcos-kernels.h"

#if !defined(BITCOS_BUILD_AVX2)
#    error "bitcos-kernels-x86.h needs x86-64, GCC or clang, and AVX2 (BITCOS_BUILD_AVX2, bitcos-kernels.h)"
#endif

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#if BITCOS_FMA && !defined(__FMA__)
#    error "BITCOS_FMA=1 needs FMA instructions in the x86 kernels: compile with -mfma (or -DBITCOS_FMA=0)"
#endif

#define X86_ALWAYS_INLINE    static inline __attribute__((always_inline))
#define X86_CHUNK_BLOCKS     8  // Q8_K blocks per chunk (2048 weights): staging granularity
#define X86_TILE_COLS        8  // activation columns per tile
#define X86_TILE_ROWS        32 // rows per tile (amortises the staging of the columns)
// GEMV memory order (docs/KERNELS.md §5): a row (AVX2) or a row pair (AVX-512) walks up to
// X86_GEMV_SPAN_CHUNKS chunks before the next, so the bitmap and the sign pool are read as a few sequential
// streams through the row tile; the bitmap is also prefetched X86_BITMAP_PREFETCH_BYTES bytes ahead of each
// row's position and the sign pool X86_POOL_PREFETCH_BYTES ahead of each row's cursor (0: no prefetch). The
// codes-form kernels prefetch each row's codes X86_CODES_PREFETCH_BLOCKS Q8_K blocks (64 bytes each) ahead.
// Software prefetch far ahead pays on the development VM, whose hardware prefetchers leave a one-stream
// mat-vec stalled on loads (docs/KERNELS.md §8: tg 1.3-1.4x for the codes form, 1.1x for BITCOS).
#define X86_GEMV_SPAN_CHUNKS 8 // chunks (16384 weights) of a column staged at once
#ifndef X86_BITMAP_PREFETCH_BYTES
#    define X86_BITMAP_PREFETCH_BYTES 2048
#endif
#ifndef X86_POOL_PREFETCH_BYTES
#    define X86_POOL_PREFETCH_BYTES 1024
#endif
#ifndef X86_CODES_PREFETCH_BLOCKS
#    define X86_CODES_PREFETCH_BLOCKS 32
#endif

// Layout facts (bitcos-format.h) the decode relies on. A unit's bitmap is two little-endian u64 presence
// words (word 1 at X86_WORD_BYTES); a Q8_K block covers two 128-weight units; v1 G128 puts each unit's
// fp16 scale right after its bitmap, v2 rows are bitmaps back to back.
#define X86_WORD_BYTES sizeof(uint64_t)
#define X86_UNIT_BYTES BITCOS_BITMAP_BYTES       // unit stride of every variant but v1 G128
#define X86_G128_BYTES sizeof(block_bitcos_g128) // unit stride of v1 G128
_Static_assert(BITCOS_BITMAP_BYTES == 2 * sizeof(uint64_t), "a unit's bitmap is two u64 presence words");
_Static_assert(offsetof(block_bitcos_g128, bits) == 0 && offsetof(block_bitcos_g128, d) == BITCOS_BITMAP_BYTES,
               "a G128 block is its bitmap, then its scale");
_Static_assert(sizeof(block_bitcos_pt) == X86_UNIT_BYTES, "a v1 PT block is its bitmap alone");
_Static_assert(2 * QK_BITCOS == sizeof(((const bitcos_q8_K *) 0)->qs), "a Q8_K block is two 128-weight units");
_Static_assert(sizeof(((const block_bitcos_g128 *) 0)->d) == sizeof(uint16_t), "a block scale is one fp16");

X86_ALWAYS_INLINE uint64_t x86_load_u64(const uint8_t * p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

X86_ALWAYS_INLINE uint16_t x86_load_u16(const uint8_t * p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

// Scatters the low popcount(mask) bits of src to the set positions of mask. BMI2 pdep is one fast
// instruction on Intel since Haswell and AMD since Zen 3; on Zen 1/2 it is microcoded with a cost that
// grows with the mask's popcount (hundreds of cycles for dense masks), so -march=znver1/znver2 builds, and
// AVX2 builds without -mbmi2, use the loop (about three ops per set bit).
X86_ALWAYS_INLINE uint64_t x86_pdep(uint64_t src, uint64_t mask) {
#if defined(__BMI2__) && !defined(__znver1__) && !defined(__znver2__)
    return _pdep_u64(src, mask);
#else
    uint64_t out = 0;
    for (uint64_t m = mask; m != 0; m &= m - 1) {
        if (src & 1)
            out |= m & (~m + 1);
        src >>= 1;
    }
    return out;
#endif
}

// 64 sign bits starting at pool bit `pos`, from the two aligned-index qwords covering them. Reads at most
// up to byte (pos >> 3) + 16 of the pool, inside the >= 64-byte zero tail guaranteed by FORMAT.md §4.4.
// The high part is shifted in two steps ((hi << 1) << (63 - s)) so s = 0 needs no branch.
X86_ALWAYS_INLINE uint64_t x86_sign_window(const uint8_t * pool, uint64_t pos) {
    const uint8_t * p  = pool + ((pos >> 6) << 3);
    const uint64_t  lo = x86_load_u64(p);
    const uint64_t  hi = x86_load_u64(p + 8);
    return (lo >> (pos & 63)) | ((hi << 1) << (~pos & 63));
}

// Negative-lane word of the 64 weights with presence word p at the row's cursor; advances the cursor.
X86_ALWAYS_INLINE uint64_t x86_negatives(uint64_t p, const uint8_t * pool, uint64_t * cursor) {
    const uint64_t pos = *cursor;
    *cursor            = pos + (uint64_t) __builtin_popcountll(p);
    return x86_pdep(x86_sign_window(pool, pos), p);
}

// Same with a cheaper window for rows that are not dense: one unaligned load at byte pos / 8, shifted by
// pos % 8, holds at least 57 valid bits, enough for any word with popcount <= 57; denser words take the
// two-qword window (a branch, so a row whose words often exceed 57 present weights should not use this).
// Reads at most up to byte (pos >> 3) + 7 of the pool on the fast path.
// checked = 0: the caller has verified that every word it passes has at most 57 present weights (the AVX-512
// GEMV checks a row pair's chunk with vector popcounts up front), so the per-word test goes away.
X86_ALWAYS_INLINE uint64_t x86_negatives_byte(uint64_t p, const uint8_t * pool, uint64_t * cursor, const int checked) {
    const uint64_t pos = *cursor;
    const uint64_t n   = (uint64_t) __builtin_popcountll(p);
    *cursor            = pos + n;
    uint64_t s         = x86_load_u64(pool + (pos >> 3)) >> (pos & 7);
    if (checked && __builtin_expect(n > 57, 0))
        s = x86_sign_window(pool, pos);
    return x86_pdep(s, p);
}

// fp16 -> fp32, exact either way.
X86_ALWAYS_INLINE float x86_fp16_to_fp32(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return bitcos_fp16_to_fp32(h);
#endif
}

// The contract's FMA(a, b, c) on vectors of the intrinsic family `ps` (_mm256, _mm512).
#if BITCOS_FMA
#    define X86_CONTRACT_FMA(ps, a, b, c) ps##_fmadd_ps(a, b, c)
#else
#    define X86_CONTRACT_FMA(ps, a, b, c) ps##_add_ps(ps##_mul_ps(a, b), c)
#endif

// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), the contract's final reduction.
X86_ALWAYS_INLINE float x86_reduce8(__m256 a) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)); // a_l + a_{l+4}
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                                 // s0+s2, s1+s3
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// 8 vectors of 8 int32 -> one vector of the 8 totals, in input order.
X86_ALWAYS_INLINE __m256i x86_totals8(const __m256i x[8]) {
    const __m256i h01 = _mm256_hadd_epi32(x[0], x[1]);
    const __m256i h23 = _mm256_hadd_epi32(x[2], x[3]);
    const __m256i h45 = _mm256_hadd_epi32(x[4], x[5]);
    const __m256i h67 = _mm256_hadd_epi32(x[6], x[7]);
    const __m256i k03 = _mm256_hadd_epi32(h01, h23); // per 128-bit lane: x0..x3 partials
    const __m256i k47 = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(k03, k47, 0x20), _mm256_permute2x128_si256(k03, k47, 0x31));
}

// The 8 sums of 32 consecutive activations of a Q8_K block (lane l: positions 32l .. 32l+31; lanes 4..7
// zero when the block has only its first half in the matrix): the contract's subtracted term.
X86_ALWAYS_INLINE __m256i x86_block_qsums(const int8_t * qs, int halves) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256i       v[8];
    for (int i = 0; i < 8; ++i) {
        v[i] = i < 4 * halves ?
                   _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, _mm256_loadu_si256((const __m256i *) (qs + 32 * i))),
                                     ones16) :
                   _mm256_setzero_si256();
    }
    return x86_totals8(v);
}

// Number of 128-weight units of a Q8_K block's halves present in a row of nb units: 2, or 1 for the last
// Q8_K block of a row with an odd number of units (a partial last unit counts as one).
X86_ALWAYS_INLINE int x86_halves(int64_t b, int64_t nb) {
    return 2 * b + 1 < nb ? 2 : 1;
}

// Q8_K blocks of the chunk starting at Q8_K block b0 of a row of nby.
X86_ALWAYS_INLINE int x86_chunk_blocks(int64_t b0, int64_t nby) {
    return (int) (nby - b0 < X86_CHUNK_BLOCKS ? nby - b0 : X86_CHUNK_BLOCKS);
}

// Staged data of one activation column for one chunk of blocks.
typedef struct {
    __m256i        qsum[X86_CHUNK_BLOCKS]; // x86_block_qsums of each block
    float          yd[X86_CHUNK_BLOCKS];   // y.d
    float          dpt[X86_CHUNK_BLOCKS];  // TILE_SCALE_SHARED: y.d * the tile's scale
    const int8_t * qs[X86_CHUNK_BLOCKS];   // the block's activations
} x86_col_chunk;

X86_ALWAYS_INLINE void x86_stage_column(const bitcos_q8_K * yc, int64_t b0, int nbk, int64_t nb, float scale,
                                        x86_col_chunk * cc) {
    for (int j = 0; j < nbk; ++j) {
        const int64_t b = b0 + j;
        cc->qsum[j]     = x86_block_qsums(yc[b].qs, x86_halves(b, nb));
        cc->yd[j]       = yc[b].d;
        cc->dpt[j]      = yc[b].d * scale;
        cc->qs[j]       = yc[b].qs;
    }
}

// x86_stage_column for each of the nct columns y[0 .. nct) of a GEMM tile, into cc[0 .. nct).
X86_ALWAYS_INLINE void x86_stage_columns(const bitcos_q8_K * const * y, int nct, int64_t b0, int nbk, int64_t nb,
                                         float scale, x86_col_chunk * cc) {
    for (int c = 0; c < nct; ++c)
        x86_stage_column(y[c], b0, nbk, nb, scale, &cc[c]);
}

// How a tile's float part finds a row's scale for a Q8_K block (bitcos-kernels.h, "Row scales" / "Block
// scales"). These name what the tile does, not the format's variants: a call's descriptor gives PER_ROW
// (row scales: PT, MATRIX and ROW tensors), PER_256, PER_128 or PER_128_IN_BLOCK (block scales: B256, B128,
// v1 G128); a PER_ROW tile whose rows all have the same scale (bitwise: every PT and MATRIX tile) runs as
// SHARED, which stages y.d * scale once per column block instead of multiplying per row and block (D is the
// same float either way).
enum x86_tile_scale {
    TILE_SCALE_SHARED           = 0, // one fp32 scale for every row of the tile: D = staged y.d * scale
    TILE_SCALE_PER_ROW          = 1, // an fp32 scale per row: D = y.d * the row's scale
    TILE_SCALE_PER_256          = 2, // an fp16 scale per Q8_K block (block_scale_shift 1): e0 == e1, one FMA
    TILE_SCALE_PER_128          = 3, // an fp16 scale per unit, adjacent (scale_stride 2): e0, e1 may differ
    TILE_SCALE_PER_128_IN_BLOCK = 4, // an fp16 scale per unit inside v1 G128 blocks, right after each bitmap
    TILE_SCALE_KINDS
};

// Runs CALL(ts) with the tile scale as a compile-time constant: the hot loops are instantiated per kind, so
// no block pays a dispatch, and PER_128_IN_BLOCK also gets its unit stride as a constant.
#define X86_TILE_SCALE_DISPATCH(ts, CALL)      \
    switch (ts) {                              \
        case TILE_SCALE_SHARED:                \
            CALL(TILE_SCALE_SHARED);           \
            break;                             \
        case TILE_SCALE_PER_ROW:               \
            CALL(TILE_SCALE_PER_ROW);          \
            break;                             \
        case TILE_SCALE_PER_256:               \
            CALL(TILE_SCALE_PER_256);          \
            break;                             \
        case TILE_SCALE_PER_128:               \
            CALL(TILE_SCALE_PER_128);          \
            break;                             \
        default:                               \
            CALL(TILE_SCALE_PER_128_IN_BLOCK); \
            break;                             \
    }

// Unit stride of a tile scale kind: v1 G128's blocks (x86_covered), else bitmaps back to back.
#define X86_TILE_UNIT_BYTES(ts) ((ts) == TILE_SCALE_PER_128_IN_BLOCK ? X86_G128_BYTES : X86_UNIT_BYTES)

// Shape of one call, shared by the tile functions of both paths.
typedef struct {
    int64_t nb;      // 128-weight units per row (the last one partial when tail != 0)
    int64_t nby;     // Q8_K blocks per row
    int64_t nfull;   // leading Q8_K blocks with two whole units, read in place (the rest: the row's last block)
    size_t  tail;    // bitmap bytes of a partial last unit ((k % 128) / 8; 0: none)
    size_t  ub;      // unit stride: X86_UNIT_BYTES, or X86_G128_BYTES for TILE_SCALE_PER_128_IN_BLOCK
    size_t  sstride; // block scales: bytes from one scale to the next along a row (scale_stride)
    int     ts;      // enum x86_tile_scale of the call (a PER_ROW tile may run as SHARED: x86_tile_scale_of)
} x86_shape;

X86_ALWAYS_INLINE x86_shape x86_shape_of(const bitcos_rows * w) {
    x86_shape s;
    s.nb      = (w->k + QK_BITCOS - 1) / QK_BITCOS;
    s.nby     = (s.nb + 1) / 2;
    s.tail    = (size_t) (w->k % QK_BITCOS) / 8;
    s.nfull   = s.tail ? s.nby - 1 : s.nb / 2;
    s.ub      = w->unit_bytes;
    s.sstride = w->scale_stride;
    s.ts      = w->row_scale != NULL                ? TILE_SCALE_PER_ROW :
                w->block_scale_shift != 0           ? TILE_SCALE_PER_256 :
                w->scale_stride == sizeof(uint16_t) ? TILE_SCALE_PER_128 :
                                                      TILE_SCALE_PER_128_IN_BLOCK;
    return s;
}

// 1 when these paths cover the descriptor: bitmaps at the unit stride of 16 (every variant but v1 G128),
// with row scales, or block scales per 256 at any stride or per 128 adjacent, and a partial last unit only
// with row scales (block scales need k % 128 == 0 anyway); or exactly the v1 G128 layout, each unit's scale
// right after its bitmap (what makes the AVX-512 path's 4-byte load ending at a scale stay in its block).
// Anything else runs the portable kernel (bitcos_kernel_mm).
X86_ALWAYS_INLINE int x86_covered(const bitcos_rows * w, x86_shape sh) {
    if (sh.ts != TILE_SCALE_PER_ROW && sh.tail != 0) {
        return 0;
    }
    if (sh.ts == TILE_SCALE_PER_128_IN_BLOCK) {
        return w->unit_bytes == X86_G128_BYTES && w->scale_stride == X86_G128_BYTES &&
               w->scale_row_bytes == w->row_bytes && w->block_scale == w->bits + offsetof(block_bitcos_g128, d);
    }
    return w->unit_bytes == X86_UNIT_BYTES;
}

// The tile scale: the call's, except that a PER_ROW tile whose rows r0 .. r0 + nrt all have the same
// scale (bitwise) is SHARED, with that scale in *scale (0 otherwise: then the staged y.d * scale is unused).
X86_ALWAYS_INLINE int x86_tile_scale_of(const bitcos_rows * w, x86_shape sh, int64_t r0, int nrt, float * scale) {
    *scale = 0.0f;
    if (sh.ts != TILE_SCALE_PER_ROW) {
        return sh.ts;
    }
    // 8 scales per compare: the check runs once per tile, and one by one it cost a 16 x 2048 GEMV 2 %
    const float * rs    = w->row_scale + r0;
    const __m256i first = _mm256_castps_si256(_mm256_set1_ps(rs[0]));
    __m256i       diff  = _mm256_setzero_si256();
    int           r     = 0;
    for (; r + 8 <= nrt; r += 8) {
        diff = _mm256_or_si256(diff, _mm256_xor_si256(first, _mm256_loadu_si256((const __m256i *) (rs + r))));
    }
    uint32_t d = 0, f, v;
    memcpy(&f, rs, sizeof f);
    for (; r < nrt; ++r) {
        memcpy(&v, rs + r, sizeof v);
        d |= v ^ f;
    }
    if (d != 0 || !_mm256_testz_si256(diff, diff)) {
        return TILE_SCALE_PER_ROW;
    }
    *scale = rs[0];
    return TILE_SCALE_SHARED;
}

// Bitmap of unit 0 of row r of the run.
X86_ALWAYS_INLINE const uint8_t * x86_row(const bitcos_rows * w, int64_t r) {
    return w->bits + (size_t) r * w->row_bytes;
}

// Scale of unit 0 of row r of the run (block scales only: block_scale is NULL with row scales).
X86_ALWAYS_INLINE const uint8_t * x86_row_scales(const bitcos_rows * w, int64_t r) {
    return w->block_scale + (size_t) r * w->scale_row_bytes;
}

// A row's last Q8_K block when its last unit is partial (tail != 0): a zero-filled copy of the row's bytes
// from the block's first unit on, (units - 1) * ub + tail of them, at most X86_LAST_BYTES. The decode reads
// the copy's 16 bytes per unit like any block's; the bits past k are zero (absent weights, as the contract
// asks), and the row's bitmap is not read past its end (the next row's bytes, or the end of the tensor).
#define X86_LAST_BYTES (2 * X86_UNIT_BYTES)
typedef struct {
    _Alignas(32) uint8_t b[X86_LAST_BYTES];
} x86_last_block;

// The copies of the rows r0 .. r0 + nrt of a tile, into last[0 .. nrt) (nothing to do without a tail). The
// n bytes are a multiple of 4 (k % 32 == 0): one masked dword load per row, which reads nothing past them (a
// masked-off element never faults), zeroes the rest and is one store (a memset + memcpy per row costs a 16-row
// tile of 2144 weights about 10 %).
X86_ALWAYS_INLINE void x86_copy_last(const bitcos_rows * w, x86_shape sh, int64_t r0, int nrt, x86_last_block * last) {
    if (sh.tail == 0) {
        return;
    }
    _Static_assert(X86_LAST_BYTES == sizeof(__m256i), "a last block is one 32-byte vector");
    const int64_t u0   = 2 * (sh.nby - 1); // first unit of the last block
    const int     n4   = (int) (((size_t) (sh.nb - 1 - u0) * X86_UNIT_BYTES + sh.tail) / sizeof(int32_t));
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n4), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int r = 0; r < nrt; ++r) {
        const int * src = (const int *) (const void *) (x86_row(w, r0 + r) + (size_t) u0 * X86_UNIT_BYTES);
        _mm256_store_si256((__m256i *) (void *) last[r].b, _mm256_maskload_epi32(src, mask));
    }
}

// Bitmap of Q8_K block b of a row (its first unit; the second is ub bytes on): in place, or the row's copy
// for the last block of a row with a partial unit.
X86_ALWAYS_INLINE const uint8_t * x86_block_bits(x86_shape sh, const uint8_t * row, const uint8_t * last, int64_t b) {
    return (sh.tail != 0 && b == sh.nby - 1) ? last : row + (size_t) (2 * b) * sh.ub;
}

// Sign cursors of the tile's rows r0 .. r0 + nrt: pool bit of each row's first sign.
X86_ALWAYS_INLINE void x86_load_cursors(const bitcos_rows * w, int64_t r0, int nrt, uint64_t * cursor) {
    for (int r = 0; r < nrt; ++r)
        cursor[r] = w->sign_pos[r0 + r];
}

// The codes-form kernels (bitcos-kernels-codes-avx2.c, -avx512.c). How a tile finds a block's scales, a
// constant per call site: row scales, a scale per 256 weights (e0 == e1: no split test), a scale per 128.
enum { CODES_ROW_SCALES, CODES_PER_256, CODES_PER_128 };

// The fp32 scales of blocks b .. b + 8 of rows i0 .. i0 + R (a scale per 256 weights), one vcvtph2ps per row
// where 8 are there at stride 2.
X86_ALWAYS_INLINE void codes_stage_per_256(const bitcos_codes_rows * w, int64_t i0, const int R, int64_t b, int64_t nby,
                                           float s256[][8]) {
    for (int r = 0; r < R; ++r) {
        const uint8_t * e = w->block_scale + (size_t) (i0 + r) * w->scale_row_bytes + (size_t) b * w->scale_stride;
#if defined(__F16C__)
        if (nby - b >= 8 && w->scale_stride == 2) {
            _mm256_storeu_ps(s256[r], _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) e)));
            continue;
        }
#endif
        {
            for (int64_t j = 0; j < 8 && b + j < nby; ++j) {
                uint16_t h;
                memcpy(&h, e + (size_t) j * w->scale_stride, 2);
                s256[r][j] = x86_fp16_to_fp32(h);
            }
        }
    }
}

// A kernel's two tile routines: rows r0 .. r0 + nrt (nrt <= X86_TILE_ROWS) against one column yc (GEMV; dc
// points at the outputs of those rows), or against nct (2 .. X86_TILE_COLS) columns y[0 .. nct) (GEMM;
// outputs dst[c][r0 ..]).
typedef void (*x86_gemv_tile_fn)(const bitcos_rows * w, int64_t r0, int nrt, const bitcos_q8_K * yc, float * dc);
typedef void (*x86_gemm_tile_fn)(const bitcos_rows * w, int64_t r0, int nrt, const bitcos_q8_K * const * y, int nct,
                                 float * const * dst);

// bitcos_mm_fn over tiles of X86_TILE_ROWS rows x X86_TILE_COLS columns; a tile of one column (nc = 1, or
// the last tile of nc = 8m + 1) is a GEMV. The descriptor must be one x86_covered accepts: the kernel table
// (bitcos-kernels-table.c) sends any other to the portable kernel before a SIMD entry point is called.
X86_ALWAYS_INLINE void x86_tiles(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                                 float * const * dst, x86_gemv_tile_fn gemv, x86_gemm_tile_fn gemm) {
    for (int64_t r0 = 0; r0 < nr; r0 += X86_TILE_ROWS) {
        const int nrt = (int) (nr - r0 < X86_TILE_ROWS ? nr - r0 : X86_TILE_ROWS);
        for (int64_t c0 = 0; c0 < nc; c0 += X86_TILE_COLS) {
            const int nct = (int) (nc - c0 < X86_TILE_COLS ? nc - c0 : X86_TILE_COLS);
            if (nct == 1)
                gemv(w, r0, nrt, y[c0], dst[c0] + r0);
            else
                gemm(w, r0, nrt, y + c0, nct, dst + c0);
        }
    }
}
