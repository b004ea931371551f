/* The op functions through the public API: result shapes and dtypes (PyTorch's rules, awkward
   shapes: rank 0, size 0, size 1, broadcasting, negative axes), type promotion with rank-0
   tensors and host numbers, the nodes recorded, and every error message. Values are tested
   against the reference backend elsewhere; nothing here syncs. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

static int setup(void **state) {
    (void)state;
    tb_clear_error();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tb_shutdown();
    return 0;
}

/* A tensor of zeros of a shape given as text ("f32[2,3]") on `device` (NULL: current). */
static tb_tensor *mk_on(const char *text, const tb_device *device) {
    tb_shape shape;
    size_t nbytes = 0;
    void *buf;
    tb_tensor *t;
    if (tb_shape_parse(text, &shape) != TB_OK) fail_msg("bad shape text %s", text);
    assert_int_equal(tb_shape_nbytes(&shape, &nbytes), TB_OK);
    buf = calloc(1, nbytes > 0 ? nbytes : 1);
    assert_non_null(buf);
    t = tb_tensor_from_host(buf, &shape, device);
    free(buf);
    if (t == NULL) fail_msg("tb_tensor_from_host(%s): %s", text, tb_last_error());
    return t;
}

static tb_tensor *mk(const char *text) {
    return mk_on(text, NULL);
}

static tb_shape shp(const char *text) {
    tb_shape shape;
    if (tb_shape_parse(text, &shape) != TB_OK) fail_msg("bad shape text %s", text);
    return shape;
}

static tb_scalar sc_f(tb_dtype dtype, double v) {
    tb_scalar s;
    memset(&s, 0, sizeof s);
    s.dtype = dtype;
    s.f = v;
    return s;
}

static tb_scalar sc_i(tb_dtype dtype, int64_t v) {
    tb_scalar s;
    memset(&s, 0, sizeof s);
    s.dtype = dtype;
    s.i = v;
    return s;
}

/* Checks the result's shape text and releases it. */
static void expect_shape_at(tb_tensor *t, const char *want, int line) {
    char got[96];
    tb_shape s;
    if (t == NULL) fail_msg("line %d: expected %s, got NULL: %s", line, want, tb_last_error());
    s = tb_tensor_shape(t);
    tb_shape_format(&s, got, sizeof got);
    if (strcmp(got, want) != 0) fail_msg("line %d: expected %s, got %s", line, want, got);
    tb_tensor_release(t);
}
#define expect_shape(t, want) expect_shape_at((t), (want), __LINE__)

/* Checks that an op failed with `status` and a message holding each of the given parts, then
   clears the error. */
static void expect_error_at(tb_tensor *t, tb_status status, const char *p1, const char *p2,
                            const char *p3, int line) {
    const char *parts[3];
    int i;
    parts[0] = p1;
    parts[1] = p2;
    parts[2] = p3;
    if (t != NULL) {
        char got[96];
        tb_shape s = tb_tensor_shape(t);
        tb_shape_format(&s, got, sizeof got);
        tb_tensor_release(t);
        fail_msg("line %d: expected an error, got a tensor %s", line, got);
    }
    if (tb_last_status() != status) {
        fail_msg("line %d: expected %s, got %s: %s", line, tb_status_string(status),
                 tb_status_string(tb_last_status()), tb_last_error());
    }
    for (i = 0; i < 3; i++) {
        if (parts[i] != NULL && strstr(tb_last_error(), parts[i]) == NULL) {
            fail_msg("line %d: error '%s' does not contain '%s'", line, tb_last_error(), parts[i]);
        }
    }
    tb_clear_error();
}
#define expect_error(t, st, p1, p2, p3) expect_error_at((t), (st), (p1), (p2), (p3), __LINE__)

static const tb_dtype all_dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_BOOL};
#define NUM_DTYPES 6

static tb_tensor *mk_dtype(tb_dtype dtype, const char *dims) {
    char text[64];
    snprintf(text, sizeof text, "%s%s", tb_dtype_name(dtype), dims);
    return mk(text);
}

/* PyTorch's promotion of two dimensioned tensors, written out as a table (independent of the
   library's tb_dtype_promote). Order: f32 f64 i32 i64 u8 bool. */
static const tb_dtype promote_table[NUM_DTYPES][NUM_DTYPES] = {
    /* f32 */ {TB_F32, TB_F64, TB_F32, TB_F32, TB_F32, TB_F32},
    /* f64 */ {TB_F64, TB_F64, TB_F64, TB_F64, TB_F64, TB_F64},
    /* i32 */ {TB_F32, TB_F64, TB_I32, TB_I64, TB_I32, TB_I32},
    /* i64 */ {TB_F32, TB_F64, TB_I64, TB_I64, TB_I64, TB_I64},
    /* u8  */ {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_U8},
    /* bool */ {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_BOOL},
};

static bool is_float(tb_dtype d) {
    return d == TB_F32 || d == TB_F64;
}

static const tb_node *operand(const tb_tensor *t, size_t i) {
    return tb_node_operand(tb_tensor_node(t), i);
}

/* ---- unary ---- */

typedef tb_tensor *(*unary_fn)(tb_tensor *);

typedef struct unary_case {
    const char *name;
    unary_fn fn;
    int kind; /* 0: float op (ints -> f32), 1: float only (ints rejected), 2: keeps dtype, no
                 bool, 3: keeps any dtype, 4: logical (-> bool) */
} unary_case;

static const unary_case unary_cases[] = {
    {"tb_neg", tb_neg, 2},
    {"tb_abs", tb_abs, 2},
    {"tb_exp", tb_exp, 0},
    {"tb_log", tb_log, 0},
    {"tb_sqrt", tb_sqrt, 0},
    {"tb_rsqrt", tb_rsqrt, 0},
    {"tb_sin", tb_sin, 0},
    {"tb_cos", tb_cos, 0},
    {"tb_tanh", tb_tanh, 0},
    {"tb_sigmoid", tb_sigmoid, 0},
    {"tb_relu", tb_relu, 2},
    {"tb_gelu", tb_gelu, 1},
    {"tb_erf", tb_erf, 0},
    {"tb_silu", tb_silu, 1},
    {"tb_softplus", tb_softplus, 1},
    {"tb_mish", tb_mish, 1},
    {"tb_reciprocal", tb_reciprocal, 0},
    {"tb_floor", tb_floor, 2},
    {"tb_ceil", tb_ceil, 2},
    {"tb_round", tb_round, 2},
    {"tb_sign", tb_sign, 3},
    {"tb_logical_not", tb_logical_not, 4},
};

static void test_unary_dtypes(void **state) {
    size_t c, d;
    const char *dims[] = {"[2,3]", "[]", "[0,4]", "[1]"};
    (void)state;
    for (c = 0; c < sizeof unary_cases / sizeof unary_cases[0]; c++) {
        const unary_case *u = &unary_cases[c];
        for (d = 0; d < NUM_DTYPES; d++) {
            tb_dtype dt = all_dtypes[d];
            size_t k;
            for (k = 0; k < 4; k++) {
                tb_tensor *x = mk_dtype(dt, dims[k]);
                tb_tensor *r = u->fn(x);
                char want[64], in[64];
                tb_dtype out = dt;
                bool error = false;
                snprintf(in, sizeof in, "%s%s", tb_dtype_name(dt), dims[k]);
                switch (u->kind) {
                case 0:
                    out = is_float(dt) ? dt : TB_F32;
                    break;
                case 1:
                    error = !is_float(dt);
                    break;
                case 2:
                    error = dt == TB_BOOL;
                    break;
                case 4:
                    out = TB_BOOL;
                    break;
                default:
                    break;
                }
                if (error) {
                    expect_error(r, TB_ERR_DTYPE, u->name, in, NULL);
                } else {
                    snprintf(want, sizeof want, "%s%s", tb_dtype_name(out), dims[k]);
                    expect_shape(r, want);
                }
                tb_tensor_release(x);
            }
        }
    }
}

static void test_unary_nodes(void **state) {
    tb_tensor *i = mk("i32[3]"), *f = mk("f64[3]"), *r;
    (void)state;
    /* an integer input of a float op is cast to f32 first */
    r = tb_exp(i);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_EXP);
    assert_int_equal(tb_node_op(operand(r, 0)), TB_OP_CAST);
    assert_int_equal(tb_node_attr(operand(r, 0), 0), TB_F32);
    tb_tensor_release(r);
    r = tb_exp(f);
    assert_int_equal(tb_node_op(operand(r, 0)), TB_OP_DEVICE_DATA);
    tb_tensor_release(r);
    r = tb_logical_not(f);
    assert_int_equal(tb_node_op(operand(r, 0)), TB_OP_CAST);
    assert_int_equal(tb_node_attr(operand(r, 0), 0), TB_BOOL);
    tb_tensor_release(r);

    /* cast */
    expect_shape(tb_cast(i, TB_U8), "u8[3]");
    expect_shape(tb_cast(i, TB_I32), "i32[3]");
    r = tb_cast(f, TB_BOOL);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_CAST);
    assert_int_equal(tb_node_attr(tb_tensor_node(r), 0), TB_BOOL);
    expect_shape(r, "bool[3]");
    expect_error(tb_cast(i, (tb_dtype)42), TB_ERR_DTYPE, "tb_cast", "42", NULL);
    expect_error(tb_cast(i, (tb_dtype)-1), TB_ERR_DTYPE, "tb_cast", NULL, NULL);
    tb_tensor_release(i);
    tb_tensor_release(f);
}

/* ---- binary ---- */

typedef tb_tensor *(*binary_fn)(tb_tensor *, tb_tensor *);

static void test_binary_promotion_table(void **state) {
    size_t a, b;
    (void)state;
    for (a = 0; a < NUM_DTYPES; a++) {
        for (b = 0; b < NUM_DTYPES; b++) {
            tb_dtype da = all_dtypes[a], db = all_dtypes[b];
            tb_dtype p = promote_table[a][b];
            tb_tensor *x = mk_dtype(da, "[2,1]"), *y = mk_dtype(db, "[3]");
            char want[32];
            tb_tensor *r;

            snprintf(want, sizeof want, "%s[2,3]", tb_dtype_name(p));
            expect_shape(tb_add(x, y), want);
            expect_shape(tb_mul(x, y), want);
            expect_shape(tb_maximum(x, y), want);
            expect_shape(tb_minimum(x, y), want);
            if (p == TB_BOOL) {
                expect_error(tb_sub(x, y), TB_ERR_DTYPE, "tb_sub", "bool[2,1] and bool[3]", NULL);
                expect_error(tb_pow(x, y), TB_ERR_DTYPE, "tb_pow", "bool[2,1]", NULL);
            } else {
                expect_shape(tb_sub(x, y), want);
                expect_shape(tb_pow(x, y), want);
            }
            snprintf(want, sizeof want, "%s[2,3]", tb_dtype_name(is_float(p) ? p : TB_F32));
            expect_shape(tb_div(x, y), want);
            expect_shape(tb_eq(x, y), "bool[2,3]");
            expect_shape(tb_ne(x, y), "bool[2,3]");
            expect_shape(tb_lt(x, y), "bool[2,3]");
            expect_shape(tb_le(x, y), "bool[2,3]");
            expect_shape(tb_gt(x, y), "bool[2,3]");
            expect_shape(tb_ge(x, y), "bool[2,3]");
            expect_shape(tb_logical_and(x, y), "bool[2,3]");
            expect_shape(tb_logical_or(x, y), "bool[2,3]");

            /* both operands of the node already have the compute dtype */
            r = tb_add(x, y);
            assert_int_equal(tb_node_shape(operand(r, 0))->dtype, p);
            assert_int_equal(tb_node_shape(operand(r, 1))->dtype, p);
            tb_tensor_release(r);
            r = tb_lt(x, y);
            assert_int_equal(tb_node_shape(operand(r, 0))->dtype, p);
            assert_int_equal(tb_node_shape(operand(r, 1))->dtype, p);
            tb_tensor_release(r);
            r = tb_logical_and(x, y);
            assert_int_equal(tb_node_shape(operand(r, 0))->dtype, TB_BOOL);
            assert_int_equal(tb_node_shape(operand(r, 1))->dtype, TB_BOOL);
            tb_tensor_release(r);
            tb_tensor_release(x);
            tb_tensor_release(y);
        }
    }
}

static void test_binary_wrapped_and_rank0(void **state) {
    tb_tensor *i32 = mk("i32[3]"), *f32 = mk("f32[3]"), *f64 = mk("f64[3]"), *b = mk("bool[3]");
    tb_tensor *u8 = mk("u8[3]"), *i64 = mk("i64[3]");
    tb_tensor *s_f64 = tb_scalar_tensor(sc_f(TB_F64, 2.5), NULL);
    tb_tensor *s_i64 = tb_scalar_tensor(sc_i(TB_I64, 2), NULL);
    tb_tensor *s_i32 = tb_scalar_tensor(sc_i(TB_I32, 2), NULL);
    tb_tensor *s_bool = tb_scalar_tensor(sc_i(TB_BOOL, 1), NULL);
    tb_tensor *h_f64 = mk("f64[]"), *h_i32 = mk("i32[]");
    tb_tensor *r;
    (void)state;
    assert_non_null(s_f64);
    assert_non_null(s_i64);

    /* host numbers (Python floats): the default dtype f32 for integer and bool tensors */
    expect_shape(tb_add_scalar(i32, 2.5), "f32[3]");
    expect_shape(tb_add_scalar(i64, 2.0), "f32[3]");
    expect_shape(tb_add_scalar(u8, 1.0), "f32[3]");
    expect_shape(tb_add_scalar(b, 1.0), "f32[3]");
    expect_shape(tb_add_scalar(f32, 1e300), "f32[3]");
    expect_shape(tb_add_scalar(f64, 2.5), "f64[3]");
    expect_shape(tb_sub_scalar(b, 1.0), "f32[3]");
    expect_shape(tb_mul_scalar(i32, 3.0), "f32[3]");
    expect_shape(tb_div_scalar(i64, 2.0), "f32[3]");
    expect_shape(tb_pow_scalar(i32, 2.0), "f32[3]");
    expect_shape(tb_add_scalar(h_i32, 2.5), "f32[]");
    expect_shape(tb_add_scalar(h_f64, 2.5), "f64[]");

    /* rank-0 tensors do not promote a dimensioned tensor of the same kind */
    expect_shape(tb_add(f32, s_f64), "f32[3]");
    expect_shape(tb_add(s_f64, f32), "f32[3]");
    expect_shape(tb_add(f32, h_f64), "f32[3]");
    expect_shape(tb_add(i32, s_i64), "i32[3]");
    expect_shape(tb_add(u8, s_i32), "u8[3]");
    expect_shape(tb_mul(u8, s_bool), "u8[3]");
    /* ... but do when they are of a higher kind */
    expect_shape(tb_add(i32, s_f64), "f64[3]");
    expect_shape(tb_add(i32, h_f64), "f64[3]");
    expect_shape(tb_add(b, s_i64), "i64[3]");
    expect_shape(tb_add(b, s_i32), "i32[3]");
    /* two rank-0 tensors promote normally */
    expect_shape(tb_add(s_i32, s_f64), "f64[]");
    expect_shape(tb_add(h_i32, s_i64), "i64[]");
    expect_shape(tb_eq(i32, s_f64), "bool[3]");
    expect_shape(tb_div(s_i32, s_i64), "f32[]");

    /* a host number is a wrapped SCALAR operand of the result dtype */
    r = tb_mul_scalar(f64, 0.5);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_MUL);
    assert_int_equal(tb_node_op(operand(r, 1)), TB_OP_SCALAR);
    assert_int_equal(tb_node_shape(operand(r, 1))->dtype, TB_F64);
    {
        tb_scalar v;
        assert_int_equal(tb_node_scalar(operand(r, 1), &v), TB_OK);
        assert_true(v.f == 0.5);
    }
    tb_tensor_release(r);
    /* the rank-0 f64 tensor is cast to f32 before an f32 add */
    r = tb_add(f32, s_f64);
    assert_int_equal(tb_node_op(operand(r, 1)), TB_OP_CAST);
    assert_int_equal(tb_node_shape(operand(r, 1))->dtype, TB_F32);
    tb_tensor_release(r);

    tb_tensor_release(i32);
    tb_tensor_release(f32);
    tb_tensor_release(f64);
    tb_tensor_release(b);
    tb_tensor_release(u8);
    tb_tensor_release(i64);
    tb_tensor_release(s_f64);
    tb_tensor_release(s_i64);
    tb_tensor_release(s_i32);
    tb_tensor_release(s_bool);
    tb_tensor_release(h_f64);
    tb_tensor_release(h_i32);
}

static void test_binary_broadcasting(void **state) {
    struct {
        const char *a, *b, *want;
    } cases[] = {
        {"f32[2,1,3]", "f32[4,1]", "f32[2,4,3]"},
        {"f32[]", "f32[2,3]", "f32[2,3]"},
        {"f32[2,3]", "f32[]", "f32[2,3]"},
        {"f32[0]", "f32[1]", "f32[0]"},
        {"f32[5,0,3]", "f32[3]", "f32[5,0,3]"},
        {"f32[1,1]", "f32[1]", "f32[1,1]"},
        {"f32[1,0]", "f32[7,1]", "f32[7,0]"},
        {"f32[8,1,1,1,1,1,1,2]", "f32[3,1,1,1,1,1,2]", "f32[8,3,1,1,1,1,1,2]"},
    };
    size_t i;
    tb_tensor *a, *b;
    (void)state;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        a = mk(cases[i].a);
        b = mk(cases[i].b);
        expect_shape(tb_add(a, b), cases[i].want);
        expect_shape(tb_add(b, a), cases[i].want);
        tb_tensor_release(a);
        tb_tensor_release(b);
    }
    a = mk("f32[2,3]");
    b = mk("f32[4]");
    expect_error(tb_add(a, b), TB_ERR_SHAPE, "tb_add: shapes f32[2,3] and f32[4] do not broadcast",
                 NULL, NULL);
    tb_tensor_release(b);
    b = mk("i32[0]");
    expect_error(tb_lt(b, a), TB_ERR_SHAPE, "tb_lt: shapes i32[0] and f32[2,3] do not broadcast",
                 NULL, NULL);
    expect_error(tb_add_scalar(NULL, 1.0), TB_ERR_INVALID_ARGUMENT, "tb_add_scalar", "NULL", NULL);
    tb_tensor_release(a);
    tb_tensor_release(b);
}

static void test_null_chaining(void **state) {
    tb_tensor *a = mk("f32[2,3]"), *b = mk("f32[4,5]"), *r;
    (void)state;
    /* no error yet: a NULL argument sets one */
    expect_error(tb_add(NULL, a), TB_ERR_INVALID_ARGUMENT, "tb_add", "a is NULL", NULL);
    expect_error(tb_add(a, NULL), TB_ERR_INVALID_ARGUMENT, "tb_add", "b is NULL", NULL);
    expect_error(tb_exp(NULL), TB_ERR_INVALID_ARGUMENT, "tb_exp", NULL, NULL);
    expect_error(tb_where(a, NULL, a), TB_ERR_INVALID_ARGUMENT, "tb_where", NULL, NULL);
    expect_error(tb_layer_norm(NULL, 1, NULL, NULL, 1e-5), TB_ERR_INVALID_ARGUMENT, "tb_layer_norm",
                 NULL, NULL);
    expect_error(tb_gather(a, 0, NULL), TB_ERR_INVALID_ARGUMENT, "tb_gather", "index", NULL);

    /* a chain keeps the first error */
    r = tb_sum(tb_relu(tb_exp(tb_add(tb_matmul(a, b), a))), NULL, 0, false);
    expect_error(r, TB_ERR_SHAPE, "tb_matmul: shapes f32[2,3] and f32[4,5] do not match (3 != 4)",
                 NULL, NULL);
    tb_set_error(TB_ERR_EXECUTE, "an earlier failure");
    assert_null(tb_reshape(NULL, NULL, 0));
    assert_null(tb_concat(&r, 1, 0));
    assert_null(tb_pad(NULL, NULL, 0, 0.0));
    assert_null(tb_argmax(NULL, 0, false));
    expect_error(tb_matmul(NULL, a), TB_ERR_EXECUTE, "an earlier failure", NULL, NULL);
    tb_tensor_release(a);
    tb_tensor_release(b);
}

/* ---- ternary ---- */

static void test_where_clamp(void **state) {
    tb_tensor *c = mk("bool[2,1]"), *a = mk("f32[3]"), *b = mk("f64[3]"), *i = mk("i32[3]");
    tb_tensor *s = tb_scalar_tensor(sc_f(TB_F64, 1.0), NULL), *f = mk("f32[2,3]"), *r;
    tb_tensor *f4 = mk("f32[4]"), *b0 = mk("bool[]"), *u02 = mk("u8[0,2]");
    (void)state;
    expect_shape(tb_where(c, a, b), "f64[2,3]");
    expect_shape(tb_where(c, a, a), "f32[2,3]");
    expect_shape(tb_where(c, i, s), "f64[2,3]");
    expect_shape(tb_where(c, a, s), "f32[2,3]");
    expect_shape(tb_where(c, i, i), "i32[2,3]");
    r = tb_where(c, i, a);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_WHERE);
    assert_int_equal(tb_node_shape(operand(r, 0))->dtype, TB_BOOL);
    assert_int_equal(tb_node_shape(operand(r, 1))->dtype, TB_F32);
    assert_int_equal(tb_node_shape(operand(r, 2))->dtype, TB_F32);
    expect_shape(r, "f32[2,3]");
    expect_error(tb_where(a, a, a), TB_ERR_DTYPE, "tb_where", "f32[3]", NULL);
    expect_error(tb_where(c, f, f4), TB_ERR_SHAPE,
                 "tb_where: shapes bool[2,1], f32[2,3] and f32[4] do not broadcast", NULL, NULL);

    expect_shape(tb_clamp(a, -1.0, 1.0), "f32[3]");
    expect_shape(tb_clamp(b, 1.0, -1.0), "f64[3]"); /* lo > hi is allowed */
    expect_shape(tb_clamp(i, 0.0, 2.0), "f32[3]");
    expect_shape(tb_clamp(b0, 0.0, 2.0), "f32[]");
    expect_shape(tb_clamp(u02, 0.0, 2.0), "f32[0,2]");
    r = tb_clamp(b, 0.0, 2.0);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_CLAMP);
    assert_int_equal(tb_node_op(operand(r, 1)), TB_OP_SCALAR);
    assert_int_equal(tb_node_op(operand(r, 2)), TB_OP_SCALAR);
    assert_int_equal(tb_node_shape(operand(r, 2))->dtype, TB_F64);
    tb_tensor_release(r);
    tb_tensor_release(c);
    tb_tensor_release(a);
    tb_tensor_release(b);
    tb_tensor_release(i);
    tb_tensor_release(s);
    tb_tensor_release(f);
    tb_tensor_release(f4);
    tb_tensor_release(b0);
    tb_tensor_release(u02);
}

/* ---- reductions ---- */

static void test_reductions(void **state) {
    tb_tensor *x = mk("f32[2,3,4]"), *i = mk("i32[2,3]"), *bl = mk("bool[5]"), *u = mk("u8[2]");
    tb_tensor *e = mk("f32[0,3]"), *z = mk("f32[]"), *d = mk("f64[2,2]"), *r;
    int32_t last = -1, first_last[2] = {0, -1}, dup[2] = {1, -2}, bad = 3, zero = 0, one = 1;
    (void)state;
    expect_shape(tb_sum(x, &last, 1, false), "f32[2,3]");
    expect_shape(tb_sum(x, &last, 1, true), "f32[2,3,1]");
    expect_shape(tb_sum(x, NULL, 0, false), "f32[]");
    expect_shape(tb_sum(x, NULL, 0, true), "f32[1,1,1]");
    expect_shape(tb_mean(x, first_last, 2, false), "f32[3]");
    expect_shape(tb_max(x, first_last, 2, true), "f32[1,3,1]");
    expect_shape(tb_min(x, &zero, 1, false), "f32[3,4]");
    expect_shape(tb_prod(d, &one, 1, false), "f64[2]");
    r = tb_sum(x, first_last, 2, false);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_SUM);
    assert_int_equal(tb_node_attr(tb_tensor_node(r), 0), 5); /* bits 0 and 2 */
    assert_int_equal(tb_node_attr(tb_tensor_node(r), 1), 0);
    tb_tensor_release(r);

    /* dtypes: integer sums and products in i64, max/min keep theirs, mean needs floats */
    expect_shape(tb_sum(i, NULL, 0, false), "i64[]");
    expect_shape(tb_sum(bl, NULL, 0, false), "i64[]");
    expect_shape(tb_prod(u, NULL, 0, false), "i64[]");
    expect_shape(tb_max(i, &last, 1, false), "i32[2]");
    expect_shape(tb_min(bl, NULL, 0, false), "bool[]");
    r = tb_sum(i, NULL, 0, false);
    assert_int_equal(tb_node_shape(operand(r, 0))->dtype, TB_I64);
    tb_tensor_release(r);
    expect_error(tb_mean(i, NULL, 0, false), TB_ERR_DTYPE, "tb_mean", "i32[2,3]", NULL);
    expect_error(tb_mean(bl, NULL, 0, false), TB_ERR_DTYPE, "tb_mean", "bool[5]", NULL);

    /* empty */
    expect_shape(tb_sum(e, NULL, 0, false), "f32[]");
    expect_shape(tb_prod(e, &zero, 1, false), "f32[3]");
    expect_shape(tb_mean(e, &zero, 1, true), "f32[1,3]");
    expect_shape(tb_max(e, &one, 1, false), "f32[0]");
    expect_error(tb_max(e, &zero, 1, false), TB_ERR_SHAPE, "tb_max", "f32[0,3]", "size 0");
    expect_error(tb_min(e, NULL, 0, false), TB_ERR_SHAPE, "tb_min", "f32[0,3]", NULL);

    /* rank 0: axes 0 and -1 are fine */
    expect_shape(tb_sum(z, &zero, 1, false), "f32[]");
    expect_shape(tb_sum(z, &last, 1, true), "f32[]");
    expect_shape(tb_max(z, NULL, 0, true), "f32[]");
    expect_error(tb_sum(z, &one, 1, false), TB_ERR_SHAPE, "tb_sum", "f32[]", NULL);
    expect_error(tb_sum(z, first_last, 2, false), TB_ERR_SHAPE, "tb_sum", "more than once", NULL);

    /* bad axes */
    expect_error(tb_sum(x, &bad, 1, false), TB_ERR_SHAPE, "tb_sum", "axis 3", "f32[2,3,4]");
    bad = -4;
    expect_error(tb_prod(x, &bad, 1, false), TB_ERR_SHAPE, "tb_prod", "axis -4", "f32[2,3,4]");
    expect_error(tb_sum(x, dup, 2, false), TB_ERR_SHAPE, "tb_sum", "more than once", "f32[2,3,4]");
    expect_error(tb_sum(x, NULL, 1, false), TB_ERR_INVALID_ARGUMENT, "tb_sum", "axes", NULL);

    /* argmax / argmin */
    expect_shape(tb_argmax(x, 1, false), "i64[2,4]");
    expect_shape(tb_argmax(x, -1, true), "i64[2,3,1]");
    expect_shape(tb_argmin(i, -2, false), "i64[3]");
    expect_shape(tb_argmin(u, 0, true), "i64[1]");
    expect_shape(tb_argmax(z, 0, false), "i64[]");
    expect_shape(tb_argmax(z, -1, true), "i64[]");
    expect_shape(tb_argmax(e, 1, false), "i64[0]");
    r = tb_argmax(x, -2, false);
    assert_int_equal(tb_node_attr(tb_tensor_node(r), 0), 1);
    tb_tensor_release(r);
    expect_error(tb_argmax(e, 0, false), TB_ERR_SHAPE, "tb_argmax", "f32[0,3]", NULL);
    expect_error(tb_argmax(z, 1, false), TB_ERR_SHAPE, "tb_argmax", "f32[]", NULL);
    expect_error(tb_argmin(x, 3, false), TB_ERR_SHAPE, "tb_argmin", "f32[2,3,4]", NULL);
    expect_error(tb_argmax(bl, 0, false), TB_ERR_DTYPE, "tb_argmax", "bool[5]", NULL);

    tb_tensor_release(x);
    tb_tensor_release(i);
    tb_tensor_release(bl);
    tb_tensor_release(u);
    tb_tensor_release(e);
    tb_tensor_release(z);
    tb_tensor_release(d);
}

/* ---- matmul ---- */

static void test_matmul_shapes(void **state) {
    struct {
        const char *a, *b, *want;
    } cases[] = {
        {"f32[3]", "f32[3]", "f32[]"},
        {"f32[2,3]", "f32[3]", "f32[2]"},
        {"f32[3]", "f32[3,4]", "f32[4]"},
        {"f32[2,3]", "f32[3,4]", "f32[2,4]"},
        {"f32[5,2,3]", "f32[3,4]", "f32[5,2,4]"},
        {"f32[2,3]", "f32[5,3,4]", "f32[5,2,4]"},
        {"f32[3]", "f32[5,3,4]", "f32[5,4]"},
        {"f32[5,2,3]", "f32[3]", "f32[5,2]"},
        {"f32[5,1,2,3]", "f32[4,3,2]", "f32[5,4,2,2]"},
        {"f32[1,2,3]", "f32[6,3,1]", "f32[6,2,1]"},
        {"f32[0,3]", "f32[3,4]", "f32[0,4]"},
        {"f32[2,0]", "f32[0,4]", "f32[2,4]"},
        {"f32[0]", "f32[0]", "f32[]"},
        {"f32[0,2,3]", "f32[1,3,4]", "f32[0,2,4]"},
        {"i64[2,3]", "i64[3]", "i64[2]"},
        {"f64[1,1,1,1,1,1,2,3]", "f64[3]", "f64[1,1,1,1,1,1,2]"},
    };
    size_t i;
    tb_tensor *a, *b, *r;
    const tb_node *mm;
    (void)state;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        a = mk(cases[i].a);
        b = mk(cases[i].b);
        expect_shape(tb_matmul(a, b), cases[i].want);
        tb_tensor_release(a);
        tb_tensor_release(b);
    }
    /* the node form: rank >= 2 on both sides, batch dims expanded */
    a = mk("f32[3]");
    b = mk("f32[5,3,4]");
    r = tb_matmul(a, b);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_RESHAPE);
    mm = operand(r, 0);
    assert_int_equal(tb_node_op(mm), TB_OP_MATMUL);
    assert_int_equal(tb_node_shape(mm)->rank, 3);
    assert_int_equal(tb_node_shape(tb_node_operand(mm, 0))->rank, 3);
    assert_int_equal(tb_node_shape(tb_node_operand(mm, 0))->dims[0], 5);
    assert_int_equal(tb_node_shape(tb_node_operand(mm, 0))->dims[1], 1);
    assert_int_equal(tb_node_shape(tb_node_operand(mm, 0))->dims[2], 3);
    assert_int_equal(tb_node_op(tb_node_operand(mm, 0)), TB_OP_EXPAND);
    assert_int_equal(tb_node_op(tb_node_operand(mm, 1)), TB_OP_DEVICE_DATA); /* no view needed */
    tb_tensor_release(r);
    tb_tensor_release(a);
    tb_tensor_release(b);
    a = mk("f32[2,3]");
    b = mk("f32[3,4]");
    r = tb_matmul(a, b); /* plain 2-D: nothing but the MATMUL */
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_MATMUL);
    assert_int_equal(tb_node_op(operand(r, 0)), TB_OP_DEVICE_DATA);
    assert_int_equal(tb_node_op(operand(r, 1)), TB_OP_DEVICE_DATA);
    tb_tensor_release(r);
    tb_tensor_release(a);
    tb_tensor_release(b);

    a = mk("f32[2,3]");
    b = mk("f32[4,5]");
    expect_error(tb_matmul(a, b), TB_ERR_SHAPE,
                 "tb_matmul: shapes f32[2,3] and f32[4,5] do not match (3 != 4)", NULL, NULL);
    tb_tensor_release(b);
    b = mk("f32[]");
    expect_error(tb_matmul(a, b), TB_ERR_SHAPE, "tb_matmul", "f32[2,3] and f32[]", NULL);
    expect_error(tb_matmul(b, a), TB_ERR_SHAPE, "tb_matmul", "f32[] and f32[2,3]", NULL);
    tb_tensor_release(b);
    b = mk("f64[3,4]");
    expect_error(tb_matmul(a, b), TB_ERR_DTYPE, "tb_matmul", "f32[2,3] and f64[3,4]", NULL);
    tb_tensor_release(a);
    tb_tensor_release(b);
    a = mk("f32[2,2,3]");
    b = mk("f32[3,3,4]");
    expect_error(tb_matmul(a, b), TB_ERR_SHAPE, "tb_matmul", "f32[2,2,3] and f32[3,3,4]", "batch");
    tb_tensor_release(a);
    tb_tensor_release(b);
    a = mk("bool[2,2]");
    expect_error(tb_matmul(a, a), TB_ERR_DTYPE, "tb_matmul", "bool[2,2]", NULL);
    tb_tensor_release(a);
    a = mk("f32[3]");
    b = mk("f32[4]");
    expect_error(tb_matmul(a, b), TB_ERR_SHAPE, "tb_matmul", "f32[3] and f32[4]", "3 != 4");
    tb_tensor_release(a);
    tb_tensor_release(b);
}

/* ---- softmax, layer_norm ---- */

static void test_softmax_layer_norm(void **state) {
    tb_tensor *x = mk("f32[2,3,4]"), *i = mk("i32[3]"), *z = mk("f64[]"), *e = mk("f32[0,3]");
    tb_tensor *w = mk("f32[3,4]"), *b = mk("f32[3,4]"), *w1 = mk("f32[4]"), *wd = mk("f64[4]");
    tb_tensor *r;
    (void)state;
    expect_shape(tb_softmax(x, -1), "f32[2,3,4]");
    expect_shape(tb_log_softmax(x, 0), "f32[2,3,4]");
    expect_shape(tb_softmax(z, 0), "f64[]");
    expect_shape(tb_log_softmax(z, -1), "f64[]");
    expect_shape(tb_softmax(e, 0), "f32[0,3]");
    r = tb_softmax(x, -2);
    assert_int_equal(tb_node_attr(tb_tensor_node(r), 0), 1);
    tb_tensor_release(r);
    expect_error(tb_softmax(i, 0), TB_ERR_DTYPE, "tb_softmax", "i32[3]", NULL);
    expect_error(tb_log_softmax(x, 3), TB_ERR_SHAPE, "tb_log_softmax", "f32[2,3,4]", NULL);
    expect_error(tb_softmax(z, 1), TB_ERR_SHAPE, "tb_softmax", "f64[]", NULL);

    expect_shape(tb_layer_norm(x, 2, w, b, 1e-5), "f32[2,3,4]");
    expect_shape(tb_layer_norm(x, 1, w1, NULL, 1e-5), "f32[2,3,4]");
    expect_shape(tb_layer_norm(x, 3, NULL, NULL, 1e-5), "f32[2,3,4]");
    r = tb_layer_norm(x, 2, NULL, b, 0.5);
    assert_int_equal(tb_node_num_operands(tb_tensor_node(r)), 2);
    assert_int_equal(tb_node_attr(tb_tensor_node(r), 1), 0);
    assert_int_equal(tb_node_attr(tb_tensor_node(r), 2), 1);
    assert_true(tb_node_fattr(tb_tensor_node(r), 0) == 0.5);
    tb_tensor_release(r);
    expect_error(tb_layer_norm(x, 2, w1, NULL, 1e-5), TB_ERR_SHAPE, "tb_layer_norm",
                 "weight f32[4]", "f32[2,3,4]");
    expect_error(tb_layer_norm(x, 1, NULL, w, 1e-5), TB_ERR_SHAPE, "tb_layer_norm", "bias f32[3,4]",
                 NULL);
    expect_error(tb_layer_norm(x, 1, wd, NULL, 1e-5), TB_ERR_DTYPE, "tb_layer_norm", "f64[4]",
                 NULL);
    expect_error(tb_layer_norm(x, 0, NULL, NULL, 1e-5), TB_ERR_SHAPE, "tb_layer_norm",
                 "normalized_ndim 0", "f32[2,3,4]");
    expect_error(tb_layer_norm(x, 4, NULL, NULL, 1e-5), TB_ERR_SHAPE, "tb_layer_norm",
                 "normalized_ndim 4", NULL);
    expect_error(tb_layer_norm(i, 1, NULL, NULL, 1e-5), TB_ERR_DTYPE, "tb_layer_norm", "i32[3]",
                 NULL);
    tb_tensor_release(x);
    tb_tensor_release(i);
    tb_tensor_release(z);
    tb_tensor_release(e);
    tb_tensor_release(w);
    tb_tensor_release(b);
    tb_tensor_release(w1);
    tb_tensor_release(wd);
}

/* ---- movement ---- */

static void test_reshape(void **state) {
    tb_tensor *x = mk("f32[2,3]"), *e = mk("f32[0,3]"), *one = mk("i32[1]"), *z = mk("f32[]");
    int64_t d32[2] = {3, 2}, dm1[1] = {-1}, dm12[2] = {-1, 2}, d4m1[2] = {4, -1};
    int64_t dm1m1[2] = {-1, -1}, dneg[2] = {-2, -3}, dm10[2] = {-1, 0}, d30[2] = {3, 0};
    int64_t d111[3] = {1, 1, 1}, nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 6}, d7[1] = {7};
    tb_tensor *r;
    (void)state;
    expect_shape(tb_reshape(x, d32, 2), "f32[3,2]");
    expect_shape(tb_reshape(x, dm1, 1), "f32[6]");
    expect_shape(tb_reshape(x, dm12, 2), "f32[3,2]");
    expect_shape(tb_reshape(one, NULL, 0), "i32[]");
    expect_shape(tb_reshape(z, d111, 3), "f32[1,1,1]");
    expect_shape(tb_reshape(z, dm1, 1), "f32[1]");
    expect_shape(tb_reshape(e, d30, 2), "f32[3,0]");
    expect_shape(tb_reshape(e, dm1, 1), "f32[0]");
    r = tb_reshape(x, dm12, 2);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_RESHAPE);
    assert_int_equal(tb_node_num_attrs(tb_tensor_node(r)), 2);
    assert_int_equal(tb_node_attr(tb_tensor_node(r), 0), 3);
    assert_int_equal(tb_node_attr(tb_tensor_node(r), 1), 2);
    tb_tensor_release(r);
    expect_error(tb_reshape(x, d4m1, 2), TB_ERR_SHAPE, "tb_reshape", "f32[2,3]", "[4,-1]");
    expect_error(tb_reshape(x, d7, 1), TB_ERR_SHAPE, "tb_reshape", "f32[2,3] (6 elements)", "[7]");
    expect_error(tb_reshape(x, dm1m1, 2), TB_ERR_SHAPE, "tb_reshape", "[-1,-1]", NULL);
    expect_error(tb_reshape(x, dneg, 2), TB_ERR_SHAPE, "tb_reshape", "[-2,-3]", NULL);
    expect_error(tb_reshape(e, dm10, 2), TB_ERR_SHAPE, "tb_reshape", "f32[0,3]", "[-1,0]");
    expect_error(tb_reshape(x, nine, 9), TB_ERR_SHAPE, "tb_reshape", "rank 9", NULL);
    expect_error(tb_reshape(x, NULL, 2), TB_ERR_INVALID_ARGUMENT, "tb_reshape", "dims", NULL);
    tb_tensor_release(x);
    tb_tensor_release(e);
    tb_tensor_release(one);
    tb_tensor_release(z);
}

static void test_permute_transpose(void **state) {
    tb_tensor *x = mk("f32[2,3,4]"), *z = mk("f32[]"), *r;
    int32_t p201[3] = {2, 0, 1}, pneg[3] = {-1, 0, 1}, pdup[3] = {0, 0, 1}, p2[2] = {1, 0};
    int32_t pbad[3] = {0, 1, 3};
    (void)state;
    expect_shape(tb_permute(x, p201, 3), "f32[4,2,3]");
    expect_shape(tb_permute(x, pneg, 3), "f32[4,2,3]");
    expect_shape(tb_permute(z, NULL, 0), "f32[]");
    r = tb_permute(x, pneg, 3);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_PERMUTE);
    assert_int_equal(tb_node_attr(tb_tensor_node(r), 0), 2);
    tb_tensor_release(r);
    expect_error(tb_permute(x, pdup, 3), TB_ERR_SHAPE, "tb_permute", "f32[2,3,4]",
                 "more than once");
    expect_error(tb_permute(x, p2, 2), TB_ERR_SHAPE, "tb_permute", "2 axes", "f32[2,3,4]");
    expect_error(tb_permute(x, pbad, 3), TB_ERR_SHAPE, "tb_permute", "axis 3", "f32[2,3,4]");
    expect_error(tb_permute(x, NULL, 3), TB_ERR_INVALID_ARGUMENT, "tb_permute", "perm", NULL);

    expect_shape(tb_transpose(x, 0, -1), "f32[4,3,2]");
    expect_shape(tb_transpose(x, 1, 1), "f32[2,3,4]");
    expect_shape(tb_transpose(z, 0, -1), "f32[]");
    r = tb_transpose(x, -1, -2);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_PERMUTE);
    expect_shape(r, "f32[2,4,3]");
    expect_error(tb_transpose(x, 0, 3), TB_ERR_SHAPE, "tb_transpose", "dim1 3", "f32[2,3,4]");
    expect_error(tb_transpose(z, 1, 0), TB_ERR_SHAPE, "tb_transpose", "f32[]", NULL);
    tb_tensor_release(x);
    tb_tensor_release(z);
}

static void test_expand_squeeze(void **state) {
    tb_tensor *x = mk("f32[3,1]"), *z = mk("i64[]"), *y = mk("f32[2,1,3]"), *r;
    int64_t d234[3] = {2, 3, 4}, dm15[2] = {-1, 5}, d2m1m1[3] = {2, -1, -1};
    int64_t dlead[3] = {-1, 3, 4}, d41[2] = {4, 1}, d30[2] = {3, 0}, d5[1] = {5};
    int64_t d00[2] = {0, 0};
    (void)state;
    expect_shape(tb_expand(x, d234, 3), "f32[2,3,4]");
    expect_shape(tb_expand(x, dm15, 2), "f32[3,5]");
    expect_shape(tb_expand(x, d2m1m1, 3), "f32[2,3,1]");
    expect_shape(tb_expand(x, d30, 2), "f32[3,0]");
    expect_shape(tb_expand(z, d00, 2), "i64[0,0]");
    expect_shape(tb_expand(z, NULL, 0), "i64[]");
    r = tb_expand(x, dm15, 2);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_EXPAND);
    assert_int_equal(tb_node_attr(tb_tensor_node(r), 0), 3);
    assert_int_equal(tb_node_attr(tb_tensor_node(r), 1), 5);
    tb_tensor_release(r);
    expect_error(tb_expand(x, dlead, 3), TB_ERR_SHAPE, "tb_expand", "f32[3,1]", "leading");
    expect_error(tb_expand(x, d41, 2), TB_ERR_SHAPE, "tb_expand", "f32[3,1]", "[4,1]");
    expect_error(tb_expand(x, d5, 1), TB_ERR_SHAPE, "tb_expand", "f32[3,1]", NULL);
    expect_error(tb_expand(x, NULL, 2), TB_ERR_INVALID_ARGUMENT, "tb_expand", "dims", NULL);

    expect_shape(tb_squeeze(y, 1), "f32[2,3]");
    expect_shape(tb_squeeze(y, -2), "f32[2,3]");
    expect_shape(tb_squeeze(z, 0), "i64[]");
    expect_shape(tb_squeeze(x, -1), "f32[3]");
    expect_error(tb_squeeze(y, 0), TB_ERR_SHAPE, "tb_squeeze", "f32[2,1,3]", "size 2");
    expect_error(tb_squeeze(y, 3), TB_ERR_SHAPE, "tb_squeeze", "f32[2,1,3]", NULL);

    expect_shape(tb_unsqueeze(y, 0), "f32[1,2,1,3]");
    expect_shape(tb_unsqueeze(y, -1), "f32[2,1,3,1]");
    expect_shape(tb_unsqueeze(y, 3), "f32[2,1,3,1]");
    expect_shape(tb_unsqueeze(y, -4), "f32[1,2,1,3]");
    expect_shape(tb_unsqueeze(z, 0), "i64[1]");
    expect_shape(tb_unsqueeze(z, -1), "i64[1]");
    expect_error(tb_unsqueeze(y, 4), TB_ERR_SHAPE, "tb_unsqueeze", "f32[2,1,3]", NULL);
    expect_error(tb_unsqueeze(y, -5), TB_ERR_SHAPE, "tb_unsqueeze", "f32[2,1,3]", NULL);
    r = mk("f32[1,1,1,1,1,1,1,1]");
    expect_error(tb_unsqueeze(r, 0), TB_ERR_SHAPE, "tb_unsqueeze", "f32[1,1,1,1,1,1,1,1]", NULL);
    tb_tensor_release(r);
    tb_tensor_release(x);
    tb_tensor_release(z);
    tb_tensor_release(y);
}

static void expect_slice_at(tb_tensor *x, int32_t dim, int64_t start, int64_t end, int64_t step,
                            const char *want, int64_t nstart, int64_t nend, int line) {
    tb_tensor *r = tb_slice(x, dim, start, end, step);
    const tb_node *n;
    if (r == NULL) fail_msg("line %d: tb_slice failed: %s", line, tb_last_error());
    n = tb_tensor_node(r);
    assert_int_equal(tb_node_op(n), TB_OP_SLICE);
    assert_int_equal(tb_node_num_attrs(n), 4);
    if (tb_node_attr(n, 1) != nstart || tb_node_attr(n, 2) != nend) {
        fail_msg("line %d: normalised to [%lld, %lld), expected [%lld, %lld)", line,
                 (long long)tb_node_attr(n, 1), (long long)tb_node_attr(n, 2), (long long)nstart,
                 (long long)nend);
    }
    assert_int_equal(tb_node_attr(n, 3), step);
    expect_shape_at(r, want, line);
}
#define expect_slice(x, d, s, e, st, want, ns, ne)                                                 \
    expect_slice_at((x), (d), (s), (e), (st), (want), (ns), (ne), __LINE__)

static void test_slice_flip(void **state) {
    tb_tensor *x = mk("f32[10]"), *m = mk("f32[4,0]"), *z = mk("f32[]"), *r;
    int32_t both[2] = {0, -1}, dup[2] = {0, -2}, zero = 0;
    (void)state;
    expect_slice(x, 0, 2, 8, 3, "f32[2]", 2, 8);
    expect_slice(x, -1, -3, 100, 1, "f32[3]", 7, 10);
    expect_slice(x, 0, 5, 2, 1, "f32[0]", 5, 5);
    expect_slice(x, 0, -100, 100, 1, "f32[10]", 0, 10);
    expect_slice(x, 0, 0, -1, 4, "f32[3]", 0, 9);
    expect_slice(x, 0, 20, 30, 1, "f32[0]", 10, 10);
    expect_slice(x, 0, INT64_MIN, INT64_MAX, 1000000, "f32[1]", 0, 10);
    expect_slice(m, 1, 0, 5, 2, "f32[4,0]", 0, 0);
    expect_slice(m, 0, 1, -1, 1, "f32[2,0]", 1, 3);
    expect_error(tb_slice(x, 0, 0, 5, 0), TB_ERR_INVALID_ARGUMENT, "tb_slice", "step 0", "f32[10]");
    expect_error(tb_slice(x, 0, 0, 5, -1), TB_ERR_INVALID_ARGUMENT, "tb_slice", "step -1", NULL);
    expect_error(tb_slice(z, 0, 0, 1, 1), TB_ERR_SHAPE, "tb_slice", "f32[]", NULL);
    expect_error(tb_slice(x, 1, 0, 1, 1), TB_ERR_SHAPE, "tb_slice", "f32[10]", NULL);

    r = tb_flip(m, both, 2);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_FLIP);
    assert_int_equal(tb_node_attr(tb_tensor_node(r), 0), 3);
    expect_shape(r, "f32[4,0]");
    expect_shape(tb_flip(x, NULL, 0), "f32[10]");
    expect_shape(tb_flip(z, &zero, 1), "f32[]");
    expect_error(tb_flip(m, dup, 2), TB_ERR_SHAPE, "tb_flip", "f32[4,0]", "more than once");
    expect_error(tb_flip(x, both, 2), TB_ERR_SHAPE, "tb_flip", "f32[10]", NULL);
    expect_error(tb_flip(x, NULL, 1), TB_ERR_INVALID_ARGUMENT, "tb_flip", "dims", NULL);
    tb_tensor_release(x);
    tb_tensor_release(m);
    tb_tensor_release(z);
}

/* ---- copies ---- */

static void test_concat(void **state) {
    tb_tensor *a = mk("f32[2,3]"), *b = mk("f32[4,3]"), *c = mk("f32[2,4]"), *e = mk("f32[0,3]");
    tb_tensor *v0 = mk("i64[0]"), *i = mk("i32[2,3]"), *z = mk("f32[]"), *list[4], *r;
    (void)state;
    list[0] = a;
    list[1] = b;
    expect_shape(tb_concat(list, 2, 0), "f32[6,3]");
    expect_shape(tb_concat(list, 2, -2), "f32[6,3]");
    expect_shape(tb_concat(list, 1, 0), "f32[2,3]");
    list[1] = c;
    expect_shape(tb_concat(list, 2, 1), "f32[2,7]");
    expect_shape(tb_concat(list, 2, -1), "f32[2,7]");
    list[1] = e;
    list[2] = a;
    expect_shape(tb_concat(list, 3, 0), "f32[4,3]");
    /* 1-D empty tensors are skipped whatever the others' shapes */
    list[1] = v0;
    r = tb_concat(list, 3, 1);
    assert_int_equal(tb_node_num_operands(tb_tensor_node(r)), 2);
    expect_shape(r, "f32[2,6]");
    list[0] = v0;
    list[1] = v0;
    expect_shape(tb_concat(list, 2, 0), "i64[0]");
    /* promoted dtype, cast operands */
    list[0] = a;
    list[1] = i;
    r = tb_concat(list, 2, 0);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_CONCAT);
    assert_int_equal(tb_node_shape(operand(r, 1))->dtype, TB_F32);
    assert_int_equal(tb_node_attr(tb_tensor_node(r), 0), 0);
    expect_shape(r, "f32[4,3]");

    list[1] = c;
    expect_error(tb_concat(list, 2, 0), TB_ERR_SHAPE, "tb_concat", "f32[2,3]", "f32[2,4]");
    list[1] = z;
    expect_error(tb_concat(list, 2, 0), TB_ERR_SHAPE, "tb_concat", "f32[]", NULL);
    list[1] = b;
    expect_error(tb_concat(list, 2, 2), TB_ERR_SHAPE, "tb_concat", "dim 2", "f32[2,3]");
    expect_error(tb_concat(list, 0, 0), TB_ERR_INVALID_ARGUMENT, "tb_concat", "count 0", NULL);
    expect_error(tb_concat(NULL, 2, 0), TB_ERR_INVALID_ARGUMENT, "tb_concat", "NULL", NULL);
    list[1] = NULL;
    expect_error(tb_concat(list, 2, 0), TB_ERR_INVALID_ARGUMENT, "tb_concat", "tensors[1]", NULL);
    tb_tensor_release(a);
    tb_tensor_release(b);
    tb_tensor_release(c);
    tb_tensor_release(e);
    tb_tensor_release(v0);
    tb_tensor_release(i);
    tb_tensor_release(z);
}

static void test_pad(void **state) {
    tb_tensor *x = mk("f32[2,3]"), *u = mk("u8[2]"), *i = mk("i32[0]"), *z = mk("f32[]"), *r;
    int64_t p12[2] = {1, 2}, p1234[4] = {1, 2, 3, 4}, p3[3] = {1, 1, 1}, p6[6] = {0};
    int64_t pneg[2] = {-1, 0};
    tb_scalar v;
    (void)state;
    expect_shape(tb_pad(x, p12, 2, 0.0), "f32[2,6]");
    expect_shape(tb_pad(x, p1234, 4, 0.0), "f32[9,6]");
    expect_shape(tb_pad(x, NULL, 0, 0.0), "f32[2,3]");
    expect_shape(tb_pad(z, NULL, 0, 1.0), "f32[]");
    expect_shape(tb_pad(i, p12, 2, 2.7), "i32[3]");
    r = tb_pad(u, p12, 2, 255.0);
    assert_int_equal(tb_node_scalar(operand(r, 1), &v), TB_OK);
    assert_int_equal(v.dtype, TB_U8);
    assert_int_equal(v.i, 255);
    expect_shape(r, "u8[5]");
    r = tb_pad(i, p12, 2, -2.7);
    assert_int_equal(tb_node_scalar(operand(r, 1), &v), TB_OK);
    assert_int_equal(v.i, -2); /* truncated toward zero */
    tb_tensor_release(r);
    expect_error(tb_pad(x, p3, 3, 0.0), TB_ERR_INVALID_ARGUMENT, "tb_pad", "3 pad values",
                 "f32[2,3]");
    expect_error(tb_pad(x, p6, 6, 0.0), TB_ERR_SHAPE, "tb_pad", "f32[2,3]", "rank 2");
    expect_error(tb_pad(x, pneg, 2, 0.0), TB_ERR_INVALID_ARGUMENT, "tb_pad", "-1", NULL);
    expect_error(tb_pad(u, p12, 2, 256.0), TB_ERR_INVALID_ARGUMENT, "tb_pad", "256", "u8");
    expect_error(tb_pad(u, p12, 2, -1.0), TB_ERR_INVALID_ARGUMENT, "tb_pad", "u8", NULL);
    expect_error(tb_pad(i, p12, 2, NAN), TB_ERR_INVALID_ARGUMENT, "tb_pad", "i32", NULL);
    expect_error(tb_pad(x, NULL, 2, 0.0), TB_ERR_INVALID_ARGUMENT, "tb_pad", "pads", NULL);
    tb_tensor_release(x);
    tb_tensor_release(u);
    tb_tensor_release(i);
    tb_tensor_release(z);
}

static void test_gather_index_select(void **state) {
    tb_tensor *x = mk("f32[3,4]"), *i24 = mk("i64[2,4]"), *i25 = mk("i32[2,5]");
    tb_tensor *i5 = mk("i32[5]"), *i0 = mk("i64[]"), *f = mk("f32[2,4]"), *z = mk("f64[]");
    tb_tensor *i1 = mk("i64[1]"), *i2 = mk("i64[2]"), *m = mk("i64[2,2]"), *e = mk("i64[0,4]");
    (void)state;
    expect_shape(tb_gather(x, 0, i24), "f32[2,4]");
    expect_shape(tb_gather(x, -1, i25), "f32[2,5]");
    expect_shape(tb_gather(x, 0, e), "f32[0,4]");
    expect_shape(tb_gather(z, 0, i0), "f64[]");
    expect_shape(tb_gather(z, -1, i2), "f64[2]");
    expect_error(tb_gather(x, 0, i25), TB_ERR_SHAPE, "tb_gather", "i32[2,5]", "f32[3,4]");
    expect_error(tb_gather(x, 0, f), TB_ERR_DTYPE, "tb_gather", "f32[2,4]", NULL);
    expect_error(tb_gather(x, 0, i5), TB_ERR_SHAPE, "tb_gather", "i32[5]", "f32[3,4]");
    expect_error(tb_gather(x, 2, i24), TB_ERR_SHAPE, "tb_gather", "f32[3,4]", NULL);

    expect_shape(tb_index_select(x, 1, i5), "f32[3,5]");
    expect_shape(tb_index_select(x, -2, i2), "f32[2,4]");
    expect_shape(tb_index_select(x, 0, i0), "f32[1,4]");
    expect_shape(tb_index_select(z, 0, i1), "f64[]");
    expect_shape(tb_index_select(z, 0, i0), "f64[]");
    expect_error(tb_index_select(z, 0, i2), TB_ERR_SHAPE, "tb_index_select", "i64[2]", "f64[]");
    expect_error(tb_index_select(x, 0, m), TB_ERR_SHAPE, "tb_index_select", "i64[2,2]", NULL);
    expect_error(tb_index_select(x, 0, f), TB_ERR_DTYPE, "tb_index_select", "f32[2,4]", NULL);
    expect_error(tb_index_select(x, 2, i2), TB_ERR_SHAPE, "tb_index_select", "f32[3,4]", NULL);
    tb_tensor_release(x);
    tb_tensor_release(i24);
    tb_tensor_release(i25);
    tb_tensor_release(i5);
    tb_tensor_release(i0);
    tb_tensor_release(f);
    tb_tensor_release(z);
    tb_tensor_release(i1);
    tb_tensor_release(i2);
    tb_tensor_release(m);
    tb_tensor_release(e);
}

/* ---- creation ---- */

static void test_creation(void **state) {
    tb_shape s = shp("f32[2,3]"), s0 = shp("i32[]"), se = shp("u8[0,3]"), bad;
    tb_tensor *r;
    tb_scalar v;
    const tb_node *n;
    (void)state;
    r = tb_full(&s, 2.5, NULL);
    n = tb_tensor_node(r);
    assert_int_equal(tb_node_op(n), TB_OP_EXPAND);
    assert_int_equal(tb_node_op(tb_node_operand(n, 0)), TB_OP_RESHAPE);
    assert_int_equal(tb_node_op(tb_node_operand(tb_node_operand(n, 0), 0)), TB_OP_SCALAR);
    expect_shape(r, "f32[2,3]");
    r = tb_full(&s0, -3.9, NULL);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_SCALAR);
    assert_int_equal(tb_node_scalar(tb_tensor_node(r), &v), TB_OK);
    assert_int_equal(v.i, -3);
    expect_shape(r, "i32[]");
    expect_shape(tb_zeros(&se, NULL), "u8[0,3]");
    expect_shape(tb_ones(&s, NULL), "f32[2,3]");
    s0 = shp("bool[4]");
    expect_shape(tb_full(&s0, NAN, NULL), "bool[4]");
    s0 = shp("u8[1]");
    expect_error(tb_full(&s0, 256.0, NULL), TB_ERR_INVALID_ARGUMENT, "tb_full", "256", "u8");
    s0 = shp("i64[1]");
    expect_error(tb_full(&s0, INFINITY, NULL), TB_ERR_INVALID_ARGUMENT, "tb_full", "i64", NULL);
    expect_error(tb_full(NULL, 1.0, NULL), TB_ERR_INVALID_ARGUMENT, "tb_full", "shape", NULL);
    bad = s;
    bad.rank = 9;
    expect_error(tb_zeros(&bad, NULL), TB_ERR_SHAPE, "tb_zeros", "rank 9", NULL);
    bad.rank = -1;
    expect_error(tb_ones(&bad, NULL), TB_ERR_SHAPE, "tb_ones", "rank -1", NULL);
    bad = s;
    bad.dims[1] = -2;
    expect_error(tb_full(&bad, 0.0, NULL), TB_ERR_SHAPE, "tb_full", "-2", NULL);
    bad = s;
    bad.dtype = (tb_dtype)99;
    expect_error(tb_full(&bad, 0.0, NULL), TB_ERR_DTYPE, "tb_full", "99", NULL);
    bad = s;
    bad.dtype = TB_F64;
    bad.rank = 3;
    bad.dims[0] = bad.dims[1] = bad.dims[2] = 1000000000;
    expect_error(tb_zeros(&bad, NULL), TB_ERR_OVERFLOW, "tb_zeros", NULL, NULL);

    /* arange: PyTorch's length */
    expect_shape(tb_arange(0, 10, 3, TB_F32, NULL), "f32[4]");
    expect_shape(tb_arange(0, -10, -3, TB_I64, NULL), "i64[4]");
    expect_shape(tb_arange(0, 1, 0.1, TB_F64, NULL), "f64[10]");
    expect_shape(tb_arange(5, 5, 1, TB_I32, NULL), "i32[0]");
    expect_shape(tb_arange(0, 5.5, 1, TB_I64, NULL), "i64[5]");
    expect_shape(tb_arange(0, 5.5, 1, TB_F32, NULL), "f32[6]");
    expect_shape(tb_arange(0, 255, 1, TB_U8, NULL), "u8[255]");
    r = tb_arange(1.5, 4, 0.5, TB_F32, NULL);
    n = tb_tensor_node(r);
    assert_int_equal(tb_node_op(n), TB_OP_ARANGE);
    assert_true(tb_node_fattr(n, 0) == 1.5);
    assert_true(tb_node_fattr(n, 1) == 0.5);
    expect_shape(r, "f32[5]");
    expect_error(tb_arange(0, 10, 0, TB_F32, NULL), TB_ERR_INVALID_ARGUMENT, "tb_arange", "step",
                 NULL);
    expect_error(tb_arange(0, 10, 0.5, TB_I32, NULL), TB_ERR_INVALID_ARGUMENT, "tb_arange", "step",
                 NULL);
    expect_error(tb_arange(10, 0, 1, TB_F32, NULL), TB_ERR_INVALID_ARGUMENT, "tb_arange", "10",
                 NULL);
    expect_error(tb_arange(0, 10, -1, TB_F32, NULL), TB_ERR_INVALID_ARGUMENT, "tb_arange", NULL,
                 NULL);
    expect_error(tb_arange(0, 1e300, 1e-300, TB_F64, NULL), TB_ERR_OVERFLOW, "tb_arange", NULL,
                 NULL);
    expect_error(tb_arange(0, 1e19, 1, TB_F64, NULL), TB_ERR_OVERFLOW, "tb_arange", NULL, NULL);
    expect_error(tb_arange(0, 3e18, 1, TB_F64, NULL), TB_ERR_OVERFLOW, "tb_arange", NULL, NULL);
    expect_error(tb_arange(0, INFINITY, 1, TB_F32, NULL), TB_ERR_INVALID_ARGUMENT, "tb_arange",
                 "finite", NULL);
    expect_error(tb_arange(NAN, 1, 1, TB_F32, NULL), TB_ERR_INVALID_ARGUMENT, "tb_arange", NULL,
                 NULL);
    expect_error(tb_arange(0, 2, 1, TB_BOOL, NULL), TB_ERR_DTYPE, "tb_arange", "bool", NULL);

    /* eye */
    expect_shape(tb_eye(3, -1, TB_F32, NULL), "f32[3,3]");
    expect_shape(tb_eye(2, 5, TB_BOOL, NULL), "bool[2,5]");
    expect_shape(tb_eye(0, 0, TB_I64, NULL), "i64[0,0]");
    r = tb_eye(2, 3, TB_F64, NULL);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), TB_OP_EYE);
    assert_int_equal(tb_node_num_attrs(tb_tensor_node(r)), 0);
    expect_shape(r, "f64[2,3]");
    expect_error(tb_eye(-1, 2, TB_F32, NULL), TB_ERR_SHAPE, "tb_eye", "-1", NULL);
    expect_error(tb_eye(2, 2, (tb_dtype)8, NULL), TB_ERR_DTYPE, "tb_eye", NULL, NULL);

    /* rand / randn: two i64 scalar operands */
    s0 = shp("f64[2,0]");
    r = tb_rand(&s, NULL);
    n = tb_tensor_node(r);
    assert_int_equal(tb_node_op(n), TB_OP_RAND);
    assert_int_equal(tb_node_num_operands(n), 2);
    assert_int_equal(tb_node_op(tb_node_operand(n, 0)), TB_OP_SCALAR);
    assert_int_equal(tb_node_shape(tb_node_operand(n, 1))->dtype, TB_I64);
    expect_shape(r, "f32[2,3]");
    expect_shape(tb_randn(&s0, NULL), "f64[2,0]");
    s0 = shp("i32[2]");
    expect_error(tb_rand(&s0, NULL), TB_ERR_DTYPE, "tb_rand", "i32[2]", NULL);
    expect_error(tb_randn(NULL, NULL), TB_ERR_INVALID_ARGUMENT, "tb_randn", "shape", NULL);

    /* scalar tensors */
    r = tb_scalar_tensor(sc_i(TB_BOOL, 5), NULL);
    assert_int_equal(tb_node_scalar(tb_tensor_node(r), &v), TB_OK);
    assert_int_equal(v.i, 1);
    expect_shape(r, "bool[]");
    expect_shape(tb_scalar_tensor(sc_f(TB_F64, 1e300), NULL), "f64[]");
    expect_shape(tb_scalar_tensor(sc_i(TB_I64, INT64_MIN), NULL), "i64[]");
    expect_error(tb_scalar_tensor(sc_i(TB_U8, 256), NULL), TB_ERR_INVALID_ARGUMENT,
                 "tb_scalar_tensor", "256", "u8");
    expect_error(tb_scalar_tensor(sc_i(TB_I32, 3000000000LL), NULL), TB_ERR_INVALID_ARGUMENT,
                 "tb_scalar_tensor", "i32", NULL);
    expect_error(tb_scalar_tensor(sc_i(TB_DTYPE_COUNT, 1), NULL), TB_ERR_DTYPE, "tb_scalar_tensor",
                 NULL, NULL);
}

/* ---- devices and the backend hook ---- */

static int fake_nodes_seen;

static tb_status fake_data_from_host(void *user_data, tb_backend_data *data, const void *host) {
    size_t n = 0;
    (void)user_data;
    tb_shape_nbytes(&data->shape, &n);
    data->payload = malloc(n > 0 ? n : 1);
    if (data->payload == NULL) return TB_ERR_OUT_OF_MEMORY;
    memcpy(data->payload, host, n);
    return TB_OK;
}

static tb_status fake_data_to_host(void *user_data, const tb_backend_data *data, void *host) {
    size_t n = 0;
    (void)user_data;
    tb_shape_nbytes(&data->shape, &n);
    memcpy(host, data->payload, n);
    return TB_OK;
}

static void fake_data_release(void *user_data, tb_backend_data *data) {
    (void)user_data;
    free(data->payload);
}

static tb_status fake_lower(void *user_data, const tb_graph *graph, void **context) {
    (void)user_data;
    (void)graph;
    (void)context;
    return tb_set_error(TB_ERR_UNSUPPORTED, "fake: cannot run graphs");
}

static tb_status fake_compile(void *user_data, void *context, void **computation) {
    (void)user_data;
    (void)context;
    (void)computation;
    return TB_ERR_UNSUPPORTED;
}

static tb_status fake_execute(void *user_data, void *computation, tb_backend_data *const *arguments,
                              size_t num_arguments, tb_backend_data *const *results,
                              size_t num_results) {
    (void)user_data;
    (void)computation;
    (void)arguments;
    (void)num_arguments;
    (void)results;
    (void)num_results;
    return TB_ERR_UNSUPPORTED;
}

static void fake_release_computation(void *user_data, void *computation) {
    (void)user_data;
    (void)computation;
}

static size_t fake_devices(void *user_data, tb_device *out, size_t cap) {
    (void)user_data;
    if (cap > 0) {
        out[0].type = TB_DEVICE_ACCELERATOR;
        out[0].ordinal = 0;
    }
    return 1;
}

static tb_status fake_on_node(void *user_data, const tb_node *node) {
    (void)user_data;
    fake_nodes_seen++;
    if (tb_node_op(node) == TB_OP_SIN) return tb_set_error(TB_ERR_UNSUPPORTED, "fake has no sin");
    if (tb_node_op(node) == TB_OP_COS) return TB_ERR_UNSUPPORTED;
    return TB_OK;
}

static void register_fake(tb_device *device) {
    tb_backend_impl impl;
    memset(&impl, 0, sizeof impl);
    impl.data_from_host = fake_data_from_host;
    impl.data_to_host = fake_data_to_host;
    impl.data_release = fake_data_release;
    impl.create_lowering_context = fake_lower;
    impl.compile = fake_compile;
    impl.execute = fake_execute;
    impl.release_computation = fake_release_computation;
    impl.get_backend_devices = fake_devices;
    impl.on_node_created = fake_on_node;
    if (tb_backend_register("fakedev", &impl, "debug") != TB_OK) {
        fail_msg("tb_backend_register: %s", tb_last_error());
    }
    assert_int_equal(tb_device_make("fakedev", 0, device), TB_OK);
}

static void test_devices_and_hook(void **state) {
    tb_device fake, cpu, where;
    tb_tensor *a, *b, *s, *r, *i;
    char text[64];
    (void)state;
    register_fake(&fake);
    assert_int_equal(tb_device_make("cpu", 0, &cpu), TB_OK);
    a = mk_on("f32[2,3]", &fake);
    i = mk_on("i32[2,3]", &fake);
    b = mk_on("f32[2,3]", &cpu);
    s = tb_scalar_tensor(sc_f(TB_F64, 2.0), &cpu);

    /* tensors must share a device; scalars follow the other operand */
    expect_error(tb_add(a, b), TB_ERR_INVALID_ARGUMENT, "tb_add", "fakedev:0", "cpu:0");
    expect_error(tb_matmul(b, a), TB_ERR_INVALID_ARGUMENT, "tb_matmul", "different devices", NULL);
    r = tb_mul(s, a);
    assert_non_null(r);
    where = tb_tensor_device(r);
    tb_device_format(&where, text, sizeof text);
    assert_string_equal(text, "fakedev:0");
    assert_int_equal(tb_node_op(operand(r, 0)), TB_OP_CAST); /* f64 scalar -> f32 */
    tb_device_format(&(tb_node_operand(operand(r, 0), 0)->device), text, sizeof text);
    assert_string_equal(text, "fakedev:0");
    tb_tensor_release(r);

    /* every recorded node is announced to the backend */
    fake_nodes_seen = 0;
    r = tb_exp(i); /* CAST + EXP */
    assert_int_equal(fake_nodes_seen, 2);
    tb_tensor_release(r);
    fake_nodes_seen = 0;
    r = tb_add_scalar(a, 1.0); /* SCALAR + ADD */
    assert_int_equal(fake_nodes_seen, 2);
    tb_tensor_release(r);

    /* the hook may refuse a node; its message is kept */
    expect_error(tb_sin(a), TB_ERR_UNSUPPORTED, "tb_sin", "fakedev", "fake has no sin");
    expect_error(tb_cos(i), TB_ERR_UNSUPPORTED, "tb_cos", "rejected the cos node", NULL);
    /* nodes of the cpu backend are not its business */
    expect_shape(tb_sin(b), "f32[2,3]");

    tb_tensor_release(a);
    tb_tensor_release(b);
    tb_tensor_release(s);
    tb_tensor_release(i);
}

/* ---- running out of memory ---- */

static long alloc_budget = -1; /* allocations left before failing; -1: no limit */

static void *budget_alloc(size_t size, void *user_data) {
    (void)user_data;
    if (alloc_budget == 0) return NULL;
    if (alloc_budget > 0) alloc_budget--;
    return malloc(size);
}

static void budget_free(void *ptr, void *user_data) {
    (void)user_data;
    free(ptr);
}

/* Either a tensor or an error with a message; never a crash or a leak. */
static int check_oom_result(tb_tensor *t) {
    if (t != NULL) {
        tb_tensor_release(t);
        return 1;
    }
    assert_int_not_equal(tb_last_status(), TB_OK);
    assert_true(strlen(tb_last_error()) > 0);
    tb_clear_error();
    return 0;
}

static void test_out_of_memory(void **state) {
    long n;
    int ok = 0;
    (void)state;
    for (n = 0; n < 2000 && ok < 8; n++) {
        tb_desc desc;
        tb_tensor *a, *b, *c, *w, *list[2];
        tb_shape s = shp("f32[2,3]");
        int64_t pads[2] = {1, 1};
        memset(&desc, 0, sizeof desc);
        desc.allocator.alloc = budget_alloc;
        desc.allocator.free = budget_free;
        alloc_budget = -1;
        assert_int_equal(tb_setup(&desc), TB_OK);
        a = mk("f32[3]");
        b = mk("f32[2,3,4]");
        c = mk("i32[2,3,4]");
        w = mk("f32[4]");
        list[0] = b;
        list[1] = c;
        alloc_budget = n;
        ok = 0;
        ok += check_oom_result(tb_matmul(a, b));
        ok += check_oom_result(tb_concat(list, 2, 1));
        ok += check_oom_result(tb_full(&s, 1.0, NULL));
        ok += check_oom_result(tb_add_scalar(c, 1.0));
        ok += check_oom_result(tb_layer_norm(b, 1, w, w, 1e-5));
        ok += check_oom_result(tb_pad(c, pads, 2, 0.0));
        ok += check_oom_result(tb_sum(c, NULL, 0, false));
        ok += check_oom_result(tb_rand(&s, NULL));
        alloc_budget = -1;
        tb_tensor_release(a);
        tb_tensor_release(b);
        tb_tensor_release(c);
        tb_tensor_release(w);
        tb_shutdown();
    }
    assert_int_equal(ok, 8); /* with enough memory every op succeeded */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unary_dtypes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unary_nodes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_binary_promotion_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_binary_wrapped_and_rank0, setup, teardown),
        cmocka_unit_test_setup_teardown(test_binary_broadcasting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_null_chaining, setup, teardown),
        cmocka_unit_test_setup_teardown(test_where_clamp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reductions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_matmul_shapes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_softmax_layer_norm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reshape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_permute_transpose, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expand_squeeze, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slice_flip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concat, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gather_index_select, setup, teardown),
        cmocka_unit_test_setup_teardown(test_creation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_devices_and_hook, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_memory, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
