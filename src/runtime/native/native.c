/* ===========================================================================================
   Native backend ("native"): the planner's kernels rendered as C99 (codegen.c, codegen_kernels.c),
   compiled at run time by the system C compiler ($CC, else cc) into a shared object, loaded with
   dlopen and run on a pool of threads (one per core: a kernel's work items are split among them).
   Programs are cached on disk as OpenCL's are (diskcache.c), keyed by the source, the compiler, its
   options, the CPU and this library's version. Memory is host memory. Without a compiler the
   backend has no device and says why, as OpenCL without a loader does.
   =========================================================================================== */
#include "../../impl_begin.h"

#if defined(TB__HAVE_NATIVE)

/* ---- backend entries: devices and data ---- */

static size_t tb__native_get_backend_devices(void *user_data, tb_device *out, size_t cap) {
    tb__native_rt *rt;
    size_t n = 0;
    (void)user_data;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_rt_get();
    if (rt != NULL && rt->status == TB_OK) {
        n = 1;
        if (cap > 0) out[0] = rt->info.device;
    }
    tb__mutex_unlock(&tb__native_mutex);
    return n;
}

static tb_status tb__native_get_device_info(void *user_data, int32_t ordinal, tb_device_info *out) {
    tb__native_rt *rt;
    (void)user_data;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_device(ordinal, "native");
    if (rt != NULL) rt->refcount++;
    tb__mutex_unlock(&tb__native_mutex);
    if (rt == NULL) return tb_last_status();
    /* the class its programs are built for (the compiler is asked once) */
    tb__native_shape(rt);
    tb__mutex_lock(&tb__native_mutex);
    snprintf(rt->info.language_version, sizeof rt->info.language_version,
             "C99, %.8s vectors (%u f32 lanes, %u registers)", rt->shape.name,
             (unsigned)(unsigned char)(rt->shape.vec_bytes / 4),
             (unsigned)(unsigned char)rt->shape.vec_regs);
    *out = rt->info;
    tb__native_rt_unref(rt);
    tb__mutex_unlock(&tb__native_mutex);
    return TB_OK;
}

static tb_status tb__native_data_from_host(void *user_data, tb_backend_data *data,
                                           const void *host) {
    tb__native_rt *rt;
    tb__native_buf *b = NULL;
    size_t size;
    tb_status st;
    (void)user_data;
    st = tb_shape_nbytes(&data->shape, &size);
    if (st != TB_OK) return st;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_device(data->device.ordinal, "native");
    st = rt != NULL ? tb__native_buf_alloc(rt, size, &b) : tb_last_status();
    tb__mutex_unlock(&tb__native_mutex);
    if (st != TB_OK) return st;
    if (size > 0) memcpy(b->ptr, host, size);
    data->payload = b;
    return TB_OK;
}

static tb_status tb__native_data_from_scalar(void *user_data, tb_backend_data *data,
                                             tb_scalar value) {
    unsigned char bytes[8];
    memset(bytes, 0, sizeof bytes);
    tb__scalar_store(value, data->shape.dtype, bytes);
    return tb__native_data_from_host(user_data, data, bytes);
}

static tb_status tb__native_data_to_host(void *user_data, const tb_backend_data *data, void *host) {
    const tb__native_buf *b = (const tb__native_buf *)data->payload;
    size_t size;
    tb_status st;
    (void)user_data;
    st = tb_shape_nbytes(&data->shape, &size);
    if (st != TB_OK) return st;
    if (b == NULL || b->size < size) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "native: data_to_host of a data without a value");
    }
    if (size > 0) memcpy(host, b->ptr, size);
    return TB_OK;
}

static void tb__native_data_release(void *user_data, tb_backend_data *data) {
    tb__native_buf *b = (tb__native_buf *)data->payload;
    (void)user_data;
    if (b == NULL) return;
    tb__mutex_lock(&tb__native_mutex);
    if (tb__native_current != NULL) {
        tb__native_buf_free(tb__native_current, b);
    } else {
        tb__native_buf_destroy(b); /* the backend exited: nothing caches it */
    }
    tb__mutex_unlock(&tb__native_mutex);
    data->payload = NULL;
}

/* The buffers are host memory: the library reads and writes them in place (a collective's
   input and result), with nothing to do at the end. */
static void *tb__native_data_map_host(void *user_data, tb_backend_data *data, bool write) {
    tb__native_rt *rt;
    tb__native_buf *b = NULL;
    size_t size;
    (void)user_data;
    if (!write) {
        b = (tb__native_buf *)data->payload;
        return b != NULL ? b->ptr : NULL;
    }
    if (tb_shape_nbytes(&data->shape, &size) != TB_OK) return NULL;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_device(data->device.ordinal, "native");
    if (rt != NULL && tb__native_buf_alloc(rt, size, &b) != TB_OK) b = NULL;
    tb__mutex_unlock(&tb__native_mutex);
    if (b == NULL) return NULL;
    data->payload = b;
    return b->ptr;
}

/* ---- backend entries: lowering, compile, execute ---- */

/* Panels a pack kernel made of one parameter's buffer, kept while that buffer (the same object,
   of the same generation) comes again. */
typedef struct tb__native_kept {
    const tb__native_buf *src;
    uint64_t gen;
    tb__native_buf *panels;
} tb__native_kept;

/* A compiled graph: its plan, its source, its program and a function per kernel. */
typedef struct tb__native_comp {
    tb__plan *plan;
    char *source;
    size_t source_len;
    tb__native_rt *rt;
    tb__native_prog **progs; /* the program's parts (tb__native_compile_parts) */
    size_t num_progs;
    tb__native_fn *fns;
    tb__native_kept *kept; /* per kernel */
} tb__native_comp;

/* A lowering context: the computation until compile takes it. */
typedef struct tb__native_context {
    tb__native_comp *comp;
} tb__native_context;

static void tb__native_comp_release(tb__native_comp *c) {
    tb__native_rt *rt;
    if (c == NULL) return;
    rt = c->rt;
    tb__mutex_lock(&tb__native_mutex);
    if (rt != NULL && c->progs != NULL) {
        size_t i;
        for (i = 0; i < c->num_progs; i++)
            if (c->progs[i] != NULL) tb__native_prog_unref(rt, c->progs[i]);
    }
    if (rt != NULL && c->kept != NULL) {
        size_t i;
        for (i = 0; i < c->plan->num_kernels; i++)
            if (c->kept[i].panels != NULL) tb__native_buf_free(rt, c->kept[i].panels);
    }
    tb__native_rt_unref(rt);
    tb__mutex_unlock(&tb__native_mutex);
    tb__free(c->kept);
    tb__free(c->fns);
    tb__free(c->progs);
    tb__free(c->source);
    tb__plan_free(c->plan);
    tb__free(c);
}

/* Plans the graph for the host's threads and renders the plan as C99. */
static tb_status tb__native_create_lowering_context(void *user_data, const tb_graph *graph,
                                                    void **context) {
    tb__native_rt *rt;
    tb__native_comp *c;
    tb__native_context *ctx;
    tb__pgraph G;
    tb__tuning tuning;
    tb__target target;
    tb__dialect dialect;
    tb_status st;
    (void)user_data;
    *context = NULL;
    ctx = (tb__native_context *)tb__calloc(1, sizeof *ctx);
    c = (tb__native_comp *)tb__calloc(1, sizeof *c);
    if (ctx == NULL || c == NULL) {
        tb__free(ctx);
        tb__free(c);
        return TB_ERR_OUT_OF_MEMORY;
    }
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_device(graph->device.ordinal, "native");
    if (rt != NULL) rt->refcount++;
    tb__mutex_unlock(&tb__native_mutex);
    if (rt == NULL) {
        tb__free(c);
        tb__free(ctx);
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    }
    tb__native_shape(rt);
    c->rt = rt;
    tb__tuning_of(TB__CLASS_HOST, &tuning);
    tb__tuning_fit(&tuning, &rt->shape);
    memset(&target, 0, sizeof target);
    target.tuning = &tuning;
    target.compute_units = rt->info.compute_units;
    target.max_group = 1;
    target.max_allocation = rt->info.max_allocation;
    target.max_args = 4096;
    target.f64 = true;
    target.acc_f64 = true;
    target.cache_bytes = rt->l2_bytes;
    target.buffer_align = 64; /* tb__native_buf_alloc */
    target.arg_table = true;  /* tb__native_emit_kernel: TB__CG_ARGS */
    tb__native_dialect(&dialect, tuning.vec_width);
    st = tb__plan_build(graph, &target, &G, &c->plan);
    if (st == TB_OK) {
        st = tb__cg_render(&G, c->plan, &dialect, &c->source, &c->source_len);
        tb__pgraph_free(&G);
    }
    if (st != TB_OK) {
        tb__native_comp_release(c);
        tb__free(ctx);
        return st;
    }
    ctx->comp = c;
    *context = ctx;
    return TB_OK;
}

static void tb__native_release_lowering_context(void *user_data, void *context) {
    tb__native_context *ctx = (tb__native_context *)context;
    (void)user_data;
    if (ctx == NULL) return;
    tb__native_comp_release(ctx->comp);
    tb__free(ctx);
}

/* ---- a program in parts, compiled at once ----
   A graph's program of many functions is compiled as several parts, each the program's head
   (the prelude every function uses) and a run of its functions, by one compiler process each,
   one per core (at most TB__NATIVE_MAX_PARTS): a first compile takes about the time of its
   largest part. Each part is cached, in memory and on disk, by its own source. */

#define TB__NATIVE_MAX_PARTS 8
/* functions per part at least: each part pays for the head once */
#define TB__NATIVE_PART_MIN 6

typedef struct tb__native_part {
    tb__native_rt *rt;
    tb__str source;
    const char **fns; /* the functions it defines */
    size_t num_fns;
    bool from_disk;
    tb__native_prog *prog;
    tb_status status;
    char why[TB__ERROR_CAP]; /* the error of a part compiled on a thread of its own */
} tb__native_part;

static void *tb__native_part_main(void *arg) {
    tb__native_part *pt = (tb__native_part *)arg;
    pt->status = tb__native_get_program(pt->rt, pt->source.data, pt->source.len,
                                        (const char *const *)pt->fns, pt->num_fns, &pt->from_disk,
                                        &pt->prog);
    if (pt->status != TB_OK) snprintf(pt->why, sizeof pt->why, "%s", tb_last_error());
    return NULL;
}

/* The parts of c's program: how many, and each one's functions (runs in order, of about
   equal text); one part is the whole source. */
static tb_status tb__native_make_parts(tb__native_comp *c, tb__native_part *parts, size_t n) {
    const tb__plan *p = c->plan;
    size_t i, at = 0, done = 0, total = 0;
    for (i = 0; i < p->num_kernels; i++)
        total += p->kernels[i].text_len;
    for (at = 0; at < n; at++) {
        parts[at].rt = c->rt;
        parts[at].fns = (const char **)tb__calloc(p->num_kernels + 1, sizeof(const char *));
        if (parts[at].fns == NULL) return TB_ERR_OUT_OF_MEMORY;
        if (n > 1) tb__str_append(&parts[at].source, "%.*s", (int)p->text_head, c->source);
    }
    for (i = 0, at = 0; i < p->num_kernels; i++) {
        const tb__plan_kernel *k = &p->kernels[i];
        tb__native_part *pt;
        if (!tb__plan_first_of_function(p, i)) continue;
        /* the next part once this one holds its share of the text */
        if (at + 1 < n && done >= total / n * (at + 1)) at++;
        pt = &parts[at];
        pt->fns[pt->num_fns++] = k->fn;
        if (n > 1) tb__str_append(&pt->source, "%.*s", (int)k->text_len, c->source + k->text_at);
        done += k->text_len;
    }
    if (n == 1) { /* the source as it is (and as the disk cache has known it) */
        tb__str_append(&parts[0].source, "%.*s", (int)c->source_len, c->source);
    }
    for (at = 0; at < n; at++)
        if (parts[at].source.failed) return TB_ERR_OUT_OF_MEMORY;
    return TB_OK;
}

/* Compiles (or finds) the parts of c's program, one compiler process per part at once,
   reporting progress as they are ready; c->progs holds them. */
static tb_status tb__native_compile_parts(tb__native_comp *c) {
    size_t functions = tb__plan_functions(c->plan), n, i, ready = 0;
    tb__native_part *parts;
    pthread_t *threads;
    bool *started, all_disk = true;
    tb_status st;
    n = functions / TB__NATIVE_PART_MIN;
    if (n > c->rt->info.compute_units) n = c->rt->info.compute_units;
    if (n > TB__NATIVE_MAX_PARTS) n = TB__NATIVE_MAX_PARTS;
    if (n < 1) n = 1;
    parts = (tb__native_part *)tb__calloc(n, sizeof *parts);
    threads = (pthread_t *)tb__calloc(n, sizeof *threads);
    started = (bool *)tb__calloc(n, sizeof *started);
    c->progs = (tb__native_prog **)tb__calloc(n, sizeof *c->progs);
    st = parts == NULL || threads == NULL || started == NULL || c->progs == NULL
             ? TB_ERR_OUT_OF_MEMORY
             : tb__native_make_parts(c, parts, n);
    while (st == TB_OK && n > 1 && parts[n - 1].num_fns == 0) { /* a large last function */
        n--;
        tb__str_free(&parts[n].source);
        tb__free(parts[n].fns);
        parts[n].fns = NULL;
    }
    tb__progress_kernels(0, functions);
    for (i = 1; i < n && st == TB_OK; i++)
        started[i] = pthread_create(&threads[i], NULL, tb__native_part_main, &parts[i]) == 0;
    for (i = 0; i < n && st == TB_OK; i++) {
        if (started[i]) {
            (void)pthread_join(threads[i], NULL);
        } else {
            tb__native_part_main(&parts[i]); /* the first on this thread; any that did not start */
        }
        ready += parts[i].num_fns;
        all_disk = all_disk && parts[i].from_disk;
        if (parts[i].status == TB_OK) tb__progress_kernels(ready, functions);
    }
    for (i = 0; parts != NULL && i < n; i++) {
        if (st == TB_OK && parts[i].status != TB_OK)
            st = tb__error(parts[i].status, "%s", parts[i].why);
        if (c->progs != NULL) c->progs[c->num_progs++] = parts[i].prog;
        tb__str_free(&parts[i].source);
        tb__free(parts[i].fns);
    }
    if (st == TB_OK && all_disk) tb__progress_from_disk();
    tb__free(parts);
    tb__free(threads);
    tb__free(started);
    return st;
}

/* Compiles (or finds) the program and looks its kernels up; the computation leaves the
   context. */
static tb_status tb__native_compile(void *user_data, void *context, void **computation) {
    tb__native_context *ctx = (tb__native_context *)context;
    tb__native_comp *c = ctx != NULL ? ctx->comp : NULL;
    tb__plan *p;
    tb_status st;
    size_t i;
    (void)user_data;
    *computation = NULL;
    if (c == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "native: compile without a context");
    p = c->plan;
    if (tb_debug_level() >= 3) {
        tb_log_message(TB_LOG_DEBUG, "native: program of graph %016llx:\n%s",
                       (unsigned long long)p->graph_hash, c->source);
    }
    c->fns = (tb__native_fn *)tb__calloc(p->num_kernels + 1, sizeof(tb__native_fn));
    c->kept = (tb__native_kept *)tb__calloc(p->num_kernels + 1, sizeof(tb__native_kept));
    if (c->fns == NULL || c->kept == NULL) return TB_ERR_OUT_OF_MEMORY;
    st = tb__native_compile_parts(c);
    for (i = 0; i < p->num_kernels && st == TB_OK; i++) {
        void *sym = NULL;
        size_t j;
        if (p->kernels[i].empty) continue;
        for (j = 0; j < c->num_progs && sym == NULL; j++)
            sym = dlsym(c->progs[j]->handle, p->kernels[i].fn);
        if (sym == NULL) {
            st =
                tb__error(TB_ERR_COMPILE, "native: the program has no kernel %s", p->kernels[i].fn);
            break;
        }
        memcpy(&c->fns[i], &sym, sizeof sym);
    }
    if (st == TB_OK && tb_debug_level() >= 1) {
        tb__str names;
        memset(&names, 0, sizeof names);
        for (i = 0; i < p->num_kernels; i++)
            if (!p->kernels[i].empty)
                tb__str_append(&names, "%s%s", names.len > 0 ? " " : "", p->kernels[i].name);
        tb_log_message(TB_LOG_INFO, "native:0: graph %016llx: %s",
                       (unsigned long long)p->graph_hash, names.data != NULL ? names.data : "");
        tb__str_free(&names);
    }
    if (st != TB_OK) return st;
    ctx->comp = NULL;
    *computation = c;
    return TB_OK;
}

static void tb__native_release_computation(void *user_data, void *computation) {
    (void)user_data;
    tb__native_comp_release((tb__native_comp *)computation);
}

static const char *tb__native_backend_text(void *user_data, const void *computation) {
    (void)user_data;
    return computation != NULL ? ((const tb__native_comp *)computation)->source : NULL;
}

static int32_t tb__native_get_node_kernel(void *user_data, const void *computation,
                                          size_t node_index, const char **kernel_name) {
    const tb__native_comp *c = (const tb__native_comp *)computation;
    int32_t k;
    (void)user_data;
    if (kernel_name != NULL) *kernel_name = NULL;
    if (c == NULL || c->plan->node_kernel == NULL || node_index >= c->plan->num_nodes) return -1;
    k = c->plan->node_kernel[node_index];
    if (k >= 0 && kernel_name != NULL) *kernel_name = c->plan->kernels[k].name;
    return k;
}

/* The buffers of a run: the parameters' (borrowed) and the kernels' outputs (owned until they
   are results or freed after their last use). */
typedef struct tb__native_run_state {
    tb__native_buf **owned;
    unsigned char **ptrs;
    void **argv;
    uint32_t err[TB__ERR_WORDS];
} tb__native_run_state;

static tb_status tb__native_run_init(tb__native_comp *c, tb_backend_data *const *arguments,
                                     tb__native_run_state *s, unsigned char **table) {
    const tb__plan *p = c->plan;
    size_t i, most = 1;
    *table = NULL;
    memset(s, 0, sizeof *s);
    for (i = 0; i < p->num_kernels; i++)
        if (p->kernels[i].num_args + 1 > most) most = p->kernels[i].num_args + 1;
    s->owned = (tb__native_buf **)tb__calloc(p->num_slots + 1, sizeof *s->owned);
    s->ptrs = (unsigned char **)tb__calloc(p->num_slots + 1, sizeof *s->ptrs);
    s->argv = (void **)tb__calloc(most, sizeof *s->argv);
    if (s->owned == NULL || s->ptrs == NULL || s->argv == NULL) return TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < p->num_slots; i++) {
        const tb__native_buf *b;
        if (p->slots[i].kind != TB__SLOT_PARAM) continue;
        b = (const tb__native_buf *)arguments[p->slots[i].index]->payload;
        if (b == NULL)
            return tb__error(TB_ERR_INVALID_ARGUMENT, "native: an argument has no value");
        s->ptrs[i] = b->ptr;
    }
    for (i = 0; i < p->num_results; i++) {
        /* a result computed into a donated parameter's buffer */
        if (p->result_alias[i] >= 0)
            s->ptrs[p->result_slot[i]] =
                ((tb__native_buf *)arguments[p->result_alias[i]]->payload)->ptr;
    }
    if (p->scalar_table) {
        /* each kernel's run of entries: the scalars it reads, in its order */
        *table = (unsigned char *)tb__calloc(p->table_len + 1, 8);
        if (*table == NULL) return TB_ERR_OUT_OF_MEMORY;
        for (i = 0; i < p->num_kernels; i++) {
            const tb__plan_kernel *k = &p->kernels[i];
            size_t j;
            for (j = 0; j < k->num_table_params; j++) {
                int32_t a = k->table_params[j];
                const tb__native_buf *b = (const tb__native_buf *)arguments[a]->payload;
                if (b != NULL)
                    memcpy(*table + 8 * ((size_t)k->table_at + j), b->ptr,
                           tb_dtype_size(p->param_dtype[a]));
            }
        }
    }
    return TB_OK;
}

/* Runs kernel i: its output allocated, its arguments gathered, its work items on the pool. */
static tb_status tb__native_run_kernel(tb__native_comp *c, size_t i,
                                       tb_backend_data *const *arguments, tb__native_run_state *s,
                                       unsigned char *table) {
    const tb__plan *p = c->plan;
    const tb__plan_kernel *k = &p->kernels[i];
    uint64_t size[3], t0;
    size_t j;
    const tb__native_buf *src =
        k->pack_param >= 0 ? (const tb__native_buf *)arguments[k->pack_param]->payload : NULL;
    tb__native_kept *kp = &c->kept[i];
    if (src != NULL && kp->panels != NULL && kp->src == src && kp->gen == src->gen) {
        s->ptrs[k->out_slot] = kp->panels->ptr; /* the panels of this buffer, made before */
        return TB_OK;
    }
    if (s->ptrs[k->out_slot] == NULL) {
        size_t bytes = 0;
        tb_status st = tb_shape_nbytes(&p->slots[k->out_slot].shape, &bytes);
        if (st != TB_OK) return st;
        tb__mutex_lock(&tb__native_mutex);
        st = tb__native_buf_alloc(c->rt, bytes, &s->owned[k->out_slot]);
        tb__mutex_unlock(&tb__native_mutex);
        if (st != TB_OK) return st;
        s->ptrs[k->out_slot] = s->owned[k->out_slot]->ptr;
    }
    if (k->empty) return TB_OK;
    s->argv[0] = s->ptrs[k->out_slot];
    for (j = 0; j < k->num_args; j++) {
        const tb__plan_arg *a = &k->args[j];
        if (a->kind == TB__ARG_BUF) {
            s->argv[j + 1] = s->ptrs[a->index];
        } else if (a->kind == TB__ARG_SCALAR) {
            s->argv[j + 1] = ((tb__native_buf *)arguments[a->index]->payload)->ptr;
        } else if (a->kind == TB__ARG_TABLE) {
            s->argv[j + 1] = table + 8 * (size_t)k->table_at; /* the kernel's run of the table */
        } else {
            s->argv[j + 1] = s->err;
        }
    }
    tb__native_global_size(k, size);
    t0 = tb_debug_level() >= 2 ? tb__now_ns() : 0;
    tb__native_run(c->rt->pool, c->fns[i], s->argv, (int64_t)(size[0] * size[1] * size[2]),
                   k->bytes + k->flops);
    (void)TB__ATOMIC_ADD(&c->rt->kernels_launched, 1);
    if (src != NULL && s->owned[k->out_slot] != NULL &&
        (uint64_t)s->owned[k->out_slot]->cap <= c->rt->cache_limit) {
        /* keep the panels with the computation (the next run of this buffer skips the pack) */
        tb__mutex_lock(&tb__native_mutex);
        if (kp->panels != NULL) tb__native_buf_free(c->rt, kp->panels);
        tb__mutex_unlock(&tb__native_mutex);
        kp->panels = s->owned[k->out_slot];
        kp->src = src;
        kp->gen = src->gen;
        s->owned[k->out_slot] = NULL;
    }
    if (tb_debug_level() >= 2) {
        double ns = (double)(tb__now_ns() - t0);
        if (ns < 1) ns = 1;
        tb_log_message(TB_LOG_DEBUG, "native:0 %-24s %10.3f ms %9.2f GB/s %9.2f GFLOP/s", k->name,
                       ns / 1e6, k->bytes / ns, k->flops / ns);
    }
    return TB_OK;
}

static tb_status tb__native_execute(void *user_data, void *computation,
                                    tb_backend_data *const *arguments, size_t num_arguments,
                                    tb_backend_data *const *results, size_t num_results) {
    tb__native_comp *c = (tb__native_comp *)computation;
    const tb__plan *p = c != NULL ? c->plan : NULL;
    tb__native_run_state s;
    unsigned char *table = NULL;
    tb_status st;
    size_t i, j;
    bool consumed = false;
    (void)user_data;
    if (p == NULL || num_arguments != p->num_params || num_results != p->num_results) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "native: execute with %zu arguments and %zu results, the computation has "
                         "%zu and %zu",
                         num_arguments, num_results, p != NULL ? p->num_params : 0,
                         p != NULL ? p->num_results : 0);
    }
    if (c->rt->exited)
        return tb__error(TB_ERR_STATE, "native: the computation outlived the backend");
    tb__mutex_lock(&tb__native_run_mutex);
    st = tb__native_run_init(c, arguments, &s, &table);
    for (i = 0; i < p->num_kernels && st == TB_OK; i++) {
        if ((int32_t)i == p->first_alias) {
            /* the kernels from here on write into donated buffers and cannot fail: a flag
               raised before them fails the run with the donated values intact */
            if (s.err[0] != 0) {
                st = tb__cg_run_error(p, "native", s.err);
                break;
            }
            consumed = true;
            for (j = 0; j < p->num_results; j++)
                if (p->result_alias[j] >= 0) /* panels kept from it are stale from here on */
                    ((tb__native_buf *)arguments[p->result_alias[j]]->payload)->gen =
                        tb__next_generation();
        }
        st = tb__native_run_kernel(c, i, arguments, &s, table);
        /* temporaries nobody reads any more go back to the cache */
        tb__mutex_lock(&tb__native_mutex);
        for (j = 0; j < p->num_slots; j++) {
            if (p->slots[j].kind == TB__SLOT_TEMP && s.owned != NULL && s.owned[j] != NULL &&
                p->slots[j].last_use <= (int32_t)i) {
                tb__native_buf_free(c->rt, s.owned[j]);
                s.owned[j] = NULL;
                s.ptrs[j] = NULL;
            }
        }
        tb__mutex_unlock(&tb__native_mutex);
    }
    if (st == TB_OK && s.err[0] != 0) st = tb__cg_run_error(p, "native", s.err);
    tb__mutex_lock(&tb__native_mutex);
    for (i = 0; i < p->num_results && st == TB_OK; i++) {
        int32_t src = p->result_source[i];
        tb__native_buf *copy = NULL;
        size_t bytes = 0;
        if (src < 0) continue;
        /* the buffer it repeats may be a donated one: its size is the slot's */
        st = tb_shape_nbytes(&p->slots[p->result_slot[src]].shape, &bytes);
        if (st == TB_OK) st = tb__native_buf_alloc(c->rt, bytes, &copy);
        if (st != TB_OK) break;
        if (bytes > 0) memcpy(copy->ptr, s.ptrs[p->result_slot[src]], bytes);
        results[i]->payload = copy;
    }
    for (i = 0; i < p->num_results; i++) {
        int32_t d = p->result_alias[i];
        if (d >= 0) {
            /* the donated buffer is the result's (success), or freed once written (failure) */
            if (st == TB_OK) {
                results[i]->payload = arguments[d]->payload;
                arguments[d]->payload = NULL;
            } else if (consumed) {
                tb__native_buf_free(c->rt, (tb__native_buf *)arguments[d]->payload);
                arguments[d]->payload = NULL;
            }
            continue;
        }
        if (p->result_source[i] >= 0) {
            if (st != TB_OK && results[i]->payload != NULL) {
                tb__native_buf_free(c->rt, (tb__native_buf *)results[i]->payload);
                results[i]->payload = NULL;
            }
        } else if (st == TB_OK) {
            results[i]->payload = s.owned[p->result_slot[i]];
            s.owned[p->result_slot[i]] = NULL;
        }
    }
    if (s.owned != NULL) {
        for (i = 0; i < p->num_slots; i++)
            tb__native_buf_free(c->rt, s.owned[i]);
    }
    tb__mutex_unlock(&tb__native_mutex);
    tb__mutex_unlock(&tb__native_run_mutex);
    tb__free(s.owned);
    tb__free(s.ptrs);
    tb__free(s.argv);
    tb__free(table);
    return st;
}

/* ---- backend entries: IR hooks, lifetime, registration ---- */

/* Every built-in op; custom ops with a kernel expression (compiled as C99 with <tgmath.h>). */
static bool tb__native_supports_node(void *user_data, const tb_node *node) {
    (void)user_data;
    if (node->op >= TB_OP_BUILTIN_COUNT) {
        const tb_custom_op_desc *d = tb__plan_custom(node->op);
        return d != NULL && d->opencl_expr != NULL && d->infer_shape == NULL;
    }
    return node->op >= 0;
}

static size_t tb__native_metrics_report(void *user_data, char *buf, size_t cap) {
    tb__str s;
    tb__native_rt *rt;
    size_t n;
    char *text;
    (void)user_data;
    memset(&s, 0, sizeof s);
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_rt_get();
    if (rt == NULL || rt->status != TB_OK) {
        tb__str_append(&s, "Native: unavailable: %s\n", rt != NULL ? rt->reason : "out of memory");
    } else {
        tb__str_append(&s, "Device: native:0 (%s, %u threads)\n", rt->info.name,
                       (unsigned)rt->info.compute_units);
        tb__str_append(&s, "  Native::Compiler: %s %s\n", rt->cc_command, rt->options);
        tb__str_append(&s, "  Native::BytesInUse: %llu\n", (unsigned long long)rt->bytes_in_use);
        tb__str_append(&s, "  Native::PeakBytesInUse: %llu\n", (unsigned long long)rt->peak_bytes);
        tb__str_append(&s, "  Native::BytesCached: %llu\n", (unsigned long long)rt->cached_bytes);
        tb__str_append(&s, "  Native::ProgramCompile: %llu\n", (unsigned long long)rt->compiles);
        tb__str_append(&s, "  Native::DiskCacheHit: %llu\n", (unsigned long long)rt->disk_hits);
        tb__str_append(&s, "  Native::DiskCacheMiss: %llu\n", (unsigned long long)rt->disk_misses);
        tb__str_append(&s, "  Native::DiskCacheRejected: %llu\n",
                       (unsigned long long)rt->disk_rejected);
        tb__str_append(&s, "  Native::KernelLaunch: %llu\n",
                       (unsigned long long)rt->kernels_launched);
    }
    tb__mutex_unlock(&tb__native_mutex);
    text = tb__str_take(&s);
    if (text == NULL) {
        if (cap > 0) buf[0] = '\0';
        return 0;
    }
    n = strlen(text);
    if (cap > 0) {
        size_t k = n < cap - 1 ? n : cap - 1;
        memcpy(buf, text, k);
        buf[k] = '\0';
    }
    tb__free(text);
    return n;
}

static void tb__native_prepare_to_exit(void *user_data) {
    tb__native_rt *rt;
    (void)user_data;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_current;
    if (rt != NULL) {
        tb__native_cache_trim(rt, 0);
        tb__native_progs_trim(rt, 0);
        rt->exited = true;
        tb__native_current = NULL;
        tb__native_rt_unref(rt);
    }
    tb__mutex_unlock(&tb__native_mutex);
}

/* registers the "native" backend (called by tb__register_builtin_backends) */
static tb_status tb__native_register(void) {
    tb_backend_impl impl;
    memset(&impl, 0, sizeof impl);
    impl.prepare_to_exit = tb__native_prepare_to_exit;
    impl.supports_node = tb__native_supports_node;
    impl.data_from_host = tb__native_data_from_host;
    impl.data_from_scalar = tb__native_data_from_scalar;
    impl.data_to_host = tb__native_data_to_host;
    impl.data_release = tb__native_data_release;
    impl.data_map_host = tb__native_data_map_host;
    impl.create_lowering_context = tb__native_create_lowering_context;
    impl.release_lowering_context = tb__native_release_lowering_context;
    impl.compile = tb__native_compile;
    impl.execute = tb__native_execute;
    impl.release_computation = tb__native_release_computation;
    impl.computation_backend_text = tb__native_backend_text;
    impl.get_node_kernel = tb__native_get_node_kernel;
    impl.get_backend_devices = tb__native_get_backend_devices;
    impl.get_device_info = tb__native_get_device_info;
    impl.create_metrics_report = tb__native_metrics_report;
    return tb_backend_register("native", &impl, "");
}

#endif /* TB__HAVE_NATIVE */
