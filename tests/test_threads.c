/* Eight threads use the library at once: graphs on the cpu backend and on both OpenCL devices
   (the same graph shapes in several threads, so that they share cached computations, which
   another thread drops from the cache meanwhile, as it trims the OpenCL buffer cache; one
   recorded function that two threads call at once, syncing the output their graphs share), the
   registry (registering, looking up and listing backends and custom ops), metrics (counters,
   samples, reports), DLPack (exports whose deleters run on another thread, imports whose
   buffers are released on another thread), and each thread's own errors. Every value is checked
   against plain C. tools/test.sh runs it under the address sanitizer with the other tests and,
   in a step of its own, built with clang -fsanitize=thread (PoCL's own races suppressed by
   tools/tsan.supp, never the library's). */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 8

static int g_rounds = 100;
static bool g_have_opencl;
static size_t g_opencl_devices;

/* A failure inside a thread: recorded (cmocka's assertions are for the main thread). */
static pthread_mutex_t g_fail_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_failure[1024];
static int g_failures;

static void thread_fail(const char *fmt, ...) {
    va_list ap;
    pthread_mutex_lock(&g_fail_lock);
    if (g_failures++ == 0) {
        va_start(ap, fmt);
        vsnprintf(g_failure, sizeof g_failure, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&g_fail_lock);
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            thread_fail(__VA_ARGS__);                                                              \
            return false;                                                                          \
        }                                                                                          \
    } while (0)

/* ---- a hand-off queue: what one thread makes, another frees ---- */

#define QUEUE_CAP 256

typedef struct handoff {
    int kind; /* 0: a DLPack export (deleter), 1: a versioned export, 2: a tensor (release) */
    void *item;
} handoff;

static pthread_mutex_t g_queue_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_queue_cond = PTHREAD_COND_INITIALIZER;
static handoff g_queue[QUEUE_CAP];
static size_t g_queue_head, g_queue_count;
static int g_producers_left;

static void queue_push(int kind, void *item) {
    pthread_mutex_lock(&g_queue_lock);
    while (g_queue_count == QUEUE_CAP)
        pthread_cond_wait(&g_queue_cond, &g_queue_lock);
    g_queue[(g_queue_head + g_queue_count) % QUEUE_CAP].kind = kind;
    g_queue[(g_queue_head + g_queue_count) % QUEUE_CAP].item = item;
    g_queue_count++;
    pthread_cond_broadcast(&g_queue_cond);
    pthread_mutex_unlock(&g_queue_lock);
}

/* false when every producer is done and the queue is empty */
static bool queue_pop(handoff *out) {
    pthread_mutex_lock(&g_queue_lock);
    while (g_queue_count == 0 && g_producers_left > 0)
        pthread_cond_wait(&g_queue_cond, &g_queue_lock);
    if (g_queue_count == 0) {
        pthread_mutex_unlock(&g_queue_lock);
        return false;
    }
    *out = g_queue[g_queue_head];
    g_queue_head = (g_queue_head + 1) % QUEUE_CAP;
    g_queue_count--;
    pthread_cond_broadcast(&g_queue_cond);
    pthread_mutex_unlock(&g_queue_lock);
    return true;
}

static void producer_done(void) {
    pthread_mutex_lock(&g_queue_lock);
    g_producers_left--;
    pthread_cond_broadcast(&g_queue_cond);
    pthread_mutex_unlock(&g_queue_lock);
}

/* ---- DLPack imports: a producer whose deleter may run on any thread ---- */

static long g_imports, g_import_deleters;

typedef struct producer {
    tb_dl_managed_tensor managed;
    int64_t shape[1];
    float data[16];
} producer;

static void producer_deleter(tb_dl_managed_tensor *self) {
    __atomic_add_fetch(&g_import_deleters, 1, __ATOMIC_SEQ_CST);
    free(self->manager_ctx);
}

static producer *producer_new(float base) {
    producer *p = (producer *)calloc(1, sizeof *p);
    int i;
    if (p == NULL) abort();
    for (i = 0; i < 16; i++)
        p->data[i] = base + (float)i;
    p->shape[0] = 16;
    p->managed.dl_tensor.data = p->data;
    p->managed.dl_tensor.device.device_type = TB_DL_CPU;
    p->managed.dl_tensor.ndim = 1;
    p->managed.dl_tensor.dtype.code = TB_DL_FLOAT;
    p->managed.dl_tensor.dtype.bits = 32;
    p->managed.dl_tensor.dtype.lanes = 1;
    p->managed.dl_tensor.shape = p->shape;
    p->managed.manager_ctx = p;
    p->managed.deleter = producer_deleter;
    __atomic_add_fetch(&g_imports, 1, __ATOMIC_SEQ_CST);
    return p;
}

/* ---- the graph every compute thread runs: y = sum(relu(x * a + b) * x, axis 1), z = x^T x ---- */

#define ROWS 12
#define COLS 7

static void host_inputs(int thread, int round, float *x) {
    int i;
    for (i = 0; i < ROWS * COLS; i++)
        x[i] = (float)(((i * 7 + thread * 3 + round) % 17) - 8) * 0.25f;
}

/* The graph of run_graph with a = 0.5 and b = 0 on the cpu, recorded once as a function that
   the cpu threads call at once on odd rounds (NULL until the threads start). */
static tb_function *g_fn;

/* y = sum(relu(x * a + b) * x, 1) and z = x^T x; the intermediates into tmp[0..5] */
static void record_graph(tb_tensor *tx, double a, double b, tb_tensor **ty, tb_tensor **tz,
                         tb_tensor **tmp) {
    int32_t axis = 1;
    tmp[0] = tb_mul_scalar(tx, a);
    tmp[1] = tb_add_scalar(tmp[0], b);
    tmp[2] = tb_relu(tmp[1]);
    tmp[3] = tb_mul(tmp[2], tx);
    *ty = tb_sum(tmp[3], &axis, 1, false);
    tmp[4] = tb_transpose(tx, 0, 1);
    *tz = tb_matmul(tmp[4], tx);
    tmp[5] = NULL;
}

static bool run_graph(int thread, int round, const tb_device *dev) {
    float x[ROWS * COLS], y[ROWS], want_y[ROWS], z[COLS * COLS], want_z[COLS * COLS];
    double a = 0.5 + 0.125 * (round % 4), b = -0.25 * (thread % 3);
    tb_shape s = tb_shape_of(TB_F32, 2, ROWS, COLS);
    tb_tensor *tx, *tmp[6] = {NULL, NULL, NULL, NULL, NULL, NULL}, *ty = NULL, *tz = NULL, *pair[2];
    bool by_fn = g_fn != NULL && round % 2 == 1 && strcmp(dev->backend, "cpu") == 0, ok = true;
    int r, c, k, i;
    if (by_fn) {
        a = 0.5;
        b = 0.0;
    }
    host_inputs(thread, round, x);
    for (r = 0; r < ROWS; r++) {
        float acc = 0;
        for (c = 0; c < COLS; c++) {
            float v = x[r * COLS + c] * (float)a + (float)b;
            acc += (v > 0 ? v : 0) * x[r * COLS + c];
        }
        want_y[r] = acc;
    }
    for (r = 0; r < COLS; r++) {
        for (c = 0; c < COLS; c++) {
            float acc = 0;
            for (k = 0; k < ROWS; k++)
                acc += x[k * COLS + r] * x[k * COLS + c];
            want_z[r * COLS + c] = acc;
        }
    }
    tx = tb_tensor_from_host(x, &s, dev);
    if (!by_fn) {
        record_graph(tx, a, b, &ty, &tz, tmp);
    } else if (tx != NULL) {
        /* the third output reads no input: every call's graph shares its exp and sum */
        tb_tensor *outs[3];
        float shared = 0;
        if (tb_function_call(g_fn, &tx, 1, outs, 3) == TB_OK) {
            ty = outs[0];
            tz = outs[1];
            tmp[5] = outs[2];
            if (tb_sync(&tmp[5], 1) != TB_OK ||
                tb_tensor_to_host(tmp[5], &shared, sizeof shared) != TB_OK) {
                thread_fail("thread %d round %d: the shared output: %s", thread, round,
                            tb_last_error());
                ok = false;
            } else if (fabsf(shared - 4 * expf(0.5f)) > 1e-5f) {
                thread_fail("thread %d round %d: the shared output is %g", thread, round,
                            (double)shared);
                ok = false;
            }
        }
    }
    pair[0] = ty;
    pair[1] = tz;
    if (ty == NULL || tz == NULL || tb_sync(pair, 2) != TB_OK ||
        tb_tensor_to_host(ty, y, sizeof y) != TB_OK ||
        tb_tensor_to_host(tz, z, sizeof z) != TB_OK) {
        thread_fail("thread %d round %d on %s: %s", thread, round, dev->backend, tb_last_error());
        ok = false;
    }
    for (r = 0; ok && r < ROWS; r++) {
        if (fabsf(y[r] - want_y[r]) > 1e-4f * (1 + fabsf(want_y[r]))) {
            thread_fail("thread %d round %d on %s: y[%d] = %g, not %g", thread, round, dev->backend,
                        r, (double)y[r], (double)want_y[r]);
            ok = false;
        }
    }
    for (r = 0; ok && r < COLS * COLS; r++) {
        if (fabsf(z[r] - want_z[r]) > 1e-4f * (1 + fabsf(want_z[r]))) {
            thread_fail("thread %d round %d on %s: z[%d] = %g, not %g", thread, round, dev->backend,
                        r, (double)z[r], (double)want_z[r]);
            ok = false;
        }
    }
    tb_tensor_release(tx);
    for (i = 0; i < 6; i++)
        tb_tensor_release(tmp[i]);
    tb_tensor_release(ty);
    tb_tensor_release(tz);
    return ok;
}

/* Each thread's errors are its own: a bad call here leaves the others' messages alone. */
static bool own_error(int thread) {
    char expected[64];
    tb_shape bad;
    snprintf(expected, sizeof expected, "thread%d", thread);
    tb_clear_error();
    tb_set_error(TB_ERR_INVALID_ARGUMENT, "%s", expected);
    CHECK(tb_shape_parse("f32[", &bad) != TB_OK, "tb_shape_parse accepted 'f32['");
    CHECK(strstr(tb_last_error(), "f32[") != NULL || strstr(tb_last_error(), "shape") != NULL,
          "thread %d: the parse error is '%s'", thread, tb_last_error());
    tb_set_error(TB_ERR_INVALID_ARGUMENT, "%s", expected);
    CHECK(strcmp(tb_last_error(), expected) == 0, "thread %d sees the error '%s'", thread,
          tb_last_error());
    tb_clear_error();
    return true;
}

/* ---- the threads ---- */

static bool compute_thread(int thread) {
    int round;
    tb_device dev;
    for (round = 0; round < g_rounds; round++) {
        bool opencl = g_have_opencl && thread >= 2;
        if (opencl) {
            /* thread 2 on device 0; thread 3 on each device in turn, so that two threads
               run graphs on one device at once */
            size_t ordinal = thread == 2 ? 0 : (size_t)round % g_opencl_devices;
            if (tb_device_make("opencl", (int32_t)ordinal, &dev) != TB_OK) {
                thread_fail("thread %d: %s", thread, tb_last_error());
                return false;
            }
        } else if (tb_device_make("cpu", 0, &dev) != TB_OK) {
            thread_fail("thread %d: %s", thread, tb_last_error());
            return false;
        }
        if (!run_graph(thread, round, &dev)) return false;
        if (!own_error(thread)) return false;
    }
    return true;
}

static tb_status thr_reference(const void *const *inputs, const tb_shape *input_shapes,
                               size_t num_inputs, void *output, const tb_shape *output_shape,
                               const int64_t *attrs, size_t num_attrs, void *user_data) {
    int64_t n = 0, i;
    (void)num_inputs;
    (void)input_shapes;
    (void)attrs;
    (void)num_attrs;
    (void)user_data;
    tb_shape_numel(output_shape, &n);
    for (i = 0; i < n; i++)
        ((float *)output)[i] = ((const float *)inputs[0])[i] * 3.0f;
    return TB_OK;
}

static bool registry_thread(int thread) {
    int round;
    tb_backend *cpu = tb_backend_lookup("cpu");
    CHECK(cpu != NULL, "lookup cpu: %s", tb_last_error());
    for (round = 0; round < g_rounds; round++) {
        char name[32];
        const char *names[64];
        size_t n, i;
        bool found = false;
        tb_custom_op_desc desc;
        tb_op op;
        snprintf(name, sizeof name, "thr%d_%d", thread, round);
        CHECK(tb_backend_register(name, tb_backend_get_impl(cpu), round % 2 ? "debug" : "") ==
                  TB_OK,
              "register %s: %s", name, tb_last_error());
        CHECK(tb_backend_register(name, tb_backend_get_impl(cpu), NULL) == TB_ERR_DUPLICATE,
              "%s registered twice", name);
        CHECK(tb_backend_lookup(name) != NULL, "lookup %s: %s", name, tb_last_error());
        n = tb_backend_list(names, 64, true);
        for (i = 0; i < n && i < 64; i++)
            found = found || strcmp(names[i], name) == 0;
        CHECK(found || n > 64, "%s is not listed", name);
        CHECK(tb_has_backend("cpu") && !tb_has_backend("thr_none"), "tb_has_backend");
        memset(&desc, 0, sizeof desc);
        desc.name = name; /* an op namespace of its own: the same name is free */
        desc.num_inputs = 1;
        desc.reference = thr_reference;
        desc.opencl_expr = "x0 * (T)3";
        CHECK(tb_op_register(&desc, &op) == TB_OK, "op %s: %s", name, tb_last_error());
        CHECK(tb_op_lookup(name, &op) == TB_OK && strcmp(tb_op_name(op), name) == 0, "op lookup");
        /* the new backend computes */
        {
            tb_device dev;
            float x[4] = {1, 2, 3, 4}, y[4];
            tb_shape s = tb_shape_of(TB_F32, 1, 4);
            tb_tensor *tx, *ty;
            CHECK(tb_device_make(name, 0, &dev) == TB_OK, "device %s: %s", name, tb_last_error());
            tx = tb_tensor_from_host(x, &s, &dev);
            ty = tb_call_op(op, &tx, 1, NULL, 0);
            CHECK(ty != NULL && tb_tensor_to_host(ty, y, sizeof y) == TB_OK, "op on %s: %s", name,
                  tb_last_error());
            CHECK(y[0] == 3 && y[3] == 12, "op on %s gives %g", name, (double)y[0]);
            tb_tensor_release(tx);
            tb_tensor_release(ty);
        }
    }
    return true;
}

static bool metrics_thread(int thread) {
    int round;
    for (round = 0; round < g_rounds * 4; round++) {
        char *report;
        tb_metrics_add("Threads::Counter", 1);
        tb_metrics_sample("Threads::SampleTime", 1000.0 + round);
        CHECK(tb_metrics_counter("Threads::Counter") >= 1, "counter lost");
        report = tb_metrics_report();
        CHECK(report != NULL, "report: %s", tb_last_error());
        CHECK(strstr(report, "Threads::Counter") != NULL, "the report lacks the counter");
        tb_free(report);
        if (g_have_opencl && round % 8 == 0) {
            report = tb_backend_metrics_report("opencl");
            CHECK(report != NULL, "opencl report: %s", tb_last_error());
            tb_free(report);
        }
        (void)tb_computation_cache_size();
        if (round % 16 == 5) tb_computation_cache_clear(); /* while others sync */
        if (g_have_opencl && round % 16 == 13) {
            CHECK(tb_opencl_trim_cache(NULL) == TB_OK, "trim: %s", tb_last_error());
        }
        (void)thread;
    }
    return true;
}

static bool dlpack_thread(int thread) {
    int round;
    tb_device cpu, ocl;
    float x[16];
    tb_shape s = tb_shape_of(TB_F32, 1, 16);
    int i;
    CHECK(tb_device_make("cpu", 0, &cpu) == TB_OK, "cpu: %s", tb_last_error());
    if (g_have_opencl)
        CHECK(tb_device_make("opencl", 1 % (int)g_opencl_devices, &ocl) == TB_OK, "opencl");
    for (i = 0; i < 16; i++)
        x[i] = (float)i * 0.5f;
    for (round = 0; round < g_rounds; round++) {
        const tb_device *dev = g_have_opencl && round % 2 ? &ocl : &cpu;
        tb_tensor *t = tb_tensor_from_host(x, &s, dev), *u = tb_add_scalar(t, (double)round);
        tb_dl_managed_tensor *m = NULL;
        tb_dl_managed_tensor_versioned *mv = NULL;
        producer *p;
        tb_tensor *imported, *sum;
        CHECK(u != NULL && tb_dlpack_export(u, &m) == TB_OK, "export: %s", tb_last_error());
        CHECK(((float *)m->dl_tensor.data)[3] == 1.5f + (float)round, "exported value");
        CHECK(tb_dlpack_export_versioned(u, &mv) == TB_OK, "export: %s", tb_last_error());
        /* the tensors go first; the consumer thread frees the exports later */
        tb_tensor_release(t);
        tb_tensor_release(u);
        queue_push(0, m);
        queue_push(1, mv);
        /* an import used in place (cpu), whose last reference drops on the consumer thread */
        p = producer_new((float)round);
        imported = tb_dlpack_import(&p->managed, &cpu);
        CHECK(imported != NULL, "import: %s", tb_last_error());
        sum = tb_add(imported, imported);
        CHECK(sum != NULL, "add: %s", tb_last_error());
        queue_push(2, imported);
        queue_push(2, sum); /* pending: released there without ever running */
    }
    (void)thread;
    producer_done();
    return true;
}

static bool consumer_thread(int thread) {
    handoff h;
    (void)thread;
    while (queue_pop(&h)) {
        if (h.kind == 0) {
            tb_dl_managed_tensor *m = (tb_dl_managed_tensor *)h.item;
            m->deleter(m);
        } else if (h.kind == 1) {
            tb_dl_managed_tensor_versioned *m = (tb_dl_managed_tensor_versioned *)h.item;
            m->deleter(m);
        } else {
            tb_tensor_release((tb_tensor *)h.item);
        }
    }
    return true;
}

static void *thread_main(void *arg) {
    int thread = (int)(intptr_t)arg;
    switch (thread) {
    case 4:
        (void)registry_thread(thread);
        break;
    case 5:
        (void)metrics_thread(thread);
        break;
    case 6:
        if (!dlpack_thread(thread)) producer_done();
        break;
    case 7:
        (void)consumer_thread(thread);
        break;
    default:
        (void)compute_thread(thread);
        break;
    }
    return NULL;
}

static void test_eight_threads(void **state) {
    pthread_t threads[THREADS];
    intptr_t i;
    (void)state;
    if (getenv("TB_TEST_THREAD_ROUNDS") != NULL) g_rounds = atoi(getenv("TB_TEST_THREAD_ROUNDS"));
    tb_shutdown();
    assert_int_equal(tb_setup(NULL), TB_OK);
    g_have_opencl = tb_opencl_available() == TB_OK;
    if (g_have_opencl) {
        assert_int_equal(tb_backend_devices("opencl", NULL, 0, &g_opencl_devices), TB_OK);
    } else {
        print_message("no OpenCL device: the graphs run on the cpu backend only\n");
    }
    {
        float x[ROWS * COLS];
        tb_shape s = tb_shape_of(TB_F32, 2, ROWS, COLS);
        tb_device cpu;
        tb_shape ws = tb_shape_of(TB_F32, 1, 4);
        tb_tensor *tx, *ty, *tz, *tmp[6], *w, *e, *tc;
        int k;
        memset(x, 0, sizeof x);
        assert_int_equal(tb_device_make("cpu", 0, &cpu), TB_OK);
        tx = tb_tensor_from_host(x, &s, &cpu);
        record_graph(tx, 0.5, 0.0, &ty, &tz, tmp);
        w = tb_full(&ws, 0.5, &cpu);
        e = tb_exp(w);
        tc = tb_sum(e, NULL, 0, false);
        g_fn = tb_function_create(&tx, 1, (tb_tensor *[]){ty, tz, tc}, 3);
        assert_non_null(g_fn);
        tb_tensor_release(w);
        tb_tensor_release(e);
        tb_tensor_release(tc);
        tb_tensor_release(tx);
        tb_tensor_release(ty);
        tb_tensor_release(tz);
        for (k = 0; k < 6; k++)
            tb_tensor_release(tmp[k]);
    }
    g_producers_left = 1;
    for (i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, thread_main, (void *)i), 0);
    for (i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(threads[i], NULL), 0);
    tb_function_release(g_fn);
    g_fn = NULL;
    if (g_failures > 0) fail_msg("%d failures; the first: %s", g_failures, g_failure);
    tb_shutdown();
    /* every import's deleter ran once, on whichever thread dropped the last reference */
    assert_int_equal(g_import_deleters, g_imports);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eight_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
