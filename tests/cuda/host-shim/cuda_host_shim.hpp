// A CPU stand-in for the few CUDA features csrc/cuda/bitcos-cuda.cuh uses, so that its kernels' very source runs
// on the host (tests/cuda/host-emulation.cpp; no GPU in CI). One std::thread per CUDA thread, the blocks of a
// grid one after another; __syncthreads / __syncwarp are barriers; shuffles exchange through a per-warp buffer
// between barriers; __shared__ becomes a function-local static (one block runs at a time); wmma fragments hold
// the whole 16 x 16 matrix in every lane (the element mapping in registers is opaque in CUDA too), loads and
// stores check wmma's 256-bit pointer alignment and ldm rules. It checks index math and synchronization
// structure, not timing, memory coalescing or the hardware's fragment layouts.
#pragma once

#include <barrier>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__   static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint4 {
    uint32_t x, y, z, w;
};
struct float2 {
    float x, y;
};
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
    return { x, y, z, w };
}
struct __half {
    uint16_t b;
};
inline __half __ushort_as_half(uint16_t b) {
    return { b };
}
inline float __half2float(__half h) {
    const uint32_t s = (h.b >> 15) & 1, e = (h.b >> 10) & 31, m = h.b & 1023;
    float          v;
    if (e == 0)
        v = std::ldexp((float) m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = std::ldexp((float) (m | 1024), (int) e - 25);
    return s ? -v : v;
}

inline dim3 blockIdx, blockDim, gridDim;

// Dynamic shared memory: one buffer (blocks run one at a time), as large as any device gives a block
namespace cuda_shim {
alignas(16) inline unsigned char dynamic_shared[232448];
}
#define BITCOS_CUDA_EXTERN_SHARED(type, name) type * name = reinterpret_cast<type *>(cuda_shim::dynamic_shared)
inline thread_local dim3 threadIdx;

namespace cuda_shim {
struct warp_state {
    std::barrier<> bar{ 32 };
    uint64_t       xch[32];
};
inline std::unique_ptr<std::barrier<>>          block_bar;
inline std::vector<std::unique_ptr<warp_state>> warps;
inline thread_local int                         lane, warp;

template <class T> T exchange(T v, int src) {
    warp_state & w    = *warps[warp];
    uint64_t     bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    w.bar.arrive_and_wait();
    w.xch[lane] = bits;
    w.bar.arrive_and_wait();
    const uint64_t got = w.xch[src];
    w.bar.arrive_and_wait();
    T r;
    std::memcpy(&r, &got, sizeof(T));
    return r;
}

// Runs kernel() for every thread of every block: one std::thread per thread of a block for the whole launch,
// the blocks in order. A thread that returns early leaves its block's and warp's barriers (arrive_and_drop), as
// an exited CUDA thread stops counting at __syncthreads.
template <class F> void launch(dim3 grid, dim3 block, F kernel) {
    const unsigned n = block.x * block.y * block.z;
    assert(n % 32 == 0);
    gridDim  = grid;
    blockDim = block;
    std::barrier<>           start(n + 1), done(n + 1);
    bool                     stop = false;
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < n; ++t) {
        ts.emplace_back([&, t] {
            threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
            lane      = (int) (t % 32);
            warp      = (int) (t / 32);
            for (;;) {
                start.arrive_and_wait();
                if (stop)
                    return;
                kernel();
                block_bar->arrive_and_drop();
                warps[warp]->bar.arrive_and_drop();
                done.arrive_and_wait();
            }
        });
    }
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                blockIdx  = dim3(bx, by, bz);
                block_bar = std::make_unique<std::barrier<>>(n);
                warps.clear();
                for (unsigned w = 0; w < n / 32; ++w)
                    warps.push_back(std::make_unique<warp_state>());
                start.arrive_and_wait();
                done.arrive_and_wait();
            }
    stop = true;
    start.arrive_and_wait();
    for (auto & th : ts)
        th.join();
}
} // namespace cuda_shim

inline void __syncthreads() {
    cuda_shim::block_bar->arrive_and_wait();
}
inline void __syncwarp(unsigned = 0xffffffffu) {
    cuda_shim::warps[cuda_shim::warp]->bar.arrive_and_wait();
}
template <class T> T __shfl_sync(unsigned, T v, int src, int width = 32) {
    return cuda_shim::exchange(v, (cuda_shim::lane / width) * width + src % width);
}
template <class T> T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
    const int l = cuda_shim::lane;
    return cuda_shim::exchange(v, (l % width) >= (int) delta ? l - (int) delta : l);
}
template <class T> T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    const int l = cuda_shim::lane, s = l ^ mask;
    return cuda_shim::exchange(v, s / width == l / width ? s : l);
}
inline int __popc(uint32_t x) {
    return __builtin_popcount(x);
}
inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t sh) {
    return (uint32_t) ((((uint64_t) hi << 32) | lo) >> (sh & 31));
}
inline uint32_t __funnelshift_rc(uint32_t lo, uint32_t hi, uint32_t sh) { // shift clamped to 32
    return (uint32_t) ((((uint64_t) hi << 32) | lo) >> (sh < 32 ? sh : 32));
}
// byte s_i (selector nibble i, 0..7) of {y, x} into byte i of the result (no sign-replicate mode: unused)
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    const uint64_t v = ((uint64_t) y << 32) | x;
    uint32_t       r = 0;
    for (int i = 0; i < 4; ++i)
        r |= (uint32_t) ((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}
inline int __float2int_rn(float x) {
    return (int) std::nearbyint(x);
}
inline float __fdiv_rn(float a, float b) {
    return a / b;
}
inline int atomicAdd(int * p, int v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
[[noreturn]] inline void __trap() {
    std::abort();
}
