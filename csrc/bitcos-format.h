// bitcos-format.h: the BITCOS v1 on-disk layout as C types and constants (docs/FORMAT.md is the spec).
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
#define BITCOS_TYPE_ID_G128 160
#define BITCOS_TYPE_ID_PT   161

// Weights per block: one presence bitmap of 128 bits (two little-endian u64 words).
#define QK_BITCOS 128

// The two variants; the companion header's `variant` byte holds these values.
enum bitcos_variant {
    BITCOS_VARIANT_G128 = 0,  // fp16 scale per 128-weight block, in the block
    BITCOS_VARIANT_PT   = 1,  // one fp32 scale per matrix, in the companion
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

#ifdef __cplusplus
#define BITCOS_STATIC_ASSERT static_assert
#else
#define BITCOS_STATIC_ASSERT _Static_assert
#endif
BITCOS_STATIC_ASSERT(sizeof(block_bitcos_g128) == QK_BITCOS / 8 + 2, "wrong block_bitcos_g128 size/padding");
BITCOS_STATIC_ASSERT(sizeof(block_bitcos_pt) == QK_BITCOS / 8, "wrong block_bitcos_pt size/padding");
BITCOS_STATIC_ASSERT(offsetof(block_bitcos_g128, d) == QK_BITCOS / 8, "block_bitcos_g128.d must follow the bitmap");

// Bytes of the bitmap part of a block (the same in both variants) and of a whole block of each variant.
#define BITCOS_BITMAP_BYTES     (QK_BITCOS / 8)
#define BITCOS_BLOCK_BYTES_G128 sizeof(block_bitcos_g128)
#define BITCOS_BLOCK_BYTES_PT   sizeof(block_bitcos_pt)

static inline size_t bitcos_block_bytes(int variant) {
    return variant == BITCOS_VARIANT_G128 ? sizeof(block_bitcos_g128) : sizeof(block_bitcos_pt);
}

// Companion tensor (FORMAT.md §4): named <weight name> + suffix, I8, 1-D.
#define BITCOS_COMPANION_SUFFIX  ".bitcos"
#define BITCOS_FORMAT_VERSION    1
#define BITCOS_MAGIC             0x53435442u  // bytes "BTCS"
#define BITCOS_HEADER_BYTES      128
#define BITCOS_SECTION_ALIGN     64           // every section starts at a multiple of this
#define BITCOS_POOL_TAIL_BYTES   64           // zero bytes after the padded pool: one unchecked 64-byte load
#define BITCOS_MAX_ROW_GROUP_LOG2 6

// Valid scales (FORMAT.md §3.1): G128 `d` and PT `scales[m]` are finite, have a clear sign bit (>= +0.0;
// -0.0 and negatives are refused) and are at most this value, the largest finite fp16 (G128 `d` can be no
// larger anyway; PT shares TQ1_0/TQ2_0's fp16 range, so fp32 products with Q8_K scales never overflow).
#define BITCOS_MAX_SCALE 65504

// Byte offsets of the header fields (FORMAT.md §4.1; all little-endian).
enum bitcos_header_offset {
    BITCOS_HDR_MAGIC            = 0,   // u32
    BITCOS_HDR_VERSION          = 4,   // u16
    BITCOS_HDR_VARIANT          = 6,   // u8
    BITCOS_HDR_ROW_GROUP_LOG2   = 7,   // u8
    BITCOS_HDR_N_COLS           = 8,   // u64
    BITCOS_HDR_N_ROWS           = 16,  // u64
    BITCOS_HDR_N_MATS           = 24,  // u64
    BITCOS_HDR_N_SIGN_BITS      = 32,  // u64
    BITCOS_HDR_SCALES_OFFSET    = 40,  // u64
    BITCOS_HDR_ROW_BASE_OFFSET  = 48,  // u64
    BITCOS_HDR_ROW_DELTA_OFFSET = 56,  // u64
    BITCOS_HDR_POOL_OFFSET      = 64,  // u64
    BITCOS_HDR_POOL_BYTES       = 72,  // u64
    BITCOS_HDR_RESERVED         = 80,  // zero up to BITCOS_HEADER_BYTES
};

#ifdef __cplusplus
}
#endif
