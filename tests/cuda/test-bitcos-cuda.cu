// Runs the BITCOS CUDA kernels (csrc/cuda/bitcos-cuda.cuh: the mat-vec, and the batched path: activation
// quantization + the tensor-core tile kernel) on a GPU for tests/test_cuda.py, which writes the inputs with the
// project's reference codec and checks the outputs against numpy. Same input format as
// tests/sycl/test-bitcos-sycl.cpp (tests/gpu-cases.hpp; the work-group field is ignored):
//
//   test-bitcos-cuda IN.bin OUT.bin        (OUT: per case the mat-vec's n_x * n_rows f32, then the batched
//                                           path's n_x * n_rows f32; rows row0 .. row0 + n_rows)
//
// Built by nvcc (`nvcc -std=c++17 -arch=sm_80 -Icsrc -Icsrc/cuda ...`); tests/test_cuda.py compiles it for
// sm_80 and sm_90 everywhere nvcc exists and runs it where a CUDA device exists.
#include "bitcos-cuda.cuh"

#include "../gpu-cases.hpp"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) throw std::runtime_error(std::string(#x ": ") + cudaGetErrorString(e_)); } while (0)

int main(int argc, char ** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s IN.bin OUT.bin\n", argv[0]);
        return 2;
    }
    try {
        const std::vector<bitcos_gpu_case> cases = bitcos_read_cases(bitcos_read_file(argv[1]));
        cudaDeviceProp prop;
        CHECK(cudaGetDeviceProperties(&prop, 0));
        std::printf("device: %s\n", prop.name);
        std::ofstream out(argv[2], std::ios::binary);
        for (const bitcos_gpu_case & c : cases) {
            const uint64_t nblk = c.blocks.size(), ncomp = c.comp.size();
            const uint64_t n_rows = c.n_rows, k = c.k, n_x = c.n_x, row0 = c.row0;
            uint8_t * d_blk; uint8_t * d_comp; float * d_x; float * d_dst;
            CHECK(cudaMalloc(&d_blk, nblk ? nblk : 1));
            CHECK(cudaMalloc(&d_comp, ncomp));               // cudaMalloc: 256-byte aligned, as in a ggml buffer
            CHECK(cudaMalloc(&d_x, 4 * n_x * k));
            CHECK(cudaMalloc(&d_dst, 4 * n_x * n_rows));
            CHECK(cudaMemcpy(d_blk, c.blocks.data(), nblk, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(d_comp, c.comp.data(), ncomp, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(d_x, c.x.data(), c.x.size(), cudaMemcpyHostToDevice));
            const int warps = 4;
            const dim3 grid((unsigned) ((n_rows + warps - 1) / warps), (unsigned) ((n_x + BITCOS_CUDA_MAX_COLS - 1) / BITCOS_CUDA_MAX_COLS));
            bitcos_cuda_mul_mat_kernel<<<grid, dim3(BITCOS_CUDA_WARP, warps)>>>(d_blk, d_comp, d_x, d_dst, (int64_t) row0,
                (int64_t) n_rows, (int64_t) k, (int64_t) n_x, (int64_t) k, (int64_t) n_rows);
            CHECK(cudaGetLastError());
            std::vector<float> dst(n_x * n_rows);
            CHECK(cudaMemcpy(dst.data(), d_dst, 4 * dst.size(), cudaMemcpyDeviceToHost));
            out.write(reinterpret_cast<const char *>(dst.data()), 4 * dst.size());
            // the batched path on the same case, whatever its column count (the glue takes it above 8 columns)
            const int64_t k_pad = bitcos_cuda_mmq_k_pad((int64_t) k), nqb = k_pad / BITCOS_CUDA_MMQ_QBLOCK;
            int8_t * d_q; float * d_d;
            CHECK(cudaMalloc(&d_q, n_x * k_pad));
            CHECK(cudaMalloc(&d_d, 4 * n_x * nqb));
            CHECK(cudaMemset(d_dst, 0xFF, 4 * n_x * n_rows));      // NaN: an unwritten output fails the check
            bitcos_cuda_quantize_q8_kernel<<<dim3((unsigned) n_x, (unsigned) ((nqb + 3) / 4)), dim3(BITCOS_CUDA_WARP, 4)>>>(
                d_x, d_q, d_d, (int64_t) k, k_pad, (int64_t) k);
            CHECK(cudaGetLastError());
            const dim3 mgrid((unsigned) ((n_rows + BITCOS_CUDA_MMQ_BM - 1) / BITCOS_CUDA_MMQ_BM),
                             (unsigned) ((n_x + BITCOS_CUDA_MMQ_BN - 1) / BITCOS_CUDA_MMQ_BN));
            bitcos_cuda_mul_mat_mmq_kernel<<<mgrid, BITCOS_CUDA_MMQ_THREADS>>>(d_blk, d_comp, d_q, d_d, d_dst,
                (int64_t) row0, (int64_t) n_rows, (int64_t) n_x, k_pad, (int64_t) n_rows);
            CHECK(cudaGetLastError());
            CHECK(cudaMemcpy(dst.data(), d_dst, 4 * dst.size(), cudaMemcpyDeviceToHost));
            out.write(reinterpret_cast<const char *>(dst.data()), 4 * dst.size());
            for (void * p : {(void *) d_blk, (void *) d_comp, (void *) d_x, (void *) d_dst, (void *) d_q, (void *) d_d}) CHECK(cudaFree(p));
        }
        if (!out) throw std::runtime_error("cannot write output");
        return 0;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "test-bitcos-cuda: %s\n", e.what());
        return 1;
    }
}
