// ggml-bitcos-sycl: BITCOS MUL_MAT / MUL_MAT_ID in ggml-sycl (see ggml-bitcos-sycl.h).
//
// The weight and its companion sit in the same device buffer (the loader creates the companion in the
// weight's context) and were validated on the host by the loader before upload, so the kernels read the
// companion's header, row index and sign pool unchecked. Each work-group fills the 2 KB code table in local
// memory once. Two kernels, chosen per device at run time:
//  * devices with XMX that does fp16 8 x 16 x 16 (bitcos_sycl::xmx_tiles_supported: Xe2, Xe-HPC): the
//    paper's tiled path (bitcos_sycl::tiled_rows with xmx_contraction): work-groups of 4 sub-groups of 16 lanes, a
//    sub-group decodes a VNNI2 tile of 16 rows and contracts it with up to 8 fp16 activation columns by joint_matrix
//    (dpas); fp16 activations, fp32 accumulation (numerics: bitcos-sycl.hpp). GGML_BITCOS_SYCL_XMX=0 in the
//    environment keeps such a device on the other kernel (for comparison).
//  * every other device: each work-item decodes one output row (bitcos_sycl::rows_dot) for up to 8 columns
//    with fp32 activations and accumulation; work-groups of 16 rows, the paper's 16 lanes with 16 sign cursors.
#include "ggml-bitcos-sycl.h"

#include "../ggml-bitcos-gpu.h"
#include "bitcos-sycl.hpp"
#include "ggml-bitcos.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace {

constexpr int ROWS_PER_GROUP      = 16; // the fp32 kernel: one row per work-item
constexpr int TILE_SUB_GROUPS     = 4;  // the tiled kernel: 16-row sub-groups per work-group
constexpr int ROWS_PER_TILE_GROUP = TILE_SUB_GROUPS * bitcos_sycl::TILE_N;

size_t round_up(size_t n, size_t m) {
    return (n + m - 1) / m * m;
}

// The fp32 kernel over (job, row): work-groups of ROWS_PER_GROUP rows of one job, each filling the code table
// in local memory first (every work-item takes part, so the rows past `rows` return only after it);
// f(g, r, table) for row r < rows of job g.
template <typename F> void submit_rows(const queue_ptr & stream, int64_t rows, int64_t n_jobs, F f) {
    const sycl::nd_range<2> range{ { (size_t) n_jobs, round_up((size_t) rows, ROWS_PER_GROUP) },
                                   { 1, ROWS_PER_GROUP } };
    stream->submit([&](sycl::handler & cgh) {
        sycl::local_accessor<uint16_t, 1> lut(sycl::range<1>(bitcos_sycl::LUT_ENTRIES * bitcos_sycl::LUT_CODES), cgh);
        cgh.parallel_for(range, [=](sycl::nd_item<2> it) {
            const uint16_t * t = bitcos_sycl::lut_fill(lut.get_multi_ptr<sycl::access::decorated::no>().get(), it);
            const int64_t    r = (int64_t) it.get_global_id(1);
            if (r >= rows) {
                return;
            }
            f((int64_t) it.get_global_id(0), r, t);
        });
    });
}

#if BITCOS_SYCL_XMX
// Whether the stream's device takes the tiled joint_matrix kernel (see the top of this file); the device
// query once per device.
bool use_xmx(const queue_ptr & stream) {
    static const bool disabled = [] {
        const char * env = std::getenv("GGML_BITCOS_SYCL_XMX");
        return env && std::strcmp(env, "0") == 0;
    }();
    static std::mutex                             mutex;
    static std::unordered_map<sycl::device, bool> supported;
    if (disabled) {
        return false;
    }
    const sycl::device          dev = stream->get_device();
    std::lock_guard<std::mutex> lock(mutex);
    auto                        it = supported.find(dev);
    if (it == supported.end()) {
        it = supported.emplace(dev, bitcos_sycl::xmx_tiles_supported(dev)).first;
    }
    return it->second;
}

// The tiled kernel over (job, row block): work-groups of TILE_SUB_GROUPS sub-groups of 16 lanes (a functor
// so that its sub-group size is a kernel property, which every SYCL front end parses; job(j): the
// bitcos_sycl::tile_job of dimension-0 index j).
template <typename Job> struct tiled_kernel {
    sycl::local_accessor<uint32_t, 1>   lut, tiles;
    sycl::local_accessor<sycl::half, 1> xs;
    sycl::local_accessor<float, 1>      outs;
    const uint8_t *                     w;
    const uint8_t *                     c;
    int64_t                             rows;
    Job                                 job;

    auto get(sycl::ext::oneapi::experimental::properties_tag) const {
        return sycl::ext::oneapi::experimental::properties{
            sycl::ext::oneapi::experimental::sub_group_size<bitcos_sycl::TILE_N>
        };
    }

    void operator()(sycl::nd_item<2> it) const {
        const bitcos_sycl::tile_group_slm g{ lut.get_multi_ptr<sycl::access::decorated::no>().get(),
                                             xs.get_multi_ptr<sycl::access::decorated::no>().get(),
                                             tiles.get_multi_ptr<sycl::access::decorated::no>().get(),
                                             outs.get_multi_ptr<sycl::access::decorated::no>().get() };
        bitcos_sycl::tiled_rows<bitcos_sycl::xmx_contraction>(it, g, w, c, rows, (int64_t) it.get_group(1),
                                                              job((int64_t) it.get_global_id(0)));
    }
};

// dst rows 0 .. rows of n_jobs jobs (each a column group of one output matrix), job(j) describing job j.
template <typename Job>
void submit_tiled(const queue_ptr & stream, const uint8_t * w, const uint8_t * c, int64_t rows, int64_t n_jobs,
                  Job job) {
    namespace bs = bitcos_sycl;
    const sycl::nd_range<2> range{ { (size_t) n_jobs, round_up((size_t) rows, ROWS_PER_TILE_GROUP) },
                                   { 1, ROWS_PER_TILE_GROUP } };
    stream->submit([&](sycl::handler & cgh) {
        cgh.parallel_for(
            range, tiled_kernel<Job>{
                       sycl::local_accessor<uint32_t, 1>(sycl::range<1>(bs::LUT_ENTRIES * 2), cgh),
                       sycl::local_accessor<uint32_t, 1>(
                           sycl::range<1>(TILE_SUB_GROUPS * bs::WORD_TILES * bs::TILE_DWORDS), cgh),
                       sycl::local_accessor<sycl::half, 1>(sycl::range<1>(bs::TILE_M * bs::X_CHUNK), cgh),
                       sycl::local_accessor<float, 1>(sycl::range<1>(TILE_SUB_GROUPS * bs::TILE_M * bs::TILE_N), cgh),
                       w, c, rows, job });
    });
}
#endif

} // namespace

bool ggml_sycl_bitcos_supports_op(const ggml_tensor * op) {
    return ggml_bitcos_gpu_supports_op(op); // no device limit beyond the shared rules
}

void ggml_sycl_bitcos_mul_mat(ggml_backend_sycl_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1,
                              ggml_tensor * dst) {
    const ggml_bitcos_gpu_mul_mat m    = ggml_bitcos_gpu_mul_mat_of(src0, src1, dst);
    const uint8_t *               w    = m.weight.w;
    const uint8_t *               c    = m.weight.c;
    const int64_t                 rows = m.rows, ne11 = m.ne11, ne12 = m.ne12, ne13 = m.ne13;
    const int64_t                 col_groups = (ne11 + bitcos_sycl::MAX_COLS - 1) / bitcos_sycl::MAX_COLS;
    queue_ptr                     stream     = ctx.stream();

#if BITCOS_SYCL_XMX
    if (use_xmx(stream)) {
        submit_tiled(stream, w, c, rows, ne12 * ne13 * col_groups, [=](int64_t g) {
            const int64_t cg = g % col_groups, bat = g / col_groups;
            const int64_t i12 = bat % ne12, i13 = bat / ne12;
            const int64_t c0 = cg * bitcos_sycl::MAX_COLS;
            const int     nc = (int) std::min<int64_t>(bitcos_sycl::MAX_COLS, ne11 - c0);
            return bitcos_sycl::tile_job{ m.batch_row0(i12, i13),
                                          m.x + i13 * m.s13 + i12 * m.s12 + c0 * m.s11,
                                          m.s11,
                                          nc,
                                          m.d + i13 * m.d3 + i12 * m.d2 + c0 * m.d1,
                                          m.d1,
                                          false };
        });
        return;
    }
#endif
    submit_rows(stream, rows, ne12 * ne13 * col_groups, [=](int64_t g, int64_t r, const uint16_t * t) {
        const int64_t cg = g % col_groups, bat = g / col_groups;
        const int64_t i12 = bat % ne12, i13 = bat / ne12;
        const int64_t row = m.batch_row0(i12, i13) + r; // global row
        const int64_t c0  = cg * bitcos_sycl::MAX_COLS;
        const int     nc  = (int) std::min<int64_t>(bitcos_sycl::MAX_COLS, ne11 - c0);
        float         out[bitcos_sycl::MAX_COLS];
        const float * xc = m.x + i13 * m.s13 + i12 * m.s12 + c0 * m.s11;
        bitcos_sycl::rows_dot(w, c, (uint64_t) row, xc, (uint64_t) m.s11, nc, t, out);
        for (int j = 0; j < nc; ++j) {
            m.d[i13 * m.d3 + i12 * m.d2 + (c0 + j) * m.d1 + r] = out[j];
        }
    });
}

void ggml_sycl_bitcos_mul_mat_id(ggml_backend_sycl_context & ctx, ggml_tensor * dst) {
    const ggml_tensor *          src0      = dst->src[0];
    const ggml_tensor *          src1      = dst->src[1];
    const ggml_tensor *          ids       = dst->src[2];
    const ggml_bitcos_gpu_weight weight    = ggml_bitcos_gpu_weight_of(src0);
    const uint8_t *              w         = weight.w;
    const uint8_t *              c         = weight.c;
    const int64_t                view_row0 = weight.row0;
    const float *                x         = static_cast<const float *>(src1->data);
    const char *                 id        = static_cast<const char *>(ids->data);
    float *                      d         = static_cast<float *>(dst->data);

    const int64_t rows = src0->ne[1], n_experts = src0->ne[2];
    const int64_t n_used = ids->ne[0], n_tokens = ids->ne[1], ids_nb1 = ids->nb[1];
    const int64_t ne11 = src1->ne[1];
    const int64_t s11 = src1->nb[1] / sizeof(float), s12 = src1->nb[2] / sizeof(float);
    const int64_t d1 = dst->nb[1] / sizeof(float), d2 = dst->nb[2] / sizeof(float);
    queue_ptr     stream = ctx.stream();

#if BITCOS_SYCL_XMX
    if (use_xmx(stream)) {
        // one (token, slot) column per job: dpas with M = 1 (the decode, not the contraction, sets the time)
        submit_tiled(stream, w, c, rows, n_tokens * n_used, [=](int64_t g) {
            const int64_t slot = g % n_used, tok = g / n_used;
            const int32_t e    = *reinterpret_cast<const int32_t *>(id + tok * ids_nb1 + slot * sizeof(int32_t));
            // ggml's CPU backend asserts on an out-of-range id; never read out of bounds here
            const bool    skip = e < 0 || e >= n_experts;
            return bitcos_sycl::tile_job{ view_row0 + (skip ? 0 : (int64_t) e) * rows,
                                          x + tok * s12 + (slot % ne11) * s11,
                                          0,
                                          1,
                                          d + tok * d2 + slot * d1,
                                          0,
                                          skip };
        });
        return;
    }
#endif
    submit_rows(stream, rows, n_tokens * n_used, [=](int64_t g, int64_t r, const uint16_t * t) {
        const int64_t slot = g % n_used, tok = g / n_used;
        const int32_t e = *reinterpret_cast<const int32_t *>(id + tok * ids_nb1 + slot * sizeof(int32_t));
        if (e < 0 || e >= n_experts) {
            return; // ggml's CPU backend asserts on an out-of-range id; never read out of bounds here
        }
        const int64_t row = view_row0 + (int64_t) e * rows + r;
        d[tok * d2 + slot * d1 + r] =
            bitcos_sycl::row_dot(w, c, (uint64_t) row, x + tok * s12 + (slot % ne11) * s11, t);
    });
}
