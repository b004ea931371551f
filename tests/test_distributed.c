/* Process groups without MPI: the registry (built-in "mpi", registration, sorted list, errors),
   the mpi group when no MPI library can be opened, the collectives through a one-rank group
   that copies, and the agreement check through a two-rank stand-in whose other rank records a
   different collective. tests/mpi/collectives.c runs the collectives under mpirun. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <stdlib.h>
#include <string.h>

/* ---- a group of one rank (collectives copy) and a stand-in for two ---- */

static int g_size = 1;    /* the loopback's world size */
static int g_tamper = -1; /* record index the "other rank" changes (-1: none) */
static int g_finalized;   /* finalize calls */

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
    g_tamper = 2; /* the other rank's collective kind */
    y = tb_all_reduce(g, x, TB_REDUCE_SUM);
    assert_null(y);
    assert_int_equal(tb_last_status(), TB_ERR_STATE);
    assert_non_null(strstr(tb_last_error(), "rank 0 called #0 all_reduce(sum) f32[4]"));
    assert_non_null(strstr(tb_last_error(), "rank 1 called #0 all_gather f32[4]"));
    g_tamper = 7; /* its first dim */
    assert_null(tb_broadcast(g, x, 0));
    assert_non_null(strstr(tb_last_error(), "rank 1 called #1 broadcast(from 0) f32[5]"));
    g_tamper = 3; /* its op */
    assert_null(tb_all_reduce(g, x, TB_REDUCE_SUM));
    assert_non_null(strstr(tb_last_error(), "all_reduce(mean)"));
    g_tamper = 1; /* its sequence number */
    assert_int_equal(tb_barrier(g), TB_ERR_STATE);
    g_tamper = TB_MAX_RANK + 7; /* the other rank could not read its tensor */
    assert_null(tb_all_reduce(g, x, TB_REDUCE_SUM));
    assert_int_equal(tb_last_status(), TB_ERR_EXECUTE);
    g_tamper = -1;
    y = tb_all_reduce(g, x, TB_REDUCE_SUM);
    assert_non_null(y);
    tb_tensor_release(y);
    tb_tensor_release(x);
}

/* Results borrow the group's receive buffers: many alive at once (more than the pool keeps),
   each keeps its values while later collectives run, and released ones are reused. */
static void test_results_keep_their_buffers(void **state) {
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
    /* the pool's buffers again, grown for a larger result */
    y[0] = tb_all_gather(g, x[6]);
    assert_int_equal(tb_tensor_shape(y[0]).dims[0], 5);
    tb_tensor_release(y[0]);
    for (k = 0; k < 7; k++)
        tb_tensor_release(x[k]);
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
        cmocka_unit_test_teardown(test_results_keep_their_buffers, teardown),
        cmocka_unit_test(test_refused_allocations),
    };
    return cmocka_run_group_tests_name("distributed", tests, NULL, NULL);
}
