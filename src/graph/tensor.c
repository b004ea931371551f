/* ===========================================================================================
   Lazy tensors: the C form of LTC's LazyTensor and the sync half of its LazyGraphExecutor: a
   tensor holds either a pending IR node or a materialised backend data; a sync collects the
   pending roots, hands the graph to the executor (executor.c), which looks its hash up in the
   computation cache, compiles on a miss and executes, and gives each tensor its result.
   =========================================================================================== */
#include "../impl_begin.h"

struct tb_tensor {
    int32_t refcount;
    tb_device device;
    tb_shape shape;
    tb_node *node;         /* the pending IR (owned), NULL once materialised */
    tb_backend_data *data; /* the materialised value (owned), NULL while pending */
    tb_node *data_node;    /* a DEVICE_DATA node over `data` for use as an operand (owned) */
    tb_tensor *live_prev;  /* the list of live tensors that tb_mark_step syncs */
    tb_tensor *live_next;
    bool live_linked;
    bool requires_grad; /* tb_set_requires_grad: its data node carries the flag */
    /* the node a synced value was computed from, kept (with node->value set) while it requires
       grad, so that tb_grad can still walk the history; owned, NULL otherwise */
    tb_node *history;
    /* the value it held before tb_assign gave it a pending one (owned, NULL otherwise): the
       sync that computes the new value may compute it into this value's buffer */
    tb_backend_data *donor;
    /* the scope that owns `scope_refs` of its references (tb_scope_begin; NULL: none) and its
       place in that scope's list; under tb__tensor_live_mutex (scope_refs changes atomically
       too: tb_tensor_release reads it without the lock) */
    struct tb__scope *scope;
    tb_tensor *scope_prev;
    tb_tensor *scope_next;
    int32_t scope_refs;
};

static tb__mutex tb__tensor_live_mutex = TB__MUTEX_INIT;
static tb_tensor *tb__tensor_live_head = NULL;

/* ---- small helpers ---- */

/* The error for a NULL tensor argument: the first error of a chain stays. */
static void tb__tensor_null_error(const char *func, const char *what) {
    if (tb_last_status() == TB_OK) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", func, what);
    }
}

/* Adds one to a refcount unless it already dropped to 0 (a tensor being destroyed). */
static bool tb__tensor_retain_if_alive(int32_t *refcount) {
#if defined(_MSC_VER) && !defined(__clang__)
    LONG seen = *(volatile LONG *)refcount;
    while (seen > 0) {
        LONG prev = InterlockedCompareExchange((volatile LONG *)refcount, seen + 1, seen);
        if (prev == seen) return true;
        seen = prev;
    }
    return false;
#else
    int32_t seen = __atomic_load_n(refcount, __ATOMIC_ACQUIRE);
    while (seen > 0) {
        if (__atomic_compare_exchange_n(refcount, &seen, seen + 1, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            return true;
        }
    }
    return false;
#endif
}

/* ---- scopes ----
   Each open scope is a record on its thread's stack (tb__scope_top, innermost first through
   `parent`) and on the process-wide list tb__scope_all (newest first), through which
   tb_shutdown finds the scopes of every thread. A tensor is in at most one scope's list. The
   lists and the tensors' scope fields are guarded by tb__tensor_live_mutex, which making and
   freeing a tensor take anyway: a tensor joins its scope with no extra lock and no allocation.
   tb_shutdown frees every record and bumps tb__scope_epoch: a thread whose stack is older has
   none open. */

typedef struct tb__scope {
    struct tb__scope *parent; /* the enclosing scope of the same thread */
    struct tb__scope *all_prev;
    struct tb__scope *all_next;
    tb_tensor *head; /* the tensors it owns references to, newest first */
} tb__scope;

static tb__scope *tb__scope_all = NULL;
static int32_t tb__scope_epoch = 0;
static TB__THREAD_LOCAL tb__scope *tb__scope_top = NULL;
static TB__THREAD_LOCAL int32_t tb__scope_top_epoch = 0;

/* The calling thread's innermost open scope, or NULL. */
static tb__scope *tb__scope_current(void) {
    if (tb__scope_top != NULL && tb__scope_top_epoch != TB__ATOMIC_LOAD(&tb__scope_epoch))
        tb__scope_top = NULL; /* tb_shutdown closed it */
    return tb__scope_top;
}

/* Gives scope s `refs` references of t, which is in no scope. Under the lock. */
static void tb__scope_link(tb__scope *s, tb_tensor *t, int32_t refs) {
    t->scope = s;
    t->scope_prev = NULL;
    t->scope_next = s->head;
    if (s->head != NULL) s->head->scope_prev = t;
    s->head = t;
    TB__ATOMIC_ADD(&t->scope_refs, refs);
}

/* Takes t out of its scope; returns how many of its references the scope owned. Under the
   lock. */
static int32_t tb__scope_unlink(tb_tensor *t) {
    int32_t refs;
    if (t->scope == NULL) return 0;
    if (t->scope_prev != NULL) {
        t->scope_prev->scope_next = t->scope_next;
    } else {
        t->scope->head = t->scope_next;
    }
    if (t->scope_next != NULL) t->scope_next->scope_prev = t->scope_prev;
    t->scope = NULL;
    t->scope_prev = NULL;
    t->scope_next = NULL;
    refs = TB__ATOMIC_LOAD(&t->scope_refs);
    TB__ATOMIC_ADD(&t->scope_refs, -refs);
    return refs;
}

/* One reference of t leaves the caller's hands: released (tb_tensor_release calls this), or
   taken over by a library object that keeps it (a tensor set, an optimizer's state). When
   every reference t has is a scope's, that reference was the scope's, which no longer owns it:
   a handle its user releases inside the scope is not released again at the end. Otherwise the
   reference is taken to be one of the caller's own (tb_tensor_retain). */
static void tb__scope_disown(tb_tensor *t) {
    if (TB__ATOMIC_LOAD(&t->scope_refs) == 0) return; /* in no scope: the common case */
    tb__mutex_lock(&tb__tensor_live_mutex);
    if (t->scope != NULL && TB__ATOMIC_LOAD(&t->refcount) <= TB__ATOMIC_LOAD(&t->scope_refs)) {
        if (TB__ATOMIC_LOAD(&t->scope_refs) > 1) {
            TB__ATOMIC_ADD(&t->scope_refs, -1);
        } else {
            (void)tb__scope_unlink(t);
        }
    }
    tb__mutex_unlock(&tb__tensor_live_mutex);
}

/* The reference a library call has just returned on this thread leaves the scope that took
   it: when t belongs to one of the calling thread's scopes, that scope owns one reference
   fewer (the caller's code keeps or releases it itself). Unlike tb__scope_disown it does not
   guess whose reference it is: call it right after the call that returned t. */
static void tb__scope_take(tb_tensor *t) {
    tb__scope *s = tb__scope_current();
    if (t == NULL || s == NULL || TB__ATOMIC_LOAD(&t->scope_refs) == 0) return;
    tb__mutex_lock(&tb__tensor_live_mutex);
    while (s != NULL && s != t->scope)
        s = s->parent;
    if (s != NULL) {
        if (TB__ATOMIC_LOAD(&t->scope_refs) > 1) {
            TB__ATOMIC_ADD(&t->scope_refs, -1);
        } else {
            (void)tb__scope_unlink(t);
        }
    }
    tb__mutex_unlock(&tb__tensor_live_mutex);
}

/* For a function that returns a new reference to a tensor that already exists (tb_dropout's
   input): the scope of the calling thread that owns t gets it, or the innermost scope when t
   is in none. A tensor of another thread's scope, or no scope open: the caller's. Returns t. */
static tb_tensor *tb__scope_claim(tb_tensor *t) {
    tb__scope *top = tb__scope_current(), *s = top;
    if (t == NULL || top == NULL) return t;
    tb__mutex_lock(&tb__tensor_live_mutex);
    if (t->scope == NULL) {
        tb__scope_link(top, t, 1);
    } else {
        while (s != NULL && s != t->scope)
            s = s->parent;
        if (s != NULL) TB__ATOMIC_ADD(&t->scope_refs, 1);
    }
    tb__mutex_unlock(&tb__tensor_live_mutex);
    return t;
}

/* Releases the references scope s owns, one tensor at a time (a release may call into a
   backend: never under the lock), then takes s off tb__scope_all and frees it. */
static void tb__scope_close(tb__scope *s) {
    for (;;) {
        tb_tensor *t;
        int32_t refs = 0;
        tb__mutex_lock(&tb__tensor_live_mutex);
        t = s->head;
        if (t != NULL) {
            refs = tb__scope_unlink(t);
        } else {
            if (s->all_prev != NULL) {
                s->all_prev->all_next = s->all_next;
            } else {
                tb__scope_all = s->all_next;
            }
            if (s->all_next != NULL) s->all_next->all_prev = s->all_prev;
        }
        tb__mutex_unlock(&tb__tensor_live_mutex);
        if (t == NULL) break;
        while (refs-- > 0)
            tb_tensor_release(t);
    }
    tb__free(s);
}

TBDEF tb_status tb_scope_begin(void) {
    tb__scope *s;
    tb__ensure_setup();
    if (!tb_is_setup()) return tb_last_status(); /* memory ran out setting the library up */
    s = (tb__scope *)tb__calloc(1, sizeof *s);
    if (s == NULL) return tb__error(TB_ERR_OUT_OF_MEMORY, "tb_scope_begin: out of memory");
    s->parent = tb__scope_current();
    tb__mutex_lock(&tb__tensor_live_mutex);
    s->all_next = tb__scope_all;
    if (tb__scope_all != NULL) tb__scope_all->all_prev = s;
    tb__scope_all = s;
    tb__mutex_unlock(&tb__tensor_live_mutex);
    tb__scope_top = s;
    tb__scope_top_epoch = TB__ATOMIC_LOAD(&tb__scope_epoch);
    return TB_OK;
}

TBDEF tb_status tb_scope_end(void) {
    tb__scope *s = tb__scope_current();
    if (s == NULL) {
        return tb__error(
            TB_ERR_STATE,
            "tb_scope_end: no scope is open on this thread (tb_scope_begin opens one)");
    }
    tb__scope_top = s->parent;
    tb__scope_close(s);
    return TB_OK;
}

TBDEF tb_tensor *tb_scope_keep(tb_tensor *tensor) {
    tb__scope *top = tb__scope_current();
    if (tensor == NULL) {
        tb__tensor_null_error("tb_scope_keep", "tensor");
        return NULL;
    }
    if (top == NULL) return tensor;
    tb__mutex_lock(&tb__tensor_live_mutex);
    if (tensor->scope == top) {
        int32_t refs = tb__scope_unlink(tensor);
        if (top->parent != NULL) tb__scope_link(top->parent, tensor, refs);
    }
    tb__mutex_unlock(&tb__tensor_live_mutex);
    return tensor;
}

/* tb_shutdown: closes every scope still open on any thread, newest first (a thread's inner
   scopes before its outer ones); afterwards no thread has a scope open. */
static void tb__scope_shutdown(void) {
    for (;;) {
        tb__scope *s;
        tb__mutex_lock(&tb__tensor_live_mutex);
        s = tb__scope_all;
        tb__mutex_unlock(&tb__tensor_live_mutex);
        if (s == NULL) break;
        tb__scope_close(s);
    }
    TB__ATOMIC_ADD(&tb__scope_epoch, 1);
    tb__scope_top = NULL;
}

/* ---- tensors ---- */

static tb_tensor *tb__tensor_new(const tb_device *device, const tb_shape *shape) {
    tb__scope *scope = tb__scope_current();
    tb_tensor *t = (tb_tensor *)tb__calloc(1, sizeof(tb_tensor));
    if (t == NULL) return NULL;
    t->refcount = 1;
    t->device = *device;
    t->shape = *shape;
    tb__mutex_lock(&tb__tensor_live_mutex);
    t->live_next = tb__tensor_live_head;
    if (tb__tensor_live_head != NULL) tb__tensor_live_head->live_prev = t;
    tb__tensor_live_head = t;
    t->live_linked = true;
    if (scope != NULL) tb__scope_link(scope, t, 1); /* the handle's reference is the scope's */
    tb__mutex_unlock(&tb__tensor_live_mutex);
    return t;
}

static void tb__tensor_destroy(tb_tensor *t) {
    tb__mutex_lock(&tb__tensor_live_mutex);
    (void)tb__scope_unlink(t); /* a handle released once too often: its scope must not again */
    if (t->live_linked) {
        if (t->live_prev != NULL) {
            t->live_prev->live_next = t->live_next;
        } else {
            tb__tensor_live_head = t->live_next;
        }
        if (t->live_next != NULL) t->live_next->live_prev = t->live_prev;
    }
    tb__mutex_unlock(&tb__tensor_live_mutex);
    if (t->node != NULL) tb__node_release(t->node);
    if (t->history != NULL) tb__node_release(t->history);
    if (t->data_node != NULL) tb__node_release(t->data_node);
    if (t->data != NULL) tb__data_release(t->data);
    if (t->donor != NULL) tb__data_release(t->donor);
    tb__free(t);
}

static tb_tensor *tb__tensor_from_data(tb_backend_data *data) {
    tb_tensor *t;
    if (data == NULL) return NULL;
    t = tb__tensor_new(&data->device, &data->shape);
    if (t == NULL) {
        tb__data_release(data);
        return NULL;
    }
    t->data = data;
    return t;
}

static tb_node *tb__tensor_ir(tb_tensor *tensor) {
    if (tensor == NULL) return NULL;
    if (tensor->node != NULL) return tensor->node;
    if (tensor->history != NULL) return tensor->history;
    if (tensor->data_node == NULL) {
        if (tensor->data == NULL) {
            tb__error(TB_ERR_INTERNAL, "tb__tensor_ir: a tensor with neither IR nor data");
            return NULL;
        }
        tensor->data_node = tb__node_device_data(tensor->data);
        if (tensor->data_node != NULL) tensor->data_node->requires_grad = tensor->requires_grad;
    }
    return tensor->data_node;
}

TBDEF tb_tensor *tb_tensor_retain(tb_tensor *tensor) {
    if (tensor != NULL) TB__ATOMIC_ADD(&tensor->refcount, 1);
    return tensor;
}

TBDEF void tb_tensor_release(tb_tensor *tensor) {
    if (tensor == NULL) return;
    tb__scope_disown(tensor);
    if (TB__ATOMIC_ADD(&tensor->refcount, -1) == 0) tb__tensor_destroy(tensor);
}

TBDEF tb_shape tb_tensor_shape(const tb_tensor *tensor) {
    tb_shape s;
    if (tensor != NULL) return tensor->shape;
    memset(&s, 0, sizeof(s));
    return s;
}

TBDEF tb_device tb_tensor_device(const tb_tensor *tensor) {
    tb_device d;
    if (tensor != NULL) return tensor->device;
    memset(&d, 0, sizeof(d));
    return d;
}

TBDEF const tb_node *tb_tensor_node(const tb_tensor *tensor) {
    return tensor != NULL ? tensor->node : NULL;
}

static void tb__exec_roots_free(tb__exec_roots *r) {
    size_t i;
    for (i = 0; i < r->count; i++)
        tb__node_release(r->nodes[i]);
    tb__free(r->nodes);
    tb__exec_map_free(&r->index);
    memset(r, 0, sizeof(*r));
}

/* `ir`: take every tensor's operand node (dumps) rather than only pending ones (sync).
   `one_device`: the tensors must share a device (a graph to run); text dumps take any. */
static tb_status tb__exec_roots_collect(tb__exec_roots *r, const char *func,
                                        tb_tensor *const *tensors, size_t count, bool ir,
                                        bool one_device) {
    size_t i;
    const tb_tensor *first = NULL;
    memset(r, 0, sizeof(*r));
    if (count > 0) {
        r->nodes = (tb_node **)tb__calloc(count, sizeof(tb_node *));
        if (r->nodes == NULL) return TB_ERR_OUT_OF_MEMORY;
    }
    for (i = 0; i < count; i++) {
        tb_tensor *t = tensors[i];
        tb_node *node = ir ? tb__tensor_ir(t) : t->node;
        if (node == NULL) {
            if (ir) {
                tb__exec_roots_free(r);
                return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
            }
            continue;
        }
        if (first == NULL) {
            first = t;
            r->device = t->device;
        } else if (one_device && !tb_device_equal(&first->device, &t->device)) {
            char a[64], b[64];
            tb__exec_device_text(&first->device, a);
            tb__exec_device_text(&t->device, b);
            tb__exec_roots_free(r);
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: tensors on %s and %s cannot be one graph (move them with "
                             "tb_to_device)",
                             func, a, b);
        }
        if (tb__exec_map_get(&r->index, node) != NULL) continue;
        if (tb__exec_map_put(&r->index, node, (int64_t)r->count) != TB_OK) {
            tb__exec_roots_free(r);
            return TB_ERR_OUT_OF_MEMORY;
        }
        tb__node_retain(node);
        r->nodes[r->count++] = node;
    }
    return TB_OK;
}

static tb_status tb__exec_check_list(const char *func, const char *what, tb_tensor *const *tensors,
                                     size_t count) {
    size_t i;
    if (tensors == NULL && count > 0) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s is NULL (count %lu)", func, what,
                         (unsigned long)count);
    }
    for (i = 0; i < count; i++) {
        if (tensors[i] == NULL) {
            if (tb_last_status() == TB_OK) {
                tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s[%lu] is NULL", func, what,
                          (unsigned long)i);
            }
            return TB_ERR_INVALID_ARGUMENT;
        }
    }
    return TB_OK;
}

/* ---- buffer donation ----
   A tensor given a pending value by tb_assign keeps the value it held before as its donor.
   When the sync that computes the new value is the last reader of the donor, the backend may
   compute the new value into the donor's buffer, so that an update in place needs no second
   copy of what it updates. The last reader: no live tensor holds the donor as its value, and
   no live tensor's pending graph outside this sync reads it. Histories kept for tb_grad do not
   count (as PyTorch's in-place updates, a gradient through an overwritten value is an error
   when it is computed, not a wrong value). */

/* Whether the pending graph below `node` reads one of the `n` values of `donors` (set in
   *hit, per donor); `seen` holds the nodes visited (shared across calls), `stop` the nodes this
   sync computes (their values will be at hand). */
static tb_status tb__exec_donor_readers(const tb_node *node, tb_backend_data *const *donors,
                                        size_t n, bool *hit, tb__exec_map *seen,
                                        const tb__exec_map *stop, const tb_node ***stack,
                                        size_t *cap) {
    size_t sp = 0, i;
    if (tb__exec_map_get(seen, node) != NULL) return TB_OK;
    if (tb__grow((void **)stack, cap, 1, sizeof **stack) != TB_OK) return TB_ERR_OUT_OF_MEMORY;
    if (tb__exec_map_put(seen, node, 0) != TB_OK) return TB_ERR_OUT_OF_MEMORY;
    (*stack)[sp++] = node;
    while (sp > 0) {
        const tb_node *m = (*stack)[--sp];
        const tb_backend_data *d = m->value != NULL ? m->value : m->data;
        for (i = 0; d != NULL && i < n; i++)
            if (donors[i] == d) hit[i] = true;
        if (m->value != NULL || tb__exec_map_get(stop, m) != NULL) continue;
        for (i = 0; i < m->num_operands; i++) {
            const tb_node *o = m->operands[i];
            if (o == NULL || tb__exec_map_get(seen, o) != NULL) continue;
            if (tb__exec_map_put(seen, o, 0) != TB_OK ||
                tb__grow((void **)stack, cap, sp + 1, sizeof **stack) != TB_OK)
                return TB_ERR_OUT_OF_MEMORY;
            (*stack)[sp++] = o;
        }
    }
    return TB_OK;
}

/* Per root of the sync of `tensors`: the donor its value may take, or NULL. Running out of
   memory here only means no donation. */
static void tb__exec_donors(tb_tensor *const *tensors, size_t count, const tb__exec_roots *roots,
                            tb_backend_data **donors) {
    tb_tensor **live = NULL, *t;
    const tb_node **stack = NULL;
    tb__exec_map seen;
    size_t i, j, n = 0, cap = 0, cap_stack = 0, num = 0;
    bool *hit = NULL;
    tb_status st = TB_OK;
    if (tb__desc()->check > 0) return; /* the check reads every parameter after the run */
    for (i = 0; i < count; i++) {
        const int64_t *at;
        t = tensors[i];
        if (t->donor == NULL || t->node == NULL || t->donor->tb__donated || t->donor->tb__shared)
            continue;
        at = tb__exec_map_get(&roots->index, t->node);
        if (at == NULL || donors[*at] != NULL) continue;
        for (j = 0; j < roots->count; j++)
            if (donors[j] == t->donor) break;
        if (j < roots->count) continue; /* one value, one buffer */
        donors[*at] = t->donor;
        num++;
    }
    if (num == 0) return;
    memset(&seen, 0, sizeof seen);
    hit = (bool *)tb__calloc(roots->count, sizeof(bool));
    if (hit == NULL) st = TB_ERR_OUT_OF_MEMORY;
    if (st == TB_OK) {
        tb__mutex_lock(&tb__tensor_live_mutex);
        for (t = tb__tensor_live_head; t != NULL && st == TB_OK; t = t->live_next) {
            bool reads;
            for (i = 0; i < roots->count; i++) /* its data node, if any, is over its data */
                if (donors[i] != NULL && t->data == donors[i]) hit[i] = true;
            /* pending graphs this sync leaves pending: walked below, outside the lock */
            reads = t->node != NULL && tb__exec_map_get(&roots->index, t->node) == NULL;
            if (!reads || !tb__tensor_retain_if_alive(&t->refcount)) continue;
            if (tb__grow((void **)&live, &cap, n + 1, sizeof *live) != TB_OK) {
                tb_tensor_release(t);
                st = TB_ERR_OUT_OF_MEMORY;
                break;
            }
            live[n++] = t;
        }
        tb__mutex_unlock(&tb__tensor_live_mutex);
    }
    for (i = 0; i < n && st == TB_OK; i++)
        st = tb__exec_donor_readers(live[i]->node, donors, roots->count, hit, &seen, &roots->index,
                                    &stack, &cap_stack);
    for (i = 0; i < roots->count; i++)
        if (st != TB_OK || (hit != NULL && hit[i])) donors[i] = NULL;
    for (i = 0; i < n; i++)
        tb_tensor_release(live[i]);
    tb__free(live);
    tb__free((void *)stack);
    tb__free(hit);
    tb__exec_map_free(&seen);
}

/* LTC's SyncTensorsGraph for tensors on one device. */
static tb_status tb__exec_sync(tb_tensor *const *tensors, size_t count, const char *func) {
    tb__exec_roots roots;
    tb__exec ex;
    tb_backend_data **values = NULL, **donors = NULL;
    tb_tensor **first = NULL; /* the first tensor given each root's value */
    size_t i;
    tb_status st = tb__exec_roots_collect(&roots, func, tensors, count, false, true);
    if (st != TB_OK) return st;
    if (roots.count == 0) {
        tb__exec_roots_free(&roots);
        return TB_OK;
    }
    st = tb__exec_init(&ex, func, &roots.device);
    if (st == TB_OK) {
        values = (tb_backend_data **)tb__calloc(roots.count, sizeof(tb_backend_data *));
        donors = (tb_backend_data **)tb__calloc(roots.count, sizeof(tb_backend_data *));
        first = (tb_tensor **)tb__calloc(roots.count, sizeof(tb_tensor *));
        if (values == NULL || donors == NULL || first == NULL) st = TB_ERR_OUT_OF_MEMORY;
    }
    if (st == TB_OK) tb__exec_donors(tensors, count, &roots, donors);
    if (st == TB_OK) st = tb__exec_materialize(&ex, roots.nodes, roots.count, donors, values);
    if (st == TB_OK) {
        /* LTC assigns each result to its tensors and replaces their IR by device data */
        for (i = 0; i < count; i++) {
            tb_tensor *t = tensors[i];
            const int64_t *at;
            size_t k;
            if (t->node == NULL) continue; /* materialised, or listed twice */
            at = tb__exec_map_get(&roots.index, t->node);
            if (at == NULL) continue;
            k = (size_t)*at;
            tb__data_retain(values[k]);
            t->data = values[k];
            if (t->donor != NULL) tb__data_release(t->donor); /* taken, or no longer needed */
            t->donor = NULL;
            if (t->node->requires_grad && !t->node->stop_grad) {
                t->history = t->node; /* tb_grad walks it; its value is set below */
            } else {
                tb__node_release(t->node);
            }
            t->node = NULL;
            /* tensors that shared a node share its device data node: one parameter later */
            if (t->history != NULL ||
                (first[k] != NULL && first[k]->requires_grad != t->requires_grad)) {
                /* its own operand node */
            } else if (first[k] == NULL) {
                first[k] = t;
            } else {
                tb_node *dn = tb__tensor_ir(first[k]);
                if (dn != NULL) {
                    tb__node_retain(dn);
                    t->data_node = dn;
                }
            }
        }
        /* a graph recorded earlier that still uses these nodes reads the values, not
           recomputing them */
        for (i = 0; i < roots.count; i++) {
            tb_node *node = roots.nodes[i];
            if (!tb__exec_is_param(node)) {
                tb__data_retain(values[i]);
                node->value = values[i];
            }
        }
    }
    if (values != NULL) {
        for (i = 0; i < roots.count; i++) {
            if (values[i] != NULL) tb__data_release(values[i]);
        }
    }
    tb__free(values);
    tb__free(donors);
    tb__free(first);
    tb__exec_roots_free(&roots);
    return st;
}

static tb_status tb__exec_sync_with(tb_tensor *const *tensors, size_t count, tb_node *const *extra,
                                    size_t n_extra, const char *func) {
    tb_tensor **all;
    size_t i, total = 0;
    tb_status st = TB_OK;
    if (n_extra == 0) return tb__exec_sync(tensors, count, func);
    all = (tb_tensor **)tb__calloc(count + n_extra, sizeof *all);
    if (all == NULL) return TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < count; i++)
        all[total++] = tensors[i];
    /* each extra node rides along as a tensor of its own: the sync gives its node the value */
    for (i = 0; i < n_extra && st == TB_OK; i++) {
        tb_tensor *t = tb__tensor_new(&extra[i]->device, &extra[i]->shape);
        if (t == NULL) {
            st = TB_ERR_OUT_OF_MEMORY;
            break;
        }
        tb__node_retain(extra[i]);
        t->node = extra[i];
        all[total++] = t;
    }
    if (st == TB_OK) st = tb__exec_sync(all, total, func);
    for (i = count; i < total; i++)
        tb_tensor_release(all[i]);
    tb__free(all);
    return st;
}

TBDEF tb_status tb_sync(tb_tensor *const *tensors, size_t count) {
    tb_status st;
    tb__ensure_setup();
    st = tb__exec_check_list("tb_sync", "tensors", tensors, count);
    if (st != TB_OK) return st;
    return tb__exec_sync(tensors, count, "tb_sync");
}

/* Syncs tensors that may live on several devices: one graph per device, of that device's
   tensors in their order, one device after the other (every device is tried; the first error
   is returned). */
static tb_status tb__sync_by_device(tb_tensor *const *tensors, size_t n, const char *func) {
    tb_tensor **t;
    size_t done = 0, i;
    tb_status result = TB_OK;
    if (n == 0) return TB_OK;
    t = (tb_tensor **)tb__alloc(n * sizeof *t);
    if (t == NULL) return TB_ERR_OUT_OF_MEMORY;
    memcpy(t, tensors, n * sizeof *t);
    while (done < n) { /* gather the tensors of the first device left, in order */
        size_t m = 0;
        tb_device device = t[done]->device;
        tb_status st;
        for (i = done; i < n; i++) {
            if (tb_device_equal(&t[i]->device, &device)) {
                tb_tensor *tmp = t[i];
                t[i] = t[done + m];
                t[done + m] = tmp;
                m++;
            }
        }
        st = tb__exec_sync(t + done, m, func);
        if (st != TB_OK && result == TB_OK) result = st;
        done += m;
    }
    tb__free(t);
    return result;
}

TBDEF tb_status tb_mark_step(void) {
    tb_tensor **live = NULL;
    size_t n = 0, cap = 0, i;
    tb_status result, st = TB_OK;
    tb_tensor *t;
    tb__ensure_setup();
    tb__metric_count("MarkStep", 1);
    tb__mutex_lock(&tb__tensor_live_mutex);
    for (t = tb__tensor_live_head; t != NULL; t = t->live_next) {
        if (t->node == NULL) continue;
        if (tb__grow((void **)&live, &cap, n + 1, sizeof(tb_tensor *)) != TB_OK) {
            st = TB_ERR_OUT_OF_MEMORY;
            break;
        }
        if (tb__tensor_retain_if_alive(&t->refcount)) live[n++] = t;
    }
    tb__mutex_unlock(&tb__tensor_live_mutex);
    if (st != TB_OK) {
        for (i = 0; i < n; i++)
            tb_tensor_release(live[i]);
        tb__free(live);
        return st;
    }
    result = tb__sync_by_device(live, n, "tb_mark_step");
    for (i = 0; i < n; i++)
        tb_tensor_release(live[i]);
    tb__free(live);
    return result;
}

/* ---- the graph size estimate and the automatic flush ---- */

#if defined(_MSC_VER) && !defined(__clang__)
#define TB__LOAD_U64(ptr)     ((uint64_t)InterlockedCompareExchange64((volatile LONG64 *)(ptr), 0, 0))
#define TB__STORE_U64(ptr, v) ((void)InterlockedExchange64((volatile LONG64 *)(ptr), (LONG64)(v)))
#else
#define TB__LOAD_U64(ptr)     __atomic_load_n((ptr), __ATOMIC_RELAXED)
#define TB__STORE_U64(ptr, v) __atomic_store_n((ptr), (v), __ATOMIC_RELAXED)
#endif

/* The number of computed (non-parameter) nodes in the pending graph of `node`: a walk. The
   walk's post-order also bounds each node it passes: node i's graph is among the first i
   (computed) nodes of the order, so a smaller bound is stored where a node had a larger one. */
static tb_status tb__exec_graph_count(tb_node *node, uint64_t *out) {
    tb__exec_walk w;
    tb_status st;
    size_t i;
    uint64_t c = 0;
    memset(&w, 0, sizeof(w));
    st = tb__exec_walk_add(&w, "tb_sync", &node, 1);
    *out = w.num_order - w.num_params;
    for (i = 0; st == TB_OK && i < w.num_order; i++) {
        tb_node *n = (tb_node *)w.order[i]; /* the bound is the only field written */
        if (tb__exec_is_param(n)) continue;
        c++;
        if (TB__LOAD_U64(&n->graph_size) > c) TB__STORE_U64(&n->graph_size, c);
    }
    tb__exec_walk_free(&w);
    return st;
}

/* The automatic flush. Each node keeps an upper bound of its graph's computed nodes, the
   smaller of two: 1 + the operands' bounds (exact for chains; a subgraph reached through two
   operands counts twice, so in graphs that read values often, as a normalisation does, it
   grows exponentially), and the span of ids from the lowest id of a computed node in the
   graph to the node's own (node ids only grow, so no node is counted twice; nodes made in
   between for other graphs count too). Only a bound above the limit costs a walk; its exact
   count replaces the bound, and the nodes it passed get smaller bounds where it can. Flushing
   already when the exact count is above half the limit keeps graphs that share subgraphs heavily (x
   = x + x) from walking at every op once they come near the limit. */
static TB__THREAD_LOCAL int tb__no_auto_flush = 0; /* see impl_begin.h */

/* The bound of `node` from its operands' (*first: the lowest id its graph can hold). */
static uint64_t tb__node_bound_of(const tb_node *node, uint64_t *first_out) {
    uint64_t sum = 1, first = node->id, f;
    uint32_t i;
    for (i = 0; i < node->num_operands; i++) {
        const tb_node *operand = node->operands[i];
        uint64_t s;
        if (tb__exec_is_param(operand)) continue;
        s = TB__LOAD_U64(&operand->graph_size);
        s = s > 0 ? s : 1;
        sum = sum + s < sum ? UINT64_MAX : sum + s;
        /* 0: a node made without a bound (a graph's copy), whose graph may hold any older node */
        f = operand->first_id > 0 ? operand->first_id : 1;
        if (f < first) first = f;
    }
    *first_out = first;
    return sum < node->id - first + 1 ? sum : node->id - first + 1;
}

static uint64_t tb__node_flush_bound(tb_node *node) {
    node->graph_size = tb__node_bound_of(node, &node->first_id);
    return node->graph_size;
}

static tb_status tb__tensor_auto_flush(tb_tensor *t) {
    tb_node *node = t->node;
    uint64_t bound = TB__LOAD_U64(&node->graph_size), limit, exact = 0;
    tb_status st;
    uint64_t first;
    if (bound == 0) bound = tb__node_bound_of(node, &first); /* one tb__emit did not make */
    limit = tb__desc()->max_graph_nodes > 0 ? (uint64_t)tb__desc()->max_graph_nodes : 100000u;
    if (bound <= limit || tb__no_auto_flush > 0) return TB_OK;
    tb__metric_count("FlushCountWalks", 1);
    st = tb__exec_graph_count(node, &exact);
    if (st != TB_OK) return st;
    TB__STORE_U64(&node->graph_size, exact);
    if (exact > limit / 2) {
        tb_tensor *list[1];
        char func[48];
        list[0] = t;
        snprintf(func, sizeof(func), "tb_%s", tb_op_name(node->op));
        st = tb__exec_sync(list, 1, func);
    }
    return st;
}

static tb_tensor *tb__tensor_from_node(tb_node *node) {
    tb_tensor *t;
    if (node == NULL) return NULL;
    t = tb__tensor_new(&node->device, &node->shape);
    if (t == NULL) {
        tb__node_release(node);
        return NULL;
    }
    t->node = node;
    if (!tb__exec_is_param(node) && tb__tensor_auto_flush(t) != TB_OK) {
        tb_tensor_release(t);
        return NULL;
    }
    return t;
}

/* ---- creation, reading back ---- */

/* A tensor over a copy of `data`, or over `data` itself when `borrow` and the device's
   backend can use host memory in place. `release` (may be NULL): on success called exactly
   once, by the data when it no longer needs `data` (borrowed) or before this returns (copied);
   on failure not called. */
static tb_tensor *tb__tensor_from_host(const char *func, const void *data, const tb_shape *shape,
                                       const tb_device *device, bool borrow,
                                       void (*release)(void *context), void *context) {
    tb_device dev;
    size_t nbytes = 0;
    tb_backend_data *d = NULL;
    tb_tensor *t;
    bool taken = false;
    tb__ensure_setup();
    if (shape == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: shape is NULL", func);
        return NULL;
    }
    if (tb_shape_validate(shape) != TB_OK || tb_shape_nbytes(shape, &nbytes) != TB_OK) return NULL;
    if (data == NULL && nbytes > 0) {
        char text[96];
        tb__shape_text(shape, text);
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: data is NULL for %s (%lu bytes)", func, text,
                  (unsigned long)nbytes);
        return NULL;
    }
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    /* the handle first, so that nothing can fail once the data holds `release` */
    t = tb__tensor_new(&dev, shape);
    if (t == NULL) return NULL;
    /* NULL from the borrow: this device cannot use host memory in place; copy */
    if (borrow) d = tb__data_borrow_host(&dev, shape, data, release, context);
    taken = d != NULL;
    if (d == NULL) d = tb__data_from_host(&dev, shape, data);
    if (d == NULL) {
        tb_tensor_release(t);
        return NULL;
    }
    /* under the live list's lock: the handle is on the list already, where a sync's donation
       walk reads t->data */
    tb__mutex_lock(&tb__tensor_live_mutex);
    t->data = d;
    tb__mutex_unlock(&tb__tensor_live_mutex);
    if (!taken && release != NULL) release(context);
    return t;
}

TBDEF tb_tensor *tb_tensor_from_host(const void *data, const tb_shape *shape,
                                     const tb_device *device) {
    return tb__tensor_from_host("tb_tensor_from_host", data, shape, device, false, NULL, NULL);
}

TBDEF tb_tensor *tb_tensor_from_host_borrowed(const void *data, const tb_shape *shape,
                                              const tb_device *device) {
    return tb__tensor_from_host("tb_tensor_from_host_borrowed", data, shape, device, true, NULL,
                                NULL);
}

static tb_tensor *tb__tensor_borrow(const char *func, const void *host, const tb_shape *shape,
                                    const tb_device *device, void (*release)(void *context),
                                    void *context) {
    return tb__tensor_from_host(func, host, shape, device, true, release, context);
}

/* Syncs one tensor if its value is pending. */
static tb_status tb__tensor_materialize(tb_tensor *t, const char *func) {
    tb_tensor *list[1];
    if (t->node == NULL) return TB_OK;
    list[0] = t;
    return tb__exec_sync(list, 1, func);
}

TBDEF tb_backend_data *tb_tensor_data(tb_tensor *tensor) {
    tb__ensure_setup();
    if (tensor == NULL) {
        tb__tensor_null_error("tb_tensor_data", "tensor");
        return NULL;
    }
    if (tb__tensor_materialize(tensor, "tb_tensor_data") != TB_OK) return NULL;
    return tensor->data;
}

TBDEF tb_status tb_tensor_to_host(tb_tensor *tensor, void *dst, size_t size) {
    size_t nbytes = 0;
    tb_status st;
    tb__ensure_setup();
    if (tensor == NULL) {
        tb__tensor_null_error("tb_tensor_to_host", "tensor");
        return TB_ERR_INVALID_ARGUMENT;
    }
    st = tb_shape_nbytes(&tensor->shape, &nbytes);
    if (st != TB_OK) return st;
    if (size != nbytes) {
        char text[96];
        tb__shape_text(&tensor->shape, text);
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_tensor_to_host: size is %lu bytes but %s needs %lu",
                         (unsigned long)size, text, (unsigned long)nbytes);
    }
    if (dst == NULL && nbytes > 0) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_to_host: dst is NULL");
    }
    st = tb__tensor_materialize(tensor, "tb_tensor_to_host");
    if (st != TB_OK) return st;
    if (nbytes == 0) return TB_OK;
    return tb__data_to_host(tensor->data, dst);
}

TBDEF tb_tensor *tb_to_device(tb_tensor *tensor, const tb_device *device) {
    tb_device dev;
    size_t nbytes = 0, cap = 0;
    void *host, *mapped;
    tb_backend_data *d;
    tb__ensure_setup();
    if (tensor == NULL) {
        tb__tensor_null_error("tb_to_device", "tensor");
        return NULL;
    }
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    if (tb__tensor_materialize(tensor, "tb_to_device") != TB_OK) return NULL;
    if (tb_device_equal(&dev, &tensor->device)) {
        tb_tensor *t;
        tb_node *dn = tb__tensor_ir(tensor);
        if (dn == NULL) return NULL;
        tb__data_retain(tensor->data);
        t = tb__tensor_from_data(tensor->data);
        if (t != NULL) {
            /* one device data node for both: the same value is one parameter of a graph */
            tb__node_retain(dn);
            t->data_node = dn;
        }
        return t;
    }
    /* one copy where either side's values lie in host memory (the cpu and native backends,
       an OpenCL device that shares the host's memory): from the source's memory into the new
       data, or from the source straight into the new data's mapped memory */
    host = tb__host_data(tensor->data);
    mapped = host == NULL ? tb__data_map_host(tensor->data) : NULL;
    if (host != NULL || mapped != NULL) {
        d = tb__data_from_host(&dev, &tensor->shape, host != NULL ? host : mapped);
        if (mapped != NULL && tb__data_unmap_host(tensor->data, mapped) != TB_OK && d != NULL) {
            tb__data_release(d);
            d = NULL;
        }
        return tb__tensor_from_data(d);
    }
    d = tb__data_new_mapped(&dev, &tensor->shape, &host);
    if (d != NULL) {
        tb_status st = tb__data_to_host(tensor->data, host), st2 = tb__data_unmap_host(d, host);
        if (st != TB_OK || st2 != TB_OK) {
            tb__data_release(d);
            d = NULL;
        }
        return tb__tensor_from_data(d);
    }
    /* else through the host array the executor keeps for such copies: warm pages, no
       allocation per copy once it is large enough */
    if (tb_shape_nbytes(&tensor->shape, &nbytes) != TB_OK) return NULL;
    host = tb__exec_stage_take(nbytes, &cap);
    if (host == NULL) {
        tb__error(TB_ERR_OUT_OF_MEMORY, "tb_to_device: no memory for %lu bytes of staging",
                  (unsigned long)nbytes);
        return NULL;
    }
    d = NULL;
    if (tb__data_to_host(tensor->data, host) == TB_OK) {
        d = tb__data_from_host(&dev, &tensor->shape, host);
    }
    tb__exec_stage_give(host, cap);
    return tb__tensor_from_data(d);
}

TBDEF tb_status tb_tensor_item(tb_tensor *tensor, double *out) {
    int64_t numel = 0;
    unsigned char host[16];
    tb_status st;
    tb__ensure_setup();
    if (tensor == NULL) {
        tb__tensor_null_error("tb_tensor_item", "tensor");
        return TB_ERR_INVALID_ARGUMENT;
    }
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_item: out is NULL");
    st = tb_shape_numel(&tensor->shape, &numel);
    if (st != TB_OK) return st;
    if (numel != 1) {
        char text[96];
        tb__shape_text(&tensor->shape, text);
        return tb__error(TB_ERR_SHAPE, "tb_tensor_item: %s has %lld elements, not 1", text,
                         (long long)numel);
    }
    st = tb__tensor_materialize(tensor, "tb_tensor_item");
    if (st != TB_OK) return st;
    st = tb__data_to_host(tensor->data, host);
    if (st != TB_OK) return st;
    *out = tb__exec_host_to_double(host, tensor->shape.dtype);
    return TB_OK;
}

/* ---- dumps ---- */

/* For tb_ir_dot: per position of the dump's walk `w`, the kernel that computes the node in the
   computation a sync of `roots` would run (-1: none), when the backend of the tensors' device
   says so. The computation stays referenced in *entry while the names are in use. A graph
   that cannot have clusters (mixed devices, a backend without get_node_kernel, a graph that
   does not compile) gives false and leaves the caller's error as it was: the dump is drawn
   without clusters. Memory running out is an error of the dump (*failed true, the error set):
   a dump without its clusters would pass for the complete one. */
static bool tb__exec_dump_kernels(const char *func, tb_tensor *const *tensors, size_t count,
                                  const tb__exec_roots *roots, const tb__exec_walk *w,
                                  int32_t **kernel, const char ***names,
                                  tb__comp_cache_entry **entry, bool *failed) {
    tb__exec ex;
    tb__exec_walk cw;
    tb_graph g;
    const tb_node **results = NULL;
    tb_node **nodes = NULL;
    tb__saved_error saved;
    bool hit, ok = false;
    uint64_t compile_ns;
    size_t i;
    tb_status st;
    *kernel = NULL;
    *names = NULL;
    *entry = NULL;
    *failed = false;
    if (roots->count == 0 || w->num_order == 0) return false;
    for (i = 0; i < count; i++) {
        if (!tb_device_equal(&tensors[i]->device, &roots->device)) return false;
    }
    tb__error_save(&saved);
    memset(&cw, 0, sizeof(cw));
    st = tb__exec_init(&ex, func, &roots->device);
    if (st == TB_OK && ex.vt->get_node_kernel == NULL) st = TB_ERR_UNSUPPORTED;
    if (st == TB_OK) {
        /* the graph a sync would compile once the eager fallback has run (tb_ir_backend_text) */
        cw.cut = ex.vt;
        st = tb__exec_walk_values(&cw, func, roots->nodes, roots->count, ex.vt, &nodes);
    }
    if (st == TB_OK) st = tb__exec_graph_make(&ex, &cw, nodes, roots->count, NULL, &results, &g);
    if (st == TB_OK && g.num_results == 0) st = TB_ERR_NOT_FOUND;
    if (st == TB_OK) st = tb__exec_compile(&ex, &g, &cw, entry, &hit, &compile_ns);
    if (st == TB_OK && !hit && tb_debug_level() >= 1)
        tb__exec_log_dump_compile(&ex, &g, compile_ns);
    if (st == TB_OK) {
        *kernel = (int32_t *)tb__calloc(w->num_order + 1, sizeof(int32_t));
        *names = (const char **)tb__calloc(w->num_order + 1, sizeof(const char *));
        if (*kernel == NULL || *names == NULL) st = TB_ERR_OUT_OF_MEMORY;
    }
    if (st == TB_OK) {
        for (i = 0; i < w->num_order; i++)
            (*kernel)[i] = -1;
        for (i = 0; i < cw.num_order; i++) {
            const char *name = NULL;
            int32_t k = ex.vt->get_node_kernel(ex.vt->user_data, (*entry)->computation, i, &name);
            int64_t at = tb__exec_walk_position(w, cw.order[i]);
            if (k < 0 || at < 0 || (size_t)at >= w->num_order) continue;
            (*kernel)[at] = k;
            (*names)[at] = name;
        }
        ok = true;
    }
    if (!ok) {
        tb__free(*kernel);
        tb__free((void *)*names);
        tb__comp_cache_release(*entry);
        *kernel = NULL;
        *names = NULL;
        *entry = NULL;
    }
    tb__free((void *)results);
    tb__free(nodes);
    tb__exec_walk_free(&cw);
    if (!ok && (st == TB_ERR_OUT_OF_MEMORY || st == TB_ERR_OVERFLOW)) {
        *failed = true; /* the error stays: the dump fails with it */
    } else {
        tb__error_restore(&saved);
    }
    return ok;
}

/* tb_ir_text and tb_ir_dot: the graph behind the tensors, results marked per tensor. */
static char *tb__exec_dump(const char *func, tb_tensor *const *tensors, size_t count, bool dot) {
    tb__exec_roots roots;
    tb__exec_walk w;
    tb__str s;
    tb_node **nodes = NULL;
    int32_t *kernel = NULL;
    const char **names = NULL;
    tb__comp_cache_entry *entry = NULL;
    char *text = NULL;
    size_t i;
    tb_status st;
    tb__ensure_setup();
    memset(&s, 0, sizeof(s));
    memset(&w, 0, sizeof(w));
    memset(&roots, 0, sizeof(roots));
    st = tb__exec_check_list(func, "tensors", tensors, count);
    if (st == TB_OK) st = tb__exec_roots_collect(&roots, func, tensors, count, true, false);
    if (st == TB_OK) st = tb__exec_walk_add(&w, func, roots.nodes, roots.count);
    if (st == TB_OK) {
        nodes = (tb_node **)tb__calloc(count + 1, sizeof(tb_node *));
        if (nodes == NULL) st = TB_ERR_OUT_OF_MEMORY;
    }
    if (st == TB_OK) {
        /* every tensor has its operand node now: the roots were collected from them */
        for (i = 0; i < count; i++)
            nodes[i] = tb__tensor_ir(tensors[i]);
        bool failed = false;
        if (dot) {
            tb__exec_dump_kernels(func, tensors, count, &roots, &w, &kernel, &names, &entry,
                                  &failed);
            if (!failed) tb__exec_dot_append(&s, &w, nodes, count, kernel, names);
        } else {
            tb__exec_text_append(&s, &w, nodes, count);
        }
        if (!failed) text = tb__str_take(&s);
    }
    tb__free(kernel);
    tb__free((void *)names);
    tb__comp_cache_release(entry);
    tb__free(nodes);
    tb__str_free(&s);
    tb__exec_walk_free(&w);
    tb__exec_roots_free(&roots);
    return text;
}

TBDEF char *tb_ir_text(tb_tensor *const *tensors, size_t count) {
    return tb__exec_dump("tb_ir_text", tensors, count, false);
}

TBDEF char *tb_ir_dot(tb_tensor *const *tensors, size_t count) {
    return tb__exec_dump("tb_ir_dot", tensors, count, true);
}

TBDEF char *tb_ir_backend_text(tb_tensor *const *tensors, size_t count) {
    tb__exec_roots roots;
    tb__exec_walk w;
    tb__exec ex;
    tb_graph g;
    const tb_node **results = NULL;
    tb_node **nodes = NULL;
    tb__comp_cache_entry *entry = NULL;
    char *text = NULL;
    bool hit;
    uint64_t compile_ns;
    tb_status st;
    tb__ensure_setup();
    memset(&w, 0, sizeof(w));
    st = tb__exec_check_list("tb_ir_backend_text", "tensors", tensors, count);
    if (st == TB_OK) {
        st = tb__exec_roots_collect(&roots, "tb_ir_backend_text", tensors, count, true, true);
    } else {
        memset(&roots, 0, sizeof(roots));
    }
    if (st == TB_OK && roots.count == 0) {
        tb__exec_roots_free(&roots);
        return tb__strdup("");
    }
    if (st == TB_OK) st = tb__exec_init(&ex, "tb_ir_backend_text", &roots.device);
    if (st == TB_OK) {
        /* the graph a sync would compile once the eager fallback has run */
        w.cut = ex.vt;
        st = tb__exec_walk_values(&w, ex.func, roots.nodes, roots.count, ex.vt, &nodes);
    }
    if (st == TB_OK) st = tb__exec_graph_make(&ex, &w, nodes, roots.count, NULL, &results, &g);
    if (st == TB_OK && g.num_results == 0) {
        text = tb__strdup("");
    } else if (st == TB_OK) {
        st = tb__exec_compile(&ex, &g, &w, &entry, &hit, &compile_ns);
        if (st == TB_OK && !hit && tb_debug_level() >= 1) {
            tb__exec_log_dump_compile(&ex, &g, compile_ns);
        }
        if (st == TB_OK) {
            const char *backend_text = NULL;
            if (ex.vt->computation_backend_text != NULL) {
                /* NULL is "no text" only without an error: with one, the text could not be
                   made (memory ran out), and an empty text would pass for the answer */
                tb__saved_error saved;
                tb__exec_call_begin(&saved);
                backend_text =
                    ex.vt->computation_backend_text(ex.vt->user_data, entry->computation);
                if (backend_text == NULL && tb_last_status() != TB_OK) {
                    st = tb__exec_call_failed(&ex, tb_last_status(), "computation_backend_text");
                } else {
                    tb__error_restore(&saved);
                }
            }
            if (st == TB_OK) text = tb__strdup(backend_text != NULL ? backend_text : "");
        }
    }
    tb__comp_cache_release(entry);
    tb__free((void *)results);
    tb__free(nodes);
    tb__exec_walk_free(&w);
    tb__exec_roots_free(&roots);
    return text;
}

/* ---- seeding, shutdown ---- */

TBDEF tb_status tb_manual_seed(uint64_t seed) {
    tb__builtin_failure why;
    tb__ensure_setup();
    if (!tb_is_setup()) return tb_last_status(); /* memory ran out setting the library up */
    /* Every backend that exists is registered first, so that either all of them hear of the
       seed or nothing changes; from there on nothing allocates, nothing can fail. */
    tb__registry_ensure(&why);
    if (why.status != TB_OK) {
        return tb__error(why.status,
                         "tb_manual_seed: cannot register the built-in backend '%s': %s", why.name,
                         why.reason);
    }
    tb__rng_set_seed(seed);
    /* the registry lives in an earlier layer than the generator state: tell the backends here */
    tb__registry_set_rng_seed(seed);
    return TB_OK;
}

static void tb__executor_shutdown(void) {
    tb_tensor *t;
    tb__scope_shutdown(); /* before the cache and the backends go: its releases may use them */
    tb__comp_cache_shutdown();
    tb__exec_stage_shutdown();
    /* tensors still alive are invalid from now on; forget them so a new setup starts clean */
    tb__mutex_lock(&tb__tensor_live_mutex);
    t = tb__tensor_live_head;
    while (t != NULL) {
        tb_tensor *next = t->live_next;
        t->live_prev = NULL;
        t->live_next = NULL;
        t->live_linked = false;
        t = next;
    }
    tb__tensor_live_head = NULL;
    tb__mutex_unlock(&tb__tensor_live_mutex);
    tb__rng_reset();
}
