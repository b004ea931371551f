/* ===========================================================================================
   OpenCL backend ("opencl")
   The ICD loader is opened at run time (no SDK, no -lOpenCL) unless TB_OPENCL_LINKED is defined.
   Devices of every platform; one context and one in-order profiling queue per device; a caching
   buffer allocator; zero-copy transfers where the device shares host memory; a lowering that
   partitions a graph into fused kernels (elementwise chains, reductions with their elementwise
   producers, matmul with an elementwise epilogue, movement ops as index arithmetic), all kernels
   of a graph in one program, an in-memory program cache and an on-disk binary cache.
   =========================================================================================== */
#ifndef TB_NO_OPENCL

/* ---- the part of the OpenCL API we use, declared here so that no SDK is needed ---- */

#ifdef TB_OPENCL_LINKED
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#ifndef CL_USE_DEPRECATED_OPENCL_1_2_APIS
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#endif
#if defined(__APPLE__)
#include <OpenCL/opencl.h>
#else
#include <CL/cl.h>
#endif
typedef cl_int tb__cl_int;
typedef cl_uint tb__cl_uint;
typedef cl_ulong tb__cl_ulong;
typedef cl_bool tb__cl_bool;
typedef cl_bitfield tb__cl_bitfield;
typedef cl_platform_id tb__cl_platform_id;
typedef cl_device_id tb__cl_device_id;
typedef cl_context tb__cl_context;
typedef cl_command_queue tb__cl_command_queue;
typedef cl_mem tb__cl_mem;
typedef cl_program tb__cl_program;
typedef cl_kernel tb__cl_kernel;
typedef cl_event tb__cl_event;
typedef cl_context_properties tb__cl_context_properties;
#define TB__CL_CALL     CL_API_CALL
#define TB__CL_CALLBACK CL_CALLBACK
#else
typedef int32_t tb__cl_int;
typedef uint32_t tb__cl_uint;
typedef uint64_t tb__cl_ulong;
typedef uint32_t tb__cl_bool;
typedef uint64_t tb__cl_bitfield;
typedef struct tb__cl_platform_st *tb__cl_platform_id;
typedef struct tb__cl_device_st *tb__cl_device_id;
typedef struct tb__cl_context_st *tb__cl_context;
typedef struct tb__cl_queue_st *tb__cl_command_queue;
typedef struct tb__cl_mem_st *tb__cl_mem;
typedef struct tb__cl_program_st *tb__cl_program;
typedef struct tb__cl_kernel_st *tb__cl_kernel;
typedef struct tb__cl_event_st *tb__cl_event;
typedef intptr_t tb__cl_context_properties;
#if defined(_WIN32)
#define TB__CL_CALL     __stdcall
#define TB__CL_CALLBACK __stdcall
#else
#define TB__CL_CALL
#define TB__CL_CALLBACK
#endif
#endif

/* Values from the Khronos headers (CL/cl.h). */
#define TB__CL_SUCCESS                                   0
#define TB__CL_DEVICE_NOT_FOUND                          (-1)
#define TB__CL_MEM_OBJECT_ALLOCATION_FAILURE             (-4)
#define TB__CL_OUT_OF_RESOURCES                          (-5)
#define TB__CL_OUT_OF_HOST_MEMORY                        (-6)
#define TB__CL_BUILD_PROGRAM_FAILURE                     (-11)
#define TB__CL_INVALID_BUFFER_SIZE                       (-61)
#define TB__CL_PLATFORM_NOT_FOUND_KHR                    (-1001)
#define TB__CL_TRUE                                      1u
#define TB__CL_FALSE                                     0u
#define TB__CL_PLATFORM_VERSION                          0x0901u
#define TB__CL_PLATFORM_NAME                             0x0902u
#define TB__CL_PLATFORM_VENDOR                           0x0903u
#define TB__CL_DEVICE_TYPE                               0x1000u
#define TB__CL_DEVICE_MAX_COMPUTE_UNITS                  0x1002u
#define TB__CL_DEVICE_MAX_WORK_GROUP_SIZE                0x1004u
#define TB__CL_DEVICE_MAX_CLOCK_FREQUENCY                0x100Cu
#define TB__CL_DEVICE_MAX_MEM_ALLOC_SIZE                 0x1010u
#define TB__CL_DEVICE_MAX_PARAMETER_SIZE                 0x1017u
#define TB__CL_DEVICE_MEM_BASE_ADDR_ALIGN                0x1019u
#define TB__CL_DEVICE_SINGLE_FP_CONFIG                   0x101Bu
#define TB__CL_DEVICE_GLOBAL_MEM_SIZE                    0x101Fu
#define TB__CL_DEVICE_LOCAL_MEM_SIZE                     0x1023u
#define TB__CL_DEVICE_AVAILABLE                          0x1027u
#define TB__CL_DEVICE_COMPILER_AVAILABLE                 0x1028u
#define TB__CL_DEVICE_NAME                               0x102Bu
#define TB__CL_DEVICE_VENDOR                             0x102Cu
#define TB__CL_DRIVER_VERSION                            0x102Du
#define TB__CL_DEVICE_VERSION                            0x102Fu
#define TB__CL_DEVICE_EXTENSIONS                         0x1030u
#define TB__CL_DEVICE_DOUBLE_FP_CONFIG                   0x1032u
#define TB__CL_DEVICE_HOST_UNIFIED_MEMORY                0x1035u
#define TB__CL_DEVICE_OPENCL_C_VERSION                   0x103Du
#define TB__CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT          (1u << 7)
#define TB__CL_DEVICE_TYPE_CPU                           (1u << 1)
#define TB__CL_DEVICE_TYPE_GPU                           (1u << 2)
#define TB__CL_DEVICE_TYPE_ACCELERATOR                   (1u << 3)
#define TB__CL_DEVICE_TYPE_ALL                           0xFFFFFFFFu
#define TB__CL_CONTEXT_PLATFORM                          0x1084
#define TB__CL_QUEUE_PROFILING_ENABLE                    (1u << 1)
#define TB__CL_MEM_READ_WRITE                            (1u << 0)
#define TB__CL_MEM_ALLOC_HOST_PTR                        (1u << 4)
#define TB__CL_MAP_READ                                  (1u << 0)
#define TB__CL_MAP_WRITE                                 (1u << 1)
#define TB__CL_PROGRAM_BINARY_SIZES                      0x1165u
#define TB__CL_PROGRAM_BINARIES                          0x1166u
#define TB__CL_PROGRAM_BUILD_LOG                         0x1183u
#define TB__CL_KERNEL_WORK_GROUP_SIZE                    0x11B0u
#define TB__CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE 0x11B3u
#define TB__CL_PROFILING_COMMAND_START                   0x1282u
#define TB__CL_PROFILING_COMMAND_END                     0x1283u

/* The entry points, resolved once. */
typedef struct tb__cl_api {
    tb__cl_int(TB__CL_CALL *GetPlatformIDs)(tb__cl_uint, tb__cl_platform_id *, tb__cl_uint *);
    tb__cl_int(TB__CL_CALL *GetPlatformInfo)(tb__cl_platform_id, tb__cl_uint, size_t, void *,
                                             size_t *);
    tb__cl_int(TB__CL_CALL *GetDeviceIDs)(tb__cl_platform_id, tb__cl_bitfield, tb__cl_uint,
                                          tb__cl_device_id *, tb__cl_uint *);
    tb__cl_int(TB__CL_CALL *GetDeviceInfo)(tb__cl_device_id, tb__cl_uint, size_t, void *, size_t *);
    tb__cl_context(TB__CL_CALL *CreateContext)(
        const tb__cl_context_properties *, tb__cl_uint, const tb__cl_device_id *,
        void(TB__CL_CALLBACK *)(const char *, const void *, size_t, void *), void *, tb__cl_int *);
    tb__cl_int(TB__CL_CALL *ReleaseContext)(tb__cl_context);
    tb__cl_command_queue(TB__CL_CALL *CreateCommandQueue)(tb__cl_context, tb__cl_device_id,
                                                          tb__cl_bitfield, tb__cl_int *);
    tb__cl_int(TB__CL_CALL *ReleaseCommandQueue)(tb__cl_command_queue);
    tb__cl_mem(TB__CL_CALL *CreateBuffer)(tb__cl_context, tb__cl_bitfield, size_t, void *,
                                          tb__cl_int *);
    tb__cl_int(TB__CL_CALL *ReleaseMemObject)(tb__cl_mem);
    tb__cl_int(TB__CL_CALL *EnqueueReadBuffer)(tb__cl_command_queue, tb__cl_mem, tb__cl_bool,
                                               size_t, size_t, void *, tb__cl_uint,
                                               const tb__cl_event *, tb__cl_event *);
    tb__cl_int(TB__CL_CALL *EnqueueWriteBuffer)(tb__cl_command_queue, tb__cl_mem, tb__cl_bool,
                                                size_t, size_t, const void *, tb__cl_uint,
                                                const tb__cl_event *, tb__cl_event *);
    tb__cl_int(TB__CL_CALL *EnqueueCopyBuffer)(tb__cl_command_queue, tb__cl_mem, tb__cl_mem, size_t,
                                               size_t, size_t, tb__cl_uint, const tb__cl_event *,
                                               tb__cl_event *);
    void *(TB__CL_CALL *EnqueueMapBuffer)(tb__cl_command_queue, tb__cl_mem, tb__cl_bool,
                                          tb__cl_bitfield, size_t, size_t, tb__cl_uint,
                                          const tb__cl_event *, tb__cl_event *, tb__cl_int *);
    tb__cl_int(TB__CL_CALL *EnqueueUnmapMemObject)(tb__cl_command_queue, tb__cl_mem, void *,
                                                   tb__cl_uint, const tb__cl_event *,
                                                   tb__cl_event *);
    tb__cl_program(TB__CL_CALL *CreateProgramWithSource)(tb__cl_context, tb__cl_uint, const char **,
                                                         const size_t *, tb__cl_int *);
    tb__cl_program(TB__CL_CALL *CreateProgramWithBinary)(tb__cl_context, tb__cl_uint,
                                                         const tb__cl_device_id *, const size_t *,
                                                         const unsigned char **, tb__cl_int *,
                                                         tb__cl_int *);
    tb__cl_int(TB__CL_CALL *BuildProgram)(tb__cl_program, tb__cl_uint, const tb__cl_device_id *,
                                          const char *,
                                          void(TB__CL_CALLBACK *)(tb__cl_program, void *), void *);
    tb__cl_int(TB__CL_CALL *GetProgramBuildInfo)(tb__cl_program, tb__cl_device_id, tb__cl_uint,
                                                 size_t, void *, size_t *);
    tb__cl_int(TB__CL_CALL *GetProgramInfo)(tb__cl_program, tb__cl_uint, size_t, void *, size_t *);
    tb__cl_int(TB__CL_CALL *ReleaseProgram)(tb__cl_program);
    tb__cl_kernel(TB__CL_CALL *CreateKernel)(tb__cl_program, const char *, tb__cl_int *);
    tb__cl_int(TB__CL_CALL *ReleaseKernel)(tb__cl_kernel);
    tb__cl_int(TB__CL_CALL *SetKernelArg)(tb__cl_kernel, tb__cl_uint, size_t, const void *);
    tb__cl_int(TB__CL_CALL *GetKernelWorkGroupInfo)(tb__cl_kernel, tb__cl_device_id, tb__cl_uint,
                                                    size_t, void *, size_t *);
    tb__cl_int(TB__CL_CALL *EnqueueNDRangeKernel)(tb__cl_command_queue, tb__cl_kernel, tb__cl_uint,
                                                  const size_t *, const size_t *, const size_t *,
                                                  tb__cl_uint, const tb__cl_event *,
                                                  tb__cl_event *);
    tb__cl_int(TB__CL_CALL *Finish)(tb__cl_command_queue);
    tb__cl_int(TB__CL_CALL *Flush)(tb__cl_command_queue);
    tb__cl_int(TB__CL_CALL *WaitForEvents)(tb__cl_uint, const tb__cl_event *);
    tb__cl_int(TB__CL_CALL *GetEventProfilingInfo)(tb__cl_event, tb__cl_uint, size_t, void *,
                                                   size_t *);
    tb__cl_int(TB__CL_CALL *ReleaseEvent)(tb__cl_event);
} tb__cl_api;

/* Symbol names in the order of the struct's members (every member is one function pointer). */
static const char *const tb__cl_symbols[] = {"clGetPlatformIDs",
                                             "clGetPlatformInfo",
                                             "clGetDeviceIDs",
                                             "clGetDeviceInfo",
                                             "clCreateContext",
                                             "clReleaseContext",
                                             "clCreateCommandQueue",
                                             "clReleaseCommandQueue",
                                             "clCreateBuffer",
                                             "clReleaseMemObject",
                                             "clEnqueueReadBuffer",
                                             "clEnqueueWriteBuffer",
                                             "clEnqueueCopyBuffer",
                                             "clEnqueueMapBuffer",
                                             "clEnqueueUnmapMemObject",
                                             "clCreateProgramWithSource",
                                             "clCreateProgramWithBinary",
                                             "clBuildProgram",
                                             "clGetProgramBuildInfo",
                                             "clGetProgramInfo",
                                             "clReleaseProgram",
                                             "clCreateKernel",
                                             "clReleaseKernel",
                                             "clSetKernelArg",
                                             "clGetKernelWorkGroupInfo",
                                             "clEnqueueNDRangeKernel",
                                             "clFinish",
                                             "clFlush",
                                             "clWaitForEvents",
                                             "clGetEventProfilingInfo",
                                             "clReleaseEvent"};

static const char *tb__cl_error_name(tb__cl_int err) {
    switch (err) {
    case 0:
        return "CL_SUCCESS";
    case -1:
        return "CL_DEVICE_NOT_FOUND";
    case -2:
        return "CL_DEVICE_NOT_AVAILABLE";
    case -3:
        return "CL_COMPILER_NOT_AVAILABLE";
    case -4:
        return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case -5:
        return "CL_OUT_OF_RESOURCES";
    case -6:
        return "CL_OUT_OF_HOST_MEMORY";
    case -7:
        return "CL_PROFILING_INFO_NOT_AVAILABLE";
    case -11:
        return "CL_BUILD_PROGRAM_FAILURE";
    case -12:
        return "CL_MAP_FAILURE";
    case -14:
        return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
    case -30:
        return "CL_INVALID_VALUE";
    case -31:
        return "CL_INVALID_DEVICE_TYPE";
    case -32:
        return "CL_INVALID_PLATFORM";
    case -33:
        return "CL_INVALID_DEVICE";
    case -34:
        return "CL_INVALID_CONTEXT";
    case -35:
        return "CL_INVALID_QUEUE_PROPERTIES";
    case -36:
        return "CL_INVALID_COMMAND_QUEUE";
    case -37:
        return "CL_INVALID_HOST_PTR";
    case -38:
        return "CL_INVALID_MEM_OBJECT";
    case -42:
        return "CL_INVALID_BINARY";
    case -43:
        return "CL_INVALID_BUILD_OPTIONS";
    case -44:
        return "CL_INVALID_PROGRAM";
    case -45:
        return "CL_INVALID_PROGRAM_EXECUTABLE";
    case -46:
        return "CL_INVALID_KERNEL_NAME";
    case -47:
        return "CL_INVALID_KERNEL_DEFINITION";
    case -48:
        return "CL_INVALID_KERNEL";
    case -49:
        return "CL_INVALID_ARG_INDEX";
    case -50:
        return "CL_INVALID_ARG_VALUE";
    case -51:
        return "CL_INVALID_ARG_SIZE";
    case -52:
        return "CL_INVALID_KERNEL_ARGS";
    case -53:
        return "CL_INVALID_WORK_DIMENSION";
    case -54:
        return "CL_INVALID_WORK_GROUP_SIZE";
    case -55:
        return "CL_INVALID_WORK_ITEM_SIZE";
    case -56:
        return "CL_INVALID_GLOBAL_OFFSET";
    case -57:
        return "CL_INVALID_EVENT_WAIT_LIST";
    case -58:
        return "CL_INVALID_EVENT";
    case -59:
        return "CL_INVALID_OPERATION";
    case -61:
        return "CL_INVALID_BUFFER_SIZE";
    case -63:
        return "CL_INVALID_GLOBAL_WORK_SIZE";
    case -1001:
        return "CL_PLATFORM_NOT_FOUND_KHR";
    }
    return "unknown OpenCL error";
}

static bool tb__cl_is_oom(tb__cl_int err) {
    return err == TB__CL_MEM_OBJECT_ALLOCATION_FAILURE || err == TB__CL_OUT_OF_RESOURCES ||
           err == TB__CL_OUT_OF_HOST_MEMORY;
}

/* ---- runtime: the loaded library, its devices and their state ---- */

struct tb__ocl_runtime;
struct tb__ocl_device;

/* A device buffer: the payload of every opencl tb_backend_data. `mem` is NULL for a scalar made
   by data_from_scalar (its value lives in tb_backend_data.scalar until a kernel needs it in
   memory). */
typedef struct tb__ocl_buffer {
    struct tb__ocl_device *dev;
    tb__cl_mem mem;
    size_t size; /* bytes asked for */
    size_t cap;  /* bytes the cl_mem holds: the size class */
} tb__ocl_buffer;

/* A built program shared by every computation whose source is the same. */
typedef struct tb__ocl_program {
    struct tb__ocl_program *next;
    uint64_t key[2]; /* tb__ocl_program_key */
    char *source;    /* confirms a hit on the key */
    size_t source_len;
    tb__cl_program program;
    int32_t refcount; /* computations using it, plus one while it is in the cache */
    /* the disk cache folder to write the binary to after the first run: some drivers (PoCL)
       add the machine code of the kernels launched so far to the binary, so a later process
       skips that compile too; NULL when written, or when the disk cache is off */
    char *save_dir;
} tb__ocl_program;

typedef struct tb__ocl_device {
    struct tb__ocl_runtime *rt;
    int32_t ordinal;
    tb__cl_platform_id platform;
    tb__cl_device_id id;
    tb_device_info info;
    char platform_name[128];
    char platform_version[128];
    char device_version[128];
    uint64_t max_alloc;
    size_t max_parameter_size; /* bytes of kernel arguments */
    uint32_t clock_mhz;
    bool correct_divide_sqrt;
    char build_options[512];
    /* created on first use */
    tb__cl_context ctx;
    tb__cl_command_queue queue;
    /* the caching allocator: free buffers, oldest first */
    tb__ocl_buffer **cache;
    size_t cache_count, cache_cap;
    uint64_t cached_bytes, cache_limit;
    uint64_t bytes_in_use, peak_bytes;
    uint64_t buffers_created, buffers_reused, cache_trims;
    /* programs and statistics */
    tb__ocl_program *programs;
    uint64_t program_builds, disk_hits, disk_misses, disk_rejected, kernels_launched, kernel_ns;
} tb__ocl_device;

typedef struct tb__ocl_runtime {
    int32_t refcount; /* the backend's reference, plus one per buffer and computation alive */
    bool exited;      /* prepare_to_exit ran: nothing is cached any more */
    void *lib;
    tb__cl_api api;
    tb__ocl_device *devices;
    size_t num_devices;
    int32_t default_ordinal;
    tb_status status; /* TB_OK, or why the backend cannot be used */
    char reason[512];
    bool cache_dir_reported; /* why the disk cache folder is not used was said */
} tb__ocl_runtime;

static tb__mutex tb__ocl_mutex = TB__MUTEX_INIT;
static tb__ocl_runtime *tb__ocl_current;

#define TB__OCL_CALL(rt, fn) ((rt)->api.fn)

static void tb__ocl_program_unref(tb__ocl_device *dev, tb__ocl_program *p);
static void tb__ocl_program_save(tb__ocl_device *dev, tb__ocl_program *p);
static void tb__ocl_cache_trim(tb__ocl_device *dev, uint64_t keep);

static void tb__ocl_runtime_destroy(tb__ocl_runtime *rt) {
    size_t i;
    for (i = 0; i < rt->num_devices; i++) {
        tb__ocl_device *dev = &rt->devices[i];
        tb__ocl_program *p = dev->programs, *next;
        for (; p != NULL; p = next) {
            next = p->next;
            tb__ocl_program_save(dev, p);
            if (p->program != NULL) TB__OCL_CALL(rt, ReleaseProgram)(p->program);
            tb__free(p->source);
            tb__free(p);
        }
        dev->programs = NULL;
        tb__free(dev->cache);
        if (dev->queue != NULL) TB__OCL_CALL(rt, ReleaseCommandQueue)(dev->queue);
        if (dev->ctx != NULL) TB__OCL_CALL(rt, ReleaseContext)(dev->ctx);
    }
    tb__free(rt->devices);
    /* The ICD loader stays loaded (rt->lib is not closed): drivers keep threads and state past
       the release of their last object, and some crash when unloaded. Opening it again after a
       new setup gives the same handle. */
    tb__free(rt);
}

static void tb__ocl_runtime_unref(tb__ocl_runtime *rt) {
    if (rt != NULL && --rt->refcount == 0) tb__ocl_runtime_destroy(rt);
}

static void tb__ocl_unavailable(tb__ocl_runtime *rt, tb_status status, const char *fmt, ...)
    TB_PRINTF_LIKE(3, 4);
static void tb__ocl_unavailable(tb__ocl_runtime *rt, tb_status status, const char *fmt, ...) {
    va_list ap;
    if (rt->status == TB_ERR_OUT_OF_MEMORY) return; /* the load is retried: keep that cause */
    va_start(ap, fmt);
    vsnprintf(rt->reason, sizeof rt->reason, fmt, ap);
    va_end(ap);
    rt->status = status;
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

/* Opens the ICD loader and resolves every entry point; on failure the runtime says why. */
static bool tb__ocl_load_library(tb__ocl_runtime *rt) {
#if defined(TB_OPENCL_LINKED)
    rt->api.GetPlatformIDs = clGetPlatformIDs;
    rt->api.GetPlatformInfo = clGetPlatformInfo;
    rt->api.GetDeviceIDs = clGetDeviceIDs;
    rt->api.GetDeviceInfo = clGetDeviceInfo;
    rt->api.CreateContext = clCreateContext;
    rt->api.ReleaseContext = clReleaseContext;
    rt->api.CreateCommandQueue = clCreateCommandQueue;
    rt->api.ReleaseCommandQueue = clReleaseCommandQueue;
    rt->api.CreateBuffer = clCreateBuffer;
    rt->api.ReleaseMemObject = clReleaseMemObject;
    rt->api.EnqueueReadBuffer = clEnqueueReadBuffer;
    rt->api.EnqueueWriteBuffer = clEnqueueWriteBuffer;
    rt->api.EnqueueCopyBuffer = clEnqueueCopyBuffer;
    rt->api.EnqueueMapBuffer = clEnqueueMapBuffer;
    rt->api.EnqueueUnmapMemObject = clEnqueueUnmapMemObject;
    rt->api.CreateProgramWithSource = clCreateProgramWithSource;
    rt->api.CreateProgramWithBinary = clCreateProgramWithBinary;
    rt->api.BuildProgram = clBuildProgram;
    rt->api.GetProgramBuildInfo = clGetProgramBuildInfo;
    rt->api.GetProgramInfo = clGetProgramInfo;
    rt->api.ReleaseProgram = clReleaseProgram;
    rt->api.CreateKernel = clCreateKernel;
    rt->api.ReleaseKernel = clReleaseKernel;
    rt->api.SetKernelArg = clSetKernelArg;
    rt->api.GetKernelWorkGroupInfo = clGetKernelWorkGroupInfo;
    rt->api.EnqueueNDRangeKernel = clEnqueueNDRangeKernel;
    rt->api.Finish = clFinish;
    rt->api.Flush = clFlush;
    rt->api.WaitForEvents = clWaitForEvents;
    rt->api.GetEventProfilingInfo = clGetEventProfilingInfo;
    rt->api.ReleaseEvent = clReleaseEvent;
    return true;
#else
    const size_t count = sizeof tb__cl_symbols / sizeof tb__cl_symbols[0];
    const char *path = tb__getenv("TB_OPENCL_LIBRARY");
    size_t i;
    if (path == NULL) {
#if defined(_WIN32)
        path = "OpenCL.dll";
#elif defined(__APPLE__)
        path = "/System/Library/Frameworks/OpenCL.framework/OpenCL";
#else
        path = "libOpenCL.so.1";
#endif
    }
    if (sizeof(tb__cl_api) != count * sizeof(void *)) {
        tb__ocl_unavailable(rt, TB_ERR_UNAVAILABLE,
                            "opencl: function pointers and data pointers differ in size here");
        return false;
    }
#if defined(_WIN32)
    rt->lib = (void *)LoadLibraryA(path);
    if (rt->lib == NULL) {
        tb__ocl_unavailable(rt, TB_ERR_UNAVAILABLE, "opencl: cannot open %s: error %lu", path,
                            (unsigned long)GetLastError());
        return false;
    }
#else
    rt->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (rt->lib == NULL) {
        const char *why = dlerror();
        tb__ocl_unavailable(rt, TB_ERR_UNAVAILABLE, "opencl: cannot open %s: %s", path,
                            why != NULL ? why : "unknown reason");
        return false;
    }
#endif
    for (i = 0; i < count; i++) {
        void *sym;
#if defined(_WIN32)
        FARPROC proc = GetProcAddress((HMODULE)rt->lib, tb__cl_symbols[i]);
        memcpy(&sym, &proc, sizeof sym);
#else
        sym = dlsym(rt->lib, tb__cl_symbols[i]);
#endif
        if (sym == NULL) {
            tb__ocl_unavailable(rt, TB_ERR_UNAVAILABLE, "opencl: %s does not export %s", path,
                                tb__cl_symbols[i]);
            return false;
        }
        memcpy((char *)&rt->api + i * sizeof(void *), &sym, sizeof sym);
    }
    return true;
#endif
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

static void tb__ocl_fill_device(tb__ocl_runtime *rt, tb__ocl_device *dev) {
    tb_device_info *info = &dev->info;
    uint64_t type = tb__ocl_info_u64(rt, dev->id, TB__CL_DEVICE_TYPE);
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
    dev->max_alloc = info->max_allocation;
    if (dev->max_alloc == 0) dev->max_alloc = (uint64_t)128 << 20; /* the spec's minimum */
    dev->correct_divide_sqrt = (tb__ocl_info_u64(rt, dev->id, TB__CL_DEVICE_SINGLE_FP_CONFIG) &
                                TB__CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
    /* Division and square root as the reference computes them (correctly rounded), no
       contraction of a * b + c (the kernels say FP_CONTRACT OFF). */
    snprintf(dev->build_options, sizeof dev->build_options, "%s%s%s%s",
             tb__ocl_c_version(info->language_version) >= 102 ? "-cl-std=CL1.2" : "",
             dev->correct_divide_sqrt ? " -cl-fp32-correctly-rounded-divide-sqrt" : "",
             tb__getenv("TB_OPENCL_BUILD_OPTIONS") != NULL ? " " : "",
             tb__getenv("TB_OPENCL_BUILD_OPTIONS") != NULL ? tb__getenv("TB_OPENCL_BUILD_OPTIONS")
                                                           : "");
    dev->cache_limit = info->global_memory / 4;
    if (dev->cache_limit < ((uint64_t)64 << 20)) dev->cache_limit = (uint64_t)64 << 20;
    if (dev->cache_limit > ((uint64_t)4 << 30)) dev->cache_limit = (uint64_t)4 << 30;
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
    tb__ocl_runtime *rt = tb__ocl_current;
    if (rt != NULL) return rt;
    rt = (tb__ocl_runtime *)tb__calloc(1, sizeof *rt);
    if (rt == NULL) return NULL;
    rt->refcount = 1;
    rt->status = TB_OK;
    if (tb__ocl_load_library(rt)) tb__ocl_enumerate(rt);
    if (rt->status == TB_ERR_OUT_OF_MEMORY) {
        tb__error(rt->status, "%s", rt->reason);
        tb__ocl_runtime_destroy(rt);
        return NULL;
    }
    if (rt->status != TB_OK) tb_log_message(TB_LOG_INFO, "%s", rt->reason);
    tb__ocl_current = rt;
    return rt;
}

/* The device of an ordinal, with its context and queue created. Call with the mutex held. */
static tb__ocl_device *tb__ocl_device_get(int32_t ordinal, const char *func) {
    tb__ocl_runtime *rt = tb__ocl_runtime_get();
    tb__ocl_device *dev;
    tb__cl_int err = TB__CL_SUCCESS;
    if (rt == NULL) return NULL;
    if (rt->status != TB_OK) {
        tb__error(rt->status, "%s", rt->reason);
        return NULL;
    }
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

/* ---- the caching allocator ---- */

/* Small requests round up to 256 bytes; from 1 MiB on, to a quarter of the enclosing power of
   two (at most 25% slack), so that buffers of similar sizes are reused. */
static size_t tb__ocl_size_class(size_t size) {
    size_t p = 1, step;
    if (size <= 256) return 256;
    if (size <= ((size_t)1 << 20)) return (size + 255) & ~(size_t)255;
    while (p <= size / 2)
        p <<= 1; /* the largest power of two <= size */
    step = p / 4;
    if (size > SIZE_MAX - step) return size;
    return (size + step - 1) / step * step;
}

static void tb__ocl_metric(tb__ocl_device *dev, const char *name, int64_t delta) {
    if (!dev->rt->exited) tb__metric_count(name, delta);
}

static void tb__ocl_buffer_destroy(tb__ocl_buffer *buf) {
    tb__ocl_runtime *rt = buf->dev->rt;
    if (buf->mem != NULL) TB__OCL_CALL(rt, ReleaseMemObject)(buf->mem);
    tb__free(buf);
    tb__ocl_runtime_unref(rt);
}

/* Releases cached buffers, oldest first, until at most `keep` bytes stay cached. */
static void tb__ocl_cache_trim(tb__ocl_device *dev, uint64_t keep) {
    size_t i = 0, n;
    if (dev->cached_bytes <= keep) return;
    while (i < dev->cache_count && dev->cached_bytes > keep) {
        tb__ocl_buffer *buf = dev->cache[i++];
        dev->cached_bytes -= buf->cap;
        tb__ocl_metric(dev, "OpenCL::BytesCached", -(int64_t)buf->cap);
        tb__ocl_buffer_destroy(buf);
    }
    n = dev->cache_count - i;
    memmove(dev->cache, dev->cache + i, n * sizeof *dev->cache);
    dev->cache_count = n;
}

/* A buffer of at least `size` bytes. Call with the mutex held and the device ready. */
static tb_status tb__ocl_buffer_alloc(tb__ocl_device *dev, size_t size, tb__ocl_buffer **out) {
    tb__ocl_runtime *rt = dev->rt;
    size_t cap = tb__ocl_size_class(size), i;
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
        if (dev->cache[i]->cap == cap) {
            buf = dev->cache[i];
            memmove(dev->cache + i, dev->cache + i + 1,
                    (dev->cache_count - i - 1) * sizeof *dev->cache);
            dev->cache_count--;
            dev->cached_bytes -= cap;
            dev->buffers_reused++;
            buf->size = size;
            dev->bytes_in_use += cap;
            if (dev->bytes_in_use > dev->peak_bytes) dev->peak_bytes = dev->bytes_in_use;
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
                         (unsigned long long)dev->bytes_in_use,
                         (unsigned long long)dev->info.global_memory);
    }
    buf->dev = dev;
    buf->mem = mem;
    buf->size = size;
    buf->cap = cap;
    rt->refcount++;
    dev->buffers_created++;
    dev->bytes_in_use += cap;
    if (dev->bytes_in_use > dev->peak_bytes) dev->peak_bytes = dev->bytes_in_use;
    tb__ocl_metric(dev, "OpenCL::BytesInUse", (int64_t)cap);
    tb__ocl_metric(dev, "OpenCL::BufferCreate", 1);
    *out = buf;
    return TB_OK;
}

/* Gives a buffer back: cached for reuse while the cache has room, else released. Work already
   enqueued on the device's in-order queue that uses it still runs before any reuse. */
static void tb__ocl_buffer_free(tb__ocl_buffer *buf) {
    tb__ocl_device *dev;
    if (buf == NULL) return;
    dev = buf->dev;
    if (buf->mem == NULL) {
        tb__ocl_buffer_destroy(buf);
        return;
    }
    dev->bytes_in_use -= buf->cap;
    tb__ocl_metric(dev, "OpenCL::BytesInUse", -(int64_t)buf->cap);
    if (dev->rt->exited || (uint64_t)buf->cap > dev->cache_limit ||
        tb__grow((void **)&dev->cache, &dev->cache_cap, dev->cache_count + 1, sizeof *dev->cache) !=
            TB_OK) {
        tb__ocl_buffer_destroy(buf);
        return;
    }
    dev->cache[dev->cache_count++] = buf;
    dev->cached_bytes += buf->cap;
    tb__ocl_metric(dev, "OpenCL::BytesCached", (int64_t)buf->cap);
    tb__ocl_cache_trim(dev, dev->cache_limit);
}

/* ---- transfers ---- */

static tb_status tb__ocl_write(tb__ocl_device *dev, tb__ocl_buffer *buf, const void *host,
                               size_t size) {
    tb__ocl_runtime *rt = dev->rt;
    tb__cl_int err = TB__CL_SUCCESS;
    if (size == 0) return TB_OK;
    if (dev->info.unified_memory) {
        void *p = TB__OCL_CALL(rt, EnqueueMapBuffer)(
            dev->queue, buf->mem, TB__CL_TRUE, TB__CL_MAP_WRITE, 0, size, 0, NULL, NULL, &err);
        if (p != NULL && err == TB__CL_SUCCESS) {
            memcpy(p, host, size);
            err = TB__OCL_CALL(rt, EnqueueUnmapMemObject)(dev->queue, buf->mem, p, 0, NULL, NULL);
            if (err == TB__CL_SUCCESS) return TB_OK;
        }
        /* fall through to an explicit write */
    }
    err = TB__OCL_CALL(rt, EnqueueWriteBuffer)(dev->queue, buf->mem, TB__CL_TRUE, 0, size, host, 0,
                                               NULL, NULL);
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
        void *p = TB__OCL_CALL(rt, EnqueueMapBuffer)(dev->queue, buf->mem, TB__CL_TRUE,
                                                     TB__CL_MAP_READ, 0, size, 0, NULL, NULL, &err);
        if (p != NULL && err == TB__CL_SUCCESS) {
            memcpy(host, p, size);
            err = TB__OCL_CALL(rt, EnqueueUnmapMemObject)(dev->queue, buf->mem, p, 0, NULL, NULL);
            if (err == TB__CL_SUCCESS) return TB_OK;
        }
    }
    err = TB__OCL_CALL(rt, EnqueueReadBuffer)(dev->queue, buf->mem, TB__CL_TRUE, 0, size, host, 0,
                                              NULL, NULL);
    if (err != TB__CL_SUCCESS) {
        return tb__error(TB_ERR_EXECUTE,
                         "opencl:%d: reading %zu bytes from the device failed: %s (%d)",
                         (int)dev->ordinal, size, tb__cl_error_name(err), (int)err);
    }
    return TB_OK;
}

/* A scalar's value as the bytes of its dtype, converted as the reference backend converts
   it (tb__scalar_store: NaN and out-of-range values are defined, never a C cast's undefined
   behaviour), so that a kernel sees the value the cpu backend computes with. */
static void tb__ocl_scalar_bytes(tb_dtype dtype, tb_scalar s, unsigned char out[8]) {
    memset(out, 0, 8);
    tb__scalar_store(s, dtype, out);
}

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
            const tb__ocl_device *d = &rt->devices[i];
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
                           (unsigned long long)d->program_builds);
            tb__str_append(&s, "  OpenCL::DiskCacheHit: %llu\n", (unsigned long long)d->disk_hits);
            tb__str_append(&s, "  OpenCL::DiskCacheMiss: %llu\n",
                           (unsigned long long)d->disk_misses);
            tb__str_append(&s, "  OpenCL::DiskCacheRejected: %llu\n",
                           (unsigned long long)d->disk_rejected);
            tb__str_append(&s, "  OpenCL::KernelLaunch: %llu\n",
                           (unsigned long long)d->kernels_launched);
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
    tb__mutex_lock(&tb__ocl_mutex);
    dev = tb__ocl_device_get(data->device.ordinal, "opencl");
    if (dev == NULL) {
        tb__mutex_unlock(&tb__ocl_mutex);
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    }
    st = tb__ocl_buffer_alloc(dev, size, &buf);
    if (st == TB_OK) {
        st = tb__ocl_write(dev, buf, host, size);
        if (st != TB_OK) {
            tb__ocl_buffer_free(buf);
            buf = NULL;
        }
    }
    tb__mutex_unlock(&tb__ocl_mutex);
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
    dev->rt->refcount++;
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
    tb__mutex_lock(&tb__ocl_mutex);
    if (buf->dev->rt->exited) {
        st = tb__error(TB_ERR_STATE, "opencl: the backend was shut down");
    } else {
        st = tb__ocl_read(buf->dev, buf, host, size);
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

static void tb__ocl_data_release(void *user_data, tb_backend_data *data) {
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    tb__ocl_buffer_free((tb__ocl_buffer *)data->payload);
    tb__mutex_unlock(&tb__ocl_mutex);
    data->payload = NULL;
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

/* ===========================================================================================
   Lowering: the graph is partitioned into kernels. Every node is either materialised (a
   parameter, or the output of a kernel: a "root") or inlined into the one kernel that uses it.
   Inlined nodes are evaluated at a position: an affine map from the kernel's index variables to
   the node's element (a flat offset and/or one affine form per dim). Movement ops transform
   positions, so they never copy; an input is read at offset + sum(var * stride).
   =========================================================================================== */

enum {
    TB__OCL_K_ELEMENTWISE,
    TB__OCL_K_REDUCE,
    TB__OCL_K_MATMUL,
    TB__OCL_K_NORM,
    TB__OCL_K_PARTIAL, /* first stage of a split reduction: partial results per chunk */
    TB__OCL_K_PACK_A,  /* a matmul's left operand copied into row panels (CPU devices) */
    TB__OCL_K_PACK_B   /* a matmul's right operand copied into column panels (CPU devices) */
};
/* the context of a view that every kernel reading it evaluates itself */
#define TB__OCL_CTX_ANY (-3)
enum { TB__OCL_SLOT_PARAM, TB__OCL_SLOT_RESULT, TB__OCL_SLOT_TEMP };
enum { TB__OCL_ARG_OUT, TB__OCL_ARG_BUF, TB__OCL_ARG_SCALAR, TB__OCL_ARG_ERR, TB__OCL_ARG_TABLE };

/* Graphs with more scalar parameters than this pass them in a table (one small buffer written
   before the kernels) rather than as kernel arguments: devices may accept as little as 1024
   bytes of arguments per kernel. */
#define TB__OCL_MAX_SCALAR_ARGS 16

typedef struct tb__ocl_arg {
    int32_t kind;
    int32_t index; /* a slot for buffers, a parameter for scalars */
} tb__ocl_arg;

typedef struct tb__ocl_kernel {
    int32_t kind;
    int32_t root, core; /* node indices (lowering only); core -1 for elementwise kernels */
    int32_t owner; /* the kernel whose nodes it evaluates: itself, or the kernel it is a stage of
                      (the final stage of a split reduction, a matmul reading panels) */
    int32_t split; /* a split reduction's chunk count (both stages), else 0 */
    int32_t partial_slot; /* the final stage: the partial results it reads */
    bool packed;          /* a matmul reading its operands from the two pack kernels before it */
    int32_t pack_slot[2]; /* those kernels' outputs */
    int32_t out_slot;
    char name[64];
    tb__ocl_arg *args;
    size_t num_args, cap_args;
    /* launch: `items` work items along dim 0 (E kernels, and reductions with one item per
       output), or fixed local sizes and group counts (group_size[0] > 0) */
    uint32_t work_dim;
    uint64_t items;
    size_t group_size[3];
    size_t groups[3];
    double flops, bytes;
} tb__ocl_kernel;

typedef struct tb__ocl_slot {
    int32_t kind;
    int32_t index; /* parameter or result index */
    tb_shape shape;
    int32_t last_use; /* last kernel reading or writing it */
} tb__ocl_slot;

/* Where a run-time error flag came from (out-of-range gather index, negative integer power). */
typedef struct tb__ocl_errsite {
    tb_op op;
    int32_t dim;
    int64_t size;
} tb__ocl_errsite;

/* A lowered graph: what compile and execute need; no node pointers. */
typedef struct tb__ocl_plan {
    int32_t ordinal;
    uint64_t graph_hash;
    size_t num_params, num_results;
    int32_t *param_scalar; /* 1: passed by value (SCALAR); 0: a buffer */
    tb_dtype *param_dtype;
    int32_t *result_slot;   /* per result: the slot holding it */
    int32_t *result_source; /* per result: -1, or an earlier result it duplicates */
    tb__ocl_slot *slots;
    size_t num_slots;
    tb__ocl_kernel *kernels;
    size_t num_kernels, cap_kernels;
    tb__ocl_errsite *errsites;
    size_t num_errsites;
    bool scalar_table; /* scalars in a table buffer (8 bytes each, by parameter index) */
    char *source;
    size_t source_len;
    /* compile */
    tb__ocl_runtime *rt;
    tb__ocl_program *program;
    tb__cl_kernel *cl;
    size_t *local; /* per kernel: work-group size for item-launched kernels */
    /* per graph node (post-order): the kernel computing it, -1 for none (get_node_kernel) */
    int32_t *node_kernel;
    size_t num_nodes;
} tb__ocl_plan;

typedef struct tb__ocl_ninfo {
    const tb_node *node;
    int32_t first_operand; /* into tb__ocl_lower.operands */
    int32_t first_user;    /* into tb__ocl_lower.users */
    int32_t num_users;     /* distinct users */
    int32_t uses;          /* operand slots that name it */
    int32_t param, result, slot;
    int32_t ctx; /* the kernel evaluating it (its own kernel when it is a root) */
    bool root, ident, in_mm, force_root;
} tb__ocl_ninfo;

typedef struct tb__ocl_lower {
    const tb_graph *graph;
    tb__ocl_device *dev;
    size_t n;
    tb__ocl_ninfo *info;
    int32_t *operands;
    int32_t *users;
    /* node pointer -> index */
    const tb_node **map_keys;
    int32_t *map_vals;
    size_t map_cap;
    tb__ocl_plan *plan;
    bool restart;
} tb__ocl_lower;

static void tb__ocl_plan_free(tb__ocl_plan *p) {
    size_t i;
    if (p == NULL) return;
    for (i = 0; i < p->num_kernels; i++)
        tb__free(p->kernels[i].args);
    tb__free(p->kernels);
    tb__free(p->slots);
    tb__free(p->param_scalar);
    tb__free(p->param_dtype);
    tb__free(p->result_slot);
    tb__free(p->result_source);
    tb__free(p->errsites);
    tb__free(p->source);
    tb__free(p->local);
    tb__free(p->node_kernel);
    tb__free(p);
}

static const char *tb__ocl_ctype(tb_dtype dtype) {
    switch (dtype) {
    case TB_F32:
        return "float";
    case TB_F64:
        return "double";
    case TB_I32:
        return "int";
    case TB_I64:
        return "long";
    default:
        return "uchar"; /* u8 and bool (0 or 1) */
    }
}

/* The unsigned type integer arithmetic wraps in. */
static const char *tb__ocl_utype(tb_dtype dtype) {
    switch (dtype) {
    case TB_I32:
        return "uint";
    case TB_I64:
        return "ulong";
    default:
        return "uint";
    }
}

static bool tb__ocl_same_dims(const tb_shape *a, const tb_shape *b) {
    int32_t i;
    if (a->rank != b->rank) return false;
    for (i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

static int64_t tb__ocl_numel(const tb_shape *s) {
    int64_t n = 1;
    int32_t i;
    for (i = 0; i < s->rank; i++)
        n *= s->dims[i];
    return n;
}

static const tb_custom_op_desc *tb__ocl_custom(tb_op op) {
    return op >= TB_OP_BUILTIN_COUNT ? tb_op_custom_desc(op) : NULL;
}

/* Elementwise ops: their operands are read at the same (broadcast) position. */
static bool tb__ocl_is_elementwise(tb_op op) {
    tb_op_kind kind = tb_op_get_kind(op);
    if (kind == TB_KIND_UNARY || kind == TB_KIND_BINARY || kind == TB_KIND_TERNARY) return true;
    if (kind == TB_KIND_CUSTOM) {
        const tb_custom_op_desc *d = tb__ocl_custom(op);
        return d != NULL && d->opencl_expr != NULL && d->infer_shape == NULL;
    }
    return false;
}

/* Ops computed where they are used. */
static bool tb__ocl_is_inlinable(tb_op op) {
    tb_op_kind kind = tb_op_get_kind(op);
    if (tb__ocl_is_elementwise(op)) return true;
    if (kind == TB_KIND_MOVEMENT || kind == TB_KIND_OTHER) return true;
    return op == TB_OP_ARANGE || op == TB_OP_EYE || op == TB_OP_RAND || op == TB_OP_RANDN;
}

/* Ops a matmul tile loader may read through without a copy (index arithmetic only). */
static bool tb__ocl_is_view_like(tb_op op) {
    return tb_op_get_kind(op) == TB_KIND_MOVEMENT || op == TB_OP_CAST;
}

static int32_t tb__ocl_core_kind(tb_op op) {
    switch (tb_op_get_kind(op)) {
    case TB_KIND_REDUCE:
        return TB__OCL_K_REDUCE;
    case TB_KIND_MATMUL:
        return TB__OCL_K_MATMUL;
    case TB_KIND_NORM:
        return TB__OCL_K_NORM;
    default:
        return -1;
    }
}

static size_t tb__ocl_ptr_hash(const void *p, size_t cap) {
    uint64_t h = tb__hash_u64(0x6f70656e636c6d61ull, (uint64_t)(uintptr_t)p);
    return (size_t)(h & (uint64_t)(cap - 1));
}

static int32_t tb__ocl_index_of(const tb__ocl_lower *L, const tb_node *node) {
    size_t i = tb__ocl_ptr_hash(node, L->map_cap);
    while (L->map_keys[i] != NULL) {
        if (L->map_keys[i] == node) return L->map_vals[i];
        i = (i + 1) & (L->map_cap - 1);
    }
    return -1;
}

/* Node table, operand and user lists, parameters and results. */
static tb_status tb__ocl_lower_init(tb__ocl_lower *L) {
    const tb_graph *g = L->graph;
    size_t i, k, total_ops = 0;
    int32_t *fill;
    L->n = g->num_nodes;
    L->info = (tb__ocl_ninfo *)tb__calloc(L->n + 1, sizeof *L->info);
    L->map_cap = 16;
    while (L->map_cap < 2 * L->n + 2)
        L->map_cap *= 2;
    L->map_keys = (const tb_node **)tb__calloc(L->map_cap, sizeof *L->map_keys);
    L->map_vals = (int32_t *)tb__calloc(L->map_cap, sizeof *L->map_vals);
    if (L->info == NULL || L->map_keys == NULL || L->map_vals == NULL) return TB_ERR_OUT_OF_MEMORY;
    if (L->n > (size_t)INT32_MAX / 2) {
        return tb__error(TB_ERR_UNSUPPORTED, "opencl: a graph of %zu nodes is too large", L->n);
    }
    for (i = 0; i < L->n; i++) {
        const tb_node *node = g->nodes[i];
        size_t h = tb__ocl_ptr_hash(node, L->map_cap);
        while (L->map_keys[h] != NULL)
            h = (h + 1) & (L->map_cap - 1);
        L->map_keys[h] = node;
        L->map_vals[h] = (int32_t)i;
        L->info[i].node = node;
        L->info[i].param = -1;
        L->info[i].result = -1;
        L->info[i].slot = -1;
        L->info[i].ctx = -1;
        total_ops += node->num_operands;
    }
    L->operands = (int32_t *)tb__calloc(total_ops + 1, sizeof *L->operands);
    L->users = (int32_t *)tb__calloc(total_ops + 1, sizeof *L->users);
    fill = (int32_t *)tb__calloc(L->n + 1, sizeof *fill);
    if (L->operands == NULL || L->users == NULL || fill == NULL) {
        tb__free(fill);
        return TB_ERR_OUT_OF_MEMORY;
    }
    for (i = 0; i < g->num_parameters; i++) {
        int32_t p = tb__ocl_index_of(L, g->parameters[i]);
        if (p < 0) {
            tb__free(fill);
            return tb__error(TB_ERR_INTERNAL, "opencl: parameter %zu is not in the graph", i);
        }
        L->info[p].param = (int32_t)i;
    }
    for (i = 0; i < g->num_results; i++) {
        int32_t r = tb__ocl_index_of(L, g->results[i]);
        if (r < 0) {
            tb__free(fill);
            return tb__error(TB_ERR_INTERNAL, "opencl: result %zu is not in the graph", i);
        }
        if (L->info[r].result < 0) L->info[r].result = (int32_t)i;
    }
    /* operands (parameters are leaves: their operands are not part of this graph's work) */
    total_ops = 0;
    for (i = 0; i < L->n; i++) {
        const tb_node *node = L->info[i].node;
        L->info[i].first_operand = (int32_t)total_ops;
        if (L->info[i].param >= 0) continue;
        for (k = 0; k < node->num_operands; k++) {
            int32_t o = tb__ocl_index_of(L, node->operands[k]);
            if (o < 0 || (size_t)o >= i) {
                tb__free(fill);
                return tb__error(TB_ERR_INTERNAL,
                                 "opencl: the graph is not in post-order (node %zu, operand %zu)",
                                 i, k);
            }
            L->operands[total_ops++] = o;
            L->info[o].uses++;
        }
    }
    /* distinct users, grouped per node */
    for (i = 0; i < L->n; i++) {
        const tb_node *node = L->info[i].node;
        if (L->info[i].param >= 0) continue;
        for (k = 0; k < node->num_operands; k++) {
            int32_t o = L->operands[L->info[i].first_operand + (int32_t)k];
            size_t j;
            bool seen = false;
            for (j = 0; j < k; j++)
                seen = seen || L->operands[L->info[i].first_operand + (int32_t)j] == o;
            if (!seen) L->info[o].num_users++;
        }
    }
    {
        int32_t at = 0;
        for (i = 0; i < L->n; i++) {
            L->info[i].first_user = at;
            at += L->info[i].num_users;
        }
    }
    for (i = 0; i < L->n; i++) {
        const tb_node *node = L->info[i].node;
        if (L->info[i].param >= 0) continue;
        for (k = 0; k < node->num_operands; k++) {
            int32_t o = L->operands[L->info[i].first_operand + (int32_t)k];
            size_t j;
            bool seen = false;
            for (j = 0; j < k; j++)
                seen = seen || L->operands[L->info[i].first_operand + (int32_t)j] == o;
            if (!seen) L->users[L->info[o].first_user + fill[o]++] = (int32_t)i;
        }
    }
    tb__free(fill);
    return TB_OK;
}

static int32_t tb__ocl_operand(const tb__ocl_lower *L, int32_t node, size_t k) {
    return L->operands[L->info[node].first_operand + (int32_t)k];
}

static tb_status tb__ocl_add_kernel(tb__ocl_lower *L, int32_t kind, int32_t root, int32_t core,
                                    int32_t *out) {
    tb__ocl_plan *p = L->plan;
    tb__ocl_kernel *k;
    if (tb__grow((void **)&p->kernels, &p->cap_kernels, p->num_kernels + 1,
                 sizeof(tb__ocl_kernel)) != TB_OK)
        return TB_ERR_OUT_OF_MEMORY;
    k = &p->kernels[p->num_kernels];
    memset(k, 0, sizeof *k);
    k->kind = kind;
    k->root = root;
    k->core = core;
    k->out_slot = -1;
    *out = (int32_t)p->num_kernels++;
    return TB_OK;
}

/* Orders kernels by their roots (producers first) and renumbers the contexts. */
static tb_status tb__ocl_sort_kernels(tb__ocl_lower *L) {
    tb__ocl_plan *p = L->plan;
    size_t nk = p->num_kernels, i, j;
    int32_t *remap;
    tb__ocl_kernel *sorted;
    if (nk == 0) return TB_OK;
    remap = (int32_t *)tb__calloc(nk, sizeof *remap);
    sorted = (tb__ocl_kernel *)tb__calloc(nk, sizeof *sorted);
    if (remap == NULL || sorted == NULL) {
        tb__free(remap);
        tb__free(sorted);
        return TB_ERR_OUT_OF_MEMORY;
    }
    /* kernels were made from the last node to the first: reversing sorts them by root */
    for (i = 0; i < nk; i++) {
        j = nk - 1 - i;
        sorted[i] = p->kernels[j];
        remap[j] = (int32_t)i;
    }
    for (i = 1; i < nk; i++) {
        if (sorted[i - 1].root >= sorted[i].root) {
            tb__free(remap);
            tb__free(sorted);
            return tb__error(TB_ERR_INTERNAL, "opencl: kernels out of order");
        }
    }
    memcpy(p->kernels, sorted, nk * sizeof *sorted);
    for (i = 0; i < L->n; i++)
        if (L->info[i].ctx >= 0) L->info[i].ctx = remap[L->info[i].ctx];
    tb__free(remap);
    tb__free(sorted);
    return TB_OK;
}

/* Code generation as for a GPU whatever the device (a test hook: the GPU variants of matmul
   and of the reductions then run on a CPU device too). */
static int tb__ocl_codegen_as_gpu = 0;

static bool tb__ocl_codegen_cpu(const tb__ocl_device *dev) {
    return dev->info.device.type == TB_DEVICE_CPU && !tb__ocl_codegen_as_gpu;
}

static bool tb__ocl_fast_f64(const tb__ocl_device *dev) {
    return dev->info.supports_f64 && dev->info.device.type == TB_DEVICE_CPU;
}

/* The reduced element count and output count of a reduction node. */
static void tb__ocl_reduce_sizes(const tb__ocl_lower *L, int32_t core, int64_t *n_out, int64_t *m) {
    const tb_node *c = L->info[core].node;
    const tb_shape *xs = &L->info[tb__ocl_operand(L, core, 0)].node->shape;
    *n_out = tb__ocl_numel(&c->shape);
    *m = *n_out > 0 ? tb__ocl_numel(xs) / *n_out : 0;
}

/* The dtype a reduction accumulates in (the partial results of a split reduction). */
static tb_dtype tb__ocl_reduce_acc_dtype(const tb__ocl_lower *L, int32_t core) {
    const tb_node *c = L->info[core].node;
    tb_dtype od = c->shape.dtype;
    if (c->op == TB_OP_MAX || c->op == TB_OP_MIN)
        return L->info[tb__ocl_operand(L, core, 0)].node->shape.dtype;
    if (tb_dtype_is_float(od)) return od == TB_F32 && tb__ocl_fast_f64(L->dev) ? TB_F64 : od;
    return od == TB_I64 ? TB_I64 : TB_I32; /* the wrapping ulong / uint accumulators */
}

/* How many chunks a reduction with few outputs over many elements is split into, so that
   every compute unit gets work; 1: not split. */
static int64_t tb__ocl_split_count(const tb__ocl_device *dev, int64_t n_out, int64_t m) {
    int64_t want = (int64_t)dev->info.compute_units * (tb__ocl_codegen_cpu(dev) ? 64 : 16);
    int64_t chunks;
    if (n_out <= 0 || m < 16384 || n_out >= want) return 1;
    chunks = (want + n_out - 1) / n_out;
    if (chunks > m / 4096) chunks = m / 4096;
    if (chunks > 1024) chunks = 1024;
    return chunks >= 2 ? chunks : 1;
}

/* Splits reductions with few outputs into a partial stage (chunks of each row in parallel)
   and a final stage (combines the chunks, then the epilogue). */
static tb_status tb__ocl_split_reductions(tb__ocl_lower *L) {
    tb__ocl_plan *p = L->plan;
    size_t i, j;
    for (i = 0; i < p->num_kernels; i++)
        p->kernels[i].owner = (int32_t)i;
    for (i = 0; i < p->num_kernels; i++) {
        tb__ocl_kernel *k = &p->kernels[i];
        const tb_node *c;
        int64_t n_out, m, chunks;
        if (k->kind != TB__OCL_K_REDUCE) continue;
        c = L->info[k->core].node;
        if (c->op == TB_OP_ARGMAX || c->op == TB_OP_ARGMIN) continue;
        tb__ocl_reduce_sizes(L, k->core, &n_out, &m);
        chunks = tb__ocl_split_count(L->dev, n_out, m);
        if (chunks <= 1) continue;
        if (tb__grow((void **)&p->kernels, &p->cap_kernels, p->num_kernels + 1,
                     sizeof(tb__ocl_kernel)) != TB_OK)
            return TB_ERR_OUT_OF_MEMORY;
        memmove(&p->kernels[i + 1], &p->kernels[i], (p->num_kernels - i) * sizeof(tb__ocl_kernel));
        p->num_kernels++;
        memset(&p->kernels[i], 0, sizeof(tb__ocl_kernel));
        p->kernels[i].kind = TB__OCL_K_PARTIAL;
        p->kernels[i].root = p->kernels[i + 1].root;
        p->kernels[i].core = p->kernels[i + 1].core;
        p->kernels[i].split = (int32_t)chunks;
        p->kernels[i].out_slot = -1;
        p->kernels[i + 1].split = (int32_t)chunks;
        for (j = 0; j < L->n; j++)
            if (L->info[j].ctx >= (int32_t)i) L->info[j].ctx++;
        for (j = i + 1; j < p->num_kernels; j++)
            p->kernels[j].owner = (int32_t)j;
        p->kernels[i].owner = (int32_t)i + 1;
        i++;
    }
    return TB_OK;
}

/* Matmuls on CPU devices read panels: rows of A, TB__OCL_MM_ROWS at a time, and columns of B,
   one vector width at a time, each laid out contiguously along K. The panels keep the inner
   loop on consecutive addresses (row strides of a power of two otherwise map every row to the
   same cache sets) and evaluate fused producers of the operands once. */
#define TB__OCL_MM_ROWS      16
#define TB__OCL_PACK_GROUP_K 8 /* work-group of a pack kernel: vector width x this */

/* A matmul core's sizes: batch (the product of the leading dims), M, N and K. */
typedef struct tb__ocl_mm {
    int64_t batch, m, n, k;
} tb__ocl_mm;

static tb__ocl_mm tb__ocl_mm_of(const tb__ocl_lower *L, int32_t core) {
    const tb_shape *cs = &L->info[core].node->shape;
    const tb_shape *as = &L->info[tb__ocl_operand(L, core, 0)].node->shape;
    tb__ocl_mm mm;
    int32_t d;
    mm.batch = 1;
    for (d = 0; d + 2 < cs->rank; d++)
        mm.batch *= cs->dims[d];
    mm.m = cs->dims[cs->rank - 2];
    mm.n = cs->dims[cs->rank - 1];
    mm.k = as->dims[as->rank - 1];
    return mm;
}

static int64_t tb__ocl_mm_width(tb_dtype dtype) {
    return dtype == TB_F64 ? 8 : 16;
}

/* Whether a matmul kernel is worth packing: a float matmul with some work in it. */
static bool tb__ocl_mm_packs(const tb__ocl_lower *L, const tb__ocl_kernel *k) {
    const tb_node *c = L->info[k->core].node;
    const tb_shape *cs = &c->shape;
    int32_t r = cs->rank;
    tb_dtype od = cs->dtype;
    const tb_shape *as = &L->info[tb__ocl_operand(L, k->core, 0)].node->shape;
    const tb_shape *bs = &L->info[tb__ocl_operand(L, k->core, 1)].node->shape;
    tb__ocl_mm mm = tb__ocl_mm_of(L, k->core);
    int64_t M = mm.m, N = mm.n, K = mm.k;
    if (!tb__ocl_codegen_cpu(L->dev) || (od != TB_F32 && od != TB_F64)) return false;
    if (as->dtype != od || bs->dtype != od || as->rank != r || bs->rank != r) return false;
    if (od == TB_F64 && !L->dev->info.supports_f64) return false;
    if (M < 4 || N < 16 || K < 16 || (double)M * (double)N * (double)K < 262144.0) return false;
    {
        /* the panels of the bigger operand (batch included) within half the device's largest
           allocation */
        double elems = (double)(M > N ? M + TB__OCL_MM_ROWS : N + 16) * (double)K;
        elems *= (double)mm.batch;
        if (L->dev->info.max_allocation > 0 &&
            elems * (double)tb_dtype_size(od) > (double)L->dev->info.max_allocation / 2)
            return false;
    }
    return true;
}

/* Puts the two pack kernels in front of every matmul kernel that packs. */
static tb_status tb__ocl_pack_matmuls(tb__ocl_lower *L) {
    tb__ocl_plan *p = L->plan;
    size_t i, j;
    for (i = 0; i < p->num_kernels; i++) {
        tb__ocl_kernel *k = &p->kernels[i];
        if (k->kind != TB__OCL_K_MATMUL || !tb__ocl_mm_packs(L, k)) continue;
        if (tb__grow((void **)&p->kernels, &p->cap_kernels, p->num_kernels + 2,
                     sizeof(tb__ocl_kernel)) != TB_OK)
            return TB_ERR_OUT_OF_MEMORY;
        memmove(&p->kernels[i + 2], &p->kernels[i], (p->num_kernels - i) * sizeof(tb__ocl_kernel));
        p->num_kernels += 2;
        for (j = 0; j < L->n; j++)
            if (L->info[j].ctx >= (int32_t)i) L->info[j].ctx += 2;
        for (j = 0; j < p->num_kernels; j++)
            if ((j < i || j >= i + 2) && p->kernels[j].owner >= (int32_t)i)
                p->kernels[j].owner += 2;
        for (j = 0; j < 2; j++) {
            tb__ocl_kernel *pk = &p->kernels[i + j];
            memset(pk, 0, sizeof *pk);
            pk->kind = j == 0 ? TB__OCL_K_PACK_A : TB__OCL_K_PACK_B;
            pk->root = p->kernels[i + 2].root;
            pk->core = p->kernels[i + 2].core;
            pk->owner = (int32_t)i + 2;
            pk->out_slot = -1;
        }
        p->kernels[i + 2].packed = true;
        i += 2;
    }
    return TB_OK;
}

/* Roots and contexts. Users come before their operands (reverse post-order), so a node knows
   the kernels of all its users when its turn comes: it is inlined when they all share one
   kernel (and, under a matmul, when it is index arithmetic), else it becomes a root. A
   reduction, matmul or norm whose only user is an elementwise node evaluated at the kernel's
   output position becomes that kernel's core, and the elementwise nodes above it its
   epilogue. */
static tb_status tb__ocl_partition(tb__ocl_lower *L) {
    tb__ocl_plan *p = L->plan;
    int32_t i, k;
    size_t j;
    tb_status st;
    for (j = 0; j < p->num_kernels; j++)
        tb__free(p->kernels[j].args);
    p->num_kernels = 0;
    for (j = 0; j < L->n; j++) {
        L->info[j].root = false;
        L->info[j].ident = false;
        L->info[j].in_mm = false;
        L->info[j].ctx = -1;
        L->info[j].slot = -1;
    }
    for (i = (int32_t)L->n - 1; i >= 0; i--) {
        tb__ocl_ninfo *in = &L->info[i];
        const tb_node *node = in->node;
        bool must_root = in->result >= 0 || in->force_root || in->num_users == 0;
        int32_t core_kind = tb__ocl_core_kind(node->op);
        if (in->param >= 0) {
            if (in->result >= 0) {
                /* a parameter returned as a result: a copy */
                st = tb__ocl_add_kernel(L, TB__OCL_K_ELEMENTWISE, i, -1, &k);
                if (st != TB_OK) return st;
                in->root = true;
                in->ctx = k;
                in->ident = true;
            }
            continue;
        }
        if (core_kind >= 0) {
            if (!must_root && in->num_users == 1 && in->uses == 1) {
                int32_t u = L->users[in->first_user];
                const tb__ocl_ninfo *ui = &L->info[u];
                if (ui->ident && ui->ctx >= 0 && p->kernels[ui->ctx].core < 0 &&
                    tb__ocl_is_elementwise(ui->node->op) &&
                    tb__ocl_same_dims(&ui->node->shape, &node->shape)) {
                    p->kernels[ui->ctx].core = i;
                    p->kernels[ui->ctx].kind = core_kind;
                    in->ctx = ui->ctx;
                    in->ident = true;
                    continue;
                }
            }
            st = tb__ocl_add_kernel(L, core_kind, i, i, &k);
            if (st != TB_OK) return st;
            in->root = true;
            in->ctx = k;
            in->ident = true;
            continue;
        }
        if (!tb__ocl_is_inlinable(node->op)) {
            const char *name = tb_op_name(node->op);
            return tb__error(TB_ERR_UNSUPPORTED, "opencl: op '%s' cannot be lowered",
                             name != NULL ? name : "?");
        }
        if (!must_root) {
            int32_t common = -2, u = -1, e;
            bool ok = true, in_mm = false, movement = tb_op_get_kind(node->op) == TB_KIND_MOVEMENT;
            for (e = 0; e < in->num_users; e++) {
                const tb__ocl_ninfo *ui;
                u = L->users[in->first_user + e];
                ui = &L->info[u];
                if (common == -2) {
                    common = ui->ctx;
                } else if (common != ui->ctx) {
                    ok = false;
                }
                if (ui->node->op == TB_OP_MATMUL || (ui->in_mm && !ui->root)) in_mm = true;
            }
            if (common < 0) ok = false;
            if (ok && in_mm && !tb__ocl_is_view_like(node->op)) ok = false;
            if (!ok && movement && (common >= 0 || common == TB__OCL_CTX_ANY)) {
                /* a view read by several kernels: each reads through it (index arithmetic),
                   whatever is below it is materialised once */
                in->ctx = TB__OCL_CTX_ANY;
                continue;
            }
            if (ok) {
                in->ctx = common;
                in->in_mm = in_mm;
                if (in->num_users == 1 && in->uses == 1) {
                    const tb__ocl_ninfo *ui = &L->info[u];
                    in->ident = ui->ident && tb__ocl_is_elementwise(ui->node->op) &&
                                tb__ocl_same_dims(&ui->node->shape, &node->shape);
                }
                continue;
            }
        }
        st = tb__ocl_add_kernel(L, TB__OCL_K_ELEMENTWISE, i, -1, &k);
        if (st != TB_OK) return st;
        in->root = true;
        in->ctx = k;
        in->ident = true;
    }
    st = tb__ocl_sort_kernels(L);
    if (st == TB_OK) st = tb__ocl_split_reductions(L);
    if (st == TB_OK) st = tb__ocl_pack_matmuls(L);
    return st;
}

static tb_status tb__ocl_add_slot(tb__ocl_plan *p, size_t *cap, int32_t kind, int32_t index,
                                  const tb_shape *shape, int32_t *out) {
    tb__ocl_slot *s;
    if (tb__grow((void **)&p->slots, cap, p->num_slots + 1, sizeof(tb__ocl_slot)) != TB_OK)
        return TB_ERR_OUT_OF_MEMORY;
    s = &p->slots[p->num_slots];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->index = index;
    s->shape = *shape;
    s->last_use = -1;
    *out = (int32_t)p->num_slots++;
    return TB_OK;
}

/* The sizes of a packing matmul: batch, rows, columns, depth, and the panel count and width
   of the operand a pack kernel copies. */
static void tb__ocl_pack_sizes(const tb__ocl_lower *L, const tb__ocl_kernel *k, bool is_a,
                               int64_t sizes[6]) {
    tb__ocl_mm mm = tb__ocl_mm_of(L, k->core);
    int64_t width = is_a ? TB__OCL_MM_ROWS : tb__ocl_mm_width(L->info[k->core].node->shape.dtype);
    int64_t len = is_a ? mm.m : mm.n;
    sizes[0] = mm.batch;
    sizes[1] = mm.m;
    sizes[2] = mm.n;
    sizes[3] = mm.k;
    sizes[4] = (len + width - 1) / width;
    sizes[5] = width;
}

static int64_t tb__ocl_pack_numel(const tb__ocl_lower *L, const tb__ocl_kernel *k) {
    int64_t z[6];
    tb__ocl_pack_sizes(L, k, k->kind == TB__OCL_K_PACK_A, z);
    return z[0] * z[4] * z[3] * z[5];
}

/* Buffers: one per array parameter and one per kernel output. */
static tb_status tb__ocl_assign_slots(tb__ocl_lower *L) {
    tb__ocl_plan *p = L->plan;
    size_t cap = 0, i;
    int32_t s;
    tb_status st;
    tb__free(p->slots);
    p->slots = NULL;
    p->num_slots = 0;
    for (i = 0; i < L->n; i++) {
        tb__ocl_ninfo *in = &L->info[i];
        if (in->param < 0 || in->node->op == TB_OP_SCALAR) continue;
        st = tb__ocl_add_slot(p, &cap, TB__OCL_SLOT_PARAM, in->param, &in->node->shape, &s);
        if (st != TB_OK) return st;
        in->slot = s;
    }
    for (i = 0; i < p->num_kernels; i++) {
        tb__ocl_kernel *k = &p->kernels[i];
        tb__ocl_ninfo *in = &L->info[k->root];
        if (k->owner != (int32_t)i) {
            /* a stage of another kernel (partial results, operand panels): a temporary only
               that kernel reads */
            tb__ocl_kernel *o = &p->kernels[k->owner];
            tb_shape ps;
            memset(&ps, 0, sizeof ps);
            ps.rank = 1;
            if (k->kind == TB__OCL_K_PARTIAL) {
                int64_t n_out, m;
                tb__ocl_reduce_sizes(L, k->core, &n_out, &m);
                ps.dtype = tb__ocl_reduce_acc_dtype(L, k->core);
                ps.dims[0] = n_out * k->split;
            } else {
                ps.dtype = L->info[k->core].node->shape.dtype;
                ps.dims[0] = tb__ocl_pack_numel(L, k);
            }
            st = tb__ocl_add_slot(p, &cap, TB__OCL_SLOT_TEMP, -1, &ps, &s);
            if (st != TB_OK) return st;
            k->out_slot = s;
            p->slots[s].last_use = k->owner;
            if (k->kind == TB__OCL_K_PARTIAL)
                o->partial_slot = s;
            else
                o->pack_slot[k->kind == TB__OCL_K_PACK_A ? 0 : 1] = s;
            continue;
        }
        if (in->result >= 0) {
            st = tb__ocl_add_slot(p, &cap, TB__OCL_SLOT_RESULT, in->result, &in->node->shape, &s);
        } else {
            st = tb__ocl_add_slot(p, &cap, TB__OCL_SLOT_TEMP, -1, &in->node->shape, &s);
        }
        if (st != TB_OK) return st;
        k->out_slot = s;
        p->slots[s].last_use = (int32_t)i;
        if (in->param < 0) in->slot = s;
    }
    for (i = 0; i < p->num_results; i++) {
        int32_t r = tb__ocl_index_of(L, L->graph->results[i]);
        size_t kk;
        p->result_slot[i] = -1;
        p->result_source[i] = -1;
        if (L->info[r].result != (int32_t)i) {
            p->result_source[i] = L->info[r].result;
            continue;
        }
        for (kk = 0; kk < p->num_kernels; kk++)
            if (p->kernels[kk].root == r && p->kernels[kk].owner == (int32_t)kk)
                p->result_slot[i] = p->kernels[kk].out_slot;
        if (p->result_slot[i] < 0)
            return tb__error(TB_ERR_INTERNAL, "opencl: result without kernel");
    }
    return TB_OK;
}

/* ---- code generation: linear forms and positions ---- */

#define TB__LF_MAX        8
#define TB__CG_BUCKETS    4096
#define TB__CG_MAX_DEPTH  64
#define TB__CG_MAX_VALUES 60000 /* values one kernel may compute before sharing is forced */

/* c + sum(coef[i] * var[i]), terms sorted by var, unused entries zero (so memcmp works). */
typedef struct tb__lf {
    int64_t c;
    int32_t n;
    int32_t var[TB__LF_MAX];
    int64_t coef[TB__LF_MAX];
} tb__lf;

/* Which element of an array of `dims` a kernel is at: its flat (row-major) offset, its index
   along each dim, or both. Interned, so equal positions share an id; the form a position was
   made with identifies it, the other is added when needed. */
typedef struct tb__pos {
    int32_t rank;
    int32_t has_flat, has_multi, key_flat;
    int64_t dims[TB_MAX_RANK];
    tb__lf flat;
    tb__lf dim[TB_MAX_RANK];
    uint64_t hash;
    int32_t next;
} tb__pos;

enum { TB__MEMO_VALUE = 1, TB__MEMO_UNRAVEL = 2 };

typedef struct tb__cg_memo {
    uint64_t key;
    int32_t kind, a, b;
    uint64_t extra;
    int32_t value;
    int32_t next;
} tb__cg_memo;

typedef struct tb__cg_undo {
    int32_t pos;
    int32_t form; /* 1: flat was added, 2: multi was added */
} tb__cg_undo;

typedef struct tb__cg_scope {
    size_t memo, undo;
} tb__cg_scope;

typedef struct tb__cg_frame {
    int32_t node, pos, state, vbase;
} tb__cg_frame;

typedef struct tb__cg_var {
    int64_t lo, hi;
} tb__cg_var;

/* Names in generated kernels: one namespace, split by form so that no two kinds can meet.
   - Numbered names are exactly one kind letter and a decimal number, and nothing else has that
     form: v<n> values and i<n> index variables (numbered by this kernel's counters), b<slot>
     buffer and s<param> scalar arguments (numbered by the plan), x<k> a custom op's operands.
     A kind's numbers are unique, and the letters differ, so numbered names never collide.
   - Every other name is a fixed word of a kernel template (out, acc, mean, row0, tb_err, ...)
     and is never one letter followed by digits, so it cannot meet a numbered name whatever
     the graph; fixed names are the same in every kernel of a kind, so a test of that kind
     shows a collision among them.
   The text of a kernel goes into one builder (body) whose failure is sticky and checked once,
   after the kernel; a helper that builds text elsewhere folds its failure into g->status. */
typedef struct tb__cg {
    tb__ocl_lower *L;
    int32_t kernel;
    tb__str body;
    int indent;
    bool fast_f64; /* f32 transcendental functions computed in double (CPU devices with fp64) */
    /* index variables i<n> (long) with their ranges */
    tb__cg_var *vars;
    size_t num_vars, cap_vars;
    /* values v<n> with their dtypes */
    tb_dtype *val_dtype;
    size_t num_vals, cap_vals;
    tb__pos *pos;
    size_t num_pos, cap_pos;
    int32_t pos_head[TB__CG_BUCKETS];
    tb__cg_memo *memo;
    size_t num_memo, cap_memo;
    int32_t memo_head[TB__CG_BUCKETS];
    tb__cg_undo *undo;
    size_t num_undo, cap_undo;
    tb__cg_scope *scopes;
    size_t num_scopes, cap_scopes;
    tb__cg_frame *frames;
    size_t num_frames, cap_frames;
    int32_t *stack;
    size_t num_stack, cap_stack;
    int depth;
    /* evaluations of each node in this kernel (a node evaluated at many positions is
       recomputed each time: past a budget it is materialised instead) */
    int32_t *evals;
    int32_t *touched;
    size_t num_touched;
    double ops; /* operations per output element, for the GFLOP/s estimate */
    tb_status status;
} tb__cg;

static tb_status tb__cg_fail(tb__cg *g, tb_status st) {
    if (g->status == TB_OK) g->status = st;
    return st;
}

static void tb__cg_line(tb__cg *g, const char *fmt, ...) TB_PRINTF_LIKE(2, 3);
static void tb__cg_line(tb__cg *g, const char *fmt, ...) {
    char small[512];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        g->body.failed = true; /* a line left out is a wrong kernel: fail the whole body */
        return;
    }
    tb__str_append(&g->body, "%*s", g->indent * 4, "");
    if ((size_t)n < sizeof small) {
        tb__str_append(&g->body, "%s\n", small);
    } else {
        char *big = (char *)tb__alloc((size_t)n + 1);
        if (big == NULL) {
            g->body.failed = true;
            return;
        }
        va_start(ap, fmt);
        vsnprintf(big, (size_t)n + 1, fmt, ap);
        va_end(ap);
        tb__str_append(&g->body, "%s\n", big);
        tb__free(big);
    }
}

static int64_t tb__sat_add(int64_t a, int64_t b) {
    if (b > 0 && a > INT64_MAX - b) return INT64_MAX;
    if (b < 0 && a < INT64_MIN - b) return INT64_MIN;
    return a + b;
}

static int64_t tb__sat_mul(int64_t a, int64_t b) {
    if (a == 0 || b == 0) return 0;
    if (a > 0 ? (b > 0 ? a > INT64_MAX / b : b < INT64_MIN / a)
              : (b > 0 ? a < INT64_MIN / b : a < INT64_MAX / b))
        return ((a > 0) == (b > 0)) ? INT64_MAX : INT64_MIN;
    return a * b;
}

static int32_t tb__cg_new_var(tb__cg *g, int64_t lo, int64_t hi) {
    if (tb__grow((void **)&g->vars, &g->cap_vars, g->num_vars + 1, sizeof(tb__cg_var)) != TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    g->vars[g->num_vars].lo = lo;
    g->vars[g->num_vars].hi = hi;
    return (int32_t)g->num_vars++;
}

static int32_t tb__cg_new_val(tb__cg *g, tb_dtype dtype) {
    if (tb__grow((void **)&g->val_dtype, &g->cap_vals, g->num_vals + 1, sizeof(tb_dtype)) !=
        TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    g->val_dtype[g->num_vals] = dtype;
    return (int32_t)g->num_vals++;
}

static void tb__lf_const(tb__lf *lf, int64_t c) {
    memset(lf, 0, sizeof *lf);
    lf->c = c;
}

static bool tb__lf_add_term(tb__lf *lf, int32_t var, int64_t coef) {
    int32_t i, j;
    if (coef == 0) return true;
    for (i = 0; i < lf->n; i++) {
        if (lf->var[i] == var) {
            lf->coef[i] += coef;
            if (lf->coef[i] == 0) {
                for (j = i; j + 1 < lf->n; j++) {
                    lf->var[j] = lf->var[j + 1];
                    lf->coef[j] = lf->coef[j + 1];
                }
                lf->n--;
                lf->var[lf->n] = 0;
                lf->coef[lf->n] = 0;
            }
            return true;
        }
        if (lf->var[i] > var) break;
    }
    if (lf->n == TB__LF_MAX) return false;
    for (j = lf->n; j > i; j--) {
        lf->var[j] = lf->var[j - 1];
        lf->coef[j] = lf->coef[j - 1];
    }
    lf->var[i] = var;
    lf->coef[i] = coef;
    lf->n++;
    return true;
}

static void tb__cg_lf_range(const tb__cg *g, const tb__lf *lf, int64_t *lo, int64_t *hi) {
    int32_t i;
    *lo = lf->c;
    *hi = lf->c;
    for (i = 0; i < lf->n; i++) {
        int64_t a = tb__sat_mul(lf->coef[i], g->vars[lf->var[i]].lo);
        int64_t b = tb__sat_mul(lf->coef[i], g->vars[lf->var[i]].hi);
        *lo = tb__sat_add(*lo, a < b ? a : b);
        *hi = tb__sat_add(*hi, a < b ? b : a);
    }
}

/* The form as OpenCL C (a long expression). */
static void tb__cg_lf_text(const tb__lf *lf, char *buf, size_t cap) {
    size_t len = 0;
    int32_t i;
    buf[0] = '\0';
    for (i = 0; i < lf->n; i++) {
        int64_t c = lf->coef[i];
        const char *sign = (c < 0) ? (len == 0 ? "-" : " - ") : (len == 0 ? "" : " + ");
        uint64_t mag = c < 0 ? (uint64_t)0 - (uint64_t)c : (uint64_t)c;
        int n;
        if (mag == 1) {
            n = snprintf(buf + len, cap - len, "%si%d", sign, (int)lf->var[i]);
        } else {
            n = snprintf(buf + len, cap - len, "%si%d * %llu%s", sign, (int)lf->var[i],
                         (unsigned long long)mag, mag > 2147483647u ? "L" : "");
        }
        if (n < 0 || (size_t)n >= cap - len) return;
        len += (size_t)n;
    }
    if (lf->c != 0 || len == 0) {
        uint64_t mag = lf->c < 0 ? (uint64_t)0 - (uint64_t)lf->c : (uint64_t)lf->c;
        const char *sign = lf->c < 0 ? (len == 0 ? "-" : " - ") : (len == 0 ? "" : " + ");
        snprintf(buf + len, cap - len, "%s%llu%s", sign, (unsigned long long)mag,
                 mag > 2147483647u ? "L" : "");
    }
}

#define TB__LF_TEXT 640

/* A new variable holding the form's value. */
static int32_t tb__cg_spill(tb__cg *g, const tb__lf *lf) {
    char text[TB__LF_TEXT];
    int64_t lo, hi;
    int32_t v;
    if (lf->n == 1 && lf->c == 0 && lf->coef[0] == 1) return lf->var[0];
    tb__cg_lf_range(g, lf, &lo, &hi);
    v = tb__cg_new_var(g, lo, hi);
    if (v < 0) return -1;
    tb__cg_lf_text(lf, text, sizeof text);
    tb__cg_line(g, "const long i%d = %s;", (int)v, text);
    return v;
}

/* dst += scale * src, spilling into variables when the terms do not fit. */
static bool tb__cg_lf_addmul(tb__cg *g, tb__lf *dst, const tb__lf *src, int64_t scale) {
    int32_t i;
    tb__lf s = *src;
    if (scale == 0) return true;
    dst->c += s.c * scale;
    for (i = 0; i < s.n; i++) {
        if (!tb__lf_add_term(dst, s.var[i], s.coef[i] * scale)) {
            int32_t v = tb__cg_spill(g, dst);
            if (v < 0) return false;
            tb__lf_const(dst, 0);
            tb__lf_add_term(dst, v, 1);
            tb__lf_add_term(dst, s.var[i], s.coef[i] * scale);
        }
    }
    return true;
}

static void tb__cg_contig(int32_t rank, const int64_t *dims, int64_t *strides) {
    int64_t s = 1;
    int32_t i;
    for (i = rank - 1; i >= 0; i--) {
        strides[i] = s;
        s *= dims[i] > 0 ? dims[i] : 1;
    }
}

static void tb__cg_pos_init(tb__pos *p, const tb_shape *shape) {
    memset(p, 0, sizeof *p);
    p->rank = shape->rank;
    memcpy(p->dims, shape->dims, (size_t)shape->rank * sizeof(int64_t));
}

static uint64_t tb__cg_pos_hash(const tb__pos *p) {
    uint64_t h = tb__hash_u64(0x706f736974696f6eull, (uint64_t)(uint32_t)p->rank);
    h = tb__hash_bytes(h, p->dims, sizeof p->dims);
    h = tb__hash_u64(h, (uint64_t)p->key_flat);
    if (p->key_flat) return tb__hash_bytes(h, &p->flat, sizeof p->flat);
    return tb__hash_bytes(h, p->dim, sizeof p->dim);
}

static bool tb__cg_pos_same(const tb__pos *a, const tb__pos *b) {
    if (a->rank != b->rank || a->key_flat != b->key_flat) return false;
    if (memcmp(a->dims, b->dims, sizeof a->dims) != 0) return false;
    if (a->key_flat) return memcmp(&a->flat, &b->flat, sizeof a->flat) == 0;
    return memcmp(a->dim, b->dim, sizeof a->dim) == 0;
}

/* Canonical form (dims of size 1 are at index 0; arrays of 0 or 1 element at offset 0), then
   the id of the equal interned position. */
static int32_t tb__cg_intern(tb__cg *g, tb__pos *p) {
    int64_t numel = 1;
    int32_t i, id;
    size_t b;
    for (i = 0; i < p->rank; i++)
        numel *= p->dims[i];
    if (numel <= 1) {
        tb__lf_const(&p->flat, 0);
        for (i = 0; i < p->rank; i++)
            tb__lf_const(&p->dim[i], 0);
        p->has_flat = p->has_multi = 1;
        p->key_flat = 1;
    } else {
        if (p->has_multi) {
            for (i = 0; i < p->rank; i++)
                if (p->dims[i] == 1) tb__lf_const(&p->dim[i], 0);
        }
        p->key_flat = p->has_flat ? 1 : 0;
    }
    if (!p->has_flat) tb__lf_const(&p->flat, 0);
    if (!p->has_multi) {
        for (i = 0; i < TB_MAX_RANK; i++)
            tb__lf_const(&p->dim[i], 0);
    }
    for (i = p->rank; i < TB_MAX_RANK; i++) {
        p->dims[i] = 0;
        tb__lf_const(&p->dim[i], 0);
    }
    p->hash = tb__cg_pos_hash(p);
    b = (size_t)(p->hash & (TB__CG_BUCKETS - 1));
    for (id = g->pos_head[b]; id >= 0; id = g->pos[id].next) {
        if (g->pos[id].hash == p->hash && tb__cg_pos_same(&g->pos[id], p)) return id;
    }
    if (tb__grow((void **)&g->pos, &g->cap_pos, g->num_pos + 1, sizeof(tb__pos)) != TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    id = (int32_t)g->num_pos++;
    g->pos[id] = *p;
    g->pos[id].next = g->pos_head[b];
    g->pos_head[b] = id;
    return id;
}

static uint64_t tb__cg_memo_key(int32_t kind, int32_t a, int32_t b, uint64_t extra) {
    uint64_t h = tb__hash_u64(0x6d656d6f00000001ull, (uint64_t)(uint32_t)kind);
    h = tb__hash_u64(h, (uint64_t)(uint32_t)a);
    h = tb__hash_u64(h, (uint64_t)(uint32_t)b);
    return tb__hash_u64(h, extra);
}

static int32_t tb__cg_memo_find(const tb__cg *g, int32_t kind, int32_t a, int32_t b,
                                uint64_t extra) {
    uint64_t key = tb__cg_memo_key(kind, a, b, extra);
    int32_t e;
    for (e = g->memo_head[key & (TB__CG_BUCKETS - 1)]; e >= 0; e = g->memo[e].next) {
        const tb__cg_memo *m = &g->memo[e];
        if (m->key == key && m->kind == kind && m->a == a && m->b == b && m->extra == extra)
            return m->value;
    }
    return -1;
}

static void tb__cg_memo_add(tb__cg *g, int32_t kind, int32_t a, int32_t b, uint64_t extra,
                            int32_t value) {
    uint64_t key = tb__cg_memo_key(kind, a, b, extra);
    size_t bucket = (size_t)(key & (TB__CG_BUCKETS - 1));
    tb__cg_memo *m;
    if (tb__grow((void **)&g->memo, &g->cap_memo, g->num_memo + 1, sizeof(tb__cg_memo)) != TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return;
    }
    m = &g->memo[g->num_memo];
    m->key = key;
    m->kind = kind;
    m->a = a;
    m->b = b;
    m->extra = extra;
    m->value = value;
    m->next = g->memo_head[bucket];
    g->memo_head[bucket] = (int32_t)g->num_memo++;
}

static void tb__cg_undo_push(tb__cg *g, int32_t pos, int32_t form) {
    if (g->num_scopes == 0) return; /* the kernel's outermost scope never closes */
    if (tb__grow((void **)&g->undo, &g->cap_undo, g->num_undo + 1, sizeof(tb__cg_undo)) != TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return;
    }
    g->undo[g->num_undo].pos = pos;
    g->undo[g->num_undo].form = form;
    g->num_undo++;
}

/* `{` with a memo scope: values and variables made inside are forgotten at the `}`. */
static void tb__cg_open(tb__cg *g, const char *head) {
    if (tb__grow((void **)&g->scopes, &g->cap_scopes, g->num_scopes + 1, sizeof(tb__cg_scope)) !=
        TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return;
    }
    g->scopes[g->num_scopes].memo = g->num_memo;
    g->scopes[g->num_scopes].undo = g->num_undo;
    g->num_scopes++;
    tb__cg_line(g, "%s{", head);
    g->indent++;
}

static void tb__cg_close(tb__cg *g, const char *tail) {
    tb__cg_scope sc;
    if (g->num_scopes == 0) return;
    sc = g->scopes[--g->num_scopes];
    while (g->num_memo > sc.memo) {
        tb__cg_memo *m = &g->memo[--g->num_memo];
        g->memo_head[m->key & (TB__CG_BUCKETS - 1)] = m->next;
    }
    while (g->num_undo > sc.undo) {
        tb__cg_undo *u = &g->undo[--g->num_undo];
        if (u->form == 1) {
            g->pos[u->pos].has_flat = 0;
            tb__lf_const(&g->pos[u->pos].flat, 0);
        } else {
            int32_t i;
            g->pos[u->pos].has_multi = 0;
            for (i = 0; i < TB_MAX_RANK; i++)
                tb__lf_const(&g->pos[u->pos].dim[i], 0);
        }
    }
    g->indent--;
    tb__cg_line(g, "}%s", tail);
}

/* Makes sure the position has its flat form (sum of dim * contiguous stride). */
static bool tb__cg_need_flat(tb__cg *g, int32_t id) {
    int64_t strides[TB_MAX_RANK];
    tb__lf flat;
    tb__pos p;
    int32_t i;
    if (g->pos[id].has_flat) return true;
    p = g->pos[id];
    tb__cg_contig(p.rank, p.dims, strides);
    tb__lf_const(&flat, 0);
    for (i = 0; i < p.rank; i++) {
        if (!tb__cg_lf_addmul(g, &flat, &p.dim[i], strides[i])) return false;
    }
    g->pos[id].flat = flat;
    g->pos[id].has_flat = 1;
    tb__cg_undo_push(g, id, 1);
    return g->status == TB_OK;
}

/* Splits a flat form into per-dim affine forms when no term carries across a digit (merged
   or contiguous dims); false when it cannot. */
static bool tb__cg_affine_split(const tb__cg *g, const tb__lf *flat, int32_t rank,
                                const int64_t *dims, tb__lf *out) {
    int64_t strides[TB_MAX_RANK], numel = 1, lo, hi;
    int32_t i, j;
    tb__cg_contig(rank, dims, strides);
    for (i = 0; i < rank; i++)
        numel *= dims[i];
    if (flat->c < 0 || flat->c >= numel) return false;
    for (j = 0; j < rank; j++)
        tb__lf_const(&out[j], dims[j] > 1 ? (flat->c / strides[j]) % dims[j] : 0);
    for (i = 0; i < flat->n; i++) {
        int64_t f = flat->coef[i];
        for (j = 0; j < rank; j++) {
            if (dims[j] > 1 && f % strides[j] == 0) break;
        }
        if (j == rank) return false;
        if (!tb__lf_add_term(&out[j], flat->var[i], f / strides[j])) return false;
    }
    for (j = 0; j < rank; j++) {
        tb__cg_lf_range(g, &out[j], &lo, &hi);
        if (lo < 0 || hi >= dims[j]) return false;
    }
    return true;
}

/* Makes sure the position has its per-dim form: an affine split of the flat form, else
   division and remainder by the contiguous strides. */
static bool tb__cg_need_multi(tb__cg *g, int32_t id) {
    tb__pos p;
    tb__lf dims_lf[TB_MAX_RANK];
    int32_t i;
    if (g->pos[id].has_multi) return true;
    p = g->pos[id];
    if (!tb__cg_affine_split(g, &p.flat, p.rank, p.dims, dims_lf)) {
        int64_t strides[TB_MAX_RANK];
        uint64_t extra = tb__hash_bytes(tb__hash_bytes(0x756e726176656cull, &p.flat, sizeof p.flat),
                                        p.dims, sizeof p.dims);
        int32_t first = tb__cg_memo_find(g, TB__MEMO_UNRAVEL, p.rank, 0, extra), t, leading = 1;
        tb__cg_contig(p.rank, p.dims, strides);
        if (first < 0) {
            t = tb__cg_spill(g, &p.flat);
            if (t < 0) return false;
            first = (int32_t)g->num_vars;
            for (i = 0; i < p.rank; i++) {
                int32_t v = tb__cg_new_var(g, 0, p.dims[i] > 0 ? p.dims[i] - 1 : 0);
                if (v < 0) return false;
                if (p.dims[i] <= 1) {
                    tb__cg_line(g, "const long i%d = 0;", (int)v);
                } else if (leading) {
                    tb__cg_line(g, "const long i%d = i%d / %lldL;", (int)v, (int)t,
                                (long long)strides[i]);
                } else if (strides[i] == 1) {
                    tb__cg_line(g, "const long i%d = i%d %% %lldL;", (int)v, (int)t,
                                (long long)p.dims[i]);
                } else {
                    tb__cg_line(g, "const long i%d = (i%d / %lldL) %% %lldL;", (int)v, (int)t,
                                (long long)strides[i], (long long)p.dims[i]);
                }
                if (p.dims[i] > 1) leading = 0;
            }
            tb__cg_memo_add(g, TB__MEMO_UNRAVEL, p.rank, 0, extra, first);
        }
        for (i = 0; i < p.rank; i++) {
            tb__lf_const(&dims_lf[i], 0);
            if (p.dims[i] > 1) tb__lf_add_term(&dims_lf[i], first + i, 1);
        }
    }
    for (i = 0; i < p.rank; i++)
        g->pos[id].dim[i] = dims_lf[i];
    g->pos[id].has_multi = 1;
    tb__cg_undo_push(g, id, 2);
    return g->status == TB_OK;
}

/* A position over `shape` with the given per-dim forms. */
static int32_t tb__cg_pos_multi(tb__cg *g, const tb_shape *shape, const tb__lf *dims) {
    tb__pos q;
    int32_t i;
    tb__cg_pos_init(&q, shape);
    for (i = 0; i < shape->rank; i++)
        q.dim[i] = dims[i];
    q.has_multi = 1;
    return tb__cg_intern(g, &q);
}

static int32_t tb__cg_pos_flat(tb__cg *g, const tb_shape *shape, const tb__lf *flat) {
    tb__pos q;
    tb__cg_pos_init(&q, shape);
    q.flat = *flat;
    q.has_flat = 1;
    return tb__cg_intern(g, &q);
}

/* ---- code generation: values ---- */

static const tb__ocl_plan *tb__cg_plan(const tb__cg *g) {
    return g->L->plan;
}

static tb__ocl_kernel *tb__cg_kernel(const tb__cg *g) {
    return &g->L->plan->kernels[g->kernel];
}

/* A floating literal of the dtype (a float literal carries the f suffix). */
static void tb__cg_flit(tb_dtype dtype, double v, char *buf, size_t cap) {
    bool f32 = dtype != TB_F64;
    if (v != v) {
        snprintf(buf, cap, "%s", f32 ? "NAN" : "((double)NAN)");
    } else if (v > DBL_MAX || v < -DBL_MAX) {
        snprintf(buf, cap, "%s%s", v < 0 ? "-" : "", f32 ? "INFINITY" : "((double)INFINITY)");
    } else {
        char tmp[40]; /* "%.17g" needs at most 24 bytes; the rest leaves room for ".0" */
        snprintf(tmp, sizeof tmp, f32 ? "%.9g" : "%.17g", f32 ? (double)(float)v : v);
        if (strchr(tmp, '.') == NULL && strchr(tmp, 'e') == NULL) strcat(tmp, ".0");
        snprintf(buf, cap, "%s%s", tmp, f32 ? "f" : "");
    }
}

static int32_t tb__cg_arg(tb__cg *g, int32_t kind, int32_t index) {
    tb__ocl_kernel *k = tb__cg_kernel(g);
    size_t i;
    for (i = 0; i < k->num_args; i++)
        if (k->args[i].kind == kind && k->args[i].index == index) return (int32_t)i;
    if (tb__grow((void **)&k->args, &k->cap_args, k->num_args + 1, sizeof(tb__ocl_arg)) != TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    k->args[k->num_args].kind = kind;
    k->args[k->num_args].index = index;
    if (kind == TB__OCL_ARG_BUF) {
        tb__ocl_slot *s = &g->L->plan->slots[index];
        if (s->last_use < g->kernel) s->last_use = g->kernel;
    }
    return (int32_t)k->num_args++;
}

/* A run-time error site: the code a kernel writes to tb_err[0]. */
static int32_t tb__cg_errsite(tb__cg *g, tb_op op, int32_t dim, int64_t size) {
    tb__ocl_plan *p = g->L->plan;
    tb__ocl_errsite *grown;
    if (tb__cg_arg(g, TB__OCL_ARG_ERR, 0) < 0) return -1;
    grown = (tb__ocl_errsite *)tb__calloc(p->num_errsites + 1, sizeof *grown);
    if (grown == NULL) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    if (p->num_errsites > 0) memcpy(grown, p->errsites, p->num_errsites * sizeof *grown);
    tb__free(p->errsites);
    p->errsites = grown;
    grown[p->num_errsites].op = op;
    grown[p->num_errsites].dim = dim;
    grown[p->num_errsites].size = size;
    return (int32_t)++p->num_errsites;
}

static bool tb__cg_push_frame(tb__cg *g, int32_t node, int32_t pos) {
    if (tb__grow((void **)&g->frames, &g->cap_frames, g->num_frames + 1, sizeof(tb__cg_frame)) !=
        TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return false;
    }
    g->frames[g->num_frames].node = node;
    g->frames[g->num_frames].pos = pos;
    g->frames[g->num_frames].state = 0;
    g->frames[g->num_frames].vbase = 0;
    g->num_frames++;
    return true;
}

static bool tb__cg_push_value(tb__cg *g, int32_t v) {
    if (tb__grow((void **)&g->stack, &g->cap_stack, g->num_stack + 1, sizeof(int32_t)) != TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return false;
    }
    g->stack[g->num_stack++] = v;
    return true;
}

/* The position of operand k of an elementwise or movement node at position `pos`. */
static int32_t tb__cg_operand_pos(tb__cg *g, int32_t node, int32_t pos, size_t k) {
    const tb_node *n = g->L->info[node].node;
    const tb_node *c = g->L->info[tb__ocl_operand(g->L, node, k)].node;
    const tb_shape *ns = &n->shape, *cs = &c->shape;
    tb__lf dims[TB_MAX_RANK];
    int32_t i, off;
    tb__pos p;
    if (n->op == TB_OP_RAND || n->op == TB_OP_RANDN) {
        tb__lf zero;
        tb__lf_const(&zero, 0);
        return tb__cg_pos_flat(g, cs, &zero);
    }
    if (n->op == TB_OP_RESHAPE) {
        if (!tb__cg_need_flat(g, pos)) return -1;
        return tb__cg_pos_flat(g, cs, &g->pos[pos].flat);
    }
    if (tb__ocl_is_elementwise(n->op) && tb__ocl_same_dims(ns, cs)) return pos;
    if (tb__ocl_numel(cs) <= 1 && n->op != TB_OP_PAD && n->op != TB_OP_CONCAT) {
        tb__lf zero;
        tb__lf_const(&zero, 0);
        return tb__cg_pos_flat(g, cs, &zero);
    }
    if (!tb__cg_need_multi(g, pos)) return -1;
    p = g->pos[pos];
    switch (n->op) {
    case TB_OP_PERMUTE:
        for (i = 0; i < ns->rank; i++)
            dims[n->attrs[i]] = p.dim[i];
        break;
    case TB_OP_SLICE: {
        int32_t d = (int32_t)n->attrs[0];
        for (i = 0; i < cs->rank; i++)
            dims[i] = p.dim[i];
        tb__lf_const(&dims[d], n->attrs[1]);
        if (!tb__cg_lf_addmul(g, &dims[d], &p.dim[d], n->attrs[3])) return -1;
        break;
    }
    case TB_OP_FLIP:
        for (i = 0; i < cs->rank; i++) {
            if (((uint64_t)n->attrs[0] >> i) & 1u) {
                tb__lf_const(&dims[i], cs->dims[i] - 1);
                if (!tb__cg_lf_addmul(g, &dims[i], &p.dim[i], -1)) return -1;
            } else {
                dims[i] = p.dim[i];
            }
        }
        break;
    default: /* EXPAND and broadcasting elementwise operands: aligned at the last axis */
        off = ns->rank - cs->rank;
        for (i = 0; i < cs->rank; i++) {
            if (cs->dims[i] == 1 || i + off < 0) {
                tb__lf_const(&dims[i], 0);
            } else {
                dims[i] = p.dim[i + off];
            }
        }
        break;
    }
    return tb__cg_pos_multi(g, cs, dims);
}

static int32_t tb__cg_eval(tb__cg *g, int32_t node, int32_t pos);

/* Counts an evaluation of `node`. Past the kernel's budget (a DAG that reads its values at
   ever more positions, so that recomputation grows exponentially), every inlined node
   evaluated more than once becomes a root and the lowering starts over. */
static bool tb__cg_count(tb__cg *g, int32_t node) {
    size_t i;
    if (g->evals[node]++ == 0) g->touched[g->num_touched++] = node;
    if (g->num_vals <= TB__CG_MAX_VALUES) return true;
    for (i = 0; i < g->num_touched; i++) {
        tb__ocl_ninfo *in = &g->L->info[g->touched[i]];
        if (g->evals[g->touched[i]] > 1 && !in->root && in->param < 0) {
            in->force_root = true;
            g->L->restart = true;
        }
    }
    if (!g->L->restart) tb__cg_fail(g, tb__error(TB_ERR_UNSUPPORTED, "opencl: a kernel too large"));
    return false;
}

/* Reads element `pos` of a buffer slot. */
static int32_t tb__cg_read_slot(tb__cg *g, int32_t slot, tb_dtype dtype, int32_t pos) {
    char text[TB__LF_TEXT];
    int32_t v;
    if (tb__cg_arg(g, TB__OCL_ARG_BUF, slot) < 0) return -1;
    if (!tb__cg_need_flat(g, pos)) return -1;
    tb__cg_lf_text(&g->pos[pos].flat, text, sizeof text);
    v = tb__cg_new_val(g, dtype);
    if (v < 0) return -1;
    tb__cg_line(g, "const %s v%d = b%d[%s];", tb__ocl_ctype(dtype), (int)v, (int)slot, text);
    return v;
}

static const char *tb__cg_scalar_ctype(const tb__cg *g, tb_dtype dtype) {
    if (dtype == TB_F64 && !g->L->dev->info.supports_f64) return "float";
    return tb__ocl_ctype(dtype);
}

static bool tb__cg_enter(tb__cg *g, int32_t node) {
    if (++g->depth > TB__CG_MAX_DEPTH) {
        /* nested too deep for the code generator's recursion: materialise this node */
        g->L->info[node].force_root = true;
        g->L->restart = true;
        g->depth--;
        return false;
    }
    return true;
}

static int32_t tb__cg_pad(tb__cg *g, int32_t node, int32_t pos) {
    const tb_node *n = g->L->info[node].node;
    int32_t x = tb__ocl_operand(g->L, node, 0), val = tb__ocl_operand(g->L, node, 1);
    const tb_shape *xs = &g->L->info[x].node->shape;
    tb__lf zero, dims[TB_MAX_RANK];
    tb__str cond;
    int32_t vv, v, vx, i, qp;
    tb__pos p;
    tb__lf_const(&zero, 0);
    vv = tb__cg_eval(g, val, tb__cg_pos_flat(g, &g->L->info[val].node->shape, &zero));
    if (vv < 0) return -1;
    v = tb__cg_new_val(g, n->shape.dtype);
    if (v < 0) return -1;
    tb__cg_line(g, "%s v%d = (%s)v%d;", tb__ocl_ctype(n->shape.dtype), (int)v,
                tb__ocl_ctype(n->shape.dtype), (int)vv);
    if (tb__ocl_numel(xs) == 0) return v;
    if (!tb__cg_need_multi(g, pos)) return -1;
    p = g->pos[pos];
    /* the whole head in one builder, checked once: a head that lost its condition to a failed
       allocation would copy x into the padding */
    memset(&cond, 0, sizeof cond);
    for (i = 0; i < xs->rank; i++) {
        int64_t before = n->attrs[2 * i], after = n->attrs[2 * i + 1];
        dims[i] = p.dim[i];
        dims[i].c -= before;
        if (before > 0 || after > 0) {
            char text[TB__LF_TEXT];
            tb__cg_lf_text(&p.dim[i], text, sizeof text);
            tb__str_append(&cond, "%s(%s) >= %lldL && (%s) < %lldL", cond.len > 0 ? " && " : "if (",
                           text, (long long)before, text, (long long)(before + xs->dims[i]));
        }
    }
    if (cond.len > 0) tb__str_append(&cond, ") ");
    if (cond.failed) {
        tb__str_free(&cond);
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    tb__cg_open(g, cond.len > 0 ? cond.data : "");
    tb__str_free(&cond);
    qp = tb__cg_pos_multi(g, xs, dims);
    vx = qp >= 0 ? tb__cg_eval(g, x, qp) : -1;
    if (vx >= 0) tb__cg_line(g, "v%d = v%d;", (int)v, (int)vx);
    tb__cg_close(g, "");
    return vx >= 0 ? v : -1;
}

static int32_t tb__cg_concat(tb__cg *g, int32_t node, int32_t pos) {
    const tb_node *n = g->L->info[node].node;
    int32_t dim = (int32_t)n->attrs[0], v, i;
    int64_t start = 0, last_nonempty = -1;
    char text[TB__LF_TEXT];
    tb__pos p;
    v = tb__cg_new_val(g, n->shape.dtype);
    if (v < 0) return -1;
    tb__cg_line(g, "%s v%d = 0;", tb__ocl_ctype(n->shape.dtype), (int)v);
    if (!tb__cg_need_multi(g, pos)) return -1;
    p = g->pos[pos];
    tb__cg_lf_text(&p.dim[dim], text, sizeof text);
    for (i = 0; i < (int32_t)n->num_operands; i++)
        if (g->L->info[tb__ocl_operand(g->L, node, (size_t)i)].node->shape.dims[dim] > 0)
            last_nonempty = i;
    for (i = 0; i < (int32_t)n->num_operands; i++) {
        int32_t x = tb__ocl_operand(g->L, node, (size_t)i), qp, vx;
        const tb_shape *xs = &g->L->info[x].node->shape;
        tb__lf dims[TB_MAX_RANK];
        char head[TB__LF_TEXT + 64];
        int32_t d;
        memset(dims, 0, sizeof dims); /* only rank entries are used; optimisers cannot tell */
        if (xs->dims[dim] == 0) continue;
        if (i == last_nonempty) {
            snprintf(head, sizeof head, "%s", start == 0 ? "" : "else ");
        } else {
            snprintf(head, sizeof head, "%sif ((%s) < %lldL) ", start == 0 ? "" : "else ", text,
                     (long long)(start + xs->dims[dim]));
        }
        tb__cg_open(g, head);
        for (d = 0; d < xs->rank; d++)
            dims[d] = p.dim[d];
        dims[dim].c -= start;
        qp = tb__cg_pos_multi(g, xs, dims);
        vx = qp >= 0 ? tb__cg_eval(g, x, qp) : -1;
        if (vx >= 0) tb__cg_line(g, "v%d = v%d;", (int)v, (int)vx);
        tb__cg_close(g, "");
        if (vx < 0) return -1;
        start += xs->dims[dim];
    }
    return v;
}

/* GATHER and INDEX_SELECT: the index becomes a variable of the operand's position. */
static int32_t tb__cg_gather(tb__cg *g, int32_t node, int32_t pos) {
    const tb_node *n = g->L->info[node].node;
    int32_t x = tb__ocl_operand(g->L, node, 0), ix = tb__ocl_operand(g->L, node, 1);
    const tb_shape *xs = &g->L->info[x].node->shape, *is = &g->L->info[ix].node->shape;
    int32_t dim = (int32_t)n->attrs[0], vi, t, code, qp, d;
    int64_t size = xs->dims[dim];
    tb__lf dims[TB_MAX_RANK];
    tb__pos p;
    if (n->op == TB_OP_GATHER) {
        vi = tb__cg_eval(g, ix, pos);
    } else {
        if (!tb__cg_need_multi(g, pos)) return -1;
        vi = tb__cg_eval(g, ix, tb__cg_pos_multi(g, is, &g->pos[pos].dim[dim]));
    }
    if (vi < 0) return -1;
    t = tb__cg_new_var(g, 0, size > 0 ? size - 1 : 0);
    code = tb__cg_errsite(g, n->op, dim, size);
    if (t < 0 || code < 0) return -1;
    tb__cg_line(g, "long i%d = (long)v%d;", (int)t, (int)vi);
    tb__cg_line(g, "if (i%d < 0 || i%d >= %lldL) { tb_err[0] = %d; tb_err[1] = i%d; i%d = 0; }",
                (int)t, (int)t, (long long)size, (int)code, (int)t, (int)t);
    if (!tb__cg_need_multi(g, pos)) return -1;
    p = g->pos[pos];
    for (d = 0; d < xs->rank; d++) {
        if (d == dim) {
            tb__lf_const(&dims[d], 0);
            tb__lf_add_term(&dims[d], t, 1);
        } else {
            dims[d] = p.dim[d];
        }
    }
    qp = tb__cg_pos_multi(g, xs, dims);
    if (qp < 0) return -1;
    return tb__cg_eval(g, x, qp);
}

static int32_t tb__cg_generator(tb__cg *g, int32_t node, int32_t pos) {
    const tb_node *n = g->L->info[node].node;
    tb_dtype od = n->shape.dtype;
    const char *t = tb__ocl_ctype(od);
    char a[TB__LF_TEXT], b[TB__LF_TEXT];
    int32_t v;
    if (!tb__cg_need_multi(g, pos)) return -1;
    tb__cg_lf_text(&g->pos[pos].dim[0], a, sizeof a);
    v = tb__cg_new_val(g, od);
    if (v < 0) return -1;
    if (n->op == TB_OP_EYE) {
        tb__cg_lf_text(&g->pos[pos].dim[1], b, sizeof b);
        tb__cg_line(g, "const %s v%d = (%s)((%s) == (%s));", t, (int)v, t, a, b);
    } else if (tb_dtype_is_float(od)) {
        char s0[64], s1[64];
        tb__cg_flit(TB_F64, n->fattrs[0], s0, sizeof s0);
        tb__cg_flit(TB_F64, n->fattrs[1], s1, sizeof s1);
        tb__cg_line(g, "const %s v%d = (%s)(%s + (double)(%s) * %s);", t, (int)v, t, s0, a, s1);
    } else {
        double s = n->fattrs[0], st = n->fattrs[1];
        long long s0 = (s != s) ? 0 : (long long)s, s1 = (st != st) ? 0 : (long long)st;
        tb__cg_line(g, "const %s v%d = (%s)((ulong)%lldL + (ulong)(%s) * (ulong)%lldL);", t, (int)v,
                    t, s0, a, s1);
    }
    return v;
}

/* Nodes that are not computed from operand values at the same kind of position: leaves,
   other kernels' outputs and the ops with their own control flow. */
static int32_t tb__cg_special(tb__cg *g, int32_t node, int32_t pos, bool *handled) {
    const tb__ocl_ninfo *in = &g->L->info[node];
    const tb__ocl_kernel *k = tb__cg_kernel(g);
    int32_t v;
    *handled = true;
    if (in->param >= 0) {
        if (in->node->op == TB_OP_SCALAR && tb__cg_plan(g)->scalar_table) {
            tb_dtype dt = in->node->shape.dtype;
            const char *ct = tb__ocl_ctype(dt);
            if (tb__cg_arg(g, TB__OCL_ARG_TABLE, 0) < 0) return -1;
            v = tb__cg_new_val(g, dt);
            if (v < 0) return -1;
            if (dt == TB_F32 || (dt == TB_F64 && !g->L->dev->info.supports_f64)) {
                tb__cg_line(g, "const %s v%d = (%s)as_float((uint)tb_sc[%d]);", ct, (int)v, ct,
                            (int)in->param);
            } else if (dt == TB_F64) {
                tb__cg_line(g, "const double v%d = as_double(tb_sc[%d]);", (int)v, (int)in->param);
            } else {
                tb__cg_line(g, "const %s v%d = (%s)tb_sc[%d];", ct, (int)v, ct, (int)in->param);
            }
            return v;
        }
        if (in->node->op == TB_OP_SCALAR) {
            if (tb__cg_arg(g, TB__OCL_ARG_SCALAR, in->param) < 0) return -1;
            v = tb__cg_new_val(g, in->node->shape.dtype);
            if (v < 0) return -1;
            tb__cg_line(g, "const %s v%d = (%s)s%d;", tb__ocl_ctype(in->node->shape.dtype), (int)v,
                        tb__ocl_ctype(in->node->shape.dtype), (int)in->param);
            return v;
        }
        return tb__cg_read_slot(g, in->slot, in->node->shape.dtype, pos);
    }
    if (node == k->core) {
        tb__cg_fail(g, tb__error(TB_ERR_INTERNAL, "opencl: a kernel's core read at another "
                                                  "position than its output"));
        return -1;
    }
    if (in->root && node != k->root)
        return tb__cg_read_slot(g, in->slot, in->node->shape.dtype, pos);
    if (in->ctx != k->owner && in->ctx != TB__OCL_CTX_ANY) {
        tb__cg_fail(g, tb__error(TB_ERR_INTERNAL,
                                 "opencl: node %d evaluated in kernel %d, "
                                 "planned for kernel %d",
                                 (int)node, (int)g->kernel, (int)in->ctx));
        return -1;
    }
    switch (in->node->op) {
    case TB_OP_PAD:
    case TB_OP_CONCAT:
    case TB_OP_GATHER:
    case TB_OP_INDEX_SELECT:
        if (!tb__cg_enter(g, node)) return -1;
        if (in->node->op == TB_OP_PAD) {
            v = tb__cg_pad(g, node, pos);
        } else if (in->node->op == TB_OP_CONCAT) {
            v = tb__cg_concat(g, node, pos);
        } else {
            v = tb__cg_gather(g, node, pos);
        }
        g->depth--;
        return v;
    case TB_OP_ARANGE:
    case TB_OP_EYE:
        return tb__cg_generator(g, node, pos);
    default:
        *handled = false;
        return -1;
    }
}

/* The type sums of a float dtype accumulate in: double for f32 on CPU devices with fp64 (as the
   reference accumulates, at little cost there), else the dtype itself. Elementwise math
   (exp, log, ...) runs in the dtype itself. */
static const char *tb__cg_acc_type(const tb__cg *g, tb_dtype dtype) {
    if (dtype == TB_F32 && g->fast_f64) return "double";
    return tb__ocl_ctype(dtype);
}

static int32_t tb__cg_emit_custom(tb__cg *g, const tb_node *n, const int32_t *ops, size_t nops) {
    const tb_custom_op_desc *d = tb__ocl_custom(n->op);
    const char *t = tb__ocl_ctype(n->shape.dtype);
    int32_t v = tb__cg_new_val(g, n->shape.dtype);
    size_t i;
    if (v < 0 || d == NULL || d->opencl_expr == NULL) {
        return v < 0 ? -1 : (tb__cg_fail(g, TB_ERR_INTERNAL), -1);
    }
    tb__cg_line(g, "%s v%d;", t, (int)v);
    tb__cg_open(g, "");
    tb__str_append(&g->body, "#define T %s\n", t);
    for (i = 0; i < nops; i++)
        tb__cg_line(g, "const T x%zu = (T)v%d;", i, (int)ops[i]);
    tb__cg_line(g, "v%d = (T)(%s);", (int)v, d->opencl_expr);
    tb__str_append(&g->body, "#undef T\n");
    tb__cg_close(g, "");
    return v;
}

/* One elementwise op (or RAND/RANDN) from its operands' values. */
static int32_t tb__cg_emit_op(tb__cg *g, int32_t node, int32_t pos, const int32_t *ops,
                              size_t nops) {
    const tb_node *n = g->L->info[node].node;
    tb_dtype od = n->shape.dtype, ad = nops > 0 ? g->val_dtype[ops[0]] : od;
    const char *t = tb__ocl_ctype(od), *u = tb__ocl_utype(od);
    const char *m = t;
    bool fl = tb_dtype_is_float(od), afl = tb_dtype_is_float(ad);
    char e[1024], a[16], b[16], c[16];
    int32_t v;
    e[0] = '\0';
    snprintf(a, sizeof a, "v%d", nops > 0 ? (int)ops[0] : 0);
    snprintf(b, sizeof b, "v%d", nops > 1 ? (int)ops[1] : 0);
    snprintf(c, sizeof c, "v%d", nops > 2 ? (int)ops[2] : 0);
    if (tb_op_get_kind(n->op) == TB_KIND_MOVEMENT) return ops[0]; /* the position did it all */
    g->ops += 1;
    if (n->op >= TB_OP_BUILTIN_COUNT) return tb__cg_emit_custom(g, n, ops, nops);
    switch (n->op) {
    case TB_OP_NEG:
        if (fl) {
            snprintf(e, sizeof e, "-%s", a);
        } else if (od == TB_BOOL) {
            snprintf(e, sizeof e, "%s", a);
        } else {
            snprintf(e, sizeof e, "(%s)((%s)0 - (%s)%s)", t, u, u, a);
        }
        break;
    case TB_OP_ABS:
        if (fl) {
            snprintf(e, sizeof e, "fabs(%s)", a);
        } else if (od == TB_U8 || od == TB_BOOL) {
            snprintf(e, sizeof e, "%s", a);
        } else {
            snprintf(e, sizeof e, "(%s)(%s < 0 ? (%s)0 - (%s)%s : (%s)%s)", t, a, u, u, a, u, a);
        }
        break;
    case TB_OP_EXP:
    case TB_OP_LOG:
    case TB_OP_SIN:
    case TB_OP_COS:
    case TB_OP_TANH: {
        const char *f = n->op == TB_OP_EXP   ? "exp"
                        : n->op == TB_OP_LOG ? "log"
                        : n->op == TB_OP_SIN ? "sin"
                        : n->op == TB_OP_COS ? "cos"
                                             : "tanh";
        snprintf(e, sizeof e, "(%s)%s((%s)%s)", t, f, m, a);
        break;
    }
    case TB_OP_SQRT:
        snprintf(e, sizeof e, "sqrt(%s)", a);
        break;
    case TB_OP_RSQRT:
        snprintf(e, sizeof e, "(%s)((%s)1 / sqrt((%s)%s))", t, m, m, a);
        break;
    case TB_OP_SIGMOID:
    case TB_OP_SILU: {
        /* exp of a negative argument only, as the reference */
        char x[64], sg[512];
        snprintf(x, sizeof x, "((%s)%s)", m, a);
        snprintf(sg, sizeof sg,
                 "(%s >= 0 ? (%s)1 / ((%s)1 + exp(-%s)) : exp(%s) / ((%s)1 + exp(%s)))", x, m, m, x,
                 x, m, x);
        if (n->op == TB_OP_SILU) {
            snprintf(e, sizeof e, "(%s)(%s * %s)", t, x, sg);
        } else {
            snprintf(e, sizeof e, "(%s)%s", t, sg);
        }
        break;
    }
    case TB_OP_RELU:
        if (od == TB_U8 || od == TB_BOOL) {
            snprintf(e, sizeof e, "%s", a);
        } else {
            snprintf(e, sizeof e, "(%s < (%s)0 ? (%s)0 : %s)", a, t, t, a);
        }
        break;
    case TB_OP_GELU: {
        char half[32], r2[32];
        tb__cg_flit(od == TB_F32 && !g->fast_f64 ? TB_F32 : TB_F64, 0.5, half, sizeof half);
        tb__cg_flit(od == TB_F32 && !g->fast_f64 ? TB_F32 : TB_F64, 0.70710678118654752440, r2,
                    sizeof r2);
        snprintf(e, sizeof e, "(%s)(%s * (%s)%s * ((%s)1 + erf((%s)%s * %s)))", t, half, m, a, m, m,
                 a, r2);
        break;
    }
    case TB_OP_RECIPROCAL:
        snprintf(e, sizeof e, "(%s)1 / %s", t, a);
        break;
    case TB_OP_FLOOR:
    case TB_OP_CEIL:
    case TB_OP_ROUND:
        if (fl) {
            snprintf(e, sizeof e, "%s(%s)",
                     n->op == TB_OP_FLOOR ? "floor" : (n->op == TB_OP_CEIL ? "ceil" : "rint"), a);
        } else {
            snprintf(e, sizeof e, "%s", a);
        }
        break;
    case TB_OP_SIGN:
        if (od == TB_BOOL) {
            snprintf(e, sizeof e, "%s", a);
        } else {
            snprintf(e, sizeof e, "(%s)((%s > (%s)0) - (%s < (%s)0))", t, a, t, a, t);
        }
        break;
    case TB_OP_LOGICAL_NOT:
        snprintf(e, sizeof e, "(uchar)(%s == 0)", a);
        break;
    case TB_OP_CAST:
        if (od == TB_BOOL) {
            snprintf(e, sizeof e, "(uchar)(%s != 0)", a);
        } else if (afl && !fl) {
            /* truncation toward zero saturating at the int64 range, NaN 0, then wrapping */
            snprintf(e, sizeof e, "(%s)tb_f2i_%s(%s)", t, ad == TB_F64 ? "f64" : "f32", a);
        } else {
            snprintf(e, sizeof e, "(%s)%s", t, a);
        }
        break;
    case TB_OP_ADD:
    case TB_OP_SUB:
    case TB_OP_MUL: {
        const char *op = n->op == TB_OP_ADD ? "+" : (n->op == TB_OP_SUB ? "-" : "*");
        if (fl) {
            snprintf(e, sizeof e, "%s %s %s", a, op, b);
        } else if (od == TB_BOOL) {
            snprintf(e, sizeof e, "(uchar)((%s %s %s) != 0)", a, op, b);
        } else {
            snprintf(e, sizeof e, "(%s)((%s)%s %s (%s)%s)", t, u, a, op, u, b);
        }
        break;
    }
    case TB_OP_DIV:
        snprintf(e, sizeof e, "%s / %s", a, b);
        break;
    case TB_OP_POW:
        if (fl) {
            snprintf(e, sizeof e, "(%s)pow((%s)%s, (%s)%s)", t, m, a, m, b);
        } else {
            int32_t code = tb__cg_errsite(g, TB_OP_POW, 0, 0);
            if (code < 0) return -1;
            tb__cg_line(g,
                        "if (%s < 0) { tb_err[0] = %d; tb_err[1] = (long)%s; tb_err[2] = "
                        "(long)%s; }",
                        b, (int)code, a, b);
            snprintf(e, sizeof e, "(%s)tb_ipow((long)%s, (long)%s)", t, a, b);
        }
        break;
    case TB_OP_MAXIMUM:
    case TB_OP_MINIMUM: {
        const char *cmp = n->op == TB_OP_MAXIMUM ? ">" : "<";
        if (fl) {
            snprintf(e, sizeof e, "((%s %s %s || isnan(%s)) ? %s : %s)", a, cmp, b, a, a, b);
        } else {
            snprintf(e, sizeof e, "(%s %s %s ? %s : %s)", a, cmp, b, a, b);
        }
        break;
    }
    case TB_OP_EQ:
    case TB_OP_NE:
    case TB_OP_LT:
    case TB_OP_LE:
    case TB_OP_GT:
    case TB_OP_GE: {
        const char *cmp = n->op == TB_OP_EQ   ? "=="
                          : n->op == TB_OP_NE ? "!="
                          : n->op == TB_OP_LT ? "<"
                          : n->op == TB_OP_LE ? "<="
                          : n->op == TB_OP_GT ? ">"
                                              : ">=";
        snprintf(e, sizeof e, "(uchar)(%s %s %s)", a, cmp, b);
        break;
    }
    case TB_OP_LOGICAL_AND:
        snprintf(e, sizeof e, "(uchar)(%s != 0 && %s != 0)", a, b);
        break;
    case TB_OP_LOGICAL_OR:
        snprintf(e, sizeof e, "(uchar)(%s != 0 || %s != 0)", a, b);
        break;
    case TB_OP_WHERE:
        snprintf(e, sizeof e, "(%s != 0 ? %s : %s)", a, b, c);
        break;
    case TB_OP_CLAMP: {
        int32_t lo = tb__cg_new_val(g, od);
        if (lo < 0) return -1;
        if (fl) {
            tb__cg_line(g, "const %s v%d = ((%s > %s || isnan(%s)) ? %s : %s);", t, (int)lo, a, b,
                        a, a, b);
            snprintf(e, sizeof e, "((v%d < %s || isnan(v%d)) ? v%d : %s)", (int)lo, c, (int)lo,
                     (int)lo, c);
        } else {
            tb__cg_line(g, "const %s v%d = (%s < %s ? %s : %s);", t, (int)lo, a, b, b, a);
            snprintf(e, sizeof e, "(v%d > %s ? %s : v%d)", (int)lo, c, c, (int)lo);
        }
        break;
    }
    case TB_OP_RAND:
    case TB_OP_RANDN: {
        char flat[TB__LF_TEXT];
        if (!tb__cg_need_flat(g, pos)) return -1;
        tb__cg_lf_text(&g->pos[pos].flat, flat, sizeof flat);
        snprintf(e, sizeof e, "tb_%s_%s((ulong)%s, (ulong)%s, (ulong)(%s))",
                 n->op == TB_OP_RAND ? "rand" : "randn", od == TB_F64 ? "f64" : "f32", a, b, flat);
        break;
    }
    default:
        tb__cg_fail(g, tb__error(TB_ERR_INTERNAL, "opencl: no code for op %s",
                                 tb_op_name(n->op) != NULL ? tb_op_name(n->op) : "?"));
        return -1;
    }
    v = tb__cg_new_val(g, od);
    if (v < 0) return -1;
    tb__cg_line(g, "const %s v%d = %s;", t, (int)v, e);
    return v;
}

/* The value of `node` at `pos`: operands first (an explicit stack, so chains of any length do
   not recurse), each (node, position) emitted once per scope. */
static int32_t tb__cg_eval(tb__cg *g, int32_t node, int32_t pos) {
    size_t fbase = g->num_frames, sbase = g->num_stack;
    int32_t v;
    if (pos < 0 || g->status != TB_OK) return -1;
    if (!tb__cg_push_frame(g, node, pos)) return -1;
    while (g->num_frames > fbase) {
        tb__cg_frame *f = &g->frames[g->num_frames - 1];
        int32_t fnode = f->node, fpos = f->pos;
        const tb_node *n = g->L->info[fnode].node;
        if (g->status != TB_OK || g->L->restart) goto fail;
        if (f->state == 0) {
            v = tb__cg_memo_find(g, TB__MEMO_VALUE, fnode, fpos, 0);
            if (v < 0) {
                bool handled = false;
                v = tb__cg_special(g, fnode, fpos, &handled);
                if (!handled) {
                    f->state = 1;
                    f->vbase = (int32_t)g->num_stack;
                    continue;
                }
                if (v < 0) goto fail;
                tb__cg_memo_add(g, TB__MEMO_VALUE, fnode, fpos, 0, v);
                if (!tb__cg_count(g, fnode)) goto fail;
            }
            g->num_frames--;
            if (!tb__cg_push_value(g, v)) goto fail;
            continue;
        }
        if ((uint32_t)(f->state - 1) < n->num_operands) {
            size_t k = (size_t)(f->state - 1);
            int32_t cp;
            f->state++;
            cp = tb__cg_operand_pos(g, fnode, fpos, k);
            if (cp < 0) goto fail;
            if (!tb__cg_push_frame(g, tb__ocl_operand(g->L, fnode, k), cp)) goto fail;
            continue;
        }
        v = tb__cg_emit_op(g, fnode, fpos, &g->stack[f->vbase], n->num_operands);
        if (v < 0 || !tb__cg_count(g, fnode)) goto fail;
        g->num_stack = (size_t)g->frames[g->num_frames - 1].vbase;
        tb__cg_memo_add(g, TB__MEMO_VALUE, fnode, fpos, 0, v);
        g->num_frames--;
        if (!tb__cg_push_value(g, v)) goto fail;
    }
    v = g->stack[--g->num_stack];
    return v;
fail:
    g->num_frames = fbase;
    g->num_stack = sbase;
    if (g->status == TB_OK && !g->L->restart) tb__cg_fail(g, TB_ERR_INTERNAL);
    return -1;
}

/* ---- code generation: kernels ---- */

static void tb__cg_reset(tb__cg *g, int32_t kernel) {
    tb__str_free(&g->body);
    memset(&g->body, 0, sizeof g->body);
    g->kernel = kernel;
    g->indent = 1;
    g->num_vars = g->num_vals = g->num_pos = g->num_memo = g->num_undo = 0;
    g->num_scopes = g->num_frames = g->num_stack = 0;
    g->depth = 0;
    g->ops = 0;
    while (g->num_touched > 0)
        g->evals[g->touched[--g->num_touched]] = 0;
    memset(g->pos_head, 0xff, sizeof g->pos_head);
    memset(g->memo_head, 0xff, sizeof g->memo_head);
}

static void tb__cg_free(tb__cg *g) {
    tb__str_free(&g->body);
    tb__free(g->vars);
    tb__free(g->val_dtype);
    tb__free(g->pos);
    tb__free(g->memo);
    tb__free(g->undo);
    tb__free(g->scopes);
    tb__free(g->frames);
    tb__free(g->stack);
    tb__free(g->evals);
    tb__free(g->touched);
}

/* Work-group size for a kernel with one group per row of `len` elements, or 1 for one work
   item per row. `inner`: the row is contiguous in memory (lanes of a group read neighbours). */
static int64_t tb__cg_pick_group(const tb__cg *g, int64_t rows, int64_t len, bool inner) {
    const tb_device_info *d = &g->L->dev->info;
    int64_t maxg = d->max_work_group_size < 256 ? (int64_t)d->max_work_group_size : 256, n = 1;
    if (len < 32) return 1;
    if (tb__ocl_codegen_cpu(g->L->dev)) {
        if (rows >= (int64_t)d->compute_units * 4) return 1;
        if (maxg > 64) maxg = 64;
    } else if (!inner && rows >= (int64_t)d->compute_units * 256) {
        return 1; /* neighbouring work items read neighbouring elements already */
    }
    while (n * 2 <= maxg && n * 2 <= len)
        n *= 2;
    return n;
}

static void tb__cg_local_reduce(tb__cg *g, int64_t groups, const char *var, const char *type,
                                const char *combine) {
    tb__cg_line(g, "red[lid] = %s;", var);
    tb__cg_line(g, "barrier(CLK_LOCAL_MEM_FENCE);");
    tb__cg_line(g, "for (int s = %d; s > 0; s >>= 1) {", (int)(groups / 2));
    tb__cg_line(g, "    if (lid < s) {");
    tb__cg_line(g, "        const %s a = red[lid], b = red[lid + s];", type);
    tb__cg_line(g, "        red[lid] = %s;", combine);
    tb__cg_line(g, "    }");
    tb__cg_line(g, "    barrier(CLK_LOCAL_MEM_FENCE);");
    tb__cg_line(g, "}");
    tb__cg_line(g, "%s = red[0];", var);
    tb__cg_line(g, "barrier(CLK_LOCAL_MEM_FENCE);");
}

/* The kernel's row index i<v> (one work item or one group per row). */
static int32_t tb__cg_row_header(tb__cg *g, tb__ocl_kernel *k, int64_t rows, int64_t group) {
    int32_t v = tb__cg_new_var(g, 0, rows > 0 ? rows - 1 : 0);
    if (v < 0) return -1;
    k->work_dim = 1;
    if (group == 1) {
        k->items = (uint64_t)rows;
        tb__cg_line(g, "const long i%d = (long)get_global_id(0);", (int)v);
        tb__cg_line(g, "if (i%d >= %lldL) return;", (int)v, (long long)rows);
    } else {
        k->group_size[0] = (size_t)group;
        k->group_size[1] = k->group_size[2] = 1;
        k->groups[0] = (size_t)rows;
        k->groups[1] = k->groups[2] = 1;
        tb__cg_line(g, "const long i%d = (long)get_group_id(0);", (int)v);
        tb__cg_line(g, "const int lid = (int)get_local_id(0);");
    }
    return v;
}

static int32_t tb__cg_var_pos_flat(tb__cg *g, const tb_shape *shape, int32_t var, int64_t scale,
                                   int32_t var2) {
    tb__lf lf;
    tb__lf_const(&lf, 0);
    tb__lf_add_term(&lf, var, scale);
    if (var2 >= 0) tb__lf_add_term(&lf, var2, 1);
    return tb__cg_pos_flat(g, shape, &lf);
}

static tb_status tb__cg_kernel_elementwise(tb__cg *g, tb__ocl_kernel *k) {
    const tb_node *root = g->L->info[k->root].node;
    int64_t n = tb__ocl_numel(&root->shape);
    int32_t i0, v;
    i0 = tb__cg_row_header(g, k, n, 1);
    if (i0 < 0) return g->status;
    v = tb__cg_eval(g, k->root, tb__cg_var_pos_flat(g, &root->shape, i0, 1, -1));
    if (v < 0) return g->status;
    tb__cg_line(g, "out[i%d] = v%d;", (int)i0, (int)v);
    k->flops = g->ops * (double)n;
    return TB_OK;
}

/* The operand's position of a reduction or norm: the output's dims for the kept axes, the
   loop's index for the reduced ones. */
static int32_t tb__cg_split_pos(tb__cg *g, const tb_shape *xs, uint64_t mask, bool keepdim,
                                int32_t out_pos, const tb__lf *red) {
    tb__lf dims[TB_MAX_RANK];
    const tb__pos *p = &g->pos[out_pos];
    int32_t a, oi = 0, ri = 0;
    for (a = 0; a < xs->rank; a++) {
        if ((mask >> a) & 1u) {
            dims[a] = red[ri++];
            if (keepdim) oi++;
        } else {
            dims[a] = p->dim[oi++];
        }
    }
    return tb__cg_pos_multi(g, xs, dims);
}

/* Independent accumulators per work item of a CPU reduction loop. */
#define TB__CG_LANES 8

/* What a reduction loop reads: the operand x at (output row, reduction index). */
typedef struct tb__cg_red {
    int32_t x, row, out_pos;
    const tb_shape *xs, *red;
    uint64_t mask;
    bool keepdim, suffix;
    int64_t m;
    tb_op op;
    tb_dtype xd;
    const char *acc_t;
} tb__cg_red;

/* The value of x at reduction index i<r> + lane of the current row. */
static int32_t tb__cg_red_value(tb__cg *g, const tb__cg_red *rd, int32_t r, int64_t lane) {
    tb__lf lf;
    int32_t xp;
    tb__lf_const(&lf, lane);
    if (rd->suffix) {
        tb__lf_add_term(&lf, rd->row, rd->m);
        tb__lf_add_term(&lf, r, 1);
        xp = tb__cg_pos_flat(g, rd->xs, &lf);
    } else {
        tb__lf rl[TB_MAX_RANK];
        int32_t rp;
        tb__lf_add_term(&lf, r, 1);
        rp = tb__cg_pos_flat(g, rd->red, &lf);
        if (rp < 0 || !tb__cg_need_multi(g, rp)) return -1;
        memcpy(rl, g->pos[rp].dim, sizeof rl);
        xp = tb__cg_split_pos(g, rd->xs, rd->mask, rd->keepdim, rd->out_pos, rl);
    }
    if (xp < 0) return -1;
    return tb__cg_eval(g, rd->x, xp);
}

/* Accumulator `lane` of a reduction loop: acc, acc1, acc2, ... */
static void tb__cg_acc_name(char *buf, size_t cap, int32_t lane) {
    if (lane == 0)
        snprintf(buf, cap, "acc");
    else
        snprintf(buf, cap, "acc%d", (int)lane);
}

/* Folds value v<vx> (at reduction index i<r>) into the accumulator named `acc`. */
static void tb__cg_red_step(tb__cg *g, const tb__cg_red *rd, int32_t vx, int32_t r,
                            const char *acc) {
    bool is_max = rd->op == TB_OP_MAX || rd->op == TB_OP_ARGMAX;
    const char *cmp = is_max ? ">" : "<";
    switch (rd->op) {
    case TB_OP_SUM:
    case TB_OP_MEAN:
        tb__cg_line(g, "%s += (%s)v%d;", acc, rd->acc_t, (int)vx);
        break;
    case TB_OP_PROD:
        tb__cg_line(g, "%s *= (%s)v%d;", acc, rd->acc_t, (int)vx);
        break;
    case TB_OP_MAX:
    case TB_OP_MIN:
        if (tb_dtype_is_float(rd->xd)) {
            tb__cg_line(g, "if (v%d %s %s || isnan(v%d)) %s = v%d;", (int)vx, cmp, acc, (int)vx,
                        acc, (int)vx);
        } else {
            tb__cg_line(g, "if (v%d %s %s) %s = v%d;", (int)vx, cmp, acc, acc, (int)vx);
        }
        break;
    default:
        if (tb_dtype_is_float(rd->xd)) {
            tb__cg_line(g,
                        "if (bi < 0 || v%d %s best || (isnan(v%d) && !isnan(best))) { best = v%d; "
                        "bi = i%d; }",
                        (int)vx, cmp, (int)vx, (int)vx, (int)r);
        } else {
            tb__cg_line(g, "if (bi < 0 || v%d %s best) { best = v%d; bi = i%d; }", (int)vx, cmp,
                        (int)vx, (int)r);
        }
        break;
    }
}

/* A reduction: one work item or one work-group per output, or, when the reduction is split,
   the partial stage (one per chunk of a row, raw accumulators out) or the final stage
   (combines the chunks of its row, then finishes and runs the epilogue). */
static tb_status tb__cg_kernel_reduce(tb__cg *g, tb__ocl_kernel *k) {
    tb__ocl_lower *L = g->L;
    const tb_node *cn = L->info[k->core].node;
    int32_t x = tb__ocl_operand(L, k->core, 0);
    const tb_shape *xs = &L->info[x].node->shape, *cs = &cn->shape;
    bool is_arg = cn->op == TB_OP_ARGMAX || cn->op == TB_OP_ARGMIN;
    bool is_max = cn->op == TB_OP_MAX || cn->op == TB_OP_ARGMAX;
    bool partial = k->kind == TB__OCL_K_PARTIAL, final = !partial && k->split > 0;
    uint64_t mask = is_arg ? ((uint64_t)1 << cn->attrs[0]) : (uint64_t)cn->attrs[0];
    bool keepdim = cn->attrs[1] != 0, suffix = true, seen = false;
    int64_t n_out = tb__ocl_numel(cs), m = 1, group, rows, chunk = 0;
    tb_dtype xd = xs->dtype, od = cs->dtype;
    const char *xt = tb__ocl_ctype(xd), *t = tb__ocl_ctype(od), *acc_t;
    const char *combine_local = "a + b";
    tb_shape red;
    int32_t a, i0, row, r, out_pos, vx, vf, vr, ci = -1;
    char head[384], from[64], to[96];
    memset(&red, 0, sizeof red);
    red.dtype = xd;
    for (a = 0; a < xs->rank; a++) {
        if ((mask >> a) & 1u) {
            red.dims[red.rank++] = xs->dims[a];
            m *= xs->dims[a];
            seen = true;
        } else if (seen) {
            suffix = false;
        }
    }
    if (cn->op == TB_OP_SUM || cn->op == TB_OP_MEAN || cn->op == TB_OP_PROD) {
        acc_t = tb_dtype_is_float(od) ? tb__cg_acc_type(g, od) : tb__ocl_utype(od);
    } else {
        acc_t = xt;
    }
    if (cn->op == TB_OP_PROD) combine_local = "a * b";
    if (cn->op == TB_OP_MAX)
        combine_local = tb_dtype_is_float(xd) ? "((b > a || isnan(b)) ? b : a)" : "(b > a ? b : a)";
    if (cn->op == TB_OP_MIN)
        combine_local = tb_dtype_is_float(xd) ? "((b < a || isnan(b)) ? b : a)" : "(b < a ? b : a)";
    rows = n_out;
    if (partial) {
        rows = n_out * k->split;
        chunk = (m + k->split - 1) / k->split;
        group = tb__cg_pick_group(g, rows, chunk, suffix);
    } else {
        group = final ? 1 : tb__cg_pick_group(g, n_out, m, suffix);
    }
    i0 = tb__cg_row_header(g, k, rows, group);
    if (i0 < 0) return g->status;
    if (group > 1) {
        if (is_arg) {
            tb__cg_line(g, "__local %s redv[%d];", xt, (int)group);
            tb__cg_line(g, "__local long redi[%d];", (int)group);
        } else {
            tb__cg_line(g, "__local %s red[%d];", acc_t, (int)group);
        }
    }
    row = i0;
    if (partial) {
        row = tb__cg_new_var(g, 0, n_out - 1);
        ci = tb__cg_new_var(g, 0, k->split - 1);
        if (row < 0 || ci < 0) return g->status;
        tb__cg_line(g, "const long i%d = i%d / %d, i%d = i%d %% %d;", (int)row, (int)i0,
                    (int)k->split, (int)ci, (int)i0, (int)k->split);
    }
    out_pos = tb__cg_var_pos_flat(g, cs, row, 1, -1);
    if (out_pos < 0) return g->status;
    if (!final && !suffix && !tb__cg_need_multi(g, out_pos)) return g->status;
    switch (cn->op) {
    case TB_OP_SUM:
    case TB_OP_MEAN:
        tb__cg_line(g, "%s acc = 0;", acc_t);
        break;
    case TB_OP_PROD:
        tb__cg_line(g, "%s acc = 1;", acc_t);
        break;
    case TB_OP_MAX:
    case TB_OP_MIN: {
        const char *init;
        if (tb_dtype_is_float(xd)) {
            init = is_max ? "-INFINITY" : "INFINITY";
        } else if (xd == TB_I32) {
            init = is_max ? "INT_MIN" : "INT_MAX";
        } else if (xd == TB_I64) {
            init = is_max ? "LONG_MIN" : "LONG_MAX";
        } else {
            init = is_max ? "0" : "255";
        }
        tb__cg_line(g, "%s acc = %s;", acc_t, init);
        break;
    }
    default:
        tb__cg_line(g, "%s best = 0;", xt);
        tb__cg_line(g, "long bi = -1;");
        break;
    }
    if (final) {
        /* the partial results of this row, in chunk order */
        if (tb__cg_arg(g, TB__OCL_ARG_BUF, k->partial_slot) < 0) return g->status;
        tb__cg_line(g, "for (int c = 0; c < %d; c++) {", (int)k->split);
        tb__cg_line(g, "    const %s b = (%s)b%d[i%d * %d + c];", acc_t, acc_t,
                    (int)k->partial_slot, (int)i0, (int)k->split);
        tb__cg_line(g, "    const %s a = acc;", acc_t);
        tb__cg_line(g, "    acc = %s;", combine_local);
        tb__cg_line(g, "}");
    } else {
        tb__cg_red rd;
        int32_t lanes = 1;
        rd.x = x;
        rd.xs = xs;
        rd.red = &red;
        rd.mask = mask;
        rd.keepdim = keepdim;
        rd.suffix = suffix;
        rd.row = row;
        rd.m = m;
        rd.out_pos = out_pos;
        rd.op = cn->op;
        rd.xd = xd;
        rd.acc_t = acc_t;
        /* one work item per row or chunk on a CPU: independent accumulators, so the loop is
           not one long chain of dependent adds (or compares) */
        if (group == 1 && !is_arg && tb__ocl_codegen_cpu(L->dev) && m >= 4 * TB__CG_LANES)
            lanes = TB__CG_LANES;
        if (partial) {
            snprintf(from, sizeof from, "i%d * %lldL", (int)ci, (long long)chunk);
            snprintf(to, sizeof to, "min((i%d + 1) * %lldL, %lldL)", (int)ci, (long long)chunk,
                     (long long)m);
        } else {
            snprintf(from, sizeof from, "0L");
            snprintf(to, sizeof to, "%lldL", (long long)m);
        }
        if (lanes == 1) {
            r = tb__cg_new_var(g, 0, m > 0 ? m - 1 : 0);
            if (r < 0) return g->status;
            if (group == 1) {
                snprintf(head, sizeof head, "for (long i%d = %s; i%d < %s; i%d++) ", (int)r, from,
                         (int)r, to, (int)r);
            } else {
                snprintf(head, sizeof head, "for (long i%d = %s + lid; i%d < %s; i%d += %d) ",
                         (int)r, from, (int)r, to, (int)r, (int)group);
            }
            tb__cg_open(g, head);
            vx = tb__cg_red_value(g, &rd, r, 0);
            if (vx < 0) return g->status;
            tb__cg_red_step(g, &rd, vx, r, "acc");
            tb__cg_close(g, "");
        } else {
            int32_t lane, rt;
            tb__cg_open(g, "");
            for (lane = 1; lane < lanes; lane++)
                tb__cg_line(g, "%s acc%d = acc;", acc_t, (int)lane);
            tb__cg_line(g, "const long rs = %s, re = %s, rm = rs + ((re - rs) & ~%dL);", from, to,
                        (int)lanes - 1);
            r = tb__cg_new_var(g, 0, m - lanes);
            if (r < 0) return g->status;
            snprintf(head, sizeof head, "for (long i%d = rs; i%d < rm; i%d += %d) ", (int)r, (int)r,
                     (int)r, (int)lanes);
            tb__cg_open(g, head);
            for (lane = 0; lane < lanes; lane++) {
                char name[16];
                tb__cg_acc_name(name, sizeof name, lane);
                vx = tb__cg_red_value(g, &rd, r, lane);
                if (vx < 0) return g->status;
                tb__cg_red_step(g, &rd, vx, r, name);
            }
            tb__cg_close(g, "");
            rt = tb__cg_new_var(g, 0, m - 1);
            if (rt < 0) return g->status;
            snprintf(head, sizeof head, "for (long i%d = rm; i%d < re; i%d++) ", (int)rt, (int)rt,
                     (int)rt);
            tb__cg_open(g, head);
            vx = tb__cg_red_value(g, &rd, rt, 0);
            if (vx < 0) return g->status;
            tb__cg_red_step(g, &rd, vx, rt, "acc");
            tb__cg_close(g, "");
            /* pairwise: acc_j with acc_(j + half), halving */
            for (lane = lanes / 2; lane >= 1; lane /= 2) {
                int32_t j;
                for (j = 0; j < lane; j++) {
                    char dst[16], src[16];
                    tb__cg_acc_name(dst, sizeof dst, j);
                    tb__cg_acc_name(src, sizeof src, j + lane);
                    tb__cg_line(g, "{ const %s a = %s, b = %s; %s = %s; }", acc_t, dst, src, dst,
                                combine_local);
                }
            }
            tb__cg_close(g, "");
        }
    }
    if (group > 1) {
        if (is_arg) {
            const char *cmp = is_max ? ">" : "<";
            tb__cg_line(g, "redv[lid] = best;");
            tb__cg_line(g, "redi[lid] = bi;");
            tb__cg_line(g, "barrier(CLK_LOCAL_MEM_FENCE);");
            tb__cg_line(g, "for (int s = %d; s > 0; s >>= 1) {", (int)(group / 2));
            tb__cg_line(g, "    if (lid < s) {");
            tb__cg_line(g, "        const %s ov = redv[lid + s], cv = redv[lid];", xt);
            tb__cg_line(g, "        const long oi = redi[lid + s], ci = redi[lid];");
            if (tb_dtype_is_float(xd)) {
                tb__cg_line(g,
                            "        if (oi >= 0 && (ci < 0 || (isnan(ov) ? (!isnan(cv) || oi < "
                            "ci) : (!isnan(cv) && (ov %s cv || (ov == cv && oi < ci)))))) {",
                            cmp);
            } else {
                tb__cg_line(g,
                            "        if (oi >= 0 && (ci < 0 || ov %s cv || (ov == cv && oi < "
                            "ci))) {",
                            cmp);
            }
            tb__cg_line(g, "            redv[lid] = ov;");
            tb__cg_line(g, "            redi[lid] = oi;");
            tb__cg_line(g, "        }");
            tb__cg_line(g, "    }");
            tb__cg_line(g, "    barrier(CLK_LOCAL_MEM_FENCE);");
            tb__cg_line(g, "}");
            tb__cg_line(g, "bi = redi[0];");
        } else {
            tb__cg_local_reduce(g, group, "acc", acc_t, combine_local);
        }
        tb__cg_open(g, "if (lid == 0) ");
    }
    if (partial) {
        tb__cg_line(g, "out[i%d] = (%s)acc;", (int)i0,
                    tb__ocl_ctype(tb__cg_plan(g)->slots[k->out_slot].shape.dtype));
    } else {
        vf = tb__cg_new_val(g, od);
        if (vf < 0) return g->status;
        if (cn->op == TB_OP_MEAN) {
            tb__cg_line(g, "const %s v%d = (%s)(acc / (%s)%lld);", t, (int)vf, t, acc_t,
                        (long long)m);
        } else if (is_arg) {
            tb__cg_line(g, "const %s v%d = (%s)bi;", t, (int)vf, t);
        } else {
            tb__cg_line(g, "const %s v%d = (%s)acc;", t, (int)vf, t);
        }
        tb__cg_memo_add(g, TB__MEMO_VALUE, k->core, out_pos, 0, vf);
        vr = tb__cg_eval(g, k->root, out_pos);
        if (vr < 0) return g->status;
        tb__cg_line(g, "out[i%d] = v%d;", (int)i0, (int)vr);
    }
    if (group > 1) tb__cg_close(g, "");
    k->flops = final ? (double)k->split * (double)n_out : (g->ops + 1) * (double)m * (double)n_out;
    return TB_OK;
}

static tb_status tb__cg_kernel_norm(tb__cg *g, tb__ocl_kernel *k) {
    tb__ocl_lower *L = g->L;
    const tb_node *cn = L->info[k->core].node;
    int32_t x = tb__ocl_operand(L, k->core, 0), w = -1, b = -1;
    const tb_shape *xs = &L->info[x].node->shape, *cs = &cn->shape;
    bool layer = cn->op == TB_OP_LAYER_NORM;
    int32_t axis = layer ? xs->rank - 1 : (int32_t)cn->attrs[0], a, i0, pass;
    int64_t len = 1, rows, group, numel = tb__ocl_numel(xs);
    bool trailing = layer || axis == xs->rank - 1;
    tb_shape rowshape, inner;
    tb_dtype od = cs->dtype;
    const char *t = tb__ocl_ctype(od), *ct = tb__cg_acc_type(g, od);
    int32_t row_pos = -1;
    memset(&rowshape, 0, sizeof rowshape);
    memset(&inner, 0, sizeof inner);
    inner.dtype = rowshape.dtype = xs->dtype;
    if (layer) {
        int32_t nd = (int32_t)cn->attrs[0], next = 1;
        for (a = xs->rank - nd; a < xs->rank; a++) {
            len *= xs->dims[a];
            inner.dims[inner.rank++] = xs->dims[a];
        }
        if (cn->attrs[1] != 0) w = tb__ocl_operand(L, k->core, (size_t)next++);
        if (cn->attrs[2] != 0) b = tb__ocl_operand(L, k->core, (size_t)next++);
    } else {
        len = xs->dims[axis];
        for (a = 0; a < xs->rank; a++)
            if (a != axis) rowshape.dims[rowshape.rank++] = xs->dims[a];
    }
    rows = len > 0 ? numel / len : 0;
    group = tb__cg_pick_group(g, rows, len, trailing);
    i0 = tb__cg_row_header(g, k, rows, group);
    if (i0 < 0) return g->status;
    if (group > 1) tb__cg_line(g, "__local %s red[%d];", ct, (int)group);
    if (!trailing) {
        row_pos = tb__cg_var_pos_flat(g, &rowshape, i0, 1, -1);
        if (row_pos < 0 || !tb__cg_need_multi(g, row_pos)) return g->status;
    }
    if (layer) {
        tb__cg_line(g, "%s sum = 0, sqdev = 0;", ct);
    } else {
        tb__cg_line(g, "%s mx = -INFINITY, sm = 0;", ct);
    }
    for (pass = 0; pass < 3; pass++) {
        char head[128];
        int32_t j = tb__cg_new_var(g, 0, len > 0 ? len - 1 : 0), xp, vx;
        if (j < 0) return g->status;
        if (group == 1) {
            snprintf(head, sizeof head, "for (long i%d = 0; i%d < %lldL; i%d++) ", (int)j, (int)j,
                     (long long)len, (int)j);
        } else {
            snprintf(head, sizeof head, "for (long i%d = lid; i%d < %lldL; i%d += %d) ", (int)j,
                     (int)j, (long long)len, (int)j, (int)group);
        }
        tb__cg_open(g, head);
        if (trailing) {
            xp = tb__cg_var_pos_flat(g, xs, i0, len, j);
        } else {
            tb__lf dims[TB_MAX_RANK];
            int32_t ri = 0;
            for (a = 0; a < xs->rank; a++) {
                if (a == axis) {
                    tb__lf_const(&dims[a], 0);
                    tb__lf_add_term(&dims[a], j, 1);
                } else {
                    dims[a] = g->pos[row_pos].dim[ri++];
                }
            }
            xp = tb__cg_pos_multi(g, xs, dims);
        }
        vx = tb__cg_eval(g, x, xp);
        if (vx < 0) return g->status;
        if (pass == 0) {
            if (layer) {
                tb__cg_line(g, "sum += (%s)v%d;", ct, (int)vx);
            } else {
                tb__cg_line(g, "if ((%s)v%d > mx || isnan(v%d)) mx = (%s)v%d;", ct, (int)vx,
                            (int)vx, ct, (int)vx);
            }
        } else if (pass == 1) {
            if (layer) {
                tb__cg_line(g, "const %s dv = (%s)v%d - mean;", ct, ct, (int)vx);
                tb__cg_line(g, "sqdev += dv * dv;");
            } else {
                tb__cg_line(g, "sm += (%s)exp(v%d - (%s)mx);", ct, (int)vx, t);
            }
        } else {
            int32_t vf = tb__cg_new_val(g, od), vr;
            char flat[TB__LF_TEXT];
            if (vf < 0) return g->status;
            if (layer) {
                tb__cg_line(g, "%s y = ((%s)v%d - mean) * rstd;", ct, ct, (int)vx);
                if (w >= 0) {
                    int32_t vw = tb__cg_eval(
                        g, w, tb__cg_var_pos_flat(g, &L->info[w].node->shape, j, 1, -1));
                    if (vw < 0) return g->status;
                    tb__cg_line(g, "y = y * (%s)v%d;", ct, (int)vw);
                }
                if (b >= 0) {
                    int32_t vb = tb__cg_eval(
                        g, b, tb__cg_var_pos_flat(g, &L->info[b].node->shape, j, 1, -1));
                    if (vb < 0) return g->status;
                    tb__cg_line(g, "y = y + (%s)v%d;", ct, (int)vb);
                }
                tb__cg_line(g, "const %s v%d = (%s)y;", t, (int)vf, t);
            } else if (cn->op == TB_OP_SOFTMAX) {
                tb__cg_line(g, "const %s v%d = (%s)((%s)exp(v%d - (%s)mx) / sm);", t, (int)vf, t,
                            ct, (int)vx, t);
            } else {
                tb__cg_line(g, "const %s v%d = (%s)((%s)v%d - mx - lse);", t, (int)vf, t, ct,
                            (int)vx);
            }
            tb__cg_memo_add(g, TB__MEMO_VALUE, k->core, xp, 0, vf);
            vr = tb__cg_eval(g, k->root, xp);
            if (vr < 0 || !tb__cg_need_flat(g, xp)) return g->status;
            tb__cg_lf_text(&g->pos[xp].flat, flat, sizeof flat);
            tb__cg_line(g, "out[%s] = v%d;", flat, (int)vr);
        }
        tb__cg_close(g, "");
        if (pass == 0) {
            if (group > 1) {
                if (layer) {
                    tb__cg_local_reduce(g, group, "sum", ct, "a + b");
                } else {
                    tb__cg_local_reduce(g, group, "mx", ct, "((b > a || isnan(b)) ? b : a)");
                }
            }
            if (layer) tb__cg_line(g, "const %s mean = sum / (%s)%lld;", ct, ct, (long long)len);
        } else if (pass == 1) {
            char eps[64];
            if (group > 1) tb__cg_local_reduce(g, group, layer ? "sqdev" : "sm", ct, "a + b");
            if (layer) {
                tb__cg_flit(strcmp(ct, "double") == 0 ? TB_F64 : TB_F32, cn->fattrs[0], eps,
                            sizeof eps);
                tb__cg_line(g, "const %s rstd = (%s)1 / sqrt(sqdev / (%s)%lld + %s);", ct, ct, ct,
                            (long long)len, eps);
            } else if (cn->op == TB_OP_LOG_SOFTMAX) {
                tb__cg_line(g, "const %s lse = log(sm);", ct);
            }
        }
    }
    k->flops = (g->ops + 8) * (double)numel;
    return TB_OK;
}

/* Matmul for CPU devices: no local memory (the caches tile), each work item an RM x RN block
   of the output from registers, operands read at clamped rows and columns (always in bounds;
   the epilogue writes only the real ones). */
/* The store of one accumulator acc[ii][jj] of a matmul kernel at row gr, column gc (the caller
   has emitted both and opened the bounds check): the kernel's fused consumers run on the value
   and the result goes to out. Shared by the CPU and GPU matmul kernels. False when code
   generation stopped (g->status says why, if it failed). */
static bool tb__cg_matmul_store(tb__cg *g, tb__ocl_kernel *k, const tb__lf *bdims) {
    const tb_shape *cs = &g->L->info[k->core].node->shape;
    int32_t r = cs->rank, nb = r - 2, d;
    int64_t M = cs->dims[r - 2], N = cs->dims[r - 1];
    tb_dtype od = cs->dtype;
    const char *t = tb__ocl_ctype(od);
    tb__lf dims[TB_MAX_RANK];
    char flat[TB__LF_TEXT];
    int32_t vr = tb__cg_new_var(g, 0, M - 1), vc = tb__cg_new_var(g, 0, N - 1), p, vf, v;
    if (vr < 0 || vc < 0) return false;
    tb__cg_line(g, "const long i%d = gr, i%d = gc;", (int)vr, (int)vc);
    for (d = 0; d < nb; d++)
        dims[d] = bdims[d];
    tb__lf_const(&dims[r - 2], 0);
    tb__lf_add_term(&dims[r - 2], vr, 1);
    tb__lf_const(&dims[r - 1], 0);
    tb__lf_add_term(&dims[r - 1], vc, 1);
    p = tb__cg_pos_multi(g, cs, dims);
    vf = tb__cg_new_val(g, od);
    if (p < 0 || vf < 0) return false;
    tb__cg_line(g, "const %s v%d = (%s)acc[ii][jj];", t, (int)vf, t);
    tb__cg_memo_add(g, TB__MEMO_VALUE, k->core, p, 0, vf);
    v = tb__cg_eval(g, k->root, p);
    if (v < 0 || !tb__cg_need_flat(g, p)) return false;
    tb__cg_lf_text(&g->pos[p].flat, flat, sizeof flat);
    tb__cg_line(g, "out[%s] = v%d;", flat, (int)v);
    return true;
}

/* The batch index variable of a matmul kernel's output (i<var> given) as per-dim forms of
   the batch dims, in bdims. */
static bool tb__cg_batch_dims(tb__cg *g, const tb_shape *cs, int32_t var, tb__lf *bdims) {
    tb_shape bshape;
    int32_t d, bpos;
    if (cs->rank <= 2) return true;
    memset(&bshape, 0, sizeof bshape);
    bshape.dtype = cs->dtype;
    for (d = 0; d + 2 < cs->rank; d++)
        bshape.dims[bshape.rank++] = cs->dims[d];
    bpos = tb__cg_var_pos_flat(g, &bshape, var, 1, -1);
    if (bpos < 0 || !tb__cg_need_multi(g, bpos)) return false;
    memcpy(bdims, g->pos[bpos].dim, sizeof(tb__lf) * TB_MAX_RANK);
    return true;
}

static tb_status tb__cg_kernel_matmul_cpu(tb__cg *g, tb__ocl_kernel *k) {
    tb__ocl_lower *L = g->L;
    const tb_node *cn = L->info[k->core].node;
    int32_t ia = tb__ocl_operand(L, k->core, 0), ib = tb__ocl_operand(L, k->core, 1);
    const tb_shape *as = &L->info[ia].node->shape, *bs = &L->info[ib].node->shape;
    const tb_shape *cs = &cn->shape;
    int32_t r = cs->rank, d, i0, nb = r - 2, kv, i, j;
    int32_t rows[8], cols[8], va[8], vb[8];
    tb__ocl_mm mm = tb__ocl_mm_of(L, k->core);
    int64_t M = mm.m, N = mm.n, K = mm.k, batch = mm.batch;
    int rm = M < 8 ? (int)M : 8, rn = N < 8 ? (int)N : 8, lx = 8, ly = 4;
    tb_dtype od = cs->dtype;
    const char *t = tb__ocl_ctype(od);
    const char *acc_t = tb_dtype_is_float(od) ? t : tb__ocl_utype(od);
    tb__lf bdims[TB_MAX_RANK];
    char head[160];
    if (rm < 1) rm = 1;
    if (rn < 1) rn = 1;
    k->work_dim = 3;
    k->group_size[0] = (size_t)lx;
    k->group_size[1] = (size_t)ly;
    k->group_size[2] = 1;
    k->groups[0] = (size_t)(((N + rn - 1) / rn + lx - 1) / lx);
    k->groups[1] = (size_t)(((M + rm - 1) / rm + ly - 1) / ly);
    k->groups[2] = (size_t)batch;
    tb__cg_line(
        g, "const long col0 = (long)get_global_id(0) * %d, row0 = (long)get_global_id(1) * %d;", rn,
        rm);
    i0 = tb__cg_new_var(g, 0, batch > 0 ? batch - 1 : 0);
    if (i0 < 0) return g->status;
    tb__cg_line(g, "const long i%d = (long)get_global_id(2);", (int)i0);
    if (!tb__cg_batch_dims(g, cs, i0, bdims)) return g->status;
    for (i = 0; i < rm; i++) {
        rows[i] = tb__cg_new_var(g, 0, M - 1);
        if (rows[i] < 0) return g->status;
        tb__cg_line(g, "const long i%d = min(row0 + %d, %lldL);", (int)rows[i], i,
                    (long long)(M - 1));
    }
    for (j = 0; j < rn; j++) {
        cols[j] = tb__cg_new_var(g, 0, N - 1);
        if (cols[j] < 0) return g->status;
        tb__cg_line(g, "const long i%d = min(col0 + %d, %lldL);", (int)cols[j], j,
                    (long long)(N - 1));
    }
    tb__cg_line(g, "%s acc[%d][%d];", acc_t, rm, rn);
    tb__cg_line(g, "for (int ii = 0; ii < %d; ii++)", rm);
    tb__cg_line(g, "    for (int jj = 0; jj < %d; jj++) acc[ii][jj] = 0;", rn);
    kv = tb__cg_new_var(g, 0, K > 0 ? K - 1 : 0);
    if (kv < 0) return g->status;
    snprintf(head, sizeof head, "for (long i%d = 0; i%d < %lldL; i%d++) ", (int)kv, (int)kv,
             (long long)K, (int)kv);
    tb__cg_open(g, head);
    for (j = 0; j < rn; j++) {
        tb__lf dims[TB_MAX_RANK];
        for (d = 0; d < nb; d++)
            dims[d] = bdims[d];
        tb__lf_const(&dims[r - 2], 0);
        tb__lf_add_term(&dims[r - 2], kv, 1);
        tb__lf_const(&dims[r - 1], 0);
        tb__lf_add_term(&dims[r - 1], cols[j], 1);
        vb[j] = tb__cg_eval(g, ib, tb__cg_pos_multi(g, bs, dims));
        if (vb[j] < 0) return g->status;
    }
    for (i = 0; i < rm; i++) {
        tb__lf dims[TB_MAX_RANK];
        for (d = 0; d < nb; d++)
            dims[d] = bdims[d];
        tb__lf_const(&dims[r - 2], 0);
        tb__lf_add_term(&dims[r - 2], rows[i], 1);
        tb__lf_const(&dims[r - 1], 0);
        tb__lf_add_term(&dims[r - 1], kv, 1);
        va[i] = tb__cg_eval(g, ia, tb__cg_pos_multi(g, as, dims));
        if (va[i] < 0) return g->status;
    }
    for (i = 0; i < rm; i++) {
        for (j = 0; j < rn; j++) {
            if (tb_dtype_is_float(od)) {
                tb__cg_line(g, "acc[%d][%d] += v%d * v%d;", i, j, (int)va[i], (int)vb[j]);
            } else {
                tb__cg_line(g, "acc[%d][%d] += (%s)v%d * (%s)v%d;", i, j, acc_t, (int)va[i], acc_t,
                            (int)vb[j]);
            }
        }
    }
    tb__cg_close(g, "");
    snprintf(head, sizeof head, "for (int ii = 0; ii < %d; ii++) for (int jj = 0; jj < %d; jj++) ",
             rm, rn);
    tb__cg_open(g, head);
    tb__cg_line(g, "const long gr = row0 + ii, gc = col0 + jj;");
    snprintf(head, sizeof head, "if (gr < %lldL && gc < %lldL) ", (long long)M, (long long)N);
    tb__cg_open(g, head);
    if (!tb__cg_matmul_store(g, k, bdims)) return g->status;
    tb__cg_close(g, "");
    tb__cg_close(g, "");
    k->flops = 2.0 * (double)M * (double)N * (double)K * (double)batch;
    return TB_OK;
}

/* A pack kernel: one work item per element of the panels. Element (b, panel, k, lane) is the
   operand at batch b, depth k and row (A) or column (B) panel * width + lane, clamped to the
   last one (the matmul never stores what the padding computes). */
static tb_status tb__cg_kernel_pack(tb__cg *g, tb__ocl_kernel *k) {
    tb__ocl_lower *L = g->L;
    bool is_a = k->kind == TB__OCL_K_PACK_A;
    int32_t x = tb__ocl_operand(L, k->core, is_a ? 0 : 1);
    const tb_shape *xs = &L->info[x].node->shape, *cs = &L->info[k->core].node->shape;
    int32_t r = cs->rank, d, i0, ib, ik, il, v;
    int64_t z[6], len, K, blocks, width;
    tb__lf bdims[TB_MAX_RANK], dims[TB_MAX_RANK];
    tb__ocl_pack_sizes(L, k, is_a, z);
    K = z[3];
    blocks = z[4];
    width = z[5];
    len = is_a ? z[1] : z[2];
    /* lanes along dim 0 (neighbouring work items write neighbouring elements), K along dim
       1, batch x panels along dim 2 */
    k->work_dim = 3;
    k->group_size[0] = (size_t)width;
    k->group_size[1] = TB__OCL_PACK_GROUP_K;
    k->group_size[2] = 1;
    k->groups[0] = 1;
    k->groups[1] = (size_t)((K + TB__OCL_PACK_GROUP_K - 1) / TB__OCL_PACK_GROUP_K);
    k->groups[2] = (size_t)(z[0] * blocks);
    i0 = tb__cg_new_var(g, 0, z[0] * blocks - 1);
    ib = tb__cg_new_var(g, 0, z[0] - 1);
    ik = tb__cg_new_var(g, 0, K - 1);
    il = tb__cg_new_var(g, 0, len - 1);
    if (i0 < 0 || ib < 0 || ik < 0 || il < 0) return g->status;
    tb__cg_line(g, "const long lane = (long)get_global_id(0), i%d = (long)get_global_id(1);",
                (int)ik);
    tb__cg_line(g, "if (i%d >= %lldL) return;", (int)ik, (long long)K);
    tb__cg_line(g, "const long i%d = (long)get_global_id(2);", (int)i0);
    tb__cg_line(g, "const long i%d = i%d / %lldL;", (int)ib, (int)i0, (long long)blocks);
    tb__cg_line(g, "const long i%d = min(i%d %% %lldL * %lldL + lane, %lldL);", (int)il, (int)i0,
                (long long)blocks, (long long)width, (long long)(len - 1));
    if (!tb__cg_batch_dims(g, cs, ib, bdims)) return g->status;
    for (d = 0; d + 2 < r; d++)
        dims[d] = bdims[d];
    tb__lf_const(&dims[r - 2], 0);
    tb__lf_add_term(&dims[r - 2], is_a ? il : ik, 1);
    tb__lf_const(&dims[r - 1], 0);
    tb__lf_add_term(&dims[r - 1], is_a ? ik : il, 1);
    v = tb__cg_eval(g, x, tb__cg_pos_multi(g, xs, dims));
    if (v < 0) return g->status;
    tb__cg_line(g, "out[(i%d * %lldL + i%d) * %lldL + lane] = v%d;", (int)i0, (long long)K, (int)ik,
                (long long)width, (int)v);
    k->flops = g->ops * (double)(z[0] * blocks * K * width);
    return TB_OK;
}

/* Matmul from the panels of the two pack kernels before it (CPU devices): each work item a
   TB__OCL_MM_ROWS x width block of the output, one vector accumulator per row; the inner loop
   reads one vector of B and TB__OCL_MM_ROWS consecutive values of A per step of K. */
static tb_status tb__cg_kernel_matmul_packed(tb__cg *g, tb__ocl_kernel *k) {
    tb__ocl_lower *L = g->L;
    const tb_shape *cs = &L->info[k->core].node->shape;
    int64_t za[6], zb[6], K;
    int rm = TB__OCL_MM_ROWS, vw, i;
    const char *t = tb__ocl_ctype(cs->dtype);
    char tv[16], head[160];
    int32_t ib;
    tb__lf bdims[TB_MAX_RANK];
    tb__ocl_pack_sizes(L, k, true, za);
    tb__ocl_pack_sizes(L, k, false, zb);
    K = za[3];
    vw = (int)zb[5];
    snprintf(tv, sizeof tv, "%s%d", t, vw);
    if (tb__cg_arg(g, TB__OCL_ARG_BUF, k->pack_slot[0]) < 0 ||
        tb__cg_arg(g, TB__OCL_ARG_BUF, k->pack_slot[1]) < 0)
        return g->status;
    k->work_dim = 3;
    k->group_size[0] = k->group_size[1] = k->group_size[2] = 1;
    k->groups[0] = (size_t)zb[4];
    k->groups[1] = (size_t)za[4];
    k->groups[2] = (size_t)za[0];
    ib = tb__cg_new_var(g, 0, za[0] - 1);
    if (ib < 0) return g->status;
    tb__cg_line(g, "const long pc = (long)get_global_id(0), pr = (long)get_global_id(1);");
    tb__cg_line(g, "const long i%d = (long)get_global_id(2);", (int)ib);
    tb__cg_line(g, "const long col0 = pc * %d, row0 = pr * %d;", vw, rm);
    tb__cg_line(g, "__global const %s *ap = b%d + (i%d * %lldL + pr) * %lldL;", t,
                (int)k->pack_slot[0], (int)ib, (long long)za[4], (long long)(K * rm));
    tb__cg_line(g, "__global const %s *bp = b%d + (i%d * %lldL + pc) * %lldL;", t,
                (int)k->pack_slot[1], (int)ib, (long long)zb[4], (long long)(K * vw));
    for (i = 0; i < rm; i++)
        tb__cg_line(g, "%s accv%d = 0;", tv, i);
    snprintf(head, sizeof head, "for (long kk = 0; kk < %lldL; kk++) ", (long long)K);
    tb__cg_open(g, head);
    tb__cg_line(g, "const %s bv = vload%d(kk, bp);", tv, vw);
    tb__cg_line(g, "__global const %s *ak = ap + kk * %d;", t, rm);
    for (i = 0; i < rm; i++)
        tb__cg_line(g, "accv%d += (%s)(ak[%d]) * bv;", i, tv, i);
    tb__cg_close(g, "");
    tb__cg_line(g, "%s acc[%d][%d];", t, rm, vw);
    for (i = 0; i < rm; i++)
        tb__cg_line(g, "vstore%d(accv%d, 0, acc[%d]);", vw, i, i);
    if (!tb__cg_batch_dims(g, cs, ib, bdims)) return g->status;
    snprintf(head, sizeof head, "for (int ii = 0; ii < %d; ii++) for (int jj = 0; jj < %d; jj++) ",
             rm, vw);
    tb__cg_open(g, head);
    tb__cg_line(g, "const long gr = row0 + ii, gc = col0 + jj;");
    snprintf(head, sizeof head, "if (gr < %lldL && gc < %lldL) ", (long long)za[1],
             (long long)za[2]);
    tb__cg_open(g, head);
    if (!tb__cg_matmul_store(g, k, bdims)) return g->status;
    tb__cg_close(g, "");
    tb__cg_close(g, "");
    k->flops = 2.0 * (double)za[1] * (double)za[2] * (double)K * (double)za[0];
    return TB_OK;
}

/* Matmul for GPUs: local-memory tiles. */
static tb_status tb__cg_kernel_matmul_gpu(tb__cg *g, tb__ocl_kernel *k) {
    tb__ocl_lower *L = g->L;
    const tb_node *cn = L->info[k->core].node;
    int32_t ia = tb__ocl_operand(L, k->core, 0), ib = tb__ocl_operand(L, k->core, 1);
    const tb_shape *as = &L->info[ia].node->shape, *bs = &L->info[ib].node->shape;
    const tb_shape *cs = &cn->shape;
    int32_t r = cs->rank, d, i0, nb = r - 2;
    tb__ocl_mm mm = tb__ocl_mm_of(L, k->core);
    int64_t M = mm.m, N = mm.n, K = mm.k, batch = mm.batch;
    int wx = 16, wy = 16, rm = 4, rn = 4, tk = 16, tm, tn;
    tb_dtype od = cs->dtype;
    const char *t = tb__ocl_ctype(od);
    const char *acc_t = tb_dtype_is_float(od) ? t : tb__ocl_utype(od);
    tb__lf bdims[TB_MAX_RANK];
    if (g->L->dev->info.max_work_group_size < 256) wx = wy = 8;
    if (M * N < 64 * 64 || M < 32 || N < 32) rm = rn = 1;
    tm = wy * rm;
    tn = wx * rn;
    k->work_dim = 3;
    k->group_size[0] = (size_t)wx;
    k->group_size[1] = (size_t)wy;
    k->group_size[2] = 1;
    k->groups[0] = (size_t)((N + tn - 1) / tn);
    k->groups[1] = (size_t)((M + tm - 1) / tm);
    k->groups[2] = (size_t)batch;
    tb__cg_line(g, "__local %s As[%d][%d];", t, tk, tm);
    tb__cg_line(g, "__local %s Bs[%d][%d];", t, tk, tn);
    tb__cg_line(g, "const int lx = (int)get_local_id(0), ly = (int)get_local_id(1);");
    tb__cg_line(g,
                "const long row0 = (long)get_group_id(1) * %d, col0 = (long)get_group_id(0) * %d;",
                tm, tn);
    i0 = tb__cg_new_var(g, 0, batch > 0 ? batch - 1 : 0);
    if (i0 < 0) return g->status;
    tb__cg_line(g, "const long i%d = (long)get_group_id(2);", (int)i0);
    if (!tb__cg_batch_dims(g, cs, i0, bdims)) return g->status;
    tb__cg_line(g, "%s acc[%d][%d];", acc_t, rm, rn);
    tb__cg_line(g, "for (int ii = 0; ii < %d; ii++)", rm);
    tb__cg_line(g, "    for (int jj = 0; jj < %d; jj++) acc[ii][jj] = 0;", rn);
    {
        char head[160];
        int side;
        snprintf(head, sizeof head, "for (long kt = 0; kt < %lldL; kt += %d) ", (long long)K, tk);
        tb__cg_open(g, head);
        for (side = 0; side < 2; side++) {
            const tb_shape *os = side == 0 ? as : bs;
            int32_t operand = side == 0 ? ia : ib, vr, vc, p, v;
            tb__lf dims[TB_MAX_RANK];
            int tile_rows = side == 0 ? tm : tk, tile_cols = side == 0 ? tk : tn;
            snprintf(head, sizeof head, "for (int l = ly * %d + lx; l < %d; l += %d) ", wx,
                     tile_rows * tile_cols, wx * wy);
            tb__cg_open(g, head);
            tb__cg_line(g, "const int lr = l / %d, lc = l %% %d;", tile_cols, tile_cols);
            if (side == 0) {
                tb__cg_line(g, "const long gr = row0 + lr, gc = kt + lc;");
            } else {
                tb__cg_line(g, "const long gr = kt + lr, gc = col0 + lc;");
            }
            tb__cg_line(g, "%s e = 0;", t);
            snprintf(head, sizeof head, "if (gr < %lldL && gc < %lldL) ",
                     (long long)(side == 0 ? M : K), (long long)(side == 0 ? K : N));
            tb__cg_open(g, head);
            vr = tb__cg_new_var(g, 0, (side == 0 ? M : K) - 1);
            vc = tb__cg_new_var(g, 0, (side == 0 ? K : N) - 1);
            if (vr < 0 || vc < 0) return g->status;
            tb__cg_line(g, "const long i%d = gr, i%d = gc;", (int)vr, (int)vc);
            for (d = 0; d < nb; d++)
                dims[d] = bdims[d];
            tb__lf_const(&dims[r - 2], 0);
            tb__lf_add_term(&dims[r - 2], vr, 1);
            tb__lf_const(&dims[r - 1], 0);
            tb__lf_add_term(&dims[r - 1], vc, 1);
            p = tb__cg_pos_multi(g, os, dims);
            v = tb__cg_eval(g, operand, p);
            if (v < 0) return g->status;
            tb__cg_line(g, "e = v%d;", (int)v);
            tb__cg_close(g, "");
            if (side == 0) {
                tb__cg_line(g, "As[lc][lr] = e;");
            } else {
                tb__cg_line(g, "Bs[lr][lc] = e;");
            }
            tb__cg_close(g, "");
        }
        tb__cg_line(g, "barrier(CLK_LOCAL_MEM_FENCE);");
        tb__cg_line(g, "for (int kk = 0; kk < %d; kk++) {", tk);
        tb__cg_line(g, "    %s ra[%d], rb[%d];", t, rm, rn);
        tb__cg_line(g, "    for (int ii = 0; ii < %d; ii++) ra[ii] = As[kk][ly + ii * %d];", rm,
                    wy);
        tb__cg_line(g, "    for (int jj = 0; jj < %d; jj++) rb[jj] = Bs[kk][lx + jj * %d];", rn,
                    wx);
        tb__cg_line(g, "    for (int ii = 0; ii < %d; ii++)", rm);
        if (tb_dtype_is_float(od)) {
            tb__cg_line(
                g, "        for (int jj = 0; jj < %d; jj++) acc[ii][jj] += ra[ii] * rb[jj];", rn);
        } else {
            tb__cg_line(g,
                        "        for (int jj = 0; jj < %d; jj++) acc[ii][jj] += (%s)ra[ii] * "
                        "(%s)rb[jj];",
                        rn, acc_t, acc_t);
        }
        tb__cg_line(g, "}");
        tb__cg_line(g, "barrier(CLK_LOCAL_MEM_FENCE);");
        tb__cg_close(g, "");
        snprintf(head, sizeof head,
                 "for (int ii = 0; ii < %d; ii++) for (int jj = 0; jj < %d; jj++) ", rm, rn);
        tb__cg_open(g, head);
        tb__cg_line(g, "const long gr = row0 + ly + ii * %d, gc = col0 + lx + jj * %d;", wy, wx);
        snprintf(head, sizeof head, "if (gr < %lldL && gc < %lldL) ", (long long)M, (long long)N);
        tb__cg_open(g, head);
        if (!tb__cg_matmul_store(g, k, bdims)) return g->status;
        tb__cg_close(g, "");
        tb__cg_close(g, "");
    }
    k->flops = 2.0 * (double)M * (double)N * (double)K * (double)batch;
    return TB_OK;
}

static tb_status tb__cg_kernel_matmul(tb__cg *g, tb__ocl_kernel *k) {
    if (k->packed) return tb__cg_kernel_matmul_packed(g, k);
    if (tb__ocl_codegen_cpu(g->L->dev)) return tb__cg_kernel_matmul_cpu(g, k);
    return tb__cg_kernel_matmul_gpu(g, k);
}

/* A kernel with no work item (its output has no element): not launched, not emitted. */
static bool tb__ocl_kernel_empty(const tb__ocl_kernel *k) {
    if (k->group_size[0] > 0) return k->groups[0] == 0 || k->groups[1] == 0 || k->groups[2] == 0;
    return k->items == 0;
}

/* Appends the kernel's signature and body to the program. */
static void tb__cg_emit_kernel(tb__cg *g, tb__ocl_kernel *k, tb__str *src) {
    const tb__ocl_plan *p = tb__cg_plan(g);
    const tb_shape *os = &p->slots[k->out_slot].shape;
    size_t i;
    tb__str_append(src, "__kernel ");
    if (k->group_size[0] > 0) {
        tb__str_append(src, "__attribute__((reqd_work_group_size(%zu, %zu, %zu))) ",
                       k->group_size[0], k->group_size[1] > 0 ? k->group_size[1] : 1,
                       k->group_size[2] > 0 ? k->group_size[2] : 1);
    }
    tb__str_append(src, "void %s(__global %s *restrict out", k->name, tb__ocl_ctype(os->dtype));
    for (i = 0; i < k->num_args; i++) {
        const tb__ocl_arg *a = &k->args[i];
        if (a->kind == TB__OCL_ARG_BUF) {
            tb__str_append(src, ",\n    __global const %s *restrict b%d",
                           tb__ocl_ctype(p->slots[a->index].shape.dtype), (int)a->index);
        } else if (a->kind == TB__OCL_ARG_SCALAR) {
            tb__str_append(src, ",\n    const %s s%d",
                           tb__cg_scalar_ctype(g, p->param_dtype[a->index]), (int)a->index);
        } else if (a->kind == TB__OCL_ARG_TABLE) {
            tb__str_append(src, ",\n    __global const ulong *restrict tb_sc");
        } else {
            tb__str_append(src, ",\n    __global long *restrict tb_err");
        }
    }
    tb__str_append(src, ") {\n%s}\n\n", g->body.data != NULL ? g->body.data : "");
}

static void tb__ocl_kernel_name(tb__ocl_plan *p, size_t index, const tb__ocl_lower *L) {
    tb__ocl_kernel *k = &p->kernels[index];
    const tb_node *root = L->info[k->root].node;
    char base[48];
    size_t i;
    int dup = 0;
    if (k->kind == TB__OCL_K_MATMUL) {
        tb__ocl_mm mm = tb__ocl_mm_of(L, k->core);
        snprintf(base, sizeof base, "MM_%lld_%lld_%lld", (long long)mm.m, (long long)mm.n,
                 (long long)mm.k);
        if (mm.batch != 1) {
            size_t n = strlen(base);
            snprintf(base + n, sizeof base - n, "_b%lld", (long long)mm.batch);
        }
    } else if (k->kind == TB__OCL_K_PACK_A || k->kind == TB__OCL_K_PACK_B) {
        /* panels of the matmul's operand: count x depth x width */
        int64_t z[6];
        tb__ocl_pack_sizes(L, k, k->kind == TB__OCL_K_PACK_A, z);
        snprintf(base, sizeof base, "P%s_%lld_%lld_%lld", k->kind == TB__OCL_K_PACK_A ? "A" : "B",
                 (long long)(z[0] * z[4]), (long long)z[3], (long long)z[5]);
    } else if (k->kind == TB__OCL_K_REDUCE || k->kind == TB__OCL_K_PARTIAL) {
        int64_t n_out, m;
        tb__ocl_reduce_sizes(L, k->core, &n_out, &m);
        if (k->kind == TB__OCL_K_PARTIAL) {
            /* chunks of rows: n_out * split outputs of (at most) m / split elements */
            snprintf(base, sizeof base, "R_%lld_%lld", (long long)(n_out * k->split),
                     (long long)((m + k->split - 1) / k->split));
        } else if (k->split > 0) {
            snprintf(base, sizeof base, "R_%lld_%lld", (long long)n_out, (long long)k->split);
        } else {
            snprintf(base, sizeof base, "R_%lld_%lld", (long long)n_out, (long long)m);
        }
    } else if (k->kind == TB__OCL_K_NORM) {
        const tb_node *c = L->info[k->core].node;
        const tb_shape *xs = &L->info[tb__ocl_operand(L, k->core, 0)].node->shape;
        int64_t len = 1, numel = tb__ocl_numel(xs);
        int32_t a;
        if (c->op == TB_OP_LAYER_NORM) {
            for (a = xs->rank - (int32_t)c->attrs[0]; a < xs->rank; a++)
                len *= xs->dims[a];
        } else {
            len = xs->dims[c->attrs[0]];
        }
        snprintf(base, sizeof base, "S_%lld_%lld", (long long)(len > 0 ? numel / len : 0),
                 (long long)len);
    } else {
        snprintf(base, sizeof base, "E_%lld", (long long)tb__ocl_numel(&root->shape));
    }
    for (i = 0; i < index; i++) {
        const char *other = p->kernels[i].name;
        size_t n = strlen(base);
        if (strncmp(other, base, n) == 0 && (other[n] == '\0' || other[n] == '_')) {
            if (other[n] == '\0' || (other[n + 1] == 'n')) dup++;
        }
    }
    if (dup > 0) {
        snprintf(k->name, sizeof k->name, "%s_n%d", base, dup + 1);
    } else {
        snprintf(k->name, sizeof k->name, "%s", base);
    }
}

/* Bytes a kernel moves: its output and every buffer it reads. */
static double tb__ocl_kernel_bytes(const tb__ocl_plan *p, const tb__ocl_kernel *k) {
    size_t i, n = 0;
    double bytes = 0;
    if (tb_shape_nbytes(&p->slots[k->out_slot].shape, &n) == TB_OK) bytes += (double)n;
    for (i = 0; i < k->num_args; i++) {
        if (k->args[i].kind != TB__OCL_ARG_BUF) continue;
        if (tb_shape_nbytes(&p->slots[k->args[i].index].shape, &n) == TB_OK) bytes += (double)n;
    }
    return bytes;
}

/* The kernel of every node, for get_node_kernel. Parameters, views read through by several
   kernels and nodes of kernels with nothing to compute belong to none. */
static tb_status tb__ocl_record_node_kernels(const tb__ocl_lower *L) {
    tb__ocl_plan *p = L->plan;
    size_t i;
    p->node_kernel = (int32_t *)tb__calloc(L->n + 1, sizeof(int32_t));
    if (p->node_kernel == NULL) return TB_ERR_OUT_OF_MEMORY;
    p->num_nodes = L->n;
    for (i = 0; i < L->n; i++) {
        int32_t k = L->info[i].ctx;
        if (L->info[i].param >= 0 || k < 0 || (size_t)k >= p->num_kernels ||
            p->kernels[k].name[0] == '\0')
            k = -1;
        p->node_kernel[i] = k;
    }
    return TB_OK;
}

/* Partitions, then generates every kernel; a kernel that asks for a node to be materialised
   makes the whole lowering start over with that node as a root. */
static tb_status tb__ocl_lower_graph(tb__ocl_lower *L) {
    tb__ocl_plan *p = L->plan;
    tb__cg *g;
    tb__str src;
    size_t i, attempt;
    tb_status st = TB_OK;
    g = (tb__cg *)tb__calloc(1, sizeof *g);
    if (g == NULL) return TB_ERR_OUT_OF_MEMORY;
    g->L = L;
    g->fast_f64 = tb__ocl_fast_f64(L->dev);
    g->evals = (int32_t *)tb__calloc(L->n + 1, sizeof(int32_t));
    g->touched = (int32_t *)tb__calloc(L->n + 1, sizeof(int32_t));
    if (g->evals == NULL || g->touched == NULL) {
        tb__cg_free(g);
        tb__free(g);
        return TB_ERR_OUT_OF_MEMORY;
    }
    memset(&src, 0, sizeof src);
    for (attempt = 0; attempt < 64; attempt++) {
        L->restart = false;
        tb__free(p->errsites);
        p->errsites = NULL;
        p->num_errsites = 0;
        tb__str_free(&src);
        memset(&src, 0, sizeof src);
        st = tb__ocl_partition(L);
        if (st == TB_OK) st = tb__ocl_assign_slots(L);
        if (st != TB_OK) break;
        for (i = 0; i < tb__cl_opencl_kernels_count; i++)
            tb__str_append(&src, "%s", tb__cl_opencl_kernels[i]);
        tb__str_append(&src, "\n");
        for (i = 0; i < p->num_kernels && st == TB_OK && !L->restart; i++) {
            tb__ocl_kernel *k = &p->kernels[i];
            tb__cg_reset(g, (int32_t)i);
            g->status = TB_OK;
            tb__ocl_kernel_name(p, i, L);
            switch (k->kind) {
            case TB__OCL_K_REDUCE:
            case TB__OCL_K_PARTIAL:
                st = tb__cg_kernel_reduce(g, k);
                break;
            case TB__OCL_K_MATMUL:
                st = tb__cg_kernel_matmul(g, k);
                break;
            case TB__OCL_K_PACK_A:
            case TB__OCL_K_PACK_B:
                st = tb__cg_kernel_pack(g, k);
                break;
            case TB__OCL_K_NORM:
                st = tb__cg_kernel_norm(g, k);
                break;
            default:
                st = tb__cg_kernel_elementwise(g, k);
                break;
            }
            if (st == TB_OK) st = g->status;
            if (L->restart) {
                st = TB_OK;
                break;
            }
            if (st == TB_OK && g->body.failed) st = TB_ERR_OUT_OF_MEMORY;
            if (st != TB_OK) break;
            k->bytes = tb__ocl_kernel_bytes(p, k);
            {
                /* every argument as 8 bytes: pointers and the widest scalars */
                size_t arg_bytes = 8 * (k->num_args + 1);
                if (arg_bytes > L->dev->max_parameter_size) {
                    st = tb__error(TB_ERR_UNSUPPORTED,
                                   "opencl:%d: kernel %s reads %zu arrays and scalars, more than "
                                   "the %zu bytes of arguments the device takes",
                                   (int)L->dev->ordinal, k->name, k->num_args,
                                   L->dev->max_parameter_size);
                    break;
                }
            }
            if (!tb__ocl_kernel_empty(k)) {
                tb__cg_emit_kernel(g, k, &src);
            } else {
                k->name[0] = '\0'; /* nothing to compute: the output is empty */
            }
        }
        if (st != TB_OK || !L->restart) break;
    }
    if (st == TB_OK && L->restart) {
        st = tb__error(TB_ERR_INTERNAL, "opencl: the lowering did not settle");
    }
    if (st == TB_OK) st = tb__ocl_record_node_kernels(L);
    if (st == TB_OK) {
        if (src.failed) {
            st = TB_ERR_OUT_OF_MEMORY;
        } else {
            p->source_len = src.len;
            p->source = tb__str_take(&src);
            if (p->source == NULL) st = TB_ERR_OUT_OF_MEMORY;
        }
    }
    tb__str_free(&src);
    tb__cg_free(g);
    tb__free(g);
    return st;
}

static void tb__ocl_lower_free(tb__ocl_lower *L) {
    tb__free(L->info);
    tb__free(L->operands);
    tb__free(L->users);
    tb__free((void *)L->map_keys);
    tb__free(L->map_vals);
}

/* ---- programs: in-memory cache, on-disk binary cache, build ---- */

/* An entry of the disk cache, <folder>/<key hash as 32 hex digits>.clbin:
     0  "TBOCLBIN"         8 .. 11  format version   12 .. 15  header size
    16  key hash (2 x 8)  32  key size K           40  binary size N
    48  XXH64 of the key and the binary (finds torn and damaged files)    56  zero
    64  the key (K bytes): tb__ocl_program_key_bytes, the source included
    64 + K  the program binary (N bytes)
   Numbers are little-endian. A reader compares the whole key, not only its hash: an entry for
   another source, device, driver, option set or library version is not used. */
#define TB__OCL_BIN_MAGIC    "TBOCLBIN"
#define TB__OCL_BIN_VERSION  2u
#define TB__OCL_BIN_HEADER   64u
#define TB__OCL_BIN_MAX      ((uint64_t)1 << 30) /* no binary of ours is bigger */
#define TB__OCL_BIN_SEED     0x636c62696e617279ull
#define TB__OCL_MAX_PROGRAMS 256
#define TB__OCL_TMP_TRIES    16

/* The disk cache opens its files without following links (O_NOFOLLOW, POSIX 2008). glibc
   hides the name under a strict -std when the feature macros come after its first header (our
   own public part includes <stdint.h>), but always defines the value under another name.
   Without it the cache is off. */
#if defined(O_NOFOLLOW)
#define TB__OCL_O_NOFOLLOW O_NOFOLLOW
#elif defined(__O_NOFOLLOW)
#define TB__OCL_O_NOFOLLOW __O_NOFOLLOW
#endif
#if defined(O_CLOEXEC)
#define TB__OCL_O_CLOEXEC O_CLOEXEC
#elif defined(__O_CLOEXEC)
#define TB__OCL_O_CLOEXEC __O_CLOEXEC
#else
#define TB__OCL_O_CLOEXEC 0
#endif
#if !defined(_WIN32) && defined(TB__OCL_O_NOFOLLOW) && defined(O_NONBLOCK)
#define TB__OCL_DISK_CACHE 1
#else
#define TB__OCL_DISK_CACHE 0
#endif

/* The bits of a program key that count: tests keep fewer to force key collisions. */
static uint64_t tb__ocl_program_key_mask = ~(uint64_t)0;

/* Names temporary files of the disk cache apart; guarded by tb__ocl_mutex. */
static TB__UNUSED unsigned tb__ocl_disk_counter = 0;

static uint64_t tb__ocl_hash_text(uint64_t h, const char *s, size_t n) {
    h = tb__hash_u64(h, (uint64_t)n);
    return tb__hash_bytes(h, s, n);
}

/* The parts of what a program binary depends on besides its source: the options, the device
   and its driver, the platform and this library's version. */
static void tb__ocl_program_parts(const tb__ocl_device *dev, const char *parts[7]) {
    parts[0] = dev->build_options;
    parts[1] = dev->info.name;
    parts[2] = dev->info.driver_version;
    parts[3] = dev->device_version;
    parts[4] = dev->platform_name;
    parts[5] = dev->platform_version;
    parts[6] = TB_VERSION_STRING;
}

/* A 128-bit hash of what a program binary depends on: the in-memory cache's key (a hit is
   confirmed by the source) and the name of the disk cache's entry. */
static void tb__ocl_program_key(const tb__ocl_device *dev, const char *src, size_t len,
                                uint64_t key[2]) {
    const char *parts[7];
    uint64_t seeds[2] = {0x746270726f677231ull, 0x746270726f677232ull};
    int i, s;
    tb__ocl_program_parts(dev, parts);
    for (s = 0; s < 2; s++) {
        uint64_t h = tb__ocl_hash_text(seeds[s], src, len);
        for (i = 0; i < 7; i++)
            h = tb__ocl_hash_text(h, parts[i], strlen(parts[i]));
        key[s] = h & tb__ocl_program_key_mask;
    }
}

static void tb__ocl_put64(unsigned char *p, uint64_t v) {
    int i;
    for (i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t tb__ocl_get64(const unsigned char *p) {
    uint64_t v = 0;
    int i;
    for (i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

#if TB__OCL_DISK_CACHE

/* The full key a disk cache entry stores: each part of tb__ocl_program_parts, then the
   source, each as its length (8 bytes) and its bytes. NULL when out of memory. */
static unsigned char *tb__ocl_program_key_bytes(const tb__ocl_device *dev, const char *src,
                                                size_t len, size_t *size) {
    const char *parts[8];
    size_t lens[8], total = 0, i;
    unsigned char *out, *at;
    tb__ocl_program_parts(dev, parts);
    parts[7] = src;
    for (i = 0; i < 8; i++) {
        lens[i] = i == 7 ? len : strlen(parts[i]);
        if (lens[i] > SIZE_MAX / 2 - total - 8) return NULL;
        total += 8 + lens[i];
    }
    out = (unsigned char *)tb__alloc(total);
    if (out == NULL) return NULL;
    for (at = out, i = 0; i < 8; i++) {
        tb__ocl_put64(at, (uint64_t)lens[i]);
        memcpy(at + 8, parts[i], lens[i]);
        at += 8 + lens[i];
    }
    *size = total;
    return out;
}

static uint64_t tb__ocl_disk_checksum(const unsigned char *key, size_t key_size,
                                      const unsigned char *bin, size_t n) {
    return tb__hash_bytes(tb__hash_bytes(TB__OCL_BIN_SEED, key, key_size), bin, n);
}

static bool tb__ocl_read_all(int fd, void *buf, size_t n) {
    unsigned char *p = (unsigned char *)buf;
    while (n > 0) {
        ssize_t got = read(fd, p, n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return false;
        p += got;
        n -= (size_t)got;
    }
    return true;
}

static bool tb__ocl_write_all(int fd, const void *buf, size_t n) {
    const unsigned char *p = (const unsigned char *)buf;
    while (n > 0) {
        ssize_t put = write(fd, p, n);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) return false;
        p += put;
        n -= (size_t)put;
    }
    return true;
}

/* The cache folder's path (not yet created or checked), or NULL when the cache is off. */
static char *tb__ocl_cache_path(void) {
    const char *env = tb__getenv("TB_CACHE_DIR");
    if (env != NULL) {
        if (strcmp(env, "off") == 0 || env[0] == '\0') return NULL;
        return tb__strdup(env);
    }
    if (tb__getenv("XDG_CACHE_HOME") != NULL && tb__getenv("XDG_CACHE_HOME")[0] != '\0')
        return tb__format("%s/torch_backend", tb__getenv("XDG_CACHE_HOME"));
    if (tb__getenv("HOME") != NULL && tb__getenv("HOME")[0] != '\0')
        return tb__format("%s/.cache/torch_backend", tb__getenv("HOME"));
    return NULL;
}

/* Whether the cache folder `dir` may be used, creating it and its missing parents private
   (0700). A folder that is not ours or that others may write to is not used: they could put a
   binary there that we would run. Why a folder is not used is said once per runtime (at
   TB_DEBUG for a folder that is not private, as a warning when it cannot be made). Entries
   are checked one by one too (tb__ocl_disk_read: a regular file of ours, holding our whole
   key), so a folder swapped after this check gives nothing that we did not write ourselves.
   The caller holds tb__ocl_mutex. */
static bool tb__ocl_cache_usable(tb__ocl_runtime *rt, const char *dir) {
    char *copy = tb__strdup(dir), *p;
    struct stat st;
    if (copy == NULL) return false;
    for (p = copy + 1; *p != '\0'; p++) {
        if (*p != '/') continue;
        *p = '\0';
        (void)mkdir(copy, 0700);
        *p = '/';
    }
    (void)mkdir(copy, 0700);
    tb__free(copy);
    /* a link to the folder itself is followed: a user may keep the cache elsewhere */
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        const char *why = stat(dir, &st) != 0 ? strerror(errno) : "not a folder";
        if (!rt->cache_dir_reported) {
            tb_log_message(TB_LOG_WARN, "opencl: the program cache folder %s is not usable: %s",
                           dir, why);
            rt->cache_dir_reported = true;
        }
        return false;
    }
    if (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        if (!rt->cache_dir_reported && tb_debug_level() >= 1) {
            tb_log_message(
                TB_LOG_WARN,
                "opencl: the program cache folder %s is not used: %s (make it yours "
                "with mode 0700, or set TB_CACHE_DIR)",
                dir, st.st_uid != geteuid() ? "another user owns it" : "it is writable by others");
        }
        rt->cache_dir_reported = true;
        return false;
    }
    return true;
}

/* The binary of the entry at `path` if it holds the key `kb`, else NULL; then `*why` says what
   is wrong with the file there, or is NULL when there is none. The file is opened without
   following a link or waiting on a FIFO, and read only if it is a regular file of ours whose
   size is that of an entry for this key. */
static unsigned char *tb__ocl_disk_read(const char *path, const uint64_t key[2],
                                        const unsigned char *kb, size_t kn, size_t *size,
                                        const char **why) {
    unsigned char header[TB__OCL_BIN_HEADER];
    unsigned char *stored = NULL, *payload = NULL;
    uint64_t n = 0, size_of_entry;
    struct stat st;
    int fd = open(path, O_RDONLY | TB__OCL_O_NOFOLLOW | O_NONBLOCK | TB__OCL_O_CLOEXEC | O_NOCTTY);
    *why = NULL;
    if (fd < 0) {
        if (errno != ENOENT) *why = errno == ELOOP ? "a symbolic link" : strerror(errno);
        return NULL;
    }
    if (fstat(fd, &st) != 0) {
        *why = strerror(errno);
    } else if (!S_ISREG(st.st_mode)) {
        *why = "not a regular file";
    } else if (st.st_uid != geteuid()) {
        *why = "owned by another user";
    } else if (st.st_size < 0 || (uint64_t)st.st_size <= (uint64_t)TB__OCL_BIN_HEADER + kn ||
               (uint64_t)st.st_size > (uint64_t)TB__OCL_BIN_HEADER + kn + TB__OCL_BIN_MAX) {
        *why = "not the size of an entry for this key";
    } else if (!tb__ocl_read_all(fd, header, sizeof header)) {
        *why = "truncated";
    } else {
        size_of_entry = (uint64_t)st.st_size;
        n = tb__ocl_get64(header + 40);
        if (memcmp(header, TB__OCL_BIN_MAGIC, 8) != 0 ||
            tb__ocl_get64(header + 8) !=
                ((uint64_t)TB__OCL_BIN_VERSION | ((uint64_t)TB__OCL_BIN_HEADER << 32))) {
            *why = "not an entry of this format";
        } else if (tb__ocl_get64(header + 16) != key[0] || tb__ocl_get64(header + 24) != key[1] ||
                   tb__ocl_get64(header + 32) != (uint64_t)kn) {
            *why = "an entry for another key";
        } else if (n == 0 || n != size_of_entry - TB__OCL_BIN_HEADER - kn) {
            *why = "truncated";
        } else if ((stored = (unsigned char *)tb__alloc(kn)) == NULL ||
                   (payload = (unsigned char *)tb__alloc((size_t)n)) == NULL) {
            *why = "out of memory";
        } else if (!tb__ocl_read_all(fd, stored, kn) || !tb__ocl_read_all(fd, payload, (size_t)n)) {
            *why = "truncated";
        } else if (memcmp(stored, kb, kn) != 0) {
            *why = "an entry for another key";
        } else if (tb__ocl_disk_checksum(stored, kn, payload, (size_t)n) !=
                   tb__ocl_get64(header + 48)) {
            *why = "damaged (checksum)";
        }
    }
    close(fd);
    tb__free(stored);
    if (*why != NULL) {
        tb__free(payload);
        return NULL;
    }
    *size = (size_t)n;
    return payload;
}

/* Writes the entry `name` of the folder `dir`: into a new temporary file of the folder (O_EXCL:
   never through a link nor into a file that is there), in full, then renamed over the entry,
   so that a reader sees the old entry, no entry or the whole new one. The caller holds
   tb__ocl_mutex. */
static void tb__ocl_disk_write(const char *dir, const char *name, const uint64_t key[2],
                               const unsigned char *kb, size_t kn, const unsigned char *payload,
                               size_t n) {
    unsigned char header[TB__OCL_BIN_HEADER];
    char *tmp = NULL, *path;
    int fd = -1, tries;
    bool ok;
    int err;
    memset(header, 0, sizeof header);
    memcpy(header, TB__OCL_BIN_MAGIC, 8);
    tb__ocl_put64(header + 8, (uint64_t)TB__OCL_BIN_VERSION | ((uint64_t)TB__OCL_BIN_HEADER << 32));
    tb__ocl_put64(header + 16, key[0]);
    tb__ocl_put64(header + 24, key[1]);
    tb__ocl_put64(header + 32, (uint64_t)kn);
    tb__ocl_put64(header + 40, (uint64_t)n);
    tb__ocl_put64(header + 48, tb__ocl_disk_checksum(kb, kn, payload, n));
    path = tb__format("%s/%s", dir, name);
    if (path == NULL) return;
    for (tries = 0; tries < TB__OCL_TMP_TRIES && fd < 0; tries++) {
        tb__free(tmp);
        tmp = tb__format("%s/.%016llx%016llx.%ld.%u.tmp", dir, (unsigned long long)key[0],
                         (unsigned long long)key[1], (long)getpid(), tb__ocl_disk_counter++);
        if (tmp == NULL) break;
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | TB__OCL_O_CLOEXEC | O_NOCTTY, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        if (tmp != NULL) {
            tb_log_message(TB_LOG_WARN, "opencl: cannot write the program cache file %s: %s", tmp,
                           strerror(errno));
        }
        tb__free(tmp);
        tb__free(path);
        return;
    }
    /* errno is read at the call that failed (close and rename may change it on success, and a
       short write need not set it) */
    errno = 0;
    ok = tb__ocl_write_all(fd, header, sizeof header) && tb__ocl_write_all(fd, kb, kn) &&
         tb__ocl_write_all(fd, payload, n);
    err = ok ? 0 : (errno != 0 ? errno : EIO);
    if (close(fd) != 0 && ok) {
        ok = false;
        err = errno != 0 ? errno : EIO;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        err = errno != 0 ? errno : EIO;
    }
    if (!ok) {
        tb_log_message(TB_LOG_WARN, "opencl: cannot write the program cache file %s: %s", path,
                       strerror(err));
        (void)unlink(tmp);
    }
    tb__free(tmp);
    tb__free(path);
}

#endif /* TB__OCL_DISK_CACHE */

static char *tb__ocl_build_log(tb__ocl_device *dev, tb__cl_program prog) {
    size_t n = 0;
    char *log;
    if (TB__OCL_CALL(dev->rt, GetProgramBuildInfo)(prog, dev->id, TB__CL_PROGRAM_BUILD_LOG, 0, NULL,
                                                   &n) != TB__CL_SUCCESS)
        return NULL;
    log = (char *)tb__alloc(n + 1);
    if (log == NULL) return NULL;
    if (TB__OCL_CALL(dev->rt, GetProgramBuildInfo)(prog, dev->id, TB__CL_PROGRAM_BUILD_LOG, n, log,
                                                   NULL) != TB__CL_SUCCESS)
        n = 0;
    log[n] = '\0';
    return log;
}

static tb__cl_program tb__ocl_build_binary(tb__ocl_device *dev, const unsigned char *bin,
                                           size_t n) {
    tb__ocl_runtime *rt = dev->rt;
    tb__cl_int err = TB__CL_SUCCESS, status = TB__CL_SUCCESS;
    const unsigned char *bins[1];
    tb__cl_program prog;
    bins[0] = bin;
    prog =
        TB__OCL_CALL(rt, CreateProgramWithBinary)(dev->ctx, 1, &dev->id, &n, bins, &status, &err);
    if (prog == NULL || err != TB__CL_SUCCESS || status != TB__CL_SUCCESS) {
        if (prog != NULL) TB__OCL_CALL(rt, ReleaseProgram)(prog);
        return NULL;
    }
    if (TB__OCL_CALL(rt, BuildProgram)(prog, 1, &dev->id, dev->build_options, NULL, NULL) !=
        TB__CL_SUCCESS) {
        TB__OCL_CALL(rt, ReleaseProgram)(prog);
        return NULL;
    }
    return prog;
}

static unsigned char *tb__ocl_program_binary(tb__ocl_device *dev, tb__cl_program prog,
                                             size_t *size) {
    size_t n = 0;
    unsigned char *bin, *ptrs[1];
    if (TB__OCL_CALL(dev->rt, GetProgramInfo)(prog, TB__CL_PROGRAM_BINARY_SIZES, sizeof n, &n,
                                              NULL) != TB__CL_SUCCESS ||
        n == 0)
        return NULL;
    bin = (unsigned char *)tb__alloc(n);
    if (bin == NULL) return NULL;
    ptrs[0] = bin;
    if (TB__OCL_CALL(dev->rt, GetProgramInfo)(prog, TB__CL_PROGRAM_BINARIES, sizeof ptrs, ptrs,
                                              NULL) != TB__CL_SUCCESS) {
        tb__free(bin);
        return NULL;
    }
    *size = n;
    return bin;
}

static void tb__ocl_entry_name(const uint64_t key[2], char name[48]) {
    snprintf(name, 48, "%016llx%016llx.clbin", (unsigned long long)key[0],
             (unsigned long long)key[1]);
}

/* Writes a program's binary to the disk cache once, if that is still to do. The binary is
   read only now: PoCL, for one, serialises it at the first request, with the kernels compiled
   by then. */
static void tb__ocl_program_save(tb__ocl_device *dev, tb__ocl_program *p) {
#if TB__OCL_DISK_CACHE
    if (p->save_dir != NULL) {
        size_t n = 0, kn = 0;
        unsigned char *bin = tb__ocl_program_binary(dev, p->program, &n), *kb = NULL;
        if (bin != NULL) kb = tb__ocl_program_key_bytes(dev, p->source, p->source_len, &kn);
        if (kb != NULL && tb__ocl_cache_usable(dev->rt, p->save_dir)) {
            char name[48];
            tb__ocl_entry_name(p->key, name);
            tb__ocl_disk_write(p->save_dir, name, p->key, kb, kn, bin, n);
        }
        tb__free(kb);
        tb__free(bin);
    }
#else
    (void)dev;
#endif
    tb__free(p->save_dir);
    p->save_dir = NULL;
}

static void tb__ocl_program_unref(tb__ocl_device *dev, tb__ocl_program *p) {
    tb__ocl_program **link;
    if (p == NULL || --p->refcount > 0) return;
    for (link = &dev->programs; *link != NULL; link = &(*link)->next) {
        if (*link == p) {
            *link = p->next;
            break;
        }
    }
    tb__ocl_program_save(dev, p);
    if (p->program != NULL) TB__OCL_CALL(dev->rt, ReleaseProgram)(p->program);
    tb__free(p->source);
    tb__free(p);
}

/* Drops cached programs no computation uses, oldest first, until at most `keep` remain. */
static void tb__ocl_programs_trim(tb__ocl_device *dev, size_t keep) {
    size_t count = 0;
    tb__ocl_program *p;
    for (p = dev->programs; p != NULL; p = p->next)
        count++;
    while (count > keep) {
        tb__ocl_program *oldest = NULL;
        for (p = dev->programs; p != NULL; p = p->next)
            if (p->refcount == 1) oldest = p; /* the list is newest first */
        if (oldest == NULL) break;
        tb__ocl_program_unref(dev, oldest);
        count--;
    }
}

/* The program from the disk cache, or NULL (then *save_dir is the folder to write it to after
   its first run, or NULL when the disk cache is off or not usable). An entry that is there but
   cannot be used (another key, damaged, not a regular file of ours, a binary the driver does
   not take) is removed and counted: the program built now takes its place. */
static tb__cl_program tb__ocl_disk_load(tb__ocl_device *dev, const char *src, size_t len,
                                        const uint64_t key[2], char **save_dir) {
    tb__cl_program prog = NULL;
#if TB__OCL_DISK_CACHE
    char *dir = tb__ocl_cache_path(), *path, name[48];
    unsigned char *kb = NULL, *bin = NULL;
    size_t kn = 0, n = 0;
    const char *why = NULL;
    *save_dir = NULL;
    if (dir == NULL) return NULL;
    tb__ocl_entry_name(key, name);
    path = tb__ocl_cache_usable(dev->rt, dir) ? tb__format("%s/%s", dir, name) : NULL;
    if (path == NULL) {
        tb__free(dir);
        return NULL;
    }
    kb = tb__ocl_program_key_bytes(dev, src, len, &kn);
    if (kb != NULL) bin = tb__ocl_disk_read(path, key, kb, kn, &n, &why);
    if (bin != NULL) {
        prog = tb__ocl_build_binary(dev, bin, n);
        if (prog == NULL) why = "a binary the driver does not load";
    }
    if (prog != NULL) {
        dev->disk_hits++;
        tb__ocl_metric(dev, "OpenCL::DiskCacheHit", 1);
        tb__free(dir);
    } else {
        dev->disk_misses++;
        tb__ocl_metric(dev, "OpenCL::DiskCacheMiss", 1);
        if (why != NULL) {
            if (tb_debug_level() >= 1) {
                tb_log_message(TB_LOG_INFO, "opencl:%d: program cache file %s not used: %s",
                               (int)dev->ordinal, path, why);
            }
            (void)unlink(path); /* a link itself, never what it points to */
            dev->disk_rejected++;
            tb__ocl_metric(dev, "OpenCL::DiskCacheRejected", 1);
        }
        *save_dir = dir;
    }
    tb__free(bin);
    tb__free(kb);
    tb__free(path);
#else
    (void)dev, (void)src, (void)len, (void)key;
    *save_dir = NULL;
#endif
    return prog;
}

/* The built program for a source: from memory, from the disk cache, or built now. */
static tb_status tb__ocl_get_program(tb__ocl_device *dev, const char *src, size_t len,
                                     tb__ocl_program **out) {
    tb__ocl_runtime *rt = dev->rt;
    uint64_t key[2];
    tb__ocl_program *p;
    tb__cl_program prog;
    char *save_dir = NULL, *source;
    tb__cl_int err = TB__CL_SUCCESS;
    tb__ocl_program_key(dev, src, len, key);
    for (p = dev->programs; p != NULL; p = p->next) {
        if (p->key[0] != key[0] || p->key[1] != key[1]) continue;
        if (p->source_len != len || memcmp(p->source, src, len) != 0) {
            tb__ocl_metric(dev, "OpenCL::ProgramKeyCollision", 1);
            continue;
        }
        p->refcount++;
        tb__ocl_metric(dev, "OpenCL::ProgramCacheHit", 1);
        *out = p;
        return TB_OK;
    }
    source = (char *)tb__alloc(len + 1);
    if (source == NULL) return TB_ERR_OUT_OF_MEMORY;
    memcpy(source, src, len);
    source[len] = '\0';
    prog = tb__ocl_disk_load(dev, src, len, key, &save_dir);
    if (prog == NULL) {
        const char *srcs[1];
        srcs[0] = src;
        prog = TB__OCL_CALL(rt, CreateProgramWithSource)(dev->ctx, 1, srcs, &len, &err);
        if (prog == NULL || err != TB__CL_SUCCESS) {
            tb__free(save_dir);
            tb__free(source);
            return tb__error(TB_ERR_COMPILE, "opencl:%d: clCreateProgramWithSource failed: %s (%d)",
                             (int)dev->ordinal, tb__cl_error_name(err), (int)err);
        }
        dev->program_builds++;
        tb__ocl_metric(dev, "OpenCL::ProgramBuild", 1);
        err = TB__OCL_CALL(rt, BuildProgram)(prog, 1, &dev->id, dev->build_options, NULL, NULL);
        if (err != TB__CL_SUCCESS) {
            char *log = tb__ocl_build_log(dev, prog);
            tb_status st;
            if (log != NULL && tb_debug_level() >= 1) {
                tb_log_message(TB_LOG_ERROR, "opencl:%d: build log:\n%s", (int)dev->ordinal, log);
            }
            st = tb__error(TB_ERR_COMPILE,
                           "opencl:%d (%s): the program does not build: %s (%d); "
                           "build log:\n%.800s",
                           (int)dev->ordinal, dev->info.name, tb__cl_error_name(err), (int)err,
                           log != NULL ? log : "(none)");
            tb__free(log);
            TB__OCL_CALL(rt, ReleaseProgram)(prog);
            tb__free(save_dir);
            tb__free(source);
            return st;
        }
    }
    p = (tb__ocl_program *)tb__calloc(1, sizeof *p);
    if (p == NULL) {
        TB__OCL_CALL(rt, ReleaseProgram)(prog);
        tb__free(save_dir);
        tb__free(source);
        return TB_ERR_OUT_OF_MEMORY;
    }
    p->key[0] = key[0];
    p->key[1] = key[1];
    p->source = source;
    p->source_len = len;
    p->program = prog;
    p->save_dir = save_dir; /* written after the first run (tb__ocl_program_save) */
    p->refcount = 2;        /* the cache and the caller */
    p->next = dev->programs;
    dev->programs = p;
    tb__ocl_programs_trim(dev, TB__OCL_MAX_PROGRAMS);
    *out = p;
    return TB_OK;
}

/* ---- backend entries: lowering, compile, execute ---- */

typedef struct tb__ocl_context {
    tb__ocl_plan *plan; /* moves to the computation on a successful compile */
} tb__ocl_context;

static void tb__ocl_plan_release(tb__ocl_plan *p) {
    size_t i;
    tb__ocl_runtime *rt;
    if (p == NULL) return;
    rt = p->rt;
    if (rt != NULL) {
        tb__ocl_device *dev =
            (size_t)p->ordinal < rt->num_devices ? &rt->devices[p->ordinal] : NULL;
        if (p->cl != NULL) {
            for (i = 0; i < p->num_kernels; i++)
                if (p->cl[i] != NULL) TB__OCL_CALL(rt, ReleaseKernel)(p->cl[i]);
        }
        if (dev != NULL && p->program != NULL) tb__ocl_program_unref(dev, p->program);
    }
    tb__free(p->cl);
    tb__ocl_plan_free(p);
    tb__ocl_runtime_unref(rt);
}

static tb_status tb__ocl_create_lowering_context(void *user_data, const tb_graph *graph,
                                                 void **context) {
    tb__ocl_device *dev;
    tb__ocl_plan *p;
    tb__ocl_context *ctx;
    tb__ocl_lower L;
    tb_status st;
    size_t i;
    (void)user_data;
    *context = NULL;
    tb__mutex_lock(&tb__ocl_mutex);
    dev = tb__ocl_device_get(graph->device.ordinal, "opencl");
    if (dev == NULL) {
        tb__mutex_unlock(&tb__ocl_mutex);
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    }
    ctx = (tb__ocl_context *)tb__calloc(1, sizeof *ctx);
    p = (tb__ocl_plan *)tb__calloc(1, sizeof *p);
    if (ctx == NULL || p == NULL) {
        tb__free(ctx);
        tb__free(p);
        tb__mutex_unlock(&tb__ocl_mutex);
        return TB_ERR_OUT_OF_MEMORY;
    }
    p->rt = dev->rt;
    dev->rt->refcount++;
    p->ordinal = dev->ordinal;
    p->graph_hash = graph->hash;
    p->num_params = graph->num_parameters;
    p->num_results = graph->num_results;
    p->param_scalar = (int32_t *)tb__calloc(p->num_params + 1, sizeof(int32_t));
    p->param_dtype = (tb_dtype *)tb__calloc(p->num_params + 1, sizeof(tb_dtype));
    p->result_slot = (int32_t *)tb__calloc(p->num_results + 1, sizeof(int32_t));
    p->result_source = (int32_t *)tb__calloc(p->num_results + 1, sizeof(int32_t));
    memset(&L, 0, sizeof L);
    L.graph = graph;
    L.dev = dev;
    L.plan = p;
    if (p->param_scalar == NULL || p->param_dtype == NULL || p->result_slot == NULL ||
        p->result_source == NULL) {
        st = TB_ERR_OUT_OF_MEMORY;
    } else {
        size_t scalars = 0;
        for (i = 0; i < p->num_params; i++) {
            p->param_scalar[i] = graph->parameters[i]->op == TB_OP_SCALAR ? 1 : 0;
            p->param_dtype[i] = graph->parameters[i]->shape.dtype;
            scalars += (size_t)p->param_scalar[i];
        }
        p->scalar_table = scalars > TB__OCL_MAX_SCALAR_ARGS;
        st = tb__ocl_lower_init(&L);
        if (st == TB_OK) st = tb__ocl_lower_graph(&L);
    }
    tb__ocl_lower_free(&L);
    if (st != TB_OK) {
        tb__ocl_plan_release(p);
        tb__free(ctx);
    } else {
        ctx->plan = p;
        *context = ctx;
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

static void tb__ocl_release_lowering_context(void *user_data, void *context) {
    tb__ocl_context *ctx = (tb__ocl_context *)context;
    (void)user_data;
    if (ctx == NULL) return;
    tb__mutex_lock(&tb__ocl_mutex);
    tb__ocl_plan_release(ctx->plan);
    tb__mutex_unlock(&tb__ocl_mutex);
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

static tb_status tb__ocl_compile(void *user_data, void *context, void **computation) {
    tb__ocl_context *ctx = (tb__ocl_context *)context;
    tb__ocl_plan *p = ctx != NULL ? ctx->plan : NULL;
    tb__ocl_device *dev;
    tb_status st = TB_OK;
    size_t i, launched = 0;
    (void)user_data;
    *computation = NULL;
    if (p == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "opencl: compile without a context");
    tb__mutex_lock(&tb__ocl_mutex);
    dev = tb__ocl_device_get(p->ordinal, "opencl");
    if (dev == NULL || dev->rt != p->rt) {
        tb__mutex_unlock(&tb__ocl_mutex);
        if (dev != NULL) return tb__error(TB_ERR_STATE, "opencl: the backend was restarted");
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    }
    if (tb_debug_level() >= 3) {
        tb_log_message(TB_LOG_DEBUG, "opencl:%d: program of graph %016llx:\n%s", (int)p->ordinal,
                       (unsigned long long)p->graph_hash, p->source);
    }
    p->cl = (tb__cl_kernel *)tb__calloc(p->num_kernels + 1, sizeof(tb__cl_kernel));
    p->local = (size_t *)tb__calloc(p->num_kernels + 1, sizeof(size_t));
    if (p->cl == NULL || p->local == NULL) st = TB_ERR_OUT_OF_MEMORY;
    if (st == TB_OK) st = tb__ocl_get_program(dev, p->source, p->source_len, &p->program);
    for (i = 0; i < p->num_kernels && st == TB_OK; i++) {
        tb__ocl_kernel *k = &p->kernels[i];
        tb__cl_int err = TB__CL_SUCCESS;
        if (k->name[0] == '\0') continue;
        p->cl[i] = TB__OCL_CALL(dev->rt, CreateKernel)(p->program->program, k->name, &err);
        if (p->cl[i] == NULL || err != TB__CL_SUCCESS) {
            p->cl[i] = NULL;
            st = tb__error(TB_ERR_COMPILE, "opencl:%d: clCreateKernel(%s) failed: %s (%d)",
                           (int)p->ordinal, k->name, tb__cl_error_name(err), (int)err);
            break;
        }
        if (k->group_size[0] == 0) p->local[i] = tb__ocl_pick_local(dev, p->cl[i], k->items);
        launched++;
    }
    if (st == TB_OK && tb_debug_level() >= 1) {
        tb__str names;
        memset(&names, 0, sizeof names);
        for (i = 0; i < p->num_kernels; i++)
            if (p->kernels[i].name[0] != '\0')
                tb__str_append(&names, "%s%s", names.len > 0 ? " " : "", p->kernels[i].name);
        tb_log_message(TB_LOG_INFO, "opencl:%d: graph %016llx: %zu kernel%s: %s", (int)p->ordinal,
                       (unsigned long long)p->graph_hash, launched, launched == 1 ? "" : "s",
                       names.data != NULL ? names.data : "");
        tb__str_free(&names);
    }
    if (st == TB_OK) {
        *computation = p;
        ctx->plan = NULL;
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

static void tb__ocl_release_computation(void *user_data, void *computation) {
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    tb__ocl_plan_release((tb__ocl_plan *)computation);
    tb__mutex_unlock(&tb__ocl_mutex);
}

static const char *tb__ocl_backend_text(void *user_data, const void *computation) {
    (void)user_data;
    return computation != NULL ? ((const tb__ocl_plan *)computation)->source : NULL;
}

static int32_t tb__ocl_get_node_kernel(void *user_data, const void *computation, size_t node_index,
                                       const char **kernel_name) {
    const tb__ocl_plan *p = (const tb__ocl_plan *)computation;
    int32_t k;
    (void)user_data;
    if (kernel_name != NULL) *kernel_name = NULL;
    if (p == NULL || p->node_kernel == NULL || node_index >= p->num_nodes) return -1;
    k = p->node_kernel[node_index];
    if (k >= 0 && kernel_name != NULL) *kernel_name = p->kernels[k].name;
    return k;
}

static tb__cl_int tb__ocl_launch(tb__ocl_device *dev, const tb__ocl_plan *p, size_t i,
                                 tb__cl_event *event) {
    const tb__ocl_kernel *k = &p->kernels[i];
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

static tb_status tb__ocl_run_error(const tb__ocl_plan *p, const int64_t flag[4]) {
    const tb__ocl_errsite *e;
    if (flag[0] <= 0 || (size_t)flag[0] > p->num_errsites) {
        return tb__error(TB_ERR_EXECUTE, "opencl: a kernel reported error %lld",
                         (long long)flag[0]);
    }
    e = &p->errsites[flag[0] - 1];
    if (e->op == TB_OP_POW) {
        return tb__error(TB_ERR_EXECUTE,
                         "tb_pow: integers to negative integer powers are not allowed (%lld ** "
                         "%lld)",
                         (long long)flag[1], (long long)flag[2]);
    }
    return tb__error(TB_ERR_EXECUTE, "tb_%s: index %lld is out of range for dim %d of size %lld",
                     tb_op_name(e->op), (long long)flag[1], (int)e->dim, (long long)e->size);
}

static tb_status tb__ocl_execute(void *user_data, void *computation,
                                 tb_backend_data *const *arguments, size_t num_arguments,
                                 tb_backend_data *const *results, size_t num_results) {
    static const int64_t zeros[4] = {0, 0, 0, 0};
    tb__ocl_plan *p = (tb__ocl_plan *)computation;
    tb__ocl_device *dev;
    tb__ocl_runtime *rt;
    tb__ocl_buffer **owned = NULL, *err_buf = NULL, *table_buf = NULL;
    tb__cl_mem *mems = NULL;
    tb__cl_event *events = NULL;
    tb_status st = TB_OK;
    size_t i, j;
    bool profile = tb_debug_level() >= 2;
    (void)user_data;
    if (p == NULL || num_arguments != p->num_params || num_results != p->num_results) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "opencl: execute with %zu arguments and %zu results, the computation has "
                         "%zu and %zu",
                         num_arguments, num_results, p != NULL ? p->num_params : 0,
                         p != NULL ? p->num_results : 0);
    }
    tb__mutex_lock(&tb__ocl_mutex);
    rt = p->rt;
    if (rt != tb__ocl_current || rt->exited) {
        tb__mutex_unlock(&tb__ocl_mutex);
        return tb__error(TB_ERR_STATE, "opencl: the computation outlived the backend");
    }
    dev = &rt->devices[p->ordinal];
    owned = (tb__ocl_buffer **)tb__calloc(p->num_slots + 1, sizeof *owned);
    mems = (tb__cl_mem *)tb__calloc(p->num_slots + 1, sizeof *mems);
    events = (tb__cl_event *)tb__calloc(p->num_kernels + 1, sizeof *events);
    if (owned == NULL || mems == NULL || events == NULL) {
        st = TB_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (i = 0; i < p->num_slots && st == TB_OK; i++) {
        const tb__ocl_slot *s = &p->slots[i];
        if (s->kind != TB__OCL_SLOT_PARAM) continue;
        mems[i] = tb__ocl_data_mem(dev, arguments[s->index]);
        if (mems[i] == NULL) st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
    }
    if (st == TB_OK && p->num_errsites > 0) {
        tb__cl_int err;
        st = tb__ocl_buffer_alloc(dev, sizeof zeros, &err_buf);
        if (st == TB_OK) {
            err = TB__OCL_CALL(rt, EnqueueWriteBuffer)(dev->queue, err_buf->mem, TB__CL_FALSE, 0,
                                                       sizeof zeros, zeros, 0, NULL, NULL);
            if (err != TB__CL_SUCCESS) {
                st = tb__error(TB_ERR_EXECUTE, "opencl:%d: clEnqueueWriteBuffer failed: %s (%d)",
                               (int)p->ordinal, tb__cl_error_name(err), (int)err);
            }
        }
    }
    if (st == TB_OK && p->scalar_table) {
        size_t bytes = (p->num_params + 1) * 8;
        unsigned char *table = (unsigned char *)tb__calloc(p->num_params + 1, 8);
        if (table == NULL) st = TB_ERR_OUT_OF_MEMORY;
        for (i = 0; i < p->num_params && st == TB_OK; i++) {
            if (p->param_scalar[i] &&
                tb__ocl_scalar_arg(dev, p->param_dtype[i], arguments[i], table + 8 * i) == 0)
                st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_EXECUTE;
        }
        if (st == TB_OK) st = tb__ocl_buffer_alloc(dev, bytes, &table_buf);
        if (st == TB_OK) st = tb__ocl_write(dev, table_buf, table, bytes);
        tb__free(table);
    }
    for (i = 0; i < p->num_kernels && st == TB_OK; i++) {
        const tb__ocl_kernel *k = &p->kernels[i];
        const tb__ocl_slot *os = &p->slots[k->out_slot];
        tb__cl_int err = TB__CL_SUCCESS;
        tb__cl_uint a = 0;
        if (mems[k->out_slot] == NULL) {
            size_t size = 0;
            st = tb_shape_nbytes(&os->shape, &size);
            if (st == TB_OK) st = tb__ocl_buffer_alloc(dev, size, &owned[k->out_slot]);
            if (st != TB_OK) break;
            mems[k->out_slot] = owned[k->out_slot]->mem;
        }
        if (p->cl[i] != NULL) {
            err = TB__OCL_CALL(rt, SetKernelArg)(p->cl[i], a++, sizeof(tb__cl_mem),
                                                 &mems[k->out_slot]);
            for (j = 0; j < k->num_args && err == TB__CL_SUCCESS; j++) {
                const tb__ocl_arg *arg = &k->args[j];
                if (arg->kind == TB__OCL_ARG_BUF) {
                    err = TB__OCL_CALL(rt, SetKernelArg)(p->cl[i], a++, sizeof(tb__cl_mem),
                                                         &mems[arg->index]);
                } else if (arg->kind == TB__OCL_ARG_SCALAR) {
                    unsigned char bytes[8];
                    size_t n = tb__ocl_scalar_arg(dev, p->param_dtype[arg->index],
                                                  arguments[arg->index], bytes);
                    if (n == 0) {
                        st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_EXECUTE;
                        break;
                    }
                    err = TB__OCL_CALL(rt, SetKernelArg)(p->cl[i], a++, n, bytes);
                } else if (arg->kind == TB__OCL_ARG_TABLE) {
                    err = TB__OCL_CALL(rt, SetKernelArg)(p->cl[i], a++, sizeof(tb__cl_mem),
                                                         &table_buf->mem);
                } else {
                    err = TB__OCL_CALL(rt, SetKernelArg)(p->cl[i], a++, sizeof(tb__cl_mem),
                                                         &err_buf->mem);
                }
            }
            if (st != TB_OK) break;
            if (err == TB__CL_SUCCESS) {
                err = tb__ocl_launch(dev, p, i, profile ? &events[i] : NULL);
                if (tb__cl_is_oom(err) && dev->cache_count > 0) {
                    /* memory the cache holds may be what the launch is missing */
                    dev->cache_trims++;
                    tb__ocl_metric(dev, "OpenCL::CacheTrim", 1);
                    tb__ocl_cache_trim(dev, 0);
                    err = tb__ocl_launch(dev, p, i, profile ? &events[i] : NULL);
                }
            }
            if (err != TB__CL_SUCCESS) {
                st = tb__error(tb__cl_is_oom(err) ? TB_ERR_OUT_OF_MEMORY : TB_ERR_EXECUTE,
                               "opencl:%d: kernel %s: %s (%d)", (int)p->ordinal, k->name,
                               tb__cl_error_name(err), (int)err);
                break;
            }
            dev->kernels_launched++;
            tb__ocl_metric(dev, "OpenCL::KernelLaunch", 1);
        }
        /* temporaries nobody reads any more go back to the cache (the queue is in order) */
        for (j = 0; j < p->num_slots; j++) {
            if (p->slots[j].kind == TB__OCL_SLOT_TEMP && owned[j] != NULL &&
                p->slots[j].last_use <= (int32_t)i) {
                tb__ocl_buffer_free(owned[j]);
                owned[j] = NULL;
            }
        }
    }
    for (i = 0; i < p->num_results && st == TB_OK; i++) {
        int32_t src = p->result_source[i];
        size_t size = 0;
        tb__ocl_buffer *copy = NULL;
        tb__cl_int err;
        if (src < 0) continue;
        st = tb_shape_nbytes(&p->slots[p->result_slot[src]].shape, &size);
        if (st == TB_OK) st = tb__ocl_buffer_alloc(dev, size, &copy);
        if (st != TB_OK) break;
        err = size == 0 ? TB__CL_SUCCESS
                        : TB__OCL_CALL(rt, EnqueueCopyBuffer)(dev->queue, mems[p->result_slot[src]],
                                                              copy->mem, 0, 0, size, 0, NULL, NULL);
        if (err != TB__CL_SUCCESS) {
            tb__ocl_buffer_free(copy);
            st = tb__error(TB_ERR_EXECUTE, "opencl:%d: clEnqueueCopyBuffer failed: %s (%d)",
                           (int)p->ordinal, tb__cl_error_name(err), (int)err);
            break;
        }
        results[i]->payload = copy;
    }
    if (st == TB_OK && p->program->save_dir != NULL) {
        /* the first run of a program built here: once its kernels ran, its binary is worth
           the most to the disk cache */
        TB__OCL_CALL(rt, Finish)(dev->queue);
        tb__ocl_program_save(dev, p->program);
    }
    if (st == TB_OK && err_buf != NULL) {
        int64_t flag[4];
        st = tb__ocl_read(dev, err_buf, flag, sizeof flag);
        if (st == TB_OK && flag[0] != 0) st = tb__ocl_run_error(p, flag);
    }
    if (st == TB_OK && profile) {
        TB__OCL_CALL(rt, Finish)(dev->queue);
        for (i = 0; i < p->num_kernels; i++) {
            tb__cl_ulong t0 = 0, t1 = 0;
            double ns;
            if (events[i] == NULL) continue;
            TB__OCL_CALL(rt, GetEventProfilingInfo)
            (events[i], TB__CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
            TB__OCL_CALL(rt, GetEventProfilingInfo)
            (events[i], TB__CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
            ns = t1 > t0 ? (double)(t1 - t0) : 1.0;
            dev->kernel_ns += (uint64_t)ns;
            tb_log_message(TB_LOG_DEBUG, "opencl:%d %-24s %10.3f ms %9.2f GB/s %9.2f GFLOP/s",
                           (int)p->ordinal, p->kernels[i].name, ns / 1e6, p->kernels[i].bytes / ns,
                           p->kernels[i].flops / ns);
        }
    }
    if (st == TB_OK) {
        for (i = 0; i < p->num_results; i++) {
            if (p->result_source[i] >= 0) continue;
            results[i]->payload = owned[p->result_slot[i]];
            owned[p->result_slot[i]] = NULL;
        }
        TB__OCL_CALL(rt, Flush)(dev->queue);
    } else {
        for (i = 0; i < p->num_results; i++) {
            if (p->result_source[i] >= 0 && results[i]->payload != NULL) {
                tb__ocl_buffer_free((tb__ocl_buffer *)results[i]->payload);
                results[i]->payload = NULL;
            }
        }
    }
done:
    if (owned != NULL) {
        for (i = 0; i < p->num_slots; i++)
            tb__ocl_buffer_free(owned[i]);
    }
    if (events != NULL) {
        for (i = 0; i < p->num_kernels; i++)
            if (events[i] != NULL) TB__OCL_CALL(rt, ReleaseEvent)(events[i]);
    }
    tb__ocl_buffer_free(err_buf);
    tb__ocl_buffer_free(table_buf);
    tb__free(owned);
    tb__free(mems);
    tb__free(events);
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

/* ---- backend entries: IR hooks, lifetime, registration ---- */

static bool tb__ocl_float_only_unary(tb_op op) {
    switch (op) {
    case TB_OP_EXP:
    case TB_OP_LOG:
    case TB_OP_SQRT:
    case TB_OP_RSQRT:
    case TB_OP_SIN:
    case TB_OP_COS:
    case TB_OP_TANH:
    case TB_OP_SIGMOID:
    case TB_OP_GELU:
    case TB_OP_SILU:
    case TB_OP_RECIPROCAL:
    case TB_OP_DIV:
        return true;
    default:
        return false;
    }
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
        const tb_custom_op_desc *d = tb__ocl_custom(op);
        return d != NULL && d->opencl_expr != NULL && d->infer_shape == NULL;
    }
    if (op < 0) return false;
    /* randn uses log, sin and cos in double: bit-identical f64 output would need the C
       library's exact functions, so f64 runs on the reference */
    if (op == TB_OP_RANDN) return fp64 && node->shape.dtype == TB_F32;
    if (op == TB_OP_ARANGE && tb_dtype_is_float(node->shape.dtype)) return fp64;
    if (tb__ocl_float_only_unary(op) && !tb_dtype_is_float(node->shape.dtype)) return false;
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
            tb__ocl_cache_trim(&rt->devices[i], 0);
            tb__ocl_programs_trim(&rt->devices[i], 0);
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
    tb__mutex_lock(&tb__ocl_mutex);
    dev = tb__ocl_device_get(data->device.ordinal, "tb_opencl_tensor_buffer");
    if (dev != NULL) m = tb__ocl_data_mem(dev, data);
    tb__mutex_unlock(&tb__ocl_mutex);
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
            if (rt->devices[i].cache_count > 0) {
                rt->devices[i].cache_trims++;
                tb__ocl_metric(&rt->devices[i], "OpenCL::CacheTrim", 1);
            }
            tb__ocl_cache_trim(&rt->devices[i], 0);
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
