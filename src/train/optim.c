/* ===========================================================================================
   Optimizers: each step builds the new parameters and state as lazy tensors (PyTorch 1.13's
   formulas, operation for operation), syncs them with the caller's tensors in one graph, and
   only then swaps them in: a failed or refused step changes nothing. Per-step numbers (the
   learning rate, bias corrections, the first-step switch of SGD's momentum) are scalar
   parameters, and the state exists from the start (zeros), so every step records the same
   graph and only the first compiles.
   =========================================================================================== */
#include "../impl_begin.h"

struct tb_optimizer {
    tb_optimizer_desc d;
    size_t n;
    tb_tensor **params;
    tb_tensor **s1, **s2; /* momentum buffer / exp_avg, exp_avg_sq (NULL when unused) */
    int64_t *steps;       /* per parameter, as PyTorch's state['step'] */
    int64_t total_steps;
    bool check_finite;
};

TBDEF tb_optimizer_desc tb_sgd_desc(double lr) {
    tb_optimizer_desc d;
    memset(&d, 0, sizeof d);
    d.kind = TB_SGD;
    d.lr = lr;
    return d;
}

TBDEF tb_optimizer_desc tb_adam_desc(double lr) {
    tb_optimizer_desc d;
    memset(&d, 0, sizeof d);
    d.kind = TB_ADAM;
    d.lr = lr;
    d.beta1 = 0.9;
    d.beta2 = 0.999;
    d.eps = 1e-8;
    return d;
}

TBDEF tb_optimizer_desc tb_adamw_desc(double lr) {
    tb_optimizer_desc d = tb_adam_desc(lr);
    d.kind = TB_ADAMW;
    d.weight_decay = 0.01;
    return d;
}

static tb_status tb__optim_check_desc(const char *fn, const tb_optimizer_desc *d) {
    if (d->kind != TB_SGD && d->kind != TB_ADAM && d->kind != TB_ADAMW)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: kind %d is not TB_SGD, TB_ADAM or TB_ADAMW",
                         fn, (int)d->kind);
    if (!(d->lr > 0.0) || isinf(d->lr))
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: lr %g is not a positive number", fn, d->lr);
    if (!(d->weight_decay >= 0.0) || isinf(d->weight_decay))
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: weight_decay %g is negative or not finite",
                         fn, d->weight_decay);
    if (d->kind == TB_SGD) {
        if (!(d->momentum >= 0.0 && d->momentum <= 1.0))
            return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: momentum %g is not in [0, 1]", fn,
                             d->momentum);
        if (!(d->dampening >= 0.0 && d->dampening <= 1.0))
            return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: dampening %g is not in [0, 1]", fn,
                             d->dampening);
        if (d->nesterov && (d->momentum <= 0.0 || d->dampening != 0.0))
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: nesterov needs momentum > 0 and dampening 0 (momentum %g, "
                             "dampening %g)",
                             fn, d->momentum, d->dampening);
        return TB_OK;
    }
    if (!(d->beta1 >= 0.0 && d->beta1 < 1.0))
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: beta1 %g is not in [0, 1)", fn, d->beta1);
    if (!(d->beta2 >= 0.0 && d->beta2 < 1.0))
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: beta2 %g is not in [0, 1)", fn, d->beta2);
    if (!(d->eps > 0.0) || isinf(d->eps))
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: eps %g is not a positive number", fn,
                         d->eps);
    return TB_OK;
}

static void tb__optim_release_all(tb_tensor **t, size_t n) {
    size_t i;
    if (t == NULL) return;
    for (i = 0; i < n; i++)
        tb_tensor_release(t[i]);
}

TBDEF void tb_optimizer_free(tb_optimizer *opt) {
    if (opt == NULL) return;
    tb__optim_release_all(opt->params, opt->n);
    tb__optim_release_all(opt->s1, opt->n);
    tb__optim_release_all(opt->s2, opt->n);
    tb__free(opt->params);
    tb__free(opt->s1);
    tb__free(opt->s2);
    tb__free(opt->steps);
    tb__free(opt);
}

/* A materialised zero tensor of t's shape on t's device. */
static tb_tensor *tb__optim_zeros_like(tb_tensor *t) {
    tb_shape s = tb_tensor_shape(t);
    tb_device dev = tb_tensor_device(t);
    tb_tensor *z = tb_zeros(&s, &dev);
    if (z != NULL && tb_sync(&z, 1) != TB_OK) {
        tb_tensor_release(z);
        z = NULL;
    }
    if (z != NULL) tb__scope_disown(z); /* the optimizer keeps it: a scope no longer owns it */
    return z;
}

TBDEF tb_optimizer *tb_optimizer_new(const tb_optimizer_desc *desc, tb_tensor *const *params,
                                     size_t n) {
    const char *fn = "tb_optimizer_new";
    tb_optimizer *opt;
    size_t i;
    bool two, one;
    tb__ensure_setup();
    if (desc == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: desc is NULL", fn);
        return NULL;
    }
    if (params == NULL && n > 0) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: params is NULL", fn);
        return NULL;
    }
    if (tb__optim_check_desc(fn, desc) != TB_OK) return NULL;
    for (i = 0; i < n; i++) {
        tb_shape s;
        size_t j;
        if (params[i] == NULL) {
            tb__error(TB_ERR_INVALID_ARGUMENT, "%s: params[%zu] is NULL", fn, i);
            return NULL;
        }
        s = tb_tensor_shape(params[i]);
        if (!tb_dtype_is_float(s.dtype)) {
            tb__error(TB_ERR_DTYPE, "%s: params[%zu] is %s; parameters are floating point", fn, i,
                      tb_dtype_name(s.dtype));
            return NULL;
        }
        for (j = 0; j < i; j++) {
            if (params[j] == params[i]) {
                tb__error(TB_ERR_INVALID_ARGUMENT, "%s: params[%zu] is params[%zu] again", fn, i,
                          j);
                return NULL;
            }
        }
    }
    opt = (tb_optimizer *)tb__calloc(1, sizeof *opt);
    if (opt == NULL) return NULL;
    opt->d = *desc;
    opt->n = n;
    one = desc->kind != TB_SGD || desc->momentum > 0.0;
    two = desc->kind != TB_SGD;
    if (n > 0) {
        opt->params = (tb_tensor **)tb__calloc(n, sizeof(tb_tensor *));
        opt->steps = (int64_t *)tb__calloc(n, sizeof(int64_t));
        if (one) opt->s1 = (tb_tensor **)tb__calloc(n, sizeof(tb_tensor *));
        if (two) opt->s2 = (tb_tensor **)tb__calloc(n, sizeof(tb_tensor *));
        if (opt->params == NULL || opt->steps == NULL || (one && opt->s1 == NULL) ||
            (two && opt->s2 == NULL)) {
            tb_optimizer_free(opt);
            return NULL;
        }
    }
    for (i = 0; i < n; i++) {
        opt->params[i] = tb_tensor_retain(params[i]);
        if ((one && (opt->s1[i] = tb__optim_zeros_like(params[i])) == NULL) ||
            (two && (opt->s2[i] = tb__optim_zeros_like(params[i])) == NULL)) {
            tb_optimizer_free(opt);
            return NULL;
        }
    }
    return opt;
}

TBDEF tb_status tb_optimizer_set_lr(tb_optimizer *opt, double lr) {
    if (opt == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_optimizer_set_lr: opt is NULL");
    if (!(lr > 0.0) || isinf(lr))
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_optimizer_set_lr: lr %g is not a positive "
                         "number",
                         lr);
    opt->d.lr = lr;
    return TB_OK;
}

TBDEF double tb_optimizer_lr(const tb_optimizer *opt) {
    return opt != NULL ? opt->d.lr : 0.0;
}

static tb__optim_view tb__optim_view_of(tb_optimizer *opt) {
    tb__optim_view v;
    v.d = &opt->d;
    v.n = opt->n;
    v.params = opt->params;
    v.state[0] = opt->s1;
    v.state[1] = opt->s2;
    v.steps = opt->steps;
    v.total_steps = &opt->total_steps;
    return v;
}

TBDEF int64_t tb_optimizer_steps(const tb_optimizer *opt) {
    return opt != NULL ? opt->total_steps : 0;
}

TBDEF tb_status tb_optimizer_set_check_finite(tb_optimizer *opt, bool on) {
    if (opt == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_optimizer_set_check_finite: opt is NULL");
    opt->check_finite = on;
    return TB_OK;
}

/* The new value of parameter i and its state (into p, s1, s2). */
static void tb__optim_update(tb__ag *a, const tb_optimizer *opt, size_t i, tb_tensor *grad,
                             tb_tensor **p_out, tb_tensor **s1_out, tb_tensor **s2_out) {
    const tb_optimizer_desc *d = &opt->d;
    tb_tensor *p = opt->params[i], *g = grad;
    tb_dtype dt = tb_tensor_shape(p).dtype;
    int64_t step = opt->steps[i] + 1;
    a->device = tb_tensor_device(p);
    if (d->maximize) g = tb__ag_keep(a, tb_neg(g));
    if (d->kind == TB_SGD) {
        if (d->weight_decay != 0.0)
            g = tb__ag_keep(
                a, tb_add(g, tb__ag_keep(a, tb_mul(p, tb__ag_const(a, dt, d->weight_decay)))));
        if (d->momentum > 0.0) {
            /* buf = g on the first step, else momentum * buf + (1 - dampening) * g: one graph
               for both, with the two factors as parameters (buf starts at zero) */
            bool first = opt->steps[i] == 0;
            tb_tensor *b =
                tb__ag_keep(a, tb_mul(opt->s1[i], tb__ag_const(a, dt, first ? 0.0 : d->momentum)));
            tb_tensor *gg =
                tb__ag_keep(a, tb_mul(g, tb__ag_const(a, dt, first ? 1.0 : 1.0 - d->dampening)));
            b = tb__ag_keep(a, tb_add(b, gg));
            *s1_out = b;
            if (d->nesterov)
                g = tb__ag_keep(
                    a, tb_add(g, tb__ag_keep(a, tb_mul(b, tb__ag_const(a, dt, d->momentum)))));
            else
                g = b;
        }
        *p_out = tb__ag_keep(a, tb_sub(p, tb__ag_keep(a, tb_mul(g, tb__ag_const(a, dt, d->lr)))));
        return;
    }
    {
        double bc1 = 1.0 - pow(d->beta1, (double)step), bc2 = 1.0 - pow(d->beta2, (double)step);
        tb_tensor *m, *v, *denom, *upd;
        if (d->kind == TB_ADAMW) {
            p = tb__ag_keep(a, tb_mul(p, tb__ag_const(a, dt, 1.0 - d->lr * d->weight_decay)));
        } else if (d->weight_decay != 0.0) {
            g = tb__ag_keep(
                a, tb_add(g, tb__ag_keep(
                                 a, tb_mul(opt->params[i], tb__ag_const(a, dt, d->weight_decay)))));
        }
        m = tb__ag_keep(a, tb_mul(opt->s1[i], tb__ag_const(a, dt, d->beta1)));
        m = tb__ag_keep(a,
                        tb_add(m, tb__ag_keep(a, tb_mul(g, tb__ag_const(a, dt, 1.0 - d->beta1)))));
        v = tb__ag_keep(a, tb_mul(opt->s2[i], tb__ag_const(a, dt, d->beta2)));
        v = tb__ag_keep(a, tb_add(v, tb__ag_keep(a, tb_mul(tb__ag_keep(a, tb_mul(g, g)),
                                                           tb__ag_const(a, dt, 1.0 - d->beta2)))));
        denom = tb__ag_keep(a, tb_div(tb__ag_keep(a, tb_sqrt(v)), tb__ag_const(a, dt, sqrt(bc2))));
        denom = tb__ag_keep(a, tb_add(denom, tb__ag_const(a, dt, d->eps)));
        upd = tb__ag_keep(a, tb_div(m, denom));
        upd = tb__ag_keep(a, tb_mul(upd, tb__ag_const(a, dt, d->lr / bc1)));
        *p_out = tb__ag_keep(a, tb_sub(p, upd));
        *s1_out = m;
        *s2_out = v;
    }
}

/* Syncs `tensors`, one graph per device. A step over several devices runs several graphs:
   the old values stay readable (no donation) until all of them ran, so that a failure in a
   later one can still give every parameter its old value back. */
static tb_status tb__optim_sync(tb_tensor *const *tensors, size_t n, const tb__held *held,
                                size_t nh) {
    tb_tensor **group = NULL, **guard = NULL;
    bool *done = NULL, several = false;
    size_t i, j, m;
    tb_status st = TB_OK;
    tb_device dev0;
    if (n == 0) return TB_OK;
    dev0 = tb_tensor_device(tensors[0]);
    for (i = 1; i < n && !several; i++) {
        tb_device di = tb_tensor_device(tensors[i]);
        several = !tb_device_equal(&di, &dev0);
    }
    if (!several) return tb_sync(tensors, n);
    group = (tb_tensor **)tb__calloc(n, sizeof *group);
    done = (bool *)tb__calloc(n, sizeof *done);
    guard = (tb_tensor **)tb__calloc(nh + 1, sizeof *guard);
    if (group == NULL || done == NULL || guard == NULL) st = TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < nh && st == TB_OK; i++) {
        guard[i] = tb__held_guard(&held[i]);
        if (guard[i] == NULL && held[i].data != NULL) st = TB_ERR_OUT_OF_MEMORY;
    }
    for (i = 0; i < n && st == TB_OK; i++) {
        tb_device di;
        if (done[i]) continue;
        di = tb_tensor_device(tensors[i]);
        for (j = i, m = 0; j < n; j++) {
            tb_device dj = tb_tensor_device(tensors[j]);
            if (done[j] || !tb_device_equal(&di, &dj)) continue;
            done[j] = true;
            group[m++] = tensors[j];
        }
        st = tb_sync(group, m);
    }
    for (i = 0; guard != NULL && i < nh; i++)
        tb_tensor_release(guard[i]);
    tb__free(group);
    tb__free(done);
    tb__free(guard);
    return st;
}

/* How many elements of t are NaN or infinite (x - x is NaN exactly for those), as an f32 [1]. */
static tb_tensor *tb__optim_nonfinite(tb__ag *a, tb_tensor *t) {
    tb_shape s = tb_tensor_shape(t);
    int64_t one = 1;
    tb_tensor *d, *bad, *n;
    a->device = tb_tensor_device(t);
    d = tb__ag_keep(a, tb_sub(t, t));
    bad = tb__ag_keep(a, tb_ne(d, tb__ag_const(a, s.dtype, 0.0)));
    n = tb__ag_keep(a, tb_sum(tb__ag_keep(a, tb_cast(bad, TB_F32)), NULL, 0, false));
    return tb__ag_keep(a, tb_reshape(n, &one, 1));
}

/* The step's arguments: opt, grads (unless opt has no parameters) and every also tensor are
   there, and each gradient given has its parameter's shape and device. */
static tb_status tb__optim_check_args(const char *fn, const tb_optimizer *opt,
                                      tb_tensor *const *grads, tb_tensor *const *also,
                                      size_t num_also) {
    size_t i;
    if (opt == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: opt is NULL", fn);
    if (grads == NULL && opt->n > 0)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: grads is NULL", fn);
    if (also == NULL && num_also > 0)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: also is NULL", fn);
    for (i = 0; i < num_also; i++)
        if (also[i] == NULL)
            return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: also[%zu] is NULL", fn, i);
    for (i = 0; i < opt->n; i++) {
        tb_shape ps, gs;
        tb_device pd, gd;
        char sa[96], sb[96];
        if (grads[i] == NULL) continue;
        ps = tb_tensor_shape(opt->params[i]);
        gs = tb_tensor_shape(grads[i]);
        if (!tb_shape_equal(&ps, &gs)) {
            tb__shape_text(&ps, sa);
            tb__shape_text(&gs, sb);
            return tb__error(TB_ERR_SHAPE, "%s: grads[%zu] is %s but its parameter is %s", fn, i,
                             sb, sa);
        }
        pd = tb_tensor_device(opt->params[i]);
        gd = tb_tensor_device(grads[i]);
        if (!tb_device_equal(&pd, &gd)) {
            tb_device_format(&pd, sa, sizeof sa);
            tb_device_format(&gd, sb, sizeof sb);
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: grads[%zu] is on %s but its parameter "
                             "is on %s",
                             fn, i, sb, sa);
        }
    }
    return TB_OK;
}

/* The check of check_finite: one vector of counts of the NaN or infinite values (*counts, *nc
   of them), read once: the also tensors first, then the gradients; and the new values (np,
   ns1, ns2) made the old ones where any count is not zero. */
static void tb__optim_guard_finite(tb__ag *a, const tb_optimizer *opt, tb_tensor *const *grads,
                                   tb_tensor *const *also, size_t num_also, tb_tensor **checks,
                                   size_t *nc, tb_tensor **counts, tb_tensor **np, tb_tensor **ns1,
                                   tb_tensor **ns2) {
    size_t i;
    for (i = 0; i < num_also && !a->failed; i++)
        if (tb_dtype_is_float(tb_tensor_shape(also[i]).dtype))
            checks[(*nc)++] = tb__optim_nonfinite(a, also[i]);
    for (i = 0; i < opt->n && !a->failed; i++)
        if (grads[i] != NULL) checks[(*nc)++] = tb__optim_nonfinite(a, grads[i]);
    if (!a->failed && *nc > 0) {
        tb_device dev0 = tb_tensor_device(checks[0]);
        tb_tensor *ok;
        for (i = 1; i < *nc && !a->failed; i++) { /* counts on other devices come over */
            tb_device di = tb_tensor_device(checks[i]);
            if (!tb_device_equal(&di, &dev0))
                checks[i] = tb__ag_keep(a, tb_to_device(checks[i], &dev0));
        }
        if (!a->failed) *counts = tb__ag_keep(a, tb_concat(checks, *nc, 0));
        /* a refused step computes the old values again (into their own buffers): the
           check needs no second pass and nothing has to be undone */
        a->device = dev0;
        ok = a->failed ? NULL
                       : tb__ag_keep(a, tb_eq(tb__ag_keep(a, tb_sum(*counts, NULL, 0, false)),
                                              tb__ag_const(a, TB_F32, 0.0)));
        for (i = 0; i < opt->n && !a->failed; i++) {
            tb_device pd = tb_tensor_device(opt->params[i]);
            tb_tensor *oki = ok;
            if (grads[i] == NULL) continue;
            if (!tb_device_equal(&pd, &dev0)) oki = tb__ag_keep(a, tb_to_device(ok, &pd));
            np[i] = tb__ag_keep(a, tb_where(oki, np[i], opt->params[i]));
            if (ns1[i] != NULL) ns1[i] = tb__ag_keep(a, tb_where(oki, ns1[i], opt->s1[i]));
            if (ns2[i] != NULL) ns2[i] = tb__ag_keep(a, tb_where(oki, ns2[i], opt->s2[i]));
        }
    }
}

/* Reads the counts of tb__optim_guard_finite: an error naming the first tensor that holds NaN
   or infinite values, if one does. */
static tb_status tb__optim_read_counts(const char *fn, const tb_optimizer *opt,
                                       tb_tensor *const *grads, tb_tensor *const *also,
                                       size_t num_also, tb_tensor *counts, size_t nc) {
    float *c = (float *)tb__calloc(nc, sizeof(float));
    size_t i, k = 0;
    tb_status st;
    if (c == NULL) return TB_ERR_OUT_OF_MEMORY;
    st = tb_tensor_to_host(counts, c, nc * sizeof(float));
    for (i = 0; st == TB_OK && i < num_also; i++) {
        if (!tb_dtype_is_float(tb_tensor_shape(also[i]).dtype)) continue;
        if (c[k++] > 0.0f)
            st = tb__error(TB_ERR_EXECUTE,
                           "%s: also[%zu] holds %.0f NaN or infinite values; "
                           "no parameter was updated",
                           fn, i, (double)c[k - 1]);
    }
    for (i = 0; st == TB_OK && i < opt->n; i++) {
        if (grads[i] == NULL) continue;
        if (c[k++] > 0.0f)
            st = tb__error(TB_ERR_EXECUTE,
                           "%s: grads[%zu] holds %.0f NaN or infinite values; "
                           "no parameter was updated",
                           fn, i, (double)c[k - 1]);
    }
    tb__free(c);
    return st;
}

TBDEF tb_status tb_optimizer_step(tb_optimizer *opt, tb_tensor *const *grads,
                                  tb_tensor *const *also, size_t num_also) {
    const char *fn = "tb_optimizer_step";
    tb__ag a;
    tb_tensor **np = NULL, **ns1 = NULL, **ns2 = NULL, **sync = NULL, **checks = NULL;
    tb_tensor *counts = NULL;
    tb__held *held = NULL;
    size_t i, ns = 0, nc = 0, nh = 0;
    bool counts_kept = false;
    tb_status st = TB_OK;
    tb__ensure_setup();
    if ((st = tb__optim_check_args(fn, opt, grads, also, num_also)) != TB_OK) return st;
    tb__ag_init(&a, fn);
    if (opt->n > 0) {
        np = (tb_tensor **)tb__calloc(opt->n, sizeof(tb_tensor *));
        ns1 = (tb_tensor **)tb__calloc(opt->n, sizeof(tb_tensor *));
        ns2 = (tb_tensor **)tb__calloc(opt->n, sizeof(tb_tensor *));
        checks = (tb_tensor **)tb__calloc(opt->n + num_also, sizeof(tb_tensor *));
        held = (tb__held *)tb__calloc(3 * opt->n, sizeof(tb__held));
    }
    sync = (tb_tensor **)tb__calloc(4 * opt->n + num_also + 1, sizeof(tb_tensor *));
    if (sync == NULL || (opt->n > 0 && (np == NULL || ns1 == NULL || ns2 == NULL ||
                                        checks == NULL || held == NULL))) {
        st = TB_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (i = 0; i < opt->n; i++) {
        if (grads[i] == NULL) continue;
        tb__optim_update(&a, opt, i, grads[i], &np[i], &ns1[i], &ns2[i]);
        if (a.failed) break;
    }
    if (!a.failed && opt->check_finite)
        tb__optim_guard_finite(&a, opt, grads, also, num_also, checks, &nc, &counts, np, ns1, ns2);
    if (a.failed) {
        st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
        goto done;
    }
    /* the parameters and state take their new values in place (their old buffers are donated
       to the new values when nothing else reads them), remembering what they held */
    for (i = 0; i < opt->n; i++) {
        tb_tensor *dst[3], *val[3];
        int k;
        if (grads[i] == NULL) continue;
        dst[0] = opt->params[i], val[0] = np[i];
        dst[1] = opt->s1 != NULL ? opt->s1[i] : NULL, val[1] = ns1[i];
        dst[2] = opt->s2 != NULL ? opt->s2[i] : NULL, val[2] = ns2[i];
        for (k = 0; k < 3; k++) {
            if (dst[k] == NULL || val[k] == NULL) continue;
            tb__held_take(&held[nh], dst[k]);
            nh++;
            st = tb_assign(dst[k], val[k]);
            if (st != TB_OK) goto undo;
        }
    }
    /* the update's intermediate tensors would read the old values after the sync: gone */
    if (counts != NULL) counts_kept = tb_tensor_retain(counts) != NULL;
    tb__ag_free(&a);
    tb__ag_init(&a, fn);
    /* what the caller reads first, the updates last: kernels that can fail at run time (a
       target out of range) then come before those writing in place */
    for (i = 0; i < num_also; i++)
        sync[ns++] = also[i];
    for (i = 0; i < opt->n; i++)
        if (grads[i] != NULL) sync[ns++] = grads[i];
    if (counts != NULL) sync[ns++] = counts;
    for (i = 0; i < nh; i++)
        sync[ns++] = held[i].t;
    st = tb__optim_sync(sync, ns, held, nh);
    if (st != TB_OK) goto undo;
    if (counts != NULL) {
        st = tb__optim_read_counts(fn, opt, grads, also, num_also, counts, nc);
        if (st != TB_OK) goto done; /* the values computed are the old ones */
    }
    for (i = 0; i < opt->n; i++)
        if (grads[i] != NULL) opt->steps[i]++;
    opt->total_steps++;
    goto done;
undo:
    /* a failed assignment or sync: every parameter and state holds what it held before */
    {
        bool lost = false;
        for (i = nh; i-- > 0;)
            if (!tb__held_restore(&held[i])) lost = true;
        if (lost) {
            char why[256];
            snprintf(why, sizeof why, "%.200s", tb_last_error());
            tb__error(st,
                      "%s: %s; the run had begun to write the new values in place, so the "
                      "parameters' old values are lost",
                      fn, why);
        }
    }
done:
    for (i = 0; i < nh; i++)
        tb__held_drop(&held[i]);
    if (counts_kept) tb_tensor_release(counts);
    if (st == TB_ERR_OUT_OF_MEMORY && tb_last_status() == TB_OK)
        tb__error(TB_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    tb__ag_free(&a);
    tb__free(np);
    tb__free(ns1);
    tb__free(ns2);
    tb__free(checks);
    tb__free(held);
    tb__free(sync);
    return st;
}

TBDEF tb_status tb_clip_grad_norm(tb_tensor *const *grads, size_t n, double max_norm,
                                  tb_tensor **total_norm_out) {
    const char *fn = "tb_clip_grad_norm";
    tb__ag a;
    tb_tensor *total = NULL, *coef, **scaled = NULL;
    tb_dtype acc = TB_F32;
    tb_device dev;
    bool any = false;
    size_t i;
    tb_status st = TB_OK;
    tb__ensure_setup();
    if (total_norm_out != NULL) *total_norm_out = NULL;
    if (grads == NULL && n > 0) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: grads is NULL", fn);
    if (!(max_norm >= 0.0) || isinf(max_norm))
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: max_norm %g is negative or not finite", fn,
                         max_norm);
    memset(&dev, 0, sizeof dev);
    for (i = 0; i < n; i++) {
        tb_shape s;
        tb_device d;
        if (grads[i] == NULL) continue;
        s = tb_tensor_shape(grads[i]);
        d = tb_tensor_device(grads[i]);
        if (!tb_dtype_is_float(s.dtype))
            return tb__error(TB_ERR_DTYPE, "%s: grads[%zu] is %s; gradients are floating point", fn,
                             i, tb_dtype_name(s.dtype));
        if (any && !tb_device_equal(&d, &dev))
            return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: the gradients are on different devices",
                             fn);
        dev = d;
        any = true;
        if (s.dtype == TB_F64) acc = TB_F64;
    }
    if (!any) {
        if (total_norm_out == NULL) return TB_OK;
        *total_norm_out = tb_scalar_tensor(tb_scalar_f(TB_F32, 0.0), NULL);
        return *total_norm_out != NULL ? TB_OK : tb_last_status();
    }
    tb__ag_init(&a, fn);
    a.device = dev;
    for (i = 0; i < n && !a.failed; i++) {
        tb_tensor *g, *sq;
        if (grads[i] == NULL) continue;
        g = tb__ag_keep(&a, tb_cast(grads[i], acc));
        sq = tb__ag_keep(&a, tb_sum(tb__ag_keep(&a, tb_mul(g, g)), NULL, 0, false));
        total = total == NULL ? sq : tb__ag_keep(&a, tb_add(total, sq));
    }
    if (!a.failed) total = tb__ag_keep(&a, tb_sqrt(total));
    if (!a.failed) {
        coef = tb__ag_keep(&a, tb_div(tb__ag_const(&a, acc, max_norm),
                                      tb__ag_keep(&a, tb_add(total, tb__ag_const(&a, acc, 1e-6)))));
        coef = tb__ag_keep(&a, tb_minimum(coef, tb__ag_const(&a, acc, 1.0)));
        scaled = (tb_tensor **)tb__calloc(n, sizeof(tb_tensor *));
        if (scaled == NULL) a.failed = true;
        for (i = 0; i < n && !a.failed; i++) {
            tb_shape s;
            if (grads[i] == NULL) continue;
            s = tb_tensor_shape(grads[i]);
            scaled[i] = tb__ag_keep(&a, tb_mul(grads[i], tb__ag_keep(&a, tb_cast(coef, s.dtype))));
        }
    }
    if (a.failed) {
        st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
    } else {
        for (i = 0; i < n && st == TB_OK; i++)
            if (grads[i] != NULL) st = tb_assign(grads[i], scaled[i]);
        if (st == TB_OK && total_norm_out != NULL) *total_norm_out = tb_tensor_retain(total);
    }
    tb__free(scaled);
    tb__ag_free(&a);
    return st;
}

TBDEF tb_status tb_accumulate_grads(tb_tensor **acc, tb_tensor *const *grads, size_t n) {
    const char *fn = "tb_accumulate_grads";
    size_t i;
    tb__ensure_setup();
    if ((acc == NULL || grads == NULL) && n > 0)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         acc == NULL ? "acc" : "grads");
    for (i = 0; i < n; i++) { /* check everything before changing anything */
        tb_shape as, gs;
        tb_device ad, gd;
        if (acc[i] == NULL || grads[i] == NULL) continue;
        as = tb_tensor_shape(acc[i]);
        gs = tb_tensor_shape(grads[i]);
        ad = tb_tensor_device(acc[i]);
        gd = tb_tensor_device(grads[i]);
        if (!tb_shape_equal(&as, &gs) || !tb_device_equal(&ad, &gd))
            return tb__error(TB_ERR_SHAPE,
                             "%s: grads[%zu] differs from acc[%zu] in shape, dtype "
                             "or device",
                             fn, i, i);
    }
    for (i = 0; i < n; i++) {
        tb_tensor *sum;
        tb_status st;
        if (grads[i] == NULL) continue;
        if (acc[i] == NULL) {
            acc[i] = tb_tensor_retain(grads[i]);
            continue;
        }
        sum = tb_add(acc[i], grads[i]);
        if (sum == NULL) return tb_last_status();
        st = tb_assign(acc[i], sum);
        tb_tensor_release(sum);
        if (st != TB_OK) return st;
    }
    return TB_OK;
}
