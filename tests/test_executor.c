/* The lazy tensor executor: recording, sync, the computation cache, mark step, deep graphs, the
   automatic flush, the eager fallback, metrics, dumps and every error path. Most tests run on
   "count", a small backend defined here that counts what the executor asks of it and evaluates
   elementwise f32/f64 graphs itself, so that the expected values never come from the library. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

/* ===========================================================================================
   The counting backend
   =========================================================================================== */

typedef struct count_stats {
    int lowerings;          /* create_lowering_context calls */
    int lowering_frees;     /* release_lowering_context calls */
    int compiles;           /* compile calls */
    int executes;           /* execute calls */
    int releases;           /* release_computation calls */
    int placeholders;       /* create_placeholder calls */
    int scalars;            /* data_from_scalar calls */
    long live_payloads;     /* payloads made minus payloads released */
    size_t last_nodes;      /* the size of the last graph lowered */
    size_t last_params;     /* and its parameters */
    size_t last_results;    /* and its results */
    size_t last_args;       /* the arguments of the last execute */
    tb_status fail_compile; /* non-zero: compile fails with it */
    tb_status fail_execute; /* non-zero: execute fails with it */
    tb_op reject_op;        /* supports_node says no to this op (-1: none) */
    tb_op skew_op;          /* execute adds 1 to the values of this op (-1: none): a bug */
    unsigned compile_ms;    /* compile takes this long */
    int compiling;          /* 1 while compile runs (read by the logger's thread) */
} count_stats;

static count_stats cs;

/* the backend runs on several threads in test_threads */
#define BUMP(field, delta) __atomic_add_fetch(&cs.field, (delta), __ATOMIC_RELAXED)

/* A payload: the array in its dtype. */
typedef struct count_buf {
    size_t nbytes;
    unsigned char bytes[1];
} count_buf;

static count_buf *count_buf_new(size_t nbytes) {
    count_buf *b = (count_buf *)malloc(sizeof(count_buf) + nbytes);
    if (b != NULL) {
        b->nbytes = nbytes;
        BUMP(live_payloads, 1);
    }
    return b;
}

static size_t nbytes_of(const tb_shape *s) {
    size_t n = 0;
    assert_int_equal(tb_shape_nbytes(s, &n), TB_OK);
    return n;
}

static int64_t numel_of(const tb_shape *s) {
    int64_t n = 0;
    assert_int_equal(tb_shape_numel(s, &n), TB_OK);
    return n;
}

static double load_elem(const unsigned char *p, tb_dtype dt, int64_t i) {
    switch (dt) {
    case TB_F32: {
        float v;
        memcpy(&v, p + i * 4, 4);
        return v;
    }
    case TB_F64: {
        double v;
        memcpy(&v, p + i * 8, 8);
        return v;
    }
    case TB_I32: {
        int32_t v;
        memcpy(&v, p + i * 4, 4);
        return v;
    }
    case TB_I64: {
        int64_t v;
        memcpy(&v, p + i * 8, 8);
        return (double)v;
    }
    default:
        return p[i];
    }
}

static void store_elem(unsigned char *p, tb_dtype dt, int64_t i, double v) {
    switch (dt) {
    case TB_F32: {
        float f = (float)v;
        memcpy(p + i * 4, &f, 4);
        break;
    }
    case TB_F64:
        memcpy(p + i * 8, &v, 8);
        break;
    case TB_I32: {
        int32_t x = (int32_t)v;
        memcpy(p + i * 4, &x, 4);
        break;
    }
    case TB_I64: {
        int64_t x = (int64_t)v;
        memcpy(p + i * 8, &x, 8);
        break;
    }
    default:
        p[i] = (unsigned char)(v != 0);
        break;
    }
}

static tb_status count_from_host(void *u, tb_backend_data *d, const void *host) {
    size_t n = nbytes_of(&d->shape);
    count_buf *b = count_buf_new(n);
    (void)u;
    if (b == NULL) return tb_set_error(TB_ERR_OUT_OF_MEMORY, "count: out of memory");
    if (n > 0) memcpy(b->bytes, host, n);
    d->payload = b;
    return TB_OK;
}

static tb_status count_from_scalar(void *u, tb_backend_data *d, tb_scalar value) {
    count_buf *b = count_buf_new(8);
    (void)u;
    BUMP(scalars, 1);
    if (b == NULL) return tb_set_error(TB_ERR_OUT_OF_MEMORY, "count: out of memory");
    store_elem(b->bytes, d->shape.dtype, 0, tb_scalar_as_double(value));
    d->payload = b;
    return TB_OK;
}

static tb_status count_placeholder(void *u, tb_backend_data *d) {
    (void)u;
    (void)d;
    BUMP(placeholders, 1);
    return TB_OK;
}

static tb_status count_to_host(void *u, const tb_backend_data *d, void *host) {
    const count_buf *b = (const count_buf *)d->payload;
    (void)u;
    if (b->nbytes > 0) memcpy(host, b->bytes, b->nbytes);
    return TB_OK;
}

static void count_data_release(void *u, tb_backend_data *d) {
    (void)u;
    free(d->payload);
    BUMP(live_payloads, -1);
    d->payload = NULL;
}

static bool count_supports(void *u, const tb_node *node) {
    (void)u;
    return tb_node_op(node) != cs.reject_op;
}

/* A lowered graph: per node its kind, operand positions and shape. */
enum { K_PARAM = -1 };

typedef struct count_prog {
    size_t n;
    int *kind; /* K_PARAM or a TB_OP_* */
    size_t (*operand)[2];
    size_t *param; /* the parameter index of K_PARAM nodes */
    tb_shape *shape;
    size_t *results; /* positions of the results */
    size_t num_results;
    size_t num_params;
    char text[64];
} count_prog;

static void count_prog_free(count_prog *p) {
    if (p == NULL) return;
    free(p->kind);
    free(p->operand);
    free(p->param);
    free(p->shape);
    free(p->results);
    free(p);
}

/* node pointer -> position, open addressing */
typedef struct pos_map {
    const tb_node **keys;
    size_t *vals;
    size_t cap;
} pos_map;

static size_t pos_slot(const pos_map *m, const tb_node *k) {
    size_t i = (size_t)(((uintptr_t)k >> 4) * 2654435761u) & (m->cap - 1);
    while (m->keys[i] != NULL && m->keys[i] != k)
        i = (i + 1) & (m->cap - 1);
    return i;
}

static tb_status count_lower(void *u, const tb_graph *g, void **context) {
    count_prog *p = (count_prog *)calloc(1, sizeof(count_prog));
    pos_map m;
    size_t i;
    (void)u;
    BUMP(lowerings, 1);
    cs.last_nodes = g->num_nodes;
    cs.last_params = g->num_parameters;
    cs.last_results = g->num_results;
    *context = p;
    if (p == NULL) return tb_set_error(TB_ERR_OUT_OF_MEMORY, "count: out of memory");
    m.cap = 16;
    while (m.cap < 2 * (g->num_nodes + 1))
        m.cap *= 2;
    m.keys = (const tb_node **)calloc(m.cap, sizeof(*m.keys));
    m.vals = (size_t *)calloc(m.cap, sizeof(*m.vals));
    p->n = g->num_nodes;
    p->kind = (int *)calloc(p->n + 1, sizeof(int));
    p->operand = (size_t(*)[2])calloc(p->n + 1, sizeof(*p->operand));
    p->param = (size_t *)calloc(p->n + 1, sizeof(size_t));
    p->shape = (tb_shape *)calloc(p->n + 1, sizeof(tb_shape));
    p->results = (size_t *)calloc(g->num_results + 1, sizeof(size_t));
    p->num_results = g->num_results;
    p->num_params = g->num_parameters;
    assert_non_null(m.keys);
    assert_non_null(m.vals);
    for (i = 0; i < g->num_nodes; i++) {
        size_t s = pos_slot(&m, g->nodes[i]);
        m.keys[s] = g->nodes[i];
        m.vals[s] = i;
        p->kind[i] = tb_node_op(g->nodes[i]);
        p->shape[i] = *tb_node_shape(g->nodes[i]);
    }
    for (i = 0; i < g->num_parameters; i++) {
        size_t s = pos_slot(&m, g->parameters[i]);
        assert_true(m.keys[s] == g->parameters[i]); /* parameters are among the nodes */
        p->kind[m.vals[s]] = K_PARAM;
        p->param[m.vals[s]] = i;
    }
    for (i = 0; i < g->num_nodes; i++) {
        size_t k;
        if (p->kind[i] == K_PARAM) continue;
        if (p->kind[i] != TB_OP_ADD && p->kind[i] != TB_OP_SUB && p->kind[i] != TB_OP_MUL &&
            p->kind[i] != TB_OP_NEG) {
            tb_op op = p->kind[i];
            free(m.keys);
            free(m.vals);
            count_prog_free(p);
            *context = NULL;
            BUMP(lowering_frees, 1); /* nothing left to free */
            return tb_set_error(TB_ERR_COMPILE, "count: cannot lower %s", tb_op_name(op));
        }
        for (k = 0; k < tb_node_num_operands(g->nodes[i]) && k < 2; k++) {
            size_t s = pos_slot(&m, tb_node_operand(g->nodes[i], k));
            assert_true(m.keys[s] != NULL); /* operands come first */
            assert_true(m.vals[s] < i);
            p->operand[i][k] = m.vals[s];
        }
    }
    for (i = 0; i < g->num_results; i++) {
        size_t s = pos_slot(&m, g->results[i]);
        assert_true(m.keys[s] != NULL);
        p->results[i] = m.vals[s];
    }
    snprintf(p->text, sizeof(p->text), "count program: %lu nodes", (unsigned long)p->n);
    free(m.keys);
    free(m.vals);
    return TB_OK;
}

static void count_lower_free(void *u, void *context) {
    (void)u;
    BUMP(lowering_frees, 1);
    count_prog_free((count_prog *)context);
}

static tb_status count_compile(void *u, void *context, void **computation) {
    count_prog *p = (count_prog *)context;
    count_prog *q;
    (void)u;
    BUMP(compiles, 1);
    if (cs.fail_compile != TB_OK) return tb_set_error(cs.fail_compile, "count: compiler broke");
    if (cs.compile_ms > 0) {
        struct timespec ts;
        ts.tv_sec = (time_t)(cs.compile_ms / 1000);
        ts.tv_nsec = (long)(cs.compile_ms % 1000) * 1000000L;
        __atomic_store_n(&cs.compiling, 1, __ATOMIC_SEQ_CST);
        while (nanosleep(&ts, &ts) != 0) {
        }
        __atomic_store_n(&cs.compiling, 0, __ATOMIC_SEQ_CST);
    }
    /* the context is freed after compile: the computation takes the arrays over */
    q = (count_prog *)malloc(sizeof(count_prog));
    assert_non_null(q);
    *q = *p;
    memset(p, 0, sizeof(*p));
    *computation = q;
    return TB_OK;
}

static void count_release_computation(void *u, void *computation) {
    (void)u;
    BUMP(releases, 1);
    count_prog_free((count_prog *)computation);
}

static const char *count_text(void *u, const void *computation) {
    (void)u;
    return ((const count_prog *)computation)->text;
}

static tb_status count_execute(void *u, void *computation, tb_backend_data *const *args,
                               size_t num_args, tb_backend_data *const *results,
                               size_t num_results) {
    count_prog *p = (count_prog *)computation;
    double **v;
    size_t i;
    (void)u;
    BUMP(executes, 1);
    cs.last_args = num_args;
    if (cs.fail_execute != TB_OK) return tb_set_error(cs.fail_execute, "count: device lost");
    assert_int_equal(num_args, p->num_params);
    assert_int_equal(num_results, p->num_results);
    v = (double **)calloc(p->n + 1, sizeof(double *));
    assert_non_null(v);
    for (i = 0; i < p->n; i++) {
        int64_t n = numel_of(&p->shape[i]), e;
        v[i] = (double *)malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
        assert_non_null(v[i]);
        if (p->kind[i] == K_PARAM) {
            const count_buf *b = (const count_buf *)args[p->param[i]]->payload;
            assert_true(tb_shape_equal(&args[p->param[i]]->shape, &p->shape[i]));
            for (e = 0; e < n; e++)
                v[i][e] = load_elem(b->bytes, p->shape[i].dtype, e);
            continue;
        }
        for (e = 0; e < n; e++) {
            const double *a = v[p->operand[i][0]], *b = v[p->operand[i][1]];
            /* rank-0 operands broadcast */
            double x = a[p->shape[p->operand[i][0]].rank == 0 ? 0 : e];
            double y =
                p->kind[i] == TB_OP_NEG ? 0 : b[p->shape[p->operand[i][1]].rank == 0 ? 0 : e];
            double r = p->kind[i] == TB_OP_ADD   ? x + y
                       : p->kind[i] == TB_OP_SUB ? x - y
                       : p->kind[i] == TB_OP_MUL ? x * y
                                                 : -x;
            if (p->kind[i] == cs.skew_op) r += 1;
            /* round to the node's dtype at every step, as a real f32 kernel does */
            if (p->shape[i].dtype == TB_F32) r = (double)(float)r;
            v[i][e] = r;
        }
    }
    for (i = 0; i < num_results; i++) {
        size_t at = p->results[i];
        int64_t n = numel_of(&p->shape[at]), e;
        count_buf *b = count_buf_new(nbytes_of(&p->shape[at]));
        assert_non_null(b);
        assert_null(results[i]->payload);
        assert_true(tb_shape_equal(&results[i]->shape, &p->shape[at]));
        for (e = 0; e < n; e++)
            store_elem(b->bytes, p->shape[at].dtype, e, v[at][e]);
        results[i]->payload = b;
    }
    for (i = 0; i < p->n; i++)
        free(v[i]);
    free(v);
    return TB_OK;
}

static size_t count_devices(void *u, tb_device *out, size_t cap) {
    size_t i;
    (void)u;
    for (i = 0; i < 2 && i < cap; i++) {
        memset(&out[i], 0, sizeof(out[i]));
        out[i].type = TB_DEVICE_ACCELERATOR;
        out[i].ordinal = (int32_t)i;
    }
    return 2;
}

/* Every node that is not a parameter is computed by the one kernel of a count program. */
static int32_t count_node_kernel(void *u, const void *computation, size_t node_index,
                                 const char **kernel_name) {
    const count_prog *p = (const count_prog *)computation;
    (void)u;
    if (node_index >= p->n || p->kind[node_index] == K_PARAM) return -1;
    *kernel_name = "count_kernel";
    return 0;
}

static void count_register_impl(const char *name, bool node_kernels) {
    tb_backend_impl impl;
    memset(&impl, 0, sizeof(impl));
    impl.supports_node = count_supports;
    impl.data_from_host = count_from_host;
    impl.data_from_scalar = count_from_scalar;
    impl.create_placeholder = count_placeholder;
    impl.data_to_host = count_to_host;
    impl.data_release = count_data_release;
    impl.create_lowering_context = count_lower;
    impl.release_lowering_context = count_lower_free;
    impl.compile = count_compile;
    impl.execute = count_execute;
    impl.release_computation = count_release_computation;
    impl.computation_backend_text = count_text;
    impl.get_backend_devices = count_devices;
    if (node_kernels) impl.get_node_kernel = count_node_kernel;
    assert_int_equal(tb_backend_register(name, &impl, "debug"), TB_OK);
}

static void count_register(void) {
    count_register_impl("count", false);
}

/* ===========================================================================================
   Fixtures and helpers
   =========================================================================================== */

static tb_device dev0, dev1;

/* Sets the library up with `desc` (NULL: defaults), registers "count", and makes count:0 the
   current device. */
static void start(const tb_desc *desc) {
    tb_desc d;
    tb_shutdown(); /* a failed test may have left the library set up */
    memset(&cs, 0, sizeof(cs));
    cs.reject_op = -1;
    cs.skew_op = -1;
    tb__exec_hash_mask = ~(uint64_t)0; /* a failed test may have left it cleared */
    if (desc == NULL) {
        memset(&d, 0, sizeof(d));
        desc = &d;
    }
    assert_int_equal(tb_setup(desc), TB_OK);
    count_register();
    assert_int_equal(tb_device_make("count", 0, &dev0), TB_OK);
    assert_int_equal(tb_device_make("count", 1, &dev1), TB_OK);
    assert_int_equal(tb_set_backend("count"), TB_OK);
    tb_clear_error();
}

/* Everything the backend made was given back, once the library shut down. */
static void stop(void) {
    tb_shutdown();
    assert_int_equal(cs.live_payloads, 0);
    assert_int_equal(cs.lowering_frees, cs.lowerings);
}

static tb_tensor *vec(const float *values, int64_t n, const tb_device *device) {
    tb_shape s = tb_shape_of(TB_F32, 1, n);
    return tb_tensor_from_host(values, &s, device);
}

static void read_vec(tb_tensor *t, float *out, int64_t n) {
    assert_int_equal(tb_tensor_to_host(t, out, (size_t)n * sizeof(float)), TB_OK);
}

static void assert_error(tb_status got, tb_status want, const char *needle) {
    assert_int_equal(got, want);
    assert_int_equal(tb_last_status(), want);
    if (strstr(tb_last_error(), needle) == NULL) {
        fail_msg("error '%s' does not contain '%s'", tb_last_error(), needle);
    }
}

static void assert_contains(const char *text, const char *needle) {
    assert_non_null(text);
    if (strstr(text, needle) == NULL) fail_msg("'%s' does not contain '%s'", text, needle);
}

static size_t count_params(const char *text) {
    size_t n = 0;
    for (; (text = strstr(text, "(param ")) != NULL; text++)
        n++;
    return n;
}

static size_t count_lines(const char *text) {
    size_t n = 0;
    for (; *text != '\0'; text++)
        n += *text == '\n';
    return n;
}

/* ===========================================================================================
   Recording and syncing
   =========================================================================================== */

static void test_recording_does_not_compute(void **state) {
    const float xs[3] = {1, 2, 3};
    float out[3];
    tb_tensor *x, *y, *z;
    (void)state;
    start(NULL);
    x = vec(xs, 3, NULL);
    y = tb_add(x, x);
    z = tb_mul(y, x);
    assert_non_null(z);
    assert_int_equal(cs.lowerings + cs.compiles + cs.executes, 0);
    assert_non_null(tb_tensor_node(z));
    assert_null(tb_tensor_node(x)); /* data, nothing pending */
    {
        tb_device d = tb_tensor_device(z);
        assert_true(tb_device_equal(&d, &dev0));
    }
    assert_int_equal(tb_sync(&z, 1), TB_OK);
    assert_int_equal(cs.executes, 1);
    assert_null(tb_tensor_node(z));
    assert_non_null(tb_tensor_node(y)); /* not synced: still pending */
    read_vec(z, out, 3);
    assert_int_equal(cs.executes, 1); /* reading a materialised value runs nothing */
    assert_true(out[0] == 2.0f && out[1] == 8.0f && out[2] == 18.0f);
    /* syncing again is free */
    assert_int_equal(tb_sync(&z, 1), TB_OK);
    assert_int_equal(cs.executes, 1);
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(z);
    stop();
}

static void test_reading_syncs(void **state) {
    const float xs[1] = {2.5f};
    double item = 0;
    float out[1];
    tb_tensor *x, *y, *z;
    tb_backend_data *d;
    (void)state;
    start(NULL);
    x = vec(xs, 1, NULL);
    y = tb_add(x, x);
    z = tb_neg(x);
    assert_int_equal(tb_tensor_item(y, &item), TB_OK);
    assert_true(item == 5.0);
    assert_int_equal(cs.executes, 1);
    read_vec(z, out, 1);
    assert_true(out[0] == -2.5f);
    assert_int_equal(cs.executes, 2);
    tb_tensor_release(z);
    z = tb_sub(y, x);
    d = tb_tensor_data(z);
    assert_non_null(d);
    assert_int_equal(cs.executes, 3);
    assert_true(tb_device_equal(&d->device, &dev0));
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(z);
    stop();
}

/* Several tensors sync as one graph with one result per distinct node. */
static void test_sync_many(void **state) {
    const float xs[2] = {1, 2}, ys[2] = {10, 20};
    float a_out[2], b_out[2];
    tb_tensor *x, *y, *a, *b, *list[4];
    (void)state;
    start(NULL);
    x = vec(xs, 2, NULL);
    y = vec(ys, 2, NULL);
    a = tb_add(x, y);
    b = tb_mul(a, y);
    list[0] = a;
    list[1] = b;
    list[2] = a; /* listed twice */
    list[3] = x; /* nothing pending */
    assert_int_equal(tb_sync(list, 4), TB_OK);
    assert_int_equal(cs.executes, 1);
    assert_int_equal(cs.last_results, 2);
    assert_int_equal(cs.last_params, 2);
    assert_int_equal(cs.last_nodes, 4);
    read_vec(a, a_out, 2);
    read_vec(b, b_out, 2);
    assert_true(a_out[0] == 11 && a_out[1] == 22);
    assert_true(b_out[0] == 110 && b_out[1] == 440);
    assert_int_equal(tb_sync(NULL, 0), TB_OK);
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(a);
    tb_tensor_release(b);
    stop();
}

/* A node synced through one tensor is not computed again for a graph recorded on it earlier. */
static void test_synced_value_is_reused(void **state) {
    const float xs[2] = {1, 2};
    float out[2];
    tb_tensor *x, *y, *z;
    char *text;
    (void)state;
    start(NULL);
    x = vec(xs, 2, NULL);
    y = tb_add(x, x);
    z = tb_mul(y, y);
    assert_int_equal(tb_sync(&y, 1), TB_OK);
    text = tb_ir_text(&z, 1);
    assert_non_null(text);
    assert_int_equal(count_lines(text), 2); /* y's value and the mul: no add any more */
    tb_free(text);
    read_vec(z, out, 2);
    assert_int_equal(cs.last_nodes, 2);
    assert_true(out[0] == 4 && out[1] == 16);
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(z);
    stop();
}

/* ===========================================================================================
   The computation cache
   =========================================================================================== */

static void test_cache_same_graph_new_values(void **state) {
    int step;
    (void)state;
    start(NULL);
    for (step = 0; step < 5; step++) {
        float xs[3], out[3];
        int i;
        tb_tensor *x, *y, *z;
        for (i = 0; i < 3; i++)
            xs[i] = (float)(step * 10 + i);
        x = vec(xs, 3, NULL);
        y = tb_mul_scalar(x, (double)step); /* a new scalar value each step */
        z = tb_add_scalar(y, 0.5 * step);
        read_vec(z, out, 3);
        for (i = 0; i < 3; i++)
            assert_true(out[i] == xs[i] * (float)step + 0.5f * (float)step);
        tb_tensor_release(x);
        tb_tensor_release(y);
        tb_tensor_release(z);
    }
    assert_int_equal(tb_metrics_counter("UncachedCompile"), 1);
    assert_int_equal(tb_metrics_counter("CachedCompile"), 4);
    assert_int_equal(cs.compiles, 1);
    assert_int_equal(cs.executes, 5);
    assert_int_equal(tb_computation_cache_size(), 1);
    assert_int_equal(tb_metrics_counter("CompileTime"), 1);
    assert_int_equal(tb_metrics_counter("ExecuteTime"), 5);
    stop();
}

static void test_cache_new_shape_compiles(void **state) {
    const float xs[4] = {1, 2, 3, 4};
    tb_tensor *a, *b, *c, *d;
    (void)state;
    start(NULL);
    a = vec(xs, 3, NULL);
    b = vec(xs, 4, NULL);
    c = tb_add(a, a);
    d = tb_add(b, b);
    assert_int_equal(tb_sync(&c, 1), TB_OK);
    assert_int_equal(tb_sync(&d, 1), TB_OK);
    assert_int_equal(cs.compiles, 2);
    assert_int_equal(tb_metrics_counter("UncachedCompile"), 2);
    assert_int_equal(tb_computation_cache_size(), 2);
    tb_tensor_release(a);
    tb_tensor_release(b);
    tb_tensor_release(c);
    tb_tensor_release(d);
    stop();
}

/* x + x and x + y have the same ops and shapes but are different computations. */
static void test_cache_distinguishes_operands(void **state) {
    const float xs[2] = {1, 2}, ys[2] = {30, 40};
    float out[2];
    tb_tensor *x, *y, *xx, *xy, *yy;
    (void)state;
    start(NULL);
    x = vec(xs, 2, NULL);
    y = vec(ys, 2, NULL);
    xx = tb_add(x, x);
    xy = tb_add(x, y);
    read_vec(xx, out, 2);
    assert_true(out[0] == 2 && out[1] == 4);
    read_vec(xy, out, 2);
    assert_true(out[0] == 31 && out[1] == 42);
    assert_int_equal(cs.compiles, 2);
    assert_int_equal(tb_metrics_counter("UncachedCompile"), 2);
    /* y + y is x + x again */
    yy = tb_add(y, y);
    read_vec(yy, out, 2);
    assert_true(out[0] == 60 && out[1] == 80);
    assert_int_equal(cs.compiles, 2);
    assert_int_equal(tb_metrics_counter("CachedCompile"), 1);
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(xx);
    tb_tensor_release(xy);
    tb_tensor_release(yy);
    stop();
}

/* A graph whose hash equals a cached graph's hash is still a computation of its own: a hit is
   confirmed by the graph's structure. The hook keeps no bit of the hash, so every graph
   collides with every other. */
static void test_cache_hash_collision(void **state) {
    const float xs[2] = {1, 2}, ys[2] = {30, 40};
    float out[2];
    tb_tensor *x, *y, *sum, *prod, *again;
    (void)state;
    start(NULL);
    tb__exec_hash_mask = 0;
    x = vec(xs, 2, NULL);
    y = vec(ys, 2, NULL);
    sum = tb_add(x, y);
    prod = tb_mul(x, y);
    read_vec(sum, out, 2);
    assert_true(out[0] == 31 && out[1] == 42);
    read_vec(prod, out, 2); /* same hash, same shapes, another op */
    assert_true(out[0] == 30 && out[1] == 80);
    assert_int_equal(cs.compiles, 2);
    assert_int_equal(tb_metrics_counter("UncachedCompile"), 2);
    assert_int_equal(tb_metrics_counter("GraphHashCollision"), 1);
    assert_int_equal(tb_computation_cache_size(), 2);
    /* the same structure again is a hit, whichever of the colliding entries it is */
    again = tb_mul(y, x);
    read_vec(again, out, 2);
    assert_true(out[0] == 30 && out[1] == 80);
    assert_int_equal(cs.compiles, 2);
    assert_int_equal(tb_metrics_counter("CachedCompile"), 1);
    tb__exec_hash_mask = ~(uint64_t)0;
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(sum);
    tb_tensor_release(prod);
    tb_tensor_release(again);
    stop();
}

/* Graphs over different devices are different computations. */
static void test_cache_per_device(void **state) {
    const float xs[2] = {1, 2};
    tb_tensor *a, *b, *c, *d;
    (void)state;
    start(NULL);
    a = vec(xs, 2, &dev0);
    b = vec(xs, 2, &dev1);
    c = tb_add(a, a);
    d = tb_add(b, b);
    assert_int_equal(tb_sync(&c, 1), TB_OK);
    assert_int_equal(tb_sync(&d, 1), TB_OK);
    assert_int_equal(cs.compiles, 2);
    assert_true(tb_device_equal(&tb_tensor_data(d)->device, &dev1));
    tb_tensor_release(a);
    tb_tensor_release(b);
    tb_tensor_release(c);
    tb_tensor_release(d);
    stop();
}

static void sync_sum_of_size(int64_t n) {
    const float xs[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    tb_tensor *a = vec(xs, n, NULL), *b = tb_add(a, a);
    assert_int_equal(tb_sync(&b, 1), TB_OK);
    tb_tensor_release(a);
    tb_tensor_release(b);
}

static void test_cache_lru_eviction(void **state) {
    tb_desc desc;
    (void)state;
    memset(&desc, 0, sizeof(desc));
    desc.cache_size = 2;
    start(&desc);
    sync_sum_of_size(1);
    sync_sum_of_size(2);
    assert_int_equal(cs.releases, 0);
    sync_sum_of_size(3); /* evicts size 1 */
    assert_int_equal(cs.compiles, 3);
    assert_int_equal(cs.releases, 1);
    assert_int_equal(tb_computation_cache_size(), 2);
    sync_sum_of_size(3); /* a hit, now the most recent */
    sync_sum_of_size(2); /* a hit */
    assert_int_equal(cs.compiles, 3);
    sync_sum_of_size(1); /* compiled again; evicts size 3, the least recently used */
    assert_int_equal(cs.compiles, 4);
    assert_int_equal(cs.releases, 2);
    sync_sum_of_size(2);
    assert_int_equal(cs.compiles, 4);
    sync_sum_of_size(3);
    assert_int_equal(cs.compiles, 5);
    assert_int_equal(cs.releases, 3);
    tb_computation_cache_clear();
    assert_int_equal(tb_computation_cache_size(), 0);
    assert_int_equal(cs.releases, 5);
    assert_int_equal(cs.lowering_frees, cs.lowerings);
    stop();
    assert_int_equal(cs.releases, 5);
}

/* tb_shutdown releases the cached computations through their backend. */
static void test_shutdown_releases_computations(void **state) {
    (void)state;
    start(NULL);
    sync_sum_of_size(1);
    sync_sum_of_size(2);
    assert_int_equal(cs.releases, 0);
    stop();
    assert_int_equal(cs.releases, 2);
}

/* ===========================================================================================
   Mark step, deep graphs, the automatic flush
   =========================================================================================== */

static void test_mark_step(void **state) {
    const float xs[2] = {1, 2};
    float out[2];
    tb_tensor *x, *a, *b, *c, *d, *e;
    (void)state;
    start(NULL);
    assert_int_equal(tb_mark_step(), TB_OK); /* an empty step */
    assert_int_equal(cs.executes, 0);
    x = vec(xs, 2, NULL);
    a = tb_add(x, x);
    b = tb_mul(x, x);
    c = tb_sub(a, b);
    d = vec(xs, 2, &dev1);
    e = tb_neg(d);
    assert_int_equal(tb_mark_step(), TB_OK);
    assert_int_equal(cs.executes, 2); /* one graph per device */
    assert_null(tb_tensor_node(a));
    assert_null(tb_tensor_node(b));
    assert_null(tb_tensor_node(c));
    assert_null(tb_tensor_node(e));
    assert_int_equal(tb_metrics_counter("MarkStep"), 2);
    read_vec(c, out, 2);
    assert_true(out[0] == 1 && out[1] == 0);
    read_vec(e, out, 2);
    assert_true(out[0] == -1 && out[1] == -2);
    assert_int_equal(cs.executes, 2);
    tb_tensor_release(x);
    tb_tensor_release(a);
    tb_tensor_release(b);
    tb_tensor_release(c);
    tb_tensor_release(d);
    tb_tensor_release(e);
    /* released tensors are not synced any more */
    assert_int_equal(tb_mark_step(), TB_OK);
    assert_int_equal(cs.executes, 2);
    stop();
}

/* 200,000 chained adds: the walk, the release and the backend see one long chain. */
static void deep_chain(const char *backend, int n) {
    const float one = 1.0f;
    float out = 0;
    tb_device device;
    tb_tensor *x, *y;
    int i;
    assert_int_equal(tb_device_make(backend, 0, &device), TB_OK);
    x = vec(&one, 1, &device);
    y = tb_tensor_retain(x);
    for (i = 0; i < n; i++) {
        tb_tensor *next = tb_add(y, x);
        assert_non_null(next);
        tb_tensor_release(y);
        y = next;
    }
    read_vec(y, &out, 1);
    assert_true(out == (float)(n + 1));
    tb_tensor_release(x);
    tb_tensor_release(y);
}

static void test_deep_graph(void **state) {
    tb_desc desc;
    (void)state;
    memset(&desc, 0, sizeof(desc));
    desc.max_graph_nodes = 1000000;
    start(&desc);
    deep_chain("count", 200000);
    assert_int_equal(cs.executes, 1);
    assert_int_equal(cs.last_nodes, 200001); /* the adds and x */
    deep_chain("cpu", 200000);
    stop();
}

static void test_max_graph_nodes_flush(void **state) {
    tb_desc desc;
    const float one = 1.0f;
    float out = 0;
    tb_tensor *x, *y;
    int i;
    (void)state;
    memset(&desc, 0, sizeof(desc));
    desc.max_graph_nodes = 10;
    start(&desc);
    x = vec(&one, 1, NULL);
    y = tb_tensor_retain(x);
    for (i = 0; i < 50; i++) {
        tb_tensor *next = tb_add(y, x);
        char *text;
        assert_non_null(next);
        tb_tensor_release(y);
        y = next;
        text = tb_ir_text(&y, 1);
        assert_non_null(text);
        /* no pending graph computes more than the limit */
        assert_true(count_lines(text) - count_params(text) <= 10);
        tb_free(text);
    }
    assert_int_equal(cs.executes, 4); /* after 11, 22, 33 and 44 adds */
    read_vec(y, &out, 1);
    assert_true(out == 51.0f);
    tb_tensor_release(x);
    tb_tensor_release(y);
    stop();
}

/* Shared subgraphs count once: x = x + x forty times is a graph of 41 nodes, not 2^40. */
static void test_flush_counts_shared_nodes_once(void **state) {
    tb_desc desc;
    const float one = 1.0f;
    float out = 0;
    tb_tensor *y;
    int i;
    (void)state;
    memset(&desc, 0, sizeof(desc));
    desc.max_graph_nodes = 100;
    start(&desc);
    y = vec(&one, 1, NULL);
    for (i = 0; i < 40; i++) {
        tb_tensor *next = tb_add(y, y);
        tb_tensor_release(y);
        y = next;
    }
    assert_int_equal(cs.executes, 0);
    /* the span of the adds' ids bounds the graph at 40: it was never counted */
    assert_int_equal(tb_metrics_counter("FlushCountWalks"), 0);
    read_vec(y, &out, 1);
    assert_true(out == ldexpf(1.0f, 40));
    assert_int_equal(cs.executes, 1);
    tb_tensor_release(y);
    stop();
}

/* A graph that is older than many nodes made since (its id span is large) and reuses its values
   (its operand sum is large too) is counted; the count lowers the bounds of every node it
   passed, so later ops on those nodes are not counted again. */
static void test_flush_count_lowers_bounds(void **state) {
    tb_desc desc;
    const float one = 1.0f;
    float out = 0;
    tb_tensor *x, *h[13], *other;
    int64_t walks;
    int i;
    (void)state;
    memset(&desc, 0, sizeof(desc));
    desc.max_graph_nodes = 100;
    start(&desc);
    x = vec(&one, 1, NULL);
    h[0] = tb_add(x, x); /* pending: 2 (one computed node) */
    other = tb_tensor_retain(x);
    for (i = 0; i < 300; i++) { /* 300 nodes of another graph, synced as it goes */
        tb_tensor *next = tb_add(other, x);
        assert_non_null(next);
        tb_tensor_release(other);
        other = next;
        if (i % 20 == 19) assert_int_equal(tb_sync(&other, 1), TB_OK);
    }
    assert_int_equal(tb_metrics_counter("FlushCountWalks"), 0);
    /* h[i] = h[i-1] + h[i-1]: the operand sums double; counted where they pass 100 (at h[6],
       then h[10], each count lowering what it passed) */
    for (i = 1; i < 13; i++)
        assert_non_null(h[i] = tb_add(h[i - 1], h[i - 1]));
    walks = tb_metrics_counter("FlushCountWalks");
    assert_int_equal(walks, 2);
    assert_int_equal(cs.executes, 15); /* the other graph's syncs only: 13 nodes, far below */
    for (i = 0; i < 13; i++) {         /* each h[i] was passed by a count: no walk reading it */
        tb_tensor *s = tb_add(h[i], h[12]);
        assert_non_null(s);
        read_vec(s, &out, 1);
        assert_true(out == ldexpf(1.0f, i + 1) + ldexpf(1.0f, 13));
        tb_tensor_release(s);
    }
    assert_int_equal(tb_metrics_counter("FlushCountWalks"), walks);
    read_vec(other, &out, 1);
    assert_true(out == 301.0f);
    for (i = 0; i < 13; i++)
        tb_tensor_release(h[i]);
    tb_tensor_release(other);
    tb_tensor_release(x);
    stop();
}

/* ===========================================================================================
   The eager fallback
   =========================================================================================== */

static void test_eager_fallback(void **state) {
    const float xs[3] = {1, -2, 3}, ys[3] = {10, 20, 30};
    float out[3];
    tb_tensor *x, *y, *s, *n, *z, *w;
    int i;
    char *text;
    (void)state;
    start(NULL);
    cs.reject_op = TB_OP_NEG;
    x = vec(xs, 3, NULL);
    y = vec(ys, 3, NULL);
    s = tb_add(x, y);
    n = tb_neg(s);
    z = tb_mul(n, x);
    /* the backend text is the graph the sync will compile, and nothing runs for it */
    text = tb_ir_backend_text(&z, 1);
    assert_non_null(text);
    assert_string_equal(text, "count program: 3 nodes"); /* neg's value, x, the mul */
    tb_free(text);
    assert_int_equal(cs.executes, 0);
    read_vec(z, out, 3);
    for (i = 0; i < 3; i++)
        assert_true(out[i] == -(xs[i] + ys[i]) * xs[i]);
    assert_int_equal(tb_metrics_counter("Fallback::neg"), 1);
    /* the operands' graph, then the main graph, which was compiled for the text already */
    assert_int_equal(cs.executes, 2);
    assert_int_equal(tb_metrics_counter("CachedCompile"), 1);
    /* a root that falls back */
    w = tb_neg(y);
    read_vec(w, out, 3);
    for (i = 0; i < 3; i++)
        assert_true(out[i] == -ys[i]);
    assert_int_equal(tb_metrics_counter("Fallback::neg"), 2);
    assert_int_equal(cs.executes, 2);
    /* the value computed apart is a parameter of later graphs */
    tb_tensor_release(z);
    z = tb_add(n, n);
    text = tb_ir_text(&z, 1);
    assert_string_equal(text, "%0 = neg f32[3] (param 0, computed apart)\n"
                              "%1 = add(%0, %0) f32[3] (result 0)\n");
    tb_free(text);
    /* an unsupported op with a scalar operand, on top of a pending graph */
    cs.reject_op = TB_OP_MUL;
    tb_tensor_release(w);
    w = tb_mul_scalar(s, 3.0);
    read_vec(w, out, 3);
    for (i = 0; i < 3; i++)
        assert_true(out[i] == (xs[i] + ys[i]) * 3.0f);
    assert_int_equal(tb_metrics_counter("Fallback::mul"), 1);
    text = tb_metrics_report();
    assert_contains(text, "Counter: Fallback::neg\n  Value: 2\n");
    tb_free(text);
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(s);
    tb_tensor_release(n);
    tb_tensor_release(z);
    tb_tensor_release(w);
    stop();
}

/* ===========================================================================================
   Metrics and dumps
   =========================================================================================== */

static void test_metrics_report(void **state) {
    char *report;
    const char *a, *b;
    int i;
    (void)state;
    start(NULL);
    sync_sum_of_size(2);
    sync_sum_of_size(2);
    assert_int_equal(tb_mark_step(), TB_OK);
    tb_metrics_sample("ZedTime", 1250.0);
    tb_metrics_sample("ZedTime", 2500000.0);
    tb_metrics_sample("ZedSize", 3);
    tb_metrics_add("AaaCounter", 7);
    report = tb_metrics_report();
    assert_non_null(report);
    assert_contains(report, "Metric: CompileTime\n  TotalSamples: 1\n  Accumulator: ");
    assert_contains(report, "Metric: ExecuteTime\n  TotalSamples: 2\n");
    assert_contains(report, "Metric: TensorsGraphSize\n  TotalSamples: 2\n  Accumulator: 4\n"
                            "  Mean: 2\n  Min: 2\n  Max: 2\n");
    assert_contains(report, "Metric: ZedTime\n  TotalSamples: 2\n  Accumulator: 2.501ms\n"
                            "  Mean: 1.251ms\n  Min: 1.250us\n  Max: 2.500ms\n  Percentiles: ");
    assert_contains(report, "  Max: 2.500ms\n  Percentiles: 1%=1.250us; 5%=1.250us; 10%=1.250us; "
                            "20%=1.250us; 50%=2.500ms; 80%=2.500ms; 90%=2.500ms; 95%=2.500ms; "
                            "99%=2.500ms\n");
    assert_contains(report, "Metric: ZedSize\n  TotalSamples: 1\n  Accumulator: 3\n");
    assert_contains(report, "Counter: UncachedCompile\n  Value: 1\n");
    assert_contains(report, "Counter: CachedCompile\n  Value: 1\n");
    assert_contains(report, "Counter: MarkStep\n  Value: 1\n");
    assert_contains(report, "Counter: AaaCounter\n  Value: 7\n");
    /* metrics first, then counters, each sorted by name */
    a = strstr(report, "Counter: AaaCounter");
    b = strstr(report, "Counter: CachedCompile");
    assert_true(a != NULL && b != NULL && a < b);
    a = strstr(report, "Metric: ZedTime");
    assert_true(a != NULL && a < strstr(report, "Counter: "));
    assert_true(strstr(report, "Metric: CompileTime") < strstr(report, "Metric: ExecuteTime"));
    tb_free(report);
    assert_true(tb_metrics_total("ZedTime") == 2501250.0);
    assert_int_equal(tb_metrics_counter("ZedTime"), 2);
    assert_int_equal(tb_metrics_counter("AaaCounter"), 7);
    assert_int_equal(tb_metrics_counter("NeverFired"), 0);
    assert_true(tb_metrics_total("NeverFired") == 0.0);
    /* the percentiles cover the latest 64 samples; the rest covers all of them */
    for (i = 1; i <= 100; i++)
        tb_metrics_sample("Window", (double)i);
    report = tb_metrics_report();
    assert_contains(report, "Metric: Window\n  TotalSamples: 100\n  Accumulator: 5050\n"
                            "  Mean: 50.5\n  Min: 1\n  Max: 100\n  Percentiles: 1%=38; ");
    assert_contains(report, "; 95%=97; 99%=99\n");
    tb_free(report);
    tb_metrics_reset();
    assert_int_equal(tb_metrics_counter("AaaCounter"), 0);
    report = tb_metrics_report();
    assert_string_equal(report, "");
    tb_free(report);
    /* bad names */
    tb_clear_error();
    tb_metrics_add(NULL, 1);
    assert_error(tb_last_status(), TB_ERR_INVALID_ARGUMENT, "tb_metrics_add: name is NULL");
    tb_metrics_sample("", 1);
    assert_error(tb_last_status(), TB_ERR_INVALID_ARGUMENT, "tb_metrics_sample");
    tb_metrics_sample("X", NAN);
    assert_error(tb_last_status(), TB_ERR_INVALID_ARGUMENT, "NaN");
    assert_int_equal(tb_metrics_counter(NULL), 0);
    assert_error(tb_last_status(), TB_ERR_INVALID_ARGUMENT, "tb_metrics_counter: name is NULL");
    stop();
}

static void test_ir_text_and_dot(void **state) {
    const float xs[6] = {1, 2, 3, 4, 5, 6};
    tb_shape s = tb_shape_of(TB_F32, 2, 2, 3);
    tb_tensor *x, *y, *z, *list[2];
    char *text;
    (void)state;
    start(NULL);
    x = tb_tensor_from_host(xs, &s, NULL);
    y = tb_add(x, x);
    z = tb_mul_scalar(y, 2.0);
    text = tb_ir_text(&y, 1);
    assert_string_equal(text, "%0 = device_data f32[2,3] (param 0)\n"
                              "%1 = add(%0, %0) f32[2,3] (result 0)\n");
    tb_free(text);
    list[0] = z;
    list[1] = y;
    text = tb_ir_text(list, 2);
    assert_contains(text, "%0 = device_data f32[2,3] (param 0)\n"
                          "%1 = add(%0, %0) f32[2,3] (result 1)\n");
    assert_contains(text, " (param 1, value 2)\n");
    assert_contains(text, "%3 = mul(%1, %2) f32[2,3] (result 0)\n");
    assert_int_equal(count_lines(text), 4);
    tb_free(text);
    text = tb_ir_dot(&y, 1);
    assert_contains(text, "digraph tb {\n");
    assert_contains(text, "n0 [label=\"%0 device_data\\nf32[2,3]\\nparam 0\"");
    assert_contains(text, "n1 [label=\"%1 add\\nf32[2,3]\\nresult 0\"");
    assert_non_null(strstr(strstr(text, "  n0 -> n1;\n") + 1, "  n0 -> n1;\n")); /* twice */
    assert_contains(text, "}\n");
    tb_free(text);
    /* a node that several tensors share carries each mark */
    list[0] = y;
    list[1] = y;
    text = tb_ir_text(list, 2);
    assert_contains(text, "%1 = add(%0, %0) f32[2,3] (result 0) (result 1)\n");
    tb_free(text);
    text = tb_ir_dot(list, 2);
    assert_contains(text, "\\nresult 0\\nresult 1\"");
    tb_free(text);
    /* a materialised tensor is its data */
    text = tb_ir_text(&x, 1);
    assert_string_equal(text, "%0 = device_data f32[2,3] (param 0) (result 0)\n");
    tb_free(text);
    text = tb_ir_text(NULL, 0);
    assert_string_equal(text, "");
    tb_free(text);
    /* the backend's text compiles (cached) and runs nothing */
    text = tb_ir_backend_text(&z, 1);
    assert_string_equal(text, "count program: 4 nodes");
    tb_free(text);
    assert_int_equal(cs.compiles, 1);
    assert_int_equal(cs.executes, 0);
    assert_int_equal(tb_sync(&z, 1), TB_OK);
    assert_int_equal(cs.compiles, 1);
    assert_int_equal(tb_metrics_counter("CachedCompile"), 1);
    text = tb_ir_backend_text(&x, 1); /* nothing to compute */
    assert_string_equal(text, "");
    tb_free(text);
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(z);
    stop();
}

static char log_text[8192];

static void log_hook(tb_log_level level, const char *message, void *user_data) {
    size_t used = strlen(log_text);
    (void)user_data;
    snprintf(log_text + used, sizeof(log_text) - used, "%d|%s\n", (int)level, message);
}

/* TB_DEBUG 1: one line per graph run; 3: also the IR before compiling. */
static void test_debug_log(void **state) {
    tb_desc desc;
    const char *line;
    unsigned long long hash;
    unsigned long nodes, params, results;
    char cache[8];
    (void)state;
    memset(&desc, 0, sizeof(desc));
    desc.debug = 1;
    desc.logger.func = log_hook;
    log_text[0] = '\0';
    start(&desc);
    sync_sum_of_size(2);
    sync_sum_of_size(2);
    line = strstr(log_text, "|graph ");
    assert_non_null(line);
    assert_int_equal(sscanf(line,
                            "|graph %16llx nodes=%lu params=%lu results=%lu device=count:0 "
                            "cache=%4s",
                            &hash, &nodes, &params, &results, cache),
                     5);
    assert_int_equal(nodes, 2);
    assert_int_equal(params, 1);
    assert_int_equal(results, 1);
    assert_string_equal(cache, "miss");
    assert_contains(line, " compile=");
    assert_contains(line, "ms run=");
    assert_contains(strstr(line + 1, "|graph "), "cache=hit");
    assert_null(strstr(log_text, "IR:"));
    stop();

    desc.debug = 3;
    log_text[0] = '\0';
    start(&desc);
    sync_sum_of_size(2);
    assert_contains(log_text, " IR:\n%0 = device_data f32[2] (param 0)\n%1 = add(%0, %0) f32[2] "
                              "(result 0)\n");
    stop();
}

/* A compile that a dump starts (tb_ir_backend_text here) is counted and logged like the compile
   of a run, so that the run's "cache=hit compile=0.000ms" has its compile in the log. */
static void test_dump_compile_logged_and_counted(void **state) {
    const float xs[3] = {1, 2, 3};
    tb_desc desc;
    tb_tensor *x, *y, *z;
    const char *line;
    char *text;
    (void)state;
    memset(&desc, 0, sizeof(desc));
    desc.debug = 1;
    desc.logger.func = log_hook;
    log_text[0] = '\0';
    start(&desc);
    x = vec(xs, 3, NULL);
    y = tb_add(x, x);
    z = tb_mul(y, x);
    text = tb_ir_backend_text(&z, 1);
    assert_non_null(text);
    tb_free(text);
    assert_int_equal(tb_metrics_counter("UncachedCompile"), 1);
    assert_int_equal(tb_metrics_counter("CompileTime"), 1); /* one sample */
    line = strstr(log_text, "|graph ");
    assert_non_null(line);
    assert_contains(line, " nodes=3 params=1 results=1 device=count:0 cache=miss compile=");
    assert_contains(line, "ms (compiled by tb_ir_backend_text, not run)\n");
    assert_int_equal(tb_sync(&z, 1), TB_OK);
    assert_int_equal(tb_metrics_counter("CachedCompile"), 1);
    assert_contains(strstr(line + 1, "|graph "), "cache=hit compile=0.000ms run=");
    tb_tensor_release(z);
    tb_tensor_release(y);
    tb_tensor_release(x);
    stop();
}

/* tb_ir_dot compiles the graph when the backend names the kernels of its nodes (to draw them
   as clusters): that compile is counted and logged too, and the sync after it is a cache hit. */
static void test_dot_compile_logged_and_counted(void **state) {
    const float xs[3] = {1, 2, 3};
    float out[3];
    tb_desc desc;
    tb_device dev;
    tb_tensor *x, *y, *z;
    const char *line;
    char *text;
    (void)state;
    memset(&desc, 0, sizeof(desc));
    desc.debug = 1;
    desc.logger.func = log_hook;
    log_text[0] = '\0';
    start(&desc);
    count_register_impl("countk", true);
    assert_int_equal(tb_device_make("countk", 0, &dev), TB_OK);
    x = vec(xs, 3, &dev);
    y = tb_add(x, x);
    z = tb_mul(y, x);
    text = tb_ir_dot(&z, 1);
    assert_non_null(text);
    assert_contains(text, "subgraph cluster_0 {");
    assert_contains(text, "count_kernel");
    tb_free(text);
    assert_int_equal(cs.compiles, 1);
    assert_int_equal(cs.executes, 0);
    assert_int_equal(tb_metrics_counter("UncachedCompile"), 1);
    assert_int_equal(tb_metrics_counter("CompileTime"), 1); /* one sample */
    line = strstr(log_text, "|graph ");
    assert_non_null(line);
    assert_contains(line, " nodes=3 params=1 results=1 device=countk:0 cache=miss compile=");
    assert_contains(line, "ms (compiled by tb_ir_dot, not run)\n");
    /* the same dump again compiles nothing and logs nothing */
    text = tb_ir_dot(&z, 1);
    assert_non_null(text);
    tb_free(text);
    assert_int_equal(cs.compiles, 1);
    assert_null(strstr(line + 1, "|graph "));
    read_vec(z, out, 3);
    assert_true(out[0] == 2.0f && out[1] == 8.0f && out[2] == 18.0f);
    assert_int_equal(cs.compiles, 1);
    assert_int_equal(tb_metrics_counter("UncachedCompile"), 1);
    assert_int_equal(tb_metrics_counter("CachedCompile"), 2);
    assert_contains(strstr(line + 1, "|graph "), "cache=hit compile=0.000ms run=");
    tb_tensor_release(z);
    tb_tensor_release(y);
    tb_tensor_release(x);
    stop();
}

/* TB_DEBUG=1: a compile that takes over a second says so while it still runs, before the
   graph's own line; a quick compile does not. */
static char slow_log[4096];
static int notice_while_compiling = -1;

static void slow_log_hook(tb_log_level level, const char *message, void *user_data) {
    size_t used = strlen(slow_log);
    (void)user_data;
    if (strstr(message, ": compiling ") != NULL) {
        notice_while_compiling = __atomic_load_n(&cs.compiling, __ATOMIC_SEQ_CST);
    }
    snprintf(slow_log + used, sizeof(slow_log) - used, "%d|%s\n", (int)level, message);
}

static void test_slow_compile_notice(void **state) {
    const float xs[3] = {1, 2, 3};
    char expected[128];
    tb_desc desc;
    tb_tensor *x, *y, *z;
    const char *notice, *line;
    (void)state;
    memset(&desc, 0, sizeof(desc));
    desc.debug = 1;
    desc.logger.func = slow_log_hook;
    slow_log[0] = '\0';
    start(&desc);
    x = vec(xs, 3, NULL);
    y = tb_add(x, x); /* quick: no notice */
    assert_int_equal(tb_sync(&y, 1), TB_OK);
    assert_null(strstr(slow_log, ": compiling "));
    cs.compile_ms = 1500;
    z = tb_mul(y, x);
    assert_int_equal(tb_sync(&z, 1), TB_OK);
    cs.compile_ms = 0;
    notice = strstr(slow_log, ": compiling ");
    assert_non_null(notice);
    assert_int_equal(notice_while_compiling, 1);
    assert_contains(notice, ": compiling 3 nodes on count:0 ... (still running after 1 s)\n");
    line = strstr(slow_log, "cache=miss");
    assert_non_null(line);
    line = strstr(line + 1, "cache=miss"); /* the slow graph's own line, after the notice */
    assert_non_null(line);
    assert_true(line > notice);
    /* the notice names the graph that the line then reports */
    assert_true(notice - slow_log >= 18);
    snprintf(expected, sizeof expected, "|graph %.16s nodes=3", notice - 16);
    assert_contains(slow_log, expected);
    tb_tensor_release(z);
    tb_tensor_release(y);
    tb_tensor_release(x);
    stop();

    /* TB_CHECK compiles the graph once more, on its own: a slow one says so too */
    desc.check = 1;
    slow_log[0] = '\0';
    notice_while_compiling = -1;
    start(&desc);
    x = vec(xs, 3, NULL);
    y = tb_neg(x);
    cs.compile_ms = 1100;
    assert_int_equal(tb_sync(&y, 1), TB_OK);
    cs.compile_ms = 0;
    assert_int_equal(tb_metrics_counter("CheckedGraphs"), 1);
    notice = strstr(slow_log, ": compiling 2 nodes on count:0 ... (still running after 1 s)\n");
    assert_non_null(notice);
    assert_contains(notice + 1,
                    ": TB_CHECK: compiling 2 nodes on count:0 ... (still running after 1 s)\n");
    assert_int_equal(notice_while_compiling, 1);
    tb_tensor_release(y);
    tb_tensor_release(x);
    stop();
}

/* TB_CHECK 1 reports the first node whose value differs from the reference; 2 also fails the
   sync with that report, and keeps nothing of the failed results. */
static void test_check_levels(void **state) {
    const float xs[3] = {1, 2, 3};
    float out[3];
    tb_desc desc;
    tb_tensor *x, *y, *z;
    int i;
    (void)state;
    memset(&desc, 0, sizeof(desc));
    desc.logger.func = log_hook;
    desc.check = 1;
    log_text[0] = '\0';
    start(&desc);
    cs.skew_op = TB_OP_MUL;
    x = vec(xs, 3, NULL);
    y = tb_mul(x, x);
    z = tb_add(y, x);
    read_vec(z, out, 3); /* the backend's values, reported but not refused */
    assert_true(out[0] == 3.0f);
    assert_int_equal(tb_metrics_counter("CheckMismatch"), 1);
    assert_contains(log_text, "1|TB_CHECK: graph ");
    assert_contains(log_text, ": node %1 mul f32[3] (node 0 of 2 in post-order) differs at "
                              "element 0: count:0 gives 2, the reference gives 1\n");
    tb_tensor_release(z);
    tb_tensor_release(y);
    tb_tensor_release(x);
    stop();

    desc.check = 2;
    log_text[0] = '\0';
    start(&desc);
    cs.skew_op = TB_OP_MUL;
    x = vec(xs, 3, NULL);
    y = tb_mul(x, x);
    z = tb_add(y, x);
    assert_error(tb_tensor_to_host(z, out, sizeof out), TB_ERR_EXECUTE,
                 ": node %1 mul f32[3] (node 0 of 2 in post-order) differs at element 0: count:0 "
                 "gives 2, the reference gives 1");
    assert_true(strncmp(tb_last_error(), "tb_tensor_to_host: TB_CHECK: graph ", 35) == 0);
    assert_contains(log_text, "1|TB_CHECK: graph "); /* reported as at level 1 too */
    assert_error(tb_sync(&z, 1), TB_ERR_EXECUTE, "differs at element 0");
    /* the graph agrees once the bug is gone: the same sync succeeds */
    cs.skew_op = -1;
    read_vec(z, out, 3);
    for (i = 0; i < 3; i++)
        assert_true(out[i] == xs[i] * xs[i] + xs[i]);
    assert_int_equal(tb_metrics_counter("CheckedGraphs"), 1);
    tb_tensor_release(z);
    tb_tensor_release(y);
    tb_tensor_release(x);
    stop();
}

/* The same graph on the cpu backend: the real reference backend computes it. */
static void test_cpu_backend_values(void **state) {
    const float xs[3] = {1, 2, 3}, ys[3] = {0.5f, -1, 4};
    float out[3];
    tb_device cpu;
    tb_tensor *x, *y, *x2, *xx, *xy;
    char *text;
    int i;
    (void)state;
    start(NULL);
    assert_int_equal(tb_device_make("cpu", 0, &cpu), TB_OK);
    x = vec(xs, 3, &cpu);
    y = vec(ys, 3, &cpu);
    x2 = tb_add(x, x);
    xx = tb_mul(x2, y);
    xy = tb_add(x, y);
    read_vec(xy, out, 3);
    for (i = 0; i < 3; i++)
        assert_true(out[i] == xs[i] + ys[i]);
    read_vec(xx, out, 3);
    for (i = 0; i < 3; i++)
        assert_true(out[i] == (xs[i] + xs[i]) * ys[i]);
    text = tb_ir_backend_text(&xy, 1);
    assert_non_null(text);
    tb_free(text);
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(x2);
    tb_tensor_release(xx);
    tb_tensor_release(xy);
    stop();
}

/* An allocator hook that refuses the call numbered fail_at (counted from 0 at arming). */
static long hook_calls, hook_fail_at = -1, hook_refused, hook_big;
static size_t hook_big_min; /* allocations of at least this many bytes are counted in hook_big */

static void *hook_alloc(size_t size, void *user_data) {
    long call = __atomic_fetch_add(&hook_calls, 1, __ATOMIC_RELAXED);
    (void)user_data;
    if (hook_big_min > 0 && size >= hook_big_min)
        __atomic_add_fetch(&hook_big, 1, __ATOMIC_RELAXED);
    if (call == __atomic_load_n(&hook_fail_at, __ATOMIC_RELAXED)) {
        __atomic_add_fetch(&hook_refused, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    return malloc(size);
}

static void hook_free(void *ptr, void *user_data) {
    (void)user_data;
    free(ptr);
}

static void hook_arm(long fail_at) {
    __atomic_store_n(&hook_fail_at, -1, __ATOMIC_RELAXED);
    __atomic_store_n(&hook_calls, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&hook_refused, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&hook_fail_at, fail_at, __ATOMIC_RELAXED);
}

/* One dump of exp(x) * x + x on the cpu backend in a new session, with the allocation numbered
   fail_at refused (-1: none); *refused tells whether one was. */
static char *dump_with_failure(int which, long fail_at, bool *refused) {
    const float xs[3] = {1, 2, 3};
    tb_desc desc;
    tb_device cpu;
    tb_tensor *x, *e, *m, *y;
    char *text = NULL;
    tb_shutdown();
    memset(&desc, 0, sizeof(desc));
    desc.allocator.alloc = hook_alloc;
    desc.allocator.free = hook_free;
    hook_arm(-1);
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb_device_make("cpu", 0, &cpu), TB_OK);
    x = vec(xs, 3, &cpu);
    e = tb_exp(x);
    m = tb_mul(e, x);
    y = tb_add(m, x);
    assert_non_null(y);
    tb_clear_error();
    hook_arm(fail_at);
    if (which == 0) text = tb_ir_text(&y, 1);
    if (which == 1) text = tb_ir_dot(&y, 1);
    if (which == 2) text = tb_ir_backend_text(&y, 1);
    *refused = __atomic_load_n(&hook_refused, __ATOMIC_RELAXED) != 0;
    hook_arm(-1);
    if (text == NULL) {
        if (tb_last_status() == TB_OK) fail_msg("dump %d: NULL without an error", which);
    } else if (tb_last_status() != TB_OK) {
        fail_msg("dump %d, allocation %ld refused: a text and the error '%s'", which, fail_at,
                 tb_last_error());
    }
    tb_tensor_release(x);
    tb_tensor_release(e);
    tb_tensor_release(m);
    tb_tensor_release(y);
    return text;
}

/* Under a failed allocation anywhere, a dump is either complete or NULL with an error; never a
   short text with TB_OK (tb_ir_backend_text used to give "" when the backend's text could not
   be made). */
static void test_dumps_under_allocation_failures(void **state) {
    int which;
    (void)state;
    for (which = 0; which < 3; which++) {
        bool refused;
        char *expected = dump_with_failure(which, -1, &refused);
        long k;
        assert_non_null(expected);
        assert_true(strlen(expected) > 0);
        for (k = 0;; k++) {
            char *text = dump_with_failure(which, k, &refused);
            if (text != NULL && strcmp(text, expected) != 0) {
                fail_msg("dump %d, allocation %ld refused: TB_OK with '%s' instead of '%s'", which,
                         k, text, expected);
            }
            tb_free(text);
            if (!refused) break; /* past the last allocation */
        }
        assert_true(k > 1);
        tb_free(expected);
    }
    tb_shutdown();
}

/* ===========================================================================================
   Moving between devices
   =========================================================================================== */

static void test_to_device(void **state) {
    const float xs[2] = {3, 4};
    float out[2];
    tb_device cpu;
    tb_tensor *x, *y, *on_cpu, *same;
    (void)state;
    start(NULL);
    assert_int_equal(tb_device_make("cpu", 0, &cpu), TB_OK);
    x = vec(xs, 2, NULL);
    y = tb_add(x, x);
    on_cpu = tb_to_device(y, &cpu);
    assert_non_null(on_cpu);
    {
        tb_device d = tb_tensor_device(on_cpu);
        assert_true(tb_device_equal(&d, &cpu));
    }
    read_vec(on_cpu, out, 2);
    assert_true(out[0] == 6 && out[1] == 8);
    same = tb_to_device(y, NULL); /* the current device: the same data, a new handle */
    assert_non_null(same);
    assert_true(same != y);
    assert_true(tb_tensor_data(same) == tb_tensor_data(y));
    {
        /* the same value twice is one parameter */
        tb_tensor *sum = tb_add(same, y);
        char *text = tb_ir_text(&sum, 1);
        assert_string_equal(text, "%0 = device_data f32[2] (param 0)\n"
                                  "%1 = add(%0, %0) f32[2] (result 0)\n");
        tb_free(text);
        read_vec(sum, out, 2);
        assert_true(out[0] == 12 && out[1] == 16);
        tb_tensor_release(sum);
    }
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(on_cpu);
    tb_tensor_release(same);
    stop();
}

/* A copy between devices goes through a host array the library keeps: the second copy of the
   same size allocates one large array fewer than the first (only the destination's). */
static void test_to_device_keeps_staging(void **state) {
    const int64_t n = (int64_t)1 << 20;
    tb_shape s = tb_shape_of(TB_F32, 1, n);
    tb_desc desc;
    tb_device cpu;
    tb_tensor *x, *a, *b;
    float *h = (float *)malloc((size_t)n * sizeof(float)), *back;
    long first, second;
    int64_t i;
    (void)state;
    assert_non_null(h);
    for (i = 0; i < n; i++)
        h[i] = (float)(i % 1000) * 0.5f;
    memset(&desc, 0, sizeof desc);
    desc.allocator.alloc = hook_alloc;
    desc.allocator.free = hook_free;
    hook_arm(-1);
    start(&desc);
    assert_int_equal(tb_device_make("cpu", 0, &cpu), TB_OK);
    x = tb_tensor_from_host(h, &s, &dev0);
    assert_non_null(x);
    __atomic_store_n(&hook_big, 0, __ATOMIC_RELAXED);
    hook_big_min = (size_t)n * sizeof(float);
    a = tb_to_device(x, &cpu);
    assert_non_null(a);
    first = __atomic_exchange_n(&hook_big, 0, __ATOMIC_RELAXED);
    b = tb_to_device(x, &cpu);
    assert_non_null(b);
    second = __atomic_exchange_n(&hook_big, 0, __ATOMIC_RELAXED);
    hook_big_min = 0;
    assert_true(first >= 1);
    assert_int_equal(second, first - 1);
    back = (float *)malloc((size_t)n * sizeof(float));
    assert_non_null(back);
    assert_int_equal(tb_tensor_to_host(b, back, (size_t)n * sizeof(float)), TB_OK);
    assert_memory_equal(back, h, (size_t)n * sizeof(float));
    free(back);
    free(h);
    tb_tensor_release(x);
    tb_tensor_release(a);
    tb_tensor_release(b);
    stop();
}

static void test_borrowed_host_memory(void **state) {
    float xs[2] = {1, 2}, out[2];
    tb_device cpu;
    tb_shape s = tb_shape_of(TB_F32, 1, 2);
    tb_tensor *a, *b;
    (void)state;
    start(NULL);
    assert_int_equal(tb_device_make("cpu", 0, &cpu), TB_OK);
    a = tb_tensor_from_host_borrowed(xs, &s, &cpu);
    b = tb_tensor_from_host_borrowed(xs, &s, &dev0); /* count cannot borrow: a copy */
    assert_non_null(a);
    assert_non_null(b);
    xs[0] = 100; /* the cpu tensor sees it, the copy does not */
    read_vec(a, out, 2);
    assert_true(out[0] == 100 && out[1] == 2);
    read_vec(b, out, 2);
    assert_true(out[0] == 1 && out[1] == 2);
    tb_tensor_release(a);
    tb_tensor_release(b);
    stop();
}

/* ===========================================================================================
   Errors
   =========================================================================================== */

static void test_errors_arguments(void **state) {
    const float xs[6] = {1, 2, 3, 4, 5, 6};
    float out[6];
    double item;
    tb_shape s = tb_shape_of(TB_F32, 2, 2, 3);
    tb_tensor *x, *y, *list[2];
    tb_device bad;
    (void)state;
    start(NULL);
    x = tb_tensor_from_host(xs, &s, NULL);
    y = tb_add(x, x);

    assert_error(tb_sync(NULL, 1), TB_ERR_INVALID_ARGUMENT, "tb_sync: tensors is NULL");
    tb_clear_error();
    list[0] = y;
    list[1] = NULL;
    assert_error(tb_sync(list, 2), TB_ERR_INVALID_ARGUMENT, "tb_sync: tensors[1] is NULL");
    assert_non_null(tb_tensor_node(y)); /* nothing ran */
    assert_int_equal(cs.executes, 0);

    tb_clear_error();
    assert_error(tb_tensor_to_host(y, out, 10), TB_ERR_INVALID_ARGUMENT,
                 "tb_tensor_to_host: size is 10 bytes but f32[2,3] needs 24");
    assert_non_null(tb_tensor_node(y));
    assert_error(tb_tensor_to_host(y, NULL, 24), TB_ERR_INVALID_ARGUMENT,
                 "tb_tensor_to_host: dst is NULL");
    tb_clear_error();
    assert_error(tb_tensor_to_host(NULL, out, 24), TB_ERR_INVALID_ARGUMENT,
                 "tb_tensor_to_host: tensor is NULL");
    assert_error(tb_tensor_item(y, &item), TB_ERR_SHAPE,
                 "tb_tensor_item: f32[2,3] has 6 elements, not 1");
    assert_error(tb_tensor_item(y, NULL), TB_ERR_INVALID_ARGUMENT, "tb_tensor_item: out is NULL");

    /* a NULL tensor keeps the first error of a chain */
    tb_set_error(TB_ERR_SHAPE, "tb_add: shapes f32[2,3] and f32[4] do not broadcast");
    assert_int_equal(tb_tensor_to_host(NULL, out, 24), TB_ERR_INVALID_ARGUMENT);
    assert_null(tb_to_device(NULL, NULL));
    assert_null(tb_tensor_data(NULL));
    assert_int_equal(tb_tensor_item(NULL, &item), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_add: shapes f32[2,3] and f32[4] do not broadcast");
    tb_clear_error();
    assert_null(tb_to_device(NULL, NULL));
    assert_contains(tb_last_error(), "tb_to_device: tensor is NULL");

    /* creation */
    tb_clear_error();
    assert_null(tb_tensor_from_host(NULL, &s, NULL));
    assert_error(tb_last_status(), TB_ERR_INVALID_ARGUMENT,
                 "tb_tensor_from_host: data is NULL for f32[2,3] (24 bytes)");
    assert_null(tb_tensor_from_host(xs, NULL, NULL));
    assert_error(tb_last_status(), TB_ERR_INVALID_ARGUMENT, "tb_tensor_from_host: shape is NULL");
    memset(&bad, 0, sizeof(bad));
    strcpy(bad.backend, "count");
    bad.ordinal = 7;
    assert_null(tb_tensor_from_host(xs, &s, &bad));
    assert_int_not_equal(tb_last_status(), TB_OK);
    assert_contains(tb_last_error(), "7");
    strcpy(bad.backend, "nosuch");
    bad.ordinal = 0;
    assert_null(tb_tensor_from_host_borrowed(xs, &s, &bad));
    assert_contains(tb_last_error(), "nosuch");
    memset(bad.backend, 'a', sizeof(bad.backend)); /* not terminated */
    assert_null(tb_to_device(x, &bad));
    assert_error(tb_last_status(), TB_ERR_INVALID_ARGUMENT, "NUL-terminated");

    /* dumps */
    assert_null(tb_ir_text(NULL, 1));
    assert_error(tb_last_status(), TB_ERR_INVALID_ARGUMENT, "tb_ir_text: tensors is NULL");
    tb_clear_error();
    assert_null(tb_ir_dot(list, 2));
    assert_error(tb_last_status(), TB_ERR_INVALID_ARGUMENT, "tb_ir_dot: tensors[1] is NULL");
    assert_null(tb_ir_backend_text(list, 2));

    assert_int_equal(cs.executes, 0);
    read_vec(y, out, 6); /* still fine after all that */
    assert_true(out[5] == 12);
    tb_tensor_release(x);
    tb_tensor_release(y);
    stop();
}

static void test_errors_mixed_devices(void **state) {
    const float xs[2] = {1, 2};
    tb_tensor *a, *b, *c, *d, *list[2];
    char *text;
    (void)state;
    start(NULL);
    a = vec(xs, 2, &dev0);
    b = vec(xs, 2, &dev1);
    c = tb_add(a, a);
    d = tb_add(b, b);
    list[0] = c;
    list[1] = d;
    assert_error(tb_sync(list, 2), TB_ERR_INVALID_ARGUMENT,
                 "tb_sync: tensors on count:0 and count:1");
    assert_non_null(tb_tensor_node(c));
    assert_non_null(tb_tensor_node(d));
    assert_int_equal(cs.executes, 0);
    text = tb_ir_text(list, 2); /* a dump may show graphs of several devices */
    assert_non_null(text);
    assert_int_equal(count_lines(text), 4);
    tb_free(text);
    assert_null(tb_ir_backend_text(list, 2));
    assert_error(tb_last_status(), TB_ERR_INVALID_ARGUMENT,
                 "tb_ir_backend_text: tensors on count:0 and count:1");
    assert_contains(tb_last_error(), "count:1");
    /* one device at a time works */
    assert_int_equal(tb_sync(list, 1), TB_OK);
    assert_int_equal(tb_sync(list + 1, 1), TB_OK);
    text = tb_ir_text(list, 1);
    assert_string_equal(text, "%0 = device_data f32[2] (param 0) (result 0)\n");
    tb_free(text);
    tb_tensor_release(a);
    tb_tensor_release(b);
    tb_tensor_release(c);
    tb_tensor_release(d);
    stop();
}

/* A backend that fails: the error names the function and gives the backend's reason; the
   tensors keep their graphs; nothing is cached or leaked; a later sync works. */
static void test_errors_backend_failures(void **state) {
    const float xs[2] = {1, 2};
    float out[2];
    tb_tensor *x, *y, *e;
    (void)state;
    start(NULL);
    x = vec(xs, 2, NULL);
    y = tb_add(x, x);
    cs.fail_compile = TB_ERR_COMPILE;
    assert_error(tb_sync(&y, 1), TB_ERR_COMPILE,
                 "tb_sync: backend 'count': compile: count: compiler broke");
    assert_non_null(tb_tensor_node(y));
    assert_int_equal(tb_computation_cache_size(), 0);
    assert_int_equal(cs.lowering_frees, cs.lowerings);
    assert_error(tb_tensor_to_host(y, out, sizeof(out)), TB_ERR_COMPILE, "tb_tensor_to_host: ");
    cs.fail_compile = TB_OK;
    /* an op the backend claims but cannot lower */
    e = tb_exp(x);
    assert_error(tb_sync(&e, 1), TB_ERR_COMPILE,
                 "tb_sync: backend 'count': create_lowering_context: count: cannot lower exp");
    assert_non_null(tb_tensor_node(e));
    tb_tensor_release(e);
    cs.fail_execute = TB_ERR_EXECUTE;
    assert_error(tb_sync(&y, 1), TB_ERR_EXECUTE,
                 "tb_sync: backend 'count': execute: count: device lost");
    assert_non_null(tb_tensor_node(y));
    assert_int_equal(tb_computation_cache_size(), 1); /* compiled fine, kept */
    assert_int_equal(cs.live_payloads, 1);            /* only x's: no result leaked */
    assert_error(tb_mark_step(), TB_ERR_EXECUTE, "tb_mark_step: ");
    cs.fail_execute = TB_OK;
    read_vec(y, out, 2);
    assert_true(out[0] == 2 && out[1] == 4);
    assert_int_equal(tb_metrics_counter("UncachedCompile"), 1);
    tb_tensor_release(x);
    tb_tensor_release(y);
    stop();
}

/* A successful sync leaves the caller's earlier error alone. */
static void test_success_keeps_error(void **state) {
    const float xs[2] = {1, 2};
    tb_tensor *x, *y;
    (void)state;
    start(NULL);
    x = vec(xs, 2, NULL);
    y = tb_add(x, x);
    tb_set_error(TB_ERR_SHAPE, "earlier");
    assert_int_equal(tb_sync(&y, 1), TB_OK);
    assert_string_equal(tb_last_error(), "earlier");
    tb_tensor_release(x);
    tb_tensor_release(y);
    stop();
}

/* ===========================================================================================
   Threads
   =========================================================================================== */

static void *thread_body(void *arg) {
    int i;
    (void)arg;
    for (i = 0; i < 50; i++) {
        float xs[4] = {1, 2, 3, 4}, out[4];
        tb_tensor *x = vec(xs, 4, NULL), *y = tb_mul(x, x), *z = tb_add(y, x);
        if (tb_tensor_to_host(z, out, sizeof(out)) != TB_OK || out[3] != 20.0f) return arg;
        tb_tensor_release(x);
        tb_tensor_release(y);
        tb_tensor_release(z);
    }
    return NULL;
}

static void test_threads(void **state) {
    pthread_t th[4];
    int i;
    (void)state;
    start(NULL);
    for (i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, thread_body, NULL), 0);
    for (i = 0; i < 4; i++) {
        void *r = &th[i];
        assert_int_equal(pthread_join(th[i], &r), 0);
        assert_null(r);
    }
    assert_int_equal(tb_computation_cache_size(), 1);
    assert_int_equal(tb_metrics_counter("ExecuteTime"), 200);
    stop();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recording_does_not_compute),
        cmocka_unit_test(test_reading_syncs),
        cmocka_unit_test(test_sync_many),
        cmocka_unit_test(test_synced_value_is_reused),
        cmocka_unit_test(test_cache_same_graph_new_values),
        cmocka_unit_test(test_cache_new_shape_compiles),
        cmocka_unit_test(test_cache_distinguishes_operands),
        cmocka_unit_test(test_cache_hash_collision),
        cmocka_unit_test(test_cache_per_device),
        cmocka_unit_test(test_cache_lru_eviction),
        cmocka_unit_test(test_shutdown_releases_computations),
        cmocka_unit_test(test_mark_step),
        cmocka_unit_test(test_deep_graph),
        cmocka_unit_test(test_max_graph_nodes_flush),
        cmocka_unit_test(test_flush_counts_shared_nodes_once),
        cmocka_unit_test(test_flush_count_lowers_bounds),
        cmocka_unit_test(test_eager_fallback),
        cmocka_unit_test(test_metrics_report),
        cmocka_unit_test(test_ir_text_and_dot),
        cmocka_unit_test(test_debug_log),
        cmocka_unit_test(test_dump_compile_logged_and_counted),
        cmocka_unit_test(test_dot_compile_logged_and_counted),
        cmocka_unit_test(test_check_levels),
        cmocka_unit_test(test_slow_compile_notice),
        cmocka_unit_test(test_cpu_backend_values),
        cmocka_unit_test(test_dumps_under_allocation_failures),
        cmocka_unit_test(test_to_device),
        cmocka_unit_test(test_to_device_keeps_staging),
        cmocka_unit_test(test_borrowed_host_memory),
        cmocka_unit_test(test_errors_arguments),
        cmocka_unit_test(test_errors_mixed_devices),
        cmocka_unit_test(test_errors_backend_failures),
        cmocka_unit_test(test_success_keeps_error),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
