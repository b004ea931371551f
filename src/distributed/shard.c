/* ===========================================================================================
   Sharded tensors: per-device tensors and their placement, ops per shard, and the collectives
   between the devices of this process (built on tb_sync, tb_to_device and the ops).
   =========================================================================================== */
#include "../impl_begin.h"

struct tb_sharded {
    tb_placement placement;
    int32_t axis; /* TB_SHARD's, non-negative; -1 otherwise */
    size_t count;
    tb_shape shape; /* the whole tensor's */
    tb_tensor **shards;
};

TBDEF const char *tb_placement_name(tb_placement placement) {
    switch (placement) {
    case TB_SHARD:
        return "shard";
    case TB_REPLICATE:
        return "replicate";
    case TB_PARTIAL:
        return "partial";
    default:
        return "invalid";
    }
}

/* ---- plumbing ---- */

static tb_sharded *tb__shard_alloc(size_t count) {
    tb_sharded *s = (tb_sharded *)tb__calloc(1, sizeof *s);
    if (s == NULL) return NULL;
    s->shards = (tb_tensor **)tb__calloc(count, sizeof *s->shards);
    if (s->shards == NULL) {
        tb__free(s);
        return NULL;
    }
    s->count = count;
    s->axis = -1;
    return s;
}

TBDEF void tb_sharded_release(tb_sharded *s) {
    size_t i;
    if (s == NULL) return;
    for (i = 0; i < s->count; i++)
        tb_tensor_release(s->shards[i]);
    tb__free(s->shards);
    tb__free(s);
}

static void tb__shard_release_all(tb_tensor **t, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        tb_tensor_release(t[i]);
        t[i] = NULL;
    }
}

/* A NULL sharded tensor keeps the first error of a chain, as ops do with NULL tensors. */
static tb_status tb__shard_null(const char *fn, const char *what) {
    if (tb_last_status() == TB_OK)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
    return tb_last_status();
}

static tb_status tb__shard_placement_ok(const char *fn, tb_placement placement) {
    if ((int)placement < 0 || placement >= TB_PLACEMENT_COUNT)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: placement %d is not a tb_placement", fn,
                         (int)placement);
    return TB_OK;
}

static tb_status tb__shard_axis(const char *fn, int32_t axis, int32_t rank, int32_t *out) {
    if (axis < -rank || axis >= rank)
        return tb__error(TB_ERR_SHAPE, "%s: axis %d is out of range for rank %d", fn, (int)axis,
                         (int)rank);
    *out = axis < 0 ? axis + rank : axis;
    return TB_OK;
}

/* Rows [*lo, *hi) of shard i of `count` along a dim of d, as numpy.array_split. */
static void tb__shard_bounds(int64_t d, size_t count, size_t i, int64_t *lo, int64_t *hi) {
    int64_t q = d / (int64_t)count, r = d % (int64_t)count, k = (int64_t)i;
    *lo = k * q + (k < r ? k : r);
    *hi = *lo + q + (k < r ? 1 : 0);
}

static bool tb__shard_same_device(tb_tensor *t, const tb_device *device) {
    tb_device d = tb_tensor_device(t);
    return tb_device_equal(&d, device);
}

/* Every tensor a library call returns inside this part goes through here: the reference is
   this code's, not the open scope's (it keeps it in a sharded tensor or releases it itself).
   What is handed back to the caller as a tensor goes to the scope again (tb__scope_claim). */
static tb_tensor *tb__shard_own(tb_tensor *t) {
    tb__scope_take(t);
    return t;
}

/* x on `device`: a new reference to x where it already is (nothing runs), else tb_to_device. */
static tb_tensor *tb__shard_move(tb_tensor *x, const tb_device *device) {
    if (tb__shard_same_device(x, device)) return tb_tensor_retain(x);
    return tb__shard_own(tb_to_device(x, device));
}

/* A replica of x on `device`: a handle of its own (sharing x's value on x's device), so that
   replicas can each require grad or be updated in place without touching x or each other. */
static tb_tensor *tb__shard_replica(tb_tensor *x, const tb_device *device) {
    return tb__shard_own(tb_to_device(x, device));
}

/* Checks per-device tensors against a placement and fills s's shape (s->shards are set). */
static tb_status tb__shard_fill(const char *fn, tb_sharded *s, tb_placement placement,
                                int32_t axis) {
    tb_shape first, whole;
    size_t i;
    if (tb__shard_placement_ok(fn, placement) != TB_OK) return tb_last_status();
    first = whole = tb_tensor_shape(s->shards[0]);
    s->placement = placement;
    s->axis = -1;
    if (placement == TB_SHARD) {
        if (tb__shard_axis(fn, axis, first.rank, &s->axis) != TB_OK) return tb_last_status();
        whole.dims[s->axis] = 0;
    }
    for (i = 0; i < s->count; i++) {
        tb_shape si = tb_tensor_shape(s->shards[i]);
        bool ok = si.dtype == first.dtype && si.rank == first.rank;
        int32_t k;
        for (k = 0; ok && k < si.rank; k++)
            ok = k == s->axis || si.dims[k] == first.dims[k];
        if (!ok) {
            char a[96], b[96];
            tb_shape_format(&first, a, sizeof a);
            tb_shape_format(&si, b, sizeof b);
            return tb__error(TB_ERR_SHAPE, "%s: shard 0 is %s but shard %zu is %s (%s%s)", fn, a, i,
                             b, tb_placement_name(placement),
                             placement == TB_SHARD ? ": only the sharded axis may differ"
                                                   : ": shards of equal shape");
        }
        if (placement == TB_SHARD) {
            if (si.dims[s->axis] > INT64_MAX - whole.dims[s->axis])
                return tb__error(TB_ERR_OVERFLOW, "%s: the shards' sizes along axis %d overflow",
                                 fn, (int)s->axis);
            whole.dims[s->axis] += si.dims[s->axis];
        }
    }
    if (tb_shape_validate(&whole) != TB_OK)
        return tb__error(tb_last_status(), "%s: the whole tensor: %s", fn, tb_last_error());
    s->shape = whole;
    return TB_OK;
}

/* A sharded tensor that takes over n owned tensors (released on error). */
static tb_sharded *tb__shard_adopt(const char *fn, tb_tensor **t, size_t n, tb_placement placement,
                                   int32_t axis) {
    tb_sharded *s;
    size_t i;
    for (i = 0; i < n; i++) {
        if (t[i] == NULL) {
            tb__shard_null(fn, "a shard");
            tb__shard_release_all(t, n);
            return NULL;
        }
    }
    s = tb__shard_alloc(n);
    if (s == NULL) {
        tb__shard_release_all(t, n);
        return NULL;
    }
    for (i = 0; i < n; i++) {
        s->shards[i] = t[i];
        t[i] = NULL;
    }
    if (tb__shard_fill(fn, s, placement, axis) != TB_OK) {
        tb_sharded_release(s);
        return NULL;
    }
    return s;
}

static tb_status tb__shard_count_ok(const char *fn, size_t count) {
    if (count == 0 || count > TB_MAX_SHARDS)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %zu devices (1 to %d)", fn, count,
                         TB_MAX_SHARDS);
    return TB_OK;
}

/* ---- making and reading ---- */

TBDEF tb_sharded *tb_sharded_from_tensors(tb_tensor *const *tensors, size_t count,
                                          tb_placement placement, int32_t axis) {
    static const char fn[] = "tb_sharded_from_tensors";
    tb_tensor *t[TB_MAX_SHARDS];
    size_t i;
    if (tensors == NULL) {
        tb__shard_null(fn, "tensors");
        return NULL;
    }
    if (tb__shard_count_ok(fn, count) != TB_OK) return NULL;
    for (i = 0; i < count; i++) {
        if (tensors[i] == NULL) {
            tb__shard_null(fn, "a tensor");
            return NULL;
        }
    }
    for (i = 0; i < count; i++)
        t[i] = tb_tensor_retain(tensors[i]);
    return tb__shard_adopt(fn, t, count, placement, axis);
}

TBDEF tb_sharded *tb_distribute(tb_tensor *x, const tb_device *devices, size_t count,
                                tb_placement placement, int32_t axis) {
    static const char fn[] = "tb_distribute";
    tb_tensor *t[TB_MAX_SHARDS];
    tb_shape shape;
    int32_t ax = -1;
    size_t i;
    if (x == NULL || devices == NULL) {
        tb__shard_null(fn, x == NULL ? "x" : "devices");
        return NULL;
    }
    if (tb__shard_count_ok(fn, count) != TB_OK || tb__shard_placement_ok(fn, placement) != TB_OK)
        return NULL;
    shape = tb_tensor_shape(x);
    if (placement == TB_SHARD && tb__shard_axis(fn, axis, shape.rank, &ax) != TB_OK) return NULL;
    /* a pending x runs once, not once per device it is copied to */
    if (tb_sync(&x, 1) != TB_OK) return NULL;
    memset(t, 0, sizeof t);
    for (i = 0; i < count; i++) {
        if (placement == TB_SHARD) {
            int64_t lo, hi;
            tb_tensor *part;
            tb__shard_bounds(shape.dims[ax], count, i, &lo, &hi);
            part = tb__shard_own(tb_slice(x, ax, lo, hi, 1));
            t[i] = part != NULL ? tb__shard_move(part, &devices[i]) : NULL;
            tb_tensor_release(part);
        } else if (placement == TB_PARTIAL && i > 0) {
            t[i] = tb__shard_own(tb_zeros(&shape, &devices[i]));
        } else {
            t[i] = tb__shard_replica(x, &devices[i]);
        }
        if (t[i] == NULL) {
            tb__shard_release_all(t, i);
            return NULL;
        }
    }
    return tb__shard_adopt(fn, t, count, placement, ax);
}

TBDEF size_t tb_sharded_count(const tb_sharded *s) {
    return s == NULL ? 0 : s->count;
}

TBDEF tb_placement tb_sharded_placement(const tb_sharded *s) {
    return s == NULL ? TB_PLACEMENT_COUNT : s->placement;
}

TBDEF int32_t tb_sharded_axis(const tb_sharded *s) {
    return s == NULL ? -1 : s->axis;
}

TBDEF tb_shape tb_sharded_shape(const tb_sharded *s) {
    tb_shape none;
    if (s != NULL) return s->shape;
    memset(&none, 0, sizeof none);
    return none;
}

TBDEF tb_tensor *tb_sharded_shard(const tb_sharded *s, size_t i) {
    if (s == NULL) {
        tb__shard_null("tb_sharded_shard", "s");
        return NULL;
    }
    if (i >= s->count) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_sharded_shard: shard %zu of %zu", i, s->count);
        return NULL;
    }
    return s->shards[i];
}

/* ---- moving between devices ---- */

/* One sync per device for all the shards of n sharded tensors (the graphs below them run
   once), one device after the other: syncing them from a thread each trips an assertion inside
   PoCL 3.1 when its two devices build kernels at the same time. */
static tb_status tb__shard_sync(tb_sharded *const *in, size_t n) {
    tb_tensor **all;
    size_t i, j, k = 0, total = 0;
    tb_status st;
    for (i = 0; i < n; i++)
        total += in[i]->count;
    all = (tb_tensor **)tb__calloc(total == 0 ? 1 : total, sizeof *all);
    if (all == NULL) return TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < n; i++) {
        for (j = 0; j < in[i]->count; j++)
            all[k++] = in[i]->shards[j];
    }
    st = tb__sync_by_device(all, total, "tb_sync");
    tb__free(all);
    return st;
}

/* acc op= x elementwise for an all-reduce (bool: or for sum and max, and for min and product;
   f16 and bf16 are combined in f32 by the caller). Consumes acc. */
static tb_tensor *tb__shard_combine(tb_tensor *acc, tb_tensor *x, tb_reduce_op op) {
    tb_tensor *r;
    bool is_bool = tb_tensor_shape(acc).dtype == TB_BOOL;
    switch (op) {
    case TB_REDUCE_MAX:
        r = is_bool ? tb_logical_or(acc, x) : tb_maximum(acc, x);
        break;
    case TB_REDUCE_MIN:
        r = is_bool ? tb_logical_and(acc, x) : tb_minimum(acc, x);
        break;
    case TB_REDUCE_PRODUCT:
        r = is_bool ? tb_logical_and(acc, x) : tb_mul(acc, x);
        break;
    default:
        r = is_bool ? tb_logical_or(acc, x) : tb_add(acc, x);
        break;
    }
    tb_tensor_release(acc);
    return tb__shard_own(r);
}

/* The reduction over the devices of `count` tensors of equal shape, in shard order, on
   `device`: the values are moved there (already synced) and combined lazily. */
static tb_tensor *tb__shard_reduce_on(tb_tensor *const *t, size_t count, tb_reduce_op op,
                                      const tb_device *device) {
    tb_dtype dtype = tb_tensor_shape(t[0]).dtype;
    bool half = dtype == TB_F16 || dtype == TB_BF16;
    tb_tensor *acc = NULL;
    size_t j;
    for (j = 0; j < count; j++) {
        tb_tensor *m = tb__shard_move(t[j], device), *w = m;
        if (m != NULL && half) {
            w = tb__shard_own(tb_cast(m, TB_F32));
            tb_tensor_release(m);
        }
        if (w == NULL) {
            tb_tensor_release(acc);
            return NULL;
        }
        if (acc == NULL) {
            acc = w;
            continue;
        }
        acc = tb__shard_combine(acc, w, op);
        tb_tensor_release(w);
        if (acc == NULL) return NULL;
    }
    if (op == TB_REDUCE_MEAN) {
        tb_tensor *m = tb__shard_own(tb_div_scalar(acc, (double)count));
        tb_tensor_release(acc);
        acc = m;
    }
    if (acc != NULL && half) {
        tb_tensor *c = tb__shard_own(tb_cast(acc, dtype));
        tb_tensor_release(acc);
        acc = c;
    }
    return acc;
}

static tb_status tb__shard_reduce_check(const char *fn, tb_sharded *s, tb_reduce_op op) {
    size_t j;
    tb_shape first;
    if ((int)op < 0 || op >= TB_REDUCE_OP_COUNT)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: reduce op %d is not a tb_reduce_op", fn,
                         (int)op);
    first = tb_tensor_shape(s->shards[0]);
    if (op == TB_REDUCE_MEAN && !tb_dtype_is_float(first.dtype))
        return tb__error(TB_ERR_DTYPE, "%s: mean of %s values (floating dtypes only)", fn,
                         tb_dtype_name(first.dtype));
    for (j = 1; j < s->count; j++) {
        tb_shape sj = tb_tensor_shape(s->shards[j]);
        if (!tb_shape_equal(&sj, &first)) {
            char a[96], b[96];
            tb_shape_format(&first, a, sizeof a);
            tb_shape_format(&sj, b, sizeof b);
            return tb__error(TB_ERR_SHAPE,
                             "%s: the shards are not of equal shape: shard 0 is %s, shard %zu %s",
                             fn, a, j, b);
        }
    }
    return TB_OK;
}

/* The all-reduce of in[0..n) into res (each NULL on entry), the inputs checked. */
static tb_status tb__shard_all_reduce_run(const char *fn, tb_sharded *const *in, size_t n,
                                          tb_reduce_op op, tb_sharded **res) {
    tb_tensor **sums = (tb_tensor **)tb__calloc(n, sizeof *sums);
    size_t i, j;
    tb_status st;
    if (sums == NULL) return TB_ERR_OUT_OF_MEMORY;
    st = tb__shard_sync(in, n);
    for (i = 0; i < n && st == TB_OK; i++) {
        tb_device d0 = tb_tensor_device(in[i]->shards[0]);
        sums[i] = tb__shard_reduce_on(in[i]->shards, in[i]->count, op, &d0);
        if (sums[i] == NULL) st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
    }
    if (st == TB_OK) st = tb__sync_by_device(sums, n, "tb_sync");
    /* the first device's sum, and a handle of its own on every other device */
    for (i = 0; i < n && st == TB_OK; i++) {
        tb_tensor *t[TB_MAX_SHARDS];
        t[0] = tb_tensor_retain(sums[i]);
        for (j = 1; j < in[i]->count; j++) {
            tb_device dj = tb_tensor_device(in[i]->shards[j]);
            t[j] = tb__shard_replica(sums[i], &dj);
            if (t[j] == NULL) {
                tb__shard_release_all(t, j);
                st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
                break;
            }
        }
        if (st == TB_OK) {
            res[i] = tb__shard_adopt(fn, t, in[i]->count, TB_REPLICATE, 0);
            if (res[i] == NULL) st = tb_last_status();
        }
    }
    tb__shard_release_all(sums, n);
    tb__free(sums);
    return st;
}

TBDEF tb_status tb_sharded_all_reduce_many(tb_sharded *const *in, size_t n, tb_reduce_op op,
                                           tb_sharded **out) {
    static const char fn[] = "tb_sharded_all_reduce_many";
    tb_sharded **res;
    size_t i;
    tb_status st = TB_OK;
    if (in == NULL || out == NULL) {
        st = tb__shard_null(fn, in == NULL ? "in" : "out");
        for (i = 0; out != NULL && i < n; i++)
            out[i] = NULL;
        return st;
    }
    for (i = 0; i < n && st == TB_OK; i++) {
        st = in[i] == NULL ? tb__shard_null(fn, "an input") : tb__shard_reduce_check(fn, in[i], op);
    }
    res = (tb_sharded **)tb__calloc(n == 0 ? 1 : n, sizeof *res);
    if (st == TB_OK && res == NULL) st = TB_ERR_OUT_OF_MEMORY;
    /* out may be in: it is written only once every input was read */
    if (st == TB_OK && n > 0) st = tb__shard_all_reduce_run(fn, in, n, op, res);
    for (i = 0; i < n; i++) {
        if (st != TB_OK && res != NULL) tb_sharded_release(res[i]);
        out[i] = st == TB_OK ? res[i] : NULL;
    }
    tb__free(res);
    return st;
}

TBDEF tb_sharded *tb_sharded_all_reduce(tb_sharded *s, tb_reduce_op op) {
    tb_sharded *out = NULL;
    if (s == NULL) {
        tb__shard_null("tb_sharded_all_reduce", "s");
        return NULL;
    }
    if (tb_sharded_all_reduce_many(&s, 1, op, &out) != TB_OK) return NULL;
    return out;
}

/* The whole tensor on `device` from shards already synced. */
static tb_tensor *tb__shard_whole_on(tb_sharded *s, const tb_device *device) {
    tb_tensor *t[TB_MAX_SHARDS], *r;
    size_t j;
    if (s->placement == TB_PARTIAL)
        return tb__shard_reduce_on(s->shards, s->count, TB_REDUCE_SUM, device);
    if (s->placement == TB_REPLICATE) {
        for (j = 0; j < s->count; j++) {
            if (tb__shard_same_device(s->shards[j], device)) return tb_tensor_retain(s->shards[j]);
        }
        return tb__shard_own(tb_to_device(s->shards[0], device));
    }
    for (j = 0; j < s->count; j++) {
        t[j] = tb__shard_move(s->shards[j], device);
        if (t[j] == NULL) {
            tb__shard_release_all(t, j);
            return NULL;
        }
    }
    r = s->count == 1 ? tb_tensor_retain(t[0]) : tb__shard_own(tb_concat(t, s->count, s->axis));
    tb__shard_release_all(t, s->count);
    return r;
}

TBDEF tb_tensor *tb_sharded_to_tensor(tb_sharded *s, const tb_device *device) {
    tb_tensor *r;
    tb_device d;
    if (s == NULL) {
        tb__shard_null("tb_sharded_to_tensor", "s");
        return NULL;
    }
    d = device != NULL ? *device : tb_tensor_device(s->shards[0]);
    /* a replica already there needs no sync; the tensor handed back is the open scope's like
       any returned handle */
    if (s->placement != TB_REPLICATE && tb__shard_sync(&s, 1) != TB_OK) return NULL;
    r = tb__shard_whole_on(s, &d);
    return tb__scope_claim(r);
}

/* A new sharded tensor with the same shards. */
static tb_sharded *tb__shard_clone(tb_sharded *s) {
    tb_sharded *c = tb__shard_alloc(s->count);
    size_t i;
    if (c == NULL) return NULL;
    for (i = 0; i < s->count; i++)
        c->shards[i] = tb_tensor_retain(s->shards[i]);
    c->placement = s->placement;
    c->axis = s->axis;
    c->shape = s->shape;
    return c;
}

/* pieces[i * n + j] = rows [lo_i, hi_i) along `axis` of shard j, of the whole dim d, synced
   (each is then moved to device i). */
static tb_status tb__shard_pieces(tb_sharded *s, int32_t axis, int64_t d, tb_tensor **pieces) {
    size_t i, j, n = s->count;
    tb_status st = tb__shard_sync(&s, 1);
    for (i = 0; i < n && st == TB_OK; i++) {
        int64_t lo, hi;
        tb__shard_bounds(d, n, i, &lo, &hi);
        for (j = 0; j < n && st == TB_OK; j++) {
            pieces[i * n + j] = tb__shard_own(tb_slice(s->shards[j], axis, lo, hi, 1));
            if (pieces[i * n + j] == NULL) st = tb_last_status();
        }
    }
    if (st == TB_OK) st = tb__sync_by_device(pieces, n * n, "tb_sync");
    return st;
}

/* Shards i of the reduce-scatter (partial) or all-to-all (sharded along another axis) of s
   into placement TB_SHARD along `axis`. */
static tb_sharded *tb__shard_scatter(const char *fn, tb_sharded *s, int32_t axis) {
    size_t i, j, n = s->count;
    tb_tensor **pieces = (tb_tensor **)tb__calloc(n * n, sizeof *pieces), *t[TB_MAX_SHARDS];
    tb_status st;
    if (pieces == NULL) return NULL;
    memset(t, 0, sizeof t);
    st = tb__shard_pieces(s, axis, s->shape.dims[axis], pieces);
    for (i = 0; i < n && st == TB_OK; i++) {
        tb_device di = tb_tensor_device(s->shards[i]);
        if (s->placement == TB_PARTIAL) {
            t[i] = tb__shard_reduce_on(pieces + i * n, n, TB_REDUCE_SUM, &di);
        } else {
            tb_tensor *m[TB_MAX_SHARDS];
            for (j = 0; j < n; j++) {
                m[j] = tb__shard_move(pieces[i * n + j], &di);
                if (m[j] == NULL) break;
            }
            t[i] = j == n ? tb__shard_own(tb_concat(m, n, s->axis)) : NULL;
            tb__shard_release_all(m, j);
        }
        if (t[i] == NULL) st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
    }
    tb__shard_release_all(pieces, n * n);
    tb__free(pieces);
    if (st != TB_OK) {
        tb__shard_release_all(t, n);
        return NULL;
    }
    return tb__shard_adopt(fn, t, n, TB_SHARD, axis);
}

/* Shard, replicate or partial to another placement that needs the whole tensor per device
   (all-gather) or on the first device only (partial). */
static tb_sharded *tb__shard_gather(const char *fn, tb_sharded *s, tb_placement placement) {
    tb_tensor *t[TB_MAX_SHARDS];
    size_t i, n = s->count;
    memset(t, 0, sizeof t);
    if (s->placement != TB_REPLICATE && tb__shard_sync(&s, 1) != TB_OK) return NULL;
    for (i = 0; i < n; i++) {
        tb_device di = tb_tensor_device(s->shards[i]);
        if (placement == TB_PARTIAL && i > 0)
            t[i] = tb__shard_own(tb_zeros(&s->shape, &di));
        else
            t[i] = tb__shard_whole_on(s, &di);
        if (t[i] == NULL) {
            tb__shard_release_all(t, i);
            return NULL;
        }
    }
    return tb__shard_adopt(fn, t, n, placement, 0);
}

TBDEF tb_sharded *tb_sharded_redistribute(tb_sharded *s, tb_placement placement, int32_t axis) {
    static const char fn[] = "tb_sharded_redistribute";
    int32_t ax = -1;
    size_t i;
    if (s == NULL) {
        tb__shard_null(fn, "s");
        return NULL;
    }
    if (tb__shard_placement_ok(fn, placement) != TB_OK) return NULL;
    if (placement == TB_SHARD && tb__shard_axis(fn, axis, s->shape.rank, &ax) != TB_OK) return NULL;
    if (placement == s->placement && ax == s->axis) return tb__shard_clone(s);
    if (placement == TB_REPLICATE && s->placement == TB_PARTIAL)
        return tb_sharded_all_reduce(s, TB_REDUCE_SUM);
    if (placement != TB_SHARD) return tb__shard_gather(fn, s, placement);
    if (s->placement != TB_REPLICATE) return tb__shard_scatter(fn, s, ax);
    { /* replicate to shard: each device keeps its rows (a view) */
        tb_tensor *t[TB_MAX_SHARDS];
        for (i = 0; i < s->count; i++) {
            int64_t lo, hi;
            tb__shard_bounds(s->shape.dims[ax], s->count, i, &lo, &hi);
            t[i] = tb__shard_own(tb_slice(s->shards[i], ax, lo, hi, 1));
            if (t[i] == NULL) {
                tb__shard_release_all(t, i);
                return NULL;
            }
        }
        return tb__shard_adopt(fn, t, s->count, TB_SHARD, ax);
    }
}

/* ---- ops per shard ---- */

/* "shard(axis 1 of f32[8,4])", "replicate", "partial" */
static void tb__shard_describe(const tb_sharded *s, char *buf, size_t cap) {
    char shape[96];
    tb_shape_format(&s->shape, shape, sizeof shape);
    if (s->placement == TB_SHARD)
        snprintf(buf, cap, "shard(axis %d of %s)", (int)s->axis, shape);
    else
        snprintf(buf, cap, "%s %s", tb_placement_name(s->placement), shape);
}

/* a and b have the same count of shards on the same devices, shard by shard. */
static tb_status tb__shard_devices_match(const char *fn, const tb_sharded *a, const tb_sharded *b) {
    size_t i;
    if (a->count != b->count)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %zu shards and %zu shards", fn, a->count,
                         b->count);
    for (i = 0; i < a->count; i++) {
        tb_device da = tb_tensor_device(a->shards[i]), db = tb_tensor_device(b->shards[i]);
        if (!tb_device_equal(&da, &db)) {
            char x[64], y[64];
            tb_device_format(&da, x, sizeof x);
            tb_device_format(&db, y, sizeof y);
            return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: shard %zu is on %s and on %s", fn, i, x,
                             y);
        }
    }
    return TB_OK;
}

static tb_status tb__shard_refuse_partial(const char *fn, const tb_sharded *s, const char *what) {
    if (s->placement != TB_PARTIAL) return TB_OK;
    return tb__error(TB_ERR_UNSUPPORTED,
                     "%s: %s is partial (a sum over the devices): redistribute it to "
                     "TB_REPLICATE or TB_SHARD first",
                     fn, what);
}

/* What shard i of a replica `r` meets shard i of `sh` (sharded at position p from the end,
   the whole dim d) with: the replica's rows of that shard along its aligned dim k (a view),
   or the whole replica where it has no such dim or broadcasts it (size 1). */
static tb_tensor *tb__shard_align(const char *fn, tb_sharded *r, tb_sharded *sh, int32_t p,
                                  size_t i) {
    tb_shape rs = r->shape;
    int32_t k = rs.rank - p;
    int64_t lo = 0;
    size_t j;
    if (k < 0 || rs.dims[k] == 1) return tb_tensor_retain(r->shards[i]);
    if (rs.dims[k] != sh->shape.dims[sh->axis]) {
        char a[96], b[96];
        tb_shape_format(&sh->shape, a, sizeof a);
        tb_shape_format(&rs, b, sizeof b);
        tb__error(TB_ERR_SHAPE,
                  "%s: the replicated %s meets the axis %d of the sharded %s with %lld rows, not "
                  "%lld or 1: redistribute one of them first",
                  fn, b, (int)sh->axis, a, (long long)rs.dims[k],
                  (long long)sh->shape.dims[sh->axis]);
        return NULL;
    }
    for (j = 0; j < i; j++)
        lo += tb_tensor_shape(sh->shards[j]).dims[sh->axis];
    return tb__shard_own(
        tb_slice(r->shards[i], k, lo, lo + tb_tensor_shape(sh->shards[i]).dims[sh->axis], 1));
}

/* Whether a and b, both sharded, split alike at the same position from the end. */
static tb_status tb__shard_same_split(const char *fn, const tb_sharded *a, int32_t a_axis,
                                      const tb_sharded *b, int32_t b_axis) {
    size_t i;
    for (i = 0; i < a->count; i++) {
        if (tb_tensor_shape(a->shards[i]).dims[a_axis] !=
            tb_tensor_shape(b->shards[i]).dims[b_axis])
            return tb__error(TB_ERR_SHAPE,
                             "%s: the operands are split differently (shard %zu: %lld and %lld "
                             "rows)",
                             fn, i, (long long)tb_tensor_shape(a->shards[i]).dims[a_axis],
                             (long long)tb_tensor_shape(b->shards[i]).dims[b_axis]);
    }
    return TB_OK;
}

TBDEF tb_sharded *tb_sharded_unary(tb_tensor *(*op)(tb_tensor *), tb_sharded *x) {
    static const char fn[] = "tb_sharded_unary";
    tb_tensor *t[TB_MAX_SHARDS];
    size_t i;
    if (op == NULL || x == NULL) {
        tb__shard_null(fn, op == NULL ? "op" : "x");
        return NULL;
    }
    if (op != tb_neg && tb__shard_refuse_partial(fn, x, "x") != TB_OK) return NULL;
    for (i = 0; i < x->count; i++) {
        tb_shape in = tb_tensor_shape(x->shards[i]), out;
        tb_device want = tb_tensor_device(x->shards[i]);
        int32_t k;
        bool same;
        t[i] = tb__shard_own(op(x->shards[i]));
        if (t[i] == NULL) {
            tb__shard_release_all(t, i);
            return NULL;
        }
        /* elementwise only: a view or a reduction would leave the placement wrong */
        out = tb_tensor_shape(t[i]);
        same = out.rank == in.rank && tb__shard_same_device(t[i], &want);
        for (k = 0; same && k < in.rank; k++)
            same = out.dims[k] == in.dims[k];
        if (!same) {
            tb__error(TB_ERR_SHAPE,
                      "%s: op changed shard %zu's shape or device (an elementwise op keeps "
                      "them; tb_sharded_map takes any other)",
                      fn, i);
            tb__shard_release_all(t, i + 1);
            return NULL;
        }
    }
    return tb__shard_adopt(fn, t, x->count, x->placement, x->axis);
}

/* The operands of shard i of a binary op or matmul: a sharded side's shard, and the other
   side's replica sliced to it where their dims meet (position p from the end; 0: never). */
static tb_status tb__shard_operands(const char *fn, tb_sharded *a, tb_sharded *b, int32_t p,
                                    size_t i, tb_tensor **x, tb_tensor **y) {
    *x = a->placement == TB_REPLICATE && b->placement == TB_SHARD && p > 0
             ? tb__shard_align(fn, a, b, p, i)
             : tb_tensor_retain(a->shards[i]);
    *y = b->placement == TB_REPLICATE && a->placement == TB_SHARD && p > 0
             ? tb__shard_align(fn, b, a, p, i)
             : tb_tensor_retain(b->shards[i]);
    if (*x != NULL && *y != NULL) return TB_OK;
    tb_tensor_release(*x);
    tb_tensor_release(*y);
    return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
}

/* op shard by shard; the result's placement and its axis at position p from the end of the
   result (p 0: not sharded). */
static tb_sharded *tb__shard_pairwise(const char *fn, tb_tensor *(*op)(tb_tensor *, tb_tensor *),
                                      tb_sharded *a, tb_sharded *b, int32_t align_p,
                                      tb_placement out, int32_t out_p) {
    tb_tensor *t[TB_MAX_SHARDS];
    size_t i;
    for (i = 0; i < a->count; i++) {
        tb_tensor *x, *y;
        if (tb__shard_operands(fn, a, b, align_p, i, &x, &y) != TB_OK) {
            tb__shard_release_all(t, i);
            return NULL;
        }
        t[i] = tb__shard_own(op(x, y));
        tb_tensor_release(x);
        tb_tensor_release(y);
        if (t[i] == NULL) {
            tb__shard_release_all(t, i);
            return NULL;
        }
    }
    return tb__shard_adopt(fn, t, a->count, out,
                           out == TB_SHARD ? tb_tensor_shape(t[0]).rank - out_p : 0);
}

TBDEF tb_sharded *tb_sharded_binary(tb_tensor *(*op)(tb_tensor *, tb_tensor *), tb_sharded *a,
                                    tb_sharded *b) {
    static const char fn[] = "tb_sharded_binary";
    int32_t pa, pb;
    if (op == NULL || a == NULL || b == NULL) {
        tb__shard_null(fn, op == NULL ? "op" : a == NULL ? "a" : "b");
        return NULL;
    }
    if (tb__shard_devices_match(fn, a, b) != TB_OK ||
        tb__shard_refuse_partial(fn, a, "a") != TB_OK ||
        tb__shard_refuse_partial(fn, b, "b") != TB_OK)
        return NULL;
    pa = a->placement == TB_SHARD ? a->shape.rank - a->axis : 0;
    pb = b->placement == TB_SHARD ? b->shape.rank - b->axis : 0;
    if (pa > 0 && pb > 0) {
        if (pa != pb) {
            tb__error(TB_ERR_SHAPE,
                      "%s: a is sharded along axis %d of %d dims and b along axis %d of %d: "
                      "the sharded axes do not line up",
                      fn, (int)a->axis, (int)a->shape.rank, (int)b->axis, (int)b->shape.rank);
            return NULL;
        }
        if (tb__shard_same_split(fn, a, a->axis, b, b->axis) != TB_OK) return NULL;
    }
    if (pa == 0 && pb == 0) return tb__shard_pairwise(fn, op, a, b, 0, TB_REPLICATE, 0);
    return tb__shard_pairwise(fn, op, a, b, pa > 0 ? pa : pb, TB_SHARD, pa > 0 ? pa : pb);
}

TBDEF tb_sharded *tb_sharded_matmul(tb_sharded *a, tb_sharded *b) {
    static const char fn[] = "tb_sharded_matmul";
    int32_t ra, rb;
    if (a == NULL || b == NULL) {
        tb__shard_null(fn, a == NULL ? "a" : "b");
        return NULL;
    }
    if (tb__shard_devices_match(fn, a, b) != TB_OK) return NULL;
    ra = a->shape.rank;
    rb = b->shape.rank;
    if (a->placement == TB_REPLICATE && b->placement == TB_REPLICATE)
        return tb__shard_pairwise(fn, tb_matmul, a, b, 0, TB_REPLICATE, 0);
    if (a->placement == TB_SHARD && b->placement == TB_REPLICATE && ra >= 2 && a->axis < ra - 1) {
        int32_t p = ra - a->axis; /* rows (2) or a batch dim (3 and up) */
        return tb__shard_pairwise(fn, tb_matmul, a, b, p >= 3 ? p : 0, TB_SHARD,
                                  rb == 1 ? p - 1 : p);
    }
    if (a->placement == TB_REPLICATE && b->placement == TB_SHARD && rb >= 2 && b->axis == rb - 1)
        return tb__shard_pairwise(fn, tb_matmul, a, b, 0, TB_SHARD, 1);
    if (a->placement == TB_SHARD && b->placement == TB_SHARD && a->axis == ra - 1 &&
        b->axis == (rb >= 2 ? rb - 2 : 0)) {
        if (tb__shard_same_split(fn, a, a->axis, b, b->axis) != TB_OK) return NULL;
        return tb__shard_pairwise(fn, tb_matmul, a, b, 0, TB_PARTIAL, 0);
    }
    {
        char x[160], y[160];
        tb__shard_describe(a, x, sizeof x);
        tb__shard_describe(b, y, sizeof y);
        tb__error(TB_ERR_UNSUPPORTED,
                  "%s: a %s times b %s: supported are a's rows or batch sharded with b "
                  "replicated, b's columns sharded with a replicated, the contracted dim sharded "
                  "on both, and both replicated (redistribute first)",
                  fn, x, y);
    }
    return NULL;
}

/* ---- reductions ---- */

typedef tb_tensor *(*tb__shard_reduce_fn)(tb_tensor *, const int32_t *, size_t, bool);

/* Whether `axis` is among the reduced axes (none given: all), which are checked. */
static tb_status tb__shard_reduces(const char *fn, const tb_sharded *x, const int32_t *axes,
                                   size_t num_axes, int32_t axis, bool *hit, int32_t *before) {
    size_t i;
    *hit = num_axes == 0;
    *before = 0;
    if (num_axes > 0 && axes == NULL) return tb__shard_null(fn, "axes");
    for (i = 0; i < num_axes; i++) {
        int32_t a = 0;
        if (tb__shard_axis(fn, axes[i], x->shape.rank, &a) != TB_OK) return tb_last_status();
        if (a == axis) *hit = true;
        if (a < axis) (*before)++;
    }
    return TB_OK;
}

static tb_tensor *tb__shard_div_fn(void *user, tb_tensor *const *shards, size_t index) {
    (void)index;
    return tb_div_scalar(shards[0], *(const double *)user);
}

/* One shard's part of a reduction. Over the sharded axis: a sum for a mean (divided by the
   whole count after the all-reduce), and f16 and bf16 sums and means in f32 (rounded once at
   the end, as tb_sum and tb_mean do); elsewhere the op itself. */
static tb_tensor *tb__shard_reduce_one(tb_tensor *shard, const int32_t *axes, size_t num_axes,
                                       bool keepdim, tb_reduce_op op, bool hit) {
    static const tb__shard_reduce_fn per[TB_REDUCE_OP_COUNT] = {tb_sum, tb_mean, tb_max, tb_min,
                                                                tb_prod};
    tb_dtype dt = tb_tensor_shape(shard).dtype;
    tb_tensor *w, *r;
    if (!hit) return tb__shard_own(per[op](shard, axes, num_axes, keepdim));
    if (op != TB_REDUCE_SUM && op != TB_REDUCE_MEAN)
        return tb__shard_own(per[op](shard, axes, num_axes, keepdim));
    if (dt != TB_F16 && dt != TB_BF16) return tb__shard_own(tb_sum(shard, axes, num_axes, keepdim));
    w = tb__shard_own(tb_cast(shard, TB_F32));
    r = w != NULL ? tb__shard_own(tb_sum(w, axes, num_axes, keepdim)) : NULL;
    tb_tensor_release(w);
    return r;
}

static tb_tensor *tb__shard_cast_fn(void *user, tb_tensor *const *shards, size_t index) {
    (void)index;
    return tb_cast(shards[0], *(const tb_dtype *)user);
}

/* After the all-reduce of a sum or mean over the sharded axis: the mean's division by the whole
   count, and f16 and bf16 back from f32. Consumes r. */
static tb_sharded *tb__shard_reduce_finish(tb_sharded *x, tb_sharded *r, const int32_t *axes,
                                           size_t num_axes, tb_reduce_op op) {
    tb_dtype dt = x->shape.dtype;
    tb_sharded *next;
    if (r != NULL && op == TB_REDUCE_MEAN) {
        double n = 1;
        int32_t k;
        size_t i;
        for (k = 0; k < x->shape.rank; k++) {
            bool reduced = num_axes == 0;
            for (i = 0; i < num_axes; i++)
                reduced = reduced || axes[i] == k || axes[i] + x->shape.rank == k;
            if (reduced) n *= (double)x->shape.dims[k];
        }
        next = tb_sharded_map(&r, 1, tb__shard_div_fn, &n, TB_REPLICATE, 0);
        tb_sharded_release(r);
        r = next;
    }
    if (r != NULL && (op == TB_REDUCE_SUM || op == TB_REDUCE_MEAN) &&
        (dt == TB_F16 || dt == TB_BF16)) {
        next = tb_sharded_map(&r, 1, tb__shard_cast_fn, &dt, TB_REPLICATE, 0);
        tb_sharded_release(r);
        r = next;
    }
    return r;
}

static tb_status tb__shard_reduce_check_args(const char *fn, tb_sharded *x, tb_reduce_op op) {
    if (x->placement == TB_PARTIAL && op != TB_REDUCE_SUM && op != TB_REDUCE_MEAN)
        return tb__shard_refuse_partial(fn, x, "x"); /* sums and means are linear; not the rest */
    if (x->placement == TB_PARTIAL && x->shape.dtype == TB_BOOL)
        return tb__error(TB_ERR_UNSUPPORTED,
                         "%s: x is partial bool (its values combine by or, not by a sum): "
                         "redistribute it first",
                         fn);
    if (op == TB_REDUCE_MEAN && !tb_dtype_is_float(x->shape.dtype))
        return tb__error(TB_ERR_DTYPE, "%s: mean of %s values (floating dtypes only)", fn,
                         tb_dtype_name(x->shape.dtype));
    return TB_OK;
}

static tb_sharded *tb__shard_reduce(const char *fn, tb_sharded *x, const int32_t *axes,
                                    size_t num_axes, bool keepdim, tb_reduce_op op) {
    tb_tensor *t[TB_MAX_SHARDS];
    tb_sharded *part, *r;
    int32_t before = 0;
    bool hit = false, max_min;
    size_t i, first = 0;
    if (x == NULL) {
        tb__shard_null(fn, "x");
        return NULL;
    }
    if (tb__shard_reduce_check_args(fn, x, op) != TB_OK ||
        tb__shard_reduces(fn, x, axes, num_axes, x->axis, &hit, &before) != TB_OK)
        return NULL;
    hit = hit && x->placement == TB_SHARD;
    memset(t, 0, sizeof t);
    /* a max or min over the sharded axis skips empty shards: they take a copy of the first
       non-empty shard's result, which changes no max or min */
    max_min = hit && (op == TB_REDUCE_MAX || op == TB_REDUCE_MIN);
    if (max_min) {
        while (first + 1 < x->count && tb_tensor_shape(x->shards[first]).dims[x->axis] == 0)
            first++;
    }
    t[first] = tb__shard_reduce_one(x->shards[first], axes, num_axes, keepdim, op, hit);
    for (i = 0; i < x->count && t[first] != NULL; i++) {
        tb_device di = tb_tensor_device(x->shards[i]);
        if (i == first) continue;
        t[i] = max_min && tb_tensor_shape(x->shards[i]).dims[x->axis] == 0
                   ? tb__shard_replica(t[first], &di)
                   : tb__shard_reduce_one(x->shards[i], axes, num_axes, keepdim, op, hit);
        if (t[i] == NULL) break;
    }
    for (i = 0; i < x->count; i++) {
        if (t[i] == NULL) {
            tb__shard_release_all(t, x->count);
            return NULL;
        }
    }
    part = tb__shard_adopt(fn, t, x->count, hit ? TB_PARTIAL : x->placement,
                           keepdim ? x->axis : x->axis - before);
    if (part == NULL || !hit) return part;
    /* over the sharded axis: the all-reduce across the devices */
    r = tb_sharded_all_reduce(part, op == TB_REDUCE_MEAN ? TB_REDUCE_SUM : op);
    tb_sharded_release(part);
    return tb__shard_reduce_finish(x, r, axes, num_axes, op);
}

TBDEF tb_sharded *tb_sharded_sum(tb_sharded *x, const int32_t *axes, size_t num_axes,
                                 bool keepdim) {
    return tb__shard_reduce("tb_sharded_sum", x, axes, num_axes, keepdim, TB_REDUCE_SUM);
}

TBDEF tb_sharded *tb_sharded_mean(tb_sharded *x, const int32_t *axes, size_t num_axes,
                                  bool keepdim) {
    return tb__shard_reduce("tb_sharded_mean", x, axes, num_axes, keepdim, TB_REDUCE_MEAN);
}

TBDEF tb_sharded *tb_sharded_max(tb_sharded *x, const int32_t *axes, size_t num_axes,
                                 bool keepdim) {
    return tb__shard_reduce("tb_sharded_max", x, axes, num_axes, keepdim, TB_REDUCE_MAX);
}

TBDEF tb_sharded *tb_sharded_min(tb_sharded *x, const int32_t *axes, size_t num_axes,
                                 bool keepdim) {
    return tb__shard_reduce("tb_sharded_min", x, axes, num_axes, keepdim, TB_REDUCE_MIN);
}

/* ---- anything per shard, and gradients ---- */

TBDEF tb_sharded *tb_sharded_map(tb_sharded *const *inputs, size_t num_inputs, tb_shard_fn fn,
                                 void *user, tb_placement placement, int32_t axis) {
    static const char name[] = "tb_sharded_map";
    tb_tensor *t[TB_MAX_SHARDS], **args;
    size_t i, k, count;
    if (inputs == NULL || fn == NULL || num_inputs == 0) {
        if (num_inputs == 0 && inputs != NULL && fn != NULL)
            tb__error(TB_ERR_INVALID_ARGUMENT, "%s: no inputs", name);
        else
            tb__shard_null(name, fn == NULL ? "fn" : "inputs");
        return NULL;
    }
    for (k = 0; k < num_inputs; k++) {
        if (inputs[k] == NULL) {
            tb__shard_null(name, "an input");
            return NULL;
        }
        if (tb__shard_devices_match(name, inputs[0], inputs[k]) != TB_OK) return NULL;
    }
    count = inputs[0]->count;
    args = (tb_tensor **)tb__calloc(num_inputs, sizeof *args);
    if (args == NULL) return NULL;
    for (i = 0; i < count; i++) {
        tb_device want = tb_tensor_device(inputs[0]->shards[i]);
        tb__saved_error before;
        for (k = 0; k < num_inputs; k++)
            args[k] = inputs[k]->shards[i];
        tb__error_save(&before);
        t[i] = tb__shard_own(fn(user, args, i));
        if (t[i] != NULL && !tb__shard_same_device(t[i], &want)) {
            char d[64];
            tb_device_format(&want, d, sizeof d);
            tb__error(TB_ERR_INVALID_ARGUMENT,
                      "%s: fn returned shard %zu on another device than %s", name, i, d);
            tb_tensor_release(t[i]);
            t[i] = NULL;
        } else if (t[i] == NULL && tb_last_status() == before.status) {
            tb__error(TB_ERR_INVALID_ARGUMENT, "%s: fn returned NULL for shard %zu", name, i);
        }
        if (t[i] == NULL) {
            tb__shard_release_all(t, i);
            tb__free(args);
            return NULL;
        }
    }
    tb__free(args);
    return tb__shard_adopt(name, t, count, placement, axis);
}

/* grads of one device's loss with respect to its replicas (g: n tensors). */
static tb_status tb__shard_grad_one(const char *fn, tb_sharded *loss, tb_sharded *const *params,
                                    size_t n, size_t i, tb_tensor **g) {
    tb_tensor **in = (tb_tensor **)tb__calloc(n, sizeof *in);
    size_t j;
    tb_status st = TB_OK;
    if (in == NULL) return TB_ERR_OUT_OF_MEMORY;
    for (j = 0; j < n; j++)
        in[j] = params[j]->shards[i];
    st = tb_grad(loss->shards[i], NULL, in, n, g);
    for (j = 0; st == TB_OK && j < n; j++)
        tb__shard_own(g[j]);
    if (st != TB_OK) st = tb__error(st, "%s: device %zu: %s", fn, i, tb_last_error());
    tb__free(in);
    return st;
}

static tb_status tb__shard_grad_check(const char *fn, tb_sharded *loss, tb_sharded *const *params,
                                      size_t n, tb_sharded *const *also, size_t num_also) {
    size_t j;
    int64_t numel = 0;
    if (loss->placement != TB_PARTIAL || tb_shape_numel(&loss->shape, &numel) != TB_OK ||
        numel != 1)
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: the loss must be partial with one element per device (each "
                         "device's share of it)",
                         fn);
    for (j = 0; j < n; j++) {
        if (params[j] == NULL) return tb__shard_null(fn, "a parameter");
        if (tb__shard_devices_match(fn, loss, params[j]) != TB_OK) return tb_last_status();
        if (params[j]->placement != TB_REPLICATE)
            return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: parameter %zu is %s, not replicated", fn,
                             j, tb_placement_name(params[j]->placement));
    }
    if (num_also > 0 && also == NULL) return tb__shard_null(fn, "also");
    for (j = 0; j < num_also; j++) {
        if (also[j] == NULL) return tb__shard_null(fn, "an also tensor");
        if (tb__shard_devices_match(fn, loss, also[j]) != TB_OK) return tb_last_status();
    }
    return TB_OK;
}

/* Parameter j's gradients from every device as one partial sharded tensor (*out), or NULL
   where no device's loss depends on it; a device whose loss does not gets zeros. Takes over
   the gradients (g[i * n + j] is NULL afterwards). */
static tb_status tb__shard_grad_partial(const char *fn, tb_sharded *const *params, size_t n,
                                        size_t count, size_t j, tb_tensor **g, tb_sharded **out) {
    tb_tensor *t[TB_MAX_SHARDS];
    size_t i, have = 0;
    *out = NULL;
    for (i = 0; i < count; i++)
        have += g[i * n + j] != NULL;
    if (have == 0) return TB_OK;
    for (i = 0; i < count; i++) {
        t[i] = g[i * n + j];
        g[i * n + j] = NULL;
        if (t[i] == NULL) {
            tb_shape ps = tb_tensor_shape(params[j]->shards[i]);
            tb_device d = tb_tensor_device(params[j]->shards[i]);
            t[i] = tb__shard_own(tb_zeros(&ps, &d));
            if (t[i] == NULL) {
                size_t k;
                for (k = i + 1; k < count; k++) {
                    tb_tensor_release(g[k * n + j]);
                    g[k * n + j] = NULL;
                }
                tb__shard_release_all(t, i);
                return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
            }
        }
    }
    *out = tb__shard_adopt(fn, t, count, TB_PARTIAL, 0);
    return *out != NULL ? TB_OK : tb_last_status();
}

/* The gradients and the also tensors, all-reduced together: in[k] is a parameter's partial
   gradient or NULL (no path), or an also tensor. res gets the results (NULL for NULL). */
static tb_status tb__shard_grad_reduce(const char *fn, tb_sharded **in, size_t total,
                                       tb_sharded **res) {
    tb_sharded **live = (tb_sharded **)tb__calloc(total, sizeof *live),
               **got = (tb_sharded **)tb__calloc(total, sizeof *got);
    size_t k, m = 0;
    tb_status st = live != NULL && got != NULL ? TB_OK : TB_ERR_OUT_OF_MEMORY;
    for (k = 0; k < total && st == TB_OK; k++) {
        if (in[k] != NULL) live[m++] = in[k];
    }
    if (st == TB_OK && m > 0) st = tb__shard_all_reduce_run(fn, live, m, TB_REDUCE_SUM, got);
    for (k = 0; st != TB_OK && got != NULL && k < m; k++)
        tb_sharded_release(got[k]); /* those made before the failure */
    for (k = 0, m = 0; k < total && st == TB_OK; k++) {
        if (in[k] != NULL) res[k] = got[m++];
    }
    tb__free(live);
    tb__free(got);
    return st;
}

TBDEF tb_status tb_sharded_grad(tb_sharded *loss, tb_sharded *const *params, size_t n,
                                tb_sharded **grads, tb_sharded *const *also, size_t num_also,
                                tb_sharded **also_out) {
    static const char fn[] = "tb_sharded_grad";
    tb_tensor **g = NULL;
    tb_sharded **in = NULL, **res = NULL;
    size_t i, j, count, total = n + num_also;
    tb_status st;
    if (loss == NULL || (n > 0 && (params == NULL || grads == NULL)) ||
        (num_also > 0 && also_out == NULL)) {
        st = tb__shard_null(fn, loss == NULL     ? "loss"
                                : params == NULL ? "params"
                                : grads == NULL  ? "grads"
                                                 : "also_out");
        for (j = 0; grads != NULL && j < n; j++)
            grads[j] = NULL;
        for (j = 0; also_out != NULL && j < num_also; j++)
            also_out[j] = NULL;
        return st;
    }
    st = tb__shard_grad_check(fn, loss, params, n, also, num_also);
    count = loss->count;
    if (st == TB_OK && total > 0) {
        g = (tb_tensor **)tb__calloc(n * count + 1, sizeof *g);
        in = (tb_sharded **)tb__calloc(total, sizeof *in);
        res = (tb_sharded **)tb__calloc(total, sizeof *res);
        if (g == NULL || in == NULL || res == NULL) st = TB_ERR_OUT_OF_MEMORY;
    }
    for (i = 0; i < count && st == TB_OK && n > 0 && total > 0; i++)
        st = tb__shard_grad_one(fn, loss, params, n, i, g + i * n);
    for (j = 0; j < n && st == TB_OK; j++)
        st = tb__shard_grad_partial(fn, params, n, count, j, g, &in[j]);
    for (j = 0; j < num_also && st == TB_OK; j++) {
        in[n + j] = tb__shard_clone(also[j]);
        if (in[n + j] == NULL) st = TB_ERR_OUT_OF_MEMORY;
    }
    if (st == TB_OK && total > 0) st = tb__shard_grad_reduce(fn, in, total, res);
    /* the outputs are written only now: grads may be params, also_out may be also */
    for (j = 0; j < total; j++) {
        tb_sharded *r = st == TB_OK && res != NULL ? res[j] : NULL;
        if (st != TB_OK && res != NULL) tb_sharded_release(res[j]);
        if (j < n)
            grads[j] = r;
        else
            also_out[j - n] = r;
    }
    if (g != NULL) tb__shard_release_all(g, n * count);
    for (j = 0; in != NULL && j < total; j++)
        tb_sharded_release(in[j]);
    tb__free(g);
    tb__free(in);
    tb__free(res);
    return st;
}
