#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_int32 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_control_flow_attributes : enable

// BITCOS matrix multiply for prompt batches (MUL_MAT with more than 8 columns) in ggml-vulkan: each workgroup
// computes a 32 x 32 tile of D. Per 64 weights of K it decodes the tile's 32 rows once into shared memory
// (t * scale as f32; each row's sign cursor lives in shared memory and advances by the chunk's popcount),
// stages 32 columns of B beside it, and every thread accumulates a 4 x 4 block of outputs in f32. So the
// weight is decoded once per 32 columns instead of once per column as in the mat-vec shader. Both tiles are
// stored K-major (sa[k][row], sb[k][col]), so a thread's 4 rows and 4 columns at one k are two 16-byte shared
// loads, and the multiply loop over the step's 64 k is unrolled: per k, 2 loads and 16 fmas.
// Version 2 (BITCOS_V2, type 162): any K % 32 (words and activations past K are 0), scales by the header's
// variant (MATRIX / ROW per row, B128 / B256 per unit, from the companion).
// Defines from the generator (bitcos-vulkan-shaders-gen.inc): BITCOS_G128, BITCOS_PT or BITCOS_V2,
// BITCOS_BLOCK_U16, BITCOS_SCALE_U16, BITCOS_HDR_*, BITCOS_VARIANT_*.

// For `python3 -m dev.gpu_isa --prompt`: the K-step loop is the hot loop, a lane's share of a step TM x TK / 64
// weights times TN columns; RADV unrolls the 32-trip decode and staging loops and the multiply loop.
// gpu-isa: weights-per-iteration = TM * TK / 64; columns = TN; inner-trips =
#define TM 32   // rows per tile
#define TN 32   // columns per tile
#define TK 64   // weights of K per step: one 64-bit bitmap word

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout (binding = 0) readonly buffer A {uint16_t data_a[];};
layout (binding = 1) readonly buffer B {float data_b[];};
layout (binding = 2) writeonly buffer D {float data_d[];};
layout (binding = 3) readonly buffer C {uint data_c[];};

layout (push_constant) uniform parameter {
    uint k;          // weights per row
    uint rows;       // output rows (of this matrix)
    uint cols;       // columns of B and D
    uint stride_b;   // floats from one column of B to the next
    uint stride_d;   // floats from one column of D to the next
    uint row0;       // global row of the matrix's first row (the companion's row index is global)
    uint pad0;
    uint pad1;
} p;

shared float sa[TK][TM];
shared float sb[TK][TN];
shared uint cursor[TM];

#include "bitcos_decode.glsl"

void main() {
    const uint tid  = gl_LocalInvocationID.x;
    const uint m0   = gl_WorkGroupID.x * TM;
    const uint n0   = gl_WorkGroupID.y * TN;
    const uint n_words = p.k / 32;        // 32-weight bitmap words per row
    const uint rb   = row_u16(p.k);       // a row's u16 in data_a
    const uint pool_word0 = comp_u32(BITCOS_HDR_POOL_OFFSET) >> 2;
#if defined(BITCOS_PT) || defined(BITCOS_V2)
    const uint rows_per_mat = comp_u32(BITCOS_HDR_N_ROWS) / comp_u32(BITCOS_HDR_N_MATS);
    const uint scales = comp_u32(BITCOS_HDR_SCALES_OFFSET);
#endif
#if defined(BITCOS_V2)
    const uint variant = comp_u8(BITCOS_HDR_VARIANT);   // the same for every invocation: uniform branches
#endif

    // decode role: row lr of the tile, 32 of the step's 64 weights (half h); B role: column lr, half h
    const uint lr = tid >> 1;
    const uint h  = tid & 1;
    const uint r  = m0 + lr;          // row within the matrix
    const uint gr = p.row0 + r;       // global row
    if (h == 0) {
        cursor[lr] = r < p.rows ? row_sign_pos(gr) : 0u;
    }
#if defined(BITCOS_PT)
    const float d_row = r < p.rows ? uintBitsToFloat(data_c[(scales >> 2) + gr / rows_per_mat]) : 0.0;
#elif defined(BITCOS_V2)
    const float d_row = r < p.rows ? v2_row_scale(variant, scales, rows_per_mat, gr) : 0.0;
#endif
    // compute role: 4 rows x 4 columns
    const uint tr = (tid >> 3) * 4;
    const uint tc = (tid & 7) * 4;
    float acc[4][4];
    [[unroll]] for (uint i = 0; i < 4; ++i) {
        [[unroll]] for (uint j = 0; j < 4; ++j) {
            acc[i][j] = 0.0;
        }
    }
    barrier();

    for (uint k0 = 0; k0 < p.k; k0 += TK) {
        uint step_count = 0;   // non-zero weights of row lr in this step (h == 0 advances the cursor)
        if (r < p.rows) {
            const uint u   = k0 / 128;                 // the step's 128-weight unit
            const uint w0  = (k0 % 128) / 32;          // first of the step's two 32-bit bitmap words
            // v2: a row ending in a partial unit has no words past K (unit_word gives 0 there)
            const uint lo  = unit_word(gr * rb, u, w0, n_words);
            const uint hi  = unit_word(gr * rb, u, w0 + 1, n_words);
            const uint word = h == 0 ? lo : hi;
#if defined(BITCOS_G128)
            const float d = unpackHalf2x16(uint(data_a[gr * rb + u * BITCOS_BLOCK_U16 + BITCOS_SCALE_U16])).x;
#elif defined(BITCOS_V2)
            const float d = v2_block_scaled(variant) ? v2_unit_scale(variant, scales, p.k, gr, u) : d_row;
#else
            const float d = d_row;
#endif
            // the half-word's signs: one 32-sign window (it has at most 32 non-zero weights), the i-th weight's
            // sign at the count of non-zero weights before it
            const uint window = sign_window(pool_word0, cursor[lr] + (h == 0 ? 0u : bitCount(lo)));
            uint used = 0;
            [[unroll]] for (uint i = 0; i < 32; ++i) {
                const uint present = (word >> i) & 1u;
                const float t = ((window >> used) & 1u) != 0u ? -d : d;
                sa[32*h + i][lr] = present != 0u ? t : 0.0;
                used += present;
            }
            step_count = bitCount(lo) + bitCount(hi);
        } else {
            for (uint i = 0; i < 32; ++i) {
                sa[32*h + i][lr] = 0.0;
            }
        }
        const uint c = n0 + lr;
        for (uint i = 0; i < 32; ++i) {
            // (v2: K % 64 may be 32, then the last step's second half lies past the row: 0)
            sb[32*h + i][lr] = c < p.cols && k0 + 32*h < p.k ? data_b[c * p.stride_b + k0 + 32*h + i] : 0.0;
        }
        barrier();
        if (h == 0) {
            cursor[lr] += step_count;
        }
        [[unroll]] for (uint kk = 0; kk < TK; ++kk) {
            float a[4], b[4];
            [[unroll]] for (uint i = 0; i < 4; ++i) {
                a[i] = sa[kk][tr + i];
                b[i] = sb[kk][tc + i];
            }
            [[unroll]] for (uint i = 0; i < 4; ++i) {
                [[unroll]] for (uint j = 0; j < 4; ++j) {
                    acc[i][j] = fma(a[i], b[j], acc[i][j]);
                }
            }
        }
        barrier();
    }

    [[unroll]] for (uint i = 0; i < 4; ++i) {
        [[unroll]] for (uint j = 0; j < 4; ++j) {
            const uint rr = m0 + tr + i;
            const uint cc = n0 + tc + j;
            if (rr < p.rows && cc < p.cols) {
                data_d[cc * p.stride_d + rr] = acc[i][j];
            }
        }
    }
}
