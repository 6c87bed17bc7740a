// bitcos-format.h: the BITCOS on-disk layout (versions 1 and 2) as C types and constants (docs/FORMAT.md is
// the spec).
//
// The one C home of the format's sizes and offsets: ggml's type traits (type_size = sizeof the block struct),
// the validator and encoder (ggml-bitcos.c), the CPU glue, every kernel (generic, AVX2, AVX-512), the bench
// tool, the C tests and the GPU backends include this header instead of repeating numbers. It depends on
// nothing but <stdint.h> so that the standalone kernel harness (root CMakeLists.txt) and shader or device
// code generators can use it too. The Python mirror is ggml_bitcos/format.py (tests check the two agree).
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// ggml type ids (FORMAT.md §2): far above upstream's 0..42 and the forks' 36..39 / 142..143.
#define BITCOS_TYPE_ID_G128   160 // version 1: bitmap + fp16 scale per 128 weights
#define BITCOS_TYPE_ID_PT     161 // version 1: bitmap per 128 weights, one fp32 scale per matrix
// version 2 (GGML_TYPE_BITCOS): bitmap only, 32 weights per block; every scale lives in the companion, at the
// granularity its header's variant names
#define BITCOS_TYPE_ID_BITMAP 162

// Weights per version-1 block, and the kernels' unit: one presence bitmap of 128 bits (two little-endian
// u64 words). Version-2 rows are cut into the same 128-weight units; a row whose length is not a multiple
// of 128 ends in a partial unit of 32, 64 or 96 weights.
#define QK_BITCOS        128
// Weights per version-2 ggml block (the row-length granularity of GGML_TYPE_BITCOS): a 32-bit bitmap.
#define QK_BITCOS_BITMAP 32
// Weights per fp16 scale of variant B256, and its row-length multiple: the 256-weight super-block of the
// TQ1_0 / TQ2_0 tensors it is converted from.
#define QK_BITCOS_B256   256

// The variants; the companion header's `variant` byte holds these values (FORMAT.md §4.1). 0 and 1 are
// version 1 (their own ggml types), 2..5 version 2 (all GGML_TYPE_BITCOS, told apart by the header).
enum bitcos_variant {
    BITCOS_VARIANT_G128   = 0, // v1: fp16 scale per 128-weight block, in the weight's block
    BITCOS_VARIANT_PT     = 1, // v1: one fp32 scale per matrix, in the companion
    BITCOS_VARIANT_MATRIX = 2, // v2: one fp32 scale per matrix (BitNet: per-tensor absmean)
    BITCOS_VARIANT_ROW    = 3, // v2: one fp32 scale per row (TriLM, ParetoQ, BitCPM: per output channel)
    BITCOS_VARIANT_B128   = 4, // v2: fp16 scale per 128 weights of a row (Bonsai, CAT-Q, PQ2_0)
    BITCOS_VARIANT_B256   = 5, // v2: fp16 scale per 256 weights of a row (TQ1_0 / TQ2_0 sources)
    BITCOS_VARIANT_COUNT  = 6,
};

// FORMAT.md §3. Weight k of a block is bit k % 8 of bits[k / 8]; read as little-endian u64, word w bit i is
// weight 64w + i. `d` is an IEEE binary16 (ggml_half) scale.
typedef struct {
    uint8_t  bits[QK_BITCOS / 8];
    uint16_t d;
} block_bitcos_g128;

typedef struct {
    uint8_t bits[QK_BITCOS / 8];
} block_bitcos_pt;

// Version 2: the weight tensor is the bitmap alone, K/8 bytes per row; weight k of a row is bit k % 8 of
// byte k / 8 of the row (for K % 128 == 0 byte for byte the layout of block_bitcos_pt rows).
typedef struct {
    uint8_t bits[QK_BITCOS_BITMAP / 8];
} block_bitcos;

#ifdef __cplusplus
#    define BITCOS_STATIC_ASSERT static_assert
#else
#    define BITCOS_STATIC_ASSERT _Static_assert
#endif
BITCOS_STATIC_ASSERT(sizeof(block_bitcos_g128) == QK_BITCOS / 8 + 2, "wrong block_bitcos_g128 size/padding");
BITCOS_STATIC_ASSERT(sizeof(block_bitcos_pt) == QK_BITCOS / 8, "wrong block_bitcos_pt size/padding");
BITCOS_STATIC_ASSERT(offsetof(block_bitcos_g128, d) == QK_BITCOS / 8, "block_bitcos_g128.d must follow the bitmap");
BITCOS_STATIC_ASSERT(sizeof(block_bitcos) == QK_BITCOS_BITMAP / 8, "wrong block_bitcos size/padding");

// Bytes of the bitmap part of a block (the same in both variants) and of a whole block of each variant.
#define BITCOS_BITMAP_BYTES     (QK_BITCOS / 8)
#define BITCOS_BLOCK_BYTES_G128 sizeof(block_bitcos_g128)
#define BITCOS_BLOCK_BYTES_PT   sizeof(block_bitcos_pt)

// The helpers below are the format's arithmetic for host and device code alike: under nvcc they are
// __host__ __device__ (else CUDA kernels could not call them and would need copies); elsewhere plain C.
#if defined(__CUDACC__)
#    define BITCOS_FORMAT_FN static inline __host__ __device__
#else
#    define BITCOS_FORMAT_FN static inline
#endif

// Bytes from one 128-weight unit's bitmap to the next within a row: 18 for v1 G128 (the scale sits between),
// 16 for every other variant.
BITCOS_FORMAT_FN size_t bitcos_block_bytes(int variant) {
    return variant == BITCOS_VARIANT_G128 ? sizeof(block_bitcos_g128) : sizeof(block_bitcos_pt);
}

// Format version of a variant: 1 for G128 / PT, 2 for the rest.
BITCOS_FORMAT_FN int bitcos_variant_version(int variant) {
    return variant <= BITCOS_VARIANT_PT ? 1 : 2;
}

// ggml type id a variant is stored as.
BITCOS_FORMAT_FN int bitcos_variant_type_id(int variant) {
    return variant == BITCOS_VARIANT_G128 ? BITCOS_TYPE_ID_G128 :
           variant == BITCOS_VARIANT_PT   ? BITCOS_TYPE_ID_PT :
                                            BITCOS_TYPE_ID_BITMAP;
}

// Row length K must be a positive multiple of this: 128 (v1, B128), 256 (B256), 32 (MATRIX, ROW).
BITCOS_FORMAT_FN int64_t bitcos_variant_k_multiple(int variant) {
    return variant == BITCOS_VARIANT_B256                                      ? QK_BITCOS_B256 :
           (variant == BITCOS_VARIANT_MATRIX || variant == BITCOS_VARIANT_ROW) ? QK_BITCOS_BITMAP :
                                                                                 QK_BITCOS;
}

// Weights per scale along a row for block-scaled variants (G128, B128: 128; B256: 256); 0 for the variants
// with one scale per row or matrix (PT, MATRIX, ROW).
BITCOS_FORMAT_FN int64_t bitcos_variant_scale_block(int variant) {
    return (variant == BITCOS_VARIANT_G128 || variant == BITCOS_VARIANT_B128) ? QK_BITCOS :
           variant == BITCOS_VARIANT_B256                                     ? QK_BITCOS_B256 :
                                                                                0;
}

// Bytes of one row of the weight tensor (FORMAT.md §3): K/128 blocks of the variant's size in version 1, the
// K/8-byte bitmap in version 2.
BITCOS_FORMAT_FN uint64_t bitcos_weight_row_bytes(int variant, uint64_t n_cols) {
    return bitcos_variant_version(variant) == 1 ? n_cols / QK_BITCOS * bitcos_block_bytes(variant) : n_cols / 8;
}

// Index of row r's fp32 scale in the companion's scales section (FORMAT.md §4.2) for the row-scaled variants:
// PT / MATRIX its matrix's (r / rows per matrix), ROW its own. Block-scaled variants have no row scale.
BITCOS_FORMAT_FN uint64_t bitcos_row_scale_index(int variant, uint64_t r, uint64_t rows_per_mat) {
    return variant == BITCOS_VARIANT_ROW ? r : r / rows_per_mat;
}

// Bytes of the companion's scales section (FORMAT.md §4.2): PT / MATRIX f32[M], ROW f32[R], B128 / B256
// f16[R][K / block]; 0 for G128 (its scales are in the weight blocks).
BITCOS_FORMAT_FN uint64_t bitcos_scales_bytes(int variant, uint64_t n_cols, uint64_t n_rows, uint64_t n_mats) {
    switch (variant) {
        case BITCOS_VARIANT_PT:
        case BITCOS_VARIANT_MATRIX:
            return 4 * n_mats;
        case BITCOS_VARIANT_ROW:
            return 4 * n_rows;
        case BITCOS_VARIANT_B128:
        case BITCOS_VARIANT_B256:
            return 2 * n_rows * (n_cols / (uint64_t) bitcos_variant_scale_block(variant));
        default:
            return 0;
    }
}

// Companion tensor (FORMAT.md §4): named <weight name> + suffix, I8, 1-D.
#define BITCOS_COMPANION_SUFFIX   ".bitcos"
#define BITCOS_FORMAT_VERSION     2           // the newest version; readers accept 1 and 2
#define BITCOS_MAGIC              0x53435442u // bytes "BTCS"
#define BITCOS_HEADER_BYTES       128
#define BITCOS_SECTION_ALIGN      64          // every section starts at a multiple of this
#define BITCOS_POOL_TAIL_BYTES    64          // zero bytes after the padded pool: one unchecked 64-byte load
#define BITCOS_MAX_ROW_GROUP_LOG2 6

// Valid scales (FORMAT.md §3.1): every scale of every variant (fp16 block scales, fp32 matrix and row scales)
// is finite, has a clear sign bit (>= +0.0; -0.0 and negatives are refused) and is at most this value, the
// largest finite fp16 (fp16 scales can be no larger anyway; fp32 ones share TQ1_0/TQ2_0's fp16 range, so
// fp32 products with Q8_K scales never overflow).
#define BITCOS_MAX_SCALE 65504

// Byte offsets of the header fields (FORMAT.md §4.1; all little-endian).
enum bitcos_header_offset {
    BITCOS_HDR_MAGIC            = 0,  // u32
    BITCOS_HDR_VERSION          = 4,  // u16
    BITCOS_HDR_VARIANT          = 6,  // u8: enum bitcos_variant (0, 1 with version 1; 2..5 with version 2)
    BITCOS_HDR_ROW_GROUP_LOG2   = 7,  // u8
    BITCOS_HDR_N_COLS           = 8,  // u64
    BITCOS_HDR_N_ROWS           = 16, // u64
    BITCOS_HDR_N_MATS           = 24, // u64
    BITCOS_HDR_N_SIGN_BITS      = 32, // u64
    BITCOS_HDR_SCALES_OFFSET    = 40, // u64
    BITCOS_HDR_ROW_BASE_OFFSET  = 48, // u64
    BITCOS_HDR_ROW_DELTA_OFFSET = 56, // u64
    BITCOS_HDR_POOL_OFFSET      = 64, // u64
    BITCOS_HDR_POOL_BYTES       = 72, // u64
    BITCOS_HDR_RESERVED         = 80, // zero up to BITCOS_HEADER_BYTES
};

#ifdef __cplusplus
}
#endif
