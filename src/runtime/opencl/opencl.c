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
    if (rt != NULL && rt->status == TB_OK) {
        n = rt->num_devices;
        for (i = 0; i < n && i < cap; i++)
            out[i] = rt->devices[i].info.device;
    } else if (why_cap > 0) {
        snprintf(why, why_cap, "%s", rt != NULL ? rt->reason : "out of memory");
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
    } else if (rt->status != TB_OK) {
        st = tb__error(rt->status, "%s", rt->reason);
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
    if (rt != NULL && rt->status == TB_OK) type = rt->devices[rt->default_ordinal].info.device.type;
    tb__mutex_unlock(&tb__ocl_mutex);
    return type;
}

static int32_t tb__ocl_get_default_device_ordinal(void *user_data) {
    tb__ocl_runtime *rt;
    int32_t ordinal = 0;
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt != NULL && rt->status == TB_OK) ordinal = rt->default_ordinal;
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
    } else if (rt->status != TB_OK) {
        st = tb__error(rt->status, "%s", rt->reason);
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
    tb__ocl_current->default_ordinal = ordinal;
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
    } else if (rt->status != TB_OK) {
        tb__error(rt->status, "%s", rt->reason);
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
    return !((tb__ocl_device *)dev)->rt->exited;
}

static int32_t tb__ocl_ordinal(void *dev) {
    return ((tb__ocl_device *)dev)->ordinal;
}

static void tb__ocl_info(void *dev, bool full, tb_device_info *out) {
    (void)full;
    *out = ((tb__ocl_device *)dev)->info; /* set once, when the runtime loaded */
}

static tb__kit_stats *tb__ocl_stats(void *dev) {
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

static void tb__ocl_report(void *dev, tb__str *s) {
    tb__ocl_device *d = (tb__ocl_device *)dev;
    tb__str_append(s, "  OpenCL::BufferCreate: %llu\n", (unsigned long long)d->buffers_created);
    tb__str_append(s, "  OpenCL::BufferReuse: %llu\n", (unsigned long long)d->buffers_reused);
    tb__str_append(s, "  OpenCL::CacheTrim: %llu\n", (unsigned long long)d->cache_trims);
}

/* ---- memory ---- */

static tb_status tb__ocl_alloc(void *dev, size_t bytes, tb__kbuf **out) {
    tb__ocl_buffer *b = NULL;
    tb_status st = tb__ocl_buffer_alloc((tb__ocl_device *)dev, bytes, &b);
    *out = b != NULL ? &b->k : NULL;
    return st;
}

static void tb__ocl_release(tb__kbuf *b) {
    tb__ocl_buffer_free((tb__ocl_buffer *)b);
}

static tb_status tb__ocl_write_entry(void *dev, tb__kbuf *b, const void *host, size_t bytes) {
    return tb__ocl_write((tb__ocl_device *)dev, (tb__ocl_buffer *)b, host, bytes);
}

static tb_status tb__ocl_read_entry(void *dev, const tb__kbuf *b, void *host, size_t bytes) {
    return tb__ocl_read((tb__ocl_device *)dev, (const tb__ocl_buffer *)b, host, bytes);
}

static tb_status tb__ocl_copy(void *dev, const tb__kbuf *from, tb__kbuf *to, size_t bytes) {
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
static void *tb__ocl_map(void *dev, tb__kbuf *b, size_t bytes, bool write) {
    tb__ocl_device *d = (tb__ocl_device *)dev;
    tb__cl_int err = TB__CL_SUCCESS;
    void *p;
    if (!d->info.unified_memory) return NULL;
    p = TB__OCL_CALL(d->rt, EnqueueMapBuffer)(d->queue, (tb__cl_mem)b->mem, TB__CL_TRUE,
                                              write ? TB__CL_MAP_WRITE : TB__CL_MAP_READ, 0, bytes,
                                              0, NULL, NULL, &err);
    return err == TB__CL_SUCCESS ? p : NULL;
}

static tb_status tb__ocl_unmap(void *dev, tb__kbuf *b, void *host) {
    tb__ocl_device *d = (tb__ocl_device *)dev;
    tb__cl_int err = TB__OCL_CALL(d->rt, EnqueueUnmapMemObject)(d->queue, (tb__cl_mem)b->mem, host,
                                                                0, NULL, NULL);
    if (err == TB__CL_SUCCESS) return TB_OK;
    return tb__error(TB_ERR_EXECUTE, "opencl:%d: unmapping a buffer failed: %s (%d)",
                     (int)d->ordinal, tb__cl_error_name(err), (int)err);
}

/* ---- the OpenCL C dialect of the code generator ---- */

static const char *tb__ocl_math(const char *fn, tb_dtype dtype) {
    /* OpenCL C's math functions are overloaded (the built-in exp: on PoCL faster than the
       prelude's tb_exp_f32, which the native dialect takes) */
    (void)dtype;
    return fn;
}

/* `__kernel void NAME(__global T *restrict out, ...)`, with the work-group size the plan fixed. */
static void tb__ocl_emit_kernel(tb__str *src, const tb__plan_kernel *k, const tb__cg_param *params,
                                size_t num_params, const char *body) {
    const tb__cg_param *table = NULL;
    size_t i;
    tb__str_append(src, "__kernel ");
    if (k->group_size[0] > 0) {
        tb__str_append(src, "__attribute__((reqd_work_group_size(%zu, %zu, %zu))) ",
                       k->group_size[0], k->group_size[1] > 0 ? k->group_size[1] : 1,
                       k->group_size[2] > 0 ? k->group_size[2] : 1);
    }
    tb__str_append(src, "void %s(", k->name);
    for (i = 0; i < num_params; i++) {
        const tb__cg_param *q = &params[i];
        const char *sep = i == 0 ? "" : ",\n    ";
        if (q->role == TB__ARG_SCALAR) {
            tb__str_append(src, "%sconst %s %s", sep, q->type, q->name);
        } else if (q->role == -1 || q->role == TB__ARG_ERR) {
            tb__str_append(src, "%s__global %s *restrict %s", sep, q->type, q->name);
        } else if (q->role == TB__ARG_TABLE) {
            /* the whole table and where the kernel's run of it starts */
            tb__str_append(src, "%s__global const %s *restrict %s_all,\n    const long %s_at", sep,
                           q->type, q->name, q->name);
            table = q;
        } else {
            tb__str_append(src, "%s__global const %s *restrict %s", sep, q->type, q->name);
        }
    }
    tb__str_append(src, ") {\n");
    if (table != NULL)
        tb__str_append(src, "    __global const %s *restrict %s = %s_all + %s_at;\n", table->type,
                       table->name, table->name, table->name);
    tb__str_append(src, "%s}\n\n", body);
}

/* The dialect for a device (with or without double precision). */
static void tb__ocl_dialect(const tb__ocl_device *dev, tb__dialect *d) {
    memset(d, 0, sizeof *d);
    d->name = "OpenCL C";
    /* the lines after the fp64 switch are the same with or without it */
#define TB__OCL_HEAD_REST                                                                          \
    "/* a * b + c stays two roundings, as in the reference */\n"                                   \
    "#pragma OPENCL FP_CONTRACT OFF\n"                                                             \
    "#define TB_FN\n"                                                                              \
    "#define TB_MAXS(a, b) ((a) > (b) ? (a) : (b))\n"                                              \
    "#define TB_MINS(a, b) ((a) < (b) ? (a) : (b))\n"                                              \
    "/* the row vectors: TB_VW lanes (the program's first line), built-in names by pasting */\n"   \
    "#define TB_CAT(a, b) a##b\n"                                                                  \
    "#define TB_XCAT(a, b) TB_CAT(a, b)\n"                                                         \
    "#define TB_VN(name) TB_XCAT(name, TB_VW)\n"                                                   \
    "typedef TB_VN(float) tb_vf;\n"                                                                \
    "typedef TB_VN(int) tb_vi;\n"                                                                  \
    "typedef TB_VN(uint) tb_vu;\n"                                                                 \
    "#define TB_HAS_VEC 1\n"                                                                       \
    "#define TB_VLD(i, p) TB_VN(vload)((i), (p))\n"                                                \
    "#define TB_VST(v, i, p) TB_VN(vstore)((v), (i), (p))\n"                                       \
    "#define TB_VBC(c) ((tb_vf)(c))\n"                                                             \
    "#define TB_VSEL(a, b, m) select((a), (b), (m))\n"                                             \
    "#define TB_VCVTI(x) TB_VN(convert_int)(x)\n"                                                  \
    "#define TB_VASF(x) TB_VN(as_float)(x)\n"                                                      \
    "#define TB_VASI(x) TB_VN(as_int)(x)\n"                                                        \
    "#define TB_VASU(x) TB_VN(as_uint)(x)\n"                                                       \
    "#define TB_VASFU(x) TB_VN(as_float)(x)\n"                                                     \
    "#define TB_VFMA(a, b, c) fma(a, b, c)\n"                                                      \
    "#define TB_VSTORE(v, s) TB_VST((v), 0, (s))\n"                                                \
    "#define TB_VSQRT(x) sqrt(x)\n"                                                                \
    "#define TB_VEXP(x) exp(x)\n"                                                                  \
    "/* rows streamed through the caches (CPU devices): the next row fetched ahead, outputs */\n"  \
    "/* stored past the caches, the fence that orders those stores before the kernel's end */\n"   \
    "#if defined(__clang__)\n"                                                                     \
    "#define TB_PREFETCH(p) __builtin_prefetch(p)\n"                                               \
    "#define TB_PREFETCH_L2(p) __builtin_prefetch((p), 0, 1)\n"                                    \
    "#define TB_VSTREAM(v, p) __builtin_nontemporal_store((v), (__global tb_vf *)(p))\n"           \
    "#else\n"                                                                                      \
    "#define TB_PREFETCH(p) prefetch((p), 1)\n"                                                    \
    "#define TB_PREFETCH_L2(p) prefetch((p), 1)\n"                                                 \
    "#define TB_VSTREAM(v, p) TB_VST((v), 0, (p))\n"                                               \
    "#endif\n"                                                                                     \
    "#if defined(__clang__) && defined(__SSE__)\n"                                                 \
    "#define TB_VSTREAM_END() __builtin_ia32_sfence()\n"                                           \
    "#else\n"                                                                                      \
    "#define TB_VSTREAM_END()\n"                                                                   \
    "#endif\n"                                                                                     \
    "#define TB_BITS_F32(b) as_float(b)\n"                                                         \
    "#define TB_F32_BITS(f) as_uint(f)\n"                                                          \
    "/* f16 through the built-ins every OpenCL C device has (no cl_khr_fp16 needed) */\n"          \
    "#define TB_LDH(p, i) vload_half((i), (const __global half *)(p))\n"                           \
    "#define TB_STH(p, i, v) vstore_half_rte((v), (i), (__global half *)(p))\n"                    \
    "#define TB_HAS_F16_CVT 1\n"                                                                   \
    "uint tb_f2h(float x) {\n"                                                                     \
    "    ushort h; vstore_half_rte(x, 0, (__private half *)&h); return h;\n"                       \
    "}\n"                                                                                          \
    "float tb_rnd_f16(float x) {\n"                                                                \
    "    ushort h; vstore_half_rte(x, 0, (__private half *)&h);\n"                                 \
    "    return vload_half(0, (const __private half *)&h);\n"                                      \
    "}\n"                                                                                          \
    "/* TB_VW lanes: f16 through the same built-ins, bf16 as the top half of an f32 */\n"          \
    "#define TB_VLDH(p) TB_VN(vload_half)(0, (const __global half *)(p))\n"                        \
    "#define TB_VSTH(v, p) TB_XCAT(TB_VN(vstore_half), _rte)((v), 0, (__global half *)(p))\n"      \
    "#define TB_VRNDH(x) tb_vrnd_f16(x)\n"                                                         \
    "tb_vf tb_vrnd_f16(tb_vf x) {\n"                                                               \
    "    TB_VN(ushort) h; TB_XCAT(TB_VN(vstore_half), _rte)(x, 0, (__private half *)&h);\n"        \
    "    return TB_VN(vload_half)(0, (const __private half *)&h);\n"                               \
    "}\n"                                                                                          \
    "#define TB_VLDBF(p) TB_VN(as_float)(TB_VN(convert_uint)(TB_VLD(0, (p))) << 16)\n"             \
    "#define TB_VSTBF(v, p) TB_VST(TB_VN(convert_ushort)(TB_VN(as_uint)(tb_vrnd_bf16(v)) >> 16), " \
    "0, (p))\n"                                                                                    \
    "/* W bytes (a where's condition) as 0 or 1 in each lane */\n"                                 \
    "#define TB_VLDB(p) \\\n"                                                                      \
    "    TB_VN(convert_float)(TB_VN(vload)(0, (const __global uchar *)(p)) != (uchar)0) * -1.0f\n" \
    "\n"
    d->head[0] = dev->info.supports_f64 ? "/* torch_backend.h: OpenCL C 1.2 */\n"
                                          "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
                                          "#define TB_HAS_F64 1\n" TB__OCL_HEAD_REST
                                        : "/* torch_backend.h: OpenCL C 1.2 */\n" TB__OCL_HEAD_REST;
#undef TB__OCL_HEAD_REST
    d->global = "__global ";
    d->local = "__local ";
    d->barrier = "barrier(CLK_LOCAL_MEM_FENCE);";
    d->global_id = "get_global_id(%d)";
    d->group_id = "get_group_id(%d)";
    d->local_id = "get_local_id(%d)";
    d->vec_zero = "(%s)(0)";
    d->min_long = "min";
    d->bits_f32 = "as_float";
    d->bits_f64 = "as_double";
    d->err_claim = "atomic_cmpxchg((volatile __global uint *)tb_err, 0u, code) == 0u";
    d->constant = "__constant ";
    d->iabs = "abs";
    d->f64 = dev->info.supports_f64;
    d->math = tb__ocl_math;
    d->kernel = tb__ocl_emit_kernel;
}

/* Code generation as for a GPU whatever the device (a test hook: the GPU variants of matmul
   and of the reductions then run on a CPU device too). */
/* Code generation as for a GPU whatever the device (a test hook: the GPU variants of matmul
   and of the reductions then run on a CPU device too). */
static int tb__ocl_codegen_as_gpu = 0;

/* What the planner and the code generator need to know of a device. */
static void tb__ocl_target(void *device, tb__tuning *tuning, tb__target *target,
                           tb__dialect *dialect) {
    const tb__ocl_device *dev = (const tb__ocl_device *)device;
    bool cpu = dev->info.device.type == TB_DEVICE_CPU && !tb__ocl_codegen_as_gpu;
    tb__tuning_of(cpu ? TB__CLASS_CPU : TB__CLASS_GPU, tuning);
    if (cpu) {
        /* the vector shape of the CPU from the driver's native float width: 16 lanes (AVX-512,
           32 registers), 8 (AVX2, 16 registers), 4 (SSE, NEON: 16 registers assumed) */
        tb__host_shape shape;
        memset(&shape, 0, sizeof shape);
        shape.vec_bytes = dev->float_lanes >= 16 ? 64 : (dev->float_lanes >= 8 ? 32 : 16);
        shape.vec_regs = shape.vec_bytes >= 64 ? 32 : 16;
        tb__tuning_fit(tuning, &shape);
    }
    target->tuning = tuning;
    target->compute_units = dev->info.compute_units;
    target->max_group = dev->info.max_work_group_size;
    target->max_allocation = dev->info.max_allocation;
    target->max_args = dev->max_parameter_size / 8; /* pointers and the widest scalars */
    target->buffer_align = dev->base_align_bits / 8;
    target->f64 = dev->info.supports_f64;
    target->acc_f64 = dev->info.supports_f64 && dev->info.device.type == TB_DEVICE_CPU;
    tb__ocl_dialect(dev, dialect);
    dialect->vec_width = tuning->vec_width > 0 ? tuning->vec_width : 16;
}

/* ---- programs and kernels ---- */

/* The built program of a plan's source (progress: the driver compiles the kernels at their
   first launch, which the kit reports). */
static tb_status tb__ocl_build(void *dev, const tb__plan *plan, const char *src, size_t len,
                               void **program) {
    tb__ocl_program *p = NULL;
    tb_status st;
    tb__progress_kernels(0, tb__plan_functions(plan));
    st = tb__ocl_get_program((tb__ocl_device *)dev, src, len, &p);
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
static tb_status tb__ocl_kernel(void *device, void *program, const tb__plan_kernel *k,
                                tb__kkernel *out) {
    tb__ocl_device *dev = (tb__ocl_device *)device;
    tb__cl_int err = TB__CL_SUCCESS;
    tb__cl_kernel kern =
        TB__OCL_CALL(dev->rt, CreateKernel)(((tb__ocl_program *)program)->program, k->fn, &err);
    if (kern == NULL || err != TB__CL_SUCCESS) {
        return tb__error(TB_ERR_COMPILE, "opencl:%d: clCreateKernel(%s) failed: %s (%d)",
                         (int)dev->ordinal, k->fn, tb__cl_error_name(err), (int)err);
    }
    out->handle = (void *)kern;
    if (k->group_size[0] == 0) out->aux = tb__ocl_pick_local(dev, kern, k->items);
    return TB_OK;
}

static void tb__ocl_kernel_release(void *dev, tb__kkernel *kern) {
    TB__OCL_CALL(((tb__ocl_device *)dev)->rt, ReleaseKernel)((tb__cl_kernel)kern->handle);
}

/* ---- launches ---- */

static tb__cl_int tb__ocl_enqueue(tb__ocl_device *dev, const tb__kkernel *kern,
                                  const tb__plan_kernel *k, tb__cl_event *event) {
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
        lws[0] = kern->aux;
        gws[0] = (size_t)((k->items + lws[0] - 1) / lws[0] * lws[0]);
        dims = 1;
    }
    return TB__OCL_CALL(dev->rt, EnqueueNDRangeKernel)(dev->queue, (tb__cl_kernel)kern->handle,
                                                       dims, NULL, gws, lws, 0, NULL, event);
}

/* Sets the arguments in order (a table is its buffer and the kernel's first entry). */
static tb__cl_int tb__ocl_set_args(tb__ocl_device *dev, tb__cl_kernel kern, const tb__karg *args,
                                   size_t num_args) {
    tb__cl_int err = TB__CL_SUCCESS;
    tb__cl_uint at = 0;
    size_t j;
    for (j = 0; j < num_args && err == TB__CL_SUCCESS; j++) {
        const tb__karg *a = &args[j];
        if (a->kind == TB__ARG_SCALAR) {
            err = TB__OCL_CALL(dev->rt, SetKernelArg)(kern, at++, a->size, a->value);
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
static tb_status tb__ocl_launch(void *device, const tb__kkernel *kern, const tb__plan_kernel *k,
                                const tb__karg *args, size_t num_args, uint64_t *event) {
    tb__ocl_device *dev = (tb__ocl_device *)device;
    tb__cl_event ev = NULL;
    tb__cl_int err = tb__ocl_set_args(dev, (tb__cl_kernel)kern->handle, args, num_args);
    if (err != TB__CL_SUCCESS) {
        return tb__error(TB_ERR_EXECUTE, "opencl:%d: kernel %s: clSetKernelArg: %s (%d)",
                         (int)dev->ordinal, k->name, tb__cl_error_name(err), (int)err);
    }
    err = tb__ocl_enqueue(dev, kern, k, event != NULL ? &ev : NULL);
    if (tb__cl_is_oom(err) && dev->cache_count > 0) {
        /* memory the cache holds may be what the launch is missing */
        dev->cache_trims++;
        tb__ocl_metric(dev, "OpenCL::CacheTrim", 1);
        tb__ocl_cache_trim(dev, 0);
        err = tb__ocl_enqueue(dev, kern, k, event != NULL ? &ev : NULL);
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
    if (rt != NULL && rt->status == TB_OK && node->device.ordinal >= 0 &&
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

static void tb__ocl_exit(void) {
    tb__ocl_runtime *rt;
    size_t i;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_current;
    if (rt != NULL) {
        for (i = 0; i < rt->num_devices; i++) {
            tb__mutex_lock(&rt->devices[i].lock);
            tb__ocl_cache_trim(&rt->devices[i], 0);
            tb__ocl_programs_trim(&rt->devices[i], 0);
            tb__mutex_unlock(&rt->devices[i].lock);
        }
        rt->exited = true;
        tb__ocl_current = NULL;
        tb__ocl_runtime_unref(rt);
    }
    tb__mutex_unlock(&tb__ocl_mutex);
}

static const tb__kit_runtime tb__ocl_runtime_table = {
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
    tb__ocl_target,
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
    tb__ocl_exit,
};

static tb_status tb__opencl_register(void) {
    tb_backend_impl impl;
    tb__kit_impl(&tb__ocl_runtime_table, &impl);
    impl.get_backend_device = tb__ocl_get_backend_device;
    impl.get_default_device_type = tb__ocl_get_default_device_type;
    impl.set_default_device_type = tb__ocl_set_default_device_type;
    impl.get_default_device_ordinal = tb__ocl_get_default_device_ordinal;
    impl.set_default_device_ordinal = tb__ocl_set_default_device_ordinal;
    impl.eager_fallback_device_type = tb__ocl_eager_fallback_device_type;
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
    } else if (rt->status != TB_OK) {
        st = tb__error(rt->status, "%s", rt->reason);
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
        m = (tb__cl_mem)tb__kit_data_mem(&tb__ocl_runtime_table, dev, data);
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
    } else if (rt->status != TB_OK) {
        st = tb__error(rt->status, "%s", rt->reason);
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
