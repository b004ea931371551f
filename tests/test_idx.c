/* IDX files (MNIST's format), plain and gzip: every type code round trip, big-endian decoding,
   every error of the header, the data and the gzip layer (truncation at every offset, damaged
   CRC and ISIZE, trailing data, header flags), and Fashion-MNIST's test set when the Debian
   package dataset-fashion-mnist is installed. gzip files come from the system's gzip (those
   parts are skipped with a message without it) and from gzip members built here with stored
   deflate blocks (for the header flags gzip itself does not write). */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include "scratch_dir.h"

#define FASHION_MNIST "/usr/share/datasets/fashion-mnist"

static tb_device cpu;
static tb__crc32_tables crc_table;
static int gzip_found = -1;

static size_t read_bytes(const char *path, unsigned char *out, size_t cap) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(out, 1, cap, f);
    assert_true(n < cap); /* the whole file */
    fclose(f);
    return n;
}

static bool have_gzip(void) {
    if (gzip_found < 0) {
        gzip_found = system("command -v gzip >/dev/null 2>&1") == 0;
        if (!gzip_found) printf("gzip not found: the parts that compress with it are skipped\n");
    }
    return gzip_found == 1;
}

/* gzip -c -n of `from` into `to`. */
static void gzip_file(const char *from, const char *to) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "gzip -c -n '%s' > '%s'", from, to);
    assert_int_equal(system(cmd), 0);
}

static unsigned char *put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
    return p + 4;
}

static unsigned char *put_le32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
    return p + 4;
}

/* An IDX file: magic 0x0000TTNN, the dims, then `data_len` bytes of data (already big-endian). */
static size_t make_idx(unsigned char *out, uint8_t code, int rank, const uint32_t *dims,
                       const void *data, size_t data_len) {
    unsigned char *p = out;
    *p++ = 0;
    *p++ = 0;
    *p++ = code;
    *p++ = (unsigned char)rank;
    for (int i = 0; i < rank; ++i)
        p = put_be32(p, dims[i]);
    if (data_len > 0) memcpy(p, data, data_len);
    return (size_t)(p - out) + data_len;
}

/* Optional parts of a hand-built gzip member. */
typedef struct gz_opts {
    uint8_t method; /* 0: deflate (8) */
    uint8_t flags;  /* extra flag bits (e.g. reserved ones) */
    const char *extra, *name, *comment;
    bool hcrc;
    bool bad_hcrc;
} gz_opts;

/* A gzip member of `data` with stored deflate blocks of at most 100 bytes (several blocks). */
static size_t make_gzip(unsigned char *out, const unsigned char *data, size_t n, const gz_opts *o) {
    unsigned char *p = out;
    uint8_t flags = o->flags;
    if (o->extra) flags |= 4;
    if (o->name) flags |= 8;
    if (o->comment) flags |= 16;
    if (o->hcrc) flags |= 2;
    *p++ = 0x1f;
    *p++ = 0x8b;
    *p++ = o->method ? o->method : 8;
    *p++ = flags;
    p = put_le32(p, 0); /* mtime */
    *p++ = 0;           /* xfl */
    *p++ = 3;           /* os: unix */
    if (o->extra) {
        size_t len = strlen(o->extra);
        *p++ = (unsigned char)len;
        *p++ = (unsigned char)(len >> 8);
        memcpy(p, o->extra, len);
        p += len;
    }
    if (o->name) {
        memcpy(p, o->name, strlen(o->name) + 1);
        p += strlen(o->name) + 1;
    }
    if (o->comment) {
        memcpy(p, o->comment, strlen(o->comment) + 1);
        p += strlen(o->comment) + 1;
    }
    if (o->hcrc) {
        uint32_t c = tb__crc32(&crc_table, 0, out, (size_t)(p - out)) ^ (o->bad_hcrc ? 1u : 0u);
        *p++ = (unsigned char)c;
        *p++ = (unsigned char)(c >> 8);
    }
    size_t at = 0;
    do {
        size_t len = n - at < 100 ? n - at : 100;
        *p++ = at + len == n ? 1 : 0; /* BFINAL, BTYPE 00 */
        *p++ = (unsigned char)len;
        *p++ = (unsigned char)(len >> 8);
        *p++ = (unsigned char)~len;
        *p++ = (unsigned char)(~len >> 8);
        if (len > 0) memcpy(p, data + at, len);
        p += len;
        at += len;
    } while (at < n);
    p = put_le32(p, tb__crc32(&crc_table, 0, data, n));
    p = put_le32(p, (uint32_t)n);
    return (size_t)(p - out);
}

/* Loads `path` expecting failure with `status`, a message naming the path and holding `what`. */
static void expect_error(const char *path, tb_status status, const char *what) {
    tb_clear_error();
    tb_tensor *t = tb_idx_load(path, &cpu);
    if (t != NULL) {
        tb_tensor_release(t);
        fail_msg("%s loaded; expected an error with '%s'", path, what);
    }
    const char *message = tb_last_error();
    if (tb_last_status() != status || strstr(message, path) == NULL ||
        strstr(message, what) == NULL)
        fail_msg("%s: expected %s with '%s', got %s: %s", path, tb_status_string(status), what,
                 tb_status_string(tb_last_status()), message);
}

static void expect_bytes_error(const unsigned char *bytes, size_t n, tb_status status,
                               const char *what) {
    write_bytes(path_of("bad.idx"), bytes, n);
    expect_error(path_of("bad.idx"), status, what);
}

/* Loads `path` and checks dtype, dims and the values' bytes (host order). */
static void expect_tensor(const char *path, tb_dtype dtype, int rank, const uint32_t *dims,
                          const void *values, size_t nbytes) {
    tb_clear_error();
    tb_tensor *t = tb_idx_load(path, &cpu);
    if (t == NULL) fail_msg("%s: %s", path, tb_last_error());
    tb_shape s = tb_tensor_shape(t);
    assert_int_equal(s.dtype, dtype);
    assert_int_equal(s.rank, rank);
    for (int i = 0; i < rank; ++i)
        assert_int_equal(s.dims[i], dims[i]);
    size_t n = 0;
    assert_int_equal(tb_shape_nbytes(&s, &n), TB_OK);
    assert_int_equal(n, nbytes);
    unsigned char *got = (unsigned char *)malloc(n + 1);
    assert_int_equal(tb_tensor_to_host(t, got, n), TB_OK);
    assert_memory_equal(got, values, n);
    free(got);
    tb_tensor_release(t);
}

/* ---- round trips ---- */

/* Values of each type, stored big-endian, and what they load as. */
typedef struct type_case {
    uint8_t code;
    const char *name;
    tb_dtype dtype;
    size_t width; /* in the file */
} type_case;

static const type_case types[] = {
    {0x08, "u8", TB_U8, 1},   {0x09, "i8", TB_I32, 1},  {0x0b, "i16", TB_I32, 2},
    {0x0c, "i32", TB_I32, 4}, {0x0d, "f32", TB_F32, 4}, {0x0e, "f64", TB_F64, 8},
};

/* Element i of a type (as the loaded dtype's value) and its big-endian bytes in the file. */
static void element(const type_case *t, size_t i, unsigned char *file, unsigned char *host) {
    uint64_t bits = 0;
    if (t->code == 0x08) {
        uint8_t v = (uint8_t)(i * 37 + 5);
        bits = v;
        memcpy(host, &v, 1);
    } else if (t->code == 0x09) {
        int32_t v = (int32_t)((i * 37 + 5) % 256) - 128; /* -128..127 */
        bits = (uint64_t)((v + 256) % 256);
        memcpy(host, &v, 4);
    } else if (t->code == 0x0b) {
        int32_t v = i == 0 ? -32768 : i == 1 ? 32767 : (int32_t)((i * 7919) % 65536) - 32768;
        bits = (uint64_t)((v + 65536) % 65536);
        memcpy(host, &v, 4);
    } else if (t->code == 0x0c) {
        int32_t v = i == 0 ? INT32_MIN : i == 1 ? INT32_MAX : (int32_t)(i * 2654435761u);
        memcpy(&bits, &v, 4);
        bits &= 0xffffffffu;
        memcpy(host, &v, 4);
    } else if (t->code == 0x0d) {
        float v = i == 0 ? -0.0f : (float)((double)i * 1.25 - 7.5) * (i % 3 ? 1e-3f : 1e20f);
        uint32_t b;
        memcpy(&b, &v, 4);
        bits = b;
        memcpy(host, &v, 4);
    } else {
        double v = i == 0 ? 1e-310 : ((double)i - 3.3) * (i % 2 ? 1e300 : 1e-7);
        memcpy(&bits, &v, 8);
        memcpy(host, &v, 8);
    }
    for (size_t k = 0; k < t->width; ++k)
        file[k] = (unsigned char)(bits >> (8 * (t->width - 1 - k)));
}

static void test_each_type_round_trip(void **state) {
    (void)state;
    static const uint32_t shapes[][5] = {
        {3, 2, 3, 4}, {1, 7}, {3, 5, 1, 3}, {2, 0, 5}, {4, 1, 1, 1, 1}};
    static unsigned char data[4096], host[4096], file[8192];
    bool gz = have_gzip();
    for (size_t k = 0; k < sizeof types / sizeof types[0]; ++k) {
        const type_case *t = &types[k];
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
            int rank = (int)shapes[s][0];
            const uint32_t *dims = shapes[s] + 1;
            size_t count = 1, size = tb_dtype_size(t->dtype);
            for (int i = 0; i < rank; ++i)
                count *= dims[i];
            for (size_t i = 0; i < count; ++i)
                element(t, i, data + i * t->width, host + i * size);
            size_t n = make_idx(file, t->code, rank, dims, data, count * t->width);
            char name[64];
            snprintf(name, sizeof name, "%s_%u.idx", t->name, (unsigned)s);
            write_bytes(path_of(name), file, n);
            expect_tensor(path_of(name), t->dtype, rank, dims, host, count * size);
            /* gzip by hand (stored blocks) and by the system's gzip; the name does not matter */
            static unsigned char gzipped[16384];
            gz_opts none;
            memset(&none, 0, sizeof none);
            write_bytes(path_of("stored.bin"), gzipped, make_gzip(gzipped, file, n, &none));
            expect_tensor(path_of("stored.bin"), t->dtype, rank, dims, host, count * size);
            if (gz) {
                char gz_name[80];
                snprintf(gz_name, sizeof gz_name, "%s.gz", name);
                gzip_file(path_of(name), path_of(gz_name));
                expect_tensor(path_of(gz_name), t->dtype, rank, dims, host, count * size);
            }
        }
    }
    /* a plain file named .gz is read as plain */
    const uint32_t d3[1] = {3};
    const unsigned char three[3] = {7, 8, 9};
    size_t n = make_idx(file, 0x08, 1, d3, three, 3);
    write_bytes(path_of("plain.gz"), file, n);
    expect_tensor(path_of("plain.gz"), TB_U8, 1, d3, three, 3);
    /* a larger file of every type through the system's gzip: dynamic Huffman blocks */
    if (gz) {
        static unsigned char big_file[1 << 20], big_host[1 << 20];
        const uint32_t dims[2] = {250, 200};
        for (size_t k = 0; k < sizeof types / sizeof types[0]; ++k) {
            const type_case *t = &types[k];
            size_t size = tb_dtype_size(t->dtype);
            unsigned char *p = big_file;
            p[0] = 0;
            p[1] = 0;
            p[2] = t->code;
            p[3] = 2;
            put_be32(p + 4, dims[0]);
            put_be32(p + 8, dims[1]);
            for (size_t i = 0; i < 50000; ++i)
                element(t, i % 977, p + 12 + i * t->width, big_host + i * size);
            write_bytes(path_of("big.idx"), big_file, 12 + 50000 * t->width);
            gzip_file(path_of("big.idx"), path_of("big.idx.gz"));
            expect_tensor(path_of("big.idx.gz"), t->dtype, 2, dims, big_host, 50000 * size);
        }
    }
}

/* The byte order of every multi-byte type, from bytes written by hand. */
static void test_big_endian_decoding(void **state) {
    (void)state;
    static unsigned char file[256];
    const uint32_t d2[1] = {2}, d3[1] = {3};
    const unsigned char i8[3] = {0x80, 0xff, 0x7f};
    const int32_t i8_want[3] = {-128, -1, 127};
    const unsigned char i16[6] = {0x01, 0x02, 0xff, 0xfe, 0x80, 0x00};
    const int32_t i16_want[3] = {258, -2, -32768};
    const unsigned char i32[8] = {0x01, 0x02, 0x03, 0x04, 0xff, 0xff, 0xff, 0xfe};
    const int32_t i32_want[2] = {16909060, -2};
    const unsigned char f32[8] = {0x3f, 0x80, 0x00, 0x00, 0xc0, 0x49, 0x0f, 0xdb};
    const float f32_want[2] = {1.0f, -3.14159274f};
    const unsigned char f64[16] = {0x40, 0x09, 0x21, 0xfb, 0x54, 0x44, 0x2d, 0x18,
                                   0xbf, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    const double f64_want[2] = {3.141592653589793, -1.0};
    write_bytes(path_of("be.idx"), file, make_idx(file, 0x09, 1, d3, i8, 3));
    expect_tensor(path_of("be.idx"), TB_I32, 1, d3, i8_want, sizeof i8_want);
    write_bytes(path_of("be.idx"), file, make_idx(file, 0x0b, 1, d3, i16, 6));
    expect_tensor(path_of("be.idx"), TB_I32, 1, d3, i16_want, sizeof i16_want);
    write_bytes(path_of("be.idx"), file, make_idx(file, 0x0c, 1, d2, i32, 8));
    expect_tensor(path_of("be.idx"), TB_I32, 1, d2, i32_want, sizeof i32_want);
    write_bytes(path_of("be.idx"), file, make_idx(file, 0x0d, 1, d2, f32, 8));
    expect_tensor(path_of("be.idx"), TB_F32, 1, d2, f32_want, sizeof f32_want);
    write_bytes(path_of("be.idx"), file, make_idx(file, 0x0e, 1, d2, f64, 16));
    expect_tensor(path_of("be.idx"), TB_F64, 1, d2, f64_want, sizeof f64_want);
    /* the dims too are big-endian: 0x00000102 = 258 */
    static unsigned char bytes[258];
    const uint32_t d258[1] = {258};
    for (int i = 0; i < 258; ++i)
        bytes[i] = (unsigned char)i;
    size_t n = make_idx(file, 0x08, 1, d258, NULL, 0);
    assert_memory_equal(file + 4, "\x00\x00\x01\x02", 4);
    static unsigned char whole[600];
    memcpy(whole, file, n);
    memcpy(whole + n, bytes, 258);
    write_bytes(path_of("be.idx"), whole, n + 258);
    expect_tensor(path_of("be.idx"), TB_U8, 1, d258, bytes, 258);
}

/* ---- errors ---- */

static void test_argument_and_io_errors(void **state) {
    (void)state;
    tb_clear_error();
    assert_null(tb_idx_load(NULL, &cpu));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "path is NULL"));
    expect_error(path_of("missing.idx"), TB_ERR_NOT_FOUND, "cannot open");
    expect_error(tmpdir, TB_ERR_IO, "not a regular file");
    /* an unknown device: nothing is read, the message names the path */
    const uint32_t d1[1] = {1};
    unsigned char file[16];
    write_bytes(path_of("one.idx"), file, make_idx(file, 0x08, 1, d1, "x", 1));
    tb_device nowhere;
    memset(&nowhere, 0, sizeof nowhere);
    strcpy(nowhere.backend, "no_such_backend");
    tb_clear_error();
    assert_null(tb_idx_load(path_of("one.idx"), &nowhere));
    assert_int_equal(tb_last_status(), TB_ERR_NOT_FOUND);
    assert_non_null(strstr(tb_last_error(), path_of("one.idx")));
    assert_non_null(strstr(tb_last_error(), "no_such_backend"));
    /* NULL device: the current one */
    tb_tensor *t = tb_idx_load(path_of("one.idx"), NULL);
    assert_non_null(t);
    tb_tensor_release(t);
}

static void test_bad_headers_and_sizes(void **state) {
    (void)state;
    static unsigned char file[2048];
    const uint32_t d23[2] = {2, 3};
    const unsigned char six[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    size_t n;
    expect_bytes_error(file, 0, TB_ERR_FORMAT, "an IDX header needs at least 4");
    expect_bytes_error((const unsigned char *)"\0\0\x08", 3, TB_ERR_FORMAT,
                       "an IDX header needs at least 4");
    n = make_idx(file, 0x08, 2, d23, six, 6);
    file[1] = 1;
    expect_bytes_error(file, n, TB_ERR_FORMAT, "is not an IDX file");
    file[1] = 0;
    file[0] = 0x89; /* PNG, say */
    expect_bytes_error(file, n, TB_ERR_FORMAT, "magic 0x89000802");
    file[0] = 0;
    const uint8_t unknown[] = {0x00, 0x01, 0x07, 0x0a, 0x0f, 0x10, 0xff};
    for (size_t k = 0; k < sizeof unknown; ++k) {
        file[2] = unknown[k];
        expect_bytes_error(file, n, TB_ERR_FORMAT, "unknown IDX type code");
    }
    file[2] = 0x08;
    /* rank 0, and more dims than the library has */
    n = make_idx(file, 0x08, 0, NULL, six, 1);
    expect_bytes_error(file, n, TB_ERR_FORMAT, "rank 0");
    uint32_t ones[255];
    for (int i = 0; i < 255; ++i)
        ones[i] = 1;
    n = make_idx(file, 0x08, 9, ones, six, 1);
    expect_bytes_error(file, n, TB_ERR_UNSUPPORTED, "9 dimensions; at most 8");
    n = make_idx(file, 0x08, 255, ones, six, 1);
    expect_bytes_error(file, n, TB_ERR_UNSUPPORTED, "255 dimensions");
    n = make_idx(file, 0x08, 8, ones, six, 1);
    expect_bytes_error(file, 4 + 4 * 7, TB_ERR_FORMAT, "truncated header: 8 dimensions need 36");
    /* dims whose product overflows, for each width */
    const uint32_t huge[8] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
                              0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; ++k) {
        n = make_idx(file, types[k].code, 8, huge, six, 8);
        expect_bytes_error(file, n, TB_ERR_FORMAT, "are too large");
        /* large, but within int64: the file is too short for them */
        const uint32_t large[2] = {0xffffffffu, 0xffffu};
        n = make_idx(file, types[k].code, 2, large, six, 8);
        expect_bytes_error(file, n, TB_ERR_FORMAT, "truncated: the dims");
    }
    /* i8 widens to i32: about 2^62 elements fit in int64, their 2^64 bytes do not */
    const uint32_t wide[2] = {0x40000000u, 0xffffffffu};
    n = make_idx(file, 0x09, 2, wide, six, 8);
    expect_bytes_error(file, n, TB_ERR_FORMAT, "are too large");
    /* the data shorter or longer than the dims */
    n = make_idx(file, 0x08, 2, d23, six, 5);
    expect_bytes_error(file, n, TB_ERR_FORMAT,
                       "the dims u8[2,3] need 6 bytes of data, the file holds 5");
    n = make_idx(file, 0x08, 2, d23, six, 7);
    expect_bytes_error(file, n, TB_ERR_FORMAT, "1 bytes of trailing data");
    n = make_idx(file, 0x0b, 2, d23, six, 8);
    expect_bytes_error(file, n, TB_ERR_FORMAT, "the dims i16[2,3] need 12 bytes");
    /* every truncation of a valid file of each type */
    static unsigned char data[64];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; ++k) {
        for (size_t i = 0; i < 6; ++i)
            element(&types[k], i, data + i * types[k].width, file + 256);
        n = make_idx(file, types[k].code, 2, d23, data, 6 * types[k].width);
        for (size_t len = 0; len < n; ++len)
            expect_bytes_error(file, len, TB_ERR_FORMAT, "truncated");
    }
}

/* A small IDX file whose gzip forms the errors below: u8[40,25] of a repeating pattern. */
static size_t sample_idx(unsigned char *file) {
    static unsigned char data[1000];
    const uint32_t dims[2] = {40, 25};
    for (size_t i = 0; i < sizeof data; ++i)
        data[i] = i % 200 < 150 ? (unsigned char)"abracadabra alakazam "[(i * 7) % 21]
                                : (unsigned char)((i * i + 3) % 251);
    return make_idx(file, 0x08, 2, dims, data, sizeof data);
}

static void test_gzip_header_errors(void **state) {
    (void)state;
    static unsigned char idx[2048], gz[4096];
    size_t idx_len = sample_idx(idx), n;
    const uint32_t dims[2] = {40, 25};
    gz_opts o;
    /* every optional header field, the header CRC included, is read */
    memset(&o, 0, sizeof o);
    o.extra = "xyzw";
    o.name = "train-images-idx3-ubyte";
    o.comment = "a comment";
    o.hcrc = true;
    n = make_gzip(gz, idx, idx_len, &o);
    write_bytes(path_of("flags.gz"), gz, n);
    expect_tensor(path_of("flags.gz"), TB_U8, 2, dims, idx + 12, 1000);
    /* every truncation of it fails */
    for (size_t len = 0; len < n; ++len)
        expect_bytes_error(gz, len, TB_ERR_FORMAT, "");
    expect_bytes_error(gz, 2, TB_ERR_FORMAT, "truncated gzip header");
    expect_bytes_error(gz, 9, TB_ERR_FORMAT, "truncated gzip header");
    expect_bytes_error(gz, 11, TB_ERR_FORMAT, "truncated gzip header (in the extra field)");
    expect_bytes_error(gz, 15, TB_ERR_FORMAT, "the extra field of 4 bytes runs past the end");
    expect_bytes_error(gz, 20, TB_ERR_FORMAT, "the file name has no terminating NUL");
    expect_bytes_error(gz, 16 + 24 + 5, TB_ERR_FORMAT, "the comment has no terminating NUL");
    expect_bytes_error(gz, 16 + 24 + 10 + 1, TB_ERR_FORMAT,
                       "truncated gzip header (in the header CRC)");
    expect_bytes_error(gz, n - 8, TB_ERR_FORMAT,
                       "the gzip trailer (CRC-32 and size, 8 bytes) has only 0");
    expect_bytes_error(gz, n - 3, TB_ERR_FORMAT, "has only 5");
    o.bad_hcrc = true;
    n = make_gzip(gz, idx, idx_len, &o);
    expect_bytes_error(gz, n, TB_ERR_FORMAT, "bad gzip header: its CRC-16");
    memset(&o, 0, sizeof o);
    o.method = 7;
    n = make_gzip(gz, idx, idx_len, &o);
    expect_bytes_error(gz, n, TB_ERR_FORMAT, "compression method 7 is not deflate");
    for (uint8_t bit = 0x20; bit != 0; bit = (uint8_t)(bit << 1)) {
        memset(&o, 0, sizeof o);
        o.flags = bit;
        n = make_gzip(gz, idx, idx_len, &o);
        expect_bytes_error(gz, n, TB_ERR_FORMAT, "reserved flag bits are set");
    }
    /* a header alone, and a deflate stream with a reserved block type */
    memset(&o, 0, sizeof o);
    n = make_gzip(gz, idx, idx_len, &o);
    expect_bytes_error(gz, 10, TB_ERR_FORMAT, "corrupt or truncated gzip data");
    gz[10] = 0x07;
    expect_bytes_error(gz, n, TB_ERR_FORMAT,
                       "corrupt or truncated gzip data: an invalid block type");
}

/* Damage to the data, the CRC, the ISIZE, and what follows the member: with gzip files from
   stored blocks and, where it is installed, from the system's gzip. */
static void check_gzip_damage(const unsigned char *gz, size_t n, const char *label) {
    static unsigned char work[1 << 16];
    assert_true(n + 64 <= sizeof work);
    printf("%s: %u bytes\n", label, (unsigned)n);
    /* every truncation */
    for (size_t len = 0; len < n; ++len)
        expect_bytes_error(gz, len, TB_ERR_FORMAT, "");
    /* each bit of each CRC byte, and each ISIZE byte */
    memcpy(work, gz, n);
    for (size_t k = n - 8; k < n - 4; ++k) {
        for (int bit = 0; bit < 8; ++bit) {
            work[k] ^= (unsigned char)(1u << bit);
            expect_bytes_error(work, n, TB_ERR_FORMAT, "CRC-32 mismatch");
            work[k] ^= (unsigned char)(1u << bit);
        }
    }
    for (size_t k = n - 4; k < n; ++k) {
        work[k] ^= 0x10;
        expect_bytes_error(work, n, TB_ERR_FORMAT, "the gzip trailer's ISIZE is");
        work[k] ^= 0x10;
    }
    /* trailing garbage, and a second member */
    memcpy(work + n, "garbage", 7);
    expect_bytes_error(work, n + 7, TB_ERR_FORMAT,
                       "7 bytes of trailing data after the gzip member");
    expect_bytes_error(work, n + 1, TB_ERR_FORMAT, "1 bytes of trailing data");
    memcpy(work + n, gz, n);
    expect_bytes_error(work, 2 * n, TB_ERR_FORMAT, "concatenated gzip files are not supported");
    /* random damage: never a crash or a leak; an error with a message whenever it fails */
    uint64_t rng = 11;
    int loaded = 0;
    for (int round = 0; round < 1500; ++round) {
        memcpy(work, gz, n);
        for (int k = 0; k < 1 + round % 3; ++k) {
            rng = rng * 6364136223846793005u + 1442695040888963407u;
            work[(rng >> 33) % n] = (unsigned char)(rng >> 25);
        }
        write_bytes(path_of("damaged.gz"), work, n);
        tb_clear_error();
        tb_tensor *t = tb_idx_load(path_of("damaged.gz"), &cpu);
        if (t != NULL) {
            ++loaded;
            tb_tensor_release(t);
        } else {
            assert_true(strstr(tb_last_error(), path_of("damaged.gz")) != NULL);
        }
    }
    printf("%s: %d of 1500 damaged files still loaded\n", label, loaded);
}

static void test_gzip_data_errors(void **state) {
    (void)state;
    static unsigned char idx[2048], gz[8192];
    size_t idx_len = sample_idx(idx), n;
    gz_opts o;
    memset(&o, 0, sizeof o);
    n = make_gzip(gz, idx, idx_len, &o);
    check_gzip_damage(gz, n, "stored blocks");
    if (have_gzip()) {
        write_bytes(path_of("sample.idx"), idx, idx_len);
        gzip_file(path_of("sample.idx"), path_of("sample.idx.gz"));
        n = read_bytes(path_of("sample.idx.gz"), gz, sizeof gz);
        check_gzip_damage(gz, n, "gzip -c");
    }
    /* the IDX inside lies: dims larger or smaller than the data, bad magic, unknown type */
    idx[11] = 26; /* u8[40,26] */
    n = make_gzip(gz, idx, idx_len, &o);
    expect_bytes_error(gz, n, TB_ERR_FORMAT,
                       "truncated: the dims u8[40,26] need 1052 bytes, the decompressed data "
                       "hold 1012");
    idx[11] = 24;
    n = make_gzip(gz, idx, idx_len, &o);
    expect_bytes_error(gz, n, TB_ERR_FORMAT,
                       "the decompressed data are longer than the 972 bytes that the dims "
                       "u8[40,24] describe");
    idx[11] = 25;
    idx[2] = 0x0a;
    n = make_gzip(gz, idx, idx_len, &o);
    expect_bytes_error(gz, n, TB_ERR_FORMAT, "unknown IDX type code 0x0a");
    idx[2] = 0x08;
    idx[0] = 1;
    n = make_gzip(gz, idx, idx_len, &o);
    expect_bytes_error(gz, n, TB_ERR_FORMAT, "is not an IDX file");
    idx[0] = 0;
    n = make_gzip(gz, idx, 3, &o);
    expect_bytes_error(gz, n, TB_ERR_FORMAT, "the decompressed data holds 3 bytes");
    n = make_gzip(gz, idx, 9, &o);
    expect_bytes_error(gz, n, TB_ERR_FORMAT,
                       "truncated header: 2 dimensions need 12 bytes, the decompressed data "
                       "holds 9");
    /* dims far beyond what the compressed bytes can give: refused before any allocation */
    idx[4] = 0x7f;
    n = make_gzip(gz, idx, idx_len, &o);
    expect_bytes_error(gz, n, TB_ERR_FORMAT, "more than deflate can give");
    idx[4] = 0;
}

/* ---- Fashion-MNIST (Debian's dataset-fashion-mnist) ---- */

static void test_fashion_mnist(void **state) {
    (void)state;
    struct stat st;
    if (stat(FASHION_MNIST "/t10k-labels-idx1-ubyte.gz", &st) != 0 ||
        stat(FASHION_MNIST "/t10k-images-idx3-ubyte.gz", &st) != 0) {
        printf(FASHION_MNIST " not found (Debian package dataset-fashion-mnist): skipping\n");
        skip();
    }
    tb_tensor *images = tb_idx_load(FASHION_MNIST "/t10k-images-idx3-ubyte.gz", &cpu);
    if (images == NULL) fail_msg("%s", tb_last_error());
    tb_shape s = tb_tensor_shape(images);
    assert_int_equal(s.dtype, TB_U8);
    assert_int_equal(s.rank, 3);
    assert_int_equal(s.dims[0], 10000);
    assert_int_equal(s.dims[1], 28);
    assert_int_equal(s.dims[2], 28);
    unsigned char *pixels = (unsigned char *)malloc(10000 * 28 * 28);
    assert_int_equal(tb_tensor_to_host(images, pixels, 10000 * 28 * 28), TB_OK);
    size_t nonzero = 0;
    for (size_t i = 0; i < 10000u * 28 * 28; ++i)
        nonzero += pixels[i] != 0;
    free(pixels);
    assert_true(nonzero > 10000u * 28 * 28 / 4); /* images, not zeros */
    tb_tensor_release(images);

    tb_tensor *labels = tb_idx_load(FASHION_MNIST "/t10k-labels-idx1-ubyte.gz", &cpu);
    if (labels == NULL) fail_msg("%s", tb_last_error());
    s = tb_tensor_shape(labels);
    assert_int_equal(s.dtype, TB_U8);
    assert_int_equal(s.rank, 1);
    assert_int_equal(s.dims[0], 10000);
    static unsigned char y[10000];
    assert_int_equal(tb_tensor_to_host(labels, y, sizeof y), TB_OK);
    size_t per_class[10] = {0};
    for (size_t i = 0; i < 10000; ++i) {
        assert_true(y[i] <= 9);
        per_class[y[i]]++;
    }
    for (int c = 0; c < 10; ++c)
        assert_int_equal(per_class[c], 1000);
    tb_tensor_release(labels);
    printf("Fashion-MNIST t10k: u8[10000,28,28] images, 10 classes of 1000 labels\n");
}

static int setup(void **state) {
    (void)state;
    if (scratch_make("tb_idx") != 0) return -1;
    tb__crc32_init(&crc_table);
    return tb_device_make("cpu", 0, &cpu) == TB_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return scratch_remove();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_type_round_trip),   cmocka_unit_test(test_big_endian_decoding),
        cmocka_unit_test(test_argument_and_io_errors), cmocka_unit_test(test_bad_headers_and_sizes),
        cmocka_unit_test(test_gzip_header_errors),     cmocka_unit_test(test_gzip_data_errors),
        cmocka_unit_test(test_fashion_mnist),
    };
    return cmocka_run_group_tests_name("idx", tests, setup, teardown);
}
