/* ===========================================================================================
   Ops: movement (views: reshape, permute, expand, slice, window, ...) and copies (concat, pad,
   gather, ...), recorded with the plumbing of ops.c.
   =========================================================================================== */
#include "../impl_begin.h"

/* ---- movement ---- */

TBDEF tb_tensor *tb_reshape(tb_tensor *x, const int64_t *dims, int32_t rank) {
    const char *fn = "tb_reshape";
    tb__arg arg;
    tb_device device;
    int64_t out[TB_MAX_RANK];
    int64_t numel, known = 1;
    int32_t i, infer = -1;
    tb_node *node = NULL;
    char want[256];
    tb__shape_buf b;
    bool zero_known = false;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (rank < 0 || rank > TB_MAX_RANK) {
        tb__error(TB_ERR_SHAPE, "%s: rank %d is out of range (0..%d)", fn, (int)rank, TB_MAX_RANK);
        return NULL;
    }
    if (rank > 0 && dims == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: dims is NULL", fn);
        return NULL;
    }
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    tb__dims_text(dims, rank, want, sizeof want);
    for (i = 0; i < rank; i++) {
        out[i] = dims[i];
        if (dims[i] == -1 && infer < 0) {
            infer = i;
        } else if (dims[i] < 0) {
            tb__error(TB_ERR_SHAPE, "%s: cannot reshape %s to %s (%s)", fn, tb__st(&arg.shape, &b),
                      want, dims[i] == -1 ? "only one dim may be -1" : "negative dim");
            goto done;
        } else if (dims[i] == 0) {
            zero_known = true;
        } else if (!zero_known) {
            if (!tb__mul_i64(known, dims[i], &known)) {
                tb__error(TB_ERR_OVERFLOW, "%s: the size of %s overflows", fn, want);
                goto done;
            }
        }
    }
    numel = tb__shape_numel(&arg.shape);
    if (infer >= 0) {
        if (zero_known) {
            tb__error(TB_ERR_SHAPE,
                      "%s: cannot reshape %s to %s: the -1 is ambiguous next to a 0 dim", fn,
                      tb__st(&arg.shape, &b), want);
            goto done;
        }
        if (numel % known != 0) {
            tb__error(TB_ERR_SHAPE, "%s: cannot reshape %s (%lld elements) to %s", fn,
                      tb__st(&arg.shape, &b), (long long)numel, want);
            goto done;
        }
        out[infer] = numel / known;
    } else if ((zero_known ? 0 : known) != numel) {
        tb__error(TB_ERR_SHAPE, "%s: cannot reshape %s (%lld elements) to %s", fn,
                  tb__st(&arg.shape, &b), (long long)numel, want);
        goto done;
    }
    node = tb__record(fn, TB_OP_RESHAPE, &device, &arg.node, 1, out, (size_t)rank, NULL);
done:
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

/* A PERMUTE of x by the already normalised `perm`. */
static tb_tensor *tb__permute_arg(const char *fn, tb__arg *arg, const tb_device *device,
                                  const int64_t *perm) {
    tb_node *node =
        tb__record(fn, TB_OP_PERMUTE, device, &arg->node, 1, perm, (size_t)arg->shape.rank, NULL);
    tb__args_release(arg, 1);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_permute(tb_tensor *x, const int32_t *perm, int32_t rank) {
    const char *fn = "tb_permute";
    tb__arg arg;
    tb_device device;
    int64_t p[TB_MAX_RANK];
    int32_t i, seen = 0;
    tb__shape_buf b;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (rank != arg.shape.rank) {
        tb__error(TB_ERR_SHAPE, "%s: a permutation of %d axes for %s", fn, (int)rank,
                  tb__st(&arg.shape, &b));
        tb__args_release(&arg, 1);
        return NULL;
    }
    if (rank > 0 && perm == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: perm is NULL", fn);
        tb__args_release(&arg, 1);
        return NULL;
    }
    for (i = 0; i < rank; i++) {
        int32_t a;
        if (tb__norm_axis(fn, "axis", perm[i], rank, &arg.shape, &a) != TB_OK) {
            tb__args_release(&arg, 1);
            return NULL;
        }
        if (((seen >> a) & 1) != 0) {
            tb__error(TB_ERR_SHAPE, "%s: axis %d appears more than once in the permutation of %s",
                      fn, (int)perm[i], tb__st(&arg.shape, &b));
            tb__args_release(&arg, 1);
            return NULL;
        }
        seen |= 1 << a;
        p[i] = a;
    }
    return tb__permute_arg(fn, &arg, &device, p);
}

TBDEF tb_tensor *tb_transpose(tb_tensor *x, int32_t dim0, int32_t dim1) {
    const char *fn = "tb_transpose";
    tb__arg arg;
    tb_device device;
    int64_t p[TB_MAX_RANK];
    int32_t i, a0, a1;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (tb__norm_axis(fn, "dim0", dim0, arg.shape.rank, &arg.shape, &a0) != TB_OK ||
        tb__norm_axis(fn, "dim1", dim1, arg.shape.rank, &arg.shape, &a1) != TB_OK) {
        tb__args_release(&arg, 1);
        return NULL;
    }
    for (i = 0; i < arg.shape.rank; i++)
        p[i] = i;
    if (arg.shape.rank > 0) {
        p[a0] = a1;
        p[a1] = a0;
    }
    return tb__permute_arg(fn, &arg, &device, p);
}

TBDEF tb_tensor *tb_expand(tb_tensor *x, const int64_t *dims, int32_t rank) {
    const char *fn = "tb_expand";
    tb__arg arg;
    tb_device device;
    int64_t out[TB_MAX_RANK];
    int32_t i, lead;
    tb_node *node = NULL;
    tb__shape_buf b;
    char want[256];
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (rank > 0 && dims == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: dims is NULL", fn);
        return NULL;
    }
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (rank < arg.shape.rank || rank > TB_MAX_RANK) {
        tb__error(TB_ERR_SHAPE, "%s: cannot expand %s to %d dims (%d..%d)", fn,
                  tb__st(&arg.shape, &b), (int)rank, (int)arg.shape.rank, TB_MAX_RANK);
        goto done;
    }
    tb__dims_text(dims, rank, want, sizeof want);
    lead = rank - arg.shape.rank;
    for (i = 0; i < rank; i++) {
        out[i] = dims[i];
        if (dims[i] == -1 && i >= lead) {
            out[i] = arg.shape.dims[i - lead];
        } else if (dims[i] < 0) {
            tb__error(TB_ERR_SHAPE, "%s: cannot expand %s to %s (dim %d: %s)", fn,
                      tb__st(&arg.shape, &b), want, (int)i,
                      dims[i] == -1 ? "-1 is not allowed for a new leading dim" : "negative");
            goto done;
        } else if (i >= lead && arg.shape.dims[i - lead] != 1 &&
                   arg.shape.dims[i - lead] != dims[i]) {
            tb__error(TB_ERR_SHAPE,
                      "%s: cannot expand %s to %s (dim %d: %lld must be 1 or stay %lld)", fn,
                      tb__st(&arg.shape, &b), want, (int)i, (long long)arg.shape.dims[i - lead],
                      (long long)arg.shape.dims[i - lead]);
            goto done;
        }
    }
    node = tb__record(fn, TB_OP_EXPAND, &device, &arg.node, 1, out, (size_t)rank, NULL);
done:
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_squeeze(tb_tensor *x, int32_t dim) {
    const char *fn = "tb_squeeze";
    tb__arg arg;
    tb_device device;
    int64_t out[TB_MAX_RANK];
    int32_t i, d, r = 0;
    tb_node *node = NULL;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (tb__norm_axis(fn, "dim", dim, arg.shape.rank, &arg.shape, &d) != TB_OK) goto done;
    if (arg.shape.rank > 0 && arg.shape.dims[d] != 1) {
        tb__shape_buf b;
        tb__error(TB_ERR_SHAPE, "%s: dim %d of %s has size %lld, not 1", fn, (int)dim,
                  tb__st(&arg.shape, &b), (long long)arg.shape.dims[d]);
        goto done;
    }
    for (i = 0; i < arg.shape.rank; i++) {
        if (i != d) out[r++] = arg.shape.dims[i];
    }
    node = tb__record(fn, TB_OP_RESHAPE, &device, &arg.node, 1, out, (size_t)r, NULL);
done:
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_unsqueeze(tb_tensor *x, int32_t dim) {
    const char *fn = "tb_unsqueeze";
    tb__arg arg;
    tb_device device;
    int64_t out[TB_MAX_RANK];
    int32_t i, d, r = 0;
    tb_node *node = NULL;
    tb__shape_buf b;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (arg.shape.rank >= TB_MAX_RANK) {
        tb__error(TB_ERR_SHAPE, "%s: %s already has the largest rank (%d)", fn,
                  tb__st(&arg.shape, &b), TB_MAX_RANK);
        goto done;
    }
    if (dim < -(arg.shape.rank + 1) || dim > arg.shape.rank) {
        tb__error(TB_ERR_SHAPE, "%s: dim %d is out of range for %s (expected %d..%d)", fn, (int)dim,
                  tb__st(&arg.shape, &b), (int)-(arg.shape.rank + 1), (int)arg.shape.rank);
        goto done;
    }
    d = dim < 0 ? dim + arg.shape.rank + 1 : dim;
    for (i = 0; i <= arg.shape.rank; i++) {
        if (i == d) out[r++] = 1;
        if (i < arg.shape.rank) out[r++] = arg.shape.dims[i];
    }
    node = tb__record(fn, TB_OP_RESHAPE, &device, &arg.node, 1, out, (size_t)r, NULL);
done:
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_slice(tb_tensor *x, int32_t dim, int64_t start, int64_t end, int64_t step) {
    const char *fn = "tb_slice";
    tb__arg arg;
    tb_device device;
    int64_t attrs[4], size;
    int32_t d;
    tb_node *node = NULL;
    tb__shape_buf b;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (arg.shape.rank == 0) {
        tb__error(TB_ERR_SHAPE, "%s: cannot slice a rank-0 tensor %s", fn, tb__st(&arg.shape, &b));
        goto done;
    }
    if (tb__norm_axis(fn, "dim", dim, arg.shape.rank, &arg.shape, &d) != TB_OK) goto done;
    if (step < 1) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: step %lld must be >= 1 (slicing %s)", fn,
                  (long long)step, tb__st(&arg.shape, &b));
        goto done;
    }
    size = arg.shape.dims[d];
    /* Python's rules: negative bounds count from the end, then both are clamped */
    if (start < 0) start = start + size < 0 ? 0 : start + size;
    if (start > size) start = size;
    if (end < 0) end = end + size < 0 ? 0 : end + size;
    if (end > size) end = size;
    if (end < start) end = start;
    attrs[0] = d;
    attrs[1] = start;
    attrs[2] = end;
    attrs[3] = step;
    node = tb__record(fn, TB_OP_SLICE, &device, &arg.node, 1, attrs, 4, NULL);
done:
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_window(tb_tensor *x, size_t num_spatial, const int64_t *kernel,
                           const int64_t *stride, const int64_t *dilation) {
    const char *fn = "tb_window";
    tb__arg arg;
    tb_device device;
    int64_t attrs[1 + 4 * 3];
    int32_t lead, i, n = (int32_t)num_spatial;
    tb_node *node = NULL;
    tb__shape_buf b;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (kernel == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: kernel is NULL", fn);
        return NULL;
    }
    if (num_spatial < 1 || num_spatial > 3) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: num_spatial is %zu; 1, 2 or 3 dims are supported",
                  fn, num_spatial);
        return NULL;
    }
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (arg.shape.rank < n) {
        tb__error(TB_ERR_SHAPE, "%s: %s has fewer than %d dims", fn, tb__st(&arg.shape, &b), n);
        goto done;
    }
    lead = arg.shape.rank - n;
    attrs[0] = n;
    for (i = 0; i < n; i++) {
        int64_t k = kernel[i], s = stride != NULL ? stride[i] : 1;
        int64_t d = dilation != NULL ? dilation[i] : 1, len = arg.shape.dims[lead + i], span;
        if (k < 1 || s < 1 || d < 1) {
            tb__error(TB_ERR_INVALID_ARGUMENT,
                      "%s: kernel %lld, stride %lld and dilation %lld (spatial dim %d) must each "
                      "be >= 1",
                      fn, (long long)k, (long long)s, (long long)d, (int)i);
            goto done;
        }
        if (!tb__muladd_i64(k - 1, d, 1, &span) || span > len) {
            tb__error(TB_ERR_SHAPE,
                      "%s: a window of %lld with dilation %lld spans more than dim %d of %s "
                      "(size %lld)",
                      fn, (long long)k, (long long)d, (int)(lead + i), tb__st(&arg.shape, &b),
                      (long long)len);
            goto done;
        }
        attrs[1 + 4 * i] = (len - span) / s + 1;
        attrs[2 + 4 * i] = k;
        attrs[3 + 4 * i] = s;
        attrs[4 + 4 * i] = d;
    }
    node = tb__record(fn, TB_OP_WINDOW, &device, &arg.node, 1, attrs, 1 + 4 * (size_t)n, NULL);
done:
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_flip(tb_tensor *x, const int32_t *dims, size_t num_dims) {
    const char *fn = "tb_flip";
    tb__arg arg;
    tb_device device;
    int64_t seen = 0, mask;
    size_t i;
    tb_node *node = NULL;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (num_dims > 0 && dims == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: dims is NULL", fn);
        return NULL;
    }
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    for (i = 0; i < num_dims; i++) {
        int32_t a;
        if (tb__norm_axis(fn, "dim", dims[i], arg.shape.rank, &arg.shape, &a) != TB_OK) goto done;
        if (((seen >> a) & 1) != 0) {
            tb__shape_buf b;
            tb__error(TB_ERR_SHAPE, "%s: dim %d appears more than once in the dims of %s", fn,
                      (int)dims[i], tb__st(&arg.shape, &b));
            goto done;
        }
        seen |= (int64_t)1 << a;
    }
    mask = arg.shape.rank > 0 ? seen : 0;
    node = tb__record(fn, TB_OP_FLIP, &device, &arg.node, 1, &mask, 1, NULL);
done:
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

/* ---- copies ---- */

TBDEF tb_tensor *tb_concat(tb_tensor *const *tensors, size_t count, int32_t dim) {
    const char *fn = "tb_concat";
    tb__arg *args = NULL;
    tb_node **operands = NULL;
    tb_device device;
    size_t i, n = 0, ref;
    bool any_kept = false;
    tb_dtype t;
    int32_t d, j;
    int64_t attr;
    tb_node *node = NULL;
    tb__ensure_setup();
    if (tensors == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: tensors is NULL", fn);
        return NULL;
    }
    if (count == 0) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: no tensors to concatenate (count 0)", fn);
        return NULL;
    }
    for (i = 0; i < count; i++) {
        if (tensors[i] == NULL) {
            char what[48];
            snprintf(what, sizeof what, "tensors[%zu]", i);
            return tb__null_input(fn, what);
        }
    }
    args = (tb__arg *)tb__calloc(count, sizeof *args);
    operands = (tb_node **)tb__calloc(count, sizeof *operands);
    if (args == NULL || operands == NULL) goto fail_alloc;
    if (tb__args_get(fn, tensors, count, args, &device) != TB_OK) goto fail_alloc;
    t = args[0].shape.dtype;
    for (i = 0; i < count; i++) {
        tb__shape_buf b;
        if (args[i].shape.rank == 0) {
            tb__error(TB_ERR_SHAPE, "%s: tensors[%zu] %s has rank 0 and cannot be concatenated", fn,
                      i, tb__st(&args[i].shape, &b));
            goto done;
        }
        t = tb_dtype_promote(t, args[i].shape.dtype);
    }
    /* PyTorch skips 1-D empty tensors whatever the other shapes are (legacy behaviour) */
    for (i = 0; i < count; i++) {
        if (!(args[i].shape.rank == 1 && args[i].shape.dims[0] == 0)) any_kept = true;
    }
    ref = 0;
    for (i = 0; i < count && any_kept; i++) {
        if (!(args[i].shape.rank == 1 && args[i].shape.dims[0] == 0)) {
            ref = i;
            break;
        }
    }
    if (tb__norm_axis(fn, "dim", dim, args[ref].shape.rank, &args[ref].shape, &d) != TB_OK) {
        goto done;
    }
    for (i = 0; i < count; i++) {
        const tb_shape *s = &args[i].shape, *r0 = &args[ref].shape;
        bool ok = s->rank == r0->rank;
        if (any_kept && s->rank == 1 && s->dims[0] == 0) continue;
        for (j = 0; ok && j < s->rank; j++)
            ok = j == d || s->dims[j] == r0->dims[j];
        if (!ok) {
            tb__shape_buf a, b;
            tb__error(TB_ERR_SHAPE,
                      "%s: shapes %s (tensors[%zu]) and %s (tensors[%zu]) differ outside dim %d",
                      fn, tb__st(r0, &a), ref, tb__st(s, &b), i, (int)d);
            goto done;
        }
        operands[n] = tb__cast_node(fn, args[i].node, t);
        if (operands[n] == NULL) goto done;
        n++;
    }
    attr = d;
    node = tb__record(fn, TB_OP_CONCAT, &device, operands, n, &attr, 1, NULL);
done:
    for (i = 0; i < n; i++)
        tb__node_release(operands[i]);
    tb__args_release(args, count);
    tb__free(operands);
    tb__free(args);
    return tb__finish(node);
fail_alloc:
    tb__free(operands);
    tb__free(args);
    return NULL;
}

TBDEF tb_tensor *tb_pad(tb_tensor *x, const int64_t *pads, size_t num_pads, double value) {
    const char *fn = "tb_pad";
    tb__arg arg;
    tb_device device;
    int64_t attrs[2 * TB_MAX_RANK];
    tb_node *operands[2] = {NULL, NULL}, *node = NULL;
    tb_scalar s;
    tb__shape_buf b;
    size_t i;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (num_pads > 0 && pads == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: pads is NULL", fn);
        return NULL;
    }
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (num_pads % 2 != 0) {
        tb__error(TB_ERR_INVALID_ARGUMENT,
                  "%s: %zu pad values for %s; a (before, after) pair "
                  "per dim is needed",
                  fn, num_pads, tb__st(&arg.shape, &b));
        goto done;
    }
    if (num_pads / 2 > (size_t)arg.shape.rank) {
        tb__error(TB_ERR_SHAPE, "%s: %zu pad values pad %zu dims but %s has rank %d", fn, num_pads,
                  num_pads / 2, tb__st(&arg.shape, &b), (int)arg.shape.rank);
        goto done;
    }
    memset(attrs, 0, sizeof attrs);
    for (i = 0; i < num_pads; i++) {
        /* pads run from the last dim backwards, as F.pad; attrs run from dim 0 */
        size_t axis = (size_t)arg.shape.rank - 1 - i / 2;
        if (pads[i] < 0) {
            tb__error(TB_ERR_INVALID_ARGUMENT, "%s: pad value %zu is negative (%lld) for %s", fn, i,
                      (long long)pads[i], tb__st(&arg.shape, &b));
            goto done;
        }
        attrs[2 * axis + i % 2] = pads[i];
    }
    if (tb__scalar_from_double(fn, value, arg.shape.dtype, &s) != TB_OK) goto done;
    operands[0] = arg.node;
    operands[1] = tb__wrapped_scalar(fn, s, &device);
    if (operands[1] == NULL) goto done;
    node = tb__record(fn, TB_OP_PAD, &device, operands, 2, attrs, 2 * (size_t)arg.shape.rank, NULL);
done:
    tb__node_release(operands[1]);
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

/* GATHER or INDEX_SELECT; rank-0 operands are viewed as [1] (the node form) and the result
   reshaped back, as PyTorch treats them. */
static tb_tensor *tb__gather(const char *fn, tb_op op, tb_tensor *x, int32_t dim,
                             tb_tensor *index) {
    tb_tensor *tensors[2];
    tb__arg args[2];
    tb_device device;
    tb_node *operands[2] = {NULL, NULL}, *node = NULL;
    tb_shape *sx, *si;
    tb__shape_buf a, b;
    int64_t attr;
    int32_t d, out_rank = -1;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (index == NULL) return tb__null_input(fn, "index");
    tensors[0] = x;
    tensors[1] = index;
    if (tb__args_get(fn, tensors, 2, args, &device) != TB_OK) return NULL;
    sx = &args[0].shape;
    si = &args[1].shape;
    if (tb__need_index(fn, si) != TB_OK) goto done;
    if (tb__norm_axis(fn, "dim", dim, sx->rank, sx, &d) != TB_OK) goto done;
    if (op == TB_OP_GATHER) {
        int32_t rx = sx->rank > 0 ? sx->rank : 1, ri = si->rank > 0 ? si->rank : 1;
        if (rx != ri) {
            tb__error(TB_ERR_SHAPE, "%s: index %s must have the rank of %s", fn, tb__st(si, &b),
                      tb__st(sx, &a));
            goto done;
        }
        if (si->rank == 0) out_rank = 0;
    } else {
        if (si->rank > 1) {
            tb__error(TB_ERR_SHAPE, "%s: index must be 1-D, got %s", fn, tb__st(si, &b));
            goto done;
        }
        if (sx->rank == 0) {
            if (si->rank == 1 && si->dims[0] != 1) {
                tb__error(TB_ERR_SHAPE, "%s: index %s for the rank-0 %s must have one element", fn,
                          tb__st(si, &b), tb__st(sx, &a));
                goto done;
            }
            out_rank = 0;
        }
    }
    operands[0] = tb__view_node(fn, TB_OP_RESHAPE, args[0].node, sx->rank > 0 ? sx->rank : 1,
                                sx->rank > 0 ? sx->dims : tb__one_dim);
    if (operands[0] == NULL) goto done;
    operands[1] = tb__view_node(fn, TB_OP_RESHAPE, args[1].node, si->rank > 0 ? si->rank : 1,
                                si->rank > 0 ? si->dims : tb__one_dim);
    if (operands[1] == NULL) goto done;
    attr = d;
    node = tb__record(fn, op, &device, operands, 2, &attr, 1, NULL);
    if (out_rank == 0) node = tb__view_take(fn, TB_OP_RESHAPE, node, 0, NULL);
done:
    tb__node_release(operands[0]);
    tb__node_release(operands[1]);
    tb__args_release(args, 2);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_gather(tb_tensor *x, int32_t dim, tb_tensor *index) {
    return tb__gather("tb_gather", TB_OP_GATHER, x, dim, index);
}
TBDEF tb_tensor *tb_index_select(tb_tensor *x, int32_t dim, tb_tensor *index) {
    return tb__gather("tb_index_select", TB_OP_INDEX_SELECT, x, dim, index);
}
