/* Tensor sets and safetensors: the set's contract, round trips, zero-copy loading from the
   mapped file and the mapping's lifetime, F16/BF16 widening, hostile files, and the exchange
   with numpy (tests/model_files_numpy.py writes and reads the format with struct + json) and
   with PyTorch (the same script, with torch's own bytes of each tensor). */
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
#include <sys/wait.h>
#include <unistd.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include "scratch_dir.h"
#include "alloc_watch.h"

static tb_device cpu;

/* A safetensors file: the 8-byte length, the header text as given, then `data`. */
static void write_st(const char *path, const char *header, const void *data, size_t size) {
    size_t n = strlen(header);
    unsigned char *buf = (unsigned char *)malloc(8 + n + size + 1);
    assert_non_null(buf);
    for (int i = 0; i < 8; ++i)
        buf[i] = (unsigned char)(((uint64_t)n >> (8 * i)) & 0xff);
    memcpy(buf + 8, header, n);
    if (size) memcpy(buf + 8 + n, data, size);
    write_bytes(path, buf, 8 + n + size);
    free(buf);
}

/* The size of a file (0 when there is none). */
static size_t size_of_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (size_t)st.st_size : 0;
}

static void expect_load_error(const char *path, tb_status status, const char *fragment) {
    tb_clear_error();
    alloc_watch_reset();
    tb_tensor_set *set = tb_safetensors_load(path, &cpu);
    alloc_watch_check(size_of_file(path), fragment);
    if (set != NULL) {
        tb_tensor_set_free(set);
        fail_msg("%s loaded; expected an error with '%s'", path, fragment);
    }
    if (tb_last_status() != status || strstr(tb_last_error(), fragment) == NULL)
        fail_msg("error %d '%s'; expected %d with '%s'", (int)tb_last_status(), tb_last_error(),
                 (int)status, fragment);
}

/* A header with one tensor "t" and the data for it. */
static void expect_header_error(const char *header, size_t data_size, tb_status status,
                                const char *fragment) {
    static unsigned char zeros[4096];
    assert_true(data_size <= sizeof zeros);
    write_st(path_of("bad.safetensors"), header, zeros, data_size);
    expect_load_error(path_of("bad.safetensors"), status, fragment);
}

static tb_tensor *tensor_of(const void *data, tb_dtype dtype, int32_t rank, const int64_t *dims) {
    tb_shape shape;
    assert_int_equal(tb_shape_make(&shape, dtype, rank, dims), TB_OK);
    tb_tensor *t = tb_tensor_from_host(data, &shape, &cpu);
    assert_non_null(t);
    return t;
}

/* The tensor's value must equal `expected` (nbytes of it) and its shape `shape`. */
static void check_value(tb_tensor *t, const tb_shape *shape, const void *expected) {
    assert_non_null(t);
    tb_shape got = tb_tensor_shape(t);
    assert_true(tb_shape_equal(&got, shape));
    size_t nbytes = 0;
    assert_int_equal(tb_shape_nbytes(shape, &nbytes), TB_OK);
    unsigned char *buf = (unsigned char *)malloc(nbytes + 1);
    assert_non_null(buf);
    assert_int_equal(tb_tensor_to_host(t, buf, nbytes), TB_OK);
    assert_memory_equal(buf, expected, nbytes);
    free(buf);
}

/* How many of this process's mappings are of `path`. */
static int mappings_of(const char *path) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    int n = 0;
    if (f == NULL) return -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (strstr(line, path) != NULL) ++n;
    fclose(f);
    return n;
}

/* ---- the tensor set ---- */

static void test_set_contract(void **state) {
    (void)state;
    tb_tensor_set *set = tb_tensor_set_new();
    assert_non_null(set);
    const float v[2] = {1, 2};
    const int64_t d2[1] = {2};
    tb_tensor *a = tensor_of(v, TB_F32, 1, d2);
    assert_int_equal(tb_tensor_set_add(set, "a", a), TB_OK);
    assert_int_equal(tb_tensor_set_add(set, "b", a), TB_OK); /* one tensor, two names */
    tb_clear_error();
    assert_int_equal(tb_tensor_set_add(set, "a", a), TB_ERR_DUPLICATE);
    assert_non_null(strstr(tb_last_error(), "already has a tensor named 'a'"));
    assert_int_equal(tb_tensor_set_add(set, "", a), TB_ERR_INVALID_ARGUMENT);
    char *long_name = (char *)malloc(TB_TENSOR_SET_MAX_NAME + 2);
    memset(long_name, 'x', TB_TENSOR_SET_MAX_NAME + 1);
    long_name[TB_TENSOR_SET_MAX_NAME + 1] = '\0';
    assert_int_equal(tb_tensor_set_add(set, long_name, a), TB_ERR_INVALID_ARGUMENT);
    long_name[TB_TENSOR_SET_MAX_NAME] = '\0';
    assert_int_equal(tb_tensor_set_add(set, long_name, a), TB_OK);
    free(long_name);
    assert_int_equal(tb_tensor_set_add(NULL, "c", a), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_tensor_set_add(set, NULL, a), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_tensor_set_count(set), 3);
    assert_string_equal(tb_tensor_set_name(set, 1), "b");
    assert_ptr_equal(tb_tensor_set_tensor(set, 0), a);
    assert_ptr_equal(tb_tensor_set_get(set, "b"), a);
    tb_clear_error();
    assert_null(tb_tensor_set_name(set, 3));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_null(tb_tensor_set_tensor(NULL, 0));
    tb_clear_error();
    assert_null(tb_tensor_set_get(set, "nope"));
    assert_int_equal(tb_last_status(), TB_ERR_NOT_FOUND);
    assert_non_null(strstr(tb_last_error(), "no tensor named 'nope' (the set has 3: 'a', 'b'"));
    /* a failed op's NULL keeps that op's error */
    const int64_t d3[1] = {3};
    const float w[3] = {1, 2, 3};
    tb_tensor *c = tensor_of(w, TB_F32, 1, d3);
    tb_clear_error();
    assert_int_equal(tb_tensor_set_add(set, "sum", tb_add(a, c)), TB_ERR_SHAPE);
    assert_int_equal(tb_tensor_set_count(set), 3);
    /* the set holds its own references */
    tb_tensor_release(a);
    tb_tensor_release(c);
    check_value(tb_tensor_set_get(set, "a"), &(tb_shape){TB_F32, 1, {2}}, v);
    /* metadata */
    assert_int_equal(tb_tensor_set_metadata_count(set), 0);
    assert_int_equal(tb_tensor_set_set_metadata(set, "format", "pt"), TB_OK);
    assert_int_equal(tb_tensor_set_set_metadata(set, "format", "np"), TB_OK);
    assert_int_equal(tb_tensor_set_set_metadata(set, "other", ""), TB_OK);
    assert_int_equal(tb_tensor_set_set_metadata(set, "", "x"), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_tensor_set_set_metadata(set, "k", NULL), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_tensor_set_metadata_count(set), 2);
    assert_string_equal(tb_tensor_set_metadata(set, "format"), "np");
    assert_string_equal(tb_tensor_set_metadata_key(set, 1), "other");
    assert_null(tb_tensor_set_metadata_key(set, 2));
    tb_clear_error();
    assert_null(tb_tensor_set_metadata(set, "missing"));
    assert_int_equal(tb_last_status(), TB_ERR_NOT_FOUND);
    tb_tensor_set_free(set);
    tb_tensor_set_free(NULL);
    assert_int_equal(tb_tensor_set_count(NULL), 0);
}

static void test_set_many_names(void **state) {
    (void)state;
    tb_tensor_set *set = tb_tensor_set_new();
    const int32_t v = 7;
    tb_tensor *t = tensor_of(&v, TB_I32, 0, NULL);
    char name[32];
    for (int i = 0; i < 3000; ++i) {
        snprintf(name, sizeof name, "layer.%d.weight", i);
        assert_int_equal(tb_tensor_set_add(set, name, t), TB_OK);
    }
    for (int i = 2999; i >= 0; --i) {
        snprintf(name, sizeof name, "layer.%d.weight", i);
        assert_ptr_equal(tb_tensor_set_get(set, name), t);
        assert_string_equal(tb_tensor_set_name(set, (size_t)i), name);
    }
    assert_int_equal(tb_tensor_set_add(set, "layer.1234.weight", t), TB_ERR_DUPLICATE);
    tb_tensor_release(t);
    tb_tensor_set_free(set);
}

/* ---- round trips ---- */

/* A set with every dtype, a scalar, an empty tensor and a pending (unsynced) one. */
static tb_tensor_set *sample_set(void) {
    tb_tensor_set *set = tb_tensor_set_new();
    const int64_t d23[2] = {2, 3}, d5[1] = {5}, d203[3] = {2, 0, 3};
    const float f[6] = {1.5f, -2, 0, 3.25f, 1e-30f, -7};
    const double g[5] = {1e300, -0.0, 2.5, 3, 4};
    const int32_t i[6] = {INT32_MIN, -1, 0, 1, 2, INT32_MAX};
    const int64_t l[5] = {INT64_MIN, -5, 0, 5, INT64_MAX};
    const uint8_t u[5] = {0, 1, 127, 128, 255};
    const uint8_t b[6] = {1, 0, 0, 1, 1, 0};
    const float s = 42;
    tb_tensor *ts[8];
    ts[0] = tensor_of(f, TB_F32, 2, d23);
    ts[1] = tensor_of(g, TB_F64, 1, d5);
    ts[2] = tensor_of(i, TB_I32, 2, d23);
    ts[3] = tensor_of(l, TB_I64, 1, d5);
    ts[4] = tensor_of(u, TB_U8, 1, d5);
    ts[5] = tensor_of(b, TB_BOOL, 2, d23);
    ts[6] = tensor_of(&s, TB_F32, 0, NULL);
    ts[7] = tensor_of(NULL, TB_F32, 3, d203);
    const char *names[8] = {"f32", "f64", "i32", "i64", "u8", "bool", "scalar", "empty"};
    for (int k = 0; k < 8; ++k) {
        assert_int_equal(tb_tensor_set_add(set, names[k], ts[k]), TB_OK);
        tb_tensor_release(ts[k]);
    }
    tb_tensor *pending = tb_mul_scalar(tb_tensor_set_get(set, "f32"), 2.0);
    assert_non_null(tb_tensor_node(pending));
    assert_int_equal(tb_tensor_set_add(set, "doubled", pending), TB_OK);
    tb_tensor_release(pending);
    assert_int_equal(tb_tensor_set_set_metadata(set, "format", "pt"), TB_OK);
    assert_int_equal(tb_tensor_set_set_metadata(set, "quote\"and\\slash", "line\nbreak é"), TB_OK);
    return set;
}

static void expect_same_sets(const tb_tensor_set *a, const tb_tensor_set *b) {
    assert_int_equal(tb_tensor_set_count(a), tb_tensor_set_count(b));
    for (size_t i = 0; i < tb_tensor_set_count(a); ++i) {
        assert_string_equal(tb_tensor_set_name(a, i), tb_tensor_set_name(b, i));
        tb_tensor *x = tb_tensor_set_tensor(a, i);
        tb_shape shape = tb_tensor_shape(x);
        size_t nbytes = 0;
        assert_int_equal(tb_shape_nbytes(&shape, &nbytes), TB_OK);
        unsigned char *buf = (unsigned char *)malloc(nbytes + 1);
        assert_int_equal(tb_tensor_to_host(x, buf, nbytes), TB_OK);
        check_value(tb_tensor_set_tensor(b, i), &shape, buf);
        free(buf);
    }
}

static void test_round_trip(void **state) {
    (void)state;
    tb_tensor_set *set = sample_set();
    const char *path = path_of("round.safetensors");
    assert_int_equal(tb_safetensors_save(path, set), TB_OK);
    assert_null(tb_tensor_node(tb_tensor_set_get(set, "doubled"))); /* synced by the save */
    tb_tensor_set *back = tb_safetensors_load(path, &cpu);
    assert_non_null(back);
    expect_same_sets(set, back);
    assert_int_equal(tb_tensor_set_metadata_count(back), 2);
    assert_string_equal(tb_tensor_set_metadata(back, "format"), "pt");
    assert_string_equal(tb_tensor_set_metadata(back, "quote\"and\\slash"), "line\nbreak é");
    /* saving what was loaded gives the same bytes */
    assert_int_equal(tb_safetensors_save(path_of("again.safetensors"), back), TB_OK);
    tb_tensor_set_free(back);
    tb_tensor_set_free(set);
    FILE *f1 = fopen(path, "rb"), *f2 = fopen(path_of("again.safetensors"), "rb");
    static unsigned char b1[8192], b2[8192];
    size_t n1 = fread(b1, 1, sizeof b1, f1), n2 = fread(b2, 1, sizeof b2, f2);
    fclose(f1);
    fclose(f2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    /* every tensor starts aligned for its dtype in the file */
    uint64_t header_len = 0;
    memcpy(&header_len, b1, 8);
    assert_int_equal((8 + header_len) % 8, 0);
    assert_non_null(strstr((const char *)b1 + 8, "\"f64\":{\"dtype\":\"F64\",\"shape\":[5],"
                                                 "\"data_offsets\":[0,40]}"));
}

static void test_empty_set(void **state) {
    (void)state;
    tb_tensor_set *set = tb_tensor_set_new();
    assert_int_equal(tb_safetensors_save(path_of("empty.safetensors"), set), TB_OK);
    tb_tensor_set_free(set);
    set = tb_safetensors_load(path_of("empty.safetensors"), &cpu);
    assert_non_null(set);
    assert_int_equal(tb_tensor_set_count(set), 0);
    tb_tensor_set_free(set);
}

/* On the cpu backend the tensors use the mapped file in place, and the mapping lives exactly as
   long as a tensor using it. */
static void test_zero_copy_and_mapping_lifetime(void **state) {
    (void)state;
    tb_tensor_set *set = sample_set();
    const char *path = path_of("mapped.safetensors");
    assert_int_equal(tb_safetensors_save(path, set), TB_OK);
    tb_tensor_set_free(set);
    const char *real = path; /* under mkdtemp's absolute /tmp path, as /proc/self/maps shows it */
    assert_int_equal(mappings_of(real), 0);
    set = tb_safetensors_load(path, &cpu);
    assert_non_null(set);
    assert_true(mappings_of(real) > 0);
    /* f64 is first in the data, i64 right after it: both in place, 40 bytes apart */
    const unsigned char *p64 =
        (const unsigned char *)tb__host_data(tb_tensor_data(tb_tensor_set_get(set, "f64")));
    const unsigned char *pi64 =
        (const unsigned char *)tb__host_data(tb_tensor_data(tb_tensor_set_get(set, "i64")));
    assert_ptr_equal(pi64, p64 + 40);
    assert_int_equal((uintptr_t)p64 % 8, 0);
    tb_tensor *kept = tb_tensor_retain(tb_tensor_set_get(set, "i64"));
    tb_tensor *derived = tb_add_scalar(tb_tensor_set_get(set, "f64"), 1.0);
    tb_tensor_set_free(set);
    /* the file may be replaced or removed: the mapping keeps the old bytes */
    assert_int_equal(remove(path), 0);
    assert_true(mappings_of(real) > 0);
    const int64_t l[5] = {INT64_MIN, -5, 0, 5, INT64_MAX};
    check_value(kept, &(tb_shape){TB_I64, 1, {5}}, l);
    const double plus[5] = {1e300, 1.0, 3.5, 4, 5};
    check_value(derived, &(tb_shape){TB_F64, 1, {5}}, plus);
    tb_tensor_release(derived);
    assert_true(mappings_of(real) > 0);
    tb_tensor_release(kept);
    assert_int_equal(mappings_of(real), 0);
}

/* A misaligned tensor (a header whose length is not a multiple of 8) is copied, not borrowed. */
static void test_misaligned_data_is_copied(void **state) {
    (void)state;
    const float f[2] = {1.5f, -3};
    write_st(path_of("odd.safetensors"),
             "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", f, 8);
    tb_tensor_set *set = tb_safetensors_load(path_of("odd.safetensors"), &cpu);
    assert_non_null(set);
    check_value(tb_tensor_set_get(set, "t"), &(tb_shape){TB_F32, 1, {2}}, f);
    tb_tensor_set_free(set);
    /* bool bytes other than 0 and 1 are read as true (a copy) */
    const uint8_t b[4] = {0, 1, 2, 255}, want[4] = {0, 1, 1, 1};
    write_st(path_of("bool.safetensors"),
             "{\"b\":{\"dtype\":\"BOOL\",\"shape\":[4],\"data_offsets\":[0,4]}}", b, 4);
    set = tb_safetensors_load(path_of("bool.safetensors"), &cpu);
    assert_non_null(set);
    check_value(tb_tensor_set_get(set, "b"), &(tb_shape){TB_BOOL, 1, {4}}, want);
    tb_tensor_set_free(set);
}

/* F16 and BF16 load as f16 and bf16, bit for bit; cast to f32 they are the exact values. */
static void test_f16_and_bf16_load_as_themselves(void **state) {
    (void)state;
    const uint16_t half[8] = {0x3c00, 0xc000, 0x0001, 0x7c00, 0x8000, 0x7bff, 0x0400, 0x3555};
    const uint16_t bf16[3] = {0x3f80, 0x4049, 0xff80};
    unsigned char data[22];
    for (int i = 0; i < 8; ++i) {
        data[2 * i] = (unsigned char)(half[i] & 0xff);
        data[2 * i + 1] = (unsigned char)(half[i] >> 8);
    }
    for (int i = 0; i < 3; ++i) {
        data[16 + 2 * i] = (unsigned char)(bf16[i] & 0xff);
        data[17 + 2 * i] = (unsigned char)(bf16[i] >> 8);
    }
    write_st(path_of("half.safetensors"),
             "{\"h\":{\"dtype\":\"F16\",\"shape\":[2,4],\"data_offsets\":[0,16]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]}}",
             data, sizeof data);
    tb_tensor_set *set = tb_safetensors_load(path_of("half.safetensors"), &cpu);
    assert_non_null(set);
    check_value(tb_tensor_set_get(set, "h"), &(tb_shape){TB_F16, 2, {2, 4}}, half);
    check_value(tb_tensor_set_get(set, "b"), &(tb_shape){TB_BF16, 1, {3}}, bf16);
    const float want_h[8] = {1.0f,  -2.0f,    5.9604644775390625e-08f, INFINITY,
                             -0.0f, 65504.0f, 6.103515625e-05f,        0.333251953125f};
    tb_tensor *h = tb_cast(tb_tensor_set_get(set, "h"), TB_F32);
    check_value(h, &(tb_shape){TB_F32, 2, {2, 4}}, want_h);
    const float want_b[3] = {1.0f, 3.140625f, -INFINITY};
    tb_tensor *b = tb_cast(tb_tensor_set_get(set, "b"), TB_F32);
    check_value(b, &(tb_shape){TB_F32, 1, {3}}, want_b);
    tb_tensor_release(b);
    tb_tensor_release(h);
    tb_tensor_set_free(set);
}

/* ---- hostile files ---- */

static void test_hostile_files(void **state) {
    (void)state;
    const char *path = path_of("hostile.safetensors");
    write_bytes(path, "\x05\0\0", 3);
    expect_load_error(path, TB_ERR_FORMAT, "shorter than the 8-byte header length");
    /* lying header lengths */
    unsigned char lie[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    write_bytes(path, lie, sizeof lie);
    expect_load_error(path, TB_ERR_FORMAT, "but the file is shorter");
    lie[0] = 9;
    memset(lie + 1, 0, 7);
    write_bytes(path, lie, sizeof lie); /* 9 > 8 bytes left */
    expect_load_error(path, TB_ERR_FORMAT, "the header claims 9 bytes but the file is shorter");
    /* a header above the format's 100 MB limit, in a sparse file */
    {
        FILE *f = fopen(path, "wb");
        unsigned char len[8] = {0x01, 0xe1, 0xf5, 0x05, 0, 0, 0, 0}; /* 100000001 */
        fwrite(len, 1, 8, f);
        fclose(f);
        assert_int_equal(truncate(path, 8 + 100000001 + 16), 0);
        expect_load_error(path, TB_ERR_FORMAT, "safetensors allows at most 100000000");
    }
    /* bad JSON */
    expect_header_error("", 0, TB_ERR_FORMAT, "the header must be a JSON object");
    expect_header_error("[]", 0, TB_ERR_FORMAT, "the header must be a JSON object");
    expect_header_error("{\"t\":", 0, TB_ERR_FORMAT, "expected a value");
    expect_header_error("{\"t\" {}}", 0, TB_ERR_FORMAT, "expected ':'");
    expect_header_error("{} x", 0, TB_ERR_FORMAT, "text after the header's object");
    expect_header_error("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},}", 1,
                        TB_ERR_FORMAT, "expected a string");
    expect_header_error("{\"t\":{\"dtype\":\"U8\",}}", 0, TB_ERR_FORMAT, "expected a string");
    expect_header_error("{\"a\\qb\":{}}", 0, TB_ERR_FORMAT, "bad escape");
    expect_header_error("{\"a\tb\":{}}", 0, TB_ERR_FORMAT, "control character");
    expect_header_error("{\"\\ud800x\":{}}", 0, TB_ERR_FORMAT, "high surrogate");
    expect_header_error("{\"\\udc00\":{}}", 0, TB_ERR_FORMAT, "lone low surrogate");
    expect_header_error("{\"a\xff\":{}}", 0, TB_ERR_FORMAT, "not valid UTF-8");
    expect_header_error("{\"a\xc0\x80\":{}}", 0, TB_ERR_FORMAT, "not valid UTF-8");
    expect_header_error("{\"t\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1],\"x\":01}}",
                        1, TB_ERR_FORMAT, "leading zero");
    /* nesting: JSON up to 64 levels deep (the header's object, the tensor's and 62 lists in an
       unknown key), no deeper */
    {
        char header[512];
        int n = snprintf(header, sizeof header,
                         "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":");
        for (int i = 0; i < 62; ++i)
            header[n++] = '[';
        for (int i = 0; i < 62; ++i)
            header[n++] = ']';
        strcpy(header + n, "}}");
        write_st(path, header, "\x07", 1);
        tb_tensor_set *set = tb_safetensors_load(path, &cpu);
        assert_non_null(set);
        tb_tensor_set_free(set);
        n = snprintf(header, sizeof header,
                     "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":");
        for (int i = 0; i < 63; ++i)
            header[n++] = '[';
        for (int i = 0; i < 63; ++i)
            header[n++] = ']';
        strcpy(header + n, "}}");
        expect_header_error(header, 1, TB_ERR_FORMAT, "nested deeper than 64 levels");
        /* 100000 brackets: rejected without deep recursion */
        char *deep = (char *)malloc(100010);
        strcpy(deep, "{\"t\":");
        memset(deep + 5, '[', 100000);
        strcpy(deep + 100005, "}");
        write_st(path, deep, NULL, 0);
        free(deep);
        expect_load_error(path, TB_ERR_FORMAT, "nested deeper than 64 levels");
    }
    /* names and keys */
    expect_header_error("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                        "\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                        2, TB_ERR_FORMAT, "tensor 't' appears twice");
    expect_header_error("{\"__metadata__\":{},\"__metadata__\":{}}", 0, TB_ERR_FORMAT,
                        "'__metadata__' appears twice");
    expect_header_error("{\"__metadata__\":{\"k\":1}}", 0, TB_ERR_FORMAT,
                        "'__metadata__' values must be strings");
    expect_header_error("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, TB_ERR_FORMAT,
                        "metadata key 'k' appears twice");
    expect_header_error("{\"__metadata__\":[]}", 0, TB_ERR_FORMAT, "must be an object");
    expect_header_error("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1,
                        TB_ERR_FORMAT, "holds a NUL character");
    expect_header_error("{\"\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1,
                        TB_ERR_FORMAT, "a tensor name is empty");
    expect_header_error("{\"t\":[]}", 0, TB_ERR_FORMAT, "a tensor's entry must be an object");
    expect_header_error("{\"t\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, TB_ERR_FORMAT,
                        "tensor 't' lacks 'dtype'");
    expect_header_error("{\"t\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, TB_ERR_FORMAT,
                        "tensor 't' lacks 'shape'");
    expect_header_error("{\"t\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, TB_ERR_FORMAT,
                        "tensor 't' lacks 'data_offsets'");
    expect_header_error(
        "{\"t\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
        TB_ERR_FORMAT, "tensor 't' has 'dtype' twice");
    expect_header_error("{\"t\":{\"dtype\":\"I16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2,
                        TB_ERR_DTYPE, "dtype 'I16', which the library does not read");
    expect_header_error("{\"t\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                        TB_ERR_FORMAT, "expected a string");
    /* shapes */
    expect_header_error(
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
        TB_ERR_UNSUPPORTED, "more than 8 dimensions");
    expect_header_error("{\"t\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1,
                        TB_ERR_FORMAT, "negative number");
    expect_header_error("{\"t\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 1,
                        TB_ERR_FORMAT, "not a fraction");
    expect_header_error("{\"t\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1,
                        TB_ERR_FORMAT, "'shape' must be a list of integers");
    expect_header_error("{\"t\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296,8],"
                        "\"data_offsets\":[0,8]}}",
                        8, TB_ERR_FORMAT, "the shape's size overflows");
    expect_header_error("{\"t\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999],"
                        "\"data_offsets\":[0,1]}}",
                        1, TB_ERR_FORMAT, "number too large");
    /* offsets */
    expect_header_error("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
                        TB_ERR_FORMAT, "hold 4 bytes but F32 of 2 elements needs 8");
    expect_header_error("{\"t\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,0]}}", 2,
                        TB_ERR_FORMAT, "has data_offsets [2, 0]");
    expect_header_error("{\"t\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0]}}", 2,
                        TB_ERR_FORMAT, "'data_offsets' must be [begin, end]");
    expect_header_error("{\"t\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2,4]}}", 2,
                        TB_ERR_FORMAT, "'data_offsets' must be [begin, end]");
    expect_header_error("{\"t\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 2,
                        TB_ERR_FORMAT, "the tensors end at data byte 4 but the file holds 2");
    expect_header_error("{\"t\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 3,
                        TB_ERR_FORMAT, "the tensors end at data byte 2 but the file holds 3");
    expect_header_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                        "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
                        6, TB_ERR_FORMAT, "it overlaps another tensor");
    expect_header_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                        "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]}}",
                        6, TB_ERR_FORMAT, "a gap between tensors");
    expect_header_error("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,"
                        "9223372036854775807]}}",
                        1, TB_ERR_FORMAT, "hold 9223372036854775807 bytes");
    expect_header_error("{}", 5, TB_ERR_FORMAT, "5 bytes of data follow a header that lists no");
    /* unknown keys in an entry are skipped, as the reference implementation does */
    write_st(path,
             "{\"t\":{\"x\":{\"y\":[1,2.5e3,true,null,\"s\"]},\"dtype\":\"U8\",\"shape\":[1],"
             "\"data_offsets\":[0,1]}}  \n ",
             "\x09", 1);
    tb_tensor_set *set = tb_safetensors_load(path, &cpu);
    assert_non_null(set);
    tb_tensor_set_free(set);
}

/* Every truncation and many random byte changes of a valid file: no crash, no leak (the
   sanitizers watch), no allocation larger than the file, and either a set or an error with a
   message. */
static void test_mutations_fail_cleanly(void **state) {
    (void)state;
    tb_tensor_set *set = sample_set();
    const char *good = path_of("good.safetensors"), *bad = path_of("mutated.safetensors");
    assert_int_equal(tb_safetensors_save(good, set), TB_OK);
    tb_tensor_set_free(set);
    static unsigned char bytes[8192], work[8192];
    FILE *f = fopen(good, "rb");
    size_t n = fread(bytes, 1, sizeof bytes, f);
    fclose(f);
    for (size_t len = 0; len < n; ++len) {
        write_bytes(bad, bytes, len);
        tb_clear_error();
        alloc_watch_reset();
        set = tb_safetensors_load(bad, &cpu);
        alloc_watch_check(len, "a truncated file");
        assert_null(set); /* every proper prefix is incomplete */
        assert_true(tb_last_error()[0] != '\0');
    }
    uint64_t rng = 12345, header_len = 0;
    int loaded = 0;
    for (int i = 7; i >= 0; --i)
        header_len = header_len << 8 | bytes[i];
    assert_true(8 + header_len <= n);
    for (int round = 0; round < 1500; ++round) {
        memcpy(work, bytes, n);
        for (int k = 0; k < 1 + round % 4; ++k) {
            rng = rng * 6364136223846793005u + 1442695040888963407u;
            size_t at = (size_t)(rng >> 33) % (round % 2 ? n : 8 + (size_t)header_len);
            work[at] = (unsigned char)(rng >> 25);
        }
        write_bytes(bad, work, n);
        tb_clear_error();
        alloc_watch_reset();
        set = tb_safetensors_load(bad, &cpu);
        alloc_watch_check(n, "a damaged file");
        if (set != NULL) {
            ++loaded;
            for (size_t i = 0; i < tb_tensor_set_count(set); ++i) {
                tb_shape s = tb_tensor_shape(tb_tensor_set_tensor(set, i));
                size_t nbytes = 0;
                assert_int_equal(tb_shape_nbytes(&s, &nbytes), TB_OK);
                assert_true(nbytes <= n);
            }
            tb_tensor_set_free(set);
        } else {
            assert_true(tb_last_error()[0] != '\0');
        }
    }
    printf("%d of 1500 mutated files still loaded (changes in the data or in spaces)\n", loaded);
}

static void test_io_and_argument_errors(void **state) {
    (void)state;
    expect_load_error(path_of("does_not_exist.safetensors"), TB_ERR_NOT_FOUND, "cannot open");
    expect_load_error(tmpdir, TB_ERR_IO, "is not a regular file");
    tb_clear_error();
    assert_null(tb_safetensors_load(NULL, &cpu));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    tb_tensor_set *set = tb_tensor_set_new();
    assert_int_equal(tb_safetensors_save(NULL, set), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_safetensors_save(path_of("x.safetensors"), NULL), TB_ERR_INVALID_ARGUMENT);
    const uint8_t v = 1;
    tb_tensor *t = tensor_of(&v, TB_U8, 0, NULL);
    assert_int_equal(tb_tensor_set_add(set, "__metadata__", t), TB_OK);
    tb_clear_error();
    assert_int_equal(tb_safetensors_save(path_of("x.safetensors"), set), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "reserved '__metadata__'"));
    tb_tensor_set_free(set);
    set = tb_tensor_set_new();
    assert_int_equal(tb_tensor_set_add(set, "bad\xff", t), TB_OK);
    assert_int_equal(tb_safetensors_save(path_of("x.safetensors"), set), TB_ERR_INVALID_ARGUMENT);
    tb_tensor_set_free(set);
    set = tb_tensor_set_new();
    assert_int_equal(tb_tensor_set_add(set, "ok", t), TB_OK);
    tb_clear_error();
    assert_int_equal(tb_safetensors_save(path_of("no_such_dir/x.safetensors"), set), TB_ERR_IO);
    assert_non_null(strstr(tb_last_error(), "cannot write"));
    assert_int_equal(access(path_of("x.safetensors"), F_OK), -1); /* nothing half-written */
    tb_tensor_set_free(set);
    tb_tensor_release(t);
    /* a device that does not exist */
    tb_device bogus;
    memset(&bogus, 0, sizeof bogus);
    strcpy(bogus.backend, "nosuchbackend");
    tb_clear_error();
    assert_null(tb_safetensors_load(path_of("round.safetensors"), &bogus));
    assert_non_null(strstr(tb_last_error(), "nosuchbackend"));
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

/* Compares each tensor of `set` (in the order of PREFIX_names.txt, the header's) with numpy's
   PREFIX_<name>.npy of the same values (f16 and bf16 ones cast to f32: numpy's float32). */
static void expect_set_as_npy(const tb_tensor_set *set, const char *prefix) {
    char file[600];
    snprintf(file, sizeof file, "%s_names.txt", prefix);
    FILE *names = fopen(path_of(file), "r");
    assert_non_null(names);
    char line[512];
    size_t index = 0;
    while (fgets(line, sizeof line, names) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        char npy[600];
        snprintf(npy, sizeof npy, "%s_%s.npy", prefix, line);
        tb_tensor *want = tb_npy_load(path_of(npy), &cpu);
        if (want == NULL) fail_msg("%s", tb_last_error());
        assert_string_equal(tb_tensor_set_name(set, index), line); /* the header's order */
        tb_shape shape = tb_tensor_shape(want);
        size_t nbytes = 0;
        assert_int_equal(tb_shape_nbytes(&shape, &nbytes), TB_OK);
        unsigned char *buf = (unsigned char *)malloc(nbytes + 1);
        assert_int_equal(tb_tensor_to_host(want, buf, nbytes), TB_OK);
        tb_tensor *got = tb_tensor_set_get(set, line);
        tb_dtype dt = got ? tb_tensor_shape(got).dtype : TB_F32;
        got = dt == TB_F16 || dt == TB_BF16 ? tb_cast(got, TB_F32) : tb_tensor_retain(got);
        check_value(got, &shape, buf);
        tb_tensor_release(got);
        free(buf);
        tb_tensor_release(want);
        ++index;
    }
    fclose(names);
    assert_int_equal(index, tb_tensor_set_count(set));
    printf("read %u tensors written by Python\n", (unsigned)index);
}

/* Writes the .npy of each tensor of `set` as PREFIX_<name>.npy (f16 and bf16 as f32). */
static void save_set_as_npy(const tb_tensor_set *set, const char *prefix) {
    for (size_t i = 0; i < tb_tensor_set_count(set); ++i) {
        char npy[600];
        tb_tensor *t = tb_tensor_set_tensor(set, i);
        tb_dtype dt = tb_tensor_shape(t).dtype;
        t = dt == TB_F16 || dt == TB_BF16 ? tb_cast(t, TB_F32) : tb_tensor_retain(t);
        snprintf(npy, sizeof npy, "%s_%s.npy", prefix, tb_tensor_set_name(set, i));
        assert_int_equal(tb_npy_save(path_of(npy), t), TB_OK);
        tb_tensor_release(t);
    }
}

static void test_numpy_exchange(void **state) {
    (void)state;
    int rc = run_script("write-safetensors");
    if (rc == 77) {
        printf("numpy or tests/model_files_numpy.py not found: skipping\n");
        skip();
    }
    assert_int_equal(rc, 0);
    /* Python wrote: we read, tensor by tensor against numpy's .npy of the same values */
    tb_tensor_set *set = tb_safetensors_load(path_of("py.safetensors"), &cpu);
    if (set == NULL) fail_msg("%s", tb_last_error());
    assert_string_equal(tb_tensor_set_metadata(set, "note"), "ünïcode \"q\"");
    expect_set_as_npy(set, "py");
    /* we write what we read (F16 and BF16 as they came), Python reads it strictly */
    FILE *meta = fopen(path_of("c_metadata.json"), "w");
    fputs("{\"format\": \"pt\", \"note\": \"\\u00fcn\\u00efcode \\\"q\\\"\"}", meta);
    fclose(meta);
    save_set_as_npy(set, "c");
    assert_int_equal(tb_safetensors_save(path_of("c.safetensors"), set), TB_OK);
    tb_tensor_set_free(set);
    assert_int_equal(run_script("check-safetensors"), 0);
}

/* PyTorch's tensors (bfloat16 and float16 among them) written with torch's own bytes: loaded
   here as torch has them (cast to f32, as torch's .float() gives them); written back and read
   by PyTorch, each equals the tensor it came from, bit for bit. */
static void test_torch_exchange(void **state) {
    (void)state;
    int rc = run_script("write-safetensors-torch");
    if (rc == 77) {
        printf("PyTorch, numpy or tests/model_files_numpy.py not found: skipping\n");
        skip();
    }
    assert_int_equal(rc, 0);
    tb_tensor_set *set = tb_safetensors_load(path_of("torch.safetensors"), &cpu);
    if (set == NULL) fail_msg("%s", tb_last_error());
    assert_string_equal(tb_tensor_set_metadata(set, "format"), "pt");
    expect_set_as_npy(set, "torch");
    assert_int_equal(tb_safetensors_save(path_of("c_torch.safetensors"), set), TB_OK);
    tb_tensor_set_free(set);
    assert_int_equal(run_script("check-safetensors-torch"), 0);
}

static int setup(void **state) {
    (void)state;
    if (scratch_make("tb_safetensors") != 0) return -1;
    if (alloc_watch_setup() != TB_OK) return -1;
    return tb_device_make("cpu", 0, &cpu) == TB_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return scratch_remove();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_contract),
        cmocka_unit_test(test_set_many_names),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_empty_set),
        cmocka_unit_test(test_zero_copy_and_mapping_lifetime),
        cmocka_unit_test(test_misaligned_data_is_copied),
        cmocka_unit_test(test_f16_and_bf16_load_as_themselves),
        cmocka_unit_test(test_hostile_files),
        cmocka_unit_test(test_mutations_fail_cleanly),
        cmocka_unit_test(test_io_and_argument_errors),
        cmocka_unit_test(test_numpy_exchange),
        cmocka_unit_test(test_torch_exchange),
    };
    return cmocka_run_group_tests_name("safetensors", tests, setup, teardown);
}
