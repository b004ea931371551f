/* ===========================================================================================
   The compiled-backend kit (kit.h): the backend entries of every runtime that runs the
   planner's kernels, written once over the runtime's table.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

static void tb__kit_scalar_bytes(tb_dtype dtype, tb_scalar s, unsigned char out[8]) {
    /* converted as the reference backend converts (NaN and out-of-range values defined), so
       that a kernel sees the value the cpu backend computes with */
    memset(out, 0, 8);
    tb__scalar_store(s, dtype, out);
}

/* the value of a scalar stored as the bytes of `dtype` (integers exact, not through a double) */
static tb_scalar tb__kit_scalar_of(tb_dtype dtype, const unsigned char raw[8]) {
    if (tb_dtype_is_float(dtype)) return tb_scalar_f(dtype, tb__exec_host_to_double(raw, dtype));
    if (dtype == TB_I32) {
        int32_t x;
        memcpy(&x, raw, sizeof x);
        return tb_scalar_i(TB_I32, x);
    }
    if (dtype == TB_I64) {
        int64_t x;
        memcpy(&x, raw, sizeof x);
        return tb_scalar_i(TB_I64, x);
    }
    return tb_scalar_i(dtype, raw[0]);
}

/* A buffer from the runtime, of a new generation (kept panels know their buffer by it). */
static tb_status tb__kit_alloc(const tb_kit_runtime *R, void *dev, size_t bytes,
                               tb_kit_buffer **out) {
    tb_status st = R->alloc(dev, bytes, out);
    if (st == TB_OK) (*out)->gen = tb__next_generation();
    return st;
}

static tb_status tb__kit_failed(tb_status fallback) {
    return tb_last_status() != TB_OK ? tb_last_status() : fallback;
}

/* the plan's argument kinds are the public ones, and the error flag is 32 bytes */
typedef char
    tb__kit_arg_kinds_agree[((int)TB__ARG_BUF == (int)TB_KIT_ARG_BUFFER &&
                             (int)TB__ARG_SCALAR == (int)TB_KIT_ARG_SCALAR &&
                             (int)TB__ARG_ERR == (int)TB_KIT_ARG_ERROR &&
                             (int)TB__ARG_TABLE == (int)TB_KIT_ARG_TABLE && TB__ERR_WORDS * 4 == 32)
                                ? 1
                                : -1];

/* ---- devices and data ---- */

static size_t tb__kit_get_backend_devices(void *user_data, tb_device *out, size_t cap) {
    const tb_kit_runtime *R = (const tb_kit_runtime *)user_data;
    char why[8];
    return R->devices(out, cap, why, sizeof why);
}

static tb_status tb__kit_get_device_info(void *user_data, int32_t ordinal, tb_device_info *out) {
    const tb_kit_runtime *R = (const tb_kit_runtime *)user_data;
    void *dev = R->open(ordinal, R->name, true);
    if (dev == NULL) return tb__kit_failed(TB_ERR_UNAVAILABLE);
    R->info(dev, true, out);
    R->close(dev);
    return TB_OK;
}

static tb_status tb__kit_data_from_host(void *user_data, tb_backend_data *data, const void *host) {
    const tb_kit_runtime *R = (const tb_kit_runtime *)user_data;
    tb_kit_buffer *b = NULL;
    size_t size;
    void *dev;
    tb_status st = tb_shape_nbytes(&data->shape, &size);
    if (st != TB_OK) return st;
    dev = R->open(data->device.ordinal, R->name, false);
    if (dev == NULL) return tb__kit_failed(TB_ERR_UNAVAILABLE);
    R->lock(dev);
    st = tb__kit_alloc(R, dev, size, &b);
    if (st == TB_OK) {
        st = R->write(dev, b, host, size);
        if (st != TB_OK) R->release(b);
    }
    R->unlock(dev);
    R->close(dev);
    if (st == TB_OK) data->payload = b;
    return st;
}

/* The value stays on the host (kernels take scalars as arguments): a buffer without memory
   that keeps the device's runtime. Memory is made only if a kernel reads it as an array. */
static tb_status tb__kit_data_from_scalar(void *user_data, tb_backend_data *data, tb_scalar value) {
    const tb_kit_runtime *R = (const tb_kit_runtime *)user_data;
    tb_kit_buffer *b = (tb_kit_buffer *)tb__calloc(1, sizeof *b);
    if (b == NULL) return TB_ERR_OUT_OF_MEMORY;
    b->device = R->open(data->device.ordinal, R->name, false);
    if (b->device == NULL) {
        tb__free(b);
        return tb__kit_failed(TB_ERR_UNAVAILABLE);
    }
    b->shell = true;
    data->is_scalar = true;
    data->scalar = value;
    data->payload = b;
    return TB_OK;
}

/* a buffer of data_from_scalar given back (its memory, then its device's reference) */
static void tb__kit_shell_free(const tb_kit_runtime *R, tb_kit_buffer *b) {
    if (b->real != NULL) {
        R->lock(b->device);
        R->release(b->real);
        R->unlock(b->device);
    }
    R->close(b->device);
    tb__free(b);
}

static tb_status tb__kit_data_to_host(void *user_data, const tb_backend_data *data, void *host) {
    const tb_kit_runtime *R = (const tb_kit_runtime *)user_data;
    const tb_kit_buffer *b = (const tb_kit_buffer *)data->payload;
    size_t size;
    tb_status st = tb_shape_nbytes(&data->shape, &size);
    if (st != TB_OK) return st;
    if (b == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: data_to_host of a data without a value",
                         R->name);
    }
    if (b->shell) {
        unsigned char bytes[8];
        tb__kit_scalar_bytes(data->shape.dtype, data->scalar, bytes);
        memcpy(host, bytes, size < 8 ? size : 8);
        return TB_OK;
    }
    if (b->size < size) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: data_to_host of %zu bytes from a buffer of %zu", R->name, size,
                         b->size);
    }
    R->lock(b->device);
    if (!R->alive(b->device)) {
        st = tb__error(TB_ERR_STATE, "%s: the backend was shut down", R->name);
    } else {
        st = R->read(b->device, b, host, size);
    }
    R->unlock(b->device);
    return st;
}

static void tb__kit_data_release(void *user_data, tb_backend_data *data) {
    const tb_kit_runtime *R = (const tb_kit_runtime *)user_data;
    tb_kit_buffer *b = (tb_kit_buffer *)data->payload;
    void *dev;
    if (b == NULL) return;
    data->payload = NULL;
    if (b->shell) {
        tb__kit_shell_free(R, b);
        return;
    }
    dev = b->device;
    R->lock(dev);
    R->release(b);
    R->unlock(dev);
}

/* Where the runtime can: the buffer in the host's address space for one host step (read: the
   data's buffer; write: a new one that becomes the data's), then unmapped. NULL: the library
   copies instead. */
static void *tb__kit_data_map_host(void *user_data, tb_backend_data *data, bool write) {
    const tb_kit_runtime *R = (const tb_kit_runtime *)user_data;
    tb_kit_buffer *b = (tb_kit_buffer *)data->payload;
    void *dev, *p = NULL;
    size_t size;
    if (R->map == NULL || tb_shape_nbytes(&data->shape, &size) != TB_OK || size == 0) return NULL;
    if (!write) {
        if (b == NULL || b->shell) return NULL;
        R->lock(b->device);
        if (R->alive(b->device)) p = R->map(b->device, b, size, false);
        R->unlock(b->device);
        return p;
    }
    dev = R->open(data->device.ordinal, R->name, false);
    if (dev == NULL) return NULL;
    R->lock(dev);
    b = NULL;
    if (tb__kit_alloc(R, dev, size, &b) == TB_OK) {
        p = R->map(dev, b, size, true);
        if (p != NULL) {
            data->payload = b;
        } else {
            R->release(b);
        }
    }
    R->unlock(dev);
    R->close(dev);
    return p;
}

static tb_status tb__kit_data_unmap_host(void *user_data, tb_backend_data *data, void *host) {
    const tb_kit_runtime *R = (const tb_kit_runtime *)user_data;
    tb_kit_buffer *b = (tb_kit_buffer *)data->payload;
    tb_status st = TB_OK;
    if (R->unmap == NULL || b == NULL || b->shell) return TB_OK;
    R->lock(b->device);
    if (R->alive(b->device)) st = R->unmap(b->device, b, host);
    R->unlock(b->device);
    return st;
}

static tb_kit_buffer *tb__kit_data_buffer(const tb_kit_runtime *R, void *dev,
                                          tb_backend_data *data) {
    tb_kit_buffer *b = (tb_kit_buffer *)data->payload, *mem = NULL;
    unsigned char bytes[8];
    size_t size;
    if (b == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: an argument has no value", R->name);
        return NULL;
    }
    if (b->device != dev) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: an argument lives on %s:%d, not %s:%d", R->name,
                  R->name, (int)R->ordinal(b->device), R->name, (int)R->ordinal(dev));
        return NULL;
    }
    if (!b->shell) return b;
    if (b->real != NULL) return b->real;
    /* a host scalar that a kernel reads as an array: its memory now */
    size = tb_dtype_size(data->shape.dtype);
    tb__kit_scalar_bytes(data->shape.dtype, data->scalar, bytes);
    if (tb__kit_alloc(R, dev, size, &mem) != TB_OK) return NULL;
    if (R->write(dev, mem, bytes, size) != TB_OK) {
        R->release(mem);
        return NULL;
    }
    /* the payload stays the shell (another thread may be reading it) */
    b->real = mem;
    return mem;
}

/* ---- lowering and compiling ---- */

/* Panels a pack kernel made of one parameter's buffer, kept while that buffer (the same object,
   of the same generation) comes again. */
typedef struct tb__kit_kept {
    const tb_kit_buffer *src;
    uint64_t gen;
    tb_kit_buffer *panels;
} tb__kit_kept;

/* A compiled graph: its plan, its source, its program and a kernel per kernel with work. */
typedef struct tb__kit_comp {
    const tb_kit_runtime *R;
    void *dev; /* open: a reference on the runtime */
    tb__plan *plan;
    char *source;
    size_t source_len;
    bool f64; /* the device computes f64 (else f64 scalars are passed as f32) */
    void *program;
    tb_kit_kernel *kernels; /* per kernel: what launches need */
    void **handles;         /* per kernel with work: the runtime's */
    size_t *aux;
    tb__kit_kept *kept;
    int32_t ran; /* atomic: it ran once */
} tb__kit_comp;

typedef struct tb__kit_context {
    tb__kit_comp *comp; /* moves to the computation on a successful compile */
} tb__kit_context;

static void tb__kit_comp_release(tb__kit_comp *c) {
    const tb_kit_runtime *R;
    size_t i;
    if (c == NULL) return;
    R = c->R;
    if (c->dev != NULL) {
        for (i = 0; c->handles != NULL && R->kernel_release != NULL && i < c->plan->num_kernels;
             i++)
            if (c->handles[i] != NULL) R->kernel_release(c->dev, c->handles[i]);
        if (c->program != NULL || c->kept != NULL) {
            R->lock(c->dev);
            if (c->program != NULL) R->drop(c->dev, c->program);
            for (i = 0; c->kept != NULL && i < c->plan->num_kernels; i++)
                if (c->kept[i].panels != NULL) R->release(c->kept[i].panels);
            R->unlock(c->dev);
        }
        R->close(c->dev);
    }
    tb__free(c->kernels);
    tb__free(c->handles);
    tb__free(c->aux);
    tb__free(c->kept);
    tb__free(c->source);
    tb__plan_free(c->plan);
    tb__free(c);
}

/* The tuning, the planner's target and the dialect of a device's facts. */
static void tb__kit_target(const tb_kit_facts *f, tb__tuning *tuning, tb__target *target,
                           tb__dialect *dialect) {
    bool c99 = f->language == TB_KIT_C99, cpu = c99 || f->type == TB_DEVICE_CPU;
    tb__tuning_of(c99 ? TB__CLASS_HOST : (cpu ? TB__CLASS_CPU : TB__CLASS_GPU), tuning);
    if (cpu) {
        /* the CPU's vector shape: 64 bytes (AVX-512: 32 registers), 32 (AVX2), 16 (SSE,
           NEON); registers unknown: 32 with 64-byte vectors, else 16 */
        tb__host_shape shape;
        memset(&shape, 0, sizeof shape);
        shape.vec_bytes = f->vector_bytes >= 64 ? 64 : (f->vector_bytes >= 32 ? 32 : 16);
        shape.vec_regs = f->vector_registers > 0 ? (int32_t)f->vector_registers
                                                 : (shape.vec_bytes >= 64 ? 32 : 16);
        shape.fma = f->fma;
        tb__tuning_fit(tuning, &shape);
        /* the wide block's 12 accumulators, 3 of B and the broadcast take all 16 registers:
           C compilers keep them there; PoCL's LLVM does in a matmul reading B in place (a
           convolution over whole rows), but where B's panel is packed it spills one and moves
           the other eleven through registers at every step (ResNet's first convolution, trained,
           on PoCL's AVX2 library: 20 ms, 90 GFLOP/s; 11.7 ms with the 6-row block's 12 + 2 +
           1): in OpenCL C the wide block is only for B in place */
        tuning->mm_wide_in_place = !c99;
    }
    memset(target, 0, sizeof *target);
    target->tuning = tuning;
    target->compute_units = f->compute_units > 0 ? f->compute_units : 1;
    target->max_group = c99 || f->max_group == 0 ? 1 : f->max_group;
    target->max_allocation = f->max_allocation;
    target->max_args = f->max_args > 0 ? f->max_args : 128;
    target->f64 = f->f64;
    target->acc_f64 = f->f64 && f->f64_accumulate;
    target->cache_bytes = f->cache_bytes;
    target->buffer_align = f->buffer_align;
    target->arg_table = c99; /* a C99 kernel takes its arguments as one table */
    if (c99) {
        tb__dialect_c99(dialect, tuning->vec_width);
    } else {
        tb__dialect_opencl(dialect, f->f64);
        dialect->vec_width = tuning->vec_width > 0 ? tuning->vec_width : 16;
    }
}

/* The kernels as launches see them, the program's source as a runtime builds it. */
static tb_status tb__kit_build(tb__kit_comp *c) {
    const tb__plan *p = c->plan;
    tb_kit_program prog;
    const char **fns;
    size_t i, n = 0, *at, *len;
    tb_status st;
    for (i = 0; i < p->num_kernels; i++) {
        const tb__plan_kernel *k = &p->kernels[i];
        tb_kit_kernel *q = &c->kernels[i];
        int d;
        q->name = k->name;
        q->function = k->fn;
        for (d = 0; d < 3; d++) {
            q->group_size[d] = k->group_size[d];
            q->groups[d] = k->groups[d];
        }
        q->items = k->items;
        q->bytes = k->bytes;
        q->flops = k->flops;
    }
    fns = (const char **)tb__calloc(p->num_kernels + 1, sizeof *fns);
    at = (size_t *)tb__calloc(p->num_kernels + 1, sizeof *at);
    len = (size_t *)tb__calloc(p->num_kernels + 1, sizeof *len);
    st = fns == NULL || at == NULL || len == NULL ? TB_ERR_OUT_OF_MEMORY : TB_OK;
    for (i = 0; st == TB_OK && i < p->num_kernels; i++) {
        if (!tb__plan_first_of_function(p, i)) continue;
        fns[n] = p->kernels[i].fn;
        at[n] = p->kernels[i].text_at;
        len[n++] = p->kernels[i].text_len;
    }
    memset(&prog, 0, sizeof prog);
    prog.source = c->source;
    prog.length = c->source_len;
    prog.head = p->text_head;
    prog.num_functions = n;
    prog.functions = fns;
    prog.function_at = at;
    prog.function_len = len;
    if (st == TB_OK) st = c->R->build(c->dev, &prog, &c->program);
    tb__free(fns);
    tb__free(at);
    tb__free(len);
    return st;
}

/* Plans the graph for the device and renders the plan in the runtime's dialect. */
static tb_status tb__kit_create_lowering_context(void *user_data, const tb_graph *graph,
                                                 void **context) {
    const tb_kit_runtime *R = (const tb_kit_runtime *)user_data;
    tb__kit_comp *c;
    tb__kit_context *ctx;
    tb__pgraph G;
    tb_kit_facts facts;
    tb__tuning tuning;
    tb__target target;
    tb__dialect dialect;
    tb_status st;
    *context = NULL;
    ctx = (tb__kit_context *)tb__calloc(1, sizeof *ctx);
    c = (tb__kit_comp *)tb__calloc(1, sizeof *c);
    if (ctx == NULL || c == NULL) {
        tb__free(ctx);
        tb__free(c);
        return TB_ERR_OUT_OF_MEMORY;
    }
    c->R = R;
    c->dev = R->open(graph->device.ordinal, R->name, false);
    if (c->dev == NULL) {
        tb__free(c);
        tb__free(ctx);
        return tb__kit_failed(TB_ERR_UNAVAILABLE);
    }
    memset(&facts, 0, sizeof facts);
    R->facts(c->dev, &facts);
    tb__kit_target(&facts, &tuning, &target, &dialect);
    c->f64 = target.f64;
    st = tb__plan_build(graph, &target, &G, &c->plan);
    if (st == TB_OK) {
        st = tb__cg_render(&G, c->plan, &dialect, &c->source, &c->source_len);
        tb__pgraph_free(&G);
    }
    if (st != TB_OK) {
        tb__kit_comp_release(c);
        tb__free(ctx);
        return st;
    }
    ctx->comp = c;
    *context = ctx;
    return TB_OK;
}

static void tb__kit_release_lowering_context(void *user_data, void *context) {
    tb__kit_context *ctx = (tb__kit_context *)context;
    (void)user_data;
    if (ctx == NULL) return;
    tb__kit_comp_release(ctx->comp);
    tb__free(ctx);
}

/* TB_DEBUG=1: the graph's kernels, one line. */
static void tb__kit_log_kernels(const tb__kit_comp *c) {
    const tb__plan *p = c->plan;
    size_t i, launched = 0;
    tb__str names;
    memset(&names, 0, sizeof names);
    for (i = 0; i < p->num_kernels; i++) {
        if (p->kernels[i].empty) continue;
        tb__str_append(&names, "%s%s", names.len > 0 ? " " : "", p->kernels[i].name);
        launched++;
    }
    tb_log_message(TB_LOG_INFO, "%s:%d: graph %016llx: %zu kernel%s: %s", c->R->name,
                   (int)c->R->ordinal(c->dev), (unsigned long long)p->graph_hash, launched,
                   launched == 1 ? "" : "s", names.data != NULL ? names.data : "");
    tb__str_free(&names);
}

/* Builds (or finds) the program, then looks up a kernel per kernel with work; the computation
   leaves the context. */
static tb_status tb__kit_compile(void *user_data, void *context, void **computation) {
    const tb_kit_runtime *R = (const tb_kit_runtime *)user_data;
    tb__kit_context *ctx = (tb__kit_context *)context;
    tb__kit_comp *c = ctx != NULL ? ctx->comp : NULL;
    tb_status st = TB_OK;
    bool alive;
    size_t i;
    *computation = NULL;
    if (c == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: compile without a context", R->name);
    R->lock(c->dev);
    alive = R->alive(c->dev);
    R->unlock(c->dev);
    if (!alive) return tb__error(TB_ERR_STATE, "%s: the computation outlived the backend", R->name);
    if (tb_debug_level() >= 3) {
        tb_log_message(TB_LOG_DEBUG, "%s:%d: program of graph %016llx:\n%s", R->name,
                       (int)R->ordinal(c->dev), (unsigned long long)c->plan->graph_hash, c->source);
    }
    c->kernels = (tb_kit_kernel *)tb__calloc(c->plan->num_kernels + 1, sizeof *c->kernels);
    c->handles = (void **)tb__calloc(c->plan->num_kernels + 1, sizeof *c->handles);
    c->aux = (size_t *)tb__calloc(c->plan->num_kernels + 1, sizeof *c->aux);
    c->kept = (tb__kit_kept *)tb__calloc(c->plan->num_kernels + 1, sizeof *c->kept);
    if (c->kernels == NULL || c->handles == NULL || c->aux == NULL || c->kept == NULL)
        return TB_ERR_OUT_OF_MEMORY;
    st = tb__kit_build(c);
    for (i = 0; i < c->plan->num_kernels && st == TB_OK; i++)
        if (!c->plan->kernels[i].empty)
            st = R->kernel(c->dev, c->program, &c->kernels[i], &c->handles[i], &c->aux[i]);
    if (st != TB_OK) return st;
    if (tb_debug_level() >= 1) tb__kit_log_kernels(c);
    ctx->comp = NULL;
    *computation = c;
    return TB_OK;
}

static void tb__kit_release_computation(void *user_data, void *computation) {
    (void)user_data;
    tb__kit_comp_release((tb__kit_comp *)computation);
}

static const char *tb__kit_backend_text(void *user_data, const void *computation) {
    (void)user_data;
    return computation != NULL ? ((const tb__kit_comp *)computation)->source : NULL;
}

static int32_t tb__kit_get_node_kernel(void *user_data, const void *computation, size_t node_index,
                                       const char **kernel_name) {
    const tb__kit_comp *c = (const tb__kit_comp *)computation;
    int32_t k;
    (void)user_data;
    if (kernel_name != NULL) *kernel_name = NULL;
    if (c == NULL || c->plan->node_kernel == NULL || node_index >= c->plan->num_nodes) return -1;
    k = c->plan->node_kernel[node_index];
    if (k >= 0 && kernel_name != NULL) *kernel_name = c->plan->kernels[k].name;
    return k;
}

/* ---- running ---- */

/* The buffers of a run: the parameters' (borrowed) and the kernels' outputs (owned until they
   are results or freed after their last use), the error flag and the scalar table. */
typedef struct tb__kit_run {
    tb__kit_comp *c;
    const tb_kit_runtime *R;
    void *dev;
    tb_kit_buffer **owned, *err_buf, *table_buf;
    tb_kit_buffer **bufs;   /* per slot: its buffer (borrowed, owned or kept) */
    tb_kit_arg *args;       /* a kernel's arguments */
    uint64_t *events;       /* per kernel at TB_DEBUG >= 2: its launch's token */
    bool *timed;            /* per kernel: events[i] holds one */
    bool consumed;          /* the kernels writing into donated buffers were reached */
    int64_t launches, kept; /* launches made, packs skipped (counted once, at the end) */
} tb__kit_run;

/* The bytes of a scalar argument as the kernel declares it; 0 with the error set. */
static size_t tb__kit_scalar_arg(tb__kit_run *r, tb_dtype dtype, const tb_backend_data *data,
                                 unsigned char out[8]) {
    tb_scalar v;
    if (data->is_scalar) {
        v = data->scalar; /* no kernel writes a scalar's memory (donation skips them) */
    } else {
        /* a scalar parameter given as an array (not made by data_from_scalar) */
        unsigned char raw[8];
        const tb_kit_buffer *b = (const tb_kit_buffer *)data->payload;
        memset(raw, 0, sizeof raw);
        if (b == NULL) {
            tb__error(TB_ERR_INVALID_ARGUMENT, "%s: an argument has no value", r->R->name);
            return 0;
        }
        if (r->R->read(r->dev, b, raw, tb_dtype_size(dtype)) != TB_OK) return 0;
        v = tb__kit_scalar_of(dtype, raw);
    }
    if (dtype == TB_F64 && !r->c->f64) {
        tb__kit_scalar_bytes(TB_F32, v, out);
        return 4;
    }
    tb__kit_scalar_bytes(dtype, v, out);
    return tb_dtype_size(dtype);
}

/* The error flag, cleared; the scalar table, written. */
static tb_status tb__kit_run_buffers(tb__kit_run *r, tb_backend_data *const *arguments) {
    static const uint32_t zeros[TB__ERR_WORDS] = {0};
    const tb__plan *plan = r->c->plan;
    tb_status st = TB_OK;
    size_t i, j, bytes;
    unsigned char *table;
    if (plan->num_errsites > 0) {
        st = tb__kit_alloc(r->R, r->dev, sizeof zeros, &r->err_buf);
        if (st == TB_OK) st = r->R->write(r->dev, r->err_buf, zeros, sizeof zeros);
    }
    if (st != TB_OK || !plan->scalar_table) return st;
    /* each kernel's run of entries: the scalars it reads, in its order */
    bytes = (plan->table_len + 1) * 8;
    table = (unsigned char *)tb__calloc(plan->table_len + 1, 8);
    if (table == NULL) return TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < plan->num_kernels && st == TB_OK; i++) {
        const tb__plan_kernel *k = &plan->kernels[i];
        for (j = 0; j < k->num_table_params && st == TB_OK; j++) {
            int32_t a = k->table_params[j];
            if (tb__kit_scalar_arg(r, plan->param_dtype[a], arguments[a],
                                   table + 8 * ((size_t)k->table_at + j)) == 0)
                st = tb__kit_failed(TB_ERR_EXECUTE);
        }
    }
    if (st == TB_OK) st = tb__kit_alloc(r->R, r->dev, bytes, &r->table_buf);
    if (st == TB_OK) st = r->R->write(r->dev, r->table_buf, table, bytes);
    tb__free(table);
    return st;
}

static tb_status tb__kit_run_init(tb__kit_run *r, tb_backend_data *const *arguments) {
    const tb__plan *plan = r->c->plan;
    size_t i, most = 1;
    for (i = 0; i < plan->num_kernels; i++)
        if (plan->kernels[i].num_args + 1 > most) most = plan->kernels[i].num_args + 1;
    r->owned = (tb_kit_buffer **)tb__calloc(plan->num_slots + 1, sizeof *r->owned);
    r->bufs = (tb_kit_buffer **)tb__calloc(plan->num_slots + 1, sizeof *r->bufs);
    r->args = (tb_kit_arg *)tb__calloc(most, sizeof *r->args);
    if (r->owned == NULL || r->bufs == NULL || r->args == NULL) return TB_ERR_OUT_OF_MEMORY;
    if (tb_debug_level() >= 2) {
        r->events = (uint64_t *)tb__calloc(plan->num_kernels + 1, sizeof *r->events);
        r->timed = (bool *)tb__calloc(plan->num_kernels + 1, sizeof *r->timed);
        if (r->events == NULL || r->timed == NULL) return TB_ERR_OUT_OF_MEMORY;
    }
    for (i = 0; i < plan->num_slots; i++) {
        const tb__plan_slot *s = &plan->slots[i];
        if (s->kind != TB__SLOT_PARAM) continue;
        r->bufs[i] = tb__kit_data_buffer(r->R, r->dev, arguments[s->index]);
        if (r->bufs[i] == NULL) return tb__kit_failed(TB_ERR_INTERNAL);
    }
    for (i = 0; i < plan->num_results; i++) {
        /* a result computed into a donated parameter's buffer */
        if (plan->result_alias[i] >= 0)
            r->bufs[plan->result_slot[i]] =
                (tb_kit_buffer *)arguments[plan->result_alias[i]]->payload;
    }
    return tb__kit_run_buffers(r, arguments);
}

/* Kernel i's arguments in the plan's order, after its output. */
static tb_status tb__kit_run_args(tb__kit_run *r, const tb__plan_kernel *k,
                                  tb_backend_data *const *arguments) {
    size_t j;
    memset(r->args, 0, (k->num_args + 1) * sizeof *r->args);
    r->args[0].kind = TB__ARG_BUF;
    r->args[0].mem = r->bufs[k->out_slot]->mem;
    for (j = 0; j < k->num_args; j++) {
        const tb__plan_arg *a = &k->args[j];
        tb_kit_arg *g = &r->args[j + 1];
        g->kind = a->kind;
        if (a->kind == TB__ARG_BUF) {
            g->mem = r->bufs[a->index]->mem;
        } else if (a->kind == TB__ARG_SCALAR) {
            g->size = tb__kit_scalar_arg(r, r->c->plan->param_dtype[a->index], arguments[a->index],
                                         g->value.bytes);
            if (g->size == 0) return tb__kit_failed(TB_ERR_EXECUTE);
        } else if (a->kind == TB__ARG_TABLE) {
            g->mem = r->table_buf->mem;
            g->at = k->table_at; /* where the kernel's run of the table starts */
        } else {
            g->mem = r->err_buf->mem;
        }
    }
    return TB_OK;
}

static void tb__kit_count(const tb_kit_runtime *R, void *dev, const char *what, int64_t delta) {
    char name[64];
    if (!R->alive(dev)) return;
    snprintf(name, sizeof name, "%s::%s", R->metric, what);
    tb__metric_count(name, delta);
}

/* Runs kernel i: its output allocated, its arguments gathered, its launch made. */
static tb_status tb__kit_run_kernel(tb__kit_run *r, size_t i, tb_backend_data *const *arguments) {
    const tb_kit_runtime *R = r->R;
    const tb__plan_kernel *k = &r->c->plan->kernels[i];
    const tb_kit_buffer *src =
        k->pack_param >= 0 ? (const tb_kit_buffer *)arguments[k->pack_param]->payload : NULL;
    tb__kit_kept *kp = &r->c->kept[i];
    tb_status st;
    if (src != NULL && kp->panels != NULL && kp->src == src && kp->gen == src->gen) {
        r->bufs[k->out_slot] = kp->panels; /* the panels of this buffer, made before */
        r->kept++;
        return TB_OK;
    }
    if (r->bufs[k->out_slot] == NULL) {
        size_t size = 0;
        st = tb_shape_nbytes(&r->c->plan->slots[k->out_slot].shape, &size);
        if (st == TB_OK) st = tb__kit_alloc(R, r->dev, size, &r->owned[k->out_slot]);
        if (st != TB_OK) return st;
        r->bufs[k->out_slot] = r->owned[k->out_slot];
    }
    if (k->empty) return TB_OK; /* nothing to compute */
    st = tb__kit_run_args(r, k, arguments);
    if (st == TB_OK)
        st = R->launch(r->dev, r->c->handles[i], r->c->aux[i], &r->c->kernels[i], r->args,
                       k->num_args + 1, r->events != NULL ? &r->events[i] : NULL);
    if (st != TB_OK) return st;
    if (r->timed != NULL) r->timed[i] = true;
    r->launches++;
    if (src != NULL && r->owned[k->out_slot] != NULL &&
        (uint64_t)r->owned[k->out_slot]->cap <= R->stats(r->dev)->cache_limit) {
        /* keep the panels with the computation (the next run of this buffer skips the pack) */
        if (kp->panels != NULL) R->release(kp->panels);
        kp->panels = r->owned[k->out_slot];
        kp->src = src;
        kp->gen = src->gen;
        r->owned[k->out_slot] = NULL;
    }
    return TB_OK;
}

/* The error flag the kernels raise, as the run's status. */
static tb_status tb__kit_run_flag(tb__kit_run *r) {
    uint32_t flag[TB__ERR_WORDS];
    tb_status st;
    if (r->err_buf == NULL) return TB_OK;
    st = r->R->read(r->dev, r->err_buf, flag, sizeof flag);
    if (st == TB_OK && flag[0] != 0) st = tb__cg_run_error(r->c->plan, r->R->name, flag);
    return st;
}

/* Before the first kernel that writes into a donated buffer: the error flag is read first
   (no kernel from there on can fail), and the donated buffers count as written. */
static tb_status tb__kit_run_consume(tb__kit_run *r, tb_backend_data *const *arguments) {
    const tb__plan *plan = r->c->plan;
    size_t i;
    tb_status st = tb__kit_run_flag(r);
    if (st != TB_OK) return st;
    r->consumed = true;
    for (i = 0; i < plan->num_results; i++) {
        /* its panels, kept by pack kernels, are stale from here on */
        if (plan->result_alias[i] >= 0)
            ((tb_kit_buffer *)arguments[plan->result_alias[i]]->payload)->gen =
                tb__next_generation();
    }
    return TB_OK;
}

/* A result that repeats an earlier one gets a copy of its buffer. */
static tb_status tb__kit_copy_results(tb__kit_run *r, tb_backend_data *const *results) {
    const tb__plan *plan = r->c->plan;
    size_t i;
    for (i = 0; i < plan->num_results; i++) {
        int32_t src = plan->result_source[i];
        size_t size = 0;
        tb_kit_buffer *copy = NULL;
        tb_status st;
        if (src < 0) continue;
        /* the buffer it repeats may be a donated one: its size is the slot's */
        st = tb_shape_nbytes(&plan->slots[plan->result_slot[src]].shape, &size);
        if (st == TB_OK) st = tb__kit_alloc(r->R, r->dev, size, &copy);
        if (st != TB_OK) return st;
        st = size == 0 ? TB_OK : r->R->copy(r->dev, r->bufs[plan->result_slot[src]], copy, size);
        if (st != TB_OK) {
            r->R->release(copy);
            return st;
        }
        results[i]->payload = copy;
    }
    return TB_OK;
}

/* TB_DEBUG=2: one line per kernel with its time, GB/s and GFLOP/s. */
static void tb__kit_profile(tb__kit_run *r) {
    const tb__plan *plan = r->c->plan;
    size_t i;
    r->R->finish(r->dev);
    for (i = 0; i < plan->num_kernels; i++) {
        double ns;
        if (!r->timed[i]) continue;
        ns = r->R->elapsed(r->dev, r->events[i]);
        r->timed[i] = false;
        if (ns < 1) ns = 1;
        tb_log_message(TB_LOG_DEBUG, "%s:%d %-24s %10.3f ms %9.2f GB/s %9.2f GFLOP/s", r->R->name,
                       (int)r->R->ordinal(r->dev), plan->kernels[i].name, ns / 1e6,
                       plan->kernels[i].bytes / ns, plan->kernels[i].flops / ns);
    }
}

/* Hands the results over (success) or drops the copies made for them (failure), then frees
   everything the run still owns. Donated buffers become their results' (success), or are
   freed once written (failure); either way their arguments lose them. */
static void tb__kit_run_finish(tb__kit_run *r, tb_status st, tb_backend_data *const *arguments,
                               tb_backend_data *const *results) {
    const tb__plan *plan = r->c->plan;
    const tb_kit_runtime *R = r->R;
    size_t i;
    for (i = 0; i < plan->num_results && r->owned != NULL; i++) {
        int32_t d = plan->result_alias[i];
        if (d >= 0) {
            if (st == TB_OK) {
                results[i]->payload = arguments[d]->payload;
                arguments[d]->payload = NULL;
            } else if (r->consumed) {
                R->release((tb_kit_buffer *)arguments[d]->payload);
                arguments[d]->payload = NULL;
            }
            continue;
        }
        if (plan->result_source[i] >= 0) {
            if (st != TB_OK && results[i]->payload != NULL) {
                R->release((tb_kit_buffer *)results[i]->payload);
                results[i]->payload = NULL;
            }
        } else if (st == TB_OK) {
            results[i]->payload = r->owned[plan->result_slot[i]];
            r->owned[plan->result_slot[i]] = NULL;
        }
    }
    if (st == TB_OK && R->flush != NULL) R->flush(r->dev);
    for (i = 0; r->owned != NULL && i < plan->num_slots; i++)
        if (r->owned[i] != NULL) R->release(r->owned[i]);
    for (i = 0; r->timed != NULL && i < plan->num_kernels; i++) {
        if (!r->timed[i]) continue;
        R->finish(r->dev); /* a failed run's tokens: the work done, then each one ended */
        (void)R->elapsed(r->dev, r->events[i]);
    }
    if (r->err_buf != NULL) R->release(r->err_buf);
    if (r->table_buf != NULL) R->release(r->table_buf);
    tb__free(r->owned);
    tb__free(r->bufs);
    tb__free(r->args);
    tb__free(r->events);
    tb__free(r->timed);
}

/* The kernels in order; temporaries nobody reads any more go back to the cache (the runtime
   runs its launches in order). A first run of a runtime whose driver compiles at the first
   launch waits for each new function's first launch, to report progress. */
static tb_status tb__kit_run_kernels(tb__kit_run *r, tb_backend_data *const *arguments) {
    const tb__plan *p = r->c->plan;
    bool watch = r->R->lazy_build && TB__ATOMIC_LOAD(&r->c->ran) == 0 && tb__progress_wanted();
    size_t i, j, done = 0, total = watch ? tb__plan_functions(p) : 0;
    tb_status st = TB_OK;
    for (i = 0; i < p->num_kernels && st == TB_OK; i++) {
        if ((int32_t)i == p->first_alias) st = tb__kit_run_consume(r, arguments);
        if (st == TB_OK) st = tb__kit_run_kernel(r, i, arguments);
        if (st == TB_OK && watch && tb__plan_first_of_function(p, i)) {
            r->R->finish(r->dev);
            tb__progress_kernels(++done, total);
        }
        for (j = 0; j < p->num_slots && st == TB_OK; j++) {
            if (p->slots[j].kind == TB__SLOT_TEMP && r->owned[j] != NULL &&
                p->slots[j].last_use <= (int32_t)i) {
                r->R->release(r->owned[j]);
                r->owned[j] = NULL;
                r->bufs[j] = NULL;
            }
        }
    }
    return st;
}

/* Runs a computation under its device's lock (runs on other devices go on meanwhile). */
static tb_status tb__kit_execute(void *user_data, void *computation,
                                 tb_backend_data *const *arguments, size_t num_arguments,
                                 tb_backend_data *const *results, size_t num_results) {
    const tb_kit_runtime *R = (const tb_kit_runtime *)user_data;
    tb__kit_comp *c = (tb__kit_comp *)computation;
    const tb__plan *p = c != NULL ? c->plan : NULL;
    tb__kit_run r;
    tb_status st;
    if (p == NULL || num_arguments != p->num_params || num_results != p->num_results) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: execute with %zu arguments and %zu results, the computation has "
                         "%zu and %zu",
                         R->name, num_arguments, num_results, p != NULL ? p->num_params : 0,
                         p != NULL ? p->num_results : 0);
    }
    memset(&r, 0, sizeof r);
    r.c = c;
    r.R = R;
    r.dev = c->dev;
    R->lock(r.dev);
    if (!R->alive(r.dev)) {
        R->unlock(r.dev);
        return tb__error(TB_ERR_STATE, "%s: the computation outlived the backend", R->name);
    }
    st = tb__kit_run_init(&r, arguments);
    if (st == TB_OK) st = tb__kit_run_kernels(&r, arguments);
    if (st == TB_OK) st = tb__kit_copy_results(&r, results);
    if (st == TB_OK) st = tb__kit_run_flag(&r);
    if (st == TB_OK && R->ran != NULL) R->ran(r.dev, c->program);
    if (st == TB_OK && r.timed != NULL) tb__kit_profile(&r);
    if (st == TB_OK && TB__ATOMIC_LOAD(&c->ran) == 0) (void)TB__ATOMIC_ADD(&c->ran, 1);
    (void)TB__ATOMIC_ADD(&R->stats(r.dev)->launches, (uint64_t)r.launches);
    if (r.launches > 0) tb__kit_count(R, r.dev, "KernelLaunch", r.launches);
    if (r.kept > 0) tb__kit_count(R, r.dev, "PanelsKept", r.kept);
    tb__kit_run_finish(&r, st, arguments, results);
    R->unlock(r.dev);
    return st;
}

/* ---- IR hooks, metrics, registration ---- */

static bool tb__kit_supports_node(void *user_data, const tb_node *node) {
    const tb_kit_runtime *R = (const tb_kit_runtime *)user_data;
    if (R->supports != NULL && !R->supports(node)) return false;
    if (node->op >= TB_OP_BUILTIN_COUNT) {
        /* custom ops with a kernel expression */
        const tb_custom_op_desc *d = tb__plan_custom(node->op);
        return d != NULL && d->opencl_expr != NULL && d->infer_shape == NULL;
    }
    return node->op >= 0;
}

static void tb__kit_report_device(const tb_kit_runtime *R, void *dev, const tb_device_info *info,
                                  tb__str *s) {
    char more[1024];
    const tb_kit_stats *k = R->stats(dev);
    tb__str_append(s, "Device: %s:%d (%s, %s, %u compute unit%s)\n", R->name, (int)R->ordinal(dev),
                   info->name, tb_device_type_name(info->device.type),
                   (unsigned)info->compute_units, info->compute_units == 1 ? "" : "s");
#define TB__KIT_LINE(what, value)                                                                  \
    tb__str_append(s, "  %s::%s: %llu\n", R->metric, what, (unsigned long long)(value))
    TB__KIT_LINE("BytesInUse", k->bytes_in_use);
    TB__KIT_LINE("PeakBytesInUse", k->peak_bytes);
    TB__KIT_LINE("BytesCached", k->cached_bytes);
    TB__KIT_LINE(R->build_metric, TB__ATOMIC_LOAD(&k->builds));
    TB__KIT_LINE("DiskCacheHit", TB__ATOMIC_LOAD(&k->disk_hits));
    TB__KIT_LINE("DiskCacheMiss", TB__ATOMIC_LOAD(&k->disk_misses));
    TB__KIT_LINE("DiskCacheRejected", TB__ATOMIC_LOAD(&k->disk_rejected));
    TB__KIT_LINE("KernelLaunch", TB__ATOMIC_LOAD(&k->launches));
#undef TB__KIT_LINE
    more[0] = '\0';
    if (R->report != NULL) R->report(dev, more, sizeof more);
    tb__str_append(s, "%s", more);
}

static size_t tb__kit_metrics_report(void *user_data, char *buf, size_t cap) {
    const tb_kit_runtime *R = (const tb_kit_runtime *)user_data;
    char why[512];
    size_t i, n, count;
    tb__str s;
    char *text;
    memset(&s, 0, sizeof s);
    why[0] = '\0';
    count = R->devices(NULL, 0, why, sizeof why);
    if (count == 0) tb__str_append(&s, "%s: unavailable: %s\n", R->metric, why);
    for (i = 0; i < count; i++) {
        void *dev = R->open((int32_t)i, R->name, true);
        tb_device_info info;
        if (dev == NULL) continue;
        R->info(dev, false, &info);
        R->lock(dev);
        tb__kit_report_device(R, dev, &info, &s);
        R->unlock(dev);
        R->close(dev);
    }
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

static void tb__kit_prepare_to_exit(void *user_data) {
    ((const tb_kit_runtime *)user_data)->shutdown();
}

static void tb__kit_impl(const tb_kit_runtime *R, tb_backend_impl *impl) {
    memset(impl, 0, sizeof *impl);
    impl->user_data = (void *)(uintptr_t)R;
    impl->prepare_to_exit = tb__kit_prepare_to_exit;
    impl->supports_node = tb__kit_supports_node;
    impl->data_from_host = tb__kit_data_from_host;
    impl->data_from_scalar = tb__kit_data_from_scalar;
    impl->data_to_host = tb__kit_data_to_host;
    impl->data_release = tb__kit_data_release;
    impl->data_map_host = tb__kit_data_map_host;
    impl->data_unmap_host = tb__kit_data_unmap_host;
    impl->create_lowering_context = tb__kit_create_lowering_context;
    impl->release_lowering_context = tb__kit_release_lowering_context;
    impl->compile = tb__kit_compile;
    impl->execute = tb__kit_execute;
    impl->release_computation = tb__kit_release_computation;
    impl->computation_backend_text = tb__kit_backend_text;
    impl->get_node_kernel = tb__kit_get_node_kernel;
    impl->get_backend_devices = tb__kit_get_backend_devices;
    impl->get_device_info = tb__kit_get_device_info;
    impl->create_metrics_report = tb__kit_metrics_report;
}

/* ---- what the runtimes share beneath the table ---- */

static void *tb__kit_proc_new(size_t size, void (*destroy)(tb__kit_proc *p)) {
    tb__kit_proc *p = (tb__kit_proc *)tb__calloc(1, size);
    if (p == NULL) return NULL;
    p->refcount = 1;
    p->status = TB_OK;
    p->destroy = destroy;
    return p;
}

static void tb__kit_proc_ref(tb__kit_proc *p) {
    (void)TB__ATOMIC_ADD(&p->refcount, 1);
}

static void tb__kit_proc_unref(tb__kit_proc *p) {
    if (p != NULL && TB__ATOMIC_ADD(&p->refcount, -1) == 0) p->destroy(p);
}

static tb__kit_proc *tb__kit_proc_keep(tb__kit_proc **current, tb__kit_proc *p) {
    if (p->status == TB_ERR_OUT_OF_MEMORY) {
        tb__error(p->status, "%s", p->reason);
        p->destroy(p);
        return NULL;
    }
    if (p->status != TB_OK) tb_log_message(TB_LOG_INFO, "%s", p->reason);
    *current = p;
    return p;
}

static bool tb__kit_proc_usable(const tb__kit_proc *p) {
    if (p == NULL) return false;
    if (p->status != TB_OK) {
        tb__error(p->status, "%s", p->reason);
        return false;
    }
    return true;
}

static void tb__kit_proc_retire(tb__mutex *mutex, tb__kit_proc **current,
                                void (*trim)(tb__kit_proc *p)) {
    tb__kit_proc *p;
    tb__mutex_lock(mutex);
    p = *current;
    if (p != NULL) {
        trim(p);
        p->exited = true;
        *current = NULL;
        tb__kit_proc_unref(p);
    }
    tb__mutex_unlock(mutex);
}

/* ---- the runtimes' program caches ---- */

static tb__kit_prog *tb__kit_prog_find(tb__kit_prog *list, const uint64_t key[2], const char *src,
                                       size_t len, int64_t *collisions) {
    tb__kit_prog *p;
    for (p = list; p != NULL; p = p->next) {
        if (p->key[0] != key[0] || p->key[1] != key[1]) continue;
        if (p->source_len != len || memcmp(p->source, src, len) != 0) {
            if (collisions != NULL) ++*collisions;
            continue;
        }
        p->refcount++;
        return p;
    }
    return NULL;
}

static void tb__kit_prog_unref(tb__kit_prog **list, tb__kit_prog *p, tb__kit_prog_free_fn free_fn,
                               void *ctx) {
    tb__kit_prog **link;
    if (p == NULL || --p->refcount > 0) return;
    for (link = list; *link != NULL; link = &(*link)->next) {
        if (*link == p) {
            *link = p->next;
            break;
        }
    }
    free_fn(ctx, p);
}

static void tb__kit_progs_trim(tb__kit_prog **list, size_t keep, tb__kit_prog_free_fn free_fn,
                               void *ctx) {
    size_t count = 0;
    tb__kit_prog *p;
    for (p = *list; p != NULL; p = p->next)
        count++;
    while (count > keep) {
        tb__kit_prog *oldest = NULL;
        for (p = *list; p != NULL; p = p->next)
            if (p->refcount == 1) oldest = p; /* the list is newest first */
        if (oldest == NULL) break;
        tb__kit_prog_unref(list, oldest, free_fn, ctx);
        count--;
    }
}

/* ---- public: tb_kit_* ---- */

/* The first required entry a table lacks, or NULL. */
static const char *tb__kit_missing(const tb_kit_runtime *R) {
    if (R->name == NULL) return "name";
    if (R->metric == NULL) return "metric";
    if (R->build_metric == NULL) return "build_metric";
#define TB__KIT_NEED(entry)                                                                        \
    if (R->entry == NULL) return #entry
    TB__KIT_NEED(devices);
    TB__KIT_NEED(open);
    TB__KIT_NEED(close);
    TB__KIT_NEED(alive);
    TB__KIT_NEED(ordinal);
    TB__KIT_NEED(info);
    TB__KIT_NEED(stats);
    TB__KIT_NEED(facts);
    TB__KIT_NEED(lock);
    TB__KIT_NEED(unlock);
    TB__KIT_NEED(alloc);
    TB__KIT_NEED(release);
    TB__KIT_NEED(write);
    TB__KIT_NEED(read);
    TB__KIT_NEED(copy);
    TB__KIT_NEED(build);
    TB__KIT_NEED(kernel);
    TB__KIT_NEED(drop);
    TB__KIT_NEED(launch);
    TB__KIT_NEED(finish);
    TB__KIT_NEED(elapsed);
    TB__KIT_NEED(shutdown);
#undef TB__KIT_NEED
    return NULL;
}

TBDEF tb_status tb_kit_backend_impl(const tb_kit_runtime *runtime, tb_backend_impl *out) {
    const char *missing;
    if (runtime == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_kit_backend_impl: %s is NULL",
                         runtime == NULL ? "runtime" : "out");
    }
    missing = tb__kit_missing(runtime);
    if (missing != NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_kit_backend_impl: the runtime table has no %s", missing);
    }
    tb__kit_impl(runtime, out);
    return TB_OK;
}

TBDEF tb_status tb_kit_register(const char *name, const tb_kit_runtime *runtime, const char *tags) {
    tb_backend_impl impl;
    const char *missing;
    if (name == NULL || runtime == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_kit_register: %s is NULL",
                         name == NULL ? "name" : "runtime");
    }
    missing = tb__kit_missing(runtime);
    if (missing != NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_kit_register: backend '%s': the runtime table has no %s", name,
                         missing);
    }
    tb__kit_impl(runtime, &impl);
    return tb_backend_register(name, &impl, tags);
}

TBDEF void tb_kit_work_items(const tb_kit_kernel *k, uint64_t size[3]) {
    if (size == NULL) return;
    if (k == NULL) {
        size[0] = size[1] = size[2] = 0;
        return;
    }
    tb__work_items(k->group_size, k->groups, k->items, size);
}

TBDEF void tb_kit_progress(size_t done, size_t total) {
    tb__progress_kernels(done, total);
}

#else /* !TB__HAVE_COMPILED_BACKENDS */

TBDEF tb_status tb_kit_register(const char *name, const tb_kit_runtime *runtime, const char *tags) {
    (void)name;
    (void)runtime;
    (void)tags;
    return tb__error(TB_ERR_UNSUPPORTED,
                     "tb_kit_register: built with TB_NO_OPENCL and TB_NO_NATIVE (no code "
                     "generator)");
}

TBDEF tb_status tb_kit_backend_impl(const tb_kit_runtime *runtime, tb_backend_impl *out) {
    (void)runtime;
    (void)out;
    return tb__error(TB_ERR_UNSUPPORTED,
                     "tb_kit_backend_impl: built with TB_NO_OPENCL and TB_NO_NATIVE (no code "
                     "generator)");
}

TBDEF void tb_kit_work_items(const tb_kit_kernel *k, uint64_t size[3]) {
    (void)k;
    if (size != NULL) size[0] = size[1] = size[2] = 0;
}

TBDEF void tb_kit_progress(size_t done, size_t total) {
    (void)done;
    (void)total;
}

#endif /* TB__HAVE_COMPILED_BACKENDS */
