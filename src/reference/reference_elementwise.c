/* ===========================================================================================
   Reference interpreter: every op in plain C on host arrays. The cpu backend executes graphs
   with it, the executor runs eager fallbacks with it and TB_CHECK compares against it.
   Values are views (a refcounted buffer, an element offset and element strides), so movement
   ops never copy; kernels walk strided views with one N-d iterator.
   This part: buffers and views, scalar conversions, the iterator, copies and the elementwise
   ops; reference.c has the other ops and runs nodes and graphs (the types and what the parts
   share: reference_internal.h).
   =========================================================================================== */

/* ---- buffers and views ---- */

static void tb__ref_pool_drain(tb__ref_pool *pool) {
    uint32_t i;
    for (i = 0; i < pool->count; i++)
        tb__free(pool->data[i]);
    pool->count = 0;
}

/* A pooled block of at least `nbytes` and not more than twice that, or NULL. */
static char *tb__ref_pool_take(size_t nbytes, size_t *cap) {
    tb__ref_pool *pool = tb__ref_current_pool;
    uint32_t i, best = UINT32_MAX;
    char *data;
    if (!pool || nbytes < TB__REF_POOL_MIN) return NULL;
    for (i = 0; i < pool->count; i++)
        if (pool->cap[i] >= nbytes && pool->cap[i] / 2u <= nbytes &&
            (best == UINT32_MAX || pool->cap[i] < pool->cap[best]))
            best = i;
    if (best == UINT32_MAX) return NULL;
    data = pool->data[best];
    *cap = pool->cap[best];
    pool->count--;
    pool->data[best] = pool->data[pool->count];
    pool->cap[best] = pool->cap[pool->count];
    return data;
}

static void tb__ref_pool_give(char *data, size_t cap) {
    tb__ref_pool *pool = tb__ref_current_pool;
    if (!pool || cap < TB__REF_POOL_MIN) {
        tb__free(data);
        return;
    }
    if (pool->count == TB__REF_POOL_SLOTS) {
        /* full: the oldest block goes */
        tb__free(pool->data[0]);
        memmove(pool->data, pool->data + 1, (TB__REF_POOL_SLOTS - 1) * sizeof(char *));
        memmove(pool->cap, pool->cap + 1, (TB__REF_POOL_SLOTS - 1) * sizeof(size_t));
        pool->count--;
    }
    pool->data[pool->count] = data;
    pool->cap[pool->count] = cap;
    pool->count++;
}

static tb__rbuf *tb__rbuf_new(size_t nbytes) {
    tb__rbuf *b = (tb__rbuf *)tb__alloc(sizeof(tb__rbuf));
    if (!b) return NULL;
    /* one byte at least: empty tensors still get a valid pointer */
    if (nbytes == 0) nbytes = 1;
    b->data = tb__ref_pool_take(nbytes, &b->cap);
    if (!b->data) {
        b->data = (char *)tb__alloc(nbytes);
        b->cap = nbytes;
    }
    if (!b->data) {
        tb__free(b);
        return NULL;
    }
    b->refs = 1;
    b->owned = true;
    return b;
}

static tb__rbuf *tb__rbuf_borrow(const void *data) {
    tb__rbuf *b = (tb__rbuf *)tb__alloc(sizeof(tb__rbuf));
    if (!b) return NULL;
    b->data = (char *)data;
    b->cap = 0;
    b->refs = 1;
    b->owned = false;
    return b;
}

static void tb__rbuf_release(tb__rbuf *b) {
    if (!b) return;
    if (--b->refs == 0) {
        if (b->owned) tb__ref_pool_give(b->data, b->cap);
        tb__free(b);
    }
}

static void tb__rview_clear(tb__rview *v) {
    tb__rbuf_release(v->buf);
    v->buf = NULL;
}

static int64_t tb__ref_esize(tb_dtype dtype) {
    return (int64_t)tb_dtype_size(dtype);
}

/* Element count of a validated shape (fits in int64: the size rule of shapes). */
static int64_t tb__ref_numel(const tb_shape *s) {
    return tb__shape_numel(s);
}

/* Row-major strides (a 0 dim counts as 1). They fit for every valid shape, empty ones included
   (the size rule of shapes); a broken shape saturates instead of overflowing. */
static void tb__ref_contig_strides(const tb_shape *s, int64_t *strides) {
    int64_t acc = 1;
    int32_t d;
    for (d = s->rank - 1; d >= 0; d--) {
        strides[d] = acc;
        if (s->dims[d] > 1 && !tb__mul_i64(acc, s->dims[d], &acc)) acc = INT64_MAX;
    }
}

static tb_status tb__ref_nbytes(const tb_shape *shape, size_t *out) {
    tb_status st = tb_shape_nbytes(shape, out);
    if (st != TB_OK) {
        char text[96];
        tb__shape_text(shape, text);
        return tb__error(TB_ERR_OVERFLOW, "reference: the size of %s does not fit in memory", text);
    }
    return TB_OK;
}

/* A new contiguous view of `shape` over a fresh buffer. */
static tb_status tb__rview_alloc(tb__rview *v, const tb_shape *shape) {
    size_t nbytes = 0;
    tb_status st = tb__ref_nbytes(shape, &nbytes);
    if (st != TB_OK) return st;
    memset(v, 0, sizeof(*v));
    v->buf = tb__rbuf_new(nbytes);
    if (!v->buf) return TB_ERR_OUT_OF_MEMORY;
    v->shape = *shape;
    v->offset = 0;
    tb__ref_contig_strides(shape, v->strides);
    return TB_OK;
}

/* A contiguous view over a caller's array (not copied). */
static tb_status tb__rview_borrow(tb__rview *v, const tb_shape *shape, const void *data) {
    memset(v, 0, sizeof(*v));
    if (!data) {
        char text[96];
        tb__shape_text(shape, text);
        return tb__error(TB_ERR_INTERNAL, "reference: no host array for a value of %s", text);
    }
    v->buf = tb__rbuf_borrow(data);
    if (!v->buf) return TB_ERR_OUT_OF_MEMORY;
    v->shape = *shape;
    tb__ref_contig_strides(shape, v->strides);
    return TB_OK;
}

static void tb__rview_share(tb__rview *dst, const tb__rview *src) {
    *dst = *src;
    dst->buf->refs++;
}

static char *tb__rview_ptr(const tb__rview *v) {
    return v->buf->data + v->offset * tb__ref_esize(v->shape.dtype);
}

/* Whether the elements lie in row-major order from the offset on (size-1 axes do not count). */
static bool tb__rview_is_contig(const tb__rview *v) {
    int64_t expect = 1;
    int32_t d;
    if (tb__ref_numel(&v->shape) == 0) return true;
    for (d = v->shape.rank - 1; d >= 0; d--) {
        if (v->shape.dims[d] == 1) continue;
        if (v->strides[d] != expect) return false;
        expect *= v->shape.dims[d];
    }
    return true;
}

/* ---- scalar conversions (defined for every input: no UB on NaN or out-of-range values) ---- */

/* Truncation toward zero, saturating at the int64 range; NaN gives 0. */
static int64_t tb__ref_f2i(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775808.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

static double tb__ld_f(tb_dtype dt, const char *p) {
    switch (dt) {
    case TB_F32:
        return (double)*(const float *)p;
    case TB_F64:
        return *(const double *)p;
    case TB_I32:
        return (double)*(const int32_t *)p;
    case TB_I64:
        return (double)*(const int64_t *)p;
    case TB_U8:
        return (double)*(const uint8_t *)p;
    case TB_BOOL:
        return *(const uint8_t *)p ? 1.0 : 0.0;
    case TB_F16:
    case TB_BF16: {
        uint16_t h;
        memcpy(&h, p, sizeof h);
        return tb__half_to_f64(dt, h);
    }
    default:
        return 0.0;
    }
}

static int64_t tb__ld_i(tb_dtype dt, const char *p) {
    switch (dt) {
    case TB_F32:
        return tb__ref_f2i((double)*(const float *)p);
    case TB_F64:
        return tb__ref_f2i(*(const double *)p);
    case TB_I32:
        return (int64_t)(*(const int32_t *)p);
    case TB_I64:
        return *(const int64_t *)p;
    case TB_U8:
        return (int64_t)(*(const uint8_t *)p);
    case TB_BOOL:
        return *(const uint8_t *)p ? 1 : 0;
    case TB_F16:
    case TB_BF16:
        return tb__ref_f2i(tb__ld_f(dt, p));
    default:
        return 0;
    }
}

/* Truth value as PyTorch's bool(): nonzero (NaN included) is true. */
static bool tb__ld_b(tb_dtype dt, const char *p) {
    switch (dt) {
    case TB_F32:
        return *(const float *)p != 0.0f;
    case TB_F64:
        return *(const double *)p != 0.0;
    case TB_I32:
        return *(const int32_t *)p != 0;
    case TB_I64:
        return *(const int64_t *)p != 0;
    case TB_F16:
    case TB_BF16:
        return tb__ld_f(dt, p) != 0.0;
    default:
        return *(const uint8_t *)p != 0;
    }
}

static void tb__st_f(tb_dtype dt, char *p, double v) {
    switch (dt) {
    case TB_F32:
        *(float *)p = (float)v;
        break;
    case TB_F64:
        *(double *)p = v;
        break;
    case TB_I32:
        *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)tb__ref_f2i(v);
        break;
    case TB_I64:
        *(int64_t *)p = tb__ref_f2i(v);
        break;
    case TB_U8:
        *(uint8_t *)p = (uint8_t)(uint64_t)tb__ref_f2i(v);
        break;
    case TB_BOOL:
        *(uint8_t *)p = (uint8_t)(v != 0.0);
        break;
    case TB_F16:
    case TB_BF16: {
        uint16_t h = tb__f64_to_half(dt, v);
        memcpy(p, &h, sizeof h);
        break;
    }
    default:
        break;
    }
}

static void tb__st_i(tb_dtype dt, char *p, int64_t v) {
    switch (dt) {
    case TB_F32:
        *(float *)p = (float)v;
        break;
    case TB_F64:
        *(double *)p = (double)v;
        break;
    case TB_I32:
        *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)v;
        break;
    case TB_I64:
        *(int64_t *)p = v;
        break;
    case TB_U8:
        *(uint8_t *)p = (uint8_t)(uint64_t)v;
        break;
    case TB_BOOL:
        *(uint8_t *)p = (uint8_t)(v != 0);
        break;
    case TB_F16:
    case TB_BF16:
        tb__st_f(dt, p, (double)v);
        break;
    default:
        break;
    }
}

/* One element of dtype `sd` at `a` converted to `dd` at `o` (CAST's rules). */
static void tb__ref_convert(tb_dtype dd, char *o, tb_dtype sd, const char *a) {
    if (tb_dtype_is_float(sd))
        tb__st_f(dd, o, tb__ld_f(sd, a));
    else
        tb__st_i(dd, o, tb__ld_i(sd, a));
}

/* ---- the strided N-d iterator ----
   Operand 0 is usually the output. Every operand has strides over the same dims (0 where it is
   broadcast). Axes of size 1 are dropped and adjacent axes that are contiguous for every operand
   are merged, so contiguous work becomes one long run. */

static void tb__iter_begin(tb__iter *it, int32_t rank, const int64_t *dims) {
    memset(it, 0, sizeof(*it));
    it->rank = rank;
    if (rank > 0) memcpy(it->dims, dims, (size_t)rank * sizeof(int64_t));
}

static void tb__iter_add(tb__iter *it, char *base, int64_t offset, const int64_t *strides,
                         int64_t esize) {
    int32_t k = it->nops++;
    it->base[k] = base;
    it->offset[k] = offset;
    it->esize[k] = esize;
    if (it->rank > 0) memcpy(it->strides[k], strides, (size_t)it->rank * sizeof(int64_t));
}

/* A malformed node: a bug in the layer that built the graph, not the user's doing. */
static tb_status tb__ref_malformed(const tb_node *node, const tb_shape *operand) {
    char a[96], b[96];
    const char *name = tb_op_name(node->op);
    tb__shape_text(operand, a);
    tb__shape_text(&node->shape, b);
    return tb__error(TB_ERR_INTERNAL, "reference: malformed %s node (operand %s, output %s)",
                     name ? name : "custom", a, b);
}

/* Adds a view, broadcasting it (NumPy rules, aligned at the last axis) to the iterator's dims. */
static tb_status tb__iter_add_view(tb__iter *it, const tb__rview *v) {
    int64_t strides[TB_MAX_RANK];
    int32_t d, shift = it->rank - v->shape.rank;
    bool ok = shift >= 0;
    for (d = 0; d < it->rank && ok; d++) {
        int32_t j = d - shift;
        if (j < 0 || v->shape.dims[j] == 1)
            strides[d] = 0;
        else if (v->shape.dims[j] == it->dims[d])
            strides[d] = v->strides[j];
        else
            ok = false;
    }
    if (!ok) {
        char a[96], b[96];
        tb_shape s = v->shape;
        tb__shape_text(&s, a);
        s.rank = it->rank;
        if (it->rank > 0) memcpy(s.dims, it->dims, (size_t)it->rank * sizeof(int64_t));
        tb__shape_text(&s, b);
        return tb__error(TB_ERR_INTERNAL, "reference: operand %s does not broadcast to %s", a, b);
    }
    tb__iter_add(it, v->buf->data, v->offset, strides, tb__ref_esize(v->shape.dtype));
    return TB_OK;
}

static tb_status tb__iter_run(tb__iter *it, tb__run_fn fn, void *ctx) {
    int64_t dims[TB_MAX_RANK], strides[TB__REF_MAX_OPS][TB_MAX_RANK];
    int64_t idx[TB_MAX_RANK], off[TB__REF_MAX_OPS], inner[TB__REF_MAX_OPS];
    char *ptrs[TB__REF_MAX_OPS];
    int32_t r = 0, d, k, nops = it->nops;
    for (d = 0; d < it->rank; d++)
        if (it->dims[d] == 0) return TB_OK;
    for (d = 0; d < it->rank; d++) {
        bool merge = r > 0;
        if (it->dims[d] == 1) continue;
        for (k = 0; k < nops && merge; k++) {
            int64_t span;
            merge = tb__mul_i64(it->strides[k][d], it->dims[d], &span) && strides[k][r - 1] == span;
        }
        if (merge) {
            dims[r - 1] *= it->dims[d];
            for (k = 0; k < nops; k++)
                strides[k][r - 1] = it->strides[k][d];
        } else {
            dims[r] = it->dims[d];
            for (k = 0; k < nops; k++)
                strides[k][r] = it->strides[k][d];
            r++;
        }
    }
    if (r == 0) {
        dims[0] = 1;
        for (k = 0; k < nops; k++)
            strides[k][0] = 0;
        r = 1;
    }
    for (k = 0; k < nops; k++) {
        off[k] = it->offset[k];
        inner[k] = strides[k][r - 1];
    }
    memset(idx, 0, sizeof(idx));
    for (;;) {
        tb_status st;
        for (k = 0; k < nops; k++)
            ptrs[k] = it->base[k] + off[k] * it->esize[k];
        st = fn(ctx, dims[r - 1], ptrs, inner);
        if (st != TB_OK) return st;
        for (d = r - 2; d >= 0; d--) {
            idx[d]++;
            for (k = 0; k < nops; k++)
                off[k] += strides[k][d];
            if (idx[d] < dims[d]) break;
            for (k = 0; k < nops; k++)
                off[k] -= strides[k][d] * dims[d];
            idx[d] = 0;
        }
        if (d < 0) break;
    }
    return TB_OK;
}

/* ---- copies ---- */

static tb_status tb__ref_copy_run(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    int64_t es = *(const int64_t *)ctx, i;
    if (s[0] == 1 && s[1] == 1) {
        memcpy(p[0], p[1], (size_t)(n * es));
        return TB_OK;
    }
    /* fixed-size memcpy compiles to one load and store, without breaking aliasing rules */
    switch (es) {
    case 1:
        for (i = 0; i < n; i++)
            p[0][i * s[0]] = p[1][i * s[1]];
        break;
    case 4:
        for (i = 0; i < n; i++)
            memcpy(p[0] + i * s[0] * 4, p[1] + i * s[1] * 4, 4);
        break;
    case 8:
        for (i = 0; i < n; i++)
            memcpy(p[0] + i * s[0] * 8, p[1] + i * s[1] * 8, 8);
        break;
    default:
        for (i = 0; i < n; i++)
            memcpy(p[0] + i * s[0] * es, p[1] + i * s[1] * es, (size_t)es);
        break;
    }
    return TB_OK;
}

typedef struct tb__conv_ctx {
    tb_dtype sd, dd;
} tb__conv_ctx;

#define TB__TOI_FLOAT(x) tb__ref_f2i((double)(x))
#define TB__TOI_INT(x)   ((int64_t)(x))
#define TB__TOI_BOOL(x)  ((int64_t)((x) != 0))
#define TB__TOF_NUM(x)   ((double)(x))
#define TB__TOF_BOOL(x)  ((double)((x) != 0))
#define TB__CONV_LOOP(TD, EXPR)                                                                    \
    do {                                                                                           \
        TD *o_ = (TD *)p[0];                                                                       \
        for (i = 0; i < n; i++)                                                                    \
            o_[i * s[0]] = (TD)(EXPR);                                                             \
    } while (0)
#define TB__CONV_SWITCH(TS, TOI, TOF)                                                              \
    do {                                                                                           \
        const TS *a_ = (const TS *)p[1];                                                           \
        switch (dd) {                                                                              \
        case TB_F32:                                                                               \
            TB__CONV_LOOP(float, TOF(a_[i * s[1]]));                                               \
            break;                                                                                 \
        case TB_F64:                                                                               \
            TB__CONV_LOOP(double, TOF(a_[i * s[1]]));                                              \
            break;                                                                                 \
        case TB_I32:                                                                               \
            TB__CONV_LOOP(int32_t, (uint32_t)(uint64_t)TOI(a_[i * s[1]]));                         \
            break;                                                                                 \
        case TB_I64:                                                                               \
            TB__CONV_LOOP(int64_t, TOI(a_[i * s[1]]));                                             \
            break;                                                                                 \
        case TB_U8:                                                                                \
            TB__CONV_LOOP(uint8_t, (uint64_t)TOI(a_[i * s[1]]));                                   \
            break;                                                                                 \
        case TB_BOOL:                                                                              \
            TB__CONV_LOOP(uint8_t, a_[i * s[1]] != 0);                                             \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

static tb_status tb__ref_conv_run(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    const tb__conv_ctx *c = (const tb__conv_ctx *)ctx;
    tb_dtype dd = c->dd;
    int64_t i;
    if (tb__ref_esize(dd) == 2 || tb__ref_esize(c->sd) == 2) { /* f16, bf16: in software */
        int64_t es0 = tb__ref_esize(dd), es1 = tb__ref_esize(c->sd);
        for (i = 0; i < n; i++)
            tb__ref_convert(dd, p[0] + i * s[0] * es0, c->sd, p[1] + i * s[1] * es1);
        return TB_OK;
    }
    switch (c->sd) {
    case TB_F32:
        TB__CONV_SWITCH(float, TB__TOI_FLOAT, TB__TOF_NUM);
        break;
    case TB_F64:
        TB__CONV_SWITCH(double, TB__TOI_FLOAT, TB__TOF_NUM);
        break;
    case TB_I32:
        TB__CONV_SWITCH(int32_t, TB__TOI_INT, TB__TOF_NUM);
        break;
    case TB_I64:
        TB__CONV_SWITCH(int64_t, TB__TOI_INT, TB__TOF_NUM);
        break;
    case TB_U8:
        TB__CONV_SWITCH(uint8_t, TB__TOI_INT, TB__TOF_NUM);
        break;
    case TB_BOOL:
        TB__CONV_SWITCH(uint8_t, TB__TOI_BOOL, TB__TOF_BOOL);
        break;
    default:
        break;
    }
    return TB_OK;
}

#undef TB__TOI_FLOAT
#undef TB__TOI_INT
#undef TB__TOI_BOOL
#undef TB__TOF_NUM
#undef TB__TOF_BOOL
#undef TB__CONV_LOOP
#undef TB__CONV_SWITCH

/* dst[...] = src[...] (same dims; src may broadcast), converting the dtype if they differ. */
static tb_status tb__ref_copy(const tb__rview *dst, const tb__rview *src) {
    tb__iter it;
    tb_status st;
    tb__iter_begin(&it, dst->shape.rank, dst->shape.dims);
    tb__iter_add(&it, dst->buf->data, dst->offset, dst->strides, tb__ref_esize(dst->shape.dtype));
    st = tb__iter_add_view(&it, src);
    if (st != TB_OK) return st;
    if (src->shape.dtype == dst->shape.dtype) {
        int64_t es = tb__ref_esize(dst->shape.dtype);
        return tb__iter_run(&it, tb__ref_copy_run, &es);
    } else {
        tb__conv_ctx c;
        c.sd = src->shape.dtype;
        c.dd = dst->shape.dtype;
        return tb__iter_run(&it, tb__ref_conv_run, &c);
    }
}

/* A contiguous view with the same value: the view itself (shared) when it already is one. */
static tb_status tb__rview_contig(const tb__rview *src, tb__rview *out) {
    tb_status st;
    if (tb__rview_is_contig(src)) {
        tb__rview_share(out, src);
        tb__ref_contig_strides(&out->shape, out->strides);
        return TB_OK;
    }
    st = tb__rview_alloc(out, &src->shape);
    if (st != TB_OK) return st;
    st = tb__ref_copy(out, src);
    if (st != TB_OK) tb__rview_clear(out);
    return st;
}

/* Copies a view into a caller's contiguous array of its shape. */
static tb_status tb__rview_to_host(const tb__rview *v, void *host) {
    tb__rview dst;
    tb_status st;
    size_t nbytes = 0;
    st = tb__ref_nbytes(&v->shape, &nbytes);
    if (st != TB_OK) return st;
    if (nbytes == 0) return TB_OK;
    if (tb__rview_is_contig(v)) {
        memcpy(host, tb__rview_ptr(v), nbytes);
        return TB_OK;
    }
    st = tb__rview_borrow(&dst, &v->shape, host);
    if (st != TB_OK) return st;
    st = tb__ref_copy(&dst, v);
    tb__rview_clear(&dst);
    return st;
}

/* ---- elementwise ops ---- */

static double tb__ref_sigmoid(double x) {
    /* exp of a negative argument only: no overflow for large |x| */
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    {
        double e = exp(x);
        return e / (1.0 + e);
    }
}

static double tb__ref_maxf(double a, double b) {
    if (a != a) return a;
    if (b != b) return b;
    return a > b ? a : b;
}

static double tb__ref_minf(double a, double b) {
    if (a != a) return a;
    if (b != b) return b;
    return a < b ? a : b;
}

static double tb__ref_unary_f(tb_op op, double x) {
    switch (op) {
#define TB__REF_MATH(ID, name, ints, REF, CODE, CODE_F32, VEC, GRAD)                               \
    case TB_OP_##ID:                                                                               \
        return REF;
        TB__MATH_OPS(TB__REF_MATH)
#undef TB__REF_MATH
    case TB_OP_NEG:
        return -x;
    case TB_OP_ABS:
        return fabs(x);
    case TB_OP_RELU:
        return x < 0 ? 0.0 : x; /* NaN stays NaN */
    case TB_OP_FLOOR:
        return floor(x);
    case TB_OP_CEIL:
        return ceil(x);
    case TB_OP_ROUND:
        return nearbyint(x); /* half to even under the default rounding mode */
    case TB_OP_SIGN:
        return (double)((x > 0) - (x < 0)); /* PyTorch: sign(NaN) = 0 */
    case TB_OP_LOGICAL_NOT:
        return x == 0 ? 1.0 : 0.0;
    default:
        return x;
    }
}

static int64_t tb__ref_unary_i(tb_op op, int64_t x) {
    switch (op) {
    case TB_OP_NEG:
        return (int64_t)(0u - (uint64_t)x); /* wraps as PyTorch's integers do */
    case TB_OP_ABS:
        return x < 0 ? (int64_t)(0u - (uint64_t)x) : x;
    case TB_OP_RELU:
        return x < 0 ? 0 : x;
    case TB_OP_SIGN:
        return (int64_t)((x > 0) - (x < 0));
    case TB_OP_LOGICAL_NOT:
        return x == 0;
    default:
        return x; /* FLOOR CEIL ROUND of integers */
    }
}

/* Ops that are exact on integers; the others compute in double even for integer T. */
static bool tb__ref_unary_has_int(tb_op op) {
    switch (op) {
    case TB_OP_NEG:
    case TB_OP_ABS:
    case TB_OP_RELU:
    case TB_OP_SIGN:
    case TB_OP_FLOOR:
    case TB_OP_CEIL:
    case TB_OP_ROUND:
    case TB_OP_LOGICAL_NOT:
        return true;
    default:
        return false;
    }
}

static double tb__ref_binary_f(tb_op op, double a, double b) {
    switch (op) {
    case TB_OP_ADD:
        return a + b;
    case TB_OP_SUB:
        return a - b;
    case TB_OP_MUL:
        return a * b;
    case TB_OP_DIV:
        return a / b;
    case TB_OP_POW:
        return pow(a, b);
    case TB_OP_MAXIMUM:
        return tb__ref_maxf(a, b);
    case TB_OP_MINIMUM:
        return tb__ref_minf(a, b);
    case TB_OP_EQ:
        return a == b;
    case TB_OP_NE:
        return a != b;
    case TB_OP_LT:
        return a < b;
    case TB_OP_LE:
        return a <= b;
    case TB_OP_GT:
        return a > b;
    case TB_OP_GE:
        return a >= b;
    default:
        return 0.0;
    }
}

static tb_status tb__ref_ipow(int64_t base, int64_t e, int64_t *out) {
    uint64_t r = 1, b = (uint64_t)base;
    if (e < 0)
        return tb__error(TB_ERR_EXECUTE,
                         "tb_pow: integers to negative integer powers are not allowed (%lld ** "
                         "%lld)",
                         (long long)base, (long long)e);
    while (e > 0) {
        if (e & 1) r *= b;
        e >>= 1;
        if (e > 0) b *= b;
    }
    *out = (int64_t)r;
    return TB_OK;
}

static tb_status tb__ref_binary_i(tb_op op, int64_t a, int64_t b, int64_t *out) {
    switch (op) {
    /* unsigned arithmetic: overflow wraps instead of being undefined */
    case TB_OP_ADD:
        *out = (int64_t)((uint64_t)a + (uint64_t)b);
        break;
    case TB_OP_SUB:
        *out = (int64_t)((uint64_t)a - (uint64_t)b);
        break;
    case TB_OP_MUL:
        *out = (int64_t)((uint64_t)a * (uint64_t)b);
        break;
    case TB_OP_DIV:
        if (b == 0)
            return tb__error(TB_ERR_EXECUTE, "tb_div: integer division by zero (%lld / 0)",
                             (long long)a);
        *out = (a == INT64_MIN && b == -1) ? INT64_MIN : a / b;
        break;
    case TB_OP_POW:
        return tb__ref_ipow(a, b, out);
    case TB_OP_MAXIMUM:
        *out = a > b ? a : b;
        break;
    case TB_OP_MINIMUM:
        *out = a < b ? a : b;
        break;
    case TB_OP_EQ:
        *out = a == b;
        break;
    case TB_OP_NE:
        *out = a != b;
        break;
    case TB_OP_LT:
        *out = a < b;
        break;
    case TB_OP_LE:
        *out = a <= b;
        break;
    case TB_OP_GT:
        *out = a > b;
        break;
    case TB_OP_GE:
        *out = a >= b;
        break;
    default:
        *out = 0;
        break;
    }
    return TB_OK;
}

/* How the generic elementwise loop computes one element. */
typedef enum tb__ew_mode {
    TB__EW_CAST,
    TB__EW_NOT,
    TB__EW_UNARY_F,
    TB__EW_UNARY_I,
    TB__EW_BINARY_F,
    TB__EW_BINARY_I,
    TB__EW_LOGIC,
    TB__EW_WHERE,
    TB__EW_CLAMP_F,
    TB__EW_CLAMP_I
} tb__ew_mode;

typedef struct tb__ew_ctx {
    tb_op op;
    tb__ew_mode mode;
    int32_t nops; /* output + operands */
    tb_dtype dt[TB__REF_MAX_OPS];
    int64_t es[TB__REF_MAX_OPS];
} tb__ew_ctx;

static tb_status tb__ref_ew_generic_run(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    const tb__ew_ctx *c = (const tb__ew_ctx *)ctx;
    const char *x[TB__REF_MAX_OPS];
    tb_dtype od = c->dt[0];
    int64_t i;
    int32_t k;
    for (i = 0; i < n; i++) {
        char *o = p[0] + i * s[0] * c->es[0];
        for (k = 1; k < c->nops; k++)
            x[k] = p[k] + i * s[k] * c->es[k];
        switch (c->mode) {
        case TB__EW_CAST:
            tb__ref_convert(od, o, c->dt[1], x[1]);
            break;
        case TB__EW_NOT:
            tb__st_i(od, o, !tb__ld_b(c->dt[1], x[1]));
            break;
        case TB__EW_UNARY_F:
            tb__st_f(od, o, tb__ref_unary_f(c->op, tb__ld_f(c->dt[1], x[1])));
            break;
        case TB__EW_UNARY_I:
            tb__st_i(od, o, tb__ref_unary_i(c->op, tb__ld_i(c->dt[1], x[1])));
            break;
        case TB__EW_BINARY_F:
            tb__st_f(od, o,
                     tb__ref_binary_f(c->op, tb__ld_f(c->dt[1], x[1]), tb__ld_f(c->dt[2], x[2])));
            break;
        case TB__EW_BINARY_I: {
            int64_t r = 0;
            tb_status st =
                tb__ref_binary_i(c->op, tb__ld_i(c->dt[1], x[1]), tb__ld_i(c->dt[2], x[2]), &r);
            if (st != TB_OK) return st;
            tb__st_i(od, o, r);
            break;
        }
        case TB__EW_LOGIC: {
            bool a = tb__ld_b(c->dt[1], x[1]), b = tb__ld_b(c->dt[2], x[2]);
            tb__st_i(od, o, c->op == TB_OP_LOGICAL_AND ? (a && b) : (a || b));
            break;
        }
        case TB__EW_WHERE:
            if (tb__ld_b(c->dt[1], x[1]))
                tb__ref_convert(od, o, c->dt[2], x[2]);
            else
                tb__ref_convert(od, o, c->dt[3], x[3]);
            break;
        case TB__EW_CLAMP_F: {
            double v = tb__ref_maxf(tb__ld_f(c->dt[1], x[1]), tb__ld_f(c->dt[2], x[2]));
            tb__st_f(od, o, tb__ref_minf(v, tb__ld_f(c->dt[3], x[3])));
            break;
        }
        case TB__EW_CLAMP_I: {
            int64_t v = tb__ld_i(c->dt[1], x[1]), lo = tb__ld_i(c->dt[2], x[2]),
                    hi = tb__ld_i(c->dt[3], x[3]);
            v = v < lo ? lo : v;
            tb__st_i(od, o, v > hi ? hi : v);
            break;
        }
        }
    }
    return TB_OK;
}

/* Typed loops for f32 and f64, the dtypes that carry the bulk of the work. Float ops compute in
   double and round once; + - * / are done in T, which rounds the same way. */
#define TB__UN_LOOP(T, EXPR)                                                                       \
    do {                                                                                           \
        T *o_ = (T *)p[0];                                                                         \
        const T *a_ = (const T *)p[1];                                                             \
        if (s[0] == 1 && s[1] == 1) {                                                              \
            for (i = 0; i < n; i++) {                                                              \
                double x = (double)a_[i];                                                          \
                o_[i] = (T)(EXPR);                                                                 \
            }                                                                                      \
        } else {                                                                                   \
            for (i = 0; i < n; i++) {                                                              \
                double x = (double)a_[i * s[1]];                                                   \
                o_[i * s[0]] = (T)(EXPR);                                                          \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* A math op's loop: the row's reference expression inlined (TB__UN_T is the element type) */
#define TB__UN_MATH(ID, name, ints, REF, CODE, CODE_F32, VEC, GRAD)                                \
    case TB_OP_##ID:                                                                               \
        TB__UN_LOOP(TB__UN_T, REF);                                                                \
        break;

#define TB__UN_FUNC(NAME, T)                                                                       \
    static tb_status NAME(void *ctx, int64_t n, char *const *p, const int64_t *s) {                \
        typedef T TB__UN_T;                                                                        \
        int64_t i;                                                                                 \
        switch (((const tb__ew_ctx *)ctx)->op) {                                                   \
            TB__MATH_OPS(TB__UN_MATH)                                                              \
        case TB_OP_NEG:                                                                            \
            TB__UN_LOOP(T, -x);                                                                    \
            break;                                                                                 \
        case TB_OP_ABS:                                                                            \
            TB__UN_LOOP(T, fabs(x));                                                               \
            break;                                                                                 \
        case TB_OP_RELU:                                                                           \
            TB__UN_LOOP(T, x < 0 ? 0.0 : x);                                                       \
            break;                                                                                 \
        case TB_OP_FLOOR:                                                                          \
            TB__UN_LOOP(T, floor(x));                                                              \
            break;                                                                                 \
        case TB_OP_CEIL:                                                                           \
            TB__UN_LOOP(T, ceil(x));                                                               \
            break;                                                                                 \
        default:                                                                                   \
            TB__UN_LOOP(T, tb__ref_unary_f(((const tb__ew_ctx *)ctx)->op, x));                     \
            break;                                                                                 \
        }                                                                                          \
        return TB_OK;                                                                              \
    }

TB__UN_FUNC(tb__ref_unary_f32_run, float)
TB__UN_FUNC(tb__ref_unary_f64_run, double)

/* Binary loops with the common stride patterns spelled out so that they vectorise. */
#define TB__BIN_LOOP(T, TO, EXPR)                                                                  \
    do {                                                                                           \
        TO *o_ = (TO *)p[0];                                                                       \
        const T *a_ = (const T *)p[1];                                                             \
        const T *b_ = (const T *)p[2];                                                             \
        if (s[0] == 1 && s[1] == 1 && s[2] == 1) {                                                 \
            for (i = 0; i < n; i++) {                                                              \
                T a = a_[i], b = b_[i];                                                            \
                o_[i] = (TO)(EXPR);                                                                \
            }                                                                                      \
        } else if (s[0] == 1 && s[1] == 1 && s[2] == 0) {                                          \
            T b = b_[0];                                                                           \
            for (i = 0; i < n; i++) {                                                              \
                T a = a_[i];                                                                       \
                o_[i] = (TO)(EXPR);                                                                \
            }                                                                                      \
        } else if (s[0] == 1 && s[1] == 0 && s[2] == 1) {                                          \
            T a = a_[0];                                                                           \
            for (i = 0; i < n; i++) {                                                              \
                T b = b_[i];                                                                       \
                o_[i] = (TO)(EXPR);                                                                \
            }                                                                                      \
        } else {                                                                                   \
            for (i = 0; i < n; i++) {                                                              \
                T a = a_[i * s[1]], b = b_[i * s[2]];                                              \
                o_[i * s[0]] = (TO)(EXPR);                                                         \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#define TB__BIN_FUNC(NAME, T)                                                                      \
    static tb_status NAME(void *ctx, int64_t n, char *const *p, const int64_t *s) {                \
        int64_t i;                                                                                 \
        switch (((const tb__ew_ctx *)ctx)->op) {                                                   \
        case TB_OP_ADD:                                                                            \
            TB__BIN_LOOP(T, T, a + b);                                                             \
            break;                                                                                 \
        case TB_OP_SUB:                                                                            \
            TB__BIN_LOOP(T, T, a - b);                                                             \
            break;                                                                                 \
        case TB_OP_MUL:                                                                            \
            TB__BIN_LOOP(T, T, a *b);                                                              \
            break;                                                                                 \
        case TB_OP_DIV:                                                                            \
            TB__BIN_LOOP(T, T, a / b);                                                             \
            break;                                                                                 \
        case TB_OP_POW:                                                                            \
            TB__BIN_LOOP(T, T, pow((double)a, (double)b));                                         \
            break;                                                                                 \
        case TB_OP_MAXIMUM:                                                                        \
            TB__BIN_LOOP(T, T, tb__ref_maxf((double)a, (double)b));                                \
            break;                                                                                 \
        case TB_OP_MINIMUM:                                                                        \
            TB__BIN_LOOP(T, T, tb__ref_minf((double)a, (double)b));                                \
            break;                                                                                 \
        case TB_OP_EQ:                                                                             \
            TB__BIN_LOOP(T, uint8_t, a == b);                                                      \
            break;                                                                                 \
        case TB_OP_NE:                                                                             \
            TB__BIN_LOOP(T, uint8_t, a != b);                                                      \
            break;                                                                                 \
        case TB_OP_LT:                                                                             \
            TB__BIN_LOOP(T, uint8_t, a < b);                                                       \
            break;                                                                                 \
        case TB_OP_LE:                                                                             \
            TB__BIN_LOOP(T, uint8_t, a <= b);                                                      \
            break;                                                                                 \
        case TB_OP_GT:                                                                             \
            TB__BIN_LOOP(T, uint8_t, a > b);                                                       \
            break;                                                                                 \
        case TB_OP_GE:                                                                             \
            TB__BIN_LOOP(T, uint8_t, a >= b);                                                      \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
        return TB_OK;                                                                              \
    }

TB__BIN_FUNC(tb__ref_binary_f32_run, float)
TB__BIN_FUNC(tb__ref_binary_f64_run, double)

#undef TB__UN_LOOP
#undef TB__UN_FUNC
#undef TB__UN_MATH
#undef TB__BIN_LOOP
#undef TB__BIN_FUNC

static bool tb__ref_is_compare(tb_op op) {
    return op == TB_OP_EQ || op == TB_OP_NE || op == TB_OP_LT || op == TB_OP_LE || op == TB_OP_GT ||
           op == TB_OP_GE;
}

static tb_status tb__ref_elementwise(const tb_node *node, const tb__rview *in, tb__rview *out) {
    tb__ew_ctx c;
    tb__iter it;
    tb__run_fn fn = tb__ref_ew_generic_run;
    tb__conv_ctx conv;
    void *ctx = &c;
    tb_dtype od = node->shape.dtype;
    int32_t k, nin = (int32_t)node->num_operands;
    tb_status st;
    bool any_float = false;
    memset(&c, 0, sizeof(c));
    c.op = node->op;
    c.nops = nin + 1;
    c.dt[0] = od;
    c.es[0] = tb__ref_esize(od);
    for (k = 0; k < nin; k++) {
        c.dt[k + 1] = in[k].shape.dtype;
        c.es[k + 1] = tb__ref_esize(in[k].shape.dtype);
        any_float = any_float || tb_dtype_is_float(in[k].shape.dtype);
    }
    switch (node->op) {
    case TB_OP_CAST:
        c.mode = TB__EW_CAST;
        conv.sd = c.dt[1];
        conv.dd = od;
        fn = tb__ref_conv_run;
        ctx = &conv;
        break;
    case TB_OP_LOGICAL_NOT:
        c.mode = TB__EW_NOT;
        break;
    case TB_OP_LOGICAL_AND:
    case TB_OP_LOGICAL_OR:
        c.mode = TB__EW_LOGIC;
        break;
    case TB_OP_WHERE:
        c.mode = TB__EW_WHERE;
        break;
    case TB_OP_CLAMP:
        c.mode = tb_dtype_is_float(od) ? TB__EW_CLAMP_F : TB__EW_CLAMP_I;
        break;
    default:
        if (nin == 1) {
            bool as_int = !tb_dtype_is_float(od) && !tb_dtype_is_float(c.dt[1]) &&
                          tb__ref_unary_has_int(node->op);
            c.mode = as_int ? TB__EW_UNARY_I : TB__EW_UNARY_F;
            if (c.dt[1] == od && od == TB_F32) fn = tb__ref_unary_f32_run;
            if (c.dt[1] == od && od == TB_F64) fn = tb__ref_unary_f64_run;
        } else {
            bool cmp = tb__ref_is_compare(node->op);
            bool as_float = cmp ? any_float : tb_dtype_is_float(od);
            tb_dtype want = cmp ? TB_BOOL : c.dt[1];
            c.mode = as_float ? TB__EW_BINARY_F : TB__EW_BINARY_I;
            if (c.dt[1] == c.dt[2] && od == want && c.dt[1] == TB_F32) fn = tb__ref_binary_f32_run;
            if (c.dt[1] == c.dt[2] && od == want && c.dt[1] == TB_F64) fn = tb__ref_binary_f64_run;
        }
        break;
    }
    st = tb__rview_alloc(out, &node->shape);
    if (st != TB_OK) return st;
    tb__iter_begin(&it, node->shape.rank, node->shape.dims);
    tb__iter_add(&it, out->buf->data, 0, out->strides, c.es[0]);
    for (k = 0; k < nin && st == TB_OK; k++)
        st = tb__iter_add_view(&it, &in[k]);
    if (st == TB_OK) st = tb__iter_run(&it, fn, ctx);
    if (st != TB_OK) tb__rview_clear(out);
    return st;
}
