/* Base layer: status strings, thread-local errors, setup and shutdown, allocator and logger
   hooks, hashing, strings, mutexes. */
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

static int reset(void **state) {
    (void)state;
    tb_shutdown();
    tb_clear_error();
    unsetenv("TB_DEBUG");
    unsetenv("TB_CHECK");
    return 0;
}

static bool starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* ---- status strings ---- */

static void test_status_strings(void **state) {
    static const char *const names[TB_STATUS_COUNT] = {"TB_OK",
                                                       "TB_ERR_INVALID_ARGUMENT",
                                                       "TB_ERR_DTYPE",
                                                       "TB_ERR_SHAPE",
                                                       "TB_ERR_OVERFLOW",
                                                       "TB_ERR_OUT_OF_MEMORY",
                                                       "TB_ERR_NOT_FOUND",
                                                       "TB_ERR_DUPLICATE",
                                                       "TB_ERR_UNSUPPORTED",
                                                       "TB_ERR_UNAVAILABLE",
                                                       "TB_ERR_COMPILE",
                                                       "TB_ERR_EXECUTE",
                                                       "TB_ERR_IO",
                                                       "TB_ERR_FORMAT",
                                                       "TB_ERR_PLUGIN",
                                                       "TB_ERR_STATE",
                                                       "TB_ERR_INTERNAL"};
    int i, j;
    (void)state;
    for (i = 0; i < (int)TB_STATUS_COUNT; i++) {
        const char *s = tb_status_string((tb_status)i);
        char prefix[64];
        assert_non_null(s);
        snprintf(prefix, sizeof prefix, "%s: ", names[i]);
        assert_true(starts_with(s, prefix));
        assert_true(strlen(s) > strlen(prefix)); /* a description follows the name */
        for (j = 0; j < i; j++)
            assert_string_not_equal(s, tb_status_string((tb_status)j));
    }
    assert_string_equal(tb_status_string(TB_ERR_SHAPE), "TB_ERR_SHAPE: shape mismatch");
    assert_string_equal(tb_status_string(TB_STATUS_COUNT), "unknown status");
    assert_string_equal(tb_status_string((tb_status)-1), "unknown status");
    assert_string_equal(tb_status_string((tb_status)1000), "unknown status");
}

/* ---- errors ---- */

static void test_set_error(void **state) {
    char long_text[3000];
    (void)state;
    assert_int_equal(tb_last_status(), TB_OK);
    assert_string_equal(tb_last_error(), "");
    assert_int_equal(tb_set_error(TB_ERR_EXECUTE, "mydev: queue %d lost", 3), TB_ERR_EXECUTE);
    assert_int_equal(tb_last_status(), TB_ERR_EXECUTE);
    assert_string_equal(tb_last_error(), "mydev: queue 3 lost");
    /* the message may quote the previous one */
    tb_set_error(TB_ERR_IO, "outer: %s", tb_last_error());
    assert_string_equal(tb_last_error(), "outer: mydev: queue 3 lost");
    assert_int_equal(tb_last_status(), TB_ERR_IO);
    /* long messages are cut at 1023 bytes */
    memset(long_text, 'x', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';
    tb_set_error(TB_ERR_INTERNAL, "%s", long_text);
    assert_int_equal(strlen(tb_last_error()), 1023);
    assert_true(tb_last_error()[0] == 'x' && tb_last_error()[1022] == 'x');
    /* no format: the status's description, never an empty message */
    assert_int_equal(tb_set_error(TB_ERR_EXECUTE, NULL), TB_ERR_EXECUTE);
    assert_int_equal(tb_last_status(), TB_ERR_EXECUTE);
    assert_string_equal(tb_last_error(), tb_status_string(TB_ERR_EXECUTE));
    assert_true(tb_last_error()[0] != '\0');
    tb_clear_error();
    assert_int_equal(tb_last_status(), TB_OK);
    assert_string_equal(tb_last_error(), "");
}

typedef struct thread_result {
    tb_status initial_status;
    char initial_message[1024];
    tb_status status;
    char message[1024];
} thread_result;

static void *error_thread(void *arg) {
    thread_result *r = (thread_result *)arg;
    r->initial_status = tb_last_status();
    snprintf(r->initial_message, sizeof r->initial_message, "%s", tb_last_error());
    tb_set_error(TB_ERR_IO, "thread error");
    r->status = tb_last_status();
    snprintf(r->message, sizeof r->message, "%s", tb_last_error());
    return NULL;
}

static void test_errors_are_thread_local(void **state) {
    pthread_t t;
    thread_result r;
    (void)state;
    memset(&r, 0, sizeof r);
    tb_set_error(TB_ERR_SHAPE, "main error");
    assert_int_equal(pthread_create(&t, NULL, error_thread, &r), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    /* the new thread started clean and its error stayed its own */
    assert_int_equal(r.initial_status, TB_OK);
    assert_string_equal(r.initial_message, "");
    assert_int_equal(r.status, TB_ERR_IO);
    assert_string_equal(r.message, "thread error");
    assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
    assert_string_equal(tb_last_error(), "main error");
}

/* ---- setup and shutdown ---- */

static void test_setup_twice(void **state) {
    tb_desc desc;
    (void)state;
    memset(&desc, 0, sizeof desc);
    assert_false(tb_is_setup());
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_true(tb_is_setup());
    assert_int_equal(tb_setup(&desc), TB_ERR_STATE);
    assert_int_equal(tb_last_status(), TB_ERR_STATE);
    assert_true(starts_with(tb_last_error(), "tb_setup: "));
    assert_non_null(strstr(tb_last_error(), "already set up"));
    tb_shutdown();
    assert_false(tb_is_setup());
    /* implicit setup by any other call also counts */
    (void)tb_debug_level();
    assert_true(tb_is_setup());
    assert_int_equal(tb_setup(&desc), TB_ERR_STATE);
    tb_shutdown();
    tb_shutdown(); /* harmless when not set up */
    assert_false(tb_is_setup());
}

static void test_setup_after_shutdown(void **state) {
    tb_desc desc;
    (void)state;
    memset(&desc, 0, sizeof desc);
    desc.debug = 2;
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb_debug_level(), 2);
    assert_true(tb_has_backend("cpu"));
    tb_shutdown();
    desc.debug = 1;
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb_debug_level(), 1);
    assert_true(tb_has_backend("cpu"));
    assert_string_equal(tb_get_backend(), "cpu");
    tb_shutdown();
    assert_int_equal(tb_setup(NULL), TB_OK); /* NULL: all defaults */
    assert_int_equal(tb_debug_level(), 0);
    tb_shutdown();
}

static void test_setup_defaults(void **state) {
    tb_desc desc;
    const tb_desc *d;
    (void)state;
    memset(&desc, 0, sizeof desc);
    assert_int_equal(tb_setup(&desc), TB_OK);
    d = tb__desc();
    assert_int_equal(d->cache_size, 1024);
    assert_int_equal(d->max_graph_nodes, 100000);
    assert_int_equal(d->debug, 0);
    assert_int_equal(d->check, 0);
    assert_string_equal(d->backend, "cpu");
    tb_shutdown();

    desc.cache_size = 7;
    desc.max_graph_nodes = 9;
    desc.check = 1;
    desc.backend = "cpu";
    assert_int_equal(tb_setup(&desc), TB_OK);
    d = tb__desc();
    assert_int_equal(d->cache_size, 7);
    assert_int_equal(d->max_graph_nodes, 9);
    assert_int_equal(d->check, 1);
    /* the strings are copies */
    assert_true(d->backend != desc.backend);
    assert_string_equal(d->backend, "cpu");
    tb_shutdown();
}

static void test_setup_env(void **state) {
    tb_desc desc;
    (void)state;
    memset(&desc, 0, sizeof desc);
    setenv("TB_DEBUG", "3", 1);
    setenv("TB_CHECK", "1", 1);
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb_debug_level(), 3);
    assert_int_equal(tb__desc()->check, 1);
    tb_shutdown();
    setenv("TB_CHECK", "2", 1); /* 2: a failed check fails the sync */
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb__desc()->check, 2);
    tb_shutdown();
    /* -1 turns them off whatever the environment says */
    desc.debug = -1;
    desc.check = -1;
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb_debug_level(), 0);
    assert_int_equal(tb__desc()->check, 0);
    tb_shutdown();
    /* the desc wins over the environment */
    desc.debug = 1;
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb_debug_level(), 1);
    tb_shutdown();
    unsetenv("TB_DEBUG");
    unsetenv("TB_CHECK");
}

static void test_setup_bad_desc(void **state) {
    tb_desc desc;
    (void)state;
    memset(&desc, 0, sizeof desc);
    desc.debug = 4;
    assert_int_equal(tb_setup(&desc), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "tb_setup: debug 4"));
    assert_false(tb_is_setup());
    desc.debug = -2;
    assert_int_equal(tb_setup(&desc), TB_ERR_INVALID_ARGUMENT);
    desc.debug = 0;
    desc.check = 3;
    assert_int_equal(tb_setup(&desc), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "tb_setup: check 3 out of range -1..2"));
    assert_false(tb_is_setup());
}

/* ---- allocator hooks ---- */

typedef struct counting_allocator {
    pthread_mutex_t lock;
    long allocs, frees, live;
    size_t bytes;
} counting_allocator;

static void *counting_alloc(size_t size, void *user_data) {
    counting_allocator *a = (counting_allocator *)user_data;
    void *p = malloc(size);
    pthread_mutex_lock(&a->lock);
    if (p != NULL) {
        a->allocs++;
        a->live++;
        a->bytes += size;
    }
    pthread_mutex_unlock(&a->lock);
    return p;
}

static void counting_free(void *ptr, void *user_data) {
    counting_allocator *a = (counting_allocator *)user_data;
    assert_non_null(ptr); /* never called with NULL */
    pthread_mutex_lock(&a->lock);
    a->frees++;
    a->live--;
    pthread_mutex_unlock(&a->lock);
    free(ptr);
}

static void test_allocator_hooks(void **state) {
    static counting_allocator a; /* static: a failed assertion leaves it to the teardown */
    tb_desc desc;
    tb_device cpu;
    tb_backend_data *data;
    float in[6] = {1, 2, 3, 4, 5, 6}, out[6];
    const int64_t dims[2] = {2, 3};
    tb_shape shape;
    char *text;
    long before;
    (void)state;
    memset(&a, 0, sizeof a);
    pthread_mutex_init(&a.lock, NULL);
    memset(&desc, 0, sizeof desc);
    desc.allocator.alloc = counting_alloc;
    desc.allocator.free = counting_free;
    desc.allocator.user_data = &a;
    desc.backend = "cpu";
    desc.device = "cpu:0";
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_true(a.allocs > 0); /* the desc strings */

    assert_int_equal(tb_device_parse("cpu:0", &cpu), TB_OK);
    assert_int_equal(tb_shape_make(&shape, TB_F32, 2, dims), TB_OK);
    before = a.allocs;
    data = tb__data_from_host(&cpu, &shape, in);
    assert_non_null(data);
    assert_true(a.allocs > before); /* the data and its buffer came from the hook */
    assert_int_equal(tb__data_to_host(data, out), TB_OK);
    assert_memory_equal(in, out, sizeof in);
    tb__data_release(data);
    text = tb_backend_metrics_report("cpu");
    assert_non_null(text);
    tb_free(text);
    tb_free(NULL);
    text = tb__format("%d-%s", 42, "x");
    assert_string_equal(text, "42-x");
    tb_free(text);

    tb_shutdown();
    /* everything the library took was given back */
    assert_int_equal(a.live, 0);
    assert_int_equal(a.allocs, a.frees);
    pthread_mutex_destroy(&a.lock);
}

static void test_allocator_needs_both(void **state) {
    static counting_allocator a; /* static: a failed assertion leaves it to the teardown */
    tb_desc desc;
    (void)state;
    memset(&a, 0, sizeof a);
    memset(&desc, 0, sizeof desc);
    desc.allocator.alloc = counting_alloc;
    desc.allocator.user_data = &a;
    assert_int_equal(tb_setup(&desc), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(),
                        "tb_setup: allocator needs both alloc and free (alloc set, free NULL)");
    assert_false(tb_is_setup());
    desc.allocator.alloc = NULL;
    desc.allocator.free = counting_free;
    assert_int_equal(tb_setup(&desc), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(tb_last_error(),
                        "tb_setup: allocator needs both alloc and free (alloc NULL, free set)");
    assert_false(tb_is_setup());
    assert_int_equal(a.allocs, 0);
}

/* ---- logger ---- */

typedef struct log_record {
    int count;
    tb_log_level levels[16];
    char messages[16][128];
} log_record;

static void record_log(tb_log_level level, const char *message, void *user_data) {
    log_record *r = (log_record *)user_data;
    if (r->count < 16) {
        r->levels[r->count] = level;
        snprintf(r->messages[r->count], sizeof r->messages[0], "%s", message);
    }
    r->count++;
}

static void test_logger(void **state) {
    static log_record r;
    tb_desc desc;
    (void)state;
    memset(&r, 0, sizeof r);
    memset(&desc, 0, sizeof desc);
    desc.logger.func = record_log;
    desc.logger.user_data = &r;
    desc.debug = -1;
    assert_int_equal(tb_setup(&desc), TB_OK);
    tb_log_message(TB_LOG_WARN, "hello %d", 5);
    tb_log_message(TB_LOG_ERROR, "bad %s", "thing");
    tb_log_message(TB_LOG_INFO, "not shown at level 0");
    tb_log_message(TB_LOG_DEBUG, "not shown at level 0");
    assert_int_equal(r.count, 2);
    assert_int_equal(r.levels[0], TB_LOG_WARN);
    assert_string_equal(r.messages[0], "hello 5");
    assert_int_equal(r.levels[1], TB_LOG_ERROR);
    assert_string_equal(r.messages[1], "bad thing");
    tb_shutdown();

    memset(&r, 0, sizeof r);
    desc.debug = 1;
    assert_int_equal(tb_setup(&desc), TB_OK);
    tb_log_message(TB_LOG_INFO, "info");
    tb_log_message(TB_LOG_DEBUG, "debug");
    assert_int_equal(r.count, 1);
    assert_string_equal(r.messages[0], "info");
    tb_shutdown();

    memset(&r, 0, sizeof r);
    desc.debug = 2;
    assert_int_equal(tb_setup(&desc), TB_OK);
    tb_log_message(TB_LOG_INFO, "info");
    tb_log_message(TB_LOG_DEBUG, "debug");
    assert_int_equal(r.count, 2);
    assert_int_equal(r.levels[1], TB_LOG_DEBUG);
    assert_string_equal(r.messages[1], "debug");
    tb_shutdown();
}

static void test_logger_long_message_and_errors_kept(void **state) {
    static log_record r;
    tb_desc desc;
    char text[2000];
    (void)state;
    memset(&r, 0, sizeof r);
    memset(&desc, 0, sizeof desc);
    desc.logger.func = record_log;
    desc.logger.user_data = &r;
    assert_int_equal(tb_setup(&desc), TB_OK);
    memset(text, 'y', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    tb_set_error(TB_ERR_IO, "kept");
    tb_log_message(TB_LOG_WARN, "%s", text);
    assert_int_equal(r.count, 1);
    assert_int_equal(strlen(r.messages[0]), 127); /* our record cut it; the logger got it all */
    /* logging never touches the caller's error */
    assert_int_equal(tb_last_status(), TB_ERR_IO);
    assert_string_equal(tb_last_error(), "kept");
    tb_shutdown();
}

static void test_bad_env_level_warns(void **state) {
    static log_record r;
    tb_desc desc;
    (void)state;
    memset(&r, 0, sizeof r);
    memset(&desc, 0, sizeof desc);
    desc.logger.func = record_log;
    desc.logger.user_data = &r;
    setenv("TB_DEBUG", "verbose", 1);
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb_debug_level(), 0);
    assert_int_equal(r.count, 1);
    assert_int_equal(r.levels[0], TB_LOG_WARN);
    assert_string_equal(r.messages[0], "TB_DEBUG='verbose' is not a number in 0..3; using 0");
    tb_shutdown();
    unsetenv("TB_DEBUG");

    /* TB_CHECK the same way: a value that is not a level warns and checks nothing; an empty
       one is unset, quietly */
    static const char *const bad[] = {"3", "-1", "yes", "12", "1 "};
    char want[128];
    size_t i;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&r, 0, sizeof r);
        setenv("TB_CHECK", bad[i], 1);
        assert_int_equal(tb_setup(&desc), TB_OK);
        assert_int_equal(tb__desc()->check, 0);
        assert_int_equal(r.count, 1);
        assert_int_equal(r.levels[0], TB_LOG_WARN);
        snprintf(want, sizeof want, "TB_CHECK='%s' is not a number in 0..2; using 0", bad[i]);
        assert_string_equal(r.messages[0], want);
        tb_shutdown();
    }
    memset(&r, 0, sizeof r);
    setenv("TB_CHECK", "", 1);
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb__desc()->check, 0);
    assert_int_equal(r.count, 0);
    tb_shutdown();
    unsetenv("TB_CHECK");
}

/* ---- hashing ---- */

static void test_hash_known_values(void **state) {
    unsigned char bytes[100];
    uint64_t v = UINT64_C(0x0123456789abcdef);
    unsigned char le[8];
    int i;
    (void)state;
    /* XXH64 reference values */
    assert_true(tb__hash_bytes(0, "", 0) == UINT64_C(0xEF46DB3751D8E999));
    assert_true(tb__hash_bytes(0, NULL, 0) == UINT64_C(0xEF46DB3751D8E999));
    assert_true(tb__hash_bytes(0, "a", 1) == UINT64_C(0xD24EC4F1A98C6E5B));
    assert_true(tb__hash_bytes(0, "abc", 3) == UINT64_C(0x44BC2CF5AD770999));
    assert_true(tb__hash_bytes(0, "Nobody inspects the spammish repetition", 39) ==
                UINT64_C(0xFBCEA83C8A378BF1));
    /* hash_u64 is the hash of the value's little-endian bytes */
    for (i = 0; i < 8; i++)
        le[i] = (unsigned char)(v >> (8 * i));
    assert_true(tb__hash_u64(7, v) == tb__hash_bytes(7, le, 8));
    /* seeds and every byte position matter */
    for (i = 0; i < 100; i++)
        bytes[i] = (unsigned char)i;
    assert_true(tb__hash_bytes(1, bytes, 100) != tb__hash_bytes(2, bytes, 100));
    for (i = 0; i < 100; i++) {
        uint64_t h0 = tb__hash_bytes(0, bytes, 100);
        bytes[i] ^= 1;
        assert_true(tb__hash_bytes(0, bytes, 100) != h0);
        bytes[i] ^= 1;
    }
}

/* ---- allocation helpers and strings ---- */

static void test_grow_and_overflow(void **state) {
    int *items = NULL;
    void *p;
    size_t cap = 0;
    int i;
    (void)state;
    p = items;
    assert_int_equal(tb__grow(&p, &cap, 3, sizeof(int)), TB_OK);
    items = (int *)p;
    assert_true(cap >= 3);
    for (i = 0; i < 3; i++)
        items[i] = i * 10;
    assert_int_equal(tb__grow(&p, &cap, 1000, sizeof(int)), TB_OK);
    items = (int *)p;
    assert_true(cap >= 1000);
    assert_int_equal(items[2], 20); /* content kept */
    assert_int_equal(tb__grow(&p, &cap, SIZE_MAX / 2, 16), TB_ERR_OVERFLOW);
    assert_true(p == items && cap >= 1000); /* unchanged on error */
    tb__free(p);

    assert_null(tb__calloc(SIZE_MAX / 2, 4));
    assert_int_equal(tb_last_status(), TB_ERR_OVERFLOW);
    p = tb__calloc(4, 4);
    assert_non_null(p);
    assert_int_equal(((int *)p)[3], 0);
    tb__free(p);
    assert_null(tb__strdup(NULL));
}

static void test_str(void **state) {
    tb__str s;
    char *text;
    int i;
    (void)state;
    memset(&s, 0, sizeof s);
    text = tb__str_take(&s);
    assert_string_equal(text, ""); /* an empty buffer gives "" */
    tb_free(text);
    for (i = 0; i < 1000; i++)
        tb__str_append(&s, "%d,", i % 10);
    assert_int_equal(s.len, 2000);
    text = tb__str_take(&s);
    assert_non_null(text);
    assert_int_equal(strlen(text), 2000);
    assert_true(strncmp(text, "0,1,2,", 6) == 0);
    tb_free(text);
    tb__str_append(&s, "abc");
    tb__str_free(&s);
    assert_null(s.data);
}

/* ---- mutex ---- */

static tb__mutex test_mutex = TB__MUTEX_INIT;
static long shared_counter;

static void *count_thread(void *arg) {
    int i;
    (void)arg;
    for (i = 0; i < 20000; i++) {
        tb__mutex_lock(&test_mutex);
        tb__mutex_lock(&test_mutex); /* recursive */
        shared_counter++;
        tb__mutex_unlock(&test_mutex);
        tb__mutex_unlock(&test_mutex);
    }
    return NULL;
}

static void test_mutex_recursive_and_exclusive(void **state) {
    pthread_t t[4];
    int i;
    (void)state;
    shared_counter = 0;
    for (i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, count_thread, NULL), 0);
    for (i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(shared_counter, 4 * 20000);
}

static void test_clock(void **state) {
    uint64_t a, b;
    (void)state;
    a = tb__now_ns();
    b = tb__now_ns();
    assert_true(b >= a);
    assert_true(a > 0);
}

static void test_getenv(void **state) {
    (void)state;
    setenv("TB_TEST_VALUE", "", 1);
    assert_null(tb__getenv("TB_TEST_VALUE")); /* empty counts as unset */
    setenv("TB_TEST_VALUE", "x", 1);
    assert_string_equal(tb__getenv("TB_TEST_VALUE"), "x");
    unsetenv("TB_TEST_VALUE");
    assert_null(tb__getenv("TB_TEST_VALUE"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_status_strings, reset, reset),
        cmocka_unit_test_setup_teardown(test_set_error, reset, reset),
        cmocka_unit_test_setup_teardown(test_errors_are_thread_local, reset, reset),
        cmocka_unit_test_setup_teardown(test_setup_twice, reset, reset),
        cmocka_unit_test_setup_teardown(test_setup_after_shutdown, reset, reset),
        cmocka_unit_test_setup_teardown(test_setup_defaults, reset, reset),
        cmocka_unit_test_setup_teardown(test_setup_env, reset, reset),
        cmocka_unit_test_setup_teardown(test_setup_bad_desc, reset, reset),
        cmocka_unit_test_setup_teardown(test_allocator_hooks, reset, reset),
        cmocka_unit_test_setup_teardown(test_allocator_needs_both, reset, reset),
        cmocka_unit_test_setup_teardown(test_logger, reset, reset),
        cmocka_unit_test_setup_teardown(test_logger_long_message_and_errors_kept, reset, reset),
        cmocka_unit_test_setup_teardown(test_bad_env_level_warns, reset, reset),
        cmocka_unit_test_setup_teardown(test_hash_known_values, reset, reset),
        cmocka_unit_test_setup_teardown(test_grow_and_overflow, reset, reset),
        cmocka_unit_test_setup_teardown(test_str, reset, reset),
        cmocka_unit_test_setup_teardown(test_mutex_recursive_and_exclusive, reset, reset),
        cmocka_unit_test_setup_teardown(test_clock, reset, reset),
        cmocka_unit_test_setup_teardown(test_getenv, reset, reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
