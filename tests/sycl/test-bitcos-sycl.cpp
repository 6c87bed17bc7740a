// Runs the BITCOS SYCL kernels (csrc/sycl/bitcos-sycl.hpp, wrapped by bitcos-sycl-kernels.jit.cpp) on a SYCL
// device through the runtime kernel compiler, for tests/test_sycl.py, which writes the inputs with the
// project's reference codec and checks the outputs against numpy.
//
// Built with a plain C++ compiler against the SYCL runtime (headers and libsycl from PyPI's intel-sycl-rt;
// no SYCL device compiler needed): the kernels are source strings compiled by the runtime at run time.
//
//   test-bitcos-sycl CSRC_DIR KERNELS.jit.cpp IN.bin OUT.bin
// IN.bin:  "BSYC", u32 version 1, u32 n_cases, then per case: u64 blocks_bytes, comp_bytes, n_rows, k, n_x,
//          row0, work_group, then the weight's blocks, its companion, n_x * k f32 activations (little-endian)
// OUT.bin: per case n_x * n_rows f32 (mat-vec: rows row0 .. row0 + n_rows), then n_rows * k f32 (those
//          rows dequantized). The kernels are compiled once for all cases.
// Prints the device and the JIT/kernel times; exit 0 on success, 1 on any SYCL or I/O error.
#include <sycl/sycl.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace syclex = sycl::ext::oneapi::experimental;

static std::string read_text(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

template <typename T> static T take(const std::string & s, size_t & off) {
    if (off + sizeof(T) > s.size()) throw std::runtime_error("input truncated");
    T v;
    std::memcpy(&v, s.data() + off, sizeof v);
    off += sizeof v;
    return v;
}

int main(int argc, char ** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s CSRC_DIR KERNELS.jit.cpp IN.bin OUT.bin\n", argv[0]);
        return 2;
    }
    try {
        const std::string csrc = argv[1];
        const std::string in = read_text(argv[3]);
        size_t off = 0;
        if (in.compare(0, 4, "BSYC") != 0) throw std::runtime_error("bad input magic");
        off = 4;
        if (take<uint32_t>(in, off) != 1) throw std::runtime_error("bad input version");
        const uint32_t n_cases = take<uint32_t>(in, off);

        sycl::queue q;
        std::printf("device: %s\n", q.get_device().get_info<sycl::info::device::name>().c_str());
        const auto t0 = std::chrono::steady_clock::now();
        syclex::include_files headers{"bitcos-sycl.hpp", read_text(csrc + "/sycl/bitcos-sycl.hpp")};
        headers.add("bitcos-format.h", read_text(csrc + "/bitcos-format.h"));
        auto src = syclex::create_kernel_bundle_from_source(q.get_context(), syclex::source_language::sycl,
                                                            read_text(argv[2]), syclex::properties{headers});
        auto exe = syclex::build(src);
        sycl::kernel mat_vec = exe.ext_oneapi_get_kernel("bitcos_mat_vec");
        sycl::kernel deq     = exe.ext_oneapi_get_kernel("bitcos_dequantize");
        const auto t1 = std::chrono::steady_clock::now();

        std::ofstream out(argv[4], std::ios::binary);
        for (uint32_t ci = 0; ci < n_cases; ++ci) {
            const uint64_t nblk = take<uint64_t>(in, off), ncomp = take<uint64_t>(in, off);
            const uint64_t n_rows = take<uint64_t>(in, off), k = take<uint64_t>(in, off), n_x = take<uint64_t>(in, off);
            const uint64_t row0 = take<uint64_t>(in, off), wg = take<uint64_t>(in, off);
            if (off + nblk + ncomp + 4 * n_x * k > in.size() || wg == 0) throw std::runtime_error("input truncated");
            // device copies; the companion gets its own 64-byte-aligned allocation, as in a ggml buffer
            uint8_t * d_blk  = sycl::malloc_device<uint8_t>(nblk ? nblk : 1, q);
            uint8_t * d_comp = static_cast<uint8_t *>(sycl::aligned_alloc_device(64, ncomp, q));
            float   * d_x    = sycl::malloc_device<float>(n_x * k != 0 ? n_x * k : 1, q);
            float   * d_dst  = sycl::malloc_device<float>(n_x * n_rows != 0 ? n_x * n_rows : 1, q);
            float   * d_y    = sycl::malloc_device<float>(n_rows * k != 0 ? n_rows * k : 1, q);
            q.memcpy(d_blk, in.data() + off, nblk);
            q.memcpy(d_comp, in.data() + off + nblk, ncomp);
            q.memcpy(d_x, in.data() + off + nblk + ncomp, 4 * n_x * k);
            q.wait();
            off += nblk + ncomp + 4 * n_x * k;

            const sycl::nd_range<1> range{(n_rows + wg - 1) / wg * wg, wg};
            q.submit([&](sycl::handler & h) {
                h.set_args(d_blk, d_comp, d_x, d_dst, row0, n_rows, n_x, k);
                h.parallel_for(range, mat_vec);
            }).wait();
            q.submit([&](sycl::handler & h) {
                h.set_args(d_blk, d_comp, d_y, row0, n_rows, k);
                h.parallel_for(range, deq);
            }).wait();

            std::vector<float> dst(n_x * n_rows), y(n_rows * k);
            q.memcpy(dst.data(), d_dst, 4 * dst.size());
            q.memcpy(y.data(), d_y, 4 * y.size());
            q.wait();
            for (void * p : {(void *)d_blk, (void *)d_comp, (void *)d_x, (void *)d_dst, (void *)d_y}) sycl::free(p, q);
            out.write(reinterpret_cast<const char *>(dst.data()), 4 * dst.size());
            out.write(reinterpret_cast<const char *>(y.data()), 4 * y.size());
        }
        if (off != in.size()) throw std::runtime_error("trailing input");
        if (!out) throw std::runtime_error(std::string("cannot write ") + argv[4]);
        const auto t2 = std::chrono::steady_clock::now();
        std::printf("%u cases, jit %.2f s, run %.3f s\n", n_cases, std::chrono::duration<double>(t1 - t0).count(),
                    std::chrono::duration<double>(t2 - t1).count());
        return 0;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "test-bitcos-sycl: %s\n", e.what());
        return 1;
    }
}
