/* Process groups without MPI: the registry (built-in "mpi", registration, sorted list, errors),
   the mpi group when no MPI library can be opened, the collectives through a one-rank group
   that copies, the agreement check through a two-rank stand-in whose other rank records a
   different collective, collectives recorded inside graphs on every backend, their gradients,
   and a rank whose input fails. tests/mpi/collectives.c runs the collectives under mpirun. */
#define _POSIX_C_SOURCE 200809L /* setenv */
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

/* ---- a group of one rank (collectives copy) and a stand-in for two ---- */

static int g_size = 1;    /* the loopback's world size */
static int g_tamper = -1; /* record index the "other rank" changes (-1: none) */
static int g_finalized;   /* finalize calls */
static int g_exchanges;   /* all_gather calls (each collective's exchange is one) */

static tb_status loop_init(void *user_data, int32_t *rank, int32_t *size) {
    (void)user_data;
    *rank = 0;
    *size = g_size;
    return TB_OK;
}

static tb_status loop_all_reduce(void *user_data, const void *send, void *recv, size_t count,
                                 tb_dtype dtype, tb_reduce_op op) {
    (void)user_data, (void)op;
    memcpy(recv, send, count * tb_dtype_size(dtype));
    return TB_OK;
}

static tb_status loop_all_gather(void *user_data, const void *send, void *recv, size_t bytes) {
    int r;
    (void)user_data;
    g_exchanges++;
    for (r = 0; r < g_size; r++)
        memcpy((char *)recv + (size_t)r * bytes, send, bytes);
    if (g_tamper >= 0 && g_size > 1) {
        int64_t *other = (int64_t *)((char *)recv + bytes);
        /* the last field is the other rank's "could read its tensor" flag */
        other[g_tamper] = g_tamper == TB_MAX_RANK + 7 ? 0 : other[g_tamper] + 1;
    }
    return TB_OK;
}

static tb_status loop_broadcast(void *user_data, void *buf, size_t bytes, int32_t root) {
    (void)user_data, (void)buf, (void)bytes, (void)root;
    return TB_OK;
}

static tb_status loop_barrier(void *user_data) {
    (void)user_data;
    return TB_OK;
}

static void loop_finalize(void *user_data) {
    (void)user_data;
    g_finalized++;
}

static tb_process_group_impl loop_impl(void) {
    tb_process_group_impl impl;
    memset(&impl, 0, sizeof impl);
    impl.init = loop_init;
    impl.all_reduce = loop_all_reduce;
    impl.all_gather = loop_all_gather;
    impl.broadcast = loop_broadcast;
    impl.barrier = loop_barrier;
    impl.finalize = loop_finalize;
    return impl;
}

static int teardown(void **state) {
    (void)state;
    tb_shutdown();
    g_size = 1;
    g_tamper = -1;
    g_exchanges = 0;
    return 0;
}

static tb_tensor *vec(const float *v, int n) {
    tb_shape s = tb_shape_of(TB_F32, 1, n);
    return tb_tensor_from_host(v, &s, NULL);
}

static void test_registry(void **state) {
    tb_process_group_impl impl = loop_impl();
    const char *names[4] = {NULL, NULL, NULL, NULL};
    (void)state;
    assert_int_equal(tb_process_group_list(names, 4), 1);
    assert_string_equal(names[0], "mpi");
    assert_int_equal(tb_process_group_register("zeta", &impl), TB_OK);
    assert_int_equal(tb_process_group_register("alpha", &impl), TB_OK);
    assert_int_equal(tb_process_group_list(names, 2), 3);
    assert_string_equal(names[0], "alpha");
    assert_string_equal(names[1], "mpi");
    assert_int_equal(tb_process_group_list(names, 4), 3);
    assert_string_equal(names[2], "zeta");
    assert_int_equal(tb_process_group_list(NULL, 0), 3);

    assert_int_equal(tb_process_group_register("alpha", &impl), TB_ERR_DUPLICATE);
    assert_non_null(strstr(tb_last_error(), "duplicate name: alpha"));
    assert_int_equal(tb_process_group_register("mpi", &impl), TB_ERR_DUPLICATE);
    assert_int_equal(tb_process_group_register("9bad", &impl), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_process_group_register(NULL, &impl), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_process_group_register("nothing", NULL), TB_ERR_INVALID_ARGUMENT);
    impl.barrier = NULL;
    assert_int_equal(tb_process_group_register("half", &impl), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "barrier"));

    assert_null(tb_process_group_get("nccl"));
    assert_int_equal(tb_last_status(), TB_ERR_NOT_FOUND);
    assert_non_null(strstr(tb_last_error(), "'nccl'"));
    assert_non_null(strstr(tb_last_error(), "mpi"));
    assert_null(tb_process_group_get(NULL));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_process_group_rank(NULL), -1);
    assert_int_equal(tb_process_group_size(NULL), -1);
    assert_null(tb_process_group_name(NULL));
    assert_string_equal(tb_reduce_op_name(TB_REDUCE_PRODUCT), "product");
    assert_string_equal(tb_reduce_op_name(TB_REDUCE_OP_COUNT), "invalid");
}

static void test_mpi_absent(void **state) {
    (void)state;
    assert_int_equal(setenv("TB_MPI_LIBRARY", "libtb_no_such_mpi.so.0", 1), 0);
    assert_null(tb_process_group_get("mpi"));
    assert_int_equal(tb_last_status(), TB_ERR_UNAVAILABLE);
    assert_non_null(strstr(tb_last_error(), "libtb_no_such_mpi.so.0"));
    assert_non_null(strstr(tb_last_error(), "TB_MPI_LIBRARY"));
    /* asked again: the same answer, nothing half set up */
    assert_null(tb_process_group_get("mpi"));
    assert_int_equal(tb_last_status(), TB_ERR_UNAVAILABLE);
    /* a library that is not MPI */
    assert_int_equal(setenv("TB_MPI_LIBRARY", "libm.so.6", 1), 0);
    assert_null(tb_process_group_get("mpi"));
    assert_int_equal(tb_last_status(), TB_ERR_UNAVAILABLE);
    assert_non_null(strstr(tb_last_error(), "does not export MPI_"));
    unsetenv("TB_MPI_LIBRARY");
}

static void test_collectives_on_one_rank(void **state) {
    static const float v[6] = {1.5f, -2.0f, 3.0f, 0.25f, 8.0f, -1.0f};
    tb_process_group_impl impl = loop_impl();
    tb_process_group *g;
    tb_tensor *x, *y;
    float out[6];
    int op;
    (void)state;
    assert_int_equal(tb_process_group_register("loop", &impl), TB_OK);
    g = tb_process_group_get("loop");
    assert_non_null(g);
    assert_int_equal(tb_process_group_rank(g), 0);
    assert_int_equal(tb_process_group_size(g), 1);
    assert_string_equal(tb_process_group_name(g), "loop");
    assert_ptr_equal(tb_process_group_get("loop"), g);
    x = vec(v, 6);
    for (op = 0; op < TB_REDUCE_OP_COUNT; op++) {
        y = tb_all_reduce(g, x, (tb_reduce_op)op);
        assert_non_null(y);
        assert_int_equal(tb_tensor_to_host(y, out, sizeof out), TB_OK);
        assert_memory_equal(out, v, sizeof out);
        tb_tensor_release(y);
        /* no reduce_scatter entry: done through all_reduce */
        y = tb_reduce_scatter(g, x, (tb_reduce_op)op);
        assert_non_null(y);
        assert_int_equal(tb_tensor_to_host(y, out, sizeof out), TB_OK);
        assert_memory_equal(out, v, sizeof out);
        tb_tensor_release(y);
    }
    y = tb_all_gather(g, x);
    assert_int_equal(tb_tensor_shape(y).dims[0], 6);
    tb_tensor_release(y);
    y = tb_broadcast(g, x, 0);
    assert_int_equal(tb_tensor_to_host(y, out, sizeof out), TB_OK);
    assert_memory_equal(out, v, sizeof out);
    tb_tensor_release(y);
    assert_int_equal(tb_barrier(g), TB_OK);

    /* bad arguments */
    assert_null(tb_broadcast(g, x, 1));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_null(tb_all_reduce(g, x, (tb_reduce_op)99));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_null(tb_all_reduce(NULL, x, TB_REDUCE_SUM));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_barrier(NULL), TB_ERR_INVALID_ARGUMENT);
    tb_clear_error();
    assert_null(tb_all_gather(g, NULL));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "NULL tensor"));
    tb_tensor_release(x);
    {
        tb_shape s = tb_shape_of(TB_I32, 1, 3);
        tb_tensor *i = tb_zeros(&s, NULL), *sc;
        assert_null(tb_all_reduce(g, i, TB_REDUCE_MEAN));
        assert_int_equal(tb_last_status(), TB_ERR_DTYPE);
        tb_tensor_release(i);
        /* recording errors still meet the other ranks at once (their syncs fail too) */
        g_exchanges = 0;
        assert_null(tb_all_reduce(g, NULL, TB_REDUCE_SUM));
        assert_int_equal(g_exchanges, 1);
        sc = tb_scalar_tensor(tb_scalar_f(TB_F32, 2.0), NULL);
        assert_null(tb_reduce_scatter(g, sc, TB_REDUCE_SUM));
        assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
        y = tb_all_gather(g, sc);
        assert_int_equal(tb_tensor_shape(y).rank, 1);
        assert_int_equal(tb_tensor_shape(y).dims[0], 1);
        tb_tensor_release(y);
        tb_tensor_release(sc);
    }
    g_finalized = 0;
    tb_shutdown();
    assert_int_equal(g_finalized, 1);
}

static void test_ranks_that_disagree(void **state) {
    static const float v[4] = {1, 2, 3, 4};
    tb_process_group_impl impl = loop_impl();
    tb_process_group *g;
    tb_tensor *x, *y;
    (void)state;
    g_size = 2;
    assert_int_equal(tb_process_group_register("pair", &impl), TB_OK);
    g = tb_process_group_get("pair");
    assert_non_null(g);
    x = vec(v, 4);
    /* recorded lazily: the ranks meet when the graph runs */
    g_tamper = 2; /* the other rank's collective kind */
    y = tb_all_reduce(g, x, TB_REDUCE_SUM);
    assert_non_null(y);
    assert_int_equal(g_exchanges, 0);
    assert_int_equal(tb_sync(&y, 1), TB_ERR_STATE);
    assert_int_equal(g_exchanges, 1);
    assert_non_null(strstr(tb_last_error(), "tb_all_reduce: the ranks of process group 'pair'"));
    assert_non_null(strstr(tb_last_error(), "rank 0 called #0 all_reduce(sum) f32[4]"));
    assert_non_null(strstr(tb_last_error(), "rank 1 called #0 all_gather f32[4]"));
    tb_tensor_release(y);
    g_tamper = 7; /* its first dim */
    y = tb_broadcast(g, x, 0);
    assert_int_equal(tb_sync(&y, 1), TB_ERR_STATE);
    assert_non_null(strstr(tb_last_error(), "rank 1 called #1 broadcast(from 0) f32[5]"));
    tb_tensor_release(y);
    g_tamper = 3; /* its op */
    y = tb_all_reduce(g, x, TB_REDUCE_SUM);
    assert_int_equal(tb_sync(&y, 1), TB_ERR_STATE);
    assert_non_null(strstr(tb_last_error(), "all_reduce(mean)"));
    /* the failed collective stays pending: a later sync meets the ranks again */
    g_tamper = -1;
    assert_int_equal(tb_sync(&y, 1), TB_OK);
    tb_tensor_release(y);
    g_tamper = 1; /* its sequence number */
    assert_int_equal(tb_barrier(g), TB_ERR_STATE);
    g_tamper = TB_MAX_RANK + 7; /* the other rank could not compute its input */
    y = tb_all_reduce(g, x, TB_REDUCE_SUM);
    assert_int_equal(tb_sync(&y, 1), TB_ERR_EXECUTE);
    assert_non_null(strstr(tb_last_error(), "rank 1 could not take part"));
    tb_tensor_release(y);
    /* a mismatch inside a larger graph: the sync fails, nothing after the collective runs */
    g_tamper = 2;
    {
        tb_tensor *a = tb_mul_scalar(x, 2.0), *b = tb_all_reduce(g, a, TB_REDUCE_SUM);
        tb_tensor *c = tb_add_scalar(b, 1.0);
        float out[4];
        assert_int_equal(tb_tensor_to_host(c, out, sizeof out), TB_ERR_STATE);
        g_tamper = -1;
        assert_int_equal(tb_tensor_to_host(c, out, sizeof out), TB_OK);
        assert_true(out[0] == 3.0f && out[3] == 9.0f);
        tb_tensor_release(a);
        tb_tensor_release(b);
        tb_tensor_release(c);
    }
    g_tamper = -1;
    y = tb_all_reduce(g, x, TB_REDUCE_SUM);
    assert_non_null(y);
    assert_int_equal(tb_sync(&y, 1), TB_OK);
    tb_tensor_release(y);
    tb_tensor_release(x);
}

/* Many collectives pending at once, each synced later: each keeps its own values. */
static void test_results_keep_their_values(void **state) {
    tb_process_group_impl impl = loop_impl();
    tb_process_group *g;
    tb_tensor *x[7], *y[7];
    float v[5], out[5];
    int k, i;
    (void)state;
    assert_int_equal(tb_process_group_register("loop", &impl), TB_OK);
    g = tb_process_group_get("loop");
    assert_non_null(g);
    for (k = 0; k < 7; k++) {
        for (i = 0; i < 5; i++)
            v[i] = (float)(k * 10 + i);
        x[k] = vec(v, 5);
        y[k] = tb_all_reduce(g, x[k], TB_REDUCE_SUM);
        assert_non_null(y[k]);
    }
    for (k = 0; k < 7; k++) {
        assert_int_equal(tb_tensor_to_host(y[k], out, sizeof out), TB_OK);
        for (i = 0; i < 5; i++)
            assert_true(out[i] == (float)(k * 10 + i));
    }
    for (k = 0; k < 7; k++)
        tb_tensor_release(y[k]);
    y[0] = tb_all_gather(g, x[6]);
    assert_int_equal(tb_tensor_shape(y[0]).dims[0], 5);
    tb_tensor_release(y[0]);
    for (k = 0; k < 7; k++)
        tb_tensor_release(x[k]);
}

/* A stand-in of two ranks whose other rank holds the same values: all_reduce sums twice each
   value, all_gather repeats the tensor, reduce_scatter keeps half of the doubled values. */
static tb_status twin_all_reduce(void *user_data, const void *send, void *recv, size_t count,
                                 tb_dtype dtype, tb_reduce_op op) {
    size_t i;
    (void)user_data;
    assert_int_equal(dtype, TB_F32); /* f16 and bf16 travel as f32 */
    for (i = 0; i < count; i++) {
        float a = ((const float *)send)[i];
        ((float *)recv)[i] = op == TB_REDUCE_SUM ? a + a : op == TB_REDUCE_PRODUCT ? a * a : a;
    }
    return TB_OK;
}

static tb_process_group *twin_group(void) {
    tb_process_group_impl impl = loop_impl();
    impl.all_reduce = twin_all_reduce;
    g_size = 2;
    if (tb_process_group_register("twin", &impl) != TB_OK) return NULL;
    return tb_process_group_get("twin");
}

/* y = all_reduce(x * 2) + 1 and friends, recorded in one graph and synced once, on every
   backend there is, against the serial computation. */
static void test_collectives_in_a_graph(void **state) {
    static const char *const devices[] = {"cpu:0", "native:0", "opencl:0"};
    static const float v[6] = {1.5f, -2.0f, 3.0f, 0.25f, 8.0f, -1.0f};
    tb_process_group *g;
    size_t d;
    int i;
    (void)state;
    g = twin_group();
    assert_non_null(g);
    for (d = 0; d < sizeof devices / sizeof devices[0]; d++) {
        tb_device dev;
        tb_shape s = tb_shape_of(TB_F32, 2, 2, 3);
        tb_tensor *x, *a, *r, *y, *e, *z, *h, *m, *ga, *rs, *b, *c, *outs[4];
        float out[6], gathered[12], mean[6], scattered[3];
        if (tb_device_parse(devices[d], &dev) != TB_OK) continue;
        x = tb_tensor_from_host(v, &s, &dev);
        if (x == NULL) { /* no such backend here */
            print_message("note: %s: %s\n", devices[d], tb_last_error());
            tb_clear_error();
            continue;
        }
        a = tb_mul_scalar(x, 2.0);
        r = tb_all_reduce(g, a, TB_REDUCE_SUM);
        y = tb_add_scalar(r, 1.0);
        e = tb_exp(a);
        z = tb_all_gather(g, e);
        h = tb_cast(a, TB_BF16);
        m = tb_all_reduce(g, h, TB_REDUCE_MEAN);
        ga = tb_all_reduce(g, x, TB_REDUCE_SUM);
        rs = tb_reduce_scatter(g, ga, TB_REDUCE_SUM);
        b = tb_cast(m, TB_F32);
        c = tb_mul_scalar(rs, 0.5);
        outs[0] = y, outs[1] = z, outs[2] = b, outs[3] = c;
        assert_non_null(y);
        assert_non_null(z);
        assert_non_null(b);
        assert_non_null(c);
        assert_int_equal(tb_tensor_shape(z).dims[0], 4);
        assert_int_equal(tb_tensor_shape(c).dims[0], 1);
        tb_metrics_reset();
        g_exchanges = 0;
        assert_int_equal(tb_sync(outs, 4), TB_OK);
        assert_int_equal(g_exchanges, 6); /* five exchanges and all_gather's data */
        assert_int_equal(tb_metrics_counter("CollectiveOnHost"), 5);
        assert_int_equal(tb_tensor_to_host(y, out, sizeof out), TB_OK);
        assert_int_equal(tb_tensor_to_host(z, gathered, sizeof gathered), TB_OK);
        assert_int_equal(tb_tensor_to_host(b, mean, sizeof mean), TB_OK);
        assert_int_equal(tb_tensor_to_host(c, scattered, sizeof scattered), TB_OK);
        for (i = 0; i < 6; i++) {
            assert_true(out[i] == 4.0f * v[i] + 1.0f);
            assert_true(fabsf(gathered[i] - expf(2.0f * v[i])) <= 1e-5f * gathered[i]);
            assert_true(gathered[i + 6] == gathered[i]);
            assert_true(mean[i] == 2.0f * v[i]); /* (2x + 2x) / 2, exact in bf16 */
        }
        for (i = 0; i < 3; i++) /* rank 0's block of the doubled doubled values, halved */
            assert_true(scattered[i] == 2.0f * v[i]);
        /* y alone, twice: the second time the graphs around the collective come from the
           cache */
        for (i = 0; i < 2; i++) {
            tb_tensor *r2 = tb_all_reduce(g, a, TB_REDUCE_SUM), *w = tb_add_scalar(r2, 1.0);
            tb_metrics_reset();
            assert_int_equal(tb_tensor_to_host(w, out, sizeof out), TB_OK);
            if (i == 1) assert_int_equal(tb_metrics_counter("UncachedCompile"), 0);
            assert_true(out[5] == -3.0f);
            tb_tensor_release(w);
            tb_tensor_release(r2);
        }
        for (i = 0; i < 4; i++)
            tb_tensor_release(outs[i]);
        tb_tensor_release(r);
        tb_tensor_release(e);
        tb_tensor_release(h);
        tb_tensor_release(a);
        tb_tensor_release(m);
        tb_tensor_release(ga);
        tb_tensor_release(rs);
        tb_tensor_release(x);
    }
}

/* A collective's attributes enter the node's hash (and so the graph's cache key). */
static void test_collective_attributes_are_hashed(void **state) {
    static const float v[4] = {1, 2, 3, 4};
    tb_process_group *g;
    tb_tensor *x, *y[4];
    int i, j;
    (void)state;
    g = twin_group();
    assert_non_null(g);
    x = vec(v, 4);
    y[0] = tb_all_reduce(g, x, TB_REDUCE_SUM);
    y[1] = tb_all_reduce(g, x, TB_REDUCE_MAX);
    y[2] = tb_broadcast(g, x, 0);
    y[3] = tb_broadcast(g, x, 1);
    for (i = 0; i < 4; i++) {
        const tb_node *n = tb_tensor_node(y[i]);
        assert_non_null(n);
        assert_int_equal(tb_node_op(n), TB_OP_COLLECTIVE);
        assert_int_equal(tb_node_num_attrs(n), 5);
        assert_int_equal(tb_node_attr(n, 4), 2);
        for (j = 0; j < i; j++)
            assert_true(tb_node_hash(n) != tb_node_hash(tb_tensor_node(y[j])));
    }
    /* the dumps show the node; the backend's text treats it as a parameter */
    {
        tb_tensor *z = tb_add_scalar(y[0], 1.0);
        char *text = tb_ir_text(&z, 1), *backend = tb_ir_backend_text(&z, 1), *dot;
        dot = tb_ir_dot(&z, 1);
        assert_non_null(text);
        assert_non_null(strstr(text, "collective"));
        assert_non_null(backend);
        assert_non_null(dot);
        tb_free(text);
        tb_free(backend);
        tb_free(dot);
        tb_tensor_release(z);
    }
    /* recorded only by the collectives */
    {
        int64_t attrs[5] = {0, 1, 0, 0, 1};
        assert_null(tb_call_op(TB_OP_COLLECTIVE, &x, 1, attrs, 5));
        assert_int_equal(tb_last_status(), TB_ERR_UNSUPPORTED);
    }
    for (i = 0; i < 4; i++)
        tb_tensor_release(y[i]);
    tb_tensor_release(x);
}

/* tb_grad through all_reduce(sum): the all_reduce(sum) of the gradient; other collectives are
   an error naming them. */
static void test_collective_gradients(void **state) {
    static const float v[3] = {1, 2, 3};
    tb_process_group *g;
    tb_tensor *x, *x3, *y, *loss, *grad = NULL;
    float out[3];
    (void)state;
    g = twin_group();
    assert_non_null(g);
    x = vec(v, 3);
    assert_int_equal(tb_set_requires_grad(x, true), TB_OK);
    x3 = tb_mul_scalar(x, 3.0);
    y = tb_all_reduce(g, x3, TB_REDUCE_SUM);
    loss = tb_sum(y, NULL, 0, false);
    assert_int_equal(tb_grad(loss, NULL, &x, 1, &grad), TB_OK);
    g_exchanges = 0;
    assert_int_equal(tb_tensor_to_host(grad, out, sizeof out), TB_OK);
    assert_int_equal(g_exchanges, 1);
    assert_true(out[0] == 6.0f && out[1] == 6.0f && out[2] == 6.0f); /* 3 * (1 + 1) */
    tb_tensor_release(grad);
    tb_tensor_release(loss);
    tb_tensor_release(y);
    tb_tensor_release(x3);
    y = tb_all_gather(g, x);
    loss = tb_sum(y, NULL, 0, false);
    grad = NULL;
    assert_int_not_equal(tb_grad(loss, NULL, &x, 1, &grad), TB_OK);
    assert_int_equal(tb_last_status(), TB_ERR_UNSUPPORTED);
    assert_non_null(strstr(tb_last_error(), "all_gather"));
    tb_tensor_release(loss);
    tb_tensor_release(y);
    tb_tensor_release(x);
}

/* A rank whose input fails when the graph runs (an index out of range) still takes part in
   the exchange, so that the other ranks get an error instead of waiting; its own error is the
   input's. */
static void test_a_failed_input_meets_the_other_ranks(void **state) {
    static const float v[4] = {1, 2, 3, 4};
    tb_process_group *g;
    tb_tensor *x, *index, *picked, *y, *z;
    tb_shape is = tb_shape_of(TB_I64, 1, 4);
    const int64_t bad[4] = {0, 1, 2, 9};
    float out[4];
    (void)state;
    g = twin_group();
    assert_non_null(g);
    x = vec(v, 4);
    index = tb_tensor_from_host(bad, &is, NULL);
    picked = tb_gather(x, 0, index);
    y = tb_all_reduce(g, picked, TB_REDUCE_SUM);
    z = tb_add_scalar(y, 1.0);
    g_exchanges = 0;
    assert_int_equal(tb_tensor_to_host(z, out, sizeof out), TB_ERR_EXECUTE);
    assert_int_equal(g_exchanges, 1);
    assert_null(strstr(tb_last_error(), "could not take part")); /* its own error */
    tb_tensor_release(z);
    tb_tensor_release(y);
    tb_tensor_release(picked);
    tb_tensor_release(index);
    tb_tensor_release(x);
}

static tb_status failing_reference(const void *const *inputs, const tb_shape *input_shapes,
                                   size_t num_inputs, void *output, const tb_shape *output_shape,
                                   const int64_t *attrs, size_t num_attrs, void *user_data) {
    (void)inputs, (void)input_shapes, (void)num_inputs, (void)output, (void)output_shape;
    (void)attrs, (void)num_attrs, (void)user_data;
    return tb_set_error(TB_ERR_EXECUTE, "failing_op: refused");
}

/* A node that falls back (a custom op without a kernel, on native) and fails before the
   graph's collective: the collective still takes part in its exchange. */
static void test_a_failed_fallback_meets_the_other_ranks(void **state) {
    static const float v[4] = {1, 2, 3, 4};
    tb_custom_op_desc desc;
    tb_process_group *g;
    tb_device dev;
    tb_tensor *x, *f, *r, *y;
    tb_shape s = tb_shape_of(TB_F32, 1, 4);
    tb_op op;
    float out[4];
    (void)state;
    g = twin_group();
    assert_non_null(g);
    memset(&desc, 0, sizeof desc);
    desc.name = "failing_op";
    desc.num_inputs = 1;
    desc.reference = failing_reference;
    assert_int_equal(tb_op_register(&desc, &op), TB_OK);
    assert_int_equal(tb_device_parse("native:0", &dev), TB_OK);
    x = tb_tensor_from_host(v, &s, &dev);
    if (x == NULL) {
        print_message("note: native:0: %s\n", tb_last_error());
        tb_clear_error();
        return;
    }
    f = tb_call_op(op, &x, 1, NULL, 0);
    r = tb_all_reduce(g, x, TB_REDUCE_SUM);
    y = tb_add(f, r); /* post-order: the custom op first, then the collective */
    assert_non_null(y);
    g_exchanges = 0;
    assert_int_equal(tb_tensor_to_host(y, out, sizeof out), TB_ERR_EXECUTE);
    assert_non_null(strstr(tb_last_error(), "failing_op: refused"));
    assert_int_equal(g_exchanges, 1);
    tb_tensor_release(y);
    tb_tensor_release(r);
    tb_tensor_release(f);
    tb_tensor_release(x);
}

/* ---- refused allocations: an error or the right values, no leak, the next run right ---- */

static long g_live, g_calls, g_fail_at;

static void *hook_alloc(size_t size, void *user_data) {
    void *p;
    (void)user_data;
    if (++g_calls == g_fail_at) return NULL;
    p = malloc(size);
    if (p != NULL) g_live++;
    return p;
}

static void hook_free(void *ptr, void *user_data) {
    (void)user_data;
    if (ptr != NULL) g_live--;
    free(ptr);
}

/* Every collective once through the loopback; returns how many gave the right values. */
static int workload(void) {
    static const float v[6] = {1, 2, 3, 4, 5, 6};
    tb_process_group_impl impl = loop_impl();
    tb_process_group *g;
    tb_tensor *x, *y[5];
    float out[6];
    int k, right = 0;
    tb_status st = tb_process_group_register("loop", &impl);
    if (st != TB_OK && st != TB_ERR_DUPLICATE) return 0; /* registered by a run before */
    g = tb_process_group_get("loop");
    x = vec(v, 6);
    y[0] = tb_all_reduce(g, x, TB_REDUCE_MEAN);
    y[1] = tb_all_gather(g, x);
    y[2] = tb_reduce_scatter(g, x, TB_REDUCE_MAX);
    y[3] = tb_broadcast(g, x, 0);
    y[4] = tb_all_reduce(g, x, TB_REDUCE_SUM);
    for (k = 0; k < 5; k++) {
        right += y[k] != NULL && tb_tensor_to_host(y[k], out, sizeof out) == TB_OK &&
                 memcmp(out, v, sizeof out) == 0;
        tb_tensor_release(y[k]);
    }
    right += tb_barrier(g) == TB_OK;
    tb_tensor_release(x);
    return right;
}

static void test_refused_allocations(void **state) {
    tb_desc desc;
    long n, total;
    (void)state;
    memset(&desc, 0, sizeof desc);
    desc.allocator.alloc = hook_alloc;
    desc.allocator.free = hook_free;
    desc.backend = "cpu";
    g_calls = g_live = g_fail_at = 0;
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(workload(), 6);
    tb_shutdown();
    assert_int_equal(g_live, 0);
    total = g_calls;
    for (n = 1; n <= total; n++) {
        g_calls = 0;
        g_fail_at = n;
        if (tb_setup(&desc) != TB_OK) continue;
        workload();
        g_fail_at = 0;
        if (workload() != 6) fail_msg("allocation %ld refused: the next run went wrong", n);
        tb_shutdown();
        if (g_live != 0) fail_msg("allocation %ld refused: %ld blocks left", n, g_live);
        g_calls = 0;
        assert_int_equal(tb_setup(&desc), TB_OK);
        assert_int_equal(workload(), 6);
        tb_shutdown();
        assert_int_equal(g_live, 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_registry, teardown),
        cmocka_unit_test_teardown(test_mpi_absent, teardown),
        cmocka_unit_test_teardown(test_collectives_on_one_rank, teardown),
        cmocka_unit_test_teardown(test_ranks_that_disagree, teardown),
        cmocka_unit_test_teardown(test_results_keep_their_values, teardown),
        cmocka_unit_test_teardown(test_collectives_in_a_graph, teardown),
        cmocka_unit_test_teardown(test_collective_attributes_are_hashed, teardown),
        cmocka_unit_test_teardown(test_collective_gradients, teardown),
        cmocka_unit_test_teardown(test_a_failed_input_meets_the_other_ranks, teardown),
        cmocka_unit_test_teardown(test_a_failed_fallback_meets_the_other_ranks, teardown),
        cmocka_unit_test(test_refused_allocations),
    };
    return cmocka_run_group_tests_name("distributed", tests, NULL, NULL);
}
