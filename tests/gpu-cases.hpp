// The input of the GPU test programs (tests/sycl/test-bitcos-sycl.cpp, tests/cuda/test-bitcos-cuda.cu), as
// tests/test_sycl.py's write_cases writes it: "BSYC", u32 version 1, u32 case count, then per case u64
// blocks_bytes, comp_bytes, n_rows, k, n_x, row0, work_group and the weight's blocks, its companion and
// n_x * k f32 activations (all little-endian). One reader for both programs.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

static inline std::string bitcos_read_file(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f)
        throw std::runtime_error("cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

struct bitcos_gpu_case {
    uint64_t    n_rows, k, n_x, row0, work_group;
    std::string blocks, comp, x; // raw bytes: the weight, its companion, the f32 activations
};

static inline std::vector<bitcos_gpu_case> bitcos_read_cases(const std::string & in) {
    size_t off  = 0;
    auto   take = [&](size_t n) {
        if (off + n > in.size())
            throw std::runtime_error("input truncated");
        std::string v = in.substr(off, n);
        off += n;
        return v;
    };
    auto u64 = [&]() {
        uint64_t v;
        std::memcpy(&v, take(8).data(), 8);
        return v;
    };
    auto u32 = [&]() {
        uint32_t v;
        std::memcpy(&v, take(4).data(), 4);
        return v;
    };
    if (take(4) != "BSYC")
        throw std::runtime_error("bad input magic");
    if (u32() != 1)
        throw std::runtime_error("bad input version");
    std::vector<bitcos_gpu_case> cases(u32());
    for (auto & c : cases) {
        const uint64_t nblk = u64(), ncomp = u64();
        c.n_rows     = u64();
        c.k          = u64();
        c.n_x        = u64();
        c.row0       = u64();
        c.work_group = u64();
        c.blocks     = take(nblk);
        c.comp       = take(ncomp);
        c.x          = take(4 * c.n_x * c.k);
    }
    if (off != in.size())
        throw std::runtime_error("trailing input");
    return cases;
}
