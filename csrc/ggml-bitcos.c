// ggml-bitcos: companion link, load-time validation and encoder of BITCOS tensors (docs/FORMAT.md v1).
// Compiled into ggml-base (see patches/0001); no dependency on a backend.
#include "ggml-bitcos.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define BITCOS_QK 128

static uint64_t rd_u64(const uint8_t * p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) {
        v = (v << 8) | p[i];
    }
    return v;
}

static uint32_t rd_u32(const uint8_t * p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint16_t rd_u16(const uint8_t * p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

static void wr_u64(uint8_t * p, uint64_t v) {
    for (int i = 0; i < 8; ++i) {
        p[i] = (uint8_t)(v >> (8*i));
    }
}

static uint64_t pad64(uint64_t x) {
    return (x + 63) & ~(uint64_t)63;
}

static size_t block_bytes(enum ggml_type type) {
    return type == GGML_TYPE_BITCOS_G128 ? 18 : 16;
}

bool ggml_bitcos_is_type(enum ggml_type type) {
    return type == GGML_TYPE_BITCOS_G128 || type == GGML_TYPE_BITCOS_PT;
}

struct ggml_tensor * ggml_bitcos_companion(const struct ggml_tensor * w) {
    const struct ggml_tensor * base = w->view_src ? w->view_src : w;
    // only a leaf weight carries the link; an op result with a BITCOS type has src[0] = its operand
    if (base->op != GGML_OP_NONE || !ggml_bitcos_is_type(base->type)) {
        return NULL;
    }
    struct ggml_tensor * c = base->src[0];
    if (c == NULL || c->type != GGML_TYPE_I8) {
        return NULL;
    }
    return c;
}

bool ggml_bitcos_row_map(const struct ggml_tensor * w, int64_t * row0, int64_t step[3]) {
    const struct ggml_tensor * base = w->view_src ? w->view_src : w;
    const size_t rb = base->nb[1];
    if (w->ne[0] != base->ne[0] || w->nb[0] != base->nb[0] || rb == 0) {
        return false;
    }
    const size_t offs = w->view_src ? w->view_offs : 0;
    if (offs % rb != 0 || w->nb[1] % rb != 0 || w->nb[2] % rb != 0 || w->nb[3] % rb != 0) {
        return false;
    }
    *row0   = (int64_t)(offs / rb);
    step[0] = (int64_t)(w->nb[1] / rb);
    step[1] = (int64_t)(w->nb[2] / rb);
    step[2] = (int64_t)(w->nb[3] / rb);
    return true;
}

void ggml_bitcos_read_header(const void * cdata, struct ggml_bitcos_header * h) {
    const uint8_t * p = (const uint8_t *) cdata;
    h->magic            = rd_u32(p + 0);
    h->version          = rd_u16(p + 4);
    h->variant          = p[6];
    h->row_group_log2   = p[7];
    h->n_cols           = rd_u64(p + 8);
    h->n_rows           = rd_u64(p + 16);
    h->n_mats           = rd_u64(p + 24);
    h->n_sign_bits      = rd_u64(p + 32);
    h->scales_offset    = rd_u64(p + 40);
    h->row_base_offset  = rd_u64(p + 48);
    h->row_delta_offset = rd_u64(p + 56);
    h->pool_offset      = rd_u64(p + 64);
    h->pool_bytes       = rd_u64(p + 72);
}

uint64_t ggml_bitcos_sign_pos(const void * cdata, const struct ggml_bitcos_header * h, uint64_t r) {
    const uint8_t * p = (const uint8_t *) cdata;
    const uint64_t base  = rd_u64(p + h->row_base_offset + 8*(r >> h->row_group_log2));
    const uint16_t delta = rd_u16(p + h->row_delta_offset + 2*r);
    return base + delta;
}

// Canonical section layout (FORMAT.md §4.1). Returns false on arithmetic overflow.
struct bitcos_layout {
    uint64_t scales_offset, row_base_offset, row_delta_offset, pool_offset, pool_bytes, total;
};

static bool bitcos_layout_of(int variant, uint64_t n_rows, uint64_t n_mats, uint64_t n_sign_bits, int g,
                             struct bitcos_layout * L) {
    const uint64_t lim = (uint64_t)1 << 56;  // far above any real tensor; keeps the sums below from overflowing
    if (n_rows >= lim || n_mats >= lim || n_sign_bits >= lim) {
        return false;
    }
    uint64_t pos = GGML_BITCOS_HEADER_BYTES;
    L->scales_offset = 0;
    if (variant == 1) {
        L->scales_offset = pad64(pos);
        pos = L->scales_offset + 4*n_mats;
    }
    L->row_base_offset  = pad64(pos);
    pos = L->row_base_offset + 8*((n_rows + ((uint64_t)1 << g) - 1) >> g);
    L->row_delta_offset = pad64(pos);
    pos = L->row_delta_offset + 2*n_rows;
    L->pool_offset = pad64(pos);
    L->pool_bytes  = pad64((n_sign_bits + 7)/8) + 64;
    L->total       = L->pool_offset + L->pool_bytes;
    return true;
}

static bool fail(char * err, size_t err_size, const char * fmt, ...) {
    if (err && err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
    }
    return false;
}

static int popcount_block(const uint8_t * blk) {
    uint64_t a, b;
    memcpy(&a, blk, 8);
    memcpy(&b, blk + 8, 8);
    return __builtin_popcountll(a) + __builtin_popcountll(b);
}

bool ggml_bitcos_validate(const struct ggml_tensor * w, const void * wdata,
                          const void * cdata, size_t cbytes, char * err, size_t err_size) {
    if (!ggml_bitcos_is_type(w->type)) {
        return fail(err, err_size, "not a BITCOS tensor (type %d)", (int) w->type);
    }
    const int variant = w->type == GGML_TYPE_BITCOS_PT ? 1 : 0;
    const int64_t k = w->ne[0];
    if (k <= 0 || k % BITCOS_QK != 0) {
        return fail(err, err_size, "row length %lld is not a positive multiple of 128", (long long) k);
    }
    const uint64_t n_rows = (uint64_t)(w->ne[1] * w->ne[2] * w->ne[3]);
    const uint64_t n_mats = (uint64_t)(w->ne[2] * w->ne[3]);
    if (cdata == NULL || cbytes < GGML_BITCOS_HEADER_BYTES) {
        return fail(err, err_size, "companion missing or shorter than the 128-byte header (%zu bytes)", cbytes);
    }
    struct ggml_bitcos_header h;
    ggml_bitcos_read_header(cdata, &h);
    const uint8_t * c = (const uint8_t *) cdata;
    if (h.magic != GGML_BITCOS_MAGIC) {
        return fail(err, err_size, "bad companion magic 0x%08x", h.magic);
    }
    if (h.version != GGML_BITCOS_FORMAT_VERSION) {
        return fail(err, err_size, "unsupported companion version %u (this build reads version %d)",
                    (unsigned) h.version, GGML_BITCOS_FORMAT_VERSION);
    }
    if (h.variant != variant) {
        return fail(err, err_size, "companion variant %u does not match the weight type %s",
                    (unsigned) h.variant, ggml_type_name(w->type));
    }
    if (h.row_group_log2 > 6) {
        return fail(err, err_size, "row_group_log2 %u > 6", (unsigned) h.row_group_log2);
    }
    if (h.n_cols != (uint64_t) k || h.n_rows != n_rows || h.n_mats != n_mats) {
        return fail(err, err_size, "companion shape (cols %llu, rows %llu, mats %llu) does not match the weight "
                    "(cols %lld, rows %llu, mats %llu)", (unsigned long long) h.n_cols, (unsigned long long) h.n_rows,
                    (unsigned long long) h.n_mats, (long long) k, (unsigned long long) n_rows, (unsigned long long) n_mats);
    }
    if (h.n_sign_bits > n_rows * (uint64_t) k) {
        return fail(err, err_size, "n_sign_bits %llu exceeds the number of weights", (unsigned long long) h.n_sign_bits);
    }
    for (int i = 80; i < GGML_BITCOS_HEADER_BYTES; ++i) {
        if (c[i] != 0) {
            return fail(err, err_size, "reserved header byte %d is not zero", i);
        }
    }
    struct bitcos_layout L;
    if (!bitcos_layout_of(variant, n_rows, n_mats, h.n_sign_bits, h.row_group_log2, &L)) {
        return fail(err, err_size, "companion sizes overflow");
    }
    if (h.scales_offset != L.scales_offset || h.row_base_offset != L.row_base_offset ||
        h.row_delta_offset != L.row_delta_offset || h.pool_offset != L.pool_offset || h.pool_bytes != L.pool_bytes) {
        return fail(err, err_size, "companion section offsets/sizes are not canonical (FORMAT.md 4.1)");
    }
    if (L.total != (uint64_t) cbytes) {
        return fail(err, err_size, "companion size %zu != %llu implied by its header", cbytes, (unsigned long long) L.total);
    }
    // per-matrix scales (PT)
    if (variant == 1) {
        for (uint64_t m = 0; m < n_mats; ++m) {
            float s;
            memcpy(&s, c + L.scales_offset + 4*m, 4);
            if (!isfinite(s)) {
                return fail(err, err_size, "scale of matrix %llu is not finite", (unsigned long long) m);
            }
        }
    }
    // row index invariants: sign_pos(0) = 0, sign_pos(r+1) = sign_pos(r) + popcount(row r), end = S
    const size_t   bb       = block_bytes(w->type);
    const int64_t  nb       = k / BITCOS_QK;
    const size_t   row_size = (size_t) nb * bb;
    const uint8_t * wb      = (const uint8_t *) wdata;
    const uint64_t gmask    = ((uint64_t)1 << h.row_group_log2) - 1;
    uint64_t expect = 0;
    for (uint64_t r = 0; r < n_rows; ++r) {
        const uint16_t delta = rd_u16(c + L.row_delta_offset + 2*r);
        if ((r & gmask) == 0 && delta != 0) {
            return fail(err, err_size, "row_delta[%llu] of a group's first row is %u, not 0",
                        (unsigned long long) r, (unsigned) delta);
        }
        const uint64_t pos = rd_u64(c + L.row_base_offset + 8*(r >> h.row_group_log2)) + delta;
        if (pos != expect) {
            return fail(err, err_size, "row index: sign_pos(%llu) = %llu, expected %llu from the bitmap",
                        (unsigned long long) r, (unsigned long long) pos, (unsigned long long) expect);
        }
        const uint8_t * row = wb + r * row_size;
        for (int64_t b = 0; b < nb; ++b) {
            expect += (uint64_t) popcount_block(row + (size_t) b * bb);
        }
    }
    if (expect != h.n_sign_bits) {
        return fail(err, err_size, "bitmap holds %llu non-zero weights but n_sign_bits = %llu",
                    (unsigned long long) expect, (unsigned long long) h.n_sign_bits);
    }
    // every pool bit beyond S is zero (the tail decoders read past the last sign)
    const uint8_t * pool = c + L.pool_offset;
    if (h.n_sign_bits % 8 != 0 && (pool[h.n_sign_bits / 8] >> (h.n_sign_bits % 8)) != 0) {
        return fail(err, err_size, "sign pool bits beyond n_sign_bits are not zero");
    }
    for (uint64_t i = (h.n_sign_bits + 7) / 8; i < L.pool_bytes; ++i) {
        if (pool[i] != 0) {
            return fail(err, err_size, "sign pool tail byte %llu is not zero", (unsigned long long) i);
        }
    }
    // G128 block scales must be finite (a NaN/Inf scale is never produced by a ternary source)
    if (variant == 0) {
        for (uint64_t b = 0; b < n_rows * (uint64_t) nb; ++b) {
            const uint16_t d = rd_u16(wb + b * bb + 16);
            if ((d & 0x7c00u) == 0x7c00u) {
                return fail(err, err_size, "block %llu has a non-finite fp16 scale", (unsigned long long) b);
            }
        }
    }
    return true;
}

size_t ggml_bitcos_encode(enum ggml_type type, int64_t k, int64_t n_rows, int64_t n_mats,
                          const int8_t * codes, const uint16_t * d_fp16, const float * scales,
                          void * wdst, void * cdst, size_t cdst_size) {
    if (!ggml_bitcos_is_type(type) || k <= 0 || k % BITCOS_QK != 0 || n_rows <= 0 || n_mats <= 0 ||
        n_rows % n_mats != 0 || codes == NULL) {
        return 0;
    }
    const int variant = type == GGML_TYPE_BITCOS_PT ? 1 : 0;
    if ((variant == 0 && d_fp16 == NULL) || (variant == 1 && scales == NULL)) {
        return 0;
    }
    // pass 1: per-row popcounts -> S and the largest row group whose deltas fit 16 bits
    uint64_t S = 0;
    int g_best = 6;
    for (int g = 6; g >= 0; --g) {
        const int64_t G = (int64_t)1 << g;
        bool fits = true;
        uint64_t total = 0;
        for (int64_t r0 = 0; r0 < n_rows && fits; r0 += G) {
            uint64_t delta = 0;
            for (int64_t r = r0; r < r0 + G && r < n_rows; ++r) {
                if (delta > 0xffff) {
                    fits = false;
                    break;
                }
                uint64_t pc = 0;
                for (int64_t j = 0; j < k; ++j) {
                    pc += codes[r*k + j] != 0;
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
    if (!bitcos_layout_of(variant, (uint64_t) n_rows, (uint64_t) n_mats, S, g_best, &L)) {
        return 0;
    }
    if (cdst == NULL || cdst_size < L.total || wdst == NULL) {
        return (size_t) L.total;
    }
    uint8_t * c = (uint8_t *) cdst;
    memset(c, 0, (size_t) L.total);
    c[0] = 0x42; c[1] = 0x54; c[2] = 0x43; c[3] = 0x53;  // "BTCS" = 0x53435442 little-endian
    c[4] = GGML_BITCOS_FORMAT_VERSION; c[5] = 0;
    c[6] = (uint8_t) variant;
    c[7] = (uint8_t) g_best;
    wr_u64(c + 8,  (uint64_t) k);
    wr_u64(c + 16, (uint64_t) n_rows);
    wr_u64(c + 24, (uint64_t) n_mats);
    wr_u64(c + 32, S);
    wr_u64(c + 40, L.scales_offset);
    wr_u64(c + 48, L.row_base_offset);
    wr_u64(c + 56, L.row_delta_offset);
    wr_u64(c + 64, L.pool_offset);
    wr_u64(c + 72, L.pool_bytes);
    if (variant == 1) {
        memcpy(c + L.scales_offset, scales, 4*(size_t) n_mats);
    }
    const size_t  bb  = block_bytes(type);
    const int64_t nb  = k / BITCOS_QK;
    uint8_t * wb   = (uint8_t *) wdst;
    uint8_t * pool = c + L.pool_offset;
    uint64_t  pos  = 0;
    for (int64_t r = 0; r < n_rows; ++r) {
        if ((r & (((int64_t)1 << g_best) - 1)) == 0) {
            wr_u64(c + L.row_base_offset + 8*(size_t)(r >> g_best), pos);
        }
        const uint64_t delta = pos - rd_u64(c + L.row_base_offset + 8*(size_t)(r >> g_best));
        c[L.row_delta_offset + 2*r]     = (uint8_t) delta;
        c[L.row_delta_offset + 2*r + 1] = (uint8_t)(delta >> 8);
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t * blk = wb + ((size_t) r * nb + b) * bb;
            memset(blk, 0, 16);
            for (int j = 0; j < BITCOS_QK; ++j) {
                const int8_t t = codes[r*k + b*BITCOS_QK + j];
                if (t != 0) {
                    blk[j/8] |= (uint8_t)(1u << (j % 8));
                    if (t < 0) {
                        pool[pos/8] |= (uint8_t)(1u << (pos % 8));
                    }
                    pos++;
                }
            }
            if (variant == 0) {
                const uint16_t d = d_fp16[r*nb + b];
                blk[16] = (uint8_t) d;
                blk[17] = (uint8_t)(d >> 8);
            }
        }
    }
    return (size_t) L.total;
}
