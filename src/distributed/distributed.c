/* ===========================================================================================
   Distribution: the process-group registry and the collectives on tensors. Each collective
   first exchanges a small record of what every rank is about to do, so that ranks that went
   different ways get an error each instead of waiting on each other forever.
   =========================================================================================== */
#include "../impl_begin.h"
#include "distributed_internal.h"

/* A receive buffer that a result's data borrows: back in the group's pool when the data lets
   go of it (warm pages for the next collective), freed then if the group was left meanwhile
   (tb_shutdown). Under tb__pg.lock. */
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
    int32_t index;     /* in the registry: a COLLECTIVE node's group attribute */
    uint64_t sequence; /* collectives called so far */
    tb__mutex lock;    /* one collective at a time */
    /* host scratch, reused by every call (grown, never shrunk): f32 copies of f16 and bf16
       values, and the whole reduction of a reduce_scatter done by all_reduce */
    void *scratch;
    size_t scratch_cap;
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
    g->index = (int32_t)tb__pg.count;
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
        tb__free(g->scratch);
        for (b = 0; b < TB__PG_BUFFERS; b++) {
            tb__pg_buffer *buf = g->buffers[b];
            if (buf == NULL) continue;
            if (buf->in_use) { /* a data still reads it: freed when it lets go */
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
    bool has_shape; /* false: no tensor (a NULL argument) */
    tb_shape shape; /* of the operand */
    size_t count, bytes;
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
    rec[TB__REC_DTYPE] = c->has_shape ? (int64_t)c->shape.dtype : -1;
    rec[TB__REC_RANK] = c->has_shape ? c->shape.rank : -1;
    for (i = 0; c->has_shape && i < c->shape.rank; i++)
        rec[TB__REC_DIMS + i] = c->shape.dims[i];
    rec[TB__REC_OK] = local == TB_OK;
    if (tb__grow((void **)&g->records, &g->records_cap, need, 1) != TB_OK) {
        /* the other ranks wait in the exchange: nothing to do but tell this one */
        return tb_last_status();
    }
    st = g->impl.all_gather(g->impl.user_data, rec, g->records, sizeof rec);
    if (st != TB_OK) {
        char why[512];
        snprintf(why, sizeof why, "%.400s", tb_last_error());
        return tb__error(st,
                         "%s: rank %d: the exchange before collective #%lld of process group "
                         "'%s' failed: %s",
                         c->fn, (int)g->rank, (long long)rec[TB__REC_SEQUENCE], g->name, why);
    }
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

/* The dtype and op the group is asked for: bool travels as u8, where SUM and MAX are logical
   or and PRODUCT and MIN logical and (as torch.distributed does); f16 and bf16 travel as f32;
   MEAN is a SUM. */
static void tb__pg_wire(tb_dtype dtype, tb_reduce_op op, tb_dtype *wire_dtype,
                        tb_reduce_op *wire_op) {
    *wire_dtype = dtype == TB_BOOL ? TB_U8 : dtype;
    if (dtype == TB_F16 || dtype == TB_BF16) *wire_dtype = TB_F32;
    *wire_op = op == TB_REDUCE_MEAN ? TB_REDUCE_SUM : op;
    if (dtype == TB_BOOL) {
        *wire_op = op == TB_REDUCE_SUM || op == TB_REDUCE_MAX ? TB_REDUCE_MAX : TB_REDUCE_MIN;
    }
}

/* Room for `need` bytes of scratch (kept and reused). */
static tb_status tb__pg_reserve(tb_process_group *g, size_t need) {
    void *p;
    if (need <= g->scratch_cap) return TB_OK;
    p = tb__alloc(need);
    if (p == NULL) {
        return tb__error(TB_ERR_OUT_OF_MEMORY, "%s: no memory for %zu bytes of scratch", g->name,
                         need);
    }
    tb__free(g->scratch);
    g->scratch = p;
    g->scratch_cap = need;
    return TB_OK;
}

/* n reduced values of the wire dtype at `src` into `out` as `dtype`: MEAN divides by the world
   size (f16 and bf16 in f32, rounded once). src may be out. */
static void tb__pg_finish(const tb_process_group *g, tb_dtype dtype, tb_reduce_op op,
                          const void *src, void *out, size_t n) {
    size_t i;
    bool mean = op == TB_REDUCE_MEAN;
    if (dtype == TB_F16 || dtype == TB_BF16) {
        for (i = 0; i < n; i++) {
            float v = ((const float *)src)[i];
            if (mean) v /= (float)g->size;
            ((uint16_t *)out)[i] = dtype == TB_F16 ? tb_f32_to_f16(v) : tb_f32_to_bf16(v);
        }
        return;
    }
    if (src != out) memcpy(out, src, n * tb_dtype_size(dtype));
    for (i = 0; mean && dtype == TB_F32 && i < n; i++)
        ((float *)out)[i] /= (float)g->size;
    for (i = 0; mean && dtype == TB_F64 && i < n; i++)
        ((double *)out)[i] /= (double)g->size;
}

/* all_reduce (`scatter` false: out gets every value) or reduce_scatter (out gets block `rank`
   of count / size values) of `count` values of the call's dtype from in into out. */
static tb_status tb__pg_reduce(tb__pg_call *c, bool scatter, const void *in, void *out) {
    tb_process_group *g = c->group;
    tb_dtype dtype = c->shape.dtype, wd;
    tb_reduce_op wo;
    bool half = dtype == TB_F16 || dtype == TB_BF16;
    bool whole = scatter && g->impl.reduce_scatter == NULL; /* all_reduce, then keep a block */
    size_t n_out = scatter ? c->count / (size_t)g->size : c->count, i, wsize;
    size_t n_recv = whole ? c->count : n_out;
    const void *send = in;
    void *recv = out;
    tb_status st;
    if (n_out == 0) return TB_OK;
    tb__pg_wire(dtype, c->op, &wd, &wo);
    wsize = tb_dtype_size(wd);
    if (half || whole) {
        size_t front = half ? c->count * wsize : 0;
        if (tb__pg_reserve(g, front + n_recv * wsize) != TB_OK) return TB_ERR_OUT_OF_MEMORY;
        for (i = 0; half && i < c->count; i++) {
            uint16_t bits = ((const uint16_t *)in)[i];
            ((float *)g->scratch)[i] = dtype == TB_F16 ? tb_f16_to_f32(bits) : tb_bf16_to_f32(bits);
        }
        if (half) send = g->scratch;
        recv = (char *)g->scratch + front;
    }
    if (scatter && !whole) {
        st = g->impl.reduce_scatter(g->impl.user_data, send, recv, n_out, wd, wo);
    } else {
        st = g->impl.all_reduce(g->impl.user_data, send, recv, c->count, wd, wo);
    }
    if (st != TB_OK) return st;
    if (whole) recv = (char *)recv + (size_t)g->rank * n_out * wsize;
    tb__pg_finish(g, dtype, c->op, recv, out, n_out);
    return TB_OK;
}

/* Moves the data of an agreed collective (under the group's lock). */
static tb_status tb__pg_move(tb__pg_call *c, const void *in, void *out) {
    tb_process_group *g = c->group;
    switch (c->kind) {
    case TB__COLL_ALL_REDUCE:
        return tb__pg_reduce(c, false, in, out);
    case TB__COLL_REDUCE_SCATTER:
        return tb__pg_reduce(c, true, in, out);
    case TB__COLL_ALL_GATHER:
        if (c->bytes == 0) return TB_OK;
        return g->impl.all_gather(g->impl.user_data, in, out, c->bytes);
    case TB__COLL_BROADCAST:
        if (c->bytes == 0) return TB_OK;
        if (g->rank == c->root) memcpy(out, in, c->bytes);
        return g->impl.broadcast(g->impl.user_data, out, c->bytes, c->root);
    default:
        return tb__error(TB_ERR_INTERNAL, "%s: unknown collective %d", c->fn, (int)c->kind);
    }
}

static const char *tb__pg_function(int64_t kind) {
    static const char *const names[] = {"tb_barrier",        "tb_all_reduce", "tb_all_gather",
                                        "tb_reduce_scatter", "tb_broadcast",  "tb_barrier"};
    return kind >= 1 && kind <= 5 ? names[kind] : "tb_barrier";
}

/* The call of `kind` on `group` for an operand of `shape` (NULL: none). */
static void tb__pg_call_init(tb__pg_call *c, tb_process_group *group, tb__collective kind,
                             tb_reduce_op op, int32_t root, const tb_shape *shape) {
    memset(c, 0, sizeof *c);
    c->fn = tb__pg_function(kind);
    c->group = group;
    c->kind = kind;
    c->op = op;
    c->root = root;
    if (shape != NULL) {
        int64_t numel = 0;
        c->has_shape = true;
        c->shape = *shape;
        if (tb_shape_numel(shape, &numel) != TB_OK) numel = 0;
        c->count = (size_t)numel;
        c->bytes = c->count * tb_dtype_size(shape->dtype);
    }
}

/* The exchange of a call this rank cannot make (st): the other ranks get an error from theirs
   instead of waiting. This rank's error is kept. */
static void tb__pg_refuse(tb__pg_call *c, tb_status st) {
    tb__saved_error saved;
    tb__error_save(&saved);
    tb__mutex_lock(&c->group->lock);
    tb__pg_agree(c, st);
    tb__mutex_unlock(&c->group->lock);
    tb__error_restore(&saved);
}

/* A receive buffer lets go (the data that borrowed it, or the executor after a copy). */
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

/* The executor's host step for a COLLECTIVE node (through the wiring): the ranks agree, then
   the group moves the data from `in` into `dest` (the result's own memory), or without one
   into a receive buffer from the group's pool. */
static tb_status tb__process_group_run(const tb_node *node, tb_status local, const void *in,
                                       void *dest, void **out, void (**release)(void *context),
                                       void **context) {
    tb_process_group *g = NULL;
    tb__pg_buffer *buf = NULL;
    tb__pg_call c;
    const int64_t *at = node->attrs;
    size_t nbytes = 0;
    tb_status st;
    tb__mutex_lock(&tb__pg.lock);
    if (node->num_attrs == 5 && at[0] >= 0 && (size_t)at[0] < tb__pg.count) g = tb__pg.items[at[0]];
    tb__mutex_unlock(&tb__pg.lock);
    if (g == NULL || !g->joined || g->size != at[4]) {
        if (local != TB_OK) return local;
        return tb__error(TB_ERR_STATE,
                         "%s: the process group of this collective was left (tb_shutdown) since "
                         "it was recorded",
                         tb__pg_function(node->num_attrs == 5 ? at[1] : 0));
    }
    tb__pg_call_init(&c, g, (tb__collective)at[1], (tb_reduce_op)at[2], (int32_t)at[3],
                     &node->operands[0]->shape);
    /* before the exchange: a rank without memory tells the others */
    if (local == TB_OK && dest == NULL) {
        if (tb_shape_nbytes(&node->shape, &nbytes) == TB_OK) buf = tb__pg_buffer_acquire(g, nbytes);
        if (buf == NULL) {
            local = tb__error(TB_ERR_OUT_OF_MEMORY, "%s: no memory for a %zu-byte result", c.fn,
                              nbytes);
        }
    }
    tb__mutex_lock(&g->lock);
    st = tb__pg_agree(&c, local);
    if (st == TB_OK) st = tb__pg_move(&c, in, dest != NULL ? dest : buf->ptr);
    tb__mutex_unlock(&g->lock);
    if (st != TB_OK) {
        if (buf != NULL) tb__pg_buffer_release(buf);
        return st;
    }
    if (dest != NULL) return TB_OK;
    *out = buf->ptr;
    *release = tb__pg_buffer_release;
    *context = buf;
    return TB_OK;
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
    return TB_OK;
}

/* Records the COLLECTIVE node of x (the checks the caller made gave `st`). On a failure this
   rank takes part in the ranks' exchange now, so that the other ranks' syncs get an error, and
   NULL is returned with the error. */
static tb_tensor *tb__pg_record(tb_process_group *group, tb_tensor *x, tb__collective kind,
                                tb_reduce_op op, int32_t root, tb_status st) {
    const char *fn = tb__pg_function(kind);
    tb_node *xn = NULL, *node = NULL;
    tb_shape out;
    tb__pg_call c;
    int64_t attrs[5];
    if (group == NULL) {
        if (st == TB_OK) tb__error(TB_ERR_INVALID_ARGUMENT, "%s: NULL process group", fn);
        return NULL;
    }
    if (!group->joined) {
        tb__error(TB_ERR_STATE, "%s: process group '%s' was left (tb_shutdown)", fn, group->name);
        return NULL;
    }
    if (x == NULL && st == TB_OK)
        st = tb_last_status() != TB_OK ? tb_last_status()
                                       : tb__error(TB_ERR_INVALID_ARGUMENT, "%s: NULL tensor", fn);
    if (x != NULL) xn = tb__tensor_ir(x);
    if (st == TB_OK && xn == NULL)
        st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
    if (st == TB_OK) {
        attrs[0] = group->index;
        attrs[1] = kind;
        attrs[2] = kind == TB__COLL_ALL_REDUCE || kind == TB__COLL_REDUCE_SCATTER ? op : 0;
        attrs[3] = kind == TB__COLL_BROADCAST ? root : 0;
        attrs[4] = group->size;
        memset(&out, 0, sizeof out);
        st = tb__infer_shape_as(fn, TB_OP_COLLECTIVE, &xn->shape, 1, attrs, 5, &out);
    }
    if (st == TB_OK) {
        node = tb__emit(fn, TB_OP_COLLECTIVE, &out, &xn->device, &xn, 1, attrs, 5, NULL);
        if (node == NULL) st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
    }
    if (st == TB_OK) {
        uint64_t before = group->sequence;
        tb_tensor *t = tb__tensor_from_node(node); /* may sync a large graph at once */
        if (t != NULL) return t;
        /* the ranks met in that sync already: they know */
        if (group->sequence != before) return NULL;
        st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
    }
    tb__pg_call_init(&c, group, kind, op, root, xn != NULL ? &xn->shape : NULL);
    tb__pg_refuse(&c, st);
    return NULL;
}

TBDEF tb_tensor *tb_all_reduce(tb_process_group *group, tb_tensor *x, tb_reduce_op op) {
    tb_status st = tb__pg_check_reduce("tb_all_reduce", x, op);
    return tb__pg_record(group, x, TB__COLL_ALL_REDUCE, op, 0, st);
}

TBDEF tb_tensor *tb_all_gather(tb_process_group *group, tb_tensor *x) {
    return tb__pg_record(group, x, TB__COLL_ALL_GATHER, TB_REDUCE_SUM, 0, TB_OK);
}

TBDEF tb_tensor *tb_reduce_scatter(tb_process_group *group, tb_tensor *x, tb_reduce_op op) {
    tb_status st = tb__pg_check_reduce("tb_reduce_scatter", x, op);
    return tb__pg_record(group, x, TB__COLL_REDUCE_SCATTER, op, 0, st);
}

TBDEF tb_tensor *tb_broadcast(tb_process_group *group, tb_tensor *x, int32_t root) {
    tb_status st = TB_OK;
    if (group != NULL && (root < 0 || root >= group->size)) {
        st = tb__error(TB_ERR_INVALID_ARGUMENT,
                       "tb_broadcast: root %d is not a rank of a group of %d", (int)root,
                       (int)group->size);
    }
    return tb__pg_record(group, x, TB__COLL_BROADCAST, TB_REDUCE_SUM, st == TB_OK ? root : 0, st);
}

TBDEF tb_status tb_barrier(tb_process_group *group) {
    tb__pg_call c;
    tb_status st;
    if (group == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_barrier: NULL process group");
    if (!group->joined) {
        return tb__error(TB_ERR_STATE, "tb_barrier: process group '%s' was left (tb_shutdown)",
                         group->name);
    }
    tb__pg_call_init(&c, group, TB__COLL_BARRIER, TB_REDUCE_SUM, 0, NULL);
    tb__mutex_lock(&group->lock);
    st = tb__pg_agree(&c, TB_OK);
    if (st == TB_OK) st = group->impl.barrier(group->impl.user_data);
    tb__mutex_unlock(&group->lock);
    return st;
}
