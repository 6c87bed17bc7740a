// nvcuda::wmma for the host shim (cuda_host_shim.hpp): int8 16x16x16 fragments holding the whole matrix in
// every lane; the loads check wmma's rules (256-bit aligned pointer, ldm a multiple of 16 bytes), the
// accumulator store is done once per warp (lane 0; the kernel's __syncwarp after it publishes it).
#pragma once
#include "cuda_host_shim.hpp"

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    T x[16 * 16]; // matrix_a: A[i][k] at 16 i + k; matrix_b: B[k][n] at 16 k + n; accumulator: C[i][n] at 16 i + n
};

inline void check_ptr(const void * p, unsigned ldm_bytes) {
    if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || ldm_bytes % 16 != 0) {
        std::fprintf(stderr, "wmma: misaligned pointer %p or ldm %u bytes\n", p, ldm_bytes);
        std::abort();
    }
}

template <class T> void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, row_major> & f, const T * p, unsigned ldm) {
    check_ptr(p, ldm * sizeof(T));
    for (int i = 0; i < 16; ++i)
        for (int k = 0; k < 16; ++k)
            f.x[16 * i + k] = p[i * ldm + k];
}
template <class T> void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, col_major> & f, const T * p, unsigned ldm) {
    check_ptr(p, ldm * sizeof(T));
    for (int k = 0; k < 16; ++k)
        for (int n = 0; n < 16; ++n)
            f.x[16 * k + n] = p[n * ldm + k];
}
template <class T> void fill_fragment(fragment<accumulator, 16, 16, 16, T> & f, T v) {
    for (auto & e : f.x)
        e = v;
}
template <class TA, class TC>
void mma_sync(fragment<accumulator, 16, 16, 16, TC> & d, const fragment<matrix_a, 16, 16, 16, TA, row_major> & a,
              const fragment<matrix_b, 16, 16, 16, TA, col_major> & b,
              const fragment<accumulator, 16, 16, 16, TC> &         c) {
    TC r[256];
    for (int i = 0; i < 16; ++i)
        for (int n = 0; n < 16; ++n) {
            TC s = c.x[16 * i + n];
            for (int k = 0; k < 16; ++k)
                s += (TC) a.x[16 * i + k] * (TC) b.x[16 * k + n];
            r[16 * i + n] = s;
        }
    for (int e = 0; e < 256; ++e)
        d.x[e] = r[e];
}
template <class T>
void store_matrix_sync(T * p, const fragment<accumulator, 16, 16, 16, T> & f, unsigned ldm, layout_t layout) {
    check_ptr(p, ldm * sizeof(T));
    if (cuda_shim::lane != 0)
        return;
    for (int i = 0; i < 16; ++i)
        for (int n = 0; n < 16; ++n) {
            if (layout == mem_row_major)
                p[i * ldm + n] = f.x[16 * i + n];
            else
                p[n * ldm + i] = f.x[16 * i + n];
        }
}
} // namespace wmma
} // namespace nvcuda
