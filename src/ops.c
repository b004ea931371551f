/* ===========================================================================================
   Ops: the tensor functions that record IR nodes with PyTorch's semantics (type promotion,
   broadcasting, negative axes), and the creation functions. The nodes follow the normal form
   documented above TB_OP_LIST in ir.h.
   =========================================================================================== */
#include "impl_begin.h"

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

/* An operand of an op: an owned reference to its node, with what type promotion needs. */
typedef struct tb__arg {
    tb_node *node;
    tb_shape shape;
    bool wrapped; /* a SCALAR made from a host number: weakest in promotion */
} tb__arg;

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
    tb__arg arg;
    tb_device device;
    tb_node *in, *node;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (tb__op_float_only(op) && !tb_dtype_is_float(arg.shape.dtype)) {
        if (op == TB_OP_GELU || op == TB_OP_SILU) {
            /* PyTorch has no integer kernels for these (and does not promote) */
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
TBDEF tb_tensor *tb_exp(tb_tensor *x) {
    return tb__unary("tb_exp", TB_OP_EXP, x);
}
TBDEF tb_tensor *tb_log(tb_tensor *x) {
    return tb__unary("tb_log", TB_OP_LOG, x);
}
TBDEF tb_tensor *tb_sqrt(tb_tensor *x) {
    return tb__unary("tb_sqrt", TB_OP_SQRT, x);
}
TBDEF tb_tensor *tb_rsqrt(tb_tensor *x) {
    return tb__unary("tb_rsqrt", TB_OP_RSQRT, x);
}
TBDEF tb_tensor *tb_sin(tb_tensor *x) {
    return tb__unary("tb_sin", TB_OP_SIN, x);
}
TBDEF tb_tensor *tb_cos(tb_tensor *x) {
    return tb__unary("tb_cos", TB_OP_COS, x);
}
TBDEF tb_tensor *tb_tanh(tb_tensor *x) {
    return tb__unary("tb_tanh", TB_OP_TANH, x);
}
TBDEF tb_tensor *tb_sigmoid(tb_tensor *x) {
    return tb__unary("tb_sigmoid", TB_OP_SIGMOID, x);
}
TBDEF tb_tensor *tb_relu(tb_tensor *x) {
    return tb__unary("tb_relu", TB_OP_RELU, x);
}
TBDEF tb_tensor *tb_gelu(tb_tensor *x) {
    return tb__unary("tb_gelu", TB_OP_GELU, x);
}

TBDEF tb_tensor *tb_erf(tb_tensor *x) {
    return tb__unary("tb_erf", TB_OP_ERF, x);
}
TBDEF tb_tensor *tb_silu(tb_tensor *x) {
    return tb__unary("tb_silu", TB_OP_SILU, x);
}
TBDEF tb_tensor *tb_reciprocal(tb_tensor *x) {
    return tb__unary("tb_reciprocal", TB_OP_RECIPROCAL, x);
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
