// tests/cuda/test-bitcos-cuda.cu's runs, with the kernels of csrc/cuda/bitcos-cuda*.cuh compiled for the host
// against tests/cuda/host-shim (a thread per CUDA thread, barriers for __syncthreads / __syncwarp, shuffles
// through a per-warp buffer, wmma on whole 16 x 16 matrices with its alignment rules checked). Same input and
// output as the device program, so tests/test_cuda.py checks both with the same code; it runs here, in CI,
// where no GPU is: the kernels' source, index math and barrier structure execute, the GPU does not.
//
//   g++ -std=c++20 -O1 -pthread -Itests/cuda/host-shim -Icsrc -Icsrc/cuda tests/cuda/host-emulation.cpp
#include "bitcos-cuda-mmq.cuh"

#include "../gpu-cases.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <vector>

using cuda_shim::launch;

namespace {

// 256-byte aligned host copies, as cudaMalloc's
template <class T> T * dev_alloc(size_t n) {
    void * p = std::aligned_alloc(256, (n * sizeof(T) + 255) / 256 * 256 + 256);
    if (!p)
        throw std::runtime_error("out of memory");
    std::memset(p, 0, (n * sizeof(T) + 255) / 256 * 256 + 256);
    return static_cast<T *>(p);
}

} // namespace

int main(int argc, char ** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s IN.bin OUT.bin\n", argv[0]);
        return 2;
    }
    try {
        const std::vector<bitcos_gpu_case> cases = bitcos_read_cases(bitcos_read_file(argv[1]));
        std::ofstream                      out(argv[2], std::ios::binary);
        auto                               write = [&](const float * p, size_t n) {
            out.write(reinterpret_cast<const char *>(p), 4 * n);
        };
        int case_no = 0;
        for (const bitcos_gpu_case & c : cases) {
            ++case_no;
            const uint64_t n_rows = c.n_rows, k = c.k, n_x = c.n_x, row0 = c.row0;
            uint8_t *      d_blk  = dev_alloc<uint8_t>(c.blocks.size() + 1);
            uint8_t *      d_comp = dev_alloc<uint8_t>(c.comp.size());
            float *        d_x    = dev_alloc<float>(n_x * k);
            float *        d_dst  = dev_alloc<float>(n_x * n_rows);
            std::memcpy(d_blk, c.blocks.data(), c.blocks.size());
            std::memcpy(d_comp, c.comp.data(), c.comp.size());
            std::memcpy(d_x, c.x.data(), c.x.size());
            // as test-bitcos-cuda.cu: quantize, the mat-vec in groups of up to 8 columns (64 KiB tables for odd
            // case numbers, 16 KiB for even ones; 8 lanes a row, for 1 and 4 columns and MUL_MAT_ID 32 / 16 / 8 by
            // case number % 3; 2 blocks at most, so that warps take several row groups), then batched
            const int64_t k_pad = bitcos_cuda_mmq_k_pad((int64_t) k), nqb = k_pad / BITCOS_CUDA_MMQ_QBLOCK;
            int8_t *      d_q = dev_alloc<int8_t>(n_x * k_pad);
            float *       d_d = dev_alloc<float>(n_x * nqb);
            launch(dim3((unsigned) n_x, (unsigned) ((nqb + 3) / 4)), dim3(BITCOS_CUDA_WARP, 4), [&] {
                bitcos_cuda_quantize_q8_kernel(d_x, d_q, d_d, (int64_t) k, k_pad, (int64_t) k, (int64_t) n_x, 0);
            });
            const bool full_copies = case_no % 2 == 1;
            const int  warps = 4, lanes = 32 >> (case_no % 3);
            std::memset(d_dst, 0xFF, 4 * n_x * n_rows);
            for (uint64_t c0 = 0; c0 < n_x; c0 += BITCOS_CUDA_MAX_COLS) {
                const int nc   = (int) std::min<uint64_t>(BITCOS_CUDA_MAX_COLS, n_x - c0);
                auto      gemv = [&](auto copies) {
                    constexpr int COPIES = decltype(copies)::value;
                    bitcos_cuda_with_cols(nc, [&](auto ncv) {
                        constexpr int NC  = decltype(ncv)::value;
                        auto          run = [&](auto lv) {
                            constexpr int  LANES          = decltype(lv)::value;
                            const uint64_t rows_per_block = (uint64_t) warps * (BITCOS_CUDA_WARP / LANES);
                            launch(
                                dim3((unsigned) std::min<uint64_t>(2, (n_rows + rows_per_block - 1) / rows_per_block)),
                                dim3(BITCOS_CUDA_WARP, warps), [&] {
                                    bitcos_cuda_mul_mat_vec_kernel<NC, COPIES, LANES>(
                                        d_blk, d_comp, d_q + c0 * k_pad, d_d + c0 * nqb, d_dst + c0 * n_rows,
                                        (int64_t) row0, (int64_t) n_rows, k_pad, (int64_t) n_rows);
                                });
                        };
                        if constexpr (NC == 1 || NC == 4)
                            bitcos_cuda_with_lanes(lanes, run);
                        else
                            run(std::integral_constant<int, BITCOS_CUDA_GEMV_LANES>{});
                    });
                };
                if (full_copies)
                    gemv(std::integral_constant<int, 32>{});
                else
                    gemv(std::integral_constant<int, 8>{});
            }
            write(d_dst, n_x * n_rows);
            std::memset(d_dst, 0xFF, 4 * n_x * n_rows);
            launch(dim3((unsigned) ((n_rows + BITCOS_CUDA_MMQ_BM - 1) / BITCOS_CUDA_MMQ_BM),
                        (unsigned) ((n_x + BITCOS_CUDA_MMQ_BN - 1) / BITCOS_CUDA_MMQ_BN)),
                   dim3(BITCOS_CUDA_MMQ_THREADS), [&] {
                       bitcos_cuda_mul_mat_mmq_kernel(d_blk, d_comp, d_q, d_d, d_dst, (int64_t) row0, (int64_t) n_rows,
                                                      (int64_t) n_x, k_pad, (int64_t) n_rows, bitcos_cuda_mmq_ids{});
                   });
            write(d_dst, n_x * n_rows);
            uint64_t n_mats;
            std::memcpy(&n_mats, c.comp.data() + BITCOS_HDR_N_MATS, 8);
            if (n_mats > 1) { // as test-bitcos-cuda.cu
                const int64_t E = (int64_t) n_mats, rows_e = (int64_t) n_rows / E, n_used = 2;
                const int64_t ne11 = n_x % 2 == 0 ? 2 : 1, n_tok = (int64_t) n_x / ne11, cap = n_tok * n_used;
                int32_t *     d_ids = dev_alloc<int32_t>(cap);
                for (int64_t t = 0; t < n_tok; ++t)
                    for (int64_t u = 0; u < n_used; ++u)
                        d_ids[t * n_used + u] = (int32_t) ((t + 2 * u) % (E + 1));
                int32_t * d_slots  = dev_alloc<int32_t>(cap * E);
                int32_t * d_counts = dev_alloc<int32_t>(E);
                float *   d_out    = dev_alloc<float>(cap * rows_e);
                std::memset(d_out, 0xFF, 4 * cap * rows_e);
                auto gemv_id = [&](auto copies) {
                    constexpr int COPIES = decltype(copies)::value;
                    bitcos_cuda_with_lanes(lanes, [&](auto lv) {
                        constexpr int LANES = decltype(lv)::value;
                        launch(dim3(2, (unsigned) cap), dim3(BITCOS_CUDA_WARP, warps), [&] {
                            bitcos_cuda_mul_mat_vec_id_kernel<COPIES, LANES>(d_blk, d_comp, d_q, d_d, d_ids, d_out,
                                                                             rows_e, E, n_used, n_used, ne11, k_pad,
                                                                             rows_e, n_used * rows_e);
                        });
                    });
                };
                if (full_copies)
                    gemv_id(std::integral_constant<int, 32>{});
                else
                    gemv_id(std::integral_constant<int, 8>{});
                write(d_out, cap * rows_e);
                std::memset(d_out, 0xFF, 4 * cap * rows_e);
                launch(dim3((unsigned) ((cap + 255) / 256)), dim3(256), [&] {
                    bitcos_cuda_mmq_id_slots_kernel(d_ids, d_slots, d_counts, E, n_used, n_tok, n_used, cap);
                });
                const bitcos_cuda_mmq_ids map = { d_slots, d_counts, cap, n_used, ne11, rows_e, n_used * rows_e };
                launch(dim3((unsigned) ((rows_e + BITCOS_CUDA_MMQ_BM - 1) / BITCOS_CUDA_MMQ_BM),
                            (unsigned) ((cap + BITCOS_CUDA_MMQ_BN - 1) / BITCOS_CUDA_MMQ_BN), (unsigned) E),
                       dim3(BITCOS_CUDA_MMQ_THREADS), [&] {
                           bitcos_cuda_mul_mat_mmq_kernel(d_blk, d_comp, d_q, d_d, d_out, 0, rows_e, 0, k_pad, 0, map);
                       });
                write(d_out, cap * rows_e);
                for (void * p : { (void *) d_ids, (void *) d_slots, (void *) d_counts, (void *) d_out })
                    std::free(p);
            }
            for (void * p :
                 { (void *) d_blk, (void *) d_comp, (void *) d_x, (void *) d_dst, (void *) d_q, (void *) d_d })
                std::free(p);
        }
        if (!out)
            throw std::runtime_error("cannot write output");
        return 0;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "host-emulation: %s\n", e.what());
        return 1;
    }
}
