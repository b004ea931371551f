/* ===========================================================================================
   The "cpu" backend: host memory plus the reference interpreter. Always present, needs
   nothing but the C library; the eager fallback and the correctness oracle of the others.
   =========================================================================================== */
#include "../impl_begin.h"

/* A graph kept for execution: a detached copy of its structure, so that a cached computation
   holds no tensor's value (parameters arrive as execute arguments). */
typedef struct tb__cpu_program {
    tb__detached_graph detached;
    char *text; /* computation_backend_text, built on first use */
} tb__cpu_program;

/* The lowering context owns a program until compile moves it into the computation. */
typedef struct tb__cpu_context {
    tb__cpu_program *program;
} tb__cpu_context;

static void tb__cpu_program_free(tb__cpu_program *p) {
    if (p == NULL) return;
    tb__graph_detached_free(&p->detached);
    tb__free(p->text);
    tb__free(p);
}

/* The payload of a cpu data: a host array, owned or borrowed from the caller. A borrowed array
   may carry a release callback, called once when the buffer is freed (DLPack's deleter). */
typedef struct tb__host_buffer {
    void *data;
    size_t size;
    bool borrowed;
    void (*release)(void *context);
    void *release_context;
} tb__host_buffer;

/* An owned host buffer of `size` bytes (uninitialised). */
static tb__host_buffer *tb__host_buffer_new(size_t size) {
    tb__host_buffer *hb = (tb__host_buffer *)tb__alloc(sizeof *hb);
    if (hb == NULL) return NULL;
    hb->data = tb__alloc(size);
    if (hb->data == NULL) {
        tb__free(hb);
        return NULL;
    }
    hb->size = size;
    hb->borrowed = false;
    hb->release = NULL;
    hb->release_context = NULL;
    return hb;
}

static void tb__host_buffer_free(tb__host_buffer *hb) {
    if (hb == NULL) return;
    if (!hb->borrowed) tb__free(hb->data);
    if (hb->borrowed && hb->release != NULL) hb->release(hb->release_context);
    tb__free(hb);
}

static void *tb__cpu_data_host_pointer(void *user_data, const tb_backend_data *data) {
    (void)user_data;
    return data->payload != NULL ? ((const tb__host_buffer *)data->payload)->data : NULL;
}

static tb_status tb__cpu_data_borrow_host(void *user_data, tb_backend_data *data, void *host,
                                          void (*release)(void *context), void *context) {
    size_t nbytes = 0;
    tb__host_buffer *hb;
    tb_status st;
    (void)user_data;
    st = tb_shape_nbytes(&data->shape, &nbytes);
    if (st != TB_OK) return st;
    hb = (tb__host_buffer *)tb__alloc(sizeof *hb);
    if (hb == NULL) return tb_last_status();
    hb->data = host;
    hb->size = nbytes;
    hb->borrowed = true;
    hb->release = release;
    hb->release_context = context;
    data->payload = hb;
    return TB_OK;
}

static tb_status tb__cpu_data_from_host(void *user_data, tb_backend_data *data, const void *host) {
    size_t nbytes = 0;
    tb__host_buffer *hb;
    tb_status st;
    (void)user_data;
    st = tb_shape_nbytes(&data->shape, &nbytes);
    if (st != TB_OK) return st;
    hb = tb__host_buffer_new(nbytes);
    if (hb == NULL) return tb_last_status();
    if (nbytes > 0) memcpy(hb->data, host, nbytes);
    data->payload = hb;
    return TB_OK;
}

static tb_status tb__cpu_data_from_scalar(void *user_data, tb_backend_data *data, tb_scalar value) {
    size_t size = tb_dtype_size(data->shape.dtype);
    tb__host_buffer *hb;
    (void)user_data;
    if (size == 0) {
        return tb__error(TB_ERR_DTYPE, "cpu: data_from_scalar: invalid dtype %d",
                         (int)data->shape.dtype);
    }
    hb = tb__host_buffer_new(size);
    if (hb == NULL) return tb_last_status();
    tb__scalar_store(value, data->shape.dtype, hb->data);
    data->payload = hb;
    return TB_OK;
}

static tb_status tb__cpu_data_to_host(void *user_data, const tb_backend_data *data, void *host) {
    const tb__host_buffer *hb = (const tb__host_buffer *)data->payload;
    size_t nbytes = 0;
    tb_status st;
    (void)user_data;
    st = tb_shape_nbytes(&data->shape, &nbytes);
    if (st != TB_OK) return st;
    if (hb == NULL || hb->size < nbytes) {
        return tb__error(TB_ERR_INTERNAL,
                         "cpu: data_to_host: the buffer holds %zu bytes, %zu "
                         "wanted",
                         hb != NULL ? hb->size : (size_t)0, nbytes);
    }
    if (nbytes > 0) memcpy(host, hb->data, nbytes);
    return TB_OK;
}

static void tb__cpu_data_release(void *user_data, tb_backend_data *data) {
    (void)user_data;
    tb__host_buffer_free((tb__host_buffer *)data->payload);
    data->payload = NULL;
}

static tb_status tb__cpu_create_lowering_context(void *user_data, const tb_graph *graph,
                                                 void **context) {
    tb__cpu_context *ctx;
    tb__cpu_program *p;
    tb_status st;
    (void)user_data;
    if (graph == NULL || context == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "cpu: create_lowering_context: %s is NULL",
                         graph == NULL ? "graph" : "context");
    }
    if ((graph->num_nodes > 0 && graph->nodes == NULL) ||
        (graph->num_parameters > 0 && graph->parameters == NULL) ||
        (graph->num_results > 0 && graph->results == NULL)) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "cpu: create_lowering_context: a node array "
                                                  "of the graph is NULL");
    }
    ctx = (tb__cpu_context *)tb__calloc(1, sizeof *ctx);
    p = ctx != NULL ? (tb__cpu_program *)tb__calloc(1, sizeof *p) : NULL;
    if (p == NULL) {
        tb__free(ctx);
        return tb_last_status();
    }
    st = tb__graph_detach(graph, &p->detached);
    if (st != TB_OK) {
        if (tb_last_status() == TB_OK) tb__error(st, "cpu: create_lowering_context: out of memory");
        tb__free(p);
        tb__free(ctx);
        return st;
    }
    ctx->program = p;
    *context = ctx;
    return TB_OK;
}

static void tb__cpu_release_lowering_context(void *user_data, void *context) {
    tb__cpu_context *ctx = (tb__cpu_context *)context;
    (void)user_data;
    if (ctx == NULL) return;
    tb__cpu_program_free(ctx->program); /* NULL once compile took it */
    tb__free(ctx);
}

/* The position of `node` among nodes[0..count): the detached copies were made in post-order,
   so their ids increase along the array. */
static size_t tb__cpu_position(const tb_node *const *nodes, size_t count, const tb_node *node) {
    size_t lo = 0, hi = count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (nodes[mid]->id < node->id) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < count && nodes[lo] == node ? lo : count;
}

/* "cpu reference computation: ..." then one line per node in post-order, named by position. */
static char *tb__cpu_program_text(const tb__cpu_program *p) {
    const tb_graph *g = &p->detached.graph;
    tb__str s;
    size_t i, j;
    memset(&s, 0, sizeof s);
    tb__str_append(&s,
                   "cpu reference computation: hash 0x%016llx, %zu nodes, %zu parameters, %zu "
                   "results\n",
                   (unsigned long long)g->hash, g->num_nodes, g->num_parameters, g->num_results);
    for (i = 0; i < g->num_nodes; i++) {
        const tb_node *n = g->nodes[i];
        const char *name = tb_op_name(n->op);
        char text[96];
        tb__shape_text(&n->shape, text);
        tb__str_append(&s, "  %%%zu = %s(", i, name != NULL ? name : "?");
        for (j = 0; j < n->num_operands; j++) {
            tb__str_append(&s, j == 0 ? "%%%zu" : ", %%%zu",
                           tb__cpu_position(g->nodes, i, n->operands[j]));
        }
        tb__str_append(&s, ") %s\n", text);
    }
    return tb__str_take(&s);
}

static tb_status tb__cpu_compile(void *user_data, void *context, void **computation) {
    tb__cpu_context *ctx = (tb__cpu_context *)context;
    (void)user_data;
    if (ctx == NULL || ctx->program == NULL || computation == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "cpu: compile: no lowering context");
    }
    /* nothing to compile: the interpreter runs the detached graph */
    *computation = ctx->program;
    ctx->program = NULL;
    return TB_OK;
}

static tb_status tb__cpu_execute(void *user_data, void *computation,
                                 tb_backend_data *const *arguments, size_t num_arguments,
                                 tb_backend_data *const *results, size_t num_results) {
    tb__cpu_program *p = (tb__cpu_program *)computation;
    const void **params = NULL;
    void **outs = NULL;
    tb__host_buffer **buffers = NULL;
    tb_status st = TB_OK;
    size_t i;
    (void)user_data;
    if (p == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "cpu: execute: computation is NULL");
    if (num_arguments != p->detached.graph.num_parameters ||
        num_results != p->detached.graph.num_results) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "cpu: execute: %zu arguments and %zu results given, the computation "
                         "takes %zu and gives %zu",
                         num_arguments, num_results, p->detached.graph.num_parameters,
                         p->detached.graph.num_results);
    }
    params = (const void **)tb__calloc(num_arguments + 1, sizeof *params);
    outs = (void **)tb__calloc(num_results + 1, sizeof *outs);
    buffers = (tb__host_buffer **)tb__calloc(num_results + 1, sizeof *buffers);
    if (params == NULL || outs == NULL || buffers == NULL) {
        st = tb_last_status();
        goto done;
    }
    for (i = 0; i < num_arguments; i++) {
        const tb__host_buffer *hb =
            arguments[i] != NULL ? (const tb__host_buffer *)arguments[i]->payload : NULL;
        if (hb == NULL) {
            st = tb__error(TB_ERR_INVALID_ARGUMENT, "cpu: execute: argument %zu has no value", i);
            goto done;
        }
        params[i] = hb->data;
    }
    for (i = 0; i < num_results; i++) {
        size_t nbytes = 0;
        if (results[i] == NULL) {
            st = tb__error(TB_ERR_INVALID_ARGUMENT, "cpu: execute: result %zu is NULL", i);
            goto done;
        }
        st = tb_shape_nbytes(&results[i]->shape, &nbytes);
        if (st != TB_OK) goto done;
        buffers[i] = tb__host_buffer_new(nbytes);
        if (buffers[i] == NULL) {
            st = tb_last_status();
            goto done;
        }
        outs[i] = buffers[i]->data;
    }
    st = tb__ref_run_graph(&p->detached.graph, params, outs);
    if (st != TB_OK) goto done;
    for (i = 0; i < num_results; i++) {
        /* LTC's Assign: a placeholder that already had a value gets the new one */
        tb__host_buffer_free((tb__host_buffer *)results[i]->payload);
        results[i]->payload = buffers[i];
        buffers[i] = NULL;
    }
done:
    if (buffers != NULL) {
        for (i = 0; i < num_results; i++)
            tb__host_buffer_free(buffers[i]);
    }
    tb__free(buffers);
    tb__free(outs);
    tb__free((void *)params);
    return st;
}

static void tb__cpu_release_computation(void *user_data, void *computation) {
    (void)user_data;
    tb__cpu_program_free((tb__cpu_program *)computation);
}

/* Built on first use (most computations are never printed), under a lock since a cached
   computation may be printed from several threads. */
static tb__mutex tb__cpu_text_mutex = TB__MUTEX_INIT;

static const char *tb__cpu_backend_text(void *user_data, const void *computation) {
    tb__cpu_program *p;
    const char *text;
    (void)user_data;
    if (computation == NULL) return NULL;
    memcpy(&p, &computation, sizeof p); /* the cache is ours to fill */
    tb__mutex_lock(&tb__cpu_text_mutex);
    if (p->text == NULL) p->text = tb__cpu_program_text(p);
    text = p->text;
    tb__mutex_unlock(&tb__cpu_text_mutex);
    return text;
}

static size_t tb__cpu_get_backend_devices(void *user_data, tb_device *out, size_t cap) {
    (void)user_data;
    if (out != NULL && cap > 0) {
        memset(&out[0], 0, sizeof out[0]);
        memcpy(out[0].backend, "cpu", 4);
        out[0].type = TB_DEVICE_CPU;
        out[0].ordinal = 0;
    }
    return 1;
}

static uint64_t tb__cpu_physical_memory(void) {
#if defined(_WIN32)
    MEMORYSTATUSEX status;
    status.dwLength = sizeof status;
    return GlobalMemoryStatusEx(&status) ? (uint64_t)status.ullTotalPhys : 0;
#elif defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
#else
    return 0;
#endif
}

static uint32_t tb__cpu_count(void) {
#if defined(_WIN32)
    SYSTEM_INFO info;
    GetSystemInfo(&info);
    return (uint32_t)info.dwNumberOfProcessors;
#elif defined(_SC_NPROCESSORS_ONLN)
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (uint32_t)n : 1;
#else
    return 1;
#endif
}

static tb_status tb__cpu_get_device_info(void *user_data, int32_t ordinal, tb_device_info *out) {
    (void)user_data;
    if (ordinal != 0) {
        return tb__error(TB_ERR_NOT_FOUND, "cpu: device ordinal %d out of range: 1 device",
                         (int)ordinal);
    }
    snprintf(out->name, sizeof out->name, "reference");
    snprintf(out->vendor, sizeof out->vendor, "torch_backend.h");
    snprintf(out->driver_version, sizeof out->driver_version, "%s", TB_VERSION_STRING);
    snprintf(out->language_version, sizeof out->language_version, "C");
    out->global_memory = tb__cpu_physical_memory();
    out->max_allocation = out->global_memory;
    out->compute_units = tb__cpu_count();
    out->max_work_group_size = 1;
    out->unified_memory = true;
    out->supports_f64 = true;
    out->extensions[0] = '\0';
    return TB_OK;
}

static tb_device_type tb__cpu_eager_fallback(void *user_data) {
    (void)user_data;
    return TB_DEVICE_CPU;
}

static size_t tb__cpu_metrics_report(void *user_data, char *buf, size_t cap) {
    (void)user_data;
    if (buf != NULL && cap > 0) buf[0] = '\0';
    return 0;
}

static void tb__cpu_backend_impl(tb_backend_impl *out) {
    memset(out, 0, sizeof *out);
    out->data_from_host = tb__cpu_data_from_host;
    out->data_from_scalar = tb__cpu_data_from_scalar;
    out->data_to_host = tb__cpu_data_to_host;
    out->data_release = tb__cpu_data_release;
    out->create_lowering_context = tb__cpu_create_lowering_context;
    out->release_lowering_context = tb__cpu_release_lowering_context;
    out->compile = tb__cpu_compile;
    out->execute = tb__cpu_execute;
    out->release_computation = tb__cpu_release_computation;
    out->computation_backend_text = tb__cpu_backend_text;
    out->get_backend_devices = tb__cpu_get_backend_devices;
    out->get_device_info = tb__cpu_get_device_info;
    out->eager_fallback_device_type = tb__cpu_eager_fallback;
    out->create_metrics_report = tb__cpu_metrics_report;
    out->data_host_pointer = tb__cpu_data_host_pointer;
    out->data_borrow_host = tb__cpu_data_borrow_host;
}

/* Registers the "cpu" backend as the registry's reference (called by the registry through the
   wiring). */
static tb_status tb__cpu_register(void) {
    tb_backend_impl impl;
    tb_backend *cpu = NULL;
    tb_status st;
    tb__cpu_backend_impl(&impl);
    st = tb__backend_register("tb_backend_register", "cpu", &impl, "", NULL, &cpu);
    if (st == TB_OK) tb__registry_set_reference(cpu);
    return st;
}
