/* Sharded tensors over the devices of one process: distributing and gathering, every change of
   placement (the in-process collectives), the all-reduce with every op on several dtypes, ops
   per shard with their placement rules, reductions over the sharded axis, tb_sharded_map, the
   data-parallel gradient beside the one-device gradient, empty shards and the errors. The
   devices are cpu:0 and the two PoCL devices (POCL_DEVICES="pthread pthread"); where OpenCL is
   missing, cpu:0 three times. Every value is checked against a computation on the host. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static tb_device g_dev[3];

static int setup(void **state) {
    tb_device probe[4];
    size_t n = 0;
    (void)state;
    assert_int_equal(tb_device_parse("cpu:0", &g_dev[0]), TB_OK);
    g_dev[1] = g_dev[2] = g_dev[0];
    if (tb_backend_devices("opencl", probe, 4, &n) == TB_OK && n >= 2) {
        g_dev[1] = probe[0];
        g_dev[2] = probe[1];
    } else {
        print_message("OpenCL has fewer than two devices here: every shard on cpu:0\n");
    }
    tb_clear_error();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tb_shutdown();
    return 0;
}

/* x[r][c] = 10 r + c + 1 (f32), rows x cols */
static tb_tensor *grid(int64_t rows, int64_t cols, const tb_device *d) {
    float v[64];
    int64_t r, c;
    tb_shape s = tb_shape_of(TB_F32, 2, rows, cols);
    assert_true(rows * cols <= 64);
    for (r = 0; r < rows; r++)
        for (c = 0; c < cols; c++)
            v[r * cols + c] = (float)(10 * r + c + 1);
    return tb_tensor_from_host(v, &s, d);
}

static void host_of(tb_tensor *t, float *out, size_t n) {
    assert_non_null(t);
    assert_int_equal(tb_tensor_to_host(t, out, n * sizeof(float)), TB_OK);
}

static void expect_grid(tb_tensor *t, int64_t rows, int64_t cols, int64_t r0, int64_t c0) {
    float v[64];
    int64_t r, c;
    tb_shape s = tb_tensor_shape(t);
    assert_int_equal(s.rank, 2);
    assert_int_equal(s.dims[0], rows);
    assert_int_equal(s.dims[1], cols);
    if (rows * cols == 0) return;
    host_of(t, v, (size_t)(rows * cols));
    for (r = 0; r < rows; r++)
        for (c = 0; c < cols; c++)
            assert_float_equal(v[r * cols + c], (float)(10 * (r + r0) + (c + c0) + 1), 0);
}

static void expect_on(tb_tensor *t, const tb_device *d) {
    tb_device got = tb_tensor_device(t);
    assert_true(tb_device_equal(&got, d));
}

/* ---- distributing and reading back ---- */

static void test_distribute_shard(void **state) {
    tb_tensor *x = grid(7, 5, NULL), *back;
    tb_sharded *s;
    tb_shape whole;
    int64_t rows[3] = {3, 2, 2}, at = 0;
    size_t i;
    (void)state;
    s = tb_distribute(x, g_dev, 3, TB_SHARD, 0);
    assert_non_null(s);
    assert_int_equal(tb_sharded_count(s), 3);
    assert_int_equal(tb_sharded_placement(s), TB_SHARD);
    assert_int_equal(tb_sharded_axis(s), 0);
    whole = tb_sharded_shape(s);
    assert_int_equal(whole.dims[0], 7);
    assert_int_equal(whole.dims[1], 5);
    for (i = 0; i < 3; i++) { /* numpy.array_split's rows: 3, 2, 2 */
        expect_on(tb_sharded_shard(s, i), &g_dev[i]);
        expect_grid(tb_sharded_shard(s, i), rows[i], 5, at, 0);
        at += rows[i];
    }
    assert_null(tb_sharded_shard(s, 3));
    back = tb_sharded_to_tensor(s, &g_dev[2]);
    expect_on(back, &g_dev[2]);
    expect_grid(back, 7, 5, 0, 0);
    tb_tensor_release(back);
    tb_sharded_release(s);

    /* the last axis, by a negative index; columns 2, 2, 1 */
    s = tb_distribute(x, g_dev, 3, TB_SHARD, -1);
    assert_non_null(s);
    assert_int_equal(tb_sharded_axis(s), 1);
    expect_grid(tb_sharded_shard(s, 0), 7, 2, 0, 0);
    expect_grid(tb_sharded_shard(s, 2), 7, 1, 0, 4);
    back = tb_sharded_to_tensor(s, NULL); /* the first shard's device */
    expect_on(back, &g_dev[0]);
    expect_grid(back, 7, 5, 0, 0);
    tb_tensor_release(back);
    tb_sharded_release(s);
    tb_tensor_release(x);
}

static void test_distribute_replicate_partial(void **state) {
    tb_tensor *x = grid(2, 3, &g_dev[1]), *back;
    tb_sharded *r, *p;
    float v[6];
    size_t i;
    (void)state;
    r = tb_distribute(x, g_dev, 3, TB_REPLICATE, 99); /* the axis is not read */
    assert_non_null(r);
    assert_int_equal(tb_sharded_axis(r), -1);
    for (i = 0; i < 3; i++) {
        expect_on(tb_sharded_shard(r, i), &g_dev[i]);
        expect_grid(tb_sharded_shard(r, i), 2, 3, 0, 0);
    }
    /* a replica on the asked device is given back as it is */
    back = tb_sharded_to_tensor(r, &g_dev[1]);
    assert_true(back == tb_sharded_shard(r, 1) || /* the first replica on that device */
                (tb_device_equal(&g_dev[0], &g_dev[1]) && back == tb_sharded_shard(r, 0)));
    tb_tensor_release(back);

    p = tb_distribute(x, g_dev, 3, TB_PARTIAL, 0);
    assert_non_null(p);
    expect_grid(tb_sharded_shard(p, 0), 2, 3, 0, 0);
    host_of(tb_sharded_shard(p, 2), v, 6);
    for (i = 0; i < 6; i++)
        assert_float_equal(v[i], 0, 0);
    back = tb_sharded_to_tensor(p, &g_dev[2]); /* the sum of the partial values */
    expect_grid(back, 2, 3, 0, 0);
    tb_tensor_release(back);
    tb_sharded_release(p);
    tb_sharded_release(r);
    tb_tensor_release(x);
}

static void test_empty_shards(void **state) {
    tb_tensor *x = grid(2, 3, NULL), *back;
    tb_sharded *s, *r, *m;
    int32_t ax0 = 0;
    (void)state;
    s = tb_distribute(x, g_dev, 3, TB_SHARD, 0); /* rows 1, 1, 0 */
    assert_non_null(s);
    assert_int_equal(tb_tensor_shape(tb_sharded_shard(s, 2)).dims[0], 0);
    back = tb_sharded_to_tensor(s, &g_dev[1]);
    expect_grid(back, 2, 3, 0, 0);
    tb_tensor_release(back);
    r = tb_sharded_redistribute(s, TB_REPLICATE, 0);
    assert_non_null(r);
    expect_grid(tb_sharded_shard(r, 2), 2, 3, 0, 0);
    /* a sum over the axis counts the empty shard as 0; a max and a min skip it */
    tb_sharded_release(r);
    r = tb_sharded_sum(s, &ax0, 1, false);
    assert_non_null(r);
    {
        float v[3];
        host_of(tb_sharded_shard(r, 2), v, 3);
        assert_float_equal(v[0], 1 + 11, 0);
        assert_float_equal(v[2], 3 + 13, 0);
    }
    m = tb_sharded_max(s, &ax0, 1, false);
    assert_non_null(m);
    {
        float v[3];
        host_of(tb_sharded_shard(m, 2), v, 3);
        assert_float_equal(v[0], 11, 0);
        assert_float_equal(v[2], 13, 0);
    }
    tb_sharded_release(m);
    m = tb_sharded_min(s, &ax0, 1, false);
    assert_non_null(m);
    {
        float v[3];
        host_of(tb_sharded_shard(m, 1), v, 3);
        assert_float_equal(v[1], 2, 0);
    }
    tb_sharded_release(m);
    tb_sharded_release(r);
    tb_sharded_release(s);
    tb_tensor_release(x);
}

/* ---- every change of placement ---- */

/* the whole tensor of s, and per placement what each shard must hold */
static void expect_placed(tb_sharded *s, tb_placement p, int32_t axis) {
    tb_tensor *back;
    size_t i;
    assert_non_null(s);
    assert_int_equal(tb_sharded_placement(s), p);
    assert_int_equal(tb_sharded_axis(s), p == TB_SHARD ? axis : -1);
    for (i = 0; i < 3; i++) {
        tb_tensor *t = tb_sharded_shard(s, i);
        expect_on(t, &g_dev[i]);
        if (p == TB_REPLICATE) expect_grid(t, 4, 5, 0, 0);
        if (p == TB_SHARD && axis == 0) {
            int64_t lo = i == 0 ? 0 : i == 1 ? 2 : 3, n = i == 0 ? 2 : 1;
            expect_grid(t, n, 5, lo, 0);
        }
        if (p == TB_SHARD && axis == 1) {
            int64_t lo = i == 0 ? 0 : i == 1 ? 2 : 4, n = i == 2 ? 1 : 2;
            expect_grid(t, 4, n, 0, lo);
        }
    }
    back = tb_sharded_to_tensor(s, &g_dev[1]);
    expect_grid(back, 4, 5, 0, 0);
    tb_tensor_release(back);
}

static void test_redistribute_every_pair(void **state) {
    static const tb_placement kinds[4] = {TB_SHARD, TB_SHARD, TB_REPLICATE, TB_PARTIAL};
    static const int32_t axes[4] = {0, 1, 0, 0};
    tb_tensor *x = grid(4, 5, NULL);
    int from, to;
    (void)state;
    for (from = 0; from < 4; from++) {
        for (to = 0; to < 4; to++) {
            tb_sharded *a = tb_distribute(x, g_dev, 3, kinds[from], axes[from]), *b;
            if (kinds[from] == TB_PARTIAL) { /* a real partial: a third of x on each device */
                tb_sharded *third = tb_sharded_map(&a, 1, NULL, NULL, TB_PARTIAL, 0);
                assert_null(third); /* fn NULL */
                tb_clear_error();
            }
            expect_placed(a, kinds[from], axes[from]);
            b = tb_sharded_redistribute(a, kinds[to], axes[to]);
            expect_placed(b, kinds[to], axes[to]);
            tb_sharded_release(b);
            tb_sharded_release(a);
        }
    }
    tb_tensor_release(x);
}

static tb_tensor *third_fn(void *user, tb_tensor *const *shards, size_t index) {
    (void)user, (void)index;
    return tb_div_scalar(shards[0], 3.0);
}

/* partial values that are all nonzero: x / 3 on each device */
static void test_partial_to_shard_and_replicate(void **state) {
    tb_tensor *x = grid(4, 5, NULL);
    tb_sharded *r = tb_distribute(x, g_dev, 3, TB_REPLICATE, 0), *p, *s, *a;
    size_t i;
    float v[20];
    (void)state;
    p = tb_sharded_map(&r, 1, third_fn, NULL, TB_PARTIAL, 0);
    assert_non_null(p);
    s = tb_sharded_redistribute(p, TB_SHARD, 1); /* reduce-scatter */
    assert_non_null(s);
    for (i = 0; i < 3; i++) {
        tb_shape sh = tb_tensor_shape(tb_sharded_shard(s, i));
        int64_t k, n = sh.dims[0] * sh.dims[1], lo = i == 0 ? 0 : i == 1 ? 2 : 4;
        host_of(tb_sharded_shard(s, i), v, (size_t)n);
        for (k = 0; k < n; k++)
            assert_float_equal(v[k], (float)(10 * (k / sh.dims[1]) + k % sh.dims[1] + lo + 1),
                               1e-5);
    }
    a = tb_sharded_redistribute(p, TB_REPLICATE, 0); /* all-reduce */
    assert_non_null(a);
    host_of(tb_sharded_shard(a, 2), v, 20);
    for (i = 0; i < 20; i++)
        assert_float_equal(v[i], (float)(10 * (i / 5) + i % 5 + 1), 1e-5);
    tb_sharded_release(a);
    tb_sharded_release(s);
    tb_sharded_release(p);
    tb_sharded_release(r);
    tb_tensor_release(x);
}

/* ---- the all-reduce ---- */

static tb_sharded *per_device(tb_dtype dt, const double v[3][4]) {
    tb_tensor *t[3];
    tb_sharded *s;
    size_t i;
    for (i = 0; i < 3; i++) {
        tb_tensor *f;
        float h[4];
        int k;
        tb_shape s4 = tb_shape_of(TB_F32, 1, 4);
        for (k = 0; k < 4; k++)
            h[k] = (float)v[i][k];
        f = tb_tensor_from_host(h, &s4, &g_dev[i]);
        t[i] = tb_cast(f, dt);
        tb_tensor_release(f);
    }
    s = tb_sharded_from_tensors(t, 3, TB_PARTIAL, 0);
    for (i = 0; i < 3; i++)
        tb_tensor_release(t[i]);
    return s;
}

static void test_all_reduce_ops_dtypes(void **state) {
    static const double v[3][4] = {{1, -2, 0, 3}, {4, 5, 0, -1}, {-2, 2, 1, 2}};
    static const tb_dtype dts[5] = {TB_F32, TB_F16, TB_I32, TB_I64, TB_BOOL};
    int d, op;
    (void)state;
    for (d = 0; d < 5; d++) {
        for (op = 0; op < TB_REDUCE_OP_COUNT; op++) {
            tb_sharded *in = per_device(dts[d], v), *out;
            double want[4], got[4];
            size_t i;
            int k;
            assert_non_null(in);
            out = tb_sharded_all_reduce(in, (tb_reduce_op)op);
            if (op == TB_REDUCE_MEAN && !tb_dtype_is_float(dts[d])) {
                assert_null(out);
                assert_int_equal(tb_last_status(), TB_ERR_DTYPE);
                tb_clear_error();
                tb_sharded_release(in);
                continue;
            }
            assert_non_null(out);
            for (k = 0; k < 4; k++) {
                double a = v[0][k], b = v[1][k], c = v[2][k];
                if (dts[d] == TB_BOOL) {
                    bool x = a != 0, y = b != 0, z = c != 0;
                    bool any = x || y || z, all = x && y && z;
                    want[k] = op == TB_REDUCE_MIN || op == TB_REDUCE_PRODUCT ? all : any;
                    continue;
                }
                want[k] = op == TB_REDUCE_SUM    ? a + b + c
                          : op == TB_REDUCE_MEAN ? (a + b + c) / 3
                          : op == TB_REDUCE_MAX  ? fmax(a, fmax(b, c))
                          : op == TB_REDUCE_MIN  ? fmin(a, fmin(b, c))
                                                 : a * b * c;
            }
            for (i = 0; i < 3; i++) {
                tb_tensor *f = tb_cast(tb_sharded_shard(out, i), TB_F64);
                expect_on(tb_sharded_shard(out, i), &g_dev[i]);
                assert_int_equal(tb_tensor_shape(tb_sharded_shard(out, i)).dtype, dts[d]);
                assert_int_equal(tb_tensor_to_host(f, got, sizeof got), TB_OK);
                for (k = 0; k < 4; k++)
                    assert_float_equal(got[k], want[k], dts[d] == TB_F16 ? 2e-3 : 1e-6);
                tb_tensor_release(f);
            }
            tb_sharded_release(out);
            tb_sharded_release(in);
        }
    }
}

/* the sums are made once, so every replica holds the same bits */
static void test_all_reduce_same_bits(void **state) {
    tb_tensor *t[3];
    tb_sharded *in, *out;
    float a[3][257], r[3][257];
    tb_shape s = tb_shape_of(TB_F32, 1, 257);
    size_t i, k;
    (void)state;
    for (i = 0; i < 3; i++) {
        for (k = 0; k < 257; k++)
            a[i][k] = (float)(1.0 / (double)(k + 3 * i + 1)) * (i == 1 ? 1e4f : 1e-3f);
        t[i] = tb_tensor_from_host(a[i], &s, &g_dev[i]);
    }
    in = tb_sharded_from_tensors(t, 3, TB_PARTIAL, 0);
    out = tb_sharded_all_reduce(in, TB_REDUCE_SUM);
    assert_non_null(out);
    for (i = 0; i < 3; i++)
        host_of(tb_sharded_shard(out, i), r[i], 257);
    assert_memory_equal(r[0], r[1], sizeof r[0]);
    assert_memory_equal(r[0], r[2], sizeof r[0]);
    for (k = 0; k < 257; k++)
        assert_float_equal(r[0][k], (a[0][k] + a[1][k]) + a[2][k], 0);
    tb_sharded_release(out);
    tb_sharded_release(in);
    for (i = 0; i < 3; i++)
        tb_tensor_release(t[i]);
}

static void test_all_reduce_many(void **state) {
    static const double v[3][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}};
    tb_sharded *in[2], *out[2] = {NULL, NULL};
    float got[4];
    (void)state;
    in[0] = per_device(TB_F32, v);
    in[1] = per_device(TB_F32, v);
    tb_metrics_reset();
    assert_int_equal(tb_sharded_all_reduce_many(in, 2, TB_REDUCE_MAX, out), TB_OK);
    host_of(tb_sharded_shard(out[1], 2), got, 4);
    assert_float_equal(got[0], 9, 0);
    assert_float_equal(got[3], 12, 0);
    tb_sharded_release(out[0]);
    tb_sharded_release(out[1]);
    /* errors leave out all NULL */
    out[0] = out[1] = (tb_sharded *)in[0];
    assert_int_equal(tb_sharded_all_reduce_many(in, 2, (tb_reduce_op)77, out),
                     TB_ERR_INVALID_ARGUMENT);
    assert_null(out[0]);
    assert_null(out[1]);
    tb_clear_error();
    tb_sharded_release(in[0]);
    tb_sharded_release(in[1]);
}

/* ---- ops per shard ---- */

static void test_binary_placements(void **state) {
    tb_tensor *x = grid(6, 4, NULL), *row, *col, *back;
    tb_sharded *a, *b, *c, *r, *rc, *p;
    float v[24], rv[4] = {100, 200, 300, 400}, cv[6] = {1, 2, 3, 4, 5, 6};
    tb_shape rs = tb_shape_of(TB_F32, 1, 4), cs = tb_shape_of(TB_F32, 2, 6, 1);
    int i;
    (void)state;
    row = tb_tensor_from_host(rv, &rs, NULL);
    col = tb_tensor_from_host(cv, &cs, NULL);
    a = tb_distribute(x, g_dev, 3, TB_SHARD, 0);
    b = tb_distribute(x, g_dev, 3, TB_SHARD, 0);
    c = tb_sharded_binary(tb_add, a, b); /* shard + shard */
    assert_non_null(c);
    back = tb_sharded_to_tensor(c, NULL);
    host_of(back, v, 24);
    for (i = 0; i < 24; i++)
        assert_float_equal(v[i], 2 * (10 * (i / 4) + i % 4 + 1), 0);
    tb_tensor_release(back);
    tb_sharded_release(c);

    /* shard + a replicated row (broadcast, whole) and a replicated column (sliced) */
    r = tb_distribute(row, g_dev, 3, TB_REPLICATE, 0);
    rc = tb_distribute(col, g_dev, 3, TB_REPLICATE, 0);
    c = tb_sharded_binary(tb_mul, r, a);
    assert_non_null(c);
    assert_int_equal(tb_sharded_placement(c), TB_SHARD);
    assert_int_equal(tb_sharded_axis(c), 0);
    back = tb_sharded_to_tensor(c, NULL);
    host_of(back, v, 24);
    for (i = 0; i < 24; i++)
        assert_float_equal(v[i], rv[i % 4] * (10 * (i / 4) + i % 4 + 1), 0);
    tb_tensor_release(back);
    tb_sharded_release(c);
    c = tb_sharded_binary(tb_sub, a, rc);
    assert_non_null(c);
    back = tb_sharded_to_tensor(c, NULL);
    host_of(back, v, 24);
    for (i = 0; i < 24; i++)
        assert_float_equal(v[i], (10 * (i / 4) + i % 4 + 1) - cv[i / 4], 0);
    tb_tensor_release(back);
    tb_sharded_release(c);
    c = tb_sharded_binary(tb_add, r, r); /* replicate + replicate */
    assert_non_null(c);
    assert_int_equal(tb_sharded_placement(c), TB_REPLICATE);
    host_of(tb_sharded_shard(c, 2), v, 4);
    assert_float_equal(v[3], 800, 0);
    tb_sharded_release(c);

    /* refused: partial, axes that do not line up, another split, other devices */
    p = tb_distribute(x, g_dev, 3, TB_PARTIAL, 0);
    assert_null(tb_sharded_binary(tb_add, a, p));
    assert_int_equal(tb_last_status(), TB_ERR_UNSUPPORTED);
    assert_non_null(strstr(tb_last_error(), "partial"));
    tb_clear_error();
    tb_sharded_release(b);
    b = tb_distribute(x, g_dev, 3, TB_SHARD, 1);
    assert_null(tb_sharded_binary(tb_add, a, b));
    assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
    tb_clear_error();
    tb_sharded_release(b);
    {
        tb_tensor *t[3];
        t[0] = tb_sharded_shard(a, 0);
        t[1] = tb_sharded_shard(a, 1);
        t[2] = tb_sharded_shard(a, 2);
        b = tb_sharded_from_tensors(t, 3, TB_SHARD, 0);
        assert_non_null(b);
        tb_sharded_release(b);
        t[1] = tb_sharded_shard(a, 2); /* on devices 0, 2, 2 */
        b = tb_sharded_from_tensors(t, 3, TB_SHARD, 0);
        assert_non_null(b);
        c = tb_sharded_binary(tb_add, a, b);
        if (!tb_device_equal(&g_dev[1], &g_dev[2])) {
            assert_null(c);
            assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
            assert_non_null(strstr(tb_last_error(), "shard 1 is on"));
            tb_clear_error();
        }
        tb_sharded_release(c);
        tb_sharded_release(b);
    }
    /* a replicated column of the wrong length does not broadcast */
    {
        float bad[5] = {0};
        tb_shape bs = tb_shape_of(TB_F32, 2, 5, 1);
        tb_tensor *w = tb_tensor_from_host(bad, &bs, NULL);
        tb_sharded *rw = tb_distribute(w, g_dev, 3, TB_REPLICATE, 0);
        assert_null(tb_sharded_binary(tb_add, a, rw));
        assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
        tb_clear_error();
        tb_sharded_release(rw);
        tb_tensor_release(w);
    }
    c = tb_sharded_unary(tb_exp, p);
    assert_null(c);
    tb_clear_error();
    c = tb_sharded_unary(tb_neg, p); /* linear: allowed */
    assert_non_null(c);
    assert_int_equal(tb_sharded_placement(c), TB_PARTIAL);
    back = tb_sharded_to_tensor(c, NULL);
    host_of(back, v, 24);
    assert_float_equal(v[5], -12, 0);
    tb_tensor_release(back);
    tb_sharded_release(c);
    tb_sharded_release(p);
    tb_sharded_release(rc);
    tb_sharded_release(r);
    tb_sharded_release(a);
    tb_tensor_release(col);
    tb_tensor_release(row);
    tb_tensor_release(x);
}

/* host matmul of grid(m, k) / 10 by grid(k, n) / 10 */
static double mm_want(int64_t m, int64_t k, int64_t n, int64_t i, int64_t j) {
    double s = 0;
    int64_t t;
    (void)m, (void)n;
    for (t = 0; t < k; t++)
        s += ((10.0 * i + t + 1) / 10) * ((10.0 * t + j + 1) / 10);
    return s;
}

static void expect_mm(tb_sharded *c, int64_t m, int64_t k, int64_t n) {
    tb_tensor *back;
    float v[64];
    int64_t i;
    assert_non_null(c);
    back = tb_sharded_to_tensor(c, &g_dev[2]);
    host_of(back, v, (size_t)(m * n));
    for (i = 0; i < m * n; i++)
        assert_float_equal(v[i], mm_want(m, k, n, i / n, i % n), 1e-3);
    tb_tensor_release(back);
}

static void test_matmul_placements(void **state) {
    tb_tensor *x = grid(5, 4, NULL), *w = grid(4, 6, NULL), *xs = tb_div_scalar(x, 10),
              *ws = tb_div_scalar(w, 10);
    tb_sharded *a, *b, *c, *d;
    (void)state;
    a = tb_distribute(xs, g_dev, 3, TB_SHARD, 0);
    b = tb_distribute(ws, g_dev, 3, TB_REPLICATE, 0);
    c = tb_sharded_matmul(a, b); /* rows */
    assert_non_null(c);
    assert_int_equal(tb_sharded_placement(c), TB_SHARD);
    assert_int_equal(tb_sharded_axis(c), 0);
    expect_mm(c, 5, 4, 6);
    tb_sharded_release(c);
    tb_sharded_release(a);
    tb_sharded_release(b);

    a = tb_distribute(xs, g_dev, 3, TB_REPLICATE, 0);
    b = tb_distribute(ws, g_dev, 3, TB_SHARD, 1);
    c = tb_sharded_matmul(a, b); /* columns */
    assert_non_null(c);
    assert_int_equal(tb_sharded_axis(c), 1);
    expect_mm(c, 5, 4, 6);
    tb_sharded_release(c);
    c = tb_sharded_matmul(a, a); /* [5,4] x [5,4]: matmul's own shape error */
    assert_null(c);
    assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
    tb_clear_error();
    tb_sharded_release(a);
    tb_sharded_release(b);

    a = tb_distribute(xs, g_dev, 3, TB_SHARD, 1);
    b = tb_distribute(ws, g_dev, 3, TB_SHARD, 0);
    c = tb_sharded_matmul(a, b); /* the contracted dim: partial sums */
    assert_non_null(c);
    assert_int_equal(tb_sharded_placement(c), TB_PARTIAL);
    d = tb_sharded_redistribute(c, TB_REPLICATE, 0);
    expect_mm(d, 5, 4, 6);
    tb_sharded_release(d);
    tb_sharded_release(c);
    tb_sharded_release(b);
    b = tb_distribute(ws, g_dev, 3, TB_SHARD, 1);
    assert_null(tb_sharded_matmul(a, b));
    assert_int_equal(tb_last_status(), TB_ERR_UNSUPPORTED);
    assert_non_null(strstr(tb_last_error(), "shard(axis 1 of f32[5,4])"));
    tb_clear_error();
    tb_sharded_release(b);
    tb_sharded_release(a);
    tb_tensor_release(ws);
    tb_tensor_release(xs);
    tb_tensor_release(w);
    tb_tensor_release(x);
}

/* ---- reductions ---- */

static void test_reductions(void **state) {
    tb_tensor *x = grid(5, 4, NULL);
    tb_sharded *s = tb_distribute(x, g_dev, 3, TB_SHARD, 0), *r, *p, *q;
    int32_t ax0 = 0, ax1 = 1;
    float v[5];
    int k;
    (void)state;
    r = tb_sharded_sum(s, &ax0, 1, false); /* over the sharded axis: replicated */
    assert_int_equal(tb_sharded_placement(r), TB_REPLICATE);
    host_of(tb_sharded_shard(r, 1), v, 4);
    for (k = 0; k < 4; k++)
        assert_float_equal(v[k], 5 * (k + 1) + 100, 0);
    tb_sharded_release(r);
    r = tb_sharded_mean(s, &ax0, 1, true);
    assert_int_equal(tb_tensor_shape(tb_sharded_shard(r, 2)).rank, 2);
    host_of(tb_sharded_shard(r, 2), v, 4);
    assert_float_equal(v[0], 21, 1e-5);
    tb_sharded_release(r);
    r = tb_sharded_max(s, NULL, 0, false); /* every axis */
    host_of(tb_sharded_shard(r, 0), v, 1);
    assert_float_equal(v[0], 44, 0);
    tb_sharded_release(r);
    r = tb_sharded_min(s, &ax0, 1, false);
    host_of(tb_sharded_shard(r, 2), v, 4);
    assert_float_equal(v[3], 4, 0);
    tb_sharded_release(r);
    /* over another axis: still sharded, the axis renumbered */
    r = tb_sharded_sum(s, &ax1, 1, false);
    assert_int_equal(tb_sharded_placement(r), TB_SHARD);
    assert_int_equal(tb_sharded_axis(r), 0);
    q = tb_sharded_redistribute(r, TB_REPLICATE, 0);
    host_of(tb_sharded_shard(q, 0), v, 5);
    for (k = 0; k < 5; k++)
        assert_float_equal(v[k], 40 * k + 10, 0);
    tb_sharded_release(q);
    tb_sharded_release(r);
    tb_sharded_release(s);
    s = tb_distribute(x, g_dev, 3, TB_SHARD, 1);
    r = tb_sharded_mean(s, &ax0, 1, false);
    assert_int_equal(tb_sharded_axis(r), 0);
    tb_sharded_release(r);
    tb_sharded_release(s);
    /* partial: a sum stays partial, a max is refused */
    p = tb_distribute(x, g_dev, 3, TB_PARTIAL, 0);
    r = tb_sharded_sum(p, &ax1, 1, false);
    assert_int_equal(tb_sharded_placement(r), TB_PARTIAL);
    tb_sharded_release(r);
    assert_null(tb_sharded_max(p, &ax1, 1, false));
    assert_int_equal(tb_last_status(), TB_ERR_UNSUPPORTED);
    tb_clear_error();
    tb_sharded_release(p);
    /* integer mean */
    {
        tb_tensor *xi = tb_cast(x, TB_I32);
        s = tb_distribute(xi, g_dev, 3, TB_SHARD, 0);
        assert_null(tb_sharded_mean(s, &ax0, 1, false));
        assert_int_equal(tb_last_status(), TB_ERR_DTYPE);
        tb_clear_error();
        r = tb_sharded_sum(s, &ax0, 1, false);
        assert_non_null(r);
        tb_sharded_release(r);
        tb_sharded_release(s);
        tb_tensor_release(xi);
    }
    tb_tensor_release(x);
}

/* ---- map and gradients ---- */

static tb_tensor *bad_fn(void *user, tb_tensor *const *shards, size_t index) {
    int mode = *(int *)user;
    tb_shape s = tb_tensor_shape(shards[0]);
    if (index < 1) return tb_tensor_retain(shards[0]);
    if (mode == 0) return NULL;     /* no error of its own */
    return tb_zeros(&s, &g_dev[0]); /* on another device than shard 1's */
}

static void test_map_errors(void **state) {
    tb_tensor *x = grid(3, 2, NULL);
    tb_sharded *s = tb_distribute(x, g_dev, 3, TB_SHARD, 0);
    int mode = 0;
    (void)state;
    assert_null(tb_sharded_map(&s, 1, bad_fn, &mode, TB_SHARD, 0));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "fn returned NULL for shard 1"));
    tb_clear_error();
    if (!tb_device_equal(&g_dev[0], &g_dev[1])) {
        mode = 1;
        assert_null(tb_sharded_map(&s, 1, bad_fn, &mode, TB_SHARD, 0));
        assert_non_null(strstr(tb_last_error(), "another device"));
        tb_clear_error();
    }
    assert_null(tb_sharded_map(&s, 0, bad_fn, &mode, TB_SHARD, 0));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    tb_clear_error();
    tb_sharded_release(s);
    tb_tensor_release(x);
}

/* loss_i = sum((x_i w + b - y_i)^2) / N on each device's rows */
typedef struct {
    double n;
} loss_ctx;

static tb_tensor *loss_fn(void *user, tb_tensor *const *in, size_t index) {
    tb_tensor *p = tb_matmul(in[0], in[2]), *q = tb_add(p, in[3]), *e = tb_sub(q, in[1]),
              *e2 = tb_mul(e, e), *s = tb_sum(e2, NULL, 0, false),
              *l = tb_div_scalar(s, ((loss_ctx *)user)->n);
    (void)index;
    tb_tensor_release(p);
    tb_tensor_release(q);
    tb_tensor_release(e);
    tb_tensor_release(e2);
    tb_tensor_release(s);
    return l;
}

static void test_data_parallel_grad(void **state) {
    float xv[7 * 3], yv[7 * 2], wv[3 * 2] = {0.5f, -1, 0.25f, 2, -0.75f, 1}, bv[2] = {0.1f, -0.2f};
    tb_shape xs = tb_shape_of(TB_F32, 2, 7, 3), ys = tb_shape_of(TB_F32, 2, 7, 2),
             wsh = tb_shape_of(TB_F32, 2, 3, 2), bs = tb_shape_of(TB_F32, 1, 2);
    tb_tensor *x, *y, *w, *b, *l1, *g1[2] = {NULL, NULL}, *in1[4];
    tb_sharded *sx, *sy, *sw, *sb, *in[4], *loss, *grads[2] = {NULL, NULL}, *total = NULL;
    loss_ctx ctx = {7};
    float want[6], got[6];
    size_t i, j;
    (void)state;
    for (i = 0; i < 21; i++)
        xv[i] = (float)sin((double)i);
    for (i = 0; i < 14; i++)
        yv[i] = (float)cos((double)i);
    x = tb_tensor_from_host(xv, &xs, NULL);
    y = tb_tensor_from_host(yv, &ys, NULL);
    w = tb_tensor_from_host(wv, &wsh, NULL);
    b = tb_tensor_from_host(bv, &bs, NULL);
    /* one device */
    assert_int_equal(tb_set_requires_grad(w, true), TB_OK);
    assert_int_equal(tb_set_requires_grad(b, true), TB_OK);
    in1[0] = x, in1[1] = y, in1[2] = w, in1[3] = b;
    l1 = loss_fn(&ctx, in1, 0);
    assert_int_equal(tb_grad(l1, NULL, in1 + 2, 2, g1), TB_OK);
    /* three: the batch sharded, the parameters replicated, the loss partial */
    sx = tb_distribute(x, g_dev, 3, TB_SHARD, 0);
    sy = tb_distribute(y, g_dev, 3, TB_SHARD, 0);
    sw = tb_distribute(w, g_dev, 3, TB_REPLICATE, 0);
    sb = tb_distribute(b, g_dev, 3, TB_REPLICATE, 0);
    for (i = 0; i < 3; i++) {
        assert_int_equal(tb_set_requires_grad(tb_sharded_shard(sw, i), true), TB_OK);
        assert_int_equal(tb_set_requires_grad(tb_sharded_shard(sb, i), true), TB_OK);
    }
    in[0] = sx, in[1] = sy, in[2] = sw, in[3] = sb;
    loss = tb_sharded_map(in, 4, loss_fn, &ctx, TB_PARTIAL, 0);
    assert_non_null(loss);
    assert_int_equal(tb_sharded_grad(loss, in + 2, 2, grads, &loss, 1, &total), TB_OK);
    assert_int_equal(tb_sharded_placement(total), TB_REPLICATE);
    host_of(l1, want, 1);
    host_of(tb_sharded_shard(total, 2), got, 1);
    assert_float_equal(got[0], want[0], 1e-5);
    tb_sharded_release(total);
    for (j = 0; j < 2; j++) {
        size_t n = j == 0 ? 6 : 2;
        assert_int_equal(tb_sharded_placement(grads[j]), TB_REPLICATE);
        host_of(g1[j], want, n);
        for (i = 0; i < 3; i++) {
            expect_on(tb_sharded_shard(grads[j], i), &g_dev[i]);
            host_of(tb_sharded_shard(grads[j], i), got, n);
            for (size_t k = 0; k < n; k++)
                assert_float_equal(got[k], want[k], 1e-5);
        }
        tb_sharded_release(grads[j]);
    }
    /* refused: a replicated loss, a parameter that is not replicated */
    assert_int_equal(tb_sharded_grad(sw, in + 2, 2, grads, NULL, 0, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_null(grads[0]);
    assert_int_equal(tb_sharded_grad(loss, in + 2, 2, grads, &loss, 1, NULL),
                     TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_sharded_grad(loss, in, 2, grads, NULL, 0, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "not replicated"));
    tb_clear_error();
    tb_sharded_release(loss);
    tb_sharded_release(sx);
    tb_sharded_release(sy);
    tb_sharded_release(sw);
    tb_sharded_release(sb);
    tb_tensor_release(g1[0]);
    tb_tensor_release(g1[1]);
    tb_tensor_release(l1);
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(w);
    tb_tensor_release(b);
}

/* ---- scopes own tensor handles, not the shards a sharded tensor holds ---- */

static tb_tensor *eval_dropout(tb_tensor *t) {
    return tb_dropout(t, 0.5, false); /* not training: t itself */
}

static void test_scopes(void **state) {
    tb_tensor *x = grid(4, 3, NULL), *whole, *replica;
    tb_sharded *a, *b, *r, *sum, *all, *same;
    int32_t ax0 = 0;
    (void)state;
    assert_int_equal(tb_scope_begin(), TB_OK);
    a = tb_distribute(x, g_dev, 3, TB_SHARD, 0);
    b = tb_sharded_unary(tb_neg, a);
    r = tb_sharded_redistribute(a, TB_REPLICATE, 0);
    /* collectives inside the scope: their sums must outlive it */
    sum = tb_sharded_sum(a, &ax0, 1, false);
    all = tb_sharded_all_reduce(r, TB_REDUCE_MAX);
    same = tb_sharded_unary(eval_dropout, a);        /* an op that hands back its input */
    whole = tb_sharded_to_tensor(b, NULL);           /* the scope's */
    replica = tb_sharded_to_tensor(r, &g_dev[2]);    /* a shard handed back: the scope's too */
    assert_true(replica == tb_sharded_shard(r, 2) || /* the first replica on that device */
                tb_device_equal(&g_dev[0], &g_dev[2]));
    assert_non_null(whole);
    assert_int_equal(tb_scope_end(), TB_OK);
    /* every shard outlived the scope */
    expect_grid(tb_sharded_shard(a, 1), 1, 3, 2, 0);
    expect_grid(tb_sharded_shard(r, 2), 4, 3, 0, 0);
    expect_grid(tb_sharded_shard(all, 0), 4, 3, 0, 0);
    expect_grid(tb_sharded_shard(same, 2), 1, 3, 3, 0);
    {
        float v[3];
        host_of(tb_sharded_shard(sum, 0), v, 3);
        assert_float_equal(v[0], 1 + 11 + 21 + 31, 0);
    }
    tb_sharded_release(same);
    tb_sharded_release(all);
    tb_sharded_release(sum);
    {
        tb_sharded *m = tb_sharded_max(b, &ax0, 1, false);
        float v[3];
        assert_non_null(m);
        host_of(tb_sharded_shard(m, 0), v, 3);
        assert_float_equal(v[0], -1, 0);
        tb_sharded_release(m);
    }
    tb_sharded_release(r);
    tb_sharded_release(b);
    tb_sharded_release(a);
    tb_tensor_release(x);
}

/* ---- replicas, half precision, gradients without a path, aliasing ---- */

static tb_tensor *transpose_op(tb_tensor *t) {
    return tb_transpose(t, 0, 1);
}

static tb_tensor *transpose_fn(void *user, tb_tensor *const *in, size_t index) {
    (void)user, (void)index;
    return tb_transpose(in[0], 0, 1);
}

static tb_tensor *to_bool(tb_tensor *t) {
    return tb_cast(t, TB_BOOL);
}

static void test_replicas_are_handles(void **state) {
    tb_device two[2];
    tb_tensor *x = grid(2, 2, NULL), *p[2];
    tb_sharded *r;
    tb_optimizer *opt;
    tb_optimizer_desc d = tb_sgd_desc(0.1);
    (void)state;
    two[0] = two[1] = g_dev[0]; /* the same device twice */
    r = tb_distribute(x, two, 2, TB_REPLICATE, 0);
    assert_non_null(r);
    p[0] = tb_sharded_shard(r, 0);
    p[1] = tb_sharded_shard(r, 1);
    assert_true(p[0] != x && p[1] != x && p[0] != p[1]);
    assert_int_equal(tb_set_requires_grad(p[0], true), TB_OK);
    assert_false(tb_requires_grad(x)); /* the caller's x is untouched */
    assert_int_equal(tb_set_requires_grad(p[1], true), TB_OK);
    opt = tb_optimizer_new(&d, p, 2); /* two parameters, not one twice */
    assert_non_null(opt);
    tb_optimizer_free(opt);
    tb_sharded_release(r);
    tb_tensor_release(x);
}

static void test_half_mean(void **state) {
    tb_tensor *four, *h, *m;
    tb_sharded *a, *r;
    tb_shape s = tb_shape_of(TB_F32, 1, 40000);
    float v = 0;
    (void)state;
    four = tb_full(&s, 4.0, NULL);
    h = tb_cast(four, TB_F16);
    a = tb_distribute(h, g_dev, 2, TB_SHARD, 0);
    r = tb_sharded_mean(a, NULL, 0, false); /* the shards' sums (80000) overflow f16 */
    assert_non_null(r);
    assert_int_equal(tb_sharded_shape(r).dtype, TB_F16);
    m = tb_cast(tb_sharded_shard(r, 1), TB_F32);
    host_of(m, &v, 1);
    assert_float_equal(v, 4, 0);
    tb_tensor_release(m);
    tb_sharded_release(r);
    tb_sharded_release(a);
    tb_tensor_release(h);
    tb_tensor_release(four);
}

static tb_tensor *first_only_fn(void *user, tb_tensor *const *in, size_t index) {
    (void)user, (void)index;
    return tb_sum(in[0], NULL, 0, false); /* in[1] is not used */
}

static void test_grad_without_path(void **state) {
    tb_tensor *w = grid(2, 2, NULL), *u = grid(1, 2, NULL);
    tb_sharded *sw, *su, *in[2], *loss, *g[2] = {NULL, NULL};
    float v[4];
    size_t i;
    (void)state;
    sw = tb_distribute(w, g_dev, 2, TB_REPLICATE, 0);
    su = tb_distribute(u, g_dev, 2, TB_REPLICATE, 0);
    for (i = 0; i < 2; i++) {
        assert_int_equal(tb_set_requires_grad(tb_sharded_shard(sw, i), true), TB_OK);
        assert_int_equal(tb_set_requires_grad(tb_sharded_shard(su, i), true), TB_OK);
    }
    in[0] = sw;
    in[1] = su;
    loss = tb_sharded_map(in, 2, first_only_fn, NULL, TB_PARTIAL, 0);
    assert_non_null(loss);
    /* grads may be the parameters' own array */
    g[0] = sw;
    g[1] = su;
    assert_int_equal(tb_sharded_grad(loss, g, 2, g, NULL, 0, NULL), TB_OK);
    assert_non_null(g[0]);
    assert_null(g[1]); /* no device's loss reads u */
    host_of(tb_sharded_shard(g[0], 1), v, 4);
    for (i = 0; i < 4; i++)
        assert_float_equal(v[i], 2, 0); /* two devices, each d sum(w) / dw = 1 */
    tb_sharded_release(g[0]);
    tb_sharded_release(loss);
    tb_sharded_release(su);
    tb_sharded_release(sw);
    tb_tensor_release(u);
    tb_tensor_release(w);
}

static void test_more_rules(void **state) {
    tb_tensor *x = grid(4, 6, NULL), *b;
    tb_sharded *a, *p, *r, *io[1];
    int32_t ax1 = 1;
    float v[4];
    (void)state;
    a = tb_distribute(x, g_dev, 3, TB_SHARD, 0);
    /* a view that changes the shape is not elementwise */
    {
        tb_sharded *t = tb_sharded_map(&a, 1, transpose_fn, NULL, TB_SHARD, 1);
        assert_non_null(t); /* tb_sharded_map takes it, with the placement it is told */
        assert_int_equal(tb_sharded_shape(t).dims[1], 4);
        tb_sharded_release(t);
        assert_null(tb_sharded_unary(transpose_op, a));
        assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
        tb_clear_error();
    }
    /* a NULL from a failed call keeps its error through tb_sharded_shard */
    {
        int32_t bad = 5;
        assert_null(tb_sharded_shard(tb_sharded_sum(a, &bad, 1, false), 0));
        assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
        assert_non_null(strstr(tb_last_error(), "axis 5"));
        tb_clear_error();
    }
    /* partial: a mean is linear and stays partial; a bool partial is refused */
    p = tb_distribute(x, g_dev, 3, TB_PARTIAL, 0);
    r = tb_sharded_mean(p, &ax1, 1, false);
    assert_non_null(r);
    assert_int_equal(tb_sharded_placement(r), TB_PARTIAL);
    b = tb_sharded_to_tensor(r, NULL);
    host_of(b, v, 4);
    assert_float_equal(v[1], 13.5, 1e-5);
    tb_tensor_release(b);
    tb_sharded_release(r);
    {
        tb_sharded *pb = tb_sharded_unary(to_bool, a);
        tb_sharded *q = tb_sharded_redistribute(pb, TB_PARTIAL, 0);
        assert_non_null(q);
        assert_null(tb_sharded_sum(q, NULL, 0, false));
        assert_int_equal(tb_last_status(), TB_ERR_UNSUPPORTED);
        tb_clear_error();
        tb_sharded_release(q);
        tb_sharded_release(pb);
    }
    /* out may be in */
    io[0] = p;
    assert_int_equal(tb_sharded_all_reduce_many(io, 1, TB_REDUCE_SUM, io), TB_OK);
    assert_true(io[0] != p);
    assert_int_equal(tb_sharded_placement(io[0]), TB_REPLICATE);
    tb_sharded_release(io[0]);
    tb_sharded_release(p);
    tb_sharded_release(a);
    tb_tensor_release(x);
}

/* ---- bad arguments ---- */

static void test_errors(void **state) {
    tb_tensor *x = grid(2, 3, NULL), *t[2];
    tb_sharded *s;
    tb_device many[TB_MAX_SHARDS + 1];
    size_t i;
    (void)state;
    for (i = 0; i <= TB_MAX_SHARDS; i++)
        many[i] = g_dev[0];
    assert_null(tb_distribute(NULL, g_dev, 3, TB_SHARD, 0));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    tb_clear_error();
    assert_null(tb_distribute(x, NULL, 3, TB_SHARD, 0));
    tb_clear_error();
    assert_null(tb_distribute(x, g_dev, 0, TB_SHARD, 0));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    tb_clear_error();
    assert_null(tb_distribute(x, many, TB_MAX_SHARDS + 1, TB_REPLICATE, 0));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    tb_clear_error();
    assert_null(tb_distribute(x, g_dev, 3, TB_SHARD, 2));
    assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
    assert_non_null(strstr(tb_last_error(), "axis 2 is out of range for rank 2"));
    tb_clear_error();
    assert_null(tb_distribute(x, g_dev, 3, (tb_placement)9, 0));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    tb_clear_error();
    /* a NULL input keeps the first error of a chain */
    tb_set_error(TB_ERR_DTYPE, "earlier");
    assert_null(tb_sharded_redistribute(NULL, TB_REPLICATE, 0));
    assert_null(tb_sharded_sum(NULL, NULL, 0, false));
    assert_int_equal(tb_last_status(), TB_ERR_DTYPE);
    tb_clear_error();
    /* from_tensors: shapes that do not fit the placement */
    t[0] = x;
    t[1] = tb_transpose(x, 0, 1);
    assert_null(tb_sharded_from_tensors(t, 2, TB_REPLICATE, 0));
    assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
    assert_non_null(strstr(tb_last_error(), "shard 1 is f32[3,2]"));
    tb_clear_error();
    assert_null(tb_sharded_from_tensors(t, 2, TB_SHARD, 0));
    assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
    tb_clear_error();
    tb_tensor_release(t[1]);
    t[1] = grid(4, 3, NULL);
    s = tb_sharded_from_tensors(t, 2, TB_SHARD, 0); /* rows 2 and 4 */
    assert_non_null(s);
    assert_int_equal(tb_sharded_shape(s).dims[0], 6);
    assert_int_equal(tb_sharded_all_reduce(s, TB_REDUCE_SUM) == NULL, 1);
    assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
    tb_clear_error();
    tb_sharded_release(s);
    tb_tensor_release(t[1]);
    assert_int_equal(tb_sharded_count(NULL), 0);
    assert_int_equal(tb_sharded_axis(NULL), -1);
    assert_string_equal(tb_placement_name(TB_PARTIAL), "partial");
    assert_string_equal(tb_placement_name((tb_placement)9), "invalid");
    tb_sharded_release(NULL);
    tb_tensor_release(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distribute_shard),
        cmocka_unit_test(test_distribute_replicate_partial),
        cmocka_unit_test(test_empty_shards),
        cmocka_unit_test(test_redistribute_every_pair),
        cmocka_unit_test(test_partial_to_shard_and_replicate),
        cmocka_unit_test(test_all_reduce_ops_dtypes),
        cmocka_unit_test(test_all_reduce_same_bits),
        cmocka_unit_test(test_all_reduce_many),
        cmocka_unit_test(test_binary_placements),
        cmocka_unit_test(test_matmul_placements),
        cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_map_errors),
        cmocka_unit_test(test_data_parallel_grad),
        cmocka_unit_test(test_scopes),
        cmocka_unit_test(test_replicas_are_handles),
        cmocka_unit_test(test_half_mean),
        cmocka_unit_test(test_grad_without_path),
        cmocka_unit_test(test_more_rules),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
