// The CPU backend's own API (ggml-cpu.h: ggml_graph_compute, ggml_get_type_traits_cpu, thread pools) for the
// project's C tools (test-bitcos-mm, test-bitcos-backend, llama-bitcos-bench) in both ggml build modes.
//
// A default build links libggml-cpu and calls it directly. With GGML_BACKEND_DL every backend is a module
// loaded at run time (GGML_CPU_ALL_VARIANTS: one libggml-cpu-<variant>.so per x86 ISA level, the best one
// this CPU runs chosen by ggml_backend_load_all()), which nothing may link, so the names below are redirected
// to the same functions of the module that was loaded: its path comes from dladdr() on a function its
// registry hands out, its symbols from dlsym(). The tools' code stays the same in both modes, and in a DL
// build it runs the very CPU variant llama.cpp itself would use. (A tool calls bitcos_load_backends() first.)
#pragma once

#include "ggml-backend.h"
#include "ggml-cpu.h"

// Loads the backend modules of a GGML_BACKEND_DL build once (the CPU variant included); a default build has
// its backends registered already and loads nothing.
static inline void bitcos_load_backends(void) {
    if (ggml_backend_reg_count() == 0) {
        ggml_backend_load_all();
    }
}

#if defined(GGML_BACKEND_DL)
#    if defined(_WIN32)
#        error "bitcos-cpu-api.h: the C tools of a GGML_BACKEND_DL build need dladdr/dlsym (POSIX)"
#    endif
#    include <dlfcn.h>
#    include <stdio.h>
#    include <stdlib.h>

// A symbol of the loaded CPU backend module; exits with a message where there is none.
static inline void * bitcos_cpu_symbol(const char * name) {
    static void * module = NULL;
    if (module == NULL) {
        bitcos_load_backends();
        ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : NULL;
        void *             fn  = reg ? ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads") : NULL;
        Dl_info            info;
        if (fn == NULL || dladdr(fn, &info) == 0 || info.dli_fname == NULL ||
            (module = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD)) == NULL) {
            fprintf(stderr, "no CPU backend loaded (GGML_BACKEND_DL build): no libggml-cpu*.so next to libggml?\n");
            exit(2);
        }
    }
    void * sym = dlsym(module, name);
    if (sym == NULL) {
        fprintf(stderr, "the loaded CPU backend has no %s\n", name);
        exit(2);
    }
    return sym;
}

#    define BITCOS_CPU_FN(name)         ((__typeof__(&name)) bitcos_cpu_symbol(#name))
#    define ggml_cpu_init               BITCOS_CPU_FN(ggml_cpu_init)
#    define ggml_get_type_traits_cpu    BITCOS_CPU_FN(ggml_get_type_traits_cpu)
#    define ggml_graph_plan             BITCOS_CPU_FN(ggml_graph_plan)
#    define ggml_graph_compute          BITCOS_CPU_FN(ggml_graph_compute)
#    define ggml_graph_compute_with_ctx BITCOS_CPU_FN(ggml_graph_compute_with_ctx)
#    define ggml_threadpool_new         BITCOS_CPU_FN(ggml_threadpool_new)
#    define ggml_threadpool_free        BITCOS_CPU_FN(ggml_threadpool_free)
#endif
