/* ===========================================================================================
   Layers of real models, built from the public ops (their gradients come from the ops'
   rules): linear, embedding, the hard activations, masks, batch norm, attention and
   interpolation.
   =========================================================================================== */
#include "../impl_begin.h"

static bool tb__layer_float(const char *fn, const char *what, tb_tensor *t) {
    tb_dtype dt = tb_tensor_shape(t).dtype;
    if (tb_dtype_is_float(dt)) return true;
    tb__error(TB_ERR_DTYPE, "%s: %s is %s; it must be floating point", fn, what, tb_dtype_name(dt));
    return false;
}

/* `t` (named `what`) is a vector [n] of dtype dt on x's device. */
static bool tb__layer_vector(const char *fn, const char *what, tb_tensor *t, int64_t n, tb_dtype dt,
                             tb_tensor *x) {
    tb_shape s = tb_tensor_shape(t);
    tb_device dx = tb_tensor_device(x), dv = tb_tensor_device(t);
    char b[96];
    if (s.rank != 1 || s.dims[0] != n || s.dtype != dt) {
        tb__shape_text(&s, b);
        tb__error(s.dtype != dt ? TB_ERR_DTYPE : TB_ERR_SHAPE, "%s: %s is %s; it must be %s[%lld]",
                  fn, what, b, tb_dtype_name(dt), (long long)n);
        return false;
    }
    if (!tb_device_equal(&dx, &dv)) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s is on another device than the input", fn, what);
        return false;
    }
    return true;
}

static bool tb__layer_same_device(const char *fn, tb_tensor *a, const char *an, tb_tensor *b,
                                  const char *bn) {
    tb_device da = tb_tensor_device(a), db = tb_tensor_device(b);
    if (tb_device_equal(&da, &db)) return true;
    tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s and %s are on different devices", fn, an, bn);
    return false;
}

static void tb__layer_start(tb__ag *a, const char *fn, tb_tensor *x) {
    tb__ag_init(a, fn);
    a->device = tb_tensor_device(x);
}

TBDEF tb_tensor *tb_linear(tb_tensor *x, tb_tensor *weight, tb_tensor *bias) {
    const char *fn = "tb_linear";
    tb_shape xs, ws;
    tb_tensor *y;
    tb__ag a;
    char sa[96], sb[96];
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (weight == NULL) return tb__null_input(fn, "weight");
    xs = tb_tensor_shape(x);
    ws = tb_tensor_shape(weight);
    if (!tb__layer_float(fn, "x", x)) return NULL;
    if (ws.dtype != xs.dtype) {
        tb__error(TB_ERR_DTYPE, "%s: weight is %s and x is %s; they must match", fn,
                  tb_dtype_name(ws.dtype), tb_dtype_name(xs.dtype));
        return NULL;
    }
    if (ws.rank != 2 || xs.rank < 1 || xs.dims[xs.rank - 1] != ws.dims[1]) {
        tb__shape_text(&xs, sa);
        tb__shape_text(&ws, sb);
        tb__error(TB_ERR_SHAPE,
                  "%s: x %s and weight %s do not fit: weight is [out, in] with in "
                  "the last dim of x",
                  fn, sa, sb);
        return NULL;
    }
    if (!tb__layer_same_device(fn, x, "x", weight, "weight")) return NULL;
    if (bias != NULL && !tb__layer_vector(fn, "bias", bias, ws.dims[0], xs.dtype, x)) return NULL;
    tb__layer_start(&a, fn, x);
    y = tb__ag_keep(&a, tb_matmul(x, tb__ag_keep(&a, tb_transpose(weight, 0, 1))));
    if (bias != NULL && y != NULL) y = tb__ag_keep(&a, tb_add(y, bias));
    return tb__nn_finish(&a, y);
}

TBDEF tb_tensor *tb_embedding(tb_tensor *indices, tb_tensor *weight) {
    const char *fn = "tb_embedding";
    tb_shape is, ws;
    int64_t dims[TB_MAX_RANK], n;
    tb_tensor *flat, *rows;
    tb__ag a;
    char sb[96];
    tb__ensure_setup();
    if (indices == NULL) return tb__null_input(fn, "indices");
    if (weight == NULL) return tb__null_input(fn, "weight");
    is = tb_tensor_shape(indices);
    ws = tb_tensor_shape(weight);
    if (is.dtype != TB_I32 && is.dtype != TB_I64) {
        tb__error(TB_ERR_DTYPE, "%s: indices are %s; they must be i32 or i64", fn,
                  tb_dtype_name(is.dtype));
        return NULL;
    }
    if (ws.rank != 2) {
        tb__shape_text(&ws, sb);
        tb__error(TB_ERR_SHAPE, "%s: weight is %s; it must be [num, dim]", fn, sb);
        return NULL;
    }
    if (is.rank + 1 > TB_MAX_RANK) {
        tb__error(TB_ERR_SHAPE, "%s: indices of rank %d give a result above rank %d", fn,
                  (int)is.rank, TB_MAX_RANK);
        return NULL;
    }
    if (!tb__layer_same_device(fn, indices, "indices", weight, "weight")) return NULL;
    n = tb__shape_numel(&is);
    memcpy(dims, is.dims, sizeof(int64_t) * (size_t)is.rank);
    dims[is.rank] = ws.dims[1];
    tb__layer_start(&a, fn, weight);
    flat = tb__ag_keep(&a, tb_reshape(indices, &n, 1));
    rows = flat != NULL ? tb__ag_keep(&a, tb_index_select(weight, 0, flat)) : NULL;
    rows = rows != NULL ? tb__ag_keep(&a, tb_reshape(rows, dims, is.rank + 1)) : NULL;
    return tb__nn_finish(&a, rows);
}

TBDEF tb_tensor *tb_hardtanh(tb_tensor *x, double min_val, double max_val) {
    const char *fn = "tb_hardtanh";
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (!tb__layer_float(fn, "x", x)) return NULL;
    if (!(min_val <= max_val)) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: min_val %g is above max_val %g", fn, min_val,
                  max_val);
        return NULL;
    }
    return tb_clamp(x, min_val, max_val);
}

TBDEF tb_tensor *tb_relu6(tb_tensor *x) {
    tb__ensure_setup();
    if (x == NULL) return tb__null_input("tb_relu6", "x");
    if (!tb__layer_float("tb_relu6", "x", x)) return NULL;
    return tb_clamp(x, 0.0, 6.0);
}

/* relu6(x + 3) / 6 */
static tb_tensor *tb__layer_hardsigmoid(tb__ag *a, tb_tensor *x) {
    tb_tensor *t = tb__ag_keep(a, tb_add_scalar(x, 3.0));
    t = t != NULL ? tb__ag_keep(a, tb_clamp(t, 0.0, 6.0)) : NULL;
    return t != NULL ? tb__ag_keep(a, tb_div_scalar(t, 6.0)) : NULL;
}

TBDEF tb_tensor *tb_hardsigmoid(tb_tensor *x) {
    const char *fn = "tb_hardsigmoid";
    tb__ag a;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (!tb__layer_float(fn, "x", x)) return NULL;
    tb__layer_start(&a, fn, x);
    return tb__nn_finish(&a, tb__layer_hardsigmoid(&a, x));
}

TBDEF tb_tensor *tb_hardswish(tb_tensor *x) {
    const char *fn = "tb_hardswish";
    tb_tensor *s;
    tb__ag a;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (!tb__layer_float(fn, "x", x)) return NULL;
    tb__layer_start(&a, fn, x);
    s = tb__layer_hardsigmoid(&a, x);
    return tb__nn_finish(&a, s != NULL ? tb__ag_keep(&a, tb_mul(x, s)) : NULL);
}

/* Where j - i <= diagonal (lower) or >= diagonal (upper) over [rows, cols], as a bool matrix. */
static tb_tensor *tb__layer_band(tb__ag *a, int64_t rows, int64_t cols, int64_t diagonal,
                                 bool lower) {
    int64_t col_dims[2] = {1, cols}, row_dims[2] = {rows, 1}, lim = rows + cols;
    tb_tensor *i = tb__ag_keep(a, tb_arange(0.0, (double)rows, 1.0, TB_I64, &a->device));
    tb_tensor *j = tb__ag_keep(a, tb_arange(0.0, (double)cols, 1.0, TB_I64, &a->device));
    tb_tensor *d, *k;
    if (diagonal > lim) diagonal = lim; /* the same mask, and exact as a double */
    if (diagonal < -lim) diagonal = -lim;
    i = i != NULL ? tb__ag_keep(a, tb_reshape(i, row_dims, 2)) : NULL;
    j = j != NULL ? tb__ag_keep(a, tb_reshape(j, col_dims, 2)) : NULL;
    d = i != NULL && j != NULL ? tb__ag_keep(a, tb_sub(j, i)) : NULL;
    k = tb__ag_const(a, TB_I64, (double)diagonal);
    if (d == NULL || k == NULL) return NULL;
    return tb__ag_keep(a, lower ? tb_le(d, k) : tb_ge(d, k));
}

static tb_tensor *tb__layer_tri(const char *fn, tb_tensor *x, int64_t diagonal, bool lower) {
    tb_shape xs;
    tb_tensor *keep, *zero;
    tb__ag a;
    char sb[96];
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    xs = tb_tensor_shape(x);
    if (xs.rank < 2) {
        tb__shape_text(&xs, sb);
        tb__error(TB_ERR_SHAPE, "%s: x is %s; it needs rank 2 or more", fn, sb);
        return NULL;
    }
    tb__layer_start(&a, fn, x);
    keep = tb__layer_band(&a, xs.dims[xs.rank - 2], xs.dims[xs.rank - 1], diagonal, lower);
    zero = tb__ag_const(&a, xs.dtype, 0.0);
    return tb__nn_finish(&a, keep != NULL && zero != NULL ? tb__ag_keep(&a, tb_where(keep, x, zero))
                                                          : NULL);
}

TBDEF tb_tensor *tb_tril(tb_tensor *x, int64_t diagonal) {
    return tb__layer_tri("tb_tril", x, diagonal, true);
}

TBDEF tb_tensor *tb_triu(tb_tensor *x, int64_t diagonal) {
    return tb__layer_tri("tb_triu", x, diagonal, false);
}

TBDEF tb_tensor *tb_masked_fill(tb_tensor *x, tb_tensor *mask, double value) {
    const char *fn = "tb_masked_fill";
    tb_shape xs, ms, bs;
    tb_tensor *fill;
    tb__ag a;
    char sa[96], sb[96];
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (mask == NULL) return tb__null_input(fn, "mask");
    xs = tb_tensor_shape(x);
    ms = tb_tensor_shape(mask);
    if (ms.dtype != TB_BOOL) {
        tb__error(TB_ERR_DTYPE, "%s: mask is %s; it must be bool", fn, tb_dtype_name(ms.dtype));
        return NULL;
    }
    if (tb_shape_broadcast(&xs, &ms, &bs) != TB_OK || !tb_shape_equal(&bs, &xs)) {
        tb_clear_error();
        tb__shape_text(&ms, sa);
        tb__shape_text(&xs, sb);
        tb__error(TB_ERR_SHAPE, "%s: mask %s does not broadcast to x %s", fn, sa, sb);
        return NULL;
    }
    if (!tb__layer_same_device(fn, x, "x", mask, "mask")) return NULL;
    tb__layer_start(&a, fn, x);
    fill = tb__ag_const(&a, xs.dtype, value);
    return tb__nn_finish(&a, fill != NULL ? tb__ag_keep(&a, tb_where(mask, fill, x)) : NULL);
}

/* x's statistics vector [C] as [1, C, 1, ...] for x of rank r. */
static tb_tensor *tb__layer_per_channel(tb__ag *a, tb_tensor *v, int32_t r) {
    int64_t dims[TB_MAX_RANK];
    int32_t i;
    for (i = 0; i < r; i++)
        dims[i] = 1;
    dims[1] = tb_tensor_shape(v).dims[0];
    return tb__ag_keep(a, tb_reshape(v, dims, r));
}

/* (1 - m) * running + m * batch (batch [1, C, 1...] made [C]) */
static tb_tensor *tb__layer_running(tb__ag *a, tb_tensor *running, tb_tensor *batch, double m,
                                    double factor) {
    int64_t c = tb_tensor_shape(running).dims[0];
    tb_tensor *b = tb__ag_keep(a, tb_reshape(batch, &c, 1));
    tb_tensor *r = tb__ag_keep(a, tb_mul_scalar(running, 1.0 - m));
    b = b != NULL ? tb__ag_keep(a, tb_mul_scalar(b, m * factor)) : NULL;
    return r != NULL && b != NULL ? tb__ag_keep(a, tb_add(r, b)) : NULL;
}

static bool tb__layer_bn_args(const char *fn, tb_tensor *x, tb_tensor *rm, tb_tensor *rv,
                              tb_tensor *w, tb_tensor *b, bool training, double momentum,
                              double eps) {
    tb_shape xs = tb_tensor_shape(x);
    int64_t c, per;
    char sb[96];
    if (!tb__layer_float(fn, "x", x)) return false;
    if (xs.rank < 2) {
        tb__shape_text(&xs, sb);
        tb__error(TB_ERR_SHAPE, "%s: x is %s; it must be [N, C, ...]", fn, sb);
        return false;
    }
    if (!(momentum >= 0.0 && momentum <= 1.0) || !(eps > 0.0)) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: momentum %g must be in [0, 1] and eps %g above 0",
                  fn, momentum, eps);
        return false;
    }
    if ((rm == NULL) != (rv == NULL) || (!training && rm == NULL)) {
        tb__error(TB_ERR_INVALID_ARGUMENT,
                  "%s: running_mean and running_var are given together (and are required when "
                  "not training)",
                  fn);
        return false;
    }
    c = xs.dims[1];
    per = c > 0 ? tb__shape_numel(&xs) / c : 0;
    if (training && per <= 1) {
        tb__shape_text(&xs, sb);
        tb__error(TB_ERR_SHAPE, "%s: training needs more than one value per channel (x is %s)", fn,
                  sb);
        return false;
    }
    return (rm == NULL || tb__layer_vector(fn, "running_mean", rm, c, xs.dtype, x)) &&
           (rv == NULL || tb__layer_vector(fn, "running_var", rv, c, xs.dtype, x)) &&
           (w == NULL || tb__layer_vector(fn, "weight", w, c, xs.dtype, x)) &&
           (b == NULL || tb__layer_vector(fn, "bias", b, c, xs.dtype, x));
}

TBDEF tb_tensor *tb_batch_norm(tb_tensor *x, tb_tensor *running_mean, tb_tensor *running_var,
                               tb_tensor *weight, tb_tensor *bias, bool training, double momentum,
                               double eps) {
    const char *fn = "tb_batch_norm";
    tb_shape xs;
    int32_t axes[TB_MAX_RANK], r, i, n = 0;
    tb_tensor *mean, *var, *d, *y, *new_m = NULL, *new_v = NULL;
    tb__ag a;
    double per;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (!tb__layer_bn_args(fn, x, running_mean, running_var, weight, bias, training, momentum, eps))
        return NULL;
    xs = tb_tensor_shape(x);
    r = xs.rank;
    for (i = 0; i < r; i++)
        if (i != 1) axes[n++] = i;
    per = (double)(tb__shape_numel(&xs) / xs.dims[1]);
    tb__layer_start(&a, fn, x);
    if (training) {
        mean = tb__ag_keep(&a, tb_mean(x, axes, (size_t)n, true));
        d = mean != NULL ? tb__ag_keep(&a, tb_sub(x, mean)) : NULL;
        var = d != NULL ? tb__ag_keep(&a, tb_mul(d, d)) : NULL;
        var = var != NULL ? tb__ag_keep(&a, tb_mean(var, axes, (size_t)n, true)) : NULL;
        if (running_mean != NULL && var != NULL) {
            new_m = tb__layer_running(&a, running_mean, mean, momentum, 1.0);
            new_v = tb__layer_running(&a, running_var, var, momentum, per / (per - 1.0));
        }
    } else {
        mean = tb__layer_per_channel(&a, running_mean, r);
        var = tb__layer_per_channel(&a, running_var, r);
        d = mean != NULL ? tb__ag_keep(&a, tb_sub(x, mean)) : NULL;
    }
    y = var != NULL ? tb__ag_keep(&a, tb_add_scalar(var, eps)) : NULL;
    y = y != NULL ? tb__ag_keep(&a, tb_rsqrt(y)) : NULL;
    y = y != NULL && d != NULL ? tb__ag_keep(&a, tb_mul(d, y)) : NULL;
    if (weight != NULL && y != NULL)
        y = tb__ag_keep(&a, tb_mul(y, tb__layer_per_channel(&a, weight, r)));
    if (bias != NULL && y != NULL)
        y = tb__ag_keep(&a, tb_add(y, tb__layer_per_channel(&a, bias, r)));
    if (y != NULL && !a.failed && new_m != NULL && new_v != NULL) {
        /* the statistics only once everything else was recorded: an error leaves them */
        if (tb_assign(running_mean, new_m) != TB_OK || tb_assign(running_var, new_v) != TB_OK)
            a.failed = true;
    } else if (training && running_mean != NULL) {
        a.failed = true;
    }
    return tb__nn_finish(&a, y);
}

TBDEF tb_status tb_batch_norm_fold(tb_tensor *conv_weight, tb_tensor *conv_bias,
                                   tb_tensor *running_mean, tb_tensor *running_var,
                                   tb_tensor *bn_weight, tb_tensor *bn_bias, double eps,
                                   tb_tensor **weight_out, tb_tensor **bias_out) {
    const char *fn = "tb_batch_norm_fold";
    tb_shape ws;
    int64_t dims[TB_MAX_RANK], c;
    int32_t i;
    tb_tensor *s, *w, *b;
    tb__ag a;
    tb__ensure_setup();
    if (weight_out != NULL) *weight_out = NULL;
    if (bias_out != NULL) *bias_out = NULL;
    if (weight_out == NULL || bias_out == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: weight_out and bias_out are required", fn);
    if (conv_weight == NULL || running_mean == NULL || running_var == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: conv_weight, running_mean and running_var are required", fn);
    ws = tb_tensor_shape(conv_weight);
    if (!tb__layer_float(fn, "conv_weight", conv_weight)) return tb_last_status();
    if (ws.rank < 1 || !(eps > 0.0))
        return tb__error(ws.rank < 1 ? TB_ERR_SHAPE : TB_ERR_INVALID_ARGUMENT,
                         "%s: conv_weight needs rank 1 or more and eps (%g) must be above 0", fn,
                         eps);
    c = ws.dims[0];
    if (!tb__layer_vector(fn, "running_mean", running_mean, c, ws.dtype, conv_weight) ||
        !tb__layer_vector(fn, "running_var", running_var, c, ws.dtype, conv_weight) ||
        (conv_bias != NULL &&
         !tb__layer_vector(fn, "conv_bias", conv_bias, c, ws.dtype, conv_weight)) ||
        (bn_weight != NULL &&
         !tb__layer_vector(fn, "bn_weight", bn_weight, c, ws.dtype, conv_weight)) ||
        (bn_bias != NULL && !tb__layer_vector(fn, "bn_bias", bn_bias, c, ws.dtype, conv_weight)))
        return tb_last_status();
    for (i = 0; i < ws.rank; i++)
        dims[i] = i == 0 ? c : 1;
    tb__layer_start(&a, fn, conv_weight);
    s = tb__ag_keep(&a, tb_add_scalar(running_var, eps));
    s = s != NULL ? tb__ag_keep(&a, tb_rsqrt(s)) : NULL;
    if (bn_weight != NULL && s != NULL) s = tb__ag_keep(&a, tb_mul(s, bn_weight));
    w = s != NULL ? tb__ag_keep(&a, tb_reshape(s, dims, ws.rank)) : NULL;
    w = w != NULL ? tb__ag_keep(&a, tb_mul(conv_weight, w)) : NULL;
    b = tb__ag_keep(&a, conv_bias != NULL ? tb_sub(conv_bias, running_mean) : tb_neg(running_mean));
    b = b != NULL && s != NULL ? tb__ag_keep(&a, tb_mul(b, s)) : NULL;
    if (bn_bias != NULL && b != NULL) b = tb__ag_keep(&a, tb_add(b, bn_bias));
    if (w == NULL || b == NULL || a.failed) {
        tb__ag_free(&a);
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
    }
    *weight_out = tb_tensor_retain(w);
    *bias_out = tb_tensor_retain(b);
    tb__ag_free(&a);
    return TB_OK;
}

static bool tb__layer_sdpa_args(const char *fn, tb_tensor *q, tb_tensor *k, tb_tensor *v,
                                tb_tensor *mask, double dropout_p, bool is_causal) {
    tb_shape qs = tb_tensor_shape(q), ks = tb_tensor_shape(k), vs = tb_tensor_shape(v);
    char sa[96], sb[96], sc[96];
    if (!tb__layer_float(fn, "q", q)) return false;
    if (ks.dtype != qs.dtype || vs.dtype != qs.dtype) {
        tb__error(TB_ERR_DTYPE, "%s: q, k and v must have one dtype (%s, %s, %s)", fn,
                  tb_dtype_name(qs.dtype), tb_dtype_name(ks.dtype), tb_dtype_name(vs.dtype));
        return false;
    }
    if (qs.rank < 2 || ks.rank < 2 || vs.rank < 2 || qs.dims[qs.rank - 1] != ks.dims[ks.rank - 1] ||
        ks.dims[ks.rank - 2] != vs.dims[vs.rank - 2]) {
        tb__shape_text(&qs, sa);
        tb__shape_text(&ks, sb);
        tb__shape_text(&vs, sc);
        tb__error(TB_ERR_SHAPE,
                  "%s: q %s, k %s and v %s must be [..., L, E], [..., S, E] and "
                  "[..., S, Ev]",
                  fn, sa, sb, sc);
        return false;
    }
    if (!(dropout_p >= 0.0 && dropout_p < 1.0)) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: dropout_p %g is not in [0, 1)", fn, dropout_p);
        return false;
    }
    if (mask != NULL && is_causal) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: attn_mask and is_causal exclude each other", fn);
        return false;
    }
    if (mask != NULL && tb_tensor_shape(mask).dtype != TB_BOOL &&
        tb_tensor_shape(mask).dtype != qs.dtype) {
        tb__error(TB_ERR_DTYPE, "%s: attn_mask is %s; it must be bool or q's dtype %s", fn,
                  tb_dtype_name(tb_tensor_shape(mask).dtype), tb_dtype_name(qs.dtype));
        return false;
    }
    return tb__layer_same_device(fn, q, "q", k, "k") && tb__layer_same_device(fn, q, "q", v, "v") &&
           (mask == NULL || tb__layer_same_device(fn, q, "q", mask, "attn_mask"));
}

TBDEF tb_tensor *tb_scaled_dot_product_attention(tb_tensor *q, tb_tensor *k, tb_tensor *v,
                                                 tb_tensor *attn_mask, double dropout_p,
                                                 bool is_causal, double scale) {
    const char *fn = "tb_scaled_dot_product_attention";
    tb_shape qs, ks;
    tb_tensor *s, *p, *keep = attn_mask;
    tb__ag a;
    tb__ensure_setup();
    if (q == NULL) return tb__null_input(fn, "q");
    if (k == NULL) return tb__null_input(fn, "k");
    if (v == NULL) return tb__null_input(fn, "v");
    if (!tb__layer_sdpa_args(fn, q, k, v, attn_mask, dropout_p, is_causal)) return NULL;
    if (!(scale >= 0.0) || scale == INFINITY) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: scale %g must be finite and not negative", fn,
                  scale);
        return NULL;
    }
    qs = tb_tensor_shape(q);
    ks = tb_tensor_shape(k);
    if (scale == 0.0) scale = 1.0 / sqrt((double)qs.dims[qs.rank - 1]);
    tb__layer_start(&a, fn, q);
    s = tb__ag_keep(&a, tb_transpose(k, ks.rank - 2, ks.rank - 1));
    s = s != NULL ? tb__ag_keep(&a, tb_matmul(q, s)) : NULL;
    s = s != NULL ? tb__ag_keep(&a, tb_mul_scalar(s, scale)) : NULL;
    if (is_causal) keep = tb__layer_band(&a, qs.dims[qs.rank - 2], ks.dims[ks.rank - 2], 0, true);
    if (keep != NULL && tb_tensor_shape(keep).dtype != TB_BOOL)
        s = s != NULL ? tb__ag_keep(&a, tb_add(s, keep)) : NULL;
    else if (keep != NULL && s != NULL)
        s = tb__ag_keep(&a, tb_where(keep, s, tb__ag_const(&a, qs.dtype, -INFINITY)));
    p = s != NULL ? tb__ag_keep(&a, tb_softmax(s, -1)) : NULL;
    if (dropout_p > 0.0 && p != NULL) p = tb__ag_keep(&a, tb_dropout(p, dropout_p, true));
    return tb__nn_finish(&a, p != NULL && !a.failed ? tb__ag_keep(&a, tb_matmul(p, v)) : NULL);
}

/* A host array of `n` i64 indices or doubles of dtype dt shaped [n, 1, ...] (trailing ones)
   as a tensor on the arena's device. */
static tb_tensor *tb__layer_host(tb__ag *a, const void *data, int64_t n, tb_dtype dt,
                                 int32_t trailing) {
    tb_shape s;
    int32_t i;
    memset(&s, 0, sizeof s);
    s.dtype = dt;
    s.rank = 1 + trailing;
    s.dims[0] = n;
    for (i = 1; i <= trailing; i++)
        s.dims[i] = 1;
    return tb__ag_keep(a, tb_tensor_from_host(data, &s, &a->device));
}

/* One spatial axis `ax` of x (rank r) resampled from `in` to `out`. */
static tb_tensor *tb__layer_resample(tb__ag *a, tb_tensor *x, int32_t ax, int32_t r, int64_t in,
                                     int64_t out, tb_interpolate_mode mode, bool align) {
    int64_t *i0 = (int64_t *)malloc(sizeof(int64_t) * 2 * (size_t)out), *i1 = i0 + out, o;
    double *w = (double *)malloc(sizeof(double) * 2 * (size_t)out), scale;
    tb_dtype dt = tb_tensor_shape(x).dtype;
    tb_tensor *y = NULL, *t0, *t1, *w0, *w1;
    if (i0 == NULL || w == NULL) {
        free(i0);
        free(w);
        tb__error(TB_ERR_OUT_OF_MEMORY, "%s: no memory for %lld indices", a->fn, (long long)out);
        a->failed = true;
        return NULL;
    }
    if (mode == TB_INTERPOLATE_NEAREST) { /* PyTorch's: in single precision */
        float fs = (float)in / (float)out;
        for (o = 0; o < out; o++) {
            int64_t src = out == in ? o : (out == 2 * in ? o >> 1 : (int64_t)((float)o * fs));
            i0[o] = src < in - 1 ? src : in - 1;
        }
        t0 = tb__layer_host(a, i0, out, TB_I64, 0);
        y = t0 != NULL ? tb__ag_keep(a, tb_index_select(x, ax, t0)) : NULL;
    } else {
        scale = align ? (out > 1 ? (double)(in - 1) / (double)(out - 1) : 0.0)
                      : (double)in / (double)out;
        for (o = 0; o < out; o++) {
            double src = align ? scale * (double)o : scale * ((double)o + 0.5) - 0.5;
            if (src < 0.0) src = 0.0;
            i0[o] = (int64_t)src;
            if (i0[o] > in - 1) i0[o] = in - 1;
            i1[o] = i0[o] < in - 1 ? i0[o] + 1 : i0[o];
            w[out + o] = src - (double)i0[o];
            w[o] = 1.0 - w[out + o];
        }
        t0 = tb__layer_host(a, i0, out, TB_I64, 0);
        t1 = tb__layer_host(a, i1, out, TB_I64, 0);
        w0 = tb__layer_host(a, w, out, TB_F64, r - 1 - ax);
        w1 = tb__layer_host(a, w + out, out, TB_F64, r - 1 - ax);
        w0 = w0 != NULL ? tb__ag_keep(a, tb_cast(w0, dt)) : NULL;
        w1 = w1 != NULL ? tb__ag_keep(a, tb_cast(w1, dt)) : NULL;
        t0 = t0 != NULL ? tb__ag_keep(a, tb_index_select(x, ax, t0)) : NULL;
        t1 = t1 != NULL ? tb__ag_keep(a, tb_index_select(x, ax, t1)) : NULL;
        t0 = t0 != NULL && w0 != NULL ? tb__ag_keep(a, tb_mul(t0, w0)) : NULL;
        t1 = t1 != NULL && w1 != NULL ? tb__ag_keep(a, tb_mul(t1, w1)) : NULL;
        y = t0 != NULL && t1 != NULL ? tb__ag_keep(a, tb_add(t0, t1)) : NULL;
    }
    free(i0);
    free(w);
    return y;
}

TBDEF tb_tensor *tb_interpolate(tb_tensor *x, const int64_t *size, size_t num_size,
                                tb_interpolate_mode mode, bool align_corners) {
    const char *fn = "tb_interpolate";
    tb_shape xs;
    tb_tensor *y;
    tb__ag a;
    size_t i;
    char sb[96];
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (size == NULL) return tb__null_input(fn, "size");
    if (!tb__layer_float(fn, "x", x)) return NULL;
    xs = tb_tensor_shape(x);
    if ((xs.rank != 3 && xs.rank != 4) || num_size != (size_t)xs.rank - 2) {
        tb__shape_text(&xs, sb);
        tb__error(TB_ERR_SHAPE,
                  "%s: x %s with %zu sizes; x is [N, C, L] with one size or "
                  "[N, C, H, W] with two",
                  fn, sb, num_size);
        return NULL;
    }
    if (mode != TB_INTERPOLATE_NEAREST && mode != TB_INTERPOLATE_BILINEAR) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: mode %d is not a tb_interpolate_mode", fn,
                  (int)mode);
        return NULL;
    }
    if (mode == TB_INTERPOLATE_NEAREST && align_corners) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: align_corners is for bilinear only", fn);
        return NULL;
    }
    for (i = 0; i < num_size; i++)
        if (size[i] <= 0 || size[i] > ((int64_t)1 << 40) || xs.dims[2 + i] == 0) {
            tb__error(TB_ERR_INVALID_ARGUMENT,
                      "%s: size %lld of axis %zu must be in [1, 2^40] and the input's size "
                      "above 0",
                      fn, (long long)size[i], 2 + i);
            return NULL;
        }
    tb__layer_start(&a, fn, x);
    y = x;
    for (i = 0; i < num_size && y != NULL; i++)
        y = tb__layer_resample(&a, y, (int32_t)(2 + i), xs.rank, xs.dims[2 + i], size[i], mode,
                               align_corners);
    if (y == x) y = tb__ag_keep(&a, tb_tensor_retain(x));
    return tb__nn_finish(&a, y);
}
