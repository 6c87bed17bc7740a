// ggml-bitcos CPU extra buffer type CPU_BITCOS_2BIT: BITCOS weights decoded at load into the 2-bit codes form
// (bitcos-kernels.h, docs/KERNELS.md §8-9), for machines where the BITCOS kernels' decode, not memory, bounds
// the mat-muls.
//
// llama.cpp picks a weight's buffer type as the first in its list whose supports_op accepts the weight's use
// (make_cpu_buft_list: ... CPU extra buffer types, then CPU), the way it picks CPU_REPACK. This type accepts a
// BITCOS weight only when the form choice (bitcos-form.h: the roofline with gamma measured here, beta cached per
// machine, z from the loader's hint) says the codes form runs faster, or GGML_BITCOS_CPU_FORM=2bit forces it;
// otherwise the weight stays in the plain CPU buffer (mmap-ed) and the BITCOS kernels run it. --no-repack
// (no extra buffer types) therefore keeps every weight BITCOS.
//
// Loading: the weight (bitmap) and its companion (header, scales, row index, sign pool) arrive by separate
// set_tensor calls, in file order. The first is copied aside until the second comes; then both are validated
// (ggml_bitcos_validate), the rows decoded into the weight's allocation by all cores, the companion's header and
// scales copied beside the codes, and the copy dropped. The companion itself gets a stub allocation: the sign
// pool is never kept. The outcome goes into the weight's state block, which the loader's post-load check reads.
#include "ggml-bitcos-cpu.h"
#include "ggml-bitcos.h"
#include "bitcos-form.h"
#include "bitcos-kernels.h"

#include "ggml-backend-impl.h"
#include "ggml-cpu.h"
#include "ggml-impl.h"
#include "traits.h"
#define GGML_COMMON_DECL_CPP
#include "ggml-common.h" // block_tq2_0, QK_K

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#    include <sys/mman.h>
#endif

ggml_backend_buffer_type_t ggml_backend_cpu_bitcos_codes_buffer_type(void);

namespace {

// ---- the form choice (once per process and model zero density) ----

int bitcos_cpu_threads() {
    const char * env = getenv("GGML_BITCOS_THREADS");
    if (env != nullptr && atoi(env) > 0) {
        return atoi(env);
    }
    return bitcos_form_physical_cores();
}

// The form for weights of a model with zero density z (< 0: unknown). Logged once per distinct (z, threads).
int bitcos_cpu_form(float z) {
    static std::mutex                 mutex;
    static std::map<std::string, int> chosen;
    std::lock_guard<std::mutex>       lock(mutex);
    const char *                      env  = getenv("GGML_BITCOS_CPU_FORM");
    const std::string                 mode = env != nullptr ? env : "auto";
    if (mode == "bitcos" || mode == "2bit") {
        if (chosen.emplace(mode, 0).second) {
            GGML_LOG_INFO("BITCOS CPU form: %s (GGML_BITCOS_CPU_FORM=%s)\n", mode == "2bit" ? "2-bit codes" : "BITCOS",
                          mode.c_str());
        }
        return mode == "2bit" ? BITCOS_FORM_CODES : BITCOS_FORM_BITCOS;
    }
    if (mode != "auto" && chosen.emplace("bad:" + mode, 0).second) {
        GGML_LOG_WARN("GGML_BITCOS_CPU_FORM=%s is not auto, bitcos or 2bit; choosing automatically\n", mode.c_str());
    }
    if (z < 0.0f) {
        // no hint (a caller other than llama.cpp's loader): the file's own form
        return BITCOS_FORM_BITCOS;
    }
    const int n_threads = bitcos_cpu_threads();
    char      key[64];
    snprintf(key, sizeof key, "%.2f|%d", z, n_threads);
    const auto it = chosen.find(key);
    if (it != chosen.end()) {
        return it->second;
    }
    bitcos_form_inputs in;
    memset(&in, 0, sizeof in);
    int measured = 0;
    bitcos_form_measure_gamma(bitcos_kernel_best(), z, 0.03, &in.gamma_bitcos, &in.gamma_codes);
    in.beta_thread             = bitcos_form_beta_cached(n_threads, &measured);
    in.n_threads               = n_threads;
    in.z                       = z;
    const bitcos_form_choice c = bitcos_form_choose(&in);
    GGML_LOG_INFO("BITCOS CPU form: %s (auto: z %.2f, %d threads, beta %.1f GB/s per thread (%s), gamma BITCOS %.2f / "
                  "2-bit %.2f ns per 32 weights -> predicted %.2f vs %.2f ns; the 2-bit form runs when %.0f %% "
                  "faster; GGML_BITCOS_CPU_FORM=bitcos|2bit forces one)\n",
                  c.form == BITCOS_FORM_CODES ? "2-bit codes" : "BITCOS", z, n_threads, in.beta_thread,
                  measured ? "measured now" : "cached", in.gamma_bitcos, in.gamma_codes, c.t_bitcos, c.t_codes,
                  100.0 * BITCOS_FORM_MARGIN);
    chosen.emplace(key, c.form);
    return c.form;
}

// ---- loading: pair each weight with its companion, validate, decode ----

struct pending_half {
    ggml_backend_buffer_t buffer = nullptr;
    ggml_tensor *         weight = nullptr; // set when the weight came first: `bytes` is its data
    std::vector<uint8_t>  bytes;            // else the companion's
};

std::mutex                                  g_pending_mutex;
std::map<const ggml_tensor *, pending_half> g_pending; // keyed by companion

ggml_bitcos_codes_state * codes_state(ggml_tensor * w) {
    return (ggml_bitcos_codes_state *) ((char *) w->data + ggml_bitcos_codes_state_offset(w));
}

bool codes_fail(ggml_tensor * w, const char * msg) {
    ggml_bitcos_codes_state * st = codes_state(w);
    st->status                   = GGML_BITCOS_CODES_INVALID;
    snprintf(st->error, sizeof st->error, "%s", msg);
    return false;
}

// The decode's view of a validated weight: every row of the base tensor, sign_pos filled from the row index.
bitcos_rows rows_of(const ggml_tensor * w, const uint8_t * wdata, const uint8_t * cdata, const ggml_bitcos_header & hdr,
                    std::vector<uint64_t> & sign_pos) {
    const int64_t n_rows = w->ne[1] * w->ne[2] * w->ne[3];
    sign_pos.resize((size_t) n_rows);
    for (int64_t r = 0; r < n_rows; ++r) {
        sign_pos[(size_t) r] = ggml_bitcos_sign_pos(cdata, &hdr, (uint64_t) r);
    }
    bitcos_rows rows;
    memset(&rows, 0, sizeof rows);
    rows.k          = w->ne[0];
    rows.bits       = wdata;
    rows.unit_bytes = bitcos_block_bytes(hdr.variant);
    rows.row_bytes  = w->nb[1];
    rows.pool       = cdata + hdr.pool_offset;
    rows.sign_pos   = sign_pos.data();
    if (hdr.variant == BITCOS_VARIANT_G128) {
        rows.block_scale     = wdata + offsetof(block_bitcos_g128, d);
        rows.scale_stride    = sizeof(block_bitcos_g128);
        rows.scale_row_bytes = w->nb[1];
    }
    return rows;
}

// Worker threads of the load-time decodes, started on first use and kept for the process: a model has hundreds
// of weights, each decoded on every core, and threads started and joined per weight would add their start-up to
// each.
class decode_workers {
  public:
    static decode_workers & get() {
        static decode_workers w;
        return w;
    }

    // job(t) for t in [0, n) in parallel: 0 on the caller, the rest on workers; returns when all have returned.
    // One job at a time (llama.cpp uploads tensors from one thread; the lock covers any other caller).
    void run(int n, const std::function<void(int)> & job) {
        std::lock_guard<std::mutex> one_job(run_mutex);
        {
            std::unique_lock<std::mutex> lock(mutex);
            while ((int) threads.size() < n - 1) {
                const int t = (int) threads.size() + 1;
                threads.emplace_back([this, t] { work(t); });
            }
            current   = &job;
            n_parts   = n;
            remaining = n - 1;
            ++generation;
        }
        wake.notify_all();
        job(0);
        std::unique_lock<std::mutex> lock(mutex);
        done.wait(lock, [this] { return remaining == 0; });
        current = nullptr;
    }

    ~decode_workers() {
        {
            std::lock_guard<std::mutex> lock(mutex);
            stop = true;
        }
        wake.notify_all();
        for (auto & th : threads) {
            th.join();
        }
    }

  private:
    void work(int t) {
        uint64_t seen = 0;
        for (;;) {
            std::unique_lock<std::mutex> lock(mutex);
            wake.wait(lock, [&] { return stop || generation != seen; });
            if (stop) {
                return;
            }
            seen = generation;
            if (t >= n_parts) {
                continue; // a job with fewer parts than workers
            }
            const std::function<void(int)> * job = current;
            lock.unlock();
            (*job)(t);
            lock.lock();
            if (--remaining == 0) {
                done.notify_one();
            }
        }
    }

    std::mutex                       run_mutex, mutex;
    std::condition_variable          wake, done;
    std::vector<std::thread>         threads;
    const std::function<void(int)> * current    = nullptr;
    int                              n_parts    = 0;
    int                              remaining  = 0;
    uint64_t                         generation = 0;
    bool                             stop       = false;
};

// fn(i0, i1) over [0, n_rows) in one contiguous range per core (rows are independent).
template <typename F> void for_row_ranges(int64_t n_rows, F fn) {
    const int n_threads =
        (int) std::max<int64_t>(1, std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), n_rows / 16));
    if (n_threads == 1) {
        fn(0, n_rows);
        return;
    }
    decode_workers::get().run(n_threads, [&](int t) { fn(n_rows * t / n_threads, n_rows * (t + 1) / n_threads); });
}

// Validates weight data wdata with companion cdata and decodes it into w's allocation.
bool codes_decode(ggml_tensor * w, const uint8_t * wdata, const uint8_t * cdata, size_t cbytes) {
    const auto t0 = std::chrono::steady_clock::now();
    char       err[sizeof(ggml_bitcos_codes_state::error)];
    if (!ggml_bitcos_validate(w, wdata, cdata, cbytes, err, sizeof err)) {
        return codes_fail(w, err);
    }
    ggml_bitcos_header hdr;
    ggml_bitcos_read_header(cdata, &hdr);
    const int     variant  = hdr.variant;
    const int64_t n_rows   = w->ne[1] * w->ne[2] * w->ne[3];
    const size_t  c_off    = ggml_bitcos_codes_companion_offset(w);
    const size_t  cap      = ggml_bitcos_codes_alloc_size(w) - c_off;
    const size_t  keep     = (size_t) hdr.row_base_offset; // header and scales section (validated canonical)
    const size_t  g128_row = variant == BITCOS_VARIANT_G128 ? 2 * (size_t) ((w->ne[0] + 127) / 128) : 0;
    const size_t  g128_off = (keep + 63) & ~(size_t) 63;
    if (keep > cap || g128_off + g128_row * (size_t) n_rows > cap) {
        return codes_fail(w, "its scales do not fit the 2-bit form's allocation");
    }
    uint8_t * base = (uint8_t *) w->data;
    memcpy(base + c_off, cdata, keep);

    std::vector<uint64_t> sign_pos;
    const bitcos_rows     rows      = rows_of(w, wdata, cdata, hdr, sign_pos);
    const size_t          codes_row = bitcos_codes_row_bytes(w->ne[0]);
    for_row_ranges(n_rows, [&](int64_t i0, int64_t i1) {
        bitcos_codes_decode(&rows, i0, i1, base, codes_row);
        if (g128_row != 0) {
            bitcos_codes_copy_block_scales(&rows, i0, i1, base + c_off + g128_off);
        }
    });
    ggml_bitcos_codes_state * st = codes_state(w);
    st->g128_scale_row           = (uint32_t) g128_row;
    st->g128_scales              = g128_row != 0 ? g128_off : 0;
    st->decode_ns =
        (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    st->status = GGML_BITCOS_CODES_READY;
    return true;
}

bool is_companion(const ggml_tensor * t) {
    return t->type == GGML_TYPE_I8 && ggml_bitcos_companion_weight_name_len(ggml_get_name(t)) > 0;
}

void codes_buffer_set_tensor(ggml_backend_buffer_t buffer, ggml_tensor * tensor, const void * data, size_t offset,
                             size_t size) {
    GGML_ASSERT(offset == 0 && size == ggml_nbytes(tensor) && "CPU_BITCOS_2BIT: tensors are set whole");
    const uint8_t * bytes = (const uint8_t *) data;
    if (ggml_bitcos_is_type(tensor->type)) {
        const ggml_tensor * comp = tensor->src[0];
        GGML_ASSERT(comp != nullptr && "BITCOS weight without its companion");
        std::unique_lock<std::mutex> lock(g_pending_mutex);
        auto                         it = g_pending.find(comp);
        if (it == g_pending.end()) {
            pending_half & p = g_pending[comp];
            p.buffer         = buffer;
            p.weight         = tensor;
            p.bytes.assign(bytes, bytes + size);
            return;
        }
        pending_half p = std::move(it->second);
        g_pending.erase(it);
        lock.unlock();
        codes_decode(tensor, bytes, p.bytes.data(), p.bytes.size());
    } else if (is_companion(tensor)) {
        std::unique_lock<std::mutex> lock(g_pending_mutex);
        auto                         it = g_pending.find(tensor);
        if (it == g_pending.end()) {
            pending_half & p = g_pending[tensor];
            p.buffer         = buffer;
            p.bytes.assign(bytes, bytes + size);
            return;
        }
        pending_half p = std::move(it->second);
        g_pending.erase(it);
        lock.unlock();
        GGML_ASSERT(p.weight != nullptr);
        codes_decode(p.weight, p.bytes.data(), bytes, size);
    } else {
        memcpy((char *) tensor->data + offset, data, size);
    }
}

enum ggml_status codes_buffer_init_tensor(ggml_backend_buffer_t buffer, ggml_tensor * tensor) {
    if (ggml_bitcos_is_type(tensor->type) && tensor->view_src == nullptr) {
        memset(codes_state(tensor), 0, sizeof(ggml_bitcos_codes_state)); // GGML_BITCOS_CODES_PENDING
    }
    GGML_UNUSED(buffer);
    return GGML_STATUS_SUCCESS;
}

void (*g_cpu_free_buffer)(ggml_backend_buffer_t) = nullptr;

void codes_buffer_free_buffer(ggml_backend_buffer_t buffer) {
    {
        std::lock_guard<std::mutex> lock(g_pending_mutex);
        for (auto it = g_pending.begin(); it != g_pending.end();) {
            it = it->second.buffer == buffer ? g_pending.erase(it) : std::next(it);
        }
    }
    g_cpu_free_buffer(buffer);
}

const char * codes_buft_get_name(ggml_backend_buffer_type_t) {
    return GGML_BITCOS_CODES_BUFT_NAME;
}

ggml_backend_buffer_t codes_buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size) {
    ggml_backend_buffer_t buffer = ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(), size);
    if (buffer == nullptr) {
        return nullptr;
    }
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    // the weights are streamed once per token: 2 MiB pages spare the TLB misses of 4 KiB ones (where the
    // kernel offers transparent huge pages only on request, the default)
    {
        const uintptr_t page = 4096, base = (uintptr_t) ggml_backend_buffer_get_base(buffer);
        const uintptr_t first = (base + page - 1) & ~(page - 1), last = (base + size) & ~(page - 1);
        if (last > first) {
            madvise((void *) first, last - first, MADV_HUGEPAGE);
        }
    }
#endif
    g_cpu_free_buffer           = buffer->iface.free_buffer;
    buffer->buft                = buft;
    buffer->iface.init_tensor   = codes_buffer_init_tensor;
    buffer->iface.set_tensor    = codes_buffer_set_tensor;
    buffer->iface.free_buffer   = codes_buffer_free_buffer;
    buffer->iface.get_tensor    = nullptr; // the BITCOS bytes are gone; nothing reads them back
    buffer->iface.cpy_tensor    = nullptr;
    buffer->iface.memset_tensor = nullptr;
    return buffer;
}

size_t codes_buft_get_alignment(ggml_backend_buffer_type_t) {
    return TENSOR_ALIGNMENT;
}

size_t codes_buft_get_alloc_size(ggml_backend_buffer_type_t, const ggml_tensor * tensor) {
    if (ggml_bitcos_is_type(tensor->type)) {
        return ggml_bitcos_codes_alloc_size(tensor);
    }
    if (is_companion(tensor)) {
        return 64; // a stub: its bytes are decoded into the weight's allocation, the sign pool not kept
    }
    return ggml_nbytes(tensor);
}

// ---- compute ----

class codes_tensor_traits : public ggml::cpu::tensor_traits {
    bool work_size(int n_threads, const ggml_tensor * op, size_t & size) override {
        size = ggml_bitcos_cpu_work_size(op, n_threads);
        return true;
    }

    bool compute_forward(ggml_compute_params * params, ggml_tensor * op) override {
        if (op->op == GGML_OP_MUL_MAT) {
            ggml_bitcos_cpu_mul_mat(params, op);
        } else {
            ggml_bitcos_cpu_mul_mat_id(params, op);
        }
        return true;
    }
};

bool in_codes_buffer(const ggml_tensor * t) {
    const ggml_tensor * base = t->view_src ? t->view_src : t;
    return base->buffer != nullptr && base->buffer->buft == ggml_backend_cpu_bitcos_codes_buffer_type();
}

class codes_extra_buffer_type : public ggml::cpu::extra_buffer_type {
    bool supports_op(ggml_backend_dev_t, const ggml_tensor * op) override {
        if ((op->op != GGML_OP_MUL_MAT && op->op != GGML_OP_MUL_MAT_ID) || !in_codes_buffer(op->src[0]) ||
            !ggml_bitcos_cpu_supports_op(op)) {
            return false;
        }
        if (op->src[1]->buffer && !ggml_backend_buft_is_host(op->src[1]->buffer->buft)) {
            return false;
        }
        const ggml_tensor * base = op->src[0]->view_src ? op->src[0]->view_src : op->src[0];
        // a weight being placed (llama.cpp's buffer choice on the model's meta tensor: no data yet) is accepted
        // when the codes form is chosen; a weight already in this buffer is in the codes form
        return base->data != nullptr || bitcos_cpu_form(ggml_bitcos_model_zero_density(base)) == BITCOS_FORM_CODES;
    }

    ggml::cpu::tensor_traits * get_tensor_traits(const ggml_tensor * op) override {
        static codes_tensor_traits traits;
        if ((op->op == GGML_OP_MUL_MAT || op->op == GGML_OP_MUL_MAT_ID) && in_codes_buffer(op->src[0])) {
            return &traits;
        }
        return nullptr;
    }
};

} // namespace

bool ggml_bitcos_cpu_to_tq2_0(const ggml_tensor * w, const void * wdata, const void * cdata, size_t cbytes, void * dst,
                              char * err, size_t err_size) {
    if (!ggml_bitcos_validate(w, wdata, cdata, cbytes, err, err_size)) {
        return false;
    }
    ggml_bitcos_header hdr;
    ggml_bitcos_read_header(cdata, &hdr);
    const uint8_t * c = (const uint8_t *) cdata;
    if (w->ne[0] % QK_K != 0) {
        snprintf(err, err_size, "rows of %lld weights are not whole TQ2_0 blocks of %d", (long long) w->ne[0], QK_K);
        return false;
    }
    const int64_t         n_rows = w->ne[1] * w->ne[2] * w->ne[3];
    const int64_t         nb     = w->ne[0] / QK_K;
    std::vector<uint64_t> sign_pos;
    const bitcos_rows     rows = rows_of(w, (const uint8_t *) wdata, c, hdr, sign_pos);
    const size_t          cb   = bitcos_codes_row_bytes(w->ne[0]);
    std::atomic<int64_t>  bad_row{ -1 };
    // TQ2_0's d of 256-block b of row r: the weight's scale there as fp16, which must be exact
    auto                  d_of = [&](int64_t r, int64_t b, ggml_fp16_t & d) -> bool {
        if (bitcos_variant_scale_block(hdr.variant) == 0) {
            const float s = ggml_bitcos_row_scale(c, &hdr, (uint64_t) r);
            d             = ggml_fp32_to_fp16(s);
            return ggml_fp16_to_fp32(d) == s;
        }
        uint16_t e0, e1;
        if (hdr.variant == BITCOS_VARIANT_G128) {
            const uint8_t * blk = (const uint8_t *) wdata + (size_t) r * w->nb[1];
            memcpy(&e0, blk + (size_t) (2 * b) * sizeof(block_bitcos_g128) + offsetof(block_bitcos_g128, d), 2);
            memcpy(&e1, blk + (size_t) (2 * b + 1) * sizeof(block_bitcos_g128) + offsetof(block_bitcos_g128, d), 2);
        } else {
            const uint8_t * sc = ggml_bitcos_block_scales(c, &hdr, (uint64_t) r);
            const int       sh = hdr.variant == BITCOS_VARIANT_B256 ? 1 : 0;
            memcpy(&e0, sc + 2 * ((2 * b) >> sh), 2);
            memcpy(&e1, sc + 2 * ((2 * b + 1) >> sh), 2);
        }
        memcpy(&d, &e0, 2);
        return e0 == e1;
    };
    for_row_ranges(n_rows, [&](int64_t i0, int64_t i1) {
        std::vector<uint8_t> codes(cb * 16);
        for (int64_t r0 = i0; r0 < i1; r0 += 16) {
            const int64_t r1  = std::min(i1, r0 + 16);
            // a run starting at row r0, so that its rows land at the start of `codes`
            bitcos_rows   run = rows;
            run.bits += (size_t) r0 * rows.row_bytes;
            run.sign_pos += r0;
            bitcos_codes_decode(&run, 0, r1 - r0, codes.data(), cb);
            for (int64_t r = r0; r < r1; ++r) {
                block_tq2_0 * out = (block_tq2_0 *) dst + r * nb;
                for (int64_t b = 0; b < nb; ++b) {
                    memcpy(out[b].qs, codes.data() + (size_t) (r - r0) * cb + (size_t) b * sizeof(out[b].qs),
                           sizeof(out[b].qs));
                    if (!d_of(r, b, out[b].d)) {
                        bad_row = r;
                    }
                }
            }
        }
    });
    if (bad_row >= 0) {
        snprintf(err, err_size, "row %lld has a scale TQ2_0 cannot hold (not an fp16 value, or two per 256 weights)",
                 (long long) bad_row.load());
        return false;
    }
    return true;
}

ggml_backend_buffer_type_t ggml_backend_cpu_bitcos_codes_buffer_type(void) {
    static ggml_backend_buffer_type buft = {
        /* .iface    = */ {
            /* .get_name       = */ codes_buft_get_name,
            /* .alloc_buffer   = */ codes_buft_alloc_buffer,
            /* .get_alignment  = */ codes_buft_get_alignment,
            /* .get_max_size   = */ nullptr,
            /* .get_alloc_size = */ codes_buft_get_alloc_size,
            /* .is_host        = */ nullptr,
        },
        /* .device  = */ ggml_backend_reg_dev_get(ggml_backend_cpu_reg(), 0),
        /* .context = */ new codes_extra_buffer_type(),
    };
    return &buft;
}
