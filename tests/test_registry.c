/* The backend registry: registration, lookup, listing, the current backend, default devices,
   plugins, concurrency, and the cpu backend's data. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#define assert_starts_with(s, prefix) assert_true(strncmp((s), (prefix), strlen(prefix)) == 0)

/* ---- a minimal backend whose devices a test chooses ---- */

typedef struct test_backend {
    size_t num_devices;
    tb_device_type types[4];
    int init_calls;
    int exit_calls;
    tb_status init_status; /* what init returns */
    bool init_lists;       /* init calls back into the registry */
} test_backend;

static tb_status tb_from_host(void *u, tb_backend_data *d, const void *h) {
    (void)u;
    (void)d;
    (void)h;
    return TB_ERR_UNSUPPORTED;
}
static tb_status tb_to_host(void *u, const tb_backend_data *d, void *h) {
    (void)u;
    (void)d;
    (void)h;
    return TB_ERR_UNSUPPORTED;
}
static void tb_release(void *u, tb_backend_data *d) {
    (void)u;
    (void)d;
}
static tb_status tb_lower(void *u, const tb_graph *g, void **c) {
    (void)u;
    (void)g;
    (void)c;
    return TB_ERR_UNSUPPORTED;
}
static tb_status tb_compile(void *u, void *c, void **comp) {
    (void)u;
    (void)c;
    (void)comp;
    return TB_ERR_UNSUPPORTED;
}
static tb_status tb_execute(void *u, void *comp, tb_backend_data *const *a, size_t na,
                            tb_backend_data *const *r, size_t nr) {
    (void)u;
    (void)comp;
    (void)a;
    (void)na;
    (void)r;
    (void)nr;
    return TB_ERR_UNSUPPORTED;
}
static void tb_release_comp(void *u, void *comp) {
    (void)u;
    (void)comp;
}
static size_t tb_devices(void *u, tb_device *out, size_t cap) {
    test_backend *t = (test_backend *)u;
    size_t i;
    for (i = 0; i < t->num_devices && i < cap; i++) {
        out[i].type = t->types[i];
        out[i].ordinal = (int32_t)i;
    }
    return t->num_devices;
}
static tb_status tb_init(void *u) {
    test_backend *t = (test_backend *)u;
    t->init_calls++;
    if (t->init_lists) {
        const char *names[16];
        (void)tb_backend_list(names, 16, true);
        (void)tb_has_backend("cpu");
    }
    if (t->init_status != TB_OK) return tb_set_error(t->init_status, "no hardware");
    return TB_OK;
}
static void tb_exit(void *u) {
    ((test_backend *)u)->exit_calls++;
}

static tb_backend_impl test_impl(test_backend *t) {
    tb_backend_impl impl;
    memset(&impl, 0, sizeof impl);
    impl.user_data = t;
    impl.init = tb_init;
    impl.data_from_host = tb_from_host;
    impl.data_to_host = tb_to_host;
    impl.data_release = tb_release;
    impl.create_lowering_context = tb_lower;
    impl.compile = tb_compile;
    impl.execute = tb_execute;
    impl.release_computation = tb_release_comp;
    impl.get_backend_devices = tb_devices;
    return impl;
}

static test_backend one_cpu = {1, {TB_DEVICE_CPU}, 0, 0, TB_OK, false};

static char *g_backend_path; /* TB_BACKEND_PATH as the program found it */

static int reset(void **state) {
    (void)state;
    tb_shutdown();
    tb_clear_error();
    unsetenv("TB_BACKEND");
    unsetenv("TB_DEVICE");
    if (g_backend_path != NULL) setenv("TB_BACKEND_PATH", g_backend_path, 1);
    return 0;
}

static size_t count_all(void) {
    return tb_backend_list(NULL, 0, true);
}

/* "a, b, c": every registered name, sorted (as the not-found message lists them). */
static void available(char *buf, size_t cap) {
    const char *names[64];
    size_t n = tb_backend_list(names, 64, true), i, len = 0;
    buf[0] = '\0';
    for (i = 0; i < n && i < 64; i++) {
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", names[i]);
    }
}

/* ---- registration and lookup ---- */

static void test_builtin_cpu(void **state) {
    tb_backend *cpu;
    const char *names[8];
    size_t n, i;
    bool found = false;
    (void)state;
    assert_true(tb_has_backend("cpu"));
    cpu = tb_backend_lookup("cpu");
    assert_non_null(cpu);
    assert_string_equal(tb_backend_name(cpu), "cpu");
    assert_string_equal(tb_backend_tags(cpu), "");
    n = tb_backend_list(names, 8, false);
    for (i = 0; i < n && i < 8; i++)
        found = found || strcmp(names[i], "cpu") == 0;
    assert_true(found);
    assert_string_equal(tb_get_backend(), "cpu");
}

static void test_register_and_lookup(void **state) {
    static test_backend t; /* static: prepare_to_exit may run in the teardown */
    tb_backend_impl impl;
    tb_backend *b;
    const tb_backend_impl *copy;
    (void)state;
    t = one_cpu;
    impl = test_impl(&t);
    impl.prepare_to_exit = tb_exit;
    assert_int_equal(tb_backend_register("mydev", &impl, "fast, small"), TB_OK);
    assert_int_equal(t.init_calls, 1);
    b = tb_backend_lookup("mydev");
    assert_non_null(b);
    assert_true(b == tb_backend_lookup("mydev"));
    assert_string_equal(tb_backend_name(b), "mydev");
    assert_string_equal(tb_backend_tags(b), "fast, small");
    assert_true(tb_backend_has_tag(b, "fast"));
    assert_true(tb_backend_has_tag(b, "small"));
    assert_false(tb_backend_has_tag(b, "sma"));
    assert_false(tb_backend_has_tag(b, "debug"));
    assert_false(tb_backend_has_tag(b, NULL));
    assert_false(tb_backend_has_tag(NULL, "fast"));
    copy = tb_backend_get_impl(b);
    assert_non_null(copy);
    assert_true(copy != &impl); /* the registry keeps its own copy */
    assert_true(copy->user_data == &t && copy->execute == tb_execute);
    memset(&impl, 0, sizeof impl); /* changing the caller's struct changes nothing */
    assert_true(tb_backend_get_impl(b)->compile == tb_compile);
    assert_true(tb_has_backend("mydev"));
    tb_shutdown();
    assert_int_equal(t.exit_calls, 1);     /* prepare_to_exit at shutdown */
    assert_false(tb_has_backend("mydev")); /* the registry starts over */
}

static void test_null_handles(void **state) {
    (void)state;
    assert_null(tb_backend_name(NULL));
    assert_string_equal(tb_last_error(), "tb_backend_name: backend is NULL");
    assert_null(tb_backend_tags(NULL));
    assert_null(tb_backend_get_impl(NULL));
    assert_null(tb_backend_lookup(NULL));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_backend_lookup: backend name is NULL");
    tb_clear_error();
    assert_false(tb_has_backend(NULL));
    assert_false(tb_has_backend("nothing_here"));
    assert_int_equal(tb_last_status(), TB_OK); /* has_backend sets no error */
}

/* A NULL array asks for the count alone: the answer does not depend on `cap` (it used to be
   0 for any cap but 0). */
static void test_count_without_array(void **state) {
    const char *names[16];
    tb_device devices[4];
    tb_device cpu;
    tb_shape shape = tb_shape_of(TB_F32, 2, 2, 3);
    size_t visible, all, cap, count;
    (void)state;
    visible = tb_backend_list(names, 16, false);
    all = tb_backend_list(names, 16, true);
    assert_true(visible >= 1);
    assert_true(all >= visible);
    tb_clear_error();
    for (cap = 0; cap < 6; cap++) {
        assert_int_equal(tb_backend_list(NULL, cap, false), visible);
        assert_int_equal(tb_backend_list(NULL, cap, true), all);
        count = 99;
        assert_int_equal(tb_backend_devices("cpu", NULL, cap, &count), TB_OK);
        assert_int_equal(count, 1);
        assert_int_equal(tb_shape_format(&shape, NULL, cap), strlen("f32[2,3]"));
        assert_int_equal(tb_device_make("cpu", 0, &cpu), TB_OK);
        assert_int_equal(tb_device_format(&cpu, NULL, cap), strlen("cpu:0"));
    }
    assert_int_equal(tb_last_status(), TB_OK);
    assert_int_equal(tb_backend_devices("cpu", devices, 4, &count), TB_OK);
    assert_int_equal(count, 1);
    assert_int_equal(tb_backend_devices("cpu", NULL, 3, NULL), TB_OK);
}

static void test_list_sorted_and_hidden(void **state) {
    test_backend t = one_cpu;
    tb_backend_impl impl = test_impl(&t);
    const char *names[16];
    size_t n, visible, all, i;
    (void)state;
    visible = tb_backend_list(NULL, 0, false);
    all = tb_backend_list(NULL, 0, true);
    assert_int_equal(tb_backend_register("zeta", &impl, NULL), TB_OK);
    assert_int_equal(tb_backend_register("alpha", &impl, ""), TB_OK);
    assert_int_equal(tb_backend_register("mid", &impl, "debug"), TB_OK);
    assert_int_equal(tb_backend_register("beta", &impl, "fast,experimental"), TB_OK);
    assert_int_equal(tb_backend_register("Upper", &impl, "x"), TB_OK);
    n = tb_backend_list(names, 16, false);
    assert_int_equal(n, visible + 3);
    for (i = 1; i < n; i++)
        assert_true(strcmp(names[i - 1], names[i]) < 0);
    for (i = 0; i < n; i++) {
        assert_string_not_equal(names[i], "mid");
        assert_string_not_equal(names[i], "beta");
    }
    n = tb_backend_list(names, 16, true);
    assert_int_equal(n, all + 5);
    for (i = 1; i < n; i++)
        assert_true(strcmp(names[i - 1], names[i]) < 0);
    /* a short array gets the first names; the count is the full count */
    names[1] = "untouched";
    assert_int_equal(tb_backend_list(names, 1, true), all + 5);
    assert_string_equal(names[0], "Upper"); /* byte order: upper case first */
    assert_string_equal(names[1], "untouched");
    assert_int_equal(t.init_calls, 5);
}

static void test_duplicate(void **state) {
    test_backend t = one_cpu;
    tb_backend_impl impl = test_impl(&t);
    size_t before;
    (void)state;
    assert_int_equal(tb_backend_register("twice", &impl, NULL), TB_OK);
    before = count_all();
    assert_int_equal(tb_backend_register("twice", &impl, "other"), TB_ERR_DUPLICATE);
    assert_string_equal(tb_last_error(), "tb_backend_register: duplicate name: twice");
    assert_int_equal(tb_backend_register("cpu", &impl, NULL), TB_ERR_DUPLICATE);
    assert_string_equal(tb_last_error(), "tb_backend_register: duplicate name: cpu");
    assert_int_equal(count_all(), before);
    assert_int_equal(t.init_calls, 1); /* init never ran for the rejected ones */
    assert_string_equal(tb_backend_tags(tb_backend_lookup("twice")), "");
}

static void test_bad_names_and_tags(void **state) {
    test_backend t = one_cpu;
    tb_backend_impl impl = test_impl(&t);
    char name31[32], name32[33];
    size_t before;
    (void)state;
    memset(name31, 'a', 31);
    name31[31] = '\0';
    memset(name32, 'b', 32);
    name32[32] = '\0';
    before = count_all();
    assert_int_equal(tb_backend_register(NULL, &impl, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_backend_register: backend name is NULL");
    assert_int_equal(tb_backend_register("", &impl, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_backend_register: bad backend name '' (expected "
                                         "[A-Za-z_][A-Za-z0-9_]*, 1..31 bytes)");
    assert_int_equal(tb_backend_register(name32, &impl, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "is longer than 31 bytes"));
    assert_int_equal(tb_backend_register("9abc", &impl, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "bad backend name '9abc'"));
    assert_int_equal(tb_backend_register("a-b", &impl, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "bad backend name 'a-b'"));
    assert_int_equal(tb_backend_register("a b", &impl, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_backend_register("ok", NULL, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(), "tb_backend_register: impl is NULL");
    assert_int_equal(tb_backend_register("ok", &impl, "a,,b"), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "bad tags 'a,,b' for backend 'ok'"));
    assert_int_equal(tb_backend_register("ok", &impl, "a-b"), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_backend_register("ok", &impl, ","), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_backend_register("ok", &impl, "x,"), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_backend_register("ok", &impl, "9x"), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(count_all(), before);
    assert_int_equal(t.init_calls, 0);
    assert_false(tb_has_backend("ok"));
    /* the longest name and the identifier rules' edges are accepted */
    assert_int_equal(tb_backend_register(name31, &impl, " spaced , tags "), TB_OK);
    assert_int_equal(tb_backend_register("_x9", &impl, NULL), TB_OK);
    assert_true(tb_backend_has_tag(tb_backend_lookup(name31), "spaced"));
    assert_true(tb_backend_has_tag(tb_backend_lookup(name31), "tags"));
}

static void test_missing_required_entries(void **state) {
    static const char *const entries[] = {
        "data_from_host", "data_to_host", "data_release",        "create_lowering_context",
        "compile",        "execute",      "release_computation", "get_backend_devices"};
    test_backend t = one_cpu;
    size_t i, before = count_all();
    (void)state;
    for (i = 0; i < 8; i++) {
        tb_backend_impl impl = test_impl(&t);
        char expected[160];
        switch (i) {
        case 0:
            impl.data_from_host = NULL;
            break;
        case 1:
            impl.data_to_host = NULL;
            break;
        case 2:
            impl.data_release = NULL;
            break;
        case 3:
            impl.create_lowering_context = NULL;
            break;
        case 4:
            impl.compile = NULL;
            break;
        case 5:
            impl.execute = NULL;
            break;
        case 6:
            impl.release_computation = NULL;
            break;
        default:
            impl.get_backend_devices = NULL;
            break;
        }
        assert_int_equal(tb_backend_register("partial", &impl, NULL), TB_ERR_INVALID_ARGUMENT);
        snprintf(expected, sizeof expected,
                 "tb_backend_register: backend 'partial' lacks the required entry %s", entries[i]);
        assert_string_equal(tb_last_error(), expected);
    }
    assert_int_equal(count_all(), before);
    assert_int_equal(t.init_calls, 0);
    {
        /* every optional entry may be NULL */
        tb_backend_impl impl = test_impl(&t);
        impl.init = NULL;
        assert_int_equal(tb_backend_register("partial", &impl, NULL), TB_OK);
    }
}

static void test_init_failure(void **state) {
    test_backend t = one_cpu;
    tb_backend_impl impl;
    size_t before;
    (void)state;
    t.init_status = TB_ERR_UNAVAILABLE;
    impl = test_impl(&t);
    before = count_all();
    assert_int_equal(tb_backend_register("failing", &impl, NULL), TB_ERR_UNAVAILABLE);
    assert_string_equal(tb_last_error(),
                        "tb_backend_register: init of backend 'failing' failed: no hardware");
    assert_int_equal(t.init_calls, 1);
    assert_int_equal(count_all(), before);
    assert_null(tb_backend_lookup("failing"));
    assert_int_equal(tb_last_status(), TB_ERR_NOT_FOUND);
    /* the name is free again */
    t.init_status = TB_OK;
    assert_int_equal(tb_backend_register("failing", &impl, NULL), TB_OK);
    assert_int_equal(count_all(), before + 1);
}

static void test_init_may_call_the_library(void **state) {
    test_backend t = one_cpu;
    tb_backend_impl impl;
    tb_status before_status;
    (void)state;
    t.init_lists = true;
    impl = test_impl(&t);
    tb_set_error(TB_ERR_IO, "earlier");
    assert_int_equal(tb_backend_register("reentrant", &impl, NULL), TB_OK);
    assert_true(tb_has_backend("reentrant"));
    /* a successful registration keeps the caller's earlier error */
    before_status = tb_last_status();
    assert_int_equal(before_status, TB_ERR_IO);
    assert_string_equal(tb_last_error(), "earlier");
}

static void test_unknown_lookup_lists_available(void **state) {
    test_backend t = one_cpu;
    tb_backend_impl impl = test_impl(&t);
    char names[512], expected[700];
    (void)state;
    assert_int_equal(tb_backend_register("hidden_one", &impl, "debug"), TB_OK);
    available(names, sizeof names);
    assert_non_null(strstr(names, "cpu"));
    assert_non_null(strstr(names, "hidden_one")); /* hidden ones are listed too */
    assert_null(tb_backend_lookup("nope"));
    assert_int_equal(tb_last_status(), TB_ERR_NOT_FOUND);
    snprintf(expected, sizeof expected, "tb_backend_lookup: unknown backend 'nope'; available: %s",
             names);
    assert_string_equal(tb_last_error(), expected);
    assert_null(tb_backend_lookup("../etc"));
    assert_int_equal(tb_last_status(), TB_ERR_NOT_FOUND);
    assert_null(tb_backend_lookup("CPU")); /* names are case-sensitive */
    assert_int_equal(tb_last_status(), TB_ERR_NOT_FOUND);
}

/* ---- the current backend ---- */

static void test_set_and_get_backend(void **state) {
    test_backend t = one_cpu;
    tb_backend_impl impl = test_impl(&t);
    (void)state;
    assert_string_equal(tb_get_backend(), "cpu");
    assert_int_equal(tb_backend_register("mine", &impl, NULL), TB_OK);
    assert_int_equal(tb_set_backend("mine"), TB_OK);
    assert_string_equal(tb_get_backend(), "mine");
    assert_int_equal(tb_set_backend("unknown_backend"), TB_ERR_NOT_FOUND);
    assert_starts_with(tb_last_error(),
                       "tb_set_backend: unknown backend 'unknown_backend'; available: ");
    assert_string_equal(tb_get_backend(), "mine"); /* unchanged */
    assert_int_equal(tb_set_backend(NULL), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_get_backend(), "mine");
    assert_int_equal(tb_set_backend("cpu"), TB_OK);
    assert_string_equal(tb_get_backend(), "cpu");
}

typedef struct log_count {
    int warnings;
    char last[256];
} log_count;

static void count_logs(tb_log_level level, const char *message, void *user_data) {
    log_count *c = (log_count *)user_data;
    if (level == TB_LOG_WARN) {
        c->warnings++;
        snprintf(c->last, sizeof c->last, "%s", message);
    }
}

static void test_default_backend_from_env_and_desc(void **state) {
    tb_desc desc;
    tb_device d;
    static log_count logs;
    static const float one = 1.0f;
    tb_shape s = tb_shape_of(TB_F32, 1, 1);
    (void)state;
    memset(&desc, 0, sizeof desc);
    memset(&logs, 0, sizeof logs);
    desc.logger.func = count_logs;
    desc.logger.user_data = &logs;

    /* an unknown default is an error at every use, named like a bad TB_DEVICE; nothing falls
       back to cpu and nothing is logged */
    setenv("TB_BACKEND", "not_a_backend", 1);
    assert_int_equal(tb_setup(&desc), TB_OK);
    tb_clear_error();
    assert_null(tb_get_backend());
    assert_int_equal(tb_last_status(), TB_ERR_NOT_FOUND);
    assert_starts_with(tb_last_error(), "tb_get_backend: TB_BACKEND='not_a_backend' is not a "
                                        "usable backend: unknown backend 'not_a_backend'; "
                                        "available: cpu");
    assert_int_equal(tb_current_device(&d), TB_ERR_NOT_FOUND);
    assert_starts_with(tb_last_error(), "tb_current_device: TB_BACKEND='not_a_backend' is not a "
                                        "usable backend: unknown backend 'not_a_backend'; "
                                        "available: ");
    assert_null(tb_tensor_from_host(&one, &s, NULL));
    assert_int_equal(tb_last_status(), TB_ERR_NOT_FOUND);
    assert_null(tb_get_backend()); /* still: the error is not a one-time warning */
    assert_int_equal(logs.warnings, 0);
    /* choosing a backend ends it */
    assert_int_equal(tb_set_backend("cpu"), TB_OK);
    assert_string_equal(tb_get_backend(), "cpu");
    assert_int_equal(tb_current_device(&d), TB_OK);
    tb_shutdown();

    /* the desc wins over the environment, and the message names it */
    desc.backend = "cpu";
    memset(&logs, 0, sizeof logs);
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_string_equal(tb_get_backend(), "cpu");
    assert_int_equal(logs.warnings, 0);
    tb_shutdown();
    desc.backend = "ghost";
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb_current_device(&d), TB_ERR_NOT_FOUND);
    assert_starts_with(tb_last_error(), "tb_current_device: desc.backend='ghost' is not a usable "
                                        "backend: unknown backend 'ghost'; available: ");
    tb_shutdown();
    unsetenv("TB_BACKEND");
}

static const char *plugin_dir(void);

static void test_default_backend_from_env_plugin(void **state) {
    (void)state;
    (void)plugin_dir(); /* skips without plugins */
    tb_shutdown();
    setenv("TB_BACKEND", "plugin", 1);
    assert_int_equal(tb_setup(NULL), TB_OK);
    assert_string_equal(tb_get_backend(), "plugin");
    tb_shutdown();
    /* a plugin that fails to load: the loader's reason, under the setting's name */
    setenv("TB_BACKEND", "failinit", 1);
    assert_int_equal(tb_setup(NULL), TB_OK);
    assert_null(tb_get_backend());
    assert_int_equal(tb_last_status(), TB_ERR_PLUGIN);
    assert_starts_with(tb_last_error(),
                       "tb_get_backend: TB_BACKEND='failinit' is not a usable backend: plugin ");
    assert_non_null(strstr(tb_last_error(), "failinit: no such hardware here"));
    tb_shutdown();
    unsetenv("TB_BACKEND");
    assert_string_equal(tb_get_backend(), "cpu");
}

/* ---- devices and defaults ---- */

static void test_default_device_kept_by_library(void **state) {
    test_backend t = {3, {TB_DEVICE_CPU, TB_DEVICE_GPU, TB_DEVICE_GPU}, 0, 0, TB_OK, false};
    tb_backend_impl impl = test_impl(&t);
    tb_device_type type;
    int32_t ordinal;
    tb_device d, list[4];
    size_t count = 99;
    (void)state;
    assert_int_equal(tb_backend_register("multi", &impl, NULL), TB_OK);
    assert_int_equal(tb_backend_devices("multi", list, 4, &count), TB_OK);
    assert_int_equal(count, 3);
    assert_string_equal(list[2].backend, "multi");
    assert_int_equal(list[2].type, TB_DEVICE_GPU);
    assert_int_equal(list[2].ordinal, 2);
    assert_int_equal(tb_backend_devices("multi", list, 1, &count), TB_OK);
    assert_int_equal(count, 3);
    assert_int_equal(tb_backend_devices("multi", NULL, 0, &count), TB_OK);
    assert_int_equal(count, 3);
    count = 99;
    assert_int_equal(tb_backend_devices("multi", NULL, 2, &count), TB_OK); /* cap ignored */
    assert_int_equal(count, 3);

    assert_int_equal(tb_backend_get_default_device_type("multi", &type), TB_OK);
    assert_int_equal(type, TB_DEVICE_CPU); /* device 0's type */
    assert_int_equal(tb_backend_get_default_device_ordinal("multi", &ordinal), TB_OK);
    assert_int_equal(ordinal, 0);
    assert_int_equal(tb_backend_default_device("multi", &d), TB_OK);
    assert_string_equal(d.backend, "multi");
    assert_int_equal(d.ordinal, 0);

    /* a type moves the default to that type's first device */
    assert_int_equal(tb_backend_set_default_device_type("multi", TB_DEVICE_GPU), TB_OK);
    assert_int_equal(tb_backend_get_default_device_ordinal("multi", &ordinal), TB_OK);
    assert_int_equal(ordinal, 1);
    assert_int_equal(tb_backend_default_device("multi", &d), TB_OK);
    assert_int_equal(d.ordinal, 1);
    assert_int_equal(d.type, TB_DEVICE_GPU);
    /* an ordinal takes its device's type */
    assert_int_equal(tb_backend_set_default_device_ordinal("multi", 2), TB_OK);
    assert_int_equal(tb_backend_get_default_device_type("multi", &type), TB_OK);
    assert_int_equal(type, TB_DEVICE_GPU);
    assert_int_equal(tb_backend_set_default_device_type("multi", TB_DEVICE_GPU), TB_OK);
    assert_int_equal(tb_backend_get_default_device_ordinal("multi", &ordinal), TB_OK);
    assert_int_equal(ordinal, 2); /* already of that type: kept */
    assert_int_equal(tb_backend_set_default_device_ordinal("multi", 0), TB_OK);
    assert_int_equal(tb_backend_get_default_device_type("multi", &type), TB_OK);
    assert_int_equal(type, TB_DEVICE_CPU);

    /* errors change nothing */
    assert_int_equal(tb_backend_set_default_device_ordinal("multi", 3), TB_ERR_NOT_FOUND);
    assert_string_equal(tb_last_error(), "tb_backend_set_default_device_ordinal: device ordinal "
                                         "3 out of range: backend 'multi' has 3 devices");
    assert_int_equal(tb_backend_set_default_device_ordinal("multi", -1), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_backend_set_default_device_type("multi", TB_DEVICE_ACCELERATOR),
                     TB_ERR_NOT_FOUND);
    assert_string_equal(tb_last_error(), "tb_backend_set_default_device_type: backend 'multi' "
                                         "has no ACCELERATOR device");
    assert_int_equal(tb_backend_set_default_device_type("multi", (tb_device_type)7),
                     TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_backend_get_default_device_ordinal("multi", &ordinal), TB_OK);
    assert_int_equal(ordinal, 0);
    assert_int_equal(tb_backend_get_default_device_type("multi", &type), TB_OK);
    assert_int_equal(type, TB_DEVICE_CPU);

    /* unknown backends and NULL outputs */
    assert_int_equal(tb_backend_get_default_device_type("nope", &type), TB_ERR_NOT_FOUND);
    assert_starts_with(tb_last_error(),
                       "tb_backend_get_default_device_type: unknown backend 'nope'");
    assert_int_equal(tb_backend_get_default_device_type("multi", NULL), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_backend_get_default_device_ordinal("multi", NULL), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_backend_default_device("multi", NULL), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_backend_devices("nope", list, 4, &count), TB_ERR_NOT_FOUND);
}

static void test_cpu_defaults_and_info(void **state) {
    tb_device_type type;
    int32_t ordinal;
    tb_device d;
    tb_device_info info;
    char *report;
    (void)state;
    assert_int_equal(tb_backend_get_default_device_type("cpu", &type), TB_OK);
    assert_int_equal(type, TB_DEVICE_CPU);
    assert_int_equal(tb_backend_get_default_device_ordinal("cpu", &ordinal), TB_OK);
    assert_int_equal(ordinal, 0);
    assert_int_equal(tb_backend_eager_fallback_device_type("cpu", &type), TB_OK);
    assert_int_equal(type, TB_DEVICE_CPU);
    assert_int_equal(tb_backend_default_device("cpu", &d), TB_OK);
    assert_int_equal(tb_backend_device_info(&d, &info), TB_OK);
    assert_string_equal(info.name, "reference");
    assert_string_equal(info.vendor, "torch_backend.h");
    assert_true(info.unified_memory);
    assert_true(info.supports_f64);
    assert_true(info.global_memory > 0);
    assert_string_equal(info.device.backend, "cpu");
    report = tb_backend_metrics_report("cpu");
    assert_non_null(report);
    tb_free(report);
    assert_null(tb_backend_metrics_report("nope"));
    assert_int_equal(tb_last_status(), TB_ERR_NOT_FOUND);
    d.ordinal = 1;
    assert_int_equal(tb_backend_device_info(&d, &info), TB_ERR_NOT_FOUND);
    assert_string_equal(tb_last_error(), "tb_backend_device_info: device ordinal 1 out of range: "
                                         "backend 'cpu' has 1 device");
}

/* Hooks that keep the default themselves and refuse some values. */
static int32_t hooked_ordinal = 0;
static tb_device_type hook_get_type(void *u) {
    (void)u;
    return TB_DEVICE_ACCELERATOR;
}
static tb_status hook_set_type(void *u, tb_device_type type) {
    (void)u;
    if (type != TB_DEVICE_ACCELERATOR) return tb_set_error(TB_ERR_UNSUPPORTED, "hooked: no");
    return TB_OK;
}
static int32_t hook_get_ordinal(void *u) {
    (void)u;
    return hooked_ordinal;
}
static tb_status hook_set_ordinal(void *u, int32_t ordinal) {
    (void)u;
    if (ordinal > 1) return TB_ERR_NOT_FOUND; /* no message: the library writes one */
    hooked_ordinal = ordinal;
    return TB_OK;
}
static tb_device_type hook_fallback(void *u) {
    (void)u;
    return TB_DEVICE_GPU;
}
static size_t hook_report(void *u, char *buf, size_t cap) {
    char text[1500];
    (void)u;
    memset(text, 'r', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    return (size_t)snprintf(buf, cap, "%s", text);
}
static tb_status hook_info(void *u, int32_t ordinal, tb_device_info *out) {
    (void)u;
    snprintf(out->name, sizeof out->name, "hooked %d", (int)ordinal);
    out->compute_units = 7;
    out->device.ordinal = 99; /* the library puts the device back */
    return TB_OK;
}

static void test_backend_hooks(void **state) {
    test_backend t = {2, {TB_DEVICE_ACCELERATOR, TB_DEVICE_ACCELERATOR}, 0, 0, TB_OK, false};
    tb_backend_impl impl = test_impl(&t);
    tb_device_type type;
    int32_t ordinal;
    tb_device d;
    tb_device_info info;
    char *report;
    (void)state;
    impl.get_default_device_type = hook_get_type;
    impl.set_default_device_type = hook_set_type;
    impl.get_default_device_ordinal = hook_get_ordinal;
    impl.set_default_device_ordinal = hook_set_ordinal;
    impl.eager_fallback_device_type = hook_fallback;
    impl.create_metrics_report = hook_report;
    impl.get_device_info = hook_info;
    hooked_ordinal = 0;
    assert_int_equal(tb_backend_register("hooked", &impl, NULL), TB_OK);
    assert_int_equal(tb_backend_get_default_device_type("hooked", &type), TB_OK);
    assert_int_equal(type, TB_DEVICE_ACCELERATOR);
    assert_int_equal(tb_backend_set_default_device_type("hooked", TB_DEVICE_GPU),
                     TB_ERR_UNSUPPORTED);
    assert_string_equal(tb_last_error(), "hooked: no");
    assert_int_equal(tb_backend_set_default_device_ordinal("hooked", 1), TB_OK);
    assert_int_equal(tb_backend_get_default_device_ordinal("hooked", &ordinal), TB_OK);
    assert_int_equal(ordinal, 1);
    assert_int_equal(tb_backend_default_device("hooked", &d), TB_OK);
    assert_int_equal(d.ordinal, 1);
    assert_int_equal(tb_backend_set_default_device_ordinal("hooked", 5), TB_ERR_NOT_FOUND);
    assert_non_null(strstr(tb_last_error(), "backend 'hooked': set_default_device_ordinal failed"));
    assert_int_equal(tb_backend_eager_fallback_device_type("hooked", &type), TB_OK);
    assert_int_equal(type, TB_DEVICE_GPU);
    report = tb_backend_metrics_report("hooked");
    assert_non_null(report);
    assert_int_equal(strlen(report), 1499);
    tb_free(report);
    assert_int_equal(tb_backend_device_info(&d, &info), TB_OK);
    assert_string_equal(info.name, "hooked 1");
    assert_int_equal(info.compute_units, 7);
    assert_int_equal(info.device.ordinal, 1);
    assert_string_equal(info.device.backend, "hooked");
}

/* ---- allocation failures and shutdown order ---- */

/* An allocator hook that counts live blocks and refuses the calls numbered fail_at ..
   fail_at + fail_n - 1 (counted from 0 at arming). Each block has a header in front, so a
   block given to another allocator's free is caught by the address sanitizer. */
typedef struct hook_allocator {
    pthread_mutex_t lock;
    long live;
    long calls; /* since arming */
    long fail_at, fail_n;
    long refused;
} hook_allocator;

#define HOOK_HEADER 32

static hook_allocator g_hook = {PTHREAD_MUTEX_INITIALIZER, 0, 0, -1, 0, 0};

static void *hook_alloc(size_t size, void *user_data) {
    hook_allocator *h = (hook_allocator *)user_data;
    unsigned char *p = NULL;
    bool refuse;
    pthread_mutex_lock(&h->lock);
    refuse = h->fail_at >= 0 && h->calls >= h->fail_at && h->calls - h->fail_at < h->fail_n;
    h->calls++;
    if (refuse) {
        h->refused++;
    } else {
        p = (unsigned char *)malloc(size + HOOK_HEADER);
        if (p != NULL) h->live++;
    }
    pthread_mutex_unlock(&h->lock);
    return p != NULL ? p + HOOK_HEADER : NULL;
}

static void hook_free(void *ptr, void *user_data) {
    hook_allocator *h = (hook_allocator *)user_data;
    pthread_mutex_lock(&h->lock);
    h->live--;
    pthread_mutex_unlock(&h->lock);
    free((unsigned char *)ptr - HOOK_HEADER);
}

static void hook_arm(long fail_at, long fail_n) {
    pthread_mutex_lock(&g_hook.lock);
    g_hook.calls = 0;
    g_hook.refused = 0;
    g_hook.fail_at = fail_at;
    g_hook.fail_n = fail_n;
    pthread_mutex_unlock(&g_hook.lock);
}

static void hook_setup(void) {
    tb_desc desc;
    tb_shutdown();
    hook_arm(-1, 0);
    g_hook.live = 0;
    memset(&desc, 0, sizeof desc);
    desc.allocator.alloc = hook_alloc;
    desc.allocator.free = hook_free;
    desc.allocator.user_data = &g_hook;
    assert_int_equal(tb_setup(&desc), TB_OK);
}

/* 2 * [1, 2, 3] on the cpu backend. */
static void check_cpu_computes(void) {
    float in[3] = {1, 2, 3}, out[3] = {0, 0, 0};
    tb_shape shape = tb_shape_of(TB_F32, 1, 3);
    tb_device cpu;
    tb_tensor *x, *y;
    assert_int_equal(tb_device_make("cpu", 0, &cpu), TB_OK);
    x = tb_tensor_from_host(in, &shape, &cpu);
    y = tb_add(x, x);
    assert_int_equal(tb_tensor_to_host(y, out, sizeof out), TB_OK);
    assert_true(out[0] == 2 && out[1] == 4 && out[2] == 6);
    tb_tensor_release(x);
    tb_tensor_release(y);
}

/* A transient failure while the built-in backends register is reported with its cause and
   tried again at the next use (it used to leave 'cpu' unknown until tb_shutdown). */
static void test_builtin_registration_retried(void **state) {
    long k;
    (void)state;
    unsetenv("TB_BACKEND_PATH"); /* no plugin search: only the registry answers (reset restores) */
    /* every allocation refused */
    hook_setup();
    hook_arm(0, 1000000);
    assert_null(tb_backend_lookup("cpu"));
    assert_int_equal(tb_last_status(), TB_ERR_OUT_OF_MEMORY);
    assert_starts_with(tb_last_error(), "tb_backend_lookup: cannot register the built-in "
                                        "backend 'cpu': tb: out of memory allocating ");
    assert_false(tb_has_backend("cpu"));
    hook_arm(-1, 0);
    assert_non_null(tb_backend_lookup("cpu"));
    assert_string_equal(tb_get_backend(), "cpu");
    check_cpu_computes();
    /* one refused allocation at each point of the registration in turn */
    for (k = 0;; k++) {
        tb_backend *b;
        hook_setup();
        hook_arm(k, 1);
        b = tb_backend_lookup("cpu");
        if (g_hook.refused == 0) {
            assert_non_null(b);
            break; /* past the last allocation */
        }
        if (b == NULL) {
            if (tb_last_status() != TB_ERR_OUT_OF_MEMORY ||
                strstr(tb_last_error(), "out of memory") == NULL) {
                fail_msg("allocation %ld refused: status %d, '%s'", k, (int)tb_last_status(),
                         tb_last_error());
            }
        }
        hook_arm(-1, 0);
        assert_non_null(tb_backend_lookup("cpu"));
#if !defined(TB_NO_OPENCL)
        assert_non_null(tb_backend_lookup("opencl"));
#endif
        check_cpu_computes();
        tb_shutdown();
        assert_int_equal(g_hook.live, 0);
    }
    assert_true(k > 2);
}

static int g_exit_metrics_calls;

/* prepare_to_exit of a backend that keeps metrics (as the opencl backend does). */
static void exit_with_metrics(void *u) {
    (void)u;
    g_exit_metrics_calls++;
    tb_metrics_add("ExitBackend::Released", 1);
    tb_metrics_sample("ExitBackend::ReleaseTime", 1000.0);
}

/* tb_shutdown tears the layers down in an order where nothing records a metric or allocates
   after its owner is gone: a backend's prepare_to_exit may still record metrics. */
static void test_shutdown_order_metrics(void **state) {
    static test_backend t; /* static: prepare_to_exit runs in tb_shutdown */
    tb_backend_impl impl;
    char *report;
    (void)state;
    t = one_cpu;
    impl = test_impl(&t);
    impl.prepare_to_exit = exit_with_metrics;
    g_exit_metrics_calls = 0;
    hook_setup();
    assert_int_equal(tb_backend_register("exiting", &impl, NULL), TB_OK);
    check_cpu_computes();
    tb_metrics_add("ExitBackend::Before", 1);
    tb_shutdown();
    assert_int_equal(g_exit_metrics_calls, 1);
    assert_int_equal(g_hook.live, 0); /* every block of the hook given back */
    /* a new session with the default allocator starts from nothing and frees only its own */
    assert_int_equal(tb_setup(NULL), TB_OK);
    assert_int_equal(tb_metrics_counter("ExitBackend::Released"), 0);
    assert_int_equal(tb_metrics_counter("ExitBackend::Before"), 0);
    tb_metrics_add("ExitBackend::After", 2);
    report = tb_metrics_report();
    assert_non_null(report);
    assert_null(strstr(report, "ExitBackend::Released"));
    assert_non_null(strstr(report, "ExitBackend::After"));
    tb_free(report);
    check_cpu_computes();
    tb_metrics_reset();
    tb_shutdown();
}

/* ---- plugins ---- */

static const char *plugin_dir(void) {
    const char *dir = getenv("TB_BACKEND_PATH");
#if defined(TB_NO_PLUGINS)
    print_message("skipped: built with TB_NO_PLUGINS\n");
    skip();
#endif
    if (dir == NULL || dir[0] == '\0') {
        print_message("skipped: TB_BACKEND_PATH is not set (build the plugins with "
                      "tests/plugins/build.sh DIR and set TB_BACKEND_PATH=DIR)\n");
        skip();
    }
    return dir;
}

/* The plugin's path in the first folder of TB_BACKEND_PATH; fails if it was not built. */
static void plugin_path(const char *name, char *buf, size_t cap) {
    const char *dir = plugin_dir();
    size_t len = strcspn(dir, ":");
    FILE *f;
    snprintf(buf, cap, "%.*s/libtb_backend_%s.so", (int)len, dir, name);
    f = fopen(buf, "rb");
    if (f == NULL) fail_msg("%s is missing: run tests/plugins/build.sh %.*s", buf, (int)len, dir);
    fclose(f);
}

static void test_plugin_found_on_path(void **state) {
    char path[1024];
    tb_backend *b;
    tb_device d;
    tb_device_info info;
    tb_backend_data *data;
    float in[4] = {1, 2, 3, 4}, out[4] = {0, 0, 0, 0};
    tb_shape shape = tb_shape_of(TB_F32, 1, 4);
    (void)state;
    plugin_path("plugin", path, sizeof path);
    assert_true(tb_has_backend("plugin"));
    b = tb_backend_lookup("plugin");
    assert_non_null(b);
    assert_string_equal(tb_backend_name(b), "plugin");
    assert_true(tb_backend_has_tag(b, "example"));
    assert_int_equal(tb_device_parse("plugin:0", &d), TB_OK);
    assert_int_equal(d.type, TB_DEVICE_ACCELERATOR);
    assert_int_equal(tb_backend_device_info(&d, &info), TB_OK);
    assert_string_equal(info.name, "plugin device");
    data = tb__data_from_host(&d, &shape, in);
    assert_non_null(data);
    assert_int_equal(tb__data_to_host(data, out), TB_OK);
    assert_memory_equal(in, out, sizeof in);
    assert_null(tb__host_data(data)); /* not a cpu payload */
    tb__data_release(data);
    /* unloaded at shutdown, found again afterwards */
    tb_shutdown();
    assert_non_null(tb_backend_lookup("plugin"));
}

static void test_plugin_explicit_load(void **state) {
    char path[1024];
    (void)state;
    plugin_path("plugin", path, sizeof path);
    assert_int_equal(tb_backend_load_plugin(path), TB_OK);
    assert_true(tb_has_backend("plugin"));
    assert_int_equal(tb_backend_load_plugin(path), TB_ERR_DUPLICATE);
    assert_string_equal(tb_last_error(), "tb_backend_load_plugin: duplicate name: plugin");
    assert_int_equal(tb_backend_load_plugin("/nonexistent/libtb_backend_x.so"), TB_ERR_IO);
    assert_starts_with(tb_last_error(),
                       "tb_backend_load_plugin: cannot open /nonexistent/libtb_backend_x.so: ");
    assert_null(strstr(tb_last_error(), "Success"));
    /* a folder: stat succeeds, so errno says nothing (it used to give "Success") */
    errno = 0;
    assert_int_equal(tb_backend_load_plugin("/tmp"), TB_ERR_IO);
    assert_string_equal(tb_last_error(), "tb_backend_load_plugin: cannot open /tmp: it is a "
                                         "directory");
    assert_int_equal(tb_backend_load_plugin(NULL), TB_ERR_INVALID_ARGUMENT);
    /* a file that is not a shared object */
    {
        FILE *f = fopen("/tmp/tb_test_not_a_plugin.so", "wb");
        assert_non_null(f);
        fputs("not an ELF file", f);
        fclose(f);
        assert_int_equal(tb_backend_load_plugin("/tmp/tb_test_not_a_plugin.so"), TB_ERR_PLUGIN);
        assert_non_null(strstr(tb_last_error(), "cannot load plugin /tmp/tb_test_not_a_plugin.so"));
        remove("/tmp/tb_test_not_a_plugin.so");
    }
}

typedef struct bad_plugin_case {
    const char *name;
    const char *reason; /* a part of the message */
} bad_plugin_case;

/* Memory running out while a plugin loads is TB_ERR_OUT_OF_MEMORY, naming the plugin, not
   TB_ERR_PLUGIN (which says the plugin is broken): one refused allocation at each point of the
   load in turn; the next load works and nothing is kept. */
static void test_plugin_load_out_of_memory(void **state) {
    char path[1024];
    long k;
    (void)state;
    plugin_path("plugin", path, sizeof path);
    for (k = 0;; k++) {
        tb_status st;
        long refused;
        hook_setup();
        hook_arm(k, 1);
        st = tb_backend_load_plugin(path);
        refused = g_hook.refused;
        hook_arm(-1, 0);
        if (refused == 0) {
            assert_int_equal(st, TB_OK);
            break; /* past the last allocation */
        }
        if (st != TB_OK) {
            if (st != TB_ERR_OUT_OF_MEMORY || strstr(tb_last_error(), "out of memory") == NULL ||
                strstr(tb_last_error(), path) == NULL) {
                fail_msg("allocation %ld refused: %s '%s'", k, tb_status_string(st),
                         tb_last_error());
            }
            {
                const char *names[16];
                size_t n = tb_backend_list(names, 16, true), i;
                for (i = 0; i < n && i < 16; i++) {
                    if (strcmp(names[i], "plugin") == 0)
                        fail_msg("allocation %ld refused: '%s', yet the plugin is registered", k,
                                 tb_last_error());
                }
            }
            assert_int_equal(tb_backend_load_plugin(path), TB_OK);
        }
        assert_non_null(tb_backend_lookup("plugin"));
        tb_shutdown();
        assert_int_equal(g_hook.live, 0);
    }
    assert_true(k > 0);
}

static void test_bad_plugins_rejected(void **state) {
    static const bad_plugin_case cases[] = {
        {"badversion", "was built for API version 4, this library has 3"},
        {"nosymbol", "does not export tb_backend_plugin_entry"},
        {"failinit", "init of backend 'failinit' failed: failinit: no such hardware here"},
        {"mismatch", "registers backend 'somethingelse', expected 'mismatch'"},
        {"entryfail", "tb_backend_plugin_entry failed: entryfail: refusing to load"},
        {"incomplete", "backend 'incomplete' lacks the required entry execute"},
    };
    size_t i, before;
    (void)state;
    before = count_all();
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[1024], file[64];
        plugin_path(cases[i].name, path, sizeof path);
        snprintf(file, sizeof file, "libtb_backend_%s.so", cases[i].name);
        assert_null(tb_backend_lookup(cases[i].name));
        if (tb_last_status() != TB_ERR_PLUGIN || strstr(tb_last_error(), file) == NULL ||
            strstr(tb_last_error(), cases[i].reason) == NULL ||
            strncmp(tb_last_error(), "tb_backend_lookup: ", 19) != 0) {
            fail_msg("%s: status %d, message '%s'", cases[i].name, (int)tb_last_status(),
                     tb_last_error());
        }
        assert_int_equal(count_all(), before);
        assert_false(tb_has_backend(cases[i].name));
        assert_false(tb_has_backend("somethingelse"));
        if (strcmp(cases[i].name, "mismatch") == 0) continue; /* only lookups expect a name */
        /* the same through the explicit loader */
        assert_int_equal(tb_backend_load_plugin(path), TB_ERR_PLUGIN);
        assert_non_null(strstr(tb_last_error(), file));
        assert_int_equal(count_all(), before);
    }
    /* the registry still works */
    assert_non_null(tb_backend_lookup("cpu"));
    /* loaded by path, a plugin may give any name */
    {
        char path[1024];
        plugin_path("mismatch", path, sizeof path);
        assert_int_equal(tb_backend_load_plugin(path), TB_OK);
        assert_true(tb_has_backend("somethingelse"));
        assert_int_equal(count_all(), before + 1);
    }
}

static void touch(const char *dir, const char *file) {
    char path[512];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    f = fopen(path, "wb");
    assert_non_null(f);
    fclose(f);
}

/* tb_backend_list_plugins: the names TB_BACKEND_PATH offers, from file names alone (nothing is
   loaded), sorted, once each, like tb_backend_list fills its array. */
static void test_list_plugins(void **state) {
    char a[] = "/tmp/tb_test_plugins_a_XXXXXX", b[] = "/tmp/tb_test_plugins_b_XXXXXX";
    char path[1200], sub[600];
    char names[8][TB_MAX_NAME + 1];
    static const char *const files[] = {"libtb_backend_zeta.so",     "libtb_backend_alpha.so",
                                        "libtb_backend_bad-name.so", "libtb_backend_.so",
                                        "libtb_backend_mid.so.1",    "notaplugin.so",
                                        "libtb_backend_mid.so"};
    size_t i;
    (void)state;
    assert_non_null(mkdtemp(a));
    assert_non_null(mkdtemp(b));
    for (i = 0; i < sizeof files / sizeof files[0]; i++)
        touch(a, files[i]);
    touch(b, "libtb_backend_alpha.so"); /* in both folders: listed once */
    touch(b, "libtb_backend_beta.so");
    snprintf(sub, sizeof sub, "%s/libtb_backend_folder.so", b); /* not a file */
    assert_int_equal(mkdir(sub, 0700), 0);
    snprintf(path, sizeof path, "%s::/nonexistent/folder:%s", a, b);
    setenv("TB_BACKEND_PATH", path, 1);

    assert_int_equal(tb_backend_list_plugins(NULL, 0), 4);
    assert_int_equal(tb_backend_list_plugins(NULL, 99), 4); /* NULL: the count, whatever cap */
    memset(names, 0, sizeof names);
    assert_int_equal(tb_backend_list_plugins(names, 8), 4);
    assert_string_equal(names[0], "alpha");
    assert_string_equal(names[1], "beta");
    assert_string_equal(names[2], "mid");
    assert_string_equal(names[3], "zeta");
    assert_string_equal(names[4], "");
    memset(names, 0, sizeof names);
    assert_int_equal(tb_backend_list_plugins(names, 2), 4); /* the first two, the full count */
    assert_string_equal(names[1], "beta");
    assert_string_equal(names[2], "");
    assert_false(tb_has_backend("alpha")); /* nothing was loaded: these files are empty */
    unsetenv("TB_BACKEND_PATH");
    assert_int_equal(tb_backend_list_plugins(names, 8), 0);

    for (i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", a, files[i]);
        assert_int_equal(remove(path), 0);
    }
    snprintf(path, sizeof path, "%s/libtb_backend_alpha.so", b);
    assert_int_equal(remove(path), 0);
    snprintf(path, sizeof path, "%s/libtb_backend_beta.so", b);
    assert_int_equal(remove(path), 0);
    assert_int_equal(rmdir(sub), 0);
    assert_int_equal(rmdir(a), 0);
    assert_int_equal(rmdir(b), 0);
}

/* A plugin that builds its own copy of the library (TB_STATIC) and reports errors only through
   that copy's tb_set_error: the host's tb_last_error shows them, from the entry, from init and
   from the backend entries a sync calls. */
static void test_plugin_tb_set_error_reaches_host(void **state) {
    static const float one[2] = {1.0f, 2.0f};
    tb_shape s = tb_shape_of(TB_F32, 1, 2);
    tb_device dev;
    tb_tensor *x, *y;
    float out[2];
    (void)state;
    (void)plugin_dir(); /* skips without plugins */

    assert_null(tb_backend_lookup("seterrorentry"));
    assert_int_equal(tb_last_status(), TB_ERR_PLUGIN);
    if (strstr(tb_last_error(), "tb_backend_plugin_entry failed: seterrorentry: firmware 0.9 is "
                                "too old") == NULL) {
        fail_msg("entry: '%s'", tb_last_error());
    }
    assert_null(tb_backend_lookup("seterrorinit"));
    assert_int_equal(tb_last_status(), TB_ERR_PLUGIN);
    if (strstr(tb_last_error(), "init of backend 'seterrorinit' failed: seterrorinit: the card "
                                "is not plugged in") == NULL) {
        fail_msg("init: '%s'", tb_last_error());
    }

    assert_int_equal(tb_device_make("seterror", 0, &dev), TB_OK);
    x = tb_tensor_from_host(one, &s, &dev);
    assert_non_null(x);
    y = tb_neg(x);
    assert_non_null(y);
    assert_int_equal(tb_tensor_to_host(y, out, sizeof out), TB_ERR_EXECUTE);
    assert_string_equal(tb_last_error(), "tb_tensor_to_host: backend 'seterror': execute: "
                                         "seterror: the device fell off the bus");
    /* a success after it leaves the host's error alone */
    assert_int_equal(tb_tensor_to_host(x, out, sizeof out), TB_OK);
    assert_true(out[1] == 2.0f);
    assert_int_equal(tb_last_status(), TB_ERR_EXECUTE);
    tb_tensor_release(y);
    tb_tensor_release(x);
}

/* Plugins whose strings are hostile and live in the plugin's own memory: the host must quote
   them from copies taken before it unloads the object (each used to crash the host). */
static void test_hostile_plugins_rejected(void **state) {
    static const bad_plugin_case cases[] = {
        {"slashname", "gives a bad backend name 'bad/name' (expected [A-Za-z_][A-Za-z0-9_]*"},
        {"colonname", "gives a bad backend name 'bad:name' (expected [A-Za-z_][A-Za-z0-9_]*"},
        {"longname", "gives a backend name longer than 31 bytes ('aaaaaaaaaaaaaaaa"},
        {"nullname", "gives no backend name (NULL)"},
        {"emptyname", "gives an empty backend name"},
        {"ctrlname", "gives a bad backend name 'ctrl?name?[31m'"},
        {"longtags", "bad tags '!!!!!!!!!!!!!!!!"},
    };
    size_t i, k, before;
    (void)state;
    before = count_all();
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[1024], file[64];
        int round;
        plugin_path(cases[i].name, path, sizeof path);
        snprintf(file, sizeof file, "libtb_backend_%s.so", cases[i].name);
        for (round = 0; round < 2; round++) {
            const char *fn = round == 0 ? "tb_backend_lookup: " : "tb_backend_load_plugin: ";
            if (round == 0) {
                assert_null(tb_backend_lookup(cases[i].name));
            } else {
                assert_int_equal(tb_backend_load_plugin(path), TB_ERR_PLUGIN);
            }
            if (tb_last_status() != TB_ERR_PLUGIN || strstr(tb_last_error(), file) == NULL ||
                strstr(tb_last_error(), cases[i].reason) == NULL ||
                strncmp(tb_last_error(), fn, strlen(fn)) != 0) {
                fail_msg("%s: status %d, message '%s'", cases[i].name, (int)tb_last_status(),
                         tb_last_error());
            }
            /* the message quotes printable text only, and not all 10 KB of it */
            for (k = 0; tb_last_error()[k] != '\0'; k++) {
                unsigned char c = (unsigned char)tb_last_error()[k];
                if (c < 0x20 || c > 0x7e) fail_msg("%s: byte %u in the message", cases[i].name, c);
            }
            assert_true(k < 1000);
            assert_int_equal(count_all(), before);
            assert_false(tb_has_backend(cases[i].name));
        }
    }
    /* the registry still works */
    assert_non_null(tb_backend_lookup("cpu"));
    assert_non_null(tb_backend_lookup("plugin"));
}

/* ---- concurrency ---- */

typedef struct thread_arg {
    int index;
    test_backend *backend;
    pthread_barrier_t *barrier;
    tb_status status;
    int lookups_ok;
} thread_arg;

static void *register_distinct(void *p) {
    thread_arg *a = (thread_arg *)p;
    tb_backend_impl impl = test_impl(a->backend);
    char name[16], other[16];
    int round, j;
    snprintf(name, sizeof name, "thr_%d", a->index);
    pthread_barrier_wait(a->barrier);
    a->status = tb_backend_register(name, &impl, a->index % 2 ? "debug" : NULL);
    for (round = 0; round < 50; round++) {
        for (j = 0; j < 8; j++) {
            snprintf(other, sizeof other, "thr_%d", j);
            if (tb_backend_lookup(name) != NULL) a->lookups_ok++;
            (void)tb_has_backend(other);
        }
        (void)tb_backend_list(NULL, 0, true);
    }
    return NULL;
}

static void test_threads_register_distinct(void **state) {
    pthread_t threads[8];
    thread_arg args[8];
    test_backend backends[8];
    pthread_barrier_t barrier;
    const char *names[32];
    size_t n, i;
    int k;
    (void)state;
    (void)tb_get_backend(); /* not needed, but the built-ins may as well race too: */
    tb_shutdown();
    pthread_barrier_init(&barrier, NULL, 8);
    for (k = 0; k < 8; k++) {
        backends[k] = one_cpu;
        memset(&args[k], 0, sizeof args[k]);
        args[k].index = k;
        args[k].backend = &backends[k];
        args[k].barrier = &barrier;
        assert_int_equal(pthread_create(&threads[k], NULL, register_distinct, &args[k]), 0);
    }
    for (k = 0; k < 8; k++)
        pthread_join(threads[k], NULL);
    pthread_barrier_destroy(&barrier);
    for (k = 0; k < 8; k++) {
        assert_int_equal(args[k].status, TB_OK);
        assert_int_equal(args[k].lookups_ok, 50 * 8);
        assert_int_equal(backends[k].init_calls, 1);
    }
    n = tb_backend_list(names, 32, true);
    for (k = 0; k < 8; k++) {
        char name[16];
        bool found = false;
        snprintf(name, sizeof name, "thr_%d", k);
        for (i = 0; i < n; i++)
            found = found || strcmp(names[i], name) == 0;
        assert_true(found);
    }
    assert_true(tb_has_backend("cpu"));
}

static void *register_same(void *p) {
    thread_arg *a = (thread_arg *)p;
    tb_backend_impl impl = test_impl(a->backend);
    pthread_barrier_wait(a->barrier);
    a->status = tb_backend_register("same", &impl, NULL);
    return NULL;
}

static void test_threads_register_same_name(void **state) {
    pthread_t threads[8];
    thread_arg args[8];
    test_backend backends[8];
    pthread_barrier_t barrier;
    int k, ok = 0, dup = 0, inits = 0;
    (void)state;
    pthread_barrier_init(&barrier, NULL, 8);
    for (k = 0; k < 8; k++) {
        backends[k] = one_cpu;
        memset(&args[k], 0, sizeof args[k]);
        args[k].backend = &backends[k];
        args[k].barrier = &barrier;
        assert_int_equal(pthread_create(&threads[k], NULL, register_same, &args[k]), 0);
    }
    for (k = 0; k < 8; k++)
        pthread_join(threads[k], NULL);
    pthread_barrier_destroy(&barrier);
    for (k = 0; k < 8; k++) {
        if (args[k].status == TB_OK) ok++;
        if (args[k].status == TB_ERR_DUPLICATE) dup++;
        inits += backends[k].init_calls;
    }
    assert_int_equal(ok, 1);
    assert_int_equal(dup, 7);
    assert_int_equal(inits, 1);
    assert_true(tb_has_backend("same"));
}

static void *lookup_plugin(void *p) {
    thread_arg *a = (thread_arg *)p;
    pthread_barrier_wait(a->barrier);
    if (tb_backend_lookup("plugin") != NULL) a->lookups_ok = 1;
    return NULL;
}

static void test_threads_load_plugin_once(void **state) {
    char path[1024];
    pthread_t threads[8];
    thread_arg args[8];
    pthread_barrier_t barrier;
    int k, ok = 0;
    size_t before;
    (void)state;
    plugin_path("plugin", path, sizeof path);
    before = count_all();
    pthread_barrier_init(&barrier, NULL, 8);
    for (k = 0; k < 8; k++) {
        memset(&args[k], 0, sizeof args[k]);
        args[k].barrier = &barrier;
        assert_int_equal(pthread_create(&threads[k], NULL, lookup_plugin, &args[k]), 0);
    }
    for (k = 0; k < 8; k++)
        pthread_join(threads[k], NULL);
    pthread_barrier_destroy(&barrier);
    for (k = 0; k < 8; k++)
        ok += args[k].lookups_ok;
    /* one thread loads it, the others wait for its init and find it */
    assert_int_equal(ok, 8);
    assert_int_equal(count_all(), before + 1);
    assert_non_null(tb_backend_lookup("plugin"));
}

/* ---- the cpu backend's data ---- */

static void fill_pattern(tb_dtype dtype, void *buf, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        switch (dtype) {
        case TB_F32:
            ((float *)buf)[i] = (float)i * 1.5f - 2.0f;
            break;
        case TB_F64:
            ((double *)buf)[i] = (double)i * -0.25 + 1e10;
            break;
        case TB_I32:
            ((int32_t *)buf)[i] = (int32_t)(i * 100000) - 7;
            break;
        case TB_I64:
            ((int64_t *)buf)[i] = (int64_t)i * INT64_C(1000000000000) - 3;
            break;
        case TB_U8:
            ((uint8_t *)buf)[i] = (uint8_t)(250 + i);
            break;
        case TB_BOOL:
            ((uint8_t *)buf)[i] = (uint8_t)(i % 2);
            break;
        default:
            break;
        }
    }
}

static void test_cpu_data_round_trip(void **state) {
    static const tb_dtype dtypes[6] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_BOOL};
    tb_device cpu;
    int k;
    int64_t handles;
    (void)state;
    assert_int_equal(tb_device_parse("cpu:0", &cpu), TB_OK);
    handles = tb_metrics_counter("CreateDataHandles");
    for (k = 0; k < 6; k++) {
        unsigned char in[6 * 8], out[6 * 8 + 1];
        tb_shape shape = tb_shape_of(dtypes[k], 2, 2, 3);
        size_t nbytes = 6 * tb_dtype_size(dtypes[k]);
        tb_backend_data *d;
        fill_pattern(dtypes[k], in, 6);
        memset(out, 0xee, sizeof out);
        d = tb__data_from_host(&cpu, &shape, in);
        assert_non_null(d);
        assert_true(tb_shape_equal(&d->shape, &shape));
        assert_string_equal(d->device.backend, "cpu");
        assert_non_null(d->payload);
        assert_false(d->is_scalar);
        /* a copy, not the caller's array */
        assert_true(tb__host_data(d) != (void *)in);
        assert_memory_equal(tb__host_data(d), in, nbytes);
        memset(in, 0, sizeof in);
        assert_int_equal(tb__data_to_host(d, out), TB_OK);
        fill_pattern(dtypes[k], in, 6);
        assert_memory_equal(out, in, nbytes);
        assert_int_equal(out[nbytes], 0xee); /* nothing written past the end */
        tb__data_retain(d);
        tb__data_release(d);
        assert_int_equal(tb__data_to_host(d, out), TB_OK); /* still alive */
        tb__data_release(d);
    }
    assert_int_equal(tb_metrics_counter("CreateDataHandles") - handles, 6);
    assert_true(tb_metrics_counter("TransferToDeviceTime") >= 6);
    assert_true(tb_metrics_counter("TransferFromDeviceTime") >= 12);
}

static int releases;

static void count_release(void *context) {
    ++*(int *)context;
}

static void test_cpu_data_scalar_borrow_and_errors(void **state) {
    tb_device cpu, none;
    tb_backend_data *d;
    int32_t i32 = 0;
    float values[3] = {1, 2, 3}, out[3];
    double f64 = 0;
    tb_shape shape = tb_shape_of(TB_F32, 1, 3), empty = tb_shape_of(TB_F32, 1, 0);
    (void)state;
    assert_int_equal(tb_device_parse("cpu", &cpu), TB_OK);
    d = tb__data_from_scalar(&cpu, tb_scalar_f(TB_I32, 3.7));
    assert_non_null(d);
    assert_true(d->is_scalar);
    assert_int_equal(d->shape.rank, 0);
    assert_int_equal(d->shape.dtype, TB_I32);
    assert_int_equal(tb__data_to_host(d, &i32), TB_OK);
    assert_int_equal(i32, 3);
    tb__data_release(d);
    d = tb__data_from_scalar(&cpu, tb_scalar_f(TB_F64, -0.5));
    assert_int_equal(tb__data_to_host(d, &f64), TB_OK);
    assert_true(f64 == -0.5);
    tb__data_release(d);

    /* borrowing: the cpu backend uses the array in place */
    d = tb__data_borrow_host(&cpu, &shape, values, NULL, NULL);
    assert_non_null(d);
    assert_true(tb__host_data(d) == (void *)values);
    values[1] = 20;
    assert_int_equal(tb__data_to_host(d, out), TB_OK);
    assert_true(out[1] == 20);
    tb__data_release(d); /* does not free the caller's array */
    assert_true(values[0] == 1);
    /* the release callback runs once, when the data no longer needs the array */
    releases = 0;
    d = tb__data_borrow_host(&cpu, &shape, values, count_release, &releases);
    assert_non_null(d);
    tb__data_retain(d);
    tb__data_release(d);
    assert_int_equal(releases, 0);
    tb__data_release(d);
    assert_int_equal(releases, 1);

    /* size 0 */
    d = tb__data_from_host(&cpu, &empty, NULL);
    assert_non_null(d);
    assert_int_equal(tb__data_to_host(d, NULL), TB_OK);
    tb__data_release(d);

    /* errors */
    tb_clear_error();
    memset(&none, 0, sizeof none);
    snprintf(none.backend, sizeof none.backend, "ghost");
    releases = 0;
    /* cannot borrow: no error, and the callback stays the caller's */
    assert_null(tb__data_borrow_host(&none, &shape, values, count_release, &releases));
    assert_int_equal(releases, 0);
    assert_int_equal(tb_last_status(), TB_OK);
    assert_null(tb__data_from_host(&none, &shape, values));
    assert_int_equal(tb_last_status(), TB_ERR_NOT_FOUND);
    assert_non_null(strstr(tb_last_error(), "unknown backend 'ghost'"));
    assert_null(tb__data_from_host(&cpu, &shape, NULL));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    shape.rank = -1;
    assert_null(tb__data_from_host(&cpu, &shape, values));
    assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
    assert_int_equal(tb__data_to_host(NULL, out), TB_ERR_INVALID_ARGUMENT);
}

/* The cpu backend's lowering, compile and execute, driven directly through its vtable. */
static void test_cpu_backend_computation(void **state) {
    const tb_backend_impl *vt;
    tb_device cpu;
    tb_shape shape = tb_shape_of(TB_F32, 1, 4);
    float av[4] = {1, 2, 3, 4}, bv[4] = {10, 20, 30, 40}, out[4];
    tb_backend_data *a, *b, *result;
    tb_node *na, *nb, *sum;
    const tb_node *nodes[3], *params[2], *results[1];
    tb_backend_data *args[2];
    tb_graph g;
    void *ctx = NULL, *comp = NULL;
    const char *text;
    int i;
    (void)state;
    assert_int_equal(tb_device_parse("cpu:0", &cpu), TB_OK);
    vt = tb_backend_get_impl(tb_backend_lookup("cpu"));
    a = tb__data_from_host(&cpu, &shape, av);
    b = tb__data_from_host(&cpu, &shape, bv);
    na = tb__node_device_data(a);
    nb = tb__node_device_data(b);
    {
        tb_node *ops[2];
        ops[0] = na;
        ops[1] = nb;
        sum = tb__node_new(TB_OP_ADD, &shape, &cpu, ops, 2, NULL, 0, NULL);
    }
    assert_non_null(sum);
    nodes[0] = na;
    nodes[1] = nb;
    nodes[2] = sum;
    params[0] = na;
    params[1] = nb;
    results[0] = sum;
    memset(&g, 0, sizeof g);
    g.nodes = nodes;
    g.num_nodes = 3;
    g.parameters = params;
    g.num_parameters = 2;
    g.results = results;
    g.num_results = 1;
    g.hash = tb_node_hash(sum);
    g.device = cpu;
    assert_int_equal(vt->create_lowering_context(vt->user_data, &g, &ctx), TB_OK);
    assert_int_equal(vt->compile(vt->user_data, ctx, &comp), TB_OK);
    vt->release_lowering_context(vt->user_data, ctx); /* after compile: frees no program */
    /* the graph's nodes may go: the computation keeps a copy of the structure only */
    tb__node_release(sum);
    tb__node_release(na);
    tb__node_release(nb);
    /* ... and no value: the cached computation does not keep the tensors' data alive */
    assert_int_equal(a->tb__refcount, 1);
    assert_int_equal(b->tb__refcount, 1);
    text = vt->computation_backend_text(vt->user_data, comp);
    assert_non_null(text);
    assert_non_null(strstr(text, "3 nodes, 2 parameters, 1 results"));
    assert_non_null(strstr(text, "%0 = device_data() f32[4]\n"));
    assert_non_null(strstr(text, "%2 = add(%0, %1) f32[4]\n"));
    assert_true(text == vt->computation_backend_text(vt->user_data, comp)); /* built once */

    args[0] = a;
    args[1] = b;
    result = tb__data_new(tb_backend_lookup("cpu"), &cpu, &shape);
    assert_int_equal(vt->execute(vt->user_data, comp, args, 2, &result, 1), TB_OK);
    assert_non_null(result->payload);
    assert_int_equal(tb__data_to_host(result, out), TB_OK);
    for (i = 0; i < 4; i++)
        assert_true(out[i] == av[i] + bv[i]);
    /* running again replaces the value */
    av[0] = 100;
    memcpy(tb__host_data(a), av, sizeof av);
    assert_int_equal(vt->execute(vt->user_data, comp, args, 2, &result, 1), TB_OK);
    assert_int_equal(tb__data_to_host(result, out), TB_OK);
    assert_true(out[0] == 110);
    /* wrong argument counts are refused */
    assert_int_equal(vt->execute(vt->user_data, comp, args, 1, &result, 1),
                     TB_ERR_INVALID_ARGUMENT);
    tb__data_release(result);
    vt->release_computation(vt->user_data, comp);
    tb__data_release(a);
    tb__data_release(b);

    /* a lowering context released without compile frees its program */
    {
        tb_node *leaf;
        const tb_node *one[1];
        a = tb__data_from_host(&cpu, &shape, av);
        leaf = tb__node_device_data(a);
        one[0] = leaf;
        memset(&g, 0, sizeof g);
        g.nodes = one;
        g.num_nodes = 1;
        g.parameters = one;
        g.num_parameters = 1;
        g.results = one;
        g.num_results = 1;
        g.device = cpu;
        assert_int_equal(vt->create_lowering_context(vt->user_data, &g, &ctx), TB_OK);
        vt->release_lowering_context(vt->user_data, ctx);
        tb__node_release(leaf);
        tb__data_release(a);
    }
}

int main(void) {
    int failed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_builtin_cpu, reset, reset),
        cmocka_unit_test_setup_teardown(test_register_and_lookup, reset, reset),
        cmocka_unit_test_setup_teardown(test_null_handles, reset, reset),
        cmocka_unit_test_setup_teardown(test_count_without_array, reset, reset),
        cmocka_unit_test_setup_teardown(test_list_sorted_and_hidden, reset, reset),
        cmocka_unit_test_setup_teardown(test_duplicate, reset, reset),
        cmocka_unit_test_setup_teardown(test_bad_names_and_tags, reset, reset),
        cmocka_unit_test_setup_teardown(test_missing_required_entries, reset, reset),
        cmocka_unit_test_setup_teardown(test_init_failure, reset, reset),
        cmocka_unit_test_setup_teardown(test_init_may_call_the_library, reset, reset),
        cmocka_unit_test_setup_teardown(test_unknown_lookup_lists_available, reset, reset),
        cmocka_unit_test_setup_teardown(test_set_and_get_backend, reset, reset),
        cmocka_unit_test_setup_teardown(test_default_backend_from_env_and_desc, reset, reset),
        cmocka_unit_test_setup_teardown(test_default_backend_from_env_plugin, reset, reset),
        cmocka_unit_test_setup_teardown(test_default_device_kept_by_library, reset, reset),
        cmocka_unit_test_setup_teardown(test_cpu_defaults_and_info, reset, reset),
        cmocka_unit_test_setup_teardown(test_backend_hooks, reset, reset),
        cmocka_unit_test_setup_teardown(test_builtin_registration_retried, reset, reset),
        cmocka_unit_test_setup_teardown(test_shutdown_order_metrics, reset, reset),
        cmocka_unit_test_setup_teardown(test_plugin_found_on_path, reset, reset),
        cmocka_unit_test_setup_teardown(test_plugin_explicit_load, reset, reset),
        cmocka_unit_test_setup_teardown(test_plugin_load_out_of_memory, reset, reset),
        cmocka_unit_test_setup_teardown(test_bad_plugins_rejected, reset, reset),
        cmocka_unit_test_setup_teardown(test_hostile_plugins_rejected, reset, reset),
        cmocka_unit_test_setup_teardown(test_plugin_tb_set_error_reaches_host, reset, reset),
        cmocka_unit_test_setup_teardown(test_list_plugins, reset, reset),
        cmocka_unit_test_setup_teardown(test_threads_register_distinct, reset, reset),
        cmocka_unit_test_setup_teardown(test_threads_register_same_name, reset, reset),
        cmocka_unit_test_setup_teardown(test_threads_load_plugin_once, reset, reset),
        cmocka_unit_test_setup_teardown(test_cpu_data_round_trip, reset, reset),
        cmocka_unit_test_setup_teardown(test_cpu_data_scalar_borrow_and_errors, reset, reset),
        cmocka_unit_test_setup_teardown(test_cpu_backend_computation, reset, reset),
    };
    if (getenv("TB_BACKEND_PATH") != NULL) g_backend_path = strdup(getenv("TB_BACKEND_PATH"));
    failed = cmocka_run_group_tests(tests, NULL, NULL);
    free(g_backend_path);
    return failed;
}
