/* ===========================================================================================
   OpenCL backend ("opencl"): the runtime's table for the kit (kit.c, which owns the backend's
   entries) over the devices and buffers (opencl_device.c) and the programs (opencl_program.c),
   the OpenCL C dialect of the code generator, the default device, and the public calls of
   opencl.h. All kernels of a graph are one program.
   =========================================================================================== */
#include "../../impl_begin.h"

#ifndef TB_NO_OPENCL

/* ---- devices ---- */

static size_t tb__ocl_devices(tb_device *out, size_t cap, char *why, size_t why_cap) {
    tb__ocl_runtime *rt;
    size_t i, n = 0;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt != NULL && rt->proc.status == TB_OK) {
        n = rt->num_devices;
        for (i = 0; i < n && i < cap; i++)
            out[i] = rt->devices[i].info.device;
    } else if (why_cap > 0) {
        snprintf(why, why_cap, "%s", rt != NULL ? rt->proc.reason : "out of memory");
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return n;
}

static tb_status tb__ocl_get_backend_device(void *user_data, int32_t ordinal, tb_device *out) {
    tb__ocl_runtime *rt;
    tb_status st = TB_OK;
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt == NULL) {
        st = TB_ERR_OUT_OF_MEMORY;
    } else if (rt->proc.status != TB_OK) {
        st = tb__error(rt->proc.status, "%s", rt->proc.reason);
    } else if (ordinal < 0 || (size_t)ordinal >= rt->num_devices) {
        st = tb__error(TB_ERR_NOT_FOUND, "opencl: no device with ordinal %d (%zu device%s)",
                       (int)ordinal, rt->num_devices, rt->num_devices == 1 ? "" : "s");
    } else {
        *out = rt->devices[ordinal].info.device;
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

static tb_device_type tb__ocl_get_default_device_type(void *user_data) {
    tb__ocl_runtime *rt;
    tb_device_type type = TB_DEVICE_GPU;
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt != NULL && rt->proc.status == TB_OK)
        type = rt->devices[rt->default_ordinal].info.device.type;
    tb__mutex_unlock(&tb__ocl_mutex);
    return type;
}

static int32_t tb__ocl_get_default_device_ordinal(void *user_data) {
    tb__ocl_runtime *rt;
    int32_t ordinal = 0;
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt != NULL && rt->proc.status == TB_OK) ordinal = rt->default_ordinal;
    tb__mutex_unlock(&tb__ocl_mutex);
    return ordinal;
}

/* The default becomes the first device of that type. */
static tb_status tb__ocl_set_default_device_type(void *user_data, tb_device_type type) {
    tb__ocl_runtime *rt;
    tb_status st = TB_OK;
    size_t i;
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt == NULL) {
        st = TB_ERR_OUT_OF_MEMORY;
    } else if (rt->proc.status != TB_OK) {
        st = tb__error(rt->proc.status, "%s", rt->proc.reason);
    } else {
        for (i = 0; i < rt->num_devices; i++)
            if (rt->devices[i].info.device.type == type) break;
        if (i == rt->num_devices) {
            st = tb__error(TB_ERR_NOT_FOUND, "opencl: no device of type %s (%zu device%s)",
                           tb_device_type_name(type), rt->num_devices,
                           rt->num_devices == 1 ? "" : "s");
        } else {
            rt->default_ordinal = (int32_t)i;
        }
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

static tb_status tb__ocl_set_default_device_ordinal(void *user_data, int32_t ordinal) {
    tb_device dev;
    tb_status st = tb__ocl_get_backend_device(user_data, ordinal, &dev);
    if (st != TB_OK) return st;
    tb__mutex_lock(&tb__ocl_mutex);
    ((tb__ocl_runtime *)tb__ocl_current)->default_ordinal = ordinal;
    tb__mutex_unlock(&tb__ocl_mutex);
    return TB_OK;
}

static tb_device_type tb__ocl_eager_fallback_device_type(void *user_data) {
    (void)user_data;
    return TB_DEVICE_CPU;
}

/* A device with a reference on its runtime: ready for work (its context and queue made) unless
   `bare`. */
static void *tb__ocl_open(int32_t ordinal, const char *func, bool bare) {
    tb__ocl_device *dev = NULL;
    tb__ocl_runtime *rt;
    tb__mutex_lock(&tb__ocl_mutex);
    if (!bare) {
        dev = tb__ocl_device_get(ordinal, func);
    } else if ((rt = tb__ocl_runtime_get()) == NULL) {
        tb__error(TB_ERR_OUT_OF_MEMORY, "%s: out of memory", func);
    } else if (rt->proc.status != TB_OK) {
        tb__error(rt->proc.status, "%s", rt->proc.reason);
    } else if (ordinal < 0 || (size_t)ordinal >= rt->num_devices) {
        tb__error(TB_ERR_NOT_FOUND, "%s: no device with ordinal %d (%zu device%s)", func,
                  (int)ordinal, rt->num_devices, rt->num_devices == 1 ? "" : "s");
    } else {
        dev = &rt->devices[ordinal];
    }
    if (dev != NULL) tb__ocl_runtime_ref(dev->rt);
    tb__mutex_unlock(&tb__ocl_mutex);
    return dev;
}

static void tb__ocl_close(void *dev) {
    tb__ocl_runtime_unref(((tb__ocl_device *)dev)->rt);
}

static bool tb__ocl_alive(void *dev) {
    return !((tb__ocl_device *)dev)->rt->proc.exited;
}

static int32_t tb__ocl_ordinal(void *dev) {
    return ((tb__ocl_device *)dev)->ordinal;
}

static void tb__ocl_info(void *dev, bool full, tb_device_info *out) {
    (void)full;
    *out = ((tb__ocl_device *)dev)->info; /* set once, when the runtime loaded */
}

static tb_kit_stats *tb__ocl_stats(void *dev) {
    return &((tb__ocl_device *)dev)->stats;
}

/* The lock holds a reference on the runtime: a buffer's release may drop the last one
   otherwise, and the device with it, before the unlock. */
static void tb__ocl_lock(void *dev) {
    tb__ocl_device_lock((tb__ocl_device *)dev);
}

static void tb__ocl_unlock(void *dev) {
    tb__ocl_device_release((tb__ocl_device *)dev);
}

static void tb__ocl_report(void *dev, char *buf, size_t cap) {
    tb__ocl_device *d = (tb__ocl_device *)dev;
    snprintf(buf, cap,
             "  OpenCL::BufferCreate: %llu\n  OpenCL::BufferReuse: %llu\n  OpenCL::CacheTrim: "
             "%llu\n",
             (unsigned long long)d->buffers_created, (unsigned long long)d->buffers_reused,
             (unsigned long long)d->cache_trims);
}

/* ---- memory ---- */

static tb_status tb__ocl_alloc(void *dev, size_t bytes, tb_kit_buffer **out) {
    tb__ocl_buffer *b = NULL;
    tb_status st = tb__ocl_buffer_alloc((tb__ocl_device *)dev, bytes, &b);
    *out = b != NULL ? &b->k : NULL;
    return st;
}

static void tb__ocl_release(tb_kit_buffer *b) {
    tb__ocl_buffer_free((tb__ocl_buffer *)b);
}

static tb_status tb__ocl_write_entry(void *dev, tb_kit_buffer *b, const void *host, size_t bytes) {
    return tb__ocl_write((tb__ocl_device *)dev, (tb__ocl_buffer *)b, host, bytes);
}

static tb_status tb__ocl_read_entry(void *dev, const tb_kit_buffer *b, void *host, size_t bytes) {
    return tb__ocl_read((tb__ocl_device *)dev, (const tb__ocl_buffer *)b, host, bytes);
}

static tb_status tb__ocl_copy(void *dev, const tb_kit_buffer *from, tb_kit_buffer *to,
                              size_t bytes) {
    tb__ocl_device *d = (tb__ocl_device *)dev;
    tb__cl_int err = TB__OCL_CALL(d->rt, EnqueueCopyBuffer)(
        d->queue, (tb__cl_mem)from->mem, (tb__cl_mem)to->mem, 0, 0, bytes, 0, NULL, NULL);
    if (err == TB__CL_SUCCESS) return TB_OK;
    return tb__error(TB_ERR_EXECUTE, "opencl:%d: clEnqueueCopyBuffer failed: %s (%d)",
                     (int)d->ordinal, tb__cl_error_name(err), (int)err);
}

/* On a device that shares the host's memory, the buffer mapped into the host's address space
   (no copy where the buffer is host memory, as PoCL's are). Elsewhere NULL: the library
   copies. */
static void *tb__ocl_map(void *dev, tb_kit_buffer *b, size_t bytes, bool write) {
    tb__ocl_device *d = (tb__ocl_device *)dev;
    tb__cl_int err = TB__CL_SUCCESS;
    void *p;
    if (!d->info.unified_memory) return NULL;
    p = TB__OCL_CALL(d->rt, EnqueueMapBuffer)(d->queue, (tb__cl_mem)b->mem, TB__CL_TRUE,
                                              write ? TB__CL_MAP_WRITE : TB__CL_MAP_READ, 0, bytes,
                                              0, NULL, NULL, &err);
    return err == TB__CL_SUCCESS ? p : NULL;
}

static tb_status tb__ocl_unmap(void *dev, tb_kit_buffer *b, void *host) {
    tb__ocl_device *d = (tb__ocl_device *)dev;
    tb__cl_int err = TB__OCL_CALL(d->rt, EnqueueUnmapMemObject)(d->queue, (tb__cl_mem)b->mem, host,
                                                                0, NULL, NULL);
    if (err == TB__CL_SUCCESS) return TB_OK;
    return tb__error(TB_ERR_EXECUTE, "opencl:%d: unmapping a buffer failed: %s (%d)",
                     (int)d->ordinal, tb__cl_error_name(err), (int)err);
}

/* Code generation as for a GPU whatever the device (a test hook: the GPU variants of matmul
   and of the reductions then run on a CPU device too). */
static int tb__ocl_codegen_as_gpu = 0;

/* What code generation needs to know of a device. */
static void tb__ocl_facts(void *device, tb_kit_facts *f) {
    const tb__ocl_device *dev = (const tb__ocl_device *)device;
    bool cpu = dev->info.device.type == TB_DEVICE_CPU;
    f->language = TB_KIT_OPENCL_C;
    f->type = cpu && !tb__ocl_codegen_as_gpu ? TB_DEVICE_CPU : TB_DEVICE_GPU;
    /* a CPU's vectors from the driver's native float width: 16 lanes (AVX-512), 8 (AVX2), 4 */
    f->vector_bytes = dev->float_lanes >= 16 ? 64 : (dev->float_lanes >= 8 ? 32 : 16);
    f->compute_units = dev->info.compute_units;
    f->max_group = (uint32_t)dev->info.max_work_group_size;
    f->max_allocation = dev->info.max_allocation;
    f->max_args = (uint32_t)(dev->max_parameter_size / 8); /* pointers, the widest scalars */
    f->buffer_align = dev->base_align_bits / 8;
    f->f64 = dev->info.supports_f64;
    f->f64_accumulate = cpu;
    f->fma = dev->fma;
}

/* ---- programs and kernels ---- */

/* The built program of a plan's source (progress: the driver compiles the kernels at their
   first launch, which the kit reports). */
static tb_status tb__ocl_build(void *dev, const tb_kit_program *src, void **program) {
    tb__ocl_program *p = NULL;
    tb_status st;
    tb_kit_progress(0, src->num_functions);
    st = tb__ocl_get_program((tb__ocl_device *)dev, src->source, src->length, &p);
    *program = p;
    return st;
}

static void tb__ocl_drop(void *dev, void *program) {
    tb__ocl_program_unref((tb__ocl_device *)dev, (tb__ocl_program *)program);
}

/* the first successful run of a program built here: once its kernels ran, its binary is worth
   the most to the disk cache */
static void tb__ocl_ran(void *dev, void *program) {
    tb__ocl_device *d = (tb__ocl_device *)dev;
    tb__ocl_program *p = (tb__ocl_program *)program;
    if (p->save_dir == NULL) return;
    TB__OCL_CALL(d->rt, Finish)(d->queue);
    tb__ocl_program_save(d, p);
}

/* A work-group size for a kernel launched over `items` work items: a multiple of the preferred
   multiple, small enough that every compute unit gets a group. */
static size_t tb__ocl_pick_local(tb__ocl_device *dev, tb__cl_kernel kern, uint64_t items) {
    size_t kmax = 0, pref = 0, wg;
    uint64_t cu = dev->info.compute_units;
    if (TB__OCL_CALL(dev->rt, GetKernelWorkGroupInfo)(kern, dev->id, TB__CL_KERNEL_WORK_GROUP_SIZE,
                                                      sizeof kmax, &kmax, NULL) != TB__CL_SUCCESS ||
        kmax == 0)
        kmax = dev->info.max_work_group_size;
    if (TB__OCL_CALL(dev->rt, GetKernelWorkGroupInfo)(
            kern, dev->id, TB__CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE, sizeof pref, &pref,
            NULL) != TB__CL_SUCCESS ||
        pref == 0)
        pref = 1;
    wg = dev->info.device.type == TB_DEVICE_CPU ? 128 : 256;
    if (wg > kmax) wg = kmax;
    if (wg >= pref) wg -= wg % pref;
    while (wg > pref && (items + wg - 1) / wg < cu) {
        wg /= 2;
        if (wg >= pref) wg -= wg % pref;
    }
    return wg > 0 ? wg : 1;
}

/* The kernel object of a kernel, with the work-group size of one launched over items. */
static tb_status tb__ocl_kernel(void *device, void *program, const tb_kit_kernel *k, void **handle,
                                size_t *aux) {
    tb__ocl_device *dev = (tb__ocl_device *)device;
    tb__cl_int err = TB__CL_SUCCESS;
    tb__cl_kernel kern = TB__OCL_CALL(dev->rt, CreateKernel)(((tb__ocl_program *)program)->program,
                                                             k->function, &err);
    if (kern == NULL || err != TB__CL_SUCCESS) {
        return tb__error(TB_ERR_COMPILE, "opencl:%d: clCreateKernel(%s) failed: %s (%d)",
                         (int)dev->ordinal, k->function, tb__cl_error_name(err), (int)err);
    }
    *handle = (void *)kern;
    *aux = k->group_size[0] == 0 ? tb__ocl_pick_local(dev, kern, k->items) : 0;
    return TB_OK;
}

static void tb__ocl_kernel_release(void *dev, void *handle) {
    TB__OCL_CALL(((tb__ocl_device *)dev)->rt, ReleaseKernel)((tb__cl_kernel)handle);
}

/* ---- launches ---- */

static tb__cl_int tb__ocl_enqueue(tb__ocl_device *dev, void *handle, size_t local,
                                  const tb_kit_kernel *k, tb__cl_event *event) {
    size_t gws[3], lws[3];
    tb__cl_uint dims;
    if (k->group_size[0] > 0) {
        int d;
        for (d = 0; d < 3; d++) {
            lws[d] = k->group_size[d];
            gws[d] = k->groups[d] * k->group_size[d];
        }
        dims = 3;
    } else {
        lws[0] = local;
        gws[0] = (size_t)((k->items + lws[0] - 1) / lws[0] * lws[0]);
        dims = 1;
    }
    return TB__OCL_CALL(dev->rt, EnqueueNDRangeKernel)(dev->queue, (tb__cl_kernel)handle, dims,
                                                       NULL, gws, lws, 0, NULL, event);
}

/* Sets the arguments in order (a table is its buffer and the kernel's first entry). */
static tb__cl_int tb__ocl_set_args(tb__ocl_device *dev, tb__cl_kernel kern, const tb_kit_arg *args,
                                   size_t num_args) {
    tb__cl_int err = TB__CL_SUCCESS;
    tb__cl_uint at = 0;
    size_t j;
    for (j = 0; j < num_args && err == TB__CL_SUCCESS; j++) {
        const tb_kit_arg *a = &args[j];
        if (a->kind == TB__ARG_SCALAR) {
            err = TB__OCL_CALL(dev->rt, SetKernelArg)(kern, at++, a->size, a->value.bytes);
            continue;
        }
        err = TB__OCL_CALL(dev->rt, SetKernelArg)(kern, at++, sizeof(tb__cl_mem), &a->mem);
        if (err == TB__CL_SUCCESS && a->kind == TB__ARG_TABLE)
            err = TB__OCL_CALL(dev->rt, SetKernelArg)(kern, at++, sizeof a->at, &a->at);
    }
    return err;
}

/* A launch enqueued (once more after emptying the buffer cache when the device is out of
   memory). */
static tb_status tb__ocl_launch(void *device, void *handle, size_t aux, const tb_kit_kernel *k,
                                const tb_kit_arg *args, size_t num_args, uint64_t *event) {
    tb__ocl_device *dev = (tb__ocl_device *)device;
    tb__cl_event ev = NULL;
    tb__cl_int err = tb__ocl_set_args(dev, (tb__cl_kernel)handle, args, num_args);
    if (err != TB__CL_SUCCESS) {
        return tb__error(TB_ERR_EXECUTE, "opencl:%d: kernel %s: clSetKernelArg: %s (%d)",
                         (int)dev->ordinal, k->name, tb__cl_error_name(err), (int)err);
    }
    err = tb__ocl_enqueue(dev, handle, aux, k, event != NULL ? &ev : NULL);
    if (tb__cl_is_oom(err) && dev->cache_count > 0) {
        /* memory the cache holds may be what the launch is missing */
        dev->cache_trims++;
        tb__ocl_metric(dev, "OpenCL::CacheTrim", 1);
        tb__ocl_cache_trim(dev, 0);
        err = tb__ocl_enqueue(dev, handle, aux, k, event != NULL ? &ev : NULL);
    }
    if (err != TB__CL_SUCCESS) {
        return tb__error(tb__cl_is_oom(err) ? TB_ERR_OUT_OF_MEMORY : TB_ERR_EXECUTE,
                         "opencl:%d: kernel %s: %s (%d)", (int)dev->ordinal, k->name,
                         tb__cl_error_name(err), (int)err);
    }
    if (event != NULL) *event = (uint64_t)(uintptr_t)ev;
    return TB_OK;
}

static void tb__ocl_finish(void *dev) {
    tb__ocl_device *d = (tb__ocl_device *)dev;
    TB__OCL_CALL(d->rt, Finish)(d->queue);
}

static void tb__ocl_flush(void *dev) {
    tb__ocl_device *d = (tb__ocl_device *)dev;
    TB__OCL_CALL(d->rt, Flush)(d->queue);
}

/* The time of a launch from its profiling event, which is released. */
static double tb__ocl_elapsed(void *dev, uint64_t event) {
    tb__ocl_device *d = (tb__ocl_device *)dev;
    tb__cl_event ev = (tb__cl_event)(uintptr_t)event;
    tb__cl_ulong t0 = 0, t1 = 0;
    if (ev == NULL) return 0;
    TB__OCL_CALL(d->rt, GetEventProfilingInfo)
    (ev, TB__CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
    TB__OCL_CALL(d->rt, GetEventProfilingInfo)
    (ev, TB__CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
    TB__OCL_CALL(d->rt, ReleaseEvent)(ev);
    return t1 > t0 ? (double)(t1 - t0) : 1.0;
}

/* ---- IR hooks, lifetime, registration ---- */

/* The ops whose OpenCL lowering takes floating operands only (integer forms fall back). */
static bool tb__ocl_float_only(tb_op op) {
    return op == TB_OP_DIV || tb__op_float_only(op);
}

/* f64 only on a device with it; the ops OpenCL C lowers for floats only. */
static bool tb__ocl_supports(const tb_node *node) {
    tb__ocl_runtime *rt;
    bool fp64 = false, known = false;
    bool uses_f64;
    uint32_t i;
    tb_op op = node->op;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt != NULL && rt->proc.status == TB_OK && node->device.ordinal >= 0 &&
        (size_t)node->device.ordinal < rt->num_devices) {
        fp64 = rt->devices[node->device.ordinal].info.supports_f64;
        known = true;
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    if (!known) return true; /* nothing runs there anyway */
    if (op == TB_OP_DEVICE_DATA || op == TB_OP_SCALAR) return true;
    uses_f64 = node->shape.dtype == TB_F64;
    for (i = 0; i < node->num_operands; i++)
        uses_f64 = uses_f64 || node->operands[i]->shape.dtype == TB_F64;
    if (uses_f64 && !fp64) return false;
    if (op < 0 || op >= TB_OP_BUILTIN_COUNT) return true; /* the kit decides */
    /* randn uses log, sin and cos in double: bit-identical f64 output would need the C
       library's exact functions, so f64 runs on the reference */
    if (op == TB_OP_RANDN) return fp64 && node->shape.dtype == TB_F32;
    if (op == TB_OP_ARANGE && tb_dtype_is_float(node->shape.dtype)) return fp64;
    if (tb__ocl_float_only(op) && !tb_dtype_is_float(node->shape.dtype)) return false;
    return true;
}

/* tb_shutdown's part: every device's queue finished and its caches emptied. Tensors the
   caller left alive keep the runtime (it is destroyed, and its queues finished, with the last
   of them), and the kernels they queued would still run while the process exits: PoCL
   compiles a kernel at its first launch on a thread of its own, and that compile racing the
   exit's destructors crashed (a 3 x 3 convolution's first run, 1 exit in about 16). */
static void tb__ocl_trim_all(tb__kit_proc *p) {
    tb__ocl_runtime *rt = (tb__ocl_runtime *)p;
    size_t i;
    for (i = 0; i < rt->num_devices; i++) {
        tb__mutex_lock(&rt->devices[i].lock);
        if (rt->devices[i].queue != NULL) TB__OCL_CALL(rt, Finish)(rt->devices[i].queue);
        tb__ocl_cache_trim(&rt->devices[i], 0);
        tb__ocl_programs_trim(&rt->devices[i], 0);
        tb__mutex_unlock(&rt->devices[i].lock);
    }
}

static void tb__ocl_shutdown(void) {
    tb__kit_proc_retire(&tb__ocl_mutex, &tb__ocl_current, tb__ocl_trim_all);
}

/* The runtime's table: programs built by the OpenCL driver, run on its devices' queues. */
static const tb_kit_runtime tb__ocl_runtime_table = {
    "opencl",
    "OpenCL",
    "ProgramBuild",
    true,
    tb__ocl_devices,
    tb__ocl_open,
    tb__ocl_close,
    tb__ocl_alive,
    tb__ocl_ordinal,
    tb__ocl_info,
    tb__ocl_stats,
    tb__ocl_facts,
    tb__ocl_lock,
    tb__ocl_unlock,
    tb__ocl_alloc,
    tb__ocl_release,
    tb__ocl_write_entry,
    tb__ocl_read_entry,
    tb__ocl_copy,
    tb__ocl_map,
    tb__ocl_unmap,
    tb__ocl_build,
    tb__ocl_kernel,
    tb__ocl_kernel_release,
    tb__ocl_drop,
    tb__ocl_launch,
    tb__ocl_finish,
    tb__ocl_elapsed,
    tb__ocl_ran,
    tb__ocl_flush,
    tb__ocl_report,
    tb__ocl_supports,
    tb__ocl_shutdown,
};

/* Host memory in place (DLPack imports, model files mapped from disk, the eager fallback's
   results) on a device that shares the host's memory (PoCL's CPU devices): a buffer over the
   caller's array (tb__ocl_buffer_borrow), which kernels only read (the library never lets a
   result take a shared buffer); release(context) when the data goes, once the queue finished
   what it had of it. Elsewhere, without a release (tb_tensor_from_host_borrowed), and for an
   array off a 64-byte boundary or an empty one, TB_ERR_UNSUPPORTED: the library copies. */
static tb_status tb__ocl_data_borrow_host(void *user_data, tb_backend_data *data, void *host,
                                          void (*release)(void *context), void *context) {
    tb__ocl_device *dev;
    tb__ocl_buffer *buf = NULL;
    size_t nbytes = 0;
    tb_status st = tb_shape_nbytes(&data->shape, &nbytes);
    (void)user_data;
    if (st != TB_OK) return st;
    dev = tb__ocl_device_acquire(data->device.ordinal, "opencl");
    if (dev == NULL) return TB_ERR_UNAVAILABLE;
    st = tb__ocl_buffer_borrow(dev, host, nbytes, release, context, &buf);
    tb__ocl_device_release(dev);
    if (st == TB_OK) data->payload = &buf->k;
    return st;
}

static tb_status tb__opencl_register(void) {
    tb_backend_impl impl;
    tb__kit_impl(&tb__ocl_runtime_table, &impl);
    impl.get_backend_device = tb__ocl_get_backend_device;
    impl.get_default_device_type = tb__ocl_get_default_device_type;
    impl.set_default_device_type = tb__ocl_set_default_device_type;
    impl.get_default_device_ordinal = tb__ocl_get_default_device_ordinal;
    impl.set_default_device_ordinal = tb__ocl_set_default_device_ordinal;
    impl.eager_fallback_device_type = tb__ocl_eager_fallback_device_type;
    impl.data_borrow_host = tb__ocl_data_borrow_host;
    return tb_backend_register("opencl", &impl, "");
}

/* ---- public API (opencl.h) ---- */

/* The device's ordinal, checking that it is an opencl device (NULL: the default device). */
static tb_status tb__ocl_public_ordinal(const char *fn, const tb_device *device, int32_t *out) {
    tb__ensure_setup();
    (void)tb_has_backend("opencl"); /* registers the built-in backends */
    if (device == NULL) {
        *out = tb__ocl_get_default_device_ordinal(NULL);
        return TB_OK;
    }
    if (strcmp(device->backend, "opencl") != 0) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: device %s:%d is not an opencl device", fn,
                         device->backend[0] != '\0' ? device->backend : "(none)",
                         (int)device->ordinal);
    }
    *out = device->ordinal;
    return TB_OK;
}

TBDEF tb_status tb_opencl_available(void) {
    tb__ocl_runtime *rt;
    tb_status st = TB_OK;
    tb__ensure_setup();
    (void)tb_has_backend("opencl");
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt == NULL) {
        st = tb__error(TB_ERR_OUT_OF_MEMORY, "tb_opencl_available: out of memory");
    } else if (rt->proc.status != TB_OK) {
        st = tb__error(rt->proc.status, "%s", rt->proc.reason);
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

TBDEF tb_status tb_opencl_native_device(const tb_device *device, tb_opencl_native *out) {
    tb__ocl_device *dev;
    int32_t ordinal = 0;
    tb_status st;
    if (out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_opencl_native_device: out is NULL");
    }
    st = tb__ocl_public_ordinal("tb_opencl_native_device", device, &ordinal);
    if (st != TB_OK) return st;
    tb__mutex_lock(&tb__ocl_mutex);
    dev = tb__ocl_device_get(ordinal, "tb_opencl_native_device");
    if (dev != NULL) {
        out->platform = (void *)dev->platform;
        out->device = (void *)dev->id;
        out->context = (void *)dev->ctx;
        out->queue = (void *)dev->queue;
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    if (dev == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    return TB_OK;
}

TBDEF tb_status tb_opencl_tensor_buffer(tb_tensor *tensor, void **mem, size_t *size) {
    tb_backend_data *data;
    tb__ocl_device *dev;
    tb__cl_mem m = NULL;
    size_t n = 0;
    tb_status st;
    if (tensor == NULL || mem == NULL || size == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_opencl_tensor_buffer: %s is NULL",
                         tensor == NULL ? "tensor" : (mem == NULL ? "mem" : "size"));
    }
    data = tb_tensor_data(tensor);
    if (data == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
    if (strcmp(data->device.backend, "opencl") != 0) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_opencl_tensor_buffer: the tensor is on %s:%d, not an opencl device",
                         data->device.backend, (int)data->device.ordinal);
    }
    st = tb_shape_nbytes(&data->shape, &n);
    if (st != TB_OK) return st;
    dev = tb__ocl_device_acquire(data->device.ordinal, "tb_opencl_tensor_buffer");
    if (dev != NULL) {
        tb_kit_buffer *buf = tb__kit_data_buffer(&tb__ocl_runtime_table, dev, data);
        if (buf != NULL) m = (tb__cl_mem)buf->mem;
        tb__ocl_device_release(dev);
    }
    if (m == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
    *mem = (void *)m;
    *size = n;
    return TB_OK;
}

TBDEF tb_status tb_opencl_trim_cache(const tb_device *device) {
    tb__ocl_runtime *rt;
    int32_t ordinal = 0;
    tb_status st = TB_OK;
    size_t i;
    if (device != NULL) {
        st = tb__ocl_public_ordinal("tb_opencl_trim_cache", device, &ordinal);
        if (st != TB_OK) return st;
    } else {
        tb__ensure_setup();
        (void)tb_has_backend("opencl");
    }
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt == NULL) {
        st = TB_ERR_OUT_OF_MEMORY;
    } else if (rt->proc.status != TB_OK) {
        st = tb__error(rt->proc.status, "%s", rt->proc.reason);
    } else if (device != NULL && (ordinal < 0 || (size_t)ordinal >= rt->num_devices)) {
        st = tb__error(TB_ERR_NOT_FOUND, "tb_opencl_trim_cache: no device opencl:%d (%zu device%s)",
                       (int)ordinal, rt->num_devices, rt->num_devices == 1 ? "" : "s");
    } else {
        for (i = 0; i < rt->num_devices; i++) {
            if (device != NULL && (int32_t)i != ordinal) continue;
            tb__mutex_lock(&rt->devices[i].lock);
            if (rt->devices[i].cache_count > 0) {
                rt->devices[i].cache_trims++;
                tb__ocl_metric(&rt->devices[i], "OpenCL::CacheTrim", 1);
            }
            tb__ocl_cache_trim(&rt->devices[i], 0);
            tb__mutex_unlock(&rt->devices[i].lock);
        }
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

#else /* TB_NO_OPENCL */

TBDEF tb_status tb_opencl_available(void) {
    return tb__error(TB_ERR_UNSUPPORTED, "tb_opencl_available: built with TB_NO_OPENCL");
}

TBDEF tb_status tb_opencl_native_device(const tb_device *device, tb_opencl_native *out) {
    (void)device;
    (void)out;
    return tb__error(TB_ERR_UNSUPPORTED, "tb_opencl_native_device: built with TB_NO_OPENCL");
}

TBDEF tb_status tb_opencl_tensor_buffer(tb_tensor *tensor, void **mem, size_t *size) {
    (void)tensor;
    (void)mem;
    (void)size;
    return tb__error(TB_ERR_UNSUPPORTED, "tb_opencl_tensor_buffer: built with TB_NO_OPENCL");
}

TBDEF tb_status tb_opencl_trim_cache(const tb_device *device) {
    (void)device;
    return tb__error(TB_ERR_UNSUPPORTED, "tb_opencl_trim_cache: built with TB_NO_OPENCL");
}

#endif /* TB_NO_OPENCL */
