/* The training case, mlp_train: one step of an MLP (784-512-512-10, ReLU, batch 256,
   cross-entropy from logits with integer targets, AdamW with lr 1e-3 and PyTorch's other
   defaults, f32), on fixed random data. Its sides:
       ours           the forward pass recorded, tb_cross_entropy, tb_grad for the gradients and
                      tb_optimizer_step: one graph per step, on each compiled backend
       ours_detached  the same with the gradients passed through tb_detach before the
                      optimizer step (a note compares it; see TRAIN_DETACHED)
       hand_written   the same step from the library's plain ops on the same backend: the
                      backward pass written out (matmuls with transposes, ReLU masks with tb_gt
                      and tb_where, softmax minus one-hot, bias gradients as sums), the AdamW
                      formulas as ops, the results synced in one graph and put in place with
                      tb_assign; hand time / our time is what autograd and the optimizer cost
       openblas       the step in C on the host: cblas_sgemm for the matmuls, plain loops (one
                      thread) for the rest
       pytorch        torch.nn.functional and torch.optim.AdamW, loss.backward(), opt.step()
   Every side starts from the same parameters; after TRAIN_CHECK_STEPS steps its losses and
   parameters are checked against ours on the cpu reference backend, then the sides are timed
   (each keeps training), then each of our sides runs a few more steps that must leave the
   device's bytes in use where they were (and should leave the host heap: LEAK where not). */
#define _GNU_SOURCE
#include "bench.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#define TRAIN_LAYERS      3
#define TRAIN_PARAMS      (2 * TRAIN_LAYERS) /* w0 b0 w1 b1 w2 b2 */
#define TRAIN_CHECK_STEPS 3
#define TRAIN_LR          1e-3
#define TRAIN_COOLDOWN    0.15 /* BLAS threads spin after a call: see BLAS_COOLDOWN in cases.c */

static const int64_t g_train_sizes[TRAIN_LAYERS + 1] = {784, 512, 512, 10};

/* The fixed data and initial parameters on the host (our layout: w is [in, out]). */
typedef struct train_data {
    int64_t batch;
    float *x;
    int64_t *y;
    float *p[TRAIN_PARAMS];
    size_t n[TRAIN_PARAMS];
    size_t total; /* the parameters' elements */
} train_data;

static void param_dims(int i, int64_t *dims, int32_t *rank) {
    int l = i / 2;
    if (i % 2 == 0) {
        dims[0] = g_train_sizes[l];
        dims[1] = g_train_sizes[l + 1];
        *rank = 2;
    } else {
        dims[0] = g_train_sizes[l + 1];
        *rank = 1;
    }
}

/* x uniform in [-1, 1), targets uniform over the classes, parameters as nn.Linear initialises
   them (uniform in +-1/sqrt(fan_in)). */
static void train_data_init(train_data *d, int64_t batch) {
    int i;
    int64_t r, classes = g_train_sizes[TRAIN_LAYERS];
    float *u;
    memset(d, 0, sizeof *d);
    d->batch = batch;
    seed_rng(11);
    d->x = host_random((size_t)(batch * g_train_sizes[0]), 1.0f);
    u = host_random((size_t)batch, 1.0f);
    d->y = (int64_t *)malloc((size_t)batch * sizeof(int64_t));
    if (d->y == NULL) die("out of host memory");
    for (r = 0; r < batch; r++) {
        int64_t c = (int64_t)((u[r] + 1.0f) * 0.5f * (float)classes);
        d->y[r] = c < 0 ? 0 : (c >= classes ? classes - 1 : c);
    }
    free(u);
    for (i = 0; i < TRAIN_PARAMS; i++) {
        int l = i / 2;
        d->n[i] =
            (size_t)(i % 2 == 0 ? g_train_sizes[l] * g_train_sizes[l + 1] : g_train_sizes[l + 1]);
        d->p[i] = host_random(d->n[i], (float)(1.0 / sqrt((double)g_train_sizes[l])));
        d->total += d->n[i];
    }
}

static void train_data_free(train_data *d) {
    int i;
    free(d->x);
    free(d->y);
    for (i = 0; i < TRAIN_PARAMS; i++)
        free(d->p[i]);
}

/* What a side gives for the check: the loss of each check step, then every parameter
   flattened in our layout (w0 b0 w1 b1 w2 b2). */
static size_t check_len(const train_data *d) {
    return TRAIN_CHECK_STEPS + d->total;
}

/* ======================================================================================
   ours and hand-written: the library on one backend
   ====================================================================================== */

/* Our three ways of writing the step. ours_detached passes tb_detach'ed gradients to
   tb_optimizer_step: tb_grad's gradients require grad (they keep the graph they came from, so
   that gradients of gradients work), and the optimizer's state computed from them keeps its
   history; detaching shows what the step costs without that. */
enum { TRAIN_OURS, TRAIN_DETACHED, TRAIN_HAND, TRAIN_KINDS };
static const char *const g_train_kind[TRAIN_KINDS] = {"ours", "ours_detached", "hand_written"};

typedef struct train_tb {
    const bench_backend *be; /* NULL: the cpu reference backend */
    tb_device dev;
    int kind;
    int64_t batch;
    tb_tensor *x, *y, *p[TRAIN_PARAMS];
    tb_optimizer *opt;                            /* ours */
    tb_tensor *m[TRAIN_PARAMS], *v[TRAIN_PARAMS]; /* hand-written: AdamW's state */
    int64_t steps;                                /* hand-written: steps taken */
    tb_optimizer_desc desc;
    double t_grad, t_step; /* ours: recording the forward pass, loss and tb_grad; the
                              optimizer step (its recording and the sync) */
} train_tb;

static void train_tb_init(train_tb *t, const train_data *d, const bench_backend *be, int kind) {
    tb_shape s;
    int i;
    memset(t, 0, sizeof *t);
    t->be = be;
    t->dev = be != NULL ? be->dev : g_cpu;
    t->kind = kind;
    t->batch = d->batch;
    t->desc = tb_adamw_desc(TRAIN_LR);
    {
        int64_t dims[2] = {d->batch, g_train_sizes[0]};
        t->x = upload(d->x, 2, dims, &t->dev);
    }
    need_ok(tb_shape_make(&s, TB_I64, 1, &d->batch), "tb_shape_make");
    t->y = need(tb_tensor_from_host(d->y, &s, &t->dev), "tb_tensor_from_host (targets)");
    for (i = 0; i < TRAIN_PARAMS; i++) {
        int64_t dims[2];
        int32_t rank;
        param_dims(i, dims, &rank);
        t->p[i] = upload(d->p[i], rank, dims, &t->dev);
        if (kind == TRAIN_HAND) {
            need_ok(tb_shape_make(&s, TB_F32, rank, dims), "tb_shape_make");
            t->m[i] = need(tb_zeros(&s, &t->dev), "tb_zeros");
            t->v[i] = need(tb_zeros(&s, &t->dev), "tb_zeros");
            need_ok(tb_sync(&t->m[i], 1), "tb_sync (AdamW state)");
            need_ok(tb_sync(&t->v[i], 1), "tb_sync (AdamW state)");
        } else {
            need_ok(tb_set_requires_grad(t->p[i], true), "tb_set_requires_grad");
        }
    }
    if (kind != TRAIN_HAND) {
        t->opt = tb_optimizer_new(&t->desc, t->p, TRAIN_PARAMS);
        if (t->opt == NULL) die("tb_optimizer_new: %s", tb_last_error());
    }
}

static void train_tb_release(train_tb *t) {
    int i;
    tb_optimizer_free(t->opt);
    tb_tensor_release(t->x);
    tb_tensor_release(t->y);
    for (i = 0; i < TRAIN_PARAMS; i++) {
        tb_tensor_release(t->p[i]);
        tb_tensor_release(t->m[i]);
        tb_tensor_release(t->v[i]);
    }
    memset(t, 0, sizeof *t);
}

/* The logits of the batch: matmul, bias, ReLU, as a user writes it (temporaries released). */
static tb_tensor *train_forward(const train_tb *t) {
    tb_tensor *h = tb_tensor_retain(t->x);
    int l;
    for (l = 0; l < TRAIN_LAYERS; l++) {
        tb_tensor *mm = tb_matmul(h, t->p[2 * l]);
        tb_tensor *z = tb_add(mm, t->p[2 * l + 1]);
        tb_tensor_release(mm);
        tb_tensor_release(h);
        if (l + 1 < TRAIN_LAYERS) {
            h = tb_relu(z);
            tb_tensor_release(z);
        } else {
            h = z;
        }
    }
    return need(h, "mlp_train forward");
}

/* One step of ours; returns the loss (synced with the step). */
static tb_tensor *ours_step(train_tb *t) {
    tb_tensor *z, *loss, *grads[TRAIN_PARAMS];
    double t0 = now_s(), t1;
    int i;
    z = train_forward(t);
    loss = need(tb_cross_entropy(z, t->y, TB_REDUCTION_MEAN, 0.0), "tb_cross_entropy");
    need_ok(tb_grad(loss, NULL, t->p, TRAIN_PARAMS, grads), "tb_grad");
    if (t->kind == TRAIN_DETACHED) {
        for (i = 0; i < TRAIN_PARAMS; i++) {
            tb_tensor *g = need(tb_detach(grads[i]), "tb_detach");
            tb_tensor_release(grads[i]);
            grads[i] = g;
        }
    }
    t1 = now_s();
    need_ok(tb_optimizer_step(t->opt, grads, &loss, 1), "tb_optimizer_step");
    t->t_grad = t1 - t0;
    t->t_step = now_s() - t1;
    for (i = 0; i < TRAIN_PARAMS; i++)
        tb_tensor_release(grads[i]);
    tb_tensor_release(z);
    return loss;
}

/* The hand-written step's tensors, released together at its end. */
typedef struct train_arena {
    tb_tensor *t[160];
    int n;
} train_arena;

static tb_tensor *kept(train_arena *a, tb_tensor *t) {
    need(t, "mlp_train hand-written step");
    if (a->n >= (int)(sizeof a->t / sizeof a->t[0])) die("mlp_train: the arena is full");
    a->t[a->n++] = t;
    return t;
}

/* One step written with the library's plain ops; returns the loss (synced with the step). */
static tb_tensor *hand_step(train_tb *t) {
    const tb_optimizer_desc *o = &t->desc;
    train_arena arena;
    tb_tensor *act[TRAIN_LAYERS], *grads[TRAIN_PARAMS], *sync[3 * TRAIN_PARAMS + 1];
    tb_tensor *zero, *z = NULL, *logp, *onehot, *loss, *d;
    const double inv_b = 1.0 / (double)t->batch;
    double bc1, bc2;
    int32_t axis0 = 0, axis1 = 1;
    int l, i;
    arena.n = 0;
#define KEEP(expr) kept(&arena, (expr))
    zero = KEEP(tb_scalar_tensor(tb_scalar_f(TB_F32, 0.0), &t->dev));
    /* forward: act[l] is the input of layer l */
    act[0] = t->x;
    for (l = 0; l < TRAIN_LAYERS; l++) {
        tb_tensor *a = KEEP(tb_add(KEEP(tb_matmul(act[l], t->p[2 * l])), t->p[2 * l + 1]));
        if (l + 1 < TRAIN_LAYERS) {
            act[l + 1] = KEEP(tb_relu(a));
        } else {
            z = a;
        }
    }
    /* loss = -mean over the rows of log_softmax(z) at the target */
    onehot = KEEP(tb_cast(
        KEEP(tb_eq(KEEP(tb_unsqueeze(t->y, 1)),
                   KEEP(tb_arange(0, (double)g_train_sizes[TRAIN_LAYERS], 1, TB_I64, &t->dev)))),
        TB_F32));
    logp = KEEP(tb_log_softmax(z, axis1));
    loss = KEEP(tb_mul_scalar(KEEP(tb_sum(KEEP(tb_mul(onehot, logp)), NULL, 0, false)), -inv_b));
    /* backward: d is the gradient of layer l's output before its ReLU */
    d = KEEP(tb_mul_scalar(KEEP(tb_sub(KEEP(tb_softmax(z, axis1)), onehot)), inv_b));
    for (l = TRAIN_LAYERS - 1; l >= 0; l--) {
        grads[2 * l] = KEEP(tb_matmul(KEEP(tb_transpose(act[l], 0, 1)), d));
        grads[2 * l + 1] = KEEP(tb_sum(d, &axis0, 1, false));
        if (l > 0) {
            tb_tensor *dh = KEEP(tb_matmul(d, KEEP(tb_transpose(t->p[2 * l], 0, 1))));
            d = KEEP(tb_where(KEEP(tb_gt(act[l], zero)), dh, zero));
        }
    }
    /* AdamW, as torch.optim.AdamW (PyTorch 1.13) computes it */
    t->steps++;
    bc1 = 1.0 - pow(o->beta1, (double)t->steps);
    bc2 = 1.0 - pow(o->beta2, (double)t->steps);
    for (i = 0; i < TRAIN_PARAMS; i++) {
        tb_tensor *g = grads[i], *p, *m, *v, *denom;
        p = KEEP(tb_mul_scalar(t->p[i], 1.0 - o->lr * o->weight_decay));
        m = KEEP(
            tb_add(KEEP(tb_mul_scalar(t->m[i], o->beta1)), KEEP(tb_mul_scalar(g, 1.0 - o->beta1))));
        v = KEEP(tb_add(KEEP(tb_mul_scalar(t->v[i], o->beta2)),
                        KEEP(tb_mul_scalar(KEEP(tb_mul(g, g)), 1.0 - o->beta2))));
        denom = KEEP(tb_add_scalar(KEEP(tb_div_scalar(KEEP(tb_sqrt(v)), sqrt(bc2))), o->eps));
        p = KEEP(tb_sub(p, KEEP(tb_mul_scalar(KEEP(tb_div(m, denom)), o->lr / bc1))));
        sync[3 * i] = p;
        sync[3 * i + 1] = m;
        sync[3 * i + 2] = v;
    }
#undef KEEP
    sync[3 * TRAIN_PARAMS] = loss;
    need_ok(tb_sync(sync, 3 * TRAIN_PARAMS + 1), "tb_sync (hand-written step)");
    for (i = 0; i < TRAIN_PARAMS; i++) {
        need_ok(tb_assign(t->p[i], sync[3 * i]), "tb_assign (parameter)");
        need_ok(tb_assign(t->m[i], sync[3 * i + 1]), "tb_assign (exp_avg)");
        need_ok(tb_assign(t->v[i], sync[3 * i + 2]), "tb_assign (exp_avg_sq)");
    }
    tb_tensor_retain(loss);
    for (i = 0; i < arena.n; i++)
        tb_tensor_release(arena.t[i]);
    return loss;
}

static tb_tensor *train_tb_step(train_tb *t) {
    return t->kind == TRAIN_HAND ? hand_step(t) : ours_step(t);
}

/* A side's run: one step, finished (clFinish on OpenCL), its loss released. */
static void train_tb_run(void *p) {
    train_tb *t = (train_tb *)p;
    tb_tensor *loss = train_tb_step(t);
    if (t->be != NULL && t->be->opencl) finish();
    tb_tensor_release(loss);
}

/* The check steps: their losses, then the parameters (check_len floats, malloc'd). */
static float *train_tb_check(train_tb *t, const train_data *d) {
    float *out = host_alloc(check_len(d));
    size_t at = TRAIN_CHECK_STEPS;
    int s, i;
    for (s = 0; s < TRAIN_CHECK_STEPS; s++) {
        tb_tensor *loss = train_tb_step(t);
        need_ok(tb_tensor_to_host(loss, &out[s], sizeof(float)), "tb_tensor_to_host (loss)");
        tb_tensor_release(loss);
    }
    for (i = 0; i < TRAIN_PARAMS; i++) {
        need_ok(tb_tensor_to_host(t->p[i], out + at, d->n[i] * sizeof(float)),
                "tb_tensor_to_host (parameter)");
        at += d->n[i];
    }
    return out;
}

/* ======================================================================================
   openblas: the step in C on the host
   ====================================================================================== */

typedef struct train_host {
    const train_data *d;
    float *p[TRAIN_PARAMS], *m[TRAIN_PARAMS], *v[TRAIN_PARAMS], *g[TRAIN_PARAMS];
    float *act[TRAIN_LAYERS + 1];  /* act[0] unused (the input), act[3] the logits */
    float *dact[TRAIN_LAYERS + 1]; /* gradients of the layers' outputs */
    int64_t steps;
    float loss;
} train_host;

static void train_host_init(train_host *h, const train_data *d) {
    int i, l;
    memset(h, 0, sizeof *h);
    h->d = d;
    for (i = 0; i < TRAIN_PARAMS; i++) {
        h->p[i] = host_alloc(d->n[i]);
        memcpy(h->p[i], d->p[i], d->n[i] * sizeof(float));
        h->m[i] = host_alloc(d->n[i]);
        h->v[i] = host_alloc(d->n[i]);
        h->g[i] = host_alloc(d->n[i]);
        memset(h->m[i], 0, d->n[i] * sizeof(float));
        memset(h->v[i], 0, d->n[i] * sizeof(float));
    }
    for (l = 1; l <= TRAIN_LAYERS; l++) {
        h->act[l] = host_alloc((size_t)(d->batch * g_train_sizes[l]));
        h->dact[l] = host_alloc((size_t)(d->batch * g_train_sizes[l]));
    }
}

static void train_host_free(train_host *h) {
    int i, l;
    for (i = 0; i < TRAIN_PARAMS; i++) {
        free(h->p[i]);
        free(h->m[i]);
        free(h->v[i]);
        free(h->g[i]);
    }
    for (l = 1; l <= TRAIN_LAYERS; l++) {
        free(h->act[l]);
        free(h->dact[l]);
    }
}

/* bias[j] = the sum over the rows of d[r][j] */
static void column_sums(const float *d, int64_t rows, int64_t cols, float *out) {
    int64_t r, j;
    memset(out, 0, (size_t)cols * sizeof(float));
    for (r = 0; r < rows; r++)
        for (j = 0; j < cols; j++)
            out[j] += d[r * cols + j];
}

static void train_host_run(void *p) {
    train_host *h = (train_host *)p;
    const train_data *d = h->d;
    const tb_optimizer_desc o = tb_adamw_desc(TRAIN_LR);
    const int64_t b = d->batch, classes = g_train_sizes[TRAIN_LAYERS];
    const float inv_b = (float)(1.0 / (double)b);
    double bc1, bc2, loss = 0;
    int64_t r, j;
    int l, i;
    /* forward: the bias copied into each row, sgemm with beta 1, ReLU in place */
    for (l = 0; l < TRAIN_LAYERS; l++) {
        const float *in = l == 0 ? d->x : h->act[l];
        float *out = h->act[l + 1];
        int k = (int)g_train_sizes[l], n = (int)g_train_sizes[l + 1];
        for (r = 0; r < b; r++)
            memcpy(out + r * n, h->p[2 * l + 1], (size_t)n * sizeof(float));
        openblas_gemm(0, 0, (int)b, n, k, in, h->p[2 * l], 1.0f, out);
        if (l + 1 < TRAIN_LAYERS)
            for (j = 0; j < b * n; j++)
                out[j] = out[j] > 0 ? out[j] : 0;
    }
    /* the loss and its gradient: (softmax - one-hot) / batch */
    for (r = 0; r < b; r++) {
        const float *z = h->act[TRAIN_LAYERS] + r * classes;
        float *dz = h->dact[TRAIN_LAYERS] + r * classes, mx = -INFINITY, s = 0;
        for (j = 0; j < classes; j++)
            mx = z[j] > mx ? z[j] : mx;
        for (j = 0; j < classes; j++) {
            dz[j] = expf(z[j] - mx);
            s += dz[j];
        }
        loss += (double)(logf(s) + mx - z[d->y[r]]);
        for (j = 0; j < classes; j++)
            dz[j] = (dz[j] / s - (j == d->y[r] ? 1.0f : 0.0f)) * inv_b;
    }
    h->loss = (float)(loss / (double)b);
    /* backward: weight gradients act^T d, bias gradients column sums, then d W^T masked by
       the ReLU for the layer below */
    for (l = TRAIN_LAYERS - 1; l >= 0; l--) {
        const float *in = l == 0 ? d->x : h->act[l], *dl = h->dact[l + 1];
        int k = (int)g_train_sizes[l], n = (int)g_train_sizes[l + 1];
        openblas_gemm(1, 0, k, n, (int)b, in, dl, 0.0f, h->g[2 * l]);
        column_sums(dl, b, n, h->g[2 * l + 1]);
        if (l > 0) {
            float *dh = h->dact[l];
            openblas_gemm(0, 1, (int)b, k, n, dl, h->p[2 * l], 0.0f, dh);
            for (j = 0; j < b * k; j++)
                dh[j] = in[j] > 0 ? dh[j] : 0.0f;
        }
    }
    /* AdamW, as torch.optim.AdamW computes it */
    h->steps++;
    bc1 = 1.0 - pow(o.beta1, (double)h->steps);
    bc2 = 1.0 - pow(o.beta2, (double)h->steps);
    for (i = 0; i < TRAIN_PARAMS; i++) {
        float *pp = h->p[i], *m = h->m[i], *v = h->v[i];
        const float *g = h->g[i];
        const float decay = (float)(1.0 - o.lr * o.weight_decay), b1 = (float)o.beta1,
                    b2 = (float)o.beta2, c1 = (float)(1.0 - o.beta1), c2 = (float)(1.0 - o.beta2),
                    sbc2 = (float)sqrt(bc2), eps = (float)o.eps, step = (float)(o.lr / bc1);
        size_t e;
        for (e = 0; e < d->n[i]; e++) {
            m[e] = m[e] * b1 + g[e] * c1;
            v[e] = v[e] * b2 + g[e] * g[e] * c2;
            pp[e] = pp[e] * decay - m[e] / (sqrtf(v[e]) / sbc2 + eps) * step;
        }
    }
}

static float *train_host_check(train_host *h) {
    const train_data *d = h->d;
    float *out = host_alloc(check_len(d));
    size_t at = TRAIN_CHECK_STEPS;
    int s, i;
    for (s = 0; s < TRAIN_CHECK_STEPS; s++) {
        train_host_run(h);
        out[s] = h->loss;
    }
    for (i = 0; i < TRAIN_PARAMS; i++) {
        memcpy(out + at, h->p[i], d->n[i] * sizeof(float));
        at += d->n[i];
    }
    return out;
}

/* ======================================================================================
   the case
   ====================================================================================== */

/* A side's losses and parameters against the reference's. The losses must agree to 1e-4
   (relative). Parameters: after a few AdamW steps an element whose gradient is near zero
   can move by up to 2 lr on one side and not the other (the update is about lr times the
   gradient's sign, and summation order decides a tiny gradient's sign), so each parameter
   tensor is checked as a whole: at most one element in a thousand outside 1e-5 + 1e-4 |want|,
   and the difference's L2 norm at most 1e-2 of the L2 norm of the reference's update (want
   minus the initial value). Returns that relative update error, the largest over the
   tensors. */
static double check_train(const char *what, const float *got, const float *want,
                          const train_data *d) {
    size_t at = TRAIN_CHECK_STEPS, e, over;
    double worst = 0;
    int s, i;
    for (s = 0; s < TRAIN_CHECK_STEPS; s++) {
        double g = got[s], w = want[s];
        if (!(fabs(g - w) <= 1e-5 + 1e-4 * fabs(w)))
            die("%s: the loss of step %d is %.9g, expected %.9g", what, s + 1, g, w);
    }
    for (i = 0; i < TRAIN_PARAMS; i++) {
        const float *gp = got + at, *wp = want + at, *p0 = d->p[i];
        double err2 = 0, upd2 = 0, rel;
        over = 0;
        for (e = 0; e < d->n[i]; e++) {
            double g = gp[e], w = wp[e], diff = g - w;
            if (!isfinite(g)) die("%s: parameter %d element %zu is %g", what, i, e, g);
            if (!(fabs(diff) <= 1e-5 + 1e-4 * fabs(w))) over++;
            err2 += diff * diff;
            upd2 += (w - p0[e]) * (w - p0[e]);
        }
        rel = sqrt(err2) / (sqrt(upd2) > 0 ? sqrt(upd2) : 1.0);
        if (over > d->n[i] / 1000 || !(rel <= 1e-2))
            die("%s: parameter %d (%zu elements): %zu elements differ from the reference by "
                "more than 1e-5 + 1e-4 |want|; the difference is %.3g of the update's L2 norm",
                what, i, d->n[i], over, rel);
        if (rel > worst) worst = rel;
        at += d->n[i];
    }
    return worst;
}

static const char *bytes_counter(const bench_backend *be) {
    return be->opencl ? "OpenCL::BytesInUse" : "Native::BytesInUse";
}

/* A few more steps after the timing: the device's bytes in use and the host heap should not
   grow (every per-step tensor released, parameters and state replaced in place). Device
   memory that grows stops the benchmark; host heap growth (malloc's own bookkeeping moves a
   little) is noted (LEAK). Also gives the medians of the host split of ours. */
static void train_memory(train_tb *t, char *buf, size_t cap) {
    const int steps = 5;
    double grad[5], step[5], dev0, dev1;
    size_t heap0, heap1;
    int s, leak;
    train_tb_run(t); /* anything the timing left behind is settled */
    dev0 = backend_counter(t->be->name, bytes_counter(t->be));
    heap0 = mallinfo2().uordblks;
    for (s = 0; s < steps; s++) {
        train_tb_run(t);
        grad[s] = t->t_grad;
        step[s] = t->t_step;
    }
    dev1 = backend_counter(t->be->name, bytes_counter(t->be));
    heap1 = mallinfo2().uordblks;
    if (dev1 > dev0)
        die("mlp_train (%s, %s): device bytes in use grew from %.0f to %.0f over %d steps",
            t->be->name, g_train_kind[t->kind], dev0, dev1, steps);
    leak = heap1 > heap0 + 4096;
    snprintf(buf, cap,
             "%s%s: device bytes in use %.0f -> %.0f (%+.0f per step), host heap %+.0f "
             "bytes per step",
             leak ? "LEAK: " : "", g_train_kind[t->kind], dev0, dev1, (dev1 - dev0) / steps,
             ((double)heap1 - (double)heap0) / steps);
    if (t->kind != TRAIN_HAND) {
        t->t_grad = median(grad, steps);
        t->t_step = median(step, steps);
    }
}

void case_mlp_train(int64_t batch) {
    train_data d;
    train_tb ref, tbs[NUM_BACKENDS][TRAIN_KINDS];
    train_host host;
    side sides[TRAIN_KINDS * NUM_BACKENDS + 2];
    torch_input in[3 + TRAIN_PARAMS];
    int at[NUM_BACKENDS][TRAIN_KINDS], ns = 0, b, k, l, i, reps, ob_i = -1, torch_i = -1;
    float *want, *got, *yf, steps_f = (float)TRAIN_CHECK_STEPS;
    double flops = 0, err;
    char errs[1024], what[128], mem[TRAIN_KINDS][256];
    size_t el = 0;
    static const char *const pnames[TRAIN_PARAMS] = {"w0", "b0", "w1", "b1", "w2", "b2"};
    memset(sides, 0, sizeof sides);
    memset(&host, 0, sizeof host);
    train_data_init(&d, batch);
    /* forward, weight gradients, and the gradients of the hidden layers' outputs */
    for (l = 0; l < TRAIN_LAYERS; l++)
        flops += (l > 0 ? 3.0 : 2.0) * 2.0 * (double)batch * (double)g_train_sizes[l] *
                 (double)g_train_sizes[l + 1];
    train_tb_init(&ref, &d, NULL, TRAIN_OURS);
    want = train_tb_check(&ref, &d);
    train_tb_release(&ref);
    errs[0] = '\0';
    for (b = 0; b < NUM_BACKENDS; b++) {
        for (k = 0; k < TRAIN_KINDS; k++) {
            train_tb *t = &tbs[b][k];
            at[b][k] = -1;
            if (!g_backends[b].ok) continue;
            train_tb_init(t, &d, &g_backends[b], k);
            got = train_tb_check(t, &d);
            snprintf(what, sizeof what, "mlp_train (%s on %s vs the reference)", g_train_kind[k],
                     g_backends[b].name);
            err = check_train(what, got, want, &d);
            el += (size_t)snprintf(errs + el, sizeof errs - el, "%s%s %s %.1e", el > 0 ? ", " : "",
                                   g_train_kind[k], g_backends[b].name, err);
            free(got);
            at[b][k] = ns;
            sides[ns].name = k == TRAIN_OURS ? g_backends[b].name : g_train_kind[k];
            sides[ns].run = train_tb_run;
            sides[ns].prime = 1;
            sides[ns++].ctx = t;
        }
    }
    if (have_openblas()) {
        train_host_init(&host, &d);
        got = train_host_check(&host);
        err = check_train("mlp_train (OpenBLAS on the host vs the reference)", got, want, &d);
        el += (size_t)snprintf(errs + el, sizeof errs - el, "%sopenblas %.1e", el > 0 ? ", " : "",
                               err);
        free(got);
        ob_i = ns;
        sides[ns].name = "openblas";
        sides[ns].run = train_host_run;
        sides[ns].ctx = &host;
        sides[ns].prime = 1;
        sides[ns++].cooldown = TRAIN_COOLDOWN;
    }
    /* PyTorch: the targets as floats (small integers, exact), the check's step count */
    yf = host_alloc((size_t)batch);
    for (i = 0; i < batch; i++)
        yf[i] = (float)d.y[i];
    in[0] = (torch_input){"x", d.x, 2, {batch, g_train_sizes[0]}};
    in[1] = (torch_input){"y", yf, 1, {batch, 0}};
    in[2] = (torch_input){"steps", &steps_f, 1, {1, 0}};
    for (i = 0; i < TRAIN_PARAMS; i++) {
        int64_t dims[2] = {0, 0};
        int32_t rank;
        param_dims(i, dims, &rank);
        in[3 + i] = (torch_input){pnames[i], d.p[i], rank, {dims[0], dims[1]}};
    }
    got = torch_setup("mlp_train", in, 3 + TRAIN_PARAMS, check_len(&d));
    if (got != NULL) {
        err = check_train("mlp_train (PyTorch vs the reference)", got, want, &d);
        el += (size_t)snprintf(errs + el, sizeof errs - el, "%spytorch %.1e", el > 0 ? ", " : "",
                               err);
        free(got);
        torch_i = ns;
        sides[ns].name = "pytorch";
        sides[ns].timed = torch_timed;
        sides[ns].prime = 1;
        sides[ns++].cooldown = TRAIN_COOLDOWN;
    }
    free(yf);
    note("mlp_train: after %d steps from the same parameters every side's losses agree with ours "
         "on the cpu reference backend (loss of the last step %.6f); parameter difference / "
         "update (L2, worst tensor): %s",
         TRAIN_CHECK_STEPS, want[TRAIN_CHECK_STEPS - 1], errs);
    if (ns > 0) {
        /* --quick: three rounds, not one (the BLAS sides' cooldowns make a round long) */
        reps = measure(sides, ns, g_quick ? 3 : 0);
        note_faults("mlp_train", sides, ns);
        for (b = 0; b < NUM_BACKENDS; b++) {
            const side *ours, *det, *hand;
            row r;
            if (at[b][TRAIN_OURS] < 0) continue;
            ours = &sides[at[b][TRAIN_OURS]];
            det = &sides[at[b][TRAIN_DETACHED]];
            hand = &sides[at[b][TRAIN_HAND]];
            r = row_new("mlp_train", g_backends[b].name);
            r.ours = ours->t;
            if (torch_i >= 0 && torch_ok()) r.torch = sides[torch_i].t;
            if (ob_i >= 0) {
                r.bound = sides[ob_i].t;
                snprintf(r.bound_kind, sizeof r.bound_kind, "openblas");
            }
            snprintf(r.anchor_name, sizeof r.anchor_name, "hand_written");
            r.anchor = hand->t;
            snprintf(r.unit, sizeof r.unit, "GFLOP/s");
            r.value = flops / r.ours / 1e9;
            r.flops = flops;
            r.reps = reps;
            add_row(&r);
            for (k = 0; k < TRAIN_KINDS; k++)
                train_memory(&tbs[b][k], mem[k], sizeof mem[k]);
            note("mlp_train (%s): batch %lld, 784-512-512-10, AdamW, per step: ours %.3f ms, "
                 "hand-written %.3f ms, ours with detached gradients %.3f ms; hand-written time / "
                 "our time %.2f (target >= 0.90: %s), with detached gradients %.2f",
                 g_backends[b].name, (long long)batch, ours->t * 1e3, hand->t * 1e3, det->t * 1e3,
                 hand->t / ours->t, hand->t / ours->t >= 0.9 ? "met" : "NOT met", hand->t / det->t);
            note("mlp_train (%s): ours' host split (median of 5 steps): forward, loss and tb_grad "
                 "recorded in %.3f ms, tb_optimizer_step %.3f ms%s",
                 g_backends[b].name, tbs[b][TRAIN_OURS].t_grad * 1e3,
                 tbs[b][TRAIN_OURS].t_step * 1e3,
                 g_backends[b].opencl ? " (the kernels finish after it returns)"
                                      : " (the kernels run inside it)");
            note("mlp_train (%s) memory over 5 steps after the timing: %s; %s; %s",
                 g_backends[b].name, mem[TRAIN_OURS], mem[TRAIN_DETACHED], mem[TRAIN_HAND]);
        }
        if (ob_i >= 0)
            note("mlp_train: OpenBLAS on the host %.3f ms per step (sgemm on %d threads, the "
                 "rest in plain loops on one)",
                 sides[ob_i].t * 1e3, g_threads);
    }
    for (b = 0; b < NUM_BACKENDS; b++)
        for (k = 0; k < TRAIN_KINDS; k++)
            if (at[b][k] >= 0) train_tb_release(&tbs[b][k]);
    if (ob_i >= 0) train_host_free(&host);
    free(want);
    train_data_free(&d);
}
