/* The compiled-backend suite, fusion. Fusion: the kernel count and the values of each fusion
   pattern, matmuls reading their operands in place and the panels they keep, chains and argument
   lists too long for one kernel, vector forms (exp, erf, gelu, where), norms over rows streamed,
   max/min with NaN, and scalars feeding every kind of kernel. Part of tests/backend_suite/suite.c.
 */

/* ---- fusion: kernel counts and values ---- */

static tb_tensor *build_long_chain(tb_tensor **in, const void *arg) {
    int n = *(const int *)arg, i;
    tb_tensor *x = tb_tensor_retain(in[0]);
    for (i = 0; i < n; i++) {
        switch (i % 5) {
        case 0:
            x = take(x, tb_mul_scalar(x, 1.01));
            break;
        case 1:
            x = take(x, tb_add(x, in[1]));
            break; /* broadcast [7] over [5,7] */
        case 2:
            x = take(x, tb_tanh(x));
            break;
        case 3:
            x = take(x, tb_sub(x, in[2]));
            break;
            /* broadcast [5,1] */
        default:
            x = take(x, tb_abs(x));
            break;
        }
    }
    return x;
}

static void test_fusion_patterns(void **state) {
    float a[35], b[7], c[5];
    tb_shape sa = shp(TB_F32, 2, 5, 7, 0, 0), sb = shp(TB_F32, 1, 7, 0, 0, 0),
             sc = shp(TB_F32, 2, 5, 1, 0, 0);
    tb_tensor *x, *y, *z, *t, *u, *v, *outs[4];
    int chain = 200;
    input in[3];
    (void)state;
    REQUIRE_OPENCL();
    fill(a, &sa, R_ANY, 0);
    fill(b, &sb, R_ANY, 0);
    fill(c, &sc, R_ANY, 0);
    x = tb_tensor_from_host(a, &sa, &g_ocl);
    y = tb_tensor_from_host(b, &sb, &g_ocl);
    z = tb_tensor_from_host(c, &sc, &g_ocl);
    {
        tb_tensor *ins[3];
        ins[0] = x;
        ins[1] = y;
        ins[2] = z;
        t = build_long_chain(ins, &chain);
        assert_int_equal(kernel_count(&t, 1), 1); /* 200 elementwise ops with broadcasting */
        tb_tensor_release(t);
    }
    /* reduction with its elementwise producers and an elementwise epilogue: one kernel */
    {
        int32_t ax = 1;
        t = tb_mul(x, y);
        t = take(t, tb_exp(t));
        u = tb_sum(t, &ax, 1, false);
        v = tb_mul_scalar(u, 0.5);
        v = take(v, tb_add_scalar(v, 1.0));
        assert_int_equal(kernel_count(&v, 1), 1);
        tb_tensor_release(t);
        tb_tensor_release(u);
        tb_tensor_release(v);
    }
    /* matmul + bias + relu: one kernel */
    {
        tb_tensor *w = tb_transpose(x, 0, 1); /* [7,5] view */
        t = tb_matmul(x, w);                  /* [5,5] */
        u = tb_add(t, z);                     /* bias [5,1] broadcast */
        u = take(u, tb_relu(u));
        assert_int_equal(kernel_count(&u, 1), 1);
        tb_tensor_release(w);
        tb_tensor_release(t);
        tb_tensor_release(u);
    }
    /* a big matmul + bias + relu: on CPU devices the two operand panels, then one kernel with
       the epilogue; elsewhere one kernel */
    {
        static float big_a[128 * 96], big_b[96 * 80], big_c[80];
        tb_shape sba = shp(TB_F32, 2, 128, 96, 0, 0), sbb = shp(TB_F32, 2, 96, 80, 0, 0);
        tb_shape sbc = shp(TB_F32, 1, 80, 0, 0, 0);
        tb_device_info info;
        tb_tensor *ba, *bb, *bc;
        char *text;
        fill(big_a, &sba, R_ANY, 0);
        fill(big_b, &sbb, R_ANY, 0);
        fill(big_c, &sbc, R_ANY, 0);
        ba = tb_tensor_from_host(big_a, &sba, &g_ocl);
        bb = tb_tensor_from_host(big_b, &sbb, &g_ocl);
        bc = tb_tensor_from_host(big_c, &sbc, &g_ocl);
        t = tb_matmul(ba, bb);
        u = tb_add(t, bc);
        u = take(u, tb_relu(u));
        assert_int_equal(tb_backend_device_info(&g_ocl, &info), TB_OK);
        text = tb_ir_backend_text(&u, 1);
        assert_non_null(text);
        if (info.device.type == TB_DEVICE_CPU) {
            assert_int_equal(kernel_count(&u, 1), 3);
            /* panels of the register block's rows (A) and vector width (B), which the CPU's
               vector shape sets */
            check_pack_kernel(text, "PA", 128, 96);
            check_pack_kernel(text, "PB", 80, 96);
            assert_non_null(strstr(text, "void MM_128_80_96("));
        } else {
            assert_int_equal(kernel_count(&u, 1), 1);
        }
        tb_free(text);
        tb_tensor_release(ba);
        tb_tensor_release(bb);
        tb_tensor_release(bc);
        tb_tensor_release(t);
        tb_tensor_release(u);
    }
    /* softmax of a scaled input, then an elementwise epilogue: one kernel */
    {
        t = tb_mul_scalar(x, 0.125);
        u = tb_softmax(t, -1);
        v = tb_mul(u, y);
        assert_int_equal(kernel_count(&v, 1), 1);
        tb_tensor_release(t);
        tb_tensor_release(u);
        tb_tensor_release(v);
    }
    /* a value used twice in one kernel is computed once; used by two kernels, materialised */
    {
        int32_t ax = 0;
        t = tb_add(x, y);
        t = take(t, tb_sigmoid(t));
        u = tb_mul(t, t);            /* same kernel */
        v = tb_sum(t, &ax, 1, true); /* another kernel reads t */
        outs[0] = u;
        outs[1] = v;
        assert_int_equal(kernel_count(outs, 2), 3);
        tb_tensor_release(t);
        tb_tensor_release(u);
        tb_tensor_release(v);
    }
    /* a view of a parameter read by two kernels is not copied */
    {
        int32_t ax = 1;
        t = tb_transpose(x, 0, 1);
        u = tb_sum(t, &ax, 1, false);
        v = tb_max(t, &ax, 1, false);
        outs[0] = u;
        outs[1] = v;
        assert_int_equal(kernel_count(outs, 2), 2);
        tb_tensor_release(t);
        tb_tensor_release(u);
        tb_tensor_release(v);
    }
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(z);
    /* the same patterns compared with the cpu backend */
    in[0] = in_of(sa, R_ANY);
    in[1] = in_of(sb, R_ANY);
    in[2] = in_of(sc, R_ANY);
    add_case("chain of 200 elementwise ops", build_long_chain, &chain, in, 3);
    flush_cases();
}

/* A large float max / min (split into chunks, read in vectors): a NaN anywhere propagates,
   without one the result is the exact extreme. */
/* Two layers, relu(x w1 + b) w2, with depths and widths that are not multiples of the panel
   widths: on a CPU device the second matmul reads its A (the first layer's output, computed in
   the same graph, 96 rows: whole panels) where it is, so the program packs only the parameter
   x as an A operand. */
static tb_tensor *two_layers(const tb_device *dev, const float *x, const float *w1, const float *b,
                             const float *w2, tb_shape sx, tb_shape sw1, tb_shape sb,
                             tb_shape sw2) {
    tb_tensor *tx = tb_tensor_from_host(x, &sx, dev), *tw1 = tb_tensor_from_host(w1, &sw1, dev);
    tb_tensor *tb = tb_tensor_from_host(b, &sb, dev), *tw2 = tb_tensor_from_host(w2, &sw2, dev);
    tb_tensor *h = tb_matmul(tx, tw1), *y;
    h = take(h, tb_add(h, tb));
    h = take(h, tb_relu(h));
    y = tb_matmul(h, tw2);
    tb_tensor_release(h);
    tb_tensor_release(tx);
    tb_tensor_release(tw1);
    tb_tensor_release(tb);
    tb_tensor_release(tw2);
    assert_non_null(y);
    return y;
}

/* How many kernels of a program text have names that start with `prefix` (a kernel's name
   after "void ", its helpers' names the kernel's and a suffix). */
static int count_pack_kernels(const char *text, const char *prefix) {
    char names[8][64];
    int count = 0, i;
    size_t plen = strlen(prefix);
    const char *at = text;
    while ((at = strstr(at, "void ")) != NULL) {
        size_t len = 0;
        at += 5;
        if (strncmp(at, prefix, plen) != 0) continue;
        while (len < 63 && (at[len] == '_' || isalnum((unsigned char)at[len])))
            len++;
        for (i = 0; i < count; i++)
            if (strncmp(names[i], at, strlen(names[i])) == 0 || strncmp(names[i], at, len) == 0)
                break;
        if (i == count && count < 8) {
            memcpy(names[count], at, len);
            names[count++][len] = '\0';
        }
    }
    return count;
}

static void test_matmul_reads_a_in_place(void **state) {
    enum { M = 96, K = 70, H = 90, N = 80 };
    static float x[M * K], w1[K * H], b[H], w2[H * N], got[M * N], want[M * N];
    tb_shape sx = shp(TB_F32, 2, M, K, 0, 0), sw1 = shp(TB_F32, 2, K, H, 0, 0);
    tb_shape sb = shp(TB_F32, 1, H, 0, 0, 0), sw2 = shp(TB_F32, 2, H, N, 0, 0);
    tb_shape sy = shp(TB_F32, 2, M, N, 0, 0);
    tb_device_info info;
    tb_tensor *y, *yc;
    char *text;
    (void)state;
    REQUIRE_OPENCL();
    fill(x, &sx, R_ANY, 0);
    fill(w1, &sw1, R_ANY, 0);
    fill(b, &sb, R_ANY, 0);
    fill(w2, &sw2, R_ANY, 0);
    y = two_layers(&g_ocl, x, w1, b, w2, sx, sw1, sb, sw2);
    yc = two_layers(&g_cpu, x, w1, b, w2, sx, sw1, sb, sw2);
    text = tb_ir_backend_text(&y, 1);
    assert_non_null(text);
    assert_int_equal(tb_backend_device_info(&g_ocl, &info), TB_OK);
    if (info.device.type == TB_DEVICE_CPU) { /* packed operands: CPU devices only */
        assert_int_equal(count_pack_kernels(text, "PA_"), 1);
        assert_int_equal(count_pack_kernels(text, "PB_"), 2);
    }
    free(text);
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
    assert_int_equal(tb_tensor_to_host(yc, want, sizeof want), TB_OK);
    compare_host("relu(x w1 + b) w2", &sy, want, got);
    tb_tensor_release(y);
    tb_tensor_release(yc);
}

/* A matmul's weight panels are kept with the computation while the same weight buffer comes
   again; a new weight in the same computation (even in a buffer the allocator hands out again
   after the first weight was released) is packed anew. */
static void test_kept_panels_follow_their_buffer(void **state) {
    enum { M = 64, K = 96, N = 80 };
    static float a[M * K], w1[K * N], w2[K * N], got[M * N], want[M * N];
    tb_shape sa = shp(TB_F32, 2, M, K, 0, 0), sw = shp(TB_F32, 2, K, N, 0, 0);
    tb_shape sy = shp(TB_F32, 2, M, N, 0, 0);
    tb_tensor *x, *w, *y, *xc, *wc, *yc;
    int round;
    (void)state;
    REQUIRE_OPENCL();
    fill(a, &sa, R_ANY, 0);
    fill(w1, &sw, R_ANY, 0);
    fill(w2, &sw, R_ANY, 0);
    x = tb_tensor_from_host(a, &sa, &g_ocl);
    xc = tb_tensor_from_host(a, &sa, &g_cpu);
    for (round = 0; round < 6; round++) {
        const float *wh = (round / 2) % 2 == 0 ? w1 : w2; /* w1, w1, w2, w2, w1, w1 */
        w = tb_tensor_from_host(wh, &sw, &g_ocl);
        wc = tb_tensor_from_host(wh, &sw, &g_cpu);
        y = tb_matmul(x, w);
        yc = tb_matmul(xc, wc);
        assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
        assert_int_equal(tb_tensor_to_host(yc, want, sizeof want), TB_OK);
        compare_host("matmul with kept panels", &sy, want, got);
        tb_tensor_release(y);
        tb_tensor_release(yc);
        tb_tensor_release(w); /* its buffer goes back to the allocator for the next round */
        tb_tensor_release(wc);
    }
    tb_tensor_release(x);
    tb_tensor_release(xc);
}

/* The chain of test_long_chain_splits: op i of `ops` is, by i % 5, y + x, -y, y - k, |y|, y * s.
   With x, k in halves and s = +-1 every value is exact in f32, so backends agree bit for bit
   and a kernel that dropped, repeated or reordered a piece of the chain would show. */
static tb_tensor *exact_chain(const tb_device *dev, int ops, const float *x, const float *k,
                              const float *s, int64_t n) {
    tb_shape sh = shp(TB_F32, 1, n, 0, 0, 0);
    tb_tensor *tx = tb_tensor_from_host(x, &sh, dev), *tk = tb_tensor_from_host(k, &sh, dev);
    tb_tensor *ts = tb_tensor_from_host(s, &sh, dev), *y = tb_tensor_retain(tx);
    int i;
    for (i = 0; i < ops; i++) {
        switch (i % 5) {
        case 0:
            y = take(y, tb_add(y, tx));
            break;
        case 1:
            y = take(y, tb_neg(y));
            break;
        case 2:
            y = take(y, tb_sub(y, tk));
            break;
        case 3:
            y = take(y, tb_abs(y));
            break;
        default:
            y = take(y, tb_mul(y, ts));
            break;
        }
    }
    tb_tensor_release(tx);
    tb_tensor_release(tk);
    tb_tensor_release(ts);
    assert_non_null(y);
    return y;
}

/* An elementwise chain of 40,000 ops is more than one kernel's budget: it becomes several
   kernels (it used to fail with "a kernel too large"), and the values are the cpu reference's
   for the whole chain, bit for bit. */
static void test_long_chain_splits(void **state) {
    enum { OPS = 40000, N = 8 };
    static const float x[N] = {1, -2, 3, -4.5f, 5, -6, 7.5f, -8};
    static const float k[N] = {0.5f, 1.5f, -0.5f, 2, -1, 0, 3, -2.5f};
    static const float s[N] = {1, -1, -1, 1, 1, -1, 1, -1};
    float got[N], want[N];
    tb_tensor *y, *ref;
    int i, kernels;
    (void)state;
    REQUIRE_OPENCL();
    y = exact_chain(&g_ocl, OPS, x, k, s, N);
    ref = exact_chain(&g_cpu, OPS, x, k, s, N);
    kernels = kernel_count(&y, 1);
    print_message("%d ops: %d kernels\n", OPS, kernels);
    assert_true(kernels >= 2);
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
    assert_int_equal(tb_tensor_to_host(ref, want, sizeof want), TB_OK);
    for (i = 0; i < N; i++) {
        if (got[i] != want[i])
            fail_msg("element %d is %.9g, the reference gives %.9g", i, (double)got[i],
                     (double)want[i]);
    }
    tb_tensor_release(y);
    tb_tensor_release(ref);
}

/* The sum of `n` arrays of 4 values, each from vals[i], on `dev`: a kernel of n - 1 adds that
   reads n arrays, unless the planner splits it. */
static tb_tensor *sum_of_arrays(const tb_device *dev, const float (*vals)[4], int n) {
    tb_shape s = shp(TB_F32, 1, 4, 0, 0, 0);
    tb_tensor *y = tb_tensor_from_host(vals[0], &s, dev);
    int i;
    for (i = 1; i < n; i++) {
        tb_tensor *in = tb_tensor_from_host(vals[i], &s, dev);
        y = take(y, tb_add(y, in));
        tb_tensor_release(in);
    }
    assert_non_null(y);
    return y;
}

/* A sum of more arrays than one kernel may take as arguments is split into kernels that each
   take few enough (it used to fail with "more than the arguments the device takes"). 4096
   arrays fit the values one kernel may compute, but no device takes that many arguments: an
   OpenCL device takes its CL_DEVICE_MAX_PARAMETER_SIZE / 8 (128 on PoCL, 544 to 4095 on GPUs),
   the native backend 4096 including the output. */
static void test_many_arguments_split(void **state) {
    enum { INPUTS = 4096 };
    static float vals[INPUTS][4];
    float got[4], want[4] = {0, 0, 0, 0}, ref_got[4];
    tb_tensor *y, *ref;
    int i, j, kernels;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < INPUTS; i++) {
        for (j = 0; j < 4; j++) {
            vals[i][j] = (float)((i * 7 + j * 3) % 11) - 5.0f;
            want[j] += vals[i][j];
        }
    }
    y = sum_of_arrays(&g_ocl, (const float(*)[4])vals, INPUTS);
    ref = sum_of_arrays(&g_cpu, (const float(*)[4])vals, INPUTS);
    kernels = kernel_count(&y, 1);
    print_message("%d arrays: %d kernels\n", INPUTS, kernels);
    assert_true(kernels >= 2);
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
    assert_int_equal(tb_tensor_to_host(ref, ref_got, sizeof ref_got), TB_OK);
    for (j = 0; j < 4; j++) {
        assert_true(ref_got[j] == want[j]); /* small integers: exact in any order */
        assert_true(got[j] == ref_got[j]);
    }
    tb_tensor_release(y);
    tb_tensor_release(ref);
}

/* The distance of two floats in units in the last place (0 for equal values, both NaN). */
static double ulps_apart(float a, float b) {
    int32_t ia, ib;
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b) ? 0 : 1e30;
    if (a == b) return 0;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0) ia = (int32_t)(0x80000000u - (uint32_t)ia);
    if (ib < 0) ib = (int32_t)(0x80000000u - (uint32_t)ib);
    return fabs((double)ia - (double)ib);
}

/* exp of f32 rows read in order runs the kernels' own vector exp, and read otherwise the
   scalar one (native: the prelude's tb_exp_f32; OpenCL: the built-in): within 2 ulp of the C
   library's over the whole range, and exact at the edges (overflow to inf, underflow through the
   denormals to 0, inf, -inf, NaN). */
static void test_vector_exp(void **state) {
    enum { N = 1 << 16, SPECIAL = 14 };
    static const float special[SPECIAL] = {0.0f,     -0.0f,  1.0f,    -1.0f,  88.72f,
                                           88.7228f, 88.73f, -87.3f,  -95.0f, -103.9f,
                                           -104.0f,  200.0f, -200.0f, 1e-30f};
    static float in[N], got[N];
    tb_shape s = shp(TB_F32, 2, N / 64, 64, 0, 0);
    tb_tensor *x, *y;
    double worst = 0;
    int i, at = 0;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < N; i++)
        in[i] = -110.0f + 200.0f * (float)i / (float)N;
    for (i = 0; i < SPECIAL; i++)
        in[i * 97] = special[i];
    in[5] = INFINITY;
    in[6] = -INFINITY;
    in[7] = NAN;
    x = tb_tensor_from_host(in, &s, &g_ocl);
    y = tb_exp(x);
    {
        char *text = tb_ir_backend_text(&y, 1); /* the kernel calls the vector exp */
        assert_non_null(text);
        assert_non_null(strstr(text, "= TB_VEXP(v"));
        tb_free(text);
    }
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
    for (i = 0; i < N; i++) {
        double d = ulps_apart(got[i], expf(in[i]));
        if (d > worst) {
            worst = d;
            at = i;
        }
    }
    if (worst > 2)
        fail_msg("exp(%.9g) = %.9g, the C library says %.9g: %.0f ulp", (double)in[at],
                 (double)got[at], (double)expf(in[at]), worst);
    assert_true(isinf(got[5]) && got[5] > 0);
    assert_true(got[6] == 0.0f);
    assert_true(isnan(got[7]));
    tb_tensor_release(y);
    /* read transposed: the scalar exp of the prelude, as close */
    {
        tb_tensor *t = tb_transpose(x, 0, 1);
        char *text;
        y = tb_exp(t);
        text = tb_ir_backend_text(&y, 1);
        assert_non_null(text);
        if (strcmp(TEST_BACKEND, "native") == 0) assert_non_null(strstr(text, "tb_exp_f32(("));
        tb_free(text);
        assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
        worst = 0;
        for (i = 0; i < N; i++) {
            int src = (i % (N / 64)) * 64 + i / (N / 64);
            double d = ulps_apart(got[i], expf(in[src]));
            if (d > worst) {
                worst = d;
                at = src;
            }
        }
        if (worst > 2)
            fail_msg("scalar exp(%.9g): %.0f ulp from the C library's %.9g", (double)in[at], worst,
                     (double)expf(in[at]));
        tb_tensor_release(y);
        tb_tensor_release(t);
    }
    tb_tensor_release(x);
}

/* The distance from `got` to the double `want` in f32 units in the last place of want. */
static double ulps_off(float got, double want) {
    float w = (float)fabs(want);
    double ulp = w < FLT_MIN ? ldexp(1.0, -149) : (double)nextafterf(w, INFINITY) - (double)w;
    if (isnan(got) || isnan(want)) return isnan(got) && isnan(want) ? 0 : 1e30;
    return fabs((double)got - want) / ulp;
}

/* f32 erf and gelu run the kernels' own polynomial (no call per element), as a vector where
   rows are read in order and as scalars where they are not (a transposed read): erf within 2
   ulp of double erf over [-6, 6], gelu within 10 ulp (1 + erf(z) cancels for z in (-1, 0):
   PyTorch's f32 gelu loses more there) or 5e-8 (below -5.6, where it is 0 for -3e-8), and exact at
   the edges: erf(+-inf) = +-1, gelu(inf) = inf, gelu(-inf) NaN (as the reference's -inf * 0), NaN
   stays NaN, -0 stays -0. */
static void test_erf_gelu_f32(void **state) {
    enum { R = 256, C = 256, N = R * C };
    static float in[N], got_e[N], got_g[N];
    tb_shape s = shp(TB_F32, 2, R, C, 0, 0);
    int i, t;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < N; i++)
        in[i] = -6.0f + 12.0f * (float)i / (float)N;
    in[11] = INFINITY;
    in[12] = -INFINITY;
    in[13] = NAN;
    in[14] = -0.0f;
    in[15] = 1e-40f;
    for (t = 0; t < 2; t++) {
        tb_tensor *x = tb_tensor_from_host(in, &s, &g_ocl), *v = t ? tb_transpose(x, 0, 1) : x;
        tb_tensor *e = tb_erf(v), *g = tb_gelu(v);
        double worst_e = 0, worst_g = 0;
        char *text = tb_ir_backend_text(&e, 1);
        assert_non_null(text);
        assert_non_null(strstr(text, t ? "tb_erf_f32(" : "tb_verf(v"));
        tb_free(text);
        assert_int_equal(tb_tensor_to_host(e, got_e, sizeof got_e), TB_OK);
        assert_int_equal(tb_tensor_to_host(g, got_g, sizeof got_g), TB_OK);
        for (i = 0; i < N; i++) {
            int at = t ? (i % R) * C + i / R : i; /* the input element of output i */
            double xv = in[at], ge = 0.5 * xv * (1.0 + erf(xv / sqrt(2.0)));
            double de = ulps_off(got_e[i], erf(xv)), dg = ulps_off(got_g[i], ge);
            if (isinf(xv)) continue;
            if (de > 2)
                fail_msg("%s: erf(%.9g) = %.9g, want %.9g: %.1f ulp", t ? "scalar" : "vector", xv,
                         (double)got_e[i], erf(xv), de);
            if (dg > 10 && fabs((double)got_g[i] - ge) > 5e-8)
                fail_msg("%s: gelu(%.9g) = %.9g, want %.9g: %.1f ulp", t ? "scalar" : "vector", xv,
                         (double)got_g[i], ge, dg);
            worst_e = de > worst_e ? de : worst_e;
            if (fabs(ge) > 1e-6) worst_g = dg > worst_g ? dg : worst_g;
        }
        assert_true(got_e[t ? 11 * R : 11] == 1.0f && got_e[t ? 12 * R : 12] == -1.0f);
        assert_true(isinf(got_g[t ? 11 * R : 11]) && isnan(got_g[t ? 12 * R : 12]));
        assert_true(isnan(got_e[t ? 13 * R : 13]) && isnan(got_g[t ? 13 * R : 13]));
        assert_true(got_e[t ? 14 * R : 14] == 0.0f && signbit(got_e[t ? 14 * R : 14]));
        print_message("%s: erf within %.2f ulp, gelu %.2f\n", t ? "scalar" : "vector", worst_e,
                      worst_g);
        tb_tensor_release(e);
        tb_tensor_release(g);
        if (v != x) tb_tensor_release(v);
        tb_tensor_release(x);
    }
}

/* tanh, sigmoid and silu of f32 rows read in order run as vectors (the kernels' own tanh and
   sigmoid, exp through the dialect's vector exp), of rows read out of order as scalars: tanh
   and sigmoid within 3 ulp of double, silu within 4, over [-12, 12] and past exp's range
   (results in the denormals within 3e-45 (1 + |x|): e^x has few bits there, none below
   -103.97); NaN stays NaN. The vector code is exact at the edges: tanh(+-inf) = +-1 (also
   where e^2|x| overflows), sigmoid(+inf) = 1, sigmoid(-inf) = 0, tanh(-0) = -0. */
static void test_tanh_sigmoid_f32(void **state) {
    enum { R = 256, C = 256, N = R * C };
    static float in[N], got_t[N], got_s[N], got_u[N];
    static const float edge[] = {INFINITY,     -INFINITY, NAN,    -0.0f, 1e-40f, -1e-30f, 0.625f,
                                 -0.62499994f, 44.5f,     -44.5f, 88.8f, -88.8f, -104.5f, 1e30f};
    const int nedge = (int)(sizeof edge / sizeof edge[0]);
    tb_shape s = shp(TB_F32, 2, R, C, 0, 0);
    int i, t;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < N; i++)
        in[i] = -12.0f + 24.0f * (float)i / (float)N;
    for (i = 0; i < nedge; i++)
        in[100 + i] = edge[i];
    for (t = 0; t < 2; t++) {
        tb_tensor *x = tb_tensor_from_host(in, &s, &g_ocl), *v = t ? tb_transpose(x, 0, 1) : x;
        tb_tensor *th = tb_tanh(v), *sg = tb_sigmoid(v), *su = tb_silu(v);
        double worst[3] = {0, 0, 0};
        tb_tensor *outs[3];
        char *text;
        outs[0] = th;
        outs[1] = sg;
        outs[2] = su;
        text = tb_ir_backend_text(outs, 3);
        assert_non_null(text);
        assert_true((strstr(text, "tb_vtanh(v") != NULL) == !t);
        assert_true((strstr(text, "tb_vsigmoid(v") != NULL) == !t);
        tb_free(text);
        assert_int_equal(tb_tensor_to_host(th, got_t, sizeof got_t), TB_OK);
        assert_int_equal(tb_tensor_to_host(sg, got_s, sizeof got_s), TB_OK);
        assert_int_equal(tb_tensor_to_host(su, got_u, sizeof got_u), TB_OK);
        for (i = 0; i < N; i++) {
            int at = t ? (i % R) * C + i / R : i, k; /* the input element of output i */
            double xv = in[at], sv = xv >= 0 ? 1.0 / (1.0 + exp(-xv)) : exp(xv) / (1.0 + exp(xv));
            double want[3], got[3];
            want[0] = tanh(xv);
            want[1] = sv;
            want[2] = xv * sv;
            got[0] = got_t[i];
            got[1] = got_s[i];
            got[2] = got_u[i];
            if (isnan(xv)) {
                for (k = 0; k < 3; k++)
                    if (!isnan(got[k])) fail_msg("op %d of NaN: %.9g, not NaN", k, got[k]);
                continue;
            }
            for (k = 0; k < 3; k++) {
                double d = ulps_off((float)got[k], want[k]);
                if (isinf(xv) && k == 2)
                    continue; /* silu(+-inf): the reference's inf * 1, -inf * 0 */
                if (d > (k == 2 ? 4 : 3) && fabs(got[k] - want[k]) > 3e-45 * (1.0 + fabs(xv)))
                    fail_msg("%s: %s(%.9g) = %.9g, want %.9g: %.1f ulp", t ? "scalar" : "vector",
                             k == 0   ? "tanh"
                             : k == 1 ? "sigmoid"
                                      : "silu",
                             xv, got[k], want[k], d);
                if (fabs(want[k]) > 1e-30) worst[k] = d > worst[k] ? d : worst[k];
            }
        }
        if (!t) { /* the edges of the vector code (the scalar code's tanh is the device's) */
            assert_true(got_t[103] == 0.0f && signbit(got_t[103]) && got_s[103] == 0.5f);
            assert_true(got_t[100] == 1.0f && got_s[100] == 1.0f && got_u[100] == INFINITY);
            assert_true(got_t[101] == -1.0f && got_s[101] == 0.0f);
        }
        print_message("%s: tanh within %.2f ulp, sigmoid %.2f, silu %.2f\n",
                      t ? "scalar" : "vector", worst[0], worst[1], worst[2]);
        tb_tensor_release(th);
        tb_tensor_release(sg);
        tb_tensor_release(su);
        if (v != x) tb_tensor_release(v);
        tb_tensor_release(x);
    }
}

/* log, rsqrt, softplus, mish, sin and cos of f32 rows read in order run as vectors (log: the
   dialect's vector log, on C the kernels' own; softplus and mish: the kernels' own, one exp
   each; sin and cos: the kernels' own up to |x| = 8192, the dialect's scalar ones beyond), of
   rows read out of order as scalars: within 2 ulp of double for rsqrt, 3 for log (OpenCL's
   bound for its log), sin and cos (4 as scalars: the device's, whose OpenCL bound that is), 4
   for softplus and 5 for mish, or 3e-45 (1 + |x|) where the result is a denormal, over
   [-30, 30], [-9000, 9000] and every binade (random bits: negatives, denormals, infinities and
   NaNs among them). The edges of the vector code: log(+-0) = -inf, log(-1) and log(-inf) NaN,
   log(inf) = inf, rsqrt(0) = inf, softplus(x > 20) = x and softplus(-inf) = 0, mish(inf) =
   inf, sin(-0) = -0, cos(0) = 1, sin and cos of +-inf NaN, NaN stays NaN; mish keeps its
   digits where exp(x) is a denormal (x in [-104, -87]). */
static double ref_unary(int k, double x) {
    switch (k) {
    case 0:
        return log(x);
    case 1:
        return 1.0 / sqrt(x);
    case 2:
        return x > 20.0 ? x : log1p(exp(x));
    case 3:
        return x * tanh(log1p(exp(x)));
    case 4:
        return sin(x);
    default:
        return cos(x);
    }
}

static void test_log_softplus_sin_f32(void **state) {
    enum { R = 256, C = 256, N = R * C, OPS = 6 };
    static float in[N], got[OPS][N];
    static const float edge[] = {
        0.0f,         -0.0f,      INFINITY, -INFINITY,  NAN,     -1.0f,      1e-45f,  1e-40f,
        0.70710677f,  0.7071068f, 20.0f,    20.000002f, -88.8f,  -104.5f,    3.4e38f, 1.0f,
        -91.4776764f, -87.5f,     -100.0f,  -103.5f,    8192.0f, -8192.0005f};
    static const char *const names[OPS] = {"log", "rsqrt", "softplus", "mish", "sin", "cos"};
    static const char *const vec_text[OPS] = {"TB_VLOG(v",  "TB_VSQRT(v",   "tb_vsoftplus(v",
                                              "tb_vmish(v", "tb_vsincos(v", "tb_vsincos(v"};
    const double tol[OPS] = {3, 2, 4, 5, 3, 3};
    const int nedge = (int)(sizeof edge / sizeof edge[0]);
    tb_shape s = shp(TB_F32, 2, R, C, 0, 0);
    uint32_t bits = 12345u;
    int i, t, k;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < N; i++) {
        bits = bits * 1664525u + 1013904223u;
        if (i % 4 == 0) {
            in[i] = -30.0f + 60.0f * (float)i / (float)N;
        } else if (i % 4 == 2) {
            in[i] = -9000.0f + 18000.0f * (float)i / (float)N;
        } else {
            memcpy(&in[i], &bits, sizeof bits);
        }
    }
    for (i = 0; i < nedge; i++)
        in[100 + i] = edge[i];
    for (t = 0; t < 2; t++) {
        tb_tensor *x = tb_tensor_from_host(in, &s, &g_ocl), *v = t ? tb_transpose(x, 0, 1) : x;
        tb_tensor *y[OPS];
        double worst[OPS] = {0, 0, 0, 0, 0, 0};
        char *text;
        y[0] = tb_log(v);
        y[1] = tb_rsqrt(v);
        y[2] = tb_softplus(v);
        y[3] = tb_mish(v);
        y[4] = tb_sin(v);
        y[5] = tb_cos(v);
        text = tb_ir_backend_text(y, OPS);
        assert_non_null(text);
        for (k = 0; k < OPS; k++)
            if ((strstr(text, vec_text[k]) != NULL) != !t)
                fail_msg("%s: vector code %s where rows are read %s", names[k],
                         t ? "present" : "missing", t ? "transposed" : "in order");
        tb_free(text);
        for (k = 0; k < OPS; k++)
            assert_int_equal(tb_tensor_to_host(y[k], got[k], sizeof got[k]), TB_OK);
        for (i = 0; i < N; i++) {
            int at = t ? (i % R) * C + i / R : i; /* the input element of output i */
            double xv = in[at];
            for (k = 0; k < OPS; k++) {
                double want = ref_unary(k, xv), d;
                if (isnan(want) || isnan(got[k][i])) {
                    if (isnan(want) != isnan(got[k][i]))
                        fail_msg("%s %s(%.9g) = %.9g, want %.9g", t ? "scalar" : "vector", names[k],
                                 xv, got[k][i], want);
                    continue;
                }
                if (isinf(want)) {
                    if ((double)got[k][i] != want)
                        fail_msg("%s %s(%.9g) = %.9g, want %.9g", t ? "scalar" : "vector", names[k],
                                 xv, got[k][i], want);
                    continue;
                }
                d = ulps_off(got[k][i], want);
                if (d > tol[k] + (t && k >= 4) &&
                    !(fabs(want) < FLT_MIN && fabs(got[k][i] - want) <= 3e-45 * (1.0 + fabs(xv))))
                    fail_msg("%s %s(%.9g) = %.9g, want %.9g: %.1f ulp", t ? "scalar" : "vector",
                             names[k], xv, got[k][i], want, d);
                if (fabs(want) >= FLT_MIN) worst[k] = d > worst[k] ? d : worst[k];
            }
        }
        if (!t) {
            assert_true(got[0][100] == -INFINITY && got[0][101] == -INFINITY);
            assert_true(got[0][102] == INFINITY && isnan(got[0][103]) && isnan(got[0][105]));
            assert_true(got[1][100] == INFINITY && got[1][102] == 0.0f);
            assert_true(got[2][111] == 20.000002f && got[2][103] == 0.0f &&
                        got[2][102] == INFINITY && got[2][114] == 3.4e38f);
            assert_true(got[3][102] == INFINITY && got[3][114] == 3.4e38f);
            assert_true(got[4][101] == 0.0f && signbit(got[4][101]) && got[5][100] == 1.0f);
            assert_true(isnan(got[4][102]) && isnan(got[4][103]) && isnan(got[5][102]));
            for (k = 0; k < OPS; k++)
                assert_true(isnan(got[k][104]));
        }
        print_message("%s: log within %.2f ulp, rsqrt %.2f, softplus %.2f, mish %.2f, sin %.2f, "
                      "cos %.2f\n",
                      t ? "scalar" : "vector", worst[0], worst[1], worst[2], worst[3], worst[4],
                      worst[5]);
        for (k = 0; k < OPS; k++)
            tb_tensor_release(y[k]);
        if (v != x) tb_tensor_release(v);
        tb_tensor_release(x);
    }
}

/* clamp (hardtanh, relu6) of f32 and f16 rows read in order runs as a vector: the values of
   the cpu reference, NaN kept, -0 kept where it is within the bounds, infinities clamped. */
static void test_vector_clamp(void **state) {
    enum { R = 64, C = 128, N = R * C };
    static float in[N], got[2][N];
    static const float edge[] = {NAN, INFINITY, -INFINITY, -0.0f, 0.0f, 6.0f, 6.0000005f, -1.0f};
    const int nedge = (int)(sizeof edge / sizeof edge[0]);
    const tb_device *devs[2] = {&g_cpu, &g_ocl};
    tb_shape s = shp(TB_F32, 2, R, C, 0, 0);
    int i, d, h, op;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < N; i++)
        in[i] = -8.0f + 16.0f * (float)((i * 37) % N) / (float)N;
    for (i = 0; i < nedge; i++)
        in[200 + i] = edge[i];
    for (op = 0; op < 2; op++) {
        for (h = 0; h < 2; h++) {
            for (d = 0; d < 2; d++) {
                tb_tensor *x = tb_tensor_from_host(in, &s, devs[d]);
                tb_tensor *xh = h ? tb_cast(x, TB_F16) : x;
                tb_tensor *y = op ? tb_relu6(xh) : tb_hardtanh(xh, -0.5, 0.75);
                tb_tensor *f = tb_cast(y, TB_F32);
                if (d == 1) {
                    char *text = tb_ir_backend_text(&f, 1);
                    assert_non_null(text);
                    assert_non_null(strstr(text, "tb_vmin(tb_vmax("));
                    tb_free(text);
                }
                assert_int_equal(tb_tensor_to_host(f, got[d], sizeof got[d]), TB_OK);
                tb_tensor_release(f);
                tb_tensor_release(y);
                if (xh != x) tb_tensor_release(xh);
                tb_tensor_release(x);
            }
            for (i = 0; i < N; i++)
                if (memcmp(&got[0][i], &got[1][i], sizeof(float)) != 0)
                    fail_msg("%s %s: element %d (%.9g): %.9g, the reference %.9g",
                             op ? "relu6" : "hardtanh", h ? "f16" : "f32", i, (double)in[i],
                             (double)got[1][i], (double)got[0][i]);
            assert_true(isnan(got[1][200]));
            if (op) {
                assert_true(got[1][201] == 6.0f && got[1][202] == 0.0f && got[1][206] == 6.0f);
            } else {
                assert_true(got[1][201] == 0.75f && got[1][202] == -0.5f);
                assert_true(got[1][203] == 0.0f && signbit(got[1][203]));
            }
        }
    }
}

/* A where whose condition is a bool buffer reads it as W bytes at once in a row kernel (a
   masked softmax, as attention's causal mask, and an elementwise where with the mask
   broadcast down the rows), with the reference's values: masked lanes take the other
   operand, also where it is -inf or NaN. */
static void test_vector_where_mask(void **state) {
    enum { R = 48, C = 128 };
    static float xv[R * C], got[R * C], want[R * C];
    static unsigned char m2[R * C], m1[C];
    tb_shape xs = shp(TB_F32, 2, R, C, 0, 0), s2 = shp(TB_BOOL, 2, R, C, 0, 0);
    tb_shape s1 = shp(TB_BOOL, 1, C, 0, 0, 0), one = shp(TB_F32, 0, 0, 0, 0, 0);
    const tb_device *devs[2] = {&g_cpu, &g_ocl};
    int i, c, d;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < R * C; i++) {
        xv[i] = (float)((i * 37) % 101) / 25.0f - 2.0f;
        m2[i] = (unsigned char)((i * 7) % 5 != 0);
    }
    for (i = 0; i < C; i++)
        m1[i] = (unsigned char)(i % 3 != 1);
    xv[5] = NAN;
    m2[5] = 0;
    for (c = 0; c < 2; c++) {
        for (d = 0; d < 2; d++) {
            float ninf = -INFINITY;
            tb_tensor *x = tb_tensor_from_host(xv, &xs, devs[d]);
            tb_tensor *m =
                c ? tb_tensor_from_host(m1, &s1, devs[d]) : tb_tensor_from_host(m2, &s2, devs[d]);
            tb_tensor *f = tb_tensor_from_host(&ninf, &one, devs[d]);
            tb_tensor *sx = tb_mul_scalar(x, 0.5), *w = tb_where(m, sx, f), *y;
            y = c ? tb_softmax(w, 1) : tb_relu(w);
            assert_non_null(y);
            if (d == 1) {
                char *text = tb_ir_backend_text(&y, 1);
                assert_non_null(text);
                assert_non_null(strstr(text, "= TB_VLDB(b"));
                tb_free(text);
            }
            assert_int_equal(tb_tensor_to_host(y, d ? got : want, sizeof got), TB_OK);
            tb_tensor_release(y);
            tb_tensor_release(w);
            tb_tensor_release(sx);
            tb_tensor_release(f);
            tb_tensor_release(m);
            tb_tensor_release(x);
        }
        for (i = 0; i < R * C; i++)
            if (!(got[i] == want[i] || fabsf(got[i] - want[i]) <= 1e-6f * fabsf(want[i]) ||
                  (isnan(got[i]) && isnan(want[i]))))
                fail_msg("%s: element %d is %.9g, the reference's %.9g",
                         c ? "masked softmax" : "where", i, (double)got[i], (double)want[i]);
    }
}

/* Whether generated code has a non-temporal store (not just the macro's definition). */
static bool streams(const char *text) {
    const char *p;
    for (p = strstr(text, "TB_VSTREAM("); p != NULL; p = strstr(p + 1, "TB_VSTREAM("))
        if (strncmp(p + 11, "v, p)", 5) != 0) return true;
    return false;
}

/* The rows a pipelined softmax's work item takes (tb_r0 = tb_c * N in its kernel), 0 if none. */
static long pipe_chunk(const char *text) {
    const char *p = strstr(text, "tb_r0 = tb_c * ");
    return p != NULL ? strtol(p + 15, NULL, 10) : 0;
}

/* Norms over long f32 rows of a large output: the second pass over each row prefetches the
   next one and the last pass stores past the caches (non-temporal stores, then a fence), where
   every store is a whole aligned vector; values as the reference's either way. A row length
   that is not a multiple of the vector, or an x computed in the kernel, keeps plain stores or
   no prefetch. A softmax without an epilogue is pipelined (a work item per chunk of rows, each
   row streamed out while the next is computed) where two rows fit its private buffer; with
   longer rows it keeps its exponentials in the output and scales them in place. */
static void test_norm_rows_streamed(void **state) {
    enum { ROWS = 2048, COLS = 4096, ODD = 4102 }; /* ODD: no multiple of any vector width */
    const size_t n = (size_t)ROWS * ODD;
    float *host = (float *)malloc(n * sizeof(float)), *spec = (float *)malloc(n * sizeof(float)),
          *wb = (float *)malloc(2 * ODD * sizeof(float));
    tb_shape s = shp(TB_F32, 2, ROWS, COLS, 0, 0), so = shp(TB_F32, 2, ROWS, ODD, 0, 0),
             sw = shp(TB_F32, 1, COLS, 0, 0, 0), s1 = shp(TB_F32, 2, ROWS + 1, COLS, 0, 0),
             s16k = shp(TB_F32, 2, ROWS / 4, 4 * COLS, 0, 0),
             s8k = shp(TB_F32, 2, ROWS / 2, 2 * COLS, 0, 0);
    size_t i;
    int c;
    (void)state;
    REQUIRE_OPENCL();
    assert_non_null(host);
    assert_non_null(spec);
    assert_non_null(wb);
    for (i = 0; i < n; i++)
        host[i] = (float)(rnd_unit() * 8.0 - 4.0);
    for (i = 0; i < 2 * ODD; i++)
        wb[i] = (float)(rnd_unit() * 2.0 - 1.0);
    /* rows of s1 with what a softmax must keep, where the pipeline turns: a NaN in row 0 (the
       first of the first chunk), every element -inf at the end of each chunk, +inf in the
       first row of each later chunk, large values in the last row (of a shorter last chunk) */
    {
        tb_tensor *px = tb_tensor_from_host(host, &s1, &g_ocl), *py = tb_softmax(px, 1);
        char *ptext;
        long chunk;
        size_t r;
        assert_non_null(py);
        ptext = tb_ir_backend_text(&py, 1);
        assert_non_null(ptext);
        chunk = pipe_chunk(ptext);
        tb_free(ptext);
        tb_tensor_release(py);
        tb_tensor_release(px);
        assert_true(chunk >= 1);
        memcpy(spec, host, n * sizeof(float));
        spec[17] = NAN;
        for (r = (size_t)chunk - 1; r < ROWS; r += (size_t)chunk) {
            for (i = 0; i < COLS; i++)
                spec[r * COLS + i] = -INFINITY;
            if (r + 1 < ROWS) spec[(r + 1) * COLS + 4000] = INFINITY;
        }
        for (i = 0; i < COLS; i++)
            spec[(size_t)ROWS * COLS + i] = 80.0f + (float)(i % 7);
    }
    for (c = 0; c < 11; c++) {
        /* 0 layer_norm, 1 log_softmax, 2 softmax * 2 (an epilogue), 3 softmax (pipelined: a
           work item per chunk of rows, exponentials in a private buffer, the previous row
           streamed out while the next is computed), 4 layer_norm of rows of ODD, 5 layer_norm
           of exp(x) (computed in the kernel), 6 exp(x) * 2 + w (elementwise: streamed on
           native, which fences once per range of items; OpenCL C has no such point),
           7 softmax of 2049 rows with NaN and infinities (a short last chunk), 8 softmax of
           x * 0.5 (computed: pipelined, nothing to prefetch), 9 softmax of rows of 16384 (two
           rows too large for the private buffer: exponentials kept in out, not streamed),
           10 softmax of rows of 8192 (the largest private buffer) */
        const tb_shape *xs = c == 4 ? &so : c == 7 ? &s1 : c == 9 ? &s16k : c == 10 ? &s8k : &s;
        const bool pipe = c == 3 || c == 7 || c == 8 || c == 10;
        tb_tensor *x[2], *w[2], *b[2], *y[2];
        char *text, what[64];
        int d;
        for (d = 0; d < 2; d++) {
            const tb_device *dev = d ? &g_ocl : &g_cpu;
            x[d] = tb_tensor_from_host(c == 7 ? spec : host, xs, dev);
            w[d] = tb_tensor_from_host(wb, &sw, dev);
            b[d] = tb_tensor_from_host(wb + ODD, &sw, dev);
            if (c == 0) {
                y[d] = tb_layer_norm(x[d], 1, w[d], b[d], 1e-5);
            } else if (c == 1) {
                y[d] = tb_log_softmax(x[d], 1);
            } else if (c == 2) {
                tb_tensor *sm = tb_softmax(x[d], 1);
                y[d] = tb_mul_scalar(sm, 2.0);
                tb_tensor_release(sm);
            } else if (c == 3 || c == 7 || c == 9 || c == 10) {
                y[d] = tb_softmax(x[d], 1);
            } else if (c == 4) {
                y[d] = tb_layer_norm(x[d], 1, NULL, NULL, 1e-5);
            } else if (c == 5) {
                tb_tensor *e = tb_exp(x[d]);
                y[d] = tb_layer_norm(e, 1, w[d], b[d], 1e-5);
                tb_tensor_release(e);
            } else if (c == 6) {
                tb_tensor *e = tb_exp(x[d]), *e2 = tb_mul_scalar(e, 2.0);
                y[d] = tb_add(e2, w[d]);
                tb_tensor_release(e);
                tb_tensor_release(e2);
            } else {
                tb_tensor *h = tb_mul_scalar(x[d], 0.5);
                y[d] = tb_softmax(h, 1);
                tb_tensor_release(h);
            }
            assert_non_null(y[d]);
        }
        text = tb_ir_backend_text(&y[1], 1);
        assert_non_null(text);
        if (c == 4 || c == 9 || (c == 6 && TEST_OPENCL)) {
            assert_false(streams(text));
        } else {
            assert_true(streams(text));
            assert_non_null(strstr(text, "TB_VSTREAM_END();"));
        }
        assert_true((strstr(text, "tb_scr[") != NULL) == pipe);
        if (TEST_OPENCL) check_kernel_names("streamed norm", text);
        if (c == 3 || c == 7 || c == 10) {
            assert_non_null(strstr(text, "TB_PREFETCH_L2(b0 + "));
        } else if (c <= 4 || c == 9) {
            assert_non_null(strstr(text, "TB_PREFETCH(b0 + "));
        } else {
            assert_null(strstr(text, "TB_PREFETCH(b"));
            assert_null(strstr(text, "TB_PREFETCH_L2(b"));
        }
        tb_free(text);
        snprintf(what, sizeof what, "streamed norm case %d", c);
        compare_tensors(what, y[0], y[1]);
        for (d = 0; d < 2; d++) {
            tb_tensor_release(x[d]);
            tb_tensor_release(w[d]);
            tb_tensor_release(b[d]);
            tb_tensor_release(y[d]);
        }
    }
    free(host);
    free(spec);
    free(wb);
}

static void test_max_min_nan_large(void **state) {
    const size_t n = (size_t)1 << 20;
    tb_shape s = shp(TB_F32, 1, (int64_t)n, 0, 0, 0);
    float *a = (float *)malloc(n * sizeof(float));
    size_t nan_at[3], i;
    int round, op;
    (void)state;
    REQUIRE_OPENCL();
    assert_non_null(a);
    nan_at[0] = 0;
    nan_at[1] = n / 2 + 3;
    nan_at[2] = n - 1;
    for (round = 0; round < 5; round++) {
        float want_max = -INFINITY, want_min = INFINITY;
        for (i = 0; i < n; i++) {
            a[i] = (float)(rnd_unit() * 2000.0 - 1000.0);
            if (a[i] > want_max) want_max = a[i];
            if (a[i] < want_min) want_min = a[i];
        }
        if (round < 3) a[nan_at[round]] = NAN;
        if (round == 4) {
            for (i = 0; i < n; i++)
                a[i] = -INFINITY;
            want_max = -INFINITY;
            want_min = -INFINITY;
        }
        for (op = 0; op < 2; op++) {
            tb_tensor *x = tb_tensor_from_host(a, &s, &g_ocl);
            tb_tensor *y = op == 0 ? tb_max(x, NULL, 0, false) : tb_min(x, NULL, 0, false);
            float got = 0;
            assert_non_null(y);
            assert_int_equal(tb_tensor_to_host(y, &got, sizeof got), TB_OK);
            if (round < 3) {
                if (!isnan(got)) fail_msg("round %d op %d: got %g, want NaN", round, op, got);
            } else {
                assert_true(got == (op == 0 ? want_max : want_min));
            }
            tb_tensor_release(y);
            tb_tensor_release(x);
        }
    }
    free(a);
}

/* Scalar ops: each brings a scalar parameter (or a constant tensor) into the kernel that
   fuses it. */
enum {
    SOP_MUL,
    SOP_ADD,
    SOP_SUB,
    SOP_DIV,
    SOP_CLAMP,
    SOP_FULL,
    SOP_ONES,
    SOP_SCALAR,
    SOP_ROW,
    SOP_COUNT
};

static tb_tensor *scalar_op(tb_tensor *x, int op, double c) {
    tb_shape s = tb_tensor_shape(x);
    tb_device dev = tb_tensor_device(x);
    tb_tensor *k = NULL, *y;
    switch (op) {
    case SOP_MUL:
        return tb_mul_scalar(x, c);
    case SOP_ADD:
        return tb_add_scalar(x, c);
    case SOP_SUB:
        return tb_sub_scalar(x, c);
    case SOP_DIV:
        return tb_div_scalar(x, c);
    case SOP_CLAMP:
        return tb_clamp(x, -c, c);
    case SOP_FULL:
        k = tb_full(&s, c, &dev);
        y = tb_mul(x, k);
        break;
    case SOP_ONES:
        k = tb_ones(&s, &dev);
        y = tb_add(x, k);
        break;
    case SOP_SCALAR:
        k = tb_scalar_tensor(tb_scalar_f(TB_F32, c), &dev);
        y = tb_add(x, k);
        break;
    default: { /* a constant row, broadcast */
        tb_shape row = s;
        if (row.rank > 0) {
            row.rank = 1;
            row.dims[0] = s.dims[s.rank - 1];
        }
        k = tb_full(&row, c, &dev);
        y = tb_mul(x, k);
        break;
    }
    }
    tb_tensor_release(k);
    return y;
}

typedef struct scalar_chain {
    int op[3];
    double c[3];
    int n;
} scalar_chain;

static tb_tensor *apply_chain(tb_tensor *x, const scalar_chain *ch) {
    tb_tensor *y = tb_tensor_retain(x);
    int i;
    for (i = 0; i < ch->n; i++)
        y = take(y, scalar_op(y, ch->op[i], ch->c[i]));
    return y;
}

/* Constants near 1 keep products and exponentials in range. */
static void random_chain(scalar_chain *ch, int min_ops) {
    int i;
    ch->n = min_ops + (int)rnd_int(0, 2 - min_ops);
    for (i = 0; i < ch->n; i++) {
        ch->op[i] = (int)rnd_int(0, SOP_COUNT - 1);
        ch->c[i] = 0.5 + (double)rnd_int(0, 8) / 8.0;
    }
}

enum {
    SF_SUM,
    SF_MEAN,
    SF_MAX,
    SF_MIN,
    SF_PROD,
    SF_ARGMAX,
    SF_ARGMIN,
    SF_SOFTMAX,
    SF_LOG_SOFTMAX,
    SF_LAYER_NORM,
    SF_MATMUL_A,
    SF_MATMUL_B,
    SF_MATMUL_EPILOGUE,
    SF_COUNT
};

static const char *const sf_names[SF_COUNT] = {
    "sum",     "mean",        "max",        "min",      "prod",     "argmax",         "argmin",
    "softmax", "log_softmax", "layer_norm", "matmul a", "matmul b", "matmul epilogue"};

typedef struct sf_arg {
    int consumer;
    scalar_chain pro, pro_b, epi, on_weight, on_bias;
    int32_t axis;
    bool all_axes, keepdim;
    int32_t norm_ndim;
    bool weight, bias;
} sf_arg;

/* in[0] is x; layer_norm takes weight and bias from in[1] and in[2], matmul b from in[1]. */
static tb_tensor *build_scalar_feed(tb_tensor **in, const void *arg) {
    const sf_arg *a = (const sf_arg *)arg;
    tb_tensor *x = apply_chain(in[0], &a->pro), *y = NULL;
    const int32_t *axes = a->all_axes ? NULL : &a->axis;
    size_t num_axes = a->all_axes ? 0 : 1;
    switch (a->consumer) {
    case SF_SUM:
        y = tb_sum(x, axes, num_axes, a->keepdim);
        break;
    case SF_MEAN:
        y = tb_mean(x, axes, num_axes, a->keepdim);
        break;
    case SF_MAX:
        y = tb_max(x, axes, num_axes, a->keepdim);
        break;
    case SF_MIN:
        y = tb_min(x, axes, num_axes, a->keepdim);
        break;
    case SF_PROD:
        y = tb_prod(x, axes, num_axes, a->keepdim);
        break;
    case SF_ARGMAX:
        y = tb_argmax(x, a->axis, a->keepdim);
        break;
    case SF_ARGMIN:
        y = tb_argmin(x, a->axis, a->keepdim);
        break;
    case SF_SOFTMAX:
        y = tb_softmax(x, a->axis);
        break;
    case SF_LOG_SOFTMAX:
        y = tb_log_softmax(x, a->axis);
        break;
    case SF_LAYER_NORM: {
        tb_tensor *w = a->weight ? apply_chain(in[1], &a->on_weight) : NULL;
        tb_tensor *b = a->bias ? apply_chain(in[2], &a->on_bias) : NULL;
        y = tb_layer_norm(x, a->norm_ndim, w, b, 1e-5);
        tb_tensor_release(w);
        tb_tensor_release(b);
        break;
    }
    default: { /* matmul: the chains on a (pro) and b (pro_b) are empty where not wanted */
        tb_tensor *b = apply_chain(in[1], &a->pro_b);
        y = tb_matmul(x, b);
        tb_tensor_release(b);
        break;
    }
    }
    tb_tensor_release(x);
    return take(y, apply_chain(y, &a->epi));
}

/* A random long dim now and then: CPU reductions then take several accumulators, GPU code
   work-groups. */
static int64_t random_dim(void) {
    return rnd_u32() % 4 == 0 ? rnd_int(33, 70) : rnd_int(1, 5);
}

/* One random case of a consumer. */
static void scalar_feed_case(sf_arg *a, int consumer, const char *tag) {
    input in[3];
    char name[128];
    int32_t rank = (int32_t)rnd_int(1, 3), i;
    int64_t d[3];
    memset(a, 0, sizeof *a);
    a->consumer = consumer;
    for (i = 0; i < 3; i++)
        d[i] = consumer == SF_PROD ? rnd_int(1, 5) : random_dim();
    random_chain(&a->pro, consumer < SF_MATMUL_B ? 1 : 0);
    random_chain(&a->epi, consumer == SF_MATMUL_EPILOGUE ? 1 : 0);
    a->axis = (int32_t)rnd_int(-rank, rank - 1);
    a->all_axes = consumer <= SF_MIN && rnd_u32() % 4 == 0; /* prod: 5 factors at most */
    a->keepdim = rnd_u32() % 2 == 0;
    in[0] = in_of(shp(TB_F32, rank, d[0], d[1], d[2], 0), R_ANY);
    in[1] = in[2] = in[0];
    if (consumer == SF_LAYER_NORM) {
        a->norm_ndim = rank > 1 ? (int32_t)rnd_int(1, 2) : 1;
        a->weight = rnd_u32() % 2 == 0;
        a->bias = rnd_u32() % 2 == 0;
        random_chain(&a->on_weight, 0);
        random_chain(&a->on_bias, 0);
        if (a->norm_ndim == 1) {
            in[1] = in_of(shp(TB_F32, 1, d[rank - 1], 0, 0, 0), R_ANY);
        } else {
            in[1] = in_of(shp(TB_F32, 2, d[rank - 2], d[rank - 1], 0, 0), R_ANY);
        }
        in[2] = in[1];
    } else if (consumer >= SF_MATMUL_A) {
        int64_t n = random_dim();
        if (consumer != SF_MATMUL_A) random_chain(&a->pro_b, consumer == SF_MATMUL_B ? 1 : 0);
        if (rank == 1) {
            in[1] = in_of(shp(TB_F32, 2, d[0], n, 0, 0), R_ANY);
        } else {
            in[1] = in_of(shp(TB_F32, 2, d[rank - 1], n, 0, 0), R_ANY);
        }
    }
    snprintf(name, sizeof name, "%s%s fed by %d scalar op%s (rank %d)", tag, sf_names[consumer],
             a->pro.n + a->pro_b.n, a->pro.n + a->pro_b.n == 1 ? "" : "s", (int)rank);
    add_case(name, build_scalar_feed, a, in, 3);
}

static tb_tensor *build_ln_of_scalar(tb_tensor **in, const void *arg) {
    int which = *(const int *)arg;
    tb_tensor *h, *w = NULL, *y;
    if (which == 0) {
        h = tb_mul_scalar(in[0], 0.5);
    } else if (which == 1) {
        h = tb_add_scalar(in[0], 1);
    } else {
        tb_shape ws = shp(TB_F32, 1, 4, 0, 0, 0);
        tb_device dev = tb_tensor_device(in[0]);
        h = tb_tensor_retain(in[0]);
        w = tb_ones(&ws, &dev);
    }
    y = tb_layer_norm(h, 1, w, NULL, 1e-5);
    tb_tensor_release(h);
    tb_tensor_release(w);
    return y;
}

static void test_scalar_feeds_every_kernel_kind(void **state) {
    static const int ln_which[3] = {0, 1, 2};
    static sf_arg args[SF_COUNT * 5];
    size_t n = 0;
    int c, round;
    input in[1];
    (void)state;
    REQUIRE_OPENCL();
    /* the reported graphs: layer_norm of x * 0.5, of x + 1, with a ones weight */
    in[0] = in_of(shp(TB_F32, 2, 2, 4, 0, 0), R_ANY);
    add_case("layer_norm(x * 0.5)", build_ln_of_scalar, &ln_which[0], in, 1);
    flush_cases_direct();
    add_case("layer_norm(x + 1)", build_ln_of_scalar, &ln_which[1], in, 1);
    flush_cases_direct();
    add_case("layer_norm(x, ones)", build_ln_of_scalar, &ln_which[2], in, 1);
    flush_cases_direct();
    g_rng = 0x5CA1A2F00Dull;
    for (round = 0; round < 4; round++) {
        /* the last round renders the GPU code (work-groups, local-memory tiles) */
#ifndef TB_NO_OPENCL
        tb__ocl_codegen_as_gpu = round == 3;
#endif
        tb_computation_cache_clear();
        /* one graph a round, each round led by other consumers: the scalars of the first
           cases are the graph's first parameters, with the smallest argument names */
        for (c = 0; c < SF_COUNT; c++)
            scalar_feed_case(&args[n++], (c + 5 * round) % SF_COUNT,
                             round == 3 ? "GPU code: " : "");
        flush_cases_direct();
    }
#ifndef TB_NO_OPENCL
    tb__ocl_codegen_as_gpu = 0;
#endif
    tb_computation_cache_clear();
    /* long rows: split reductions and packed matmul operands */
    {
        sf_arg *a;
        input big[3];
        for (c = SF_SUM; c <= SF_MIN; c++) {
            a = &args[n++];
            memset(a, 0, sizeof *a);
            a->consumer = c;
            a->axis = 1;
            a->pro.n = 2;
            a->pro.op[0] = SOP_MUL;
            a->pro.c[0] = 0.75;
            a->pro.op[1] = c == SF_SUM ? SOP_ROW : SOP_ADD;
            a->pro.c[1] = 1.25;
            a->epi.n = 1;
            a->epi.op[0] = SOP_SUB;
            a->epi.c[0] = 0.5;
            big[0] = in_of(shp(TB_F32, 2, 2, 20000, 0, 0), R_ANY);
            add_case("split reduction fed by scalar ops", build_scalar_feed, a, big, 1);
        }
        flush_cases_direct();
        for (c = SF_MATMUL_A; c <= SF_MATMUL_EPILOGUE; c++) {
            a = &args[n++];
            memset(a, 0, sizeof *a);
            a->consumer = c;
            a->pro.n = c != SF_MATMUL_B;
            a->pro.op[0] = SOP_SCALAR;
            a->pro.c[0] = 0.25;
            a->pro_b.n = c != SF_MATMUL_A;
            a->pro_b.op[0] = SOP_DIV;
            a->pro_b.c[0] = 1.5;
            a->epi.n = 2;
            a->epi.op[0] = SOP_CLAMP;
            a->epi.c[0] = 4;
            a->epi.op[1] = SOP_FULL;
            a->epi.c[1] = 0.5;
            big[0] = in_of(shp(TB_F32, 2, 64, 64, 0, 0), R_ANY);
            big[1] = in_of(shp(TB_F32, 2, 64, 64, 0, 0), R_ANY);
            add_case("packed matmul fed by scalar ops", build_scalar_feed, a, big, 2);
        }
        flush_cases_direct();
    }
}

/* in the order they run */
static const struct CMUnitTest fusion_tests[] = {
    cmocka_unit_test(test_fusion_patterns),
    cmocka_unit_test(test_max_min_nan_large),
    cmocka_unit_test(test_vector_exp),
    cmocka_unit_test(test_erf_gelu_f32),
    cmocka_unit_test(test_tanh_sigmoid_f32),
    cmocka_unit_test(test_log_softplus_sin_f32),
    cmocka_unit_test(test_vector_clamp),
    cmocka_unit_test(test_vector_where_mask),
    cmocka_unit_test(test_norm_rows_streamed),
    cmocka_unit_test(test_matmul_reads_a_in_place),
    cmocka_unit_test(test_kept_panels_follow_their_buffer),
    cmocka_unit_test(test_long_chain_splits),
    cmocka_unit_test(test_many_arguments_split),
    cmocka_unit_test(test_scalar_feeds_every_kernel_kind),
};
