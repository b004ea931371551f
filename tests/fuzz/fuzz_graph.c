/* libFuzzer harness: the input decodes into a program of ops on the cpu backend. A few leaves
   (host arrays, full, arange, eye, rand, scalars) start a pool of tensors; each step applies an
   op to tensors of the pool, either a public op function (tb_add, tb_slice, tb_expand, ...)
   with decoded arguments, or any built-in op of the op table through tb_call_op with decoded
   attributes (the node form, where shape inference is the only guard). Every op must either
   fail with an error or give a valid shape; results of more than 4096 elements are dropped so
   that no input asks for huge work. Then the pool is synced and read back.
   Cross-checks: the program runs twice, once as one graph synced at the end and once synced
   after every step (each op then reads materialised operands); both runs must agree bit for
   bit where both succeed, which also checks that the computation cache never hands a graph
   another graph's computation. Bool results hold only 0 and 1. */
#include "fuzz_common.h"

#define GRAPH_POOL      12
#define GRAPH_STEPS     24
#define GRAPH_MAX_NUMEL 4096

typedef struct graph_run {
    tb_tensor *pool[GRAPH_POOL];
    int n;
    bool stepwise;
} graph_run;

static int64_t graph_numel(tb_tensor *t) {
    tb_shape s = tb_tensor_shape(t);
    int64_t n = 0;
    if (tb_shape_numel(&s, &n) != TB_OK) fuzz_fail("a tensor with an invalid shape");
    return n;
}

/* Takes an op's result: checks it, and keeps it in the pool when it is small enough. */
static void graph_keep(graph_run *r, tb_tensor *t, const char *what) {
    tb_shape s;
    if (t == NULL) {
        if (tb_last_status() == TB_OK || tb_last_error()[0] == '\0')
            fuzz_fail("%s returned NULL without an error", what);
        tb_clear_error();
        return;
    }
    s = tb_tensor_shape(t);
    if (tb_shape_validate(&s) != TB_OK) fuzz_fail("%s gave an invalid shape", what);
    if (graph_numel(t) > GRAPH_MAX_NUMEL) {
        tb_tensor_release(t);
        tb_clear_error();
        return;
    }
    if (r->stepwise && tb_sync(&t, 1) != TB_OK) tb_clear_error();
    if (r->n < GRAPH_POOL) {
        r->pool[r->n++] = t;
    } else {
        tb_tensor_release(r->pool[GRAPH_POOL - 1]);
        r->pool[GRAPH_POOL - 1] = t;
    }
    tb_clear_error();
}

static tb_tensor *graph_pick(graph_run *r, fuzz_bytes *b) {
    return r->pool[fuzz_u8(b) % r->n];
}

static tb_dtype graph_dtype(fuzz_bytes *b) {
    return (tb_dtype)(fuzz_u8(b) % TB_DTYPE_COUNT);
}

static int32_t graph_axis(fuzz_bytes *b) {
    uint8_t v = fuzz_u8(b);
    return v < 250 ? (int32_t)(v % 11) - 5 : (v == 250 ? INT32_MAX : INT32_MIN);
}

/* A shape of rank 0..4 with small dims, or (rarely) edge dims. */
static tb_shape graph_shape(fuzz_bytes *b) {
    tb_shape s;
    int32_t i;
    memset(&s, 0, sizeof s);
    s.dtype = graph_dtype(b);
    s.rank = fuzz_u8(b) % 5;
    for (i = 0; i < s.rank; i++)
        s.dims[i] = fuzz_dim(b) % 5;
    if (fuzz_u8(b) == 0xff && s.rank > 0) {
        int32_t k = fuzz_u8(b) % s.rank; /* every read in its own statement: a fixed order */
        s.dims[k] = fuzz_i64(b);
    }
    return s;
}

static tb_tensor *graph_leaf(fuzz_bytes *b) {
    uint8_t kind = fuzz_u8(b) % 7;
    tb_shape s = graph_shape(b);
    switch (kind) {
    case 0:
    case 1: {
        size_t nbytes = 0, i;
        unsigned char *data;
        tb_tensor *t;
        if (tb_shape_nbytes(&s, &nbytes) != TB_OK || nbytes > GRAPH_MAX_NUMEL * 8)
            return tb_zeros(&s, NULL); /* the error of a bad shape, or a view of one zero */
        data = (unsigned char *)malloc(nbytes ? nbytes : 1);
        if (data == NULL) fuzz_fail("malloc");
        for (i = 0; i < nbytes; i++)
            data[i] = fuzz_u8(b);
        if (s.dtype == TB_BOOL) {
            for (i = 0; i < nbytes; i++)
                data[i] &= 1;
        } else if (s.dtype == TB_F32 || s.dtype == TB_F64) {
            /* mostly ordinary numbers; the raw bytes give NaN, inf and subnormals too */
            size_t w = tb_dtype_size(s.dtype);
            for (i = 0; i + w <= nbytes; i += w) {
                if (data[i] & 1) {
                    double v = (double)((int)data[i + 1] - 128) / 8.0;
                    if (w == 4) {
                        float f = (float)v;
                        memcpy(data + i, &f, 4);
                    } else {
                        memcpy(data + i, &v, 8);
                    }
                }
            }
        }
        t = tb_tensor_from_host(data, &s, NULL);
        free(data);
        return t;
    }
    case 2:
        return tb_full(&s, fuzz_double(b), NULL);
    case 3: {
        double start = fuzz_double(b), end = fuzz_double(b), step = fuzz_double(b);
        return tb_arange(start, end, step, s.dtype, NULL);
    }
    case 4: {
        int64_t n = fuzz_dim(b), m = fuzz_dim(b);
        return tb_eye(n, m, s.dtype, NULL);
    }
    case 5:
        return (fuzz_u8(b) & 1) ? tb_rand(&s, NULL) : tb_randn(&s, NULL);
    default: {
        tb_scalar v;
        memset(&v, 0, sizeof v);
        v.dtype = s.dtype;
        v.f = fuzz_double(b);
        v.i = fuzz_i64(b);
        return tb_scalar_tensor(v, NULL);
    }
    }
}

typedef tb_tensor *(*graph_unary_fn)(tb_tensor *);
typedef tb_tensor *(*graph_binary_fn)(tb_tensor *, tb_tensor *);
typedef tb_tensor *(*graph_scalar_fn)(tb_tensor *, double);
typedef tb_tensor *(*graph_reduce_fn)(tb_tensor *, const int32_t *, size_t, bool);

static const graph_unary_fn graph_unary[] = {
    tb_neg,  tb_abs,   tb_exp,  tb_log,        tb_sqrt,       tb_rsqrt, tb_sin,
    tb_cos,  tb_tanh,  tb_relu, tb_sigmoid,    tb_gelu,       tb_silu,  tb_floor,
    tb_ceil, tb_round, tb_sign, tb_reciprocal, tb_logical_not};
static const graph_binary_fn graph_binary[] = {
    tb_add, tb_sub, tb_mul, tb_div, tb_pow, tb_maximum,     tb_minimum,    tb_eq,
    tb_ne,  tb_lt,  tb_le,  tb_gt,  tb_ge,  tb_logical_and, tb_logical_or, tb_matmul};
static const graph_scalar_fn graph_scalar[] = {tb_add_scalar, tb_sub_scalar, tb_mul_scalar,
                                               tb_div_scalar, tb_pow_scalar};
static const graph_reduce_fn graph_reduce[] = {tb_sum, tb_mean, tb_max, tb_min, tb_prod};

#define GRAPH_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* A list of up to 8 int64 values: dims, pads or attributes. */
static size_t graph_i64s(fuzz_bytes *b, int64_t *out, size_t cap, bool dims) {
    size_t n = fuzz_u8(b) % (cap + 1), i;
    for (i = 0; i < n; i++) {
        uint8_t tag = fuzz_u8(b);
        if (tag < 200)
            out[i] = (int64_t)(tag % (dims ? 7 : 9)) - 1; /* -1..5 or -1..7 */
        else
            out[i] = fuzz_i64(b);
    }
    return n;
}

/* One step through a public op function. */
static void graph_step_api(graph_run *r, fuzz_bytes *b) {
    tb_tensor *x = graph_pick(r, b), *t = NULL;
    uint8_t which = fuzz_u8(b) % 24;
    int64_t v[TB_MAX_RANK * 2];
    int32_t axes[TB_MAX_RANK];
    size_t n, i;
    const char *what = "op";
    switch (which) {
    case 0:
    case 1:
        what = "unary";
        t = graph_unary[fuzz_u8(b) % GRAPH_COUNT(graph_unary)](x);
        break;
    case 2:
    case 3: {
        graph_binary_fn fn = graph_binary[fuzz_u8(b) % GRAPH_COUNT(graph_binary)];
        what = "binary";
        t = fn(x, graph_pick(r, b));
        break;
    }
    case 4: {
        graph_scalar_fn fn = graph_scalar[fuzz_u8(b) % GRAPH_COUNT(graph_scalar)];
        what = "binary scalar";
        t = fn(x, fuzz_double(b));
        break;
    }
    case 5: {
        tb_tensor *a = graph_pick(r, b), *c = graph_pick(r, b);
        what = "tb_where";
        t = tb_where(x, a, c);
        break;
    }
    case 6: {
        double lo = fuzz_double(b), hi = fuzz_double(b);
        what = "tb_clamp";
        t = tb_clamp(x, lo, hi);
        break;
    }
    case 7: {
        bool keep = fuzz_u8(b) & 1;
        n = fuzz_u8(b) % 4;
        for (i = 0; i < n; i++)
            axes[i] = graph_axis(b);
        what = "reduction";
        t = graph_reduce[fuzz_u8(b) % GRAPH_COUNT(graph_reduce)](x, axes, n, keep);
        break;
    }
    case 8: {
        int32_t axis = graph_axis(b);
        bool keep = fuzz_u8(b) & 1;
        what = "argmax/argmin";
        t = (fuzz_u8(b) & 1) ? tb_argmax(x, axis, keep) : tb_argmin(x, axis, keep);
        break;
    }
    case 9: {
        int32_t axis = graph_axis(b);
        what = "softmax";
        t = (fuzz_u8(b) & 1) ? tb_softmax(x, axis) : tb_log_softmax(x, axis);
        break;
    }
    case 10: {
        int32_t nd = graph_axis(b);
        uint8_t f = fuzz_u8(b);
        tb_tensor *w = (f & 1) ? graph_pick(r, b) : NULL, *c = (f & 2) ? graph_pick(r, b) : NULL;
        what = "tb_layer_norm";
        t = tb_layer_norm(x, nd, w, c, fuzz_double(b));
        break;
    }
    case 11:
        n = graph_i64s(b, v, TB_MAX_RANK, true);
        what = "tb_reshape";
        t = tb_reshape(x, v, (int32_t)n);
        break;
    case 12: {
        n = fuzz_u8(b) % 6;
        for (i = 0; i < n; i++)
            axes[i] = graph_axis(b);
        what = "tb_permute";
        t = tb_permute(x, axes, (int32_t)n);
        break;
    }
    case 13: {
        int32_t a0 = graph_axis(b), a1 = graph_axis(b);
        what = "tb_transpose";
        t = tb_transpose(x, a0, a1);
        break;
    }
    case 14:
        n = graph_i64s(b, v, TB_MAX_RANK, true);
        what = "tb_expand";
        t = tb_expand(x, v, (int32_t)n);
        break;
    case 15: {
        int32_t axis = graph_axis(b);
        what = "squeeze";
        t = (fuzz_u8(b) & 1) ? tb_squeeze(x, axis) : tb_unsqueeze(x, axis);
        break;
    }
    case 16: {
        int32_t axis = graph_axis(b);
        int64_t start = fuzz_i64(b), end = fuzz_i64(b), step = fuzz_i64(b);
        what = "tb_slice";
        t = tb_slice(x, axis, start, end, step);
        break;
    }
    case 17:
        n = fuzz_u8(b) % 4;
        for (i = 0; i < n; i++)
            axes[i] = graph_axis(b);
        what = "tb_flip";
        t = tb_flip(x, axes, n);
        break;
    case 18: {
        tb_tensor *parts[3];
        n = 1 + fuzz_u8(b) % 3;
        parts[0] = x;
        for (i = 1; i < n; i++)
            parts[i] = graph_pick(r, b);
        what = "tb_concat";
        t = tb_concat(parts, n, graph_axis(b));
        break;
    }
    case 19:
        n = graph_i64s(b, v, 2 * TB_MAX_RANK, false);
        what = "tb_pad";
        t = tb_pad(x, v, n, fuzz_double(b));
        break;
    case 20: {
        int32_t axis = graph_axis(b);
        tb_tensor *index = graph_pick(r, b);
        what = "gather/index_select";
        t = (fuzz_u8(b) & 1) ? tb_gather(x, axis, index) : tb_index_select(x, axis, index);
        break;
    }
    case 21:
        what = "tb_cast";
        t = tb_cast(x, (tb_dtype)(fuzz_u8(b) % (TB_DTYPE_COUNT + 1)));
        break;
    case 22:
        what = "tb_to_device";
        t = tb_to_device(x, NULL);
        break;
    default:
        what = "leaf";
        t = graph_leaf(b);
        break;
    }
    graph_keep(r, t, what);
}

/* One step through tb_call_op: any non-leaf built-in op, operands from the pool, decoded
   attributes (mostly small, sometimes edge values). */
static void graph_step_call(graph_run *r, fuzz_bytes *b) {
    tb_tensor *inputs[4];
    int64_t attrs[TB_MAX_ATTRS];
    tb_op op = (tb_op)(TB_OP_NEG + fuzz_u8(b) % (TB_OP_BUILTIN_COUNT - TB_OP_NEG));
    int32_t arity = tb_op_arity(op);
    size_t n = arity >= 0 ? (size_t)arity : (size_t)(1 + fuzz_u8(b) % 3), num_attrs, i;
    char what[64];
    for (i = 0; i < n; i++)
        inputs[i] = graph_pick(r, b);
    num_attrs = fuzz_u8(b) % 9;
    for (i = 0; i < num_attrs; i++) {
        uint8_t tag = fuzz_u8(b);
        attrs[i] = tag < 200 ? (int64_t)(tag % 8) - 1 : fuzz_i64(b);
    }
    snprintf(what, sizeof what, "tb_call_op(%s)", tb_op_name(op));
    graph_keep(r, tb_call_op(op, inputs, n, num_attrs > 0 ? attrs : NULL, num_attrs), what);
}

/* The values of the pool after the run: each tensor's bytes, or NULL where reading failed. */
typedef struct graph_values {
    unsigned char *bytes[GRAPH_POOL];
    size_t size[GRAPH_POOL];
    tb_shape shape[GRAPH_POOL];
    int n;
} graph_values;

static void graph_run_program(const uint8_t *data, size_t size, bool stepwise, graph_values *out) {
    graph_run r;
    fuzz_bytes b;
    int leaves, steps, i;
    memset(&r, 0, sizeof r);
    memset(out, 0, sizeof *out);
    r.stepwise = stepwise;
    b.data = data;
    b.size = size;
    b.pos = 0;
    tb_manual_seed(1234);
    leaves = 1 + fuzz_u8(&b) % 3;
    for (i = 0; i < leaves; i++)
        graph_keep(&r, graph_leaf(&b), "leaf");
    steps = fuzz_u8(&b) % (GRAPH_STEPS + 1);
    for (i = 0; i < steps && r.n > 0 && fuzz_more(&b); i++) {
        if (fuzz_u8(&b) % 3 == 0)
            graph_step_call(&r, &b);
        else
            graph_step_api(&r, &b);
    }
    if (r.n > 0 && tb_sync(r.pool, (size_t)r.n) != TB_OK) {
        if (tb_last_error()[0] == '\0') fuzz_fail("tb_sync failed without an error");
        tb_clear_error();
    }
    out->n = r.n;
    for (i = 0; i < r.n; i++) {
        size_t nbytes = 0, k;
        tb_shape s = tb_tensor_shape(r.pool[i]);
        out->shape[i] = s;
        if (tb_shape_nbytes(&s, &nbytes) != TB_OK) fuzz_fail("nbytes of a pool tensor");
        out->bytes[i] = (unsigned char *)malloc(nbytes ? nbytes : 1);
        out->size[i] = nbytes;
        if (out->bytes[i] != NULL && tb_tensor_to_host(r.pool[i], out->bytes[i], nbytes) != TB_OK) {
            tb_status st = tb_last_status();
            if (st != TB_ERR_EXECUTE && st != TB_ERR_OUT_OF_MEMORY)
                fuzz_fail("reading a result failed with %s", tb_status_string(st));
            free(out->bytes[i]);
            out->bytes[i] = NULL;
            tb_clear_error();
        }
        if (out->bytes[i] != NULL && s.dtype == TB_BOOL) {
            for (k = 0; k < nbytes; k++) {
                if (out->bytes[i][k] > 1) fuzz_fail("a bool result holds %d", out->bytes[i][k]);
            }
        }
        tb_tensor_release(r.pool[i]);
    }
    tb_clear_error();
}

static void graph_values_free(graph_values *v) {
    int i;
    for (i = 0; i < v->n; i++)
        free(v->bytes[i]);
}

static int fuzz_graph_one(const uint8_t *data, size_t size) {
    graph_values whole, stepwise;
    int i;
    fuzz_setup();
    graph_run_program(data, size, false, &whole);
    graph_run_program(data, size, true, &stepwise);
    if (whole.n != stepwise.n)
        fuzz_fail("the two runs keep %d and %d tensors", whole.n, stepwise.n);
    for (i = 0; i < whole.n; i++) {
        if (!tb_shape_equal(&whole.shape[i], &stepwise.shape[i]))
            fuzz_fail("tensor %d has different shapes in the two runs", i);
        if (whole.bytes[i] != NULL && stepwise.bytes[i] != NULL &&
            memcmp(whole.bytes[i], stepwise.bytes[i], whole.size[i]) != 0) {
            char text[96];
            tb_shape_format(&whole.shape[i], text, sizeof text);
            fuzz_fail("tensor %d (%s) differs between one graph and step-by-step syncs", i, text);
        }
    }
    graph_values_free(&whole);
    graph_values_free(&stepwise);
    return 0;
}

#ifndef TB_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_graph_one(data, size);
}
#endif
