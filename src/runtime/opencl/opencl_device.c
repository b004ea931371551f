/* ===========================================================================================
   OpenCL runtime: the loaded library, its devices (every platform's; one context and one
   in-order profiling queue per device, created on first use), the caching buffer allocator and
   transfers (mapped where the device shares host memory).
   =========================================================================================== */
#include "../../impl_begin.h"

#ifndef TB_NO_OPENCL

/* Frees the runtime when its last reference goes: every computation (and so every program
   but the cache's, which prepare_to_exit dropped) and every buffer is gone by then. */
static void tb__ocl_runtime_destroy(tb__kit_proc *p) {
    tb__ocl_runtime *rt = (tb__ocl_runtime *)p;
    size_t i;
    for (i = 0; i < rt->num_devices; i++) {
        tb__ocl_device *dev = &rt->devices[i];
        TB_ASSERT(dev->programs == NULL);
        tb__free(dev->cache);
        /* releasing a queue only flushes it: its kernels (PoCL compiles each at its first
           launch, on a thread of its own) would still run while the process exits, and a
           compile racing the exit's destructors crashed */
        if (dev->queue != NULL) {
            TB__OCL_CALL(rt, Finish)(dev->queue);
            TB__OCL_CALL(rt, ReleaseCommandQueue)(dev->queue);
        }
        if (dev->ctx != NULL) TB__OCL_CALL(rt, ReleaseContext)(dev->ctx);
    }
    tb__free(rt->devices);
    tb__free(rt);
}

static void tb__ocl_runtime_unref(tb__ocl_runtime *rt) {
    if (rt != NULL) tb__kit_proc_unref(&rt->proc);
}

static void tb__ocl_unavailable(tb__ocl_runtime *rt, tb_status status, const char *fmt, ...)
    TB_PRINTF_LIKE(3, 4);
static void tb__ocl_unavailable(tb__ocl_runtime *rt, tb_status status, const char *fmt, ...) {
    va_list ap;
    if (rt->proc.status == TB_ERR_OUT_OF_MEMORY) return; /* the load is retried: keep that cause */
    va_start(ap, fmt);
    vsnprintf(rt->proc.reason, sizeof rt->proc.reason, fmt, ap);
    va_end(ap);
    rt->proc.status = status;
}

/* A query of the load that failed for want of host memory or resources: the load fails as out
   of memory (nothing is kept; the next call loads again) instead of going on without the
   answer. Returns whether `err` was such a failure. */
static bool tb__ocl_load_oom(tb__ocl_runtime *rt, tb__cl_int err, const char *call) {
    if (err != TB__CL_OUT_OF_HOST_MEMORY && err != TB__CL_OUT_OF_RESOURCES) return false;
    tb__ocl_unavailable(rt, TB_ERR_OUT_OF_MEMORY, "opencl: %s failed while the runtime loaded: %s",
                        call, tb__cl_error_name(err));
    return true;
}

/* A device info string, cut to fit and trimmed of trailing blanks. */
static void tb__ocl_info_string(tb__ocl_runtime *rt, tb__cl_device_id id, tb__cl_uint param,
                                char *out, size_t cap) {
    size_t need = 0, n;
    char *tmp;
    tb__cl_int err;
    out[0] = '\0';
    err = TB__OCL_CALL(rt, GetDeviceInfo)(id, param, 0, NULL, &need);
    if (tb__ocl_load_oom(rt, err, "clGetDeviceInfo") || err != TB__CL_SUCCESS || need == 0) return;
    tmp = (char *)tb__alloc(need + 1);
    if (tmp == NULL) { /* not an empty string: the load fails and the next call tries again */
        tb__ocl_unavailable(rt, TB_ERR_OUT_OF_MEMORY, "opencl: %s", tb_last_error());
        return;
    }
    err = TB__OCL_CALL(rt, GetDeviceInfo)(id, param, need, tmp, NULL);
    if (!tb__ocl_load_oom(rt, err, "clGetDeviceInfo") && err == TB__CL_SUCCESS) {
        tmp[need] = '\0';
        n = strlen(tmp);
        while (n > 0 && (tmp[n - 1] == ' ' || tmp[n - 1] == '\n'))
            tmp[--n] = '\0';
        if (n >= cap) n = cap - 1;
        memcpy(out, tmp, n);
        out[n] = '\0';
    }
    tb__free(tmp);
}

static void tb__ocl_platform_string(tb__ocl_runtime *rt, tb__cl_platform_id id, tb__cl_uint param,
                                    char *out, size_t cap) {
    size_t need = 0, n;
    char *tmp;
    tb__cl_int err;
    out[0] = '\0';
    err = TB__OCL_CALL(rt, GetPlatformInfo)(id, param, 0, NULL, &need);
    if (tb__ocl_load_oom(rt, err, "clGetPlatformInfo") || err != TB__CL_SUCCESS || need == 0)
        return;
    tmp = (char *)tb__alloc(need + 1);
    if (tmp == NULL) { /* as in tb__ocl_info_string */
        tb__ocl_unavailable(rt, TB_ERR_OUT_OF_MEMORY, "opencl: %s", tb_last_error());
        return;
    }
    err = TB__OCL_CALL(rt, GetPlatformInfo)(id, param, need, tmp, NULL);
    if (!tb__ocl_load_oom(rt, err, "clGetPlatformInfo") && err == TB__CL_SUCCESS) {
        tmp[need] = '\0';
        n = strlen(tmp);
        if (n >= cap) n = cap - 1;
        memcpy(out, tmp, n);
        out[n] = '\0';
    }
    tb__free(tmp);
}

static uint64_t tb__ocl_info_u64(tb__ocl_runtime *rt, tb__cl_device_id id, tb__cl_uint param) {
    tb__cl_ulong v = 0;
    tb__cl_int err = TB__OCL_CALL(rt, GetDeviceInfo)(id, param, sizeof v, &v, NULL);
    if (tb__ocl_load_oom(rt, err, "clGetDeviceInfo") || err != TB__CL_SUCCESS) return 0;
    return (uint64_t)v;
}

static uint32_t tb__ocl_info_u32(tb__ocl_runtime *rt, tb__cl_device_id id, tb__cl_uint param) {
    tb__cl_uint v = 0;
    tb__cl_int err = TB__OCL_CALL(rt, GetDeviceInfo)(id, param, sizeof v, &v, NULL);
    if (tb__ocl_load_oom(rt, err, "clGetDeviceInfo") || err != TB__CL_SUCCESS) return 0;
    return (uint32_t)v;
}

static size_t tb__ocl_info_size(tb__ocl_runtime *rt, tb__cl_device_id id, tb__cl_uint param) {
    size_t v = 0;
    tb__cl_int err = TB__OCL_CALL(rt, GetDeviceInfo)(id, param, sizeof v, &v, NULL);
    if (tb__ocl_load_oom(rt, err, "clGetDeviceInfo") || err != TB__CL_SUCCESS) return 0;
    return v;
}

/* "OpenCL C 1.2 ..." -> 102; 0 when unreadable. */
static int tb__ocl_c_version(const char *text) {
    const char *p = strstr(text, "OpenCL C ");
    int major = 0, minor = 0;
    if (p == NULL) return 0;
    p += 9;
    while (*p >= '0' && *p <= '9')
        major = major * 10 + (*p++ - '0');
    if (*p == '.') {
        p++;
        while (*p >= '0' && *p <= '9')
            minor = minor * 10 + (*p++ - '0');
    }
    return major * 100 + minor;
}

static bool tb__ocl_has_extension(const char *list, const char *name) {
    size_t n = strlen(name);
    const char *p = list;
    while ((p = strstr(p, name)) != NULL) {
        if ((p == list || p[-1] == ' ') && (p[n] == '\0' || p[n] == ' ')) return true;
        p += n;
    }
    return false;
}

/* The f32 lanes of the vectors of the CPU a driver compiles for, where its device version
   names it: PoCL's ends in "HSTR: pthread-x86_64-pc-linux-gnu-haswell", the LLVM name of its
   kernels' target. PoCL's vector width query reads the host's features instead, so on an
   AVX-512 host with a narrower kernel library (POCL_KERNELLIB_NAME=avx2) it says 16 lanes for
   code that has 8; kernels of 16 lanes would then keep their accumulators in memory. 0 where
   the name is missing or not one of these. */
static uint32_t tb__ocl_target_lanes(const char *device_version) {
    static const char *const wide[] = {
        "skylake-avx512", "cascadelake",    "cooperlake",    "cannonlake",
        "icelake-client", "icelake-server", "tigerlake",     "sapphirerapids",
        "rocketlake",     "graniterapids",  "emeraldrapids", "znver4",
        "znver5",         "x86-64-v4",      "knl",           "knm"};
    static const char *const avx[] = {
        "sandybridge", "ivybridge",    "haswell",    "broadwell",        "skylake",   "alderlake",
        "raptorlake",  "meteorlake",   "arrowlake",  "arrowlake-s",      "lunarlake", "pantherlake",
        "gracemont",   "sierraforest", "grandridge", "clearwaterforest", "znver1",    "znver2",
        "znver3",      "bdver1",       "bdver2",     "bdver3",           "bdver4",    "btver2",
        "x86-64-v3",   "corei7-avx",   "core-avx-i", "core-avx2"};
    /* PoCL's SSE2 library targets athlon64 */
    static const char *const sse[] = {
        "x86-64",        "x86-64-v2",  "core2",   "penryn",   "nehalem",       "westmere",
        "corei7",        "silvermont", "slm",     "goldmont", "goldmont-plus", "tremont",
        "bonnell",       "atom",       "nocona",  "prescott", "btver1",        "amdfam10",
        "barcelona",     "k8",         "k8-sse3", "opteron",  "opteron-sse3",  "athlon64",
        "athlon64-sse3", "athlon-fx"};
    static const struct {
        const char *const *names;
        size_t count;
        uint32_t lanes;
    } classes[] = {{wide, sizeof wide / sizeof wide[0], 16},
                   {avx, sizeof avx / sizeof avx[0], 8},
                   {sse, sizeof sse / sizeof sse[0], 4}};
    const char *hstr = device_version != NULL ? strstr(device_version, "HSTR: ") : NULL;
    size_t len, c, i;
    if (hstr == NULL) return 0;
    hstr += 6;
    len = strcspn(hstr, " ");
    for (c = 0; c < sizeof classes / sizeof classes[0]; c++) {
        for (i = 0; i < classes[c].count; i++) {
            const char *name = classes[c].names[i];
            size_t n = strlen(name);
            if (len > n && hstr[len - n - 1] == '-' && memcmp(hstr + len - n, name, n) == 0)
                return classes[c].lanes;
        }
    }
    return 0;
}

static void tb__ocl_fill_device(tb__ocl_runtime *rt, tb__ocl_device *dev) {
    tb_device_info *info = &dev->info;
    uint64_t type = tb__ocl_info_u64(rt, dev->id, TB__CL_DEVICE_TYPE), fp_config;
    char extensions[4096];
    size_t n;
    memset(info, 0, sizeof *info);
    strcpy(info->device.backend, "opencl");
    info->device.ordinal = dev->ordinal;
    if (type & TB__CL_DEVICE_TYPE_GPU) {
        info->device.type = TB_DEVICE_GPU;
    } else if (type & TB__CL_DEVICE_TYPE_ACCELERATOR) {
        info->device.type = TB_DEVICE_ACCELERATOR;
    } else {
        info->device.type = TB_DEVICE_CPU;
    }
    tb__ocl_info_string(rt, dev->id, TB__CL_DEVICE_NAME, info->name, sizeof info->name);
    tb__ocl_info_string(rt, dev->id, TB__CL_DEVICE_VENDOR, info->vendor, sizeof info->vendor);
    tb__ocl_info_string(rt, dev->id, TB__CL_DRIVER_VERSION, info->driver_version,
                        sizeof info->driver_version);
    tb__ocl_info_string(rt, dev->id, TB__CL_DEVICE_OPENCL_C_VERSION, info->language_version,
                        sizeof info->language_version);
    tb__ocl_info_string(rt, dev->id, TB__CL_DEVICE_VERSION, dev->device_version,
                        sizeof dev->device_version);
    tb__ocl_info_string(rt, dev->id, TB__CL_DEVICE_EXTENSIONS, extensions, sizeof extensions);
    tb__ocl_platform_string(rt, dev->platform, TB__CL_PLATFORM_NAME, dev->platform_name,
                            sizeof dev->platform_name);
    tb__ocl_platform_string(rt, dev->platform, TB__CL_PLATFORM_VERSION, dev->platform_version,
                            sizeof dev->platform_version);
    n = strlen(extensions);
    if (n >= sizeof info->extensions) {
        /* cut at a space so that no extension name appears half */
        n = sizeof info->extensions - 1;
        while (n > 0 && extensions[n] != ' ')
            n--;
    }
    memcpy(info->extensions, extensions, n);
    info->extensions[n] = '\0';
    info->global_memory = tb__ocl_info_u64(rt, dev->id, TB__CL_DEVICE_GLOBAL_MEM_SIZE);
    info->local_memory = tb__ocl_info_u64(rt, dev->id, TB__CL_DEVICE_LOCAL_MEM_SIZE);
    info->max_allocation = tb__ocl_info_u64(rt, dev->id, TB__CL_DEVICE_MAX_MEM_ALLOC_SIZE);
    info->compute_units = tb__ocl_info_u32(rt, dev->id, TB__CL_DEVICE_MAX_COMPUTE_UNITS);
    info->max_work_group_size =
        (uint32_t)tb__ocl_info_size(rt, dev->id, TB__CL_DEVICE_MAX_WORK_GROUP_SIZE);
    info->unified_memory = tb__ocl_info_u32(rt, dev->id, TB__CL_DEVICE_HOST_UNIFIED_MEMORY) != 0;
    info->supports_f64 = tb__ocl_has_extension(extensions, "cl_khr_fp64") &&
                         tb__ocl_info_u64(rt, dev->id, TB__CL_DEVICE_DOUBLE_FP_CONFIG) != 0;
    if (info->compute_units == 0) info->compute_units = 1;
    if (info->max_work_group_size == 0) info->max_work_group_size = 1;
    dev->clock_mhz = tb__ocl_info_u32(rt, dev->id, TB__CL_DEVICE_MAX_CLOCK_FREQUENCY);
    dev->max_parameter_size = tb__ocl_info_size(rt, dev->id, TB__CL_DEVICE_MAX_PARAMETER_SIZE);
    if (dev->max_parameter_size < 256) dev->max_parameter_size = 256; /* the spec's minimum */
    dev->base_align_bits = tb__ocl_info_u32(rt, dev->id, TB__CL_DEVICE_MEM_BASE_ADDR_ALIGN);
    dev->float_lanes = tb__ocl_info_u32(rt, dev->id, TB__CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT);
    if (info->device.type == TB_DEVICE_CPU) {
        uint32_t target = tb__ocl_target_lanes(dev->device_version);
        if (target != 0 && (dev->float_lanes == 0 || target < dev->float_lanes))
            dev->float_lanes = target;
    }
    dev->max_alloc = info->max_allocation;
    if (dev->max_alloc == 0) dev->max_alloc = (uint64_t)128 << 20; /* the spec's minimum */
    fp_config = tb__ocl_info_u64(rt, dev->id, TB__CL_DEVICE_SINGLE_FP_CONFIG);
    dev->correct_divide_sqrt = (fp_config & TB__CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
    dev->fma = (fp_config & TB__CL_FP_FMA) != 0;
    /* Division and square root as the reference computes them (correctly rounded), no
       contraction of a * b + c (the kernels say FP_CONTRACT OFF: they fuse where they ask,
       the packed matmul's products). */
    snprintf(dev->build_options, sizeof dev->build_options, "%s%s%s%s",
             tb__ocl_c_version(info->language_version) >= 102 ? "-cl-std=CL1.2" : "",
             dev->correct_divide_sqrt ? " -cl-fp32-correctly-rounded-divide-sqrt" : "",
             tb__getenv("TB_OPENCL_BUILD_OPTIONS") != NULL ? " " : "",
             tb__getenv("TB_OPENCL_BUILD_OPTIONS") != NULL ? tb__getenv("TB_OPENCL_BUILD_OPTIONS")
                                                           : "");
    dev->stats.cache_limit = info->global_memory / 4;
    if (dev->stats.cache_limit < ((uint64_t)64 << 20)) dev->stats.cache_limit = (uint64_t)64 << 20;
    if (dev->stats.cache_limit > ((uint64_t)4 << 30)) dev->stats.cache_limit = (uint64_t)4 << 30;
}

/* Platform order, then device order; devices that are not available or have no compiler are
   left out (they cannot run generated kernels). */
static void tb__ocl_enumerate(tb__ocl_runtime *rt) {
    tb__cl_uint num_platforms = 0, p;
    tb__cl_platform_id *platforms = NULL;
    tb__cl_int err = TB__OCL_CALL(rt, GetPlatformIDs)(0, NULL, &num_platforms);
    size_t total = 0;
    bool oom = false;
    if (tb__ocl_load_oom(rt, err, "clGetPlatformIDs")) return;
    if (err != TB__CL_SUCCESS || num_platforms == 0) {
        tb__ocl_unavailable(rt, TB_ERR_UNAVAILABLE,
                            "opencl: no OpenCL platform is installed (clGetPlatformIDs: %s)",
                            err != TB__CL_SUCCESS ? tb__cl_error_name(err) : "0 platforms");
        return;
    }
    platforms = (tb__cl_platform_id *)tb__calloc(num_platforms, sizeof *platforms);
    if (platforms == NULL) {
        tb__ocl_unavailable(rt, TB_ERR_OUT_OF_MEMORY, "opencl: %s", tb_last_error());
        return;
    }
    err = TB__OCL_CALL(rt, GetPlatformIDs)(num_platforms, platforms, NULL);
    if (tb__ocl_load_oom(rt, err, "clGetPlatformIDs") || err != TB__CL_SUCCESS) {
        tb__ocl_unavailable(rt, TB_ERR_UNAVAILABLE, "opencl: cannot list the OpenCL platforms");
        tb__free(platforms);
        return;
    }
    for (p = 0; p < num_platforms && !oom; p++) {
        tb__cl_uint nd = 0, d;
        tb__cl_device_id *ids;
        err = TB__OCL_CALL(rt, GetDeviceIDs)(platforms[p], TB__CL_DEVICE_TYPE_ALL, 0, NULL, &nd);
        if (tb__ocl_load_oom(rt, err, "clGetDeviceIDs")) break;
        if (err != TB__CL_SUCCESS || nd == 0) continue;
        ids = (tb__cl_device_id *)tb__calloc(nd, sizeof *ids);
        if (ids == NULL) {
            oom = true;
            break;
        }
        err = TB__OCL_CALL(rt, GetDeviceIDs)(platforms[p], TB__CL_DEVICE_TYPE_ALL, nd, ids, NULL);
        if (!tb__ocl_load_oom(rt, err, "clGetDeviceIDs") && err == TB__CL_SUCCESS) {
            for (d = 0; d < nd; d++) {
                tb__ocl_device *grown;
                if (tb__ocl_info_u32(rt, ids[d], TB__CL_DEVICE_AVAILABLE) == 0 ||
                    tb__ocl_info_u32(rt, ids[d], TB__CL_DEVICE_COMPILER_AVAILABLE) == 0)
                    continue;
                grown = (tb__ocl_device *)tb__calloc(total + 1, sizeof *grown);
                if (grown == NULL) {
                    oom = true;
                    break;
                }
                if (total > 0) memcpy(grown, rt->devices, total * sizeof *grown);
                tb__free(rt->devices);
                rt->devices = grown;
                rt->devices[total].rt = rt;
                {
                    static const tb__mutex unlocked = TB__MUTEX_INIT;
                    rt->devices[total].lock = unlocked;
                }
                rt->devices[total].ordinal = (int32_t)total;
                rt->devices[total].platform = platforms[p];
                rt->devices[total].id = ids[d];
                tb__ocl_fill_device(rt, &rt->devices[total]);
                total++;
            }
        }
        tb__free(ids);
    }
    tb__free(platforms);
    rt->num_devices = total;
    if (oom) {
        /* not "no device": a list cut short would stay so for the whole session */
        tb__ocl_unavailable(rt, TB_ERR_OUT_OF_MEMORY, "opencl: %s", tb_last_error());
        return;
    }
    if (total == 0) {
        tb__ocl_unavailable(rt, TB_ERR_UNAVAILABLE,
                            "opencl: no usable OpenCL device (%u platform%s, none with an "
                            "available device and compiler)",
                            (unsigned)num_platforms, num_platforms == 1 ? "" : "s");
        return;
    }
    /* the first GPU, else the first accelerator, else the first device */
    {
        size_t i;
        int32_t gpu = -1, acc = -1;
        for (i = 0; i < total; i++) {
            if (rt->devices[i].info.device.type == TB_DEVICE_GPU && gpu < 0) gpu = (int32_t)i;
            if (rt->devices[i].info.device.type == TB_DEVICE_ACCELERATOR && acc < 0)
                acc = (int32_t)i;
        }
        rt->default_ordinal = gpu >= 0 ? gpu : (acc >= 0 ? acc : 0);
    }
}

/* The runtime, loaded on first use. Call with tb__ocl_mutex held. NULL (the error set) when
   memory ran out: nothing is kept, and the next call tries again. An unusable runtime has
   status != TB_OK and no devices. */
static tb__ocl_runtime *tb__ocl_runtime_get(void) {
    tb__ocl_runtime *rt = (tb__ocl_runtime *)tb__ocl_current;
    if (rt != NULL) return rt;
    rt = (tb__ocl_runtime *)tb__kit_proc_new(sizeof *rt, tb__ocl_runtime_destroy);
    if (rt == NULL) return NULL;
    if (tb__ocl_load_library(&rt->api, rt->proc.reason, sizeof rt->proc.reason)) {
        tb__ocl_enumerate(rt);
    } else {
        rt->proc.status = TB_ERR_UNAVAILABLE;
    }
    return (tb__ocl_runtime *)tb__kit_proc_keep(&tb__ocl_current, &rt->proc);
}

/* The device of an ordinal, with its context and queue created. Call with the mutex held. */
static tb__ocl_device *tb__ocl_device_get(int32_t ordinal, const char *func) {
    tb__ocl_runtime *rt = tb__ocl_runtime_get();
    tb__ocl_device *dev;
    tb__cl_int err = TB__CL_SUCCESS;
    if (!tb__kit_proc_usable(rt != NULL ? &rt->proc : NULL)) return NULL;
    if (ordinal < 0 || (size_t)ordinal >= rt->num_devices) {
        tb__error(TB_ERR_NOT_FOUND, "%s: no device opencl:%d (%zu device%s)", func, (int)ordinal,
                  rt->num_devices, rt->num_devices == 1 ? "" : "s");
        return NULL;
    }
    dev = &rt->devices[ordinal];
    if (dev->ctx == NULL) {
        tb__cl_context_properties props[3];
        props[0] = (tb__cl_context_properties)TB__CL_CONTEXT_PLATFORM;
        props[1] = (tb__cl_context_properties)dev->platform;
        props[2] = 0;
        dev->ctx = TB__OCL_CALL(rt, CreateContext)(props, 1, &dev->id, NULL, NULL, &err);
        if (dev->ctx == NULL || err != TB__CL_SUCCESS) {
            dev->ctx = NULL;
            tb__error(TB_ERR_UNAVAILABLE, "%s: opencl:%d (%s): clCreateContext failed: %s (%d)",
                      func, (int)ordinal, dev->info.name, tb__cl_error_name(err), (int)err);
            return NULL;
        }
    }
    if (dev->queue == NULL) {
        dev->queue = TB__OCL_CALL(rt, CreateCommandQueue)(dev->ctx, dev->id,
                                                          TB__CL_QUEUE_PROFILING_ENABLE, &err);
        if (dev->queue == NULL || err != TB__CL_SUCCESS) {
            dev->queue = NULL;
            tb__error(TB_ERR_UNAVAILABLE,
                      "%s: opencl:%d (%s): clCreateCommandQueue failed: %s (%d)", func,
                      (int)ordinal, dev->info.name, tb__cl_error_name(err), (int)err);
            return NULL;
        }
    }
    return dev;
}

static void tb__ocl_runtime_ref(tb__ocl_runtime *rt) {
    tb__kit_proc_ref(&rt->proc);
}

/* The device of an ordinal, locked for the caller, with a reference on its runtime: every use
   of a device's memory, programs or queue goes between this and tb__ocl_device_release. NULL
   with the error set. */
static tb__ocl_device *tb__ocl_device_acquire(int32_t ordinal, const char *func) {
    tb__ocl_device *dev;
    tb__mutex_lock(&tb__ocl_mutex);
    dev = tb__ocl_device_get(ordinal, func);
    if (dev != NULL) tb__ocl_runtime_ref(dev->rt);
    tb__mutex_unlock(&tb__ocl_mutex);
    if (dev != NULL) tb__mutex_lock(&dev->lock);
    return dev;
}

/* Locks a device known through one of its buffers or computations (which keep its runtime). */
static void tb__ocl_device_lock(tb__ocl_device *dev) {
    tb__ocl_runtime_ref(dev->rt);
    tb__mutex_lock(&dev->lock);
}

static void tb__ocl_device_release(tb__ocl_device *dev) {
    tb__ocl_runtime *rt = dev->rt;
    tb__mutex_unlock(&dev->lock);
    tb__ocl_runtime_unref(rt);
}

/* ---- the caching allocator ---- */

static void tb__ocl_metric(tb__ocl_device *dev, const char *name, int64_t delta) {
    if (!dev->rt->proc.exited) tb__metric_count(name, delta);
}

static void tb__ocl_buffer_destroy(tb__ocl_buffer *buf) {
    tb__ocl_runtime *rt = TB__OCL_DEV(buf)->rt;
    if (TB__OCL_MEM(buf) != NULL) TB__OCL_CALL(rt, ReleaseMemObject)(TB__OCL_MEM(buf));
    tb__free(buf);
    tb__ocl_runtime_unref(rt);
}

/* Releases cached buffers, oldest first, until at most `keep` bytes stay cached. */
static void tb__ocl_cache_trim(tb__ocl_device *dev, uint64_t keep) {
    size_t i = 0, n;
    if (dev->stats.cached_bytes <= keep) return;
    while (i < dev->cache_count && dev->stats.cached_bytes > keep) {
        tb__ocl_buffer *buf = dev->cache[i++];
        dev->stats.cached_bytes -= buf->k.cap;
        tb__ocl_metric(dev, "OpenCL::BytesCached", -(int64_t)buf->k.cap);
        tb__ocl_buffer_destroy(buf);
    }
    n = dev->cache_count - i;
    memmove(dev->cache, dev->cache + i, n * sizeof *dev->cache);
    dev->cache_count = n;
}

/* buf (zeroed) as the buffer `mem` of dev, of a new generation, holding a reference on the
   runtime (tb__ocl_buffer_destroy drops it). */
static void tb__ocl_buffer_over(tb__ocl_buffer *buf, tb__ocl_device *dev, tb__cl_mem mem,
                                size_t size, size_t cap) {
    buf->k.device = dev;
    buf->k.mem = (void *)mem;
    buf->k.size = size;
    buf->k.cap = cap;
    buf->k.gen = tb__next_generation();
    tb__kit_proc_ref(&dev->rt->proc);
}

/* A buffer of at least `size` bytes. Call with the mutex held and the device ready. */
static tb_status tb__ocl_buffer_alloc(tb__ocl_device *dev, size_t size, tb__ocl_buffer **out) {
    tb__ocl_runtime *rt = dev->rt;
    size_t cap = tb__size_class(size), i;
    tb__cl_bitfield flags = TB__CL_MEM_READ_WRITE;
    tb__cl_mem mem;
    tb__cl_int err = TB__CL_SUCCESS;
    tb__ocl_buffer *buf;
    *out = NULL;
    if ((uint64_t)size > dev->max_alloc) {
        return tb__error(TB_ERR_OUT_OF_MEMORY,
                         "opencl:%d: an allocation of %zu bytes is larger than the device "
                         "allows (CL_DEVICE_MAX_MEM_ALLOC_SIZE %llu bytes)",
                         (int)dev->ordinal, size, (unsigned long long)dev->max_alloc);
    }
    if ((uint64_t)cap > dev->max_alloc) cap = size;
    for (i = dev->cache_count; i-- > 0;) {
        if (dev->cache[i]->k.cap == cap) {
            buf = dev->cache[i];
            memmove(dev->cache + i, dev->cache + i + 1,
                    (dev->cache_count - i - 1) * sizeof *dev->cache);
            dev->cache_count--;
            dev->stats.cached_bytes -= cap;
            dev->buffers_reused++;
            buf->k.size = size;
            buf->k.gen = tb__next_generation();
            dev->stats.bytes_in_use += cap;
            if (dev->stats.bytes_in_use > dev->stats.peak_bytes)
                dev->stats.peak_bytes = dev->stats.bytes_in_use;
            tb__ocl_metric(dev, "OpenCL::BytesCached", -(int64_t)cap);
            tb__ocl_metric(dev, "OpenCL::BytesInUse", (int64_t)cap);
            tb__ocl_metric(dev, "OpenCL::BufferReuse", 1);
            *out = buf;
            return TB_OK;
        }
    }
    buf = (tb__ocl_buffer *)tb__calloc(1, sizeof *buf);
    if (buf == NULL) return TB_ERR_OUT_OF_MEMORY;
    if (dev->info.unified_memory) flags |= TB__CL_MEM_ALLOC_HOST_PTR;
    mem = TB__OCL_CALL(rt, CreateBuffer)(dev->ctx, flags, cap, NULL, &err);
    if ((mem == NULL || err != TB__CL_SUCCESS) && dev->cache_count > 0) {
        /* memory held by the cache may be what is missing */
        dev->cache_trims++;
        tb__ocl_metric(dev, "OpenCL::CacheTrim", 1);
        tb__ocl_cache_trim(dev, 0);
        err = TB__CL_SUCCESS;
        mem = TB__OCL_CALL(rt, CreateBuffer)(dev->ctx, flags, cap, NULL, &err);
    }
    if (mem == NULL || err != TB__CL_SUCCESS) {
        tb__free(buf);
        return tb__error(TB_ERR_OUT_OF_MEMORY,
                         "opencl:%d: clCreateBuffer of %zu bytes failed: %s (%d); %llu bytes in "
                         "use, device memory %llu bytes",
                         (int)dev->ordinal, cap, tb__cl_error_name(err), (int)err,
                         (unsigned long long)dev->stats.bytes_in_use,
                         (unsigned long long)dev->info.global_memory);
    }
    tb__ocl_buffer_over(buf, dev, mem, size, cap);
    dev->buffers_created++;
    dev->stats.bytes_in_use += cap;
    if (dev->stats.bytes_in_use > dev->stats.peak_bytes)
        dev->stats.peak_bytes = dev->stats.bytes_in_use;
    tb__ocl_metric(dev, "OpenCL::BytesInUse", (int64_t)cap);
    tb__ocl_metric(dev, "OpenCL::BufferCreate", 1);
    *out = buf;
    return TB_OK;
}

/* A buffer over the caller's host array `host` of `size` bytes (CL_MEM_USE_HOST_PTR), for a
   device that shares the host's memory: its kernels read the array in place, and
   release(context) gives it back when the buffer goes (tb__ocl_buffer_free, after the device's
   queue is done with it). TB_ERR_UNSUPPORTED, with nothing called, where the device has its
   own memory, nothing is to be called when it goes (a caller's array without a release,
   tb_tensor_from_host_borrowed, which the caller may free as soon as its tensors are released,
   while the queue may still read it), the array is empty or starts off a 64-byte boundary (as
   the native backend's: only outputs are assumed aligned beyond an element, and a borrowed
   buffer is never one), or the driver refuses (the library then copies). Call with the device
   locked. */
static tb_status tb__ocl_buffer_borrow(tb__ocl_device *dev, void *host, size_t size,
                                       void (*release)(void *context), void *context,
                                       tb__ocl_buffer **out) {
    tb__ocl_runtime *rt = dev->rt;
    tb__cl_int err = TB__CL_SUCCESS;
    tb__cl_mem mem;
    tb__ocl_buffer *buf;
    *out = NULL;
    if (!dev->info.unified_memory || release == NULL || size == 0 ||
        (uint64_t)size > dev->max_alloc || (uintptr_t)host % 64 != 0)
        return TB_ERR_UNSUPPORTED;
    buf = (tb__ocl_buffer *)tb__calloc(1, sizeof *buf);
    if (buf == NULL) return TB_ERR_OUT_OF_MEMORY;
    mem = TB__OCL_CALL(rt, CreateBuffer)(dev->ctx, TB__CL_MEM_READ_WRITE | TB__CL_MEM_USE_HOST_PTR,
                                         size, host, &err);
    if (mem == NULL || err != TB__CL_SUCCESS) {
        tb__free(buf);
        return TB_ERR_UNSUPPORTED;
    }
    tb__ocl_buffer_over(buf, dev, mem, size, size);
    buf->release = release;
    buf->context = context;
    *out = buf;
    return TB_OK;
}

/* A borrowed buffer goes: the queue finished first (commands enqueued before still read the
   caller's array; a failed finish leaves a queue that runs nothing more), then the array given
   back. Call with the mutex held; release runs with it held, as the native backend's. */
static void tb__ocl_buffer_give_back(tb__ocl_buffer *buf) {
    tb__ocl_device *dev = TB__OCL_DEV(buf);
    void (*release)(void *context) = buf->release;
    void *context = buf->context;
    if (dev->queue != NULL && !dev->rt->proc.exited)
        (void)TB__OCL_CALL(dev->rt, Finish)(dev->queue);
    tb__ocl_buffer_destroy(buf);
    release(context);
}

/* Gives a buffer back: cached for reuse while the cache has room, else released. Work already
   enqueued on the device's in-order queue that uses it still runs before any reuse. */
static void tb__ocl_buffer_free(tb__ocl_buffer *buf) {
    tb__ocl_device *dev;
    if (buf == NULL) return;
    dev = TB__OCL_DEV(buf);
    if (buf->release != NULL) {
        tb__ocl_buffer_give_back(buf);
        return;
    }
    if (TB__OCL_MEM(buf) == NULL) {
        tb__ocl_buffer_destroy(buf);
        return;
    }
    dev->stats.bytes_in_use -= buf->k.cap;
    tb__ocl_metric(dev, "OpenCL::BytesInUse", -(int64_t)buf->k.cap);
    if (dev->rt->proc.exited || (uint64_t)buf->k.cap > dev->stats.cache_limit ||
        tb__grow((void **)&dev->cache, &dev->cache_cap, dev->cache_count + 1, sizeof *dev->cache) !=
            TB_OK) {
        tb__ocl_buffer_destroy(buf);
        return;
    }
    dev->cache[dev->cache_count++] = buf;
    dev->stats.cached_bytes += buf->k.cap;
    tb__ocl_metric(dev, "OpenCL::BytesCached", (int64_t)buf->k.cap);
    tb__ocl_cache_trim(dev, dev->stats.cache_limit);
}

/* ---- transfers ---- */

static tb_status tb__ocl_write(tb__ocl_device *dev, tb__ocl_buffer *buf, const void *host,
                               size_t size) {
    tb__ocl_runtime *rt = dev->rt;
    tb__cl_int err = TB__CL_SUCCESS;
    if (size == 0) return TB_OK;
    if (dev->info.unified_memory) {
        void *p =
            TB__OCL_CALL(rt, EnqueueMapBuffer)(dev->queue, TB__OCL_MEM(buf), TB__CL_TRUE,
                                               TB__CL_MAP_WRITE, 0, size, 0, NULL, NULL, &err);
        if (p != NULL && err == TB__CL_SUCCESS) {
            memcpy(p, host, size);
            err = TB__OCL_CALL(rt, EnqueueUnmapMemObject)(dev->queue, TB__OCL_MEM(buf), p, 0, NULL,
                                                          NULL);
            if (err == TB__CL_SUCCESS) return TB_OK;
        }
        /* fall through to an explicit write */
    }
    err = TB__OCL_CALL(rt, EnqueueWriteBuffer)(dev->queue, TB__OCL_MEM(buf), TB__CL_TRUE, 0, size,
                                               host, 0, NULL, NULL);
    if (err != TB__CL_SUCCESS) {
        return tb__error(tb__cl_is_oom(err) ? TB_ERR_OUT_OF_MEMORY : TB_ERR_EXECUTE,
                         "opencl:%d: writing %zu bytes to the device failed: %s (%d)",
                         (int)dev->ordinal, size, tb__cl_error_name(err), (int)err);
    }
    return TB_OK;
}

static tb_status tb__ocl_read(tb__ocl_device *dev, const tb__ocl_buffer *buf, void *host,
                              size_t size) {
    tb__ocl_runtime *rt = dev->rt;
    tb__cl_int err = TB__CL_SUCCESS;
    if (size == 0) return TB_OK;
    if (dev->info.unified_memory) {
        void *p = TB__OCL_CALL(rt, EnqueueMapBuffer)(dev->queue, TB__OCL_MEM(buf), TB__CL_TRUE,
                                                     TB__CL_MAP_READ, 0, size, 0, NULL, NULL, &err);
        if (p != NULL && err == TB__CL_SUCCESS) {
            memcpy(host, p, size);
            err = TB__OCL_CALL(rt, EnqueueUnmapMemObject)(dev->queue, TB__OCL_MEM(buf), p, 0, NULL,
                                                          NULL);
            if (err == TB__CL_SUCCESS) return TB_OK;
        }
    }
    err = TB__OCL_CALL(rt, EnqueueReadBuffer)(dev->queue, TB__OCL_MEM(buf), TB__CL_TRUE, 0, size,
                                              host, 0, NULL, NULL);
    if (err != TB__CL_SUCCESS) {
        return tb__error(TB_ERR_EXECUTE,
                         "opencl:%d: reading %zu bytes from the device failed: %s (%d)",
                         (int)dev->ordinal, size, tb__cl_error_name(err), (int)err);
    }
    return TB_OK;
}

#endif /* TB_NO_OPENCL */
