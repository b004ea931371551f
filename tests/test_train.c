/* Training: optimizers and losses against PyTorch (tests/train_torch.py through
   /usr/bin/python3; skipped with a message where torch cannot be imported), a training step that
   compiles once and launches few kernels, refused non-finite steps, dropout's mask, gradient
   clipping and accumulation, and bad input. Each check runs on cpu, opencl and native (a
   backend without a device here is skipped). */
#define _POSIX_C_SOURCE 200809L /* popen, getline */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#define STEPS    20
#define NPARAM   16 /* W [3, 4] and b [4] */
#define PER_STEP (1 + NPARAM)

static const char *g_backends[3] = {"cpu", "opencl", "native"};

static bool device_of(const char *backend, tb_device *dev) {
    if (tb_device_make(backend, 0, dev) == TB_OK) return true;
    print_message("no %s device, skipped: %s\n", backend, tb_last_error());
    tb_clear_error();
    return false;
}

static tb_tensor *upload(const double *v, tb_dtype dt, int rank, const int64_t *dims,
                         const tb_device *dev) {
    tb_shape s;
    size_t n = 1, i;
    tb_tensor *t;
    assert_int_equal(tb_shape_make(&s, dt, rank, dims), TB_OK);
    for (i = 0; i < (size_t)rank; i++)
        n *= (size_t)dims[i];
    if (dt == TB_F64) {
        t = tb_tensor_from_host(v, &s, dev);
    } else if (dt == TB_F32) {
        float *f = (float *)malloc(n * sizeof(float) + 1);
        assert_non_null(f);
        for (i = 0; i < n; i++)
            f[i] = (float)v[i];
        t = tb_tensor_from_host(f, &s, dev);
        free(f);
    } else {
        int64_t *q = (int64_t *)malloc(n * sizeof(int64_t) + 1);
        assert_non_null(q);
        for (i = 0; i < n; i++)
            q[i] = (int64_t)v[i];
        t = tb_tensor_from_host(q, &s, dev);
        free(q);
    }
    if (t == NULL) fail_msg("upload: %s", tb_last_error());
    return t;
}

/* Any float tensor's values as doubles; returns the count. */
static size_t read_values(tb_tensor *t, double *out, size_t cap) {
    tb_shape s = tb_tensor_shape(t);
    tb_tensor *d = tb_cast(t, TB_F64);
    size_t n = 1, i;
    for (i = 0; i < (size_t)s.rank; i++)
        n *= (size_t)s.dims[i];
    assert_true(n <= cap);
    if (d == NULL || tb_tensor_to_host(d, out, n * sizeof(double)) != TB_OK)
        fail_msg("read: %s", tb_last_error());
    tb_tensor_release(d);
    return n;
}

/* ---- PyTorch's numbers ---- */

typedef struct torch_line {
    char key[64];
    double *v;
    size_t n;
} torch_line;

static torch_line g_torch[32];
static int g_num_torch = -1; /* -1: not run yet; 0: torch unavailable */

static void run_torch(const char *what) {
    char cmd[256], *line = NULL;
    size_t cap = 0;
    FILE *p;
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/train_torch.py %s 2>/dev/null", what);
    p = popen(cmd, "r");
    if (p == NULL) return;
    while (getline(&line, &cap, p) > 0 && g_num_torch < 32) {
        char *s = line, *end;
        char a[16], b[16], c[16];
        int used = 0;
        torch_line *L = &g_torch[g_num_torch];
        size_t n, i;
        if (strncmp(line, "optim ", 6) == 0) {
            if (sscanf(line, "%15s %15s %15s %zu%n", a, b, c, &n, &used) != 4) continue;
            snprintf(L->key, sizeof L->key, "%s %s %s", a, b, c);
        } else {
            if (sscanf(line, "%15s %15s %zu%n", a, b, &n, &used) != 3) continue;
            snprintf(L->key, sizeof L->key, "%s %s", a, b);
        }
        s = line + used;
        L->v = (double *)malloc(n * sizeof(double) + 1);
        assert_non_null(L->v);
        for (i = 0; i < n; i++) {
            L->v[i] = strtod(s, &end);
            assert_true(end != s);
            s = end;
        }
        L->n = n;
        g_num_torch++;
    }
    free(line);
    pclose(p);
}

/* PyTorch's line `key`, or NULL with the test skipped when torch is not importable. */
static const torch_line *torch_values(const char *what, const char *key) {
    int i;
    if (g_num_torch < 0) {
        g_num_torch = 0;
        run_torch("optim");
        run_torch("losses");
    }
    for (i = 0; i < g_num_torch; i++)
        if (strcmp(g_torch[i].key, key) == 0) return &g_torch[i];
    if (g_num_torch == 0) {
        print_message("PyTorch (python3-torch, imported by /usr/bin/python3) is not available: "
                      "%s against PyTorch skipped\n",
                      what);
        skip();
    }
    fail_msg("tests/train_torch.py printed no line '%s'", key);
    return NULL;
}

static void expect_close(const char *what, double got, double want, double tol) {
    if (!(fabs(got - want) <= tol * (1.0 + fabs(want))))
        fail_msg("%s: %.12g, PyTorch %.12g (tolerance %g)", what, got, want, tol);
}

/* ---- the optimizer problem of tests/train_torch.py ---- */

typedef struct cfg {
    tb_optimizer_kind kind;
    double lr, momentum, dampening, weight_decay, beta1, beta2, eps;
    bool nesterov, maximize, default_wd;
    double smoothing;
} cfg;

static const cfg CONFIGS[] = {
    {TB_SGD, 0.1, 0, 0, 0, 0, 0, 0, false, false, false, 0.0},
    {TB_SGD, 0.1, 0.9, 0.1, 0.01, 0, 0, 0, false, false, false, 0.0},
    {TB_SGD, 0.05, 0.9, 0, 0.001, 0, 0, 0, true, false, false, 0.0},
    {TB_SGD, 0.1, 0.5, 0, 0, 0, 0, 0, false, true, false, 0.0},
    {TB_ADAM, 0.01, 0, 0, 0, 0.9, 0.999, 1e-8, false, false, false, 0.0},
    {TB_ADAM, 0.01, 0, 0, 0.1, 0.8, 0.99, 1e-6, false, false, false, 0.0},
    {TB_ADAMW, 0.01, 0, 0, 0, 0, 0, 0, false, false, true, 0.1},
    {TB_ADAMW, 0.02, 0, 0, 0.1, 0.9, 0.999, 1e-8, false, true, false, 0.1},
};

static tb_optimizer_desc desc_of(const cfg *c) {
    tb_optimizer_desc d = c->kind == TB_SGD    ? tb_sgd_desc(c->lr)
                          : c->kind == TB_ADAM ? tb_adam_desc(c->lr)
                                               : tb_adamw_desc(c->lr);
    if (c->kind == TB_SGD) {
        d.momentum = c->momentum;
        d.dampening = c->dampening;
        d.nesterov = c->nesterov;
        d.weight_decay = c->weight_decay;
    } else if (!c->default_wd) {
        d.beta1 = c->beta1;
        d.beta2 = c->beta2;
        d.eps = c->eps;
        d.weight_decay = c->weight_decay;
    }
    d.maximize = c->maximize;
    return d;
}

typedef struct problem {
    tb_tensor *w, *b, *x, *y;
} problem;

static void problem_make(problem *p, tb_dtype dt, const tb_device *dev) {
    double w[12], b[4], x[15], y[5];
    int64_t wd[2] = {3, 4}, bd[1] = {4}, xd[2] = {5, 3}, yd[1] = {5};
    int i;
    for (i = 0; i < 12; i++)
        w[i] = sin(i + 1) * 0.5;
    for (i = 0; i < 4; i++)
        b[i] = cos(i + 1) * 0.1;
    for (i = 0; i < 15; i++)
        x[i] = sin(0.3 * i + 0.1);
    for (i = 0; i < 5; i++)
        y[i] = (i * 7) % 4;
    p->w = upload(w, dt, 2, wd, dev);
    p->b = upload(b, dt, 1, bd, dev);
    p->x = upload(x, dt, 2, xd, dev);
    p->y = upload(y, TB_I64, 1, yd, dev);
    assert_int_equal(tb_set_requires_grad(p->w, true), TB_OK);
    assert_int_equal(tb_set_requires_grad(p->b, true), TB_OK);
}

static void problem_free(problem *p) {
    tb_tensor_release(p->w);
    tb_tensor_release(p->b);
    tb_tensor_release(p->x);
    tb_tensor_release(p->y);
}

static tb_tensor *problem_loss(problem *p, double smoothing) {
    tb_tensor *xw = tb_matmul(p->x, p->w), *z = tb_add(xw, p->b);
    tb_tensor *loss = tb_cross_entropy(z, p->y, TB_REDUCTION_MEAN, smoothing);
    tb_tensor_release(xw);
    tb_tensor_release(z);
    if (loss == NULL) fail_msg("loss: %s", tb_last_error());
    return loss;
}

static void optim_against_torch(const char *backend) {
    tb_device dev;
    int k, di, step;
    if (!device_of(backend, &dev)) skip();
    for (di = 0; di < 2; di++) {
        tb_dtype dt = di == 0 ? TB_F64 : TB_F32;
        double tol = dt == TB_F64 ? 1e-9 : 1e-5;
        for (k = 0; k < (int)(sizeof CONFIGS / sizeof CONFIGS[0]); k++) {
            const cfg *c = &CONFIGS[k];
            tb_optimizer_desc d = desc_of(c);
            char key[32];
            const torch_line *want;
            problem p;
            tb_tensor *params[2];
            tb_optimizer *opt;
            snprintf(key, sizeof key, "optim %d %s", k, dt == TB_F64 ? "f64" : "f32");
            want = torch_values("optimizer trajectories", key);
            assert_int_equal(want->n, STEPS * PER_STEP);
            problem_make(&p, dt, &dev);
            params[0] = p.w;
            params[1] = p.b;
            opt = tb_optimizer_new(&d, params, 2);
            if (opt == NULL) fail_msg("tb_optimizer_new: %s", tb_last_error());
            for (step = 0; step < STEPS; step++) {
                tb_tensor *loss = problem_loss(&p, c->smoothing), *grads[2] = {NULL, NULL};
                double got[PER_STEP];
                char what[96];
                int j;
                if (step == 10) assert_int_equal(tb_optimizer_set_lr(opt, c->lr * 0.5), TB_OK);
                assert_int_equal(tb_grad(loss, NULL, params, 2, grads), TB_OK);
                if (tb_optimizer_step(opt, grads, &loss, 1) != TB_OK)
                    fail_msg("step: %s", tb_last_error());
                read_values(loss, got, 1);
                read_values(p.w, got + 1, 12);
                read_values(p.b, got + 13, 4);
                for (j = 0; j < PER_STEP; j++) {
                    snprintf(what, sizeof what, "%s config %d %s step %d %s", backend, k,
                             dt == TB_F64 ? "f64" : "f32", step + 1, j == 0 ? "loss" : "param");
                    expect_close(what, got[j], want->v[step * PER_STEP + j], tol);
                }
                tb_tensor_release(grads[0]);
                tb_tensor_release(grads[1]);
                tb_tensor_release(loss);
            }
            assert_int_equal(tb_optimizer_steps(opt), STEPS);
            tb_optimizer_free(opt);
            problem_free(&p);
        }
    }
}

static void test_optim_cpu(void **state) {
    (void)state;
    optim_against_torch("cpu");
}
static void test_optim_opencl(void **state) {
    (void)state;
    optim_against_torch("opencl");
}
static void test_optim_native(void **state) {
    (void)state;
    optim_against_torch("native");
}

/* ---- losses: values and gradients (the order of run_losses in tests/train_torch.py) ---- */

static void losses_against_torch(const char *backend) {
    tb_device dev;
    int di;
    if (!device_of(backend, &dev)) skip();
    for (di = 0; di < 2; di++) {
        tb_dtype dt = di == 0 ? TB_F64 : TB_F32;
        double tol = dt == TB_F64 ? 1e-9 : 1e-5;
        double lg[60], pr[60], tg[12], pd[6], wt[6];
        int64_t ld[3] = {4, 5, 3}, td[2] = {4, 3}, pdims[2] = {2, 3};
        const torch_line *want = torch_values("losses", dt == TB_F64 ? "losses f64" : "losses f32");
        tb_tensor *logits, *probs, *tgt, *pred, *target, *e;
        size_t at = 0, i;
        int r, s, form;
        for (i = 0; i < 60; i++) {
            lg[i] = sin(0.7 * (double)i) * 2;
            pr[i] = cos(0.4 * (double)i);
        }
        for (i = 0; i < 12; i++)
            tg[i] = (double)((i * 3) % 5);
        for (i = 0; i < 6; i++) {
            pd[i] = sin(0.9 * (double)i);
            wt[i] = cos(0.5 * (double)i);
        }
        logits = upload(lg, dt, 3, ld, &dev);
        e = upload(pr, dt, 3, ld, &dev);
        probs = tb_softmax(e, 1);
        tb_tensor_release(e);
        tgt = upload(tg, TB_I64, 2, td, &dev);
        pred = upload(pd, dt, 2, pdims, &dev);
        target = upload(wt, dt, 2, pdims, &dev);
        for (r = 0; r < 3; r++) {
            tb_reduction red = r == 0   ? TB_REDUCTION_MEAN
                               : r == 1 ? TB_REDUCTION_SUM
                                        : TB_REDUCTION_NONE;
            for (form = 0; form < 6; form++) {
                tb_tensor *v = NULL, *input, *g = NULL, *seed, *lp = NULL;
                double got[64], seedv[64];
                size_t n, m;
                char what[96];
                s = form < 4 ? form / 2 : 0;
                if (form < 4) {
                    v = tb_cross_entropy(logits, form % 2 == 0 ? tgt : probs, red,
                                         s == 0 ? 0.0 : 0.25);
                    input = logits;
                } else if (form == 4) {
                    lp = tb_log_softmax(logits, 1);
                    v = tb_nll_loss(lp, tgt, red);
                    input = logits;
                } else {
                    v = tb_mse_loss(pred, target, red);
                    input = pred;
                }
                if (v == NULL) fail_msg("loss: %s", tb_last_error());
                {
                    tb_shape vs = tb_tensor_shape(v);
                    size_t k, count = 1;
                    for (k = 0; k < (size_t)vs.rank; k++)
                        count *= (size_t)vs.dims[k];
                    for (k = 0; k < count; k++)
                        seedv[k] = (double)(k + 1);
                    seed = upload(seedv, dt, vs.rank, vs.dims, &dev);
                }
                assert_int_equal(tb_grad(v, seed, &input, 1, &g), TB_OK);
                n = read_values(v, got, 64);
                for (i = 0; i < n; i++) {
                    snprintf(what, sizeof what, "%s loss form %d reduction %d value %zu", backend,
                             form, r, i);
                    assert_true(at + i < want->n);
                    expect_close(what, got[i], want->v[at + i], tol);
                }
                at += n;
                m = read_values(g, got, 64);
                for (i = 0; i < m; i++) {
                    snprintf(what, sizeof what, "%s loss form %d reduction %d grad %zu", backend,
                             form, r, i);
                    assert_true(at + i < want->n);
                    expect_close(what, got[i], want->v[at + i], tol);
                }
                at += m;
                tb_tensor_release(v);
                tb_tensor_release(g);
                tb_tensor_release(seed);
                tb_tensor_release(lp);
            }
        }
        assert_int_equal(at, want->n);
        tb_tensor_release(logits);
        tb_tensor_release(probs);
        tb_tensor_release(tgt);
        tb_tensor_release(pred);
        tb_tensor_release(target);
    }
}

static void test_losses_cpu(void **state) {
    (void)state;
    losses_against_torch("cpu");
}
static void test_losses_opencl(void **state) {
    (void)state;
    losses_against_torch("opencl");
}

/* ---- a training step: one graph, compiled once ---- */

typedef struct mlp {
    tb_tensor *w1, *b1, *w2, *b2, *x, *y;
} mlp;

static void mlp_make(mlp *m, const tb_device *dev) {
    tb_shape s;
    double y[32];
    int64_t yd[1] = {32};
    int i;
    tb_tensor *t;
    assert_int_equal(tb_manual_seed(7), TB_OK);
    s = tb_shape_of(TB_F32, 2, 20, 16);
    t = tb_randn(&s, dev);
    m->w1 = tb_mul_scalar(t, 0.2);
    tb_tensor_release(t);
    s = tb_shape_of(TB_F32, 1, 16);
    m->b1 = tb_zeros(&s, dev);
    s = tb_shape_of(TB_F32, 2, 16, 4);
    t = tb_randn(&s, dev);
    m->w2 = tb_mul_scalar(t, 0.2);
    tb_tensor_release(t);
    s = tb_shape_of(TB_F32, 1, 4);
    m->b2 = tb_zeros(&s, dev);
    s = tb_shape_of(TB_F32, 2, 32, 20);
    m->x = tb_randn(&s, dev);
    for (i = 0; i < 32; i++)
        y[i] = (double)(i % 4);
    m->y = upload(y, TB_I64, 1, yd, dev);
    assert_non_null(m->w1);
    assert_non_null(m->b2);
    assert_int_equal(tb_set_requires_grad(m->w1, true), TB_OK);
    assert_int_equal(tb_set_requires_grad(m->b1, true), TB_OK);
    assert_int_equal(tb_set_requires_grad(m->w2, true), TB_OK);
    assert_int_equal(tb_set_requires_grad(m->b2, true), TB_OK);
    { /* initialised as a model's weights are before training */
        tb_tensor *all[6] = {m->w1, m->b1, m->w2, m->b2, m->x, m->y};
        assert_int_equal(tb_sync(all, 6), TB_OK);
    }
}

static void mlp_free(mlp *m) {
    tb_tensor_release(m->w1);
    tb_tensor_release(m->b1);
    tb_tensor_release(m->w2);
    tb_tensor_release(m->b2);
    tb_tensor_release(m->x);
    tb_tensor_release(m->y);
}

static tb_tensor *mlp_loss(mlp *m, tb_tensor *x) {
    tb_tensor *a = tb_matmul(x, m->w1), *b = tb_add(a, m->b1), *h = tb_relu(b);
    tb_tensor *c = tb_matmul(h, m->w2), *z = tb_add(c, m->b2);
    tb_tensor *loss = tb_cross_entropy(z, m->y, TB_REDUCTION_MEAN, 0.0);
    tb_tensor_release(a);
    tb_tensor_release(b);
    tb_tensor_release(h);
    tb_tensor_release(c);
    tb_tensor_release(z);
    assert_non_null(loss);
    return loss;
}

/* One AdamW step; the loss's value. */
static double mlp_step(mlp *m, tb_optimizer *opt, tb_tensor *x) {
    tb_tensor *params[4] = {m->w1, m->b1, m->w2, m->b2}, *grads[4] = {NULL, NULL, NULL, NULL};
    tb_tensor *loss = mlp_loss(m, x);
    double v = 0;
    int i;
    assert_int_equal(tb_grad(loss, NULL, params, 4, grads), TB_OK);
    if (tb_optimizer_step(opt, grads, &loss, 1) != TB_OK) fail_msg("step: %s", tb_last_error());
    read_values(loss, &v, 1);
    for (i = 0; i < 4; i++)
        tb_tensor_release(grads[i]);
    tb_tensor_release(loss);
    return v;
}

static void training_compiles_once(const char *backend) {
    tb_device dev;
    mlp m;
    tb_optimizer *opt;
    tb_optimizer_desc d = tb_adamw_desc(0.01);
    tb_tensor *params[4];
    int64_t compiles = 0, launches = 0;
    double first = 0, last = 0;
    void *buffers[1] = {NULL};
    int step;
    if (!device_of(backend, &dev)) skip();
    mlp_make(&m, &dev);
    params[0] = m.w1;
    params[1] = m.b1;
    params[2] = m.w2;
    params[3] = m.b2;
    opt = tb_optimizer_new(&d, params, 4);
    assert_non_null(opt);
    for (step = 0; step < 8; step++) {
        int64_t c0 = tb_metrics_counter("UncachedCompile");
        int64_t k0 = tb_metrics_counter("OpenCL::KernelLaunch");
        int64_t d0 = tb_metrics_counter("DonatedBuffers");
        double v;
        if (step == 4) assert_int_equal(tb_optimizer_set_lr(opt, 0.005), TB_OK); /* a schedule */
        v = mlp_step(&m, opt, m.x);
        if (step == 0) first = v;
        last = v;
        if (step >= 1) compiles += tb_metrics_counter("UncachedCompile") - c0;
        if (step == 7) launches = tb_metrics_counter("OpenCL::KernelLaunch") - k0;
        if (strcmp(backend, "cpu") != 0) {
            /* each parameter and both its moments are computed into their old buffers: the
               buffers of the parameters stay the same from step to step */
            void *before = step == 0 ? NULL : buffers[0];
            assert_int_equal(tb_metrics_counter("DonatedBuffers") - d0, 12);
            buffers[0] = tb_tensor_data(m.w1)->payload;
            if (before != NULL) assert_ptr_equal(before, buffers[0]);
        }
    }
    print_message("%s: loss %.4f -> %.4f over 8 steps; kernels per step %lld\n", backend, first,
                  last, (long long)launches);
    /* every step after the first (learning rate changed included) is a cache hit */
    assert_int_equal(compiles, 0);
    assert_true(last < first);
    /* forward, backward and the update of 4 parameters fuse into a few dozen kernels */
    if (strcmp(backend, "opencl") == 0) {
        assert_true(launches > 0);
        assert_true(launches <= 40);
    }
    tb_optimizer_free(opt);
    mlp_free(&m);
}

static void test_compiles_once_cpu(void **state) {
    (void)state;
    training_compiles_once("cpu");
}
static void test_compiles_once_opencl(void **state) {
    (void)state;
    training_compiles_once("opencl");
}
static void test_compiles_once_native(void **state) {
    (void)state;
    training_compiles_once("native");
}

/* ---- values behind an identity: computed once, into the result's buffer ---- */

/* Kernels the backend has launched so far (opencl: the counter; native: its report). */
static int64_t kernel_launches(const char *backend) {
    char *report;
    const char *at;
    int64_t n = -1;
    if (strcmp(backend, "opencl") == 0) return tb_metrics_counter("OpenCL::KernelLaunch");
    report = tb_backend_metrics_report(backend);
    assert_non_null(report);
    at = strstr(report, "Native::KernelLaunch: ");
    if (at != NULL) n = (int64_t)strtoll(at + strlen("Native::KernelLaunch: "), NULL, 10);
    free(report);
    assert_true(n >= 0);
    return n;
}

/* A gradient requires grad, so an optimizer step's new moments come with history, and
   tb_assign stores them behind an identity reshape that cuts it. The moment is read again by
   the parameter's update: the step must still compute it once, straight into the moment's
   buffer, not into a buffer of its own and then a copy per moment. Gradients attached or
   detached, a step launches the same kernels. */
static int64_t mlp_step_launches(mlp *m, tb_optimizer *opt, const char *backend, bool detach) {
    tb_tensor *params[4] = {m->w1, m->b1, m->w2, m->b2}, *grads[4] = {NULL, NULL, NULL, NULL};
    tb_tensor *loss = mlp_loss(m, m->x);
    int64_t k0;
    int i;
    assert_int_equal(tb_grad(loss, NULL, params, 4, grads), TB_OK);
    for (i = 0; detach && i < 4; i++) {
        tb_tensor *g = tb_detach(grads[i]);
        assert_non_null(g);
        tb_tensor_release(grads[i]);
        grads[i] = g;
    }
    k0 = kernel_launches(backend);
    if (tb_optimizer_step(opt, grads, &loss, 1) != TB_OK) fail_msg("step: %s", tb_last_error());
    k0 = kernel_launches(backend) - k0;
    for (i = 0; i < 4; i++)
        tb_tensor_release(grads[i]);
    tb_tensor_release(loss);
    return k0;
}

static void identity_results(const char *backend) {
    tb_device dev;
    double xv[6] = {-1.5, -0.5, 0.0, 0.25, 1.0, 2.0}, got[6], want[6];
    int64_t dims[2] = {2, 3}, k0, attached[2], detached[2];
    tb_tensor *x, *y, *yy, *d, *z, *sync[2], *params[4];
    tb_optimizer_desc desc = tb_adamw_desc(0.01);
    tb_optimizer *opt[2];
    mlp m[2];
    int i, step;
    if (!device_of(backend, &dev)) skip();
    /* y's detached copy and z = y * y + 1 in one sync: y computed once, into d's buffer */
    x = upload(xv, TB_F32, 2, dims, &dev);
    y = tb_exp(x);
    d = tb_detach(y);
    yy = tb_mul(y, y);
    z = tb_add_scalar(yy, 1.0);
    tb_tensor_release(yy);
    assert_non_null(z);
    sync[0] = d;
    sync[1] = z;
    k0 = kernel_launches(backend);
    assert_int_equal(tb_sync(sync, 2), TB_OK);
    assert_int_equal(kernel_launches(backend) - k0, 2);
    read_values(d, got, 6);
    for (i = 0; i < 6; i++) {
        want[i] = exp(xv[i]);
        assert_true(fabs(got[i] - want[i]) <= 1e-5 * want[i]);
    }
    read_values(z, got, 6);
    for (i = 0; i < 6; i++)
        assert_true(fabs(got[i] - (want[i] * want[i] + 1.0)) <= 1e-5 * (want[i] * want[i] + 1.0));
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(d);
    tb_tensor_release(z);
    /* AdamW on the same model: with the gradients as tb_grad gives them, and detached */
    for (i = 0; i < 2; i++) {
        mlp_make(&m[i], &dev);
        params[0] = m[i].w1;
        params[1] = m[i].b1;
        params[2] = m[i].w2;
        params[3] = m[i].b2;
        opt[i] = tb_optimizer_new(&desc, params, 4);
        assert_non_null(opt[i]);
    }
    for (step = 0; step < 2; step++) {
        attached[step] = mlp_step_launches(&m[0], opt[0], backend, false);
        detached[step] = mlp_step_launches(&m[1], opt[1], backend, true);
    }
    print_message("%s: kernels per step %lld with the gradients attached, %lld detached\n", backend,
                  (long long)attached[1], (long long)detached[1]);
    assert_true(detached[1] > 0);
    assert_int_equal(attached[1], detached[1]);
    {
        double a[320], b[320];
        size_t n = read_values(m[0].w1, a, 320);
        assert_int_equal(read_values(m[1].w1, b, 320), n);
        for (i = 0; i < (int)n; i++)
            assert_true(a[i] == b[i]);
    }
    for (i = 0; i < 2; i++) {
        tb_optimizer_free(opt[i]);
        mlp_free(&m[i]);
    }
}

/* ReLU's backward masks the gradient with its result, as PyTorch does: the pre-activation
   then has no reader but the ReLU, so a layer's matmul, bias and ReLU stay one kernel in a
   training graph too, and the ReLU costs no kernel over the same layer without it. The
   kernels of a sync of sum((x w + b)^2), or of sum(relu(x w + b)^2), and their gradients. */
static int64_t layer_grad_launches(const char *backend, const tb_device *dev, bool relu) {
    tb_shape s;
    tb_tensor *x, *w, *b, *mm, *z, *h, *h2, *loss, *in[2], *g[2] = {NULL, NULL}, *sync[3];
    int64_t k0;
    int i;
    assert_int_equal(tb_manual_seed(3), TB_OK);
    s = tb_shape_of(TB_F32, 2, 64, 48);
    x = tb_randn(&s, dev);
    s = tb_shape_of(TB_F32, 2, 48, 32);
    w = tb_randn(&s, dev);
    s = tb_shape_of(TB_F32, 1, 32);
    b = tb_randn(&s, dev);
    assert_int_equal(tb_set_requires_grad(w, true), TB_OK);
    assert_int_equal(tb_set_requires_grad(b, true), TB_OK);
    sync[0] = x;
    sync[1] = w;
    sync[2] = b;
    assert_int_equal(tb_sync(sync, 3), TB_OK);
    mm = tb_matmul(x, w);
    z = tb_add(mm, b);
    h = relu ? tb_relu(z) : tb_tensor_retain(z);
    h2 = tb_mul(h, h);
    loss = tb_sum(h2, NULL, 0, false);
    assert_non_null(loss);
    in[0] = w;
    in[1] = b;
    assert_int_equal(tb_grad(loss, NULL, in, 2, g), TB_OK);
    sync[0] = loss;
    sync[1] = g[0];
    sync[2] = g[1];
    k0 = kernel_launches(backend);
    assert_int_equal(tb_sync(sync, 3), TB_OK);
    k0 = kernel_launches(backend) - k0;
    for (i = 0; i < 2; i++)
        tb_tensor_release(g[i]);
    tb_tensor_release(loss);
    tb_tensor_release(h2);
    tb_tensor_release(h);
    tb_tensor_release(z);
    tb_tensor_release(mm);
    tb_tensor_release(b);
    tb_tensor_release(w);
    tb_tensor_release(x);
    return k0;
}

static void relu_backward_kernels(const char *backend) {
    tb_device dev;
    int64_t linear, relu;
    if (!device_of(backend, &dev)) skip();
    linear = layer_grad_launches(backend, &dev, false);
    relu = layer_grad_launches(backend, &dev, true);
    print_message("%s: a layer and its gradients in %lld kernels, %lld with a ReLU\n", backend,
                  (long long)linear, (long long)relu);
    assert_true(linear > 0);
    assert_int_equal(relu, linear);
}

static void test_relu_backward_kernels_opencl(void **state) {
    (void)state;
    relu_backward_kernels("opencl");
}
static void test_relu_backward_kernels_native(void **state) {
    (void)state;
    relu_backward_kernels("native");
}

static void test_identity_results_opencl(void **state) {
    (void)state;
    identity_results("opencl");
}
static void test_identity_results_native(void **state) {
    (void)state;
    identity_results("native");
}

/* ---- buffer donation: tb_assign's new value computed into the old value's buffer ---- */

/* A 3x3 f32 tensor holding base + 0, ..., base + 8. */
static tb_tensor *donation_param(const tb_device *dev, double base) {
    double v[9];
    int64_t dims[2] = {3, 3};
    int i;
    for (i = 0; i < 9; i++)
        v[i] = base + i;
    return upload(v, TB_F32, 2, dims, dev);
}

/* p takes value (released here), then p alone is synced; whether its buffer was donated. */
static bool donation_assign_sync(tb_tensor *p, tb_tensor *value) {
    int64_t d0 = tb_metrics_counter("DonatedBuffers");
    assert_non_null(value);
    assert_int_equal(tb_assign(p, value), TB_OK);
    tb_tensor_release(value);
    if (tb_sync(&p, 1) != TB_OK) fail_msg("sync: %s", tb_last_error());
    return tb_metrics_counter("DonatedBuffers") - d0 > 0;
}

static void expect_values(const char *what, tb_tensor *t, const double *want, size_t n) {
    double got[16];
    size_t i;
    assert_int_equal(read_values(t, got, 16), n);
    for (i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= 1e-5 * (1.0 + fabs(want[i]))))
            fail_msg("%s: element %zu is %g, expected %g", what, i, got[i], want[i]);
}

static void donation_cases(const char *backend) {
    tb_device dev;
    tb_tensor *p, *old, *r, *t, *s, *g;
    double want[9];
    bool compiled = strcmp(backend, "cpu") != 0;
    void *buffer;
    int i;
    if (!device_of(backend, &dev)) skip();

    /* nothing else reads the old value: the new one is computed into its buffer */
    p = donation_param(&dev, 1.0);
    buffer = tb_tensor_data(p)->payload;
    t = tb_add_scalar(p, 1.0);
    r = tb_mul_scalar(t, 2.0);
    tb_tensor_release(t); /* a live tensor reading the old value would keep it apart */
    assert_int_equal(donation_assign_sync(p, r), compiled);
    if (compiled) assert_ptr_equal(tb_tensor_data(p)->payload, buffer);
    for (i = 0; i < 9; i++)
        want[i] = 2.0 * (i + 2.0);
    expect_values("2 * (p + 1) in place", p, want, 9);
    tb_tensor_release(p);

    /* a live tensor holds the old value: the new value gets a buffer of its own */
    p = donation_param(&dev, 1.0);
    old = tb_detach(p);
    assert_false(donation_assign_sync(p, tb_add_scalar(p, 1.0)));
    for (i = 0; i < 9; i++)
        want[i] = i + 1.0;
    expect_values("the detached old value", old, want, 9);
    tb_tensor_release(old);
    tb_tensor_release(p);

    /* a pending tensor left out of the sync reads the old value later */
    p = donation_param(&dev, 1.0);
    r = tb_mul_scalar(p, 3.0);
    assert_false(donation_assign_sync(p, tb_add_scalar(p, 1.0)));
    for (i = 0; i < 9; i++)
        want[i] = 3.0 * (i + 1.0);
    expect_values("3 * the old value, synced after the assignment", r, want, 9);
    tb_tensor_release(r);
    tb_tensor_release(p);

    /* the new value reads the old one at other elements (p + p^T): not in place */
    p = donation_param(&dev, 1.0);
    t = tb_transpose(p, 0, 1);
    r = tb_add(p, t);
    tb_tensor_release(t);
    assert_false(donation_assign_sync(p, r));
    for (i = 0; i < 9; i++)
        want[i] = (i + 1.0) + ((i % 3) * 3 + i / 3 + 1.0);
    expect_values("p + p^T", p, want, 9);
    tb_tensor_release(p);

    /* ... or through a reduction that runs before the update: in place */
    p = donation_param(&dev, 1.0);
    s = tb_sum(p, NULL, 0, false);
    r = tb_add(p, s);
    tb_tensor_release(s);
    assert_int_equal(donation_assign_sync(p, r), compiled);
    for (i = 0; i < 9; i++)
        want[i] = i + 1.0 + 45.0;
    expect_values("p + sum(p)", p, want, 9);
    tb_tensor_release(p);

    /* a run that fails (an index out of range) before it writes in place: the old value is
       intact and the assignment can still be synced */
    {
        double bad[3] = {0, 5, 0};
        int64_t idims[2] = {1, 3};
        tb_tensor *index = upload(bad, TB_I64, 2, idims, &dev), *both[2];
        int64_t d0 = tb_metrics_counter("DonatedBuffers");
        p = donation_param(&dev, 1.0);
        g = tb_gather(p, 0, index);
        t = tb_add_scalar(p, 1.0);
        assert_int_equal(tb_assign(p, t), TB_OK);
        tb_tensor_release(t);
        both[0] = g;
        both[1] = p;
        assert_int_equal(tb_sync(both, 2), TB_ERR_EXECUTE);
        assert_non_null(strstr(tb_last_error(), "out of range"));
        assert_int_equal(tb_metrics_counter("DonatedBuffers"), d0);
        tb_tensor_release(g);
        assert_int_equal(tb_sync(&p, 1), TB_OK);
        for (i = 0; i < 9; i++)
            want[i] = i + 2.0;
        expect_values("p + 1 after a failed run", p, want, 9);
        tb_tensor_release(p);
        tb_tensor_release(index);
    }

    /* a gradient through a history that read the overwritten value: an error, not a wrong
       value (PyTorch refuses a backward through a value modified in place) */
    {
        tb_tensor *x = donation_param(&dev, 1.0), *w = donation_param(&dev, 10.0), *xw, *y;
        tb_tensor *grad = NULL;
        assert_int_equal(tb_set_requires_grad(x, true), TB_OK);
        assert_int_equal(tb_set_requires_grad(w, true), TB_OK);
        xw = tb_mul(x, w);
        y = tb_sum(xw, NULL, 0, false);
        tb_tensor_release(xw);
        assert_int_equal(tb_sync(&y, 1), TB_OK); /* y keeps its history */
        assert_int_equal(donation_assign_sync(w, tb_add_scalar(w, -0.5)), compiled);
        assert_int_equal(tb_grad(y, NULL, &x, 1, &grad), TB_OK);
        if (compiled) {
            assert_int_equal(tb_sync(&grad, 1), TB_ERR_INVALID_ARGUMENT);
            assert_non_null(strstr(tb_last_error(), "tb_assign"));
        } else {
            for (i = 0; i < 9; i++)
                want[i] = 10.0 + i; /* dy/dx is w as it was */
            expect_values("dy/dx", grad, want, 9);
        }
        tb_tensor_release(grad);
        tb_tensor_release(y);
        tb_tensor_release(x);
        tb_tensor_release(w);
    }
}

static void test_donation_cpu(void **state) {
    (void)state;
    donation_cases("cpu");
}
static void test_donation_opencl(void **state) {
    (void)state;
    donation_cases("opencl");
}
static void test_donation_native(void **state) {
    (void)state;
    donation_cases("native");
}

/* ---- a NaN in the loss or the gradients: refused, nothing changes ---- */

static void test_nonfinite_step_refused(void **state) {
    tb_device dev;
    mlp m;
    tb_optimizer *opt;
    tb_optimizer_desc d = tb_sgd_desc(0.1);
    tb_tensor *params[4], *xbad, *nanv, *loss, *grads[4] = {NULL, NULL, NULL, NULL};
    double before[320], after[320];
    size_t n;
    int i;
    (void)state;
    assert_int_equal(tb_device_make("cpu", 0, &dev), TB_OK);
    mlp_make(&m, &dev);
    params[0] = m.w1;
    params[1] = m.b1;
    params[2] = m.w2;
    params[3] = m.b2;
    d.momentum = 0.9;
    opt = tb_optimizer_new(&d, params, 4);
    assert_non_null(opt);
    assert_int_equal(tb_optimizer_set_check_finite(opt, true), TB_OK);
    mlp_step(&m, opt, m.x); /* a good step first */
    n = read_values(m.w1, before, 320);
    nanv = tb_scalar_tensor(tb_scalar_f(TB_F32, NAN), &dev);
    xbad = tb_mul(m.x, nanv);
    loss = mlp_loss(&m, xbad);
    assert_int_equal(tb_grad(loss, NULL, params, 4, grads), TB_OK);
    assert_int_equal(tb_optimizer_step(opt, grads, &loss, 1), TB_ERR_EXECUTE);
    assert_non_null(strstr(tb_last_error(), "also[0]"));
    assert_non_null(strstr(tb_last_error(), "no parameter was updated"));
    assert_int_equal(tb_optimizer_steps(opt), 1);
    read_values(m.w1, after, 320);
    assert_memory_equal(before, after, n * sizeof(double));
    for (i = 0; i < 4; i++)
        tb_tensor_release(grads[i]);
    tb_tensor_release(loss);
    /* the optimizer goes on from where it was */
    mlp_step(&m, opt, m.x);
    assert_int_equal(tb_optimizer_steps(opt), 2);
    tb_tensor_release(xbad);
    tb_tensor_release(nanv);
    tb_optimizer_free(opt);
    mlp_free(&m);
}

/* ---- dropout: the same mask everywhere, the right fraction, the right scale ---- */

static void test_dropout(void **state) {
    static float got[3][4096];
    tb_shape s = tb_shape_of(TB_F32, 2, 64, 64);
    int b, kept = 0, i, have = 0;
    (void)state;
    for (b = 0; b < 3; b++) {
        tb_device dev;
        tb_tensor *x, *y;
        if (tb_device_make(g_backends[b], 0, &dev) != TB_OK) {
            tb_clear_error();
            continue;
        }
        assert_int_equal(tb_manual_seed(1234), TB_OK);
        x = tb_ones(&s, &dev);
        y = tb_dropout(x, 0.25, true);
        assert_non_null(y);
        assert_int_equal(tb_tensor_to_host(y, got[b], sizeof got[b]), TB_OK);
        if (b > 0) assert_memory_equal(got[0], got[b], sizeof got[0]);
        have++;
        tb_tensor_release(y);
        /* not training, or p = 0: the input itself */
        y = tb_dropout(x, 0.25, false);
        assert_ptr_equal(y, x);
        tb_tensor_release(y);
        tb_tensor_release(x);
    }
    assert_true(have >= 1);
    for (i = 0; i < 4096; i++) {
        assert_true(got[0][i] == 0.0f || fabsf(got[0][i] - 1.0f / 0.75f) < 1e-6f);
        kept += got[0][i] != 0.0f;
    }
    /* 3072 expected; 6 standard deviations either side */
    assert_true(kept > 3072 - 170 && kept < 3072 + 170);
}

/* ---- clipping and accumulation ---- */

static void test_clip_and_accumulate(void **state) {
    tb_device dev;
    double a[4] = {3, 0, 0, 0}, b[3] = {0, 4, 0}, got[4], norm;
    int64_t da[1] = {4}, db[1] = {3};
    tb_tensor *g[3], *total = NULL, *acc[2] = {NULL, NULL};
    (void)state;
    assert_int_equal(tb_device_make("cpu", 0, &dev), TB_OK);
    g[0] = upload(a, TB_F32, 1, da, &dev);
    g[1] = NULL;
    g[2] = upload(b, TB_F64, 1, db, &dev);
    /* norm 5, max 1: scaled by 1 / (5 + 1e-6) */
    assert_int_equal(tb_clip_grad_norm(g, 3, 1.0, &total), TB_OK);
    read_values(total, &norm, 1);
    assert_true(fabs(norm - 5.0) < 1e-12);
    assert_int_equal(tb_tensor_shape(total).dtype, TB_F64);
    read_values(g[0], got, 4);
    assert_true(fabs(got[0] - 3.0 / (5.0 + 1e-6)) < 1e-6);
    read_values(g[2], got, 3);
    assert_true(fabs(got[1] - 4.0 / (5.0 + 1e-6)) < 1e-12);
    tb_tensor_release(total);
    /* below the limit nothing changes */
    assert_int_equal(tb_clip_grad_norm(g, 3, 10.0, NULL), TB_OK);
    read_values(g[2], got, 3);
    assert_true(fabs(got[1] - 4.0 / (5.0 + 1e-6)) < 1e-12);
    /* accumulation: NULL takes the gradient, then sums in place */
    assert_int_equal(tb_accumulate_grads(acc, g, 1), TB_OK);
    assert_ptr_equal(acc[0], g[0]);
    assert_int_equal(tb_accumulate_grads(acc, g, 1), TB_OK);
    read_values(acc[0], got, 4);
    assert_true(fabs(got[0] - 6.0 / (5.0 + 1e-6)) < 1e-5);
    read_values(g[0], got, 4); /* acc[0] was g[0]'s handle: assigned in place */
    assert_true(fabs(got[0] - 6.0 / (5.0 + 1e-6)) < 1e-5);
    assert_int_equal(tb_accumulate_grads(acc, &g[2], 1), TB_ERR_SHAPE);
    tb_tensor_release(acc[0]);
    tb_tensor_release(g[0]);
    tb_tensor_release(g[2]);
}

/* ---- bad input: an error and a message, nothing changed ---- */

static void test_bad_input(void **state) {
    tb_device dev;
    problem p;
    tb_tensor *params[2], *grads[2], *ints, *loss;
    tb_optimizer_desc d = tb_adam_desc(0.01);
    tb_optimizer *opt;
    double w0[12], w1[12];
    double l[6] = {1, 2, 3, 4, 5, 6};
    int64_t dims[2] = {2, 3}, td[1] = {2};
    (void)state;
    assert_int_equal(tb_device_make("cpu", 0, &dev), TB_OK);
    problem_make(&p, TB_F32, &dev);
    params[0] = p.w;
    params[1] = p.b;
    /* descs */
    assert_null(tb_optimizer_new(NULL, params, 2));
    d.lr = -1;
    assert_null(tb_optimizer_new(&d, params, 2));
    assert_non_null(strstr(tb_last_error(), "lr"));
    d = tb_adam_desc(0.01);
    d.beta2 = 1.0;
    assert_null(tb_optimizer_new(&d, params, 2));
    assert_non_null(strstr(tb_last_error(), "beta2"));
    d = tb_sgd_desc(0.1);
    d.nesterov = true;
    assert_null(tb_optimizer_new(&d, params, 2));
    assert_non_null(strstr(tb_last_error(), "nesterov"));
    d.kind = (tb_optimizer_kind)9;
    assert_null(tb_optimizer_new(&d, params, 2));
    d = tb_sgd_desc(0.1);
    params[1] = p.w;
    assert_null(tb_optimizer_new(&d, params, 2));
    assert_non_null(strstr(tb_last_error(), "again"));
    params[1] = p.y;
    assert_null(tb_optimizer_new(&d, params, 2));
    assert_int_equal(tb_last_status(), TB_ERR_DTYPE);
    params[1] = p.b;
    opt = tb_optimizer_new(&d, params, 2);
    assert_non_null(opt);
    /* steps */
    read_values(p.w, w0, 12);
    assert_int_equal(tb_optimizer_step(NULL, NULL, NULL, 0), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_optimizer_step(opt, NULL, NULL, 0), TB_ERR_INVALID_ARGUMENT);
    grads[0] = p.b; /* wrong shape */
    grads[1] = NULL;
    assert_int_equal(tb_optimizer_step(opt, grads, NULL, 0), TB_ERR_SHAPE);
    assert_non_null(strstr(tb_last_error(), "grads[0]"));
    assert_int_equal(tb_optimizer_step(opt, grads, NULL, 1), TB_ERR_INVALID_ARGUMENT);
    grads[0] = NULL;
    assert_int_equal(tb_optimizer_step(opt, grads, NULL, 0), TB_OK); /* nothing to do */
    read_values(p.w, w1, 12);
    assert_memory_equal(w0, w1, sizeof w0);
    assert_int_equal(tb_optimizer_set_lr(opt, 0.0), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_optimizer_set_lr(NULL, 0.1), TB_ERR_INVALID_ARGUMENT);
    assert_true(tb_optimizer_lr(opt) == 0.1);
    tb_optimizer_free(opt);
    tb_optimizer_free(NULL);
    /* losses (a NULL operand keeps an earlier call's error, as the ops do; none here) */
    tb_clear_error();
    loss = tb_cross_entropy(NULL, p.y, TB_REDUCTION_MEAN, 0.0);
    assert_null(loss);
    assert_non_null(strstr(tb_last_error(), "logits is NULL"));
    ints = upload(l, TB_I64, 2, dims, &dev);
    assert_null(tb_cross_entropy(ints, p.y, TB_REDUCTION_MEAN, 0.0));
    assert_int_equal(tb_last_status(), TB_ERR_DTYPE);
    assert_null(tb_cross_entropy(p.x, p.y, (tb_reduction)7, 0.0));
    assert_non_null(strstr(tb_last_error(), "reduction"));
    assert_null(tb_cross_entropy(p.x, p.y, TB_REDUCTION_MEAN, 1.5));
    assert_non_null(strstr(tb_last_error(), "label_smoothing"));
    {
        tb_tensor *short_y = upload(l, TB_I64, 1, td, &dev);
        assert_null(tb_cross_entropy(p.x, short_y, TB_REDUCTION_MEAN, 0.0));
        assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
        assert_null(tb_nll_loss(p.x, short_y, TB_REDUCTION_SUM));
        assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
        tb_tensor_release(short_y);
    }
    assert_null(tb_nll_loss(p.x, p.x, TB_REDUCTION_SUM)); /* float target: indices only */
    assert_int_equal(tb_last_status(), TB_ERR_DTYPE);
    assert_null(tb_mse_loss(p.x, p.w, TB_REDUCTION_MEAN));
    assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
    assert_null(tb_dropout(p.x, 1.5, true));
    assert_null(tb_dropout(p.x, NAN, true));
    assert_null(tb_dropout(ints, 0.5, true));
    assert_int_equal(tb_last_status(), TB_ERR_DTYPE);
    assert_int_equal(tb_clip_grad_norm(params, 2, -1.0, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_clip_grad_norm(&ints, 1, 1.0, NULL), TB_ERR_DTYPE);
    tb_tensor_release(ints);
    problem_free(&p);
}

static int teardown(void **state) {
    int i;
    (void)state;
    for (i = 0; i < g_num_torch; i++)
        free(g_torch[i].v);
    tb_shutdown();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optim_cpu),
        cmocka_unit_test(test_optim_opencl),
        cmocka_unit_test(test_optim_native),
        cmocka_unit_test(test_losses_cpu),
        cmocka_unit_test(test_losses_opencl),
        cmocka_unit_test(test_compiles_once_cpu),
        cmocka_unit_test(test_compiles_once_opencl),
        cmocka_unit_test(test_compiles_once_native),
        cmocka_unit_test(test_identity_results_opencl),
        cmocka_unit_test(test_identity_results_native),
        cmocka_unit_test(test_relu_backward_kernels_opencl),
        cmocka_unit_test(test_relu_backward_kernels_native),
        cmocka_unit_test(test_donation_cpu),
        cmocka_unit_test(test_donation_opencl),
        cmocka_unit_test(test_donation_native),
        cmocka_unit_test(test_nonfinite_step_refused),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_clip_and_accumulate),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests_name("train", tests, NULL, teardown);
}
