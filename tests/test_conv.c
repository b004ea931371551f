/* Convolution and pooling: tb_conv1d/2d, tb_conv_transpose1d/2d, tb_max_pool1d/2d,
   tb_avg_pool1d/2d, tb_adaptive_avg_pool1d/2d, tb_window and tb_fold. Forward values and the
   gradients of sum(y * r) on awkward cases (stride larger than the kernel, padding larger
   than the kernel, dilation, groups = channels, size-1 spatial dims, batch 1, unbatched
   inputs, odd sizes, non-contiguous inputs, max-pool ties) against PyTorch in f64
   (/usr/bin/python3 tests/conv_torch.py; skipped with a message where torch is missing), the
   opencl and native backends against the cpu in f32, and the errors of bad arguments. */
#define _POSIX_C_SOURCE 200809L /* popen, mkstemp */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct conv_case {
    const char *name;
    const char *op; /* conv convt maxpool avgpool adaptive */
    int64_t ints[16];
    int nints;
    int64_t xd[4];
    int xr;
    int64_t wd[4];
    int wr;        /* 0: no weight */
    bool bias;     /* conv and convt */
    bool permuted; /* x made as the transpose of its last two dims */
    bool ties;     /* x holds small integers: many equal elements */
} conv_case;

/* ints: conv [n, s.., p.., d.., groups]; convt [n, s.., p.., op.., d.., groups];
   maxpool [n, k.., s.., p.., d.., ceil]; avgpool [n, k.., s.., p.., ceil, include_pad];
   adaptive [n, out..] */
static const conv_case g_cases[] = {
    {"conv2d_basic",
     "conv",
     {2, 2, 1, 1, 0, 1, 1, 1},
     8,
     {2, 3, 7, 6},
     4,
     {4, 3, 3, 2},
     4,
     true,
     false,
     false},
    {"conv2d_stride_gt_kernel",
     "conv",
     {2, 3, 3, 0, 0, 1, 1, 1},
     8,
     {1, 2, 8, 9},
     4,
     {3, 2, 2, 2},
     4,
     false,
     false,
     false},
    {"conv2d_pad_gt_kernel",
     "conv",
     {2, 1, 2, 3, 2, 1, 1, 1},
     8,
     {2, 2, 3, 4},
     4,
     {2, 2, 2, 1},
     4,
     true,
     false,
     false},
    {"conv2d_dilation",
     "conv",
     {2, 1, 2, 2, 1, 2, 3, 1},
     8,
     {2, 3, 9, 10},
     4,
     {2, 3, 3, 3},
     4,
     true,
     false,
     false},
    {"conv2d_depthwise",
     "conv",
     {2, 1, 1, 1, 1, 1, 1, 4},
     8,
     {2, 4, 5, 5},
     4,
     {8, 1, 3, 3},
     4,
     true,
     false,
     false},
    /* rows long enough that the native backend's row loop splits into its edges and an
       interior with no padding test (and pads on H alone, clamped and selected) */
    {"conv2d_depthwise_wide",
     "conv",
     {2, 1, 1, 1, 1, 1, 1, 4},
     8,
     {2, 4, 6, 37},
     4,
     {4, 1, 3, 3},
     4,
     true,
     false,
     false},
    {"conv2d_depthwise_stride2_wide",
     "conv",
     {2, 2, 2, 1, 1, 1, 1, 4},
     8,
     {1, 4, 7, 42},
     4,
     {4, 1, 3, 3},
     4,
     false,
     false,
     false},
    {"conv2d_depthwise_dilated_wide",
     "conv",
     {2, 1, 1, 2, 3, 2, 3, 4},
     8,
     {1, 4, 5, 36},
     4,
     {4, 1, 3, 3},
     4,
     false,
     false,
     false},
    {"conv2d_depthwise_pad_h_only",
     "conv",
     {2, 1, 1, 2, 0, 1, 1, 4},
     8,
     {1, 4, 6, 35},
     4,
     {4, 1, 5, 1},
     4,
     true,
     true,
     false},
    {"conv2d_groups2",
     "conv",
     {2, 2, 2, 1, 1, 1, 1, 2},
     8,
     {1, 4, 7, 7},
     4,
     {6, 2, 3, 3},
     4,
     true,
     false,
     false},
    {"conv2d_size1_spatial",
     "conv",
     {2, 1, 1, 0, 1, 1, 1, 1},
     8,
     {3, 2, 1, 5},
     4,
     {2, 2, 1, 3},
     4,
     true,
     false,
     false},
    {"conv2d_unbatched",
     "conv",
     {2, 1, 1, 1, 1, 1, 1, 1},
     8,
     {3, 5, 4},
     3,
     {2, 3, 3, 3},
     4,
     true,
     false,
     false},
    {"conv2d_noncontig",
     "conv",
     {2, 1, 2, 1, 0, 1, 1, 1},
     8,
     {2, 3, 6, 5},
     4,
     {2, 3, 2, 3},
     4,
     true,
     true,
     false},
    {"conv2d_5x5_one_channel",
     "conv",
     {2, 1, 1, 2, 2, 1, 1, 1},
     8,
     {3, 1, 9, 9},
     4,
     {4, 1, 5, 5},
     4,
     true,
     false,
     false},
    {"conv1d_basic", "conv", {1, 2, 1, 1, 1}, 5, {2, 3, 11}, 3, {4, 3, 3}, 3, true, false, false},
    {"conv1d_dilated_groups",
     "conv",
     {1, 1, 2, 3, 3},
     5,
     {1, 3, 10},
     3,
     {6, 1, 2},
     3,
     false,
     false,
     false},
    {"convt2d_basic",
     "convt",
     {2, 2, 2, 1, 1, 1, 1, 1, 1, 1},
     10,
     {2, 3, 4, 3},
     4,
     {3, 2, 3, 3},
     4,
     true,
     false,
     false},
    {"convt2d_groups_dilation",
     "convt",
     {2, 1, 2, 0, 1, 0, 1, 2, 1, 2},
     10,
     {1, 4, 3, 5},
     4,
     {4, 3, 2, 3},
     4,
     true,
     false,
     false},
    {"convt1d", "convt", {1, 3, 1, 2, 1, 1}, 6, {2, 2, 5}, 3, {2, 3, 4}, 3, true, false, false},
    {"maxpool2d_ceil_dilation",
     "maxpool",
     {2, 3, 3, 2, 2, 1, 1, 2, 1, 1},
     10,
     {2, 2, 9, 8},
     4,
     {0},
     0,
     false,
     false,
     false},
    {"maxpool2d_mixed_strides", /* 2 x 3 phases of a fold */
     "maxpool",
     {2, 3, 2, 2, 3, 1, 0, 1, 1, 0},
     10,
     {2, 2, 9, 11},
     4,
     {0},
     0,
     false,
     false,
     false},
    {"avgpool2d_stride_2x1", /* 2 x 1 phases */
     "avgpool",
     {2, 3, 2, 2, 1, 1, 0, 1, 0},
     9,
     {2, 3, 8, 7},
     4,
     {0},
     0,
     false,
     false,
     false},
    {"avgpool2d_7x7_stride2", /* 49 taps: folded without phases */
     "avgpool",
     {2, 7, 7, 2, 2, 3, 3, 0, 1},
     9,
     {1, 2, 12, 13},
     4,
     {0},
     0,
     false,
     false,
     false},
    {"maxpool2d_ties",
     "maxpool",
     {2, 2, 2, 2, 2, 0, 0, 1, 1, 0},
     10,
     {1, 2, 6, 6},
     4,
     {0},
     0,
     false,
     false,
     true},
    {"maxpool2d_stride1_ties",
     "maxpool",
     {2, 3, 3, 1, 1, 1, 1, 1, 1, 0},
     10,
     {2, 1, 5, 5},
     4,
     {0},
     0,
     false,
     false,
     true},
    {"maxpool2d_odd_floor",
     "maxpool",
     {2, 2, 2, 2, 2, 0, 0, 1, 1, 0},
     10,
     {1, 2, 5, 5},
     4,
     {0},
     0,
     false,
     false,
     false},
    {"maxpool1d", "maxpool", {1, 3, 2, 1, 1, 1}, 6, {2, 3, 10}, 3, {0}, 0, false, false, false},
    {"maxpool2d_unbatched",
     "maxpool",
     {2, 2, 2, 2, 2, 0, 0, 1, 1, 1},
     10,
     {3, 5, 5},
     3,
     {0},
     0,
     false,
     false,
     false},
    {"avgpool2d_ceil_include",
     "avgpool",
     {2, 3, 3, 2, 2, 1, 1, 1, 1},
     9,
     {2, 2, 8, 7},
     4,
     {0},
     0,
     false,
     false,
     false},
    {"avgpool2d_ceil_exclude",
     "avgpool",
     {2, 3, 2, 2, 2, 1, 1, 1, 0},
     9,
     {1, 3, 7, 6},
     4,
     {0},
     0,
     false,
     false,
     false},
    {"avgpool2d_plain",
     "avgpool",
     {2, 2, 2, 2, 2, 0, 0, 0, 1},
     9,
     {2, 2, 6, 6},
     4,
     {0},
     0,
     false,
     false,
     false},
    {"avgpool1d", "avgpool", {1, 4, 3, 2, 1, 0}, 6, {2, 2, 11}, 3, {0}, 0, false, false, false},
    {"adaptive2d", "adaptive", {2, 3, 4}, 3, {2, 2, 7, 5}, 4, {0}, 0, false, false, false},
    {"adaptive1d", "adaptive", {1, 4}, 2, {2, 3, 10}, 3, {0}, 0, false, false, false},
};
#define NUM_CASES (sizeof g_cases / sizeof g_cases[0])

/* ---- values ---- */

static uint64_t g_rng;
static double next_value(bool ties) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    if (ties) return (double)((g_rng >> 33) % 3);
    return (double)((g_rng >> 11) & ((1ull << 53) - 1)) / 9007199254740992.0 * 2.0 - 1.0;
}

static int64_t numel(const int64_t *dims, int rank) {
    int64_t n = 1;
    int i;
    for (i = 0; i < rank; i++)
        n *= dims[i];
    return n;
}

typedef struct inputs {
    double x[4096], w[4096], b[64], r[8192];
    int64_t rd[4];
    int rr;
} inputs;

/* The results of one run, in f64. */
typedef struct results {
    double y[8192], gx[4096], gw[4096], gb[64];
    int64_t ny, nx, nw, nb;
} results;

static void make_inputs(const conv_case *c, inputs *in, uint64_t seed) {
    int64_t i;
    g_rng = seed;
    for (i = 0; i < numel(c->xd, c->xr); i++)
        in->x[i] = next_value(c->ties);
    for (i = 0; c->wr > 0 && i < numel(c->wd, c->wr); i++)
        in->w[i] = next_value(false);
    for (i = 0; i < 64; i++)
        in->b[i] = next_value(false);
}

static tb_tensor *host_tensor(const double *v, const int64_t *dims, int rank, tb_dtype dt,
                              const tb_device *dev) {
    float f[8192];
    tb_shape s;
    int64_t i, n = numel(dims, rank);
    assert_true(n <= 8192);
    assert_int_equal(tb_shape_make(&s, dt, rank, dims), TB_OK);
    if (dt == TB_F64) return tb_tensor_from_host(v, &s, dev);
    for (i = 0; i < n; i++)
        f[i] = (float)v[i];
    return tb_tensor_from_host(f, &s, dev);
}

/* The op of a case on x, w, b (NULL where the case has none). */
static tb_tensor *apply(const conv_case *c, tb_tensor *x, tb_tensor *w, tb_tensor *b) {
    const int64_t *a = &c->ints[1];
    int n = (int)c->ints[0];
    if (strcmp(c->op, "conv") == 0) {
        return n == 1 ? tb_conv1d(x, w, b, a, a + 1, a + 2, a[3])
                      : tb_conv2d(x, w, b, a, a + 2, a + 4, a[6]);
    }
    if (strcmp(c->op, "convt") == 0) {
        return n == 1 ? tb_conv_transpose1d(x, w, b, a, a + 1, a + 2, a + 3, a[4])
                      : tb_conv_transpose2d(x, w, b, a, a + 2, a + 4, a + 6, a[8]);
    }
    if (strcmp(c->op, "maxpool") == 0) {
        return n == 1 ? tb_max_pool1d(x, a, a + 1, a + 2, a + 3, a[4] != 0)
                      : tb_max_pool2d(x, a, a + 2, a + 4, a + 6, a[8] != 0);
    }
    if (strcmp(c->op, "avgpool") == 0) {
        return n == 1 ? tb_avg_pool1d(x, a, a + 1, a + 2, a[3] != 0, a[4] != 0)
                      : tb_avg_pool2d(x, a, a + 2, a + 4, a[6] != 0, a[7] != 0);
    }
    return n == 1 ? tb_adaptive_avg_pool1d(x, a) : tb_adaptive_avg_pool2d(x, a);
}

static size_t numel_of_shape(tb_shape s) {
    return (size_t)numel(s.dims, s.rank);
}

static void to_f64(tb_tensor *t, double *out, int64_t *count) {
    tb_shape s = tb_tensor_shape(t);
    int64_t n = numel(s.dims, s.rank), i;
    float f[8192];
    assert_true(n <= 8192);
    *count = n;
    if (s.dtype == TB_F64) {
        assert_int_equal(tb_tensor_to_host(t, out, (size_t)n * 8), TB_OK);
        return;
    }
    assert_int_equal(tb_tensor_to_host(t, f, (size_t)n * 4), TB_OK);
    for (i = 0; i < n; i++)
        out[i] = f[i];
}

/* Runs a case on a device; r is made from the output's shape the first time (in->rr == 0). */
static void run_case(const conv_case *c, inputs *in, const char *backend, tb_dtype dt,
                     results *res) {
    tb_device dev;
    tb_tensor *x, *w = NULL, *b = NULL, *y, *r, *loss, *prod, *ins[3],
                  *grads[3] = {NULL, NULL, NULL};
    tb_shape ys;
    size_t nin = 0, k;
    assert_int_equal(tb_device_make(backend, 0, &dev), TB_OK);
    if (c->permuted) { /* x as the transpose of a tensor with its last two dims swapped */
        int64_t d[4];
        double t[4096];
        int64_t i, j, outer, h = c->xd[c->xr - 2], wd = c->xd[c->xr - 1];
        tb_tensor *base;
        memcpy(d, c->xd, sizeof d);
        d[c->xr - 2] = wd;
        d[c->xr - 1] = h;
        outer = numel(c->xd, c->xr) / (h * wd);
        for (k = 0; k < (size_t)outer; k++)
            for (i = 0; i < h; i++)
                for (j = 0; j < wd; j++)
                    t[(int64_t)k * h * wd + j * h + i] = in->x[(int64_t)k * h * wd + i * wd + j];
        base = host_tensor(t, d, c->xr, dt, &dev);
        tb_set_requires_grad(base, true);
        x = tb_transpose(base, c->xr - 2, c->xr - 1);
        tb_tensor_release(base);
    } else {
        x = host_tensor(in->x, c->xd, c->xr, dt, &dev);
    }
    assert_non_null(x);
    assert_int_equal(tb_set_requires_grad(x, true), TB_OK);
    ins[nin++] = x;
    if (c->wr > 0) {
        w = host_tensor(in->w, c->wd, c->wr, dt, &dev);
        tb_set_requires_grad(w, true);
        ins[nin++] = w;
    }
    if (c->bias) {
        int64_t ob = strcmp(c->op, "conv") == 0 ? c->wd[0] : c->wd[1] * c->ints[c->ints[0] * 4 + 1];
        b = host_tensor(in->b, &ob, 1, dt, &dev);
        tb_set_requires_grad(b, true);
        ins[nin++] = b;
    }
    y = apply(c, x, w, b);
    if (y == NULL) fail_msg("%s on %s: %s", c->name, backend, tb_last_error());
    ys = tb_tensor_shape(y);
    if (in->rr == 0) {
        int64_t i;
        in->rr = ys.rank;
        memcpy(in->rd, ys.dims, sizeof(int64_t) * (size_t)ys.rank);
        for (i = 0; i < numel(ys.dims, ys.rank); i++)
            in->r[i] = next_value(false);
    }
    r = host_tensor(in->r, in->rd, in->rr, dt, &dev);
    prod = tb_mul(y, r);
    loss = tb_sum(prod, NULL, 0, false);
    tb_tensor_release(prod);
    if (tb_grad(loss, NULL, ins, nin, grads) != TB_OK)
        fail_msg("%s on %s: grad: %s", c->name, backend, tb_last_error());
    to_f64(y, res->y, &res->ny);
    to_f64(grads[0], res->gx, &res->nx);
    res->nw = res->nb = 0;
    if (w != NULL) to_f64(grads[1], res->gw, &res->nw);
    if (b != NULL) to_f64(grads[2], res->gb, &res->nb);
    for (k = 0; k < nin; k++) {
        tb_tensor_release(grads[k]);
        tb_tensor_release(ins[k]);
    }
    tb_tensor_release(loss);
    tb_tensor_release(r);
    tb_tensor_release(y);
}

/* max |a - b| / max(1, max |b|) */
static double rel_err(const double *a, const double *b, int64_t n) {
    double worst = 0, scale = 1;
    int64_t i;
    for (i = 0; i < n; i++)
        if (fabs(b[i]) > scale) scale = fabs(b[i]);
    for (i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]);
        if (e != e || a[i] != a[i]) return INFINITY;
        if (e > worst) worst = e;
    }
    return worst / scale;
}

static void compare(const char *what, const results *got, const results *want, double tol) {
    assert_int_equal(got->ny, want->ny);
    assert_int_equal(got->nx, want->nx);
    assert_int_equal(got->nw, want->nw);
    assert_int_equal(got->nb, want->nb);
    if (rel_err(got->y, want->y, got->ny) > tol) fail_msg("%s: y differs", what);
    if (rel_err(got->gx, want->gx, got->nx) > tol) fail_msg("%s: grad x differs", what);
    if (rel_err(got->gw, want->gw, got->nw) > tol) fail_msg("%s: grad weight differs", what);
    if (rel_err(got->gb, want->gb, got->nb) > tol) fail_msg("%s: grad bias differs", what);
}

/* ---- PyTorch ---- */

static void write_tensor(FILE *f, const char *role, const double *v, const int64_t *dims,
                         int rank) {
    int64_t i;
    fprintf(f, "t %s %d", role, rank);
    for (i = 0; i < rank; i++)
        fprintf(f, " %lld", (long long)dims[i]);
    for (i = 0; i < numel(dims, rank); i++)
        fprintf(f, " %.17g", v[i]);
    fprintf(f, "\n");
}

static bool read_values(FILE *p, const char *tag, double *out, int64_t want) {
    char word[16];
    long long n;
    int64_t i;
    if (fscanf(p, " %15s", word) != 1 || strcmp(word, tag) != 0) return false;
    if (strcmp(tag, "g") == 0 && fscanf(p, " %15s", word) != 1) return false;
    if (fscanf(p, " %lld", &n) != 1 || n != want) return false;
    for (i = 0; i < n; i++)
        if (fscanf(p, " %lf", &out[i]) != 1) return false;
    return true;
}

static void test_against_torch(void **state) {
    static inputs in[NUM_CASES];
    static results ours[NUM_CASES], theirs;
    char path[] = "/tmp/tb_conv_XXXXXX", cmd[256], word[64];
    size_t i;
    int fd, j;
    FILE *f, *p;
    (void)state;
    if (access("/usr/bin/python3", X_OK) != 0) {
        print_message("no /usr/bin/python3: PyTorch comparison skipped\n");
        skip();
    }
    fd = mkstemp(path);
    assert_true(fd >= 0);
    f = fdopen(fd, "w");
    assert_non_null(f);
    for (i = 0; i < NUM_CASES; i++) {
        const conv_case *c = &g_cases[i];
        int64_t ob;
        memset(&in[i], 0, sizeof in[i]);
        make_inputs(c, &in[i], 1000 + i);
        run_case(c, &in[i], "cpu", TB_F64, &ours[i]);
        fprintf(f, "case %s %s", c->name, c->op);
        for (j = 0; j < c->nints; j++)
            fprintf(f, " %lld", (long long)c->ints[j]);
        fprintf(f, "\n");
        write_tensor(f, "x", in[i].x, c->xd, c->xr);
        if (c->wr > 0) write_tensor(f, "w", in[i].w, c->wd, c->wr);
        if (c->bias) {
            ob = strcmp(c->op, "conv") == 0 ? c->wd[0] : c->wd[1] * c->ints[c->ints[0] * 4 + 1];
            write_tensor(f, "b", in[i].b, &ob, 1);
        }
        write_tensor(f, "r", in[i].r, in[i].rd, in[i].rr);
        fprintf(f, "end\n");
    }
    fclose(f);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/conv_torch.py %s 2>&1", path);
    p = popen(cmd, "r");
    assert_non_null(p);
    for (i = 0; i < NUM_CASES; i++) {
        const results *o = &ours[i];
        if (fscanf(p, " %63s", word) != 1) fail_msg("no output from tests/conv_torch.py");
        if (strcmp(word, "torch-unavailable") == 0) {
            pclose(p);
            unlink(path);
            print_message("PyTorch is not available: comparison skipped\n");
            skip();
        }
        if (strcmp(word, "case") != 0 || fscanf(p, " %63s", word) != 1 ||
            strcmp(word, g_cases[i].name) != 0)
            fail_msg("tests/conv_torch.py: unexpected output at case %s", g_cases[i].name);
        theirs.ny = o->ny;
        theirs.nx = o->nx;
        theirs.nw = o->nw;
        theirs.nb = o->nb;
        if (!read_values(p, "y", theirs.y, o->ny) || !read_values(p, "g", theirs.gx, o->nx) ||
            (o->nw > 0 && !read_values(p, "g", theirs.gw, o->nw)) ||
            (o->nb > 0 && !read_values(p, "g", theirs.gb, o->nb)))
            fail_msg("tests/conv_torch.py: bad values for case %s", g_cases[i].name);
        compare(g_cases[i].name, o, &theirs, 1e-12);
    }
    pclose(p);
    unlink(path);
}

/* f32 on a compiled backend against the cpu. */
static void against_cpu(const char *backend) {
    static inputs in;
    static results want, got;
    tb_device dev;
    size_t i;
    if (tb_device_make(backend, 0, &dev) != TB_OK) {
        print_message("no %s device, skipped: %s\n", backend, tb_last_error());
        tb_clear_error();
        skip();
    }
    for (i = 0; i < NUM_CASES; i++) {
        char what[96];
        memset(&in, 0, sizeof in);
        make_inputs(&g_cases[i], &in, 2000 + i);
        run_case(&g_cases[i], &in, "cpu", TB_F32, &want);
        run_case(&g_cases[i], &in, backend, TB_F32, &got);
        snprintf(what, sizeof what, "%s on %s", g_cases[i].name, backend);
        compare(what, &got, &want, 1e-5);
    }
}

static void test_opencl_against_cpu(void **state) {
    (void)state;
    against_cpu("opencl");
}

static void test_native_against_cpu(void **state) {
    (void)state;
    against_cpu("native");
}

/* ---- tb_window and tb_fold directly ---- */

static void test_window_and_fold(void **state) {
    float xs[2 * 7 * 6], out[2 * 2 * 2 * 3 * 2], g[2 * 7 * 6];
    const int64_t k[2] = {3, 2}, st[2] = {2, 3}, di[2] = {2, 1}, sizes[2] = {7, 6};
    tb_shape s = tb_shape_of(TB_F32, 3, 2, 7, 6), ws;
    tb_tensor *x, *w, *f;
    int c, o1, o2, k1, k2, n = 0, i;
    float want[2 * 7 * 6];
    (void)state;
    for (i = 0; i < 84; i++)
        xs[i] = (float)i;
    x = tb_tensor_from_host(xs, &s, NULL);
    w = tb_window(x, 2, k, st, di);
    assert_non_null(w);
    ws = tb_tensor_shape(w);
    assert_int_equal(ws.rank, 5);
    assert_int_equal(ws.dims[1], 2); /* (7 - 5) / 2 + 1 */
    assert_int_equal(ws.dims[2], 2); /* (6 - 2) / 3 + 1 */
    assert_int_equal(tb_tensor_to_host(w, out, sizeof out), TB_OK);
    memset(want, 0, sizeof want);
    for (c = 0; c < 2; c++)
        for (o1 = 0; o1 < 2; o1++)
            for (o2 = 0; o2 < 2; o2++)
                for (k1 = 0; k1 < 3; k1++)
                    for (k2 = 0; k2 < 2; k2++) {
                        int at = c * 42 + (o1 * 2 + k1 * 2) * 6 + o2 * 3 + k2;
                        assert_true(out[n] == xs[at]);
                        want[at] += out[n];
                        n++;
                    }
    f = tb_fold(w, 2, sizes, k, st, di);
    assert_non_null(f);
    assert_int_equal(tb_tensor_to_host(f, g, sizeof g), TB_OK);
    for (i = 0; i < 84; i++)
        assert_true(g[i] == want[i]);
    tb_tensor_release(f);
    tb_tensor_release(w);
    tb_tensor_release(x);
}

/* tb_fold of strided windows with dilation 1 (folded by phases) against loops: 1-, 2- and
   3-D, strides above, equal to and below the kernel, sizes that are no multiple of the stride,
   phases no tap reaches, a stride of 1 on some axes, and 16 phases of 25 taps; on cpu and
   native. g holds distinct integers, so every sum is exact. */
static void phased_fold_case(const char *backend, int n, const int64_t *sizes, const int64_t *k,
                             const int64_t *st) {
    int64_t o[3] = {1, 1, 1}, dims[1 + 6], total = 2, out_total = 2, e, p[3], q[3], j[3];
    const int64_t di[3] = {1, 1, 1};
    float *gv, *want, *got;
    tb_device dev;
    tb_shape gs;
    tb_tensor *g, *f;
    int i;
    if (tb_device_make(backend, 0, &dev) != TB_OK) {
        tb_clear_error();
        return;
    }
    dims[0] = 2;
    for (i = 0; i < n; i++) {
        o[i] = (sizes[i] - k[i]) / st[i] + 1;
        dims[1 + i] = o[i];
        dims[1 + n + i] = k[i];
        total *= o[i] * k[i];
        out_total *= sizes[i];
    }
    gv = (float *)malloc((size_t)total * sizeof(float));
    want = (float *)calloc((size_t)out_total, sizeof(float));
    got = (float *)malloc((size_t)out_total * sizeof(float));
    assert_non_null(gv);
    assert_non_null(want);
    assert_non_null(got);
    for (e = 0; e < total; e++) { /* g[b, o.., k..] adds to out[b, o * st + k] */
        int64_t rest = e, at = 0;
        gv[e] = (float)(e % 251 + 1);
        for (i = n - 1; i >= 0; i--) {
            j[i] = rest % k[i];
            rest /= k[i];
        }
        for (i = n - 1; i >= 0; i--) {
            q[i] = rest % o[i];
            rest /= o[i];
        }
        for (i = 0; i < n; i++) {
            p[i] = q[i] * st[i] + j[i];
            at = at * sizes[i] + p[i];
        }
        want[rest * (out_total / 2) + at] += gv[e];
    }
    assert_int_equal(tb_shape_make(&gs, TB_F32, 1 + 2 * n, dims), TB_OK);
    g = tb_tensor_from_host(gv, &gs, &dev);
    assert_non_null(g);
    f = tb_fold(g, (size_t)n, sizes, k, st, di);
    if (f == NULL) fail_msg("tb_fold %d-D on %s: %s", n, backend, tb_last_error());
    assert_int_equal(tb_tensor_to_host(f, got, (size_t)out_total * sizeof(float)), TB_OK);
    for (e = 0; e < out_total; e++)
        if (got[e] != want[e])
            fail_msg("tb_fold %d-D on %s: [%lld] %g, want %g", n, backend, (long long)e,
                     (double)got[e], (double)want[e]);
    tb_tensor_release(f);
    tb_tensor_release(g);
    free(gv);
    free(want);
    free(got);
}

static void test_phased_fold(void **state) {
    static const struct {
        int n;
        int64_t sizes[3], k[3], st[3];
    } cases[] = {
        {1, {11}, {3}, {2}},                  /* ResNet's pool along one axis */
        {1, {10}, {2}, {3}},                  /* stride above the kernel: a phase without taps */
        {2, {7, 6}, {3, 2}, {2, 3}},          /* 6 phases, sizes past the last window */
        {2, {13, 9}, {5, 5}, {4, 4}},         /* 16 phases, 25 taps */
        {3, {5, 6, 5}, {2, 3, 1}, {2, 1, 2}}, /* a stride of 1 on one axis, 1 x 1 on another */
    };
    const char *backends[2] = {"cpu", "native"};
    size_t c;
    int b;
    (void)state;
    for (c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (b = 0; b < 2; b++)
            phased_fold_case(backends[b], cases[c].n, cases[c].sizes, cases[c].k, cases[c].st);
}

/* The diagonal form of WINDOW (what tb_fold reads through): values and its gradient by
   loops, on every backend, 1-D and 2-D, with strides and dilations. */
static void diagonal_case(const char *backend, int n, const int64_t *len, const int64_t *out,
                          const int64_t *k, const int64_t *st, const int64_t *di) {
    double x[2 * 9 * 9 * 3 * 3], r[2 * 9 * 9 * 3 * 3], y[2 * 9 * 9 * 3 * 3], gx[2 * 9 * 9 * 3 * 3];
    double want_gx[2 * 9 * 9 * 3 * 3];
    int64_t xd[5], yd[5], attrs[10], nx, ny, i, q;
    int rank = 1 + 2 * n, j;
    tb_device dev;
    tb_tensor *tx, *ty, *tr, *prod, *loss, *g = NULL;
    tb_shape s;
    assert_int_equal(tb_device_make(backend, 0, &dev), TB_OK);
    xd[0] = yd[0] = 2;
    attrs[0] = n;
    for (j = 0; j < n; j++) {
        xd[1 + j] = len[j];
        yd[1 + j] = out[j];
        xd[1 + n + j] = yd[1 + n + j] = k[j];
        attrs[1 + 4 * j] = out[j];
        attrs[2 + 4 * j] = k[j];
        attrs[3 + 4 * j] = st[j];
        attrs[4 + 4 * j] = di[j];
    }
    attrs[1 + 4 * n] = 1;
    nx = numel(xd, rank);
    ny = numel(yd, rank);
    g_rng = 77;
    for (i = 0; i < nx; i++)
        x[i] = next_value(false);
    for (i = 0; i < ny; i++)
        r[i] = next_value(false);
    assert_int_equal(tb_shape_make(&s, TB_F64, rank, xd), TB_OK);
    tx = tb_tensor_from_host(x, &s, &dev);
    assert_int_equal(tb_set_requires_grad(tx, true), TB_OK);
    ty = tb_call_op(TB_OP_WINDOW, &tx, 1, attrs, 2 + 4 * (size_t)n);
    if (ty == NULL) fail_msg("%s: %s", backend, tb_last_error());
    assert_int_equal(tb_shape_make(&s, TB_F64, rank, yd), TB_OK);
    tr = tb_tensor_from_host(r, &s, &dev);
    prod = tb_mul(ty, tr);
    loss = tb_sum(prod, NULL, 0, false);
    assert_int_equal(tb_grad(loss, NULL, &tx, 1, &g), TB_OK);
    assert_int_equal(tb_tensor_to_host(ty, y, (size_t)ny * 8), TB_OK);
    assert_int_equal(tb_tensor_to_host(g, gx, (size_t)nx * 8), TB_OK);
    memset(want_gx, 0, sizeof want_gx);
    for (q = 0; q < ny; q++) { /* q -> [b, o.., k..] */
        int64_t rem = q, idx[5], src = 0;
        for (j = rank - 1; j >= 0; j--) {
            idx[j] = rem % yd[j];
            rem /= yd[j];
        }
        for (j = 0; j < rank; j++) {
            int64_t at = idx[j];
            if (j >= 1 && j <= n) at = idx[j] * st[j - 1] + idx[j + n] * di[j - 1];
            src = src * xd[j] + at;
        }
        if (y[q] != x[src]) fail_msg("%s: diagonal window element %lld", backend, (long long)q);
        want_gx[src] += r[q];
    }
    for (i = 0; i < nx; i++)
        if (fabs(gx[i] - want_gx[i]) > 1e-12)
            fail_msg("%s: diagonal window gradient element %lld: %g, expected %g", backend,
                     (long long)i, gx[i], want_gx[i]);
    tb_tensor_release(g);
    tb_tensor_release(loss);
    tb_tensor_release(prod);
    tb_tensor_release(tr);
    tb_tensor_release(ty);
    tb_tensor_release(tx);
}

static void test_diagonal_window(void **state) {
    const char *backends[3] = {"cpu", "opencl", "native"};
    const int64_t len2[2] = {9, 8}, out2[2] = {3, 4}, k2[2] = {3, 2}, st2[2] = {2, 1},
                  di2[2] = {2, 3};
    const int64_t len1[1] = {7}, out1[1] = {5}, k1[1] = {3}, st1[1] = {1}, di1[1] = {1};
    int b;
    (void)state;
    for (b = 0; b < 3; b++) {
        tb_device dev;
        if (tb_device_make(backends[b], 0, &dev) != TB_OK) {
            tb_clear_error();
            continue;
        }
        diagonal_case(backends[b], 2, len2, out2, k2, st2, di2);
        diagonal_case(backends[b], 1, len1, out1, k1, st1, di1);
    }
}

/* A stride-1 2-D convolution with nothing to differentiate runs over whole padded rows
   (tb__conv_rows: one matmul over the flattened rows, whose stores leave the padding columns
   out);
   with x requiring a gradient it takes the windows of the general form. Both agree on every
   backend, in f32 and (cpu) f64, for padding, dilation, an asymmetric kernel, no padding, a
   bias and an unbatched input; the IR shows which form each took. */
typedef struct rows_case {
    int32_t rank;
    int64_t x[4], w[4], pad[2], dil[2];
    bool bias;
    int64_t stride; /* 0: 1 */
    bool windows;   /* without a gradient too, the windows' form (no slice) */
} rows_case;

static tb_tensor *rows_conv(tb_tensor *x, tb_tensor *w, tb_tensor *b, const rows_case *c) {
    int64_t stride[2] = {c->stride > 0 ? c->stride : 1, c->stride > 0 ? c->stride : 1};
    return tb_conv2d(x, w, b, stride, c->pad, c->dil, 1);
}

static void rows_compare(const char *what, tb_tensor *got, tb_tensor *want, double tol) {
    size_t n = numel_of_shape(tb_tensor_shape(want)), i;
    double *g = malloc(n * sizeof *g), *w = malloc(n * sizeof *w), scale = 1e-30, worst = 0;
    tb_tensor *g64 = tb_cast(got, TB_F64), *w64 = tb_cast(want, TB_F64);
    assert_non_null(g);
    assert_non_null(w);
    assert_int_equal(tb_tensor_to_host(g64, g, n * sizeof *g), TB_OK);
    assert_int_equal(tb_tensor_to_host(w64, w, n * sizeof *w), TB_OK);
    for (i = 0; i < n; i++)
        if (fabs(w[i]) > scale) scale = fabs(w[i]);
    for (i = 0; i < n; i++)
        if (fabs(g[i] - w[i]) > worst) worst = fabs(g[i] - w[i]);
    if (worst > tol * scale) fail_msg("%s: off by %g (scale %g)", what, worst, scale);
    tb_tensor_release(g64);
    tb_tensor_release(w64);
    free(g);
    free(w);
}

/* h cast to dt on dev; h released. */
static tb_tensor *rows_on(tb_tensor *h, tb_dtype dt, const tb_device *dev) {
    tb_tensor *c = tb_cast(h, dt), *d = tb_to_device(c, dev);
    assert_non_null(d);
    tb_tensor_release(c);
    tb_tensor_release(h);
    return d;
}

static void rows_case_run(const rows_case *c, const char *backend, tb_dtype dt) {
    tb_device dev;
    tb_shape xs = {dt, c->rank, {0}}, ws = {dt, 4, {0}}, bs = {dt, 1, {0}};
    size_t nx = 1, nw = 1, i;
    double *xv, *wv, bv[64];
    tb_tensor *x, *w, *b = NULL, *xg, *rows, *win;
    char what[128], *ir;
    if (tb_device_make(backend, 0, &dev) != TB_OK) {
        tb_clear_error();
        return;
    }
    for (i = 0; i < (size_t)c->rank; i++)
        nx *= (size_t)(xs.dims[i] = c->x[i]);
    for (i = 0; i < 4; i++)
        nw *= (size_t)(ws.dims[i] = c->w[i]);
    bs.dims[0] = c->w[0];
    xv = malloc(nx * sizeof *xv);
    wv = malloc(nw * sizeof *wv);
    assert_non_null(xv);
    assert_non_null(wv);
    for (i = 0; i < nx; i++)
        xv[i] = next_value(false);
    for (i = 0; i < nw; i++)
        wv[i] = next_value(false);
    assert_true(c->w[0] <= (int64_t)(sizeof bv / sizeof bv[0]));
    for (i = 0; i < (size_t)c->w[0]; i++)
        bv[i] = next_value(false);
    {
        tb_shape x64 = xs, w64 = ws, b64 = bs;
        tb_tensor *hx, *hw, *hb;
        x64.dtype = w64.dtype = b64.dtype = TB_F64;
        hx = tb_tensor_from_host(xv, &x64, NULL);
        hw = tb_tensor_from_host(wv, &w64, NULL);
        hb = c->bias ? tb_tensor_from_host(bv, &b64, NULL) : NULL;
        x = rows_on(hx, dt, &dev);
        w = rows_on(hw, dt, &dev);
        if (c->bias) b = rows_on(hb, dt, &dev);
    }
    xg = tb_detach(x);
    assert_int_equal(tb_set_requires_grad(xg, true), TB_OK);
    rows = rows_conv(x, w, b, c);
    win = rows_conv(xg, w, b, c);
    snprintf(what, sizeof what, "conv x[%lld,..,%lld] w[%lld,%lld,%lld,%lld] on %s %s",
             (long long)c->x[0], (long long)c->x[c->rank - 1], (long long)c->w[0],
             (long long)c->w[1], (long long)c->w[2], (long long)c->w[3], backend,
             tb_dtype_name(dt));
    if (rows == NULL || win == NULL) fail_msg("%s: %s", what, tb_last_error());
    ir = tb_ir_text(&rows, 1);
    assert_non_null(ir);
    if ((strstr(ir, "slice") == NULL) != c->windows)
        fail_msg("%s: %s over whole rows:\n%s", what, c->windows ? "" : "not", ir);
    tb_free(ir);
    ir = tb_ir_text(&win, 1);
    assert_non_null(ir);
    if (strstr(ir, "slice") != NULL) fail_msg("%s: the windows' form has a slice:\n%s", what, ir);
    tb_free(ir);
    if (strcmp(backend, "cpu") != 0 && !c->windows) {
        /* the matmul is the last kernel: its stores leave the padding columns out (and add the
           bias), no kernel after it reads its output again */
        char *text = tb_ir_backend_text(&rows, 1), *mm, *e;
        assert_non_null(text);
        mm = strstr(text, "void MM_");
        for (e = mm; e != NULL && strstr(e + 1, "void MM_") != NULL;)
            e = mm = strstr(e + 1, "void MM_");
        if (mm == NULL || strstr(mm, "void E_") != NULL)
            fail_msg("%s: a kernel after the matmul:\n%s", what, text);
        tb_free(text);
    }
    if (strcmp(backend, "cpu") != 0 && c->w[0] >= 32 && !c->windows) {
        /* the packed matmul on a CPU device reads B's rows in place: A's panels, none of B,
           each step of the depth at its row's offset in a table (tb_krow), not at the window's
           digits divided out of it */
        tb_device_info info;
        char *text = tb_ir_backend_text(&rows, 1);
        assert_non_null(text);
        assert_int_equal(tb_backend_device_info(&dev, &info), TB_OK);
        if (info.device.type == TB_DEVICE_CPU &&
            (strstr(text, "void PA_") == NULL || strstr(text, "void PB_") != NULL))
            fail_msg("%s: the matmul packs B, or is not packed:\n%s", what, text);
        if (info.device.type == TB_DEVICE_CPU && strstr(text, "+ tb_krow[i") == NULL)
            fail_msg("%s: B's rows not read at a table's offsets:\n%s", what, text);
        if (c->stride <= 1 && c->rank == 4) {
            /* a row of W values and its right padding, which the next row's left padding
               shares: W + pad columns a row, not W + 2 pad */
            int64_t oh = c->x[2] + 2 * c->pad[0] - c->dil[0] * (c->w[2] - 1);
            char name[64];
            snprintf(name, sizeof name, "MM_%lld_%lld_", (long long)c->w[0],
                     (long long)(oh * (c->x[3] + c->pad[1])));
            if (strstr(text, name) == NULL)
                fail_msg("%s: no matmul %s..., rows of W + pad columns:\n%s", what, name, text);
        }
        tb_free(text);
    }
    rows_compare(what, rows, win, dt == TB_F64 ? 1e-12 : 2e-6);
    tb_tensor_release(rows);
    tb_tensor_release(win);
    tb_tensor_release(xg);
    tb_tensor_release(x);
    tb_tensor_release(w);
    tb_tensor_release(b);
    free(xv);
    free(wv);
}

static void test_conv_rows(void **state) {
    /* strided ones run over the input's phases (tb__conv_phases), then over whole rows where
       those fit: ResNet's 7 x 7 at stride 2, a 4 x 4 at stride 2, AlexNet's 11 x 11 at stride
       4; a 2 x 2 at stride 2 (a 1 x 1 over the phases), and a 4 x 4 at stride 2 whose last
       input row no window reaches, which keeps the strided windows */
    static const rows_case cases[] = {
        {4, {1, 3, 56, 56}, {4, 3, 7, 7}, {3, 3}, {1, 1}, true, 2, false},
        {4, {2, 4, 40, 42}, {5, 4, 4, 4}, {1, 1}, {1, 1}, false, 2, false},
        {4, {1, 3, 67, 67}, {6, 3, 11, 11}, {2, 2}, {1, 1}, true, 4, false},
        {4, {2, 3, 16, 18}, {7, 3, 2, 2}, {0, 0}, {1, 1}, false, 2, true},
        {4, {1, 2, 9, 24}, {3, 2, 4, 4}, {0, 0}, {1, 1}, false, 2, true},
        {4, {2, 16, 56, 56}, {32, 16, 7, 7}, {3, 3}, {1, 1}, true, 2, false}, /* packed */
        /* padding, bias; dilation; a 3 x 5 kernel; no padding */
        {4, {2, 3, 10, 20}, {5, 3, 3, 3}, {1, 1}, {1, 1}, true, 1, false},
        {4, {1, 2, 12, 40}, {4, 2, 3, 3}, {2, 2}, {2, 2}, false, 1, false},
        {4, {2, 2, 7, 48}, {3, 2, 3, 5}, {1, 2}, {1, 1}, true, 1, false},
        {4, {2, 2, 8, 24}, {3, 2, 3, 3}, {0, 0}, {1, 1}, false, 1, false},
        /* unbatched, an even kernel */
        {3, {3, 9, 33, 0}, {2, 3, 2, 2}, {1, 0}, {1, 1}, true, 1, false},
        /* a packed matmul, B in place (a partial last panel) */
        {4, {2, 16, 20, 40}, {32, 16, 3, 3}, {1, 1}, {1, 1}, true, 1, false},
        /* the same with N = 15 x 17 = 255 (rows of 16 and the zero column they share): the
           last panel's second vector cut (AVX-512 13 x 32, AVX2 4 x 24 in the native
           backend's C, SSE and NEON x 8), a third past N (AVX2) */
        {4, {1, 64, 15, 16}, {64, 64, 3, 3}, {1, 1}, {1, 1}, true, 1, false},
        /* a row kernel, H_out 1; unequal dilations */
        {4, {1, 3, 1, 48}, {4, 3, 1, 3}, {0, 1}, {1, 1}, false, 1, false},
        {4, {1, 2, 9, 64}, {3, 2, 3, 3}, {2, 1}, {2, 1}, false, 1, false},
    };
    const char *backends[3] = {"cpu", "opencl", "native"};
    size_t i;
    int b;
    (void)state;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (b = 0; b < 3; b++)
            rows_case_run(&cases[i], backends[b], TB_F32);
        rows_case_run(&cases[i], "cpu", TB_F64);
        if (cases[i].w[0] >= 32) /* the packed one: B read in place in f64 too */
            rows_case_run(&cases[i], "native", TB_F64);
    }
}

/* The gradient of a stride-1 convolution's input is a convolution of the output's gradient by
   the flipped, transposed weight (no fold of A^T g), over whole rows where they add at most a
   third (5 x 5 over 14 x 14: 18 columns a row), on every backend, against loops in double;
   a dilated one and a conv1d take the same rule, a strided one keeps A^T g folded back. */
typedef struct input_grad_case {
    int rank;           /* 3: conv1d, 4: conv2d */
    int64_t x[4], w[4]; /* x [N, C, H, W] (W alone for rank 3), w [O, C, KH, KW] */
    int64_t pad, dil, stride;
    bool fold; /* A^T g folded back (no convolution by the flipped weight) */
} input_grad_case;

static void input_grad_run(const input_grad_case *t, const char *backend) {
    int64_t n = t->x[0], ch = t->x[1], h = t->rank == 4 ? t->x[2] : 1, wd = t->x[t->rank - 1];
    int64_t oc = t->w[0], kh = t->rank == 4 ? t->w[2] : 1, kw = t->w[t->rank - 1];
    int64_t ph = t->rank == 4 ? t->pad : 0, pads[2] = {t->pad, t->pad}, dils[2] = {t->dil, t->dil};
    int64_t strides[2] = {t->stride, t->stride};
    int64_t oh =
        (h + 2 * ph - (t->rank == 4 ? t->dil * (kh - 1) : 0) - 1) / (t->rank == 4 ? t->stride : 1) +
        1;
    int64_t ow = (wd + 2 * t->pad - t->dil * (kw - 1) - 1) / t->stride + 1;
    size_t nx = (size_t)(n * ch * h * wd), nw = (size_t)(oc * ch * kh * kw),
           ny = (size_t)(n * oc * oh * ow);
    double *xv = calloc(nx, sizeof(double)), *wv = calloc(nw, sizeof(double));
    double *cv = calloc(ny, sizeof(double)), *want = calloc(nx, sizeof(double)),
           *got = calloc(nx, sizeof(double));
    int64_t xd[4], wdims[4], cd[4], b, o, c, i, j, a, e;
    tb_device dev;
    tb_tensor *x, *w, *cc, *y, *yc, *loss, *gx = NULL;
    tb_shape xs, ws, cs;
    char *ir;
    size_t k;
    assert_non_null(xv);
    assert_non_null(wv);
    assert_non_null(cv);
    assert_non_null(want);
    assert_non_null(got);
    if (tb_device_make(backend, 0, &dev) != TB_OK) {
        tb_clear_error();
        goto out;
    }
    for (k = 0; k < nx; k++)
        xv[k] = 0.01 * (double)(k % 17) - 0.08;
    for (k = 0; k < nw; k++)
        wv[k] = 0.02 * (double)(k % 13) - 0.11;
    for (k = 0; k < ny; k++)
        cv[k] = 0.03 * (double)(k % 11) - 0.14;
    for (b = 0; b < n; b++)
        for (o = 0; o < oc; o++)
            for (i = 0; i < oh; i++)
                for (j = 0; j < ow; j++)
                    for (c = 0; c < ch; c++)
                        for (a = 0; a < kh; a++)
                            for (e = 0; e < kw; e++) {
                                int64_t yi = i * (t->rank == 4 ? t->stride : 1) + a * t->dil - ph;
                                int64_t xj = j * t->stride + e * t->dil - t->pad;
                                if (yi < 0 || yi >= h || xj < 0 || xj >= wd) continue;
                                want[((b * ch + c) * h + yi) * wd + xj] +=
                                    cv[((b * oc + o) * oh + i) * ow + j] *
                                    wv[((o * ch + c) * kh + a) * kw + e];
                            }
    xd[0] = n, xd[1] = ch, xd[2] = t->rank == 4 ? h : wd, xd[3] = wd;
    wdims[0] = oc, wdims[1] = ch, wdims[2] = t->rank == 4 ? kh : kw, wdims[3] = kw;
    cd[0] = n, cd[1] = oc, cd[2] = t->rank == 4 ? oh : ow, cd[3] = ow;
    xs.dtype = ws.dtype = cs.dtype = TB_F64;
    xs.rank = ws.rank = cs.rank = t->rank;
    memcpy(xs.dims, xd, sizeof xd);
    memcpy(ws.dims, wdims, sizeof wdims);
    memcpy(cs.dims, cd, sizeof cd);
    x = tb_tensor_from_host(xv, &xs, &dev);
    w = tb_tensor_from_host(wv, &ws, &dev);
    cc = tb_tensor_from_host(cv, &cs, &dev);
    assert_non_null(x);
    assert_non_null(w);
    assert_non_null(cc);
    assert_int_equal(tb_set_requires_grad(x, true), TB_OK);
    assert_int_equal(tb_set_requires_grad(w, true), TB_OK);
    y = t->rank == 4 ? tb_conv2d(x, w, NULL, strides, pads, dils, 1)
                     : tb_conv1d(x, w, NULL, strides, pads, dils, 1);
    yc = tb_mul(y, cc);
    loss = tb_sum(yc, NULL, 0, false);
    if (loss == NULL) fail_msg("input grad on %s: %s", backend, tb_last_error());
    assert_int_equal(tb_grad(loss, NULL, &x, 1, &gx), TB_OK);
    ir = tb_ir_text(&gx, 1);
    assert_non_null(ir);
    /* a strided convolution's fold interleaves its phases (a concat); the others are a
       convolution by the flipped weight, with no fold (its sum) at all */
    if (t->fold ? strstr(ir, "= concat(") == NULL
                : strstr(ir, "= concat(") != NULL || strstr(ir, "= sum(") != NULL)
        fail_msg("input grad on %s: %s:\n%s", backend,
                 t->fold ? "no phases interleaved" : "a fold, not a convolution", ir);
    tb_free(ir);
    assert_int_equal(tb_tensor_to_host(gx, got, nx * sizeof(double)), TB_OK);
    for (k = 0; k < nx; k++)
        if (fabs(got[k] - want[k]) > 1e-12)
            fail_msg("input grad on %s: [%zu] %.15g, want %.15g", backend, k, got[k], want[k]);
    tb_tensor_release(gx);
    tb_tensor_release(loss);
    tb_tensor_release(yc);
    tb_tensor_release(y);
    tb_tensor_release(cc);
    tb_tensor_release(w);
    tb_tensor_release(x);
out:
    free(xv);
    free(wv);
    free(cv);
    free(want);
    free(got);
}

static void test_input_grad_conv(void **state) {
    static const input_grad_case cases[] = {
        {4, {2, 3, 14, 14}, {4, 3, 5, 5}, 2, 1, 1, false}, /* the CNN's: whole rows */
        {4, {1, 2, 9, 11}, {3, 2, 3, 3}, 2, 2, 1, false},  /* dilated */
        {3, {2, 3, 20, 0}, {4, 3, 3, 0}, 1, 1, 1, false},  /* conv1d */
        {4, {1, 2, 9, 9}, {3, 2, 3, 3}, 1, 1, 2, true},    /* strided: the fold */
    };
    const char *backends[3] = {"cpu", "native", "opencl"};
    size_t i;
    int b;
    (void)state;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (b = 0; b < 3; b++)
            input_grad_run(&cases[i], backends[b]);
}

/* The values of f32 y on `dev`'s copy of x against the cpu's: equal bit for bit, NaN where
   the cpu has NaN. */
static void extremes_case(const char *what, const char *backend, tb_tensor *ycpu, tb_tensor *ydev) {
    double want[64], got[64];
    tb_tensor *w64 = tb_cast(ycpu, TB_F64), *g64 = tb_cast(ydev, TB_F64);
    size_t n, i;
    if (ycpu == NULL || ydev == NULL || w64 == NULL || g64 == NULL)
        fail_msg("%s on %s: %s", what, backend, tb_last_error());
    n = numel_of_shape(tb_tensor_shape(ycpu));
    assert_true(n <= 64);
    assert_int_equal(tb_tensor_to_host(w64, want, n * 8), TB_OK);
    assert_int_equal(tb_tensor_to_host(g64, got, n * 8), TB_OK);
    for (i = 0; i < n; i++) /* the same bits (-0 is not +0), or NaN where the cpu has NaN */
        if (isnan(want[i]) ? !isnan(got[i]) : memcmp(&got[i], &want[i], sizeof got[i]) != 0)
            fail_msg("%s on %s: [%zu] is %g (sign %d), the cpu says %g (sign %d)", what, backend, i,
                     got[i], signbit(got[i]) != 0, want[i], signbit(want[i]) != 0);
    tb_tensor_release(w64);
    tb_tensor_release(g64);
    tb_tensor_release(ycpu);
    tb_tensor_release(ydev);
}

/* 2 * max (or min) over x's last axis. */
static tb_tensor *twice_extreme(tb_tensor *x, bool is_max) {
    const int32_t last[1] = {2};
    tb_tensor *m = is_max ? tb_max(x, last, 1, false) : tb_min(x, last, 1, false);
    tb_tensor *y = tb_mul_scalar(m, 2.0);
    tb_tensor_release(m);
    return y;
}

/* NaN, infinities and signed zeros through a max pool and through small max and min
   reductions (both computed where they are read, with no branch on the data), in f32 and f64:
   a window with a NaN anywhere in it gives NaN, first, middle or last, one NaN or two; +inf
   and -inf are ordinary values; of equal values the first wins (+0 before -0 and -0 before
   +0 keep their order); on every backend against the cpu, bit for bit. */
static void test_extremes_keep_nan(void **state) {
    const char *backends[2] = {"opencl", "native"};
    const tb_dtype dts[2] = {TB_F32, TB_F64};
    const int64_t k3[2] = {3, 3}, k2[2] = {2, 2}, pad[2] = {1, 1};
    const tb_shape xs = {TB_F32, 4, {1, 2, 6, 6}}, rs = {TB_F32, 3, {4, 4, 3}};
    float xv[72], rv[48];
    int b, d, i;
    (void)state;
    for (i = 0; i < 72; i++)
        xv[i] = (float)next_value(false);
    xv[0] = NAN;       /* a corner: the first of its windows */
    xv[14] = NAN;      /* inside */
    xv[35] = NAN;      /* the last of the first plane */
    xv[40] = INFINITY; /* the second plane: infinities and signed zeros, no NaN */
    xv[50] = -INFINITY;
    for (i = 54; i < 72; i++) /* its last three rows: zeros of both signs */
        xv[i] = (i * 7) % 3 == 0 ? -0.0f : (i % 2 ? 0.0f : -0.0f);
    for (i = 0; i < 48; i++)
        rv[i] = (float)next_value(false);
    rv[0] = NAN; /* row 0: first */
    rv[4] = NAN; /* row 1: middle */
    rv[8] = NAN; /* row 2: last */
    rv[9] = -INFINITY, rv[10] = INFINITY;
    rv[12] = NAN, rv[14] = -NAN;                /* row 4: two NaNs */
    rv[15] = 0.0f, rv[16] = -0.0f, rv[17] = -1; /* row 5: +0 then -0 */
    rv[18] = -0.0f, rv[19] = 0.0f, rv[20] = -1; /* row 6: -0 then +0 */
    rv[21] = 1, rv[22] = 0.0f, rv[23] = -0.0f;  /* row 7: the zeros last */
    for (b = 0; b < 2; b++) {
        tb_device dev;
        if (tb_device_make(backends[b], 0, &dev) != TB_OK) {
            tb_clear_error();
            continue;
        }
        for (d = 0; d < 2; d++) {
            tb_tensor *x32 = tb_tensor_from_host(xv, &xs, NULL);
            tb_tensor *r32 = tb_tensor_from_host(rv, &rs, NULL);
            tb_tensor *x = tb_cast(x32, dts[d]), *r = tb_cast(r32, dts[d]);
            tb_tensor *xd = tb_to_device(x, &dev), *rd = tb_to_device(r, &dev);
            char what[64];
            snprintf(what, sizeof what, "max_pool2d k3 s2 p1, %s", tb_dtype_name(dts[d]));
            extremes_case(what, backends[b], tb_max_pool2d(x, k3, k2, pad, NULL, false),
                          tb_max_pool2d(xd, k3, k2, pad, NULL, false));
            snprintf(what, sizeof what, "max_pool2d k2 s1, %s", tb_dtype_name(dts[d]));
            extremes_case(what, backends[b], tb_max_pool2d(x, k2, NULL, NULL, NULL, false),
                          tb_max_pool2d(xd, k2, NULL, NULL, NULL, false));
            /* a reduction of 3 read by a multiply: unrolled inside the multiply's kernel */
            snprintf(what, sizeof what, "max of 3, times 2, %s", tb_dtype_name(dts[d]));
            extremes_case(what, backends[b], twice_extreme(r, true), twice_extreme(rd, true));
            snprintf(what, sizeof what, "min of 3, times 2, %s", tb_dtype_name(dts[d]));
            extremes_case(what, backends[b], twice_extreme(r, false), twice_extreme(rd, false));
            tb_tensor_release(rd);
            tb_tensor_release(xd);
            tb_tensor_release(r);
            tb_tensor_release(x);
            tb_tensor_release(r32);
            tb_tensor_release(x32);
        }
    }
}

/* 16-bit inputs: each op in f16 and bf16 against the same op in f32 on the cpu (inputs
   rounded to 16 bits first), on every backend, within the 16-bit rounding of the result. */
static void test_half_precision(void **state) {
    const char *backends[3] = {"cpu", "opencl", "native"};
    const tb_dtype dts[2] = {TB_F16, TB_BF16};
    float xv[2 * 2 * 6 * 5], wv[3 * 2 * 3 * 3], want[512], got[512];
    const int64_t pad[2] = {1, 1}, k2[2] = {2, 2}, k3[2] = {3, 3}, out2[2] = {2, 3};
    tb_shape xs = tb_shape_of(TB_F32, 4, 2, 2, 6, 5), ws = tb_shape_of(TB_F32, 4, 3, 2, 3, 3);
    int b, d, op, i;
    (void)state;
    g_rng = 5;
    for (i = 0; i < 120; i++)
        xv[i] = (float)next_value(false);
    for (i = 0; i < 54; i++)
        wv[i] = (float)next_value(false);
    for (b = 0; b < 3; b++) {
        tb_device dev;
        if (tb_device_make(backends[b], 0, &dev) != TB_OK) {
            tb_clear_error();
            continue;
        }
        for (d = 0; d < 2; d++) {
            for (op = 0; op < 4; op++) {
                tb_tensor *x32 = tb_tensor_from_host(xv, &xs, NULL);
                tb_tensor *w32 = tb_tensor_from_host(wv, &ws, NULL);
                /* the f32 reference sees the inputs already rounded to 16 bits */
                tb_tensor *xr = tb_cast(x32, dts[d]), *wr = tb_cast(w32, dts[d]);
                tb_tensor *x16 = tb_to_device(xr, &dev), *w16 = tb_to_device(wr, &dev);
                tb_tensor *xf = tb_cast(xr, TB_F32), *wf = tb_cast(wr, TB_F32);
                tb_tensor *y16, *yf, *y32;
                size_t n;
                double scale = 1, worst = 0;
                if (op == 0) {
                    y16 = tb_conv2d(x16, w16, NULL, NULL, pad, NULL, 1);
                    yf = tb_conv2d(xf, wf, NULL, NULL, pad, NULL, 1);
                } else if (op == 1) {
                    y16 = tb_max_pool2d(x16, k3, k2, pad, NULL, true);
                    yf = tb_max_pool2d(xf, k3, k2, pad, NULL, true);
                } else if (op == 2) {
                    y16 = tb_avg_pool2d(x16, k3, k2, pad, true, false);
                    yf = tb_avg_pool2d(xf, k3, k2, pad, true, false);
                } else {
                    y16 = tb_adaptive_avg_pool2d(x16, out2);
                    yf = tb_adaptive_avg_pool2d(xf, out2);
                }
                if (y16 == NULL || yf == NULL)
                    fail_msg("%s %s op %d: %s", backends[b], tb_dtype_name(dts[d]), op,
                             tb_last_error());
                assert_int_equal(tb_tensor_shape(y16).dtype, dts[d]);
                y32 = tb_cast(y16, TB_F32);
                n = numel_of_shape(tb_tensor_shape(yf));
                assert_true(n <= 512);
                assert_int_equal(tb_tensor_to_host(yf, want, n * 4), TB_OK);
                assert_int_equal(tb_tensor_to_host(y32, got, n * 4), TB_OK);
                for (i = 0; i < (int)n; i++)
                    if (fabs(want[i]) > scale) scale = fabs(want[i]);
                for (i = 0; i < (int)n; i++)
                    if (fabs(got[i] - want[i]) > worst) worst = fabs(got[i] - want[i]);
                /* one rounding of the result (bf16: 2^-8 relative) plus the sums' own */
                if (worst > scale * (dts[d] == TB_BF16 ? 1.6e-2 : 2e-3))
                    fail_msg("%s %s op %d: off by %g (scale %g)", backends[b],
                             tb_dtype_name(dts[d]), op, worst, scale);
                tb_tensor_release(y32);
                tb_tensor_release(y16);
                tb_tensor_release(yf);
                tb_tensor_release(xf);
                tb_tensor_release(wf);
                tb_tensor_release(x16);
                tb_tensor_release(w16);
                tb_tensor_release(xr);
                tb_tensor_release(wr);
                tb_tensor_release(x32);
                tb_tensor_release(w32);
            }
        }
    }
}

/* ---- errors ---- */

static void expect_error(tb_tensor *t, tb_status status, const char *words) {
    if (t != NULL) {
        tb_tensor_release(t);
        fail_msg("no error; expected one mentioning '%s'", words);
    }
    if (tb_last_status() != status)
        fail_msg("status %s, expected %s: %s", tb_status_string(tb_last_status()),
                 tb_status_string(status), tb_last_error());
    if (strstr(tb_last_error(), words) == NULL)
        fail_msg("error '%s' does not mention '%s'", tb_last_error(), words);
    tb_clear_error();
}

static void test_errors(void **state) {
    tb_shape xs = tb_shape_of(TB_F32, 4, 1, 4, 5, 5), ws = tb_shape_of(TB_F32, 4, 2, 4, 3, 3);
    tb_shape is = tb_shape_of(TB_I32, 4, 1, 4, 5, 5), big = tb_shape_of(TB_F32, 4, 2, 4, 7, 7);
    tb_shape w3 = tb_shape_of(TB_F32, 4, 6, 2, 3, 3), wts = tb_shape_of(TB_F32, 4, 4, 2, 3, 3);
    tb_tensor *x = tb_zeros(&xs, NULL), *w = tb_zeros(&ws, NULL), *xi = tb_zeros(&is, NULL);
    tb_tensor *wb = tb_zeros(&big, NULL), *wg = tb_zeros(&w3, NULL), *wt = tb_zeros(&wts, NULL);
    const int64_t neg[2] = {-1, 1}, k9[2] = {9, 9}, k3[2] = {3, 3}, p2[2] = {2, 2};
    const int64_t zero[2] = {0, 0}, huge[2] = {INT64_MAX / 2, INT64_MAX / 2};
    (void)state;
    expect_error(tb_conv2d(NULL, w, NULL, NULL, NULL, NULL, 1), TB_ERR_INVALID_ARGUMENT, "x");
    expect_error(tb_conv2d(x, NULL, NULL, NULL, NULL, NULL, 1), TB_ERR_INVALID_ARGUMENT, "weight");
    expect_error(tb_conv2d(xi, w, NULL, NULL, NULL, NULL, 1), TB_ERR_DTYPE, "floating point");
    expect_error(tb_conv2d(x, wb, NULL, NULL, NULL, NULL, 1), TB_ERR_SHAPE, "padded input");
    expect_error(tb_conv2d(x, wg, NULL, NULL, NULL, NULL, 3), TB_ERR_INVALID_ARGUMENT,
                 "do not divide");
    expect_error(tb_conv2d(x, w, NULL, neg, NULL, NULL, 1), TB_ERR_INVALID_ARGUMENT, "stride");
    expect_error(tb_conv2d(x, w, NULL, NULL, neg, NULL, 1), TB_ERR_INVALID_ARGUMENT, "padding");
    expect_error(tb_conv2d(x, w, NULL, NULL, NULL, zero, 1), TB_ERR_INVALID_ARGUMENT, "dilation");
    expect_error(tb_conv2d(x, w, x, NULL, NULL, NULL, 1), TB_ERR_SHAPE, "bias");
    expect_error(tb_conv_transpose2d(x, wt, NULL, NULL, NULL, k3, NULL, 1), TB_ERR_INVALID_ARGUMENT,
                 "output_padding");
    expect_error(tb_max_pool2d(x, k9, NULL, NULL, NULL, false), TB_ERR_SHAPE, "padded input");
    expect_error(tb_max_pool2d(x, k3, NULL, k9, NULL, false), TB_ERR_INVALID_ARGUMENT,
                 "half the kernel");
    expect_error(tb_max_pool2d(x, NULL, NULL, NULL, NULL, false), TB_ERR_INVALID_ARGUMENT,
                 "kernel");
    expect_error(tb_avg_pool2d(xi, k3, NULL, NULL, false, true), TB_ERR_DTYPE, "floating point");
    expect_error(tb_avg_pool2d(x, k3, neg, NULL, false, true), TB_ERR_INVALID_ARGUMENT, "stride");
    expect_error(tb_adaptive_avg_pool2d(x, zero), TB_ERR_INVALID_ARGUMENT, "output size");
    expect_error(tb_window(x, 2, k9, NULL, NULL), TB_ERR_SHAPE, "spans");
    expect_error(tb_window(x, 4, k3, NULL, NULL), TB_ERR_INVALID_ARGUMENT, "num_spatial");
    expect_error(tb_window(x, 2, k3, NULL, zero), TB_ERR_INVALID_ARGUMENT, "dilation");
    expect_error(tb_fold(x, 2, k3, k3, NULL, NULL), TB_ERR_SHAPE, "windows");
    expect_error(tb_max_pool2d(x, k3, NULL, p2, NULL, false), TB_ERR_INVALID_ARGUMENT,
                 "half the kernel");
    expect_error(tb_conv2d(x, w, NULL, NULL, huge, NULL, 1), TB_ERR_OVERFLOW, "overflow");
    expect_error(tb_conv_transpose2d(x, wt, NULL, huge, NULL, NULL, NULL, 1), TB_ERR_OVERFLOW,
                 "overflow");
    { /* paddings whose double would overflow: refused before any arithmetic on them */
        const int64_t pmax[2] = {INT64_MAX, INT64_MAX}, pbig[2] = {INT64_MAX / 4 + 1, 0};
        expect_error(tb_conv_transpose2d(x, wt, NULL, NULL, pmax, NULL, NULL, 1), TB_ERR_SHAPE,
                     "leaves no output");
        expect_error(tb_conv_transpose2d(x, wt, NULL, NULL, pbig, NULL, NULL, 1), TB_ERR_SHAPE,
                     "leaves no output");
    }
    {
        tb_device nat;
        if (tb_device_make("native", 0, &nat) == TB_OK) {
            tb_tensor *wn = tb_zeros(&ws, &nat);
            expect_error(tb_conv2d(x, wn, NULL, NULL, NULL, NULL, 1), TB_ERR_INVALID_ARGUMENT,
                         "weight is on native:0");
            tb_tensor_release(wn);
        }
        tb_clear_error();
    }
    tb_tensor_release(x);
    tb_tensor_release(w);
    tb_tensor_release(xi);
    tb_tensor_release(wb);
    tb_tensor_release(wg);
    tb_tensor_release(wt);
}

/* ---- convolutions big enough for packed matmul operands ----
   On CPU devices these matmuls read panels that a pack kernel gathers straight from the
   (padded, strided, dilated, transposed) input: lanes go in runs along a window's output row
   where that row is affine in the lane (the forward's windows), in runs of a kernel row for
   the weight's gradient; each case compares forward and both gradients with the cpu. */

#define PACKED_MAX_Y 403200 /* output elements of the largest case */

typedef struct packed_case {
    const char *name;
    int n;                /* spatial dims: 1 or 2 */
    int64_t xd[4], wd[4]; /* [N, C, L..], [O, C / groups, K..] */
    int64_t s[2], p[2], d[2], groups;
    bool permuted; /* x read through the transpose of its last two dims */
    bool bias;     /* a bias added after the matmul (its epilogue, through a reshape) */
    tb_dtype dt;
    const char *run;      /* a line the forward's pack kernel has (its run length), or NULL */
    const char *grad_run; /* a line the gradient's program has on CPU devices, or NULL */
} packed_case;

static const packed_case g_packed[] = {
    {"pad1",
     2,
     {2, 4, 33, 35},
     {8, 4, 3, 3},
     {1, 1},
     {1, 1},
     {1, 1},
     1,
     false,
     true,
     TB_F32,
     "long pn = 35L - pr0;",
     NULL},
    /* rows of 56: the weight gradient's runs split at the padding's edges */
    {"pad1_rows56",
     2,
     {2, 4, 20, 56},
     {8, 4, 3, 3},
     {1, 1},
     {1, 1},
     {1, 1},
     1,
     false,
     false,
     TB_F32,
     "long pn = 56L - pr0;",
     NULL},
    /* rows of 14 and a 5 x 5 window (the Fashion-MNIST CNN's second convolution): the
       weight gradient's pack goes lane by lane in runs of 14 rows */
    {"pad2_rows14_k5",
     2,
     {4, 8, 14, 14},
     {16, 8, 5, 5},
     {1, 1},
     {2, 2},
     {1, 1},
     1,
     false,
     false,
     TB_F32,
     NULL,
     NULL},
    {"stride2",
     2,
     {2, 4, 66, 70},
     {8, 4, 3, 3},
     {2, 2},
     {1, 1},
     {1, 1},
     1,
     false,
     false,
     TB_F32,
     "long pn = 35L - pr0;",
     NULL},
    {"dilation3",
     2,
     {2, 4, 37, 39},
     {8, 4, 3, 3},
     {1, 1},
     {1, 1},
     {3, 3},
     1,
     false,
     false,
     TB_F32,
     "long pn = 35L - pr0;",
     NULL},
    {"pad_gt_kernel",
     2,
     {2, 8, 29, 31},
     {8, 8, 2, 2},
     {1, 1},
     {3, 3},
     {1, 1},
     1,
     false,
     false,
     TB_F32,
     "long pn = 36L - pr0;",
     NULL},
    {"groups2",
     2,
     {2, 8, 33, 35},
     {16, 4, 3, 3},
     {1, 1},
     {1, 1},
     {1, 1},
     2,
     false,
     true,
     TB_F32,
     "long pn = 35L - pr0;",
     NULL},
    {"permuted",
     2,
     {2, 4, 33, 35},
     {8, 4, 3, 3},
     {1, 1},
     {1, 1},
     {1, 1},
     1,
     true,
     false,
     TB_F32,
     "long pn = 35L - pr0;",
     NULL},
    {"odd_kernel_stride",
     2,
     {1, 3, 61, 29},
     {8, 3, 5, 3},
     {1, 2},
     {2, 0},
     {1, 1},
     1,
     false,
     false,
     TB_F32,
     "long pn = 14L - pr0;",
     NULL},
    {"conv1d",
     1,
     {2, 4, 2000},
     {8, 4, 5},
     {1},
     {2},
     {1},
     1,
     false,
     true,
     TB_F32,
     "long pn = 2000L - pr0;",
     NULL},
    {"pad1_f64",
     2,
     {2, 4, 33, 35},
     {8, 4, 3, 3},
     {1, 1},
     {1, 1},
     {1, 1},
     1,
     false,
     false,
     TB_F64,
     "long pn = 35L - pr0;",
     NULL},
    /* the weight gradient contracts 6 x 28 x 29 positions: its panels of B, 135 columns (the
       last panel partial), outgrow a matmul's private buffer, which then takes them a part of
       the depth at a time */
    {"long_depth",
     2,
     {6, 15, 28, 29},
     {8, 15, 3, 3},
     {1, 1},
     {1, 1},
     {1, 1},
     1,
     false,
     false,
     TB_F32,
     "long pn = 29L - pr0;",
     NULL},
    /* the weight gradient's A (the output's gradient, 16 x 25200, in whole panels of rows:
       2.4 MB or more) larger than a core's cache, its B 270 columns (the last panel partial): on
       CPU devices of two compute units the matmul's work items each take several column panels of B
       in turn, one fill of the depth at a time (more units take one panel each where the panels are
       few) */
    {"panels_per_item",
     2,
     {28, 30, 30, 30},
     {16, 30, 3, 3},
     {1, 1},
     {1, 1},
     {1, 1},
     1,
     false,
     false,
     TB_F32,
     NULL,
     "const long pc0 = pc * "},
    /* the same weight over 64 x 64 images: each image's product (16 x 270 from 4096 positions)
       is small beside what it reads, so the weight gradient is a matmul per image (6 of them),
       summed */
    {"weight_grad_per_image",
     2,
     {6, 30, 64, 64},
     {16, 30, 3, 3},
     {1, 1},
     {1, 1},
     {1, 1},
     1,
     false,
     false,
     TB_F32,
     NULL,
     "MM_16_270_4096_b6"},
};

/* y, grad x and grad w of sum(conv(x, w) * r) on `backend`, into out (y, then gx, then gw);
   the program's text in *text when text is not NULL (the caller frees it). */
static void packed_run(const packed_case *c, const double *x, const double *w, const double *r,
                       const char *backend, double *out, char **text, char **gtext) {
    int rank = c->n + 2;
    int64_t xd[4], i, nx = numel(c->xd, rank), nw = numel(c->wd, rank);
    tb_device dev;
    tb_shape s;
    tb_tensor *tx, *tw, *tb = NULL, *y, *tr, *prod, *loss, *ins[2], *g[2] = {NULL, NULL};
    size_t es = c->dt == TB_F64 ? 8 : 4, ny;
    void *buf = malloc((size_t)(nx > nw ? nx : nw) * 8 + PACKED_MAX_Y * 8);
    assert_int_equal(tb_device_make(backend, 0, &dev), TB_OK);
    memcpy(xd, c->xd, sizeof xd);
    if (c->permuted) xd[rank - 2] = c->xd[rank - 1], xd[rank - 1] = c->xd[rank - 2];
#define PACKED_FILL(src, n)                                                                        \
    for (i = 0; i < (n); i++) {                                                                    \
        if (c->dt == TB_F64)                                                                       \
            ((double *)buf)[i] = (src)[i];                                                         \
        else                                                                                       \
            ((float *)buf)[i] = (float)(src)[i];                                                   \
    }
    PACKED_FILL(x, nx)
    assert_int_equal(tb_shape_make(&s, c->dt, rank, xd), TB_OK);
    tx = tb_tensor_from_host(buf, &s, &dev);
    if (c->permuted) {
        tb_tensor *base = tx;
        tx = tb_transpose(base, rank - 2, rank - 1);
        tb_tensor_release(base);
    }
    PACKED_FILL(w, nw)
    assert_int_equal(tb_shape_make(&s, c->dt, rank, c->wd), TB_OK);
    tw = tb_tensor_from_host(buf, &s, &dev);
    assert_non_null(tx);
    assert_non_null(tw);
    tb_set_requires_grad(tx, true);
    tb_set_requires_grad(tw, true);
    if (c->bias) {
        PACKED_FILL(w + nw - c->wd[0], c->wd[0]) /* the weight's last values */
        assert_int_equal(tb_shape_make(&s, c->dt, 1, c->wd), TB_OK);
        tb = tb_tensor_from_host(buf, &s, &dev);
        assert_non_null(tb);
    }
    y = c->n == 1 ? tb_conv1d(tx, tw, tb, c->s, c->p, c->d, c->groups)
                  : tb_conv2d(tx, tw, tb, c->s, c->p, c->d, c->groups);
    if (y == NULL) fail_msg("%s on %s: %s", c->name, backend, tb_last_error());
    s = tb_tensor_shape(y);
    ny = numel_of_shape(s);
    assert_true(ny <= PACKED_MAX_Y);
    PACKED_FILL(r, (int64_t)ny)
#undef PACKED_FILL
    tr = tb_tensor_from_host(buf, &s, &dev);
    if (text != NULL) *text = tb_ir_backend_text(&y, 1);
    prod = tb_mul(y, tr);
    loss = tb_sum(prod, NULL, 0, false);
    ins[0] = tx;
    ins[1] = tw;
    if (tb_grad(loss, NULL, ins, 2, g) != TB_OK)
        fail_msg("%s on %s: grad: %s", c->name, backend, tb_last_error());
    if (text != NULL && gtext != NULL) *gtext = tb_ir_backend_text(&g[1], 1);
    assert_int_equal(tb_tensor_to_host(y, buf, ny * es), TB_OK);
    for (i = 0; i < (int64_t)ny; i++)
        out[i] = c->dt == TB_F64 ? ((double *)buf)[i] : ((float *)buf)[i];
    out += ny;
    assert_int_equal(tb_tensor_to_host(g[0], buf, (size_t)nx * es), TB_OK);
    for (i = 0; i < nx; i++)
        out[i] = c->dt == TB_F64 ? ((double *)buf)[i] : ((float *)buf)[i];
    out += nx;
    assert_int_equal(tb_tensor_to_host(g[1], buf, (size_t)nw * es), TB_OK);
    for (i = 0; i < nw; i++)
        out[i] = c->dt == TB_F64 ? ((double *)buf)[i] : ((float *)buf)[i];
    tb_tensor_release(g[0]);
    tb_tensor_release(g[1]);
    tb_tensor_release(loss);
    tb_tensor_release(prod);
    tb_tensor_release(tr);
    tb_tensor_release(y);
    tb_tensor_release(tx);
    tb_tensor_release(tw);
    tb_tensor_release(tb);
    free(buf);
}

static void packed_against_cpu(const char *backend) {
    tb_device dev;
    size_t i;
    if (tb_device_make(backend, 0, &dev) != TB_OK) {
        print_message("no %s device, skipped: %s\n", backend, tb_last_error());
        tb_clear_error();
        skip();
    }
    for (i = 0; i < sizeof g_packed / sizeof g_packed[0]; i++) {
        const packed_case *c = &g_packed[i];
        int rank = c->n + 2;
        int64_t nx = numel(c->xd, rank), nw = numel(c->wd, rank), total = nx + nw + PACKED_MAX_Y, j;
        double *x = malloc((size_t)nx * 8), *w = malloc((size_t)nw * 8);
        double *r = malloc(PACKED_MAX_Y * 8), *want = malloc((size_t)total * 8);
        double *got = malloc((size_t)total * 8);
        char *text = NULL, *gtext = NULL, what[96];
        tb_device_info info;
        assert_non_null(x && w && r && want && got);
        g_rng = 3000 + i;
        for (j = 0; j < nx; j++)
            x[j] = next_value(false);
        for (j = 0; j < nw; j++)
            w[j] = next_value(false);
        for (j = 0; j < PACKED_MAX_Y; j++)
            r[j] = next_value(false);
        packed_run(c, x, w, r, "cpu", want, NULL, NULL);
        packed_run(c, x, w, r, backend, got, &text, &gtext);
        assert_non_null(text);
        assert_non_null(gtext);
        assert_int_equal(tb_backend_device_info(&dev, &info), TB_OK);
        if (info.device.type == TB_DEVICE_CPU) {
            /* packed operands: CPU devices only; a pack kernel, or (the host's threads) a
               matmul whose work items pack their own panels of B */
            if (strstr(text, "void PB_") == NULL && strstr(text, " bpk[") == NULL)
                fail_msg("%s on %s: no pack", c->name, backend);
            if (c->run != NULL && strstr(text, c->run) == NULL)
                fail_msg("%s on %s: the pack kernel has no run `%s`", c->name, backend, c->run);
            if (c->grad_run != NULL && info.compute_units <= 2 &&
                strstr(gtext, c->grad_run) == NULL)
                fail_msg("%s on %s: the gradient's program has no `%s`", c->name, backend,
                         c->grad_run);
        }
        snprintf(what, sizeof what, "%s on %s", c->name, backend);
        {
            int64_t off = 0, n, k, a;
            for (k = 0; k < 3; k++) { /* y, grad x, grad w */
                if (k == 0) {
                    for (n = c->xd[0] * c->wd[0], a = 0; a < c->n; a++)
                        n *= (c->xd[2 + a] + 2 * c->p[a] - c->d[a] * (c->wd[2 + a] - 1) - 1) /
                                 c->s[a] +
                             1;
                } else {
                    n = k == 1 ? nx : nw;
                }
                if (rel_err(got + off, want + off, n) > (c->dt == TB_F64 ? 1e-12 : 1e-5))
                    fail_msg("%s: %s differs", what, k == 0 ? "y" : k == 1 ? "grad x" : "grad w");
                off += n;
            }
        }
        free(text);
        free(gtext);
        free(x);
        free(w);
        free(r);
        free(want);
        free(got);
    }
}

static void test_packed_opencl_against_cpu(void **state) {
    (void)state;
    packed_against_cpu("opencl");
}

static void test_packed_native_against_cpu(void **state) {
    (void)state;
    packed_against_cpu("native");
}

/* ---- packs that transpose blocks of lanes in registers (CPU devices) ----
   A convolution's weight gradient packs B with a window's elements as its lanes and an input
   row's pixels as its rows. Where x is a buffer read through views alone (here x + x, no
   padding), a CPU device reads each lane's run of pixels as vectors and transposes blocks of
   them in registers (tb__cg_pack_block), in a pack kernel or in the matmul's own packing of
   B. The cases (on a CPU of 16 f32 lanes): rows of 54 and of 18 in blocks of 16 (a run's last
   block ends at its end, over rows already written), of 12 in blocks of 8 in the matmul's own
   packing, of 54 and of 10 in blocks of 8 in the native backend's pack kernels (items of 8
   rows; in OpenCL C a block has the device's lanes, and runs shorter go lane by lane); 16,
   32, 5 and 4 channels of 3 x 3 windows (the last panel of 32 lanes partly past
   the window's elements: zeros there). Values of y, grad x and grad w against the cpu's, on
   the native backend and on OpenCL. */

/* y, grad x and grad w of sum(conv(x + x, w) * r) on `backend` (f32) into out; the gradient of
   w's program text in *text (the caller frees it). */
static void blocks_run(const int64_t *xd, const int64_t *wd, const double *x, const double *w,
                       const double *r, const char *backend, double *out, char **text) {
    int64_t yd[4] = {xd[0], wd[0], xd[2] - 2, xd[3] - 2}, one[2] = {1, 1}, zero[2] = {0, 0},
            nx = numel(xd, 4), nw = numel(wd, 4), ny = numel(yd, 4), i;
    float *buf = malloc((size_t)(nx > ny ? nx : ny) * sizeof(float));
    tb_tensor *tx, *tw, *tr, *xx, *y, *prod, *loss, *ins[2], *g[2] = {NULL, NULL};
    tb_device dev;
    tb_shape s;
    assert_non_null(buf);
    assert_int_equal(tb_device_make(backend, 0, &dev), TB_OK);
#define BLOCKS_TENSOR(t, v, dims, n)                                                               \
    for (i = 0; i < (n); i++)                                                                      \
        buf[i] = (float)(v)[i];                                                                    \
    assert_int_equal(tb_shape_make(&s, TB_F32, 4, dims), TB_OK);                                   \
    t = tb_tensor_from_host(buf, &s, &dev);                                                        \
    assert_non_null(t);
    BLOCKS_TENSOR(tx, x, xd, nx)
    BLOCKS_TENSOR(tw, w, wd, nw)
    BLOCKS_TENSOR(tr, r, yd, ny)
#undef BLOCKS_TENSOR
    tb_set_requires_grad(tx, true);
    tb_set_requires_grad(tw, true);
    xx = tb_add(tx, tx);
    y = tb_conv2d(xx, tw, NULL, one, zero, one, 1);
    assert_non_null(y);
    prod = tb_mul(y, tr);
    loss = tb_sum(prod, NULL, 0, false);
    assert_non_null(loss);
    ins[0] = tx;
    ins[1] = tw;
    assert_int_equal(tb_grad(loss, NULL, ins, 2, g), TB_OK);
    *text = tb_ir_backend_text(&g[1], 1);
    assert_int_equal(tb_tensor_to_host(y, buf, (size_t)ny * sizeof(float)), TB_OK);
    for (i = 0; i < ny; i++)
        out[i] = buf[i];
    assert_int_equal(tb_tensor_to_host(g[0], buf, (size_t)nx * sizeof(float)), TB_OK);
    for (i = 0; i < nx; i++)
        out[ny + i] = buf[i];
    assert_int_equal(tb_tensor_to_host(g[1], buf, (size_t)nw * sizeof(float)), TB_OK);
    for (i = 0; i < nw; i++)
        out[ny + nx + i] = buf[i];
    tb_tensor_release(g[0]);
    tb_tensor_release(g[1]);
    tb_tensor_release(loss);
    tb_tensor_release(prod);
    tb_tensor_release(y);
    tb_tensor_release(xx);
    tb_tensor_release(tr);
    tb_tensor_release(tw);
    tb_tensor_release(tx);
    free(buf);
}

static void pack_blocks_against_cpu(const char *backend) {
    /* n, c, h, w of x; the weight [8, c, 3, 3] */
    static const int64_t shapes[][4] = {
        {2, 16, 16, 56}, {2, 16, 40, 20}, {2, 32, 20, 14}, {2, 5, 9, 56}, {12, 4, 12, 12}};
    tb_device dev;
    tb_device_info info;
    size_t k;
    if (tb_device_make(backend, 0, &dev) != TB_OK) {
        print_message("no %s device, skipped: %s\n", backend, tb_last_error());
        tb_clear_error();
        skip();
    }
    for (k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t *xd = shapes[k], wd[4] = {8, xd[1], 3, 3};
        int64_t nx = numel(xd, 4), nw = numel(wd, 4), ny = xd[0] * 8 * (xd[2] - 2) * (xd[3] - 2), i;
        double *x = malloc((size_t)nx * 8), *w = malloc((size_t)nw * 8),
               *r = malloc((size_t)ny * 8);
        double *want = malloc((size_t)(nx + nw + ny) * 8),
               *got = malloc((size_t)(nx + nw + ny) * 8);
        char *text = NULL, *gtext = NULL;
        assert_non_null(x && w && r && want && got);
        g_rng = 4000 + k;
        for (i = 0; i < nx; i++)
            x[i] = next_value(false);
        for (i = 0; i < nw; i++)
            w[i] = next_value(false);
        for (i = 0; i < ny; i++)
            r[i] = next_value(false);
        blocks_run(xd, wd, x, w, r, "cpu", want, &text);
        blocks_run(xd, wd, x, w, r, backend, got, &gtext);
        assert_int_equal(tb_backend_device_info(&dev, &info), TB_OK);
        /* the blocks on CPU devices whose vectors have 8 f32 lanes or more; in OpenCL C only
           blocks of the device's lanes (runs of 16 rows or more here) */
        if (info.device.type == TB_DEVICE_CPU && strstr(gtext, "#define TB_VW 4") == NULL &&
            (strcmp(backend, "native") == 0 || xd[3] - 2 >= 16) &&
            strstr(gtext, "tb_src[pt] = b") == NULL)
            fail_msg("x %lld x %lld x %lld x %lld on %s: no pack transposes blocks of lanes",
                     (long long)xd[0], (long long)xd[1], (long long)xd[2], (long long)xd[3],
                     backend);
        if (rel_err(got, want, ny) > 1e-5) fail_msg("case %d on %s: y differs", (int)k, backend);
        if (rel_err(got + ny, want + ny, nx) > 1e-5)
            fail_msg("case %d on %s: grad x differs", (int)k, backend);
        if (rel_err(got + ny + nx, want + ny + nx, nw) > 1e-5)
            fail_msg("case %d on %s: grad w differs", (int)k, backend);
        tb_free(text);
        tb_free(gtext);
        free(x);
        free(w);
        free(r);
        free(want);
        free(got);
    }
}

static void test_pack_blocks_native(void **state) {
    (void)state;
    pack_blocks_against_cpu("native");
}

static void test_pack_blocks_opencl(void **state) {
    (void)state;
    pack_blocks_against_cpu("opencl");
}

static int teardown(void **state) {
    (void)state;
    tb_shutdown();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_and_fold),
        cmocka_unit_test(test_phased_fold),
        cmocka_unit_test(test_diagonal_window),
        cmocka_unit_test(test_extremes_keep_nan),
        cmocka_unit_test(test_conv_rows),
        cmocka_unit_test(test_input_grad_conv),
        cmocka_unit_test(test_half_precision),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_against_torch),
        cmocka_unit_test(test_opencl_against_cpu),
        cmocka_unit_test(test_native_against_cpu),
        cmocka_unit_test(test_packed_opencl_against_cpu),
        cmocka_unit_test(test_packed_native_against_cpu),
        cmocka_unit_test(test_pack_blocks_native),
        cmocka_unit_test(test_pack_blocks_opencl),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
