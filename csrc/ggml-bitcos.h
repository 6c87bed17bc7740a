// ggml-bitcos: the BITCOS ternary types inside ggml (format: docs/FORMAT.md, version 1).
//
// Public header of the patched ggml (copied to ggml/include/ by scripts/build_llama.py). It holds what the
// llama.cpp loader, the CPU backend and tests need: the companion link, load-time validation and a small
// encoder (int8 ternary codes + scales -> weight blocks + companion bytes).
//
// Linking (FORMAT.md §1): a BITCOS weight `w` is a leaf whose src[0] is its companion, an I8 1-D tensor named
// "<w name>.bitcos". A view or reshape of a weight reaches the companion through view_src->src[0]; its rows
// are whole rows of the base tensor, at row offset view_offs / nb1.
#pragma once

#include "ggml.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GGML_BITCOS_COMPANION_SUFFIX ".bitcos"
#define GGML_BITCOS_FORMAT_VERSION   1
#define GGML_BITCOS_HEADER_BYTES     128
#define GGML_BITCOS_MAGIC            0x53435442u  // bytes "BTCS"

// true for GGML_TYPE_BITCOS_G128 and GGML_TYPE_BITCOS_PT
GGML_API bool ggml_bitcos_is_type(enum ggml_type type);

// The companion of a BITCOS weight or of a view of one; NULL when it is not linked (or not an I8 tensor).
GGML_API struct ggml_tensor * ggml_bitcos_companion(const struct ggml_tensor * w);

// Rows of `w` as rows of its base tensor: row (i1, i2, i3) of `w` is base row
// row0 + i1*step[0] + i2*step[1] + i3*step[2]. False when `w` is not a whole-row view of its base (then no
// BITCOS op can use it).
GGML_API bool ggml_bitcos_row_map(const struct ggml_tensor * w, int64_t * row0, int64_t step[3]);

// Parsed companion header (FORMAT.md §4.1).
struct ggml_bitcos_header {
    uint32_t magic;
    uint16_t version;
    uint8_t  variant;          // 0 = G128, 1 = PT
    uint8_t  row_group_log2;
    uint64_t n_cols;
    uint64_t n_rows;
    uint64_t n_mats;
    uint64_t n_sign_bits;
    uint64_t scales_offset;
    uint64_t row_base_offset;
    uint64_t row_delta_offset;
    uint64_t pool_offset;
    uint64_t pool_bytes;
};

// Reads the header fields (little-endian) from the first 128 bytes of companion data.
GGML_API void ggml_bitcos_read_header(const void * cdata, struct ggml_bitcos_header * h);

// Pool bit of the first sign of row r (no checks: call after ggml_bitcos_validate).
GGML_API uint64_t ggml_bitcos_sign_pos(const void * cdata, const struct ggml_bitcos_header * h, uint64_t r);

// Full check of a BITCOS weight and its companion after loading (FORMAT.md §4): header fields canonical,
// row index invariants, pool size and zero tail, finite scales. `w` gives type and shape (a leaf, not a
// view); wdata / cdata are host copies of the weight and companion data, cbytes the companion's size.
// Returns false and writes a message (without the tensor name) into err on the first violation.
GGML_API bool ggml_bitcos_validate(const struct ggml_tensor * w, const void * wdata,
                                   const void * cdata, size_t cbytes, char * err, size_t err_size);

// Encoder (tests, tools). codes: n_rows*k int8 values in {-1,0,1}, row-major (row = output channel, rows of
// matrix m are m*n_rows/n_mats ...). G128: d_fp16 holds one IEEE fp16 scale per block (n_rows*k/128);
// PT: scales holds one float per matrix (n_mats). Writes the weight blocks to wdst (n_rows*k/128 blocks)
// and the companion to cdst. Returns the companion size in bytes; when cdst is NULL or cdst_size is too
// small, writes nothing and only returns the size. Returns 0 on invalid arguments.
GGML_API size_t ggml_bitcos_encode(enum ggml_type type, int64_t k, int64_t n_rows, int64_t n_mats,
                                   const int8_t * codes, const uint16_t * d_fp16, const float * scales,
                                   void * wdst, void * cdst, size_t cdst_size);

#ifdef __cplusplus
}
#endif
