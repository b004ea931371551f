/* The compiled-backend suite, dumps. Dumps: tb_ir_dot draws each kernel as a cluster, dumps under
   allocation failures, and a compile error's dump. Part of tests/backend_suite/suite.c. */

/* ---- tb_ir_dot: the kernels drawn as clusters ---- */

/* Checks a DOT dump: every node declared once; when `clusters`, every computed node (no
   "param" in its label) inside exactly one "subgraph cluster_" and no parameter in one.
   Fills `decl` with the node declarations without their indentation, one per line, sorted by
   node id, and `labels` with the cluster labels. */
static void check_dot(const char *dot, bool clusters, char *decl, size_t decl_cap, char *labels,
                      size_t labels_cap) {
    const char *line = dot;
    bool in_cluster = false;
    int cluster_nodes = 0, num_clusters = 0, seen[256];
    char decls[256][160];
    int max_id = -1, i;
    memset(seen, 0, sizeof seen);
    decl[0] = '\0';
    labels[0] = '\0';
    assert_non_null(strstr(dot, "digraph tb {"));
    while (*line != '\0') {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        const char *t = line;
        int id;
        while (*t == ' ')
            t++;
        if (strncmp(t, "subgraph cluster_", 17) == 0) {
            assert_true(clusters);
            assert_false(in_cluster);
            in_cluster = true;
            cluster_nodes = 0;
            num_clusters++;
        } else if (in_cluster && strncmp(t, "label=\"", 7) == 0) {
            const char *q = strchr(t + 7, '"');
            assert_non_null(q);
            assert_true(q > t + 7); /* a name */
            assert_true(strlen(labels) + (size_t)(q - (t + 7)) + 2 < labels_cap);
            strncat(labels, t + 7, (size_t)(q - (t + 7)));
            strcat(labels, " ");
        } else if (in_cluster && t[0] == '}') {
            assert_true(cluster_nodes > 0); /* no empty cluster */
            in_cluster = false;
        } else if (t[0] == 'n' && strstr(t, " [label=") != NULL &&
                   strstr(t, " [label=") < line + len && sscanf(t, "n%d", &id) == 1) {
            size_t n = len - (size_t)(t - line);
            bool param = strstr(t, "\\nparam ") != NULL && strstr(t, "\\nparam ") < line + len;
            assert_true(id >= 0 && id < 256);
            assert_int_equal(seen[id], 0); /* declared once */
            seen[id] = 1;
            if (id > max_id) max_id = id;
            assert_true(n < sizeof decls[0]);
            memcpy(decls[id], t, n);
            decls[id][n] = '\0';
            if (clusters) {
                /* computed nodes in a cluster, parameters outside */
                if (param) {
                    assert_false(in_cluster);
                } else {
                    assert_true(in_cluster);
                }
            }
            if (in_cluster) cluster_nodes++;
        }
        line = end != NULL ? end + 1 : line + len;
    }
    assert_false(in_cluster);
    if (clusters) assert_true(num_clusters > 0);
    for (i = 0; i <= max_id; i++) {
        assert_int_equal(seen[i], 1); /* ids 0..max, each once */
        assert_true(strlen(decl) + strlen(decls[i]) + 2 < decl_cap);
        strcat(decl, decls[i]);
        strcat(decl, "\n");
    }
}

/* The edge lines of a DOT dump, in order. */
static void edge_lines(const char *dot, char *out, size_t cap) {
    const char *line = dot;
    out[0] = '\0';
    while (*line != '\0') {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line + 1) : strlen(line);
        const char *arrow = strstr(line, " -> ");
        if (arrow != NULL && arrow < line + len) {
            assert_true(strlen(out) + len + 1 < cap);
            strncat(out, line, len);
        }
        line += len;
    }
}

static tb_tensor *build_mlp_softmax(const tb_device *dev, const float *a, const float *w,
                                    const float *b, tb_tensor **hidden) {
    tb_shape sa = shp(TB_F32, 2, 6, 5, 0, 0), sw = shp(TB_F32, 2, 5, 3, 0, 0),
             sb = shp(TB_F32, 1, 3, 0, 0, 0);
    tb_tensor *x = tb_tensor_from_host(a, &sa, dev), *wt = tb_tensor_from_host(w, &sw, dev),
              *bt = tb_tensor_from_host(b, &sb, dev), *h, *y;
    h = tb_matmul(x, wt);
    h = take(h, tb_add(h, bt));
    h = take(h, tb_relu(h));
    y = tb_softmax(h, -1);
    assert_non_null(y);
    tb_tensor_release(x);
    tb_tensor_release(wt);
    tb_tensor_release(bt);
    *hidden = h;
    return y;
}

/* ---- an allocator hook ---- */

/* Counts live blocks and refuses the call numbered g_hook_fail_at (counted from 0 at arming;
   -1: none). Each block has a header in front, so a block given to the default allocator's
   free is caught by the address sanitizer. */
#define HOOK_HEADER 32
static long g_hook_live, g_hook_calls, g_hook_fail_at = -1, g_hook_refused;

static void *hook_alloc(size_t size, void *user_data) {
    unsigned char *p;
    long call = __atomic_fetch_add(&g_hook_calls, 1, __ATOMIC_RELAXED);
    (void)user_data;
    if (call == __atomic_load_n(&g_hook_fail_at, __ATOMIC_RELAXED)) {
        __atomic_add_fetch(&g_hook_refused, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    p = (unsigned char *)malloc(size + HOOK_HEADER);
    if (p == NULL) return NULL;
    __atomic_add_fetch(&g_hook_live, 1, __ATOMIC_RELAXED);
    return p + HOOK_HEADER;
}

static void hook_free(void *ptr, void *user_data) {
    (void)user_data;
    __atomic_sub_fetch(&g_hook_live, 1, __ATOMIC_RELAXED);
    free((unsigned char *)ptr - HOOK_HEADER);
}

static void hook_arm(long fail_at) {
    __atomic_store_n(&g_hook_fail_at, -1, __ATOMIC_RELAXED);
    __atomic_store_n(&g_hook_calls, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_hook_refused, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_hook_fail_at, fail_at, __ATOMIC_RELAXED);
}

/* A new session whose allocations go through the hook. */
static void hook_session(void) {
    tb_desc desc;
    tb_shutdown();
    hook_arm(-1);
    g_hook_live = 0;
    memset(&desc, 0, sizeof desc);
    desc.allocator.alloc = hook_alloc;
    desc.allocator.free = hook_free;
    assert_int_equal(tb_setup(&desc), TB_OK);
}

static void test_dot_clusters(void **state) {
    float a[30], w[15], b[3];
    tb_shape sa = shp(TB_F32, 2, 6, 5, 0, 0), sw = shp(TB_F32, 2, 5, 3, 0, 0),
             sb = shp(TB_F32, 1, 3, 0, 0, 0);
    tb_tensor *y, *h, *yc, *hc, *pair[2];
    char *dot, *plain, decl[8192], decl_cpu[8192], labels[512], labels_cpu[512];
    float got[18];
    int variant;
    (void)state;
    REQUIRE_OPENCL();
    fill(a, &sa, R_ANY, 0);
    fill(w, &sw, R_ANY, 0);
    fill(b, &sb, R_ANY, 0);
    for (variant = 0; variant < 2; variant++) {
        /* 0: the softmax alone; 1: the hidden layer is a result too */
        size_t n = variant == 0 ? 1 : 2;
        y = build_mlp_softmax(&g_ocl, a, w, b, &h);
        yc = build_mlp_softmax(&g_cpu, a, w, b, &hc);
        pair[0] = y;
        pair[1] = h;
        tb_clear_error();
        dot = tb_ir_dot(pair, n);
        assert_non_null(dot);
        assert_int_equal(tb_last_status(), TB_OK);
        check_dot(dot, true, decl, sizeof decl, labels, sizeof labels);
        assert_non_null(strstr(dot, "label=\"MM_6_3_5"));
        assert_non_null(strstr(dot, "label=\"S_6_3"));
        assert_non_null(strstr(labels, "MM_6_3_5"));
        assert_non_null(strstr(labels, "S_6_3"));
        /* the cpu backend draws no cluster; the nodes are the same, with the same labels */
        pair[0] = yc;
        pair[1] = hc;
        plain = tb_ir_dot(pair, n);
        assert_non_null(plain);
        assert_null(strstr(plain, "cluster"));
        assert_null(strstr(plain, "subgraph"));
        check_dot(plain, false, decl_cpu, sizeof decl_cpu, labels_cpu, sizeof labels_cpu);
        assert_string_equal(decl, decl_cpu);
        /* the edges too */
        {
            char edges[4096], edges_cpu[4096];
            edge_lines(dot, edges, sizeof edges);
            edge_lines(plain, edges_cpu, sizeof edges_cpu);
            assert_true(strlen(edges) > 0);
            assert_string_equal(edges, edges_cpu);
        }
        tb_free(dot);
        tb_free(plain);
        /* drawing the dump compiled the graph that runs now (and does not change the values) */
        assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
        tb_tensor_release(y);
        tb_tensor_release(h);
        tb_tensor_release(yc);
        tb_tensor_release(hc);
    }
    /* a dump of parameters only has no kernel: no cluster */
    {
        tb_tensor *x = tb_tensor_from_host(a, &sa, &g_ocl);
        dot = tb_ir_dot(&x, 1);
        assert_non_null(dot);
        assert_null(strstr(dot, "cluster"));
        tb_free(dot);
        tb_tensor_release(x);
    }
}

static char *dump_of(int which, tb_tensor *y) {
    switch (which) {
    case 0:
        return tb_ir_text(&y, 1);
    case 1:
        return tb_ir_dot(&y, 1);
    case 2:
        return tb_ir_backend_text(&y, 1);
    default:
        return tb_backend_metrics_report("opencl");
    }
}

/* Under a refused allocation anywhere, each dump of a graph that compiles (cached), and the
   backend's metrics report, is either complete, clusters included, or NULL with an error: the
   DOT used to lose its clusters silently, the report used to be empty. */
static void test_dumps_under_allocation_failures(void **state) {
    float a[30], w[15], b[3];
    tb_shape sa = shp(TB_F32, 2, 6, 5, 0, 0), sw = shp(TB_F32, 2, 5, 3, 0, 0),
             sb = shp(TB_F32, 1, 3, 0, 0, 0);
    tb_tensor *y, *h;
    int which;
    (void)state;
    REQUIRE_OPENCL();
    fill(a, &sa, R_ANY, 0);
    fill(w, &sw, R_ANY, 0);
    fill(b, &sb, R_ANY, 0);
    hook_session();
    y = build_mlp_softmax(&g_ocl, a, w, b, &h);
    for (which = 0; which < 4; which++) {
        char *expected = dump_of(which, y);
        long k;
        assert_non_null(expected);
        if (which == 1) assert_non_null(strstr(expected, "subgraph cluster"));
        for (k = 0;; k++) {
            char *text;
            bool refused;
            tb_clear_error();
            hook_arm(k);
            text = dump_of(which, y);
            refused = g_hook_refused != 0;
            hook_arm(-1);
            if (text == NULL && tb_last_status() == TB_OK) {
                fail_msg("dump %d, allocation %ld refused: NULL without an error", which, k);
            }
            if (text != NULL && (strcmp(text, expected) != 0 || tb_last_status() != TB_OK)) {
                fail_msg("dump %d, allocation %ld refused: an incomplete text (error '%s'):\n%s",
                         which, k, tb_last_error(), text);
            }
            tb_free(text);
            if (!refused) break; /* past the last allocation */
        }
        assert_true(k > 1);
        tb_free(expected);
    }
    tb_tensor_release(y);
    tb_tensor_release(h);
    tb_shutdown();
    assert_int_equal(tb_setup(NULL), TB_OK);
    probe();
}

/* A graph that does not compile is drawn without clusters, and the dump reports no error. */
static void test_dot_compile_error_plain(void **state) {
    tb_custom_op_desc d;
    tb_op op;
    float a[4] = {1, 2, 3, 4};
    tb_shape s = shp(TB_F32, 1, 4, 0, 0, 0);
    tb_tensor *x, *y, *z;
    char *dot;
    (void)state;
    REQUIRE_OPENCL();
    memset(&d, 0, sizeof d);
    d.name = "ocl_broken";
    d.num_inputs = 1;
    d.reference = copy_reference;
    d.opencl_expr = "x0 +* no_such_name";
    if (tb_op_lookup("ocl_broken", &op) != TB_OK) assert_int_equal(tb_op_register(&d, &op), TB_OK);
    x = tb_tensor_from_host(a, &s, &g_ocl);
    y = tb_call_op(op, &x, 1, NULL, 0);
    z = tb_exp(y);
    assert_non_null(z);
    tb_clear_error();
    dot = tb_ir_dot(&z, 1);
    assert_non_null(dot);
    assert_int_equal(tb_last_status(), TB_OK);
    assert_null(strstr(dot, "cluster"));
    assert_non_null(strstr(dot, "ocl_broken"));
    assert_non_null(strstr(dot, "exp"));
    tb_free(dot);
    tb_tensor_release(z);
    tb_tensor_release(y);
    tb_tensor_release(x);
}

/* in the order they run */
static const struct CMUnitTest dumps_tests[] = {
    cmocka_unit_test(test_dot_clusters),
    cmocka_unit_test(test_dumps_under_allocation_failures),
    OPENCL_ONLY(test_dot_compile_error_plain),
};
