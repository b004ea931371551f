/* ===========================================================================================
   Distribution: the process-group registry and the collectives on tensors. Each collective
   first exchanges a small record of what every rank is about to do, so that ranks that went
   different ways get an error each instead of waiting on each other forever.
   =========================================================================================== */
#include "impl_begin.h"
#include "distributed_internal.h"

/* A receive buffer that a result tensor borrows: back in the group's pool when the tensor lets
   go of it, freed then if the group was left meanwhile (tb_shutdown). Under tb__pg.lock. */
typedef struct tb__pg_buffer {
    void *ptr;
    size_t cap;
    bool in_use, orphaned;
} tb__pg_buffer;
#define TB__PG_BUFFERS 4

struct tb_process_group {
    char name[TB_MAX_NAME + 1];
    tb_process_group_impl impl;
    bool joined;
    int32_t rank, size;
    uint64_t sequence; /* collectives called so far */
    tb__mutex lock;    /* one collective at a time */
    /* host staging, reused by every call (grown, never shrunk): the input's copy where its
       backend keeps it off the host, and the results' buffers */
    void *send;
    size_t send_cap;
    tb__pg_buffer *buffers[TB__PG_BUFFERS];
    int64_t *records; /* size records of the agreement exchange */
    size_t records_cap;
};

static struct {
    tb__mutex lock;
    tb_process_group **items;
    size_t count, cap;
    bool builtins_done;
} tb__pg = {TB__MUTEX_INIT, NULL, 0, 0, false};

TBDEF const char *tb_reduce_op_name(tb_reduce_op op) {
    switch (op) {
    case TB_REDUCE_SUM:
        return "sum";
    case TB_REDUCE_MEAN:
        return "mean";
    case TB_REDUCE_MAX:
        return "max";
    case TB_REDUCE_MIN:
        return "min";
    case TB_REDUCE_PRODUCT:
        return "product";
    default:
        return "invalid";
    }
}

/* ---- the registry ---- */

static tb_process_group *tb__pg_find(const char *name) {
    size_t i;
    for (i = 0; i < tb__pg.count; i++) {
        if (strcmp(tb__pg.items[i]->name, name) == 0) return tb__pg.items[i];
    }
    return NULL;
}

/* Adds a group (under tb__pg.lock); the impl is trusted. */
static tb_status tb__pg_add(const char *name, const tb_process_group_impl *impl) {
    tb_process_group *g;
    tb__mutex init = TB__MUTEX_INIT;
    if (tb__grow((void **)&tb__pg.items, &tb__pg.cap, tb__pg.count + 1, sizeof *tb__pg.items) !=
        TB_OK) {
        return TB_ERR_OUT_OF_MEMORY;
    }
    g = (tb_process_group *)tb__calloc(1, sizeof *g);
    if (g == NULL) return TB_ERR_OUT_OF_MEMORY;
    snprintf(g->name, sizeof g->name, "%s", name);
    g->impl = *impl;
    g->lock = init;
    g->rank = -1;
    g->size = 0;
    tb__pg.items[tb__pg.count++] = g;
    return TB_OK;
}

/* The built-in groups, registered on first use of the registry (under tb__pg.lock). */
static tb_status tb__pg_builtins(void) {
    tb_process_group_impl mpi;
    tb_status st;
    if (tb__pg.builtins_done) return TB_OK;
    mpi = tb__mpi_group_impl();
    st = tb__pg_add("mpi", &mpi);
    if (st == TB_OK) tb__pg.builtins_done = true;
    return st;
}

TBDEF tb_status tb_process_group_register(const char *name, const tb_process_group_impl *impl) {
    tb_status st;
    tb__ensure_setup();
    if (!tb__name_valid(name)) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_process_group_register: the name must be 1..%d characters of "
                         "[A-Za-z_][A-Za-z0-9_]*",
                         TB_MAX_NAME);
    }
    if (impl == NULL || impl->init == NULL || impl->all_reduce == NULL ||
        impl->all_gather == NULL || impl->broadcast == NULL || impl->barrier == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_process_group_register: %s: the impl needs init, all_reduce, "
                         "all_gather, broadcast and barrier",
                         name);
    }
    tb__mutex_lock(&tb__pg.lock);
    st = tb__pg_builtins();
    if (st == TB_OK && tb__pg_find(name) != NULL) {
        st = tb__error(TB_ERR_DUPLICATE, "tb_process_group_register: duplicate name: %s", name);
    }
    if (st == TB_OK) st = tb__pg_add(name, impl);
    tb__mutex_unlock(&tb__pg.lock);
    return st;
}

/* The registered names, comma-separated, into buf. */
static void tb__pg_names(char *buf, size_t cap) {
    size_t i, used = 0;
    buf[0] = '\0';
    for (i = 0; i < tb__pg.count && used + 1 < cap; i++) {
        int w = snprintf(buf + used, cap - used, "%s%s", i > 0 ? ", " : "", tb__pg.items[i]->name);
        if (w < 0) break;
        used += (size_t)w;
    }
}

TBDEF tb_process_group *tb_process_group_get(const char *name) {
    tb_process_group *g = NULL;
    char names[256];
    tb__ensure_setup();
    if (name == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_process_group_get: NULL name");
        return NULL;
    }
    tb__mutex_lock(&tb__pg.lock);
    if (tb__pg_builtins() == TB_OK) {
        g = tb__pg_find(name);
        if (g == NULL) {
            tb__pg_names(names, sizeof names);
            tb__error(TB_ERR_NOT_FOUND,
                      "tb_process_group_get: no process group named '%s' (registered: %s)", name,
                      names);
        } else if (!g->joined) {
            int32_t rank = -1, size = 0;
            tb_status st = g->impl.init(g->impl.user_data, &rank, &size);
            if (st == TB_OK && (size < 1 || rank < 0 || rank >= size)) {
                st = tb__error(TB_ERR_INTERNAL, "tb_process_group_get: %s: rank %d of %d", name,
                               (int)rank, (int)size);
            }
            if (st != TB_OK) {
                g = NULL;
            } else {
                g->rank = rank;
                g->size = size;
                g->sequence = 0;
                g->joined = true;
            }
        }
    }
    tb__mutex_unlock(&tb__pg.lock);
    return g;
}

TBDEF size_t tb_process_group_list(const char **names, size_t cap) {
    size_t i, k, n;
    tb__ensure_setup();
    tb__mutex_lock(&tb__pg.lock);
    tb__pg_builtins();
    n = tb__pg.count;
    /* names are unique: position k gets the smallest name after position k - 1's */
    for (k = 0; names != NULL && k < n && k < cap; k++) {
        const char *best = NULL;
        for (i = 0; i < n; i++) {
            const char *s = tb__pg.items[i]->name;
            if (k > 0 && strcmp(s, names[k - 1]) <= 0) continue;
            if (best == NULL || strcmp(s, best) < 0) best = s;
        }
        names[k] = best;
    }
    tb__mutex_unlock(&tb__pg.lock);
    return n;
}

TBDEF int32_t tb_process_group_rank(const tb_process_group *group) {
    return group != NULL ? group->rank : -1;
}

TBDEF int32_t tb_process_group_size(const tb_process_group *group) {
    return group != NULL ? group->size : -1;
}

TBDEF const char *tb_process_group_name(const tb_process_group *group) {
    return group != NULL ? group->name : NULL;
}

/* tb_shutdown: each joined group leaves (MPI_Finalize for mpi when MPI_Init was ours). */
static void tb__process_group_shutdown(void) {
    size_t i;
    tb__mutex_lock(&tb__pg.lock);
    for (i = 0; i < tb__pg.count; i++) {
        tb_process_group *g = tb__pg.items[i];
        size_t b;
        if (g->joined && g->impl.finalize != NULL) g->impl.finalize(g->impl.user_data);
        tb__free(g->send);
        for (b = 0; b < TB__PG_BUFFERS; b++) {
            tb__pg_buffer *buf = g->buffers[b];
            if (buf == NULL) continue;
            if (buf->in_use) { /* a tensor still reads it: freed when it lets go */
                buf->orphaned = true;
                continue;
            }
            tb__free(buf->ptr);
            tb__free(buf);
        }
        tb__free(g->records);
        tb__free(g);
    }
    tb__free(tb__pg.items);
    tb__pg.items = NULL;
    tb__pg.count = tb__pg.cap = 0;
    tb__pg.builtins_done = false;
    tb__mutex_unlock(&tb__pg.lock);
}

/* ---- the agreement exchange ---- */

typedef enum tb__collective {
    TB__COLL_ALL_REDUCE = 1,
    TB__COLL_ALL_GATHER,
    TB__COLL_REDUCE_SCATTER,
    TB__COLL_BROADCAST,
    TB__COLL_BARRIER
} tb__collective;

/* One rank's record: what it is about to do, and whether it could. */
enum {
    TB__REC_MAGIC,
    TB__REC_SEQUENCE,
    TB__REC_KIND,
    TB__REC_OP,
    TB__REC_ROOT,
    TB__REC_DTYPE,
    TB__REC_RANK,
    TB__REC_DIMS,
    TB__REC_OK = TB__REC_DIMS + TB_MAX_RANK,
    TB__REC_COUNT
};
#define TB__REC_MAGIC_VALUE 0x7462706752656331LL

/* A collective in progress (under the group's lock). */
typedef struct tb__pg_call {
    const char *fn;
    tb_process_group *group;
    tb__collective kind;
    tb_reduce_op op;
    int32_t root;
    tb_tensor *x;
    tb_shape shape;
    size_t count, bytes; /* of x */
    const void *send;    /* x's values on the host */
} tb__pg_call;

/* "all_reduce(sum) f32[10]" for a record. */
static void tb__pg_describe(const int64_t *rec, char *buf, size_t cap) {
    static const char *const kinds[] = {"?",         "all_reduce", "all_gather", "reduce_scatter",
                                        "broadcast", "barrier"};
    int64_t kind = rec[TB__REC_KIND];
    const char *k = kind >= 1 && kind <= 5 ? kinds[kind] : "?";
    char shape[96];
    tb_shape s;
    int32_t i;
    int w;
    if (kind == TB__COLL_BARRIER) {
        snprintf(buf, cap, "#%lld barrier", (long long)rec[TB__REC_SEQUENCE]);
        return;
    }
    memset(&s, 0, sizeof s);
    s.dtype = (tb_dtype)rec[TB__REC_DTYPE];
    s.rank = (int32_t)rec[TB__REC_RANK];
    if (s.rank >= 0 && s.rank <= TB_MAX_RANK && tb_dtype_is_valid(s.dtype)) {
        for (i = 0; i < s.rank; i++)
            s.dims[i] = rec[TB__REC_DIMS + i];
        tb_shape_format(&s, shape, sizeof shape);
    } else {
        snprintf(shape, sizeof shape, "(no tensor)");
    }
    if (kind == TB__COLL_ALL_REDUCE || kind == TB__COLL_REDUCE_SCATTER) {
        w = snprintf(buf, cap, "#%lld %s(%s) %s", (long long)rec[TB__REC_SEQUENCE], k,
                     tb_reduce_op_name((tb_reduce_op)rec[TB__REC_OP]), shape);
    } else if (kind == TB__COLL_BROADCAST) {
        w = snprintf(buf, cap, "#%lld %s(from %lld) %s", (long long)rec[TB__REC_SEQUENCE], k,
                     (long long)rec[TB__REC_ROOT], shape);
    } else {
        w = snprintf(buf, cap, "#%lld %s %s", (long long)rec[TB__REC_SEQUENCE], k, shape);
    }
    (void)w;
}

/* Exchanges this rank's record with every rank and checks that they agree. `local` is this
   rank's own status so far (its error is kept when it failed). On disagreement every rank
   returns an error and no rank moves data. */
static tb_status tb__pg_agree(tb__pg_call *c, tb_status local) {
    tb_process_group *g = c->group;
    int64_t rec[TB__REC_COUNT];
    size_t need = (size_t)g->size * sizeof rec;
    int32_t i, r;
    tb_status st;
    memset(rec, 0, sizeof rec);
    rec[TB__REC_MAGIC] = TB__REC_MAGIC_VALUE;
    rec[TB__REC_SEQUENCE] = (int64_t)g->sequence++;
    rec[TB__REC_KIND] = c->kind;
    rec[TB__REC_OP] =
        c->kind == TB__COLL_ALL_REDUCE || c->kind == TB__COLL_REDUCE_SCATTER ? (int64_t)c->op : 0;
    rec[TB__REC_ROOT] = c->kind == TB__COLL_BROADCAST ? c->root : 0;
    rec[TB__REC_DTYPE] = c->x != NULL ? (int64_t)c->shape.dtype : -1;
    rec[TB__REC_RANK] = c->x != NULL ? c->shape.rank : -1;
    for (i = 0; c->x != NULL && i < c->shape.rank; i++)
        rec[TB__REC_DIMS + i] = c->shape.dims[i];
    rec[TB__REC_OK] = local == TB_OK;
    if (tb__grow((void **)&g->records, &g->records_cap, need, 1) != TB_OK) {
        /* the other ranks wait in the exchange: nothing to do but tell this one */
        return tb_last_status();
    }
    st = g->impl.all_gather(g->impl.user_data, rec, g->records, sizeof rec);
    if (st != TB_OK) return st;
    for (r = 0; r < g->size; r++) {
        const int64_t *other = g->records + (size_t)r * TB__REC_COUNT;
        if (other[TB__REC_OK] == 0) {
            if (local != TB_OK) return local;
            return tb__error(TB_ERR_EXECUTE,
                             "%s: rank %d could not take part in collective #%lld (see its "
                             "error); no data moved",
                             c->fn, (int)r, (long long)rec[TB__REC_SEQUENCE]);
        }
    }
    for (r = 0; r < g->size; r++) {
        const int64_t *other = g->records + (size_t)r * TB__REC_COUNT;
        if (memcmp(other, rec, TB__REC_OK * sizeof rec[0]) != 0) {
            char mine[160], theirs[160];
            tb__pg_describe(rec, mine, sizeof mine);
            tb__pg_describe(other, theirs, sizeof theirs);
            return tb__error(TB_ERR_STATE,
                             "%s: the ranks of process group '%s' called different collectives: "
                             "rank %d called %s, rank %d called %s; no data moved",
                             c->fn, g->name, (int)g->rank, mine, (int)r, theirs);
        }
    }
    return TB_OK;
}

/* Room for `need` bytes in a staging buffer (kept and reused). */
static tb_status tb__pg_reserve(void **buf, size_t *cap, size_t need) {
    void *p;
    if (need <= *cap) return TB_OK;
    p = tb__alloc(need);
    if (p == NULL) return TB_ERR_OUT_OF_MEMORY;
    tb__free(*buf);
    *buf = p;
    *cap = need;
    return TB_OK;
}

/* x's values on the host: in place where its backend keeps them in host memory, else copied
   into the group's send buffer. Runs x's pending graph. */
static tb_status tb__pg_stage(tb__pg_call *c) {
    tb_process_group *g = c->group;
    tb_backend_data *d;
    void *host;
    if (c->bytes == 0) {
        c->send = NULL;
        return TB_OK;
    }
    d = tb_tensor_data(c->x);
    if (d == NULL) return tb_last_status();
    host = tb__host_data(d);
    if (host != NULL && tb_shape_equal(&d->shape, &c->shape)) {
        c->send = host;
        return TB_OK;
    }
    if (tb__pg_reserve(&g->send, &g->send_cap, c->bytes) != TB_OK) return TB_ERR_OUT_OF_MEMORY;
    if (tb_tensor_to_host(c->x, g->send, c->bytes) != TB_OK) return tb_last_status();
    c->send = g->send;
    return TB_OK;
}

/* Checks the group and the tensor, takes the group's lock, stages x when `stage`, and agrees
   with the other ranks. On success the caller holds the lock; on failure it is released. */
static tb_status tb__pg_begin(tb__pg_call *c, tb_status local, bool stage) {
    tb_status st = local;
    if (c->group == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: NULL process group", c->fn);
    if (!c->group->joined) {
        return tb__error(TB_ERR_STATE, "%s: process group '%s' was left (tb_shutdown)", c->fn,
                         c->group->name);
    }
    if (c->x != NULL) {
        int64_t numel = 0;
        c->shape = tb_tensor_shape(c->x);
        if (tb_shape_numel(&c->shape, &numel) != TB_OK) numel = 0;
        c->count = (size_t)numel;
        c->bytes = c->count * tb_dtype_size(c->shape.dtype);
    } else if (c->kind != TB__COLL_BARRIER && st == TB_OK) {
        st = tb_last_status() != TB_OK
                 ? tb_last_status()
                 : tb__error(TB_ERR_INVALID_ARGUMENT, "%s: NULL tensor", c->fn);
    }
    tb__mutex_lock(&c->group->lock);
    if (st == TB_OK && stage) st = tb__pg_stage(c);
    st = tb__pg_agree(c, st);
    if (st != TB_OK) tb__mutex_unlock(&c->group->lock);
    return st;
}

/* The dtype and op the group is asked for: bool travels as u8, where SUM and MAX are logical
   or and PRODUCT and MIN logical and (as torch.distributed does); MEAN is a SUM. */
static void tb__pg_wire(tb_dtype dtype, tb_reduce_op op, tb_dtype *wire_dtype,
                        tb_reduce_op *wire_op) {
    *wire_dtype = dtype == TB_BOOL ? TB_U8 : dtype;
    *wire_op = op == TB_REDUCE_MEAN ? TB_REDUCE_SUM : op;
    if (dtype == TB_BOOL) {
        *wire_op = op == TB_REDUCE_SUM || op == TB_REDUCE_MAX ? TB_REDUCE_MAX : TB_REDUCE_MIN;
    }
}

/* The checks of a reduction's arguments: the op and the dtype. */
static tb_status tb__pg_check_reduce(const char *fn, tb_tensor *x, tb_reduce_op op) {
    tb_shape s;
    if ((int)op < 0 || op >= TB_REDUCE_OP_COUNT) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: unknown reduce op %d", fn, (int)op);
    }
    if (x == NULL) return TB_OK;
    s = tb_tensor_shape(x);
    if (op == TB_REDUCE_MEAN && !tb_dtype_is_float(s.dtype)) {
        return tb__error(TB_ERR_DTYPE, "%s: mean of %s values (mean needs a floating dtype)", fn,
                         tb_dtype_name(s.dtype));
    }
    if (s.dtype != TB_F32 && s.dtype != TB_F64 && s.dtype != TB_I32 && s.dtype != TB_I64 &&
        s.dtype != TB_U8 && s.dtype != TB_BOOL) {
        return tb__error(TB_ERR_DTYPE, "%s: %s is not supported", fn, tb_dtype_name(s.dtype));
    }
    return TB_OK;
}

/* A result tensor lets go of its receive buffer. */
static void tb__pg_buffer_release(void *context) {
    tb__pg_buffer *buf = (tb__pg_buffer *)context;
    tb__mutex_lock(&tb__pg.lock);
    buf->in_use = false;
    if (buf->orphaned) {
        tb__free(buf->ptr);
        tb__free(buf);
    }
    tb__mutex_unlock(&tb__pg.lock);
}

/* A receive buffer of at least `need` bytes: a free one of the pool (grown when too small), a
   new one in a free slot, or one outside the pool (freed when released). NULL when memory ran
   out. */
static tb__pg_buffer *tb__pg_buffer_acquire(tb_process_group *g, size_t need) {
    tb__pg_buffer *buf = NULL;
    size_t b, slot = TB__PG_BUFFERS;
    if (need == 0) need = 1;
    tb__mutex_lock(&tb__pg.lock);
    for (b = 0; b < TB__PG_BUFFERS; b++) {
        tb__pg_buffer *it = g->buffers[b];
        if (it == NULL) {
            if (slot == TB__PG_BUFFERS) slot = b;
        } else if (!it->in_use && (buf == NULL || it->cap > buf->cap)) {
            buf = it; /* the largest free one */
        }
    }
    if (buf == NULL) {
        buf = (tb__pg_buffer *)tb__calloc(1, sizeof *buf);
        if (buf != NULL && slot < TB__PG_BUFFERS) g->buffers[slot] = buf;
        if (buf != NULL) buf->orphaned = slot == TB__PG_BUFFERS;
    }
    if (buf != NULL && buf->cap < need) {
        tb__free(buf->ptr);
        buf->cap = 0;
        buf->ptr = tb__alloc(need);
        if (buf->ptr != NULL) buf->cap = need;
    }
    if (buf != NULL && buf->ptr == NULL) {
        if (buf->orphaned) tb__free(buf);
        buf = NULL;
    }
    if (buf != NULL) buf->in_use = true;
    tb__mutex_unlock(&tb__pg.lock);
    return buf;
}

/* The result tensor over the receive buffer `buf`, on x's device (in place where the backend
   keeps host memory, else a copy; the buffer goes back to the pool when the tensor lets go of
   it, or now on failure). MEAN divides lazily. */
static tb_tensor *tb__pg_result(tb__pg_call *c, tb__pg_buffer *buf, const tb_shape *shape) {
    tb_device dev = tb_tensor_device(c->x);
    tb_tensor *t = tb__tensor_borrow(c->fn, buf->ptr, shape, &dev, tb__pg_buffer_release, buf), *m;
    if (t == NULL) tb__pg_buffer_release(buf);
    if (t == NULL || c->op != TB_REDUCE_MEAN) return t;
    m = tb_div_scalar(t, (double)c->group->size);
    tb_tensor_release(t);
    return m;
}

/* Ends a collective: the result over `buf` when st is TB_OK (else the buffer goes back), then
   the group's lock is released. */
static tb_tensor *tb__pg_end(tb__pg_call *c, tb_status st, tb__pg_buffer *buf,
                             const tb_shape *shape) {
    tb_tensor *t = NULL;
    if (st == TB_OK && buf != NULL) {
        t = tb__pg_result(c, buf, shape);
    } else if (buf != NULL) {
        tb__pg_buffer_release(buf);
    }
    tb__mutex_unlock(&c->group->lock);
    return t;
}

TBDEF tb_tensor *tb_all_reduce(tb_process_group *group, tb_tensor *x, tb_reduce_op op) {
    tb__pg_call c;
    tb__pg_buffer *buf;
    tb_dtype wd;
    tb_reduce_op wo;
    tb_status st;
    memset(&c, 0, sizeof c);
    c.fn = "tb_all_reduce", c.group = group, c.kind = TB__COLL_ALL_REDUCE, c.op = op, c.x = x;
    st = tb__pg_check_reduce(c.fn, x, op);
    if (tb__pg_begin(&c, st, true) != TB_OK) return NULL;
    tb__pg_wire(c.shape.dtype, op, &wd, &wo);
    buf = tb__pg_buffer_acquire(group, c.bytes);
    st = buf != NULL ? TB_OK : TB_ERR_OUT_OF_MEMORY;
    if (st == TB_OK && c.count > 0) {
        st = group->impl.all_reduce(group->impl.user_data, c.send, buf->ptr, c.count, wd, wo);
    }
    return tb__pg_end(&c, st, buf, &c.shape);
}

TBDEF tb_tensor *tb_all_gather(tb_process_group *group, tb_tensor *x) {
    tb__pg_call c;
    tb__pg_buffer *buf;
    tb_shape out;
    tb_status st;
    memset(&c, 0, sizeof c);
    c.fn = "tb_all_gather", c.group = group, c.kind = TB__COLL_ALL_GATHER, c.x = x;
    if (tb__pg_begin(&c, TB_OK, true) != TB_OK) return NULL;
    out = c.shape;
    if (out.rank == 0) {
        out.rank = 1;
        out.dims[0] = group->size;
    } else {
        out.dims[0] *= group->size;
    }
    buf = tb__pg_buffer_acquire(group, c.bytes * (size_t)group->size);
    st = buf != NULL ? TB_OK : TB_ERR_OUT_OF_MEMORY;
    if (st == TB_OK && c.bytes > 0) {
        st = group->impl.all_gather(group->impl.user_data, c.send, buf->ptr, c.bytes);
    }
    return tb__pg_end(&c, st, buf, &out);
}

/* reduce_scatter for a group without the entry: everything reduced with all_reduce into
   `recv` (the whole size), and rank r keeps block r at its start. */
static tb_status tb__pg_reduce_scatter_by_all_reduce(tb__pg_call *c, void *recv, tb_dtype wd,
                                                     tb_reduce_op wo, size_t block) {
    tb_process_group *g = c->group;
    size_t esize = tb_dtype_size(wd);
    tb_status st = g->impl.all_reduce(g->impl.user_data, c->send, recv, c->count, wd, wo);
    if (st == TB_OK && g->rank > 0) {
        memmove(recv, (char *)recv + (size_t)g->rank * block * esize, block * esize);
    }
    return st;
}

TBDEF tb_tensor *tb_reduce_scatter(tb_process_group *group, tb_tensor *x, tb_reduce_op op) {
    tb__pg_call c;
    tb__pg_buffer *buf;
    tb_shape s, out;
    tb_dtype wd;
    tb_reduce_op wo;
    tb_status st;
    size_t block;
    memset(&c, 0, sizeof c);
    c.fn = "tb_reduce_scatter", c.group = group, c.kind = TB__COLL_REDUCE_SCATTER, c.op = op;
    c.x = x;
    st = tb__pg_check_reduce(c.fn, x, op);
    s = tb_tensor_shape(x);
    if (st == TB_OK && x != NULL && group != NULL &&
        (s.rank < 1 || s.dims[0] % (group->size > 0 ? group->size : 1) != 0)) {
        char text[96];
        tb_shape_format(&s, text, sizeof text);
        st = tb__error(TB_ERR_SHAPE,
                       "%s: %s does not split along dim 0 into %d equal blocks (one per rank)",
                       c.fn, text, (int)group->size);
    }
    if (tb__pg_begin(&c, st, true) != TB_OK) return NULL;
    tb__pg_wire(c.shape.dtype, op, &wd, &wo);
    out = c.shape;
    out.dims[0] /= group->size;
    block = c.count / (size_t)group->size;
    buf = tb__pg_buffer_acquire(
        group, group->impl.reduce_scatter != NULL ? c.bytes / (size_t)group->size : c.bytes);
    st = buf != NULL ? TB_OK : TB_ERR_OUT_OF_MEMORY;
    if (st == TB_OK && block > 0 && group->impl.reduce_scatter != NULL) {
        st = group->impl.reduce_scatter(group->impl.user_data, c.send, buf->ptr, block, wd, wo);
    } else if (st == TB_OK && block > 0) {
        st = tb__pg_reduce_scatter_by_all_reduce(&c, buf->ptr, wd, wo, block);
    }
    return tb__pg_end(&c, st, buf, &out);
}

TBDEF tb_tensor *tb_broadcast(tb_process_group *group, tb_tensor *x, int32_t root) {
    tb__pg_call c;
    tb__pg_buffer *buf;
    tb_status st = TB_OK;
    memset(&c, 0, sizeof c);
    c.fn = "tb_broadcast", c.group = group, c.kind = TB__COLL_BROADCAST, c.root = root, c.x = x;
    if (group != NULL && (root < 0 || root >= group->size)) {
        st = tb__error(TB_ERR_INVALID_ARGUMENT, "%s: root %d is not a rank of a group of %d", c.fn,
                       (int)root, (int)group->size);
    }
    if (tb__pg_begin(&c, st, group != NULL && group->rank == root) != TB_OK) return NULL;
    buf = tb__pg_buffer_acquire(group, c.bytes);
    st = buf != NULL ? TB_OK : TB_ERR_OUT_OF_MEMORY;
    if (st == TB_OK && group->rank == root && c.bytes > 0) memcpy(buf->ptr, c.send, c.bytes);
    if (st == TB_OK && c.bytes > 0) {
        st = group->impl.broadcast(group->impl.user_data, buf->ptr, c.bytes, root);
    }
    return tb__pg_end(&c, st, buf, &c.shape);
}

TBDEF tb_status tb_barrier(tb_process_group *group) {
    tb__pg_call c;
    tb_status st;
    memset(&c, 0, sizeof c);
    c.fn = "tb_barrier", c.group = group, c.kind = TB__COLL_BARRIER;
    st = tb__pg_begin(&c, TB_OK, false);
    if (st != TB_OK) return st;
    st = group->impl.barrier(group->impl.user_data);
    tb__mutex_unlock(&group->lock);
    return st;
}
