/* The compiled-backend suite, ops. Ops one by one: every elementwise op in every dtype (values and
   views of its operands), casts, scalar operands, movement (permute, slice, pad, gather, concat of
   many inputs), generators, rank 0 / size 0 / size 1 shapes, the random streams, custom ops and
   scalar arguments of every special value. Part of tests/backend_suite/suite.c. */

/* ---- elementwise ops ---- */

typedef struct unary_entry {
    const char *name;
    tb_tensor *(*fn)(tb_tensor *);
    int range;
    bool ints; /* also for integer dtypes */
} unary_entry;

static const unary_entry unary_ops[] = {
    {"neg", tb_neg, R_ANY, true},         {"abs", tb_abs, R_ANY, true},
    {"exp", tb_exp, R_ANY, false},        {"log", tb_log, R_POSITIVE, false},
    {"sqrt", tb_sqrt, R_POSITIVE, false}, {"rsqrt", tb_rsqrt, R_POSITIVE, false},
    {"sin", tb_sin, R_ANY, false},        {"cos", tb_cos, R_ANY, false},
    {"tanh", tb_tanh, R_ANY, false},      {"sigmoid", tb_sigmoid, R_ANY, false},
    {"relu", tb_relu, R_ANY, true},       {"gelu", tb_gelu, R_ANY, false},
    {"silu", tb_silu, R_ANY, false},      {"reciprocal", tb_reciprocal, R_AWAY, false},
    {"floor", tb_floor, R_ANY, true},     {"ceil", tb_ceil, R_ANY, true},
    {"round", tb_round, R_ANY, true},     {"sign", tb_sign, R_WHOLE, true},
    {"erf", tb_erf, R_ANY, false},        {"softplus", tb_softplus, R_ANY, false},
    {"mish", tb_mish, R_ANY, false},
};

typedef struct unary_arg {
    const unary_entry *op;
    int view;
    int64_t r, c;
} unary_arg;

static tb_tensor *build_unary(tb_tensor **in, const void *arg) {
    const unary_arg *a = (const unary_arg *)arg;
    tb_tensor *v = apply_view(a->view, in[0], a->r, a->c), *y = a->op->fn(v);
    tb_tensor_release(v);
    return y;
}

static void test_unary(void **state) {
    static unary_arg args[sizeof unary_ops / sizeof unary_ops[0]][6][V_COUNT];
    const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_BOOL};
    size_t i, d;
    int v;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < sizeof unary_ops / sizeof unary_ops[0]; i++) {
        for (d = 0; d < 6; d++) {
            tb_dtype dt = dtypes[d];
            if (!tb_dtype_is_float(dt) && !unary_ops[i].ints) continue;
            if (dt == TB_BOOL && strcmp(unary_ops[i].name, "sign") != 0) continue;
            if (dt == TB_U8 && strcmp(unary_ops[i].name, "neg") == 0) continue;
            for (v = 0; v < V_COUNT; v++) {
                unary_arg *a = &args[i][d][v];
                char name[128];
                input in;
                if (v != V_NONE && dt != TB_F32) continue;
                a->op = &unary_ops[i];
                a->view = v;
                a->r = 5;
                a->c = 7;
                in = in_of(view_input_shape(v, dt, a->r, a->c), unary_ops[i].range);
                snprintf(name, sizeof name, "%s of %s%s[5,7]", unary_ops[i].name, view_names[v],
                         tb_dtype_name(dt));
                add_case(name, build_unary, a, &in, 1);
            }
        }
    }
    flush_cases();
}

static tb_tensor *build_logical_not(tb_tensor **in, const void *arg) {
    (void)arg;
    return tb_logical_not(in[0]);
}

typedef struct cast_arg {
    tb_dtype to;
} cast_arg;

static tb_tensor *build_cast(tb_tensor **in, const void *arg) {
    return tb_cast(in[0], ((const cast_arg *)arg)->to);
}

static void test_cast_and_not(void **state) {
    static cast_arg casts[6];
    const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_BOOL};
    size_t from, to;
    (void)state;
    REQUIRE_OPENCL();
    for (to = 0; to < 6; to++)
        casts[to].to = dtypes[to];
    for (from = 0; from < 6; from++) {
        input in = in_of(shp(dtypes[from], 2, 3, 11, 0, 0), R_ANY);
        char name[96];
        for (to = 0; to < 6; to++) {
            snprintf(name, sizeof name, "cast %s -> %s", tb_dtype_name(dtypes[from]),
                     tb_dtype_name(dtypes[to]));
            add_case(name, build_cast, &casts[to], &in, 1);
        }
        snprintf(name, sizeof name, "logical_not of %s", tb_dtype_name(dtypes[from]));
        add_case(name, build_logical_not, NULL, &in, 1);
    }
    flush_cases();
    /* each dtype stored directly as a kernel's output */
    for (to = 0; to < 6; to++) {
        input in = in_of(shp(dtypes[(to + 1) % 6], 2, 3, 11, 0, 0), R_ANY);
        char name[96];
        snprintf(name, sizeof name, "cast %s -> %s (stored)", tb_dtype_name(dtypes[(to + 1) % 6]),
                 tb_dtype_name(dtypes[to]));
        add_case(name, build_cast, &casts[to], &in, 1);
    }
    flush_cases_direct();
    /* float to integer: truncation toward zero, wrapping into u8 and i32 */
    {
        input in = in_of(shp(TB_F32, 1, 64, 0, 0, 0), R_ANY);
        add_case("cast f32 -> u8 (negative values wrap)", build_cast, &casts[4], &in, 1);
    }
    flush_cases();
}

typedef struct binary_entry {
    const char *name;
    tb_tensor *(*fn)(tb_tensor *, tb_tensor *);
    int range_a, range_b;
    unsigned dtypes; /* bit per tb_dtype */
} binary_entry;

#define ALL_DT   0x3fu
#define NUM_DT   0x1fu /* not bool */
#define FLOAT_DT 0x03u
#define BOOL_DT  0x20u

static const binary_entry binary_ops[] = {
    {"add", tb_add, R_ANY, R_ANY, ALL_DT},
    {"sub", tb_sub, R_ANY, R_ANY, NUM_DT},
    {"mul", tb_mul, R_ANY, R_ANY, ALL_DT},
    {"div", tb_div, R_ANY, R_AWAY, FLOAT_DT},
    {"pow", tb_pow, R_POSITIVE, R_ANY, FLOAT_DT},
    {"pow", tb_pow, R_ANY, R_SMALL, 0x1cu},
    {"maximum", tb_maximum, R_WHOLE, R_WHOLE, ALL_DT},
    {"minimum", tb_minimum, R_WHOLE, R_WHOLE, ALL_DT},
    {"eq", tb_eq, R_WHOLE, R_WHOLE, ALL_DT},
    {"ne", tb_ne, R_WHOLE, R_WHOLE, ALL_DT},
    {"lt", tb_lt, R_WHOLE, R_WHOLE, ALL_DT},
    {"le", tb_le, R_WHOLE, R_WHOLE, ALL_DT},
    {"gt", tb_gt, R_WHOLE, R_WHOLE, ALL_DT},
    {"ge", tb_ge, R_WHOLE, R_WHOLE, ALL_DT},
    {"logical_and", tb_logical_and, R_ANY, R_ANY, BOOL_DT},
    {"logical_or", tb_logical_or, R_ANY, R_ANY, BOOL_DT},
};

static tb_tensor *build_binary(tb_tensor **in, const void *arg) {
    return ((const binary_entry *)arg)->fn(in[0], in[1]);
}

static void test_binary(void **state) {
    /* broadcasting pairs: same, trailing vector, both sides, scalar-like, size 1 */
    static const int64_t pairs[][2][4] = {
        {{3, 4, 0, 0}, {3, 4, 0, 0}}, {{3, 4, 0, 0}, {4, 0, 0, 0}}, {{2, 1, 5, 0}, {3, 1, 0, 0}},
        {{1, 0, 0, 0}, {2, 3, 0, 0}}, {{4, 1, 0, 0}, {1, 5, 0, 0}}, {{1, 1, 1, 0}, {1, 1, 1, 0}},
    };
    static const int32_t ranks[][2] = {{2, 2}, {2, 1}, {3, 2}, {1, 2}, {2, 2}, {3, 3}};
    const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_BOOL};
    size_t i, d, p;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < sizeof binary_ops / sizeof binary_ops[0]; i++) {
        for (d = 0; d < 6; d++) {
            if (!((binary_ops[i].dtypes >> d) & 1u)) continue;
            for (p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
                input in[2];
                char name[128];
                if (d != 0 && p != 1 && p != 2) continue;
                in[0] = in_of(
                    shp(dtypes[d], ranks[p][0], pairs[p][0][0], pairs[p][0][1], pairs[p][0][2], 0),
                    binary_ops[i].range_a);
                in[1] = in_of(
                    shp(dtypes[d], ranks[p][1], pairs[p][1][0], pairs[p][1][1], pairs[p][1][2], 0),
                    binary_ops[i].range_b);
                snprintf(name, sizeof name, "%s %s shapes #%zu", binary_ops[i].name,
                         tb_dtype_name(dtypes[d]), p);
                add_case(name, build_binary, &binary_ops[i], in, 2);
            }
        }
    }
    flush_cases();
}

typedef struct scalar_entry {
    const char *name;
    tb_tensor *(*fn)(tb_tensor *, double);
    double value;
} scalar_entry;

static const scalar_entry scalar_ops[] = {
    {"add_scalar", tb_add_scalar, 2.5}, {"sub_scalar", tb_sub_scalar, -1.25},
    {"mul_scalar", tb_mul_scalar, 3.0}, {"div_scalar", tb_div_scalar, 0.75},
    {"pow_scalar", tb_pow_scalar, 2.0}, {"pow_scalar", tb_pow_scalar, 0.5},
};

static tb_tensor *build_scalar_op(tb_tensor **in, const void *arg) {
    const scalar_entry *e = (const scalar_entry *)arg;
    return e->fn(in[0], e->value);
}

typedef struct ternary_arg {
    int which; /* 0 where, 1 clamp */
    double lo, hi;
} ternary_arg;

static tb_tensor *build_ternary(tb_tensor **in, const void *arg) {
    const ternary_arg *a = (const ternary_arg *)arg;
    if (a->which == 0) {
        tb_tensor *cond = tb_gt(in[0], in[1]), *y = tb_where(cond, in[1], in[2]);
        tb_tensor_release(cond);
        return y;
    }
    return tb_clamp(in[0], a->lo, a->hi);
}

static void test_scalar_operands_and_ternary(void **state) {
    static const ternary_arg where_arg = {0, 0, 0}, clamp_arg = {1, -0.5, 1.25},
                             clamp_swapped = {1, 1.0, -1.0}, clamp_int = {1, -3, 4};
    const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8};
    size_t i, d;
    input in[3];
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < sizeof scalar_ops / sizeof scalar_ops[0]; i++) {
        for (d = 0; d < 5; d++) {
            char name[96];
            if (scalar_ops[i].fn == tb_pow_scalar && d >= 2) continue;
            if (scalar_ops[i].fn == tb_div_scalar && d >= 2) continue;
            in[0] = in_of(shp(dtypes[d], 2, 4, 6, 0, 0),
                          scalar_ops[i].fn == tb_pow_scalar ? R_POSITIVE : R_ANY);
            snprintf(name, sizeof name, "%s %g on %s", scalar_ops[i].name, scalar_ops[i].value,
                     tb_dtype_name(dtypes[d]));
            add_case(name, build_scalar_op, &scalar_ops[i], in, 1);
        }
    }
    for (d = 0; d < 5; d++) {
        in[0] = in_of(shp(dtypes[d], 2, 3, 5, 0, 0), R_WHOLE);
        in[1] = in_of(shp(dtypes[d], 1, 5, 0, 0, 0), R_WHOLE);
        in[2] = in_of(shp(dtypes[d], 3, 2, 1, 5, 0), R_ANY);
        add_case("where with broadcasting", build_ternary, &where_arg, in, 3);
        in[0] = in_of(shp(dtypes[d], 2, 3, 5, 0, 0), R_ANY);
        add_case("clamp", build_ternary, d < 2 ? &clamp_arg : &clamp_int, in, 1);
        if (d < 2) add_case("clamp with lo > hi", build_ternary, &clamp_swapped, in, 1);
    }
    flush_cases();
}

/* ---- movement, copies, generators ---- */

typedef struct move_arg {
    int which;
} move_arg;

static tb_tensor *take(tb_tensor *old, tb_tensor *new_value) {
    tb_tensor_release(old);
    return new_value;
}

/* Each builds a view chain on a [4,6,5] input and ends with an elementwise op (so the view is
   read by a kernel rather than being a plain copy). */
static tb_tensor *build_move(tb_tensor **in, const void *arg) {
    int which = ((const move_arg *)arg)->which;
    tb_tensor *x = tb_tensor_retain(in[0]);
    switch (which) {
    case 0: {
        int64_t d[2] = {24, 5};
        x = take(x, tb_reshape(x, d, 2));
        break;
    }
    case 1: {
        int32_t p[3] = {2, 0, 1};
        x = take(x, tb_permute(x, p, 3));
        break;
    }
    case 2:
        x = take(x, tb_transpose(x, 0, 2));
        break;
    case 3:
        x = take(x, tb_slice(x, 1, 1, 6, 2));
        break;
    case 4:
        x = take(x, tb_slice(x, 2, -3, 100, 1));
        break;
    case 5: {
        int32_t f[2] = {0, 2};
        x = take(x, tb_flip(x, f, 2));
        break;
    }
    case 6: {
        int64_t d[4] = {3, 4, 6, 5};
        x = take(x, tb_expand(x, d, 4));
        break;
    }
    case 7: {
        x = take(x, tb_unsqueeze(x, 1));
        x = take(x, tb_squeeze(x, 1));
        break;
    }
    case 8: { /* permute then reshape (merge of non-contiguous dims) */
        int32_t p[3] = {1, 0, 2};
        int64_t d[2] = {24, 5};
        x = take(x, tb_permute(x, p, 3));
        x = take(x, tb_reshape(x, d, 2));
        break;
    }
    case 9: { /* slice, flip, transpose, reshape (split), expand */
        int32_t f[1] = {1};
        int64_t d[3] = {2, 3, 10}, e[4] = {2, 2, 3, 10};
        x = take(x, tb_slice(x, 0, 0, 4, 2));
        x = take(x, tb_flip(x, f, 1));
        x = take(x, tb_transpose(x, 1, 2));
        x = take(x, tb_reshape(x, d, 3));
        x = take(x, tb_unsqueeze(x, 0));
        x = take(x, tb_expand(x, e, 4));
        break;
    }
    case 10: { /* flatten then split differently */
        int64_t flat = 120, d[3] = {5, 8, 3};
        x = take(x, tb_transpose(x, 1, 2));
        x = take(x, tb_reshape(x, &flat, 1));
        x = take(x, tb_reshape(x, d, 3));
        break;
    }
    case 11: { /* a view of a computed value */
        int32_t p[3] = {2, 1, 0};
        x = take(x, tb_exp(x));
        x = take(x, tb_permute(x, p, 3));
        x = take(x, tb_slice(x, 0, 1, 5, 3));
        break;
    }
    default: {
        int64_t d[1] = {120};
        x = take(x, tb_reshape(x, d, 1));
        x = take(x, tb_slice(x, 0, 3, 120, 7));
        break;
    }
    }
    return take(x, tb_mul_scalar(x, 1.5));
}

static tb_tensor *build_move_result(tb_tensor **in, const void *arg) {
    /* the view itself is a result: a copy kernel reads through the index arithmetic */
    int32_t p[3] = {1, 2, 0};
    (void)arg;
    return tb_permute(in[0], p, 3);
}

static void test_movement(void **state) {
    static move_arg args[13];
    int i;
    input in = in_of(shp(TB_F32, 3, 4, 6, 5, 0), R_ANY);
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < 13; i++) {
        char name[64];
        args[i].which = i;
        snprintf(name, sizeof name, "view chain #%d", i);
        add_case(name, build_move, &args[i], &in, 1);
    }
    add_case("permuted view as a result", build_move_result, NULL, &in, 1);
    in.shape.dtype = TB_I64;
    add_case("permuted i64 view as a result", build_move_result, NULL, &in, 1);
    flush_cases();
}

typedef struct other_arg {
    int which;
} other_arg;

static tb_tensor *build_other(tb_tensor **in, const void *arg) {
    int which = ((const other_arg *)arg)->which;
    switch (which) {
    case 0:
        return tb_concat(in, 3, 1);
    case 1: {
        tb_tensor *t[3], *y;
        t[0] = tb_exp(in[0]);
        t[1] = tb_transpose(in[1], 0, 1);
        t[2] = in[2];
        y = tb_concat(t, 3, 0);
        tb_tensor_release(t[0]);
        tb_tensor_release(t[1]);
        return y;
    }
    case 2: {
        int64_t pads[4] = {1, 2, 0, 3};
        return tb_pad(in[0], pads, 4, -7.5);
    }
    case 3: {
        int64_t pads[4] = {0, 0, 2, 0};
        tb_tensor *e = tb_sigmoid(in[0]), *y = tb_pad(e, pads, 4, 0.25);
        tb_tensor_release(e);
        return take(y, tb_mul_scalar(y, 2.0));
    }
    case 4:
        return tb_gather(in[0], 1, in[1]);
    case 5:
        return tb_index_select(in[0], 0, in[1]);
    case 6: {
        tb_tensor *g = tb_gather(in[0], 0, in[1]), *y = tb_sum(g, NULL, 0, false);
        tb_tensor_release(g);
        return y;
    }
    default: {
        tb_tensor *s = tb_index_select(in[0], 1, in[1]);
        return take(s, tb_relu(s));
    }
    }
}

static void test_concat_pad_gather(void **state) {
    static other_arg args[8];
    input in[3];
    int i;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < 8; i++)
        args[i].which = i;
    in[0] = in_of(shp(TB_F32, 2, 3, 2, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 2, 3, 0, 0, 0), R_ANY);
    in[2] = in_of(shp(TB_F32, 2, 3, 5, 0, 0), R_ANY);
    add_case("concat along dim 1 (with an empty input)", build_other, &args[0], in, 3);
    in[0] = in_of(shp(TB_F32, 2, 2, 4, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 2, 4, 3, 0, 0), R_ANY);
    in[2] = in_of(shp(TB_F32, 2, 1, 4, 0, 0), R_ANY);
    add_case("concat of computed and viewed inputs", build_other, &args[1], in, 3);
    in[0] = in_of(shp(TB_F32, 2, 3, 4, 0, 0), R_ANY);
    add_case("pad", build_other, &args[2], in, 1);
    add_case("pad of a computed value", build_other, &args[3], in, 1);
    in[0].shape.dtype = TB_I32;
    add_case("pad i32", build_other, &args[2], in, 1);
    in[0] = in_of(shp(TB_F32, 2, 4, 6, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_I64, 2, 3, 5, 0, 0), R_INDEX);
    in[1].hi = 6;
    add_case("gather dim 1", build_other, &args[4], in, 2);
    in[1] = in_of(shp(TB_I32, 2, 3, 6, 0, 0), R_INDEX);
    in[1].hi = 4;
    add_case("gather dim 0, summed", build_other, &args[6], in, 2);
    in[1] = in_of(shp(TB_I32, 1, 7, 0, 0, 0), R_INDEX);
    in[1].hi = 4;
    add_case("index_select dim 0", build_other, &args[5], in, 2);
    in[1] = in_of(shp(TB_I64, 1, 9, 0, 0, 0), R_INDEX);
    in[1].hi = 6;
    add_case("relu(index_select dim 1)", build_other, &args[7], in, 2);
    flush_cases();
}

/* ---- concats of many inputs ----
   A concat of more than a few inputs is written by kernels of its own, one per run of its
   inputs: buffers read through a table of the kernel's arguments (native), scalars read from
   the table of scalars, or a balanced tree of tests (views, computed inputs, and buffers where
   arguments cannot be read through a table). */

enum { CAT_HOST, CAT_SCALAR, CAT_VIEW, CAT_COMPUTED, CAT_MIXED, CAT_REPEAT, CAT_HALF };

typedef struct cat_spec {
    const char *name;
    int32_t n;          /* inputs */
    int32_t rank, dim;  /* inputs of rank 1 to 3 ([len], [2, len], [2, len, 3] with len along
                           dim, the other dims 2 and 3), concatenated along dim */
    int32_t lens, zero; /* input i's length along dim: zero + i % lens (zero 0: some empty) */
    int kind;
} cat_spec;

static tb_shape cat_input_shape(const cat_spec *c, int32_t i, tb_dtype dtype) {
    int64_t d[3] = {2, 2, 3}, len = c->zero + i % c->lens;
    if (c->rank == 1) return shp(dtype, 1, len, 0, 0, 0);
    d[c->dim] = len;
    if (c->rank == 2) return shp(dtype, 2, d[0], d[1], 0, 0);
    return shp(dtype, 3, d[0], d[1], d[2], 0);
}

/* Input i of a case on `dev`: the same values on every device (seeded by i). */
static tb_tensor *cat_input(const cat_spec *c, int32_t i, const tb_device *dev) {
    int kind = c->kind == CAT_MIXED ? (i / 10) % 5 : c->kind;
    tb_dtype dtype = c->kind == CAT_HALF ? TB_F16 : TB_F32;
    tb_shape s;
    tb_tensor *x, *y;
    void *host;
    uint64_t saved = g_rng;
    if (c->kind == CAT_HALF) kind = (i / 10) % 2 == 0 ? CAT_HOST : CAT_SCALAR;
    if (c->kind == CAT_MIXED && kind == 1) dtype = TB_I32; /* buffers of another dtype */
    if (c->kind == CAT_REPEAT) i = 0;
    s = cat_input_shape(c, i, dtype);
    if (kind == CAT_SCALAR || (c->kind == CAT_MIXED && kind == 2)) {
        if (c->kind == CAT_MIXED) s.dtype = TB_I64;
        return tb_full(&s, (double)(i % 7) - 3.0, dev);
    }
    if (kind == CAT_VIEW || (c->kind == CAT_MIXED && kind == 3)) {
        tb_shape t = s;
        int32_t a = s.rank >= 2 ? 0 : -1;
        if (a >= 0) {
            t.dims[0] = s.dims[1];
            t.dims[1] = s.dims[0];
        }
        g_rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        host = host_alloc(&t);
        fill(host, &t, R_ANY, 0);
        g_rng = saved;
        x = tb_tensor_from_host(host, &t, dev);
        free(host);
        if (a < 0) { /* rank 1: a reversed view */
            int32_t f = 0;
            y = tb_flip(x, &f, 1);
        } else {
            y = tb_transpose(x, 0, 1);
        }
        tb_tensor_release(x);
        return y;
    }
    g_rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    host = host_alloc(&s);
    fill(host, &s, R_ANY, 0);
    g_rng = saved;
    x = tb_tensor_from_host(host, &s, dev);
    free(host);
    if (kind == CAT_COMPUTED || (c->kind == CAT_MIXED && kind == 4)) {
        y = tb_exp(x);
        tb_tensor_release(x);
        return y;
    }
    return x;
}

static tb_tensor *cat_build(const cat_spec *c, const tb_device *dev) {
    tb_tensor **in = (tb_tensor **)calloc((size_t)c->n, sizeof *in), *y;
    int32_t i;
    assert_non_null(in);
    for (i = 0; i < c->n; i++) {
        in[i] = cat_input(c, i, dev);
        if (in[i] == NULL) fail_msg("%s: input %d: %s", c->name, (int)i, tb_last_error());
    }
    y = tb_concat(in, (size_t)c->n, c->dim);
    if (y == NULL) fail_msg("%s: tb_concat: %s", c->name, tb_last_error());
    for (i = 0; i < c->n; i++)
        tb_tensor_release(in[i]);
    free(in);
    return y;
}

static void cat_check(const cat_spec *c) {
    tb_tensor *ref = cat_build(c, &g_cpu), *got = cat_build(c, &g_ocl);
    check_names_of(c->name, &got, 1);
    compare_tensors(c->name, ref, got);
    tb_tensor_release(ref);
    tb_tensor_release(got);
}

static const cat_spec cat_cases[] = {
    {"concat of 1 input", 1, 1, 0, 1, 1, CAT_HOST},
    {"concat of 9 one-element inputs", 9, 1, 0, 1, 1, CAT_HOST},
    {"concat of 300 one-element inputs", 300, 1, 0, 1, 1, CAT_HOST},
    {"concat of 300 one-element scalars", 300, 1, 0, 1, 1, CAT_SCALAR},
    {"concat of 9 [2, n, 3] along dim 1", 9, 3, 1, 3, 1, CAT_HOST},
    {"concat of 300 [n, 2, 3] along dim 0", 300, 3, 0, 3, 1, CAT_HOST},
    {"concat of 300 [2, n, 3] along dim 1, some empty", 300, 3, 1, 3, 0, CAT_HOST},
    {"concat of 300 [2, 2, n] along dim 2", 300, 3, 2, 2, 1, CAT_HOST},
    {"concat of 300 expanded scalars [2, n] along dim 1", 300, 2, 1, 3, 1, CAT_SCALAR},
    {"concat of 40 transposed views along dim 0", 40, 2, 0, 2, 1, CAT_VIEW},
    {"concat of 40 flipped views", 40, 1, 0, 3, 1, CAT_VIEW},
    {"concat of 40 computed inputs", 40, 1, 0, 2, 1, CAT_COMPUTED},
    {"concat of 300 mixed inputs and dtypes [2, n] along dim 1", 300, 2, 1, 2, 1, CAT_MIXED},
    {"concat of one input 100 times", 100, 1, 0, 3, 1, CAT_REPEAT},
    {"concat of 60 f16 buffers and scalars", 60, 2, 1, 2, 1, CAT_HALF},
};

static void test_concat_many_inputs(void **state) {
    size_t i;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < sizeof cat_cases / sizeof cat_cases[0]; i++)
        cat_check(&cat_cases[i]);
}

/* Many inputs in little time and little code: 20,000 one-element tensors (native: buffers
   read through the table of arguments; every backend: scalars from the table of scalars),
   and the program of 2,000 inputs stays small (a concat written as one test per input is
   hundreds of kilobytes of code). */
static void test_concat_many_inputs_large(void **state) {
    static const cat_spec large[] = {
        {"concat of 20000 one-element inputs", 20000, 1, 0, 1, 1, CAT_HOST},
        {"concat of 20000 one-element scalars", 20000, 1, 0, 1, 1, CAT_SCALAR},
    };
    cat_spec small[2] = {{"2000 scalars", 2000, 1, 0, 1, 1, CAT_SCALAR},
                         {"2000 one-element inputs", 2000, 1, 0, 1, 1, CAT_HOST}};
    size_t i;
    (void)state;
    REQUIRE_OPENCL();
    /* first the size, which code growing with the inputs fails in seconds */
    for (i = 0; i < (TEST_OPENCL ? 1u : 2u); i++) {
        tb_tensor *y = cat_build(&small[i], &g_ocl);
        char *text = tb_ir_backend_text(&y, 1);
        if (text == NULL) fail_msg("%s: tb_ir_backend_text: %s", small[i].name, tb_last_error());
        if (strlen(text) > 65536)
            fail_msg("%s: the program is %zu bytes", small[i].name, strlen(text));
        tb_free(text);
        if (kernel_count(&y, 1) > 2) fail_msg("%s: more than 2 kernels", small[i].name);
        tb_tensor_release(y);
    }
    for (i = TEST_OPENCL ? 1 : 0; i < 2; i++) {
        tb_tensor *ref = cat_build(&large[i], &g_cpu), *got = cat_build(&large[i], &g_ocl);
        compare_tensors(large[i].name, ref, got);
        tb_tensor_release(ref);
        tb_tensor_release(got);
    }
}

/* The same with the code a GPU gets (the test hook of test_gpu_code_paths). */
static void test_concat_many_inputs_gpu(void **state) {
    (void)state;
    REQUIRE_OPENCL();
#ifndef TB_NO_OPENCL
    tb__ocl_codegen_as_gpu = 1;
#endif
    tb_computation_cache_clear();
    test_concat_many_inputs(state);
#ifndef TB_NO_OPENCL
    tb__ocl_codegen_as_gpu = 0;
#endif
    tb_computation_cache_clear();
}

/* Gradients through a concat of many inputs: each input's gradient is its slice of the
   seed. */
static void test_concat_many_inputs_grad(void **state) {
    enum { N = 20 };
    const tb_device *devs[2] = {&g_cpu, &g_ocl};
    tb_tensor *grads[2][N];
    int d, i;
    (void)state;
    REQUIRE_OPENCL();
    for (d = 0; d < 2; d++) {
        tb_tensor *x[N], *y, *w, *prod, *loss;
        tb_shape ws = shp(TB_F32, 2, 2, 0, 0, 0);
        float *wh;
        int64_t total = 0;
        for (i = 0; i < N; i++) {
            tb_shape s = shp(TB_F32, 2, 2, 1 + i % 3, 0, 0);
            float h[6];
            int j;
            for (j = 0; j < 6; j++)
                h[j] = (float)(i * 6 + j) * 0.25f - 3.0f;
            x[i] = tb_tensor_from_host(h, &s, devs[d]);
            assert_int_equal(tb_set_requires_grad(x[i], true), TB_OK);
            total += 1 + i % 3;
        }
        ws.dims[1] = total;
        wh = (float *)calloc((size_t)(2 * total), sizeof *wh);
        assert_non_null(wh);
        for (i = 0; i < 2 * total; i++)
            wh[i] = (float)(i % 11) - 5.0f;
        w = tb_tensor_from_host(wh, &ws, devs[d]);
        free(wh);
        y = tb_concat(x, N, 1);
        prod = tb_mul(y, w);
        loss = tb_sum(prod, NULL, 0, false);
        if (tb_grad(loss, NULL, x, N, grads[d]) != TB_OK) fail_msg("tb_grad: %s", tb_last_error());
        for (i = 0; i < N; i++)
            tb_tensor_release(x[i]);
        tb_tensor_release(y);
        tb_tensor_release(w);
        tb_tensor_release(prod);
        tb_tensor_release(loss);
    }
    for (i = 0; i < N; i++) {
        compare_tensors("gradient through a concat of 20 inputs", grads[0][i], grads[1][i]);
        tb_tensor_release(grads[0][i]);
        tb_tensor_release(grads[1][i]);
    }
}

static void test_generators(void **state) {
    tb_tensor *c[8], *o[8];
    size_t i;
    (void)state;
    REQUIRE_OPENCL();
    c[0] = tb_arange(0.5, 7.25, 0.25, TB_F32, &g_cpu);
    o[0] = tb_arange(0.5, 7.25, 0.25, TB_F32, &g_ocl);
    c[1] = tb_arange(-3, 40, 3, TB_I64, &g_cpu);
    o[1] = tb_arange(-3, 40, 3, TB_I64, &g_ocl);
    c[2] = tb_arange(0.1, 3.3, 0.1, TB_F64, &g_cpu);
    o[2] = tb_arange(0.1, 3.3, 0.1, TB_F64, &g_ocl);
    c[3] = tb_eye(4, 6, TB_F32, &g_cpu);
    o[3] = tb_eye(4, 6, TB_F32, &g_ocl);
    c[4] = tb_eye(5, -1, TB_BOOL, &g_cpu);
    o[4] = tb_eye(5, -1, TB_BOOL, &g_ocl);
    c[5] = tb_mul_scalar(c[0], 2.0);
    o[5] = tb_mul_scalar(o[0], 2.0);
    {
        tb_shape s = shp(TB_F32, 2, 3, 4, 0, 0);
        c[6] = tb_full(&s, 2.5, &g_cpu);
        o[6] = tb_full(&s, 2.5, &g_ocl);
        c[7] = tb_add(c[6], c[3]);
        o[7] = tb_add(o[6], o[3]);
        /* c[7] is [3,4] + [4,6]: not broadcastable, so build something that is */
        tb_tensor_release(c[7]);
        tb_tensor_release(o[7]);
        s = shp(TB_F32, 2, 4, 6, 0, 0);
        tb_tensor_release(c[6]);
        tb_tensor_release(o[6]);
        c[6] = tb_zeros(&s, &g_cpu);
        o[6] = tb_zeros(&s, &g_ocl);
        c[7] = tb_sub(c[3], c[6]);
        o[7] = tb_sub(o[3], o[6]);
    }
    for (i = 0; i < 8; i++) {
        char name[32];
        assert_non_null(c[i]);
        assert_non_null(o[i]);
        snprintf(name, sizeof name, "generator #%zu", i);
        compare_tensors(name, c[i], o[i]);
        tb_tensor_release(c[i]);
        tb_tensor_release(o[i]);
    }
}

/* ---- awkward shapes: rank 0, size 0, size 1 ---- */

typedef struct edge_arg {
    int which;
} edge_arg;

static tb_tensor *build_edge(tb_tensor **in, const void *arg) {
    int which = ((const edge_arg *)arg)->which;
    int32_t ax = 1;
    switch (which) {
    case 0:
        return tb_mul_scalar(in[0], 3.0); /* rank 0 */
    case 1:
        return tb_add(in[0], in[1]); /* rank 0 + [3,4] */
    case 2:
        return tb_sum(in[0], &ax, 1, false); /* [4,0] -> [4] of zeros */
    case 3:
        return tb_mean(in[0], &ax, 1, true); /* [4,0] -> [4,1] of NaN */
    case 4:
        return tb_exp(in[0]); /* [4,0] */
    case 5:
        return tb_sum(in[0], NULL, 0, false); /* rank 0 result */
    case 6:
        return tb_softmax(in[0], 0); /* [1] */
    case 7:
        return tb_matmul(in[0], in[1]); /* [1,1] x [1,1] */
    default: {
        tb_tensor *t = tb_sum(in[0], NULL, 0, true), *y = tb_add(in[0], t); /* [1,1,1] */
        tb_tensor_release(t);
        return y;
    }
    }
}

static void test_edge_shapes(void **state) {
    static edge_arg args[9];
    tb_shape r0 = shp(TB_F32, 0, 0, 0, 0, 0);
    input in[2];
    int i;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < 9; i++)
        args[i].which = i;
    in[0] = in_of(r0, R_ANY);
    add_case("rank-0 op", build_edge, &args[0], in, 1);
    in[1] = in_of(shp(TB_F32, 2, 3, 4, 0, 0), R_ANY);
    add_case("rank 0 broadcast over [3,4]", build_edge, &args[1], in, 2);
    in[0] = in_of(shp(TB_F32, 2, 4, 0, 0, 0), R_ANY);
    add_case("sum over an empty axis", build_edge, &args[2], in, 1);
    add_case("mean over an empty axis", build_edge, &args[3], in, 1);
    add_case("elementwise on an empty array", build_edge, &args[4], in, 1);
    in[0] = in_of(shp(TB_F32, 3, 2, 3, 4, 0), R_ANY);
    add_case("sum of everything", build_edge, &args[5], in, 1);
    in[0] = in_of(shp(TB_F32, 1, 1, 0, 0, 0), R_ANY);
    add_case("softmax of one element", build_edge, &args[6], in, 1);
    in[0] = in_of(shp(TB_F32, 2, 1, 1, 0, 0), R_ANY);
    in[1] = in[0];
    add_case("matmul of [1,1]", build_edge, &args[7], in, 2);
    in[0] = in_of(shp(TB_F32, 3, 1, 1, 1, 0), R_ANY);
    add_case("size-1 dims everywhere", build_edge, &args[8], in, 1);
    flush_cases_direct();
}

/* ---- random streams ---- */

static void test_rand_bit_identical(void **state) {
    const tb_dtype dtypes[] = {TB_F32, TB_F64};
    size_t d, k, bytes = 0;
    (void)state;
    REQUIRE_OPENCL();
    for (d = 0; d < 2; d++) {
        for (k = 0; k < 2; k++) {
            tb_shape s = shp(dtypes[d], 2, 37, 101, 0, 0);
            tb_tensor *c, *o, *c2, *o2;
            void *a = host_alloc(&s), *b = host_alloc(&s);
            assert_int_equal(tb_shape_nbytes(&s, &bytes), TB_OK);
            tb_manual_seed(1234 + d);
            c = k == 0 ? tb_rand(&s, &g_cpu) : tb_randn(&s, &g_cpu);
            c2 = k == 0 ? tb_rand(&s, &g_cpu) : tb_randn(&s, &g_cpu);
            tb_manual_seed(1234 + d);
            o = k == 0 ? tb_rand(&s, &g_ocl) : tb_randn(&s, &g_ocl);
            o2 = k == 0 ? tb_rand(&s, &g_ocl) : tb_randn(&s, &g_ocl);
            assert_non_null(c);
            assert_non_null(o);
            assert_int_equal(tb_tensor_to_host(c, a, bytes), TB_OK);
            assert_int_equal(tb_tensor_to_host(o, b, bytes), TB_OK);
            if (memcmp(a, b, bytes) != 0) {
                fail_msg("%s %s: not bit-identical to the cpu backend", k ? "randn" : "rand",
                         tb_dtype_name(dtypes[d]));
            }
            /* the second call continues the stream */
            assert_int_equal(tb_tensor_to_host(c2, a, bytes), TB_OK);
            assert_int_equal(tb_tensor_to_host(o2, b, bytes), TB_OK);
            assert_memory_equal(a, b, bytes);
            tb_tensor_release(c);
            tb_tensor_release(o);
            tb_tensor_release(c2);
            tb_tensor_release(o2);
            free(a);
            free(b);
        }
    }
    /* a random tensor used inside a fused graph */
    {
        tb_shape s = shp(TB_F32, 1, 1000, 0, 0, 0);
        tb_tensor *c, *o, *cr, *orr;
        tb_manual_seed(7);
        cr = tb_rand(&s, &g_cpu);
        tb_manual_seed(7);
        orr = tb_rand(&s, &g_ocl);
        c = tb_sum(cr, NULL, 0, false);
        o = tb_sum(orr, NULL, 0, false);
        compare_tensors("sum of rand", c, o);
        tb_tensor_release(c);
        tb_tensor_release(o);
        tb_tensor_release(cr);
        tb_tensor_release(orr);
    }
}

/* ---- custom ops ---- */

static tb_status axpb_reference(const void *const *inputs, const tb_shape *input_shapes,
                                size_t num_inputs, void *output, const tb_shape *output_shape,
                                const int64_t *attrs, size_t num_attrs, void *user_data) {
    size_t n = numel_of(output_shape), i, nb = numel_of(&input_shapes[1]);
    const float *a = (const float *)inputs[0], *b = (const float *)inputs[1];
    float *o = (float *)output;
    (void)num_inputs, (void)attrs, (void)num_attrs, (void)user_data;
    for (i = 0; i < n; i++)
        o[i] = a[i] * 2.0f + b[i % nb];
    return TB_OK;
}

static void test_custom_ops(void **state) {
    tb_custom_op_desc d;
    tb_op op;
    input in[2];
    (void)state;
    REQUIRE_OPENCL();
    memset(&d, 0, sizeof d);
    d.name = "ocl_axpb";
    d.num_inputs = 2;
    d.reference = axpb_reference;
    d.opencl_expr = "x0 * (T)2 + x1";
    if (tb_op_lookup("ocl_axpb", &op) != TB_OK) assert_int_equal(tb_op_register(&d, &op), TB_OK);
    {
        float a[12], b[4], ref[12], got[12];
        tb_shape sa = shp(TB_F32, 2, 3, 4, 0, 0), sb = shp(TB_F32, 1, 4, 0, 0, 0);
        tb_tensor *x, *y, *ins[2], *z, *w;
        int i, kernels;
        fill(a, &sa, R_ANY, 0);
        fill(b, &sb, R_ANY, 0);
        for (i = 0; i < 12; i++)
            ref[i] = tanhf(a[i] * 2.0f + b[i % 4]) + 1.0f;
        x = tb_tensor_from_host(a, &sa, &g_ocl);
        y = tb_tensor_from_host(b, &sb, &g_ocl);
        ins[0] = x;
        ins[1] = y;
        z = tb_call_op(op, ins, 2, NULL, 0);
        assert_non_null(z);
        w = tb_tanh(z);
        w = take(w, tb_add_scalar(w, 1.0));
        /* the custom op fuses with its neighbours: one kernel */
        kernels = kernel_count(&w, 1);
        assert_int_equal(kernels, 1);
        assert_int_equal(tb_tensor_to_host(w, got, sizeof got), TB_OK);
        compare_host("custom op with opencl_expr, fused", &sa, ref, got);
        tb_tensor_release(x);
        tb_tensor_release(y);
        tb_tensor_release(z);
        tb_tensor_release(w);
    }
    (void)in;
}

static tb_status copy_reference(const void *const *inputs, const tb_shape *input_shapes,
                                size_t num_inputs, void *output, const tb_shape *output_shape,
                                const int64_t *attrs, size_t num_attrs, void *user_data) {
    size_t bytes = 0;
    (void)input_shapes, (void)num_inputs, (void)attrs, (void)num_attrs, (void)user_data;
    tb_shape_nbytes(output_shape, &bytes);
    memcpy(output, inputs[0], bytes);
    return TB_OK;
}

static void test_custom_op_without_expr_falls_back(void **state) {
    tb_custom_op_desc d;
    tb_op op;
    float a[6] = {1, -2, 3, -4, 5, -6}, got[6];
    tb_shape s = shp(TB_F32, 1, 6, 0, 0, 0);
    tb_tensor *x, *y, *z;
    int i;
    (void)state;
    REQUIRE_OPENCL();
    memset(&d, 0, sizeof d);
    d.name = "ocl_plain_copy";
    d.num_inputs = 1;
    d.reference = copy_reference;
    if (tb_op_lookup("ocl_plain_copy", &op) != TB_OK)
        assert_int_equal(tb_op_register(&d, &op), TB_OK);
    tb_metrics_reset();
    x = tb_tensor_from_host(a, &s, &g_ocl);
    y = tb_call_op(op, &x, 1, NULL, 0);
    z = tb_relu(y);
    assert_int_equal(tb_tensor_to_host(z, got, sizeof got), TB_OK);
    for (i = 0; i < 6; i++)
        assert_true(got[i] == (a[i] > 0 ? a[i] : 0));
    assert_int_equal(tb_metrics_counter("Fallback::ocl_plain_copy"), 1);
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(z);
}

static void test_custom_op_compile_error(void **state) {
    tb_custom_op_desc d;
    tb_op op;
    float a[4] = {1, 2, 3, 4}, got[4];
    tb_shape s = shp(TB_F32, 1, 4, 0, 0, 0);
    tb_tensor *x, *y;
    tb_status st;
    (void)state;
    REQUIRE_OPENCL();
    memset(&d, 0, sizeof d);
    d.name = "ocl_broken";
    d.num_inputs = 1;
    d.reference = copy_reference;
    d.opencl_expr = "x0 +* no_such_name";
    if (tb_op_lookup("ocl_broken", &op) != TB_OK) assert_int_equal(tb_op_register(&d, &op), TB_OK);
    x = tb_tensor_from_host(a, &s, &g_ocl);
    y = tb_call_op(op, &x, 1, NULL, 0);
    assert_non_null(y);
    st = tb_tensor_to_host(y, got, sizeof got);
    assert_int_equal(st, TB_ERR_COMPILE);
    assert_int_equal(tb_last_status(), TB_ERR_COMPILE);
    assert_non_null(strstr(tb_last_error(), "build log"));
    assert_non_null(strstr(tb_last_error(), "no_such_name"));
    /* the value is not lost: the inputs still work */
    tb_tensor_release(y);
    assert_int_equal(tb_tensor_to_host(x, got, sizeof got), TB_OK);
    assert_memory_equal(a, got, sizeof a);
    tb_tensor_release(x);
}

/* A pack kernel "void <prefix>_<panels>_<depth>_<width>(" in text whose panels of `width`
   cover `len` rows or columns with fewer than one panel of padding, for depth K (a panel: 4
   to 16 rows of A, or one to two registers of B's columns, 32 with AVX-512). */
static void check_pack_kernel(const char *text, const char *prefix, long len, long k) {
    char key[16];
    const char *p;
    long panels = 0, depth = 0, width = 0;
    snprintf(key, sizeof key, "void %s_", prefix);
    p = strstr(text, key);
    if (p == NULL || sscanf(p + strlen(key), "%ld_%ld_%ld(", &panels, &depth, &width) != 3)
        fail_msg("no pack kernel %s in:\n%s", prefix, text);
    assert_int_equal(depth, k);
    assert_true(width >= 4 && width <= 32);
    assert_true(panels * width >= len && (panels - 1) * width < len);
}

/* ---- scalar arguments of every value ---- */

typedef struct special_arg {
    int which;
    double value;
} special_arg;

static tb_tensor *build_special(tb_tensor **in, const void *arg) {
    const special_arg *a = (const special_arg *)arg;
    tb_shape s = tb_tensor_shape(in[0]);
    tb_device dev = tb_tensor_device(in[0]);
    tb_tensor *k, *y;
    switch (a->which) {
    case 0:
        return tb_add_scalar(in[0], a->value);
    case 1:
        return tb_mul_scalar(in[0], a->value);
    case 2:
        return tb_div_scalar(in[0], a->value);
    case 3: /* a parameter of the input's own dtype (integer dtypes included) */
        k = tb_scalar_tensor(tb_scalar_f(s.dtype, a->value), &dev);
        y = tb_add(in[0], k);
        break;
    default: /* a constant tensor of the input's dtype */
        k = tb_full(&s, a->value, &dev);
        y = tb_mul(in[0], k);
        break;
    }
    tb_tensor_release(k);
    return y;
}

/* NaN, infinities and values beyond the int64 range as scalar arguments of kernels (eight
   cases to a kernel, so they are kernel arguments; thirty, so they are a table) and as
   scalar tensors read back: the same values as the cpu backend, with no undefined
   conversion on the way (the undefined-behaviour sanitizer checks that). */
static void test_scalar_special_values(void **state) {
    static const double values[] = {
        NAN, INFINITY, -INFINITY, 1e30, -9223372036854775808.0, 9223372036854775808.0};
    static const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64};
    static special_arg args[5 * 6];
    size_t di, vi, n = 0;
    int which, pass;
    (void)state;
    REQUIRE_OPENCL();
    for (pass = 0; pass < 2; pass++) {
        for (di = 0; di < 4; di++) {
            input in[1];
            n = 0;
            in[0] = in_of(shp(dtypes[di], 1, 6, 0, 0, 0), R_ANY);
            for (vi = 0; vi < 6; vi++) {
                for (which = 0; which < 5; which++) {
                    special_arg *a = &args[n++];
                    char name[128];
                    /* an integer full of a value it cannot hold is an error on both */
                    if (which == 4 && !tb_dtype_is_float(dtypes[di])) continue;
                    a->which = which;
                    a->value = values[vi];
                    snprintf(name, sizeof name, "%s %d with %g", tb_dtype_name(dtypes[di]), which,
                             values[vi]);
                    add_case(name, build_special, a, in, 1);
                    if (pass == 0 && g_num_cases == 8) flush_cases();
                }
            }
            flush_cases();
        }
    }
    for (di = 0; di < 4; di++) {
        for (vi = 0; vi < 6; vi++) {
            tb_tensor *r = tb_scalar_tensor(tb_scalar_f(dtypes[di], values[vi]), &g_cpu);
            tb_tensor *g = tb_scalar_tensor(tb_scalar_f(dtypes[di], values[vi]), &g_ocl);
            char name[64];
            snprintf(name, sizeof name, "scalar tensor %s %g", tb_dtype_name(dtypes[di]),
                     values[vi]);
            compare_tensors(name, r, g);
            tb_tensor_release(r);
            tb_tensor_release(g);
        }
    }
}

/* in the order they run */
static const struct CMUnitTest ops_tests[] = {
    cmocka_unit_test(test_unary),
    cmocka_unit_test(test_cast_and_not),
    cmocka_unit_test(test_binary),
    cmocka_unit_test(test_scalar_operands_and_ternary),
    cmocka_unit_test(test_movement),
    cmocka_unit_test(test_concat_pad_gather),
    cmocka_unit_test(test_concat_many_inputs),
    cmocka_unit_test(test_concat_many_inputs_large),
    cmocka_unit_test(test_concat_many_inputs_grad),
    cmocka_unit_test(test_generators),
    cmocka_unit_test(test_edge_shapes),
    cmocka_unit_test(test_rand_bit_identical),
    cmocka_unit_test(test_custom_ops),
    cmocka_unit_test(test_custom_op_without_expr_falls_back),
    cmocka_unit_test(test_scalar_special_values),
    OPENCL_ONLY(test_concat_many_inputs_gpu),
    OPENCL_ONLY(test_custom_op_compile_error),
};
