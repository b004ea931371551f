/* The compiled-backend suite, matmul. Matmul and row kernels: matmul in every dtype and layout with
   its epilogues, a matmul through a reshape, a matmul whose stores keep part of each row, rows of
   elementwise work, softmax and layer_norm, the GPU code paths (OpenCL), and a batched left
   operand times a matrix as one matmul. Part of tests/backend_suite/suite.c. */

/* ---- matmul, softmax, layer_norm ---- */

typedef struct mm_arg {
    int epilogue;     /* 0 none, 1 + bias, 2 relu(+ bias), 3 * 2 then gelu, 4 detached,
                         5 reshaped flat */
    bool transpose_b; /* b given as [n, k] and transposed (a view) */
    bool prologue;    /* a is exp(a) * 0.5 */
    bool transpose_a; /* a given as [k, m] and transposed (a view) */
} mm_arg;

static tb_tensor *build_matmul(tb_tensor **in, const void *arg) {
    const mm_arg *a = (const mm_arg *)arg;
    tb_tensor *b = a->transpose_b ? tb_transpose(in[1], -1, -2) : tb_tensor_retain(in[1]);
    tb_tensor *x = a->transpose_a ? tb_transpose(in[0], -1, -2) : tb_tensor_retain(in[0]), *y, *t;
    if (a->prologue) {
        t = tb_exp(x);
        tb_tensor_release(x);
        x = tb_mul_scalar(t, 0.5);
        tb_tensor_release(t);
    }
    y = tb_matmul(x, b);
    tb_tensor_release(x);
    tb_tensor_release(b);
    if (a->epilogue >= 1 && a->epilogue <= 2) {
        t = tb_add(y, in[2]);
        tb_tensor_release(y);
        y = t;
    }
    if (a->epilogue == 2) {
        t = tb_relu(y);
        tb_tensor_release(y);
        y = t;
    }
    if (a->epilogue == 3) {
        t = tb_mul_scalar(y, 2.0);
        tb_tensor_release(y);
        y = tb_gelu(t);
        tb_tensor_release(t);
    }
    if (a->epilogue == 4 || a->epilogue == 5) { /* a reshape to its own dims, or flat */
        tb_shape ys = tb_tensor_shape(y);
        int64_t n = 1;
        int32_t d;
        for (d = 0; d < ys.rank; d++)
            n *= ys.dims[d];
        t = a->epilogue == 4 ? tb_detach(y) : tb_reshape(y, &n, 1);
        tb_tensor_release(y);
        y = t;
    }
    return y;
}

static void test_matmul(void **state) {
    static const mm_arg plain = {0, false, false, false}, bias = {1, false, false, false},
                        relu_bias = {2, false, false, false},
                        scaled_gelu = {3, false, false, false},
                        transposed = {0, true, false, false},
                        transposed_bias = {2, true, false, false};
    input in[3];
    const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8};
    size_t d;
    (void)state;
    REQUIRE_OPENCL();
    for (d = 0; d < 5; d++) {
        tb_dtype dt = dtypes[d];
        if (dt == TB_I64 || dt == TB_U8) continue; /* integer accumulation: as i32 */
        in[0] = in_of(shp(dt, 2, 5, 7, 0, 0), R_ANY);
        in[1] = in_of(shp(dt, 2, 7, 3, 0, 0), R_ANY);
        add_case("matmul [5,7]x[7,3]", build_matmul, &plain, in, 2);
    }
    in[0] = in_of(shp(TB_F32, 2, 70, 33, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 2, 33, 90, 0, 0), R_ANY);
    in[2] = in_of(shp(TB_F32, 1, 90, 0, 0, 0), R_ANY);
    add_case("relu(matmul [70,33]x[33,90] + bias)", build_matmul, &relu_bias, in, 3);
    add_case("gelu(matmul * 2)", build_matmul, &scaled_gelu, in, 2);
    in[1] = in_of(shp(TB_F32, 2, 90, 33, 0, 0), R_ANY);
    add_case("relu(matmul(a, b^T) + bias)", build_matmul, &transposed_bias, in, 3);
    (void)bias, (void)transposed;
    /* batched, broadcast batch, 1-D cases, empty k */
    in[0] = in_of(shp(TB_F32, 3, 4, 6, 5, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 3, 4, 5, 7, 0), R_ANY);
    add_case("batched matmul", build_matmul, &plain, in, 2);
    in[1] = in_of(shp(TB_F32, 2, 5, 7, 0, 0), R_ANY);
    add_case("matmul broadcasting b over the batch", build_matmul, &plain, in, 2);
    in[0] = in_of(shp(TB_F32, 4, 2, 1, 3, 5), R_ANY);
    in[1] = in_of(shp(TB_F32, 3, 4, 5, 2, 0), R_ANY);
    add_case("matmul broadcasting both batches", build_matmul, &plain, in, 2);
    in[0] = in_of(shp(TB_F32, 1, 9, 0, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 1, 9, 0, 0, 0), R_ANY);
    add_case("dot product", build_matmul, &plain, in, 2);
    in[1] = in_of(shp(TB_F32, 2, 9, 4, 0, 0), R_ANY);
    add_case("vector x matrix", build_matmul, &plain, in, 2);
    in[0] = in_of(shp(TB_F32, 2, 4, 9, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 1, 9, 0, 0, 0), R_ANY);
    add_case("matrix x vector", build_matmul, &plain, in, 2);
    in[0] = in_of(shp(TB_F32, 2, 3, 0, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 2, 0, 4, 0, 0), R_ANY);
    add_case("matmul with k = 0", build_matmul, &plain, in, 2);
    /* small N (a classifier's last layer): native adds one vector of B's row per step */
    in[0] = in_of(shp(TB_F32, 2, 41, 64, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 2, 64, 10, 0, 0), R_ANY);
    in[2] = in_of(shp(TB_F32, 1, 10, 0, 0, 0), R_ANY);
    add_case("relu(matmul [41,64]x[64,10] + bias)", build_matmul, &relu_bias, in, 3);
    in[1] = in_of(shp(TB_F32, 2, 64, 2, 0, 0), R_ANY);
    add_case("matmul [41,64]x[64,2]", build_matmul, &plain, in, 2);
    in[1] = in_of(shp(TB_F32, 2, 64, 3, 0, 0), R_ANY);
    add_case("matmul [41,64]x[64,3]", build_matmul, &plain, in, 2);
    /* fewer rows than a block (batched matrix-vector products): native takes blocks of up to
       64 columns, B's row read as vectors from one address where it lies in a buffer, gathered
       where B is a view (transposed), the epilogue on every column */
    in[0] = in_of(shp(TB_F32, 3, 6, 1, 37, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 3, 6, 37, 192, 0), R_ANY);
    in[2] = in_of(shp(TB_F32, 1, 192, 0, 0, 0), R_ANY);
    add_case("relu(matmul [6,1,37]x[6,37,192] + bias)", build_matmul, &relu_bias, in, 3);
    in[0] = in_of(shp(TB_F32, 3, 6, 2, 37, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 3, 6, 192, 37, 0), R_ANY);
    add_case("relu(matmul(a, b^T) + bias) [6,2,37]x[6,37,192]", build_matmul, &transposed_bias, in,
             3);
    /* blocks that divide the output (unclamped reads) in a grid that groups pad */
    in[0] = in_of(shp(TB_F32, 2, 40, 15, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 2, 15, 72, 0, 0), R_ANY);
    add_case("matmul [40,15]x[15,72]", build_matmul, &plain, in, 2);
    in[0] = in_of(shp(TB_I32, 2, 40, 64, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_I32, 2, 64, 8, 0, 0), R_ANY);
    add_case("matmul i32 [40,64]x[64,8]", build_matmul, &plain, in, 2);
    in[0] = in_of(shp(TB_F32, 3, 5, 3, 21, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 3, 5, 21, 48, 0), R_ANY);
    add_case("batched matmul [5,3,21]x[5,21,48]", build_matmul, &plain, in, 2);
    flush_cases();
    /* big enough for CPU devices to copy the operands into panels first: sizes that are not
       multiples of the panel widths, both float types, views and producers in the panels */
    {
        static const mm_arg exp_a = {0, false, true, false};
        for (d = 0; d < 2; d++) {
            tb_dtype dt = dtypes[d];
            in[0] = in_of(shp(dt, 2, 100, 70, 0, 0), R_ANY);
            in[1] = in_of(shp(dt, 2, 70, 90, 0, 0), R_ANY);
            in[2] = in_of(shp(dt, 1, 90, 0, 0, 0), R_ANY);
            add_case("relu(matmul [100,70]x[70,90] + bias)", build_matmul, &relu_bias, in, 3);
            add_case("matmul(exp(a) * 0.5, b)", build_matmul, &exp_a, in, 2);
            in[1] = in_of(shp(dt, 2, 90, 70, 0, 0), R_ANY);
            add_case("relu(matmul(a, b^T) + bias) [100,70]x[70,90]", build_matmul, &transposed_bias,
                     in, 3);
        }
        in[0] = in_of(shp(TB_F32, 3, 3, 70, 61, 0), R_ANY);
        in[1] = in_of(shp(TB_F32, 3, 3, 61, 83, 0), R_ANY);
        add_case("batched matmul [3,70,61]x[3,61,83]", build_matmul, &plain, in, 2);
        /* A computed in the graph with rows that fill whole panels: read in place, both
           operands broadcast over a two-dimensional batch */
        in[0] = in_of(shp(TB_F32, 4, 2, 1, 64, 61), R_ANY);
        in[1] = in_of(shp(TB_F32, 4, 1, 3, 61, 83), R_ANY);
        add_case("matmul(exp(a) * 0.5, b) [2,1,64,61]x[1,3,61,83] (both broadcast)", build_matmul,
                 &exp_a, in, 2);
        in[0] = in_of(shp(TB_F32, 3, 3, 70, 61, 0), R_ANY);
        in[1] = in_of(shp(TB_F32, 2, 61, 83, 0, 0), R_ANY);
        add_case("matmul [3,70,61]x[61,83] (b broadcast)", build_matmul, &scaled_gelu, in, 2);
        in[0] = in_of(shp(TB_F32, 2, 256, 256, 0, 0), R_ANY);
        in[1] = in_of(shp(TB_F32, 2, 256, 256, 0, 0), R_ANY);
        if (!g_small) add_case("matmul [256,256]x[256,256]", build_matmul, &plain, in, 2);
        /* B larger than a core's caches (megabytes): the work items go over the output in
           groups of column panels, the last group narrower; a long K: groups of one panel */
        for (d = 0; d < (g_small ? 0u : 2u); d++) {
            in[0] = in_of(shp(dtypes[d], 2, 37, 1100, 0, 0), R_ANY);
            in[1] = in_of(shp(dtypes[d], 2, 1100, 500, 0, 0), R_ANY);
            in[2] = in_of(shp(dtypes[d], 1, 500, 0, 0, 0), R_ANY);
            add_case("relu(matmul [37,1100]x[1100,500] + bias)", build_matmul, &relu_bias, in, 3);
        }
        in[0] = in_of(shp(TB_F32, 3, 2, 20, 1100, 0), R_ANY);
        in[1] = in_of(shp(TB_F32, 3, 2, 1100, 500, 0), R_ANY);
        if (!g_small)
            add_case("batched matmul [2,20,1100]x[2,1100,500]", build_matmul, &plain, in, 2);
        in[0] = in_of(shp(TB_F32, 2, 5, 40000, 0, 0), R_ANY);
        in[1] = in_of(shp(TB_F32, 2, 40000, 33, 0, 0), R_ANY);
        if (!g_small) add_case("matmul [5,40000]x[40000,33]", build_matmul, &plain, in, 2);
        /* the matmul under a reshape: its kernel stores through it (to its own dims: a
           detached gradient; flat) */
        {
            static const mm_arg detached = {4, false, false, false},
                                flat = {5, false, false, false},
                                detached_t = {4, true, false, true},
                                flat_t = {5, true, false, true};
            in[0] = in_of(shp(TB_F32, 2, 100, 70, 0, 0), R_ANY);
            in[1] = in_of(shp(TB_F32, 2, 70, 90, 0, 0), R_ANY);
            add_case("detach(matmul [100,70]x[70,90])", build_matmul, &detached, in, 2);
            add_case("reshape(matmul [100,70]x[70,90], [9000])", build_matmul, &flat, in, 2);
            in[0] = in_of(shp(TB_F32, 2, 70, 100, 0, 0), R_ANY);
            in[1] = in_of(shp(TB_F32, 2, 90, 70, 0, 0), R_ANY);
            add_case("detach(matmul(a^T, b^T))", build_matmul, &detached_t, in, 2);
            add_case("reshape(matmul(a^T, b^T), [9000])", build_matmul, &flat_t, in, 2);
        }
        flush_cases();
    }
}

/* A matmul of a transposed operand whose result is only detached (a gradient as tb_grad
   returns it): the matmul's kernel stores through the reshape. Against the cpu backend. */
static void test_matmul_through_reshape(void **state) {
    static float a[256 * 300], b[256 * 130];
    float got[300 * 130], want[300 * 130];
    tb_shape sa = shp(TB_F32, 2, 256, 300, 0, 0), sb = shp(TB_F32, 2, 256, 130, 0, 0);
    const tb_device *devs[2];
    int k;
    size_t i;
    (void)state;
    REQUIRE_OPENCL();
    devs[0] = &g_ocl;
    devs[1] = &g_cpu;
    fill(a, &sa, R_ANY, 1);
    fill(b, &sb, R_ANY, 2);
    for (k = 0; k < 2; k++) {
        tb_tensor *x = tb_tensor_from_host(a, &sa, devs[k]);
        tb_tensor *y = tb_tensor_from_host(b, &sb, devs[k]);
        tb_tensor *xt = tb_transpose(x, 0, 1), *m = tb_matmul(xt, y), *r = tb_detach(m);
        assert_non_null(r);
        assert_int_equal(tb_tensor_to_host(r, k == 0 ? got : want, sizeof got), TB_OK);
        tb_tensor_release(r);
        tb_tensor_release(m);
        tb_tensor_release(xt);
        tb_tensor_release(y);
        tb_tensor_release(x);
    }
    for (i = 0; i < 300 * 130; i++)
        assert_true(fabsf(got[i] - want[i]) <= 1e-3f * (1.0f + fabsf(want[i])));
}

/* A matmul read through a reshape that splits its columns into rows of wp and a slice of
   columns [at, at + w) of each (a convolution over whole padded rows cuts its padding columns
   away so): the kernel stores the kept columns alone, through the epilogue (relu of the slice
   plus a tensor of its shape) at the slice's positions. */
typedef struct crop_arg {
    int64_t h, wp, at, w;
    bool residual; /* relu(slice + in[2]), else the slice */
} crop_arg;

static tb_tensor *build_crop(tb_tensor **in, const void *arg) {
    const crop_arg *c = (const crop_arg *)arg;
    tb_tensor *m = tb_matmul(in[0], in[1]), *r, *s, *t, *y;
    tb_shape ms = tb_tensor_shape(m);
    int64_t dims[TB_MAX_RANK];
    int32_t d;
    for (d = 0; d + 1 < ms.rank; d++)
        dims[d] = ms.dims[d];
    dims[ms.rank - 1] = c->h;
    dims[ms.rank] = c->wp;
    r = tb_reshape(m, dims, ms.rank + 1);
    s = tb_slice(r, ms.rank, c->at, c->at + c->w, 1);
    tb_tensor_release(r);
    tb_tensor_release(m);
    if (!c->residual) return s;
    t = tb_add(s, in[2]);
    y = tb_relu(t);
    tb_tensor_release(t);
    tb_tensor_release(s);
    return y;
}

/* The crop on the suite's device and on cpu from the same inputs, compared directly (not
   stacked with other cases, whose concat would be the kernel's output), and the device's code:
   one matmul kernel (no elementwise one after it) whose CPU form stores each row of wp it meets
   as a run of the kept columns. `runs`: expect that form. */
static void crop_run(const char *name, const crop_arg *c, const tb_shape *sh, size_t nin,
                     bool runs) {
    tb_tensor *in[2][3], *y[2];
    void *host[3];
    char *text;
    size_t i;
    int k;
    for (i = 0; i < nin; i++) {
        host[i] = host_alloc(&sh[i]);
        fill(host[i], &sh[i], R_ANY, 0);
    }
    for (k = 0; k < 2; k++) {
        for (i = 0; i < nin; i++) {
            in[k][i] = tb_tensor_from_host(host[i], &sh[i], k ? &g_ocl : &g_cpu);
            assert_non_null(in[k][i]);
        }
        y[k] = build_crop(in[k], c);
        if (y[k] == NULL) fail_msg("%s: %s", name, tb_last_error());
    }
    text = tb_ir_backend_text(&y[1], 1);
    if (text == NULL) fail_msg("%s: %s", name, tb_last_error());
    if (strstr(text, "void E_") != NULL || strstr(text, "void MM_") == NULL ||
        (runs && strstr(text, "for (long sy = col0 / ") == NULL))
        fail_msg("%s: not one matmul kernel storing the kept columns:\n%s", name, text);
    tb_free(text);
    compare_tensors(name, y[0], y[1]);
    for (k = 0; k < 2; k++) {
        tb_tensor_release(y[k]);
        for (i = 0; i < nin; i++)
            tb_tensor_release(in[k][i]);
    }
    for (i = 0; i < nin; i++)
        free(host[i]);
}

/* Packed (64 rows of 13 on AVX-512: a partial last row block) with a batch, the columns 1..30
   of rows of 40, and a residual; a register matmul keeping 2..8 of 10; one row of columns
   (h 1) and one row of the matmul (m 1) in a batch of 3; the last column alone of each row of
   7. On a GPU's code (the test hook), the tiles' strided columns test each column. */
static void crop_cases(bool runs) {
    static const struct {
        const char *name;
        crop_arg arg;
        int32_t rank[3]; /* a, b, and the residual (rank 0: none) */
        int64_t dims[3][4];
    } cases[] = {
        {"relu(matmul's columns 1..30 of each 40 + x), packed",
         {12, 40, 1, 30, true},
         {3, 3, 4},
         {{2, 64, 72}, {2, 72, 480}, {2, 64, 12, 30}}},
        {"matmul's columns 2..8 of each 10", {3, 10, 2, 7, false}, {2, 2, 0}, {{5, 7}, {7, 30}}},
        {"relu(one row's columns 0..8 of 16 + x)",
         {1, 16, 0, 9, true},
         {3, 3, 4},
         {{3, 1, 6}, {3, 6, 16}, {3, 1, 1, 9}}},
        {"matmul's last column of each 7", {5, 7, 6, 1, false}, {2, 2, 0}, {{9, 4}, {4, 35}}},
    };
    size_t c, i;
    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tb_shape sh[3];
        size_t nin = cases[c].rank[2] > 0 ? 3 : 2;
        for (i = 0; i < nin; i++) {
            const int64_t *d = cases[c].dims[i];
            sh[i] = shp(TB_F32, cases[c].rank[i], d[0], d[1], d[2], d[3]);
        }
        crop_run(cases[c].name, &cases[c].arg, sh, nin, runs);
    }
}

static void test_matmul_crop(void **state) {
    tb_device_info info;
    (void)state;
    REQUIRE_OPENCL();
    assert_int_equal(tb_backend_device_info(&g_ocl, &info), TB_OK);
    crop_cases(info.device.type == TB_DEVICE_CPU);
}

/* A packed f32 matmul's epilogue runs W columns at once where each block row is whole
   vectors: bias, gelu, exp (a call that kept the scalar loop from vectorising), seen through
   a reshape that keeps the last axis ([90, 64] as [6, 15, 64]), with an edge block (rows
   80..95 of 90 with 16-row blocks) stored as scalars; values as cpu's. */
static void test_matmul_vector_epilogue(void **state) {
    enum { M = 90, K = 72, N = 64 };
    static float a[M * K], b[K * N], c[N], got[M * N], want[M * N];
    tb_shape sa = shp(TB_F32, 2, M, K, 0, 0), sb = shp(TB_F32, 2, K, N, 0, 0);
    tb_shape sc = shp(TB_F32, 1, N, 0, 0, 0);
    const int64_t three[3] = {6, M / 6, N};
    const tb_device *devs[2];
    int k;
    size_t i;
    (void)state;
    REQUIRE_OPENCL();
    devs[0] = &g_ocl;
    devs[1] = &g_cpu;
    fill(a, &sa, R_ANY, 5);
    fill(b, &sb, R_ANY, 6);
    fill(c, &sc, R_ANY, 7);
    for (k = 0; k < 2; k++) {
        tb_tensor *x = tb_tensor_from_host(a, &sa, devs[k]);
        tb_tensor *w = tb_tensor_from_host(b, &sb, devs[k]);
        tb_tensor *bias = tb_tensor_from_host(c, &sc, devs[k]);
        tb_tensor *m = tb_matmul(x, w), *r = tb_reshape(m, three, 3), *h = tb_add(r, bias);
        tb_tensor *gl = tb_gelu(h), *hs = tb_mul_scalar(gl, -0.5), *y = tb_exp(hs);
        assert_non_null(y);
        if (k == 0) {
            char *text = tb_ir_backend_text(&y, 1);
            assert_non_null(text);
            assert_non_null(strstr(text, "PB_"));
            assert_non_null(strstr(text, "= TB_VLD(0, acc[ii]);"));
            tb_free(text);
        }
        assert_int_equal(tb_tensor_to_host(y, k == 0 ? got : want, sizeof got), TB_OK);
        tb_tensor_release(y);
        tb_tensor_release(hs);
        tb_tensor_release(gl);
        tb_tensor_release(h);
        tb_tensor_release(r);
        tb_tensor_release(m);
        tb_tensor_release(bias);
        tb_tensor_release(w);
        tb_tensor_release(x);
    }
    for (i = 0; i < M * N; i++)
        if (!(fabsf(got[i] - want[i]) <= 1e-4f * (1.0f + fabsf(want[i]))))
            fail_msg("element %zu: %.9g, cpu's %.9g", i, (double)got[i], (double)want[i]);
}

/* An elementwise kernel over rows the vectors cannot take (a last axis of 28): on the native
   backend a work item runs a row, its leading dims' positions once per row, and the row's
   elements in pairs (a view divides their index by 2); values as cpu's with a transposed and a
   row-broadcast operand, a max-pool-like gather and a select. */
static void test_elementwise_rows(void **state) {
    static float a[6 * 32 * 28], c[6 * 32 * 14];
    float got[6 * 32 * 28], want[6 * 32 * 28];
    tb_shape sa = shp(TB_F32, 3, 6, 32, 28, 0), sc = shp(TB_F32, 3, 6, 32, 14, 0);
    const tb_device *devs[2];
    int k;
    size_t i;
    (void)state;
    REQUIRE_OPENCL();
    devs[0] = &g_ocl;
    devs[1] = &g_cpu;
    fill(a, &sa, R_ANY, 3);
    fill(c, &sc, R_ANY, 4);
    for (k = 0; k < 2; k++) {
        const int64_t up[4] = {6, 32, 14, 2}, flat[3] = {6, 32, 28};
        tb_tensor *x = tb_tensor_from_host(a, &sa, devs[k]);
        tb_tensor *p = tb_tensor_from_host(c, &sc, devs[k]);
        tb_tensor *pu = tb_unsqueeze(p, 3), *pe = tb_expand(pu, up, 4);
        tb_tensor *pr = tb_reshape(pe, flat, 3); /* each pooled value twice along the row */
        tb_tensor *xt = tb_transpose(x, 0, 1), *xb = tb_transpose(xt, 0, 1);
        tb_tensor *z = tb_zeros(&sa, devs[k]), *pos = tb_gt(xb, z), *m = tb_mul(pr, xb);
        tb_tensor *y = tb_where(pos, m, z);
        char *text;
        assert_non_null(y);
        if (k == 0 && strcmp(TEST_BACKEND, "native") == 0) {
            text = tb_ir_backend_text(&y, 1);
            assert_non_null(text);
            /* the row in pairs: the view of the pooled values divides its index by 2 */
            if (strstr(text, "< 14L; i") == NULL || strstr(text, " * 2L + 1L] = ") == NULL)
                fail_msg("no row loop in pairs in:\n%s", text);
            tb_free(text);
        }
        assert_int_equal(tb_tensor_to_host(y, k == 0 ? got : want, sizeof got), TB_OK);
        tb_tensor_release(y);
        tb_tensor_release(z);
        tb_tensor_release(m);
        tb_tensor_release(pos);
        tb_tensor_release(xb);
        tb_tensor_release(xt);
        tb_tensor_release(pr);
        tb_tensor_release(pe);
        tb_tensor_release(pu);
        tb_tensor_release(p);
        tb_tensor_release(x);
    }
    for (i = 0; i < 6 * 32 * 28; i++)
        if (got[i] != want[i])
            fail_msg("element %zu: %g, cpu %g", i, (double)got[i], (double)want[i]);
}

typedef struct norm_arg {
    int which; /* 0 softmax, 1 log_softmax, 2 layer_norm */
    int32_t axis;
    bool weight, bias, prologue, epilogue;
} norm_arg;

static tb_tensor *build_norm(tb_tensor **in, const void *arg) {
    const norm_arg *a = (const norm_arg *)arg;
    tb_tensor *x = a->prologue ? tb_mul_scalar(in[0], 3.0) : tb_tensor_retain(in[0]), *y, *t;
    if (a->which == 0) {
        y = tb_softmax(x, a->axis);
    } else if (a->which == 1) {
        y = tb_log_softmax(x, a->axis);
    } else {
        y = tb_layer_norm(x, a->axis, a->weight ? in[1] : NULL, a->bias ? in[2] : NULL, 1e-5);
    }
    tb_tensor_release(x);
    if (a->epilogue) {
        t = tb_add_scalar(y, 1.0);
        tb_tensor_release(y);
        y = tb_tanh(t);
        tb_tensor_release(t);
    }
    return y;
}

static void test_softmax_layer_norm(void **state) {
    static norm_arg args[64];
    size_t n = 0;
    int which;
    int32_t axis;
    input in[3];
    (void)state;
    REQUIRE_OPENCL();
    for (which = 0; which < 2; which++) {
        for (axis = -3; axis < 3; axis++) {
            norm_arg *a;
            char name[96];
            if (axis == -3 || axis == 2) continue; /* as 0 and -1 */
            a = &args[n++];
            memset(a, 0, sizeof *a);
            a->which = which;
            a->axis = axis;
            a->prologue = axis == 0;
            a->epilogue = axis == -1;
            in[0] = in_of(shp(TB_F32, 3, 4, 5, 6, 0), R_ANY);
            snprintf(name, sizeof name, "%s axis %d", which ? "log_softmax" : "softmax", (int)axis);
            add_case(name, build_norm, a, in, 1);
        }
        {
            norm_arg *a = &args[n++];
            memset(a, 0, sizeof *a);
            a->which = which;
            a->axis = 1;
            in[0] = in_of(shp(TB_F64, 2, 3, 3000, 0, 0), R_ANY);
            add_case("softmax of long f64 rows", build_norm, a, in, 1);
        }
    }
    for (axis = 1; axis <= 2; axis++) {
        int wb;
        for (wb = 0; wb < 4; wb++) {
            norm_arg *a;
            char name[96];
            if ((wb == 0 || wb == 3) != (axis == 1)) continue;
            a = &args[n++];
            memset(a, 0, sizeof *a);
            a->which = 2;
            a->axis = axis;
            a->weight = (wb & 1) != 0;
            a->bias = (wb & 2) != 0;
            a->epilogue = wb == 3;
            a->prologue = wb == 1;
            in[0] = in_of(shp(TB_F32, 3, 3, 4, 5, 0), R_ANY);
            in[1] =
                in_of(axis == 1 ? shp(TB_F32, 1, 5, 0, 0, 0) : shp(TB_F32, 2, 4, 5, 0, 0), R_ANY);
            in[2] = in[1];
            snprintf(name, sizeof name, "layer_norm over %d dims%s%s", (int)axis,
                     a->weight ? " weight" : "", a->bias ? " bias" : "");
            add_case(name, build_norm, a, in, 3);
        }
    }
    {
        norm_arg *a = &args[n++];
        memset(a, 0, sizeof *a);
        a->which = 2;
        a->axis = 1;
        in[0] = in_of(shp(TB_F32, 2, 2, 4096, 0, 0), R_ANY);
        add_case("layer_norm of long rows", build_norm, a, in, 1);
    }
    flush_cases();
}

/* The code a GPU gets (local-memory matmul tiles, a work-group per row, split reductions
   with work-groups per chunk), run on whatever device is here through the code generator's
   test hook. */
static void test_gpu_code_paths(void **state) {
    static const mm_arg relu_bias = {2, false, false, false}, plain = {0, false, false, false},
                        transposed_bias = {2, true, false, false};
    static reduce_arg red[6];
    static norm_arg norm[2];
    input in[3];
    int i;
    (void)state;
    REQUIRE_OPENCL();
#ifndef TB_NO_OPENCL
    tb__ocl_codegen_as_gpu = 1;
#endif
    tb_computation_cache_clear();
    in[0] = in_of(shp(TB_F32, 2, 70, 33, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 2, 33, 90, 0, 0), R_ANY);
    in[2] = in_of(shp(TB_F32, 1, 90, 0, 0, 0), R_ANY);
    add_case("tiled relu(matmul + bias)", build_matmul, &relu_bias, in, 3);
    in[1] = in_of(shp(TB_F32, 2, 90, 33, 0, 0), R_ANY);
    add_case("tiled relu(matmul(a, b^T) + bias)", build_matmul, &transposed_bias, in, 3);
    in[0] = in_of(shp(TB_I32, 3, 3, 6, 5, 0), R_ANY);
    in[1] = in_of(shp(TB_I32, 3, 3, 5, 7, 0), R_ANY);
    add_case("tiled batched i32 matmul", build_matmul, &plain, in, 2);
    in[0] = in_of(shp(TB_F64, 1, 40, 0, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F64, 2, 40, 3, 0, 0), R_ANY);
    add_case("tiled f64 vector x matrix", build_matmul, &plain, in, 2);
    for (i = 0; i < 6; i++) {
        memset(&red[i], 0, sizeof red[i]);
        red[i].which = i;
        red[i].axes[0] = 1;
        red[i].num_axes = 1;
        red[i].prologue = i < 2;
    }
    in[0] = in_of(shp(TB_F32, 2, 3, 3000, 0, 0), R_WHOLE);
    for (i = 0; i < 6; i++)
        add_case("work-group reduction", build_reduce, &red[i], in, 1);
    in[0] = in_of(shp(TB_F32, 2, 2, 70000, 0, 0), R_ANY);
    for (i = 0; i < 4; i++)
        add_case("split reduction", build_reduce, &red[i], in, 1);
    for (i = 0; i < 2; i++) {
        memset(&norm[i], 0, sizeof norm[i]);
        norm[i].which = i == 0 ? 0 : 2;
        norm[i].axis = 1;
        norm[i].epilogue = true;
    }
    in[0] = in_of(shp(TB_F32, 2, 5, 2000, 0, 0), R_ANY);
    add_case("work-group softmax", build_norm, &norm[0], in, 1);
    add_case("work-group layer_norm", build_norm, &norm[1], in, 1);
    flush_cases();
    crop_cases(false);
#ifndef TB_NO_OPENCL
    tb__ocl_codegen_as_gpu = 0;
#endif
    tb_computation_cache_clear();
}

/* A batched left operand times a matrix is one matmul whose rows are the batch's rows (the
   matrix read once, as PyTorch's matmul does), in values and in gradients. */
static void test_batched_times_matrix_is_one_matmul(void **state) {
    tb_shape sx = shp(TB_F32, 3, 3, 5, 8, 0), sw = shp(TB_F32, 2, 8, 6, 0, 0);
    tb_tensor *x[2], *w[2], *y[2], *gx[2], *gw[2];
    char *text;
    int d;
    (void)state;
    REQUIRE_OPENCL();
    for (d = 0; d < 2; d++) {
        const tb_device *dev = d ? &g_ocl : &g_cpu;
        tb_tensor *loss, *params[2], *grads[2];
        tb_manual_seed(11);
        x[d] = tb_rand(&sx, dev);
        w[d] = tb_rand(&sw, dev);
        assert_int_equal(tb_set_requires_grad(x[d], true), TB_OK);
        assert_int_equal(tb_set_requires_grad(w[d], true), TB_OK);
        y[d] = tb_matmul(x[d], w[d]);
        assert_non_null(y[d]);
        assert_int_equal(tb_tensor_shape(y[d]).rank, 3);
        assert_int_equal(tb_tensor_shape(y[d]).dims[1], 5);
        assert_int_equal(tb_tensor_shape(y[d]).dims[2], 6);
        if (d == 1) {
            text = tb_ir_backend_text(&y[d], 1);
            assert_non_null(text);
            assert_non_null(strstr(text, "MM_15_6_8"));
            assert_null(strstr(text, "_b3"));
            tb_free(text);
        }
        loss = tb_sum(y[d], NULL, 0, false);
        params[0] = x[d];
        params[1] = w[d];
        assert_int_equal(tb_grad(loss, NULL, params, 2, grads), TB_OK);
        gx[d] = grads[0];
        gw[d] = grads[1];
        tb_tensor_release(loss);
    }
    compare_tensors("batched x times matrix", y[0], y[1]);
    compare_tensors("its gradient for x", gx[0], gx[1]);
    compare_tensors("its gradient for the matrix", gw[0], gw[1]);
    for (d = 0; d < 2; d++) {
        tb_tensor_release(x[d]);
        tb_tensor_release(w[d]);
        tb_tensor_release(y[d]);
        tb_tensor_release(gx[d]);
        tb_tensor_release(gw[d]);
    }
}

/* in the order they run */
static const struct CMUnitTest matmul_tests[] = {
    cmocka_unit_test(test_matmul),
    cmocka_unit_test(test_matmul_through_reshape),
    cmocka_unit_test(test_matmul_vector_epilogue),
    cmocka_unit_test(test_matmul_crop),
    cmocka_unit_test(test_elementwise_rows),
    cmocka_unit_test(test_softmax_layer_norm),
    cmocka_unit_test(test_batched_times_matrix_is_one_matmul),
    OPENCL_ONLY(test_gpu_code_paths),
};
