// ggml-bitcos: reader, validator and encoder of BITCOS tensor data (docs/FORMAT.md versions 1 and 2; layout in
// bitcos-format.h). Compiled into ggml-base by the type-ids patch. Works on bytes only: of ggml it uses the
// type enum and ggml_type_name, so the validator fuzz test compiles it without the ggml library. The link
// between ggml tensors (companion, views, loading) is ggml-bitcos-link.c.
#include "ggml-bitcos.h"
#include "ggml-bitcos-impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

// ggml.h's enum (type-ids patch) and the format header name the same ids
_Static_assert(GGML_TYPE_BITCOS_G128 == BITCOS_TYPE_ID_G128, "GGML_TYPE_BITCOS_G128 != BITCOS_TYPE_ID_G128");
_Static_assert(GGML_TYPE_BITCOS_PT == BITCOS_TYPE_ID_PT, "GGML_TYPE_BITCOS_PT != BITCOS_TYPE_ID_PT");
_Static_assert(GGML_TYPE_BITCOS == BITCOS_TYPE_ID_BITMAP, "GGML_TYPE_BITCOS != BITCOS_TYPE_ID_BITMAP");

static uint64_t rd_u64(const uint8_t * p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) {
        v = (v << 8) | p[i];
    }
    return v;
}

static uint32_t rd_u32(const uint8_t * p) {
    return (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16) | ((uint32_t) p[3] << 24);
}

static uint16_t rd_u16(const uint8_t * p) {
    return (uint16_t) (p[0] | (p[1] << 8));
}

static void wr_u64(uint8_t * p, uint64_t v) {
    for (int i = 0; i < 8; ++i) {
        p[i] = (uint8_t) (v >> (8 * i));
    }
}

static void wr_u16(uint8_t * p, uint16_t v) {
    p[0] = (uint8_t) v;
    p[1] = (uint8_t) (v >> 8);
}

static void wr_u32(uint8_t * p, uint32_t v) {
    for (int i = 0; i < 4; ++i) {
        p[i] = (uint8_t) (v >> (8 * i));
    }
}

static uint64_t align_section(uint64_t x) {
    return (x + BITCOS_SECTION_ALIGN - 1) & ~(uint64_t) (BITCOS_SECTION_ALIGN - 1);
}

bool ggml_bitcos_fail(char * err, size_t err_size, const char * fmt, ...) {
    if (err && err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
    }
    return false;
}

bool ggml_bitcos_scale_f16_valid(uint16_t d) {
    return (d & 0x8000u) == 0 && (d & 0x7c00u) != 0x7c00u; // sign bit clear, not Inf/NaN
}

bool ggml_bitcos_scale_f32_valid(float s) {
    // NaN fails both comparisons; -0.0 passes them, so the sign bit is tested on its own
    return s >= 0.0f && s <= (float) BITCOS_MAX_SCALE && !signbit(s);
}

bool ggml_bitcos_is_type(enum ggml_type type) {
    return type == GGML_TYPE_BITCOS_G128 || type == GGML_TYPE_BITCOS_PT || type == GGML_TYPE_BITCOS;
}

int ggml_bitcos_variant(enum ggml_type type) {
    return type == GGML_TYPE_BITCOS_G128 ? BITCOS_VARIANT_G128 : type == GGML_TYPE_BITCOS_PT ? BITCOS_VARIANT_PT : -1;
}

bool ggml_bitcos_type_has_variant(enum ggml_type type, int variant) {
    return variant >= 0 && variant < BITCOS_VARIANT_COUNT && bitcos_variant_type_id(variant) == (int) type;
}

void ggml_bitcos_read_header(const void * cdata, struct ggml_bitcos_header * h) {
    const uint8_t * p   = (const uint8_t *) cdata;
    h->magic            = rd_u32(p + BITCOS_HDR_MAGIC);
    h->version          = rd_u16(p + BITCOS_HDR_VERSION);
    h->variant          = p[BITCOS_HDR_VARIANT];
    h->row_group_log2   = p[BITCOS_HDR_ROW_GROUP_LOG2];
    h->n_cols           = rd_u64(p + BITCOS_HDR_N_COLS);
    h->n_rows           = rd_u64(p + BITCOS_HDR_N_ROWS);
    h->n_mats           = rd_u64(p + BITCOS_HDR_N_MATS);
    h->n_sign_bits      = rd_u64(p + BITCOS_HDR_N_SIGN_BITS);
    h->scales_offset    = rd_u64(p + BITCOS_HDR_SCALES_OFFSET);
    h->row_base_offset  = rd_u64(p + BITCOS_HDR_ROW_BASE_OFFSET);
    h->row_delta_offset = rd_u64(p + BITCOS_HDR_ROW_DELTA_OFFSET);
    h->pool_offset      = rd_u64(p + BITCOS_HDR_POOL_OFFSET);
    h->pool_bytes       = rd_u64(p + BITCOS_HDR_POOL_BYTES);
}

uint64_t ggml_bitcos_sign_pos(const void * cdata, const struct ggml_bitcos_header * h, uint64_t r) {
    const uint8_t * p     = (const uint8_t *) cdata;
    const uint64_t  base  = rd_u64(p + h->row_base_offset + sizeof(uint64_t) * (r >> h->row_group_log2));
    const uint16_t  delta = rd_u16(p + h->row_delta_offset + sizeof(uint16_t) * r);
    return base + delta;
}

static float rd_f32(const uint8_t * p) {
    const uint32_t u = rd_u32(p);
    float          s;
    memcpy(&s, &u, sizeof s);
    return s;
}

float ggml_bitcos_matrix_scale(const void * cdata, const struct ggml_bitcos_header * h, uint64_t m) {
    return rd_f32((const uint8_t *) cdata + h->scales_offset + sizeof(float) * m);
}

float ggml_bitcos_row_scale(const void * cdata, const struct ggml_bitcos_header * h, uint64_t r) {
    if (bitcos_variant_scale_block(h->variant) != 0) {
        return 0.0f; // block-scaled: no row scale
    }
    const uint64_t i = bitcos_row_scale_index(h->variant, r, h->n_rows / h->n_mats);
    return rd_f32((const uint8_t *) cdata + h->scales_offset + sizeof(float) * i);
}

uint64_t ggml_bitcos_scale_row_bytes(const struct ggml_bitcos_header * h) {
    const int64_t blk = bitcos_variant_scale_block(h->variant);
    return h->variant == BITCOS_VARIANT_B128 || h->variant == BITCOS_VARIANT_B256 ?
               sizeof(uint16_t) * (h->n_cols / (uint64_t) blk) :
               0;
}

const uint8_t * ggml_bitcos_block_scales(const void * cdata, const struct ggml_bitcos_header * h, uint64_t r) {
    return (const uint8_t *) cdata + h->scales_offset + r * ggml_bitcos_scale_row_bytes(h);
}

// Canonical section layout (FORMAT.md §4.1). Returns false on arithmetic overflow.
struct bitcos_layout {
    uint64_t scales_offset, row_base_offset, row_delta_offset, pool_offset, pool_bytes, total;
};

static bool bitcos_layout_of(int variant, uint64_t n_cols, uint64_t n_rows, uint64_t n_mats, uint64_t n_sign_bits,
                             int g, struct bitcos_layout * L) {
    const uint64_t lim = (uint64_t) 1 << 56; // far above any real tensor; keeps the sums below from overflowing
    if (n_rows >= lim || n_mats >= lim || n_sign_bits >= lim || n_cols >= lim ||
        (n_rows != 0 && n_cols > lim / n_rows)) {
        return false;
    }
    uint64_t pos     = BITCOS_HEADER_BYTES;
    L->scales_offset = 0;
    if (variant != BITCOS_VARIANT_G128) {
        L->scales_offset = align_section(pos);
        pos              = L->scales_offset + bitcos_scales_bytes(variant, n_cols, n_rows, n_mats);
    }
    L->row_base_offset  = align_section(pos);
    pos                 = L->row_base_offset + sizeof(uint64_t) * ((n_rows + ((uint64_t) 1 << g) - 1) >> g);
    L->row_delta_offset = align_section(pos);
    pos                 = L->row_delta_offset + sizeof(uint16_t) * n_rows;
    L->pool_offset      = align_section(pos);
    L->pool_bytes       = align_section((n_sign_bits + 7) / 8) + BITCOS_POOL_TAIL_BYTES;
    L->total            = L->pool_offset + L->pool_bytes;
    return true;
}

// Where a row's bitmap lies in the weight data: row r starts at r*row_bytes; 128-weight unit u of it at
// u*unit_bytes (v1: blocks of 18 / 16 bytes; v2: the plain K/8-byte bitmap, so u*16).

// Non-zero weights of a row of k weights: the popcount of its bitmap bytes (the bitmap part of each v1 block).
static uint64_t popcount_row(const uint8_t * row, int variant, int64_t k) {
    const size_t ub = bitcos_block_bytes(variant);
    uint64_t     n  = 0;
    for (int64_t u = 0; u * QK_BITCOS < k; ++u) {
        const int64_t   left  = k - u * QK_BITCOS;
        const size_t    bytes = (size_t) (left < QK_BITCOS ? left : QK_BITCOS) / 8; // 4, 8, 12 or 16
        const uint8_t * p     = row + (size_t) u * ub;
        for (size_t i = 0; i < bytes; i += 4) {
            n += (uint64_t) __builtin_popcount(rd_u32(p + i));
        }
    }
    return n;
}

bool ggml_bitcos_validate(const struct ggml_tensor * w, const void * wdata, const void * cdata, size_t cbytes,
                          char * err, size_t err_size) {
    if (!ggml_bitcos_is_type(w->type)) {
        return ggml_bitcos_fail(err, err_size, "not a BITCOS tensor (type %d)", (int) w->type);
    }
    const int64_t  k      = w->ne[0];
    const uint64_t n_rows = (uint64_t) (w->ne[1] * w->ne[2] * w->ne[3]);
    const uint64_t n_mats = (uint64_t) (w->ne[2] * w->ne[3]);
    if (cdata == NULL || cbytes < BITCOS_HEADER_BYTES) {
        return ggml_bitcos_fail(err, err_size, "companion missing or shorter than the %d-byte header (%zu bytes)",
                                BITCOS_HEADER_BYTES, cbytes);
    }
    struct ggml_bitcos_header h;
    ggml_bitcos_read_header(cdata, &h);
    const uint8_t * c = (const uint8_t *) cdata;
    if (h.magic != BITCOS_MAGIC) {
        return ggml_bitcos_fail(err, err_size, "bad companion magic 0x%08x", h.magic);
    }
    if (h.version < 1 || h.version > BITCOS_FORMAT_VERSION) {
        return ggml_bitcos_fail(err, err_size, "unsupported companion version %u (this build reads versions 1 to %d)",
                                (unsigned) h.version, BITCOS_FORMAT_VERSION);
    }
    if (!ggml_bitcos_type_has_variant(w->type, h.variant)) {
        return ggml_bitcos_fail(err, err_size, "companion variant %u does not match the weight type %s (FORMAT.md 2)",
                                (unsigned) h.variant, ggml_type_name(w->type));
    }
    const int variant = h.variant;
    if (h.version != bitcos_variant_version(variant)) {
        return ggml_bitcos_fail(err, err_size,
                                "companion version %u does not match its variant %d (a version-%d variant)",
                                (unsigned) h.version, variant, bitcos_variant_version(variant));
    }
    const int64_t kmul = bitcos_variant_k_multiple(variant);
    if (k <= 0 || k % kmul != 0) {
        return ggml_bitcos_fail(err, err_size, "row length %lld is not a positive multiple of %lld (variant %d)",
                                (long long) k, (long long) kmul, variant);
    }
    if (h.row_group_log2 > BITCOS_MAX_ROW_GROUP_LOG2) {
        return ggml_bitcos_fail(err, err_size, "row_group_log2 %u > %d", (unsigned) h.row_group_log2,
                                BITCOS_MAX_ROW_GROUP_LOG2);
    }
    if (h.n_cols != (uint64_t) k || h.n_rows != n_rows || h.n_mats != n_mats) {
        return ggml_bitcos_fail(err, err_size,
                                "companion shape (cols %llu, rows %llu, mats %llu) does not match the weight "
                                "(cols %lld, rows %llu, mats %llu)",
                                (unsigned long long) h.n_cols, (unsigned long long) h.n_rows,
                                (unsigned long long) h.n_mats, (long long) k, (unsigned long long) n_rows,
                                (unsigned long long) n_mats);
    }
    struct bitcos_layout L;
    if (!bitcos_layout_of(variant, (uint64_t) k, n_rows, n_mats, h.n_sign_bits, h.row_group_log2, &L)) {
        return ggml_bitcos_fail(err, err_size, "companion sizes overflow");
    }
    if (h.n_sign_bits > n_rows * (uint64_t) k) {
        return ggml_bitcos_fail(err, err_size, "n_sign_bits %llu exceeds the number of weights",
                                (unsigned long long) h.n_sign_bits);
    }
    for (int i = BITCOS_HDR_RESERVED; i < BITCOS_HEADER_BYTES; ++i) {
        if (c[i] != 0) {
            return ggml_bitcos_fail(err, err_size, "reserved header byte %d is not zero", i);
        }
    }
    if (h.scales_offset != L.scales_offset || h.row_base_offset != L.row_base_offset ||
        h.row_delta_offset != L.row_delta_offset || h.pool_offset != L.pool_offset || h.pool_bytes != L.pool_bytes) {
        return ggml_bitcos_fail(err, err_size, "companion section offsets/sizes are not canonical (FORMAT.md 4.1)");
    }
    if (L.total != (uint64_t) cbytes) {
        return ggml_bitcos_fail(err, err_size, "companion size %zu != %llu implied by its header", cbytes,
                                (unsigned long long) L.total);
    }
    // From here on every offset is canonical and inside the companion (its size is checked above), so the
    // accessors read within cbytes. Scales of the companion (FORMAT.md 3.1, 4.2): finite, sign bit clear,
    // <= BITCOS_MAX_SCALE.
    if (variant == BITCOS_VARIANT_PT || variant == BITCOS_VARIANT_MATRIX || variant == BITCOS_VARIANT_ROW) {
        const int per_row = variant == BITCOS_VARIANT_ROW;
        for (uint64_t m = 0; m < (per_row ? n_rows : n_mats); ++m) {
            const float s = rd_f32(c + L.scales_offset + sizeof(float) * m);
            if (!ggml_bitcos_scale_f32_valid(s)) {
                return ggml_bitcos_fail(err, err_size,
                                        "invalid scale %g of %s %llu (valid: finite, >= +0.0, <= %d; "
                                        "FORMAT.md 3.1)",
                                        (double) s, per_row ? "row" : "matrix", (unsigned long long) m,
                                        BITCOS_MAX_SCALE);
            }
        }
    } else if (variant == BITCOS_VARIANT_B128 || variant == BITCOS_VARIANT_B256) {
        const uint64_t nbs = (uint64_t) k / (uint64_t) bitcos_variant_scale_block(variant);
        for (uint64_t b = 0; b < n_rows * nbs; ++b) {
            const uint16_t d = rd_u16(c + L.scales_offset + sizeof(uint16_t) * b);
            if (!ggml_bitcos_scale_f16_valid(d)) {
                return ggml_bitcos_fail(err, err_size,
                                        "invalid fp16 scale 0x%04x in block %llu of row %llu (valid: finite, "
                                        ">= +0.0; FORMAT.md 3.1)",
                                        (unsigned) d, (unsigned long long) (b % nbs), (unsigned long long) (b / nbs));
            }
        }
    }
    // row index invariants: sign_pos(0) = 0, sign_pos(r+1) = sign_pos(r) + popcount(row r), end = S
    const size_t    row_size = (size_t) bitcos_weight_row_bytes(variant, (uint64_t) k);
    const uint8_t * wb       = (const uint8_t *) wdata;
    const uint64_t  gmask    = ((uint64_t) 1 << h.row_group_log2) - 1;
    uint64_t        expect   = 0;
    for (uint64_t r = 0; r < n_rows; ++r) {
        const uint16_t delta = rd_u16(c + L.row_delta_offset + sizeof(uint16_t) * r);
        if ((r & gmask) == 0 && delta != 0) {
            return ggml_bitcos_fail(err, err_size, "row_delta[%llu] of a group's first row is %u, not 0",
                                    (unsigned long long) r, (unsigned) delta);
        }
        const uint64_t pos = rd_u64(c + L.row_base_offset + sizeof(uint64_t) * (r >> h.row_group_log2)) + delta;
        if (pos != expect) {
            return ggml_bitcos_fail(err, err_size, "row index: sign_pos(%llu) = %llu, expected %llu from the bitmap",
                                    (unsigned long long) r, (unsigned long long) pos, (unsigned long long) expect);
        }
        expect += popcount_row(wb + r * row_size, variant, k);
    }
    if (expect != h.n_sign_bits) {
        return ggml_bitcos_fail(err, err_size, "bitmap holds %llu non-zero weights but n_sign_bits = %llu",
                                (unsigned long long) expect, (unsigned long long) h.n_sign_bits);
    }
    // every pool bit beyond S is zero (the tail decoders read past the last sign)
    const uint8_t * pool = c + L.pool_offset;
    if (h.n_sign_bits % 8 != 0 && (pool[h.n_sign_bits / 8] >> (h.n_sign_bits % 8)) != 0) {
        return ggml_bitcos_fail(err, err_size, "sign pool bits beyond n_sign_bits are not zero");
    }
    for (uint64_t i = (h.n_sign_bits + 7) / 8; i < L.pool_bytes; ++i) {
        if (pool[i] != 0) {
            return ggml_bitcos_fail(err, err_size, "sign pool tail byte %llu is not zero", (unsigned long long) i);
        }
    }
    // G128 block scales (in the weight's blocks): finite, sign bit clear (FORMAT.md 3.1); fp16 is
    // <= BITCOS_MAX_SCALE by construction
    if (variant == BITCOS_VARIANT_G128) {
        const size_t   bb = sizeof(block_bitcos_g128);
        const uint64_t nb = (uint64_t) k / QK_BITCOS;
        for (uint64_t b = 0; b < n_rows * nb; ++b) {
            const uint16_t d = rd_u16(wb + b * bb + offsetof(block_bitcos_g128, d));
            if (!ggml_bitcos_scale_f16_valid(d)) {
                return ggml_bitcos_fail(err, err_size,
                                        "invalid fp16 scale 0x%04x in block %llu of row %llu (valid: finite, "
                                        ">= +0.0; FORMAT.md 3.1)",
                                        (unsigned) d, (unsigned long long) (b % nb), (unsigned long long) (b / nb));
            }
        }
    }
    return true;
}

size_t ggml_bitcos_encode(int variant, int64_t k, int64_t n_rows, int64_t n_mats, const int8_t * codes,
                          const uint16_t * block_scales, const float * scales, void * wdst, void * cdst,
                          size_t cdst_size) {
    if (variant < 0 || variant >= BITCOS_VARIANT_COUNT || k <= 0 || k % bitcos_variant_k_multiple(variant) != 0 ||
        n_rows <= 0 || n_mats <= 0 || n_rows % n_mats != 0 || codes == NULL) {
        return 0;
    }
    const int64_t sblk = bitcos_variant_scale_block(variant); // 0: row / matrix scales
    if ((sblk != 0 && block_scales == NULL) || (sblk == 0 && scales == NULL)) {
        return 0;
    }
    // never write a scale the validator refuses (FORMAT.md 3.1)
    if (sblk != 0) {
        for (int64_t b = 0; b < n_rows * (k / sblk); ++b) {
            if (!ggml_bitcos_scale_f16_valid(block_scales[b])) {
                return 0;
            }
        }
    } else {
        for (int64_t m = 0; m < (variant == BITCOS_VARIANT_ROW ? n_rows : n_mats); ++m) {
            if (!ggml_bitcos_scale_f32_valid(scales[m])) {
                return 0;
            }
        }
    }
    // pass 1: per-row popcounts -> S and the largest row group whose deltas fit 16 bits
    uint64_t S      = 0;
    int      g_best = BITCOS_MAX_ROW_GROUP_LOG2;
    for (int g = BITCOS_MAX_ROW_GROUP_LOG2; g >= 0; --g) {
        const int64_t G     = (int64_t) 1 << g;
        bool          fits  = true;
        uint64_t      total = 0;
        for (int64_t r0 = 0; r0 < n_rows && fits; r0 += G) {
            uint64_t delta = 0;
            for (int64_t r = r0; r < r0 + G && r < n_rows; ++r) {
                if (delta > 0xffff) {
                    fits = false;
                    break;
                }
                uint64_t pc = 0;
                for (int64_t j = 0; j < k; ++j) {
                    pc += codes[r * k + j] != 0;
                }
                delta += pc;
                total += pc;
            }
        }
        S = total;
        if (fits) {
            g_best = g;
            break;
        }
    }
    struct bitcos_layout L;
    if (!bitcos_layout_of(variant, (uint64_t) k, (uint64_t) n_rows, (uint64_t) n_mats, S, g_best, &L)) {
        return 0;
    }
    if (cdst == NULL || cdst_size < L.total || wdst == NULL) {
        return (size_t) L.total;
    }
    uint8_t * c = (uint8_t *) cdst;
    memset(c, 0, (size_t) L.total);
    wr_u32(c + BITCOS_HDR_MAGIC, BITCOS_MAGIC);
    wr_u16(c + BITCOS_HDR_VERSION, (uint16_t) bitcos_variant_version(variant));
    c[BITCOS_HDR_VARIANT]        = (uint8_t) variant;
    c[BITCOS_HDR_ROW_GROUP_LOG2] = (uint8_t) g_best;
    wr_u64(c + BITCOS_HDR_N_COLS, (uint64_t) k);
    wr_u64(c + BITCOS_HDR_N_ROWS, (uint64_t) n_rows);
    wr_u64(c + BITCOS_HDR_N_MATS, (uint64_t) n_mats);
    wr_u64(c + BITCOS_HDR_N_SIGN_BITS, S);
    wr_u64(c + BITCOS_HDR_SCALES_OFFSET, L.scales_offset);
    wr_u64(c + BITCOS_HDR_ROW_BASE_OFFSET, L.row_base_offset);
    wr_u64(c + BITCOS_HDR_ROW_DELTA_OFFSET, L.row_delta_offset);
    wr_u64(c + BITCOS_HDR_POOL_OFFSET, L.pool_offset);
    wr_u64(c + BITCOS_HDR_POOL_BYTES, L.pool_bytes);
    if (variant != BITCOS_VARIANT_G128) {
        // scales section (FORMAT.md 4.2), little-endian (the values passed the checks above)
        uint8_t * sp = c + L.scales_offset;
        if (sblk != 0) {
            for (int64_t b = 0; b < n_rows * (k / sblk); ++b) {
                wr_u16(sp + sizeof(uint16_t) * (size_t) b, block_scales[b]);
            }
        } else {
            const int64_t ns = variant == BITCOS_VARIANT_ROW ? n_rows : n_mats;
            for (int64_t m = 0; m < ns; ++m) {
                uint32_t u;
                memcpy(&u, &scales[m], sizeof u);
                wr_u32(sp + sizeof(float) * (size_t) m, u);
            }
        }
    }
    const size_t ub       = bitcos_block_bytes(variant);
    const size_t row_size = (size_t) bitcos_weight_row_bytes(variant, (uint64_t) k);
    uint8_t *    wb       = (uint8_t *) wdst;
    uint8_t *    pool     = c + L.pool_offset;
    uint64_t     pos      = 0;
    memset(wb, 0, row_size * (size_t) n_rows);
    for (int64_t r = 0; r < n_rows; ++r) {
        uint8_t * row_base = c + L.row_base_offset + sizeof(uint64_t) * (size_t) (r >> g_best);
        if ((r & (((int64_t) 1 << g_best) - 1)) == 0) {
            wr_u64(row_base, pos);
        }
        wr_u16(c + L.row_delta_offset + sizeof(uint16_t) * (size_t) r, (uint16_t) (pos - rd_u64(row_base)));
        uint8_t * row = wb + (size_t) r * row_size;
        for (int64_t j = 0; j < k; ++j) {
            const int8_t t = codes[r * k + j];
            if (t != 0) {
                row[(size_t) (j / QK_BITCOS) * ub + (size_t) (j % QK_BITCOS) / 8] |= (uint8_t) (1u << (j % 8));
                if (t < 0) {
                    pool[pos / 8] |= (uint8_t) (1u << (pos % 8));
                }
                pos++;
            }
        }
        if (variant == BITCOS_VARIANT_G128) {
            for (int64_t b = 0; b < k / QK_BITCOS; ++b) {
                wr_u16(row + (size_t) b * ub + offsetof(block_bitcos_g128, d), block_scales[r * (k / QK_BITCOS) + b]);
            }
        }
    }
    return (size_t) L.total;
}
