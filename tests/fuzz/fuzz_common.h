/* Shared by the libFuzzer harnesses in tests/fuzz/ and by tests/test_fuzz_regress.c, which
   replays their corpora and regression inputs without libFuzzer. Each harness defines
   `static int fuzz_<target>_one(const uint8_t *data, size_t size)` and, unless
   TB_FUZZ_NO_ENTRY is defined, the LLVMFuzzerTestOneInput that calls it.

   The library is built without OpenCL and plugins: the harnesses stay on the cpu backend and no
   input makes the process load a driver or a shared object. A broken invariant calls
   fuzz_fail, which prints the reason and aborts (a crash to libFuzzer, a failed test to the
   replay). */
#ifndef TB_FUZZ_COMMON_H
#define TB_FUZZ_COMMON_H

#if !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TB_NO_OPENCL
#define TB_NO_OPENCL
#endif
#ifndef TB_NO_PLUGINS
#define TB_NO_PLUGINS
#endif
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#if defined(__GNUC__) || defined(__clang__)
#define FUZZ_UNUSED __attribute__((unused))
#else
#define FUZZ_UNUSED
#endif

static FUZZ_UNUSED void fuzz_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz: invariant broken: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (last error: %s)\n", tb_last_error());
    va_end(ap);
    abort();
}

/* Sets the library up once per process: cpu backend, a small computation cache. */
static FUZZ_UNUSED void fuzz_setup(void) {
    if (!tb_is_setup()) {
        tb_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.backend = "cpu";
        desc.cache_size = 64;
        desc.debug = -1;
        desc.check = -1;
        if (tb_setup(&desc) != TB_OK) fuzz_fail("tb_setup: %s", tb_last_error());
    }
    tb_clear_error();
}

/* A cursor over the input; reads past the end give zeros, so every input decodes. */
typedef struct fuzz_bytes {
    const uint8_t *data;
    size_t size, pos;
} fuzz_bytes;

static FUZZ_UNUSED bool fuzz_more(const fuzz_bytes *b) {
    return b->pos < b->size;
}

static FUZZ_UNUSED uint8_t fuzz_u8(fuzz_bytes *b) {
    return b->pos < b->size ? b->data[b->pos++] : 0;
}

static FUZZ_UNUSED uint64_t fuzz_u64(fuzz_bytes *b) {
    uint64_t v = 0;
    int i;
    for (i = 0; i < 8; i++)
        v |= (uint64_t)fuzz_u8(b) << (8 * i);
    return v;
}

/* uint64 bits as int64 without an implementation-defined conversion. */
static FUZZ_UNUSED int64_t fuzz_bits_i64(uint64_t v) {
    return v <= (uint64_t)INT64_MAX ? (int64_t)v : -(int64_t)(~v) - 1;
}

/* Values that sit on the edges of the arithmetic. */
static const int64_t fuzz_edges[] = {0,
                                     1,
                                     -1,
                                     2,
                                     INT64_MAX,
                                     INT64_MIN,
                                     INT64_MAX - 1,
                                     INT64_MIN + 1,
                                     INT64_C(1) << 62,
                                     -(INT64_C(1) << 62),
                                     INT64_C(1) << 61,
                                     INT64_C(1) << 60,
                                     INT64_C(1) << 32,
                                     INT64_C(1) << 31,
                                     INT64_C(3037000500),
                                     INT64_MAX / 2,
                                     INT64_MAX / 3,
                                     INT64_MAX / 4 + 1};

/* An int64 that is mostly small, sometimes an edge value, sometimes any 64 bits. */
static FUZZ_UNUSED int64_t fuzz_i64(fuzz_bytes *b) {
    uint8_t tag = fuzz_u8(b);
    if (tag < 160) return (int64_t)(tag % 16) - 3; /* -3..12 */
    if (tag < 224) return fuzz_edges[tag % (sizeof fuzz_edges / sizeof fuzz_edges[0])];
    return fuzz_bits_i64(fuzz_u64(b));
}

/* A dim: mostly 0..6, sometimes an edge value (negative ones included). */
static FUZZ_UNUSED int64_t fuzz_dim(fuzz_bytes *b) {
    uint8_t tag = fuzz_u8(b);
    if (tag < 224) return tag % 7;
    return fuzz_i64(b);
}

/* A double: small whole numbers, fractions, and the awkward values. */
static FUZZ_UNUSED double fuzz_double(fuzz_bytes *b) {
    static const double odd[] = {0.0, -0.0, 0.5, -1.5, 1e300, -1e300, 1e-300, 3e38, 1e19};
    uint8_t tag = fuzz_u8(b);
    if (tag < 128) return (double)((int)(tag % 32) - 8);
    if (tag < 192) return (double)((int)(tag % 64) - 20) * 0.25;
    if (tag < 240) return odd[tag % (sizeof odd / sizeof odd[0])];
    {
        uint64_t bits = fuzz_u64(b);
        double d;
        memcpy(&d, &bits, sizeof d);
        return d;
    }
}

#endif /* TB_FUZZ_COMMON_H */
