// AVX-512 BITCOS kernel (F/BW/VL; VNNI, VPOPCNTDQ, BMI2 and F16C used when present): bitcos_mm_avx512, one
// entry of the kernel table.
//
// Contract: bitcos-kernels.h (results bit-identical to bitcos_mm_generic). Shared x86 parts (sign decode,
// staging, tile scale, tile loop): bitcos-kernels-x86.h. Design and measurements: docs/KERNELS.md.
//
// Codes: u = t + 1 from two masked byte moves per 64 weights (blend by P: 1 -> 2, zero by N). vpdpbusd over
// 64-byte chunks gives dword m = sum over j % 64 in [4m, 4m+4), so the contract's lane l (j % 32 in
// [4l, 4l+4)) is dword l + dword l+8 (the fold). Four vpdpbusd per Q8_K block go into one register; the
// half-0 partial (after the first two) is kept for blocks whose two unit scales differ (G128, B128).
// Float part: two 8-lane accumulators in one zmm, two rows against one column (GEMV) or one row against two
// columns (GEMM), so the fold, the conversion and the FMA serve two accumulators per instruction; every lane
// is still exactly the contract's operation.
// GEMV (one column): two rows interleaved, their decode chains independent, a pair over a whole span of
// chunks before the next pair (KERNELS.md §5); each chunk runs a routine specialised for its
// tile scale, shape and sign window (avx512_gemv_chunks). GEMM (several columns): each block of a row is
// decoded once in registers and serves every column pair of the tile.
// Compile with -ffp-contract=off like every kernel file: the only fused operation allowed is the contract's
// explicit FMA (BITCOS_FMA), written as an intrinsic.
#include "bitcos-kernels.h"

#if defined(BITCOS_BUILD_AVX512)

#    include "bitcos-kernels-x86.h"

// Rows of at most this many bitmap bytes (16 per 128 weights: k <= 4096) pair adjacent rows in the GEMV
// (avx512_gemv_pairing_of).
#    ifndef AVX512_GEMV_ADJACENT_ROW_BYTES
#        define AVX512_GEMV_ADJACENT_ROW_BYTES 512
#    endif

// acc + sum over 4-byte groups of u(u8) * q(s8), per int32 lane.
X86_ALWAYS_INLINE __m512i avx512_dpbusd(__m512i acc, __m512i u, __m512i q) {
#    if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, u, q);
#    else
    const __m512i p16 = _mm512_maddubs_epi16(u, q); // |pair| <= 2 * 256: no saturation
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p16, _mm512_set1_epi16(1)));
#    endif
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
// 64-bit GPR -> mask writes bound the GEMV on Zen 5 (the load is 4 % faster there; the multi-column path
// is within 3 % either way). Inline asm, because GCC merges _load_mask64 with the GPR load of the same word.
X86_ALWAYS_INLINE __m512i avx512_codes64w(const uint8_t * bits, const uint8_t * pool, uint64_t * cursor,
                                          const int win) {
    const uint64_t p = x86_load_u64(bits);
    const uint64_t n = win == AVX512_SIGN_WINDOW_QWORDS ?
                           x86_negatives(p, pool, cursor) :
                           x86_negatives_byte(p, pool, cursor, win == AVX512_SIGN_WINDOW_BYTE);
    __mmask64      pm;
    __asm__("kmovq %1, %0" : "=k"(pm) : "m"(*(const uint64_t *) bits));
    return _mm512_mask_mov_epi8(_mm512_mask_blend_epi8(pm, _mm512_set1_epi8(1), _mm512_set1_epi8(2)), _cvtu64_mask64(n),
                                _mm512_setzero_si512());
}

// Half 0 (z0) and the whole (z, = z0 with one half) dword dot products of one Q8_K block's codes
// u[0 .. 2*halves) with its activations q.
X86_ALWAYS_INLINE void avx512_block_dots_u(const __m512i u[4], int halves, const int8_t * q, __m512i * z0,
                                           __m512i * z) {
    *z0 = avx512_dpbusd(avx512_dpbusd(_mm512_setzero_si512(), u[0], _mm512_loadu_si512((const void *) q)), u[1],
                        _mm512_loadu_si512((const void *) (q + 64)));
    *z = halves == 2 ? avx512_dpbusd(avx512_dpbusd(*z0, u[2], _mm512_loadu_si512((const void *) (q + QK_BITCOS))), u[3],
                                     _mm512_loadu_si512((const void *) (q + QK_BITCOS + 64))) :
                       *z0;
}

// Decodes the codes of the Q8_K block whose first unit's bitmap is at blk (the second's bb bytes on, when
// halves == 2) into u[0 .. 2*halves), zero for a missing half, with sign window `win`.
X86_ALWAYS_INLINE void avx512_decode_block(const uint8_t * blk, size_t bb, int halves, const uint8_t * pool,
                                           uint64_t * cursor, const int win, __m512i u[4]) {
    u[0] = avx512_codes64w(blk, pool, cursor, win);
    u[1] = avx512_codes64w(blk + X86_WORD_BYTES, pool, cursor, win);
    u[2] = u[3] = _mm512_setzero_si512();
    if (halves == 2) {
        u[2] = avx512_codes64w(blk + bb, pool, cursor, win);
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

// A row pair's scales for one Q8_K block, in the tile scale (avx512_block_scales): for SHARED none
// (D is staged); for PER_ROW and PER_256 f = [s(A) x8, s(B) x8]; for PER_128[_IN_BLOCK] f = the fp32 scales of half 0,
// e1 those of half 1, split the lanes whose block has e0 != e1 (bitwise).
typedef struct {
    __m512    f;
    __m512    e1;
    __mmask16 split;
} avx512_scales;

// Float part of one block for a pair of accumulators (lanes 0-7: A, 8-15: B). qsum2 holds the 32-position
// sums of A's and B's columns, yd2 their y.d, dpt2 y.d * the tile's scale (SHARED); sc the pair's scales.
// D = y.d * f, or the staged dpt2. Split lanes take two FMAs; lanes that do not split get (L0 + L1, 0)
// instead of (L0, L1), and FMA(0, D1, acc) = acc exactly (acc is never -0: it starts at +0 and a sum is -0
// only when both operands are).
X86_ALWAYS_INLINE __m512 avx512_block_float(__m512i zA0, __m512i zA, __m512i zB0, __m512i zB, __m512i qsum2, __m512 yd2,
                                            __m512 dpt2, const int ts, const avx512_scales * sc, __m512 acc) {
    const __m512i lf = _mm512_sub_epi32(avx512_fold2(zA, zB), qsum2);
    if (ts == TILE_SCALE_SHARED) {
        return avx512_fma16(_mm512_cvtepi32_ps(lf), dpt2, acc);
    }
    const __m512 d0 = _mm512_mul_ps(yd2, sc->f);
    if (ts == TILE_SCALE_PER_ROW || ts == TILE_SCALE_PER_256 || __builtin_expect(sc->split == 0, 1)) {
        return avx512_fma16(_mm512_cvtepi32_ps(lf), d0, acc);
    }
    const __mmask16 split = sc->split;
    const __m512    e1v   = sc->e1;
    const __m512i   l0    = _mm512_sub_epi32(avx512_fold2(zA0, zB0), _mm512_maskz_mov_epi32(0x0F0F, qsum2));
    const __m512i   la    = _mm512_mask_mov_epi32(lf, split, l0);
    const __m512i   lb    = _mm512_maskz_sub_epi32(split, lf, l0);
    const __m512    d1    = _mm512_mul_ps(yd2, e1v);
    acc                   = avx512_fma16(_mm512_cvtepi32_ps(la), d0, acc);
    return avx512_fma16(_mm512_cvtepi32_ps(lb), d1, acc);
}

// Staged column data in pair form: for GEMV (rows paired) both halves are the same column.
typedef struct {
    __m512i qsum2[X86_CHUNK_BLOCKS];
    __m512  yd2[X86_CHUNK_BLOCKS];
    __m512  dpt2[X86_CHUNK_BLOCKS]; // TILE_SCALE_SHARED: y.d * the tile's scale
} avx512_pair_chunk;

X86_ALWAYS_INLINE void avx512_stage_pair(const x86_col_chunk * a, const x86_col_chunk * b, int nbk,
                                         avx512_pair_chunk * pc) {
    for (int j = 0; j < nbk; ++j) {
        pc->qsum2[j] = _mm512_inserti64x4(_mm512_castsi256_si512(a->qsum[j]), b->qsum[j], 1);
        pc->yd2[j]   = avx512_pair_f(a->yd[j], b->yd[j]);
        pc->dpt2[j]  = avx512_pair_f(a->dpt[j], b->dpt[j]);
    }
}

X86_ALWAYS_INLINE void avx512_store_pair(__m512 acc, float * da, float * db) {
    *da = x86_reduce8(_mm512_castps512_ps256(acc));
    if (db)
        *db = x86_reduce8(_mm512_extractf32x8_ps(acc, 1));
}

// Where a row pair's scales are (lanes 0-7: row A, 8-15: row B; the same row twice in the GEMM): the scale
// of unit 0 of each row (PER_256, PER_128; PER_128_IN_BLOCK's are read through the bitmap pointers) and the
// two rows' fp32 scales (PER_ROW).
typedef struct {
    const uint8_t * sA;
    const uint8_t * sB;
    __m512          rs2;
} avx512_pair_scale;

X86_ALWAYS_INLINE avx512_pair_scale avx512_pair_scale_of(const bitcos_rows * w, int ts, int64_t ra, int64_t rb) {
    avx512_pair_scale ps = { NULL, NULL, _mm512_setzero_ps() };
    if (ts == TILE_SCALE_PER_ROW) {
        ps.rs2 = avx512_pair_f(w->row_scale[ra], w->row_scale[rb]);
    } else if (ts == TILE_SCALE_PER_256 || ts == TILE_SCALE_PER_128) {
        ps.sA = x86_row_scales(w, ra);
        ps.sB = x86_row_scales(w, rb);
    }
    return ps;
}

// v1 G128 (TILE_SCALE_PER_128_IN_BLOCK): the scale reads load 32 bits that end with a unit's fp16 scale d: the low half
// is the two bitmap bytes before d, so the load never leaves the block (x86_covered checks the layout).
_Static_assert(offsetof(block_bitcos_g128, d) >= sizeof(uint32_t) - sizeof(uint16_t),
               "the 32-bit load that ends at d must start inside the block");

// fp32 scales of Q8_K block b for a pair of rows from the halves' fp16 words h = [e0(A), e0(B), e1(A),
// e1(B)] at the given 16-bit lanes: e0v = [e0(A) x8, e0(B) x8], e1v likewise, and the lanes whose row has
// e0 != e1 (bitwise; fp16 -> fp32 is injective, so the fp32 bits compare the same).
X86_ALWAYS_INLINE __mmask16 avx512_unit_scales(__m128i h, int a0, int b0, int a1, int b1, __m512 * e0v, __m512 * e1v) {
    const __m512 f = _mm512_castps256_ps512(_mm256_cvtph_ps(h));
    *e0v = _mm512_permutexvar_ps(_mm512_setr_epi32(a0, a0, a0, a0, a0, a0, a0, a0, b0, b0, b0, b0, b0, b0, b0, b0), f);
    *e1v = _mm512_permutexvar_ps(_mm512_setr_epi32(a1, a1, a1, a1, a1, a1, a1, a1, b1, b1, b1, b1, b1, b1, b1, b1), f);
    return _mm512_cmpneq_epi32_mask(_mm512_castps_si512(*e0v), _mm512_castps_si512(*e1v));
}

// TILE_SCALE_PER_128_IN_BLOCK (v1 G128): the scales are addressed from the rows' bitmap pointers rowA / rowB
// (x86_covered: block_scale is bits + 16 at the block stride), which the decode holds anyway (a separate scale
// pointer per row costs registers: 7 % slower GEMV). 32-bit loads (not 16-bit GPR loads)
// go straight to vector registers: GPR -> vector transfers compete with the decode's mask writes.
X86_ALWAYS_INLINE __mmask16 avx512_pair_scales_g128(const uint8_t * rowA, const uint8_t * rowB, int64_t b, int halves,
                                                    __m512 * e0v, __m512 * e1v) {
    const size_t o0 =
        (size_t) (2 * b) * X86_G128_BYTES + offsetof(block_bitcos_g128, d) + sizeof(uint16_t) - sizeof(uint32_t);
    const size_t  o1 = halves == 2 ? o0 + X86_G128_BYTES : o0;
    const __m128i a0 = _mm_loadu_si32(rowA + o0), b0 = _mm_loadu_si32(rowB + o0);
    const __m128i a1 = _mm_loadu_si32(rowA + o1), b1 = _mm_loadu_si32(rowB + o1);
    const __m128i h = _mm_unpacklo_epi64(_mm_unpacklo_epi32(a0, b0), _mm_unpacklo_epi32(a1, b1));
    return avx512_unit_scales(h, 1, 3, 5, 7, e0v, e1v); // odd halves: e0(A), e0(B), e1(A), e1(B)
}

// TILE_SCALE_PER_128 (B128): a block's two scales are adjacent, one 32-bit load per row holds both; a last
// block with one half (an odd number of units) broadcasts its one scale instead (no read past it).
X86_ALWAYS_INLINE __mmask16 avx512_pair_scales_adj(const avx512_pair_scale * ps, int64_t b, int halves, __m512 * e0v,
                                                   __m512 * e1v) {
    const size_t o = (size_t) (2 * b) * sizeof(uint16_t);
    __m128i      a, c;
    if (halves == 2) {
        a = _mm_loadu_si32(ps->sA + o);
        c = _mm_loadu_si32(ps->sB + o);
    } else {
        a = _mm_set1_epi16((short) x86_load_u16(ps->sA + o));
        c = _mm_set1_epi16((short) x86_load_u16(ps->sB + o));
    }
    return avx512_unit_scales(_mm_unpacklo_epi32(a, c), 0, 2, 1, 3, e0v, e1v); // e0(A), e1(A), e0(B), e1(B)
}

// TILE_SCALE_PER_256 (B256): [fp32(e(A)) x8, fp32(e(B)) x8] of Q8_K block b, from two broadcast 16-bit loads.
X86_ALWAYS_INLINE __m512 avx512_pair_block_scale(const avx512_pair_scale * ps, size_t sstride, int64_t b) {
    const __m128i a = _mm_set1_epi16((short) x86_load_u16(ps->sA + (size_t) b * sstride));
    const __m128i c = _mm_set1_epi16((short) x86_load_u16(ps->sB + (size_t) b * sstride));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(a), c, 1));
}

// The pair's scales of Q8_K block b (with `halves` units) in tile scale `ts` (a constant); rowA / rowB: the
// rows' bitmaps (v1 G128's scales are read through them).
X86_ALWAYS_INLINE avx512_scales avx512_block_scales(const avx512_pair_scale * ps, const uint8_t * rowA,
                                                    const uint8_t * rowB, size_t sstride, int64_t b, int halves,
                                                    const int ts) {
    avx512_scales sc = { _mm512_setzero_ps(), _mm512_setzero_ps(), 0 };
    switch (ts) {
        case TILE_SCALE_PER_ROW:
            sc.f = ps->rs2;
            break;
        case TILE_SCALE_PER_256:
            sc.f = avx512_pair_block_scale(ps, sstride, b);
            break;
        case TILE_SCALE_PER_128:
            sc.split = avx512_pair_scales_adj(ps, b, halves, &sc.f, &sc.e1);
            break;
        case TILE_SCALE_PER_128_IN_BLOCK:
            sc.split = avx512_pair_scales_g128(rowA, rowB, b, halves, &sc.f, &sc.e1);
            break;
        default:
            break;
    }
    return sc;
}

// ---- AVX-512 GEMV (one column) ----

// Row pairing of a GEMV tile of nrt rows (KERNELS.md §5): long rows pair r with r + nrh, so the
// bitmap and the pool are read as four long sequential streams through the tile; short rows (at most
// AVX512_GEMV_ADJACENT_ROW_BYTES bytes of bitmap) pair 2p with 2p + 1, which are adjacent in both the bitmap
// and the pool: two streams that run through the whole matrix instead of two that restart per tile.
// Pair p's rows are avx512_pair_row_a/b(pairing, p); a second row >= nrt does not exist (an odd tile's last
// row pairs with a copy of itself).
typedef struct {
    int nrt; // rows of the tile
    int nrh; // pairs
    int adj; // adjacent pairs
} avx512_gemv_pairing;

X86_ALWAYS_INLINE avx512_gemv_pairing avx512_gemv_pairing_of(int nrt, size_t row_bytes) {
    const avx512_gemv_pairing pg = { nrt, (nrt + 1) / 2, row_bytes <= AVX512_GEMV_ADJACENT_ROW_BYTES };
    return pg;
}

X86_ALWAYS_INLINE int avx512_pair_row_a(avx512_gemv_pairing pg, int p) {
    return pg.adj ? 2 * p : p;
}

X86_ALWAYS_INLINE int avx512_pair_row_b(avx512_gemv_pairing pg, int p) {
    return pg.adj ? 2 * p + 1 : p + pg.nrh;
}

// One pair of a GEMV tile: the rows' bitmaps, last-block copies (x86_copy_last), scales and sign cursors
// (B may be A again, with its own cursor copy, for an odd last row).
typedef struct {
    const uint8_t *   rowA;
    const uint8_t *   rowB;
    const uint8_t *   lastA;
    const uint8_t *   lastB;
    uint64_t *        curA;
    uint64_t *        curB;
    avx512_pair_scale ps;
} avx512_row_pair;

// The byte-granular sign window (x86_negatives_byte) pays off unless many 64-weight words have more than
// 57 present weights; the tile's mean density, from its rows' sign counts, decides (more than 85 % of the
// weights present: the two-qword window, KERNELS.md §3; a one-row tile too, as its count is unknown).
X86_ALWAYS_INLINE int avx512_gemv_byte_window(const bitcos_rows * w, int64_t r0, int nrt) {
    return nrt > 1 && 20 * (w->sign_pos[r0 + nrt - 1] - w->sign_pos[r0]) <= 17 * (uint64_t) (nrt - 1) * (uint64_t) w->k;
}

// 1 when no 64-weight word of the chunk of nbk Q8_K blocks starting at block b0 of the row holds more than 57
// present weights, so the chunk can take the unchecked byte window: one vector popcount per 8 words (the chunk's
// 32 * nbk bitmap bytes are contiguous at the unit stride of 16: every variant but v1 G128; the chunk's blocks
// all have two whole units in place) instead of a compare and branch per word (4 % faster at 256 x 2048,
// z = 0.4; KERNELS.md §3). Without VPOPCNTDQ: 0 (the checked window).
X86_ALWAYS_INLINE int avx512_chunk_sparse(const uint8_t * row, int64_t b0, const int nbk) {
#    if defined(__AVX512VPOPCNTDQ__)
    const uint8_t * p     = row + (size_t) (2 * b0) * X86_UNIT_BYTES;
    const int       bytes = nbk * 2 * (int) X86_UNIT_BYTES; // 32 per Q8_K block
    __m512i         m     = _mm512_setzero_si512();
    int             i     = 0;
    for (; i + 64 <= bytes; i += 64) {
        m = _mm512_max_epu64(m, _mm512_popcnt_epi64(_mm512_loadu_si512((const void *) (p + i))));
    }
    if (i < bytes) { // an odd block count: its last 32 bytes
        m = _mm512_max_epu64(m, _mm512_popcnt_epi64(_mm512_maskz_loadu_epi64(0x0F, (const void *) (p + i))));
    }
    return _mm512_cmpgt_epu64_mask(m, _mm512_set1_epi64(57)) == 0;
#    else
    (void) row;
    (void) b0;
    (void) nbk;
    return 0;
#    endif
}

// avx512_chunk_sparse for both rows of a pair (full: nbk = X86_CHUNK_BLOCKS, a constant trip count).
X86_ALWAYS_INLINE int avx512_pair_sparse(const avx512_row_pair * rp, int64_t b0, int nbk, int full) {
    if (full) {
        return avx512_chunk_sparse(rp->rowA, b0, X86_CHUNK_BLOCKS) &&
               avx512_chunk_sparse(rp->rowB, b0, X86_CHUNK_BLOCKS);
    }
    return avx512_chunk_sparse(rp->rowA, b0, nbk) && avx512_chunk_sparse(rp->rowB, b0, nbk);
}

// GEMV over one chunk (nbk Q8_K blocks from b0) for a row pair, with the tile scale, the shape test
// (two_halves: every block of the chunk has two whole units in place, so no block needs the halves test or
// the last-block copy) and the sign window (win) as compile-time constants in each instantiation below. The
// unit stride is one too: v1 G128's (TILE_SCALE_PER_128_IN_BLOCK) or 16 (x86_covered).
X86_ALWAYS_INLINE __m512 avx512_gemv_pair(const bitcos_rows * w, const x86_shape * sh, const avx512_row_pair * rpp,
                                          int64_t b0, const int nbk, const x86_col_chunk * cc,
                                          const avx512_pair_chunk * pc, const int ts, const int two_halves,
                                          const int win, __m512 acc) {
    const size_t    bb   = X86_TILE_UNIT_BYTES(ts);
    const uint8_t * pool = w->pool;
    const uint8_t * rowA = rpp->rowA, *rowB = rpp->rowB;
    const uint8_t * lastA = rpp->lastA, *lastB = rpp->lastB;
    uint64_t *      curA = rpp->curA, *curB = rpp->curB;
    uint64_t        ca = *curA, cb = *curB; // locals: the pointers may alias as far as the compiler knows
    for (int j = 0; j < nbk; ++j) {
        const int64_t   b      = b0 + j;
        const int       halves = two_halves ? 2 : x86_halves(b, sh->nb);
        const int       last   = !two_halves && sh->tail != 0 && b == sh->nby - 1;
        const uint8_t * bitsA  = last ? lastA : rowA + (size_t) (2 * b) * bb;
        const uint8_t * bitsB  = last ? lastB : rowB + (size_t) (2 * b) * bb;
        __m512i         uA[4], uB[4], zA0, zA, zB0, zB;
#    if X86_BITMAP_PREFETCH_BYTES
        _mm_prefetch((const char *) (rowA + (size_t) (2 * b) * bb + X86_BITMAP_PREFETCH_BYTES), _MM_HINT_T0);
        _mm_prefetch((const char *) (rowB + (size_t) (2 * b) * bb + X86_BITMAP_PREFETCH_BYTES), _MM_HINT_T0);
#    endif
#    if X86_POOL_PREFETCH_BYTES
        _mm_prefetch((const char *) (pool + (ca >> 3) + X86_POOL_PREFETCH_BYTES), _MM_HINT_T0);
        _mm_prefetch((const char *) (pool + (cb >> 3) + X86_POOL_PREFETCH_BYTES), _MM_HINT_T0);
#    endif
        avx512_decode_block(bitsA, bb, halves, pool, &ca, win, uA);
        avx512_block_dots_u(uA, halves, cc->qs[j], &zA0, &zA);
        avx512_decode_block(bitsB, bb, halves, pool, &cb, win, uB);
        avx512_block_dots_u(uB, halves, cc->qs[j], &zB0, &zB);
        const avx512_scales sc = avx512_block_scales(&rpp->ps, rowA, rowB, sh->sstride, b, halves, ts);
        acc = avx512_block_float(zA0, zA, zB0, zB, pc->qsum2[j], pc->yd2[j], pc->dpt2[j], ts, &sc, acc);
    }
    *curA = ca;
    *curB = cb;
    return acc;
}

// The GEMV chunk routines: avx512_gemv_pair instantiated once per (tile scale, chunk shape, sign window), each
// a separate function so that every hot loop has its constants folded in and the span loop picks one through
// avx512_gemv_chunks. A full chunk (X86_CHUNK_BLOCKS blocks with two whole units) has a constant trip count;
// any other chunk (a row's last) takes its own block count, and the unchecked window only where every block has
// two whole units.
typedef __m512 (*avx512_gemv_chunk_fn)(const bitcos_rows * w, const x86_shape * sh, const avx512_row_pair * rp,
                                       int64_t b0, int nbk, const x86_col_chunk * cc, const avx512_pair_chunk * pc,
                                       __m512 acc);

#    define AVX512_GEMV_CHUNK(name, ts, full, win)                                                              \
        static __m512 name(const bitcos_rows * w, const x86_shape * sh, const avx512_row_pair * rp, int64_t b0, \
                           int nbk, const x86_col_chunk * cc, const avx512_pair_chunk * pc, __m512 acc) {       \
            return avx512_gemv_pair(w, sh, rp, b0, (full) ? X86_CHUNK_BLOCKS : nbk, cc, pc, ts,                 \
                                    (full) || (win) == AVX512_SIGN_WINDOW_UNCHECKED, win, acc);                 \
        }
// The routines of one tile scale: both chunk shapes x the qwords and byte windows (+ the unchecked window).
#    define AVX512_GEMV_CHUNKS2(kind, ts)                                                     \
        AVX512_GEMV_CHUNK(avx512_gemv_##kind##_full_qwords, ts, 1, AVX512_SIGN_WINDOW_QWORDS) \
        AVX512_GEMV_CHUNK(avx512_gemv_##kind##_full_byte, ts, 1, AVX512_SIGN_WINDOW_BYTE)     \
        AVX512_GEMV_CHUNK(avx512_gemv_##kind##_any_qwords, ts, 0, AVX512_SIGN_WINDOW_QWORDS)  \
        AVX512_GEMV_CHUNK(avx512_gemv_##kind##_any_byte, ts, 0, AVX512_SIGN_WINDOW_BYTE)
#    define AVX512_GEMV_CHUNKS3(kind, ts)                                                           \
        AVX512_GEMV_CHUNKS2(kind, ts)                                                               \
        AVX512_GEMV_CHUNK(avx512_gemv_##kind##_full_unchecked, ts, 1, AVX512_SIGN_WINDOW_UNCHECKED) \
        AVX512_GEMV_CHUNK(avx512_gemv_##kind##_any_unchecked, ts, 0, AVX512_SIGN_WINDOW_UNCHECKED)
AVX512_GEMV_CHUNKS3(shared, TILE_SCALE_SHARED)
AVX512_GEMV_CHUNKS3(per_row, TILE_SCALE_PER_ROW)
AVX512_GEMV_CHUNKS3(per_256, TILE_SCALE_PER_256)
AVX512_GEMV_CHUNKS3(per_128, TILE_SCALE_PER_128)
// PER_128_IN_BLOCK (v1 G128) never takes the unchecked window: the sparse test that licenses it reads a
// chunk's bitmap as one contiguous run, and G128's units sit at an 18-byte stride.
AVX512_GEMV_CHUNKS2(per_128_in_block, TILE_SCALE_PER_128_IN_BLOCK)
#    undef AVX512_GEMV_CHUNKS3
#    undef AVX512_GEMV_CHUNKS2
#    undef AVX512_GEMV_CHUNK

// [tile scale][full][window]
#    define AVX512_GEMV_SHAPE(kind, shape, unchecked) \
        { avx512_gemv_##kind##_##shape##_qwords, avx512_gemv_##kind##_##shape##_byte, unchecked }
#    define AVX512_GEMV_KIND(kind)                                          \
        { AVX512_GEMV_SHAPE(kind, any, avx512_gemv_##kind##_any_unchecked), \
          AVX512_GEMV_SHAPE(kind, full, avx512_gemv_##kind##_full_unchecked) }
static const avx512_gemv_chunk_fn avx512_gemv_chunks[TILE_SCALE_KINDS][2][AVX512_SIGN_WINDOWS] = {
    [TILE_SCALE_SHARED]           = AVX512_GEMV_KIND(shared),
    [TILE_SCALE_PER_ROW]          = AVX512_GEMV_KIND(per_row),
    [TILE_SCALE_PER_256]          = AVX512_GEMV_KIND(per_256),
    [TILE_SCALE_PER_128]          = AVX512_GEMV_KIND(per_128),
    [TILE_SCALE_PER_128_IN_BLOCK] = { AVX512_GEMV_SHAPE(per_128_in_block, any, NULL),
                                      AVX512_GEMV_SHAPE(per_128_in_block, full, NULL) },
};
#    undef AVX512_GEMV_KIND
#    undef AVX512_GEMV_SHAPE

// The chunk routine for a chunk: full (X86_CHUNK_BLOCKS blocks with two whole units), sparse (every block
// with two whole units at the unit stride of 16, no word of either row over 57 present weights:
// avx512_chunk_sparse), and the tile's byte-window choice (avx512_gemv_byte_window).
X86_ALWAYS_INLINE avx512_gemv_chunk_fn avx512_gemv_chunk_select(int ts, int full, int sparse, int byte_window) {
    const int win = sparse      ? AVX512_SIGN_WINDOW_UNCHECKED :
                    byte_window ? AVX512_SIGN_WINDOW_BYTE :
                                  AVX512_SIGN_WINDOW_QWORDS;
    return avx512_gemv_chunks[ts][full][win];
}

// Rows, last-block copies, scales and cursors of pair p of a GEMV tile from row r0 with tile scale `ts`
// (cursor[nrt]: the copy an odd last row pairs with).
X86_ALWAYS_INLINE avx512_row_pair avx512_row_pair_of(const bitcos_rows * w, int64_t r0, int ts, avx512_gemv_pairing pg,
                                                     int p, const x86_last_block * last, uint64_t * cursor) {
    const int       ra = avx512_pair_row_a(pg, p), rb = avx512_pair_row_b(pg, p);
    const int       rb_ = rb < pg.nrt ? rb : ra;
    avx512_row_pair rp;
    rp.rowA  = x86_row(w, r0 + ra);
    rp.rowB  = x86_row(w, r0 + rb_);
    rp.lastA = last[ra].b;
    rp.lastB = last[rb_].b;
    rp.curA  = &cursor[ra];
    rp.curB  = &cursor[rb < pg.nrt ? rb : pg.nrt];
    rp.ps    = avx512_pair_scale_of(w, ts, r0 + ra, r0 + rb_);
    return rp;
}

// One row pair over the nch chunks of the span from Q8_K block s0 (chunk q staged in cc[q], pc[q]), each
// chunk with its specialised routine.
X86_ALWAYS_INLINE __m512 avx512_gemv_pair_span(const bitcos_rows * w, const x86_shape * sh, int ts,
                                               const avx512_row_pair * rp, int64_t s0, int nch, int byte_window,
                                               const x86_col_chunk * cc, const avx512_pair_chunk * pc, __m512 acc) {
    for (int q = 0; q < nch; ++q) {
        const int64_t b0         = s0 + (int64_t) q * X86_CHUNK_BLOCKS;
        const int     nbk        = x86_chunk_blocks(b0, sh->nby);
        const int     two_halves = b0 + nbk <= sh->nfull; // every block of the chunk has two whole units
        const int     full       = nbk == X86_CHUNK_BLOCKS && two_halves;
        const int     sparse = ts != TILE_SCALE_PER_128_IN_BLOCK && two_halves && avx512_pair_sparse(rp, b0, nbk, full);
        acc = avx512_gemv_chunk_select(ts, full, sparse, byte_window)(w, sh, rp, b0, nbk, &cc[q], &pc[q], acc);
    }
    return acc;
}

// GEMV of the nrt rows from r0 against one column yc (dc: the rows' outputs). Two rows per pass, their
// decode chains interleave; one zmm holds both accumulators. A pair walks a whole span (up to
// X86_GEMV_SPAN_CHUNKS chunks, staged in cc/pc[0 ..]) before the next pair: the bitmap and the pool are
// then read as a few sequential streams (with k <= 16384 one span is the whole row, and row r ends where
// row r + 1 starts, in both), which the hardware prefetchers follow. A chunk-outer order, with 32 rows'
// streams interleaved, runs DRAM-resident weights about twice as slow (KERNELS.md §5).
static void avx512_gemv_tile(const bitcos_rows * w, int64_t r0, int nrt, const bitcos_q8_K * yc, float * dc) {
    const x86_shape                sh = x86_shape_of(w);
    float                          scale;
    const int                      ts          = x86_tile_scale_of(w, sh, r0, nrt, &scale);
    const avx512_gemv_pairing      pg          = avx512_gemv_pairing_of(nrt, w->row_bytes);
    const int                      byte_window = avx512_gemv_byte_window(w, r0, nrt);
    _Alignas(64) x86_col_chunk     cc[X86_GEMV_SPAN_CHUNKS];
    _Alignas(64) avx512_pair_chunk pc[X86_GEMV_SPAN_CHUNKS];
    _Alignas(64) __m512            acc[(X86_TILE_ROWS + 1) / 2]; // pair p: rows a(p), b(p)
    x86_last_block                 last[X86_TILE_ROWS];
    uint64_t                       cursor[X86_TILE_ROWS + 1];
    x86_load_cursors(w, r0, nrt, cursor);
    x86_copy_last(w, sh, r0, nrt, last);
    cursor[nrt] = w->sign_pos[r0 + avx512_pair_row_a(pg, pg.nrh - 1)]; // the copy the odd last row pairs with
    for (int p = 0; p < pg.nrh; ++p)
        acc[p] = _mm512_setzero_ps();
    for (int64_t s0 = 0; s0 < sh.nby; s0 += X86_GEMV_SPAN_CHUNKS * X86_CHUNK_BLOCKS) {
        int nch = 0;
        for (int64_t b0 = s0; b0 < sh.nby && nch < X86_GEMV_SPAN_CHUNKS; b0 += X86_CHUNK_BLOCKS, ++nch) {
            const int nbk = x86_chunk_blocks(b0, sh.nby);
            x86_stage_column(yc, b0, nbk, sh.nb, scale, &cc[nch]);
            avx512_stage_pair(&cc[nch], &cc[nch], nbk, &pc[nch]);
        }
        for (int p = 0; p < pg.nrh; ++p) {
            const avx512_row_pair rp = avx512_row_pair_of(w, r0, ts, pg, p, last, cursor);
            acc[p]                   = avx512_gemv_pair_span(w, &sh, ts, &rp, s0, nch, byte_window, cc, pc, acc[p]);
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
    return 2 * p + 1 < nct ? 2 * p + 1 : 2 * p;
}

// One row's chunk against every column pair of the tile: each block is decoded once, then serves all pairs
// (acc[p]: the row's accumulators of columns 2p, 2p + 1). ps: the row's scales twice (avx512_pair_scale_of).
X86_ALWAYS_INLINE void avx512_gemm_row_chunk(const bitcos_rows * w, x86_shape sh, const int ts, const uint8_t * row,
                                             const uint8_t * last, const avx512_pair_scale * ps, uint64_t * cursor,
                                             int64_t b0, int nbk, const x86_col_chunk * cc,
                                             const avx512_pair_chunk * pc, int nct, __m512 * acc) {
    sh.ub = X86_TILE_UNIT_BYTES(ts);
    for (int j = 0; j < nbk; ++j) {
        const int64_t b      = b0 + j;
        const int     halves = x86_halves(b, sh.nb);
        __m512i       u[4];
        avx512_decode_block(x86_block_bits(sh, row, last, b), sh.ub, halves, w->pool, cursor, AVX512_SIGN_WINDOW_QWORDS,
                            u);
        const avx512_scales sc = avx512_block_scales(ps, row, row, sh.sstride, b, halves, ts); // once for all columns
        // the constant bound lets the compiler unroll the column pairs completely (3 % at 64 x 4096, nc = 64)
        for (int p = 0; p < X86_TILE_COLS / 2 && 2 * p < nct; ++p) {
            __m512i zA0, zA, zB0, zB;
            avx512_block_dots_u(u, halves, cc[2 * p].qs[j], &zA0, &zA);
            avx512_block_dots_u(u, halves, cc[avx512_col_b(p, nct)].qs[j], &zB0, &zB);
            acc[p] = avx512_block_float(zA0, zA, zB0, zB, pc[p].qsum2[j], pc[p].yd2[j], pc[p].dpt2[j], ts, &sc, acc[p]);
        }
    }
}

// GEMM of the nrt rows from r0 against the nct (2 .. X86_TILE_COLS) columns y[0 .. nct) (outputs
// dst[c][r0 ..]), chunk-outer: one row against two columns per zmm.
static void avx512_gemm_tile(const bitcos_rows * w, int64_t r0, int nrt, const bitcos_q8_K * const * y, int nct,
                             float * const * dst) {
    const x86_shape                sh = x86_shape_of(w);
    float                          scale;
    const int                      ts  = x86_tile_scale_of(w, sh, r0, nrt, &scale);
    const int                      ncp = (nct + 1) / 2; // column pairs
    _Alignas(64) x86_col_chunk     cc[X86_TILE_COLS];
    _Alignas(64) avx512_pair_chunk pc[X86_TILE_COLS / 2];
    _Alignas(64) __m512            acc[X86_TILE_ROWS][X86_TILE_COLS / 2];
    x86_last_block                 last[X86_TILE_ROWS];
    uint64_t                       cursor[X86_TILE_ROWS];
    x86_load_cursors(w, r0, nrt, cursor);
    x86_copy_last(w, sh, r0, nrt, last);
    for (int r = 0; r < nrt; ++r) {
        for (int p = 0; p < ncp; ++p)
            acc[r][p] = _mm512_setzero_ps();
    }
    for (int64_t b0 = 0; b0 < sh.nby; b0 += X86_CHUNK_BLOCKS) {
        const int nbk = x86_chunk_blocks(b0, sh.nby);
        x86_stage_columns(y, nct, b0, nbk, sh.nb, scale, cc);
        for (int p = 0; p < ncp; ++p)
            avx512_stage_pair(&cc[2 * p], &cc[avx512_col_b(p, nct)], nbk, &pc[p]);
        for (int r = 0; r < nrt; ++r) {
            const avx512_pair_scale ps = avx512_pair_scale_of(w, ts, r0 + r, r0 + r);
#    define AVX512_GEMM_ROW(m) \
        avx512_gemm_row_chunk(w, sh, m, x86_row(w, r0 + r), last[r].b, &ps, &cursor[r], b0, nbk, cc, pc, nct, acc[r])
            X86_TILE_SCALE_DISPATCH(ts, AVX512_GEMM_ROW)
#    undef AVX512_GEMM_ROW
        }
    }
    for (int r = 0; r < nrt; ++r) {
        for (int p = 0; p < ncp; ++p) {
            avx512_store_pair(acc[r][p], &dst[2 * p][r0 + r], 2 * p + 1 < nct ? &dst[2 * p + 1][r0 + r] : NULL);
        }
    }
}

// The kernel: rows in tiles, a one-column tile through the GEMV, any other through the GEMM.
void bitcos_mm_avx512(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc,
                      float * const * dst) {
    x86_tiles(w, nr, y, nc, dst, avx512_gemv_tile, avx512_gemm_tile);
}

int bitcos_covers_avx512(const bitcos_rows * w) {
    return x86_covered(w, x86_shape_of(w));
}

#else
typedef int bitcos_no_avx512_kernel; // ISO C wants a declaration in every translation unit
#endif // BITCOS_BUILD_AVX512
