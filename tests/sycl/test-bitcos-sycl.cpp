// Runs the BITCOS SYCL kernels (csrc/sycl/bitcos-sycl.hpp, wrapped by bitcos-sycl-kernels.jit.cpp) on a SYCL
// device through the runtime kernel compiler, for tests/test_sycl.py, which writes the inputs with the
// project's reference codec and checks the outputs against numpy.
//
// Built with a plain C++ compiler against the SYCL runtime (headers and libsycl from PyPI's intel-sycl-rt;
// no SYCL device compiler needed): the kernels are source strings compiled by the runtime at run time; the
// host includes csrc/sycl/bitcos-sycl.hpp (-I csrc) only for xmx_tiles_supported.
//
//   test-bitcos-sycl CSRC_DIR KERNELS.jit.cpp IN.bin OUT.bin
// IN.bin:  "BSYC", u32 version 1, u32 n_cases, then per case: u64 blocks_bytes, comp_bytes, n_rows, k, n_x,
//          row0, work_group, then the weight's blocks, its companion, n_x * k f32 activations (little-endian)
// OUT.bin: per case n_x * n_rows f32 (mat-vec: rows row0 .. row0 + n_rows), then n_rows * k f32 (those
//          rows dequantized), then n_x * n_rows f32 (mat-vec through the tiled path, portable contraction),
//          then, only where the XMX kernel ran, n_x * n_rows f32 (the tiled path on joint_matrix).
//          The kernels are compiled once for all cases; work_group is a multiple of 16 up to 64.
// Prints the device, "xmx: runnable" or "xmx: built, not runnable on this device (...)", and the JIT/kernel
// times; exit 0 on success, 1 on any SYCL or I/O error (also when the XMX kernel is missing from a device
// that bitcos_sycl::xmx_tiles_supported accepts).
#include <sycl/sycl.hpp>

#include "../gpu-cases.hpp"
#include "sycl/bitcos-sycl.hpp" // xmx_tiles_supported: the device test ggml-sycl makes

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace syclex = sycl::ext::oneapi::experimental;

int main(int argc, char ** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s CSRC_DIR KERNELS.jit.cpp IN.bin OUT.bin\n", argv[0]);
        return 2;
    }
    try {
        const std::string                  csrc  = argv[1];
        const std::vector<bitcos_gpu_case> cases = bitcos_read_cases(bitcos_read_file(argv[3]));

        sycl::queue q;
        std::printf("device: %s\n", q.get_device().get_info<sycl::info::device::name>().c_str());
        const auto            t0 = std::chrono::steady_clock::now();
        syclex::include_files headers{ "bitcos-sycl.hpp", bitcos_read_file(csrc + "/sycl/bitcos-sycl.hpp") };
        headers.add("bitcos-format.h", bitcos_read_file(csrc + "/bitcos-format.h"));
        auto         src     = syclex::create_kernel_bundle_from_source(q.get_context(), syclex::source_language::sycl,
                                                                        bitcos_read_file(argv[2]), syclex::properties{ headers });
        auto         exe     = syclex::build(src);
        sycl::kernel mat_vec = exe.ext_oneapi_get_kernel("bitcos_mat_vec");
        sycl::kernel deq     = exe.ext_oneapi_get_kernel("bitcos_dequantize");
        sycl::kernel tiles   = exe.ext_oneapi_get_kernel("bitcos_mat_vec_tiles");
        // the joint_matrix kernel compiled with the others (a front-end error fails the build above); the
        // runtime builds it only for devices with the matrix aspect, and it runs where ggml-sycl would run it
        const bool   has_xmx = bitcos_sycl::xmx_tiles_supported(q.get_device());
        std::optional<sycl::kernel> xmx;
        if (has_xmx) {
            xmx = exe.ext_oneapi_get_kernel("bitcos_mat_vec_xmx");
            std::printf("xmx: runnable\n");
        } else {
            std::printf("xmx: built, not runnable on this device (no fp16 8 x 16 x 16 matrix combination)\n");
        }
        const auto t1 = std::chrono::steady_clock::now();

        std::ofstream out(argv[4], std::ios::binary);
        for (const bitcos_gpu_case & c : cases) {
            const uint64_t nblk = c.blocks.size(), ncomp = c.comp.size();
            const uint64_t n_rows = c.n_rows, k = c.k, n_x = c.n_x, row0 = c.row0, wg = c.work_group;
            if (wg == 0 || wg % 16 != 0 || wg > 64)
                throw std::runtime_error("work-group size not 16, 32, 48 or 64");
            // device copies; the companion gets its own 64-byte-aligned allocation, as in a ggml buffer
            uint8_t * d_blk  = sycl::malloc_device<uint8_t>(nblk ? nblk : 1, q);
            uint8_t * d_comp = static_cast<uint8_t *>(sycl::aligned_alloc_device(64, ncomp, q));
            float *   d_x    = sycl::malloc_device<float>(n_x * k != 0 ? n_x * k : 1, q);
            float *   d_dst  = sycl::malloc_device<float>(n_x * n_rows != 0 ? n_x * n_rows : 1, q);
            float *   d_y    = sycl::malloc_device<float>(n_rows * k != 0 ? n_rows * k : 1, q);
            q.memcpy(d_blk, c.blocks.data(), nblk);
            q.memcpy(d_comp, c.comp.data(), ncomp);
            q.memcpy(d_x, c.x.data(), c.x.size());
            q.wait();

            const sycl::nd_range<1> range{ (n_rows + wg - 1) / wg * wg, wg };
            // the tiled kernels: (groups of 8 columns) x rows, as ggml-sycl launches them
            const sycl::nd_range<2> tile_range{ { (n_x + 7) / 8, (n_rows + wg - 1) / wg * wg }, { 1, wg } };
            q.submit([&](sycl::handler & h) {
                 h.set_args(d_blk, d_comp, d_x, d_dst, row0, n_rows, n_x, k);
                 h.parallel_for(range, mat_vec);
             }).wait();
            q.submit([&](sycl::handler & h) {
                 h.set_args(d_blk, d_comp, d_y, row0, n_rows, k);
                 h.parallel_for(range, deq);
             }).wait();

            std::vector<float> dst(n_x * n_rows), y(n_rows * k), dst_tiles(n_x * n_rows), dst_xmx(n_x * n_rows);
            q.memcpy(dst.data(), d_dst, 4 * dst.size());
            q.memcpy(y.data(), d_y, 4 * y.size());
            q.wait();
            for (sycl::kernel * kern : { &tiles, xmx ? &*xmx : nullptr }) {
                if (!kern)
                    continue;
                q.memset(d_dst, 0xff, 4 * dst.size()).wait(); // NaN: a result the kernel did not write shows
                q.submit([&](sycl::handler & h) {
                     h.set_args(d_blk, d_comp, d_x, d_dst, row0, n_rows, n_x, k);
                     h.parallel_for(tile_range, *kern);
                 }).wait();
                q.memcpy(kern == &tiles ? dst_tiles.data() : dst_xmx.data(), d_dst, 4 * dst.size()).wait();
            }
            for (void * p : { (void *) d_blk, (void *) d_comp, (void *) d_x, (void *) d_dst, (void *) d_y })
                sycl::free(p, q);
            out.write(reinterpret_cast<const char *>(dst.data()), 4 * dst.size());
            out.write(reinterpret_cast<const char *>(y.data()), 4 * y.size());
            out.write(reinterpret_cast<const char *>(dst_tiles.data()), 4 * dst_tiles.size());
            if (xmx)
                out.write(reinterpret_cast<const char *>(dst_xmx.data()), 4 * dst_xmx.size());
        }
        if (!out)
            throw std::runtime_error(std::string("cannot write ") + argv[4]);
        const auto t2 = std::chrono::steady_clock::now();
        std::printf("%u cases, jit %.2f s, run %.3f s\n", (unsigned) cases.size(),
                    std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count());
        return 0;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "test-bitcos-sycl: %s\n", e.what());
        return 1;
    }
}
