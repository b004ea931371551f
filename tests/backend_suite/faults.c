/* The compiled-backend suite, faults. Faults: run-time errors of kernels (gather out of range,
   negative integer powers), one report per failing item, and allocation failures while a program is
   made. Part of tests/backend_suite/suite.c. */

static void test_run_time_errors(void **state) {
    float a[6] = {1, 2, 3, 4, 5, 6}, got[6];
    int64_t idx[3] = {0, 5, 1};
    int32_t base[3] = {2, 3, 4}, ex[3] = {1, -1, 2}, gi[3];
    tb_shape sa = shp(TB_F32, 2, 2, 3, 0, 0), si = shp(TB_I64, 1, 3, 0, 0, 0),
             s3 = shp(TB_I32, 1, 3, 0, 0, 0);
    tb_tensor *x, *i, *y, *b, *e, *p;
    (void)state;
    REQUIRE_OPENCL();
    x = tb_tensor_from_host(a, &sa, &g_ocl);
    i = tb_tensor_from_host(idx, &si, &g_ocl);
    y = tb_index_select(x, 1, i);
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_ERR_EXECUTE);
    assert_non_null(strstr(tb_last_error(), "index 5 is out of range for dim 1 of size 3"));
    tb_tensor_release(y);
    b = tb_tensor_from_host(base, &s3, &g_ocl);
    e = tb_tensor_from_host(ex, &s3, &g_ocl);
    p = tb_pow(b, e);
    assert_int_equal(tb_tensor_to_host(p, gi, sizeof gi), TB_ERR_EXECUTE);
    assert_non_null(strstr(tb_last_error(), "negative integer powers"));
    tb_tensor_release(x);
    tb_tensor_release(i);
    tb_tensor_release(b);
    tb_tensor_release(e);
    tb_tensor_release(p);
}

/* Many work items fail at once: the report is one item's. Each item's pair is recognisable
   (base b with exponent -b; an index of the first select in [1000, 1000 + n) against dim 0 of
   size 3, of the second in [5000000000, 5000000000 + n) against size 5), so a report made of
   two items' words, or of one site's code and another's index, fails the test. */
static void test_run_time_error_reports_one_item(void **state) {
    enum { N = 20000 };
    static int32_t base[N], ex[N];
    static int64_t i1[N], i2[N];
    float xs[3] = {1, 2, 3}, xl[5] = {1, 2, 3, 4, 5};
    tb_shape sn = shp(TB_I32, 1, N, 0, 0, 0), si = shp(TB_I64, 1, N, 0, 0, 0),
             s3 = shp(TB_F32, 1, 3, 0, 0, 0), s5 = shp(TB_F32, 1, 5, 0, 0, 0);
    tb_tensor *b, *e, *p, *x3, *x5, *t1, *t2, *g1, *g2, *y;
    long long got_b = 0, got_e = 0, idx = 0;
    int round, size = 0;
    (void)state;
    REQUIRE_OPENCL();
    for (round = 0; round < N; round++) {
        base[round] = round + 2;
        ex[round] = -(round + 2);
        i1[round] = 1000 + round;
        i2[round] = 5000000000ll + round;
    }
    for (round = 0; round < 3; round++) {
        b = tb_tensor_from_host(base, &sn, &g_ocl);
        e = tb_tensor_from_host(ex, &sn, &g_ocl);
        p = tb_pow(b, e);
        assert_int_equal(tb_sync(&p, 1), TB_ERR_EXECUTE);
        if (sscanf(strstr(tb_last_error(), "(") != NULL ? strstr(tb_last_error(), "(") : "",
                   "(%lld ** %lld)", &got_b, &got_e) != 2)
            fail_msg("unexpected message: %s", tb_last_error());
        if (got_b < 2 || got_b > N + 1 || got_e != -got_b)
            fail_msg("a report of two items: %s", tb_last_error());
        tb_tensor_release(b);
        tb_tensor_release(e);
        tb_tensor_release(p);
        x3 = tb_tensor_from_host(xs, &s3, &g_ocl);
        x5 = tb_tensor_from_host(xl, &s5, &g_ocl);
        t1 = tb_tensor_from_host(i1, &si, &g_ocl);
        t2 = tb_tensor_from_host(i2, &si, &g_ocl);
        g1 = tb_index_select(x3, 0, t1);
        g2 = tb_index_select(x5, 0, t2);
        y = tb_add(g1, g2);
        assert_int_equal(tb_sync(&y, 1), TB_ERR_EXECUTE);
        if (sscanf(strstr(tb_last_error(), "index ") != NULL ? strstr(tb_last_error(), "index ")
                                                             : "",
                   "index %lld is out of range for dim 0 of size %d", &idx, &size) != 2)
            fail_msg("unexpected message: %s", tb_last_error());
        if (!((size == 3 && idx >= 1000 && idx < 1000 + N) ||
              (size == 5 && idx >= 5000000000ll && idx < 5000000000ll + N)))
            fail_msg("a report of two sites or items: %s", tb_last_error());
        tb_tensor_release(x3);
        tb_tensor_release(x5);
        tb_tensor_release(t1);
        tb_tensor_release(t2);
        tb_tensor_release(g1);
        tb_tensor_release(g2);
        tb_tensor_release(y);
    }
}

/* ---- allocation failures while a program is made ---- */

typedef struct failing_allocator {
    long count, fail_at; /* fail_at > 0: the fail_at-th allocation from now returns NULL */
    bool failed;
} failing_allocator;

static failing_allocator g_failing;

static void *failing_alloc(size_t size, void *user_data) {
    failing_allocator *a = (failing_allocator *)user_data;
    if (a->fail_at > 0 && ++a->count == a->fail_at) {
        a->failed = true;
        return NULL;
    }
    return malloc(size);
}

static void failing_free(void *ptr, void *user_data) {
    (void)user_data;
    free(ptr);
}

/* A 3x3 -> 5x5 pad, and the n-th allocation of its sync fails, for every n until the sync
   needs fewer: each sync lowers and generates the program anew (the computation cache is
   cleared) and gives either TB_ERR_OUT_OF_MEMORY or exactly the right values; the same
   graph right after, and after the sweep, gives the right values (nothing half-built was
   cached). */
static void test_pad_allocation_failures(void **state) {
    char *old = getenv("TB_CACHE_DIR") != NULL ? strdup(getenv("TB_CACHE_DIR")) : NULL;
    static const int64_t pads[4] = {1, 1, 1, 1};
    float host[9], want[25], got[25];
    tb_shape s = shp(TB_F32, 2, 3, 3, 0, 0);
    tb_desc desc;
    tb_tensor *x, *y;
    long n, errors = 0;
    int i;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < 9; i++)
        host[i] = (float)i + 1.0f;
    for (i = 0; i < 25; i++) {
        int r = i / 5 - 1, c = i % 5 - 1;
        want[i] = (r >= 0 && r < 3 && c >= 0 && c < 3) ? host[r * 3 + c] : -2.5f;
    }
    setenv("TB_CACHE_DIR", "off", 1);
    tb_shutdown();
    memset(&g_failing, 0, sizeof g_failing);
    memset(&desc, 0, sizeof desc);
    desc.allocator.alloc = failing_alloc;
    desc.allocator.free = failing_free;
    desc.allocator.user_data = &g_failing;
    assert_int_equal(tb_setup(&desc), TB_OK);
    for (n = 1;; n++) {
        tb_status st;
        if (n > 100000) fail_msg("the sweep does not end");
        tb_computation_cache_clear();
        x = tb_tensor_from_host(host, &s, &g_ocl);
        y = tb_pad(x, pads, 4, -2.5);
        assert_non_null(y);
        g_failing.count = 0;
        g_failing.failed = false;
        g_failing.fail_at = n;
        st = tb_sync(&y, 1);
        g_failing.fail_at = 0;
        if (st != TB_OK) {
            if (!g_failing.failed)
                fail_msg("allocation %ld: tb_sync failed: %s", n, tb_last_error());
            if (st != TB_ERR_OUT_OF_MEMORY) {
                fail_msg("allocation %ld failed: tb_sync gave %s, not TB_ERR_OUT_OF_MEMORY: %s", n,
                         tb_status_string(st), tb_last_error());
            }
            errors++;
        } else {
            assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
            if (memcmp(got, want, sizeof got) != 0)
                fail_msg("allocation %ld failed: tb_sync gave TB_OK and wrong values", n);
        }
        tb_tensor_release(y);
        y = tb_pad(x, pads, 4, -2.5);
        if (tb_tensor_to_host(y, got, sizeof got) != TB_OK) fail_msg("%s", tb_last_error());
        if (memcmp(got, want, sizeof got) != 0)
            fail_msg("after allocation %ld failed: the same graph gives wrong values", n);
        tb_tensor_release(y);
        tb_tensor_release(x);
        if (st == TB_OK && !g_failing.failed) break;
    }
    assert_true(errors > 0);
    if (old != NULL) {
        setenv("TB_CACHE_DIR", old, 1);
        free(old);
    } else {
        unsetenv("TB_CACHE_DIR");
    }
    restart_library();
    probe();
    x = tb_tensor_from_host(host, &s, &g_ocl);
    y = tb_pad(x, pads, 4, -2.5);
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
    assert_memory_equal(got, want, sizeof got);
    tb_tensor_release(y);
    tb_tensor_release(x);
}

/* in the order they run */
static const struct CMUnitTest faults_tests[] = {
    cmocka_unit_test(test_run_time_errors),
    cmocka_unit_test(test_run_time_error_reports_one_item),
    cmocka_unit_test(test_pad_allocation_failures),
};
