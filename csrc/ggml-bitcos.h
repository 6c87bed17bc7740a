// ggml-bitcos: the BITCOS ternary types inside ggml (format: docs/FORMAT.md, versions 1 and 2).
//
// Public header of the patched ggml (copied to ggml/include/ with bitcos-format.h by the ggml-bitcos build).
// It holds what the llama.cpp loader, the CPU backend and tests need: the companion link, load-time
// validation and a small encoder (int8 ternary codes + scales -> weight blocks + companion bytes). The
// layout itself (block structs, header offsets, constants) is bitcos-format.h.
//
// Linking (FORMAT.md §1): a BITCOS weight `w` is a leaf whose src[0] is its companion, an I8 1-D tensor named
// "<w name>.bitcos". A view or reshape of a weight reaches the companion through view_src->src[0]; its rows
// are whole rows of the base tensor, at row offset view_offs / nb1.
#pragma once

#include "ggml.h"
#include "bitcos-format.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// true for GGML_TYPE_BITCOS_G128, GGML_TYPE_BITCOS_PT (version 1) and GGML_TYPE_BITCOS (version 2)
GGML_API bool ggml_bitcos_is_type(enum ggml_type type);

// Valid scales (FORMAT.md §3.1): finite, sign bit clear (>= +0.0), at most BITCOS_MAX_SCALE. d is an
// IEEE fp16 bit pattern (G128 / B128 / B256 block scale), s an fp32 matrix or row scale (PT, MATRIX, ROW).
GGML_API bool ggml_bitcos_scale_f16_valid(uint16_t d);
GGML_API bool ggml_bitcos_scale_f32_valid(float s);

// The variant a version-1 type implies: BITCOS_VARIANT_G128 / BITCOS_VARIANT_PT for GGML_TYPE_BITCOS_G128 /
// GGML_TYPE_BITCOS_PT; -1 for GGML_TYPE_BITCOS (its variant, MATRIX / ROW / B128 / B256, is the companion
// header's `variant`: ggml_bitcos_read_header) and for any other type.
GGML_API int ggml_bitcos_variant(enum ggml_type type);

// true when a companion header's `variant` belongs to weight type `type` (FORMAT.md §2: 160 -> G128,
// 161 -> PT, 162 -> MATRIX, ROW, B128, B256).
GGML_API bool ggml_bitcos_type_has_variant(enum ggml_type type, int variant);

// true when `op` reads or writes a BITCOS tensor; a backend's supports_op then decides with its BITCOS rules
// alone (a BITCOS weight is only ever src0 of MUL_MAT / MUL_MAT_ID).
GGML_API bool ggml_bitcos_op_involves(const struct ggml_tensor * op);

// The companion of a BITCOS weight or of a view of one; NULL when it is not linked (or not an I8 tensor).
GGML_API struct ggml_tensor * ggml_bitcos_companion(const struct ggml_tensor * w);

// The rules every GPU backend's BITCOS support shares (ggml-vulkan, ggml-sycl, ggml-cuda; each adds its device
// limits): storage ops on a weight (NONE, RESHAPE, VIEW, PERMUTE, TRANSPOSE) are supported; MUL_MAT /
// MUL_MAT_ID need a contiguous BITCOS src0 of any of the three types linked to its companion with whole ggml
// blocks (128 weights in version 1, 32 in version 2), f32
// activations (unit element stride, f32-aligned strides) and a contiguous f32 output; a view of a weight must
// be consecutive whole rows of a 2-D weight and only under MUL_MAT; MUL_MAT broadcasts as ggml defines it;
// MUL_MAT_ID needs I32 ids and 3-D (not 4-D) operands. Anything else stays with the CPU backend.
GGML_API bool ggml_bitcos_gpu_supports_op(const struct ggml_tensor * op);

// Loader helpers (the llama.cpp model loader calls them; no per-architecture code).
// If `name` is a companion name ("<weight>.bitcos", weight name non-empty), the length of the weight name;
// else 0.
GGML_API size_t ggml_bitcos_companion_weight_name_len(const char * name);

// Links weight `w` to its companion `c` (w->src[0] = c) after checking that `w` is a BITCOS tensor and `c`
// exists (may be NULL: then the error names the missing tensor) and is a 1-D I8 tensor. Returns false and
// writes a message naming the tensors into err otherwise.
GGML_API bool ggml_bitcos_link(struct ggml_tensor * w, struct ggml_tensor * c, char * err, size_t err_size);

// Load-time check of how the model uses a weight (the llama.cpp loader calls it for every tensor it creates,
// before choosing its buffer): a BITCOS type is valid only on the weight of MUL_MAT / MUL_MAT_ID (`op`, the
// use the architecture declares), and never on a tensor read lazily from disk (`lazy`: llama.cpp's
// --lazy-mode, which skips the buffer-type checks and full loading that BITCOS validation needs). True for
// any non-BITCOS tensor; else false with a message naming the tensor in err.
GGML_API bool ggml_bitcos_check_use(const struct ggml_tensor * w, enum ggml_op op, bool lazy, char * err,
                                    size_t err_size);

// Check of a built graph before it is scheduled (llama.cpp calls it for every graph it reserves): every node
// that reads a BITCOS tensor is a view of it or a MUL_MAT / MUL_MAT_ID with it as src0 that one of
// `backends` supports where the weight is stored. Otherwise ggml's scheduler would abort; this returns false
// with a message naming the tensor and the node instead.
struct ggml_backend; // ggml-backend.h's ggml_backend_t is a struct ggml_backend *
GGML_API bool ggml_bitcos_graph_check(struct ggml_cgraph * graph, struct ggml_backend ** backends, int n_backends,
                                      char * err, size_t err_size);

// The message of the last failed model load (or context creation) on the calling thread, "" if none: the
// llama.cpp loader stores every load error here (set_last_error; NULL clears, done at the start of each
// load), so that bindings can show the reason, not only that loading failed. Thread-local, like errno.
GGML_API const char * ggml_bitcos_last_error(void);
GGML_API void         ggml_bitcos_set_last_error(const char * msg);

// Full check of a loaded BITCOS weight (a leaf linked to its companion, both with data in a backend buffer):
// fetches host copies when a buffer is not host memory, then ggml_bitcos_validate(). Returns false and writes
// a message (without the tensor name) into err on the first violation. Nothing unvalidated should reach a
// kernel or be uploaded to a device: call it before the tensor is used.
GGML_API bool ggml_bitcos_validate_tensor(const struct ggml_tensor * w, char * err, size_t err_size);

// Rows of `w` as rows of its base tensor: row (i1, i2, i3) of `w` is base row
// row0 + i1*step[0] + i2*step[1] + i3*step[2]. False when `w` is not a whole-row view of its base (then no
// BITCOS op can use it).
GGML_API bool ggml_bitcos_row_map(const struct ggml_tensor * w, int64_t * row0, int64_t step[3]);

// ---- The 2-bit codes form (docs/KERNELS.md §8-9) ----
//
// ggml-cpu's extra buffer type GGML_BITCOS_CODES_BUFT_NAME holds BITCOS weights decoded at load into the 2-bit
// codes form (bitcos-kernels.h, bitcos_codes_rows) where that form is predicted faster on this machine. A weight's
// allocation there: [codes, rows of the base tensor, bitcos_codes_row_bytes(K) apart][state block][the companion's
// header and scales section as the file has it (so the companion accessors below work on it), then for v1 G128
// the block scales copied out of its bitmap blocks]. Its companion keeps only a stub allocation: the sign pool is
// not kept.
#define GGML_BITCOS_CODES_BUFT_NAME "CPU_BITCOS_2BIT"

// The decode's outcome, written into the weight's allocation when the weight and its companion have both been
// set (the buffer validates them first, with ggml_bitcos_validate). ggml_bitcos_validate_tensor reports it.
enum ggml_bitcos_codes_status {
    GGML_BITCOS_CODES_PENDING = 0, // one of the two tensors has not been set
    GGML_BITCOS_CODES_READY   = 1,
    GGML_BITCOS_CODES_INVALID = 2, // `error` says why
};

struct ggml_bitcos_codes_state {
    uint32_t status;         // enum ggml_bitcos_codes_status
    uint32_t g128_scale_row; // v1 G128: bytes per row of the copied block scales; else 0
    uint64_t g128_scales;    // v1 G128: their offset from the start of the copied companion; else 0
    uint64_t decode_ns;      // wall time of its validation and decode
    char     error[232];
};

// true when `buffer` is a CPU_BITCOS_2BIT buffer (compared by buffer type name: ggml-base cannot see ggml-cpu)
GGML_API bool   ggml_bitcos_is_codes_buffer(struct ggml_backend_buffer * buffer);
// Bytes of the codes (all rows of the base weight w) and offsets in its allocation; alloc_size is what the
// buffer type allocates for w (an upper bound on every variant's scales; untouched pages cost no memory).
GGML_API size_t ggml_bitcos_codes_bytes(const struct ggml_tensor * w);
GGML_API size_t ggml_bitcos_codes_state_offset(const struct ggml_tensor * w);
GGML_API size_t ggml_bitcos_codes_companion_offset(const struct ggml_tensor * w);
GGML_API size_t ggml_bitcos_codes_alloc_size(const struct ggml_tensor * w);
// Seconds the decode of a weight in the codes form took; -1 when w is not in a CPU_BITCOS_2BIT buffer.
GGML_API double ggml_bitcos_codes_decode_seconds(const struct ggml_tensor * w);

// The model's zero density over its BITCOS weights, which the loader reads from the companion headers before any
// buffer type is chosen (the codes form's choice needs it, and no data is loaded yet). Kept in the weight's
// op_params (a leaf has none of its own); ggml_bitcos_model_zero_density returns -1 when it was never set.
GGML_API void  ggml_bitcos_set_model_zero_density(struct ggml_tensor * w, float z);
GGML_API float ggml_bitcos_model_zero_density(const struct ggml_tensor * w);

// ---- BITCOS weights as TQ2_0 on devices without BITCOS kernels ----
//
// The llama.cpp loader gives a device that runs TQ2_0 but not BITCOS (Metal, or any backend that gains TQ2_0) the
// weights TQ2_0 can hold exactly, decoded on the host at load. Before anything is loaded it reads each
// companion's first ggml_bitcos_tq2_0_exact_bytes bytes from the file and asks ggml_bitcos_tq2_0_exact; both
// treat the bytes as untrusted (the full validation runs when the weight is decoded).
// Bytes of the companion's header and scales section (what ggml_bitcos_tq2_0_exact reads); 0 when the header is
// not a BITCOS header or its scales section is not where the format puts it.
GGML_API size_t ggml_bitcos_tq2_0_exact_bytes(const void * header);
// True when w's weights are TQ2_0-exact (FORMAT.md §10: K % 256 == 0; B256; MATRIX / PT / ROW scales that are
// fp16 values; B128 with both halves of each 256-block sharing a scale). Else false with the reason in why.
GGML_API bool   ggml_bitcos_tq2_0_exact(const struct ggml_tensor * w, const void * cdata, size_t cbytes, char * why,
                                        size_t why_size);

// Parsed companion header (FORMAT.md §4.1; field offsets: enum bitcos_header_offset).
struct ggml_bitcos_header {
    uint32_t magic;
    uint16_t version;
    uint8_t  variant; // enum bitcos_variant
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

// Reads the header fields (little-endian) from the first BITCOS_HEADER_BYTES bytes of companion data.
GGML_API void ggml_bitcos_read_header(const void * cdata, struct ggml_bitcos_header * h);

// Pool bit of the first sign of row r (no checks: call after ggml_bitcos_validate).
GGML_API uint64_t ggml_bitcos_sign_pos(const void * cdata, const struct ggml_bitcos_header * h, uint64_t r);

// Scale accessors (FORMAT.md §4.2; no checks: call after ggml_bitcos_validate, which makes every offset
// canonical and inside the companion).
// PT / MATRIX: the fp32 scale of matrix m.
GGML_API float           ggml_bitcos_matrix_scale(const void * cdata, const struct ggml_bitcos_header * h, uint64_t m);
// The fp32 scale of row r for the row-scaled variants: PT / MATRIX the scale of r's matrix (r / (R / M)),
// ROW row r's own; 0 for the block-scaled variants (G128, B128, B256).
GGML_API float           ggml_bitcos_row_scale(const void * cdata, const struct ggml_bitcos_header * h, uint64_t r);
// B128 / B256: the fp16 scales of row r in the companion, K / bitcos_variant_scale_block(variant) IEEE fp16
// values, little-endian, 2 bytes apart; rows are ggml_bitcos_scale_row_bytes(h) apart. (G128's scales are
// in the weight's blocks: offsetof(block_bitcos_g128, d), 18 bytes apart.)
GGML_API const uint8_t * ggml_bitcos_block_scales(const void * cdata, const struct ggml_bitcos_header * h, uint64_t r);
// Bytes of one row's companion block scales: 2 * K / 128 (B128), 2 * K / 256 (B256); 0 for other variants.
GGML_API uint64_t        ggml_bitcos_scale_row_bytes(const struct ggml_bitcos_header * h);

// Full check of a BITCOS weight and its companion after loading (FORMAT.md §3, §3.1, §4): version and
// variant match the weight type (version 1: 160 / 161 with variant 0 / 1; version 2: 162 with 2..5), K a
// positive multiple of the variant's (bitcos_variant_k_multiple), header fields canonical (scales section
// sized by bitcos_scales_bytes), row index invariants against each row's bitmap popcount, pool size and zero
// tail, valid scales (ggml_bitcos_scale_*_valid; messages name the matrix, the row, or block and row). `w`
// gives type and shape (a leaf, not a view); wdata is a host copy of the weight data (ggml_nbytes(w) bytes:
// R * K/8 for GGML_TYPE_BITCOS), cdata of the companion, cbytes the companion's size. Every offset the
// header holds is checked before it is used: a crafted companion cannot make it read out of bounds.
// Returns false and writes a message (without the tensor name) into err on the first violation.
GGML_API bool ggml_bitcos_validate(const struct ggml_tensor * w, const void * wdata, const void * cdata, size_t cbytes,
                                   char * err, size_t err_size);

// Encoder (tests, tools), any variant (enum bitcos_variant; the weight's ggml type is
// bitcos_variant_type_id(variant)). codes: n_rows*k int8 values in {-1,0,1}, row-major (row = output channel,
// rows of matrix m are m*n_rows/n_mats ...); k a positive multiple of bitcos_variant_k_multiple(variant).
// Block-scaled variants (G128, B128, B256): block_scales holds the IEEE fp16 scales, n_rows * k /
// bitcos_variant_scale_block(variant) of them, row by row; scales is ignored. PT / MATRIX: scales holds one
// float per matrix (n_mats); ROW: one per row (n_rows); block_scales is ignored. Writes the weight data to
// wdst (ggml_row_size(type, k) * n_rows bytes: v1 blocks, v2 K/8 bitmap bytes per row) and the companion to
// cdst. Returns the companion size in bytes; when cdst is NULL or cdst_size is too small, writes nothing and
// only returns the size. Returns 0 on invalid arguments, an invalid scale (ggml_bitcos_scale_*_valid,
// -0.0 included) among them: the encoder never writes a file the validator refuses.
GGML_API size_t ggml_bitcos_encode(int variant, int64_t k, int64_t n_rows, int64_t n_mats, const int8_t * codes,
                                   const uint16_t * block_scales, const float * scales, void * wdst, void * cdst,
                                   size_t cdst_size);

#ifdef __cplusplus
}
#endif
