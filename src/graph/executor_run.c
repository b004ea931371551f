/* ===========================================================================================
   The graph executor, its second half: compiling and running a walked graph on a backend (the
   computation cache in front), the progress of first compiles, the eager fallback and
   TB_CHECK on the reference backend. executor.c walks, hashes and caches.
   =========================================================================================== */
#include "../impl_begin.h"

/* ---- the executor ---- */

/* A backend entry starts with a clean error so that the reason of a failure is the backend's;
   a success gives the caller's error back. */
static void tb__exec_call_begin(tb__saved_error *saved) {
    tb__error_save(saved);
    tb_clear_error();
}

static tb_status tb__exec_call_failed(const tb__exec *ex, tb_status st, const char *entry) {
    if (st == TB_OK) st = TB_ERR_INTERNAL;
    if (tb_last_status() == TB_OK || tb_last_error()[0] == '\0') {
        return tb__error(st, "%s: backend '%s': %s failed (%s)", ex->func, ex->device.backend,
                         entry, tb_status_string(st));
    }
    return tb__error(st, "%s: backend '%s': %s: %s", ex->func, ex->device.backend, entry,
                     tb_last_error());
}

/* The data a DEVICE_DATA node or a node computed apart stands for (borrowed). */
static tb_backend_data *tb__exec_param_data(const tb__exec *ex, const tb_node *node) {
    tb_backend_data *d = NULL;
    if (node->value != NULL) return node->value;
    if (ex->vt->get_node_data != NULL) d = ex->vt->get_node_data(ex->vt->user_data, node);
    if (d == NULL) d = node->data;
    if (d == NULL) {
        tb__error(TB_ERR_INTERNAL, "%s: device data node %llu has no data", ex->func,
                  (unsigned long long)node->id);
    }
    return d;
}

/* A new data on the device holding a SCALAR node's value in the node's dtype. */
static tb_backend_data *tb__exec_scalar_data(const tb__exec *ex, const tb_node *node) {
    tb_scalar value;
    if (tb_dtype_is_float(node->shape.dtype)) {
        value = tb_scalar_f(node->shape.dtype, tb_scalar_as_double(node->scalar));
    } else {
        value = tb_scalar_i(node->shape.dtype, tb_scalar_as_int(node->scalar));
    }
    return tb__data_from_scalar(&ex->device, value);
}

/* The value of a parameter node: a new reference. */
static tb_backend_data *tb__exec_param_value(const tb__exec *ex, const tb_node *node) {
    tb_backend_data *d;
    if (node->op == TB_OP_SCALAR && node->value == NULL) return tb__exec_scalar_data(ex, node);
    d = tb__exec_param_data(ex, node);
    if (d != NULL) tb__data_retain(d);
    return d;
}

/* TB_DEBUG=1: a compile still running after this long logs a line saying so. */
#define TB__SLOW_COMPILE_MS 1000u

/* ---- progress of first compiles (tb_desc.progress) ---- */

/* The first compile (and first run) this thread is in, while a progress hook is set. */
typedef struct tb__progress_now {
    bool active, from_disk;
    char device[64];
    uint64_t graph_hash, t0;
    size_t done, total;
} tb__progress_now;

static TB__THREAD_LOCAL tb__progress_now tb__progress_state;

static void tb__progress_emit(tb_progress_stage stage, tb_status status) {
    const tb_progress_hook *hook = &tb__desc()->progress;
    tb__progress_now *s = &tb__progress_state;
    tb_progress p;
    if (hook->func == NULL || !s->active) return;
    memset(&p, 0, sizeof p);
    p.stage = stage;
    p.device = s->device;
    p.graph_hash = s->graph_hash;
    p.kernels_done = s->done;
    p.kernels_total = s->total;
    p.from_disk = s->from_disk;
    p.seconds = (double)(tb__now_ns() - s->t0) / 1e9;
    p.status = status;
    hook->func(&p, hook->user_data);
}

static TB__UNUSED bool tb__progress_wanted(void) {
    return tb__progress_state.active && tb__desc()->progress.func != NULL;
}

static TB__UNUSED void tb__progress_kernels(size_t done, size_t total) {
    tb__progress_now *s = &tb__progress_state;
    if (!tb__progress_wanted()) return;
    s->done = done;
    s->total = total;
    tb__progress_emit(TB_PROGRESS_KERNELS, TB_OK);
}

static TB__UNUSED void tb__progress_from_disk(void) {
    tb__progress_state.from_disk = true;
}

/* A first compile of graph `hash` on `device` starts on this thread (nothing without a hook). */
static void tb__progress_begin(const tb_device *device, uint64_t hash) {
    tb__progress_now *s = &tb__progress_state;
    memset(s, 0, sizeof *s);
    if (tb__desc()->progress.func == NULL) return;
    tb__exec_device_text(device, s->device);
    s->graph_hash = hash;
    s->t0 = tb__now_ns();
    s->active = true;
    tb__progress_emit(TB_PROGRESS_BEGIN, TB_OK);
}

/* The first compile and run begun on this thread are over, with `status`. */
static void tb__progress_end(tb_status status) {
    if (!tb__progress_state.active) return;
    tb__progress_emit(TB_PROGRESS_END, status);
    tb__progress_state.active = false;
}

/* A computation for the graph (made from the walk `w`): from the cache, else lowered and
   compiled (and cached). */
static tb_status tb__exec_compile(const tb__exec *ex, const tb_graph *graph, const tb__exec_walk *w,
                                  tb__comp_cache_entry **out, bool *hit, uint64_t *compile_ns) {
    tb__comp_cache_entry *e = tb__comp_cache_lookup(graph->hash, w, &ex->device, ex->backend);
    void *context = NULL, *computation = NULL;
    tb__saved_error saved;
    tb__slow_notice notice;
    uint64_t t0;
    tb_status st;
    *compile_ns = 0;
    if (e != NULL) {
        tb__metric_count("CachedCompile", 1);
        *hit = true;
        *out = e;
        return TB_OK;
    }
    *hit = false;
    tb__progress_begin(&ex->device, graph->hash);
    notice.armed = false;
    if (tb_debug_level() >= 1) {
        /* the graph's own line comes once the compile is done: a compile that takes seconds
           (a large OpenCL program) says so while it runs, from a thread of its own */
        char device[64];
        tb__exec_device_text(&ex->device, device);
        tb__slow_notice_begin(&notice, TB__SLOW_COMPILE_MS,
                              "graph %016llx: compiling %lu nodes on %s ... (still running after "
                              "%u s)",
                              (unsigned long long)graph->hash, (unsigned long)graph->num_nodes,
                              device, TB__SLOW_COMPILE_MS / 1000u);
    }
    t0 = tb__now_ns();
    tb__exec_call_begin(&saved);
    st = ex->vt->create_lowering_context(ex->vt->user_data, graph, &context);
    if (st != TB_OK) {
        tb__slow_notice_end(&notice);
        return tb__exec_call_failed(ex, st, "create_lowering_context");
    }
    st = ex->vt->compile(ex->vt->user_data, context, &computation);
    if (st != TB_OK) st = tb__exec_call_failed(ex, st, "compile");
    if (ex->vt->release_lowering_context != NULL) {
        ex->vt->release_lowering_context(ex->vt->user_data, context);
    }
    tb__slow_notice_end(&notice);
    if (st != TB_OK) return st;
    tb__error_restore(&saved);
    *compile_ns = tb__now_ns() - t0;
    tb__metric_count("UncachedCompile", 1);
    tb__metric_sample("CompileTime", (double)*compile_ns);
    e = w->num_canon > (SIZE_MAX - sizeof *e) / sizeof *w->canon
            ? NULL
            : (tb__comp_cache_entry *)tb__calloc(1, sizeof *e + w->num_canon * sizeof *w->canon);
    if (e == NULL) {
        ex->vt->release_computation(ex->vt->user_data, computation);
        return TB_ERR_OUT_OF_MEMORY;
    }
    e->key = tb__comp_cache_key(graph->hash, &ex->device);
    e->graph_hash = graph->hash;
    memcpy(e + 1, w->canon, w->num_canon * sizeof *w->canon);
    e->canon = (const uint64_t *)(void *)(e + 1);
    e->num_canon = w->num_canon;
    e->device = ex->device;
    e->backend = ex->backend;
    e->computation = computation;
    e->refcount = 1;
    *out = tb__comp_cache_insert(e);
    return TB_OK;
}

static tb_status tb__exec_materialize(const tb__exec *ex, tb_node *const *roots, size_t n,
                                      tb_backend_data *const *donors, tb_backend_data **out);

/* Runs `g` on the registry's reference backend, reached like any backend through its vtable:
   the parameters' values come from contiguous host arrays, the results go into host arrays.
   TB_CHECK and the eager fallback use it. Messages name `fn`. */
static tb_status tb__exec_on_reference(const char *fn, const tb_graph *g,
                                       const void *const *param_host, void *const *result_host) {
    tb__exec ref;
    tb_graph rg = *g;
    tb_backend_data **args = NULL, **outs = NULL;
    void *context = NULL, *computation = NULL;
    tb__saved_error saved;
    const char *entry = "create_lowering_context";
    size_t i;
    tb_status st;
    ref.func = fn;
    ref.backend = tb__registry_reference();
    if (ref.backend == NULL) {
        return tb__error(TB_ERR_STATE, "%s: the reference backend is not registered", fn);
    }
    ref.vt = tb__backend_vtable(ref.backend);
    st = tb__backend_device(fn, tb_backend_name(ref.backend), 0, &ref.device);
    if (st != TB_OK) return st;
    rg.device = ref.device;
    rg.result_donors = NULL;
    args = (tb_backend_data **)tb__calloc(g->num_parameters + 1, sizeof *args);
    outs = (tb_backend_data **)tb__calloc(g->num_results + 1, sizeof *outs);
    if (args == NULL || outs == NULL) st = TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < g->num_parameters && st == TB_OK; i++) {
        args[i] = tb__data_from_host(&ref.device, &g->parameters[i]->shape, param_host[i]);
        if (args[i] == NULL) st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
    }
    for (i = 0; i < g->num_results && st == TB_OK; i++) {
        outs[i] = tb__data_new(ref.backend, &ref.device, &g->results[i]->shape);
        if (outs[i] == NULL) st = TB_ERR_OUT_OF_MEMORY;
    }
    if (st != TB_OK) goto done;
    tb__exec_call_begin(&saved);
    for (i = 0; i < g->num_results && st == TB_OK && ref.vt->create_placeholder != NULL; i++) {
        entry = "create_placeholder";
        st = ref.vt->create_placeholder(ref.vt->user_data, outs[i]);
    }
    if (st == TB_OK) {
        entry = "create_lowering_context";
        st = ref.vt->create_lowering_context(ref.vt->user_data, &rg, &context);
    }
    if (st == TB_OK) {
        entry = "compile";
        st = ref.vt->compile(ref.vt->user_data, context, &computation);
    }
    if (context != NULL && ref.vt->release_lowering_context != NULL)
        ref.vt->release_lowering_context(ref.vt->user_data, context);
    if (st == TB_OK) {
        entry = "execute";
        st = ref.vt->execute(ref.vt->user_data, computation, args, g->num_parameters, outs,
                             g->num_results);
    }
    if (st != TB_OK) {
        st = tb__exec_call_failed(&ref, st, entry);
    } else {
        tb__error_restore(&saved);
    }
    for (i = 0; i < g->num_results && st == TB_OK; i++)
        st = tb__data_to_host(outs[i], result_host[i]);
done:
    if (computation != NULL) ref.vt->release_computation(ref.vt->user_data, computation);
    for (i = 0; args != NULL && i < g->num_parameters; i++)
        tb__data_release(args[i]);
    for (i = 0; outs != NULL && i < g->num_results; i++)
        tb__data_release(outs[i]);
    tb__free(args);
    tb__free(outs);
    return st;
}

/* One node on the reference backend, from contiguous host arrays of its operands (one per
   operand position): a graph of the node whose parameters are its distinct operands. */
static tb_status tb__exec_reference_node(const char *fn, const tb_node *node,
                                         void *const *operand_host, void *result) {
    size_t k = node->num_operands, n = 0, i, j;
    const tb_node **nodes = (const tb_node **)tb__calloc(k + 2, sizeof *nodes);
    const void **param_host = (const void **)tb__calloc(k + 1, sizeof *param_host);
    tb_graph g;
    tb_status st = TB_ERR_OUT_OF_MEMORY;
    if (nodes != NULL && param_host != NULL) {
        /* distinct operands in the order they were made (the post-order of such a graph) */
        for (i = 0; i < k; i++) {
            const tb_node *operand = node->operands[i];
            bool seen = false;
            for (j = 0; j < n; j++)
                seen = seen || nodes[j] == operand;
            if (seen) continue;
            for (j = n; j > 0 && nodes[j - 1]->id > operand->id; j--) {
                nodes[j] = nodes[j - 1];
                param_host[j] = param_host[j - 1];
            }
            nodes[j] = operand;
            param_host[j] = operand_host[i];
            n++;
        }
        nodes[n] = node;
        memset(&g, 0, sizeof g);
        g.nodes = nodes;
        g.num_nodes = n + 1;
        g.parameters = nodes;
        g.num_parameters = n;
        g.results = nodes + n;
        g.num_results = 1;
        g.hash = node->hash;
        st = tb__exec_on_reference(fn, &g, param_host, &result);
    }
    tb__free((void *)nodes);
    tb__free((void *)param_host);
    return st;
}

/* This rank could not run the collective `node` (st): it still takes part in the ranks'
   exchange, so that the others get an error too instead of waiting for it. Keeps the error. */
static void tb__exec_collective_failed(const tb_node *node, tb_status st) {
    tb__saved_error saved;
    tb__error_save(&saved);
    tb__wiring()->collective(node, st, NULL, NULL, NULL, NULL, NULL);
    tb__error_restore(&saved);
}

/* One host array kept between fallbacks for operands copied off their device and between
   tb_to_device's copies from one device to another, so that a large collective's input or a
   tensor moved step after step lands in warm pages. */
static tb__mutex tb__exec_stage_mutex = TB__MUTEX_INIT;
static void *tb__exec_stage;
static size_t tb__exec_stage_cap;

/* A host array of at least `need` bytes (the kept one when it is large enough); *cap gets its
   size. NULL when memory ran out. */
static void *tb__exec_stage_take(size_t need, size_t *cap) {
    void *p;
    size_t have;
    tb__mutex_lock(&tb__exec_stage_mutex);
    p = tb__exec_stage;
    have = tb__exec_stage_cap;
    tb__exec_stage = NULL;
    tb__exec_stage_cap = 0;
    tb__mutex_unlock(&tb__exec_stage_mutex);
    if (need == 0) need = 1;
    if (p != NULL && have >= need) {
        *cap = have;
        return p;
    }
    tb__free(p);
    *cap = need;
    return tb__alloc(need);
}

/* Gives an array of tb__exec_stage_take back: kept when it is the largest, else freed. */
static void tb__exec_stage_give(void *p, size_t cap) {
    if (p == NULL) return;
    tb__mutex_lock(&tb__exec_stage_mutex);
    if (tb__exec_stage == NULL || cap > tb__exec_stage_cap) {
        void *old = tb__exec_stage;
        tb__exec_stage = p;
        tb__exec_stage_cap = cap;
        p = old;
    }
    tb__mutex_unlock(&tb__exec_stage_mutex);
    tb__free(p);
}

static void tb__exec_stage_shutdown(void) {
    tb__mutex_lock(&tb__exec_stage_mutex);
    tb__free(tb__exec_stage);
    tb__exec_stage = NULL;
    tb__exec_stage_cap = 0;
    tb__mutex_unlock(&tb__exec_stage_mutex);
}

/* The release of a host array that a result's data borrows. */
static void tb__exec_free_host(void *context) {
    tb__free(context);
}

/* Operand `operand`'s values on the host for the fallback, from its data `d` (NULL for an
   unset scalar): *in points at them, in the data's own host memory where its backend keeps it
   there or maps it there without a copy (then *mapped is d, and the caller ends the mapping
   with tb__data_unmap_host), else in a staging array *owned of *cap bytes (the caller gives it
   back with tb__exec_stage_give). */
static tb_status tb__exec_operand_host(const tb_node *operand, tb_backend_data *d, void **owned,
                                       size_t *cap, void **in, tb_backend_data **mapped) {
    bool same = d != NULL && tb_shape_equal(&d->shape, &operand->shape);
    void *host = same ? tb__host_data(d) : NULL;
    size_t nbytes = 0;
    if (host != NULL) {
        *in = host;
        return TB_OK;
    }
    host = same ? tb__data_map_host(d) : NULL;
    if (host != NULL) {
        *in = host;
        *mapped = d;
        return TB_OK;
    }
    if (tb_shape_nbytes(&operand->shape, &nbytes) != TB_OK) return tb_last_status();
    *owned = tb__exec_stage_take(nbytes, cap);
    if (*owned == NULL) return TB_ERR_OUT_OF_MEMORY;
    *in = *owned;
    if (d == NULL) {
        tb__scalar_store(operand->scalar, operand->shape.dtype, *owned);
        return TB_OK;
    }
    return tb__data_to_host(d, *owned);
}

/* The fallback's step on the host: the node from its operands' host values `in` into a host
   array, which becomes the node's value on the device (in place where the backend can borrow
   host memory). A collective runs through its process group (*exchanged: the ranks' exchange
   took place) into a buffer the group lends, any other node on the reference backend into a
   new array. */
static tb_status tb__exec_fallback_run(const tb__exec *ex, tb_node *node, void *const *in,
                                       bool *exchanged) {
    tb_backend_data *value = NULL;
    void *result = NULL, *context = NULL;
    void (*release)(void *context) = tb__exec_free_host;
    tb_status st;
    char name[64];
    if (node->op == TB_OP_COLLECTIVE) {
        /* into the result's own memory where the device lends it to the host without a copy,
           else into a buffer of the group's that the result borrows or copies */
        void *dest = NULL;
        size_t nbytes = 0;
        *exchanged = true;
        if (tb_shape_nbytes(&node->shape, &nbytes) == TB_OK && nbytes > 0)
            value = tb__data_new_mapped(&ex->device, &node->shape, &dest);
        st = tb__wiring()->collective(node, TB_OK, in[0], dest, &result, &release, &context);
        if (value != NULL) {
            tb_status unmapped = tb__data_unmap_host(value, dest);
            if (st == TB_OK) st = unmapped;
            if (st != TB_OK) {
                tb__data_release(value);
                return st;
            }
        }
    } else {
        result = context = tb__exec_host_alloc(&node->shape, NULL);
        st = result != NULL              ? TB_OK
             : tb_last_status() != TB_OK ? tb_last_status()
                                         : TB_ERR_OUT_OF_MEMORY;
        if (st == TB_OK) st = tb__exec_reference_node(ex->func, node, in, result);
    }
    if (st == TB_OK && value == NULL) {
        value = tb__data_borrow_host(&ex->device, &node->shape, result, release, context);
        if (value != NULL) {
            result = NULL; /* the data's now: it releases it */
        } else {
            value = tb__data_from_host(&ex->device, &node->shape, result);
            if (value == NULL)
                st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
        }
    }
    if (result != NULL) release(context);
    if (st != TB_OK) return st;
    node->value = value;
    snprintf(name, sizeof(name), "Fallback::%s", tb_op_name(node->op));
    tb__metric_count(node->op == TB_OP_COLLECTIVE ? "CollectiveOnHost" : name, 1);
    return TB_OK;
}

/* LTC's eager fallback: runs one node the backend does not support on the reference
   backend, from its operands' values, and keeps the result on the device in node->value. A
   COLLECTIVE node runs the same way, on the host through its process group. */
static tb_status tb__exec_fallback(const tb__exec *ex, tb_node *node) {
    size_t k = node->num_operands, i, num_pending = 0, *caps = NULL;
    void **host = NULL, **in = NULL;
    tb_node **pending = NULL;
    tb_backend_data **computed = NULL, **mapped = NULL;
    tb_status st = TB_ERR_OUT_OF_MEMORY;
    bool exchanged = false;

    host = (void **)tb__calloc(k + 1, sizeof(void *));
    in = (void **)tb__calloc(k + 1, sizeof(void *));
    caps = (size_t *)tb__calloc(k + 1, sizeof(size_t));
    pending = (tb_node **)tb__calloc(k + 1, sizeof(tb_node *));
    computed = (tb_backend_data **)tb__calloc(k + 1, sizeof(tb_backend_data *));
    mapped = (tb_backend_data **)tb__calloc(k + 1, sizeof(tb_backend_data *));
    if (host == NULL || in == NULL || caps == NULL || pending == NULL || computed == NULL ||
        mapped == NULL)
        goto done;
    /* operands still pending become a graph of their own, whose results are those operands */
    for (i = 0; i < k; i++) {
        size_t j;
        bool seen = false;
        if (tb__exec_is_param(node->operands[i])) continue;
        for (j = 0; j < num_pending; j++)
            seen = seen || pending[j] == node->operands[i];
        if (!seen) pending[num_pending++] = node->operands[i];
    }
    if (num_pending > 0) {
        st = tb__exec_materialize(ex, pending, num_pending, NULL, computed);
        if (st != TB_OK) goto done;
    }
    for (i = 0; i < k; i++) {
        const tb_node *operand = node->operands[i];
        tb_backend_data *d = NULL;
        if (operand->op == TB_OP_SCALAR && operand->value == NULL) {
            /* its value is the node's own: d stays NULL */
        } else if (tb__exec_is_param(operand)) {
            d = tb__exec_param_data(ex, operand);
        } else {
            size_t j;
            for (j = 0; j < num_pending; j++) {
                if (pending[j] == operand) d = computed[j];
            }
        }
        if (d == NULL && !(operand->op == TB_OP_SCALAR && operand->value == NULL)) {
            st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
            goto done;
        }
        st = tb__exec_operand_host(operand, d, &host[i], &caps[i], &in[i], &mapped[i]);
        if (st != TB_OK) goto done;
    }
    st = tb__exec_fallback_run(ex, node, in, &exchanged);
done:
    if (st != TB_OK && node->op == TB_OP_COLLECTIVE && !exchanged)
        tb__exec_collective_failed(node, st);
    if (host != NULL && caps != NULL) {
        for (i = 0; i < k; i++)
            tb__exec_stage_give(host[i], caps[i]);
    }
    if (mapped != NULL && in != NULL) {
        for (i = 0; i < k; i++) {
            tb_status unmapped = tb__data_unmap_host(mapped[i], in[i]);
            if (st == TB_OK) st = unmapped;
        }
    }
    if (computed != NULL) {
        for (i = 0; i < num_pending; i++) {
            if (computed[i] != NULL) tb__data_release(computed[i]);
        }
    }
    tb__free(host);
    tb__free(in);
    tb__free(caps);
    tb__free(pending);
    tb__free(computed);
    tb__free(mapped);
    return st;
}

/* After a failure at position `from` of the walk: the first collective after it still takes
   part in its exchange (every rank meets the collectives of a graph in the same order), so that
   the ranks stop together. */
static void tb__exec_collectives_abandon(const tb__exec_walk *w, size_t from, tb_status st) {
    size_t i;
    for (i = from; i < w->num_order; i++) {
        const tb_node *node = w->order[i];
        if (node->op == TB_OP_COLLECTIVE && node->value == NULL) {
            tb__exec_collective_failed(node, st);
            return;
        }
    }
}

/* Runs the eager fallback for every node of the walked graph the backend does not support, and
   every collective. Returns whether any ran (the walk is then stale). */
static tb_status tb__exec_run_fallbacks(const tb__exec *ex, const tb__exec_walk *w, bool *ran) {
    size_t i, next_param = 0;
    *ran = false;
    for (i = 0; i < w->num_order; i++) {
        tb_node *node = (tb_node *)w->order[i];
        tb_status st;
        if (next_param < w->num_params && w->params[next_param] == node) {
            next_param++;
            continue;
        }
        /* post-order: every unsupported node below this one already has its value, so the
           operands' graph needs no fallback of its own */
        if (tb__exec_supported(ex->vt, node)) continue;
        st = tb__exec_fallback(ex, node);
        if (st != TB_OK) {
            /* a failed collective already told the other ranks */
            if (node->op != TB_OP_COLLECTIVE) tb__exec_collectives_abandon(w, i + 1, st);
            return st;
        }
        *ran = true;
    }
    return TB_OK;
}

static void tb__exec_log_graph(const tb__exec *ex, const tb_graph *g, bool hit, uint64_t compile_ns,
                               uint64_t run_ns) {
    char device[64];
    tb__exec_device_text(&ex->device, device);
    tb_log_message(
        TB_LOG_INFO,
        "graph %016llx nodes=%lu params=%lu results=%lu device=%s cache=%s compile=%.3fms "
        "run=%.3fms",
        (unsigned long long)g->hash, (unsigned long)g->num_nodes, (unsigned long)g->num_parameters,
        (unsigned long)g->num_results, device, hit ? "hit" : "miss", (double)compile_ns / 1e6,
        (double)run_ns / 1e6);
}

/* The TB_DEBUG=1 line of a compile that a dump (tb_ir_backend_text, tb_ir_dot) started: the
   same fields as a run's line, so that a later run's "cache=hit compile=0.000ms" has its
   compile in the log. */
static void tb__exec_log_dump_compile(const tb__exec *ex, const tb_graph *g, uint64_t compile_ns) {
    char device[64];
    tb__exec_device_text(&ex->device, device);
    tb_log_message(TB_LOG_INFO,
                   "graph %016llx nodes=%lu params=%lu results=%lu device=%s cache=miss "
                   "compile=%.3fms (compiled by %s, not run)",
                   (unsigned long long)g->hash, (unsigned long)g->num_nodes,
                   (unsigned long)g->num_parameters, (unsigned long)g->num_results, device,
                   (double)compile_ns / 1e6, ex->func);
}

/* The nodes a graph computes for `roots`: a root that is a reshape to its operand's own dims
   (tb_detach, tb_assign of a value with history, tb_set_requires_grad: an identity the walk for
   tb_grad does not pass) over a node the graph computes stands for that operand, so that the
   operand's kernel writes the result itself. As a result of its own, the reshape is a second
   kernel copying the operand's value out of a buffer of its own whenever the operand has other
   readers (an optimizer's new moment, read again by the parameter's update). The operand is
   kept apart from the roots (it is no root of its own, nor another root's operand taken
   already: each result has a buffer of its own), and parameters stay behind their reshapes
   (their values are other tensors' buffers). `cut` as in tb__exec_walk. *out (n entries, free
   with tb__free) is NULL only when memory ran out. */
static tb_status tb__exec_value_roots(tb_node *const *roots, size_t n, const tb_backend_impl *cut,
                                      tb_node ***out) {
    tb__exec_map taken;
    tb_node **nodes;
    size_t i;
    tb_status st = TB_OK;
    *out = NULL;
    nodes = (tb_node **)tb__calloc(n + 1, sizeof *nodes);
    if (nodes == NULL) return TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < n && !(roots[i]->op == TB_OP_RESHAPE && roots[i]->value == NULL); i++)
        nodes[i] = roots[i];
    if (i == n) { /* no root is a pending reshape: the common case needs no map */
        *out = nodes;
        return TB_OK;
    }
    memset(&taken, 0, sizeof taken);
    for (i = 0; i < n && st == TB_OK; i++)
        st = tb__exec_map_put(&taken, roots[i], 0);
    for (i = 0; i < n && st == TB_OK; i++) {
        tb_node *node = roots[i];
        nodes[i] = node;
        while (st == TB_OK && node->op == TB_OP_RESHAPE && node->value == NULL &&
               node->num_operands == 1) {
            tb_node *o = node->operands[0];
            if (o == NULL || tb__exec_is_param(o) || (cut != NULL && !tb__exec_supported(cut, o)) ||
                o->shape.dtype != node->shape.dtype || !tb_shape_equal(&o->shape, &node->shape) ||
                tb__exec_map_get(&taken, o) != NULL)
                break;
            st = tb__exec_map_put(&taken, o, 0);
            node = o;
            nodes[i] = node;
        }
    }
    tb__exec_map_free(&taken);
    if (st != TB_OK) {
        tb__free(nodes);
        return st;
    }
    *out = nodes;
    return TB_OK;
}

/* Walks the graph of `roots` as computed (tb__exec_value_roots): *nodes (replaced, freed
   first) gets what the graph computes for each root. */
static tb_status tb__exec_walk_values(tb__exec_walk *w, const char *func, tb_node *const *roots,
                                      size_t n, const tb_backend_impl *cut, tb_node ***nodes) {
    tb_status st;
    tb__free(*nodes);
    st = tb__exec_value_roots(roots, n, cut, nodes);
    return st == TB_OK ? tb__exec_walk_add(w, func, *nodes, n) : st;
}

/* The bits of a graph's hash that count: tests keep fewer to force hash collisions. */
static uint64_t tb__exec_hash_mask = ~(uint64_t)0;

/* Builds the graph of the walk for the non-parameter roots, and ends the walk's canonical
   form with them. */
static tb_status tb__exec_graph_make(const tb__exec *ex, tb__exec_walk *w, tb_node *const *roots,
                                     size_t n, const int32_t *root_donors, const tb_node ***results,
                                     tb_graph *g) {
    size_t i, num_results = 0;
    uint64_t h = w->hash;
    int32_t *donors = NULL;
    bool any = false;
    *results = (const tb_node **)tb__calloc(2 * n + 2, sizeof(const tb_node *));
    if (*results == NULL) return TB_ERR_OUT_OF_MEMORY;
    w->num_canon = w->canon_nodes; /* a graph made again from the same walk */
    if (tb__grow((void **)&w->canon, &w->cap_canon, w->num_canon + 2 * n + 4, sizeof *w->canon) !=
        TB_OK) {
        tb__free((void *)*results);
        *results = NULL;
        return TB_ERR_OUT_OF_MEMORY;
    }
    /* the donors live behind the results, in the same block */
    donors = (int32_t *)(void *)(*results + n + 1);
    w->canon[w->num_canon++] = TB__CANON_RESULTS;
    for (i = 0; i < n; i++) {
        uint64_t at;
        if (tb__exec_walk_is_param(w, roots[i])) continue;
        donors[num_results] = root_donors != NULL ? root_donors[i] : -1;
        if (donors[num_results] >= 0) any = true;
        (*results)[num_results++] = roots[i];
        at = (uint64_t)tb__exec_walk_position(w, roots[i]);
        w->canon[w->num_canon++] = at;
        h = tb__hash_u64(h, at);
    }
    w->canon[w->num_canon++] = num_results;
    w->canon[w->num_canon++] = w->num_params;
    if (any) {
        /* a graph that may compute results into parameters' buffers is another computation */
        w->canon[w->num_canon++] = TB__CANON_DONORS;
        for (i = 0; i < num_results; i++) {
            w->canon[w->num_canon++] = (uint64_t)(int64_t)donors[i];
            h = tb__hash_u64(h, (uint64_t)(int64_t)donors[i] ^ 0xd0d0u);
        }
    }
    memset(g, 0, sizeof(*g));
    if (any) g->result_donors = donors;
    g->nodes = w->order;
    g->num_nodes = w->num_order;
    g->parameters = w->params;
    g->num_parameters = w->num_params;
    g->results = *results;
    g->num_results = num_results;
    g->hash = tb__hash_u64(tb__hash_u64(h, num_results), w->num_params) & tb__exec_hash_mask;
    g->device = ex->device;
    return TB_OK;
}

/* Runs a compiled graph: parameter values in, placeholders filled. On success out_results[i]
   gets a new reference to the value of g->results[i]. */
static tb_status tb__exec_run(const tb__exec *ex, const tb_graph *g, void *computation,
                              tb_backend_data **out_results, uint64_t *run_ns) {
    tb_backend_data **args;
    bool *had = NULL; /* per result: its donor had a buffer before the run */
    size_t i;
    tb_status st = TB_OK;
    tb__saved_error saved;
    uint64_t t0;
    args = (tb_backend_data **)tb__calloc(g->num_parameters + 1, sizeof(tb_backend_data *));
    if (args == NULL) return TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < g->num_parameters && st == TB_OK; i++) {
        args[i] = tb__exec_param_value(ex, g->parameters[i]);
        if (args[i] == NULL) {
            st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
        } else if (args[i]->tb__donated) {
            st = tb__error(TB_ERR_INVALID_ARGUMENT,
                           "%s: parameter %lu of the graph (%s) is a value that tb_assign replaced "
                           "and whose buffer the new value took; what reads the old value must "
                           "be synced before or with the assignment",
                           ex->func, (unsigned long)i, tb_op_name(g->parameters[i]->op));
        } else if (!tb_device_equal(&args[i]->device, &ex->device)) {
            char a[64], b[64];
            tb__exec_device_text(&args[i]->device, a);
            tb__exec_device_text(&ex->device, b);
            st = tb__error(TB_ERR_INVALID_ARGUMENT,
                           "%s: parameter %lu of the graph is on %s but the graph runs on %s",
                           ex->func, (unsigned long)i, a, b);
        }
    }
    for (i = 0; i < g->num_results && st == TB_OK; i++) {
        out_results[i] = tb__data_new(ex->backend, &ex->device, &g->results[i]->shape);
        if (out_results[i] == NULL) {
            st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
        } else if (ex->vt->create_placeholder != NULL) {
            tb__exec_call_begin(&saved);
            st = ex->vt->create_placeholder(ex->vt->user_data, out_results[i]);
            if (st != TB_OK) {
                st = tb__exec_call_failed(ex, st, "create_placeholder");
            } else {
                tb__error_restore(&saved);
            }
        }
    }
    if (st == TB_OK && g->result_donors != NULL) {
        had = (bool *)tb__calloc(g->num_results + 1, sizeof(bool));
        if (had == NULL) st = TB_ERR_OUT_OF_MEMORY;
        for (i = 0; st == TB_OK && i < g->num_results; i++)
            had[i] = g->result_donors[i] >= 0 && args[g->result_donors[i]]->payload != NULL;
    }
    if (st == TB_OK) {
        t0 = tb__now_ns();
        tb__exec_call_begin(&saved);
        st = ex->vt->execute(ex->vt->user_data, computation, args, g->num_parameters, out_results,
                             g->num_results);
        *run_ns = tb__now_ns() - t0;
        tb__metric_sample("ExecuteTime", (double)*run_ns);
        for (i = 0; g->result_donors != NULL && i < g->num_results; i++) {
            int32_t j = g->result_donors[i];
            if (j >= 0 && had[i] && args[j]->payload == NULL && !args[j]->tb__donated) {
                args[j]->tb__donated = true; /* its buffer is result i's now (or gone) */
                tb__metric_count("DonatedBuffers", 1);
            }
        }
        if (st != TB_OK) {
            st = tb__exec_call_failed(ex, st, "execute");
        } else {
            tb__error_restore(&saved);
        }
    }
    for (i = 0; i < g->num_parameters; i++) {
        if (args[i] != NULL) tb__data_release(args[i]);
    }
    tb__free(args);
    tb__free(had);
    if (st != TB_OK) {
        for (i = 0; i < g->num_results; i++) {
            if (out_results[i] != NULL) tb__data_release(out_results[i]);
            out_results[i] = NULL;
        }
    }
    return st;
}

/* ---- TB_CHECK: every graph also on the reference interpreter ---- */

/* Whether a backend value and a reference value of one element agree: integers and bool
   exactly; floats within a tolerance that allows for a device's own exp/log/division. */
static bool tb__check_close(tb_dtype dtype, const unsigned char *a, const unsigned char *b,
                            double *va, double *vb) {
    switch (dtype) {
    case TB_F32: {
        float x, y;
        memcpy(&x, a, sizeof x);
        memcpy(&y, b, sizeof y);
        *va = x;
        *vb = y;
        break;
    }
    case TB_F64:
        memcpy(va, a, sizeof *va);
        memcpy(vb, b, sizeof *vb);
        break;
    case TB_F16:
    case TB_BF16: {
        uint16_t x, y;
        memcpy(&x, a, sizeof x);
        memcpy(&y, b, sizeof y);
        *va = tb__half_to_f64(dtype, x);
        *vb = tb__half_to_f64(dtype, y);
        break;
    }
    default: {
        size_t size = tb_dtype_size(dtype);
        int64_t x = 0, y = 0;
        if (dtype == TB_I32) {
            int32_t u, v;
            memcpy(&u, a, sizeof u);
            memcpy(&v, b, sizeof v);
            x = u;
            y = v;
        } else if (dtype == TB_I64) {
            memcpy(&x, a, sizeof x);
            memcpy(&y, b, sizeof y);
        } else {
            x = a[0];
            y = b[0];
        }
        *va = (double)x;
        *vb = (double)y;
        return memcmp(a, b, size) == 0;
    }
    }
    if (*va != *va || *vb != *vb) return (*va != *va) && (*vb != *vb);
    if (*va == *vb) return true; /* equal infinities too */
    {
        /* 16-bit floats: one unit in the last place (2^-10 and 2^-7 of the value) */
        double tol = dtype == TB_F32    ? 1e-5 + 1e-4 * fabs(*vb)
                     : dtype == TB_F16  ? 1e-7 + 1e-3 * fabs(*vb)
                     : dtype == TB_BF16 ? 1e-7 + 8e-3 * fabs(*vb)
                                        : 1e-10 + 1e-8 * fabs(*vb);
        return fabs(*va - *vb) <= tol;
    }
}

/* Compares the backend's values of the `m` computed nodes with the reference's, element by
   element, in post-order. The first that differs: TB_ERR_EXECUTE with the report written.
   A value that could not be read: TB_OK with *st set. */
static tb_status tb__check_compare(const tb__exec *ex, const tb__exec_walk *w, const tb_graph *g,
                                   const tb_node *const *computed, size_t m,
                                   tb_backend_data *const *device_values, void *const *ref_host,
                                   char *report, size_t cap, tb_status *st) {
    unsigned char *backend_host = NULL;
    tb_status verdict = TB_OK;
    size_t i;
    for (i = 0; i < m && *st == TB_OK && verdict == TB_OK; i++) {
        const tb_shape *shape = &computed[i]->shape;
        size_t nbytes = 0, size = tb_dtype_size(shape->dtype), k, count;
        *st = tb_shape_nbytes(shape, &nbytes);
        if (*st != TB_OK) break;
        tb__free(backend_host);
        backend_host = (unsigned char *)tb__alloc(nbytes ? nbytes : 1);
        if (backend_host == NULL) {
            *st = TB_ERR_OUT_OF_MEMORY;
            break;
        }
        *st = tb__data_to_host(device_values[i], backend_host);
        count = size ? nbytes / size : 0;
        for (k = 0; k < count && *st == TB_OK; k++) {
            double va, vb;
            char text[96], where[64];
            if (tb__check_close(shape->dtype, backend_host + k * size,
                                (const unsigned char *)ref_host[i] + k * size, &va, &vb))
                continue;
            tb__shape_text(shape, text);
            tb_device_format(&ex->device, where, sizeof where);
            tb__metric_count("CheckMismatch", 1);
            snprintf(report, cap,
                     "TB_CHECK: graph %016llx: node %%%lld %s %s (node %lu of %lu in "
                     "post-order) differs at element %lu: %s gives %.9g, the reference "
                     "gives %.9g",
                     (unsigned long long)g->hash, (long long)tb__exec_walk_position(w, computed[i]),
                     tb_op_name(computed[i]->op), text, (unsigned long)i, (unsigned long)m,
                     (unsigned long)k, where, va, vb);
            verdict = TB_ERR_EXECUTE;
            break;
        }
    }
    tb__free(backend_host);
    return verdict;
}

/* Runs `g` again on its backend with every computed node as a result, runs the same graph on
   the reference backend, and reports the first node (in post-order) whose values differ.
   At check level 1 purely diagnostic: the caller's error stays as it was and TB_OK comes back.
   At level 2 a node that differs, or a graph that could not be checked, is an error of the
   sync: TB_ERR_EXECUTE (or the reason the check failed) with the report as its message. */
static tb_status tb__exec_check(const tb__exec *ex, const tb__exec_walk *w, const tb_graph *g) {
    tb_graph cg = *g;
    const tb_node **computed = NULL;
    tb_backend_data **device_values = NULL;
    void **param_host = NULL, **ref_host = NULL;
    void *context = NULL, *computation = NULL;
    size_t i, m = 0;
    uint64_t run_ns = 0;
    tb__saved_error saved;
    tb_status st = TB_OK, verdict = TB_OK;
    char report[TB__ERROR_CAP];
    tb__slow_notice notice;

    if (ex->backend == tb__registry_reference()) return TB_OK; /* it is the reference */
    report[0] = '\0';
    tb__error_save(&saved);
    tb_clear_error(); /* a reason below is the check's own */
    computed = (const tb_node **)tb__calloc(g->num_nodes + 1, sizeof *computed);
    param_host = (void **)tb__calloc(g->num_parameters + 1, sizeof *param_host);
    if (computed == NULL || param_host == NULL) {
        st = TB_ERR_OUT_OF_MEMORY;
    } else {
        for (i = 0; i < g->num_nodes; i++) {
            if (!tb__exec_walk_is_param(w, g->nodes[i])) computed[m++] = g->nodes[i];
        }
        device_values = (tb_backend_data **)tb__calloc(m + 1, sizeof *device_values);
        ref_host = (void **)tb__calloc(m + 1, sizeof *ref_host);
        if (device_values == NULL || ref_host == NULL) st = TB_ERR_OUT_OF_MEMORY;
    }
    cg.results = computed;
    cg.result_donors = NULL; /* the check's results are other nodes; it donates nothing */
    cg.num_results = m;
    /* the backend's values of every node: an uncached computation of its own (not counted as
       a compile of the program's, but a slow one says so like any other) */
    notice.armed = false;
    if (st == TB_OK && tb_debug_level() >= 1) {
        char device[64];
        tb__exec_device_text(&ex->device, device);
        tb__slow_notice_begin(&notice, TB__SLOW_COMPILE_MS,
                              "graph %016llx: TB_CHECK: compiling %lu nodes on %s ... (still "
                              "running after %u s)",
                              (unsigned long long)g->hash, (unsigned long)g->num_nodes, device,
                              TB__SLOW_COMPILE_MS / 1000u);
    }
    if (st == TB_OK) st = ex->vt->create_lowering_context(ex->vt->user_data, &cg, &context);
    if (st == TB_OK) st = ex->vt->compile(ex->vt->user_data, context, &computation);
    if (context != NULL && ex->vt->release_lowering_context != NULL)
        ex->vt->release_lowering_context(ex->vt->user_data, context);
    tb__slow_notice_end(&notice);
    if (st == TB_OK) st = tb__exec_run(ex, &cg, computation, device_values, &run_ns);
    /* the reference's values, from the same parameter values */
    for (i = 0; i < g->num_parameters && st == TB_OK; i++) {
        size_t nbytes = 0;
        tb_backend_data *d = tb__exec_param_value(ex, g->parameters[i]);
        st = d == NULL ? TB_ERR_INTERNAL : tb_shape_nbytes(&d->shape, &nbytes);
        if (st == TB_OK) {
            param_host[i] = tb__alloc(nbytes ? nbytes : 1);
            st = param_host[i] == NULL ? TB_ERR_OUT_OF_MEMORY : tb__data_to_host(d, param_host[i]);
        }
        if (d != NULL) tb__data_release(d);
    }
    for (i = 0; i < m && st == TB_OK; i++) {
        size_t nbytes = 0;
        st = tb_shape_nbytes(&computed[i]->shape, &nbytes);
        if (st == TB_OK) {
            ref_host[i] = tb__alloc(nbytes ? nbytes : 1);
            if (ref_host[i] == NULL) st = TB_ERR_OUT_OF_MEMORY;
        }
    }
    if (st == TB_OK)
        st = tb__exec_on_reference(ex->func, &cg, (const void *const *)param_host, ref_host);
    if (st == TB_OK) {
        verdict = tb__check_compare(ex, w, g, computed, m, device_values, ref_host, report,
                                    sizeof report, &st);
        if (verdict != TB_OK) goto done;
    }
    if (st == TB_OK) {
        tb__metric_count("CheckedGraphs", 1);
    } else {
        snprintf(report, sizeof report, "TB_CHECK: graph %016llx could not be checked: %.900s",
                 (unsigned long long)g->hash,
                 tb_last_error()[0] != '\0' ? tb_last_error() : tb_status_string(st));
        verdict = st;
    }
done:
    if (computation != NULL) ex->vt->release_computation(ex->vt->user_data, computation);
    for (i = 0; device_values != NULL && i < m; i++) {
        if (device_values[i] != NULL) tb__data_release(device_values[i]);
    }
    for (i = 0; param_host != NULL && i < g->num_parameters; i++)
        tb__free(param_host[i]);
    for (i = 0; ref_host != NULL && i < m; i++)
        tb__free(ref_host[i]);
    tb__free(device_values);
    tb__free(param_host);
    tb__free(ref_host);
    tb__free((void *)computed);
    tb__error_restore(&saved);
    if (verdict == TB_OK) return TB_OK;
    tb_log_message(TB_LOG_WARN, "%s", report);
    if (tb__desc()->check < 2) return TB_OK;
    return tb__error(verdict, "%s: %s", ex->func, report);
}

#undef TB__SLOW_COMPILE_MS

/* The parameter of the walk whose value is `data`, when exactly one is; else -1. */
static int32_t tb__exec_donor_param(const tb__exec *ex, const tb__exec_walk *w,
                                    const tb_backend_data *data) {
    size_t j;
    int32_t at = -1;
    for (j = 0; j < w->num_params; j++) {
        const tb_node *p = w->params[j];
        if (p->op == TB_OP_SCALAR && p->value == NULL) continue;
        if (tb__exec_param_data(ex, p) != data) continue;
        if (at >= 0) return -1; /* read through two parameters: kept apart */
        at = (int32_t)j;
    }
    return at;
}

/* The values of `roots` (distinct nodes on ex->device): out[i] gets a new reference. donors
   (NULL: none) gives per root a value nothing reads after this graph, whose buffer the root's
   value may take (tb__exec_donors). On error out is all NULL and no node changed except for
   values the eager fallback computed (and donated values a failed run consumed). */
static tb_status tb__exec_materialize(const tb__exec *ex, tb_node *const *roots, size_t n,
                                      tb_backend_data *const *donors, tb_backend_data **out) {
    tb__exec_walk w;
    tb_graph g;
    int32_t *root_donors = NULL;
    const tb_node **results = NULL;
    tb_node **nodes = NULL; /* what the graph computes for each root (tb__exec_value_roots) */
    tb_backend_data **values = NULL;
    tb__comp_cache_entry *entry = NULL;
    bool ran = false, hit = false;
    uint64_t compile_ns = 0, run_ns = 0;
    size_t i, r;
    tb_status st;

    memset(&w, 0, sizeof(w));
    memset(out, 0, n * sizeof(tb_backend_data *));
    st = tb__exec_walk_values(&w, ex->func, roots, n, NULL, &nodes);
    if (st == TB_OK) st = tb__exec_run_fallbacks(ex, &w, &ran);
    if (st == TB_OK && ran) {
        /* values computed by the fallback are parameters now: roots over them stay */
        tb__exec_walk_free(&w);
        st = tb__exec_walk_values(&w, ex->func, roots, n, NULL, &nodes);
    }
    if (st == TB_OK && donors != NULL) {
        root_donors = (int32_t *)tb__calloc(n + 1, sizeof(int32_t));
        if (root_donors == NULL) st = TB_ERR_OUT_OF_MEMORY;
        for (i = 0; i < n && st == TB_OK; i++)
            root_donors[i] = donors[i] != NULL ? tb__exec_donor_param(ex, &w, donors[i]) : -1;
    }
    if (st == TB_OK) st = tb__exec_graph_make(ex, &w, nodes, n, root_donors, &results, &g);
    if (st != TB_OK) goto done;

    if (g.num_results > 0) {
        values = (tb_backend_data **)tb__calloc(g.num_results, sizeof(tb_backend_data *));
        if (values == NULL) {
            st = TB_ERR_OUT_OF_MEMORY;
            goto done;
        }
        tb__metric_sample("TensorsGraphSize", (double)g.num_nodes);
        if (tb_debug_level() >= 3) {
            tb__str text;
            memset(&text, 0, sizeof(text));
            tb__exec_text_append(&text, &w, nodes, n);
            tb_log_message(TB_LOG_DEBUG, "graph %016llx IR:\n%s", (unsigned long long)g.hash,
                           text.data != NULL ? text.data : "");
            tb__str_free(&text);
        }
        st = tb__exec_compile(ex, &g, &w, &entry, &hit, &compile_ns);
        if (st == TB_OK) st = tb__exec_run(ex, &g, entry->computation, values, &run_ns);
        tb__progress_end(st); /* a first compile's, begun in tb__exec_compile */
        if (st != TB_OK) goto done;
        if (tb_debug_level() >= 1) tb__exec_log_graph(ex, &g, hit, compile_ns, run_ns);
        /* at check level 2 a failed check fails the sync: the results are released below */
        if (tb__desc()->check > 0) st = tb__exec_check(ex, &w, &g);
    }
    /* roots that are parameters need no computation: their values are at hand */
    for (i = 0, r = 0; i < n; i++) {
        if (r < g.num_results && results[r] == nodes[i]) {
            out[i] = values[r++];
            continue;
        }
        out[i] = tb__exec_param_value(ex, nodes[i]);
        if (out[i] == NULL) {
            st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
            break;
        }
    }
    if (st != TB_OK) {
        for (i = 0; i < n; i++) {
            if (out[i] != NULL) tb__data_release(out[i]);
            out[i] = NULL;
        }
        /* results not yet handed to out */
        for (; r < g.num_results; r++)
            tb__data_release(values[r]);
    }
done:
    tb__comp_cache_release(entry);
    tb__free(values);
    tb__free((void *)results);
    tb__free(root_donors);
    tb__free(nodes);
    tb__exec_walk_free(&w);
    return st;
}

/* The executor of `device` for `func`. */
static tb_status tb__exec_init(tb__exec *ex, const char *func, const tb_device *device) {
    ex->func = func;
    ex->device = *device;
    ex->backend = tb__backend_for_device(device);
    if (ex->backend == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_NOT_FOUND;
    ex->vt = tb__backend_vtable(ex->backend);
    if (ex->vt == NULL) return tb__error(TB_ERR_INTERNAL, "%s: a backend without a vtable", func);
    return TB_OK;
}

/* Empties the computation cache and frees its table (tb_shutdown, through tensor.c's). */
static void tb__comp_cache_shutdown(void) {
    tb__comp_cache_clear();
    tb__mutex_lock(&tb__comp_cache_mutex);
    tb__free(tb__comp_cache_buckets);
    tb__comp_cache_buckets = NULL;
    tb__comp_cache_num_buckets = 0;
    tb__mutex_unlock(&tb__comp_cache_mutex);
}
