/* Dtypes, scalars and shapes: every function and every error. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

static const tb_dtype all_dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_BOOL};
#define NUM_DTYPES 6

static int reset(void **state) {
    (void)state;
    tb_clear_error();
    return 0;
}

static int shutdown_all(void **state) {
    (void)state;
    tb_shutdown();
    return 0;
}

/* A shape filled with a marker, to check that failing calls leave *out alone. */
static tb_shape marker_shape(void) {
    tb_shape s;
    memset(&s, 0x5a, sizeof s);
    return s;
}

static bool is_marker(const tb_shape *s) {
    tb_shape m = marker_shape();
    return memcmp(s, &m, sizeof m) == 0;
}

static tb_shape make(tb_dtype dtype, int32_t rank, const int64_t *dims) {
    tb_shape s;
    assert_int_equal(tb_shape_make(&s, dtype, rank, dims), TB_OK);
    return s;
}

/* ---- dtypes ---- */

static void test_dtype_names_and_sizes(void **state) {
    static const char *const names[NUM_DTYPES] = {"f32", "f64", "i32", "i64", "u8", "bool"};
    static const size_t sizes[NUM_DTYPES] = {4, 8, 4, 8, 1, 1};
    int i;
    (void)state;
    for (i = 0; i < NUM_DTYPES; i++) {
        tb_dtype parsed;
        assert_string_equal(tb_dtype_name(all_dtypes[i]), names[i]);
        assert_int_equal(tb_dtype_size(all_dtypes[i]), sizes[i]);
        assert_true(tb_dtype_is_valid(all_dtypes[i]));
        assert_int_equal(tb_dtype_parse(names[i], &parsed), TB_OK);
        assert_int_equal(parsed, all_dtypes[i]);
    }
    assert_string_equal(tb_dtype_name(TB_DTYPE_COUNT), "invalid");
    assert_string_equal(tb_dtype_name((tb_dtype)-1), "invalid");
    assert_int_equal(tb_dtype_size(TB_DTYPE_COUNT), 0);
    assert_int_equal(tb_dtype_size((tb_dtype)99), 0);
    assert_false(tb_dtype_is_valid(TB_DTYPE_COUNT));
    assert_false(tb_dtype_is_valid((tb_dtype)-1));

    assert_true(tb_dtype_is_float(TB_F32) && tb_dtype_is_float(TB_F64));
    assert_false(tb_dtype_is_float(TB_I32) || tb_dtype_is_float(TB_BOOL) ||
                 tb_dtype_is_float(TB_DTYPE_COUNT));
    assert_true(tb_dtype_is_integer(TB_I32) && tb_dtype_is_integer(TB_I64) &&
                tb_dtype_is_integer(TB_U8));
    assert_false(tb_dtype_is_integer(TB_BOOL) || tb_dtype_is_integer(TB_F32) ||
                 tb_dtype_is_integer((tb_dtype)-1));
}

static void test_dtype_parse_aliases_and_errors(void **state) {
    static const struct {
        const char *text;
        tb_dtype dtype;
    } aliases[] = {{"float32", TB_F32}, {"float", TB_F32}, {"float64", TB_F64},
                   {"double", TB_F64},  {"int32", TB_I32}, {"int", TB_I32},
                   {"int64", TB_I64},   {"long", TB_I64},  {"uint8", TB_U8}};
    size_t i;
    tb_dtype d = TB_BOOL;
    (void)state;
    for (i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        assert_int_equal(tb_dtype_parse(aliases[i].text, &d), TB_OK);
        assert_int_equal(d, aliases[i].dtype);
    }
    d = TB_BOOL;
    assert_int_equal(tb_dtype_parse("f33", &d), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "tb_dtype_parse: unknown dtype 'f33'"));
    assert_int_equal(d, TB_BOOL);
    assert_int_equal(tb_dtype_parse("F32", &d), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_dtype_parse("", &d), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_dtype_parse(NULL, &d), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_dtype_parse: text is NULL");
    assert_int_equal(tb_dtype_parse("f32", NULL), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_dtype_parse: out is NULL");
}

static void test_dtype_promote_table(void **state) {
    /* PyTorch's order; every pair promotes to the later one of the two */
    static const tb_dtype order[NUM_DTYPES] = {TB_BOOL, TB_U8, TB_I32, TB_I64, TB_F32, TB_F64};
    int i, j;
    (void)state;
    for (i = 0; i < NUM_DTYPES; i++) {
        for (j = 0; j < NUM_DTYPES; j++) {
            tb_dtype expected = order[i > j ? i : j];
            assert_int_equal(tb_dtype_promote(order[i], order[j]), expected);
        }
    }
    /* the cases PyTorch users ask about */
    assert_int_equal(tb_dtype_promote(TB_U8, TB_I32), TB_I32);
    assert_int_equal(tb_dtype_promote(TB_I64, TB_U8), TB_I64);
    assert_int_equal(tb_dtype_promote(TB_I64, TB_F32), TB_F32);
    assert_int_equal(tb_dtype_promote(TB_BOOL, TB_BOOL), TB_BOOL);
    tb_clear_error();
    assert_int_equal(tb_dtype_promote(TB_F32, TB_DTYPE_COUNT), TB_DTYPE_COUNT);
    assert_int_equal(tb_last_status(), TB_ERR_DTYPE);
    assert_non_null(strstr(tb_last_error(), "tb_dtype_promote: invalid dtype 8"));
}

/* ---- scalars ---- */

static void test_scalars(void **state) {
    tb_scalar s;
    unsigned char buf[8];
    float f;
    double d;
    int32_t i32;
    int64_t i64;
    (void)state;
    s = tb_scalar_f(TB_F64, 2.75);
    assert_int_equal(s.dtype, TB_F64);
    assert_true(tb_scalar_as_double(s) == 2.75);
    assert_int_equal(tb_scalar_as_int(s), 2);
    s = tb_scalar_f(TB_F32, -2.75);
    assert_int_equal(tb_scalar_as_int(s), -2); /* truncation */
    s = tb_scalar_f(TB_I32, 3.9);
    assert_int_equal(tb_scalar_as_int(s), 3);
    assert_true(tb_scalar_as_double(s) == 3.0);
    s = tb_scalar_f(TB_BOOL, 0.5);
    assert_int_equal(tb_scalar_as_int(s), 1);
    s = tb_scalar_i(TB_I64, INT64_MIN);
    assert_true(tb_scalar_as_int(s) == INT64_MIN);
    s = tb_scalar_i(TB_U8, 300);
    assert_int_equal(tb_scalar_as_int(s), 300 % 256);
    s = tb_scalar_i(TB_I32, (int64_t)INT32_MAX + 1);
    assert_true(tb_scalar_as_int(s) == INT32_MIN);
    s = tb_scalar_i(TB_F32, 7);
    assert_true(tb_scalar_as_double(s) == 7.0);
    /* out-of-range and NaN floats convert without undefined behaviour */
    s = tb_scalar_f(TB_F64, 1e300);
    assert_true(tb_scalar_as_int(s) == INT64_MAX);
    s = tb_scalar_f(TB_F64, -1e300);
    assert_true(tb_scalar_as_int(s) == INT64_MIN);
    s = tb_scalar_f(TB_F64, NAN);
    assert_int_equal(tb_scalar_as_int(s), 0);
    tb_clear_error();
    s = tb_scalar_f(TB_DTYPE_COUNT, 1.0);
    assert_int_equal(tb_last_status(), TB_ERR_DTYPE);
    assert_non_null(strstr(tb_last_error(), "tb_scalar_f: invalid dtype"));
    s = tb_scalar_i((tb_dtype)-3, 1);
    assert_non_null(strstr(tb_last_error(), "tb_scalar_i: invalid dtype -3"));

    /* element stores */
    tb__scalar_store(tb_scalar_f(TB_F64, 1.5), TB_F32, buf);
    memcpy(&f, buf, 4);
    assert_true(f == 1.5f);
    tb__scalar_store(tb_scalar_f(TB_F64, 1e300), TB_F32, buf);
    memcpy(&f, buf, 4);
    assert_true(isinf(f) && f > 0);
    tb__scalar_store(tb_scalar_i(TB_I64, -5), TB_F64, buf);
    memcpy(&d, buf, 8);
    assert_true(d == -5.0);
    tb__scalar_store(tb_scalar_f(TB_F32, -7.9), TB_I32, buf);
    memcpy(&i32, buf, 4);
    assert_int_equal(i32, -7);
    tb__scalar_store(tb_scalar_i(TB_I64, INT64_MAX), TB_I64, buf);
    memcpy(&i64, buf, 8);
    assert_true(i64 == INT64_MAX);
    tb__scalar_store(tb_scalar_i(TB_I64, 257), TB_U8, buf);
    assert_int_equal(buf[0], 1);
    tb__scalar_store(tb_scalar_f(TB_F64, 0.25), TB_BOOL, buf);
    assert_int_equal(buf[0], 1);
    tb__scalar_store(tb_scalar_f(TB_F64, 0.0), TB_BOOL, buf);
    assert_int_equal(buf[0], 0);
}

/* ---- making and checking shapes ---- */

static void test_shape_make(void **state) {
    const int64_t dims[3] = {2, 3, 4};
    tb_shape s;
    int64_t n;
    size_t bytes;
    (void)state;
    s = make(TB_F32, 3, dims);
    assert_int_equal(s.dtype, TB_F32);
    assert_int_equal(s.rank, 3);
    assert_true(s.dims[0] == 2 && s.dims[1] == 3 && s.dims[2] == 4);
    assert_int_equal(tb_shape_numel(&s, &n), TB_OK);
    assert_true(n == 24);
    assert_int_equal(tb_shape_nbytes(&s, &bytes), TB_OK);
    assert_int_equal(bytes, 96);
    /* rank 0: one element, dims may be NULL */
    s = make(TB_F64, 0, NULL);
    assert_int_equal(tb_shape_numel(&s, &n), TB_OK);
    assert_true(n == 1);
    assert_int_equal(tb_shape_nbytes(&s, &bytes), TB_OK);
    assert_int_equal(bytes, 8);
    /* size-0 dims */
    {
        const int64_t z[2] = {0, 5};
        s = make(TB_BOOL, 2, z);
        assert_int_equal(tb_shape_numel(&s, &n), TB_OK);
        assert_true(n == 0);
        assert_int_equal(tb_shape_nbytes(&s, &bytes), TB_OK);
        assert_int_equal(bytes, 0);
    }
    /* the largest rank */
    {
        const int64_t d8[8] = {1, 2, 1, 2, 1, 2, 1, 2};
        s = make(TB_U8, 8, d8);
        assert_int_equal(tb_shape_numel(&s, &n), TB_OK);
        assert_true(n == 16);
    }
}

static void test_shape_make_errors(void **state) {
    const int64_t dims[9] = {2, -3, 4, 1, 1, 1, 1, 1, 1};
    tb_shape s;
    (void)state;
    assert_int_equal(tb_shape_make(NULL, TB_F32, 1, dims), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_shape_make: out is NULL");

    s = marker_shape();
    assert_int_equal(tb_shape_make(&s, TB_F32, 2, dims), TB_ERR_SHAPE);
    assert_string_equal(tb_last_error(), "tb_shape_make: dim 1 is -3 (dims must be >= 0)");
    assert_true(is_marker(&s));

    assert_int_equal(tb_shape_make(&s, TB_DTYPE_COUNT, 1, dims), TB_ERR_DTYPE);
    assert_string_equal(tb_last_error(), "tb_shape_make: invalid dtype 8");
    assert_int_equal(tb_shape_make(&s, TB_F32, -1, dims), TB_ERR_SHAPE);
    assert_string_equal(tb_last_error(), "tb_shape_make: rank -1 out of range 0..8");
    assert_int_equal(tb_shape_make(&s, TB_F32, 9, dims), TB_ERR_SHAPE);
    assert_string_equal(tb_last_error(), "tb_shape_make: rank 9 out of range 0..8");
    assert_int_equal(tb_shape_make(&s, TB_F32, 2, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_shape_make: dims is NULL for rank 2");
    assert_true(is_marker(&s));
}

static void test_shape_overflow(void **state) {
    tb_shape s = marker_shape(), ok;
    int64_t n;
    size_t bytes;
    (void)state;
    {
        const int64_t dims[2] = {INT64_MAX, 2};
        assert_int_equal(tb_shape_make(&s, TB_F32, 2, dims), TB_ERR_OVERFLOW);
        assert_string_equal(tb_last_error(),
                            "tb_shape_make: f32[9223372036854775807,2] has more elements than "
                            "fit in int64");
        assert_true(is_marker(&s));
    }
    {
        /* 2^62 elements fit in int64; 2^65 bytes do not fit in size_t */
        const int64_t dims[1] = {INT64_C(1) << 62};
        assert_int_equal(tb_shape_make(&s, TB_F64, 1, dims), TB_ERR_OVERFLOW);
        assert_non_null(strstr(tb_last_error(), "does not fit in int64 and size_t"));
        assert_true(is_marker(&s));
        ok = make(TB_U8, 1, dims);
        assert_int_equal(tb_shape_nbytes(&ok, &bytes), TB_OK);
        assert_true((uint64_t)bytes == (UINT64_C(1) << 62));
    }
    {
        /* an empty shape obeys the same limit with its 0 dims read as 1 (so that its strides
           fit); within it, its element count is 0 */
        const int64_t dims[3] = {INT64_MAX, INT64_MAX, 0};
        const int64_t fits[3] = {INT64_C(1) << 29, INT64_C(1) << 30, 0};
        assert_int_equal(tb_shape_make(&s, TB_F64, 3, dims), TB_ERR_OVERFLOW);
        assert_true(is_marker(&s));
        ok = make(TB_F64, 3, fits);
        assert_int_equal(tb_shape_numel(&ok, &n), TB_OK);
        assert_true(n == 0);
    }
    {
        /* the limit itself */
        const int64_t dims[1] = {INT64_MAX};
        ok = make(TB_U8, 1, dims);
        assert_int_equal(tb_shape_numel(&ok, &n), TB_OK);
        assert_true(n == INT64_MAX);
    }
    {
        /* hand-built shapes are checked too */
        tb_shape h;
        memset(&h, 0, sizeof h);
        h.dtype = TB_F32;
        h.rank = 3;
        h.dims[0] = INT64_C(1) << 31;
        h.dims[1] = INT64_C(1) << 31;
        h.dims[2] = INT64_C(1) << 31;
        n = -7;
        assert_int_equal(tb_shape_numel(&h, &n), TB_ERR_OVERFLOW);
        assert_true(n == -7);
        assert_non_null(strstr(tb_last_error(), "tb_shape_numel: f32[2147483648,2147483648,"));
        assert_int_equal(tb_shape_nbytes(&h, &bytes), TB_ERR_OVERFLOW);
        assert_int_equal(tb_shape_validate(&h), TB_ERR_OVERFLOW);
        assert_non_null(strstr(tb_last_error(), "tb_shape_validate: "));
    }
}

static void test_shape_of(void **state) {
    tb_shape s;
    (void)state;
    s = tb_shape_of(TB_F32, 2, 3, 4);
    assert_int_equal(s.rank, 2);
    assert_true(s.dims[0] == 3 && s.dims[1] == 4);
    assert_int_equal(s.dtype, TB_F32);
    s = tb_shape_of(TB_I64, 0);
    assert_int_equal(s.rank, 0);
    s = tb_shape_of(TB_U8, 8, 1, 2, 3, 4, 5, 6, 7, 8);
    assert_int_equal(s.rank, 8);
    assert_true(s.dims[7] == 8);
    tb_clear_error();
    s = tb_shape_of(TB_F32, 2, 3, -4);
    assert_int_equal(s.rank, -1);
    assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
    assert_string_equal(tb_last_error(), "tb_shape_of: dim 1 is -4 (dims must be >= 0)");
    assert_int_equal(tb_shape_validate(&s), TB_ERR_SHAPE); /* rank -1 is rejected everywhere */
    s = tb_shape_of(TB_F32, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1);
    assert_int_equal(s.rank, -1);
    assert_string_equal(tb_last_error(), "tb_shape_of: rank 9 out of range 0..8");
    s = tb_shape_of((tb_dtype)17, 1, 1);
    assert_int_equal(s.rank, -1);
    assert_int_equal(tb_last_status(), TB_ERR_DTYPE);
}

/* Dims of any integer type are read whole (int64_t variables, dims past INT_MAX), and a count
   of dims that is not the rank is an error, not a shape made of whatever the stack held. */
static void test_shape_of_int64_dims(void **state) {
    int64_t big = (int64_t)1 << 40, n = 0;
    size_t three = 3;
    tb_shape s;
    (void)state;
    s = tb_shape_of(TB_F32, 1, big);
    assert_int_equal(s.rank, 1);
    assert_true(s.dims[0] == big);
    assert_int_equal(tb_shape_numel(&s, &n), TB_OK);
    assert_true(n == big);
    s = tb_shape_of(TB_U8, 2, three, (int64_t)1 << 33);
    assert_true(s.rank == 2 && s.dims[0] == 3 && s.dims[1] == ((int64_t)1 << 33));
    s = tb_shape_of(TB_F32, 2, big, big); /* 2^80 elements */
    assert_int_equal(s.rank, -1);
    assert_int_equal(tb_last_status(), TB_ERR_OVERFLOW);
    tb_clear_error();
    s = tb_shape_of(TB_F32, 2, 3);
    assert_int_equal(s.rank, -1);
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_shape_of: rank 2 but 1 dims given");
    s = tb_shape_of(TB_F32, 1, 3, 4);
    assert_int_equal(s.rank, -1);
    assert_string_equal(tb_last_error(), "tb_shape_of: rank 1 but 2 dims given");
    assert_int_equal(tb_shape_of_dims(TB_F32, 0, NULL).rank, -1);
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    /* the function behind the macro, as a caller through a symbol reaches it */
    s = (tb_shape_of)(TB_F32, 2, 5, 6);
    assert_true(s.rank == 2 && s.dims[0] == 5 && s.dims[1] == 6);
}

static void test_shape_null_arguments(void **state) {
    tb_shape s = tb_shape_of(TB_F32, 1, 2), out;
    int64_t n, strides[TB_MAX_RANK];
    size_t b;
    (void)state;
    assert_int_equal(tb_shape_numel(NULL, &n), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_shape_numel: shape is NULL");
    assert_int_equal(tb_shape_numel(&s, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_shape_numel: out is NULL");
    assert_int_equal(tb_shape_nbytes(NULL, &b), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_shape_nbytes(&s, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_shape_validate(NULL), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_shape_validate: shape is NULL");
    assert_int_equal(tb_shape_broadcast(NULL, &s, &out), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_shape_broadcast: a is NULL");
    assert_int_equal(tb_shape_broadcast(&s, NULL, &out), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_shape_broadcast(&s, &s, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_shape_strides(NULL, strides), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_shape_strides(&s, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_shape_parse(NULL, &out), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_shape_parse: text is NULL");
    assert_int_equal(tb_shape_parse("f32[]", NULL), TB_ERR_INVALID_ARGUMENT);
    tb_clear_error();
    assert_int_equal(tb_shape_format(NULL, NULL, 0), 0);
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_false(tb_shape_equal(NULL, &s));
    assert_false(tb_shape_equal(&s, NULL));
    assert_false(tb_shape_equal(NULL, NULL));
}

static void test_shape_equal(void **state) {
    tb_shape a = tb_shape_of(TB_F32, 2, 2, 3), b = a, c;
    (void)state;
    assert_true(tb_shape_equal(&a, &b));
    b.dims[5] = 99; /* beyond the rank: ignored */
    assert_true(tb_shape_equal(&a, &b));
    c = tb_shape_of(TB_F64, 2, 2, 3);
    assert_false(tb_shape_equal(&a, &c));
    c = tb_shape_of(TB_F32, 2, 3, 2);
    assert_false(tb_shape_equal(&a, &c));
    c = tb_shape_of(TB_F32, 3, 2, 3, 1);
    assert_false(tb_shape_equal(&a, &c));
    a = tb_shape_of(TB_I32, 0);
    b = tb_shape_of(TB_I32, 0);
    assert_true(tb_shape_equal(&a, &b));
}

/* ---- broadcasting ---- */

typedef struct bcast_case {
    const char *a, *b, *expected; /* expected NULL: they do not broadcast */
} bcast_case;

static void test_shape_broadcast_table(void **state) {
    static const bcast_case cases[] = {
        {"f32[2,3]", "f32[2,3]", "f32[2,3]"},
        {"f32[2,3]", "f32[3]", "f32[2,3]"},
        {"f32[2,1]", "f32[1,3]", "f32[2,3]"},
        {"f32[]", "f32[2,3]", "f32[2,3]"},
        {"f32[2,3]", "f32[]", "f32[2,3]"},
        {"f32[]", "f32[]", "f32[]"},
        {"f32[4,1,5]", "f32[3,1]", "f32[4,3,5]"},
        {"f32[0]", "f32[1]", "f32[0]"},
        {"f32[1]", "f32[0]", "f32[0]"},
        {"f32[2,0]", "f32[3,1,1]", "f32[3,2,0]"},
        {"f32[0,4]", "f32[4]", "f32[0,4]"},
        {"f32[1,1,1,1,1,1,1,7]", "f32[2,1,1,1,1,1,1,1]", "f32[2,1,1,1,1,1,1,7]"},
        {"u8[3]", "i32[3]", "i32[3]"},
        {"bool[2,1]", "f64[2]", "f64[2,2]"},
        {"i64[1]", "f32[1]", "f32[1]"},
        {"f32[2,3]", "f32[4]", NULL},
        {"f32[0]", "f32[3]", NULL},
        {"f32[2]", "f32[3,3]", NULL},
        {"f32[2,3,4]", "f32[5,1]", NULL},
    };
    size_t i;
    (void)state;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tb_shape a, b, out = marker_shape(), expected;
        tb_status st;
        assert_int_equal(tb_shape_parse(cases[i].a, &a), TB_OK);
        assert_int_equal(tb_shape_parse(cases[i].b, &b), TB_OK);
        st = tb_shape_broadcast(&a, &b, &out);
        if (cases[i].expected != NULL) {
            char text[96];
            assert_int_equal(st, TB_OK);
            assert_int_equal(tb_shape_parse(cases[i].expected, &expected), TB_OK);
            tb_shape_format(&out, text, sizeof text);
            if (!tb_shape_equal(&out, &expected)) {
                fail_msg("%s with %s gave %s, expected %s", cases[i].a, cases[i].b, text,
                         cases[i].expected);
            }
        } else {
            char message[256];
            assert_int_equal(st, TB_ERR_SHAPE);
            snprintf(message, sizeof message,
                     "tb_shape_broadcast: shapes %s and %s do not broadcast", cases[i].a,
                     cases[i].b);
            assert_string_equal(tb_last_error(), message);
            assert_true(is_marker(&out));
        }
    }
}

static void test_shape_broadcast_overflow(void **state) {
    tb_shape a = marker_shape(), b, out = marker_shape();
    const int64_t da[2] = {INT64_C(1) << 40, 1}, db[2] = {1, INT64_C(1) << 40};
    (void)state;
    a = make(TB_U8, 2, da);
    b = make(TB_U8, 2, db);
    assert_int_equal(tb_shape_broadcast(&a, &b, &out), TB_ERR_OVERFLOW);
    assert_non_null(strstr(tb_last_error(), "tb_shape_broadcast: "));
    assert_true(is_marker(&out));
    /* invalid operands are reported as such */
    a.rank = -1;
    assert_int_equal(tb_shape_broadcast(&a, &b, &out), TB_ERR_SHAPE);
    assert_string_equal(tb_last_error(), "tb_shape_broadcast: rank -1 out of range 0..8");
}

/* ---- strides ---- */

static void test_shape_strides(void **state) {
    int64_t st[TB_MAX_RANK];
    tb_shape s;
    (void)state;
    s = tb_shape_of(TB_F32, 3, 2, 3, 4);
    assert_int_equal(tb_shape_strides(&s, st), TB_OK);
    assert_true(st[0] == 12 && st[1] == 4 && st[2] == 1);
    assert_true(st[3] == 0 && st[7] == 0);
    s = tb_shape_of(TB_F32, 3, 2, 0, 3); /* PyTorch: (3, 3, 1) */
    assert_int_equal(tb_shape_strides(&s, st), TB_OK);
    assert_true(st[0] == 3 && st[1] == 3 && st[2] == 1);
    s = tb_shape_of(TB_F32, 0);
    assert_int_equal(tb_shape_strides(&s, st), TB_OK);
    assert_true(st[0] == 0);
    s = tb_shape_of(TB_F32, 1, 5);
    assert_int_equal(tb_shape_strides(&s, st), TB_OK);
    assert_true(st[0] == 1);
    {
        /* empty, yet the strides would not fit: not a valid shape (built by hand) */
        memset(&s, 0, sizeof s);
        s.dtype = TB_F32;
        s.rank = 3;
        s.dims[1] = INT64_C(1) << 40;
        s.dims[2] = INT64_C(1) << 40;
        st[0] = 77;
        assert_int_equal(tb_shape_strides(&s, st), TB_ERR_OVERFLOW);
        assert_true(st[0] == 77);
        assert_non_null(strstr(tb_last_error(), "tb_shape_strides: "));
    }
}

/* ---- text ---- */

static void test_shape_format(void **state) {
    char buf[64];
    tb_shape s = tb_shape_of(TB_F32, 2, 2, 3);
    (void)state;
    assert_int_equal(tb_shape_format(&s, buf, sizeof buf), 8);
    assert_string_equal(buf, "f32[2,3]");
    assert_int_equal(tb_shape_format(&s, NULL, 0), 8);
    memset(buf, 'z', sizeof buf);
    assert_int_equal(tb_shape_format(&s, buf, 5), 8); /* cut like snprintf */
    assert_string_equal(buf, "f32[");
    assert_int_equal(tb_shape_format(&s, buf, 1), 8);
    assert_string_equal(buf, "");
    s = tb_shape_of(TB_BOOL, 0);
    tb_shape_format(&s, buf, sizeof buf);
    assert_string_equal(buf, "bool[]");
    s = tb_shape_of(TB_I64, 1, 0);
    tb_shape_format(&s, buf, sizeof buf);
    assert_string_equal(buf, "i64[0]");
    s.rank = 12;
    tb_shape_format(&s, buf, sizeof buf);
    assert_string_equal(buf, "i64[rank 12]");
}

static void test_shape_text_cut(void **state) {
    char buf[96];
    tb_shape s;
    int i;
    size_t n;
    (void)state;
    memset(&s, 0, sizeof s);
    s.dtype = TB_BOOL;
    s.rank = 8;
    for (i = 0; i < 8; i++)
        s.dims[i] = INT64_MAX;
    n = tb__shape_text(&s, buf);
    assert_int_equal(n, strlen(buf));
    assert_true(n <= 95);
    assert_true(strncmp(buf, "bool[9223372036854775807,", 25) == 0);
    assert_string_equal(buf + n - 4, "...]");
    s = tb_shape_of(TB_F32, 2, 2, 3);
    assert_int_equal(tb__shape_text(&s, buf), 8);
    assert_string_equal(buf, "f32[2,3]");
}

static void test_shape_parse_round_trips(void **state) {
    int d, rank, i;
    (void)state;
    for (d = 0; d < NUM_DTYPES; d++) {
        for (rank = 0; rank <= TB_MAX_RANK; rank++) {
            int64_t dims[TB_MAX_RANK];
            tb_shape s, back;
            char text[256], again[256];
            for (i = 0; i < rank; i++)
                dims[i] = (i * 7 + d) % 5; /* includes 0 and 1 */
            s = make(all_dtypes[d], rank, dims);
            tb_shape_format(&s, text, sizeof text);
            assert_int_equal(tb_shape_parse(text, &back), TB_OK);
            assert_true(tb_shape_equal(&s, &back));
            tb_shape_format(&back, again, sizeof again);
            assert_string_equal(text, again);
        }
    }
    {
        tb_shape s;
        assert_int_equal(tb_shape_parse("u8[9223372036854775807]", &s), TB_OK);
        assert_true(s.dtype == TB_U8 && s.rank == 1 && s.dims[0] == INT64_MAX);
    }
}

static void test_shape_parse_whitespace_and_aliases(void **state) {
    tb_shape s;
    (void)state;
    assert_int_equal(tb_shape_parse("f32[ 2 , 3 ]", &s), TB_OK);
    assert_true(s.rank == 2 && s.dims[0] == 2 && s.dims[1] == 3 && s.dtype == TB_F32);
    assert_int_equal(tb_shape_parse("i64[\t4]", &s), TB_OK);
    assert_true(s.rank == 1 && s.dims[0] == 4 && s.dtype == TB_I64);
    assert_int_equal(tb_shape_parse("f64[ ]", &s), TB_OK);
    assert_true(s.rank == 0 && s.dtype == TB_F64);
    assert_int_equal(tb_shape_parse("float32[007]", &s), TB_OK);
    assert_true(s.rank == 1 && s.dims[0] == 7 && s.dtype == TB_F32);
}

static void test_shape_parse_errors(void **state) {
    static const struct {
        const char *text;
        tb_status status;
        const char *message; /* a part of it */
    } cases[] = {
        {"f32[2,", TB_ERR_INVALID_ARGUMENT, "expected a dim (a number >= 0) at position 6"},
        {"f32[-1]", TB_ERR_INVALID_ARGUMENT, "at position 4"},
        {"f33[2]", TB_ERR_INVALID_ARGUMENT, "unknown dtype at position 0"},
        {"f32[2]x", TB_ERR_INVALID_ARGUMENT, "unexpected text at position 6"},
        {"f32[2] ", TB_ERR_INVALID_ARGUMENT, "unexpected text at position 6"},
        {" f32[2]", TB_ERR_INVALID_ARGUMENT, "unknown dtype"},
        {"f32", TB_ERR_INVALID_ARGUMENT, "expected '[' at position 3"},
        {"f32 [2]", TB_ERR_INVALID_ARGUMENT, "expected '[' at position 3"},
        {"", TB_ERR_INVALID_ARGUMENT, "unknown dtype"},
        {"[2]", TB_ERR_INVALID_ARGUMENT, "unknown dtype"},
        {"f32[2,,3]", TB_ERR_INVALID_ARGUMENT, "position 6"},
        {"f32[2 3]", TB_ERR_INVALID_ARGUMENT, "expected ',' or ']' at position 6"},
        {"f32[+2]", TB_ERR_INVALID_ARGUMENT, "position 4"},
        {"f32[2.0]", TB_ERR_INVALID_ARGUMENT, "position 5"},
        {"f32[0x10]", TB_ERR_INVALID_ARGUMENT, "position 5"},
        {"f32[2]]", TB_ERR_INVALID_ARGUMENT, "position 6"},
        {"f32[1,1,1,1,1,1,1,1,1]", TB_ERR_INVALID_ARGUMENT, "more than 8 dims"},
        {"f32[9223372036854775808]", TB_ERR_OVERFLOW, "does not fit in int64"},
        {"f32[99999999999999999999999]", TB_ERR_OVERFLOW, "does not fit in int64"},
        {"f32[9223372036854775807,2]", TB_ERR_OVERFLOW, "more elements than fit in int64"},
    };
    size_t i;
    (void)state;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tb_shape s = marker_shape();
        tb_status st = tb_shape_parse(cases[i].text, &s);
        if (st != cases[i].status || strstr(tb_last_error(), cases[i].message) == NULL ||
            strncmp(tb_last_error(), "tb_shape_parse: ", 16) != 0) {
            fail_msg("'%s': status %d, message '%s'", cases[i].text, (int)st, tb_last_error());
        }
        assert_true(is_marker(&s));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_dtype_names_and_sizes, reset, NULL),
        cmocka_unit_test_setup_teardown(test_dtype_parse_aliases_and_errors, reset, NULL),
        cmocka_unit_test_setup_teardown(test_dtype_promote_table, reset, NULL),
        cmocka_unit_test_setup_teardown(test_scalars, reset, NULL),
        cmocka_unit_test_setup_teardown(test_shape_make, reset, NULL),
        cmocka_unit_test_setup_teardown(test_shape_make_errors, reset, NULL),
        cmocka_unit_test_setup_teardown(test_shape_overflow, reset, NULL),
        cmocka_unit_test_setup_teardown(test_shape_of, reset, NULL),
        cmocka_unit_test_setup_teardown(test_shape_of_int64_dims, reset, NULL),
        cmocka_unit_test_setup_teardown(test_shape_null_arguments, reset, NULL),
        cmocka_unit_test_setup_teardown(test_shape_equal, reset, NULL),
        cmocka_unit_test_setup_teardown(test_shape_broadcast_table, reset, NULL),
        cmocka_unit_test_setup_teardown(test_shape_broadcast_overflow, reset, NULL),
        cmocka_unit_test_setup_teardown(test_shape_strides, reset, NULL),
        cmocka_unit_test_setup_teardown(test_shape_format, reset, NULL),
        cmocka_unit_test_setup_teardown(test_shape_text_cut, reset, NULL),
        cmocka_unit_test_setup_teardown(test_shape_parse_round_trips, reset, NULL),
        cmocka_unit_test_setup_teardown(test_shape_parse_whitespace_and_aliases, reset, NULL),
        cmocka_unit_test_setup_teardown(test_shape_parse_errors, reset, NULL),
    };
    return cmocka_run_group_tests(tests, NULL, shutdown_all);
}
