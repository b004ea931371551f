/* ===========================================================================================
   Native backend ("native"): the planner's kernels rendered as C99 (codegen.c, codegen_kernels.c,
   codegen_program.c), compiled at run time by the system C compiler ($CC, else cc) into a shared
   object, loaded with dlopen and run on a pool of threads (one per core: a kernel's work items are
   split among them). Programs are cached on disk as OpenCL's are (diskcache.c), keyed by the
   source, the compiler, its options, the CPU and this library's version. Memory is host memory.
   Without a compiler the backend has no device and says why, as OpenCL without a loader does. The
   backend's entries are the kit's (kit.c); this part is the runtime's table.
   =========================================================================================== */
#include "../../impl_begin.h"

#if defined(TB__HAVE_NATIVE)

/* ---- devices ---- */

static size_t tb__native_devices(tb_device *out, size_t cap, char *why, size_t why_cap) {
    tb__native_rt *rt;
    size_t n = 0;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_rt_get();
    if (rt != NULL && rt->proc.status == TB_OK) {
        n = 1;
        if (cap > 0) out[0] = rt->info.device;
    } else if (why_cap > 0) {
        snprintf(why, why_cap, "%s", rt != NULL ? rt->proc.reason : "out of memory");
    }
    tb__mutex_unlock(&tb__native_mutex);
    return n;
}

/* The runtime is the one device; a reference on it. */
static void *tb__native_open(int32_t ordinal, const char *func, bool bare) {
    tb__native_rt *rt;
    (void)bare;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_device(ordinal, func);
    if (rt != NULL) tb__kit_proc_ref(&rt->proc);
    tb__mutex_unlock(&tb__native_mutex);
    return rt;
}

static void tb__native_close(void *dev) {
    tb__mutex_lock(&tb__native_mutex);
    tb__native_rt_unref((tb__native_rt *)dev);
    tb__mutex_unlock(&tb__native_mutex);
}

static bool tb__native_alive(void *dev) {
    return !((tb__native_rt *)dev)->proc.exited;
}

static int32_t tb__native_ordinal(void *dev) {
    (void)dev;
    return 0;
}

/* The device's facts with the class its programs are built for (the compiler is asked once). */
static void tb__native_info(void *dev, bool full, tb_device_info *out) {
    tb__native_rt *rt = (tb__native_rt *)dev;
    if (full) tb__native_shape(rt);
    tb__mutex_lock(&tb__native_mutex);
    snprintf(rt->info.language_version, sizeof rt->info.language_version,
             "C99, %.8s vectors (%u f32 lanes, %u registers)", rt->shape.name,
             (unsigned)(unsigned char)(rt->shape.vec_bytes / 4),
             (unsigned)(unsigned char)rt->shape.vec_regs);
    *out = rt->info;
    tb__mutex_unlock(&tb__native_mutex);
}

static tb_kit_stats *tb__native_stats(void *dev) {
    return &((tb__native_rt *)dev)->stats;
}

/* C99 for the host's threads and vector shape (what both the CPU and the compiler's target
   have). */
static void tb__native_facts(void *dev, tb_kit_facts *f) {
    tb__native_rt *rt = (tb__native_rt *)dev;
    tb__native_shape(rt);
    f->language = TB_KIT_C99;
    f->type = TB_DEVICE_CPU;
    f->vector_bytes = (uint32_t)rt->shape.vec_bytes;
    f->vector_registers = (uint32_t)rt->shape.vec_regs;
    f->compute_units = rt->info.compute_units;
    f->max_group = 1;
    f->max_allocation = rt->info.max_allocation;
    f->cache_bytes = rt->l2_bytes;
    f->max_args = 4096;
    f->buffer_align = 64; /* tb__native_buf_alloc */
    f->f64 = true;
    f->f64_accumulate = true;
    f->fma = rt->shape.fma;
}

static void tb__native_lock(void *dev) {
    (void)dev;
    tb__mutex_lock(&tb__native_mutex);
}

static void tb__native_unlock(void *dev) {
    (void)dev;
    tb__mutex_unlock(&tb__native_mutex);
}

/* ---- memory: host memory, read and written in place ---- */

static tb_status tb__native_alloc(void *dev, size_t bytes, tb_kit_buffer **out) {
    tb__native_buf *b = NULL;
    tb_status st = tb__native_buf_alloc((tb__native_rt *)dev, bytes, &b);
    *out = b != NULL ? &b->k : NULL;
    return st;
}

static void tb__native_release(tb_kit_buffer *b) {
    tb__native_buf_free((tb__native_rt *)b->device, (tb__native_buf *)b);
}

static tb_status tb__native_write(void *dev, tb_kit_buffer *b, const void *host, size_t bytes) {
    (void)dev;
    if (bytes > 0) memcpy(b->mem, host, bytes);
    return TB_OK;
}

static tb_status tb__native_read(void *dev, const tb_kit_buffer *b, void *host, size_t bytes) {
    (void)dev;
    if (bytes > 0) memcpy(host, b->mem, bytes);
    return TB_OK;
}

static tb_status tb__native_copy(void *dev, const tb_kit_buffer *from, tb_kit_buffer *to,
                                 size_t bytes) {
    (void)dev;
    if (bytes > 0) memcpy(to->mem, from->mem, bytes);
    return TB_OK;
}

/* The library reads and writes the buffers in place (a collective's input and result). */
static void *tb__native_map(void *dev, tb_kit_buffer *b, size_t bytes, bool write) {
    (void)dev;
    (void)bytes;
    (void)write;
    return b->mem;
}

/* ---- programs ---- */

/* A graph's program: its parts' loaded objects. */
typedef struct tb__native_program {
    tb__native_rt *rt;
    const tb_kit_program *src; /* while it builds */
    tb__native_prog **progs;
    size_t num_progs;
} tb__native_program;

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
static tb_status tb__native_make_parts(tb__native_program *c, tb__native_part *parts, size_t n) {
    const tb_kit_program *p = c->src;
    size_t i, at = 0, done = 0, total = 0;
    for (i = 0; i < p->num_functions; i++)
        total += p->function_len[i];
    for (at = 0; at < n; at++) {
        parts[at].rt = c->rt;
        parts[at].fns = (const char **)tb__calloc(p->num_functions + 1, sizeof(const char *));
        if (parts[at].fns == NULL) return TB_ERR_OUT_OF_MEMORY;
        if (n > 1) tb__str_append(&parts[at].source, "%.*s", (int)p->head, p->source);
    }
    for (i = 0, at = 0; i < p->num_functions; i++) {
        tb__native_part *pt;
        /* the next part once this one holds its share of the text */
        if (at + 1 < n && done >= total / n * (at + 1)) at++;
        pt = &parts[at];
        pt->fns[pt->num_fns++] = p->functions[i];
        if (n > 1)
            tb__str_append(&pt->source, "%.*s", (int)p->function_len[i],
                           p->source + p->function_at[i]);
        done += p->function_len[i];
    }
    if (n == 1) { /* the source as it is (and as the disk cache has known it) */
        tb__str_append(&parts[0].source, "%.*s", (int)p->length, p->source);
    }
    for (at = 0; at < n; at++)
        if (parts[at].source.failed) return TB_ERR_OUT_OF_MEMORY;
    return TB_OK;
}

/* Compiles (or finds) the parts of c's program, one compiler process per part at once,
   reporting progress as they are ready; c->progs holds them. */
static tb_status tb__native_compile_parts(tb__native_program *c) {
    size_t functions = c->src->num_functions, n, i, ready = 0;
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

static void tb__native_drop(void *dev, void *program) {
    tb__native_program *c = (tb__native_program *)program;
    size_t i;
    for (i = 0; i < c->num_progs; i++)
        if (c->progs[i] != NULL) tb__native_prog_unref((tb__native_rt *)dev, c->progs[i]);
    tb__free(c->progs);
    tb__free(c);
}

/* Compiles (or finds) the parts of a plan's program. */
static tb_status tb__native_build(void *dev, const tb_kit_program *src, void **program) {
    tb__native_program *c = (tb__native_program *)tb__calloc(1, sizeof *c);
    tb_status st;
    *program = NULL;
    if (c == NULL) return TB_ERR_OUT_OF_MEMORY;
    c->rt = (tb__native_rt *)dev;
    c->src = src;
    st = tb__native_compile_parts(c);
    c->src = NULL;
    if (st != TB_OK) {
        tb__native_lock(dev);
        tb__native_drop(dev, c);
        tb__native_unlock(dev);
        return st;
    }
    *program = c;
    return TB_OK;
}

static tb_status tb__native_kernel(void *dev, void *program, const tb_kit_kernel *k, void **handle,
                                   size_t *aux) {
    const tb__native_program *c = (const tb__native_program *)program;
    void *sym = NULL;
    size_t j;
    (void)dev;
    for (j = 0; j < c->num_progs && sym == NULL; j++)
        sym = dlsym(c->progs[j]->handle, k->function);
    if (sym == NULL)
        return tb__error(TB_ERR_COMPILE, "native: the program has no kernel %s", k->function);
    *handle = sym;
    *aux = 0;
    return TB_OK;
}

/* ---- launches: the work items on the pool, the caller waiting ---- */

static tb_status tb__native_launch(void *dev, void *handle, size_t aux, const tb_kit_kernel *k,
                                   const tb_kit_arg *args, size_t num_args, uint64_t *event) {
    tb__native_rt *rt = (tb__native_rt *)dev;
    void *small[32], **argv = small;
    uint64_t size[3], t0;
    tb__native_fn fn;
    size_t j;
    if (num_args > sizeof small / sizeof small[0]) {
        argv = (void **)tb__calloc(num_args, sizeof *argv);
        if (argv == NULL) return TB_ERR_OUT_OF_MEMORY;
    }
    for (j = 0; j < num_args; j++) {
        const tb_kit_arg *a = &args[j];
        if (a->kind == TB__ARG_SCALAR) {
            argv[j] = (void *)(uintptr_t)a->value.bytes;
        } else if (a->kind == TB__ARG_TABLE) {
            argv[j] = (unsigned char *)a->mem + 8 * (size_t)a->at; /* the kernel's run */
        } else {
            argv[j] = a->mem;
        }
    }
    (void)aux;
    memcpy(&fn, &handle, sizeof fn);
    tb_kit_work_items(k, size);
    t0 = event != NULL ? tb__now_ns() : 0;
    tb__native_run(rt->pool, fn, argv, (int64_t)(size[0] * size[1] * size[2]), k->bytes + k->flops);
    if (event != NULL) *event = tb__now_ns() - t0;
    if (argv != small) tb__free(argv);
    return TB_OK;
}

static void tb__native_finish(void *dev) {
    (void)dev; /* a launch returns when its work is done */
}

static double tb__native_elapsed(void *dev, uint64_t event) {
    (void)dev;
    return (double)event;
}

static void tb__native_report(void *dev, char *buf, size_t cap) {
    tb__native_rt *rt = (tb__native_rt *)dev;
    snprintf(buf, cap, "  Native::Compiler: %s %s\n", rt->cc_command, rt->options);
}

/* tb_shutdown's part: the caches emptied */
static void tb__native_trim_all(tb__kit_proc *p) {
    tb__native_cache_trim((tb__native_rt *)p, 0);
    tb__native_progs_trim((tb__native_rt *)p, 0);
}

static void tb__native_shutdown(void) {
    tb__kit_proc_retire(&tb__native_mutex, &tb__native_current, tb__native_trim_all);
}

/* The runtime's table: programs compiled by the C compiler into shared objects, run on the
   host's cores by the pool. */
static const tb_kit_runtime tb__native_runtime = {
    "native",
    "Native",
    "ProgramCompile",
    false,
    tb__native_devices,
    tb__native_open,
    tb__native_close,
    tb__native_alive,
    tb__native_ordinal,
    tb__native_info,
    tb__native_stats,
    tb__native_facts,
    tb__native_lock,
    tb__native_unlock,
    tb__native_alloc,
    tb__native_release,
    tb__native_write,
    tb__native_read,
    tb__native_copy,
    tb__native_map,
    NULL,
    tb__native_build,
    tb__native_kernel,
    NULL,
    tb__native_drop,
    tb__native_launch,
    tb__native_finish,
    tb__native_elapsed,
    NULL,
    NULL,
    tb__native_report,
    NULL,
    tb__native_shutdown,
};

/* Host memory in place (tb_tensor_from_host_borrowed, DLPack imports, model files mapped from
   disk): a buffer over the caller's array, which kernels only read (the library never lets a
   result take a shared buffer); release(context) once the data goes. An array whose start is
   not 64-byte aligned (every buffer's is: tb_kit_facts.buffer_align) is copied instead, as is
   an empty one. */
static tb_status tb__native_data_borrow_host(void *user_data, tb_backend_data *data, void *host,
                                             void (*release)(void *context), void *context) {
    tb__native_rt *rt;
    tb__native_buf *b;
    size_t nbytes = 0;
    tb_status st = tb_shape_nbytes(&data->shape, &nbytes);
    (void)user_data;
    if (st != TB_OK) return st;
    if (nbytes == 0 || (uintptr_t)host % 64 != 0) return TB_ERR_UNSUPPORTED;
    b = (tb__native_buf *)tb__calloc(1, sizeof *b);
    if (b == NULL) return TB_ERR_OUT_OF_MEMORY;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_device(data->device.ordinal, "native");
    if (rt != NULL) tb__kit_proc_ref(&rt->proc);
    tb__mutex_unlock(&tb__native_mutex);
    if (rt == NULL) {
        tb__free(b);
        return TB_ERR_UNAVAILABLE;
    }
    b->k.mem = host;
    b->k.device = rt;
    b->k.size = b->k.cap = nbytes;
    b->k.gen = tb__next_generation();
    b->borrowed = true;
    b->release = release;
    b->context = context;
    data->payload = &b->k;
    return TB_OK;
}

/* The values of a data in place (DLPack exports, model files, the eager fallback's operands):
   every buffer is host memory; a scalar's (a kit shell) has none. */
static void *tb__native_data_host_pointer(void *user_data, const tb_backend_data *data) {
    const tb_kit_buffer *b = (const tb_kit_buffer *)data->payload;
    (void)user_data;
    return b != NULL && !b->shell ? b->mem : NULL;
}

/* registers the "native" backend (called by tb__register_builtin_backends): the kit's table,
   with host memory read and borrowed in place */
static tb_status tb__native_register(void) {
    tb_backend_impl impl;
    tb_status st = tb_kit_backend_impl(&tb__native_runtime, &impl);
    if (st != TB_OK) return st;
    impl.data_borrow_host = tb__native_data_borrow_host;
    impl.data_host_pointer = tb__native_data_host_pointer;
    return tb_backend_register("native", &impl, "");
}

#endif /* TB__HAVE_NATIVE */
