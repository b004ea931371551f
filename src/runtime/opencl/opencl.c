/* ===========================================================================================
   OpenCL backend ("opencl"): the backend's entries over the runtime (opencl_device.c) and the
   programs (opencl_program.c); a lowering that partitions a graph into fused kernels
   (elementwise chains, reductions with their elementwise producers, matmul with an elementwise
   epilogue, movement ops as index arithmetic), all kernels of a graph in one program.
   =========================================================================================== */
#include "../../impl_begin.h"

#ifndef TB_NO_OPENCL

/* ---- backend entries: devices ---- */

static size_t tb__ocl_get_backend_devices(void *user_data, tb_device *out, size_t cap) {
    tb__ocl_runtime *rt;
    size_t i, n = 0;
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt != NULL && rt->status == TB_OK) {
        n = rt->num_devices;
        for (i = 0; i < n && i < cap; i++)
            out[i] = rt->devices[i].info.device;
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

static tb_status tb__ocl_get_device_info(void *user_data, int32_t ordinal, tb_device_info *out) {
    tb_device dev;
    tb_status st = tb__ocl_get_backend_device(user_data, ordinal, &dev);
    if (st != TB_OK) return st;
    tb__mutex_lock(&tb__ocl_mutex);
    *out = tb__ocl_current->devices[ordinal].info;
    tb__mutex_unlock(&tb__ocl_mutex);
    return TB_OK;
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

static size_t tb__ocl_metrics_report(void *user_data, char *buf, size_t cap) {
    tb__str s;
    tb__ocl_runtime *rt;
    size_t i, n;
    char *text;
    (void)user_data;
    memset(&s, 0, sizeof s);
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt == NULL || rt->status != TB_OK) {
        tb__str_append(&s, "OpenCL: unavailable: %s\n", rt != NULL ? rt->reason : "out of memory");
    } else {
        for (i = 0; i < rt->num_devices; i++) {
            tb__ocl_device *d = &rt->devices[i];
            tb__mutex_lock(&d->lock);
            tb__str_append(&s, "Device: opencl:%zu (%s, %s)\n", i, d->info.name,
                           tb_device_type_name(d->info.device.type));
            tb__str_append(&s, "  OpenCL::BytesInUse: %llu\n", (unsigned long long)d->bytes_in_use);
            tb__str_append(&s, "  OpenCL::PeakBytesInUse: %llu\n",
                           (unsigned long long)d->peak_bytes);
            tb__str_append(&s, "  OpenCL::BytesCached: %llu\n",
                           (unsigned long long)d->cached_bytes);
            tb__str_append(&s, "  OpenCL::BufferCreate: %llu\n",
                           (unsigned long long)d->buffers_created);
            tb__str_append(&s, "  OpenCL::BufferReuse: %llu\n",
                           (unsigned long long)d->buffers_reused);
            tb__str_append(&s, "  OpenCL::CacheTrim: %llu\n", (unsigned long long)d->cache_trims);
            tb__str_append(&s, "  OpenCL::ProgramBuild: %llu\n",
                           (unsigned long long)TB__ATOMIC_LOAD(&d->program_builds));
            tb__str_append(&s, "  OpenCL::DiskCacheHit: %llu\n",
                           (unsigned long long)TB__ATOMIC_LOAD(&d->disk_hits));
            tb__str_append(&s, "  OpenCL::DiskCacheMiss: %llu\n",
                           (unsigned long long)TB__ATOMIC_LOAD(&d->disk_misses));
            tb__str_append(&s, "  OpenCL::DiskCacheRejected: %llu\n",
                           (unsigned long long)TB__ATOMIC_LOAD(&d->disk_rejected));
            tb__str_append(&s, "  OpenCL::KernelLaunch: %llu\n",
                           (unsigned long long)d->kernels_launched);
            tb__mutex_unlock(&d->lock);
        }
    }
    tb__mutex_unlock(&tb__ocl_mutex);
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

/* ---- backend entries: data ---- */

static tb_status tb__ocl_data_from_host(void *user_data, tb_backend_data *data, const void *host) {
    tb__ocl_device *dev;
    tb__ocl_buffer *buf = NULL;
    size_t size;
    tb_status st;
    (void)user_data;
    st = tb_shape_nbytes(&data->shape, &size);
    if (st != TB_OK) return st;
    dev = tb__ocl_device_acquire(data->device.ordinal, "opencl");
    if (dev == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    st = tb__ocl_buffer_alloc(dev, size, &buf);
    if (st == TB_OK) {
        st = tb__ocl_write(dev, buf, host, size);
        if (st != TB_OK) {
            tb__ocl_buffer_free(buf);
            buf = NULL;
        }
    }
    tb__ocl_device_release(dev);
    if (st == TB_OK) data->payload = buf;
    return st;
}

/* The value stays on the host (kernels take scalars as arguments); device memory is made only
   if a kernel reads it as an array. */
static tb_status tb__ocl_data_from_scalar(void *user_data, tb_backend_data *data, tb_scalar value) {
    tb__ocl_device *dev;
    tb__ocl_buffer *buf;
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    dev = tb__ocl_device_get(data->device.ordinal, "opencl");
    if (dev == NULL) {
        tb__mutex_unlock(&tb__ocl_mutex);
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    }
    buf = (tb__ocl_buffer *)tb__calloc(1, sizeof *buf);
    if (buf == NULL) {
        tb__mutex_unlock(&tb__ocl_mutex);
        return TB_ERR_OUT_OF_MEMORY;
    }
    buf->dev = dev;
    tb__ocl_runtime_ref(dev->rt);
    tb__mutex_unlock(&tb__ocl_mutex);
    data->is_scalar = true;
    data->scalar = value;
    data->payload = buf;
    return TB_OK;
}

static tb_status tb__ocl_data_to_host(void *user_data, const tb_backend_data *data, void *host) {
    tb__ocl_buffer *buf = (tb__ocl_buffer *)data->payload;
    size_t size;
    tb_status st;
    (void)user_data;
    st = tb_shape_nbytes(&data->shape, &size);
    if (st != TB_OK) return st;
    if (buf == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "opencl: data_to_host of a data without a value");
    }
    if (buf->mem == NULL) {
        unsigned char bytes[8];
        tb__ocl_scalar_bytes(data->shape.dtype, data->scalar, bytes);
        memcpy(host, bytes, size < 8 ? size : 8);
        return TB_OK;
    }
    tb__ocl_device_lock(buf->dev);
    if (buf->dev->rt->exited) {
        st = tb__error(TB_ERR_STATE, "opencl: the backend was shut down");
    } else {
        st = tb__ocl_read(buf->dev, buf, host, size);
    }
    tb__ocl_device_release(buf->dev);
    return st;
}

static void tb__ocl_data_release(void *user_data, tb_backend_data *data) {
    tb__ocl_buffer *buf = (tb__ocl_buffer *)data->payload;
    tb__ocl_device *dev;
    (void)user_data;
    if (buf == NULL) return;
    dev = buf->dev;
    tb__ocl_device_lock(dev);
    tb__ocl_buffer_free(buf);
    tb__ocl_device_release(dev);
    data->payload = NULL;
}

/* On a device that shares the host's memory, a buffer mapped into the host's address space
   (no copy where the buffer is host memory, as PoCL's are): the library reads or writes the
   values there for one host step, then unmaps. Elsewhere NULL: the library copies. */
static void *tb__ocl_data_map_host(void *user_data, tb_backend_data *data, bool write) {
    tb__ocl_buffer *buf = (tb__ocl_buffer *)data->payload;
    tb__ocl_device *dev;
    tb__cl_int err = TB__CL_SUCCESS;
    void *p = NULL;
    size_t size;
    (void)user_data;
    if (tb_shape_nbytes(&data->shape, &size) != TB_OK || size == 0) return NULL;
    if (write) {
        dev = tb__ocl_device_acquire(data->device.ordinal, "opencl");
        if (dev == NULL) return NULL;
        if (dev->info.unified_memory && tb__ocl_buffer_alloc(dev, size, &buf) != TB_OK) buf = NULL;
        if (!dev->info.unified_memory) buf = NULL;
    } else {
        if (buf == NULL || buf->mem == NULL || !buf->dev->info.unified_memory) return NULL;
        dev = buf->dev;
        tb__ocl_device_lock(dev);
    }
    if (buf != NULL && !dev->rt->exited) {
        p = TB__OCL_CALL(dev->rt, EnqueueMapBuffer)(dev->queue, buf->mem, TB__CL_TRUE,
                                                    write ? TB__CL_MAP_WRITE : TB__CL_MAP_READ, 0,
                                                    size, 0, NULL, NULL, &err);
        if (err != TB__CL_SUCCESS) p = NULL;
    }
    if (write && buf != NULL) {
        if (p != NULL) {
            data->payload = buf;
        } else {
            tb__ocl_buffer_free(buf);
        }
    }
    tb__ocl_device_release(dev);
    return p;
}

static tb_status tb__ocl_data_unmap_host(void *user_data, tb_backend_data *data, void *host) {
    tb__ocl_buffer *buf = (tb__ocl_buffer *)data->payload;
    tb__cl_int err;
    (void)user_data;
    if (buf == NULL || buf->mem == NULL) return TB_OK;
    tb__ocl_device_lock(buf->dev);
    err = buf->dev->rt->exited ? TB__CL_SUCCESS
                               : TB__OCL_CALL(buf->dev->rt, EnqueueUnmapMemObject)(
                                     buf->dev->queue, buf->mem, host, 0, NULL, NULL);
    tb__ocl_device_release(buf->dev);
    if (err != TB__CL_SUCCESS) {
        return tb__error(TB_ERR_EXECUTE, "opencl:%d: unmapping a buffer failed: %s (%d)",
                         (int)buf->dev->ordinal, tb__cl_error_name(err), (int)err);
    }
    return TB_OK;
}

/* Device memory for a data that may hold a host scalar; NULL with the error set. */
static tb__cl_mem tb__ocl_data_mem(tb__ocl_device *dev, tb_backend_data *data) {
    tb__ocl_buffer *buf = (tb__ocl_buffer *)data->payload;
    if (buf == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "opencl: an argument has no value");
        return NULL;
    }
    if (buf->dev != dev) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "opencl: an argument lives on opencl:%d, not opencl:%d",
                  (int)buf->dev->ordinal, (int)dev->ordinal);
        return NULL;
    }
    if (buf->mem == NULL) {
        /* a host scalar that a kernel reads as an array: give it device memory now */
        unsigned char bytes[8];
        tb__ocl_buffer *mem_buf = NULL;
        size_t size = tb_dtype_size(data->shape.dtype);
        tb__ocl_scalar_bytes(data->shape.dtype, data->scalar, bytes);
        if (tb__ocl_buffer_alloc(dev, size, &mem_buf) != TB_OK) return NULL;
        if (tb__ocl_write(dev, mem_buf, bytes, size) != TB_OK) {
            tb__ocl_buffer_free(mem_buf);
            return NULL;
        }
        buf->mem = mem_buf->mem;
        buf->size = mem_buf->size;
        buf->cap = mem_buf->cap;
        mem_buf->mem = NULL;
        tb__ocl_buffer_destroy(mem_buf);
    }
    return buf->mem;
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
static int tb__ocl_codegen_as_gpu = 0;

/* What the planner needs to know of a device. */
static void tb__ocl_target(const tb__ocl_device *dev, tb__tuning *tuning, tb__target *target) {
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
    memset(target, 0, sizeof *target);
    target->tuning = tuning;
    target->compute_units = dev->info.compute_units;
    target->max_group = dev->info.max_work_group_size;
    target->max_allocation = dev->info.max_allocation;
    target->max_args = dev->max_parameter_size / 8; /* pointers and the widest scalars */
    target->buffer_align = dev->base_align_bits / 8;
    target->f64 = dev->info.supports_f64;
    target->acc_f64 = dev->info.supports_f64 && dev->info.device.type == TB_DEVICE_CPU;
}

/* ---- backend entries: lowering, compile, execute ---- */

/* Panels a pack kernel made of one parameter's buffer, kept while that buffer (the same object,
   of the same generation) comes again. */
typedef struct tb__ocl_kept {
    const tb__ocl_buffer *src;
    uint64_t gen;
    tb__ocl_buffer *panels;
} tb__ocl_kept;

/* A compiled graph: its plan, its program and a kernel object per kernel. */
typedef struct tb__ocl_comp {
    tb__plan *plan;
    int32_t ordinal;
    char *source;
    size_t source_len;
    tb__ocl_runtime *rt; /* a reference */
    tb__ocl_program *program;
    tb__cl_kernel *cl;
    size_t *local;      /* per kernel: the work-group size of kernels launched over items */
    tb__ocl_kept *kept; /* per kernel: kept panels */
    int32_t ran; /* atomic: it ran once (the driver compiled its kernels at their first launch) */
} tb__ocl_comp;

typedef struct tb__ocl_context {
    tb__ocl_comp *comp; /* moves to the computation on a successful compile */
} tb__ocl_context;

static void tb__ocl_comp_release(tb__ocl_comp *c) {
    size_t i;
    tb__ocl_runtime *rt;
    if (c == NULL) return;
    rt = c->rt;
    if (rt != NULL) {
        tb__ocl_device *dev =
            (size_t)c->ordinal < rt->num_devices ? &rt->devices[c->ordinal] : NULL;
        if (c->cl != NULL) {
            for (i = 0; i < c->plan->num_kernels; i++)
                if (c->cl[i] != NULL) TB__OCL_CALL(rt, ReleaseKernel)(c->cl[i]);
        }
        if (dev != NULL && (c->program != NULL || c->kept != NULL)) {
            tb__ocl_device_lock(dev);
            if (c->program != NULL) tb__ocl_program_unref(dev, c->program);
            for (i = 0; c->kept != NULL && i < c->plan->num_kernels; i++)
                tb__ocl_buffer_free(c->kept[i].panels);
            tb__ocl_device_release(dev);
        }
    }
    tb__free(c->cl);
    tb__free(c->local);
    tb__free(c->kept);
    tb__free(c->source);
    tb__plan_free(c->plan);
    tb__free(c);
    tb__ocl_runtime_unref(rt);
}

/* Plans the graph for the device and renders the plan as OpenCL C (no lock: the device's facts
   do not change). */
static tb_status tb__ocl_create_lowering_context(void *user_data, const tb_graph *graph,
                                                 void **context) {
    tb__ocl_device *dev;
    tb__ocl_comp *c;
    tb__ocl_context *ctx;
    tb__pgraph G;
    tb__tuning tuning;
    tb__target target;
    tb__dialect dialect;
    tb_status st;
    (void)user_data;
    *context = NULL;
    ctx = (tb__ocl_context *)tb__calloc(1, sizeof *ctx);
    c = (tb__ocl_comp *)tb__calloc(1, sizeof *c);
    if (ctx == NULL || c == NULL) {
        tb__free(ctx);
        tb__free(c);
        return TB_ERR_OUT_OF_MEMORY;
    }
    tb__mutex_lock(&tb__ocl_mutex);
    dev = tb__ocl_device_get(graph->device.ordinal, "opencl");
    if (dev != NULL) tb__ocl_runtime_ref(dev->rt);
    tb__mutex_unlock(&tb__ocl_mutex);
    if (dev == NULL) {
        tb__free(ctx);
        tb__free(c);
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    }
    c->rt = dev->rt;
    c->ordinal = dev->ordinal;
    tb__ocl_target(dev, &tuning, &target);
    tb__ocl_dialect(dev, &dialect);
    dialect.vec_width = tuning.vec_width > 0 ? tuning.vec_width : 16;
    st = tb__plan_build(graph, &target, &G, &c->plan);
    if (st == TB_OK) {
        st = tb__cg_render(&G, c->plan, &dialect, &c->source, &c->source_len);
        tb__pgraph_free(&G);
    }
    if (st != TB_OK) {
        tb__ocl_comp_release(c);
        tb__free(ctx);
    } else {
        ctx->comp = c;
        *context = ctx;
    }
    return st;
}

static void tb__ocl_release_lowering_context(void *user_data, void *context) {
    tb__ocl_context *ctx = (tb__ocl_context *)context;
    (void)user_data;
    if (ctx == NULL) return;
    tb__ocl_comp_release(ctx->comp);
    tb__free(ctx);
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

/* The device of a computation, checked to be the one it was made for. NULL with the error set. */
static tb__ocl_device *tb__ocl_comp_device(const tb__ocl_comp *c) {
    tb__ocl_device *dev;
    tb__mutex_lock(&tb__ocl_mutex);
    dev = tb__ocl_device_get(c->ordinal, "opencl");
    if (dev != NULL && (dev->rt != c->rt || dev->rt->exited)) {
        tb__error(TB_ERR_STATE, "opencl: the computation outlived the backend");
        dev = NULL;
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return dev;
}

/* Builds (or finds) the program, then a kernel object per kernel with work. The device's lock
   is not held while the driver builds. */
static tb_status tb__ocl_compile(void *user_data, void *context, void **computation) {
    tb__ocl_context *ctx = (tb__ocl_context *)context;
    tb__ocl_comp *p = ctx != NULL ? ctx->comp : NULL;
    tb__ocl_device *dev;
    tb_status st = TB_OK;
    size_t i, launched = 0;
    (void)user_data;
    *computation = NULL;
    if (p == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "opencl: compile without a context");
    dev = tb__ocl_comp_device(p);
    if (dev == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    if (tb_debug_level() >= 3) {
        tb_log_message(TB_LOG_DEBUG, "opencl:%d: program of graph %016llx:\n%s", (int)p->ordinal,
                       (unsigned long long)p->plan->graph_hash, p->source);
    }
    p->cl = (tb__cl_kernel *)tb__calloc(p->plan->num_kernels + 1, sizeof(tb__cl_kernel));
    p->local = (size_t *)tb__calloc(p->plan->num_kernels + 1, sizeof(size_t));
    p->kept = (tb__ocl_kept *)tb__calloc(p->plan->num_kernels + 1, sizeof *p->kept);
    if (p->cl == NULL || p->local == NULL || p->kept == NULL) st = TB_ERR_OUT_OF_MEMORY;
    if (st == TB_OK) tb__progress_kernels(0, tb__plan_functions(p->plan));
    if (st == TB_OK) st = tb__ocl_get_program(dev, p->source, p->source_len, &p->program);
    for (i = 0; i < p->plan->num_kernels && st == TB_OK; i++) {
        tb__plan_kernel *k = &p->plan->kernels[i];
        tb__cl_int err = TB__CL_SUCCESS;
        if (k->empty) continue;
        p->cl[i] = TB__OCL_CALL(dev->rt, CreateKernel)(p->program->program, k->fn, &err);
        if (p->cl[i] == NULL || err != TB__CL_SUCCESS) {
            p->cl[i] = NULL;
            st = tb__error(TB_ERR_COMPILE, "opencl:%d: clCreateKernel(%s) failed: %s (%d)",
                           (int)p->ordinal, k->fn, tb__cl_error_name(err), (int)err);
            break;
        }
        if (k->group_size[0] == 0) p->local[i] = tb__ocl_pick_local(dev, p->cl[i], k->items);
        launched++;
    }
    if (st == TB_OK && tb_debug_level() >= 1) {
        tb__str names;
        memset(&names, 0, sizeof names);
        for (i = 0; i < p->plan->num_kernels; i++)
            if (!p->plan->kernels[i].empty)
                tb__str_append(&names, "%s%s", names.len > 0 ? " " : "", p->plan->kernels[i].name);
        tb_log_message(TB_LOG_INFO, "opencl:%d: graph %016llx: %zu kernel%s: %s", (int)p->ordinal,
                       (unsigned long long)p->plan->graph_hash, launched, launched == 1 ? "" : "s",
                       names.data != NULL ? names.data : "");
        tb__str_free(&names);
    }
    if (st == TB_OK) {
        *computation = p;
        ctx->comp = NULL;
    }
    return st;
}

static void tb__ocl_release_computation(void *user_data, void *computation) {
    (void)user_data;
    tb__ocl_comp_release((tb__ocl_comp *)computation);
}

static const char *tb__ocl_backend_text(void *user_data, const void *computation) {
    (void)user_data;
    return computation != NULL ? ((const tb__ocl_comp *)computation)->source : NULL;
}

static int32_t tb__ocl_get_node_kernel(void *user_data, const void *computation, size_t node_index,
                                       const char **kernel_name) {
    const tb__ocl_comp *p = (const tb__ocl_comp *)computation;
    int32_t k;
    (void)user_data;
    if (kernel_name != NULL) *kernel_name = NULL;
    if (p == NULL || p->plan->node_kernel == NULL || node_index >= p->plan->num_nodes) return -1;
    k = p->plan->node_kernel[node_index];
    if (k >= 0 && kernel_name != NULL) *kernel_name = p->plan->kernels[k].name;
    return k;
}

static tb__cl_int tb__ocl_launch(tb__ocl_device *dev, const tb__ocl_comp *p, size_t i,
                                 tb__cl_event *event) {
    const tb__plan_kernel *k = &p->plan->kernels[i];
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
        lws[0] = p->local[i];
        gws[0] = (size_t)((k->items + lws[0] - 1) / lws[0] * lws[0]);
        dims = 1;
    }
    return TB__OCL_CALL(dev->rt, EnqueueNDRangeKernel)(dev->queue, p->cl[i], dims, NULL, gws, lws,
                                                       0, NULL, event);
}

/* The bytes of a scalar argument as the kernel declares it. */
static size_t tb__ocl_scalar_arg(tb__ocl_device *dev, tb_dtype dtype, const tb_backend_data *data,
                                 unsigned char out[8]) {
    tb_scalar v;
    if (data->is_scalar) {
        v = data->scalar;
    } else {
        /* a scalar parameter given as an array (not made by data_from_scalar) */
        unsigned char raw[8];
        memset(raw, 0, sizeof raw);
        if (tb__ocl_read(dev, (const tb__ocl_buffer *)data->payload, raw, tb_dtype_size(dtype)) !=
            TB_OK)
            return 0;
        if (dtype == TB_F32) {
            float f;
            memcpy(&f, raw, sizeof f);
            v = tb_scalar_f(TB_F32, f);
        } else if (dtype == TB_F64) {
            double f;
            memcpy(&f, raw, sizeof f);
            v = tb_scalar_f(TB_F64, f);
        } else if (dtype == TB_F16 || dtype == TB_BF16) {
            uint16_t h;
            memcpy(&h, raw, sizeof h);
            v = tb_scalar_f(dtype, tb__half_to_f64(dtype, h));
        } else if (dtype == TB_I32) {
            int32_t x;
            memcpy(&x, raw, sizeof x);
            v = tb_scalar_i(TB_I32, x);
        } else if (dtype == TB_I64) {
            int64_t x;
            memcpy(&x, raw, sizeof x);
            v = tb_scalar_i(TB_I64, x);
        } else {
            v = tb_scalar_i(dtype, raw[0]);
        }
    }
    if (dtype == TB_F64 && !dev->info.supports_f64) {
        tb__ocl_scalar_bytes(TB_F32, v, out);
        return 4;
    }
    tb__ocl_scalar_bytes(dtype, v, out);
    return tb_dtype_size(dtype);
}

/* The buffers of a run: the parameters' (borrowed) and the kernels' outputs (owned until they
   are results or freed after their last use), the error flag and the scalar table. */
typedef struct tb__ocl_run {
    tb__ocl_comp *p;
    tb__ocl_device *dev;
    tb__ocl_buffer **owned, *err_buf, *table_buf;
    tb__cl_mem *mems;
    tb__cl_event *events; /* per kernel at TB_DEBUG >= 2: its profiling event */
    bool consumed;        /* the kernels writing into donated buffers were reached */
} tb__ocl_run;

static tb_status tb__ocl_run_init(tb__ocl_run *r, tb_backend_data *const *arguments) {
    static const uint32_t zeros[TB__ERR_WORDS] = {0};
    const tb__plan *plan = r->p->plan;
    tb__ocl_device *dev = r->dev;
    tb_status st = TB_OK;
    size_t i;
    r->owned = (tb__ocl_buffer **)tb__calloc(plan->num_slots + 1, sizeof *r->owned);
    r->mems = (tb__cl_mem *)tb__calloc(plan->num_slots + 1, sizeof *r->mems);
    r->events = (tb__cl_event *)tb__calloc(plan->num_kernels + 1, sizeof *r->events);
    if (r->owned == NULL || r->mems == NULL || r->events == NULL) return TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < plan->num_slots && st == TB_OK; i++) {
        const tb__plan_slot *s = &plan->slots[i];
        if (s->kind != TB__SLOT_PARAM) continue;
        r->mems[i] = tb__ocl_data_mem(dev, arguments[s->index]);
        if (r->mems[i] == NULL) st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
    }
    for (i = 0; i < plan->num_results && st == TB_OK; i++) {
        /* a result computed into a donated parameter's buffer */
        if (plan->result_alias[i] >= 0)
            r->mems[plan->result_slot[i]] =
                ((tb__ocl_buffer *)arguments[plan->result_alias[i]]->payload)->mem;
    }
    if (st == TB_OK && plan->num_errsites > 0) {
        tb__cl_int err;
        st = tb__ocl_buffer_alloc(dev, sizeof zeros, &r->err_buf);
        if (st == TB_OK) {
            err = TB__OCL_CALL(dev->rt, EnqueueWriteBuffer)(
                dev->queue, r->err_buf->mem, TB__CL_FALSE, 0, sizeof zeros, zeros, 0, NULL, NULL);
            if (err != TB__CL_SUCCESS) {
                st = tb__error(TB_ERR_EXECUTE, "opencl:%d: clEnqueueWriteBuffer failed: %s (%d)",
                               (int)dev->ordinal, tb__cl_error_name(err), (int)err);
            }
        }
    }
    if (st == TB_OK && plan->scalar_table) {
        /* each kernel's run of entries: the scalars it reads, in its order */
        size_t bytes = (plan->table_len + 1) * 8, j;
        unsigned char *table = (unsigned char *)tb__calloc(plan->table_len + 1, 8);
        if (table == NULL) st = TB_ERR_OUT_OF_MEMORY;
        for (i = 0; i < plan->num_kernels && st == TB_OK; i++) {
            const tb__plan_kernel *k = &plan->kernels[i];
            for (j = 0; j < k->num_table_params && st == TB_OK; j++) {
                int32_t a = k->table_params[j];
                if (tb__ocl_scalar_arg(dev, plan->param_dtype[a], arguments[a],
                                       table + 8 * ((size_t)k->table_at + j)) == 0)
                    st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_EXECUTE;
            }
        }
        if (st == TB_OK) st = tb__ocl_buffer_alloc(dev, bytes, &r->table_buf);
        if (st == TB_OK) st = tb__ocl_write(dev, r->table_buf, table, bytes);
        tb__free(table);
    }
    return st;
}

/* Sets kernel i's arguments in the plan's order, after its output. */
static tb_status tb__ocl_set_args(tb__ocl_run *r, size_t i, tb_backend_data *const *arguments) {
    const tb__plan_kernel *k = &r->p->plan->kernels[i];
    tb__ocl_runtime *rt = r->dev->rt;
    tb__cl_kernel kern = r->p->cl[i];
    tb__cl_int err;
    tb__cl_uint a = 0;
    size_t j;
    err = TB__OCL_CALL(rt, SetKernelArg)(kern, a++, sizeof(tb__cl_mem), &r->mems[k->out_slot]);
    for (j = 0; j < k->num_args && err == TB__CL_SUCCESS; j++) {
        const tb__plan_arg *arg = &k->args[j];
        if (arg->kind == TB__ARG_BUF) {
            err =
                TB__OCL_CALL(rt, SetKernelArg)(kern, a++, sizeof(tb__cl_mem), &r->mems[arg->index]);
        } else if (arg->kind == TB__ARG_SCALAR) {
            unsigned char bytes[8];
            size_t n = tb__ocl_scalar_arg(r->dev, r->p->plan->param_dtype[arg->index],
                                          arguments[arg->index], bytes);
            if (n == 0) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_EXECUTE;
            err = TB__OCL_CALL(rt, SetKernelArg)(kern, a++, n, bytes);
        } else {
            tb__ocl_buffer *b = arg->kind == TB__ARG_TABLE ? r->table_buf : r->err_buf;
            err = TB__OCL_CALL(rt, SetKernelArg)(kern, a++, sizeof(tb__cl_mem), &b->mem);
            if (err == TB__CL_SUCCESS && arg->kind == TB__ARG_TABLE) {
                int64_t at = k->table_at; /* where the kernel's run of the table starts */
                err = TB__OCL_CALL(rt, SetKernelArg)(kern, a++, sizeof at, &at);
            }
        }
    }
    if (err == TB__CL_SUCCESS) return TB_OK;
    return tb__error(TB_ERR_EXECUTE, "opencl:%d: kernel %s: clSetKernelArg: %s (%d)",
                     (int)r->p->ordinal, k->name, tb__cl_error_name(err), (int)err);
}

/* Runs kernel i: its output allocated, its arguments set, its launch enqueued (once more after
   emptying the buffer cache when the device is out of memory). */
static tb_status tb__ocl_run_kernel(tb__ocl_run *r, size_t i, tb_backend_data *const *arguments) {
    const tb__plan_kernel *k = &r->p->plan->kernels[i];
    tb__ocl_device *dev = r->dev;
    tb__cl_event *event = tb_debug_level() >= 2 ? &r->events[i] : NULL;
    tb__cl_int err;
    tb_status st;
    const tb__ocl_buffer *src =
        k->pack_param >= 0 ? (const tb__ocl_buffer *)arguments[k->pack_param]->payload : NULL;
    tb__ocl_kept *kp = &r->p->kept[i];
    if (src != NULL && kp->panels != NULL && kp->src == src && kp->gen == src->gen) {
        r->mems[k->out_slot] = kp->panels->mem; /* the panels of this buffer, made before */
        tb__ocl_metric(dev, "OpenCL::PanelsKept", 1);
        return TB_OK;
    }
    if (r->mems[k->out_slot] == NULL) {
        size_t size = 0;
        st = tb_shape_nbytes(&r->p->plan->slots[k->out_slot].shape, &size);
        if (st == TB_OK) st = tb__ocl_buffer_alloc(dev, size, &r->owned[k->out_slot]);
        if (st != TB_OK) return st;
        r->mems[k->out_slot] = r->owned[k->out_slot]->mem;
    }
    if (r->p->cl[i] == NULL) return TB_OK; /* nothing to compute */
    st = tb__ocl_set_args(r, i, arguments);
    if (st != TB_OK) return st;
    err = tb__ocl_launch(dev, r->p, i, event);
    if (tb__cl_is_oom(err) && dev->cache_count > 0) {
        /* memory the cache holds may be what the launch is missing */
        dev->cache_trims++;
        tb__ocl_metric(dev, "OpenCL::CacheTrim", 1);
        tb__ocl_cache_trim(dev, 0);
        err = tb__ocl_launch(dev, r->p, i, event);
    }
    if (err != TB__CL_SUCCESS) {
        return tb__error(tb__cl_is_oom(err) ? TB_ERR_OUT_OF_MEMORY : TB_ERR_EXECUTE,
                         "opencl:%d: kernel %s: %s (%d)", (int)r->p->ordinal, k->name,
                         tb__cl_error_name(err), (int)err);
    }
    dev->kernels_launched++;
    tb__ocl_metric(dev, "OpenCL::KernelLaunch", 1);
    if (src != NULL && r->owned[k->out_slot] != NULL &&
        (uint64_t)r->owned[k->out_slot]->cap <= dev->cache_limit) {
        /* keep the panels with the computation (the next run of this buffer skips the pack) */
        tb__ocl_buffer_free(kp->panels);
        kp->panels = r->owned[k->out_slot];
        kp->src = src;
        kp->gen = src->gen;
        r->owned[k->out_slot] = NULL;
    }
    return TB_OK;
}

/* A result that repeats an earlier one gets a copy of its buffer. */
static tb_status tb__ocl_copy_results(tb__ocl_run *r, tb_backend_data *const *results) {
    const tb__plan *plan = r->p->plan;
    size_t i;
    for (i = 0; i < plan->num_results; i++) {
        int32_t src = plan->result_source[i];
        size_t size = 0;
        tb__ocl_buffer *copy = NULL;
        tb__cl_int err;
        tb_status st;
        if (src < 0) continue;
        st = tb_shape_nbytes(&plan->slots[plan->result_slot[src]].shape, &size);
        if (st == TB_OK) st = tb__ocl_buffer_alloc(r->dev, size, &copy);
        if (st != TB_OK) return st;
        err = size == 0 ? TB__CL_SUCCESS
                        : TB__OCL_CALL(r->dev->rt, EnqueueCopyBuffer)(
                              r->dev->queue, r->mems[plan->result_slot[src]], copy->mem, 0, 0, size,
                              0, NULL, NULL);
        if (err != TB__CL_SUCCESS) {
            tb__ocl_buffer_free(copy);
            return tb__error(TB_ERR_EXECUTE, "opencl:%d: clEnqueueCopyBuffer failed: %s (%d)",
                             (int)r->p->ordinal, tb__cl_error_name(err), (int)err);
        }
        results[i]->payload = copy;
    }
    return TB_OK;
}

/* TB_DEBUG=2: one line per kernel with its time, GB/s and GFLOP/s. */
static void tb__ocl_profile(tb__ocl_run *r) {
    const tb__plan *plan = r->p->plan;
    size_t i;
    TB__OCL_CALL(r->dev->rt, Finish)(r->dev->queue);
    for (i = 0; i < plan->num_kernels; i++) {
        tb__cl_ulong t0 = 0, t1 = 0;
        double ns;
        if (r->events[i] == NULL) continue;
        TB__OCL_CALL(r->dev->rt, GetEventProfilingInfo)
        (r->events[i], TB__CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
        TB__OCL_CALL(r->dev->rt, GetEventProfilingInfo)
        (r->events[i], TB__CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
        ns = t1 > t0 ? (double)(t1 - t0) : 1.0;
        r->dev->kernel_ns += (uint64_t)ns;
        tb_log_message(TB_LOG_DEBUG, "opencl:%d %-24s %10.3f ms %9.2f GB/s %9.2f GFLOP/s",
                       (int)r->p->ordinal, plan->kernels[i].name, ns / 1e6,
                       plan->kernels[i].bytes / ns, plan->kernels[i].flops / ns);
    }
}

/* Before the first kernel that writes into a donated buffer: the error flag is read first
   (no kernel from there on can fail), and the donated buffers count as written. */
static tb_status tb__ocl_run_consume(tb__ocl_run *r, tb_backend_data *const *arguments) {
    const tb__plan *plan = r->p->plan;
    size_t i;
    if (r->err_buf != NULL) {
        uint32_t flag[TB__ERR_WORDS];
        tb_status st = tb__ocl_read(r->dev, r->err_buf, flag, sizeof flag);
        if (st == TB_OK && flag[0] != 0) st = tb__cg_run_error(plan, "opencl", flag);
        if (st != TB_OK) return st;
    }
    r->consumed = true;
    for (i = 0; i < plan->num_results; i++) {
        /* its panels, kept by pack kernels, are stale from here on */
        if (plan->result_alias[i] >= 0)
            ((tb__ocl_buffer *)arguments[plan->result_alias[i]]->payload)->gen =
                tb__next_generation();
    }
    return TB_OK;
}

/* Hands the results over (success) or drops the copies made for them (failure), then frees
   everything the run still owns. Donated buffers become their results' (success), or are
   freed once written (failure); either way their arguments lose them. */
static void tb__ocl_run_finish(tb__ocl_run *r, tb_status st, tb_backend_data *const *arguments,
                               tb_backend_data *const *results) {
    const tb__plan *plan = r->p->plan;
    size_t i;
    for (i = 0; i < plan->num_results && r->owned != NULL; i++) {
        int32_t d = plan->result_alias[i];
        if (d >= 0) {
            if (st == TB_OK) {
                results[i]->payload = arguments[d]->payload;
                arguments[d]->payload = NULL;
            } else if (r->consumed) {
                tb__ocl_buffer_free((tb__ocl_buffer *)arguments[d]->payload);
                arguments[d]->payload = NULL;
            }
            continue;
        }
        if (plan->result_source[i] >= 0) {
            if (st != TB_OK && results[i]->payload != NULL) {
                tb__ocl_buffer_free((tb__ocl_buffer *)results[i]->payload);
                results[i]->payload = NULL;
            }
        } else if (st == TB_OK) {
            results[i]->payload = r->owned[plan->result_slot[i]];
            r->owned[plan->result_slot[i]] = NULL;
        }
    }
    if (st == TB_OK) TB__OCL_CALL(r->dev->rt, Flush)(r->dev->queue);
    if (r->owned != NULL) {
        for (i = 0; i < plan->num_slots; i++)
            tb__ocl_buffer_free(r->owned[i]);
    }
    if (r->events != NULL) {
        for (i = 0; i < plan->num_kernels; i++)
            if (r->events[i] != NULL) TB__OCL_CALL(r->dev->rt, ReleaseEvent)(r->events[i]);
    }
    tb__ocl_buffer_free(r->err_buf);
    tb__ocl_buffer_free(r->table_buf);
    tb__free(r->owned);
    tb__free(r->mems);
    tb__free(r->events);
}

/* Runs a computation under its device's lock (runs on other devices go on meanwhile). */
static tb_status tb__ocl_execute(void *user_data, void *computation,
                                 tb_backend_data *const *arguments, size_t num_arguments,
                                 tb_backend_data *const *results, size_t num_results) {
    tb__ocl_comp *p = (tb__ocl_comp *)computation;
    tb__ocl_run r;
    tb_status st;
    size_t i, j, done = 0, total = 0;
    bool watch; /* a first run reporting progress: each new function's first launch waited for */
    (void)user_data;
    if (p == NULL || num_arguments != p->plan->num_params || num_results != p->plan->num_results) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "opencl: execute with %zu arguments and %zu results, the computation has "
                         "%zu and %zu",
                         num_arguments, num_results, p != NULL ? p->plan->num_params : 0,
                         p != NULL ? p->plan->num_results : 0);
    }
    memset(&r, 0, sizeof r);
    r.p = p;
    r.dev = tb__ocl_comp_device(p);
    if (r.dev == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_STATE;
    watch = TB__ATOMIC_LOAD(&p->ran) == 0 && tb__progress_wanted();
    if (watch) total = tb__plan_functions(p->plan);
    tb__ocl_device_lock(r.dev);
    st = tb__ocl_run_init(&r, arguments);
    for (i = 0; i < p->plan->num_kernels && st == TB_OK; i++) {
        if ((int32_t)i == p->plan->first_alias) st = tb__ocl_run_consume(&r, arguments);
        if (st == TB_OK) st = tb__ocl_run_kernel(&r, i, arguments);
        if (st == TB_OK && watch && tb__plan_first_of_function(p->plan, i)) {
            TB__OCL_CALL(r.dev->rt, Finish)(r.dev->queue);
            tb__progress_kernels(++done, total);
        }
        /* temporaries nobody reads any more go back to the cache (the queue is in order) */
        for (j = 0; j < p->plan->num_slots && st == TB_OK; j++) {
            if (p->plan->slots[j].kind == TB__SLOT_TEMP && r.owned[j] != NULL &&
                p->plan->slots[j].last_use <= (int32_t)i) {
                tb__ocl_buffer_free(r.owned[j]);
                r.owned[j] = NULL;
            }
        }
    }
    if (st == TB_OK) st = tb__ocl_copy_results(&r, results);
    if (st == TB_OK && p->program->save_dir != NULL) {
        /* the first run of a program built here: once its kernels ran, its binary is worth
           the most to the disk cache */
        TB__OCL_CALL(r.dev->rt, Finish)(r.dev->queue);
        tb__ocl_program_save(r.dev, p->program);
    }
    if (st == TB_OK && r.err_buf != NULL) {
        uint32_t flag[TB__ERR_WORDS];
        st = tb__ocl_read(r.dev, r.err_buf, flag, sizeof flag);
        if (st == TB_OK && flag[0] != 0) st = tb__cg_run_error(p->plan, "opencl", flag);
    }
    if (st == TB_OK && tb_debug_level() >= 2) tb__ocl_profile(&r);
    if (st == TB_OK && TB__ATOMIC_LOAD(&p->ran) == 0) (void)TB__ATOMIC_ADD(&p->ran, 1);
    tb__ocl_run_finish(&r, st, arguments, results);
    tb__ocl_device_release(r.dev);
    return st;
}

/* ---- backend entries: IR hooks, lifetime, registration ---- */

/* The ops whose OpenCL lowering takes floating operands only (integer forms fall back). */
static bool tb__ocl_float_only(tb_op op) {
    return op == TB_OP_DIV || tb__op_float_only(op);
}

static bool tb__ocl_supports_node(void *user_data, const tb_node *node) {
    tb__ocl_runtime *rt;
    bool fp64 = false, known = false;
    bool uses_f64;
    uint32_t i;
    tb_op op = node->op;
    (void)user_data;
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
    if (op >= TB_OP_BUILTIN_COUNT) {
        const tb_custom_op_desc *d = tb__plan_custom(op);
        return d != NULL && d->opencl_expr != NULL && d->infer_shape == NULL;
    }
    if (op < 0) return false;
    /* randn uses log, sin and cos in double: bit-identical f64 output would need the C
       library's exact functions, so f64 runs on the reference */
    if (op == TB_OP_RANDN) return fp64 && node->shape.dtype == TB_F32;
    if (op == TB_OP_ARANGE && tb_dtype_is_float(node->shape.dtype)) return fp64;
    if (tb__ocl_float_only(op) && !tb_dtype_is_float(node->shape.dtype)) return false;
    return true;
}

static void tb__ocl_prepare_to_exit(void *user_data) {
    tb__ocl_runtime *rt;
    size_t i;
    (void)user_data;
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

static tb_status tb__opencl_register(void) {
    tb_backend_impl impl;
    memset(&impl, 0, sizeof impl);
    impl.prepare_to_exit = tb__ocl_prepare_to_exit;
    impl.supports_node = tb__ocl_supports_node;
    impl.data_from_host = tb__ocl_data_from_host;
    impl.data_from_scalar = tb__ocl_data_from_scalar;
    impl.data_to_host = tb__ocl_data_to_host;
    impl.data_release = tb__ocl_data_release;
    impl.data_map_host = tb__ocl_data_map_host;
    impl.data_unmap_host = tb__ocl_data_unmap_host;
    impl.create_lowering_context = tb__ocl_create_lowering_context;
    impl.release_lowering_context = tb__ocl_release_lowering_context;
    impl.compile = tb__ocl_compile;
    impl.execute = tb__ocl_execute;
    impl.release_computation = tb__ocl_release_computation;
    impl.computation_backend_text = tb__ocl_backend_text;
    impl.get_node_kernel = tb__ocl_get_node_kernel;
    impl.get_backend_devices = tb__ocl_get_backend_devices;
    impl.get_backend_device = tb__ocl_get_backend_device;
    impl.get_device_info = tb__ocl_get_device_info;
    impl.get_default_device_type = tb__ocl_get_default_device_type;
    impl.set_default_device_type = tb__ocl_set_default_device_type;
    impl.get_default_device_ordinal = tb__ocl_get_default_device_ordinal;
    impl.set_default_device_ordinal = tb__ocl_set_default_device_ordinal;
    impl.eager_fallback_device_type = tb__ocl_eager_fallback_device_type;
    impl.create_metrics_report = tb__ocl_metrics_report;
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
        m = tb__ocl_data_mem(dev, data);
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
