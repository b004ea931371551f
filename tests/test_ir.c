/* The IR layer: the op table, custom op registration, node hashing, node lifetime and the node
   accessors. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <pthread.h>
#include <stdio.h>
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

static void assert_error(tb_status got, tb_status want, const char *part1, const char *part2) {
    assert_int_equal(got, want);
    assert_int_equal(tb_last_status(), want);
    if (part1 != NULL && strstr(tb_last_error(), part1) == NULL) {
        fail_msg("error '%s' does not contain '%s'", tb_last_error(), part1);
    }
    if (part2 != NULL && strstr(tb_last_error(), part2) == NULL) {
        fail_msg("error '%s' does not contain '%s'", tb_last_error(), part2);
    }
    tb_clear_error();
}

/* A tensor of zeros of the given shape on the current device. */
static tb_tensor *zeros_of(tb_dtype dtype, int32_t rank, const int64_t *dims) {
    tb_shape shape;
    static unsigned char buf[4096];
    assert_int_equal(tb_shape_make(&shape, dtype, rank, dims), TB_OK);
    memset(buf, 0, sizeof buf);
    return tb_tensor_from_host(buf, &shape, NULL);
}

static tb_tensor *filled(tb_dtype dtype, int32_t rank, const int64_t *dims, unsigned char byte) {
    tb_shape shape;
    static unsigned char buf[4096];
    assert_int_equal(tb_shape_make(&shape, dtype, rank, dims), TB_OK);
    memset(buf, byte, sizeof buf);
    return tb_tensor_from_host(buf, &shape, NULL);
}

static tb_status dummy_reference(const void *const *inputs, const tb_shape *input_shapes,
                                 size_t num_inputs, void *output, const tb_shape *output_shape,
                                 const int64_t *attrs, size_t num_attrs, void *user_data) {
    (void)inputs;
    (void)input_shapes;
    (void)num_inputs;
    (void)output;
    (void)output_shape;
    (void)attrs;
    (void)num_attrs;
    (void)user_data;
    return TB_OK;
}

/* ---- the op table ---- */

static void test_op_table_complete(void **state) {
    tb_op op, found;
    (void)state;
    for (op = 0; op < (tb_op)TB_OP_BUILTIN_COUNT; op++) {
        const char *name = tb_op_name(op);
        tb_op other;
        assert_non_null(name);
        assert_true(strlen(name) >= 1 && strlen(name) <= TB_MAX_NAME);
        for (other = op + 1; other < (tb_op)TB_OP_BUILTIN_COUNT; other++) {
            if (strcmp(name, tb_op_name(other)) == 0)
                fail_msg("ops %d and %d share '%s'", op, other, name);
        }
        assert_int_equal(tb_op_lookup(name, &found), TB_OK);
        assert_int_equal(found, op);
        assert_true(tb_op_get_kind(op) >= TB_KIND_LEAF && tb_op_get_kind(op) < TB_KIND_CUSTOM);
        assert_true(tb_op_arity(op) >= -1 && tb_op_arity(op) <= 3);
        assert_null(tb_op_custom_desc(op));
    }
    /* spot checks against the list */
    assert_string_equal(tb_op_name(TB_OP_ADD), "add");
    assert_int_equal(tb_op_get_kind(TB_OP_ADD), TB_KIND_BINARY);
    assert_int_equal(tb_op_arity(TB_OP_ADD), 2);
    assert_string_equal(tb_op_name(TB_OP_INDEX_SELECT), "index_select");
    assert_int_equal(tb_op_arity(TB_OP_CONCAT), -1);
    assert_int_equal(tb_op_arity(TB_OP_LAYER_NORM), -1);
    assert_int_equal(tb_op_get_kind(TB_OP_MATMUL), TB_KIND_MATMUL);
    assert_int_equal(tb_op_get_kind(TB_OP_RAND), TB_KIND_LEAF);
    assert_int_equal(tb_op_arity(TB_OP_RAND), 2);
}

static void test_op_table_unknown(void **state) {
    tb_op found = 1234;
    (void)state;
    assert_null(tb_op_name(-1));
    assert_null(tb_op_name((tb_op)TB_OP_BUILTIN_COUNT));
    assert_null(tb_op_name(INT32_MAX));
    assert_int_equal(tb_op_get_kind(-1), TB_KIND_INVALID);
    assert_int_equal(tb_op_get_kind((tb_op)TB_OP_BUILTIN_COUNT + 5), TB_KIND_INVALID);
    assert_int_equal(tb_op_arity(-7), -1);
    assert_null(tb_op_custom_desc(-1));
    assert_int_equal(tb_last_status(), TB_OK); /* no error for a question */

    assert_error(tb_op_lookup("no_such_op", &found), TB_ERR_NOT_FOUND, "tb_op_lookup",
                 "no_such_op");
    assert_int_equal(found, 1234);
    assert_error(tb_op_lookup(NULL, &found), TB_ERR_INVALID_ARGUMENT, "tb_op_lookup", "name");
    assert_error(tb_op_lookup("add", NULL), TB_ERR_INVALID_ARGUMENT, "tb_op_lookup", "out");
}

/* ---- custom ops ---- */

static tb_custom_op_desc good_desc(const char *name) {
    tb_custom_op_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.name = name;
    desc.num_inputs = 2;
    desc.reference = dummy_reference;
    return desc;
}

static void test_custom_op_register(void **state) {
    char name[32] = "my_fma";
    char expr[32] = "x0 * x1";
    tb_custom_op_desc desc = good_desc(name);
    const tb_custom_op_desc *copy;
    tb_op op = -1, again = -1, found = -1, second = -1;
    int user = 7;
    (void)state;
    desc.opencl_expr = expr;
    desc.user_data = &user;
    assert_int_equal(tb_op_register(&desc, &op), TB_OK);
    assert_int_equal(op, (tb_op)TB_OP_BUILTIN_COUNT);
    /* the strings were copied */
    strcpy(name, "changed");
    strcpy(expr, "garbage");
    assert_string_equal(tb_op_name(op), "my_fma");
    assert_int_equal(tb_op_get_kind(op), TB_KIND_CUSTOM);
    assert_int_equal(tb_op_arity(op), 2);
    copy = tb_op_custom_desc(op);
    assert_non_null(copy);
    assert_string_equal(copy->name, "my_fma");
    assert_string_equal(copy->opencl_expr, "x0 * x1");
    assert_ptr_equal(copy->user_data, &user);
    assert_ptr_equal(copy->reference, dummy_reference);
    assert_int_equal(tb_op_lookup("my_fma", &found), TB_OK);
    assert_int_equal(found, op);

    desc = good_desc("my_fma");
    assert_error(tb_op_register(&desc, &again), TB_ERR_DUPLICATE, "tb_op_register", "my_fma");
    assert_int_equal(again, -1);

    desc = good_desc("second_op");
    desc.num_inputs = 1;
    assert_int_equal(tb_op_register(&desc, &second), TB_OK);
    assert_int_equal(second, op + 1);
    assert_null(tb_op_custom_desc(second)->opencl_expr);

    /* tb_shutdown forgets them; ids start again */
    tb_shutdown();
    assert_int_equal(tb_op_lookup("my_fma", &found), TB_ERR_NOT_FOUND);
    tb_clear_error();
    assert_null(tb_op_name(op));
    desc = good_desc("second_op");
    assert_int_equal(tb_op_register(&desc, &again), TB_OK);
    assert_int_equal(again, (tb_op)TB_OP_BUILTIN_COUNT);
}

static void test_custom_op_register_errors(void **state) {
    tb_custom_op_desc desc;
    tb_op op = -1;
    char long_name[TB_MAX_NAME + 2];
    char max_name[TB_MAX_NAME + 1];
    (void)state;
    assert_error(tb_op_register(NULL, &op), TB_ERR_INVALID_ARGUMENT, "tb_op_register", "desc");
    desc = good_desc("fine");
    assert_error(tb_op_register(&desc, NULL), TB_ERR_INVALID_ARGUMENT, "tb_op_register", "out");

    desc = good_desc(NULL);
    assert_error(tb_op_register(&desc, &op), TB_ERR_INVALID_ARGUMENT, "tb_op_register", "name");
    desc = good_desc("");
    assert_error(tb_op_register(&desc, &op), TB_ERR_INVALID_ARGUMENT, "tb_op_register", "name");
    desc = good_desc("1abc");
    assert_error(tb_op_register(&desc, &op), TB_ERR_INVALID_ARGUMENT, "tb_op_register", "1abc");
    desc = good_desc("has-dash");
    assert_error(tb_op_register(&desc, &op), TB_ERR_INVALID_ARGUMENT, "tb_op_register", "has-dash");
    desc = good_desc("has space");
    assert_error(tb_op_register(&desc, &op), TB_ERR_INVALID_ARGUMENT, "tb_op_register", NULL);
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    desc = good_desc(long_name);
    assert_error(tb_op_register(&desc, &op), TB_ERR_INVALID_ARGUMENT, "tb_op_register", "name");

    desc = good_desc("add");
    assert_error(tb_op_register(&desc, &op), TB_ERR_DUPLICATE, "tb_op_register", "add");
    desc = good_desc("layer_norm");
    assert_error(tb_op_register(&desc, &op), TB_ERR_DUPLICATE, "tb_op_register", "layer_norm");

    desc = good_desc("no_reference");
    desc.reference = NULL;
    assert_error(tb_op_register(&desc, &op), TB_ERR_INVALID_ARGUMENT, "tb_op_register",
                 "reference");
    desc = good_desc("zero_inputs");
    desc.num_inputs = 0;
    assert_error(tb_op_register(&desc, &op), TB_ERR_INVALID_ARGUMENT, "tb_op_register",
                 "num_inputs 0");
    desc.num_inputs = 9;
    assert_error(tb_op_register(&desc, &op), TB_ERR_INVALID_ARGUMENT, "tb_op_register",
                 "num_inputs 9");
    desc.num_inputs = -1;
    assert_error(tb_op_register(&desc, &op), TB_ERR_INVALID_ARGUMENT, "tb_op_register",
                 "num_inputs -1");
    assert_int_equal(op, -1); /* untouched by every failure */
    assert_int_equal(tb_op_lookup("zero_inputs", &op), TB_ERR_NOT_FOUND);
    tb_clear_error();

    /* the limits themselves are fine */
    memset(max_name, 'z', sizeof max_name - 1);
    max_name[sizeof max_name - 1] = '\0';
    desc = good_desc(max_name);
    desc.num_inputs = 8;
    assert_int_equal(tb_op_register(&desc, &op), TB_OK);
    assert_int_equal(tb_op_arity(op), 8);
    desc = good_desc("_x9");
    desc.num_inputs = 1;
    assert_int_equal(tb_op_register(&desc, &op), TB_OK);
}

/* Several threads register and look up ops at once: every id is distinct and found again. */
#define REG_THREADS    4
#define REG_PER_THREAD 50

typedef struct reg_job {
    int index;
    tb_op ids[REG_PER_THREAD];
    int failures;
} reg_job;

static void *register_many(void *arg) {
    reg_job *job = (reg_job *)arg;
    int i;
    for (i = 0; i < REG_PER_THREAD; i++) {
        char name[32];
        tb_custom_op_desc desc;
        tb_op found = -1;
        snprintf(name, sizeof name, "op_%d_%d", job->index, i);
        desc = good_desc(name);
        if (tb_op_register(&desc, &job->ids[i]) != TB_OK) job->failures++;
        if (tb_op_lookup(name, &found) != TB_OK || found != job->ids[i]) job->failures++;
        if (tb_op_name(TB_OP_MATMUL) == NULL) job->failures++;
    }
    return NULL;
}

static void test_custom_op_threads(void **state) {
    pthread_t threads[REG_THREADS];
    reg_job jobs[REG_THREADS];
    int t, i, u, v;
    (void)state;
    tb_setup(NULL); /* the registry is set up before the threads start */
    for (t = 0; t < REG_THREADS; t++) {
        memset(&jobs[t], 0, sizeof jobs[t]);
        jobs[t].index = t;
        assert_int_equal(pthread_create(&threads[t], NULL, register_many, &jobs[t]), 0);
    }
    for (t = 0; t < REG_THREADS; t++)
        assert_int_equal(pthread_join(threads[t], NULL), 0);
    for (t = 0; t < REG_THREADS; t++) {
        assert_int_equal(jobs[t].failures, 0);
        for (i = 0; i < REG_PER_THREAD; i++) {
            char name[32];
            snprintf(name, sizeof name, "op_%d_%d", t, i);
            assert_string_equal(tb_op_name(jobs[t].ids[i]), name);
            for (u = t; u < REG_THREADS; u++) {
                for (v = (u == t ? i + 1 : 0); v < REG_PER_THREAD; v++) {
                    assert_true(jobs[t].ids[i] != jobs[u].ids[v]);
                }
            }
        }
    }
}

/* ---- custom ops through tb_call_op ---- */

static tb_status concat_rows_shape(const tb_shape *inputs, size_t num_inputs, const int64_t *attrs,
                                   size_t num_attrs, tb_shape *out, void *user_data) {
    (void)user_data;
    if (num_inputs != 2 || num_attrs != 1) return TB_ERR_INVALID_ARGUMENT;
    if (attrs[0] < 0)
        return tb_set_error(TB_ERR_SHAPE, "attr must be >= 0, got %lld", (long long)attrs[0]);
    if (attrs[0] == 1) return TB_ERR_SHAPE; /* fails without a message */
    if (attrs[0] == 2) {                    /* a broken callback */
        out->dtype = TB_F32;
        out->rank = 9;
        return TB_OK;
    }
    *out = inputs[0];
    out->dims[0] = inputs[0].dims[0] + inputs[1].dims[0];
    return TB_OK;
}

static void test_custom_op_call(void **state) {
    tb_custom_op_desc desc = good_desc("elementwise2");
    tb_op ew = -1, rows = -1;
    int64_t d23[2] = {2, 3}, d3[1] = {3}, d4[1] = {4}, d53[2] = {5, 3};
    tb_tensor *a, *b, *c, *r, *ins[2];
    tb_shape s;
    int64_t attr;
    (void)state;
    assert_int_equal(tb_op_register(&desc, &ew), TB_OK);
    desc = good_desc("rows");
    desc.infer_shape = concat_rows_shape;
    assert_int_equal(tb_op_register(&desc, &rows), TB_OK);

    a = zeros_of(TB_F32, 2, d23);
    b = zeros_of(TB_I32, 1, d3);
    c = zeros_of(TB_F64, 1, d4);
    ins[0] = a;
    ins[1] = b;
    /* elementwise: broadcast and promoted dtype, operands as given (no casts) */
    r = tb_call_op(ew, ins, 2, NULL, 0);
    assert_non_null(r);
    s = tb_tensor_shape(r);
    assert_int_equal(s.dtype, TB_F32);
    assert_int_equal(s.rank, 2);
    assert_int_equal(s.dims[0], 2);
    assert_int_equal(s.dims[1], 3);
    assert_int_equal(tb_node_op(tb_tensor_node(r)), ew);
    assert_int_equal(tb_node_operand(tb_tensor_node(r), 1)->shape.dtype, TB_I32);
    tb_tensor_release(r);

    ins[1] = c;
    assert_null(tb_call_op(ew, ins, 2, NULL, 0));
    assert_error(TB_ERR_SHAPE, TB_ERR_SHAPE, "tb_call_op(elementwise2)", "f32[2,3] and f64[4]");
    assert_null(tb_call_op(ew, ins, 1, NULL, 0));
    assert_error(TB_ERR_INVALID_ARGUMENT, TB_ERR_INVALID_ARGUMENT, "elementwise2", "expected 2");

    /* infer_shape callback */
    tb_tensor_release(c);
    c = zeros_of(TB_F32, 2, d53);
    ins[1] = c;
    attr = 0;
    r = tb_call_op(rows, ins, 2, &attr, 1);
    assert_non_null(r);
    s = tb_tensor_shape(r);
    assert_int_equal(s.rank, 2);
    assert_int_equal(s.dims[0], 7);
    assert_int_equal(s.dims[1], 3);
    assert_int_equal(tb_node_num_attrs(tb_tensor_node(r)), 1);
    tb_tensor_release(r);
    attr = -3;
    assert_null(tb_call_op(rows, ins, 2, &attr, 1));
    assert_error(TB_ERR_SHAPE, TB_ERR_SHAPE, "tb_call_op(rows)", "attr must be >= 0, got -3");
    attr = 1;
    assert_null(tb_call_op(rows, ins, 2, &attr, 1));
    assert_error(TB_ERR_SHAPE, TB_ERR_SHAPE, "tb_call_op(rows)", "infer_shape failed");
    attr = 2;
    assert_null(tb_call_op(rows, ins, 2, &attr, 1));
    assert_error(TB_ERR_SHAPE, TB_ERR_SHAPE, "tb_call_op(rows)", "invalid shape");

    assert_null(tb_call_op(9999, ins, 2, NULL, 0));
    assert_error(TB_ERR_NOT_FOUND, TB_ERR_NOT_FOUND, "tb_call_op", "9999");
    tb_tensor_release(a);
    tb_tensor_release(b);
    tb_tensor_release(c);
}

/* ---- built-ins through tb_call_op and the shape inference ---- */

static void test_call_builtin(void **state) {
    int64_t d23[2] = {2, 3}, d34[2] = {3, 4}, d45[2] = {4, 5};
    tb_tensor *a = zeros_of(TB_F32, 2, d23), *b = zeros_of(TB_F32, 2, d34);
    tb_tensor *c = zeros_of(TB_F32, 2, d45), *i = zeros_of(TB_I32, 2, d23);
    tb_tensor *ins[3], *r;
    int64_t attrs[4];
    tb_shape s;
    (void)state;
    ins[0] = a;
    ins[1] = b;
    r = tb_call_op(TB_OP_MATMUL, ins, 2, NULL, 0);
    assert_non_null(r);
    s = tb_tensor_shape(r);
    assert_int_equal(s.rank, 2);
    assert_int_equal(s.dims[0], 2);
    assert_int_equal(s.dims[1], 4);
    tb_tensor_release(r);
    ins[1] = c;
    assert_null(tb_call_op(TB_OP_MATMUL, ins, 2, NULL, 0));
    assert_error(TB_ERR_SHAPE, TB_ERR_SHAPE,
                 "tb_call_op(matmul): shapes f32[2,3] and f32[4,5] do not match (3 != 4)", NULL);

    /* the normal form: no promotion inside tb_call_op */
    ins[1] = i;
    assert_null(tb_call_op(TB_OP_ADD, ins, 2, NULL, 0));
    assert_error(TB_ERR_DTYPE, TB_ERR_DTYPE, "tb_call_op(add)", "f32[2,3] and i32[2,3]");
    assert_null(tb_call_op(TB_OP_EXP, &i, 1, NULL, 0));
    assert_error(TB_ERR_DTYPE, TB_ERR_DTYPE, "tb_call_op(exp)", "i32[2,3]");

    /* arity and attributes */
    assert_null(tb_call_op(TB_OP_ADD, ins, 1, NULL, 0));
    assert_error(TB_ERR_INVALID_ARGUMENT, TB_ERR_INVALID_ARGUMENT, "tb_call_op(add)",
                 "expected 2 operands, got 1");
    attrs[0] = 1;
    assert_null(tb_call_op(TB_OP_SUM, &a, 1, attrs, 1));
    assert_error(TB_ERR_INVALID_ARGUMENT, TB_ERR_INVALID_ARGUMENT, "tb_call_op(sum)",
                 "expected 2 attributes");
    attrs[1] = 0;
    r = tb_call_op(TB_OP_SUM, &a, 1, attrs, 2);
    assert_non_null(r);
    s = tb_tensor_shape(r);
    assert_int_equal(s.rank, 1);
    assert_int_equal(s.dims[0], 3);
    tb_tensor_release(r);
    attrs[0] = 4; /* axis 2 does not exist */
    assert_null(tb_call_op(TB_OP_SUM, &a, 1, attrs, 2));
    assert_error(TB_ERR_SHAPE, TB_ERR_SHAPE, "tb_call_op(sum)", "f32[2,3]");
    attrs[0] = 1;
    attrs[1] = 1;
    attrs[2] = 3;
    attrs[3] = 1;
    r = tb_call_op(TB_OP_SLICE, &a, 1, attrs, 4);
    assert_non_null(r);
    assert_int_equal(tb_tensor_shape(r).dims[0], 2);
    assert_int_equal(tb_tensor_shape(r).dims[1], 2);
    tb_tensor_release(r);
    attrs[2] = 5; /* end beyond the dim: not normal form */
    assert_null(tb_call_op(TB_OP_SLICE, &a, 1, attrs, 4));
    assert_error(TB_ERR_SHAPE, TB_ERR_SHAPE, "tb_call_op(slice)", "f32[2,3]");
    attrs[0] = 17;
    assert_null(tb_call_op(TB_OP_CAST, &a, 1, attrs, 1));
    assert_error(TB_ERR_DTYPE, TB_ERR_DTYPE, "tb_call_op(cast)", "17");
    assert_null(tb_call_op(TB_OP_ADD, ins, 2, NULL, TB_MAX_ATTRS + 1));
    assert_error(TB_ERR_INVALID_ARGUMENT, TB_ERR_INVALID_ARGUMENT, "tb_call_op(add)", NULL);
    assert_null(tb_call_op(TB_OP_SUM, &a, 1, NULL, 2));
    assert_error(TB_ERR_INVALID_ARGUMENT, TB_ERR_INVALID_ARGUMENT, "tb_call_op(sum)", "attrs");

    /* leaves are created by their own functions */
    assert_null(tb_call_op(TB_OP_EYE, ins, 1, NULL, 0));
    assert_error(TB_ERR_UNSUPPORTED, TB_ERR_UNSUPPORTED, "tb_call_op(eye)", NULL);
    assert_null(tb_call_op(TB_OP_DEVICE_DATA, NULL, 0, NULL, 0));
    assert_error(TB_ERR_UNSUPPORTED, TB_ERR_UNSUPPORTED, "tb_call_op(device_data)", NULL);
    assert_null(tb_call_op(TB_OP_NEG, NULL, 1, NULL, 0));
    assert_error(TB_ERR_INVALID_ARGUMENT, TB_ERR_INVALID_ARGUMENT, "tb_call_op(neg)", "inputs");

    /* a NULL input keeps the first error */
    tb_set_error(TB_ERR_EXECUTE, "first failure");
    ins[0] = NULL;
    assert_null(tb_call_op(TB_OP_ADD, ins, 2, NULL, 0));
    assert_error(TB_ERR_EXECUTE, TB_ERR_EXECUTE, "first failure", NULL);
    assert_null(tb_call_op(TB_OP_ADD, ins, 2, NULL, 0));
    assert_error(TB_ERR_INVALID_ARGUMENT, TB_ERR_INVALID_ARGUMENT, "tb_call_op(add)",
                 "inputs[0] is NULL");

    tb_tensor_release(a);
    tb_tensor_release(b);
    tb_tensor_release(c);
    tb_tensor_release(i);
}

static tb_shape shape_of(tb_dtype dtype, int32_t rank, const int64_t *dims) {
    tb_shape s;
    assert_int_equal(tb_shape_make(&s, dtype, rank, dims), TB_OK);
    return s;
}

static void test_infer_shape_direct(void **state) {
    int64_t d23[2] = {2, 3}, d45[2] = {4, 5}, d3[1] = {3}, d4[1] = {4}, d20[2] = {2, 0};
    tb_shape in[3], out;
    int64_t attrs[4];
    (void)state;
    in[0] = shape_of(TB_F32, 2, d23);
    in[1] = shape_of(TB_F32, 2, d45);
    assert_int_equal(tb__op_infer_shape(TB_OP_MATMUL, in, 2, NULL, 0, &out), TB_ERR_SHAPE);
    assert_string_equal(tb_last_error(),
                        "matmul: shapes f32[2,3] and f32[4,5] do not match (3 != 4)");
    tb_clear_error();

    in[1] = shape_of(TB_F32, 1, d4);
    assert_int_equal(tb__op_infer_shape(TB_OP_ADD, in, 2, NULL, 0, &out), TB_ERR_SHAPE);
    assert_string_equal(tb_last_error(), "add: shapes f32[2,3] and f32[4] do not broadcast");
    tb_clear_error();

    in[1] = shape_of(TB_F32, 1, d3);
    assert_int_equal(tb__op_infer_shape(TB_OP_LT, in, 2, NULL, 0, &out), TB_OK);
    assert_int_equal(out.dtype, TB_BOOL);
    assert_int_equal(out.rank, 2);

    in[0] = shape_of(TB_BOOL, 1, d3);
    in[2] = shape_of(TB_F32, 2, d23);
    in[1] = shape_of(TB_F32, 0, NULL);
    assert_int_equal(tb__op_infer_shape(TB_OP_WHERE, in, 3, NULL, 0, &out), TB_OK);
    assert_int_equal(out.dtype, TB_F32);
    assert_int_equal(out.rank, 2);
    in[2] = shape_of(TB_F32, 1, d4);
    assert_int_equal(tb__op_infer_shape(TB_OP_WHERE, in, 3, NULL, 0, &out), TB_ERR_SHAPE);
    assert_string_equal(tb_last_error(),
                        "where: shapes bool[3], f32[] and f32[4] do not broadcast");
    tb_clear_error();

    /* reductions: bitmask and keepdim */
    in[0] = shape_of(TB_F32, 2, d23);
    attrs[0] = 2;
    attrs[1] = 1;
    assert_int_equal(tb__op_infer_shape(TB_OP_MAX, in, 1, attrs, 2, &out), TB_OK);
    assert_int_equal(out.rank, 2);
    assert_int_equal(out.dims[0], 2);
    assert_int_equal(out.dims[1], 1);
    attrs[0] = 0; /* nothing reduced */
    attrs[1] = 0;
    assert_int_equal(tb__op_infer_shape(TB_OP_SUM, in, 1, attrs, 2, &out), TB_OK);
    assert_int_equal(out.rank, 2);
    in[0] = shape_of(TB_F32, 2, d20);
    attrs[0] = 2;
    assert_int_equal(tb__op_infer_shape(TB_OP_MIN, in, 1, attrs, 2, &out), TB_ERR_SHAPE);
    assert_non_null(
        strstr(tb_last_error(), "min: cannot reduce over axis 1 of size 0 in f32[2,0]"));
    tb_clear_error();
    assert_int_equal(tb__op_infer_shape(TB_OP_SUM, in, 1, attrs, 2, &out), TB_OK);
    assert_int_equal(out.rank, 1);
    assert_int_equal(out.dims[0], 2);

    /* pad attrs per axis from axis 0 */
    in[0] = shape_of(TB_F32, 2, d23);
    in[1] = shape_of(TB_F32, 0, NULL);
    attrs[0] = 1;
    attrs[1] = 2;
    attrs[2] = 0;
    attrs[3] = 4;
    assert_int_equal(tb__op_infer_shape(TB_OP_PAD, in, 2, attrs, 4, &out), TB_OK);
    assert_int_equal(out.dims[0], 5);
    assert_int_equal(out.dims[1], 7);
    in[1] = shape_of(TB_F64, 0, NULL);
    assert_int_equal(tb__op_infer_shape(TB_OP_PAD, in, 2, attrs, 4, &out), TB_ERR_SHAPE);
    tb_clear_error();

    /* leaves are not inferred */
    assert_int_equal(tb__op_infer_shape(TB_OP_ARANGE, NULL, 0, NULL, 0, &out), TB_ERR_UNSUPPORTED);
    assert_non_null(strstr(tb_last_error(), "arange"));
    tb_clear_error();
}

/* ---- hashing ---- */

static uint64_t hash_of(tb_tensor *t) {
    assert_non_null(t);
    assert_non_null(tb_tensor_node(t));
    return tb_node_hash(tb_tensor_node(t));
}

static void test_hash(void **state) {
    int64_t d23[2] = {2, 3}, d32[2] = {3, 2};
    tb_tensor *a = filled(TB_F32, 2, d23, 0x11), *b = filled(TB_F32, 2, d23, 0x22);
    tb_tensor *c = filled(TB_F32, 2, d32, 0x11), *d = filled(TB_F64, 2, d23, 0x11);
    tb_tensor *r1, *r2, *r3, *r4, *r5;
    int32_t axis0 = 0, axis1 = 1;
    tb_scalar one, two;
    tb_shape sa = tb_tensor_shape(a);
    (void)state;

    /* same structure, different data */
    r1 = tb_exp(a);
    r2 = tb_exp(b);
    assert_true(hash_of(r1) == hash_of(r2));
    assert_true(tb_node_id(tb_tensor_node(r2)) > tb_node_id(tb_tensor_node(r1)));
    /* different op, shape, dtype */
    r3 = tb_sin(a);
    r4 = tb_exp(c);
    r5 = tb_exp(d);
    assert_true(hash_of(r1) != hash_of(r3));
    assert_true(hash_of(r1) != hash_of(r4));
    assert_true(hash_of(r1) != hash_of(r5));
    tb_tensor_release(r1);
    tb_tensor_release(r2);
    tb_tensor_release(r3);
    tb_tensor_release(r4);
    tb_tensor_release(r5);

    /* different attributes */
    r1 = tb_sum(a, &axis0, 1, false);
    r2 = tb_sum(b, &axis0, 1, false);
    r3 = tb_sum(a, &axis1, 1, false);
    r4 = tb_sum(a, &axis0, 1, true);
    assert_true(hash_of(r1) == hash_of(r2));
    assert_true(hash_of(r1) != hash_of(r3));
    assert_true(hash_of(r1) != hash_of(r4));
    tb_tensor_release(r1);
    tb_tensor_release(r2);
    tb_tensor_release(r3);
    tb_tensor_release(r4);

    /* float attributes */
    r1 = tb_arange(0, 6, 1, TB_F32, NULL);
    r2 = tb_arange(0, 12, 2, TB_F32, NULL);
    r3 = tb_arange(1, 7, 1, TB_F32, NULL);
    assert_true(hash_of(r1) != hash_of(r2));
    assert_true(hash_of(r1) != hash_of(r3));
    tb_tensor_release(r1);
    tb_tensor_release(r2);
    tb_tensor_release(r3);

    /* scalar values are parameters */
    r1 = tb_add_scalar(a, 1.0);
    r2 = tb_add_scalar(b, 2.5);
    assert_true(hash_of(r1) == hash_of(r2));
    tb_tensor_release(r1);
    tb_tensor_release(r2);
    r1 = tb_full(&sa, 3.0, NULL);
    r2 = tb_full(&sa, -7.0, NULL);
    assert_true(hash_of(r1) == hash_of(r2));
    tb_tensor_release(r1);
    tb_tensor_release(r2);
    memset(&one, 0, sizeof one);
    one.dtype = TB_F32;
    one.f = 1.0;
    two = one;
    two.f = 2.0;
    r1 = tb_scalar_tensor(one, NULL);
    r2 = tb_scalar_tensor(two, NULL);
    assert_true(hash_of(r1) == hash_of(r2));
    r3 = tb_mul(a, r1);
    r4 = tb_mul(b, r2);
    assert_true(hash_of(r3) == hash_of(r4));
    r5 = tb_mul_scalar(a, 1.0); /* a wrapped number is another kind of leaf */
    assert_true(hash_of(r3) != hash_of(r5));
    tb_tensor_release(r1);
    tb_tensor_release(r2);
    tb_tensor_release(r3);
    tb_tensor_release(r4);
    tb_tensor_release(r5);

    /* seeds of rand are scalar parameters too */
    r1 = tb_rand(&sa, NULL);
    r2 = tb_rand(&sa, NULL);
    assert_true(hash_of(r1) == hash_of(r2));
    tb_tensor_release(r1);
    tb_tensor_release(r2);

    tb_tensor_release(a);
    tb_tensor_release(b);
    tb_tensor_release(c);
    tb_tensor_release(d);
}

/* ---- node lifetime ---- */

static void test_long_chain_release(void **state) {
    const size_t length = 1000000;
    tb_shape shape;
    tb_device device;
    tb_scalar value;
    tb_node *node, *next;
    size_t i;
    (void)state;
    memset(&device, 0, sizeof device);
    memset(&value, 0, sizeof value);
    value.dtype = TB_F32;
    value.f = 1.0;
    node = tb__node_scalar(value, &device, false);
    assert_non_null(node);
    shape = node->shape;
    for (i = 0; i < length; i++) {
        next = tb__node_new(TB_OP_NEG, &shape, &device, &node, 1, NULL, 0, NULL);
        assert_non_null(next);
        tb__node_release(node); /* the new node holds the only reference */
        node = next;
    }
    assert_int_equal(node->refcount, 1);
    tb__node_release(node); /* frees a million nodes without a million stack frames */
}

static void test_wide_release(void **state) {
    /* a node with many operands that die with it, to grow the release stack */
    enum { WIDE = 1000 };
    tb_node *leaves[WIDE], *root, *shared;
    tb_device device;
    tb_scalar value;
    size_t i;
    (void)state;
    memset(&device, 0, sizeof device);
    memset(&value, 0, sizeof value);
    value.dtype = TB_I64;
    shared = tb__node_scalar(value, &device, true);
    assert_non_null(shared);
    for (i = 0; i < WIDE; i++) {
        tb_shape s = shared->shape;
        leaves[i] = tb__node_new(TB_OP_NEG, &s, &device, &shared, 1, NULL, 0, NULL);
        assert_non_null(leaves[i]);
    }
    assert_int_equal(shared->refcount, WIDE + 1);
    root = tb__node_new(TB_OP_CONCAT, &shared->shape, &device, leaves, WIDE, NULL, 0, NULL);
    assert_non_null(root);
    for (i = 0; i < WIDE; i++)
        tb__node_release(leaves[i]);
    tb__node_retain(shared);
    tb__node_release(shared);
    tb__node_release(shared);
    tb__node_release(root);
}

static void test_node_fields(void **state) {
    int64_t d23[2] = {2, 3};
    tb_tensor *a = zeros_of(TB_F32, 2, d23), *r;
    const tb_node *n, *leaf;
    tb_scalar s;
    int64_t pads[4] = {1, 2, 3, 4};
    (void)state;
    r = tb_pad(a, pads, 4, 1.5);
    assert_non_null(r);
    n = tb_tensor_node(r);
    assert_int_equal(tb_node_op(n), TB_OP_PAD);
    assert_int_equal(tb_node_num_operands(n), 2);
    assert_int_equal(tb_node_num_attrs(n), 4);
    /* pads run from the last dim; attrs from dim 0 */
    assert_int_equal(tb_node_attr(n, 0), 3);
    assert_int_equal(tb_node_attr(n, 1), 4);
    assert_int_equal(tb_node_attr(n, 2), 1);
    assert_int_equal(tb_node_attr(n, 3), 2);
    assert_int_equal(tb_node_attr(n, 4), 0);
    assert_int_equal(tb_node_attr(n, 1000), 0);
    assert_true(tb_node_fattr(n, 0) == 0.0);
    assert_true(tb_node_fattr(n, 2) == 0.0);
    assert_null(tb_node_operand(n, 2));
    assert_null(tb_node_data(n));
    assert_int_equal(tb_node_shape(n)->dims[0], 2 + 4 + 3);
    assert_int_equal(tb_node_shape(n)->dims[1], 3 + 1 + 2);
    leaf = tb_node_operand(n, 1);
    assert_int_equal(tb_node_op(leaf), TB_OP_SCALAR);
    assert_int_equal(tb_node_scalar(leaf, &s), TB_OK);
    assert_int_equal(s.dtype, TB_F32);
    assert_true(s.f == 1.5);
    assert_error(tb_node_scalar(n, &s), TB_ERR_INVALID_ARGUMENT, "tb_node_scalar", "pad");
    assert_error(tb_node_scalar(leaf, NULL), TB_ERR_INVALID_ARGUMENT, "tb_node_scalar", "out");
    leaf = tb_node_operand(n, 0);
    assert_int_equal(tb_node_op(leaf), TB_OP_DEVICE_DATA);
    assert_non_null(tb_node_data(leaf));
    assert_int_equal(tb_node_num_operands(leaf), 0);
    tb_tensor_release(r);

    r = tb_layer_norm(a, 1, NULL, NULL, 1e-5);
    n = tb_tensor_node(r);
    assert_int_equal(tb_node_op(n), TB_OP_LAYER_NORM);
    assert_true(tb_node_fattr(n, 0) == 1e-5);
    assert_int_equal(tb_node_attr(n, 0), 1);
    assert_int_equal(tb_node_attr(n, 1), 0);
    assert_int_equal(tb_node_attr(n, 2), 0);
    tb_tensor_release(r);
    tb_tensor_release(a);
}

static void test_node_accessors_null(void **state) {
    tb_scalar s;
    (void)state;
    assert_int_equal(tb_node_op(NULL), -1);
    assert_null(tb_node_shape(NULL));
    assert_int_equal(tb_node_num_operands(NULL), 0);
    assert_null(tb_node_operand(NULL, 0));
    assert_int_equal(tb_node_num_attrs(NULL), 0);
    assert_int_equal(tb_node_attr(NULL, 0), 0);
    assert_true(tb_node_fattr(NULL, 0) == 0.0);
    assert_true(tb_node_hash(NULL) == 0);
    assert_true(tb_node_id(NULL) == 0);
    assert_null(tb_node_data(NULL));
    assert_int_equal(tb_last_status(), TB_OK);
    assert_error(tb_node_scalar(NULL, &s), TB_ERR_INVALID_ARGUMENT, "tb_node_scalar", "node");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_op_table_complete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_op_table_unknown, setup, teardown),
        cmocka_unit_test_setup_teardown(test_custom_op_register, setup, teardown),
        cmocka_unit_test_setup_teardown(test_custom_op_register_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_custom_op_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_custom_op_call, setup, teardown),
        cmocka_unit_test_setup_teardown(test_call_builtin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_infer_shape_direct, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hash, setup, teardown),
        cmocka_unit_test_setup_teardown(test_long_chain_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wide_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_node_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_node_accessors_null, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
