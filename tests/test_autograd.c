/* tb_grad, tb_detach, requires_grad and tb_assign. Every op's backward rule is checked against
   central finite differences in f64 on the cpu backend, on awkward shapes (size 1, odd sizes,
   broadcasting, non-contiguous views, rank 0); the same gradients on opencl and native (where
   present) against the cpu's; ties, zeros and masks against exact values; gradients of
   gradients; history kept across syncs; bad input. */
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
#define AXES(...) ((const int32_t[]){__VA_ARGS__})
#define COUNT(a)  (sizeof(a) / sizeof((a)[0]))
#define MAX_IN    4
#define MAX_ELEMS 256

/* ---- helpers ---- */

static tb_device g_dev; /* the device the current check runs on */

static tb_shape shape_of(tb_dtype dtype, int32_t rank, const int64_t *dims) {
    tb_shape s;
    assert_int_equal(tb_shape_make(&s, dtype, rank, dims), TB_OK);
    return s;
}

static size_t numel(const tb_shape *s) {
    int64_t n = 0;
    assert_int_equal(tb_shape_numel(s, &n), TB_OK);
    return (size_t)n;
}

static tb_tensor *from(const double *v, int32_t rank, const int64_t *dims) {
    tb_shape s = shape_of(TB_F64, rank, dims);
    tb_tensor *t = tb_tensor_from_host(v, &s, &g_dev);
    assert_non_null(t);
    return t;
}

static tb_tensor *from_i64(const int64_t *v, int32_t rank, const int64_t *dims) {
    tb_shape s = shape_of(TB_I64, rank, dims);
    tb_tensor *t = tb_tensor_from_host(v, &s, &g_dev);
    assert_non_null(t);
    return t;
}

static void read_f64(tb_tensor *t, double *out) {
    tb_shape s;
    tb_tensor *c;
    tb_status st;
    assert_non_null(t);
    s = tb_tensor_shape(t);
    c = s.dtype == TB_F64 ? tb_tensor_retain(t) : tb_cast(t, TB_F64);
    assert_non_null(c);
    st = tb_tensor_to_host(c, out, numel(&s) * sizeof(double));
    if (st != TB_OK) fprintf(stderr, "to_host: %s\n", tb_last_error());
    assert_int_equal(st, TB_OK);
    tb_tensor_release(c);
}

/* a deterministic value stream */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double uniform(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}

/* Intermediate tensors of an expression: K(t) keeps t until drop_kept() releases it. */
static tb_tensor *g_kept[256];
static size_t g_num_kept;
static tb_tensor *K(tb_tensor *t) {
    assert_non_null(t);
    assert_true(g_num_kept < COUNT(g_kept));
    g_kept[g_num_kept++] = t;
    return t;
}
static void drop_kept(void) {
    while (g_num_kept > 0)
        tb_tensor_release(g_kept[--g_num_kept]);
}

/* ---- the op cases ---- */

enum { NORMAL, POSITIVE, AWAY, TIES };

typedef tb_tensor *(*build_fn)(tb_tensor *const *in);

typedef struct ag_input {
    int32_t rank;
    int64_t dims[4];
    int kind;
} ag_input;

typedef struct ag_case {
    const char *name;
    build_fn build;
    int n;
    ag_input in[MAX_IN];
} ag_case;

static tb_tensor *b_neg(tb_tensor *const *x) {
    return tb_neg(x[0]);
}
static tb_tensor *b_abs(tb_tensor *const *x) {
    return tb_abs(x[0]);
}
static tb_tensor *b_exp(tb_tensor *const *x) {
    return tb_exp(x[0]);
}
static tb_tensor *b_log(tb_tensor *const *x) {
    return tb_log(x[0]);
}
static tb_tensor *b_sqrt(tb_tensor *const *x) {
    return tb_sqrt(x[0]);
}
static tb_tensor *b_rsqrt(tb_tensor *const *x) {
    return tb_rsqrt(x[0]);
}
static tb_tensor *b_sin(tb_tensor *const *x) {
    return tb_sin(x[0]);
}
static tb_tensor *b_cos(tb_tensor *const *x) {
    return tb_cos(x[0]);
}
static tb_tensor *b_tanh(tb_tensor *const *x) {
    return tb_tanh(x[0]);
}
static tb_tensor *b_sigmoid(tb_tensor *const *x) {
    return tb_sigmoid(x[0]);
}
static tb_tensor *b_relu(tb_tensor *const *x) {
    return tb_relu(x[0]);
}
static tb_tensor *b_gelu(tb_tensor *const *x) {
    return tb_gelu(x[0]);
}
static tb_tensor *b_silu(tb_tensor *const *x) {
    return tb_silu(x[0]);
}
static tb_tensor *b_softplus(tb_tensor *const *x) {
    return tb_softplus(x[0]);
}
static tb_tensor *b_mish(tb_tensor *const *x) {
    return tb_mish(x[0]);
}
static tb_tensor *b_recip(tb_tensor *const *x) {
    return tb_reciprocal(x[0]);
}
static tb_tensor *b_erf(tb_tensor *const *x) {
    return tb_erf(x[0]);
}
static tb_tensor *b_floor(tb_tensor *const *x) {
    return tb_add(K(tb_floor(x[0])), x[0]);
}
static tb_tensor *b_add(tb_tensor *const *x) {
    return tb_add(x[0], x[1]);
}
static tb_tensor *b_sub(tb_tensor *const *x) {
    return tb_sub(x[0], x[1]);
}
static tb_tensor *b_mul(tb_tensor *const *x) {
    return tb_mul(x[0], x[1]);
}
static tb_tensor *b_div(tb_tensor *const *x) {
    return tb_div(x[0], x[1]);
}
static tb_tensor *b_pow(tb_tensor *const *x) {
    return tb_pow(x[0], x[1]);
}
static tb_tensor *b_maximum(tb_tensor *const *x) {
    return tb_maximum(x[0], x[1]);
}
static tb_tensor *b_minimum(tb_tensor *const *x) {
    return tb_minimum(x[0], x[1]);
}
static tb_tensor *b_scalars(tb_tensor *const *x) {
    tb_tensor *t = K(tb_mul_scalar(K(tb_add_scalar(x[0], 0.5)), 3.0));
    return tb_pow_scalar(K(tb_sub_scalar(K(tb_div_scalar(t, 2.0)), -1.0)), 2.0);
}
static tb_tensor *b_where(tb_tensor *const *x) {
    return tb_mul(K(tb_where(K(tb_gt(x[2], x[0])), x[0], x[1])), x[2]);
}
static tb_tensor *b_clamp(tb_tensor *const *x) {
    return tb_clamp(x[0], -0.5, 0.7);
}
static tb_tensor *b_clamp_t(tb_tensor *const *x) {
    tb_tensor *ops[3] = {x[0], x[1], x[2]};
    return tb_call_op(TB_OP_CLAMP, ops, 3, NULL, 0);
}
static tb_tensor *b_sum1(tb_tensor *const *x) {
    return tb_sum(x[0], AXES(1), 1, false);
}
static tb_tensor *b_sum_keep(tb_tensor *const *x) {
    return tb_sum(x[0], AXES(0, 2), 2, true);
}
static tb_tensor *b_sum_all(tb_tensor *const *x) {
    return tb_sum(x[0], NULL, 0, false);
}
static tb_tensor *b_mean(tb_tensor *const *x) {
    return tb_mean(x[0], AXES(-1), 1, false);
}
static tb_tensor *b_max(tb_tensor *const *x) {
    return tb_max(x[0], AXES(0), 1, false);
}
static tb_tensor *b_min(tb_tensor *const *x) {
    return tb_min(x[0], AXES(1), 1, true);
}
static tb_tensor *b_prod(tb_tensor *const *x) {
    return tb_prod(x[0], AXES(1), 1, false);
}
static tb_tensor *b_matmul(tb_tensor *const *x) {
    return tb_matmul(x[0], x[1]);
}
static tb_tensor *b_softmax(tb_tensor *const *x) {
    return tb_softmax(x[0], 1);
}
static tb_tensor *b_softmax0(tb_tensor *const *x) {
    return tb_softmax(x[0], 0);
}
static tb_tensor *b_log_softmax(tb_tensor *const *x) {
    return tb_log_softmax(x[0], -1);
}
static tb_tensor *b_layer_norm(tb_tensor *const *x) {
    return tb_layer_norm(x[0], 1, x[1], x[2], 1e-5);
}
static tb_tensor *b_layer_norm2(tb_tensor *const *x) {
    return tb_layer_norm(x[0], 2, NULL, NULL, 1e-3);
}
static tb_tensor *b_reshape(tb_tensor *const *x) {
    return tb_mul(K(tb_reshape(x[0], DIMS(3, 2), 2)), x[1]);
}
static tb_tensor *b_permute(tb_tensor *const *x) {
    return tb_mul(K(tb_permute(x[0], AXES(2, 0, 1), 3)), x[1]);
}
static tb_tensor *b_transpose_mm(tb_tensor *const *x) {
    return tb_matmul(K(tb_transpose(x[0], 0, 1)), x[1]);
}
static tb_tensor *b_expand(tb_tensor *const *x) {
    return tb_mul(K(tb_expand(x[0], DIMS(2, 3, 4), 3)), x[1]);
}
static tb_tensor *b_slice(tb_tensor *const *x) {
    return tb_slice(x[0], 1, 1, 6, 2);
}
static tb_tensor *b_slice3(tb_tensor *const *x) {
    return tb_slice(x[0], 0, 2, 7, 3);
}
static tb_tensor *b_slice_view(tb_tensor *const *x) {
    return tb_exp(K(tb_slice(K(tb_transpose(x[0], 0, 1)), 0, 0, 2, 1)));
}
static tb_tensor *b_flip(tb_tensor *const *x) {
    return tb_mul(K(tb_flip(x[0], AXES(0, 1), 2)), x[1]);
}
static tb_tensor *b_squeeze(tb_tensor *const *x) {
    return tb_unsqueeze(K(tb_squeeze(K(tb_exp(x[0])), 1)), 0);
}
static tb_tensor *b_concat(tb_tensor *const *x) {
    tb_tensor *parts[3] = {x[0], x[1], x[2]};
    return tb_concat(parts, 3, 1);
}
static tb_tensor *b_pad(tb_tensor *const *x) {
    return tb_pad(x[0], DIMS(1, 2, 0, 1), 4, 0.25);
}
static tb_tensor *b_gather(tb_tensor *const *x) {
    static const int64_t idx[] = {0, 2, 2, 1, 0, 0};
    tb_tensor *i = from_i64(idx, 2, DIMS(2, 3));
    tb_tensor *r = tb_gather(x[0], 1, i);
    tb_tensor_release(i);
    return r;
}
static tb_tensor *b_index_select(tb_tensor *const *x) {
    static const int64_t idx[] = {2, 0, 2, 3};
    tb_tensor *i = from_i64(idx, 1, DIMS(4));
    tb_tensor *r = tb_index_select(x[0], 0, i);
    tb_tensor_release(i);
    return r;
}
static tb_tensor *b_scatter_add(tb_tensor *const *x) {
    static const int64_t idx[] = {1, 1, 0, 3, 3, 3};
    tb_tensor *i = from_i64(idx, 2, DIMS(2, 3));
    tb_tensor *r = tb_scatter_add(x[0], 1, i, x[1]);
    tb_tensor_release(i);
    return r;
}
static tb_tensor *b_index_add(tb_tensor *const *x) {
    static const int64_t idx[] = {2, 0, 2};
    tb_tensor *i = from_i64(idx, 1, DIMS(3));
    tb_tensor *r = tb_index_add(x[0], 1, i, x[1]);
    tb_tensor_release(i);
    return r;
}
static tb_tensor *b_rank0(tb_tensor *const *x) {
    return tb_mul(K(tb_exp(x[0])), x[1]);
}
static tb_tensor *b_mlp(tb_tensor *const *x) {
    /* log_softmax(relu(x w1 + b1) w2), a classifier's forward pass */
    tb_tensor *h = K(tb_relu(K(tb_add(K(tb_matmul(x[0], x[1])), x[2]))));
    return tb_log_softmax(K(tb_matmul(h, x[3])), 1);
}
static tb_tensor *b_shared(tb_tensor *const *x) {
    tb_tensor *t = K(tb_tanh(x[0]));
    return tb_add(K(tb_mul(t, t)), K(tb_mul(t, x[0]))); /* one node used by three users */
}

#define IN(r, k, ...)                                                                              \
    { r, {__VA_ARGS__}, k }
static const ag_case g_cases[] = {
    {"neg", b_neg, 1, {IN(2, NORMAL, 2, 3)}},
    {"abs", b_abs, 1, {IN(2, AWAY, 3, 1)}},
    {"exp", b_exp, 1, {IN(1, NORMAL, 5)}},
    {"log", b_log, 1, {IN(2, POSITIVE, 1, 4)}},
    {"sqrt", b_sqrt, 1, {IN(1, POSITIVE, 3)}},
    {"rsqrt", b_rsqrt, 1, {IN(1, POSITIVE, 3)}},
    {"sin", b_sin, 1, {IN(1, NORMAL, 4)}},
    {"cos", b_cos, 1, {IN(1, NORMAL, 4)}},
    {"tanh", b_tanh, 1, {IN(2, NORMAL, 2, 2)}},
    {"sigmoid", b_sigmoid, 1, {IN(1, NORMAL, 5)}},
    {"relu", b_relu, 1, {IN(1, AWAY, 6)}},
    {"gelu", b_gelu, 1, {IN(1, NORMAL, 7)}},
    {"silu", b_silu, 1, {IN(1, NORMAL, 7)}},
    {"softplus", b_softplus, 1, {IN(1, NORMAL, 7)}},
    {"mish", b_mish, 1, {IN(1, NORMAL, 7)}},
    {"reciprocal", b_recip, 1, {IN(1, AWAY, 4)}},
    {"erf", b_erf, 1, {IN(1, NORMAL, 5)}},
    {"floor", b_floor, 1, {IN(1, AWAY, 5)}},
    {"add_broadcast", b_add, 2, {IN(2, NORMAL, 2, 3), IN(1, NORMAL, 3)}},
    {"sub_broadcast", b_sub, 2, {IN(3, NORMAL, 2, 1, 3), IN(2, NORMAL, 4, 1)}},
    {"mul_broadcast", b_mul, 2, {IN(1, NORMAL, 3), IN(2, NORMAL, 2, 3)}},
    {"div", b_div, 2, {IN(2, NORMAL, 2, 3), IN(2, AWAY, 1, 3)}},
    {"pow", b_pow, 2, {IN(1, POSITIVE, 4), IN(2, NORMAL, 2, 1)}},
    {"maximum", b_maximum, 2, {IN(2, NORMAL, 3, 2), IN(1, NORMAL, 2)}},
    {"minimum", b_minimum, 2, {IN(2, NORMAL, 3, 2), IN(2, NORMAL, 3, 1)}},
    {"scalar_ops", b_scalars, 1, {IN(2, NORMAL, 2, 2)}},
    {"where", b_where, 3, {IN(2, NORMAL, 2, 3), IN(1, NORMAL, 3), IN(2, NORMAL, 2, 1)}},
    {"clamp", b_clamp, 1, {IN(1, NORMAL, 9)}},
    {"clamp_tensors", b_clamp_t, 3, {IN(2, NORMAL, 2, 3), IN(1, NORMAL, 3), IN(2, NORMAL, 2, 1)}},
    {"sum_axis", b_sum1, 1, {IN(3, NORMAL, 2, 3, 2)}},
    {"sum_keepdim", b_sum_keep, 1, {IN(3, NORMAL, 2, 3, 2)}},
    {"sum_all", b_sum_all, 1, {IN(2, NORMAL, 3, 3)}},
    {"mean", b_mean, 1, {IN(2, NORMAL, 2, 5)}},
    {"max", b_max, 1, {IN(2, NORMAL, 3, 4)}},
    {"min", b_min, 1, {IN(2, NORMAL, 3, 4)}},
    {"prod", b_prod, 1, {IN(2, AWAY, 2, 4)}},
    {"matmul", b_matmul, 2, {IN(2, NORMAL, 3, 4), IN(2, NORMAL, 4, 2)}},
    {"matmul_batched", b_matmul, 2, {IN(3, NORMAL, 2, 3, 4), IN(2, NORMAL, 4, 5)}},
    {"matmul_broadcast", b_matmul, 2, {IN(4, NORMAL, 2, 1, 2, 3), IN(3, NORMAL, 3, 3, 2)}},
    /* a shared over leading batch axes (a convolution's weight): its gradient folded */
    {"matmul_shared_a", b_matmul, 2, {IN(2, NORMAL, 3, 4), IN(3, NORMAL, 5, 4, 2)}},
    {"matmul_shared_a_batch", b_matmul, 2, {IN(3, NORMAL, 2, 2, 3), IN(4, NORMAL, 3, 2, 3, 2)}},
    {"matmul_vec_mat", b_matmul, 2, {IN(1, NORMAL, 3), IN(2, NORMAL, 3, 2)}},
    {"matmul_dot", b_matmul, 2, {IN(1, NORMAL, 5), IN(1, NORMAL, 5)}},
    {"softmax", b_softmax, 1, {IN(2, NORMAL, 3, 5)}},
    {"softmax_axis0", b_softmax0, 1, {IN(2, NORMAL, 3, 2)}},
    {"log_softmax", b_log_softmax, 1, {IN(3, NORMAL, 2, 2, 4)}},
    {"layer_norm", b_layer_norm, 3, {IN(2, NORMAL, 3, 5), IN(1, NORMAL, 5), IN(1, NORMAL, 5)}},
    {"layer_norm_2d", b_layer_norm2, 1, {IN(3, NORMAL, 2, 3, 2)}},
    {"reshape", b_reshape, 2, {IN(2, NORMAL, 2, 3), IN(2, NORMAL, 3, 2)}},
    {"permute", b_permute, 2, {IN(3, NORMAL, 2, 3, 4), IN(3, NORMAL, 4, 2, 3)}},
    {"transpose_matmul", b_transpose_mm, 2, {IN(2, NORMAL, 4, 3), IN(2, NORMAL, 4, 2)}},
    {"expand", b_expand, 2, {IN(2, NORMAL, 3, 1), IN(3, NORMAL, 2, 3, 4)}},
    {"slice_step2", b_slice, 1, {IN(2, NORMAL, 2, 7)}},
    {"slice_step3", b_slice3, 1, {IN(2, NORMAL, 9, 2)}},
    {"slice_of_view", b_slice_view, 1, {IN(2, NORMAL, 3, 4)}},
    {"flip", b_flip, 2, {IN(2, NORMAL, 3, 2), IN(2, NORMAL, 3, 2)}},
    {"squeeze", b_squeeze, 1, {IN(3, NORMAL, 3, 1, 2)}},
    {"concat", b_concat, 3, {IN(2, NORMAL, 2, 1), IN(2, NORMAL, 2, 3), IN(2, NORMAL, 2, 2)}},
    {"pad", b_pad, 1, {IN(2, NORMAL, 2, 3)}},
    {"gather", b_gather, 1, {IN(2, NORMAL, 3, 4)}},
    {"index_select", b_index_select, 1, {IN(2, NORMAL, 4, 3)}},
    {"scatter_add", b_scatter_add, 2, {IN(2, NORMAL, 3, 4), IN(2, NORMAL, 2, 3)}},
    {"index_add", b_index_add, 2, {IN(2, NORMAL, 2, 3), IN(2, NORMAL, 2, 3)}},
    {"rank0", b_rank0, 2, {IN(0, NORMAL, 0), IN(1, NORMAL, 3)}},
    {"size1", b_mul, 2, {IN(3, NORMAL, 1, 1, 1), IN(2, NORMAL, 1, 4)}},
    {"mlp",
     b_mlp,
     4,
     {IN(2, NORMAL, 3, 4), IN(2, NORMAL, 4, 5), IN(1, NORMAL, 5), IN(2, NORMAL, 5, 3)}},
    {"shared_node", b_shared, 1, {IN(2, NORMAL, 2, 3)}},
};

/* The input values of a case (the same every time for one case). */
static void case_values(const ag_case *c, double vals[MAX_IN][MAX_ELEMS]) {
    int i;
    size_t j;
    g_rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)strlen(c->name) * 1000003u ^ (uint64_t)c->name[0];
    for (i = 0; i < c->n; i++) {
        tb_shape s = shape_of(TB_F64, c->in[i].rank, c->in[i].dims);
        size_t n = numel(&s);
        assert_true(n <= MAX_ELEMS);
        for (j = 0; j < n; j++) {
            double u = uniform();
            switch (c->in[i].kind) {
            case POSITIVE:
                vals[i][j] = 0.5 + 2.0 * u;
                break;
            case AWAY:
                vals[i][j] = (uniform() < 0.5 ? -1.0 : 1.0) * (0.3 + 1.7 * u);
                break;
            case TIES:
                vals[i][j] = floor(u * 3.0);
                break;
            default:
                vals[i][j] = 4.0 * u - 2.0;
                break;
            }
        }
    }
}

/* sum(out * w) for the given values, and out's shape; w is filled on first use */
static double case_loss(const ag_case *c, double vals[MAX_IN][MAX_ELEMS], double *w,
                        size_t *n_out) {
    tb_tensor *in[MAX_IN];
    tb_tensor *out;
    double y[MAX_ELEMS], sum = 0.0;
    tb_shape s;
    size_t j, n;
    int i;
    for (i = 0; i < c->n; i++)
        in[i] = from(vals[i], c->in[i].rank, c->in[i].dims);
    out = c->build(in);
    if (out == NULL) fprintf(stderr, "%s: %s\n", c->name, tb_last_error());
    assert_non_null(out);
    s = tb_tensor_shape(out);
    n = numel(&s);
    assert_true(n <= MAX_ELEMS);
    read_f64(out, y);
    for (j = 0; j < n; j++)
        sum += y[j] * w[j];
    *n_out = n;
    tb_tensor_release(out);
    drop_kept();
    for (i = 0; i < c->n; i++)
        tb_tensor_release(in[i]);
    return sum;
}

static void case_weights(double *w) {
    size_t j;
    g_rng = 12345;
    for (j = 0; j < MAX_ELEMS; j++)
        w[j] = 2.0 * uniform() - 1.0;
}

/* tb_grad of sum(out * w) for every input; grads[i][j] */
static void case_grads(const ag_case *c, double vals[MAX_IN][MAX_ELEMS], const double *w,
                       double grads[MAX_IN][MAX_ELEMS]) {
    tb_tensor *in[MAX_IN], *g[MAX_IN], *out, *seed;
    tb_shape s;
    tb_status st;
    int i;
    for (i = 0; i < c->n; i++)
        in[i] = from(vals[i], c->in[i].rank, c->in[i].dims);
    out = c->build(in);
    assert_non_null(out);
    s = tb_tensor_shape(out);
    seed = from(w, s.rank, s.dims);
    st = tb_grad(out, seed, in, (size_t)c->n, g);
    if (st != TB_OK) fprintf(stderr, "%s: tb_grad: %s\n", c->name, tb_last_error());
    assert_int_equal(st, TB_OK);
    for (i = 0; i < c->n; i++) {
        if (g[i] == NULL) fprintf(stderr, "%s: no gradient for input %d\n", c->name, i);
        assert_non_null(g[i]);
        assert_true(tb_shape_equal(&s, &s));
        {
            tb_shape gs = tb_tensor_shape(g[i]), xs = tb_tensor_shape(in[i]);
            assert_true(tb_shape_equal(&gs, &xs));
        }
        read_f64(g[i], grads[i]);
        tb_tensor_release(g[i]);
    }
    tb_tensor_release(seed);
    tb_tensor_release(out);
    drop_kept();
    for (i = 0; i < c->n; i++)
        tb_tensor_release(in[i]);
}

static void test_finite_differences(void **state) {
    static double vals[MAX_IN][MAX_ELEMS], grads[MAX_IN][MAX_ELEMS], w[MAX_ELEMS];
    size_t k, j, n_out, failures = 0;
    int i;
    (void)state;
    assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
    case_weights(w);
    for (k = 0; k < COUNT(g_cases); k++) {
        const ag_case *c = &g_cases[k];
        case_values(c, vals);
        case_grads(c, vals, w, grads);
        for (i = 0; i < c->n; i++) {
            tb_shape s = shape_of(TB_F64, c->in[i].rank, c->in[i].dims);
            for (j = 0; j < numel(&s); j++) {
                double keep = vals[i][j], h = 1e-6 * (fabs(keep) > 1.0 ? fabs(keep) : 1.0);
                double up, down, num;
                vals[i][j] = keep + h;
                up = case_loss(c, vals, w, &n_out);
                vals[i][j] = keep - h;
                down = case_loss(c, vals, w, &n_out);
                vals[i][j] = keep;
                num = (up - down) / (2.0 * h);
                if (fabs(num - grads[i][j]) > 1e-5 * (fabs(num) > 1.0 ? fabs(num) : 1.0)) {
                    fprintf(stderr, "%s: input %d element %zu: tb_grad %.10g, differences %.10g\n",
                            c->name, i, j, grads[i][j], num);
                    failures++;
                }
            }
        }
    }
    assert_int_equal(failures, 0);
}

/* The same gradients on another backend, against the cpu's (relative to the largest). */
static void compare_backend(const char *backend) {
    static double vals[MAX_IN][MAX_ELEMS], want[MAX_IN][MAX_ELEMS], got[MAX_IN][MAX_ELEMS];
    static double w[MAX_ELEMS];
    tb_device dev;
    size_t k, j, failures = 0;
    int i;
    if (tb_device_make(backend, 0, &dev) != TB_OK) {
        print_message("no %s device, skipped: %s\n", backend, tb_last_error());
        skip();
    }
    case_weights(w);
    for (k = 0; k < COUNT(g_cases); k++) {
        const ag_case *c = &g_cases[k];
        case_values(c, vals);
        assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
        case_grads(c, vals, w, want);
        g_dev = dev;
        case_grads(c, vals, w, got);
        for (i = 0; i < c->n; i++) {
            tb_shape s = shape_of(TB_F64, c->in[i].rank, c->in[i].dims);
            double scale = 1e-30;
            for (j = 0; j < numel(&s); j++)
                scale = fabs(want[i][j]) > scale ? fabs(want[i][j]) : scale;
            for (j = 0; j < numel(&s); j++) {
                if (fabs(got[i][j] - want[i][j]) > 1e-9 * scale) {
                    fprintf(stderr, "%s on %s: input %d element %zu: %.12g, cpu %.12g\n", c->name,
                            backend, i, j, got[i][j], want[i][j]);
                    failures++;
                }
            }
        }
    }
    assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
    assert_int_equal(failures, 0);
}

static void test_opencl_matches_cpu(void **state) {
    (void)state;
    compare_backend("opencl");
}

static void test_native_matches_cpu(void **state) {
    (void)state;
    compare_backend("native");
}

/* ---- exact cases: ties, zeros, masks ---- */

static void expect_grad(tb_tensor *out, tb_tensor *x, const double *want, size_t n) {
    tb_tensor *g = NULL;
    double got[64];
    size_t j;
    tb_status st = tb_grad(out, NULL, &x, 1, &g);
    if (st != TB_OK) fprintf(stderr, "tb_grad: %s\n", tb_last_error());
    assert_int_equal(st, TB_OK);
    read_f64(g, got);
    for (j = 0; j < n; j++) {
        if (!(fabs(got[j] - want[j]) <= 1e-12 || (isnan(want[j]) && isnan(got[j])))) {
            fprintf(stderr, "element %zu: %.17g, want %.17g\n", j, got[j], want[j]);
            fail();
        }
    }
    tb_tensor_release(g);
}

/* Whether a line of an IR text has `a` and, after it, `b`. */
static bool has_line(const char *text, const char *a, const char *b) {
    const char *at = text;
    while ((at = strstr(at, a)) != NULL) {
        const char *end = strchr(at, '\n'), *hit = strstr(at, b);
        if (hit != NULL && (end == NULL || hit < end)) return true;
        at += strlen(a);
    }
    return false;
}

/* The gradient of w [1, 2, 3] in sum((w x)^2), w shared over x's leading batch axes (x of
   rank xr, dims xd): the form of its graph (`per_batch`: a batched matmul per element of x's
   one batch axis, then the sum; else one matmul and no sum), and its values against the sum
   over the batch of 2 (w x) x^T computed by hand. */
static void shared_matmul_grad_case(const int64_t *xd, int32_t xr, bool per_batch) {
    double wv[6], want[6], got[6], *xv;
    int32_t axes[TB_MAX_RANK], i;
    size_t nx = 1, j;
    tb_tensor *w, *x, *y, *g = NULL, *ref;
    char *text, shape[32];
    assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
    for (i = 0; i < xr; i++)
        nx *= (size_t)xd[i];
    xv = (double *)malloc(nx * sizeof *xv);
    assert_non_null(xv);
    for (j = 0; j < 6; j++)
        wv[j] = 0.25 * (double)j - 0.6;
    for (j = 0; j < nx; j++)
        xv[j] = (double)((j * 7) % 11) / 5.0 - 1.0;
    w = from(wv, 3, DIMS(1, 2, 3));
    x = from(xv, xr, xd);
    free(xv);
    y = tb_sum(K(tb_mul(K(tb_matmul(w, x)), K(tb_matmul(w, x)))), NULL, 0, false);
    assert_int_equal(tb_grad(y, NULL, &w, 1, &g), TB_OK);
    text = tb_ir_text(&g, 1);
    assert_non_null(text);
    if (per_batch) {
        /* a batched matmul of [B, 2, M] by [B, M, 3], then the sum over the batch */
        snprintf(shape, sizeof shape, ") f64[%lld,2,3]", (long long)xd[0]);
        if (!has_line(text, "= matmul(", shape) || strstr(text, "= sum(") == NULL)
            fail_msg("the weight's gradient is not a product per batch element summed:\n%s", text);
    } else {
        assert_null(strstr(text, "= sum(")); /* no per-batch product summed */
        assert_non_null(strstr(text, "matmul("));
    }
    tb_free(text);
    for (i = 0; i < xr - 2; i++)
        axes[i] = i;
    ref = K(tb_matmul(K(tb_mul_scalar(K(tb_matmul(w, x)), 2.0)), K(tb_transpose(x, -2, -1))));
    ref = K(tb_sum(ref, axes, (size_t)(xr - 2), true));
    ref = K(tb_reshape(ref, DIMS(1, 2, 3), 3));
    read_f64(ref, want);
    read_f64(g, got);
    for (j = 0; j < 6; j++)
        if (!(fabs(got[j] - want[j]) <= 1e-12 * (1 + fabs(want[j]))))
            fail_msg("element %zu: %.17g, want %.17g", j, got[j], want[j]);
    tb_tensor_release(g);
    tb_tensor_release(y);
    tb_tensor_release(x);
    tb_tensor_release(w);
}

/* The gradient of a matmul's left operand shared over leading batch axes (a convolution's
   weight times each image's windows) is one matmul contracting the batch with the columns, not
   a product per batch element summed afterwards; equal to that sum. */
static void test_shared_matmul_grad_folded(void **state) {
    (void)state;
    shared_matmul_grad_case(DIMS(2, 4, 3, 5), 4, false);
}

/* ... unless each batch element's product is small beside what it reads (a network's first
   convolution: few output channels and window elements, many positions): then the products
   per batch element, summed, so that the depth of each matmul is one element's. */
static void test_shared_matmul_grad_per_batch(void **state) {
    (void)state;
    shared_matmul_grad_case(DIMS(3, 3, 400), 3, true);
}

static void test_ties_split_evenly(void **state) {
    static const double v[] = {1, 3, 3, 2, 0, 0, 0, 5};
    tb_tensor *x, *y;
    (void)state;
    assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
    x = from(v, 2, DIMS(2, 4));
    /* amax over rows: [3, 5] with a tie at 3, then its sum */
    y = tb_sum(K(tb_max(x, AXES(1), 1, false)), NULL, 0, false);
    expect_grad(y, x, (const double[]){0, 0.5, 0.5, 0, 0, 0, 0, 1}, 8);
    tb_tensor_release(y);
    /* amin over rows: [1, 0] with three zeros */
    y = tb_sum(K(tb_min(x, AXES(1), 1, false)), NULL, 0, false);
    expect_grad(y, x, (const double[]){1, 0, 0, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0}, 8);
    tb_tensor_release(y);
    /* the max of everything */
    y = tb_max(x, NULL, 0, false);
    expect_grad(y, x, (const double[]){0, 0, 0, 0, 0, 0, 0, 1}, 8);
    tb_tensor_release(y);
    /* maximum(x, x): half to each operand, which is x both times */
    y = tb_sum(K(tb_maximum(x, x)), NULL, 0, false);
    expect_grad(y, x, (const double[]){1, 1, 1, 1, 1, 1, 1, 1}, 8);
    tb_tensor_release(y);
    tb_tensor_release(x);
}

static void test_maximum_tie_halves(void **state) {
    static const double a[] = {1, 2, 3}, b[] = {1, 5, 0};
    tb_tensor *x, *z, *y, *g[2];
    double ga[3], gb[3];
    (void)state;
    assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
    x = from(a, 1, DIMS(3));
    z = from(b, 1, DIMS(3));
    y = tb_sum(K(tb_maximum(x, z)), NULL, 0, false);
    assert_int_equal(tb_grad(y, NULL, (tb_tensor *const[]){x, z}, 2, g), TB_OK);
    read_f64(g[0], ga);
    read_f64(g[1], gb);
    assert_true(ga[0] == 0.5 && gb[0] == 0.5);
    assert_true(ga[1] == 0.0 && gb[1] == 1.0);
    assert_true(ga[2] == 1.0 && gb[2] == 0.0);
    tb_tensor_release(g[0]);
    tb_tensor_release(g[1]);
    tb_tensor_release(y);
    tb_tensor_release(x);
    tb_tensor_release(z);
}

static void test_prod_with_zeros(void **state) {
    static const double v[] = {2, 3, 4, 0, 3, 4, 0, 0, 4};
    tb_tensor *x, *y;
    (void)state;
    assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
    x = from(v, 2, DIMS(3, 3));
    y = tb_sum(K(tb_prod(x, AXES(1), 1, false)), NULL, 0, false);
    /* row 0: products of the others; row 1: only the zero gets 12; row 2: two zeros, all 0 */
    expect_grad(y, x, (const double[]){12, 8, 6, 12, 0, 0, 0, 0, 0}, 9);
    tb_tensor_release(y);
    tb_tensor_release(x);
}

static void test_pow_and_clamp_edges(void **state) {
    static const double base[] = {0, 0, 2}, ex[] = {0, 2, 0};
    static const double cv[] = {-1, -0.5, 0, 0.7, 2};
    tb_tensor *a, *b, *y, *g[2], *x;
    double ga[3], gb[3];
    (void)state;
    assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
    a = from(base, 1, DIMS(3));
    b = from(ex, 1, DIMS(3));
    y = tb_sum(K(tb_pow(a, b)), NULL, 0, false);
    assert_int_equal(tb_grad(y, NULL, (tb_tensor *const[]){a, b}, 2, g), TB_OK);
    read_f64(g[0], ga);
    read_f64(g[1], gb);
    /* d/da: 0 where b == 0; 2 * 0^1 = 0; d/db: 0 where a == 0 and b >= 0; 1 * log 2 */
    assert_true(ga[0] == 0 && ga[1] == 0 && ga[2] == 0);
    assert_true(gb[0] == 0 && gb[1] == 0 && fabs(gb[2] - log(2.0)) < 1e-15);
    tb_tensor_release(g[0]);
    tb_tensor_release(g[1]);
    tb_tensor_release(y);
    /* clamp passes the gradient on [lo, hi], bounds included, as PyTorch */
    x = from(cv, 1, DIMS(5));
    y = tb_sum(K(tb_clamp(x, -0.5, 0.7)), NULL, 0, false);
    expect_grad(y, x, (const double[]){0, 1, 1, 1, 0}, 5);
    tb_tensor_release(y);
    tb_tensor_release(x);
    tb_tensor_release(a);
    tb_tensor_release(b);
}

/* ---- structure ---- */

static void test_second_order(void **state) {
    static const double xv[] = {0.5, -1.5, 2.0}, yv[] = {1.0, 2.0, -0.5};
    tb_tensor *x, *yt, *f, *g[1], *gx[1], *h;
    double got[3];
    int j;
    (void)state;
    assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
    x = from(xv, 1, DIMS(3));
    yt = from(yv, 1, DIMS(3));
    /* f = sum(x^3 y): df/dx = 3 x^2 y, d/dx sum(df/dx) = 6 x y */
    f = tb_sum(K(tb_mul(K(tb_pow_scalar(x, 3.0)), yt)), NULL, 0, false);
    assert_int_equal(tb_grad(f, NULL, &x, 1, g), TB_OK);
    h = tb_sum(g[0], NULL, 0, false);
    assert_int_equal(tb_grad(h, NULL, &x, 1, gx), TB_OK);
    read_f64(gx[0], got);
    for (j = 0; j < 3; j++)
        assert_true(fabs(got[j] - 6.0 * xv[j] * yv[j]) < 1e-12);
    tb_tensor_release(gx[0]);
    tb_tensor_release(h);
    tb_tensor_release(g[0]);
    /* a third order through tanh: d3/dx3 tanh = -2 (1 - t^2)(1 - 3 t^2) */
    {
        tb_tensor *t = tb_sum(K(tb_tanh(x)), NULL, 0, false), *g1, *g2, *g3, *s1, *s2;
        assert_int_equal(tb_grad(t, NULL, &x, 1, &g1), TB_OK);
        s1 = tb_sum(g1, NULL, 0, false);
        assert_int_equal(tb_grad(s1, NULL, &x, 1, &g2), TB_OK);
        s2 = tb_sum(g2, NULL, 0, false);
        assert_int_equal(tb_grad(s2, NULL, &x, 1, &g3), TB_OK);
        read_f64(g3, got);
        for (j = 0; j < 3; j++) {
            double th = tanh(xv[j]);
            assert_true(fabs(got[j] - (-2.0 * (1 - th * th) * (1 - 3 * th * th))) < 1e-12);
        }
        tb_tensor_release(g1);
        tb_tensor_release(g2);
        tb_tensor_release(g3);
        tb_tensor_release(s1);
        tb_tensor_release(s2);
        tb_tensor_release(t);
    }
    tb_tensor_release(f);
    tb_tensor_release(x);
    tb_tensor_release(yt);
}

static void test_paths(void **state) {
    static const double v[] = {0.5, 1.5, -2.5};
    tb_tensor *x, *z, *y, *g[2];
    double got[3];
    (void)state;
    assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
    x = from(v, 1, DIMS(3));
    z = from(v, 1, DIMS(3));
    /* z is not used: NULL; x only through floor: zeros */
    y = tb_sum(K(tb_floor(x)), NULL, 0, false);
    assert_int_equal(tb_grad(y, NULL, (tb_tensor *const[]){x, z}, 2, g), TB_OK);
    assert_non_null(g[0]);
    assert_null(g[1]);
    read_f64(g[0], got);
    assert_true(got[0] == 0 && got[1] == 0 && got[2] == 0);
    tb_tensor_release(g[0]);
    tb_tensor_release(y);
    /* through detach, comparisons and argmax: no path */
    y = tb_add(K(tb_sum(K(tb_detach(x)), NULL, 0, false)),
               K(tb_sum(K(tb_cast(K(tb_gt(x, z)), TB_F64)), NULL, 0, false)));
    assert_int_equal(tb_grad(y, NULL, &x, 1, g), TB_OK);
    assert_null(g[0]);
    tb_tensor_release(y);
    y = tb_cast(K(tb_argmax(x, 0, false)), TB_F64);
    assert_int_equal(tb_grad(y, NULL, &x, 1, g), TB_OK);
    assert_null(g[0]);
    tb_tensor_release(y);
    /* through a cast to f32 and back: the seed, cast to each dtype on the way */
    y = tb_sum(K(tb_mul_scalar(K(tb_cast(x, TB_F32)), 3.0)), NULL, 0, false);
    assert_int_equal(tb_grad(y, NULL, &x, 1, g), TB_OK);
    {
        tb_shape gs = tb_tensor_shape(g[0]);
        assert_int_equal(gs.dtype, TB_F64);
    }
    read_f64(g[0], got);
    assert_true(got[0] == 3 && got[1] == 3 && got[2] == 3);
    tb_tensor_release(g[0]);
    tb_tensor_release(y);
    /* the output itself */
    assert_int_equal(tb_grad(x, K(from(v, 1, DIMS(3))), &x, 1, g), TB_OK);
    read_f64(g[0], got);
    assert_true(got[0] == v[0] && got[2] == v[2]);
    tb_tensor_release(g[0]);
    tb_tensor_release(x);
    tb_tensor_release(z);
}

/* A forward pass synced before the backward one: the history stays for tensors that require
   grad, and the backward graph reads the synced values. */
static void test_history_survives_sync(void **state) {
    static const double wv[] = {0.5, -1.0, 2.0, 1.5}, xv[] = {1, 2, 3, 4, 5, 6};
    tb_tensor *w, *x, *h, *loss, *g;
    double got[4], want[4] = {0, 0, 0, 0};
    int i, j;
    (void)state;
    assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
    w = from(wv, 2, DIMS(2, 2));
    x = from(xv, 2, DIMS(3, 2));
    assert_false(tb_requires_grad(w));
    assert_int_equal(tb_set_requires_grad(w, true), TB_OK);
    assert_true(tb_requires_grad(w));
    h = tb_tanh(K(tb_matmul(x, w)));
    assert_true(tb_requires_grad(h));
    assert_false(tb_requires_grad(x));
    assert_int_equal(tb_sync(&h, 1), TB_OK); /* h is data now, with its history */
    assert_null(tb_tensor_node(h));
    loss = tb_sum(h, NULL, 0, false);
    assert_int_equal(tb_sync(&loss, 1), TB_OK);
    assert_int_equal(tb_grad(loss, NULL, &w, 1, &g), TB_OK);
    assert_non_null(g);
    read_f64(g, got);
    /* dL/dw = x^T (1 - tanh(xw)^2) */
    for (i = 0; i < 3; i++) {
        for (j = 0; j < 2; j++) {
            double a = xv[i * 2] * wv[j] + xv[i * 2 + 1] * wv[2 + j], d = 1 - tanh(a) * tanh(a);
            want[0 * 2 + j] += xv[i * 2] * d;
            want[1 * 2 + j] += xv[i * 2 + 1] * d;
        }
    }
    for (j = 0; j < 4; j++)
        assert_true(fabs(got[j] - want[j]) < 1e-12);
    tb_tensor_release(g);
    /* without requires_grad the history goes with the sync: no path */
    assert_int_equal(tb_set_requires_grad(w, false), TB_OK);
    tb_tensor_release(h);
    tb_tensor_release(loss);
    h = tb_tanh(K(tb_matmul(x, w)));
    assert_int_equal(tb_sync(&h, 1), TB_OK);
    loss = tb_sum(h, NULL, 0, false);
    assert_int_equal(tb_grad(loss, NULL, &w, 1, &g), TB_OK);
    assert_null(g);
    tb_tensor_release(h);
    tb_tensor_release(loss);
    tb_tensor_release(w);
    tb_tensor_release(x);
}

static void test_assign(void **state) {
    static const double a[] = {1, 2, 3}, b[] = {10, 20, 30};
    tb_tensor *p, *v, *old_reader, *g;
    double got[3];
    (void)state;
    assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
    p = from(a, 1, DIMS(3));
    v = from(b, 1, DIMS(3));
    assert_int_equal(tb_set_requires_grad(p, true), TB_OK);
    old_reader = tb_mul_scalar(p, 2.0);                     /* recorded before: reads 1, 2, 3 */
    assert_int_equal(tb_assign(p, K(tb_add(p, v))), TB_OK); /* p = 11, 22, 33 (pending) */
    assert_true(tb_requires_grad(p));
    read_f64(old_reader, got);
    assert_true(got[0] == 2 && got[1] == 4 && got[2] == 6);
    read_f64(p, got);
    assert_true(got[0] == 11 && got[1] == 22 && got[2] == 33);
    /* p is a leaf now: the gradient of p * p is 2p, not through the old p */
    {
        tb_tensor *y = tb_sum(K(tb_mul(p, p)), NULL, 0, false);
        assert_int_equal(tb_grad(y, NULL, &p, 1, &g), TB_OK);
        read_f64(g, got);
        assert_true(got[0] == 22 && got[2] == 66);
        tb_tensor_release(g);
        tb_tensor_release(y);
    }
    /* a pending value assigned to a tensor that requires no grad keeps its value */
    {
        tb_tensor *q = from(a, 1, DIMS(3));
        assert_int_equal(tb_assign(q, K(tb_mul(q, q))), TB_OK);
        read_f64(q, got);
        assert_true(got[0] == 1 && got[1] == 4 && got[2] == 9);
        tb_tensor_release(q);
    }
    /* ... and when the value was computed from one that requires grad, no history either:
       state updated from gradients step after step does not keep every step alive */
    {
        tb_tensor *q = from(a, 1, DIMS(3)), *y = NULL;
        assert_int_equal(tb_assign(q, K(tb_mul(p, v))), TB_OK);
        assert_false(tb_requires_grad(q));
        y = tb_sum(q, NULL, 0, false);
        g = (tb_tensor *)1;
        assert_int_equal(tb_grad(y, NULL, &p, 1, &g), TB_OK);
        assert_null(g); /* no path from p through the assignment */
        read_f64(q, got);
        assert_true(got[0] == 110 && got[1] == 440 && got[2] == 990);
        tb_tensor_release(y);
        {
            tb_tensor *r = tb_add(p, v); /* synced: a value with history */
            assert_non_null(r);
            assert_int_equal(tb_sync(&r, 1), TB_OK);
            assert_int_equal(tb_assign(q, r), TB_OK);
            tb_tensor_release(r);
        }
        read_f64(q, got);
        assert_true(got[0] == 21 && got[2] == 63);
        y = tb_sum(q, NULL, 0, false);
        g = (tb_tensor *)1;
        assert_int_equal(tb_grad(y, NULL, &p, 1, &g), TB_OK);
        assert_null(g);
        tb_tensor_release(y);
        tb_tensor_release(q);
    }
    tb_tensor_release(old_reader);
    tb_tensor_release(p);
    tb_tensor_release(v);
}

/* ---- custom ops ---- */

static tb_status sq_ref(const void *const *inputs, const tb_shape *shapes, size_t n, void *output,
                        const tb_shape *out_shape, const int64_t *attrs, size_t num_attrs,
                        void *user) {
    const double *x = (const double *)inputs[0];
    double *y = (double *)output;
    int64_t k, m = 0;
    (void)shapes, (void)n, (void)attrs, (void)num_attrs, (void)user;
    tb_shape_numel(out_shape, &m);
    for (k = 0; k < m; k++)
        y[k] = x[k] * x[k];
    return TB_OK;
}

static tb_status sq_vjp(tb_tensor *const *inputs, size_t n, tb_tensor *output, tb_tensor *grad,
                        const int64_t *attrs, size_t num_attrs, tb_tensor **grads, void *user) {
    (void)n, (void)output, (void)attrs, (void)num_attrs, (void)user;
    tb_tensor *twice = tb_mul_scalar(inputs[0], 2.0);
    grads[0] = tb_mul(twice, grad);
    tb_tensor_release(twice);
    return grads[0] != NULL ? TB_OK : tb_last_status();
}

/* Registers the square (sq_ref or another reference) under `name`, with sq_vjp or without. */
static tb_op register_square(const char *name, tb_custom_reference_fn reference, bool vjp) {
    tb_custom_op_desc desc;
    tb_op op;
    memset(&desc, 0, sizeof desc);
    desc.name = name;
    desc.num_inputs = 1;
    desc.reference = reference;
    desc.vjp = vjp ? sq_vjp : NULL;
    assert_int_equal(tb_op_register(&desc, &op), TB_OK);
    return op;
}

static void test_custom_op_vjp(void **state) {
    static const double v[] = {1.5, -2.0};
    tb_op with, without;
    tb_tensor *x, *y, *g = NULL;
    double got[2];
    (void)state;
    assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
    with = register_square("ag_square", sq_ref, true);
    without = register_square("ag_square_novjp", sq_ref, false);
    x = from(v, 1, DIMS(2));
    y = tb_sum(K(tb_call_op(with, &x, 1, NULL, 0)), NULL, 0, false);
    assert_int_equal(tb_grad(y, NULL, &x, 1, &g), TB_OK);
    read_f64(g, got);
    assert_true(got[0] == 3.0 && got[1] == -4.0);
    tb_tensor_release(g);
    tb_tensor_release(y);
    y = tb_sum(K(tb_call_op(without, &x, 1, NULL, 0)), NULL, 0, false);
    g = x; /* overwritten with NULL on error */
    assert_int_equal(tb_grad(y, NULL, &x, 1, &g), TB_ERR_UNSUPPORTED);
    assert_null(g);
    assert_non_null(strstr(tb_last_error(), "ag_square_novjp"));
    tb_tensor_release(y);
    tb_tensor_release(x);
}

/* ---- tb_sync_for_grad ---- */

static int g_square_calls; /* runs of sq_counted's reference */

static tb_status sq_counted(const void *const *inputs, const tb_shape *shapes, size_t n,
                            void *output, const tb_shape *out_shape, const int64_t *attrs,
                            size_t num_attrs, void *user) {
    g_square_calls++;
    return sq_ref(inputs, shapes, n, output, out_shape, attrs, num_attrs, user);
}

/* loss = sum(relu(0.5 * square(x w) - 1)), square a custom op that counts its runs (every
   backend runs it through its reference). After tb_sync_for_grad the backward reads the saved
   ReLU input and matmul: the square runs once for forward and backward together, where after
   a plain tb_sync the backward runs it again. The gradient is x^T (mask * x w) either way. */
static bool check_sync_for_grad(const char *backend) {
    static const double wv[] = {0.5, -1.0, 2.0, 1.5, -0.25, 0.75};
    static const double xv[] = {1, 2, 3, 0.5, -1, 2, -2, 1, 0.25, 1.5, 1, -0.5};
    static tb_op op;
    static bool registered;
    double want[6] = {0}, got[6];
    int mode, i, j, k, matmuls;
    char *text;
    const char *at;
    if (tb_device_make(backend, 0, &g_dev) != TB_OK) {
        print_message("no %s device, skipped\n", backend);
        assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
        return false;
    }
    if (!registered) {
        op = register_square("ag_square_counted", sq_counted, true);
        registered = true;
    }
    for (i = 0; i < 4; i++) { /* d loss / d h = mask * h, h = x w */
        for (j = 0; j < 2; j++) {
            double h = 0;
            for (k = 0; k < 3; k++)
                h += xv[i * 3 + k] * wv[k * 2 + j];
            if (0.5 * h * h - 1 > 0) {
                for (k = 0; k < 3; k++)
                    want[k * 2 + j] += xv[i * 3 + k] * h;
            }
        }
    }
    for (mode = 0; mode < 2; mode++) {
        tb_tensor *w = from(wv, 2, DIMS(3, 2)), *x = from(xv, 2, DIMS(4, 3)), *h, *loss, *g = NULL;
        int64_t saved = tb_metrics_counter("SavedForGrad");
        assert_int_equal(tb_set_requires_grad(w, true), TB_OK);
        h = K(tb_matmul(x, w));
        h = K(tb_call_op(op, &h, 1, NULL, 0));
        loss = tb_sum(K(tb_relu(K(tb_add_scalar(K(tb_mul_scalar(h, 0.5)), -1.0)))), NULL, 0, false);
        drop_kept();
        g_square_calls = 0;
        if (mode == 0) {
            assert_int_equal(tb_sync_for_grad(&loss, 1, &w, 1), TB_OK);
            assert_true(tb_metrics_counter("SavedForGrad") > saved);
        } else {
            assert_int_equal(tb_sync(&loss, 1), TB_OK);
            assert_int_equal(tb_metrics_counter("SavedForGrad"), saved);
        }
        assert_int_equal(g_square_calls, 1);
        assert_int_equal(tb_grad(loss, NULL, &w, 1, &g), TB_OK);
        /* the gradient's graph: x^T (mask * h), and x w again where h was not saved */
        text = tb_ir_text(&g, 1);
        assert_non_null(text);
        for (matmuls = 0, at = text; (at = strstr(at, " = matmul(")) != NULL; at++)
            matmuls++;
        tb_free(text);
        assert_int_equal(matmuls, mode == 0 ? 1 : 2);
        read_f64(g, got);
        for (j = 0; j < 6; j++) {
            if (fabs(got[j] - want[j]) > 1e-12 * (1 + fabs(want[j]))) {
                fprintf(stderr, "%s, %s: element %d: %.17g, want %.17g\n", backend,
                        mode == 0 ? "saved" : "recomputed", j, got[j], want[j]);
                fail();
            }
        }
        /* the square ran again only where nothing was saved (the compiled backends keep the
           value of an op they run apart in any case) */
        assert_int_equal(g_square_calls, mode == 0 || strcmp(backend, "cpu") != 0 ? 1 : 2);
        tb_tensor_release(g);
        tb_tensor_release(loss); /* and with it the saved values */
        tb_tensor_release(x);
        tb_tensor_release(w);
    }
    assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
    return true;
}

static void test_sync_for_grad(void **state) {
    static const double v[] = {1, 2, 3, 4};
    static const int64_t iv[] = {1, 2};
    tb_tensor *x, *i, *y, *n, *none[2] = {NULL, NULL};
    int64_t saved;
    double got[4];
    (void)state;
    assert_true(check_sync_for_grad("cpu"));
    assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
    x = from(v, 2, DIMS(2, 2));
    i = from_i64(iv, 1, DIMS(2));
    assert_int_equal(tb_set_requires_grad(x, true), TB_OK);
    y = tb_exp(K(tb_matmul(x, x)));
    /* bad input: an error, and y is still pending and right */
    assert_int_equal(tb_sync_for_grad(NULL, 1, &x, 1), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_sync_for_grad(none, 2, &x, 1), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_sync_for_grad(&y, 1, NULL, 1), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "inputs is NULL"));
    assert_int_equal(tb_sync_for_grad(&y, 1, none, 1), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "inputs[0] is NULL"));
    assert_int_equal(tb_sync_for_grad(&y, 1, &i, 1), TB_ERR_DTYPE);
    assert_non_null(strstr(tb_last_error(), "i64"));
    assert_non_null(tb_tensor_node(y));
    { /* a history tb_grad refuses (a custom op without a vjp): refused here, nothing synced */
        tb_op op = register_square("ag_square_unsaved", sq_ref, false);
        tb_tensor *z;
        z = tb_sum(K(tb_call_op(op, &x, 1, NULL, 0)), NULL, 0, false);
        assert_int_equal(tb_sync_for_grad(&z, 1, &x, 1), TB_ERR_UNSUPPORTED);
        assert_non_null(strstr(tb_last_error(), "ag_square_unsaved"));
        assert_non_null(tb_tensor_node(z));
        assert_int_equal(tb_sync(&z, 1), TB_OK);
        read_f64(z, got);
        assert_true(got[0] == 30);
        tb_tensor_release(z);
    }
    /* no inputs, or a tensor without history: a plain sync that saves nothing */
    saved = tb_metrics_counter("SavedForGrad");
    n = tb_sum(i, NULL, 0, false);
    assert_int_equal(tb_sync_for_grad(&n, 1, &x, 1), TB_OK);
    assert_null(tb_tensor_node(n));
    assert_int_equal(tb_sync_for_grad(&y, 1, NULL, 0), TB_OK);
    assert_null(tb_tensor_node(y));
    assert_int_equal(tb_metrics_counter("SavedForGrad"), saved);
    assert_int_equal(tb_sync_for_grad(NULL, 0, NULL, 0), TB_OK);
    read_f64(y, got);
    assert_true(fabs(got[0] - exp(7.0)) < 1e-9 * exp(7.0));
    drop_kept();
    tb_tensor_release(n);
    tb_tensor_release(y);
    tb_tensor_release(i);
    tb_tensor_release(x);
}

static void test_sync_for_grad_devices(void **state) {
    bool native, opencl;
    (void)state;
    native = check_sync_for_grad("native");
    opencl = check_sync_for_grad("opencl");
    if (!native && !opencl) skip();
}

/* ---- bad input ---- */

static void test_bad_input(void **state) {
    static const double v[] = {1, 2, 3, 4};
    static const int64_t iv[] = {1, 2};
    tb_tensor *x, *i, *y, *g[2] = {NULL, NULL}, *s;
    (void)state;
    assert_int_equal(tb_device_make("cpu", 0, &g_dev), TB_OK);
    x = from(v, 2, DIMS(2, 2));
    i = from_i64(iv, 1, DIMS(2));
    y = tb_exp(x);
    /* a non-scalar without a seed */
    assert_int_equal(tb_grad(y, NULL, &x, 1, g), TB_ERR_SHAPE);
    assert_non_null(strstr(tb_last_error(), "single element"));
    assert_null(g[0]);
    /* a seed of another shape */
    s = from(v, 1, DIMS(4));
    assert_int_equal(tb_grad(y, s, &x, 1, g), TB_ERR_SHAPE);
    tb_tensor_release(s);
    /* integer input and integer output */
    assert_int_equal(tb_grad(K(tb_sum(y, NULL, 0, false)), NULL, &i, 1, g), TB_ERR_DTYPE);
    assert_non_null(strstr(tb_last_error(), "i64"));
    assert_int_equal(tb_grad(K(tb_sum(i, NULL, 0, false)), NULL, &x, 1, g), TB_ERR_DTYPE);
    /* NULLs */
    assert_int_equal(tb_grad(NULL, NULL, &x, 1, g), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_grad(y, NULL, NULL, 1, g), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_grad(y, NULL, &x, 1, NULL), TB_ERR_INVALID_ARGUMENT);
    g[1] = NULL;
    assert_int_equal(
        tb_grad(K(tb_sum(y, NULL, 0, false)), NULL, (tb_tensor *const[]){x, NULL}, 2, g),
        TB_ERR_INVALID_ARGUMENT);
    assert_null(g[0]);
    /* requires_grad on integers; assign mismatches; nothing changes */
    assert_int_equal(tb_set_requires_grad(i, true), TB_ERR_DTYPE);
    assert_false(tb_requires_grad(i));
    assert_int_equal(tb_set_requires_grad(NULL, true), TB_ERR_INVALID_ARGUMENT);
    s = from(v, 1, DIMS(4));
    assert_int_equal(tb_assign(x, s), TB_ERR_SHAPE);
    assert_non_null(strstr(tb_last_error(), "[4]"));
    assert_int_equal(tb_assign(x, K(tb_cast(x, TB_F32))), TB_ERR_SHAPE);
    assert_int_equal(tb_assign(NULL, s), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_assign(s, NULL), TB_ERR_INVALID_ARGUMENT);
    {
        double got[4];
        read_f64(x, got);
        assert_true(got[0] == 1 && got[3] == 4);
    }
    assert_null(tb_detach(NULL));
    tb_tensor_release(s);
    tb_tensor_release(y);
    tb_tensor_release(i);
    tb_tensor_release(x);
}

static void test_bad_input_devices(void **state) {
    static const double v[] = {1, 2};
    tb_device cpu, other;
    tb_tensor *x, *z, *g = NULL;
    (void)state;
    if (tb_device_make("opencl", 0, &other) != TB_OK &&
        tb_device_make("native", 0, &other) != TB_OK) {
        print_message("only the cpu backend here, skipped\n");
        skip();
    }
    assert_int_equal(tb_device_make("cpu", 0, &cpu), TB_OK);
    g_dev = cpu;
    x = from(v, 1, DIMS(2));
    g_dev = other;
    z = from(v, 1, DIMS(2));
    assert_int_equal(tb_grad(K(tb_sum(x, NULL, 0, false)), NULL, &z, 1, &g),
                     TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "inputs[0] is on"));
    assert_int_equal(tb_set_requires_grad(x, true), TB_OK);
    assert_int_equal(tb_sync_for_grad((tb_tensor *const[]){K(tb_exp(x))}, 1, &z, 1),
                     TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "inputs[0] is on"));
    assert_int_equal(tb_sync_for_grad((tb_tensor *const[]){K(tb_exp(x)), K(tb_exp(z))}, 2, &x, 1),
                     TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "cannot be one graph"));
    drop_kept();
    assert_int_equal(tb_assign(x, z), TB_ERR_INVALID_ARGUMENT);
    tb_tensor_release(x);
    tb_tensor_release(z);
    g_dev = cpu;
}

static int teardown(void **state) {
    (void)state;
    drop_kept();
    tb_shutdown();
    return 0;
}

/* tests/test_autograd_opencl.c runs the other backends' group (a separate program, since
   leak detection is off for OpenCL drivers) */
int main(void) {
    const struct CMUnitTest cpu[] = {
        cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_shared_matmul_grad_folded),
        cmocka_unit_test(test_shared_matmul_grad_per_batch),
        cmocka_unit_test(test_ties_split_evenly),
        cmocka_unit_test(test_maximum_tie_halves),
        cmocka_unit_test(test_prod_with_zeros),
        cmocka_unit_test(test_pow_and_clamp_edges),
        cmocka_unit_test(test_second_order),
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_history_survives_sync),
        cmocka_unit_test(test_assign),
        cmocka_unit_test(test_custom_op_vjp),
        cmocka_unit_test(test_sync_for_grad),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_bad_input_devices),
    };
    const struct CMUnitTest devices[] = {
        cmocka_unit_test(test_opencl_matches_cpu),
        cmocka_unit_test(test_native_matches_cpu),
        cmocka_unit_test(test_sync_for_grad_devices),
    };
#if defined(AUTOGRAD_DEVICES)
    (void)cpu;
    return cmocka_run_group_tests_name("devices", devices, NULL, teardown);
#else
    (void)devices;
    return cmocka_run_group_tests_name("cpu", cpu, NULL, teardown);
#endif
}
