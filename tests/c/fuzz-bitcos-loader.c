// fuzz-bitcos-loader: mutated BITCOS GGUF files through the real llama.cpp loader, in process.
//
// Built and driven by tests/fuzzing.py / tests/test_fuzz.py (docs/FUZZING.md) against the patched libllama:
// the installed one (default suite) or the ASan+UBSan build (`tests/fuzzing.py asan-build`, long runs).
//
//   fuzz-bitcos-loader [--seed S] [--first I] [--cases N] [--seconds T] [--decode D] [--timeout T]
//                      [--out DIR] [--save] [--progress P] [--no-extra-bufts] seed.gguf... [refused=seed.gguf...]
//   fuzz-bitcos-loader --replay [--out DIR] file.gguf...     (each file as a case, every load / lazy mode)
//
// Each seed is parsed once (GGUF v3: KV pairs, tensor infos, data; for every ".bitcos" companion its header
// and sections, for every BITCOS weight its blocks). Seeds must load and decode as they are, except those given
// as refused=PATH (BITCOS where the model does not use MUL_MAT), which must be refused. Case i of seed S (reproducible
// alone with --first i
// --cases 1; --save writes it to DIR) takes seed file i % n_seeds and applies 1..6 stacked mutations:
// companion header fields (interesting values: 0, 1, +-1, +-64, x2, /2, 2^32, 2^63, ~0, other fields),
// companion row_base / row_delta entries, sign-pool bits (inside the signs: valid; in the tail: invalid),
// scales of every variant: the companion's fp32 matrix / row scales (PT, MATRIX, ROW) and fp16 block scales
// (B128, B256), G128's fp16 scales in the weight blocks (NaN, inf, negative, -0, 65504, 65505, 1e38,
// subnormal), bitmap bits (flipped, or moved inside a 32-weight block: still valid), tensor type ids (160, 161,
// 162, I8 .. I64, F16, BF16, F64, Q8_1, Q8_K, TQ2_0, Q8_0, holes 43..159, 2^32-1, ...), non-BITCOS tensors retyped with
// data of the type (converted or quantized by ggml, the data section laid out again), shapes (ne and n_dims; +-32 and
// +-128), data offsets, tensor names (the ".bitcos" suffix, swaps), GGUF header counts, KV values (every <arch>.*
// hyper-parameter with edge values, its value type, array items and counts; bitcos.format_version,
// general.alignment below 32, general.file_type), truncation, appended bytes and random byte flips (outside the KV
// section). The mutator leaves one value alone: a vocabulary size above 2^20, whose tables take minutes to build
// (docs/FUZZING.md §2, finding 4). The bytes go
// into a memfd and llama_model_load_from_file() loads /proc/self/fd/N with a random load mode (read, mmap, direct I/O),
// lazy mode (off, auto, on), check_tensors and extra buffer types, CPU only. A refused load is fine; every D-th
// accepted model also gets a context and decodes 3 tokens (the BITCOS MUL_MAT / MUL_MAT_ID kernels on whatever passed
// validation). A crash, abort, sanitizer report or a case running past --timeout seconds saves the case as
// DIR/crash-S-I.gguf (hang-S-I.gguf) and ends the run with a non-zero status.
#define _GNU_SOURCE
#include "llama.h"
#include "ggml.h"
#include "ggml-bitcos.h"
#include "bitcos-test.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#    define FUZZ_ASAN 1
#elif defined(__has_feature)
#    if __has_feature(address_sanitizer)
#        define FUZZ_ASAN 1
#    endif
#endif
#ifdef FUZZ_ASAN
#    include <sanitizer/common_interface_defs.h>
#endif

// ---- little-endian access ----
static uint64_t get_le(const uint8_t * p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) {
        v = (v << 8) | p[i];
    }
    return v;
}
static void put_le(uint8_t * p, int n, uint64_t v) {
    for (int i = 0; i < n; ++i) {
        p[i] = (uint8_t) (v >> (8 * i));
    }
}

// ---- parsed seed ----
#define MAX_TENSORS 64
#define MAX_KV      64

typedef struct {
    size_t   off;      // value position
    int      size;     // scalar size in bytes (0: not a mutable scalar)
    uint32_t type;     // GGUF value type (4 uint32, 5 int32, 6 float32, 7 bool, 8 string, 9 array, ...)
    uint32_t arr_type; // arrays: the item type (items start at off + 12)
    uint64_t arr_n;    // arrays: the item count
    char     key[64];
} kv_rec;

typedef struct {
    char     name[96];
    size_t   name_off; // position of the name bytes
    size_t   name_len;
    size_t   ndims_off;
    uint32_t ndims;
    size_t   ne_off[4];
    uint64_t ne[4];
    size_t   type_off;
    uint32_t type;
    size_t   offs_off;
    uint64_t offs;
    size_t   data;      // absolute position of the data
    size_t   size;      // data bytes (up to the next tensor)
    int      companion; // 1: name ends in ".bitcos"
    // companion sections (absolute positions; valid only when companion)
    uint64_t c_cols, c_rows, c_sign_bits, c_scales, c_row_base, c_row_delta, c_pool, c_pool_bytes, c_mats;
    int      c_variant, c_g;
} tensor_rec;

typedef struct {
    const char * path;
    int          refused; // given as refused=PATH: the loader must refuse it as it is
    uint8_t *    bytes;
    size_t       len;
    size_t       counts_off; // n_tensors at 8, n_kv at 16
    int          n_kv;
    kv_rec       kv[MAX_KV];
    int          n_t;
    tensor_rec   t[MAX_TENSORS];
    size_t       data_start;
    size_t       kv_end;    // end of the KV section (start of the tensor infos)
    uint64_t     alignment; // general.alignment (32 without the key)
    char         arch[32];  // general.architecture: the prefix of the hyper-parameter keys
} seed_file;

static int parse_string(const uint8_t * b, size_t len, size_t * pos, size_t * soff, size_t * slen) {
    if (*pos + 8 > len)
        return 0;
    const uint64_t n = get_le(b + *pos, 8);
    if (n > len - *pos - 8)
        return 0;
    *soff = *pos + 8;
    *slen = (size_t) n;
    *pos += 8 + (size_t) n;
    return 1;
}

static const int k_type_size[13] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };

static int skip_value(const uint8_t * b, size_t len, size_t * pos, uint32_t type) {
    if (type == 8) {
        size_t so, sl;
        return parse_string(b, len, pos, &so, &sl);
    }
    if (type == 9) {
        if (*pos + 12 > len)
            return 0;
        const uint32_t et = (uint32_t) get_le(b + *pos, 4);
        const uint64_t n  = get_le(b + *pos + 4, 8);
        *pos += 12;
        for (uint64_t i = 0; i < n; ++i) {
            if (et > 12 || et == 9 || !skip_value(b, len, pos, et))
                return 0;
        }
        return 1;
    }
    if (type > 12)
        return 0;
    if (*pos + (size_t) k_type_size[type] > len)
        return 0;
    *pos += (size_t) k_type_size[type];
    return 1;
}

static int load_seed(const char * path, seed_file * s) {
    memset(s, 0, sizeof(*s));
    s->path  = path;
    FILE * f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 0;
    }
    fseek(f, 0, SEEK_END);
    s->len = (size_t) ftell(f);
    fseek(f, 0, SEEK_SET);
    s->bytes = malloc(s->len);
    if (fread(s->bytes, 1, s->len, f) != s->len) {
        fclose(f);
        return 0;
    }
    fclose(f);
    const uint8_t * b = s->bytes;
    if (s->len < 24 || memcmp(b, "GGUF", 4) != 0 || get_le(b + 4, 4) != 3) {
        fprintf(stderr, "%s: not a GGUF v3 file\n", path);
        return 0;
    }
    s->counts_off      = 8;
    const uint64_t n_t = get_le(b + 8, 8), n_kv = get_le(b + 16, 8);
    if (n_t > MAX_TENSORS || n_kv > MAX_KV) {
        fprintf(stderr, "%s: too many tensors/kv\n", path);
        return 0;
    }
    size_t   pos       = 24;
    uint64_t alignment = 32;
    for (uint64_t i = 0; i < n_kv; ++i) {
        size_t ko, kl;
        if (!parse_string(b, s->len, &pos, &ko, &kl) || pos + 4 > s->len)
            return 0;
        const uint32_t type = (uint32_t) get_le(b + pos, 4);
        pos += 4;
        kv_rec * r = &s->kv[s->n_kv++];
        snprintf(r->key, sizeof r->key, "%.*s", (int) kl, (const char *) b + ko);
        r->off  = pos;
        r->type = type;
        r->size = type <= 12 ? k_type_size[type] : 0;
        if (type == 9 && pos + 12 <= s->len) {
            r->arr_type = (uint32_t) get_le(b + pos, 4);
            r->arr_n    = get_le(b + pos + 4, 8);
        }
        if (!skip_value(b, s->len, &pos, type))
            return 0;
        if (!strcmp(r->key, "general.alignment") && type == 4)
            alignment = get_le(b + r->off, 4);
        if (!strcmp(r->key, "general.architecture") && type == 8) {
            const uint64_t n = get_le(b + r->off, 8);
            snprintf(s->arch, sizeof s->arch, "%.*s", (int) (n < sizeof s->arch ? n : sizeof s->arch - 1),
                     (const char *) b + r->off + 8);
        }
    }
    s->kv_end    = pos;
    s->alignment = alignment;
    for (uint64_t i = 0; i < n_t; ++i) {
        tensor_rec * t = &s->t[s->n_t++];
        if (!parse_string(b, s->len, &pos, &t->name_off, &t->name_len))
            return 0;
        snprintf(t->name, sizeof t->name, "%.*s", (int) t->name_len, (const char *) b + t->name_off);
        t->ndims_off = pos;
        t->ndims     = (uint32_t) get_le(b + pos, 4);
        pos += 4;
        if (t->ndims > 4)
            return 0;
        for (uint32_t d = 0; d < 4; ++d) {
            t->ne[d] = 1;
        }
        for (uint32_t d = 0; d < t->ndims; ++d) {
            t->ne_off[d] = pos;
            t->ne[d]     = get_le(b + pos, 8);
            pos += 8;
        }
        t->type_off = pos;
        t->type     = (uint32_t) get_le(b + pos, 4);
        t->offs_off = pos + 4;
        t->offs     = get_le(b + pos + 4, 8);
        pos += 12;
        const size_t sl = strlen(BITCOS_COMPANION_SUFFIX);
        t->companion    = t->name_len > sl && !memcmp(t->name + t->name_len - sl, BITCOS_COMPANION_SUFFIX, sl);
    }
    s->data_start = (pos + alignment - 1) / alignment * alignment;
    for (int i = 0; i < s->n_t; ++i) {
        tensor_rec * t = &s->t[i];
        t->data        = s->data_start + t->offs;
        size_t end     = s->len;
        for (int j = 0; j < s->n_t; ++j) {
            const size_t d = s->data_start + s->t[j].offs;
            if (d > t->data && d < end)
                end = d;
        }
        t->size = end - t->data;
        if (t->companion && t->size >= BITCOS_HEADER_BYTES) {
            const uint8_t * h = b + t->data;
            t->c_variant      = h[6];
            t->c_g            = h[7];
            t->c_cols         = get_le(h + 8, 8);
            t->c_rows         = get_le(h + 16, 8);
            t->c_mats         = get_le(h + 24, 8);
            t->c_sign_bits    = get_le(h + 32, 8);
            t->c_scales       = get_le(h + 40, 8);
            t->c_row_base     = get_le(h + 48, 8);
            t->c_row_delta    = get_le(h + 56, 8);
            t->c_pool         = get_le(h + 64, 8);
            t->c_pool_bytes   = get_le(h + 72, 8);
        }
    }
    return 1;
}

// ---- the current case ----
static uint8_t *    g_buf;
static size_t       g_len, g_cap;
static char         g_out[4096] = ".";
static uint64_t     g_seed, g_index;
static const char * g_replay_name;
static char         g_last_log[512];

static void save_case(const char * kind) {
    char path[4200];
    if (g_replay_name) {
        snprintf(path, sizeof path, "%s/%s-replay.gguf", g_out, kind);
    } else {
        snprintf(path, sizeof path, "%s/%s-%" PRIu64 "-%" PRIu64 ".gguf", g_out, kind, g_seed, g_index);
    }
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        size_t done = 0;
        while (done < g_len) {
            const ssize_t w = write(fd, g_buf + done, g_len - done);
            if (w <= 0)
                break;
            done += (size_t) w;
        }
        close(fd);
    }
    char      msg[4600];
    const int n = snprintf(msg, sizeof msg,
                           "\n%s: case seed=%" PRIu64 " index=%" PRIu64 "%s%s saved to %s\n"
                           "last log: %s\n",
                           kind == NULL ? "" : kind, g_seed, g_index, g_replay_name ? " file=" : "",
                           g_replay_name ? g_replay_name : "", path, g_last_log);
    if (n > 0) {
        ssize_t ignored = write(2, msg, (size_t) n < sizeof msg ? (size_t) n : sizeof msg - 1);
        (void) ignored;
    }
}

static void on_death(void) {
    save_case("crash");
}

static void on_signal(int sig) {
    save_case("crash");
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_alarm(int sig) {
    (void) sig;
    save_case("hang");
    _exit(3);
}

static void log_cb(enum ggml_log_level level, const char * text, void * ud) {
    (void) ud;
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        snprintf(g_last_log, sizeof g_last_log, "%s", text);
    }
    if (getenv("FUZZ_VERBOSE")) {
        fputs(text, stderr);
    }
}

// ---- mutations ----
static uint64_t interesting_u64(uint64_t orig) {
    switch (rng_below(20)) {
        case 0:
            return 0;
        case 1:
            return 1;
        case 2:
            return orig - 1;
        case 3:
            return orig + 1;
        case 4:
            return orig + 64;
        case 5:
            return orig - 64;
        case 6:
            return orig * 2;
        case 7:
            return orig / 2;
        case 8:
            return 1ull << 32;
        case 9:
            return 1ull << 63;
        case 10:
            return ~0ull;
        case 11:
            return ~0ull - 63;
        case 12:
            return 0x7fffffffull;
        case 13:
            return 0xffffffffull;
        case 14:
            return orig ^ (1ull << rng_below(64));
        case 15:
            return orig + 8;
        case 16:
            return orig - 8;
        case 17:
            return (uint64_t) 1 << (rng_below(40));
        default:
            return rng_u64() >> rng_below(64);
    }
}

static uint32_t interesting_f32_bits(void) {
    static const uint32_t v[] = {
        0x7fc00000u, // NaN
        0xffc00001u, // -NaN with payload
        0x7f800000u, // inf
        0xff800000u, // -inf
        0xbf800000u, // -1
        0x80000000u, // -0
        0x00000000u, // 0
        0x477fe000u, // 65504
        0x477fe100u, // 65505
        0x7e967699u, // 1e38
        0x00000001u, // smallest subnormal
        0x3f800000u, // 1
        0x7f7fffffu, // FLT_MAX
    };
    return v[rng_below(sizeof v / sizeof v[0])];
}

static uint16_t interesting_f16_bits(void) {
    static const uint16_t v[] = { 0x7e00, 0x7c00, 0xfc00, 0x8000, 0xbc00, 0x7bff,
                                  0x0001, 0x0000, 0x3c00, 0xfbff, 0x7c01, 0xffff };
    return v[rng_below(sizeof v / sizeof v[0])];
}

static const seed_file * g_s; // seed of the current case

static const tensor_rec * pick_tensor(int want_companion) {
    // want_companion: 1 companion, 0 BITCOS weight, -1 any
    for (int tries = 0; tries < 64; ++tries) {
        const tensor_rec * t = &g_s->t[rng_below((uint64_t) g_s->n_t)];
        if (want_companion < 0)
            return t;
        if (want_companion == 1 && t->companion)
            return t;
        if (want_companion == 0 && ggml_bitcos_is_type((enum ggml_type) t->type))
            return t;
    }
    return &g_s->t[rng_below((uint64_t) g_s->n_t)];
}

static int in_buf(size_t pos, size_t n) {
    return pos <= g_len && n <= g_len - pos;
}

static void mut_companion_header(void) {
    static const struct {
        int off, size;
    } f[] = {
        { 0, 4 },  { 4, 2 },  { 6, 1 },  { 7, 1 },  { 8, 8 },  { 16, 8 }, { 24, 8 },  { 32, 8 },
        { 40, 8 }, { 48, 8 }, { 56, 8 }, { 64, 8 }, { 72, 8 }, { 80, 8 }, { 120, 8 },
    };
    const tensor_rec * t = pick_tensor(1);
    const int          i = (int) rng_below(sizeof f / sizeof f[0]);
    const size_t       p = t->data + (size_t) f[i].off;
    if (!in_buf(p, (size_t) f[i].size))
        return;
    uint64_t v = get_le(g_buf + p, f[i].size);
    if (rng_below(4) == 0 && f[i].size == 8) {
        v = get_le(g_buf + t->data + 8 * (1 + rng_below(9)), 8); // another field's value
    } else if (f[i].size == 8) {
        v = interesting_u64(v);
    } else {
        v = rng_below(2) ? (v ^ (1ull << rng_below(8 * (uint64_t) f[i].size))) : (rng_below(2) ? 0 : v + 1);
    }
    put_le(g_buf + p, f[i].size, v);
}

static void mut_row_index(void) {
    const tensor_rec * t = pick_tensor(1);
    if (!t->companion || t->c_rows == 0)
        return;
    if (rng_below(2)) {
        const uint64_t n = (t->c_rows + (1ull << t->c_g) - 1) >> t->c_g;
        const size_t   p = t->data + t->c_row_base + 8 * rng_below(n);
        if (in_buf(p, 8))
            put_le(g_buf + p, 8, interesting_u64(get_le(g_buf + p, 8)));
    } else {
        const size_t p = t->data + t->c_row_delta + 2 * rng_below(t->c_rows);
        if (!in_buf(p, 2))
            return;
        const uint64_t v  = get_le(g_buf + p, 2);
        const uint64_t nv = rng_below(3) == 0 ? 0xffff : rng_below(2) ? v + 1 : v - 1;
        put_le(g_buf + p, 2, nv);
    }
}

static void mut_pool(void) {
    const tensor_rec * t = pick_tensor(1);
    if (!t->companion)
        return;
    uint64_t bit;
    if (rng_below(2) && t->c_sign_bits) {
        bit = rng_below(t->c_sign_bits); // a sign: still valid
    } else {
        const uint64_t pool_bits = t->c_pool_bytes * 8;
        bit = t->c_sign_bits + rng_below(pool_bits - t->c_sign_bits + (pool_bits == t->c_sign_bits));
    }
    const size_t p = t->data + t->c_pool + bit / 8;
    if (in_buf(p, 1))
        g_buf[p] ^= (uint8_t) (1u << (bit & 7));
}

// The companion of weight t (NULL if none in the seed).
static const tensor_rec * companion_of(const tensor_rec * t) {
    for (int i = 0; i < g_s->n_t; ++i) {
        const tensor_rec * c = &g_s->t[i];
        if (c->companion && c->name_len == t->name_len + strlen(BITCOS_COMPANION_SUFFIX) &&
            !memcmp(c->name, t->name, t->name_len)) {
            return c;
        }
    }
    return NULL;
}

static void mut_scale(void) {
    const tensor_rec * t = pick_tensor(0);
    if (t->type == GGML_TYPE_BITCOS_G128) {
        const uint64_t nblocks = t->size / BITCOS_BLOCK_BYTES_G128;
        if (nblocks == 0)
            return;
        const size_t p = t->data + BITCOS_BLOCK_BYTES_G128 * rng_below(nblocks) + BITCOS_BITMAP_BYTES;
        if (in_buf(p, 2))
            put_le(g_buf + p, 2, interesting_f16_bits());
        return;
    }
    // every other variant: the companion's scales section (FORMAT.md 4.2), sized from the seed's header
    const tensor_rec * c = companion_of(t);
    if (c == NULL || c->c_scales == 0 || c->c_variant < 0 || c->c_variant >= BITCOS_VARIANT_COUNT)
        return;
    const uint64_t bytes = bitcos_scales_bytes(c->c_variant, c->c_cols, c->c_rows, c->c_mats);
    const int      f16   = bitcos_variant_scale_block(c->c_variant) != 0;
    const uint64_t n     = bytes / (f16 ? 2 : 4);
    if (n == 0)
        return;
    const size_t p = c->data + c->c_scales + (f16 ? 2 : 4) * rng_below(n);
    if (f16) {
        if (in_buf(p, 2))
            put_le(g_buf + p, 2, interesting_f16_bits());
    } else {
        if (in_buf(p, 4))
            put_le(g_buf + p, 4, interesting_f32_bits());
    }
}

static void mut_bitmap(void) {
    const tensor_rec * t       = pick_tensor(0);
    // the unit whose bits may move without changing the row's popcount: a v1 block (128 weights, scale after
    // the bitmap) or a v2 ggml block (32 weights; a row is whole blocks, so a block never straddles rows)
    const int          v2      = t->type == GGML_TYPE_BITCOS;
    const size_t       bb      = v2                               ? sizeof(block_bitcos) :
                                 t->type == GGML_TYPE_BITCOS_G128 ? BITCOS_BLOCK_BYTES_G128 :
                                                                    BITCOS_BLOCK_BYTES_PT;
    const unsigned     nbits   = v2 ? QK_BITCOS_BITMAP : QK_BITCOS;
    const uint64_t     nblocks = t->size / bb;
    if (nblocks == 0)
        return;
    const uint64_t blk = rng_below(nblocks);
    const size_t   p   = t->data + bb * blk;
    if (!in_buf(p, nbits / 8))
        return;
    const unsigned a = (unsigned) rng_below(nbits);
    if (rng_below(2)) {
        g_buf[p + a / 8] ^= (uint8_t) (1u << (a % 8)); // popcount changes: the row index breaks
    } else {
        // move a set bit to a clear position in the same block: popcount (and the index) unchanged, valid
        const unsigned c  = (unsigned) rng_below(nbits);
        const int      sa = (g_buf[p + a / 8] >> (a % 8)) & 1, sc = (g_buf[p + c / 8] >> (c % 8)) & 1;
        if (sa != sc) {
            g_buf[p + a / 8] ^= (uint8_t) (1u << (a % 8));
            g_buf[p + c / 8] ^= (uint8_t) (1u << (c % 8));
        }
    }
}

static int is_bitcos_related(const tensor_rec * t) {
    return t->companion || ggml_bitcos_is_type((enum ggml_type) t->type);
}

// Types a tensor's type id may become (mut_type: the id alone; mut_retype: with data of that type).
static const uint32_t k_any_types[] = { GGML_TYPE_BITCOS_G128,
                                        GGML_TYPE_BITCOS_PT,
                                        GGML_TYPE_BITCOS,
                                        GGML_TYPE_I8,
                                        GGML_TYPE_I16,
                                        GGML_TYPE_I32,
                                        GGML_TYPE_I64,
                                        GGML_TYPE_F32,
                                        GGML_TYPE_F16,
                                        GGML_TYPE_BF16,
                                        GGML_TYPE_F64,
                                        GGML_TYPE_Q8_1,
                                        GGML_TYPE_Q8_K,
                                        GGML_TYPE_TQ2_0,
                                        GGML_TYPE_TQ1_0,
                                        GGML_TYPE_Q8_0,
                                        GGML_TYPE_Q4_0,
                                        GGML_TYPE_Q4_K,
                                        GGML_TYPE_MXFP4,
                                        43,
                                        100,
                                        159,
                                        163,
                                        255,
                                        0xffffffffu,
                                        0x800000a0u };

// A tensor's type id: any id (the defined types, BITCOS, the holes 43..159, 163, 2^32-1, ...), or the types of
// two BITCOS weights / companions swapped (a weight and its companion, a version-1 weight with a version-2
// companion, ...). Only the id changes, so a type of another size moves the tensor's end off the next
// tensor's offset (gguf.cpp refuses it) unless the sizes agree (F32 / I32) or the tensor is the last one;
// mut_retype changes the data with the type.
static void mut_type(void) {
    if (rng_below(4) == 0) {
        const tensor_rec *a = pick_tensor((int) rng_below(2)), *b = pick_tensor((int) rng_below(2));
        const uint32_t ta = (uint32_t) get_le(g_buf + a->type_off, 4), tb = (uint32_t) get_le(g_buf + b->type_off, 4);
        put_le(g_buf + a->type_off, 4, tb);
        put_le(g_buf + b->type_off, 4, ta);
        return;
    }
    const tensor_rec * t = pick_tensor(rng_below(2) ? 0 : -1);
    uint32_t           nt;
    if (!is_bitcos_related(t) && rng_below(3) == 0) {
        // the BITCOS types where the model does not use MUL_MAT: a norm, token_embd, a lazily read tensor
        static const uint32_t bitcos_types[] = { GGML_TYPE_BITCOS_G128, GGML_TYPE_BITCOS_PT, GGML_TYPE_BITCOS };
        nt                                   = bitcos_types[rng_below(3)];
    } else if (rng_below(8) == 0) {
        nt = (uint32_t) rng_below(GGML_TYPE_COUNT + 2); // every id, defined or not
    } else {
        nt = k_any_types[rng_below(sizeof k_any_types / sizeof k_any_types[0])];
    }
    put_le(g_buf + t->type_off, 4, nt);
}

// Tensor t's data replaced by `data` (n bytes), and every tensor's data moved to where a writer puts it: each at
// the first offset aligned to general.alignment after the one before, with the offsets of the tensor infos
// to match. So a tensor of another type (size) leaves the file well-formed. Tensors keep their order in the
// seed; the bytes of the others come from the current case (earlier mutations included).
static uint8_t * g_tmp;     // g_cap bytes
static int       g_retyped; // the case's data were moved (mut_retype)

static void relayout(const tensor_rec * t, const uint8_t * data, size_t n) {
    const seed_file * s     = g_s;
    const uint64_t    align = s->alignment ? s->alignment : 32;
    if (g_len < s->data_start)
        return;
    int order[MAX_TENSORS];
    for (int i = 0; i < s->n_t; ++i) {
        int j = i;
        while (j > 0 && s->t[order[j - 1]].offs > s->t[i].offs) {
            order[j] = order[j - 1];
            --j;
        }
        order[j] = i;
    }
    size_t pos = s->data_start;
    memcpy(g_tmp, g_buf, s->data_start);
    for (int k = 0; k < s->n_t; ++k) {
        const tensor_rec * u   = &s->t[order[k]];
        const size_t       off = (pos - s->data_start + align - 1) / align * align;
        size_t             len = u == t ? n : u->size;
        const uint8_t *    src = u == t ? data : g_buf + u->data;
        if (u != t && u->data + len > g_len) // truncated before: copy what is left
            len = u->data < g_len ? g_len - u->data : 0;
        if (s->data_start + off + len > g_cap)
            return;                                        // does not fit: leave the case as it is
        memset(g_tmp + pos, 0, s->data_start + off - pos); // padding
        pos = s->data_start + off;
        memcpy(g_tmp + pos, src, len);
        put_le(g_tmp + u->offs_off, 8, off);
        pos += len;
    }
    memcpy(g_buf, g_tmp, pos);
    g_len = pos;
}

// The non-BITCOS tensors are F32 in the seeds: a value as an integer of the given byte width (rounded, or an
// extreme of the type).
static void put_int(uint8_t * p, int width, float v) {
    const int64_t lim = width >= 8 ? INT64_MAX : ((int64_t) 1 << (8 * width - 1)) - 1;
    const double  d   = (double) v * 4.0;
    int64_t       x;
    switch (rng_below(16)) {
        case 0:
            x = lim;
            break;
        case 1:
            x = -lim - 1;
            break;
        default:
            x = d != d ? 0 : d >= (double) lim ? lim : d <= (double) (-lim - 1) ? -lim - 1 : (int64_t) d;
            break;
    }
    put_le(p, width, (uint64_t) x);
}

// A non-BITCOS tensor (a norm, token_embd, the MoE router, gemma4's per-layer tables, ...) as another type with
// data of that type: its F32 values converted (F16, BF16, F64, integers) or quantized by ggml
// (ggml_quantize_chunk: Q4_0 .. Q8_0, the K-quants, IQ4_NL / IQ4_XS, TQ1_0 / TQ2_0, MXFP4, ...), or, for a
// type ggml cannot quantize to (Q8_1, Q8_K), the seed's bytes; then relayout. The model may use the tensor in
// an op that has no kernel for the type (an F16 norm in MUL, an integer or Q8_1 table in GET_ROWS, F64 in
// MUL_MAT): the loader must refuse it (no device runs the op on it; integer weights), not abort at decode.
static void mut_retype(void) {
    static const uint32_t types[] = { GGML_TYPE_F16,    GGML_TYPE_BF16,  GGML_TYPE_F64,   GGML_TYPE_I8,
                                      GGML_TYPE_I16,    GGML_TYPE_I32,   GGML_TYPE_I64,   GGML_TYPE_Q8_0,
                                      GGML_TYPE_Q4_0,   GGML_TYPE_Q4_1,  GGML_TYPE_Q5_0,  GGML_TYPE_Q5_1,
                                      GGML_TYPE_Q2_K,   GGML_TYPE_Q3_K,  GGML_TYPE_Q4_K,  GGML_TYPE_Q5_K,
                                      GGML_TYPE_Q6_K,   GGML_TYPE_Q8_K,  GGML_TYPE_Q8_1,  GGML_TYPE_IQ4_NL,
                                      GGML_TYPE_IQ4_XS, GGML_TYPE_TQ1_0, GGML_TYPE_TQ2_0, GGML_TYPE_MXFP4,
                                      GGML_TYPE_Q1_0,   GGML_TYPE_Q2_0,  GGML_TYPE_F32 };
    if (g_retyped)
        return; // once per case: the tensors' data have moved
    const tensor_rec * t = NULL;
    for (int tries = 0; tries < 16 && t == NULL; ++tries) {
        const tensor_rec * u = pick_tensor(-1);
        if (!is_bitcos_related(u) && u->type == GGML_TYPE_F32)
            t = u;
    }
    if (t == NULL)
        return;
    const enum ggml_type nt = (enum ggml_type) types[rng_below(sizeof types / sizeof types[0])];
    const int64_t        k  = (int64_t) t->ne[0];
    const int64_t        nr = (int64_t) (t->ne[1] * t->ne[2] * t->ne[3]);
    if (k <= 0 || k % ggml_blck_size(nt) != 0)
        return;
    const size_t n  = ggml_row_size(nt, k) * (size_t) nr;
    const size_t nf = (size_t) (k * nr); // F32 values in the seed
    if (!in_buf(t->data, nf * 4) || n > g_cap / 2)
        return;
    float * src = malloc(nf * sizeof(float));
    memcpy(src, g_buf + t->data, nf * sizeof(float));
    uint8_t * dst = calloc(n ? n : 1, 1);
    switch (nt) {
        case GGML_TYPE_F32:
            memcpy(dst, src, n);
            break;
        case GGML_TYPE_F64:
            for (size_t i = 0; i < nf; ++i) {
                const double d = src[i];
                memcpy(dst + 8 * i, &d, 8);
            }
            break;
        case GGML_TYPE_I8:
        case GGML_TYPE_I16:
        case GGML_TYPE_I32:
        case GGML_TYPE_I64: {
            const int w = (int) ggml_type_size(nt);
            for (size_t i = 0; i < nf; ++i) {
                put_int(dst + (size_t) w * i, w, src[i]);
            }
            break;
        }
        case GGML_TYPE_Q8_1:
        case GGML_TYPE_Q8_K:
            memcpy(dst, src, n < nf * 4 ? n : nf * 4);
            break;
        default:
            ggml_quantize_chunk(nt, src, dst, 0, nr, k, NULL);
            break;
    }
    put_le(g_buf + t->type_off, 4, (uint64_t) nt);
    relayout(t, dst, n);
    g_retyped = 1;
    free(dst);
    free(src);
}

static void mut_shape(void) {
    const tensor_rec * t = pick_tensor(-1);
    if (rng_below(5) == 0) {
        put_le(g_buf + t->ndims_off, 4, rng_below(8) == 0 ? 0xffffffffu : rng_below(6)); // the layout after it shifts
        return;
    }
    if (t->ndims == 0)
        return;
    const uint32_t d = (uint32_t) rng_below(t->ndims);
    const uint64_t v = get_le(g_buf + t->ne_off[d], 8);
    uint64_t       nv;
    switch (rng_below(12)) {
        case 0:
            nv = 0;
            break;
        case 1:
            nv = v + 128;
            break;
        case 2:
            nv = v - 128;
            break;
        case 3:
            nv = v + 1;
            break;
        case 4:
            nv = 128;
            break;
        case 5:
            nv = 1;
            break;
        case 6:
            nv = v + 32;
            break; // GGML_TYPE_BITCOS: still whole ggml blocks, maybe not the variant's K
        case 7:
            nv = v - 32;
            break;
        default:
            nv = interesting_u64(v);
            break;
    }
    put_le(g_buf + t->ne_off[d], 8, nv);
}

static void mut_offset(void) {
    const tensor_rec * t = pick_tensor(-1);
    uint64_t           v = get_le(g_buf + t->offs_off, 8);
    switch (rng_below(6)) {
        case 0:
            v = g_s->t[rng_below((uint64_t) g_s->n_t)].offs;
            break; // another tensor's data
        case 1:
            v += 32 * (1 + rng_below(4));
            break;
        case 2:
            v -= 32 * (1 + rng_below(4));
            break;
        case 3:
            v = g_len - g_s->data_start;
            break;
        default:
            v = interesting_u64(v);
            break;
    }
    put_le(g_buf + t->offs_off, 8, v);
}

static void mut_name(void) {
    const tensor_rec * t = pick_tensor(rng_below(2) ? 1 : -1);
    if (t->name_len == 0)
        return;
    switch (rng_below(4)) {
        case 0: // break the suffix or the weight part
            g_buf[t->name_off + rng_below(t->name_len)] ^= (uint8_t) (1u << rng_below(7));
            break;
        case 1: { // take another tensor's name of the same length (duplicate names / companion of another weight)
            const tensor_rec * u = pick_tensor(-1);
            if (u->name_len == t->name_len)
                memcpy(g_buf + t->name_off, g_buf + u->name_off, t->name_len);
            break;
        }
        case 2: // a NUL inside the name
            g_buf[t->name_off + rng_below(t->name_len)] = 0;
            break;
        default: // name length field
            put_le(g_buf + t->name_off - 8, 8, interesting_u64(t->name_len));
            break;
    }
}

// Keys whose values the fuzzer changes: every key of the model's own (<arch>.*: block count, embedding, head
// and expert counts, context length, rope dimensions, key / value lengths, epsilons, sliding windows, ...),
// the BITCOS key, general.alignment and general.file_type. Left alone: general.architecture and the other
// general.* strings, and the tokenizer (the seeds have none: tokenizer code is upstream's alone).
static int kv_fuzzable(const kv_rec * r) {
    if (!strncmp(r->key, "bitcos.", 7) || !strcmp(r->key, "general.alignment") ||
        !strcmp(r->key, "general.file_type")) {
        return 1;
    }
    const size_t n = strlen(g_s->arch);
    return n > 0 && !strncmp(r->key, g_s->arch, n) && r->key[n] == '.';
}

// An edge value of an integer of `size` bytes: 0, 1, the type's maximum, 2^20, 2^31, 2^31 - 1, the value +-1,
// x2, /2, a small one, a power of two, a random one.
static uint64_t edge_int(uint64_t v, int size) {
    const uint64_t max = size >= 8 ? ~0ull : (1ull << (8 * size)) - 1;
    switch (rng_below(16)) {
        case 0:
            return 0;
        case 1:
            return 1;
        case 2:
            return max;
        case 3:
            return 1ull << 20;
        case 4:
            return (1ull << 20) + 1;
        case 5:
            return 1ull << 31;
        case 6:
            return 0x7fffffffull;
        case 7:
            return v + 1;
        case 8:
            return v - 1;
        case 9:
            return v * 2;
        case 10:
            return v / 2;
        case 11:
            return 2 + rng_below(63);
        case 12:
            return 1ull << rng_below((uint64_t) (8 * size));
        case 13:
            return max - rng_below(4);
        default:
            return rng_u64() >> rng_below(64);
    }
}

// general.alignment: below 32 (powers of two, and not: gguf.cpp refuses those), 0, or any other value
static uint64_t alignment_value(uint64_t v) {
    static const uint64_t small[] = { 1, 2, 4, 8, 16, 3, 5, 6, 12, 24, 31, 33, 48, 64, 0 };
    return rng_below(4) ? small[rng_below(sizeof small / sizeof small[0])] : edge_int(v, 4);
}

// <arch>.vocab_size of a model without a tokenizer makes llama.cpp create that many dummy tokens, about 25 ms
// per 2^20 and minutes for 2^28 (finding 4): a larger value becomes 2^20 (a quarter of them) or its low 16 bits.
#define VOCAB_SIZE_MAX (1ull << 20)

static void mut_kv_scalar(const kv_rec * r, size_t p, uint32_t type) {
    const int size = type <= 12 ? k_type_size[type] : 0;
    if (size == 0 || !in_buf(p, (size_t) size))
        return;
    const uint64_t v = get_le(g_buf + p, size);
    uint64_t       nv;
    if (type == 6) { // float32
        float f;
        memcpy(&f, &(uint32_t) { (uint32_t) v }, 4);
        switch (rng_below(4)) {
            case 0:
                f = -f;
                break;
            case 1:
                f = rng_below(2) ? f * 1024.0f : f / 1024.0f;
                break;
            default: {
                const uint32_t bits = interesting_f32_bits();
                memcpy(&f, &bits, 4);
                break;
            }
        }
        uint32_t bits;
        memcpy(&bits, &f, 4);
        nv = bits;
    } else if (type == 12) { // float64
        nv = rng_below(2) ? 0x7ff8000000000000ull : edge_int(v, 8);
    } else if (type == 7) {  // bool: 0, 1, or a byte that is neither
        static const uint8_t b[] = { 0, 1, 2, 255 };
        nv                       = b[rng_below(4)];
    } else if (!strcmp(r->key, "general.alignment")) {
        nv = alignment_value(v);
    } else {
        nv = edge_int(v, size);
        if (type == 5 || type == 3 || type == 1 || type == 11) { // signed: negative values too
            if (rng_below(4) == 0)
                nv = (uint64_t) -(int64_t) (1 + rng_below(4));
        }
        if (size < 8)
            nv &= (1ull << (8 * size)) - 1; // the value as stored
        const size_t n = strlen(r->key);
        if (n >= 11 && !strcmp(r->key + n - 11, ".vocab_size") && nv > VOCAB_SIZE_MAX)
            nv = rng_below(4) == 0 ? VOCAB_SIZE_MAX : nv & 0xffff;
    }
    put_le(g_buf + p, size, nv);
}

static void mut_kv(void) {
    const kv_rec * cand[MAX_KV];
    int            n = 0;
    for (int i = 0; i < g_s->n_kv; ++i) {
        if (kv_fuzzable(&g_s->kv[i]))
            cand[n++] = &g_s->kv[i];
    }
    if (n == 0)
        return;
    const kv_rec * r = cand[rng_below((uint64_t) n)];
    if (r->size != 0 && r->type != 8 && rng_below(8) == 0) {
        // the value's type: another of the same size (u32 / i32 / f32, u8 / i8 / bool, u64 / i64 / f64), so the
        // file still parses and the loader sees a key of the wrong type
        static const uint32_t same[4][3] = { { 0, 1, 7 }, { 2, 3, 3 }, { 4, 5, 6 }, { 10, 11, 12 } };
        const int             row        = r->size == 1 ? 0 : r->size == 2 ? 1 : r->size == 4 ? 2 : 3;
        put_le(g_buf + r->off - 4, 4, same[row][rng_below(3)]);
        return;
    }
    if (r->type == 9) {
        // an array (per-layer values, gemma4's sliding-window pattern): one item, or the count
        const int isz = r->arr_type <= 12 ? k_type_size[r->arr_type] : 0;
        if (isz > 0 && r->arr_type != 8 && r->arr_n > 0 && rng_below(4)) {
            mut_kv_scalar(r, r->off + 12 + (size_t) isz * rng_below(r->arr_n), r->arr_type);
        } else {
            put_le(g_buf + r->off + 4, 8,
                   rng_below(2) ? r->arr_n + (rng_below(2) ? 1 : (uint64_t) -1) : interesting_u64(r->arr_n));
        }
        return;
    }
    if (r->type == 8) {
        // a string: its length
        put_le(g_buf + r->off, 8, interesting_u64(get_le(g_buf + r->off, 8)));
        return;
    }
    mut_kv_scalar(r, r->off, r->type);
}

static void mut_counts(void) {
    const size_t p = 8 + 8 * rng_below(2);
    put_le(g_buf + p, 8, interesting_u64(get_le(g_buf + p, 8)));
}

static void mut_truncate(void) {
    if (g_len == 0)
        return;
    if (rng_below(2)) {
        // inside a companion, near its end, or anywhere
        const tensor_rec * t   = pick_tensor(1);
        const size_t       end = t->data + t->size;
        const size_t       cut =
            rng_below(2) ? end - 1 - rng_below(t->size < 256 ? t->size : 256) : t->data + rng_below(t->size + 1);
        if (cut < g_len)
            g_len = cut;
    } else {
        g_len = rng_below(g_len);
    }
}

static void mut_append(void) {
    const size_t n = 1 + rng_below(256);
    if (g_len + n > g_cap)
        return;
    for (size_t i = 0; i < n; ++i) {
        g_buf[g_len + i] = (uint8_t) rng_u64();
    }
    g_len += n;
}

// Random bytes in the tensor infos and data (not in the KV section: see kv_fuzzable).
static void mut_havoc(void) {
    const int n = 1 + (int) rng_below(8);
    for (int i = 0; i < n && g_len > g_s->kv_end; ++i) {
        const size_t p = g_s->kv_end + rng_below(g_len - g_s->kv_end);
        g_buf[p]       = rng_below(2) ? (uint8_t) rng_u64() : (uint8_t) (g_buf[p] ^ (1u << rng_below(8)));
    }
}

static void mut_copy_companion(void) {
    // one companion's bytes over another's: a well-formed header of the wrong tensor
    const tensor_rec *a = pick_tensor(1), *b = pick_tensor(1);
    if (a == b)
        return;
    const size_t n = a->size < b->size ? a->size : b->size;
    memmove(g_buf + b->data, g_buf + a->data, n);
}

typedef void (*mutator)(void);
static const struct {
    mutator      fn;
    int          weight;
    const char * name;
} k_mutators[] = {
    { mut_companion_header, 14, "companion-header" },
    { mut_row_index, 8, "row-index" },
    { mut_pool, 6, "pool" },
    { mut_scale, 6, "scale" },
    { mut_bitmap, 6, "bitmap" },
    { mut_type, 8, "type" },
    { mut_retype, 6, "retype" },
    { mut_shape, 8, "shape" },
    { mut_offset, 5, "offset" },
    { mut_name, 5, "name" },
    { mut_kv, 10, "kv" },
    { mut_counts, 2, "counts" },
    { mut_truncate, 4, "truncate" },
    { mut_append, 2, "append" },
    { mut_havoc, 5, "havoc" },
    { mut_copy_companion, 2, "copy-companion" },
};
#define N_MUTATORS (int) (sizeof k_mutators / sizeof k_mutators[0])

static void make_case(const seed_file * seeds, int n_seeds) {
    rng_seed_case(g_seed, g_index);
    g_s = &seeds[g_index % (uint64_t) n_seeds];
    memcpy(g_buf, g_s->bytes, g_s->len);
    g_len     = g_s->len;
    g_retyped = 0;
    int total = 0;
    for (int i = 0; i < N_MUTATORS; ++i) {
        total += k_mutators[i].weight;
    }
    const int n = rng_below(2) ? 1 : 2 + (int) rng_below(5);
    for (int m = 0; m < n; ++m) {
        int r = (int) rng_below((uint64_t) total);
        int i = 0;
        while (r >= k_mutators[i].weight) {
            r -= k_mutators[i].weight;
            ++i;
        }
        k_mutators[i].fn();
    }
}

// ---- loading ----
static int      g_fd = -1;
static char     g_fd_path[64];
static uint64_t g_accepted, g_refused, g_decoded, g_ctx_failed, g_decode_failed;

#define N_REASONS 256
static struct {
    char     text[128];
    uint64_t n;
} g_reasons[N_REASONS];
static int g_n_reasons;

static void count_reason(const char * msg) {
    // the reason with quoted names as '*' and numbers as '#', so that reasons group
    char   key[128];
    size_t n      = 0;
    int    quoted = 0;
    for (const char * c = msg; *c && n < sizeof key - 1; ++c) {
        if (*c == '\'') {
            quoted = !quoted;
            if (quoted)
                key[n++] = '*';
            continue;
        }
        if (quoted)
            continue;
        if (*c >= '0' && *c <= '9') { // a number (decimal, hex, float) -> '#'
            key[n++]      = '#';
            const int hex = c[0] == '0' && (c[1] == 'x' || c[1] == 'X');
            if (hex)
                ++c;
            while (c[1] && ((c[1] >= '0' && c[1] <= '9') || (c[1] == '.' && c[2] >= '0' && c[2] <= '9') ||
                            (hex && strchr("abcdefABCDEF", c[1]) != NULL) ||
                            (!hex && (c[1] == 'e' || c[1] == 'E') && (c[2] == '-' || c[2] == '+'))))
                c += (c[1] == 'e' || c[1] == 'E') && !hex ? 2 : 1;
            continue;
        }
        key[n++] = *c == '\n' ? ' ' : *c;
    }
    key[n] = 0;
    for (int i = 0; i < g_n_reasons; ++i) {
        if (!strcmp(g_reasons[i].text, key)) {
            g_reasons[i].n++;
            return;
        }
    }
    if (g_n_reasons < N_REASONS) {
        snprintf(g_reasons[g_n_reasons].text, sizeof g_reasons[0].text, "%s", key);
        g_reasons[g_n_reasons++].n = 1;
    }
}

static void write_fd(void) {
    if (ftruncate(g_fd, 0) != 0 || pwrite(g_fd, g_buf, g_len, 0) != (ssize_t) g_len) {
        perror("memfd write");
        exit(2);
    }
}

static const char *       g_load_path; // replay: the file itself (split models need their real names)
// --no-extra-bufts: never the extra buffer types (CPU_REPACK, CPU_BITCOS_2BIT). Long ASan+UBSan runs need it: with
// them, GCC 12's ASan runtime fails sporadically inside a thread's start once thread ids pass 8192 (docs/FUZZING.md
// §4).
static int                g_no_extra_bufts;
static ggml_backend_dev_t g_no_devices[1] = { NULL };

// mode_pick of load_case: load mode (pick % 4: read, mmap, mmap, direct I/O), lazy mode ((pick / 4) % 3: off, auto,
// on), check_tensors ((pick / 12) % 4 == 0), extra buffer types ((pick / 48) % 2). The seeds and replayed files
// are loaded with each of these: every load x lazy mode with check_tensors, two without it, and read, mmap and
// direct I/O with the extra buffer types (the CPU_REPACK / CPU_BITCOS_2BIT buffers).
static const int k_all_modes[] = { 0, 1, 3, 4, 5, 7, 8, 9, 11, 61, 21, 48, 51 };
#define N_ALL_MODES (int) (sizeof k_all_modes / sizeof k_all_modes[0])

// Loads the current bytes; decodes when accepted and `decode`. Returns 1 when accepted.
static int load_case(int decode, int mode_pick) {
    if (g_load_path == NULL) {
        write_fd();
    }
    struct llama_model_params mp               = llama_model_default_params();
    mp.devices                                 = g_no_devices; // CPU only
    mp.n_gpu_layers                            = 0;
    static const enum llama_load_mode modes[]  = { LLAMA_LOAD_MODE_NONE, LLAMA_LOAD_MODE_MMAP, LLAMA_LOAD_MODE_MMAP,
                                                   LLAMA_LOAD_MODE_DIRECT_IO };
    static const enum llama_lazy_mode lazies[] = { LLAMA_LAZY_MODE_OFF, LLAMA_LAZY_MODE_AUTO, LLAMA_LAZY_MODE_ON };
    mp.load_mode                               = modes[mode_pick % 4];
    mp.lazy_mode                               = lazies[(mode_pick / 4) % 3];
    mp.check_tensors                           = (mode_pick / 12) % 4 == 0;
    mp.use_extra_bufts                         = !g_no_extra_bufts && (mode_pick / 48) % 2;
    g_last_log[0]                              = 0;
    struct llama_model * model                 = llama_model_load_from_file(g_load_path ? g_load_path : g_fd_path, mp);
    if (model == NULL) {
        ++g_refused;
        const char * e = ggml_bitcos_last_error();
        count_reason(e && e[0] ? e : g_last_log);
        return 0;
    }
    ++g_accepted;
    if (decode) {
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx                       = 16;
        cp.n_batch                     = 4;
        cp.n_ubatch                    = 4;
        cp.n_seq_max                   = 1;
        cp.n_threads                   = 1;
        cp.n_threads_batch             = 1;
        cp.no_perf                     = true;
        struct llama_context * ctx     = llama_init_from_model(model, cp);
        if (ctx == NULL) {
            ++g_ctx_failed;
        } else {
            const int32_t nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
            llama_token   tok[3];
            for (int i = 0; i < 3; ++i) {
                tok[i] = nv > 0 ? (llama_token) rng_below((uint64_t) nv) : 0;
            }
            if (nv > 0 && llama_decode(ctx, llama_batch_get_one(tok, 3)) == 0) {
                ++g_decoded;
            } else {
                ++g_decode_failed;
            }
            llama_free(ctx);
        }
    }
    llama_model_free(model);
    return 1;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

int main(int argc, char ** argv) {
    uint64_t     first = 0, cases = 1000, progress = 0;
    double       seconds      = 0;
    int          decode_every = 4, save = 0, replay = 0;
    unsigned     timeout = 60;
    const char * paths[64];
    int          n_paths = 0;
    g_seed               = 1;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            g_seed = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "--first") && i + 1 < argc) {
            first = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "--cases") && i + 1 < argc) {
            cases = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
            seconds = strtod(argv[++i], NULL);
        } else if (!strcmp(argv[i], "--decode") && i + 1 < argc) {
            decode_every = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
            timeout = (unsigned) atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--progress") && i + 1 < argc) {
            progress = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            snprintf(g_out, sizeof g_out, "%s", argv[++i]);
        } else if (!strcmp(argv[i], "--no-extra-bufts")) {
            g_no_extra_bufts = 1;
        } else if (!strcmp(argv[i], "--save")) {
            save = 1;
        } else if (!strcmp(argv[i], "--replay")) {
            replay = 1;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        } else if (n_paths < 64) {
            paths[n_paths++] = argv[i];
        }
    }
    if (n_paths == 0) {
        fprintf(stderr,
                "usage: %s [--seed S] [--first I] [--cases N] [--seconds T] [--decode D] [--timeout T] "
                "[--out DIR] [--save] [--progress P] [--no-extra-bufts] seed.gguf...\n       %s --replay [--timeout T] "
                "file.gguf...\n",
                argv[0], argv[0]);
        return 2;
    }
#ifdef FUZZ_ASAN
    __sanitizer_set_death_callback(on_death);
#else
    (void) on_death;
    signal(SIGSEGV, on_signal);
    signal(SIGBUS, on_signal);
    signal(SIGFPE, on_signal);
    signal(SIGILL, on_signal);
    signal(SIGABRT, on_signal);
#endif
    signal(SIGALRM, on_alarm);
    mkdir(g_out, 0755); // where crash / hang / --save files go
    llama_log_set(log_cb, NULL);
    llama_backend_init();
    g_fd = memfd_create("bitcos-fuzz", 0);
    if (g_fd < 0) {
        perror("memfd_create");
        return 2;
    }
    snprintf(g_fd_path, sizeof g_fd_path, "/proc/self/fd/%d", g_fd);

    if (replay) {
        // each file as it is (through the memfd; the first shard of a split model from its path, so that it finds
        // the others), with every load mode; any crash saves it again as crash-replay.gguf
        for (int i = 0; i < n_paths; ++i) {
            seed_file s;
            memset(&s, 0, sizeof s);
            FILE * f = fopen(paths[i], "rb");
            if (!f) {
                perror(paths[i]);
                return 2;
            }
            fseek(f, 0, SEEK_END);
            g_len = (size_t) ftell(f);
            fseek(f, 0, SEEK_SET);
            free(g_buf);
            g_buf = malloc(g_len + 1);
            if (fread(g_buf, 1, g_len, f) != g_len) {
                fclose(f);
                return 2;
            }
            fclose(f);
            g_replay_name = paths[i];
            // through the memfd, as the fuzzing runs load (direct I/O then reads as it did there), except the
            // shards of a split model, which find each other by their names
            g_load_path   = strstr(paths[i], "-of-") ? paths[i] : NULL;
            int accepted  = 0;
            g_decoded     = 0;
            for (int m = 0; m < N_ALL_MODES; ++m) {
                alarm(timeout);
                accepted += load_case(1, k_all_modes[m]);
                alarm(0);
            }
            printf("replay %s: accepted %d of %d loads, %" PRIu64 " decoded; last reason: %s\n", paths[i], accepted,
                   N_ALL_MODES, g_decoded, ggml_bitcos_last_error());
        }
        printf("ok: replayed %d files\n", n_paths);
        return 0;
    }

    seed_file * seeds   = calloc((size_t) n_paths, sizeof(seed_file));
    size_t      max_len = 0;
    for (int i = 0; i < n_paths; ++i) {
        const int refused = !strncmp(paths[i], "refused=", 8);
        if (!load_seed(paths[i] + (refused ? 8 : 0), &seeds[i])) {
            fprintf(stderr, "%s: cannot parse the seed\n", paths[i]);
            return 2;
        }
        seeds[i].refused = refused;
        max_len          = seeds[i].len > max_len ? seeds[i].len : max_len;
    }
    g_cap = 2 * max_len + 65536; // a retyped tensor may grow (F32 -> F64, I64)
    g_buf = malloc(g_cap);
    g_tmp = malloc(g_cap);
    // every seed must load and decode as it is (else the fuzzer would only test refusals of broken files),
    // except the refused=PATH ones, which must be refused
    for (int i = 0; i < n_paths; ++i) {
        memcpy(g_buf, seeds[i].bytes, seeds[i].len);
        g_len   = seeds[i].len;
        g_index = (uint64_t) -1;
        for (int m = 0; m < N_ALL_MODES; ++m) {
            const int mode = k_all_modes[m];
            g_decoded      = 0;
            const int ok   = load_case(1, mode);
            if (seeds[i].refused ? ok : (!ok || g_decoded == 0)) {
                fprintf(stderr, "seed %s (load mode pick %d) %s: %s / %s\n", seeds[i].path, mode,
                        seeds[i].refused ? "is not refused" : "does not load and decode", ggml_bitcos_last_error(),
                        g_last_log);
                return 2;
            }
        }
    }
    g_accepted = g_refused = g_decoded = 0;
    g_n_reasons                        = 0;

    const double t0   = now_s();
    uint64_t     done = 0, accepted_seen = 0;
    for (g_index = first; g_index < first + cases; ++g_index) {
        make_case(seeds, n_paths);
        if (save) {
            save_case("case");
        }
        const int mode_pick = (int) rng_below(96);
        const int decode    = decode_every > 0 && (accepted_seen % (uint64_t) decode_every) == 0;
        alarm(timeout);
        if (load_case(decode, mode_pick)) {
            ++accepted_seen;
        }
        alarm(0);
        ++done;
        if (progress && done % progress == 0) {
            const double dt = now_s() - t0;
            printf("progress: %" PRIu64 " cases, %" PRIu64 " accepted, %" PRIu64 " decoded, %.0f s, %.1f cases/s\n",
                   done, g_accepted, g_decoded, dt, done / dt);
            fflush(stdout);
        }
        if (seconds > 0 && (done & 15) == 0 && now_s() - t0 > seconds) {
            ++g_index;
            break;
        }
    }
    const double dt = now_s() - t0;
    printf("refusal reasons (numbers as #, quoted names as *):\n");
    for (int printed = 0; printed < g_n_reasons; ++printed) { // by count, largest first
        int best = -1;
        for (int i = 0; i < g_n_reasons; ++i) {
            if (g_reasons[i].n && (best < 0 || g_reasons[i].n > g_reasons[best].n))
                best = i;
        }
        if (best < 0)
            break;
        printf("  %8" PRIu64 "  %s\n", g_reasons[best].n, g_reasons[best].text);
        g_reasons[best].n = 0;
    }
    printf("ok: %" PRIu64 " cases (seed %" PRIu64 ", cases %" PRIu64 "..%" PRIu64 ", %d seed files): %" PRIu64
           " accepted, %" PRIu64 " refused, %" PRIu64 " decoded (%" PRIu64 " context / %" PRIu64
           " decode failures), %.1f s, %.1f cases/s%s\n",
           done, g_seed, first, g_index, n_paths, g_accepted, g_refused, g_decoded, g_ctx_failed, g_decode_failed, dt,
           dt > 0 ? done / dt : 0.0,
#ifdef FUZZ_ASAN
           ", ASan"
#else
           ""
#endif
    );
    return 0;
}
