#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_int32 : require

// BITCOS mat-vec (MUL_MAT with 1..8 columns, MUL_MAT_ID) for ggml-vulkan: docs/FORMAT.md, csrc/vulkan/README.
//
// Why this shape: a BITCOS model converted from TQ2_0 must generate the same tokens as its source on the same
// backend, and a 1-ulp difference in a matmul output flips a token within a few dozen steps. So this shader
// mirrors mul_mat_vec_tq2_0.comp's arithmetic exactly: the same threads (16 per 256-weight superblock, each
// thread the weights 128*v_im + 2*v_in + 16*m + l, m < 8, l < 2), the same per-thread fma chain over
// q = t + 1 in {0, 1, 2} and the same activation sum, one fma by the block scale per superblock, and the
// base's reduce_result(). Only the decode differs: q comes from the presence bitmap and the sign pool.
//
// A thread finds the sign of its weight at bit sign_pos(row) + (non-zero weights of the row before it): it
// keeps the count of every superblock before its current one (each thread popcounts the bitmaps of the
// superblocks its workgroup walks in parallel) and adds the popcounts inside its own block.
//
// Version 2 (BITCOS_V2, type 162): rows of any K % 32, so the last 128-weight unit may be partial (its missing
// bitmap words read as 0, its missing activations as 0); the scale is the header variant's: MATRIX / ROW fp32
// per matrix / row from the companion (as PT), B128 / B256 fp16 per unit / superblock from the companion (as
// G128's d; B256 gives both halves TQ2_0's one d, so a B256 tensor from TQ2_0 gives TQ2_0's results).
//
// Bindings: 0 weight blocks (as u16: G128 blocks are 18 bytes), 1 B, 2 D, 3/4 fused operands, 5 ids (ID
// only), BITCOS_COMPANION_BINDING the companion (as u32). Defines from the generator (bitcos-vulkan-shaders-
// gen.inc, taken from bitcos-format.h): BITCOS_G128, BITCOS_PT or BITCOS_V2, BITCOS_BLOCK_U16 (block size in
// u16), BITCOS_SCALE_U16 (G128: where d is), BITCOS_HDR_* (header field offsets), BITCOS_VARIANT_*.

// For `python3 -m dev.gpu_isa` (dev/gpu_isa.py): the superblock loop is the hot loop, 16
// weights per lane and row an iteration; inside it the row loop and each row's recount of the step's superblocks.
// gpu-isa: weights-per-iteration = 16 * NUM_ROWS; inner-trips = NUM_ROWS, BLOCK_SIZE / 16

// get_offsets() then returns, as a_offset, the first weight of the matrix (batch_stride_a = K * rows): the
// companion's row index needs global rows, not byte offsets
#define QUANT_K 1

#include "mul_mat_vec_base.glsl"

layout(local_size_x_id = 0, local_size_y = 1, local_size_z = 1) in;

layout (binding = BITCOS_COMPANION_BINDING) readonly buffer C {uint data_c[];};

FLOAT_TYPE temp[NUM_COLS][NUM_ROWS];

#include "bitcos_decode.glsl"

// non-zero weights of 128-weight unit u of a row (0 for the words past the row: unit_word)
uint block_popcount(const uint row_blk, const uint u, const uint n_words) {
    return bitCount(unit_word(row_blk, u, 0, n_words)) + bitCount(unit_word(row_blk, u, 1, n_words)) +
           bitCount(unit_word(row_blk, u, 2, n_words)) + bitCount(unit_word(row_blk, u, 3, n_words));
}

// non-zero weights of superblock s (256 weights = units 2s, 2s + 1; what lies past the row counts 0)
uint superblock_popcount(const uint row_blk, const uint s, const uint n_words) {
    return block_popcount(row_blk, 2*s, n_words) + block_popcount(row_blk, 2*s + 1, n_words);
}

void compute_outputs(const uint32_t first_row, const uint32_t num_rows) {
    uint a_offset, b_offset, d_offset;
    get_offsets(a_offset, b_offset, d_offset);

    const uint K    = p.ncols;
    const uint n_words = K / 32;                // 32-weight bitmap words per row
    const uint nblk = (K + 127) / 128;          // 128-weight units per row (v2: the last may be partial)
    const uint nsb  = (nblk + 1) / 2;           // 256-weight superblocks per row (the last may be partial)
    const uint row0 = a_offset / K + first_row; // global row of this workgroup's first row

    // mul_mat_vec_tq2_0.comp's partition: 16 threads per superblock
    const uint it_size = gl_WorkGroupSize.x/16;
    const uint tid = gl_LocalInvocationID.x;
    const uint itid = tid%16;
    const uint ix = tid/16;
    const uint v_im = itid/8;
    const uint v_in = itid - 8*v_im;
    const uint l0 = 2*v_in;
    const uint y_offset = 128*v_im + l0;

    // companion header (FORMAT.md §4.1)
    const uint pool_word0 = comp_u32(BITCOS_HDR_POOL_OFFSET) >> 2;
#if defined(BITCOS_PT) || defined(BITCOS_V2)
    const uint scales     = comp_u32(BITCOS_HDR_SCALES_OFFSET);
    const uint rows_per_mat = comp_u32(BITCOS_HDR_N_ROWS) / comp_u32(BITCOS_HDR_N_MATS);
#endif
#if defined(BITCOS_V2)
    const uint variant = comp_u8(BITCOS_HDR_VARIANT);   // the same for every invocation: uniform branches
#endif

    [[unroll]] for (uint j = 0; j < NUM_COLS; ++j) {
        [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
            temp[j][n] = FLOAT_TYPE(0);
        }
    }

    uint sign0[NUM_ROWS];    // pool bit of the first sign of the current step's first superblock, per row
    [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
        const uint r = row0 + n;
        sign0[n] = n < num_rows ? row_sign_pos(r) : 0;
    }

    for (uint i0 = 0; i0 < nsb; i0 += it_size) {
        const uint i = i0 + ix;
        [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
            if (n >= num_rows) {
                continue;
            }
            const uint row_blk = (row0 + n) * row_u16(K);
            // signs before superblock i, and the step's total for the next step
            uint before = sign0[n];
            uint step_total = 0;
            uint own = 0;                       // non-zero weights of superblock i
            for (uint s = i0; s < i0 + it_size && s < nsb; ++s) {
                const uint c = superblock_popcount(row_blk, s, n_words);
                before += s < i ? c : 0;
                own = s == i ? c : own;
                step_total += c;
            }
            sign0[n] += step_total;

            // TQ2_0 skips superblocks past the row; a partial last superblock (K % 256 <= 128) has no v_im = 1
            // half
            if (i >= nsb || 2*i + v_im >= nblk) {
                continue;
            }
            const uint u = 2*i + v_im;                  // this thread's 128-weight unit
            if (v_im == 1) {
                before += block_popcount(row_blk, 2*i, n_words);
            }

            // q = t + 1 of the thread's 16 weights, in the order TQ2_0 reads them: q[m][l] is weight 16m + l0 + l
            // of the block, i.e. bit l0 + l + 16*(m & 1) of bitmap word m / 2
            FLOAT_TYPE q[8][2];
            uint count = before;
            [[unroll]] for (uint w = 0; w < 4; ++w) {
                const uint word = unit_word(row_blk, u, w, n_words);
                [[unroll]] for (uint h = 0; h < 2; ++h) {
                    [[unroll]] for (uint l = 0; l < 2; ++l) {
                        const uint bit = 16*h + l0 + l;
                        const uint pos = count + bitCount(word & ((1u << bit) - 1u));
                        q[2*w + h][l] = FLOAT_TYPE(((word >> bit) & 1u) == 0u ? 1u : 2u - 2u*pool_sign(pool_word0, pos));
                    }
                }
                count += bitCount(word);
            }

            // An empty superblock contributes exactly 0, as in TQ2_0, whose quantizer stores d = 0 there, and as
            // on the CPU (whose integer lanes are exactly 0 there): with the stored scale (a row / matrix scale is
            // never 0) the fma chains' rounding residual (sumq - sumb != 0 when every q = 1) would leak in.
#if defined(BITCOS_G128)
            const FLOAT_TYPE d = own == 0 ? FLOAT_TYPE(0) : FLOAT_TYPE(unpackHalf2x16(uint(data_a[row_blk + u*BITCOS_BLOCK_U16 + BITCOS_SCALE_U16])).x);
#elif defined(BITCOS_PT)
            const FLOAT_TYPE d = own == 0 ? FLOAT_TYPE(0) : FLOAT_TYPE(uintBitsToFloat(data_c[(scales >> 2) + (row0 + n) / rows_per_mat]));
#else
            const FLOAT_TYPE d = own == 0 ? FLOAT_TYPE(0) : FLOAT_TYPE(v2_block_scaled(variant)
                ? v2_unit_scale(variant, scales, K, row0 + n, u) : v2_row_scale(variant, scales, rows_per_mat, row0 + n));
#endif
            const uint y_idx = i * 256 + y_offset;
#if defined(BITCOS_V2)
            // a partial last unit: the thread's activations at y_idx + 16m past K are not read (they belong to
            // the next column, or lie past B) but taken as 0, which adds exactly nothing below; y_idx < K
            const uint y_lim = K - y_idx;
#endif

            [[unroll]] for (uint j = 0; j < NUM_COLS; ++j) {
                vec2 bm[8];
                [[unroll]] for (uint m = 0; m < 8; ++m) {
#if defined(BITCOS_V2)
                    bm[m] = 16*m < y_lim ? vec2(data_b_v2[(j*p.batch_stride_b + b_offset + y_idx) / 2 + 8*m]) : vec2(0);
#else
                    bm[m] = vec2(data_b_v2[(j*p.batch_stride_b + b_offset + y_idx) / 2 + 8*m]);
#endif
                }
                const vec2 b0 = bm[0], b16 = bm[1], b32 = bm[2], b48 = bm[3], b64 = bm[4], b80 = bm[5], b96 = bm[6], b112 = bm[7];

                FLOAT_TYPE sumq = FLOAT_TYPE(0.0);
                FLOAT_TYPE sumb = FLOAT_TYPE(0.0);
                [[unroll]] for (int l = 0; l < 2; ++l) {
                    sumq = fma(FLOAT_TYPE(b0[l]),   q[0][l],
                           fma(FLOAT_TYPE(b16[l]),  q[1][l],
                           fma(FLOAT_TYPE(b32[l]),  q[2][l],
                           fma(FLOAT_TYPE(b48[l]),  q[3][l],
                           fma(FLOAT_TYPE(b64[l]),  q[4][l],
                           fma(FLOAT_TYPE(b80[l]),  q[5][l],
                           fma(FLOAT_TYPE(b96[l]),  q[6][l],
                           fma(FLOAT_TYPE(b112[l]), q[7][l], sumq))))))));
                    sumb += FLOAT_TYPE(b0[l]) + FLOAT_TYPE(b16[l]) + FLOAT_TYPE(b32[l]) + FLOAT_TYPE(b48[l])
                          + FLOAT_TYPE(b64[l]) + FLOAT_TYPE(b80[l]) + FLOAT_TYPE(b96[l]) + FLOAT_TYPE(b112[l]);
                }
                temp[j][n] = fma(d, sumq - sumb, temp[j][n]);
            }
        }
    }

    reduce_result(temp, d_offset, first_row, num_rows, tid);
}

void main() {
    const uint first_row = NUM_ROWS * (gl_WorkGroupID.x + gl_NumWorkGroups.x * gl_WorkGroupID.z);

    if (first_row + NUM_ROWS <= p.stride_d) {
        compute_outputs(first_row, NUM_ROWS);
    } else {
        if (first_row >= p.stride_d) {
            return;
        }
        compute_outputs(first_row, p.stride_d - first_row);
    }
}
