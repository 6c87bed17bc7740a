// Free-function SYCL kernels around csrc/sycl/bitcos-sycl.hpp, compiled at run time by the SYCL runtime's
// kernel compiler (sycl_ext_oneapi_kernel_compiler) in tests/sycl/test-bitcos-sycl.cpp: this project has no
// SYCL device compiler (icpx), but the runtime's JIT runs these on Intel's OpenCL CPU device. ggml-sycl
// would launch the same device functions from its own parallel_for lambdas.
#include "bitcos-sycl.hpp"

namespace syclexp = sycl::ext::oneapi::experimental;

// The 2 KB code table in the work-group's local memory (work_group_static: the runtime compiler of
// 2026.2 crashes on group_local_memory_for_overwrite), filled by all its work-items.
static inline const uint16_t * bitcos_group_lut(sycl::nd_item<1> it) {
    static syclexp::work_group_static<uint16_t[bitcos_sycl::LUT_ENTRIES * bitcos_sycl::LUT_CODES]> lut;
    return bitcos_sycl::lut_fill(&lut[0], it);
}

// dst[c * n_rows + i] = W[row0 + i] . x[c * k ..] for i < n_rows, c < n_x: one work-item per row.
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>) ) void bitcos_mat_vec(
    const uint8_t * blocks, const uint8_t * comp, const float * x, float * dst, uint64_t row0, uint64_t n_rows,
    uint64_t n_x, uint64_t k) {
    const sycl::nd_item<1> it  = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
    const uint16_t *       lut = bitcos_group_lut(it);
    const uint64_t         i   = it.get_global_id(0);
    if (i >= n_rows) {
        return;
    }
    // columns in groups of MAX_COLS: each group decodes the row once (n_x = 1: the decode path)
    for (uint64_t c0 = 0; c0 < n_x; c0 += bitcos_sycl::MAX_COLS) {
        const int nc = (int) (n_x - c0 < (uint64_t) bitcos_sycl::MAX_COLS ? n_x - c0 : bitcos_sycl::MAX_COLS);
        float     out[bitcos_sycl::MAX_COLS];
        if (nc == 1) {
            out[0] = bitcos_sycl::row_dot(blocks, comp, row0 + i, x + c0 * k, lut);
        } else {
            bitcos_sycl::rows_dot(blocks, comp, row0 + i, x + c0 * k, k, nc, lut, out);
        }
        for (int c = 0; c < nc; ++c) {
            dst[(c0 + c) * n_rows + i] = out[c];
        }
    }
}

// y[i * k ..] = dequantized row row0 + i, for i < n_rows.
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>) ) void bitcos_dequantize(
    const uint8_t * blocks, const uint8_t * comp, float * y, uint64_t row0, uint64_t n_rows, uint64_t k) {
    const sycl::nd_item<1> it  = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
    const uint16_t *       lut = bitcos_group_lut(it);
    const uint64_t         i   = it.get_global_id(0);
    if (i >= n_rows) {
        return;
    }
    bitcos_sycl::dequantize_row(blocks, comp, row0 + i, y + i * k, lut);
}

// The tiled path (bitcos_sycl::tiled_rows), launched as ggml-sycl's glue launches it: a 2-D range, dimension 0
// the jobs (here the groups of 8 activation columns), dimension 1 the rows in work-groups of at most
// TILES_MAX_SUB_GROUPS sub-groups of 16 lanes.
constexpr int TILES_MAX_SUB_GROUPS = 4;

template <class Contraction>
static inline void mat_vec_tiles(const uint8_t * blocks, const uint8_t * comp, const float * x, float * dst,
                                 uint64_t row0, uint64_t n_rows, uint64_t n_x, uint64_t k) {
    using namespace bitcos_sycl;
    static syclexp::work_group_static<uint32_t[LUT_ENTRIES * 2]>                                 lut;
    static syclexp::work_group_static<sycl::half[TILE_M * X_CHUNK]>                              xs;
    static syclexp::work_group_static<uint32_t[TILES_MAX_SUB_GROUPS * WORD_TILES * TILE_DWORDS]> tiles;
    static syclexp::work_group_static<float[TILES_MAX_SUB_GROUPS * TILE_M * TILE_N]>             outs;
    const sycl::nd_item<2> it = sycl::ext::oneapi::this_work_item::get_nd_item<2>();
    const int64_t          c0 = (int64_t) it.get_global_id(0) * TILE_M; // this job's first column
    const tile_job         job{ (int64_t) row0,
                        x + c0 * k,
                        (int64_t) k,
                        (int) ((int64_t) n_x - c0 < TILE_M ? (int64_t) n_x - c0 : TILE_M),
                        dst + c0 * n_rows,
                        (int64_t) n_rows,
                        false };
    tiled_rows<Contraction>(it, tile_group_slm{ &lut[0], &xs[0], &tiles[0], &outs[0] }, blocks, comp, (int64_t) n_rows,
                            (int64_t) it.get_group(1), job);
}

// dst as bitcos_mat_vec's, through the tiled path with the portable sub-group contraction.
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<2>) )
    SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<bitcos_sycl::TILE_N>) ) void bitcos_mat_vec_tiles(
        const uint8_t * blocks, const uint8_t * comp, const float * x, float * dst, uint64_t row0, uint64_t n_rows,
        uint64_t n_x, uint64_t k) {
    mat_vec_tiles<bitcos_sycl::sub_group_contraction>(blocks, comp, x, dst, row0, n_rows, n_x, k);
}

#if BITCOS_SYCL_XMX
// The same through joint_matrix (XMX): built everywhere, runnable only on a device with ext_intel_matrix.
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<2>) )
    SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<bitcos_sycl::TILE_N>) ) void bitcos_mat_vec_xmx(
        const uint8_t * blocks, const uint8_t * comp, const float * x, float * dst, uint64_t row0, uint64_t n_rows,
        uint64_t n_x, uint64_t k) {
    mat_vec_tiles<bitcos_sycl::xmx_contraction>(blocks, comp, x, dst, row0, n_rows, n_x, k);
}
#endif
