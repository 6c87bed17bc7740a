#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_int32 : require
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#if defined(BITCOS_Q8_1)
#extension GL_EXT_spirv_intrinsics : require
#endif

// BITCOS mat-vec (MUL_MAT with 1..8 columns, MUL_MAT_ID), the default decode shader (docs/GPU.md §1.1).
// mul_mat_vec_bitcos.comp (GGML_BITCOS_VULKAN_EXACT=1) mirrors TQ2_0's arithmetic bit for bit; this one is
// built for few instructions per weight and rounds differently (f32 fmas in another order: results within
// test-backend-ops' NMSE bound for TQ2_0, not bit-identical).
//
// Partition: each invocation owns one contiguous run of 32-weight bitmap words of the row (the same run in
// every row and column of the workgroup), so a row's sign cursor is found once per row: every invocation
// popcounts its run, one exclusive scan over the workgroup gives the signs before it, and from there it walks
// its run with a running cursor. Per word and row: one 32-sign window from the pool (two u32 words, funnel
// shift); per 4 weights: the presence nibble and the window's next 4 signs index a 256-entry table in shared
// memory (bitcos_nibble_codes.glsl) that returns the 4 codes, and the cursor advances by the nibble's
// popcount. The codes of a word serve every column, its activations every row.
//
// Activations: f32 (the table holds vec4 codes; fmas), or with BITCOS_Q8_1 blocks in ggml-vulkan's q8_1_x4
// layout (int8 with an f16 scale per 32): the table then holds the 4 codes as packed int8 and each 4 weights
// and column take one packed 4x8-bit dot product (OpSDot, SPV_KHR_integer_dot_product: v_dot4 on AMD, dp4a
// on NVIDIA, DP4A on Intel), one int -> float conversion and fma per word and column. The q8_1 form also
// quantizes its activations: dispatched with push constant ncols == 0 it runs quantize_activations instead
// (ggml-bitcos-vulkan.cpp says why the pass shares the pipeline).
//
// Same bindings, push constants, specialization constants and workgroup grid as mul_mat_vec_bitcos.comp
// (ggml-vulkan creates either with TQ2_0's geometry); the same generator defines.

// gpu-isa: weights-per-iteration = 64 * NUM_ROWS; inner-trips =
#define QUANT_K 1

#include "mul_mat_vec_base.glsl"

layout(local_size_x_id = 0, local_size_y = 1, local_size_z = 1) in;

layout (binding = BITCOS_COMPANION_BINDING) readonly buffer C {uint data_c[];};
#if defined(BITCOS_V2)
// B128 / B256 unit scales: fp16 at an even byte of the companion
layout (binding = BITCOS_COMPANION_BINDING) readonly buffer C16 {uint16_t data_c16[];};
#endif
#if !defined(BITCOS_G128)
// PT and version-2 rows are K/8 bytes with K % 32 == 0: their bitmap words are u32-aligned (G128's 18-byte
// blocks are not, so G128 reads two u16)
layout (binding = 0) readonly buffer A32 {uint data_a32[];};
#endif

FLOAT_TYPE temp[NUM_COLS][NUM_ROWS];

#include "bitcos_decode.glsl"
#include "bitcos_nibble_codes.glsl"

#if defined(BITCOS_Q8_1)
// OpSDot with the packed 4x8-bit format (capabilities DotProduct, DotProductInput4x8BitPacked): glslc without
// GL_EXT_integer_dot_product (Debian 12's) still emits it through GL_EXT_spirv_intrinsics
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot_4x8_packed(uint a, uint b, spirv_literal int packed_vector_format_4x8bit);

shared uint codes_sh[256];   // 4 codes as int8 bytes, weight i in byte i

// data_b's q8_1_x4 blocks (block_q8_1_x4_packed128: f16vec2 ds[4]; ivec4 qs[8]) as their 4-byte and 16-byte units
layout (binding = 1) readonly buffer BDS {f16vec2 data_b_ds[];};
layout (binding = 1) readonly buffer BQS {ivec4 data_b_qs[];};

uint pack_codes(const vec4 c) {
    const ivec4 i = ivec4(c);
    return (uint(i.x) & 0xFFu) | ((uint(i.y) & 0xFFu) << 8) | ((uint(i.z) & 0xFFu) << 16) | (uint(i.w) << 24);
}

// The activation pass (ncols == 0): p.stride_b f32 activations, bound as fuse0, into q8_1_x4 blocks in D; per
// 32 activations d = max |x| / 127, q = round(x / d), the f16 pair (d, d * sum q) as ggml-vulkan's
// quantize_q8_1_x4 writes them. QUANTIZE_BLOCKS_PER_WG blocks per workgroup (the backend's grid assumes it).
#define QUANTIZE_BLOCKS_PER_WG 32
layout (binding = 2) writeonly buffer DQ {uint data_dq[];};
layout (binding = 2) writeonly buffer DQ4 {uvec4 data_dq4[];};
layout (binding = 3) readonly buffer XF4 {vec4 data_xf4[];};

void quantize_activations(const uint tid) {
    const uint n_blocks = p.stride_b / 32;
    const uint wg       = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    for (uint b = tid; b < QUANTIZE_BLOCKS_PER_WG; b += BLOCK_SIZE) {
        const uint blk = wg * QUANTIZE_BLOCKS_PER_WG + b;
        if (blk >= n_blocks) {
            return;
        }
        vec4  x[8];
        float amax = 0.0;
        [[unroll]] for (uint i = 0; i < 8; ++i) {
            x[i] = data_xf4[8 * blk + i];
            const vec4 a = abs(x[i]);
            amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
        }
        const float d  = amax / 127.0;
        const float id = d != 0.0 ? 1.0 / d : 0.0;
        uint q[8];
        int  sum = 0;
        [[unroll]] for (uint i = 0; i < 8; ++i) {
            const ivec4 qi = ivec4(round(x[i] * id));
            sum += qi.x + qi.y + qi.z + qi.w;
            q[i] = (uint(qi.x) & 0xFFu) | ((uint(qi.y) & 0xFFu) << 8) | ((uint(qi.z) & 0xFFu) << 16) | (uint(qi.w) << 24);
        }
        // block blk of x4 block blk / 4: its pair at u32 36 (blk / 4) + blk % 4, its 32 bytes at 16-byte unit
        // 9 (blk / 4) + 1 + 2 (blk % 4) (as the hot loop reads them)
        const uint x4 = blk >> 2;
        data_dq[blk + 32 * x4] = packHalf2x16(vec2(d, d * float(sum)));
        data_dq4[2 * blk + x4 + 1] = uvec4(q[0], q[1], q[2], q[3]);
        data_dq4[2 * blk + x4 + 2] = uvec4(q[4], q[5], q[6], q[7]);
    }
}
#else
shared vec4 codes_sh[256];
#endif
shared uint scan_sh[NUM_ROWS][BLOCK_SIZE];

// Exclusive prefix sum of v[n] over the workgroup's invocations, per row n (workgroup-uniform control flow).
void workgroup_exclusive_scan(inout uint v[NUM_ROWS], const uint tid) {
#if USE_SUBGROUP_ADD || USE_SUBGROUP_ADD_NO_SHMEM
    // one subgroup scan; the subgroups' totals through shared memory when the workgroup has several
    uint incl[NUM_ROWS];
    [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
        incl[n] = subgroupInclusiveAdd(v[n]);
    }
    if (gl_NumSubgroups > 1) {
        if (gl_SubgroupInvocationID == gl_SubgroupSize - 1) {
            [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
                scan_sh[n][gl_SubgroupID] = incl[n];
            }
        }
        barrier();
        [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
            uint before = 0;
            for (uint s = 0; s < gl_SubgroupID; ++s) {
                before += scan_sh[n][s];
            }
            incl[n] += before;
        }
    }
    [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
        v[n] = incl[n] - v[n];
    }
#else
    // devices without subgroup arithmetic: one barrier, then each invocation adds the counts before its own
    // (once per row per workgroup; few barriers also keep lavapipe's shader compile short)
    [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
        scan_sh[n][tid] = v[n];
    }
    barrier();
    [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
        uint before = 0;
        for (uint t = 0; t < tid; ++t) {
            before += scan_sh[n][t];
        }
        v[n] = before;
    }
#endif
}

// 32-bit bitmap word w of the row whose first u16 is data_a[row_u16_0]
uint row_word(const uint row_u16_0, const uint w) {
#if defined(BITCOS_G128)
    return bitmap_word(row_u16_0 + (w / 4) * BITCOS_BLOCK_U16, w % 4);
#else
    return data_a32[row_u16_0 / 2 + w];
#endif
}

// compute_outputs' workgroup-uniform values that the hot loop's helpers read (set once, before the hot loop)
uint g_pool_word0;
uint g_num_rows;
bool g_unit_scaled;
uint g_row_blk[NUM_ROWS];   // each row's first u16 in data_a (the last row's for rows past num_rows)
uint g_col_base[NUM_COLS];  // each column's first q8_1 block (BITCOS_Q8_1) or first activation
#if defined(BITCOS_V2)
uint g_scale_u16[NUM_ROWS]; // B128 / B256: each row's first unit scale in data_c16
uint g_words_log2;          // log2 of the 32-weight words per scale: 2 (B128), 3 (B256)
#endif

// The scales of word w's unit (128 weights; B256: 256), per row, for block-scaled rows (G128, v2 B128 / B256);
// 1.0 where the scale is per row or per matrix (applied once after the hot loop). Words w and w + 1 share
// their unit for even w (runs start at even words): the two-word loop reads the scales once.
void unit_scales(const uint w, out float d[NUM_ROWS]) {
    [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
        d[n] = 1.0;
        if (g_unit_scaled && n < g_num_rows) {
#if defined(BITCOS_G128)
            d[n] = unpackHalf2x16(uint(data_a[g_row_blk[n] + (w / 4) * BITCOS_BLOCK_U16 + BITCOS_SCALE_U16])).x;
#elif defined(BITCOS_V2)
            d[n] = unpackHalf2x16(uint(data_c16[g_scale_u16[n] + (w >> g_words_log2)])).x;
#endif
        }
    }
}

// The hot loop's step: 32-weight word w of every row (bitmap words bits_w, cursor[n]: the pool bit of the row's
// next sign, d: unit_scales) against every column, into temp.
void accumulate_word(const uint w, const uint bits_w[NUM_ROWS], inout uint cursor[NUM_ROWS], const float d[NUM_ROWS]) {
    // the word's codes, per row (32 weights = 8 entries of 4)
#if defined(BITCOS_Q8_1)
    uint q[NUM_ROWS][8];
#else
    vec4 q[NUM_ROWS][8];
#endif
    [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
        const uint bits = bits_w[n];
        const uint window = sign_window(g_pool_word0, cursor[n]);
        cursor[n] += bitCount(bits);
        // nibble k times 16 in byte k / 2 of `odd` or `even`, so that one bitfield extract yields the table's
        // row offset: codes_sh[signs + 16 * nibble] then costs one add-and-shift for its address
        const uint odd  = bits & 0xF0F0F0F0u;
        const uint even = (bits << 4) & 0xF0F0F0F0u;
        int used = 0;                       // signs of the word taken so far (<= 28 before the last nibble)
        [[unroll]] for (uint k = 0; k < 8; ++k) {
            const uint nib16 = bitfieldExtract((k & 1u) != 0u ? odd : even, int(8 * (k / 2)), 8);
            q[n][k] = codes_sh[bitfieldExtract(window, used, 4) + nib16];
            used += bitCount(nib16);
        }
    }
    [[unroll]] for (uint j = 0; j < NUM_COLS; ++j) {
#if defined(BITCOS_Q8_1)
        // the word's 32 activations are q8_1 block (column offset + 32 w) / 32: a quarter of an x4 block
        // (through the aliases, no 32-bit multiply: 144-byte x4 blocks put block blk's scale at u32
        // 36 (blk / 4) + blk % 4 = blk + 32 (blk / 4) and its qs at 16-byte unit 9 (blk / 4) + 1 + 2 (blk % 4)
        // = 2 blk + blk / 4 + 1)
        const uint  blk = g_col_base[j] + w;
        const uint  x4  = blk >> 2;
        const float da  = float(data_b_ds[blk + 32 * x4].x);
        const ivec4 b0  = data_b_qs[2 * blk + x4 + 1];
        const ivec4 b1  = data_b_qs[2 * blk + x4 + 2];
        [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
            int s = sdot_4x8_packed(q[n][0], uint(b0.x), 0);
            s += sdot_4x8_packed(q[n][1], uint(b0.y), 0);
            s += sdot_4x8_packed(q[n][2], uint(b0.z), 0);
            s += sdot_4x8_packed(q[n][3], uint(b0.w), 0);
            s += sdot_4x8_packed(q[n][4], uint(b1.x), 0);
            s += sdot_4x8_packed(q[n][5], uint(b1.y), 0);
            s += sdot_4x8_packed(q[n][6], uint(b1.z), 0);
            s += sdot_4x8_packed(q[n][7], uint(b1.w), 0);
            temp[j][n] = fma(d[n] * da, float(s), temp[j][n]);
        }
#else
        const uint b_base = (g_col_base[j] + 32 * w) / 4;
        FLOAT_TYPE sum[NUM_ROWS];
        [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
            sum[n] = FLOAT_TYPE(0);
        }
        [[unroll]] for (uint k = 0; k < 8; ++k) {
            const vec4 b = vec4(data_b_v4[b_base + k]);
            [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
                sum[n] = fma(q[n][k].x, b.x, fma(q[n][k].y, b.y, fma(q[n][k].z, b.z, fma(q[n][k].w, b.w, sum[n]))));
            }
        }
        [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
            temp[j][n] = fma(d[n], sum[n], temp[j][n]);
        }
#endif
    }
}

void compute_outputs(const uint32_t first_row, const uint32_t num_rows, const uint tid) {
    uint a_offset, b_offset, d_offset;
    get_offsets(a_offset, b_offset, d_offset);

    const uint K       = p.ncols;
    const uint n_words = K / 32;                 // 32-weight bitmap words per row (K % 32 == 0 in every version)
    const uint row0    = a_offset / K + first_row;
    const uint rb      = row_u16(K);

    // this invocation's run of words [w_begin, w_end): an even number, so that each two-word step stays in one
    // 128-weight unit (one scale read per row and step)
    const uint run     = ((n_words + BLOCK_SIZE - 1) / BLOCK_SIZE + 1) & ~1u;
    const uint w_begin = min(tid * run, n_words);
    const uint w_end   = min(w_begin + run, n_words);

    const uint pool_word0 = comp_u32(BITCOS_HDR_POOL_OFFSET) >> 2;
#if defined(BITCOS_PT) || defined(BITCOS_V2)
    const uint scales       = comp_u32(BITCOS_HDR_SCALES_OFFSET);
    const uint rows_per_mat = comp_u32(BITCOS_HDR_N_ROWS) / comp_u32(BITCOS_HDR_N_MATS);
#endif
#if defined(BITCOS_G128)
    const bool unit_scaled = true;
#elif defined(BITCOS_PT)
    const bool unit_scaled = false;
#else
    const uint variant     = comp_u8(BITCOS_HDR_VARIANT);   // the same for every invocation: uniform branches
    const bool unit_scaled = v2_block_scaled(variant);
#endif

    // signs before the run, per row: the row's first sign + the popcounts of the runs before this one
    uint cursor[NUM_ROWS];
    [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
        uint c = 0;
        if (n < num_rows) {
            const uint row_blk = (row0 + n) * rb;
            for (uint w = w_begin; w < w_end; ++w) {
                c += bitCount(row_word(row_blk, w));
            }
        }
        cursor[n] = c;
    }
    workgroup_exclusive_scan(cursor, tid);
    [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
        cursor[n] += n < num_rows ? row_sign_pos(row0 + n) : 0u;
    }

    [[unroll]] for (uint j = 0; j < NUM_COLS; ++j) {
        [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
            temp[j][n] = FLOAT_TYPE(0);
        }
    }

    g_pool_word0  = pool_word0;
    g_num_rows    = num_rows;
    g_unit_scaled = unit_scaled;
    // a partial row group's missing rows read the last row's words (valid memory) and use 0 instead: a select,
    // not a branch around the load
    [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
        g_row_blk[n] = (row0 + min(n, num_rows - 1)) * rb;
    }
    [[unroll]] for (uint j = 0; j < NUM_COLS; ++j) {
#if defined(BITCOS_Q8_1)
        g_col_base[j] = (j * p.batch_stride_b + b_offset) / 32;
#else
        g_col_base[j] = j * p.batch_stride_b + b_offset;
#endif
    }
#if defined(BITCOS_V2)
    // B128: K / 128 fp16 scales per row, one per 4 words; B256: K / 256, one per 8 words
    const bool b256 = variant == BITCOS_VARIANT_B256;
    g_words_log2    = b256 ? 3u : 2u;
    [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
        g_scale_u16[n] = scales / 2 + (row0 + min(n, num_rows - 1)) * (b256 ? K / 256 : K / 128);
    }
#endif

    // two words per iteration (loop control, waits and the bitmap load shared: PT and v2 rows' two u32 words
    // become one 64-bit load), then the run's odd word
    uint w = w_begin;
    for (; w + 2 <= w_end; w += 2) {
        uint bits0[NUM_ROWS];
        uint bits1[NUM_ROWS];
        [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
            const uint b0 = row_word(g_row_blk[n], w);
            bits0[n] = n < num_rows ? b0 : 0u;
            const uint b1 = row_word(g_row_blk[n], w + 1);
            bits1[n] = n < num_rows ? b1 : 0u;
        }
        float d[NUM_ROWS];
        unit_scales(w, d);
        accumulate_word(w, bits0, cursor, d);
        accumulate_word(w + 1, bits1, cursor, d);
    }
    if (w < w_end) {   // the row's odd last word
        uint bits0[NUM_ROWS];
        [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
            const uint b0 = row_word(g_row_blk[n], w);
            bits0[n] = n < num_rows ? b0 : 0u;
        }
        float d[NUM_ROWS];
        unit_scales(w, d);
        accumulate_word(w, bits0, cursor, d);
    }

    // a scale per row or per matrix: once, on this invocation's partial sums
    if (!unit_scaled) {
        [[unroll]] for (uint n = 0; n < NUM_ROWS; ++n) {
            if (n >= num_rows) {
                continue;
            }
#if defined(BITCOS_PT)
            const float dr = uintBitsToFloat(data_c[(scales >> 2) + (row0 + n) / rows_per_mat]);
#elif defined(BITCOS_V2)
            const float dr = v2_row_scale(variant, scales, rows_per_mat, row0 + n);
#else
            const float dr = 1.0;
#endif
            [[unroll]] for (uint j = 0; j < NUM_COLS; ++j) {
                temp[j][n] *= dr;
            }
        }
    }

    reduce_result(temp, d_offset, first_row, num_rows, tid);
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
#if defined(BITCOS_Q8_1)
    if (p.ncols == 0) {   // workgroup-uniform: the activation pass
        quantize_activations(tid);
        return;
    }
#endif
    // codes_sh[s + 16 * n] = BITCOS_NIBBLE_CODES[n + 16 * s] (presence nibble n, signs s): the nibble in the high
    // index bits lets the hot loop extract it pre-scaled (see compute_outputs)
    for (uint i = tid; i < 256; i += BLOCK_SIZE) {
        const uint src = (i >> 4) | ((i & 15u) << 4);
#if defined(BITCOS_Q8_1)
        codes_sh[i] = pack_codes(BITCOS_NIBBLE_CODES[src]);
#else
        codes_sh[i] = BITCOS_NIBBLE_CODES[src];
#endif
    }
    barrier();

    const uint first_row = NUM_ROWS * (gl_WorkGroupID.x + gl_NumWorkGroups.x * gl_WorkGroupID.z);

    if (first_row + NUM_ROWS <= p.stride_d) {
        compute_outputs(first_row, NUM_ROWS, tid);
    } else {
        if (first_row >= p.stride_d) {
            return;
        }
        compute_outputs(first_row, p.stride_d - first_row, tid);
    }
}
