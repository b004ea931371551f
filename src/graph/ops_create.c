/* ===========================================================================================
   Ops: any op by its id (tb_call_op), and the creation functions (full, arange, eye, random).
   =========================================================================================== */
#include "../impl_begin.h"

/* ---- any op by id ---- */

TBDEF tb_tensor *tb_call_op(tb_op op, tb_tensor *const *inputs, size_t num_inputs,
                            const int64_t *attrs, size_t num_attrs) {
    char fn[TB_MAX_NAME + 16];
    const char *name;
    tb__arg *args;
    tb_node **operands;
    tb_device device;
    tb_node *node = NULL;
    size_t i;
    tb__ensure_setup();
    name = tb_op_name(op);
    if (name == NULL) {
        tb__error(TB_ERR_NOT_FOUND, "tb_call_op: unknown op %d", (int)op);
        return NULL;
    }
    snprintf(fn, sizeof fn, "tb_call_op(%s)", name);
    if (op < (tb_op)TB_OP_BUILTIN_COUNT && tb_op_get_kind(op) == TB_KIND_LEAF) {
        tb__error(TB_ERR_UNSUPPORTED, "%s: a leaf op is created by its own function", fn);
        return NULL;
    }
    if (op == TB_OP_COLLECTIVE) {
        tb__error(TB_ERR_UNSUPPORTED,
                  "%s: a collective is recorded by tb_all_reduce, tb_all_gather, "
                  "tb_reduce_scatter or tb_broadcast",
                  fn);
        return NULL;
    }
    if (num_inputs == 0 || inputs == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: no inputs (inputs %s, num_inputs %zu)", fn,
                  inputs == NULL ? "NULL" : "given", num_inputs);
        return NULL;
    }
    if (num_attrs > TB_MAX_ATTRS) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %zu attributes (at most %d)", fn, num_attrs,
                  TB_MAX_ATTRS);
        return NULL;
    }
    if (num_attrs > 0 && attrs == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: attrs is NULL", fn);
        return NULL;
    }
    for (i = 0; i < num_inputs; i++) {
        if (inputs[i] == NULL) {
            char what[48];
            snprintf(what, sizeof what, "inputs[%zu]", i);
            return tb__null_input(fn, what);
        }
    }
    args = (tb__arg *)tb__calloc(num_inputs, sizeof *args);
    operands = (tb_node **)tb__calloc(num_inputs, sizeof *operands);
    if (args != NULL && operands != NULL &&
        tb__args_get(fn, inputs, num_inputs, args, &device) == TB_OK) {
        for (i = 0; i < num_inputs; i++)
            operands[i] = args[i].node;
        node = tb__record(fn, op, &device, operands, num_inputs, attrs, num_attrs, NULL);
        tb__args_release(args, num_inputs);
    }
    tb__free(operands);
    tb__free(args);
    return tb__finish(node);
}

/* ---- creation ---- */

/* A new leaf node on `device`, announced, as a tensor. */
static tb_tensor *tb__leaf_tensor(const char *fn, tb_node *node) {
    if (node != NULL && tb__announce(fn, node) != TB_OK) {
        tb__node_release(node);
        node = NULL;
    }
    return tb__finish(node);
}

TBDEF tb_tensor *tb_scalar_tensor(tb_scalar value, const tb_device *device) {
    const char *fn = "tb_scalar_tensor";
    tb_device dev;
    tb__ensure_setup();
    if (!tb_dtype_is_valid(value.dtype)) {
        tb__error(TB_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)value.dtype);
        return NULL;
    }
    if (tb_dtype_is_float(value.dtype)) {
        value = tb__float_scalar(value.dtype, value.f);
    } else if (value.dtype == TB_BOOL) {
        value.i = value.i != 0 ? 1 : 0;
        value.f = (double)value.i;
    } else {
        bool fits = value.dtype == TB_I64 ||
                    (value.dtype == TB_I32 && value.i >= INT32_MIN && value.i <= INT32_MAX) ||
                    (value.dtype == TB_U8 && value.i >= 0 && value.i <= 255);
        if (!fits) {
            tb__error(TB_ERR_INVALID_ARGUMENT, "%s: value %lld does not fit in %s", fn,
                      (long long)value.i, tb_dtype_name(value.dtype));
            return NULL;
        }
        value.f = (double)value.i;
    }
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    return tb__leaf_tensor(fn, tb__node_scalar(value, &dev, false));
}

/* A SCALAR of the shape's dtype viewed as [1,...,1] and expanded: one parameter, no data. */
static tb_tensor *tb__full(const char *fn, const tb_shape *shape, double value,
                           const tb_device *device) {
    tb_scalar s;
    tb_device dev;
    tb_node *node;
    int64_t ones[TB_MAX_RANK];
    int32_t i;
    tb__ensure_setup();
    if (tb__check_user_shape(fn, shape) != TB_OK) return NULL;
    if (tb__scalar_from_double(fn, value, shape->dtype, &s) != TB_OK) return NULL;
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    node = tb__node_scalar(s, &dev, false);
    if (node != NULL && tb__announce(fn, node) != TB_OK) {
        tb__node_release(node);
        node = NULL;
    }
    if (node != NULL && shape->rank > 0) {
        for (i = 0; i < shape->rank; i++)
            ones[i] = 1;
        node = tb__view_take(fn, TB_OP_RESHAPE, node, shape->rank, ones);
        node = tb__view_take(fn, TB_OP_EXPAND, node, shape->rank, shape->dims);
    }
    return tb__finish(node);
}

TBDEF tb_tensor *tb_full(const tb_shape *shape, double value, const tb_device *device) {
    return tb__full("tb_full", shape, value, device);
}
TBDEF tb_tensor *tb_zeros(const tb_shape *shape, const tb_device *device) {
    return tb__full("tb_zeros", shape, 0.0, device);
}
TBDEF tb_tensor *tb_ones(const tb_shape *shape, const tb_device *device) {
    return tb__full("tb_ones", shape, 1.0, device);
}

TBDEF tb_tensor *tb_arange(double start, double end, double step, tb_dtype dtype,
                           const tb_device *device) {
    const char *fn = "tb_arange";
    tb_shape shape;
    tb_device dev;
    double size, fattrs[2];
    tb__ensure_setup();
    if (!tb_dtype_is_valid(dtype) || dtype == TB_BOOL) {
        tb__error(TB_ERR_DTYPE, "%s: dtype %s is not supported (a number dtype is needed)", fn,
                  tb_dtype_name(dtype));
        return NULL;
    }
    if (!tb__is_finite(start) || !tb__is_finite(end) || !tb__is_finite(step)) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: start %g, end %g and step %g must be finite", fn,
                  start, end, step);
        return NULL;
    }
    if (!tb_dtype_is_float(dtype)) {
        if (fabs(start) >= 9223372036854775808.0 || fabs(end) >= 9223372036854775808.0 ||
            fabs(step) >= 9223372036854775808.0) {
            tb__error(TB_ERR_OVERFLOW, "%s: start %g, end %g or step %g does not fit in int64", fn,
                      start, end, step);
            return NULL;
        }
        /* integer ranges run on whole numbers, as PyTorch's int64 arange */
        start = start < 0 ? ceil(start) : floor(start);
        end = end < 0 ? ceil(end) : floor(end);
        step = step < 0 ? ceil(step) : floor(step);
    }
    if (step == 0.0) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: step must be nonzero (start %g, end %g)", fn, start,
                  end);
        return NULL;
    }
    if ((step > 0 && end < start) || (step < 0 && end > start)) {
        tb__error(TB_ERR_INVALID_ARGUMENT,
                  "%s: end %g lies on the wrong side of start %g for step %g", fn, end, start,
                  step);
        return NULL;
    }
    size = ceil((end - start) / step);
    if (!(size >= 0.0 && size < 9223372036854775808.0)) {
        tb__error(TB_ERR_OVERFLOW, "%s: [%g, %g) by %g has too many elements", fn, start, end,
                  step);
        return NULL;
    }
    memset(&shape, 0, sizeof shape);
    shape.dtype = dtype;
    shape.rank = 1;
    shape.dims[0] = (int64_t)size;
    if (tb__check_fits(fn, &shape) != TB_OK) return NULL;
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    fattrs[0] = start;
    fattrs[1] = step;
    return tb__finish(tb__emit(fn, TB_OP_ARANGE, &shape, &dev, NULL, 0, NULL, 0, fattrs));
}

TBDEF tb_tensor *tb_eye(int64_t n, int64_t m, tb_dtype dtype, const tb_device *device) {
    const char *fn = "tb_eye";
    tb_shape shape;
    tb_device dev;
    tb__ensure_setup();
    if (!tb_dtype_is_valid(dtype)) {
        tb__error(TB_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)dtype);
        return NULL;
    }
    if (n < 0) {
        tb__error(TB_ERR_SHAPE, "%s: n must be >= 0, got %lld", fn, (long long)n);
        return NULL;
    }
    if (m < 0) m = n;
    memset(&shape, 0, sizeof shape);
    shape.dtype = dtype;
    shape.rank = 2;
    shape.dims[0] = n;
    shape.dims[1] = m;
    if (tb__check_fits(fn, &shape) != TB_OK) return NULL;
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    return tb__finish(tb__emit(fn, TB_OP_EYE, &shape, &dev, NULL, 0, NULL, 0, NULL));
}

/* The uint64 bits as an int64 (two's complement), without implementation-defined casts. */
static int64_t tb__u64_bits(uint64_t v) {
    if (v <= (uint64_t)INT64_MAX) return (int64_t)v;
    return -(int64_t)(~v) - 1;
}

static tb_node *tb__i64_scalar_node(const char *fn, uint64_t bits, const tb_device *device) {
    tb_scalar s;
    tb_node *node;
    memset(&s, 0, sizeof s);
    s.dtype = TB_I64;
    s.i = tb__u64_bits(bits);
    s.f = (double)s.i;
    node = tb__node_scalar(s, device, false);
    if (node != NULL && tb__announce(fn, node) != TB_OK) {
        tb__node_release(node);
        node = NULL;
    }
    return node;
}

static tb_tensor *tb__random(const char *fn, tb_op op, const tb_shape *shape,
                             const tb_device *device) {
    tb_device dev;
    tb_node *operands[2] = {NULL, NULL}, *node = NULL;
    uint64_t seed = 0, offset = 0, numel = 1;
    int32_t i;
    tb__ensure_setup();
    if (tb__check_user_shape(fn, shape) != TB_OK) return NULL;
    if (!tb_dtype_is_float(shape->dtype)) {
        tb__shape_buf b;
        tb__error(TB_ERR_DTYPE, "%s: %s is not a float shape (f32 or f64)", fn, tb__st(shape, &b));
        return NULL;
    }
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    for (i = 0; i < shape->rank; i++)
        numel *= (uint64_t)shape->dims[i]; /* fits: checked */
    tb__rng_reserve(numel, &seed, &offset);
    operands[0] = tb__i64_scalar_node(fn, seed, &dev);
    operands[1] = operands[0] != NULL ? tb__i64_scalar_node(fn, offset, &dev) : NULL;
    if (operands[1] != NULL) node = tb__emit(fn, op, shape, &dev, operands, 2, NULL, 0, NULL);
    tb__node_release(operands[0]);
    tb__node_release(operands[1]);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_rand(const tb_shape *shape, const tb_device *device) {
    return tb__random("tb_rand", TB_OP_RAND, shape, device);
}
TBDEF tb_tensor *tb_randn(const tb_shape *shape, const tb_device *device) {
    return tb__random("tb_randn", TB_OP_RANDN, shape, device);
}
