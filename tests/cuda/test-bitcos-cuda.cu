// Runs the BITCOS CUDA kernels (csrc/cuda/bitcos-cuda.cuh, bitcos-cuda-mmq.cuh: activation quantization, then the
// mat-vec and the batched tensor-core tile kernel on the quantized activations) on a GPU for tests/test_cuda.py, which
// writes the inputs with the project's reference codec and checks the outputs against numpy. Same input format as
// tests/sycl/test-bitcos-sycl.cpp (tests/gpu-cases.hpp; the work-group field is ignored):
//
//   test-bitcos-cuda IN.bin OUT.bin        (OUT: per case the mat-vec's n_x * n_rows f32, then the batched
//                                           path's n_x * n_rows f32; rows row0 .. row0 + n_rows; for a tensor
//                                           of several matrices then MUL_MAT_ID's outputs, mat-vec and batched)
//
// Built by nvcc (`nvcc -std=c++17 -arch=sm_80 -Icsrc -Icsrc/cuda ...`); tests/test_cuda.py compiles it for
// sm_80 and sm_90 everywhere nvcc exists and runs it where a CUDA device exists.
#include "bitcos-cuda-mmq.cuh"

#include "../gpu-cases.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#define CHECK(x)                                                                     \
    do {                                                                             \
        cudaError_t e_ = (x);                                                        \
        if (e_ != cudaSuccess)                                                       \
            throw std::runtime_error(std::string(#x ": ") + cudaGetErrorString(e_)); \
    } while (0)

int main(int argc, char ** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s IN.bin OUT.bin\n", argv[0]);
        return 2;
    }
    try {
        const std::vector<bitcos_gpu_case> cases = bitcos_read_cases(bitcos_read_file(argv[1]));
        cudaDeviceProp                     prop;
        CHECK(cudaGetDeviceProperties(&prop, 0));
        std::printf("device: %s\n", prop.name);
        std::ofstream out(argv[2], std::ios::binary);
        int           case_no = 0;
        for (const bitcos_gpu_case & c : cases) {
            ++case_no;
            const uint64_t nblk = c.blocks.size(), ncomp = c.comp.size();
            const uint64_t n_rows = c.n_rows, k = c.k, n_x = c.n_x, row0 = c.row0;
            uint8_t *      d_blk;
            uint8_t *      d_comp;
            float *        d_x;
            float *        d_dst;
            CHECK(cudaMalloc(&d_blk, nblk ? nblk : 1));
            CHECK(cudaMalloc(&d_comp, ncomp)); // cudaMalloc: 256-byte aligned, as in a ggml buffer
            CHECK(cudaMalloc(&d_x, 4 * n_x * k));
            CHECK(cudaMalloc(&d_dst, 4 * n_x * n_rows));
            CHECK(cudaMemcpy(d_blk, c.blocks.data(), nblk, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(d_comp, c.comp.data(), ncomp, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(d_x, c.x.data(), c.x.size(), cudaMemcpyHostToDevice));
            // the activations quantized per 32 (both paths), then the mat-vec in groups of up to 8 columns (64 KiB
            // tables for odd case numbers, the 8-copy 16 KiB layout for even ones; 8 lanes a row as the glue, and
            // for 1 and 4 columns and MUL_MAT_ID 32 / 16 / 8 lanes by case number % 3: fewer instances to compile),
            // then the batched path on the
            // same case, whatever its column count (the glue takes it above 8 columns)
            const int64_t k_pad = bitcos_cuda_mmq_k_pad((int64_t) k), nqb = k_pad / BITCOS_CUDA_MMQ_QBLOCK;
            int8_t *      d_q;
            float *       d_d;
            CHECK(cudaMalloc(&d_q, n_x * k_pad));
            CHECK(cudaMalloc(&d_d, 4 * n_x * nqb));
            bitcos_cuda_quantize_q8_kernel<<<dim3((unsigned) n_x, (unsigned) ((nqb + 3) / 4)),
                                             dim3(BITCOS_CUDA_WARP, 4)>>>(d_x, d_q, d_d, (int64_t) k, k_pad,
                                                                          (int64_t) k, (int64_t) n_x, 0);
            CHECK(cudaGetLastError());
            const bool full_copies = case_no % 2 == 1;
            const int  warps = 4, lanes = 32 >> (case_no % 3);
            auto       gemv = [&](auto copies, int nc, int64_t c0) {
                constexpr int COPIES = decltype(copies)::value, bytes = bitcos_cuda_gemv_lut<COPIES>::BYTES;
                bitcos_cuda_with_cols(nc, [&](auto ncv) {
                    constexpr int NC  = decltype(ncv)::value;
                    auto          run = [&](auto lv) {
                        constexpr int  LANES          = decltype(lv)::value;
                        const uint64_t rows_per_block = (uint64_t) warps * (BITCOS_CUDA_WARP / LANES);
                        CHECK(cudaFuncSetAttribute(bitcos_cuda_mul_mat_vec_kernel<NC, COPIES, LANES>,
                                                                  cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
                        // 2 blocks at most, so that warps take several row groups each
                        const unsigned gx =
                            (unsigned) std::min<uint64_t>(2, (n_rows + rows_per_block - 1) / rows_per_block);
                        bitcos_cuda_mul_mat_vec_kernel<NC, COPIES, LANES><<<gx, dim3(BITCOS_CUDA_WARP, warps), bytes>>>(
                            d_blk, d_comp, d_q + c0 * k_pad, d_d + c0 * nqb, d_dst + c0 * n_rows, (int64_t) row0,
                            (int64_t) n_rows, k_pad, (int64_t) n_rows);
                    };
                    if constexpr (NC == 1 || NC == 4)
                        bitcos_cuda_with_lanes(lanes, run);
                    else
                        run(std::integral_constant<int, BITCOS_CUDA_GEMV_LANES>{});
                });
            };
            CHECK(cudaMemset(d_dst, 0xFF, 4 * n_x * n_rows)); // NaN: an unwritten output fails the check
            for (uint64_t c0 = 0; c0 < n_x; c0 += BITCOS_CUDA_MAX_COLS) {
                const int nc = (int) std::min<uint64_t>(BITCOS_CUDA_MAX_COLS, n_x - c0);
                if (full_copies)
                    gemv(std::integral_constant<int, 32>{}, nc, (int64_t) c0);
                else
                    gemv(std::integral_constant<int, 8>{}, nc, (int64_t) c0);
            }
            CHECK(cudaGetLastError());
            std::vector<float> dst(n_x * n_rows);
            CHECK(cudaMemcpy(dst.data(), d_dst, 4 * dst.size(), cudaMemcpyDeviceToHost));
            out.write(reinterpret_cast<const char *>(dst.data()), 4 * dst.size());
            CHECK(cudaMemset(d_dst, 0xFF, 4 * n_x * n_rows));
            const dim3 mgrid((unsigned) ((n_rows + BITCOS_CUDA_MMQ_BM - 1) / BITCOS_CUDA_MMQ_BM),
                             (unsigned) ((n_x + BITCOS_CUDA_MMQ_BN - 1) / BITCOS_CUDA_MMQ_BN));
            bitcos_cuda_mul_mat_mmq_kernel<<<mgrid, BITCOS_CUDA_MMQ_THREADS>>>(
                d_blk, d_comp, d_q, d_d, d_dst, (int64_t) row0, (int64_t) n_rows, (int64_t) n_x, k_pad,
                (int64_t) n_rows, bitcos_cuda_mmq_ids{});
            CHECK(cudaGetLastError());
            CHECK(cudaMemcpy(dst.data(), d_dst, 4 * dst.size(), cudaMemcpyDeviceToHost));
            out.write(reinterpret_cast<const char *>(dst.data()), 4 * dst.size());
            // MUL_MAT_ID where the tensor has several matrices (companion header n_mats = E > 1; the whole tensor,
            // row0 0): experts = matrices, ne11 = 2 columns per token when n_x is even (else 1), n_used 2, ids[t][u]
            // = (t + 2 u) % (E + 1) (E: out of range, skipped: its outputs stay NaN); the mat-vec ID kernel, then
            // the batched one (slot grouping + tile kernel over experts). tests/test_cuda.py mirrors this.
            uint64_t n_mats;
            std::memcpy(&n_mats, c.comp.data() + BITCOS_HDR_N_MATS, 8);
            if (n_mats > 1) {
                const int64_t        E = (int64_t) n_mats, rows_e = (int64_t) n_rows / E, n_used = 2;
                const int64_t        ne11 = n_x % 2 == 0 ? 2 : 1, n_tok = (int64_t) n_x / ne11, cap = n_tok * n_used;
                std::vector<int32_t> ids(cap);
                for (int64_t t = 0; t < n_tok; ++t)
                    for (int64_t u = 0; u < n_used; ++u)
                        ids[t * n_used + u] = (int32_t) ((t + 2 * u) % (E + 1));
                int32_t * d_ids;
                int32_t * d_slots;
                int32_t * d_counts;
                float *   d_out;
                CHECK(cudaMalloc(&d_ids, 4 * cap));
                CHECK(cudaMalloc(&d_slots, 4 * cap * E));
                CHECK(cudaMalloc(&d_counts, 4 * E));
                CHECK(cudaMalloc(&d_out, 4 * cap * rows_e));
                CHECK(cudaMemcpy(d_ids, ids.data(), 4 * cap, cudaMemcpyHostToDevice));
                std::vector<float> res(cap * rows_e);
                CHECK(cudaMemset(d_out, 0xFF, 4 * res.size()));
                auto gemv_id = [&](auto copies) {
                    constexpr int COPIES = decltype(copies)::value, bytes = bitcos_cuda_gemv_lut<COPIES>::BYTES;
                    bitcos_cuda_with_lanes(lanes, [&](auto lv) {
                        constexpr int LANES = decltype(lv)::value;
                        CHECK(cudaFuncSetAttribute(bitcos_cuda_mul_mat_vec_id_kernel<COPIES, LANES>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
                        bitcos_cuda_mul_mat_vec_id_kernel<COPIES, LANES>
                            <<<dim3(2, (unsigned) cap), dim3(BITCOS_CUDA_WARP, warps), bytes>>>(
                                d_blk, d_comp, d_q, d_d, d_ids, d_out, rows_e, E, n_used, n_used, ne11, k_pad, rows_e,
                                n_used * rows_e);
                    });
                };
                if (full_copies)
                    gemv_id(std::integral_constant<int, 32>{});
                else
                    gemv_id(std::integral_constant<int, 8>{});
                CHECK(cudaGetLastError());
                CHECK(cudaMemcpy(res.data(), d_out, 4 * res.size(), cudaMemcpyDeviceToHost));
                out.write(reinterpret_cast<const char *>(res.data()), 4 * res.size());
                CHECK(cudaMemset(d_out, 0xFF, 4 * res.size()));
                CHECK(cudaMemset(d_counts, 0, 4 * E));
                // the quantized columns are those of the plain batched run above: column t * ne11 + j
                bitcos_cuda_mmq_id_slots_kernel<<<(unsigned) ((cap + 255) / 256), 256>>>(d_ids, d_slots, d_counts, E,
                                                                                         n_used, n_tok, n_used, cap);
                CHECK(cudaGetLastError());
                const bitcos_cuda_mmq_ids map = { d_slots, d_counts, cap, n_used, ne11, rows_e, n_used * rows_e };
                bitcos_cuda_mul_mat_mmq_kernel<<<
                    dim3((unsigned) ((rows_e + BITCOS_CUDA_MMQ_BM - 1) / BITCOS_CUDA_MMQ_BM),
                         (unsigned) ((cap + BITCOS_CUDA_MMQ_BN - 1) / BITCOS_CUDA_MMQ_BN), (unsigned) E),
                    BITCOS_CUDA_MMQ_THREADS>>>(d_blk, d_comp, d_q, d_d, d_out, 0, rows_e, 0, k_pad, 0, map);
                CHECK(cudaGetLastError());
                CHECK(cudaMemcpy(res.data(), d_out, 4 * res.size(), cudaMemcpyDeviceToHost));
                out.write(reinterpret_cast<const char *>(res.data()), 4 * res.size());
                for (void * p : { (void *) d_ids, (void *) d_slots, (void *) d_counts, (void *) d_out })
                    CHECK(cudaFree(p));
            }
            for (void * p :
                 { (void *) d_blk, (void *) d_comp, (void *) d_x, (void *) d_dst, (void *) d_q, (void *) d_d })
                CHECK(cudaFree(p));
        }
        if (!out)
            throw std::runtime_error("cannot write output");
        return 0;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "test-bitcos-cuda: %s\n", e.what());
        return 1;
    }
}
