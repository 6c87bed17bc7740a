// BITCOS reads shared by the ggml-vulkan shaders (mul_mat_vec_bitcos.comp, mul_mm_bitcos.comp): the
// companion's header, scales and row index (data_c, u32 words) and the weight's bitmap words (data_a, u16
// words). Defines: BITCOS_G128, BITCOS_PT or BITCOS_V2 (type 162: the variant is the header's).
// Include after both buffers are declared. Offsets come from the generator's BITCOS_HDR_* defines.
// u64 header fields are read as their low word: the host refuses tensors whose companion or sign count does
// not fit 32 bits.

uint comp_u32(const uint byte_offset) { return data_c[byte_offset >> 2]; }
uint comp_u16(const uint byte_offset) { return (data_c[byte_offset >> 2] >> (8 * (byte_offset & 2))) & 0xffffu; }
uint comp_u8(const uint byte_offset)  { return (data_c[byte_offset >> 2] >> (8 * (byte_offset & 3))) & 0xffu; }

// 32-bit bitmap word w (0..3) of the block whose first u16 is data_a[blk]
uint bitmap_word(const uint blk, const uint w) {
    return uint(data_a[blk + 2*w]) | (uint(data_a[blk + 2*w + 1]) << 16);
}

// Weight rows in data_a's u16: v1 K/128 blocks of BITCOS_BLOCK_U16; v2 (and PT, the same) K/8 bytes.
uint row_u16(const uint k) {
#if defined(BITCOS_G128)
    return (k / 128) * BITCOS_BLOCK_U16;
#else
    return k / 16;
#endif
}

// Bitmap word w (0..3) of 128-weight unit u of the row whose first u16 is data_a[row_blk], 0 past the row's
// n_words 32-weight words: a version-2 row (any K % 32) may end in a partial unit, whose missing words
// belong to the next row (or, for the tensor's last row, lie past it). Their weights would meet only the
// activations past K, which the shaders read as 0, but their bits must not be read at all.
uint unit_word(const uint row_blk, const uint u, const uint w, const uint n_words) {
    return 4*u + w < n_words ? bitmap_word(row_blk + u*BITCOS_BLOCK_U16, w) : 0u;
}

#if defined(BITCOS_V2)
// Version-2 scales (FORMAT.md §4.2) at byte `scales` of the companion: the fp32 scale of global row r for
// MATRIX (rows_per_mat rows per matrix) and ROW, 0 for the block-scaled B128 / B256.
float v2_row_scale(const uint variant, const uint scales, const uint rows_per_mat, const uint r) {
    if (variant == BITCOS_VARIANT_ROW) {
        return uintBitsToFloat(data_c[(scales >> 2) + r]);
    }
    if (variant == BITCOS_VARIANT_B128 || variant == BITCOS_VARIANT_B256) {
        return 0.0;
    }
    return uintBitsToFloat(data_c[(scales >> 2) + r / rows_per_mat]);
}

// The fp32 value of the fp16 scale of 128-weight unit u of global row r for B128 / B256 (k: the row length).
float v2_unit_scale(const uint variant, const uint scales, const uint k, const uint r, const uint u) {
    const uint per_row = variant == BITCOS_VARIANT_B256 ? k / 256 : k / 128;
    const uint idx = variant == BITCOS_VARIANT_B256 ? u >> 1 : u;
    return unpackHalf2x16(comp_u16(scales + 2*(r*per_row + idx))).x;
}

bool v2_block_scaled(const uint variant) {
    return variant == BITCOS_VARIANT_B128 || variant == BITCOS_VARIANT_B256;
}
#endif

// pool bit of the first sign of global row r (FORMAT.md §4.3): row_base[r >> g] + row_delta[r]
uint row_sign_pos(const uint r) {
    const uint g = comp_u8(BITCOS_HDR_ROW_GROUP_LOG2);
    return comp_u32(comp_u32(BITCOS_HDR_ROW_BASE_OFFSET) + 8*(r >> g)) + comp_u16(comp_u32(BITCOS_HDR_ROW_DELTA_OFFSET) + 2*r);
}

// 1 when the sign at pool bit pos is negative; pool_word0 = the pool's first u32 word in data_c
uint pool_sign(const uint pool_word0, const uint pos) {
    return (data_c[pool_word0 + (pos >> 5)] >> (pos & 31u)) & 1u;
}

// 32 signs from pool bit pos on (bit j: the sign of the j-th non-zero weight from pos, 1 = negative). The word
// after the last one a row uses is always readable: the pool is followed by BITCOS_POOL_TAIL_BYTES zeros.
uint sign_window(const uint pool_word0, const uint pos) {
    const uint i = pool_word0 + (pos >> 5);
    // a funnel shift: (31 - pos) & 31 == ~pos & 31, and shifts use only their count's 5 low bits
    return (data_c[i] >> (pos & 31u)) | ((data_c[i + 1] << 1) << (~pos & 31u));
}
