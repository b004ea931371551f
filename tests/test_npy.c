/* .npy load and save: round trips, numpy interop, and every malformed-file path. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include "scratch_dir.h"

/* A .npy 1.0 file with the given header dict text and data bytes. */
static void write_npy(const char *path, const char *dict, const void *data, size_t size) {
    unsigned char buf[512];
    size_t dict_len = strlen(dict);
    size_t total = (10 + dict_len + 1 + 63) / 64 * 64;
    size_t header_len = total - 10;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)(header_len & 0xff);
    buf[9] = (unsigned char)(header_len >> 8);
    memset(buf + 10, ' ', header_len);
    memcpy(buf + 10, dict, dict_len);
    buf[total - 1] = '\n';
    assert_true(total + size <= sizeof buf);
    memcpy(buf + total, data, size);
    write_bytes(path, buf, total + size);
}

static void expect_load_error(const char *path, tb_status status, const char *fragment) {
    tb_clear_error();
    tb_tensor *t = tb_npy_load(path, NULL);
    assert_null(t);
    assert_int_equal(tb_last_status(), status);
    if (strstr(tb_last_error(), fragment) == NULL)
        fail_msg("error '%s' lacks '%s'", tb_last_error(), fragment);
}

static void test_round_trip_every_dtype(void **state) {
    (void)state;
    const int64_t dims[2] = {3, 5};
    for (int d = 0; d < TB_DTYPE_COUNT; ++d) {
        tb_shape shape;
        assert_int_equal(tb_shape_make(&shape, (tb_dtype)d, 2, dims), TB_OK);
        size_t nbytes = 0;
        assert_int_equal(tb_shape_nbytes(&shape, &nbytes), TB_OK);
        unsigned char in[15 * 8], out[15 * 8];
        for (size_t i = 0; i < nbytes; ++i)
            in[i] = (unsigned char)(d == TB_BOOL ? (i % 3 == 0) : (i * 37 + 11));
        if (d == TB_F32 || d == TB_F64) { /* keep every value finite and not NaN */
            for (size_t i = 0; i < 15; ++i) {
                if (d == TB_F32) {
                    float v = (float)i * 0.25f - 1.0f;
                    memcpy(in + i * 4, &v, 4);
                } else {
                    double v = (double)i * 0.125 - 2.0;
                    memcpy(in + i * 8, &v, 8);
                }
            }
        }
        tb_tensor *t = tb_tensor_from_host(in, &shape, NULL);
        assert_non_null(t);
        if (d == TB_BF16) { /* numpy has no bf16 */
            assert_int_equal(tb_npy_save(path_of("rt.npy"), t), TB_ERR_DTYPE);
            assert_non_null(strstr(tb_last_error(), "bf16"));
            tb_tensor_release(t);
            continue;
        }
        assert_int_equal(tb_npy_save(path_of("rt.npy"), t), TB_OK);
        tb_tensor *back = tb_npy_load(path_of("rt.npy"), NULL);
        assert_non_null(back);
        tb_shape got = tb_tensor_shape(back);
        assert_true(tb_shape_equal(&got, &shape));
        assert_int_equal(tb_tensor_to_host(back, out, nbytes), TB_OK);
        assert_memory_equal(in, out, nbytes);
        tb_tensor_release(t);
        tb_tensor_release(back);
    }
}

static void test_rank0_and_empty(void **state) {
    (void)state;
    tb_shape scalar;
    assert_int_equal(tb_shape_make(&scalar, TB_F64, 0, NULL), TB_OK);
    double v = 42.5, w = 0;
    tb_tensor *t = tb_tensor_from_host(&v, &scalar, NULL);
    assert_int_equal(tb_npy_save(path_of("s.npy"), t), TB_OK);
    tb_tensor *back = tb_npy_load(path_of("s.npy"), NULL);
    assert_non_null(back);
    assert_int_equal(tb_tensor_shape(back).rank, 0);
    assert_int_equal(tb_tensor_to_host(back, &w, sizeof w), TB_OK);
    assert_true(w == 42.5);
    tb_tensor_release(t);
    tb_tensor_release(back);

    const int64_t dims[3] = {2, 0, 3};
    tb_shape empty;
    assert_int_equal(tb_shape_make(&empty, TB_I32, 3, dims), TB_OK);
    tb_tensor *e = tb_zeros(&empty, NULL);
    assert_int_equal(tb_npy_save(path_of("e.npy"), e), TB_OK);
    tb_tensor *eb = tb_npy_load(path_of("e.npy"), NULL);
    assert_non_null(eb);
    tb_shape got = tb_tensor_shape(eb);
    assert_true(tb_shape_equal(&got, &empty));
    tb_tensor_release(e);
    tb_tensor_release(eb);
}

static void test_header_is_aligned_and_readable(void **state) {
    (void)state;
    float v[3] = {1, 2, 3};
    tb_shape s = tb_shape_of(TB_F32, 1, 3);
    tb_tensor *t = tb_tensor_from_host(v, &s, NULL);
    assert_int_equal(tb_npy_save(path_of("h.npy"), t), TB_OK);
    FILE *f = fopen(path_of("h.npy"), "rb");
    assert_non_null(f);
    unsigned char buf[256];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_memory_equal(buf, "\x93NUMPY\x01\x00", 8);
    size_t header_len = (size_t)buf[8] | ((size_t)buf[9] << 8);
    assert_int_equal(n, 10 + header_len + 12);
    assert_int_equal((10 + header_len) % 64, 0);
    assert_int_equal(buf[10 + header_len - 1], '\n');
    assert_non_null(strstr((const char *)buf + 10, "'shape': (3,)"));
    tb_tensor_release(t);
}

static void test_version2_and_big_endian(void **state) {
    (void)state;
    /* version 2.0 header (4-byte length), big-endian i32 data */
    const char *dict = "{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }";
    unsigned char buf[256];
    size_t dict_len = strlen(dict);
    size_t total = (12 + dict_len + 1 + 63) / 64 * 64;
    size_t header_len = total - 12;
    memcpy(buf, "\x93NUMPY\x02\x00", 8);
    buf[8] = (unsigned char)header_len;
    buf[9] = buf[10] = buf[11] = 0;
    memset(buf + 12, ' ', header_len);
    memcpy(buf + 12, dict, dict_len);
    buf[total - 1] = '\n';
    const unsigned char data[8] = {0, 0, 1, 2, 0xff, 0xff, 0xff, 0xfe};
    memcpy(buf + total, data, 8);
    write_bytes(path_of("v2.npy"), buf, total + 8);
    tb_tensor *t = tb_npy_load(path_of("v2.npy"), NULL);
    assert_non_null(t);
    int32_t out[2];
    assert_int_equal(tb_tensor_to_host(t, out, sizeof out), TB_OK);
    assert_int_equal(out[0], 258);
    assert_int_equal(out[1], -2);
    tb_tensor_release(t);
}

static void test_malformed_files(void **state) {
    (void)state;
    const float four[4] = {1, 2, 3, 4};
    expect_load_error(path_of("missing.npy"), TB_ERR_NOT_FOUND, "cannot open");
    write_bytes(path_of("magic.npy"), "NOTNUMPY\x10\x00", 10);
    expect_load_error(path_of("magic.npy"), TB_ERR_FORMAT, "bad magic");
    write_bytes(path_of("short.npy"), "\x93NUMPY\x01\x00\x40", 9);
    expect_load_error(path_of("short.npy"), TB_ERR_FORMAT, "truncated");
    write_npy(path_of("fortran.npy"), "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }",
              four, 16);
    expect_load_error(path_of("fortran.npy"), TB_ERR_FORMAT, "Fortran");
    write_npy(path_of("complex.npy"), "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }",
              four, 16);
    expect_load_error(path_of("complex.npy"), TB_ERR_FORMAT, "unsupported dtype '<c8'");
    write_npy(path_of("lying.npy"), "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 3), }",
              four, 16);
    expect_load_error(path_of("lying.npy"), TB_ERR_FORMAT, "truncated");
    write_npy(path_of("extra.npy"), "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
              four, 16);
    expect_load_error(path_of("extra.npy"), TB_ERR_FORMAT, "continues past");
    write_npy(path_of("huge.npy"),
              "{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", four,
              16);
    expect_load_error(path_of("huge.npy"), TB_ERR_FORMAT, "too large");
    write_npy(path_of("ovf.npy"),
              "{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999,), }", four,
              16);
    expect_load_error(path_of("ovf.npy"), TB_ERR_FORMAT, "overflows");
    write_npy(path_of("nokey.npy"), "{'descr': '<f4', 'shape': (4,), }", four, 16);
    expect_load_error(path_of("nokey.npy"), TB_ERR_FORMAT, "fortran_order");
    write_npy(path_of("junk.npy"), "{'descr': '<f4', 'fortran_order': False, 'shape': (4,) junk",
              four, 16);
    expect_load_error(path_of("junk.npy"), TB_ERR_FORMAT, "malformed header");
    write_npy(path_of("rank9.npy"),
              "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", four, 4);
    expect_load_error(path_of("rank9.npy"), TB_ERR_FORMAT, "more than 8");
    /* bad arguments */
    tb_clear_error();
    assert_null(tb_npy_load(NULL, NULL));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_npy_save(path_of("x.npy"), NULL), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_npy_save(NULL, NULL), TB_ERR_INVALID_ARGUMENT);
}

static void test_save_to_unwritable_path_keeps_old_file(void **state) {
    (void)state;
    float v[2] = {5, 6};
    tb_shape s = tb_shape_of(TB_F32, 1, 2);
    tb_tensor *t = tb_tensor_from_host(v, &s, NULL);
    assert_int_equal(tb_npy_save("/nonexistent-dir/x.npy", t), TB_ERR_IO);
    assert_non_null(strstr(tb_last_error(), "/nonexistent-dir/x.npy"));
    tb_tensor_release(t);
}

static const char *python(void) {
    return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

static void test_numpy_interop(void **state) {
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s -c 'import numpy' >/dev/null 2>&1", python());
    if (system(cmd) != 0) {
        printf("numpy is not installed: skipping the numpy round trip\n");
        skip();
    }
    /* numpy writes, we read */
    snprintf(cmd, sizeof cmd,
             "%s -c \"import numpy as np; np.save('%s', np.arange(12, dtype=np.float64)"
             ".reshape(3, 4) * 1.5); np.save('%s', np.array([[True, False], [False, True]]))\"",
             python(), path_of("np_f64.npy"), path_of("np_bool.npy"));
    assert_int_equal(system(cmd), 0);
    tb_tensor *a = tb_npy_load(path_of("np_f64.npy"), NULL);
    assert_non_null(a);
    double out[12];
    assert_int_equal(tb_tensor_to_host(a, out, sizeof out), TB_OK);
    for (int i = 0; i < 12; ++i)
        assert_true(out[i] == i * 1.5);
    tb_tensor *b = tb_npy_load(path_of("np_bool.npy"), NULL);
    assert_non_null(b);
    tb_shape bs = tb_tensor_shape(b);
    assert_int_equal(bs.dtype, TB_BOOL);
    unsigned char bools[4];
    assert_int_equal(tb_tensor_to_host(b, bools, 4), TB_OK);
    assert_int_equal(bools[0], 1);
    assert_int_equal(bools[1], 0);
    assert_int_equal(bools[3], 1);
    /* we write, numpy reads and checks */
    int64_t vals[6] = {-3, 0, 7, 1LL << 40, 5, -1};
    tb_shape s = tb_shape_of(TB_I64, 2, 2, 3);
    tb_tensor *c = tb_tensor_from_host(vals, &s, NULL);
    assert_int_equal(tb_npy_save(path_of("ours.npy"), c), TB_OK);
    snprintf(cmd, sizeof cmd,
             "%s -c \"import numpy as np, sys; a = np.load('%s'); "
             "sys.exit(0 if a.dtype == np.int64 and a.shape == (2, 3) and "
             "a.tolist() == [[-3, 0, 7], [1 << 40, 5, -1]] else 1)\"",
             python(), path_of("ours.npy"));
    assert_int_equal(system(cmd), 0);
    tb_tensor_release(a);
    tb_tensor_release(b);
    tb_tensor_release(c);
}

static int setup(void **state) {
    (void)state;
    return scratch_make("tb_npy");
}

static int teardown(void **state) {
    (void)state;
    return scratch_remove();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_every_dtype),
        cmocka_unit_test(test_rank0_and_empty),
        cmocka_unit_test(test_header_is_aligned_and_readable),
        cmocka_unit_test(test_version2_and_big_endian),
        cmocka_unit_test(test_malformed_files),
        cmocka_unit_test(test_save_to_unwritable_path_keeps_old_file),
        cmocka_unit_test(test_numpy_interop),
    };
    return cmocka_run_group_tests_name("npy", tests, setup, teardown);
}
