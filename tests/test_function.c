/* tb_function: a pending graph recorded as a function of its inputs and replayed on new ones.
   Values against the same ops recorded by hand, the structure of the replayed graph, what is
   shared and what is not, gradients through a call, scopes, that a function keeps none of its
   inputs' values, and every error. On the cpu backend; devices other than the cpu's only where
   an error needs one. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})

static tb_device cpu;

static tb_tensor *from(const float *v, int32_t rank, const int64_t *dims) {
    tb_shape s;
    tb_tensor *t;
    assert_int_equal(tb_shape_make(&s, TB_F32, rank, dims), TB_OK);
    t = tb_tensor_from_host(v, &s, &cpu);
    assert_non_null(t);
    return t;
}

static void read_f32(tb_tensor *t, float *out, size_t n) {
    tb_status st = tb_tensor_to_host(t, out, n * sizeof(float));
    if (st != TB_OK) fprintf(stderr, "%s\n", tb_last_error());
    assert_int_equal(st, TB_OK);
}

static void assert_close(const float *a, const float *b, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        if (fabsf(a[i] - b[i]) > 1e-5f * (1.0f + fabsf(b[i]))) {
            fail_msg("element %zu: %g, expected %g", i, (double)a[i], (double)b[i]);
        }
    }
}

/* The model the tests record: y = relu(x @ w + b) * 0.5 and s = sum(y) + sum(exp(w)), where
   exp(w) reads no input. Every intermediate is left to the caller's scope. */
static void model(tb_tensor *x, tb_tensor *w, tb_tensor *b, tb_tensor **y, tb_tensor **s) {
    tb_tensor *ew = tb_sum(tb_exp(w), NULL, 0, false);
    *y = tb_mul_scalar(tb_relu(tb_add(tb_matmul(x, w), b)), 0.5);
    *s = tb_add(tb_sum(*y, NULL, 0, false), ew);
    assert_non_null(*y);
    assert_non_null(*s);
}

static const float wv[] = {0.5f, -1, 0.25f, 2, 1, 0.5f, -0.5f, 0, -2, 1.5f, 1, -1};
static const float bv[] = {0.1f, -0.2f, 0.3f, 0};
static const float xv[] = {1, 2, 3, -1, 0, 4}, x2v[] = {-3, 1, 0.5f, 2, 2, -1};

/* The model's parameters w, b, the input it is recorded on (x) and a second input (x2). */
static void model_inputs(tb_tensor **x, tb_tensor **x2, tb_tensor **w, tb_tensor **b) {
    *x = from(xv, 2, DIMS(2, 3));
    *x2 = from(x2v, 2, DIMS(2, 3));
    *w = from(wv, 2, DIMS(3, 4));
    *b = from(bv, 1, DIMS(4));
}

static void test_values_and_structure(void **state) {
    float got[8], want[8], gs, ws;
    tb_tensor *x, *x2, *w, *b, *y, *s, *out[2], *ry, *rs;
    tb_function *f;
    char *a, *c;
    (void)state;
    assert_int_equal(tb_scope_begin(), TB_OK);
    model_inputs(&x, &x2, &w, &b);
    model(x, w, b, &y, &s);
    f = tb_function_create(&x, 1, (tb_tensor *[]){y, s}, 2);
    assert_non_null(f);
    assert_int_equal(tb_function_num_inputs(f), 1);
    assert_int_equal(tb_function_num_outputs(f), 2);
    /* matmul, add, relu, mul, sum, add: the exp and its sum read no input and are shared */
    assert_int_equal(tb_function_num_nodes(f), 6);
    assert_int_equal(tb_function_call(f, &x2, 1, out, 2), TB_OK);
    model(x2, w, b, &ry, &rs);
    /* the same graph as the ops make, node for node */
    a = tb_ir_text(out, 2);
    c = tb_ir_text((tb_tensor *[]){ry, rs}, 2);
    assert_non_null(a);
    assert_non_null(c);
    assert_string_equal(a, c);
    tb_free(a);
    tb_free(c);
    assert_int_equal(tb_node_hash(tb_tensor_node(out[0])), tb_node_hash(tb_tensor_node(ry)));
    read_f32(out[0], got, 8);
    read_f32(ry, want, 8);
    assert_close(got, want, 8);
    read_f32(out[1], &gs, 1);
    read_f32(rs, &ws, 1);
    assert_close(&gs, &ws, 1);
    /* the recorded outputs still compute the first input's values */
    read_f32(y, got, 8);
    model(x, w, b, &ry, &rs);
    read_f32(ry, want, 8);
    assert_close(got, want, 8);
    /* a second call on the first input gives those again */
    assert_int_equal(tb_function_call(f, &x, 1, out, 2), TB_OK);
    read_f32(out[0], got, 8);
    assert_close(got, want, 8);
    tb_function_release(f);
    assert_int_equal(tb_scope_end(), TB_OK);
}

/* Two inputs given the same tensor, a pending input (the graph is cut there), an unused input,
   and an output that reads no input. */
static void test_inputs_and_outputs(void **state) {
    const float av[] = {1, 2, 3}, bv2[] = {4, 5, 6}, cv[] = {-1, 0.5f, 2};
    float got[3], want[3];
    tb_tensor *a, *b, *c, *p, *y, *k, *out[2], *in[3];
    tb_function *f;
    size_t i;
    (void)state;
    assert_int_equal(tb_scope_begin(), TB_OK);
    a = from(av, 1, DIMS(3));
    b = from(bv2, 1, DIMS(3));
    c = from(cv, 1, DIMS(3));
    p = tb_add(a, b); /* pending: an input all the same */
    y = tb_mul(tb_sub(p, c), p);
    k = tb_exp(b); /* b is read below p only: shared */
    in[0] = p;
    in[1] = c;
    in[2] = a; /* read below p only: unused once the graph is cut at p */
    f = tb_function_create(in, 3, (tb_tensor *[]){y, k}, 2);
    assert_non_null(f);
    /* sub and mul, and the call's own node over the shared exp */
    assert_int_equal(tb_function_num_nodes(f), 3);
    in[0] = c;
    in[1] = c;
    in[2] = b;
    assert_int_equal(tb_function_call(f, in, 3, out, 2), TB_OK);
    read_f32(out[0], got, 3);
    for (i = 0; i < 3; i++)
        want[i] = 0; /* (c - c) * c */
    assert_close(got, want, 3);
    read_f32(out[1], got, 3);
    for (i = 0; i < 3; i++)
        want[i] = expf(bv2[i]);
    assert_close(got, want, 3);
    tb_function_release(f);
    assert_int_equal(tb_scope_end(), TB_OK);
}

static void test_gradients(void **state) {
    float got[12], want[12];
    tb_tensor *x, *x2, *w, *b, *y, *s, *out[2], *ry, *rs, *g[2], *h[2];
    tb_function *f;
    (void)state;
    assert_int_equal(tb_scope_begin(), TB_OK);
    model_inputs(&x, &x2, &w, &b);
    assert_int_equal(tb_set_requires_grad(w, true), TB_OK);
    model(x, w, b, &y, &s);
    f = tb_function_create(&x, 1, (tb_tensor *[]){y, s}, 2);
    assert_non_null(f);
    /* through the shared parameter, and into an input that requires grad */
    assert_int_equal(tb_set_requires_grad(x2, true), TB_OK);
    assert_int_equal(tb_function_call(f, &x2, 1, out, 2), TB_OK);
    assert_true(tb_requires_grad(out[1]));
    model(x2, w, b, &ry, &rs);
    assert_int_equal(tb_grad(out[1], NULL, (tb_tensor *[]){x2, w}, 2, g), TB_OK);
    assert_int_equal(tb_grad(rs, NULL, (tb_tensor *[]){x2, w}, 2, h), TB_OK);
    read_f32(g[0], got, 6);
    read_f32(h[0], want, 6);
    assert_close(got, want, 6);
    read_f32(g[1], got, 12);
    read_f32(h[1], want, 12);
    assert_close(got, want, 12);
    /* a detached input stops gradients in the call's graph as it does in the recorded one */
    tb_function_release(f);
    y = tb_mul(tb_detach(x), x);
    f = tb_function_create(&x, 1, &y, 1);
    assert_non_null(f);
    assert_int_equal(tb_function_call(f, &x2, 1, out, 1), TB_OK);
    assert_int_equal(tb_grad(tb_sum(out[0], NULL, 0, false), NULL, &x2, 1, g), TB_OK);
    read_f32(g[0], got, 6);
    assert_close(got, x2v, 6);
    tb_function_release(f);
    assert_int_equal(tb_scope_end(), TB_OK);
}

/* A function keeps no value of its inputs: the first input's buffer goes when its tensors do. */
typedef struct producer {
    tb_dl_managed_tensor managed;
    int64_t shape[1];
    int deleted;
} producer;

static void producer_deleter(tb_dl_managed_tensor *self) {
    ((producer *)self->manager_ctx)->deleted++;
}

static void test_keeps_no_input(void **state) {
    static float data[4] = {1, 2, 3, 4};
    const float v2[] = {-1, -2, 5, 6};
    float got[4];
    producer p;
    tb_tensor *x, *x2, *y, *out;
    tb_function *f;
    (void)state;
    memset(&p, 0, sizeof p);
    p.shape[0] = 4;
    p.managed.dl_tensor.data = data;
    p.managed.dl_tensor.device.device_type = TB_DL_CPU;
    p.managed.dl_tensor.ndim = 1;
    p.managed.dl_tensor.dtype.code = TB_DL_FLOAT;
    p.managed.dl_tensor.dtype.bits = 32;
    p.managed.dl_tensor.dtype.lanes = 1;
    p.managed.dl_tensor.shape = p.shape;
    p.managed.manager_ctx = &p;
    p.managed.deleter = producer_deleter;
    x = tb_dlpack_import(&p.managed, &cpu);
    assert_non_null(x);
    y = tb_relu(x);
    f = tb_function_create(&x, 1, &y, 1);
    assert_non_null(f);
    tb_tensor_release(y);
    tb_tensor_release(x);
    assert_int_equal(p.deleted, 1);
    x2 = from(v2, 1, DIMS(4));
    assert_int_equal(tb_function_call(f, &x2, 1, &out, 1), TB_OK);
    read_f32(out, got, 4);
    assert_close(got, (const float[]){0, 0, 5, 6}, 4);
    tb_tensor_release(out);
    tb_tensor_release(x2);
    tb_function_release(f);
}

/* A call's outputs belong to the innermost scope like any op's; released outside one. */
static void test_scopes(void **state) {
    const float v[] = {1, -2};
    float got[2];
    tb_tensor *x, *y, *out, *kept;
    tb_function *f;
    (void)state;
    x = from(v, 1, DIMS(2));
    y = tb_neg(x);
    f = tb_function_create(&x, 1, &y, 1);
    assert_non_null(f);
    assert_int_equal(tb_scope_begin(), TB_OK);
    assert_int_equal(tb_function_call(f, &x, 1, &out, 1), TB_OK);
    kept = tb_scope_keep(tb_relu(out));
    assert_int_equal(tb_scope_end(), TB_OK);
    read_f32(kept, got, 2);
    assert_close(got, (const float[]){0, 2}, 2);
    tb_tensor_release(kept);
    tb_tensor_release(y);
    tb_tensor_release(x);
    tb_function_release(f);
}

static void test_errors(void **state) {
    const float v[] = {1, 2, 3, 4, 5, 6};
    float back[6];
    tb_tensor *x, *y, *z, *r, *out[2], *bad, *i32, *synced;
    tb_function *f;
    tb_shape s;
    tb_device other;
    (void)state;
    assert_int_equal(tb_scope_begin(), TB_OK);
    x = from(v, 1, DIMS(6));
    y = tb_exp(x);
    /* create */
    assert_null(tb_function_create(NULL, 1, &y, 1));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "inputs is NULL"));
    tb_clear_error();
    assert_null(tb_function_create(&x, 1, NULL, 1));
    assert_non_null(strstr(tb_last_error(), "outputs is NULL"));
    tb_clear_error();
    assert_null(tb_function_create(&x, 1, &y, 0));
    assert_non_null(strstr(tb_last_error(), "no outputs"));
    tb_clear_error();
    assert_null(tb_function_create((tb_tensor *[]){x, NULL}, 2, &y, 1));
    assert_non_null(strstr(tb_last_error(), "inputs[1] is NULL"));
    tb_clear_error();
    assert_null(tb_function_create((tb_tensor *[]){x, x}, 2, &y, 1));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "inputs[1] is inputs[0] again"));
    tb_clear_error();
    z = tb_neg(y);
    assert_null(tb_function_create(&y, 1, (tb_tensor *[]){z, y}, 2));
    assert_non_null(strstr(tb_last_error(), "outputs[1] is inputs[0] itself"));
    tb_clear_error();
    assert_null(tb_function_create(&x, 1, &x, 1)); /* data, no pending graph */
    assert_int_equal(tb_last_status(), TB_ERR_STATE);
    synced = tb_neg(x);
    assert_int_equal(tb_sync(&synced, 1), TB_OK);
    assert_null(tb_function_create(&x, 1, &synced, 1));
    assert_int_equal(tb_last_status(), TB_ERR_STATE);
    assert_non_null(strstr(tb_last_error(), "outputs[0] has no pending graph"));
    tb_clear_error();
    assert_int_equal(tb_shape_make(&s, TB_F32, 1, DIMS(6)), TB_OK);
    r = tb_add(x, tb_rand(&s, &cpu));
    assert_null(tb_function_create(&x, 1, &r, 1));
    assert_int_equal(tb_last_status(), TB_ERR_UNSUPPORTED);
    assert_non_null(strstr(tb_last_error(), "random numbers"));
    tb_clear_error();
    r = tb_dropout(x, 0.5, true);
    assert_null(tb_function_create(&x, 1, &r, 1));
    assert_int_equal(tb_last_status(), TB_ERR_UNSUPPORTED);
    tb_clear_error();
    /* call */
    f = tb_function_create(&x, 1, (tb_tensor *[]){y, z}, 2);
    assert_non_null(f);
    out[0] = out[1] = x; /* overwritten with NULL on error */
    assert_int_equal(tb_function_call(NULL, &x, 1, out, 2), TB_ERR_INVALID_ARGUMENT);
    assert_null(out[0]);
    assert_null(out[1]);
    assert_int_equal(tb_function_call(f, NULL, 1, out, 2), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_function_call(f, &x, 1, NULL, 2), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_function_call(f, &x, 1, out, 1), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(
        strstr(tb_last_error(), "1 inputs and 1 outputs given, the function has 1 and 2"));
    assert_int_equal(tb_function_call(f, (tb_tensor *[]){x, x}, 2, out, 2),
                     TB_ERR_INVALID_ARGUMENT);
    tb_clear_error();
    bad = NULL;
    assert_int_equal(tb_function_call(f, &bad, 1, out, 2), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "inputs[0] is NULL"));
    tb_clear_error();
    bad = from(v, 2, DIMS(2, 3));
    assert_int_equal(tb_function_call(f, &bad, 1, out, 2), TB_ERR_SHAPE);
    assert_non_null(strstr(tb_last_error(), "inputs[0] is f32[2,3], the function takes f32[6]"));
    i32 = tb_cast(x, TB_I32);
    assert_int_equal(tb_function_call(f, &i32, 1, out, 2), TB_ERR_DTYPE);
    assert_non_null(strstr(tb_last_error(), "inputs[0] is i32[6]"));
    assert_null(out[0]);
    if (tb_device_make("native", 0, &other) == TB_OK ||
        tb_device_make("opencl", 0, &other) == TB_OK) {
        bad = tb_tensor_from_host(v, &s, &other);
        if (bad != NULL) {
            assert_int_equal(tb_function_call(f, &bad, 1, out, 2), TB_ERR_INVALID_ARGUMENT);
            assert_non_null(strstr(tb_last_error(), "the function's is on cpu:0"));
            tb_tensor_release(bad);
        }
        tb_clear_error();
    }
    /* the arguments are as they were: the recorded graph still computes */
    read_f32(z, back, 6);
    assert_true(back[0] < 0 && back[5] < 0);
    tb_function_release(f);
    tb_function_release(NULL);
    assert_int_equal(tb_function_num_nodes(NULL), 0);
    assert_int_equal(tb_scope_end(), TB_OK);
}

/* A graph larger than the local arrays a call starts with (values and operands). */
static void test_large(void **state) {
    const float v[] = {0.5f, 0.25f};
    float got[2], want[2];
    tb_tensor *x, *y, *out = NULL, *parts[12], *ry = NULL;
    tb_function *f = NULL;
    int i, j;
    (void)state;
    assert_int_equal(tb_scope_begin(), TB_OK);
    x = from(v, 1, DIMS(2));
    for (j = 0; j < 2; j++) {
        y = x;
        for (i = 0; i < 100; i++)
            y = tb_add_scalar(tb_mul_scalar(y, 0.99), 0.01);
        for (i = 0; i < 12; i++)
            parts[i] = tb_mul_scalar(y, (double)i);
        y = tb_concat(parts, 12, 0);
        if (j == 0) {
            f = tb_function_create(&x, 1, &y, 1);
            assert_non_null(f);
            assert_int_equal(tb_function_num_nodes(f), 213);
            x = from((const float[]){-1.5f, 3}, 1, DIMS(2));
            assert_int_equal(tb_function_call(f, &x, 1, &out, 1), TB_OK);
        } else {
            ry = y;
        }
    }
    read_f32(tb_sum(out, NULL, 0, false), got, 1);
    read_f32(tb_sum(ry, NULL, 0, false), want, 1);
    assert_close(got, want, 1);
    tb_function_release(f);
    assert_int_equal(tb_scope_end(), TB_OK);
}

/* An input synced after the outputs read it: their graph still reads its old node, which the
   function takes for the input. */
static void test_synced_input(void **state) {
    const float v[] = {1, 2, 3}, v2[] = {10, 20, 30};
    float got[3];
    tb_shape s3;
    tb_tensor *x, *h, *y, *h2, *out;
    tb_function *f;
    (void)state;
    assert_int_equal(tb_scope_begin(), TB_OK);
    x = from(v, 1, DIMS(3));
    h = tb_mul_scalar(x, 2);
    y = tb_neg(h);
    assert_int_equal(tb_sync(&h, 1), TB_OK);
    f = tb_function_create(&h, 1, &y, 1);
    assert_non_null(f);
    assert_int_equal(tb_function_num_nodes(f), 1);
    h2 = from(v2, 1, DIMS(3));
    assert_int_equal(tb_function_call(f, &h2, 1, &out, 1), TB_OK);
    read_f32(out, got, 3);
    assert_close(got, (const float[]){-10, -20, -30}, 3);
    tb_function_release(f);
    /* nothing below the old node is walked: h + x makes one node a call, not x * 2 again */
    x = from(v, 1, DIMS(3));
    h = tb_add_scalar(tb_mul_scalar(x, 2), 1);
    y = tb_add(h, x);
    assert_int_equal(tb_sync(&h, 1), TB_OK);
    f = tb_function_create((tb_tensor *[]){h, x}, 2, &y, 1);
    assert_non_null(f);
    assert_int_equal(tb_function_num_nodes(f), 1);
    assert_int_equal(tb_function_call(f, (tb_tensor *[]){h2, h2}, 2, &out, 1), TB_OK);
    read_f32(out, got, 3);
    assert_close(got, (const float[]){20, 40, 60}, 3);
    tb_function_release(f);
    /* a random draw synced before it became an input is a value like any other */
    s3 = tb_shape_of(TB_F32, 1, 3);
    h = tb_randn(&s3, &cpu);
    y = tb_mul_scalar(h, 2);
    assert_int_equal(tb_sync(&h, 1), TB_OK);
    f = tb_function_create(&h, 1, &y, 1);
    assert_non_null(f);
    assert_int_equal(tb_function_call(f, &h2, 1, &out, 1), TB_OK);
    read_f32(out, got, 3);
    assert_close(got, (const float[]){20, 40, 60}, 3);
    tb_function_release(f);
    assert_int_equal(tb_scope_end(), TB_OK);
}

/* An output given requires_grad keeps it in every call, past its sync. */
static void test_output_flags(void **state) {
    const float v[] = {1, -2, 3};
    tb_tensor *x, *y, *out;
    tb_function *f;
    (void)state;
    assert_int_equal(tb_scope_begin(), TB_OK);
    x = from(v, 1, DIMS(3));
    y = tb_relu(x);
    assert_int_equal(tb_set_requires_grad(y, true), TB_OK);
    f = tb_function_create(&x, 1, &y, 1);
    assert_non_null(f);
    assert_int_equal(tb_function_call(f, &x, 1, &out, 1), TB_OK);
    assert_true(tb_requires_grad(out));
    assert_int_equal(tb_sync(&out, 1), TB_OK);
    assert_true(tb_requires_grad(out));
    assert_int_equal(tb_sync(&y, 1), TB_OK);
    assert_true(tb_requires_grad(y));
    tb_function_release(f);
    assert_int_equal(tb_scope_end(), TB_OK);
}

/* A call whose graph grows past desc.max_graph_nodes is flushed where the ops would flush it:
   a chain of 30 recorded below the limit of 40, called on an input that is itself the end of
   a pending chain of 15, syncs partway (as 45 op calls would) and computes what they do. */
static void test_flush_in_call(void **state) {
    tb_desc desc;
    const float v[] = {1, 2};
    float got[2], want[2];
    tb_tensor *x, *y, *p, *out, *ry;
    tb_function *f;
    int i;
    int64_t runs;
    (void)state;
    tb_shutdown();
    memset(&desc, 0, sizeof desc);
    desc.max_graph_nodes = 40;
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb_device_make("cpu", 0, &cpu), TB_OK);
    assert_int_equal(tb_scope_begin(), TB_OK);
    x = from(v, 1, DIMS(2));
    y = x;
    for (i = 0; i < 30; i++)
        y = tb_add_scalar(y, 1.0);
    runs = tb_metrics_counter("ExecuteTime");
    f = tb_function_create(&x, 1, &y, 1);
    assert_non_null(f);
    assert_int_equal(tb_function_num_nodes(f), 30);
    assert_int_equal(tb_metrics_counter("ExecuteTime"), runs); /* recorded whole */
    p = x;
    for (i = 0; i < 15; i++)
        p = tb_mul_scalar(p, 2.0);
    assert_int_equal(tb_function_call(f, &p, 1, &out, 1), TB_OK);
    assert_true(tb_metrics_counter("ExecuteTime") > runs); /* flushed on the way */
    ry = p;
    for (i = 0; i < 30; i++)
        ry = tb_add_scalar(ry, 1.0);
    /* the ops flushed at the 26th add, and so did the call: both end in a pending graph */
    assert_non_null(tb_tensor_node(ry));
    assert_non_null(tb_tensor_node(out));
    assert_int_equal(tb_node_hash(tb_tensor_node(out)), tb_node_hash(tb_tensor_node(ry)));
    read_f32(out, got, 2);
    read_f32(ry, want, 2);
    assert_close(got, want, 2);
    assert_close(got, (const float[]){32768 + 30, 65536 + 30}, 2);
    tb_function_release(f);
    /* a tb_set_requires_grad output whose graph passes the limit: the ops do not flush there
       (the flag is set in place), and what is computed from the call's output still requires
       grad as what is computed from the ops' does */
    y = tb_add_scalar(x, 1.0);
    assert_int_equal(tb_set_requires_grad(y, true), TB_OK);
    f = tb_function_create(&x, 1, &y, 1);
    assert_non_null(f);
    p = x;
    for (i = 0; i < 39; i++)
        p = tb_mul_scalar(p, 1.0);
    assert_non_null(tb_tensor_node(p)); /* 39 nodes: below the limit */
    assert_int_equal(tb_function_call(f, &p, 1, &out, 1), TB_OK);
    ry = tb_add_scalar(p, 1.0);
    assert_int_equal(tb_set_requires_grad(ry, true), TB_OK);
    assert_true(tb_requires_grad(tb_mul_scalar(ry, 3.0)));
    assert_true(tb_requires_grad(tb_mul_scalar(out, 3.0)));
    read_f32(out, got, 2);
    assert_close(got, (const float[]){2, 3}, 2);
    tb_function_release(f);
    assert_int_equal(tb_scope_end(), TB_OK);
    tb_shutdown();
    assert_int_equal(tb_device_make("cpu", 0, &cpu), TB_OK);
}

/* a process group of one rank, for the refusal of collectives */
static tb_status solo_init(void *u, int32_t *rank, int32_t *size) {
    (void)u;
    *rank = 0;
    *size = 1;
    return TB_OK;
}
static tb_status solo_all_reduce(void *u, const void *send, void *recv, size_t count,
                                 tb_dtype dtype, tb_reduce_op op) {
    (void)u;
    (void)op;
    memcpy(recv, send, count * tb_dtype_size(dtype));
    return TB_OK;
}
static tb_status solo_all_gather(void *u, const void *send, void *recv, size_t bytes) {
    (void)u;
    memcpy(recv, send, bytes);
    return TB_OK;
}
static tb_status solo_broadcast(void *u, void *buf, size_t bytes, int32_t root) {
    (void)u;
    (void)buf;
    (void)bytes;
    (void)root;
    return TB_OK;
}
static tb_status solo_barrier(void *u) {
    (void)u;
    return TB_OK;
}

static void test_collective_refused(void **state) {
    const float v[] = {1, 2};
    tb_process_group_impl impl;
    tb_process_group *g;
    tb_tensor *x, *y;
    (void)state;
    memset(&impl, 0, sizeof impl);
    impl.init = solo_init;
    impl.all_reduce = solo_all_reduce;
    impl.all_gather = solo_all_gather;
    impl.broadcast = solo_broadcast;
    impl.barrier = solo_barrier;
    assert_int_equal(tb_process_group_register("solo", &impl), TB_OK);
    g = tb_process_group_get("solo");
    assert_non_null(g);
    assert_int_equal(tb_scope_begin(), TB_OK);
    x = from(v, 1, DIMS(2));
    y = tb_all_reduce(g, tb_relu(x), TB_REDUCE_SUM);
    assert_non_null(y);
    assert_null(tb_function_create(&x, 1, &y, 1));
    assert_int_equal(tb_last_status(), TB_ERR_UNSUPPORTED);
    assert_non_null(strstr(tb_last_error(), "collective"));
    tb_clear_error();
    assert_int_equal(tb_scope_end(), TB_OK);
}

static int setup(void **state) {
    (void)state;
    return tb_device_make("cpu", 0, &cpu) == TB_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tb_shutdown();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_and_structure),
        cmocka_unit_test(test_inputs_and_outputs),
        cmocka_unit_test(test_gradients),
        cmocka_unit_test(test_keeps_no_input),
        cmocka_unit_test(test_scopes),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_large),
        cmocka_unit_test(test_synced_input),
        cmocka_unit_test(test_output_flags),
        cmocka_unit_test(test_flush_in_call),
        cmocka_unit_test(test_collective_refused),
    };
    return cmocka_run_group_tests_name("function", tests, setup, teardown);
}
