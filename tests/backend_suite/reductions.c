/* The compiled-backend suite, reductions. Reductions: every reduction over every set of axes,
   argmax/argmin with NaN and ties, and reductions over a few elements computed inside the kernel
   that reads them. Part of tests/backend_suite/suite.c. */

/* ---- reductions ---- */

typedef struct reduce_arg {
    int which; /* 0 sum 1 mean 2 max 3 min 4 prod 5 argmax 6 argmin */
    int32_t axes[4];
    size_t num_axes;
    bool keepdim;
    bool prologue; /* reduce exp(x) * 0.5 rather than x */
    int operand;   /* 1: reduce x * in[1] (a row along x's last axis), 2: x * in[1] (a column) */
    bool epilogue; /* sqrt(|y|) * 2 + 1 of the result */
} reduce_arg;

static tb_tensor *build_reduce(tb_tensor **in, const void *arg) {
    const reduce_arg *a = (const reduce_arg *)arg;
    tb_tensor *x = tb_tensor_retain(in[0]), *y = NULL;
    if (a->prologue) {
        tb_tensor *e = tb_exp(x);
        tb_tensor_release(x);
        x = tb_mul_scalar(e, 0.5);
        tb_tensor_release(e);
    }
    if (a->operand > 0) {
        tb_tensor *p = tb_mul(x, in[1]);
        tb_tensor_release(x);
        x = p;
    }
    switch (a->which) {
    case 0:
        y = tb_sum(x, a->axes, a->num_axes, a->keepdim);
        break;
    case 1:
        y = tb_mean(x, a->axes, a->num_axes, a->keepdim);
        break;
    case 2:
        y = tb_max(x, a->axes, a->num_axes, a->keepdim);
        break;
    case 3:
        y = tb_min(x, a->axes, a->num_axes, a->keepdim);
        break;
    case 4:
        y = tb_prod(x, a->axes, a->num_axes, a->keepdim);
        break;
    case 5:
        y = tb_argmax(x, a->axes[0], a->keepdim);
        break;
    default:
        y = tb_argmin(x, a->axes[0], a->keepdim);
        break;
    }
    tb_tensor_release(x);
    if (a->epilogue && y != NULL) {
        tb_tensor *m = tb_abs(y), *r = tb_sqrt(m), *t = tb_mul_scalar(r, 2.0);
        tb_tensor_release(y);
        y = tb_add_scalar(t, 1.0);
        tb_tensor_release(t);
        tb_tensor_release(r);
        tb_tensor_release(m);
    }
    return y;
}

static void test_reductions(void **state) {
    static reduce_arg args[1024];
    static const int32_t axis_sets[][3] = {{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {0, 2, 0},
                                           {1, 2, 0}, {0, 1, 2}, {-1, 0, 0}};
    static const size_t axis_counts[] = {1, 1, 1, 2, 2, 3, 1};
    static const char *const names[] = {"sum", "mean", "max", "min", "prod", "argmax", "argmin"};
    const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_BOOL};
    size_t n = 0, s, d;
    int which, keep;
    (void)state;
    REQUIRE_OPENCL();
    for (which = 0; which < 7; which++) {
        for (d = 0; d < 6; d++) {
            tb_dtype dt = dtypes[d];
            if (which == 1 && !tb_dtype_is_float(dt)) continue;
            if ((which == 0 || which == 4 || which >= 5) && dt == TB_BOOL) continue;
            for (s = 0; s < sizeof axis_counts / sizeof axis_counts[0]; s++) {
                for (keep = 0; keep < 2; keep++) {
                    reduce_arg *a = &args[n++];
                    input in;
                    char name[128];
                    if (which >= 5 && axis_counts[s] != 1) continue;
                    /* every axis set for f32 (keepdim on two of them), one per other dtype */
                    if (keep && (d != 0 || s != 4)) continue;
                    if (d == 0 && which < 5 && s != 1 && s != 3 && s != 5 && s != 6) continue;
                    if (d == 0 && which >= 5 && s != 0 && s != 6) continue;
                    if (d != 0) {
                        size_t pick = (size_t)(which + (int)d) % 7;
                        if (which >= 5 && axis_counts[pick] != 1)
                            pick = (size_t)(which + (int)d) % 3;
                        if (s != pick) continue;
                    }
                    a->which = which;
                    memcpy(a->axes, axis_sets[s], sizeof axis_sets[s]);
                    a->num_axes = axis_counts[s];
                    a->keepdim = keep != 0;
                    a->prologue = false;
                    a->operand = 0;
                    a->epilogue = false;
                    in = in_of(shp(dt, 3, 3, 5, 7, 0), which >= 2 && which != 4 ? R_WHOLE : R_ANY);
                    snprintf(name, sizeof name, "%s of %s[3,5,7] over %zu axes (set %zu)%s",
                             names[which], tb_dtype_name(dt), axis_counts[s], s,
                             keep ? " keepdim" : "");
                    add_case(name, build_reduce, a, &in, 1);
                }
            }
        }
        flush_cases();
    }
    /* all axes, long rows (work-group reductions), an elementwise prologue, size-1 axes */
    {
        /* long rows, long columns, many rows; then rows so long the reduction is split into
           chunks reduced in parallel and combined */
        /* and ranges long enough per work item that each vector accumulator of CPU devices
           reads its own part (rows of 40003; chunks of a split over 4200007) */
        static const int64_t sizes[][3] = {{1, 5000, 1},   {5000, 3, 0},  {64, 700, 1},
                                           {2, 40000, 1},  {50000, 1, 0}, {16, 40003, 1},
                                           {1, 4200007, 1}};
        size_t k;
        for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            if (g_small && sizes[k][0] * sizes[k][1] > 50000) continue;
            for (which = 0; which < 7; which++) {
                reduce_arg *a;
                input in = in_of(shp(TB_F32, 2, sizes[k][0], sizes[k][1], 0, 0), R_ANY);
                if (which == 3 || which == 4 || which == 6) continue; /* as max, sum, argmax */
                a = &args[n++];
                char name[128];
                a->which = which;
                a->axes[0] = (int32_t)sizes[k][2];
                a->num_axes = which == 0 && k == 1 ? 0 : 1; /* 0: every axis */
                a->keepdim = false;
                a->prologue = which < 5;
                a->operand = 0;
                a->epilogue = false;
                if (which == 4) in.range = R_POSITIVE;
                snprintf(name, sizeof name, "%s over [%lld,%lld] axis %d%s", names[which],
                         (long long)sizes[k][0], (long long)sizes[k][1], (int)a->axes[0],
                         a->prologue ? " of exp(x)*0.5" : "");
                add_case(name, build_reduce, a, &in, 1);
            }
        }
        flush_cases();
    }
    /* every dtype over rows and columns whose length is not a multiple of the accumulator
       lanes of CPU devices (the remainder loop), plain and split into chunks */
    {
        static const int64_t sizes[][3] = {{7, 1003, 1}, {1003, 7, 0}, {1, 70001, 1}};
        const tb_dtype more[] = {TB_F64, TB_I32, TB_I64, TB_U8};
        size_t k;
        for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            if (g_small && sizes[k][0] * sizes[k][1] > 50000) continue;
            for (d = 0; d < sizeof more / sizeof more[0]; d++) {
                for (which = 0; which < 5; which++) {
                    reduce_arg *a;
                    input in;
                    char name[128];
                    if (which == 1 && !tb_dtype_is_float(more[d])) continue;
                    /* a float product of 70001 factors overflows in any order */
                    if (which == 4 && k == 2 && tb_dtype_is_float(more[d])) continue;
                    assert_true(n < sizeof args / sizeof args[0]);
                    in = in_of(shp(more[d], 2, sizes[k][0], sizes[k][1], 0, 0),
                               which == 4 ? R_POSITIVE : R_ANY);
                    a = &args[n++];
                    a->which = which;
                    a->axes[0] = (int32_t)sizes[k][2];
                    a->num_axes = 1;
                    a->keepdim = false;
                    a->prologue = false;
                    a->operand = 0;
                    a->epilogue = false;
                    snprintf(name, sizeof name, "%s of %s[%lld,%lld] axis %d", names[which],
                             tb_dtype_name(more[d]), (long long)sizes[k][0], (long long)sizes[k][1],
                             (int)a->axes[0]);
                    add_case(name, build_reduce, a, &in, 1);
                }
            }
            flush_cases();
        }
    }
    /* over leading axes that keep a last axis of a multiple of 16 (a bias's gradient), which
       CPU devices compute as columns of vectors: a count of rows that is not a multiple of the
       accumulators (1003), two leading axes, fewer rows than accumulators, keepdim, a prologue
       with an operand along the row or along the columns, an epilogue, the 16-bit floats */
    {
        static const int64_t cols[][4] = {{2, 1003, 32, 1}, {3, 6, 10, 48}, {3, 2, 3, 16}};
        const tb_dtype fl[] = {TB_F32, TB_F16, TB_BF16};
        size_t k;
        for (k = 0; k < sizeof cols / sizeof cols[0]; k++) {
            for (d = 0; d < sizeof fl / sizeof fl[0]; d++) {
                for (which = 0; which < 4; which++) {
                    int variant = (which + (int)k + (int)d) % 4;
                    reduce_arg *a;
                    input ins[2];
                    size_t nin = 1;
                    char name[160];
                    int32_t rank = (int32_t)cols[k][0];
                    assert_true(n < sizeof args / sizeof args[0]);
                    a = &args[n++];
                    a->which = which;
                    a->axes[0] = 0;
                    a->axes[1] = 1;
                    a->num_axes = rank == 2 ? 1 : 2;
                    a->keepdim = variant == 3;
                    a->prologue = variant == 0;
                    a->operand = variant == 1 ? 1 : variant == 2 ? 2 : 0;
                    a->epilogue = variant != 0;
                    ins[0] = in_of(shp(fl[d], rank, cols[k][1], cols[k][2], cols[k][3], 0), R_ANY);
                    if (a->operand == 1) { /* [C]: along the row */
                        ins[nin++] = in_of(shp(fl[d], 1, cols[k][rank], 0, 0, 0), R_ANY);
                    } else if (a->operand == 2) { /* [.., 1]: one value per row, broadcast */
                        ins[nin++] = in_of(
                            shp(fl[d], rank, cols[k][1], rank == 2 ? 1 : cols[k][2], 1, 0), R_ANY);
                    }
                    snprintf(name, sizeof name, "%s of %s%s over the leading axes (variant %d)",
                             names[which], tb_dtype_name(fl[d]),
                             k == 0   ? "[1003,32]"
                             : k == 1 ? "[6,10,48]"
                                      : "[2,3,16]",
                             variant);
                    add_case(name, build_reduce, a, ins, nin);
                }
            }
            flush_cases();
        }
    }
}

static void test_argmax_nan_and_ties(void **state) {
    float x[12] = {1, 3, 3, 0, NAN, 2, NAN, 5, -1, -1, -1, -1};
    tb_shape s = shp(TB_F32, 2, 3, 4, 0, 0);
    tb_tensor *cx, *ox, *ca, *oa, *cm, *om;
    (void)state;
    REQUIRE_OPENCL();
    cx = tb_tensor_from_host(x, &s, &g_cpu);
    ox = tb_tensor_from_host(x, &s, &g_ocl);
    ca = tb_argmax(cx, 1, false);
    oa = tb_argmax(ox, 1, false);
    cm = tb_max(cx, NULL, 0, false);
    om = tb_max(ox, NULL, 0, false);
    compare_tensors("argmax with NaN and ties", ca, oa);
    compare_tensors("max with NaN", cm, om);
    {
        int64_t idx[3];
        assert_int_equal(tb_tensor_to_host(oa, idx, sizeof idx), TB_OK);
        assert_int_equal(idx[0], 1); /* first of the tied maxima */
        assert_int_equal(idx[1], 0); /* NaN counts as the maximum */
        assert_int_equal(idx[2], 0);
    }
    {
        /* a window of 9 (a 3 x 3 max pool's, unrolled where it is read): ties, a NaN last or
           among ties, signed zeros; argmax and argmin, f32 and f64 */
        static const float w[36] = {2,          7,    7,  1,   7,    0,     3,  0,  1,
                                    /**/ 1,     2,    3,  4,   5,    6,     7,  8,  NAN,
                                    /**/ 9,     1,    9,  NAN, 1,    NAN,   0,  9,  0,
                                    /**/ -0.0f, 0.0f, -1, -1,  0.0f, -0.0f, -1, -5, -5};
        static const int64_t want[2][4] = {{1, 8, 3, 0}, {5, 8, 3, 7}};
        double wd[36];
        tb_shape s9 = shp(TB_F32, 2, 4, 9, 0, 0), s9d = shp(TB_F64, 2, 4, 9, 0, 0);
        int i, f, arg;
        for (i = 0; i < 36; i++)
            wd[i] = w[i];
        for (f = 0; f < 2; f++) {
            tb_tensor *t =
                tb_tensor_from_host(f ? (const void *)wd : (const void *)w, f ? &s9d : &s9, &g_ocl);
            for (arg = 0; arg < 2; arg++) {
                tb_tensor *r = arg ? tb_argmin(t, 1, false) : tb_argmax(t, 1, false);
                int64_t got[4];
                assert_int_equal(tb_tensor_to_host(r, got, sizeof got), TB_OK);
                for (i = 0; i < 4; i++)
                    assert_int_equal(got[i], want[arg][i]);
                tb_tensor_release(r);
            }
            tb_tensor_release(t);
        }
    }
    tb_tensor_release(cx);
    tb_tensor_release(ox);
    tb_tensor_release(ca);
    tb_tensor_release(oa);
    tb_tensor_release(cm);
    tb_tensor_release(om);
}

/* ---- reductions over a few elements, and repeated kernels ---- */

/* The graph of y on both devices: y(cpu) against y(device), and the device's kernel count. */
typedef tb_tensor *(*small_graph)(tb_tensor *const *in);

static tb_tensor *g_pool_relu(tb_tensor *const *in) {
    const int64_t k[2] = {3, 3}, st[2] = {2, 2}, pd[2] = {1, 1};
    tb_tensor *p = tb_max_pool2d(in[0], k, st, pd, NULL, false), *y = tb_relu(p);
    tb_tensor_release(p);
    return y;
}

static tb_tensor *g_depthwise_relu6(tb_tensor *const *in) {
    const int64_t pd[2] = {1, 1};
    tb_tensor *c = tb_conv2d(in[0], in[1], in[2], NULL, pd, NULL, 8), *y = tb_clamp(c, 0, 6);
    tb_tensor_release(c);
    return y;
}

static tb_tensor *g_sum_broadcast(tb_tensor *const *in) {
    int32_t ax = 3;
    tb_tensor *s = tb_sum(in[0], &ax, 1, true), *e = tb_exp(s), *y = tb_mul(e, in[0]);
    tb_tensor_release(e);
    tb_tensor_release(s);
    return y;
}

static void small_case(const char *what, small_graph f, int want_kernels, bool want_reduce_kernel) {
    tb_shape xs = shp(TB_F32, 4, 2, 8, 13, 12), ws = shp(TB_F32, 4, 8, 1, 3, 3),
             bs = shp(TB_F32, 1, 8, 0, 0, 0);
    const tb_shape *shapes[3] = {&xs, &ws, &bs};
    tb_tensor *in[2][3], *y[2];
    char *text;
    int d, j;
    for (j = 0; j < 3; j++) {
        size_t n = numel_of(shapes[j]), i;
        float *v = (float *)malloc(n * sizeof(float));
        assert_non_null(v);
        for (i = 0; i < n; i++) /* small integers: ties in every window */
            v[i] = (float)((int)(rnd_unit() * 7.0) - 3);
        for (d = 0; d < 2; d++)
            in[d][j] = tb_tensor_from_host(v, shapes[j], d ? &g_ocl : &g_cpu);
        free(v);
    }
    for (d = 0; d < 2; d++) {
        y[d] = f(in[d]);
        assert_non_null(y[d]);
    }
    assert_int_equal(kernel_count(&y[1], 1), want_kernels);
    text = tb_ir_backend_text(&y[1], 1);
    assert_non_null(text);
    if ((strstr(text, "void R_") != NULL) != want_reduce_kernel)
        fail_msg("%s: a reduction kernel %s", what, want_reduce_kernel ? "missing" : "made");
    tb_free(text);
    compare_tensors(what, y[0], y[1]);
    for (d = 0; d < 2; d++) {
        tb_tensor_release(y[d]);
        for (j = 0; j < 3; j++)
            tb_tensor_release(in[d][j]);
    }
}

static void test_small_reductions_inline(void **state) {
    (void)state;
    REQUIRE_OPENCL();
    /* a 3 x 3 max-pool and the ReLU after it: one kernel, the window's max unrolled in it */
    small_case("max-pool and relu", g_pool_relu, 1, false);
    /* a depthwise convolution with bias and clamp, its padding read in place: one kernel */
    small_case("depthwise convolution", g_depthwise_relu6, 1, false);
    /* a sum of 12 broadcast back over its row: computed once per row in a kernel of its own
       (inlined, each value would be summed again at every element of its row) */
    small_case("sum broadcast", g_sum_broadcast, 2, false);
}

/* Reductions over the trailing axes of a view whose flat index unravels with divisions: the
   loop takes the view's last axis as an inner run (tb__cg_red_unravels). x[..., 2:26] of
   [N, 4, 9, 28] (a convolution's output over whole padded rows), or a permutation of
   [N, 4, 24, 9], times a second input of the view's shape. */
typedef struct view_reduce_arg {
    int which; /* 0 sum 1 max 2 mean */
    bool permuted;
    int32_t axes[3];
    size_t num_axes; /* 0: all */
    bool keepdim;
} view_reduce_arg;

static tb_tensor *build_view_reduce(tb_tensor **in, const void *arg) {
    const view_reduce_arg *a = (const view_reduce_arg *)arg;
    static const int32_t swap[4] = {0, 1, 3, 2};
    tb_tensor *v = a->permuted ? tb_permute(in[0], swap, 4) : tb_slice(in[0], 3, 2, 26, 1);
    tb_tensor *p = tb_mul(v, in[1]), *y;
    const int32_t *axes = a->num_axes > 0 ? a->axes : NULL;
    if (a->which == 0) {
        y = tb_sum(p, axes, a->num_axes, a->keepdim);
    } else if (a->which == 1) {
        y = tb_max(p, axes, a->num_axes, a->keepdim);
    } else {
        y = tb_mean(p, axes, a->num_axes, a->keepdim);
    }
    tb_tensor_release(p);
    tb_tensor_release(v);
    return y;
}

static void test_reductions_through_views(void **state) {
    static view_reduce_arg args[24];
    static const char *const names[] = {"sum", "max", "mean"};
    static const int64_t images[] = {6, 128}; /* 128: split into many chunks of one item each */
    size_t n = 0, k;
    int which, perm, set;
    (void)state;
    REQUIRE_OPENCL();
    for (k = 0; k < 2; k++) {
        if (g_small && k > 0) continue;
        for (which = 0; which < 3; which++)
            for (perm = 0; perm < 2; perm++)
                for (set = 0; set < 2; set++) {
                    view_reduce_arg *a = &args[n++];
                    input ins[2];
                    char name[128];
                    a->which = which;
                    a->permuted = perm != 0;
                    a->num_axes = set == 0 ? 0 : 3;
                    a->axes[0] = 1, a->axes[1] = 2, a->axes[2] = 3;
                    a->keepdim = set != 0;
                    ins[0] = in_of(perm ? shp(TB_F32, 4, images[k], 4, 24, 9)
                                        : shp(TB_F32, 4, images[k], 4, 9, 28),
                                   R_ANY);
                    ins[1] = in_of(shp(TB_F32, 4, images[k], 4, 9, 24), R_ANY);
                    snprintf(name, sizeof name, "%s over %s of %s[%lld,...]", names[which],
                             set == 0 ? "all axes" : "axes 1-3 (keepdim)",
                             perm ? "a permutation" : "a slice", (long long)images[k]);
                    add_case(name, build_view_reduce, a, ins, 2);
                }
        flush_cases();
    }
}

/* ---- reductions computed at the start of another reduction's rows ---- */

/* A reduction read by a reduction's kernel only at the row it reduces is computed there, by a
   loop at the start of each row (tb__plan_hoist): a chain of row maxima (each over the last
   one's result plus a row of x), a log-sum-exp, a variance over two axes, a log-sum-exp over
   the columns, the max of rows of signed zeros (the first zero's sign, as in order); and where
   it must not be: a reduction also returned, one read at another row (through a flip), one too
   large. */
typedef struct hoist_arg {
    int which;
    int want_kernels;
} hoist_arg;

/* max(x, axis, keepdim) then m + log(sum(exp(x - m))) over the same axis (keepdim) */
static tb_tensor *logsumexp_of(tb_tensor *x, int32_t axis, tb_tensor **max_out) {
    tb_tensor *m = tb_max(x, &axis, 1, true), *d = tb_sub(x, m), *e = tb_exp(d);
    tb_tensor *s = tb_sum(e, &axis, 1, true), *l = tb_log(s), *y = tb_add(l, m);
    tb_tensor_release(l);
    tb_tensor_release(s);
    tb_tensor_release(e);
    tb_tensor_release(d);
    if (max_out != NULL) {
        *max_out = m;
    } else {
        tb_tensor_release(m);
    }
    return y;
}

static tb_tensor *build_hoist(tb_tensor **in, const void *arg) {
    const hoist_arg *a = (const hoist_arg *)arg;
    int32_t ax = 1, two[2] = {1, 2}, rows = 0;
    tb_tensor *r, *t, *u, *y;
    int i;
    switch (a->which) {
    case 0: /* 24 steps of r = max(r + x) along rows, from r = min(x) */
        r = tb_min(in[0], &ax, 1, true);
        for (i = 0; i < 24; i++) {
            t = tb_add(r, in[0]);
            u = tb_max(t, &ax, 1, true);
            tb_tensor_release(t);
            tb_tensor_release(r);
            r = u;
        }
        return r;
    case 1: /* log-sum-exp along rows */
    case 4: /* the same, too large to hoist */
        return logsumexp_of(in[0], 1, NULL);
    case 2: { /* a variance over axes 1 and 2, its output without them */
        tb_tensor *mu = tb_mean(in[0], two, 2, true), *d = tb_sub(in[0], mu), *q = tb_mul(d, d);
        y = tb_mean(q, two, 2, false);
        tb_tensor_release(q);
        tb_tensor_release(d);
        tb_tensor_release(mu);
        return y;
    }
    case 3: /* log-sum-exp over the columns */
        return logsumexp_of(in[0], rows, NULL);
    case 5: { /* the row's max read flipped: another row's */
        int32_t fl = 0;
        tb_tensor *m = tb_max(in[0], &ax, 1, true), *f = tb_flip(m, &fl, 1), *d = tb_sub(in[0], f);
        y = tb_sum(d, &ax, 1, true);
        tb_tensor_release(d);
        tb_tensor_release(f);
        tb_tensor_release(m);
        return y;
    }
    case 7: { /* sum(x + 1 / max(x[:, :20])): the sign of the first zero of the max's row */
        tb_tensor *h = tb_slice(in[0], 1, 0, 20, 1), *m = tb_max(h, &ax, 1, true);
        tb_tensor *q = tb_reciprocal(m), *p = tb_add(in[0], q);
        y = tb_sum(p, &ax, 1, true);
        tb_tensor_release(p);
        tb_tensor_release(q);
        tb_tensor_release(m);
        tb_tensor_release(h);
        return y;
    }
    default: { /* the max also a result: both returned, side by side */
        tb_tensor *both[2];
        both[0] = logsumexp_of(in[0], 1, &both[1]);
        y = tb_concat(both, 2, 1);
        tb_tensor_release(both[0]);
        tb_tensor_release(both[1]);
        return y;
    }
    }
}

static void test_reductions_hoisted(void **state) {
    static const hoist_arg args[] = {{0, 1}, {1, 1}, {2, 1}, {3, 1},
                                     {4, 2}, {5, 2}, {6, 3}, {7, 1}};
    static const char *const names[] = {
        "a chain of 24 row maxima", "log-sum-exp along rows",     "variance over axes 1 and 2",
        "log-sum-exp over columns", "log-sum-exp of 64K",         "a row max read flipped",
        "log-sum-exp and its max",  "1 / the max of signed zeros"};
    size_t k;
    (void)state;
    REQUIRE_OPENCL();
    for (k = 0; k < sizeof args / sizeof args[0]; k++) {
        const hoist_arg *a = &args[k];
        tb_shape xs = a->which == 2   ? shp(TB_F32, 3, 6, 5, 7, 0)
                      : a->which == 4 ? shp(TB_F32, 2, 128, 512, 0, 0)
                      : a->which == 1 ? shp(TB_F32, 2, 9, 80, 0, 0) /* vectors along rows */
                      : a->which == 3 ? shp(TB_F32, 2, 40, 12, 0, 0)
                      : a->which == 7 ? shp(TB_F32, 2, 8, 40, 0, 0)
                                      : shp(TB_F32, 2, 8, 32, 0, 0);
        tb_tensor *x[2], *y[2];
        int d;
        float *v;
        size_t n = numel_of(&xs), i;
        v = (float *)malloc(n * sizeof(float));
        assert_non_null(v);
        for (i = 0; i < n; i++)
            v[i] = (float)((int)(rnd_unit() * 9.0) - 4) * 0.25f; /* ties in every row */
        if (a->which == 1) v[5 * 80 + 17] = NAN;                 /* row 5: NaN throughout */
        for (i = 0; a->which == 7 && i < n; i++) /* -1, +0 and -0: the max a zero of either sign */
            v[i] = i % 40 == 0   ? -1.0f
                   : i % 40 == 1 ? 0.0f
                   : i % 40 == 4 ? -0.0f
                                 : (i % 3 == 0 ? -1.0f : v[i] * 0.0f);
        for (d = 0; d < 2; d++) {
            x[d] = tb_tensor_from_host(v, &xs, d ? &g_ocl : &g_cpu);
            y[d] = build_hoist(&x[d], a);
            assert_non_null(y[d]);
        }
        free(v);
        if (kernel_count(&y[1], 1) != a->want_kernels)
            fail_msg("%s: %d kernels, expected %d", names[k], kernel_count(&y[1], 1),
                     a->want_kernels);
        compare_tensors(names[k], y[0], y[1]);
        for (d = 0; d < 2; d++) {
            tb_tensor_release(y[d]);
            tb_tensor_release(x[d]);
        }
    }
}

/* in the order they run */
static const struct CMUnitTest reductions_tests[] = {
    cmocka_unit_test(test_reductions),
    cmocka_unit_test(test_argmax_nan_and_ties),
    cmocka_unit_test(test_small_reductions_inline),
    cmocka_unit_test(test_reductions_through_views),
    cmocka_unit_test(test_reductions_hoisted),
};
