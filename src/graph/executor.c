/* ===========================================================================================
   The graph executor: the C form of LTC's LazyGraphExecutor
   (torch/csrc/lazy/core/lazy_graph_executor.cpp) below the tensors: the post-order walk of a
   pending graph with its canonical form and hash, dumps of a walked graph and the computation
   cache; compiling and running on a backend, the eager fallback and TB_CHECK on the reference
   backend are executor_run.c's. tensor.c's syncs drive it.
   =========================================================================================== */
#include "../impl_begin.h"

static void tb__exec_device_text(const tb_device *device, char buf[64]) {
    tb_device_format(device, buf, 64);
}

/* One host element of `dtype` as a double. */
static double tb__exec_host_to_double(const void *in, tb_dtype dtype) {
    switch (dtype) {
    case TB_F32: {
        float v;
        memcpy(&v, in, sizeof(v));
        return (double)v;
    }
    case TB_F64: {
        double v;
        memcpy(&v, in, sizeof(v));
        return v;
    }
    case TB_I32: {
        int32_t v;
        memcpy(&v, in, sizeof(v));
        return (double)v;
    }
    case TB_I64: {
        int64_t v;
        memcpy(&v, in, sizeof(v));
        return (double)v;
    }
    case TB_U8:
        return (double)*(const uint8_t *)in;
    case TB_BOOL:
        return *(const uint8_t *)in != 0 ? 1.0 : 0.0;
    case TB_F16:
    case TB_BF16: {
        uint16_t v;
        memcpy(&v, in, sizeof(v));
        return tb__half_to_f64(dtype, v);
    }
    default:
        return 0.0;
    }
}

/* A host buffer for `shape` (at least one byte, so that empty tensors need no special case). */
static void *tb__exec_host_alloc(const tb_shape *shape, size_t *nbytes) {
    size_t n = 0;
    if (tb_shape_nbytes(shape, &n) != TB_OK) return NULL;
    if (nbytes != NULL) *nbytes = n;
    return tb__alloc(n > 0 ? n : 1);
}

/* ---- node sets: node pointer -> int64, open addressing ---- */

static size_t tb__exec_map_slot(const tb__exec_map *m, const tb_node *key) {
    uint64_t h = (uint64_t)(uintptr_t)key;
    size_t mask = m->cap - 1, i;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    i = (size_t)h & mask;
    while (m->keys[i] != NULL && m->keys[i] != key)
        i = (i + 1) & mask;
    return i;
}

static int64_t *tb__exec_map_get(const tb__exec_map *m, const tb_node *key) {
    size_t i;
    if (m->cap == 0) return NULL;
    i = tb__exec_map_slot(m, key);
    return m->keys[i] != NULL ? &m->values[i] : NULL;
}

static tb_status tb__exec_map_put(tb__exec_map *m, const tb_node *key, int64_t value) {
    size_t i;
    if ((m->count + 1) * 2 > m->cap) {
        tb__exec_map bigger;
        size_t j;
        bigger.cap = m->cap > 0 ? m->cap * 2 : 64;
        bigger.count = m->count;
        bigger.keys = (const tb_node **)tb__calloc(bigger.cap, sizeof(const tb_node *));
        bigger.values = (int64_t *)tb__calloc(bigger.cap, sizeof(int64_t));
        if (bigger.keys == NULL || bigger.values == NULL) {
            tb__free((void *)bigger.keys);
            tb__free(bigger.values);
            return TB_ERR_OUT_OF_MEMORY;
        }
        for (j = 0; j < m->cap; j++) {
            if (m->keys[j] != NULL) {
                size_t k = tb__exec_map_slot(&bigger, m->keys[j]);
                bigger.keys[k] = m->keys[j];
                bigger.values[k] = m->values[j];
            }
        }
        tb__free((void *)m->keys);
        tb__free(m->values);
        *m = bigger;
    }
    i = tb__exec_map_slot(m, key);
    if (m->keys[i] == NULL) {
        m->keys[i] = key;
        m->count++;
    }
    m->values[i] = value;
    return TB_OK;
}

static void tb__exec_map_free(tb__exec_map *m) {
    tb__free((void *)m->keys);
    tb__free(m->values);
    memset(m, 0, sizeof(*m));
}

/* ---- the post-order walk (LTC's Util::ComputePostOrder, without recursion) ---- */

static void tb__exec_walk_free(tb__exec_walk *w) {
    tb__exec_map_free(&w->pos);
    tb__free((void *)w->order);
    tb__free((void *)w->params);
    tb__free(w->stack);
    tb__free(w->canon);
    memset(w, 0, sizeof(*w));
}

/* Leaves whose values arrive at execution: device data, scalars and nodes computed apart. */
static bool tb__exec_is_param(const tb_node *n) {
    return n->op == TB_OP_DEVICE_DATA || n->op == TB_OP_SCALAR || n->value != NULL;
}

static bool tb__exec_supported(const tb_backend_impl *vt, const tb_node *n) {
    /* a collective runs on the host through its process group, whatever the backend says */
    if (n->op == TB_OP_COLLECTIVE) return false;
    return vt->supports_node == NULL || vt->supports_node(vt->user_data, n);
}

/* The canonical form of a graph: per node in post-order the words below, then the results.
   Two graphs with the same form are the same computation; the graph's hash is a hash of it,
   and a cache hit on the hash is confirmed by comparing forms. */
enum {
    TB__CANON_NODE = 1,   /* a computed node: op, shape, attributes, operand positions */
    TB__CANON_DATA = 2,   /* a parameter of device data, or of a value computed apart */
    TB__CANON_SCALAR = 3, /* a scalar parameter (wrapped number or not) */
    TB__CANON_RESULTS = 4,
    TB__CANON_DONORS = 5 /* per result: the parameter it may be computed into, or -1 */
};

/* Appends the canonical words of the node the walk is placing next: its structure, with
   operands named by their positions (x + x and x + y differ) and parameters by their index
   (values never enter). Mixes the words into the walk's hash. */
static tb_status tb__exec_walk_node_canon(tb__exec_walk *w, const tb_node *n, bool param) {
    size_t need = w->num_canon + 16 + TB_MAX_RANK + TB_MAX_ATTRS + n->num_operands;
    uint64_t *c, *start, h = 0x7462677261706802ull;
    int32_t d;
    uint32_t i;
    if (tb__grow((void **)&w->canon, &w->cap_canon, need, sizeof *w->canon) != TB_OK)
        return TB_ERR_OUT_OF_MEMORY;
    start = c = w->canon + w->num_canon;
    if (param) {
        /* device data and values computed apart are the same kind of input for a backend */
        if (n->op == TB_OP_SCALAR) {
            *c++ = TB__CANON_SCALAR;
            *c++ = n->wrapped_number ? 1u : 0u;
        } else {
            *c++ = TB__CANON_DATA;
        }
    } else {
        *c++ = TB__CANON_NODE;
        *c++ = (uint64_t)(uint32_t)n->op;
    }
    *c++ = (uint64_t)n->shape.dtype;
    *c++ = (uint64_t)(uint32_t)n->shape.rank;
    for (d = 0; d < n->shape.rank && d < TB_MAX_RANK; d++)
        *c++ = (uint64_t)n->shape.dims[d];
    if (param) {
        *c++ = (uint64_t)w->num_params;
    } else {
        *c++ = n->num_attrs;
        for (i = 0; i < n->num_attrs && i < TB_MAX_ATTRS; i++)
            *c++ = (uint64_t)n->attrs[i];
        for (i = 0; i < 2; i++) {
            uint64_t bits;
            memcpy(&bits, &n->fattrs[i], sizeof(bits));
            *c++ = bits;
        }
        *c++ = n->num_operands;
        for (i = 0; i < n->num_operands; i++) {
            const int64_t *p = tb__exec_map_get(&w->pos, n->operands[i]);
            *c++ = p != NULL ? (uint64_t)*p : ~(uint64_t)0;
        }
    }
    w->num_canon += (size_t)(c - start);
    w->canon_nodes = w->num_canon;
    for (; start < c; start++)
        h = tb__hash_u64(h, *start);
    w->hash = tb__hash_u64(w->hash, h);
    return TB_OK;
}

static tb_status tb__exec_walk_push(tb__exec_walk *w, size_t *sp, const tb_node *n) {
    tb_status st;
    if (tb__grow((void **)&w->stack, &w->cap_stack, *sp + 1, sizeof(tb__exec_frame)) != TB_OK) {
        return TB_ERR_OUT_OF_MEMORY;
    }
    st = tb__exec_map_put(&w->pos, n, -1);
    if (st != TB_OK) return st;
    w->stack[*sp].node = n;
    w->stack[*sp].next = 0;
    w->stack[*sp].param =
        tb__exec_is_param(n) || (w->cut != NULL && !tb__exec_supported(w->cut, n));
    (*sp)++;
    return TB_OK;
}

/* Adds the graphs of `roots` to the walk: every node once, operands first. */
static tb_status tb__exec_walk_add(tb__exec_walk *w, const char *func, tb_node *const *roots,
                                   size_t n) {
    size_t r, sp = 0;
    for (r = 0; r < n; r++) {
        if (tb__exec_map_get(&w->pos, roots[r]) != NULL) continue;
        if (tb__exec_walk_push(w, &sp, roots[r]) != TB_OK) return TB_ERR_OUT_OF_MEMORY;
        while (sp > 0) {
            tb__exec_frame *f = &w->stack[sp - 1];
            const tb_node *node = f->node;
            int64_t *p;
            if (!f->param && f->next < node->num_operands) {
                const tb_node *operand = node->operands[f->next++];
                if (operand == NULL) {
                    return tb__error(TB_ERR_INTERNAL, "%s: node %llu (%s) has a NULL operand", func,
                                     (unsigned long long)node->id, tb_op_name(node->op));
                }
                p = tb__exec_map_get(&w->pos, operand);
                if (p != NULL) {
                    if (*p < 0) {
                        return tb__error(TB_ERR_INTERNAL,
                                         "%s: the graph has a loop through node %llu (%s)", func,
                                         (unsigned long long)operand->id, tb_op_name(operand->op));
                    }
                    continue;
                }
                if (tb__exec_walk_push(w, &sp, operand) != TB_OK) return TB_ERR_OUT_OF_MEMORY;
                continue;
            }
            if (tb__grow((void **)&w->order, &w->cap_order, w->num_order + 1,
                         sizeof(const tb_node *)) != TB_OK) {
                return TB_ERR_OUT_OF_MEMORY;
            }
            if (f->param && tb__grow((void **)&w->params, &w->cap_params, w->num_params + 1,
                                     sizeof(const tb_node *)) != TB_OK) {
                return TB_ERR_OUT_OF_MEMORY;
            }
            if (tb__exec_walk_node_canon(w, node, f->param) != TB_OK) {
                return TB_ERR_OUT_OF_MEMORY;
            }
            p = tb__exec_map_get(&w->pos, node);
            *p = (int64_t)w->num_order;
            w->order[w->num_order++] = node;
            if (f->param) w->params[w->num_params++] = node;
            sp--;
        }
    }
    return TB_OK;
}

static int64_t tb__exec_walk_position(const tb__exec_walk *w, const tb_node *node) {
    const int64_t *p = tb__exec_map_get(&w->pos, node);
    return p != NULL ? *p : -1;
}

static bool tb__exec_walk_is_param(const tb__exec_walk *w, const tb_node *node) {
    /* parameters are exactly the nodes the walk did not descend into */
    size_t lo = 0, hi = w->num_params;
    int64_t at = tb__exec_walk_position(w, node);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int64_t p = tb__exec_walk_position(w, w->params[mid]);
        if (p == at) return true;
        if (p < at) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return false;
}

/* ---- dumps of a walked graph ---- */

/* Which tensor's node sits where: (post-order position, tensor index), sorted, so that a dump
   marks results in one pass however many tensors there are. */
typedef struct tb__exec_mark {
    int64_t pos;
    size_t index;
} tb__exec_mark;

static int tb__exec_mark_compare(const void *a, const void *b) {
    const tb__exec_mark *x = (const tb__exec_mark *)a, *y = (const tb__exec_mark *)b;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static tb__exec_mark *tb__exec_marks(const tb__exec_walk *w, tb_node *const *nodes, size_t n) {
    tb__exec_mark *marks = (tb__exec_mark *)tb__calloc(n + 1, sizeof(tb__exec_mark));
    size_t i;
    if (marks == NULL) return NULL;
    for (i = 0; i < n; i++) {
        marks[i].pos = tb__exec_walk_position(w, nodes[i]);
        marks[i].index = i;
    }
    qsort(marks, n, sizeof(tb__exec_mark), tb__exec_mark_compare);
    marks[n].pos = -1; /* an end that matches no position */
    return marks;
}

/* `nodes[i]` is the node of result i (tensors[i] for a dump). */
static void tb__exec_text_append(tb__str *s, const tb__exec_walk *w, tb_node *const *nodes,
                                 size_t n) {
    size_t i, next_param = 0, next_mark = 0;
    tb__exec_mark *marks = tb__exec_marks(w, nodes, n);
    if (marks == NULL) {
        s->failed = true;
        return;
    }
    for (i = 0; i < w->num_order; i++) {
        const tb_node *node = w->order[i];
        char shape[96];
        uint32_t k;
        bool param = next_param < w->num_params && w->params[next_param] == node;
        tb__shape_text(&node->shape, shape);
        tb__str_append(s, "%%%lu = %s", (unsigned long)i, tb_op_name(node->op));
        if (!param && node->num_operands > 0) {
            tb__str_append(s, "(");
            for (k = 0; k < node->num_operands; k++) {
                tb__str_append(s, "%s%%%lld", k > 0 ? ", " : "",
                               (long long)tb__exec_walk_position(w, node->operands[k]));
            }
            tb__str_append(s, ")");
        }
        tb__str_append(s, " %s", shape);
        if (!param && node->num_attrs > 0) {
            tb__str_append(s, " attrs=[");
            for (k = 0; k < node->num_attrs && k < TB_MAX_ATTRS; k++) {
                tb__str_append(s, "%s%lld", k > 0 ? ", " : "", (long long)node->attrs[k]);
            }
            tb__str_append(s, "]");
        }
        if (!param && (node->fattrs[0] != 0.0 || node->fattrs[1] != 0.0)) {
            tb__str_append(s, " fattrs=[%.17g, %.17g]", node->fattrs[0], node->fattrs[1]);
        }
        if (param) {
            tb__str_append(s, " (param %lu", (unsigned long)next_param);
            if (node->op == TB_OP_SCALAR) {
                tb__str_append(s, ", value %.17g", tb_scalar_as_double(node->scalar));
            } else if (node->op != TB_OP_DEVICE_DATA) {
                tb__str_append(s, "%s",
                               node->value != NULL ? ", computed apart" : ", not supported");
            }
            tb__str_append(s, ")");
            next_param++;
        }
        for (; marks[next_mark].pos == (int64_t)i; next_mark++) {
            tb__str_append(s, " (result %lu)", (unsigned long)marks[next_mark].index);
        }
        tb__str_append(s, "\n");
    }
    tb__free(marks);
}

/* One node of a DOT dump: its id, label and style. */
static void tb__exec_dot_node(tb__str *s, const tb__exec_walk *w, size_t i, bool param,
                              size_t param_index, const tb__exec_mark *marks, size_t next_mark,
                              const char *indent) {
    const tb_node *node = w->order[i];
    char shape[96];
    tb__shape_text(&node->shape, shape);
    tb__str_append(s, "%sn%lu [label=\"%%%lu %s\\n%s", indent, (unsigned long)i, (unsigned long)i,
                   tb_op_name(node->op), shape);
    if (param) tb__str_append(s, "\\nparam %lu", (unsigned long)param_index);
    for (; marks[next_mark].pos == (int64_t)i; next_mark++) {
        tb__str_append(s, "\\nresult %lu", (unsigned long)marks[next_mark].index);
    }
    tb__str_append(s, "\"%s];\n", param ? ", style=rounded" : "");
}

/* `kernel` (NULL: no clusters): per walk position, the kernel computing the node or -1, and
   `kernel_names` its name; the nodes of each kernel are drawn inside "subgraph cluster_k". */
static void tb__exec_dot_append(tb__str *s, const tb__exec_walk *w, tb_node *const *nodes, size_t n,
                                const int32_t *kernel, const char *const *kernel_names) {
    size_t i, next_param = 0, next_mark = 0, num_clustered = 0;
    tb__exec_mark *marks = tb__exec_marks(w, nodes, n);
    tb__exec_mark *clustered = NULL;
    size_t *param_index = NULL, *mark_start = NULL;
    if (marks == NULL) {
        s->failed = true;
        return;
    }
    tb__str_append(s, "digraph tb {\n  node [shape=box, fontname=\"monospace\"];\n");
    if (kernel != NULL) {
        /* clusters first, so that every node is declared before an edge names it */
        clustered = (tb__exec_mark *)tb__calloc(w->num_order + 1, sizeof(tb__exec_mark));
        param_index = (size_t *)tb__calloc(w->num_order + 1, sizeof(size_t));
        mark_start = (size_t *)tb__calloc(w->num_order + 1, sizeof(size_t));
        if (clustered == NULL || param_index == NULL || mark_start == NULL) {
            s->failed = true;
        } else {
            for (i = 0; i < w->num_order; i++) {
                bool param = next_param < w->num_params && w->params[next_param] == w->order[i];
                param_index[i] = next_param;
                mark_start[i] = next_mark;
                while (marks[next_mark].pos == (int64_t)i)
                    next_mark++;
                if (param) next_param++;
                if (kernel[i] >= 0) {
                    clustered[num_clustered].pos = kernel[i];
                    clustered[num_clustered].index = i;
                    num_clustered++;
                }
            }
            qsort(clustered, num_clustered, sizeof(tb__exec_mark), tb__exec_mark_compare);
            for (i = 0; i < num_clustered; i++) {
                size_t at = clustered[i].index;
                bool param =
                    param_index[at] < w->num_params && w->params[param_index[at]] == w->order[at];
                if (i == 0 || clustered[i - 1].pos != clustered[i].pos) {
                    const char *name = kernel_names[at] != NULL ? kernel_names[at] : "";
                    tb__str_append(s, "  subgraph cluster_%lld {\n    label=\"",
                                   (long long)clustered[i].pos);
                    for (; *name != '\0'; name++) {
                        if (*name != '"' && *name != '\\') tb__str_append(s, "%c", *name);
                    }
                    tb__str_append(s, "\";\n");
                }
                tb__exec_dot_node(s, w, at, param, param_index[at], marks, mark_start[at], "    ");
                if (i + 1 == num_clustered || clustered[i + 1].pos != clustered[i].pos) {
                    tb__str_append(s, "  }\n");
                }
            }
        }
        next_param = 0;
        next_mark = 0;
    }
    for (i = 0; i < w->num_order; i++) {
        const tb_node *node = w->order[i];
        bool param = next_param < w->num_params && w->params[next_param] == node;
        if (kernel == NULL || kernel[i] < 0) {
            tb__exec_dot_node(s, w, i, param, next_param, marks, next_mark, "  ");
        }
        while (marks[next_mark].pos == (int64_t)i)
            next_mark++;
        if (param) {
            next_param++;
        } else {
            uint32_t k;
            for (k = 0; k < node->num_operands; k++) {
                tb__str_append(s, "  n%lld -> n%lu;\n",
                               (long long)tb__exec_walk_position(w, node->operands[k]),
                               (unsigned long)i);
            }
        }
    }
    tb__str_append(s, "}\n");
    tb__free(clustered);
    tb__free(param_index);
    tb__free(mark_start);
    tb__free(marks);
}

/* ---- the computation cache (LTC's ComputationCache: an LRU keyed by the graph hash) ---- */

static tb__mutex tb__comp_cache_mutex = TB__MUTEX_INIT;
static tb__comp_cache_entry **tb__comp_cache_buckets = NULL;
static size_t tb__comp_cache_num_buckets = 0;
static size_t tb__comp_cache_count = 0;
static tb__comp_cache_entry *tb__comp_cache_lru_head = NULL;
static tb__comp_cache_entry *tb__comp_cache_lru_tail = NULL;

static uint64_t tb__comp_cache_key(uint64_t graph_hash, const tb_device *device) {
    uint64_t h = tb__hash_bytes(graph_hash, device->backend, strlen(device->backend));
    return tb__hash_u64(h, (uint64_t)(uint32_t)device->ordinal);
}

static void tb__comp_cache_entry_destroy(tb__comp_cache_entry *e) {
    const tb_backend_impl *vt = tb__backend_vtable(e->backend);
    if (vt != NULL) vt->release_computation(vt->user_data, e->computation);
    tb__free(e);
}

/* Drops a reference; returns the entry when the caller must destroy it (outside the lock). */
static tb__comp_cache_entry *tb__comp_cache_unref_locked(tb__comp_cache_entry *e) {
    e->refcount--;
    return e->refcount == 0 ? e : NULL;
}

static void tb__comp_cache_release(tb__comp_cache_entry *e) {
    tb__comp_cache_entry *dead;
    if (e == NULL) return;
    tb__mutex_lock(&tb__comp_cache_mutex);
    dead = tb__comp_cache_unref_locked(e);
    tb__mutex_unlock(&tb__comp_cache_mutex);
    if (dead != NULL) tb__comp_cache_entry_destroy(dead);
}

static void tb__comp_cache_unlink_locked(tb__comp_cache_entry *e) {
    tb__comp_cache_entry **link =
        &tb__comp_cache_buckets[e->key & (tb__comp_cache_num_buckets - 1)];
    while (*link != e)
        link = &(*link)->bucket_next;
    *link = e->bucket_next;
    if (e->lru_prev != NULL) {
        e->lru_prev->lru_next = e->lru_next;
    } else {
        tb__comp_cache_lru_head = e->lru_next;
    }
    if (e->lru_next != NULL) {
        e->lru_next->lru_prev = e->lru_prev;
    } else {
        tb__comp_cache_lru_tail = e->lru_prev;
    }
    e->lru_prev = NULL;
    e->lru_next = NULL;
    e->bucket_next = NULL;
    tb__comp_cache_count--;
}

static void tb__comp_cache_push_front_locked(tb__comp_cache_entry *e) {
    e->lru_prev = NULL;
    e->lru_next = tb__comp_cache_lru_head;
    if (tb__comp_cache_lru_head != NULL) tb__comp_cache_lru_head->lru_prev = e;
    tb__comp_cache_lru_head = e;
    if (tb__comp_cache_lru_tail == NULL) tb__comp_cache_lru_tail = e;
}

/* The entry of the graph, or NULL; `*collided` tells whether an entry had the graph's hash but
   another structure. */
static tb__comp_cache_entry *tb__comp_cache_find_locked(uint64_t key, uint64_t graph_hash,
                                                        const tb_device *device,
                                                        const tb_backend *backend,
                                                        const uint64_t *canon, size_t num_canon,
                                                        bool *collided) {
    tb__comp_cache_entry *e;
    *collided = false;
    if (tb__comp_cache_num_buckets == 0) return NULL;
    for (e = tb__comp_cache_buckets[key & (tb__comp_cache_num_buckets - 1)]; e != NULL;
         e = e->bucket_next) {
        if (e->key == key && e->graph_hash == graph_hash && e->backend == backend &&
            tb_device_equal(&e->device, device)) {
            if (e->num_canon == num_canon &&
                memcmp(e->canon, canon, num_canon * sizeof *canon) == 0) {
                return e;
            }
            *collided = true;
        }
    }
    return NULL;
}

/* The cached computation of the graph whose walk is `w` (a new reference, moved to the
   front), or NULL. */
static tb__comp_cache_entry *tb__comp_cache_lookup(uint64_t graph_hash, const tb__exec_walk *w,
                                                   const tb_device *device,
                                                   const tb_backend *backend) {
    uint64_t key = tb__comp_cache_key(graph_hash, device);
    tb__comp_cache_entry *e;
    bool collided;
    tb__mutex_lock(&tb__comp_cache_mutex);
    e = tb__comp_cache_find_locked(key, graph_hash, device, backend, w->canon, w->num_canon,
                                   &collided);
    if (e != NULL) {
        e->refcount++;
        if (tb__comp_cache_lru_head != e) {
            e->lru_prev->lru_next = e->lru_next;
            if (e->lru_next != NULL) {
                e->lru_next->lru_prev = e->lru_prev;
            } else {
                tb__comp_cache_lru_tail = e->lru_prev;
            }
            tb__comp_cache_push_front_locked(e);
        }
    }
    tb__mutex_unlock(&tb__comp_cache_mutex);
    if (collided && e == NULL) tb__metric_count("GraphHashCollision", 1);
    return e;
}

/* Puts a new entry (refcount 1, the caller's) in the cache, evicting the least recently used
   ones beyond the capacity. Returns the entry the caller should use: `e`, or an equal one that
   another thread put first (then `e` is destroyed). */
static tb__comp_cache_entry *tb__comp_cache_insert(tb__comp_cache_entry *e) {
    size_t capacity = tb__desc()->cache_size > 0 ? tb__desc()->cache_size : 1024;
    tb__comp_cache_entry *evicted = NULL, *existing;
    bool collided;
    tb__mutex_lock(&tb__comp_cache_mutex);
    if (tb__comp_cache_num_buckets == 0) {
        size_t nb = 16;
        while (nb < capacity && nb < ((size_t)1 << 20))
            nb *= 2;
        tb__saved_error saved;
        tb__error_save(&saved);
        tb__comp_cache_buckets =
            (tb__comp_cache_entry **)tb__calloc(nb, sizeof(tb__comp_cache_entry *));
        if (tb__comp_cache_buckets == NULL) {
            /* uncached: the computation lives as long as the caller's reference, and the
               caller's operation goes on, its error untouched */
            tb__error_restore(&saved);
            tb__mutex_unlock(&tb__comp_cache_mutex);
            return e;
        }
        tb__comp_cache_num_buckets = nb;
    }
    existing = tb__comp_cache_find_locked(e->key, e->graph_hash, &e->device, e->backend, e->canon,
                                          e->num_canon, &collided);
    if (existing != NULL) {
        existing->refcount++;
        tb__mutex_unlock(&tb__comp_cache_mutex);
        tb__comp_cache_entry_destroy(e);
        return existing;
    }
    e->refcount++; /* the cache's reference */
    e->bucket_next = tb__comp_cache_buckets[e->key & (tb__comp_cache_num_buckets - 1)];
    tb__comp_cache_buckets[e->key & (tb__comp_cache_num_buckets - 1)] = e;
    tb__comp_cache_push_front_locked(e);
    tb__comp_cache_count++;
    while (tb__comp_cache_count > capacity) {
        tb__comp_cache_entry *victim = tb__comp_cache_lru_tail;
        tb__comp_cache_unlink_locked(victim);
        if (tb__comp_cache_unref_locked(victim) != NULL) {
            victim->lru_next = evicted; /* a private list of entries to destroy */
            evicted = victim;
        }
    }
    tb__mutex_unlock(&tb__comp_cache_mutex);
    while (evicted != NULL) {
        tb__comp_cache_entry *next = evicted->lru_next;
        tb__comp_cache_entry_destroy(evicted);
        evicted = next;
    }
    return e;
}

static void tb__comp_cache_clear(void) {
    tb__comp_cache_entry *dead = NULL;
    tb__mutex_lock(&tb__comp_cache_mutex);
    while (tb__comp_cache_lru_head != NULL) {
        tb__comp_cache_entry *e = tb__comp_cache_lru_head;
        tb__comp_cache_unlink_locked(e);
        if (tb__comp_cache_unref_locked(e) != NULL) {
            e->lru_next = dead;
            dead = e;
        }
    }
    tb__mutex_unlock(&tb__comp_cache_mutex);
    while (dead != NULL) {
        tb__comp_cache_entry *next = dead->lru_next;
        tb__comp_cache_entry_destroy(dead);
        dead = next;
    }
}

TBDEF void tb_computation_cache_clear(void) {
    tb__ensure_setup();
    tb__comp_cache_clear();
}

TBDEF size_t tb_computation_cache_size(void) {
    size_t n;
    tb__ensure_setup();
    tb__mutex_lock(&tb__comp_cache_mutex);
    n = tb__comp_cache_count;
    tb__mutex_unlock(&tb__comp_cache_mutex);
    return n;
}
