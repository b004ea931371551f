/* The compiled-backend suite, devices. Devices and the runtime (OpenCL's own machinery): devices,
   transfers, allocations too large, two devices one after the other and at once, debug output,
   shutdown with an allocator hook, loading the runtime again, and no OpenCL library at all. Part of
   tests/backend_suite/suite.c. */

/* ---- devices, transfers, memory ---- */

static void test_devices(void **state) {
    tb_device devs[8];
    tb_device_info info;
    tb_device_type type;
    int32_t ordinal = -1;
    size_t count = 0, i;
    tb_device d;
    (void)state;
    REQUIRE_OPENCL();
    assert_int_equal(tb_backend_devices("opencl", devs, 8, &count), TB_OK);
    assert_true(count >= 1);
    for (i = 0; i < count && i < 8; i++) {
        assert_int_equal(tb_backend_device_info(&devs[i], &info), TB_OK);
        assert_string_equal(info.device.backend, "opencl");
        assert_int_equal(info.device.ordinal, (int32_t)i);
        assert_int_equal(info.device.type, devs[i].type);
        assert_true(info.name[0] != '\0');
        assert_true(info.driver_version[0] != '\0');
        assert_non_null(strstr(info.language_version, "OpenCL C"));
        assert_true(info.global_memory > 0);
        assert_true(info.max_allocation > 0 && info.max_allocation <= info.global_memory);
        assert_true(info.compute_units >= 1);
        assert_true(info.max_work_group_size >= 1);
        assert_int_equal(info.supports_f64, strstr(info.extensions, "cl_khr_fp64") != NULL);
    }
    /* the default is the first GPU, else accelerator, else CPU: type and ordinal agree */
    assert_int_equal(tb_backend_get_default_device_type("opencl", &type), TB_OK);
    assert_int_equal(tb_backend_get_default_device_ordinal("opencl", &ordinal), TB_OK);
    assert_true(ordinal >= 0 && (size_t)ordinal < count);
    assert_int_equal(devs[ordinal].type, type);
    for (i = 0; i < (size_t)ordinal; i++) {
        assert_true(devs[i].type != TB_DEVICE_GPU);
        if (type == TB_DEVICE_CPU) assert_true(devs[i].type != TB_DEVICE_ACCELERATOR);
    }
    assert_int_equal(tb_device_make("opencl", (int32_t)count, &d), TB_ERR_NOT_FOUND);
    assert_non_null(strstr(tb_last_error(), "out of range"));
    {
        tb_opencl_native native;
        memset(&native, 0, sizeof native);
        assert_int_equal(tb_opencl_native_device(&g_ocl, &native), TB_OK);
        assert_non_null(native.platform);
        assert_non_null(native.device);
        assert_non_null(native.context);
        assert_non_null(native.queue);
        assert_int_equal(tb_opencl_native_device(&g_cpu, &native), TB_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(tb_last_error(), "tb_opencl_native_device"));
        assert_int_equal(tb_opencl_native_device(NULL, NULL), TB_ERR_INVALID_ARGUMENT);
    }
    {
        char *report = tb_backend_metrics_report("opencl");
        assert_non_null(report);
        assert_non_null(strstr(report, "OpenCL::BytesInUse"));
        tb_free(report);
    }
}

static void test_transfers(void **state) {
    const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_BOOL};
    const int64_t sizes[] = {0, 1, 3, 1000, 300000};
    size_t d, k, bytes = 0;
    (void)state;
    REQUIRE_OPENCL();
    for (d = 0; d < 6; d++) {
        for (k = 0; k < 5; k++) {
            tb_shape s = shp(dtypes[d], 1, sizes[k], 0, 0, 0);
            void *a = host_alloc(&s), *b = host_alloc(&s);
            tb_tensor *t;
            assert_int_equal(tb_shape_nbytes(&s, &bytes), TB_OK);
            fill(a, &s, R_ANY, 0);
            t = tb_tensor_from_host(a, &s, &g_ocl);
            assert_non_null(t);
            assert_int_equal(tb_tensor_to_host(t, b, bytes), TB_OK);
            assert_memory_equal(a, b, bytes + (bytes == 0));
            tb_tensor_release(t);
            free(a);
            free(b);
        }
    }
    /* scalars: kept on the host until a kernel needs them */
    {
        double v = 0;
        tb_tensor *s = tb_scalar_tensor(tb_scalar_f(TB_F32, 2.5), &g_ocl), *t;
        assert_non_null(s);
        assert_int_equal(tb_tensor_item(s, &v), TB_OK);
        assert_true(v == 2.5);
        t = tb_mul_scalar(s, 4.0);
        assert_int_equal(tb_tensor_item(t, &v), TB_OK);
        assert_true(v == 10.0);
        tb_tensor_release(s);
        tb_tensor_release(t);
    }
    /* the caching allocator gives freed memory back for reuse */
    {
        tb_shape s = shp(TB_F32, 1, 4096, 0, 0, 0);
        void *a = host_alloc(&s);
        tb_tensor *t;
        int64_t in_use, reused;
        void *mem = NULL;
        size_t size = 0;
        fill(a, &s, R_ANY, 0);
        t = tb_tensor_from_host(a, &s, &g_ocl);
        in_use = tb_metrics_counter("OpenCL::BytesInUse");
        assert_true(in_use >= 4096 * 4);
        assert_int_equal(tb_opencl_tensor_buffer(t, &mem, &size), TB_OK);
        assert_non_null(mem);
        assert_int_equal(size, 4096 * 4);
        tb_tensor_release(t);
        assert_int_equal(tb_metrics_counter("OpenCL::BytesInUse"), in_use - 4096 * 4);
        reused = tb_metrics_counter("OpenCL::BufferReuse");
        t = tb_tensor_from_host(a, &s, &g_ocl);
        assert_int_equal(tb_metrics_counter("OpenCL::BufferReuse"), reused + 1);
        tb_tensor_release(t);
        assert_int_equal(tb_opencl_trim_cache(NULL), TB_OK);
        assert_int_equal(tb_metrics_counter("OpenCL::BytesCached"), 0);
        free(a);
    }
}

static void test_allocation_too_large(void **state) {
    tb_device_info info;
    tb_shape s;
    tb_tensor *t, *u;
    tb_status st;
    char expect[64];
    int64_t n;
    (void)state;
    REQUIRE_OPENCL();
    assert_int_equal(tb_backend_device_info(&g_ocl, &info), TB_OK);
    n = (int64_t)(info.max_allocation / 4) + 1024; /* f32: just over the largest allocation */
    s = shp(TB_F32, 1, n, 0, 0, 0);
    t = tb_full(&s, 1.0, &g_ocl);
    assert_non_null(t);
    u = tb_add_scalar(t, 1.0);
    st = tb_sync(&u, 1);
    assert_int_equal(st, TB_ERR_OUT_OF_MEMORY);
    snprintf(expect, sizeof expect, "%lld bytes", (long long)n * 4);
    assert_non_null(strstr(tb_last_error(), expect));
    snprintf(expect, sizeof expect, "%llu bytes", (unsigned long long)info.max_allocation);
    assert_non_null(strstr(tb_last_error(), expect));
    tb_tensor_release(t);
    tb_tensor_release(u);
    /* the backend keeps working */
    {
        float a[3] = {1, 2, 3}, b[3];
        tb_shape s3 = shp(TB_F32, 1, 3, 0, 0, 0);
        tb_tensor *x = tb_tensor_from_host(a, &s3, &g_ocl), *y = tb_add_scalar(x, 1.0);
        assert_int_equal(tb_tensor_to_host(y, b, sizeof b), TB_OK);
        assert_true(b[0] == 2 && b[1] == 3 && b[2] == 4);
        tb_tensor_release(x);
        tb_tensor_release(y);
    }
}

/* ---- two devices ---- */

/* Two threads on two devices run at once: a run on opencl:0 stops, while it holds its device,
   in the logger's callback of its first kernel line (TB_DEBUG=2), until a whole sync on
   opencl:1 has finished on another thread. With one lock for the backend that sync would wait
   for the first run: the first thread's wait ends after 60 s and the test fails (a guard
   against a hang, not a timing threshold). */
static pthread_mutex_t g_par_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_par_cond = PTHREAD_COND_INITIALIZER;
static int g_par_inside, g_par_other_done, g_par_timed_out;
static pthread_t g_par_waiter;

static void par_logger(tb_log_level level, const char *message, void *user_data) {
    struct timespec until;
    (void)level, (void)user_data;
    if (strncmp(message, "opencl:0 ", 9) != 0 || !pthread_equal(pthread_self(), g_par_waiter))
        return;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    pthread_mutex_lock(&g_par_lock);
    if (!g_par_inside) {
        g_par_inside = 1;
        pthread_cond_broadcast(&g_par_cond);
        while (!g_par_other_done && !g_par_timed_out) {
            if (pthread_cond_timedwait(&g_par_cond, &g_par_lock, &until) != 0) g_par_timed_out = 1;
        }
    }
    pthread_mutex_unlock(&g_par_lock);
}

static void *par_run_device0(void *arg) {
    tb_tensor *y = (tb_tensor *)arg;
    return (void *)(intptr_t)tb_sync(&y, 1);
}

static void test_two_devices_run_at_once(void **state) {
    float a[256], got[256];
    tb_shape s = shp(TB_F32, 1, 256, 0, 0, 0);
    tb_device d0, d1;
    tb_desc desc;
    tb_tensor *x0, *y0, *x1, *y1;
    size_t count = 0;
    void *rc = NULL;
    int i;
    (void)state;
    REQUIRE_OPENCL();
    assert_int_equal(tb_backend_devices("opencl", NULL, 0, &count), TB_OK);
    if (count < 2) {
        print_message("one OpenCL device only (POCL_DEVICES=\"pthread pthread\" gives two)\n");
        skip();
    }
    tb_shutdown();
    memset(&desc, 0, sizeof desc);
    desc.debug = 2;
    desc.logger.func = par_logger;
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb_device_make("opencl", 0, &d0), TB_OK);
    assert_int_equal(tb_device_make("opencl", 1, &d1), TB_OK);
    for (i = 0; i < 256; i++)
        a[i] = (float)i;
    x0 = tb_tensor_from_host(a, &s, &d0);
    y0 = tb_mul_scalar(x0, 2.0);
    x1 = tb_tensor_from_host(a, &s, &d1);
    y1 = tb_add_scalar(x1, 1.0);
    g_par_inside = g_par_other_done = g_par_timed_out = 0;
    assert_int_equal(pthread_create(&g_par_waiter, NULL, par_run_device0, y0), 0);
    pthread_mutex_lock(&g_par_lock);
    while (!g_par_inside)
        pthread_cond_wait(&g_par_cond, &g_par_lock);
    pthread_mutex_unlock(&g_par_lock);
    /* opencl:0 is in the middle of a run: opencl:1 compiles and runs a graph meanwhile */
    assert_int_equal(tb_tensor_to_host(y1, got, sizeof got), TB_OK);
    for (i = 0; i < 256; i++)
        assert_true(got[i] == (float)i + 1.0f);
    pthread_mutex_lock(&g_par_lock);
    g_par_other_done = 1;
    pthread_cond_broadcast(&g_par_cond);
    pthread_mutex_unlock(&g_par_lock);
    pthread_join(g_par_waiter, &rc);
    assert_false(g_par_timed_out);
    assert_int_equal((int)(intptr_t)rc, TB_OK);
    assert_int_equal(tb_tensor_to_host(y0, got, sizeof got), TB_OK);
    for (i = 0; i < 256; i++)
        assert_true(got[i] == (float)i * 2.0f);
    tb_tensor_release(y0);
    tb_tensor_release(x0);
    tb_tensor_release(y1);
    tb_tensor_release(x1);
    tb_shutdown();
    assert_int_equal(tb_setup(NULL), TB_OK);
    probe();
}

static void test_two_devices(void **state) {
    tb_device d1;
    size_t count = 0;
    float a[64], r0[64], r1[64];
    tb_shape s = shp(TB_F32, 2, 8, 8, 0, 0);
    tb_tensor *x0, *y0, *x1, *y1, *back, *m0, *m1;
    int i;
    (void)state;
    REQUIRE_OPENCL();
    assert_int_equal(tb_backend_devices("opencl", NULL, 0, &count), TB_OK);
    if (count < 2) {
        print_message("one OpenCL device only (POCL_DEVICES=\"pthread pthread\" gives two)\n");
        skip();
    }
    assert_int_equal(tb_device_make("opencl", 1, &d1), TB_OK);
    fill(a, &s, R_ANY, 0);
    x0 = tb_tensor_from_host(a, &s, &g_ocl);
    y0 = tb_matmul(x0, x0);
    y0 = take(y0, tb_tanh(y0));
    x1 = tb_to_device(y0, &d1); /* computed on opencl:0, moved to opencl:1 */
    assert_non_null(x1);
    assert_int_equal(tb_tensor_device(x1).ordinal, 1);
    y1 = tb_mul_scalar(x1, 2.0);
    m1 = tb_sum(y1, NULL, 0, false);
    back = tb_to_device(y1, &g_ocl);
    m0 = tb_sum(back, NULL, 0, false);
    assert_int_equal(tb_tensor_to_host(back, r0, sizeof r0), TB_OK);
    assert_int_equal(tb_tensor_to_host(y1, r1, sizeof r1), TB_OK);
    for (i = 0; i < 64; i++)
        assert_true(r0[i] == r1[i]);
    {
        double v0 = 0, v1 = 0;
        assert_int_equal(tb_tensor_item(m0, &v0), TB_OK);
        assert_int_equal(tb_tensor_item(m1, &v1), TB_OK);
        assert_true(v0 == v1);
    }
    /* to the cpu and back: from the device's (mapped) memory, into a new data's */
    {
        tb_tensor *c = tb_to_device(y1, &g_cpu), *b0 = c != NULL ? tb_to_device(c, &g_ocl) : NULL;
        float rc[64], rb[64];
        assert_non_null(b0);
        assert_int_equal(tb_tensor_to_host(c, rc, sizeof rc), TB_OK);
        assert_int_equal(tb_tensor_to_host(b0, rb, sizeof rb), TB_OK);
        for (i = 0; i < 64; i++)
            assert_true(rc[i] == r1[i] && rb[i] == r1[i]);
        tb_tensor_release(b0);
        tb_tensor_release(c);
    }
    /* mixing devices in one op is an error that names both */
    {
        tb_tensor *bad = tb_add(x0, x1);
        assert_null(bad);
        assert_non_null(strstr(tb_last_error(), "opencl:1"));
    }
    tb_tensor_release(x0);
    tb_tensor_release(y0);
    tb_tensor_release(x1);
    tb_tensor_release(y1);
    tb_tensor_release(back);
    tb_tensor_release(m0);
    tb_tensor_release(m1);
}

/* ---- debug output ---- */

static void test_debug_lines(void **state) {
    tb_desc desc;
    float a[120], got[120];
    tb_shape s = shp(TB_F32, 2, 3, 40, 0, 0);
    tb_tensor *x, *y;
    tb_device dev;
    int32_t ax = 1;
    (void)state;
    REQUIRE_OPENCL();
    tb_shutdown();
    memset(&desc, 0, sizeof desc);
    desc.debug = 2;
    desc.logger.func = capture_log;
    assert_int_equal(tb_setup(&desc), TB_OK);
    g_log[0] = '\0';
    assert_int_equal(tb_device_make("opencl", 0, &dev), TB_OK);
    fill(a, &s, R_ANY, 0);
    x = tb_tensor_from_host(a, &s, &dev);
    y = tb_exp(x);
    y = take(y, tb_sum(y, &ax, 1, true));
    y = take(y, tb_exp(y));
    y = take(y, tb_mul(y, x)); /* reduce kernel, then an elementwise kernel */
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
    assert_non_null(strstr(g_log, "2 kernels: R_3_40 E_120"));
    assert_non_null(strstr(g_log, "R_3_40"));
    assert_non_null(strstr(g_log, "GB/s"));
    assert_non_null(strstr(g_log, "GFLOP/s"));
    assert_null(strstr(g_log, "__kernel")); /* the source only from level 3 */
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_shutdown();
    desc.debug = 3;
    assert_int_equal(tb_setup(&desc), TB_OK);
    g_log[0] = '\0';
    x = tb_tensor_from_host(a, &s, &dev);
    y = tb_sigmoid(x);
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
    assert_non_null(strstr(g_log, "__kernel void E_12"));
    tb_tensor_release(x);
    tb_tensor_release(y);
    restart_library();
    probe();
}

/* ---- shutdown with an allocator hook ---- */

/* The opencl backend releases its cached buffers at exit and counts that in the metrics:
   tb_shutdown must give every block back to the hook (three metric entries used to stay,
   to be freed by the next session's allocator). */
static void test_shutdown_with_allocator_hook(void **state) {
    tb_desc desc;
    float a[12], got[12];
    tb_shape s = shp(TB_F32, 2, 3, 4, 0, 0);
    tb_tensor *x, *e, *y;
    tb_device dev;
    char *report;
    int session;
    (void)state;
    REQUIRE_OPENCL();
    fill(a, &s, R_ANY, 0);
    for (session = 0; session < 2; session++) {
        if (session == 0) {
            hook_session();
        } else {
            tb_shutdown();
            memset(&desc, 0, sizeof desc); /* the default allocator */
            g_hook_live = 0;
            assert_int_equal(tb_setup(&desc), TB_OK);
        }
        assert_int_equal(tb_device_make("opencl", 0, &dev), TB_OK);
        x = tb_tensor_from_host(a, &s, &dev);
        e = tb_exp(x);
        y = tb_mul(e, x);
        assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
        tb_tensor_release(x);
        tb_tensor_release(e);
        tb_tensor_release(y);
        report = tb_metrics_report();
        assert_non_null(report);
        tb_free(report);
        tb_metrics_reset();
        tb_shutdown();
        assert_int_equal(g_hook_live, 0);
    }
    restart_library();
    probe();
}

/* A refused allocation while the OpenCL runtime loads is an error of that call only: the next
   call loads it again (a cut-short device list used to stay for the whole session). */
static void test_runtime_load_retried(void **state) {
    size_t expected = 0, count = 0;
    long k;
    (void)state;
    REQUIRE_OPENCL();
    assert_int_equal(tb_backend_devices("opencl", NULL, 0, &expected), TB_OK);
    assert_true(expected > 0);
    for (k = 0;; k++) {
        tb_status st;
        bool refused;
        hook_session();
        hook_arm(k);
        st = tb_opencl_available();
        refused = g_hook_refused != 0;
        hook_arm(-1);
        if (st != TB_OK && st != TB_ERR_OUT_OF_MEMORY) {
            fail_msg("allocation %ld refused: status %d, '%s'", k, (int)st, tb_last_error());
        }
        assert_int_equal(tb_opencl_available(), TB_OK);
        assert_int_equal(tb_backend_devices("opencl", NULL, 0, &count), TB_OK);
        assert_int_equal(count, expected);
        if (!refused) break;
    }
    assert_true(k > 2);
    tb_shutdown();
    assert_int_equal(tb_setup(NULL), TB_OK);
    probe();
}

/* Memory running out while the runtime loads under tb_backend_devices, tb_device_make or
   tb_backend_device_info: an error TB_ERR_OUT_OF_MEMORY (it used to be TB_OK with no device,
   or TB_ERR_UNAVAILABLE "no devices"), or the full answer; and the facts of every device are
   those of a clean load (a refused allocation used to leave a device without a name or
   extensions for the whole session). */
static void test_runtime_load_device_facts(void **state) {
    tb_device_info clean[8], info;
    tb_device devs[8], d;
    size_t expected = 0, count, i;
    int which;
    (void)state;
    REQUIRE_OPENCL();
    assert_int_equal(tb_backend_devices("opencl", devs, 8, &expected), TB_OK);
    assert_true(expected > 0 && expected <= 8);
    for (i = 0; i < expected; i++)
        assert_int_equal(tb_backend_device_info(&devs[i], &clean[i]), TB_OK);
    for (which = 0; which < 3; which++) {
        long k;
        for (k = 0;; k++) {
            tb_status st;
            bool refused;
            const char *what[3] = {"tb_backend_devices", "tb_device_make",
                                   "tb_backend_device_info"};
            hook_session();
            hook_arm(k);
            count = 0;
            if (which == 0) {
                st = tb_backend_devices("opencl", devs, 8, &count);
            } else if (which == 1) {
                st = tb_device_make("opencl", 0, &d);
            } else {
                st = tb_backend_device_info(&g_ocl, &info);
            }
            refused = g_hook_refused != 0;
            hook_arm(-1);
            if (st != TB_OK && (st != TB_ERR_OUT_OF_MEMORY || !refused)) {
                fail_msg("%s, allocation %ld refused: %s '%s'", what[which], k,
                         tb_status_string(st), tb_last_error());
            }
            if (st == TB_OK && which == 0 && count != expected) {
                fail_msg("tb_backend_devices, allocation %ld refused: TB_OK with %zu devices, "
                         "not %zu",
                         k, count, expected);
            }
            assert_int_equal(tb_backend_devices("opencl", devs, 8, &count), TB_OK);
            assert_int_equal(count, expected);
            for (i = 0; i < expected; i++) {
                assert_int_equal(tb_backend_device_info(&devs[i], &info), TB_OK);
                if (strcmp(info.name, clean[i].name) != 0 ||
                    strcmp(info.vendor, clean[i].vendor) != 0 ||
                    strcmp(info.driver_version, clean[i].driver_version) != 0 ||
                    strcmp(info.language_version, clean[i].language_version) != 0 ||
                    strcmp(info.extensions, clean[i].extensions) != 0 ||
                    info.supports_f64 != clean[i].supports_f64) {
                    fail_msg("%s, allocation %ld refused: device %zu is now '%s' (%s, %s, %s), "
                             "not '%s'",
                             what[which], k, i, info.name, info.vendor, info.driver_version,
                             info.language_version, clean[i].name);
                }
            }
            tb_shutdown();
            assert_int_equal(g_hook_live, 0);
            if (!refused) break;
        }
        assert_true(k > 2);
    }
    assert_int_equal(tb_setup(NULL), TB_OK);
    probe();
}

/* ---- no OpenCL library ---- */

static void test_unavailable_library(void **state) {
    char *old = getenv("TB_OPENCL_LIBRARY") != NULL ? strdup(getenv("TB_OPENCL_LIBRARY")) : NULL;
    tb_device d;
    size_t count = 99;
    float a[3] = {1, 2, 3}, b[3];
    tb_shape s = shp(TB_F32, 1, 3, 0, 0, 0);
    tb_tensor *x, *y;
    const char *names[8];
    size_t n, i;
    bool listed = false;
    (void)state;
#ifdef TB_OPENCL_LINKED
    print_message("built with TB_OPENCL_LINKED: TB_OPENCL_LIBRARY does not apply\n");
    skip();
#endif
    tb_shutdown();
    setenv("TB_OPENCL_LIBRARY", "/nonexistent/libOpenCL.so.1", 1);
    assert_int_equal(tb_setup(NULL), TB_OK);
    /* registered, but reporting why it cannot run */
    n = tb_backend_list(names, 8, true);
    for (i = 0; i < n && i < 8; i++)
        listed = listed || strcmp(names[i], "opencl") == 0;
#ifdef TB_NO_OPENCL
    /* built without the backend: nothing to load */
    assert_false(listed);
    assert_int_equal(tb_opencl_available(), TB_ERR_UNSUPPORTED);
    assert_non_null(strstr(tb_last_error(), "TB_NO_OPENCL"));
    (void)d, (void)count, (void)a, (void)b, (void)s, (void)x, (void)y;
#else
    assert_true(listed);
    assert_int_equal(tb_opencl_available(), TB_ERR_UNAVAILABLE);
    assert_non_null(strstr(tb_last_error(), "opencl: cannot open /nonexistent/libOpenCL.so.1"));
    assert_int_equal(tb_backend_devices("opencl", NULL, 0, &count), TB_OK);
    assert_int_equal(count, 0);
    assert_int_equal(tb_device_make("opencl", 0, &d), TB_ERR_UNAVAILABLE);
    assert_non_null(strstr(tb_last_error(), "opencl"));
    {
        char *report = tb_backend_metrics_report("opencl");
        assert_non_null(report);
        assert_non_null(strstr(report, "cannot open /nonexistent/libOpenCL.so.1"));
        tb_free(report);
    }
    /* the cpu backend keeps working */
    assert_int_equal(tb_device_make("cpu", 0, &d), TB_OK);
    x = tb_tensor_from_host(a, &s, &d);
    y = tb_mul_scalar(x, 3.0);
    assert_int_equal(tb_tensor_to_host(y, b, sizeof b), TB_OK);
    assert_true(b[0] == 3 && b[1] == 6 && b[2] == 9);
    tb_tensor_release(x);
    tb_tensor_release(y);
#endif
    tb_shutdown();
    if (old != NULL) {
        setenv("TB_OPENCL_LIBRARY", old, 1);
        free(old);
    } else {
        unsetenv("TB_OPENCL_LIBRARY");
    }
    assert_int_equal(tb_setup(NULL), TB_OK);
    probe();
}

/* in the order they run */
static const struct CMUnitTest devices_tests[] = {
    OPENCL_ONLY(test_transfers),
    OPENCL_ONLY(test_devices),
    OPENCL_ONLY(test_allocation_too_large),
    OPENCL_ONLY(test_two_devices),
    OPENCL_ONLY(test_two_devices_run_at_once),
    OPENCL_ONLY(test_debug_lines),
    OPENCL_ONLY(test_shutdown_with_allocator_hook),
    OPENCL_ONLY(test_runtime_load_retried),
    OPENCL_ONLY(test_runtime_load_device_facts),
    OPENCL_ONLY(test_unavailable_library),
};
