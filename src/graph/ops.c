/* ===========================================================================================
   Ops: the tensor functions that record IR nodes with PyTorch's semantics (type promotion,
   broadcasting, negative axes), and the creation functions. The nodes follow the normal form
   documented above TB_OP_LIST in ir.h.
   =========================================================================================== */
#include "../impl_begin.h"

/* ---- plumbing ---- */

/* An op given a NULL tensor keeps the first error of the chain. */
static tb_tensor *tb__null_input(const char *fn, const char *what) {
    if (tb_last_status() == TB_OK) tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
    return NULL;
}

/* A user or backend callback failed with `st`: its own message, if it set one, is kept after
   ours. */
static tb_status tb__callback_failed(tb_status st, const tb__saved_error *before, const char *fn,
                                     const char *what) {
    bool changed = tb_last_status() != TB_OK && (tb_last_status() != before->status ||
                                                 strcmp(tb_last_error(), before->message) != 0);
    if (st <= TB_OK || st >= TB_STATUS_COUNT) st = TB_ERR_UNSUPPORTED;
    if (changed) return tb__error(st, "%s: %s: %s", fn, what, tb_last_error());
    return tb__error(st, "%s: %s (%s)", fn, what, tb_status_string(st));
}

/* Tells the device's backend about a new node (LTC's IR builder hook); it may refuse it. */
static tb_status tb__announce(const char *fn, const tb_node *node) {
    const tb_backend *backend = tb__backend_for_device(&node->device);
    const tb_backend_impl *impl;
    tb__saved_error before;
    tb_status st;
    char what[128];
    if (backend == NULL) {
        if (tb_last_status() != TB_OK) return tb_last_status();
        return tb__error(TB_ERR_NOT_FOUND, "%s: no backend for the device '%s'", fn,
                         node->device.backend);
    }
    impl = tb__backend_vtable(backend);
    if (impl == NULL || impl->on_node_created == NULL) return TB_OK;
    tb__error_save(&before);
    st = impl->on_node_created(impl->user_data, node);
    if (st == TB_OK) {
        tb__error_restore(&before);
        return TB_OK;
    }
    snprintf(what, sizeof what, "backend '%s' rejected the %s node", tb_backend_name(backend),
             tb_op_name(node->op) != NULL ? tb_op_name(node->op) : "custom");
    return tb__callback_failed(st, &before, fn, what);
}

/* Creates and announces a node of a known shape; an owned reference or NULL. */
static tb_node *tb__emit(const char *fn, tb_op op, const tb_shape *shape, const tb_device *device,
                         tb_node *const *operands, size_t num_operands, const int64_t *attrs,
                         size_t num_attrs, const double *fattrs) {
    tb_node *node =
        tb__node_new(op, shape, device, operands, num_operands, attrs, num_attrs, fattrs);
    if (node == NULL) return NULL;
    tb__node_flush_bound(node);
    if (tb__announce(fn, node) != TB_OK) {
        tb__node_release(node);
        return NULL;
    }
    return node;
}

/* Infers the shape, then creates and announces the node. */
static tb_node *tb__record(const char *fn, tb_op op, const tb_device *device,
                           tb_node *const *operands, size_t num_operands, const int64_t *attrs,
                           size_t num_attrs, const double *fattrs) {
    tb_shape local[4];
    tb_shape *shapes = local;
    tb_shape out;
    tb_status st;
    size_t i;
    memset(local, 0, sizeof local);
    if (num_operands > 4) {
        shapes = (tb_shape *)tb__calloc(num_operands, sizeof *shapes);
        if (shapes == NULL) return NULL;
    }
    for (i = 0; i < num_operands; i++)
        shapes[i] = operands[i]->shape;
    memset(&out, 0, sizeof out);
    st = tb__infer_shape_as(fn, op, shapes, num_operands, attrs, num_attrs, &out);
    if (shapes != local) tb__free(shapes);
    if (st != TB_OK) return NULL;
    return tb__emit(fn, op, &out, device, operands, num_operands, attrs, num_attrs, fattrs);
}

static tb_tensor *tb__finish(tb_node *node) {
    return node != NULL ? tb__tensor_from_node(node) : NULL;
}

/* x converted to `dtype` (x itself, retained, when it already has it). */
static tb_node *tb__cast_node(const char *fn, tb_node *x, tb_dtype dtype) {
    int64_t attr = (int64_t)dtype;
    if (x->shape.dtype == dtype) {
        tb__node_retain(x);
        return x;
    }
    return tb__record(fn, TB_OP_CAST, &x->device, &x, 1, &attr, 1, NULL);
}

static bool tb__dims_equal(const tb_shape *shape, int32_t rank, const int64_t *dims) {
    int32_t i;
    if (shape->rank != rank) return false;
    for (i = 0; i < rank; i++) {
        if (shape->dims[i] != dims[i]) return false;
    }
    return true;
}

/* x reshaped (RESHAPE) or expanded (EXPAND) to `dims`; x itself, retained, when it has them. */
static tb_node *tb__view_node(const char *fn, tb_op op, tb_node *x, int32_t rank,
                              const int64_t *dims) {
    if (tb__dims_equal(&x->shape, rank, dims)) {
        tb__node_retain(x);
        return x;
    }
    return tb__record(fn, op, &x->device, &x, 1, dims, (size_t)rank, NULL);
}

/* Like tb__view_node but consumes the caller's reference to x. */
static tb_node *tb__view_take(const char *fn, tb_op op, tb_node *x, int32_t rank,
                              const int64_t *dims) {
    tb_node *r;
    if (x == NULL) return NULL;
    r = tb__view_node(fn, op, x, rank, dims);
    tb__node_release(x);
    return r;
}

/* "[2,-1,3]" */
static void tb__dims_text(const int64_t *dims, int32_t rank, char *buf, size_t cap) {
    size_t len = 0;
    int32_t i;
    int w = snprintf(buf, cap, "[");
    if (w > 0) len = (size_t)w;
    for (i = 0; i < rank && len < cap; i++) {
        w = snprintf(buf + len, cap - len, "%s%lld", i == 0 ? "" : ",", (long long)dims[i]);
        if (w < 0) return;
        len += (size_t)w;
    }
    if (len < cap) snprintf(buf + len, cap - len, "]");
}

static size_t tb__device_text(const tb_device *device, char *buf, size_t cap) {
    return tb_device_format(device, buf, cap);
}

/* ---- operands ---- */

static void tb__args_release(tb__arg *args, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        tb__node_release(args[i].node);
        args[i].node = NULL;
    }
}

static void tb__arg_set(tb__arg *arg, tb_node *node) {
    arg->node = node;
    arg->shape = node->shape;
    arg->wrapped = node->op == TB_OP_SCALAR && node->wrapped_number;
}

/* Reads the operand nodes of `n` non-NULL tensors and picks the device the op runs on: that of
   the first operand that is not a scalar. Scalars (tb_scalar) on another device are made again
   on that one; any other device mismatch is an error. */
static tb_status tb__args_get(const char *fn, tb_tensor *const *tensors, size_t n, tb__arg *args,
                              tb_device *device) {
    size_t i, lead = 0;
    for (i = 0; i < n; i++)
        args[i].node = NULL;
    for (i = 0; i < n; i++) {
        tb_node *node = tb__tensor_ir(tensors[i]);
        if (node == NULL) {
            tb__args_release(args, i);
            if (tb_last_status() != TB_OK) return tb_last_status();
            return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: operand %zu has no value", fn, i);
        }
        tb__node_retain(node);
        tb__arg_set(&args[i], node);
    }
    for (i = 0; i < n; i++) {
        if (args[i].node->op != TB_OP_SCALAR) {
            lead = i;
            break;
        }
    }
    *device = args[lead].node->device;
    for (i = 0; i < n; i++) {
        tb_node *node = args[i].node, *moved;
        if (tb_device_equal(&node->device, device)) continue;
        if (node->op != TB_OP_SCALAR) {
            char da[64], db[64];
            tb__device_text(device, da, sizeof da);
            tb__device_text(&node->device, db, sizeof db);
            tb__args_release(args, n);
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: operands on different devices: %s (operand %zu) and %s "
                             "(operand %zu)",
                             fn, da, lead, db, i);
        }
        moved = tb__node_scalar(node->scalar, device, node->wrapped_number);
        if (moved != NULL && tb__announce(fn, moved) != TB_OK) {
            tb__node_release(moved);
            moved = NULL;
        }
        if (moved == NULL) {
            tb__args_release(args, n);
            return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
        }
        tb__node_release(node);
        tb__arg_set(&args[i], moved);
    }
    return TB_OK;
}

/* ---- type promotion (PyTorch's result_type) ----
   Operands fall in three categories: tensors with dims, rank-0 tensors, and wrapped host
   numbers (whose float values count as the default dtype f32). A lower category only raises the
   result when it is of a higher kind (bool < integer < float) than the categories above. */

static void tb__promote_into(bool *has, tb_dtype *acc, tb_dtype d) {
    *acc = *has ? tb_dtype_promote(*acc, d) : d;
    *has = true;
}

static int tb__dtype_kind(tb_dtype d) {
    if (d == TB_BOOL) return 0;
    return tb_dtype_is_float(d) ? 2 : 1;
}

static void tb__combine_categories(bool has_hi, tb_dtype hi, bool has_lo, tb_dtype lo,
                                   bool *has_out, tb_dtype *out) {
    if (!has_hi) {
        *has_out = has_lo;
        *out = lo;
    } else if (has_lo && tb__dtype_kind(lo) > tb__dtype_kind(hi)) {
        *has_out = true;
        *out = tb_dtype_promote(hi, lo);
    } else {
        *has_out = true;
        *out = hi;
    }
}

static tb_dtype tb__result_type(const tb__arg *args, size_t n) {
    bool has[3] = {false, false, false};
    tb_dtype res[3] = {TB_BOOL, TB_BOOL, TB_BOOL};
    bool has_low;
    tb_dtype low, out;
    size_t i;
    for (i = 0; i < n; i++) {
        tb_dtype d = args[i].shape.dtype;
        int cat = args[i].shape.rank > 0 ? 0 : (args[i].wrapped ? 2 : 1);
        if (cat == 2 && tb_dtype_is_float(d)) d = TB_F32;
        tb__promote_into(&has[cat], &res[cat], d);
    }
    tb__combine_categories(has[1], res[1], has[2], res[2], &has_low, &low);
    tb__combine_categories(has[0], res[0], has_low, low, &has_low, &out);
    return out;
}

/* What a wrapped host double looks like to type promotion. */
static tb__arg tb__wrapped_probe(void) {
    tb__arg probe;
    memset(&probe, 0, sizeof probe);
    probe.shape.dtype = TB_F64;
    probe.shape.rank = 0;
    probe.wrapped = true;
    return probe;
}

/* ---- host values ---- */

static bool tb__is_finite(double v) {
    return fabs(v) <= DBL_MAX;
}

/* A scalar of a float dtype (the integer field set only where it is representable). */
static tb_scalar tb__float_scalar(tb_dtype dtype, double v) {
    tb_scalar s;
    memset(&s, 0, sizeof s);
    s.dtype = dtype;
    s.f = v;
    if (v > -9223372036854775808.0 && v < 9223372036854775808.0) s.i = (int64_t)v;
    return s;
}

/* A host double as a value of `dtype`, as PyTorch's fill: integers truncate toward zero, values
   that do not fit are an error, bool is v != 0. */
static tb_status tb__scalar_from_double(const char *fn, double v, tb_dtype dtype, tb_scalar *out) {
    tb_scalar s;
    double t, lo, hi;
    if (tb_dtype_is_float(dtype)) {
        *out = tb__float_scalar(dtype, v);
        return TB_OK;
    }
    memset(&s, 0, sizeof s);
    s.dtype = dtype;
    if (dtype == TB_BOOL) {
        s.i = v != 0.0 ? 1 : 0; /* NaN is true, as in PyTorch */
        s.f = (double)s.i;
        *out = s;
        return TB_OK;
    }
    switch (dtype) {
    case TB_I32:
        lo = -2147483648.0;
        hi = 2147483647.0;
        break;
    case TB_U8:
        lo = 0.0;
        hi = 255.0;
        break;
    default:
        lo = -9223372036854775808.0;
        hi = 9223372036854775807.0;
        break;
    }
    t = v != v ? v : (v < 0 ? ceil(v) : floor(v));
    if (!(t >= lo && t <= hi) || (dtype == TB_I64 && t >= 9223372036854775808.0)) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: value %g does not fit in %s", fn, v,
                         tb_dtype_name(dtype));
    }
    s.i = (int64_t)t;
    s.f = (double)s.i;
    *out = s;
    return TB_OK;
}

/* Checks a shape given by the user (tb_full, tb_rand, ...). */
static tb_status tb__check_user_shape(const char *fn, const tb_shape *shape) {
    int32_t i;
    if (shape == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: shape is NULL", fn);
    if (!tb_dtype_is_valid(shape->dtype)) {
        return tb__error(TB_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)shape->dtype);
    }
    if (shape->rank < 0 || shape->rank > TB_MAX_RANK) {
        return tb__error(TB_ERR_SHAPE, "%s: rank %d is out of range (0..%d)", fn, (int)shape->rank,
                         TB_MAX_RANK);
    }
    for (i = 0; i < shape->rank; i++) {
        if (shape->dims[i] < 0) {
            return tb__error(TB_ERR_SHAPE, "%s: dim %d is negative (%lld)", fn, (int)i,
                             (long long)shape->dims[i]);
        }
    }
    return tb__check_fits(fn, shape);
}

/* An axis in [-rank, rank) made non-negative; a rank-0 tensor takes 0 and -1, as PyTorch. */
static tb_status tb__norm_axis(const char *fn, const char *what, int64_t axis, int32_t rank,
                               const tb_shape *shape, int32_t *out) {
    int32_t r = rank > 0 ? rank : 1;
    *out = 0; /* defined on every path, so optimisers see no uninitialised use */
    if (axis < -(int64_t)r || axis >= (int64_t)r) {
        tb__shape_buf b;
        return tb__error(TB_ERR_SHAPE, "%s: %s %lld is out of range for %s (expected %d..%d)", fn,
                         what, (long long)axis, tb__st(shape, &b), (int)-r, (int)(r - 1));
    }
    *out = (int32_t)(axis < 0 ? axis + r : axis);
    return TB_OK;
}

/* ---- unary ---- */

static tb_tensor *tb__unary(const char *fn, tb_op op, tb_tensor *x) {
    const tb__math_code *row = tb__math_code_of(op); /* NULL: not a float-only math op */
    tb__arg arg;
    tb_device device;
    tb_node *in, *node;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (row != NULL && !tb_dtype_is_float(arg.shape.dtype)) {
        if (row->ints == TB__INT_REFUSE) {
            tb__need_float(fn, &arg.shape);
            tb__args_release(&arg, 1);
            return NULL;
        }
        in = tb__cast_node(fn, arg.node, TB_F32);
    } else if (op == TB_OP_LOGICAL_NOT) {
        in = tb__cast_node(fn, arg.node, TB_BOOL);
    } else {
        in = arg.node;
        tb__node_retain(in);
    }
    tb__args_release(&arg, 1);
    if (in == NULL) return NULL;
    node = tb__record(fn, op, &device, &in, 1, NULL, 0, NULL);
    tb__node_release(in);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_neg(tb_tensor *x) {
    return tb__unary("tb_neg", TB_OP_NEG, x);
}
TBDEF tb_tensor *tb_abs(tb_tensor *x) {
    return tb__unary("tb_abs", TB_OP_ABS, x);
}
/* tb_exp, tb_log, ..., one for each row of ops_table.h */
#define TB__MATH_FN(ID, name, ints, REF, CODE, CODE_F32, VEC, GRAD)                                \
    TBDEF tb_tensor *tb_##name(tb_tensor *x) {                                                     \
        return tb__unary("tb_" #name, TB_OP_##ID, x);                                              \
    }
TB__MATH_OPS(TB__MATH_FN)
#undef TB__MATH_FN

TBDEF tb_tensor *tb_relu(tb_tensor *x) {
    return tb__unary("tb_relu", TB_OP_RELU, x);
}

TBDEF tb_tensor *tb_floor(tb_tensor *x) {
    return tb__unary("tb_floor", TB_OP_FLOOR, x);
}
TBDEF tb_tensor *tb_ceil(tb_tensor *x) {
    return tb__unary("tb_ceil", TB_OP_CEIL, x);
}
TBDEF tb_tensor *tb_round(tb_tensor *x) {
    return tb__unary("tb_round", TB_OP_ROUND, x);
}
TBDEF tb_tensor *tb_sign(tb_tensor *x) {
    return tb__unary("tb_sign", TB_OP_SIGN, x);
}
TBDEF tb_tensor *tb_logical_not(tb_tensor *x) {
    return tb__unary("tb_logical_not", TB_OP_LOGICAL_NOT, x);
}

TBDEF tb_tensor *tb_cast(tb_tensor *x, tb_dtype dtype) {
    const char *fn = "tb_cast";
    tb__arg arg;
    tb_device device;
    tb_node *node;
    int64_t attr = (int64_t)dtype;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (!tb_dtype_is_valid(dtype)) {
        tb__error(TB_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)dtype);
        return NULL;
    }
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    node = tb__record(fn, TB_OP_CAST, &device, &arg.node, 1, &attr, 1, NULL);
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

/* ---- binary ---- */

/* The node of a binary op on two operands (promoted, cast, checked). */
static tb_node *tb__binary_node(const char *fn, tb_op op, tb__arg *args, const tb_device *device) {
    tb_dtype t = tb__result_type(args, 2);
    tb_shape shapes[2], out;
    tb_node *operands[2], *node;
    shapes[0] = args[0].shape;
    shapes[1] = args[1].shape;
    memset(&out, 0, sizeof out);
    /* the shapes as the caller gave them, before any cast, in the message */
    if (tb__broadcast_dims(fn, shapes, 2, &out) != TB_OK) return NULL;
    switch (op) {
    case TB_OP_SUB:
    case TB_OP_POW:
        if (t == TB_BOOL) {
            tb__shape_buf a, b;
            tb__error(TB_ERR_DTYPE, "%s: not supported on two bool operands (%s and %s)", fn,
                      tb__st(&shapes[0], &a), tb__st(&shapes[1], &b));
            return NULL;
        }
        break;
    case TB_OP_DIV:
        if (!tb_dtype_is_float(t)) t = TB_F32; /* true division */
        break;
    case TB_OP_LOGICAL_AND:
    case TB_OP_LOGICAL_OR:
        t = TB_BOOL;
        break;
    default:
        break;
    }
    operands[0] = tb__cast_node(fn, args[0].node, t);
    if (operands[0] == NULL) return NULL;
    operands[1] = tb__cast_node(fn, args[1].node, t);
    if (operands[1] == NULL) {
        tb__node_release(operands[0]);
        return NULL;
    }
    node = tb__record(fn, op, device, operands, 2, NULL, 0, NULL);
    tb__node_release(operands[0]);
    tb__node_release(operands[1]);
    return node;
}

static tb_tensor *tb__binary(const char *fn, tb_op op, tb_tensor *a, tb_tensor *b) {
    tb_tensor *tensors[2];
    tb__arg args[2];
    tb_device device;
    tb_node *node;
    tb__ensure_setup();
    if (a == NULL) return tb__null_input(fn, "a");
    if (b == NULL) return tb__null_input(fn, "b");
    tensors[0] = a;
    tensors[1] = b;
    if (tb__args_get(fn, tensors, 2, args, &device) != TB_OK) return NULL;
    node = tb__binary_node(fn, op, args, &device);
    tb__args_release(args, 2);
    return tb__finish(node);
}

/* A wrapped SCALAR node of `dtype` holding the host number v, announced. */
static tb_node *tb__wrapped_scalar(const char *fn, tb_scalar value, const tb_device *device) {
    tb_node *node = tb__node_scalar(value, device, true);
    if (node != NULL && tb__announce(fn, node) != TB_OK) {
        tb__node_release(node);
        node = NULL;
    }
    return node;
}

static tb_tensor *tb__binary_scalar(const char *fn, tb_op op, tb_tensor *a, double b) {
    tb__arg args[2];
    tb_device device;
    tb_node *node, *scalar;
    tb_dtype t;
    tb__ensure_setup();
    if (a == NULL) return tb__null_input(fn, "a");
    if (tb__args_get(fn, &a, 1, args, &device) != TB_OK) return NULL;
    args[1] = tb__wrapped_probe();
    t = tb__result_type(args, 2); /* always a float dtype: b is a Python float */
    scalar = tb__wrapped_scalar(fn, tb__float_scalar(t, b), &device);
    if (scalar == NULL) {
        tb__args_release(args, 1);
        return NULL;
    }
    tb__arg_set(&args[1], scalar);
    node = tb__binary_node(fn, op, args, &device);
    tb__args_release(args, 2);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_add(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_add", TB_OP_ADD, a, b);
}
TBDEF tb_tensor *tb_sub(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_sub", TB_OP_SUB, a, b);
}
TBDEF tb_tensor *tb_mul(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_mul", TB_OP_MUL, a, b);
}
TBDEF tb_tensor *tb_div(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_div", TB_OP_DIV, a, b);
}
TBDEF tb_tensor *tb_pow(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_pow", TB_OP_POW, a, b);
}
TBDEF tb_tensor *tb_maximum(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_maximum", TB_OP_MAXIMUM, a, b);
}
TBDEF tb_tensor *tb_minimum(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_minimum", TB_OP_MINIMUM, a, b);
}
TBDEF tb_tensor *tb_eq(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_eq", TB_OP_EQ, a, b);
}
TBDEF tb_tensor *tb_ne(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_ne", TB_OP_NE, a, b);
}
TBDEF tb_tensor *tb_lt(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_lt", TB_OP_LT, a, b);
}
TBDEF tb_tensor *tb_le(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_le", TB_OP_LE, a, b);
}
TBDEF tb_tensor *tb_gt(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_gt", TB_OP_GT, a, b);
}
TBDEF tb_tensor *tb_ge(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_ge", TB_OP_GE, a, b);
}
TBDEF tb_tensor *tb_logical_and(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_logical_and", TB_OP_LOGICAL_AND, a, b);
}
TBDEF tb_tensor *tb_logical_or(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_logical_or", TB_OP_LOGICAL_OR, a, b);
}

TBDEF tb_tensor *tb_add_scalar(tb_tensor *a, double b) {
    return tb__binary_scalar("tb_add_scalar", TB_OP_ADD, a, b);
}
TBDEF tb_tensor *tb_sub_scalar(tb_tensor *a, double b) {
    return tb__binary_scalar("tb_sub_scalar", TB_OP_SUB, a, b);
}
TBDEF tb_tensor *tb_mul_scalar(tb_tensor *a, double b) {
    return tb__binary_scalar("tb_mul_scalar", TB_OP_MUL, a, b);
}
TBDEF tb_tensor *tb_div_scalar(tb_tensor *a, double b) {
    return tb__binary_scalar("tb_div_scalar", TB_OP_DIV, a, b);
}
TBDEF tb_tensor *tb_pow_scalar(tb_tensor *a, double b) {
    return tb__binary_scalar("tb_pow_scalar", TB_OP_POW, a, b);
}

/* ---- ternary ---- */

TBDEF tb_tensor *tb_where(tb_tensor *cond, tb_tensor *a, tb_tensor *b) {
    const char *fn = "tb_where";
    tb_tensor *tensors[3];
    tb__arg args[3];
    tb_device device;
    tb_shape shapes[3], out;
    tb_node *operands[3], *node = NULL;
    tb_dtype t;
    int i;
    tb__ensure_setup();
    if (cond == NULL) return tb__null_input(fn, "cond");
    if (a == NULL) return tb__null_input(fn, "a");
    if (b == NULL) return tb__null_input(fn, "b");
    tensors[0] = cond;
    tensors[1] = a;
    tensors[2] = b;
    if (tb__args_get(fn, tensors, 3, args, &device) != TB_OK) return NULL;
    for (i = 0; i < 3; i++)
        shapes[i] = args[i].shape;
    memset(&out, 0, sizeof out);
    if (tb__need_bool(fn, "the condition", &shapes[0]) != TB_OK ||
        tb__broadcast_dims(fn, shapes, 3, &out) != TB_OK) {
        tb__args_release(args, 3);
        return NULL;
    }
    t = tb__result_type(args + 1, 2);
    operands[0] = args[0].node;
    operands[1] = tb__cast_node(fn, args[1].node, t);
    operands[2] = operands[1] != NULL ? tb__cast_node(fn, args[2].node, t) : NULL;
    if (operands[2] != NULL)
        node = tb__record(fn, TB_OP_WHERE, &device, operands, 3, NULL, 0, NULL);
    tb__node_release(operands[1]);
    tb__node_release(operands[2]);
    tb__args_release(args, 3);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_clamp(tb_tensor *x, double lo, double hi) {
    const char *fn = "tb_clamp";
    tb__arg args[3];
    tb_device device;
    tb_node *operands[3], *node = NULL;
    tb_dtype t;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, args, &device) != TB_OK) return NULL;
    args[1] = tb__wrapped_probe();
    args[2] = tb__wrapped_probe();
    t = tb__result_type(args, 3);
    operands[0] = tb__cast_node(fn, args[0].node, t);
    operands[1] =
        operands[0] != NULL ? tb__wrapped_scalar(fn, tb__float_scalar(t, lo), &device) : NULL;
    operands[2] =
        operands[1] != NULL ? tb__wrapped_scalar(fn, tb__float_scalar(t, hi), &device) : NULL;
    if (operands[2] != NULL)
        node = tb__record(fn, TB_OP_CLAMP, &device, operands, 3, NULL, 0, NULL);
    tb__node_release(operands[0]);
    tb__node_release(operands[1]);
    tb__node_release(operands[2]);
    tb__args_release(args, 1);
    return tb__finish(node);
}

/* ---- reductions ---- */

/* The bitmask of `axes` over x (all axes when num_axes is 0); repeated axes are an error. */
static tb_status tb__axes_mask(const char *fn, const tb_shape *x, const int32_t *axes,
                               size_t num_axes, int64_t *mask) {
    int64_t seen = 0;
    size_t i;
    tb_status st;
    if (num_axes == 0) {
        *mask = ((int64_t)1 << x->rank) - 1;
        return TB_OK;
    }
    if (axes == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: axes is NULL", fn);
    for (i = 0; i < num_axes; i++) {
        int32_t a;
        if ((st = tb__norm_axis(fn, "axis", axes[i], x->rank, x, &a)) != TB_OK) return st;
        if (((seen >> a) & 1) != 0) {
            tb__shape_buf b;
            return tb__error(TB_ERR_SHAPE, "%s: axis %d appears more than once in the axes of %s",
                             fn, (int)axes[i], tb__st(x, &b));
        }
        seen |= (int64_t)1 << a;
    }
    *mask = x->rank > 0 ? seen : 0;
    return TB_OK;
}

/* first: max/min whose gradient goes to the first extreme alone (a third attr) */
static tb_tensor *tb__reduce_as(const char *fn, tb_op op, tb_tensor *x, const int32_t *axes,
                                size_t num_axes, bool keepdim, bool first) {
    tb__arg arg;
    tb_device device;
    tb_node *in, *node;
    int64_t attrs[3];
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (tb__axes_mask(fn, &arg.shape, axes, num_axes, &attrs[0]) != TB_OK) {
        tb__args_release(&arg, 1);
        return NULL;
    }
    attrs[1] = keepdim ? 1 : 0;
    attrs[2] = 1;
    if ((op == TB_OP_SUM || op == TB_OP_PROD) && !tb_dtype_is_float(arg.shape.dtype)) {
        in = tb__cast_node(fn, arg.node, TB_I64); /* PyTorch accumulates integers in int64 */
    } else {
        in = arg.node;
        tb__node_retain(in);
    }
    tb__args_release(&arg, 1);
    if (in == NULL) return NULL;
    node = tb__record(fn, op, &device, &in, 1, attrs, first ? 3 : 2, NULL);
    tb__node_release(in);
    return tb__finish(node);
}

static tb_tensor *tb__reduce(const char *fn, tb_op op, tb_tensor *x, const int32_t *axes,
                             size_t num_axes, bool keepdim) {
    return tb__reduce_as(fn, op, x, axes, num_axes, keepdim, false);
}

TBDEF tb_tensor *tb_sum(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim) {
    return tb__reduce("tb_sum", TB_OP_SUM, x, axes, num_axes, keepdim);
}
TBDEF tb_tensor *tb_mean(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim) {
    return tb__reduce("tb_mean", TB_OP_MEAN, x, axes, num_axes, keepdim);
}
TBDEF tb_tensor *tb_max(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim) {
    return tb__reduce("tb_max", TB_OP_MAX, x, axes, num_axes, keepdim);
}
static tb_tensor *tb__max_first(tb_tensor *x, int32_t axis, bool keepdim) {
    return tb__reduce_as("tb_max", TB_OP_MAX, x, &axis, 1, keepdim, true);
}

TBDEF tb_tensor *tb_min(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim) {
    return tb__reduce("tb_min", TB_OP_MIN, x, axes, num_axes, keepdim);
}
TBDEF tb_tensor *tb_prod(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim) {
    return tb__reduce("tb_prod", TB_OP_PROD, x, axes, num_axes, keepdim);
}

static const int64_t tb__one_dim[1] = {1};

static tb_tensor *tb__arg_reduce(const char *fn, tb_op op, tb_tensor *x, int32_t axis,
                                 bool keepdim) {
    tb__arg arg;
    tb_device device;
    tb_node *in, *node;
    int64_t attrs[2];
    int32_t a;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (tb__need_not_bool(fn, &arg.shape) != TB_OK ||
        tb__norm_axis(fn, "axis", axis, arg.shape.rank, &arg.shape, &a) != TB_OK) {
        tb__args_release(&arg, 1);
        return NULL;
    }
    attrs[0] = a;
    attrs[1] = keepdim ? 1 : 0;
    if (arg.shape.rank == 0) {
        /* the node form has rank >= 1; the result of a rank-0 input is rank 0 either way */
        in = tb__view_node(fn, TB_OP_RESHAPE, arg.node, 1, tb__one_dim);
        attrs[1] = 0;
    } else {
        in = arg.node;
        tb__node_retain(in);
    }
    tb__args_release(&arg, 1);
    if (in == NULL) return NULL;
    node = tb__record(fn, op, &device, &in, 1, attrs, 2, NULL);
    tb__node_release(in);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_argmax(tb_tensor *x, int32_t axis, bool keepdim) {
    return tb__arg_reduce("tb_argmax", TB_OP_ARGMAX, x, axis, keepdim);
}
TBDEF tb_tensor *tb_argmin(tb_tensor *x, int32_t axis, bool keepdim) {
    return tb__arg_reduce("tb_argmin", TB_OP_ARGMIN, x, axis, keepdim);
}

/* ---- matmul, softmax, layer_norm ---- */

TBDEF tb_tensor *tb_matmul(tb_tensor *a, tb_tensor *b) {
    const char *fn = "tb_matmul";
    tb_tensor *tensors[2];
    tb__arg args[2];
    tb_device device;
    tb_shape sa, sb, ba, bb, batch;
    tb__shape_buf ta, tb;
    int64_t adims[TB_MAX_RANK], bdims[TB_MAX_RANK], full[TB_MAX_RANK], outdims[TB_MAX_RANK];
    int32_t ra, rb, r, nb, i, out_rank;
    int64_t n, k, k2, m;
    tb_node *operands[2] = {NULL, NULL}, *node = NULL;
    tb__ensure_setup();
    if (a == NULL) return tb__null_input(fn, "a");
    if (b == NULL) return tb__null_input(fn, "b");
    tensors[0] = a;
    tensors[1] = b;
    if (tb__args_get(fn, tensors, 2, args, &device) != TB_OK) return NULL;
    sa = args[0].shape;
    sb = args[1].shape;
    ra = sa.rank;
    rb = sb.rank;
    if (ra == 0 || rb == 0) {
        tb__error(TB_ERR_SHAPE, "%s: both operands need at least 1 dim, got %s and %s", fn,
                  tb__st(&sa, &ta), tb__st(&sb, &tb));
        goto done;
    }
    if (sa.dtype != sb.dtype) {
        tb__error(TB_ERR_DTYPE, "%s: operands %s and %s have different dtypes", fn,
                  tb__st(&sa, &ta), tb__st(&sb, &tb));
        goto done;
    }
    if (tb__need_not_bool(fn, &sa) != TB_OK) goto done;
    /* a 1-D a is a row [1, k]; a 1-D b is a column [k, 1] */
    k = sa.dims[ra - 1];
    n = ra >= 2 ? sa.dims[ra - 2] : 1;
    k2 = rb >= 2 ? sb.dims[rb - 2] : sb.dims[0];
    m = rb >= 2 ? sb.dims[rb - 1] : 1;
    if (k != k2) {
        tb__error(TB_ERR_SHAPE, "%s: shapes %s and %s do not match (%lld != %lld)", fn,
                  tb__st(&sa, &ta), tb__st(&sb, &tb), (long long)k, (long long)k2);
        goto done;
    }
    memset(&ba, 0, sizeof ba);
    memset(&bb, 0, sizeof bb);
    memset(&batch, 0, sizeof batch);
    ba.rank = ra > 2 ? ra - 2 : 0;
    bb.rank = rb > 2 ? rb - 2 : 0;
    for (i = 0; i < ba.rank; i++)
        ba.dims[i] = sa.dims[i];
    for (i = 0; i < bb.rank; i++)
        bb.dims[i] = sb.dims[i];
    {
        tb_shape pair[2];
        pair[0] = ba;
        pair[1] = bb;
        if (tb__broadcast_dims(fn, pair, 2, &batch) != TB_OK) {
            tb__error(TB_ERR_SHAPE, "%s: the batch dims of %s and %s do not broadcast", fn,
                      tb__st(&sa, &ta), tb__st(&sb, &tb));
            goto done;
        }
    }
    if (ra >= 3 && rb == 2) {
        /* b has no batch: a's batch dims join its rows, one matmul of [batch.. * n, k] by
           [k, m] (b read once, not once per batch), then [batch.., n, m] */
        ba.rank = 0;
        batch.rank = 0;
        for (i = 0, n = 1; i < ra - 1; i++)
            n *= sa.dims[i];
    }
    nb = batch.rank;
    r = nb + 2;
    /* a: [1.., n, k] then expanded to [batch.., n, k]; b likewise with [k, m] */
    for (i = 0; i < r; i++)
        adims[i] = 1;
    for (i = 0; i < ba.rank; i++)
        adims[nb - ba.rank + i] = ba.dims[i];
    adims[r - 2] = n;
    adims[r - 1] = k;
    for (i = 0; i < r; i++)
        bdims[i] = 1;
    for (i = 0; i < bb.rank; i++)
        bdims[nb - bb.rank + i] = bb.dims[i];
    bdims[r - 2] = k;
    bdims[r - 1] = m;
    for (i = 0; i < nb; i++)
        full[i] = batch.dims[i];
    full[r - 2] = n;
    full[r - 1] = k;
    operands[0] = tb__view_node(fn, TB_OP_RESHAPE, args[0].node, r, adims);
    operands[0] = tb__view_take(fn, TB_OP_EXPAND, operands[0], r, full);
    if (operands[0] == NULL) goto done;
    full[r - 2] = k;
    full[r - 1] = m;
    operands[1] = tb__view_node(fn, TB_OP_RESHAPE, args[1].node, r, bdims);
    operands[1] = tb__view_take(fn, TB_OP_EXPAND, operands[1], r, full);
    if (operands[1] == NULL) goto done;
    node = tb__record(fn, TB_OP_MATMUL, &device, operands, 2, NULL, 0, NULL);
    /* drop the axes that 1-D operands added; give a's batch dims back when they joined its
       rows */
    out_rank = 0;
    for (i = 0; i < nb; i++)
        outdims[out_rank++] = batch.dims[i];
    if (ra >= 3 && rb == 2) {
        for (i = 0; i < ra - 1; i++)
            outdims[out_rank++] = sa.dims[i];
    } else if (ra >= 2) {
        outdims[out_rank++] = n;
    }
    if (rb >= 2) outdims[out_rank++] = m;
    if (node != NULL) node = tb__view_take(fn, TB_OP_RESHAPE, node, out_rank, outdims);
done:
    tb__node_release(operands[0]);
    tb__node_release(operands[1]);
    tb__args_release(args, 2);
    return tb__finish(node);
}

static tb_tensor *tb__softmax(const char *fn, tb_op op, tb_tensor *x, int32_t axis) {
    tb__arg arg;
    tb_device device;
    tb_node *in, *node;
    int64_t attr;
    int32_t a;
    bool scalar;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (tb__need_float(fn, &arg.shape) != TB_OK ||
        tb__norm_axis(fn, "axis", axis, arg.shape.rank, &arg.shape, &a) != TB_OK) {
        tb__args_release(&arg, 1);
        return NULL;
    }
    attr = a;
    scalar = arg.shape.rank == 0;
    in = tb__view_node(fn, TB_OP_RESHAPE, arg.node, scalar ? 1 : arg.shape.rank,
                       scalar ? tb__one_dim : arg.shape.dims);
    tb__args_release(&arg, 1);
    if (in == NULL) return NULL;
    node = tb__record(fn, op, &device, &in, 1, &attr, 1, NULL);
    tb__node_release(in);
    if (scalar) node = tb__view_take(fn, TB_OP_RESHAPE, node, 0, NULL);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_softmax(tb_tensor *x, int32_t axis) {
    return tb__softmax("tb_softmax", TB_OP_SOFTMAX, x, axis);
}
TBDEF tb_tensor *tb_log_softmax(tb_tensor *x, int32_t axis) {
    return tb__softmax("tb_log_softmax", TB_OP_LOG_SOFTMAX, x, axis);
}

TBDEF tb_tensor *tb_layer_norm(tb_tensor *x, int32_t normalized_ndim, tb_tensor *weight,
                               tb_tensor *bias, double eps) {
    const char *fn = "tb_layer_norm";
    tb_tensor *tensors[3];
    tb__arg args[3];
    tb_node *operands[3];
    tb_device device;
    int64_t attrs[3];
    double fattrs[2];
    size_t n = 0, i;
    tb_node *node = NULL;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    tensors[n++] = x;
    if (weight != NULL) tensors[n++] = weight;
    if (bias != NULL) tensors[n++] = bias;
    if (tb__args_get(fn, tensors, n, args, &device) != TB_OK) return NULL;
    if (tb__need_float(fn, &args[0].shape) != TB_OK) goto done;
    if (normalized_ndim < 1 || normalized_ndim > args[0].shape.rank) {
        tb__shape_buf b;
        tb__error(TB_ERR_SHAPE, "%s: normalized_ndim %d is out of range for %s (1..%d)", fn,
                  (int)normalized_ndim, tb__st(&args[0].shape, &b), (int)args[0].shape.rank);
        goto done;
    }
    attrs[0] = normalized_ndim;
    attrs[1] = weight != NULL ? 1 : 0;
    attrs[2] = bias != NULL ? 1 : 0;
    fattrs[0] = eps;
    fattrs[1] = 0.0;
    for (i = 0; i < n; i++)
        operands[i] = args[i].node;
    node = tb__record(fn, TB_OP_LAYER_NORM, &device, operands, n, attrs, 3, fattrs);
done:
    tb__args_release(args, n);
    return tb__finish(node);
}
