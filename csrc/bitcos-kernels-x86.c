// x86 SIMD BITCOS kernels: AVX2 and AVX-512 (F/BW/VL; VNNI, BMI2 and F16C used when present).
//
// Contract: bitcos-kernels.h, arithmetic contract v2 (results bit-identical to bitcos_mm_generic, hence to
// llama.cpp's AVX2 TQ2_0 kernel). Layout: bitcos-format.h (block structs and sizes). Design notes and
// measured cycles: docs/KERNELS.md. This file defines only what the compiler's target flags allow (the
// same guards as the header's declarations): on a non-x86 target, or without AVX2, it defines nothing.
// Compile it with -ffp-contract=off like every kernel file: the only fused operation allowed is the
// contract's explicit FMA (BITCOS_FMA), which is written as an intrinsic here; GCC would otherwise fuse the
// BITCOS_FMA=0 form's multiply and add.
//
// Names: x86_ = shared by both paths, avx2_ = AVX2 path, avx512_ = AVX-512 path.
//
// Integer part (exact). Per 64 weights of a row: P = presence word, S = 64 sign bits at the row's cursor
// (the AVX-512 GEMV reads S with one byte-granular load when the row tile is not dense, KERNELS.md §3),
// N = pdep(S, P) (negative lanes), cursor += |P|; the codes are used as u = t + 1 in {0, 1, 2}, the
// unsigned operand of a byte dot product against the raw signed activations q (exact for q = -128 too):
//   AVX-512: u from two masked byte moves (blend by P: 1 -> 2, zero by N); vpdpbusd over 64-byte chunks
//     gives dword m = sum over j % 64 in [4m, 4m+4), so the contract's lane l (j % 32 in [4l, 4l+4)) is
//     dword l + dword l+8 ("fold"). Four vpdpbusd per Q8_K block go into one register; the half-0 partial
//     (after the first two) is kept for blocks whose two unit scales differ (G128, B128).
//   AVX2: u from P and N expanded to bytes (broadcast, pshufb, and, cmpeq); vpmaddubsw over 32-byte chunks,
//     summed in int16 (|word| <= 8 * 512), then vpmaddwd(., 1) gives the 8 contract lanes directly.
// Minus the 32-position activation sums of the block (a column property, staged once per tile and chunk).
// Float part: one 8-lane FMA (two for a block whose two 128-weight units have different fp16 scales: G128,
// B128) per block, the final reduction in the contract's order. AVX-512 keeps two 8-lane accumulators in
// one zmm: two rows against one column (GEMV) or one row against two columns (several columns), so the
// fold, conversion and FMA serve two accumulators per instruction; every lane is still exactly the
// contract's operation.
// Each path splits a tile of rows x columns into a GEMV (one column: avx2_gemv_tile, avx512_gemv_tile) and
// a GEMM (several columns: avx2_gemm_tile, avx512_gemm_tile).
// GEMV (one column) decodes straight into the dot products (AVX-512: two rows interleaved, rows r and
// r + nrh, so that the bitmap and sign reads stay four sequential streams, or adjacent rows when rows are
// short; KERNELS.md §5, memory). With several columns each row's codes are decoded once and reused for
// every column of the tile: AVX-512 block by block in registers (all column pairs before the next block),
// AVX2 a chunk at a time into a code buffer.
//
// Descriptor (bitcos_rows, bitcos-kernels.h): every variant, told apart by where its scales are, not by its
// variant (x86_shape_of: enum x86_scale_mode). A row with a partial last unit (k % 128 != 0) reads that
// unit's (k % 128) / 8 bitmap bytes only once per tile, into a zero-filled copy of the row's last Q8_K
// block (x86_copy_last); the decode then reads 16 bytes per unit from the copy as from any block. A
// descriptor these paths do not cover (x86_covered) runs the generic kernel.
#include "bitcos-kernels.h"

#if defined(__AVX2__) && !(defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)))
// AVX2 targets these kernels do not cover: 32-bit x86 (they need 64-bit GPRs for pdep/kmov on 64-bit words)
// and compilers without GCC builtins/attributes (MSVC). Keep the symbols the header declares so
// bitcos_mm_best() links, and run the reference.
void bitcos_mm_avx2(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                    float * const * dst) {
    bitcos_mm_generic(w, nr, y, nc, dst);
}
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
void bitcos_mm_avx512(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                      float * const * dst) {
    bitcos_mm_generic(w, nr, y, nc, dst);
}
#endif
#elif defined(__x86_64__) && defined(__AVX2__)

#include <immintrin.h>
#include <string.h>

#if BITCOS_FMA && !defined(__FMA__)
#error "BITCOS_FMA=1 needs FMA instructions in the x86 kernels: compile with -mfma (or -DBITCOS_FMA=0)"
#endif

#define X86_ALWAYS_INLINE static inline __attribute__((always_inline))
#define X86_CHUNK_BLOCKS 8               // Q8_K blocks per chunk (2048 weights): staging granularity
#define X86_TILE_COLS    8               // activation columns per tile
#define X86_TILE_ROWS    32              // rows per tile (amortises the staging of the columns)
// GEMV memory order (docs/KERNELS.md §5): a row (AVX2) or a row pair (AVX-512) walks up to
// X86_GEMV_SPAN_CHUNKS chunks before the next, so the bitmap and the sign pool are read as a few sequential
// streams through the row tile; the bitmap is also prefetched X86_BITMAP_PREFETCH_BYTES bytes ahead of each
// row's position (0: no prefetch).
#define X86_GEMV_SPAN_CHUNKS 8           // chunks (16384 weights) of a column staged at once
// Rows of at most this many bitmap bytes (16 per 128 weights: k <= 4096) pair adjacent rows in the AVX-512 GEMV
// (avx512_gemv_pairing_of)
#ifndef AVX512_GEMV_ADJACENT_ROW_BYTES
#define AVX512_GEMV_ADJACENT_ROW_BYTES 512
#endif
#ifndef X86_BITMAP_PREFETCH_BYTES
#define X86_BITMAP_PREFETCH_BYTES 512
#endif

// Layout facts (bitcos-format.h) the decode relies on. A unit's bitmap is two little-endian u64 presence
// words (word 1 at X86_WORD_BYTES); a Q8_K block covers two 128-weight units; v1 G128 puts each unit's
// fp16 scale right after its bitmap, v2 rows are bitmaps back to back.
#define X86_WORD_BYTES sizeof(uint64_t)
#define X86_UNIT_BYTES BITCOS_BITMAP_BYTES             // unit stride of every variant but v1 G128
#define X86_G128_BYTES sizeof(block_bitcos_g128)       // unit stride of v1 G128
_Static_assert(BITCOS_BITMAP_BYTES == 2 * sizeof(uint64_t), "a unit's bitmap is two u64 presence words");
_Static_assert(offsetof(block_bitcos_g128, bits) == 0 && offsetof(block_bitcos_g128, d) == BITCOS_BITMAP_BYTES,
               "a G128 block is its bitmap, then its scale");
_Static_assert(sizeof(block_bitcos_pt) == X86_UNIT_BYTES, "a v1 PT block is its bitmap alone");
_Static_assert(2 * QK_BITCOS == sizeof(((const bitcos_q8_K *)0)->qs), "a Q8_K block is two 128-weight units");
_Static_assert(sizeof(((const block_bitcos_g128 *)0)->d) == sizeof(uint16_t), "a block scale is one fp16");

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
        if (src & 1) out |= m & (~m + 1);
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
    *cursor = pos + (uint64_t)__builtin_popcountll(p);
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
    const uint64_t n   = (uint64_t)__builtin_popcountll(p);
    *cursor = pos + n;
    uint64_t s = x86_load_u64(pool + (pos >> 3)) >> (pos & 7);
    if (checked && __builtin_expect(n > 57, 0)) s = x86_sign_window(pool, pos);
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
#define X86_CONTRACT_FMA(ps, a, b, c) ps##_fmadd_ps(a, b, c)
#else
#define X86_CONTRACT_FMA(ps, a, b, c) ps##_add_ps(ps##_mul_ps(a, b), c)
#endif

// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), the contract's final reduction.
X86_ALWAYS_INLINE float x86_reduce8(__m256 a) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));  // a_l + a_{l+4}
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                                    // s0+s2, s1+s3
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// 8 vectors of 8 int32 -> one vector of the 8 totals, in input order.
X86_ALWAYS_INLINE __m256i x86_totals8(const __m256i x[8]) {
    const __m256i h01 = _mm256_hadd_epi32(x[0], x[1]);
    const __m256i h23 = _mm256_hadd_epi32(x[2], x[3]);
    const __m256i h45 = _mm256_hadd_epi32(x[4], x[5]);
    const __m256i h67 = _mm256_hadd_epi32(x[6], x[7]);
    const __m256i k03 = _mm256_hadd_epi32(h01, h23);    // per 128-bit lane: x0..x3 partials
    const __m256i k47 = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(k03, k47, 0x20), _mm256_permute2x128_si256(k03, k47, 0x31));
}

// The 8 sums of 32 consecutive activations of a Q8_K block (lane l: positions 32l .. 32l+31; lanes 4..7
// zero when the block has only its first half in the matrix): the contract's subtracted term.
X86_ALWAYS_INLINE __m256i x86_block_qsums(const int8_t * qs, int halves) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256i v[8];
    for (int i = 0; i < 8; ++i) {
        v[i] = i < 4*halves
             ? _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, _mm256_loadu_si256((const __m256i *)(qs + 32*i))), ones16)
             : _mm256_setzero_si256();
    }
    return x86_totals8(v);
}

// Number of 128-weight units of a Q8_K block's halves present in a row of nb units: 2, or 1 for the last
// Q8_K block of a row with an odd number of units (a partial last unit counts as one).
X86_ALWAYS_INLINE int x86_halves(int64_t b, int64_t nb) {
    return 2*b + 1 < nb ? 2 : 1;
}

// Q8_K blocks of the chunk starting at Q8_K block b0 of a row of nby.
X86_ALWAYS_INLINE int x86_chunk_blocks(int64_t b0, int64_t nby) {
    return (int)(nby - b0 < X86_CHUNK_BLOCKS ? nby - b0 : X86_CHUNK_BLOCKS);
}

// Staged data of one activation column for one chunk of blocks.
typedef struct {
    __m256i        qsum[X86_CHUNK_BLOCKS];   // x86_block_qsums of each block
    float          yd[X86_CHUNK_BLOCKS];     // y.d
    float          dpt[X86_CHUNK_BLOCKS];    // X86_SCALE_MATRIX: y.d * the tile's scale
    const int8_t * qs[X86_CHUNK_BLOCKS];     // the block's activations
} x86_col_chunk;

X86_ALWAYS_INLINE void x86_stage_column(const bitcos_q8_K * yc, int64_t b0, int nbk, int64_t nb, float scale,
                                        x86_col_chunk * cc) {
    for (int j = 0; j < nbk; ++j) {
        const int64_t b = b0 + j;
        cc->qsum[j] = x86_block_qsums(yc[b].qs, x86_halves(b, nb));
        cc->yd[j]   = yc[b].d;
        cc->dpt[j]  = yc[b].d * scale;
        cc->qs[j]   = yc[b].qs;
    }
}

// x86_stage_column for each of the nct columns y[0 .. nct) of a GEMM tile, into cc[0 .. nct).
X86_ALWAYS_INLINE void x86_stage_columns(const bitcos_q8_K * const * y, int nct, int64_t b0, int nbk, int64_t nb,
                                         float scale, x86_col_chunk * cc) {
    for (int c = 0; c < nct; ++c) x86_stage_column(y[c], b0, nbk, nb, scale, &cc[c]);
}

// Where the float part finds a row's scale for a Q8_K block (bitcos-kernels.h, "Row scales" / "Block
// scales"). A call's descriptor gives ROW (row scales), BLOCK, UNIT_ADJ or UNIT (block scales); a tile whose
// row scales are all the same value (bitwise: every PT and MATRIX tile) runs as MATRIX, which stages
// y.d * scale once per column block instead of multiplying per row (D is the same float either way).
enum x86_scale_mode {
    X86_SCALE_MATRIX   = 0,  // one fp32 scale for the tile's rows: D = staged y.d * scale
    X86_SCALE_ROW      = 1,  // fp32 scale per row: D = y.d * scale of the row
    X86_SCALE_BLOCK    = 2,  // fp16 scale per Q8_K block (block_scale_shift 1: B256); e0 == e1, one FMA
    X86_SCALE_UNIT_ADJ = 3,  // fp16 scale per unit, adjacent (scale_stride 2: B128); e0, e1 may differ
    X86_SCALE_UNIT     = 4,  // fp16 scale per unit inside the v1 G128 blocks (the 2 bytes before each are bitmap)
    X86_SCALE_MODES
};

// Runs CALL(mode) with the scale mode as a compile-time constant: the hot loops are instantiated per mode
// (no per-block dispatch; v1 G128 also gets its unit stride as a constant).
#define X86_MODE_DISPATCH(mode, CALL)                                  \
    switch (mode) {                                                    \
    case X86_SCALE_MATRIX:   CALL(X86_SCALE_MATRIX);   break;          \
    case X86_SCALE_ROW:      CALL(X86_SCALE_ROW);      break;          \
    case X86_SCALE_BLOCK:    CALL(X86_SCALE_BLOCK);    break;          \
    case X86_SCALE_UNIT_ADJ: CALL(X86_SCALE_UNIT_ADJ); break;          \
    default:                 CALL(X86_SCALE_UNIT);     break;          \
    }

// Unit stride in a mode: v1 G128's blocks (x86_covered), else bitmaps back to back.
#define X86_MODE_UNIT_BYTES(mode) ((mode) == X86_SCALE_UNIT ? X86_G128_BYTES : X86_UNIT_BYTES)

// Shape of one call, shared by the tile functions of both paths.
typedef struct {
    int64_t nb;      // 128-weight units per row (the last one partial when tail != 0)
    int64_t nby;     // Q8_K blocks per row
    int64_t nfull;   // leading Q8_K blocks with two whole units, read in place (the rest: the row's last block)
    size_t  tail;    // bitmap bytes of a partial last unit ((k % 128) / 8; 0: none)
    size_t  ub;      // unit stride: X86_UNIT_BYTES, or X86_G128_BYTES in mode X86_SCALE_UNIT
    size_t  sstride; // block modes: bytes from one scale to the next along a row (scale_stride)
    int     mode;    // enum x86_scale_mode (ROW: a tile may run as MATRIX, x86_tile_mode)
} x86_shape;

X86_ALWAYS_INLINE x86_shape x86_shape_of(const bitcos_rows * w) {
    x86_shape s;
    s.nb      = (w->k + QK_BITCOS - 1) / QK_BITCOS;
    s.nby     = (s.nb + 1) / 2;
    s.tail    = (size_t)(w->k % QK_BITCOS) / 8;
    s.nfull   = s.tail ? s.nby - 1 : s.nb / 2;
    s.ub      = w->unit_bytes;
    s.sstride = w->scale_stride;
    s.mode    = w->row_scale != NULL                 ? X86_SCALE_ROW
              : w->block_scale_shift != 0            ? X86_SCALE_BLOCK
              : w->scale_stride == sizeof(uint16_t)  ? X86_SCALE_UNIT_ADJ
              :                                        X86_SCALE_UNIT;
    return s;
}

// 1 when these paths cover the descriptor: bitmaps at the unit stride of 16 (every variant but v1 G128),
// with row scales, or block scales per 256 at any stride or per 128 adjacent, and a partial last unit only
// with row scales (block scales need k % 128 == 0 anyway); or exactly the v1 G128 layout, each unit's scale
// right after its bitmap (what makes the AVX-512 path's 4-byte load ending at a scale stay in its block).
// Anything else runs the generic kernel.
X86_ALWAYS_INLINE int x86_covered(const bitcos_rows * w, x86_shape sh) {
    if (sh.mode != X86_SCALE_ROW && sh.tail != 0) {
        return 0;
    }
    if (sh.mode == X86_SCALE_UNIT) {
        return w->unit_bytes == X86_G128_BYTES && w->scale_stride == X86_G128_BYTES &&
               w->scale_row_bytes == w->row_bytes && w->block_scale == w->bits + offsetof(block_bitcos_g128, d);
    }
    return w->unit_bytes == X86_UNIT_BYTES;
}

// The tile's scale mode: the call's, except that a ROW tile whose rows r0 .. r0 + nrt all have the same
// scale (bitwise) is MATRIX, with that scale in *scale (0 otherwise: then the staged y.d * scale is unused).
X86_ALWAYS_INLINE int x86_tile_mode(const bitcos_rows * w, x86_shape sh, int64_t r0, int nrt, float * scale) {
    *scale = 0.0f;
    if (sh.mode != X86_SCALE_ROW) {
        return sh.mode;
    }
    // 8 scales per compare: the check is a per-tile cost, which a 16 x 2048 GEMV felt as 2 % done one by one
    const float * rs = w->row_scale + r0;
    const __m256i first = _mm256_castps_si256(_mm256_set1_ps(rs[0]));
    __m256i diff = _mm256_setzero_si256();
    int r = 0;
    for (; r + 8 <= nrt; r += 8) {
        diff = _mm256_or_si256(diff, _mm256_xor_si256(first, _mm256_loadu_si256((const __m256i *)(rs + r))));
    }
    uint32_t d = 0, f, v;
    memcpy(&f, rs, sizeof f);
    for (; r < nrt; ++r) {
        memcpy(&v, rs + r, sizeof v);
        d |= v ^ f;
    }
    if (d != 0 || !_mm256_testz_si256(diff, diff)) {
        return X86_SCALE_ROW;
    }
    *scale = rs[0];
    return X86_SCALE_MATRIX;
}

// Bitmap of unit 0 of row r of the run.
X86_ALWAYS_INLINE const uint8_t * x86_row(const bitcos_rows * w, int64_t r) {
    return w->bits + (size_t)r * w->row_bytes;
}

// Scale of unit 0 of row r of the run (block modes only: block_scale is NULL with row scales).
X86_ALWAYS_INLINE const uint8_t * x86_row_scales(const bitcos_rows * w, int64_t r) {
    return w->block_scale + (size_t)r * w->scale_row_bytes;
}

// A row's last Q8_K block when its last unit is partial (tail != 0): a zero-filled copy of the row's bytes
// from the block's first unit on, (units - 1) * ub + tail of them, at most X86_LAST_BYTES. The decode reads
// the copy's 16 bytes per unit like any block's; the bits past k are zero (absent weights, as the contract
// asks), and the row's bitmap is not read past its end (the next row's bytes, or the end of the tensor).
#define X86_LAST_BYTES (2 * X86_UNIT_BYTES)
typedef struct {
    _Alignas(16) uint8_t b[X86_LAST_BYTES];
} x86_last_block;

// The copies of the rows r0 .. r0 + nrt of a tile, into last[0 .. nrt) (nothing to do without a tail).
X86_ALWAYS_INLINE void x86_copy_last(const bitcos_rows * w, x86_shape sh, int64_t r0, int nrt, x86_last_block * last) {
    if (sh.tail == 0) {
        return;
    }
    const int64_t u0 = 2 * (sh.nby - 1);                                  // first unit of the last block
    const size_t  n  = (size_t)(sh.nb - 1 - u0) * X86_UNIT_BYTES + sh.tail;
    for (int r = 0; r < nrt; ++r) {
        memset(last[r].b, 0, sizeof last[r].b);
        memcpy(last[r].b, x86_row(w, r0 + r) + (size_t)u0 * X86_UNIT_BYTES, n);
    }
}

// Bitmap of Q8_K block b of a row (its first unit; the second is ub bytes on): in place, or the row's copy
// for the last block of a row with a partial unit.
X86_ALWAYS_INLINE const uint8_t * x86_block_bits(x86_shape sh, const uint8_t * row, const uint8_t * last, int64_t b) {
    return (sh.tail != 0 && b == sh.nby - 1) ? last : row + (size_t)(2*b) * sh.ub;
}

// Sign cursors of the tile's rows r0 .. r0 + nrt: pool bit of each row's first sign.
X86_ALWAYS_INLINE void x86_load_cursors(const bitcos_rows * w, int64_t r0, int nrt, uint64_t * cursor) {
    for (int r = 0; r < nrt; ++r) cursor[r] = w->sign_pos[r0 + r];
}

// A kernel's two tile routines: rows r0 .. r0 + nrt (nrt <= X86_TILE_ROWS) against one column yc (GEMV; dc
// points at the outputs of those rows), or against nct (2 .. X86_TILE_COLS) columns y[0 .. nct) (GEMM;
// outputs dst[c][r0 ..]).
typedef void (*x86_gemv_tile_fn)(const bitcos_rows * w, int64_t r0, int nrt, const bitcos_q8_K * yc, float * dc);
typedef void (*x86_gemm_tile_fn)(const bitcos_rows * w, int64_t r0, int nrt, const bitcos_q8_K * const * y, int nct,
                                 float * const * dst);

// bitcos_mm_fn over tiles of X86_TILE_ROWS rows x X86_TILE_COLS columns; a tile of one column (nc = 1, or
// the last tile of nc = 8m + 1) is a GEMV. A descriptor the paths do not cover runs the generic kernel.
X86_ALWAYS_INLINE void x86_tiles(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                                 float * const * dst, x86_gemv_tile_fn gemv, x86_gemm_tile_fn gemm) {
    if (!x86_covered(w, x86_shape_of(w))) {
        bitcos_mm_generic(w, nr, y, nc, dst);
        return;
    }
    for (int64_t r0 = 0; r0 < nr; r0 += X86_TILE_ROWS) {
        const int nrt = (int)(nr - r0 < X86_TILE_ROWS ? nr - r0 : X86_TILE_ROWS);
        for (int64_t c0 = 0; c0 < nc; c0 += X86_TILE_COLS) {
            const int nct = (int)(nc - c0 < X86_TILE_COLS ? nc - c0 : X86_TILE_COLS);
            if (nct == 1) gemv(w, r0, nrt, y[c0], dst[c0] + r0);
            else          gemm(w, r0, nrt, y + c0, nct, dst + c0);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// AVX2
// ---------------------------------------------------------------------------------------------------------

// The contract's FMA(a, b, c), 8 lanes.
X86_ALWAYS_INLINE __m256 avx2_fma8(__m256 a, __m256 b, __m256 c) {
    return X86_CONTRACT_FMA(_mm256, a, b, c);
}

// Codes u = t + 1 in {0, 1, 2} of 64 weights from the presence word at pbits and the negative-lane word n,
// as two vectors of 32. Each word is broadcast once, pshufb copies byte i of the word to lanes 8i .. 8i+7,
// and-ing with 1, 2, 4, .. 128 and cmpeq give -1 where lane j's bit is set; u = (1 - pm) & ~nm.
X86_ALWAYS_INLINE void avx2_codes64(const uint8_t * pbits, uint64_t n, __m256i * u0, __m256i * u1) {
    const __m256i idx_lo = _mm256_setr_epi8(0,0,0,0,0,0,0,0, 1,1,1,1,1,1,1,1, 2,2,2,2,2,2,2,2, 3,3,3,3,3,3,3,3);
    const __m256i idx_hi = _mm256_setr_epi8(4,4,4,4,4,4,4,4, 5,5,5,5,5,5,5,5, 6,6,6,6,6,6,6,6, 7,7,7,7,7,7,7,7);
    const __m256i sel    = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i one    = _mm256_set1_epi8(1);
    const __m256i bp     = _mm256_set1_epi64x((long long)x86_load_u64(pbits));
    const __m256i bn     = _mm256_set1_epi64x((long long)n);
    const __m256i pm0 = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(bp, idx_lo), sel), sel);
    const __m256i nm0 = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(bn, idx_lo), sel), sel);
    const __m256i pm1 = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(bp, idx_hi), sel), sel);
    const __m256i nm1 = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(bn, idx_hi), sel), sel);
    *u0 = _mm256_andnot_si256(nm0, _mm256_sub_epi8(one, pm0));
    *u1 = _mm256_andnot_si256(nm1, _mm256_sub_epi8(one, pm1));
}

// Decodes the 128 codes of one unit (its bitmap at blk) into u[0..3].
X86_ALWAYS_INLINE void avx2_decode_block(const uint8_t * blk, const uint8_t * pool, uint64_t * cursor, __m256i u[4]) {
    const uint64_t n0 = x86_negatives(x86_load_u64(blk), pool, cursor);
    const uint64_t n1 = x86_negatives(x86_load_u64(blk + X86_WORD_BYTES), pool, cursor);
    avx2_codes64(blk,                  n0, &u[0], &u[1]);
    avx2_codes64(blk + X86_WORD_BYTES, n1, &u[2], &u[3]);
}

// int16 lanes of sum u*q over the 128 weights of one unit (4 x 32): |word| <= 4 * 512.
X86_ALWAYS_INLINE __m256i avx2_dot_block(const __m256i u[4], const int8_t * q) {
    __m256i s = _mm256_maddubs_epi16(u[0], _mm256_loadu_si256((const __m256i *)q));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(u[1], _mm256_loadu_si256((const __m256i *)(q + 32))));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(u[2], _mm256_loadu_si256((const __m256i *)(q + 64))));
    return _mm256_add_epi16(s, _mm256_maddubs_epi16(u[3], _mm256_loadu_si256((const __m256i *)(q + 96))));
}

// A row's scale source for the float part: the scale of its unit 0 (BLOCK, UNIT_ADJ) or its fp32 scale (ROW);
// v1 G128's are read through the row's bitmap pointer.
typedef struct {
    const uint8_t * block;
    float           row;
} x86_row_scale;

X86_ALWAYS_INLINE x86_row_scale x86_row_scale_of(const bitcos_rows * w, int mode, int64_t r) {
    x86_row_scale s = { NULL, 0.0f };
    if (mode == X86_SCALE_ROW) s.row = w->row_scale[r];
    else if (mode == X86_SCALE_BLOCK || mode == X86_SCALE_UNIT_ADJ) s.block = x86_row_scales(w, r);
    return s;
}

// Float part of one Q8_K block b for one (row, column): s0 / s are the int16 dot products of half 0 / the
// whole block (s = s0 when the block has one half), per the contract, with the tile's scale mode.
X86_ALWAYS_INLINE __m256 avx2_block_float(__m256i s0, __m256i s, __m256i qsum, x86_shape sh, const int mode,
                                          const uint8_t * row, x86_row_scale rs, int64_t b, int halves, float yd,
                                          float dpt, __m256 acc) {
    const __m256i ones16 = _mm256_set1_epi16(1);
    const __m256i lf = _mm256_sub_epi32(_mm256_madd_epi16(s, ones16), qsum);
    if (mode == X86_SCALE_MATRIX) {
        return avx2_fma8(_mm256_cvtepi32_ps(lf), _mm256_set1_ps(dpt), acc);
    }
    if (mode == X86_SCALE_ROW) {
        return avx2_fma8(_mm256_cvtepi32_ps(lf), _mm256_set1_ps(yd * rs.row), acc);
    }
    if (mode == X86_SCALE_BLOCK) {
        const float e = x86_fp16_to_fp32(x86_load_u16(rs.block + (size_t)b * sh.sstride));
        return avx2_fma8(_mm256_cvtepi32_ps(lf), _mm256_set1_ps(yd * e), acc);
    }
    // v1 G128: the scale after each unit's bitmap, addressed from the row (x86_covered: block_scale is the
    // row's bits + 16, at the block stride), which the bitmap reads already hold; B128: adjacent fp16
    const size_t    st = mode == X86_SCALE_UNIT ? X86_G128_BYTES : sizeof(uint16_t);
    const uint8_t * p0 = mode == X86_SCALE_UNIT ? row + (size_t)(2*b) * X86_G128_BYTES + offsetof(block_bitcos_g128, d)
                                                : rs.block + (size_t)(2*b) * sizeof(uint16_t);
    const uint16_t e0 = x86_load_u16(p0);
    const uint16_t e1 = halves == 2 ? x86_load_u16(p0 + st) : e0;
    const __m256 d0 = _mm256_set1_ps(yd * x86_fp16_to_fp32(e0));
    if (e0 == e1) {
        return avx2_fma8(_mm256_cvtepi32_ps(lf), d0, acc);
    }
    // half 0 subtracts the sums of positions 0..127 (lanes 0..3), half 1 those of 128..255 (lanes 4..7)
    const __m256i l0 = _mm256_sub_epi32(_mm256_madd_epi16(s0, ones16), _mm256_blend_epi32(qsum, _mm256_setzero_si256(), 0xF0));
    const __m256i l1 = _mm256_sub_epi32(lf, l0);
    acc = avx2_fma8(_mm256_cvtepi32_ps(l0), d0, acc);
    return avx2_fma8(_mm256_cvtepi32_ps(l1), _mm256_set1_ps(yd * x86_fp16_to_fp32(e1)), acc);
}

// GEMV of one Q8_K block b of a row (bitmap of its first unit at blk; its column data block j of chunk ch).
X86_ALWAYS_INLINE __m256 avx2_gemv_block(const bitcos_rows * w, x86_shape sh, const int mode, const uint8_t * row,
                                         const uint8_t * blk, x86_row_scale rs, int64_t b, const int halves,
                                         const x86_col_chunk * ch, int j, uint64_t * cur, __m256 acc) {
    __m256i u[4];
#if X86_BITMAP_PREFETCH_BYTES
    _mm_prefetch((const char *)(row + (size_t)(2*b) * sh.ub + X86_BITMAP_PREFETCH_BYTES), _MM_HINT_T0);
#endif
    avx2_decode_block(blk, w->pool, cur, u);
    const __m256i s0v = avx2_dot_block(u, ch->qs[j]);
    __m256i sv = s0v;
    if (halves == 2) {
        avx2_decode_block(blk + sh.ub, w->pool, cur, u);
        sv = _mm256_add_epi16(s0v, avx2_dot_block(u, ch->qs[j] + QK_BITCOS));
    }
    return avx2_block_float(s0v, sv, ch->qsum[j], sh, mode, row, rs, b, halves, ch->yd[j], ch->dpt[j], acc);
}

// GEMV, one row over the chunks [b0 .. s1) of a span (chunk i staged in cc[i]): decodes straight into the
// dot products. The blocks before sh.nfull have two whole units in place (no halves test, no last-block
// test); the row's last block may have one unit, or come from the row's copy `last` (x86_copy_last).
X86_ALWAYS_INLINE __m256 avx2_gemv_row_span(const bitcos_rows * w, x86_shape sh, const int mode, const uint8_t * row,
                                            const uint8_t * last, x86_row_scale rs, uint64_t * cursor,
                                            int64_t s0, int64_t s1, const x86_col_chunk * cc, __m256 acc) {
    sh.ub = X86_MODE_UNIT_BYTES(mode);
    uint64_t cur = *cursor;
    for (int64_t b0 = s0; b0 < s1; b0 += X86_CHUNK_BLOCKS) {
        const x86_col_chunk * ch = &cc[(b0 - s0) / X86_CHUNK_BLOCKS];
        const int nbk = x86_chunk_blocks(b0, sh.nby);
        const int nd  = sh.nfull - b0 >= nbk ? nbk : (int)(sh.nfull - b0);   // blocks with two whole units
        int j = 0;
        for (; j < nd; ++j) {
            const int64_t b = b0 + j;
            acc = avx2_gemv_block(w, sh, mode, row, row + (size_t)(2*b) * sh.ub, rs, b, 2, ch, j, &cur, acc);
        }
        for (; j < nbk; ++j) {
            const int64_t b = b0 + j;
            acc = avx2_gemv_block(w, sh, mode, row, x86_block_bits(sh, row, last, b), rs, b, x86_halves(b, sh.nb), ch,
                                  j, &cur, acc);
        }
    }
    *cursor = cur;
    return acc;
}

// GEMV of the nrt rows from r0 against one column yc (dc: the rows' outputs): one row at a time over a span
// of up to X86_GEMV_SPAN_CHUNKS chunks (the column staged in cc[0 ..]), so the bitmap and the sign pool are
// each read as one sequential stream through the tile (KERNELS.md §5, memory).
static void avx2_gemv_tile(const bitcos_rows * w, int64_t r0, int nrt, const bitcos_q8_K * yc, float * dc) {
    const x86_shape sh = x86_shape_of(w);
    float scale;
    const int mode = x86_tile_mode(w, sh, r0, nrt, &scale);
    _Alignas(64) x86_col_chunk cc[X86_GEMV_SPAN_CHUNKS];
    _Alignas(64) __m256        acc[X86_TILE_ROWS];
    x86_last_block             last[X86_TILE_ROWS];
    uint64_t cursor[X86_TILE_ROWS];
    x86_load_cursors(w, r0, nrt, cursor);
    x86_copy_last(w, sh, r0, nrt, last);
    for (int r = 0; r < nrt; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t s0 = 0; s0 < sh.nby; s0 += X86_GEMV_SPAN_CHUNKS * X86_CHUNK_BLOCKS) {
        const int64_t s1 = sh.nby - s0 < X86_GEMV_SPAN_CHUNKS * X86_CHUNK_BLOCKS ? sh.nby : s0 + X86_GEMV_SPAN_CHUNKS * X86_CHUNK_BLOCKS;
        for (int64_t b0 = s0; b0 < s1; b0 += X86_CHUNK_BLOCKS) {
            x86_stage_column(yc, b0, x86_chunk_blocks(b0, sh.nby), sh.nb, scale, &cc[(b0 - s0) / X86_CHUNK_BLOCKS]);
        }
        for (int r = 0; r < nrt; ++r) {
            const x86_row_scale rs = x86_row_scale_of(w, mode, r0 + r);
#define AVX2_GEMV_ROW(m) acc[r] = avx2_gemv_row_span(w, sh, m, x86_row(w, r0 + r), last[r].b, rs, &cursor[r], s0, s1, cc, acc[r])
            X86_MODE_DISPATCH(mode, AVX2_GEMV_ROW)
#undef AVX2_GEMV_ROW
        }
    }
    for (int r = 0; r < nrt; ++r) dc[r] = x86_reduce8(acc[r]);
}

// One row's decoded chunk (ubuf: nbk blocks from b0) against the nct columns of the tile (acc[c]: the row's
// accumulator of column c).
X86_ALWAYS_INLINE void avx2_gemm_cols(x86_shape sh, const int mode, const uint8_t * row, x86_row_scale rs, int64_t b0, int nbk,
                                      const __m256i (*ubuf)[8], const x86_col_chunk * cc, int nct, __m256 * acc) {
    for (int c = 0; c < nct; ++c) {
        __m256 a = b0 == 0 ? _mm256_setzero_ps() : acc[c];    // the contract's acc starts at +0
        for (int j = 0; j < nbk; ++j) {
            const int64_t b = b0 + j;
            const int halves = x86_halves(b, sh.nb);
            const __m256i s0 = avx2_dot_block(ubuf[j], cc[c].qs[j]);
            const __m256i s  = halves == 2 ? _mm256_add_epi16(s0, avx2_dot_block(ubuf[j] + 4, cc[c].qs[j] + QK_BITCOS)) : s0;
            a = avx2_block_float(s0, s, cc[c].qsum[j], sh, mode, row, rs, b, halves, cc[c].yd[j], cc[c].dpt[j], a);
        }
        acc[c] = a;
    }
}

// GEMM of the nrt rows from r0 against the nct (<= X86_TILE_COLS) columns y[0 .. nct) (outputs dst[c][r0 ..]):
// chunk by chunk, each row's chunk is decoded once into a code buffer, then serves every column.
static void avx2_gemm_tile(const bitcos_rows * w, int64_t r0, int nrt, const bitcos_q8_K * const * y, int nct,
                           float * const * dst) {
    const x86_shape sh = x86_shape_of(w);
    float scale;
    const int mode = x86_tile_mode(w, sh, r0, nrt, &scale);
    _Alignas(64) x86_col_chunk cc[X86_TILE_COLS];
    _Alignas(64) __m256i       ubuf[X86_CHUNK_BLOCKS][8];
    _Alignas(64) __m256        acc[X86_TILE_ROWS][X86_TILE_COLS];
    x86_last_block             last[X86_TILE_ROWS];
    uint64_t cursor[X86_TILE_ROWS];
    x86_load_cursors(w, r0, nrt, cursor);
    x86_copy_last(w, sh, r0, nrt, last);
    for (int64_t b0 = 0; b0 < sh.nby; b0 += X86_CHUNK_BLOCKS) {
        const int nbk = x86_chunk_blocks(b0, sh.nby);
        x86_stage_columns(y, nct, b0, nbk, sh.nb, scale, cc);
        for (int r = 0; r < nrt; ++r) {
            const uint8_t * row = x86_row(w, r0 + r);
            const x86_row_scale rs = x86_row_scale_of(w, mode, r0 + r);
            for (int j = 0; j < nbk; ++j) {
                const int64_t b = b0 + j;
                const uint8_t * blk = x86_block_bits(sh, row, last[r].b, b);
                avx2_decode_block(blk, w->pool, &cursor[r], ubuf[j]);
                if (x86_halves(b, sh.nb) == 2) avx2_decode_block(blk + sh.ub, w->pool, &cursor[r], ubuf[j] + 4);
            }
#define AVX2_GEMM_COLS(m) avx2_gemm_cols(sh, m, row, rs, b0, nbk, ubuf, cc, nct, acc[r])
            X86_MODE_DISPATCH(mode, AVX2_GEMM_COLS)
#undef AVX2_GEMM_COLS
        }
    }
    for (int r = 0; r < nrt; ++r) {
        for (int c = 0; c < nct; ++c) dst[c][r0 + r] = x86_reduce8(acc[r][c]);
    }
}

void bitcos_mm_avx2(const bitcos_rows * w, int64_t nr,
                    const bitcos_q8_K * const * y, int64_t nc, float * const * dst) {
    x86_tiles(w, nr, y, nc, dst, avx2_gemv_tile, avx2_gemm_tile);
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)

// acc + sum over 4-byte groups of u(u8) * q(s8), per int32 lane.
X86_ALWAYS_INLINE __m512i avx512_dpbusd(__m512i acc, __m512i u, __m512i q) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, u, q);
#else
    const __m512i p16 = _mm512_maddubs_epi16(u, q);        // |pair| <= 2 * 256: no saturation
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p16, _mm512_set1_epi16(1)));
#endif
}

// The contract's FMA(a, b, c), 16 lanes.
X86_ALWAYS_INLINE __m512 avx512_fma16(__m512 a, __m512 b, __m512 c) {
    return X86_CONTRACT_FMA(_mm512, a, b, c);
}

// Sign windows of the AVX-512 decode (KERNELS.md §3): two aligned qwords (any word, x86_negatives), one
// byte-granular load with the dense-word fallback (x86_negatives_byte, checked), the same load with no
// per-word test (only for words known to hold at most 57 present weights).
enum avx512_sign_window {
    AVX512_SIGN_WINDOW_QWORDS    = 0,
    AVX512_SIGN_WINDOW_BYTE      = 1,
    AVX512_SIGN_WINDOW_UNCHECKED = 2,
    AVX512_SIGN_WINDOWS
};

// u = t + 1 of 64 weights: two masked byte moves (blend by P: 1 -> 2, then zero the negative lanes N).
// The P mask is loaded from memory (kmovq k, m64) instead of moved from the GPR that popcount reads:
// 64-bit GPR -> mask writes bound the GEMV on Zen 5 (2.21 vs 2.31 ticks per 32 weights, G128 with equal
// halves; the multi-column path is within 3 % either way). Inline asm, because GCC merges _load_mask64
// with the GPR load of the same word.
X86_ALWAYS_INLINE __m512i avx512_codes64w(const uint8_t * bits, const uint8_t * pool, uint64_t * cursor, const int win) {
    const uint64_t p = x86_load_u64(bits);
    const uint64_t n = win == AVX512_SIGN_WINDOW_QWORDS ? x86_negatives(p, pool, cursor)
                     : x86_negatives_byte(p, pool, cursor, win == AVX512_SIGN_WINDOW_BYTE);
    __mmask64 pm;
    __asm__("kmovq %1, %0" : "=k"(pm) : "m"(*(const uint64_t *)bits));
    return _mm512_mask_mov_epi8(_mm512_mask_blend_epi8(pm, _mm512_set1_epi8(1), _mm512_set1_epi8(2)),
                                _cvtu64_mask64(n), _mm512_setzero_si512());
}

// Half 0 (z0) and the whole (z, = z0 with one half) dword dot products of one Q8_K block's codes
// u[0 .. 2*halves) with its activations q.
X86_ALWAYS_INLINE void avx512_block_dots_u(const __m512i u[4], int halves, const int8_t * q, __m512i * z0, __m512i * z) {
    *z0 = avx512_dpbusd(avx512_dpbusd(_mm512_setzero_si512(), u[0], _mm512_loadu_si512((const void *)q)),
                        u[1], _mm512_loadu_si512((const void *)(q + 64)));
    *z = halves == 2 ? avx512_dpbusd(avx512_dpbusd(*z0, u[2], _mm512_loadu_si512((const void *)(q + QK_BITCOS))),
                                     u[3], _mm512_loadu_si512((const void *)(q + QK_BITCOS + 64)))
                     : *z0;
}

// Decodes the codes of the Q8_K block whose first unit's bitmap is at blk (the second's bb bytes on, when
// halves == 2) into u[0 .. 2*halves), zero for a missing half, with sign window `win`.
X86_ALWAYS_INLINE void avx512_decode_block(const uint8_t * blk, size_t bb, int halves, const uint8_t * pool,
                                           uint64_t * cursor, const int win, __m512i u[4]) {
    u[0] = avx512_codes64w(blk,                  pool, cursor, win);
    u[1] = avx512_codes64w(blk + X86_WORD_BYTES, pool, cursor, win);
    u[2] = u[3] = _mm512_setzero_si512();
    if (halves == 2) {
        u[2] = avx512_codes64w(blk + bb,                  pool, cursor, win);
        u[3] = avx512_codes64w(blk + bb + X86_WORD_BYTES, pool, cursor, win);
    }
}

// [a_l + a_{l+8} for l < 8, b_l + b_{l+8} for l < 8]: the contract lanes of two accumulators side by side.
X86_ALWAYS_INLINE __m512i avx512_fold2(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x44), _mm512_shuffle_i64x2(a, b, 0xEE));
}

X86_ALWAYS_INLINE __m512 avx512_pair_f(float lo, float hi) {
    return _mm512_insertf32x8(_mm512_set1_ps(lo), _mm256_set1_ps(hi), 1);
}

// A row pair's scales for one Q8_K block, in the tile's scale mode (avx512_block_scales): for MATRIX none
// (D is staged); for ROW and BLOCK f = [s(A) x8, s(B) x8]; for UNIT / UNIT_ADJ f = the fp32 scales of half 0,
// e1 those of half 1, split the lanes whose block has e0 != e1 (bitwise).
typedef struct {
    __m512    f;
    __m512    e1;
    __mmask16 split;
} avx512_scales;

// Float part of one block for a pair of accumulators (lanes 0-7: A, 8-15: B). qsum2 holds the 32-position
// sums of A's and B's columns, yd2 their y.d, dpt2 y.d * the tile's scale (MATRIX); sc the pair's scales.
// D = y.d * f, or the staged dpt2. Split lanes take two FMAs; lanes that do not split get (L0 + L1, 0)
// instead of (L0, L1), and FMA(0, D1, acc) = acc exactly (acc is never -0: it starts at +0 and a sum is -0
// only when both operands are).
X86_ALWAYS_INLINE __m512 avx512_block_float(__m512i zA0, __m512i zA, __m512i zB0, __m512i zB, __m512i qsum2,
                                            __m512 yd2, __m512 dpt2, const int mode, const avx512_scales * sc,
                                            __m512 acc) {
    const __m512i lf = _mm512_sub_epi32(avx512_fold2(zA, zB), qsum2);
    if (mode == X86_SCALE_MATRIX) {
        return avx512_fma16(_mm512_cvtepi32_ps(lf), dpt2, acc);
    }
    const __m512 d0 = _mm512_mul_ps(yd2, sc->f);
    if (mode == X86_SCALE_ROW || mode == X86_SCALE_BLOCK || __builtin_expect(sc->split == 0, 1)) {
        return avx512_fma16(_mm512_cvtepi32_ps(lf), d0, acc);
    }
    const __mmask16 split = sc->split;
    const __m512 e1v = sc->e1;
    const __m512i l0 = _mm512_sub_epi32(avx512_fold2(zA0, zB0), _mm512_maskz_mov_epi32(0x0F0F, qsum2));
    const __m512i la = _mm512_mask_mov_epi32(lf, split, l0);
    const __m512i lb = _mm512_maskz_sub_epi32(split, lf, l0);
    const __m512  d1 = _mm512_mul_ps(yd2, e1v);
    acc = avx512_fma16(_mm512_cvtepi32_ps(la), d0, acc);
    return avx512_fma16(_mm512_cvtepi32_ps(lb), d1, acc);
}

// Staged column data in pair form: for GEMV (rows paired) both halves are the same column.
typedef struct {
    __m512i qsum2[X86_CHUNK_BLOCKS];
    __m512  yd2[X86_CHUNK_BLOCKS];
    __m512  dpt2[X86_CHUNK_BLOCKS];     // X86_SCALE_MATRIX: y.d * the tile's scale
} avx512_pair_chunk;

X86_ALWAYS_INLINE void avx512_stage_pair(const x86_col_chunk * a, const x86_col_chunk * b, int nbk, avx512_pair_chunk * pc) {
    for (int j = 0; j < nbk; ++j) {
        pc->qsum2[j] = _mm512_inserti64x4(_mm512_castsi256_si512(a->qsum[j]), b->qsum[j], 1);
        pc->yd2[j]   = avx512_pair_f(a->yd[j], b->yd[j]);
        pc->dpt2[j]  = avx512_pair_f(a->dpt[j], b->dpt[j]);
    }
}

X86_ALWAYS_INLINE void avx512_store_pair(__m512 acc, float * da, float * db) {
    *da = x86_reduce8(_mm512_castps512_ps256(acc));
    if (db) *db = x86_reduce8(_mm512_extractf32x8_ps(acc, 1));
}

// Where a row pair's scales are (lanes 0-7: row A, 8-15: row B; the same row twice in the GEMM): the scale
// of unit 0 of each row (BLOCK, UNIT_ADJ; v1 G128's are read through the bitmap pointers) and the two rows'
// fp32 scales (ROW).
typedef struct {
    const uint8_t * sA;
    const uint8_t * sB;
    __m512          rs2;
} avx512_pair_scale;

X86_ALWAYS_INLINE avx512_pair_scale avx512_pair_scale_of(const bitcos_rows * w, int mode, int64_t ra, int64_t rb) {
    avx512_pair_scale ps = { NULL, NULL, _mm512_setzero_ps() };
    if (mode == X86_SCALE_ROW) {
        ps.rs2 = avx512_pair_f(w->row_scale[ra], w->row_scale[rb]);
    } else if (mode == X86_SCALE_BLOCK || mode == X86_SCALE_UNIT_ADJ) {
        ps.sA = x86_row_scales(w, ra);
        ps.sB = x86_row_scales(w, rb);
    }
    return ps;
}

// v1 G128 (X86_SCALE_UNIT): the scale reads load 32 bits that end with a unit's fp16 scale d: the low half
// is the two bitmap bytes before d, so the load never leaves the block (x86_covered checks the layout).
_Static_assert(offsetof(block_bitcos_g128, d) >= sizeof(uint32_t) - sizeof(uint16_t),
               "the 32-bit load that ends at d must start inside the block");

// fp32 scales of Q8_K block b for a pair of rows from the halves' fp16 words h = [e0(A), e0(B), e1(A),
// e1(B)] at the given 16-bit lanes: e0v = [e0(A) x8, e0(B) x8], e1v likewise, and the lanes whose row has
// e0 != e1 (bitwise; fp16 -> fp32 is injective, so the fp32 bits compare the same).
X86_ALWAYS_INLINE __mmask16 avx512_unit_scales(__m128i h, int a0, int b0, int a1, int b1, __m512 * e0v, __m512 * e1v) {
    const __m512 f = _mm512_castps256_ps512(_mm256_cvtph_ps(h));
    *e0v = _mm512_permutexvar_ps(_mm512_setr_epi32(a0,a0,a0,a0,a0,a0,a0,a0, b0,b0,b0,b0,b0,b0,b0,b0), f);
    *e1v = _mm512_permutexvar_ps(_mm512_setr_epi32(a1,a1,a1,a1,a1,a1,a1,a1, b1,b1,b1,b1,b1,b1,b1,b1), f);
    return _mm512_cmpneq_epi32_mask(_mm512_castps_si512(*e0v), _mm512_castps_si512(*e1v));
}

// X86_SCALE_UNIT (v1 G128): the scales are addressed from the rows' bitmap pointers rowA / rowB (x86_covered:
// block_scale is bits + 16 at the block stride), which the decode holds anyway (a separate scale pointer per
// row costs registers: 1.47 -> 1.57 ticks per 32 weights in the GEMV). 32-bit loads (not 16-bit GPR loads)
// go straight to vector registers: GPR -> vector transfers compete with the decode's mask writes.
X86_ALWAYS_INLINE __mmask16 avx512_pair_scales_g128(const uint8_t * rowA, const uint8_t * rowB, int64_t b, int halves,
                                                    __m512 * e0v, __m512 * e1v) {
    const size_t o0 = (size_t)(2*b) * X86_G128_BYTES + offsetof(block_bitcos_g128, d) + sizeof(uint16_t) - sizeof(uint32_t);
    const size_t o1 = halves == 2 ? o0 + X86_G128_BYTES : o0;
    const __m128i a0 = _mm_loadu_si32(rowA + o0), b0 = _mm_loadu_si32(rowB + o0);
    const __m128i a1 = _mm_loadu_si32(rowA + o1), b1 = _mm_loadu_si32(rowB + o1);
    const __m128i h  = _mm_unpacklo_epi64(_mm_unpacklo_epi32(a0, b0), _mm_unpacklo_epi32(a1, b1));
    return avx512_unit_scales(h, 1, 3, 5, 7, e0v, e1v);     // odd halves: e0(A), e0(B), e1(A), e1(B)
}

// X86_SCALE_UNIT_ADJ (B128): a block's two scales are adjacent, one 32-bit load per row holds both; a last
// block with one half (an odd number of units) broadcasts its one scale instead (no read past it).
X86_ALWAYS_INLINE __mmask16 avx512_pair_scales_adj(const avx512_pair_scale * ps, int64_t b, int halves,
                                                   __m512 * e0v, __m512 * e1v) {
    const size_t o = (size_t)(2*b) * sizeof(uint16_t);
    __m128i a, c;
    if (halves == 2) {
        a = _mm_loadu_si32(ps->sA + o);
        c = _mm_loadu_si32(ps->sB + o);
    } else {
        a = _mm_set1_epi16((short)x86_load_u16(ps->sA + o));
        c = _mm_set1_epi16((short)x86_load_u16(ps->sB + o));
    }
    return avx512_unit_scales(_mm_unpacklo_epi32(a, c), 0, 2, 1, 3, e0v, e1v);   // e0(A), e1(A), e0(B), e1(B)
}

// X86_SCALE_BLOCK (B256): [fp32(e(A)) x8, fp32(e(B)) x8] of Q8_K block b, from two broadcast 16-bit loads.
X86_ALWAYS_INLINE __m512 avx512_pair_block_scale(const avx512_pair_scale * ps, size_t sstride, int64_t b) {
    const __m128i a = _mm_set1_epi16((short)x86_load_u16(ps->sA + (size_t)b * sstride));
    const __m128i c = _mm_set1_epi16((short)x86_load_u16(ps->sB + (size_t)b * sstride));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(a), c, 1));
}

// The pair's scales of Q8_K block b (with `halves` units) in scale mode `mode` (a constant); rowA / rowB: the
// rows' bitmaps (v1 G128's scales are read through them).
X86_ALWAYS_INLINE avx512_scales avx512_block_scales(const avx512_pair_scale * ps, const uint8_t * rowA,
                                                    const uint8_t * rowB, size_t sstride, int64_t b, int halves,
                                                    const int mode) {
    avx512_scales sc = { _mm512_setzero_ps(), _mm512_setzero_ps(), 0 };
    switch (mode) {
    case X86_SCALE_ROW:      sc.f = ps->rs2; break;
    case X86_SCALE_BLOCK:    sc.f = avx512_pair_block_scale(ps, sstride, b); break;
    case X86_SCALE_UNIT_ADJ: sc.split = avx512_pair_scales_adj(ps, b, halves, &sc.f, &sc.e1); break;
    case X86_SCALE_UNIT:     sc.split = avx512_pair_scales_g128(rowA, rowB, b, halves, &sc.f, &sc.e1); break;
    default:                 break;
    }
    return sc;
}

// ---- AVX-512 GEMV (one column) ----

// Row pairing of a GEMV tile of nrt rows (KERNELS.md §5, memory): long rows pair r with r + nrh, so the
// bitmap and the pool are read as four long sequential streams through the tile; short rows (at most
// AVX512_GEMV_ADJACENT_ROW_BYTES bytes of bitmap) pair 2p with 2p + 1, which are adjacent in both the bitmap
// and the pool: two streams that run through the whole matrix instead of two that restart per tile.
// Pair p's rows are avx512_pair_row_a/b(pairing, p); a second row >= nrt does not exist (an odd tile's last
// row pairs with a copy of itself).
typedef struct {
    int nrt;   // rows of the tile
    int nrh;   // pairs
    int adj;   // adjacent pairs
} avx512_gemv_pairing;

X86_ALWAYS_INLINE avx512_gemv_pairing avx512_gemv_pairing_of(int nrt, size_t row_bytes) {
    const avx512_gemv_pairing pg = { nrt, (nrt + 1) / 2, row_bytes <= AVX512_GEMV_ADJACENT_ROW_BYTES };
    return pg;
}

X86_ALWAYS_INLINE int avx512_pair_row_a(avx512_gemv_pairing pg, int p) {
    return pg.adj ? 2*p : p;
}

X86_ALWAYS_INLINE int avx512_pair_row_b(avx512_gemv_pairing pg, int p) {
    return pg.adj ? 2*p + 1 : p + pg.nrh;
}

// One pair of a GEMV tile: the rows' bitmaps, last-block copies (x86_copy_last), scales and sign cursors
// (B may be A again, with its own cursor copy, for an odd last row).
typedef struct {
    const uint8_t   * rowA;
    const uint8_t   * rowB;
    const uint8_t   * lastA;
    const uint8_t   * lastB;
    uint64_t        * curA;
    uint64_t        * curB;
    avx512_pair_scale ps;
} avx512_row_pair;

// The byte-granular sign window (x86_negatives_byte) pays off unless many 64-weight words have more than
// 57 present weights; the tile's mean density, from its rows' sign counts, decides (more than 85 % of the
// weights present: the two-qword window, KERNELS.md §3; a one-row tile too, as its count is unknown).
X86_ALWAYS_INLINE int avx512_gemv_byte_window(const bitcos_rows * w, int64_t r0, int nrt) {
    return nrt > 1 &&
        20 * (w->sign_pos[r0 + nrt - 1] - w->sign_pos[r0]) <= 17 * (uint64_t)(nrt - 1) * (uint64_t)w->k;
}

// 1 when no 64-weight word of the chunk of nbk Q8_K blocks starting at block b0 of the row holds more than 57
// present weights, so the chunk can take the unchecked byte window: one vector popcount per 8 words (the chunk's
// 32 * nbk bitmap bytes are contiguous at the unit stride of 16: every variant but v1 G128; the chunk's blocks
// all have two whole units in place) instead of a compare and branch per word (1.81 -> 1.745 ticks per 32
// weights, 256 x 2048 at z = 0.4; KERNELS.md §3). Without VPOPCNTDQ: 0 (the checked window).
X86_ALWAYS_INLINE int avx512_chunk_sparse(const uint8_t * row, int64_t b0, const int nbk) {
#if defined(__AVX512VPOPCNTDQ__)
    const uint8_t * p = row + (size_t)(2*b0) * X86_UNIT_BYTES;
    const int bytes = nbk * 2 * (int)X86_UNIT_BYTES;                   // 32 per Q8_K block
    __m512i m = _mm512_setzero_si512();
    int i = 0;
    for (; i + 64 <= bytes; i += 64) {
        m = _mm512_max_epu64(m, _mm512_popcnt_epi64(_mm512_loadu_si512((const void *)(p + i))));
    }
    if (i < bytes) {                                                    // an odd block count: its last 32 bytes
        m = _mm512_max_epu64(m, _mm512_popcnt_epi64(_mm512_maskz_loadu_epi64(0x0F, (const void *)(p + i))));
    }
    return _mm512_cmpgt_epu64_mask(m, _mm512_set1_epi64(57)) == 0;
#else
    (void)row; (void)b0; (void)nbk;
    return 0;
#endif
}

// avx512_chunk_sparse for both rows of a pair (full: nbk = X86_CHUNK_BLOCKS, a constant trip count).
X86_ALWAYS_INLINE int avx512_pair_sparse(const avx512_row_pair * rp, int64_t b0, int nbk, int full) {
    if (full) {
        return avx512_chunk_sparse(rp->rowA, b0, X86_CHUNK_BLOCKS) && avx512_chunk_sparse(rp->rowB, b0, X86_CHUNK_BLOCKS);
    }
    return avx512_chunk_sparse(rp->rowA, b0, nbk) && avx512_chunk_sparse(rp->rowB, b0, nbk);
}

// GEMV over one chunk (nbk Q8_K blocks from b0) for a row pair, with the scale mode, the shape test
// (two_halves: every block of the chunk has two whole units in place, so no block needs the halves test or
// the last-block copy) and the sign window (win) as compile-time constants in each instantiation below. The
// unit stride is one too: v1 G128's (X86_SCALE_UNIT) or 16 (x86_covered).
X86_ALWAYS_INLINE __m512 avx512_gemv_pair(const bitcos_rows * w, const x86_shape * sh, avx512_row_pair rp, int64_t b0,
                                          const int nbk, const x86_col_chunk * cc, const avx512_pair_chunk * pc,
                                          const int mode, const int two_halves, const int win, __m512 acc) {
    const size_t bb = X86_MODE_UNIT_BYTES(mode);
    const uint8_t * pool = w->pool;
    uint64_t ca = *rp.curA, cb = *rp.curB;   // locals: the pointers may alias as far as the compiler knows
    for (int j = 0; j < nbk; ++j) {
        const int64_t b = b0 + j;
        const int halves = two_halves ? 2 : x86_halves(b, sh->nb);
        const int last = !two_halves && sh->tail != 0 && b == sh->nby - 1;
        const uint8_t * bitsA = last ? rp.lastA : rp.rowA + (size_t)(2*b) * bb;
        const uint8_t * bitsB = last ? rp.lastB : rp.rowB + (size_t)(2*b) * bb;
        __m512i uA[4], uB[4], zA0, zA, zB0, zB;
#if X86_BITMAP_PREFETCH_BYTES
        _mm_prefetch((const char *)(rp.rowA + (size_t)(2*b) * bb + X86_BITMAP_PREFETCH_BYTES), _MM_HINT_T0);
        _mm_prefetch((const char *)(rp.rowB + (size_t)(2*b) * bb + X86_BITMAP_PREFETCH_BYTES), _MM_HINT_T0);
#endif
        avx512_decode_block(bitsA, bb, halves, pool, &ca, win, uA);
        avx512_block_dots_u(uA, halves, cc->qs[j], &zA0, &zA);
        avx512_decode_block(bitsB, bb, halves, pool, &cb, win, uB);
        avx512_block_dots_u(uB, halves, cc->qs[j], &zB0, &zB);
        const avx512_scales sc = avx512_block_scales(&rp.ps, rp.rowA, rp.rowB, sh->sstride, b, halves, mode);
        acc = avx512_block_float(zA0, zA, zB0, zB, pc->qsum2[j], pc->yd2[j], pc->dpt2[j], mode, &sc, acc);
    }
    *rp.curA = ca;
    *rp.curB = cb;
    return acc;
}

// The specialised GEMV chunk routines, one per (scale mode, chunk shape, sign window) the GEMV uses: a full
// chunk (X86_CHUNK_BLOCKS blocks with two whole units: a constant trip count) or any chunk (the row's last;
// its own block count, and the unchecked window only where every block has two whole units).
typedef __m512 (*avx512_gemv_chunk_fn)(const bitcos_rows * w, const x86_shape * sh, const avx512_row_pair * rp,
                                       int64_t b0, int nbk, const x86_col_chunk * cc, const avx512_pair_chunk * pc,
                                       __m512 acc);

#define AVX512_GEMV_CHUNK(name, mode, full, win)                                                                  \
    static __m512 name(const bitcos_rows * w, const x86_shape * sh, const avx512_row_pair * rp, int64_t b0,       \
                       int nbk, const x86_col_chunk * cc, const avx512_pair_chunk * pc, __m512 acc) {             \
        return avx512_gemv_pair(w, sh, *rp, b0, (full) ? X86_CHUNK_BLOCKS : nbk, cc, pc, mode,                     \
                                (full) || (win) == AVX512_SIGN_WINDOW_UNCHECKED, win, acc);                      \
    }
// the three windows of a (mode, full) pair; v1 G128 (X86_SCALE_UNIT) has no unchecked one (below)
#define AVX512_GEMV_CHUNKS3(m, mode, full, shape)                                                                 \
    AVX512_GEMV_CHUNK(avx512_gemv_chunk_##m##_##shape##_qwords,    mode, full, AVX512_SIGN_WINDOW_QWORDS)        \
    AVX512_GEMV_CHUNK(avx512_gemv_chunk_##m##_##shape##_byte,      mode, full, AVX512_SIGN_WINDOW_BYTE)          \
    AVX512_GEMV_CHUNK(avx512_gemv_chunk_##m##_##shape##_unchecked, mode, full, AVX512_SIGN_WINDOW_UNCHECKED)
AVX512_GEMV_CHUNKS3(matrix,   X86_SCALE_MATRIX,   1, full)
AVX512_GEMV_CHUNKS3(matrix,   X86_SCALE_MATRIX,   0, any)
AVX512_GEMV_CHUNKS3(row,      X86_SCALE_ROW,      1, full)
AVX512_GEMV_CHUNKS3(row,      X86_SCALE_ROW,      0, any)
AVX512_GEMV_CHUNKS3(block,    X86_SCALE_BLOCK,    1, full)
AVX512_GEMV_CHUNKS3(block,    X86_SCALE_BLOCK,    0, any)
AVX512_GEMV_CHUNKS3(unit_adj, X86_SCALE_UNIT_ADJ, 1, full)
AVX512_GEMV_CHUNKS3(unit_adj, X86_SCALE_UNIT_ADJ, 0, any)
AVX512_GEMV_CHUNK(avx512_gemv_chunk_g128_full_qwords, X86_SCALE_UNIT, 1, AVX512_SIGN_WINDOW_QWORDS)
AVX512_GEMV_CHUNK(avx512_gemv_chunk_g128_full_byte,   X86_SCALE_UNIT, 1, AVX512_SIGN_WINDOW_BYTE)
AVX512_GEMV_CHUNK(avx512_gemv_chunk_g128_any_qwords,  X86_SCALE_UNIT, 0, AVX512_SIGN_WINDOW_QWORDS)
AVX512_GEMV_CHUNK(avx512_gemv_chunk_g128_any_byte,    X86_SCALE_UNIT, 0, AVX512_SIGN_WINDOW_BYTE)
#undef AVX512_GEMV_CHUNKS3
#undef AVX512_GEMV_CHUNK

#define AVX512_GEMV_WINDOWS(m, shape)                                                                             \
    { avx512_gemv_chunk_##m##_##shape##_qwords, avx512_gemv_chunk_##m##_##shape##_byte,                           \
      avx512_gemv_chunk_##m##_##shape##_unchecked }
// [mode][full][window]. v1 G128 never takes the unchecked window: the sparse test that licenses it reads a
// chunk's contiguous bitmap, and G128's units sit at an 18-byte stride (KERNELS.md §6c).
static const avx512_gemv_chunk_fn avx512_gemv_chunks[X86_SCALE_MODES][2][AVX512_SIGN_WINDOWS] = {
    [X86_SCALE_MATRIX]   = { AVX512_GEMV_WINDOWS(matrix, any),   AVX512_GEMV_WINDOWS(matrix, full) },
    [X86_SCALE_ROW]      = { AVX512_GEMV_WINDOWS(row, any),      AVX512_GEMV_WINDOWS(row, full) },
    [X86_SCALE_BLOCK]    = { AVX512_GEMV_WINDOWS(block, any),    AVX512_GEMV_WINDOWS(block, full) },
    [X86_SCALE_UNIT_ADJ] = { AVX512_GEMV_WINDOWS(unit_adj, any), AVX512_GEMV_WINDOWS(unit_adj, full) },
    [X86_SCALE_UNIT]     = { { avx512_gemv_chunk_g128_any_qwords,  avx512_gemv_chunk_g128_any_byte,  NULL },
                             { avx512_gemv_chunk_g128_full_qwords, avx512_gemv_chunk_g128_full_byte, NULL } },
};
#undef AVX512_GEMV_WINDOWS

// The chunk routine for a chunk: full (X86_CHUNK_BLOCKS blocks with two whole units), sparse (every block
// with two whole units at the unit stride of 16, no word of either row over 57 present weights:
// avx512_chunk_sparse), and the tile's byte-window choice (avx512_gemv_byte_window).
X86_ALWAYS_INLINE avx512_gemv_chunk_fn avx512_gemv_chunk_select(int mode, int full, int sparse, int byte_window) {
    const int win = sparse      ? AVX512_SIGN_WINDOW_UNCHECKED
                  : byte_window ? AVX512_SIGN_WINDOW_BYTE
                  :               AVX512_SIGN_WINDOW_QWORDS;
    return avx512_gemv_chunks[mode][full][win];
}

// Rows, last-block copies, scales and cursors of pair p of a GEMV tile from row r0 in scale mode `mode`
// (cursor[nrt]: the copy an odd last row pairs with).
X86_ALWAYS_INLINE avx512_row_pair avx512_row_pair_of(const bitcos_rows * w, int64_t r0, int mode, avx512_gemv_pairing pg,
                                                     int p, const x86_last_block * last, uint64_t * cursor) {
    const int ra = avx512_pair_row_a(pg, p), rb = avx512_pair_row_b(pg, p);
    const int rb_ = rb < pg.nrt ? rb : ra;
    avx512_row_pair rp;
    rp.rowA  = x86_row(w, r0 + ra);
    rp.rowB  = x86_row(w, r0 + rb_);
    rp.lastA = last[ra].b;
    rp.lastB = last[rb_].b;
    rp.curA  = &cursor[ra];
    rp.curB  = &cursor[rb < pg.nrt ? rb : pg.nrt];
    rp.ps    = avx512_pair_scale_of(w, mode, r0 + ra, r0 + rb_);
    return rp;
}

// One row pair over the nch chunks of the span from Q8_K block s0 (chunk q staged in cc[q], pc[q]), each
// chunk with its specialised routine.
X86_ALWAYS_INLINE __m512 avx512_gemv_pair_span(const bitcos_rows * w, const x86_shape * sh, int mode,
                                               const avx512_row_pair * rp, int64_t s0, int nch, int byte_window,
                                               const x86_col_chunk * cc, const avx512_pair_chunk * pc, __m512 acc) {
    for (int q = 0; q < nch; ++q) {
        const int64_t b0         = s0 + (int64_t)q * X86_CHUNK_BLOCKS;
        const int     nbk        = x86_chunk_blocks(b0, sh->nby);
        const int     two_halves = b0 + nbk <= sh->nfull;     // every block of the chunk has two whole units
        const int     full       = nbk == X86_CHUNK_BLOCKS && two_halves;
        const int     sparse     = mode != X86_SCALE_UNIT && two_halves && avx512_pair_sparse(rp, b0, nbk, full);
        acc = avx512_gemv_chunk_select(mode, full, sparse, byte_window)(w, sh, rp, b0, nbk, &cc[q], &pc[q], acc);
    }
    return acc;
}

// GEMV of the nrt rows from r0 against one column yc (dc: the rows' outputs). Two rows per pass, their
// decode chains interleave; one zmm holds both accumulators. A pair walks a whole span (up to
// X86_GEMV_SPAN_CHUNKS chunks, staged in cc/pc[0 ..]) before the next pair: the bitmap and the pool are
// then read as a few sequential streams (with k <= 16384 one span is the whole row, and row r ends where
// row r + 1 starts, in both), which the hardware prefetchers follow; the previous chunk-outer order, with
// 32 rows' streams interleaved, ran DRAM-resident weights at 4.7 instead of 2.0-2.2 ticks (KERNELS.md §5).
static void avx512_gemv_tile(const bitcos_rows * w, int64_t r0, int nrt, const bitcos_q8_K * yc, float * dc) {
    const x86_shape sh = x86_shape_of(w);
    float scale;
    const int mode = x86_tile_mode(w, sh, r0, nrt, &scale);
    const avx512_gemv_pairing pg = avx512_gemv_pairing_of(nrt, w->row_bytes);
    const int byte_window = avx512_gemv_byte_window(w, r0, nrt);
    _Alignas(64) x86_col_chunk     cc[X86_GEMV_SPAN_CHUNKS];
    _Alignas(64) avx512_pair_chunk pc[X86_GEMV_SPAN_CHUNKS];
    _Alignas(64) __m512            acc[(X86_TILE_ROWS + 1) / 2];     // pair p: rows a(p), b(p)
    x86_last_block                 last[X86_TILE_ROWS];
    uint64_t cursor[X86_TILE_ROWS + 1];
    x86_load_cursors(w, r0, nrt, cursor);
    x86_copy_last(w, sh, r0, nrt, last);
    cursor[nrt] = w->sign_pos[r0 + avx512_pair_row_a(pg, pg.nrh - 1)];  // the copy the odd last row pairs with
    for (int p = 0; p < pg.nrh; ++p) acc[p] = _mm512_setzero_ps();
    for (int64_t s0 = 0; s0 < sh.nby; s0 += X86_GEMV_SPAN_CHUNKS * X86_CHUNK_BLOCKS) {
        int nch = 0;
        for (int64_t b0 = s0; b0 < sh.nby && nch < X86_GEMV_SPAN_CHUNKS; b0 += X86_CHUNK_BLOCKS, ++nch) {
            const int nbk = x86_chunk_blocks(b0, sh.nby);
            x86_stage_column(yc, b0, nbk, sh.nb, scale, &cc[nch]);
            avx512_stage_pair(&cc[nch], &cc[nch], nbk, &pc[nch]);
        }
        for (int p = 0; p < pg.nrh; ++p) {
            const avx512_row_pair rp = avx512_row_pair_of(w, r0, mode, pg, p, last, cursor);
            acc[p] = avx512_gemv_pair_span(w, &sh, mode, &rp, s0, nch, byte_window, cc, pc, acc[p]);
        }
    }
    for (int p = 0; p < pg.nrh; ++p) {
        const int rb = avx512_pair_row_b(pg, p);
        avx512_store_pair(acc[p], &dc[avx512_pair_row_a(pg, p)], rb < nrt ? &dc[rb] : NULL);
    }
}

// ---- AVX-512 GEMM (several columns) ----

// The column paired with column 2p of a tile of nct columns (an odd last column pairs with itself).
X86_ALWAYS_INLINE int avx512_col_b(int p, int nct) {
    return 2*p + 1 < nct ? 2*p + 1 : 2*p;
}

// One row's chunk against every column pair of the tile: each block is decoded once, then serves all pairs
// (acc[p]: the row's accumulators of columns 2p, 2p + 1). ps: the row's scales twice (avx512_pair_scale_of).
X86_ALWAYS_INLINE void avx512_gemm_row_chunk(const bitcos_rows * w, x86_shape sh, const int mode, const uint8_t * row,
                                             const uint8_t * last, const avx512_pair_scale * ps, uint64_t * cursor,
                                             int64_t b0, int nbk, const x86_col_chunk * cc,
                                             const avx512_pair_chunk * pc, int nct, __m512 * acc) {
    sh.ub = X86_MODE_UNIT_BYTES(mode);
    for (int j = 0; j < nbk; ++j) {
        const int64_t b = b0 + j;
        const int halves = x86_halves(b, sh.nb);
        __m512i u[4];
        avx512_decode_block(x86_block_bits(sh, row, last, b), sh.ub, halves, w->pool, cursor,
                            AVX512_SIGN_WINDOW_QWORDS, u);
        const avx512_scales sc = avx512_block_scales(ps, row, row, sh.sstride, b, halves, mode);   // once for all columns
        // the constant bound lets the compiler unroll the column pairs completely (as the one-function
        // kernel did: 3 % at 64 x 4096, nc = 64)
        for (int p = 0; p < X86_TILE_COLS / 2 && 2*p < nct; ++p) {
            __m512i zA0, zA, zB0, zB;
            avx512_block_dots_u(u, halves, cc[2*p].qs[j], &zA0, &zA);
            avx512_block_dots_u(u, halves, cc[avx512_col_b(p, nct)].qs[j], &zB0, &zB);
            acc[p] = avx512_block_float(zA0, zA, zB0, zB, pc[p].qsum2[j], pc[p].yd2[j], pc[p].dpt2[j], mode, &sc, acc[p]);
        }
    }
}

// GEMM of the nrt rows from r0 against the nct (2 .. X86_TILE_COLS) columns y[0 .. nct) (outputs
// dst[c][r0 ..]), chunk-outer: one row against two columns per zmm.
static void avx512_gemm_tile(const bitcos_rows * w, int64_t r0, int nrt, const bitcos_q8_K * const * y, int nct,
                             float * const * dst) {
    const x86_shape sh = x86_shape_of(w);
    float scale;
    const int mode = x86_tile_mode(w, sh, r0, nrt, &scale);
    const int ncp = (nct + 1) / 2;                                   // column pairs
    _Alignas(64) x86_col_chunk     cc[X86_TILE_COLS];
    _Alignas(64) avx512_pair_chunk pc[X86_TILE_COLS / 2];
    _Alignas(64) __m512            acc[X86_TILE_ROWS][X86_TILE_COLS / 2];
    x86_last_block                 last[X86_TILE_ROWS];
    uint64_t cursor[X86_TILE_ROWS];
    x86_load_cursors(w, r0, nrt, cursor);
    x86_copy_last(w, sh, r0, nrt, last);
    for (int r = 0; r < nrt; ++r) {
        for (int p = 0; p < ncp; ++p) acc[r][p] = _mm512_setzero_ps();
    }
    for (int64_t b0 = 0; b0 < sh.nby; b0 += X86_CHUNK_BLOCKS) {
        const int nbk = x86_chunk_blocks(b0, sh.nby);
        x86_stage_columns(y, nct, b0, nbk, sh.nb, scale, cc);
        for (int p = 0; p < ncp; ++p) avx512_stage_pair(&cc[2*p], &cc[avx512_col_b(p, nct)], nbk, &pc[p]);
        for (int r = 0; r < nrt; ++r) {
            const avx512_pair_scale ps = avx512_pair_scale_of(w, mode, r0 + r, r0 + r);
#define AVX512_GEMM_ROW(m) \
            avx512_gemm_row_chunk(w, sh, m, x86_row(w, r0 + r), last[r].b, &ps, &cursor[r], b0, nbk, cc, pc, nct, acc[r])
            X86_MODE_DISPATCH(mode, AVX512_GEMM_ROW)
#undef AVX512_GEMM_ROW
        }
    }
    for (int r = 0; r < nrt; ++r) {
        for (int p = 0; p < ncp; ++p) {
            avx512_store_pair(acc[r][p], &dst[2*p][r0 + r], 2*p + 1 < nct ? &dst[2*p + 1][r0 + r] : NULL);
        }
    }
}

void bitcos_mm_avx512(const bitcos_rows * w, int64_t nr,
                      const bitcos_q8_K * const * y, int64_t nc, float * const * dst) {
    x86_tiles(w, nr, y, nc, dst, avx512_gemv_tile, avx512_gemm_tile);
}

#endif // AVX-512
#endif // x86-64 && AVX2
