/* .npz load and save: the inflater on its own, round trips, zero-copy entries, zip64, hostile
   archives (every check of the zip and .npy layers), and the exchange with numpy
   (numpy.savez, numpy.savez_compressed, numpy.load; tests/model_files_numpy.py). */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include "scratch_dir.h"
#include "alloc_watch.h"

/* The streams below are Python's zlib output (raw deflate, wbits -15) for sample(n):
       w = b"abracadabra alakazam "
       bytes((w[(i * 7 + i // 13) % 21] if i % 200 < 190 else (i * i + i // 7) % 251)
             for i in range(n))
   at level 9 and 1, with Z_FIXED and Z_RLE, at level 0 (a stored block), and of b"". */
/* level9: block type 1 */
static const unsigned char deflate_level9[109] = {
    0x4b, 0x4c, 0x44, 0x02, 0x49, 0xd9, 0x49, 0x08, 0x94, 0x58, 0x54, 0x84, 0x40, 0x89, 0x89, 0x55,
    0x08, 0xa4, 0x90, 0x98, 0x8c, 0x40, 0xb9, 0x89, 0x89, 0x08, 0x94, 0x92, 0xa3, 0x80, 0x40, 0x89,
    0x28, 0x46, 0x23, 0x9b, 0x5d, 0x84, 0x6c, 0x76, 0x15, 0xb2, 0xd9, 0xc9, 0xc8, 0x66, 0x27, 0x22,
    0x9b, 0xad, 0x80, 0x6c, 0x36, 0xcc, 0xd4, 0x57, 0x85, 0x5f, 0x1b, 0x78, 0xa7, 0x6b, 0x6e, 0xf7,
    0xb9, 0x07, 0x33, 0x1b, 0xd9, 0xd1, 0x45, 0xc8, 0x8e, 0x4e, 0x44, 0x76, 0x74, 0x22, 0xb2, 0xa3,
    0x13, 0x91, 0x1d, 0x9d, 0x93, 0x38, 0x10, 0x01, 0x62, 0xe8, 0x9b, 0xd3, 0xb3, 0xee, 0xd2, 0x0f,
    0x55, 0xff, 0x1a, 0x0a, 0x03, 0x04, 0x0c, 0x90, 0x1d, 0x8d, 0x2d, 0x40, 0x00,
};
/* level1: block type 2 */
static const unsigned char deflate_level1[152] = {
    0xa5, 0x91, 0xb1, 0x0d, 0xc2, 0x30, 0x14, 0x44, 0x27, 0xc8, 0x0e, 0x6e, 0x52, 0xa4, 0x64, 0x0f,
    0xa2, 0xcc, 0x70, 0x0e, 0x9d, 0x9d, 0x22, 0xbf, 0x8c, 0x52, 0x64, 0x80, 0xf4, 0x6c, 0x41, 0xcb,
    0x1e, 0x0c, 0xc0, 0x00, 0xf4, 0x48, 0x94, 0xf9, 0xb2, 0x64, 0xdd, 0x21, 0xd1, 0x61, 0x9d, 0xe4,
    0xca, 0xef, 0x9e, 0xce, 0x80, 0x9c, 0x98, 0x22, 0x03, 0x33, 0x06, 0x58, 0x98, 0x80, 0x91, 0x99,
    0x00, 0xe6, 0x92, 0x03, 0x23, 0x60, 0x40, 0xc0, 0x29, 0x0a, 0xd8, 0x4c, 0xc0, 0x58, 0x04, 0x8c,
    0x51, 0xc0, 0x80, 0x80, 0x73, 0xa8, 0xe8, 0xd7, 0xfc, 0xde, 0x9a, 0x6b, 0x77, 0x3f, 0x3f, 0xab,
    0xb7, 0x4a, 0x9b, 0x4a, 0x43, 0xa5, 0xfd, 0x3d, 0xa5, 0xa1, 0xd2, 0xb9, 0xa2, 0xcb, 0x5d, 0xa9,
    0xc5, 0x9e, 0x6b, 0x78, 0x09, 0xd7, 0xf0, 0x12, 0xae, 0xe1, 0x25, 0x02, 0xc6, 0xc4, 0x35, 0xbc,
    0xe4, 0x1b, 0xad, 0xec, 0x53, 0x9f, 0xf7, 0xdb, 0xe3, 0xd3, 0x0e, 0xab, 0x97, 0xfc, 0x33, 0x48,
    0xa9, 0xd0, 0x5f, 0x4c, 0x3f, 0x06, 0x39, 0x00,
};
/* fixed: block type 1 */
static const unsigned char deflate_fixed[109] = {
    0x4b, 0x4c, 0x44, 0x02, 0x49, 0xd9, 0x49, 0x08, 0x94, 0x58, 0x54, 0x84, 0x40, 0x89, 0x89, 0x55,
    0x08, 0xa4, 0x90, 0x98, 0x8c, 0x40, 0xb9, 0x89, 0x89, 0x08, 0x94, 0x92, 0xa3, 0x80, 0x40, 0x89,
    0x28, 0x46, 0x23, 0x9b, 0x5d, 0x84, 0x6c, 0x76, 0x15, 0xb2, 0xd9, 0xc9, 0xc8, 0x66, 0x27, 0x22,
    0x9b, 0xad, 0x80, 0x6c, 0x36, 0xcc, 0xd4, 0x57, 0x85, 0x5f, 0x1b, 0x78, 0xa7, 0x6b, 0x6e, 0xf7,
    0xb9, 0x07, 0x33, 0x1b, 0xd9, 0xd1, 0x45, 0xc8, 0x8e, 0x4e, 0x44, 0x76, 0x74, 0x22, 0xb2, 0xa3,
    0x13, 0x91, 0x1d, 0x9d, 0x93, 0x38, 0x10, 0x01, 0x62, 0xe8, 0x9b, 0xd3, 0xb3, 0xee, 0xd2, 0x0f,
    0x55, 0xff, 0x1a, 0x0a, 0x03, 0x04, 0x0c, 0x90, 0x1d, 0x8d, 0x2d, 0x40, 0x00,
};
/* rle: block type 2 */
static const unsigned char deflate_rle[232] = {
    0x4d, 0xc1, 0xa1, 0x91, 0x50, 0x01, 0x0c, 0x45, 0xd1, 0x0a, 0xe8, 0x21, 0x06, 0xb1, 0x92, 0x3e,
    0x60, 0xa8, 0xe1, 0xbe, 0xc4, 0x25, 0x11, 0xfb, 0x64, 0x06, 0xb1, 0x05, 0xe0, 0xe9, 0x02, 0x4b,
    0x1f, 0x14, 0x40, 0x01, 0x78, 0x66, 0x90, 0x18, 0xc4, 0x3f, 0x87, 0x27, 0xb5, 0xd4, 0x52, 0x4b,
    0x2d, 0x61, 0x63, 0x63, 0x63, 0x03, 0x07, 0x07, 0x07, 0x47, 0x90, 0x41, 0x06, 0x19, 0x64, 0x2c,
    0x2c, 0x2c, 0x2c, 0x6c, 0x4d, 0xd4, 0x44, 0x4d, 0xd4, 0x44, 0xf1, 0x24, 0xb5, 0xd4, 0x52, 0x4b,
    0x2d, 0x63, 0x63, 0x63, 0x63, 0x1f, 0x1c, 0x1c, 0x1c, 0x5c, 0x06, 0x19, 0x64, 0x90, 0x41, 0xb2,
    0xb0, 0xb0, 0xb0, 0x10, 0x35, 0x51, 0x13, 0x35, 0x51, 0x13, 0xfc, 0xf7, 0xfb, 0xf5, 0xcf, 0xdb,
    0xbb, 0x6f, 0x2f, 0x3f, 0x3e, 0xfe, 0x52, 0x4b, 0x2d, 0xb5, 0x8d, 0x8d, 0x8d, 0x8d, 0x39, 0x38,
    0x38, 0x38, 0x20, 0x83, 0x0c, 0x32, 0xc8, 0x00, 0x16, 0x16, 0x16, 0x96, 0x89, 0x9a, 0xa8, 0x89,
    0x9a, 0xa8, 0xe1, 0x49, 0x2d, 0xb5, 0xd4, 0x52, 0x4b, 0xd8, 0xd8, 0xd8, 0xd8, 0xc0, 0xc1, 0xc1,
    0xc1, 0x11, 0x64, 0x90, 0x41, 0x06, 0x19, 0x0b, 0x0b, 0x0b, 0x0b, 0x5b, 0x13, 0x35, 0x51, 0x13,
    0x35, 0x51, 0x3c, 0x49, 0x2d, 0xb5, 0xd4, 0x52, 0xeb, 0xc3, 0xa7, 0xf9, 0xfa, 0xfd, 0xe7, 0xdf,
    0xf7, 0x9f, 0xbf, 0x60, 0x1f, 0x1c, 0x1c, 0x1c, 0x5c, 0x06, 0x19, 0x64, 0x90, 0x41, 0xb2, 0xb0,
    0xb0, 0xb0, 0x10, 0x35, 0x51, 0x13, 0x35, 0x51, 0x13, 0x3c, 0xb5, 0xd4, 0x52, 0x4b, 0x2d, 0xb5,
    0x8d, 0x8d, 0x8d, 0x8d, 0x39, 0x38, 0xfe, 0x01,
};
/* stored: block type 0 */
static const unsigned char deflate_stored[55] = {
    0x01, 0x32, 0x00, 0xcd, 0xff, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61,
    0x61, 0x61, 0x61, 0x61, 0x62, 0x6b, 0x62, 0x62, 0x6b, 0x62, 0x62, 0x6b, 0x62, 0x62,
    0x6b, 0x62, 0x62, 0x61, 0x72, 0x72, 0x61, 0x72, 0x72, 0x61, 0x72, 0x72, 0x61, 0x72,
    0x72, 0x61, 0x61, 0x61, 0x7a, 0x61, 0x61, 0x7a, 0x61, 0x61, 0x7a, 0x61, 0x61,
};
/* empty: block type 1 */
static const unsigned char deflate_empty[2] = {
    0x03,
    0x00,
};

/* numpy.save of sample(500) as u8[20,25], raw deflate level 1 (block type 1) */
static const uint32_t npy_deflated_crc = 0xf674d2f2u;
static const size_t npy_deflated_size = 628;
static const unsigned char npy_deflated[222] = {
    0x9b, 0xec, 0x17, 0xea, 0x1b, 0x10, 0xc9, 0xc8, 0x50, 0xc6, 0x50, 0xad, 0x9e, 0x92, 0x5a, 0x9c,
    0x5c, 0xa4, 0x6e, 0xa5, 0xa0, 0x5e, 0x53, 0x6a, 0xa8, 0xae, 0xa3, 0xa0, 0x9e, 0x96, 0x5f, 0x54,
    0x52, 0x94, 0x98, 0x17, 0x9f, 0x5f, 0x94, 0x92, 0x0a, 0x12, 0x77, 0x4b, 0xcc, 0x29, 0x4e, 0x05,
    0x8a, 0x17, 0x67, 0x24, 0x16, 0xa4, 0x02, 0xf9, 0x1a, 0x46, 0x06, 0x3a, 0x0a, 0x46, 0xa6, 0x9a,
    0x3a, 0x0a, 0xb5, 0x0a, 0x64, 0x02, 0xae, 0x44, 0x64, 0x90, 0x94, 0x9d, 0x84, 0x40, 0x89, 0x45,
    0x45, 0x08, 0x94, 0x98, 0x58, 0x85, 0x40, 0x0a, 0x89, 0xc9, 0x08, 0x94, 0x9b, 0x98, 0x88, 0x40,
    0x29, 0x39, 0x0a, 0x08, 0x84, 0x6c, 0x72, 0x22, 0x92, 0xc1, 0xd9, 0x49, 0x48, 0x06, 0x17, 0x15,
    0x21, 0x19, 0x9c, 0x58, 0x85, 0x64, 0x70, 0x62, 0x32, 0x92, 0xc1, 0x89, 0x89, 0x48, 0x06, 0xe7,
    0x28, 0xc0, 0x8c, 0x7e, 0x55, 0xf8, 0xb5, 0x81, 0x77, 0xba, 0xe6, 0x76, 0x9f, 0x7b, 0x30, 0x77,
    0x23, 0x3b, 0xba, 0x08, 0xd9, 0xd1, 0x89, 0xc8, 0x8e, 0x06, 0xea, 0x47, 0x38, 0x3a, 0x11, 0xd9,
    0xd1, 0x39, 0x30, 0xa3, 0xc1, 0x34, 0xcc, 0x54, 0xb0, 0xeb, 0x11, 0xa1, 0x01, 0xb4, 0x04, 0x11,
    0x1a, 0x40, 0x4b, 0x10, 0xa1, 0x01, 0xb4, 0x04, 0xc9, 0xe0, 0xc4, 0x5c, 0x44, 0x68, 0x00, 0x2d,
    0x41, 0x35, 0x1a, 0xd9, 0x6c, 0x43, 0xdf, 0x9c, 0x9e, 0x75, 0x97, 0x7e, 0xa8, 0xfa, 0xd7, 0x00,
    0x2d, 0xa1, 0x24, 0x40, 0xc0, 0x56, 0x20, 0xc7, 0x62, 0x36, 0x96, 0x00, 0x01, 0x00,
};

static const struct {
    const char *name;
    const unsigned char *data;
    size_t size;
    size_t out;
} deflate_streams[] = {
    {"level9", deflate_level9, sizeof deflate_level9, 500},
    {"level1", deflate_level1, sizeof deflate_level1, 500},
    {"fixed", deflate_fixed, sizeof deflate_fixed, 500},
    {"rle", deflate_rle, sizeof deflate_rle, 500},
    {"stored", deflate_stored, sizeof deflate_stored, 50},
    {"empty", deflate_empty, sizeof deflate_empty, 0},
};

static void sample(unsigned char *out, size_t n) {
    static const char w[] = "abracadabra alakazam ";
    for (size_t i = 0; i < n; ++i)
        out[i] = i % 200 < 190 ? (unsigned char)w[(i * 7 + i / 13) % 21]
                               : (unsigned char)((i * i + i / 7) % 251);
}

static tb_device cpu;
static tb__crc32_tables crc_table;

/* Inflates a stream into exactly `out_len` bytes; NULL on success, else the reason. */
static const char *inflate_into(const unsigned char *in, size_t in_len, unsigned char *out,
                                size_t out_len) {
    tb__inflater s;
    memset(&s, 0, sizeof s);
    s.in = in;
    s.in_len = in_len;
    s.out = out;
    s.out_len = out_len;
    return tb__inflate(&s);
}

static void test_inflate_streams(void **state) {
    (void)state;
    unsigned char want[600], got[600];
    for (size_t k = 0; k < sizeof deflate_streams / sizeof deflate_streams[0]; ++k) {
        size_t n = deflate_streams[k].out;
        sample(want, n);
        memset(got, 0xaa, sizeof got);
        const char *why = inflate_into(deflate_streams[k].data, deflate_streams[k].size, got, n);
        if (why != NULL) fail_msg("%s: %s", deflate_streams[k].name, why);
        assert_memory_equal(got, want, n);
        /* the size must be exact both ways */
        if (n > 0) {
            why = inflate_into(deflate_streams[k].data, deflate_streams[k].size, got, n - 1);
            assert_non_null(why);
            assert_non_null(strstr(why, "more data than the entry's size"));
        }
        why = inflate_into(deflate_streams[k].data, deflate_streams[k].size, got, n + 1);
        assert_non_null(why);
        assert_non_null(strstr(why, "less data than the entry's size"));
        /* every truncation fails */
        for (size_t len = 0; len < deflate_streams[k].size; ++len)
            if (inflate_into(deflate_streams[k].data, len, got, n) == NULL)
                fail_msg("%s cut to %u bytes inflated", deflate_streams[k].name, (unsigned)len);
    }
    unsigned char npy[700];
    assert_null(inflate_into(npy_deflated, sizeof npy_deflated, npy, npy_deflated_size));
    assert_int_equal(tb__crc32(&crc_table, 0, npy, npy_deflated_size), npy_deflated_crc);
}

static void test_inflate_rejects_bad_streams(void **state) {
    (void)state;
    unsigned char out[64];
    static const unsigned char reserved[] = {0x07};                           /* final, type 3 */
    static const unsigned char bad_stored[] = {0x01, 4, 0, 4, 0, 1, 2, 3, 4}; /* NLEN wrong */
    /* fixed Huffman: length 3 at distance 1 as the first symbol, then the end code */
    static const unsigned char far_back[] = {0x03, 0x02, 0x00};
    assert_non_null(strstr(inflate_into(reserved, 1, out, 4), "invalid block type"));
    assert_non_null(strstr(inflate_into(bad_stored, sizeof bad_stored, out, 4), "length check"));
    assert_non_null(
        strstr(inflate_into(far_back, sizeof far_back, out, 3), "before the start of the data"));
    /* random changes of valid streams: never a crash, never past the output */
    uint64_t rng = 99;
    unsigned char work[400], big[512];
    int ok = 0;
    for (int round = 0; round < 20000; ++round) {
        size_t k = (size_t)round % (sizeof deflate_streams / sizeof deflate_streams[0]);
        size_t n = deflate_streams[k].size;
        if (n == 0) continue;
        memcpy(work, deflate_streams[k].data, n);
        for (int j = 0; j < 1 + round % 3; ++j) {
            rng = rng * 6364136223846793005u + 1442695040888963407u;
            work[(rng >> 33) % n] ^= (unsigned char)(1u << ((rng >> 20) % 8));
        }
        if (inflate_into(work, n, big, deflate_streams[k].out) == NULL) ++ok;
    }
    printf("%d of 20000 damaged streams still inflated to the right size\n", ok);
}

/* ---- round trips ---- */

static tb_tensor *tensor_of(const void *data, tb_dtype dtype, int32_t rank, const int64_t *dims) {
    tb_shape shape;
    assert_int_equal(tb_shape_make(&shape, dtype, rank, dims), TB_OK);
    tb_tensor *t = tb_tensor_from_host(data, &shape, &cpu);
    assert_non_null(t);
    return t;
}

static void check_same_value(tb_tensor *a, tb_tensor *b) {
    assert_non_null(a);
    assert_non_null(b);
    tb_shape sa = tb_tensor_shape(a), sb = tb_tensor_shape(b);
    assert_true(tb_shape_equal(&sa, &sb));
    size_t n = 0;
    assert_int_equal(tb_shape_nbytes(&sa, &n), TB_OK);
    unsigned char *x = (unsigned char *)malloc(n + 1), *y = (unsigned char *)malloc(n + 1);
    assert_int_equal(tb_tensor_to_host(a, x, n), TB_OK);
    assert_int_equal(tb_tensor_to_host(b, y, n), TB_OK);
    assert_memory_equal(x, y, n);
    free(x);
    free(y);
}

static tb_tensor_set *sample_set(void) {
    tb_tensor_set *set = tb_tensor_set_new();
    const int64_t d23[2] = {2, 3}, d5[1] = {5}, d203[3] = {2, 0, 3}, d500[1] = {500};
    const float f[6] = {1.5f, -2, 0, 3.25f, 1e-30f, -7};
    const double g[5] = {1e300, -0.0, 2.5, 3, 4};
    const int32_t i[6] = {INT32_MIN, -1, 0, 1, 2, INT32_MAX};
    const int64_t l[5] = {INT64_MIN, -5, 0, 5, INT64_MAX};
    unsigned char u[500];
    const uint8_t b[6] = {1, 0, 0, 1, 1, 0};
    const float s = 42;
    sample(u, 500);
    tb_tensor *ts[8];
    ts[0] = tensor_of(f, TB_F32, 2, d23);
    ts[1] = tensor_of(g, TB_F64, 1, d5);
    ts[2] = tensor_of(i, TB_I32, 2, d23);
    ts[3] = tensor_of(l, TB_I64, 1, d5);
    ts[4] = tensor_of(u, TB_U8, 1, d500);
    ts[5] = tensor_of(b, TB_BOOL, 2, d23);
    ts[6] = tensor_of(&s, TB_F32, 0, NULL);
    ts[7] = tensor_of(NULL, TB_F32, 3, d203);
    const char *names[8] = {"f32", "f64", "i32", "i64", "u8", "bool", "scalar", "empty"};
    for (int k = 0; k < 8; ++k) {
        assert_int_equal(tb_tensor_set_add(set, names[k], ts[k]), TB_OK);
        tb_tensor_release(ts[k]);
    }
    tb_tensor *pending = tb_add_scalar(tb_tensor_set_get(set, "f64"), 1.0);
    assert_int_equal(tb_tensor_set_add(set, "dotted.name-1", pending), TB_OK);
    tb_tensor_release(pending);
    return set;
}

static void check_same_sets(const tb_tensor_set *a, const tb_tensor_set *b) {
    assert_int_equal(tb_tensor_set_count(a), tb_tensor_set_count(b));
    for (size_t i = 0; i < tb_tensor_set_count(a); ++i) {
        assert_string_equal(tb_tensor_set_name(a, i), tb_tensor_set_name(b, i));
        check_same_value(tb_tensor_set_tensor(a, i), tb_tensor_set_tensor(b, i));
    }
}

static void test_round_trip(void **state) {
    (void)state;
    tb_tensor_set *set = sample_set();
    assert_int_equal(tb_tensor_set_set_metadata(set, "ignored", "by .npz"), TB_OK);
    assert_int_equal(tb_npz_save(path_of("round.npz"), set), TB_OK);
    tb_tensor_set *back = tb_npz_load(path_of("round.npz"), &cpu);
    if (back == NULL) fail_msg("%s", tb_last_error());
    check_same_sets(set, back);
    assert_int_equal(tb_tensor_set_metadata_count(back), 0);
    /* each entry is a .npy that tb_npy_load reads the same */
    tb_tensor_set_free(back);
    /* zip64 records throughout */
    tb__npz_force_zip64 = true;
    tb_status st = tb_npz_save(path_of("round64.npz"), set);
    tb__npz_force_zip64 = false;
    assert_int_equal(st, TB_OK);
    back = tb_npz_load(path_of("round64.npz"), &cpu);
    if (back == NULL) fail_msg("%s", tb_last_error());
    check_same_sets(set, back);
    tb_tensor_set_free(back);
    /* an empty set is an empty zip */
    tb_tensor_set *none = tb_tensor_set_new();
    assert_int_equal(tb_npz_save(path_of("none.npz"), none), TB_OK);
    tb_tensor_set_free(none);
    none = tb_npz_load(path_of("none.npz"), &cpu);
    assert_non_null(none);
    assert_int_equal(tb_tensor_set_count(none), 0);
    tb_tensor_set_free(none);
    tb_tensor_set_free(set);
}

/* Stored u8 entries (any address is aligned for them) are used in place in the mapped file. */
static void test_stored_entries_in_place(void **state) {
    (void)state;
    tb_tensor_set *set = sample_set();
    assert_int_equal(tb_npz_save(path_of("inplace.npz"), set), TB_OK);
    tb_tensor_set_free(set);
    set = tb_npz_load(path_of("inplace.npz"), &cpu);
    assert_non_null(set);
    tb_tensor *u8 = tb_tensor_retain(tb_tensor_set_get(set, "u8"));
    tb_tensor_set_free(set);
    remove(path_of("inplace.npz"));
    const unsigned char *p = (const unsigned char *)tb__host_data(tb_tensor_data(u8));
    unsigned char want[500];
    sample(want, 500);
    assert_memory_equal(p, want, 500);
    /* the bytes are in the mapping, right after the .npy header, not in a copy */
    assert_memory_equal(p - 128, "\x93NUMPY", 6);
    tb_tensor_release(u8);
}

/* ---- hostile archives ---- */

typedef struct zentry {
    const char *name;       /* the directory's name */
    const char *local_name; /* the local header's (NULL: the same) */
    const unsigned char *data;
    size_t size;     /* bytes stored */
    uint64_t usize;  /* size claimed for the data uncompressed */
    uint16_t method; /* 0 stored, 8 deflate */
    uint16_t flags;
    int bad_crc;
} zentry;

static unsigned char *put16(unsigned char *p, unsigned v) {
    p[0] = (unsigned char)(v & 0xff);
    p[1] = (unsigned char)((v >> 8) & 0xff);
    return p + 2;
}
static unsigned char *put32(unsigned char *p, uint32_t v) {
    return put16(put16(p, v & 0xffff), v >> 16);
}

/* A zip of the entries; `dup_first` repeats the first directory record (two entries sharing
   one local header). Returns the size. */
static size_t build_zip(unsigned char *out, const zentry *e, int n, int dup_first) {
    unsigned char *p = out;
    uint32_t offsets[8], crcs[8];
    for (int i = 0; i < n; ++i) {
        const char *ln = e[i].local_name ? e[i].local_name : e[i].name;
        offsets[i] = (uint32_t)(p - out);
        crcs[i] =
            e[i].method == 0 ? tb__crc32(&crc_table, 0, e[i].data, e[i].size) : npy_deflated_crc;
        if (e[i].bad_crc) crcs[i] ^= 1;
        p = put32(p, 0x04034b50u);
        p = put16(p, 20);
        p = put16(p, e[i].flags);
        p = put16(p, e[i].method);
        p = put32(p, 0);
        p = put32(p, crcs[i]);
        p = put32(p, (uint32_t)e[i].size);
        p = put32(p, (uint32_t)e[i].usize);
        p = put16(p, (unsigned)strlen(ln));
        p = put16(p, 0);
        memcpy(p, ln, strlen(ln));
        p += strlen(ln);
        memcpy(p, e[i].data, e[i].size);
        p += e[i].size;
    }
    unsigned char *cd = p;
    for (int r = 0; r < n + (dup_first ? 1 : 0); ++r) {
        int i = r < n ? r : 0;
        p = put32(p, 0x02014b50u);
        p = put16(p, 20);
        p = put16(p, 20);
        p = put16(p, e[i].flags);
        p = put16(p, e[i].method);
        p = put32(p, 0);
        p = put32(p, crcs[i]);
        p = put32(p, (uint32_t)e[i].size);
        p = put32(p, (uint32_t)e[i].usize);
        p = put16(p, (unsigned)strlen(e[i].name));
        p = put16(p, 0);
        p = put16(p, 0);
        p = put16(p, 0);
        p = put16(p, 0);
        p = put32(p, 0);
        p = put32(p, offsets[i]);
        memcpy(p, e[i].name, strlen(e[i].name));
        p += strlen(e[i].name);
    }
    unsigned count = (unsigned)(n + (dup_first ? 1 : 0));
    uint32_t cd_size = (uint32_t)(p - cd), cd_offset = (uint32_t)(cd - out);
    p = put32(p, 0x06054b50u);
    p = put16(p, 0);
    p = put16(p, 0);
    p = put16(p, count);
    p = put16(p, count);
    p = put32(p, cd_size);
    p = put32(p, cd_offset);
    p = put16(p, 0);
    return (size_t)(p - out);
}

/* A .npy 1.0 of the header dict and data. */
static size_t make_npy(unsigned char *out, const char *dict, const void *data, size_t size) {
    size_t dict_len = strlen(dict), total = (10 + dict_len + 1 + 63) / 64 * 64;
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (unsigned char)((total - 10) & 0xff);
    out[9] = (unsigned char)((total - 10) >> 8);
    memset(out + 10, ' ', total - 10);
    memcpy(out + 10, dict, dict_len);
    out[total - 1] = '\n';
    memcpy(out + total, data, size);
    return total + size;
}

/* The most an archive of `size` bytes may make a load allocate at once: its size, or 1032
   times it when a header names a deflated entry (deflate's largest ratio: what a small valid
   archive may truly inflate to; a claim beyond it is refused before anything is allocated). */
static size_t load_limit(const unsigned char *bytes, size_t size) {
    size_t i;
    for (i = 0; i + 12 <= size; ++i) {
        bool local = memcmp(bytes + i, "PK\3\4", 4) == 0;
        bool central = memcmp(bytes + i, "PK\1\2", 4) == 0;
        size_t at = i + (local ? 8 : 10);
        if ((local || central) && bytes[at] == 8 && bytes[at + 1] == 0) return size * 1032;
    }
    return size;
}

static void expect_load_error(const unsigned char *bytes, size_t size, tb_status status,
                              const char *fragment) {
    write_bytes(path_of("bad.npz"), bytes, size);
    tb_clear_error();
    alloc_watch_reset();
    tb_tensor_set *set = tb_npz_load(path_of("bad.npz"), &cpu);
    alloc_watch_check(load_limit(bytes, size), fragment);
    if (set != NULL) {
        tb_tensor_set_free(set);
        fail_msg("loaded; expected an error with '%s'", fragment);
    }
    if (tb_last_status() != status || strstr(tb_last_error(), fragment) == NULL)
        fail_msg("error %d '%s'; expected %d with '%s'", (int)tb_last_status(), tb_last_error(),
                 (int)status, fragment);
    if (strncmp(tb_last_error(), "tb_npz_load: ", 13) != 0)
        fail_msg("the error '%s' does not name tb_npz_load", tb_last_error());
}

static void test_hostile_archives(void **state) {
    (void)state;
    static unsigned char zip[8192], npy[1024], npy2[1024];
    const float two[2] = {1, 2};
    size_t npy_len =
        make_npy(npy, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", two, 8);
    zentry e = {"a.npy", NULL, npy, npy_len, npy_len, 0, 0, 0};
    size_t n = build_zip(zip, &e, 1, 0);
    /* the valid one loads */
    write_bytes(path_of("ok.npz"), zip, n);
    tb_tensor_set *set = tb_npz_load(path_of("ok.npz"), &cpu);
    if (set == NULL) fail_msg("%s", tb_last_error());
    tb_tensor_set_free(set);

    expect_load_error(zip, 10, TB_ERR_FORMAT, "too short to be a zip file");
    expect_load_error(zip, n - 1, TB_ERR_FORMAT, "not a zip file (no end of central directory");
    size_t eocd = n - 22;
    unsigned char work[8192];
#define PATCHED(at, value, bits)                                                                   \
    do {                                                                                           \
        memcpy(work, zip, n);                                                                      \
        if ((bits) == 16)                                                                          \
            put16(work + (at), (unsigned)(value));                                                 \
        else                                                                                       \
            put32(work + (at), (uint32_t)(value));                                                 \
    } while (0)
    PATCHED(eocd + 16, 0x7fffffff, 32);
    expect_load_error(work, n, TB_ERR_FORMAT, "central directory");
    PATCHED(eocd + 12, 0x7fffffff, 32);
    expect_load_error(work, n, TB_ERR_FORMAT, "lies outside the file");
    memcpy(work, zip, n);
    put16(work + eocd + 8, 60000);
    put16(work + eocd + 10, 60000);
    expect_load_error(work, n, TB_ERR_FORMAT, "claims 60000 entries");
    PATCHED(eocd + 4, 1, 16);
    expect_load_error(work, n, TB_ERR_FORMAT, "split over several disks");
    size_t cd = n - 22 - 46 - 5;
    PATCHED(cd, 0x12345678, 32);
    expect_load_error(work, n, TB_ERR_FORMAT, "central directory record 0 is malformed");
    PATCHED(cd + 28, 400, 16); /* the name runs past the directory */
    expect_load_error(work, n, TB_ERR_FORMAT, "runs past the directory");
    PATCHED(cd + 42, 1000000, 32);
    expect_load_error(work, n, TB_ERR_FORMAT, "is not inside the file's data");
    PATCHED(cd + 20, 0xffffffffu, 32);
    expect_load_error(work, n, TB_ERR_FORMAT, "lacks the zip64 sizes");
    /* a zip64 locator pointing at nothing */
    memcpy(work, zip, eocd);
    memcpy(work + eocd, "PK\6\7\0\0\0\0\1\0\0\0\0\0\0\0\1\0\0\0", 20);
    memcpy(work + eocd + 20, zip + eocd, 22);
    put32(work + eocd + 20 + 16, (uint32_t)(eocd - 46 - 5));
    expect_load_error(work, n + 20, TB_ERR_FORMAT, "zip64 end of central directory record");

    zentry f = e;
    f.local_name = "b.npy";
    expect_load_error(zip, build_zip(zip, &f, 1, 0), TB_ERR_FORMAT,
                      "has another name in its local header");
    expect_load_error(zip, build_zip(zip, &e, 1, 1), TB_ERR_FORMAT, "overlaps the entry before");
    f = e;
    f.flags = 1;
    expect_load_error(zip, build_zip(zip, &f, 1, 0), TB_ERR_FORMAT, "is encrypted");
    f = e;
    f.method = 12;
    expect_load_error(zip, build_zip(zip, &f, 1, 0), TB_ERR_FORMAT, "compression method 12");
    f = e;
    f.usize = npy_len + 1;
    expect_load_error(zip, build_zip(zip, &f, 1, 0), TB_ERR_FORMAT, "a stored entry of");
    f = e;
    f.bad_crc = 1;
    expect_load_error(zip, build_zip(zip, &f, 1, 0), TB_ERR_FORMAT, "CRC-32 mismatch");
    f = e;
    f.name = "a.txt";
    expect_load_error(zip, build_zip(zip, &f, 1, 0), TB_ERR_FORMAT, "is not a .npy file named");
    f.name = ".npy";
    expect_load_error(zip, build_zip(zip, &f, 1, 0), TB_ERR_FORMAT, "is not a .npy file named");
    zentry two_entries[2] = {e, e};
    expect_load_error(zip, build_zip(zip, two_entries, 2, 0), TB_ERR_FORMAT,
                      "two entries are named 'a.npy'");
    /* deflate: a size deflate cannot reach is refused before anything is allocated */
    zentry d = {"d.npy", NULL, npy_deflated, 10, 4000000000u, 8, 0, 0};
    expect_load_error(zip, build_zip(zip, &d, 1, 0), TB_ERR_FORMAT,
                      "10 compressed bytes cannot inflate to the 4000000000 claimed");
    d.size = sizeof npy_deflated;
    d.usize = npy_deflated_size;
    n = build_zip(zip, &d, 1, 0);
    write_bytes(path_of("deflated.npz"), zip, n);
    set = tb_npz_load(path_of("deflated.npz"), &cpu);
    if (set == NULL) fail_msg("%s", tb_last_error());
    unsigned char want[500];
    sample(want, 500);
    tb_tensor *t = tb_tensor_set_get(set, "d");
    tb_shape shape = tb_tensor_shape(t);
    assert_int_equal(shape.dtype, TB_U8);
    assert_int_equal(shape.rank, 2);
    assert_int_equal(shape.dims[0], 20);
    unsigned char got[500];
    assert_int_equal(tb_tensor_to_host(t, got, 500), TB_OK);
    assert_memory_equal(got, want, 500);
    tb_tensor_set_free(set);
    d.usize = npy_deflated_size + 1;
    expect_load_error(zip, build_zip(zip, &d, 1, 0), TB_ERR_FORMAT,
                      "corrupt deflate data: less data");
    unsigned char garbage[64];
    memset(garbage, 0xff, sizeof garbage);
    d.data = garbage;
    d.size = sizeof garbage;
    d.usize = 1000;
    expect_load_error(zip, build_zip(zip, &d, 1, 0), TB_ERR_FORMAT, "corrupt deflate data");
    /* the .npy inside */
    e.size = e.usize = npy_len - 4;
    expect_load_error(zip, build_zip(zip, &e, 1, 0), TB_ERR_FORMAT,
                      "holds 4 bytes of data but its header describes 8");
    e.size = e.usize = 40;
    expect_load_error(zip, build_zip(zip, &e, 1, 0), TB_ERR_FORMAT, "runs past the entry");
    e.size = e.usize = 5;
    expect_load_error(zip, build_zip(zip, &e, 1, 0), TB_ERR_FORMAT, "is not a .npy file");
    size_t npy2_len =
        make_npy(npy2, "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", two, 8);
    zentry c = {"c.npy", NULL, npy2, npy2_len, npy2_len, 0, 0, 0};
    expect_load_error(zip, build_zip(zip, &c, 1, 0), TB_ERR_FORMAT, "unsupported dtype '<c8'");
    npy2_len = make_npy(npy2, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", two, 8);
    c.size = c.usize = npy2_len;
    expect_load_error(zip, build_zip(zip, &c, 1, 0), TB_ERR_FORMAT,
                      "Fortran-order arrays are not supported");
#undef PATCHED
}

/* Every truncation and random damage of a valid archive (stored and deflated entries): no
   crash or leak, no allocation beyond load_limit, and an error with a message whenever the
   load fails. */
static void test_damaged_archives_fail_cleanly(void **state) {
    (void)state;
    static unsigned char zip[8192], work[8192], npy[512];
    const int32_t v[5] = {1, 2, 3, 4, 5};
    size_t npy_len =
        make_npy(npy, "{'descr': '<i4', 'fortran_order': False, 'shape': (5,), }", v, sizeof v);
    zentry e[2] = {{"s.npy", NULL, npy, npy_len, npy_len, 0, 0, 0},
                   {"d.npy", NULL, npy_deflated, sizeof npy_deflated, 0, 8, 0, 0}};
    e[1].usize = npy_deflated_size;
    size_t n = build_zip(zip, e, 2, 0);
    for (size_t len = 0; len < n; ++len) {
        write_bytes(path_of("cut.npz"), zip, len);
        tb_clear_error();
        alloc_watch_reset();
        tb_tensor_set *set = tb_npz_load(path_of("cut.npz"), &cpu);
        alloc_watch_check(load_limit(zip, len), "a truncated archive");
        assert_null(set);
        assert_true(tb_last_error()[0] != '\0');
    }
    uint64_t rng = 7;
    int loaded = 0;
    for (int round = 0; round < 3000; ++round) {
        memcpy(work, zip, n);
        for (int k = 0; k < 1 + round % 3; ++k) {
            rng = rng * 6364136223846793005u + 1442695040888963407u;
            work[(rng >> 33) % n] = (unsigned char)(rng >> 25);
        }
        write_bytes(path_of("damaged.npz"), work, n);
        tb_clear_error();
        alloc_watch_reset();
        tb_tensor_set *set = tb_npz_load(path_of("damaged.npz"), &cpu);
        alloc_watch_check(load_limit(work, n), "a damaged archive");
        if (set != NULL) {
            ++loaded;
            tb_tensor_set_free(set);
        } else {
            assert_true(tb_last_error()[0] != '\0');
        }
    }
    printf("%d of 3000 damaged archives still loaded\n", loaded);
}

static void test_argument_and_io_errors(void **state) {
    (void)state;
    tb_clear_error();
    assert_null(tb_npz_load(NULL, &cpu));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_null(tb_npz_load(path_of("missing.npz"), &cpu));
    assert_int_equal(tb_last_status(), TB_ERR_NOT_FOUND);
    tb_tensor_set *set = tb_tensor_set_new();
    assert_int_equal(tb_npz_save(NULL, set), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_npz_save(path_of("x.npz"), NULL), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_npz_save(path_of("no/such/dir/x.npz"), set), TB_ERR_IO);
    tb_tensor_set_free(set);
}

/* A name that unzip would turn into a folder, or a path out of the folder it unpacks into, is
   refused before anything is written; what was at the path stays. */
static void test_save_refuses_path_names(void **state) {
    static const char *const bad[] = {"x/y", "../x", "..\\x", "a\\b", "/abs", "..", "."};
    float v = 1.0f;
    tb_shape s = tb_shape_of(TB_F32, 1, 1);
    size_t i;
    FILE *f;
    char text[8] = {0};
    (void)state;
    f = fopen(path_of("keep.npz"), "wb");
    assert_non_null(f);
    fputs("kept", f);
    fclose(f);
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tb_tensor_set *set = tb_tensor_set_new();
        tb_tensor *t = tb_tensor_from_host(&v, &s, &cpu);
        assert_int_equal(tb_tensor_set_add(set, bad[i], t), TB_OK);
        tb_tensor_release(t);
        tb_clear_error();
        assert_int_equal(tb_npz_save(path_of("keep.npz"), set), TB_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(tb_last_error(), "tb_npz_save"));
        tb_tensor_set_free(set);
    }
    f = fopen(path_of("keep.npz"), "rb");
    assert_non_null(f);
    assert_non_null(fgets(text, sizeof text, f));
    fclose(f);
    assert_string_equal(text, "kept");
}

/* ---- numpy ---- */

static const char *python(void) {
    return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

static int run_script(const char *command) {
    char cmd[1024];
    if (access("tests/model_files_numpy.py", R_OK) != 0) return 77;
    snprintf(cmd, sizeof cmd, "%s tests/model_files_numpy.py %s %s", python(), command, tmpdir);
    fflush(stdout);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
}

static void test_numpy_exchange(void **state) {
    (void)state;
    int rc = run_script("write-npz");
    if (rc == 77) {
        printf("numpy or tests/model_files_numpy.py not found: skipping\n");
        skip();
    }
    assert_int_equal(rc, 0);
    const char *archives[2] = {"py.npz", "py_compressed.npz"};
    for (int a = 0; a < 2; ++a) {
        tb_tensor_set *set = tb_npz_load(path_of(archives[a]), &cpu);
        if (set == NULL) fail_msg("%s", tb_last_error());
        FILE *names = fopen(path_of("py_names.txt"), "r");
        char line[512];
        size_t index = 0;
        while (fgets(line, sizeof line, names) != NULL) {
            line[strcspn(line, "\n")] = '\0';
            char npy[600];
            snprintf(npy, sizeof npy, "py_%s.npy", line);
            tb_tensor *want = tb_npy_load(path_of(npy), &cpu);
            if (want == NULL) fail_msg("%s", tb_last_error());
            assert_string_equal(tb_tensor_set_name(set, index), line);
            check_same_value(tb_tensor_set_get(set, line), want);
            tb_tensor_release(want);
            ++index;
        }
        fclose(names);
        assert_int_equal(index, tb_tensor_set_count(set));
        printf("read %u arrays from numpy's %s\n", (unsigned)index, archives[a]);
        if (a == 1) {
            /* we write them back, plainly and with zip64 records; numpy reads both */
            for (size_t i = 0; i < tb_tensor_set_count(set); ++i) {
                char npy[600];
                snprintf(npy, sizeof npy, "c_%s.npy", tb_tensor_set_name(set, i));
                assert_int_equal(tb_npy_save(path_of(npy), tb_tensor_set_tensor(set, i)), TB_OK);
            }
            assert_int_equal(tb_npz_save(path_of("c.npz"), set), TB_OK);
            tb__npz_force_zip64 = true;
            tb_status st = tb_npz_save(path_of("c_zip64.npz"), set);
            tb__npz_force_zip64 = false;
            assert_int_equal(st, TB_OK);
        }
        tb_tensor_set_free(set);
    }
    assert_int_equal(run_script("check-npz"), 0);
}

static int setup(void **state) {
    (void)state;
    if (scratch_make("tb_npz") != 0) return -1;
    if (alloc_watch_setup() != TB_OK) return -1;
    tb__crc32_init(&crc_table);
    return tb_device_make("cpu", 0, &cpu) == TB_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return scratch_remove();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inflate_streams),
        cmocka_unit_test(test_inflate_rejects_bad_streams),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_stored_entries_in_place),
        cmocka_unit_test(test_hostile_archives),
        cmocka_unit_test(test_damaged_archives_fail_cleanly),
        cmocka_unit_test(test_argument_and_io_errors),
        cmocka_unit_test(test_save_refuses_path_names),
        cmocka_unit_test(test_numpy_exchange),
    };
    return cmocka_run_group_tests_name("npz", tests, setup, teardown);
}
