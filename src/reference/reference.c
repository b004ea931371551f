/* ===========================================================================================
   Reference interpreter, the ops beyond the elementwise ones (reductions, matmul, softmax and
   layer_norm, movement, concat, pad, gather and index_select, leaves and generators, custom
   ops) and the driver: one node from host arrays, a whole graph with the buffer pool and
   operands freed after their last use. Buffers, views, the iterator, copies and the
   elementwise ops are reference_elementwise.c's (reference_internal.h).
   =========================================================================================== */

/* ---- reductions ---- */

typedef struct tb__red_ctx {
    tb_op op;
    tb_dtype dt;
    int64_t es;
} tb__red_ctx;

#define TB__RED_BODY(LOAD)                                                                         \
    do {                                                                                           \
        switch (c->op) {                                                                           \
        case TB_OP_PROD:                                                                           \
            if (s[0] == 0) {                                                                       \
                double t = acc[0];                                                                 \
                for (i = 0; i < n; i++)                                                            \
                    t *= (double)(LOAD);                                                           \
                acc[0] = t;                                                                        \
            } else {                                                                               \
                for (i = 0; i < n; i++)                                                            \
                    acc[i * s[0]] *= (double)(LOAD);                                               \
            }                                                                                      \
            break;                                                                                 \
        case TB_OP_MAX:                                                                            \
            for (i = 0; i < n; i++) {                                                              \
                double v = (double)(LOAD), t = acc[i * s[0]];                                      \
                if (v > t || v != v) acc[i * s[0]] = v;                                            \
            }                                                                                      \
            break;                                                                                 \
        case TB_OP_MIN:                                                                            \
            for (i = 0; i < n; i++) {                                                              \
                double v = (double)(LOAD), t = acc[i * s[0]];                                      \
                if (v < t || v != v) acc[i * s[0]] = v;                                            \
            }                                                                                      \
            break;                                                                                 \
        default: /* SUM MEAN */                                                                    \
            if (s[0] == 0) {                                                                       \
                double t = acc[0];                                                                 \
                for (i = 0; i < n; i++)                                                            \
                    t += (double)(LOAD);                                                           \
                acc[0] = t;                                                                        \
            } else {                                                                               \
                for (i = 0; i < n; i++)                                                            \
                    acc[i * s[0]] += (double)(LOAD);                                               \
            }                                                                                      \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

/* Float reductions accumulate in double: a sum of millions of f32 stays accurate. */
static tb_status tb__ref_reduce_f_run(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    const tb__red_ctx *c = (const tb__red_ctx *)ctx;
    double *acc = (double *)p[0];
    int64_t i;
    if (c->dt == TB_F32) {
        const float *x = (const float *)p[1];
        TB__RED_BODY(x[i * s[1]]);
    } else if (c->dt == TB_F64) {
        const double *x = (const double *)p[1];
        TB__RED_BODY(x[i * s[1]]);
    } else {
        TB__RED_BODY(tb__ld_f(c->dt, p[1] + i * s[1] * c->es));
    }
    return TB_OK;
}

#undef TB__RED_BODY

/* Integer reductions accumulate in int64 with wrapping arithmetic. */
static tb_status tb__ref_reduce_i_run(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    const tb__red_ctx *c = (const tb__red_ctx *)ctx;
    int64_t *acc = (int64_t *)p[0];
    int64_t i;
    for (i = 0; i < n; i++) {
        int64_t v = tb__ld_i(c->dt, p[1] + i * s[1] * c->es);
        int64_t *a = &acc[i * s[0]];
        switch (c->op) {
        case TB_OP_PROD:
            *a = (int64_t)((uint64_t)*a * (uint64_t)v);
            break;
        case TB_OP_MAX:
            *a = v > *a ? v : *a;
            break;
        case TB_OP_MIN:
            *a = v < *a ? v : *a;
            break;
        default:
            *a = (int64_t)((uint64_t)*a + (uint64_t)v);
            break;
        }
    }
    return TB_OK;
}

static bool tb__ref_mask_has(int64_t mask, int32_t axis) {
    return (((uint64_t)mask >> axis) & 1u) != 0;
}

static tb_status tb__ref_reduce(const tb_node *node, const tb__rview *x, tb__rview *out) {
    int64_t mask = node->num_attrs > 0 ? node->attrs[0] : 0;
    const tb_shape *xs = &x->shape;
    int64_t ast[TB_MAX_RANK], kept = 1, count = 1, onumel, i;
    int32_t d;
    bool facc = tb_dtype_is_float(xs->dtype) || tb_dtype_is_float(node->shape.dtype);
    char *acc;
    tb__iter it;
    tb__red_ctx c;
    tb_status st;
    /* accumulator strides over x's axes: kept axes contiguous, reduced axes 0 */
    for (d = xs->rank - 1; d >= 0; d--) {
        if (tb__ref_mask_has(mask, d)) {
            ast[d] = 0;
            count *= xs->dims[d];
        } else {
            ast[d] = kept;
            kept *= xs->dims[d];
        }
    }
    onumel = tb__ref_numel(&node->shape);
    if (onumel != kept || ((uint64_t)mask >> xs->rank) != 0)
        return tb__error(TB_ERR_INTERNAL, "reference: %s node with a malformed axes mask",
                         tb_op_name(node->op));
    if ((uint64_t)onumel > SIZE_MAX / 8u)
        return tb__error(TB_ERR_OVERFLOW, "reference: %s accumulator too large",
                         tb_op_name(node->op));
    acc = (char *)tb__alloc((size_t)(onumel ? onumel : 1) * 8u);
    if (!acc) return TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < onumel; i++) {
        if (facc) {
            double v = 0.0;
            if (node->op == TB_OP_PROD) v = 1.0;
            if (node->op == TB_OP_MAX) v = -HUGE_VAL;
            if (node->op == TB_OP_MIN) v = HUGE_VAL;
            ((double *)acc)[i] = v;
        } else {
            int64_t v = 0;
            if (node->op == TB_OP_PROD) v = 1;
            if (node->op == TB_OP_MAX) v = INT64_MIN;
            if (node->op == TB_OP_MIN) v = INT64_MAX;
            ((int64_t *)acc)[i] = v;
        }
    }
    c.op = node->op;
    c.dt = xs->dtype;
    c.es = tb__ref_esize(xs->dtype);
    tb__iter_begin(&it, xs->rank, xs->dims);
    tb__iter_add(&it, acc, 0, ast, 8);
    tb__iter_add(&it, x->buf->data, x->offset, x->strides, c.es);
    st = tb__iter_run(&it, facc ? tb__ref_reduce_f_run : tb__ref_reduce_i_run, &c);
    if (st == TB_OK) st = tb__rview_alloc(out, &node->shape);
    if (st == TB_OK) {
        tb_dtype od = node->shape.dtype;
        int64_t oes = tb__ref_esize(od);
        char *o = out->buf->data;
        for (i = 0; i < onumel; i++) {
            if (!facc) {
                tb__st_i(od, o + i * oes, ((int64_t *)acc)[i]);
            } else if (node->op == TB_OP_MEAN) {
                double sum = ((double *)acc)[i];
                tb__st_f(od, o + i * oes, count > 0 ? sum / (double)count : NAN);
            } else {
                tb__st_f(od, o + i * oes, ((double *)acc)[i]);
            }
        }
    }
    tb__free(acc);
    return st;
}

/* ARGMAX/ARGMIN: the first extreme element along one axis; NaN counts as the extreme. */
static tb_status tb__ref_argminmax(const tb_node *node, const tb__rview *x, tb__rview *out) {
    const tb_shape *xs = &x->shape;
    int32_t axis = node->num_attrs > 0 ? (int32_t)node->attrs[0] : 0;
    int64_t len, stride, onumel, o;
    int64_t idx[TB_MAX_RANK];
    int64_t off;
    int64_t es = tb__ref_esize(xs->dtype);
    int32_t d;
    bool is_max = node->op == TB_OP_ARGMAX, as_float = tb_dtype_is_float(xs->dtype);
    tb_status st;
    if (xs->rank < 1 || axis < 0 || axis >= xs->rank || xs->dims[axis] < 1)
        return tb__error(TB_ERR_INTERNAL, "reference: %s node with a malformed axis",
                         tb_op_name(node->op));
    len = xs->dims[axis];
    stride = x->strides[axis];
    st = tb__rview_alloc(out, &node->shape);
    if (st != TB_OK) return st;
    onumel = tb__ref_numel(&node->shape);
    memset(idx, 0, sizeof(idx));
    off = x->offset;
    for (o = 0; o < onumel; o++) {
        const char *p = x->buf->data + off * es;
        int64_t best = 0, k;
        if (as_float) {
            double bv = tb__ld_f(xs->dtype, p);
            for (k = 1; k < len && bv == bv; k++) {
                double v = tb__ld_f(xs->dtype, p + k * stride * es);
                if (v != v || (is_max ? v > bv : v < bv)) {
                    bv = v;
                    best = k;
                }
            }
        } else {
            int64_t bv = tb__ld_i(xs->dtype, p);
            for (k = 1; k < len; k++) {
                int64_t v = tb__ld_i(xs->dtype, p + k * stride * es);
                if (is_max ? v > bv : v < bv) {
                    bv = v;
                    best = k;
                }
            }
        }
        tb__st_i(node->shape.dtype, out->buf->data + o * tb__ref_esize(node->shape.dtype), best);
        /* next position over the other axes, row-major */
        for (d = xs->rank - 1; d >= 0; d--) {
            if (d == axis) continue;
            idx[d]++;
            off += x->strides[d];
            if (idx[d] < xs->dims[d]) break;
            off -= x->strides[d] * xs->dims[d];
            idx[d] = 0;
        }
    }
    return TB_OK;
}

/* ---- matmul ---- */

#define TB__MM_KC 256 /* depth of a block: a 4-column panel of b (8 KiB) stays in L1 */
#define TB__MM_MC 128 /* rows of a block: the packed block of a (256 KiB) stays in L2 */

/* Packs the [rows, cols] matrix at element `off` of `v` (strides rs, cs) into a double or int64
   array, row-major. */
static void tb__ref_mm_pack(const tb__rview *v, int64_t off, int64_t rows, int64_t cols, int64_t rs,
                            int64_t cs, bool as_float, void *dst) {
    tb_dtype dt = v->shape.dtype;
    int64_t es = tb__ref_esize(dt), r, k;
    const char *base = v->buf->data;
    if (as_float && dt == TB_F32) {
        const float *a = (const float *)base + off;
        double *o = (double *)dst;
        for (r = 0; r < rows; r++)
            for (k = 0; k < cols; k++)
                o[r * cols + k] = (double)a[r * rs + k * cs];
    } else if (as_float) {
        double *o = (double *)dst;
        for (r = 0; r < rows; r++)
            for (k = 0; k < cols; k++)
                o[r * cols + k] = tb__ld_f(dt, base + (off + r * rs + k * cs) * es);
    } else {
        int64_t *o = (int64_t *)dst;
        for (r = 0; r < rows; r++)
            for (k = 0; k < cols; k++)
                o[r * cols + k] = tb__ld_i(dt, base + (off + r * rs + k * cs) * es);
    }
}

/* c[4,4] += ap[kc,4]^T bp[kc,4] (both panels k-major); the 16 sums stay in registers. Only
   rows x cols of the tile are real (the panels are zero-padded). */
static void tb__ref_mm_tile(const double *ap, const double *bp, int64_t kc, double *c, int64_t ldc,
                            int64_t rows, int64_t cols) {
    double c00 = 0, c01 = 0, c02 = 0, c03 = 0, c10 = 0, c11 = 0, c12 = 0, c13 = 0;
    double c20 = 0, c21 = 0, c22 = 0, c23 = 0, c30 = 0, c31 = 0, c32 = 0, c33 = 0;
    double t[16];
    int64_t k, r, j;
    for (k = 0; k < kc; k++) {
        const double *av = ap + 4 * k, *bv = bp + 4 * k;
        double a0 = av[0], a1 = av[1], a2 = av[2], a3 = av[3];
        double b0 = bv[0], b1 = bv[1], b2 = bv[2], b3 = bv[3];
        c00 += a0 * b0;
        c01 += a0 * b1;
        c02 += a0 * b2;
        c03 += a0 * b3;
        c10 += a1 * b0;
        c11 += a1 * b1;
        c12 += a1 * b2;
        c13 += a1 * b3;
        c20 += a2 * b0;
        c21 += a2 * b1;
        c22 += a2 * b2;
        c23 += a2 * b3;
        c30 += a3 * b0;
        c31 += a3 * b1;
        c32 += a3 * b2;
        c33 += a3 * b3;
    }
    t[0] = c00, t[1] = c01, t[2] = c02, t[3] = c03;
    t[4] = c10, t[5] = c11, t[6] = c12, t[7] = c13;
    t[8] = c20, t[9] = c21, t[10] = c22, t[11] = c23;
    t[12] = c30, t[13] = c31, t[14] = c32, t[15] = c33;
    for (r = 0; r < rows; r++)
        for (j = 0; j < cols; j++)
            c[r * ldc + j] += t[r * 4 + j];
}

/* c[M,N] = a[M,K] b[K,N] in double (a and b packed row-major), blocked for the caches as
   GotoBLAS does: a K block of b in 4-column panels, an M block of a in 4-row panels, 4x4 tiles.
   `work` holds TB__MM_KC * (N + 3) + TB__MM_MC * TB__MM_KC + M * N doubles. */
static void tb__ref_mm_f(const double *a, const double *b, double *work, int64_t M, int64_t K,
                         int64_t N, tb_dtype od, char *out) {
    int64_t npan = (N + 3) / 4, kb, ib, ip, jp, k, r, j;
    double *bpan = work, *apan = bpan + TB__MM_KC * npan * 4, *c = apan + TB__MM_MC * TB__MM_KC;
    int64_t oes = tb__ref_esize(od);
    for (j = 0; j < M * N; j++)
        c[j] = 0.0;
    for (kb = 0; kb < K; kb += TB__MM_KC) {
        int64_t kc = K - kb < TB__MM_KC ? K - kb : TB__MM_KC;
        for (jp = 0; jp < npan; jp++)
            for (k = 0; k < kc; k++)
                for (j = 0; j < 4; j++)
                    bpan[(jp * kc + k) * 4 + j] =
                        jp * 4 + j < N ? b[(kb + k) * N + jp * 4 + j] : 0.0;
        for (ib = 0; ib < M; ib += TB__MM_MC) {
            int64_t mc = M - ib < TB__MM_MC ? M - ib : TB__MM_MC, mpan = (mc + 3) / 4;
            for (ip = 0; ip < mpan; ip++)
                for (k = 0; k < kc; k++)
                    for (r = 0; r < 4; r++)
                        apan[(ip * kc + k) * 4 + r] =
                            ip * 4 + r < mc ? a[(ib + ip * 4 + r) * K + kb + k] : 0.0;
            for (jp = 0; jp < npan; jp++)
                for (ip = 0; ip < mpan; ip++) {
                    int64_t rows = mc - ip * 4 < 4 ? mc - ip * 4 : 4;
                    int64_t cols = N - jp * 4 < 4 ? N - jp * 4 : 4;
                    tb__ref_mm_tile(apan + ip * kc * 4, bpan + jp * kc * 4, kc,
                                    c + (ib + ip * 4) * N + jp * 4, N, rows, cols);
                }
        }
    }
    if (od == TB_F32) {
        float *o = (float *)out;
        for (j = 0; j < M * N; j++)
            o[j] = (float)c[j];
    } else if (od == TB_F64) {
        memcpy(out, c, (size_t)(M * N) * sizeof(double));
    } else {
        for (j = 0; j < M * N; j++)
            tb__st_f(od, out + j * oes, c[j]);
    }
}

static void tb__ref_mm_i(const int64_t *a, const int64_t *b, int64_t M, int64_t K, int64_t N,
                         tb_dtype od, char *out) {
    int64_t i, k, j, oes = tb__ref_esize(od);
    for (i = 0; i < M; i++) {
        char *orow = out + i * N * oes;
        for (j = 0; j < N; j++)
            tb__st_i(od, orow + j * oes, 0);
        if (od == TB_I64) {
            int64_t *o = (int64_t *)orow;
            for (k = 0; k < K; k++) {
                uint64_t av = (uint64_t)a[i * K + k];
                const int64_t *brow = b + k * N;
                for (j = 0; j < N; j++)
                    o[j] = (int64_t)((uint64_t)o[j] + av * (uint64_t)brow[j]);
            }
        } else {
            for (j = 0; j < N; j++) {
                uint64_t t = 0;
                for (k = 0; k < K; k++)
                    t += (uint64_t)a[i * K + k] * (uint64_t)b[k * N + j];
                tb__st_i(od, orow + j * oes, (int64_t)t);
            }
        }
    }
}

static tb_status tb__ref_matmul(const tb_node *node, const tb__rview *a, const tb__rview *b,
                                tb__rview *out) {
    const tb_shape *os = &node->shape;
    int32_t r = os->rank, d;
    int64_t M, K, N, batch = 1, bi, aoff, boff, last_aoff = -1, last_boff = -1;
    int64_t idx[TB_MAX_RANK];
    bool as_float = tb_dtype_is_float(os->dtype);
    void *pa = NULL, *pb = NULL;
    double *work = NULL;
    int64_t oes = tb__ref_esize(os->dtype);
    tb_status st = TB_OK;
    if (r < 2 || a->shape.rank != r || b->shape.rank != r)
        return tb__ref_malformed(node, &a->shape);
    M = os->dims[r - 2];
    N = os->dims[r - 1];
    K = a->shape.dims[r - 1];
    if (a->shape.dims[r - 2] != M || b->shape.dims[r - 2] != K || b->shape.dims[r - 1] != N)
        return tb__ref_malformed(node, &a->shape);
    for (d = 0; d < r - 2; d++) {
        if ((a->shape.dims[d] != os->dims[d] && a->shape.dims[d] != 1) ||
            (b->shape.dims[d] != os->dims[d] && b->shape.dims[d] != 1))
            return tb__ref_malformed(node, &a->shape);
        batch *= os->dims[d];
    }
    st = tb__rview_alloc(out, os);
    if (st != TB_OK) return st;
    if (batch == 0 || M == 0 || N == 0) return TB_OK;
    /* M*K and K*N are element counts of the operands, so they fit; 8 bytes each might not */
    if ((uint64_t)(M * K) > SIZE_MAX / 8u - 1u || (uint64_t)(K * N) > SIZE_MAX / 8u - 1u) {
        st = tb__error(TB_ERR_OVERFLOW, "reference: matmul operands too large to pack");
        goto done;
    }
    /* the output's element count fits, and N + 3 panels of TB__MM_KC doubles are small */
    if ((uint64_t)(M * N) >
        SIZE_MAX / 8u - (uint64_t)(TB__MM_KC * (N + 3) + TB__MM_MC * TB__MM_KC)) {
        st = tb__error(TB_ERR_OVERFLOW, "reference: matmul result too large");
        goto done;
    }
    pa = tb__alloc((size_t)(M * K + 1) * 8u);
    pb = tb__alloc((size_t)(K * N + 1) * 8u);
    if (as_float)
        work = (double *)tb__alloc((size_t)(TB__MM_KC * (N + 3) + TB__MM_MC * TB__MM_KC + M * N) *
                                   sizeof(double));
    if (!pa || !pb || (as_float && !work)) {
        st = TB_ERR_OUT_OF_MEMORY;
        goto done;
    }
    memset(idx, 0, sizeof(idx));
    aoff = a->offset;
    boff = b->offset;
    for (bi = 0; bi < batch; bi++) {
        char *o = out->buf->data + bi * M * N * oes;
        /* operands broadcast over the batch (stride 0) are packed once */
        if (aoff != last_aoff)
            tb__ref_mm_pack(a, aoff, M, K, a->strides[r - 2], a->strides[r - 1], as_float, pa);
        if (boff != last_boff)
            tb__ref_mm_pack(b, boff, K, N, b->strides[r - 2], b->strides[r - 1], as_float, pb);
        last_aoff = aoff;
        last_boff = boff;
        if (as_float)
            tb__ref_mm_f((const double *)pa, (const double *)pb, work, M, K, N, os->dtype, o);
        else
            tb__ref_mm_i((const int64_t *)pa, (const int64_t *)pb, M, K, N, os->dtype, o);
        for (d = r - 3; d >= 0; d--) {
            int64_t as_ = a->shape.dims[d] == 1 ? 0 : a->strides[d];
            int64_t bs_ = b->shape.dims[d] == 1 ? 0 : b->strides[d];
            idx[d]++;
            aoff += as_;
            boff += bs_;
            if (idx[d] < os->dims[d]) break;
            aoff -= as_ * os->dims[d];
            boff -= bs_ * os->dims[d];
            idx[d] = 0;
        }
    }
done:
    tb__free(pa);
    tb__free(pb);
    tb__free(work);
    if (st != TB_OK) tb__rview_clear(out);
    return st;
}

#undef TB__MM_KC
#undef TB__MM_MC

/* ---- softmax, log_softmax, layer_norm ---- */

/* Reads n elements (stride in elements) into doubles. */
static void tb__ref_load_row(tb_dtype dt, const char *p, int64_t stride, int64_t n, double *dst) {
    int64_t i, es = tb__ref_esize(dt);
    if (dt == TB_F32) {
        const float *a = (const float *)p;
        for (i = 0; i < n; i++)
            dst[i] = (double)a[i * stride];
    } else if (dt == TB_F64) {
        const double *a = (const double *)p;
        for (i = 0; i < n; i++)
            dst[i] = a[i * stride];
    } else {
        for (i = 0; i < n; i++)
            dst[i] = tb__ld_f(dt, p + i * stride * es);
    }
}

static void tb__ref_store_row(tb_dtype dt, char *p, int64_t stride, int64_t n, const double *src) {
    int64_t i, es = tb__ref_esize(dt);
    if (dt == TB_F32) {
        float *a = (float *)p;
        for (i = 0; i < n; i++)
            a[i * stride] = (float)src[i];
    } else if (dt == TB_F64) {
        double *a = (double *)p;
        for (i = 0; i < n; i++)
            a[i * stride] = src[i];
    } else {
        for (i = 0; i < n; i++)
            tb__st_f(dt, p + i * stride * es, src[i]);
    }
}

static tb_status tb__ref_alloc_row(int64_t n, double **row) {
    if ((uint64_t)n > SIZE_MAX / sizeof(double) - 1u)
        return tb__error(TB_ERR_OVERFLOW, "reference: a row of %lld elements is too large",
                         (long long)n);
    *row = (double *)tb__alloc((size_t)(n + 1) * sizeof(double));
    return *row ? TB_OK : TB_ERR_OUT_OF_MEMORY;
}

static tb_status tb__ref_softmax(const tb_node *node, const tb__rview *x, tb__rview *out) {
    int32_t axis = node->num_attrs > 0 ? (int32_t)node->attrs[0] : 0, d;
    const tb_shape *xs = &x->shape;
    int64_t outer = 1, len, inner = 1, o, in, l, es = tb__ref_esize(xs->dtype);
    bool log_form = node->op == TB_OP_LOG_SOFTMAX;
    tb__rview xc;
    double *row = NULL;
    tb_status st;
    if (xs->rank < 1 || axis < 0 || axis >= xs->rank)
        return tb__error(TB_ERR_INTERNAL, "reference: %s node with a malformed axis",
                         tb_op_name(node->op));
    for (d = 0; d < axis; d++)
        outer *= xs->dims[d];
    for (d = axis + 1; d < xs->rank; d++)
        inner *= xs->dims[d];
    len = xs->dims[axis];
    st = tb__rview_contig(x, &xc);
    if (st != TB_OK) return st;
    st = tb__ref_alloc_row(len, &row);
    if (st == TB_OK) st = tb__rview_alloc(out, &node->shape);
    if (st == TB_OK) {
        const char *src = tb__rview_ptr(&xc);
        char *dst = out->buf->data;
        tb_dtype od = node->shape.dtype;
        int64_t oes = tb__ref_esize(od);
        for (o = 0; o < outer; o++) {
            for (in = 0; in < inner; in++) {
                int64_t base = o * len * inner + in;
                double m = -HUGE_VAL, sum = 0.0;
                tb__ref_load_row(xs->dtype, src + base * es, inner, len, row);
                /* subtracting the max keeps exp in range; NaN propagates, and a row of -inf
                   gives NaN (-inf - -inf) as PyTorch */
                for (l = 0; l < len; l++)
                    m = tb__ref_maxf(m, row[l]);
                for (l = 0; l < len; l++)
                    sum += exp(row[l] - m);
                if (log_form) {
                    double lse = log(sum);
                    for (l = 0; l < len; l++)
                        row[l] = row[l] - m - lse;
                } else {
                    for (l = 0; l < len; l++)
                        row[l] = exp(row[l] - m) / sum;
                }
                tb__ref_store_row(od, dst + base * oes, inner, len, row);
            }
        }
    }
    tb__free(row);
    tb__rview_clear(&xc);
    return st;
}

static tb_status tb__ref_layer_norm(const tb_node *node, const tb__rview *in, tb__rview *out) {
    int32_t nd = node->num_attrs > 0 ? (int32_t)node->attrs[0] : 1, d;
    bool has_w = node->num_attrs > 1 && node->attrs[1] != 0;
    bool has_b = node->num_attrs > 2 && node->attrs[2] != 0;
    double eps = node->fattrs[0];
    const tb_shape *xs = &in[0].shape;
    int64_t len = 1, rows = 1, r, l;
    tb__rview xc, wc, bc;
    double *row = NULL, *w = NULL, *b = NULL;
    tb_status st = TB_OK;
    uint32_t need = 1u + (has_w ? 1u : 0u) + (has_b ? 1u : 0u);
    memset(&xc, 0, sizeof(xc));
    memset(&wc, 0, sizeof(wc));
    memset(&bc, 0, sizeof(bc));
    if (nd < 1 || nd > xs->rank || node->num_operands != need)
        return tb__error(TB_ERR_INTERNAL, "reference: malformed layer_norm node");
    for (d = 0; d < xs->rank; d++) {
        if (d < xs->rank - nd)
            rows *= xs->dims[d];
        else
            len *= xs->dims[d];
    }
    st = tb__rview_contig(&in[0], &xc);
    if (st == TB_OK && has_w) st = tb__rview_contig(&in[1], &wc);
    if (st == TB_OK && has_b) st = tb__rview_contig(&in[has_w ? 2 : 1], &bc);
    if (st == TB_OK) st = tb__ref_alloc_row(len, &row);
    if (st == TB_OK && has_w) st = tb__ref_alloc_row(len, &w);
    if (st == TB_OK && has_b) st = tb__ref_alloc_row(len, &b);
    if (st == TB_OK &&
        ((has_w && tb__ref_numel(&wc.shape) != len) || (has_b && tb__ref_numel(&bc.shape) != len)))
        st = tb__error(TB_ERR_INTERNAL, "reference: layer_norm weight or bias of the wrong size");
    if (st == TB_OK) st = tb__rview_alloc(out, &node->shape);
    if (st == TB_OK) {
        const char *src = tb__rview_ptr(&xc);
        int64_t es = tb__ref_esize(xs->dtype), oes = tb__ref_esize(node->shape.dtype);
        if (has_w) tb__ref_load_row(wc.shape.dtype, tb__rview_ptr(&wc), 1, len, w);
        if (has_b) tb__ref_load_row(bc.shape.dtype, tb__rview_ptr(&bc), 1, len, b);
        for (r = 0; r < rows; r++) {
            double mean = 0.0, var = 0.0, rstd;
            tb__ref_load_row(xs->dtype, src + r * len * es, 1, len, row);
            /* two passes: the variance of large values with a small spread stays exact */
            for (l = 0; l < len; l++)
                mean += row[l];
            mean /= (double)len;
            for (l = 0; l < len; l++)
                var += (row[l] - mean) * (row[l] - mean);
            var /= (double)len;
            rstd = 1.0 / sqrt(var + eps);
            for (l = 0; l < len; l++) {
                double y = (row[l] - mean) * rstd;
                if (has_w) y *= w[l];
                if (has_b) y += b[l];
                row[l] = y;
            }
            tb__ref_store_row(node->shape.dtype, out->buf->data + r * len * oes, 1, len, row);
        }
    }
    tb__free(row);
    tb__free(w);
    tb__free(b);
    tb__rview_clear(&xc);
    tb__rview_clear(&wc);
    tb__rview_clear(&bc);
    return st;
}

/* ---- movement ops: views, no copies ---- */

/* Strides that let a view of dims/strides be read with new dims without copying, as NumPy's
   attempt_nocopy_reshape; false when the memory layout does not allow it. */
static bool tb__ref_reshape_strides(const tb__rview *v, const tb_shape *ns, int64_t *nstrides) {
    int64_t od[TB_MAX_RANK], ost[TB_MAX_RANK];
    int32_t oldnd = 0, newnd = ns->rank, d;
    int32_t oi = 0, oj = 1, ni = 0, nj = 1, ok, nk;
    for (d = 0; d < v->shape.rank; d++) {
        if (v->shape.dims[d] != 1) {
            od[oldnd] = v->shape.dims[d];
            ost[oldnd] = v->strides[d];
            oldnd++;
        }
    }
    while (ni < newnd && oi < oldnd) {
        int64_t np = ns->dims[ni], op = od[oi];
        while (np != op) {
            if (np < op) {
                if (nj >= newnd) return false;
                np *= ns->dims[nj++];
            } else {
                if (oj >= oldnd) return false;
                op *= od[oj++];
            }
        }
        for (ok = oi; ok < oj - 1; ok++)
            if (ost[ok] != od[ok + 1] * ost[ok + 1]) return false;
        nstrides[nj - 1] = ost[oj - 1];
        for (nk = nj - 1; nk > ni; nk--)
            nstrides[nk - 1] = nstrides[nk] * ns->dims[nk];
        ni = nj++;
        oi = oj++;
    }
    /* trailing axes of size 1: any stride will do */
    for (nk = ni; nk < newnd; nk++)
        nstrides[nk] = 1;
    return true;
}

/* WINDOW as a strided view: the output axis of window positions steps by stride, the kernel
   axis by dilation, both along the same input axis. */
static tb_status tb__ref_window(const tb_node *node, const tb__rview *x, tb__rview *out) {
    const tb_shape *xs = &x->shape, *os = &node->shape;
    int64_t n = node->num_attrs > 0 ? node->attrs[0] : 0;
    int32_t lead, i, d;
    bool diag = n >= 1 && n <= 3 && node->num_attrs == 2 + 4 * (size_t)n &&
                node->attrs[node->num_attrs - 1] == 1;
    if (n < 1 || n > 3 || (node->num_attrs != 1 + 4 * (size_t)n && !diag) ||
        (diag ? 2 * n : n) > xs->rank || os->rank != xs->rank + (diag ? 0 : n))
        return tb__ref_malformed(node, xs);
    lead = xs->rank - (int32_t)(diag ? 2 * n : n);
    for (d = 0; d < lead; d++)
        if (os->dims[d] != xs->dims[d]) return tb__ref_malformed(node, xs);
    tb__rview_share(out, x);
    out->shape = *os;
    for (i = 0; i < (int32_t)n; i++) {
        const int64_t *a = &node->attrs[1 + 4 * i];
        int64_t span, last, st = x->strides[lead + i], kst = 0, ka = lead + n + i;
        bool ok = a[0] >= 1 && a[1] >= 1 && a[2] >= 1 && a[3] >= 1 && os->dims[lead + i] == a[0] &&
                  os->dims[ka] == a[1] && tb__muladd_i64(a[1] - 1, a[3], 0, &span) &&
                  tb__muladd_i64(a[0] - 1, a[2], span, &last) && last < xs->dims[lead + i] &&
                  (!diag || xs->dims[ka] == a[1]);
        /* inside the operand, so the strides only grow where an axis has two or more elements */
        out->strides[lead + i] = st;
        out->strides[ka] = st;
        if (ok && a[0] > 1) ok = tb__mul_i64(st, a[2], &out->strides[lead + i]);
        if (ok && a[1] > 1) ok = tb__mul_i64(st, a[3], &out->strides[ka]);
        /* the diagonal form also steps along x's own kernel axis */
        if (ok && diag) {
            kst = x->strides[ka];
            ok = a[1] <= 1 || tb__add_i64(out->strides[ka], kst, &out->strides[ka]);
        }
        if (!ok) {
            tb__rview_clear(out);
            return tb__ref_malformed(node, xs);
        }
    }
    return TB_OK;
}

static tb_status tb__ref_movement(const tb_node *node, const tb__rview *x, tb__rview *out) {
    const tb_shape *xs = &x->shape, *os = &node->shape;
    int32_t d;
    tb_status st;
    if (os->dtype != xs->dtype) return tb__ref_malformed(node, xs);
    switch (node->op) {
    case TB_OP_RESHAPE: {
        int64_t ns[TB_MAX_RANK];
        if (tb__ref_numel(xs) != tb__ref_numel(os)) return tb__ref_malformed(node, xs);
        if (tb__ref_reshape_strides(x, os, ns)) {
            tb__rview_share(out, x);
            out->shape = *os;
            memcpy(out->strides, ns, sizeof(ns));
            return TB_OK;
        }
        st = tb__rview_contig(x, out);
        if (st != TB_OK) return st;
        out->shape = *os;
        tb__ref_contig_strides(os, out->strides);
        return TB_OK;
    }
    case TB_OP_PERMUTE: {
        uint32_t seen = 0;
        if (os->rank != xs->rank || (int64_t)node->num_attrs != os->rank)
            return tb__ref_malformed(node, xs);
        tb__rview_share(out, x);
        out->shape = *os;
        for (d = 0; d < os->rank; d++) {
            int64_t p = node->attrs[d];
            if (p < 0 || p >= xs->rank || ((seen >> p) & 1u) || xs->dims[p] != os->dims[d]) {
                tb__rview_clear(out);
                return tb__ref_malformed(node, xs);
            }
            seen |= 1u << p;
            out->strides[d] = x->strides[p];
        }
        return TB_OK;
    }
    case TB_OP_EXPAND: {
        int32_t shift = os->rank - xs->rank;
        if (shift < 0) return tb__ref_malformed(node, xs);
        for (d = 0; d < os->rank; d++) {
            int32_t j = d - shift;
            if (j >= 0 && xs->dims[j] != os->dims[d] && xs->dims[j] != 1)
                return tb__ref_malformed(node, xs);
        }
        tb__rview_share(out, x);
        out->shape = *os;
        for (d = 0; d < os->rank; d++) {
            int32_t j = d - shift;
            out->strides[d] = (j < 0 || xs->dims[j] != os->dims[d]) ? 0 : x->strides[j];
        }
        return TB_OK;
    }
    case TB_OP_SLICE: {
        int64_t dim, start, step, last;
        if (node->num_attrs < 4 || os->rank != xs->rank) return tb__ref_malformed(node, xs);
        dim = node->attrs[0];
        start = node->attrs[1];
        step = node->attrs[3];
        if (dim < 0 || dim >= xs->rank || start < 0 || step < 1) return tb__ref_malformed(node, xs);
        for (d = 0; d < os->rank; d++)
            if (d != dim && os->dims[d] != xs->dims[d]) return tb__ref_malformed(node, xs);
        if (start > xs->dims[dim]) return tb__ref_malformed(node, xs);
        /* the last element read must exist (the output is not empty here) */
        if (os->dims[dim] > 0 &&
            (!tb__muladd_i64(os->dims[dim] - 1, step, start, &last) || last >= xs->dims[dim]))
            return tb__ref_malformed(node, xs);
        tb__rview_share(out, x);
        out->shape = *os;
        /* Inside the operand: both fit. A step only scales the stride where the output has two
           or more elements along dim (then step < dims[dim]); a step as large as 2^62 over one
           element leaves the stride alone. */
        if (os->dims[dim] > 0) out->offset += start * x->strides[dim];
        if (os->dims[dim] > 1 && !tb__mul_i64(x->strides[dim], step, &out->strides[dim])) {
            tb__rview_clear(out);
            return tb__ref_malformed(node, xs);
        }
        return TB_OK;
    }
    case TB_OP_WINDOW:
        return tb__ref_window(node, x, out);
    case TB_OP_FLIP: {
        int64_t mask = node->num_attrs > 0 ? node->attrs[0] : 0;
        if (!tb_shape_equal(xs, os) || ((uint64_t)mask >> xs->rank) != 0)
            return tb__ref_malformed(node, xs);
        tb__rview_share(out, x);
        for (d = 0; d < xs->rank; d++) {
            if (tb__ref_mask_has(mask, d)) {
                out->offset += (xs->dims[d] - 1) * x->strides[d];
                out->strides[d] = -x->strides[d];
            }
        }
        return TB_OK;
    }
    default:
        break;
    }
    return tb__ref_malformed(node, xs);
}

/* ---- concat, pad, gather, index_select ---- */

static tb_status tb__ref_concat(const tb_node *node, const tb__rview *in, tb__rview *out) {
    int32_t dim = node->num_attrs > 0 ? (int32_t)node->attrs[0] : 0, d;
    const tb_shape *os = &node->shape;
    int64_t at = 0;
    uint32_t k;
    tb_status st;
    if (dim < 0 || dim >= os->rank || node->num_operands < 1) goto bad;
    for (k = 0; k < node->num_operands; k++) {
        if (in[k].shape.rank != os->rank) goto bad;
        for (d = 0; d < os->rank; d++)
            if (d != dim && in[k].shape.dims[d] != os->dims[d]) goto bad;
        if (!tb__add_i64(at, in[k].shape.dims[dim], &at)) goto bad;
    }
    if (at != os->dims[dim]) goto bad;
    st = tb__rview_alloc(out, os);
    if (st != TB_OK) return st;
    at = 0;
    for (k = 0; k < node->num_operands && st == TB_OK; k++) {
        tb__rview dst = *out;
        dst.shape.dims[dim] = in[k].shape.dims[dim];
        if (dst.shape.dims[dim] == 0 || tb__ref_numel(&dst.shape) == 0) continue;
        dst.offset = at * out->strides[dim];
        at += in[k].shape.dims[dim];
        st = tb__ref_copy(&dst, &in[k]);
    }
    if (st != TB_OK) tb__rview_clear(out);
    return st;
bad:
    return tb__ref_malformed(node, &in[0].shape);
}

/* Fills a contiguous view with one element's bytes. */
static void tb__ref_fill(tb__rview *v, const char *elem) {
    int64_t n = tb__ref_numel(&v->shape), es = tb__ref_esize(v->shape.dtype), i;
    char *p = tb__rview_ptr(v);
    for (i = 0; i < n; i++)
        memcpy(p + i * es, elem, (size_t)es);
}

static tb_status tb__ref_pad(const tb_node *node, const tb__rview *in, tb__rview *out) {
    const tb__rview *x = &in[0];
    const tb_shape *os = &node->shape;
    char value[8];
    tb__rview dst, src;
    int32_t d;
    tb_status st;
    if (os->rank != x->shape.rank || (int64_t)node->num_attrs != 2 * (int64_t)os->rank ||
        tb__ref_numel(&in[1].shape) != 1)
        goto bad;
    for (d = 0; d < os->rank; d++) {
        int64_t before = node->attrs[2 * d], after = node->attrs[2 * d + 1];
        int64_t size;
        if (before < 0 || after < 0 || !tb__add_i64(before, x->shape.dims[d], &size) ||
            !tb__add_i64(size, after, &size) || size != os->dims[d])
            goto bad;
    }
    st = tb__rview_alloc(out, os);
    if (st != TB_OK) return st;
    memset(value, 0, sizeof(value));
    tb__ref_convert(os->dtype, value, in[1].shape.dtype, tb__rview_ptr(&in[1]));
    tb__ref_fill(out, value);
    if (tb__ref_numel(&x->shape) == 0) return TB_OK;
    dst = *out;
    src = *x;
    dst.shape = x->shape;
    dst.shape.dtype = os->dtype;
    for (d = 0; d < os->rank; d++)
        dst.offset += node->attrs[2 * d] * out->strides[d];
    st = tb__ref_copy(&dst, &src);
    if (st != TB_OK) tb__rview_clear(out);
    return st;
bad:
    return tb__ref_malformed(node, &in[0].shape);
}

static tb_status tb__ref_index_error(const tb_node *node, int64_t index, int32_t dim,
                                     int64_t size) {
    return tb__error(TB_ERR_EXECUTE, "tb_%s: index %lld is out of range for dim %d of size %lld",
                     tb_op_name(node->op), (long long)index, (int)dim, (long long)size);
}

static tb_status tb__ref_gather(const tb_node *node, const tb__rview *in, tb__rview *out) {
    const tb__rview *x = &in[0], *ix = &in[1];
    const tb_shape *os = &node->shape;
    int32_t dim = node->num_attrs > 0 ? (int32_t)node->attrs[0] : 0, d;
    int64_t idx[TB_MAX_RANK], xoff, ioff, n, o;
    int64_t es = tb__ref_esize(x->shape.dtype), ies = tb__ref_esize(ix->shape.dtype);
    tb_status st;
    if (x->shape.rank < 1 || ix->shape.rank != x->shape.rank || os->rank != x->shape.rank ||
        dim < 0 || dim >= os->rank || os->dtype != x->shape.dtype)
        goto bad;
    for (d = 0; d < os->rank; d++)
        if (ix->shape.dims[d] != os->dims[d] || (d != dim && os->dims[d] > x->shape.dims[d]))
            goto bad;
    st = tb__rview_alloc(out, os);
    if (st != TB_OK) return st;
    n = tb__ref_numel(os);
    memset(idx, 0, sizeof(idx));
    xoff = x->offset;
    ioff = ix->offset;
    for (o = 0; o < n; o++) {
        int64_t i = tb__ld_i(ix->shape.dtype, ix->buf->data + ioff * ies);
        if (i < 0 || i >= x->shape.dims[dim]) {
            tb__rview_clear(out);
            return tb__ref_index_error(node, i, dim, x->shape.dims[dim]);
        }
        memcpy(out->buf->data + o * es, x->buf->data + (xoff + i * x->strides[dim]) * es,
               (size_t)es);
        for (d = os->rank - 1; d >= 0; d--) {
            int64_t xs_ = d == dim ? 0 : x->strides[d];
            idx[d]++;
            xoff += xs_;
            ioff += ix->strides[d];
            if (idx[d] < os->dims[d]) break;
            xoff -= xs_ * os->dims[d];
            ioff -= ix->strides[d] * os->dims[d];
            idx[d] = 0;
        }
    }
    return TB_OK;
bad:
    return tb__ref_malformed(node, &in[0].shape);
}

static tb_status tb__ref_index_select(const tb_node *node, const tb__rview *in, tb__rview *out) {
    const tb__rview *x = &in[0], *ix = &in[1];
    const tb_shape *os = &node->shape;
    int32_t dim = node->num_attrs > 0 ? (int32_t)node->attrs[0] : 0, d;
    int64_t len, i, ies = tb__ref_esize(ix->shape.dtype);
    tb_status st = TB_OK;
    if (x->shape.rank < 1 || ix->shape.rank != 1 || os->rank != x->shape.rank || dim < 0 ||
        dim >= os->rank || os->dtype != x->shape.dtype)
        goto bad;
    len = ix->shape.dims[0];
    for (d = 0; d < os->rank; d++)
        if (os->dims[d] != (d == dim ? len : x->shape.dims[d])) goto bad;
    /* every index is checked first, so a bad one fails before any work */
    for (i = 0; i < len; i++) {
        int64_t v =
            tb__ld_i(ix->shape.dtype, ix->buf->data + (ix->offset + i * ix->strides[0]) * ies);
        if (v < 0 || v >= x->shape.dims[dim])
            return tb__ref_index_error(node, v, dim, x->shape.dims[dim]);
    }
    st = tb__rview_alloc(out, os);
    if (st != TB_OK) return st;
    if (tb__ref_numel(os) == 0) return TB_OK;
    for (i = 0; i < len && st == TB_OK; i++) {
        int64_t v =
            tb__ld_i(ix->shape.dtype, ix->buf->data + (ix->offset + i * ix->strides[0]) * ies);
        tb__rview src = *x, dst = *out;
        src.shape.dims[dim] = 1;
        src.offset += v * x->strides[dim];
        dst.shape.dims[dim] = 1;
        dst.offset = i * out->strides[dim];
        st = tb__ref_copy(&dst, &src);
    }
    if (st != TB_OK) tb__rview_clear(out);
    return st;
bad:
    return tb__ref_malformed(node, &in[0].shape);
}

/* ---- leaves and generators ---- */

static tb_status tb__ref_leaf(const tb_node *node, tb__rview *out) {
    const tb_shape *os = &node->shape;
    int64_t n = tb__ref_numel(os), i, es = tb__ref_esize(os->dtype);
    tb_status st = tb__rview_alloc(out, os);
    char *o;
    if (st != TB_OK) return st;
    o = out->buf->data;
    switch (node->op) {
    case TB_OP_DEVICE_DATA:
        if (!node->data) {
            st = tb__error(TB_ERR_INTERNAL, "reference: device data node without data");
            break;
        }
        if (n > 0) st = tb__data_to_host(node->data, o);
        break;
    case TB_OP_SCALAR:
        if (tb_dtype_is_float(node->scalar.dtype))
            tb__st_f(os->dtype, o, node->scalar.f);
        else
            tb__st_i(os->dtype, o, node->scalar.i);
        break;
    case TB_OP_ARANGE: {
        double start = node->fattrs[0], step = node->fattrs[1];
        if (tb_dtype_is_float(os->dtype)) {
            for (i = 0; i < n; i++)
                tb__st_f(os->dtype, o + i * es, start + (double)i * step);
        } else {
            /* whole start and step: exact in int64 (wrapping, never undefined) */
            int64_t s0 = tb__ref_f2i(start), s1 = tb__ref_f2i(step);
            for (i = 0; i < n; i++)
                tb__st_i(os->dtype, o + i * es,
                         (int64_t)((uint64_t)s0 + (uint64_t)i * (uint64_t)s1));
        }
        break;
    }
    case TB_OP_EYE: {
        int64_t rows, cols;
        if (os->rank != 2) {
            st = tb__error(TB_ERR_INTERNAL, "reference: eye node of rank %d", (int)os->rank);
            break;
        }
        rows = os->dims[0];
        cols = os->dims[1];
        if (n > 0) memset(o, 0, (size_t)(n * es));
        for (i = 0; i < rows && i < cols; i++)
            tb__st_i(os->dtype, o + (i * cols + i) * es, 1);
        break;
    }
    default:
        st = tb__error(TB_ERR_INTERNAL, "reference: %s is not a leaf", tb_op_name(node->op));
        break;
    }
    if (st != TB_OK) tb__rview_clear(out);
    return st;
}

static tb_status tb__ref_random(const tb_node *node, const tb__rview *in, tb__rview *out) {
    const tb_shape *os = &node->shape;
    int64_t n = tb__ref_numel(os), i, es = tb__ref_esize(os->dtype);
    uint64_t seed, offset;
    tb_status st;
    if (tb__ref_numel(&in[0].shape) != 1 || tb__ref_numel(&in[1].shape) != 1)
        return tb__error(TB_ERR_INTERNAL, "reference: %s seed and offset must be scalars",
                         tb_op_name(node->op));
    /* i64 scalars holding the uint64 values bit for bit */
    seed = (uint64_t)tb__ld_i(in[0].shape.dtype, tb__rview_ptr(&in[0]));
    offset = (uint64_t)tb__ld_i(in[1].shape.dtype, tb__rview_ptr(&in[1]));
    st = tb__rview_alloc(out, os);
    if (st != TB_OK) return st;
    for (i = 0; i < n; i++) {
        double v = node->op == TB_OP_RAND ? tb__rng_uniform(os->dtype, seed, offset, (uint64_t)i)
                                          : tb__rng_normal(os->dtype, seed, offset, (uint64_t)i);
        tb__st_f(os->dtype, out->buf->data + i * es, v);
    }
    return TB_OK;
}

/* ---- custom ops ---- */

static tb_status tb__ref_custom(const tb_node *node, const tb__rview *in, tb__rview *out) {
    const tb_custom_op_desc *desc = tb_op_custom_desc(node->op);
    uint32_t n = node->num_operands, k;
    tb__rview *views = NULL;
    const void **ptrs = NULL;
    tb_shape *shapes = NULL;
    char before[1024];
    tb_status st = TB_OK;
    if (!desc || !desc->reference)
        return tb__error(TB_ERR_INTERNAL, "reference: unknown op %d", (int)node->op);
    views = (tb__rview *)tb__calloc(n + 1u, sizeof(tb__rview));
    ptrs = (const void **)tb__calloc(n + 1u, sizeof(void *));
    shapes = (tb_shape *)tb__calloc(n + 1u, sizeof(tb_shape));
    if (!views || !ptrs || !shapes) st = TB_ERR_OUT_OF_MEMORY;
    for (k = 0; k < n && st == TB_OK; k++) {
        st = tb__rview_contig(&in[k], &views[k]);
        if (st == TB_OK) {
            ptrs[k] = tb__rview_ptr(&views[k]);
            shapes[k] = in[k].shape;
        }
    }
    if (st == TB_OK) st = tb__rview_alloc(out, &node->shape);
    if (st == TB_OK) {
        /* the op may report its own reason; give one when it did not */
        snprintf(before, sizeof(before), "%s", tb_last_error());
        st = desc->reference(ptrs, shapes, n, out->buf->data, &node->shape, node->attrs,
                             node->num_attrs, desc->user_data);
        if (st != TB_OK) {
            if (tb_last_status() == TB_OK || strcmp(before, tb_last_error()) == 0) {
                tb_status code = st;
                if (code <= TB_OK || code >= TB_STATUS_COUNT) code = TB_ERR_EXECUTE;
                st = tb__error(code, "%s: the custom op's reference failed (%s)", desc->name,
                               tb_status_string(code));
            }
            tb__rview_clear(out);
        }
    }
    if (views)
        for (k = 0; k < n; k++)
            tb__rview_clear(&views[k]);
    tb__free(views);
    tb__free((void *)ptrs);
    tb__free(shapes);
    return st;
}

/* ---- one node ---- */

static tb_status tb__ref_check_arity(const tb_node *node) {
    int32_t arity = tb_op_arity(node->op);
    if (node->op == TB_OP_LAYER_NORM || node->op == TB_OP_CONCAT) return TB_OK;
    if (node->op >= TB_OP_BUILTIN_COUNT) {
        const tb_custom_op_desc *desc = tb_op_custom_desc(node->op);
        arity = desc ? desc->num_inputs : -1;
    }
    if (arity < 0 || (uint32_t)arity != node->num_operands)
        return tb__error(TB_ERR_INTERNAL, "reference: %s node with %u operands",
                         tb_op_name(node->op) ? tb_op_name(node->op) : "unknown",
                         (unsigned)node->num_operands);
    return TB_OK;
}

/* Computes `node` from its operands' values into *out (a new view holding a reference). */
static tb_status tb__ref_compute(const tb_node *node, const tb__rview *in, tb__rview *out) {
    tb_status st;
    uint32_t k;
    memset(out, 0, sizeof(*out));
    st = tb__ref_check_arity(node);
    if (st != TB_OK) return st;
    for (k = 0; k < node->num_operands; k++)
        if (!in[k].buf) return tb__error(TB_ERR_INTERNAL, "reference: an operand has no value");
    /* an empty result needs no work (and no index checks, as in PyTorch) */
    if (tb__ref_numel(&node->shape) == 0 && node->op != TB_OP_DEVICE_DATA)
        return tb__rview_alloc(out, &node->shape);
    if (node->op >= TB_OP_BUILTIN_COUNT) return tb__ref_custom(node, in, out);
    switch (tb_op_get_kind(node->op)) {
    case TB_KIND_UNARY:
    case TB_KIND_BINARY:
    case TB_KIND_TERNARY:
        return tb__ref_elementwise(node, in, out);
    case TB_KIND_MOVEMENT:
        return tb__ref_movement(node, &in[0], out);
    default:
        break;
    }
    switch (node->op) {
    case TB_OP_DEVICE_DATA:
    case TB_OP_SCALAR:
    case TB_OP_ARANGE:
    case TB_OP_EYE:
        return tb__ref_leaf(node, out);
    case TB_OP_RAND:
    case TB_OP_RANDN:
        return tb__ref_random(node, in, out);
    case TB_OP_SUM:
    case TB_OP_MEAN:
    case TB_OP_MAX:
    case TB_OP_MIN:
    case TB_OP_PROD:
        return tb__ref_reduce(node, &in[0], out);
    case TB_OP_ARGMAX:
    case TB_OP_ARGMIN:
        return tb__ref_argminmax(node, &in[0], out);
    case TB_OP_MATMUL:
        return tb__ref_matmul(node, &in[0], &in[1], out);
    case TB_OP_SOFTMAX:
    case TB_OP_LOG_SOFTMAX:
        return tb__ref_softmax(node, &in[0], out);
    case TB_OP_LAYER_NORM:
        return tb__ref_layer_norm(node, in, out);
    case TB_OP_CONCAT:
        return tb__ref_concat(node, in, out);
    case TB_OP_PAD:
        return tb__ref_pad(node, in, out);
    case TB_OP_GATHER:
        return tb__ref_gather(node, in, out);
    case TB_OP_INDEX_SELECT:
        return tb__ref_index_select(node, in, out);
    default:
        break;
    }
    return tb__error(TB_ERR_INTERNAL, "reference: no implementation of op %d", (int)node->op);
}

/* ---- whole graphs ---- */

typedef struct tb__ref_slot {
    const tb_node *node;
    tb__rview value;
    int64_t uses;   /* operand uses by needed nodes not yet run */
    int64_t param;  /* index in graph->parameters, -1 when computed */
    int64_t result; /* first index in graph->results, -1 when none */
    bool needed;
} tb__ref_slot;

typedef struct tb__ref_map {
    const tb_node **keys;
    size_t *vals;
    size_t mask;
} tb__ref_map;

static size_t tb__ref_ptr_hash(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x;
}

static tb_status tb__ref_map_init(tb__ref_map *m, size_t count) {
    size_t cap = 16;
    while (cap < count * 2u) {
        if (cap > SIZE_MAX / 4u) return tb__error(TB_ERR_OVERFLOW, "reference: graph too large");
        cap *= 2u;
    }
    m->mask = cap - 1u;
    m->keys = (const tb_node **)tb__calloc(cap, sizeof(tb_node *));
    m->vals = (size_t *)tb__calloc(cap, sizeof(size_t));
    if (!m->keys || !m->vals) return TB_ERR_OUT_OF_MEMORY;
    return TB_OK;
}

static void tb__ref_map_free(tb__ref_map *m) {
    tb__free((void *)m->keys);
    tb__free(m->vals);
}

/* The slot of `node`, or SIZE_MAX. */
static size_t tb__ref_map_get(const tb__ref_map *m, const tb_node *node) {
    size_t h = tb__ref_ptr_hash(node) & m->mask;
    while (m->keys[h]) {
        if (m->keys[h] == node) return m->vals[h];
        h = (h + 1u) & m->mask;
    }
    return SIZE_MAX;
}

/* Inserts unless present; returns the node's slot. */
static size_t tb__ref_map_put(tb__ref_map *m, const tb_node *node, size_t slot) {
    size_t h = tb__ref_ptr_hash(node) & m->mask;
    while (m->keys[h]) {
        if (m->keys[h] == node) return m->vals[h];
        h = (h + 1u) & m->mask;
    }
    m->keys[h] = node;
    m->vals[h] = slot;
    return slot;
}

/* The slots: the nodes in post-order, then parameters the node list lacks; each result's
   slot is marked needed and chained (next_result) to the other results of its node.
   *nslots counts the slots filled, also when a malformed graph stops this early. */
static tb_status tb__ref_slots_fill(const tb_graph *graph, tb__ref_map *map, tb__ref_slot *slots,
                                    size_t *nslots, int64_t *next_result) {
    size_t i;
    for (i = 0; i < graph->num_nodes; i++) {
        const tb_node *node = graph->nodes[i];
        if (!node) return tb__error(TB_ERR_INTERNAL, "reference: NULL node in the graph");
        if (tb__ref_map_put(map, node, *nslots) == *nslots) {
            slots[*nslots].node = node;
            slots[*nslots].param = -1;
            slots[*nslots].result = -1;
            (*nslots)++;
        }
    }
    for (i = 0; i < graph->num_parameters; i++) {
        const tb_node *node = graph->parameters[i];
        size_t s;
        if (!node) return tb__error(TB_ERR_INTERNAL, "reference: NULL parameter in the graph");
        s = tb__ref_map_put(map, node, *nslots);
        if (s == *nslots) {
            slots[*nslots].node = node;
            slots[*nslots].result = -1;
            (*nslots)++;
        }
        slots[s].param = (int64_t)i;
    }
    for (i = graph->num_results; i-- > 0;) {
        size_t s = graph->results[i] ? tb__ref_map_get(map, graph->results[i]) : SIZE_MAX;
        if (s == SIZE_MAX)
            return tb__error(TB_ERR_INTERNAL, "reference: result %zu is not a node of the graph",
                             i);
        next_result[i] = slots[s].result;
        slots[s].result = (int64_t)i;
        slots[s].needed = true;
    }
    return TB_OK;
}

/* What the results need, and how often each value is used (consumers come after their
   operands, so a backward walk sees every consumer first); *in_cap becomes the most operands
   a needed node has. */
static tb_status tb__ref_slots_mark_needed(const tb__ref_map *map, tb__ref_slot *slots,
                                           size_t nslots, size_t *in_cap) {
    size_t i;
    for (i = nslots; i-- > 0;) {
        tb__ref_slot *sl = &slots[i];
        uint32_t k;
        if (!sl->needed || sl->param >= 0) continue;
        if (sl->node->num_operands > 0 && !sl->node->operands)
            return tb__error(TB_ERR_INTERNAL, "reference: node without its operands");
        for (k = 0; k < sl->node->num_operands; k++) {
            size_t s = tb__ref_map_get(map, sl->node->operands[k]);
            if (s == SIZE_MAX || s >= i) {
                return tb__error(TB_ERR_INTERNAL,
                                 "reference: an operand of a %s node is not before it in the graph",
                                 tb_op_name(sl->node->op) ? tb_op_name(sl->node->op) : "custom");
            }
            slots[s].needed = true;
            slots[s].uses++;
        }
        if (sl->node->num_operands > *in_cap) *in_cap = sl->node->num_operands;
    }
    return TB_OK;
}

TB__UNUSED static tb_status tb__ref_run_graph(const tb_graph *graph, const void *const *parameters,
                                              void *const *results) {
    tb__ref_slot *slots = NULL;
    int64_t *next_result = NULL;
    tb__rview *in = NULL;
    size_t in_cap = 0, nslots = 0, i, total;
    tb__ref_map map;
    tb__ref_pool pool, *outer_pool = tb__ref_current_pool;
    tb_status st = TB_OK;
    memset(&map, 0, sizeof(map));
    memset(&pool, 0, sizeof(pool));
    if (!graph || (graph->num_nodes > 0 && !graph->nodes) ||
        (graph->num_parameters > 0 && !parameters) ||
        (graph->num_parameters > 0 && !graph->parameters) ||
        (graph->num_results > 0 && (!results || !graph->results)))
        return tb__error(TB_ERR_INTERNAL, "reference: malformed graph");
    if (graph->num_nodes > SIZE_MAX / 4u - graph->num_parameters)
        return tb__error(TB_ERR_OVERFLOW, "reference: graph too large");
    total = graph->num_nodes + graph->num_parameters;
    slots = (tb__ref_slot *)tb__calloc(total + 1u, sizeof(tb__ref_slot));
    next_result = (int64_t *)tb__calloc(graph->num_results + 1u, sizeof(int64_t));
    if (!slots || !next_result) {
        st = TB_ERR_OUT_OF_MEMORY;
        goto done;
    }
    st = tb__ref_map_init(&map, total);
    if (st != TB_OK) goto done;
    tb__ref_current_pool = &pool;

    st = tb__ref_slots_fill(graph, &map, slots, &nslots, next_result);
    if (st != TB_OK) goto done;
    st = tb__ref_slots_mark_needed(&map, slots, nslots, &in_cap);
    if (st != TB_OK) goto done;
    in = (tb__rview *)tb__calloc(in_cap + 1u, sizeof(tb__rview));
    if (!in) {
        st = TB_ERR_OUT_OF_MEMORY;
        goto done;
    }

    /* parameters first: nodes that are not in the node list come after it */
    for (i = 0; i < nslots; i++) {
        tb__ref_slot *sl = &slots[i];
        if (sl->needed && sl->param >= 0) {
            st = tb__rview_borrow(&sl->value, &sl->node->shape, parameters[sl->param]);
            if (st != TB_OK) goto done;
        }
    }
    for (i = 0; i < nslots; i++) {
        tb__ref_slot *sl = &slots[i];
        int64_t r;
        uint32_t k;
        if (!sl->needed) continue;
        if (sl->param < 0) {
            for (k = 0; k < sl->node->num_operands; k++)
                in[k] = slots[tb__ref_map_get(&map, sl->node->operands[k])].value;
            st = tb__ref_compute(sl->node, in, &sl->value);
            if (st != TB_OK) goto done;
            /* operands whose last user this was are freed now: memory stays bounded */
            for (k = 0; k < sl->node->num_operands; k++) {
                tb__ref_slot *op = &slots[tb__ref_map_get(&map, sl->node->operands[k])];
                if (--op->uses == 0) tb__rview_clear(&op->value);
            }
        }
        for (r = sl->result; r >= 0; r = next_result[r]) {
            st = tb__rview_to_host(&sl->value, results[r]);
            if (st != TB_OK) goto done;
        }
        if (sl->uses == 0) tb__rview_clear(&sl->value);
    }

done:
    if (slots)
        for (i = 0; i < nslots; i++)
            tb__rview_clear(&slots[i].value);
    tb__ref_current_pool = outer_pool;
    tb__ref_pool_drain(&pool);
    tb__free(slots);
    tb__free(next_result);
    tb__free(in);
    tb__ref_map_free(&map);
    return st;
}

#undef TB__REF_MAX_OPS
#undef TB__REF_POOL_SLOTS
#undef TB__REF_POOL_MIN
