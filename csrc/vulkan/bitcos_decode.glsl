// BITCOS reads shared by the ggml-vulkan shaders (mul_mat_vec_bitcos.comp, mul_mm_bitcos.comp): the
// companion's header and row index (data_c, u32 words) and the weight's bitmap words (data_a, u16 words).
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

// pool bit of the first sign of global row r (FORMAT.md §4.3): row_base[r >> g] + row_delta[r]
uint row_sign_pos(const uint r) {
    const uint g = comp_u8(BITCOS_HDR_ROW_GROUP_LOG2);
    return comp_u32(comp_u32(BITCOS_HDR_ROW_BASE_OFFSET) + 8*(r >> g)) + comp_u16(comp_u32(BITCOS_HDR_ROW_DELTA_OFFSET) + 2*r);
}

// 1 when the sign at pool bit pos is negative; pool_word0 = the pool's first u32 word in data_c
uint pool_sign(const uint pool_word0, const uint pos) {
    return (data_c[pool_word0 + (pos >> 5)] >> (pos & 31u)) & 1u;
}
