/* ===========================================================================================
   Losses, dropout and the scatter and index adds, built from the public ops (their gradients
   come from the ops' rules).
   =========================================================================================== */
#include "../impl_begin.h"

static bool tb__nn_reduction_ok(const char *fn, tb_reduction reduction) {
    if (reduction == TB_REDUCTION_MEAN || reduction == TB_REDUCTION_SUM ||
        reduction == TB_REDUCTION_NONE)
        return true;
    tb__error(TB_ERR_INVALID_ARGUMENT,
              "%s: reduction %d is not TB_REDUCTION_MEAN, TB_REDUCTION_SUM or TB_REDUCTION_NONE",
              fn, (int)reduction);
    return false;
}

static bool tb__nn_same_device(tb_tensor *a, tb_tensor *b) {
    tb_device da = tb_tensor_device(a), db = tb_tensor_device(b);
    return tb_device_equal(&da, &db);
}

/* The per-element losses reduced as asked; the result is a new reference. */
static tb_tensor *tb__nn_reduce(tb__ag *a, tb_tensor *per, tb_reduction reduction) {
    if (per == NULL) return NULL;
    if (reduction == TB_REDUCTION_SUM) return tb__ag_keep(a, tb_sum(per, NULL, 0, false));
    if (reduction == TB_REDUCTION_MEAN) return tb__ag_keep(a, tb_mean(per, NULL, 0, false));
    return per;
}

/* Checks a class-index target against x [N, C, ...] (or [C]); the class axis, or -1. */
static int32_t tb__nn_class_target(const char *fn, const char *xname, tb_tensor *x,
                                   tb_tensor *target) {
    tb_shape xs = tb_tensor_shape(x), ts = tb_tensor_shape(target);
    int32_t c = xs.rank >= 2 ? 1 : 0, i;
    bool ok = ts.rank == xs.rank - 1;
    char a[96], b[96];
    if (!tb_dtype_is_float(xs.dtype)) {
        tb__error(TB_ERR_DTYPE, "%s: %s is %s; it must be floating point", fn, xname,
                  tb_dtype_name(xs.dtype));
        return -1;
    }
    if (xs.rank < 1) {
        tb__error(TB_ERR_SHAPE, "%s: %s is rank 0; it needs a class axis", fn, xname);
        return -1;
    }
    if (ts.dtype != TB_I32 && ts.dtype != TB_I64) {
        tb__error(TB_ERR_DTYPE, "%s: target is %s; class indices are i32 or i64", fn,
                  tb_dtype_name(ts.dtype));
        return -1;
    }
    for (i = 0; ok && i < ts.rank; i++)
        ok = ts.dims[i] == xs.dims[i < c ? i : i + 1];
    if (!ok) {
        tb__shape_text(&xs, a);
        tb__shape_text(&ts, b);
        tb__error(TB_ERR_SHAPE, "%s: target %s does not match %s %s without its class axis %d", fn,
                  b, xname, a, (int)c);
        return -1;
    }
    if (!tb__nn_same_device(x, target)) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s and target are on different devices", fn, xname);
        return -1;
    }
    return c;
}

/* -log_probs at the target's classes, of the target's dims. */
static tb_tensor *tb__nn_nll(tb__ag *a, tb_tensor *log_probs, tb_tensor *target, int32_t c) {
    tb_tensor *idx = tb__ag_keep(a, tb_unsqueeze(target, c));
    tb_tensor *picked = idx != NULL ? tb__ag_keep(a, tb_gather(log_probs, c, idx)) : NULL;
    tb_tensor *sq = picked != NULL ? tb__ag_keep(a, tb_squeeze(picked, c)) : NULL;
    return sq != NULL ? tb__ag_keep(a, tb_neg(sq)) : NULL;
}

static tb_tensor *tb__nn_finish(tb__ag *a, tb_tensor *result) {
    if (result != NULL && !a->failed)
        tb_tensor_retain(result);
    else
        result = NULL;
    tb__ag_free(a);
    return result;
}

TBDEF tb_tensor *tb_nll_loss(tb_tensor *log_probs, tb_tensor *target, tb_reduction reduction) {
    const char *fn = "tb_nll_loss";
    tb__ag a;
    int32_t c;
    tb__ensure_setup();
    if (log_probs == NULL) return tb__null_input(fn, "log_probs");
    if (target == NULL) return tb__null_input(fn, "target");
    if (!tb__nn_reduction_ok(fn, reduction)) return NULL;
    c = tb__nn_class_target(fn, "log_probs", log_probs, target);
    if (c < 0) return NULL;
    tb__ag_init(&a, fn);
    a.device = tb_tensor_device(log_probs);
    return tb__nn_finish(&a, tb__nn_reduce(&a, tb__nn_nll(&a, log_probs, target, c), reduction));
}

TBDEF tb_tensor *tb_cross_entropy(tb_tensor *logits, tb_tensor *target, tb_reduction reduction,
                                  double label_smoothing) {
    const char *fn = "tb_cross_entropy";
    tb_shape xs, ts;
    tb_tensor *logp, *per = NULL;
    tb__ag a;
    int32_t c;
    double s = label_smoothing;
    tb__ensure_setup();
    if (logits == NULL) return tb__null_input(fn, "logits");
    if (target == NULL) return tb__null_input(fn, "target");
    if (!tb__nn_reduction_ok(fn, reduction)) return NULL;
    if (!(s >= 0.0 && s <= 1.0)) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: label_smoothing %g is not in [0, 1]", fn, s);
        return NULL;
    }
    xs = tb_tensor_shape(logits);
    ts = tb_tensor_shape(target);
    c = xs.rank >= 2 ? 1 : 0;
    if (tb_dtype_is_float(ts.dtype)) { /* class probabilities */
        char sa[96], sb[96];
        if (!tb_dtype_is_float(xs.dtype) || xs.rank < 1 || !tb_shape_equal(&xs, &ts)) {
            tb__shape_text(&xs, sa);
            tb__shape_text(&ts, sb);
            tb__error(tb_dtype_is_float(xs.dtype) ? TB_ERR_SHAPE : TB_ERR_DTYPE,
                      "%s: probability target %s must have the shape and dtype of logits %s "
                      "(floating point, rank >= 1)",
                      fn, sb, sa);
            return NULL;
        }
        if (!tb__nn_same_device(logits, target)) {
            tb__error(TB_ERR_INVALID_ARGUMENT, "%s: logits and target are on different devices",
                      fn);
            return NULL;
        }
    } else if (tb__nn_class_target(fn, "logits", logits, target) < 0) {
        return NULL;
    }
    tb__ag_init(&a, fn);
    a.device = tb_tensor_device(logits);
    logp = tb__ag_keep(&a, tb_log_softmax(logits, c));
    if (tb_dtype_is_float(ts.dtype)) {
        /* -sum over classes of ((1 - s) * t + s / C) * logp */
        tb_tensor *t = target;
        if (s > 0.0) {
            t = tb__ag_keep(&a, tb_mul_scalar(target, 1.0 - s));
            t = tb__ag_keep(&a, tb_add_scalar(t, s / (double)xs.dims[c]));
        }
        per = tb__ag_keep(&a, tb_mul(t, logp));
        per = tb__ag_keep(&a, tb_sum(per, &c, 1, false));
        per = tb__ag_keep(&a, tb_neg(per));
    } else {
        per = tb__nn_nll(&a, logp, target, c);
        if (s > 0.0) {
            tb_tensor *smooth = tb__ag_keep(&a, tb_mean(logp, &c, 1, false));
            smooth = tb__ag_keep(&a, tb_mul_scalar(smooth, -s));
            per = tb__ag_keep(&a, tb_mul_scalar(per, 1.0 - s));
            per = tb__ag_keep(&a, tb_add(per, smooth));
        }
    }
    return tb__nn_finish(&a, tb__nn_reduce(&a, per, reduction));
}

TBDEF tb_tensor *tb_mse_loss(tb_tensor *input, tb_tensor *target, tb_reduction reduction) {
    const char *fn = "tb_mse_loss";
    tb_shape xs, ts;
    tb_tensor *d;
    tb__ag a;
    tb__ensure_setup();
    if (input == NULL) return tb__null_input(fn, "input");
    if (target == NULL) return tb__null_input(fn, "target");
    if (!tb__nn_reduction_ok(fn, reduction)) return NULL;
    xs = tb_tensor_shape(input);
    ts = tb_tensor_shape(target);
    if (!tb_dtype_is_float(xs.dtype)) {
        tb__error(TB_ERR_DTYPE, "%s: input is %s; it must be floating point", fn,
                  tb_dtype_name(xs.dtype));
        return NULL;
    }
    if (!tb_shape_equal(&xs, &ts)) {
        char sa[96], sb[96];
        tb__shape_text(&xs, sa);
        tb__shape_text(&ts, sb);
        tb__error(TB_ERR_SHAPE, "%s: input %s and target %s differ", fn, sa, sb);
        return NULL;
    }
    tb__ag_init(&a, fn);
    a.device = tb_tensor_device(input);
    d = tb__ag_keep(&a, tb_sub(input, target));
    d = d != NULL ? tb__ag_keep(&a, tb_mul(d, d)) : NULL;
    return tb__nn_finish(&a, tb__nn_reduce(&a, d, reduction));
}

TBDEF tb_tensor *tb_dropout(tb_tensor *x, double p, bool training) {
    const char *fn = "tb_dropout";
    tb_shape xs;
    tb_tensor *u, *keep, *scaled, *zero, *y;
    tb__ag a;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (!(p >= 0.0 && p <= 1.0)) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: p %g is not in [0, 1]", fn, p);
        return NULL;
    }
    xs = tb_tensor_shape(x);
    if (!tb_dtype_is_float(xs.dtype)) {
        tb__error(TB_ERR_DTYPE, "%s: x is %s; it must be floating point", fn,
                  tb_dtype_name(xs.dtype));
        return NULL;
    }
    if (!training || p == 0.0) return tb__scope_claim(tb_tensor_retain(x));
    tb__ag_init(&a, fn);
    a.device = tb_tensor_device(x);
    if (p == 1.0) {
        zero = tb__ag_const(&a, xs.dtype, 0.0);
        y = zero != NULL ? tb__ag_keep(&a, tb_mul(x, zero)) : NULL;
        return tb__nn_finish(&a, y);
    }
    u = tb__ag_keep(&a, tb_rand(&xs, &a.device));
    keep = tb__ag_keep(&a, tb_lt(u, tb__ag_const(&a, xs.dtype, 1.0 - p)));
    scaled = tb__ag_keep(&a, tb_mul_scalar(x, 1.0 / (1.0 - p)));
    zero = tb__ag_const(&a, xs.dtype, 0.0);
    y = a.failed ? NULL : tb__ag_keep(&a, tb_where(keep, scaled, zero));
    return tb__nn_finish(&a, y);
}

/* ---- the scatter and index adds (composite ops: a scatter sum of autograd.c added to x) ---- */

static tb_tensor *tb__ag_scatter_op(const char *fn, tb_tensor *x, int32_t dim, tb_tensor *index,
                                    tb_tensor *src, bool one_d) {
    tb__ag a;
    tb_shape xs, is, ss;
    tb_tensor *sum, *r = NULL;
    int32_t d;
    tb__ensure_setup();
    if (x == NULL || index == NULL || src == NULL)
        return tb__null_input(fn, x == NULL ? "x" : index == NULL ? "index" : "src");
    xs = tb_tensor_shape(x);
    is = tb_tensor_shape(index);
    ss = tb_tensor_shape(src);
    if (xs.rank < 1) {
        tb__error(TB_ERR_SHAPE, "%s: x must have rank >= 1", fn);
        return NULL;
    }
    d = dim < 0 ? dim + xs.rank : dim;
    if (d < 0 || d >= xs.rank) {
        tb__error(TB_ERR_SHAPE, "%s: dim %d is out of range for rank %d", fn, (int)dim,
                  (int)xs.rank);
        return NULL;
    }
    if (is.dtype != TB_I32 && is.dtype != TB_I64) {
        tb__error(TB_ERR_DTYPE, "%s: index is %s (i32 or i64 expected)", fn,
                  tb_dtype_name(is.dtype));
        return NULL;
    }
    {
        /* the index and src layouts of the op, checked as its gather / index_select twin */
        int32_t k;
        bool ok =
            one_d ? is.rank == 1 && ss.rank == xs.rank : is.rank == xs.rank && ss.rank == xs.rank;
        for (k = 0; ok && k < xs.rank; k++) {
            if (one_d) {
                ok = ss.dims[k] == (k == d ? is.dims[0] : xs.dims[k]);
            } else {
                ok = ss.dims[k] == is.dims[k] && (k == d || is.dims[k] <= xs.dims[k]);
            }
        }
        if (!ok) {
            char b1[96], b2[96], b3[96];
            tb__shape_text(&xs, b1);
            tb__shape_text(&is, b2);
            tb__shape_text(&ss, b3);
            tb__error(TB_ERR_SHAPE, "%s: x %s, index %s and src %s do not fit (%s)", fn, b1, b2, b3,
                      one_d ? "index 1-D; src of x's dims except dims[dim] = index's length"
                            : "index and src of x's rank and index's dims; index.dims[d] <= "
                              "x.dims[d] for d != dim");
            return NULL;
        }
    }
    tb__ag_init(&a, fn);
    a.device = tb_tensor_device(x);
    if (ss.dtype != xs.dtype) src = tb__ag_keep(&a, tb_cast(src, xs.dtype));
    sum = one_d ? tb__ag_index_sum(&a, &xs, d, index, src) : tb__ag_scatter(&a, &xs, d, index, src);
    if (sum != NULL) r = tb_add(x, sum);
    tb__ag_free(&a);
    return r;
}

TBDEF tb_tensor *tb_scatter_add(tb_tensor *x, int32_t dim, tb_tensor *index, tb_tensor *src) {
    return tb__ag_scatter_op("tb_scatter_add", x, dim, index, src, false);
}

TBDEF tb_tensor *tb_index_add(tb_tensor *x, int32_t dim, tb_tensor *index, tb_tensor *src) {
    return tb__ag_scatter_op("tb_index_add", x, dim, index, src, true);
}
