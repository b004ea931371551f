/* Devices: types, text form, resolution through the registry, the current device and the
   per-thread device guard. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#define assert_starts_with(s, prefix) assert_true(strncmp((s), (prefix), strlen(prefix)) == 0)

/* ---- "multi": a backend with three devices (CPU, GPU, GPU) ---- */

static tb_status m_from_host(void *u, tb_backend_data *d, const void *h) {
    (void)u;
    (void)d;
    (void)h;
    return TB_ERR_UNSUPPORTED;
}
static tb_status m_to_host(void *u, const tb_backend_data *d, void *h) {
    (void)u;
    (void)d;
    (void)h;
    return TB_ERR_UNSUPPORTED;
}
static void m_release(void *u, tb_backend_data *d) {
    (void)u;
    (void)d;
}
static tb_status m_lower(void *u, const tb_graph *g, void **c) {
    (void)u;
    (void)g;
    (void)c;
    return TB_ERR_UNSUPPORTED;
}
static tb_status m_compile(void *u, void *c, void **comp) {
    (void)u;
    (void)c;
    (void)comp;
    return TB_ERR_UNSUPPORTED;
}
static tb_status m_execute(void *u, void *comp, tb_backend_data *const *a, size_t na,
                           tb_backend_data *const *r, size_t nr) {
    (void)u;
    (void)comp;
    (void)a;
    (void)na;
    (void)r;
    (void)nr;
    return TB_ERR_UNSUPPORTED;
}
static void m_release_comp(void *u, void *comp) {
    (void)u;
    (void)comp;
}
static size_t m_devices(void *u, tb_device *out, size_t cap) {
    static const tb_device_type types[3] = {TB_DEVICE_CPU, TB_DEVICE_GPU, TB_DEVICE_GPU};
    size_t i;
    (void)u;
    for (i = 0; i < 3 && i < cap; i++) {
        out[i].type = types[i];
        out[i].ordinal = (int32_t)i;
    }
    return 3;
}
static size_t no_devices(void *u, tb_device *out, size_t cap) {
    (void)u;
    (void)out;
    (void)cap;
    return 0;
}

static void register_backend(const char *name, bool with_devices) {
    tb_backend_impl impl;
    memset(&impl, 0, sizeof impl);
    impl.data_from_host = m_from_host;
    impl.data_to_host = m_to_host;
    impl.data_release = m_release;
    impl.create_lowering_context = m_lower;
    impl.compile = m_compile;
    impl.execute = m_execute;
    impl.release_computation = m_release_comp;
    impl.get_backend_devices = with_devices ? m_devices : no_devices;
    assert_int_equal(tb_backend_register(name, &impl, NULL), TB_OK);
}

static int reset(void **state) {
    (void)state;
    tb_shutdown();
    tb_clear_error();
    unsetenv("TB_DEVICE");
    unsetenv("TB_BACKEND");
    return 0;
}

static int with_multi(void **state) {
    reset(state);
    register_backend("multi", true);
    return 0;
}

static void expect_device(const tb_device *d, const char *backend, tb_device_type type,
                          int32_t ordinal) {
    assert_string_equal(d->backend, backend);
    assert_int_equal(d->type, type);
    assert_int_equal(d->ordinal, ordinal);
}

/* "a, b, c": all registered names, sorted. */
static void available(char *buf, size_t cap) {
    const char *names[64];
    size_t n = tb_backend_list(names, 64, true), i, len = 0;
    buf[0] = '\0';
    for (i = 0; i < n && i < 64; i++) {
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", names[i]);
    }
}

/* ---- types ---- */

static void test_device_types(void **state) {
    static const char *const texts[] = {"cpu", "CPU",         "Cpu",        "gpu",
                                        "GPU", "accelerator", "ACCELERATOR"};
    static const tb_device_type types[] = {
        TB_DEVICE_CPU, TB_DEVICE_CPU,         TB_DEVICE_CPU,        TB_DEVICE_GPU,
        TB_DEVICE_GPU, TB_DEVICE_ACCELERATOR, TB_DEVICE_ACCELERATOR};
    size_t i;
    tb_device_type t = TB_DEVICE_GPU;
    (void)state;
    assert_string_equal(tb_device_type_name(TB_DEVICE_CPU), "CPU");
    assert_string_equal(tb_device_type_name(TB_DEVICE_GPU), "GPU");
    assert_string_equal(tb_device_type_name(TB_DEVICE_ACCELERATOR), "ACCELERATOR");
    assert_string_equal(tb_device_type_name(TB_DEVICE_TYPE_COUNT), "invalid");
    assert_string_equal(tb_device_type_name((tb_device_type)-1), "invalid");
    for (i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        assert_int_equal(tb_device_type_parse(texts[i], &t), TB_OK);
        assert_int_equal(t, types[i]);
    }
    t = TB_DEVICE_GPU;
    assert_int_equal(tb_device_type_parse("tpu", &t), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_device_type_parse: unknown device type 'tpu' "
                                         "(expected cpu, gpu or accelerator)");
    assert_int_equal(t, TB_DEVICE_GPU);
    assert_int_equal(tb_device_type_parse("", &t), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_device_type_parse("cpux", &t), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_device_type_parse(NULL, &t), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_device_type_parse("cpu", NULL), TB_ERR_INVALID_ARGUMENT);
}

/* ---- make, format, parse ---- */

static void test_device_make(void **state) {
    tb_device d;
    char names[512], expected[700];
    (void)state;
    assert_int_equal(tb_device_make("cpu", 0, &d), TB_OK);
    expect_device(&d, "cpu", TB_DEVICE_CPU, 0);
    assert_int_equal(tb_device_make("multi", 2, &d), TB_OK);
    expect_device(&d, "multi", TB_DEVICE_GPU, 2);

    memset(&d, 0x33, sizeof d);
    assert_int_equal(tb_device_make("cpu", 1, &d), TB_ERR_NOT_FOUND);
    assert_string_equal(
        tb_last_error(),
        "tb_device_make: device ordinal 1 out of range: backend 'cpu' has 1 device");
    assert_int_equal(tb_device_make("multi", 3, &d), TB_ERR_NOT_FOUND);
    assert_string_equal(tb_last_error(), "tb_device_make: device ordinal 3 out of range: backend "
                                         "'multi' has 3 devices");
    assert_int_equal(tb_device_make("multi", -1, &d), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_device_make: device ordinal -1 is negative");
    assert_int_equal(tb_device_make("nope", 0, &d), TB_ERR_NOT_FOUND);
    available(names, sizeof names);
    snprintf(expected, sizeof expected, "tb_device_make: unknown backend 'nope'; available: %s",
             names);
    assert_string_equal(tb_last_error(), expected);
    assert_int_equal(d.ordinal, 0x33333333); /* untouched on error */
    assert_int_equal(tb_device_make(NULL, 0, &d), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_device_make("cpu", 0, NULL), TB_ERR_INVALID_ARGUMENT);

    register_backend("empty", false);
    assert_int_equal(tb_device_make("empty", 0, &d), TB_ERR_UNAVAILABLE);
    assert_string_equal(tb_last_error(), "tb_device_make: backend 'empty' has no devices");
}

static void test_device_format(void **state) {
    tb_device d;
    char buf[64];
    (void)state;
    assert_int_equal(tb_device_make("multi", 1, &d), TB_OK);
    assert_int_equal(tb_device_format(&d, buf, sizeof buf), 7);
    assert_string_equal(buf, "multi:1");
    assert_int_equal(tb_device_format(&d, NULL, 0), 7);
    assert_int_equal(tb_device_format(&d, buf, 4), 7);
    assert_string_equal(buf, "mul");
    memset(&d, 0, sizeof d);
    tb_device_format(&d, buf, sizeof buf);
    assert_string_equal(buf, "current"); /* the zero device */
    tb_clear_error();
    assert_int_equal(tb_device_format(NULL, buf, sizeof buf), 0);
    assert_string_equal(buf, "");
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
}

static void test_device_parse(void **state) {
    tb_device d, back;
    char buf[64];
    (void)state;
    assert_int_equal(tb_device_parse("cpu", &d), TB_OK);
    expect_device(&d, "cpu", TB_DEVICE_CPU, 0);
    assert_int_equal(tb_device_parse("cpu:0", &d), TB_OK);
    expect_device(&d, "cpu", TB_DEVICE_CPU, 0);
    assert_int_equal(tb_device_parse("multi:2", &d), TB_OK);
    expect_device(&d, "multi", TB_DEVICE_GPU, 2);
    assert_int_equal(tb_device_parse("multi:002", &d), TB_OK);
    expect_device(&d, "multi", TB_DEVICE_GPU, 2);
    /* format and parse round trip */
    tb_device_format(&d, buf, sizeof buf);
    assert_int_equal(tb_device_parse(buf, &back), TB_OK);
    assert_true(tb_device_equal(&d, &back));
}

static void test_device_parse_errors(void **state) {
    static const struct {
        const char *text;
        tb_status status;
        const char *message;
    } cases[] = {
        {"", TB_ERR_INVALID_ARGUMENT,
         "tb_device_parse: bad device '': expected 'backend' or 'backend:ordinal'"},
        {":0", TB_ERR_INVALID_ARGUMENT,
         "tb_device_parse: bad device ':0': expected 'backend' or 'backend:ordinal'"},
        {"cpu:", TB_ERR_INVALID_ARGUMENT,
         "tb_device_parse: bad device 'cpu:': the ordinal must be a number >= 0"},
        {"cpu:-1", TB_ERR_INVALID_ARGUMENT,
         "tb_device_parse: bad device 'cpu:-1': the ordinal must be a number >= 0"},
        {"cpu:+0", TB_ERR_INVALID_ARGUMENT,
         "tb_device_parse: bad device 'cpu:+0': the ordinal must be a number >= 0"},
        {"cpu:0x", TB_ERR_INVALID_ARGUMENT,
         "tb_device_parse: bad device 'cpu:0x': unexpected 'x' at position 5"},
        {"cpu:1 ", TB_ERR_INVALID_ARGUMENT,
         "tb_device_parse: bad device 'cpu:1 ': unexpected ' ' at position 5"},
        {" cpu", TB_ERR_INVALID_ARGUMENT,
         "tb_device_parse: bad device ' cpu': expected 'backend' or 'backend:ordinal'"},
        {"9cpu", TB_ERR_INVALID_ARGUMENT,
         "tb_device_parse: bad device '9cpu': expected 'backend' or 'backend:ordinal'"},
        {"cpu-0", TB_ERR_INVALID_ARGUMENT,
         "tb_device_parse: bad device 'cpu-0': unexpected '-' at position 3 (expected 'backend' "
         "or 'backend:ordinal')"},
        {"cpu:0:1", TB_ERR_INVALID_ARGUMENT,
         "tb_device_parse: bad device 'cpu:0:1': unexpected ':' at position 5"},
        {"cpu:2147483648", TB_ERR_INVALID_ARGUMENT,
         "tb_device_parse: bad device 'cpu:2147483648': ordinal larger than 2147483647"},
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa:0", TB_ERR_INVALID_ARGUMENT,
         "tb_device_parse: bad device 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa:0': backend name longer "
         "than 31 bytes"},
        {"cpu:1", TB_ERR_NOT_FOUND,
         "tb_device_parse: device ordinal 1 out of range: backend 'cpu' has 1 device"},
        {"multi:7", TB_ERR_NOT_FOUND,
         "tb_device_parse: device ordinal 7 out of range: backend 'multi' has 3 devices"},
    };
    size_t i;
    (void)state;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tb_device d;
        tb_status st;
        memset(&d, 0x44, sizeof d);
        st = tb_device_parse(cases[i].text, &d);
        if (st != cases[i].status || strcmp(tb_last_error(), cases[i].message) != 0) {
            fail_msg("'%s': status %d, message '%s'", cases[i].text, (int)st, tb_last_error());
        }
        assert_int_equal(d.ordinal, 0x44444444);
    }
    {
        /* backend names are case-sensitive: "CPU" is unknown, and the message lists names */
        tb_device d;
        char names[512], expected[700];
        assert_int_equal(tb_device_parse("CPU:0", &d), TB_ERR_NOT_FOUND);
        available(names, sizeof names);
        snprintf(expected, sizeof expected, "tb_device_parse: unknown backend 'CPU'; available: %s",
                 names);
        assert_string_equal(tb_last_error(), expected);
        assert_non_null(strstr(names, "cpu"));
        assert_non_null(strstr(names, "multi"));
    }
    assert_int_equal(tb_device_parse(NULL, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_device_parse: text is NULL");
}

static void test_device_equal(void **state) {
    tb_device a, b;
    (void)state;
    assert_int_equal(tb_device_make("multi", 1, &a), TB_OK);
    b = a;
    assert_true(tb_device_equal(&a, &b));
    b.type = TB_DEVICE_CPU; /* the type does not take part */
    assert_true(tb_device_equal(&a, &b));
    b.ordinal = 2;
    assert_false(tb_device_equal(&a, &b));
    assert_int_equal(tb_device_make("cpu", 0, &b), TB_OK);
    a.ordinal = 0;
    assert_false(tb_device_equal(&a, &b));
    assert_false(tb_device_equal(&a, NULL));
    assert_false(tb_device_equal(NULL, &a));
}

/* ---- the current device ---- */

static void test_current_device_default(void **state) {
    tb_device d;
    (void)state;
    assert_int_equal(tb_current_device(&d), TB_OK);
    expect_device(&d, "cpu", TB_DEVICE_CPU, 0);
    /* the current backend's default device */
    assert_int_equal(tb_set_backend("multi"), TB_OK);
    assert_int_equal(tb_backend_set_default_device_ordinal("multi", 1), TB_OK);
    assert_int_equal(tb_current_device(&d), TB_OK);
    expect_device(&d, "multi", TB_DEVICE_GPU, 1);
    assert_int_equal(tb_current_device(NULL), TB_ERR_INVALID_ARGUMENT);
}

static void test_current_device_from_env_and_desc(void **state) {
    tb_device d;
    tb_desc desc;
    (void)state;
    tb_shutdown();
    setenv("TB_DEVICE", "cpu:0", 1);
    assert_int_equal(tb_current_device(&d), TB_OK);
    expect_device(&d, "cpu", TB_DEVICE_CPU, 0);
    tb_shutdown();

    setenv("TB_DEVICE", "cpu:7", 1);
    assert_int_equal(tb_current_device(&d), TB_ERR_NOT_FOUND);
    assert_string_equal(tb_last_error(),
                        "tb_current_device: TB_DEVICE='cpu:7' is not a usable device: device "
                        "ordinal 7 out of range: backend 'cpu' has 1 device");
    tb_shutdown();

    setenv("TB_DEVICE", "cpu:x", 1);
    assert_int_equal(tb_current_device(&d), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_current_device: TB_DEVICE='cpu:x' is not a usable "
                                         "device: bad device 'cpu:x': the ordinal must be a "
                                         "number >= 0");
    tb_shutdown();

    /* a bad TB_BACKEND is the same kind of error, in the same words; TB_DEVICE set to a good
       device does not need the default backend */
    unsetenv("TB_DEVICE");
    setenv("TB_BACKEND", "ghost", 1);
    assert_int_equal(tb_current_device(&d), TB_ERR_NOT_FOUND);
    assert_starts_with(tb_last_error(), "tb_current_device: TB_BACKEND='ghost' is not a usable "
                                        "backend: unknown backend 'ghost'; available: ");
    tb_shutdown();
    setenv("TB_DEVICE", "cpu:0", 1);
    assert_int_equal(tb_current_device(&d), TB_OK);
    expect_device(&d, "cpu", TB_DEVICE_CPU, 0);
    tb_shutdown();
    unsetenv("TB_BACKEND");

    /* the desc wins over the environment, and the message names it */
    memset(&desc, 0, sizeof desc);
    desc.device = "ghost:0";
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb_current_device(&d), TB_ERR_NOT_FOUND);
    assert_starts_with(tb_last_error(),
                       "tb_current_device: desc.device='ghost:0' is not a usable device: "
                       "unknown backend 'ghost'; available: ");
    tb_shutdown();
    unsetenv("TB_DEVICE");

    /* a device of a backend registered after setup */
    desc.device = "multi:2";
    assert_int_equal(tb_setup(&desc), TB_OK);
    register_backend("multi", true);
    assert_int_equal(tb_current_device(&d), TB_OK);
    expect_device(&d, "multi", TB_DEVICE_GPU, 2);
}

/* ---- guards ---- */

static void test_guard_nesting(void **state) {
    tb_device multi2, multi1, cur;
    tb_device_guard outer, inner;
    (void)state;
    assert_int_equal(tb_device_make("multi", 2, &multi2), TB_OK);
    assert_int_equal(tb_device_make("multi", 1, &multi1), TB_OK);
    assert_int_equal(tb_device_guard_begin(&outer, &multi2), TB_OK);
    assert_true(outer.active);
    assert_int_equal(tb_current_device(&cur), TB_OK);
    expect_device(&cur, "multi", TB_DEVICE_GPU, 2);
    assert_int_equal(tb_device_guard_begin(&inner, &multi1), TB_OK);
    assert_int_equal(tb_current_device(&cur), TB_OK);
    expect_device(&cur, "multi", TB_DEVICE_GPU, 1);
    tb_device_guard_end(&inner);
    assert_false(inner.active);
    assert_int_equal(tb_current_device(&cur), TB_OK);
    expect_device(&cur, "multi", TB_DEVICE_GPU, 2);
    tb_device_guard_end(&inner); /* ending twice is harmless */
    assert_int_equal(tb_current_device(&cur), TB_OK);
    expect_device(&cur, "multi", TB_DEVICE_GPU, 2);
    tb_device_guard_end(&outer);
    assert_int_equal(tb_current_device(&cur), TB_OK);
    expect_device(&cur, "cpu", TB_DEVICE_CPU, 0);
    tb_device_guard_end(NULL);
}

static void test_guard_resolves_type_and_zero_device(void **state) {
    tb_device given, zero, cur;
    tb_device_guard g, g2;
    (void)state;
    memset(&given, 0, sizeof given);
    snprintf(given.backend, sizeof given.backend, "multi");
    given.ordinal = 1;
    given.type = TB_DEVICE_ACCELERATOR; /* wrong: the backend says GPU */
    assert_int_equal(tb_device_guard_begin(&g, &given), TB_OK);
    assert_int_equal(tb_current_device(&cur), TB_OK);
    expect_device(&cur, "multi", TB_DEVICE_GPU, 1);
    /* the zero device means "the current one" */
    memset(&zero, 0, sizeof zero);
    assert_int_equal(tb_device_guard_begin(&g2, &zero), TB_OK);
    assert_int_equal(tb_current_device(&cur), TB_OK);
    expect_device(&cur, "multi", TB_DEVICE_GPU, 1);
    tb_device_guard_end(&g2);
    tb_device_guard_end(&g);
}

static void test_guard_errors(void **state) {
    tb_device bad, cur;
    tb_device_guard g;
    (void)state;
    memset(&bad, 0, sizeof bad);
    snprintf(bad.backend, sizeof bad.backend, "multi");
    bad.ordinal = 5;
    memset(&g, 0, sizeof g);
    assert_int_equal(tb_device_guard_begin(&g, &bad), TB_ERR_NOT_FOUND);
    assert_string_equal(tb_last_error(), "tb_device_guard_begin: device ordinal 5 out of range: "
                                         "backend 'multi' has 3 devices");
    assert_false(g.active);
    assert_int_equal(tb_current_device(&cur), TB_OK);
    expect_device(&cur, "cpu", TB_DEVICE_CPU, 0);
    snprintf(bad.backend, sizeof bad.backend, "ghost");
    bad.ordinal = 0;
    assert_int_equal(tb_device_guard_begin(&g, &bad), TB_ERR_NOT_FOUND);
    assert_starts_with(tb_last_error(), "tb_device_guard_begin: unknown backend 'ghost'");
    assert_int_equal(tb_device_guard_begin(NULL, &cur), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_device_guard_begin(&g, NULL), TB_ERR_INVALID_ARGUMENT);
    tb_device_guard_end(&g); /* never began: nothing happens */
    assert_int_equal(tb_current_device(&cur), TB_OK);
    expect_device(&cur, "cpu", TB_DEVICE_CPU, 0);
}

typedef struct guard_thread {
    pthread_barrier_t *inside; /* both threads hold their guards */
    pthread_barrier_t *checked;
    int32_t ordinal; /* the guard's ordinal; -1: no guard */
    tb_device before, during, after;
    tb_status status;
} guard_thread;

static void *guard_worker(void *p) {
    guard_thread *t = (guard_thread *)p;
    tb_device_guard g;
    tb_device d;
    t->status = tb_current_device(&t->before);
    if (t->ordinal >= 0) {
        if (t->status == TB_OK) t->status = tb_device_make("multi", t->ordinal, &d);
        if (t->status == TB_OK) t->status = tb_device_guard_begin(&g, &d);
    }
    pthread_barrier_wait(t->inside);
    if (t->status == TB_OK) t->status = tb_current_device(&t->during);
    pthread_barrier_wait(t->checked);
    if (t->ordinal >= 0) tb_device_guard_end(&g);
    if (t->status == TB_OK) t->status = tb_current_device(&t->after);
    return NULL;
}

static void test_guards_are_per_thread(void **state) {
    pthread_barrier_t inside, checked;
    pthread_t threads[3];
    guard_thread t[3];
    tb_device main_guarded, cur;
    tb_device_guard g;
    int k;
    (void)state;
    /* the main thread's guard is not seen by the others */
    assert_int_equal(tb_device_make("multi", 0, &main_guarded), TB_OK);
    assert_int_equal(tb_device_guard_begin(&g, &main_guarded), TB_OK);
    pthread_barrier_init(&inside, NULL, 3);
    pthread_barrier_init(&checked, NULL, 3);
    for (k = 0; k < 3; k++) {
        memset(&t[k], 0, sizeof t[k]);
        t[k].inside = &inside;
        t[k].checked = &checked;
        t[k].ordinal = k == 2 ? -1 : k + 1;
        assert_int_equal(pthread_create(&threads[k], NULL, guard_worker, &t[k]), 0);
    }
    for (k = 0; k < 3; k++)
        pthread_join(threads[k], NULL);
    pthread_barrier_destroy(&inside);
    pthread_barrier_destroy(&checked);
    for (k = 0; k < 3; k++) {
        assert_int_equal(t[k].status, TB_OK);
        expect_device(&t[k].before, "cpu", TB_DEVICE_CPU, 0);
        expect_device(&t[k].after, "cpu", TB_DEVICE_CPU, 0);
    }
    expect_device(&t[0].during, "multi", TB_DEVICE_GPU, 1);
    expect_device(&t[1].during, "multi", TB_DEVICE_GPU, 2);
    expect_device(&t[2].during, "cpu", TB_DEVICE_CPU, 0);
    assert_int_equal(tb_current_device(&cur), TB_OK);
    expect_device(&cur, "multi", TB_DEVICE_CPU, 0);
    tb_device_guard_end(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_device_types, reset, reset),
        cmocka_unit_test_setup_teardown(test_device_make, with_multi, reset),
        cmocka_unit_test_setup_teardown(test_device_format, with_multi, reset),
        cmocka_unit_test_setup_teardown(test_device_parse, with_multi, reset),
        cmocka_unit_test_setup_teardown(test_device_parse_errors, with_multi, reset),
        cmocka_unit_test_setup_teardown(test_device_equal, with_multi, reset),
        cmocka_unit_test_setup_teardown(test_current_device_default, with_multi, reset),
        cmocka_unit_test_setup_teardown(test_current_device_from_env_and_desc, reset, reset),
        cmocka_unit_test_setup_teardown(test_guard_nesting, with_multi, reset),
        cmocka_unit_test_setup_teardown(test_guard_resolves_type_and_zero_device, with_multi,
                                        reset),
        cmocka_unit_test_setup_teardown(test_guard_errors, with_multi, reset),
        cmocka_unit_test_setup_teardown(test_guards_are_per_thread, with_multi, reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
