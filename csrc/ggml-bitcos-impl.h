// ggml-bitcos-impl: what ggml-bitcos.c and ggml-bitcos-link.c share and nothing else includes (it stays in
// ggml/src/ggml-bitcos/, not among the public headers).
#pragma once

#include <stdbool.h>
#include <stddef.h>

// Writes the printf-style message into err (when err is non-NULL and err_size non-zero) and returns false, so
// that every check reads `return ggml_bitcos_fail(err, err_size, ...)`: the validator's and the loader's
// refusals fill the caller's buffer the same way. Defined in ggml-bitcos.c.
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
bool ggml_bitcos_fail(char * err, size_t err_size, const char * fmt, ...);
